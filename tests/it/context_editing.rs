//! API context editing applied server-side by the cache simulator: worked examples of
//! `clear_tool_uses_20250919` (trigger, keep, clear_at_least, exclude_tools, clear_tool_inputs)
//! and `clear_thinking_20251015`, the response's `applied_edits`, and what clearing does to the
//! cached prefix.

use ctxsim::api::Request;
use ctxsim::measure::context_editing::CLEARED_TOOL_RESULT;
use ctxsim::measure::{MeasureInput, RequestMetrics};
use serde_json::{Value, json};

use super::support::{MODEL, measurer, text_of};

/// A conversation: a 2,000-token prompt, then `calls` of `(tool, result tokens)` each as a
/// tool_use / tool_result pair (ids `toolu_0`, `toolu_1`, ...), then `edits` as the body's
/// `context_management`. The marker sits on the last block.
fn body(calls: &[(&str, usize)], edits: Value) -> Request {
    let mut messages = vec![json!({"role": "user", "content": [{"type": "text", "text": text_of("prompt", 2000)}]})];
    for (i, (tool, tokens)) in calls.iter().enumerate() {
        messages.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": format!("toolu_{i}"), "name": tool, "input": {"path": text_of(&format!("in{i}"), 40)}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{i}"), "content": text_of(&format!("out{i}"), *tokens)}]}));
    }
    let last = messages.last_mut().unwrap()["content"].as_array_mut().unwrap().last_mut().unwrap();
    last["cache_control"] = json!({"type": "ephemeral"});
    let mut body = json!({"model": MODEL, "max_tokens": 1024, "messages": messages});
    if !edits.is_null() {
        body["context_management"] = edits;
    }
    serde_json::from_value(body).unwrap()
}

