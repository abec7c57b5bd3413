//! API context editing, applied the way the provider applies it: server-side, to the request
//! body, before the prompt reaches the model and before the prompt cache is consulted.
//!
//! The body field `context_management.edits` (beta `context-management-2025-06-27`) lists
//! strategies; the documentation of the Messages API gives these facts:
//!
//! - `clear_tool_uses_20250919`: once the prompt exceeds `trigger` (default 100,000
//!   `input_tokens`; `tool_uses` counts are accepted too), the oldest tool results are cleared in
//!   chronological order and replaced by placeholder text, keeping the most recent `keep`
//!   tool uses (default 3, `{type: tool_uses, value: N}`). `exclude_tools` are never cleared.
//!   `clear_tool_inputs` (`true`, or a list of tool names) also clears the tool_use parameters.
//!   `clear_at_least` (default none): when that many tokens cannot be cleared, the strategy is
//!   not applied at all.
//! - `clear_thinking_20251015`: keeps the thinking blocks of the last `keep` assistant turns
//!   that have thinking (`{type: thinking_turns, value: N}`, N > 0, default 1), or all of them
//!   (`"all"`); older ones are removed. With several edits it must be listed first (else 400).
//! - The client keeps its full history; the edit happens on every request anew.
//! - Caching: clearing rewrites earlier blocks, so the cached prefix is valid only up to the
//!   first cleared block; what follows is written again (tool result clearing "invalidates
//!   cached prompt prefixes", thinking clearing invalidates "where the clearing happens").
//! - The response reports `context_management.applied_edits`: per applied edit its `type`,
//!   `cleared_tool_uses` or `cleared_thinking_turns`, and `cleared_input_tokens`.
//!
//! Ours, where the documentation is silent (said here and in ARCHITECTURE.md):
//!
//! - The server is stateless: each request is edited from its own body, so once the trigger is
//!   passed every later request clears again, and each new tool use pushes one more pair out of
//!   `keep` (the cache then breaks just before it).
//! - The trigger compares the prompt's tokens as the earlier edits of the list left them,
//!   strictly greater than the value (`exceeds`).
//! - `keep` counts the tool uses that may be cleared (excluded tools are not counted).
//! - A cleared result's content becomes [`CLEARED_TOOL_RESULT`] (our wording; the docs only say
//!   "placeholder text"); a cleared input becomes `{}`. Content no larger than its replacement
//!   is left as it is, so clearing never grows the prompt; `cleared_tool_uses` counts the pairs
//!   actually changed and `cleared_input_tokens` the tokens that left the prompt.
//! - An assistant turn (for `thinking_turns`) is the assistant messages between two user
//!   messages that do not start with a tool_result: a tool loop is one turn.
//! - Edit types the simulator does not model (server compaction `compact_*`) are left alone.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::api::{ContentBlock, Message, MessageContent, Request, Role, ToolResultContent};

/// What a cleared tool result says instead of its content (ours).
pub const CLEARED_TOOL_RESULT: &str = "[This tool result was cleared by context editing to save space.]";

pub const CLEAR_TOOL_USES: &str = "clear_tool_uses_20250919";
pub const CLEAR_THINKING: &str = "clear_thinking_20251015";

/// The documented defaults of `clear_tool_uses_20250919`.
pub const DEFAULT_TRIGGER_INPUT_TOKENS: u64 = 100_000;
pub const DEFAULT_KEEP_TOOL_USES: u64 = 3;

