//! Issue 13 item 5: the request-layout and tool-output knobs reach real sessions. A replay cuts
//! the unrecorded prefix into the parts the agent sends and lays them out with the agent's own
//! block layout; tool-output limits turn recorded results into what the client's executors
//! return.

use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::recording::ImportedSession;
use ctxsim::replay::layout::ReplayLayout;
use ctxsim::replay::{ReplayOptions, SessionReplay, load_session, replay_session};
use ctxsim::strategy::Strategy;

use crate::support::realdata;

fn session(path: &str) -> ImportedSession {
    load_session(&realdata().join("transcripts").join(path)).unwrap()
}

fn strategy(name: &str, sets: &[&str]) -> Strategy {
    let sets: Vec<String> = sets.iter().map(|s| (*s).to_owned()).collect();
    Strategy::resolve_with(name, &sets).unwrap()
}

/// Replays `session` with `options` (chars4).
fn check(session: &ImportedSession, options: &ReplayOptions) -> SessionReplay {
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4)).without_body_hashes();
    replay_session(session, &mut measurer, options)
}

fn under(session: &ImportedSession, name: &str, sets: &[&str]) -> SessionReplay {
    check(session, &ReplayOptions::from_strategy(&strategy(name, sets)))
}

fn total(replay: &SessionReplay, f: impl Fn(&ctxsim::measure::RequestMetrics) -> u64) -> u64 {
    replay.calls.iter().filter_map(|c| c.metrics.as_ref()).map(f).sum()
}


const POSH: &str = "oh-my-posh/0254bffa0c17-1.full.jsonl";
const POSH_D8: &str = "oh-my-posh/d84718082c10-3.full.jsonl";
const CIPHER: &str = "cipher-box/af1dd25ebb3e-8.full.jsonl";
const CIPHER_MCP: &str = "cipher-box/c644f3afc869-1.full.jsonl";
const CD95: &str = "entireio-cli/cd95adddad32-0.full.jsonl";

/// The layout cut into the agent's parts at the recorded client's own knob values measures
/// exactly as the as-recorded replay: context, reads and writes at every call.
#[test]
fn layout_at_the_recorded_values_measures_as_recorded() {
    for path in [POSH_D8, CD95] {
        let s = session(path);
        let base = check(&s, &ReplayOptions::default());
        let laid_out = check(&s, &ReplayOptions { layout: Some(ReplayLayout::of(&Strategy::default())), ..ReplayOptions::default() });
        let row = |r: &SessionReplay| r.calls.iter().filter_map(|c| c.metrics.as_ref()).map(|m| (m.context_tokens, m.cache_read_input_tokens, m.cache_creation_input_tokens)).collect::<Vec<_>>();
        assert!(row(&base).len() > 100, "{path}");
        assert_eq!(row(&base), row(&laid_out), "{path}");
    }
    // The default strategy replays as recorded: no layout, no limits.
    let options = ReplayOptions::from_strategy(&Strategy::default());
    assert_eq!((options.layout, options.output_limits, options.ttl_other), (None, None, None));
}

