//! `run` on generated scripts, doubling the script's length (`synth::scripted_scenario`): what
//! the CLI does per scenario (the agent, the chain, the measurement and the information loss,
//! bodies dropped once measured). Two groups:
//!
//! - `run_scripted_turns` (1,000, 2,000, 4,000 turns, the default strategy): autocompaction
//!   keeps the context bounded from about 600 turns on, so each doubling should cost 2×;
//! - `run_growing_turns` (500, 1,000, 2,000 turns, `synth::growing_scripted_scenario`: a
//!   4M-token window, autocompaction off): the conversation grows to the last turn, so doubling
//!   costs 2× only where a request's work follows what changed, and up to 4× where it follows
//!   the conversation.
//!
//! Each sample is one run (flat sampling, ten samples, no warm-up to speak of) so that the
//! largest point stays within minutes. Run with `cargo bench --bench run -- --noplot`; peak
//! memory is measured on the CLI (benches/README.md).
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};
use ctxsim::agent::compact::Chain;
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::runner::{RunOptions, run_scenario_opts};
use ctxsim::scenario::parse_scenario;
use ctxsim::strategy::Strategy;

fn doubling(c: &mut Criterion, group: &str, make: fn(u64, usize) -> String, turns: [usize; 3]) {
    let mut group = c.benchmark_group(group);
    group.sampling_mode(SamplingMode::Flat).sample_size(10).warm_up_time(Duration::from_millis(1)).measurement_time(Duration::from_secs(1));
    let strategy = Strategy::default();
    for turns in turns {
        let scenario = parse_scenario(&make(7, turns), "synth.yaml").unwrap();
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

fn run(c: &mut Criterion) {
    doubling(c, "run_scripted_turns", ctxsim::synth::scripted_scenario, [1_000, 2_000, 4_000]);
    doubling(c, "run_growing_turns", ctxsim::synth::growing_scripted_scenario, [500, 1_000, 2_000]);
}

criterion_group!(benches, run);
criterion_main!(benches);
