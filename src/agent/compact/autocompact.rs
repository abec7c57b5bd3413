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
//!   attachments, hook results. A summary request the API refuses as too long drops the oldest
//!   API rounds and asks again (up to 3 times); a reactive one peels the newest rounds instead
//!   (`grouping`), and strips media after a media-size error.
//! - **Preserves**: nothing of the old messages but what the summary and attachments carry
//!   (Claude Code 2.1.332: the newest API round verbatim on the first compaction,
//!   [`split_recent_rounds`]); no tool pair is split (whole rounds are kept or none).
//! - **Invalidates**: the cached prefix from `messages[0]` (and the billing fingerprint, which is
//!   derived from the first user text).

use crate::api::{CacheControl, ContentBlock, Message, MessageContent, Role};
use crate::measure::metrics::StageReport;

use super::chain::Stage;
use super::config::CompactConfig;
use super::context::{AutoCompactTracking, ChainContext, CompactTrigger, CompactionReply, CompactionRequest, Entry, QuerySource};
use super::counting::{Thresholds, rough_entries, token_count_with_estimation};
use super::config::PeeledTail;
use super::grouping::{Trimmed, peel_tail_for_ptl, truncate_head};
use super::rebuild::{AttachmentMode, rebuild};
use super::recovery::{is_media_size_error, parse_prompt_too_long, strip_media_to_text};
use super::session_memory;

/// What marks a request as our compaction fork (`live::script` classifies lanes by it).
pub const SUMMARY_MARKER: &str = "write a handover summary of this conversation";

/// The summary instruction's no-tools preamble (§5.6; our words, the 2.1.88 sizes).
const SUMMARY_PREAMBLE: &str = r#"IMPORTANT: answer in plain text only and do not use any tool. Every tool is off for this turn: a tool call would be refused, and this is your single chance to reply, so the whole reply must be the written summary described below.

"#;

/// The base template: the `<analysis>` scratchpad, the nine sections, the output layout.
const SUMMARY_BASE: &str = r#"Your job now is to write a handover summary of this conversation so far, and a thorough one. Pay close attention to what the user explicitly asked for and to everything you did in response. Another session will pick the work up from your summary alone, without the conversation, so it has to carry every technical detail, code pattern and design decision that the work depends on.

Before the summary, think inside <analysis> tags and make sure nothing is missed. In that analysis:

1. Go through the conversation from its start, message by message and section by section. For each part, work out:
   - what the user asked for and what they were trying to achieve;
   - how you went about it;
   - the decisions taken and the code patterns chosen;
   - the concrete details: file names, whole code snippets, function signatures, the edits made;
   - the errors you hit and how each one was resolved;
   - any feedback the user gave, above all where they told you to do something another way.
   - the state each piece of work was left in: finished and verified, finished but untested, half done, or only planned. Tests that were run, with their outcome, belong here too, since the next session will otherwise run them again.
2. Re-check that every point is accurate and complete, one by one. Where the conversation changed direction, say which direction won and why, so that an abandoned approach is not taken up again by mistake.
3. Note anything the user said they did not want, such as libraries to avoid, files to leave alone or styles they rejected, so that those preferences survive the handover.

The summary itself then has these sections:

1. Primary Request and Intent: everything the user explicitly asked for, in full detail.
2. Key Technical Concepts: the technologies, frameworks and technical ideas the discussion relied on.
3. Files and Code Sections: each file looked at, changed or created. Say why it matters and what was done to it; quote the full code where it is significant, and add a line on why the change was made.
4. Errors and fixes: each error you met and how it was fixed, including any correction from the user.
5. Problem Solving: the problems that were solved, and any troubleshooting still under way.
6. All user messages: every message the user wrote that is not a tool result, listed in order. They record how the user's requests and feedback evolved, so none may be left out.
7. Pending Tasks: the tasks you were explicitly asked to do that are not finished yet.
8. Current Work: what was being worked on right before this request, precisely, with file names and code snippets where relevant, paying most attention to the latest messages of both the user and you.
9. Optional Next Step: the next step, only if it follows directly from the latest explicit request and the work just described. If the last task was finished, name a next step only when the user clearly asked for it; do not start on side requests or old, already settled ones without asking the user first. When you name a next step, quote the latest conversation verbatim to show which task was under way and where it stopped, so the work goes on without drift.

Lay your reply out like this:

