//! Replay and fidelity on the real sessions in ../shared/realdata/transcripts.
//!
//! The floors below are the figures the replay achieves today (chars4, the shipped
//! calibration fitted on these same sessions), rounded outwards: a regression guard, not the
//! issue's targets.

use std::path::PathBuf;

use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::recording::{import, read_recording, InputFormat};
use ctxsim::replay::{ReplayOptions, fidelity_for_session, find_breaks, load_session, replay_session, FidelityReport};

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
        assert!(r.requests_compared >= 10, "{name}: {r:?}");
        assert!(r.context_tokens_mape <= 0.16, "{name}: context MAPE {}", r.context_tokens_mape);
        assert!(r.hit_agreement >= 0.965, "{name}: hit agreement {}", r.hit_agreement);
        assert!(r.cache_read_total_error.abs() <= 0.08, "{name}: cache read {}", r.cache_read_total_error);
        assert!(r.cache_creation_total_error.abs() <= 0.35, "{name}: cache creation {}", r.cache_creation_total_error);
        assert!(r.cost_error.abs() <= 0.18, "{name}: cost {}", r.cost_error);
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