/// One parsed edit of `context_management.edits`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    ClearThinking { keep: ThinkingKeep },
    ClearToolUses { trigger: Trigger, keep: u64, clear_at_least: Option<u64>, exclude_tools: Vec<String>, clear_inputs: ClearInputs },
    /// A type the simulator does not model; left alone.
    Unmodelled(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingKeep {
    All,
    Turns(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    InputTokens(u64),
    ToolUses(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClearInputs {
    None,
    All,
    Tools(Vec<String>),
}

impl ClearInputs {
    fn covers(&self, tool: &str) -> bool {
        match self {
            ClearInputs::None => false,
            ClearInputs::All => true,
            ClearInputs::Tools(names) => names.iter().any(|n| n == tool),
        }
    }
}

/// One entry of the response's `context_management.applied_edits`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedEdit {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared_tool_uses: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared_thinking_turns: Option<u64>,
    pub cleared_input_tokens: u64,
}

/// The response's `context_management` object, plus (ours, for information-loss metrics) the
/// ids of the tool uses whose results the server cleared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextManagementResponse {
    pub applied_edits: Vec<AppliedEdit>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cleared_tool_use_ids: Vec<String>,
}

/// A request as the server edited it.
#[derive(Debug, Clone, PartialEq)]
pub struct Edited {
    pub body: Request,
    pub response: ContextManagementResponse,
    /// What was cleared, by stable key (`tool_use:<id>`, `thinking:<hash>`), with the tokens
    /// clearing it freed.
    pub cleared: BTreeMap<String, u64>,
    /// Positions of the edited body (message index, content index) where the edited content
    /// starts: a cleared result or input, or the block that followed a removed thinking block.
    pub edited_at: BTreeSet<(usize, usize)>,
    /// The cause each edited position is attributed to, by position.
    pub causes: BTreeMap<(usize, usize), &'static str>,
    /// The cleared key (as in `cleared`) each edited position belongs to.
    pub keys: BTreeMap<(usize, usize), String>,
}

fn field<'a>(edit: &'a Value, i: usize, name: &str) -> (Option<&'a Value>, String) {
    (edit.get(name), format!("context_management.edits[{i}].{name}"))
}

/// `{type: <kind>, value: N}` with N a positive integer.
fn typed_value(value: &Value, path: &str, kinds: &[&str]) -> Result<(String, u64), String> {
    let kind = value.get("type").and_then(Value::as_str).ok_or_else(|| format!("{path}.type: expected one of {}", kinds.join(", ")))?;
    if !kinds.contains(&kind) {
        return Err(format!("{path}.type: `{kind}` is not one of {}", kinds.join(", ")));
    }
    let n = value.get("value").and_then(Value::as_u64).ok_or_else(|| format!("{path}.value: expected a non-negative integer"))?;
    Ok((kind.to_owned(), n))
}

fn names(value: Option<&Value>, path: &str) -> Result<Vec<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_str().map(str::to_owned).ok_or_else(|| format!("{path}[{i}]: expected a tool name")))
            .collect(),
        Some(_) => Err(format!("{path}: expected a list of tool names")),
    }
}

/// Reads `context_management` as the API validates it; an error is the API's 400, naming the
/// field.
pub fn parse(value: &Value) -> Result<Vec<Edit>, String> {
    let edits = match value.get("edits") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(edits)) => edits,
        Some(_) => return Err("context_management.edits: expected a list".to_owned()),
    };
    let mut out = Vec::with_capacity(edits.len());
    for (i, edit) in edits.iter().enumerate() {
        let kind = edit.get("type").and_then(Value::as_str).ok_or_else(|| format!("context_management.edits[{i}].type: missing"))?;
        match kind {
            CLEAR_THINKING => {
                if i > 0 {
                    return Err(format!("context_management.edits[{i}]: {CLEAR_THINKING} must be listed first in edits"));
                }
                let (keep, path) = field(edit, i, "keep");
                let keep = match keep {
                    None | Some(Value::Null) => ThinkingKeep::Turns(1),
                    Some(Value::String(s)) if s == "all" => ThinkingKeep::All,
                    Some(v) => match typed_value(v, &path, &["thinking_turns"])? {
                        (_, 0) => return Err(format!("{path}.value: must be greater than 0")),
                        (_, n) => ThinkingKeep::Turns(n),
                    },
                };
                out.push(Edit::ClearThinking { keep });
            }
            CLEAR_TOOL_USES => {
                let (trigger, path) = field(edit, i, "trigger");
                let trigger = match trigger {
                    None | Some(Value::Null) => Trigger::InputTokens(DEFAULT_TRIGGER_INPUT_TOKENS),
                    Some(v) => match typed_value(v, &path, &["input_tokens", "tool_uses"])? {
                        (k, n) if k == "tool_uses" => Trigger::ToolUses(n),
                        (_, n) => Trigger::InputTokens(n),
                    },
                };
                let (keep, path) = field(edit, i, "keep");
                let keep = match keep {
                    None | Some(Value::Null) => DEFAULT_KEEP_TOOL_USES,
                    Some(v) => typed_value(v, &path, &["tool_uses"])?.1,
                };
                let (at_least, path) = field(edit, i, "clear_at_least");
                let clear_at_least = match at_least {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(typed_value(v, &path, &["input_tokens"])?.1),
                };
                let (excluded, path) = field(edit, i, "exclude_tools");
                let exclude_tools = names(excluded, &path)?;
                let (inputs, path) = field(edit, i, "clear_tool_inputs");
                let clear_inputs = match inputs {
                    None | Some(Value::Null) | Some(Value::Bool(false)) => ClearInputs::None,
                    Some(Value::Bool(true)) => ClearInputs::All,
                    Some(v @ Value::Array(_)) => ClearInputs::Tools(names(Some(v), &path)?),
                    Some(_) => return Err(format!("{path}: expected true, false or a list of tool names")),
                };
                out.push(Edit::ClearToolUses { trigger, keep, clear_at_least, exclude_tools, clear_inputs });
            }
            other => out.push(Edit::Unmodelled(other.to_owned())),
        }
    }
    Ok(out)
}

