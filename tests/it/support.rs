//! Builders shared by the tests.
#![allow(dead_code)]

use ctxsim::api::{CacheControl, CacheTtl, ContentBlock, Message, Request, Role, SystemBlock, Tool};
use ctxsim::measure::{EstimatorKind, MeasureInput, Measurer, ModelTable, RequestMetrics, TokenCounter};
use serde_json::json;

pub const MODEL: &str = "claude-sonnet-4-5";

pub fn realdata() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/realdata")
}

/// A text of exactly `tokens` chars4 tokens, distinct per `tag`.
pub fn text_of(tag: &str, tokens: usize) -> String {
    let mut s = format!("{tag}:");
    while s.len() < tokens * 4 {
        s.push('x');
    }
    s.truncate(tokens * 4);
    s
}

/// A request whose single user message has `n` text blocks of `tokens` tokens each, with a
/// breakpoint of `ttl` on block `bp` (1-based, as the documentation counts).
pub fn blocks_request(n: usize, tokens: usize, bp: Option<(usize, Option<CacheTtl>)>) -> Request {
    let mut blocks: Vec<ContentBlock> = (0..n).map(|i| ContentBlock::text(text_of(&format!("b{i}"), tokens))).collect();
    if let Some((position, ttl)) = bp {
        blocks[position - 1].set_cache_control(Some(CacheControl::ephemeral().with_ttl(ttl)));
    }
    let mut request = Request::new(MODEL, 1024);
    request.messages.push(Message { role: Role::User, content: ctxsim::api::MessageContent::Blocks(blocks.into()), extra: Default::default() });
    request
}

pub fn mark(request: &mut Request, position: usize, ttl: Option<CacheTtl>) {
    let mut seen = 0;
    for message in &mut request.messages {
        if let ctxsim::api::MessageContent::Blocks(blocks) = &mut message.content {
            for block in blocks {
                seen += 1;
                if seen == position {
                    block.set_cache_control(Some(CacheControl::ephemeral().with_ttl(ttl)));
                }
            }
        }
    }
}

pub fn tool(name: &str, tokens: usize) -> Tool {
    Tool::custom(name, text_of(name, tokens), json!({"type": "object", "properties": {}}))
}

pub fn system(text: &str) -> SystemBlock {
    SystemBlock::text(text)
}

pub fn measurer() -> Measurer {
    Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4))
}

/// Measures a sequence of (time_ms, request) on the main lane.
pub fn measure_all(requests: &[(u64, Request)]) -> Vec<RequestMetrics> {
    let mut m = measurer();
    requests.iter().map(|(t, r)| m.measure(MeasureInput::new("main", *t, r)).unwrap()).collect()
}

/// Runs an inline scenario with the default strategy.
pub fn run_yaml(yaml: &str) -> ctxsim::runner::RunOutput {
    let scenario = ctxsim::scenario::parse_scenario(yaml, "inline.yaml").unwrap_or_else(|e| panic!("{e}"));
    ctxsim::runner::run_scenario(&scenario, &mut measurer(), &ctxsim::strategy::Strategy::default()).unwrap_or_else(|e| panic!("{e}"))
}

/// The lane of every row of a run, in order.
pub fn lanes(output: &ctxsim::runner::RunOutput) -> Vec<&str> {
    output.rows.iter().map(|r| r.lane.as_str()).collect()
}

/// (read, creation, input) of a row.
pub fn split(row: &RequestMetrics) -> (u64, u64, u64) {
    (row.cache_read_input_tokens, row.cache_creation_input_tokens, row.input_tokens)
}

/// The world and script of [`scenario`]: one Read and a reply.
pub const CHECK_WORLD: &str = "world:
  model: claude-sonnet-4-5
  seed: 7
  files:
    /repo/src/main.rs: |
      fn main() {}
script:
  - user: \"Read main.rs & explain <it>\"
  - assistant:
      - text: \"Let me look.\"
      - tool_use: {name: Read, input: {file_path: /repo/src/main.rs}}
  - assistant:
      - text: \"It does nothing.\"
";

/// A scenario file's text (for `check` and the command-line tests): the shared world and
/// script, a name, and an `expect:` block.
pub fn scenario(name: &str, expect: &str) -> String {
    format!("name: {name}\n{CHECK_WORLD}expect:\n{expect}")
}

/// Every main session transcript under ../shared/realdata/transcripts, sorted (subagent files are
/// reached through their sessions).
pub fn real_transcripts() -> Vec<std::path::PathBuf> {
    let mut files: Vec<std::path::PathBuf> = walkdir::WalkDir::new(realdata().join("transcripts"))
        .into_iter()
        .filter_map(Result::ok)
        .map(|e| e.into_path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl") && !p.components().any(|c| c.as_os_str() == "subagents"))
        .collect();
    files.sort();
    files
}

/// `session` driving the agent as recorded under `options` (the ablations of the record it
/// reads), measured by `measurer`, with the events the record shows before each call, as
/// `ctxsim fidelity --calls` reports them.
pub fn replay_session(session: &ctxsim::recording::ImportedSession, measurer: &mut Measurer, options: &ctxsim::replay::ReplayOptions) -> ctxsim::replay::SessionReplay {
    let strategy = ctxsim::strategy::Strategy::resolve_with("claude-code", &[]).unwrap();
    let input = session.recording.header.input.clone().unwrap_or_default();
    let mut driven = ctxsim::replay::workload::agent_replay_with(session, &input, measurer, &strategy, options).unwrap();
    if let Some(events) = driven.record_events.take() {
        driven.replay.add_record_events(&events);
    }
    driven.replay
}
