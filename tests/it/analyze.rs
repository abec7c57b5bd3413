//! `analyze` on request logs: real shapes, bad input, truncation.

use ctxsim::analyze::{LogReader, analyze, analyze_stream, read_log};
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use serde_json::{Value, json};

use crate::support::*;

/// Reads and measures a log given as text, whole and as a stream: both give the same rows,
/// warnings and errors.
fn check_log(text: &str) -> Result<(Vec<ctxsim::measure::RequestMetrics>, Vec<String>), String> {
    let whole = (|| {
        let log = read_log(std::io::Cursor::new(text), "log.jsonl").map_err(|e| e.to_string())?;
        let rows = analyze(&log, &mut measurer(), "log.jsonl").map_err(|e| e.to_string())?;
        Ok((rows, log.warnings.iter().map(ToString::to_string).collect()))
    })();
    let streamed = stream_log(text);
    let show = |r: &Result<(Vec<ctxsim::measure::RequestMetrics>, Vec<String>), String>| match r {
        Ok((rows, warnings)) => format!("{}\n{warnings:?}", serde_json::to_string(rows).unwrap()),
        Err(e) => e.clone(),
    };
    assert_eq!(show(&whole), show(&streamed), "analyze_stream differs from analyze");
    whole
}

/// Measures a log as it is read ([`analyze_stream`]).
fn stream_log(text: &str) -> Result<(Vec<ctxsim::measure::RequestMetrics>, Vec<String>), String> {
    let mut reader = LogReader::new(std::io::Cursor::new(text), "log.jsonl");
    let rows = analyze_stream(&mut reader, &mut measurer(), "log.jsonl").map_err(|e| e.to_string())?;
    Ok((rows, reader.warnings().iter().map(ToString::to_string).collect()))
}

fn check_error(text: &str, expect: &str) {
    let err = check_log(text).expect_err("the log must be rejected");
    assert_eq!(err, expect);
}

/// A body shaped like the real 2.1.88 client's (real-client-oracle.md §3).
fn oracle_body(messages: Value) -> Value {
    let tool_names = [
        "Agent", "AskUserQuestion", "Bash", "CronCreate", "CronDelete", "CronList", "Edit", "EnterPlanMode", "EnterWorktree",
        "ExitPlanMode", "ExitWorktree", "Glob", "Grep", "NotebookEdit", "Read", "Skill", "TaskOutput", "TaskStop", "TodoWrite",
        "WebFetch", "WebSearch", "Write",
    ];
    let tools: Vec<Value> = tool_names
        .iter()
        .map(|n| json!({"name": n, "description": text_of(n, 700), "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"], "additionalProperties": false, "$schema": "https://json-schema.org/draft/2020-12/schema"}}))
        .collect();
    json!({
        "model": "claude-sonnet-4-6",
        "messages": messages,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.88.a1b; cc_entrypoint=sdk-cli; cch=00000;"},
            {"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK."},
            {"type": "text", "text": text_of("static", 2900), "cache_control": {"type": "ephemeral", "scope": "global"}},
            {"type": "text", "text": text_of("dynamic", 3800)}
        ],
        "tools": tools,
        "metadata": {"user_id": "{\"device_id\":\"d\",\"account_uuid\":\"\",\"session_id\":\"s\"}"},
        "max_tokens": 32000,
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "stream": true
    })
}

#[test]
fn real_client_shaped_requests_are_measured() {
    let first = oracle_body(json!([{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>skills</system-reminder>"},
        {"type": "text", "text": "read a.txt", "cache_control": {"type": "ephemeral"}}]}]));
    let second = oracle_body(json!([
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>skills</system-reminder>"}, {"type": "text", "text": "read a.txt"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": "sig"}, {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/a.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "     1\thello", "cache_control": {"type": "ephemeral"}}]}
    ]));
    let text = format!("{}\n{}\n", json!({"time_ms": 0, "body": first}), json!({"time_ms": 4000, "body": second}));
    let (rows, warnings) = check_log(&text).unwrap();
    assert!(warnings.is_empty());
    assert_eq!(rows[0].blocks.tools, 22);
    assert_eq!(rows[0].blocks.system, 4);
    // The second request reads everything the first cached.
    assert_eq!(rows[1].cache_read_input_tokens, rows[0].cache_read_input_tokens + rows[0].cache_creation_input_tokens);
    assert_eq!(rows[1].lane, "main");
    assert_eq!(rows[1].prefix.diverged_at, None);
}

