//! `compare`, `sweep` and `check` through the agent (the default engine): what-ifs on real
//! sessions through the agent itself.
use std::path::Path;
use std::process::Command;

/// The smallest shared session with a recorded automatic compaction (2.0.76, threshold 155,000,
/// recorded preTokens 155,250 before its 7th call).
fn a6e4() -> String {
    crate::support::realdata().join("transcripts/entireio-cli/a6e4c2a0fbd1-0.full.jsonl").display().to_string()
}

fn ctxsim_ok(args: &[&str]) -> (String, String) {
    let run = Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(args).output().unwrap();
    assert!(run.status.success(), "{args:?}: {}", String::from_utf8_lossy(&run.stderr));
    (String::from_utf8(run.stdout).unwrap(), String::from_utf8(run.stderr).unwrap())
}

/// `compare --engine agent --format json` of one session under one strategy with `sets`.
fn agent_compare(session: &str, strategy: &str, sets: &[&str]) -> serde_json::Value {
    let mut args = vec!["compare", "--engine", "agent", "--estimator", "chars4", "--format", "json", session, "--strategies", strategy];
    for set in sets {
        args.extend(["--set", set]);
    }
    let (stdout, _) = ctxsim_ok(&args);
    let mut all: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    all[0].take()
}

/// The calls the agent compacted before, in order.
fn compaction_calls(e: &serde_json::Value) -> Vec<u64> {
    e["agent"]["compactions"].as_array().unwrap().iter().map(|c| c["call"].as_u64().unwrap()).collect()
}

/// Issue 13's target: sweeping the autocompact buffer through the agent moves the compaction
/// point monotonically (a larger buffer, an earlier compaction) with at least 3 distinct outcomes;
/// the default buffer compacts where the recording did, takes the recorded summary and does not
/// diverge; the others say from which call and why, and take the stand-in.
#[test]
fn the_autocompact_buffer_moves_the_agents_compaction_on_a_real_session() {
    let session = a6e4();
    let mut firsts = Vec::new();
    let mut digests = Vec::new();
    for buffer in [5_000, 13_000, 15_000, 20_000] {
        let set = format!("compact.autocompact.buffer_tokens={buffer}");
        let e = agent_compare(&session, "claude-code", &[set.as_str()]);
        let calls = compaction_calls(&e);
        assert!(!calls.is_empty(), "buffer {buffer}: {e}");
        firsts.push(calls[0]);
        digests.push((e["summary"]["cost_usd"].clone(), e["summary"]["peak_context_tokens"].clone()));
        let summaries: Vec<&str> = e["agent"]["compactions"].as_array().unwrap().iter().map(|c| c["summary"].as_str().unwrap()).collect();
        if buffer == 13_000 {
            // The recorded version's own setting: the agent compacts where the client did.
            assert_eq!(e["divergence"], serde_json::Value::Null, "{e}");
            assert_eq!(e["replies_diverge"], false);
            assert_eq!(summaries, ["recorded"]);
        } else {
            let why = e["divergence"].as_str().unwrap_or_else(|| panic!("buffer {buffer}: no divergence note: {e}"));
            assert!(why.starts_with("from call ") && why.contains("the recorded replies continue as recorded"), "{why}");
            assert_eq!(e["replies_diverge"], true);
        }
        if buffer >= 15_000 {
            assert!(e["divergence"].as_str().unwrap().contains("the agent compacted (autocompact"), "{e}");
            assert_eq!(summaries[0], "stand-in");
            // The compaction's information loss, from the agent's own request after it.
            let loss = &e["compaction_losses"][0];
            assert_eq!(loss["call"], calls[0]);
            assert!(loss["tokens_dropped"].as_u64().unwrap() > 50_000, "{loss}");
        }
    }
    assert!(firsts.windows(2).all(|w| w[0] >= w[1]), "a larger buffer compacts no later: {firsts:?}");
    let mut distinct = digests.clone();
    distinct.sort_by_key(|d| d.0.to_string());
    distinct.dedup();
    assert!(distinct.len() >= 3, "{digests:?}");
    let mut calls = firsts.clone();
    calls.dedup();
    assert!(calls.len() >= 3, "{firsts:?}");
}

/// The PCT override reaches the session through the agent the same way, and an override that
/// puts the threshold where a buffer does shares that buffer's run: one memo key, same results.
#[test]
fn the_pct_override_reaches_a_real_session_and_equal_thresholds_share_a_run() {
    let session = a6e4();
    {
        use ctxsim::replay::agent_whatif::{effective_strategy, prepare, strategy_key};
        let loaded = ctxsim::replay::load_session(Path::new(&session)).unwrap();
        let prepared = prepare(&loaded, &session, &crate::support::measurer()).unwrap();
        let key = |sets: &[&str]| {
            let strategy = ctxsim::strategy::Strategy::resolve_with("claude-code", &sets.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
            strategy_key(&effective_strategy(&strategy, &prepared), &prepared)
        };
        assert_eq!(key(&["env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=50"]), key(&["compact.autocompact.buffer_tokens=84000"]));
        assert_ne!(key(&["env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=50"]), key(&["compact.autocompact.buffer_tokens=80000"]));
        assert_ne!(key(&[]), key(&["ttl_main=1h"]));
    }
    // 2.0.76: window 200,000 less a 32,000 reserve = 168,000 effective; 50% = 84,000.
    let pct = agent_compare(&session, "claude-code", &["env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=50"]);
    let buffer = agent_compare(&session, "claude-code", &["compact.autocompact.buffer_tokens=84000"]);
    assert_eq!(compaction_calls(&pct), compaction_calls(&buffer));
    assert_eq!(pct["summary"]["cost_usd"], buffer["summary"]["cost_usd"]);
    let default = agent_compare(&session, "claude-code", &[]);
    assert!(compaction_calls(&pct)[0] < compaction_calls(&default)[0], "{pct} vs {default}");
    // DISABLE_AUTO_COMPACT: no automatic compaction at all, and the note says the recording's
    // compaction was not made.
    let off = agent_compare(&session, "claude-code", &["env.DISABLE_AUTO_COMPACT=1"]);
    assert!(compaction_calls(&off).is_empty(), "{off}");
    assert!(off["divergence"].as_str().unwrap().contains("the recording compacted (auto) where the agent did not"), "{off}");
}

/// A layout knob changes the agent's requests: tool schemas sent up front raise the peak
/// context of the session. The agent is the default engine (no `--engine`: the `agent` notes,
/// `"engine": "agent"`), and the table names the engine it ran.
#[test]
fn a_layout_knob_reaches_a_real_session_through_the_agent() {
    let session = a6e4();
    let base = agent_compare(&session, "claude-code", &[]);
    let eager = agent_compare(&session, "claude-code-eager-tools", &[]);
    assert!(eager["summary"]["peak_context_tokens"].as_u64() > base["summary"]["peak_context_tokens"].as_u64(), "{eager} vs {base}");
    assert_eq!(base["engine"], "agent");
    let (stdout, _) = ctxsim_ok(&["compare", "--estimator", "chars4", "--format", "json", session.as_str(), "--strategies", "claude-code"]);
    let default: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(default[0]["agent"], base["agent"], "{stdout}");
    assert_eq!(default[0]["summary"], base["summary"], "{stdout}");
    let (table, _) = ctxsim_ok(&["compare", "--engine", "agent", "--estimator", "chars4", session.as_str(), "--strategies", "claude-code"]);
    assert!(table.contains("- Engine: recorded sessions ran through the agent (`--engine agent`, the default)"), "{table}");
}

/// The record-based engine was removed (session 26): `--engine replay` is refused by every
/// command that took `--engine` (exit 2) with one line saying so and what measures a recorded
/// session as recorded; `--engine agent` stays valid.
#[test]
fn the_record_based_engine_is_refused_by_every_command() {
    let session = a6e4();
    for (command, extra) in [
        ("compare", &["--strategies", "claude-code"][..]),
        ("sweep", &["--param", "ttl_main=5m,1h"]),
        ("check", &[]),
        ("audit", &[]),
        ("replay", &[]),
        ("fidelity", &[]),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ctxsim")).args([command, "--engine", "replay", "--estimator", "chars4", session.as_str()]).args(extra).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{command}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("`--engine replay` was removed: the agent measures recorded sessions as recorded (`--strategy as-recorded`"), "{command}: {stderr}");
        assert_eq!(stderr.lines().filter(|l| l.contains("--engine replay")).count(), 1, "{command}: {stderr}");
        assert!(out.stdout.is_empty(), "{command}");
    }
    let (stdout, _) = ctxsim_ok(&["replay", "--engine", "agent", "--estimator", "chars4", "--format", "json", session.as_str()]);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&stdout).unwrap()["engine"], "agent", "{stdout}");
}

/// `replay` runs a session through the agent by default, as `compare` does (one model of the
/// client): under a strategy its summary is `compare`'s, and every output names the engine
/// (JSON `engine`, the CSV column, a line under the table).
#[test]
fn replay_runs_a_session_through_the_agent_by_default_and_names_the_engine() {
    let session = a6e4();
    let (stdout, _) = ctxsim_ok(&["replay", "--estimator", "chars4", "--format", "json", session.as_str(), "--strategy", "claude-code-1h"]);
    let replayed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(replayed["engine"], "agent", "{stdout}");
    let compared = agent_compare(&session, "claude-code-1h", &[]);
    let mut summary = compared["summary"].clone();
    summary["engine"] = "agent".into();
    assert_eq!(replayed, summary);
    // As recorded: the strategy named `as-recorded`, the run `compare` makes of `claude-code`.
    let (stdout, _) = ctxsim_ok(&["replay", "--estimator", "chars4", "--format", "json", session.as_str()]);
    let as_recorded: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(as_recorded["strategy"], "as-recorded");
    assert_eq!(as_recorded["cost_usd"], agent_compare(&session, "claude-code", &[])["summary"]["cost_usd"]);
    let (csv, _) = ctxsim_ok(&["replay", "--estimator", "chars4", "--format", "csv", session.as_str()]);
    let (header, row) = (csv.lines().next().unwrap(), csv.lines().nth(1).unwrap());
    assert!(header.ends_with(",engine") && row.ends_with(",agent"), "{csv}");
    let (table, _) = ctxsim_ok(&["replay", "--estimator", "chars4", session.as_str()]);
    assert!(table.contains("engine: agent (the agent itself, driven by each session)"), "{table}");
    // `run` has no engine: no field, no column.
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/idle-gap.yaml").display().to_string();
    let (csv, _) = ctxsim_ok(&["run", "--estimator", "chars4", "--format", "csv", scenario.as_str()]);
    assert!(!csv.lines().next().unwrap().contains("engine"), "{csv}");
}

