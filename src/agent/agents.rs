//! Agent definitions: the subagent types the Agent tool can start (reference layers-1-5 §3.3,
//! §5.2 `agent_listing_delta`, §6.3; real-client-oracle §3 "Subagent").
//!
//! Sources, lowest priority first: the built-in types, plugins' `agents/*.md` (named
//! `{plugin}:{name}`), the user's `~/.claude/agents/*.md`, the project's `.claude/agents/*.md`
//! (every directory from the outermost down to the cwd, so the cwd's own wins), and policy
//! `{managed}/.claude/agents`. A later definition of an agent type replaces an earlier one but
//! keeps its place in the list, as a JS `Map` does on `set` of an existing key.
//!
//! A definition file is Markdown with frontmatter: `name` and `description` are required (a
//! file without them is skipped with a warning, never an error), `tools` (a comma list, a YAML
//! list, or `*`), `disallowedTools`, `model` (`sonnet`, `opus`, `haiku`, `inherit` or a model
//! id), `maxTurns`, `skills`, `hooks`, `effort`, `color`, `permissionMode`, `memory`,
//! `background`, `isolation`; unknown keys are kept. The body is the agent's system prompt.
//!
//! Every built-in prompt and description here is this project's own writing.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::agent::instructions::{ancestors_outermost_first, split_frontmatter};
use crate::agent::skills::{bool_of, list_of, read_frontmatter, string_of};
use crate::world::VirtualFs;

/// The type the Agent tool starts when `subagent_type` is absent.
pub const GENERAL_PURPOSE: &str = "general-purpose";

/// Tools no subagent of the external build gets (`ALL_AGENT_DISALLOWED_TOOLS`): the print-mode
/// pool of 22 tools minus these is the 16 tools the oracle saw in a subagent request.
pub const AGENT_DISALLOWED_TOOLS: [&str; 6] = ["Agent", "AskUserQuestion", "EnterPlanMode", "ExitPlanMode", "TaskOutput", "TaskStop"];

/// Tools the read-only built-ins (Explore, Plan) may not use.
const READ_ONLY_DISALLOWED: [&str; 5] = ["Agent", "ExitPlanMode", "Edit", "Write", "NotebookEdit"];

/// Frontmatter keys this module reads; any other key is kept in `extra`.
const KNOWN_KEYS: [&str; 14] = [
    "name",
    "description",
    "tools",
    "disallowedTools",
    "model",
    "maxTurns",
    "skills",
    "hooks",
    "effort",
    "color",
    "permissionMode",
    "memory",
    "background",
    "isolation",
];

/// Where a definition came from, in priority order (later wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AgentSource {
    BuiltIn,
    Plugin,
    User,
    Project,
    Policy,
}

impl AgentSource {
    pub fn name(self) -> &'static str {
        match self {
            AgentSource::BuiltIn => "built-in",
            AgentSource::Plugin => "plugin",
            AgentSource::User => "user",
            AgentSource::Project => "project",
            AgentSource::Policy => "policy",
        }
    }
}

/// One subagent type.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentDefinition {
    /// `subagent_type` value and listing name (`{plugin}:{name}` for plugin agents).
    pub agent_type: String,
    /// `description`: when to use it, shown in the Agent tool's listing.
    pub when_to_use: String,
    /// `tools`: `None` means every tool (absent, empty or `*`).
    pub tools: Option<Vec<String>>,
    pub disallowed_tools: Vec<String>,
    /// `model` as written (alias or id); `None` for absent or `inherit`.
    pub model: Option<String>,
    /// The agent's own system prompt (the file body).
    pub prompt: String,
    pub source: AgentSource,
    /// The definition file (virtual path), for file-based agents.
    pub path: Option<String>,
    /// Leave `claudeMd` out of the subagent's user context (the read-only built-ins).
    pub omit_claude_md: bool,
    /// Leave the git status out of the subagent's system prompt (the read-only built-ins).
    pub omit_git_status: bool,
    /// `maxTurns`: model calls after which the agent stops.
    pub max_turns: Option<u32>,
    /// `skills`: skills whose bodies are preloaded into the agent's first turn.
    pub skills: Vec<String>,
    /// `hooks` (the settings shape): active while the agent runs; `Stop` means `SubagentStop`.
    pub hooks: Option<Value>,
    /// `effort`: the agent's `output_config.effort`.
    pub effort: Option<String>,
    pub color: Option<String>,
    pub permission_mode: Option<String>,
    pub memory: Option<String>,
    pub background: bool,
    pub isolation: Option<String>,
    /// Frontmatter keys the reference does not know, kept as read.
    pub extra: BTreeMap<String, Value>,
}