/// Tool search off sends every deferred tool the session shows up front: the tools array grows
/// at every call, the deferred-tools listings leave the messages (the replies diverge from the
/// first), and where an MCP server's tools come and go mid-session the tools array changes: a
/// full miss where the recorded client only appended an attachment.
#[test]
fn eager_tools_send_the_deferred_tools_up_front() {
    let s = session(POSH);
    let base = under(&s, "claude-code", &[]);
    let eager = under(&s, "eager-tools", &[]);
    let tools = |r: &SessionReplay, i: usize| r.calls[i].metrics.as_ref().map_or(0, |m| m.context_tokens);
    let first = base.calls.iter().position(|c| c.lane == "main" && c.metrics.is_some()).unwrap();
    assert!(tools(&eager, first) > tools(&base, first) + 2_000, "{} vs {}", tools(&eager, first), tools(&base, first));
    let (index, why) = eager.first_divergence.clone().expect("the listing is not sent");
    assert!(why.contains("tool search off"), "{why}");
    assert_eq!(index, eager.calls[first].index);
    let changed: Vec<&ctxsim::replay::CallReplay> = eager.calls.iter().filter(|c| c.events.iter().any(|e| e == "deferred_tools_changed")).collect();
    assert!(!changed.is_empty(), "the session's MCP server disconnects and reconnects");
    // There the tools array changed: nothing past the tools is read (the recorded client's
    // attachment kept the history).
    for call in &changed {
        let (b, e) = (base.calls[call.index].metrics.as_ref().unwrap(), call.metrics.as_ref().unwrap());
        assert!(e.cache_read_input_tokens <= b.cache_read_input_tokens, "call {}: {} vs {}", call.index, e.cache_read_input_tokens, b.cache_read_input_tokens);
        assert!(e.cache_read_input_tokens < e.context_tokens / 2, "call {}: a full miss, read {}", call.index, e.cache_read_input_tokens);
    }
    assert!(total(&eager, |m| m.cache_creation_input_tokens) > total(&base, |m| m.cache_creation_input_tokens));
    // A session that shows no deferred tool: tool search off adds nothing, and says why.
    let spotter = load_session(&realdata().join("transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl")).unwrap();
    let why = ctxsim::replay::layout::knob_no_effect_reason("enable_tool_search", &[Strategy::default(), strategy("eager-tools", &[])], &spotter);
    assert!(why.is_some_and(|w| w.contains("no deferred tool")));
}

/// A smaller `BASH_MAX_OUTPUT_LENGTH` cuts the recorded Bash outputs longer than it the way the
/// agent's executor cuts them, and the context drops from the first cut result on.
#[test]
fn bash_output_limit_cuts_recorded_results() {
    let s = session(CIPHER);
    let base = under(&s, "claude-code", &[]);
    let options = ReplayOptions::from_strategy(&strategy("claude-code", &["bash_max_output_length=5000"]));
    let mut bodies = Vec::new();
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4)).without_body_hashes();
    let cut = ctxsim::replay::session::replay_session_observed(&s, &mut measurer, &options, &mut |_, request| bodies.push(request.clone()));
    let (index, why) = cut.first_divergence.clone().unwrap();
    assert!(why.contains("tool-output limits"), "{why}");
    let after = |r: &SessionReplay| r.calls.iter().filter(|c| c.index >= index).filter_map(|c| c.metrics.as_ref()).map(|m| m.context_tokens).sum::<u64>();
    assert!(after(&cut) < after(&base), "{} vs {}", after(&cut), after(&base));
    let last = serde_json::to_string(bodies.last().unwrap()).unwrap();
    assert!(last.contains("lines truncated] ..."), "the executor's form");
    // The same form as the agent's executor gives a scripted output.
    let limits = ctxsim::agent::tools::exec::OutputLimits::from_strategy(&strategy("claude-code", &["bash_max_output_length=10"]));
    let long = ctxsim::api::ToolResultContent::Text("0123456789abc\nline two\nline three".into());
    assert_eq!(limits.cut_output("Bash", long.clone()), ctxsim::api::ToolResultContent::Text("0123456789\n\n... [3 lines truncated] ...".into()));
    assert_eq!(limits.cut_output("Read", long.clone()), long);
}