/// `fidelity` drives the agent and names it, and `--breaks` stays inside the JSON. Its
/// ablations run through the agent too (tests/it/fidelity.rs measures what they move); where
/// one changes nothing it says why.
#[test]
fn fidelity_drives_the_agent_and_its_ablations_say_where_they_change_nothing() {
    let session = a6e4();
    let (stdout, _) = ctxsim_ok(&["fidelity", "--estimator", "chars4", "--format", "json", "--breaks", session.as_str()]);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["engine"], "agent", "{stdout}");
    assert!(report["agent"].is_object() && report["breaks"].is_array(), "{stdout}");
    // The breaks' causes are read from the record: a6e4's three breaks after long gaps are the
    // TTL's.
    let causes = |report: &serde_json::Value| -> Vec<String> { report["breaks"].as_array().unwrap().iter().map(|b| b["cause"].as_str().unwrap().to_owned()).collect() };
    assert_eq!(causes(&report), ["ttl_expired", "ttl_expired", "ttl_expired", "compaction"], "{stdout}");
    let (table, _) = ctxsim_ok(&["fidelity", "--estimator", "chars4", session.as_str()]);
    assert!(table.contains("\nengine: agent (") && table.contains("session (through the agent)"), "{table}");
    // a6e4 records no api requests: the ablation of them is said to change nothing.
    let (stdout, stderr) = ctxsim_ok(&["fidelity", "--estimator", "chars4", "--format", "json", "--no-recorded-requests", session.as_str()]);
    assert!(stderr.contains("note: --no-recorded-requests has no effect: the session records no api requests"), "{stderr}");
    let ablated: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(ablated["engine"], "agent");
    assert!(ablated["agent"].is_object(), "{stdout}");
}

fn sweep_agent(args: &[&str], out: &Path, threads: &str) -> (String, String) {
    let out_arg = out.display().to_string();
    let mut all: Vec<&str> = vec!["sweep", "--engine", "agent", "--estimator", "chars4", "--no-progress", "--threads", threads, "--out", out_arg.as_str()];
    all.extend_from_slice(args);
    ctxsim_ok(&all)
}

/// A sweep through the agent with a knob that changes nothing on a real session warns per input
/// with the reason (the session never reaches the threshold; the stage is off), recommends
/// nothing over the equal grid, and writes the same bytes on 1 and 2 threads.
#[test]
fn a_sweep_through_the_agent_warns_of_a_knob_without_effect_on_a_real_session() {
    let session = crate::support::realdata().join("transcripts/NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl").display().to_string();
    let args = [session.as_str(), "--param", "compact.autocompact.buffer_tokens=5000,10000", "--param", "compact.microcompact.gap_threshold_minutes=5,30"];
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (stdout, stderr) = sweep_agent(&args, one.path(), "1");
    sweep_agent(&args, two.path(), "2");
    let name = "01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl";
    assert!(
        stderr.contains(&format!("warning: no effect on {name}: compact.autocompact.buffer_tokens changed no result (the session never reaches the autocompaction threshold")),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("warning: no effect on {name}: compact.microcompact.gap_threshold_minutes changed no result (the stage microcompact is disabled")), "{stderr}");
    assert!(!stderr.contains("does not honour"), "through the agent every knob reaches the session: {stderr}");
    assert!(stdout.contains("Recommended: none (every one of the 4 points gave the same results"), "{stdout}");
    for file in ["sweep.csv", "sweep.json", "no_effect.csv", "recommendation.txt"] {
        assert_eq!(std::fs::read(one.path().join(file)).unwrap(), std::fs::read(two.path().join(file)).unwrap(), "{file}");
    }
    // The engine is part of the grid's signature, named in every output.
    let first = |dir: &Path| std::fs::read_to_string(dir.join("sweep.csv")).unwrap().lines().next().unwrap().to_owned();
    assert!(first(one.path()).contains(" engine=agent points=4"), "{}", first(one.path()));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(one.path().join("sweep.json")).unwrap()).unwrap();
    assert_eq!(json["engine"], "agent");
    let text = std::fs::read_to_string(one.path().join("recommendation.txt")).unwrap();
    assert!(text.contains("Engine: recorded sessions ran through the agent (`--engine agent`"), "{text}");
    assert!(stdout.contains("Engine: recorded sessions ran through the agent (`--engine agent`, the default)"), "{stdout}");
}

/// `check` judges a recorded session through the agent against a baseline: written by
/// `--update-baseline`, passed by the same run; `--engine replay` and a baseline measured by it
/// are refused (the baseline records the engine), and a session cannot be combined with
/// `--disable-stage`.
#[test]
fn check_takes_a_real_session_through_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let baseline = dir.path().join("baseline.json").display().to_string();
    let session = a6e4();
    let run = |extra: &[&str]| {
        let mut args = vec!["check", session.as_str(), "--estimator", "chars4", "--baseline", baseline.as_str()];
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(&args).output().unwrap()
    };
    let written = run(&["--engine", "agent", "--update-baseline"]);
    assert!(written.status.success(), "{}", String::from_utf8_lossy(&written.stderr));
    let text = std::fs::read_to_string(&baseline).unwrap();
    assert!(text.contains("\"strategy\": \"claude-code\""), "{text}");
    assert!(text.contains("\"session_engine\": \"agent\""), "{text}");
    assert!(text.contains("a6e4c2a0fbd1-0.full.jsonl"), "{text}");
    let passed = run(&["--engine", "agent", "--json"]);
    assert_eq!(passed.status.code(), Some(0), "{}", String::from_utf8_lossy(&passed.stderr));
    let report: serde_json::Value = serde_json::from_slice(&passed.stdout).unwrap();
    let checks = report["scenarios"][0]["checks"].as_array().unwrap();
    assert!(checks.iter().any(|c| c["name"] == "baseline.cost_usd" && c["status"] == "pass"), "{report}");
    // The agent is the default engine: the same baseline passes without `--engine`, and the
    // run names its engine.
    let default = run(&[]);
    assert_eq!(default.status.code(), Some(0), "{}", String::from_utf8_lossy(&default.stderr));
    assert!(String::from_utf8_lossy(&default.stdout).contains("note engine: the session ran through the agent (--engine agent)"), "{}", String::from_utf8_lossy(&default.stdout));
    let other = run(&["--engine", "replay"]);
    assert_eq!(other.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&other.stderr).contains("`--engine replay` was removed"));
    // A baseline measured through the record-based replay is refused, and refreshed by
    // --update-baseline.
    let agent_text = std::fs::read_to_string(&baseline).unwrap();
    std::fs::write(&baseline, agent_text.replace("\"session_engine\": \"agent\"", "\"session_engine\": \"replay\"")).unwrap();
    let stale = run(&[]);
    assert_eq!(stale.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&stale.stderr);
    assert!(stderr.contains("measured through the record-based replay (`--engine replay`), which check no longer runs") && stderr.contains("re-run with --update-baseline"), "{stderr}");
    let refreshed = run(&["--update-baseline"]);
    assert!(refreshed.status.success(), "{}", String::from_utf8_lossy(&refreshed.stderr));
    assert_eq!(std::fs::read_to_string(&baseline).unwrap(), agent_text);
    // A run of scenarios alone shares the baseline: the engine is the sessions' only.
    let scenario = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/compaction-fork-shares-cache.yaml").display().to_string();
    let scenarios_only = Command::new(env!("CARGO_BIN_EXE_ctxsim"))
        .args(["check", scenario.as_str(), "--estimator", "chars4", "--baseline", baseline.as_str(), "--update-baseline"])
        .output()
        .unwrap();
    assert!(scenarios_only.status.success(), "{}", String::from_utf8_lossy(&scenarios_only.stderr));
    let text = std::fs::read_to_string(&baseline).unwrap();
    assert!(text.contains("\"session_engine\": \"agent\"") && text.contains("a6e4c2a0fbd1-0.full.jsonl"), "{text}");
    assert_eq!(run(&[]).status.code(), Some(0), "the session still passes after the scenarios' update");
    let staged = run(&["--engine", "agent", "--disable-stage", "snip"]);
    assert_eq!(staged.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&staged.stderr).contains("--disable-stage applies to scenarios only"));
}

/// What the recorded client did too is no divergence: the server's clearing of idle thinking
/// under the client's own context-editing settings (entirecontext, 2.1.2xx), and a compaction
/// recorded before the first call of a file that continues a session (oh-my-posh 0254), which
/// the workload's opening history stands for.
#[test]
fn what_the_recorded_client_did_too_is_no_divergence() {
    let entirecontext = crate::support::realdata().join("transcripts/entirecontext/01M0FWRPX72AX3CYC2HMV1W2SN-1.full.jsonl").display().to_string();
    let e = agent_compare(&entirecontext, "claude-code", &[]);
    assert_eq!(e["divergence"], serde_json::Value::Null, "{e}");
    assert_eq!(e["agent"]["runs"], 1);
    // The context-editing preset asks the server for more than the client did: a divergence.
    let edited = agent_compare(&entirecontext, "context-editing", &[]);
    assert!(edited["divergence"].as_str().unwrap().contains("context_editing"), "{edited}");

    let posh = crate::support::realdata().join("transcripts/oh-my-posh/0254bffa0c17-1.full.jsonl");
    let loaded = ctxsim::replay::load_session(&posh).unwrap();
    let prepared = ctxsim::replay::agent_whatif::prepare(&loaded, &posh.display().to_string(), &crate::support::measurer()).unwrap();
    let first = prepared.workload.main_calls[0];
    assert!(prepared.recorded.iter().all(|r| r.call > first), "{:?}", prepared.recorded.iter().map(|r| r.call).collect::<Vec<_>>());
}

