//! The [`Strategy`] struct and its loading: every knob of layers 1–5, and the layer-6 chain's
//! knobs under `compact`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::CacheTtl;

/// A lane's cache TTL as a strategy sets it: named (`5m`, `1h`), or `auto`, the client's own
/// choice: on a real session the TTL the recording shows (a subscriber's client writes at 1h), in
/// a scenario the API's default, 5m. A TTL a user names (`--set ttl_main=5m`, a sweep over
/// `ttl_main`) applies to a real session too, also where it equals the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TtlSetting {
    #[serde(rename = "auto")]
    Auto,
    #[serde(rename = "5m")]
    FiveMinutes,
    #[serde(rename = "1h")]
    OneHour,
}

impl TtlSetting {
    /// The TTL where nothing recorded stands for `auto`: the API's default, 5m.
    pub fn ttl(self) -> CacheTtl {
        match self {
            TtlSetting::Auto | TtlSetting::FiveMinutes => CacheTtl::FiveMinutes,
            TtlSetting::OneHour => CacheTtl::OneHour,
        }
    }

    /// The TTL named, `None` for `auto`.
    pub fn named(self) -> Option<CacheTtl> {
        (self != TtlSetting::Auto).then(|| self.ttl())
    }
}

impl From<CacheTtl> for TtlSetting {
    fn from(ttl: CacheTtl) -> Self {
        match ttl {
            CacheTtl::FiveMinutes => TtlSetting::FiveMinutes,
            CacheTtl::OneHour => TtlSetting::OneHour,
        }
    }
}

/// Where MCP server instructions go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpInstructionsMode {
    /// The uncached `mcp_instructions` system section (external default).
    System,
    /// `mcp_instructions_delta` attachments (`CLAUDE_CODE_MCP_INSTR_DELTA`, gate `tengu_basalt_3kr`).
    Delta,
}

/// `ANTHROPIC_BASE_URL`: Anthropic's own endpoint or a proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BaseUrl {
    FirstParty,
    Custom,
}

