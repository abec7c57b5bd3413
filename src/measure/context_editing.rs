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
use std::sync::Arc;

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
    #[serde(default, skip_serializing_if = "ToolUseIds::is_empty")]
    pub cleared_tool_use_ids: ToolUseIds,
}

/// Tool use ids in order, shared by the rows of the requests that clear the same ones: the
/// server clears nearly the same list on every request, and a row holds it by a reference
/// count. Serialized as a list of strings; compared by content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolUseIds(Arc<Vec<Arc<str>>>);

impl ToolUseIds {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether both hold the same allocation (then they hold the same ids).
    pub fn same(&self, other: &ToolUseIds) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::ops::Deref for ToolUseIds {
    type Target = [Arc<str>];
    fn deref(&self) -> &[Arc<str>] {
        &self.0
    }
}

impl<S: AsRef<str>> FromIterator<S> for ToolUseIds {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        ToolUseIds(Arc::new(iter.into_iter().map(|s| Arc::from(s.as_ref())).collect()))
    }
}

impl Serialize for ToolUseIds {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|id| &**id))
    }
}

impl<'de> Deserialize<'de> for ToolUseIds {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Vec::<String>::deserialize(deserializer)?.into_iter().collect())
    }
}

/// What was cleared, by stable key (`tool_use:<id>`, `thinking:<hash>`), with the tokens
/// clearing it freed.
pub type ClearedTokens = BTreeMap<Arc<str>, u64>;

/// An edited position's cause and the cleared key (as in [`ClearedTokens`]) it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EditedBlock {
    pub cause: &'static str,
    pub key: Arc<str>,
}

/// Positions of the edited body (message index, content index) where the edited content starts
/// (a cleared result or input, or the block that followed a removed thinking block), each with
/// its cause and key.
pub type EditedPositions = BTreeMap<(usize, usize), EditedBlock>;

/// A request as the server edited it. The maps are shared (a reference count) with the clearing
/// memo and the requests before that cleared the same: a request that clears what the one
/// before cleared copies none of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Edited {
    pub body: Request,
    pub response: ContextManagementResponse,
    pub cleared: Arc<ClearedTokens>,
    pub positions: Arc<EditedPositions>,
}

