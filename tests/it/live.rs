//! `ctxsim live`: the agent against a Messages API — here `ctxsim serve` in-process, whose
//! script makes the tool calls the agent then runs in its World.

use ctxsim::api::{ContentBlock, Request, StopReason, ToolResultContent};
use ctxsim::live::client::{ClientConfig, HttpClient, LiveError, MessagesApi, retry_delay};
use ctxsim::live::run::{LiveOptions, LiveOutput, live_table, live_totals, run_live};
use ctxsim::live::{Script, ServeOptions, Service, start};
use ctxsim::recording::format::{EventKind, read_recording_from, write_recording_to};
use serde_json::{Value, json};

use crate::support::*;

const SCENARIO: &str = r#"
name: live-edit
world:
  model: claude-sonnet-4-5
  clock_start: "2026-03-02T14:30:00Z"
  seed: 7
  cwd: /repo
  files:
    src/lib.rs: |
      pub fn add(a: i32, b: i32) -> i32 { a + b }
script:
  - user: "What does add do?"
  - wait: 6m
  - user: "Make it saturating"
"#;

fn config(base_url: String, max_retries: u32) -> ClientConfig {
    let env = |name: &str| match name {
        "ANTHROPIC_API_KEY" => Some("test-key".to_owned()),
        "ANTHROPIC_BASE_URL" => Some(base_url.clone()),
        _ => None,
    };
    ClientConfig { max_retries, ..ClientConfig::from_env(env).unwrap() }
}

/// Runs the scenario live against a served script; the output and the server's report.
fn check_live(script: Value, yaml: &str) -> (LiveOutput, ctxsim::live::ServeReport) {
    check_live_as(script, yaml, &ctxsim::strategy::Strategy::default())
}

/// [`check_live`] with the agent on `strategy`.
fn check_live_as(script: Value, yaml: &str, strategy: &ctxsim::strategy::Strategy) -> (LiveOutput, ctxsim::live::ServeReport) {
    let scenario = ctxsim::scenario::parse_scenario(yaml, "live.yaml").unwrap_or_else(|e| panic!("{e}"));
    let script = Script::parse(&script.to_string(), "script.json").unwrap();
    let handle = start(0, Service::new(script, measurer(), ServeOptions::default()).unwrap()).unwrap();
    let mut client = HttpClient::new(config(handle.base_url(), 0));
    let output = run_live(&scenario, &mut measurer(), strategy, &mut client, &LiveOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    (output, handle.stop().unwrap())
}

#[test]
fn the_agent_runs_against_served_replies_and_its_estimate_matches_the_served_usage() {
    let script = json!({"main": [
        {"content": [{"text": "Reading it."}, {"tool_use": {"name": "Read", "input": {"file_path": "/repo/src/lib.rs"}}}]},
        {"content": "It adds two numbers."},
        {"content": [{"tool_use": {"name": "Edit", "input": {"file_path": "/repo/src/lib.rs", "old_string": "a + b", "new_string": "a.saturating_add(b)"}}}]},
        {"content": [{"tool_use": {"name": "Read", "input": {"file_path": "/repo/src/lib.rs"}}}]},
        {"content": "Done: add saturates now."}
    ]});
    let (output, served) = check_live(script, SCENARIO);
    let main: Vec<_> = output.calls.iter().filter(|c| c.row.lane == "main").collect();
    assert_eq!(main.len(), 5, "{}", live_table(&output.calls));
    // The server measured the same bodies at the same virtual times: estimate = actual.
    for call in &main {
        let actual = call.actual.as_ref().unwrap();
        assert_eq!((actual.cache_read_input_tokens, actual.cache_creation_input_tokens, actual.input_tokens), split(&call.row));
    }
    let served_main: Vec<_> = served.rows.iter().filter(|r| r.lane == "main").collect();
    assert_eq!(served_main.iter().map(|r| split(r)).collect::<Vec<_>>(), main.iter().map(|c| split(&c.row)).collect::<Vec<_>>());
    assert_eq!(served_main.iter().map(|r| r.time_ms).collect::<Vec<_>>(), main.iter().map(|c| c.row.time_ms).collect::<Vec<_>>());
    let totals = live_totals(&output.calls);
    assert_eq!((totals.calls, totals.cache_read_error, totals.cache_creation_error), (5, 0.0, 0.0));
    assert!(totals.cache_read.1 > 0);
    // Within a turn the cache is read; after the 6-minute wait the 5-minute entries are gone.
    assert!(main[1].row.cache_read_input_tokens > 0);
    assert_eq!(main[2].row.time_ms - main[1].row.time_ms, 1_000 + 360_000, "virtual time: the call, then 6 minutes");
    assert!(main[2].row.cache_read_input_tokens < main[1].row.cache_read_input_tokens + main[1].row.cache_creation_input_tokens);
    // The Edit ran in the World: the second Read sees the new text.
    let results: Vec<String> = output
        .recording
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult(r) => Some(match &r.content {
                Some(ToolResultContent::Text(text)) => String::clone(text),
                other => format!("{other:?}"),
            }),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 3, "{results:?}");
    assert!(results[0].contains("a + b") && results[2].contains("a.saturating_add(b)"), "{results:?}");
    let table = live_table(&output.calls);
    assert!(table.contains("(+0.0%)"), "{table}");
}