/// Every knob of layers 1–5. Unknown keys in a file are errors; missing keys keep the default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Strategy {
    /// Preset or file name, written into summaries.
    pub name: String,
    /// Insert `__SYSTEM_PROMPT_DYNAMIC_BOUNDARY__` (static block globally cached).
    pub dynamic_boundary: bool,
    /// `shouldUseGlobalCacheScope()`: first-party provider, experimental betas allowed.
    pub global_cache_scope: bool,
    /// Pad our own texts to the reference's measured lengths.
    pub size_profile_padding: bool,
    /// `DISABLE_PROMPT_CACHING` turns every marker off when false.
    pub prompt_caching: bool,
    /// Emit the billing/attribution system block.
    pub attribution_header: bool,
    pub mcp_instructions: McpInstructionsMode,
    /// Announce deferred tools as `deferred_tools_delta` attachments instead of the
    /// `<available-deferred-tools>` message at messages[0] (gate `tengu_glacier_2xr`).
    pub deferred_tools_delta: bool,
    /// Raw `ENABLE_TOOL_SEARCH` value (`None` = unset): `true`, `false`, `auto`, `auto:N`.
    pub enable_tool_search: Option<String>,
    pub base_url: BaseUrl,
    /// Provider is first-party (not Bedrock/Vertex/Foundry).
    pub first_party: bool,
    /// `CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS`.
    pub disable_experimental_betas: bool,
    /// TTL of the main lane's markers (`5m` is sent as no ttl at all; `auto`, the default: the
    /// recorded TTL on a real session, else 5m).
    pub ttl_main: TtlSetting,
    /// TTL of every other lane (`auto` as for `ttl_main`).
    pub ttl_other: TtlSetting,
    /// Interactive REPL (true) or print mode `-p` (false).
    pub interactive: bool,
    /// Skill listing budget as a fraction of the context window in characters (window × 4 × f).
    pub skill_listing_budget_fraction: f64,
    /// Per-entry description cap of the skill listing.
    pub skill_description_max: usize,
    /// `MAX_MCP_OUTPUT_TOKENS`: MCP tool results longer than this (chars/4) are cut.
    pub max_mcp_output_tokens: u64,
    /// `BASH_MAX_OUTPUT_LENGTH`: Bash output longer than this many chars is cut.
    pub bash_max_output_length: usize,
    /// Read: lines returned without offset/limit.
    pub read_max_lines: usize,
    /// Read: a file larger than this (bytes) needs offset/limit.
    pub read_max_bytes: usize,
    /// Read: a result above this many tokens (chars/4) is refused.
    pub read_max_tokens: u64,
    /// Legacy smoosh (gate `tengu_chair_sermon` off): attachment text after a string tool_result
    /// is folded into it.
    pub smoosh_into_tool_result: bool,
    /// Append the `Tool loaded.` sibling after tool_reference results (gate `tengu_toolref_defer_j8m` off).
    pub tool_loaded_sibling: bool,
    /// Assistant turns without TodoWrite (and since the last reminder) before a todo_reminder.
    pub todo_reminder_turns: u32,
    /// Emit date_change attachments when the local date rolls over.
    pub date_change_attachment: bool,
    /// Load CLAUDE.md files at all (`CLAUDE_CODE_DISABLE_CLAUDE_MDS` sets false).
    pub claude_md: bool,
    /// Inject nested CLAUDE.md and conditional rules when a file is read.
    pub nested_memory: bool,
    /// Auto memory (`memory` system section and MEMORY.md).
    pub auto_memory: bool,
    /// Run hook commands for real (`sh -c`, stdin = the hook input JSON) when the scenario has no
    /// scripted answer for them. Off by default: a simulation never touches the OS.
    pub run_hooks: bool,
    /// Consecutive Stop-hook continuations before the loop stops anyway (reference: 8).
    pub stop_hook_cap: u32,
    /// `CLAUDE_CODE_AGENT_LIST_IN_MESSAGES` (gate `tengu_agent_list_attach`): the agent types
    /// travel in `agent_listing_delta` attachments instead of the Agent tool's description.
    pub agent_list_in_messages: bool,
    /// Relevant memories (gate `tengu_moth_copse`, off by default; ours: `CTXSIM_RELEVANT_MEMORIES`):
    /// memory files chosen per prompt arrive as `relevant_memories` attachments, and MEMORY.md
    /// leaves the user context.
    pub relevant_memories: bool,
    /// The git snapshot (`gitStatus`) in the system prompt; `CLAUDE_CODE_REMOTE` and
    /// `CLAUDE_CODE_DISABLE_GIT_INSTRUCTIONS` turn it off (so does `includeGitInstructions: false`).
    pub git_status: bool,
    /// A recorded session's microcompacts (the recorded client's own) are applied where the
    /// recording shows them. Off: the tool results they cleared stay in view (the replies after
    /// the first one diverge: they answered the cleared conversation). The agent's own
    /// microcompact is `compact.microcompact`.
    pub replay_recorded_microcompact: bool,
    /// The Claude Code release whose requests the agent builds (`--client-version`):
    /// `2.1.88` (the default) or `2.1.332` (src/agent/dialect.rs, data/profiles/2.1.332.toml).
    pub client_version: String,
    /// Layer 6: the long-context chain's knobs, nested under `compact.` in files and `--set`.
    pub compact: crate::agent::compact::CompactConfig,
}