#[test]
fn real_claude_trace_bodies_round_trip() {
    // Every body of the 64 captured requests parses and serializes back to an equal value.
    let path = realdata().join("api_captures/claude-trace/test-traffic.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let mut n = 0;
    for line in text.lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        let body = record["request"]["body"].clone();
        let request: ctxsim::api::Request = serde_json::from_value(body.clone()).unwrap();
        assert_eq!(serde_json::to_value(&request).unwrap(), body);
        n += 1;
    }
    assert_eq!(n, 64);
}

#[test]
fn malformed_json_names_file_and_line() {
    check_error(
        "{\"time_ms\": 0, \"body\": {\"model\": \"claude-sonnet-4-5\", \"messages\": []}}\n{\"time_ms\": 1,, }\n{\"time_ms\": 2}\n",
        "log.jsonl:2: malformed JSON: key must be a string at line 1 column 15",
    );
}

#[test]
fn a_body_that_is_not_a_request_names_the_field() {
    check_error(
        "{\"time_ms\": 0, \"body\": {\"model\": \"claude-sonnet-4-5\", \"messages\": [{\"role\": \"robot\", \"content\": \"hi\"}]}}\n",
        "log.jsonl:1: body.messages[0].role: unknown variant `robot`, expected one of `user`, `assistant`, `system`",
    );
    check_error("{\"time_ms\": 0, \"body\": [1]}\n", "log.jsonl:1: body: not a Messages API request (expected an object)");
    check_error("{\"time_ms\": 0, \"body\": {\"messages\": []}}\n", "log.jsonl:1: body: missing field `model`");
    check_error("{\"tim_ms\": 0, \"body\": {}}\n", "log.jsonl:1: tim_ms: unknown field `tim_ms`, expected one of `time_ms`, `time`, `body`, `lane`, `usage`");
}

#[test]
fn an_unknown_model_lists_the_known_ones() {
    let err = check_log("{\"time_ms\": 0, \"body\": {\"model\": \"gpt-5\", \"messages\": []}}\n").unwrap_err();
    assert!(err.starts_with("log.jsonl:1: unknown model `gpt-5`; known models: claude-fable-5,"), "{err}");
    assert!(err.ends_with("Pass --model-table FILE to add it"), "{err}");
}

#[test]
fn a_truncated_last_line_is_reported_and_the_rest_measured() {
    let line = json!({"time_ms": 0, "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}}).to_string();
    let text = format!("{line}\n{line}\n{}", &line[..line.len() / 2]);
    let (rows, warnings) = check_log(&text).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].starts_with("log.jsonl:3: skipped truncated last line"), "{}", warnings[0]);
}

#[test]
fn rfc3339_times_and_arrays_of_bodies() {
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]});
    let text = format!(
        "{}\n{}\n",
        json!({"time": "2026-01-01T00:00:00Z", "body": body}),
        json!({"time": "2026-01-01T00:01:30.5Z", "body": body})
    );
    let (rows, _) = check_log(&text).unwrap();
    assert_eq!(rows[1].time_ms, 90_500);
    let (rows, _) = check_log(&json!([body, body, body]).to_string()).unwrap();
    assert_eq!(rows.iter().map(|r| r.time_ms).collect::<Vec<_>>(), vec![0, 1000, 2000]);
}

#[test]
fn lanes_are_inferred_from_message_prefixes() {
    let user = |t: &str| json!({"role": "user", "content": t});
    let asst = |t: &str| json!({"role": "assistant", "content": [{"type": "text", "text": t}]});
    let body = |messages: Vec<Value>| json!({"model": MODEL, "messages": messages});
    let lines = [
        body(vec![user("main 1")]),
        body(vec![user("title please")]),
        body(vec![user("main 1"), asst("a"), user("main 2")]),
        body(vec![user("main 1"), asst("a"), user("main 2"), asst("b"), user("main 3")]),
    ];
    let text: String = lines.iter().enumerate().map(|(i, b)| format!("{}\n", json!({"time_ms": i * 1000, "body": b}))).collect();
    let (rows, _) = check_log(&text).unwrap();
    assert_eq!(rows.iter().map(|r| r.lane.as_str()).collect::<Vec<_>>(), vec!["main", "side:1", "main", "main"]);
}

