//! The ordered list of stages and the one runner that runs them.
//!
//! Like a compiler's pass manager: [`STAGES`] is the order (the reference's per-iteration order,
//! §1.2), each stage is a value implementing [`Stage`], and [`Chain`] runs them, skipping disabled
//! ones and verifying two invariants after every stage: no tool_use lost its tool_result (or the
//! reverse), and a stage that promises to shrink the context did not grow it. A broken invariant
//! is a bug in a stage, so it panics with the values. The checks walk every entry twice per
//! stage, so they run where `debug_assertions` are on (every test, the fuzz targets) and not in
//! release builds, where a request's work must follow what changed, not the conversation's
//! length (a 4,000-turn growing script spent a fifth of its time in them).
//!
//! Compaction needs a model call. The runner stops at the stage that asked for one and returns
//! [`ChainStep::Compact`]; the caller obtains the summary and calls
//! [`Chain::finish_compaction`], which rebuilds the conversation and runs the remaining stages.

use std::collections::BTreeSet;

use crate::api::ContentBlock;
use crate::measure::metrics::StageReport;

use super::config::CompactConfig;
use super::context::{ChainContext, CompactTrigger, CompactionReply, CompactionRequest, Entry};
use super::counting::rough_entries;
use super::{autocompact, blocking_limit, context_collapse, microcompact, snip, tool_result_budget};

/// The stages in the reference's order. Session-memory compaction is tried first inside
/// `autocompact` (its report is then named `session_memory_compact`).
pub const STAGES: &[&str] = &["tool_result_budget", "snip", "microcompact", "context_collapse", "autocompact", "blocking_limit"];

/// One stage of the chain.
pub trait Stage {
    /// Stable snake_case id (traces, flags, reports).
    fn name(&self) -> &'static str;
    /// Whether the configuration turns the stage on at all.
    fn enabled(&self, config: &CompactConfig) -> bool;
    /// Whether the stage promises never to grow the context.
    fn shrinks(&self) -> bool {
        true
    }
    /// The size the shrink check compares against. Compaction is judged against the client's
    /// own count (last usage plus estimate), since that is what it was triggered on.
    fn size_before(&self, entries: &[Entry]) -> u64 {
        rough_entries(entries)
    }
    /// Whether the report's `tokens_after` is the rough count of the entries the stage left
    /// (when it did not stop the chain for a compaction): the next stage then starts from it
    /// instead of counting every entry again.
    fn reports_rough_after(&self) -> bool {
        false
    }
    fn run(&self, cx: &mut ChainContext<'_>) -> StageReport;
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("failed to disable stage `{name}`: no such stage (valid stages: {})", STAGES.join(", "))]
    UnknownStage { name: String },
}

/// Where a run of the chain stopped.
#[derive(Debug, Clone, PartialEq)]
pub enum ChainStep {
    /// All stages ran; read `cx.output` (blocked? cache edits? context management?) and
    /// `cx.entries`, then build the request.
    Ready,
    /// A compaction summary is needed: send this request in lane `compact`, then call
    /// [`Chain::finish_compaction`].
    Compact(CompactionRequest),
}

/// The runner.
pub struct Chain {
    stages: Vec<Box<dyn Stage>>,
    disabled: BTreeSet<String>,
}

impl Default for Chain {
    fn default() -> Self {
        Chain::new()
    }
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain").field("stages", &STAGES).field("disabled", &self.disabled).finish()
    }
}

/// A report of a stage that did not run.
pub fn skipped(name: &'static str, reason: &'static str, tokens: u64) -> StageReport {
    StageReport {
        name: name.into(),
        fired: false,
        reason: reason.into(),
        tokens_before: tokens,
        tokens_after: tokens,
        invalidated_from: None,
    }
}

impl Chain {
    /// All stages, in [`STAGES`] order.
    pub fn new() -> Chain {
        let stages: Vec<Box<dyn Stage>> = vec![
            Box::new(tool_result_budget::ToolResultBudget),
            Box::new(snip::Snip),
            Box::new(microcompact::Microcompact),
            Box::new(context_collapse::ContextCollapse),
            Box::new(autocompact::Autocompact),
            Box::new(blocking_limit::BlockingLimit),
        ];
        debug_assert_eq!(stages.iter().map(|s| s.name()).collect::<Vec<_>>(), STAGES);
        Chain { stages, disabled: BTreeSet::new() }
    }

    /// All stages but the named ones (`--disable-stage NAME`).
    pub fn with_disabled<S: AsRef<str>>(names: &[S]) -> Result<Chain, ChainError> {
        let mut chain = Chain::new();
        for name in names {
            let name = name.as_ref();
            if !STAGES.contains(&name) {
                return Err(ChainError::UnknownStage { name: name.to_owned() });
            }
            chain.disabled.insert(name.to_owned());
        }
        Ok(chain)
    }

    pub fn is_disabled(&self, name: &str) -> bool {
        self.disabled.contains(name)
    }

    /// Runs every stage in order on `cx` (after updating the thinking-clear latch, which is
    /// request state of the API layer rather than a stage).
    pub fn run(&self, cx: &mut ChainContext<'_>) -> ChainStep {
        microcompact::update_thinking_latch(cx);
        self.run_from(cx, 0)
    }

