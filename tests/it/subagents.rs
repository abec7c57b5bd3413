//! The Agent tool: subagents with their own lane, request building and tool loop; agent
//! definitions from built-ins, project and user directories and plugins (real data included).

use ctxsim::agent::agents::{AgentCatalog, AgentSource, parse_agent, resolve_model};
use ctxsim::api::Request;
use ctxsim::measure::RequestMetrics;
use ctxsim::runner::{RunOutput, run_scenario};
use ctxsim::scenario::{load_scenario, parse_scenario};
use ctxsim::strategy::Strategy;
use ctxsim::world::{Clock, VirtualFs};
use proptest::prelude::*;
use serde_json::Value;

use crate::support::{measurer, realdata};

fn check_run(yaml: &str) -> RunOutput {
    crate::support::run_yaml(yaml)
}

/// An inline scenario that mounts real directories: written under the test target's scratch
/// directory so the loader resolves its mounts (given as absolute paths).
fn check_run_mounted(name: &str, yaml: &str) -> RunOutput {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("subagents");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    let scenario = load_scenario(&path).unwrap_or_else(|e| panic!("{e}"));
    run_scenario(&scenario, &mut measurer(), &Strategy::default()).unwrap_or_else(|e| panic!("{e}"))
}

fn check_lanes(output: &RunOutput, expected: &[&str]) {
    assert_eq!(crate::support::lanes(output), expected);
}

/// Row `later` extends row `earlier` of the same conversation: no divergence, and it reads at
/// least everything `earlier` sent.
fn check_reads_previous(output: &RunOutput, earlier: usize, later: usize) {
    let (a, b): (&RequestMetrics, &RequestMetrics) = (&output.rows[earlier], &output.rows[later]);
    assert_eq!(b.prefix.diverged_at, None, "row {later} diverged from row {earlier}: {:?}", b.prefix);
    assert!(b.cache_read_input_tokens >= a.context_tokens, "row {later} read {} < row {earlier}'s {}", b.cache_read_input_tokens, a.context_tokens);
    assert!(!b.cache_break);
}

fn system_markers(request: &Request) -> Vec<Option<String>> {
    request.system_blocks().iter().map(|b| b.cache_control.as_ref().map(|c| serde_json::to_string(c).unwrap())).collect()
}

fn tool_names(request: &Request) -> Vec<&str> {
    request.tools().iter().map(|t| t.name.as_str()).collect()
}

fn json_of<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap()
}

