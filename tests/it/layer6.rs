//! Layer 6 end to end: every shipped long-context scenario trips its stage, asserted on the
//! stage reports, lanes and cache figures of its run; `--disable-stage` through the binary.

use ctxsim::agent::compact::recovery::RESUME_MESSAGE;
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, RequestMetrics, TokenCounter};
use ctxsim::runner::{RunOutput, run_scenario};
use ctxsim::scenario::load_scenario;
use ctxsim::strategy::Strategy;

fn run(name: &str) -> RunOutput {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(format!("{name}.yaml"));
    let scenario = load_scenario(&path).unwrap();
    // `calibrated`, as `ctxsim check` measures the shipped scenarios and their `expect:`.
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Calibrated));
    let output = run_scenario(&scenario, &mut measurer, &Strategy::default()).unwrap();
    // Each scenario's `expect.compactions` holds.
    if let Some(expected) = &scenario.expect.compactions {
        let pairs = [
            ("tool_result_budget", expected.tool_result_budget),
            ("snip", expected.snip),
            ("microcompact", expected.microcompact),
            ("collapse", expected.collapse),
            ("session_memory", expected.session_memory),
            ("auto", expected.auto),
            ("reactive", expected.reactive),
            ("manual", expected.manual),
        ];
        for (key, want) in pairs {
            let got = output.summary.compactions[key];
            assert_eq!(got, want.unwrap_or(0), "{name}: compactions.{key}");
        }
    }
    output
}

/// The fired stage reports of a row, as `name: reason`.
fn fired(row: &RequestMetrics) -> Vec<String> {
    row.stages.iter().filter(|s| s.fired).map(|s| format!("{}: {}", s.name, s.reason)).collect()
}

fn lanes(output: &RunOutput) -> Vec<&str> {
    output.rows.iter().map(|r| r.lane.as_str()).collect()
}

#[test]
fn tool_result_budget_persists_a_large_bash_output_and_replays_it() {
    let out = run("tool-result-budget");
    assert_eq!(fired(&out.rows[1]), ["tool_result_budget: persisted 1 tool results"]);
    let body = serde_json::to_string(&out.requests[1]).unwrap();
    assert!(body.contains("<persisted-output>"), "the preview replaces the result");
    // The next request replays the replacement byte for byte: its prefix is read in full.
    assert_eq!(out.rows[2].cache_read_input_tokens, out.rows[1].cache_read_input_tokens + out.rows[1].cache_creation_input_tokens);
}

#[test]
fn time_microcompact_clears_old_results_after_a_61_minute_gap() {
    let out = run("time-microcompact");
    let reports = fired(&out.rows[2]);
    assert_eq!(reports.len(), 1);
    assert!(reports[0].starts_with("microcompact: time_based: 61 min"), "{reports:?}");
    assert!(serde_json::to_string(&out.requests[2]).unwrap().contains("[Old tool result content cleared]"));
}

#[test]
fn cached_microcompact_deletes_through_cache_edits_and_keeps_the_prefix() {
    let out = run("cached-microcompact");
    assert_eq!(fired(&out.rows[2]), ["microcompact: cache_edits: deleting 6 tool results server-side"]);
    let edit_request = serde_json::to_value(&out.requests[2]).unwrap().to_string();
    assert!(edit_request.contains("\"cache_edits\""));
    let next = serde_json::to_value(&out.requests[3]).unwrap().to_string();
    assert!(next.contains("\"cache_edits\"") && next.contains("\"cache_reference\":\"toolu_read_0\""), "pinned edit and references");
    assert!(out.rows.iter().all(|r| !r.cache_break));
    // The edit request reads everything the previous one cached; the one after it reads a
    // prefix without the deleted results, so its context shrank.
    assert_eq!(out.rows[2].cache_read_input_tokens, out.rows[1].cache_read_input_tokens + out.rows[1].cache_creation_input_tokens);
    assert!(out.rows[3].context_tokens + 1000 < out.rows[2].context_tokens);
    assert!(out.rows[3].cache_read_input_tokens > 0);
}