/// Whether any edit could change the body (cheap pre-check: `keep: "all"` and unmodelled edits
/// never do; a tool-use trigger below its threshold is checked later, on the token count).
pub fn may_edit(edits: &[Edit]) -> bool {
    edits.iter().any(|e| match e {
        Edit::ClearThinking { keep } => *keep != ThinkingKeep::All,
        Edit::ClearToolUses { .. } => true,
        Edit::Unmodelled(_) => false,
    })
}

// Blocks may be held typed or, where the client keeps its own key order, as raw JSON
// (`ContentBlock::Other`); both forms are read and edited alike.

fn wire_str<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// The `tool_use_id` of a tool_result block.
fn result_id(block: &ContentBlock) -> Option<&str> {
    match block {
        ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id),
        ContentBlock::Other(v) if wire_str(v, "type") == Some("tool_result") => wire_str(v, "tool_use_id"),
        _ => None,
    }
}

/// `(id, name)` of a tool_use block.
fn tool_use(block: &ContentBlock) -> Option<(&str, &str)> {
    match block {
        ContentBlock::ToolUse { id, name, .. } => Some((id, name)),
        ContentBlock::Other(v) if wire_str(v, "type") == Some("tool_use") => Some((wire_str(v, "id")?, wire_str(v, "name")?)),
        _ => None,
    }
}

fn is_thinking(block: &ContentBlock) -> bool {
    block.is_thinking() || matches!(block, ContentBlock::Other(v) if matches!(wire_str(v, "type"), Some("thinking" | "redacted_thinking")))
}

/// Replaces a tool_result's content with the placeholder, or a tool_use's input with `{}`.
fn clear_block(block: &mut ContentBlock) {
    match block {
        ContentBlock::ToolResult { content, .. } => *content = Some(ToolResultContent::Text(CLEARED_TOOL_RESULT.to_owned())),
        ContentBlock::ToolUse { input, .. } => *input = json!({}),
        ContentBlock::Other(Value::Object(map)) => match map.get("type").and_then(Value::as_str) {
            Some("tool_result") => {
                map.insert("content".to_owned(), json!(CLEARED_TOOL_RESULT));
            }
            Some("tool_use") => {
                map.insert("input".to_owned(), json!({}));
            }
            _ => {}
        },
        _ => {}
    }
}

