//! `run` on generated scripts of 500, 1,000 and 2,000 turns (`synth::scripted_scenario`), and of
//! 125, 250 and 500 turns, where no compaction bounds the conversation (`run_growing_context`):
//! what the CLI does per scenario (the agent, the chain, the measurement and the information
//! loss, bodies dropped once measured). Doubling the script should double the time only where
//! each request's work is linear in what changed. Run with `cargo bench --bench run -- --noplot`;
//! peak memory is measured on the CLI (benches/README.md).
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ctxsim::agent::compact::Chain;
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::runner::{RunOptions, run_scenario_opts};
use ctxsim::scenario::parse_scenario;
use ctxsim::strategy::Strategy;

/// One group: `run` on the generated script of each length. With `growing`, every run is
/// checked to stay below the autocompaction threshold.
fn scripted(c: &mut Criterion, group_name: &str, lengths: &[usize], growing: bool) {
    let mut group = c.benchmark_group(group_name);
    group.sample_size(10);
    let strategy = Strategy::default();
    for &turns in lengths {
        let scenario = parse_scenario(&ctxsim::synth::scripted_scenario(7, turns), "synth.yaml").unwrap();
        group.bench_with_input(BenchmarkId::from_parameter(turns), &scenario, |b, scenario| {
            b.iter(|| {
                let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
                let options = RunOptions { info_loss: true, ..RunOptions::default() };
                let rows = run_scenario_opts(scenario, &mut measurer, &strategy, &Chain::new(), options).unwrap().rows;
                if growing {
                    let compacted = rows.iter().any(|r| r.stages.iter().any(|s| s.fired && s.name == "autocompact"));
                    assert!(!compacted, "{turns} turns: the script must stay below the autocompaction threshold");
                }
                rows.len()
            })
        });
    }
    group.finish();
}

fn run(c: &mut Criterion) {
    scripted(c, "run_scripted_turns", &[500, 1_000, 2_000], false);
}

/// Below the autocompaction threshold (about 600 turns) the conversation only grows: were a
/// request's work proportional to the conversation, doubling the script would about quadruple
/// the time; proportional to what changed, it doubles it.
fn growing(c: &mut Criterion) {
    scripted(c, "run_growing_context", &[125, 250, 500], true);
}

criterion_group!(benches, run, growing);
criterion_main!(benches);