impl Default for Strategy {
    fn default() -> Self {
        Strategy {
            name: "claude-code".into(),
            dynamic_boundary: true,
            global_cache_scope: true,
            size_profile_padding: true,
            prompt_caching: true,
            attribution_header: true,
            mcp_instructions: McpInstructionsMode::System,
            deferred_tools_delta: false,
            enable_tool_search: None,
            base_url: BaseUrl::FirstParty,
            first_party: true,
            disable_experimental_betas: false,
            ttl_main: TtlSetting::Auto,
            ttl_other: TtlSetting::Auto,
            interactive: false,
            skill_listing_budget_fraction: 0.01,
            skill_description_max: 250,
            max_mcp_output_tokens: 25_000,
            bash_max_output_length: 30_000,
            read_max_lines: 2000,
            read_max_bytes: 256 * 1024,
            read_max_tokens: 25_000,
            smoosh_into_tool_result: true,
            tool_loaded_sibling: true,
            todo_reminder_turns: 10,
            date_change_attachment: true,
            claude_md: true,
            nested_memory: true,
            auto_memory: true,
            run_hooks: false,
            stop_hook_cap: 8,
            agent_list_in_messages: false,
            relevant_memories: false,
            git_status: true,
            replay_recorded_microcompact: true,
            client_version: crate::agent::dialect::VERSIONS[0].to_owned(),
            compact: crate::agent::compact::CompactConfig::default(),
        }
    }
}

/// The knobs (top-level keys of a [`Strategy`]) the agent reads: all of them (the layer-6
/// chain's whole `compact` table among them); a test fails on a knob not listed, so a new knob
/// must be wired to the agent and listed.
pub const AGENT_READ_KNOBS: &[&str] = &[
    "name",
    "replay_recorded_microcompact",
    "dynamic_boundary",
    "global_cache_scope",
    "size_profile_padding",
    "prompt_caching",
    "attribution_header",
    "mcp_instructions",
    "deferred_tools_delta",
    "enable_tool_search",
    "base_url",
    "first_party",
    "disable_experimental_betas",
    "ttl_main",
    "ttl_other",
    "interactive",
    "skill_listing_budget_fraction",
    "skill_description_max",
    "max_mcp_output_tokens",
    "bash_max_output_length",
    "read_max_lines",
    "read_max_bytes",
    "read_max_tokens",
    "smoosh_into_tool_result",
    "tool_loaded_sibling",
    "todo_reminder_turns",
    "date_change_attachment",
    "claude_md",
    "nested_memory",
    "auto_memory",
    "run_hooks",
    "stop_hook_cap",
    "agent_list_in_messages",
    "relevant_memories",
    "git_status",
    "client_version",
    "compact",
];

#[derive(Debug, thiserror::Error)]
pub enum StrategyError {
    #[error("failed to read strategy file {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("failed to parse strategy file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("failed to read strategy file: {1}")]
    Text(String, crate::input::TextError),
    #[error("failed to set `{key}`: {message}")]
    Set { key: String, message: String },
    #[error("unknown strategy preset `{0}` (see `ctxsim strategies`)")]
    UnknownPreset(String),
    #[error(
        "strategy `{0}`: run_hooks = true would run the scenario's hook commands on this machine; a strategy file or --set cannot turn that on: pass --allow-host-commands to `ctxsim run`"
    )]
    HostCommands(String),
    #[error("strategy `{name}`: {key} = {value}: {message}")]
    Invalid { name: String, key: String, value: String, message: String },
    #[error("environment variable {name}={value}: {message}")]
    Env { name: String, value: String, message: String },
}

/// How many keys [`Strategy::content_key`] keeps per thread (a session's what-ifs ask for a
/// few dozen: each candidate's run key, the families of the candidates and of each branch).
const CONTENT_KEYS_KEPT: usize = 64;

thread_local! {
    /// The content keys made last on this thread, with the strategy and tail each is of. The
    /// same strategy and tail give the same key, so which calls share one changes no result.
    /// (Oldest first: the oldest goes when a new one comes, without moving the rest, each a
    /// whole strategy.)
    static CONTENT_KEYS: std::cell::RefCell<std::collections::VecDeque<(Strategy, String, String)>> = const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
}

