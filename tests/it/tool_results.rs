//! The forms of tool results as the 2.1.88 client sends them (closing the conformance gaps the
//! real-client comparison found): relative Glob/Grep paths, MCP results as text blocks, a tool the
//! pool does not hold refused, and file modification times from the scenario.

use serde_json::{Value, json};

use crate::support::run_yaml;

/// The `tool_result` block answering `id` in the last request of a run.
fn result_of(yaml: &str, id: &str) -> Value {
    let output = run_yaml(yaml);
    let last = serde_json::to_value(output.requests.last().expect("a request")).unwrap();
    last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .find(|b| b["type"] == "tool_result" && b["tool_use_id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no tool_result for {id}"))
}

/// A one-call scenario: `tool` with `input` (a YAML flow map), then a closing reply.
fn check(world_extra: &str, tool: &str, input: &str, output: &str, expect: Value) {
    let yaml = format!(
        "name: t
world:
  model: claude-sonnet-4-5
  cwd: /repo
  files:
    /repo/src/main.rs: \"fn main() {{}}\\n\"
    /repo/src/lib.rs: \"pub fn add() {{}}\\n\"
    /elsewhere/notes.md: \"add later\\n\"
{world_extra}script:
  - user: \"go\"
  - assistant:
      - tool_use: {{id: toolu_1, name: {tool}, input: {input}}}
{output}  - assistant:
      - text: \"done\"
"
    );
    let result = result_of(&yaml, "toolu_1");
    let got = json!({"content": result["content"], "is_error": result.get("is_error").cloned().unwrap_or(Value::Null)});
    assert_eq!(got, expect, "{tool} {input}");
}

#[test]
fn glob_and_grep_print_paths_relative_to_the_working_directory() {
    check("", "Glob", "{pattern: \"src/*.rs\"}", "", json!({"content": "src/lib.rs\nsrc/main.rs", "is_error": null}));
    // Outside the working directory a path stays absolute.
    check("", "Glob", "{pattern: \"*.md\", path: /elsewhere}", "", json!({"content": "/elsewhere/notes.md", "is_error": null}));
    check("", "Grep", "{pattern: add, path: /}", "", json!({"content": "Found 2 files\n/elsewhere/notes.md\nsrc/lib.rs", "is_error": null}));
    check(
        "",
        "Grep",
        "{pattern: fn, output_mode: content}",
        "",
        json!({"content": "src/lib.rs:1:pub fn add() {}\nsrc/main.rs:1:fn main() {}", "is_error": null}),
    );
}

#[test]
fn an_mcp_result_is_sent_as_a_list_of_text_blocks() {
    let mcp = "  env: {ENABLE_TOOL_SEARCH: \"false\"}
  mcp_servers:
    - name: jira
      tools:
        - {name: get_issue, description: \"Fetches one issue.\"}
";
    check(
        mcp,
        "mcp__jira__get_issue",
        "{key: ABC-1}",
        "  - tool_output: {mcp__jira__get_issue: \"ABC-1: open\"}\n",
        json!({"content": [{"type": "text", "text": "ABC-1: open"}], "is_error": null}),
    );
    // A built-in's scripted output stays a string.
    check("", "Bash", "{command: make}", "  - tool_output: {Bash: \"ok\"}\n", json!({"content": "ok", "is_error": false}));
}

#[test]
fn a_tool_the_pool_does_not_hold_is_refused() {
    // Tool search off: ToolSearch is not in the pool, so the client answers with an error and
    // loads nothing.
    let off = "  env: {ENABLE_TOOL_SEARCH: \"false\"}\n";
    check(off, "ToolSearch", "{query: \"select:WebFetch\"}", "", json!({"content": "No such tool available: ToolSearch", "is_error": true}));
    check("", "NoSuchTool", "{}", "", json!({"content": "No such tool available: NoSuchTool", "is_error": true}));
}

#[test]
fn scenario_files_carry_their_modification_times() {
    let yaml = "name: t
world:
  model: claude-sonnet-4-5
  clock_start: 2026-03-10T09:00:00Z
  files:
    /repo/new.md: {contents: \"new\\n\", mtime: 2026-03-09T12:00:00Z}
    /repo/old.md: {contents: \"old\\n\", mtime: 2026-01-01T00:00:00Z}
    /repo/plain.md: \"plain\\n\"
script:
  - user: hi
  - assistant:
      - text: ok
";
    let scenario = ctxsim::scenario::parse_scenario(yaml, "inline.yaml").unwrap_or_else(|e| panic!("{e}"));
    let world = scenario.into_world();
    let mtime = |p: &str| world.fs.entry(p).unwrap().mtime_ms;
    // Relative to the clock's start: older files are negative, a plain string dates from the start.
    assert_eq!(mtime("/repo/new.md"), -21 * 3_600_000);
    assert_eq!(mtime("/repo/old.md"), -(68 * 24 + 9) * 3_600_000);
    assert_eq!(mtime("/repo/plain.md"), 0);

    let err = ctxsim::scenario::parse_scenario(
        "name: t\nworld:\n  model: m\n  files:\n    /repo/a: {contents: x, mtime: yesterday}\nscript:\n  - user: hi\n",
        "bad.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("bad.yaml:5") && err.contains("invalid RFC 3339 timestamp `yesterday`"), "{err}");
    let err = ctxsim::scenario::parse_scenario(
        "name: t\nworld:\n  model: m\n  files:\n    /repo/a: {contents: x, owner: me}\nscript:\n  - user: hi\n",
        "bad.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("bad.yaml:5") && err.contains("owner"), "{err}");
}
