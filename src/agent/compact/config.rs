//! Every knob of the long-context chain, with Claude Code 2.1.88's defaults.
//!
//! Values marked "reference" are the client's constants or its remote-flag defaults
//! (layer-6-and-caching.md); values marked "ours" fill places the reference leaves open (snip's
//! rule, context collapse, cached microcompact's thresholds) and are documented in
//! ARCHITECTURE.md. Remote-flag features that default off in the client (aggregate tool result
//! budget, time-based microcompact, session memory) default off here too.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The whole configuration of the chain. Loadable from TOML or YAML; unknown fields are errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[derive(Default)]
pub struct CompactConfig {
    pub tool_result_budget: ToolResultBudgetConfig,
    pub snip: SnipConfig,
    pub microcompact: MicrocompactConfig,
    pub context_editing: ContextEditingConfig,
    pub context_collapse: ContextCollapseConfig,
    pub autocompact: AutocompactConfig,
    pub session_memory: SessionMemoryConfig,
    pub post_compact: PostCompactConfig,
    pub recovery: RecoveryConfig,
    /// Other agents' mechanisms (`peers.rs`); `strategy: none` keeps Claude Code's chain only.
    pub peer: super::peers::PeerConfig,
}


/// §2: per-tool persistence and the per-message aggregate budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolResultBudgetConfig {
    /// Per-tool persistence thresholds in chars.
    pub per_tool_chars: BTreeMap<String, u64>,
    /// Tools whose results are never persisted (reference: Read, which limits itself).
    pub never_persist_tools: Vec<String>,
    /// Threshold of tools not listed (reference: min(100,000 declared, 50,000)).
    pub default_chars: u64,
    /// Preview kept in the replacement (reference: 2,000).
    pub preview_chars: u64,
    /// Per-message aggregate budget (reference flag `tengu_hawthorn_steeple`, default off).
    pub aggregate_enabled: bool,
    /// Aggregate limit per wire message in chars (reference: 200,000).
    pub aggregate_chars: u64,
}

impl Default for ToolResultBudgetConfig {
    fn default() -> Self {
        let per_tool_chars = [("Bash", 30_000), ("PowerShell", 30_000), ("Grep", 20_000), ("McpAuth", 10_000)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        ToolResultBudgetConfig {
            per_tool_chars,
            never_persist_tools: vec!["Read".to_owned()],
            default_chars: 50_000,
            preview_chars: 2_000,
            aggregate_enabled: false,
            aggregate_chars: 200_000,
        }
    }
}

impl ToolResultBudgetConfig {
    /// The persistence threshold of a tool; `None` means never persist.
    pub fn threshold(&self, tool_name: &str) -> Option<u64> {
        if self.never_persist_tools.iter().any(|t| t == tool_name) {
            return None;
        }
        Some(self.per_tool_chars.get(tool_name).copied().unwrap_or(self.default_chars))
    }
}

/// §4.1 snip (the reference's module is absent; the rule is ours).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SnipConfig {
    /// Ant-only feature in the reference: off.
    pub enabled: bool,
    /// Snip when the context reaches this percent of the effective window.
    pub trigger_pct: u64,
    /// Drop oldest API rounds until the context is at or below this percent.
    pub target_pct: u64,
    /// Never drop the most recent N API rounds.
    pub keep_recent_groups: usize,
}

impl Default for SnipConfig {
    fn default() -> Self {
        SnipConfig { enabled: false, trigger_pct: 85, target_pct: 60, keep_recent_groups: 4 }
    }
}

/// Which microcompact path runs after the time-based one (a Strategy choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CachedMicrocompactMode {
    Off,
    CacheEdits,
}

/// §3: microcompact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MicrocompactConfig {
    /// Time-based path (reference flag `tengu_slate_heron`: enabled false, 60 min, keep 5).
    pub time_based_enabled: bool,
    pub gap_threshold_minutes: u64,
    pub keep_recent: usize,
    /// Cached microcompact through `cache_edits` (ant-only in the reference).
    pub cached: CachedMicrocompactMode,
    /// Ours (counts of tool results, as the reference's comment says; numbers not in the tree).
    pub cached_trigger_threshold: usize,
    pub cached_keep_recent: usize,
    /// Tools whose results may be cleared (reference `COMPACTABLE_TOOLS`).
    pub compactable_tools: Vec<String>,
}

