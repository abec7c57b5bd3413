//! Issue 13 item 5: the agent's long-context stages (time-based and cached microcompact, the
//! aggregate tool result budget, snip, context collapse) and its request layout run on a real
//! session through the agent that replays it: the stage fires where the recording lets it, the
//! context and the cache show what it changed, the divergence names it, and a setting that
//! never fires leaves every row as the run as recorded's.

use std::sync::OnceLock;

use ctxsim::measure::RequestMetrics;
use ctxsim::recording::ImportedSession;
use ctxsim::replay::agent_whatif::{AgentOutcome, Prepared, agent_whatif, prepare};
use ctxsim::strategy::Strategy;

use crate::support::{measurer, realdata};

const SPOTTER: &str = "transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl";

fn spotter() -> &'static (ImportedSession, Prepared, String) {
    static SPOTTER_PREPARED: OnceLock<(ImportedSession, Prepared, String)> = OnceLock::new();
    SPOTTER_PREPARED.get_or_init(|| prepared(SPOTTER))
}

/// A shipped real session (`rel` under realdata), loaded and prepared for the agent, with its
/// path as the runs name it.
fn prepared(rel: &str) -> (ImportedSession, Prepared, String) {
    let path = realdata().join(rel);
    let file = path.display().to_string();
    let session = ctxsim::replay::load_session(&path).unwrap();
    let prepared = prepare(&session, &file, &measurer()).unwrap();
    (session, prepared, file)
}

/// The spotter session through the agent under `claude-code` with `sets`.
fn run(sets: &[&str]) -> AgentOutcome {
    let (session, prepared, file) = spotter();
    let sets: Vec<String> = sets.iter().map(|s| (*s).to_owned()).collect();
    let strategy = Strategy::resolve_with("claude-code", &sets).unwrap();
    agent_whatif(session, file, prepared, &mut measurer(), &strategy).unwrap()
}

/// The main lane's answered requests, in order.
fn main_rows(outcome: &AgentOutcome) -> Vec<&RequestMetrics> {
    outcome.rows.iter().filter(|r| r.lane == "main" && r.error.is_none()).collect()
}

/// Positions (in [`main_rows`]) of the requests where `stage` fired.
fn fired(outcome: &AgentOutcome, stage: &str) -> Vec<usize> {
    main_rows(outcome).iter().enumerate().filter(|(_, r)| r.stages.iter().any(|s| s.fired && s.name == stage)).map(|(i, _)| i).collect()
}

fn rows_json(outcome: &AgentOutcome) -> String {
    serde_json::to_string(&outcome.rows).unwrap()
}

/// The rows without their stage reports (a stage turned on that never fires says why in its
/// report, where the run without it says `disabled_by_config`).
fn rows_unstaged(outcome: &AgentOutcome) -> String {
    let rows: Vec<RequestMetrics> = outcome.rows.iter().map(|r| RequestMetrics { stages: Default::default(), ..r.clone() }).collect();
    serde_json::to_string(&rows).unwrap()
}

/// The position of the first main request after the recorded automatic compaction.
fn after_recorded_compaction(outcome: &AgentOutcome) -> usize {
    let call = outcome.compactions.first().expect("the run as recorded compacts where the recording did").call;
    let (_, prepared, _) = spotter();
    prepared.workload.main_calls.iter().position(|c| *c >= call).unwrap()
}

