//! `analyze` on a deterministic 1,000-request session whose context grows to 150k tokens,
//! against the floor: tokenizing each unique block once.
//!
//! Run: `cargo bench --bench analyze -- --noplot`.

use std::collections::BTreeSet;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use ctxsim::analyze::{RequestLog, analyze};
use ctxsim::measure::blocks::content_token_units;
use ctxsim::measure::tokens::{TokenUnit, bpe};
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::synth::growing_session;

fn session() -> RequestLog {
    RequestLog { entries: growing_session(7, 1000, 150_000, "claude-sonnet-4-5"), warnings: Vec::new() }
}

/// Every unique block's token strings, once (the floor: tokenize each unique block once).
fn unique_texts(log: &RequestLog) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for entry in &log.entries {
        let mut pieces: Vec<String> = Vec::new();
        for tool in entry.body.tools() {
            pieces.push(serde_json::to_string(tool).unwrap());
        }
        for block in entry.body.system_blocks() {
            pieces.push(block.text.clone());
        }
        for message in &entry.body.messages {
            for block in message.content.to_blocks() {
                for unit in content_token_units(&block) {
                    if let TokenUnit::Text(text) = unit {
                        pieces.push(text);
                    }
                }
            }
        }
        for piece in pieces {
            if seen.insert(xxhash_rust::xxh3::xxh3_128(piece.as_bytes())) {
                out.push(piece);
            }
        }
    }
    out
}

fn benches(c: &mut Criterion) {
    let log = session();
    let texts = unique_texts(&log);
    let mut group = c.benchmark_group("analyze_1000_requests_150k");
    group.sample_size(10);
    group.bench_function("floor_tokenize_unique_blocks_once", |b| {
        b.iter(|| black_box(texts.iter().map(|t| bpe(t) as u64).sum::<u64>()))
    });
    group.bench_function("analyze_bpe", |b| {
        b.iter(|| {
            let mut m = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Bpe));
            black_box(analyze(&log, &mut m, "bench").unwrap().len())
        })
    });
    group.bench_function("analyze_chars4", |b| {
        b.iter(|| {
            let mut m = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
            black_box(analyze(&log, &mut m, "bench").unwrap().len())
        })
    });
    group.finish();
}

criterion_group!(analyze_benches, benches);
criterion_main!(analyze_benches);
