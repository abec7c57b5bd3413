//! Recording format, Claude Code transcript import and claude-trace conversion, on the real
//! public data in `../shared/realdata`.

use std::io::Cursor;
use std::path::{Path, PathBuf};

use ctxsim::api::{ContentBlock, MessageContent, Request, Role, Usage};
use ctxsim::recording::{
    self, Attachment, Compaction, Event, EventKind, Header, InputFormat, ModelReply, Recording, SystemEvent,
    TimeAdvance, ToolResult, UsageTotals, UserPrompt, WarningKind,
};
use proptest::prelude::*;
use serde_json::{Value, json};

fn realdata() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/realdata")).to_path_buf()
}

/// Every main session transcript of the real data (subagent files are reached through them).
fn transcripts() -> Vec<PathBuf> {
    let files = crate::support::real_transcripts();
    assert!(files.len() >= 6, "expected the real transcripts, found {files:?}");
    files
}

fn trace_capture() -> PathBuf {
    realdata().join("api_captures/claude-trace/test-traffic.jsonl")
}

/// Reads a recording from text and checks which lines were reported, and how.
fn check_read(text: &str, expect_events: usize, expect_warnings: &[(usize, WarningKind)]) -> recording::ReadRecording {
    let read = recording::read_recording_from(Cursor::new(text.as_bytes()), "test.jsonl").expect("header is fine");
    let got: Vec<(usize, WarningKind)> = read.warnings.list.iter().map(|w| (w.line, w.kind)).collect();
    assert_eq!(got, expect_warnings, "warnings: {:#?}", read.warnings.list);
    assert_eq!(read.recording.events.len(), expect_events);
    read
}

fn sample_recording() -> Recording {
    let mut header = Header::new("scenario");
    header.session_id = Some("s1".into());
    let reply = ModelReply {
        content: vec![ContentBlock::text("hi"), ContentBlock::tool_use("toolu_1", "Read", json!({"file_path": "a.rs"}))].into(),
        stop_reason: Some(ctxsim::api::StopReason::ToolUse),
        model: "claude-sonnet-4-5".into(),
        version: Some("2.1.39".into()),
        usage: Usage { input_tokens: 3, cache_read_input_tokens: 100, output_tokens: 9, ..Usage::default() },
        request_id: Some("req_1".into()),
        request_ref: None,
        message_id: Some("msg_1".into()),
        thinking_text_stored: true,
        is_synthetic: false,
        is_api_error: false,
    };
    let mut sub = Event::new(EventKind::Time(TimeAdvance { advance_ms: 500 }), 1500);
    sub.lane = "subagent:a1".into();
    Recording {
        header,
        events: vec![
            Event::new(
                EventKind::UserPrompt(UserPrompt { content: MessageContent::Text("read a.rs".into()), is_meta: false, is_compact_summary: false, permission_mode: None }),
                0,
            ),
            Event::new(EventKind::ModelReply(reply), 1000),
            Event::new(
                EventKind::ToolResult(ToolResult {
                    tool_use_id: "toolu_1".into(),
                    content: Some(ctxsim::api::ToolResultContent::Text("fn main() {}".into())),
                    is_error: false,
                    tool_use_result: None,
                }),
                1200,
            ),
            sub,
            Event::new(
                EventKind::Compaction(Compaction {
                    trigger: "auto".into(),
                    pre_tokens: Some(155068),
                    post_tokens: None,
                    summary: Some("summary".into()),
                    metadata: json!({"trigger": "auto", "preTokens": 155068}),
                }),
                2000,
            ),
            Event::new(EventKind::SystemEvent(SystemEvent { subtype: "turn_duration".into(), payload: json!({"durationMs": 5}) }), 2100),
            Event::new(EventKind::Attachment(Attachment { attachment_type: "date_change".into(), payload: json!({"type": "date_change"}) }), 2200),
        ]
        .into(),
    }
}