#[test]
fn session_memory_is_extracted_on_its_lane_and_compacts_first() {
    let out = run("session-memory-compact");
    assert_eq!(lanes(&out), ["main", "main", "session_memory", "main", "session_memory", "main"]);
    // The extraction fork shares the main lane's cache.
    assert_eq!(out.rows[2].cache_read_input_tokens, out.rows[1].cache_read_input_tokens + out.rows[1].cache_creation_input_tokens);
    let last = out.rows.last().unwrap();
    assert!(fired(last).iter().any(|r| r.starts_with("session_memory_compact:")), "{:?}", fired(last));
    // The notes became the summary; no compaction fork was needed.
    assert!(!lanes(&out).contains(&"compact"));
    assert!(serde_json::to_string(out.requests.last().unwrap()).unwrap().contains("Notes update 2"), "the latest notes are the summary");
}

#[test]
fn reactive_compact_recovers_from_prompt_too_long() {
    let out = run("reactive-compact");
    assert_eq!(lanes(&out), ["main", "main", "compact", "main"]);
    let error = out.rows[1].error.as_deref().unwrap();
    assert!(error.starts_with("prompt is too long: ") && error.ends_with(" tokens > 18000 maximum"), "{error}");
    // The simulated API measures the fork too: peeled of the oversized round by the gap, it fits.
    let gap = {
        let (actual, limit) = ctxsim::agent::compact::recovery::parse_prompt_too_long(error).unwrap();
        actual - limit
    };
    assert!(out.rows[2].error.is_none() && out.rows[2].context_tokens <= 18_000);
    assert_eq!(out.rows[2].events, ["truncation:reactive_peel:1"]);
    let fork = serde_json::to_string(&out.requests[2]).unwrap();
    assert!(!fork.contains("\"tool_result\"") && !fork.contains("line 019"), "the peeled round is not summarized");
    let reasons = fired(&out.rows[3]);
    let reactive = reasons.iter().find(|r| r.starts_with("reactive_compact:")).unwrap();
    // Sized so that the peel covers the gap in `calibrated` tokens (and so in `bpe`'s, fewer).
    assert!(reactive.ends_with("API-round groups (4321 rough tokens), dropped)") && reactive.contains("peeled the newest 1 "), "{reactive}");
    assert!(4321 >= gap, "the peel covers the gap of {gap}");
    // Dropped: the retried request holds the summary, not the oversized result.
    assert!(!serde_json::to_string(&out.requests[3]).unwrap().contains("line 019"));
    assert!(out.rows[3].error.is_none());
    assert_eq!(out.summary.api_errors, 1);
}

