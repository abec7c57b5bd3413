//! The agent session of layers 1–5: request structure, memory discovery, attachments, tool
//! search, MCP, hooks; scenarios with asserted causes.

use ctxsim::agent::instructions::{DiscoveryOptions, discover, include_paths};
use ctxsim::agent::user_context::MemoryKind;
use ctxsim::api::{ContentBlock, MessageContent, Request, Role, SystemPrompt};
use ctxsim::runner::{RunOutput, run_scenario};
use ctxsim::scenario::load_scenario;
use ctxsim::strategy::{McpInstructionsMode, Strategy};
use ctxsim::world::{Clock, VirtualFs};
use serde_json::Value;

use crate::support::{measurer, realdata};

fn run_with(name: &str, strategy: &Strategy) -> RunOutput {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios").join(format!("{name}.yaml"));
    let scenario = load_scenario(&path).unwrap_or_else(|e| panic!("{e}"));
    run_scenario(&scenario, &mut measurer(), strategy).unwrap_or_else(|e| panic!("{e}"))
}

fn run(name: &str) -> RunOutput {
    run_with(name, &Strategy::default())
}

fn json(request: &Request) -> Value {
    serde_json::to_value(request).unwrap()
}

/// Every text of a message (text blocks and string tool_result contents), joined.
fn message_text(request: &Request, index: usize) -> String {
    serde_json::to_string(&json(request)["messages"][index]).unwrap()
}

fn events(output: &RunOutput, index: usize) -> Vec<String> {
    output.rows[index].events.clone()
}

fn markers_in_messages(value: &Value) -> usize {
    value["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match &m["content"] {
            Value::Array(blocks) => blocks.iter().filter(|b| b.get("cache_control").is_some()).count(),
            _ => 0,
        })
        .sum()
}

#[test]
fn session_plain_read_has_reference_structure() {
    let output = run("read-and-answer");
    assert_eq!(output.requests.len(), 2);
    for request in &output.requests {
        let value = json(request);
        // Body keys in the reference order (thinking etc. only on 4.6 models).
        let keys: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["model", "messages", "system", "tools", "metadata", "max_tokens", "stream"]);
        assert!(value["metadata"]["user_id"].is_string(), "user_id is a JSON string");
        // System: attribution, identity, static (global), dynamic (no marker).
        let Some(SystemPrompt::Blocks(blocks)) = &request.system else { panic!("system blocks") };
        assert_eq!(blocks.len(), 4);
        assert!(blocks[0].text.starts_with("x-anthropic-billing-header: cc_version=2.1.88."));
        assert_eq!(blocks[0].text.len(), 84);
        assert_eq!(blocks[1].text.len(), 62);
        assert_eq!(blocks[2].text.len(), 11695);
        assert!(blocks[0].cache_control.is_none() && blocks[1].cache_control.is_none() && blocks[3].cache_control.is_none());
        assert_eq!(serde_json::to_value(&blocks[2].cache_control).unwrap(), serde_json::json!({"type": "ephemeral", "scope": "global"}));
        // Tools: the nine of tst mode, sorted, no marker.
        let names: Vec<&str> = request.tools().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["Agent", "Bash", "Edit", "Glob", "Grep", "Read", "Skill", "ToolSearch", "Write"]);
        assert!(request.tools().iter().all(|t| t.cache_control.is_none()));
        // messages[0]: the deferred-tools string; messages[1]: [skill listing][user context][prompt].
        assert!(matches!(&request.messages[0].content, MessageContent::Text(t) if t.starts_with("<available-deferred-tools>\n")));
        let MessageContent::Blocks(first) = &request.messages[1].content else { panic!("blocks") };
        let texts: Vec<&str> = first.iter().map(|b| match b { ContentBlock::Text { text, .. } => text.as_str(), _ => "" }).collect();
        assert_eq!(texts.len(), 3);
        assert!(texts[0].starts_with("<system-reminder>\nSkills") && texts[0].ends_with("</system-reminder>\n"));
        assert!(texts[1].starts_with("<system-reminder>\n") && texts[1].contains("# claudeMd\n") && texts[1].contains("# currentDate\n"));
        assert!(texts[1].contains("Contents of /repo/CLAUDE.md (project instructions, checked into the codebase):"));
        assert_eq!(texts[2], "Read main.rs and explain it");
        // Exactly one message-level marker, on the last block of the last message.
        assert_eq!(markers_in_messages(&value), 1);
        let last = value["messages"].as_array().unwrap().last().unwrap();
        assert!(last["content"].as_array().unwrap().last().unwrap().get("cache_control").is_some());
    }
    // The tool_result keeps the reference's key order and the 2.1.88 numbering (`{n}\t`, no
    // padding, as the real client's request log shows).
    let value = json(&output.requests[1]);
    let result = &value["messages"][3]["content"][0];
    let keys: Vec<&str> = result.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["tool_use_id", "type", "content", "cache_control"]);
    assert!(result["content"].as_str().unwrap().starts_with("1\tfn main() {\n2\t"));
    // The first request's prompt is a marked block; in the second it is still a block (merged).
    assert_eq!(output.requests[1].messages[2].role, Role::Assistant);
}