    fn run_from(&self, cx: &mut ChainContext<'_>, start: usize) -> ChainStep {
        // The unpaired ids after one stage are those before the next: the entries are walked
        // once per stage that runs, not twice.
        let mut orphans_before: Option<BTreeSet<String>> = None;
        // The rough count of the entries as the last stage left them, where it is known: the
        // caller's count before the first stage, kept across skipped stages (they change
        // nothing) and taken from the report of a stage that counts what it left. A stage
        // reads it once, before it changes anything ([`ChainContext::rough_total`]).
        let mut known: Option<u64> = cx.rough_known.take();
        // (A report per stage: the list made once.)
        cx.output.reports.reserve(self.stages.len().saturating_sub(start));
        for stage in &self.stages[start..] {
            let name = stage.name();
            if self.disabled.contains(name) || !stage.enabled(cx.config) {
                let reason = if self.disabled.contains(name) { "disabled_by_flag" } else { "disabled_by_config" };
                let tokens = *known.get_or_insert_with(|| rough_entries(&cx.entries));
                cx.output.reports.push(skipped(name, reason, tokens));
                continue;
            }
            let before = CHECK_INVARIANTS.then(|| (orphans_before.take().unwrap_or_else(|| orphans(&cx.entries)), stage.size_before(&cx.entries)));
            cx.rough_known = known.take();
            let report = stage.run(cx);
            cx.rough_known = None;
            if let Some((before, tokens_before)) = before {
                orphans_before = Some(verify(name, &cx.entries, &before, tokens_before, stage.shrinks() && cx.output.pending_compaction.is_none()));
            }
            if stage.reports_rough_after() {
                debug_assert!(
                    cx.output.pending_compaction.is_some() || report.tokens_after == rough_entries(&cx.entries),
                    "stage `{name}` reported {} tokens after it, not the rough count of what it left",
                    report.tokens_after
                );
                known = Some(report.tokens_after);
            }
            cx.output.reports.push(report);
            if let Some(request) = &cx.output.pending_compaction {
                return ChainStep::Compact(request.clone());
            }
        }
        ChainStep::Ready
    }

    /// Hands the summary (or the failure) of the pending compaction back. Returns another
    /// request when the summary request itself was too long and a retry is allowed; otherwise
    /// rebuilds the conversation and, for an autocompact, runs the stages after `autocompact`.
    pub fn finish_compaction(&self, cx: &mut ChainContext<'_>, reply: CompactionReply) -> ChainStep {
        let request = cx
            .output
            .pending_compaction
            .take()
            .unwrap_or_else(|| panic!("finish_compaction called with no pending compaction (reply {reply:?})"));
        let before = CHECK_INVARIANTS.then(|| (orphans(&cx.entries), autocompact::Autocompact.size_before(&cx.entries)));
        match autocompact::finish(cx, &request, reply) {
            autocompact::Finish::Retry(next) => {
                cx.output.pending_compaction = Some(next.clone());
                ChainStep::Compact(next)
            }
            autocompact::Finish::Done { compacted } => {
                if let Some((orphans_before, tokens_before)) = before {
                    let _ = verify("autocompact", &cx.entries, &orphans_before, tokens_before, compacted);
                }
                if request.trigger == CompactTrigger::Auto {
                    let next = STAGES.iter().position(|s| *s == "autocompact").map_or(STAGES.len(), |i| i + 1);
                    self.run_from(cx, next)
                } else {
                    ChainStep::Ready
                }
            }
        }
    }
}

/// Whether the chain checks its invariants after each stage (see the module documentation).
const CHECK_INVARIANTS: bool = cfg!(debug_assertions);

/// Tool ids that are not paired: tool_uses without a later tool_result, tool_results without an
/// earlier tool_use.
pub fn orphans(entries: &[Entry]) -> BTreeSet<String> {
    // Borrowed while walking: only the unpaired ids (few) are copied. Hashed, not ordered:
    // the walk only inserts and removes; the few left are sorted into the result.
    let mut open: rustc_hash::FxHashSet<&str> = rustc_hash::FxHashSet::default();
    let mut orphans = BTreeSet::new();
    for entry in entries.iter().filter(|e| e.on_wire()) {
        for block in entry.blocks() {
            match block {
                ContentBlock::ToolUse { id, .. } => {
                    open.insert(id);
                }
                ContentBlock::ToolResult { tool_use_id, .. }
                    if !open.remove(tool_use_id.as_str()) => {
                        orphans.insert(tool_use_id.clone());
                    }
                _ => {}
            }
        }
    }
    orphans.extend(open.into_iter().map(str::to_owned));
    orphans
}

/// Checks a stage's invariants; returns the unpaired ids after it.
fn verify(stage: &str, entries: &[Entry], orphans_before: &BTreeSet<String>, tokens_before: u64, check_shrink: bool) -> BTreeSet<String> {
    let orphans_after = orphans(entries);
    let new: Vec<&String> = orphans_after.difference(orphans_before).collect();
    assert!(new.is_empty(), "stage `{stage}` separated tool_use from tool_result for ids {new:?}");
    if check_shrink {
        let tokens_after = rough_entries(entries);
        assert!(
            tokens_after <= tokens_before,
            "stage `{stage}` grew the context from {tokens_before} to {tokens_after} tokens"
        );
    }
    orphans_after
}

/// Convenience for callers and tests: the reason of the request that just came back.
pub fn summary_reply(text: impl Into<String>) -> CompactionReply {
    CompactionReply::Summary(text.into())
}
