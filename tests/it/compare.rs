//! `compare`: every preset on the shipped scenarios and on real sessions.
use std::path::PathBuf;

use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::report::compare::{compare, compare_csv, compare_table, load_inputs};
use ctxsim::strategy::Strategy;
use ctxsim::strategy::presets::PRESETS;

fn measurer() -> Measurer {
    Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4))
}

fn all_presets() -> Vec<Strategy> {
    PRESETS.iter().map(|p| Strategy::resolve(p.id).unwrap()).collect()
}

fn sessions() -> Vec<PathBuf> {
    let root = super::support::realdata().join("transcripts");
    vec![root.join("entireio-cli"), root.join("spotter")]
}

#[test]
fn every_preset_runs_on_the_shipped_scenarios() {
    let scenarios = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let inputs = load_inputs(&[scenarios]).unwrap();
    let strategies = all_presets();
    let out = compare(&inputs, &strategies, &measurer, false).unwrap();
    assert_eq!(out.len(), inputs.len() * strategies.len());
    assert!(out.iter().all(|e| e.kind == "scenario" && e.summary.requests > 0));
    assert!(compare_table(&out).contains("claude-code-1h"));
    let csv = String::from_utf8(compare_csv(&out)).unwrap();
    assert_eq!(csv.lines().count(), out.len() + 1);
}

#[test]
fn a_strategy_that_changes_what_the_model_saw_is_flagged_on_a_recording() {
    let spotter = super::support::realdata().join("transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl");
    let inputs = load_inputs(&[spotter]).unwrap();
    let strategies: Vec<Strategy> = ["claude-code", "claude-code-1h", "observation-masking"].iter().map(|s| Strategy::resolve(s).unwrap()).collect();
    let out = compare(&inputs, &strategies, &measurer, false).unwrap();
    assert!(!out[0].replies_diverge && !out[1].replies_diverge);
    assert!(out[2].replies_diverge, "masking changes the messages");
    assert!(out[2].divergence.as_deref().unwrap().contains("replayed as recorded"));
    assert!(out[2].summary.info_loss.tokens_dropped > out[0].summary.info_loss.tokens_dropped);
    assert_ne!(out[0].summary.cost_usd, out[1].summary.cost_usd, "the TTL knob reaches the replay");
}

/// Acceptance: every preset on every real session. Slow in a debug build:
/// `cargo test --release -- --ignored compare::every_preset`.
#[test]
#[ignore]
fn every_preset_runs_on_every_real_session() {
    let inputs = load_inputs(&sessions()).unwrap();
    assert_eq!(inputs.len(), 6);
    let strategies = all_presets();
    let out = compare(&inputs, &strategies, &measurer, false).unwrap();
    assert_eq!(out.len(), 6 * strategies.len());
    assert!(out.iter().all(|e| e.kind == "recording" && e.summary.requests > 0));
}
