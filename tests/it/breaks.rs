//! The regression suite of real cache-break classes (reference/real-breaks.md, peers.md §4):
//! each `scenarios/break-*.yaml` under the claude-code strategy breaks exactly where and why
//! its description says, named by request, first divergent block and cause.

use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, RequestMetrics, TokenCounter};
use ctxsim::runner::{RunOutput, run_scenario};
use ctxsim::scenario::load_scenario;
use ctxsim::strategy::Strategy;

fn run(name: &str) -> RunOutput {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(format!("{name}.yaml"));
    let scenario = load_scenario(&path).unwrap();
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Bpe));
    run_scenario(&scenario, &mut measurer, &Strategy::default()).unwrap()
}

/// `request index: cause @ diverged_at` of every break.
fn breaks(out: &RunOutput) -> Vec<String> {
    out.rows
        .iter()
        .filter(|r| r.cache_break)
        .map(|r| format!("#{}: {} @ {}", r.index, r.prefix.cause.as_deref().unwrap_or("-"), r.prefix.diverged_at.as_deref().unwrap_or("-")))
        .collect()
}

/// Runs the scenario and checks its breaks; returns the run for further assertions.
fn check_breaks(name: &str, want: &[&str]) -> RunOutput {
    let out = run(name);
    assert_eq!(breaks(&out), want, "{name}");
    out
}

fn reads_everything_cached_before(rows: &[RequestMetrics], i: usize) -> bool {
    rows[i].cache_read_input_tokens == rows[i - 1].cache_read_input_tokens + rows[i - 1].cache_creation_input_tokens
}

#[test]
fn git_status_is_memoized_until_a_resume_takes_a_new_snapshot() {
    // The resume also moves the skill listing out of the first message (it is attached again to
    // the next prompt), so the billing fingerprint in system[0] is the first block to differ; the
    // new git snapshot is journalled with it.
    let out = check_breaks("break-git-status", &["#3: billing_fingerprint_changed @ system[0]"]);
    // The dirty tree on turn 2 is not sent: the request reads everything cached.
    assert!(reads_everything_cached_before(&out.rows, 2));
    let before = serde_json::to_string(&out.requests[2].system).unwrap();
    let after = serde_json::to_string(&out.requests[3].system).unwrap();
    assert!(before.contains("Status:\\n(clean)") && before.contains("4f2a9c1"), "{before}");
    assert!(after.contains("b7e11f4 Trim parsed fields") && !before.contains("b7e11f4"));
    for event in ["session_resumed", "system_section_changed:git_status"] {
        assert!(out.rows[3].events.contains(&event.to_owned()), "{event} in {:?}", out.rows[3].events);
    }
}

#[test]
fn thinking_cleared_after_an_idle_hour_breaks_every_later_turn() {
    let out = check_breaks(
        "break-thinking-cleared-after-idle",
        &["#3: ttl_expired @ messages[2].content[0]", "#4: thinking_cleared @ messages[6].content[0]", "#5: thinking_cleared @ messages[8].content[0]"],
    );
    let keep = |i: usize| out.requests[i].context_management.as_ref().unwrap()["edits"][0]["keep"].clone();
    // Before the gap: keep all; after it, the latch keeps one thinking turn on every request.
    assert_eq!(keep(2), serde_json::json!("all"));
    for i in 3..6 {
        assert_eq!(keep(i), serde_json::json!({"type": "thinking_turns", "value": 1}), "request {i}");
    }
    // Within the TTL each break still rewrites the whole history after the system prompt.
    assert!(out.rows[4].time_ms - out.rows[3].time_ms < 5 * 60_000);
    let applied = out.rows[5].context_management.as_ref().unwrap();
    assert_eq!(applied.applied_edits[0].cleared_thinking_turns, Some(3));
    assert!(out.rows[5].stages.iter().any(|s| s.name == "context_editing" && s.fired));
}

#[test]
fn a_client_that_redacts_thinking_clears_none_after_an_idle_hour() {
    // The same session with `world.redact_thinking` (the client's replies carry no thinking
    // text, as in the 2.1.232 entirecontext transcripts): no `clear_thinking` edit is sent, so
    // the >1h-idle latch switches nothing and only the expired TTL breaks the cache.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/break-thinking-cleared-after-idle.yaml");
    let text = std::fs::read_to_string(&path).unwrap().replacen("world:\n", "world:\n  redact_thinking: true\n", 1);
    let scenario = ctxsim::scenario::parse_scenario(&text, "redacted.yaml").unwrap();
    assert!(scenario.world.redact_thinking);
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Bpe));
    let out = run_scenario(&scenario, &mut measurer, &Strategy::default()).unwrap();
    assert_eq!(breaks(&out), ["#3: ttl_expired @ -"]);
    assert!(out.requests.iter().all(|r| r.context_management.is_none()));
    assert!(out.requests.iter().all(|r| r.thinking.is_some()), "thinking stays on");
    assert!((4..6).all(|i| reads_everything_cached_before(&out.rows, i)));
    // Without the flag the same requests clear thinking from request 4 on.
    assert_eq!(breaks(&run("break-thinking-cleared-after-idle")).len(), 3);
}

#[test]
fn a_resume_in_a_new_process_rereads_claude_md() {
    let out = check_breaks("break-session-resume", &["#3: billing_fingerprint_changed @ system[0]"]);
    assert!(out.rows[3].events.contains(&"session_resumed".to_owned()));
    // The edit of CLAUDE.md is not sent while the first process runs.
    assert!(reads_everything_cached_before(&out.rows, 2));
    let memory = |i: usize| serde_json::to_string(&out.requests[i].messages[1]).unwrap().contains("cargo clippy");
    assert!(!memory(2) && memory(3));
    // SessionStart(resume) context goes to the tail of the resumed history.
    let last = serde_json::to_string(out.requests[3].messages.last().unwrap()).unwrap();
    assert!(last.contains("Resumed: the last CI run on main passed."), "{last}");
}

#[test]
fn a_skill_invocation_only_appends() {
    let out = check_breaks("break-skill-invocation", &[]);
    assert!((1..out.rows.len()).all(|i| reads_everything_cached_before(&out.rows, i)));
    assert!(serde_json::to_string(&out.requests[1]).unwrap().contains("Launching skill: release"));
}

#[test]
fn the_other_shipped_break_classes_keep_their_causes() {
    check_breaks("break-resume-after-ttl", &["#2: ttl_expired @ -"]);
    check_breaks("break-date-rollover", &[]);
    check_breaks("break-mcp-reconnect", &[]);
    let switch = run("break-model-switch");
    assert_eq!(switch.rows.iter().filter(|r| r.cache_break).map(|r| r.prefix.cause.clone().unwrap()).collect::<Vec<_>>(), ["model_changed:claude-opus-4-1"]);
    let search = run("tool-search");
    assert_eq!(search.rows.iter().filter(|r| r.cache_break).map(|r| r.prefix.cause.clone().unwrap()).collect::<Vec<_>>(), ["tool_loaded:TodoWrite"]);
}