#[test]
fn session_later_prompt_flips_string_to_block_only_while_last() {
    let output = run("claude-md-chain");
    let last = json(&output.requests[2]);
    let messages = last["messages"].as_array().unwrap();
    assert_eq!(messages.last().unwrap()["content"][0]["text"], "Thanks.");
    assert!(messages.last().unwrap()["content"][0]["cache_control"].is_object());
}

#[test]
fn session_claude_md_chain_order_and_nested_memory() {
    let output = run("claude-md-chain");
    let context = message_text(&output.requests[0], 1);
    let order = [
        "/home/user/.claude/CLAUDE.md (user's private global",
        "/work/CLAUDE.md (project",
        "/work/app/CLAUDE.md (project",
        "/work/app/.claude/CLAUDE.md (project",
        "/work/app/.claude/rules/style.md (project",
        "/work/app/CLAUDE.local.md (user's private project",
    ];
    let positions: Vec<usize> = order.iter().map(|p| context.find(p).unwrap_or_else(|| panic!("{p} missing"))).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    assert!(!context.contains("db module"), "nested CLAUDE.md is not eager");
    // After the Read, the nested CLAUDE.md is folded into the tool_result string.
    let after = message_text(&output.requests[1], 3);
    assert!(after.contains("Contents of /work/app/src/db/CLAUDE.md:\\n\\nThe db module owns every SQL statement."), "{after}");
    assert!(output.rows.iter().all(|r| !r.cache_break));
}

#[test]
fn session_include_chain() {
    let output = run("include-chain");
    let context = message_text(&output.requests[0], 1);
    let claude = context.find("Contents of /repo/CLAUDE.md").unwrap();
    let agents = context.find("Contents of /repo/AGENTS.md").unwrap();
    let deep = context.find("Contents of /repo/docs/deep.md").unwrap();
    let style = context.find("Contents of /repo/docs/style.md").unwrap();
    // Including file first, then its includes depth-first in the order found.
    assert!(claude < agents && agents < deep && deep < style, "{claude} {agents} {deep} {style}");
    assert!(!context.contains("MUST NOT LOAD"));
    assert_eq!(context.matches("Contents of /repo/AGENTS.md").count(), 1);
}

#[test]
fn session_include_syntax() {
    let found = include_paths("a @x.md b\n`@no.md` and @./y.md#frag and @~/z.md\n    @indented.md\n@/abs.md @ @#bad", "/r");
    assert_eq!(found, ["/r/x.md", "/r/y.md", "/home/user/z.md", "/abs.md"]);
}

