//! Incremental measurement: a measurer that reuses its earlier requests' work flattens and
//! measures every request exactly as a from-scratch flattening does.

use ctxsim::api::{CacheControl, ContentBlock, Message, MessageContent, Request, SystemBlock, SystemPrompt, Tool, ToolResultContent};
use ctxsim::measure::{EstimatorKind, FlatRequest, MeasureInput, Measurer, ModelTable, RequestMetrics, TokenCounter, flatten};
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::support::*;

/// Flattens and measures `requests` (lane, time, body) twice: with one incremental measurer,
/// and with fresh flattenings fed to a second measurer. Every flat request (blocks, hashes,
/// counts, body hash) and every trace row must be identical. Returns the rows and the share of
/// message blocks the incremental measurer reused.
fn check_incremental_matches_fresh(kind: EstimatorKind, requests: &[(String, u64, Request)]) -> (Vec<RequestMetrics>, f64) {
    let table = ModelTable::shipped();
    let mut incremental = Measurer::new(table.clone(), TokenCounter::new(kind));
    let mut reference = Measurer::new(table.clone(), TokenCounter::new(kind));
    // A third measurer is given keys, as a log reader computes them (the JSON text of each
    // message and of the other fields), for two requests in three: keyed and unkeyed mixed.
    let mut keyed = Measurer::new(table.clone(), TokenCounter::new(kind));
    let mut rows = Vec::new();
    let mut message_blocks = 0u64;
    for (i, (lane, time_ms, body)) in requests.iter().enumerate() {
        let family = table.lookup(&body.model).unwrap().family.clone();
        let fresh: FlatRequest = flatten(body, &mut TokenCounter::new(kind), &family);
        let reused = incremental.flatten(body).unwrap();
        assert_eq!(reused, fresh, "request {i} ({lane}) flattens differently");
        let key = |text: String| xxhash_rust::xxh3::xxh3_128(text.as_bytes());
        let message_keys: Vec<u128> = body.messages.iter().map(|m| key(serde_json::to_string(m).unwrap())).collect();
        let head_key = key(serde_json::to_string(&Request { messages: Vec::new(), ..body.clone() }).unwrap());
        // One keyed request in two has its messages hashed and counted ahead, as `analyze`
        // does for a whole log: the flattener must take those records as its own.
        if i % 2 == 0 {
            keyed.count_ahead(body, true, 0..body.messages.len(), Some(&message_keys)).unwrap();
        }
        let served = if i % 3 == 2 {
            keyed.serve(body).unwrap()
        } else {
            keyed.serve_with_keys(body, Some(head_key), Some(&message_keys)).unwrap()
        };
        assert_eq!(served.as_sent(), &fresh, "request {i} ({lane}) flattens differently with keys");
        message_blocks += fresh.counts.messages as u64;
        let a = incremental.measure_flat(MeasureInput::new(lane, *time_ms, body), reused).unwrap();
        let b = reference.measure_flat(MeasureInput::new(lane, *time_ms, body), fresh).unwrap();
        assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap(), "request {i} ({lane}) measures differently");
        rows.push(a);
    }
    let reused = incremental.flattener().reused_blocks as f64 / message_blocks.max(1) as f64;
    (rows, reused)
}

/// One lane's conversation as the generator evolves it.
#[derive(Debug, Clone)]
struct Lane {
    name: String,
    model: String,
    system: String,
    tools: Vec<Tool>,
    messages: Vec<Message>,
    thinking: Option<Value>,
    tool_choice: Option<Value>,
    /// Messages carrying an extra marker besides the one on the last block.
    extra_markers: Vec<usize>,
    string_system: bool,
}

impl Lane {
    fn new(name: &str, first: &str) -> Lane {
        Lane {
            name: name.to_owned(),
            model: MODEL.to_owned(),
            system: text_of(&format!("system {name}"), 300),
            tools: vec![tool("Read", 40), tool("Bash", 40)],
            messages: vec![Message::user_text(text_of(first, 200))],
            thinking: None,
            tool_choice: None,
            extra_markers: Vec::new(),
            string_system: false,
        }
    }

