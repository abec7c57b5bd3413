//! Recorded subagents drive the agent (issue 13, Deliver 1, "subagent files included"): each
//! Agent call of the main thread binds to the transcript that recorded its subagent, the agent
//! runs that subagent with its own machinery answered by the recorded replies, and
//! `fidelity --engine agent` scores its requests on their own lane.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ctxsim::api::{ContentBlock, Role};
use ctxsim::measure::{Calibration, EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::recording::EventKind;
use ctxsim::replay::load_session;
use ctxsim::replay::workload::{agent_replay, sized_workload, workload_from_session};
use ctxsim::scenario::Step;
use ctxsim::strategy::Strategy;

use crate::support::{real_transcripts, realdata};

fn measurer() -> Measurer {
    Measurer::new(ModelTable::shipped(), TokenCounter::with_calibration(EstimatorKind::Calibrated, Calibration::shipped())).without_body_hashes()
}

fn spotter() -> PathBuf {
    realdata().join("transcripts/spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl")
}

/// The real 2.1.332 run whose Agent call launched a background subagent (tests/data/api-requests).
const BACKGROUND: &str = "tests/data/api-requests/subagent/00000000-0000-4000-8000-000000000001.jsonl";

fn background() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(BACKGROUND)
}

/// What a recorded lane holds, in order: each reply's texts and tool_use ids, each result's id.
fn recorded_items(session: &ctxsim::recording::ImportedSession, lane: &str) -> Vec<String> {
    let mut items = Vec::new();
    for event in session.recording.events.iter().filter(|e| e.lane == lane) {
        match &event.kind {
            EventKind::ModelReply(reply) => {
                for block in &reply.content {
                    match block {
                        ContentBlock::Text { text, .. } => items.push(format!("text:{text}")),
                        ContentBlock::ToolUse { id, .. } => items.push(format!("tool_use:{id}")),
                        _ => {}
                    }
                }
            }
            EventKind::ToolResult(result) => items.push(format!("tool_result:{}", result.tool_use_id)),
            _ => {}
        }
    }
    items
}

/// The same items of a request's messages (read from the wire JSON: the agent may hold a block
/// in another in-memory form than the importer does).
fn request_items(messages: &[ctxsim::api::Message]) -> Vec<String> {
    let mut items = Vec::new();
    for message in messages {
        let json = serde_json::to_value(&message.content).unwrap();
        for block in json.as_array().into_iter().flatten() {
            let field = |key: &str| block[key].as_str().unwrap_or_default().to_owned();
            match block["type"].as_str() {
                Some("text") if message.role == Role::Assistant => items.push(format!("text:{}", field("text"))),
                Some("tool_use") => items.push(format!("tool_use:{}", field("id"))),
                Some("tool_result") => items.push(format!("tool_result:{}", field("tool_use_id"))),
                _ => {}
            }
        }
    }
    items
}

/// Every recorded subagent of the shipped data is bound to the Agent call that started it (none
/// left over), and every Agent call of the main threads is either driven or says why not.
#[test]
fn every_recorded_subagent_of_the_shipped_data_is_bound() {
    let mut files = real_transcripts();
    files.push(background());
    let (mut calls, mut driven, mut lanes) = (0, 0, 0);
    for path in &files {
        let session = load_session(path).unwrap();
        let workload = workload_from_session(&session, &path.display().to_string(), None).unwrap();
        let report = &workload.report;
        assert!(report.unbound_subagent_lanes.is_empty(), "{}: {:?}", path.display(), report.unbound_subagent_lanes);
        let recorded: Vec<&str> = session.recording.header.subagents.iter().filter(|s| s.lane.starts_with("subagent:")).map(|s| s.lane.as_str()).collect();
        lanes += recorded.len();
        for lane in &recorded {
            assert!(report.subagents.iter().any(|r| r.recorded_lane.as_deref() == Some(*lane)), "{}: {lane} unbound", path.display());
        }
        for run in &report.subagents {
            assert!(run.not_driven.is_some() || (run.replies > 0 && run.recorded_lane.is_some()), "{}: {run:?}", path.display());
        }
        calls += report.subagents.len();
        driven += report.subagents.iter().filter(|r| r.not_driven.is_none()).count();
        // A driven subagent's replies are scripted on the agent's lane for its type.
        let scripted = workload.scenario.script.iter().filter(|s| matches!(s, Step::Assistant(a) if a.lane.starts_with("subagent:"))).count();
        assert_eq!(scripted, workload.subagent_calls.len(), "{}", path.display());
    }
    // 52 Agent/Task calls in the 16 sessions (spotter's has its subagent file; the others'
    // transcripts were shipped without theirs), one in the 2.1.332 run.
    assert_eq!((calls, lanes, driven), (53, 2, 2));

    let session = load_session(&spotter()).unwrap();
    let workload = workload_from_session(&session, "spotter", None).unwrap();
    let run = &workload.report.subagents[0];
    assert_eq!(run.recorded_lane.as_deref(), Some("subagent:a881341"));
    assert_eq!(run.bound_by.as_deref(), Some("tool_use_id"));
    assert_eq!((run.agent_type.as_str(), run.replies, run.tool_outputs), ("claude-code-guide", 3, 2));
}

