//! Replay and fidelity on the real sessions in ../shared/realdata/transcripts.
//!
//! The floors below are the figures the replay achieves today (the calibrated estimator with the
//! shipped calibration, fitted on these same sessions), rounded outwards: a regression guard,
//! not the targets (README and docs/fidelity.md report the leave-one-out figures).

use std::path::PathBuf;

use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::recording::{import, read_recording, InputFormat};
use ctxsim::replay::{
    CallReplay, FidelityReport, ReplayOptions, SessionReplay, fidelity_for_session, find_breaks, load_session, replay_session,
};

use crate::support::realdata;

fn transcripts() -> Vec<PathBuf> {
    let root = realdata().join("transcripts");
    let mut files: Vec<PathBuf> = walkdir_jsonl(&root.join("entireio-cli"));
    files.extend(walkdir_jsonl(&root.join("spotter")));
    files
}

fn walkdir_jsonl(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    files
}

fn fidelity(path: &std::path::Path, kind: EstimatorKind) -> FidelityReport {
    let session = load_session(path).unwrap();
    let table = ModelTable::shipped();
    let mut measurer = Measurer::new(table.clone(), TokenCounter::new(kind));
    let replay = replay_session(&session, &mut measurer, &ReplayOptions::default());
    fidelity_for_session(&replay, &table, false)
}

#[test]
fn fidelity_holds_its_floors_on_every_real_session() {
    let files = transcripts();
    assert_eq!(files.len(), 6);
    for path in &files {
        let r = fidelity(path, EstimatorKind::Calibrated);
        let name = path.display();
        // spotter #153 is the one counter-case of the bypassPermissions rule (a prompt re-rendered
        // in that mode; docs/fidelity.md "Break rules"): one call, 55k tokens of creation; its
        // segment after the compaction is sized by its first call (−2.4%: a Read one call later
        // grows 2k more than its text).
        let (hit, creation, cost) = if name.to_string().contains("spotter") { (0.99, 0.16, 0.065) } else { (0.995, 0.04, 0.03) };
        assert!(r.requests_compared >= 10, "{name}: {r:?}");
        assert!(r.context_tokens_mape <= 0.035, "{name}: context MAPE {}", r.context_tokens_mape);
        assert!(r.context_tokens_ape_p90 <= 0.075, "{name}: context p90 {}", r.context_tokens_ape_p90);
        assert!(r.hit_agreement >= hit, "{name}: hit agreement {}", r.hit_agreement);
        assert!(r.cache_read_total_error.abs() <= 0.025, "{name}: cache read {}", r.cache_read_total_error);
        assert!(r.cache_creation_total_error.abs() <= creation, "{name}: cache creation {}", r.cache_creation_total_error);
        assert!(r.cost_error.abs() <= cost, "{name}: cost {}", r.cost_error);
        assert_eq!(r.estimator, "calibrated");
    }
}

#[test]
fn breaks_are_listed_with_causes_on_a_session_with_a_microcompact() {
    let path = realdata().join("transcripts/entireio-cli/7662d755ef9f-2.full.jsonl");
    let session = load_session(&path).unwrap();
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
    let replay = replay_session(&session, &mut measurer, &ReplayOptions::default());
    let breaks = find_breaks(&replay);
    let causes: Vec<&str> = breaks.iter().map(|b| b.cause.as_str()).collect();
    assert!(causes.contains(&"microcompact"), "{causes:?}");
    assert!(causes.contains(&"ttl_expired"), "{causes:?}");
    let microcompact = breaks.iter().find(|b| b.cause == "microcompact").unwrap();
    assert_eq!(microcompact.predicted, 1.0, "{microcompact:?}");
    assert!(breaks.iter().all(|b| b.drop >= 1_000));
}