    fn request(&self) -> Request {
        let mut r = Request::new(self.model.clone(), 1024);
        r.system = Some(if self.string_system {
            SystemPrompt::Text(self.system.clone())
        } else {
            SystemPrompt::Blocks(vec![SystemBlock::text(self.system.clone()).with_cache_control(Some(CacheControl::ephemeral()))].into())
        });
        r.tools = Some(self.tools.clone().into());
        r.thinking = self.thinking.clone().map(Into::into);
        r.tool_choice = self.tool_choice.clone();
        r.messages = self.messages.clone();
        for &m in &self.extra_markers {
            if let Some(MessageContent::Blocks(blocks)) = r.messages.get_mut(m).map(|m| &mut m.content)
                && let Some(first) = blocks.first_mut()
            {
                first.set_cache_control(Some(CacheControl::ephemeral()));
            }
        }
        ctxsim::agent::normalize::mark_last_block(&mut r.messages, CacheControl::ephemeral());
        r
    }
}

/// What happens before a lane's next request.
#[derive(Debug, Clone)]
enum Step {
    /// A tool call and its result (input keys in one order or the other).
    ToolRound { size: usize, reversed_keys: bool },
    /// The model answers and the user writes again (as a string or as blocks).
    UserTurn { size: usize, as_string: bool },
    /// An old tool result is cleared (microcompact).
    ClearResult { nth: usize },
    /// An old tool call's input is re-serialized with its keys in the other order (equal as
    /// JSON, different bytes: a real cause of cache misses).
    ReorderInput { nth: usize },
    /// An extra marker on an earlier message, or none.
    Marker { message: Option<usize> },
    /// The system prompt changes, or flips between a string and blocks.
    System { flip: bool },
    /// A tool is loaded.
    AddTool,
    /// The oldest rounds are dropped (snip / truncation).
    DropOldest { rounds: usize },
    /// Thinking or tool_choice turned on or off.
    Settings { thinking: bool, tool_choice: bool },
    /// A tool result gets a `cache_reference`, and a `cache_edits` block deletes it.
    CacheEdit { nth: usize },
    /// The model changes.
    Model { opus: bool },
    /// The same request is sent again unchanged.
    Resend,
    /// The fork lane takes the main lane's history plus an instruction (a compaction fork).
    Fork,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (1usize..400, any::<bool>()).prop_map(|(size, reversed_keys)| Step::ToolRound { size, reversed_keys }),
        3 => (1usize..400, any::<bool>()).prop_map(|(size, as_string)| Step::UserTurn { size, as_string }),
        1 => (0usize..20).prop_map(|nth| Step::ClearResult { nth }),
        1 => (0usize..20).prop_map(|nth| Step::ReorderInput { nth }),
        1 => prop::option::of(0usize..20).prop_map(|message| Step::Marker { message }),
        1 => any::<bool>().prop_map(|flip| Step::System { flip }),
        1 => Just(Step::AddTool),
        1 => (1usize..4).prop_map(|rounds| Step::DropOldest { rounds }),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(thinking, tool_choice)| Step::Settings { thinking, tool_choice }),
        1 => (0usize..20).prop_map(|nth| Step::CacheEdit { nth }),
        1 => any::<bool>().prop_map(|opus| Step::Model { opus }),
        1 => Just(Step::Resend),
        1 => Just(Step::Fork),
    ]
}

fn tool_result_indices(lane: &Lane) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (m, message) in lane.messages.iter().enumerate() {
        if let MessageContent::Blocks(blocks) = &message.content {
            for (c, block) in blocks.iter().enumerate() {
                if matches!(block, ContentBlock::ToolResult { .. }) {
                    out.push((m, c));
                }
            }
        }
    }
    out
}

