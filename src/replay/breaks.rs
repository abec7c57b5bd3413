//! Cache breaks in the record, with the cause the replay attributes.
//!
//! A recorded break (reference/real-breaks.md, "Method") is a call whose `cache_read` fell at
//! least 1,000 tokens below what the previous call of its lane *cached* (its read + creation).
//! The cause is the first of the events the replay saw before the call, in this order:
//! `ttl_expired`, `model_switch`, `tool_search_load`, `skill`, `microcompact`, `resume`,
//! `compaction`, `rerendered_prompt` (the replay re-rendered the previous turn's prompt, see
//! [`super::turns`]), `tool_hook_context` (2.1.200–2.1.231: a tool hook's context in the previous
//! turn kept the new prompt from reading the side entry), `turn_rerender` (2.1.200+: the new prompt re-rendered the conversation
//! start and no side entry kept it; any version: the prompt delivered an item queued before a
//! compaction, the call's events then also name `queued_across_compaction`); failing those, at a new user turn of a version with the N-pattern,
//! `rerendered_prompt` all the same (the inference of reference/real-breaks.md, not predicted);
//! else `unexplained`. `predicted` is 1 when the replay's own read fell as far, else 0.

use std::collections::BTreeMap;

use serde::Serialize;

use super::profile::ClientProfile;
use super::session::SessionReplay;

/// The drop below the previous call's cache that counts as a break.
pub const BREAK_MIN_DROP: u64 = 1_000;

/// The causes in the order they are tried; `unexplained` when none applies.
pub const CAUSE_ORDER: [&str; 10] = [
    "ttl_expired",
    "model_switch",
    "tool_search_load",
    "skill",
    "microcompact",
    "resume",
    "compaction",
    "rerendered_prompt",
    "tool_hook_context",
    "turn_rerender",
];

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BreakRow {
    pub index: usize,
    pub lane: String,
    pub time_ms: u64,
    pub gap_ms: u64,
    pub previous_cached: u64,
    pub cache_read: u64,
    pub drop: u64,
    pub cause: String,
    /// Share of this break the replay predicted (0..=1).
    pub predicted: f64,
    pub simulated_cache_read: f64,
}

/// One compared call as the break rule reads it: the record, the events before it, and where a
/// replay measured it (0 else) its measured read, its read after the N-pattern expected value
/// and its cache (read + creation).
pub struct BreakCall<'a> {
    pub index: usize,
    pub lane: &'a str,
    pub time_ms: u64,
    pub version: Option<&'a str>,
    pub recorded: &'a crate::api::Usage,
    pub events: &'a [String],
    pub sim_read: f64,
    pub sim_cache_read: f64,
    pub sim_cached: f64,
}

/// The recorded breaks of a replayed session.
pub fn find_breaks(replay: &SessionReplay) -> Vec<BreakRow> {
    breaks_of(replay.calls.iter().filter(|c| c.compared()).map(|call| BreakCall {
        index: call.index,
        lane: &call.lane,
        time_ms: call.time_ms,
        version: call.version.as_deref(),
        recorded: &call.recorded,
        events: &call.events,
        sim_read: call.metrics.as_ref().map_or(0.0, |m| m.cache_read_input_tokens as f64),
        sim_cache_read: call.sim_cache_read,
        sim_cached: call.sim_cache_read + call.sim_cache_creation,
    }))
}

/// The recorded breaks of `session` with the causes its record view names (nothing simulated:
/// no break is `predicted`).
pub fn record_breaks(session: &crate::recording::ImportedSession, view: &super::RecordView) -> Vec<BreakRow> {
    let by_index: BTreeMap<usize, &crate::recording::RecordedCall> = session.calls.iter().map(|c| (c.index, c)).collect();
    breaks_of(view.calls.iter().filter(|c| c.skipped.is_none()).filter_map(|seen| {
        let call = by_index.get(&seen.index)?;
        Some(BreakCall {
            index: call.index,
            lane: &call.lane,
            time_ms: call.time_ms,
            version: call.version.as_deref(),
            recorded: &call.usage,
            events: &seen.events,
            sim_read: 0.0,
            sim_cache_read: 0.0,
            sim_cached: 0.0,
        })
    }))
}

/// The breaks among `calls` (the compared ones, in call order).
pub fn breaks_of<'a>(calls: impl Iterator<Item = BreakCall<'a>>) -> Vec<BreakRow> {
    let mut previous: BTreeMap<&str, (u64, u64, f64)> = BTreeMap::new();
    let mut rows = Vec::new();
    for call in calls {
        let lane = if call.lane == "compact" { "main" } else { call.lane };
        let rec = call.recorded;
        if let Some(&(prev_cached, prev_time, prev_sim_cached)) = previous.get(lane)
            && rec.cache_read_input_tokens + BREAK_MIN_DROP <= prev_cached
        {
            let profile = ClientProfile::for_version(call.version.unwrap_or(""));
            let has = |e: &str| call.events.iter().any(|x| x == e);
            let mut cause = CAUSE_ORDER.iter().find(|c| has(c)).map(|c| (*c).to_owned());
            let mut predicted = if call.sim_read + BREAK_MIN_DROP as f64 <= prev_sim_cached { 1.0 } else { 0.0 };
            if cause.is_none() && has("new_user_turn") && profile.rerenders_prompts() {
                // Attributed by reference/real-breaks.md's inference, but not by the replay's rule.
                cause = Some("rerendered_prompt".to_owned());
                predicted = 0.0;
            }
            rows.push(BreakRow {
                index: call.index,
                lane: call.lane.to_owned(),
                time_ms: call.time_ms,
                gap_ms: call.time_ms.saturating_sub(prev_time),
                previous_cached: prev_cached,
                cache_read: rec.cache_read_input_tokens,
                drop: prev_cached - rec.cache_read_input_tokens,
                cause: cause.unwrap_or_else(|| "unexplained".to_owned()),
                predicted,
                simulated_cache_read: call.sim_cache_read.round(),
            });
        }
        previous.insert(lane, (rec.cache_read_input_tokens + rec.cache_creation_input_tokens, call.time_ms, call.sim_cached));
    }
    rows
}