/// The texts of the block-list tool_result (the Agent result) in a request's last message.
fn agent_result(request: &Request) -> Vec<String> {
    let last: Value = serde_json::to_value(request.messages.last().unwrap()).unwrap();
    let result = last["content"]
        .as_array()
        .and_then(|blocks| blocks.iter().find(|b| b["type"] == "tool_result" && b["content"].is_array()))
        .unwrap_or_else(|| panic!("no block-list tool_result in {last}"));
    result["content"].as_array().unwrap().iter().map(|b| b["text"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn subagent_scenario_has_its_own_lane_request_and_cache() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/subagent.yaml");
    let output = run_scenario(&load_scenario(&path).unwrap(), &mut measurer(), &Strategy::default()).unwrap();
    let explore = "subagent:Explore";
    check_lanes(&output, &["main", explore, explore, explore, "main", "main", explore, explore, "main"]);

    // The subagent's second request reads its first, and its third its second.
    check_reads_previous(&output, 1, 2);
    check_reads_previous(&output, 2, 3);
    // The parent's request after the tool_result reads the parent's own prefix.
    check_reads_previous(&output, 0, 4);
    assert_eq!(output.summary.cache_breaks, 0);

    // Its own request: Haiku, three system blocks (identity and rest org-scoped), no thinking,
    // temperature 1, the Explore tool set inline (Haiku takes no tool_reference).
    let first = &output.requests[1];
    assert_eq!(first.model, "claude-haiku-4-5-20251001");
    let org = Some(r#"{"type":"ephemeral"}"#.to_owned());
    assert_eq!(system_markers(first), vec![None, org.clone(), org]);
    assert!(first.system_blocks()[2].text.contains("<env>\nWorking directory: /repo\nIs directory a git repo: Yes\n"));
    assert_eq!((first.thinking.as_deref(), first.context_management.as_deref(), first.temperature.as_deref()), (None, None, Some(&serde_json::json!(1))));
    let tools = tool_names(first);
    assert!(tools.contains(&"Grep") && tools.contains(&"Read") && tools.contains(&"Bash"), "{tools:?}");
    for absent in ["Agent", "Edit", "Write", "NotebookEdit", "ExitPlanMode", "AskUserQuestion", "ToolSearch"] {
        assert!(!tools.contains(&absent), "{absent} in {tools:?}");
    }
    // One user message: the user context without claudeMd (Explore omits it), then the prompt.
    assert_eq!(first.messages.len(), 1);
    let opening = json_of(&first.messages[0]);
    assert!(opening.contains("currentDate") && !opening.contains("Project notes"), "{opening}");
    assert!(opening.ends_with(r#"and what it returns.","cache_control":{"type":"ephemeral"}}]}"#), "{opening}");
    // The skill listing first arrives after the first tool round, folded into the tool_result.
    let second = json_of(&output.requests[2].messages[2]);
    assert!(second.contains("parse_config") && second.contains("Skills you can run with the Skill tool"), "{second}");

    // The final text comes back to the parent, with the agent id and usage line.
    let result = agent_result(&output.requests[4]);
    assert_eq!(result.len(), 2);
    assert!(result[0].starts_with("parse_config in /repo/src/config.rs:5"));
    assert!(result[1].starts_with("agentId: a") && result[1].contains("\n<usage>total_tokens: ") && result[1].ends_with("tool_uses: 2\nduration_ms: 4000</usage>"), "{}", result[1]);
    // The main thread keeps its own request shape.
    assert!(output.requests[4].thinking.is_some());
    assert_eq!(output.requests[4].system_blocks().len(), 4);

    // A second Explore agent starts its lane afresh, yet reads the tools and system the first
    // one cached.
    assert_eq!(output.rows[6].prefix.diverged_at, None);
    assert!(output.rows[6].cache_read_input_tokens > 0 && !output.rows[6].cache_break);
    let lanes = &output.summary.lanes;
    assert_eq!(lanes.keys().collect::<Vec<_>>(), ["main", explore]);
    assert_eq!((lanes["main"].requests, lanes[explore].requests), (4, 5));
    assert_eq!(lanes[explore].cache_breaks, 0);
    assert!(lanes[explore].cache_hit_ratio > 0.5);
}

/// A project mounted from real data (confluence-md, with its `.claude/agents` definitions).
fn realdata_project(script: &str) -> String {
    let mount = realdata().join("claude_md/confluence-md");
    format!("name: t\nworld:\n  model: claude-sonnet-4-5\n  cwd: /proj\n  mount:\n    - {{from: {}, at: /proj}}\nscript:\n{script}", mount.display())
}

#[test]
fn project_agent_from_real_data_runs_with_its_tools_model_and_prompt() {
    let yaml = realdata_project(
        r#"  - user: "Run the tests"
  - assistant:
      - tool_use: {name: Agent, input: {description: Run tests, prompt: "Run the unit tests and summarize failures.", subagent_type: test-runner}}
  - assistant:
      - tool_use: {name: Bash, input: {command: "npm test"}}
    lane: subagent:test-runner
  - tool_output: {Bash: "Tests: 42 passed"}
  - assistant:
      - text: "All 42 tests pass."
    lane: subagent:test-runner
  - assistant:
      - text: "Tests are green."
"#,
    );
    let output = check_run_mounted("project_agent", &yaml);
    check_lanes(&output, &["main", "subagent:test-runner", "subagent:test-runner", "main"]);
    let first = &output.requests[1];
    // `tools: Bash, Read, Grep` and `model: haiku` from the real file.
    assert_eq!(tool_names(first), ["Bash", "Grep", "Read"]);
    assert_eq!(first.model, "claude-haiku-4-5-20251001");
    assert!(first.system_blocks()[2].text.starts_with("# Test Runner Agent\n\nYou are a test execution specialist"));
    // A custom agent keeps claudeMd in its user context.
    assert!(json_of(&first.messages[0]).contains("Contents of /proj/CLAUDE.md"));
    // The scripted Bash output reached the agent.
    assert!(json_of(&output.requests[2].messages).contains("Tests: 42 passed"));
    assert_eq!(agent_result(&output.requests[3])[0], "All 42 tests pass.");
    // The main thread's Agent description lists the project's agents after the built-ins.
    let agent_tool = output.requests[0].tools().iter().find(|t| t.name == "Agent").unwrap();
    let description = agent_tool.description.as_deref().unwrap();
    let listing = description.rsplit_once("Agent types and the tools each has:\n").unwrap().1;
    let types: Vec<&str> = listing.lines().map(|l| l.trim_start_matches("- ").split(':').next().unwrap()).collect();
    assert_eq!(types, ["general-purpose", "statusline-setup", "Explore", "Plan", "build-validator", "test-runner"]);
    assert!(listing.contains("- test-runner: Run tests and analyze results. Use after code changes to verify nothing is broken. (Tools: Bash, Read, Grep)"));
}

#[test]
fn plugin_agent_from_real_data_maps_legacy_tool_names() {
    let plugin = realdata().join("plugins/claude-plugins-official/plugins/feature-dev");
    let yaml = format!(
        r#"name: t
world:
  model: claude-opus-4-6
  cwd: /repo
  files: {{/repo/a.rs: "fn a() {{}}\n"}}
  mount:
    - {{from: {}, at: /plugins/feature-dev}}
  plugins: [/plugins/feature-dev]
script:
  - user: "Explore the code"
  - assistant:
      - tool_use: {{name: Agent, input: {{description: Explore, prompt: "Trace how a.rs works.", subagent_type: "feature-dev:code-explorer"}}}}
  - assistant:
      - text: "a() does nothing."
    lane: "subagent:feature-dev:code-explorer"
  - assistant:
      - text: "It is empty."
"#,
        plugin.display()
    );
    let output = check_run_mounted("plugin_agent", &yaml);
    check_lanes(&output, &["main", "subagent:feature-dev:code-explorer", "main"]);
    let request = &output.requests[1];
    // `model: sonnet` resolves to the alias's model even under an Opus parent.
    assert_eq!(request.model, "claude-sonnet-4-6");
    // LS → Glob, NotebookRead → Read, BashOutput/KillShell → tools no subagent gets; Sonnet
    // takes tool_reference but ToolSearch is not in the agent's list, so no tool search.
    assert_eq!(tool_names(request), ["Glob", "Grep", "Read", "TodoWrite", "WebFetch", "WebSearch"]);
    assert!(request.system_blocks()[2].text.starts_with("You are an expert code analyst"));
}

#[test]
fn agent_errors_are_tool_results_and_a_missing_lane_is_a_script_error() {
    let yaml = r#"name: t
world:
  model: claude-sonnet-4-5
script:
  - user: "go"
  - assistant:
      - tool_use: {name: Agent, input: {description: x, prompt: "do it", subagent_type: nobody}}
      - tool_use: {name: Agent, input: {description: y, prompt: "  "}}
  - assistant:
      - text: "Could not start them."
"#;
    let output = check_run(yaml);
    check_lanes(&output, &["main", "main"]);
    let results = json_of(output.requests[1].messages.last().unwrap());
    assert!(results.contains("There is no agent type `nobody`. The agent types are: general-purpose, statusline-setup, Explore, Plan."), "{results}");
    assert!(results.contains("An agent needs a prompt"), "{results}");
    assert_eq!(results.matches(r#""is_error":true"#).count(), 2, "{results}");

    let missing = r#"name: t
world:
  model: claude-sonnet-4-5
script:
  - user: "go"
  - assistant:
      - tool_use: {name: Agent, input: {description: x, prompt: "do it"}}
  - assistant:
      - text: "done"
"#;
    let scenario = parse_scenario(missing, "missing.yaml").unwrap();
    let err = run_scenario(&scenario, &mut measurer(), &Strategy::default()).unwrap_err().to_string();
    assert!(err.starts_with("missing.yaml: script[1]: ") && err.contains("subagent:general-purpose"), "{err}");
}

#[test]
fn subagent_hooks_start_context_stop_feedback_and_max_turns() {
    let yaml = r#"name: t
world:
  model: claude-sonnet-4-5
  files:
    /repo/.claude/agents/checker.md: |
      ---
      name: checker
      description: Checks one thing
      tools: Read
      maxTurns: 3
      hooks:
        Stop:
          - hooks: [{type: command, command: verify.sh}]
      ---
      You check files.
    /repo/a.txt: "alpha\n"
  hook_answers:
    - {event: SubagentStart, matcher: checker, additional_context: "The checker must cite line numbers."}
    - {event: SubagentStop, command: verify.sh, exit_code: 2, stderr: "cite a line"}
script:
  - user: "check a.txt"
  - assistant:
      - tool_use: {name: Agent, input: {description: check, prompt: "Check a.txt", subagent_type: checker}}
  - assistant:
      - text: "a.txt is fine."
    lane: subagent:checker
  - assistant:
      - text: "a.txt:1 says alpha."
    lane: subagent:checker
  - assistant:
      - tool_use: {name: Read, input: {file_path: /repo/a.txt}}
    lane: subagent:checker
  - assistant:
      - text: "never reached: maxTurns is 3"
    lane: subagent:checker
  - assistant:
      - text: "Checked."
"#;
    let output = check_run(yaml);
    let checker = "subagent:checker";
    check_lanes(&output, &["main", checker, checker, checker, "main"]);
    // SubagentStart context opens the agent's conversation.
    assert!(json_of(&output.requests[1].messages[0]).contains("SubagentStart hook additional context: The checker must cite line numbers."));
    // The frontmatter Stop hook is a SubagentStop hook: blocking sends the agent back to work.
    assert!(json_of(&output.requests[2].messages).contains("SubagentStop hook feedback:\\n[verify.sh]: cite a line"));
    // The third call is the last (maxTurns 3): its Read ran, and no text came back.
    let result = agent_result(&output.requests[4]);
    assert_eq!(result.len(), 1, "{result:?}");
    assert!(result[0].contains("tool_uses: 1\n"), "{}", result[0]);
}

#[test]
fn agent_definitions_parse_override_and_resolve_models() {
    let clock = Clock::new(0);
    let mut fs = VirtualFs::new();
    fs.load_from_dir(&realdata().join("plugins/claude-plugins-official/plugins/hookify/agents"), "/home/user/.claude/agents", &clock).unwrap();
    fs.seed("/repo/.claude/agents/Explore.md", "---\nname: Explore\ndescription: Our own explorer\nmodel: opus\nfavorite: 7\n---\nExplore our way.\n", &clock).unwrap();
    fs.seed("/repo/.claude/agents/broken.md", "---\ndescription: no name\n---\nbody\n", &clock).unwrap();
    fs.seed("/repo/.claude/agents/turns.md", "---\nname: t\ndescription: d\nmaxTurns: many\n---\n", &clock).unwrap();
    let catalog = AgentCatalog::load(&fs, "/home/user/.claude", "/repo", "/etc/claude-code", &[], false);
    let types: Vec<&str> = catalog.agents.iter().map(|a| a.agent_type.as_str()).collect();
    // The project's Explore replaces the built-in in its place; the user agent comes after.
    assert_eq!(types, ["general-purpose", "statusline-setup", "Explore", "Plan", "conversation-analyzer"]);
    let explore = catalog.find("Explore").unwrap();
    assert_eq!((explore.source, explore.prompt.as_str(), explore.omit_claude_md), (AgentSource::Project, "Explore our way.", false));
    assert_eq!(explore.extra["favorite"], Value::from(7));
    let analyzer = catalog.find("conversation-analyzer").unwrap();
    assert_eq!(analyzer.source, AgentSource::User);
    assert_eq!(analyzer.tools_description(), "Read, Grep");
    assert_eq!(analyzer.model, None, "`inherit` is the parent's model");
    assert_eq!(catalog.warnings.len(), 2, "{:?}", catalog.warnings);
    assert!(catalog.warnings.iter().any(|w| w == "/repo/.claude/agents/broken.md: frontmatter field `name` is missing"));
    assert!(catalog.warnings.iter().any(|w| w.starts_with("/repo/.claude/agents/turns.md: frontmatter field `maxTurns` must be a positive integer")));

    let env = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    let parent = "claude-sonnet-4-5";
    assert_eq!(resolve_model(analyzer, None, parent, &env(&[])), parent);
    assert_eq!(resolve_model(explore, None, parent, &env(&[])), "claude-opus-4-6");
    assert_eq!(resolve_model(explore, Some("haiku"), parent, &env(&[])), "claude-haiku-4-5-20251001");
    assert_eq!(resolve_model(explore, Some("haiku"), parent, &env(&[("ANTHROPIC_DEFAULT_HAIKU_MODEL", "claude-3-5-haiku")])), "claude-3-5-haiku");
    assert_eq!(resolve_model(explore, Some("haiku"), parent, &env(&[("CLAUDE_CODE_SUBAGENT_MODEL", "claude-opus-4-5")])), "claude-opus-4-5");

    let all = parse_agent("---\nname: x\ndescription: d\ntools: '*'\ndisallowedTools: [Bash]\n---\n", "x.md", AgentSource::User, None).unwrap();
    assert_eq!(all.tools_description(), "All tools except Bash");
    assert!(!all.allows_tool("Bash") && !all.allows_tool("Agent") && all.allows_tool("mcp__jira__search"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// However many tool rounds a subagent makes, each of its requests extends the previous one
    /// and reads it from cache, and the parent's next request reads the parent's prefix.
    #[test]
    fn every_subagent_request_extends_its_previous_one(rounds in prop::collection::vec(0usize..3, 1..5)) {
        let mut script = String::from("  - user: \"look around\"\n  - assistant:\n      - tool_use: {name: Agent, input: {description: look, prompt: \"Look at the repository and report.\", subagent_type: general-purpose}}\n");
        for (i, kind) in rounds.iter().enumerate() {
            let call = match kind {
                0 => "{name: Read, input: {file_path: /repo/src/lib.rs}}".to_owned(),
                1 => format!("{{name: Grep, input: {{pattern: \"fn f{i}\", path: /repo}}}}"),
                _ => "{name: Glob, input: {pattern: \"**/*.rs\"}}".to_owned(),
            };
            script.push_str(&format!("  - assistant:\n      - tool_use: {call}\n    lane: subagent:general-purpose\n"));
        }
        script.push_str("  - assistant:\n      - text: \"Done looking.\"\n    lane: subagent:general-purpose\n  - assistant:\n      - text: \"Reported.\"\n");
        let yaml = format!("name: p\nworld:\n  model: claude-sonnet-4-5\n  files:\n    /repo/src/lib.rs: \"pub fn f0() {{}}\\npub fn f1() {{}}\\n\"\nscript:\n{script}");
        let output = check_run(&yaml);
        let n = rounds.len() + 1;
        prop_assert_eq!(output.rows.len(), n + 2);
        for i in 2..=n {
            check_reads_previous(&output, i - 1, i);
        }
        check_reads_previous(&output, 0, n + 1);
    }
}

// ---- agent_listing_delta ---------------------------------------------------------------------

#[test]
fn agent_listing_delta_announces_initial_new_and_removed_types() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/agent-listing-delta.yaml");
    let output = run_scenario(&load_scenario(&path).unwrap(), &mut measurer(), &Strategy::default()).unwrap();
    check_lanes(&output, &["main", "main", "subagent:reviewer", "subagent:reviewer", "main", "main"]);
    assert_eq!(output.summary.cache_breaks, 0);
    // The description no longer lists the types; it says where they are.
    let description = output.requests[0].tools().iter().find(|t| t.name == "Agent").unwrap().description.clone().unwrap();
    assert!(description.ends_with("The agent types you can start are listed in system reminders in the conversation."));
    assert!(!description.contains("- general-purpose:"));
    // Turn 1: every type, sorted as localeCompare sorts, with the concurrency note.
    let first = json_of(&output.requests[0].messages[1]);
    use ctxsim::agent::wording::{Part, CLIENT_2_1_88 as W};
    let initial = first.split(&format!("{}\\n", W.text(Part::AgentsInitial))).nth(1).expect("initial header").split("\\n</system-reminder>").next().unwrap();
    let types: Vec<&str> = initial.split("\\n").take_while(|l| l.starts_with("- ")).map(|l| l[2..].split(':').next().unwrap()).collect();
    assert_eq!(types, ["Explore", "general-purpose", "Plan", "statusline-setup"]);
    assert!(initial.ends_with(&W.text(Part::AgentsConcurrency)), "{initial}");
    // Turn 2: the agent written between turns is new; the others are not repeated.
    let second = json_of(&output.requests[1].messages);
    assert!(second.contains(&format!("{}\\n- reviewer: Reviews a diff for bugs and style (Tools: Read, Grep, Glob)", W.text(Part::AgentsNew))), "{second}");
    assert_eq!(second.matches(W.text(Part::AgentsInitial).as_str()).count(), 1);
    // It can be started at once, with its tools and the parent's model (`inherit`).
    assert_eq!(tool_names(&output.requests[2]), ["Glob", "Grep", "Read"]);
    assert_eq!(output.requests[2].model, "claude-sonnet-4-6");
    // A subagent without the Agent tool gets no listing.
    assert!(!json_of(&output.requests[2].messages).contains(W.text(Part::AgentsInitial).as_str()));
    // Turn 3: removed.
    let last = json_of(output.requests[5].messages.last().unwrap());
    assert!(last.contains(&format!("{}\\n- reviewer", W.text(Part::AgentsRemoved))), "{last}");
}

#[test]
fn agent_description_is_frozen_at_first_request_and_compaction_reannounces_the_listing() {
    // Default mode: the description keeps its first listing, the new agent still runs.
    let yaml = r#"name: t
world:
  model: claude-sonnet-4-5
script:
  - user: "hello there"
  - assistant:
      - text: "Hi."
  - write_file: {path: /repo/.claude/agents/late.md, content: "---\nname: late\ndescription: Arrives late\n---\nYou arrived late.\n"}
  - user: "start the late agent"
  - assistant:
      - tool_use: {name: Agent, input: {description: late, prompt: "Say hi.", subagent_type: late}}
  - assistant:
      - text: "hi"
    lane: subagent:late
  - assistant:
      - text: "It said hi."
"#;
    let output = check_run(yaml);
    check_lanes(&output, &["main", "main", "subagent:late", "main"]);
    let agent_json = |i: usize| json_of(output.requests[i].tools().iter().find(|t| t.name == "Agent").unwrap());
    assert_eq!(agent_json(0), agent_json(3));
    assert!(!agent_json(3).contains("- late:"));
    assert_eq!(output.rows[1].prefix.diverged_at, None);

    // Delta mode: a full compaction re-announces every type in the rebuilt history.
    let yaml = r#"name: t
world:
  model: claude-sonnet-4-5
  env: {CLAUDE_CODE_AGENT_LIST_IN_MESSAGES: 1}
script:
  - user: "first question"
  - assistant:
      - text: "First answer."
    usage: {input_tokens: 10, cache_read_input_tokens: 166000, cache_creation_input_tokens: 1000, output_tokens: 100}
  - user: "second question"
  - assistant:
      - text: "<summary>The user asked two questions.</summary>"
    lane: compact
  - assistant:
      - text: "Second answer."
"#;
    let output = check_run(yaml);
    check_lanes(&output, &["main", "compact", "main"]);
    let after = json_of(&output.requests[2].messages);
    let header = ctxsim::agent::wording::CLIENT_2_1_88.text(ctxsim::agent::wording::Part::AgentsInitial);
    assert_eq!(after.matches(header.as_str()).count(), 1, "{after}");
    assert!(after.contains("- statusline-setup:"));
}

/// A 2.1.332 session whose main thread launches a general-purpose agent, runs the tests while
/// it works, and ends its turn; the agent reads calc.py and answers.
pub(crate) const BACKGROUND_332: &str = r##"
name: background-332
world:
  model: claude-opus-5-5
  context_window: 1000000
  cwd: /proj
  env: {ANTHROPIC_BASE_URL: "http://127.0.0.1:8080"}
  git: {branch: main, recent_commits: ["4f1c2d9 calc helpers"]}
  files:
    /proj/CLAUDE.md: "# demo\nRun the tests after a change.\n"
    /proj/calc.py: "def add(a, b):\n    return a + b\n"
script:
  - user: Have an agent summarize calc.py and run the tests meanwhile.
  - assistant:
      - tool_use: {name: Agent, input: {description: Summarize calc.py, prompt: Summarize calc.py in one sentence., subagent_type: general-purpose}}
  - assistant:
      - text: Started it; running the tests meanwhile.
      - tool_use: {name: Bash, input: {command: python3 -m unittest}}
  - tool_output: {Bash: ok}
  - assistant: [{text: Tests pass; waiting for the agent.}]
  - lane: subagent:general-purpose
    assistant: [{tool_use: {name: Read, input: {file_path: /proj/calc.py}}}]
  - lane: subagent:general-purpose
    assistant: [{text: calc.py defines add.}]
  - assistant: [{text: The agent says calc.py defines add.}]
"##;

pub(crate) fn check_run_332(yaml: &str) -> RunOutput {
    let scenario = parse_scenario(yaml, "background-332.yaml").unwrap_or_else(|e| panic!("{e}"));
    let strategy = Strategy { client_version: "2.1.332".to_owned(), ..Strategy::default() };
    run_scenario(&scenario, &mut measurer(), &strategy).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_2_1_332_agent_runs_in_the_background_and_reports_through_a_task_notification() {
    let output = check_run_332(BACKGROUND_332);
    let sub = "subagent:general-purpose";
    // The main thread goes on after the launch (two more requests in its turn); the agent runs
    // once the turn has ended; its notification asks the main thread once more.
    check_lanes(&output, &["main", "main", "main", sub, sub, "main"]);
    let body = |i: usize| serde_json::to_value(&output.requests[i]).unwrap();

    // 1. The Agent call returns at once: one text block, sized as the capture's launched result.
    let launched = agent_result(&output.requests[1]);
    assert_eq!(launched.len(), 1);
    assert!(launched[0].contains("in the background (agentId: a"), "{}", launched[0]);
    assert_eq!(ctxsim::measure::tokens::utf16_len(&launched[0]), ctxsim::agent::dialect::subagent_sizes().launched);
    // The follow-up request extends the first; the test run's extends that.
    check_reads_previous(&output, 0, 1);
    check_reads_previous(&output, 1, 2);

    // 2. The agent's own requests: the billing block marked as a subagent's, identity and
    //    prompt marked, the eight tools, the main thread's parameters, a system message.
    let first = body(3);
    let system = first["system"].as_array().unwrap();
    assert_eq!(system.len(), 3);
    assert!(system[0]["text"].as_str().unwrap().ends_with("cc_is_subagent=true;"));
    assert_eq!(system_markers(&output.requests[3]).iter().filter(|m| m.is_some()).count(), 2);
    assert_eq!(ctxsim::measure::tokens::utf16_len(system[2]["text"].as_str().unwrap()), ctxsim::agent::dialect::subagent_sizes().prompt);
    assert_eq!(tool_names(&output.requests[3]), ["Agent", "Bash", "Edit", "Read", "Skill", "ToolSearch", "DeferredToolPlaceholder", "Write"]);
    assert_eq!(first["thinking"], serde_json::json!({"type": "adaptive", "display": "omitted"}));
    assert!(first.get("temperature").is_none() && first["context_management"].is_object());
    let roles: Vec<&str> = first["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "system"]);
    check_reads_previous(&output, 3, 4);

    // 3. The notification: a user message after the main thread's last reply, one marked text
    //    block with the result inside a system reminder; the request extends the turn's last.
    let last = body(5);
    let messages = last["messages"].as_array().unwrap();
    let note = messages.last().unwrap();
    assert_eq!(note["role"], "user");
    let text = note["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("<system-reminder>\n<task-notification>"), "{text}");
    assert!(text.contains("<status>completed</status>") && text.contains("<result>calc.py defines add.</result>"), "{text}");
    assert!(note["content"][0]["cache_control"].is_object());
    assert_eq!(messages[messages.len() - 2]["content"][0]["text"], "Tests pass; waiting for the agent.");
    check_reads_previous(&output, 2, 5);
    assert!(output.rows[5].events.iter().any(|e| e == "task_notification:general-purpose"), "{:?}", output.rows[5].events);

    // The same session speaking 2.1.88 runs the agent in the foreground: its result is the
    // Agent tool_result, no notification.
    let scenario = parse_scenario(BACKGROUND_332, "b.yaml").unwrap();
    let foreground = run_scenario(&scenario, &mut measurer(), &Strategy::default()).unwrap();
    assert_eq!(crate::support::lanes(&foreground)[..4], ["main", sub, sub, "main"]);
    assert!(agent_result(&foreground.requests[3]).iter().any(|t| t.contains("calc.py defines add.")));
    assert!(!json_of(&foreground.requests).contains("task-notification"));

    // Deterministic: the same bodies on a second run.
    assert_eq!(json_of(&check_run_332(BACKGROUND_332).requests), json_of(&output.requests));
}
