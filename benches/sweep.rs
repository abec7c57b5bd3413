//! `sweep` through the agent (the default engine for recorded sessions) on one real session (the recording in `recordings/`): a family of points that differ only in where
//! autocompact fires (the buffer and the PCT override), each point run alone from the first call
//! (`agent_whatif` per point, what `--no-checkpoints` does) against the points going on from
//! checkpoints of one trunk run (`agent_whatif_family`, the default). The session's loading and
//! preparation are done before timing. Run with `cargo bench --bench sweep -- --noplot`; the
//! whole-grid figures are measured on the CLI (benches/README.md).
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::replay::agent_whatif::{agent_whatif, agent_whatif_family, effective_strategy, prepare};
use ctxsim::strategy::Strategy;

fn measurer() -> Measurer {
    Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4))
}

fn sweep(c: &mut Criterion) {
    // The recording shipped in the repository (entireio-cli/7662d755ef9f-2: 2.1.14, one recorded
    // automatic compaction), so that the bench runs on a checkout alone.
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/recordings/entireio-7662d755ef9f-2.jsonl");
    let session = ctxsim::replay::load_session(Path::new(file)).unwrap();
    let prepared = prepare(&session, file, &measurer()).unwrap();
    let mut sets = Vec::new();
    for buffer in [5_000, 13_000, 20_000, 30_000, 40_000] {
        sets.push(format!("compact.autocompact.buffer_tokens={buffer}"));
    }
    for pct in [50, 60, 70, 80, 90] {
        sets.push(format!("env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE={pct}"));
    }
    let strategies: Vec<Strategy> = sets.iter().map(|set| Strategy::resolve_with("claude-code", std::slice::from_ref(set)).unwrap()).collect();
    let effectives: Vec<Strategy> = strategies.iter().map(|s| effective_strategy(s, &prepared)).collect();
    let mut group = c.benchmark_group("sweep_agent_10_thresholds");
    group.sample_size(10);
    group.bench_function("each_point_alone", |b| {
        b.iter(|| strategies.iter().map(|s| agent_whatif(&session, file, &prepared, &mut measurer(), s).unwrap().rows.len()).sum::<usize>())
    });
    group.bench_function("checkpointed_family", |b| {
        b.iter(|| agent_whatif_family(&session, file, &prepared, measurer(), &effectives).unwrap().into_iter().map(|o| o.unwrap().rows.len()).sum::<usize>())
    });
    group.finish();
}

criterion_group!(benches, sweep);
criterion_main!(benches);
