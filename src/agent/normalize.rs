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

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::agent::attachments::Attachment;
use crate::api::{CacheControl, ContentBlock, Message, MessageContent, Role, SharedBlocks, SharedText, ToolResultContent};

/// One entry of the agent's transcript.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// A user message: a prompt, tool results, or a meta message (user context, skill body).
    User { content: MessageContent, meta: bool },
    /// The reply's blocks, shared with every message normalized from it that changes none of
    /// them ([`normalize_tool_input`]): the flattener then finds the history's assistant
    /// messages unchanged by a pointer comparison, request after request.
    Assistant { content: SharedBlocks },
    /// An attachment. `in_loop` marks a hook attachment produced inside the current tool loop:
    /// the reference pre-normalizes those into ordinary meta user messages, so until the next
    /// human turn they neither bubble nor fold. Shared by the record's copies (a checkpoint of
    /// the run copies a reference count, not the attachment's texts).
    Attachment { attachment: std::rc::Rc<Attachment>, in_loop: bool },
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
                // The record's own list when normalizing leaves every block as it is (a
                // reference count, not a copy of the reply).
                if content.iter().all(tool_input_normalized) {
                    out.push(Message { role: Role::Assistant, content: MessageContent::Blocks(content.clone()), extra: Map::new() });
                } else {
                    let blocks: Vec<ContentBlock> = content.iter().map(normalize_tool_input).collect();
                    out.push(Message::assistant_blocks(blocks));
                }
            }
            Record::Attachment { attachment, .. } if let Some(messages) = attachment.split_messages() => {
                // Several messages (a restored file's Read call, then its result): merged into a
                // user message before them, or else sent as they are, the call a string message.
                match out.last_mut() {
                    Some(last) if last.role == Role::User => {
                        for content in messages {
                            merge_attachment(last, content.into_blocks(), options);
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

/// The API messages of the settled part of a transcript, kept from request to request, so
/// that a request normalizes only the records from the last assistant record on.
///
/// An assistant record is a stop point that starts a new message: no later record merges into
/// a message before it and no attachment bubbles past it. So the messages of the user context
/// and `records[..split]` (with `records[split]` an assistant record) are a prefix of the
/// messages of the whole transcript, and the rest are the messages of `records[split..]` alone.
/// The memo keeps that prefix; the session tells it where its records changed other than by
/// appending ([`MessageMemo::invalidate_from`]), and a prefix whose end is no longer an
/// assistant record, or made under other options or another user context, is made again.
///
/// With `finish`, the prefix is kept as the body sends it (MCP results as blocks, tool results
/// finalized), so that neither walk visits it again.
///
/// A request does not copy the prefix: it is lent the list the request before handed back
/// ([`MessageMemo::give_back`]), whose first messages are then the prefix's own (the same
/// shared blocks, an equal text), so only the messages the prefix gained since are copied
/// into it and nothing is dropped but the request's own tail. A message the request puts in
/// front (the deferred tools' listing) keeps its place in the list, so that neither putting
/// it there nor handing the list back moves every message.
#[derive(Debug, Default)]
pub struct MessageMemo {
    key: Option<(NormalizeOptions, bool, SharedText)>,
    split: usize,
    messages: crate::shared::Chunked<Message>,
    mcp_ids: BTreeSet<String>,
    /// The list the last request handed back: after its first `spare_front` messages, every
    /// message is the prefix's message at its position ([`same_message`]), and there are no
    /// more than the prefix's.
    spare: Vec<Message>,
    spare_front: usize,
    /// How many leading messages of the spare list are the handing request's own, as it sent
    /// them (the count [`MessageMemo::give_back`] was told).
    spare_unchanged: usize,
    /// How many leading messages of the last list lent are the previous request's own, as it
    /// sent them ([`MessageMemo::lent_shared`]).
    lent_shared: usize,
    /// The messages of the records `start..end` as the last request normalized them (its
    /// tail, before MCP results were made blocks): from the prefix's end to the end of the
    /// records then. When the next request's last assistant record is the one appended at
    /// `end`, these are the messages the prefix gains, and they are not normalized again.
    /// Dropped when records before `end` change ([`MessageMemo::invalidate_from`]).
    tail: Option<(usize, usize, Vec<Message>)>,
    /// When the last [`MessageMemo::messages`] was asked for it, the messages of the user
    /// context and the records as normalized, before MCP results are made blocks or tool
    /// results finalized ([`MessageMemo::raw`]): the prefix's, then the last request's tail.
    /// Kept beside the finished prefix, its first `messages.len()` the prefix's as normalized,
    /// so a request copies in only what the prefix gained and its own tail; `None` when not
    /// asked for.
    raw: Option<Vec<Message>>,
    /// The raw view's stamp ([`crate::shared::fresh_stamp`]: each view gets its own), and the
    /// stamp of the view before it in this memo with how many of its leading messages this one
    /// holds as they were (the same allocations: the prefix it carried over).
    raw_stamp: u64,
    raw_shared: Option<(u64, usize)>,
}

/// A copy keeps no spare list (it would copy the conversation for nothing; the copy's first
/// request copies the prefix instead), nor the raw view (a copy of a run seldom asks for it;
/// one that does normalizes its prefix again once). It shares the prefix's messages up to the
/// last [`MessageMemo::freeze`].
impl Clone for MessageMemo {
    fn clone(&self) -> Self {
        MessageMemo {
            key: self.key.clone(),
            split: self.split,
            messages: self.messages.clone(),
            mcp_ids: self.mcp_ids.clone(),
            spare: Vec::new(),
            spare_front: 0,
            spare_unchanged: 0,
            lent_shared: 0,
            tail: self.tail.clone(),
            raw: None,
            raw_stamp: 0,
            raw_shared: None,
        }
    }
}

impl MessageMemo {
    /// Shares the prefix's messages so far with every later copy of the memo (and their
    /// copies) rather than copying them into each ([`crate::shared::Chunked`]).
    pub fn freeze(&mut self) {
        self.messages.freeze();
    }

    /// Forgets the prefix (the records were replaced).
    pub fn clear(&mut self) {
        *self = MessageMemo::default();
    }

    /// The records from `index` on changed other than by appending.
    pub fn invalidate_from(&mut self, index: usize) {
        if index < self.split {
            self.clear();
        }
        if self.tail.as_ref().is_some_and(|&(_, end, _)| index < end) {
            self.tail = None;
        }
    }

    /// The messages of the user context (a meta user text) then `records`: what
    /// [`normalize_refs`] gives, and with `finish`, MCP results as blocks
    /// ([`crate::agent::dialect::mcp_results_as_blocks`]) in every message and
    /// [`finalize_tool_results`] done on the messages before the returned index (the caller
    /// finalizes the rest after placing its marker); `front` (when given) put before them.
    /// With `raw`, the same messages as [`normalize_refs`] gives them are kept too, until the
    /// next call ([`MessageMemo::raw`]).
    pub fn messages(&mut self, context: &SharedText, records: &[Record], options: NormalizeOptions, finish: bool, front: Option<Message>, raw: bool) -> (Vec<Message>, usize) {
        #[cfg(debug_assertions)]
        let front_len = usize::from(front.is_some());
        let (messages, start) = self.messages_memoized(context, records, options, finish, front, raw);
        #[cfg(debug_assertions)]
        {
            let context_record = Record::User { content: MessageContent::Text(context.clone()), meta: true };
            let mut scratch = normalize_refs(std::iter::once(&context_record).chain(records).collect(), options);
            debug_assert!(!raw || self.raw.as_deref() == Some(&scratch[..]), "the raw view kept differs from normalizing every record");
            debug_assert!(raw || self.raw.is_none(), "a raw view kept that was not asked for");
            if finish {
                crate::agent::dialect::mcp_results_as_blocks(&mut scratch);
                let finished = (start - front_len).min(scratch.len());
                finalize_tool_results_as(&mut scratch[..finished], false);
            }
            debug_assert!(scratch[..] == messages[front_len..], "memoized messages differ from normalizing every record");
        }
        (messages, start)
    }

    fn messages_memoized(&mut self, context: &SharedText, records: &[Record], options: NormalizeOptions, finish: bool, front: Option<Message>, raw: bool) -> (Vec<Message>, usize) {
        let front_len = usize::from(front.is_some());
        self.lent_shared = 0;
        let previous_raw = self.raw.as_ref().map(|_| self.raw_stamp);
        let Some(split) = records.iter().rposition(|r| matches!(r, Record::Assistant { .. })) else {
            self.clear();
            let context_record = Record::User { content: MessageContent::Text(context.clone()), meta: true };
            let mut messages = normalize_refs(std::iter::once(&context_record).chain(records).collect(), options);
            // (With no prefix, the raw view is these messages: the memo keeps nothing else.)
            self.raw = raw.then(|| messages.clone());
            if raw {
                self.raw_stamp = crate::shared::fresh_stamp();
            }
            if finish {
                crate::agent::dialect::mcp_results_as_blocks(&mut messages);
            }
            if let Some(front) = front {
                messages.insert(0, front);
            }
            return (messages, front_len);
        };
        let reusable = self.key.as_ref().is_some_and(|(o, f, c)| *o == options && *f == finish && c == context)
            && self.split <= split
            && matches!(records.get(self.split), Some(Record::Assistant { .. }));
        // The leading messages of the raw view carried over as they are: its prefix's.
        let carried = if reusable && raw && self.raw.is_some() { self.messages.len() } else { 0 };
        if !reusable {
            let context_record = Record::User { content: MessageContent::Text(context.clone()), meta: true };
            let mut messages = normalize_refs(std::iter::once(&context_record).chain(&records[..split]).collect(), options);
            let raw = raw.then(|| messages.clone());
            let mut mcp_ids = BTreeSet::new();
            if finish {
                crate::agent::dialect::mcp_results_as_blocks_after(&mut messages, &mut mcp_ids);
                finalize_tool_results(&mut messages);
            }
            *self = MessageMemo { key: Some((options, finish, context.clone())), split, messages: messages.into(), mcp_ids, raw, ..MessageMemo::default() };
        } else if self.split < split {
            // The last request's tail, when the records it was made of are all the prefix
            // gains: the messages before an assistant record are not changed by what follows.
            let mut more = match self.tail.take() {
                Some((start, end, tail)) if start == self.split && end == split => {
                    debug_assert!(tail == normalize_refs(records[start..end].iter().collect(), options), "the kept tail differs from normalizing its records");
                    tail
                }
                _ => normalize_refs(records[self.split..split].iter().collect(), options),
            };
            // The raw view's prefix gains the same messages as normalized.
            if raw && let Some(kept) = &mut self.raw {
                kept.truncate(self.messages.len());
                kept.extend_from_slice(&more);
            }
            if finish {
                crate::agent::dialect::mcp_results_as_blocks_after(&mut more, &mut self.mcp_ids);
                finalize_tool_results(&mut more);
            }
            self.messages.extend(more);
            self.split = split;
        }
        let mut tail = normalize_refs(records[split..].iter().collect(), options);
        self.tail = Some((split, records.len(), tail.clone()));
        if raw {
            // Asked for the first time over a kept prefix: that prefix normalized again, once.
            let kept = self.raw.get_or_insert_with(|| {
                let context_record = Record::User { content: MessageContent::Text(context.clone()), meta: true };
                normalize_refs(std::iter::once(&context_record).chain(&records[..split]).collect(), options)
            });
            kept.truncate(self.messages.len());
            kept.extend_from_slice(&tail);
            self.raw_stamp = crate::shared::fresh_stamp();
            self.raw_shared = previous_raw.map(|stamp| (stamp, carried));
        } else {
            self.raw = None;
            self.raw_stamp = 0;
            self.raw_shared = None;
        }
        if finish {
            crate::agent::dialect::mcp_results_as_blocks_beside(&mut tail, &self.mcp_ids);
        }
        // The list the last request handed back, its messages after the front ones the
        // prefix's first ones; the front as asked for, the prefix's later messages copied in.
        // One more for a message the caller may still put in front (moving the list once).
        // The messages of the list handed back that stay where they were, unchanged, are
        // the previous request's own as it sent them (an equal front message is kept too).
        let mut messages = std::mem::take(&mut self.spare);
        let spare_front = std::mem::take(&mut self.spare_front);
        let spare_unchanged = std::mem::take(&mut self.spare_unchanged);
        let in_place = match front {
            Some(front) if spare_front == 1 => {
                let equal = messages[0] == front;
                if !equal {
                    messages[0] = front;
                }
                equal
            }
            front => {
                let in_place = spare_front == 0 && front.is_none();
                messages.drain(..spare_front);
                messages.splice(0..0, front);
                in_place
            }
        };
        let kept = messages.len() - front_len;
        self.lent_shared = if in_place { spare_unchanged.min(messages.len()) } else { 0 };
        debug_assert!(kept <= self.messages.len() && messages[front_len..].iter().eq(self.messages.iter_from(0).take(kept)), "the spare list is the prefix's");
        messages.reserve(self.messages.len() - kept + tail.len() + 1);
        messages.extend(self.messages.iter_from(kept).cloned());
        let start = messages.len();
        messages.extend(tail);
        (messages, start)
    }

    /// Takes back the messages of a request made from [`MessageMemo::messages`] once it is no
    /// longer needed, `offset` messages put in front of them: the next request is lent them
    /// instead of a copy of the prefix. Whatever the request changed is found (a message that
    /// is not [`same_message`] as the prefix's at its position) and made again from the prefix,
    /// and its messages past the prefix are dropped.
    ///
    /// `unchanged` counts the leading messages (the front ones included) that are as
    /// [`MessageMemo::messages`] lent them: the prefix's own, taken without a look. A count too
    /// low costs only the comparison; debug builds check the ones taken.
    pub fn give_back(&mut self, mut messages: Vec<Message>, offset: usize, unchanged: usize) {
        if messages.len() < offset {
            return;
        }
        messages.truncate(offset + self.messages.len());
        let skip = unchanged.saturating_sub(offset);
        for (given, kept) in messages[offset..].iter_mut().skip(skip).zip(self.messages.iter_from(skip)) {
            if !same_message(given, kept) {
                *given = kept.clone();
            }
        }
        debug_assert!(
            messages[offset..].iter().zip(self.messages.iter_from(0)).take(skip).all(|(given, kept)| same_message(given, kept)),
            "a message counted as unchanged ({unchanged} from {offset}) differs from the prefix's"
        );
        self.spare_unchanged = unchanged.min(messages.len());
        self.spare = messages;
        self.spare_front = offset;
    }

    /// How many leading messages of the list the last [`MessageMemo::messages`] returned are
    /// the ones of the request that handed it back, as that request sent them (the same
    /// allocations; [`MessageMemo::give_back`]'s count of unchanged ones, where the list's
    /// messages stayed in place). A flattener that last saw that request need not compare
    /// them ([`crate::measure::incremental::Flattener::expect_shared`]).
    pub fn lent_shared(&self) -> usize {
        self.lent_shared
    }

    /// The messages of the last [`MessageMemo::messages`] (without its front message) as
    /// [`normalize_refs`] gives them, when it was asked for them: MCP results not yet blocks,
    /// tool results not finalized, whatever `finish` was. What a reader of the history as
    /// normalized reads (a peer mechanism's probe) where the request's own messages are
    /// finished, without a copy of the history per request.
    pub fn raw(&self) -> Option<&[Message]> {
        self.raw.as_deref()
    }

    /// [`MessageMemo::raw`] with its stamp (a number no other view gets) and, where this memo
    /// made a raw view before it, that view's stamp and how many of its leading messages this
    /// view holds as they were (the same allocations at the same positions): a reader that
    /// last read that view need not read them again.
    pub fn raw_stamped(&self) -> Option<RawView<'_>> {
        self.raw.as_deref().map(|messages| RawView { messages, stamp: self.raw_stamp, shared: self.raw_shared })
    }
}

/// A raw view of a memo ([`MessageMemo::raw_stamped`]).
#[derive(Debug, Clone, Copy)]
pub struct RawView<'a> {
    /// The messages as normalized ([`MessageMemo::raw`]).
    pub messages: &'a [Message],
    /// A number no other view gets.
    pub stamp: u64,
    /// The stamp of the view the memo made before, and how many of its leading messages this
    /// view holds as they were.
    pub shared: Option<(u64, usize)>,
}

/// Whether `a` is `b` as a request sends it: the same role, identical extra fields, equal text,
/// and the same shared blocks (one allocation, so identical; equal blocks elsewhere do not
/// count).
fn same_message(a: &Message, b: &Message) -> bool {
    let content = match (&a.content, &b.content) {
        (MessageContent::Blocks(x), MessageContent::Blocks(y)) => x.same(y),
        (MessageContent::Text(x), MessageContent::Text(y)) => x == y,
        _ => false,
    };
    // Extra fields are nearly always none: two empty maps are the same without a look. Else
    // compared as sent (in order; `==` on maps is not).
    content && a.role == b.role && ((a.extra.is_empty() && b.extra.is_empty()) || crate::api::identical::Identical::identical(&a.extra, &b.extra))
}

/// `mergeUserMessages`: the seam `\n`, then tool_results hoisted.
fn merge_user_messages(a: &mut Message, b: Message) {
    // Both taken, not copied: a list no other message holds moves as it is.
    let mut left = take_content(a).into_blocks();
    let right = b.content.into_blocks();
    if let (Some(ContentBlock::Text { text, .. }), Some(ContentBlock::Text { .. })) = (left.last_mut(), right.first()) {
        text.append("\n");
    }
    left.extend(right);
    // The tool results first, each part in its order (a stable sort, in place).
    left.sort_by_key(|block| !matches!(block, ContentBlock::ToolResult { .. }));
    a.content = MessageContent::Blocks(left.into());
}

/// `mergeUserMessagesAndToolResults` with the legacy smoosh.
fn merge_attachment(a: &mut Message, incoming: Vec<ContentBlock>, options: NormalizeOptions) {
    let mut left = take_content(a).into_blocks();
    let all_text = incoming.iter().all(|b| matches!(b, ContentBlock::Text { .. }));
    if options.smoosh_into_tool_result
        && all_text
        && let Some(ContentBlock::ToolResult { content: Some(ToolResultContent::Text(existing)), .. }) = left.last_mut()
    {
        // The trimmed texts joined by blank lines, written once into a text of their length.
        let texts = || incoming.iter().filter_map(|block| if let ContentBlock::Text { text, .. } = block { Some(text.trim()) } else { None });
        let mut joined = String::with_capacity(existing.trim().len() + texts().map(|t| t.len() + 2).sum::<usize>());
        joined.push_str(existing.trim());
        for text in texts() {
            joined.push_str("\n\n");
            joined.push_str(text);
        }
        *existing = joined.into();
    } else {
        left.extend(incoming);
    }
    a.content = MessageContent::Blocks(left.into());
}

/// The message's content, left empty in its place.
fn take_content(message: &mut Message) -> MessageContent {
    std::mem::replace(&mut message.content, MessageContent::Text(Default::default()))
}

fn fix_tool_references(message: &mut Message, options: NormalizeOptions) {
    let MessageContent::Blocks(blocks) = &mut message.content else { return };
    let is_reference = |b: &ContentBlock| matches!(b, ContentBlock::ToolReference { .. });
    // Read before writing: a change copies blocks another message holds (the record's).
    let has_reference = blocks
        .iter()
        .any(|block| matches!(block, ContentBlock::ToolResult { content: Some(ToolResultContent::Blocks(inner)), .. } if inner.iter().any(is_reference)));
    if !has_reference {
        return;
    }
    if options.strip_tool_references {
        for block in blocks.iter_mut() {
            if let ContentBlock::ToolResult { content: Some(ToolResultContent::Blocks(inner)), .. } = block {
                inner.retain(|b| !is_reference(b));
            }
        }
    } else if options.tool_loaded_sibling {
        blocks.push(ContentBlock::text(TOOL_LOADED));
    }
}

/// The sibling text after a tool_reference result (reference text, a fact of the wire format).
pub const TOOL_LOADED: &str = "Tool loaded.";

/// Whether [`normalize_tool_input`] gives `block` back unchanged: anything but an Edit call,
/// or one whose input already starts with `replace_all`.
fn tool_input_normalized(block: &ContentBlock) -> bool {
    match block {
        ContentBlock::ToolUse { name, input, .. } if name == "Edit" => {
            matches!(input, Value::Object(fields) if fields.keys().next().is_some_and(|key| key == "replace_all"))
        }
        _ => true,
    }
}

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
    if let MessageContent::Blocks(blocks) = &last.content
        && blocks.last().is_some_and(ContentBlock::is_thinking)
    {
        return;
    }
    // In place: the blocks are copied only when another message holds them.
    if let Some(block) = last.content.blocks_mut().last_mut() {
        block.set_cache_control(Some(marker));
    }
}

/// Writes every tool_result in the reference client's key order: `tool_use_id, type, content
/// [, is_error]` for ordinary results and `type, content, is_error, tool_use_id` for errors, with
/// any marker last ([`ContentBlock::FinalToolResult`], which keeps the content it was given).
pub fn finalize_tool_results(messages: &mut [Message]) {
    finalize_tool_results_as(messages, true);
}

/// [`finalize_tool_results`], each result checked in debug builds where `check` (not where a
/// debug check finalizes again what was checked when it was made).
fn finalize_tool_results_as(messages: &mut [Message], check: bool) {
    for message in messages {
        let MessageContent::Blocks(blocks) = &mut message.content else { continue };
        // A message without results is left as it is (a change copies its shared blocks).
        if has_tool_result(blocks) {
            finalize_blocks(blocks, check);
        }
    }
}

/// [`finalize_tool_results`] through `memo`: a message whose blocks are those finalized at
/// its position before (the same allocation) takes what that gave, so an unchanged history
/// keeps its finished blocks shared from request to request.
pub fn finalize_tool_results_memo(messages: &mut [Message], memo: &mut BlocksMemo) {
    memo.truncate(messages.len());
    for (m, message) in messages.iter_mut().enumerate() {
        let MessageContent::Blocks(blocks) = &mut message.content else { continue };
        if has_tool_result(blocks) {
            memo.apply(m, blocks, &[], |blocks| finalize_blocks(blocks, true));
        }
    }
}

fn has_tool_result(blocks: &[ContentBlock]) -> bool {
    blocks.iter().any(|b| matches!(b, ContentBlock::ToolResult { .. }))
}

/// What a rewrite of a message's blocks gave at each position of the history, keyed by the
/// blocks it was given (their allocation, held here, so it cannot be reused by other blocks:
/// shared blocks are copied before any change while the memo holds them) and by a tag of
/// what the rewrite was asked to do (which blocks). The same rewrite of the same blocks gives
/// the same blocks, now shared with the request before: nothing copied, and the measurer
/// compares them by pointer.
#[derive(Debug, Clone, Default)]
pub struct BlocksMemo {
    kept: Vec<Option<(crate::api::SharedBlocks, Vec<usize>, crate::api::SharedBlocks)>>,
}

impl BlocksMemo {
    /// Forgets positions from `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.kept.truncate(len);
    }

    /// `blocks` (at position `at`) replaced by what `rewrite` makes of them, or by what it
    /// made before of the same blocks with the same `tag` at `at`.
    pub fn apply(&mut self, at: usize, blocks: &mut crate::api::SharedBlocks, tag: &[usize], rewrite: impl FnOnce(&mut Vec<ContentBlock>)) {
        if self.kept.len() <= at {
            self.kept.resize(at + 1, None);
        }
        if let Some((input, kept_tag, output)) = &self.kept[at]
            && input.same(blocks)
            && kept_tag == tag
        {
            *blocks = output.clone();
            return;
        }
        let input = blocks.clone();
        rewrite(blocks);
        self.kept[at] = Some((input, tag.to_vec(), blocks.clone()));
    }
}