/// Measures a log as read (head and message keys on) and with its keys dropped (everything
/// compared by content): the rows must be the same, byte for byte.
fn check_keys_change_nothing(text: &str) -> usize {
    let log = read_log(std::io::Cursor::new(text), "log.jsonl").unwrap();
    assert!(log.entries.iter().all(|e| e.head_key.is_some() && e.message_keys.as_ref().is_some_and(|k| k.len() == e.body.messages.len())));
    let keyed = analyze(&log, &mut measurer(), "log.jsonl").unwrap();
    let mut unkeyed_log = read_log(std::io::Cursor::new(text), "log.jsonl").unwrap();
    for entry in &mut unkeyed_log.entries {
        entry.message_keys = None;
        entry.head_key = None;
    }
    let unkeyed = analyze(&unkeyed_log, &mut measurer(), "log.jsonl").unwrap();
    assert_eq!(serde_json::to_string(&keyed).unwrap(), serde_json::to_string(&unkeyed).unwrap());
    // Streamed in batches (tokenized ahead batch by batch): the same rows again, with `chars4`
    // and with `bpe` (which tokenizes ahead).
    let (streamed, _) = stream_log(text).unwrap();
    assert_eq!(serde_json::to_string(&keyed).unwrap(), serde_json::to_string(&streamed).unwrap());
    let bpe = || Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Bpe));
    let whole = analyze(&log, &mut bpe(), "log.jsonl").unwrap();
    let streamed = analyze_stream(&mut LogReader::new(std::io::Cursor::new(text), "log.jsonl"), &mut bpe(), "log.jsonl").unwrap();
    assert_eq!(serde_json::to_string(&whole).unwrap(), serde_json::to_string(&streamed).unwrap());
    keyed.len()
}

#[test]
fn message_keys_change_nothing() {
    // A generated session with an earlier message rewritten now and then, the same message
    // written with other whitespace (other bytes, same content), the system prompt changed
    // and changed back, and a side lane in between.
    let mut text = String::new();
    for (i, entry) in ctxsim::synth::growing_session(3, 120, 30_000, "claude-sonnet-4-5").into_iter().enumerate() {
        let mut body = serde_json::to_value(&entry.body).unwrap();
        if i % 17 == 5 {
            body["messages"][0]["content"] = json!("rewritten opening prompt");
        }
        if i % 23 == 9 {
            body["system"][0]["text"] = json!("another system prompt");
            body["max_tokens"] = json!(1000);
        }
        let mut line = serde_json::to_string(&json!({"time_ms": entry.time_ms, "body": body})).unwrap();
        if i % 11 == 3 {
            line = serde_json::to_string_pretty(&json!({"time_ms": entry.time_ms, "body": body})).unwrap().replace('\n', " ");
        }
        text.push_str(&line);
        text.push('\n');
        if i % 29 == 7 {
            let side = json!({"model": "claude-haiku-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": format!("summarize {i}")}]});
            text.push_str(&serde_json::to_string(&json!({"time_ms": entry.time_ms + 1, "body": side})).unwrap());
            text.push('\n');
        }
    }
    assert_eq!(check_keys_change_nothing(&text), 124);

    // The 64 real request bodies of the claude-trace capture, as an analyze log.
    let path = realdata().join("api_captures/claude-trace/test-traffic.jsonl");
    let converted = ctxsim::recording::claude_trace::convert_claude_trace(std::io::BufReader::new(std::fs::File::open(&path).unwrap()), "capture").unwrap();
    let mut log = Vec::new();
    ctxsim::recording::claude_trace::write_request_log_to(&converted.entries, &mut log).unwrap();
    assert_eq!(check_keys_change_nothing(&String::from_utf8(log).unwrap()), 64);
}

#[test]
fn an_error_inside_a_message_names_its_path() {
    // The second request repeats the first message (parsed once, then reused) and adds a bad one.
    let ok = json!({"role": "user", "content": "hello"});
    let bad = json!({"role": "user", "content": [{"type": "text", "text": 5}]});
    let line = |messages: Value| serde_json::to_string(&json!({"time_ms": 0, "body": {"model": "claude-sonnet-4-5", "messages": messages}})).unwrap();
    let text = format!("{}\n{}\n", line(json!([ok])), line(json!([ok, {"role": "assistant", "content": "hi"}, bad])));
    let err = check_log(&text).expect_err("the log must be rejected");
    assert!(err.starts_with("log.jsonl:2: body.messages[2].content"), "{err}");
}

