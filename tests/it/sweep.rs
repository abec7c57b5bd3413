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
    ["sweep.csv", "recommendation.txt", "pareto.svg", "sweep.html"]
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
}

#[test]
fn params_expand_ranges_and_lists() {
    use ctxsim::report::sweep::{Grid, Param};
    assert_eq!(Param::parse("a=1..5:2").unwrap().values, ["1", "3", "5"]);
    assert_eq!(Param::parse("a=0.5..1:0.25").unwrap().values, ["0.5", "0.75", "1"]);
    assert_eq!(Param::parse("ttl_main=5m,1h").unwrap().values, ["5m", "1h"]);
    assert!(Param::parse("a=5..1:1").is_err());
    let grid = Grid { params: vec![Param::parse("a=1,2").unwrap(), Param::parse("b=x,y,z").unwrap()], base: "claude-code".into(), inputs: vec![] };
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