#[test]
fn import_then_replay_reads_the_recording_back() {
    let path = realdata().join("transcripts/entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("session.jsonl");
    let report = import(&path, Some(InputFormat::ClaudeCode), &out).unwrap();
    assert!(report.calls > 10);
    let recording = read_recording(&out).unwrap().recording;
    assert!(!recording.events.is_empty());
    let session = load_session(&out).unwrap();
    assert_eq!(session.calls.len(), report.calls);
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
    let replay = replay_session(&session, &mut measurer, &ReplayOptions::default());
    assert!(replay.rows().len() >= 10);
    // Replaying twice gives the same bodies: the replay is deterministic.
    let mut again = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
    let second = replay_session(&session, &mut again, &ReplayOptions::default());
    let a: Vec<String> = replay.rows().iter().map(|r| r.body_sha256.clone()).collect();
    let b: Vec<String> = second.rows().iter().map(|r| r.body_sha256.clone()).collect();
    assert_eq!(a, b);
}

#[test]
fn plot_writes_deterministic_svg_and_png_per_session() {
    let path = realdata().join("transcripts/entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    let dir = tempfile::tempdir().unwrap();
    let mut outputs = Vec::new();
    for run in ["a", "b"] {
        let out_dir = dir.path().join(run);
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim"))
            .args(["fidelity", "--format", "json", "--plot"])
            .arg(&out_dir)
            .arg(&path)
            .output()
            .unwrap();
        assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
        // Without --calls the JSON keeps no per-call rows, plot or not.
        let report: FidelityReport = serde_json::from_slice(&status.stdout).unwrap();
        assert!(report.calls.is_empty());
        let svg = std::fs::read(out_dir.join("a6e4c2a0fbd1-0.svg")).unwrap();
        let png = std::fs::read(out_dir.join("a6e4c2a0fbd1-0.png")).unwrap();
        assert!(String::from_utf8_lossy(&svg).contains("recorded"));
        assert!(String::from_utf8_lossy(&svg).contains("simulated"));
        assert_eq!(&png[1..4], b"PNG");
        outputs.push((svg, png));
    }
    assert!(outputs[0] == outputs[1], "plots differ between runs");
}

#[test]
fn fidelity_chart_has_one_recorded_and_one_simulated_point_per_call() {
    let path = realdata().join("transcripts/entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    let session = load_session(&path).unwrap();
    let table = ModelTable::shipped();
    let mut measurer = Measurer::new(table.clone(), TokenCounter::new(EstimatorKind::Chars4));
    let replay = replay_session(&session, &mut measurer, &ReplayOptions::default());
    let report = fidelity_for_session(&replay, &table, true);
    let chart = ctxsim::replay::fidelity_chart(&report);
    assert_eq!(chart.series.len(), 2);
    for (series, recorded) in chart.series.iter().zip([true, false]) {
        assert_eq!(series.points.len(), report.requests_compared);
        for (point, call) in series.points.iter().zip(&report.calls) {
            let y = if recorded { call.recorded_context } else { call.simulated_context };
            assert_eq!(*point, (call.index as f64, y as f64));
        }
    }
}

#[test]
fn files_read_before_a_compaction_are_restored_after_it() {
    // cd95 reads 13 files before its first compaction; the first call after it re-attaches
    // them (the replay used to skip each call's own reply, so no Read was ever seen).
    let path = realdata().join("transcripts/entireio-cli/cd95adddad32-0.full.jsonl");
    let session = load_session(&path).unwrap();
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
    let replay = replay_session(&session, &mut measurer, &ReplayOptions::default());
    let after = replay.calls.iter().find(|c| c.events.iter().any(|e| e == "compaction")).unwrap();
    let before = replay.calls.iter().rfind(|c| c.index < after.index && c.compared()).unwrap();
    let dropped = before.simulated_context() - after.simulated_context();
    // Recorded: 154,445 before, 66,549 after; without restored files the replay (calibrated)
    // showed 40k after.
    assert!(after.simulated_context() > 50_000, "{} after the compaction", after.simulated_context());
    assert!(dropped > 60_000, "{dropped}");
}

/// A real transcript (path under ../shared/realdata/transcripts) replayed with the shipped
/// calibration.
fn replayed(transcript: &str) -> SessionReplay {
    let session = load_session(&realdata().join("transcripts").join(transcript)).unwrap();
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Calibrated));
    replay_session(&session, &mut measurer, &ReplayOptions::default())
}

/// Checks call `index` of a replay: compared, its simulated context within `max_ape` of the
/// record, and every one of `events` seen before it.
fn check_call<'a>(replay: &'a SessionReplay, index: usize, max_ape: f64, events: &[&str]) -> &'a CallReplay {
    let call = replay.calls.iter().find(|c| c.index == index).unwrap_or_else(|| panic!("no call #{index}"));
    assert!(call.compared(), "#{index} skipped: {:?}", call.skipped);
    let recorded = call.recorded_context() as f64;
    let ape = (call.simulated_context() as f64 - recorded).abs() / recorded;
    assert!(ape <= max_ape, "#{index}: simulated {} recorded {recorded} ({:.1}%)", call.simulated_context(), ape * 100.0);
    for event in events {
        assert!(call.events.iter().any(|e| e == event), "#{index}: no {event} in {:?}", call.events);
    }
    call
}

