//! Issue 13: "an as-recorded replay with no divergence builds requests whose messages equal the
//! recorded messages in order". Small transcripts in the importer's format (typed prompts,
//! assistant replies with text and tool calls, the tool results) are generated, imported, and
//! driven through the agent as a workload under the recorded version's defaults; each main
//! request the agent builds carries the recorded call's conversation: the same messages, in
//! order, with the same roles and content items.
//!
//! What the record does not hold is the agent's own and is left out of the comparison: the
//! reminders and attachments it adds (`<system-reminder>` text items, and the CLAUDE.md filler
//! standing for the client's unrecorded context), the cache markers, and thinking signatures
//! (opaque, not counted; the agent's replies carry a stand-in).

use proptest::prelude::*;
use serde_json::{Value, json};

use ctxsim::api::{ContentBlock, Message, MessageContent};
use ctxsim::recording::format::LANE_MAIN;

const VERSION: &str = "2.1.39";
const MODEL: &str = "claude-sonnet-4-5";

/// One generated tool call and the result the tool gave.
#[derive(Debug, Clone)]
struct Call {
    tool: &'static str,
    input: Value,
    result: String,
    is_error: bool,
}

/// One generated reply: optional thinking (its text stored) and text before its tool calls
/// (none: the turn's last reply).
#[derive(Debug, Clone)]
struct Reply {
    thinking: Option<String>,
    text: Option<String>,
    calls: Vec<Call>,
}

#[derive(Debug, Clone)]
struct Turn {
    /// Minutes the user waited before typing it.
    wait_minutes: u64,
    prompt: String,
    replies: Vec<Reply>,
}

fn words(min: usize, max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec("[a-z]{1,9}", min..max).prop_map(|w| w.join(" "))
}

fn call() -> impl Strategy<Value = Call> {
    let read = "[a-z]{1,8}".prop_map(|f| ("Read", json!({ "file_path": format!("/repo/src/{f}.rs") })));
    let bash = words(1, 4).prop_map(|c| ("Bash", json!({ "command": c, "description": "Run it" })));
    let grep = "[a-z]{2,8}".prop_map(|p| ("Grep", json!({ "pattern": p, "path": "/repo" })));
    let glob = "[a-z]{1,6}".prop_map(|p| ("Glob", json!({ "pattern": format!("**/{p}*.rs") })));
    (prop_oneof![read, bash, grep, glob], words(1, 40), proptest::bool::weighted(0.1))
        .prop_map(|((tool, input), result, is_error)| Call { tool, input, result, is_error })
}

fn turn() -> impl Strategy<Value = Turn> {
    let working = (proptest::option::of(words(1, 30)), proptest::option::of(words(1, 12)), proptest::collection::vec(call(), 1..4))
        .prop_map(|(thinking, text, calls)| Reply { thinking, text, calls });
    (words(1, 20), proptest::collection::vec(working, 0..4), proptest::option::of(words(1, 30)), words(1, 15)).prop_map(|(prompt, mut replies, thinking, last)| {
        replies.push(Reply { thinking, text: Some(last), calls: Vec::new() });
        (prompt, replies)
    })
    .prop_flat_map(|(prompt, replies)| (prop_oneof![Just(0u64), 1u64..180], Just(prompt), Just(replies)))
    .prop_map(|(wait_minutes, prompt, replies)| Turn { wait_minutes, prompt, replies })
}

