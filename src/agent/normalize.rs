//! `normalizeMessagesForAPI` (reference layers-1-5 §5.3): the agent's records (messages,
//! attachments, meta messages) into API messages.
//!
//! 1. Attachments bubble up until an assistant message or a user message that starts with a
//!    tool_result, and are placed right after it (at the very top when nothing stops them).
//! 2. Consecutive user messages merge: `mergeUserMessages` appends `\n` to the last text of the
//!    first when both sides meet in text (the seam), then hoists tool_results to the front;
//!    attachments merge without a seam and, under the legacy smoosh, text that follows a string
//!    tool_result is folded into it (parts trimmed, joined by a blank line).
//! 3. Edit inputs are re-serialized with `replace_all` first; a tool_reference result gets the
//!    `Tool loaded.` sibling.
//!
//! Invariant: the output alternates user/assistant and starts with a user message when the
//! records do; nothing here reads the World.

use serde_json::{Map, Value};

use crate::agent::attachments::Attachment;
use crate::api::{CacheControl, ContentBlock, Message, MessageContent, Role, ToolResultContent};

/// One entry of the agent's transcript.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// A user message: a prompt, tool results, or a meta message (user context, skill body).
    User { content: MessageContent, meta: bool },
    Assistant { content: Vec<ContentBlock> },
    /// An attachment. `in_loop` marks a hook attachment produced inside the current tool loop:
    /// the reference pre-normalizes those into ordinary meta user messages, so until the next
    /// human turn they neither bubble nor fold.
    Attachment { attachment: Attachment, in_loop: bool },
}

impl Record {
    fn is_stop_point(&self) -> bool {
        match self {
            Record::Assistant { .. } => true,
            Record::User { content: MessageContent::Blocks(blocks), .. } => {
                matches!(blocks.first(), Some(ContentBlock::ToolResult { .. }))
            }
            _ => false,
        }
    }

    fn bubbles(&self) -> bool {
        matches!(self, Record::Attachment { in_loop: false, .. })
    }
}

/// Options of normalization that a Strategy sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NormalizeOptions {
    pub smoosh_into_tool_result: bool,
    pub tool_loaded_sibling: bool,
    /// Tool search is off for this request: tool_reference blocks are stripped.
    pub strip_tool_references: bool,
}

/// `reorderAttachmentsForAPI`.
pub fn reorder_attachments(records: &[Record]) -> Vec<&Record> {
    reorder_attachment_refs(records.iter().collect())
}

/// [`reorder_attachments`] over records the caller holds in several places.
fn reorder_attachment_refs(records: Vec<&Record>) -> Vec<&Record> {
    let mut reversed: Vec<&Record> = Vec::with_capacity(records.len());
    let mut pending: Vec<&Record> = Vec::new();
    for record in records.into_iter().rev() {
        if record.bubbles() {
            pending.push(record);
        } else if record.is_stop_point() {
            reversed.append(&mut pending);
            reversed.push(record);
        } else {
            reversed.push(record);
        }
    }
    reversed.append(&mut pending);
    reversed.reverse();
    reversed
}

/// The records as API messages.
pub fn normalize(records: &[Record], options: NormalizeOptions) -> Vec<Message> {
    normalize_refs(records.iter().collect(), options)
}

/// [`normalize`] of records the caller holds in several places (the session's user context
/// before its transcript), so that none is copied to make one slice.
pub fn normalize_refs(records: Vec<&Record>, options: NormalizeOptions) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::new();
    for record in reorder_attachment_refs(records) {
        match record {
            Record::User { content, .. } => {
                let mut message = Message { role: Role::User, content: content.clone(), extra: Map::new() };
                fix_tool_references(&mut message, options);
                match out.last_mut() {
                    Some(last) if last.role == Role::User => merge_user_messages(last, message),
                    _ => out.push(message),
                }
            }
            Record::Assistant { content } => {
                let blocks: Vec<ContentBlock> = content.iter().map(normalize_tool_input).collect();
                out.push(Message::assistant_blocks(blocks));
            }
            Record::Attachment { attachment, .. } if attachment.split_messages().is_some() => {
                let messages = attachment.split_messages().unwrap_or_default();
                // Several messages (a restored file's Read call, then its result): merged into a
                // user message before them, or else sent as they are, the call a string message.
                match out.last_mut() {
                    Some(last) if last.role == Role::User => {
                        for content in &messages {
                            merge_attachment(last, content.to_blocks(), options);
                        }
                    }
                    _ => out.extend(messages.into_iter().map(|content| Message { role: Role::User, content, extra: Map::new() })),
                }
            }
            Record::Attachment { attachment, in_loop } => {
                let blocks = attachment.render();
                match out.last_mut() {
                    Some(last) if last.role == Role::User && *in_loop => {
                        merge_user_messages(last, Message::user_blocks(blocks))
                    }
                    Some(last) if last.role == Role::User => merge_attachment(last, blocks, options),
                    _ => out.push(Message::user_blocks(blocks)),
                }
            }
        }
    }
    out
}