/// `ctxsim analyze FILE` measures a log as it reads it: a truncated last line is a warning
/// (the rest measured, the trace written), a malformed line in the middle exit code 2 naming
/// file and line, with nothing written.
#[test]
fn the_cli_streams_a_log_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::new();
    for entry in ctxsim::synth::growing_session(5, 150, 20_000, "claude-sonnet-4-5") {
        text.push_str(&serde_json::to_string(&json!({"time_ms": entry.time_ms, "body": entry.body})).unwrap());
        text.push('\n');
    }
    let truncated = format!("{text}{{\"time_ms\": 99999999, \"body\": {{\"model\"");
    std::fs::write(dir.path().join("log.jsonl"), &truncated).unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim")).current_dir(dir.path()).args(args).output().unwrap();
        (out.status.code().unwrap(), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
    };
    let (code, stdout, stderr) = run(&["analyze", "log.jsonl", "--estimator", "chars4", "--format", "json", "--trace", "trace.jsonl"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("log.jsonl:151: skipped truncated last line"), "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    let requests = summary.pointer("/0/requests").or_else(|| summary.pointer("/requests")).and_then(Value::as_u64);
    assert_eq!(requests, Some(150), "{stdout}");
    let trace = std::fs::read_to_string(dir.path().join("trace.jsonl")).unwrap();
    assert_eq!(trace.lines().count(), 150);
    // The same rows as reading the whole log first.
    let (rows, warnings) = check_log(&truncated).unwrap();
    assert_eq!(warnings.len(), 1);
    assert_eq!(trace, String::from_utf8(ctxsim::report::output::trace_jsonl(&rows)).unwrap());

    let mut lines: Vec<&str> = text.lines().collect();
    lines[100] = "{\"time_ms\": 5, \"body\": [1, 2]}";
    std::fs::write(dir.path().join("bad.jsonl"), lines.join("\n")).unwrap();
    let (code, _, stderr) = run(&["analyze", "bad.jsonl", "--estimator", "chars4", "--trace", "bad-trace.jsonl"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("bad.jsonl:101: body"), "{stderr}");
    assert!(!dir.path().join("bad-trace.jsonl").exists());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
    /// A log cut anywhere, or with a line damaged anywhere, is measured the same whole and
    /// streamed: the same rows and warnings, or the same error (`check_log` compares them).
    /// A cut inside the last line is a warning, never a panic; a cut before the end of the
    /// first line leaves no request, which is an error.
    #[test]
    fn a_cut_or_damaged_log_reads_the_same_whole_and_streamed(cut in 0.0f64..1.0, damage in proptest::option::of((0.0f64..1.0, 0u8..128))) {
        let text = cut_log_text();
        let mut bytes = text.as_bytes()[..((text.len() as f64 * cut) as usize)].to_vec();
        if let Some((at, byte)) = damage {
            let at = (bytes.len() as f64 * at) as usize;
            if at < bytes.len() {
                bytes[at] = byte;
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        let result = check_log(&text);
        if damage.is_none() {
            let complete = text.matches('\n').count();
            // A cut that leaves no request at all is an error (issue 14: never "0 requests").
            if let Err(e) = &result {
                proptest::prop_assert!(complete == 0 && e.starts_with("log.jsonl: no request in it"), "{e}");
                return Ok(());
            }
            let (rows, warnings) = result.expect("a cut log is measured up to the cut");
            // Every line ended by a newline is measured; a last line without one is measured
            // when it is whole (the cut fell right after it), else it is the one warning.
            let last_whole = rows.len() == complete + 1 && warnings.is_empty();
            proptest::prop_assert!(rows.len() == complete || last_whole, "{} rows for {complete} complete lines", rows.len());
            proptest::prop_assert!(warnings.len() <= 1);
        }
    }
}

/// A short generated log with a side lane (the text the cut-log property cuts).
fn cut_log_text() -> String {
    let mut text = String::new();
    for (i, entry) in ctxsim::synth::growing_session(9, 70, 6_000, "claude-sonnet-4-5").into_iter().enumerate() {
        text.push_str(&serde_json::to_string(&json!({"time_ms": entry.time_ms, "body": entry.body})).unwrap());
        text.push('\n');
        if i % 31 == 4 {
            let side = json!({"model": "claude-haiku-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": format!("title {i}")}]});
            text.push_str(&serde_json::to_string(&json!({"time_ms": entry.time_ms + 1, "body": side})).unwrap());
            text.push('\n');
        }
    }
    text
}
