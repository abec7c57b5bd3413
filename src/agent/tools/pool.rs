//! Tool pool assembly and deferral (reference §3.1, §3.4, §3.5).
//!
//! Built-ins sorted by `localeCompare` form a contiguous prefix, MCP tools follow sorted the same
//! way, a name conflict keeps the built-in. Under tool search, deferred tools are not sent until
//! discovered; discovered ones are sent in their sorted position with `defer_loading: true`, and
//! every deferred name is announced in an `<available-deferred-tools>` user message.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use serde_json::Value;

use crate::agent::profile::SizeProfile;
use crate::agent::tools::defs::{
    AgentToolListing, BuiltinTool, LIST_MCP_RESOURCES, READ_MCP_RESOURCE, TOOL_SEARCH, agent_tool, base_tool_names, builtin_tool,
    schema_len,
};
use crate::agent::system_prompt::truncate_marked;
use crate::api::Tool;

/// MCP tool descriptions longer than this are cut and marked (services/mcp/client.ts).
pub const MCP_DESCRIPTION_MAX: usize = 2048;

/// Default `tst-auto` threshold: deferred tools must fill this percentage of the context window.
pub const TOOL_SEARCH_AUTO_PERCENT: u32 = 10;

/// Characters per token in the reference's char-based fallback for the `tst-auto` threshold.
const AUTO_CHARS_PER_TOKEN: f64 = 2.5;

/// Opening and closing tags of the deferred-tool announcement (wrapper 55 chars with newlines).
pub const DEFERRED_OPEN: &str = "<available-deferred-tools>";
pub const DEFERRED_CLOSE: &str = "</available-deferred-tools>";

/// `getToolSearchMode()` from `ENABLE_TOOL_SEARCH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolSearchMode {
    /// Always on (the default, `true`, `auto:0`).
    Tst,
    /// On when deferred tools fill at least `percent` of the context window.
    TstAuto { percent: u32 },
    /// Off: every tool inline (`false`, `auto:100`, or the experimental-betas kill switch).
    Standard,
}

impl ToolSearchMode {
    /// Parses the env value as the reference does; unknown values fall back to the default.
    pub fn from_env(value: Option<&str>, disable_experimental_betas: bool) -> ToolSearchMode {
        if disable_experimental_betas {
            return ToolSearchMode::Standard;
        }
        let Some(value) = value.map(str::trim) else { return ToolSearchMode::Tst };
        match value.to_ascii_lowercase().as_str() {
            "true" => ToolSearchMode::Tst,
            "false" => ToolSearchMode::Standard,
            "auto" => ToolSearchMode::TstAuto { percent: TOOL_SEARCH_AUTO_PERCENT },
            other => match other.strip_prefix("auto:").and_then(|n| n.parse::<u32>().ok()) {
                Some(0) => ToolSearchMode::Tst,
                Some(100..) => ToolSearchMode::Standard,
                Some(percent) => ToolSearchMode::TstAuto { percent },
                None => ToolSearchMode::Tst,
            },
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolSearchMode::Tst => "tst",
            ToolSearchMode::TstAuto { .. } => "tst-auto",
            ToolSearchMode::Standard => "standard",
        }
    }
}

/// A tool offered by a connected MCP server.
#[derive(Debug, Clone, PartialEq)]
pub struct McpToolSpec {
    /// Server key as configured (`demo srv`, `plugin:p:s`, `claude.ai Linear`).
    pub server: String,
    pub tool: String,
    pub description: String,
    pub input_schema: Value,
    /// `_meta['anthropic/alwaysLoad']`: never deferred.
    pub always_load: bool,
}

