//! The request layout and tool-output knobs on real sessions: how a replayed request's
//! unrecorded prefix is cut into the parts the agent sends and laid out by the agent's own block
//! layout ([`ReplayLayout`]), which knobs a replay honours beyond [`super::session::REPLAYED_KNOBS`]
//! ([`LAYOUT_KNOBS`]), why the others cannot reach a recording ([`knob_not_replayed_reason`]),
//! and why an honoured one changed nothing on a given session ([`knob_no_effect_reason`]).

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::Value;

use crate::api::{CacheTtl, ContentBlock, Message, MessageContent};
use crate::recording::format::LANE_MAIN;
use crate::recording::{EventKind, ImportedSession};

use super::session::knob_on_real_sessions;

/// How a replayed request is laid out when a strategy's layout knobs differ from the
/// `claude-code` defaults (which stand for the recorded client's own layout).
///
/// The unrecorded prefix the replay infers (tools + system, the "prefix level" the record shows
/// surviving every re-render) is cut into the parts the agent sends, sized by the 2.1.88 size
/// profile's shares: the tools sent up front, the attribution block, the identity line and the
/// static sections. The dynamic sections (the profile's size, capped by the user-context share it
/// is taken from: what the record shows re-rendered) follow them. These parts go through the
/// agent's own block layout ([`crate::agent::system_prompt::layout_blocks`], mode from
/// [`crate::agent::system_prompt::block_mode`]). The dynamic part is recomputed by a new client
/// process (a resume: a fresh git snapshot and environment), so with the boundary (mode B) a
/// resume reads the static block, and without it (mode C) only the identity line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayLayout {
    /// `shouldUseGlobalCacheScope()` (the knob, first-party provider, experimental betas allowed).
    pub global_scope: bool,
    /// `dynamic_boundary`.
    pub boundary: bool,
    /// `prompt_caching` (`DISABLE_PROMPT_CACHING` turns every marker off, messages' too).
    pub prompt_caching: bool,
    /// `attribution_header`: the billing block opening the system array.
    pub attribution: bool,
    /// Tool search off (`ENABLE_TOOL_SEARCH=false`, experimental betas off, a proxy without
    /// the variable): every deferred tool the session shows is sent up front, the deferred-tools
    /// listing is not sent, and a change of that set changes the tools array.
    pub eager_tools: bool,
    /// `deferred_tools_delta`.
    pub deferred_tools_delta: bool,
    /// `mcp_instructions = delta`.
    pub mcp_delta: bool,
}

impl ReplayLayout {
    /// The layout `strategy`'s knobs give (the agent's rules).
    pub fn of(strategy: &crate::strategy::Strategy) -> ReplayLayout {
        ReplayLayout {
            global_scope: strategy.global_cache_scope && strategy.first_party && !strategy.disable_experimental_betas,
            boundary: strategy.dynamic_boundary,
            prompt_caching: strategy.prompt_caching,
            attribution: strategy.attribution_header,
            eager_tools: !crate::agent::tools::tool_search_allowed(
                strategy.enable_tool_search.as_deref(),
                strategy.disable_experimental_betas,
                strategy.first_party,
                strategy.base_url == crate::strategy::BaseUrl::Custom,
            ),
            deferred_tools_delta: strategy.deferred_tools_delta,
            mcp_delta: strategy.mcp_instructions == crate::strategy::McpInstructionsMode::Delta,
        }
    }

    /// The agent's system-prompt options for this layout on `group` (a subagent's prompt has no
    /// boundary), its markers at `ttl`.
    pub(super) fn system_options(&self, group: &str, ttl: CacheTtl) -> crate::agent::system_prompt::SystemPromptOptions {
        crate::agent::system_prompt::SystemPromptOptions {
            global_cache_scope: self.global_scope,
            boundary: self.boundary && group == LANE_MAIN,
            padding: true,
            ttl: Some(ttl),
            prompt_caching: self.prompt_caching,
            attribution_header: self.attribution,
            // The replay's layout what-if keeps the 2.1.88 layout (its dynamic part unmarked).
            dynamic_marker: false,
        }
    }
}

/// The request-layout and tool-output knobs a replay honours ([`ReplayLayout`],
/// [`ReplayOptions::output_limits`], [`ReplayOptions::ttl_other`]).
pub const LAYOUT_KNOBS: [&str; 16] = [
    "dynamic_boundary",
    "global_cache_scope",
    "prompt_caching",
    "attribution_header",
    "first_party",
    "base_url",
    "disable_experimental_betas",
    "enable_tool_search",
    "deferred_tools_delta",
    "mcp_instructions",
    "bash_max_output_length",
    "read_max_lines",
    "read_max_bytes",
    "read_max_tokens",
    "max_mcp_output_tokens",
    "ttl_other",
];