#[test]
fn session_conditional_rule() {
    let output = run("conditional-rule");
    assert!(!message_text(&output.requests[0], 1).contains("fixtures"), "conditional rules are never eager");
    assert!(!message_text(&output.requests[1], 3).contains("fixtures"), "lib.rs does not match");
    let second_read = message_text(&output.requests[2], 5);
    assert!(second_read.contains("Contents of /repo/.claude/rules/tests.md:\\n\\nTests use the fixtures"), "{second_read}");
}

#[test]
fn session_late_mcp_busts_messages_in_default_mode() {
    let output = run("late-mcp");
    let first = output.requests[0].messages[0].content.to_blocks();
    let ContentBlock::Text { text, .. } = &first[0] else { panic!() };
    assert!(text.contains("mcp__docs__search") && !text.contains("mcp__jira"));
    assert_eq!(events(&output, 1), ["mcp_connected:jira", "system_section_changed:mcp_instructions"]);
    // The dynamic system block is the first divergence (instructions recomputed every turn);
    // the deferred-tools message at messages[0] changed too.
    let row = &output.rows[1];
    assert_eq!(row.prefix.diverged_at.as_deref(), Some("system[3]"));
    assert_eq!(row.prefix.cause.as_deref(), Some("system_section_changed:mcp_instructions"), "{:?}", row.prefix);
    let ContentBlock::Text { text, .. } = &output.requests[1].messages[0].content.to_blocks()[0] else { panic!() };
    assert!(text.contains("mcp__jira__get_issue"));
    let dynamic = &output.requests[1].system_blocks()[3].text;
    assert!(dynamic.contains("## jira\nIssue keys"));
}

#[test]
fn session_late_mcp_delta_keeps_system_stable() {
    let strategy = Strategy { mcp_instructions: McpInstructionsMode::Delta, ..Strategy::default() };
    let output = run_with("late-mcp", &strategy);
    assert_eq!(output.requests[0].system_blocks(), output.requests[1].system_blocks());
    assert_eq!(events(&output, 1), ["mcp_connected:jira"]);
    let last = message_text(&output.requests[1], output.requests[1].messages.len() - 1);
    assert!(last.contains("## jira\\nIssue keys"), "{last}");
    let first = message_text(&output.requests[0], 1);
    assert!(first.contains("## docs\\nSearch the docs"), "servers connected at start arrive as a delta too");
}

#[test]
fn session_tool_search_loads_tool_in_sorted_position() {
    let output = run("tool-search");
    let second = json(&output.requests[1]);
    let user = &second["messages"][3]["content"];
    assert_eq!(user[0]["content"], serde_json::json!([{"type": "tool_reference", "tool_name": "TodoWrite"}]));
    assert_eq!(user[1]["text"], "Tool loaded.");
    // Discovery reads the tool_reference in the history, so the very next request carries it.
    assert!(output.requests[0].tools().iter().all(|t| t.name != "TodoWrite"));
    for request in &output.requests[1..] {
        let names: Vec<&str> = request.tools().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["Agent", "Bash", "Edit", "Glob", "Grep", "Read", "Skill", "TodoWrite", "ToolSearch", "Write"]);
        assert_eq!(request.tools()[7].defer_loading, Some(true));
    }
    assert_eq!(events(&output, 1), ["tool_loaded:TodoWrite"]);
    assert_eq!(output.rows[1].prefix.cause.as_deref(), Some("tool_loaded:TodoWrite"));
    assert!(events(&output, 2).is_empty());
}

#[test]
fn session_date_rollover() {
    let output = run("date-rollover");
    assert!(events(&output, 1).contains(&"date_changed".to_owned()));
    let last = message_text(&output.requests[1], output.requests[1].messages.len() - 1);
    assert!(last.contains("2026-03-02"), "date_change at the tail: {last}");
    // The memoized user context keeps the old date.
    assert!(message_text(&output.requests[1], 1).contains("Current date is 2026-03-01."));
    assert_eq!(output.rows[1].prefix.cause.as_deref().map(ctxsim::measure::prefix::cause_id), Some("ttl_expired"));
}

