//! Stage `blocking_limit` (§1.2 step 12, §5.1).
//!
//! - **Trigger**: no compaction this iteration, not a fork, neither reactive compact nor context
//!   collapse owns overflow (with auto-compact on), and `tokenCountWithEstimation − snip freed ≥
//!   effective − 3,000` (or `CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE`).
//! - **Rewrites**: nothing; sets `output.blocked` to the synthetic error text `Prompt is too long`
//!   and the turn ends with `blocking_limit` without an API call.
//! - **Preserves**: everything. **Invalidates**: nothing.

use crate::measure::metrics::StageReport;

use super::chain::Stage;
use super::config::CompactConfig;
use super::context::{ChainContext, QuerySource};
use super::counting::{Thresholds, token_count_with_estimation};

pub const BLOCKING_MESSAGE: &str = "Prompt is too long";

pub struct BlockingLimit;

impl Stage for BlockingLimit {
    fn name(&self) -> &'static str {
        "blocking_limit"
    }

    fn enabled(&self, _config: &CompactConfig) -> bool {
        true
    }

    fn reports_rough_after(&self) -> bool {
        true
    }

    fn run(&self, cx: &mut ChainContext<'_>) -> StageReport {
        let tokens = cx.rough_total();
        let thresholds = Thresholds::compute(cx.limits, cx.config);
        let auto = &cx.config.autocompact;
        let counted = token_count_with_estimation(&cx.entries).saturating_sub(cx.output.snip_tokens_freed);
        let mut report = StageReport {
            name: self.name().into(),
            fired: false,
            reason: "".into(),
            tokens_before: tokens,
            tokens_after: tokens,
            invalidated_from: None,
        };
        report.reason = if cx.output.compacted {
            "compacted this iteration".into()
        } else if matches!(cx.source, QuerySource::Compact | QuerySource::SessionMemory) {
            "forks are not checked".into()
        } else if auto.enabled && auto.reactive_enabled {
            "reactive compact owns overflow".into()
        } else if auto.enabled && cx.config.context_collapse.enabled {
            "context collapse owns overflow".into()
        } else if thresholds.at_blocking_limit(counted) {
            report.fired = true;
            cx.output.blocked = Some(BLOCKING_MESSAGE.to_owned());
            crate::shared::counted_against("at blocking limit (", counted, " ≥ ", thresholds.blocking).into()
        } else {
            crate::shared::counted_against("under blocking limit (", counted, " < ", thresholds.blocking).into()
        };
        report
    }
}