/// A call whose subagent file has no `.meta.json` binds by the agentId its result names, and with
/// neither by the prompt the subagent's transcript opens with.
#[test]
fn a_subagent_binds_by_agent_id_then_by_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let source = background();
    let stem = source.file_stem().unwrap().to_owned();
    let subagents = source.with_file_name(&stem).join("subagents");
    let copy_dir = dir.path().join(&stem).join("subagents");
    std::fs::create_dir_all(&copy_dir).unwrap();
    let sub = std::fs::read_dir(&subagents).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|e| e == "jsonl")).unwrap();
    std::fs::copy(&sub, copy_dir.join(sub.file_name().unwrap())).unwrap();
    let main = std::fs::read_to_string(&source).unwrap();
    let copy = dir.path().join(source.file_name().unwrap());
    let bound_by = |text: &str| {
        std::fs::write(&copy, text).unwrap();
        let session = load_session(&copy).unwrap();
        let workload = workload_from_session(&session, "copy", None).unwrap();
        assert!(workload.report.unbound_subagent_lanes.is_empty());
        workload.report.subagents[0].bound_by.clone()
    };
    assert_eq!(bound_by(&main).as_deref(), Some("agent_id"));
    let without_id: String = main.lines().map(|l| l.replace("\"agentId\":\"a05e8493a347f5203\",", "") + "\n").collect();
    assert_ne!(without_id, main);
    assert_eq!(bound_by(&without_id).as_deref(), Some("prompt"));
}

/// A driven subagent's requests carry its recorded messages in order: the agent builds them (its
/// own system prompt and tools for the subagent), the recorded replies answer them, and its tool
/// results come back by id. The main thread's call keeps its recorded result.
#[test]
fn a_driven_subagent_sends_its_recorded_messages_in_order() {
    let path = spotter();
    let session = load_session(&path).unwrap();
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let (workload, _) = sized_workload(&session, &path.display().to_string(), &measurer(), &strategy, false).unwrap();
    let options = ctxsim::runner::RunOptions { keep_requests: true, ..Default::default() };
    let output = ctxsim::runner::run_scenario_opts(&workload.scenario, &mut measurer(), &strategy, &ctxsim::agent::compact::chain::Chain::new(), options).unwrap();
    let requests: Vec<&ctxsim::api::Request> =
        output.rows.iter().zip(&output.requests).filter(|(r, _)| r.lane == "subagent:claude-code-guide").map(|(_, q)| q).collect();
    assert_eq!(requests.len(), 3);
    let recorded = recorded_items(&session, "subagent:a881341");
    // Request k carries the recorded items before the k-th reply; the last reply answers it.
    let last = requests.last().unwrap();
    let mut expected = recorded.clone();
    while expected.last().is_some_and(|i| i.starts_with("text:")) {
        expected.pop();
    }
    assert_eq!(request_items(&last.messages), expected);
    assert!(!expected.is_empty());
    for pair in requests.windows(2) {
        assert!(pair[1].messages.len() > pair[0].messages.len());
    }
    // The subagent's own request: its prompt is the Agent call's, its tools its definition's.
    let first = &requests[0];
    let tools: Vec<&str> = first.tools.iter().flatten().map(|t| t.name.as_str()).collect();
    assert!(tools.contains(&"WebFetch") && !tools.contains(&"Agent"), "{tools:?}");
    // The main thread's Agent call returned the recorded result, not the agent's own.
    let main_after = output
        .rows
        .iter()
        .zip(&output.requests)
        .filter(|(r, _)| r.lane == "main")
        .map(|(_, q)| serde_json::to_string(&q.messages).unwrap())
        .find(|text| text.contains("\"tool_use_id\":\"toolu_01VmaERAwhb19LGUwu9GenaK\""))
        .expect("a main request after the Agent call");
    assert!(main_after.contains("agentId: a881341 (for resuming"), "the recorded result names the recorded agent");
    assert!(!main_after.contains("keep it to send this agent more work later"));
}