#[test]
fn the_recording_is_a_valid_v1_recording_of_the_conversation() {
    let script = json!({"main": [
        {"content": [{"tool_use": {"name": "Read", "input": {"file_path": "/repo/src/lib.rs"}}}]},
        {"content": "It adds."},
        {"content": "It saturates now."}
    ]});
    let (output, _) = check_live(script, SCENARIO);
    let mut bytes = Vec::new();
    write_recording_to(&output.recording, &mut bytes).unwrap();
    let read = read_recording_from(std::io::Cursor::new(bytes), "live.jsonl").unwrap();
    assert!(read.warnings.is_empty());
    assert_eq!(read.recording, output.recording);
    assert_eq!(read.recording.header.source, "live");
    let kinds: Vec<&str> = read.recording.events.iter().map(|e| e.name()).collect();
    assert_eq!(kinds, ["user_prompt", "model_reply", "tool_result", "model_reply", "time", "user_prompt", "model_reply"]);
    let EventKind::ModelReply(first) = &read.recording.events[1].kind else { unreachable!() };
    assert_eq!(first.message_id.as_deref(), Some("msg_ctxsim_0001"));
    assert_eq!(first.request_id.as_deref(), Some("req_ctxsim_0001"));
    assert_eq!(first.stop_reason, Some(StopReason::ToolUse));
    assert!(first.usage.cache_creation_input_tokens > 0);
}

/// A stand-in API that answers with the statuses given, then 200 (one connection per request,
/// read by serve's HTTP layer).
fn flaky_server(statuses: Vec<(u16, &'static str)>) -> (String, std::thread::JoinHandle<usize>) {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let thread = std::thread::spawn(move || {
        let mut served = 0;
        let timeouts = ctxsim::live::http::Timeouts { read: std::time::Duration::from_secs(20), request: std::time::Duration::from_secs(20) };
        for answer in statuses.iter().copied().map(Some).chain(std::iter::once(None)) {
            let (mut stream, request) = loop {
                let (stream, _) = listener.accept().unwrap();
                let mut connection = ctxsim::live::http::Connection::new(stream.try_clone().unwrap(), timeouts, 1 << 20).unwrap();
                if let ctxsim::live::http::Incoming::Request { request, .. } = connection.next_request() {
                    break (stream, request);
                }
            };
            assert_eq!(request.headers.iter().find(|(name, _)| name == "x-api-key").unwrap().1, "test-key");
            served += 1;
            let (code, body) = match answer {
                Some((code, kind)) => (code, json!({"type": "error", "error": {"type": kind, "message": "try later"}})),
                None => (200, json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [{"type": "text", "text": "hi"}],
                                     "stop_reason": "end_turn", "usage": {"input_tokens": 5, "output_tokens": 1}})),
            };
            let body = body.to_string();
            write!(stream, "HTTP/1.1 {code} Status\r\nretry-after: 0\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()).unwrap();
        }
        served
    });
    (url, thread)
}