#[test]
fn an_autocompact_fork_longer_than_the_window_is_refused_and_head_truncated() {
    let out = run("compaction-fork-ptl-retry");
    let forks: Vec<usize> = out.rows.iter().enumerate().filter(|(_, r)| r.lane == "compact").map(|(i, _)| i).collect();
    assert_eq!(forks.len(), 2, "{:?}", lanes(&out));
    let (refused, retried) = (&out.rows[forks[0]], &out.rows[forks[1]]);
    // The first fork is the whole conversation plus the instruction: the API refuses it.
    let error = refused.error.as_deref().unwrap();
    assert!(error.starts_with("prompt is too long: ") && error.ends_with(" tokens > 30000 maximum"), "{error}");
    assert_eq!((refused.cache_read_input_tokens, refused.cache_creation_input_tokens), (0, 0));
    // One retry, behind the marker, without the two oldest groups (the prompt and the first
    // round), fits.
    assert!(retried.error.is_none() && retried.context_tokens <= 30_000);
    assert_eq!(retried.events, ["truncation:compaction_ptl_retry:1"]);
    let body = serde_json::to_value(&out.requests[forks[1]]).unwrap();
    let text = body["messages"].to_string();
    assert!(text.contains("[earlier conversation truncated for compaction retry]"));
    assert!(!text.contains("Run the build log check") && !text.contains("Print the log, run 1\""), "oldest groups dropped");
    assert!(text.contains("Print the log, run 2\""));
    let main = &out.rows[forks[1] + 1];
    assert_eq!(main.lane, "main");
    let reasons = fired(main);
    assert!(
        reasons.iter().any(|r| r.starts_with("autocompact: auto compaction (summary after 1 retries; dropped the oldest 2 API-round groups")),
        "{reasons:?}"
    );
    // Where the retry can read the main lane's cache: the tools and system[1..] are the main
    // lane's bytes, but the billing fingerprint in system[0] follows the fork's first user
    // message, which the truncation changed, and tools carry no breakpoint: nothing is read.
    let previous_main = serde_json::to_value(&out.requests[forks[0] - 1]).unwrap();
    assert_eq!(body["tools"], previous_main["tools"]);
    assert_eq!(body["system"].as_array().unwrap()[1..], previous_main["system"].as_array().unwrap()[1..]);
    assert_ne!(body["system"][0], previous_main["system"][0]);
    assert_eq!(retried.cache_read_input_tokens, 0);
}

#[test]
fn blocking_limit_ends_the_turn_without_a_request() {
    let out = run("blocking-limit");
    assert_eq!(out.rows.len(), 1);
    assert_eq!(out.summary.blocked, 1);
}

#[test]
fn max_output_recovery_resumes_twice() {
    let out = run("max-output-recovery");
    assert_eq!(out.rows.len(), 3);
    assert_eq!(out.rows[1].events, ["max_output_tokens_recovery:1"]);
    assert_eq!(out.rows[2].events, ["max_output_tokens_recovery:2"]);
    let body = serde_json::to_string(&out.requests[2]).unwrap();
    assert_eq!(body.matches(&RESUME_MESSAGE[..40]).count(), 2);
    assert!(out.rows.iter().skip(1).all(|r| r.cache_read_input_tokens > 0 && !r.cache_break));
}

#[test]
fn compaction_fork_reads_the_main_lanes_prefix_from_cache() {
    let out = run("compaction-fork-shares-cache");
    let fork = out.rows.iter().position(|r| r.lane == "compact").unwrap();
    let main = &out.rows[fork - 1];
    assert_eq!(main.lane, "main");
    assert_eq!(out.rows[fork].cache_read_input_tokens, main.cache_read_input_tokens + main.cache_creation_input_tokens);
    assert!(fired(&out.rows[fork + 1]).iter().any(|r| r.starts_with("autocompact: auto compaction")));
}

#[test]
fn circuit_breaker_stops_after_three_failed_compactions() {
    let out = run("circuit-breaker");
    assert_eq!(lanes(&out), ["main", "compact", "main", "compact", "main", "compact", "main", "main"]);
    let reasons: Vec<&str> =
        out.rows[7].stages.iter().filter(|s| s.name == "autocompact").map(|s| &*s.reason).collect();
    assert!(reasons.iter().any(|r| r.contains("circuit breaker open after 3 consecutive failures")), "{reasons:?}");
}

fn ctxsim(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap()
}

#[test]
fn disable_stage_skips_autocompact_and_rejects_unknown_names() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap();
    let ok = ctxsim(&["run", "scenarios/autocompact-200k.yaml", "--disable-stage", "autocompact", "--out", out_dir]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let trace = std::fs::read_to_string(dir.path().join("trace.jsonl")).unwrap();
    assert!(!trace.contains("\"lane\":\"compact\""));
    assert!(trace.contains("disabled_by_flag"));
    let bad = ctxsim(&["run", "scenarios/autocompact-200k.yaml", "--disable-stage", "autocompaction"]);
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("autocompaction") && stderr.contains("tool_result_budget, snip, microcompact"), "{stderr}");
}

