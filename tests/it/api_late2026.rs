//! The late-2026 API rules (reference/current-client-and-api.md §1): mid-conversation system
//! messages and their placement, tool changes and inline definitions, grouped tool runs in the
//! lookback, effort in a system message, the new models' minimum lengths and prices. One worked
//! example per rule, each with the contrast that fails when the rule is dropped.

use ctxsim::api::Request;
use ctxsim::measure::{CacheSim, EstimatorKind, MeasureInput, Measurer, ModelTable, RequestMetrics, TokenCounter};
use serde_json::{Value, json};

use crate::support::*;

const OPUS55: &str = "claude-opus-5-5";

fn body(value: Value) -> Request {
    ctxsim::measure::blocks::parse_request(value).unwrap_or_else(|e| panic!("{e}"))
}

fn cc() -> Value {
    json!({"type": "ephemeral"})
}

/// A marked text block of `tokens` chars4 tokens.
fn marked(tag: &str, tokens: usize) -> Value {
    json!([{"type": "text", "text": text_of(tag, tokens), "cache_control": cc()}])
}

/// A request on Opus 5.5 with two tools, a marked system prompt and these messages.
fn request(messages: Value) -> Request {
    body(json!({
        "model": OPUS55,
        "max_tokens": 1000,
        "tools": [
            {"name": "Read", "description": text_of("read", 200), "input_schema": {"type": "object"}},
            {"name": "Late", "description": text_of("late", 100), "input_schema": {"type": "object"}, "defer_loading": true}
        ],
        "system": [{"type": "text", "text": text_of("sys", 600), "cache_control": cc()}],
        "messages": messages,
    }))
}

fn run(requests: &[Request]) -> Vec<RequestMetrics> {
    let mut m = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
    requests.iter().enumerate().map(|(i, r)| m.measure(MeasureInput::new("main", i as u64 * 1000, r)).unwrap()).collect()
}

/// The tokens of a request as the simulator counts them.
fn total(request: &Request) -> u64 {
    run(std::slice::from_ref(request))[0].context_tokens
}

#[test]
fn a_system_message_is_cached_like_any_message_and_holds_the_marker_while_last() {
    let first = request(json!([{"role": "user", "content": marked("u1", 1000)}]));
    // The client appends its system message after the first prompt, with the marker on it.
    let second = request(json!([
        {"role": "user", "content": text_of("u1", 1000)},
        {"role": "system", "content": marked("env", 500)}
    ]));
    // Next turn: the system message is a plain string, the marker is on the new last message.
    let third = request(json!([
        {"role": "user", "content": text_of("u1", 1000)},
        {"role": "system", "content": text_of("env", 500)},
        {"role": "assistant", "content": [{"type": "text", "text": text_of("a1", 100)}]},
        {"role": "user", "content": marked("u2", 100)}
    ]));
    // Editing the sent system message is an edit of an earlier message.
    let edited = request(json!([
        {"role": "user", "content": text_of("u1", 1000)},
        {"role": "system", "content": text_of("env-2", 500)},
        {"role": "assistant", "content": [{"type": "text", "text": text_of("a1", 100)}]},
        {"role": "user", "content": marked("u2", 100)}
    ]));
    let rows = run(&[first.clone(), second.clone(), third.clone(), edited]);
    // Appending it kept the whole earlier prefix: only the system message is written.
    assert_eq!(rows[1].cache_read_input_tokens, total(&first));
    assert_eq!(rows[1].cache_creation_input_tokens, 500);
    assert_eq!(rows[1].prefix.diverged_at, None);
    // Its entry, written while it was last and marked, is read through the string flip.
    assert_eq!(rows[2].cache_read_input_tokens, total(&second));
    assert_eq!(rows[2].prefix.read_at.as_deref(), Some("messages[1].content[0]"));
    // The edit misses from the system message on: the entry at messages[0] is the read.
    assert_eq!(rows[3].prefix.diverged_at.as_deref(), Some("messages[1].content[0]"));
    assert_eq!(rows[3].cache_read_input_tokens, total(&first));
    // Its role is part of its identity: the same text as a user message is another block.
    let as_user = request(json!([
        {"role": "user", "content": text_of("u1", 1000)},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {"role": "user", "content": marked("env", 500)}
    ]));
    let as_system = request(json!([
        {"role": "user", "content": text_of("u1", 1000)},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {"role": "system", "content": marked("env", 500)}
    ]));
    let rows = run(&[as_user, as_system]);
    assert_eq!(rows[1].prefix.diverged_at.as_deref(), Some("messages[2].content[0]"));
}

/// The error of a one-request run.
fn error_of(messages: Value) -> Option<String> {
    run(&[request(messages)])[0].error.clone()
}