/// Through the agent, the subagent's requests are paired with the recorded subagent calls and
/// scored on their own lane; the 1h TTL the recorded subagent wrote at is honoured.
#[test]
fn fidelity_through_the_agent_scores_the_subagent_lane() {
    let path = spotter();
    let session = load_session(&path).unwrap();
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let driven = agent_replay(&session, &path.display().to_string(), &mut measurer(), &strategy).unwrap();
    assert_eq!(driven.unpaired, 0);
    let subagent: Vec<_> = driven.replay.calls.iter().filter(|c| c.lane == "subagent:a881341").collect();
    assert_eq!(subagent.len(), 3);
    assert!(driven.replay.calls.iter().zip(driven.replay.calls.iter().skip(1)).all(|(a, b)| a.index < b.index));
    let lanes = ctxsim::replay::fidelity::lane_figures(&driven.replay, &ModelTable::shipped());
    assert_eq!(lanes.keys().map(String::as_str).collect::<Vec<_>>(), ["main", "subagent"]);
    let sub = &lanes["subagent"];
    assert_eq!(sub.requests_compared, 3);
    // The agent's own subagent prefix (system, tools) against the billed one, and the 1h writes.
    // The claude-code-guide prompt is sized from the record (the recorded first request less the
    // agent's own, `Sizing::subagent_prompt_filler_tokens`): without it the lane was 19.7% short.
    assert!(sub.context_tokens_mape < 0.05, "{sub:?}");
    assert!(sub.cost_error.abs() < 0.05, "{sub:?}");
    assert!(sub.hit_agreement > 0.99, "{sub:?}");
}

/// A driven subagent of a built-in type is sized as the main system prompt is: the recorded
/// client's first request of it (12,121 tokens on spotter's claude-code-guide) less the agent's
/// own first request of it, probed, is filler after the agent's prompt of that type
/// (`world.agent_prompt_extra`). Types no subagent runs as get none.
#[test]
fn a_driven_subagents_prompt_is_sized_from_its_recorded_first_request() {
    let path = spotter();
    let session = load_session(&path).unwrap();
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let (workload, sizing) = sized_workload(&session, &path.display().to_string(), &measurer(), &strategy, true).unwrap();
    let filler = sizing.subagent_prompt_filler_tokens.get("claude-code-guide").copied().unwrap_or(0);
    assert!((2_000..8_000).contains(&filler), "{:?}", sizing.subagent_prompt_filler_tokens);
    assert_eq!(sizing.subagent_prompt_filler_tokens.len(), 1, "{:?}", sizing.subagent_prompt_filler_tokens);
    assert_eq!(workload.scenario.world.agent_prompt_extra.keys().map(String::as_str).collect::<Vec<_>>(), ["claude-code-guide"]);
    // The agent's first subagent request now holds what the recorded one billed, within 3%.
    let driven = agent_replay(&session, &path.display().to_string(), &mut measurer(), &strategy).unwrap();
    let first = driven.replay.calls.iter().find(|c| c.lane == "subagent:a881341").unwrap();
    let recorded = first.recorded.prompt_tokens() as f64;
    let simulated = first.sim_input + first.sim_cache_read + first.sim_cache_creation;
    assert!((simulated - recorded).abs() / recorded < 0.03, "simulated {simulated} vs recorded {recorded}");
    // A session without driven subagents sizes none.
    let c644 = realdata().join("transcripts/cipher-box/c644f3afc869-1.full.jsonl");
    let session = load_session(&c644).unwrap();
    let (workload, sizing) = sized_workload(&session, &c644.display().to_string(), &measurer(), &strategy, true).unwrap();
    assert!(sizing.subagent_prompt_filler_tokens.is_empty() && workload.scenario.world.agent_prompt_extra.is_empty());
}

/// A 2.1.332 recording: the agent speaking 2.1.332 runs the subagent in the background and adds
/// its own task notification, so the recorded one is left to it; speaking 2.1.88 it runs it in
/// the foreground and the recorded notification stays a prompt. Either way its request is paired.
#[test]
fn a_background_subagent_of_2_1_332_is_driven() {
    let path = background();
    let session = load_session(&path).unwrap();
    let file = path.display().to_string();
    for (version, left) in [("2.1.332", 1), ("2.1.88", 0)] {
        let strategy = Strategy::resolve_with("claude-code", &[format!("client_version={version}")]).unwrap();
        let (workload, _) = sized_workload(&session, &file, &measurer(), &strategy, true).unwrap();
        assert_eq!(workload.report.left_to_agent.get("task_notification_of_driven_subagent").copied().unwrap_or(0), left, "{version}");
        let driven = agent_replay(&session, &file, &mut measurer(), &strategy).unwrap();
        assert_eq!(driven.unpaired, 0, "{version}");
        let lanes: BTreeMap<&str, usize> = driven.replay.calls.iter().fold(BTreeMap::new(), |mut m, c| {
            *m.entry(ctxsim::replay::fidelity::lane_group(&c.lane)).or_default() += 1;
            m
        });
        assert_eq!(lanes, BTreeMap::from([("main", 3), ("subagent", 1)]), "{version}");
        if version == "2.1.332" {
            let last = driven.replay.calls.iter().rev().find(|c| c.lane == "main").unwrap();
            assert!(last.events.iter().any(|e| e.starts_with("task_notification")), "{:?}", last.events);
        }
    }
}