impl Strategy {
    /// A content hash of this strategy: xxh3-128 of its JSON followed by `tail`, as 32 hex
    /// digits. Two strategies whose JSON differs have different keys (the what-ifs' run keys
    /// and autocompact families). The keys made last are kept per thread ([`CONTENT_KEYS`]):
    /// the audit asks for the key of one strategy several times (a candidate's family, again
    /// as a member of its family, again when a branch is retargeted), and writing a strategy
    /// out costs ~40 K instructions.
    pub fn content_key(&self, tail: &str) -> String {
        let make = || {
            let mut text = serde_json::to_vec(self).expect("a strategy serializes");
            text.extend_from_slice(tail.as_bytes());
            format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&text))
        };
        CONTENT_KEYS.with(|kept| {
            let mut kept = kept.borrow_mut();
            if let Some((_, _, key)) = kept.iter().find(|(strategy, kept_tail, _)| kept_tail == tail && strategy.same_bits(self)) {
                debug_assert_eq!(*key, make(), "a kept content key differs from the strategy's");
                return key.clone();
            }
            let key = make();
            if kept.len() >= CONTENT_KEYS_KEPT {
                kept.pop_front();
            }
            kept.push_back((self.clone(), tail.to_owned(), key.clone()));
            key
        })
    }

    /// `self == other`, its one number compared bit for bit: `==` takes −0.0 for 0.0, whose
    /// JSON differs (the settings the what-ifs key by their JSON, [`Self::content_key`]). A
    /// few knobs cheap to compare go first: the strategies a session's what-ifs compare (the
    /// presets, the recorded settings of other sessions) differ there most, and `==` reads
    /// every list of tool names before it reaches them.
    fn same_bits(&self, other: &Strategy) -> bool {
        let (a, b) = (&self.compact, &other.compact);
        a.autocompact == b.autocompact
            && a.peer == b.peer
            && a.session_memory == b.session_memory
            && self.ttl_main == other.ttl_main
            && self.ttl_other == other.ttl_other
            && self.dynamic_boundary == other.dynamic_boundary
            && self.mcp_instructions == other.mcp_instructions
            && self.enable_tool_search == other.enable_tool_search
            && self == other
            && self.skill_listing_budget_fraction.to_bits() == other.skill_listing_budget_fraction.to_bits()
    }

    /// A named preset (id or alias; see [`super::presets::PRESETS`]). `claude-code-env` reads
    /// the process environment.
    pub fn preset(name: &str) -> Result<Strategy, StrategyError> {
        let env: BTreeMap<String, String> = if name == "claude-code-env" { std::env::vars().collect() } else { BTreeMap::new() };
        super::presets::build(name, &env)
    }

    /// `resolve` then every `key=value` of `--set`.
    pub fn resolve_with(name_or_path: &str, sets: &[String]) -> Result<Strategy, StrategyError> {
        let mut strategy = Strategy::resolve(name_or_path)?;
        for set in sets {
            let (key, value) = set
                .split_once('=')
                .ok_or_else(|| StrategyError::Set { key: set.clone(), message: "expected key=value".into() })?;
            strategy.set(key.trim(), value.trim())?;
        }
        if strategy.run_hooks {
            return Err(StrategyError::HostCommands(strategy.name.clone()));
        }
        strategy.validate()?;
        Ok(strategy)
    }

    /// A preset name, or a TOML/YAML file of knob overrides on top of the default.
    pub fn resolve(name_or_path: &str) -> Result<Strategy, StrategyError> {
        let path = Path::new(name_or_path);
        if path.extension().is_some_and(|e| e == "toml" || e == "yaml" || e == "yml") || path.is_file() {
            Strategy::load(path)
        } else {
            Strategy::preset(name_or_path)
        }
    }

    /// Parses strategy text, TOML or YAML; `shown` names it in messages, which give the line
    /// and never quote more than a short excerpt of the input.
    pub fn parse(text: &str, shown: &str, toml: bool) -> Result<Strategy, StrategyError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        if toml {
            toml::from_str(text).map_err(|e| StrategyError::Parse { path: shown.to_owned(), message: crate::input::toml_message(&e, text) })
        } else {
            if let Err((line, message)) = crate::scenario::check_yaml_depth(text) {
                return Err(StrategyError::Parse { path: shown.to_owned(), message: format!("line {line}: {message}") });
            }
            serde_norway::from_str(text)
                .map_err(|e| StrategyError::Parse { path: shown.to_owned(), message: crate::input::cap_message(&e.to_string()) })
        }
    }

    /// Loads a TOML (`.toml`) or YAML file; missing keys keep the default.
    pub fn load(path: impl AsRef<Path>) -> Result<Strategy, StrategyError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = crate::input::read_text(path).map_err(|e| StrategyError::Text(shown.clone(), e))?;
        let mut strategy = Strategy::parse(&text, &shown, path.extension().is_some_and(|e| e == "toml"))?;
        if strategy.name == Strategy::default().name {
            strategy.name = path.file_stem().map_or(shown, |s| s.to_string_lossy().into_owned());
        }
        Ok(strategy)
    }

    /// `--set key=value`: a dotted key walked through the JSON form; the value is read as JSON
    /// when it parses (numbers, booleans, null, quoted strings), else taken as a string.
    /// `env.NAME=value` applies the client's environment variable `NAME` as Claude Code reads
    /// it (`env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE=60`, `env.DISABLE_AUTO_COMPACT=1`, ...), so a
    /// sweep or comparison can vary what users set in their shell.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), StrategyError> {
        let err = |message: String| StrategyError::Set { key: key.to_owned(), message };
        if let Some(name) = key.strip_prefix("env.") {
            if !ENV_VARS.contains(&name) {
                return Err(err(format!("unknown client environment variable `{name}` (known: {})", ENV_VARS.join(", "))));
            }
            return self.apply_env(&BTreeMap::from([(name.to_owned(), value.to_owned())]));
        }
        let mut root = serde_json::to_value(&*self).map_err(|e| err(e.to_string()))?;
        let mut slot = &mut root;
        for part in key.split('.') {
            let Value::Object(map) = slot else { return Err(err(format!("`{part}` is not inside a table"))) };
            let known: Vec<String> = map.keys().cloned().collect();
            slot = map.get_mut(part).ok_or_else(|| err(format!("unknown key `{part}` (known: {})", known.join(", "))))?;
        }
        let parsed = serde_json::from_str::<Value>(value).unwrap_or_else(|_| Value::String(value.to_owned()));
        // A knob that holds a string keeps `true`/`5` as text. An unset optional knob (null)
        // takes the value as parsed, or as text when that is what it holds.
        let unset = slot.is_null();
        let as_text = match &parsed {
            Value::Bool(b) => Some(Value::String(b.to_string())),
            Value::Number(n) => Some(Value::String(n.to_string())),
            _ => None,
        };
        *slot = match (&*slot, parsed) {
            (Value::String(_), Value::Bool(b)) => Value::String(b.to_string()),
            (Value::String(_), Value::Number(n)) => Value::String(n.to_string()),
            (_, parsed) => parsed,
        };
        match serde_json::from_value(root.clone()) {
            Ok(strategy) => *self = strategy,
            Err(first) => {
                let Some(text) = as_text.filter(|_| unset) else { return Err(err(first.to_string())) };
                let mut slot = &mut root;
                for part in key.split('.') {
                    slot = slot.get_mut(part).ok_or_else(|| err(first.to_string()))?;
                }
                *slot = text;
                *self = serde_json::from_value(root).map_err(|_| err(first.to_string()))?;
            }
        }
        Ok(())
    }

    /// Range checks of the numeric knobs (fractions in range, percentages in 0..=100, limits
    /// above zero); the message names the knob. Knobs that depend on the model (the autocompact
    /// buffer against the window) are checked when a run knows its model
    /// ([`crate::runner::check_strategy_for`]).
    pub fn validate(&self) -> Result<(), StrategyError> {
        let invalid = |key: &str, value: String, message: &str| {
            Err(StrategyError::Invalid { name: self.name.clone(), key: key.to_owned(), value, message: message.to_owned() })
        };
        let f = self.skill_listing_budget_fraction;
        if !(f.is_finite() && (0.0..=1.0).contains(&f)) {
            return invalid("skill_listing_budget_fraction", f.to_string(), "must be a fraction between 0 and 1");
        }
        if !crate::agent::dialect::VERSIONS.contains(&self.client_version.as_str()) {
            return invalid("client_version", self.client_version.clone(), &format!("the agent speaks {}", crate::agent::dialect::VERSIONS.join(" and ")));
        }
        let c = &self.compact;
        let percentages = [
            ("compact.snip.trigger_pct", Some(c.snip.trigger_pct)),
            ("compact.snip.target_pct", Some(c.snip.target_pct)),
            ("compact.context_collapse.commit_pct", Some(c.context_collapse.commit_pct)),
            ("compact.context_collapse.block_pct", Some(c.context_collapse.block_pct)),
            ("compact.context_collapse.target_pct", Some(c.context_collapse.target_pct)),
            ("compact.autocompact.pct_override", c.autocompact.pct_override),
        ];
        for (key, value) in percentages {
            if let Some(v) = value
                && v > 100
            {
                return invalid(key, v.to_string(), "must be a percentage from 0 to 100");
            }
        }
        if c.snip.target_pct > c.snip.trigger_pct {
            return invalid("compact.snip.target_pct", c.snip.target_pct.to_string(), "must not be above compact.snip.trigger_pct (snipping would grow the context)");
        }
        if c.context_collapse.target_pct > c.context_collapse.commit_pct {
            return invalid(
                "compact.context_collapse.target_pct",
                c.context_collapse.target_pct.to_string(),
                "must not be above compact.context_collapse.commit_pct (collapsing would grow the context)",
            );
        }
        if c.session_memory.compact_min_tokens > c.session_memory.compact_max_tokens {
            return invalid("compact.session_memory.compact_min_tokens", c.session_memory.compact_min_tokens.to_string(), "must not be above compact.session_memory.compact_max_tokens");
        }
        for (key, value) in [("read_max_lines", self.read_max_lines as u64), ("read_max_bytes", self.read_max_bytes as u64), ("read_max_tokens", self.read_max_tokens)] {
            if value == 0 {
                return invalid(key, value.to_string(), "must be above 0");
            }
        }
        Ok(())
    }

    /// The default strategy with the env vars of layers 1–5 applied.
    pub fn from_env(env: &BTreeMap<String, String>) -> Result<Strategy, StrategyError> {
        let mut strategy = Strategy::default();
        strategy.apply_env(env)?;
        Ok(strategy)
    }

    /// Applies `ENABLE_TOOL_SEARCH`, `MAX_MCP_OUTPUT_TOKENS`, `BASH_MAX_OUTPUT_LENGTH` (and the
    /// provider switches the reference reads alongside them) on top of this strategy.
    pub fn apply_env(&mut self, env: &BTreeMap<String, String>) -> Result<(), StrategyError> {
        let number = |name: &str, value: &str| {
            value.trim().parse::<u64>().map_err(|e| StrategyError::Env { name: name.into(), value: value.into(), message: e.to_string() })
        };
        for (name, value) in env {
            match name.as_str() {
                "ENABLE_TOOL_SEARCH" => self.enable_tool_search = Some(value.clone()),
                ENV_MAX_MCP_OUTPUT_TOKENS => self.max_mcp_output_tokens = number(name, value)?,
                ENV_BASH_MAX_OUTPUT_LENGTH => self.bash_max_output_length = number(name, value)? as usize,
                "ANTHROPIC_BASE_URL" => {
                    self.base_url = if value.contains("api.anthropic.com") { BaseUrl::FirstParty } else { BaseUrl::Custom }
                }
                "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS" if truthy(value) => {
                    self.disable_experimental_betas = true;
                    self.global_cache_scope = false;
                }
                "DISABLE_PROMPT_CACHING" if truthy(value) => self.prompt_caching = false,
                "CLAUDE_CODE_MCP_INSTR_DELTA" if truthy(value) => self.mcp_instructions = McpInstructionsMode::Delta,
                "CLAUDE_CODE_DISABLE_CLAUDE_MDS" if truthy(value) => self.claude_md = false,
                "CLAUDE_CODE_DISABLE_AUTO_MEMORY" if truthy(value) => self.auto_memory = false,
                "CLAUDE_CODE_AGENT_LIST_IN_MESSAGES" if truthy(value) => self.agent_list_in_messages = true,
                "CTXSIM_RELEVANT_MEMORIES" if truthy(value) => self.relevant_memories = true,
                "CLAUDE_CODE_REMOTE" | "CLAUDE_CODE_DISABLE_GIT_INSTRUCTIONS" if truthy(value) => self.git_status = false,
                _ => {}
            }
        }
        self.compact.apply_env(env);
        Ok(())
    }

    /// Whether [`Strategy::apply_env`] applies `env` to the compaction knobs: it stops, before
    /// them, at the first number it cannot read.
    pub fn env_reaches_compact(env: &BTreeMap<String, String>) -> bool {
        env.iter().all(|(name, value)| !matches!(name.as_str(), ENV_MAX_MCP_OUTPUT_TOKENS | ENV_BASH_MAX_OUTPUT_LENGTH) || value.trim().parse::<u64>().is_ok())
    }

    /// The TTL written into markers on `lane` (`None` = the API default, not serialized).
    pub fn ttl_for(&self, lane: &str) -> Option<CacheTtl> {
        let ttl = if lane == "main" { self.ttl_main } else { self.ttl_other }.ttl();
        (ttl == CacheTtl::OneHour).then_some(ttl)
    }
}