fn hello() -> Request {
    serde_json::from_value(json!({"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "hello"}]})).unwrap()
}

#[test]
fn rate_limits_and_overload_are_retried_with_retry_after() {
    let (url, thread) = flaky_server(vec![(429, "rate_limit_error"), (529, "overloaded_error")]);
    let reply = HttpClient::new(config(url, 4)).send(&hello(), 0).unwrap();
    assert_eq!((reply.retries, reply.response.content.clone()), (2, vec![ContentBlock::text("hi")]));
    assert_eq!(thread.join().unwrap(), 3);
}

#[test]
fn retries_are_bounded_and_errors_keep_the_apis_message() {
    let (url, _thread) = flaky_server(vec![(529, "overloaded_error"), (529, "overloaded_error")]);
    let error = HttpClient::new(config(url, 1)).send(&hello(), 0).unwrap_err();
    assert!(matches!(&error, LiveError::Api { status: 529, kind, .. } if kind == "overloaded_error"), "{error}");
    assert_eq!(error.to_string(), "the API answered 529: overloaded_error: try later");
    assert_eq!(retry_delay(Some("3"), 0), std::time::Duration::from_secs(3));
    assert_eq!(retry_delay(Some("3600"), 0), std::time::Duration::from_secs(60));
    assert_eq!(retry_delay(None, 2), std::time::Duration::from_secs(4));
}

#[test]
fn live_needs_an_api_key() {
    let error = ClientConfig::from_env(|_| None).unwrap_err();
    assert!(error.to_string().starts_with("ANTHROPIC_API_KEY is not set"));
}

#[test]
fn live_speaking_2_1_332_runs_a_background_agent_after_the_turn_and_asks_again_for_its_notification() {
    // `serve` answers the agent's requests from `main` too: launch, the turn's end, the
    // agent's answer, the reply to the notification.
    let script = json!({"main": [
        {"content": [{"tool_use": {"name": "Agent", "input": {"description": "Summarize lib.rs", "prompt": "Summarize src/lib.rs.", "subagent_type": "general-purpose"}}}]},
        {"content": "Started an agent on it."},
        {"content": "lib.rs defines add."},
        {"content": "The agent says lib.rs defines add."}
    ]});
    let yaml = "name: live-bg\nworld:\n  model: claude-opus-5-5\n  context_window: 1000000\n  cwd: /repo\n  files:\n    src/lib.rs: \"pub fn add() {}\\n\"\nscript:\n  - user: Summarize lib.rs with an agent.\n";
    let strategy = ctxsim::strategy::Strategy { client_version: "2.1.332".to_owned(), ..Default::default() };
    let (output, served) = check_live_as(script, yaml, &strategy);
    let lanes: Vec<&str> = output.calls.iter().map(|c| c.row.lane.as_str()).collect();
    assert_eq!(lanes, ["main", "main", "subagent:general-purpose", "main"], "{}", live_table(&output.calls));
    let served_lanes: Vec<&str> = served.rows.iter().map(|r| r.lane.as_str()).collect();
    assert_eq!(served_lanes, ["main", "main", "subagent:1", "main"]);
    // The notification is in the recording, as the user message that started the last call.
    let notification = output.recording.events.iter().find_map(|e| match &e.kind {
        EventKind::UserPrompt(p) => serde_json::to_string(&p.content).ok().filter(|t| t.contains("task-notification")),
        _ => None,
    });
    assert!(notification.is_some_and(|t| t.contains("lib.rs defines add.")));
}