impl Edited {
    /// The edited positions, in order.
    pub fn edited_at(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.positions.keys().copied()
    }
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

/// The last `context_management` value read and its reading: a session's requests send the
/// same value again and again, so [`ParseMemo::parse`] reads one only when it differs from the
/// last (a comparison of a few small fields, where reading formats every field's path).
#[derive(Debug, Clone, Default)]
pub struct ParseMemo {
    last: Option<(Value, Result<Vec<Edit>, String>)>,
}

impl ParseMemo {
    /// [`parse`] of `value`, read again only when it is not the last value read.
    pub fn parse(&mut self, value: &Value) -> &Result<Vec<Edit>, String> {
        let (last, read) = match self.last.take() {
            Some((last, read)) if same_in_order(&last, value) => (last, read),
            _ => (value.clone(), parse(value)),
        };
        debug_assert_eq!(read, parse(value), "the kept reading of context_management differs from reading it");
        &self.last.insert((last, read)).1
    }
}

/// Whether two values are equal with their objects' keys in the same order: `==` without
/// hashing every key (objects in another order count as different, which only reads one again).
fn same_in_order(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => a.len() == b.len() && a.iter().zip(b).all(|((ka, va), (kb, vb))| ka == kb && same_in_order(va, vb)),
        (Value::Array(a), Value::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_in_order(a, b)),
        // (Bit for bit: `==` takes -0.0 for 0.0.)
        (Value::Number(a), Value::Number(b)) => a.as_u64() == b.as_u64() && a.as_i64() == b.as_i64() && a.as_f64().map(f64::to_bits) == b.as_f64().map(f64::to_bits),
        _ => a == b,
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

// Blocks may be held typed or, where the client keeps its own key order, finalized
// (`ContentBlock::FinalToolResult`) or as raw JSON (`ContentBlock::Other`); every form is
// read and edited alike, a finalized result as its raw JSON would be.

fn wire_str<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

/// The `tool_use_id` of a tool_result block.
fn result_id(block: &ContentBlock) -> Option<&str> {
    match block {
        ContentBlock::ToolResult { tool_use_id, .. } | ContentBlock::FinalToolResult { tool_use_id, .. } => Some(tool_use_id),
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
        ContentBlock::ToolResult { content, .. } => *content = Some(ToolResultContent::Text(CLEARED_TOOL_RESULT.into())),
        ContentBlock::ToolUse { input, .. } => *input = json!({}),
        ContentBlock::FinalToolResult { content: Some(content), .. } => *content = ToolResultContent::Text(CLEARED_TOOL_RESULT.into()),
        // As its raw JSON form: the content key added goes last.
        ContentBlock::FinalToolResult { content: None, .. } => {
            if let Some(Value::Object(mut map)) = block.wire_value() {
                map.insert("content".to_owned(), json!(CLEARED_TOOL_RESULT));
                *block = ContentBlock::Other(Value::Object(map));
            }
        }
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

/// `block` cleared and the tokens that frees, when clearing shrinks it (ours: content no larger
/// than what replaces it stays, so clearing never grows the prompt).
fn shrunk(role: Role, block: &ContentBlock, count: &mut dyn FnMut(Role, &ContentBlock) -> u64) -> Option<(ContentBlock, u64)> {
    let before = count(role, block);
    let mut cleared = block.clone();
    clear_block(&mut cleared);
    let after = count(role, &cleared);
    (after < before).then(|| (cleared, before - after))
}

/// A key for a thinking block that survives later appends (its text, hashed).
fn thinking_key(block: &ContentBlock) -> String {
    let text = match block {
        ContentBlock::Thinking { thinking, .. } => thinking.as_str(),
        ContentBlock::RedactedThinking { data, .. } => data.as_str(),
        ContentBlock::Other(v) => wire_str(v, "thinking").or_else(|| wire_str(v, "data")).unwrap_or(""),
        // As its raw JSON form's: `extra` holds every key besides its fields.
        ContentBlock::FinalToolResult { extra, .. } => {
            let key = |k: &str| extra.get(k).and_then(Value::as_str);
            key("thinking").or_else(|| key("data")).unwrap_or("")
        }
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


/// What the tool-use clearing computed for the requests before, so that the next request's
/// clearing costs what changed in its history rather than the history: the server clears the
/// same history the same way on every request, and each new tool use pushes about one more out
/// of `keep`.
///
/// Kept per estimator key (the family the tokens freed were counted for) and per clearing edit
/// of the list: a request of another family (a subagent on another model between two main
/// requests) uses and fills its own state and leaves the others', so switching back finds them,
/// rather than forgetting everything at each switch. A state is only ever used for a request of
/// its own family, whose counts it holds; which states exist changes no result, only what is
/// counted again.
#[derive(Debug, Clone, Default)]
pub struct ClearMemo {
    /// Per estimator key, per index of the edit in the list.
    by_family: BTreeMap<String, Vec<ToolClearing>>,
}

/// One clearing edit's reading of the messages it was last given, and its clearing of them.
///
/// The messages are compared with the ones before by their block lists (the same allocation
/// means the same blocks): from the first that differs on, they are read again (their tool
/// blocks, the ids that may be cleared); before it, a message is a pointer comparison and a
/// look at its few tool blocks' indices. Which blocks are cleared follows from `cut` (the
/// candidates before it are cleared) and from each block's index of its id's first use, so
/// moving `cut` re-clears only the messages whose blocks it passes. The totals (the tokens
/// freed per key, the cleared ids, the edited positions) are the sums of every message's
/// clearing, kept up to date as a message's clearing changes, and handed to the request shared.
#[derive(Debug, Clone, Default)]
struct ToolClearing {
    /// `exclude_tools` and `clear_tool_inputs` of the edit the messages were read for.
    edit: Option<(Vec<String>, ClearInputs)>,
    messages: Vec<MessageClearing>,
    /// The ids of the tool uses that may be cleared (not excluded), in order.
    uses: Vec<Arc<str>>,
    /// The index in `uses` of each id's first use (looked up only, never iterated).
    first_use: rustc_hash::FxHashMap<Arc<str>, usize>,
    /// Tokens freed per cleared key (`tool_use:<id>`) over every message's clearing.
    cleared: Arc<ClearedTokens>,
    /// The ids of `cleared`'s keys, in its order.
    ids: ToolUseIds,
    /// Every message's cleared blocks.
    positions: Arc<EditedPositions>,
    /// The sum of `cleared`.
    freed: u64,
}

#[derive(Debug, Clone)]
struct MessageClearing {
    role: Role,
    /// The blocks read (held, so that the same allocation means the same blocks); `None` for a
    /// text message.
    blocks: Option<crate::api::SharedBlocks>,
    tools: Vec<ToolRef>,
    /// The length of `uses`, and the count of every tool use (excluded ones too), after this
    /// message.
    uses_after: usize,
    all_after: u64,
    /// Some block's id has no first use up to this message: looked up again whenever a later
    /// message changes.
    late: bool,
    /// The clearing of its blocks, when some are asked to be cleared.
    entry: Option<ClearedMessage>,
}

/// A tool_use or tool_result block of a message.
#[derive(Debug, Clone)]
struct ToolRef {
    content: usize,
    id: Arc<str>,
    /// A tool_use in an assistant message: counted by a `tool_uses` trigger, and a candidate
    /// unless its tool is excluded.
    counted: bool,
    candidate: bool,
    /// The edit clears it when its id is cleared: a tool_result, or a tool_use whose inputs
    /// the edit clears.
    clearable: bool,
    /// The index in `uses` of its id's first use.
    first_use: Option<usize>,
}

/// What clearing some blocks of one message gave: the blocks it was given, the blocks asked to
/// be cleared, the blocks it gave (shared with every body served since) and each cleared
/// block's index, key, id and tokens freed.
#[derive(Debug, Clone)]
struct ClearedMessage {
    input: crate::api::SharedBlocks,
    tag: Vec<usize>,
    output: crate::api::SharedBlocks,
    cleared: Vec<(usize, Arc<str>, Arc<str>, u64)>,
}

impl MessageClearing {
    /// Whether `message` is the one read.
    fn is(&self, message: &Message) -> bool {
        self.role == message.role
            && match (&self.blocks, &message.content) {
                (Some(read), MessageContent::Blocks(blocks)) => read.same(blocks),
                (None, MessageContent::Text(_)) => true,
                _ => false,
            }
    }

    /// Reads `message`'s tool blocks for the edit.
    fn read(message: &Message, exclude_tools: &[String], clear_inputs: &ClearInputs) -> MessageClearing {
        let MessageContent::Blocks(blocks) = &message.content else {
            return MessageClearing { role: message.role, blocks: None, tools: Vec::new(), uses_after: 0, all_after: 0, late: false, entry: None };
        };
        let assistant = message.role == Role::Assistant;
        let tools = blocks
            .iter()
            .enumerate()
            .filter_map(|(content, block)| {
                let (id, name) = match result_id(block) {
                    Some(id) => (id, None),
                    None => tool_use(block).map(|(id, name)| (id, Some(name)))?,
                };
                Some(ToolRef {
                    content,
                    id: Arc::from(id),
                    counted: assistant && name.is_some(),
                    candidate: assistant && name.is_some_and(|name| !exclude_tools.iter().any(|t| t == name)),
                    clearable: name.is_none_or(|name| clear_inputs.covers(name)),
                    first_use: None,
                })
            })
            .collect();
        MessageClearing { role: message.role, blocks: Some(blocks.clone()), tools, uses_after: 0, all_after: 0, late: true, entry: None }
    }
}

impl ToolClearing {
    /// Brings the reading in line with `current` (for an edit with these `exclude_tools` and
    /// `clear_tool_inputs`): the count of every tool use and of the candidates.
    fn read(&mut self, current: &[Message], exclude_tools: &[String], clear_inputs: &ClearInputs) -> (u64, usize) {
        if !matches!(&self.edit, Some((excluded, inputs)) if excluded == exclude_tools && inputs == clear_inputs) {
            *self = ToolClearing { edit: Some((exclude_tools.to_vec(), clear_inputs.clone())), ..ToolClearing::default() };
        }
        let read = self.messages.len();
        let same = self.messages.iter().zip(current).take_while(|(slot, message)| slot.is(message)).count();
        // Forget what the messages from the first changed one on added.
        let kept_uses = same.checked_sub(1).map_or(0, |m| self.messages[m].uses_after);
        let mut all = same.checked_sub(1).map_or(0, |m| self.messages[m].all_after);
        for (i, id) in self.uses.iter().enumerate().skip(kept_uses) {
            if self.first_use.get(id) == Some(&i) {
                self.first_use.remove(id);
            }
        }
        self.uses.truncate(kept_uses);
        for m in (same..read).rev() {
            let gone = m >= current.len() || !self.messages[m].is(&current[m]);
            if gone && let Some(entry) = self.messages[m].entry.take() {
                self.unpublish(m, &entry);
            }
        }
        self.messages.truncate(current.len());
        for (m, message) in current.iter().enumerate().skip(same) {
            if m >= self.messages.len() {
                self.messages.push(MessageClearing::read(message, exclude_tools, clear_inputs));
            } else if !self.messages[m].is(message) {
                self.messages[m] = MessageClearing::read(message, exclude_tools, clear_inputs);
            }
            let slot = &mut self.messages[m];
            for tool in &slot.tools {
                all += u64::from(tool.counted);
                if tool.candidate {
                    self.first_use.entry(tool.id.clone()).or_insert(self.uses.len());
                    self.uses.push(tool.id.clone());
                }
            }
            slot.uses_after = self.uses.len();
            slot.all_after = all;
        }
        // Each block's first use: the changed messages', and the earlier ones' that had none
        // up to their message (the only ones a change after them can move).
        for (m, slot) in self.messages.iter_mut().enumerate() {
            if m < same && !slot.late {
                continue;
            }
            let mut late = false;
            for tool in &mut slot.tools {
                tool.first_use = self.first_use.get(&tool.id).copied();
                late |= tool.first_use.is_none_or(|u| u >= slot.uses_after);
            }
            slot.late = late;
        }
        (all, self.uses.len())
    }

    /// Clears the ids of the first `cut` candidates from the messages read (the same ones as
    /// `current`), message by message as they changed.
    fn clear(&mut self, current: &[Message], cut: usize, count: &mut dyn FnMut(Role, &ContentBlock) -> u64) {
        let mut tag = Vec::new();
        for (m, message) in current.iter().enumerate().take(self.messages.len()) {
            let slot = &self.messages[m];
            let Some(blocks) = &slot.blocks else { continue };
            tag.clear();
            tag.extend(slot.tools.iter().filter(|t| t.clearable && t.first_use.is_some_and(|u| u < cut)).map(|t| t.content));
            if slot.entry.as_ref().is_some_and(|e| e.input.same(blocks) && e.tag == tag) || (tag.is_empty() && slot.entry.is_none()) {
                continue;
            }
            let (role, blocks) = (slot.role, blocks.clone());
            if let Some(entry) = self.messages[m].entry.take() {
                self.unpublish(m, &entry);
            }
            if tag.is_empty() {
                continue;
            }
            debug_assert!(matches!(&message.content, MessageContent::Blocks(b) if b.same(&blocks)));
            let mut output = blocks.clone();
            let mut cleared = Vec::new();
            // Read through the shared blocks; only a block that is cleared copies them.
            for &c in &tag {
                let block = &blocks[c];
                let Some(id) = result_id(block).or_else(|| tool_use(block).map(|(id, _)| id)) else { continue };
                let Some((cleared_block, freed)) = shrunk(role, block, count) else { continue };
                output[c] = cleared_block;
                cleared.push((c, Arc::from(format!("tool_use:{id}")), Arc::from(id), freed));
            }
            let entry = ClearedMessage { input: blocks, tag: tag.clone(), output, cleared };
            self.publish(m, &entry);
            self.messages[m].entry = Some(entry);
        }
    }

    /// Adds a message's clearing to the totals.
    fn publish(&mut self, m: usize, entry: &ClearedMessage) {
        for (c, key, id, freed) in &entry.cleared {
            let tokens = Arc::make_mut(&mut self.cleared).entry(key.clone()).or_insert(0);
            if *tokens == 0 {
                let ids = Arc::make_mut(&mut self.ids.0);
                let at = ids.binary_search(id).unwrap_or_else(|at| at);
                ids.insert(at, id.clone());
            }
            *tokens += freed;
            self.freed += freed;
            Arc::make_mut(&mut self.positions).insert((m, *c), EditedBlock { cause: "context_editing", key: key.clone() });
        }
    }

    /// Takes a message's clearing from the totals (every block cleared freed a token or more, so
    /// a key whose sum falls to zero has no block left).
    fn unpublish(&mut self, m: usize, entry: &ClearedMessage) {
        for (c, key, id, freed) in &entry.cleared {
            let cleared = Arc::make_mut(&mut self.cleared);
            let tokens = cleared.get_mut(key).expect("a published key");
            *tokens -= freed;
            if *tokens == 0 {
                cleared.remove(key);
                let ids = Arc::make_mut(&mut self.ids.0);
                let at = ids.binary_search(id).expect("a published id");
                ids.remove(at);
            }
            self.freed -= freed;
            Arc::make_mut(&mut self.positions).remove(&(m, *c));
        }
    }

    /// `current` with the cleared messages' blocks in place of theirs.
    fn cleared_messages(&self, current: &[Message]) -> Vec<Message> {
        current
            .iter()
            .zip(&self.messages)
            .map(|(message, slot)| match &slot.entry {
                Some(entry) if !entry.output.same(&entry.input) => Message {
                    role: message.role,
                    content: MessageContent::Blocks(entry.output.clone()),
                    extra: if message.extra.is_empty() { serde_json::Map::new() } else { message.extra.clone() },
                },
                _ => message.clone(),
            })
            .collect()
    }
}

/// One applied tool-clearing edit's totals.
struct ToolPart {
    cleared: Arc<ClearedTokens>,
    ids: ToolUseIds,
    positions: Arc<EditedPositions>,
}

/// [`apply`] with `memo` kept across the requests of one measurer; `family` names what `count`
/// counts with (the estimator key of the request's model). The same result as [`apply`] (the
/// measurer's debug builds check it on every request).
pub fn apply_memo(request: &Request, edits: &[Edit], total_tokens: u64, count: &mut dyn FnMut(Role, &ContentBlock) -> u64, memo: &mut ClearMemo, family: &str) -> Option<Edited> {
    if !memo.by_family.contains_key(family) {
        memo.by_family.insert(family.to_owned(), Vec::new());
    }
    let states = memo.by_family.get_mut(family).expect("inserted above");
    if states.len() < edits.len() {
        states.resize_with(edits.len(), ToolClearing::default);
    }
    let mut messages: Option<Vec<Message>> = None;
    let mut response = ContextManagementResponse::default();
    let mut thinking_cleared = ClearedTokens::new();
    // Positions in terms of the current working messages; thinking removal happens first (it
    // must be listed first), so tool clearing positions need no remapping.
    let mut thinking_at: Vec<(usize, usize, Arc<str>)> = Vec::new();
    let mut parts: Vec<ToolPart> = Vec::new();
    let mut tokens_now = total_tokens;

    for (edit, state) in edits.iter().zip(states.iter_mut()) {
        let current: &[Message] = messages.as_deref().unwrap_or(&request.messages);
        match edit {
            Edit::Unmodelled(_) | Edit::ClearThinking { keep: ThinkingKeep::All } => {}
            Edit::ClearThinking { keep: ThinkingKeep::Turns(keep) } => {
                if let Some(next) = clear_thinking(current, *keep, count, &mut thinking_cleared, &mut thinking_at, &mut tokens_now, &mut response) {
                    messages = Some(next);
                }
            }
            Edit::ClearToolUses { trigger, keep, clear_at_least, exclude_tools, clear_inputs } => {
                let (all_uses, candidates) = state.read(current, exclude_tools, clear_inputs);
                let Some(cut) = cut_when_fired(*trigger, tokens_now, all_uses, candidates, *keep) else { continue };
                state.clear(current, cut, count);
                let freed = state.freed;
                if state.cleared.is_empty() || clear_at_least.is_some_and(|min| freed < min) {
                    continue;
                }
                tokens_now = tokens_now.saturating_sub(freed);
                response.applied_edits.push(tool_uses_cleared(state.cleared.len(), freed));
                parts.push(ToolPart { cleared: state.cleared.clone(), ids: state.ids.clone(), positions: state.positions.clone() });
                messages = Some(state.cleared_messages(current));
            }
        }
    }
    let messages = messages?;
    // One clearing edit and no thinking removed (the usual list): its totals as they are.
    let (cleared, ids, positions) = match (&parts[..], thinking_cleared.is_empty() && thinking_at.is_empty()) {
        ([part], true) => (part.cleared.clone(), part.ids.clone(), part.positions.clone()),
        _ => {
            let mut cleared = thinking_cleared;
            let mut positions = EditedPositions::new();
            thinking_positions(&messages, thinking_at, &mut positions);
            for part in &parts {
                cleared.extend(part.cleared.iter().map(|(k, v)| (k.clone(), *v)));
                positions.extend(part.positions.iter().map(|(p, b)| (*p, b.clone())));
            }
            let ids = match &parts[..] {
                [part] => part.ids.clone(),
                _ => parts.iter().flat_map(|p| p.ids.iter()).collect(),
            };
            (Arc::new(cleared), ids, Arc::new(positions))
        }
    };
    response.cleared_tool_use_ids = ids;
    Some(Edited { body: request.with_messages(messages), response, cleared, positions })
}

/// Whether a tool-use clearing edit fires, by its trigger, on a prompt of `tokens_now` with
/// `all_uses` tool uses and `candidates` that may be cleared, and if so how many of the
/// candidates it clears (none: it does nothing).
fn cut_when_fired(trigger: Trigger, tokens_now: u64, all_uses: u64, candidates: usize, keep: u64) -> Option<usize> {
    let fires = match trigger {
        Trigger::InputTokens(v) => tokens_now > v,
        Trigger::ToolUses(v) => all_uses > v,
    };
    let cut = candidates.saturating_sub(keep as usize);
    (fires && cut > 0).then_some(cut)
}

/// The response's entry of an applied tool-use clearing.
fn tool_uses_cleared(uses: usize, freed: u64) -> AppliedEdit {
    AppliedEdit { kind: CLEAR_TOOL_USES.to_owned(), cleared_tool_uses: Some(uses as u64), cleared_thinking_turns: None, cleared_input_tokens: freed }
}

/// The positions of the removed thinking blocks in `messages` (the block that now sits where
/// the thinking was, or the next message's first block), into `positions` unless taken.
fn thinking_positions(messages: &[Message], at: Vec<(usize, usize, Arc<str>)>, positions: &mut EditedPositions) {
    for (m, c, key) in at {
        let position = if messages[m].content.block_count() > c {
            Some((m, c))
        } else {
            (m + 1..messages.len()).find(|&n| messages[n].content.block_count() > 0).map(|n| (n, 0))
        };
        if let Some(position) = position {
            positions.entry(position).or_insert(EditedBlock { cause: "thinking_cleared", key });
        }
    }
}

/// `clear_thinking` keeping the last `keep` turns with thinking: the messages without the older
/// turns' thinking, its entry pushed to `response` and the tokens freed taken from
/// `tokens_now`; each removed block's tokens go to `cleared` and its position (message, index
/// of the block after it) to `at`. `None` when no turn loses its thinking.
fn clear_thinking(
    current: &[Message],
    keep: u64,
    count: &mut dyn FnMut(Role, &ContentBlock) -> u64,
    cleared: &mut ClearedTokens,
    at: &mut Vec<(usize, usize, Arc<str>)>,
    tokens_now: &mut u64,
    response: &mut ContextManagementResponse,
) -> Option<Vec<Message>> {
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
    let cut = thinking_turns.len().saturating_sub(keep as usize);
    if cut == 0 {
        return None;
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
                let key: Arc<str> = Arc::from(thinking_key(&block));
                cleared.insert(key.clone(), tokens);
                at.push((m, kept.len(), key));
            } else {
                kept.push(block);
            }
        }
        *blocks = kept.into();
    }
    *tokens_now = tokens_now.saturating_sub(freed);
    response.applied_edits.push(AppliedEdit {
        kind: CLEAR_THINKING.to_owned(),
        cleared_tool_uses: None,
        cleared_thinking_turns: Some(cleared_turns.len() as u64),
        cleared_input_tokens: freed,
    });
    Some(next)
}

/// Applies the edits to `request`, every message read and cleared anew (what [`apply_memo`]
/// gives, and is checked against). `total_tokens` is the prompt's size as sent; `count` gives the
/// tokens of one content block (the measurer's estimator, memoized). `None` when nothing changed.
pub fn apply(request: &Request, edits: &[Edit], total_tokens: u64, count: &mut dyn FnMut(Role, &ContentBlock) -> u64) -> Option<Edited> {
    let mut messages: Option<Vec<Message>> = None;
    let mut response = ContextManagementResponse::default();
    let mut cleared = ClearedTokens::new();
    let mut ids: Vec<Arc<str>> = Vec::new();
    let mut thinking_at: Vec<(usize, usize, Arc<str>)> = Vec::new();
    let mut tool_at: Vec<(usize, usize, Arc<str>)> = Vec::new();
    let mut tokens_now = total_tokens;
    for edit in edits {
        let current: &[Message] = messages.as_deref().unwrap_or(&request.messages);
        match edit {
            Edit::Unmodelled(_) | Edit::ClearThinking { keep: ThinkingKeep::All } => {}
            Edit::ClearThinking { keep: ThinkingKeep::Turns(keep) } => {
                if let Some(next) = clear_thinking(current, *keep, count, &mut cleared, &mut thinking_at, &mut tokens_now, &mut response) {
                    messages = Some(next);
                }
            }
            Edit::ClearToolUses { trigger, keep, clear_at_least, exclude_tools, clear_inputs } => {
                let mut uses: Vec<&str> = Vec::new();
                let mut all_uses = 0u64;
                for message in current.iter().filter(|m| m.role == Role::Assistant) {
                    let MessageContent::Blocks(blocks) = &message.content else { continue };
                    for (id, name) in blocks.iter().filter(|b| result_id(b).is_none()).filter_map(tool_use) {
                        all_uses += 1;
                        if !exclude_tools.iter().any(|t| t == name) {
                            uses.push(id);
                        }
                    }
                }
                let Some(cut) = cut_when_fired(*trigger, tokens_now, all_uses, uses.len(), *keep) else { continue };
                let clear: BTreeSet<&str> = uses[..cut].iter().copied().collect();
                let mut next = current.to_vec();
                let mut freed_by: BTreeMap<Arc<str>, u64> = BTreeMap::new();
                let mut positions = Vec::new();
                for (m, message) in next.iter_mut().enumerate() {
                    let role = message.role;
                    let MessageContent::Blocks(blocks) = &mut message.content else { continue };
                    for c in 0..blocks.len() {
                        let block = &blocks[c];
                        let (id, clearable) = match result_id(block) {
                            Some(id) => (id, true),
                            None => match tool_use(block) {
                                Some((id, name)) => (id, clear_inputs.covers(name)),
                                None => continue,
                            },
                        };
                        if !clearable || !clear.contains(id) {
                            continue;
                        }
                        let Some((cleared_block, freed)) = shrunk(role, block, count) else { continue };
                        let key: Arc<str> = Arc::from(format!("tool_use:{id}"));
                        blocks[c] = cleared_block;
                        *freed_by.entry(key.clone()).or_default() += freed;
                        positions.push((m, c, key));
                    }
                }
                let freed: u64 = freed_by.values().sum();
                if freed_by.is_empty() || clear_at_least.is_some_and(|min| freed < min) {
                    continue;
                }
                tokens_now = tokens_now.saturating_sub(freed);
                let touched: Vec<Arc<str>> = freed_by.keys().filter_map(|k| k.strip_prefix("tool_use:")).map(Arc::from).collect();
                response.applied_edits.push(tool_uses_cleared(touched.len(), freed));
                ids.extend(touched);
                cleared.extend(freed_by);
                tool_at.extend(positions);
                messages = Some(next);
            }
        }
    }
    let messages = messages?;
    let mut positions = EditedPositions::new();
    thinking_positions(&messages, thinking_at, &mut positions);
    for (m, c, key) in tool_at {
        positions.insert((m, c), EditedBlock { cause: "context_editing", key });
    }
    response.cleared_tool_use_ids = ids.into_iter().collect();
    Some(Edited { body: request.with_messages(messages), response, cleared: Arc::new(cleared), positions: Arc::new(positions) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Message, SharedBlocks};
    use proptest::prelude::*;

    #[test]
    fn a_kept_reading_is_the_reading_of_the_value_given() {
        let thinking = json!({"edits": [{"type": CLEAR_THINKING, "keep": "all"}]});
        let reordered = json!({"edits": [{"keep": "all", "type": CLEAR_THINKING}]});
        let tools = json!({"edits": [{"type": CLEAR_TOOL_USES, "keep": {"type": "tool_uses", "value": 2}}]});
        let bad = json!({"edits": [{"type": CLEAR_TOOL_USES, "keep": {"type": "input_tokens", "value": 2}}]});
        let mut memo = ParseMemo::default();
        let zero = json!({"edits": [{"type": CLEAR_TOOL_USES, "keep": {"type": "tool_uses", "value": 0.0}}]});
        let minus_zero = json!({"edits": [{"type": CLEAR_TOOL_USES, "keep": {"type": "tool_uses", "value": -0.0}}]});
        assert!(!same_in_order(&zero, &minus_zero) && zero == minus_zero);
        for value in [&thinking, &thinking, &reordered, &tools, &bad, &bad, &thinking, &json!({}), &tools, &zero, &minus_zero] {
            assert_eq!(*memo.parse(value), parse(value), "{value}");
        }
        assert!(memo.parse(&bad).is_err());
    }

    /// The edit lists the property draws from: the preset's, one keeping more, a `tool_uses`
    /// trigger clearing inputs of one tool with one excluded, a `clear_at_least`, thinking
    /// cleared first, two clearing edits.
    fn edit_lists() -> Vec<Vec<Edit>> {
        let tool = |trigger, keep, clear_at_least, exclude_tools: &[&str], clear_inputs| Edit::ClearToolUses {
            trigger,
            keep,
            clear_at_least,
            exclude_tools: exclude_tools.iter().map(|t| (*t).to_owned()).collect(),
            clear_inputs,
        };
        vec![
            vec![Edit::ClearThinking { keep: ThinkingKeep::All }, tool(Trigger::InputTokens(300), 3, None, &[], ClearInputs::None)],
            vec![tool(Trigger::InputTokens(100), 1, None, &[], ClearInputs::All)],
            vec![tool(Trigger::ToolUses(2), 2, None, &["Grep"], ClearInputs::Tools(vec!["Bash".to_owned()]))],
            vec![tool(Trigger::InputTokens(0), 0, Some(400), &[], ClearInputs::None)],
            vec![Edit::ClearThinking { keep: ThinkingKeep::Turns(1) }, tool(Trigger::InputTokens(200), 2, None, &[], ClearInputs::None)],
            vec![tool(Trigger::InputTokens(0), 4, None, &[], ClearInputs::None), tool(Trigger::InputTokens(0), 1, None, &["Read"], ClearInputs::All)],
        ]
    }

    fn count(role: Role, block: &ContentBlock) -> u64 {
        serde_json::to_string(block).expect("a block serializes").len() as u64 / 4 + u64::from(role == Role::Assistant)
    }

    proptest! {
        /// Clearing each request through the memo kept across requests gives what clearing it
        /// from scratch gives, as the history grows, has its last message made again, an older
        /// message rewritten or removed, is cut back (a compaction) or starts over, under edit
        /// lists and families that change between requests.
        #[test]
        fn the_kept_clearing_is_the_clearing_from_scratch(ops in proptest::collection::vec((0u8..9, 0usize..6, 0usize..64), 1..70)) {
            let lists = edit_lists();
            let mut memo = ClearMemo::default();
            let mut messages: Vec<Message> = Vec::new();
            let mut next = 0usize;
            for (op, list, k) in ops {
                let tools = ["Read", "Bash", "Grep", "Edit"];
                match op {
                    0..=3 => {
                        next += 1;
                        let id = format!("toolu_{}", if k % 11 == 0 { k % (next + 1) } else { next });
                        let mut uses = vec![ContentBlock::tool_use(id.clone(), tools[k % 4], serde_json::json!({"input": "x".repeat(k * 3)}))];
                        if op == 1 {
                            uses.insert(0, ContentBlock::thinking("t".repeat(k * 5 + 1), "sig"));
                        }
                        messages.push(Message::assistant_blocks(uses));
                        let result = ContentBlock::tool_result(id, ToolResultContent::Text("r".repeat(k * 20).into()), None);
                        messages.push(Message::user_blocks(vec![result]));
                    }
                    4 => messages.push(Message::user_text(format!("prompt {k}"))),
                    5 => {
                        // An older message's blocks made again (a new allocation, the same blocks).
                        let at = k % messages.len().max(1);
                        if let Some(MessageContent::Blocks(blocks)) = messages.get_mut(at).map(|m| &mut m.content) {
                            *blocks = SharedBlocks::from(blocks.to_vec());
                        }
                    }
                    6 => {
                        let at = k % messages.len().max(1);
                        if at < messages.len() {
                            messages.remove(at);
                        }
                    }
                    7 => messages.truncate(k % (messages.len() + 1)),
                    _ => {
                        // A result of a tool use named nowhere, and an assistant text.
                        messages.push(Message::user_blocks(vec![ContentBlock::tool_result(format!("toolu_x{k}"), ToolResultContent::Text("o".repeat(k * 9).into()), None)]));
                        messages.push(Message::assistant_blocks(vec![ContentBlock::text("ok")]));
                    }
                }
                if let Some(MessageContent::Blocks(blocks)) = messages.last_mut().map(|m| &mut m.content) {
                    *blocks = SharedBlocks::from(blocks.to_vec());
                }
                let mut request = Request::new("m", 100);
                request.messages = messages.clone();
                let edits = &lists[list];
                let total: u64 = messages.iter().filter_map(|m| match &m.content {
                    MessageContent::Blocks(b) => Some(b.iter().map(|x| count(m.role, x)).sum::<u64>()),
                    MessageContent::Text(_) => None,
                }).sum();
                let family = ["a", "b"][k % 2];
                let kept = apply_memo(&request, edits, total, &mut count, &mut memo, family);
                let scratch = apply(&request, edits, total, &mut count);
                prop_assert_eq!(kept, scratch);
            }
        }
    }
}