/// Inputs of pool assembly; the Strategy and the World fill them, no env is read here.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolInputs {
    /// Todo v2 (interactive, or `CLAUDE_CODE_ENABLE_TASKS`): Task* tools instead of TodoWrite.
    pub todo_v2: bool,
    /// Raw `ENABLE_TOOL_SEARCH` value (`None` = unset).
    pub enable_tool_search: Option<String>,
    pub disable_experimental_betas: bool,
    /// Provider is first-party (not Bedrock/Vertex/Foundry).
    pub first_party: bool,
    /// `ANTHROPIC_BASE_URL` points somewhere other than Anthropic (a proxy).
    pub custom_base_url: bool,
    pub model_id: String,
    /// Context window of the model, for the `tst-auto` threshold.
    pub context_window: u64,
    /// Tools of connected MCP servers, in any order.
    pub mcp_tools: Vec<McpToolSpec>,
    /// A connected server supports resources: adds the two resource tools to the MCP partition.
    pub mcp_resources: bool,
    /// An MCP server is still connecting: keeps tool search on even with nothing deferred yet.
    pub mcp_pending: bool,
    /// Deferred tools already discovered via `tool_reference` blocks (or a compact boundary).
    pub discovered: BTreeSet<String>,
    /// Blanket-denied tool names: removed from the pool.
    pub denied: BTreeSet<String>,
    /// A subagent's allowlist: when set, only these tools stay (built-ins and MCP alike).
    pub allowed: Option<BTreeSet<String>>,
    /// The agent types listed in the Agent tool's description.
    pub agent_listing: AgentToolListing,
    /// Pad descriptions and schemas to the size profile.
    pub padding: bool,
}

impl Default for PoolInputs {
    fn default() -> Self {
        PoolInputs {
            todo_v2: false,
            enable_tool_search: None,
            disable_experimental_betas: false,
            first_party: true,
            custom_base_url: false,
            model_id: "claude-sonnet-4-6".into(),
            context_window: 200_000,
            mcp_tools: Vec::new(),
            mcp_resources: false,
            mcp_pending: false,
            discovered: BTreeSet::new(),
            denied: BTreeSet::new(),
            allowed: None,
            agent_listing: AgentToolListing::default(),
            padding: true,
        }
    }
}

/// One tool of the assembled pool with its deferral decision.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolTool {
    pub tool: Tool,
    pub is_mcp: bool,
    /// Deferred under tool search (`isDeferredTool`).
    pub deferred: bool,
}

/// The assembled pool and what goes on the wire this request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPool {
    pub mode: ToolSearchMode,
    /// ToolSearch exists in the pool (`isToolSearchEnabledOptimistic`).
    pub tool_search_available: bool,
    /// Tool search is on for this request.
    pub tool_search: bool,
    /// Every enabled tool, sorted: built-ins, then MCP.
    pub all: Vec<PoolTool>,
    /// The `tools` array as sent.
    pub tools: crate::api::SharedVec<Tool>,
    /// Names announced in `<available-deferred-tools>` (code-unit order), empty when tool search
    /// is off.
    pub deferred_names: Vec<String>,
    /// A non-deferred MCP tool is inline: the system prompt goes to mode A.
    pub inline_mcp: bool,
    /// [`deferred_tools_listing`] of `deferred_names` when tool search is on, made with the
    /// pool: every request of the pool sends the one text (a pointer comparison to the
    /// request before, and to the measurer).
    listing: Option<crate::api::SharedText>,
    /// [`ToolPool::tools_chars`], made at its first use: the runs sharing a pool share it.
    tools_chars: std::cell::OnceCell<usize>,
    /// [`ToolPool::enabled_names`], made with the pool: the system prompt's inputs hold this
    /// list, and compare it with the last build's by pointer first.
    enabled_names: std::sync::Arc<[String]>,
}

impl ToolPool {
    /// Content of the deferred-tool announcement message, if tool search is on (the pool's
    /// one text, shared).
    pub fn deferred_listing(&self) -> Option<crate::api::SharedText> {
        debug_assert!(
            self.listing.as_ref().map(|l| l.as_str()) == self.tool_search.then(|| deferred_tools_listing(&self.deferred_names)).as_deref(),
            "the listing made with the pool is its deferred names' listing"
        );
        self.listing.clone()
    }

    /// The serialized length of `tools` (what a peer mechanism counts for them).
    pub fn tools_chars(&self) -> usize {
        *self.tools_chars.get_or_init(|| self.tools.iter().map(|t| serde_json::to_vec(t).map_or(0, |j| j.len())).sum())
    }

    /// Names of the enabled tools (for the system prompt's guidance bullets): the pool's one
    /// list, shared.
    pub fn enabled_names(&self) -> std::sync::Arc<[String]> {
        debug_assert!(self.enabled_names.iter().eq(self.all.iter().map(|tool| &tool.tool.name)), "the pool's enabled names are its tools'");
        std::sync::Arc::clone(&self.enabled_names)
    }
}

