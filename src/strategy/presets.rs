//! Named presets: each a set of knob values over the one [`Strategy`], with a note saying where
//! its values come from. `ctxsim strategies` lists them with every knob.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::agent::compact::peers::PeerStrategy;

use super::knobs::{McpInstructionsMode, Strategy, StrategyError, TtlSetting};

/// One preset: its id, the old names that still resolve to it, and its source note.
#[derive(Debug, Clone, Copy)]
pub struct Preset {
    pub id: &'static str,
    pub aliases: &'static [&'static str],
    pub source: &'static str,
}

/// Every preset, in listing order.
pub const PRESETS: &[Preset] = &[
    Preset { id: "claude-code", aliases: &["claude-code-2.1.88", "default"], source: "Claude Code 2.1.88's constants and remote-flag defaults (reference/layer-6-and-caching.md)" },
    Preset { id: "claude-code-no-boundary", aliases: &["no-boundary"], source: "claude-code without __SYSTEM_PROMPT_DYNAMIC_BOUNDARY__ (third-party providers, or global cache scope off)" },
    Preset { id: "claude-code-mcp-in-system", aliases: &["mcp-in-system"], source: "claude-code with MCP instructions in the uncached system section (the external default)" },
    Preset { id: "claude-code-mcp-delta", aliases: &["mcp-delta"], source: "claude-code with CLAUDE_CODE_MCP_INSTR_DELTA: MCP instructions as mcp_instructions_delta attachments" },
    Preset { id: "claude-code-eager-tools", aliases: &["eager-tools"], source: "claude-code with ENABLE_TOOL_SEARCH=false: every tool schema sent up front" },
    Preset { id: "claude-code-no-microcompact", aliases: &[], source: "claude-code with time-based and cached microcompact off (flag tengu_slate_heron off)" },
    Preset { id: "claude-code-no-session-memory", aliases: &[], source: "claude-code with session memory extraction and SM compaction off (flags tengu_session_memory, tengu_sm_compact off)" },
    Preset { id: "claude-code-summary-only", aliases: &[], source: "claude-code with only full summary compaction: no SM compaction, microcompact, snip or collapse" },
    Preset { id: "claude-code-1h", aliases: &["one-hour"], source: "claude-code with a 1h TTL on the main lane (promptCacheTtl / subscriber 1h cache)" },
    Preset { id: "claude-code-env", aliases: &[], source: "claude-code with the compaction env vars of the process applied (CLAUDE_AUTOCOMPACT_PCT_OVERRIDE, CLAUDE_CODE_AUTO_COMPACT_WINDOW, DISABLE_AUTO_COMPACT, ...)" },
    Preset { id: "codex", aliases: &[], source: "openai/codex@codex-rs/core/src/compact.rs: auto_compact_token_limit = window*9/10; build_compacted_history = initial context + last 20k tokens of user messages + summary" },
    Preset { id: "opencode", aliases: &[], source: "sst/opencode@packages/opencode/src/session/compaction.ts: prune (PRUNE_PROTECT 40k, PRUNE_MINIMUM 20k), overflow.ts COMPACTION_BUFFER 20k, summary + recent tail (≤15k)" },
    Preset { id: "observation-masking", aliases: &[], source: "SWE-agent history_processors.py last_n_observations; 'The Complexity Trap' (arXiv 2508.21433): all but the last 5 tool results masked" },
    Preset { id: "context-editing", aliases: &[], source: "Anthropic API context editing clear_tool_uses_20250919 with the documented defaults: trigger 100k input tokens, keep 3 tool uses, no clear_at_least, inputs kept; applied server-side by the cache simulator" },
    Preset { id: "server-compaction", aliases: &[], source: "Anthropic API server-side compaction (compact_20260112 edit): trigger 150k input tokens; history replaced by the compaction block" },
    Preset { id: "cline", aliases: &[], source: "cline/cline@src/core/context/context-management: at max(window − 40k, 0.8·window) drop half of the pairs after the first" },
];

/// The preset an id or alias names.
pub fn find(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.id == name || p.aliases.contains(&name))
}

