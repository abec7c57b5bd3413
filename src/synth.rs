//! Deterministic synthetic request logs, for benches and property tests of the measurement.
//!
//! [`growing_session`] builds the request bodies a coding agent sends over a long session with
//! no compaction: a fixed system prompt and tool set, then turns of tool calls whose results
//! vary in size, idle gaps now and then, and one marker on the last block. The context grows
//! roughly linearly to `peak_tokens` (chars/4) at the last request. Same seed, same bytes.

use serde_json::json;

use crate::analyze::LogEntry;
use crate::api::{CacheControl, ContentBlock, Message, Request, SystemBlock, SystemPrompt, Tool, ToolResultContent};
use crate::world::Rng;

const WORDS: &[&str] = &[
    "fn", "let", "mut", "self", "match", "impl", "struct", "pub", "return", "if", "else", "for", "in", "while", "loop",
    "request", "cache", "tokens", "prefix", "block", "message", "session", "compact", "summary", "budget", "window",
    "error", "result", "value", "index", "path", "file", "read", "write", "edit", "line", "offset", "limit", "config",
    "=>", "{", "}", "(", ")", "::", ";", "->", "&", "Vec<u8>", "String", "Option", "Some(x)", "None", "Ok(())", "42",
    "0x1f", "\"text\"", "// note", "assert_eq!", "#[test]", "async", "await", "trait", "where", "const", "static",
];

/// A text of about `chars` characters that looks like mixed code and prose.
pub fn code_like_text(rng: &mut Rng, chars: usize) -> String {
    let mut out = String::with_capacity(chars + 16);
    let mut line_len = 0;
    while out.len() < chars {
        let word = rng.pick(WORDS).copied().unwrap_or("x");
        out.push_str(word);
        line_len += word.len();
        if line_len > 60 + (rng.next_u64() % 30) as usize {
            out.push('\n');
            line_len = 0;
        } else {
            out.push(' ');
        }
    }
    out
}

fn tools() -> Vec<Tool> {
    ["Bash", "Edit", "Glob", "Grep", "Read", "Write"]
        .iter()
        .map(|name| {
            Tool::custom(
                *name,
                format!("The {name} tool of the synthetic agent: it does what its name says and returns text."),
                json!({"type": "object", "properties": {"arg": {"type": "string"}}, "required": ["arg"]}),
            )
        })
        .collect()
}

/// `requests` request bodies of one growing main-lane session, with their times.
pub fn growing_session(seed: u64, requests: usize, peak_tokens: u64, model: &str) -> Vec<LogEntry> {
    let mut rng = Rng::new(seed).fork("synth");
    let system = code_like_text(&mut rng, 12_000);
    let tools = tools();
    // Average characters each request adds so the last one holds about peak_tokens × 4.
    let per_request = ((peak_tokens * 4).saturating_sub(14_000) / requests.max(1) as u64).max(40) as usize;
    let mut messages: Vec<Message> = vec![Message::user_text(code_like_text(&mut rng, 400))];
    let mut entries = Vec::with_capacity(requests);
    let mut time_ms = 0u64;
    for i in 0..requests {
        let mut request = Request::new(model, 32_000);
        request.system = Some(SystemPrompt::Blocks(vec![SystemBlock::text(system.clone()).with_cache_control(Some(CacheControl::ephemeral()))].into()));
        request.tools = Some(tools.clone().into());
        request.messages = messages.clone();
        crate::agent::normalize::mark_last_block(&mut request.messages, CacheControl::ephemeral());
        entries.push(LogEntry::new(i + 1, time_ms, request));

        // The model answers with a tool call (or, every tenth request, ends the turn and the user
        // writes again); the result size varies widely around the average.
        time_ms += 2_000 + rng.next_u64() % 8_000;
        if rng.chance(0.01) {
            time_ms += 10 * 60_000;
        }
        let id = format!("toolu_{seed:04x}{i:06}");
        if i % 10 == 9 {
            messages.push(Message::assistant_blocks(vec![ContentBlock::text(code_like_text(&mut rng, per_request / 4))]));
            messages.push(Message::user_text(code_like_text(&mut rng, per_request / 2)));
        } else {
            let name = *rng.pick(&["Read", "Bash", "Grep", "Glob", "Edit"]).unwrap_or(&"Read");
            messages.push(Message::assistant_blocks(vec![ContentBlock::tool_use(&id, name, json!({"arg": format!("src/file_{}.rs", i % 97)}))]));
            let size = (per_request as f64 * (0.2 + 1.6 * rng.next_f64())) as usize;
            let result = ContentBlock::tool_result(&id, ToolResultContent::Text(code_like_text(&mut rng, size).into()), None);
            messages.push(Message::user_blocks(vec![result]));
        }
    }
    entries
}

