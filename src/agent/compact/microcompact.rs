//! Stage `microcompact` (§3): clearing old tool results, in one of three ways.
//!
//! 1. **Time-based** (tried first). *Trigger*: main thread, and at least `gap_threshold_minutes`
//!    since the last assistant message (the server cache has expired anyway). *Rewrites*: the
//!    content of every compactable tool result but the last `keep_recent` to
//!    `[Old tool result content cleared]`. *Invalidates*: the prefix from the first cleared block
//!    (it was cold already). Ours: a result not larger than the marker is left alone, so the stage
//!    never grows the context.
//! 2. **Cached** (`cache_edits`, a Strategy alternative). *Trigger*: more than
//!    `cached_trigger_threshold` registered, not yet deleted, already-sent compactable results.
//!    *Rewrites*: nothing locally; returns a `cache_edits` block deleting the oldest results by
//!    `cache_reference` down to `cached_keep_recent`. *Invalidates*: nothing: the server edits the
//!    cached prefix in place.
//! 3. **API context editing**: emits the body's `context_management` (`clear_tool_uses`,
//!    `clear_thinking`); the server applies it when the input passes the trigger (the cache
//!    simulator does: `measure::context_editing`). *Invalidates*: server-side, from the first
//!    block the server clears. The thinking-clear latch (>1h idle → keep one thinking turn) is
//!    kept here too ([`update_thinking_latch`]).
//!
//! *Preserves* in all paths: every tool_use and its tool_result block (only content changes).

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::api::{ContentBlock, MessageContent, ToolResultContent};
use crate::measure::context_editing::{CLEAR_THINKING, CLEAR_TOOL_USES, DEFAULT_KEEP_TOOL_USES};
use crate::measure::metrics::StageReport;

use super::chain::Stage;
use super::config::{CachedMicrocompactMode, CompactConfig};
use super::context::ChainContext;
use super::counting::{rough, rough_entries};

/// `TIME_BASED_MC_CLEARED_MESSAGE`.
pub const CLEARED_MARKER: &str = "[Old tool result content cleared]";

/// `CachedMCState`: which compactable results are known to the server cache and which were
/// deleted. Ordered containers only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CachedMicrocompactState {
    pub tool_order: Vec<String>,
    pub registered: BTreeSet<String>,
    pub sent: BTreeSet<String>,
    pub deleted: BTreeSet<String>,
}

impl CachedMicrocompactState {
    /// `markToolsSentToAPIState`: call after each successful response.
    pub fn mark_sent(&mut self) {
        self.sent.extend(self.registered.iter().cloned());
    }
}

pub struct Microcompact;

impl Stage for Microcompact {
    fn name(&self) -> &'static str {
        "microcompact"
    }

    fn enabled(&self, config: &CompactConfig) -> bool {
        let mc = &config.microcompact;
        mc.time_based_enabled
            || mc.cached != CachedMicrocompactMode::Off
            || config.context_editing.clear_tool_uses
            || config.context_editing.clear_thinking
    }

    fn run(&self, cx: &mut ChainContext<'_>) -> StageReport {
        let tokens_before = cx.rough_total();
        context_editing(cx, tokens_before);
        if let Some(report) = time_based(cx, tokens_before) {
            return report;
        }
        if let Some(report) = cached(cx, tokens_before) {
            return report;
        }
        StageReport {
            name: "microcompact".into(),
            fired: false,
            reason: "no trigger".into(),
            tokens_before,
            tokens_after: tokens_before,
            invalidated_from: None,
        }
    }
}

fn compactable_ids(cx: &ChainContext<'_>) -> Vec<String> {
    let tools = &cx.config.microcompact.compactable_tools;
    let mut ids = Vec::new();
    for entry in &cx.entries {
        for block in entry.blocks() {
            if let ContentBlock::ToolUse { id, name, .. } = block
                && tools.iter().any(|t| t == name) {
                    ids.push(id.clone());
                }
        }
    }
    ids
}

