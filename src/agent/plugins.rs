//! Plugins (reference layers-1-5 §6.3) and MCP server configuration files (§6.4).
//!
//! A plugin folder over the virtual filesystem: `.claude-plugin/plugin.json` (or legacy
//! `plugin.json`), `commands/*.md`, `agents/*.md`, `skills/*/SKILL.md`, `hooks/hooks.json` plus
//! manifest hooks, MCP servers from the manifest or `.mcp.json`. `${CLAUDE_PLUGIN_ROOT}` is
//! substituted in hook commands and MCP configs. Enabling or reloading replaces every plugin
//! contribution at once (`refreshActivePlugins`).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::agent::agents::{AgentDefinition, AgentSource, load_agents_dir};
use crate::agent::hooks::{ConfiguredHook, HookSource, parse_hooks};
use crate::agent::skills::{Skill, load_skills_from, parse_skill};
use crate::world::VirtualFs;

/// What one plugin contributes.
#[derive(Debug, Clone, PartialEq)]
pub struct Plugin {
    pub name: String,
    pub root: String,
    pub description: Option<String>,
    /// Commands as skills named `{plugin}:{name}` (listed when they have a description).
    pub commands: Vec<Skill>,
    /// Agent types `{plugin}:{name}`.
    pub agents: Vec<AgentDefinition>,
    /// Skills named `{plugin}:{dir}`.
    pub skills: Vec<Skill>,
    pub hooks: Vec<ConfiguredHook>,
    /// MCP servers named `plugin:{plugin}:{server}`, config after substitution.
    pub mcp_servers: Vec<(String, Value)>,
    pub warnings: Vec<String>,
}

/// Loads the plugin at `root`. Fails only when there is no manifest or it is not JSON.
pub fn load_plugin(fs: &VirtualFs, root: &str) -> Result<Plugin, String> {
    let root = root.trim_end_matches('/');
    let manifest_path =
        [format!("{root}/.claude-plugin/plugin.json"), format!("{root}/plugin.json")].into_iter().find(|p| fs.is_file(p));
    let manifest: Value = match &manifest_path {
        Some(path) => {
            let text = fs.read(path).map_err(|e| e.to_string())?;
            serde_json::from_str(text).map_err(|e| format!("{path}: invalid JSON: {e}"))?
        }
        None => return Err(format!("{root}: no .claude-plugin/plugin.json")),
    };
    let dir_name = root.rsplit('/').next().unwrap_or(root).to_owned();
    let name = manifest.get("name").and_then(Value::as_str).map(str::to_owned).unwrap_or(dir_name);
    let mut warnings = Vec::new();

    let mut commands = Vec::new();
    for file in markdown_files(fs, &format!("{root}/commands")) {
        let text = fs.read(&file).unwrap_or_default();
        let stem = file.rsplit('/').next().unwrap_or(&file).trim_end_matches(".md");
        let mut skill = parse_skill(&format!("{name}:{stem}"), &format!("{root}/commands"), text);
        if skill.fields.description.is_none() && skill.when_to_use.is_none() {
            // Listed only with a user-specified description or when_to_use.
            skill.fields.disable_model_invocation = true;
        }
        commands.push(skill);
    }
    let (agents, agent_warnings) = load_agents_dir(fs, &format!("{root}/agents"), AgentSource::Plugin, Some(&name));
    warnings.extend(agent_warnings);
    let skills = load_skills_from(fs, &[format!("{root}/skills")], Some(&name));

    let mut hooks = Vec::new();
    let hooks_file = format!("{root}/hooks/hooks.json");
    if let Ok(text) = fs.read(&hooks_file) {
        match serde_json::from_str::<Value>(text) {
            Ok(value) => {
                let parsed = parse_hooks(value.get("hooks").unwrap_or(&value), HookSource::Plugin, Some(root), &hooks_file);
                hooks.extend(parsed.hooks);
                warnings.extend(parsed.warnings);
            }
            Err(e) => warnings.push(format!("{hooks_file}: invalid JSON: {e}")),
        }
    }
    if let Some(value) = manifest.get("hooks").filter(|v| v.is_object()) {
        let parsed = parse_hooks(value.get("hooks").unwrap_or(value), HookSource::Plugin, Some(root), "plugin.json");
        hooks.extend(parsed.hooks);
        warnings.extend(parsed.warnings);
    }

    let mut servers = BTreeMap::new();
    if let Ok(text) = fs.read(&format!("{root}/.mcp.json")) {
        match serde_json::from_str::<Value>(text) {
            Ok(value) => servers.extend(mcp_servers_of(&value)),
            Err(e) => warnings.push(format!("{root}/.mcp.json: invalid JSON: {e}")),
        }
    }
    if let Some(value) = manifest.get("mcpServers").filter(|v| v.is_object()) {
        servers.extend(mcp_servers_of(&serde_json::json!({"mcpServers": value})));
    }
    let mcp_servers = servers
        .into_iter()
        .map(|(server, config)| (format!("plugin:{name}:{server}"), substitute(&config, "${CLAUDE_PLUGIN_ROOT}", root)))
        .collect();
    Ok(Plugin {
        name,
        root: root.to_owned(),
        description: manifest.get("description").and_then(Value::as_str).map(str::to_owned),
        commands,
        agents,
        skills,
        hooks,
        mcp_servers,
        warnings,
    })
}