/// `fidelity --engine agent` prints the figures per lane and what became of every Agent call.
#[test]
fn the_lane_table_of_fidelity_through_the_agent() {
    let spotter = spotter();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim"))
        .args(["fidelity", spotter.to_str().unwrap(), "../shared/realdata/transcripts/cipher-box/c644f3afc869-1.full.jsonl", "--engine", "agent"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let start = text.find("session (through the agent)").expect("the lane table");
    let table = &text[start..];
    let table = &table[..table.find("\n\n").unwrap_or(table.len())];
    insta::assert_snapshot!(table);
}

/// In a written scenario, `subagent: true` on an Agent call's output runs the subagent on its
/// lane (its replies scripted there) and returns the given output; without it the output stands
/// for the subagent and no subagent request is made. On another tool it is refused.
#[test]
fn a_subagent_output_runs_the_subagent_and_returns_the_recorded_result() {
    let yaml = |flag: &str| {
        format!(
            r#"
name: recorded-subagent
world:
  model: claude-sonnet-4-6
script:
  - user: "Have a subagent read the notes."
  - assistant:
      - tool_use: {{name: Agent, id: toolu_a, input: {{description: Notes, prompt: "Read the notes.", subagent_type: general-purpose}}}}
  - tool_output:
      toolu_a: {{content: "The recorded answer: ship on Friday."{flag}}}
  - assistant:
      - text: "They say to ship on Friday."
  - assistant:
      - text: "The notes say to ship on Friday."
    lane: subagent:general-purpose
"#
        )
    };
    let driven = crate::support::run_yaml(&yaml(", subagent: true"));
    assert_eq!(crate::support::lanes(&driven), ["main", "subagent:general-purpose", "main"]);
    let text = serde_json::to_string(&driven.requests[2].messages).unwrap();
    assert!(text.contains("The recorded answer: ship on Friday.") && !text.contains("agentId:"), "{text}");
    // The output alone stands for the subagent: no subagent request.
    let plain = crate::support::run_yaml(&yaml(""));
    assert_eq!(crate::support::lanes(&plain), ["main", "main"]);

    let refused = yaml(", subagent: true").replace("name: Agent", "name: Bash").replace("{description: Notes, prompt: \"Read the notes.\", subagent_type: general-purpose}", "{command: ls}");
    let error = ctxsim::scenario::parse_scenario(&refused, "inline.yaml").unwrap_err().to_string();
    assert!(error.contains("subagent") && error.contains("Bash"), "{error}");
}

/// A transcript (2.1.39, sidechain records in the main file) whose one reply makes two Agent
/// calls of one type: the first (`toolu_first`, its subagent `a1` billed `first_prompt` tokens on
/// its first request) has no recorded result, the second (`toolu_second`, `b2`, `second_prompt`)
/// has one naming its agent.
fn two_subagents_of_one_type(first_prompt: u64, second_prompt: u64) -> String {
    use serde_json::json;
    let mut lines = Vec::new();
    let mut n = 0u64;
    let mut record = |kind: &str, message: serde_json::Value, extra: serde_json::Value, parent: Option<String>, second: u64| {
        n += 1;
        let uuid = format!("00000000-0000-4000-8000-{n:012}");
        let mut line = json!({
            "parentUuid": parent, "isSidechain": false, "userType": "external", "cwd": "/repo", "sessionId": "two",
            "version": "2.1.39", "gitBranch": "main", "type": kind, "message": message, "uuid": uuid,
            "timestamp": jiff::Timestamp::from_second(1_767_780_000 + second as i64).unwrap().to_string(),
        });
        line.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        lines.push(line.to_string());
        uuid
    };
    let usage = |creation: u64| json!({ "input_tokens": 3, "cache_creation_input_tokens": creation, "cache_read_input_tokens": 0, "output_tokens": 40 });
    let reply = |id: &str, content: serde_json::Value, stop: &str, creation: u64| {
        json!({ "id": id, "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": content, "stop_reason": stop, "usage": usage(creation) })
    };
    let agent = |id: &str, prompt: &str| json!({ "type": "tool_use", "id": id, "name": "Agent", "input": { "description": "Look", "prompt": prompt, "subagent_type": "general-purpose" } });
    let prompt = record("user", json!({ "role": "user", "content": "Look at the repo twice." }), json!({}), None, 0);
    let calls = record(
        "assistant",
        reply("msg_main_1", json!([agent("toolu_first", "Look at the first half."), agent("toolu_second", "Look at the second half.")]), "tool_use", 20_000),
        json!({ "requestId": "req_main_1" }),
        Some(prompt),
        2,
    );
    for (agent_id, text, tokens, at) in [("a1", "Look at the first half.", first_prompt, 3), ("b2", "Look at the second half.", second_prompt, 5)] {
        let sidechain = json!({ "isSidechain": true, "agentId": agent_id });
        let asked = record("user", json!({ "role": "user", "content": text }), sidechain.clone(), None, at);
        let answer = json!([{ "type": "text", "text": format!("The {agent_id} half holds a parser.") }]);
        record("assistant", reply(&format!("msg_{agent_id}"), answer, "end_turn", tokens), json!({ "requestId": format!("req_{agent_id}"), "isSidechain": true, "agentId": agent_id }), Some(asked), at + 1);
    }
    let result = json!({ "type": "tool_result", "tool_use_id": "toolu_second", "content": [{ "type": "text", "text": "The b2 half holds a parser." }] });
    let returned = record(
        "user",
        json!({ "role": "user", "content": [result] }),
        json!({ "toolUseResult": { "status": "completed", "agentId": "b2", "content": [{ "type": "text", "text": "The b2 half holds a parser." }] } }),
        Some(calls),
        8,
    );
    record("assistant", reply("msg_main_2", json!([{ "type": "text", "text": "Both halves hold parsers." }]), "end_turn", 400), json!({ "requestId": "req_main_2" }), Some(returned), 10);
    lines.join("\n") + "\n"
}

/// Two subagents of one type share the agent's lane: the type's prompt is sized from the first
/// subagent that can be probed with its own recorded request, Agent call and reply. Here the
/// first has no recorded result, so the second sizes it: the filler is its recorded request less
/// the agent's, below what the first billed (before, the lane's first recorded request, the other
/// subagent's, was taken with the second's Agent call).
#[test]
fn two_subagents_of_one_type_are_sized_each_from_its_own_record() {
    let (first, second) = (90_000u64, 40_000u64);
    let text = two_subagents_of_one_type(first, second);
    let session = ctxsim::recording::import_claude_code_from(std::io::Cursor::new(text.as_bytes()), "two.jsonl").unwrap();
    let strategy = Strategy::resolve_with("claude-code", &[]).unwrap();
    let (workload, sizing) = sized_workload(&session, "two.jsonl", &measurer(), &strategy, true).unwrap();
    let runs: Vec<(&str, Option<&str>, usize)> =
        workload.report.subagents.iter().map(|r| (r.tool_use_id.as_str(), r.recorded_lane.as_deref(), r.replies)).collect();
    assert_eq!(runs, [("toolu_first", Some("subagent:a1"), 1), ("toolu_second", Some("subagent:b2"), 1)]);
    let lane_calls: Vec<(&str, &str)> = workload.subagent_calls.iter().map(|c| (c.lane.as_str(), c.tool_use_id.as_str())).collect();
    assert_eq!(lane_calls, [("subagent:general-purpose", "toolu_first"), ("subagent:general-purpose", "toolu_second")]);
    let filler = sizing.subagent_prompt_filler_tokens.get("general-purpose").copied().unwrap_or(0);
    assert!(filler > 0 && filler < second, "sized from the second subagent's {second} tokens, not the first's {first}: {filler}");
    assert_eq!(workload.scenario.world.agent_prompt_extra.keys().map(String::as_str).collect::<Vec<_>>(), ["general-purpose"]);
    // The same transcript with the two subagents' records swapped moves the filler by the
    // difference: each is read from its own subagent.
    let (_, swapped) = sized_workload(
        &ctxsim::recording::import_claude_code_from(std::io::Cursor::new(two_subagents_of_one_type(second, first).as_bytes()), "two.jsonl").unwrap(),
        "two.jsonl",
        &measurer(),
        &strategy,
        true,
    )
    .unwrap();
    let moved = swapped.subagent_prompt_filler_tokens["general-purpose"].abs_diff(filler);
    assert!(moved.abs_diff(first - second) < 1_000, "{filler} then {:?}", swapped.subagent_prompt_filler_tokens);
}