fn clear_tool_uses(extra: Value) -> Value {
    let mut edit = json!({"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 5000}});
    for (k, v) in extra.as_object().unwrap() {
        edit[k] = v.clone();
    }
    json!({"edits": [edit]})
}

/// Measures the requests in order (one second apart) on the main lane.
fn run(requests: &[Request]) -> Vec<RequestMetrics> {
    let mut m = measurer();
    requests.iter().enumerate().map(|(i, r)| m.measure(MeasureInput::new("main", i as u64 * 1000, r)).unwrap()).collect()
}

/// The row's applied edits as `type: n units, t tokens`.
fn applied(row: &RequestMetrics) -> Vec<String> {
    let Some(cm) = &row.context_management else { return Vec::new() };
    cm.applied_edits
        .iter()
        .map(|e| match (e.cleared_tool_uses, e.cleared_thinking_turns) {
            (Some(n), _) => format!("{}: {n} tool uses, {} tokens", e.kind, e.cleared_input_tokens),
            (_, Some(n)) => format!("{}: {n} thinking turns, {} tokens", e.kind, e.cleared_input_tokens),
            _ => e.kind.clone(),
        })
        .collect()
}

/// The served text of every tool result, per call: `kept` or `cleared`.
fn served_results(request: &Request) -> Vec<&'static str> {
    let flat = measurer().flatten(request).unwrap();
    flat.blocks.iter().filter(|b| b.kind == "tool_result").map(|b| if b.tokens < 100 { "cleared" } else { "kept" }).collect()
}

/// Tokens one cleared 1,000-token result frees (chars4 of the placeholder is what remains).
fn freed_per_result() -> u64 {
    1000 - u64::from(ctxsim::measure::tokens::chars4(CLEARED_TOOL_RESULT))
}

/// Tokens clearing the input of call `i` of tool `tool` frees: `name + JSON(input)` before,
/// `name{}` after.
fn freed_per_input(tool: &str, i: usize) -> u64 {
    let input = json!({"path": text_of(&format!("in{i}"), 40)}).to_string();
    u64::from(ctxsim::measure::tokens::chars4(&format!("{tool}{input}")) - ctxsim::measure::tokens::chars4(&format!("{tool}{{}}")))
}

fn tool_uses_applied(uses: u64, tokens: u64) -> String {
    format!("clear_tool_uses_20250919: {uses} tool uses, {tokens} tokens")
}

fn check_applied(request: &Request, want: &[&str]) -> RequestMetrics {
    let row = run(std::slice::from_ref(request)).remove(0);
    assert_eq!(applied(&row), want);
    row
}

#[test]
fn below_the_trigger_nothing_is_cleared() {
    // 2,000 + 4 × (1,000 + 40) tokens ≈ 6,200 > 5,000, but with trigger 10,000 nothing happens.
    let request = body(&[("Read", 1000); 4], clear_tool_uses(json!({"trigger": {"type": "input_tokens", "value": 10000}})));
    let row = check_applied(&request, &[]);
    assert!(row.context_management.is_none());
    assert_eq!(served_results(&request), ["kept"; 4]);
}

#[test]
fn past_the_trigger_the_oldest_results_go_and_the_last_three_stay() {
    let request = body(&[("Read", 1000); 5], clear_tool_uses(json!({})));
    let row = check_applied(&request, &[&tool_uses_applied(2, 2 * freed_per_result())]);
    assert_eq!(served_results(&request), ["cleared", "cleared", "kept", "kept", "kept"]);
    let ids: Vec<&str> = row.context_management.as_ref().unwrap().cleared_tool_use_ids.iter().map(|id| &**id).collect();
    assert_eq!(ids, ["toolu_0", "toolu_1"]);
    // The model saw the edited prompt: context tokens dropped by what was cleared.
    let unedited = run(&[body(&[("Read", 1000); 5], Value::Null)]).remove(0);
    assert_eq!(row.context_tokens, unedited.context_tokens - 2 * freed_per_result());
}

#[test]
fn keep_and_a_tool_use_count_trigger() {
    let edits = clear_tool_uses(json!({"trigger": {"type": "tool_uses", "value": 3}, "keep": {"type": "tool_uses", "value": 1}}));
    check_applied(&body(&[("Bash", 300); 3], edits.clone()), &[]);
    let freed = 3 * (300 - u64::from(ctxsim::measure::tokens::chars4(CLEARED_TOOL_RESULT)));
    check_applied(&body(&[("Bash", 300); 4], edits), &[&tool_uses_applied(3, freed)]);
}

#[test]
fn clear_at_least_not_reachable_means_not_applied() {
    // Clearing two 1,000-token results frees under 2,000 tokens: below clear_at_least 2,500.
    let edits = clear_tool_uses(json!({"clear_at_least": {"type": "input_tokens", "value": 2500}}));
    check_applied(&body(&[("Read", 1000); 5], edits.clone()), &[]);
    // One more call: three results can go, which is enough.
    check_applied(&body(&[("Read", 1000); 6], edits), &[&tool_uses_applied(3, 3 * freed_per_result())]);
}

#[test]
fn excluded_tools_are_never_cleared_nor_counted_in_keep() {
    let calls = [("Edit", 1000), ("Read", 1000), ("Edit", 1000), ("Read", 1000), ("Read", 1000), ("Read", 1000), ("Edit", 1000)];
    let request = body(&calls, clear_tool_uses(json!({"exclude_tools": ["Edit"]})));
    check_applied(&request, &[&tool_uses_applied(1, freed_per_result())]);
    // Four Reads, the last three kept: only the first Read goes.
    assert_eq!(served_results(&request), ["kept", "cleared", "kept", "kept", "kept", "kept", "kept"]);
}

#[test]
fn clear_tool_inputs_clears_the_parameters_of_the_named_tools() {
    let calls = [("Read", 1000), ("Bash", 1000), ("Read", 1000), ("Read", 1000), ("Read", 1000)];
    // Calls 0 (Read) and 1 (Bash) are cleared; their inputs become `{}` where named.
    let only_bash = clear_tool_uses(json!({"clear_tool_inputs": ["Bash"]}));
    check_applied(&body(&calls, only_bash), &[&tool_uses_applied(2, 2 * freed_per_result() + freed_per_input("Bash", 1))]);
    let all = clear_tool_uses(json!({"clear_tool_inputs": true}));
    let freed = 2 * freed_per_result() + freed_per_input("Read", 0) + freed_per_input("Bash", 1);
    let request = body(&calls, all);
    check_applied(&request, &[&tool_uses_applied(2, freed)]);
    let flat = measurer().flatten(&request).unwrap();
    let short_uses = flat.blocks.iter().filter(|b| b.kind == "tool_use" && b.tokens < 5).count();
    assert_eq!(short_uses, 2, "two tool_use blocks carry `{{}}` as input");
}

/// Stateless clearing and the cache: the first request past the trigger rewrites cached
/// results (a break, cause context_editing); the next one clears the
/// same results again and reads the whole edited prefix; a new call pushes one more result out
/// of `keep` and breaks again just before it.
#[test]
fn clearing_breaks_the_cache_at_the_first_cleared_block_and_repeats_on_every_request() {
    let edits = clear_tool_uses(json!({"trigger": {"type": "input_tokens", "value": 6500}}));
    let calls = [("Read", 1000); 6];
    let requests: Vec<Request> = (3..=6).map(|n| body(&calls[..n], edits.clone())).collect();
    let rows = run(&requests);
    // 3 and 4 calls: 2,000 + n × 1,050 ≤ 6,500, no clearing; 5 calls: two cleared.
    assert_eq!(applied(&rows[0]), Vec::<String>::new());
    assert_eq!(applied(&rows[1]), Vec::<String>::new());
    assert_eq!(applied(&rows[2]), [tool_uses_applied(2, 2 * freed_per_result())]);
    assert!(rows[2].cache_break);
    assert_eq!(rows[2].prefix.cause.as_deref(), Some("context_editing"));
    assert_eq!(rows[2].prefix.diverged_at.as_deref(), Some("messages[2].content[0]"));
    // Entries exist only where earlier requests ended (after calls 3 and 4), both past the
    // first cleared result: nothing is read, everything written again.
    assert_eq!(rows[2].cache_read_input_tokens, 0);
    assert_eq!(rows[2].cache_creation_input_tokens, rows[2].context_tokens);
    let stage = rows[2].stages.iter().find(|s| s.name == "context_editing").unwrap();
    assert_eq!((stage.tokens_before - stage.tokens_after, stage.invalidated_from.as_deref()), (2 * freed_per_result(), Some("messages[2].content[0]")));
    assert!(rows[2].events.contains(&"context_editing:clear_tool_uses".to_owned()));
    // 6 calls: the third result is cleared now too; the break lands on it.
    assert_eq!(applied(&rows[3]), [tool_uses_applied(3, 3 * freed_per_result())]);
    assert_eq!(rows[3].prefix.diverged_at.as_deref(), Some("messages[6].content[0]"));
    assert_eq!(rows[3].prefix.cause.as_deref(), Some("context_editing"));
    let stage = rows[3].stages.iter().find(|s| s.name == "context_editing").unwrap();
    assert_eq!(stage.tokens_before - stage.tokens_after, freed_per_result(), "only the newly cleared result counts as dropped");
    // The same request again: the same results cleared, the whole edited prefix read.
    let again = run(&[requests[3].clone(), requests[3].clone()]);
    assert!(!again[1].cache_break);
    assert_eq!(again[1].cache_read_input_tokens, again[0].cache_creation_input_tokens + again[0].cache_read_input_tokens);
    assert!(again[1].stages.iter().all(|s| s.name != "context_editing"), "nothing newly cleared");
}

fn thinking_body(turns: usize, keep: Value) -> Request {
    let mut messages = Vec::new();
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": [{"type": "text", "text": text_of(&format!("ask{t}"), 800)}]}));
        // One turn is a tool loop: thinking + tool_use, the result, then thinking + text.
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": text_of(&format!("plan{t}"), 300), "signature": "sig"},
            {"type": "tool_use", "id": format!("toolu_{t}"), "name": "Read", "input": {}}]}));
        messages.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("toolu_{t}"), "content": text_of(&format!("file{t}"), 500)}]}));
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": text_of(&format!("check{t}"), 200), "signature": "sig"},
            {"type": "text", "text": format!("answer {t}")}]}));
    }
    messages.push(json!({"role": "user", "content": [{"type": "text", "text": "next", "cache_control": {"type": "ephemeral"}}]}));
    serde_json::from_value(json!({
        "model": MODEL, "max_tokens": 1024, "messages": messages,
        "thinking": {"type": "enabled", "budget_tokens": 2000},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": keep}]}
    }))
    .unwrap()
}

