//! The record view ([`ctxsim::replay::record_view`]) reads a session in one pass: on every
//! shared transcript and every transcript fixture, one row per recorded call in order, skipped
//! where the call has no usage to compare, the same events whether it measures the messages or
//! not, and (measured) a prompt that adds up to the recorded one. Until session 26 these tests
//! compared the view with the record-based replay, removed then: they now check the rows
//! against the recording itself.

use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::replay::{ReplayOptions, load_session, record_view, record_view_measured};

use crate::support::real_transcripts;

/// The main transcripts of the fixtures under tests/data/api-requests (sessions that recorded
/// their requests).
fn fixture_transcripts() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/api-requests");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path().join("00000000-0000-4000-8000-000000000001.jsonl"))
        .filter(|p| p.exists())
        .collect();
    files.sort();
    files
}

/// Checks `options`' view of the transcript at `path` against its recording: per recorded call
/// one row (same index, in order), skipped exactly where the call has no usage to compare
/// (synthetic, an API error, no prompt), the same events measured or not, and the measured
/// prompt of the compared calls (prefix, user context, messages) within `max_mape` of the
/// recorded one on average. Returns the calls with events.
fn check_rows(path: &std::path::Path, options: &ReplayOptions, max_mape: f64) -> usize {
    let session = load_session(path).unwrap();
    let new_measurer = || Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Calibrated)).without_body_hashes();
    let view = record_view_measured(&session, &mut new_measurer(), options);
    assert_eq!(record_view(&session, &mut new_measurer(), options).calls.iter().map(|c| &c.events).collect::<Vec<_>>(), view.calls.iter().map(|c| &c.events).collect::<Vec<_>>());
    let name = path.display();
    assert_eq!(view.calls.len(), session.calls.len(), "{name}");
    let mut errors = Vec::new();
    for (seen, call) in view.calls.iter().zip(&session.calls) {
        assert_eq!(seen.index, call.index, "{name}");
        assert_eq!(seen.lane, call.lane, "{name} #{}", call.index);
        let comparable = !call.is_synthetic && !call.is_api_error && call.usage.prompt_tokens() > 0;
        if !comparable {
            assert!(seen.skipped.is_some(), "{name} #{}: not skipped", call.index);
            continue;
        }
        if seen.skipped.is_some() {
            continue;
        }
        let recorded = call.usage.prompt_tokens() as f64;
        let measured = (seen.prefix_tokens + seen.user_context_tokens + seen.message_tokens) as f64;
        errors.push((measured - recorded).abs() / recorded);
    }
    assert!(!errors.is_empty(), "{name}: no compared call");
    let mape = errors.iter().sum::<f64>() / errors.len() as f64;
    assert!(mape <= max_mape, "{name}: the view's prompts are {:.1}% off the recorded ones", mape * 100.0);
    view.calls.iter().filter(|c| !c.events.is_empty()).count()
}

#[test]
fn the_record_view_reads_every_real_session_call_by_call() {
    let files = real_transcripts();
    assert_eq!(files.len(), 16);
    let with_events: usize = files.iter().map(|path| check_rows(path, &ReplayOptions::default(), 0.05)).sum();
    assert!(with_events > 100, "{with_events} calls with events");
}

#[test]
fn the_record_view_reads_the_fixtures_and_under_the_reading_knobs() {
    let files = fixture_transcripts();
    assert_eq!(files.len(), 4);
    for path in &files {
        // Rows only: the fixtures' prompts are measured here with the shipped calibration, not
        // the one `serve` counted them with (tests/it/api_requests.rs checks them to the token
        // under that one), and the compaction probe's script claimed a usage.
        check_rows(path, &ReplayOptions::default(), f64::INFINITY);
        // Without the recorded requests every call is reconstructed and sized by the record.
        check_rows(path, &ReplayOptions { recorded_requests: false, ..Default::default() }, f64::INFINITY);
    }
    // `fidelity`'s reading knobs on a real session with turns, side entries and compactions.
    let spotter = real_transcripts().into_iter().find(|p| p.to_string_lossy().contains("spotter")).unwrap();
    check_rows(&spotter, &ReplayOptions { rerender_prompts: false, side_entries: false, ..Default::default() }, 0.05);
}

/// The information loss of a compaction is memoized per session by what it reads
/// (`replay::loss::compaction_loss`): on every main-lane call of a shared session with recorded
/// compactions, judged as recorded, again with other context sizes (a memo hit) and with another
/// request after it (no hit), it equals the loss judged by scanning every text, and the
/// count-only judgement its counts.
#[test]
fn compaction_loss_memo_equals_the_scan() {
    use ctxsim::recording::format::LANE_MAIN;
    use ctxsim::replay::loss::{Judgement, compaction_loss, compaction_loss_by_scan};
    let path = crate::support::realdata().join("transcripts/entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    let session = ctxsim::recording::claude_code::import_claude_code(&path).unwrap();
    let main: Vec<usize> = (0..session.calls.len()).filter(|&p| session.calls[p].lane == LANE_MAIN).collect();
    assert!(main.len() > 2, "{}", main.len());
    let mut judged = 0;
    for pair in main.windows(2) {
        let (previous, at) = (pair[0], pair[1]);
        let after = session.messages_for_call(&session.calls[at]);
        let shorter = &after[..after.len() / 2];
        for (messages, before, after_tokens) in [(&after[..], 9_000, 1_000), (&after[..], 5_000, 7_000), (shorter, 9_000, 1_000)] {
            let memoized = compaction_loss(&session, at, previous, messages, before, after_tokens, Judgement::Full);
            let scanned = compaction_loss_by_scan(&session, at, previous, messages, before, after_tokens);
            assert_eq!(memoized, scanned, "call {at}");
            let counted = compaction_loss(&session, at, previous, messages, before, after_tokens, Judgement::Counts);
            assert_eq!((counted.references_lost, counted.rereads, counted.tokens_dropped), (scanned.references_lost, scanned.rereads, scanned.tokens_dropped), "call {at}");
            judged += 1;
        }
    }
    assert!(judged > 6);
}
