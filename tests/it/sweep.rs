//! `sweep`: determinism across thread counts and shards.
use std::path::{Path, PathBuf};
use std::process::Command;

fn ctxsim(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn scenario(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(name).display().to_string()
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    ["sweep.csv", "sweep.json", "no_effect.csv", "recommendation.txt", "pareto.svg", "sweep.html"]
        .iter()
        .map(|f| (f.to_string(), std::fs::read(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"))))
        .collect()
}

fn sweep(out: &Path, extra: &[&str]) {
    let (a, b) = (scenario("multi-turn.yaml"), scenario("idle-gap.yaml"));
    let out = out.display().to_string();
    let mut args = vec!["sweep", a.as_str(), b.as_str(), "--param", "ttl_main=5m,1h", "--param", "compact.autocompact.buffer_tokens=10000..16000:3000", "--estimator", "chars4", "--quiet", "--out", out.as_str()];
    args.extend_from_slice(extra);
    ctxsim(&args);
}

#[test]
fn one_and_two_threads_write_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    sweep(&one, &["--threads", "1"]);
    sweep(&two, &["--threads", "2"]);
    assert_eq!(files(&one), files(&two));
    let csv = String::from_utf8(std::fs::read(one.join("sweep.csv")).unwrap()).unwrap();
    assert_eq!(csv.lines().count(), 2 + 6, "signature, header, 2 × 3 points");
    assert!(std::fs::read_to_string(one.join("recommendation.txt")).unwrap().contains("Recommended: point"));
    assert!(one.join("pareto.png").exists());
}

#[test]
fn merged_shards_equal_the_unsharded_run() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, parts, merged) = (dir.path().join("whole"), dir.path().join("parts"), dir.path().join("merged"));
    sweep(&whole, &[]);
    sweep(&parts, &["--shard", "0/2"]);
    sweep(&parts, &["--shard", "1/2"]);
    let (p0, p1) = (parts.join("sweep.part0.csv").display().to_string(), parts.join("sweep.part1.csv").display().to_string());
    let m = merged.display().to_string();
    ctxsim(&["sweep", "--merge", p0.as_str(), p1.as_str(), "--out", m.as_str(), "--quiet"]);
    assert_eq!(files(&whole), files(&merged));
    // A missing shard is an error.
    let out = Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(["sweep", "--merge", p0.as_str(), "--out", m.as_str()]).output().unwrap();
    assert!(!out.status.success());
    // A shard cut after its header holds no rows: the error names the line where they would start.
    let text = std::fs::read_to_string(&p0).unwrap();
    let header_only: String = text.lines().take_while(|l| !l.starts_with(|c: char| c.is_ascii_digit())).map(|l| format!("{l}\n")).collect();
    let cut = dir.path().join("cut.csv");
    std::fs::write(&cut, &header_only).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(["sweep", "--merge", cut.to_str().unwrap(), "--out", m.as_str()]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let line = header_only.lines().count() + 1;
    assert!(stderr.contains(&format!("{}:{line}: point 0 is missing (no rows after the header)", cut.display())), "{stderr}");
}

#[test]
fn params_expand_ranges_and_lists() {
    use ctxsim::report::sweep::{Grid, Param};
    assert_eq!(Param::parse("a=1..5:2").unwrap().values, ["1", "3", "5"]);
    assert_eq!(Param::parse("a=0.5..1:0.25").unwrap().values, ["0.5", "0.75", "1"]);
    assert_eq!(Param::parse("ttl_main=5m,1h").unwrap().values, ["5m", "1h"]);
    assert!(Param::parse("a=5..1:1").is_err());
    let grid = Grid { params: vec![Param::parse("a=1,2").unwrap(), Param::parse("b=x,y,z").unwrap()], base: "claude-code".into(), inputs: vec![], engine: None };
    assert_eq!(grid.len(), 6);
    assert_eq!(grid.point(0), ["1", "x"]);
    assert_eq!(grid.point(4), ["2", "y"]);
}

/// The sweep starts every point from its input's token counts under the base strategy. A
/// point that rewrites the context (observation masking, another TTL) must still measure
/// exactly as with a fresh counter: checked on a real session with `bpe` and `calibrated`.
#[test]
fn points_seeded_with_the_base_counts_measure_as_fresh_ones() {
    use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
    use ctxsim::report::compare::{evaluate, load_inputs};
    use ctxsim::strategy::Strategy;
    let session = crate::support::realdata().join("transcripts/entireio-cli/7662d755ef9f-2.full.jsonl");
    let inputs = load_inputs(&[session]).unwrap();
    let base = Strategy::resolve_with("claude-code", &[]).unwrap();
    let mut point = Strategy::resolve_with("observation-masking", &[]).unwrap();
    point.set("compact.peer.keep_recent", "2").unwrap();
    point.set("ttl_main", "1h").unwrap();
    for kind in [EstimatorKind::Bpe, EstimatorKind::Calibrated] {
        let measurer = || Measurer::new(ModelTable::shipped(), TokenCounter::new(kind));
        let mut warm = measurer();
        evaluate(&inputs[0], &base, &mut warm, false).unwrap();
        let mut seeded = measurer();
        assert!(seeded.counter_mut().seed(&warm.counter().memo()));
        let a = evaluate(&inputs[0], &point, &mut seeded, true).unwrap();
        let b = evaluate(&inputs[0], &point, &mut measurer(), true).unwrap();
        assert!(a.summary.requests > 10 && b.summary.info_loss.tokens_dropped > 0, "{kind:?}: the point rewrites: {:?}", b.summary);
        assert_eq!(serde_json::to_string(&a.summary).unwrap(), serde_json::to_string(&b.summary).unwrap(), "{kind:?}");
        assert_eq!(serde_json::to_string(&a.rows).unwrap(), serde_json::to_string(&b.rows).unwrap(), "{kind:?}");
        assert!(seeded.counter().tokenized_blocks < warm.counter().tokenized_blocks / 2, "{kind:?}: the seed saved most tokenizing");
    }
}

/// Runs `ctxsim sweep ARGS --out DIR`, expecting success: (stdout, stderr).
fn sweep_output(args: &[&str], out: &Path) -> (String, String) {
    let out_arg = out.display().to_string();
    let mut all: Vec<&str> = vec!["sweep", "--estimator", "chars4", "--no-progress", "--out", out_arg.as_str()];
    all.extend_from_slice(args);
    let run = Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(&all).output().unwrap();
    assert!(run.status.success(), "{args:?}: {}", String::from_utf8_lossy(&run.stderr));
    (String::from_utf8(run.stdout).unwrap(), String::from_utf8(run.stderr).unwrap())
}

/// On a real session the gap threshold of time-based microcompact changes nothing while the
/// time-based path is off (the default), so the 12 points are equal. The sweep says so per input
/// (stderr, recommendation, JSON, CSV, HTML) and recommends nothing instead of point 0.
#[test]
fn a_knob_without_effect_on_a_real_session_is_reported_not_recommended() {
    let dir = tempfile::tempdir().unwrap();
    let session = crate::support::realdata().join("transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl");
    let session = session.display().to_string();
    let (stdout, stderr) = sweep_output(&[session.as_str(), "--param", "compact.microcompact.gap_threshold_minutes=5..60:5"], dir.path());
    let warning = "warning: no effect on 258c7280-ae70-4798-800f-63464d01a85d.jsonl: compact.microcompact.gap_threshold_minutes changed no result \
                   (the stage microcompact is disabled at every point of the grid)";
    assert!(stderr.contains(warning), "stderr: {stderr}");
    assert!(stdout.contains(warning), "stdout: {stdout}");
    assert!(stdout.contains("Recommended: none (every one of the 12 points gave the same results on every input"), "{stdout}");
    assert!(!stdout.contains("Recommended: point"), "{stdout}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("sweep.json")).unwrap()).unwrap();
    assert_eq!(json["recommended"], serde_json::Value::Null);
    assert_eq!(json["no_effect"][0]["param"], "compact.microcompact.gap_threshold_minutes");
    assert_eq!(json["points"].as_array().unwrap().len(), 12);
    let csv = std::fs::read_to_string(dir.path().join("no_effect.csv")).unwrap();
    assert_eq!(csv.lines().count(), 2, "{csv}");
    assert!(std::fs::read_to_string(dir.path().join("sweep.html")).unwrap().contains("id=\"no-effect\""));
}

/// Whether the recorded microcompacts apply (`replay_recorded_microcompact`) swept through the
/// agent: on a session that records none the warning says so; on the one that records one the
/// points differ and no warning is given.
#[test]
fn recorded_microcompacts_swept_say_where_there_are_none() {
    let dir = tempfile::tempdir().unwrap();
    let session = crate::support::realdata().join("transcripts/entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    let session = session.display().to_string();
    let (_stdout, stderr) = sweep_output(&[session.as_str(), "--param", "replay_recorded_microcompact=true,false"], dir.path());
    assert!(stderr.contains("replay_recorded_microcompact changed no result (the session records no microcompact)"), "stderr: {stderr}");
    let csv = std::fs::read_to_string(dir.path().join("no_effect.csv")).unwrap();
    assert!(csv.contains("the session records no microcompact"), "{csv}");
    let dir = tempfile::tempdir().unwrap();
    let session = crate::support::realdata().join("transcripts/entireio-cli/7662d755ef9f-2.full.jsonl");
    let session = session.display().to_string();
    let (_stdout, stderr) = sweep_output(&[session.as_str(), "--param", "replay_recorded_microcompact=true,false"], dir.path());
    assert!(!stderr.contains("changed no result"), "stderr: {stderr}");
}

/// Issue 13's case: the autocompact buffer on a real session with a recorded automatic
/// compaction. The replay now moves the compaction (tests/it/whatif.rs), so the 12 points differ,
/// no warning is given, and the recommendation weighs real differences.
#[test]
fn the_autocompact_buffer_changes_a_real_session_in_a_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let session = crate::support::realdata().join("transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl");
    let session = session.display().to_string();
    let (stdout, stderr) = sweep_output(&[session.as_str(), "--param", "compact.autocompact.buffer_tokens=5000..60000:5000"], dir.path());
    assert!(!stderr.contains("no effect"), "stderr: {stderr}");
    assert!(stdout.contains("Recommended: point"), "{stdout}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("sweep.json")).unwrap()).unwrap();
    let points = json["points"].as_array().unwrap();
    assert_eq!(points.len(), 12);
    let mut costs: Vec<&str> = points.iter().map(|p| p["cost_usd"].as_str().unwrap()).collect();
    costs.sort_unstable();
    costs.dedup();
    assert!(costs.len() >= 3, "{costs:?}");
}

/// A knob that does matter gives no warning: the autocompact buffer moves the threshold across
/// the scenario's reported 167,110 tokens.
#[test]
fn a_knob_with_effect_gives_no_warning() {
    let dir = tempfile::tempdir().unwrap();
    let input = scenario("autocompact-200k.yaml");
    let (stdout, stderr) = sweep_output(&[input.as_str(), "--param", "compact.autocompact.buffer_tokens=10000,13000,20000"], dir.path());
    assert!(!stderr.contains("no effect"), "{stderr}");
    assert!(!stdout.contains("warning"), "{stdout}");
    assert!(stdout.contains("Recommended: point 0"), "{stdout}");
    assert_eq!(std::fs::read_to_string(dir.path().join("no_effect.csv")).unwrap(), "input,param,reason\n");
    // Points 1 and 2 both compact, with the same results: their outcome digests are equal.
    let csv = std::fs::read_to_string(dir.path().join("sweep.csv")).unwrap();
    let outcomes: Vec<&str> = csv.lines().skip(2).map(|l| l.rsplit(',').next().unwrap()).collect();
    assert_ne!(outcomes[0], outcomes[1]);
    assert_eq!(outcomes[1], outcomes[2]);
}

/// The rendered recommendation of a grid with one knob that matters (the TTL) and one that does
/// not (the autocompact buffer, far above these scenarios' context): a warning per input with
/// the peak against the lowest threshold, and the tie the recommendation is over.
#[test]
fn recommendation_with_warnings_and_ties_renders() {
    let dir = tempfile::tempdir().unwrap();
    sweep(dir.path(), &[]);
    let text = std::fs::read_to_string(dir.path().join("recommendation.txt")).unwrap();
    insta::assert_snapshot!("sweep_recommendation_no_effect_and_tie", text);
}

fn rows(cells: &[[&str; 2]]) -> (Vec<String>, Vec<Vec<String>>) {
    use ctxsim::report::sweep::{Grid, Param};
    let grid = Grid { params: vec![Param::parse("k=a,b,c").unwrap()], base: "claude-code".into(), inputs: vec!["x".into()], engine: None };
    let header = grid.header();
    let rows = cells
        .iter()
        .enumerate()
        .map(|(i, [cost, breaks])| {
            let mut row = vec![i.to_string(), grid.point(i)[0].to_owned(), (*cost).to_owned(), "0.5".into(), (*breaks).to_owned()];
            row.extend(["0", "100", "0", "0", "100", "1000", "10", "0"].map(str::to_owned));
            row.push(format!("{cost}{breaks}/1000"));
            row
        })
        .collect();
    (header, rows)
}

/// Points equal on both objectives but not in every metric: no recommendation, and the text
/// says the objectives cannot choose. Points tied for best: the recommendation names the tie.
#[test]
fn ties_on_the_objectives_are_named() {
    use ctxsim::report::sweep::analyze;
    let (header, all_tied) = rows(&[["1.000000", "0"], ["1.000000", "2"], ["1.000000", "1"]]);
    let analysis = analyze(&header, &all_tied, None, Vec::new());
    assert_eq!(analysis.recommended, None);
    assert!(analysis.text.contains("Recommended: none (all 3 points tie on cost ($1.000000) and information loss (100)"), "{}", analysis.text);
    let (header, two_tied) = rows(&[["2.000000", "0"], ["1.000000", "2"], ["1.000000", "1"]]);
    let analysis = analyze(&header, &two_tied, None, Vec::new());
    assert_eq!((analysis.recommended, analysis.tied.clone()), (Some(1), vec![2]));
    assert!(analysis.text.contains("Tie: point 2 has the same cost and information loss as point 1"), "{}", analysis.text);
    let (header, distinct) = rows(&[["2.000000", "0"], ["1.000000", "2"], ["3.000000", "1"]]);
    let analysis = analyze(&header, &distinct, None, Vec::new());
    assert_eq!((analysis.recommended, analysis.tied.len(), analysis.equal.is_none()), (Some(1), 0, true));
}

/// No effect is decided per parameter with the others held fixed: a knob that changes results
/// under one value of another knob has an effect.
#[test]
fn param_effects_hold_the_other_params_fixed() {
    use ctxsim::report::effects::param_effects;
    use ctxsim::report::sweep::{Grid, Param};
    let grid = Grid { params: vec![Param::parse("a=1,2").unwrap(), Param::parse("b=x,y,z").unwrap()], base: "claude-code".into(), inputs: vec![], engine: None };
    // Outcomes per point (a outer, b inner) for two inputs: on input 0 only `a` matters, on
    // input 1 `b` matters only when a=2.
    let outcomes: Vec<Vec<String>> = [["A", "P"], ["A", "P"], ["A", "P"], ["B", "P"], ["B", "Q"], ["B", "P"]]
        .iter()
        .map(|r| r.iter().map(|s| (*s).to_owned()).collect())
        .collect();
    let effects: Vec<(usize, usize, usize)> = param_effects(&grid, &outcomes).iter().map(|e| (e.input, e.param, e.distinct)).collect();
    assert_eq!(effects, [(0, 0, 2), (0, 1, 1), (1, 0, 2), (1, 1, 2)]);
}

/// A TTL the user names applies to a real session, also the default one: NumWordify's client
/// wrote its cache at 1h, so `auto` (the client's own choice, the default) is its 1h run, while
/// `5m` is a run at 5m, which costs otherwise. (Before `auto`, a named 5m could not be told from
/// the default and gave way to the recorded 1h: the sweep said "ttl_main changed no result".)
#[test]
fn a_named_ttl_applies_to_a_real_session() {
    let dir = tempfile::tempdir().unwrap();
    let session = crate::support::realdata().join("transcripts/NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl").display().to_string();
    let (_, stderr) = sweep_output(&[session.as_str(), "--param", "ttl_main=auto,5m,1h"], dir.path());
    assert!(!stderr.contains("ttl_main changed no result"), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("sweep.json")).unwrap()).unwrap();
    let cost = |ttl: &str| json["points"].as_array().unwrap().iter().find(|p| p["ttl_main"] == ttl).unwrap()["cost_usd"].as_str().unwrap().to_owned();
    assert_eq!(cost("auto"), cost("1h"), "auto is the recorded TTL");
    assert_ne!(cost("5m"), cost("1h"), "a named 5m is run at 5m");
}