/// Applies a step to lane `which` (0 main, 1 fork, 2 subagent) and returns the request it sends.
fn apply(lanes: &mut [Lane; 3], which: usize, step: &Step, counter: usize) -> Request {
    if let Step::Fork = step {
        let mut fork = lanes[0].clone();
        fork.name = lanes[1].name.clone();
        fork.messages.push(Message::user_text(text_of("summarize the conversation", 50)));
        lanes[1] = fork;
        return lanes[1].request();
    }
    let lane = &mut lanes[which];
    match *step {
        Step::ToolRound { size, reversed_keys } => {
            let id = format!("toolu_{counter:04}");
            let input = if reversed_keys { json!({"b": counter, "a": "src/x.rs"}) } else { json!({"a": "src/x.rs", "b": counter}) };
            lane.messages.push(Message::assistant_blocks(vec![ContentBlock::tool_use(&id, "Read", input)]));
            let result = ContentBlock::tool_result(&id, ToolResultContent::Text(text_of(&format!("result {counter}"), size).into()), None);
            lane.messages.push(Message::user_blocks(vec![result]));
        }
        Step::UserTurn { size, as_string } => {
            lane.messages.push(Message::assistant_blocks(vec![ContentBlock::text(text_of(&format!("answer {counter}"), size / 2 + 1))]));
            let prompt = text_of(&format!("prompt {counter}"), size);
            lane.messages.push(if as_string { Message::user_text(prompt) } else { Message::user_blocks(vec![ContentBlock::text(prompt)]) });
        }
        Step::ClearResult { nth } => {
            let results = tool_result_indices(lane);
            if let Some(&(m, c)) = results.get(nth % results.len().max(1))
                && let MessageContent::Blocks(blocks) = &mut lane.messages[m].content
                && let ContentBlock::ToolResult { content, .. } = &mut blocks[c]
            {
                *content = Some(ToolResultContent::Text("[Old tool result content cleared]".into()));
            }
        }
        Step::ReorderInput { nth } => {
            let uses: Vec<usize> = (0..lane.messages.len())
                .filter(|&m| matches!(&lane.messages[m].content, MessageContent::Blocks(b) if matches!(b.first(), Some(ContentBlock::ToolUse { .. }))))
                .collect();
            if let Some(&m) = uses.get(nth % uses.len().max(1))
                && let MessageContent::Blocks(blocks) = &mut lane.messages[m].content
                && let Some(ContentBlock::ToolUse { input: Value::Object(map), .. }) = blocks.first_mut()
            {
                let reversed: Vec<(String, Value)> = std::mem::take(map).into_iter().rev().collect();
                *map = reversed.into_iter().collect();
            }
        }
        Step::Marker { message } => {
            lane.extra_markers = message.map(|m| m % lane.messages.len()).into_iter().collect();
        }
        Step::System { flip } => {
            if flip {
                lane.string_system = !lane.string_system;
            } else {
                lane.system = text_of(&format!("system {} v{counter}", lane.name), 300);
            }
        }
        Step::AddTool => lane.tools.push(tool(&format!("Loaded{counter}"), 30)),
        Step::DropOldest { rounds } => {
            let drop = (rounds * 2).min(lane.messages.len().saturating_sub(1));
            lane.messages.drain(..drop);
            if lane.messages.first().is_some_and(|m| m.role != ctxsim::api::Role::User) {
                lane.messages.insert(0, Message::user_text("continued"));
            }
            lane.extra_markers.clear();
        }
        Step::Settings { thinking, tool_choice } => {
            lane.thinking = thinking.then(|| json!({"type": "enabled", "budget_tokens": 2048}));
            lane.tool_choice = tool_choice.then(|| json!({"type": "auto"}));
        }
        Step::CacheEdit { nth } => {
            let results = tool_result_indices(lane);
            if let Some(&(m, c)) = results.get(nth % results.len().max(1)) {
                let id = match &mut lane.messages[m].content {
                    MessageContent::Blocks(blocks) => match &mut blocks[c] {
                        ContentBlock::ToolResult { tool_use_id, extra, .. } => {
                            extra.insert("cache_reference".into(), json!(tool_use_id.clone()));
                            tool_use_id.clone()
                        }
                        _ => unreachable!("indices point at tool results"),
                    },
                    MessageContent::Text(_) => unreachable!("indices point at blocks"),
                };
                let edits = json!({"type": "cache_edits", "edits": [{"type": "delete", "cache_reference": id}]});
                lane.messages.push(Message::user_blocks(vec![ContentBlock::from_value(edits).unwrap(), ContentBlock::text("go on")]));
            }
        }
        Step::Model { opus } => lane.model = if opus { "claude-opus-4-6".to_owned() } else { MODEL.to_owned() },
        Step::Resend | Step::Fork => {}
    }
    lane.request()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Over sessions with rewrites, marker moves, model and settings changes and three
    /// interleaved lanes, the incremental measurer gives exactly the from-scratch result.
    #[test]
    fn incremental_measurement_equals_from_scratch(
        steps in prop::collection::vec((0usize..3, step(), 0u64..400_000), 1..60),
        calibrated in any::<bool>(),
    ) {
        let mut lanes = [Lane::new("main", "first prompt"), Lane::new("fork", "first prompt"), Lane::new("sub", "subagent task")];
        lanes[2].system = text_of("subagent system", 200);
        let mut time = 0;
        let mut requests = Vec::new();
        for (i, (which, step, gap)) in steps.iter().enumerate() {
            time += gap;
            let body = apply(&mut lanes, *which, step, i);
            let lane = if matches!(step, Step::Fork) { "fork" } else { lanes[*which].name.as_str() };
            requests.push((lane.to_owned(), time, body));
        }
        let kind = if calibrated { EstimatorKind::Calibrated } else { EstimatorKind::Chars4 };
        check_incremental_matches_fresh(kind, &requests);
    }
}