impl AgentDefinition {
    fn built_in(agent_type: &str, when_to_use: &str, prompt: &str) -> AgentDefinition {
        AgentDefinition {
            agent_type: agent_type.to_owned(),
            when_to_use: when_to_use.to_owned(),
            tools: None,
            disallowed_tools: Vec::new(),
            model: None,
            prompt: prompt.to_owned(),
            source: AgentSource::BuiltIn,
            path: None,
            omit_claude_md: false,
            omit_git_status: false,
            max_turns: None,
            skills: Vec::new(),
            hooks: None,
            effort: None,
            color: None,
            permission_mode: None,
            memory: None,
            background: false,
            isolation: None,
            extra: BTreeMap::new(),
        }
    }

    /// The tools part of a listing line: `All tools`, `All tools except A, B`, the allowed
    /// list (minus disallowed ones), or `None` when nothing is left.
    pub fn tools_description(&self) -> String {
        match &self.tools {
            Some(tools) => {
                let effective: Vec<&str> =
                    tools.iter().map(String::as_str).filter(|t| !self.disallowed_tools.iter().any(|d| d == t)).collect();
                if effective.is_empty() { "None".to_owned() } else { effective.join(", ") }
            }
            None if self.disallowed_tools.is_empty() => "All tools".to_owned(),
            None => format!("All tools except {}", self.disallowed_tools.join(", ")),
        }
    }

    /// `- {type}: {whenToUse} (Tools: {tools})`, the line of the Agent tool's listing and of
    /// `agent_listing_delta`.
    pub fn listing_line(&self) -> String {
        format!("- {}: {} (Tools: {})", self.agent_type, self.when_to_use, self.tools_description())
    }

    /// Whether a tool of the pool is available to this agent: never the tools no subagent gets,
    /// never a disallowed one, and only the listed ones when `tools` is a list.
    pub fn allows_tool(&self, name: &str) -> bool {
        if AGENT_DISALLOWED_TOOLS.contains(&name) || self.disallowed_tools.iter().any(|d| d == name) {
            return false;
        }
        match &self.tools {
            None => true,
            Some(tools) => tools.iter().any(|t| t == name || legacy_tool_name(t) == Some(name)),
        }
    }

    /// The lane this agent's requests are measured and scripted on.
    pub fn lane(&self) -> String {
        format!("subagent:{}", self.agent_type)
    }
}

/// Older tool names agent files still use, mapped to the current ones.
fn legacy_tool_name(name: &str) -> Option<&'static str> {
    match name {
        "Task" => Some("Agent"),
        "LS" => Some("Glob"),
        "NotebookRead" => Some("Read"),
        "BashOutput" => Some("TaskOutput"),
        "KillShell" => Some("TaskStop"),
        _ => None,
    }
}

/// The built-in types in the reference's order: general-purpose and statusline-setup, Explore
/// and Plan, and claude-code-guide only outside the SDK entrypoints (interactive here; print
/// mode is `sdk-cli`).
pub fn built_in_agents(interactive: bool) -> Vec<AgentDefinition> {
    let mut general = AgentDefinition::built_in(GENERAL_PURPOSE, GENERAL_WHEN, GENERAL_PROMPT);
    general.tools = None;
    let mut statusline = AgentDefinition::built_in("statusline-setup", STATUSLINE_WHEN, STATUSLINE_PROMPT);
    statusline.tools = Some(vec!["Read".into(), "Edit".into()]);
    statusline.model = Some("sonnet".into());
    let mut explore = AgentDefinition::built_in("Explore", EXPLORE_WHEN, EXPLORE_PROMPT);
    explore.disallowed_tools = READ_ONLY_DISALLOWED.iter().map(|s| (*s).to_owned()).collect();
    explore.model = Some("haiku".into());
    explore.omit_claude_md = true;
    explore.omit_git_status = true;
    let mut plan = AgentDefinition::built_in("Plan", PLAN_WHEN, PLAN_PROMPT);
    plan.disallowed_tools = READ_ONLY_DISALLOWED.iter().map(|s| (*s).to_owned()).collect();
    plan.omit_claude_md = true;
    plan.omit_git_status = true;
    let mut agents = vec![general, statusline, explore, plan];
    if interactive {
        let mut guide = AgentDefinition::built_in("claude-code-guide", GUIDE_WHEN, GUIDE_PROMPT);
        guide.tools = Some(["Glob", "Grep", "Read", "WebFetch", "WebSearch"].iter().map(|s| (*s).to_owned()).collect());
        guide.model = Some("haiku".into());
        agents.push(guide);
    }
    agents
}