fn recording_text(recording: &Recording) -> String {
    let mut out = Vec::new();
    recording::write_recording_to(recording, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Recording format

#[test]
fn recording_round_trips_through_file() {
    let original = sample_recording();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    recording::write_recording(&path, &original).unwrap();
    let read = recording::read_recording(&path).unwrap();
    assert!(read.warnings.is_empty(), "{:?}", read.warnings);
    assert_eq!(read.recording, original);
    // Only the destination is left behind: the temporary file was renamed, not copied.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "not the temporary file's owner-only mode");
    }
    let first = std::fs::read_to_string(&path).unwrap();
    assert!(first.starts_with(r#"{"ctxsim_recording":1,"source":"scenario","session_id":"s1""#), "{first}");
    assert!(first.lines().nth(1).unwrap().starts_with(r#"{"event":"user_prompt""#));
}

#[test]
fn recording_reader_skips_bad_line_and_names_path() {
    let mut lines: Vec<String> = recording_text(&sample_recording()).lines().map(str::to_owned).collect();
    // Line 3 (the model reply): a string where usage wants a number.
    lines[2] = lines[2].replace(r#""input_tokens":3"#, r#""input_tokens":"three""#);
    let text = lines.join("\n") + "\n";
    let read = check_read(&text, 6, &[(3, WarningKind::BadLine)]);
    let warning = read.warnings.first_bad_line().unwrap();
    assert_eq!(warning.path.as_deref(), Some("usage.input_tokens"), "{warning}");
    assert!(warning.to_string().starts_with("test.jsonl:3: skipped bad line at `usage.input_tokens`"), "{warning}");
}

#[test]
fn recording_reader_reports_truncated_tail() {
    let text = recording_text(&sample_recording());
    let cut = &text[..text.len() - 10];
    check_read(cut, 6, &[(8, WarningKind::TruncatedTail)]);
}

#[test]
fn recording_reader_unknown_event_is_bad_line() {
    let text = recording_text(&sample_recording()) + "{\"event\":\"teleport\",\"time_ms\":5}\n\n";
    let read = check_read(&text, 7, &[(9, WarningKind::BadLine)]);
    assert!(read.warnings.list[0].message.contains("teleport"), "{}", read.warnings.list[0]);
}

#[test]
fn recording_reader_header_errors_are_fatal_and_named() {
    let err = recording::read_recording_from(Cursor::new(b"\n\n".as_slice()), "e.jsonl").unwrap_err();
    assert!(err.to_string().contains("e.jsonl: the file is empty"), "{err}");
    let err = recording::read_recording_from(Cursor::new(br#"{"ctxsim_recording":1}"#.as_slice()), "h.jsonl").unwrap_err();
    assert!(err.to_string().contains("h.jsonl:1: bad header"), "{err}");
    assert!(err.to_string().contains("source"), "{err}");
    let err = recording::read_recording_from(Cursor::new(br#"{"ctxsim_recording":7,"source":"x"}"#.as_slice()), "v.jsonl")
        .unwrap_err();
    assert!(err.to_string().contains("unsupported recording version 7"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Claude Code transcripts

/// Entire's `metadata.json` beside its transcripts carries the session's billed totals; the
/// importer's de-duplicated sums must equal them exactly.
#[test]
fn recording_claude_code_totals_match_entire_metadata() {
    let dir = realdata().join("transcripts/entireio-cli");
    let mut checked = 0;
    for transcript in transcripts().into_iter().filter(|p| p.starts_with(&dir)) {
        let name = transcript.file_name().unwrap().to_str().unwrap();
        let meta_path = dir.join(name.replace(".full.jsonl", ".metadata.json"));
        let meta: Value = serde_json::from_str(&std::fs::read_to_string(&meta_path).unwrap()).unwrap();
        let Some(expected) = meta.get("token_usage").filter(|t| !t.is_null()) else { continue };
        let session = recording::import_claude_code(&transcript).unwrap();
        let got: &UsageTotals = &session.report.totals_main_file;
        let field = |k: &str| expected[k].as_u64().unwrap();
        assert_eq!(
            (got.input_tokens, got.output_tokens, got.cache_read_tokens, got.cache_creation_tokens, got.api_call_count),
            (
                field("input_tokens"),
                field("output_tokens"),
                field("cache_read_tokens"),
                field("cache_creation_tokens"),
                field("api_call_count")
            ),
            "{name}: importer totals {got:?} vs metadata {expected}"
        );
        // No subagent files beside these, so the main file is the whole session.
        assert_eq!(session.report.totals_all, *got);
        checked += 1;
    }
    assert_eq!(checked, 3, "three of the Entire sessions carry token_usage");
}

/// Appending to the previous call's messages (`ViewCache`) gives exactly what rebuilding each
/// call's view gives, for every call of every real transcript (compactions, rewinds, parallel
/// results off the chain, subagents).
#[test]
fn recording_cached_views_equal_rebuilt_views() {
    use ctxsim::api::identical::Identical;
    let (mut calls, mut appended) = (0, 0);
    for path in transcripts() {
        let session = recording::import_claude_code(&path).unwrap();
        let mut cache = recording::ViewCache::default();
        for call in &session.calls {
            let cached = session.messages_for_call_cached(call, 0, &mut cache);
            assert!(cached.identical(&session.messages_for_call_loaded(call, 0)), "{}: call {}", path.display(), call.index);
        }
        calls += session.calls.len();
        appended += cache.appended as usize;
    }
    // Most calls extend the view of the call before them in their lane.
    assert!(appended * 10 > calls * 9, "{appended} of {calls} calls appended");
}

/// The `parentUuid` walk continued from the previous call's (`view_event_indices_cached`) gives
/// the indices of a walk of its own, for every call of every real transcript: in order, resumed
/// half-way, and in orders that meet the previous walk off its leaf (backwards, interleaved).
#[test]
fn recording_continued_chain_walks_equal_walks_of_their_own() {
    let mut checked = 0usize;
    for path in transcripts() {
        let session = recording::import_claude_code(&path).unwrap();
        let n = session.calls.len();
        let forward: Vec<usize> = (0..n).collect();
        let backward: Vec<usize> = (0..n).rev().collect();
        // Every third call, then the others: later walks meet earlier ones anywhere.
        let strided: Vec<usize> = (0..3).flat_map(|r| (r..n).step_by(3)).collect();
        let resume_at = session.calls[n / 2].event_index;
        for (order, resumed) in [(&forward, false), (&forward, true), (&backward, false), (&strided, false), (&strided, true)] {
            let mut cache = recording::ViewCache::default();
            for &k in order {
                let call = &session.calls[k];
                let loaded_until = if resumed && call.event_index > resume_at { resume_at } else { 0 };
                let own = session.view_event_indices_loaded(call, loaded_until);
                assert_eq!(session.view_event_indices_cached(call, loaded_until, &mut cache), own, "{}: call {k} (loaded until {loaded_until})", path.display());
                checked += 1;
            }
        }
    }
    assert!(checked > 1000, "{checked} walks checked");
}

/// Checks the serials of one view against every message seen with them so far: one serial,
/// one content.
fn check_serials(seen: &mut std::collections::BTreeMap<u64, ctxsim::api::Message>, messages: &[ctxsim::api::Message], serials: &[u64], what: &str) {
    use ctxsim::api::identical::Identical;
    assert_eq!(messages.len(), serials.len(), "{what}");
    for (message, serial) in messages.iter().zip(serials) {
        let first = seen.entry(*serial).or_insert_with(|| message.clone());
        assert!(first.identical(message), "{what}: serial {serial} names two different messages");
    }
}

/// The serials `ViewCache` gives (the keys a replay derives its message keys from) name one
/// content each, over appends, merges, rebuilds and resumed clients' rebuilds, in every lane of
/// every real transcript; and most messages keep theirs from call to call.
#[test]
fn recording_view_serials_name_one_message_each() {
    use ctxsim::api::identical::Identical;
    let (mut kept, mut total) = (0usize, 0usize);
    for path in transcripts() {
        let session = recording::import_claude_code(&path).unwrap();
        for resumed in [false, true] {
            let mut cache = recording::ViewCache::default();
            let mut seen = std::collections::BTreeMap::new();
            let mut previous: std::collections::BTreeMap<String, Vec<u64>> = std::collections::BTreeMap::new();
            // A client resumed half-way: from there on it loaded its history back.
            let resume_at = session.calls[session.calls.len() / 2].event_index;
            for call in &session.calls {
                let loaded_until = if resumed && call.event_index > resume_at { resume_at } else { 0 };
                let (messages, serials) = session.messages_for_call_view(call, loaded_until, &mut cache);
                let what = format!("{}: call {} (loaded until {loaded_until})", path.display(), call.index);
                assert!(messages.identical(&session.messages_for_call_loaded(call, loaded_until)[..]), "{what}");
                check_serials(&mut seen, messages, serials, &what);
                let before = previous.insert(call.lane.clone(), serials.to_vec()).unwrap_or_default();
                kept += serials.iter().zip(&before).take_while(|(a, b)| a == b).count();
                total += serials.len();
            }
            // Resumed or not, most calls extend their lane's previous view.
            assert!(cache.appended * 10 > session.calls.len() as u64 * 8, "{}: {} of {} appended", path.display(), cache.appended, session.calls.len());
        }
    }
    assert!(kept * 10 > total * 8, "{kept} of {total} message serials kept from the lane's previous call");
}

#[test]
fn recording_claude_code_imports_every_real_transcript() {
    for path in transcripts() {
        let session = recording::import_claude_code(&path).unwrap();
        let report = &session.report;
        let name = path.display();
        assert!(report.warnings.first_bad_line().is_none(), "{name}: {:#?}", report.warnings.list);
        assert!(report.unknown_by_type.is_empty(), "{name}: {:?}", report.unknown_by_type);
        assert!(report.calls > 0 && report.chunks_merged > 0, "{name}: {report:?}");
        assert_eq!(recording::detect_format(&path).unwrap(), InputFormat::ClaudeCode, "{name}");

        let events = &session.recording.events;
        // One model_reply per distinct message id, and only one.
        let mut ids: Vec<&str> = session.calls.iter().filter_map(|c| c.message_id.as_deref()).collect();
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), n, "{name}: a message id was split over several replies");
        // Every tool_use of a main-lane reply is answered by a tool_result later, except
        // possibly the last ones of the session (cut off) and interrupted calls.
        let answered: std::collections::BTreeSet<&str> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ToolResult(ToolResult { tool_use_id, .. }) => Some(tool_use_id.as_str()),
                _ => None,
            })
            .collect();
        let tool_uses: Vec<&str> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ModelReply(r) => Some(r.tool_use_ids()),
                _ => None,
            })
            .flatten()
            .collect();
        let unanswered = tool_uses.iter().filter(|id| !answered.contains(**id)).count();
        assert!(unanswered <= 3, "{name}: {unanswered} of {} tool_uses unanswered", tool_uses.len());
        // Time zero is the first record (which may be a hook progress record, not an event);
        // the header keeps it as an absolute time.
        assert!(events.last().unwrap().time_ms > 0, "{name}");
        assert!(session.recording.header.start_epoch_ms.unwrap() > 1_700_000_000_000);

        // Compactions carry their trigger and the summary that followed them.
        let compactions: Vec<&EventKind> =
            events.iter().map(|e| &e.kind).filter(|k| matches!(k, EventKind::Compaction(_))).collect();
        assert_eq!(compactions.len(), report.records_by_type.get("system:compact_boundary").copied().unwrap_or(0));
        for c in compactions {
            let EventKind::Compaction(Compaction { trigger, pre_tokens, summary, .. }) = c else { unreachable!() };
            assert!(trigger == "auto" || trigger == "manual", "{name}: {trigger}");
            assert!(pre_tokens.unwrap() > 10_000);
            assert!(summary.as_deref().is_some_and(|s| s.len() > 100), "{name}: compaction without summary");
        }

        // The written recording reads back to the same thing.
        let text = recording_text(&session.recording);
        let read = recording::read_recording_from(Cursor::new(text.as_bytes()), "rt").unwrap();
        assert!(read.warnings.is_empty(), "{name}: {:?}", read.warnings.list.first());
        assert_eq!(read.recording, session.recording, "{name}: round trip");
    }
}

#[test]
fn recording_claude_code_merges_streamed_chunks() {
    // Three lines of one call, a tool result between the 2nd and 3rd (parallel tool calls run
    // while the reply still streams), placeholder output tokens until the last line.
    let lines = [
        json!({"type":"user","uuid":"u1","parentUuid":null,"timestamp":"2026-01-01T00:00:00Z","message":{"role":"user","content":"go"}}),
        json!({"type":"assistant","uuid":"a1","parentUuid":"u1","timestamp":"2026-01-01T00:00:01Z","requestId":"req_1","version":"2.1.39",
               "message":{"id":"msg_1","model":"claude-opus-4-6","content":[{"type":"thinking","thinking":"","signature":"sig"}],
                          "stop_reason":null,"usage":{"input_tokens":3,"cache_read_input_tokens":900,"cache_creation_input_tokens":50,"output_tokens":1}}}),
        json!({"type":"assistant","uuid":"a2","parentUuid":"a1","timestamp":"2026-01-01T00:00:02Z","requestId":"req_1",
               "message":{"id":"msg_1","model":"claude-opus-4-6","content":[{"type":"tool_use","id":"t1","name":"Bash","input":{}}],
                          "stop_reason":null,"usage":{"input_tokens":3,"cache_read_input_tokens":900,"cache_creation_input_tokens":50,"output_tokens":1}}}),
        json!({"type":"user","uuid":"r1","parentUuid":"a2","timestamp":"2026-01-01T00:00:03Z","toolUseResult":{"stdout":"ok"},
               "message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}}),
        json!({"type":"assistant","uuid":"a3","parentUuid":"r1","timestamp":"2026-01-01T00:00:04Z","requestId":"req_1",
               "message":{"id":"msg_1","model":"claude-opus-4-6","content":[{"type":"tool_use","id":"t2","name":"Bash","input":{}}],
                          "stop_reason":"tool_use","usage":{"input_tokens":3,"cache_read_input_tokens":900,"cache_creation_input_tokens":50,"output_tokens":77}}}),
        json!({"type":"user","uuid":"r2","parentUuid":"a3","timestamp":"2026-01-01T00:00:05Z",
               "message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t2","content":"ok2","is_error":true}]}}),
        json!({"type":"assistant","uuid":"a4","parentUuid":"r2","timestamp":"2026-01-01T00:00:06Z","requestId":"req_2",
               "message":{"id":"msg_2","model":"claude-opus-4-6","content":[{"type":"text","text":"done"}],
                          "stop_reason":"end_turn","usage":{"input_tokens":1,"cache_read_input_tokens":1000,"output_tokens":5}}}),
        json!({"type":"mystery-record","x":1}),
    ];
    let text: String = lines.iter().map(|l| l.to_string() + "\n").collect();
    let session = recording::import_claude_code_from(Cursor::new(text.into_bytes()), "mem.jsonl").unwrap();
    let calls = &session.calls;
    assert_eq!(calls.len(), 2);
    let c = &calls[0];
    assert_eq!((c.usage.input_tokens, c.usage.cache_read_input_tokens, c.usage.output_tokens), (3, 900, 77));
    assert_eq!((c.content_blocks, c.tool_uses, c.thinking_text_stored), (3, 2, false));
    assert_eq!(c.version.as_deref(), Some("2.1.39"));
    assert_eq!(c.time_ms, 1000);
    assert_eq!(session.report.chunks_merged, 2);
    assert_eq!(session.report.unknown_by_type.get("mystery-record"), Some(&1));
    let ignored = &session.report.warnings.list[0];
    assert_eq!((ignored.line, ignored.kind), (8, WarningKind::Ignored));

    let names: Vec<&str> = session.recording.events.iter().map(Event::name).collect();
    assert_eq!(names, ["user_prompt", "model_reply", "tool_result", "tool_result", "model_reply"]);

    // The second call saw: the prompt, the merged reply, both tool results in one message.
    let messages = session.messages_for_call(&calls[1]);
    let shape: Vec<(Role, Vec<&str>)> = messages
        .iter()
        .map(|m| (m.role, match &m.content {
            MessageContent::Blocks(b) => b.iter().map(ContentBlock::kind).collect(),
            MessageContent::Text(_) => vec!["string"],
        }))
        .collect();
    assert_eq!(
        shape,
        [
            (Role::User, vec!["text"]),
            (Role::Assistant, vec!["thinking", "tool_use", "tool_use"]),
            (Role::User, vec!["tool_result", "tool_result"]),
        ]
    );
    assert!(session.messages_for_call(&calls[0]).len() == 1);
}

/// A streamed message's chunks repeat its usage byte for byte; the importer keeps the reply's
/// usage for a chunk whose text is the one that reply took last. The same transcript with every
/// usage written differently (no text repeats, each is read) imports to the same recording and
/// warnings: a repeat within one reply, after another message's chunk, with extra fields, and
/// a usage that does not read (warned at every line, never kept).
#[test]
fn recording_claude_code_repeated_usage_as_read_whole() {
    let usage = json!({"input_tokens":3,"cache_read_input_tokens":900,"cache_creation_input_tokens":50,"output_tokens":1,"service_tier":"standard","server_tool_use":{"web_search_requests":0}});
    let last = json!({"input_tokens":3,"cache_read_input_tokens":900,"cache_creation_input_tokens":50,"output_tokens":77,"service_tier":"standard","server_tool_use":{"web_search_requests":0}});
    let bad = json!({"input_tokens":"x","output_tokens":2});
    let chunk = |n: usize, id: &str, usage: &Value| {
        json!({"type":"assistant","uuid":format!("a{n}"),"parentUuid":if n == 1 { Value::Null } else { json!(format!("a{}", n - 1)) },
               "timestamp":format!("2026-01-01T00:00:{n:02}Z"),"requestId":format!("req_{id}"),
               "message":{"id":id,"model":"claude-opus-4-6","content":[{"type":"text","text":format!("part {n}")}],"stop_reason":null,"usage":usage}})
    };
    let lines = [
        chunk(1, "msg_1", &usage),
        chunk(2, "msg_1", &usage),
        chunk(3, "msg_2", &usage),
        chunk(4, "msg_1", &usage),
        chunk(5, "msg_1", &last),
        chunk(6, "msg_1", &last),
        chunk(7, "msg_1", &usage),
        chunk(8, "msg_3", &bad),
        chunk(9, "msg_3", &bad),
    ];
    let compact: String = lines.iter().map(|l| l.to_string() + "\n").collect();
    // Each usage written with spaces of its own: no two texts alike.
    let spaced: String = lines
        .iter()
        .enumerate()
        .map(|(i, l)| l.to_string().replacen("\"usage\":{", &format!("\"usage\":{{{}", " ".repeat(i + 1)), 1) + "\n")
        .collect();
    assert_ne!(compact, spaced);
    let import = |text: &str| recording::import_claude_code_from(Cursor::new(text.as_bytes().to_vec()), "mem.jsonl").unwrap();
    let (repeated, read) = (import(&compact), import(&spaced));
    assert_eq!(repeated.recording, read.recording);
    assert_eq!(repeated.calls, read.calls);
    assert_eq!(format!("{:?}", repeated.report.warnings), format!("{:?}", read.report.warnings));
    let usages: Vec<(u64, u64, Option<&Value>)> = repeated.calls.iter().map(|c| (c.usage.input_tokens, c.usage.output_tokens, c.usage.extra.get("service_tier"))).collect();
    assert_eq!(usages, [(3, 77, Some(&json!("standard"))), (3, 1, Some(&json!("standard"))), (0, 0, None)]);
    let warned: Vec<usize> = repeated.report.warnings.list.iter().map(|w| w.line).collect();
    assert_eq!(warned, [8, 9]);
}

#[test]
fn recording_claude_code_subagents_become_lanes() {
    let path = realdata().join("transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl");
    let session = recording::import_claude_code(&path).unwrap();
    let lanes: Vec<&str> = session.report.totals_by_lane.keys().map(String::as_str).collect();
    assert_eq!(lanes, ["compact", "main", "subagent:a881341"]);
    assert_eq!(session.report.totals_by_lane["subagent:a881341"].api_call_count, 3);
    assert_eq!(session.report.totals_by_lane["compact"].api_call_count, 1);
    assert_eq!(session.report.subagent_files.len(), 2);
    let sub = session.recording.header.subagents.iter().find(|s| s.agent_id == "a881341").unwrap();
    assert!(sub.tool_use_id.is_some(), "agent_progress links the subagent to its Task call: {sub:?}");
    // Subagent events are merged in time order; the main lane keeps its own order.
    let times: Vec<u64> = session.recording.events.iter().filter(|e| e.lane == "subagent:a881341").map(|e| e.time_ms).collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    let total = session.report.totals_all;
    let main = session.report.totals_main_file;
    assert!(total.api_call_count == main.api_call_count + 4 && total.input_tokens > main.input_tokens);
}

/// The rebuilt message list of each main-lane call is a valid conversation: it starts with a
/// user message, roles alternate, and after a compaction it restarts from the summary.
#[test]
fn recording_claude_code_reconstructs_what_each_call_saw() {
    for path in transcripts() {
        let session = recording::import_claude_code(&path).unwrap();
        let name = path.display();
        let mut previous_len = 0;
        let mut restarts = 0;
        for call in session.calls.iter().filter(|c| c.lane == "main" && !c.is_synthetic) {
            let messages = session.messages_for_call(call);
            assert!(!messages.is_empty(), "{name}: call {} saw nothing", call.index);
            assert_eq!(messages[0].role, Role::User, "{name}: call {}", call.index);
            assert!(messages.windows(2).all(|w| w[0].role != w[1].role), "{name}: call {}", call.index);
            if messages.len() < previous_len {
                restarts += 1;
            }
            previous_len = messages.len();
            // The body would parse as a Messages API request.
            let body = json!({"model": call.model, "max_tokens": 1, "messages": messages});
            serde_json::from_value::<Request>(body).unwrap();
        }
        let compactions = session.report.records_by_type.get("system:compact_boundary").copied().unwrap_or(0);
        // A file that opens with a compaction (its history written to an earlier file) shows no
        // restart for it: its first call already starts from the summary.
        let first_call = session.calls.iter().find(|c| c.lane == "main" && !c.is_synthetic).unwrap();
        let opening = session.recording.events
            .iter()
            .take(first_call.event_index)
            .filter(|e| e.lane == "main" && matches!(e.kind, EventKind::Compaction(_)))
            .count();
        if opening > 0 {
            assert!(session.recording.header.head_truncated, "{name}: opens with a compaction, not marked head-truncated");
            let first = session.messages_for_call(first_call);
            let text = serde_json::to_string(&first[0]).unwrap();
            assert!(text.contains("continued from a previous conversation"), "{name}: first call does not start from the summary");
        }
        assert!(restarts + opening >= compactions, "{name}: {restarts} restarts and {opening} opening for {compactions} compactions");
    }
}

#[test]
fn recording_import_writes_recording_and_detects_formats() {
    let dir = tempfile::tempdir().unwrap();
    let transcript = transcripts().into_iter().next().unwrap();
    let out = dir.path().join("session.ctxsim.jsonl");
    let report = recording::import(&transcript, None, &out).unwrap();
    assert_eq!(recording::detect_format(&out).unwrap(), InputFormat::Recording);
    let read = recording::read_recording(&out).unwrap();
    assert_eq!(read.recording.events.len(), report.events);
    assert_eq!(recording::recorded_calls(&read.recording).len(), report.calls);

    // Importing twice gives the same bytes (no clock, no hash-map order in the output).
    let twice = dir.path().join("twice.jsonl");
    recording::import(&transcript, Some(InputFormat::ClaudeCode), &twice).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&twice).unwrap());

    // Re-importing a recording gives the same bytes.
    let again = dir.path().join("again.jsonl");
    recording::import(&out, None, &again).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&again).unwrap());

    let log = dir.path().join("log.jsonl");
    let report = recording::import(&trace_capture(), None, &log).unwrap();
    assert_eq!(report.format, "claude-trace");
    assert_eq!(recording::detect_format(&log).unwrap(), InputFormat::RequestLog);
    let err = recording::import(&log, None, &dir.path().join("x")).unwrap_err();
    assert!(err.to_string().contains("ctxsim analyze"), "{err}");

    let junk = dir.path().join("junk.txt");
    std::fs::write(&junk, "\n  \nhello\n").unwrap();
    let err = recording::detect_format(&junk).unwrap_err();
    assert!(err.to_string().contains("junk.txt") && err.to_string().contains("line 3"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// claude-trace capture

#[test]
fn recording_claude_trace_converts_all_64_requests() {
    let path = trace_capture();
    assert_eq!(recording::detect_format(&path).unwrap(), InputFormat::ClaudeTrace);
    let file = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
    let converted = recording::convert_claude_trace(file, "test-traffic.jsonl").unwrap();
    assert!(converted.report.warnings.is_empty(), "{:#?}", converted.report.warnings);
    assert_eq!(converted.entries.len(), 64);
    assert_eq!(converted.report.skipped_requests, 0);
    for (i, entry) in converted.entries.iter().enumerate() {
        serde_json::from_value::<Request>(entry.body.clone()).unwrap_or_else(|e| panic!("line {}: {e}", i + 1));
        assert!(entry.usage.is_some(), "line {}: no usage", i + 1);
    }
    assert_eq!(converted.entries[0].time_ms, 0);
    assert!(converted.entries.windows(2).all(|w| w[0].time_ms <= w[1].time_ms));
    // The first streamed reply: input side from message_start, output from message_delta.
    let streamed = converted.entries.iter().find(|e| e.body["stream"] == json!(true)).unwrap();
    assert!(streamed.usage.as_ref().unwrap().output_tokens > 2);
    // Written lines have the request-log shape of CONTRACT.md.
    let mut out = Vec::new();
    recording::write_request_log_to(&converted.entries, &mut out).unwrap();
    let first: Value = serde_json::from_slice(out.split(|b| *b == b'\n').next().unwrap()).unwrap();
    let keys: Vec<&String> = first.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["time_ms", "body", "usage"]);
}

#[test]
fn recording_claude_trace_skips_other_endpoints() {
    let lines = [
        json!({"request":{"timestamp":10.0,"method":"POST","url":"https://api.anthropic.com/v1/messages/count_tokens","body":{}},"response":{}}),
        json!({"request":{"timestamp":11.5,"method":"POST","url":"https://api.anthropic.com/v1/messages?beta=true",
               "body":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}},
               "response":{"body_raw":"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":42}}\n"}}),
    ];
    let mut text: String = lines.iter().map(|l| l.to_string() + "\n").collect();
    text.push_str("{\"request\": {\"times");
    let converted = recording::convert_claude_trace(Cursor::new(text.into_bytes()), "t.jsonl").unwrap();
    assert_eq!(converted.report.skipped_requests, 1);
    assert_eq!(converted.entries.len(), 1);
    let usage = converted.entries[0].usage.as_ref().unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (7, 42));
    let w = converted.report.warnings.first_bad_line().unwrap();
    assert_eq!((w.line, w.kind), (3, WarningKind::TruncatedTail));
}

// ---------------------------------------------------------------------------------------------
// Robustness: no input makes a reader panic, and a broken line is always reported.

fn transcript_sample() -> String {
    let path = realdata().join("transcripts/entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    std::fs::read_to_string(path).unwrap()
}

/// Replaces line `at` (modulo the line count) with `garbage` (made non-JSON), or cuts the text
/// at byte `cut` (modulo its length, moved to a char boundary). Returns the new text and the
/// 1-based line that must be reported, if any.
fn damage(text: &str, garbage: Option<(usize, String)>, cut: Option<usize>) -> (String, Option<(usize, WarningKind)>) {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    if let Some((at, garbage)) = garbage {
        // Keep line 1 (a recording's header) intact; header damage is a fatal error by design.
        let at = 1 + at % (lines.len() - 1);
        lines[at] = format!("#{}", garbage.replace('\n', " "));
        return (lines.join("\n") + "\n", Some((at + 1, WarningKind::BadLine)));
    }
    let text = lines.join("\n") + "\n";
    let first_line_end = text.find('\n').unwrap() + 1;
    let mut cut = first_line_end + cut.unwrap_or(0) % (text.len() - first_line_end);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let kept = &text[..cut];
    // A cut inside a line (not right after a newline) leaves an unterminated partial object.
    if kept.ends_with('\n') || kept.is_empty() {
        return (kept.to_owned(), None);
    }
    let line = kept.matches('\n').count() + 1;
    let partial = &kept[kept.rfind('\n').map_or(0, |i| i + 1)..];
    // A cut just before a newline leaves a complete last line: nothing is damaged.
    if partial.trim().is_empty() || serde_json::from_str::<serde_json::Value>(partial).is_ok() {
        return (kept.to_owned(), None);
    }
    (kept.to_owned(), Some((line, WarningKind::TruncatedTail)))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn recording_reader_never_panics_and_reports_damage(
        garbage in proptest::option::of((0usize..1000, ".{0,40}")),
        cut in proptest::option::of(0usize..100_000),
    ) {
        let text = recording_text(&sample_recording());
        let (damaged, expected) = damage(&text, garbage, cut);
        let read = recording::read_recording_from(Cursor::new(damaged.as_bytes()), "p.jsonl").unwrap();
        if let Some((line, kind)) = expected {
            let first = read.warnings.first_bad_line();
            prop_assert_eq!(first.map(|w| (w.line, w.kind)), Some((line, kind)), "{:?}", read.warnings);
        } else {
            prop_assert!(read.warnings.is_empty());
        }
    }

    #[test]
    fn recording_transcript_importer_never_panics_and_reports_damage(
        garbage in proptest::option::of((0usize..1000, ".{0,40}")),
        cut in proptest::option::of(0usize..300_000),
    ) {
        let (damaged, expected) = damage(&transcript_sample(), garbage, cut);
        let session = recording::import_claude_code_from(Cursor::new(damaged.into_bytes()), "p.jsonl").unwrap();
        let first = session.report.warnings.first_bad_line().map(|w| (w.line, w.kind));
        prop_assert_eq!(first, expected);
    }

    #[test]
    fn recording_readers_never_panic_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let mut with_header = br#"{"ctxsim_recording":1,"source":"x"}"#.to_vec();
        with_header.push(b'\n');
        with_header.extend_from_slice(&bytes);
        let _ = recording::read_recording_from(Cursor::new(&with_header), "b");
        let _ = recording::import_claude_code_from(Cursor::new(&bytes), "b");
        let _ = recording::convert_claude_trace(Cursor::new(&bytes), "b");
        let _ = recording::detect_format_from(Cursor::new(&bytes), "b");
    }
}

/// A checkpoint that writes late queue operations at its top (as Entire does) neither moves the
/// session's origin nor piles the conversation onto time zero; `bridge-session` and
/// `file-history-delta` records are known kinds; the SessionStart hook's progress is kept, since
/// its source is sometimes the only trace of a resumed process.
#[test]
fn recording_claude_code_out_of_order_top_records_keep_real_times() {
    let lines = [
        json!({"type": "queue-operation", "operation": "enqueue", "timestamp": "2026-07-29T11:43:47.000Z", "content": "later"}),
        json!({"type": "bridge-session", "sessionId": "s", "bridgeSessionId": "cse_1", "lastSequenceNum": 0}),
        json!({"type": "progress", "uuid": "p1", "parentUuid": null, "timestamp": "2026-07-28T21:08:59.000Z",
               "data": {"type": "hook_progress", "hookEvent": "SessionStart", "hookName": "SessionStart:resume", "command": "x"}}),
        json!({"type": "user", "uuid": "u1", "parentUuid": "p1", "timestamp": "2026-07-28T21:09:00.000Z",
               "message": {"role": "user", "content": "hello"}}),
        json!({"type": "assistant", "uuid": "a1", "parentUuid": "u1", "timestamp": "2026-07-28T21:09:10.000Z", "requestId": "r1",
               "message": {"id": "m1", "role": "assistant", "model": "claude-opus-5", "content": [{"type": "text", "text": "hi"}],
                           "usage": {"input_tokens": 1, "output_tokens": 2}}}),
        json!({"type": "file-history-delta", "messageId": "m1", "trackingPath": "a", "timestamp": "2026-07-28T21:09:11.000Z"}),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let session = recording::import_claude_code_from(Cursor::new(text.as_bytes()), "t.jsonl").unwrap();
    assert!(session.report.unknown_by_type.is_empty(), "{:?}", session.report.unknown_by_type);
    assert!(session.report.warnings.list.is_empty(), "{:#?}", session.report.warnings.list);
    let times: Vec<(String, u64)> = session
        .recording
        .events
        .iter()
        .map(|e| {
            let kind = match &e.kind {
                EventKind::SystemEvent(s) => s.subtype.clone(),
                EventKind::UserPrompt(_) => "user".into(),
                EventKind::ModelReply(_) => "reply".into(),
                other => format!("{other:?}").chars().take(12).collect(),
            };
            (kind, e.time_ms)
        })
        .collect();
    let expect: Vec<(String, u64)> = vec![
        ("queue_operation".into(), 52_488_000),
        ("session_start".into(), 0),
        ("user".into(), 1_000),
        ("reply".into(), 11_000),
    ];
    assert_eq!(times, expect);
    let origin = "2026-07-28T21:08:59Z".parse::<jiff::Timestamp>().unwrap().as_millisecond();
    assert_eq!(session.recording.header.start_epoch_ms, Some(origin));
    assert_eq!(session.calls[0].time_ms, 11_000);
}

#[test]
fn the_importer_keeps_what_shows_what_happened_around_a_turn() {
    use ctxsim::recording::{EventKind, import_claude_code};
    // entirecontext 01M0FWRP (2.1.232): away summaries, local commands (a `/model` that kept
    // the model), stop summaries, prompts with their permission mode, and the usage's speed and
    // service tier.
    let path = crate::support::realdata().join("transcripts/entirecontext/01M0FWRPX72AX3CYC2HMV1W2SN-1.full.jsonl");
    let session = import_claude_code(&path).unwrap();
    let mut systems: std::collections::BTreeMap<String, usize> = Default::default();
    let mut modes = std::collections::BTreeSet::new();
    let mut model_command = false;
    for event in &session.recording.events {
        match &event.kind {
            EventKind::SystemEvent(sys) => {
                *systems.entry(sys.subtype.clone()).or_default() += 1;
                model_command |= sys.subtype == "local_command" && sys.payload.to_string().contains("Kept model as");
            }
            EventKind::UserPrompt(prompt) => {
                modes.extend(prompt.permission_mode.clone());
            }
            _ => {}
        }
    }
    assert_eq!(systems.get("away_summary"), Some(&3), "{systems:?}");
    assert_eq!(systems.get("local_command"), Some(&3), "{systems:?}");
    assert_eq!(systems.get("stop_hook_summary"), Some(&10), "{systems:?}");
    assert!(model_command);
    assert_eq!(modes.into_iter().collect::<Vec<_>>(), vec!["auto".to_owned()]);
    let call = &session.calls[1];
    assert_eq!(call.usage.extra.get("speed").and_then(|v| v.as_str()), Some("standard"));
    assert_eq!(call.usage.extra.get("service_tier").and_then(|v| v.as_str()), Some("standard"));
    // Nothing the importer does not know is dropped silently.
    assert!(session.report.unknown_by_type.is_empty(), "{:?}", session.report.unknown_by_type);
}

/// A listing attachment is sent as its rendered lines only: the names the client keeps to diff
/// the next listing against (`addedNames`, `addedTypes`, `names`) are not text it sends.
#[test]
fn listing_attachments_send_their_lines_once() {
    let text = |payload: Value| {
        let kind = payload["type"].as_str().unwrap_or_default().to_owned();
        recording::claude_code::attachment_text(&Attachment { attachment_type: kind, payload })
    };
    let deferred = text(json!({"type": "deferred_tools_delta", "addedNames": ["CronCreate"], "addedLines": ["CronCreate"], "removedNames": ["mcp__x__gone"]}));
    assert_eq!(deferred.matches("CronCreate").count(), 1, "{deferred}");
    assert!(deferred.contains("mcp__x__gone"), "{deferred}");
    let agents = text(json!({"type": "agent_listing_delta", "addedTypes": ["Explore"], "addedLines": ["- Explore: looks around"]}));
    assert_eq!(agents.matches("Explore").count(), 1, "{agents}");
    let skills = text(json!({"type": "skill_listing", "content": "- init: set up", "names": ["init"], "skillCount": 1}));
    assert_eq!(skills.matches("init").count(), 1, "{skills}");
    // Without the rendered lines the names are all the record has: they are sent.
    let bare = text(json!({"type": "deferred_tools_delta", "addedNames": ["CronCreate"]}));
    assert!(bare.contains("CronCreate"), "{bare}");
}

/// What the client writes around an attachment whose record keeps only data is sent at the size
/// the real 2.1.205 and 2.1.232 clients give it (our wording, `agent::wording::CLIENT_2_1_2XX`):
/// a listing's header, the note after a removal and the agent listing's concurrency note, auto
/// mode's instructions by the record's flags, the task tools' reminder (421 characters) and its
/// header before the tasks. A task reminder sends each task as `#id. [status] subject`, not the
/// rest of its record; a nested memory file its path and content, without the copy on disk, its
/// globs and its kind.
#[test]
fn attachments_send_the_clients_wording_around_what_the_record_keeps() {
    let text = |payload: Value| {
        let kind = payload["type"].as_str().unwrap_or_default().to_owned();
        recording::claude_code::attachment_text(&Attachment { attachment_type: kind, payload })
    };
    let bare = |kind: &str| format!("{}\"{kind}\">\n</system-reminder>", recording::claude_code::ATTACHMENT_REMINDER).chars().count();
    let empty = text(json!({"type": "task_reminder", "content": [], "itemCount": 0}));
    assert_eq!(empty.chars().count(), bare("task_reminder") + 421, "{empty}");
    let listed = text(json!({"type": "task_reminder", "itemCount": 1, "content": [
        {"id": "1", "subject": "Split the parser", "description": "A long description the client keeps to itself", "status": "in_progress", "blocks": [], "blockedBy": []}]}));
    assert!(listed.contains("#1. [in_progress] Split the parser\n"), "{listed}");
    assert!(!listed.contains("long description"), "{listed}");
    assert_eq!(listed.chars().count(), bare("task_reminder") + 421 + 32 + "#1. [in_progress] Split the parser\n".len(), "{listed}");
    let agents = text(json!({"type": "agent_listing_delta", "addedTypes": ["Explore"], "addedLines": ["- Explore: looks around"], "isInitial": true, "showConcurrencyNote": true}));
    let quiet = text(json!({"type": "agent_listing_delta", "addedTypes": ["Explore"], "addedLines": ["- Explore: looks around"], "isInitial": true, "showConcurrencyNote": false}));
    assert_eq!(agents.chars().count() - quiet.chars().count(), 133 + 1, "{agents}");
    assert_eq!(quiet.chars().count(), bare("agent_listing_delta") + 41 + 1 + "- Explore: looks around\n".len(), "{quiet}");
    let later = text(json!({"type": "agent_listing_delta", "addedTypes": ["Explore"], "addedLines": ["- Explore: looks around"], "isInitial": false}));
    assert_eq!(later.chars().count() - quiet.chars().count(), 53 - 41, "{later}");
    let deferred = text(json!({"type": "deferred_tools_delta", "addedLines": ["CronCreate"], "removedNames": []}));
    assert_eq!(deferred.chars().count(), bare("deferred_tools_delta") + 248 + 1 + "CronCreate\n".len(), "{deferred}");
    let gone = text(json!({"type": "mcp_instructions_delta", "removedNames": ["x"]}));
    assert_eq!(gone.chars().count(), bare("mcp_instructions_delta") + 86 + 1 + 116 + 1 + "x\n".len(), "{gone}");
    let auto = text(json!({"type": "auto_mode", "autoModeConsentFlow": false, "bashFirst": false, "steerOnly": false, "bypass": false}));
    assert_eq!(auto.chars().count(), bare("auto_mode") + 948 + 1, "{auto}");
    let consent = text(json!({"type": "auto_mode", "autoModeConsentFlow": true}));
    assert_eq!(consent.chars().count(), auto.chars().count() + 1379 + 1, "{consent}");
    let bypass = text(json!({"type": "auto_mode", "bypass": true, "bashFirst": true}));
    assert_eq!(bypass.chars().count(), bare("auto_mode") + 40 + 1 + 329 + 1, "{bypass}");
    let memory = text(json!({"type": "nested_memory", "path": "/p/.claude/rules/go.md", "displayPath": ".claude/rules/go.md", "content": {
        "path": "/p/.claude/rules/go.md", "type": "Project", "content": "Run gofmt.\n", "globs": ["**/*.go"], "contentDiffersFromDisk": true,
        "rawContent": "---\npaths: [\"**/*.go\"]\n---\nRun gofmt.\n", "isRule": true}}));
    assert!(memory.contains("Contents of /p/.claude/rules/go.md:\n\nRun gofmt."), "{memory}");
    assert_eq!(memory.matches("Run gofmt.").count(), 1, "{memory}");
    assert!(!memory.contains("**/*.go") && !memory.contains("Project"), "{memory}");
}

/// The audit's written call times come from the import (the importer keeps them as it reads each
/// line) and equal a second read of the files, on every real transcript (spotter's subagent files
/// included).
#[test]
fn recording_import_keeps_the_written_call_times_of_every_real_transcript() {
    use ctxsim::replay::discover::{call_times, call_times_of, transcript_files};
    for path in transcripts() {
        let session = recording::import_claude_code(&path).unwrap();
        let written = session.written_call_times().expect("imported from a path");
        let name = path.display();
        assert_eq!(written.files, transcript_files(&path), "{name}");
        assert_eq!(written.times, call_times(&path), "{name}");
        assert!(written.times.len() >= session.calls.iter().filter(|c| !c.is_synthetic).count() / 2, "{name}");
        assert!(matches!(call_times_of(&path, &session), std::borrow::Cow::Borrowed(_)), "{name}");
    }
}

/// The written call times taken during the import follow the rules of a second read of the file on
/// damaged lines: a byte-order mark before the first record, a `message` written as an array, a
/// line whose number is out of range (the importer rejects it, the time is still read), a line
/// without `"usage"`, a repeated record (the first line counts), and a line that is not UTF-8 (no
/// time after it in that file). A subagent file the importer does not read makes the audit read the
/// files again.
#[test]
fn recording_import_written_call_times_equal_a_second_read_on_damaged_lines() {
    use ctxsim::replay::discover::{call_times, call_times_of};
    let line = |uuid: &str, ts: &str, req: &str, id: &str| {
        json!({"type": "assistant", "uuid": uuid, "timestamp": ts, "requestId": req,
               "message": {"id": id, "role": "assistant", "model": "claude-opus-5", "content": [{"type": "text", "text": "x"}],
                           "usage": {"input_tokens": 1, "output_tokens": 2}}})
        .to_string()
    };
    let mut text = Vec::new();
    text.extend_from_slice(ctxsim::input::BOM);
    text.extend_from_slice(line("a0", "2026-07-28T21:09:00Z", "r0", "m0").as_bytes());
    text.push(b'\n');
    for l in [
        line("a1", "2026-07-28T21:09:01Z", "r1", "m1"),
        r#"{"type":"assistant","uuid":"a2","timestamp":"2026-07-28T21:09:02Z","requestId":"r2","message":["m2"],"usage":1}"#.to_owned(),
        r#"{"type":"assistant","uuid":"a3","timestamp":"2026-07-28T21:09:03Z","requestId":"r3","message":{"id":"m3","usage":{"input_tokens":1e999}}}"#.to_owned(),
        r#"{"type":"assistant","uuid":"a4","timestamp":"2026-07-28T21:09:04Z","requestId":"r4","message":{"id":"m4"}}"#.to_owned(),
        line("a1", "2026-07-28T21:09:05Z", "r1", "m1"),
        line("a5", "2026-07-28T21:09:06Z", "r5", "m1"),
        line("a6", "not a time", "r6", "m6"),
    ] {
        text.extend_from_slice(l.as_bytes());
        text.push(b'\n');
    }
    let mut bad = line("a7", "2026-07-28T21:09:07Z", "r7", "m7").into_bytes();
    let at = bad.len() - 10;
    bad.insert(at, 0xff);
    text.extend_from_slice(&bad);
    text.extend_from_slice(b"\r\n");
    text.extend_from_slice(line("a8", "2026-07-28T21:09:08Z", "r8", "m8").as_bytes());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    std::fs::write(&path, &text).unwrap();
    let sub_dir = dir.path().join("s").join("subagents");
    std::fs::create_dir_all(&sub_dir).unwrap();
    std::fs::write(sub_dir.join("agent-x.jsonl"), format!("{}\n{}\n", line("b1", "2026-07-28T21:08:00Z", "r1", "m1"), line("b2", "2026-07-28T21:10:00Z", "rb", "mb"))).unwrap();

    let session = recording::import_claude_code(&path).unwrap();
    let times = call_times(&path);
    let ms = |ts: &str| ts.parse::<jiff::Timestamp>().unwrap().as_millisecond();
    let key = |id: &str, req: &str| (id.to_owned(), req.to_owned());
    let expect: std::collections::BTreeMap<(String, String), i64> = [
        (key("m1", "r1"), ms("2026-07-28T21:09:01Z")),
        (key("m2", "r2"), ms("2026-07-28T21:09:02Z")),
        (key("m3", "r3"), ms("2026-07-28T21:09:03Z")),
        (key("m1", "r5"), ms("2026-07-28T21:09:06Z")),
        (key("mb", "rb"), ms("2026-07-28T21:10:00Z")),
    ]
    .into_iter()
    .collect();
    assert_eq!(times, expect);
    assert_eq!(session.written_call_times().unwrap().times, times);
    assert!(matches!(call_times_of(&path, &session), std::borrow::Cow::Borrowed(_)));
    // The importer warned about the lines it could not take.
    assert!(session.report.warnings.list.iter().any(|w| w.line == 4), "{:#?}", session.report.warnings.list);

    // A `*.jsonl` beside the subagent files that the importer does not read as one: read again.
    std::fs::write(sub_dir.join("notes.jsonl"), format!("{}\n", line("c1", "2026-07-28T21:11:00Z", "rc", "mc"))).unwrap();
    let session = recording::import_claude_code(&path).unwrap();
    let again = call_times_of(&path, &session);
    assert!(matches!(again, std::borrow::Cow::Owned(_)));
    assert_eq!(again.len(), expect.len() + 1);
    // A transcript read from a reader has none.
    assert!(recording::import_claude_code_from(Cursor::new(&text), "s.jsonl").unwrap().written_call_times().is_none());

    // A first line opening with a byte-order mark and not UTF-8: both reads stop there.
    let mut text = Vec::new();
    text.extend_from_slice(ctxsim::input::BOM);
    text.extend_from_slice(b"{\"a\":\"\xff\"}\n");
    text.extend_from_slice(line("a1", "2026-07-28T21:09:01Z", "r1", "m1").as_bytes());
    text.push(b'\n');
    let path = dir.path().join("t.jsonl");
    std::fs::write(&path, &text).unwrap();
    let session = recording::import_claude_code(&path).unwrap();
    let times = call_times(&path);
    assert!(times.is_empty(), "{times:?}");
    assert_eq!(session.written_call_times().unwrap().times, times);
}