/// `<available-deferred-tools>\n{names, one per line}\n</available-deferred-tools>`.
pub fn deferred_tools_listing(names: &[String]) -> String {
    format!("{DEFERRED_OPEN}\n{}\n{DEFERRED_CLOSE}", names.join("\n"))
}

/// `normalizeNameForMCP`: every char outside `[A-Za-z0-9_-]` becomes `_`; for `claude.ai `
/// servers runs of `_` collapse and leading/trailing `_` are trimmed.
pub fn normalize_name_for_mcp(name: &str, claude_ai: bool) -> String {
    let mut out: String =
        name.chars().map(|ch| if ch.is_ascii_alphanumeric() || ch == '_' || ch == '-' { ch } else { '_' }).collect();
    if claude_ai {
        let mut collapsed = String::with_capacity(out.len());
        for ch in out.chars() {
            if !(ch == '_' && collapsed.ends_with('_')) {
                collapsed.push(ch);
            }
        }
        out = collapsed.trim_matches('_').to_owned();
    }
    out
}

/// `mcp__{server}__{tool}`, both normalized.
pub fn mcp_tool_name(server: &str, tool: &str) -> String {
    let claude_ai = server.starts_with("claude.ai ");
    format!("mcp__{}__{}", normalize_name_for_mcp(server, claude_ai), normalize_name_for_mcp(tool, claude_ai))
}

/// An approximation of JS `localeCompare` (ICU root collation) good for tool names: ignoring
/// case first (primary strength), with punctuation before digits before letters, then lower case
/// before upper case as a tie-break, then code units. Exact ICU tables are not reproduced.
pub fn locale_compare(a: &str, b: &str) -> Ordering {
    fn primary(ch: char) -> (u8, u32) {
        match ch {
            '_' => (0, 0),
            '-' => (0, 1),
            c if c.is_ascii_punctuation() || c.is_whitespace() => (0, 2 + c as u32),
            c if c.is_ascii_digit() => (1, c as u32),
            c if c.is_alphabetic() => (2, c.to_lowercase().next().unwrap_or(c) as u32),
            c => (3, c as u32),
        }
    }
    let keys_a = a.chars().map(primary);
    let keys_b = b.chars().map(primary);
    keys_a
        .cmp(keys_b)
        .then_with(|| {
            // Tertiary: lower case sorts before upper case at the first difference.
            let tertiary = |s: &str| s.chars().map(|c| c.is_uppercase()).collect::<Vec<_>>();
            tertiary(a).cmp(&tertiary(b))
        })
        .then_with(|| a.encode_utf16().cmp(b.encode_utf16()))
}