/// A session whose first call read a prefix an earlier session had cached (7be20d70, 2.1.37:
/// 16,589 tokens read) starts every what-if run with that prefix in the cache, as `fidelity
/// --engine agent` does, and applies the recorded client's turn rules around the agent's main
/// requests as fidelity does (`replay::turns::RecordedClient`: the post-turn side entry, the
/// prompts 2.1.37 renders the transient way): the as-recorded what-if reads what fidelity reads
/// at every main call (before, the what-if started cold, and from the first new turn on read
/// through prompts the client had re-rendered).
#[test]
fn a_what_if_through_the_agent_seeds_the_warm_first_call_prefix_as_fidelity_does() {
    use ctxsim::replay::agent_whatif::{agent_whatif, prepare};
    let path = crate::support::realdata().join("transcripts/entireio-cli/7be20d70c73b-0.full.jsonl");
    let file = path.display().to_string();
    let session = ctxsim::replay::load_session(&path).unwrap();
    let strategy = ctxsim::strategy::Strategy::resolve_with("claude-code", &[]).unwrap();
    let fidelity = ctxsim::replay::workload::agent_replay(&session, &file, &mut crate::support::measurer(), &strategy).unwrap();
    let first = &fidelity.replay.calls[0];
    let fidelity_read = first.metrics.as_ref().map(|m| m.cache_read_input_tokens).unwrap();
    assert!(fidelity_read > 0 && fidelity.sizing.seeded_prefix_tokens > 0, "the recorded first call read {}", first.recorded.cache_read_input_tokens);
    let mut measurer = crate::support::measurer();
    let prepared = prepare(&session, &file, &measurer).unwrap();
    assert_eq!(prepared.sizing.seeded_prefix_tokens, fidelity.sizing.seeded_prefix_tokens);
    let outcome = agent_whatif(&session, &file, &prepared, &mut measurer, &strategy).unwrap();
    assert_eq!(outcome.divergence, None);
    let whatif_first = outcome.rows.iter().find(|r| r.lane == "main").unwrap();
    assert_eq!(whatif_first.cache_read_input_tokens, fidelity_read);
    // The whole run is fidelity's: every main call reads what fidelity's reads, the turn rules'
    // events (side entries, re-rendered prompts) included.
    let fidelity_main: Vec<(u64, Vec<String>)> = main_rows(&fidelity).iter().map(|m| (m.cache_read_input_tokens, m.events.clone())).collect();
    let whatif_main: Vec<(u64, Vec<String>)> = outcome.rows.iter().filter(|r| r.lane == "main" && r.error.is_none()).map(|r| (r.cache_read_input_tokens, r.events.clone())).collect();
    assert_eq!(whatif_main.len(), fidelity_main.len());
    for (i, (w, f)) in whatif_main.iter().zip(&fidelity_main).enumerate() {
        assert_eq!(w, f, "main call {i}");
    }
    let rules = |rows: &[(u64, Vec<String>)], event: &str| rows.iter().filter(|(_, e)| e.iter().any(|x| x == event)).count();
    assert!(rules(&whatif_main, "side_entry") > 0 && rules(&whatif_main, "rerendered_prompt") > 0, "the turn rules act in this session");
}

/// Sessions of ../shared/realdata the as-recorded what-if runs without a divergence with
/// `chars4`: 15 of the 16 (9878b713 diverges from call 3, where the agent's tool result budget
/// persists a result the recorded client sent whole). A floor: a change that makes more of them
/// diverge compares fewer, and fails here.
const MIN_SESSIONS_WITHOUT_DIVERGENCE: usize = 15;

/// The main rows of fidelity's agent run, in the order of the recorded calls.
fn main_rows(fidelity: &ctxsim::replay::workload::AgentReplay) -> Vec<&ctxsim::measure::RequestMetrics> {
    fidelity.replay.calls.iter().filter(|c| c.lane == "main").filter_map(|c| c.metrics.as_ref()).collect()
}

/// On every shared session, the as-recorded point of a checkpointed family through the agent
/// (`agent_whatif_family`, going on from a checkpoint of a trunk run under a higher threshold)
/// is fidelity's agent run (`agent_replay`) call by call wherever it does not diverge: the
/// same rows (reads, writes, events, stages) at every main call, the recorded client's turn
/// rules applied by both.
#[test]
fn the_as_recorded_what_if_is_fidelitys_agent_run_on_every_shared_session() {
    use ctxsim::replay::agent_whatif::{agent_whatif_family, effective_strategy, prepare};
    let as_recorded = ctxsim::strategy::Strategy::resolve_with("claude-code", &[]).unwrap();
    // A threshold above the recorded one: the trunk, from whose checkpoints the as-recorded
    // point goes on.
    let higher = ctxsim::strategy::Strategy::resolve_with("claude-code", &["compact.autocompact.buffer_tokens=5000".to_owned()]).unwrap();
    let (mut compared, mut diverged) = (Vec::new(), Vec::new());
    let mut side_entries = 0;
    for path in crate::support::real_transcripts() {
        let file = path.display().to_string();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let session = ctxsim::replay::load_session(&path).unwrap();
        let fidelity = ctxsim::replay::workload::agent_replay(&session, &file, &mut crate::support::measurer(), &as_recorded).unwrap();
        let prepared = prepare(&session, &file, &crate::support::measurer()).unwrap();
        let effectives = [effective_strategy(&higher, &prepared), effective_strategy(&as_recorded, &prepared)];
        let mut family = agent_whatif_family(&session, &file, &prepared, crate::support::measurer(), &effectives).unwrap();
        let outcome = family.pop().unwrap().unwrap();
        if let Some((call, why)) = &outcome.divergence {
            diverged.push(format!("{name}: from call {call}: {why}"));
            continue;
        }
        let expected = main_rows(&fidelity);
        let got: Vec<&ctxsim::measure::RequestMetrics> = outcome.rows.iter().filter(|r| r.lane == "main" && r.error.is_none()).collect();
        assert_eq!(got.len(), expected.len(), "{name}: main calls");
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g, e, "{name}: main call {i} (recorded #{})", prepared.workload.main_calls[i]);
        }
        side_entries += got.iter().filter(|r| r.events.iter().any(|e| e == "side_entry")).count();
        compared.push(name);
    }
    assert!(compared.len() >= MIN_SESSIONS_WITHOUT_DIVERGENCE, "compared {compared:?}; diverged: {diverged:#?}");
    assert!(side_entries > 0, "the turn rules act: {compared:?}");
}

/// The points of a sweep that differ only in where autocompact fires go on from checkpoints of
/// one trunk run (`agent_whatif_family`): each gives exactly what its own run from the first
/// call gives — rows (stage reasons included), summary, compactions, divergence, losses and the
/// number of plan runs — on a session with a recorded automatic compaction, for thresholds
/// below, at and above the recorded one.
#[test]
fn checkpointed_runs_of_a_family_equal_the_runs_made_alone() {
    use ctxsim::replay::agent_whatif::{agent_whatif, agent_whatif_family, effective_strategy, family_key, prepare};
    let session = a6e4();
    let loaded = ctxsim::replay::load_session(Path::new(&session)).unwrap();
    let prepared = prepare(&loaded, &session, &crate::support::measurer()).unwrap();
    let sets = [
        "compact.autocompact.buffer_tokens=5000",
        "compact.autocompact.buffer_tokens=13000",
        "compact.autocompact.buffer_tokens=20000",
        "compact.autocompact.buffer_tokens=40000",
        "env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=50",
        "env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=70",
    ];
    let strategies: Vec<_> = sets.iter().map(|set| ctxsim::strategy::Strategy::resolve_with("claude-code", &[set.to_string()]).unwrap()).collect();
    let effectives: Vec<_> = strategies.iter().map(|s| effective_strategy(s, &prepared)).collect();
    let family = family_key(&effectives[0], &prepared).unwrap();
    assert!(effectives.iter().all(|e| family_key(e, &prepared).as_deref() == Some(family.as_str())));
    let together = agent_whatif_family(&loaded, &session, &prepared, crate::support::measurer(), &effectives).unwrap();
    let mut compaction_points = std::collections::BTreeSet::new();
    for ((set, strategy), together) in sets.iter().zip(&strategies).zip(together) {
        let alone = agent_whatif(&loaded, &session, &prepared, &mut crate::support::measurer(), strategy).unwrap();
        let together = together.unwrap();
        assert_eq!(format!("{together:?}"), format!("{alone:?}"), "{set}");
        compaction_points.insert(alone.compactions.iter().map(|c| c.call).collect::<Vec<_>>());
    }
    // The family really parts: the points compact at different calls.
    assert!(compaction_points.len() >= 3, "{compaction_points:?}");
    // A knob that is not the threshold makes another family.
    let ttl = ctxsim::strategy::Strategy::resolve_with("claude-code", &["ttl_main=1h".to_string()]).unwrap();
    assert_ne!(family_key(&effective_strategy(&ttl, &prepared), &prepared), Some(family));
}

/// `sweep --engine agent` writes the same bytes with the checkpoints and without
/// (`--no-checkpoints`: every point run alone), and on 1 and 2 threads.
#[test]
fn a_sweep_through_the_agent_is_the_same_with_and_without_checkpoints() {
    let session = a6e4();
    let args = [session.as_str(), "--param", "compact.autocompact.buffer_tokens=5000,13000,20000", "--param", "env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=50,80,95"];
    let (one, two, alone) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    sweep_agent(&args, one.path(), "1");
    sweep_agent(&args, two.path(), "2");
    let mut without = args.to_vec();
    without.push("--no-checkpoints");
    sweep_agent(&without, alone.path(), "2");
    let csv = std::fs::read_to_string(one.path().join("sweep.csv")).unwrap();
    let outcomes: std::collections::BTreeSet<&str> = csv.lines().skip(2).filter_map(|l| l.rsplit(',').next()).collect();
    assert!(outcomes.len() >= 3, "the grid parts: {csv}");
    for file in ["sweep.csv", "sweep.json", "no_effect.csv", "recommendation.txt", "pareto.svg", "sweep.html"] {
        let bytes = std::fs::read(one.path().join(file)).unwrap();
        assert_eq!(bytes, std::fs::read(two.path().join(file)).unwrap(), "{file}: 1 vs 2 threads");
        assert_eq!(bytes, std::fs::read(alone.path().join(file)).unwrap(), "{file}: with vs without checkpoints");
    }
}

