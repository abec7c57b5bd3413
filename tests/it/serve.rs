//! `ctxsim serve`: the loopback Messages API over a script, driven with a real HTTP client.

use ctxsim::analyze::{analyze, read_log_file};
use ctxsim::api::{ContentBlock, Response, StopReason};
use ctxsim::live::sse::{self, read_stream};
use ctxsim::live::{Script, ServeOptions, ServeReport, ServerHandle, Service, start};
use ctxsim::measure::{Measurer, ModelTable};
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::support::*;

/// A server on a free port over `script` (JSON text), measured with chars/4.
fn check_server(script: &Value, options: ServeOptions) -> ServerHandle {
    check_server_with(script, options, measurer())
}

fn check_server_with(script: &Value, options: ServeOptions, measurer: Measurer) -> ServerHandle {
    let script = Script::parse(&script.to_string(), "script.json").unwrap_or_else(|e| panic!("{e}"));
    let service = Service::new(script, measurer, options).expect("service");
    start(0, service).expect("bind 127.0.0.1:0")
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

/// POSTs `body` to `path`; the status and the response text.
fn check_post(handle: &ServerHandle, path: &str, body: &[u8]) -> (u16, String) {
    let mut response = agent()
        .post(format!("{}{path}", handle.base_url()))
        .header("content-type", "application/json")
        .send(body)
        .expect("the server answers");
    let status = response.status().as_u16();
    (status, response.body_mut().read_to_string().expect("a text body"))
}

/// Sends one Messages request and reads the reply (SSE or JSON, as the body asks).
fn check_message(handle: &ServerHandle, body: &Value) -> Response {
    let (status, text) = check_post(handle, "/v1/messages?beta=true", body.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    if body["stream"] == json!(true) {
        read_stream(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }
}

/// The API error of a rejected request: (status, error.type, error.message).
fn check_error(handle: &ServerHandle, path: &str, body: &[u8]) -> (u16, String, String) {
    let (status, text) = check_post(handle, path, body);
    let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(value["type"], "error", "{text}");
    (status, value["error"]["type"].as_str().unwrap().to_owned(), value["error"]["message"].as_str().unwrap().to_owned())
}

fn stop(handle: ServerHandle) -> ServeReport {
    handle.stop().expect("the server stops cleanly")
}

/// A main-thread body shaped like the real client's (oracle §3): tools, four system blocks with
/// the static one globally marked, one marker on the last block of the last message.
fn main_body(turns: usize, stream: bool) -> Value {
    let tools: Vec<Value> = ["Bash", "Edit", "Glob", "Grep", "Read", "Write"]
        .iter()
        .map(|n| json!({"name": n, "description": text_of(n, 600), "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}}}))
        .collect();
    let mut messages = vec![json!({"role": "user", "content": [
        {"type": "text", "text": format!("<system-reminder>{}</system-reminder>", text_of("claudeMd", 400))},
        {"type": "text", "text": "fix the failing test"}]})];
    for i in 0..turns {
        messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": format!("toolu_{i}"), "name": "Read", "input": {"file_path": format!("/p/f{i}.rs")}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": text_of(&format!("file{i}"), 900)}]}));
    }
    let last = messages.last_mut().unwrap();
    let blocks = last["content"].as_array_mut().unwrap();
    let n = blocks.len();
    blocks[n - 1]["cache_control"] = json!({"type": "ephemeral"});
    json!({
        "model": MODEL, "max_tokens": 32000, "stream": stream, "tools": tools, "messages": messages,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=0.0.0.abc; cc_entrypoint=sdk-cli;"},
            {"type": "text", "text": "You are a coding agent."},
            {"type": "text", "text": text_of("static", 2900), "cache_control": {"type": "ephemeral", "scope": "global"}},
            {"type": "text", "text": text_of("dynamic", 3800)}
        ]
    })
}

fn text(s: &str) -> ContentBlock {
    ContentBlock::text(s)
}

