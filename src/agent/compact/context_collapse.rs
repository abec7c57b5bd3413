//! Stage `context_collapse` (§4.2; the reference's module is absent, internals are ours).
//!
//! - **Trigger**: enabled, and the conversation reaches `commit_pct` (~90%) of the effective
//!   window. While collapse is enabled it owns context pressure: autocompact's proactive path and
//!   the blocking preempt stand down, as in the reference.
//! - **Rewrites**: commits the oldest API rounds (after the first prompt, outside the last
//!   `keep_recent_groups`) into one meta user message each span, a deterministic digest of
//!   `summary_tokens`, until the context is at or below `target_pct`. Commits are logged in
//!   [`CollapseState`]; the projected view flows forward with the conversation, so replaying the
//!   log is the identity. At `block_pct` (~95%) after committing, the request is blocked.
//!   [`drain`] commits every collapsible span at once: the first rung of prompt-too-long recovery.
//! - **Preserves**: whole rounds only (tool pairs intact), the first prompt, the recent tail.
//! - **Invalidates**: the cached prefix from the first collapsed message.

use crate::api::{ContentBlock, Message, MessageContent, ToolResultContent};
use crate::measure::metrics::StageReport;

use super::chain::Stage;
use super::config::CompactConfig;
use super::context::{ChainContext, Entry, EntryKind};
use super::counting::{Thresholds, rough_entries};
use super::grouping::group_by_api_round;

/// One committed collapse: the uuids of the first and last records it replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollapseCommit {
    pub first_uuid: u64,
    pub last_uuid: u64,
    pub messages: usize,
    pub tokens_before: u64,
    pub tokens_after: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollapseState {
    pub commits: Vec<CollapseCommit>,
}

pub struct ContextCollapse;

fn digest(entries: &[Entry], max_chars: usize) -> String {
    let mut text = format!("[Collapsed {} earlier messages. Digest:]\n", entries.len());
    'outer: for entry in entries {
        let parts: Vec<String> = match &entry.message().content {
            MessageContent::Text(t) => vec![t.to_string()],
            MessageContent::Blocks(blocks) => blocks
                .iter()
                .map(|b| match b {
                    ContentBlock::Text { text, .. } => String::clone(text),
                    ContentBlock::ToolUse { name, input, .. } => format!("{name} {input}"),
                    ContentBlock::ToolResult { content: Some(ToolResultContent::Text(t)), .. } => String::clone(t),
                    _ => String::new(),
                })
                .collect(),
        };
        for part in parts {
            let line: String = part.lines().next().unwrap_or("").chars().take(120).collect();
            if line.is_empty() {
                continue;
            }
            if text.len() + line.len() + 3 > max_chars {
                break 'outer;
            }
            text.push_str("- ");
            text.push_str(&line);
            text.push('\n');
        }
    }
    text
}

/// Commits spans of rounds `[first, last)` of the current grouping while `keep_going` says so.
/// Returns the number of commits and the first replaced entry index.
fn commit_until(cx: &mut ChainContext<'_>, mut keep_going: impl FnMut(u64) -> bool) -> (usize, Option<usize>) {
    let config = &cx.config.context_collapse;
    let groups = group_by_api_round(&cx.entries);
    let first = usize::from(groups.first().is_some_and(|g| !cx.entries[g.start].is_assistant()));
    let last = groups.len().saturating_sub(config.keep_recent_groups);
    let mut tokens = rough_entries(&cx.entries);
    let mut end = first;
    while end < last && keep_going(tokens) {
        tokens -= rough_entries(&cx.entries[groups[end].clone()]);
        end += 1;
    }
    if end == first {
        return (0, None);
    }
    let range = groups[first].start..groups[end - 1].end;
    let span = &cx.entries[range.clone()];
    let span_tokens = rough_entries(span);
    let max_chars = ((config.summary_tokens * 4) as usize).min((span_tokens * 2) as usize);
    let text = digest(span, max_chars);
    let (first_uuid, last_uuid) = (span[0].uuid, span[span.len() - 1].uuid);
    let ts = span[span.len() - 1].timestamp_ms;
    let messages = span.len();
    let uuid = cx.state.uuid();
    let mut collapsed = Entry::new(Message::user_text(text), uuid, ts);
    collapsed.is_meta = true;
    collapsed.kind = EntryKind::Collapsed { span: (first_uuid, last_uuid) };
    let tokens_after = collapsed.rough();
    cx.entries.splice(range.clone(), [collapsed]);
    cx.state.collapse.commits.push(CollapseCommit { first_uuid, last_uuid, messages, tokens_before: span_tokens, tokens_after });
    (1, Some(range.start))
}

/// `recoverFromOverflow`: commit everything collapsible. Returns how many spans were committed.
pub fn drain(cx: &mut ChainContext<'_>) -> usize {
    let (committed, _) = commit_until(cx, |_| true);
    if committed > 0 {
        cx.event("context_collapse");
    }
    committed
}

impl Stage for ContextCollapse {
    fn name(&self) -> &'static str {
        "context_collapse"
    }

    fn enabled(&self, config: &CompactConfig) -> bool {
        config.context_collapse.enabled
    }

    fn reports_rough_after(&self) -> bool {
        true
    }

    fn run(&self, cx: &mut ChainContext<'_>) -> StageReport {
        let config = &cx.config.context_collapse;
        let effective = Thresholds::compute(cx.limits, cx.config).effective_window;
        let commit_at = effective * config.commit_pct / 100;
        let block_at = effective * config.block_pct / 100;
        let target = effective * config.target_pct / 100;
        let tokens_before = cx.rough_total();
        let mut report = StageReport {
            name: self.name().into(),
            fired: false,
            reason: format!("below commit threshold ({tokens_before} < {commit_at})").into(),
            tokens_before,
            tokens_after: tokens_before,
            invalidated_from: None,
        };
        if tokens_before >= commit_at {
            let (committed, first) = commit_until(cx, |t| t > target);
            if committed > 0 {
                report.fired = true;
                report.reason = format!("committed a collapse at {tokens_before} ≥ {commit_at}").into();
                report.invalidated_from = first.map(|i| cx.wire_path(i, None));
                cx.event("context_collapse");
            } else {
                report.reason = "over commit threshold, nothing collapsible".into();
            }
        }
        report.tokens_after = rough_entries(&cx.entries);
        if report.tokens_after >= block_at {
            report.reason.to_mut().push_str(&format!("; blocked at {} ≥ {block_at}", report.tokens_after));
            cx.output.blocked = Some("Prompt is too long".to_owned());
        }
        report
    }
}