/// Client rules that say, on each main request, which scripted main reply it consumes and how
/// many main requests they saw before it: their state is the count.
#[derive(Clone, Default)]
struct Probe {
    seen: usize,
}

impl ctxsim::runner::ClientRules for Probe {
    fn clone_box(&self) -> Box<dyn ctxsim::runner::ClientRules> {
        Box::new(self.clone())
    }

    fn before_main(&mut self, call: ctxsim::runner::MainCall<'_>, _: &mut ctxsim::measure::FlatRequest, _: &mut ctxsim::measure::Measurer) -> Vec<String> {
        self.seen += 1;
        vec![format!("probe:reply {} seen {}", call.reply, self.seen - 1)]
    }

    fn after_main(&mut self, _: &ctxsim::measure::RequestMetrics) {}
}

/// Four turns; the second is stopped by the blocking limit (autocompact off, 178,000 tokens
/// reported on a 200k window), a `/compact` frees the context, and the last two are answered.
const BLOCKED_THEN_COMPACTED: &str = r#"
name: blocked-then-compacted
world:
  model: claude-sonnet-4-5
  context_window: 200000
  max_output_tokens: 32000
  env:
    DISABLE_AUTO_COMPACT: "1"
script:
  - user: "Summarize the repository"
  - assistant:
      - text: "It is a small Rust library."
    usage: {input_tokens: 10, cache_read_input_tokens: 176990, cache_creation_input_tokens: 1000, output_tokens: 100}
  - user: "More detail please"
  - assistant:
      - text: "This reply is never sampled."
  - compact: true
  - user: "Go on"
  - assistant:
      - text: "The library parses dates."
  - user: "And then?"
  - assistant:
      - text: "It formats them."
  - assistant:
      - text: "<summary>\nThe user asked about the repository.\n</summary>"
    lane: compact
"#;

/// The probe's events of a run's main rows.
fn probe_events(rows: &[ctxsim::measure::RequestMetrics]) -> Vec<String> {
    rows.iter().filter(|r| r.lane == "main").flat_map(|r| r.events.iter().filter(|e| e.starts_with("probe:")).cloned()).collect()
}

/// The client's rules are told which scripted main reply each request consumes, not how many
/// requests came before it: a request the blocking limit stopped consumed its reply unsent, so
/// the next request stands for the reply after it (the recorded call whose reply it consumes,
/// `replay::turns::RecordedClient`).
#[test]
fn client_rules_see_the_reply_each_main_request_consumes() {
    let scenario = ctxsim::scenario::parse_scenario(BLOCKED_THEN_COMPACTED, "inline.yaml").unwrap();
    let options = ctxsim::runner::RunOptions { client: Some(Box::new(Probe::default())), ..Default::default() };
    let strategy = ctxsim::strategy::Strategy::default();
    let output = ctxsim::runner::run_scenario_opts(&scenario, &mut crate::support::measurer(), &strategy, &ctxsim::agent::compact::chain::Chain::new(), options).unwrap();
    assert_eq!(output.summary.blocked, 1);
    assert_eq!(probe_events(&output.rows), ["probe:reply 0 seen 0", "probe:reply 2 seen 1", "probe:reply 3 seen 2"]);
}

/// The run owns its client rules and a checkpoint copies them: a run that goes on from a
/// checkpoint taken at any step applies them from the state of that point, and gives the rows
/// of the run made from the start.
#[test]
fn a_checkpoint_carries_the_client_rules_state() {
    let scenario = ctxsim::scenario::parse_scenario(BLOCKED_THEN_COMPACTED, "inline.yaml").unwrap();
    let strategy = ctxsim::strategy::Strategy::default();
    let chain = ctxsim::agent::compact::chain::Chain::new();
    let start = || {
        let options = ctxsim::runner::RunOptions { client: Some(Box::new(Probe::default())), ..Default::default() };
        ctxsim::runner::RunState::start(&scenario, &strategy, options).unwrap()
    };
    let mut measurer = crate::support::measurer();
    let mut whole = start();
    while !whole.done(&scenario) {
        whole.step(&scenario, &mut measurer, &strategy, &chain).unwrap();
    }
    let whole = whole.finish(&scenario, &measurer, &strategy);
    assert_eq!(probe_events(&whole.rows).len(), 3);
    for at in 0..scenario.script.len() {
        let mut measurer = crate::support::measurer();
        let mut run = start();
        while run.next_step() < at {
            run.step(&scenario, &mut measurer, &strategy, &chain).unwrap();
        }
        let mut resumed = run.checkpoint();
        let mut measurer = measurer.clone();
        drop(run);
        while !resumed.done(&scenario) {
            resumed.step(&scenario, &mut measurer, &strategy, &chain).unwrap();
        }
        let resumed = resumed.finish(&scenario, &measurer, &strategy);
        assert_eq!(resumed.rows, whole.rows, "from step {at}");
    }
}

/// One decision of which strategies differ only in where autocompact fires: the what-if's
/// `family_key` and the agent's `retarget_autocompact` (through `RunState`) agree on every pair
/// of strategies, with the workload's env empty and with an env that makes two strategies one
/// (`ENABLE_TOOL_SEARCH` set in the world overrides the strategy's).
#[test]
fn the_family_key_and_the_agents_retarget_agree() {
    use ctxsim::replay::agent_whatif::{effective_strategy, family_key, prepare};
    let session = a6e4();
    let loaded = ctxsim::replay::load_session(Path::new(&session)).unwrap();
    let mut prepared = prepare(&loaded, &session, &crate::support::measurer()).unwrap();
    let sets: [&[&str]; 8] = [
        &[],
        &["compact.autocompact.buffer_tokens=5000"],
        &["env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=50"],
        &["compact.autocompact.buffer_tokens=40000", "env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=70"],
        &["ttl_main=1h"],
        &["env.CLAUDE_CODE_AUTO_COMPACT_WINDOW=150000"],
        &["env.ENABLE_TOOL_SEARCH=true"],
        &["env.ENABLE_TOOL_SEARCH=true", "compact.autocompact.buffer_tokens=20000"],
    ];
    let strategies: Vec<_> = sets.iter().map(|s| ctxsim::strategy::Strategy::resolve_with("claude-code", &s.iter().map(|x| x.to_string()).collect::<Vec<_>>()).unwrap()).collect();
    let mut agreed = [0usize; 2];
    for env in [None, Some("false")] {
        if let Some(value) = env {
            prepared.set_env(std::collections::BTreeMap::from([("ENABLE_TOOL_SEARCH".to_owned(), value.to_owned())]), &session).unwrap();
        }
        let effectives: Vec<_> = strategies.iter().map(|s| effective_strategy(s, &prepared)).collect();
        for (i, a) in effectives.iter().enumerate() {
            for (j, b) in effectives.iter().enumerate() {
                let same = family_key(a, &prepared).unwrap() == family_key(b, &prepared).unwrap();
                let mut run = ctxsim::runner::RunState::start(&prepared.workload.scenario, a, ctxsim::runner::RunOptions::default()).unwrap();
                let retargeted = run.retarget_autocompact(b);
                assert_eq!(same, retargeted.is_ok(), "env {env:?}: {:?} → {:?}: family {same}, retarget {retargeted:?}", sets[i], sets[j]);
                agreed[usize::from(same)] += 1;
            }
        }
        // The world's ENABLE_TOOL_SEARCH makes the strategy's own setting no difference.
        let one = family_key(&effectives[0], &prepared) == family_key(&effectives[6], &prepared);
        assert_eq!(one, env.is_some(), "env {env:?}");
    }
    assert!(agreed[0] > 0 && agreed[1] > 0, "both answers occur: {agreed:?}");
}

