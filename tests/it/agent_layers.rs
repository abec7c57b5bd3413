//! Layers 1–2 against the reference's measured structure (reference/layers-1-5.md §2, §3, §4, §8).

use std::collections::BTreeSet;

use ctxsim::agent::profile::{SizeProfile, js_len};
use ctxsim::agent::system_prompt::{
    BlockMode, GitStatus, McpServerInstructions, SystemPromptBuild, SystemPromptCache, SystemPromptInputs,
    SystemPromptOptions, build_system_prompt, fingerprint,
};
use ctxsim::agent::tools::{
    McpToolSpec, PoolInputs, ToolPool, ToolSearchMode, all_builtin_names, assemble_pool, builtin_tool, mcp_tool_name,
    schema_len,
};
use ctxsim::agent::user_context::{MemoryFile, MemoryKind, UserContextInputs, render_user_context};
use ctxsim::api::{CacheScope, SystemBlock, Tool};
use serde_json::json;

// ---- helpers -------------------------------------------------------------------------------

fn profile() -> SizeProfile {
    SizeProfile::claude_code_2_1_88()
}

fn m0() -> SystemPromptInputs {
    SystemPromptInputs::baseline_m0()
}

fn build(inputs: &SystemPromptInputs) -> SystemPromptBuild {
    build_system_prompt(inputs, &SystemPromptOptions::default(), &profile())
}

fn demo_mcp() -> Vec<McpToolSpec> {
    let schema = json!({"type": "object", "properties": {"a": {"type": "number"}}});
    vec![
        McpToolSpec { server: "demo srv".into(), tool: "echo".into(), description: "Echo back".into(), input_schema: schema.clone(), always_load: false },
        McpToolSpec { server: "demo srv".into(), tool: "add.numbers".into(), description: "Add".into(), input_schema: schema, always_load: false },
    ]
}

fn pool(edit: impl FnOnce(&mut PoolInputs)) -> ToolPool {
    let mut inputs = PoolInputs::default();
    edit(&mut inputs);
    assemble_pool(&inputs, &profile())
}

fn names(tools: &[Tool]) -> Vec<&str> {
    tools.iter().map(|tool| tool.name.as_str()).collect()
}