/// Plain JS `.sort()` order: UTF-16 code units.
pub fn code_unit_compare(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// Models that cannot take `tool_reference` blocks (GrowthBook default `['haiku']`).
pub fn model_supports_tool_reference(model_id: &str) -> bool {
    !model_id.to_ascii_lowercase().contains("haiku")
}

/// Whether the client can defer tools at all (`ENABLE_TOOL_SEARCH` not `false`, experimental
/// betas allowed): a first-party provider behind a proxy gets no tool search unless the env asks
/// for it.
pub fn tool_search_allowed(enable_tool_search: Option<&str>, disable_experimental_betas: bool, first_party: bool, custom_base_url: bool) -> bool {
    ToolSearchMode::from_env(enable_tool_search, disable_experimental_betas) != ToolSearchMode::Standard
        && !(enable_tool_search.is_none() && first_party && custom_base_url)
}

/// Builds the pool and the request's `tools` array.
pub fn assemble_pool(inputs: &PoolInputs, profile: &SizeProfile) -> ToolPool {
    let mode = ToolSearchMode::from_env(inputs.enable_tool_search.as_deref(), inputs.disable_experimental_betas);
    let mut tool_search_available =
        tool_search_allowed(inputs.enable_tool_search.as_deref(), inputs.disable_experimental_betas, inputs.first_party, inputs.custom_base_url);

    let mut builtins: Vec<BuiltinTool> = base_tool_names(inputs.todo_v2)
        .iter()
        .filter_map(|name| match *name {
            "Agent" => Some(agent_tool(profile, inputs.padding, &inputs.agent_listing)),
            name => builtin_tool(name, profile, inputs.padding),
        })
        .collect();
    if tool_search_available {
        builtins.extend(builtin_tool(TOOL_SEARCH, profile, inputs.padding));
    }
    let kept = |name: &str| !inputs.denied.contains(name) && inputs.allowed.as_ref().is_none_or(|allowed| allowed.contains(name));
    builtins.retain(|tool| kept(tool.name));
    // Tool search needs the ToolSearch tool itself in the pool (a subagent may not have it).
    tool_search_available &= builtins.iter().any(|tool| tool.name == TOOL_SEARCH);
    builtins.sort_by(|a, b| locale_compare(a.name, b.name));

    let mut mcp: Vec<PoolTool> = inputs
        .mcp_tools
        .iter()
        .map(|spec| {
            let name = mcp_tool_name(&spec.server, &spec.tool);
            let description = truncate_marked(&spec.description, MCP_DESCRIPTION_MAX);
            PoolTool { tool: Tool::custom(name, description, spec.input_schema.clone()), is_mcp: true, deferred: !spec.always_load }
        })
        .collect();
    if inputs.mcp_resources {
        for name in [LIST_MCP_RESOURCES, READ_MCP_RESOURCE] {
            if let Some(tool) = builtin_tool(name, profile, inputs.padding) {
                // Built-in code, but they sort and defer with the MCP partition.
                mcp.push(PoolTool { tool: tool.to_api(), is_mcp: false, deferred: tool.should_defer });
            }
        }
    }
    mcp.retain(|tool| kept(&tool.tool.name));
    mcp.sort_by(|a, b| locale_compare(&a.tool.name, &b.tool.name));

    // uniqBy name: the built-in wins, and the first MCP duplicate wins among MCP tools.
    let mut seen = BTreeSet::new();
    let mut all = Vec::new();
    for tool in builtins.iter().map(|tool| PoolTool { tool: tool.to_api(), is_mcp: false, deferred: is_deferred_builtin(tool) }).chain(mcp) {
        if seen.insert(tool.tool.name.clone()) {
            all.push(tool);
        }
    }

    let has_deferred = all.iter().any(|tool| tool.deferred);
    let mut tool_search = tool_search_available && model_supports_tool_reference(&inputs.model_id);
    if let (true, ToolSearchMode::TstAuto { percent }) = (tool_search, mode) {
        // The client counts tokens with the API; offline we use its documented char fallback.
        let threshold_tokens = (inputs.context_window as f64 * f64::from(percent) / 100.0).floor();
        let threshold_chars = (threshold_tokens * AUTO_CHARS_PER_TOKEN).floor() as usize;
        let deferred_chars: usize = all
            .iter()
            .filter(|tool| tool.deferred)
            .map(|tool| {
                tool.tool.name.len()
                    + tool.tool.description.as_deref().map_or(0, crate::agent::profile::js_len)
                    + tool.tool.input_schema.as_deref().map_or(0, schema_len)
            })
            .sum();
        tool_search = deferred_chars >= threshold_chars;
    }
    if tool_search && !has_deferred && !inputs.mcp_pending {
        tool_search = false;
    }

    let mut tools = Vec::new();
    let mut deferred_names = Vec::new();
    for entry in &all {
        if !tool_search {
            if entry.tool.name != TOOL_SEARCH {
                tools.push(entry.tool.clone());
            }
            continue;
        }
        if !entry.deferred {
            tools.push(entry.tool.clone());
            continue;
        }
        deferred_names.push(entry.tool.name.clone());
        if inputs.discovered.contains(&entry.tool.name) {
            let mut tool = entry.tool.clone();
            tool.defer_loading = Some(true);
            tools.push(tool);
        }
    }
    deferred_names.sort_by(|a, b| code_unit_compare(a, b));
    let inline_mcp = all.iter().any(|entry| entry.is_mcp && tools.iter().any(|t| t.name == entry.tool.name && t.defer_loading.is_none()));

    let listing = tool_search.then(|| deferred_tools_listing(&deferred_names).into());
    let enabled_names = all.iter().map(|tool| tool.tool.name.clone()).collect();
    ToolPool { mode, tool_search_available, tool_search, all, tools: tools.into(), deferred_names, inline_mcp, listing, tools_chars: Default::default(), enabled_names }
}

/// `isDeferredTool` for built-ins: ToolSearch never, otherwise `shouldDefer`.
fn is_deferred_builtin(tool: &BuiltinTool) -> bool {
    tool.name != TOOL_SEARCH && tool.should_defer
}
