//! Stage `autocompact` (§5.1–5.5): summarize the conversation when it nears the window.
//!
//! - **Trigger**: `tokenCountWithEstimation − snip freed ≥ effective − 13,000` (effective =
//!   window − min(max output, 20,000); `CLAUDE_AUTOCOMPACT_PCT_OVERRIDE` can lower it), unless
//!   compaction is disabled, this is a fork (`compact`, `session_memory`), context collapse owns
//!   the pressure, or the circuit breaker is open (3 consecutive failures).
//! - **Rewrites**: session-memory compaction is tried first (no model call). Otherwise it asks for
//!   a summary: a cache-sharing fork in lane `compact` whose messages are the main thread's with
//!   our summary instruction merged into the last user message and the cache marker on the
//!   second-to-last. [`finish`] takes the summary and rebuilds: boundary, summary, restored
//!   attachments, hook results; a summary that is itself `Prompt is too long` drops the oldest
//!   API rounds and asks again (up to 3 times).
//! - **Preserves**: nothing of the old messages but what the summary and attachments carry; no
//!   tool pair is split (the rebuild keeps none, or whole pairs for session memory).
//! - **Invalidates**: the cached prefix from `messages[0]` (and the billing fingerprint, which is
//!   derived from the first user text).

use crate::api::{CacheControl, ContentBlock, Message, MessageContent, Role};
use crate::measure::metrics::StageReport;

use super::chain::Stage;
use super::config::CompactConfig;
use super::context::{AutoCompactTracking, ChainContext, CompactTrigger, CompactionReply, CompactionRequest, Entry, QuerySource};
use super::counting::{Thresholds, rough_entries, token_count_with_estimation};
use super::grouping::truncate_head_for_ptl_retry;
use super::rebuild::{AttachmentMode, rebuild};
use super::recovery::parse_prompt_too_long;
use super::session_memory;

/// Our summary instruction, appended to the last user message of the fork.
pub const SUMMARY_INSTRUCTION: &str = "Stop here and write a handover summary of this conversation instead of continuing it. \
Do not call any tools. First think it through inside <analysis> tags, then give the summary inside <summary> tags with \
these parts: what the user asked for and why; key technical ideas; files and code touched, with the important snippets; \
errors met and how they were fixed; problems solved; every message the user wrote, briefly; open tasks; exactly what was \
being worked on last; and the next step, if one is clearly implied.";

/// What [`finish`] decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// Send this request next (prompt-too-long retry of the summary request).
    Retry(CompactionRequest),
    /// Done; `compacted` says whether the conversation was rebuilt.
    Done { compacted: bool },
}

pub struct Autocompact;

impl Stage for Autocompact {
    fn name(&self) -> &'static str {
        "autocompact"
    }

    fn enabled(&self, _config: &CompactConfig) -> bool {
        true
    }

    fn size_before(&self, entries: &[Entry]) -> u64 {
        rough_entries(entries).max(token_count_with_estimation(entries))
    }

    fn run(&self, cx: &mut ChainContext<'_>) -> StageReport {
        let thresholds = Thresholds::compute(cx.limits, cx.config);
        let tokens_before = rough_entries(&cx.entries);
        let counted = token_count_with_estimation(&cx.entries).saturating_sub(cx.output.snip_tokens_freed);
        let mut report = StageReport {
            name: self.name().to_owned(),
            fired: false,
            reason: String::new(),
            tokens_before,
            tokens_after: tokens_before,
            invalidated_from: None,
        };
        let auto = &cx.config.autocompact;
        let skip = if auto.compact_disabled {
            Some("compaction disabled".to_owned())
        } else if matches!(cx.source, QuerySource::Compact | QuerySource::SessionMemory) {
            Some("forks never compact".to_owned())
        } else if cx.state.tracking.consecutive_failures >= auto.max_consecutive_failures {
            Some(format!("circuit breaker open after {} consecutive failures", cx.state.tracking.consecutive_failures))
        } else if !auto.enabled {
            Some("auto-compact disabled".to_owned())
        } else if cx.config.context_collapse.enabled {
            Some("context collapse owns context pressure".to_owned())
        } else if !thresholds.above_autocompact(counted) {
            Some(format!("below threshold ({counted} < {})", thresholds.autocompact))
        } else {
            None
        };
        if let Some(reason) = skip {
            report.reason = reason;
            return report;
        }
        if session_memory::try_compact(cx, Some(thresholds.autocompact)) {
            after_success(cx);
            cx.event("session_memory_compaction");
            report.name = "session_memory_compact".to_owned();
            report.fired = true;
            report.reason = format!("session memory compaction at {counted} ≥ {}", thresholds.autocompact);
            report.tokens_after = rough_entries(&cx.entries);
            report.invalidated_from = Some(cx.wire_path(0, None));
            return report;
        }
        let pre_tokens = token_count_with_estimation(&cx.entries);
        let request = request(cx, CompactTrigger::Auto, cx.entries.clone(), pre_tokens, 0);
        cx.output.pending_compaction = Some(request);
        report.reason = format!("requested summary at {counted} ≥ {}", thresholds.autocompact);
        report
    }
}