/// An older message rewritten with the rest kept: the track's records stay where they are
/// while each message takes as many blocks as the old one at its position (a cleared result,
/// an input re-serialized), and are set aside from the first that takes more or fewer (a
/// result given a second block, a message dropped); a request with fewer messages drops the
/// old records after them. Every request flattens and measures as from scratch.
#[test]
fn rewritten_older_messages_rechain_the_rest_as_from_scratch() {
    let mut lanes = [Lane::new("main", "first prompt"), Lane::new("fork", "first prompt"), Lane::new("sub", "subagent task")];
    let mut requests = Vec::new();
    let mut send = |lanes: &mut [Lane; 3], step: Step, i: usize| requests.push(("main".to_owned(), i as u64 * 1000, apply(lanes, 0, &step, i)));
    for i in 0..8 {
        send(&mut lanes, Step::ToolRound { size: 40 + i * 10, reversed_keys: false }, i);
    }
    // The same count: in place.
    send(&mut lanes, Step::ClearResult { nth: 2 }, 8);
    send(&mut lanes, Step::ReorderInput { nth: 1 }, 9);
    send(&mut lanes, Step::ToolRound { size: 60, reversed_keys: true }, 10);
    // One more block in an older message: set aside from there.
    if let MessageContent::Blocks(blocks) = &mut lanes[0].messages[4].content {
        blocks.push(ContentBlock::text("and one more thing"));
    }
    send(&mut lanes, Step::Resend, 11);
    send(&mut lanes, Step::ClearResult { nth: 5 }, 12);
    // Fewer messages than the track's last request.
    lanes[0].messages.truncate(9);
    send(&mut lanes, Step::Resend, 13);
    send(&mut lanes, Step::ClearResult { nth: 0 }, 14);
    send(&mut lanes, Step::UserTurn { size: 30, as_string: true }, 15);
    let (rows, reused) = check_incremental_matches_fresh(EstimatorKind::Chars4, &requests);
    assert_eq!(rows.len(), 16);
    assert!(reused > 0.5, "reused {reused}");
}

/// A growing session reuses nearly every message block, and still measures as from scratch.
#[test]
fn a_growing_session_reuses_its_history() {
    let session = ctxsim::synth::growing_session(5, 120, 40_000, MODEL);
    let requests: Vec<(String, u64, Request)> = session.into_iter().map(|e| ("main".to_owned(), e.time_ms, e.body)).collect();
    let (rows, reused) = check_incremental_matches_fresh(EstimatorKind::Chars4, &requests);
    assert_eq!(rows.len(), 120);
    // Per request only the last two or three messages are new (and the one that lost its marker).
    assert!(reused > 0.95, "reused {reused}");
}

/// The 64 real requests of the claude-trace capture (main lane, title and quota side requests,
/// real tools and system prompt) flatten and measure as from scratch.
#[test]
fn real_captured_requests_measure_as_from_scratch() {
    let path = realdata().join("api_captures/claude-trace/test-traffic.jsonl");
    let file = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
    let converted = ctxsim::recording::convert_claude_trace(file, "test-traffic.jsonl").unwrap();
    let requests: Vec<(String, u64, Request)> = converted
        .entries
        .iter()
        .map(|e| ("main".to_owned(), e.time_ms, serde_json::from_value(e.body.clone()).unwrap()))
        .collect();
    for kind in [EstimatorKind::Chars4, EstimatorKind::Bpe] {
        let (rows, reused) = check_incremental_matches_fresh(kind, &requests);
        assert_eq!(rows.len(), 64);
        assert!(reused > 0.5, "{kind:?}: reused {reused}");
    }
}

/// A measurer without body hashes (fidelity, sweep) measures everything else the same.
#[test]
fn without_body_hashes_only_the_body_hash_is_left_out() {
    let session = ctxsim::synth::growing_session(9, 40, 20_000, MODEL);
    let mut with = measurer();
    let mut without = measurer().without_body_hashes();
    for entry in &session {
        let a = with.measure(MeasureInput::new("main", entry.time_ms, &entry.body)).unwrap();
        let mut b = without.measure(MeasureInput::new("main", entry.time_ms, &entry.body)).unwrap();
        assert_eq!(a.body_sha256.len(), 64);
        assert_eq!(b.body_sha256, "");
        b.body_sha256 = a.body_sha256.clone();
        assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
    }
}
