//! Why a knob changed nothing on a recorded session: the facts the record shows that decide it
//! (no recorded result reaches the lowest limit, no deferred tool or MCP instruction recorded,
//! no call outside the main lane, the recorded client's layout already). The agent's sweeps and
//! compares say them per input ([`crate::report::effects`]).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::api::ContentBlock;
use crate::recording::format::LANE_MAIN;
use crate::recording::{EventKind, ImportedSession};

/// Names of the deferred tools a session's ToolSearch calls select (`select:A,B`).
fn tool_search_selections(session: &ImportedSession) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for event in &session.recording.events {
        let EventKind::ModelReply(reply) = &event.kind else { continue };
        for block in &reply.content {
            if let ContentBlock::ToolUse { name, input, .. } = block
                && name == "ToolSearch"
                && let Some(query) = input.get("query").and_then(Value::as_str).and_then(|q| q.strip_prefix("select:"))
            {
                out.extend(query.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned));
            }
        }
    }
    out
}

/// Sizes of a session's recorded tool results, per kind of limit: the longest Bash and MCP
/// results (characters), and of Read results without offset and limit the most lines, bytes and
/// chars/4 tokens.
#[derive(Debug, Default, Clone, Copy)]
struct ResultSizes {
    bash: Option<usize>,
    mcp: Option<usize>,
    read_lines: Option<usize>,
    read_bytes: Option<usize>,
    read_tokens: Option<usize>,
}

fn result_sizes(session: &ImportedSession) -> ResultSizes {
    let mut uses: std::collections::BTreeMap<&str, (&str, &Value)> = Default::default();
    let mut out = ResultSizes::default();
    let grow = |slot: &mut Option<usize>, n: usize| *slot = Some(slot.map_or(n, |m| m.max(n)));
    for event in &session.recording.events {
        match &event.kind {
            EventKind::ModelReply(reply) => {
                for block in &reply.content {
                    if let ContentBlock::ToolUse { id, name, input, .. } = block {
                        uses.insert(id, (name, input));
                    }
                }
            }
            EventKind::ToolResult(result) => {
                let Some(&(name, input)) = uses.get(result.tool_use_id.as_str()) else { continue };
                let Some(crate::api::ToolResultContent::Text(text)) = &result.content else { continue };
                if name == "Bash" {
                    grow(&mut out.bash, text.chars().count());
                } else if name.starts_with("mcp__") {
                    grow(&mut out.mcp, text.chars().count());
                } else if name == "Read" && input.get("offset").is_none() && input.get("limit").is_none() {
                    let body = text.find("\n<system-reminder>").map_or(text.as_str(), |at| &text[..=at]);
                    grow(&mut out.read_lines, body.matches('\n').count());
                    grow(&mut out.read_bytes, body.len());
                    grow(&mut out.read_tokens, body.len() / 4);
                }
            }
            _ => {}
        }
    }
    out
}

/// Why the knob `key` changed nothing on `session` across `strategies`
/// (the grid's points or the compared strategies), when the session shows it: no recorded
/// result reaches the lowest limit, no deferred tool or MCP instruction is recorded, no call
/// outside the main lane, the recorded client's layout already. `None` when no such fact holds
/// (no reason is claimed then).
pub fn knob_no_effect_reason(key: &str, strategies: &[crate::strategy::Strategy], session: &ImportedSession) -> Option<String> {
    use crate::report::effects::thousands;
    let lowest = |f: &dyn Fn(&crate::strategy::Strategy) -> u64| strategies.iter().map(f).min();
    let has_attachment = |kind: &str| session.recording.events.iter().any(|e| matches!(&e.kind, EventKind::Attachment(a) if a.attachment_type == kind));
    let limit_reason = |what: &str, longest: Option<usize>, limit: Option<u64>, unit: &str| -> Option<String> {
        let limit = limit?;
        match longest {
            None => Some(format!("the session records no {what}")),
            Some(n) if n as u64 <= limit => {
                Some(format!("no recorded {what} is above {} {unit} (the largest has {}); a limit cannot restore what the client cut", thousands(limit), thousands(n as u64)))
            }
            Some(_) => None,
        }
    };
    match key {
        "bash_max_output_length" => limit_reason("Bash result", result_sizes(session).bash, lowest(&|s| s.bash_max_output_length as u64), "characters"),
        "max_mcp_output_tokens" => limit_reason("MCP tool result", result_sizes(session).mcp, lowest(&|s| s.max_mcp_output_tokens * 4), "characters (the limit × 4)"),
        "read_max_lines" => limit_reason("whole-file Read result", result_sizes(session).read_lines, lowest(&|s| s.read_max_lines as u64), "lines"),
        "read_max_bytes" => limit_reason("whole-file Read result", result_sizes(session).read_bytes, lowest(&|s| s.read_max_bytes as u64), "bytes"),
        "read_max_tokens" => limit_reason("whole-file Read result", result_sizes(session).read_tokens, lowest(&|s| s.read_max_tokens), "tokens (chars/4)"),
        "enable_tool_search" if !has_attachment("deferred_tools_delta") && tool_search_selections(session).is_empty() => {
            Some("the session shows no deferred tool (no deferred_tools_delta attachment, no ToolSearch load), so sending every tool up front adds none the recording shows".to_owned())
        }
        "deferred_tools_delta" if has_attachment("deferred_tools_delta") => {
            Some("the recorded client already announces deferred tools as deferred_tools_delta attachments".to_owned())
        }
        "deferred_tools_delta" => Some(
            "the recorded client's deferred-tools listing is inside the unrecorded user context, and the transcript shows no change of the deferred set that would break it"
                .to_owned(),
        ),
        "mcp_instructions" if has_attachment("mcp_instructions_delta") => {
            Some("the recorded client already sends MCP instructions as mcp_instructions_delta attachments (the default stands for the recorded placement)".to_owned())
        }
        "mcp_instructions" => Some(
            "the transcript does not record the MCP servers' instructions (the recorded client kept them in the system prompt, sized within the prefix level) nor a server connecting later"
                .to_owned(),
        ),
        "replay_recorded_microcompact"
            if !session.recording.events.iter().any(|e| matches!(&e.kind, EventKind::SystemEvent(s) if s.subtype == "microcompact_boundary")) =>
        {
            Some("the session records no microcompact".to_owned())
        }
        "ttl_other" => {
            let others: Vec<_> = session.calls.iter().filter(|c| c.lane != LANE_MAIN && !c.is_synthetic && c.usage.prompt_tokens() > 0).collect();
            if others.is_empty() {
                return Some("the session has no call outside the main lane".to_owned());
            }
            let all_1h = others.iter().all(|c| c.usage.cache_creation.as_ref().is_none_or(|s| s.ephemeral_5m_input_tokens == 0));
            (all_1h && strategies.iter().all(|s| matches!(s.ttl_other, crate::strategy::TtlSetting::OneHour | crate::strategy::TtlSetting::Auto)))
                .then(|| "every call outside the main lane already wrote its cache at 1h (`auto`, the default, stands for the recorded TTL)".to_owned())
        }
        _ => None,
    }
}