#[test]
fn streamed_and_json_replies_carry_the_scripted_content() {
    let script = json!({"main": [
        {"content": "Looking at the test first."},
        {"content": [{"text": "Reading it."}, {"tool_use": {"name": "Read", "input": {"file_path": "/p/a.rs", "limit": 20}}}]},
        {"content": [{"type": "thinking", "thinking": "The assertion is off by one — ünïcode too.", "signature": "sig-1"},
                     {"type": "text", "text": "Fixed."}], "stop_reason": "end_turn"}
    ]});
    let handle = check_server(&script, ServeOptions { id_tag: "t".to_owned(), ..ServeOptions::default() });
    let first = check_message(&handle, &main_body(0, true));
    assert_eq!(first.content, vec![text("Looking at the test first.")]);
    assert_eq!((first.id.as_str(), first.stop_reason), ("msg_t_0001", Some(StopReason::EndTurn)));
    let second = check_message(&handle, &main_body(1, false));
    assert_eq!(second.content, vec![text("Reading it."), ContentBlock::tool_use("toolu_t_0001", "Read", json!({"file_path": "/p/a.rs", "limit": 20}))]);
    assert_eq!(second.stop_reason, Some(StopReason::ToolUse));
    let third = check_message(&handle, &main_body(2, true));
    assert_eq!(third.content, vec![ContentBlock::thinking("The assertion is off by one — ünïcode too.", "sig-1"), text("Fixed.")]);
    // The script is spent: the default text answers.
    let fourth = check_message(&handle, &main_body(3, true));
    assert!(matches!(&fourth.content[..], [ContentBlock::Text { text, .. }] if text.contains("no more replies")));
    assert_eq!(stop(handle).rows.len(), 4);
}

#[test]
fn usage_is_the_simulators_and_growing_requests_read_the_cache() {
    let handle = check_server(&json!({}), ServeOptions::default());
    let bodies: Vec<Value> = (0..4).map(|turns| main_body(turns, turns % 2 == 0)).collect();
    let usages: Vec<_> = bodies.iter().map(|b| check_message(&handle, b).usage).collect();
    let report = stop(handle);
    // The same bodies measured directly, one virtual second apart (the default step).
    let expected = measure_all(&bodies.iter().enumerate().map(|(i, b)| (i as u64 * 1000, serde_json::from_value(b.clone()).unwrap())).collect::<Vec<_>>());
    for ((usage, want), row) in usages.iter().zip(&expected).zip(&report.rows) {
        assert_eq!((usage.cache_read_input_tokens, usage.cache_creation_input_tokens, usage.input_tokens), split(want));
        assert_eq!(usage.cache_creation.as_ref().unwrap().ephemeral_5m_input_tokens, want.cache_creation.ephemeral_5m_input_tokens);
        assert_eq!(row.body_sha256, want.body_sha256);
    }
    assert_eq!(usages[0].cache_read_input_tokens, 0);
    for pair in usages.windows(2) {
        // Each request reads everything the previous one wrote.
        assert_eq!(pair[1].cache_read_input_tokens, pair[0].cache_read_input_tokens + pair[0].cache_creation_input_tokens);
    }
}