/// Read's limits turn a recorded whole-file Read into what the client returns: its first lines,
/// or its size or token error; MCP results are cut at `MAX_MCP_OUTPUT_TOKENS` × 4 characters.
#[test]
fn read_and_mcp_limits_reach_recorded_results() {
    use ctxsim::api::{ContentBlock, Message, MessageContent, Role, ToolResultContent};
    let s = session(CIPHER);
    let base = under(&s, "claude-code", &[]);
    let lines = under(&s, "claude-code", &["read_max_lines=200"]);
    assert!(total(&lines, |m| m.context_tokens) < total(&base, |m| m.context_tokens));
    let mcp = session(CIPHER_MCP);
    let mcp_base = under(&mcp, "claude-code", &[]);
    let mcp_cut = under(&mcp, "claude-code", &["max_mcp_output_tokens=2000"]);
    assert!(total(&mcp_cut, |m| m.context_tokens) < total(&mcp_base, |m| m.context_tokens));
    // The forms, on messages of our own.
    let read = |input: serde_json::Value, text: &str| {
        vec![
            Message { role: Role::Assistant, content: MessageContent::Blocks(vec![ContentBlock::tool_use("r1", "Read", input)].into()), extra: Default::default() },
            Message { role: Role::User, content: MessageContent::Blocks(vec![ContentBlock::tool_result("r1", ToolResultContent::Text(text.into()), None)].into()), extra: Default::default() },
        ]
    };
    let numbered: String = (1..=300).map(|i| format!("{i}\tline {i}\n")).collect();
    let limits = |sets: &[&str]| ctxsim::agent::tools::exec::OutputLimits::from_strategy(&strategy("claude-code", sets));
    let result = |messages: &[Message]| serde_json::to_string(&messages[1]).unwrap();
    let mut m = read(serde_json::json!({"file_path": "/a.rs"}), &numbered);
    assert_eq!(ctxsim::agent::tools::exec::limit_recorded_results(&mut m, &limits(&["read_max_lines=100"])), ["r1"]);
    assert!(result(&m).contains("100\\tline 100\\n") && !result(&m).contains("101\\tline"));
    let mut m = read(serde_json::json!({"file_path": "/a.rs"}), &numbered);
    ctxsim::agent::tools::exec::limit_recorded_results(&mut m, &limits(&["read_max_tokens=100"]));
    assert!(result(&m).contains(&ctxsim::agent::tools::exec::read_tokens_error(numbered.len() / 4, 100)) && result(&m).contains("\"is_error\":true"));
    let mut m = read(serde_json::json!({"file_path": "/a.rs"}), &numbered);
    ctxsim::agent::tools::exec::limit_recorded_results(&mut m, &limits(&["read_max_bytes=1024"]));
    assert!(result(&m).contains(&ctxsim::agent::tools::exec::read_size_error(numbered.len(), 1024)));
    // A Read with offset/limit keeps its lines; within the limits nothing changes.
    let mut m = read(serde_json::json!({"file_path": "/a.rs", "offset": 1, "limit": 300}), &numbered);
    assert!(ctxsim::agent::tools::exec::limit_recorded_results(&mut m, &limits(&["read_max_lines=100"])).is_empty());
    let mut m = read(serde_json::json!({"file_path": "/a.rs"}), &numbered);
    assert!(ctxsim::agent::tools::exec::limit_recorded_results(&mut m, &limits(&[])).is_empty());
}

/// `DISABLE_PROMPT_CACHING`: no marker anywhere, nothing read or written. Without the
/// attribution block every request is that block's size smaller.
#[test]
fn prompt_caching_and_attribution_reach_real_sessions() {
    let s = session(CD95);
    let base = under(&s, "claude-code", &[]);
    let off = under(&s, "claude-code", &["env.DISABLE_PROMPT_CACHING=1"]);
    assert_eq!(total(&off, |m| m.cache_read_input_tokens) + total(&off, |m| m.cache_creation_input_tokens), 0);
    assert_eq!(total(&off, |m| m.context_tokens), total(&base, |m| m.context_tokens));
    let plain = under(&s, "claude-code", &["attribution_header=false"]);
    let attribution = ctxsim::agent::system_prompt::attribution_text("2.1.7", &ctxsim::agent::system_prompt::fingerprint("", "2.1.7"), "cli");
    let tokens = u64::from(ctxsim::measure::tokens::chars4(&attribution));
    let calls = base.calls.iter().filter(|c| c.metrics.is_some()).count() as u64;
    assert_eq!(total(&base, |m| m.context_tokens) - total(&plain, |m| m.context_tokens), tokens * calls);
    assert!(base.first_divergence.is_none() && plain.first_divergence.is_none() && off.first_divergence.is_none());
}