/// Time-based microcompact below a recorded idle gap clears old results at the first request
/// after the gap: the context shrinks there and the cached prefix breaks; at 600 minutes (no
/// such gap in the session) it never fires and nothing changes.
#[test]
fn time_based_microcompact_fires_at_a_recorded_idle_gap_through_the_agent() {
    let base = run(&["ttl_main=1h"]);
    let cleared = run(&["ttl_main=1h", "compact.microcompact.time_based_enabled=true", "compact.microcompact.gap_threshold_minutes=5"]);
    let at = fired(&cleared, "microcompact");
    assert!(!at.is_empty(), "time-based microcompact fired nowhere");
    let (rows, base_rows) = (main_rows(&cleared), main_rows(&base));
    for &k in &at {
        assert!(k > 0 && rows[k].time_ms - rows[k - 1].time_ms >= 5 * 60_000, "request {k} fired after a gap under the threshold");
    }
    let first = at[0];
    assert!(rows[first].context_tokens < base_rows[first].context_tokens, "{} vs {}", rows[first].context_tokens, base_rows[first].context_tokens);
    assert!(rows[first].cache_read_input_tokens < base_rows[first].cache_read_input_tokens, "a cache break at the gap");
    let why = &cleared.divergence.as_ref().expect("clearing results parts from the recording").1;
    assert!(why.contains("microcompact"), "{why}");
    let sizes = |rows: &[&RequestMetrics]| rows.iter().map(|r| (r.context_tokens, r.cache_read_input_tokens, r.cache_creation_input_tokens)).collect::<Vec<_>>();
    assert_eq!(sizes(&rows[..first]), sizes(&base_rows[..first]), "nothing changes before the gap");
    let never = run(&["ttl_main=1h", "compact.microcompact.time_based_enabled=true", "compact.microcompact.gap_threshold_minutes=600"]);
    assert!(fired(&never, "microcompact").is_empty());
    assert_eq!(rows_unstaged(&never), rows_unstaged(&base), "a stage that never fires changes nothing");
    assert!(never.divergence.is_none());
}

/// Cached microcompact deletes old results server-side: it fires, and before the recorded
/// compaction the server writes less to the cache than as recorded (the deleted results are
/// not written again when the prefix after them is).
#[test]
fn cached_microcompact_reaches_a_real_session_through_the_agent() {
    let base = run(&[]);
    let edited = run(&["compact.microcompact.cached=cache_edits"]);
    assert!(!fired(&edited, "microcompact").is_empty());
    let end = after_recorded_compaction(&base);
    let sum = |o: &AgentOutcome| main_rows(o)[..end].iter().map(|r| r.cache_creation_input_tokens).sum::<u64>();
    assert!(sum(&edited) < sum(&base), "{} vs {}", sum(&edited), sum(&base));
}

/// The aggregate budget per message: on, with a limit the session's results pass, it persists
/// results and the context shrinks from there, the replacement re-applied on every later
/// request (the prefix stays cached); off, the same limit changes nothing.
#[test]
fn the_aggregate_tool_result_budget_reaches_a_real_session_through_the_agent() {
    let base = run(&[]);
    let budgeted = run(&["compact.tool_result_budget.aggregate_enabled=true", "compact.tool_result_budget.aggregate_chars=20000"]);
    let at = fired(&budgeted, "tool_result_budget");
    assert!(!at.is_empty());
    let (rows, base_rows) = (main_rows(&budgeted), main_rows(&base));
    assert!(rows[at[0]].context_tokens < base_rows[at[0]].context_tokens);
    assert!(rows[at[0] + 1].context_tokens < base_rows[at[0] + 1].context_tokens);
    assert!(rows[at[0] + 1].cache_read_input_tokens > 0);
    let off = run(&["compact.tool_result_budget.aggregate_chars=20000"]);
    assert_eq!(rows_unstaged(&off), rows_unstaged(&base));
}

/// Snip drops the oldest rounds once the messages reach its trigger: the requests from there
/// hold less context than as recorded; at its default trigger (85%) the session, compacted at
/// 167k, never gets there and nothing changes.
#[test]
fn snip_drops_old_rounds_of_a_real_session_through_the_agent() {
    let base = run(&[]);
    let snipped = run(&["compact.snip.enabled=true", "compact.snip.trigger_pct=50", "compact.snip.target_pct=30"]);
    let at = fired(&snipped, "snip");
    assert!(!at.is_empty());
    let (rows, base_rows) = (main_rows(&snipped), main_rows(&base));
    assert!(rows[at[0]].context_tokens < base_rows[at[0]].context_tokens);
    assert!(snipped.divergence.as_ref().unwrap().1.contains("snip"), "{:?}", snipped.divergence);
    let default = run(&["compact.snip.enabled=true"]);
    assert!(fired(&default, "snip").is_empty());
    assert_eq!(rows_unstaged(&default), rows_unstaged(&base));
}