#[test]
fn context_editing_is_applied_server_side_where_the_trigger_and_clear_at_least_allow() {
    let out = run("context-editing");
    let applied = |i: usize| out.rows[i].context_management.as_ref().map(|cm| cm.applied_edits[0].cleared_tool_uses);
    // Request 4 is past the 20,000-token trigger but could clear only one result (< 4,000).
    assert!(out.rows[4].context_tokens > 20_000);
    assert_eq!((applied(3), applied(4), applied(5), applied(6), applied(7)), (None, None, Some(Some(2)), Some(Some(3)), Some(Some(3))));
    let reports = fired(&out.rows[5]);
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert!(reports[0].starts_with("context_editing: newly cleared server-side: 2 tool uses, 0 thinking blocks (clear_tool_uses_20250919: 2 tool uses, "), "{reports:?}");
    assert_eq!(out.rows[5].stages.iter().find(|s| s.name == "context_editing").unwrap().invalidated_from.as_deref(), Some("messages[3].content[0]"));
    // Breaks at the first newly cleared result; the next turn reads the whole edited prefix.
    let causes: Vec<(usize, &str)> = out.rows.iter().filter(|r| r.cache_break).map(|r| (r.index, r.prefix.cause.as_deref().unwrap())).collect();
    assert_eq!(causes, [(5, "context_editing"), (6, "context_editing")]);
    assert_eq!(out.rows[7].cache_read_input_tokens, out.rows[6].cache_read_input_tokens + out.rows[6].cache_creation_input_tokens);
    // The client sent the whole history every time; the server's view is what was counted.
    let sent = serde_json::to_string(&out.requests[7]).unwrap();
    assert_eq!(sent.matches("line 019").count(), 36, "six untouched results of six copies each");
    assert!(out.rows[7].context_tokens < out.rows[4].context_tokens);
    // Information loss counts what left the model's view once, not again on every request.
    assert_eq!(out.summary.compactions["microcompact"], 2);
    let loss = ctxsim::measure::loss::info_loss(&out.requests, &out.rows);
    let dropped: u64 = out.rows.iter().flat_map(|r| &r.stages).filter(|s| s.name == "context_editing").map(|s| s.tokens_before - s.tokens_after).sum();
    let cleared_once = out.rows[6].context_management.as_ref().unwrap().applied_edits[0].cleared_input_tokens;
    assert_eq!((loss.compactions, loss.tokens_dropped), (2, dropped));
    assert_eq!(dropped, cleared_once, "three results, each counted when it left the view");
}

// ---- recovery that does not recover, and media -----------------------------------------------

/// Runs a scenario given as text (inline cases of the recovery ladder).
fn run_yaml(yaml: &str) -> RunOutput {
    let scenario = ctxsim::scenario::parse_scenario(yaml, "inline.yaml").unwrap_or_else(|e| panic!("{e}"));
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Bpe));
    run_scenario(&scenario, &mut measurer, &Strategy::default()).unwrap_or_else(|e| panic!("{e}"))
}

/// The reactive-compact world (16k window, autocompact off, one Bash call past the window)
/// with the given env additions and the given reply on lane `compact`; a second turn follows.
fn overflow_yaml(env: &str, compact_reply: &str) -> String {
    let reactive = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/reactive-compact.yaml")).unwrap();
    let files = &reactive[reactive.find("  files:").unwrap()..reactive.find("script:").unwrap()];
    format!(
        r#"name: overflow
world:
  model: claude-sonnet-4-5
  context_window: 16000
  max_output_tokens: 1000
  env: {{DISABLE_AUTO_COMPACT: "1", CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE: "1000000"{env}}}
{files}script:
  - user: "Print the data file a few times"
  - assistant:
      - tool_use: {{name: Bash, input: {{command: "cat data.txt data.txt data.txt data.txt data.txt data.txt data.txt data.txt data.txt data.txt data.txt data.txt data.txt data.txt", description: Print the data}}}}
  - assistant:
      - text: "This reply is never sampled."
{compact_reply}"#
    )
}