/// `ttl_other` reaches the lanes besides the main one (spotter's subagents). Every shipped
/// session wrote those lanes at 1h already, so `ttl_other = 1h` changes nothing and says why;
/// the replay option itself moves them.
#[test]
fn ttl_other_reaches_the_other_lanes() {
    let s = load_session(&realdata().join("transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl")).unwrap();
    let one_hour = |r: &SessionReplay, main: bool| {
        r.calls.iter().filter(|c| (c.lane == "main") == main).filter_map(|c| c.metrics.as_ref()).map(|m| m.cache_creation.ephemeral_1h_input_tokens).sum::<u64>()
    };
    let base = check(&s, &ReplayOptions::default());
    let five = check(&s, &ReplayOptions { ttl_other: Some(ctxsim::api::CacheTtl::FiveMinutes), ..ReplayOptions::default() });
    assert!(one_hour(&base, false) > 0);
    assert_eq!(one_hour(&five, false), 0);
    assert_eq!(one_hour(&five, true), one_hour(&base, true));
    let options = ReplayOptions::from_strategy(&strategy("claude-code", &["ttl_other=1h"]));
    assert_eq!(options.ttl_other, Some(ctxsim::api::CacheTtl::OneHour));
    let why = ctxsim::replay::layout::knob_no_effect_reason("ttl_other", &[Strategy::default(), strategy("claude-code", &["ttl_other=1h"])], &s).unwrap();
    assert!(why.contains("already wrote its cache at 1h"), "{why}");
    let main_only = session(CD95);
    let why = ctxsim::replay::layout::knob_no_effect_reason("ttl_other", &[Strategy::default()], &main_only).unwrap();
    assert_eq!(why, "the session has no call outside the main lane");
}

/// A limit no recorded result reaches changes nothing, and the sweep says why per input.
#[test]
fn a_limit_no_recorded_result_reaches_is_reported_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let session = realdata().join("transcripts").join(CIPHER).display().to_string();
    let out = dir.path().display().to_string();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim"))
        .args(["sweep", "--estimator", "chars4", "--no-progress", "--out", &out, &session, "--param", "bash_max_output_length=40000,50000"])
        .output()
        .unwrap();
    let stderr = String::from_utf8(run.stderr).unwrap();
    assert!(
        stderr.contains("no effect on af1dd25ebb3e-8.full.jsonl: bash_max_output_length changed no result (no recorded Bash result is above 40,000 characters (the largest has "),
        "{stderr}"
    );
}

/// Without the boundary (mode C, the agent's rule) the same session is laid out otherwise, and
/// what it reads changes: on this 2.1.215 session (a re-render of the conversation start at
/// every new prompt) it reads less and writes more than with the boundary.
#[test]
fn no_boundary_changes_what_a_real_session_caches() {
    let s = session(POSH_D8);
    let base = under(&s, "claude-code", &[]);
    let open = under(&s, "no-boundary", &[]);
    assert_eq!(total(&open, |m| m.context_tokens), total(&base, |m| m.context_tokens));
    eprintln!("no boundary: read {} create {}; boundary: read {} create {}", total(&open, |m| m.cache_read_input_tokens), total(&open, |m| m.cache_creation_input_tokens), total(&base, |m| m.cache_read_input_tokens), total(&base, |m| m.cache_creation_input_tokens));
    assert_ne!(total(&open, |m| m.cache_read_input_tokens), total(&base, |m| m.cache_read_input_tokens));
    assert!(open.first_divergence.is_none());
    let options = ReplayOptions::from_strategy(&strategy("no-boundary", &[]));
    assert!(options.layout.as_ref().is_some_and(|l| !l.boundary) && !options.changes_view());
}
