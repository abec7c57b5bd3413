//! Issue 13: what-ifs on real sessions. Another autocompact setting moves the compactions of a
//! recorded session: the session is replayed with a compaction inserted where the setting's
//! threshold fires and the recording's removed where it does not.

use ctxsim::api::Role;
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::recording::{CompactionEdit, EventKind, ImportedSession, SUMMARY_OPENING};
use ctxsim::replay::{ReplayOptions, SessionReplay, load_session, replay_session};
use ctxsim::strategy::Strategy;

use crate::support::realdata;

const SPOTTER: &str = "transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl";
const CD95: &str = "transcripts/entireio-cli/cd95adddad32-0.full.jsonl";
const CIPHER_BOX: &str = "transcripts/cipher-box/e89fb6a2d646-0.full.jsonl";
const E7662: &str = "transcripts/entireio-cli/7662d755ef9f-2.full.jsonl";

fn session(path: &str) -> ImportedSession {
    load_session(&realdata().join(path)).unwrap()
}

/// Replays `session` under the default strategy with `sets` (`key=value`).
fn check(session: &ImportedSession, sets: &[&str]) -> SessionReplay {
    let sets: Vec<String> = sets.iter().map(|s| (*s).to_owned()).collect();
    let strategy = Strategy::resolve_with("claude-code", &sets).unwrap();
    let options = ReplayOptions::from_strategy(&strategy);
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4)).without_body_hashes();
    replay_session(session, &mut measurer, &options)
}

fn cost(replay: &SessionReplay) -> f64 {
    replay.calls.iter().filter_map(|c| c.metrics.as_ref()).map(|m| m.cost_usd).sum()
}

fn main_compactions(replay: &SessionReplay) -> usize {
    replay.calls.iter().filter(|c| c.lane == "main" && c.events.iter().any(|e| e == "compaction")).count()
}

#[test]
fn whatif_default_setting_replays_the_recorded_compactions() {
    let session = session(SPOTTER);
    let replay = check(&session, &[]);
    assert!(replay.compaction_whatif.is_none());
    assert!(replay.first_divergence.is_none());
    assert_eq!(main_compactions(&replay), 1);
}

/// The issue's target: sweeping the buffer on a session with a recorded auto compaction (at main
/// call `recorded_call`) moves the compaction point monotonically and gives at least three
/// distinct outcomes.
fn check_buffer_moves_the_compaction(path: &str, recorded_call: usize) {
    let session = session(path);
    let mut first_points = Vec::new();
    let mut costs = Vec::new();
    for buffer in [30_000, 60_000, 100_000] {
        let replay = check(&session, &[&format!("compact.autocompact.buffer_tokens={buffer}")]);
        let whatif = replay.compaction_whatif.as_ref().expect("a what-if");
        assert!(whatif.converged, "buffer {buffer}: {whatif:?}");
        assert_eq!(whatif.threshold, 200_000 - 20_000 - buffer);
        let first = whatif.changes.first().expect("a change");
        assert_eq!(first.change, "inserted", "{whatif:?}");
        assert!(first.pre_tokens >= whatif.threshold);
        assert!(first.call < recorded_call, "{whatif:?}");
        // The recorded compaction is no longer needed there.
        assert!(whatif.changes.iter().any(|c| c.change == "removed" && c.call == recorded_call), "{whatif:?}");
        let (at, why) = replay.first_divergence.clone().expect("replies diverge");
        assert!(why.contains("compacts before main call"), "{why}");
        assert!(at > 0);
        first_points.push(first.call);
        costs.push((cost(&replay) * 1e6).round() as i64);
    }
    assert!(first_points.windows(2).all(|w| w[0] > w[1]), "{path}: compaction points {first_points:?}");
    let recorded = (cost(&check(&session, &[])) * 1e6).round() as i64;
    costs.push(recorded);
    costs.sort_unstable();
    costs.dedup();
    assert!(costs.len() >= 3, "{path}: {costs:?}");
}

#[test]
fn whatif_autocompact_buffer_moves_the_compaction_of_a_real_session() {
    check_buffer_moves_the_compaction(SPOTTER, 102);
}

/// The same on a cipher-box session (2.1.39, its recorded auto compaction before main call 155).
#[test]
fn whatif_autocompact_buffer_moves_the_compaction_of_a_cipher_box_session() {
    check_buffer_moves_the_compaction(CIPHER_BOX, 155);
}