const CD95: &str = "entireio-cli/cd95adddad32-0.full.jsonl";
const S7662: &str = "entireio-cli/7662d755ef9f-2.full.jsonl";
const A6E4: &str = "entireio-cli/a6e4c2a0fbd1-0.full.jsonl";
const SPOTTER: &str = "spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl";

#[test]
fn parallel_tool_results_are_all_sent_and_the_late_ones_are_an_uncached_tail() {
    // cd95 #1 follows two parallel Task calls whose results were recorded out of order: the
    // first-recorded one hangs off the parentUuid chain (it used to be dropped: -9%), and the
    // client's breakpoint sits on the one that completed last, so the other (4,718 tokens
    // recorded as input) is not cached.
    let replay = replayed(CD95);
    let call = check_call(&replay, 1, 0.02, &[]);
    let input = call.metrics.as_ref().unwrap().input_tokens;
    assert_eq!(call.recorded.input_tokens, 4_718);
    assert!((3_500..6_000).contains(&input), "uncached tail {input}");
}

#[test]
fn a_resumed_client_loses_the_parallel_results_off_the_chain() {
    // After `/exit`, cd95's next process loaded its history by the one-chain walk and lost
    // ~14k tokens of parallel results (anthropics/claude-code#31330); the replay loses them too.
    let replay = replayed(CD95);
    check_call(&replay, 17, 0.03, &[]);
    check_call(&replay, 19, 0.04, &["resume"]);
}

#[test]
fn compactions_restore_the_working_set_and_the_prefix_level_is_read_off_the_record() {
    let replay = replayed(CD95);
    // The first compaction shows the prefix level (34,260 tokens); later ones read it, to the
    // calibrated count's step (each o200k token of the filler counts `scale` ≈ 1.12 tokens,
    // so a level can land one token off).
    check_call(&replay, 51, 0.05, &["compaction", "prefix_level"]);
    for index in [128, 221] {
        let call = check_call(&replay, index, 0.25, &["compaction"]);
        assert!((call.sim_cache_read - 34_260.0).abs() <= 1.0, "#{index}: {}", call.sim_cache_read);
    }
    check_call(&replayed("entireio-cli/7be20d70c73b-0.full.jsonl"), 82, 0.05, &["compaction"]);
}

#[test]
fn a_microcompact_of_older_history_shows_the_prefix_level() {
    // 7662 starts mid-session; its microcompact clears results older than the transcript and
    // the read falls to the prefix (19,330), which the compaction later reads again.
    let replay = replayed(S7662);
    assert!(replay.head_truncated);
    check_call(&replay, 6, 0.005, &["microcompact"]);
    let after = check_call(&replay, 30, 0.005, &["compaction"]);
    assert_eq!(after.sim_cache_read, 19_330.0);
    let main = replay.unrecorded_main.unwrap();
    assert_eq!((main.prefix_tokens, main.prefix_from_record), (19_330, true));
}

#[test]
fn a_warm_start_reads_the_prefix_an_earlier_session_cached() {
    // To the token, up to the calibrated count's step (see above).
    let replay = replayed(SPOTTER);
    let first = check_call(&replay, 0, 1e-4, &[]);
    assert!((first.sim_cache_read - first.recorded.cache_read_input_tokens as f64).abs() <= 1.0, "{}", first.sim_cache_read);
    assert!(first.sim_cache_read > 10_000.0);
}

#[test]
fn sonnet_4_5_drops_earlier_thinking_at_a_new_turn() {
    // 7662 (Sonnet 4.5) #12 opens a turn after one with thinking: the record shrinks by that
    // thinking (-268 tokens with the new prompt and reply added) and still reads its cache.
    let replay = replayed(S7662);
    let before = check_call(&replay, 11, 0.05, &[]).simulated_context() as i64;
    let call = check_call(&replay, 12, 0.05, &["new_user_turn"]);
    assert!((call.simulated_context() as i64) < before, "{} after {before}", call.simulated_context());
    let read = call.metrics.as_ref().unwrap().cache_read_input_tokens as f64;
    assert!(read > 0.95 * before as f64, "read {read} after {before}");
}

