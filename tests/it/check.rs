//! `ctxsim check`: budgets, baseline, exit codes, readable diff, JUnit XML.

use std::path::Path;
use std::process::Command;

use ctxsim::measure::Summary;
use ctxsim::report::check::{Baseline, Tolerances, check_run};
use ctxsim::runner::RunOutput;
use ctxsim::scenario::parse_scenario;

use crate::support::scenario;

/// Writes `suite/<name>.yaml` files under a new temporary directory.
fn suite(files: &[(&str, String)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("suite")).unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join("suite").join(format!("{name}.yaml")), text).unwrap();
    }
    dir
}

/// Runs `ctxsim check suite ARGS...` in `dir`: (exit code, stdout, stderr).
fn check(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ctxsim"))
        .current_dir(dir)
        .args(["check", "suite", "--estimator", "chars4"])
        .args(args)
        .output()
        .unwrap();
    (out.status.code().unwrap(), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn a_broken_budget_fails_with_exit_1_and_a_readable_diff() {
    let dir = suite(&[
        ("over-budget", scenario("over-budget", "  max_requests: 1\n  max_cost_usd: 0.0001\n  compactions: {auto: 1}\n  cache_breaks: 0\n")),
        ("within-budget", scenario("within-budget", "  max_requests: 2\n  cache_breaks: 0\n")),
    ]);
    let (code, stdout, stderr) = check(dir.path(), &["--junit", "out/junit.xml"]);
    assert_eq!(code, 1, "stderr: {stderr}");
    insta::assert_snapshot!("broken_budget_diff", stdout);
    let junit = std::fs::read_to_string(dir.path().join("out/junit.xml")).unwrap();
    insta::assert_snapshot!("broken_budget_junit", junit);
}

#[test]
fn a_passing_suite_exits_0() {
    let dir = suite(&[("fine", scenario("fine", "  max_requests: 2\n  cache_breaks: 0\n  peak_context_tokens: 50000\n  compactions: {auto: 0}\n"))]);
    let (code, stdout, stderr) = check(dir.path(), &[]);
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("check passed: 1 scenarios"), "{stdout}");
}

#[test]
fn bad_input_exits_2_naming_the_file() {
    let dir = suite(&[("typo", scenario("typo", "  max_request: 2\n"))]);
    let (code, _, stderr) = check(dir.path(), &[]);
    assert_eq!(code, 2);
    assert!(stderr.contains("typo.yaml") && stderr.contains("max_request"), "{stderr}");
}

#[test]
fn baseline_round_trip_and_regression() {
    let dir = suite(&[("a", scenario("a", "  max_requests: 5\n")), ("b", scenario("b", "  max_requests: 5\n"))]);
    let (code, _, stderr) = check(dir.path(), &["--baseline", "baseline.json", "--update-baseline"]);
    assert_eq!(code, 0, "{stderr}");
    let path = dir.path().join("baseline.json");
    let written = std::fs::read_to_string(&path).unwrap();
    let mut baseline = Baseline::parse(&written, "baseline.json").unwrap();
    assert_eq!(baseline.scenarios.keys().collect::<Vec<_>>(), ["a", "b"]);

    // Unchanged code against its own baseline passes.
    let (code, stdout, _) = check(dir.path(), &["--baseline", "baseline.json"]);
    assert_eq!(code, 0, "{stdout}");

    // A baseline that was cheaper, had a better hit ratio and a smaller context: regression.
    let entry = baseline.scenarios.get_mut("b").unwrap();
    entry.cost_usd /= 2.0;
    entry.cache_hit_ratio += 0.5;
    entry.peak_context_tokens /= 2;
    entry.fingerprint = "0".repeat(64);
    std::fs::write(&path, baseline.to_json()).unwrap();
    let (code, stdout, _) = check(dir.path(), &["--baseline", "baseline.json"]);
    assert_eq!(code, 1, "{stdout}");
    let text = stdout.lines().filter(|l| !l.contains("fingerprint")).collect::<Vec<_>>().join("\n");
    insta::assert_snapshot!("baseline_regression", text);
    assert!(stdout.contains("note baseline.fingerprint: request bytes changed"), "{stdout}");

    // A generous tolerance lets the cost and context through, not the hit ratio.
    let (code, stdout, _) = check(dir.path(), &["--baseline", "baseline.json", "--tolerance", "2.0"]);
    assert_eq!(code, 1);
    assert!(!stdout.contains("baseline.cost_usd") && stdout.contains("baseline.cache_hit_ratio"), "{stdout}");
}

#[test]
fn new_cache_breaks_are_named_with_request_block_and_cause() {
    let rows = super::report::session();
    let scenario = parse_scenario(&scenario("long-session", "  cache_breaks: 1\n  min_cache_hit_ratio: 0.95\n"), "suite/long-session.yaml").unwrap();
    let output = RunOutput {
        scenario: scenario.file.clone(),
        summary: Summary::from_rows(&scenario.file, "claude-code", "chars4", &rows, 0),
        rows: rows.clone(),
        requests: Vec::new(),
        stopped: None,
    };
    // The baseline knew the TTL expiry and the compaction, not the two microcompact breaks.
    let mut first = check_run(&scenario, &output, None, &Tolerances::default());
    let mut suite = ctxsim::report::check::SuiteReport { scenarios: vec![first.clone()] };
    let mut baseline = suite.to_baseline();
    let entry = baseline.scenarios.get_mut("long-session").unwrap();
    entry.breaks.retain(|b| b.cause.as_deref() != Some("microcompact_cleared_tool_result"));
    entry.cache_breaks = entry.breaks.len();
    first = check_run(&scenario, &output, Some(&baseline), &Tolerances::default());
    suite.scenarios = vec![first];
    assert!(!suite.passed());
    insta::assert_snapshot!("new_cache_breaks", suite.render_text());
}

#[test]
fn junit_escapes_markup_and_control_characters() {
    use ctxsim::report::check::{xml_escape, xml_escape_text};
    assert_eq!(xml_escape("a<b>&\"c'\n"), "a&lt;b&gt;&amp;&quot;c&apos;&#10;");
    assert_eq!(xml_escape_text("x\u{1}\ny"), "x\u{FFFD}\ny");
}

#[test]
fn the_shipped_suite_meets_its_budgets_and_break_classes() {
    // Every shipped scenario's `expect:` holds, including the cache-break classes users report
    // (`break_causes`: exactly which breaks the claude-code strategy has, with their causes).
    let out = Command::new(env!("CARGO_BIN_EXE_ctxsim")).current_dir(env!("CARGO_MANIFEST_DIR")).args(["check", "scenarios"]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("break-resume-after-ttl"), "{stdout}");
}

#[test]
fn check_measures_with_calibrated_by_default_and_records_it_in_the_baseline() {
    // The scenario whose budget the estimator decides: sized so that autocompact's fork is
    // refused and retried in `calibrated` counts.
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.json");
    let out = Command::new(env!("CARGO_BIN_EXE_ctxsim"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["check", "scenarios/compaction-fork-ptl-retry.yaml", "--update-baseline", "--baseline"])
        .arg(&base)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let baseline: serde_json::Value = serde_json::from_slice(&std::fs::read(&base).unwrap()).unwrap();
    assert_eq!(baseline["estimator"], "calibrated");
    assert_eq!(baseline["scenarios"]["compaction-fork-ptl-retry"]["compactions"]["auto"], 1, "{baseline:#}");
}

#[test]
fn disabling_a_stage_breaks_the_budget_that_needs_it() {
    let run = |stage: &str| {
        Command::new(env!("CARGO_BIN_EXE_ctxsim"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["check", "scenarios/autocompact-200k.yaml", "--disable-stage", stage])
            .output()
            .unwrap()
    };
    let off = run("autocompact");
    assert_eq!(off.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&off.stdout).contains("auto fired 0 times, expected exactly 1"));
    let unknown = run("autocompactt");
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("valid stages: tool_result_budget"));
}
