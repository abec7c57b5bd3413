//! `compare`: every preset on the shipped scenarios and on real sessions.
use std::path::PathBuf;

use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::report::compare::{compare, compare_csv, compare_table, load_inputs, write_compare_report};
use ctxsim::strategy::Strategy;
use ctxsim::strategy::presets::PRESETS;

fn measurer() -> Measurer {
    Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4))
}

fn all_presets() -> Vec<Strategy> {
    PRESETS.iter().map(|p| Strategy::resolve(p.id).unwrap()).collect()
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
    assert!(out[2].summary.info_loss.tokens_dropped > out[0].summary.info_loss.tokens_dropped);
}

/// The compare report: the table, then per input one chart of each kind with every strategy
/// on it (not a section per input and strategy), PNGs beside it; written the same twice.
#[test]
fn the_compare_report_puts_the_strategies_side_by_side() {
    let scenarios = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let inputs = load_inputs(&[scenarios.join("context-editing.yaml"), scenarios.join("autocompact-200k.yaml")]).unwrap();
    let strategies: Vec<Strategy> = ["claude-code", "claude-code-1h", "context-editing"].iter().map(|s| Strategy::resolve(s).unwrap()).collect();
    let out = compare(&inputs, &strategies, &measurer, true).unwrap();
    let write = || {
        let dir = tempfile::tempdir().unwrap();
        let written = write_compare_report(dir.path(), &out).unwrap();
        let names: Vec<String> = written.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        (names, std::fs::read_to_string(dir.path().join("index.html")).unwrap())
    };
    let (names, html) = write();
    assert_eq!(names, ["context-editing-context.png", "context-editing-cost.png", "autocompact-200k-context.png", "autocompact-200k-cost.png", "index.html"]);
    assert_eq!(html.matches("<svg").count(), 4);
    assert_eq!(html.matches("<tr><td>").count(), 6, "one table row per input and strategy");
    for strategy in ["claude-code", "claude-code-1h", "context-editing"] {
        assert!(html.matches(&format!(">{strategy}<")).count() >= 2, "{strategy} in the table and in a legend");
    }
    assert_eq!(write().1, html);
}

/// Strategies that give exactly the same results on an input are named as such (table note,
/// CSV column, JSON field) instead of being ranked as if they differed.
#[test]
fn strategies_with_the_same_results_are_named() {
    let multi = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/multi-turn.yaml");
    let spotter = super::support::realdata().join("transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl");
    let inputs = load_inputs(&[multi, spotter]).unwrap();
    let mut buffer = Strategy::resolve("claude-code").unwrap();
    buffer.set("compact.autocompact.buffer_tokens", "40000").unwrap();
    buffer.name = "buffer-40k".into();
    let mut budget = Strategy::resolve("claude-code").unwrap();
    budget.set("compact.tool_result_budget.default_chars", "20000").unwrap();
    budget.name = "budget-20k".into();
    let mut snip = Strategy::resolve("claude-code").unwrap();
    snip.set("compact.snip.enabled", "true").unwrap();
    snip.name = "snip".into();
    let strategies = vec![Strategy::resolve("claude-code").unwrap(), Strategy::resolve("claude-code-1h").unwrap(), buffer, budget, snip];
    let out = compare(&inputs, &strategies, &measurer, false).unwrap();
    // multi-turn never nears the threshold: the buffer changes nothing; the TTL does.
    assert_eq!(out[1].same_results_as, None);
    assert_eq!(out[2].same_results_as.as_deref(), Some("claude-code"));
    // On the real session (through the agent) the buffer moves the recorded compaction and the
    // tool result budget replaces large results.
    assert_eq!(out[7].same_results_as, None, "{:?}", out[7].divergence);
    assert!(out[7].divergence.as_deref().is_some_and(|d| d.contains("the agent compacted (autocompact")), "{:?}", out[7].divergence);
    assert_eq!(out[8].same_results_as, None, "{:?}", out[8].divergence);
    assert!(out[8].divergence.as_deref().is_some_and(|d| d.contains("tool_result_budget stage rewrote the conversation")), "{:?}", out[8].divergence);
    assert!(compare_table(&out).contains("- no difference on multi-turn.yaml: buffer-40k gave the same results as claude-code"));
    let csv = String::from_utf8(compare_csv(&out)).unwrap();
    assert!(csv.lines().next().unwrap().contains(",same_results_as,"));
    assert!(serde_json::to_string(&out[2]).unwrap().contains("\"same_results_as\":\"claude-code\""));
    assert!(!serde_json::to_string(&out[1]).unwrap().contains("same_results_as"));
}

/// Every command with `--engine` offers the agent alone (the record-based replay was removed
/// in session 26): its `[default: agent]`, and a help that says it is the only engine.
#[test]
fn the_engine_help_names_the_agent_as_the_only_engine() {
    for command in ["replay", "fidelity", "audit", "compare", "sweep", "check"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim")).args([command, "--help"]).output().unwrap();
        assert!(out.status.success(), "{command} --help");
        let help = String::from_utf8(out.stdout).unwrap();
        let engine = &help[help.find("--engine <ENGINE>").unwrap_or_else(|| panic!("{command} has --engine"))..];
        let default = engine.split("[default: ").nth(1).and_then(|rest| rest.split(']').next()).unwrap();
        assert_eq!(default, "agent", "{command}");
        let words = engine[..engine.find("[default: ").unwrap()].split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(words.contains("the only engine"), "{command}: {words}");
    }
}