impl Default for MicrocompactConfig {
    fn default() -> Self {
        MicrocompactConfig {
            time_based_enabled: false,
            gap_threshold_minutes: 60,
            keep_recent: 5,
            cached: CachedMicrocompactMode::Off,
            cached_trigger_threshold: 10,
            cached_keep_recent: 5,
            compactable_tools: ["Read", "Bash", "PowerShell", "Grep", "Glob", "WebSearch", "WebFetch", "Edit", "Write"]
                .into_iter()
                .map(str::to_owned)
                .collect(),
        }
    }
}

/// §3.5: API-side context editing, sent as `context_management`; the cache simulator applies
/// it server-side (`measure::context_editing`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContextEditingConfig {
    pub clear_tool_uses: bool,
    pub clear_thinking: bool,
    /// `clear_thinking` keeps only the last thinking turn instead of all (the >1h-idle latch,
    /// always on).
    pub clear_all_thinking: bool,
    /// `thinkingClearLatched`: after this many minutes since the last API completion the client
    /// switches `clear_thinking` to keep one turn, until the next compaction (`CACHE_TTL_1HOUR_MS`).
    pub thinking_latch_idle_minutes: u64,
    pub trigger_input_tokens: u64,
    /// `clear_at_least` = trigger − target (the client's `API_TARGET_INPUT_TOKENS`).
    pub target_input_tokens: u64,
    /// Send `clear_at_least` at all (the API default is none).
    pub clear_at_least: bool,
    /// `keep` in tool uses; the API default (3) is not sent.
    pub keep_tool_uses: u64,
    pub clear_tool_inputs: Vec<String>,
    pub exclude_tools: Vec<String>,
}

impl Default for ContextEditingConfig {
    fn default() -> Self {
        ContextEditingConfig {
            clear_tool_uses: false,
            clear_thinking: false,
            clear_all_thinking: false,
            thinking_latch_idle_minutes: 60,
            trigger_input_tokens: 180_000,
            target_input_tokens: 40_000,
            clear_at_least: true,
            keep_tool_uses: 3,
            clear_tool_inputs: ["Bash", "PowerShell", "Glob", "Grep", "Read", "WebFetch", "WebSearch"]
                .into_iter()
                .map(str::to_owned)
                .collect(),
            exclude_tools: ["Edit", "Write", "NotebookEdit"].into_iter().map(str::to_owned).collect(),
        }
    }
}

/// §4.2 context collapse (module absent in the reference; internals ours).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContextCollapseConfig {
    pub enabled: bool,
    /// Start committing collapses at this percent of the effective window.
    pub commit_pct: u64,
    /// Block (the request would not be sent) at this percent.
    pub block_pct: u64,
    /// Commit oldest spans until at or below this percent.
    pub target_pct: u64,
    /// Never collapse the most recent N API rounds.
    pub keep_recent_groups: usize,
    /// Size of a collapse summary in tokens.
    pub summary_tokens: u64,
}

impl Default for ContextCollapseConfig {
    fn default() -> Self {
        ContextCollapseConfig {
            enabled: false,
            commit_pct: 90,
            block_pct: 95,
            target_pct: 75,
            keep_recent_groups: 4,
            summary_tokens: 300,
        }
    }
}