/// Time-based path; `None` when it does not fire.
pub fn time_based(cx: &mut ChainContext<'_>, tokens_before: u64) -> Option<StageReport> {
    let config = &cx.config.microcompact;
    if !config.time_based_enabled || !cx.source.is_main_thread() {
        return None;
    }
    let last = cx.entries.iter().rev().find(|e| e.is_assistant())?;
    let gap_minutes = cx.now_ms().saturating_sub(last.timestamp_ms) / 60_000;
    if gap_minutes < config.gap_threshold_minutes {
        return None;
    }
    let ids = compactable_ids(cx);
    let keep = config.keep_recent.max(1);
    let clear: BTreeSet<String> = ids[..ids.len().saturating_sub(keep)].iter().cloned().collect();
    let marker_tokens = rough(CLEARED_MARKER);
    let mut first: Option<(usize, usize)> = None;
    let mut cleared = 0usize;
    let mut saved = 0u64;
    for (i, entry) in cx.entries.iter_mut().enumerate() {
        let MessageContent::Blocks(blocks) = &mut entry.message_mut().content else { continue };
        for (b, block) in blocks.iter_mut().enumerate() {
            let ContentBlock::ToolResult { tool_use_id, content, .. } = block else { continue };
            if !clear.contains(tool_use_id) {
                continue;
            }
            let tokens = match content {
                Some(ToolResultContent::Text(t)) if t == CLEARED_MARKER => continue,
                Some(ToolResultContent::Text(t)) => rough(t),
                Some(ToolResultContent::Blocks(bs)) => bs.iter().map(super::counting::rough_block).sum(),
                None => 0,
            };
            if tokens <= marker_tokens {
                continue;
            }
            *content = Some(ToolResultContent::Text(CLEARED_MARKER.into()));
            saved += tokens - marker_tokens;
            cleared += 1;
            first.get_or_insert((i, b));
        }
    }
    if cleared == 0 || saved == 0 {
        return None;
    }
    // The time-based path resets cached-microcompact state: the cache it tracked is gone.
    cx.state.cached_microcompact = CachedMicrocompactState::default();
    cx.event("microcompact_cleared_tool_result");
    let invalidated_from = first.map(|(e, b)| cx.wire_path(e, Some(b)));
    Some(StageReport {
        name: "microcompact".into(),
        fired: true,
        reason: format!("time_based: {gap_minutes} min since last assistant, cleared {cleared} tool results").into(),
        tokens_before,
        tokens_after: rough_entries(&cx.entries),
        invalidated_from,
    })
}

/// Cached path through `cache_edits`; `None` when it does not fire.
pub fn cached(cx: &mut ChainContext<'_>, tokens_before: u64) -> Option<StageReport> {
    let config = &cx.config.microcompact;
    if config.cached != CachedMicrocompactMode::CacheEdits || !cx.source.is_main_thread() {
        return None;
    }
    let compactable: BTreeSet<String> = compactable_ids(cx).into_iter().collect();
    let state = &mut cx.state.cached_microcompact;
    for entry in &cx.entries {
        for id in entry.tool_result_ids() {
            if compactable.contains(id) && state.registered.insert(id.to_owned()) {
                state.tool_order.push(id.to_owned());
            }
        }
    }
    let active: Vec<&String> = state.tool_order.iter().filter(|id| !state.deleted.contains(*id)).collect();
    if active.len() <= config.cached_trigger_threshold {
        return None;
    }
    let deletable = active.len().saturating_sub(config.cached_keep_recent);
    let delete: Vec<String> =
        active.into_iter().take(deletable).filter(|id| state.sent.contains(*id)).cloned().collect();
    if delete.is_empty() {
        return None;
    }
    state.deleted.extend(delete.iter().cloned());
    let edits: Vec<Value> = delete.iter().map(|id| json!({"type": "delete", "cache_reference": id})).collect();
    cx.output.cache_edits = Some(json!({"type": "cache_edits", "edits": edits}));
    cx.output.cache_edits_deleted_tool_ids = delete.clone();
    cx.event("microcompact_cleared_tool_result");
    Some(StageReport {
        name: "microcompact".into(),
        fired: true,
        reason: format!("cache_edits: deleting {} tool results server-side", delete.len()).into(),
        tokens_before,
        tokens_after: tokens_before,
        invalidated_from: None,
    })
}

/// API-side context editing: the `context_management` body field. The server applies it (the
/// cache simulator does, in `measure::context_editing`); the chain only decides what to send.
pub fn context_editing(cx: &mut ChainContext<'_>, tokens: u64) {
    let config = &cx.config.context_editing;
    let mut edits = Vec::new();
    if config.clear_thinking {
        edits.push(clear_thinking_edit(config.clear_all_thinking || cx.state.thinking_clear_latched));
    }
    if config.clear_tool_uses {
        let mut edit = json!({
            "type": CLEAR_TOOL_USES,
            "trigger": {"type": "input_tokens", "value": config.trigger_input_tokens},
        });
        if config.keep_tool_uses != DEFAULT_KEEP_TOOL_USES {
            edit["keep"] = json!({"type": "tool_uses", "value": config.keep_tool_uses});
        }
        if config.clear_at_least {
            edit["clear_at_least"] = json!({"type": "input_tokens", "value": config.trigger_input_tokens.saturating_sub(config.target_input_tokens)});
        }
        if !config.clear_tool_inputs.is_empty() {
            edit["clear_tool_inputs"] = json!(config.clear_tool_inputs);
        }
        if !config.exclude_tools.is_empty() {
            edit["exclude_tools"] = json!(config.exclude_tools);
        }
        edits.push(edit);
    }
    if edits.is_empty() {
        return;
    }
    if config.clear_tool_uses && tokens >= config.trigger_input_tokens {
        cx.event("context_editing");
    }
    cx.output.context_management = Some(json!({"edits": edits}));
}

