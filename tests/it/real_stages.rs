//! Issue 13 item 5: the agent's long-context stages (time-based and cached microcompact, the
//! aggregate tool result budget, snip, context collapse) run on real sessions: the requests
//! carry what they change, the cache sees the breaks, and a stage that never fires changes
//! nothing.

use ctxsim::api::{ContentBlock, MessageContent, Request, ToolResultContent};
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::recording::ImportedSession;
use ctxsim::replay::session::{knob_on_real_sessions, replay_session_observed};
use ctxsim::replay::{CallReplay, ReplayOptions, SessionReplay, load_session};
use ctxsim::strategy::Strategy;

use crate::support::realdata;

const SPOTTER: &str = "transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl";
/// The spotter session's recorded automatic compaction comes before this call.
const SPOTTER_COMPACTION: usize = 103;

fn session(path: &str) -> ImportedSession {
    load_session(&realdata().join(path)).unwrap()
}

/// Replays `session` under `claude-code` with `sets`, keeping the main lane's request bodies
/// by call index.
fn check(session: &ImportedSession, sets: &[&str]) -> (SessionReplay, std::collections::BTreeMap<usize, Request>) {
    let sets: Vec<String> = sets.iter().map(|s| (*s).to_owned()).collect();
    let strategy = Strategy::resolve_with("claude-code", &sets).unwrap();
    let options = ReplayOptions::from_strategy(&strategy);
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4)).without_body_hashes();
    let mut bodies = std::collections::BTreeMap::new();
    let replay = replay_session_observed(session, &mut measurer, &options, &mut |index, request| {
        bodies.insert(index, request.clone());
    });
    (replay, bodies)
}

fn main_calls(replay: &SessionReplay) -> Vec<&CallReplay> {
    replay.calls.iter().filter(|c| c.lane == "main" && c.compared()).collect()
}

fn call(replay: &SessionReplay, index: usize) -> &CallReplay {
    replay.calls.iter().find(|c| c.index == index).unwrap()
}

/// The calls where `stage` fired.
fn fired(replay: &SessionReplay, stage: &str) -> Vec<usize> {
    main_calls(replay)
        .into_iter()
        .filter(|c| c.metrics.as_ref().is_some_and(|m| m.stages.iter().any(|s| s.fired && s.name == stage)))
        .map(|c| c.index)
        .collect()
}

fn texts(request: &Request) -> Vec<String> {
    let mut out = Vec::new();
    for message in &request.messages {
        let blocks = match &message.content {
            MessageContent::Blocks(blocks) => blocks,
            MessageContent::Text(text) => {
                out.push(text.clone());
                continue;
            }
        };
        for block in blocks {
            match block {
                ContentBlock::Text { text, .. } => out.push(text.clone()),
                ContentBlock::ToolResult { content: Some(ToolResultContent::Text(text)), .. } => out.push(text.clone()),
                _ => {}
            }
        }
    }
    out
}

fn rows_json(replay: &SessionReplay) -> String {
    serde_json::to_string(&replay.rows()).unwrap()
}

/// Time-based microcompact with a gap threshold below a recorded idle gap: at the first call
/// after such a gap the old results are cleared (the request carries the marker), the cached
/// prefix breaks there (with a 1h TTL the as-recorded replay still reads it) and the context
/// shrinks; before it nothing changes. At 600 minutes (no such gap in the session) it never
/// fires and the replay is the as-recorded one.
#[test]
fn time_based_microcompact_fires_at_a_recorded_idle_gap() {
    let session = session(SPOTTER);
    let (base, _) = check(&session, &["ttl_main=1h"]);
    let (replay, bodies) = check(&session, &["ttl_main=1h", "compact.microcompact.time_based_enabled=true", "compact.microcompact.gap_threshold_minutes=5"]);
    let at = fired(&replay, "microcompact");
    assert!(!at.is_empty(), "time-based microcompact fired nowhere");
    let first = at[0];
    // Each time after a recorded gap over the threshold: from the previous main call to this one.
    let calls = main_calls(&replay);
    for index in &at {
        let k = calls.iter().position(|c| c.index == *index).unwrap();
        assert!(calls[k].time_ms - calls[k - 1].time_ms >= 5 * 60_000, "call {index} fired after a gap under the threshold");
    }
    let (b, r) = (call(&base, first), call(&replay, first));
    assert!(r.simulated_context() < b.simulated_context(), "{} vs {}", r.simulated_context(), b.simulated_context());
    assert!(r.sim_cache_read < b.sim_cache_read, "a cache break at call {first}: read {} vs {}", r.sim_cache_read, b.sim_cache_read);
    assert!(r.events.iter().any(|e| e == "microcompact_cleared_tool_result"), "{:?}", r.events);
    assert!(texts(&bodies[&first]).iter().any(|t| t == "[Old tool result content cleared]"));
    let (div_at, why) = replay.first_divergence.clone().unwrap();
    assert_eq!(div_at, first);
    assert!(why.contains("time_based"), "{why}");
    let before = |r: &SessionReplay| r.calls.iter().filter(|c| c.index < first).map(|c| c.metrics.clone().map(|m| (m.context_tokens, m.cache_read_input_tokens))).collect::<Vec<_>>();
    assert_eq!(before(&base), before(&replay), "nothing changes before the gap");
    let (never, _) = check(&session, &["ttl_main=1h", "compact.microcompact.time_based_enabled=true", "compact.microcompact.gap_threshold_minutes=600"]);
    assert!(fired(&never, "microcompact").is_empty());
    assert_eq!(rows_json(&never), rows_json(&base), "a stage that never fires changes nothing");
    assert!(never.first_divergence.is_none());
}