#[test]
fn whatif_disabled_autocompact_keeps_the_history() {
    let session = session(CD95);
    let recorded = check(&session, &[]);
    let replay = check(&session, &["compact.autocompact.enabled=false"]);
    let whatif = replay.compaction_whatif.as_ref().unwrap();
    let removed: Vec<usize> = whatif.changes.iter().filter(|c| c.change == "removed").map(|c| c.call).collect();
    assert_eq!(removed, vec![50, 127, 220], "{whatif:?}");
    assert_eq!(main_compactions(&replay), 0);
    let peak = |r: &SessionReplay| r.calls.iter().map(|c| c.simulated_context()).max().unwrap();
    assert!(peak(&replay) > peak(&recorded) + 100_000, "{} vs {}", peak(&replay), peak(&recorded));
    // DISABLE_COMPACT removes manual ones too; the percentage override lowers the threshold.
    let pct = check(&session, &["compact.autocompact.pct_override=50"]);
    let whatif = pct.compaction_whatif.as_ref().unwrap();
    assert_eq!(whatif.threshold, 84_000);
    assert!(whatif.changes.iter().any(|c| c.change == "inserted" && c.call < 50), "{whatif:?}");
}

/// The edited session's views are the client's: after an inserted compaction the conversation
/// restarts from the summary; after a removed one it carries the whole history on.
#[test]
fn whatif_compaction_edits_rebuild_the_views() {
    let session = session(SPOTTER);
    let main: Vec<_> = session.calls.iter().filter(|c| c.lane == "main" && !c.is_synthetic).collect();
    let at = main[40];
    let edited = session.with_compaction_edits(&[CompactionEdit::Insert {
        before: at.event_index,
        pre_tokens: 123_456,
        summary: "stand-in".into(),
        summary_output_tokens: 3_000,
        model: at.model.clone(),
    }]);
    assert_eq!(edited.calls.len(), session.calls.len() + 1, "the summary request is a call");
    let moved = edited.calls.iter().find(|c| c.message_id == at.message_id).unwrap();
    let messages = edited.messages_for_call(moved);
    assert_eq!(messages.len(), 1, "the call after the compaction sees the summary only");
    let text = serde_json::to_string(&messages[0].content).unwrap();
    assert!(text.contains(SUMMARY_OPENING) && text.contains("stand-in"), "{text}");
    let next = edited.calls.iter().find(|c| c.message_id == main[41].message_id).unwrap();
    let messages = edited.messages_for_call(next);
    assert!(serde_json::to_string(&messages[0].content).unwrap().contains(SUMMARY_OPENING));
    assert!(messages.windows(2).all(|w| w[0].role != w[1].role));
    let summary_request = edited.calls.iter().find(|c| c.lane == "compact" && c.message_id.as_deref().is_some_and(|m| m.starts_with("ctxsim-"))).unwrap();
    assert_eq!(summary_request.usage.output_tokens, 3_000);

    // Removing the recorded boundary: the first call after it sees the history again.
    let boundary = session.recording.events.iter().position(|e| e.lane == "main" && matches!(e.kind, EventKind::Compaction(_))).unwrap();
    let after = session.calls.iter().find(|c| c.lane == "main" && c.event_index > boundary).unwrap();
    let before = session.calls.iter().rfind(|c| c.lane == "main" && c.event_index < boundary).unwrap();
    let edited = session.with_compaction_edits(&[CompactionEdit::Remove { boundary }]);
    assert!(edited.calls.iter().all(|c| !(c.lane == "compact" && c.event_index > before.event_index && c.event_index < boundary)));
    let view_before = session.messages_for_call(before);
    let after = edited.calls.iter().find(|c| c.message_id == after.message_id).unwrap();
    let view_after = edited.messages_for_call(after);
    assert!(view_after.len() > view_before.len(), "{} vs {}", view_after.len(), view_before.len());
    assert_eq!(view_after[0], view_before[0]);
    assert_eq!(view_after[0].role, Role::User);
    assert!(view_after.windows(2).all(|w| w[0].role != w[1].role));
}

