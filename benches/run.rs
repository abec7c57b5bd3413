//! `run` on generated scripts of 500, 1,000 and 2,000 turns (`synth::scripted_scenario`), and of
//! 125, 250 and 500 turns, where no compaction bounds the conversation (`run_growing_context`): what
//! the CLI does per scenario (the agent, the chain, the measurement and the information loss,
//! bodies dropped once measured). Doubling the script should double the time only where each
//! request's work is linear in what changed. Run with `cargo bench --bench run -- --noplot`;
//! peak memory is measured on the CLI (benches/README.md).
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ctxsim::agent::compact::Chain;
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::runner::{RunOptions, run_scenario_opts};
use ctxsim::scenario::parse_scenario;
use ctxsim::strategy::Strategy;

fn run(c: &mut Criterion) {
    let mut group = c.benchmark_group("run_scripted_turns");
    group.sample_size(10);
    let strategy = Strategy::default();
    for turns in [500, 1_000, 2_000] {
        let scenario = parse_scenario(&ctxsim::synth::scripted_scenario(7, turns), "synth.yaml").unwrap();
        group.bench_with_input(BenchmarkId::from_parameter(turns), &scenario, |b, scenario| {
            b.iter(|| {
                let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
                let options = RunOptions { info_loss: true, ..RunOptions::default() };
                run_scenario_opts(scenario, &mut measurer, &strategy, &Chain::new(), options).unwrap().rows.len()
            })
        });
    }
    group.finish();
}

/// The same scripts below the autocompaction threshold (about 600 turns), so the conversation
/// only grows: where a request's work were proportional to the conversation, doubling the
/// script would quadruple the time; proportional to what changed, it doubles it.
fn growing(c: &mut Criterion) {
    let mut group = c.benchmark_group("run_growing_context");
    group.sample_size(10);
    let strategy = Strategy::default();
    for turns in [125, 250, 500] {
        let scenario = parse_scenario(&ctxsim::synth::scripted_scenario(7, turns), "synth.yaml").unwrap();
        group.bench_with_input(BenchmarkId::from_parameter(turns), &scenario, |b, scenario| {
            b.iter(|| {
                let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
                let options = RunOptions { info_loss: true, ..RunOptions::default() };
                let rows = run_scenario_opts(scenario, &mut measurer, &strategy, &Chain::new(), options).unwrap().rows;
                assert!(rows.iter().all(|r| r.stages.iter().all(|s| !(s.fired && s.name == "autocompact"))), "the script stays below the threshold");
                rows.len()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, run, growing);
criterion_main!(benches);
