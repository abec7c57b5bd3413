//! Snapshots of every request of every shipped scenario, one line per block, and the run's
//! determinism.

use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::report::render::render_request;
use ctxsim::runner::{check_determinism, flatten_all, run_scenario};
use ctxsim::scenario::load_scenario;
use ctxsim::strategy::Strategy;

fn measurer() -> Measurer {
    Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Bpe))
}

/// The readable rendering of a scenario's run.
pub fn render_scenario(path: &std::path::Path) -> String {
    let scenario = load_scenario(path).unwrap();
    let mut m = measurer();
    let output = run_scenario(&scenario, &mut m, &Strategy::default()).unwrap();
    let mut text = String::new();
    for (flat, row) in flatten_all(&output, &mut m).iter().zip(&output.rows) {
        text.push_str(&render_request(flat, row));
    }
    text
}

#[test]
fn every_shipped_scenario_request_by_request() {
    insta::glob!("../../scenarios", "*.yaml", |path| {
        insta::assert_snapshot!(render_scenario(path));
    });
}

#[test]
fn every_shipped_scenario_is_deterministic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut paths: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "yaml")).collect();
    paths.sort();
    let mut failures = Vec::new();
    for path in paths {
        let scenario = load_scenario(&path).unwrap();
        if let Some(difference) = check_determinism(&scenario, &measurer, &Strategy::default()).unwrap() {
            failures.push(difference);
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
