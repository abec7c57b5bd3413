//! A recorded session drives the agent (issue 13, "one model of the client"): the workload
//! built from every shared transcript loads as a scenario, the agent answers every recorded main
//! call, what it leaves to the agent is counted, and the CLI paths (`import --to scenario`, `run`
//! on the result, `fidelity --engine agent`) work end to end.

use std::collections::BTreeMap;

use ctxsim::measure::{Calibration, EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::recording::format::LANE_MAIN;
use ctxsim::replay::load_session;
use ctxsim::replay::workload::{agent_replay, workload_from_session};
use ctxsim::scenario::Step;
use ctxsim::strategy::Strategy;

use crate::support::{real_transcripts, realdata};

fn measurer() -> Measurer {
    Measurer::new(ModelTable::shipped(), TokenCounter::with_calibration(EstimatorKind::Calibrated, Calibration::shipped())).without_body_hashes()
}

/// A shared transcript (`dir/file` under `transcripts/`) and the agent driven through it as
/// recorded under the default strategy.
fn drive(name: &str) -> (ctxsim::recording::ImportedSession, ctxsim::replay::workload::AgentReplay) {
    let path = realdata().join("transcripts").join(name);
    let session = load_session(&path).unwrap();
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let driven = agent_replay(&session, &path.display().to_string(), &mut measurer(), &strategy).unwrap();
    (session, driven)
}

fn ctxsim(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap()
}

/// Every shared transcript becomes a scenario whose main replies are the recorded main calls
/// (synthetic and failed calls aside), in order, each tool result bound to a call of the script.
#[test]
fn every_shared_transcript_becomes_a_workload_of_its_main_calls() {
    let files = real_transcripts();
    assert_eq!(files.len(), 16, "the shared transcripts");
    for path in files {
        let session = load_session(&path).unwrap();
        let workload = workload_from_session(&session, &path.display().to_string(), None).unwrap();
        let replies: Vec<&Step> = workload.scenario.script.iter().filter(|s| matches!(s, Step::Assistant(a) if a.lane == LANE_MAIN)).collect();
        assert_eq!(replies.len(), workload.main_calls.len(), "{}", path.display());
        assert_eq!(replies.len(), workload.report.main_replies, "{}", path.display());
        // The recorded calls, in order, and only main-lane calls that reached the API.
        let by_index: BTreeMap<usize, _> = session.calls.iter().map(|c| (c.index, c)).collect();
        assert!(workload.main_calls.windows(2).all(|w| w[0] < w[1]), "{}", path.display());
        for index in &workload.main_calls {
            let call = by_index[index];
            assert_eq!(call.lane, LANE_MAIN);
            assert!(!call.is_synthetic && !call.is_api_error, "{}: call {index}", path.display());
        }
        // Each recorded reply's tool calls keep their ids, and every output answers one of them
        // (a driven subagent's replies and outputs included, tests/it/workload_subagents.rs).
        let called: std::collections::BTreeSet<&str> = workload
            .scenario
            .script
            .iter()
            .flat_map(|s| match s {
                Step::Assistant(a) => a.tool_uses().map(|(id, _)| id).collect::<Vec<_>>(),
                _ => Vec::new(),
            })
            .collect();
        let outputs: Vec<&str> = workload
            .scenario
            .script
            .iter()
            .flat_map(|s| match s {
                Step::ToolOutput(outputs) => outputs.iter().map(|o| o.tool_use_id.as_str()).collect::<Vec<_>>(),
                _ => Vec::new(),
            })
            .collect();
        // Recorded results (the driven subagents' too), and stand-ins for the ones a compaction
        // replaced unwritten.
        let subagent_outputs: usize = workload.report.subagents.iter().map(|r| r.tool_outputs).sum();
        assert_eq!(outputs.len(), workload.report.tool_outputs + subagent_outputs + workload.report.unwritten_results, "{}", path.display());
        assert!(outputs.iter().all(|id| called.contains(id)), "{}", path.display());
        assert!(workload.report.user_prompts > 0, "{}", path.display());
        // Read from its document directly, the scenario is the one its text gives.
        let file = path.display().to_string();
        let text = serde_json::to_string(&workload.document).unwrap();
        assert!(workload.scenario == ctxsim::scenario::parse_scenario(&text, &file).unwrap(), "{file}");
        // As `import --to scenario` writes it (YAML: file contents and code as block scalars,
        // JSON in quoted ones), the scenario loads, the same one: no text inside a scalar counts
        // as nesting (af1d's and d847's were refused as "nested 65 levels deep").
        let yaml = serde_norway::to_string(&workload.document).unwrap();
        let loaded = ctxsim::scenario::parse_scenario(&yaml, &file).unwrap_or_else(|e| panic!("{e}"));
        assert!(workload.scenario == loaded, "{file}");
        // A document the direct reading refuses gives the text's error, lines and all.
        let mut bad = workload.document.clone();
        bad["script"][0]["user"] = serde_json::json!({ "not": "a prompt" });
        let direct = ctxsim::scenario::parse_scenario_document(&bad, &file).unwrap_err().to_string();
        assert_eq!(direct, ctxsim::scenario::parse_scenario(&serde_json::to_string(&bad).unwrap(), &file).unwrap_err().to_string());
        assert!(direct.contains(":1:"), "{direct}");
    }
}

/// The agent, driven by a recorded session, answers every recorded main call with one request,
/// and the sizes it does not model are filled to the replay's: its first request is the
/// recorded first call's size within a few percent.
#[test]
fn the_agent_answers_every_recorded_main_call_of_a_session() {
    let (_, driven) = drive("entireio-cli/7be20d70c73b-0.full.jsonl");
    assert_eq!(driven.unpaired, 0);
    assert_eq!(driven.replay.calls.len(), driven.report.main_replies);
    assert!(driven.sizing.system_filler_tokens > 0 && driven.sizing.claude_md_filler_tokens > 0, "{:?}", driven.sizing);
    let first = &driven.replay.calls[0];
    let (simulated, recorded) = (first.simulated_context() as f64, first.recorded_context() as f64);
    assert!((simulated - recorded).abs() / recorded < 0.05, "first call: agent {simulated} vs recorded {recorded}");
    // The recorded compaction's summary is the agent's, where it compacts.
    assert_eq!(driven.report.compaction_summaries, 1);
    assert_eq!(driven.compactions.len(), 1, "{:?}", driven.compactions);
}

/// `import --to scenario` writes a scenario `run` accepts; `fidelity --engine agent` reports the
/// workload and the agent's compactions.
#[test]
fn import_to_scenario_then_run_and_fidelity_through_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let transcript = "../shared/realdata/transcripts/oh-my-posh/eea3a34195eb-0.full.jsonl";
    let scenario = dir.path().join("session.yaml");
    let out = ctxsim(&["import", transcript, "--to", "scenario", "-o", scenario.to_str().unwrap(), "--quiet"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = ctxsim(&["run", scenario.to_str().unwrap(), "--format", "json"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let summary = if summary.is_array() { summary[0].clone() } else { summary };
    assert!(summary["requests"].as_u64().unwrap() >= 94, "{summary}");

    let fidelity = ctxsim(&["fidelity", transcript, "--engine", "agent", "--format", "json"]);
    assert!(fidelity.status.success(), "{}", String::from_utf8_lossy(&fidelity.stderr));
    let report: serde_json::Value = serde_json::from_slice(&fidelity.stdout).unwrap();
    assert_eq!(report["requests_compared"], 94);
    assert_eq!(report["agent"]["workload"]["main_replies"], 94);
    assert_eq!(report["agent"]["unpaired"], 0);
    // Unstored thinking filled to the replay's fitted estimate (12.1% at four characters per
    // output token).
    assert!(report["context_tokens_mape"].as_f64().unwrap() < 0.08, "{}", report["context_tokens_mape"]);
}

/// `compact: true` is `/compact`: the agent compacts at that point (trigger `manual`) through the
/// compaction fork on its own lane, and the next request starts from the summary.
#[test]
fn a_compact_step_compacts_there_with_trigger_manual() {
    let out = crate::support::run_yaml(
        r#"
name: manual-compact
world:
  model: claude-sonnet-4-6
script:
  - user: "Read the notes."
  - assistant:
      - text: "The notes say to ship on Friday."
  - compact: true
  - user: "And after that?"
  - assistant:
      - text: "Then we rest."
  - assistant:
      - text: "<summary>The user asked about the notes; they say to ship on Friday.</summary>"
    lane: compact
"#,
    );
    assert_eq!(crate::support::lanes(&out), ["main", "compact", "main"]);
    assert_eq!(out.summary.compactions["manual"], 1);
    let fired: Vec<&str> = out.rows[2].stages.iter().filter(|s| s.fired).map(|s| &*s.name).collect();
    assert_eq!(fired, ["manual_compact"]);
    assert!(out.rows[2].events.iter().any(|e| e.contains("compact")), "{:?}", out.rows[2].events);
}

/// The recorded sizes the workload fills to are the record view's first-call sizes, computed
/// without reading the whole record: a file that opens the session (eea3a341), one that
/// continues a session (7662d755-2) and one that starts warm on an earlier process's cache
/// (7be20d70).
#[test]
fn first_call_sizes_without_a_record_view_are_the_views() {
    for name in ["oh-my-posh/eea3a34195eb-0.full.jsonl", "entireio-cli/7662d755ef9f-2.full.jsonl", "entireio-cli/7be20d70c73b-0.full.jsonl"] {
        let session = load_session(&realdata().join("transcripts").join(name)).unwrap();
        let direct = ctxsim::replay::sizing::first_call_sizes(&session, &mut measurer(), &mut Default::default()).expect(name);
        let options = ctxsim::replay::ReplayOptions { info_loss: false, ..Default::default() };
        let replayed = ctxsim::replay::record_view(&session, &mut measurer(), &options).unrecorded_main.expect(name);
        assert_eq!(direct.first_call_tokens, replayed.first_call_tokens, "{name}");
        // A later call may reveal another prefix level to the view; the first call's is this.
        assert!(direct.prefix_tokens > 0 && direct.prefix_tokens <= direct.first_call_tokens, "{name}: {direct:?}");
    }
}

/// As recorded, each reply carries the usage the API returned to the recorded client, so the
/// agent counts its context as the client did; the scenario `import --to scenario` writes (for
/// other strategies) leaves usage to the simulation.
#[test]
fn the_agent_counts_from_the_recorded_usage_only_as_recorded() {
    let path = realdata().join("transcripts/entireio-cli/9878b713483d-0.full.jsonl");
    let session = load_session(&path).unwrap();
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let file = path.display().to_string();
    let (plain, _) = ctxsim::replay::workload::sized_workload(&session, &file, &measurer(), &strategy, false).unwrap();
    assert_eq!(plain.report.recorded_usage, 0);
    assert!(plain.scenario.script.iter().all(|s| !matches!(s, Step::Assistant(a) if a.usage.is_some())));
    let (recorded, _) = ctxsim::replay::workload::sized_workload(&session, &file, &measurer(), &strategy, true).unwrap();
    assert_eq!(recorded.report.recorded_usage, recorded.report.main_replies, "every main reply of 9878 has its usage");
}

/// Built for the agent's runs, a workload is the one sized as recorded: its scenario,
/// its summary steps (its script's `compact`-lane steps) and its document but for the script,
/// which release builds leave out (the runs read the scenario; debug builds keep it to check).
#[test]
fn a_workload_for_runs_is_the_sized_workload() {
    let strategy = Strategy::default();
    // 0254 continues an earlier file (its history stand-in), 7662 records microcompacts, 7be2
    // @-mentions files in its first prompt.
    for name in ["oh-my-posh/0254bffa0c17-1.full.jsonl", "entireio-cli/7662d755ef9f-2.full.jsonl", "entireio-cli/7be20d70c73b-0.full.jsonl"] {
        let path = realdata().join("transcripts").join(name);
        let session = load_session(&path).unwrap();
        let file = path.display().to_string();
        let options = ctxsim::replay::ReplayOptions::default();
        let (sized, sizing) = ctxsim::replay::workload::sized_workload_with(&session, &file, &measurer(), &strategy, true, &options).unwrap();
        let (runs, runs_sizing) = ctxsim::replay::workload::sized_workload_for_runs(&session, &file, &measurer(), &strategy, &options).unwrap();
        assert!(runs.scenario == sized.scenario, "{name}");
        assert_eq!(runs.main_calls, sized.main_calls, "{name}");
        assert_eq!(format!("{runs_sizing:?}"), format!("{sizing:?}"), "{name}");
        let compact: Vec<&serde_json::Value> = sized.document["script"].as_array().unwrap().iter().filter(|s| s["lane"] == "compact").collect();
        assert!(runs.summary_steps.iter().eq(compact), "{name}");
        let head = |document: &serde_json::Value| document.as_object().unwrap().iter().filter(|(k, _)| *k != "script").map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>();
        assert_eq!(head(&runs.document), head(&sized.document), "{name}");
        assert!(runs.document.get("script").is_none() || runs.document["script"] == sized.document["script"], "{name}");
    }
}

/// A transcript of one Bash call whose input nests `depth` levels of objects, its result and a
/// closing reply.
fn nested_input_transcript(depth: usize) -> String {
    use serde_json::json;
    let mut input = json!("ls");
    for _ in 0..depth {
        input = json!({ "command": input });
    }
    let usage = json!({ "input_tokens": 3, "cache_creation_input_tokens": 9_000, "cache_read_input_tokens": 0, "output_tokens": 40 });
    let line = |n: u64, kind: &str, message: serde_json::Value| {
        json!({
            "parentUuid": (n > 1).then(|| format!("00000000-0000-4000-8000-{:012}", n - 1)), "isSidechain": false, "userType": "external",
            "cwd": "/repo", "sessionId": "deep", "version": "2.1.39", "gitBranch": "main", "type": kind, "message": message,
            "uuid": format!("00000000-0000-4000-8000-{n:012}"), "timestamp": jiff::Timestamp::from_second(1_767_780_000 + n as i64).unwrap().to_string(),
        })
        .to_string()
    };
    let reply = |id: &str, content: serde_json::Value, stop: &str| {
        json!({ "id": id, "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": content, "stop_reason": stop, "usage": usage })
    };
    [
        line(1, "user", json!({ "role": "user", "content": "List the files." })),
        line(2, "assistant", reply("msg_1", json!([{ "type": "tool_use", "id": "toolu_deep", "name": "Bash", "input": input }]), "tool_use")),
        line(3, "user", json!({ "role": "user", "content": [{ "type": "tool_result", "tool_use_id": "toolu_deep", "content": "a.rs" }] })),
        line(4, "assistant", reply("msg_2", json!([{ "type": "text", "text": "One file." }]), "end_turn")),
    ]
    .join("\n")
        + "\n"
}

/// A workload's scenario is built from its steps, not read from its document, but refuses what
/// its document's reading refuses: a tool input nested so deep that the document (six levels
/// above the input) reaches the scenario's nesting limit is the text's error, one level less is
/// a workload.
#[test]
fn a_tool_input_nested_too_deep_is_the_documents_error() {
    let limit = ctxsim::scenario::MAX_YAML_DEPTH;
    for (depth, refused) in [(limit - 7, false), (limit - 6, true)] {
        let text = nested_input_transcript(depth);
        let session = ctxsim::recording::import_claude_code_from(std::io::Cursor::new(text.as_bytes()), "deep.jsonl").unwrap();
        match workload_from_session(&session, "deep.jsonl", None) {
            Ok(workload) => {
                assert!(!refused, "input nested {depth} levels: a workload");
                assert_eq!(workload.report.main_replies, 2);
            }
            Err(error) => {
                assert!(refused, "input nested {depth} levels: {error}");
                assert!(error.to_string().contains(&format!("nested {} levels deep", limit + 1)), "{error}");
            }
        }
    }
}

/// The compaction-trigger table through the agent, over every shared session that records a
/// compaction: where the agent itself compacted, driven by the session under the shipped
/// calibration, against each recorded `compact_boundary` (call position and preTokens). Manual
/// compactions are listed with no threshold, and the one a file opens with has no history
/// in it (`no_history`).
#[test]
fn the_agent_compacts_at_the_recorded_calls() {
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let table = ModelTable::shipped();
    let root = realdata().join("transcripts");
    let mut reports = Vec::new();
    for path in real_transcripts() {
        let session = load_session(&path).unwrap();
        if !session.recording.events.iter().any(|e| e.lane == LANE_MAIN && matches!(e.kind, ctxsim::recording::EventKind::Compaction(_))) {
            continue;
        }
        let driven = agent_replay(&session, &path.display().to_string(), &mut measurer(), &strategy).unwrap();
        let recorded_usage = driven.report.recorded_usage > 0;
        let report = ctxsim::replay::agent_triggers(&session, &driven.replay, &driven.compactions, recorded_usage, &table, &Default::default());
        let name = path.strip_prefix(&root).unwrap().display().to_string();
        assert!(report.rows.iter().any(|r| r.recorded_call.is_some()), "{name}: a recorded compaction has no row");
        reports.push((name, report));
    }
    assert_eq!(reports.len(), 11, "the shared sessions that record a compaction");
    let (total, matched) = reports.iter().map(|(_, r)| r.auto_matched()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    assert_eq!(total, 11, "recorded automatic compactions with their history");
    assert!(matched >= 10, "{matched} of {total} matched");
    insta::assert_snapshot!(ctxsim::replay::agent_triggers_table(&reports));
}

/// A compaction that fired between a reply and its tool's result replaced the result before it
/// was written (af1dd25e-8, call 115: a Read), though the client counted it. The workload answers
/// that call with a stand-in of the session's mean result of the tool, so the agent's count
/// reaches the threshold where the client's did: it compacts at the recorded call and answers
/// the recorded calls after it (without the stand-in it never compacted and ran out of window
/// after 126 of 224 calls). The files the record shows are in the agent's fs, so its own
/// compaction restores them: the first call after it was 12% short (38% short without them).
/// Since fidaf1d it also restores what the record shows beyond the files the client's rule
/// restores (`world.restored_unrecorded`), on top of its own restore, ~12k above that rule's
/// here: 16% over (see `a_file_cleared_into_restores_at_each_compaction_...`).
#[test]
fn a_result_a_compaction_replaced_unwritten_still_counts() {
    let path = realdata().join("transcripts/cipher-box/af1dd25ebb3e-8.full.jsonl");
    let session = load_session(&path).unwrap();
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let driven = agent_replay(&session, &path.display().to_string(), &mut measurer(), &strategy).unwrap();
    assert_eq!(driven.report.unwritten_results, 1);
    assert!(driven.report.files_shown > 50, "{:?}", driven.report);
    assert!(driven.replay.calls.len() > 161, "{} calls answered", driven.replay.calls.len());
    let after = &driven.replay.calls[115];
    assert_eq!(after.index, driven.compactions[0].before_call);
    let (simulated, recorded) = (after.simulated_context() as f64, after.recorded_context() as f64);
    assert!((simulated - recorded).abs() / recorded < 0.17, "after the compaction: agent {simulated} vs recorded {recorded}");
    let report = ctxsim::replay::agent_triggers(&session, &driven.replay, &driven.compactions, true, &ModelTable::shipped(), &Default::default());
    let first = report.rows.iter().find(|r| r.recorded_call == Some(115)).expect("the recorded compaction at call 115");
    assert_eq!(first.verdict, "matched", "{report:?}");
}

/// A compaction that followed a reply the transcript never wrote (af1dd25e-8, call 161: after
/// the Read result of call 160 the client made one more call, an Edit, ran its hooks, counted it
/// and compacted; the boundary's logical parent is that reply, and only the Edit's hook progress
/// names it). The importer marks it (`unwritten_reply`, before the boundary), and the workload
/// stands in for the call and its result with an attachment of what the boundary's preTokens
/// leaves above the count of what was written, so the agent's own rule fires at the recorded
/// call: before, its count was 165,911 < 167,000, it never compacted again and ran out of window
/// after 210 of the 224 calls (context MAPE 18.6%, +88% at call 161). What the agent's own
/// compaction restores there is short of the record (−29% at call 161: the client's restored
/// context is not in the transcript), an open gap.
#[test]
fn a_reply_the_transcript_never_wrote_still_counts_before_the_compaction() {
    let (session, driven) = drive("cipher-box/af1dd25ebb3e-8.full.jsonl");
    let marks: Vec<&serde_json::Value> = session
        .recording
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            ctxsim::recording::EventKind::SystemEvent(s) if s.subtype == "unwritten_reply" => Some(&s.payload),
            _ => None,
        })
        .collect();
    assert_eq!(marks.len(), 1, "{marks:?}");
    assert_eq!(marks[0]["tool_uses"][0]["name"], "Edit", "{marks:?}");
    assert_eq!(driven.report.unwritten_replies, 1);
    assert_eq!(driven.unpaired, 0, "every recorded main call answered");
    let report = ctxsim::replay::agent_triggers(&session, &driven.replay, &driven.compactions, true, &ModelTable::shipped(), &Default::default());
    let second = report.rows.iter().find(|r| r.recorded_call == Some(161)).expect("the recorded compaction at call 161");
    assert_eq!(second.verdict, "matched", "{report:?}");
    assert_eq!(driven.compactions.iter().map(|c| c.before_call).collect::<Vec<_>>(), [115, 161]);
    // The calls after it are answered from the agent's own compacted conversation: none is
    // more than 40% off the record (+88% at call 161 before, the conversation never compacted).
    let worst = driven.replay.calls.iter().filter(|c| c.index >= 161).map(|c| (c.simulated_context() as f64 / c.recorded_context() as f64 - 1.0).abs()).fold(0.0, f64::max);
    assert!(worst < 0.4, "worst error after call 161: {worst}");
    insta::assert_snapshot!(ctxsim::replay::agent_triggers_table(&[("cipher-box/af1dd25ebb3e-8.full.jsonl".to_owned(), report)]));
}

/// The client's count before a main call is one definition (`triggers::added_tokens`) for the
/// compaction-trigger table and for the workload's stand-in of a reply the transcript never
/// wrote (review of issue 13: the workload left out the prompts it does not drive, and the
/// table left out attachments). A meta prompt and a sent attachment the client held between
/// af1dd25e-8's last written result and its compaction at call 161 (inserted here) count in
/// both: the count before call 161 grows by their rough size and the stand-in, what preTokens
/// leaves above the count of what was written, shrinks by the same.
#[test]
fn held_prompts_and_attachments_count_alike_in_triggers_and_the_unwritten_reply() {
    let path = realdata().join("transcripts/cipher-box/af1dd25ebb3e-8.full.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let boundary = lines.iter().rposition(|l| l.contains("\"compact_boundary\"")).unwrap();
    let mut envelope: serde_json::Value = serde_json::from_str(lines[boundary - 2]).unwrap();
    assert_eq!(envelope["type"], "user", "the last written result before the boundary");
    envelope.as_object_mut().unwrap().remove("toolUseResult");
    let record = |uuid: &str, fields: serde_json::Value| {
        let mut r = envelope.clone();
        r["uuid"] = uuid.into();
        for (k, v) in fields.as_object().unwrap() {
            r[k] = v.clone();
        }
        r.to_string()
    };
    let meta = record("00000000-0000-4000-8000-00000000000a", serde_json::json!({ "isMeta": true, "message": { "role": "user", "content": "m".repeat(4000) } }));
    let attachment = record(
        "00000000-0000-4000-8000-00000000000b",
        serde_json::json!({ "type": "attachment", "attachment": { "type": "todo_reminder", "content": "a".repeat(4000) } }),
    );
    let mut held = lines.clone();
    held.splice(boundary - 1..boundary - 1, [meta.as_str(), attachment.as_str()]);
    let held = held.join("\n");

    let measure = |transcript: &str| {
        let session = ctxsim::recording::claude_code::import_claude_code_from(std::io::Cursor::new(transcript), "af1dd25ebb3e-8.full.jsonl").unwrap();
        let workload = workload_from_session(&session, "af1dd25ebb3e-8", None).unwrap();
        let stand_in = workload
            .scenario
            .script
            .iter()
            .find_map(|s| match s {
                Step::Attachment { kind, text, .. } if kind == "unwritten_reply" => Some(text.len() as u64 / 4),
                _ => None,
            })
            .expect("the stand-in of the unwritten reply");
        let replay = crate::support::replay_session(&session, &mut measurer(), &Default::default());
        let (_, points) = ctxsim::replay::triggers::main_points(&session, &replay, None);
        let before = points.iter().find(|p| p.compaction.as_ref().is_some_and(|b| b.pre_tokens == Some(167_602))).expect("call 161");
        (before.count, stand_in)
    };
    let (count, stand_in) = measure(&text);
    let (count_held, stand_in_held) = measure(&held);
    assert!(count_held - count >= 2_000, "the count grew by {}", count_held - count);
    assert_eq!(count_held - count, stand_in - stand_in_held, "what the count gained, the stand-in lost");
}

/// A microcompact the record shows drives the agent (7662d755-2, 2.1.14, before call 6: 42
/// results cleared, 21,091 tokens saved, every one of them from before this continuing file).
/// The workload scripts it as a `microcompact` step: results of the file by id, and the share
/// from before the file out of the history stand-in. Before, the agent kept them and ran +20%
/// over the record on every call from 6 to the compaction at 30.
#[test]
fn a_recorded_microcompact_clears_what_it_cleared() {
    let (_, driven) = drive("entireio-cli/7662d755ef9f-2.full.jsonl");
    assert_eq!(driven.report.recorded_microcompacts, 1, "{:?}", driven.report);
    let errors: Vec<(usize, f64)> = driven.replay.calls.iter().map(|c| (c.index, c.simulated_context() as f64 / c.recorded_context() as f64 - 1.0)).collect();
    let between: Vec<f64> = errors.iter().filter(|(i, _)| (6..30).contains(i)).map(|(_, e)| e.abs()).collect();
    assert_eq!(between.len(), 24);
    assert!(between.iter().all(|e| *e < 0.05), "{errors:?}");
}

/// As recorded, a transcript that records its attachments (2.1.2xx) drives them: each sent
/// attachment record becomes an `attachment` step at its place, rendered as the replay renders
/// it, and the agent adds none of its own. A scenario for other strategies keeps the agent's.
/// On NumWordify the context error falls from 28.9% (the agent's own listings and reminders) to
/// 4.3%; 6.8% once a 2.1.200+ reply's thinking was filled to its billed output (fid200) under a
/// Claude 5 scale fitted before that rule, 0.9% with the calibration refitted under it (fid16;
/// the replay path: 6.79% → 0.88%, docs/fidelity.md).
#[test]
fn as_recorded_the_agent_sends_the_recorded_attachments_and_none_of_its_own() {
    let path = realdata().join("transcripts/NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl");
    let session = load_session(&path).unwrap();
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let file = path.display().to_string();
    let attachments = |w: &ctxsim::replay::workload::Workload| w.scenario.script.iter().filter(|s| matches!(s, Step::Attachment { .. })).count();
    let (plain, _) = ctxsim::replay::workload::sized_workload(&session, &file, &measurer(), &strategy, false).unwrap();
    assert_eq!((attachments(&plain), plain.scenario.world.recorded_attachments), (0, false));
    let (recorded, _) = ctxsim::replay::workload::sized_workload(&session, &file, &measurer(), &strategy, true).unwrap();
    assert!(recorded.scenario.world.recorded_attachments);
    assert_eq!(attachments(&recorded), recorded.report.recorded_attachments);
    assert!(recorded.report.recorded_attachments >= 10, "{:?}", recorded.report);
    let driven = agent_replay(&session, &file, &mut measurer(), &strategy).unwrap();
    let mape = ctxsim::replay::fidelity::fidelity_for_session(&driven.replay, &ModelTable::shipped(), false).context_tokens_mape;
    assert!(mape < 0.06, "context MAPE {mape}");
}

/// An `attachment` step is sent as written, where it stands; with `recorded_attachments` the
/// agent adds no attachment of its own (here the skill listing its skill would get).
#[test]
fn an_attachment_step_is_sent_as_written_and_replaces_the_agents_own() {
    let yaml = |recorded: bool| {
        format!(
            r#"
name: recorded-attachment
world:
  model: claude-sonnet-4-6
  recorded_attachments: {recorded}
  files:
    /repo/.claude/skills/deploy/SKILL.md: "---\ndescription: Ship the build to production\n---\nRun the deploy script."
script:
  - user: "Ship it."
  - attachment: {{type: task_reminder, text: "<system-reminder>\nThe recorded reminder.\n</system-reminder>"}}
  - assistant:
      - text: "Shipped."
"#
        )
    };
    let texts = |recorded: bool| {
        let out = crate::support::run_yaml(&yaml(recorded));
        serde_json::to_string(&out.requests[0].messages).unwrap()
    };
    let recorded = texts(true);
    assert!(recorded.contains("The recorded reminder."), "{recorded}");
    assert!(!recorded.contains("deploy"), "the agent's own skill listing: {recorded}");
    let own = texts(false);
    assert!(own.contains("The recorded reminder.") && own.contains("deploy"), "{own}");
}

/// The record shows what the agent cannot know: a first call that read a prefix an earlier
/// session cached (its prefix is seeded, as the replay seeds it) and the TTL the client's
/// markers carried (1h on eea3a341, whose 445 s pause before call 79 reads the whole prefix).
#[test]
fn a_warm_start_and_the_recorded_ttl_come_from_the_record() {
    let path = realdata().join("transcripts/oh-my-posh/eea3a34195eb-0.full.jsonl");
    let session = load_session(&path).unwrap();
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let driven = agent_replay(&session, &path.display().to_string(), &mut measurer(), &strategy).unwrap();
    assert!(driven.sizing.seeded_prefix_tokens > 20_000, "{:?}", driven.sizing);
    let first = &driven.replay.calls[0];
    let read = |c: &ctxsim::replay::CallReplay| (c.recorded.cache_read_input_tokens as f64, c.sim_cache_read);
    let (recorded, simulated) = read(first);
    assert!((simulated - recorded).abs() / recorded < 0.02, "first call read: agent {simulated} vs recorded {recorded}");
    let late = &driven.replay.calls[79];
    let (recorded, simulated) = read(late);
    assert!(recorded > 150_000.0 && simulated / recorded > 0.95, "call 79 read: agent {simulated} vs recorded {recorded}");
}

/// The files an opening prompt @-mentions come with its turn (c644f3af-1: `/gsd:discuss-phase`,
/// whose text names a workflow, a template, STATE.md and ROADMAP.md; the summary says "the
/// system loaded several files as context"). They are messages, which the `/compact` at call 45
/// drops: the workload attaches each before the first reply, sized from the first call's gap
/// beyond the version's fitted user context, instead of filing the whole gap as CLAUDE.md,
/// which survives the compaction. Before, every call after it was 26–36% over the record (the
/// first one 87,538 vs 64,236).
#[test]
fn files_the_opening_prompt_mentions_are_dropped_at_compaction() {
    let (session, driven) = drive("cipher-box/c644f3afc869-1.full.jsonl");
    let sizing = &driven.sizing;
    let names: Vec<&str> = sizing.mentioned_files.iter().map(|p| p.rsplit('/').next().unwrap()).collect();
    assert_eq!(names, ["discuss-phase.md", "context.md", "STATE.md", "ROADMAP.md"]);
    assert!(sizing.mention_filler_tokens > 10_000, "{sizing:?}");
    assert_eq!(sizing.claude_md_filler_tokens + sizing.mention_filler_tokens, sizing.recorded_context_tokens - sizing.agent_context_tokens);
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let (workload, _) = ctxsim::replay::workload::sized_workload(&session, "c644", &measurer(), &strategy, true).unwrap();
    let first_reply = workload.scenario.script.iter().position(|s| matches!(s, Step::Assistant(_))).unwrap();
    let files = workload.scenario.script[..first_reply].iter().filter(|s| matches!(s, Step::Attachment { kind, .. } if kind == "file")).count();
    assert_eq!(files, 4);
    let after = driven.replay.calls.iter().find(|c| c.index == driven.compactions[0].before_call).unwrap();
    assert_eq!(driven.compactions[0].stage, "manual_compact");
    let (simulated, recorded) = (after.simulated_context() as f64, after.recorded_context() as f64);
    // 10.3% over: the system prompt now carries the 7,074 tokens the record reads after the
    // compaction (35,695, the whole prefix), which the mentioned files gave up; it was 0.7% over
    // when they sat in the files, short in the prefix by as much as the agent's restore is over.
    assert!((simulated - recorded).abs() / recorded < 0.11, "after the /compact: agent {simulated} vs recorded {recorded}");
    // A session without mentions files its whole gap as memory and context.
    let (_, plain) = drive("cipher-box/e89fb6a2d646-0.full.jsonl");
    assert_eq!((plain.sizing.mentioned_files.len(), plain.sizing.mention_filler_tokens), (0, 0));
}

/// A tool result's image counts what the API counts for its pixels (`width × height / 750`).
/// The workload kept only an image's base64 size, so the agent's stand-in had no header and
/// counted the flat 2,000 of an unsized image: c644's pencil screenshots are 512 × 320 (219
/// tokens), and each one stepped the agent's context up by ~2.1k (calls 49, 57, 63, 70, 75;
/// 8.2k at call 77 after four), from +2.4% at call 48 to +16.9% at call 81. The workload now
/// writes each recorded image's pixels, which the stand-in's PNG header carries.
#[test]
fn a_recorded_screenshot_counts_its_pixels_through_the_agent() {
    let path = realdata().join("transcripts/cipher-box/c644f3afc869-1.full.jsonl");
    let session = load_session(&path).unwrap();
    let workload = workload_from_session(&session, &path.display().to_string(), None).unwrap();
    let images: Vec<&ctxsim::scenario::ImageSpec> =
        workload.scenario.script.iter().flat_map(|s| match s {
            Step::ToolOutput(outputs) => outputs.iter().flat_map(|o| o.images.iter()).collect::<Vec<_>>(),
            _ => Vec::new(),
        }).collect();
    assert_eq!(images.len(), 9);
    for image in &images {
        assert_eq!((image.width, image.height), (Some(512), Some(320)), "{image:?}");
        let ctxsim::api::ContentBlock::Image(block) = image.block() else { panic!("{image:?}") };
        assert_eq!(ctxsim::measure::blocks::image_tokens(&block), Some(219));
    }
    let (_, driven) = drive("cipher-box/c644f3afc869-1.full.jsonl");
    let errors = context_errors(&driven);
    // Call 77 follows the four screenshots of call 76: the agent's step is the record's.
    let calls: BTreeMap<usize, &ctxsim::replay::CallReplay> = driven.replay.calls.iter().filter(|c| c.lane == LANE_MAIN).map(|c| (c.index, c)).collect();
    let step = |c: &ctxsim::replay::CallReplay| c.simulated_context() as f64 - c.recorded_context() as f64;
    let (before, at) = (step(calls[&76]), step(calls[&77]));
    assert!((at - before).abs() < 500.0, "call 76 off by {before}, call 77 by {at}: {errors:?}");
    assert_calls_within(&driven, 45, 37, 0.04);
}

/// Held out of the fit, c644's version (2.1.49) has only af1d's user context (6.4k), so the
/// mentioned files' filler took the rest of the first call's gap (41k) and the `/compact` at call
/// 45 dropped it all: calls 45–81 were 12–28% short. What outlives a compaction is what the
/// record shows after the file's first compaction (23.8k beyond the prefix), as for a continuing
/// file; the mentioned files take the rest.
#[test]
fn held_out_the_mentioned_files_are_what_the_record_shows_a_compaction_dropped() {
    let path = realdata().join("transcripts/cipher-box/c644f3afc869-1.full.jsonl");
    let session = load_session(&path).unwrap();
    let mut calibration = Calibration::shipped();
    calibration.user_context_by_version.insert("2.1.49".into(), 6_435);
    let mut held_out = Measurer::new(ModelTable::shipped(), TokenCounter::with_calibration(EstimatorKind::Calibrated, calibration)).without_body_hashes();
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let driven = agent_replay(&session, &path.display().to_string(), &mut held_out, &strategy).unwrap();
    let sizing = &driven.sizing;
    // What outlives the compaction: the part of the system prompt above the global-scope level
    // (the ~7k the record reads after the `/compact`, placed there by the filler rule) and the
    // CLAUDE.md after the summary, together the 23.8k the record shows.
    let kept = sizing.claude_md_filler_tokens + sizing.recorded_prefix_tokens.saturating_sub(sizing.recorded_global_tokens);
    assert!((22_000..26_000).contains(&kept) && sizing.mention_filler_tokens > 20_000, "{sizing:?}");
    assert_calls_within(&driven, 45, 37, 0.04);
}

/// The first-party server does not key its cache on the billing block: after every recorded
/// automatic compaction of the shipped sessions the next call reads the whole prefix, although
/// the client's fingerprint changed with its first message. Real sessions through the agent are
/// measured that way (`REAL_SESSION_BILLING`); scenarios keep the block in the key. The block is
/// counted either way.
#[test]
fn a_changed_billing_fingerprint_keeps_the_cached_prefix_of_a_real_session() {
    use ctxsim::api::{CacheControl, Message, Request, SystemBlock, SystemPrompt};
    use ctxsim::measure::MeasureInput;
    use ctxsim::measure::blocks::BillingKey;
    let request = |fingerprint: &str, prompt: &str| {
        let mut request = Request::new(crate::support::MODEL.to_owned(), 1024);
        request.system = Some(SystemPrompt::Blocks(vec![
            SystemBlock::text(format!("x-anthropic-billing-header: cc_version=2.1.88.{fingerprint}; cc_entrypoint=cli;")),
            SystemBlock::text(crate::support::text_of("system", 3000)).with_cache_control(Some(CacheControl::ephemeral())),
        ].into()));
        request.messages.push(Message::user_text(prompt));
        request
    };
    let second_read = |billing: BillingKey| {
        let mut measurer = crate::support::measurer();
        measurer.set_billing_key(billing);
        let first = measurer.measure(MeasureInput::new("main", 0, &request("751", "fix the parser"))).unwrap();
        let second = measurer.measure(MeasureInput::new("main", 60_000, &request("cfc", "summary of the conversation so far"))).unwrap();
        (first.context_tokens, second.cache_read_input_tokens)
    };
    let (keyed_context, keyed_read) = second_read(BillingKey::Keyed);
    let (unkeyed_context, unkeyed_read) = second_read(BillingKey::Unkeyed);
    assert_eq!(keyed_context, unkeyed_context, "the block is counted either way");
    assert_eq!(keyed_read, 0, "keyed: a new fingerprint misses everything after it");
    assert!(unkeyed_read >= 3000, "unkeyed: the system prompt is read ({unkeyed_read})");
    assert_eq!(ctxsim::replay::workload::REAL_SESSION_BILLING, BillingKey::Unkeyed);
    // a6e4 #7, the first call after its automatic compaction, read 34,858 (its prefix): through
    // the agent it read nothing before (its fingerprint changed), now what the agent marks of it.
    let (_, driven) = drive("entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    let call = driven.replay.calls.iter().find(|c| c.index == 7).expect("call 7");
    let read = call.metrics.as_ref().map_or(0, |m| m.cache_read_input_tokens);
    assert!(read > 10_000, "call 7 read {read}");
}

/// The recorded tool results already went through the recorded client's per-tool persistence
/// thresholds; under the default thresholds (the client's own) the agent driving the record
/// persists none of them again, as the replay does not. 9878 (2.0.76) sent a large result whole
/// at calls 3 and 59; the agent cut it to its preview (−10k tokens, −8% to −25% on each call
/// between). A strategy with other thresholds applies them.
#[test]
fn recorded_tool_results_are_not_persisted_again_under_the_default_thresholds() {
    let mut strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    ctxsim::replay::workload::keep_recorded_results(&mut strategy);
    assert_eq!(strategy.compact.tool_result_budget.threshold("Bash"), Some(u64::MAX));
    let mut own = Strategy::resolve_with("claude-code", &["compact.tool_result_budget.default_chars=1000".to_owned()]).unwrap();
    ctxsim::replay::workload::keep_recorded_results(&mut own);
    assert_eq!(own.compact.tool_result_budget.threshold("Bash"), Some(30_000));
    let (_, driven) = drive("entireio-cli/9878b713483d-0.full.jsonl");
    let fired: Vec<usize> =
        driven.replay.calls.iter().filter(|c| c.metrics.iter().flat_map(|m| &m.stages).any(|s| s.fired && s.name == "tool_result_budget")).map(|c| c.index).collect();
    assert!(fired.is_empty(), "persisted again before calls {fired:?}");
    let call = driven.replay.calls.iter().find(|c| c.index == 3).expect("call 3");
    let error = call.simulated_context() as f64 / call.recorded_context() as f64 - 1.0;
    assert!(error.abs() < 0.12, "call 3: {error}");
}

/// A resumed client loads its history back from the transcript's `parentUuid` chain, which does
/// not hold parallel tool uses written beside it: cd95 (2.1.7) ran `/exit` before call 19 and
/// its resumed history lacks 9 tool uses and their results (~13.6k tokens). The workload drives
/// that as a `resume_lost` step before the first reply after the resume, and the agent drops
/// them: calls 19–50 ran +13% to +15% before, now within 5%.
#[test]
fn a_resume_loses_the_tool_uses_off_the_recorded_chain() {
    let (session, driven) = drive("entireio-cli/cd95adddad32-0.full.jsonl");
    assert_eq!(driven.report.resume_losses, 1, "{:?}", driven.report);
    let path = realdata().join("transcripts/entireio-cli/cd95adddad32-0.full.jsonl");
    let workload = workload_from_session(&session, &path.display().to_string(), None).unwrap();
    let lost: Vec<usize> = workload.scenario.script.iter().filter_map(|s| match s {
        Step::ResumeLost { tool_use_ids } => Some(tool_use_ids.len()),
        _ => None,
    }).collect();
    assert_eq!(lost, vec![9]);
    let errors: Vec<(usize, f64)> = driven.replay.calls.iter().map(|c| (c.index, c.simulated_context() as f64 / c.recorded_context() as f64 - 1.0)).collect();
    let between: Vec<f64> = errors.iter().filter(|(i, _)| (19..=50).contains(i)).map(|(_, e)| e.abs()).collect();
    assert!(!between.is_empty() && between.iter().all(|e| *e < 0.05), "{errors:?}");
    let events = &driven.replay.calls.iter().find(|c| c.index == 19).expect("call 19").events;
    assert!(events.iter().any(|e| e == "resume_lost_results"), "{events:?}");
}

/// The `resume_lost` step names what the resume lost; naming nothing is an error with its place.
#[test]
fn a_resume_lost_step_names_tool_uses() {
    let yaml = |ids: &str| format!("name: lost\nworld:\n  model: claude-sonnet-4-6\nscript:\n  - user: hi\n  - resume_lost: {{tool_use_ids: [{ids}]}}\n");
    let scenario = ctxsim::scenario::parse_scenario(&yaml("toolu_1"), "lost.yaml").unwrap();
    assert!(matches!(&scenario.script[1], Step::ResumeLost { tool_use_ids } if tool_use_ids == &["toolu_1".to_owned()]));
    let error = ctxsim::scenario::parse_scenario(&yaml(""), "lost.yaml").unwrap_err().to_string();
    assert!(error.contains("lost.yaml") && error.contains("resume_lost") && error.contains("loses nothing"), "{error}");
}

/// A `resume_lost` step drops the tool use it names with its result, and says which ids named
/// no tool use of the conversation instead of passing over them.
#[test]
fn a_resume_lost_step_drops_what_it_names_and_reports_ids_it_does_not_find() {
    let yaml = |ids: &str| {
        format!(
            "name: lost\nworld:\n  model: claude-sonnet-4-6\n  cwd: /repo\n  files:\n    /repo/a.rs: \"fn a() {{}}\\n\"\nscript:\n  - user: read it\n  - assistant:\n      - tool_use: {{id: toolu_a, name: Read, input: {{file_path: /repo/a.rs}}}}\n  - assistant:\n      - text: read\n  - resume_lost: {{tool_use_ids: [{ids}]}}\n  - user: next\n  - assistant:\n      - text: done\n"
        )
    };
    let last_events = |ids: &str| {
        let output = crate::support::run_yaml(&yaml(ids));
        let last = output.rows.iter().rev().find(|r| r.lane == "main").unwrap();
        (last.events.clone(), last.context_tokens)
    };
    let (found, found_tokens) = last_events("toolu_a");
    assert!(found.iter().any(|e| e == "resume_lost_results") && !found.iter().any(|e| e.starts_with("resume_lost_unknown")), "{found:?}");
    let (missing, missing_tokens) = last_events("toolu_zz");
    assert!(missing.iter().any(|e| e == "resume_lost_unknown:toolu_zz"), "{missing:?}");
    assert!(found_tokens < missing_tokens, "dropping the read leaves less context: {found_tokens} vs {missing_tokens}");
}

/// A transcript whose main-lane thinking has no stored text comes from a client that redacts
/// thinking; that client sends no `clear_thinking` edit, so after its >1h idle gap (call 52,
/// 651 min) the recorded context keeps the earlier thinking and the next call reads the whole
/// cache (136,419 tokens). The agent did the same only once the workload said so: before, the
/// latch kept one thinking turn and calls 53 and 77 read just the static prefix, and Σcreation
/// was +73% (entirecontext 01M0FW, fitted on neither; docs/fidelity.md).
#[test]
fn a_transcript_with_redacted_thinking_drives_an_agent_that_clears_none() {
    let (session, driven) = drive("entirecontext/01M0FWRPX72AX3CYC2HMV1W2SN-1.full.jsonl");
    let file = "fw.jsonl";
    let (workload, _) = ctxsim::replay::workload::sized_workload(&session, file, &measurer(), &Strategy::resolve_with("claude-code", &[]).unwrap(), true).unwrap();
    assert!(workload.scenario.world.redact_thinking);
    for index in [53, 77] {
        let call = driven.replay.calls.iter().find(|c| c.index == index).unwrap();
        assert!(call.sim_cache_read > 0.9 * call.recorded.cache_read_input_tokens as f64, "call {index}: read {} of {}", call.sim_cache_read, call.recorded.cache_read_input_tokens);
    }
    let fidelity = ctxsim::replay::fidelity::fidelity_for_session(&driven.replay, &ModelTable::shipped(), false);
    assert!(fidelity.cache_creation_total_error.abs() < 0.10, "Σcreation {}", fidelity.cache_creation_total_error);
    // Thinking stored as text (oh-my-posh d847, 2.1.215): not redacted.
    let path = realdata().join("transcripts/oh-my-posh/d84718082c10-3.full.jsonl");
    let stored = load_session(&path).unwrap();
    assert!(!workload_from_session(&stored, "d847.jsonl", None).unwrap().scenario.world.redact_thinking);
}

/// Claude Desktop 2.1.200+ shares its static prefix (`ClientProfile::static_prefix_shared`, a
/// replay rule): past the TTL the recorded call still reads tools and the static system prompt.
/// Through the agent the recorded client's rules seed the agent's own global-scope prefix there
/// (oh-my-posh d847 #54, 82 min after #53: recorded read 32,436; the agent read 0 before). The
/// CLI's gaps stay cold (entirecontext 01M0FW #52, 651 min: recorded read 0).
#[test]
fn past_the_ttl_claude_desktop_reads_its_static_prefix_through_the_agent() {
    let read = |driven: &ctxsim::replay::workload::AgentReplay, index: usize| {
        let call = driven.replay.calls.iter().find(|c| c.index == index).unwrap();
        (call.recorded.cache_read_input_tokens, call.sim_cache_read)
    };
    let (_, desktop) = drive("oh-my-posh/d84718082c10-3.full.jsonl");
    let (recorded, simulated) = read(&desktop, 54);
    assert_eq!(recorded, 32_436);
    assert!(simulated > 10_000.0 && simulated <= recorded as f64, "read {simulated}");
    let call = desktop.replay.calls.iter().find(|c| c.index == 54).unwrap();
    assert!(call.events.iter().any(|e| e == "shared_prefix"), "{:?}", call.events);
    let (_, cli) = drive("entirecontext/01M0FWRPX72AX3CYC2HMV1W2SN-1.full.jsonl");
    assert_eq!(read(&cli, 52), (0, 0.0));
}

/// What a slash command expanded into is part of the conversation the client sent: the skill's
/// body after `/compound-loop:reviewing` on entirecontext 01M0FW (a meta prompt of 15.8k chars
/// after call 1) and after `/compound-loop:retrospective` are driven as recorded (`meta_prompt`
/// attachment steps); the caveat before `/clear`'s output is left to the agent. Before, the
/// agent sent the command line only: call 2 grew by 1,007 tokens where the record grew by
/// 4,532, and every later call was 4–8% short (context MAPE 5.1%).
#[test]
fn a_slash_commands_recorded_expansion_is_sent_through_the_agent() {
    let (_, driven) = drive("entirecontext/01M0FWRPX72AX3CYC2HMV1W2SN-1.full.jsonl");
    assert_eq!(driven.report.meta_prompts, 2, "{:?}", driven.report);
    assert_eq!(driven.report.left_to_agent.get("meta_prompt"), Some(&1), "the caveat: {:?}", driven.report.left_to_agent);
    let context = |index: usize| {
        let call = driven.replay.calls.iter().find(|c| c.index == index).unwrap();
        (call.recorded_context() as f64, call.simulated_context() as f64)
    };
    let ((rec1, sim1), (rec2, sim2)) = (context(1), context(2));
    let (recorded, agent) = (rec2 - rec1, sim2 - sim1);
    assert!((agent - recorded).abs() / recorded < 0.15, "call 2 grew by {agent} where the record grew by {recorded}");
    let mape = ctxsim::replay::fidelity::fidelity_for_session(&driven.replay, &ModelTable::shipped(), false).context_tokens_mape;
    assert!(mape < 0.025, "context MAPE {mape}");
}

/// The TTL the recorded calls wrote with is the record's, per call: oh-my-posh d847 wrote at 1h
/// until call 226 and at 5m from call 227 on (the client's 1h eligibility is not in the record,
/// only the usage's split). Call 232 comes 450 s after 231: past 5m, the record read only the
/// static prefix (36,389 of 443,957). The agent, whose markers stayed at the first call's 1h,
/// read everything there (442,399): a hit disagreement. Its markers now follow the recorded TTL
/// in force (`RecordedClient`), the side request's too.
#[test]
fn the_agent_writes_with_the_ttl_the_recorded_call_wrote_with() {
    let (_, driven) = drive("oh-my-posh/d84718082c10-3.full.jsonl");
    let call = driven.replay.calls.iter().find(|c| c.index == 232).unwrap();
    assert_eq!(call.recorded.cache_read_input_tokens, 36_389);
    // The prefix level is filled in whole tokens of the calibrated count, so the simulated read
    // lands within a token of the record's (36,390 under the calibration refitted on branch refit).
    assert!(call.sim_cache_read <= 36_389.0 + 1.0, "call 232 read {} past a 5m TTL", call.sim_cache_read);
    assert!(call.sim_cache_creation > 400_000.0, "call 232 wrote {}", call.sim_cache_creation);
    // Within the TTL the conversation is still read whole.
    let next = driven.replay.calls.iter().find(|c| c.index == 233).unwrap();
    assert!(next.sim_cache_read > 400_000.0, "call 233 read {}", next.sim_cache_read);
}

/// A typed slash command of a custom command or skill (`/gsd:progress`) is recorded as the
/// command line and then, as a meta prompt, the text it expanded to, which the client sent with
/// it. The agent has neither the command nor its text, so the workload sends the recorded
/// expansion after the command (an `attachment` step of type `meta_prompt`); the agent's own
/// attachments stay (the 2.1.39 record holds no attachment records). Before, e89fb6a2-0's first
/// call (the 7.7k-character body of `/gsd:progress`) was 2,016 tokens short (−4.7%), and call
/// 10 (the second `/gsd:progress`) 3.0k short; now both are within 3%. The caveat a local
/// command leaves is not a command's expansion and stays left to the agent.
#[test]
fn a_slash_commands_recorded_expansion_is_sent_with_it() {
    let path = realdata().join("transcripts/cipher-box/e89fb6a2d646-0.full.jsonl");
    let session = load_session(&path).unwrap();
    let workload = workload_from_session(&session, "e89f", None).unwrap();
    assert_eq!(workload.report.meta_prompts, 2, "{:?}", workload.report);
    assert_eq!(workload.report.left_to_agent.get("meta_prompt"), Some(&1), "the /clear caveat: {:?}", workload.report.left_to_agent);
    let script = &workload.scenario.script;
    let command = script.iter().position(|s| matches!(s, Step::User { text } if text.contains("<command-name>/gsd:progress</command-name>"))).unwrap();
    let Step::Attachment { kind, text, .. } = &script[command + 1] else { panic!("after the command: {:?}", script[command + 1]) };
    assert_eq!(kind, ctxsim::replay::workload::META_PROMPT);
    assert!(text.starts_with("<objective>\nCheck project progress"), "{}", &text[..80]);
    assert!(!workload.scenario.world.recorded_attachments, "the agent keeps its own attachments");
    let (_, driven) = drive("cipher-box/e89fb6a2d646-0.full.jsonl");
    // Call 10 is 3.0% over (2.9% while the system filler fell `per_block` short of its size).
    for index in [0, 10] {
        let call = driven.replay.calls.iter().find(|c| c.index == index).unwrap();
        let (simulated, recorded) = (call.simulated_context() as f64, call.recorded_context() as f64);
        assert!((simulated - recorded).abs() / recorded < 0.035, "call {index}: agent {simulated} vs recorded {recorded}");
    }
}

/// The context error of each main call of a run through the agent, by recorded call index.
fn context_errors(driven: &ctxsim::replay::workload::AgentReplay) -> BTreeMap<usize, f64> {
    driven.replay.calls.iter().filter(|c| c.lane == LANE_MAIN).map(|c| (c.index, c.simulated_context() as f64 / c.recorded_context() as f64 - 1.0)).collect()
}

/// The `calls` main calls from recorded call `from` on are all within `bound` of the recorded
/// context.
fn assert_calls_within(driven: &ctxsim::replay::workload::AgentReplay, from: usize, calls: usize, bound: f64) {
    let errors = context_errors(driven);
    let later: Vec<f64> = errors.iter().filter(|(i, _)| **i >= from).map(|(_, e)| e.abs()).collect();
    assert_eq!(later.len(), calls, "{errors:?}");
    assert!(later.iter().all(|e| *e < bound), "{errors:?}");
}

/// A file that continues a session and starts cold cannot show its prefix level on its first
/// call; held out of the fit (no level of its version), the agent took the nearest version's
/// (7662, 2.1.14: 2.1.7's 34,260) where the record shows 19,330 from call 6 on (the read after
/// the recorded microcompact). The workload now takes the first level a later call's read
/// reveals to the replay, so the system filler is that level less the agent's own prefix, and
/// what the compaction at call 30 leaves is no longer 15k over: call 30 was +30% held out.
#[test]
fn held_out_a_continuing_file_is_sized_by_the_prefix_level_its_record_reveals() {
    let path = realdata().join("transcripts/entireio-cli/7662d755ef9f-2.full.jsonl");
    let session = load_session(&path).unwrap();
    let mut calibration = Calibration::shipped();
    assert!(calibration.prefix_tokens.remove("2.1.14").is_some(), "the shipped fit has 7662's level");
    let mut held_out = Measurer::new(ModelTable::shipped(), TokenCounter::with_calibration(EstimatorKind::Calibrated, calibration)).without_body_hashes();
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let driven = agent_replay(&session, &path.display().to_string(), &mut held_out, &strategy).unwrap();
    assert_eq!(driven.sizing.recorded_prefix_tokens, 19_330, "{:?}", driven.sizing);
    assert_eq!(driven.sizing.system_filler_tokens, 19_330 - driven.sizing.agent_prefix_tokens);
    let errors = context_errors(&driven);
    assert!(errors[&30].abs() < 0.06, "call 30: {errors:?}");
}

/// A file that continues a session puts its first call's gap into the opening history, which a
/// compaction drops; what of it the client kept (CLAUDE.md, the user context) is what the record
/// shows after the file's first compaction beyond the prefix, as the replay anchors that
/// segment. a6e4 (2.0.76) compacts before call 7: the agent's calls 7–12 were 17–24% short
/// (3.3k of messages beyond the prefix where the record holds 14.9k); now CLAUDE.md carries the
/// 11.9k the record shows, and the opening history the rest.
#[test]
fn after_its_compaction_a_continuing_file_keeps_the_user_context_its_record_shows() {
    let (_, driven) = drive("entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    let sizing = &driven.sizing;
    assert!(sizing.claude_md_filler_tokens > 10_000, "{sizing:?}");
    assert_eq!(sizing.claude_md_filler_tokens + sizing.history_filler_tokens, sizing.recorded_context_tokens - sizing.agent_context_tokens, "{sizing:?}");
    assert_calls_within(&driven, 7, 6, 0.03);
}

/// At a new user turn the API drops earlier turns' thinking from what Sonnet 4.5 and earlier
/// count (`strips_prior_thinking`); the cached prefix stays valid. The replay counted so, the
/// agent did not: through the agent, each turn of 7662 (Sonnet 4.5) after the compaction
/// counted the thinking of the turns before (+8% to +12% on calls 35–48).
#[test]
fn through_the_agent_older_models_drop_earlier_turns_thinking() {
    let yaml = |model: &str| {
        format!(
            r#"
name: prior-thinking
world:
  model: {model}
script:
  - user: "First question."
  - assistant:
      - thinking: "A long chain of thought about the first question, repeated. A long chain of thought about the first question, repeated. A long chain of thought about the first question, repeated. A long chain of thought about the first question, repeated."
      - text: "First answer."
  - user: "Second question."
  - assistant:
      - text: "Second answer."
"#
        )
    };
    let run = |model: &str, dropped: bool| {
        let scenario = ctxsim::scenario::parse_scenario(&yaml(model), "inline.yaml").unwrap();
        let mut m = measurer();
        m.set_prior_thinking_dropped(dropped);
        ctxsim::runner::run_scenario(&scenario, &mut m, &Strategy::default()).unwrap().rows.into_iter().filter(|r| r.lane == LANE_MAIN).collect::<Vec<_>>()
    };
    let (kept, dropped) = (run("claude-sonnet-4-5", false), run("claude-sonnet-4-5", true));
    assert_eq!(kept[0].context_tokens, dropped[0].context_tokens);
    assert!(dropped[1].context_tokens + 30 < kept[1].context_tokens, "{} vs {}", dropped[1].context_tokens, kept[1].context_tokens);
    // The blocks keep their place: the second request still reads what the first cached.
    assert!(dropped[1].cache_read_input_tokens > 0 && dropped[1].cache_read_input_tokens <= dropped[1].context_tokens);
    // A model that keeps its thinking (Sonnet 4.6) counts it either way.
    let contexts = |rows: Vec<ctxsim::measure::RequestMetrics>| rows.iter().map(|r| r.context_tokens).collect::<Vec<_>>();
    assert_eq!(contexts(run("claude-sonnet-4-6", true)), contexts(run("claude-sonnet-4-6", false)));
    let (_, driven) = drive("entireio-cli/7662d755ef9f-2.full.jsonl");
    assert_calls_within(&driven, 35, 14, 0.04);
}

/// The client sends a request when the record that prompted it is written (a prompt, a tool
/// result) and the reply's first block comes later; the replay measures each call so. The agent
/// was sent each request at its reply's recorded time: on cd95 (2.1.7, 5m TTL) the prompts of
/// calls 93 and 138 came 296 s and 298 s after their turn's end, whose side entry they read, but
/// their replies' first blocks 302 s and 334 s after the previous call, so the agent read nothing
/// there and wrote 126k and 70k tokens (Σcreation +14%). Each reply is now scripted with the
/// latency from its prompting record to its first block.
#[test]
fn a_request_goes_out_when_its_prompt_is_written_not_at_its_replys_first_block() {
    let (_, driven) = drive("entireio-cli/cd95adddad32-0.full.jsonl");
    let at = |index: usize| driven.replay.calls.iter().find(|c| c.index == index && c.lane == LANE_MAIN).expect("driven");
    for index in [93, 138] {
        let call = at(index);
        assert!(call.recorded.cache_read_input_tokens > 60_000, "{index}: {:?}", call.recorded);
        let read = call.metrics.as_ref().map_or(0, |m| m.cache_read_input_tokens);
        assert!(read > 60_000, "call {index}: read {read}");
    }
    let report = ctxsim::replay::fidelity::fidelity_for_session(&driven.replay, &ModelTable::shipped(), false);
    assert!(report.cache_creation_total_error.abs() < 0.08, "Σcreation {}", report.cache_creation_total_error);
}

/// A slash command's body that the script marks as the command's (`attachment.skill`) is
/// remembered as invoked: the agent's compaction restores it (`invoked_skills`), as the 2.1
/// client restores the commands and skills it expanded. Without the mark it is one more message,
/// gone with the compaction.
#[test]
fn a_commands_recorded_body_marked_as_its_skill_comes_back_after_a_compaction() {
    // `MARK` becomes the attachment's `skill` field.
    const SCENARIO: &str = r#"
name: command-restored
world: {model: claude-sonnet-4-6}
script:
  - user: "<command-name>/ship</command-name>"
  - attachment: {type: meta_prompt, text: "Ship checklist: build, tag, publish the release notes.", MARK}
  - assistant: [{text: "Shipping."}]
  - user: "Go on."
  - assistant: [{text: "Done."}]
  - compact: true
  - user: "And now?"
  - assistant: [{text: "Nothing left."}]
"#;
    let yaml = |skill: &str| SCENARIO.replace("MARK", skill);
    let last = |skill: &str| {
        let out = crate::support::run_yaml(&yaml(skill));
        serde_json::to_string(&out.requests.last().unwrap().messages).unwrap()
    };
    let marked = last("skill: ship");
    assert!(marked.contains("Ship checklist: build, tag"), "restored after the compaction: {marked}");
    let unmarked = last("skill: null");
    assert!(!unmarked.contains("Ship checklist"), "{unmarked}");
    let empty = ctxsim::scenario::parse_scenario(&yaml("skill: \" \""), "inline.yaml").map(|_| ()).unwrap_err().to_string();
    assert!(empty.contains("`skill` is empty"), "{empty}");
}

/// e89fb6a2-0 (2.1.39) ran `/gsd:progress` twice before its automatic compaction at call 155;
/// the client restored its body (7.7k characters) after it. The workload marks each expansion
/// with its command, so the agent's compaction restores it too: the first call after the
/// compaction was 13.7% short of the record (shipped calibration), now 9.6%. A 2.0.76 session
/// (9878, `/workflows:review`) gets no mark, nor, as recorded, does one whose record carries the
/// client's own `invoked_skills` attachment (01M0EE57, 2.1.232: that is driven as recorded).
#[test]
fn the_commands_a_session_ran_are_restored_after_its_compaction() {
    let path = realdata().join("transcripts/cipher-box/e89fb6a2d646-0.full.jsonl");
    let workload = workload_from_session(&load_session(&path).unwrap(), "e89f", None).unwrap();
    assert_eq!(workload.report.invoked_commands, 2, "{:?}", workload.report);
    let marked: Vec<&str> = workload
        .scenario
        .script
        .iter()
        .filter_map(|s| match s {
            Step::Attachment { skill: Some(name), text, .. } if text.starts_with("<objective>\nCheck project progress") => Some(name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(marked, ["gsd:progress", "gsd:progress"]);
    let (_, driven) = drive("cipher-box/e89fb6a2d646-0.full.jsonl");
    assert_eq!(driven.compactions.first().map(|c| c.before_call), Some(155));
    let after = driven.replay.calls.iter().find(|c| c.index == 155).unwrap();
    let (simulated, recorded) = (after.simulated_context() as f64, after.recorded_context() as f64);
    assert!((-0.11..0.05).contains(&(simulated / recorded - 1.0)), "the first call after the compaction: agent {simulated} vs recorded {recorded}");
    // As recorded (the sized workload `fidelity --engine agent` drives), so 01M0EE57's recorded
    // attachments are driven.
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    for other in ["entireio-cli/9878b713483d-0.full.jsonl", "entirecontext/01M0EE5721NRN8FGE1238MD50T-0.full.jsonl"] {
        let session = load_session(&realdata().join("transcripts").join(other)).unwrap();
        let (workload, _) = ctxsim::replay::workload::sized_workload(&session, other, &measurer(), &strategy, true).unwrap();
        assert!(workload.report.meta_prompts > 0, "{other}: {:?}", workload.report);
        assert_eq!(workload.report.invoked_commands, 0, "{other}");
    }
}

/// The agent's filler for the recorded client's prompt sits where the client's bytes were: up to
/// the level the record shows cached with the global scope before the boundary (under the
/// global-scope marker), the rest after the agent's dynamic sections, whose block carries a
/// marker of its own, so a read that falls into the system prompt reads all of it as the record
/// does. Before, the filler sat in the unmarked dynamic block of the 2.1.88 layout and the first
/// call after a compaction read only the agent's global-scope part: a6e4 #7 read 11,433 where
/// the record read 34,858 (the call then mostly written, a hit disagreement); spotter #103 read
/// 18,021 of 21,460; 9878 #48 22,102 of 33,865.
#[test]
fn after_a_compaction_the_agent_reads_the_whole_recorded_prefix() {
    let comparisons = |driven: &ctxsim::replay::workload::AgentReplay| ctxsim::replay::fidelity::fidelity_for_session(&driven.replay, &ModelTable::shipped(), true).calls;
    // The call agrees on hit and rewrite, and its read is within `tolerance` of the record's.
    let check = |calls: &[ctxsim::replay::CallComparison], index: usize, tolerance: f64| {
        let call = calls.iter().find(|c| c.index == index && c.lane == LANE_MAIN).unwrap_or_else(|| panic!("no compared call #{index}"));
        let summary = format!("#{index}: recorded read {} creation {}, agent read {:.0} creation {:.0}", call.recorded_cache_read, call.recorded_cache_creation, call.simulated_cache_read, call.simulated_cache_creation);
        assert!(call.hit_agrees, "{summary}");
        let error = (call.simulated_cache_read - call.recorded_cache_read as f64).abs() / call.recorded_cache_read as f64;
        assert!(error < tolerance, "{summary}");
    };
    // a6e4 (2.0.76) starts cold: one level, revealed at #7, all of the filler before the boundary.
    let (_, a6e4) = drive("entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    assert_eq!(a6e4.sizing.recorded_prefix_tokens, 34_858, "{:?}", a6e4.sizing);
    assert_eq!(a6e4.sizing.static_filler_tokens, a6e4.sizing.system_filler_tokens, "{:?}", a6e4.sizing);
    check(&comparisons(&a6e4), 7, 0.01);
    // spotter (2.1.39) starts warm at 17,842 (the global-scope part) and reads 21,460 (the whole
    // prefix) from #31 on: the first call reads the lower level, #103 after the compaction the
    // higher.
    let (_, spotter) = drive("spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl");
    assert_eq!((spotter.sizing.recorded_global_tokens, spotter.sizing.recorded_prefix_tokens), (17_842, 21_460), "{:?}", spotter.sizing);
    let calls = comparisons(&spotter);
    for index in [31, 103] {
        check(&calls, index, 0.02);
    }
    let first = calls.iter().find(|c| c.lane == LANE_MAIN).unwrap();
    assert!((first.simulated_cache_read - 17_842.0).abs() < 100.0, "first call read {}", first.simulated_cache_read);
    // 9878 (2.0.76): warm at 22,033, before the boundary; the rest, to the 30,448 its #15
    // reveals, after the agent's dynamic part. #48 reads 33,865, a level above both (10% over
    // the agent's read), and still agrees.
    let (_, e9878) = drive("entireio-cli/9878b713483d-0.full.jsonl");
    assert!(e9878.sizing.static_filler_tokens > 0 && e9878.sizing.static_filler_tokens < e9878.sizing.system_filler_tokens, "{:?}", e9878.sizing);
    check(&comparisons(&e9878), 48, 0.12);
}

/// Whether the agent's system prompt is cached at its end (`world.dynamic_system_marker`) is the
/// recorded client version's (`ClientProfile::system_cached_at_end`): spotter's 2.1.39 is; the
/// same record as written by 2.1.100, whose dynamic block went unmarked (as 2.1.88's capture
/// shows), is not.
#[test]
fn the_dynamic_system_marker_follows_the_recorded_version() {
    let path = realdata().join("transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl");
    let mut session = load_session(&path).unwrap();
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let marker = |session: &ctxsim::recording::ImportedSession| {
        let (workload, _) = ctxsim::replay::workload::sized_workload(session, "spotter.jsonl", &measurer(), &strategy, false).unwrap();
        workload.scenario.world.dynamic_system_marker
    };
    assert!(marker(&session));
    for call in &mut session.calls {
        call.version = Some("2.1.100".to_owned());
    }
    assert!(!marker(&session));
}

/// After a compaction the invoked skills come back most recent first, by when each was invoked
/// (before, every one took the compaction's time and they came back by name), each with the
/// path the client shows: a skill's body names its base directory (here under the project:
/// `projectSettings:zeta`); a command's record names no source, so its text has no path line
/// (never an empty one).
#[test]
fn restored_skills_come_back_most_recent_first_with_the_clients_path() {
    let out = crate::support::run_yaml(
        r#"
name: skills-by-recency
world: {model: claude-sonnet-4-6, cwd: /repo}
script:
  - user: "<command-name>/alpha</command-name>"
  - attachment: {type: meta_prompt, text: "Alpha steps: lint, test.", skill: alpha}
  - assistant: [{text: "Alpha done."}]
  - wait: 1m
  - user: "<command-name>/zeta</command-name>"
  - attachment: {type: meta_prompt, text: "Base directory for this skill: /repo/.claude/skills/zeta\n\nZeta steps: build, tag.", skill: zeta}
  - assistant: [{text: "Zeta done."}]
  - compact: true
  - user: "And now?"
  - assistant: [{text: "Nothing left."}]
"#,
    );
    let last = serde_json::to_string(&out.requests.last().unwrap().messages).unwrap();
    let restored = &last[last.find("(invoked earlier)").expect("skills restored")..];
    let (alpha, zeta) = (restored.find("Alpha steps").unwrap(), restored.find("Zeta steps").unwrap());
    assert!(zeta < alpha, "zeta, invoked last, first: {restored}");
    assert!(restored.contains("Path: projectSettings:zeta"), "{restored}");
    assert_eq!(restored.matches("Path:").count(), 1, "{restored}");
}

/// Hit agreement does not turn on the 50% line when the read is the record's: a call that read
/// and wrote about half each agrees wherever its writes fall, as long as its read is within 2%
/// of the recorded read (`fidelity::READ_AGREES_WITHIN`). 9878 #0 wrote 49.5% recorded and 50.1%
/// through the agent, reading 22,033 and 22,037; 01M0EE57 #38 (after `/clear` and a manual
/// compaction) 47.9% and 50.2%, reading 30,461 and 30,464. Across the line with a read that
/// differs by more is still a disagreement (the rule is `fidelity::hit_agrees`).
#[test]
fn a_call_that_reads_what_the_record_read_agrees_whichever_side_of_half_it_writes() {
    let comparisons = |name: &str| {
        let (_, driven) = drive(name);
        ctxsim::replay::fidelity::fidelity_for_session(&driven.replay, &ModelTable::shipped(), true).calls
    };
    let call = |calls: &[ctxsim::replay::CallComparison], index: usize| {
        calls.iter().find(|c| c.index == index && c.lane == LANE_MAIN).unwrap_or_else(|| panic!("no compared call #{index}")).clone()
    };
    for (name, index) in [("entireio-cli/9878b713483d-0.full.jsonl", 0), ("entirecontext/01M0EE5721NRN8FGE1238MD50T-0.full.jsonl", 38)] {
        let c = call(&comparisons(name), index);
        let summary = format!("{name} #{index}: recorded read {} creation {} of {}, agent read {:.0} creation {:.0} of {}", c.recorded_cache_read, c.recorded_cache_creation, c.recorded_context, c.simulated_cache_read, c.simulated_cache_creation, c.simulated_context);
        // Near the line on both sides: the record below half, within 3 points of it.
        let (recorded_share, simulated_share) = (c.recorded_cache_creation as f64 / c.recorded_context as f64, c.simulated_cache_creation / c.simulated_context as f64);
        assert!((0.47..0.5).contains(&recorded_share) && (0.45..0.55).contains(&simulated_share), "{summary}");
        assert!((c.simulated_cache_read - c.recorded_cache_read as f64).abs() <= ctxsim::replay::fidelity::READ_AGREES_WITHIN * c.recorded_cache_read as f64, "{summary}");
        assert!(c.hit_agrees, "{summary}");
    }
}

/// Real sessions are measured by the lookback rule of their time (`LookbackRule::PerBlock` before
/// September 2026; docs/fidelity.md "The lookback of 2026"). Oh-my-posh 6d44 (2.1.209) #13 and
/// #14 follow replies of a thinking block and 11 parallel calls and of a text block and 10 (22
/// and 21 positions after the previous request's marker) and read only the prefix (38,577 of
/// 75,543 and 78,469): the agent, which read the whole previous request under the grouped
/// counting, now falls too. #11 (19 positions: a thinking block, 10 calls, the marker on the
/// result that completed last) and d847 #213 (20: two thinking blocks and 10 calls) read the
/// whole previous request in record and agent.
#[test]
fn parallel_calls_push_the_previous_entry_out_of_the_lookback_as_the_record_shows() {
    let comparisons = |name: &str| {
        let (_, driven) = drive(name);
        ctxsim::replay::fidelity::fidelity_for_session(&driven.replay, &ModelTable::shipped(), true).calls
    };
    let check = |calls: &[ctxsim::replay::CallComparison], index: usize, whole: bool| {
        let c = calls.iter().find(|c| c.index == index && c.lane == LANE_MAIN).unwrap_or_else(|| panic!("no compared call #{index}"));
        let summary = format!("#{index}: recorded read {} creation {}, agent read {:.0} creation {:.0}", c.recorded_cache_read, c.recorded_cache_creation, c.simulated_cache_read, c.simulated_cache_creation);
        assert!(c.hit_agrees, "{summary}");
        let (recorded, simulated) = (c.recorded_cache_read as f64 / c.recorded_context as f64, c.simulated_cache_read / c.simulated_context as f64);
        if whole {
            assert!(recorded > 0.9 && simulated > 0.9, "{summary}");
        } else {
            assert!(recorded < 0.5 && simulated < 0.5, "{summary}");
        }
    };
    let calls = comparisons("oh-my-posh/6d449f3da816-0.full.jsonl");
    check(&calls, 11, true);
    check(&calls, 13, false);
    check(&calls, 14, false);
    check(&calls, 15, true);
    check(&comparisons("oh-my-posh/d84718082c10-3.full.jsonl"), 213, true);
}

/// af1dd25e-8 (2.1.49) opens with `/clear`. After each of its automatic compactions the record
/// holds ~20k tokens more than the summary, the first call's memory and context and the files
/// the client's rule restores (the replay's anchor: 20.9k after #115, 19.3k after #161), which
/// the transcript does not show. The workload sizes it from the file's first compaction
/// (`world.restored_unrecorded`) and every compaction of the agent's restores it: #161, which
/// sized nothing, is within 4% of the record, and the session within the targets (MAPE 4%, p90
/// 8%). Before, the calls after #115 were 10–12% short and those after #161 18–29% (MAPE 9.25%,
/// p90 21.5%).
#[test]
fn a_file_cleared_into_restores_at_each_compaction_what_its_first_one_shows_beyond_the_file() {
    let (_, driven) = drive("cipher-box/af1dd25ebb3e-8.full.jsonl");
    let restored = driven.sizing.restored_unrecorded_tokens;
    assert!((19_000..23_000).contains(&restored), "{:?}", driven.sizing);
    assert_eq!(driven.compactions.iter().map(|c| c.before_call).collect::<Vec<_>>(), [115, 161]);
    let errors = context_errors(&driven);
    assert!(errors[&161].abs() < 0.04, "call 161: {errors:?}");
    assert_calls_within(&driven, 161, 63, 0.06);
    let report = ctxsim::replay::fidelity::fidelity_for_session(&driven.replay, &ModelTable::shipped(), true);
    assert!(report.context_tokens_mape < 0.04, "MAPE {}", report.context_tokens_mape);
    assert!(report.context_tokens_ape_p90 < 0.08, "p90 {}", report.context_tokens_ape_p90);
}

/// A file that opens with the summary of a compaction before it (0254, 2.1.219: boundary,
/// summary, restored files, listings, then the first reply) sends that summary in every request
/// until its next compaction, as the record's messages show. The workload drives it as the
/// opening prompt (the history stand-in before it); the agent's first call was 7.5k short
/// (−10.8%: the summary) where the replay's is exact.
#[test]
fn a_file_that_opens_with_an_earlier_compactions_summary_sends_it() {
    let (session, driven) = drive("oh-my-posh/0254bffa0c17-1.full.jsonl");
    assert!(driven.report.opening_summary);
    let workload = workload_from_session(&session, "0254", None).unwrap();
    let first = workload.scenario.script.iter().find_map(|s| match s {
        Step::User { text } => Some(text.clone()),
        _ => None,
    });
    assert!(first.is_some_and(|t| t.contains("This session is being continued from a previous conversation")));
    let errors = context_errors(&driven);
    let (_, first_error) = errors.iter().next().unwrap();
    assert!(first_error.abs() < 0.01, "{errors:?}");
}

/// A Windows client's recorded cwd (`D:\oh-my-posh`, `C:\Users\empad`) enters the workload as
/// MSYS spells it (`world.cwd`, which a scenario wants absolute), its case kept, so that the
/// skills the recorded client ran from its project are the project's (`projectSettings:…`, the
/// path the agent restores them with after a compaction, as the client showed them). Before, a
/// cwd not starting with `/` was dropped for the default `/repo`, and oh-my-posh's project skills
/// came out as the user's (`userSettings:…`). A POSIX cwd is kept as recorded.
#[test]
fn a_windows_recorded_cwd_keeps_the_projects_skills_the_projects() {
    let cases = [
        ("oh-my-posh/6d449f3da816-0.full.jsonl", "/d/oh-my-posh"),
        ("NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl", "/c/Users/empad"),
        ("entireio-cli/a6e4c2a0fbd1-0.full.jsonl", "/Users/soph/Work/entire/devenv/cli"),
    ];
    for (name, cwd) in cases {
        let session = load_session(&realdata().join("transcripts").join(name)).unwrap();
        let workload = workload_from_session(&session, name, None).unwrap();
        assert_eq!(workload.scenario.world.cwd, cwd, "{name}");
        assert_eq!(workload.document["world"]["cwd"], cwd, "{name}: the scenario `import --to scenario` writes");
        let skills: Vec<(String, Option<String>)> = workload
            .scenario
            .script
            .iter()
            .filter_map(|step| match step {
                Step::Attachment { skill: Some(skill), text, .. } if text.starts_with("Base directory for this skill:") => {
                    Some((skill.clone(), ctxsim::agent::skills::recorded_invoked_path(skill, text, &workload.scenario.world.cwd)))
                }
                _ => None,
            })
            .collect();
        if name.starts_with("oh-my-posh") {
            // 6d44 ran four skills from `D:\oh-my-posh\.claude\skills`.
            assert_eq!(skills.len(), 4, "{skills:?}");
            for (skill, path) in &skills {
                assert_eq!(path.as_deref(), Some(format!("projectSettings:{skill}").as_str()), "{skills:?}");
                assert_ne!(ctxsim::agent::skills::recorded_invoked_path(skill, &format!("Base directory for this skill: D:\\oh-my-posh\\.claude\\skills\\{skill}"), "/repo").as_deref(), path.as_deref());
            }
        }
    }
}

/// The agent's run keeps the events its sizing's record view saw before each recorded call
/// (`AgentReplay::record_events`), equal to those of a record view of its own under the default
/// options: `fidelity --breaks`/`--calls` names the breaks' causes and the calls' events from
/// them without reading the record a second time.
#[test]
fn the_agents_run_keeps_the_record_views_events() {
    for name in ["entireio-cli/a6e4c2a0fbd1-0.full.jsonl", "NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl"] {
        let (session, driven) = drive(name);
        let view = ctxsim::replay::record_view(&session, &mut measurer(), &ctxsim::replay::ReplayOptions::default());
        let expected: BTreeMap<usize, Vec<String>> = view.calls.into_iter().map(|c| (c.index, c.events)).collect();
        assert!(expected.values().flatten().any(|e| e == "ttl_expired"), "{name}: {expected:?}");
        assert_eq!(driven.record_events.as_ref(), Some(&expected), "{name}");
    }
}

/// A Windows client's transcript: cwd `D:\omp`, a Read of `D:\omp\src\banner.go`, then an Edit
/// of the same file spelled `d:/omp/src/banner.go` whose structured result carries no original
/// file, then a reply.
fn windows_transcript() -> String {
    let content = "package banner\n\nconst Text = \"old\"\n";
    let mut lines = Vec::new();
    let mut parent = serde_json::Value::Null;
    let mut record = |n: u64, kind: &str, message: serde_json::Value, extra: serde_json::Value| {
        let uuid = format!("00000000-0000-4000-8000-{n:012}");
        let mut line = serde_json::json!({
            "parentUuid": parent, "isSidechain": false, "userType": "external", "cwd": "D:\\omp", "sessionId": "win",
            "version": "2.1.39", "gitBranch": "main", "type": kind, "message": message, "uuid": uuid,
            "timestamp": format!("2026-01-07T10:00:{:02}Z", n * 2),
        });
        line.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        lines.push(line.to_string());
        parent = serde_json::Value::String(uuid);
    };
    let usage = |read: u64| serde_json::json!({ "input_tokens": 3, "cache_creation_input_tokens": 300, "cache_read_input_tokens": read, "output_tokens": 40 });
    let reply = |id: &str, content: serde_json::Value, stop: &str, read: u64| {
        serde_json::json!({ "id": id, "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": content, "stop_reason": stop, "usage": usage(read) })
    };
    record(1, "user", serde_json::json!({ "role": "user", "content": "Change the banner text to new." }), serde_json::json!({}));
    let read = serde_json::json!([{ "type": "tool_use", "id": "toolu_r", "name": "Read", "input": { "file_path": "D:\\omp\\src\\banner.go" } }]);
    record(2, "assistant", reply("msg_1", read, "tool_use", 12_000), serde_json::json!({ "requestId": "req_1" }));
    let file = serde_json::json!({ "filePath": "D:\\omp\\src\\banner.go", "content": content, "numLines": 3, "startLine": 1, "totalLines": 3 });
    let result = serde_json::json!([{ "type": "tool_result", "tool_use_id": "toolu_r", "content": "     1→package banner" }]);
    record(3, "user", serde_json::json!({ "role": "user", "content": result }), serde_json::json!({ "toolUseResult": { "type": "text", "file": file } }));
    let edit = serde_json::json!([{ "type": "tool_use", "id": "toolu_e", "name": "Edit", "input": { "file_path": "d:/omp/src/banner.go", "old_string": "old", "new_string": "new" } }]);
    record(4, "assistant", reply("msg_2", edit, "tool_use", 12_300), serde_json::json!({ "requestId": "req_2" }));
    let result = serde_json::json!([{ "type": "tool_result", "tool_use_id": "toolu_e", "content": "The file d:/omp/src/banner.go has been updated." }]);
    let structured = serde_json::json!({ "filePath": "d:/omp/src/banner.go", "oldString": "old", "newString": "new", "replaceAll": false });
    record(5, "user", serde_json::json!({ "role": "user", "content": result }), serde_json::json!({ "toolUseResult": structured }));
    record(6, "assistant", reply("msg_3", serde_json::json!([{ "type": "text", "text": "Done." }]), "end_turn", 12_600), serde_json::json!({ "requestId": "req_3" }));
    lines.join("\n") + "\n"
}

/// Issue 13 (fidwin): a Windows client's tool paths (`D:\omp\src\a.go`, `d:/omp/src/a.go`) name
/// the files under the cwd the workload runs in (`/d/omp`, `skills::msys_path`): the agent's fs
/// holds one `/d/omp/src/banner.go` (not `/d/omp/D:\omp\…` beside `/d/omp/d:/omp/…`), its
/// compaction restores that one file as edited, and the replay's file state and the loss judge's
/// re-reads take both spellings as one file.
#[test]
fn a_windows_clients_tool_paths_name_the_files_under_its_cwd() {
    let text = windows_transcript();
    let session = ctxsim::recording::import_claude_code_from(std::io::Cursor::new(text.as_bytes()), "win.jsonl").unwrap();
    let workload = workload_from_session(&session, "win.jsonl", None).unwrap();
    assert_eq!(workload.scenario.world.cwd, "/d/omp");
    // The Edit's content comes from the Read's under the other spelling: both calls show the file.
    assert_eq!(workload.report.files_shown, 2, "{:?}", workload.report);
    let shown: Vec<&serde_json::Value> = workload.document["script"].as_array().unwrap().iter().filter_map(|s| s["tool_output"].as_object()).flat_map(|o| o.values()).map(|o| &o["file"]).collect();
    assert_eq!(shown[1]["content"], "package banner\n\nconst Text = \"new\"\n", "{shown:?}");

    // The agent compacts after the session: its restore names the one file, edited.
    let mut document = workload.document.clone();
    let script = document["script"].as_array_mut().unwrap();
    let at = script.iter().position(|s| s.get("lane").is_some()).unwrap_or(script.len());
    let more = [
        serde_json::json!({ "compact": true }),
        serde_json::json!({ "user": "Anything left?" }),
        serde_json::json!({ "assistant": [{ "text": "No." }] }),
    ];
    script.splice(at..at, more);
    script.push(serde_json::json!({ "assistant": [{ "text": "<summary>The banner text was changed to new.</summary>" }], "lane": "compact" }));
    let scenario = ctxsim::scenario::parse_scenario_document(&document, "win.json").unwrap();
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let options = ctxsim::runner::RunOptions { keep_requests: true, ..Default::default() };
    let output = ctxsim::runner::run_scenario_opts(&scenario, &mut measurer(), &strategy, &ctxsim::agent::compact::chain::Chain::new(), options).unwrap();
    let last = output.rows.iter().zip(&output.requests).filter(|(r, _)| r.lane == LANE_MAIN).map(|(_, q)| q).last().unwrap();
    let body = serde_json::to_string(&last.messages).unwrap();
    assert_eq!(body.matches(r#"{\"file_path\":\"/d/omp/src/banner.go\"}"#).count(), 1, "{body}");
    assert!(body.contains(r#"const Text = \"new\""#), "{body}");
    assert!(!body.contains("/d/omp/D:") && !body.contains("/d/omp/d:"), "{body}");

    // The replay's file state: both spellings one file, restored once under the last spelling.
    let mut files = ctxsim::replay::working_set::WorkingSet::default();
    files.observe("Read", &serde_json::json!({ "file_path": "D:\\omp\\src\\banner.go" }), Some(&serde_json::json!({ "type": "text", "file": { "content": "a\n", "numLines": 1, "startLine": 1, "totalLines": 1 } })), false);
    files.observe("Write", &serde_json::json!({ "file_path": "d:/OMP/src/banner.go" }), Some(&serde_json::json!({ "content": "b\n" })), false);
    files.observe("Write", &serde_json::json!({ "file_path": "D:\\omp\\CLAUDE.md" }), Some(&serde_json::json!({ "content": "rules" })), false);
    assert_eq!(files.content_of("D:/omp/src/banner.go").as_deref().map(String::as_str), Some("b\n"));
    let restored = files.compact(Some("D:\\omp"), |t| t.len() as u64, ctxsim::agent::tools::exec::LineNumbers::Arrow);
    assert_eq!(restored.len(), 1, "{restored:?}");
    assert!(matches!(&restored[0], ctxsim::replay::working_set::Restored::File { path, .. } if path == "d:/OMP/src/banner.go"), "{restored:?}");
    // A POSIX client's paths keep their spelling.
    assert_eq!(ctxsim::agent::skills::tool_path("/repo/src/a.go"), "/repo/src/a.go");
    assert_eq!(ctxsim::agent::skills::tool_path("D:\\omp\\src\\a.go"), "/d/omp/src/a.go");
    assert_eq!(ctxsim::agent::tools::exec::absolute("/d/omp", "src\\a.go"), "/d/omp/src/a.go");
}