/// Why a replay of a real session cannot honour the knob `key` (`None` when it does): what the
/// recording fixes that the knob would change.
pub fn knob_not_replayed_reason(key: &str) -> Option<&'static str> {
    if knob_on_real_sessions(key) {
        return None;
    }
    let top = key.split('.').next().unwrap_or(key);
    Some(match top {
        "interactive" => "the recording fixes the mode the client ran in (the prompts and replies are those of that mode)",
        "skill_listing_budget_fraction" | "skill_description_max" => "the skill listing is inside the unrecorded prefix, sized from the record as a whole",
        "smoosh_into_tool_result" | "tool_loaded_sibling" => "the recorded messages already carry the client's own arrangement of attachments and tool results",
        "todo_reminder_turns" | "date_change_attachment" => "the recorded reminders and attachments are the ones the client sent; the transcript cannot say which others it would have",
        "claude_md" | "nested_memory" | "auto_memory" | "git_status" | "agent_list_in_messages" => {
            "the texts it adds or removes are not in the transcript (sized only as part of the recorded prefix and user context)"
        }
        "run_hooks" | "stop_hook_cap" => "hook output is recorded; the transcript holds what the hooks returned, not commands to run again",
        "relevant_memories" => "the memory files and the selection side call are not in the transcript",
        "client_version" => "the recording fixes the client version (its size profile and behaviour are the recorded one's)",
        "size_profile_padding" => "the replay sizes the unrecorded prefix from the record itself, not from padded texts",
        _ if key.starts_with("compact.") => "a long-context stage the replay does not run: the recording's own compactions and clearings stand",
        _ => "the recording fixes it",
    })
}

/// Names of the deferred tools a session's ToolSearch calls select (`select:A,B`).
pub(super) fn tool_search_selections(session: &ImportedSession) -> BTreeSet<String> {
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

/// Takes the `deferred_tools_delta` reminders out of `messages` (a client without tool search
/// announces nothing: every tool is in `tools`); a message left empty goes, and the messages
/// around it of one role are merged. Whether any was taken.
pub(super) fn drop_deferred_listings(messages: &mut Vec<Message>) -> bool {
    let opening = format!("{}\"deferred_tools_delta\">", crate::recording::claude_code::ATTACHMENT_REMINDER);
    let mut dropped = false;
    for message in messages.iter_mut() {
        let MessageContent::Blocks(blocks) = &mut message.content else { continue };
        let before = blocks.len();
        blocks.retain(|b| !matches!(b, ContentBlock::Text { text, .. } if text.starts_with(&opening)));
        dropped |= blocks.len() != before;
    }
    if dropped {
        let mut out: Vec<Message> = Vec::with_capacity(messages.len());
        for message in messages.drain(..) {
            if matches!(&message.content, MessageContent::Blocks(b) if b.is_empty()) {
                continue;
            }
            match out.last_mut() {
                Some(last) if last.role == message.role => {
                    let blocks = message.content.into_blocks();
                    last.content.blocks_mut().extend(blocks);
                }
                _ => out.push(message),
            }
        }
        *messages = out;
    }
    dropped
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

/// Why the knob `key`, honoured by a replay, changed nothing on `session` across `strategies`
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
            Some("the session shows no deferred tool (no deferred_tools_delta attachment, no ToolSearch load), so sending every tool up front adds none the replay knows".to_owned())
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

/// Why two strategies gave the same results on `session`, per knob they differ in: a knob the
/// replay cannot honour, or one that changed nothing on this session
/// ([`knob_no_effect_reason`]). `None` when no knob's reason is known.
pub fn same_results_reason(a: &crate::strategy::Strategy, b: &crate::strategy::Strategy, session: &ImportedSession) -> Option<String> {
    let knobs_b: std::collections::BTreeMap<String, Value> = crate::strategy::presets::flatten_knobs(b).into_iter().collect();
    let differing: Vec<String> = crate::strategy::presets::flatten_knobs(a).into_iter().filter(|(k, v)| knobs_b.get(k) != Some(v)).map(|(k, _)| k).collect();
    let pair = [a.clone(), b.clone()];
    let reasons: Vec<String> = differing
        .iter()
        .filter_map(|key| match knob_not_replayed_reason(key) {
            Some(why) => Some(format!("the replay of a recording does not honour {key}: {why}")),
            None => knob_no_effect_reason(key, &pair, session).map(|why| format!("{key}: {why}")),
        })
        .collect();
    (!reasons.is_empty()).then(|| reasons.join("; "))
}