<example>
<analysis>
[Your reasoning, making sure every point above is covered thoroughly and correctly]
</analysis>

<summary>
1. Primary Request and Intent:
   [A detailed account]

2. Key Technical Concepts:
   - [Concept 1]
   - [Concept 2]
   - [...]

3. Files and Code Sections:
   - [File name 1]
      - [Why this file matters]
      - [What changed in it, if anything]
      - [Key code snippet]
   - [File name 2]
      - [Key code snippet]
   - [...]

4. Errors and fixes:
    - [Error 1 and how it was fixed]:
      - [How the user reacted to it, if they did]
    - [...]

5. Problem Solving:
   [The problems solved and the troubleshooting still going on]

6. All user messages:
    - [The user's messages that are not tool results, in order]
    - [...]

7. Pending Tasks:
   - [Task 1]
   - [Task 2]
   - [...]

8. Current Work:
   [A precise description of the work in progress]

9. Optional Next Step:
   [The next step, if there is one]

</summary>
</example>

Write the summary from the conversation so far along these lines, precise and complete, so that it can stand in for the conversation itself. Prefer exact names, paths, commands and error messages over paraphrase: the next session cannot look back at what was said, and a vague summary forces it to redo work that was already done. Keep the sections in the order given and keep their names, even when one of them has nothing to report; write "None" under it in that case rather than leaving it out.

The context you were given may contain extra summarization instructions. If it does, follow them while writing the summary as well. For example:
<example>
## Compact Instructions
When summarizing, put the emphasis on the TypeScript code changes, and also record the mistakes you made and how you fixed them.
</example>

<example>
# Summary instructions
When you are using compact - please concentrate on test output and code changes. Quote file reads verbatim.
</example>
"#;

/// The no-tools trailer.
const SUMMARY_TRAILER: &str = r#"

REMINDER: no tool calls. Your reply is plain text: one <analysis> block, then one <summary> block. A tool call would be rejected and would waste this turn."#;

/// Our summary instruction, appended to the last user message of the compaction fork:
/// preamble, base template, `Additional Instructions:` with the custom ones when given, trailer
/// (the structure of the reference's `getCompactPrompt`, ~5.5k characters like 2.1.88's).
pub fn summary_instruction(custom: Option<&str>) -> String {
    let mut text = format!("{SUMMARY_PREAMBLE}{SUMMARY_BASE}");
    if let Some(custom) = custom.map(str::trim).filter(|c| !c.is_empty()) {
        text.push_str("\n\nAdditional Instructions:\n");
        text.push_str(custom);
    }
    text.push_str(SUMMARY_TRAILER);
    text
}

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

    fn reports_rough_after(&self) -> bool {
        true
    }

    fn run(&self, cx: &mut ChainContext<'_>) -> StageReport {
        let thresholds = Thresholds::compute(cx.limits, cx.config);
        let tokens_before = cx.rough_total();
        let counted = token_count_with_estimation(&cx.entries).saturating_sub(cx.output.snip_tokens_freed);
        let mut report = StageReport {
            name: self.name().into(),
            fired: false,
            reason: "".into(),
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
        } else {
            cx.output.autocompact_checked = Some(counted);
            (!thresholds.above_autocompact(counted)).then(|| crate::shared::counted_against("below threshold (", counted, " < ", thresholds.autocompact))
        };
        if let Some(reason) = skip {
            report.reason = reason.into();
            return report;
        }
        if session_memory::try_compact(cx, Some(thresholds.autocompact)) {
            after_success(cx);
            cx.event("session_memory_compaction");
            report.name = "session_memory_compact".into();
            report.fired = true;
            report.reason = format!("session memory compaction at {counted} ≥ {}", thresholds.autocompact).into();
            report.tokens_after = rough_entries(&cx.entries);
            report.invalidated_from = Some(cx.wire_path(0, None));
            return report;
        }
        let pre_tokens = token_count_with_estimation(&cx.entries);
        let (fork, kept) = split_recent_rounds(&cx.entries, cx.inputs.threshold_keeps_rounds);
        let request = request(cx, CompactTrigger::Auto, fork, pre_tokens, 0, (0, 0));
        cx.output.peeled_tail = kept;
        cx.output.pending_compaction = Some(request);
        report.reason = format!("requested summary at {counted} ≥ {}", thresholds.autocompact).into();
        report
    }
}