/// `mergeUserMessages`: the seam `\n`, then tool_results hoisted.
fn merge_user_messages(a: &mut Message, b: Message) {
    let mut left = a.content.to_blocks();
    let right = b.content.to_blocks();
    if let (Some(ContentBlock::Text { text, .. }), Some(ContentBlock::Text { .. })) = (left.last_mut(), right.first()) {
        text.push('\n');
    }
    left.extend(right);
    let (mut results, rest): (Vec<ContentBlock>, Vec<ContentBlock>) =
        left.into_iter().partition(|block| matches!(block, ContentBlock::ToolResult { .. }));
    results.extend(rest);
    a.content = MessageContent::Blocks(results);
}

/// `mergeUserMessagesAndToolResults` with the legacy smoosh.
fn merge_attachment(a: &mut Message, incoming: Vec<ContentBlock>, options: NormalizeOptions) {
    let mut left = a.content.to_blocks();
    let all_text = incoming.iter().all(|b| matches!(b, ContentBlock::Text { .. }));
    if options.smoosh_into_tool_result
        && all_text
        && let Some(ContentBlock::ToolResult { content: Some(ToolResultContent::Text(existing)), .. }) = left.last_mut()
    {
        let mut parts = vec![existing.trim().to_owned()];
        for block in &incoming {
            if let ContentBlock::Text { text, .. } = block {
                parts.push(text.trim().to_owned());
            }
        }
        *existing = parts.join("\n\n");
    } else {
        left.extend(incoming);
    }
    a.content = MessageContent::Blocks(left);
}

fn fix_tool_references(message: &mut Message, options: NormalizeOptions) {
    let MessageContent::Blocks(blocks) = &mut message.content else { return };
    let mut has_reference = false;
    for block in blocks.iter_mut() {
        if let ContentBlock::ToolResult { content: Some(ToolResultContent::Blocks(inner)), .. } = block {
            if options.strip_tool_references {
                inner.retain(|b| !matches!(b, ContentBlock::ToolReference { .. }));
            } else if inner.iter().any(|b| matches!(b, ContentBlock::ToolReference { .. })) {
                has_reference = true;
            }
        }
    }
    if has_reference && options.tool_loaded_sibling {
        blocks.push(ContentBlock::text(TOOL_LOADED));
    }
}

/// The sibling text after a tool_reference result (reference text, a fact of the wire format).
pub const TOOL_LOADED: &str = "Tool loaded.";

/// Tool inputs as the client re-serializes them: Edit gains `replace_all` as its first key.
fn normalize_tool_input(block: &ContentBlock) -> ContentBlock {
    match block {
        ContentBlock::ToolUse { id, name, input, cache_control, extra } if name == "Edit" => {
            let mut map = Map::new();
            let replace_all = input.get("replace_all").cloned().unwrap_or(Value::Bool(false));
            map.insert("replace_all".into(), replace_all);
            if let Value::Object(fields) = input {
                for (key, value) in fields {
                    if key != "replace_all" {
                        map.insert(key.clone(), value.clone());
                    }
                }
            }
            ContentBlock::ToolUse {
                id: id.clone(),
                name: name.clone(),
                input: Value::Object(map),
                cache_control: cache_control.clone(),
                extra: extra.clone(),
            }
        }
        other => other.clone(),
    }
}

/// Puts the one message-level marker on the last block of the last message (a string content
/// becomes one marked text block); an assistant ending in thinking gets none.
pub fn mark_last_block(messages: &mut [Message], marker: CacheControl) {
    let Some(last) = messages.last_mut() else { return };
    let mut blocks = last.content.to_blocks();
    if let Some(block) = blocks.last_mut() {
        if block.is_thinking() {
            return;
        }
        block.set_cache_control(Some(marker));
    }
    last.content = MessageContent::Blocks(blocks);
}

/// Writes every tool_result in the reference client's key order: `tool_use_id, type, content
/// [, is_error]` for ordinary results and `type, content, is_error, tool_use_id` for errors, with
/// any marker last.
pub fn finalize_tool_results(messages: &mut [Message]) {
    for message in messages {
        let MessageContent::Blocks(blocks) = &mut message.content else { continue };
        for block in blocks.iter_mut() {
            let ContentBlock::ToolResult { tool_use_id, content, is_error, cache_control, extra } = block else { continue };
            let mut map = Map::new();
            let content_value = content.as_ref().map(|c| serde_json::to_value(c).expect("tool_result content serializes"));
            if *is_error == Some(true) {
                map.insert("type".into(), Value::from("tool_result"));
                if let Some(c) = content_value {
                    map.insert("content".into(), c);
                }
                map.insert("is_error".into(), Value::Bool(true));
                map.insert("tool_use_id".into(), Value::from(tool_use_id.clone()));
            } else {
                map.insert("tool_use_id".into(), Value::from(tool_use_id.clone()));
                map.insert("type".into(), Value::from("tool_result"));
                if let Some(c) = content_value {
                    map.insert("content".into(), c);
                }
                if let Some(flag) = is_error {
                    map.insert("is_error".into(), Value::Bool(*flag));
                }
            }
            for (key, value) in extra.iter() {
                map.insert(key.clone(), value.clone());
            }
            if let Some(cc) = cache_control {
                map.insert("cache_control".into(), serde_json::to_value(cc).expect("cache_control serializes"));
            }
            *block = ContentBlock::Other(Value::Object(map));
        }
    }
}