#[test]
fn the_compaction_request_forks_the_main_thread() {
    // spotter's compaction call (lane `compact`) read the main thread's 166,758 cached tokens;
    // its own transcript holds only the summary instruction and hook context.
    let replay = replayed(SPOTTER);
    let fork = replay.calls.iter().find(|c| c.lane == "compact").unwrap();
    check_call(&replay, fork.index, 0.03, &[]);
    assert!(fork.sim_cache_read > 150_000.0, "{}", fork.sim_cache_read);
}

#[test]
fn a_cache_entry_lives_five_minutes_from_its_first_token() {
    // 9878 #37 and cd95 #93 come 300.5 s and 302.3 s after the previous response's first
    // block, yet read: their requests went out 291 s and 298 s after it.
    for (transcript, index) in [("entireio-cli/9878b713483d-0.full.jsonl", 37), (CD95, 93)] {
        let replay = replayed(transcript);
        let call = check_call(&replay, index, 0.05, &[]);
        assert!(call.recorded.cache_read_input_tokens > 0);
        assert!(call.sim_cache_read > 0.0, "{transcript} #{index}");
        assert!(!call.events.iter().any(|e| e == "ttl_expired"), "{transcript} #{index}");
    }
}

#[test]
fn the_user_context_prior_is_fitted_where_the_record_shows_it() {
    // cd95 opens with 42k unrecorded tokens; its compaction reads the 34,260-token prefix.
    let sample = ctxsim::replay::user_context_sample(&replayed(CD95)).unwrap();
    assert!((7_500..8_700).contains(&sample), "{sample}");
    // A segment that starts mid-session carries older history: no sample.
    assert_eq!(ctxsim::replay::user_context_sample(&replayed(S7662)), None);
    let prefixes = [("2.0.76".to_owned(), 33_865), ("2.0.76".to_owned(), 34_858), ("2.1.7".to_owned(), 34_260)];
    let fitted = ctxsim::replay::fit_parameters(&Default::default(), &[9_000, 5_000, 7_000], &prefixes, "test");
    assert_eq!(fitted.user_context_tokens, Some(7_000));
    assert_eq!(fitted.prefix_tokens.get("2.0.76"), Some(&34_361));
    assert_eq!(fitted.prefix_tokens.get("2.1.7"), Some(&34_260));
}

#[test]
fn the_prefix_level_is_sampled_per_version_where_the_record_shows_it() {
    // 9878 and a6e4 are both 2.0.76: their compactions read 33,865 and 34,858 (a6e4 starts
    // mid-session, but the level it reads does not depend on that).
    let sample = |t: &str| ctxsim::replay::prefix_sample(&replayed(t));
    assert_eq!(sample("entireio-cli/9878b713483d-0.full.jsonl"), Some(("2.0.76".to_owned(), 33_865)));
    assert_eq!(sample(A6E4), Some(("2.0.76".to_owned(), 34_858)));
    assert_eq!(sample(S7662), Some(("2.1.14".to_owned(), 19_330)));
}

#[test]
fn a_head_truncated_segment_takes_its_user_context_from_its_first_call() {
    // 7662 starts mid-session. Its microcompact of older history and its compaction each start
    // a segment whose first call reads the 19,330-token prefix; what it sent beyond that and its
    // messages is the segment's user context (with older history before the compaction).
    let replay = replayed(S7662);
    check_call(&replay, 6, 0.005, &["microcompact", "segment_anchor"]);
    let after_micro = check_call(&replay, 7, 0.01, &[]);
    assert!((100_000..101_500).contains(&after_micro.user_context_tokens), "{}", after_micro.user_context_tokens);
    let compaction = check_call(&replay, 30, 0.005, &["compaction", "segment_anchor"]);
    assert!((3_000..4_000).contains(&compaction.user_context_tokens), "{}", compaction.user_context_tokens);
    // Later calls of the segment keep that size (was the 7.0k prior: +9-11%).
    for index in [36, 42, 48] {
        let call = check_call(&replay, index, 0.03, &[]);
        assert_eq!(call.user_context_tokens, compaction.user_context_tokens, "#{index}");
    }
    // a6e4 (2.0.76) starts cold; its compaction reads 34,858 and carries ~12k of user context.
    let replay = replayed(A6E4);
    check_call(&replay, 7, 0.005, &["compaction", "segment_anchor", "prefix_level"]);
    for index in 8..=12 {
        let call = check_call(&replay, index, 0.015, &[]);
        assert_eq!(call.prefix_tokens, 34_858, "#{index}");
        assert!((11_500..12_500).contains(&call.user_context_tokens), "#{index}: {}", call.user_context_tokens);
    }
}