/// Reads one definition file. `Err` (a warning for the caller) when `name` or `description` is
/// missing; anything else is tolerated.
pub fn parse_agent(text: &str, path: &str, source: AgentSource, plugin: Option<&str>) -> Result<AgentDefinition, String> {
    let (frontmatter, body) = split_frontmatter(text);
    let Some(frontmatter) = frontmatter else { return Err(format!("{path}: no frontmatter; an agent needs `name` and `description`")) };
    let (meta, _lenient) = read_frontmatter(&frontmatter);
    let get = |key: &str| string_of(meta.get(key)).map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
    let name = get("name").ok_or_else(|| format!("{path}: frontmatter field `name` is missing"))?;
    let when_to_use = get("description").ok_or_else(|| format!("{path}: frontmatter field `description` is missing"))?;
    // The reference stores descriptions with literal `\n` sequences turned into newlines.
    let when_to_use = when_to_use.replace("\\n", "\n");
    let tools = list_of(meta.get("tools"));
    let tools = if tools.is_empty() || tools.iter().any(|t| t == "*") { None } else { Some(tools) };
    let max_turns = match meta.get("maxTurns") {
        None | Some(Value::Null) => None,
        Some(value) => match string_of(Some(value)).and_then(|s| s.trim().parse::<u32>().ok()).filter(|n| *n > 0) {
            Some(n) => Some(n),
            None => return Err(format!("{path}: frontmatter field `maxTurns` must be a positive integer, found {value}")),
        },
    };
    let extra = meta.iter().filter(|(k, _)| !KNOWN_KEYS.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
    Ok(AgentDefinition {
        agent_type: match plugin {
            Some(plugin) => format!("{plugin}:{name}"),
            None => name,
        },
        when_to_use,
        tools,
        disallowed_tools: list_of(meta.get("disallowedTools")),
        model: get("model").filter(|m| m != "inherit"),
        prompt: body.trim().to_owned(),
        source,
        path: Some(path.to_owned()),
        omit_claude_md: false,
        omit_git_status: false,
        max_turns,
        skills: list_of(meta.get("skills")),
        hooks: meta.get("hooks").filter(|h| h.is_object()).cloned(),
        effort: get("effort"),
        color: get("color"),
        permission_mode: get("permissionMode"),
        memory: get("memory"),
        background: bool_of(meta.get("background"), false),
        isolation: get("isolation"),
        extra,
    })
}

/// Every `*.md` under `dir` (recursively, sorted), parsed; files that are not definitions are
/// returned as warnings.
pub fn load_agents_dir(fs: &VirtualFs, dir: &str, source: AgentSource, plugin: Option<&str>) -> (Vec<AgentDefinition>, Vec<String>) {
    let mut agents = Vec::new();
    let mut warnings = Vec::new();
    let Ok(entries) = fs.walk(dir) else { return (agents, warnings) };
    for entry in entries.into_iter().filter(|e| !e.is_dir && e.name.ends_with(".md")) {
        let Ok(text) = fs.read(&entry.path) else { continue };
        match parse_agent(text, &entry.path, source, plugin) {
            Ok(agent) => agents.push(agent),
            Err(warning) => warnings.push(warning),
        }
    }
    (agents, warnings)
}

/// The agent directories of the settings levels, in priority order: user, project (outermost
/// ancestor first, the cwd last), policy.
pub fn agent_dirs(config_home: &str, cwd: &str, managed_dir: &str) -> Vec<(AgentSource, String)> {
    let mut dirs = vec![(AgentSource::User, format!("{}/agents", config_home.trim_end_matches('/')))];
    for dir in ancestors_outermost_first(cwd) {
        dirs.push((AgentSource::Project, format!("{dir}/.claude/agents")));
    }
    dirs.push((AgentSource::Policy, format!("{managed_dir}/.claude/agents")));
    dirs
}

/// The active agent types and what was skipped on the way.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentCatalog {
    pub agents: Vec<AgentDefinition>,
    pub warnings: Vec<String>,
}

impl AgentCatalog {
    /// Built-ins, then `plugin_agents`, then the directories of [`agent_dirs`]; a later
    /// definition of a type replaces the earlier one in its place.
    pub fn load(fs: &VirtualFs, config_home: &str, cwd: &str, managed_dir: &str, plugin_agents: &[AgentDefinition], interactive: bool) -> AgentCatalog {
        let mut catalog = AgentCatalog::default();
        for agent in built_in_agents(interactive).into_iter().chain(plugin_agents.iter().cloned()) {
            catalog.insert(agent);
        }
        for (source, dir) in agent_dirs(config_home, cwd, managed_dir) {
            let (agents, warnings) = load_agents_dir(fs, &dir, source, None);
            catalog.warnings.extend(warnings);
            for agent in agents {
                catalog.insert(agent);
            }
        }
        catalog
    }

    fn insert(&mut self, agent: AgentDefinition) {
        match self.agents.iter_mut().find(|a| a.agent_type == agent.agent_type) {
            Some(slot) => *slot = agent,
            None => self.agents.push(agent),
        }
    }