/// The transcript of `turns` as Claude Code writes it: one record per prompt and tool result,
/// and per reply (or, `streamed`, per content block of a reply, each with the reply's id and
/// usage), chained by `parentUuid`, a second apart (a prompt after the turn's wait); each reply
/// with a small usage.
fn transcript(turns: &[Turn], streamed: bool) -> String {
    let mut lines = Vec::new();
    let mut parent = Value::Null;
    let mut n = 0u64;
    let mut clock = jiff::Timestamp::from_second(1_767_780_000).unwrap();
    let mut context = 12_000u64;
    let mut record = |kind: &str, message: Value, extra: Value, wait_s: i64| {
        n += 1;
        clock = clock.checked_add(jiff::SignedDuration::from_secs(wait_s.max(1))).unwrap();
        let uuid = format!("00000000-0000-4000-8000-{n:012}");
        let mut line = json!({
            "parentUuid": parent, "isSidechain": false, "userType": "external", "cwd": "/repo", "sessionId": "prop",
            "version": VERSION, "gitBranch": "main", "type": kind, "message": message, "uuid": uuid,
            "timestamp": clock.to_string(),
        });
        if let (Value::Object(line), Value::Object(extra)) = (&mut line, extra) {
            line.extend(extra);
        }
        lines.push(line.to_string());
        parent = Value::String(uuid);
    };
    let (mut ids, mut replies) = (0usize, 0usize);
    for turn in turns {
        record("user", json!({ "role": "user", "content": turn.prompt }), json!({}), turn.wait_minutes as i64 * 60);
        for reply in &turn.replies {
            let mut content = Vec::new();
            if let Some(thinking) = &reply.thinking {
                content.push(json!({ "type": "thinking", "thinking": thinking, "signature": format!("sig{}", replies + 1) }));
            }
            if let Some(text) = &reply.text {
                content.push(json!({ "type": "text", "text": text }));
            }
            let mut uses = Vec::new();
            for call in &reply.calls {
                ids += 1;
                let id = format!("toolu_{ids:04}");
                content.push(json!({ "type": "tool_use", "id": id, "name": call.tool, "input": call.input }));
                uses.push((id, call));
            }
            context += 300;
            let stop = if uses.is_empty() { "end_turn" } else { "tool_use" };
            let usage = json!({ "input_tokens": 3, "cache_creation_input_tokens": 300, "cache_read_input_tokens": context - 303, "output_tokens": 40 });
            replies += 1;
            let chunks = if streamed { content.into_iter().map(|c| vec![c]).collect() } else { vec![content] };
            for chunk in chunks {
                let message = json!({ "id": format!("msg_{replies}"), "type": "message", "role": "assistant", "model": MODEL, "content": chunk, "stop_reason": stop, "usage": usage });
                record("assistant", message, json!({ "requestId": format!("req_{replies}") }), 1);
            }
            for (id, call) in uses {
                let result = json!({ "type": "tool_result", "tool_use_id": id, "content": call.result, "is_error": call.is_error });
                record("user", json!({ "role": "user", "content": [result] }), json!({ "toolUseResult": call.result }), 1);
            }
        }
    }
    lines.join("\n") + "\n"
}

/// A text the agent adds of its own: a reminder or attachment, or the announcement of the
/// deferred tools.
fn agents_own(text: &str) -> bool {
    let text = text.trim_start();
    text.starts_with("<system-reminder>") || text.starts_with(ctxsim::agent::tools::DEFERRED_OPEN)
}

/// `text` without the reminders the agent folded into it (`\n\n<system-reminder>…</system-reminder>`).
fn without_reminders(text: &str) -> String {
    let (open, close) = ("\n\n<system-reminder>", "</system-reminder>");
    let mut out = text.to_owned();
    while let Some(start) = out.find(open) {
        let Some(end) = out[start..].find(close) else { break };
        out.replace_range(start..start + end + close.len(), "");
    }
    out
}