/// A scenario (YAML text) of `turns` scripted turns on one main lane: each turn a user prompt,
/// a Bash call with a scripted output of varying size, and a text answer; every fiftieth turn
/// the user edits a file and waits past the cache TTL now and then. The context grows by about
/// 150 tokens (chars/4) a turn, so a long script crosses the autocompaction threshold and the
/// chain compacts (its summary falls back to the synthesized one). For the `run` memory bench
/// and the tests that `run` stays linear in script length. Same seed, same bytes.
pub fn scripted_scenario(seed: u64, turns: usize) -> String {
    scripted(seed, turns, false)
}

/// [`scripted_scenario`]'s script in a 4,000,000-token window with autocompaction off
/// (`DISABLE_AUTO_COMPACT`): nothing compacts and the conversation grows to the last turn (about
/// 260 tokens a turn, 2.1M at 8,000 turns), the worst case for a run's cost per request.
pub fn growing_scripted_scenario(seed: u64, turns: usize) -> String {
    scripted(seed, turns, true)
}

fn scripted(seed: u64, turns: usize, growing: bool) -> String {
    use std::fmt::Write;
    let mut rng = Rng::new(seed).fork("synth-scenario");
    let window = if growing { "  context_window: 4000000\n  env: {DISABLE_AUTO_COMPACT: 1}\n" } else { "" };
    let mut out = format!(
        "name: synth-{turns}-turns\ndescription: {turns} generated turns (ctxsim::synth::scripted_scenario, seed {seed})\nworld:\n  model: claude-sonnet-4-5\n{window}  seed: {seed}\n  cwd: /repo\n  files:\n    src/lib.rs: \"pub fn add(a: i32, b: i32) -> i32 {{ a + b }}\\n\"\nscript:\n"
    );
    // YAML double-quoted scalars: the generated text has no quotes or backslashes to escape
    // beyond these.
    let quote = |text: &str| format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"));
    for turn in 0..turns {
        let len = 60 + (rng.next_u64() % 120) as usize;
        let prompt = code_like_text(&mut rng, len);
        let _ = writeln!(out, "  - user: {}", quote(&prompt));
        let _ = writeln!(
            out,
            "  - assistant:\n      - tool_use: {{id: toolu_{turn:06}, name: Bash, input: {{command: {}, description: step {turn}}}}}",
            quote(&format!("cargo test --test t{}", turn % 37))
        );
        let len = 100 + (rng.next_u64() % 700) as usize;
        let output = code_like_text(&mut rng, len);
        let _ = writeln!(out, "  - tool_output:\n      Bash: {}", quote(&output));
        let len = 40 + (rng.next_u64() % 160) as usize;
        let answer = code_like_text(&mut rng, len);
        let _ = writeln!(out, "  - assistant:\n      - text: {}", quote(&answer));
        if turn % 50 == 49 {
            let _ = writeln!(out, "  - write_file: {{path: src/lib.rs, content: {}}}", quote(&format!("// turn {turn}\npub fn add(a: i32, b: i32) -> i32 {{ a + b }}\n")));
        }
        let wait = if rng.chance(0.02) { 400 } else { 5 + rng.next_u64() % 60 };
        let _ = writeln!(out, "  - wait: {wait}s");
    }
    out
}
