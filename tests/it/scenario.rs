//! Scenario files: the shipped examples, the schema, error messages, and the World they build.

use ctxsim::api::{ContentBlock, StopReason, ToolResultContent};
use ctxsim::scenario::{Scenario, Step, load_scenario, parse_scenario};
use proptest::prelude::*;

// ---- helpers ---------------------------------------------------------------------------------

/// A scenario with a fixed 4-line header (so script lines start at line 5) and `script` below it.
fn doc(script: &str) -> String {
    format!("name: t\nworld:\n  model: claude-sonnet-4-5\nscript:\n{}", script.trim_start_matches('\n'))
}

fn parse(text: &str) -> Scenario {
    parse_scenario(text, "t.yaml").unwrap_or_else(|e| panic!("{e}"))
}

/// The error message of a scenario that must fail to load.
fn err(text: &str) -> String {
    match parse_scenario(text, "scenarios/bad.yaml") {
        Ok(_) => panic!("scenario loaded but should fail:\n{text}"),
        Err(e) => e.to_string(),
    }
}

/// The script rendered one step per line, for compact assertions.
fn steps(scenario: &Scenario) -> String {
    scenario
        .script
        .iter()
        .map(|step| match step {
            Step::User { text } => format!("user {text:?}"),
            Step::Assistant(a) => {
                let blocks: Vec<String> = a
                    .content
                    .iter()
                    .map(|b| match b {
                        ContentBlock::Text { text, .. } => format!("text {text:?}"),
                        ContentBlock::ToolUse { id, name, input, .. } => format!("tool_use {id} {name} {input}"),
                        ContentBlock::Thinking { thinking, signature, .. } => format!("thinking {thinking:?} {signature}"),
                        other => other.kind().to_owned(),
                    })
                    .collect();
                format!("assistant[{}] {} out={} [{}]", a.lane, a.stop_reason.as_str(), a.output_tokens, blocks.join(", "))
            }
            Step::ToolOutput(outputs) => {
                let items: Vec<String> =
                    outputs.iter().map(|o| format!("{}={:?}{}", o.tool_use_id, o.content, if o.is_error { " (error)" } else { "" })).collect();
                format!("tool_output {}", items.join(", "))
            }
            Step::Wait { ms } => format!("wait {ms}ms"),
            Step::WriteFile { path, content } => format!("write_file {path} {content:?}"),
            Step::RemoveFile { path } => format!("remove_file {path}"),
            Step::ModelSwitch { model } => format!("model_switch {model}"),
            Step::McpConnect { server } => format!("mcp_connect {server}"),
            Step::McpDisconnect { server } => format!("mcp_disconnect {server}"),
            Step::McpListChanged { server, tools } => format!("mcp_list_changed {server} {}", tools.len()),
            Step::PluginEnable { root } => format!("plugin_enable {root}"),
            Step::PluginReload => "plugin_reload".to_owned(),
            Step::Clear => "clear".to_owned(),
            Step::Resume => "resume".to_owned(),
            Step::Compact => "compact".to_owned(),
            Step::Attachment { kind, text, .. } => format!("attachment {kind} ({} chars)", text.len()),
            Step::Microcompact { tool_use_ids, history_chars } => format!("microcompact {} results, {history_chars} history chars", tool_use_ids.len()),
            Step::ResumeLost { tool_use_ids } => format!("resume_lost {} tool uses", tool_use_ids.len()),
            Step::Git(git) => format!("git {} ({} status lines, {} commits)", git.branch, git.status.len(), git.recent_commits.len()),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ---- shipped scenarios -----------------------------------------------------------------------

#[test]
fn shipped_scenarios_load_cleanly() {
    let mut names = Vec::new();
    let mut paths: Vec<_> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    paths.sort();
    for path in paths {
        let scenario = load_scenario(&path).unwrap_or_else(|e| panic!("{e}"));
        let world = scenario.into_world();
        // Replies are scripted for the main lane and the lanes the agent opens itself.
        assert!(world.model.unconsumed().iter().all(|(lane, _)| ["main", "compact", "session_memory", "side"].contains(&lane.as_str()) || lane.starts_with("subagent:")));
        names.push(scenario.name);
    }
    assert!(names.len() >= 3, "{names:?}");
}

#[test]
fn read_and_answer_builds_its_world() {
    let scenario = load_scenario(concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/read-and-answer.yaml")).unwrap();
    insta::assert_snapshot!(steps(&scenario), @r#"
user "Read main.rs and explain it"
assistant[main] tool_use out=40 [text "Let me look.", tool_use toolu_01BJCbGg73QGbKdZ3iINCwO6 Read {"file_path":"/repo/src/main.rs"}]
assistant[main] end_turn out=7 [text "It prints `hello` and exits."]
"#);
    let mut world = scenario.into_world();
    assert_eq!(world.clock.rfc3339(), "2026-03-01T09:00:00.000Z");
    assert_eq!(world.clock.date_string(), "2026-03-01");
    assert_eq!(world.cwd, "/repo");
    assert_eq!(world.context_window, Some(200_000));
    assert!(world.fs.read("/repo/src/main.rs").unwrap().contains("println!"));
    assert!(world.fs.journal().is_empty());
    let first = world.model.next_reply("main").unwrap();
    assert_eq!(first.stop_reason, StopReason::ToolUse);
    assert_eq!(first.output_tokens, 40);
    assert!(world.model.next_reply("main").is_ok());
    assert!(world.model.next_reply("main").is_err());
}

#[test]
fn multi_turn_resolves_tool_outputs_relative_paths_and_env() {
    let scenario = load_scenario(concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/multi-turn.yaml")).unwrap();
    insta::assert_snapshot!(steps(&scenario), @r##"
user "Run the tests"
assistant[main] tool_use out=30 [thinking "The user wants the test suite run; cargo test is the command." sig_760cfbbda2dcda50, tool_use toolu_014F35K2wYGSNHOY795zmoYU Bash {"command":"cargo test","description":"Run the tests"}]
tool_output toolu_014F35K2wYGSNHOY795zmoYU="running 0 tests\ntest result: ok. 0 passed; 0 failed\n"
assistant[main] end_turn out=11 [text "No tests yet; the suite passes trivially."]
wait 90000ms
user "Add a test for add()"
assistant[main] tool_use out=34 [tool_use toolu_edit_1 Edit {"file_path":"/repo/src/lib.rs","old_string":"a + b }","new_string":"a + b }\n\n#[test]\nfn adds() { assert_eq!(add(2, 2), 4); }"}]
assistant[main] end_turn out=5 [text "Added a test `adds`."]
write_file /repo/README.md "# demo\n"
wait 120000ms
user "Thanks"
assistant[main] end_turn out=4 [text "You're welcome."]
"##);
    let world = scenario.into_world();
    assert_eq!(world.env_var("BASH_MAX_OUTPUT_LENGTH"), Some("30000"));
    assert!(world.fs.is_file("/repo/src/lib.rs") && world.fs.is_file("/repo/Cargo.toml"));
    assert_eq!(world.clock.date_string(), "2026-03-02");
    let (id, output) = world.tool_outputs.iter().next().unwrap();
    assert!(id.starts_with("toolu_01") && id.len() == 30, "{id}");
    assert!(matches!(&output.content, ToolResultContent::Text(t) if t.contains("0 passed")));
}

#[test]
fn same_seed_same_scenario_same_ids_and_world() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/multi-turn.yaml")).unwrap();
    let a = parse(&text);
    let b = parse(&text);
    assert_eq!(a, b);
    let c = parse(&text.replace("seed: 11", "seed: 12"));
    assert_ne!(steps(&a), steps(&c), "tool_use ids derive from the seed");
}

// ---- schema details --------------------------------------------------------------------------

#[test]
fn durations_accept_numbers_and_units() {
    let s = parse(&doc("- wait: 1500\n- wait: 90s\n- wait: 10m\n- wait: 1h30m\n- wait: 250ms\n- wait: 1d\n"));
    insta::assert_snapshot!(steps(&s), @r"
wait 1500ms
wait 90000ms
wait 600000ms
wait 5400000ms
wait 250ms
wait 86400000ms
");
}

#[test]
fn tool_outputs_bind_by_id_before_name() {
    let s = parse(&doc(r#"
- user: go
- assistant:
    - tool_use: {id: a, name: Bash, input: {command: ls}}
    - tool_use: {id: b, name: Bash, input: {command: pwd}}
    - tool_use: {id: c, name: WebFetch}
- tool_output:
    Bash: "generic"
    b: "/repo"
    WebFetch: {content: "403 Forbidden", is_error: true}
"#));
    insta::assert_snapshot!(steps(&s), @r#"
user "go"
assistant[main] tool_use out=13 [tool_use a Bash {"command":"ls"}, tool_use b Bash {"command":"pwd"}, tool_use c WebFetch {}]
tool_output a="generic", b="/repo", c="403 Forbidden" (error)
"#);
}

/// An output keyed by a tool name is every call of that name's (each a whole copy: the check
/// moves the output into the last and copies it into the others).
#[test]
fn a_named_output_binds_every_call_of_the_name() {
    let s = parse(&doc(r#"
- user: go
- assistant:
    - tool_use: {id: a, name: Read, input: {file_path: x}}
    - tool_use: {id: b, name: Read, input: {file_path: y}}
    - tool_use: {id: c, name: Read, input: {file_path: z}}
- tool_output:
    Read: {content: "same", is_error: true, images: [{media_type: image/png, base64_bytes: 400}]}
"#));
    insta::assert_snapshot!(steps(&s), @r#"
user "go"
assistant[main] tool_use out=16 [tool_use a Read {"file_path":"x"}, tool_use b Read {"file_path":"y"}, tool_use c Read {"file_path":"z"}]
tool_output a="same" (error), b="same" (error), c="same" (error)
"#);
    let Step::ToolOutput(outputs) = &s.script[2] else { panic!("a tool_output step") };
    assert!(outputs.iter().all(|o| o.images.len() == 1 && o.images[0].base64_bytes == 400 && o.tool_name == "Read"), "{outputs:?}");
}

/// A tool output's text and the file it carries are held once: by the scenario, every copy of
/// it (a what-if plan's) and the built script the runs take their results from.
#[test]
fn a_tool_output_is_held_once_by_every_copy_and_the_built_script() {
    let s = parse(&doc(r#"
- user: go
- assistant:
    - tool_use: {id: a, name: Read, input: {file_path: /x}}
    - tool_use: {id: b, name: Bash, input: {command: ls}}
- tool_output:
    a: {content: "     1\tone", file: {path: /x, content: "one"}}
    b: "listing"
"#));
    let copy = s.clone();
    let built = copy.built_script();
    let (Step::ToolOutput(outputs), Step::ToolOutput(copied)) = (&s.script[2], &copy.script[2]) else { panic!("a tool_output step") };
    for (output, copied) in outputs.iter().zip(copied) {
        assert!(copied.content.same(&output.content), "{}", output.tool_use_id);
        let Some(ToolResultContent::Text(result)) = built.tool_outputs.get(&output.tool_use_id).map(|o| &o.content) else { panic!("{} is a text result", output.tool_use_id) };
        assert!(result.same(&output.content), "{}", output.tool_use_id);
    }
    let file = outputs[0].file.as_ref().expect("the Read's file");
    assert!(built.tool_outputs["a"].file.as_ref().is_some_and(|(path, content)| path == "/x" && content.same(&file.content)));
    assert!(copied[0].file.as_ref().is_some_and(|f| f.content.same(&file.content)));
}

#[test]
fn assistant_modifiers() {
    let s = parse(&doc(r#"
- assistant: [{thinking: "hmm"}, {text: "partial"}]
  lane: subagent:explore
  stop_reason: max_tokens
  output_tokens: 77
  latency: {first_token: 300ms, total: 2s}
- assistant: [{text: "done"}]
  usage: {output_tokens: 5, input_tokens: 100}
"#));
    insta::assert_snapshot!(steps(&s), @r#"
assistant[subagent:explore] max_tokens out=77 [thinking "hmm" sig_ee463ebf5909e8e5, text "partial"]
assistant[main] end_turn out=5 [text "done"]
"#);
    let Step::Assistant(a) = &s.script[0] else { panic!() };
    assert_eq!(a.latency.map(|l| (l.first_token_ms, l.total_ms)), Some((300, 2000)));
    let world = s.into_world();
    assert_eq!(world.model.remaining("subagent:explore"), 1);
}

#[test]
fn fallback_lanes_synthesize_from_the_scenario() {
    let mut world = parse(
        "name: t\nworld:\n  model: m\n  fallback: {summary_tokens: 50}\nscript:\n- user: hi\n- assistant: [{text: yo}]\n",
    )
    .into_world();
    let summary = world.model.next_reply("compact").unwrap();
    assert!(summary.synthetic && (50..=60).contains(&summary.output_tokens));
    assert!(world.model.next_reply("main").is_ok());
    assert!(world.model.next_reply("main").is_err());
}

#[test]
fn expect_budgets_are_read() {
    let s = parse(&format!(
        "{}expect:\n  cache_breaks: 0\n  min_cache_hit_ratio: 0.8\n  max_cost_usd: 1.5\n  compactions: {{auto: 1, microcompact: 0}}\n  peak_context_tokens: 50000\n",
        doc("- user: hi\n")
    ));
    assert_eq!(s.expect.cache_breaks, Some(0));
    assert_eq!(s.expect.min_cache_hit_ratio, Some(0.8));
    let stages: Vec<_> = s.expect.compactions.unwrap().iter().collect();
    assert_eq!(stages, [("microcompact", 0), ("auto", 1)]);
}

// ---- error messages: file, line, column, field -----------------------------------------------

#[test]
fn error_unknown_block_kind() {
    insta::assert_snapshot!(err(&doc("- user: hi\n- assistant:\n    - txt: hello\n")), @"scenarios/bad.yaml:7:7: script[1].assistant[0]: unknown field `txt`, expected one of `text`, `thinking`, `redacted_thinking`, `tool_use`");
}

#[test]
fn error_unknown_step_key() {
    insta::assert_snapshot!(err(&doc("- user: hi\n- usr: again\n")), @"scenarios/bad.yaml:6:3: script[1]: unknown field `usr`, expected one of `user`, `assistant`, `tool_output`, `wait`, `write_file`, `remove_file`, `mcp_connect`, `mcp_disconnect`, `mcp_list_changed`, `plugin_enable`, `plugin_reload`, `model_switch`, `git`, `clear`, `compact`, `resume`, `attachment`, `microcompact`, `resume_lost`, `lane`, `stop_reason`, `usage`, `output_tokens`, `latency`");
}

#[test]
fn error_unknown_top_level_key() {
    insta::assert_snapshot!(err(&format!("{}expectations: {{}}\n", doc("- user: hi\n"))), @"scenarios/bad.yaml:6:1: unknown field `expectations`, expected one of `name`, `description`, `world`, `script`, `expect`");
}

#[test]
fn error_wrong_type() {
    insta::assert_snapshot!(err("name: t\nworld:\n  model: m\n  context_window: big\n"), @r#"scenarios/bad.yaml:4:19: world.context_window: invalid type: string "big", expected u64"#);
}

#[test]
fn error_missing_field() {
    insta::assert_snapshot!(err("world:\n  model: m\nscript: []\n"), @"scenarios/bad.yaml:1:1: missing field `name`");
}

#[test]
fn error_bad_duration() {
    insta::assert_snapshot!(err(&doc("- user: hi\n- wait: 10 minutes\n")), @"scenarios/bad.yaml:6:9: script[1].wait: invalid duration `10 minutes`: missing unit after a number; expected milliseconds or e.g. `90s`, `10m`, `2h`, `1h30m`");
}

#[test]
fn error_negative_wait() {
    insta::assert_snapshot!(err(&doc("- wait: -5\n")), @"scenarios/bad.yaml:5:9: script[0].wait: invalid duration `-5`: durations must not be negative");
    insta::assert_snapshot!(err(&doc("- wait: -5m\n")), @"scenarios/bad.yaml:5:9: script[0].wait: invalid duration `-5m`: durations must not be negative; expected milliseconds or e.g. `90s`, `10m`, `2h`, `1h30m`");
}

#[test]
fn error_bad_timestamp() {
    insta::assert_snapshot!(err("name: t\nworld:\n  model: m\n  clock_start: 2026-13-01\n"), @"scenarios/bad.yaml:4:16: world.clock_start: invalid RFC 3339 timestamp `2026-13-01` (e.g. `2026-03-01T09:00:00Z`): failed to parse two digit integer as month: parameter 'month' is not in the required range of 1..=12");
}

#[test]
fn error_bad_time_zone() {
    insta::assert_snapshot!(err("name: t\nworld:\n  model: m\n  timezone: Mars/Olympus\n"), @"scenarios/bad.yaml:4:13: world.timezone: unknown time zone `Mars/Olympus`: failed to find time zone `Mars/Olympus` in time zone database");
}

#[test]
fn error_tool_output_for_unknown_tool_use() {
    insta::assert_snapshot!(err(&doc(r#"
- user: go
- assistant:
    - tool_use: {id: toolu_a, name: Bash, input: {command: ls}}
- tool_output:
    Bash: ok
    toolu_zzz: nope
"#)), @"scenarios/bad.yaml:10:16: script[2].tool_output.toolu_zzz: `toolu_zzz` is neither a tool_use id nor a tool name of script[1], which calls Bash (toolu_a)");
}

#[test]
fn error_tool_output_without_a_call() {
    insta::assert_snapshot!(err(&doc("- user: hi\n- tool_output: {Bash: ok}\n")), @"scenarios/bad.yaml:6:16: script[1].tool_output: no earlier assistant step calls a tool");
}

#[test]
fn error_two_kinds_in_one_step() {
    insta::assert_snapshot!(err(&doc("- user: hi\n  wait: 5s\n")), @"scenarios/bad.yaml:6:9: script[0].wait: a step has exactly one kind, found `user` and `wait`; split it into two steps");
}

#[test]
fn error_modifier_on_wrong_step() {
    insta::assert_snapshot!(err(&doc("- user: hi\n  lane: compact\n")), @"scenarios/bad.yaml:6:9: script[0].lane: `lane` applies only to `assistant` steps, not `user`");
}

#[test]
fn error_duplicate_tool_use_id() {
    insta::assert_snapshot!(err(&doc(r#"
- assistant: [{tool_use: {id: x, name: Read}}]
- assistant: [{tool_use: {id: x, name: Read}}]
"#)), @"scenarios/bad.yaml:6:26: script[1].assistant[0].tool_use: tool_use id `x` is used twice");
}

#[test]
fn error_microcompact_of_an_unknown_tool_use() {
    insta::assert_snapshot!(err(&doc(r#"
- user: go
- assistant: [{tool_use: {id: toolu_a, name: Read}}]
- tool_output: {toolu_a: ok}
- microcompact: {tool_use_ids: [toolu_a, toolu_zzz]}
"#)), @"scenarios/bad.yaml:8:42: script[3].microcompact.tool_use_ids[1]: no earlier tool use has id `toolu_zzz`");
}

#[test]
fn error_relative_cwd_and_conflicting_files() {
    insta::assert_snapshot!(err("name: t\nworld:\n  model: m\n  cwd: repo\n"), @"scenarios/bad.yaml:4:8: world.cwd: must be an absolute path, found `repo`");
    insta::assert_snapshot!(err("name: t\nworld:\n  model: m\n  files:\n    /repo/a: x\n    a/b: y\n"), @"scenarios/bad.yaml:6:10: world.files.a/b: failed to access /repo/a/b: a parent path is a file, not a directory");
}

#[test]
fn error_yaml_syntax() {
    insta::assert_snapshot!(err("name: t\nworld:\n  model: m\n script: [\n"), @"scenarios/bad.yaml:4:2: did not find expected key, while parsing a block mapping");
}

#[test]
fn error_ratio_out_of_range() {
    insta::assert_snapshot!(err(&format!("{}expect:\n  min_cache_hit_ratio: 80\n", doc("- user: hi\n"))), @"scenarios/bad.yaml:7:24: expect.min_cache_hit_ratio: must be between 0 and 1, found 80");
}

#[test]
fn error_io_names_the_file() {
    let e = load_scenario("does/not/exist.yaml").unwrap_err();
    assert!(e.to_string().starts_with("failed to read scenario does/not/exist.yaml: "), "{e}");
}

// ---- robustness ------------------------------------------------------------------------------

const VALID: &str = include_str!("../../scenarios/multi-turn.yaml");

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn parser_never_panics_on_arbitrary_text(text in "\\PC{0,300}") {
        let _ = parse_scenario(&text, "fuzz.yaml");
    }

    #[test]
    fn parser_never_panics_on_mutated_scenarios(
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0usize..4, "[ \\-:{}\\[\\]a-z0-9#&*!|>'\"\n]{0,4}"), 1..6),
    ) {
        let mut text = VALID.to_owned();
        for (at, how, insert) in edits {
            let mut cut = at.index(text.len() + 1);
            while !text.is_char_boundary(cut) { cut -= 1; }
            match how {
                0 => text.insert_str(cut, &insert),
                1 => { let end = (cut + insert.len() + 1).min(text.len()); let mut end = end; while !text.is_char_boundary(end) { end -= 1; } text.replace_range(cut..end, ""); }
                2 => { let mut end = (cut + 8).min(text.len()); while !text.is_char_boundary(end) { end -= 1; } text.replace_range(cut..end, &insert); }
                _ => { let line_start = text[..cut].rfind('\n').map_or(0, |i| i + 1); text.insert_str(line_start, "  "); }
            }
        }
        if let Err(e) = parse_scenario(&text, "fuzz.yaml") {
            // Every content error carries the file name.
            prop_assert!(e.to_string().starts_with("fuzz.yaml"), "{}", e);
        }
    }
}

#[test]
fn error_two_kinds_in_one_block() {
    insta::assert_snapshot!(err(&doc("- assistant:\n    - text: hi\n      tool_use: {name: Read}\n")), @"scenarios/bad.yaml:6:7: script[0].assistant[0]: a block has exactly one kind, found `text` and `tool_use`; put each in its own list item");
}

#[test]
fn error_wrong_type_inside_a_block() {
    insta::assert_snapshot!(err(&doc("- assistant:\n    - tool_use: {name: Read, inptu: {}}\n")), @"scenarios/bad.yaml:6:30: script[0].assistant[0].tool_use: unknown field `inptu`, expected one of `id`, `name`, `input`");
}

#[test]
fn into_world_is_deterministic() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/multi-turn.yaml")).unwrap();
    let render = |s: &Scenario| format!("{:?}", s.into_world());
    assert_eq!(render(&parse(&text)), render(&parse(&text)));
}

#[test]
fn error_image_pixels_half_given_or_unholdable() {
    let image = |spec: &str| doc(&format!("- user: go\n- assistant: [{{tool_use: {{id: toolu_a, name: Read}}}}]\n- tool_output: {{toolu_a: {{content: shot, images: [{spec}]}}}}\n"));
    let half = err(&image("{base64_bytes: 400, width: 512}"));
    assert!(half.contains("script[2].tool_output.toolu_a.images[0].height: an image with a `width` needs its `height` too"), "{half}");
    let short = err(&image("{base64_bytes: 30, width: 512, height: 320}"));
    assert!(short.contains("script[2].tool_output.toolu_a.images[0].base64_bytes: 30 cannot hold"), "{short}");
    let ragged = err(&image("{base64_bytes: 401, width: 512, height: 320}"));
    assert!(ragged.contains("images[0].base64_bytes: 401 cannot hold"), "{ragged}");
}

// ---- YAML depth ------------------------------------------------------------------------------

/// What YAML reads as scalar text is no nesting to the depth check: a block scalar's lines
/// (deeply indented code), brackets and escaped quotes in quoted scalars (also across lines),
/// and brackets inside plain scalars. The text loads as the parser reads it.
#[test]
fn text_inside_scalars_is_no_nesting() {
    use ctxsim::scenario::{MAX_YAML_DEPTH, check_yaml_depth};
    let deep = MAX_YAML_DEPTH + 10;
    // Code 74 levels deep in a block scalar, under a key and under a sequence entry.
    let code: String = (0..deep).map(|i| format!("{}{{ if (x) [\n", "  ".repeat(i))).collect();
    let indented = |by: usize| code.lines().map(|l| format!("{}{l}\n", " ".repeat(by))).collect::<String>();
    let block = doc(&format!("  - user: |\n{}  - assistant:\n      - text: |-\n{}      - text: done\n", indented(6), indented(10)));
    assert_eq!(check_yaml_depth(&block), Ok(()));
    let scenario = parse(&block);
    match &scenario.script[0] {
        Step::User { text, .. } => assert_eq!(text.as_str(), code),
        other => panic!("{other:?}"),
    }
    // A quoted scalar with escaped quotes and 74 unbalanced brackets, on one line and folded
    // over several.
    let brackets = format!("{}\\\"{}", "{[".repeat(deep), "'(".repeat(deep));
    let single = "{[(".repeat(deep);
    let quoted = doc(&format!("  - user: \"a \\\"quoted\\\" {brackets}\"\n  - user: \"{brackets}\n      {brackets}\n      end\"\n  - user: '{single} it''s \" {{['\n"));
    assert_eq!(check_yaml_depth(&quoted), Ok(()));
    assert_eq!(parse(&quoted).script.len(), 3);
    // Brackets after a plain scalar's first character are text in block context.
    let plain = doc(&format!("  - user: a {}\n  - user: b\n", "{[".repeat(deep)));
    assert_eq!(check_yaml_depth(&plain), Ok(()));
    assert_eq!(parse(&plain).script.len(), 2);
}

/// Real nesting is still counted where the parser nests: a flow collection a value opens (after
/// an anchor or tag too), continued over lines, inside quotes' neighbours, and block levels after
/// a block scalar ends.
#[test]
fn nesting_the_parser_reads_is_refused() {
    use ctxsim::scenario::{MAX_YAML_DEPTH, check_yaml_depth};
    let deep = MAX_YAML_DEPTH + 1;
    let refused = |text: &str| check_yaml_depth(text).expect_err(text).1;
    assert!(refused(&format!("world: {}{}\n", "[".repeat(deep), "]".repeat(deep))).contains("levels deep"));
    assert!(refused(&format!("world: &a !!seq {}\n", "[".repeat(deep))).contains("levels deep"));
    // Spread over lines, with quoted strings holding closing brackets in between.
    let lines: String = (0..deep).map(|_| "[\"]}\", \n").collect();
    refused(&format!("world: {lines}"));
    // Quotes inside a plain flow scalar open nothing: the brackets after them count.
    refused(&format!("world: [a\"b, {}\n", "[".repeat(deep)));
    // A quoted key ends at its closing quote, past `''` and `\"`: its value nests.
    refused(&format!("'it''s': {}\n", "[".repeat(deep)));
    refused(&format!("- \"a\\\" [\": {}\n", "{".repeat(deep)));
    refused(&format!("world: ['it''s [', {}\n", "[".repeat(deep)));
    // A block scalar ends at the first line not indented past its key; what follows nests.
    let after: String = (0..deep).map(|i| format!("{}- \n", "  ".repeat(i))).collect();
    refused(&format!("a: |\n  text\nb:\n{after}"));
    refused(&format!("- a: |\n    text\n  b:\n{after}"));
    // A backslash ending a double-quoted line escapes the line break, not the next line's quote.
    refused(&format!("a: \"x\\\n  \"\nb: {}\n", "[".repeat(deep)));
    // A flow collection as a key: its value follows the `: `.
    refused(&format!("[a]: {}\n", "[".repeat(deep)));
    refused(&format!("- {{a: 1}}: {}\n", "[".repeat(deep)));
    // A `:` inside plain text opens no quote after it.
    refused(&format!("world: [a:'x, {}\n", "[".repeat(deep)));
    // Lines inside a flow collection sit below the block entries of the line that opened it.
    let entries = "- ".repeat(MAX_YAML_DEPTH - 4);
    refused(&format!("{entries}[\n{}\n", "[".repeat(8)));
}