#[test]
fn a_compaction_starts_a_segment_sized_by_its_first_call_in_whole_sessions_too() {
    // cipher-box c644 (2.1.49) opens with `/gsd:discuss-phase`, whose `@`-files the client
    // attached unrecorded (the first call carries ~48k beyond the prefix and its messages); its
    // `/compact` at #45 drops them. af1d's two automatic compactions add ~13k the transcript
    // does not hold. The first main call after each compaction sizes the new segment.
    let c644 = "cipher-box/c644f3afc869-1.full.jsonl";
    let replay = replayed(c644);
    assert!(!replay.head_truncated);
    check_call(&replay, 45, 0.005, &["compaction", "segment_anchor", "prefix_level"]);
    let segment = check_call(&replay, 46, 0.03, &[]).user_context_tokens;
    assert!((15_000..19_000).contains(&segment), "{segment}");
    // (Later calls drift high with growth the scale over-counts: #81 +16%, not a size matter.)
    for index in [50, 60] {
        let call = check_call(&replay, index, 0.08, &[]);
        assert_eq!(call.user_context_tokens, segment, "#{index}");
    }
    let af1d = replayed("cipher-box/af1dd25ebb3e-8.full.jsonl");
    for (index, ape) in [(115, 0.005), (116, 0.03), (150, 0.07), (161, 0.005), (170, 0.07)] {
        check_call(&af1d, index, ape, &[]);
    }
    // Without the anchor the whole-session rule keeps the first call's user context: +26-35%.
    let session = load_session(&realdata().join("transcripts").join(c644)).unwrap();
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Calibrated));
    let without = replay_session(&session, &mut measurer, &ReplayOptions { compaction_anchor: false, ..ReplayOptions::default() });
    let call = without.calls.iter().find(|c| c.index == 60).unwrap();
    assert!(call.simulated_context() as f64 > 1.2 * call.recorded_context() as f64, "{}", call.simulated_context());
}

/// Checks that call `index` of a replay reads within `max_err` of its recorded read, with
/// every one of `events` seen before it.
fn check_read(replay: &SessionReplay, index: usize, max_err: f64, events: &[&str]) -> f64 {
    let call = check_call(replay, index, 0.05, events);
    let recorded = call.recorded.cache_read_input_tokens as f64;
    let err = (call.sim_cache_read - recorded).abs() / recorded.max(1.0);
    assert!(err <= max_err, "#{index}: simulated read {} recorded {recorded}", call.sim_cache_read);
    call.sim_cache_read
}

#[test]
fn a_finished_turn_leaves_a_side_entry_through_its_last_reply() {
    // cd95 (2.1.7) #21-#25 read the previous call's cache plus the last reply; #138 read 334 s
    // after the previous request because the side request refreshed the entry at the turn's end.
    let replay = replayed(CD95);
    for index in [21, 22, 23, 24, 25, 138] {
        check_read(&replay, index, 0.05, &["new_user_turn", "side_entry"]);
    }
    let refreshed = replay.calls.iter().find(|c| c.index == 138).unwrap();
    assert!(!refreshed.events.iter().any(|e| e == "ttl_expired"), "{:?}", refreshed.events);
    // No side entry after a turn whose only call read nothing (#19, #143: exactly what the
    // previous call cached was read).
    for index in [20, 144] {
        let call = check_call(&replay, index, 0.05, &["new_user_turn"]);
        assert!(!call.events.iter().any(|e| e == "side_entry"), "#{index}: {:?}", call.events);
    }
    // Without the side entry the TTL of #138 runs out.
    let session = load_session(&realdata().join("transcripts").join(CD95)).unwrap();
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Calibrated));
    let without = replay_session(&session, &mut measurer, &ReplayOptions { side_entries: false, ..ReplayOptions::default() });
    assert_eq!(without.calls.iter().find(|c| c.index == 138).unwrap().sim_cache_read, 0.0);
}