/// The what-if computes a session's thresholds as the agent does, the workload's env included:
/// `CLAUDE_CODE_AUTO_COMPACT_WINDOW=100000` in the world of a real session (a6e4, 2.0.76: 155,000
/// without it) lowers the threshold the agent checks to 55,000, the what-if's keys follow it (a
/// buffer and an override that meet without the env part with it), and the run compacts earlier.
#[test]
fn an_env_variable_of_the_world_moves_the_what_ifs_threshold_as_the_agents() {
    use ctxsim::replay::agent_whatif::{agent_whatif, effective_strategy, prepare, strategy_key, thresholds_of};
    let session = a6e4();
    let loaded = ctxsim::replay::load_session(Path::new(&session)).unwrap();
    let mut prepared = prepare(&loaded, &session, &crate::support::measurer()).unwrap();
    let strategy = |sets: &[&str]| ctxsim::strategy::Strategy::resolve_with("claude-code", &sets.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    let default = strategy(&[]);
    let (buffer, pct) = (strategy(&["compact.autocompact.buffer_tokens=84000"]), strategy(&["env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=50"]));
    let agents = |prepared: &ctxsim::replay::agent_whatif::Prepared, s: &ctxsim::strategy::Strategy| {
        let effective = effective_strategy(s, prepared);
        let run = ctxsim::runner::RunState::start(&prepared.workload.scenario, &effective, ctxsim::runner::RunOptions::default()).unwrap();
        run.agent().autocompact_threshold_under(&effective, run.world())
    };
    let key = |prepared: &ctxsim::replay::agent_whatif::Prepared, s: &ctxsim::strategy::Strategy| strategy_key(&effective_strategy(s, prepared), prepared);
    assert_eq!(thresholds_of(&effective_strategy(&default, &prepared), &prepared).autocompact, 155_000);
    assert_eq!(key(&prepared, &buffer), key(&prepared, &pct));
    let before = agent_whatif(&loaded, &session, &prepared, &mut crate::support::measurer(), &default).unwrap();

    prepared.set_env(std::collections::BTreeMap::from([("CLAUDE_CODE_AUTO_COMPACT_WINDOW".to_owned(), "100000".to_owned())]), &session).unwrap();
    for s in [&default, &buffer, &pct] {
        assert_eq!(thresholds_of(&effective_strategy(s, &prepared), &prepared).autocompact, agents(&prepared, s));
    }
    // 100,000 − 32,000 reserve = 68,000 effective; less the 13,000 buffer.
    assert_eq!(agents(&prepared, &default), 55_000);
    // The buffer of 84,000 leaves no threshold above 0 now; 50% of 68,000 is 34,000.
    assert_ne!(key(&prepared, &buffer), key(&prepared, &pct));
    let after = agent_whatif(&loaded, &session, &prepared, &mut crate::support::measurer(), &default).unwrap();
    let first = |o: &ctxsim::replay::agent_whatif::AgentOutcome| o.compactions.first().map(|c| c.call);
    assert!(first(&after).unwrap() < first(&before).unwrap(), "{:?} vs {:?}", after.compactions, before.compactions);
    assert!(after.divergence.is_some());
}

/// The presets whose peer mechanism rewrites nothing below a count, autocompact off (codex,
/// cline, server compaction), and MCP instructions as deltas, go on from the run as recorded's
/// trunk up to the first step where they would act otherwise (`peer_branch_of`: a count reaching
/// their trigger, the trunk compacting, MCP instructions to place, ...), or are the trunk to its
/// end: on real sessions, one where they never act
/// (01KZRVZ8) and one where the recording compacts at call 7 (a6e4), each gives exactly what
/// its own run from the first call gives (the oracle): rows (stage reasons included), summary,
/// compactions, divergence, losses, plan runs.
#[test]
fn peer_presets_going_on_from_the_trunk_equal_their_runs_from_the_first_call() {
    use ctxsim::replay::agent_whatif::{agent_whatif, agent_whatif_family, effective_strategy, family_key, peer_branch_of, prepare};
    let numwordify = crate::support::realdata().join("transcripts/NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl").display().to_string();
    let presets = ["codex", "cline", "server-compaction", "claude-code-mcp-delta"];
    let mut diverged = 0;
    for session in [numwordify, a6e4()] {
        let loaded = ctxsim::replay::load_session(Path::new(&session)).unwrap();
        let prepared = prepare(&loaded, &session, &crate::support::measurer()).unwrap();
        let base = effective_strategy(&ctxsim::strategy::Strategy::default(), &prepared);
        let strategies: Vec<_> = presets.iter().map(|p| ctxsim::strategy::Strategy::preset(p).unwrap()).collect();
        // The run as recorded last: the trunk's family is found whatever the order.
        let mut effectives: Vec<_> = strategies.iter().map(|s| effective_strategy(s, &prepared)).collect();
        effectives.push(base.clone());
        for (preset, effective) in presets.iter().zip(&effectives) {
            assert_ne!(family_key(effective, &prepared), family_key(&base, &prepared), "{preset}: another family");
            assert!(peer_branch_of(effective, &base, &prepared).is_some(), "{preset}: a peer branch of the run as recorded");
        }
        let together = agent_whatif_family(&loaded, &session, &prepared, crate::support::measurer(), &effectives).unwrap();
        let as_recorded = agent_whatif(&loaded, &session, &prepared, &mut crate::support::measurer(), &ctxsim::strategy::Strategy::default()).unwrap();
        let mut together = together.into_iter();
        assert_eq!(format!("{:?}", together.next_back().unwrap().unwrap()), format!("{as_recorded:?}"), "{session}: the trunk");
        for ((preset, strategy), together) in presets.iter().zip(&strategies).zip(together) {
            let alone = agent_whatif(&loaded, &session, &prepared, &mut crate::support::measurer(), strategy).unwrap();
            let together = together.unwrap();
            assert_eq!(format!("{together:?}"), format!("{alone:?}"), "{session}: {preset}");
            diverged += usize::from(alone.divergence.is_some());
        }
    }
    // Both cases are met: presets that part from the trunk and presets that never do.
    assert!(diverged > 0 && diverged < 2 * presets.len(), "{diverged}");
    // A preset with no peer mechanism, of another family (every tool schema up front), is no
    // peer branch.
    let loaded = ctxsim::replay::load_session(Path::new(&a6e4())).unwrap();
    let prepared = prepare(&loaded, &a6e4(), &crate::support::measurer()).unwrap();
    let base = effective_strategy(&ctxsim::strategy::Strategy::default(), &prepared);
    let eager = effective_strategy(&ctxsim::strategy::Strategy::preset("claude-code-eager-tools").unwrap(), &prepared);
    assert_ne!(family_key(&eager, &prepared), family_key(&base, &prepared));
    assert!(peer_branch_of(&eager, &base, &prepared).is_none());
}

#[test]
fn a_family_member_that_is_no_peer_branch_of_its_trunk_runs_on_its_own() {
    use ctxsim::replay::agent_whatif::{agent_whatif, agent_whatif_family, effective_strategy, peer_branch_of, prepare};
    let session = a6e4();
    let loaded = ctxsim::replay::load_session(Path::new(&session)).unwrap();
    let prepared = prepare(&loaded, &session, &crate::support::measurer()).unwrap();
    let base = effective_strategy(&ctxsim::strategy::Strategy::default(), &prepared);
    let eager_strategy = ctxsim::strategy::Strategy::preset("claude-code-eager-tools").unwrap();
    let codex_strategy = ctxsim::strategy::Strategy::preset("codex").unwrap();
    let eager = effective_strategy(&eager_strategy, &prepared);
    let codex = effective_strategy(&codex_strategy, &prepared);
    assert!(peer_branch_of(&eager, &base, &prepared).is_none());
    // Given to one family with the run as recorded and a peer branch of it: each outcome is its
    // own run's, none an error.
    let together = agent_whatif_family(&loaded, &session, &prepared, crate::support::measurer(), &[base, eager, codex]).unwrap();
    let strategies = [ctxsim::strategy::Strategy::default(), eager_strategy, codex_strategy];
    assert_eq!(together.len(), strategies.len());
    for (strategy, together) in strategies.iter().zip(together) {
        let alone = agent_whatif(&loaded, &session, &prepared, &mut crate::support::measurer(), strategy).unwrap();
        assert_eq!(format!("{:?}", together.unwrap()), format!("{alone:?}"), "{}", strategy.name);
    }
}

/// `compare --set` weighs each set as `sweep` weighs a parameter: a set that changed no result on
/// a session is reported on stderr and in the JSON (`set_no_effect`), under every strategy or
/// under those named; a set that moved the compaction is not.
#[test]
fn compare_says_when_a_set_changed_no_result_on_a_real_session() {
    let session = a6e4();
    let run = |sets: &[&str]| {
        let mut args = vec!["compare", "--estimator", "chars4", "--format", "json", session.as_str(), "--strategies", "claude-code,no-boundary"];
        for set in sets {
            args.extend(["--set", set]);
        }
        let (stdout, stderr) = ctxsim_ok(&args);
        (serde_json::from_str::<serde_json::Value>(&stdout).unwrap(), stderr)
    };
    // The PCT override only lowers the threshold: 99% of the window is above the 2.0.76 client's
    // own 155,000, so the agent compacts where it did without it. The buffer moves the compaction.
    let (json, stderr) = run(&["env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=99", "compact.autocompact.buffer_tokens=20000"]);
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.starts_with("warning: no effect")).collect();
    assert_eq!(
        warnings,
        ["warning: no effect on a6e4c2a0fbd1-0.full.jsonl: --set env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=99 changed no result"],
        "{stderr}"
    );
    for e in json.as_array().unwrap() {
        assert_eq!(e["set_no_effect"], serde_json::json!(["env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=99"]), "{e}");
        assert_eq!(e["replies_diverge"], true, "the buffer of 20,000 moved the compaction: {e}");
    }
    // A set that gives a strategy the value it has names why.
    let (json, stderr) = run(&["compact.autocompact.buffer_tokens=13000"]);
    assert!(
        stderr.contains("--set compact.autocompact.buffer_tokens=13000 changed no result (the strategies already have this value)"),
        "{stderr}"
    );
    assert!(json.as_array().unwrap().iter().all(|e| e["set_no_effect"] == serde_json::json!(["compact.autocompact.buffer_tokens=13000"])));
    // A set with an effect everywhere: no warning, no field.
    let (json, stderr) = run(&["compact.autocompact.buffer_tokens=20000"]);
    assert!(!stderr.contains("no effect"), "{stderr}");
    assert!(json.as_array().unwrap().iter().all(|e| e.get("set_no_effect").is_none()));
    // A set overridden by a later one of the same key says so; a set the strategy cannot stand
    // without (the snip target must not be above its trigger) is not weighed, and says that.
    let sets = [
        "compact.autocompact.buffer_tokens=20000",
        "compact.autocompact.buffer_tokens=13000",
        "compact.snip.enabled=true",
        "compact.snip.trigger_pct=50",
        "compact.snip.target_pct=40",
    ];
    let (_, stderr) = run(&sets);
    assert!(stderr.contains("--set compact.autocompact.buffer_tokens=20000 changed no result (a later --set gives the same key)"), "{stderr}");
    assert!(!stderr.contains("buffer_tokens=13000 changed no result"), "without it the earlier 20,000 holds: {stderr}");
    assert!(stderr.contains("warning: --set compact.snip.target_pct=40 not weighed under claude-code: without it the strategy is not valid"), "{stderr}");
    assert!(!stderr.contains("target_pct=40 changed no result"), "{stderr}");
}

/// A main lane at 5m beside other lanes at 1h (spotter's subagents wrote at 1h; `ttl_main=5m`
/// named): the compaction fork, written at the other lanes' 1h, sends every marker at 1h, as the
/// client gives a request's markers its query source's TTL. Before, its system markers kept the
/// main lane's 5m ahead of its 1h message marker and the API refused the fork.
#[test]
fn a_compaction_fork_at_1h_beside_a_main_lane_at_5m_is_a_valid_request() {
    let session = crate::support::realdata().join("transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl").display().to_string();
    let (stdout, _) = ctxsim_ok(&["replay", "--estimator", "chars4", "--format", "json", "--no-progress", session.as_str(), "--set", "ttl_main=5m"]);
    let summary: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["api_errors"], 0, "{}", summary["api_errors"]);
    assert_eq!(summary["compactions"]["auto"], 1, "the recorded compaction still fires");
}