#[test]
fn session_hook_context_fold() {
    let output = run("hook-context-fold");
    let in_loop = json(&output.requests[1]);
    let blocks = in_loop["messages"][3]["content"].as_array().unwrap();
    assert_eq!(blocks.len(), 2, "hook context is a sibling within the turn");
    assert!(blocks[1]["text"].as_str().unwrap().contains("PostToolUse:Read hook additional context: Reads of src/"));
    assert!(blocks[1]["cache_control"].is_object());
    let next = json(&output.requests[2]);
    let folded = next["messages"][3]["content"].as_array().unwrap();
    assert_eq!(folded.len(), 1, "folded into the tool_result on the next turn");
    assert!(folded[0]["content"].as_str().unwrap().ends_with("Reads of src/ are logged for review.\n</system-reminder>"));
    assert_eq!(events(&output, 2), ["hook_context_folded"]);
    assert_eq!(output.rows[2].prefix.diverged_at.as_deref().map(|p| p.starts_with("messages[3]")), Some(true), "{:?}", output.rows[2].prefix);
    assert_eq!(output.rows[2].prefix.cause.as_deref(), Some("hook_context_folded"));
}

#[test]
fn session_start_hook_comes_first() {
    let output = run("session-start-hook");
    let MessageContent::Blocks(blocks) = &output.requests[0].messages[1].content else { panic!() };
    let texts: Vec<String> = blocks.iter().map(|b| match b { ContentBlock::Text { text, .. } => String::clone(text), _ => String::new() }).collect();
    // Attachments merge with each other without the seam newline.
    assert_eq!(texts[0], "<system-reminder>\nSessionStart:startup hook success: Branch main is protected.\n</system-reminder>");
    assert!(texts[1].contains("SessionStart hook additional context: CI is red"));
    assert!(texts[2].contains("Skills you can run"));
}

#[test]
fn session_pretool_deny() {
    let output = run("hook-pretool-deny");
    let value = json(&output.requests[1]);
    let result = &value["messages"][3]["content"][0];
    let keys: Vec<&str> = result.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["type", "content", "is_error", "tool_use_id", "cache_control"]);
    assert_eq!(result["content"], "PreToolUse:Bash hook error: no shell in this repo");
}

#[test]
fn session_every_event_is_a_known_cause() {
    for name in ["claude-md-chain", "include-chain", "conditional-rule", "late-mcp", "tool-search", "date-rollover", "hook-context-fold"] {
        let output = run(name);
        for row in &output.rows {
            for event in &row.events {
                assert!(ctxsim::measure::prefix::is_known_cause(event) || event.starts_with("file_edited_by_user"), "{name}: {event}");
            }
        }
        let again = run(name);
        assert_eq!(output.summary.fingerprint, again.summary.fingerprint, "{name} is deterministic");
    }
}

#[test]
fn session_realdata_claude_md_trees_load() {
    for tree in ["2anki-server", "apythia", "confluence-md", "elmethis"] {
        let mut fs = VirtualFs::new();
        fs.load_from_dir(&realdata().join("claude_md").join(tree), "/proj", &Clock::new(0)).unwrap();
        let options = DiscoveryOptions {
            cwd: "/proj".into(),
            config_home: "/home/user/.claude".into(),
            managed_dir: "/etc/claude-code".into(),
            excludes: Vec::new(),
            external_includes_approved: false,
            auto_memory_dir: None,
            local: true,
        };
        let discovery = discover(&fs, &options);
        assert!(!discovery.files.is_empty(), "{tree}: nothing loaded");
        assert!(discovery.files.iter().all(|f| f.kind == MemoryKind::Project || f.kind == MemoryKind::Local));
        let paths: Vec<&str> = discovery.files.iter().map(|f| f.path.as_str()).collect();
        let unique: std::collections::BTreeSet<&str> = paths.iter().copied().collect();
        assert_eq!(unique.len(), paths.len(), "{tree}: duplicates");
        // claudeMdExcludes drops a file.
        let excluded = discover(&fs, &DiscoveryOptions { excludes: vec![paths[0].to_owned()], ..options.clone() });
        assert!(excluded.files.iter().all(|f| f.path != paths[0]), "{tree}: exclude ignored");
    }
}