#[test]
fn re_rendered_prompts_land_where_the_record_does() {
    // 7be2 (2.1.37) re-renders every prompt at the next turn: #60 falls to the prefix level (the
    // first prompt is far back), #65, #70 and #74 land on the side entry before the previous
    // prompt (within the 20-position lookback).
    let replay = replayed("entireio-cli/7be20d70c73b-0.full.jsonl");
    // (the 2.1.37 level 16,589, within the filler's rounding)
    assert!((check_read(&replay, 60, 0.01, &["rerendered_prompt"]) - 16_589.0).abs() <= 1.0);
    // (within 1.8%: #74 reads 143.9k for 146.5k with the calibration fitted on 12 sessions)
    for index in [65, 70, 74] {
        check_read(&replay, index, 0.02, &["rerendered_prompt", "side_entry"]);
    }
    let breaks = find_breaks(&replay);
    assert_eq!(breaks.len(), 5, "{breaks:?}");
    assert!(breaks.iter().all(|b| b.predicted == 1.0), "{breaks:?}");
    // 2.1.7 keeps typed prompts: no cd95 turn re-renders one (only its session's opening prompt).
    let cd95 = replayed(CD95);
    let rerendered: Vec<usize> = cd95.calls.iter().filter(|c| c.events.iter().any(|e| e == "rerendered_prompt")).map(|c| c.index).collect();
    assert_eq!(rerendered, vec![2]);
    // spotter (2.1.39): the first prompt and the compaction summary are re-rendered, the task
    // notification that opened a turn is not. #153 (bypassPermissions) was the one break of its
    // kind not predicted; its notification was queued before the compaction, and delivering it
    // re-renders the start (branch fidspot): every break is predicted.
    let spotter = find_breaks(&replayed(SPOTTER));
    assert!(spotter.iter().all(|b| b.predicted == 1.0), "{spotter:?}");
    let queued: Vec<(usize, &str)> = spotter.iter().filter(|b| b.index == 153).map(|b| (b.index, b.cause.as_str())).collect();
    assert_eq!(queued, vec![(153, "turn_rerender")], "{spotter:?}");
}

/// Replays `paths` one after the other through one measurer, the fast way (lanes keep their
/// built messages, keyed for the flattener) and the reference way (every call rebuilt and
/// compared by content), and checks that every call replays the same: rows (with body hashes
/// and block hashes), events, sizes, information loss.
fn check_keyed_equals_reference(paths: &[PathBuf], kind: EstimatorKind, options: &ReplayOptions) -> usize {
    let run = |reference: bool| {
        let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(kind));
        let mut out = Vec::new();
        for path in paths {
            let session = load_session(path).unwrap();
            let replay = if reference {
                ctxsim::replay::replay_session_reference(&session, &mut measurer, options)
            } else {
                replay_session(&session, &mut measurer, options)
            };
            out.push(serde_json::to_value(&replay).unwrap());
        }
        out
    };
    let (fast, reference) = (run(false), run(true));
    let mut calls = 0;
    for ((path, fast), reference) in paths.iter().zip(&fast).zip(&reference) {
        let (a, b) = (fast["calls"].as_array().unwrap(), reference["calls"].as_array().unwrap());
        assert_eq!(a.len(), b.len(), "{}", path.display());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x, y, "{}: call {} differs from the reference replay", path.display(), y["index"]);
        }
        assert_eq!(fast, reference, "{}", path.display());
        assert!(a.iter().any(|c| c["metrics"]["body_sha256"].as_str().is_some_and(|h| h.len() == 64)), "{}: no body hashes", path.display());
        calls += a.len();
    }
    calls
}

/// The keys the replay hands the flattener never call two different messages equal: on every
/// real session (compactions, microcompacts, resumes, parallel results, subagents, side entries,
/// re-rendered prompts) the keyed replay equals the reference, and so do two sessions replayed
/// through one measurer (key spaces) and under the ablation knobs.
#[test]
fn fidelity_keyed_replay_equals_the_reference_replay() {
    let files = transcripts();
    let calls = check_keyed_equals_reference(&files, EstimatorKind::Chars4, &ReplayOptions::default());
    assert!(calls > 600, "{calls} calls");
    let spotter: Vec<PathBuf> = files.iter().filter(|p| p.display().to_string().contains("spotter")).cloned().collect();
    check_keyed_equals_reference(&spotter, EstimatorKind::Bpe, &ReplayOptions::default());
    let knobs = ReplayOptions { rerender_prompts: false, side_entries: false, restore_files: false, ..ReplayOptions::default() };
    check_keyed_equals_reference(&files[..2], EstimatorKind::Chars4, &knobs);
    check_keyed_equals_reference(&files[..2], EstimatorKind::Chars4, &ReplayOptions { recorded_microcompact: false, ..ReplayOptions::default() });
}

