//! Importing every real session in ../shared/realdata/transcripts and driving the agent by it
//! as recorded (`ctxsim fidelity`'s run: `claude-code` under the recorded settings), with chars4
//! and bpe, against the floor: tokenizing (o200k) once each text the bpe run tokenizes, i.e.
//! each unique block. Run with `cargo bench --bench replay -- --noplot`. (Until session 26 this
//! bench measured the record-based request builder, removed then.)
use std::path::PathBuf;

use criterion::{Criterion, criterion_group, criterion_main};
use ctxsim::measure::o200k::{Counter, count_by_tiktoken};
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::recording::ImportedSession;
use ctxsim::replay::load_session;
use ctxsim::replay::workload::agent_replay;
use ctxsim::strategy::Strategy;

/// The sessions, or `None` (said on stderr) when the shared data is not beside the checkout.
fn transcripts() -> Option<Vec<PathBuf>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/realdata/transcripts");
    if !root.is_dir() {
        eprintln!("replay bench skipped: no shared transcripts at {} (the bench replays ../shared/realdata)", root.display());
        return None;
    }
    let mut files = Vec::new();
    for dir in ["entireio-cli", "spotter"] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .collect();
        found.sort();
        files.extend(found);
    }
    Some(files)
}

/// The agent's as-recorded run of `session`: its rows.
fn as_recorded(session: &ImportedSession, path: &std::path::Path, measurer: &mut Measurer) -> usize {
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    agent_replay(session, &path.display().to_string(), measurer, &strategy).unwrap().replay.rows().len()
}

/// Imports every session and drives the agent by it as recorded; `body_hashes: false` is what
/// `fidelity` and `sweep` do.
fn replay_all(kind: EstimatorKind, files: &[PathBuf], body_hashes: bool) -> usize {
    let mut rows = 0;
    for path in files {
        let session = load_session(path).unwrap();
        let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(kind));
        if !body_hashes {
            measurer = measurer.without_body_hashes();
        }
        rows += as_recorded(&session, path, &mut measurer);
    }
    rows
}

/// Every text the `bpe` run of all sessions tokenizes (each unique block once).
fn tokenized_texts(files: &[PathBuf]) -> Vec<String> {
    let mut texts = Vec::new();
    for path in files {
        let session = load_session(path).unwrap();
        let mut counter = TokenCounter::new(EstimatorKind::Bpe);
        counter.keep_tokenized_texts();
        let mut measurer = Measurer::new(ModelTable::shipped(), counter);
        as_recorded(&session, path, &mut measurer);
        texts.extend(measurer.counter().tokenized_texts().iter().cloned());
    }
    texts
}

fn bench(c: &mut Criterion) {
    let Some(files) = transcripts() else { return };
    let texts = tokenized_texts(&files);
    let mut group = c.benchmark_group("replay");
    group.sample_size(10);
    group.bench_function("floor_tiktoken_unique_blocks_once", |b| b.iter(|| texts.iter().map(|t| count_by_tiktoken(t) as u64).sum::<u64>()));
    group.bench_function("floor_tokenize_unique_blocks_once", |b| b.iter(|| { let mut counter = Counter::new(); texts.iter().map(|t| counter.count(t) as u64).sum::<u64>() }));
    group.bench_function("import_only", |b| b.iter(|| files.iter().map(|p| load_session(p).unwrap().calls.len()).sum::<usize>()));
    group.bench_function("all_realdata_chars4", |b| b.iter(|| replay_all(EstimatorKind::Chars4, &files, true)));
    group.bench_function("all_realdata_bpe", |b| b.iter(|| replay_all(EstimatorKind::Bpe, &files, true)));
    group.bench_function("all_realdata_bpe_no_body_hashes", |b| b.iter(|| replay_all(EstimatorKind::Bpe, &files, false)));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