/// Builds the fork request over `fork_entries` and remembers them for retries.
pub fn request(cx: &mut ChainContext<'_>, trigger: CompactTrigger, fork_entries: Vec<Entry>, pre_tokens: u64, ptl_attempt: u32) -> CompactionRequest {
    let mut messages: Vec<Message> = fork_entries.iter().filter(|e| e.on_wire()).map(|e| e.message().clone()).collect();
    let mut instruction = SUMMARY_INSTRUCTION.to_owned();
    if let Some(custom) = &cx.inputs.custom_instructions {
        instruction.push_str("\n\nAdditional instructions:\n");
        instruction.push_str(custom);
    }
    match messages.last_mut() {
        Some(last) if last.role == Role::User => match &mut last.content {
            MessageContent::Text(text) => {
                text.push('\n');
                text.push_str(&instruction);
            }
            MessageContent::Blocks(blocks) => blocks.push(ContentBlock::text(instruction)),
        },
        _ => messages.push(Message::user_text(instruction)),
    }
    let marker_index = messages.len().checked_sub(2);
    if let Some(i) = marker_index {
        let message = &mut messages[i];
        if let MessageContent::Text(text) = &message.content {
            message.content = MessageContent::Blocks(vec![ContentBlock::text(text.clone())]);
        }
        if let MessageContent::Blocks(blocks) = &mut message.content {
            for block in blocks.iter_mut().rev() {
                if block.set_cache_control(Some(CacheControl::ephemeral())) {
                    break;
                }
            }
        }
    }
    cx.output.fork_entries = fork_entries;
    CompactionRequest { lane: "compact", trigger, messages, marker_index, pre_tokens, ptl_attempt }
}

fn after_success(cx: &mut ChainContext<'_>) {
    cx.state.tracking = AutoCompactTracking { compacted: true, turn_counter: 0, consecutive_failures: 0 };
    cx.state.session_memory.last_summarized_uuid = None;
    cx.state.cached_microcompact = Default::default();
    if cx.source.is_main_thread() {
        cx.state.collapse = Default::default();
    }
    cx.output.compacted = true;
}

fn report_mut<'c>(cx: &'c mut ChainContext<'_>, trigger: CompactTrigger) -> &'c mut StageReport {
    let name = if trigger == CompactTrigger::Reactive { "reactive_compact" } else { "autocompact" };
    if !cx.output.reports.iter().any(|r| r.name == name) {
        let tokens = rough_entries(&cx.entries);
        cx.output.reports.push(super::chain::skipped(name, "", tokens));
    }
    cx.output.reports.iter_mut().rev().find(|r| r.name == name).expect("report just ensured")
}

/// Takes the fork's reply to `request` (see the module docs).
pub fn finish(cx: &mut ChainContext<'_>, request: &CompactionRequest, reply: CompactionReply) -> Finish {
    let trigger = request.trigger;
    let failure = match reply {
        CompactionReply::Summary(text) if text.starts_with("Prompt is too long") || text.starts_with("prompt is too long") => {
            let attempt = request.ptl_attempt + 1;
            if attempt <= cx.config.autocompact.max_ptl_retries {
                let gap = parse_prompt_too_long(&text).map(|(actual, limit)| actual.saturating_sub(limit));
                let uuid = cx.state.uuid();
                let fork = std::mem::take(&mut cx.output.fork_entries);
                if let Some(truncated) = truncate_head_for_ptl_retry(&fork, gap, uuid) {
                    let next = self::request(cx, trigger, truncated, request.pre_tokens, attempt);
                    return Finish::Retry(next);
                }
            }
            "conversation too long to summarize, even after dropping its oldest rounds".to_owned()
        }
        CompactionReply::Summary(text) if text.trim().is_empty() => "summary had no text".to_owned(),
        CompactionReply::Summary(text) if text.starts_with("API Error") => text,
        CompactionReply::Failed(error) => error,
        CompactionReply::Summary(text) => {
            let tokens_before = rough_entries(&cx.entries);
            rebuild(cx, trigger, request.pre_tokens, text, Vec::new(), AttachmentMode::Full);
            after_success(cx);
            cx.output.fork_entries.clear();
            cx.event("compaction");
            let tokens_after = rough_entries(&cx.entries);
            let path = cx.wire_path(0, None);
            let report = report_mut(cx, trigger);
            report.fired = true;
            report.reason = format!("{} compaction (summary after {} retries)", trigger.as_str(), request.ptl_attempt);
            report.tokens_before = tokens_before;
            report.tokens_after = tokens_after;
            report.invalidated_from = Some(path);
            return Finish::Done { compacted: true };
        }
    };
    cx.output.fork_entries.clear();
    if trigger == CompactTrigger::Auto {
        cx.state.tracking.consecutive_failures += 1;
    }
    let failures = cx.state.tracking.consecutive_failures;
    let report = report_mut(cx, trigger);
    report.reason = format!("compaction failed ({failure}); consecutive failures {failures}");
    Finish::Done { compacted: false }
}