/// A reply streamed as several records is one event held by every record's node; a compaction
/// inserted before it restarts the conversation from the summary whichever record's uuid sorts
/// first (the call's view starts from its first record's parent).
#[test]
fn whatif_compaction_before_a_multi_record_reply_drops_the_history() {
    let session = session(E7662);
    let main: Vec<_> = session.calls.iter().filter(|c| c.lane == "main" && !c.is_synthetic).collect();
    // Main call 41 of this file is a thinking record then a text record whose uuid sorts after it.
    for at in [main[1], main[41]] {
        let edited = session.with_compaction_edits(&[CompactionEdit::Insert {
            before: at.event_index,
            pre_tokens: 90_000,
            summary: "stand-in".into(),
            summary_output_tokens: 3_000,
            model: at.model.clone(),
        }]);
        let moved = edited.calls.iter().find(|c| c.message_id == at.message_id).unwrap();
        let messages = edited.messages_for_call(moved);
        assert_eq!(messages.len(), 1, "main call {}: the call after the compaction sees the summary only", at.index);
        assert!(serde_json::to_string(&messages[0].content).unwrap().contains(SUMMARY_OPENING));
    }
}

/// A session that starts mid-conversation (146k tokens of history older than the file) under a
/// threshold it is already over: the what-if compacts once per fill of the window, not at every
/// call. After each compaction the context is under the threshold (the recorded usage after an
/// inserted compaction is not taken as the new segment's size), each summary request forks the
/// main thread as it stands, and the cost stays near the recorded session's.
#[test]
fn whatif_lower_threshold_on_a_mid_conversation_session_compacts_once_per_fill() {
    let session = session(E7662);
    assert!(session.recording.header.head_truncated);
    let recorded = check(&session, &[]);
    for pct in [50, 60] {
        let replay = check(&session, &[&format!("compact.autocompact.pct_override={pct}")]);
        let whatif = replay.compaction_whatif.as_ref().expect("a what-if");
        assert!(whatif.converged, "{whatif:?}");
        let inserted = whatif.changes.iter().filter(|c| c.change == "inserted").count();
        // The file grows the context by about 90k after a first compaction at its start.
        assert!((1..=3).contains(&inserted), "pct {pct}: {whatif:?}");
        assert_eq!(whatif.changes[0].call, 1, "{whatif:?}");
        let mut last_main = None;
        for call in replay.calls.iter().filter(|c| c.compared()) {
            if call.lane == "main" {
                if call.events.iter().any(|e| e == "compaction") {
                    assert!(call.simulated_context() < whatif.threshold, "pct {pct}: call {} after a compaction at {}", call.index, call.simulated_context());
                }
                last_main = Some(call.simulated_context());
            } else if call.lane == "compact" {
                let main = last_main.expect("a main call before the summary request");
                assert!(call.simulated_context() <= main + main / 10 + 5_000, "pct {pct}: summary request {} at {} after main at {main}", call.index, call.simulated_context());
            }
        }
        assert!(cost(&replay) < 1.5 * cost(&recorded), "pct {pct}: {} vs {}", cost(&replay), cost(&recorded));
    }
}

/// The output reserve left unset is the recorded version's (32,000 before 2.1.37); set to any
/// value, including the 2.1.88 default of 20,000, it is that value and moves the compactions.
#[test]
fn whatif_output_reserve_unset_is_the_versions_and_set_is_honoured() {
    let session = session(CD95);
    let config = ctxsim::agent::compact::config::AutocompactConfig::default();
    assert_eq!(config.max_output_reserve_tokens, None);
    let replay = check(&session, &["compact.autocompact.max_output_reserve_tokens=20000"]);
    let whatif = replay.compaction_whatif.as_ref().expect("a set reserve is a what-if");
    assert_eq!(whatif.threshold, 200_000 - 20_000 - 13_000);
    // Unset, the version's reserve: the threshold the recorded compactions fired at.
    let table = ModelTable::shipped();
    let unset = ctxsim::replay::triggers::client_thresholds(&session, &check(&session, &[]), &table, &config).4;
    assert_eq!(unset.autocompact, 200_000 - 32_000 - 13_000);
}

