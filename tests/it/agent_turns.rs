//! The recorded client's turn rules through the agent (issue 13, "one model of the client"):
//! driven by a real session, the agent's requests are measured with what the client did around
//! each new prompt (`replay::turns::RecordedClient`, the rules the replay applies): the side
//! entry of a finished turn, the conversation start re-rendered at each prompt from 2.1.200, a
//! tool hook's context losing the side entry (2.1.200–2.1.231), the prompts 2.0.76–2.1.39
//! render the transient way; and parallel tool results marked as the client marks them. Each
//! test names recorded calls whose creation or read the agent got wrong before (it read on where
//! the client fell to the prefix, or the reverse) and checks them against the record.

use std::collections::BTreeMap;

use ctxsim::measure::{Calibration, EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::recording::format::LANE_MAIN;
use ctxsim::replay::load_session;
use ctxsim::replay::workload::agent_replay;
use ctxsim::replay::CallReplay;
use ctxsim::strategy::Strategy;

use crate::support::realdata;

/// The main calls of a shared session driven through the agent, as recorded, by call index.
fn drive(file: &str) -> BTreeMap<usize, CallReplay> {
    let path = realdata().join("transcripts").join(file);
    let session = load_session(&path).unwrap();
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let measurer = Measurer::new(ModelTable::shipped(), TokenCounter::with_calibration(EstimatorKind::Calibrated, Calibration::shipped())).without_body_hashes();
    let driven = agent_replay(&session, &path.display().to_string(), &mut { measurer }, &strategy).unwrap();
    driven.replay.calls.into_iter().filter(|c| c.lane == LANE_MAIN).map(|c| (c.index, c)).collect()
}

/// Simulated over recorded cache creation of call `index`, its events, and its simulated and
/// recorded read.
fn creation(calls: &BTreeMap<usize, CallReplay>, index: usize) -> (f64, Vec<String>, f64, u64) {
    let call = &calls[&index];
    let recorded = call.recorded.cache_creation_input_tokens as f64;
    (call.sim_cache_creation / recorded, call.events.clone(), call.sim_cache_read, call.recorded.cache_read_input_tokens)
}

/// 2.1.215 (oh-my-posh d847): a new prompt after a turn that may have changed the project
/// renders the conversation start anew; after a turn that ended normally the side request's
/// entry (rendered the same way) keeps the history (#16 reads it all, and #12, whose previous
/// turn wrote nothing, reads it without a re-render); after one without a stop summary nothing
/// does, and the prompt writes the whole conversation again (#63, #157, #211: 124k–346k
/// tokens; the agent wrote ~1k there before it applied the rule).
#[test]
fn from_2_1_200_a_new_prompt_reads_only_what_the_side_entry_kept() {
    let calls = drive("oh-my-posh/d84718082c10-3.full.jsonl");
    for (index, rerendered) in [(12, false), (16, true)] {
        let (_, events, read, recorded) = creation(&calls, index);
        assert!(events.iter().any(|e| e == "side_entry"), "#{index}: {events:?}");
        assert_eq!(events.iter().any(|e| e == "turn_rerender"), rerendered, "#{index}: {events:?}");
        assert!((read - recorded as f64).abs() / (recorded as f64) < 0.03, "#{index}: read {read} vs recorded {recorded}");
    }
    for index in [63, 157, 211] {
        assert_prefix_level(&calls, index, "turn_rerender", 0.85..1.2);
    }
}

/// 2.1.215 (oh-my-posh d847 #168): the one prompt inside the TTL with no side entry whose
/// previous turn wrote nothing of the project (it edited a file in the user's home and ran a
/// script that built and removed its own binary). The start renders as before and the prompt
/// reads the history: the record read 304,375 of 315,158 and wrote 10,781; the agent, which
/// re-rendered the start at every prompt, read the 15k prefix and wrote 305k (+294k, most of
/// d847's +23% held-out creation). The rest of the gap: the record read only through the
/// previous prompt (that turn's thinking dropped from the request), the agent through its end.
#[test]
fn from_2_1_200_the_start_is_rendered_anew_only_after_the_project_changed() {
    let calls = drive("oh-my-posh/d84718082c10-3.full.jsonl");
    let (ratio, events, read, recorded) = creation(&calls, 168);
    assert!(!events.iter().any(|e| e == "turn_rerender" || e == "side_entry"), "#168: {events:?}");
    assert!((0.5..1.5).contains(&ratio), "#168: creation {ratio:.3} of the recorded");
    assert!((read - recorded as f64).abs() / (recorded as f64) < 0.04, "#168: read {read} vs recorded {recorded}");
    // The three prompts after a turn that wrote the project's files still fall to the prefix.
    for index in [63, 157, 211] {
        assert_prefix_level(&calls, index, "turn_rerender", 0.85..1.2);
    }
}

/// Call `index` fell to the prefix level with `event` and no side entry, writing `ratio` of
/// the recorded creation.
fn assert_prefix_level(calls: &BTreeMap<usize, CallReplay>, index: usize, event: &str, ratio: std::ops::Range<f64>) {
    let (got, events, read, _) = creation(calls, index);
    assert!(events.iter().any(|e| e == event) && !events.iter().any(|e| e == "side_entry"), "#{index}: {events:?}");
    assert!(ratio.contains(&got), "#{index}: creation {got:.3} of the recorded");
    assert!(read < 40_000.0, "#{index}: read {read} (the prefix level)");
}

/// 2.1.219 (oh-my-posh 0254): after a turn in which a tool hook added context, the new prompt
/// reads no side entry and falls to the prefix level: the six such turns of the session write
/// 108k–480k tokens each, and so does the agent.
#[test]
fn a_tool_hook_context_loses_the_side_entry_through_the_agent() {
    let calls = drive("oh-my-posh/0254bffa0c17-1.full.jsonl");
    for index in [117, 241, 374, 461, 512, 576] {
        assert_prefix_level(&calls, index, "tool_hook_context", 0.9..1.25);
    }
}

/// A prompt that delivers an item the client queued before a compaction falls to the prefix
/// level after the side request (spotter #153, 2.1.39: 55,541 written; af1d #217, 2.1.49:
/// 100,078); the agent read the side entry there before (197 and 156 written). A notification
/// queued after the compaction (e89f #174) and af1d's second item queued before it (#218) read
/// everything.
#[test]
fn a_prompt_delivering_an_item_queued_before_a_compaction_falls_to_the_prefix_through_the_agent() {
    let spotter = drive("spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl");
    let (ratio, events, read, recorded) = creation(&spotter, 153);
    assert!(events.iter().any(|e| e == "queued_across_compaction") && !events.iter().any(|e| e == "side_entry"), "#153: {events:?}");
    assert!((0.9..1.15).contains(&ratio), "#153: creation {ratio:.3} of the recorded");
    assert!((read - recorded as f64).abs() < 2_000.0, "#153: read {read} vs recorded {recorded}");
    let af1d = drive("cipher-box/af1dd25ebb3e-8.full.jsonl");
    let (_, events, read, recorded) = creation(&af1d, 217);
    assert!(events.iter().any(|e| e == "queued_across_compaction") && !events.iter().any(|e| e == "side_entry"), "#217: {events:?}");
    assert!((read - recorded as f64).abs() < 2_000.0, "#217: read {read} vs recorded {recorded}");
    let (_, events, read, _) = creation(&af1d, 218);
    assert!(!events.iter().any(|e| e == "queued_across_compaction") && read > 100_000.0, "#218: {events:?} read {read}");
    // e89f #174 reads all the agent had cached (its context is ~6k short of the record's after
    // the compaction, the restore; the record wrote 268).
    let e89f = drive("cipher-box/e89fb6a2d646-0.full.jsonl");
    let (_, events, _, _) = creation(&e89f, 174);
    assert!(!events.iter().any(|e| e == "queued_across_compaction" || e == "turn_rerender"), "#174: {events:?}");
    assert!(e89f[&174].sim_cache_creation < 2_000.0, "#174: wrote {}", e89f[&174].sim_cache_creation);
}

/// 2.1.37 (entireio-cli 7be2): a typed prompt is sent the transient way during its own turn, so
/// the next prompt reads only through the side entry, which ends before it (#65, #70, #74), or,
/// after the opening prompt, only the prefix (#60: 108k written). The agent read on through
/// every one of them before it applied the rule.
#[test]
fn a_transient_prompt_is_rerendered_at_the_next_turn_through_the_agent() {
    let calls = drive("entireio-cli/7be20d70c73b-0.full.jsonl");
    for index in [60, 65, 70, 74] {
        let (ratio, events, _, _) = creation(&calls, index);
        assert!(events.iter().any(|e| e == "rerendered_prompt"), "#{index}: {events:?}");
        assert!((0.75..1.25).contains(&ratio), "#{index}: creation {ratio:.3} of the recorded");
    }
}

/// Parallel tool results that completed out of order (entireio-cli cd95): the client marks the
/// result that completed last, so the results of later tool uses that completed earlier are
/// uncached input on the next call (#1: 4.7k, #4: 1.9k, #12: 2.5k recorded); the agent marks the
/// same result and bills the same tail.
#[test]
fn parallel_results_out_of_order_leave_the_recorded_uncached_tail() {
    let calls = drive("entireio-cli/cd95adddad32-0.full.jsonl");
    for index in [1, 4, 12] {
        let call = &calls[&index];
        let recorded = call.recorded.input_tokens as f64;
        assert!((call.sim_input - recorded).abs() / recorded < 0.15, "#{index}: input {} vs recorded {recorded}", call.sim_input);
    }
}
