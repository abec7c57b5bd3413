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

/// The recorded breaks of a replayed session.
pub fn find_breaks(replay: &SessionReplay) -> Vec<BreakRow> {
    let mut previous: BTreeMap<&str, (u64, u64, f64)> = BTreeMap::new();
    let mut rows = Vec::new();
    for call in replay.calls.iter().filter(|c| c.compared()) {
        let lane = if call.lane == "compact" { "main" } else { call.lane.as_str() };
        let rec = &call.recorded;
        let sim_cached = call.sim_cache_read + call.sim_cache_creation;
        if let Some(&(prev_cached, prev_time, prev_sim_cached)) = previous.get(lane)
            && rec.cache_read_input_tokens + BREAK_MIN_DROP <= prev_cached
        {
            let profile = ClientProfile::for_version(call.version.as_deref().unwrap_or(""));
            let has = |e: &str| call.events.iter().any(|x| x == e);
            let mut cause = CAUSE_ORDER.iter().find(|c| has(c)).map(|c| (*c).to_owned());
            let sim_read = call.metrics.as_ref().map_or(0.0, |m| m.cache_read_input_tokens as f64);
            let mut predicted = if sim_read + BREAK_MIN_DROP as f64 <= prev_sim_cached { 1.0 } else { 0.0 };
            if cause.is_none() && has("new_user_turn") && profile.rerenders_prompts() {
                // Attributed by reference/real-breaks.md's inference, but not by the replay's rule.
                cause = Some("rerendered_prompt".to_owned());
                predicted = 0.0;
            }
            rows.push(BreakRow {
                index: call.index,
                lane: call.lane.clone(),
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
        previous.insert(lane, (rec.cache_read_input_tokens + rec.cache_creation_input_tokens, call.time_ms, sim_cached));
    }
    rows
}
