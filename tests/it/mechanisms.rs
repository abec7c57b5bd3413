//! Hooks, skills and plugins: real data loads, matcher semantics, every hook effect through a
//! session driven by inline scenarios.

use ctxsim::agent::hooks::{HookSource, describe, load_settings_hooks, matches_pattern, parse_hooks};
use ctxsim::agent::session::Session;
use ctxsim::runner::{RunOutput, run_scenario};
use ctxsim::scenario::parse_scenario;
use ctxsim::strategy::Strategy;
use ctxsim::world::{Clock, VirtualFs};

use crate::support::{measurer, realdata};

fn run_text(yaml: &str) -> RunOutput {
    crate::support::run_yaml(yaml)
}

fn messages(output: &RunOutput, request: usize) -> String {
    serde_json::to_string(&output.requests[request].messages).unwrap()
}

// ---- hooks: configuration -------------------------------------------------------------------

#[test]
fn hooks_realdata_settings_load_with_snapshot() {
    let dir = realdata().join("hooks_settings");
    let mut names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert!(!names.is_empty());
    let mut out = String::new();
    for name in names {
        let mut fs = VirtualFs::new();
        fs.load_from_dir(&dir.join(&name), "/proj", &Clock::new(0)).unwrap();
        let parsed = load_settings_hooks(&fs, "/home/user", "/proj", "/etc/claude-code");
        assert!(parsed.warnings.is_empty(), "{name}: {:?}", parsed.warnings);
        out.push_str(&format!("== {name} ({} hooks)\n", parsed.hooks.len()));
        if !parsed.hooks.is_empty() {
            out.push_str(&describe(&parsed.hooks));
            out.push('\n');
        }
    }
    insta::assert_snapshot!("hooks_realdata_settings", out);
}

#[test]
fn hooks_matcher_semantics() {
    assert!(matches_pattern("", "Read"));
    assert!(matches_pattern("*", "mcp__jira__search"));
    assert!(matches_pattern("Edit|Write", "Write"));
    assert!(matches_pattern("Edit, Write", "Edit"));
    assert!(!matches_pattern("Edit|Write", "Read"));
    assert!(!matches_pattern("Edit", "EditNotebook"), "exact lists are not substrings");
    assert!(matches_pattern("Notebook.*", "NotebookEdit"));
    assert!(matches_pattern("mcp__jira__.*", "mcp__jira__search"));
    assert!(!matches_pattern("mcp__jira__.*", "mcp__wiki__search"));
    assert!(matches_pattern("Task", "Agent"), "legacy name");
    assert!(!matches_pattern("([", "Read"), "an invalid regex matches nothing");
}