/// Replays shared between strategies (a sweep's points) give what each replay alone gives.
#[test]
fn whatif_shared_replays_equal_separate_ones() {
    let session = session(SPOTTER);
    let memo = ctxsim::replay::whatif::ReplayMemo::new();
    let measurer = || Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4)).without_body_hashes();
    let digest = |r: &SessionReplay| serde_json::to_string(&(r.rows(), &r.compaction_whatif, &r.first_divergence)).unwrap();
    for sets in [&["compact.autocompact.buffer_tokens=60000"][..], &["compact.autocompact.buffer_tokens=60000", "ttl_main=1h"], &["ttl_main=1h"], &[]] {
        let sets: Vec<String> = sets.iter().map(|s| (*s).to_owned()).collect();
        let options = ReplayOptions::from_strategy(&Strategy::resolve_with("claude-code", &sets).unwrap());
        let alone = replay_session(&session, &mut measurer(), &options);
        let shared = ctxsim::replay::session::replay_session_shared(&session, &mut measurer(), &options, &memo);
        assert_eq!(digest(&alone), digest(&shared), "{sets:?}");
    }
    let (made, asked) = memo.counts();
    assert!(made < asked, "the two buffer points share their plan search: {made} of {asked}");
}

/// The environment variables users set reach real sessions as `env.NAME` keys, exactly as the
/// knobs they set.
#[test]
fn whatif_client_env_vars_reach_real_sessions() {
    let session = session(CD95);
    let by_env = check(&session, &["env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=50"]);
    let by_knob = check(&session, &["compact.autocompact.pct_override=50"]);
    assert_eq!(by_env.compaction_whatif, by_knob.compaction_whatif);
    assert_eq!(by_env.compaction_whatif.as_ref().unwrap().threshold, 84_000);
    let window = check(&session, &["env.CLAUDE_CODE_AUTO_COMPACT_WINDOW=120000"]);
    assert_eq!(window.compaction_whatif.as_ref().unwrap().threshold, 120_000 - 32_000 - 13_000);
    for var in ["env.DISABLE_AUTO_COMPACT=1", "env.DISABLE_COMPACT=1"] {
        let replay = check(&session, &[var]);
        let whatif = replay.compaction_whatif.as_ref().unwrap();
        assert!(whatif.changes.iter().filter(|c| c.change == "removed").count() >= 3, "{var}: {whatif:?}");
        assert_eq!(main_compactions(&replay), 0, "{var}");
        assert!(replay.first_divergence.is_some(), "{var}");
    }
    let err = Strategy::resolve_with("claude-code", &["env.NOT_A_CLIENT_VAR=1".to_owned()]).unwrap_err();
    assert!(err.to_string().contains("NOT_A_CLIENT_VAR"), "{err}");
}

/// Lower tool result thresholds replace the large recorded results by their previews: the
/// context shrinks from the first one on and the replies diverge there.
#[test]
fn whatif_tool_result_budget_reaches_real_sessions() {
    let session = session(SPOTTER);
    let recorded = check(&session, &[]);
    let replay = check(&session, &["compact.tool_result_budget.default_chars=3000", "compact.tool_result_budget.per_tool_chars={}"]);
    let (at, why) = replay.first_divergence.clone().expect("the budget fired");
    assert!(why.contains("tool result budget"), "{why}");
    let total = |r: &SessionReplay| r.calls.iter().map(|c| c.simulated_context()).sum::<u64>();
    assert!(total(&replay) < total(&recorded), "{} vs {}", total(&replay), total(&recorded));
    let before: Vec<u64> = recorded.calls.iter().take_while(|c| c.index < at).map(|c| c.simulated_context()).collect();
    let after: Vec<u64> = replay.calls.iter().take_while(|c| c.index < at).map(|c| c.simulated_context()).collect();
    assert_eq!(before, after, "nothing changes before the first replaced result");
    assert!(ctxsim::replay::session::knob_on_real_sessions("compact.tool_result_budget.default_chars"));
}