/// The numbers [`Strategy::apply_env`] reads from the environment.
const ENV_MAX_MCP_OUTPUT_TOKENS: &str = "MAX_MCP_OUTPUT_TOKENS";
const ENV_BASH_MAX_OUTPUT_LENGTH: &str = "BASH_MAX_OUTPUT_LENGTH";

/// The environment variables [`Strategy::apply_env`] reads (`--set env.NAME=value`).
pub const ENV_VARS: [&str; 30] = [
    "ANTHROPIC_BASE_URL",
    "API_MAX_INPUT_TOKENS",
    "API_TARGET_INPUT_TOKENS",
    "BASH_MAX_OUTPUT_LENGTH",
    "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE",
    "CLAUDE_CODE_AGENT_LIST_IN_MESSAGES",
    "CLAUDE_CODE_AUTO_COMPACT_WINDOW",
    "CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE",
    "CLAUDE_CODE_DISABLE_AUTO_MEMORY",
    "CLAUDE_CODE_DISABLE_CLAUDE_MDS",
    "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS",
    "CLAUDE_CODE_DISABLE_GIT_INSTRUCTIONS",
    "CLAUDE_CODE_MCP_INSTR_DELTA",
    "CLAUDE_CODE_REMOTE",
    "CLAUDE_CONTEXT_COLLAPSE",
    "CTXSIM_CACHED_MICROCOMPACT",
    "CTXSIM_REACTIVE_COMPACT",
    "CTXSIM_RELEVANT_MEMORIES",
    "CTXSIM_SESSION_MEMORY",
    "CTXSIM_TIME_MICROCOMPACT",
    "CTXSIM_TOOL_RESULT_BUDGET",
    "DISABLE_AUTO_COMPACT",
    "DISABLE_CLAUDE_CODE_SM_COMPACT",
    "DISABLE_COMPACT",
    "DISABLE_PROMPT_CACHING",
    "ENABLE_CLAUDE_CODE_SM_COMPACT",
    "ENABLE_TOOL_SEARCH",
    "MAX_MCP_OUTPUT_TOKENS",
    "USE_API_CLEAR_TOOL_RESULTS",
    "USE_API_CLEAR_TOOL_USES",
];

