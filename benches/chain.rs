//! Runs the whole long-context chain over a generated 1,000-request session.
use criterion::{Criterion, criterion_group, criterion_main};
use ctxsim::agent::compact::generator::{Driver, generate};
use ctxsim::agent::compact::{CompactConfig, ModelLimits};

fn chain(c: &mut Criterion) {
    let rounds = generate(7, 1_000);
    let limits = ModelLimits { context_window: 200_000, max_output_tokens: 32_000 };
    let mut config = CompactConfig::default();
    config.tool_result_budget.aggregate_enabled = true;
    config.microcompact.time_based_enabled = true;
    c.bench_function("chain_1000_requests", |b| {
        b.iter(|| {
            let mut driver = Driver::new(config.clone(), limits);
            driver.play(&rounds, &mut |_| {})
        })
    });
}

criterion_group!(benches, chain);
criterion_main!(benches);