fn clear_thinking_edit(one_turn: bool) -> Value {
    let keep = if one_turn { json!({"type": "thinking_turns", "value": 1}) } else { json!("all") };
    json!({"type": CLEAR_THINKING, "keep": keep})
}

/// `thinkingClearLatched` (§8.6): set when the last API completion was more than
/// `thinking_latch_idle_minutes` ago (the 1h cache has expired anyway); from then on every
/// `clear_thinking` edit keeps only the last thinking turn, until the next compaction resets it.
/// Evaluated before each main-thread request, whether or not a stage runs.
pub fn update_thinking_latch(cx: &mut ChainContext<'_>) {
    if cx.state.thinking_clear_latched || !cx.source.is_main_thread() {
        return;
    }
    let Some(last) = cx.entries.iter().rev().find(|e| e.is_assistant() && !e.synthetic) else { return };
    let idle = cx.now_ms().saturating_sub(last.timestamp_ms);
    if idle > cx.config.context_editing.thinking_latch_idle_minutes * 60_000 {
        cx.state.thinking_clear_latched = true;
    }
}

/// The body's `context_management`: the session's own edits and the chain's, one per type (the
/// chain's win), `clear_thinking` first as the API requires. With the latch on, every
/// `clear_thinking` edit keeps one turn.
///
/// A request whose chain adds no edit, with the latch off, nearly always carries the session's
/// own value as the merge writes it (one `edits` key, `clear_thinking` first): that value is the
/// merge, given back as it is rather than taken apart and built again.
pub fn merge_context_management(session: Option<crate::api::SharedValue>, chain: Option<&Value>, latched: bool) -> Option<crate::api::SharedValue> {
    let chain_adds = chain.and_then(|v| v.get("edits")).and_then(Value::as_array).is_some_and(|edits| !edits.is_empty());
    if !latched && !chain_adds && session.as_deref().is_some_and(is_merged) {
        debug_assert_eq!(merged(session.as_deref(), chain, latched).as_ref(), session.as_deref(), "a value kept as merged differs from merging it");
        return session;
    }
    merged(session.as_deref(), chain, latched).map(Into::into)
}

/// Whether `value` is what [`merged`] writes of its own edits alone: an object with only a
/// non-empty `edits` list, `clear_thinking` edits first.
fn is_merged(value: &Value) -> bool {
    let Some(object) = value.as_object().filter(|object| object.len() == 1) else { return false };
    let Some(edits) = object.get("edits").and_then(Value::as_array).filter(|edits| !edits.is_empty()) else { return false };
    // (The merge's order key: a `clear_thinking` edit sorts before any other.)
    let later = |e: &Value| e.get("type").and_then(Value::as_str) != Some(CLEAR_THINKING);
    edits.windows(2).all(|pair| later(&pair[0]) <= later(&pair[1]))
}

/// [`merge_context_management`] taking every edit apart and writing the merge anew.
fn merged(session: Option<&Value>, chain: Option<&Value>, latched: bool) -> Option<Value> {
    let edits_of = |v: Option<&Value>| -> Vec<Value> { v.and_then(|v| v.get("edits")).and_then(Value::as_array).cloned().unwrap_or_default() };
    let mut edits = edits_of(session);
    for edit in edits_of(chain) {
        let kind = edit.get("type").cloned();
        edits.retain(|e| e.get("type") != kind.as_ref());
        edits.push(edit);
    }
    if edits.is_empty() {
        return None;
    }
    edits.sort_by_key(|e| e.get("type").and_then(Value::as_str) != Some(CLEAR_THINKING));
    if latched {
        for edit in edits.iter_mut().filter(|e| e.get("type").and_then(Value::as_str) == Some(CLEAR_THINKING)) {
            *edit = clear_thinking_edit(true);
        }
    }
    Some(json!({"edits": edits}))
}