/// A stop rule ends a run early without changing what it gave up to there (the audit's presets
/// out of the running, `agent_whatif_family_until`): under any bound, the stopped run's rows are
/// the first rows of the run made to the end, its count past the bound is what the full run had
/// by then, and a bound the full run never passes leaves its outcome as it is — for presets
/// that clear, mask, prune and compact, on sessions with and without a recorded compaction.
#[test]
fn a_stopped_run_is_the_start_of_the_run_made_to_the_end() {
    use ctxsim::replay::agent_whatif::{Stops, agent_whatif_family_until, effective_strategy, prepare};
    use ctxsim::runner::{StopRule, Stopped};
    let dir = crate::support::realdata().join("transcripts");
    let (mut stopped_runs, mut refused_runs) = (0, 0);
    for session in ["entireio-cli/a6e4c2a0fbd1-0.full.jsonl", "entireio-cli/7662d755ef9f-2.full.jsonl"] {
        let path = dir.join(session);
        let file = path.display().to_string();
        let loaded = ctxsim::replay::load_session(&path).unwrap();
        let prepared = prepare(&loaded, &file, &crate::support::measurer()).unwrap();
        for preset in ["context-editing", "observation-masking", "opencode"] {
            let effective = effective_strategy(&ctxsim::strategy::Strategy::preset(preset).unwrap(), &prepared);
            let run = |stop| agent_whatif_family_until(&loaded, &file, &prepared, crate::support::measurer(), std::slice::from_ref(&effective), stop).unwrap().pop().unwrap().unwrap();
            let full = run(Stops::Never);
            assert!(full.stopped.is_none());
            let (dropped, refused) = (full.info_loss.tokens_dropped, full.summary.blocked);
            for rule in [
                StopRule { tokens_dropped_above: 0, refused_above: u64::MAX },
                StopRule { tokens_dropped_above: dropped / 2, refused_above: u64::MAX },
                StopRule { tokens_dropped_above: dropped, refused_above: refused },
                StopRule { tokens_dropped_above: u64::MAX, refused_above: 0 },
            ] {
                let what = format!("{session} {preset} {rule:?}");
                let stopped = run(Stops::Rule(rule));
                match stopped.stopped {
                    None => {
                        assert!(dropped <= rule.tokens_dropped_above && refused <= rule.refused_above, "{what}: not stopped");
                        assert_eq!(format!("{:?}", stopped.rows), format!("{:?}", full.rows), "{what}");
                        assert_eq!(stopped.summary, full.summary, "{what}");
                    }
                    Some((call, why)) => {
                        assert!(stopped.rows.len() <= full.rows.len(), "{what}");
                        assert_eq!(format!("{:?}", stopped.rows), format!("{:?}", &full.rows[..stopped.rows.len()]), "{what}: not the start of the full run");
                        match why {
                            Stopped::TokensDropped { dropped: at, above } => {
                                assert!(above == rule.tokens_dropped_above && at > above && at <= dropped && at == stopped.info_loss.tokens_dropped, "{what}: {why:?}");
                                stopped_runs += 1;
                            }
                            Stopped::Refused { refused: at, above } => {
                                assert!(above == rule.refused_above && at > above && at <= refused && at == stopped.summary.blocked, "{what}: {why:?}");
                                refused_runs += 1;
                            }
                        }
                        assert!(full.rows.iter().any(|r| r.lane == "main"), "{what}");
                        assert!(call > 0, "{what}: stopped at call {call}");
                    }
                }
            }
        }
    }
    assert!(stopped_runs >= 4 && refused_runs >= 1, "{stopped_runs} stopped on tokens, {refused_runs} on refusals");
}

/// Issue 15: a knob with nothing to act on in a session shares the run as recorded's run in the
/// audit (`idle_knobs_cleared`): leaving out the recorded microcompacts where the recording holds
/// none makes the same run (every row, the summary, the compactions, the divergence), and where
/// it holds one the key stays apart (7662 has one; the audit prices that preset there).
#[test]
fn a_knob_with_nothing_to_act_on_makes_the_run_as_recorded() {
    use ctxsim::replay::agent_whatif::{agent_whatif, effective_strategy, idle_knobs_cleared, prepare, strategy_key};
    use ctxsim::strategy::Strategy;
    let dir = crate::support::realdata().join("transcripts");
    for (session, idle) in [("entireio-cli/a6e4c2a0fbd1-0.full.jsonl", true), ("cipher-box/af1dd25ebb3e-8.full.jsonl", true), ("entireio-cli/7662d755ef9f-2.full.jsonl", false)] {
        let path = dir.join(session);
        let file = path.display().to_string();
        let loaded = ctxsim::replay::load_session(&path).unwrap();
        let mut measurer = crate::support::measurer();
        let prepared = prepare(&loaded, &file, &measurer).unwrap();
        let base = effective_strategy(&Strategy::default(), &prepared);
        // A strategy with no idle knob is handed back as it is (the audit takes its own key as
        // its run key then).
        assert!(matches!(idle_knobs_cleared(&base, &prepared), std::borrow::Cow::Borrowed(b) if std::ptr::eq(b, &base)), "{session}");
        for preset in ["claude-code-no-microcompact", "claude-code-summary-only"] {
            let effective = effective_strategy(&Strategy::preset(preset).unwrap(), &prepared);
            let what = format!("{session} {preset}");
            // Only a knob cleared makes a copy (both presets leave the recorded microcompacts
            // out).
            let cleared = !effective.replay_recorded_microcompact && idle;
            assert_eq!(matches!(idle_knobs_cleared(&effective, &prepared), std::borrow::Cow::Owned(_)), cleared, "{what}");
            assert_ne!(strategy_key(&effective, &prepared), strategy_key(&base, &prepared), "{what}: its own settings differ");
            let shared = strategy_key(&idle_knobs_cleared(&effective, &prepared), &prepared) == strategy_key(&idle_knobs_cleared(&base, &prepared), &prepared);
            assert_eq!(shared, idle, "{what}");
            if !idle {
                continue;
            }
            let (own, as_recorded) = (agent_whatif(&loaded, &file, &prepared, &mut measurer, &Strategy::preset(preset).unwrap()).unwrap(), agent_whatif(&loaded, &file, &prepared, &mut measurer, &Strategy::default()).unwrap());
            assert_eq!(format!("{:?}", own.rows), format!("{:?}", as_recorded.rows), "{what}");
            assert_eq!(own.summary, as_recorded.summary, "{what}");
            assert_eq!(own.compactions, as_recorded.compactions, "{what}");
            assert_eq!(own.divergence, as_recorded.divergence, "{what}");
        }
    }
}

/// The peer branches of a family's trunk that stop beyond the trunk's own run
/// (`Stops::BeyondRunOf`, the audit's presets that go on from the run as recorded): each stopped
/// branch is the start of the same branch made to the end, stopped at its first step past the
/// trunk's totals; the trunk and every unbounded branch give what they give unstopped.
#[test]
fn a_branch_stopped_beyond_the_trunk_is_the_start_of_the_branch_made_to_the_end() {
    use ctxsim::replay::agent_whatif::{Stops, agent_whatif_family_until, effective_strategy, prepare, stop_rule_beyond};
    let dir = crate::support::realdata().join("transcripts");
    let mut stopped_branches = 0;
    for session in ["entireio-cli/a6e4c2a0fbd1-0.full.jsonl", "entireio-cli/7662d755ef9f-2.full.jsonl"] {
        let path = dir.join(session);
        let file = path.display().to_string();
        let loaded = ctxsim::replay::load_session(&path).unwrap();
        let prepared = prepare(&loaded, &file, &crate::support::measurer()).unwrap();
        let mut autocompact = ctxsim::strategy::Strategy::default();
        autocompact.compact.autocompact.pct_override = Some(50);
        let strategies: Vec<ctxsim::strategy::Strategy> = [ctxsim::strategy::Strategy::default(), ctxsim::strategy::Strategy::preset("codex").unwrap(), autocompact, ctxsim::strategy::Strategy::preset("cline").unwrap()]
            .iter()
            .map(|s| effective_strategy(s, &prepared))
            .collect();
        let bounded = [false, true, false, true];
        let run = |stop| agent_whatif_family_until(&loaded, &file, &prepared, crate::support::measurer(), &strategies, stop).unwrap().into_iter().map(Result::unwrap).collect::<Vec<_>>();
        let full = run(Stops::Never);
        let ended = run(Stops::BeyondRunOf { base: 0, bounded: &bounded });
        let rule = stop_rule_beyond(&full[0]);
        for (i, (full, ended)) in full.iter().zip(&ended).enumerate() {
            let what = format!("{session} strategy {i}");
            let past = full.info_loss.tokens_dropped > rule.tokens_dropped_above || full.summary.blocked > rule.refused_above;
            if !bounded[i] || !past {
                assert!(ended.stopped.is_none(), "{what}");
                assert_eq!(format!("{:?}", ended.rows), format!("{:?}", full.rows), "{what}");
                assert_eq!(ended.summary, full.summary, "{what}");
                continue;
            }
            let (call, why) = ended.stopped.unwrap_or_else(|| panic!("{what}: not stopped"));
            // (A refused request adds no row: a branch stopped at its first refusal may hold
            // every row of the full one.)
            assert!(ended.rows.len() <= full.rows.len() && call > 0, "{what}: {} rows of {}, call {call}, {why:?}", ended.rows.len(), full.rows.len());
            assert_eq!(format!("{:?}", ended.rows), format!("{:?}", &full.rows[..ended.rows.len()]), "{what}: not the start of the full branch");
            match why {
                ctxsim::runner::Stopped::Refused { refused, above } => {
                    assert!(above == rule.refused_above && refused == above + 1 && refused == ended.summary.blocked && refused <= full.summary.blocked, "{what}: {why:?}");
                }
                ctxsim::runner::Stopped::TokensDropped { dropped, above } => {
                    assert!(above == rule.tokens_dropped_above && dropped > above && dropped == ended.info_loss.tokens_dropped && dropped <= full.info_loss.tokens_dropped, "{what}: {why:?}");
                }
            }
            stopped_branches += 1;
        }
    }
    assert!(stopped_branches >= 2, "{stopped_branches}");
}