/// Context collapse commits the oldest rounds into a digest: from the commit the context is
/// smaller than as recorded.
#[test]
fn context_collapse_commits_on_a_real_session_through_the_agent() {
    let base = run(&[]);
    let collapsed = run(&["compact.context_collapse.enabled=true", "compact.context_collapse.commit_pct=50", "compact.context_collapse.target_pct=30"]);
    let at = fired(&collapsed, "context_collapse");
    assert!(!at.is_empty());
    let (rows, base_rows) = (main_rows(&collapsed), main_rows(&base));
    assert!(rows[at[0]].context_tokens < base_rows[at[0]].context_tokens, "{} vs {}", rows[at[0]].context_tokens, base_rows[at[0]].context_tokens);
}

/// Knobs of the request layout and the tool executor reach the session: each changes the rows;
/// the run names no stage for them, the requests are what differs.
#[test]
fn layout_and_executor_knobs_reach_a_real_session_through_the_agent() {
    let base = rows_json(&run(&[]));
    for set in [
        "dynamic_boundary=false",
        "env.DISABLE_PROMPT_CACHING=1",
        "attribution_header=false",
        "enable_tool_search=false",
        "bash_max_output_length=2000",
            ] {
        let outcome = run(&[set]);
        assert_ne!(rows_json(&outcome), base, "{set} changed nothing");
    }
}

/// The tool executor's limits on sessions whose recorded results pass them: Read's line limit
/// cuts a recorded whole-file Read to what the client returns, the MCP output limit an MCP
/// result; the context shrinks.
#[test]
fn read_and_mcp_limits_reach_recorded_results_through_the_agent() {
    for (path, set) in [
        ("transcripts/cipher-box/af1dd25ebb3e-8.full.jsonl", "read_max_lines=200"),
        ("transcripts/cipher-box/c644f3afc869-1.full.jsonl", "max_mcp_output_tokens=2000"),
    ] {
        let (session, prepared, file) = prepared(path);
        let context = |sets: &[String]| {
            let strategy = Strategy::resolve_with("claude-code", sets).unwrap();
            let outcome = agent_whatif(&session, &file, &prepared, &mut measurer(), &strategy).unwrap();
            main_rows(&outcome).iter().map(|r| r.context_tokens).sum::<u64>()
        };
        let (base, limited) = (context(&[]), context(&[set.to_owned()]));
        assert!(limited < base, "{set} on {file}: {limited} vs {base}");
    }
}

/// The variables Claude Code users set reach a real session through the agent: the percentage
/// override by its variable and by its knob give one threshold, the window variable sets the
/// window the reserve and buffer come off, and either switch turns compaction off (every
/// recorded compaction gone, the replies diverging there).
#[test]
fn the_clients_env_vars_reach_a_real_session_through_the_agent() {
    use ctxsim::replay::agent_whatif::{effective_strategy, thresholds_of};
    let (session, prepared, file) = prepared("transcripts/entireio-cli/cd95adddad32-0.full.jsonl");
    let threshold = |set: &str| {
        let strategy = Strategy::resolve_with("claude-code", &[set.to_owned()]).unwrap();
        thresholds_of(&effective_strategy(&strategy, &prepared), &prepared).autocompact
    };
    assert_eq!(threshold("env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=50"), 84_000);
    assert_eq!(threshold("compact.autocompact.pct_override=50"), 84_000);
    assert_eq!(threshold("env.CLAUDE_CODE_AUTO_COMPACT_WINDOW=120000"), 120_000 - 32_000 - 13_000);
    let recorded = agent_whatif(&session, &file, &prepared, &mut measurer(), &Strategy::resolve_with("claude-code", &[]).unwrap()).unwrap();
    assert!(recorded.compactions.len() >= 3, "{:?}", recorded.compactions);
    for var in ["env.DISABLE_AUTO_COMPACT=1", "env.DISABLE_COMPACT=1"] {
        let strategy = Strategy::resolve_with("claude-code", &[var.to_owned()]).unwrap();
        let outcome = agent_whatif(&session, &file, &prepared, &mut measurer(), &strategy).unwrap();
        assert!(outcome.compactions.iter().all(|c| c.stage != "autocompact"), "{var}: {:?}", outcome.compactions);
        assert_eq!(outcome.divergence.as_ref().map(|d| d.0), Some(recorded.compactions[0].call), "{var}");
    }
    let err = Strategy::resolve_with("claude-code", &["env.NOT_A_CLIENT_VAR=1".to_owned()]).unwrap_err();
    assert!(err.to_string().contains("NOT_A_CLIENT_VAR"), "{err}");
}