/// §5.1–5.3 autocompact and the blocking limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutocompactConfig {
    pub enabled: bool,
    /// `DISABLE_COMPACT`: no compaction of any kind (manual included).
    pub compact_disabled: bool,
    pub buffer_tokens: u64,
    pub warning_buffer_tokens: u64,
    pub error_buffer_tokens: u64,
    pub blocking_buffer_tokens: u64,
    /// The output reserve of the effective window (`window − min(max output, reserve)`);
    /// `None`: the client's own, [`DEFAULT_OUTPUT_RESERVE`] for the agent (2.1.88) and the
    /// recorded version's for a replayed session (32,000 before 2.1.37).
    pub max_output_reserve_tokens: Option<u64>,
    /// `CLAUDE_AUTOCOMPACT_PCT_OVERRIDE` (0 < p ≤ 100).
    pub pct_override: Option<u64>,
    /// `CLAUDE_CODE_AUTO_COMPACT_WINDOW` cap on the context window.
    pub window_override: Option<u64>,
    /// The window the client runs the model with (1,000,000 for a `[1m]` model); `None`: the
    /// scenario's, or for a replayed session the one its record shows.
    pub context_window: Option<u64>,
    /// `CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE`.
    pub blocking_limit_override: Option<u64>,
    pub max_consecutive_failures: u32,
    /// Reactive compact on prompt-too-long (ant-only module in the reference; on here since the
    /// recovery ladder is part of the simulation).
    pub reactive_enabled: bool,
    /// Size of a synthetic summary when the model is not scripted for the `compact` lane.
    pub synthetic_summary_tokens: u64,
    /// PTL retries of the summary request (reference `MAX_PTL_RETRIES`).
    pub max_ptl_retries: u32,
    /// What becomes of the newest API rounds reactive compaction peeled off before summarizing
    /// (ours; the reference is silent): `drop` (default: they are what overflowed the window,
    /// and a full compaction keeps no messages) or `keep` (re-appended verbatim after the
    /// summary, like preserved messages).
    pub reactive_peeled_tail: PeeledTail,
}

/// The output reserve of Claude Code 2.1.88 (reference `MAX_OUTPUT_TOKENS_FOR_SUMMARY`).
pub const DEFAULT_OUTPUT_RESERVE: u64 = 20_000;

impl AutocompactConfig {
    /// The output reserve in force: the one set, else `client_default`.
    pub fn output_reserve(&self, client_default: u64) -> u64 {
        self.max_output_reserve_tokens.unwrap_or(client_default)
    }

    /// The autocompact part of [`CompactConfig::apply_env`] (no other knob reads these).
    pub fn apply_env(&mut self, env: &BTreeMap<String, String>) {
        if let Some(pct) = env_positive(env, "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE").filter(|p| *p <= 100.0) {
            self.pct_override = Some(pct as u64);
        }
        if let Some(window) = env_positive(env, "CLAUDE_CODE_AUTO_COMPACT_WINDOW") {
            self.window_override = Some(window as u64);
        }
        if let Some(limit) = env_positive(env, "CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE") {
            self.blocking_limit_override = Some(limit as u64);
        }
        if env_truthy(env, "DISABLE_AUTO_COMPACT") {
            self.enabled = false;
        }
        if env_truthy(env, "CTXSIM_REACTIVE_COMPACT") {
            self.reactive_enabled = true;
        }
        if env_truthy(env, "DISABLE_COMPACT") {
            self.enabled = false;
            self.compact_disabled = true;
        }
    }
}

/// See [`AutocompactConfig::reactive_peeled_tail`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeeledTail {
    #[default]
    Drop,
    Keep,
}

impl Default for AutocompactConfig {
    fn default() -> Self {
        AutocompactConfig {
            enabled: true,
            compact_disabled: false,
            buffer_tokens: 13_000,
            warning_buffer_tokens: 20_000,
            error_buffer_tokens: 20_000,
            blocking_buffer_tokens: 3_000,
            max_output_reserve_tokens: None,
            pct_override: None,
            window_override: None,
            context_window: None,
            blocking_limit_override: None,
            max_consecutive_failures: 3,
            reactive_enabled: false,
            synthetic_summary_tokens: 2_000,
            max_ptl_retries: 3,
            reactive_peeled_tail: PeeledTail::Drop,
        }
    }
}

/// §6 and §5.8 session memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionMemoryConfig {
    /// Extraction (reference flag `tengu_session_memory`, default off).
    pub enabled: bool,
    /// Session-memory compaction (reference flags `tengu_session_memory` + `tengu_sm_compact`).
    pub compact_enabled: bool,
    pub init_tokens: u64,
    pub tokens_between_updates: u64,
    pub tool_calls_between_updates: usize,
    pub compact_min_tokens: u64,
    pub compact_max_tokens: u64,
    pub compact_min_text_messages: usize,
    /// Per-section cap when the memory becomes a summary (2,000 tokens × 4 chars).
    pub section_max_chars: usize,
}