#[test]
fn the_log_is_an_analyze_input_whose_reanalysis_gives_the_same_usage() {
    let dir = tempfile::tempdir().unwrap();
    let script = json!({"main": [{"content": "one"}, {"content": "two", "delay": 2.5}, {"content": "three"}]});
    let handle = check_server(&script, ServeOptions { log_dir: Some(dir.path().to_owned()), ..ServeOptions::default() });
    for turns in 0..3 {
        check_message(&handle, &main_body(turns, true));
    }
    // A side request (no tools) in between, and a compaction fork.
    let mut side = main_body(0, false);
    side.as_object_mut().unwrap().remove("tools");
    check_message(&handle, &side);
    let mut compact = main_body(2, true);
    compact["messages"].as_array_mut().unwrap().push(json!({"role": "user", "content": "Your task is to create a detailed summary of the conversation so far."}));
    check_message(&handle, &compact);
    // Nothing is lost before shutdown: every answered request is already in the log.
    let lines = std::fs::read_to_string(dir.path().join("requests.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 5);
    let report = stop(handle);
    let log = read_log_file(&dir.path().join("requests.jsonl")).unwrap_or_else(|e| panic!("{e}"));
    let times: Vec<u64> = log.entries.iter().map(|e| e.time_ms).collect();
    assert_eq!(times, [0, 1000, 4500, 5500, 6500]);
    let lanes: Vec<_> = log.entries.iter().map(|e| e.lane.as_deref().unwrap()).collect();
    assert_eq!(lanes, ["main", "main", "main", "side", "compact"]);
    let rows = analyze(&log, &mut measurer(), "requests.jsonl").unwrap();
    for (entry, row) in log.entries.iter().zip(&rows) {
        let usage = entry.usage.as_ref().unwrap();
        assert_eq!((usage.cache_read_input_tokens, usage.cache_creation_input_tokens, usage.input_tokens), split(row));
        assert_eq!(usage.output_tokens, row.output_tokens);
    }
    assert!(rows[4].cache_read_input_tokens > 0, "the compaction fork reads the main thread's cache");
    // The trace and summary at shutdown.
    let trace = std::fs::read_to_string(dir.path().join("trace.jsonl")).unwrap();
    assert_eq!(ctxsim::report::output::read_trace(&trace, "trace.jsonl").unwrap(), report.rows);
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["requests"], 5);
    assert_eq!(summary["fingerprint"], json!(report.summary.fingerprint));
}

#[test]
fn the_same_request_sequence_gives_byte_identical_answers_and_logs() {
    let run = || {
        let dir = tempfile::tempdir().unwrap();
        let script = json!({"main": [{"content": [{"tool_use": {"name": "Bash", "input": {"command": "cargo test"}}}]}, {"content": "done"}]});
        let handle = check_server(&script, ServeOptions { log_dir: Some(dir.path().to_owned()), ..ServeOptions::default() });
        let answers: Vec<String> = (0..3).map(|t| check_post(&handle, "/v1/messages", main_body(t, t != 1).to_string().as_bytes()).1).collect();
        stop(handle);
        let files: Vec<Vec<u8>> = ["requests.jsonl", "trace.jsonl", "summary.json"].iter().map(|f| std::fs::read(dir.path().join(f)).unwrap()).collect();
        (answers, files)
    };
    assert_eq!(run(), run());
}

#[test]
fn a_malformed_body_gets_the_apis_400() {
    let handle = check_server(&json!({}), ServeOptions::default());
    let (status, kind, message) = check_error(&handle, "/v1/messages", b"{\"model\": ");
    assert_eq!((status, kind.as_str()), (400, "invalid_request_error"));
    assert!(message.starts_with("request body is not valid JSON"), "{message}");
    let (status, _, message) = check_error(&handle, "/v1/messages", br#"{"model": "claude-sonnet-4-5", "max_tokens": 5}"#);
    assert_eq!(status, 400);
    assert!(message.contains("messages"), "{message}");
    let (status, _, message) = check_error(&handle, "/v1/messages", br#"{"model": "claude-sonnet-4-5", "messages": [{"role": "robot", "content": "hi"}]}"#);
    assert_eq!(status, 400);
    assert!(message.contains("messages[0].role"), "{message}");
    let (status, kind, _) = check_error(&handle, "/v1/messages", br#"{"model": "gpt-9", "messages": []}"#);
    assert_eq!((status, kind.as_str()), (404, "not_found_error"));
    // None of these was measured, and the server still answers.
    check_message(&handle, &main_body(0, true));
    assert_eq!(stop(handle).rows.len(), 1);
}

#[test]
fn a_prompt_longer_than_the_window_gets_prompt_too_long() {
    let mut table = ModelTable::shipped();
    for model in &mut table.models {
        model.context_window = 12_000;
    }
    let m = Measurer::new(table, ctxsim::measure::TokenCounter::new(ctxsim::measure::EstimatorKind::Chars4));
    let handle = check_server_with(&json!({"main": [{"content": "short"}, {"content": "kept for later"}]}), ServeOptions::default(), m);
    assert_eq!(check_message(&handle, &main_body(0, true)).content, vec![text("short")]);
    let (status, kind, message) = check_error(&handle, "/v1/messages", main_body(2, true).to_string().as_bytes());
    assert_eq!((status, kind.as_str()), (400, "invalid_request_error"));
    assert!(message.starts_with("prompt is too long: ") && message.ends_with(" tokens > 12000 maximum"), "{message}");
    // The rejected request sampled nothing: the next reply is still there.
    assert_eq!(check_message(&handle, &main_body(0, false)).content, vec![text("kept for later")]);
    let report = stop(handle);
    assert_eq!(report.rows[1].error.as_deref(), Some(message.as_str()));
    assert_eq!(report.rows[1].cache_read_input_tokens + report.rows[1].cache_creation_input_tokens, 0);
}

#[test]
fn count_tokens_head_and_unknown_paths() {
    let handle = check_server(&json!({}), ServeOptions::default());
    let body = main_body(1, false);
    let (status, text) = check_post(&handle, "/v1/messages/count_tokens?beta=true", body.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    let request: ctxsim::api::Request = serde_json::from_value(body).unwrap();
    let expected = ctxsim::measure::flatten(&request, measurer().counter_mut(), "claude").total_tokens;
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), json!({"input_tokens": expected}));
    let head = agent().head(format!("{}/", handle.base_url())).call().unwrap();
    assert_eq!(head.status().as_u16(), 200);
    let (status, kind, _) = check_error(&handle, "/v1/models", b"{}");
    assert_eq!((status, kind.as_str()), (404, "not_found_error"));
    // count_tokens is not a request of the conversation: nothing measured.
    assert!(stop(handle).rows.is_empty());
}

#[test]
fn lanes_consume_their_own_replies_and_the_server_stops_when_done() {
    let script = json!({
        "main": [{"content": "main one"}, {"content": "main two"}],
        "side": [{"content": "a title"}],
        "side_text": "side fallback", "summary_text": "<summary>the summary</summary>"
    });
    let handle = check_server(&script, ServeOptions { exit_when_done: true, ..ServeOptions::default() });
    assert_eq!(check_message(&handle, &main_body(0, true)).content, vec![text("main one")]);
    let mut haiku = main_body(0, true);
    haiku["model"] = json!("claude-haiku-4-5-20251001");
    assert_eq!(check_message(&handle, &haiku).content, vec![text("a title")]);
    assert_eq!(check_message(&handle, &haiku).content, vec![text("side fallback")]);
    let mut compact = main_body(1, true);
    compact["messages"].as_array_mut().unwrap().push(json!({"role": "user", "content": [{"type": "text", "text": "Stop here and write a handover summary of this conversation instead of continuing it."}]}));
    assert_eq!(check_message(&handle, &compact).content, vec![text("<summary>the summary</summary>")]);
    assert_eq!(check_message(&handle, &main_body(1, true)).content, vec![text("main two")]);
    // The last main reply was served: the server stops by itself.
    let report = handle.wait().unwrap();
    let lanes: Vec<_> = report.rows.iter().map(|r| r.lane.as_str()).collect();
    assert_eq!(lanes, ["main", "side", "side", "compact", "main"]);
    assert_eq!(report.unserved_main, 0);
}

#[test]
fn max_requests_stops_the_server_and_the_time_header_sets_virtual_time() {
    let handle = check_server(&json!({}), ServeOptions { max_requests: Some(2), ..ServeOptions::default() });
    let send = |time: &str| {
        agent().post(format!("{}/v1/messages", handle.base_url())).header(ctxsim::live::serve::TIME_HEADER, time).send(main_body(0, false).to_string()).unwrap().status().as_u16()
    };
    assert_eq!(send("600000"), 200);
    assert_eq!(send("2000"), 400, "time never goes back");
    assert_eq!(send("960000"), 200);
    let report = handle.wait().unwrap();
    let times: Vec<u64> = report.rows.iter().map(|r| r.time_ms).collect();
    assert_eq!(times, [600_000, 960_000]);
    // Six minutes later the 5-minute entry has expired: nothing is read.
    assert_eq!(report.rows[1].cache_read_input_tokens, 0);
}

fn check_script_error(text: &str, expect: &str) {
    let error = Script::parse(text, "s.json").expect_err("the script must be rejected").to_string();
    assert_eq!(error, expect);
}

#[test]
fn script_errors_name_file_line_and_field() {
    check_script_error("{\"main\": [\n {\"content\": \"a\"},\n {\"content\": \"b\", \"stop\": 1}]}", "s.json:3:24: main[1].stop: unknown field `stop`, expected one of `content`, `stop_reason`, `usage`, `usage_scale`, `delay`");
    check_script_error("{\"main\": [{\"content\": []}]}", "s.json:1:25: main[0].content: a reply needs at least one block");
    check_script_error("{\"main\": [{\"content\": [{\"txt\": \"a\"}]}]}", "s.json:1:37: main[0].content: [0]: unknown field `txt`, expected one of `text`, `thinking`, `redacted_thinking`, `tool_use`");
    check_script_error("{\"side\": [{\"content\": \"a\", \"delay\": -1}]}", "s.json:1:40: side[0]: delay: must be a number of seconds ≥ 0, got -1");
}

/// Every real stream in the claude-trace capture reads into a message whose usage is the one
/// the capture converter reads from it.
#[test]
fn real_captured_streams_are_read() {
    let path = realdata().join("api_captures/claude-trace/test-traffic.jsonl");
    let mut streams = 0;
    for line in std::fs::read_to_string(&path).unwrap().lines() {
        let value: Value = serde_json::from_str(line).unwrap();
        let Some(raw) = value["response"]["body_raw"].as_str() else { continue };
        let message = read_stream(raw).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Some(message.usage.clone()), ctxsim::recording::usage_from_sse(raw));
        assert!(!message.content.is_empty() && message.stop_reason.is_some());
        // Rendering it again reads back the same message.
        assert_eq!(read_stream(&sse::render(&message)).unwrap(), message);
        streams += 1;
    }
    assert!(streams >= 20, "{streams}");
}

/// The capture's real request bodies served in order: each answer's usage is what `analyze`
/// computes for the same log.
#[test]
fn real_captured_requests_are_served_and_measured() {
    let path = realdata().join("api_captures/claude-trace/test-traffic.jsonl");
    let file = std::fs::File::open(&path).unwrap();
    let converted = ctxsim::recording::convert_claude_trace(std::io::BufReader::new(file), "test-traffic.jsonl").unwrap();
    let handle = check_server(&json!({}), ServeOptions::default());
    let mut served = Vec::new();
    for entry in &converted.entries {
        let response = agent()
            .post(format!("{}/v1/messages?beta=true", handle.base_url()))
            .header(ctxsim::live::serve::TIME_HEADER, entry.time_ms.to_string())
            .send(entry.body.to_string())
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap();
        let message = if entry.body["stream"] == json!(true) { read_stream(&response).unwrap() } else { serde_json::from_str::<Response>(&response).unwrap() };
        served.push(message.usage);
    }
    stop(handle);
    let mut bytes = Vec::new();
    ctxsim::recording::write_request_log_to(&converted.entries, &mut bytes).unwrap();
    let log = ctxsim::analyze::read_log(std::io::Cursor::new(bytes), "log").unwrap();
    let rows = analyze(&log, &mut measurer(), "log").unwrap();
    assert_eq!(served.len(), rows.len());
    for (usage, row) in served.iter().zip(&rows) {
        assert_eq!((usage.cache_read_input_tokens, usage.cache_creation_input_tokens, usage.input_tokens), split(row));
    }
    assert!(served.iter().any(|u| u.cache_read_input_tokens > 0));
}

fn arb_block() -> impl Strategy<Value = ContentBlock> {
    let text = "[a-zA-Z0-9 äöü€😀\\n\"\\\\]{0,140}";
    prop_oneof![
        text.prop_map(ContentBlock::text),
        (text, "[a-f0-9]{0,40}").prop_map(|(t, s)| ContentBlock::thinking(t, s)),
        ("toolu_[a-z0-9]{1,8}", "[A-Z][a-z]{1,8}", text, 0u32..100000)
            .prop_map(|(id, name, s, n)| ContentBlock::tool_use(id, name, json!({"path": s, "n": n, "nested": {"list": [n, s]}}))),
    ]
}

proptest! {
    /// Rendering a message as SSE and reading it back gives the message.
    #[test]
    fn sse_round_trips(blocks in proptest::collection::vec(arb_block(), 0..6), read in 0u64..100000, created in 0u64..5000, out in 1u64..9000) {
        let mut usage = ctxsim::api::Usage { input_tokens: 3, cache_read_input_tokens: read, cache_creation_input_tokens: created, output_tokens: out, ..Default::default() };
        usage.cache_creation = Some(ctxsim::api::CacheCreation { ephemeral_5m_input_tokens: created, ephemeral_1h_input_tokens: 0 });
        let message = Response {
            id: "msg_1".to_owned(), kind: "message".to_owned(), role: "assistant".to_owned(), model: MODEL.to_owned(),
            stop_reason: Some(if blocks.iter().any(|b| matches!(b, ContentBlock::ToolUse { .. })) { StopReason::ToolUse } else { StopReason::EndTurn }),
            content: blocks, stop_sequence: None, usage, extra: Default::default(),
        };
        let text = sse::render(&message);
        prop_assert_eq!(read_stream(&text).unwrap(), message);
        // Events are separated by blank lines, each with its type in `event:` and `data:`.
        let events = sse::parse(&text);
        prop_assert_eq!(events.first().map(|e| e.event.as_str()), Some("message_start"));
        prop_assert_eq!(events.last().map(|e| e.event.as_str()), Some("message_stop"));
    }
}

#[test]
fn an_error_event_is_an_api_error() {
    let stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"x\",\"usage\":{}}}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    assert_eq!(read_stream(stream).unwrap_err().to_string(), "the API sent an error event: overloaded_error: Overloaded");
}

/// Writes `raw` on a fresh connection, half-closes it, and reads everything the server sends.
fn check_raw(handle: &ServerHandle, raw: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(handle.addr()).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    stream.write_all(raw).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

#[test]
fn the_http_layer_reads_kept_alive_chunked_and_100_continue_requests_and_refuses_bad_ones() {
    let handle = check_server(&json!({"main": [{"content": "one"}, {"content": "two"}, {"content": "three"}]}), ServeOptions::default());
    let body = main_body(1, false).to_string();
    let (half_a, half_b) = body.split_at(body.len() / 2);
    // Two requests on one kept-alive connection, the second with a chunked body, then a third
    // that waits for `100 Continue`.
    let mut raw = format!("POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    raw += &format!("POST /v1/messages HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{half_a}\r\n{:x};ext=1\r\n{half_b}\r\n0\r\n\r\n", half_a.len(), half_b.len());
    raw += &format!("POST /v1/messages HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    let answer = check_raw(&handle, raw.as_bytes());
    let statuses: Vec<&str> = answer.match_indices("HTTP/1.1 ").map(|(at, _)| &answer[at + 9..at + 12]).collect();
    assert_eq!(statuses, ["200", "200", "100", "200"], "{answer}");
    assert!(answer.contains("\"one\"") && answer.contains("\"two\"") && answer.contains("\"three\""), "{answer}");
    // A HEAD gets the head only.
    let head = check_raw(&handle, b"HEAD / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"), "{head}");
    // Refused: a body announced beyond the API's 32 MB, a malformed head, a bad chunk size,
    // a content-length that is not a number.
    let too_large = check_raw(&handle, b"POST /v1/messages HTTP/1.1\r\ncontent-length: 40000000\r\n\r\n{");
    assert!(too_large.starts_with("HTTP/1.1 413 ") && too_large.contains("request_too_large"), "{too_large}");
    let malformed = check_raw(&handle, b"POST /v1/messages HTTP/1.1\r\nbad header line\r\n\r\n");
    assert!(malformed.starts_with("HTTP/1.1 400 ") && malformed.contains("malformed request head"), "{malformed}");
    let chunk = check_raw(&handle, b"POST /v1/messages HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n");
    assert!(chunk.starts_with("HTTP/1.1 400 ") && chunk.contains("chunk size"), "{chunk}");
    let length = check_raw(&handle, b"POST /v1/messages HTTP/1.1\r\ncontent-length: ten\r\n\r\n");
    assert!(length.starts_with("HTTP/1.1 400 ") && length.contains("content-length"), "{length}");
    // Only the three whole requests were measured.
    assert_eq!(stop(handle).rows.len(), 3);
}

#[test]
fn serve_puts_a_2_1_332_background_agents_requests_on_a_subagent_lane_without_false_breaks() {
    // The agent speaking 2.1.332 launches a background agent (tests/it/subagents.rs); its
    // bodies, sent to `serve` in order, are recognized from the structure alone: the agent's
    // requests (their own system prompt and tool set) on `subagent:1`, the main thread's
    // notification request continuing `main`.
    let output = crate::subagents::check_run_332(crate::subagents::BACKGROUND_332);
    let handle = check_server(&json!({}), ServeOptions::default());
    for request in &output.requests {
        check_message(&handle, &serde_json::to_value(request).unwrap());
    }
    let report = stop(handle);
    let lanes: Vec<&str> = report.rows.iter().map(|r| r.lane.as_str()).collect();
    assert_eq!(lanes, ["main", "main", "main", "subagent:1", "subagent:1", "main"]);
    for row in &report.rows {
        assert!(!row.cache_break, "row {} ({}): {:?}", row.index, row.lane, row.prefix);
        assert_eq!(row.prefix.diverged_at, None, "row {} ({})", row.index, row.lane);
    }
    // The agent's second request and the notification request read what came before them.
    assert!(report.rows[4].cache_read_input_tokens > 0 && report.rows[5].cache_read_input_tokens >= report.rows[2].context_tokens);
}