/// The conversation split for a threshold compaction that keeps the newest `rounds` API rounds
/// verbatim (`groupMessagesByApiRound`: a round starts at an assistant message): what the fork
/// summarizes and what follows the summary. Something must remain to summarize, so at most
/// every round but the first group is kept; `rounds` 0 (or a single group) keeps nothing.
pub fn split_recent_rounds(entries: &[Entry], rounds: usize) -> (Vec<Entry>, Vec<Entry>) {
    let groups = super::grouping::group_by_api_round(entries);
    let keep = rounds.min(groups.len().saturating_sub(1));
    let Some(first_kept) = groups.len().checked_sub(keep).and_then(|i| groups.get(i)).filter(|_| keep > 0) else {
        return (entries.to_vec(), Vec::new());
    };
    if !entries[first_kept.start].is_assistant() {
        return (entries.to_vec(), Vec::new());
    }
    (entries[..first_kept.start].to_vec(), entries[first_kept.start..].to_vec())
}

/// Our error when the summary request stays too long after every retry (the reference's
/// `ERROR_MESSAGE_PROMPT_TOO_LONG`, in our words).
pub const CONVERSATION_TOO_LONG: &str = "The conversation is too long to summarize, even without its oldest rounds. \
Go back a few messages and try again.";

/// Builds the fork request over `fork_entries` and remembers them for retries. `trimmed` is
/// (groups, rough tokens) removed from the conversation so far.
pub fn request(
    cx: &mut ChainContext<'_>,
    trigger: CompactTrigger,
    fork_entries: Vec<Entry>,
    pre_tokens: u64,
    ptl_attempt: u32,
    trimmed: (usize, u64),
) -> CompactionRequest {
    let mut messages: Vec<Message> = fork_entries.iter().filter(|e| e.on_wire()).map(|e| e.message().clone()).collect();
    let instruction = summary_instruction(cx.inputs.custom_instructions.as_deref());
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
            message.content = MessageContent::Blocks(vec![ContentBlock::text(text.clone())].into());
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
    CompactionRequest {
        lane: "compact",
        trigger,
        messages,
        marker_index,
        pre_tokens,
        ptl_attempt,
        trimmed_groups: trimmed.0,
        trimmed_tokens: trimmed.1,
    }
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
    let name = match trigger {
        CompactTrigger::Reactive => "reactive_compact",
        CompactTrigger::Manual => "manual_compact",
        CompactTrigger::Auto => "autocompact",
    };
    if !cx.output.reports.iter().any(|r| r.name == name) {
        let tokens = rough_entries(&cx.entries);
        cx.output.reports.push(super::chain::skipped(name, "", tokens));
    }
    cx.output.reports.iter_mut().rev().find(|r| r.name == name).expect("report just ensured")
}

/// How the removed rounds are described in reports.
fn trimmed_note(trigger: CompactTrigger, groups: usize, tokens: u64, peeled: PeeledTail) -> String {
    match (trigger, groups) {
        (_, 0) => String::new(),
        (CompactTrigger::Reactive, _) => {
            let fate = if peeled == PeeledTail::Keep { "re-appended" } else { "dropped" };
            format!("; peeled the newest {groups} API-round groups ({tokens} rough tokens), {fate}")
        }
        _ => format!("; dropped the oldest {groups} API-round groups ({tokens} rough tokens)"),
    }
}

/// A failure: the reactive path's reason code (§4.3) and a detail.
fn failed(code: &str, detail: impl std::fmt::Display) -> String {
    format!("{code}: {detail}")
}

/// The next fork after the API refused `request` as too long: the oldest groups dropped
/// (proactive) or the newest peeled (reactive), or why not.
fn retry_after_ptl(cx: &mut ChainContext<'_>, request: &CompactionRequest, error: &str) -> Result<CompactionRequest, String> {
    let trigger = request.trigger;
    let attempt = request.ptl_attempt + 1;
    let max = cx.config.autocompact.max_ptl_retries;
    if attempt > max {
        return Err(match trigger {
            CompactTrigger::Reactive => failed("exhausted", format_args!("still too long after {max} retries ({error})")),
            _ => failed("exhausted", format_args!("{CONVERSATION_TOO_LONG} ({max} retries; {error})")),
        });
    }
    let gap = parse_prompt_too_long(error).map(|(actual, limit)| actual.saturating_sub(limit));
    let fork = std::mem::take(&mut cx.output.fork_entries);
    let trimmed: Option<Trimmed> = match trigger {
        CompactTrigger::Reactive => peel_tail_for_ptl(&fork, gap),
        _ => {
            let uuid = cx.state.uuid();
            truncate_head(&fork, gap, uuid)
        }
    };
    let Some(trimmed) = trimmed else {
        return Err(failed("too_few_groups", format_args!("nothing left to drop after {} retries ({error})", request.ptl_attempt)));
    };
    if trigger == CompactTrigger::Reactive {
        let mut peeled = trimmed.removed;
        peeled.append(&mut cx.output.peeled_tail);
        cx.output.peeled_tail = peeled;
    }
    let total = (request.trimmed_groups + trimmed.groups, request.trimmed_tokens + trimmed.tokens);
    cx.event(&format!("truncation:compaction_ptl_retry:{attempt}"));
    Ok(self::request(cx, trigger, trimmed.kept, request.pre_tokens, attempt, total))
}