impl Default for SessionMemoryConfig {
    fn default() -> Self {
        SessionMemoryConfig {
            enabled: false,
            compact_enabled: false,
            init_tokens: 10_000,
            tokens_between_updates: 5_000,
            tool_calls_between_updates: 3,
            compact_min_tokens: 10_000,
            compact_max_tokens: 40_000,
            compact_min_text_messages: 5,
            section_max_chars: 8_000,
        }
    }
}

/// §5.10 post-compact restoration budgets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostCompactConfig {
    pub max_files: usize,
    pub max_tokens_per_file: u64,
    pub files_token_budget: u64,
    pub max_tokens_per_skill: u64,
    pub skills_token_budget: u64,
}

impl Default for PostCompactConfig {
    fn default() -> Self {
        PostCompactConfig {
            max_files: 5,
            max_tokens_per_file: 5_000,
            files_token_budget: 50_000,
            max_tokens_per_skill: 5_000,
            skills_token_budget: 25_000,
        }
    }
}

/// §1.4 recovery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecoveryConfig {
    pub max_output_tokens_recovery_limit: u32,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig { max_output_tokens_recovery_limit: 3 }
    }
}

impl CompactConfig {
    /// Applies the client's environment variables. Invalid values are ignored, as the client does.
    pub fn apply_env(&mut self, env: &BTreeMap<String, String>) {
        let positive = |key: &str| env_positive(env, key);
        let truthy = |key: &str| env_truthy(env, key);
        self.autocompact.apply_env(env);
        // The reference's own switches for features behind remote flags.
        if truthy("ENABLE_CLAUDE_CODE_SM_COMPACT") {
            self.session_memory.enabled = true;
            self.session_memory.compact_enabled = true;
        }
        if truthy("DISABLE_CLAUDE_CODE_SM_COMPACT") {
            self.session_memory.compact_enabled = false;
        }
        if truthy("CLAUDE_CONTEXT_COLLAPSE") {
            self.context_collapse.enabled = true;
        }
        // Ours: remote-flag features a scenario can turn on (`CTXSIM_*`, never read by the client).
        if truthy("CTXSIM_TOOL_RESULT_BUDGET") {
            self.tool_result_budget.aggregate_enabled = true;
        }
        if truthy("CTXSIM_TIME_MICROCOMPACT") {
            self.microcompact.time_based_enabled = true;
        }
        if truthy("CTXSIM_CACHED_MICROCOMPACT") {
            self.microcompact.cached = CachedMicrocompactMode::CacheEdits;
        }
        if truthy("CTXSIM_SESSION_MEMORY") {
            self.session_memory.enabled = true;
        }
        // The client's own (ant-only) switches for API tool clearing (§3.5): the results strategy
        // clears these tools' inputs too, the uses strategy excludes the editing tools; with both
        // set we send one edit carrying both lists.
        let results = truthy("USE_API_CLEAR_TOOL_RESULTS");
        let uses = truthy("USE_API_CLEAR_TOOL_USES");
        if results || uses {
            self.context_editing.clear_tool_uses = true;
            if !results {
                self.context_editing.clear_tool_inputs.clear();
            }
            if !uses {
                self.context_editing.exclude_tools.clear();
            }
        }
        if let Some(max) = positive("API_MAX_INPUT_TOKENS") {
            self.context_editing.trigger_input_tokens = max as u64;
        }
        if let Some(target) = positive("API_TARGET_INPUT_TOKENS") {
            self.context_editing.target_input_tokens = target as u64;
        }
    }
}

/// A positive number `env` sets `key` to.
fn env_positive(env: &BTreeMap<String, String>, key: &str) -> Option<f64> {
    env.get(key).and_then(|v| v.trim().parse::<f64>().ok()).filter(|v| *v > 0.0)
}

/// Whether `env` turns `key` on.
fn env_truthy(env: &BTreeMap<String, String>, key: &str) -> bool {
    env.get(key).is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}
