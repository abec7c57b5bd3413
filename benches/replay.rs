//! Importing and replaying every real session in ../shared/realdata/transcripts, with chars4
//! and bpe, against the floor: tokenizing (o200k) once each text the bpe replay tokenizes, i.e.
//! each unique block. Run with `cargo bench --bench replay -- --noplot`.
use std::path::PathBuf;

use criterion::{Criterion, criterion_group, criterion_main};
use ctxsim::measure::o200k::{Counter, count_by_tiktoken};
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::replay::{ReplayOptions, load_session, replay_session};

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

/// Imports and replays every session; `body_hashes: false` is what `fidelity` and `sweep` do.
fn replay_all(kind: EstimatorKind, files: &[PathBuf], body_hashes: bool) -> usize {
    let mut rows = 0;
    for path in files {
        let session = load_session(path).unwrap();
        let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(kind));
        if !body_hashes {
            measurer = measurer.without_body_hashes();
        }
        rows += replay_session(&session, &mut measurer, &ReplayOptions::default()).rows().len();
    }
    rows
}

/// Every text the `bpe` replay of all sessions tokenizes (each unique block once).
fn tokenized_texts(files: &[PathBuf]) -> Vec<String> {
    let mut texts = Vec::new();
    for path in files {
        let session = load_session(path).unwrap();
        let mut counter = TokenCounter::new(EstimatorKind::Bpe);
        counter.keep_tokenized_texts();
        let mut measurer = Measurer::new(ModelTable::shipped(), counter);
        replay_session(&session, &mut measurer, &ReplayOptions::default());
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