/// Issue 15: a what-if that parts from the recording settles in one run that switches plans as
/// it goes (`agent_whatif::Follow`) where the plan search took two runs (a6e4 under these
/// presets, each parting from the recording) or three (cd95 under context editing): each reports
/// one run, parts from the recording, and — debug builds compare in `settle` — is the run the
/// search settles on (rows, summary, compactions, divergence, losses). Alone and as a family
/// (one of a single strategy runs from the first call, without a trunk) it is the same.
#[test]
fn a_what_if_that_parts_from_the_recording_settles_in_one_run() {
    use ctxsim::replay::agent_whatif::{agent_whatif, agent_whatif_family, effective_strategy, prepare};
    let cd95 = crate::support::realdata().join("transcripts/entireio-cli/cd95adddad32-0.full.jsonl").display().to_string();
    for (session, presets) in [(a6e4(), &["opencode", "observation-masking", "context-editing"][..]), (cd95, &["context-editing"][..])] {
        let loaded = ctxsim::replay::load_session(Path::new(&session)).unwrap();
        let prepared = prepare(&loaded, &session, &crate::support::measurer()).unwrap();
        for preset in presets {
            let strategy = ctxsim::strategy::Strategy::preset(preset).unwrap();
            let alone = agent_whatif(&loaded, &session, &prepared, &mut crate::support::measurer(), &strategy).unwrap();
            assert_eq!(alone.runs, 1, "{session}: {preset}");
            assert!(alone.divergence.is_some(), "{session}: {preset} parts from the recording");
            let effective = effective_strategy(&strategy, &prepared);
            let mut family = agent_whatif_family(&loaded, &session, &prepared, crate::support::measurer(), &[effective]).unwrap();
            assert_eq!(format!("{:?}", family.pop().unwrap().unwrap()), format!("{alone:?}"), "{session}: {preset}");
        }
    }
}

/// The other main-lane TTL measured beside the trunk (`mirror_of`: every request of the trunk's
/// run measured again on a measurer of its own, the main requests' markers at its TTL) gives
/// exactly what its own run from the first call gives: rows, summary, compactions, divergence,
/// losses, plan runs; on sessions recorded at 1h (the mirror at 5m) and at 5m (at 1h).
#[test]
fn a_main_lane_ttl_measured_beside_the_trunk_equals_its_own_run() {
    use ctxsim::replay::agent_whatif::{agent_whatif, agent_whatif_family, effective_strategy, mirror_of, prepare};
    let numwordify = crate::support::realdata().join("transcripts/NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl").display().to_string();
    let mut mirrored_runs = 0;
    for session in [a6e4(), numwordify] {
        let loaded = ctxsim::replay::load_session(Path::new(&session)).unwrap();
        let prepared = prepare(&loaded, &session, &crate::support::measurer()).unwrap();
        let base = effective_strategy(&ctxsim::strategy::Strategy::default(), &prepared);
        for ttl in [ctxsim::api::CacheTtl::FiveMinutes, ctxsim::api::CacheTtl::OneHour] {
            let mut other = base.clone();
            other.ttl_main = ttl.into();
            // (The recorded TTL is the run as recorded's own.)
            let Some(_) = mirror_of(&other, &base, &prepared) else { continue };
            mirrored_runs += 1;
            // (A measurer that hashes bodies measures no mirror: the audit's does not.)
            let measurer = || crate::support::measurer().without_body_hashes();
            let together = agent_whatif_family(&loaded, &session, &prepared, measurer(), &[base.clone(), other.clone()]).unwrap();
            let mirrored = together.into_iter().nth(1).unwrap().unwrap();
            let alone = agent_whatif(&loaded, &session, &prepared, &mut measurer(), &other).unwrap();
            for (i, (a, b)) in mirrored.rows.iter().zip(&alone.rows).enumerate() {
                assert_eq!(format!("{a:?}"), format!("{b:?}"), "{session}: row {i}");
            }
            assert_eq!(format!("{mirrored:?}"), format!("{alone:?}"), "{session}: {ttl:?}");
        }
    }
    assert_eq!(mirrored_runs, 2);
}

/// `other` run in a family with the trunk `base` (run to the end, and bounded beyond the trunk
/// as the audit bounds a preset) gives exactly its own run's outcome: `alone` from the first
/// call, or bounded, its own run under the trunk's rule (rows first, one by one); measured
/// beside the trunk `beside` times (1: a mirror, 0: on its own), and not the trunk's rows.
fn beside_the_trunk_is_its_own_run(
    loaded: &ctxsim::recording::ImportedSession,
    file: &str,
    prepared: &ctxsim::replay::agent_whatif::Prepared,
    (base, other): (&ctxsim::strategy::Strategy, &ctxsim::strategy::Strategy),
    alone: &ctxsim::replay::agent_whatif::AgentOutcome,
    beside: usize,
    session: &str,
) {
    use ctxsim::replay::agent_whatif::{Stops, agent_whatif_family_until, mirrored_outcomes, stop_rule_beyond};
    // (A measurer that hashes bodies measures no mirror: the audit's does not.)
    let measurer = || crate::support::measurer().without_body_hashes();
    for (bounded, stop) in [(false, Stops::Never), (true, Stops::BeyondRunOf { base: 0, bounded: &[false, true] })] {
        let before = mirrored_outcomes();
        let together = agent_whatif_family_until(loaded, file, prepared, measurer(), &[base.clone(), other.clone()], stop).unwrap();
        assert_eq!(mirrored_outcomes(), before + beside, "{session}: measured beside the trunk {beside} times");
        let mut together = together.into_iter().map(Result::unwrap);
        let (trunk, mirrored) = (together.next().unwrap(), together.next().unwrap());
        let own = match bounded {
            false => alone.clone(),
            true => agent_whatif_family_until(loaded, file, prepared, measurer(), std::slice::from_ref(other), Stops::Rule(stop_rule_beyond(&trunk))).unwrap().pop().unwrap().unwrap(),
        };
        for (i, (a, b)) in mirrored.rows.iter().zip(&own.rows).enumerate() {
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "{session}: row {i}");
        }
        assert_eq!(format!("{mirrored:?}"), format!("{own:?}"), "{session}: bounded {bounded}");
        // What the strategy changes changed what was measured: not the trunk's rows.
        assert_ne!(format!("{:?}", mirrored.rows), format!("{:?}", trunk.rows), "{session}");
    }
}

/// The main thread's system prompt without the dynamic boundary measured beside the trunk
/// (`mirror_of`: every main request and main-thread fork laid out again in mode C and measured
/// on a measurer of its own, the other lanes' as sent) gives exactly what the preset's own run
/// from the first call gives: rows, summary, compactions, divergence, losses, plan runs; and,
/// bounded beyond the trunk as the audit bounds a preset, what its own run under that rule
/// gives. On sessions with a recorded compaction (its fork mirrored too), one recorded at 1h (the
/// fork's system markers retimed) and one without.
#[test]
fn the_system_prompt_without_the_boundary_measured_beside_the_trunk_equals_its_own_run() {
    use ctxsim::replay::agent_whatif::{agent_whatif, effective_strategy, mirror_of, prepare};
    let dir = crate::support::realdata().join("transcripts");
    for session in ["entireio-cli/a6e4c2a0fbd1-0.full.jsonl", "spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl", "NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl"] {
        let path = dir.join(session);
        let file = path.display().to_string();
        let loaded = ctxsim::replay::load_session(&path).unwrap();
        let prepared = prepare(&loaded, &file, &crate::support::measurer()).unwrap();
        let preset = ctxsim::strategy::Strategy::preset("claude-code-no-boundary").unwrap();
        let (base, other) = (effective_strategy(&ctxsim::strategy::Strategy::default(), &prepared), effective_strategy(&preset, &prepared));
        let of = mirror_of(&other, &base, &prepared).unwrap_or_else(|| panic!("{session}: no mirror"));
        assert!(of.without_boundary && of.ttl == of.run_ttl, "{session}: {of:?}");
        // (A measurer that hashes bodies measures no mirror: the audit's does not.)
        let measurer = || crate::support::measurer().without_body_hashes();
        let alone = agent_whatif(&loaded, &file, &prepared, &mut measurer(), &preset).unwrap();
        beside_the_trunk_is_its_own_run(&loaded, &file, &prepared, (&base, &other), &alone, 1, session);
    }
}

/// Every tool's schema sent up front (`claude-code-eager-tools`: `ENABLE_TOOL_SEARCH=false`)
/// measured beside the run as recorded, which defers tools (`mirror_of`: each request that
/// defers tools sent with the pool assembled without tool search and without the listing of
/// the deferred tools, flattened on a measurer of its own) gives exactly what the preset's own
/// run from the first call gives: rows, summary, compactions, divergence, losses, plan runs;
/// and, bounded beyond the trunk as the audit bounds a preset, what its own run under that rule
/// gives. On real sessions: one with a recorded compaction (its fork mirrored too), one whose
/// ToolSearch calls are answered by their recorded outputs (no tool loaded under either). Where
/// the trunk announces the deferred tools as `deferred_tools_delta` attachments (another
/// history than the preset's), it is no mirror and runs on its own, with the same outcome.
#[test]
fn every_tool_sent_up_front_measured_beside_the_trunk_equals_its_own_run() {
    use ctxsim::replay::agent_whatif::{Stops, agent_whatif_family_until, effective_strategy, mirror_of, prepare};
    let dir = crate::support::realdata().join("transcripts");
    let preset = ctxsim::strategy::Strategy::preset("claude-code-eager-tools").unwrap();
    let cases = [("entireio-cli/a6e4c2a0fbd1-0.full.jsonl", true), ("entireio-cli/9878b713483d-0.full.jsonl", true), ("NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl", true), ("entireio-cli/a6e4c2a0fbd1-0.full.jsonl", false)];
    for (session, mirrored) in cases {
        let path = dir.join(session);
        let file = path.display().to_string();
        let loaded = ctxsim::replay::load_session(&path).unwrap();
        let prepared = prepare(&loaded, &file, &crate::support::measurer()).unwrap();
        let (mut base, mut other) = (ctxsim::strategy::Strategy::default(), preset.clone());
        if !mirrored {
            base.deferred_tools_delta = true;
            other.deferred_tools_delta = true;
        }
        let (base, other) = (effective_strategy(&base, &prepared), effective_strategy(&other, &prepared));
        let of = mirror_of(&other, &base, &prepared);
        assert_eq!(of.is_some_and(|of| of.tools_up_front && !of.without_boundary && of.ttl == of.run_ttl), mirrored, "{session}: {of:?}");
        // (A measurer that hashes bodies measures no mirror: the audit's does not.)
        let measurer = || crate::support::measurer().without_body_hashes();
        let alone = agent_whatif_family_until(&loaded, &file, &prepared, measurer(), std::slice::from_ref(&other), Stops::Never).unwrap().pop().unwrap().unwrap();
        beside_the_trunk_is_its_own_run(&loaded, &file, &prepared, (&base, &other), &alone, usize::from(mirrored), session);
        // (9878 compacts: its compaction fork defers tools and was measured beside the trunk too.)
        assert!(!session.contains("9878") || !alone.compactions.is_empty(), "{session}: no compaction");
    }
}

