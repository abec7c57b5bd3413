//! `analyze` on a deterministic 1,000-request session whose context grows to 150k tokens,
//! against the floor: tokenizing each unique block once.
//!
//! Run: `cargo bench --bench analyze -- --noplot`.

use std::collections::BTreeSet;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use ctxsim::analyze::{LogReader, RequestLog, analyze, analyze_stream, count_ahead, read_log};
use ctxsim::measure::blocks::content_token_units;
use ctxsim::measure::o200k::{Counter, count_by_tiktoken};
use ctxsim::measure::tokens::TokenUnit;
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::synth::growing_session;

/// The session as a log file's text, one `{"time_ms", "body"}` line per request.
fn session_text() -> String {
    let mut text = String::new();
    for entry in growing_session(7, 1000, 150_000, "claude-sonnet-4-5") {
        let line = serde_json::json!({"time_ms": entry.time_ms, "body": entry.body});
        text.push_str(&serde_json::to_string(&line).unwrap());
        text.push('\n');
    }
    text
}

/// The session as `analyze` reads it from a file (message keys included).
fn session(text: &str) -> RequestLog {
    read_log(std::io::Cursor::new(text), "bench.jsonl").unwrap()
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
                        pieces.push(text.into_owned());
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

/// Every request's texts in order (tools as their descriptions, system and message texts), as
/// pointers into the bodies: what any exact comparison of a request with its predecessor reads.
fn request_texts(log: &RequestLog) -> Vec<Vec<&str>> {
    log.entries
        .iter()
        .map(|entry| {
            let mut texts: Vec<&str> = entry.body.tools().iter().filter_map(|t| t.description.as_deref()).collect();
            if let Some(ctxsim::api::SystemPrompt::Blocks(blocks)) = &entry.body.system {
                texts.extend(blocks.iter().map(|b| b.text.as_str()));
            }
            for message in &entry.body.messages {
                match &message.content {
                    ctxsim::api::MessageContent::Text(text) => texts.push(text),
                    ctxsim::api::MessageContent::Blocks(blocks) => texts.extend(blocks.iter().filter_map(|b| match b {
                        ctxsim::api::ContentBlock::Text { text, .. } => Some(text.as_str()),
                        ctxsim::api::ContentBlock::ToolResult { content: Some(ctxsim::api::ToolResultContent::Text(text)), .. } => Some(text.as_str()),
                        _ => None,
                    })),
                }
            }
            texts
        })
        .collect()
}

fn benches(c: &mut Criterion) {
    let text = session_text();
    let log = session(&text);
    let texts = unique_texts(&log);
    let per_request = request_texts(&log);
    let mut group = c.benchmark_group("analyze_1000_requests_150k");
    group.sample_size(10);
    // The floor: tiktoken-rs's own `encode_ordinary` over each unique block once.
    group.bench_function("floor_tiktoken_unique_blocks_once", |b| {
        b.iter(|| black_box(texts.iter().map(|t| count_by_tiktoken(t) as u64).sum::<u64>()))
    });
    // The same counts by `bpe` (the same tokenizer, split by a DFA): the stricter floor.
    group.bench_function("floor_tokenize_unique_blocks_once", |b| {
        b.iter(|| black_box({ let mut counter = Counter::new(); texts.iter().map(|t| counter.count(t) as u64).sum::<u64>() }))
    });
    // A second reference: reading every request once, as the memcmp of each text with the one
    // at the same place in the previous request (no structure walked, pointers collected
    // beforehand). An exact analysis of independently stored bodies cannot read less.
    group.bench_function("floor_compare_each_request_with_previous", |b| {
        b.iter(|| {
            let mut same = 0usize;
            for pair in per_request.windows(2) {
                same += pair[1].iter().zip(&pair[0]).filter(|(a, b)| a == b).count();
            }
            black_box(same)
        })
    });
    // The first part of `analyze_bpe`: tokenizing the log's new parts in one run.
    group.bench_function("count_ahead_bpe", |b| {
        b.iter(|| {
            let mut m = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Bpe));
            count_ahead(&log, &mut m);
            black_box(m.counter().tokenized_blocks)
        })
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

    // What a user waits for: reading the 300 MB log, then the analysis.
    let mut group = c.benchmark_group("analyze_1000_requests_150k_from_text");
    group.sample_size(10);
    group.bench_function("read_only", |b| b.iter(|| black_box(session(&text).entries.len())));
    group.bench_function("stream_and_analyze_bpe", |b| {
        b.iter(|| {
            let mut reader = LogReader::new(std::io::Cursor::new(&text), "bench.jsonl");
            let mut m = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Bpe));
            black_box(analyze_stream(&mut reader, &mut m, "bench").unwrap().len())
        })
    });
    group.bench_function("read_and_analyze_bpe", |b| {
        b.iter(|| {
            let log = session(&text);
            let mut m = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Bpe));
            black_box(analyze(&log, &mut m, "bench").unwrap().len())
        })
    });
    group.finish();
}

criterion_group!(analyze_benches, benches);
criterion_main!(analyze_benches);