#[cfg(test)]
mod agent_knobs_tests {
    use super::*;

    /// Every knob is read by the agent, and listed so.
    #[test]
    fn every_knob_is_read_by_the_agent() {
        let value = serde_json::to_value(Strategy::default()).unwrap();
        let knobs: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
        for knob in &knobs {
            assert!(AGENT_READ_KNOBS.contains(knob), "knob `{knob}`: wire it to the agent and list it in AGENT_READ_KNOBS");
        }
        for knob in AGENT_READ_KNOBS {
            assert!(knobs.contains(knob), "`{knob}` is no knob of the strategy");
        }
    }
}

#[cfg(test)]
mod content_key_tests {
    use super::*;

    /// The key made the long way: xxh3-128 of the JSON, then the tail.
    fn written(strategy: &Strategy, tail: &str) -> String {
        let mut text = serde_json::to_vec(strategy).unwrap();
        text.extend_from_slice(tail.as_bytes());
        format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&text))
    }

    /// A kept key is the key of the strategy's JSON: asked again, after other strategies, for
    /// a strategy `==` takes for a kept one whose JSON differs (−0.0 and 0.0), with another
    /// tail, and after more strategies than are kept.
    #[test]
    fn a_kept_content_key_is_the_key_of_the_strategys_json() {
        let mut strategies: Vec<Strategy> = super::super::presets::PRESETS.iter().filter(|p| p.id != "claude-code-env").map(|p| Strategy::preset(p.id).unwrap()).collect();
        let zero = Strategy { skill_listing_budget_fraction: 0.0, ..Strategy::default() };
        let negative_zero = Strategy { skill_listing_budget_fraction: -0.0, ..Strategy::default() };
        assert_eq!(zero, negative_zero, "== takes -0.0 for 0.0");
        assert_ne!(written(&zero, ""), written(&negative_zero, ""));
        strategies.extend([zero, negative_zero.clone(), negative_zero]);
        strategies.extend((0..CONTENT_KEYS_KEPT as u64 + 8).map(|n| Strategy { max_mcp_output_tokens: n, ..Strategy::default() }));
        for _ in 0..2 {
            for strategy in strategies.iter().chain(strategies.iter().rev()) {
                for tail in ["", "Thresholds { autocompact: 1 }"] {
                    assert_eq!(strategy.content_key(tail), written(strategy, tail), "{} under {tail:?}", strategy.name);
                }
            }
        }
    }

    /// [`Strategy::same_bits`] compares one number bit for bit: the only knob whose JSON is a
    /// number with a fraction. A new float knob must be compared so too.
    #[test]
    fn the_only_float_knob_is_the_skill_listing_budget() {
        fn floats(value: &serde_json::Value, path: &str, out: &mut Vec<String>) {
            match value {
                serde_json::Value::Number(n) if n.is_f64() => out.push(path.to_owned()),
                serde_json::Value::Array(items) => items.iter().for_each(|v| floats(v, path, out)),
                serde_json::Value::Object(map) => map.iter().for_each(|(k, v)| floats(v, &format!("{path}.{k}"), out)),
                _ => {}
            }
        }
        let mut found = Vec::new();
        floats(&serde_json::to_value(Strategy::default()).unwrap(), "", &mut found);
        assert_eq!(found, [".skill_listing_budget_fraction"]);
    }
}

fn truthy(value: &str) -> bool {
    matches!(value.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
}
