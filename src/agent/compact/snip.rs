//! Stage `snip` (§4.1; the reference's module is absent, so the rule is ours).
//!
//! - **Trigger**: enabled, and the rough size of the conversation reaches `trigger_pct` of the
//!   effective window.
//! - **Rewrites**: drops whole API rounds, oldest first, after the preamble (the first prompt),
//!   until the context is at or below `target_pct`, never touching the last
//!   `keep_recent_groups` rounds. The tokens dropped are returned in
//!   `output.snip_tokens_freed`: autocompact and the blocking check subtract them, because the
//!   usage of the surviving last assistant message still counts the dropped rounds.
//! - **Preserves**: tool_use/tool_result pairs (a round holds both), the first prompt, the tail.
//! - **Invalidates**: the cached prefix from the first dropped message on.

use crate::measure::metrics::StageReport;

use super::chain::Stage;
use super::config::CompactConfig;
use super::context::ChainContext;
use super::counting::{Thresholds, rough_entries};
use super::grouping::group_by_api_round;

pub struct Snip;

impl Stage for Snip {
    fn name(&self) -> &'static str {
        "snip"
    }

    fn enabled(&self, config: &CompactConfig) -> bool {
        config.snip.enabled
    }

    fn reports_rough_after(&self) -> bool {
        true
    }

    fn run(&self, cx: &mut ChainContext<'_>) -> StageReport {
        let config = &cx.config.snip;
        let tokens_before = cx.rough_total();
        let effective = Thresholds::compute(cx.limits, cx.config).effective_window;
        let trigger = effective * config.trigger_pct / 100;
        let target = effective * config.target_pct / 100;
        let mut report = StageReport {
            name: self.name().into(),
            fired: false,
            reason: format!("below trigger ({tokens_before} < {trigger})").into(),
            tokens_before,
            tokens_after: tokens_before,
            invalidated_from: None,
        };
        if tokens_before < trigger {
            return report;
        }
        let groups = group_by_api_round(&cx.entries);
        let first_droppable = usize::from(groups.first().is_some_and(|g| !cx.entries[g.start].is_assistant()));
        let last_droppable = groups.len().saturating_sub(config.keep_recent_groups);
        let mut tokens = tokens_before;
        let mut dropped = first_droppable..first_droppable;
        for (g, group) in groups.iter().enumerate().take(last_droppable).skip(first_droppable) {
            if tokens <= target {
                break;
            }
            tokens -= rough_entries(&cx.entries[group.clone()]);
            dropped.end = g + 1;
        }
        if dropped.is_empty() {
            report.reason = "nothing droppable outside the kept rounds".into();
            return report;
        }
        let range = groups[dropped.start].start..groups[dropped.end - 1].end;
        report.invalidated_from = Some(cx.wire_path(range.start, None));
        cx.entries.drain(range);
        let tokens_after = rough_entries(&cx.entries);
        cx.output.snip_tokens_freed += tokens_before - tokens_after;
        cx.event("snip");
        report.fired = true;
        report.reason = format!("dropped {} API rounds", dropped.len()).into();
        report.tokens_after = tokens_after;
        report
    }
}