/// The presets whose peer mechanism acts on more than a count (opencode's prune and summary,
/// observation masking), autocompact off, go on from the run as recorded's trunk too: the trunk
/// runs their mechanism dry on its requests (`PeerState::dry_run`) and they go on from the last
/// checkpoint before the first step where it would rewrite anything or anything else would act
/// otherwise (`peer_branch_of`), their reports on the trunk's rows before it added. On real
/// sessions where opencode never acts (01KZRVZ8), acts at the blocking limit or by its own
/// mechanism, each gives exactly what its own run from the first call gives (rows and their
/// stage reports, summary, compactions, divergence, losses, plan runs), run to the end and
/// bounded beyond the trunk as the audit bounds a preset; and opencode went on from its trunk.
#[test]
fn presets_whose_peer_acts_on_more_than_a_count_going_on_from_the_trunk_equal_their_own_runs() {
    let presets = ["opencode", "observation-masking"];
    let mut mechanism_acted = 0;
    for session in ["NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl", "entireio-cli/a6e4c2a0fbd1-0.full.jsonl", "entireio-cli/7662d755ef9f-2.full.jsonl"] {
        let (file, loaded, prepared) = prepared_transcript(session);
        for own in peer_presets_equal_their_own_runs(session, (&file, &loaded, &prepared), &presets, ctxsim::replay::agent_whatif::peer_branch_runs, "no preset went on from the trunk") {
            let stage = |name: &str| own.rows.iter().any(|r| r.stages.iter().any(|s| s.name == name && s.fired));
            mechanism_acted += usize::from(stage("opencode_prune") || stage("opencode_summary") || stage("observation_masking"));
        }
    }
    // The mechanisms acted somewhere (their branch points found by the dry run).
    assert!(mechanism_acted > 0);
}

/// A user's `/compact` is done the same way under a peer mechanism with autocompact off: the
/// presets that go on from the run as recorded's trunk (`peer_branch_of`) stay with it through
/// the recorded manual compactions (`Step::Compact`) rather than going on from the checkpoint
/// before each to the session's end. On the shared sessions with manual compactions (01M0EE57,
/// two; c644f3af, one), each gives exactly what its own run from the first call gives, run to
/// the end and bounded beyond the trunk as the audit bounds a preset; and they went on with the
/// trunk through a `/compact` (debug builds also run each through the step on its own and
/// compare the run states).
#[test]
fn peer_presets_go_on_with_the_trunk_through_a_users_compact() {
    let presets = ["codex", "opencode", "observation-masking", "cline", "server-compaction"];
    for session in ["entirecontext/01M0EE5721NRN8FGE1238MD50T-0.full.jsonl", "cipher-box/c644f3afc869-1.full.jsonl"] {
        let (file, loaded, prepared) = prepared_transcript(session);
        let through = ctxsim::replay::agent_whatif::peer_branches_through_compact;
        peer_presets_equal_their_own_runs(session, (&file, &loaded, &prepared), &presets, through, "no preset went on with the trunk through a /compact");
    }
}

/// Each of `presets`, a peer branch of the run as recorded (`peer_branch_of`), run in one family
/// with it, to the end and bounded beyond it as the audit bounds a preset, gives exactly what its
/// own run from the first call gives (rows, then the whole outcome). `went_on` is a thread's
/// count of what the family must have done in each family run (`what`, the failure otherwise).
/// Returns the presets' own runs, to the end and bounded.
fn peer_presets_equal_their_own_runs(
    session: &str,
    (file, loaded, prepared): (&str, &ctxsim::recording::ImportedSession, &ctxsim::replay::agent_whatif::Prepared),
    presets: &[&str],
    went_on: fn() -> usize,
    what: &str,
) -> Vec<ctxsim::replay::agent_whatif::AgentOutcome> {
    use ctxsim::replay::agent_whatif::{Stops, agent_whatif_family_until, effective_strategy, peer_branch_of, stop_rule_beyond};
    let base = effective_strategy(&ctxsim::strategy::Strategy::default(), prepared);
    let mut effectives = vec![base.clone()];
    effectives.extend(presets.iter().map(|p| effective_strategy(&ctxsim::strategy::Strategy::preset(p).unwrap(), prepared)));
    for (preset, effective) in presets.iter().zip(&effectives[1..]) {
        assert!(peer_branch_of(effective, &base, prepared).is_some(), "{session}: {preset}: a peer branch of the run as recorded");
    }
    let mut owns = Vec::new();
    for bounded in [false, true] {
        let marks: Vec<bool> = (0..effectives.len()).map(|i| i > 0).collect();
        let stop = if bounded { Stops::BeyondRunOf { base: 0, bounded: &marks } } else { Stops::Never };
        let before = went_on();
        let together: Vec<_> = agent_whatif_family_until(loaded, file, prepared, crate::support::measurer(), &effectives, stop).unwrap().into_iter().map(Result::unwrap).collect();
        assert!(went_on() > before, "{session}: bounded {bounded}: {what}");
        let rule = stop_rule_beyond(&together[0]);
        for ((preset, effective), branched) in presets.iter().zip(&effectives[1..]).zip(&together[1..]) {
            let stop = if bounded { Stops::Rule(rule) } else { Stops::Never };
            let own = agent_whatif_family_until(loaded, file, prepared, crate::support::measurer(), std::slice::from_ref(effective), stop).unwrap().pop().unwrap().unwrap();
            for (i, (a, b)) in branched.rows.iter().zip(&own.rows).enumerate() {
                assert_eq!(format!("{a:?}"), format!("{b:?}"), "{session}: {preset}: bounded {bounded}: row {i}");
            }
            assert_eq!(format!("{branched:?}"), format!("{own:?}"), "{session}: {preset}: bounded {bounded}");
            owns.push(own);
        }
    }
    owns
}

/// Server-side tool-use clearing (`context-editing`: `clear_tool_uses` with its 100,000-token
/// trigger) goes on from the run as recorded's trunk too (`peer_branch_of`,
/// `PeerBranch::ContextEditing`): below the trigger the server clears nothing and the runs make
/// the same requests but for the body's `context_management`, so it goes on from the last
/// checkpoint before the first step where a request or the chain's count reaches the trigger,
/// its microcompact stage's reports on the trunk's rows before it rewritten (the stage runs and
/// finds no trigger where the trunk's is disabled). On a session whose context never reaches the
/// trigger (01KZRVZ8: the trunk to its end) and one that reaches it after a checkpoint
/// (c644f3af), it gives exactly what its own run from the first call gives, run to the end and
/// bounded beyond the trunk as the audit bounds a preset; and it went on from the trunk.
#[test]
fn server_side_tool_use_clearing_going_on_from_the_trunk_equals_its_own_run() {
    use ctxsim::replay::agent_whatif::{PeerBranch, Stops, agent_whatif_family_until, effective_strategy, peer_branch_of, peer_branch_runs, stop_rule_beyond};
    let mut cleared = 0;
    for session in ["NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl", "cipher-box/c644f3afc869-1.full.jsonl"] {
        let (file, loaded, prepared) = prepared_transcript(session);
        let base = effective_strategy(&ctxsim::strategy::Strategy::default(), &prepared);
        let preset = effective_strategy(&ctxsim::strategy::Strategy::preset("context-editing").unwrap(), &prepared);
        assert!(matches!(peer_branch_of(&preset, &base, &prepared), Some(PeerBranch::ContextEditing { trigger: 100_000 })), "{session}: a branch of the run as recorded");
        // (A measurer that hashes bodies runs it on its own: the audit's does not.)
        let measurer = || crate::support::measurer().without_body_hashes();
        let effectives = [base.clone(), preset.clone()];
        for bounded in [false, true] {
            let stop = if bounded { Stops::BeyondRunOf { base: 0, bounded: &[false, true] } } else { Stops::Never };
            let before = peer_branch_runs();
            let together: Vec<_> = agent_whatif_family_until(&loaded, &file, &prepared, measurer(), &effectives, stop).unwrap().into_iter().map(Result::unwrap).collect();
            assert!(peer_branch_runs() > before, "{session}: bounded {bounded}: it did not go on from the trunk");
            let stop = if bounded { Stops::Rule(stop_rule_beyond(&together[0])) } else { Stops::Never };
            let own = agent_whatif_family_until(&loaded, &file, &prepared, measurer(), std::slice::from_ref(&preset), stop).unwrap().pop().unwrap().unwrap();
            let branched = &together[1];
            for (i, (a, b)) in branched.rows.iter().zip(&own.rows).enumerate() {
                assert_eq!(format!("{a:?}"), format!("{b:?}"), "{session}: bounded {bounded}: row {i}");
            }
            assert_eq!(format!("{branched:?}"), format!("{own:?}"), "{session}: bounded {bounded}");
            // The stage ran where the trunk's did not: not the trunk's rows.
            assert_ne!(format!("{:?}", branched.rows), format!("{:?}", together[0].rows), "{session}");
            cleared += usize::from(own.rows.iter().any(|r| r.context_management.as_ref().is_some_and(|cm| !cm.cleared_tool_use_ids.is_empty())));
        }
    }
    // The server cleared tool uses somewhere (after the branch point).
    assert!(cleared > 0);
}

/// A shared transcript (its path under `realdata/transcripts`) loaded and prepared for what-ifs:
/// its file name, the session and what every strategy's run starts from.
fn prepared_transcript(session: &str) -> (String, ctxsim::recording::ImportedSession, ctxsim::replay::agent_whatif::Prepared) {
    let path = crate::support::realdata().join("transcripts").join(session);
    let file = path.display().to_string();
    let loaded = ctxsim::replay::load_session(&path).unwrap();
    let prepared = ctxsim::replay::agent_whatif::prepare(&loaded, &file, &crate::support::measurer()).unwrap();
    (file, loaded, prepared)
}