fn markdown_files(fs: &VirtualFs, dir: &str) -> Vec<String> {
    fs.walk(dir).map(|entries| entries.into_iter().filter(|e| !e.is_dir && e.name.ends_with(".md")).map(|e| e.path).collect()).unwrap_or_default()
}

/// The servers of an `.mcp.json`: `{"mcpServers": {...}}`, or the servers at the top level.
pub fn mcp_servers_of(value: &Value) -> BTreeMap<String, Value> {
    let map = value.get("mcpServers").unwrap_or(value);
    map.as_object().map(|m| m.iter().filter(|(_, v)| v.is_object()).map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default()
}

fn substitute(value: &Value, from: &str, to: &str) -> Value {
    match value {
        Value::String(s) => Value::String(s.replace(from, to)),
        Value::Array(items) => Value::Array(items.iter().map(|v| substitute(v, from, to)).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), substitute(v, from, to))).collect()),
        other => other.clone(),
    }
}

/// `${VAR}` and `${VAR:-default}` in every string of an MCP config, from `env`. A variable
/// that is unset and has no default is left as written and reported.
pub fn expand_env(value: &Value, env: &BTreeMap<String, String>, missing: &mut Vec<String>) -> Value {
    match value {
        Value::String(s) => Value::String(expand_str(s, env, missing)),
        Value::Array(items) => Value::Array(items.iter().map(|v| expand_env(v, env, missing)).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), expand_env(v, env, missing))).collect()),
        other => other.clone(),
    }
}

fn expand_str(text: &str, env: &BTreeMap<String, String>, missing: &mut Vec<String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let inner = &rest[start + 2..start + end];
        let (name, default) = match inner.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        match (env.get(name), default) {
            (Some(v), _) => out.push_str(v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => {
                missing.push(name.to_owned());
                out.push_str(&rest[start..start + end + 1]);
            }
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

/// The project `.mcp.json` of `cwd`: server name → config with `${VAR}` expanded from `env`.
pub fn project_mcp_servers(fs: &VirtualFs, cwd: &str, env: &BTreeMap<String, String>) -> (BTreeMap<String, Value>, Vec<String>) {
    let mut missing = Vec::new();
    let Ok(text) = fs.read(&format!("{}/.mcp.json", cwd.trim_end_matches('/'))) else { return (BTreeMap::new(), missing) };
    let Ok(value) = serde_json::from_str::<Value>(text) else { return (BTreeMap::new(), vec![".mcp.json: invalid JSON".into()]) };
    let servers = mcp_servers_of(&value).into_iter().map(|(k, v)| (k, expand_env(&v, env, &mut missing))).collect();
    (servers, missing)
}

/// A one-line-per-item summary of a plugin's contributions, for snapshots.
pub fn describe(plugin: &Plugin) -> String {
    let mut lines = vec![format!("plugin {} ({})", plugin.name, plugin.root)];
    for c in &plugin.commands {
        lines.push(format!("  command {}{}", c.name, if c.listed() { "" } else { " (unlisted)" }));
    }
    for a in &plugin.agents {
        lines.push(format!("  agent {} (model {}; tools: {})", a.agent_type, a.model.as_deref().unwrap_or("inherit"), a.tools_description()));
    }
    for s in &plugin.skills {
        lines.push(format!("  skill {}: {}", s.name, s.description.chars().take(60).collect::<String>()));
    }
    for h in &plugin.hooks {
        let matcher = if h.matcher.is_empty() { "*" } else { &h.matcher };
        lines.push(format!("  hook {} [{matcher}]: {}", h.event, h.command));
    }
    for (s, config) in &plugin.mcp_servers {
        lines.push(format!("  mcp {s}: {}", config));
    }
    for w in &plugin.warnings {
        lines.push(format!("  warning {w}"));
    }
    lines.join("\n")
}

/// Adds the project `.mcp.json` servers (`${VAR}` expanded from the world's env) to the
/// world's server set. A scripted server of the same name supplies tools and instructions; a
/// configured-only server connects with none. Project scope wins over plugin servers.
pub fn configure_project_mcp(world: &mut crate::world::World) {
    let (servers, _missing) = project_mcp_servers(&world.fs, &world.cwd, &world.env);
    for (name, _config) in servers {
        if !world.mcp_servers.iter().any(|s| s.name == name) {
            world.mcp_servers.push(crate::world::McpServer { name, instructions: None, tools: Vec::new(), connected: true });
        }
    }
}