/// References: paths hold a `/` and a letter; identifiers are snake_case or camelCase.
#[test]
fn whatif_loss_references_are_paths_and_identifiers() {
    let mut refs = std::collections::BTreeSet::new();
    ctxsim::replay::loss::references("Edit src/replay/loss.rs: call compaction_loss and parseVersion, not the word Compaction (or 12/3).", &mut refs);
    let refs: Vec<&str> = refs.iter().map(String::as_str).collect();
    assert_eq!(refs, ["compaction_loss", "parseVersion", "src/replay/loss.rs"]);
    // A Windows client's file, in the spellings its tool inputs and results use, is one reference.
    let mut refs = std::collections::BTreeSet::new();
    ctxsim::replay::loss::references(r#"Read D:\omp\src\Git.go; grep d:/omp/src/git.go:12; printf("s:\n")"#, &mut refs);
    assert_eq!(refs.into_iter().collect::<Vec<_>>(), ["/d/omp/src/git.go"]);
}

/// Each compaction of a real session says what it lost: the recorded one, and the ones a what-if
/// inserts (whose stand-in summary names none of the files and identifiers the later turns use).
#[test]
fn whatif_information_loss_per_compaction_on_a_real_session() {
    let session = session(SPOTTER);
    let recorded = check(&session, &[]);
    assert_eq!(recorded.compaction_losses.len(), 1, "{:?}", recorded.compaction_losses);
    let loss = &recorded.compaction_losses[0];
    assert!(loss.tokens_dropped > 50_000, "{loss:?}");
    assert!(loss.references_lost <= loss.references_dropped && loss.lost.len() <= loss.references_lost.min(5), "{loss:?}");
    // The lost references are used later and are not in the request after the compaction.
    let after = session.messages_for_call(&session.calls[loss.call]);
    let text = serde_json::to_string(&after).unwrap();
    assert!(loss.lost.iter().all(|r| !text.contains(r.as_str()) || r.len() < 6), "{loss:?}");

    let whatif = check(&session, &["compact.autocompact.buffer_tokens=60000"]);
    let inserted = whatif.compaction_whatif.as_ref().unwrap().changes.iter().filter(|c| c.change == "inserted").count();
    assert_eq!(whatif.compaction_losses.len(), inserted, "{:?}", whatif.compaction_losses);
    let first = &whatif.compaction_losses[0];
    assert!(first.references_lost > 0 && first.tokens_dropped > 0, "{first:?}");
    assert!(first.lost.windows(2).all(|w| w[0] < w[1]));
    // Shown per strategy in compare's notes and the sweep's columns.
    let e = ctxsim::report::compare::Evaluation {
        input: "spotter.jsonl".into(),
        strategy: "buffer-60k".into(),
        kind: "recording",
        summary: ctxsim::measure::Summary::from_rows("spotter.jsonl", "buffer-60k", "chars4", &[], 0),
        compactions: Default::default(),
        replies_diverge: true,
        divergence: None,
        same_results_as: None,
        set_no_effect: Vec::new(),
        compaction_losses: whatif.compaction_losses.clone(),
        engine: Some("replay"),
        agent: None,
        rows: Vec::new(),
    };
    let lines = e.compaction_loss_lines();
    assert_eq!(lines.len(), inserted);
    assert!(lines[0].contains(&format!("{} tokens dropped, {} of {} dropped references used later", first.tokens_dropped, first.references_lost, first.references_dropped)), "{}", lines[0]);
}

/// The information loss judged from the references memoized per event (shared by a session and
/// every session edited from it) equals the loss found by scanning every text again: on every
/// real session, each recorded main-lane compaction, in the session, after it and in sessions
/// edited from it (a compaction inserted, the recorded one removed), whichever is judged first.
#[test]
fn whatif_compaction_loss_from_the_memo_equals_a_scan() {
    use ctxsim::replay::loss::{compaction_loss, compaction_loss_by_scan};
    let judge = |s: &ImportedSession, at: usize, summary: Option<&str>| {
        // `at`: position of a main call after a compaction; the previous main call before it.
        let previous = s.calls[..at].iter().rposition(|c| c.lane == "main").unwrap();
        let mut after = s.messages_for_call(&s.calls[at]);
        if let Some(summary) = summary {
            after.push(ctxsim::api::Message::user_text(summary));
        }
        let memo = compaction_loss(s, at, previous, &after, 150_000, 20_000);
        let scan = compaction_loss_by_scan(s, at, previous, &after, 150_000, 20_000);
        assert_eq!(memo, scan, "{} call {at}", s.report.input);
        // Again: the long texts of `after` from the memo by content this time.
        assert_eq!(compaction_loss(s, at, previous, &after, 150_000, 20_000), scan, "{} call {at}, judged again", s.report.input);
        memo
    };
    let mut judged = 0;
    let mut lost = 0;
    for path in crate::support::real_transcripts() {
        let session = load_session(&path).unwrap();
        let main: Vec<usize> = (0..session.calls.len()).filter(|&p| session.calls[p].lane == "main" && !session.calls[p].is_synthetic).collect();
        if main.len() < 4 {
            continue;
        }
        let after_boundary = |s: &ImportedSession| -> Vec<(usize, usize)> {
            let boundaries: Vec<usize> = s.recording.events.iter().enumerate().filter(|(_, e)| e.lane == "main" && matches!(e.kind, EventKind::Compaction(_))).map(|(i, _)| i).collect();
            boundaries
                .iter()
                .filter_map(|&b| s.calls.iter().position(|c| c.lane == "main" && c.event_index > b && s.calls.iter().any(|p| p.lane == "main" && p.event_index < b)).map(|p| (b, p)))
                .collect()
        };
        // An edited session judged before its session: its memo is the session's.
        let at = &session.calls[main[main.len() / 2]];
        let edit = CompactionEdit::Insert { before: at.event_index, pre_tokens: 100_000, summary: "stand-in naming src/replay/loss.rs".into(), summary_output_tokens: 2_000, model: at.model.clone() };
        let inserted = session.with_compaction_edits(&[edit]);
        let moved = inserted.calls.iter().position(|c| c.message_id == at.message_id).unwrap();
        lost += judge(&inserted, moved, Some("stand-in naming src/replay/loss.rs and parse_line")).references_lost;
        judged += 1;
        for (boundary, at) in after_boundary(&session) {
            lost += judge(&session, at, None).references_lost;
            let removed = session.with_compaction_edits(&[CompactionEdit::Remove { boundary }]);
            for (_, at) in after_boundary(&removed) {
                judge(&removed, at, None);
            }
            judged += 1;
        }
        // An edit of an edited session: its events reach the first session's memo.
        let later = inserted.calls[moved + 1..].iter().find(|c| c.lane == "main" && !c.is_synthetic).unwrap();
        let twice = inserted.with_compaction_edits(&[CompactionEdit::Insert {
            before: later.event_index,
            pre_tokens: 100_000,
            summary: "another stand-in".into(),
            summary_output_tokens: 2_000,
            model: later.model.clone(),
        }]);
        for (_, at) in after_boundary(&twice) {
            judge(&twice, at, Some("another stand-in"));
        }
    }
    assert!(judged >= 20 && lost > 0, "{judged} judged, {lost} lost");
}

/// A projection of a message list that the replay must keep: per message its role and its
/// blocks' kinds and ids (parallel results as a set: the client sends them in tool_use order).
fn projection(messages: &[ctxsim::api::Message]) -> Projected {
    use ctxsim::api::ContentBlock;
    messages
        .iter()
        .map(|m| {
            let mut blocks: Vec<String> = m
                .content
                .to_blocks()
                .iter()
                .map(|b| match b {
                    ContentBlock::ToolUse { id, .. } => format!("use {id}"),
                    ContentBlock::ToolResult { tool_use_id, .. } => format!("result {tool_use_id}"),
                    ContentBlock::Text { text, .. } => format!("text {}", text.len()),
                    other => other.kind().to_owned(),
                })
                .collect();
            blocks.sort_by_key(|b| !b.starts_with("result"));
            let results = blocks.iter().take_while(|b| b.starts_with("result")).count();
            blocks[..results].sort();
            (format!("{:?}", m.role), blocks)
        })
        .collect()
}

/// Per real session: its as-recorded replay's main-lane requests, projected, and the recorded
/// views of the same calls, projected; replayed once per session.
type Projected = Vec<(String, Vec<String>)>;
type Views = Vec<(usize, Projected, Projected)>;

fn as_recorded_views(k: usize) -> &'static Views {
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<std::collections::BTreeMap<usize, &'static Views>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(views) = cache.lock().unwrap().get(&k) {
        return views;
    }
    let path = &crate::support::real_transcripts()[k];
    let session = load_session(path).unwrap();
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4)).without_body_hashes();
    let mut requests = Vec::new();
    let replay = ctxsim::replay::session::replay_session_observed(&session, &mut measurer, &ReplayOptions::default(), &mut |call, request| {
        if session.calls[call].lane == "main" {
            requests.push((call, projection(&request.messages)));
        }
    });
    assert!(replay.first_divergence.is_none(), "{}: an as-recorded replay does not diverge", path.display());
    // A resumed client loads its history back from the transcript and loses parallel tool
    // uses that are off the parentUuid chain: its view is no longer the transcript's. The
    // property covers the calls before the first new process.
    let resumed = session.recording.events.iter().position(|e| {
        let text = format!("{:?}", e.kind);
        text.contains("SessionStart:resume") || text.contains("<command-name>/exit") || text.contains("<command-name>/quit")
    });
    requests.retain(|(call, _)| resumed.is_none_or(|r| session.calls[*call].event_index < r));
    let views: Views = requests.into_iter().map(|(call, built)| (call, built, projection(&session.messages_for_call(&session.calls[call])))).collect();
    let views: &'static Views = Box::leak(Box::new(views));
    cache.lock().unwrap().insert(k, views);
    views
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..proptest::prelude::ProptestConfig::default() })]

    /// An as-recorded replay with no divergence builds requests whose messages are the
    /// recorded ones in order: the same roles, tool uses, results and texts, message for
    /// message; only the first message carries more (the unrecorded user context and the files a
    /// compaction restores, around the recorded blocks).
    #[test]
    fn whatif_as_recorded_requests_hold_the_recorded_messages_in_order(k in 0usize..16, at in 0.0f64..1.0) {
        let k = k % crate::support::real_transcripts().len();
        let views = as_recorded_views(k);
        proptest::prop_assume!(!views.is_empty());
        let (call, built, recorded) = &views[((views.len() as f64 * at) as usize).min(views.len() - 1)];
        proptest::prop_assert_eq!(built.len(), recorded.len(), "call {}", call);
        for (i, (b, r)) in built.iter().zip(recorded).enumerate() {
            proptest::prop_assert_eq!(&b.0, &r.0, "call {} message {}", call, i);
            if i == 0 {
                let found = (0..=b.1.len().saturating_sub(r.1.len())).any(|o| b.1[o..o + r.1.len()] == r.1[..]);
                proptest::prop_assert!(found, "call {} first message {:?} holds {:?}", call, b.1, r.1);
            } else {
                proptest::prop_assert_eq!(&b.1, &r.1, "call {} message {}", call, i);
            }
        }
    }
}