#[test]
fn a_misplaced_system_message_is_the_apis_400() {
    let user = json!({"role": "user", "content": "hi"});
    let system = json!({"role": "system", "content": "be brief"});
    let tool_use = json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]});
    let tool_result = json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]});
    let answer = json!({"role": "assistant", "content": "ok"});
    // Accepted: after a user turn, after a tool-result-only turn, before an assistant turn,
    // consecutive system messages, after an assistant turn ending in a server tool's result.
    for ok in [
        json!([user, system]),
        json!([user, system, answer, user]),
        json!([user, tool_use, tool_result, system]),
        json!([user, system, {"role": "system", "content": "and exact"}]),
        json!([user, {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {"query": "q"}},
            {"type": "web_search_tool_result", "tool_use_id": "s1", "content": []}
        ]}, system]),
        // An effort-only message (empty content) may sit anywhere, even first.
        json!([{"role": "system", "content": "", "output_config": {"effort": "low"}}, user]),
        json!([user, tool_use, {"role": "system", "content": [], "output_config": {"effort": "high"}}, tool_result]),
    ] {
        assert_eq!(error_of(ok.clone()), None, "{ok}");
    }
    for (bad, says) in [
        (json!([system, user]), "messages.0: a system message cannot be the first message"),
        (json!([user, tool_use, system, tool_result]), "messages.2: a system message must directly follow a user turn"),
        (json!([user, answer, system]), "messages.2: a system message must directly follow"),
        (json!([user, system, user]), "messages.1: a system message must be the last message or be followed by an assistant turn"),
        (json!([user, {"role": "system", "content": marked("x", 10), "clear_at": "next_user_message"}]), "turn-scoped"),
    ] {
        let error = error_of(bad.clone()).unwrap_or_else(|| panic!("accepted: {bad}"));
        assert!(error.contains(says), "{bad}: {error}");
    }
}