#[test]
fn hooks_merge_order_and_policy() {
    let mut fs = VirtualFs::new();
    let clock = Clock::new(0);
    let hook = |cmd: &str| format!(r#"{{"hooks":{{"PreToolUse":[{{"matcher":"Bash","hooks":[{{"type":"command","command":"{cmd}"}}]}}]}}}}"#);
    fs.seed("/etc/claude-code/managed-settings.json", hook("policy"), &clock).unwrap();
    fs.seed("/home/user/.claude/settings.json", hook("user"), &clock).unwrap();
    fs.seed("/proj/.claude/settings.json", hook("project"), &clock).unwrap();
    fs.seed("/proj/.claude/settings.local.json", hook("local"), &clock).unwrap();
    let parsed = load_settings_hooks(&fs, "/home/user", "/proj", "/etc/claude-code");
    let order: Vec<&str> = parsed.hooks.iter().map(|h| h.command.as_str()).collect();
    assert_eq!(order, ["user", "project", "local", "policy"]);
    fs.write("/proj/.claude/settings.local.json", r#"{"disableAllHooks": true}"#, &clock).unwrap();
    let parsed = load_settings_hooks(&fs, "/home/user", "/proj", "/etc/claude-code");
    assert_eq!(parsed.hooks.iter().map(|h| h.source).collect::<Vec<_>>(), [HookSource::Policy]);
    fs.write("/etc/claude-code/managed-settings.json", r#"{"disableAllHooks": true}"#, &clock).unwrap();
    assert!(load_settings_hooks(&fs, "/home/user", "/proj", "/etc/claude-code").hooks.is_empty());
    // Unknown events and types are warnings, never errors.
    let parsed = parse_hooks(&serde_json::json!({"Nope": [], "Stop": [{"hooks": [{"type": "weird"}]}]}), HookSource::User, None, "x");
    assert_eq!(parsed.warnings.len(), 2);
}

// ---- hooks: effects through a session -------------------------------------------------------

const SETTINGS: &str = r#"
  files:
    /repo/.claude/settings.json: |
      {"hooks": {
        "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "guard.sh"}]}],
        "PostToolUse": [{"matcher": "Read", "hooks": [{"type": "command", "command": "post.sh"}]}],
        "Stop": [{"hooks": [{"type": "command", "command": "stop.sh"}]}],
        "PreCompact": [{"matcher": "auto", "hooks": [{"type": "command", "command": "precompact.sh"}]}]
      }}
"#;

#[test]
fn hooks_pretool_updated_input_and_post_output() {
    let yaml = format!(
        r#"
name: t
world:
  model: claude-sonnet-4-5{SETTINGS}    /repo/a.txt: "alpha"
    /repo/b.txt: "beta"
  hook_answers:
    - {{event: PreToolUse, command: guard.sh, decision: allow, updated_input: {{command: "echo rewritten"}}}}
    - {{event: PostToolUse, matcher: Read, command: post.sh, updated_output: "REDACTED", additional_context: "post ctx"}}
script:
  - user: "go"
  - assistant:
      - tool_use: {{name: Bash, input: {{command: "rm -rf /"}}}}
      - tool_use: {{name: Read, input: {{file_path: /repo/a.txt}}}}
  - assistant:
      - text: "done"
"#
    );
    let out = run_text(&yaml);
    let text = messages(&out, 1);
    assert!(text.contains("rewritten"), "{text}");
    assert!(text.contains("REDACTED") && !text.contains("alpha"), "{text}");
    assert!(text.contains("PostToolUse:Read hook additional context: post ctx"), "{text}");
    // The tool_use keeps what the model sent.
    assert!(text.contains("rm -rf /"));
}

#[test]
fn hooks_exit_code_2_denies_and_ask_runs() {
    let yaml = format!(
        r#"
name: t
world:
  model: claude-sonnet-4-5{SETTINGS}
  hook_answers:
    - {{event: PreToolUse, command: guard.sh, exit_code: 2, stderr: "no shell"}}
script:
  - user: "go"
  - assistant:
      - tool_use: {{name: Bash, input: {{command: "ls"}}}}
  - assistant:
      - text: "done"
"#
    );
    let out = run_text(&yaml);
    assert!(messages(&out, 1).contains("PreToolUse:Bash hook error: [guard.sh]: no shell"), "{}", messages(&out, 1));
}

#[test]
fn hooks_stop_blocking_continues_with_cap() {
    let mut replies = String::new();
    for i in 0..11 {
        replies.push_str(&format!("  - assistant:\n      - text: \"answer {i}\"\n"));
    }
    let yaml = format!(
        r#"
name: t
world:
  model: claude-sonnet-4-5
  fallback: {{after_script_ends: true}}{SETTINGS}
  hook_answers:
    - {{event: Stop, command: stop.sh, exit_code: 2, stderr: "tests fail"}}
script:
  - user: "go"
{replies}"#
    );
    let out = run_text(&yaml);
    assert!(messages(&out, 1).contains("Stop hook feedback:\\n[stop.sh]: tests fail"), "{}", messages(&out, 1));
    let feedback = |i: usize| messages(&out, i).matches("Stop hook feedback").count();
    // Eight continuations, then the ninth block is ignored: requests 9 and 10 see 8.
    assert_eq!(feedback(8), 8);
    assert_eq!(feedback(9), 8);
    assert_eq!(feedback(10), 8);
}

#[test]
fn hooks_user_prompt_submit_block_drops_prompt() {
    let yaml = r#"
name: t
world:
  model: claude-sonnet-4-5
  hook_answers:
    - {event: UserPromptSubmit, exit_code: 2, stderr: "not allowed"}
script:
  - user: "secret prompt"
  - user: "second"
  - assistant:
      - text: "ok"
"#;
    let out = run_text(yaml);
    assert!(!messages(&out, 0).contains("secret prompt"));
}

#[test]
fn hooks_pre_compact_instructions_merge() {
    let yaml = format!(
        r#"
name: t
world:
  model: claude-sonnet-4-5{SETTINGS}
  hook_answers:
    - {{event: PreCompact, command: precompact.sh, stdout: "keep the API notes\n"}}
script:
  - user: "go"
"#
    );
    let scenario = parse_scenario(&yaml, "inline.yaml").unwrap();
    let world = scenario.into_world();
    let mut session = Session::new(&Strategy::default(), &world);
    assert_eq!(session.pre_compact_instructions("auto", Some("be brief"), &world).as_deref(), Some("be brief\n\nkeep the API notes"));
    assert_eq!(session.pre_compact_instructions("manual", None, &world), None, "matcher = trigger");
    assert_eq!(session.hook_log().len(), 1);
}

// ---- skills ----------------------------------------------------------------------------------

#[test]
fn skills_realdata_load_with_listing_snapshot() {
    use ctxsim::agent::skills::{format_listing, parse_skill};
    let mut found = Vec::new();
    for root in ["skills", "plugins"] {
        for entry in walkdir::WalkDir::new(realdata().join(root)).sort_by_file_name() {
            let entry = entry.unwrap();
            if entry.file_name() == "SKILL.md" {
                found.push(entry.path().to_path_buf());
            }
        }
    }
    assert!(found.len() >= 10, "{found:?}");
    let mut skills = Vec::new();
    let mut out = String::new();
    for path in &found {
        let text = std::fs::read_to_string(path).unwrap();
        let dir = path.parent().unwrap();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let skill = parse_skill(&name, &dir.display().to_string(), &text);
        assert!(!skill.description.is_empty(), "{}", path.display());
        let extra: Vec<&String> = skill.extra.keys().collect();
        out.push_str(&format!(
            "{} lenient={} model={:?} allowed_tools={:?} extra={extra:?}\n",
            skill.name, skill.lenient, skill.fields.model, skill.fields.allowed_tools
        ));
        skills.push(skill);
    }
    let refs: Vec<&_> = skills.iter().collect();
    // The 1% budget of a 200k window (8,000 chars) and the 250-char cap; then a tight budget.
    out.push_str("\n== listing, budget 8000\n");
    out.push_str(&format_listing(&refs, 8000, 250));
    out.push_str("\n\n== listing, budget 600\n");
    out.push_str(&format_listing(&refs, 600, 250));
    insta::assert_snapshot!("skills_realdata_listing", out);
}

#[test]
fn skills_frontmatter_lenient_fallback_keeps_everything() {
    use ctxsim::agent::skills::parse_skill;
    let text = "---\nname: Deploy\ndescription: Does things: well, mostly\nmodel: inherit\nallowed-tools: Bash, Read\ndisable-model-invocation: true\ncustom-key: kept\n---\n# Body\nRun ${CLAUDE_SKILL_DIR}/go.sh\n";
    let skill = parse_skill("deploy", "/s/deploy", text);
    assert!(skill.lenient);
    assert_eq!(skill.description, "Does things: well, mostly");
    assert_eq!(skill.fields.display_name.as_deref(), Some("Deploy"));
    assert_eq!(skill.fields.model, None, "inherit → none");
    assert_eq!(skill.fields.allowed_tools, ["Bash", "Read"]);
    assert!(!skill.listed());
    assert_eq!(skill.extra.get("custom-key"), Some(&serde_json::json!("kept")));
    assert!(skill.invocation_body("sid").contains("/s/deploy/go.sh"));
}

// ---- plugins ---------------------------------------------------------------------------------

#[test]
fn plugins_realdata_load_with_snapshot() {
    use ctxsim::agent::plugins::{describe, load_plugin};
    let base = realdata().join("plugins/claude-plugins-official");
    let mut fs = VirtualFs::new();
    fs.load_from_dir(&base, "/plugins", &Clock::new(0)).unwrap();
    let mut out = String::new();
    for group in ["external_plugins", "plugins"] {
        for entry in fs.list_dir(&format!("/plugins/{group}")).unwrap().into_iter().filter(|e| e.is_dir) {
            let plugin = load_plugin(&fs, &entry.path).unwrap_or_else(|e| panic!("{e}"));
            assert!(plugin.warnings.is_empty(), "{:?}", plugin.warnings);
            assert!(plugin.hooks.iter().all(|h| !h.command.contains("${CLAUDE_PLUGIN_ROOT}")));
            out.push_str(&describe(&plugin));
            out.push('\n');
        }
    }
    insta::assert_snapshot!("plugins_realdata", out);
}

#[test]
fn mcp_json_expands_env() {
    use ctxsim::agent::plugins::project_mcp_servers;
    let mut fs = VirtualFs::new();
    fs.seed("/repo/.mcp.json", r#"{"mcpServers": {"gh": {"type": "http", "url": "${BASE:-https://x}/mcp", "headers": {"A": "Bearer ${TOKEN}"}}}}"#, &Clock::new(0)).unwrap();
    let env = [("TOKEN".to_owned(), "t0k".to_owned())].into_iter().collect();
    let (servers, missing) = project_mcp_servers(&fs, "/repo", &env);
    assert_eq!(servers["gh"]["url"], "https://x/mcp");
    assert_eq!(servers["gh"]["headers"]["A"], "Bearer t0k");
    assert!(missing.is_empty());
}

// ---- shipped mechanism scenarios --------------------------------------------------------------

fn run_shipped(name: &str) -> RunOutput {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(format!("{name}.yaml"));
    let scenario = ctxsim::scenario::load_scenario(&path).unwrap_or_else(|e| panic!("{e}"));
    run_scenario(&scenario, &mut measurer(), &Strategy::default()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn scenario_mcp_list_changed_names_its_cause() {
    let out = run_shipped("mcp-list-changed");
    assert!(out.rows[1].events.iter().any(|e| e == "mcp_tools_changed:jira"), "{:?}", out.rows[1].events);
    assert!(messages(&out, 1).contains("mcp__jira__create_issue"));
    assert_eq!(out.rows[1].prefix.cause.as_deref().map(|c| c.split(':').next().unwrap()), Some("mcp_tools_changed"));
}

#[test]
fn scenario_conditional_skill_appears_after_matching_read() {
    let out = run_shipped("conditional-skill");
    assert!(!messages(&out, 0).contains("sql-style"));
    assert!(messages(&out, 0).contains("release"));
    assert!(messages(&out, 1).contains("- sql-style: House style for SQL migrations"), "{}", messages(&out, 1));
    assert_eq!(out.rows[1].prefix.cause, None, "a delta after the tool_result rewrites nothing");
}

#[test]
fn scenario_plugin_reload_resends_listing_and_runs_plugin_hook() {
    let out = run_shipped("plugin-reload");
    assert!(out.rows[1].events.iter().any(|e| e == "plugin_reloaded"), "{:?}", out.rows[1].events);
    let second = messages(&out, 1);
    assert!(second.contains("- demo:lint: Lint the repository the demo way"), "{second}");
    // The full listing is sent again (sent-names reset): bundled skills appear twice in total.
    assert_eq!(second.matches("- simplify:").count(), 2, "{second}");
    assert!(messages(&out, 2).contains("PostToolUse:Read hook additional context: demo plugin saw a read"));
}

#[test]
fn scenario_realdata_hooks_tree_and_settings() {
    let out = run_shipped("realdata-hooks");
    let first = messages(&out, 0);
    assert!(first.contains("/proj/CLAUDE.md"), "real CLAUDE.md tree mounted");
    assert!(messages(&out, 1).contains("PostToolUse:Write hook additional context: formatted notes.md"));
    assert!(messages(&out, 2).contains("Stop hook feedback:\\n[node \\\"$CLAUDE_PROJECT_DIR\\\"/.claude/hooks/lefthook-check.mts]: lint: notes.md has a trailing space"), "{}", messages(&out, 2));
}

// ---- hooks: types, timeouts, SessionStart sources -------------------------------------------

fn lanes(output: &RunOutput) -> Vec<(&str, u64)> {
    output.rows.iter().map(|r| (r.lane.as_str(), r.time_ms)).collect()
}

fn shipped(name: &str) -> RunOutput {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(name);
    run_scenario(&ctxsim::scenario::load_scenario(&path).unwrap(), &mut measurer(), &Strategy::default()).unwrap()
}

#[test]
fn hook_types_http_agent_prompt_and_timeouts() {
    let out = shipped("hook-types.yaml");
    // The lint hook's 30 s run is cut at its 5 s timeout; the verifier takes 12 s.
    assert_eq!(lanes(&out), [("main", 0), ("main", 5_000), ("side", 5_000), ("main", 17_000), ("side", 17_000), ("main", 17_000), ("side", 17_000)]);
    // http: the 200 response's context arrives; the cancelled command hook's never does.
    let after_read = messages(&out, 1);
    assert!(after_read.contains("PostToolUse:Read hook additional context: Audit: notes.md read at 10:00."));
    assert!(!after_read.contains("never delivered"));
    // agent: one request to Haiku with the read-only tools and $ARGUMENTS filled in; its "no"
    // denies the Bash call.
    let verifier = &out.requests[2];
    assert_eq!(verifier.model, "claude-haiku-4-5-20251001");
    assert_eq!(verifier.tools().iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["Glob", "Grep", "Read"]);
    assert!(messages(&out, 2).contains(r#"\"tool_input\":{\"command\":\"rm -rf / build\"}"#));
    assert!(messages(&out, 3).contains("PreToolUse:Bash hook error: [Check that this command deletes nothing outside build/: $ARGUMENTS]: rm -rf / deletes the whole filesystem"));
    // prompt: no tools; its verdict blocks Stop, so the loop goes on with feedback.
    assert!(out.requests[4].tools.is_none());
    assert!(messages(&out, 4).contains(r#"\"stop_hook_active\":false"#));
    assert!(messages(&out, 5).contains("Stop hook feedback:\\n[Did the assistant answer every part of the request? $ARGUMENTS]: Say what is in build/."));
    assert!(messages(&out, 6).contains(r#"\"stop_hook_active\":true"#));
    assert_eq!(out.summary.cache_breaks, 0);
}

#[test]
fn hook_types_edge_cases() {
    let settings = r#"
  files:
    /repo/a.txt: "a"
    /repo/.claude/settings.json: |
      {"hooks": {
        "SessionStart": [{"hooks": [{"type": "http", "url": "https://h.example/start"}]}],
        "UserPromptSubmit": [{"hooks": [{"type": "prompt", "prompt": "Is this on topic? $ARGUMENTS", "model": "sonnet"}]}],
        "PostToolUse": [{"hooks": [{"type": "http", "url": "https://h.example/post"}, {"type": "prompt", "prompt": "Judge $ARGUMENTS"}]}],
        "SessionEnd": [{"hooks": [{"type": "command", "command": "bye.sh"}]}]
      }}
"#;
    let yaml = format!(
        r#"name: t
world:
  model: claude-sonnet-4-5{settings}  hook_answers:
    - {{event: SessionStart, command: "https://h.example/start", additional_context: "never: http skips SessionStart"}}
    - {{event: UserPromptSubmit, command: "Is this on topic? $ARGUMENTS", ok: true, duration: 2s}}
    - {{event: PostToolUse, command: "https://h.example/post", status: 503, additional_context: "never: a 503 is a non-blocking error"}}
    - {{event: PostToolUse, command: "Judge $ARGUMENTS", stdout: "looks fine to me"}}
    - {{event: SessionEnd, command: bye.sh, duration: 1m}}
script:
  - user: "read a.txt"
  - assistant:
      - tool_use: {{name: Read, input: {{file_path: /repo/a.txt}}}}
  - assistant:
      - text: "done"
  - clear: true
  - user: "again"
  - assistant:
      - text: "ok"
"#
    );
    let out = run_text(&yaml);
    // The prompt asks the prompt hook (its model alias resolved), which passes it after 2 s.
    assert_eq!((out.rows[0].lane.as_str(), out.requests[0].model.as_str()), ("side", "claude-sonnet-4-6"));
    assert!(messages(&out, 0).contains(r#"Is this on topic? {\"session_id\""#) && messages(&out, 0).contains(r#"\"prompt\":\"read a.txt\""#));
    assert_eq!((out.rows[1].lane.as_str(), out.rows[1].time_ms), ("main", 2_000));
    assert!(messages(&out, 1).contains("read a.txt"));
    let all: String = (0..out.requests.len()).map(|i| messages(&out, i)).collect();
    assert!(!all.contains("never:"), "{all}");
    // A verdict that is not JSON blocks nothing.
    assert!(!all.contains("hook blocking error"));

    // A prompt hook's "no" on UserPromptSubmit drops the prompt.
    let blocked = r#"name: t
world:
  model: claude-sonnet-4-5
  files:
    /repo/.claude/settings.json: '{"hooks": {"UserPromptSubmit": [{"hooks": [{"type": "prompt", "prompt": "On topic? $ARGUMENTS"}]}]}}'
  hook_answers:
    - {event: UserPromptSubmit, command: "On topic? $ARGUMENTS", ok: false, reason: "off topic"}
script:
  - user: "tell me a joke"
  - assistant:
      - text: "no prompt reached me"
"#;
    let dropped = run_text(blocked);
    assert_eq!(dropped.rows[0].lane, "side");
    assert!(!messages(&dropped, 1).contains("tell me a joke"));
    // SessionEnd at /clear is cut at its 1.5 s budget: the next prompt's request follows 1.5 s
    // plus the 2 s of its own prompt hook later.
    let last = out.rows.last().unwrap();
    let before = out.rows.iter().rev().find(|r| r.lane == "main" && r.index < last.index).unwrap();
    assert_eq!(last.time_ms - before.time_ms, 3_500);

    let yaml = yaml.replace("model: claude-sonnet-4-5", "model: claude-sonnet-4-5\n  env: {CLAUDE_CODE_SESSIONEND_HOOKS_TIMEOUT_MS: 20000}");
    let out = run_text(&yaml);
    let last = out.rows.last().unwrap();
    let before = out.rows.iter().rev().find(|r| r.lane == "main" && r.index < last.index).unwrap();
    assert_eq!(last.time_ms - before.time_ms, 22_000);
    assert_eq!(ctxsim::agent::hooks::default_timeout_ms("agent", "Stop", 1_500), 60_000);
    assert_eq!(ctxsim::agent::hooks::default_timeout_ms("prompt", "PreToolUse", 1_500), 30_000);
    assert_eq!(ctxsim::agent::hooks::default_timeout_ms("http", "SessionEnd", 1_500), 1_500);
}

#[test]
fn session_start_fires_for_clear_and_resume() {
    let out = shipped("session-clear-resume.yaml");
    let session = |i: usize| {
        let user_id: serde_json::Value = serde_json::from_str(out.requests[i].metadata.as_ref().unwrap()["user_id"].as_str().unwrap()).unwrap();
        user_id["session_id"].as_str().unwrap().to_owned()
    };
    // /clear starts a new session id; a resume keeps it.
    assert_ne!(session(0), session(1));
    assert_eq!(session(1), session(2));
    assert!(messages(&out, 0).contains("SessionStart:startup hook success: Release freeze until Friday."));
    // After /clear: none of the first conversation, the clear hook's context first.
    let cleared = messages(&out, 1);
    assert!(!cleared.contains("Anything I should know?") && !cleared.contains("Release freeze"));
    assert!(cleared.contains("SessionStart hook additional context: Open task: finish the parser rewrite."));
    assert_eq!(out.rows[1].prefix.cause.as_deref(), Some("conversation_cleared"));
    // The SessionEnd hook's 0.8 s is on the clock.
    assert_eq!(out.rows[1].time_ms, 800);
    // After the resume: the listing moved from the first message to the new prompt, the
    // resume context follows the transcript.
    let resumed = &out.requests[2].messages;
    let opening = serde_json::to_string(&resumed[1]).unwrap();
    assert!(!opening.contains("Skills you can run") && opening.contains("Start over: what is open?"));
    let last = serde_json::to_string(resumed.last().unwrap()).unwrap();
    assert!(last.contains("Open task: finish the parser rewrite.") && last.contains("Skills you can run") && last.contains("Continue with the parser."));
    assert_eq!(out.rows[2].prefix.cause.as_deref(), Some("session_resumed"));
    assert_eq!(out.summary.cache_breaks, 2);
}