/// A key for a thinking block that survives later appends (its text, hashed).
fn thinking_key(block: &ContentBlock) -> String {
    let text = match block {
        ContentBlock::Thinking { thinking, .. } => thinking.as_str(),
        ContentBlock::RedactedThinking { data, .. } => data.as_str(),
        ContentBlock::Other(v) => wire_str(v, "thinking").or_else(|| wire_str(v, "data")).unwrap_or(""),
        _ => "",
    };
    format!("thinking:{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
}

/// Assistant turn number of each message (user messages get the turn they open or continue).
fn turns(messages: &[Message]) -> Vec<usize> {
    let mut turn = 0usize;
    let mut out = Vec::with_capacity(messages.len());
    for message in messages {
        if message.role == Role::User {
            let continues_loop = matches!(&message.content, MessageContent::Blocks(b) if b.first().and_then(result_id).is_some());
            if !continues_loop {
                turn += 1;
            }
        }
        out.push(turn);
    }
    out
}

/// Applies the edits to `request`. `total_tokens` is the prompt's size as sent; `count` gives the
/// tokens of one content block (the measurer's estimator, memoized). `None` when nothing changed.
pub fn apply(request: &Request, edits: &[Edit], total_tokens: u64, count: &mut dyn FnMut(Role, &ContentBlock) -> u64) -> Option<Edited> {
    apply_memo(request, edits, total_tokens, count, &mut ClearMemo::default(), "")
}

/// What the tool-use clearing did to each message position before: the blocks it was given
/// (held, so their allocation is not reused), the role and the blocks asked to be cleared, and
/// what that gave (the blocks, and each cleared block's index, id and tokens freed). The same
/// request history is cleared the same way on every request: a message cleared before is taken
/// as it was, shared with the body served before (no copy, compared by pointer).
///
/// Kept per estimator key (the family the tokens freed were counted for): a request of another
/// family (a subagent on another model between two main requests) uses and fills its own
/// entries and leaves the others', so switching back finds them, rather than forgetting
/// everything at each switch. An entry is only ever taken for a request of its own family, whose
/// counts it holds; which entries exist changes no result, only what is counted again.
#[derive(Debug, Clone, Default)]
pub struct ClearMemo {
    /// Per estimator key, per message position.
    by_family: BTreeMap<String, Vec<Option<ClearedMessage>>>,
    /// Per message position, its tool blocks as read last (any family: ids and names only).
    scans: Vec<Option<ToolBlocks>>,
}

/// The tool blocks of one message's content, read once per block list rather than per request
/// (a raw block's `type`, `id` and `name` are JSON field lookups): the list they were read
/// from (held, so that the same allocation means the same blocks), and per tool_use or
/// tool_result block its content index, its tool use id and, of a tool_use, its name.
#[derive(Debug, Clone)]
struct ToolBlocks {
    blocks: crate::api::SharedBlocks,
    tools: Vec<(usize, String, Option<String>)>,
}

/// Brings `scans` in line with `messages`: a position whose block list changed is read again.
fn refresh_scans(scans: &mut Vec<Option<ToolBlocks>>, messages: &[Message]) {
    scans.truncate(messages.len());
    scans.resize(messages.len(), None);
    for (scan, message) in scans.iter_mut().zip(messages) {
        let MessageContent::Blocks(blocks) = &message.content else {
            *scan = None;
            continue;
        };
        if scan.as_ref().is_some_and(|s| s.blocks.same(blocks)) {
            continue;
        }
        let tools = blocks
            .iter()
            .enumerate()
            .filter_map(|(c, block)| match result_id(block) {
                Some(id) => Some((c, id.to_owned(), None)),
                None => tool_use(block).map(|(id, name)| (c, id.to_owned(), Some(name.to_owned()))),
            })
            .collect();
        *scan = Some(ToolBlocks { blocks: blocks.clone(), tools });
    }
}

#[derive(Debug, Clone)]
struct ClearedMessage {
    input: crate::api::SharedBlocks,
    tag: Vec<usize>,
    output: crate::api::SharedBlocks,
    /// (content index, cleared key `tool_use:<id>`, tokens freed) of each block cleared.
    cleared: Vec<(usize, String, u64)>,
}

/// [`apply`] with `memo` kept across the requests of one measurer; `family` names what `count`
/// counts with (the estimator key of the request's model).
pub fn apply_memo(request: &Request, edits: &[Edit], total_tokens: u64, count: &mut dyn FnMut(Role, &ContentBlock) -> u64, memo: &mut ClearMemo, family: &str) -> Option<Edited> {
    let ClearMemo { by_family, scans } = memo;
    if !by_family.contains_key(family) {
        by_family.insert(family.to_owned(), Vec::new());
    }
    let memo = by_family.get_mut(family).expect("inserted above");
    let mut messages: Option<Vec<Message>> = None;
    let mut response = ContextManagementResponse::default();
    let mut cleared: BTreeMap<String, u64> = BTreeMap::new();
    // Positions in terms of the current working messages; thinking removal happens first (it
    // must be listed first), so tool clearing positions need no remapping.
    let mut thinking_at: Vec<(usize, usize, String)> = Vec::new();
    let mut tool_at: Vec<(usize, usize, String)> = Vec::new();
    let mut tokens_now = total_tokens;

    for edit in edits {
        let current: &[Message] = messages.as_deref().unwrap_or(&request.messages);
        match edit {
            Edit::Unmodelled(_) | Edit::ClearThinking { keep: ThinkingKeep::All } => {}
            Edit::ClearThinking { keep: ThinkingKeep::Turns(keep) } => {
                let turn_of = turns(current);
                let mut thinking_turns: Vec<usize> = Vec::new();
                for (m, message) in current.iter().enumerate() {
                    if message.role == Role::Assistant
                        && matches!(&message.content, MessageContent::Blocks(b) if b.iter().any(is_thinking))
                        && thinking_turns.last() != Some(&turn_of[m])
                    {
                        thinking_turns.push(turn_of[m]);
                    }
                }
                let cut = thinking_turns.len().saturating_sub(*keep as usize);
                if cut == 0 {
                    continue;
                }
                let cleared_turns: BTreeSet<usize> = thinking_turns[..cut].iter().copied().collect();
                let mut next = current.to_vec();
                let mut freed = 0u64;
                for (m, message) in next.iter_mut().enumerate() {
                    if message.role != Role::Assistant || !cleared_turns.contains(&turn_of[m]) {
                        continue;
                    }
                    let MessageContent::Blocks(blocks) = &mut message.content else { continue };
                    let mut kept = Vec::with_capacity(blocks.len());
                    for block in blocks.drain(..) {
                        if is_thinking(&block) {
                            let tokens = count(Role::Assistant, &block);
                            freed += tokens;
                            let key = thinking_key(&block);
                            cleared.insert(key.clone(), tokens);
                            thinking_at.push((m, kept.len(), key));
                        } else {
                            kept.push(block);
                        }
                    }
                    *blocks = kept.into();
                }
                tokens_now = tokens_now.saturating_sub(freed);
                response.applied_edits.push(AppliedEdit {
                    kind: CLEAR_THINKING.to_owned(),
                    cleared_tool_uses: None,
                    cleared_thinking_turns: Some(cleared_turns.len() as u64),
                    cleared_input_tokens: freed,
                });
                messages = Some(next);
            }
            Edit::ClearToolUses { trigger, keep, clear_at_least, exclude_tools, clear_inputs } => {
                // Candidates: the id of every tool use that may be cleared, in order.
                refresh_scans(scans, current);
                let scans: &[Option<ToolBlocks>] = scans;
                let mut uses: Vec<&str> = Vec::new();
                let mut all_uses = 0u64;
                for (message, scan) in current.iter().zip(scans) {
                    let Some(scan) = scan.as_ref().filter(|_| message.role == Role::Assistant) else { continue };
                    for (_, id, name) in &scan.tools {
                        let Some(name) = name else { continue };
                        all_uses += 1;
                        if !exclude_tools.iter().any(|t| t == name) {
                            uses.push(id);
                        }
                    }
                }
                let fires = match trigger {
                    Trigger::InputTokens(v) => tokens_now > *v,
                    Trigger::ToolUses(v) => all_uses > *v,
                };
                let cut = uses.len().saturating_sub(*keep as usize);
                if !fires || cut == 0 {
                    continue;
                }
                // (Only asked whether it holds an id: a hash set, no order.)
                let clear: rustc_hash::FxHashSet<&str> = uses[..cut].iter().copied().collect();
                let mut next = current.to_vec();
                let mut freed_by: BTreeMap<String, u64> = BTreeMap::new();
                let mut positions = Vec::new();
                memo.truncate(next.len());
                memo.resize(next.len(), None);
                // (One list for every message's tag: a memo kept as it was copies none.)
                let mut tag = Vec::new();
                for (m, message) in next.iter_mut().enumerate() {
                    let role = message.role;
                    let MessageContent::Blocks(blocks) = &mut message.content else { continue };
                    // The blocks asked to be cleared (the role first, for the memo's key).
                    tag.clear();
                    tag.push(role as usize);
                    for (c, id, name) in scans[m].iter().flat_map(|scan| &scan.tools) {
                        // (A tool_result, no name: cleared with its tool use; a tool_use's
                        // input only where the edit clears inputs of its tool.)
                        if clear.contains(id.as_str()) && name.as_ref().is_none_or(|name| clear_inputs.covers(name)) {
                            tag.push(*c);
                        }
                    }
                    if tag.len() == 1 {
                        continue;
                    }
                    let kept = match memo[m].take() {
                        Some(kept) if kept.input.same(blocks) && kept.tag == tag => kept,
                        _ => {
                            let input = blocks.clone();
                            let mut cleared = Vec::new();
                            // Read through the shared blocks; only a block that is cleared copies them.
                            for &c in &tag[1..] {
                                let block = &blocks[c];
                                let Some(id) = result_id(block).or_else(|| tool_use(block).map(|(id, _)| id)).map(str::to_owned) else { continue };
                                let before = count(role, block);
                                let mut cleared_block = block.clone();
                                clear_block(&mut cleared_block);
                                let after = count(role, &cleared_block);
                                // Ours: content no larger than what replaces it stays (never grows).
                                if after >= before {
                                    continue;
                                }
                                blocks[c] = cleared_block;
                                cleared.push((c, format!("tool_use:{id}"), before - after));
                            }
                            ClearedMessage { input, tag: tag.clone(), output: blocks.clone(), cleared }
                        }
                    };
                    *blocks = kept.output.clone();
                    for (c, key, edited) in &kept.cleared {
                        *freed_by.entry(key.clone()).or_default() += edited;
                        positions.push((m, *c, key.clone()));
                    }
                    memo[m] = Some(kept);
                }
                let freed: u64 = freed_by.values().sum();
                if freed_by.is_empty() || clear_at_least.is_some_and(|min| freed < min) {
                    continue;
                }
                tokens_now = tokens_now.saturating_sub(freed);
                let touched: Vec<String> = freed_by.keys().filter_map(|k| k.strip_prefix("tool_use:")).map(str::to_owned).collect();
                let touched_count = touched.len() as u64;
                response.cleared_tool_use_ids.extend(touched);
                if cleared.is_empty() {
                    cleared = freed_by;
                } else {
                    cleared.extend(freed_by);
                }
                tool_at.extend(positions);
                response.applied_edits.push(AppliedEdit {
                    kind: CLEAR_TOOL_USES.to_owned(),
                    cleared_tool_uses: Some(touched_count),
                    cleared_thinking_turns: None,
                    cleared_input_tokens: freed,
                });
                messages = Some(next);
            }
        }
    }
    let messages = messages?;
    let mut edited_at = BTreeSet::new();
    let mut causes = BTreeMap::new();
    let mut keys = BTreeMap::new();
    for (m, c, key) in thinking_at {
        // The block that now sits where the thinking was (or the next message's first block).
        let position = if messages[m].content.block_count() > c {
            Some((m, c))
        } else {
            (m + 1..messages.len()).find(|&n| messages[n].content.block_count() > 0).map(|n| (n, 0))
        };
        if let Some(position) = position {
            edited_at.insert(position);
            causes.entry(position).or_insert("thinking_cleared");
            keys.entry(position).or_insert(key);
        }
    }
    if edited_at.is_empty() && tool_at.windows(2).all(|w| (w[0].0, w[0].1) < (w[1].0, w[1].1)) {
        // Positions in order, each once (one clearing edit, no thinking removed): the maps
        // built at once from the sorted list rather than by one insert each.
        edited_at = tool_at.iter().map(|&(m, c, _)| (m, c)).collect();
        causes = tool_at.iter().map(|&(m, c, _)| ((m, c), "context_editing")).collect();
        keys = tool_at.into_iter().map(|(m, c, key)| ((m, c), key)).collect();
    } else {
        for (m, c, key) in tool_at {
            edited_at.insert((m, c));
            causes.insert((m, c), "context_editing");
            keys.insert((m, c), key);
        }
    }
    let mut body = request.clone();
    body.messages = messages;
    Some(Edited { body, response, cleared, edited_at, causes, keys })
}