#[test]
fn clear_thinking_keeps_the_last_turns_and_keep_all_keeps_everything() {
    check_applied(&thinking_body(3, json!("all")), &[]);
    // A tool loop is one turn: both thinking blocks of turns 0 and 1 go (2 × 500 tokens).
    let request = thinking_body(3, json!({"type": "thinking_turns", "value": 1}));
    let row = check_applied(&request, &["clear_thinking_20251015: 2 thinking turns, 1000 tokens"]);
    let flat = measurer().flatten(&request).unwrap();
    assert_eq!(flat.blocks.iter().filter(|b| b.kind == "thinking").count(), 2);
    assert_eq!(row.blocks.messages + 4, request.messages.iter().map(|m| m.content.block_count()).sum::<usize>());
    check_applied(&thinking_body(3, json!({"type": "thinking_turns", "value": 2})), &["clear_thinking_20251015: 1 thinking turns, 500 tokens"]);
}

/// Thinking clearing breaks the cache where the first cleared block was (the block after it
/// now sits there), and is attributed to `thinking_cleared`.
#[test]
fn clearing_thinking_breaks_the_prefix_where_it_happens() {
    let rows = run(&[thinking_body(2, json!("all")), thinking_body(2, json!({"type": "thinking_turns", "value": 1}))]);
    assert!(rows[1].cache_break);
    assert_eq!(rows[1].prefix.diverged_at.as_deref(), Some("messages[1].content[0]"));
    assert_eq!(rows[1].prefix.cause.as_deref(), Some("thinking_cleared"));
    assert_eq!(rows[1].cache_read_input_tokens, 0, "no entry before the first thinking block");
    assert!(rows[1].events.contains(&"thinking_cleared".to_owned()));
}