/// Cached microcompact deletes old results server-side: the requests carry `cache_edits`
/// blocks, the server-side context shrinks, and the recorded prefix stays readable.
#[test]
fn cached_microcompact_sends_cache_edits_on_a_real_session() {
    let session = session(SPOTTER);
    let (base, _) = check(&session, &[]);
    let (replay, bodies) = check(&session, &["compact.microcompact.cached=cache_edits"]);
    let at = fired(&replay, "microcompact");
    assert!(!at.is_empty());
    let later = at[0] + 1;
    let body = bodies.range(later..).next().map(|(_, b)| b).unwrap();
    let json = serde_json::to_string(body).unwrap();
    assert!(json.contains("\"cache_edits\"") && json.contains("cache_reference"), "the request carries the edits");
    let sum = |r: &SessionReplay| main_calls(r).iter().filter(|c| c.index < SPOTTER_COMPACTION).map(|c| c.simulated_context()).sum::<u64>();
    assert!(sum(&replay) < sum(&base), "{} vs {}", sum(&replay), sum(&base));
    assert!(replay.first_divergence.as_ref().unwrap().1.contains("cache_edits"));
}

/// The aggregate budget per message: on, with a limit the session's results pass, it persists
/// results (the request carries the preview), and the context shrinks from there; off, the same
/// limit does nothing.
#[test]
fn aggregate_tool_result_budget_reaches_real_sessions() {
    let session = session(SPOTTER);
    let (base, _) = check(&session, &[]);
    let (replay, bodies) = check(&session, &["compact.tool_result_budget.aggregate_enabled=true", "compact.tool_result_budget.aggregate_chars=20000"]);
    let at = fired(&replay, "tool_result_budget");
    assert!(!at.is_empty());
    assert!(texts(&bodies[&at[0]]).iter().any(|t| t.starts_with("<persisted-output>")));
    let (b, r) = (call(&base, at[0]), call(&replay, at[0]));
    assert!(r.simulated_context() < b.simulated_context());
    // The replacement is re-applied, byte-identical, on every later call: the prefix stays cached.
    let next = main_calls(&replay).into_iter().find(|c| c.index > at[0]).unwrap().index;
    assert!(call(&replay, next).simulated_context() < call(&base, next).simulated_context());
    assert!(call(&replay, next).sim_cache_read > 0.0);
    let (off, _) = check(&session, &["compact.tool_result_budget.aggregate_chars=20000"]);
    assert_eq!(rows_json(&off), rows_json(&base));
}

/// Snip drops the oldest API rounds once the messages reach its trigger: from that call to the
/// recorded compaction the requests hold fewer messages and less context; at its default trigger
/// (85%) the session, compacted at 167k, never gets there and nothing changes.
#[test]
fn snip_drops_old_rounds_of_a_real_session() {
    let session = session(SPOTTER);
    let (base, base_bodies) = check(&session, &[]);
    let (replay, bodies) = check(&session, &["compact.snip.enabled=true", "compact.snip.trigger_pct=50", "compact.snip.target_pct=30"]);
    let at = fired(&replay, "snip");
    assert!(!at.is_empty());
    let first = at[0];
    assert!(first < SPOTTER_COMPACTION);
    for c in main_calls(&replay).into_iter().filter(|c| c.index >= first && c.index < SPOTTER_COMPACTION) {
        let b = call(&base, c.index);
        assert!(c.simulated_context() < b.simulated_context(), "call {}: {} vs {}", c.index, c.simulated_context(), b.simulated_context());
        assert!(bodies[&c.index].messages.len() < base_bodies[&c.index].messages.len());
    }
    assert!(replay.first_divergence.as_ref().unwrap().1.contains("snip"));
    let (default, _) = check(&session, &["compact.snip.enabled=true"]);
    assert!(fired(&default, "snip").is_empty());
    assert_eq!(rows_json(&default), rows_json(&base));
}

/// Context collapse commits the oldest rounds into a digest: the digest is in every request
/// from the commit to the recorded compaction, and the context is smaller than as recorded.
#[test]
fn context_collapse_commits_a_digest_on_a_real_session() {
    let session = session(SPOTTER);
    let (base, _) = check(&session, &[]);
    let (replay, bodies) = check(&session, &["compact.context_collapse.enabled=true", "compact.context_collapse.commit_pct=50", "compact.context_collapse.target_pct=30"]);
    let at = fired(&replay, "context_collapse");
    assert!(!at.is_empty());
    for c in main_calls(&replay).into_iter().filter(|c| c.index >= at[0] && c.index < SPOTTER_COMPACTION) {
        assert!(texts(&bodies[&c.index]).iter().any(|t| t.starts_with("[Collapsed ")), "call {}", c.index);
        assert!(c.simulated_context() < call(&base, c.index).simulated_context());
    }
    // The recorded compaction starts the conversation over: no digest after it.
    let after = main_calls(&replay).into_iter().find(|c| c.index >= SPOTTER_COMPACTION).unwrap().index;
    assert!(!texts(&bodies[&after]).iter().any(|t| t.starts_with("[Collapsed ")));
}

#[test]
fn the_stage_knobs_reach_real_sessions() {
    for key in [
        "compact.microcompact.time_based_enabled",
        "compact.microcompact.gap_threshold_minutes",
        "compact.microcompact.cached_keep_recent",
        "compact.tool_result_budget.aggregate_enabled",
        "compact.tool_result_budget.aggregate_chars",
        "compact.snip.trigger_pct",
        "compact.context_collapse.commit_pct",
    ] {
        assert!(knob_on_real_sessions(key), "{key}");
    }
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    assert_eq!(ReplayOptions::from_strategy(&strategy).stages, None, "the default replays the recorded messages");
}