/// One line per block: index, length, cache_control, first 60 chars (newlines shown as ⏎).
fn render_blocks(blocks: &[SystemBlock]) -> String {
    blocks
        .iter()
        .enumerate()
        .map(|(index, block)| {
            let cc = match &block.cache_control {
                None => "-".to_owned(),
                Some(cc) => serde_json::to_string(cc).unwrap(),
            };
            let head: String = block.text.chars().take(60).collect::<String>().replace('\n', "⏎");
            format!("[{index}] {:>6} {cc:<40} {head}", js_len(&block.text))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn render_tools(tools: &[Tool]) -> String {
    tools
        .iter()
        .enumerate()
        .map(|(index, tool)| {
            let json = serde_json::to_string(tool).unwrap();
            let defer = if tool.defer_loading == Some(true) { " defer_loading" } else { "" };
            format!(
                "[{index:>2}] {:<28} desc {:>5} schema {:>4} json {:>5}{defer}",
                tool.name,
                js_len(tool.description.as_deref().unwrap_or("")),
                tool.input_schema.as_deref().map_or(0, schema_len),
                js_len(&json)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn within_one_percent(actual: usize, target: usize) -> bool {
    actual.abs_diff(target) * 100 <= target
}

// ---- system blocks: modes A / B / C ---------------------------------------------------------

#[test]
fn mode_b_is_four_blocks_with_global_static_block_at_reference_sizes() {
    let built = build(&m0());
    assert_eq!(built.mode, BlockMode::SystemPromptGlobal);
    let lens: Vec<usize> = built.blocks.iter().map(|b| js_len(&b.text)).collect();
    // §2.4 / §8 A: [84, 62, 11695, 14913] in print mode.
    assert_eq!(lens, vec![84, 62, 11695, 14913]);
    assert!(built.blocks[0].cache_control.is_none());
    assert!(built.blocks[1].cache_control.is_none());
    let cc = built.blocks[2].cache_control.as_ref().expect("static block is marked");
    assert_eq!(cc.scope, Some(CacheScope::Global));
    assert_eq!(serde_json::to_string(cc).unwrap(), r#"{"type":"ephemeral","scope":"global"}"#);
    assert!(built.blocks[3].cache_control.is_none(), "dynamic block has no breakpoint");
    assert!(built.blocks[0].text.starts_with("x-anthropic-billing-header: cc_version=2.1.88."));
    assert!(built.blocks[0].text.ends_with("; cc_entrypoint=sdk-cli; cch=00000;"));
    insta::assert_snapshot!("mode_b_m0_blocks", render_blocks(&built.blocks));
}

#[test]
fn interactive_mode_b_matches_the_derived_sizes() {
    let mut inputs = m0();
    inputs.interactive = true;
    inputs.entrypoint = "cli".into();
    inputs.enabled_tools = ctxsim::agent::tools::base_tool_names(true).iter().map(|s| s.to_string()).collect();
    let lens: Vec<usize> = build(&inputs).blocks.iter().map(|b| js_len(&b.text)).collect();
    assert_eq!(lens, vec![80, 57, 11696, 14913 + 259]);
}

#[test]
fn mode_a_with_inline_mcp_is_three_org_blocks() {
    let mut inputs = m0();
    inputs.inline_mcp_tools = true;
    inputs.mcp_servers = vec![McpServerInstructions { name: "demo srv".into(), instructions: "x".repeat(41) }];
    let built = build(&inputs);
    assert_eq!(built.mode, BlockMode::ToolBased);
    assert!(!built.boundary);
    let lens: Vec<usize> = built.blocks.iter().map(|b| js_len(&b.text)).collect();
    // §2.7 measured: [84 none, 62 {ephemeral}, 26788 {ephemeral}].
    assert_eq!(lens, vec![84, 62, 26788]);
    assert!(built.blocks[0].cache_control.is_none());
    for block in &built.blocks[1..] {
        assert_eq!(serde_json::to_string(block.cache_control.as_ref().unwrap()).unwrap(), r#"{"type":"ephemeral"}"#);
    }
    insta::assert_snapshot!("mode_a_inline_mcp_blocks", render_blocks(&built.blocks));
}

#[test]
fn mode_c_without_global_scope_and_ttl_option() {
    let options = SystemPromptOptions {
        global_cache_scope: false,
        ttl: Some(ctxsim::api::CacheTtl::OneHour),
        ..SystemPromptOptions::default()
    };
    let built = build_system_prompt(&m0(), &options, &profile());
    assert_eq!(built.mode, BlockMode::Default);
    assert_eq!(built.blocks.len(), 3);
    assert_eq!(js_len(&built.blocks[2].text), 11695 + 2 + 14913);
    assert!(built.blocks.iter().all(|b| b.cache_control.as_ref().is_none_or(|cc| cc.scope.is_none())));
    assert_eq!(
        serde_json::to_string(built.blocks[2].cache_control.as_ref().unwrap()).unwrap(),
        r#"{"type":"ephemeral","ttl":"1h"}"#
    );
    insta::assert_snapshot!("mode_c_blocks", render_blocks(&built.blocks));
}

#[test]
fn no_boundary_falls_back_to_mode_c_and_no_caching_drops_markers() {
    let options = SystemPromptOptions { boundary: false, ..SystemPromptOptions::default() };
    assert_eq!(build_system_prompt(&m0(), &options, &profile()).mode, BlockMode::Default);
    let options = SystemPromptOptions { prompt_caching: false, ..SystemPromptOptions::default() };
    let built = build_system_prompt(&m0(), &options, &profile());
    assert!(built.blocks.iter().all(|b| b.cache_control.is_none()));
}

#[test]
fn mcp_instructions_and_git_status_land_in_the_dynamic_block() {
    let mut inputs = m0();
    inputs.mcp_servers = vec![McpServerInstructions { name: "demo srv".into(), instructions: "x".repeat(41) }];
    inputs.is_git_repo = true;
    inputs.git_status = Some(GitStatus {
        branch: "main".into(),
        main_branch: "main".into(),
        user_name: None,
        status: String::new(),
        recent_commits: "abc123 first".into(),
    });
    let built = build(&inputs);
    let mcp = built.section("mcp_instructions").expect("section present");
    assert_eq!(js_len(&mcp.text), 176);
    assert!(mcp.text.contains("## demo srv\n"));
    let last = built.dynamic_sections.last().unwrap();
    assert_eq!(last.name, "git_status");
    assert!(last.text.starts_with("gitStatus: "));
    assert!(last.text.contains("Status:\n(clean)"));
    assert!(built.blocks[3].text.ends_with(&last.text));
}

// ---- fingerprint ---------------------------------------------------------------------------

#[test]
fn fingerprint_matches_measured_values_and_follows_the_first_user_message() {
    // §2.6 [M]: a skill-listing reminder first gives chars t, -, e → e09.
    assert_eq!(fingerprint("<system-reminder>\nThe following skills are available", "2.1.88"), "e09");
    assert_eq!(fingerprint("ab", "2.1.88").len(), 3);
    let a = build(&m0());
    let mut inputs = m0();
    inputs.first_user_text = "hello there, please fix the failing test".into();
    let b = build(&inputs);
    assert_ne!(a.fingerprint, b.fingerprint);
    assert_eq!(b.changed_sections(&a), vec!["attribution"]);
    assert_eq!(b.change_cause(&a).as_deref(), Some("system_section_changed:attribution"));
}

#[test]
fn the_fingerprint_reads_only_the_head_the_session_passes() {
    // The session passes the first user text's head, not the whole text: the fingerprint must
    // not move, with wide chars and surrogate pairs around the positions it reads.
    let texts = [
        String::new(),
        "ab".to_owned(),
        "<system-reminder>\nThe following skills are available".to_owned(),
        "éèà😀😀😀 ünïcödé 😀 text that goes on 😀 and on".to_owned(),
        "0123456789012345678😀9 tail".to_owned(),
        "01234567890123456789😀 tail".to_owned(),
        "x".repeat(20),
        "x".repeat(21),
    ];
    for text in &texts {
        let head = ctxsim::agent::system_prompt::fingerprint_head(text);
        assert!(text.starts_with(head));
        assert!(head.encode_utf16().count() <= 22, "{text:?} gives a head of {head:?}");
        assert_eq!(fingerprint(head, "2.1.88"), fingerprint(text, "2.1.88"), "{text:?}");
    }
}

// ---- memoization and section-change detection ------------------------------------------------

#[test]
fn memoized_sections_freeze_until_cleared_and_mcp_instructions_recompute() {
    let profile = profile();
    let options = SystemPromptOptions::default();
    let mut cache = SystemPromptCache::new();
    let first = cache.build(&m0(), &options, &profile);

    // A /model switch does not change the frozen env_info section.
    let mut switched = m0();
    switched.model_id = "claude-opus-4-6".into();
    switched.model_marketing_name = Some("Opus 4.6".into());
    let second = cache.build(&switched, &options, &profile);
    assert!(second.changed_sections(&first).is_empty());

    // A server connecting late changes mcp_instructions on the next build.
    let mut connected = switched.clone();
    connected.mcp_servers = vec![McpServerInstructions { name: "jira".into(), instructions: "Use JQL.".into() }];
    let third = cache.build(&connected, &options, &profile);
    assert_eq!(third.changed_sections(&second), vec!["mcp_instructions"]);
    assert_eq!(third.change_cause(&second).as_deref(), Some("system_section_changed:mcp_instructions"));

    // After compaction the memo is cleared and the model line catches up.
    cache.clear_sections();
    let fourth = cache.build(&connected, &options, &profile);
    assert_eq!(fourth.changed_sections(&third), vec!["env_info_simple"]);
}

/// Sessions on one thread building from the same inputs and memo states share their builds
/// (`build_shared` takes a build the thread kept), and every build, shared or not, is what
/// building in a memo of its own gives, the memo left the same; a memo in another state does
/// not take another's build.
#[test]
fn builds_shared_across_sessions_equal_building_in_each() {
    let profile = std::sync::Arc::new(profile());
    let options = SystemPromptOptions::default();
    let mut switched = m0();
    switched.model_id = "claude-opus-4-6".into();
    switched.model_marketing_name = Some("Opus 4.6".into());
    let run = || {
        let (mut shared, mut alone) = (SystemPromptCache::new(), SystemPromptCache::new());
        let mut builds = Vec::new();
        for (i, inputs) in [m0(), switched.clone(), switched.clone(), m0()].iter().enumerate() {
            if i == 2 {
                shared.clear_sections();
                alone.clear_sections();
            }
            let built = shared.build_shared(inputs, &options, &profile);
            assert_eq!(*built, alone.build(inputs, &options, &profile));
            assert_eq!(shared, alone);
            builds.push(built);
        }
        builds
    };
    let (first, second) = (run(), run());
    assert!(first.iter().zip(&second).all(|(a, b)| std::rc::Rc::ptr_eq(a, b)));
    // The frozen model line of a memo that saw the switched model first.
    let (mut other, mut alone) = (SystemPromptCache::new(), SystemPromptCache::new());
    other.build_shared(&switched, &options, &profile);
    alone.build(&switched, &options, &profile);
    let built = other.build_shared(&m0(), &options, &profile);
    assert_eq!(*built, alone.build(&m0(), &options, &profile));
    assert_ne!(*built, *first[0]);
}

// ---- size profile --------------------------------------------------------------------------

#[test]
fn every_padded_section_is_within_one_percent_of_its_target() {
    let profile = profile();
    let built = build(&m0());
    let expect = |name: &str, target: usize| {
        let section = built.section(name).unwrap_or_else(|| panic!("missing {name}"));
        let len = js_len(&section.text);
        assert!(within_one_percent(len, target), "{name}: {len} vs target {target}");
    };
    for name in ["intro", "system", "doing_tasks", "actions", "tone_and_style", "output_efficiency", "summarize_tool_results"] {
        expect(name, profile.section(name));
    }
    expect("using_your_tools", 1621);
    expect("session_guidance", 1286);
    expect("memory", 12498 + 56);
    expect("env_info_simple", 910);

    let mut language = m0();
    language.language = Some("Deutsch".into());
    let with_language = build(&language);
    assert_eq!(js_len(&with_language.section("language").unwrap().text), 176 + 14);
}

#[test]
fn raw_text_is_shorter_than_every_target_when_padding_is_off() {
    let options = SystemPromptOptions { padding: false, ..SystemPromptOptions::default() };
    let raw = build_system_prompt(&m0(), &options, &profile());
    let padded = build(&m0());
    for (raw, padded) in raw.static_sections.iter().zip(&padded.static_sections) {
        assert!(js_len(&raw.text) < js_len(&padded.text), "{} raw text is not shorter", raw.name);
    }
}

#[test]
fn every_tool_description_and_schema_is_within_one_percent_of_its_target() {
    let profile = profile();
    for (name, size) in &profile.tools {
        let tool = builtin_tool(name, &profile, true).unwrap_or_else(|| panic!("no definition for {name}"));
        let desc = js_len(&tool.description);
        assert!(within_one_percent(desc, size.description), "{name} description {desc} vs {}", size.description);
        let schema = schema_len(&tool.input_schema);
        assert!(within_one_percent(schema, size.schema), "{name} schema {schema} vs {}", size.schema);
        assert_eq!(tool.input_schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
    }
    for name in all_builtin_names() {
        assert!(builtin_tool(name, &profile, false).is_some(), "{name}");
    }
}

// ---- tool pool -----------------------------------------------------------------------------

#[test]
fn tst_mode_sends_nine_sorted_tools_and_announces_fourteen_deferred() {
    let pool = pool(|_| {});
    assert_eq!(pool.mode, ToolSearchMode::Tst);
    assert!(pool.tool_search);
    assert_eq!(names(&pool.tools), vec!["Agent", "Bash", "Edit", "Glob", "Grep", "Read", "Skill", "ToolSearch", "Write"]);
    assert!(pool.tools.iter().all(|t| t.cache_control.is_none() && t.defer_loading.is_none()));
    let listing = pool.deferred_listing().unwrap();
    // §3.4 [M]: print mode 14 names = 217 chars.
    assert_eq!(pool.deferred_names.len(), 14);
    assert_eq!(js_len(&listing), 217);
    assert!(listing.starts_with("<available-deferred-tools>\nAskUserQuestion\nCronCreate\n"));
    assert!(listing.ends_with("\nWebSearch\n</available-deferred-tools>"));
    insta::assert_snapshot!("tools_tst_print", render_tools(&pool.tools));
    insta::assert_snapshot!("deferred_listing_print", listing);
}

#[test]
fn interactive_deferred_listing_matches_measured_size() {
    let pool = pool(|inputs| inputs.todo_v2 = true);
    assert_eq!(pool.deferred_names.len(), 17);
    assert_eq!(js_len(&pool.deferred_listing().unwrap()), 246);
}

#[test]
fn standard_mode_sends_all_built_ins_alphabetically_then_mcp_sorted() {
    let pool = pool(|inputs| {
        inputs.enable_tool_search = Some("false".into());
        inputs.mcp_tools = demo_mcp();
    });
    assert_eq!(pool.mode, ToolSearchMode::Standard);
    assert!(!pool.tool_search && pool.deferred_listing().is_none());
    let sent = names(&pool.tools);
    assert_eq!(sent.len(), 24);
    assert_eq!(&sent[22..], &["mcp__demo_srv__add_numbers", "mcp__demo_srv__echo"]);
    assert!(!sent.contains(&"ToolSearch"));
    let builtins = &sent[..22];
    let mut sorted = builtins.to_vec();
    sorted.sort_by_key(|name| name.to_lowercase());
    assert_eq!(builtins, sorted.as_slice());
    assert!(pool.inline_mcp, "inline MCP tools force system mode A");
    insta::assert_snapshot!("tools_standard_print_with_mcp", render_tools(&pool.tools));
}

#[test]
fn mcp_tools_are_deferred_under_tool_search_unless_always_load() {
    let pool_deferred = pool(|inputs| inputs.mcp_tools = demo_mcp());
    assert!(!pool_deferred.inline_mcp);
    assert!(pool_deferred.deferred_names.ends_with(&["mcp__demo_srv__add_numbers".to_owned(), "mcp__demo_srv__echo".to_owned()]));
    let pool_always = pool(|inputs| {
        inputs.mcp_tools = demo_mcp();
        inputs.mcp_tools[1].always_load = true;
    });
    assert!(pool_always.inline_mcp);
    assert_eq!(pool_always.tools.last().unwrap().name, "mcp__demo_srv__add_numbers");
}

#[test]
fn discovered_tools_are_sent_in_sorted_position_with_defer_loading() {
    let pool = pool(|inputs| {
        inputs.discovered = BTreeSet::from(["TodoWrite".to_owned(), "mcp__demo_srv__echo".to_owned()]);
        inputs.mcp_tools = demo_mcp();
    });
    let sent = names(&pool.tools);
    // §reference oracle s6m: TodoWrite lands at tools[7], between Skill and ToolSearch.
    assert_eq!(sent[7], "TodoWrite");
    assert_eq!(pool.tools[7].defer_loading, Some(true));
    assert_eq!(sent.last(), Some(&"mcp__demo_srv__echo"));
    let json = serde_json::to_string(&pool.tools[7]).unwrap();
    assert!(json.starts_with(r#"{"name":"TodoWrite","description":"#));
    assert!(json.ends_with(r#","defer_loading":true}"#));
    // Discovery does not remove a name from the announcement.
    assert!(pool.deferred_names.contains(&"TodoWrite".to_owned()));
}

#[test]
fn tool_search_modes_and_gates() {
    assert_eq!(ToolSearchMode::from_env(None, false), ToolSearchMode::Tst);
    assert_eq!(ToolSearchMode::from_env(Some("true"), false), ToolSearchMode::Tst);
    assert_eq!(ToolSearchMode::from_env(Some("auto:0"), false), ToolSearchMode::Tst);
    assert_eq!(ToolSearchMode::from_env(Some("auto"), false), ToolSearchMode::TstAuto { percent: 10 });
    assert_eq!(ToolSearchMode::from_env(Some("auto:25"), false), ToolSearchMode::TstAuto { percent: 25 });
    assert_eq!(ToolSearchMode::from_env(Some("auto:100"), false), ToolSearchMode::Standard);
    assert_eq!(ToolSearchMode::from_env(Some("false"), false), ToolSearchMode::Standard);
    assert_eq!(ToolSearchMode::from_env(Some("true"), true), ToolSearchMode::Standard);

    // A proxy base URL with the env unset: no ToolSearch, everything inline.
    let proxied = pool(|inputs| inputs.custom_base_url = true);
    assert!(!proxied.tool_search_available && proxied.tools.len() == 22);
    // ...unless the env asks for it.
    let asked = pool(|inputs| {
        inputs.custom_base_url = true;
        inputs.enable_tool_search = Some("true".into());
    });
    assert!(asked.tool_search);
    // Haiku cannot take tool_reference blocks.
    assert!(!pool(|inputs| inputs.model_id = "claude-haiku-4-5".into()).tool_search);
    // tst-auto: the 14 deferred built-ins (~45k chars) stay under 50,000 chars for 200K.
    let auto = pool(|inputs| inputs.enable_tool_search = Some("auto".into()));
    assert!(!auto.tool_search);
    assert!(pool(|inputs| inputs.enable_tool_search = Some("auto:5".into())).tool_search);
}

#[test]
fn mcp_names_are_normalized() {
    assert_eq!(mcp_tool_name("demo srv", "add.numbers"), "mcp__demo_srv__add_numbers");
    assert_eq!(mcp_tool_name("plugin:p:s", "t"), "mcp__plugin_p_s__t");
    assert_eq!(mcp_tool_name("claude.ai  My Server!", "do it"), "mcp__claude_ai_My_Server__do_it");
}

// ---- messages[0] user context ----------------------------------------------------------------

#[test]
fn user_context_with_only_the_date_is_305_chars() {
    let inputs = UserContextInputs { memory_files: vec![], claude_md_disabled: false, date: "2026-01-15".into(), padding: true };
    let text = render_user_context(&inputs, &profile());
    assert_eq!(js_len(&text), 305);
    assert!(text.starts_with("<system-reminder>\n"));
    assert!(text.ends_with("\n</system-reminder>\n"));
    assert!(text.contains("\n# currentDate\nCurrent date is 2026-01-15.\n\n      IMPORTANT"));
}

#[test]
fn user_context_renders_memory_files_in_order() {
    let files = vec![
        MemoryFile { path: "/repo/CLAUDE.md".into(), kind: MemoryKind::Project, content: "  Use tabs.\n".into() },
        MemoryFile { path: "/repo/empty.md".into(), kind: MemoryKind::Project, content: " \n".into() },
        MemoryFile { path: "/repo/CLAUDE.local.md".into(), kind: MemoryKind::Local, content: "Mine.".into() },
    ];
    let inputs = UserContextInputs { memory_files: files, claude_md_disabled: false, date: "2026-01-15".into(), padding: true };
    let text = render_user_context(&inputs, &profile());
    let claude_md_len = 193 + 2 + (15 + 15 + 50 + 9) + 2 + (15 + 21 + 54 + 5);
    assert_eq!(js_len(&text), 305 + "# claudeMd\n".len() + claude_md_len + 1);
    assert!(text.contains("Contents of /repo/CLAUDE.md (project instructions, checked into the codebase):\n\nUse tabs.\n\nContents of /repo/CLAUDE.local.md"));
    assert!(!text.contains("empty.md"));
    assert!(text.find("# claudeMd").unwrap() < text.find("# currentDate").unwrap());
    insta::assert_snapshot!("user_context_two_files", text);
}


#[test]
#[ignore = "prints the M0 dynamic block for reading"]
fn dump_dynamic_block() {
    let built = build(&m0());
    let text = &built.blocks[3].text;
    eprintln!("{}", &text[..1400]);
    let env = &built.section("env_info_simple").unwrap().text;
    eprintln!("----\n{env}");
}