/// A content item as compared: its kind and what it carries, read from its wire form (the agent
/// sends a tool result with its keys in the client's order, as a raw block).
fn item(block: &ContentBlock) -> Option<Value> {
    let mut wire = serde_json::to_value(block).unwrap();
    let text_of = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    Some(match wire["type"].as_str().unwrap_or_default() {
        "text" if agents_own(wire["text"].as_str().unwrap_or_default()) => return None,
        "text" => json!({ "text": without_reminders(&text_of(&wire["text"])) }),
        // The signature is opaque and not counted: a workload's reply, as every scenario reply,
        // carries a stand-in derived from the text.
        "thinking" => json!({ "thinking": wire["thinking"] }),
        "tool_use" => json!({ "tool_use": wire["id"], "name": wire["name"], "input": wire["input"] }),
        "tool_result" => {
            let content = match &wire["content"] {
                Value::Array(blocks) => blocks.iter().filter(|b| b["type"] == "text" && !agents_own(&text_of(&b["text"]))).map(|b| text_of(&b["text"])).collect::<Vec<_>>().join("\n"),
                other => without_reminders(&text_of(other)),
            };
            json!({ "tool_result": wire["tool_use_id"], "content": content, "is_error": wire["is_error"].as_bool().unwrap_or(false) })
        }
        _ => {
            wire.as_object_mut().unwrap().remove("cache_control");
            wire
        }
    })
}

/// The messages as (role, items), a message left with no item dropped.
fn conversation(messages: &[Message]) -> Vec<(String, Vec<Value>)> {
    messages
        .iter()
        .filter_map(|m| {
            let items: Vec<Value> = match &m.content {
                MessageContent::Text(text) => item(&ContentBlock::text(text.clone())).into_iter().collect(),
                MessageContent::Blocks(blocks) => blocks.iter().filter_map(item).collect(),
            };
            (!items.is_empty()).then(|| (format!("{:?}", m.role), items))
        })
        .collect()
}

/// Drives `turns` through the agent as recorded and returns, per main request, the agent's
/// conversation and the recorded call's.
fn driven(turns: &[Turn], streamed: bool) -> Vec<(usize, Vec<(String, Vec<Value>)>, Vec<(String, Vec<Value>)>)> {
    let text = transcript(turns, streamed);
    let session = ctxsim::recording::import_claude_code_from(std::io::Cursor::new(text.as_bytes()), "prop.jsonl").unwrap();
    assert!(session.report.warnings.list.is_empty(), "{:#?}", session.report.warnings.list);
    let measurer = crate::support::measurer();
    let strategy = ctxsim::strategy::Strategy::resolve_with("claude-code", &[]).unwrap();
    let (workload, _) = ctxsim::replay::workload::sized_workload(&session, "prop.jsonl", &measurer, &strategy, true).unwrap();
    let options = ctxsim::runner::RunOptions { keep_requests: true, ..Default::default() };
    let output = ctxsim::runner::run_scenario_opts(&workload.scenario, &mut crate::support::measurer(), &strategy, &ctxsim::agent::compact::chain::Chain::new(), options).unwrap();
    let main: Vec<&ctxsim::api::Request> = output.rows.iter().zip(&output.requests).filter(|(r, _)| r.lane == LANE_MAIN && r.error.is_none()).map(|(_, q)| q).collect();
    assert_eq!(main.len(), workload.main_calls.len(), "one main request per recorded main call");
    main.iter()
        .zip(&workload.main_calls)
        .map(|(request, index)| {
            let call = session.calls.iter().find(|c| c.index == *index).unwrap();
            (*index, conversation(&request.messages), conversation(&session.messages_for_call(call)))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn as_recorded_the_agent_sends_the_recorded_messages_in_order(turns in proptest::collection::vec(turn(), 1..4), streamed in any::<bool>()) {
        let calls: usize = turns.iter().map(|t| t.replies.len()).sum();
        let requests = driven(&turns, streamed);
        prop_assert_eq!(requests.len(), calls);
        for (index, agent, recorded) in requests {
            // The first message where they part, for a readable failure.
            let at = agent.iter().zip(&recorded).position(|(a, r)| a != r).unwrap_or(agent.len().min(recorded.len()));
            prop_assert_eq!(agent.get(at), recorded.get(at), "call {}: message {} of {} (agent) and {} (recorded)", index, at, agent.len(), recorded.len());
            prop_assert_eq!(agent.len(), recorded.len(), "call {}", index);
        }
    }
}
