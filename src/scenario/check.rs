//! Checks that serde cannot express: one kind per step, modifiers only where they apply,
//! tool outputs bound to real tool_use ids, paths that fit in a filesystem, sane budgets.
//! Every problem carries the field path of the value at fault; the loader turns that path into
//! a line and column.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Map;

use crate::api::{ContentBlock, StopReason, Usage};
use crate::world::{Clock, Latency, Rng, VirtualFs, estimate_output_tokens, normalize_path};

use super::raw::{BlockSpec, RawScenario, RawStep, ToolOutputSpec};
use super::schema::{AssistantStep, Scenario, Step, ToolOutput, WorldSpec};

/// One segment of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

pub(crate) fn key(k: &str) -> Seg {
    Seg::Key(k.to_owned())
}

/// Formats a path the way serde_path_to_error does: `script[3].assistant[0]`.
pub(crate) fn path_string(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// A failed check: where, and what.
#[derive(Debug)]
pub(crate) struct Problem {
    pub path: Vec<Seg>,
    pub message: String,
}

fn problem(path: Vec<Seg>, message: impl Into<String>) -> Problem {
    Problem { path, message: message.into() }
}

const KINDS: [&str; 19] = [
    "user",
    "assistant",
    "tool_output",
    "wait",
    "write_file",
    "remove_file",
    "mcp_connect",
    "mcp_disconnect",
    "mcp_list_changed",
    "plugin_enable",
    "plugin_reload",
    "model_switch",
    "git",
    "clear",
    "resume",
    "compact",
    "attachment",
    "microcompact",
    "resume_lost",
];

/// Turns the raw document into a [`Scenario`], or reports the first problem.
pub(crate) fn check(mut raw: RawScenario, file: &str) -> Result<Scenario, Problem> {
    check_world(&raw.world)?;
    raw.world.cwd = normalize_path(&raw.world.cwd).expect("check_world accepted an absolute cwd");
    check_expect(&raw)?;
    let ids = Rng::new(raw.world.seed).fork("tool_use_ids");
    let mut script = Vec::with_capacity(raw.script.len());
    let mut seen_ids: BTreeSet<String> = BTreeSet::new();
    // Index (into `script`) of the latest assistant step that called tools.
    let mut last_tool_step: Option<usize> = None;
    for (index, step) in raw.script.into_iter().enumerate() {
        let checked = check_step(step, index, &ids, &raw.world, &mut seen_ids, last_tool_step.map(|i| (i, &script)))?;
        if let Step::Assistant(a) = &checked
            && a.tool_uses().next().is_some() {
                last_tool_step = Some(script.len());
            }
        script.push(checked);
    }
    Ok(Scenario {
        file: file.to_owned(),
        name: raw.name,
        description: raw.description,
        world: raw.world,
        script,
        expect: raw.expect,
    })
}

/// Resolves a path given in a scenario: absolute, or relative to the world's cwd.
pub(crate) fn resolve(world: &WorldSpec, path: &str) -> Option<String> {
    let joined = if path.starts_with('/') { path.to_owned() } else { format!("{}/{}", world.cwd, path) };
    normalize_path(&joined).ok()
}

fn check_world(world: &WorldSpec) -> Result<(), Problem> {
    let at = |k: &str| vec![key("world"), key(k)];
    if world.model.trim().is_empty() {
        return Err(problem(at("model"), "must not be empty"));
    }
    if !world.cwd.starts_with('/') {
        return Err(problem(at("cwd"), format!("must be an absolute path, found `{}`", world.cwd)));
    }
    if world.context_window == Some(0) {
        return Err(problem(at("context_window"), "must be positive"));
    }
    if let Some(git) = &world.git {
        check_git(git, vec![key("world"), key("git")])?;
    }
    if world.max_output_tokens == Some(0) {
        return Err(problem(at("max_output_tokens"), "must be positive"));
    }
    if let (Some(window), Some(max_output)) = (world.context_window, world.max_output_tokens)
        && max_output >= window {
            return Err(problem(at("max_output_tokens"), format!("{max_output} must be smaller than context_window {window}")));
        }
    // Seed a scratch fs in the scenario's order: the same checks `into_world` relies on.
    let mut fs = VirtualFs::new();
    let clock = Clock::new(0);
    let mut resolved: BTreeMap<String, &str> = BTreeMap::new();
    for path in world.files.keys() {
        let here = vec![key("world"), key("files"), key(path)];
        let Some(full) = resolve(world, path) else {
            return Err(problem(here, "not a valid path"));
        };
        if let Some(previous) = resolved.insert(full.clone(), path) {
            return Err(problem(here, format!("names the same file as `{previous}` ({full})")));
        }
        fs.seed(&full, "", &clock).map_err(|e| problem(here, e.to_string()))?;
    }
    Ok(())
}

fn check_git(git: &crate::world::GitState, at: Vec<Seg>) -> Result<(), Problem> {
    for (field, value) in [("branch", &git.branch), ("main_branch", &git.main_branch)] {
        if value.trim().is_empty() || value.contains(char::is_whitespace) {
            return Err(problem([at, vec![key(field)]].concat(), format!("must be a branch name without spaces, found `{value}`")));
        }
    }
    for (field, lines) in [("status", &git.status), ("recent_commits", &git.recent_commits)] {
        if let Some(i) = lines.iter().position(|l| l.trim().is_empty() || l.contains('\n')) {
            return Err(problem([at, vec![key(field), Seg::Index(i)]].concat(), "must be one non-empty line"));
        }
    }
    Ok(())
}

fn check_expect(raw: &RawScenario) -> Result<(), Problem> {
    let at = |k: &str| vec![key("expect"), key(k)];
    if let Some(ratio) = raw.expect.min_cache_hit_ratio
        && !(0.0..=1.0).contains(&ratio) {
            return Err(problem(at("min_cache_hit_ratio"), format!("must be between 0 and 1, found {ratio}")));
        }
    if let Some(cost) = raw.expect.max_cost_usd
        && !(cost.is_finite() && cost >= 0.0) {
            return Err(problem(at("max_cost_usd"), format!("must be a non-negative number, found {cost}")));
        }
    Ok(())
}

/// Checks `script[index]`. (Field paths are made only for a problem.)
fn check_step(
    step: RawStep,
    index: usize,
    ids: &Rng,
    world: &WorldSpec,
    seen_ids: &mut BTreeSet<String>,
    last_tool_step: Option<(usize, &Vec<Step>)>,
) -> Result<Step, Problem> {
    let at = || vec![key("script"), Seg::Index(index)];
    let here = |k: &str| {
        let mut p = at();
        p.push(key(k));
        p
    };
    let mut present = [
        step.user.is_some(),
        step.assistant.is_some(),
        step.tool_output.is_some(),
        step.wait.is_some(),
        step.write_file.is_some(),
        step.remove_file.is_some(),
        step.mcp_connect.is_some(),
        step.mcp_disconnect.is_some(),
        step.mcp_list_changed.is_some(),
        step.plugin_enable.is_some(),
        step.plugin_reload.is_some(),
        step.model_switch.is_some(),
        step.git.is_some(),
        step.clear.is_some(),
        step.resume.is_some(),
        step.compact.is_some(),
        step.attachment.is_some(),
        step.microcompact.is_some(),
        step.resume_lost.is_some(),
    ]
    .into_iter()
    .zip(KINDS)
    .filter_map(|(set, name)| set.then_some(name));
    let kind = match (present.next(), present.next()) {
        (None, _) => return Err(problem(at(), format!("a step needs one of `{}`", KINDS.join("`, `")))),
        (Some(kind), None) => kind,
        (Some(first), Some(second)) => {
            return Err(problem(here(second), format!("a step has exactly one kind, found `{first}` and `{second}`; split it into two steps")));
        }
    };
    if step.assistant.is_none() {
        let modifiers = [
            ("lane", step.lane.is_some()),
            ("stop_reason", step.stop_reason.is_some()),
            ("usage", step.usage.is_some()),
            ("output_tokens", step.output_tokens.is_some()),
            ("latency", step.latency.is_some()),
        ];
        if let Some((name, _)) = modifiers.iter().find(|(_, set)| *set) {
            return Err(problem(here(name), format!("`{name}` applies only to `assistant` steps, not `{kind}`")));
        }
    }
    if let Some(text) = step.user {
        return Ok(Step::User { text: text.into() });
    }
    if let Some(wait) = step.wait {
        return Ok(Step::Wait { ms: wait.0 });
    }
    let known_server = |name: &str, field: &str| {
        if world.mcp_servers.iter().any(|s| s.name == name) {
            Ok(())
        } else {
            let names: Vec<&str> = world.mcp_servers.iter().map(|s| s.name.as_str()).collect();
            Err(problem(here(field), format!("no MCP server `{name}` in `world.mcp_servers` (known: {})", names.join(", "))))
        }
    };
    if let Some(server) = step.mcp_connect {
        known_server(&server, "mcp_connect")?;
        return Ok(Step::McpConnect { server });
    }
    if let Some(server) = step.mcp_disconnect {
        known_server(&server, "mcp_disconnect")?;
        return Ok(Step::McpDisconnect { server });
    }
    if let Some(spec) = step.mcp_list_changed {
        known_server(&spec.server, "mcp_list_changed")?;
        return Ok(Step::McpListChanged { server: spec.server, tools: spec.tools });
    }
    if let Some(raw_path) = step.plugin_enable {
        let root = resolve(world, &raw_path).ok_or_else(|| problem(here("plugin_enable"), "not a valid path"))?;
        return Ok(Step::PluginEnable { root });
    }
    if step.plugin_reload.is_some() {
        return Ok(Step::PluginReload);
    }
    if let Some(model) = step.model_switch {
        if model.trim().is_empty() {
            return Err(problem(here("model_switch"), "the model id is empty"));
        }
        return Ok(Step::ModelSwitch { model });
    }
    for (value, field, step) in [(step.clear, "clear", Step::Clear), (step.resume, "resume", Step::Resume), (step.compact, "compact", Step::Compact)] {
        match value {
            Some(true) => return Ok(step),
            Some(false) => return Err(problem(here(field), format!("write `{field}: true`, or leave the step out"))),
            None => {}
        }
    }
    if let Some(spec) = step.attachment {
        if spec.text.is_empty() {
            return Err(problem(here("attachment"), "the attachment's `text` is empty"));
        }
        if spec.skill.as_deref().is_some_and(|s| s.trim().is_empty()) {
            return Err(problem(here("attachment"), "the attachment's `skill` is empty: name the skill, or leave `skill` out"));
        }
        return Ok(Step::Attachment { kind: spec.kind, text: spec.text, skill: spec.skill });
    }
    if let Some(spec) = step.microcompact {
        if spec.tool_use_ids.is_empty() && spec.history_chars == 0 {
            return Err(problem(here("microcompact"), "the microcompact clears nothing: give `tool_use_ids` or `history_chars`"));
        }
        // It clears results already sent: an id no earlier tool use has would clear nothing.
        if let Some((i, id)) = spec.tool_use_ids.iter().enumerate().find(|(_, id)| !seen_ids.contains(*id)) {
            let at = [here("microcompact"), vec![key("tool_use_ids"), Seg::Index(i)]].concat();
            return Err(problem(at, format!("no earlier tool use has id `{id}`")));
        }
        return Ok(Step::Microcompact { tool_use_ids: spec.tool_use_ids, history_chars: spec.history_chars });
    }
    if let Some(spec) = step.resume_lost {
        if spec.tool_use_ids.is_empty() {
            return Err(problem(here("resume_lost"), "the resume loses nothing: give `tool_use_ids`"));
        }
        return Ok(Step::ResumeLost { tool_use_ids: spec.tool_use_ids });
    }
    if let Some(git) = step.git {
        check_git(&git, here("git"))?;
        return Ok(Step::Git(git));
    }
    if let Some(spec) = step.write_file {
        let path = resolve(world, &spec.path).ok_or_else(|| problem(here("write_file"), "not a valid path"))?;
        return Ok(Step::WriteFile { path, content: spec.content });
    }
    if let Some(raw_path) = step.remove_file {
        let path = resolve(world, &raw_path).ok_or_else(|| problem(here("remove_file"), "not a valid path"))?;
        if path == "/" {
            return Err(problem(here("remove_file"), "cannot remove `/`"));
        }
        return Ok(Step::RemoveFile { path });
    }
    if let Some(outputs) = step.tool_output {
        let Some((step_index, script)) = last_tool_step else {
            return Err(problem(here("tool_output"), "no earlier assistant step calls a tool"));
        };
        let Step::Assistant(caller) = &script[step_index] else { unreachable!("last_tool_step points at an assistant step") };
        let calls: Vec<(&str, &str)> = caller.tool_uses().collect();
        let mut by_id: BTreeMap<&str, ToolOutput> = BTreeMap::new();
        // Each output is read in one pass (the one its key's kind belongs to) and moved into the
        // last output it makes, copied into the others.
        let mut outputs: Vec<(String, Option<ToolOutputSpec>)> = outputs.into_iter().map(|(key_text, spec)| (key_text, Some(spec))).collect();
        // Ids first, then names for the calls no id claimed: an id is the more precise claim.
        for pass in [true, false] {
            for (written, (key_text, slot)) in outputs.iter_mut().enumerate() {
                let key_text = &*key_text;
                let is_id = calls.iter().any(|(id, _)| id == key_text);
                if is_id != pass {
                    continue;
                }
                let Some(spec) = slot.take() else { continue };
                let matched: Vec<&(&str, &str)> =
                    calls.iter().filter(|(id, name)| if pass { id == key_text } else { name == key_text }).collect();
                if matched.is_empty() {
                    let known: Vec<String> = calls.iter().map(|(id, name)| format!("{name} ({id})")).collect();
                    return Err(problem(
                        [here("tool_output"), vec![key(key_text)]].concat(),
                        format!(
                            "`{key_text}` is neither a tool_use id nor a tool name of script[{}], which calls {}",
                            step_index,
                            known.join(", ")
                        ),
                    ));
                }
                if let Some((_, name)) = matched.iter().find(|(_, name)| spec.subagent && !matches!(*name, "Agent" | "Task")) {
                    return Err(problem(
                        [here("tool_output"), vec![key(key_text), key("subagent")]].concat(),
                        format!("`subagent: true` runs the subagent of an Agent call; `{key_text}` is a {name} call"),
                    ));
                }
                // An image's pixels are written as a PNG header inside its base64 data: without
                // both sides, or with data too short or not whole base64 to hold it, the image
                // would count the flat size without a word.
                for (k, image) in spec.images.iter().enumerate() {
                    let at = |field: &str| [here("tool_output"), vec![key(key_text), key("images"), Seg::Index(k), key(field)]].concat();
                    match (image.width, image.height) {
                        (Some(_), None) => return Err(problem(at("height"), "an image with a `width` needs its `height` too")),
                        (None, Some(_)) => return Err(problem(at("width"), "an image with a `height` needs its `width` too")),
                        (Some(_), Some(_)) if image.base64_bytes < 44 || image.base64_bytes % 4 != 0 => {
                            return Err(problem(
                                at("base64_bytes"),
                                format!("{} cannot hold the image's PNG header: with `width` and `height` it must be at least 44 and a multiple of 4", image.base64_bytes),
                            ));
                        }
                        _ => {}
                    }
                }
                let mut spec = Some(spec);
                let last = matched.len().saturating_sub(1);
                for (n, (id, name)) in matched.into_iter().enumerate() {
                    if by_id.contains_key(*id) {
                        continue;
                    }
                    let Some(spec) = (if n == last { spec.take() } else { spec.clone() }) else { continue };
                    let ToolOutputSpec { content, is_error, images, subagent, file } = spec;
                    let output = ToolOutput { tool_use_id: (*id).to_owned(), tool_name: (*name).to_owned(), content: content.into(), is_error, images, subagent, file, written };
                    by_id.insert(id, output);
                }
            }
        }
        // In call order, so the agent sees outputs in the order it issued the calls.
        let ordered = calls.iter().filter_map(|(id, _)| by_id.remove(*id)).collect();
        return Ok(Step::ToolOutput(ordered));
    }
    let blocks = step.assistant.expect("one kind is present and the others returned");
    if blocks.is_empty() {
        return Err(problem(here("assistant"), "a reply needs at least one block"));
    }
    let lane = step.lane.unwrap_or_else(|| "main".to_owned());
    if lane.trim().is_empty() {
        return Err(problem(here("lane"), "must not be empty"));
    }
    let mut content = Vec::with_capacity(blocks.len());
    for (block_index, block) in blocks.into_iter().enumerate() {
        let block_at = || [here("assistant"), vec![Seg::Index(block_index)]].concat();
        content.push(match block {
            BlockSpec::Text(text) => ContentBlock::text(text),
            BlockSpec::Thinking(thinking) => {
                // Real signatures are opaque; a stable stand-in keeps the bytes deterministic.
                let signature = format!("sig_{:016x}", xxhash_rust::xxh3::xxh3_64(thinking.as_bytes()));
                ContentBlock::thinking(thinking, signature)
            }
            BlockSpec::RedactedThinking(data) => ContentBlock::RedactedThinking { data, extra: Map::new() },
            BlockSpec::ToolUse(spec) => {
                let id = match spec.id {
                    Some(id) if id.trim().is_empty() => {
                        return Err(problem([block_at(), vec![key("tool_use"), key("id")]].concat(), "must not be empty"));
                    }
                    Some(id) => id,
                    None => tool_use_id(ids, index, block_index),
                };
                if !seen_ids.insert(id.clone()) {
                    return Err(problem([block_at(), vec![key("tool_use")]].concat(), format!("tool_use id `{id}` is used twice")));
                }
                ContentBlock::tool_use(id, spec.name, spec.input)
            }
        });
    }
    let stop_reason = step.stop_reason.unwrap_or(
        if content.iter().any(|b| matches!(b, ContentBlock::ToolUse { .. })) { StopReason::ToolUse } else { StopReason::EndTurn },
    );
    let usage = step.usage.map(|u| Usage {
        input_tokens: u.input_tokens.unwrap_or(0),
        cache_creation_input_tokens: u.cache_creation_input_tokens.unwrap_or(0),
        cache_read_input_tokens: u.cache_read_input_tokens.unwrap_or(0),
        cache_creation: None,
        output_tokens: u.output_tokens.unwrap_or(0),
        extra: Default::default(),
    });
    let scripted_output = usage.as_ref().map(|u| u.output_tokens).filter(|n| *n > 0);
    let output_tokens = match (step.output_tokens, scripted_output) {
        (Some(a), Some(b)) if a != b => {
            return Err(problem(here("output_tokens"), format!("{a} disagrees with usage.output_tokens {b}")));
        }
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => estimate_output_tokens(&content),
    };
    let latency = match step.latency {
        None => None,
        Some(spec) => {
            let total_ms = spec.total.0;
            let first_token_ms = spec.first_token.map_or(total_ms, |d| d.0);
            if first_token_ms > total_ms {
                return Err(problem(
                    [here("latency"), vec![key("first_token")]].concat(),
                    format!("first_token ({first_token_ms} ms) is later than total ({total_ms} ms)"),
                ));
            }
            Some(Latency { first_token_ms, total_ms })
        }
    };
    Ok(Step::Assistant(AssistantStep { lane, content: content.into(), stop_reason, usage, output_tokens, latency }))
}

/// `toolu_01` + 22 base62 characters: the shape and length of real ids (so token counts match),
/// derived from the seed and the block's position only.
fn tool_use_id(ids: &Rng, step: usize, block: usize) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut rng = ids.fork(&format!("{step}.{block}"));
    let tail: String = (0..22).map(|_| ALPHABET[rng.range(0..ALPHABET.len() as u64) as usize] as char).collect();
    format!("toolu_01{tail}")
}