#[test]
fn malformed_edits_are_the_apis_400_naming_the_field() {
    let check_error = |edits: Value, want: &str| {
        let row = run(&[body(&[("Read", 100)], edits)]).remove(0);
        assert_eq!(row.error.as_deref(), Some(want));
        assert_eq!((row.cache_read_input_tokens, row.cache_creation_input_tokens), (0, 0));
    };
    check_error(
        json!({"edits": [{"type": "clear_tool_uses_20250919"}, {"type": "clear_thinking_20251015"}]}),
        "context_management.edits[1]: clear_thinking_20251015 must be listed first in edits",
    );
    check_error(
        json!({"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}}]}),
        "context_management.edits[0].keep.value: must be greater than 0",
    );
    check_error(
        json!({"edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "turns", "value": 2}}]}),
        "context_management.edits[0].keep.type: `turns` is not one of tool_uses",
    );
    // Edit types the simulator does not model are left alone.
    assert!(run(&[body(&[("Read", 100)], json!({"edits": [{"type": "compact_20260112"}]}))])[0].error.is_none());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Whatever the history and the edit: the served prompt is never larger, the tokens the
    /// response reports as cleared are exactly what left the prompt, every tool_use keeps its
    /// tool_result, and the blocks before the first edited one are byte-identical (the cached
    /// prefix up to there stays readable).
    #[test]
    fn server_editing_only_shrinks_and_keeps_the_prefix_before_the_first_edit(
        calls in proptest::collection::vec((0usize..4, proptest::prop_oneof![1usize..30, 30usize..1500]), 1..14),
        trigger in 0u64..20_000,
        keep in 0u64..5,
        at_least in proptest::option::of(0u64..6000),
        exclude_edit in proptest::bool::ANY,
        inputs in 0usize..3,
    ) {
        let tools = ["Read", "Bash", "Edit", "Grep"];
        let calls: Vec<(&str, usize)> = calls.iter().map(|(t, n)| (tools[*t], *n)).collect();
        let mut edit = json!({"trigger": {"type": "input_tokens", "value": trigger}, "keep": {"type": "tool_uses", "value": keep}});
        if let Some(min) = at_least {
            edit["clear_at_least"] = json!({"type": "input_tokens", "value": min});
        }
        if exclude_edit {
            edit["exclude_tools"] = json!(["Edit"]);
        }
        edit["clear_tool_inputs"] = [json!(false), json!(true), json!(["Bash"])][inputs].clone();
        let request = body(&calls, clear_tool_uses(edit));
        let served = measurer().serve(&request).unwrap();
        let sent = served.as_sent();
        proptest::prop_assert!(served.flat.total_tokens <= sent.total_tokens);
        proptest::prop_assert_eq!(served.flat.blocks.len(), sent.blocks.len());
        let kinds = |f: &ctxsim::measure::FlatRequest| f.blocks.iter().map(|b| b.kind.clone()).collect::<Vec<_>>();
        proptest::prop_assert_eq!(kinds(&served.flat), kinds(sent));
        match &served.edited {
            None => proptest::prop_assert_eq!(served.flat.total_tokens, sent.total_tokens),
            Some(edited) => {
                let cleared: u64 = edited.response.applied_edits.iter().map(|e| e.cleared_input_tokens).sum();
                proptest::prop_assert_eq!(cleared, sent.total_tokens - served.flat.total_tokens);
                let first = served.flat.blocks.iter().zip(sent.blocks.iter()).position(|(a, b)| a.hash != b.hash).unwrap();
                let first_path = served.flat.blocks[first].path.to_string();
                let (m, c) = edited.edited_at().next().unwrap();
                proptest::prop_assert_eq!(first_path, format!("messages[{m}].content[{c}]"));
                proptest::prop_assert_eq!(served.flat.blocks[first - 1].prefix_hash, sent.blocks[first - 1].prefix_hash);
                if let Some(min) = at_least {
                    proptest::prop_assert!(cleared >= min);
                }
            }
        }
    }
}

/// Bodies that share their history (each the one before with a call more, as the agent builds
/// them) are served and measured exactly as the same bodies read anew, sharing nothing: what the
/// measurer keeps to clear each request's history once and flatten the served bodies on their
/// own tracks only saves work.
#[test]
fn shared_history_is_served_and_measured_as_fresh_bodies_are() {
    let edits = clear_tool_uses(json!({"trigger": {"type": "input_tokens", "value": 6500}, "keep": {"type": "tool_uses", "value": 2}}));
    let calls = [("Read", 1000); 9];
    let fresh: Vec<Request> = (2..=9).map(|n| body(&calls[..n], edits.clone())).collect();
    // The shared bodies: each is the previous one's messages (the same blocks) with the new call.
    let mut shared: Vec<Request> = vec![fresh[0].clone()];
    for next in &fresh[1..] {
        let mut request = shared.last().unwrap().clone();
        let n = request.messages.len();
        // The marker moves from the old last block to the new one, as in `body`.
        request.messages[n - 1] = next.messages[n - 1].clone();
        request.messages.extend(next.messages[n..].iter().cloned());
        assert_eq!(serde_json::to_value(&request).unwrap(), serde_json::to_value(next).unwrap());
        shared.push(request);
    }
    let (shared_rows, fresh_rows) = (run(&shared), run(&fresh));
    assert!(fresh_rows.iter().filter(|r| !applied(r).is_empty()).count() >= 4, "the edits fire on most requests");
    for (i, (a, b)) in shared_rows.iter().zip(&fresh_rows).enumerate() {
        assert_eq!(serde_json::to_value(a).unwrap(), serde_json::to_value(b).unwrap(), "request {i}");
    }
    // Each served body is what flattening it from scratch gives.
    let mut m = measurer();
    for request in &shared {
        let served = m.serve(request).unwrap();
        if let Some(edited) = &served.edited {
            let scratch = measurer().flatten(&edited.body).unwrap();
            assert!(served.flat == scratch, "the served body as flattened from scratch");
        }
    }
}

/// The clearing's memo is kept per estimator family: a request of another family in between (a
/// subagent on another model) counts its own blocks and leaves the first family's entries, so
/// the next request of the first family clears its unchanged history without counting a block
/// again, to the same blocks (shared, not copied) and the same result.
#[test]
fn the_clearing_memo_survives_a_request_of_another_family() {
    use ctxsim::measure::context_editing::{ClearMemo, apply_memo, parse};
    let request = body(&[("Read", 1000); 6], clear_tool_uses(json!({"keep": {"type": "tool_uses", "value": 2}})));
    let edits = parse(request.context_management.as_ref().unwrap()).unwrap();
    let mut memo = ClearMemo::default();
    let mut clear = |family: &str| {
        let mut counted = 0usize;
        let mut count = |_: ctxsim::api::Role, block: &ctxsim::api::ContentBlock| {
            counted += 1;
            serde_json::to_string(block).unwrap().len() as u64 / 4
        };
        let edited = apply_memo(&request, &edits, 8_000, &mut count, &mut memo, family).expect("the edit fires");
        (edited, counted)
    };
    let (first, counted_first) = clear("claude-opus-4");
    assert!(counted_first >= 8, "the first request counts what it clears: {counted_first}");
    let (_, counted_other) = clear("claude-haiku-4");
    assert_eq!(counted_other, counted_first, "another family counts its own");
    let (again, counted_again) = clear("claude-opus-4");
    assert_eq!(counted_again, 0, "the first family's entries were kept");
    assert_eq!(serde_json::to_value(&again.body).unwrap(), serde_json::to_value(&first.body).unwrap());
    assert_eq!(again.cleared, first.cleared);
    let shared = again.body.messages.iter().zip(&first.body.messages).filter(|(a, b)| match (&a.content, &b.content) {
        (ctxsim::api::MessageContent::Blocks(a), ctxsim::api::MessageContent::Blocks(b)) => a.same(b),
        _ => false,
    });
    assert_eq!(shared.count(), request.messages.len(), "every message is the first request's blocks");
}

/// A measurer without body hashes hashes no body, the ones context editing served included:
/// every row's `body_sha256` is empty and everything else is what a measurer with hashes gives.
/// Served with a key of their unchanged head, the edited bodies flatten as from scratch.
#[test]
fn edited_bodies_follow_the_measurers_body_hashes() {
    let edits = clear_tool_uses(json!({"trigger": {"type": "input_tokens", "value": 6500}, "keep": {"type": "tool_uses", "value": 2}}));
    let calls = [("Read", 1000); 9];
    let requests: Vec<Request> = (2..=9).map(|n| body(&calls[..n], edits.clone())).collect();
    let hashed = run(&requests);
    assert!(hashed.iter().filter(|r| !applied(r).is_empty()).count() >= 4, "the edits fire on most requests");
    assert!(hashed.iter().all(|r| !r.body_sha256.is_empty()));
    let mut m = measurer().without_body_hashes();
    let plain: Vec<RequestMetrics> = requests.iter().enumerate().map(|(i, r)| m.measure(MeasureInput::new("main", i as u64 * 1000, r)).unwrap()).collect();
    for (i, (a, b)) in plain.iter().zip(&hashed).enumerate() {
        assert_eq!(a.body_sha256, "", "request {i}: {:?}", applied(a));
        let (mut a, mut b) = (serde_json::to_value(a).unwrap(), serde_json::to_value(b).unwrap());
        a.as_object_mut().unwrap().remove("body_sha256");
        b.as_object_mut().unwrap().remove("body_sha256");
        assert_eq!(a, b, "request {i}");
    }
    let mut m = measurer();
    for request in &requests {
        let served = m.serve_with_keys(request, Some(7), None).unwrap();
        if let Some(edited) = &served.edited {
            assert!(served.flat == measurer().flatten(&edited.body).unwrap(), "the served body as flattened from scratch");
        }
    }
}