/// [`finalize_tool_results`] of one message's blocks: each tool_result moved into its
/// finalized form ([`ContentBlock::finalized`]), its text not copied.
fn finalize_blocks(blocks: &mut [ContentBlock], check: bool) {
    for block in blocks.iter_mut() {
        if matches!(block, ContentBlock::ToolResult { .. }) {
            // (`Value::Null` holds nothing: the placeholder costs no allocation.)
            *block = std::mem::replace(block, ContentBlock::Other(Value::Null)).finalized();
            #[cfg(debug_assertions)]
            if check {
                block.check_finalized();
            }
        }
    }
    let _ = check;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// A record of one of the kinds normalization treats apart: prompts, meta text, tool
    /// results (MCP and Edit too), assistant replies, bubbling, in-loop and split attachments.
    fn record(kind: u8, n: u8, flag: bool) -> Record {
        let text = format!("t{n}");
        match kind % 8 {
            0 => Record::User { content: MessageContent::Text(text.into()), meta: flag },
            1 => Record::User { content: MessageContent::Blocks(vec![ContentBlock::text(text)].into()), meta: true },
            2 => Record::User {
                content: MessageContent::Blocks(vec![ContentBlock::tool_result(format!("id{}", n % 4), ToolResultContent::Text(text.into()), flag.then_some(true))].into()),
                meta: false,
            },
            3 => Record::Assistant { content: vec![ContentBlock::text(text)].into() },
            4 => Record::Assistant {
                content: vec![ContentBlock::tool_use(format!("id{}", n % 4), if flag { "mcp__s__t" } else { "Edit" }, json!({"file_path": text, "old_string": "a"}))].into(),
            },
            5 => Record::Attachment { attachment: Attachment::NestedMemory { path: format!("/p/{text}"), content: text }.into(), in_loop: flag },
            6 => Record::Attachment { attachment: Attachment::PostCompact { call: flag.then(|| "Read".into()), texts: vec![text.into()] }.into(), in_loop: false },
            _ => Record::User {
                content: MessageContent::Blocks(vec![ContentBlock::tool_result(format!("id{}", n % 4), ToolResultContent::Text(text.into()), None), ContentBlock::text("after")].into()),
                meta: false,
            },
        }
    }

    /// Normalizing every record, the way the memo's messages are defined.
    fn from_scratch(context: &str, records: &[Record], options: NormalizeOptions, finish: bool) -> Vec<Message> {
        let context = Record::User { content: MessageContent::Text(context.to_owned().into()), meta: true };
        let mut messages = normalize_refs(std::iter::once(&context).chain(records).collect(), options);
        if finish {
            crate::agent::dialect::mcp_results_as_blocks(&mut messages);
            finalize_tool_results(&mut messages);
        }
        messages
    }

    proptest! {
        /// Request after request, the memo gives what normalizing every record gives, while the
        /// transcript grows, is rewritten in place (the chain's stages), cut and refilled (a
        /// compaction), has its in-loop attachments folded, or changes user context or options.
        ///
        /// Each request's messages are handed back ([`MessageMemo::give_back`]) or not, as sent
        /// or changed the ways a request changes them (a message put in front, blocks rewritten,
        /// a text replaced, a marker, a message cut), and lent to the next request.
        #[test]
        fn memoized_messages_equal_normalizing_everything(
            ops in proptest::collection::vec((0u8..10, any::<u8>(), any::<u8>(), any::<bool>(), 0u8..7), 1..60),
            finish in any::<bool>(),
            raw_every in 0u8..4,
        ) {
            let mut memo = MessageMemo::default();
            let mut records: Vec<Record> = Vec::new();
            let mut context = SharedText::from("ctx");
            let mut options = NormalizeOptions { smoosh_into_tool_result: true, tool_loaded_sibling: true, strip_tool_references: false };
            let mut previous_raw: Option<(u64, Vec<Message>)> = None;
            for (op, a, b, flag, back) in ops {
                match op {
                    0..=4 => records.push(record(a, b, flag)),
                    5 if !records.is_empty() => {
                        let i = a as usize % records.len();
                        records[i] = record(b, a, flag);
                        memo.invalidate_from(i);
                    }
                    6 => {
                        let keep = if records.is_empty() { 0 } else { a as usize % records.len() };
                        records.truncate(keep);
                        records.push(record(0, b, true));
                        memo.invalidate_from(keep);
                    }
                    7 => {
                        for (i, r) in records.iter_mut().enumerate() {
                            if let Record::Attachment { in_loop: in_loop @ true, .. } = r {
                                *in_loop = false;
                                memo.invalidate_from(i);
                            }
                        }
                    }
                    8 => context = format!("ctx{}", a % 2).into(),
                    _ => options.smoosh_into_tool_result = flag,
                }
                // The raw view asked for on every request, on none, or now and then.
                let raw = match raw_every {
                    0 => false,
                    1 => true,
                    _ => (a ^ b) % raw_every == 0,
                };
                let front = (back % 3 == 0).then(|| Message::user_text(format!("listing{a}")));
                let front_len = usize::from(front.is_some());
                let (mut got, start) = memo.messages(&context, &records, options, finish, front, raw);
                if raw {
                    prop_assert_eq!(memo.raw(), Some(&from_scratch(&context, &records, options, false)[..]));
                    // The messages it says it carried over are the previous view's own.
                    let RawView { messages: view, stamp, shared } = memo.raw_stamped().expect("asked for");
                    if let Some((before, n)) = shared {
                        let (previous_stamp, previous) = previous_raw.as_ref().expect("a view before");
                        prop_assert_eq!(before, *previous_stamp);
                        prop_assert!(n <= previous.len() && n <= view.len());
                        prop_assert!(view[..n].iter().zip(&previous[..n]).all(|(a, b)| same_message(a, b)));
                    }
                    previous_raw = Some((stamp, view.to_vec()));
                } else {
                    previous_raw = None;
                }
                if finish {
                    finalize_tool_results(&mut got[start..]);
                }
                prop_assert_eq!(&got[front_len..], &from_scratch(&context, &records, options, finish)[..]);
                let at = a as usize % got.len().max(1);
                // The first message changed; the count handed back is no higher (any lower one
                // is allowed: it costs only the comparison).
                let changed_from = match back {
                    0 => continue,
                    1 => got.len(),
                    2 if front_len == 0 => {
                        got.insert(0, Message::user_text("listing"));
                        memo.give_back(got, 1, 0);
                        continue;
                    }
                    2 => got.len(),
                    3 => {
                        if let Some(MessageContent::Blocks(blocks)) = got.get_mut(at).map(|m| &mut m.content) {
                            blocks.push(ContentBlock::text("changed"));
                        }
                        at
                    }
                    4 => {
                        if let Some(MessageContent::Text(text)) = got.get_mut(at).map(|m| &mut m.content) {
                            text.push('!');
                        }
                        at
                    }
                    5 => {
                        let end = (at + 1).min(got.len());
                        mark_last_block(&mut got[..end], CacheControl::ephemeral());
                        end.saturating_sub(1)
                    }
                    _ => {
                        got.truncate(at);
                        at
                    }
                };
                let unchanged = if flag { changed_from } else { b as usize % (changed_from + 1) };
                memo.give_back(got, front_len, unchanged);
            }
        }
    }
}