#[test]
fn prompt_too_long_is_surfaced_when_reactive_compact_is_off() {
    // The external build: no reactive compact, no collapse; the error ends the turn, and the
    // next turn, still over the window, ends the same way.
    let again = "  - user: \"Try again\"\n  - assistant:\n      - text: \"This reply is never sampled either.\"\n";
    let out = run_yaml(&overflow_yaml("", again));
    assert_eq!(lanes(&out), ["main", "main", "main"]);
    for row in &out.rows[1..] {
        assert!(row.error.as_deref().unwrap().starts_with("prompt is too long: "));
        assert!(row.stages.iter().all(|s| !s.fired), "{:?}", fired(row));
        let autocompact: Vec<&str> = row.stages.iter().filter(|s| s.name == "autocompact").map(|s| &*s.reason).collect();
        assert_eq!(autocompact, ["auto-compact disabled"]);
    }
    assert_eq!(out.rows[2].events, ["prompt_too_long_surfaced"]);
    assert_eq!((out.summary.api_errors, out.summary.blocked), (2, 2));
}

#[test]
fn prompt_too_long_is_surfaced_when_reactive_compact_fails() {
    // Reactive compact is tried once; its summary request comes back as an API error, so the
    // compaction fails and the error is surfaced (`prompt_too_long`). The next turn still
    // carries the oversized result: a new turn tries reactive compact again (the flag is per
    // turn), and this time the summary arrives.
    let compact = "  - assistant:\n      - text: \"API Error: Repeated 529 Overloaded errors\"\n    lane: compact\n  - user: \"Try again\"\n  - assistant:\n      - text: \"Recovered.\"\n  - assistant:\n      - text: \"<summary>The user printed data.txt many times.</summary>\"\n    lane: compact\n";
    let out = run_yaml(&overflow_yaml(r#", CTXSIM_REACTIVE_COMPACT: "1""#, compact));
    assert_eq!(lanes(&out), ["main", "main", "compact", "main", "compact", "main"]);
    assert_eq!(out.summary.blocked, 1);
    // The failed attempt is reported on the next main request, with the surfaced error.
    let next = &out.rows[3];
    assert!(next.error.is_some(), "turn 2 starts over the window again");
    let failed: Vec<&str> = next.stages.iter().filter(|s| s.name == "reactive_compact").map(|s| &*s.reason).collect();
    assert_eq!(failed, ["compaction failed (error: API Error: Repeated 529 Overloaded errors); consecutive failures 0"]);
    assert!(next.events.contains(&"prompt_too_long_surfaced".to_owned()), "{:?}", next.events);
    // Turn 2: reactive compact succeeds and the request goes through.
    assert!(fired(&out.rows[5]).iter().any(|r| r.starts_with("reactive_compact: reactive compaction")));
    assert!(out.rows[5].error.is_none());
    assert_eq!(out.summary.compactions["reactive"], 1);
}

/// A screenshot tool returns `images` (base64 sizes in bytes) after a short text.
fn media_yaml(env: &str, images: &str, after: &str) -> String {
    format!(
        r#"name: media
world:
  model: claude-sonnet-4-5
  context_window: 400000
  env: {{DISABLE_AUTO_COMPACT: "1"{env}}}
script:
  - user: "Take a screenshot of the page"
  - assistant:
      - tool_use: {{id: toolu_shot, name: Bash, input: {{command: "screenshot --full-page", description: Capture the page}}}}
  - tool_output:
      toolu_shot: {{content: "Captured.", images: [{images}]}}
  - assistant:
      - text: "The header overlaps the menu."
{after}"#
    )
}

#[test]
fn an_oversized_image_is_refused_and_surfaced_then_stripped_from_the_next_request() {
    let after = "  - user: \"Describe it in words instead\"\n  - assistant:\n      - text: \"The header is too tall.\"\n";
    let out = run_yaml(&media_yaml("", "{base64_bytes: 6000000}", after));
    assert_eq!(lanes(&out), ["main", "main", "main"]);
    assert_eq!(out.rows[1].error.as_deref(), Some("image exceeds 5 MB maximum: 6000000 bytes > 5242880 bytes"));
    assert_eq!(out.summary.blocked, 1);
    // The next turn no longer carries the image; the rest of the result stays.
    let next = serde_json::to_string(&out.requests[2]).unwrap();
    assert!(!next.contains("iVBORw0KGgo") && next.contains("Captured."));
    assert!(out.rows[2].error.is_none());
    assert_eq!(out.rows[2].events, ["image_error_surfaced:1", "message_rewritten:oversized_media_stripped"]);
}

#[test]
fn an_oversized_image_goes_through_reactive_compact_when_it_is_on() {
    let summary = "  - assistant:\n      - text: \"<summary>A screenshot of the page was taken; it was too large to send.</summary>\"\n    lane: compact\n";
    let out = run_yaml(&media_yaml(r#", CTXSIM_REACTIVE_COMPACT: "1""#, "{base64_bytes: 6000000}", summary));
    assert_eq!(lanes(&out), ["main", "main", "compact", "main"]);
    assert!(out.rows[1].error.as_deref().unwrap().starts_with("image exceeds 5 MB maximum"));
    assert!(fired(&out.rows[3]).iter().any(|r| r.starts_with("reactive_compact: reactive compaction")), "{:?}", fired(&out.rows[3]));
    assert!(out.rows[3].error.is_none());
    assert!(!serde_json::to_string(&out.requests[3]).unwrap().contains("iVBORw0KGgo"));
}

#[test]
fn more_than_a_hundred_images_lose_the_oldest_before_sending() {
    let images = vec!["{base64_bytes: 400}"; 104].join(", ");
    let out = run_yaml(&media_yaml("", &images, ""));
    assert!(out.rows.iter().all(|r| r.error.is_none()));
    let sent = serde_json::to_string(&out.requests[1]).unwrap();
    assert_eq!(sent.matches("\"type\":\"image\"").count(), 100);
    assert_eq!(out.rows[1].events, ["message_rewritten:excess_media_stripped:4"]);
}

/// An image whose pixels the scenario gives counts `width × height / 750` tokens, as the API
/// counts a real one (its stand-in's PNG header carries them); without them, the flat 2,000 of
/// an unsized image.
#[test]
fn an_image_with_its_pixels_counts_them() {
    let flat = run_yaml(&media_yaml("", "{base64_bytes: 400}", ""));
    let sized = run_yaml(&media_yaml("", "{base64_bytes: 400, width: 512, height: 320}", ""));
    let sent = serde_json::to_string(&sized.requests[1]).unwrap();
    assert!(sent.contains("\"data\":\"iVBORw0KGgoAAAANSUhEUgAAAgAAAAFACAYAAADKyMQLAAAA"), "{sent}");
    // 512 × 320 / 750 = 218.5, rounded up.
    assert_eq!(flat.rows[1].context_tokens - sized.rows[1].context_tokens, 2_000 - 219);
    assert_eq!(flat.rows[0].context_tokens, sized.rows[0].context_tokens);
}

#[test]
fn media_size_errors_are_recognized_as_the_client_does() {
    use ctxsim::agent::compact::recovery::is_media_size_error;
    assert!(is_media_size_error("messages.3.content.0.image.source.base64: image exceeds 5 MB maximum: 6000000 bytes > 5242880 bytes"));
    assert!(is_media_size_error("image dimensions exceed max allowed size for many-image requests: 2000 pixels"));
    assert!(is_media_size_error("A maximum of 100 PDF pages may be provided."));
    assert!(!is_media_size_error("prompt is too long: 17620 tokens > 16000 maximum"));
    assert!(!is_media_size_error("maximum of many PDF pages"));
}
