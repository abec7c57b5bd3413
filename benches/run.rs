//! `run` on generated scripts of 500, 1,000 and 2,000 turns (`synth::scripted_scenario`): what
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

criterion_group!(benches, run);
criterion_main!(benches);