    pub fn find(&self, agent_type: &str) -> Option<&AgentDefinition> {
        self.agents.iter().find(|a| a.agent_type == agent_type)
    }

    /// Listing lines in catalog order (the Agent tool's description).
    pub fn listing_lines(&self) -> Vec<String> {
        self.agents.iter().map(AgentDefinition::listing_line).collect()
    }

    /// Listing lines by agent type (`agent_listing_delta` compares the types).
    pub fn sorted_lines(&self) -> BTreeMap<String, String> {
        self.agents.iter().map(|a| (a.agent_type.clone(), a.listing_line())).collect()
    }

    pub fn types(&self) -> BTreeSet<String> {
        self.agents.iter().map(|a| a.agent_type.clone()).collect()
    }
}

/// Model aliases of the 2.1.88 client on the first-party API; `ANTHROPIC_DEFAULT_{FAMILY}_MODEL`
/// overrides each.
pub fn alias_model(alias: &str, env: &BTreeMap<String, String>) -> Option<String> {
    let (family, default) = match alias.trim().to_ascii_lowercase().as_str() {
        "sonnet" => ("SONNET", "claude-sonnet-4-6"),
        "opus" => ("OPUS", "claude-opus-4-6"),
        "haiku" => ("HAIKU", "claude-haiku-4-5-20251001"),
        _ => return None,
    };
    Some(env.get(&format!("ANTHROPIC_DEFAULT_{family}_MODEL")).cloned().unwrap_or_else(|| default.to_owned()))
}

/// The model a subagent runs on, highest priority first: `CLAUDE_CODE_SUBAGENT_MODEL`, the
/// Agent tool's `model` input, the definition's `model`; `inherit` (or nothing) is the parent's
/// model. An alias resolves through [`alias_model`]; anything else is taken as a model id.
pub fn resolve_model(agent: &AgentDefinition, tool_model: Option<&str>, parent_model: &str, env: &BTreeMap<String, String>) -> String {
    let chosen = env
        .get("CLAUDE_CODE_SUBAGENT_MODEL")
        .map(String::as_str)
        .or(tool_model)
        .or(agent.model.as_deref())
        .map(str::trim)
        .filter(|m| !m.is_empty() && *m != "inherit");
    match chosen {
        None => parent_model.to_owned(),
        Some(model) => alias_model(model, env).unwrap_or_else(|| model.to_owned()),
    }
}

// ---------------------------------------------------------------------------------------------
// Our own descriptions and prompts for the built-in types.
// ---------------------------------------------------------------------------------------------

const GENERAL_WHEN: &str = "For research, code search and multi-step tasks that need every tool; use it when a search may take several tries.";
const STATUSLINE_WHEN: &str = "Configures the user's status line setting.";
const EXPLORE_WHEN: &str = "Fast, read-only exploration of a codebase: finding files by pattern, searching code for keywords, answering how something works. Say how thorough it should be: quick, medium or very thorough.";
const PLAN_WHEN: &str = "Read-only software architect that designs an implementation plan: the steps, the files involved and the trade-offs.";
const GUIDE_WHEN: &str = "Answers questions about Claude Code itself, the Agent SDK and the Claude API, from their documentation.";

const GENERAL_PROMPT: &str = "You are an agent started by a coding assistant to carry out one task on its behalf. Use the tools you have to do the task completely: search broadly when you do not know where something lives, read what you find, and check your work. Do not stop halfway or guess.

When you are done, reply with a concise report of what you did and what you found, naming the files involved with absolute paths. Your reply goes to the assistant that started you, not to the user.";

const STATUSLINE_PROMPT: &str = "You set up the status line of the user's terminal agent. Read the user's shell configuration to learn how their prompt looks, then write a matching statusLine command into their settings file. Keep existing settings intact and report exactly what you changed.";

const EXPLORE_PROMPT: &str = "You are a search specialist that explores a codebase without changing it. You may not create, edit, move or delete files, and you run only read-only shell commands (listing, searching, reading, git status and log).

Search efficiently: use Glob for file patterns, Grep for contents, Read for files you know, and run independent searches in parallel. Adapt how deep you go to the thoroughness you were asked for.

Reply with your findings directly, naming files with absolute paths; do not write them to a file.";

const PLAN_PROMPT: &str = "You are a software architect who plans changes without making them. You may not create, edit or delete files; you only read and search.

Study the requirements and the existing code, follow the patterns you find, and design the change: the steps in order, the files to touch, the risks and the trade-offs between the options.

End your reply with the few files most important to the plan, as absolute paths.";

const GUIDE_PROMPT: &str = "You answer questions about Claude Code, the Agent SDK and the Claude API from their official documentation. Fetch the relevant documentation pages, answer precisely with examples where they help, and cite the pages you used.";