#[test]
fn serve_answers_a_misplaced_system_message_with_an_invalid_request_error() {
    use ctxsim::live::serve::{HttpRequest, ServeOptions, Service};
    let script = ctxsim::live::script::Script::parse(r#"{"main": [{"content": "done"}]}"#, "inline.json").unwrap();
    let measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
    let mut service = Service::new(script, measurer, ServeOptions::default()).unwrap();
    let post = |value: &Request| HttpRequest {
        method: "POST".to_owned(),
        url: "/v1/messages".to_owned(),
        headers: Vec::new(),
        body: serde_json::to_vec(value).unwrap(),
    };
    let bad = request(json!([{"role": "system", "content": "first"}, {"role": "user", "content": "hi"}]));
    let reply = service.handle(&post(&bad));
    assert_eq!(reply.status, 400);
    let error: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert_eq!(error["error"]["message"], "messages.0: a system message cannot be the first message");
    // The scripted reply is kept for the next, well-formed request.
    let good = request(json!([{"role": "user", "content": "hi"}, {"role": "system", "content": "be brief"}]));
    let reply = service.handle(&post(&good));
    assert_eq!(reply.status, 200);
    let response: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(response["content"][0]["text"], "done");
}

fn tool_change(kind: &str, tool: Value) -> Value {
    json!({"type": kind, "tool": tool})
}

#[test]
fn tool_changes_in_a_system_message_keep_the_cached_prefix() {
    let history = json!([
        {"role": "user", "content": text_of("u1", 1000)},
        {"role": "assistant", "content": [{"type": "text", "text": text_of("a1", 100)}]},
    ]);
    let mut first = history.clone();
    first.as_array_mut().unwrap().push(json!({"role": "user", "content": marked("u2", 100)}));
    let mut second = history.clone();
    second.as_array_mut().unwrap().extend([
        json!({"role": "user", "content": text_of("u2", 100)}),
        json!({"role": "system", "content": [
            tool_change("tool_addition", json!({"type": "tool_reference", "name": "Late"})),
            tool_change("tool_removal", json!({"type": "tool_reference", "name": "Read"})),
            tool_change("tool_addition", json!({"type": "tool_definition", "definition": {"name": "Fresh", "input_schema": {"type": "object"}}})),
            {"type": "text", "text": "Tools changed.", "cache_control": cc()}
        ]}),
    ]);
    let (first, second) = (request(first), request(second));
    let rows = run(&[first.clone(), second.clone()]);
    // The tools array never changed: the whole earlier prefix is read, the message is new input.
    assert_eq!(rows[1].error, None);
    assert_eq!(rows[1].cache_read_input_tokens, total(&first));
    assert_eq!(rows[1].cache_creation_input_tokens, total(&second) - total(&first));
    assert_eq!(rows[1].prefix.diverged_at, None);

    // A reference to a tool that `tools` does not hold is unresolved; a definition of another
    // type under a known name conflicts.
    let unresolved = json!([{"role": "user", "content": "hi"}, {"role": "system", "content": [
        tool_change("tool_addition", json!({"type": "tool_reference", "name": "Nope"}))
    ]}]);
    assert!(error_of(unresolved).unwrap().contains("tool_reference_unresolved: no tool named `Nope`"));
    let conflict = json!([{"role": "user", "content": "hi"}, {"role": "system", "content": [
        tool_change("tool_addition", json!({"type": "tool_definition", "definition": {"type": "web_search_20250305", "name": "Read"}}))
    ]}]);
    assert!(error_of(conflict).unwrap().contains("tool_name_conflict"));
}

#[test]
fn the_first_inline_definition_without_a_non_deferred_tool_is_one_full_miss() {
    let tools_of = |deferred_only: bool| {
        let mut tools = vec![json!({"name": "Placeholder", "description": text_of("ph", 50), "input_schema": {"type": "object"}, "defer_loading": true})];
        if !deferred_only {
            tools.push(json!({"name": "Read", "description": text_of("read", 200), "input_schema": {"type": "object"}}));
        }
        tools
    };
    let at = |deferred_only: bool, turns: usize| {
        let mut messages = vec![json!({"role": "user", "content": text_of("u1", 1000)})];
        if turns >= 2 {
            messages.push(json!({"role": "system", "content": [tool_change(
                "tool_addition",
                json!({"type": "tool_definition", "definition": {"name": "Fresh", "description": text_of("fresh", 100), "input_schema": {"type": "object"}}})
            )]}));
            messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": text_of("a", 100)}]}));
            messages.push(json!({"role": "user", "content": text_of("u2", 100)}));
        }
        if turns >= 3 {
            messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": text_of("b", 100)}]}));
            messages.push(json!({"role": "user", "content": text_of("u3", 100)}));
        }
        let mut request = body(json!({
            "model": OPUS55, "max_tokens": 1000, "tools": tools_of(deferred_only),
            "system": [{"type": "text", "text": text_of("sys", 600)}], "messages": messages,
        }));
        request.cache_control = Some(ctxsim::api::CacheControl::ephemeral());
        request
    };
    // Only deferred tools: the definition opens the rendered prompt, so its first request
    // reads nothing; the next one reads what that one wrote.
    let rows = run(&[at(true, 1), at(true, 2), at(true, 3)]);
    assert_eq!(rows[1].cache_read_input_tokens, 0);
    assert_eq!(rows[1].prefix.diverged_at.as_deref(), Some("tools[0]"));
    assert_eq!(rows[2].cache_read_input_tokens, total(&at(true, 2)));
    // A non-deferred tool keeps the start: the same definition costs only its own message.
    let rows = run(&[at(false, 1), at(false, 2)]);
    assert_eq!(rows[1].cache_read_input_tokens, total(&at(false, 1)));
}

/// A session on Opus 5.5: a marked first prompt, then one assistant turn of `parallel`
/// parallel tool calls (or `parallel` sequential rounds when `sequential`), then a marked
/// prompt. Each tool_use and tool_result is a block of its own.
fn tool_turns(parallel: usize, sequential: bool) -> (Request, Request) {
    let first = request(json!([{"role": "user", "content": marked("u1", 5000)}]));
    let mut messages = vec![json!({"role": "user", "content": text_of("u1", 5000)})];
    let call = |i: usize| json!({"type": "tool_use", "id": format!("t{i}"), "name": "Read", "input": {"file": i}});
    let result = |i: usize| json!({"type": "tool_result", "tool_use_id": format!("t{i}"), "content": text_of(&format!("r{i}"), 50)});
    if sequential {
        for i in 0..parallel {
            messages.push(json!({"role": "assistant", "content": [call(i)]}));
            messages.push(json!({"role": "user", "content": [result(i)]}));
        }
    } else {
        let mut calls = vec![json!({"type": "text", "text": "Reading them all."})];
        calls.extend((0..parallel).map(call));
        messages.push(json!({"role": "assistant", "content": calls}));
        messages.push(json!({"role": "user", "content": (0..parallel).map(result).collect::<Vec<_>>()}));
    }
    messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": "Done."}]}));
    messages.push(json!({"role": "user", "content": marked("u2", 100)}));
    (first, request(Value::Array(messages)))
}

#[test]
fn consecutive_tool_uses_and_tool_results_count_as_one_lookback_position_each() {
    // 30 parallel calls: 61 blocks after the entry, but only 5 lookback positions (text, the
    // tool_use run, the tool_result run, the answer, the prompt).
    let (first, second) = tool_turns(30, false);
    let rows = run(&[first.clone(), second.clone()]);
    assert_eq!(rows[1].cache_read_input_tokens, total(&first));
    assert!(!rows[1].cache_break);
    // The provider rule switched off (where it is not stated, e.g. Bedrock): beyond the lookback.
    let mut counter = TokenCounter::new(EstimatorKind::Chars4);
    let table = ModelTable::shipped();
    let min = table.lookup(OPUS55).unwrap().min_cacheable_tokens;
    let mut ungrouped = CacheSim::new();
    ungrouped.group_tool_runs = false;
    ungrouped.process(&ctxsim::measure::flatten(&first, &mut counter, "opus"), min, 0, 0).unwrap();
    let outcome = ungrouped.process(&ctxsim::measure::flatten(&second, &mut counter, "opus"), min, 1000, 0).unwrap();
    // Only the system breakpoint's entry (tools and system) is in reach.
    assert!(outcome.cache_read_input_tokens < 1000, "{}", outcome.cache_read_input_tokens);
    // Sequential rounds still count one position per block: 12 rounds are 24 positions.
    let (first, second) = tool_turns(12, true);
    let rows = run(&[first, second]);
    assert!(rows[1].cache_read_input_tokens < 1000, "{}", rows[1].cache_read_input_tokens);
}

/// The previous request (a prompt, marked) and the next: a reply that opens with `opening` (a
/// thinking or a text block) and makes `parallel` tool calls, their results, the last marked.
fn parallel_reply(opening: Value, parallel: usize) -> (Request, Request) {
    let first = request(json!([{"role": "user", "content": marked("u1", 5000)}]));
    let call = |i: usize| json!({"type": "tool_use", "id": format!("t{i}"), "name": "Read", "input": {"file": i}});
    let mut calls = vec![opening];
    calls.extend((0..parallel).map(call));
    let mut results: Vec<Value> = (0..parallel).map(|i| json!({"type": "tool_result", "tool_use_id": format!("t{i}"), "content": text_of(&format!("r{i}"), 50)})).collect();
    results.last_mut().unwrap()["cache_control"] = cc();
    let second = request(json!([
        {"role": "user", "content": text_of("u1", 5000)},
        {"role": "assistant", "content": calls},
        {"role": "user", "content": results}
    ]));
    (first, second)
}

/// Requests of sessions recorded before the grouped counting was documented (September 2026) are
/// measured by the rule their record shows (`LookbackRule::PerBlock`; docs/fidelity.md "The
/// lookback of 2026"): every block that can carry a breakpoint is one position, a thinking block
/// none, tool runs not grouped, and an entry up to 20 positions before the breakpoint is read.
/// Oh-my-posh 6d44 #11 (a thinking block and 10 calls, the marker on the 9th result: 19
/// positions) and d847 #213 (two thinking blocks and 10 calls: 20) read the previous request;
/// 6d44 #14 (a text block and 10 calls: 21) and #13 (a thinking block and 11 calls: 22) fell to
/// the system prompt's entry.
#[test]
fn before_september_2026_every_block_but_thinking_is_a_lookback_position_and_20_are_reached() {
    use ctxsim::measure::LookbackRule;
    let measure = |rule: LookbackRule, requests: &[Request]| {
        let mut m = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
        m.set_lookback_rule(rule);
        requests.iter().enumerate().map(|(i, r)| m.measure(MeasureInput::new("main", i as u64 * 1000, r)).unwrap()).collect::<Vec<_>>()
    };
    let thinking = |tag: &str| json!({"type": "thinking", "thinking": text_of(tag, 40), "signature": "sig"});
    let text = json!({"type": "text", "text": "Reading them."});
    // 20 positions after the entry (thinking not counted): read; 21: beyond.
    for (opening, parallel, reads) in [(thinking("th"), 10, true), (text.clone(), 10, false), (text.clone(), 9, true), (thinking("th"), 11, false)] {
        let (first, second) = parallel_reply(opening.clone(), parallel);
        let rows = measure(LookbackRule::PerBlock, &[first.clone(), second.clone()]);
        let summary = format!("{opening} and {parallel} calls: read {}", rows[1].cache_read_input_tokens);
        if reads {
            assert_eq!(rows[1].cache_read_input_tokens, total(&first), "{summary}");
        } else {
            // Only the system prompt's entry is in reach.
            assert!(rows[1].cache_read_input_tokens < total(&first) / 2, "{summary}");
        }
        // Grouped (the documented rule, the default): every one of them reads.
        let rows = measure(LookbackRule::Grouped, &[first.clone(), second]);
        assert_eq!(rows[1].cache_read_input_tokens, total(&first), "grouped: {summary}");
    }
    // Each real session is measured by the rule in force when it started; one of unknown time
    // by the documented one.
    for path in real_transcripts() {
        let session = ctxsim::replay::load_session(&path).unwrap();
        assert_eq!(LookbackRule::for_session_start(session.recording.header.start_epoch_ms), LookbackRule::PerBlock, "{}", path.display());
    }
    assert_eq!(LookbackRule::for_session_start(None), LookbackRule::Grouped);
    assert_eq!(LookbackRule::for_session_start(Some(ctxsim::measure::cache::GROUPED_LOOKBACK_FROM_EPOCH_MS)), LookbackRule::Grouped);
}

#[test]
fn effort_in_a_system_message_keeps_the_prefix_a_top_level_change_does_not() {
    let messages = json!([
        {"role": "user", "content": text_of("u1", 1000)},
        {"role": "assistant", "content": [{"type": "text", "text": text_of("a1", 100)}]},
        {"role": "user", "content": marked("u2", 100)}
    ]);
    let with_effort = |effort: &str, messages: Value| {
        let mut r = request(messages);
        r.output_config = Some(json!({"effort": effort}).into());
        r
    };
    let base = with_effort("medium", messages.clone());
    // Top level: the effort is rendered into the prompt, the messages are invalidated; the
    // system breakpoint's entry (tools + system) is what is read.
    let top_level = with_effort("high", messages.clone());
    let rows = run(&[base.clone(), top_level]);
    let head = 200 + 100 + 600 + 4; // tools (descriptions + schema text) and system, chars4
    assert!(rows[1].cache_read_input_tokens < total(&base) && rows[1].cache_read_input_tokens >= 900, "{}", rows[1].cache_read_input_tokens);
    assert!(rows[1].cache_read_input_tokens <= head + 200);
    assert_eq!(rows[1].prefix.diverged_at.as_deref(), Some("messages[0].content[0]"));
    // In a system message (empty content, effort only): nothing before it changes.
    let mut appended = messages.as_array().unwrap().clone();
    appended.push(json!({"role": "system", "content": [], "output_config": {"effort": "high"}}));
    appended.push(json!({"role": "assistant", "content": [{"type": "text", "text": "ok"}]}));
    appended.push(json!({"role": "user", "content": marked("u3", 100)}));
    let per_turn = with_effort("medium", Value::Array(appended));
    let rows = run(&[base.clone(), per_turn.clone()]);
    assert_eq!(rows[1].error, None);
    assert_eq!(rows[1].cache_read_input_tokens, total(&base));
    assert_eq!(rows[1].prefix.diverged_at, None);
    // The effort-only message renders nothing: no position, no tokens.
    let flat = ctxsim::measure::flatten(&per_turn, &mut TokenCounter::new(EstimatorKind::Chars4), "opus");
    assert!(flat.blocks.iter().all(|b| b.path.index != 3), "an effort-only message has no block");
}

#[test]
fn the_late_2026_models_have_their_minimum_lengths_and_say_where_they_come_from() {
    let table = ModelTable::shipped();
    for (model, id, min) in [
        ("claude-opus-5-5", "claude-opus-5-5", 512),
        ("claude-sonnet-5-5-20260922", "claude-sonnet-5-5", 512),
        ("claude-haiku-5-5", "claude-haiku-5-5", 512),
        ("claude-fable-5-1", "claude-fable-5-1", 512),
        ("claude-fable-5-2[1m]", "claude-fable-5-2", 512),
        ("claude-mythos-5-1", "claude-mythos-5-1", 512),
        // The older 5.x entries stay theirs.
        ("claude-opus-5", "claude-opus-5", 512),
        ("claude-sonnet-5", "claude-sonnet-5", 1024),
    ] {
        let info = table.lookup(model).unwrap();
        assert_eq!((info.id.as_str(), info.min_cacheable_tokens), (id, min), "{model}");
    }
    // Undocumented values are marked as assumed, with the reason.
    for id in ["claude-sonnet-5-5", "claude-haiku-5-5", "claude-fable-5-2"] {
        assert!(table.lookup(id).unwrap().sources["min_cacheable_tokens"].starts_with("assumed"), "{id}");
    }
    assert!(table.lookup("claude-opus-5-5").unwrap().sources["min_cacheable_tokens"].contains("migration guide"));
    // 600 tokens cache on each of them, 500 do not.
    for model in ["claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5", "claude-fable-5-1", "claude-fable-5-2", "claude-mythos-5-1"] {
        for (tokens, cached) in [(600, true), (500, false)] {
            let mut r = blocks_request(1, tokens, Some((1, None)));
            r.model = model.to_owned();
            let rows = measure_all(&[(0, r)]);
            assert_eq!(rows[0].cache_creation_input_tokens > 0, cached, "{model} at {tokens}");
        }
    }
    // The value is the table's: a user's table with another minimum changes the result.
    let shipped = include_str!("../../data/models.toml");
    let edited = shipped.replacen(
        "id = \"claude-sonnet-5-5\"\nmatch = [\"claude-sonnet-5-5\", \"sonnet-5-5\"]\nfamily = \"sonnet\"\ntokenizer = \"v2\"\nmin_cacheable_tokens = 512",
        "id = \"claude-sonnet-5-5\"\nmatch = [\"claude-sonnet-5-5\", \"sonnet-5-5\"]\nfamily = \"sonnet\"\ntokenizer = \"v2\"\nmin_cacheable_tokens = 1024",
        1,
    );
    assert_ne!(edited, shipped);
    let table = ModelTable::parse(&edited, "edited.toml").unwrap();
    let mut m = Measurer::new(table, TokenCounter::new(EstimatorKind::Chars4));
    let mut r = blocks_request(1, 600, Some((1, None)));
    r.model = "claude-sonnet-5-5".to_owned();
    assert_eq!(m.measure(MeasureInput::new("main", 0, &r)).unwrap().cache_creation_input_tokens, 0);
}

/// Cost of one request of `prompt` chars4 tokens written to the cache, then read back, with
/// `output` output tokens each.
fn costs(model: &str, prompt: usize, output: u64) -> (f64, f64) {
    let mut r = blocks_request(1, prompt, Some((1, None)));
    r.model = model.to_owned();
    let mut m = measurer();
    let mut rows = Vec::new();
    for t in [0, 1000] {
        let mut input = MeasureInput::new("main", t, &r);
        input.output_tokens = output;
        rows.push(m.measure(input).unwrap());
    }
    (rows[0].cost_usd, rows[1].cost_usd)
}

#[test]
fn cache_reads_cost_per_model_and_haiku_5_5_has_a_prompt_length_tier() {
    // A million tokens read: 0.05x input on Opus 5.5 and Sonnet 5.5, 0.025x on Fable 5.1,
    // Mythos 5.1 and Fable 5.2, 0.1x on the older models.
    for (model, input, read) in [
        ("claude-opus-5-5", 4.0, 0.2),
        ("claude-sonnet-5-5", 2.0, 0.1),
        ("claude-fable-5-1", 10.0, 0.25),
        ("claude-mythos-5-1", 10.0, 0.25),
        ("claude-fable-5-2", 8.0, 0.2),
        ("claude-opus-5", 5.0, 0.5),
    ] {
        let (write, reread) = costs(model, 1_000_000, 0);
        assert!((write - input * 1.25).abs() < 1e-9, "{model}: write {write}");
        assert!((reread - read).abs() < 1e-9, "{model}: read {reread}");
    }
    // Haiku 5.5: up to 100,000 prompt tokens the base rates; above, every token of the
    // request at the higher rates, output included.
    let (write, read) = costs("claude-haiku-5-5", 100_000, 1_000);
    assert!((write - (100_000.0 * 0.125 + 1_000.0 * 0.5) / 1e6).abs() < 1e-12, "{write}");
    assert!((read - (100_000.0 * 0.01 + 1_000.0 * 0.5) / 1e6).abs() < 1e-12, "{read}");
    let (write, read) = costs("claude-haiku-5-5", 100_001, 1_000);
    assert!((write - (100_001.0 * 0.625 + 1_000.0 * 2.5) / 1e6).abs() < 1e-12, "{write}");
    assert!((read - (100_001.0 * 0.05 + 1_000.0 * 2.5) / 1e6).abs() < 1e-12, "{read}");
}

// ---- serve and analyze: lanes and causes from the request structure ----------------------------

/// A client's request: a billing block, a system prompt, tools, messages (Opus 5.5).
fn client_request(billing: &str, system: &str, tools: &[(&str, bool)], messages: Value) -> Value {
    let tools: Vec<Value> = tools
        .iter()
        .map(|(name, deferred)| {
            let mut t = json!({"name": name, "description": text_of(name, 150), "input_schema": {"type": "object"}});
            if *deferred {
                t["defer_loading"] = json!(true);
            }
            t
        })
        .collect();
    json!({
        "model": OPUS55, "max_tokens": 1000, "tools": tools,
        "system": [
            {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.332.{billing}; cc_entrypoint=sdk-cli;")},
            {"type": "text", "text": text_of(system, 800), "cache_control": cc()}
        ],
        "messages": messages,
    })
}

const MAIN_TOOLS: &[(&str, bool)] = &[("Agent", false), ("Bash", false), ("Read", false), ("Placeholder", true)];

/// A conversation of `turns` user prompts (the last one marked) with answers between.
fn conversation(tag: &str, turns: usize) -> Value {
    let mut messages = Vec::new();
    for t in 0..turns {
        if t > 0 {
            messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": text_of(&format!("{tag}-a{t}"), 200)}]}));
        }
        let text = text_of(&format!("{tag}-u{t}"), 300);
        messages.push(if t + 1 == turns { json!({"role": "user", "content": [{"type": "text", "text": text, "cache_control": cc()}]}) } else { json!({"role": "user", "content": text}) });
    }
    Value::Array(messages)
}

/// A main thread with a subagent between its turns, then one structural change per request.
fn client_log() -> Vec<Value> {
    let main = |turns| client_request("fp1", "main", MAIN_TOOLS, conversation("m", turns));
    let subagent = |tag: &str, turns| client_request("fp1", "explore", &[("Bash", false), ("Read", false)], conversation(tag, turns));
    let mut rewritten = conversation("m", 5);
    rewritten[0]["content"] = json!(text_of("m-u0-edited", 300));
    let summary = json!([{"role": "user", "content": [{"type": "text", "text": format!("This session is being continued from a previous conversation that ran out of context. {}", text_of("sum", 300)), "cache_control": cc()}]}]);
    let mut loaded: Vec<(&str, bool)> = MAIN_TOOLS.to_vec();
    loaded.push(("mcp__demo__echo", true));
    let mut added = loaded.clone();
    added.push(("Write", false));
    vec![
        main(1),
        subagent("s", 1),
        subagent("s", 2),
        main(2),
        client_request("fp1", "main", &loaded, conversation("m", 3)),
        client_request("fp1", "main", &added, conversation("m", 4)),
        client_request("fp1", "main-2", &added, conversation("m", 5)),
        client_request("fp2", "main-2", &added, conversation("m", 6)),
        client_request("fp2", "main-2", &added, rewritten),
        client_request("fp3", "main-2", &added, summary),
        // Another subagent of the same kind: a new conversation on its lane.
        subagent("t", 1),
    ]
}

const EXPECTED_LANES: &[&str] = &["main", "subagent:1", "subagent:1", "main", "main", "main", "main", "main", "main", "main", "subagent:1"];
const EXPECTED_CAUSES: &[Option<&str>] = &[
    Some("cold_start"),
    None, // the subagent's first request reads nothing of its own: a cold start, counted as none
    None,
    None,
    Some("tool_loaded"),
    Some("tools_changed"),
    Some("system_changed"),
    Some("billing_fingerprint_changed"),
    Some("message_rewritten"),
    Some("compaction"),
    None,
];

#[test]
fn serve_keeps_subagents_apart_and_reads_causes_from_the_structure() {
    use ctxsim::live::serve::{HttpRequest, ServeOptions, Service};
    let script = ctxsim::live::script::Script::parse(r#"{}"#, "inline.json").unwrap();
    let measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
    let mut service = Service::new(script, measurer, ServeOptions::default()).unwrap();
    for body in client_log() {
        let reply = service.handle(&HttpRequest { method: "POST".to_owned(), url: "/v1/messages".to_owned(), headers: Vec::new(), body: serde_json::to_vec(&body).unwrap() });
        assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
    }
    let rows = service.rows();
    let lanes: Vec<&str> = rows.iter().map(|r| r.lane.as_str()).collect();
    assert_eq!(lanes, EXPECTED_LANES);
    // The main thread resumes after the subagent: it extends its own previous request.
    assert_eq!(rows[3].prefix.diverged_at, None);
    assert!(!rows[3].cache_break);
    let causes: Vec<Option<&str>> = rows.iter().map(|r| r.prefix.cause.as_deref()).collect();
    assert_eq!(causes[4..10], EXPECTED_CAUSES[4..10]);
    assert!(rows.iter().all(|r| !r.prefix.cause.as_deref().unwrap_or_default().starts_with("unexplained")), "{causes:?}");
    // The second subagent is compared with nothing: no divergence from the first one's history.
    assert_eq!(rows[10].prefix.diverged_at, None);
}

#[test]
fn analyze_recognizes_subagents_and_reads_causes_from_the_structure() {
    let text: String = client_log().iter().enumerate().map(|(i, body)| format!("{}\n", json!({"time_ms": i * 1000, "body": body}))).collect();
    let log = ctxsim::analyze::read_log(text.as_bytes(), "log.jsonl").unwrap();
    let mut m = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
    let rows = ctxsim::analyze::analyze(&log, &mut m, "log.jsonl").unwrap();
    let lanes: Vec<&str> = rows.iter().map(|r| r.lane.as_str()).collect();
    // Each subagent conversation is a lane of its own in a log.
    assert_eq!(lanes, ["main", "subagent:1", "subagent:1", "main", "main", "main", "main", "main", "main", "main", "subagent:2"]);
    let causes: Vec<Option<&str>> = rows.iter().map(|r| r.prefix.cause.as_deref()).collect();
    assert_eq!(causes[4..10], EXPECTED_CAUSES[4..10]);
    // Without the structure (a journalled run's measurer) the same divergences are unexplained.
    let mut plain = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
    let rows: Vec<RequestMetrics> = log
        .entries
        .iter()
        .zip(&lanes)
        .map(|(entry, lane)| plain.measure(MeasureInput::new(lane, entry.time_ms, &entry.body)).unwrap())
        .collect();
    assert_eq!(rows[4].prefix.cause.as_deref(), Some("unexplained_tools"));
    assert_eq!(rows[8].prefix.cause.as_deref(), Some("unexplained_messages"));
}

#[test]
fn the_new_causes_are_in_the_closed_list() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(["strategies", "--causes", "--format", "json"]).output().unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed: Vec<String> = v["causes"].as_array().unwrap().iter().map(|c| c["id"].as_str().or(c.as_str()).unwrap_or_default().to_owned()).collect();
    for cause in ["effort_changed", "tool_defined_inline", "tool_loaded", "billing_fingerprint_changed", "message_rewritten", "compaction"] {
        assert!(listed.iter().any(|c| c == cause), "{cause} not in {listed:?}");
    }
}

#[test]
fn the_structure_names_effort_thinking_and_inline_definition_changes() {
    // Effort at the top level, then thinking, each a divergence at the messages level.
    let mut base = request(json!([{"role": "user", "content": marked("u1", 1000)}]));
    base.output_config = Some(json!({"effort": "medium"}).into());
    let mut effort = base.clone();
    effort.output_config = Some(json!({"effort": "high"}).into());
    let mut thinking = effort.clone();
    thinking.thinking = Some(json!({"type": "adaptive"}).into());
    let mut m = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4)).with_structural_causes();
    let causes: Vec<Option<String>> = [base, effort, thinking].iter().enumerate().map(|(i, r)| m.measure(MeasureInput::new("main", i as u64, r)).unwrap().prefix.cause).collect();
    assert_eq!(causes[1].as_deref(), Some("effort_changed"));
    assert_eq!(causes[2].as_deref(), Some("thinking_changed"));
}