/// Builds a preset by id or alias; `env` is read by `claude-code-env` only.
pub fn build(name: &str, env: &BTreeMap<String, String>) -> Result<Strategy, StrategyError> {
    let preset = find(name).ok_or_else(|| StrategyError::UnknownPreset(name.to_owned()))?;
    let mut s = Strategy { name: preset.id.to_owned(), ..Strategy::default() };
    let c = &mut s.compact;
    match preset.id {
        "claude-code" => {}
        "claude-code-no-boundary" => s.dynamic_boundary = false,
        "claude-code-mcp-in-system" => s.mcp_instructions = McpInstructionsMode::System,
        "claude-code-mcp-delta" => s.mcp_instructions = McpInstructionsMode::Delta,
        "claude-code-eager-tools" => s.enable_tool_search = Some("false".into()),
        "claude-code-no-microcompact" => {
            c.microcompact.time_based_enabled = false;
            c.microcompact.cached = crate::agent::compact::config::CachedMicrocompactMode::Off;
            // Replays honour this by keeping the results the recording's microcompacts cleared.
            s.replay_recorded_microcompact = false;
        }
        "claude-code-no-session-memory" => {
            c.session_memory.enabled = false;
            c.session_memory.compact_enabled = false;
        }
        "claude-code-summary-only" => {
            c.session_memory.enabled = false;
            c.session_memory.compact_enabled = false;
            c.microcompact.time_based_enabled = false;
            c.microcompact.cached = crate::agent::compact::config::CachedMicrocompactMode::Off;
            s.replay_recorded_microcompact = false;
            c.snip.enabled = false;
            c.context_collapse.enabled = false;
        }
        "claude-code-1h" => s.ttl_main = TtlSetting::OneHour,
        "claude-code-env" => s.apply_env(env)?,
        "codex" => {
            c.autocompact.enabled = false;
            c.peer.strategy = PeerStrategy::Codex;
            c.peer.trigger_pct = 90;
            c.peer.user_message_max_tokens = 20_000;
        }
        "opencode" => {
            c.autocompact.enabled = false;
            c.peer.strategy = PeerStrategy::Opencode;
            c.peer.protect_tokens = 40_000;
            c.peer.minimum_tokens = 20_000;
            c.peer.buffer_tokens = 20_000;
            c.peer.tail_tokens = 15_000;
        }
        "observation-masking" => {
            c.autocompact.enabled = false;
            c.peer.strategy = PeerStrategy::ObservationMasking;
            c.peer.keep_recent = 5;
        }
        "context-editing" => {
            let e = &mut c.context_editing;
            e.clear_tool_uses = true;
            e.trigger_input_tokens = crate::measure::context_editing::DEFAULT_TRIGGER_INPUT_TOKENS;
            e.keep_tool_uses = crate::measure::context_editing::DEFAULT_KEEP_TOOL_USES;
            e.clear_at_least = false;
            e.clear_tool_inputs.clear();
            e.exclude_tools.clear();
            // Replays approximate the server's clearing client-side with the same keep.
            c.peer.keep_recent = 3;
        }
        "server-compaction" => {
            c.autocompact.enabled = false;
            c.peer.strategy = PeerStrategy::ServerCompaction;
            c.peer.server_trigger_tokens = 150_000;
        }
        "cline" => {
            c.autocompact.enabled = false;
            c.peer.strategy = PeerStrategy::Cline;
            c.peer.buffer_tokens = 40_000;
        }
        other => unreachable!("preset {other} listed without a body"),
    }
    Ok(s)
}

/// Every knob as `(dotted key, JSON value)`, in the struct's order (maps and lists are leaves).
pub fn flatten_knobs(strategy: &Strategy) -> Vec<(String, Value)> {
    let value = serde_json::to_value(strategy).expect("strategies serialize");
    let mut out = Vec::new();
    walk("", &value, &mut out);
    out.retain(|(k, _)| k != "name");
    out
}

fn walk(prefix: &str, value: &Value, out: &mut Vec<(String, Value)>) {
    match value {
        // Structs are tables; the per-tool maps of thresholds are leaves (their keys are data).
        Value::Object(map) if !prefix.ends_with("per_tool_chars") => {
            for (k, v) in map {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                walk(&key, v, out);
            }
        }
        _ => out.push((prefix.to_owned(), value.clone())),
    }
}

/// One row of `ctxsim strategies`: a knob, its default, and the presets that change it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KnobRow {
    pub key: String,
    pub default: Value,
    /// `(preset id, value)` where the preset differs from the default, in preset order.
    pub presets: Vec<(String, Value)>,
}

/// Every knob with its default and each preset's differing value.
pub fn knob_table(env: &BTreeMap<String, String>) -> Vec<KnobRow> {
    let defaults = flatten_knobs(&Strategy::default());
    let presets: Vec<(String, BTreeMap<String, Value>)> = PRESETS
        .iter()
        .map(|p| {
            let s = build(p.id, env).unwrap_or_default();
            (p.id.to_owned(), flatten_knobs(&s).into_iter().collect())
        })
        .collect();
    defaults
        .into_iter()
        .map(|(key, default)| {
            let differing = presets
                .iter()
                .filter_map(|(id, knobs)| knobs.get(&key).filter(|v| **v != default).map(|v| (id.clone(), v.clone())))
                .collect();
            KnobRow { key, default, presets: differing }
        })
        .collect()
}