/// The real session with a microcompact, changed so that its microcompacts clear results the
/// transcript shows (the recorded one cleared only older history): the recorded one also clears
/// the first results before it, and two more are added later, each clearing more of them.
fn with_visible_microcompacts(dir: &std::path::Path) -> PathBuf {
    let text = std::fs::read_to_string(realdata().join("transcripts/entireio-cli/7662d755ef9f-2.full.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let boundary = lines.iter().find(|l| l["subtype"] == "microcompact_boundary").unwrap().clone();
    let mut seen: Vec<String> = Vec::new();
    let mut out = Vec::new();
    let mut added = 0;
    for (n, line) in lines.iter().enumerate() {
        let mut line = line.clone();
        if line["subtype"] == "microcompact_boundary" {
            let ids = line["microcompactMetadata"]["compactedToolIds"].as_array_mut().unwrap();
            ids.extend(seen.iter().take(3).map(|id| serde_json::json!(id)));
        }
        let text = line.to_string();
        for (at, _) in text.match_indices("\"tool_use_id\":\"") {
            let id: String = text[at + 15..].chars().take_while(|c| *c != '"').collect();
            if !seen.contains(&id) {
                seen.push(id);
            }
        }
        out.push(text);
        if n > 60 && n % 70 == 0 && seen.len() > 6 {
            added += 1;
            let mut extra = boundary.clone();
            extra["uuid"] = serde_json::json!(format!("00000000-0000-4000-8000-00000000000{added}"));
            extra["parentUuid"] = line["uuid"].clone();
            extra["timestamp"] = line["timestamp"].clone();
            extra["microcompactMetadata"]["compactedToolIds"] = serde_json::json!(seen[..seen.len() / 2]);
            out.push(extra.to_string());
        }
    }
    assert!(added >= 2, "{added} microcompacts added");
    let path = dir.join("visible-microcompacts.jsonl");
    std::fs::write(&path, out.join("\n") + "\n").unwrap();
    path
}

/// Microcompacts that clear results the replay sends (the cleared set changes under the kept
/// messages): the keyed replay still equals the reference, and the clearing shows.
#[test]
fn fidelity_keyed_replay_equals_the_reference_over_visible_microcompacts() {
    let dir = tempfile::tempdir().unwrap();
    let path = with_visible_microcompacts(dir.path());
    check_keyed_equals_reference(std::slice::from_ref(&path), EstimatorKind::Chars4, &ReplayOptions::default());
    let session = load_session(&path).unwrap();
    let context = |options: &ReplayOptions| {
        let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
        let replay = replay_session(&session, &mut measurer, options);
        assert!(replay.calls.iter().filter(|c| c.events.iter().any(|e| e == "microcompact")).count() >= 3);
        replay.calls.iter().map(|c| c.message_tokens).sum::<u64>()
    };
    let kept = ReplayOptions { recorded_microcompact: false, ..ReplayOptions::default() };
    assert!(context(&ReplayOptions::default()) < context(&kept), "the microcompacts cleared nothing the replay sends");
}

/// Issue 13: under the recorded version's defaults, the agent's autocompact threshold rule
/// (`Thresholds::compute` with the version's output reserve) fires at the recorded automatic
/// compactions: same main-lane call (±1) and preTokens within 3%. The one it misses today
/// (cipher-box af1dd #161) counts 1.7k tokens short of its recorded preTokens; nothing in the
/// transcript between its last call and the boundary accounts for them. The table is
/// snapshotted as it reads in `ctxsim fidelity`.
#[test]
fn fidelity_predicts_the_recorded_automatic_compactions() {
    use ctxsim::replay::{compaction_triggers, triggers_table};
    let table = ModelTable::shipped();
    let mut reports = Vec::new();
    for path in crate::support::real_transcripts() {
        let session = load_session(&path).unwrap();
        let mut measurer = Measurer::new(table.clone(), TokenCounter::new(EstimatorKind::Calibrated)).without_body_hashes();
        let replay = replay_session(&session, &mut measurer, &ReplayOptions::default());
        let report = compaction_triggers(&session, &replay, &table, &Default::default());
        let name = path.strip_prefix(realdata().join("transcripts")).unwrap().display().to_string();
        reports.push((name, report));
    }
    assert_eq!(reports.len(), 16);
    let (total, matched) = reports.iter().map(|(_, r)| r.auto_matched()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    assert_eq!(total, 11, "recorded automatic compactions with their history in the file");
    assert!(matched >= 10, "{matched} of {total} predicted");
    // No compaction is predicted where none was recorded.
    let extra: Vec<_> = reports.iter().flat_map(|(n, r)| r.rows.iter().filter(|row| row.verdict == "extra").map(move |row| (n.clone(), row.simulated_call))).collect();
    assert!(extra.is_empty(), "{extra:?}");
    insta::assert_snapshot!(triggers_table(&reports));
}

#[test]
fn a_2_1_200_reply_with_thinking_is_sent_back_as_its_billed_output() {
    // 2.1.205-2.1.232 records the final output_tokens; a step grows by the previous reply's
    // output_tokens and ~1.75 tokens per 4 characters of results (within 300 tokens on every
    // step of the oh-my-posh sessions), whether the thinking text was stored (a summary, about
    // half the size: d847) or not (eea3). eea3 #14 has two thinking blocks sharing its 8,040
    // output tokens; d847 #13 stored a summary of its 7,487.
    let growth = |replay: &SessionReplay, index: usize| {
        let at = |i: usize| replay.calls.iter().find(|c| c.index == i).unwrap();
        let (now, before) = (at(index), at(index - 1));
        (now.recorded_context() as f64 - before.recorded_context() as f64, now.simulated_context() as f64 - before.simulated_context() as f64)
    };
    for (transcript, index) in [("oh-my-posh/eea3a34195eb-0.full.jsonl", 15), ("oh-my-posh/d84718082c10-3.full.jsonl", 14)] {
        let replay = replayed(transcript);
        let (recorded, simulated) = growth(&replay, index);
        assert!(recorded > 7_000.0, "{transcript} #{index}: {recorded}");
        assert!((simulated - recorded).abs() <= 0.1 * recorded, "{transcript} #{index}: simulated growth {simulated}, recorded {recorded}");
    }
}

#[test]
fn an_image_in_a_prompt_counts_its_pixels_not_a_flat_2000() {
    // d847 #120's prompt carries a 90 x 52 crop (7 tokens by the API's rule): the context grew
    // by 648 tokens; at a flat 2,000 the replay grew by 3.8k more than the record.
    let replay = replayed("oh-my-posh/d84718082c10-3.full.jsonl");
    let at = |i: usize| replay.calls.iter().find(|c| c.index == i).unwrap();
    let recorded = at(120).recorded_context() as f64 - at(119).recorded_context() as f64;
    let simulated = at(120).simulated_context() as f64 - at(119).simulated_context() as f64;
    assert!((simulated - recorded).abs() < 1_000.0, "simulated growth {simulated}, recorded {recorded}");
}

/// The side request after a turn borrows the first messages of the call's request and gives
/// them back as they were (its reminder, system prompt and breakpoint undone): every request
/// of every real session is the same, byte for byte, with side entries on or off, and many
/// calls send one.
#[test]
fn fidelity_side_requests_leave_the_call_requests_unchanged() {
    let bodies = |options: &ReplayOptions, session: &ctxsim::recording::ImportedSession| {
        let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
        let mut out: Vec<(usize, String)> = Vec::new();
        let replay = ctxsim::replay::session::replay_session_observed(session, &mut measurer, options, &mut |index, request| out.push((index, serde_json::to_string(request).unwrap())));
        (out, replay.calls.iter().filter(|c| c.events.iter().any(|e| e == "side_entry")).count())
    };
    let off = ReplayOptions { side_entries: false, ..ReplayOptions::default() };
    let mut sides = 0;
    for path in transcripts() {
        let session = load_session(&path).unwrap();
        let (with, n) = bodies(&ReplayOptions::default(), &session);
        let (without, _) = bodies(&off, &session);
        assert_eq!(with.len(), without.len(), "{}", path.display());
        for (a, b) in with.iter().zip(&without) {
            assert!(a == b, "{}: call {} is sent differently after a side request", path.display(), a.0);
        }
        sides += n;
    }
    assert!(sides >= 40, "{sides} side requests");
}