/// The plan of a compaction what-if reads counts only, so its search replays skip judging the
/// compactions' information loss (`ReplayOptions::compaction_losses`): a replay without it
/// equals one with it but for the losses, and the what-if's own replay still carries them,
/// also when it is the search's last replay (the planning options, main TTL 5m) and shared.
#[test]
fn whatif_plan_search_skips_the_loss_judging_and_the_result_keeps_it() {
    let measurer = || Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4)).without_body_hashes();
    let digest = |r: &SessionReplay| serde_json::to_string(&(r.rows(), &r.compaction_whatif, &r.first_divergence, &r.compaction_losses)).unwrap();
    for path in [SPOTTER] {
        let session = session(path);
        let recorded = ReplayOptions::from_strategy(&Strategy::resolve_with("claude-code", &[]).unwrap());
        let judged = replay_session(&session, &mut measurer(), &recorded);
        let plain = replay_session(&session, &mut measurer(), &ReplayOptions { compaction_losses: false, ..recorded.clone() });
        assert!(!judged.compaction_losses.is_empty(), "{path}");
        assert!(plain.compaction_losses.is_empty(), "{path}");
        let counts = |r: &SessionReplay| serde_json::to_string(&(r.rows(), &r.first_divergence)).unwrap();
        assert_eq!(counts(&judged), counts(&plain), "{path}");
        for sets in [&["compact.autocompact.pct_override=50"][..], &["compact.autocompact.pct_override=50", "ttl_main=1h"]] {
            let sets: Vec<String> = sets.iter().map(|s| (*s).to_owned()).collect();
            let options = ReplayOptions::from_strategy(&Strategy::resolve_with("claude-code", &sets).unwrap());
            let alone = replay_session(&session, &mut measurer(), &options);
            let inserted = alone.compaction_whatif.as_ref().unwrap().changes.iter().filter(|c| c.change == "inserted").count();
            assert!(inserted > 0 && alone.compaction_losses.len() >= inserted, "{path} {sets:?}: {:?}", alone.compaction_losses);
            let memo = ctxsim::replay::whatif::ReplayMemo::new();
            let shared = ctxsim::replay::session::replay_session_shared(&session, &mut measurer(), &options, &memo);
            assert_eq!(digest(&alone), digest(&shared), "{path} {sets:?}");
        }
    }
}