/// Lower per-tool thresholds of the tool result budget replace the large recorded results by
/// their previews: the context shrinks (up to the recorded compaction, which comes later now), the
/// replies diverge at the first one, and nothing
/// changes before it.
#[test]
fn the_tool_result_budget_thresholds_reach_a_real_session_through_the_agent() {
    let base = run(&[]);
    let budgeted = run(&["compact.tool_result_budget.default_chars=3000", "compact.tool_result_budget.per_tool_chars={}"]);
    let (at, why) = budgeted.divergence.clone().expect("the budget fired");
    assert!(why.contains("tool_result_budget") || why.contains("tool result budget"), "{why}");
    // Up to the recorded compaction (smaller results put the agent's own compaction later).
    let end = after_recorded_compaction(&base);
    let total = |o: &AgentOutcome| main_rows(o)[..end].iter().map(|r| r.context_tokens).sum::<u64>();
    assert!(total(&budgeted) < total(&base), "{} vs {}", total(&budgeted), total(&base));
    let (_, prepared, _) = spotter();
    let k = prepared.workload.main_calls.iter().position(|c| *c >= at).unwrap();
    let sizes = |o: &AgentOutcome| main_rows(o)[..k].iter().map(|r| r.context_tokens).collect::<Vec<_>>();
    assert_eq!(sizes(&budgeted), sizes(&base), "nothing changes before the first replaced result");
}

/// References: paths hold a `/` and a letter; identifiers are snake_case or camelCase.
#[test]
fn loss_references_are_paths_and_identifiers() {
    let mut refs = std::collections::BTreeSet::new();
    ctxsim::replay::loss::references("Edit src/replay/loss.rs: call compaction_loss and parseVersion, not the word Compaction (or 12/3).", &mut refs);
    let refs: Vec<&str> = refs.iter().map(String::as_str).collect();
    assert_eq!(refs, ["compaction_loss", "parseVersion", "src/replay/loss.rs"]);
    // A Windows client's file, in the spellings its tool inputs and results use, is one reference.
    let mut refs = std::collections::BTreeSet::new();
    ctxsim::replay::loss::references(r#"Read D:\omp\src\Git.go; grep d:/omp/src/git.go:12; printf("s:\n")"#, &mut refs);
    assert_eq!(refs.into_iter().collect::<Vec<_>>(), ["/d/omp/src/git.go"]);
}

/// `replay_recorded_microcompact = false` leaves the recorded microcompact out: the results it
/// cleared stay in view (more context from its call on), the replies diverge there and say why;
/// before it nothing changes.
#[test]
fn the_recorded_microcompact_left_out_keeps_its_results_in_view() {
    let (session, prepared, file) = prepared("transcripts/entireio-cli/7662d755ef9f-2.full.jsonl");
    let run = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| (*s).to_owned()).collect();
        agent_whatif(&session, &file, &prepared, &mut measurer(), &Strategy::resolve_with("claude-code", &sets).unwrap()).unwrap()
    };
    let (base, kept) = (run(&[]), run(&["replay_recorded_microcompact=false"]));
    assert!(base.divergence.is_none(), "{:?}", base.divergence);
    let (at, why) = kept.divergence.clone().expect("the results stay in view");
    assert!(why.contains("recorded microcompact was left out"), "{why}");
    let k = prepared.workload.main_calls.iter().position(|c| *c == at).unwrap();
    let (rows, base_rows) = (main_rows(&kept), main_rows(&base));
    assert!(rows[k].context_tokens > base_rows[k].context_tokens, "{} vs {}", rows[k].context_tokens, base_rows[k].context_tokens);
    let sizes = |rows: &[&RequestMetrics]| rows.iter().map(|r| (r.context_tokens, r.cache_read_input_tokens)).collect::<Vec<_>>();
    assert_eq!(sizes(&rows[..k]), sizes(&base_rows[..k]));
    // The preset that turns microcompact off leaves it out too.
    let preset = agent_whatif(&session, &file, &prepared, &mut measurer(), &Strategy::resolve_with("claude-code-no-microcompact", &[]).unwrap()).unwrap();
    assert_eq!(preset.divergence.as_ref().map(|d| d.0), Some(at));
}