// ---- diff-requests: tool_use names, tool_result is_error and content form -----------------------

#[test]
fn diff_requests_compares_tool_names_error_flags_and_result_forms() {
    use ctxsim::shape::{Tolerance, diff, shapes};
    let turn = |name: &str, is_error: bool, content: Value| {
        json!({"model": OPUS55, "max_tokens": 10, "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": name, "input": {"p": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": content, "is_error": is_error}]}
        ]})
    };
    let base = shapes([("main", turn("Read", false, json!("file text")))]);
    let paths = |other: Value| diff(&base, &shapes([("main", other)]), Tolerance::default()).into_iter().map(|d| d.path).collect::<Vec<_>>();
    assert_eq!(paths(turn("Read", false, json!("file text"))), Vec::<String>::new());
    assert_eq!(paths(turn("Grep", false, json!("file text"))), ["messages[1].content[0].name"]);
    assert_eq!(paths(turn("Read", true, json!("file text"))), ["messages[2].content[0].is_error"]);
    assert_eq!(paths(turn("Read", false, json!([{"type": "text", "text": "file text"}]))), ["messages[2].content[0].content_form"]);
    // Shapes written before these fields existed are compared without them.
    let mut old = base.clone();
    for message in &mut old[0].messages {
        for block in &mut message.blocks {
            (block.name, block.is_error, block.content_form) = (None, None, None);
        }
    }
    assert!(diff(&old, &shapes([("main", turn("Grep", true, json!([])))]), Tolerance::default()).is_empty());
    // The rendering shows them.
    let text = ctxsim::shape::render(&shapes([("main", turn("Grep", true, json!([])))]));
    assert!(text.contains("tool_use(Grep):7"), "{text}");
    assert!(text.contains("tool_result:0 (blocks, error)"), "{text}");
}

