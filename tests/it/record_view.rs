//! The record view ([`ctxsim::replay::record_view`]) reads a session as the record-based replay
//! does: on every shared transcript and every transcript fixture, each call's events, the sizes
//! of its unrecorded part and (measured) of its messages are the replay's.

use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::replay::{ReplayOptions, load_session, record_view, record_view_measured, replay_session};

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

/// Checks that `options`' view of the transcript at `path` equals its replay's: per call, the
/// skip reason, the events and (compared calls) the prefix level and user context; the main
/// lane's unrecorded sizes.
fn check_same(path: &std::path::Path, options: &ReplayOptions) -> usize {
    let session = load_session(path).unwrap();
    let new_measurer = || Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Calibrated)).without_body_hashes();
    let replay = replay_session(&session, &mut new_measurer(), options);
    let view = record_view_measured(&session, &mut new_measurer(), options);
    assert_eq!(record_view(&session, &mut new_measurer(), options).calls.iter().map(|c| &c.events).collect::<Vec<_>>(), view.calls.iter().map(|c| &c.events).collect::<Vec<_>>());
    let name = path.display();
    assert_eq!(view.calls.len(), replay.calls.len(), "{name}");
    for (seen, replayed) in view.calls.iter().zip(replay.calls.iter()) {
        assert_eq!(seen.index, replayed.index, "{name}");
        assert_eq!(seen.skipped, replayed.skipped, "{name} #{}", seen.index);
        assert_eq!(seen.events, replayed.events, "{name} #{}: events", seen.index);
        if replayed.compared() {
            assert_eq!((seen.prefix_tokens, seen.user_context_tokens), (replayed.prefix_tokens, replayed.user_context_tokens), "{name} #{}: sizes", seen.index);
            assert_eq!((seen.message_tokens, seen.message_blocks), (replayed.message_tokens, replayed.message_blocks), "{name} #{}: messages", seen.index);
            assert_eq!(
                (seen.thinking_filled, seen.attachment_chars, seen.unsized_attachment_chars),
                (replayed.thinking_filled, replayed.attachment_chars, replayed.unsized_attachment_chars),
                "{name} #{}: thinking, attachments",
                seen.index
            );
        }
    }
    assert_eq!(view.unrecorded_main, replay.unrecorded_main, "{name}: unrecorded main");
    view.calls.iter().filter(|c| !c.events.is_empty()).count()
}

#[test]
fn the_record_view_sees_what_the_replay_sees_on_every_real_session() {
    let files = real_transcripts();
    assert_eq!(files.len(), 16);
    let with_events: usize = files.iter().map(|path| check_same(path, &ReplayOptions::default())).sum();
    assert!(with_events > 100, "{with_events} calls with events");
}

#[test]
fn the_record_view_sees_what_the_replay_sees_on_the_fixtures_and_under_the_reading_knobs() {
    let files = fixture_transcripts();
    assert_eq!(files.len(), 4);
    for path in &files {
        check_same(path, &ReplayOptions::default());
        // Without the recorded requests every call is reconstructed and sized by the record.
        check_same(path, &ReplayOptions { recorded_requests: false, ..Default::default() });
    }
    // `fidelity`'s reading knobs on a real session with turns, side entries and compactions.
    let spotter = real_transcripts().into_iter().find(|p| p.to_string_lossy().contains("spotter")).unwrap();
    check_same(&spotter, &ReplayOptions { rerender_prompts: false, side_entries: false, ..Default::default() });
}