/// Takes the fork's reply to `request` (see the module docs).
pub fn finish(cx: &mut ChainContext<'_>, request: &CompactionRequest, reply: CompactionReply) -> Finish {
    let trigger = request.trigger;
    let failure = match reply {
        CompactionReply::Refused(error) if is_media_size_error(&error) => {
            if trigger == CompactTrigger::Reactive {
                let mut fork = std::mem::take(&mut cx.output.fork_entries);
                if strip_media_to_text(&mut fork) > 0 {
                    let next = self::request(cx, trigger, fork, request.pre_tokens, request.ptl_attempt, (request.trimmed_groups, request.trimmed_tokens));
                    return Finish::Retry(next);
                }
                failed("media_unstrippable", error)
            } else {
                failed("error", error)
            }
        }
        CompactionReply::Refused(text) | CompactionReply::Summary(text)
            if text.starts_with("Prompt is too long") || text.starts_with("prompt is too long") =>
        {
            match retry_after_ptl(cx, request, &text) {
                Ok(next) => return Finish::Retry(next),
                Err(failure) => failure,
            }
        }
        CompactionReply::Summary(text) if text.trim().is_empty() => failed("error", "summary had no text"),
        CompactionReply::Summary(text) if text.starts_with("API Error") => failed("error", text),
        CompactionReply::Failed(error) | CompactionReply::Refused(error) => failed("error", error),
        CompactionReply::Summary(text) => {
            let tokens_before = rough_entries(&cx.entries);
            let peeled = cx.config.autocompact.reactive_peeled_tail;
            // A reactive fork's peeled rounds follow the knob; a threshold compaction's kept
            // rounds (`split_recent_rounds`) always follow the summary.
            let kept = match (trigger, peeled) {
                (CompactTrigger::Reactive, PeeledTail::Drop) => Vec::new(),
                _ => std::mem::take(&mut cx.output.peeled_tail),
            };
            let kept_note = if trigger == CompactTrigger::Auto && !kept.is_empty() {
                format!("; kept the newest {} API round(s) verbatim", super::grouping::group_by_api_round(&kept).len())
            } else {
                String::new()
            };
            rebuild(cx, trigger, request.pre_tokens, text, kept, AttachmentMode::Full);
            after_success(cx);
            cx.output.fork_entries.clear();
            cx.output.peeled_tail.clear();
            cx.event("compaction");
            let tokens_after = rough_entries(&cx.entries);
            let path = cx.wire_path(0, None);
            let note = format!("{}{kept_note}", trimmed_note(trigger, request.trimmed_groups, request.trimmed_tokens, peeled));
            let report = report_mut(cx, trigger);
            report.fired = true;
            report.reason = format!("{} compaction (summary after {} retries{note})", trigger.as_str(), request.ptl_attempt).into();
            report.tokens_before = tokens_before;
            report.tokens_after = tokens_after;
            report.invalidated_from = Some(path);
            return Finish::Done { compacted: true };
        }
    };
    cx.output.fork_entries.clear();
    cx.output.peeled_tail.clear();
    if trigger == CompactTrigger::Auto {
        cx.state.tracking.consecutive_failures += 1;
    }
    cx.event(&format!("compaction_failed:{}", failure.split(':').next().unwrap_or("error")));
    let failures = cx.state.tracking.consecutive_failures;
    let report = report_mut(cx, trigger);
    report.reason = format!("compaction failed ({failure}); consecutive failures {failures}").into();
    Finish::Done { compacted: false }
}