#[test]
fn the_agents_subagent_runs_on_its_own_lane_in_serve() {
    // The agent (live) with a general-purpose subagent on the main model, against serve: the
    // script answers both from `main`, the measurement keeps the subagent apart.
    use ctxsim::live::client::{ClientConfig, HttpClient};
    use ctxsim::live::run::{LiveOptions, run_live};
    let yaml = r#"
name: live-subagent
world:
  model: claude-sonnet-4-6
  clock_start: "2026-03-02T10:00:00Z"
  cwd: /repo
  files:
    /repo/src/config.rs: "pub fn parse_config() {}\n"
script:
  - user: "Have an agent look at src/config.rs."
"#;
    let script = json!({"main": [
        {"content": [{"text": "Sending an agent."}, {"tool_use": {"name": "Agent", "input": {"description": "Look", "prompt": "Read /repo/src/config.rs and summarize it.", "subagent_type": "general-purpose"}}}]},
        {"content": [{"tool_use": {"name": "Read", "input": {"file_path": "/repo/src/config.rs"}}}]},
        {"content": "It defines parse_config."},
        {"content": "The agent says: it defines parse_config."}
    ]});
    let scenario = ctxsim::scenario::parse_scenario(yaml, "live.yaml").unwrap_or_else(|e| panic!("{e}"));
    let script = ctxsim::live::Script::parse(&script.to_string(), "script.json").unwrap();
    let handle = ctxsim::live::start(0, ctxsim::live::Service::new(script, measurer(), ctxsim::live::ServeOptions::default()).unwrap()).unwrap();
    let base_url = handle.base_url();
    let env = |name: &str| match name {
        "ANTHROPIC_API_KEY" => Some("test-key".to_owned()),
        "ANTHROPIC_BASE_URL" => Some(base_url.clone()),
        _ => None,
    };
    let mut client = HttpClient::new(ClientConfig { max_retries: 0, ..ClientConfig::from_env(env).unwrap() });
    let output = run_live(&scenario, &mut measurer(), &ctxsim::strategy::Strategy::default(), &mut client, &LiveOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let served = handle.stop().unwrap();
    let agent_lanes: Vec<&str> = output.calls.iter().map(|c| c.row.lane.as_str()).collect();
    let served_lanes: Vec<&str> = served.rows.iter().map(|r| r.lane.as_str()).filter(|l| *l != "side").collect();
    assert_eq!(agent_lanes.iter().filter(|l| l.starts_with("subagent")).count(), 2, "{agent_lanes:?}");
    assert_eq!(served_lanes, ["main", "subagent:1", "subagent:1", "main"], "agent: {agent_lanes:?}");
    for row in &served.rows {
        let cause = row.prefix.cause.as_deref().unwrap_or_default();
        assert!(!cause.starts_with("unexplained"), "{}: {cause}", row.lane);
        assert!(!row.cache_break || row.lane != "main", "main broke at {}: {cause}", row.index);
    }
}