#[test]
fn session_strategy_set_and_env() {
    let mut strategy = Strategy::default();
    strategy.set("enable_tool_search", "false").unwrap();
    assert_eq!(strategy.enable_tool_search.as_deref(), Some("false"));
    strategy.set("ttl_main", "1h").unwrap();
    assert_eq!(strategy.ttl_for("main"), Some(ctxsim::api::CacheTtl::OneHour));
    strategy.set("mcp_instructions", "delta").unwrap();
    assert_eq!(strategy.mcp_instructions, McpInstructionsMode::Delta);
    assert!(strategy.set("no_such_knob", "1").is_err());
    let env = [("ENABLE_TOOL_SEARCH", "auto:5"), ("MAX_MCP_OUTPUT_TOKENS", "1000"), ("BASH_MAX_OUTPUT_LENGTH", "50")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let strategy = Strategy::from_env(&env).unwrap();
    assert_eq!((strategy.enable_tool_search.as_deref(), strategy.max_mcp_output_tokens, strategy.bash_max_output_length), (Some("auto:5"), 1000, 50));
    let toml: Strategy = toml::from_str("dynamic_boundary = false\nttl_main = \"1h\"").unwrap();
    assert!(!toml.dynamic_boundary);
}

#[test]
fn session_eager_tools_with_mcp_is_mode_a() {
    let strategy = Strategy { enable_tool_search: Some("false".into()), ..Strategy::default() };
    let output = run_with("late-mcp", &strategy);
    let blocks = output.requests[0].system_blocks();
    assert_eq!(blocks.len(), 3, "inline MCP tools: three org-scoped blocks");
    assert!(output.requests[0].tools().iter().any(|t| t.name == "mcp__docs__search"));
    assert!(matches!(&output.requests[0].messages[0].content, MessageContent::Blocks(_)), "no deferred-tools message");
}

/// Consecutive requests whose tools and system prompt did not change hold the session's own
/// lists (one allocation, a reference count per request), and a change to one body's copy
/// reaches no other body (copy on write): the bytes sent are the lists' as before.
#[test]
fn session_requests_share_unchanged_tools_and_system() {
    let output = run("read-and-answer");
    assert_eq!(output.requests.len(), 2);
    let (first, second) = (&output.requests[0], &output.requests[1]);
    let (Some(tools_a), Some(tools_b)) = (&first.tools, &second.tools) else { panic!("tools") };
    assert!(tools_a.same(tools_b), "the second request shares the first's tools");
    let (Some(SystemPrompt::Blocks(system_a)), Some(SystemPrompt::Blocks(system_b))) = (&first.system, &second.system) else { panic!("system blocks") };
    assert!(system_a.same(system_b), "the second request shares the first's system blocks");

    let before = serde_json::to_string(first).unwrap();
    let mut edited = second.clone();
    edited.tools.as_mut().unwrap()[0].description = Some("changed".to_owned());
    if let Some(SystemPrompt::Blocks(blocks)) = &mut edited.system {
        blocks[0].text.push('!');
    }
    assert_eq!(serde_json::to_string(first).unwrap(), before, "an edit of another body's copy leaves this one");
    assert!(!edited.tools.as_ref().unwrap().same(tools_a));
    // Serialized as the plain lists they hold.
    let value = json(first);
    assert_eq!(value["tools"], serde_json::to_value(tools_a.as_slice()).unwrap());
    assert_eq!(value["system"], serde_json::to_value(system_a.as_slice()).unwrap());
    let parsed: Request = serde_json::from_str(&before).unwrap();
    assert_eq!(&parsed, first);
}
