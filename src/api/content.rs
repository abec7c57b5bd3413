use std::ops::{Deref, DerefMut};
use std::sync::{Arc, OnceLock};

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::request::CacheControl;

/// `content` of a message: a plain string or a list of content blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(SharedText),
    Blocks(SharedBlocks),
}

/// A message's text content, shared by every body that sends the message as
/// [`SharedBlocks`] are: cloning one is a reference count, and two bodies holding the same
/// allocation compare for the price of a pointer. Reading goes through `Deref` (a `String`);
/// changing through `DerefMut`, which copies the text first when another body still holds it.
/// Serializes (and debug-prints) as the string it holds.
///
/// The text also keeps its length in UTF-16 units once asked ([`SharedText::utf16_len`]): the
/// long-context chain of every run of a session counts the same texts. And the structural hash
/// of the first block that held it and asked ([`block_hash_kept`]): every run of a session
/// sends the same prompts and tool outputs in lists of its own. And its xxh3-128 once asked
/// ([`SharedText::xxh3_128`]). Every change drops them.
#[derive(Clone, Default)]
pub struct SharedText(Arc<Held>);

/// The text behind [`SharedText`] and its memo of its length.
#[derive(Default)]
struct Held {
    text: String,
    utf16: OnceLock<usize>,
    /// [`block_hash_kept`]'s hash of a block holding the text, with what else it hashed.
    block_hash: OnceLock<Box<KeptHash>>,
    /// The text with a tail appended ([`SharedText::append`] of a text another body holds),
    /// with that tail: normalization appends the seam's line break to the same prompt or user
    /// context on every request, and each copy appended to shares this one.
    appended: OnceLock<(Box<str>, SharedText)>,
    /// The text's xxh3-128 ([`SharedText::xxh3_128`]).
    xxh3: OnceLock<u128>,
}

impl Held {
    fn new(text: String) -> Held {
        Held { text, utf16: OnceLock::new(), block_hash: OnceLock::new(), appended: OnceLock::new(), xxh3: OnceLock::new() }
    }

    /// The text is about to change: what is kept of it goes.
    fn forget(&mut self) {
        self.utf16.take();
        self.block_hash.take();
        self.appended.take();
        self.xxh3.take();
    }
}

/// The structural hash of a block whose hash is a function of its text and of this key alone
/// (see [`block_hash_kept`]).
#[derive(Debug, PartialEq)]
struct KeptHash {
    tag: &'static str,
    /// The block's kind and its fields besides the text (and the marker, which the hash leaves
    /// out): `(modelled kind, tool_use_id, is_error)`, the id empty for a text block.
    kind: &'static str,
    final_form: bool,
    tool_use_id: String,
    is_error: Option<bool>,
    hash: (u128, u32),
}

/// [`super::structural::block_hash`]`(tag, block)`, kept with the block's text where the
/// hash is a function of that text and of a few small fields alone: a text block, or a
/// tool_result with string content, with no `extra` key (the hash leaves the marker out). The
/// first such block to ask keeps its hash with the text; a block holding the same text
/// allocation with the same fields reads it (another is hashed). Debug builds hash again and
/// compare.
pub fn block_hash_kept(tag: &'static str, block: &ContentBlock) -> (u128, u32) {
    let hash = || super::structural::block_hash(tag.as_bytes(), block);
    let (text, final_form, tool_use_id, is_error) = match block {
        ContentBlock::Text { text, extra, .. } if extra.is_empty() => (text, false, "", None),
        ContentBlock::ToolResult { tool_use_id, content: Some(ToolResultContent::Text(text)), is_error, extra, .. } if extra.is_empty() => {
            (text, false, tool_use_id.as_str(), *is_error)
        }
        ContentBlock::FinalToolResult { tool_use_id, content: Some(ToolResultContent::Text(text)), is_error, extra, .. } if extra.is_empty() => {
            (text, true, tool_use_id.as_str(), *is_error)
        }
        _ => return hash(),
    };
    let kind = block.modelled_kind().unwrap_or_default();
    let kept = text.0.block_hash.get_or_init(|| Box::new(KeptHash { tag, kind, final_form, tool_use_id: tool_use_id.to_owned(), is_error, hash: hash() }));
    if kept.tag == tag && kept.kind == kind && kept.final_form == final_form && kept.tool_use_id == tool_use_id && kept.is_error == is_error {
        debug_assert_eq!(kept.hash, hash(), "a hash kept with the text differs from hashing the block");
        kept.hash
    } else {
        hash()
    }
}

/// A copy (copy on write) is about to change: it starts without the memo.
impl Clone for Held {
    fn clone(&self) -> Held {
        Held::new(self.text.clone())
    }
}

impl std::fmt::Debug for SharedText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.0.text.as_str(), f)
    }
}

impl SharedText {
    /// Whether both hold the same allocation (then they are equal; unequal allocations may
    /// still hold equal texts).
    pub fn same(&self, other: &SharedText) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Appends `tail`: in place when no other body holds the text, else the text becomes the
    /// copy with `tail` the shared text keeps for the first tail asked (made with room for it,
    /// where a change through `DerefMut` would copy the text, then grow it): every copy of a
    /// text appended the same tail then shares one text, its kept length and hash with it.
    pub fn append(&mut self, tail: &str) {
        match Arc::get_mut(&mut self.0) {
            Some(held) => {
                held.forget();
                held.text.push_str(tail);
            }
            None => {
                let made = || {
                    let mut text = String::with_capacity(self.0.text.len() + tail.len());
                    text.push_str(&self.0.text);
                    text.push_str(tail);
                    SharedText::from(text)
                };
                let (kept_tail, kept) = self.0.appended.get_or_init(|| (tail.into(), made()));
                let appended = if **kept_tail == *tail { kept.clone() } else { made() };
                debug_assert!(appended.strip_suffix(tail) == Some(self.0.text.as_str()), "a kept appended text is not the text and its tail");
                *self = appended;
            }
        }
    }

    /// The text, taken without a copy when no other body holds it.
    pub fn into_string(self) -> String {
        Arc::try_unwrap(self.0).map_or_else(|shared| shared.text.clone(), |held| held.text)
    }

    /// [`crate::measure::tokens::utf16_len`] of the text, counted the first time it is asked and kept
    /// with the text.
    pub fn utf16_len(&self) -> usize {
        let units = *self.0.utf16.get_or_init(|| crate::measure::tokens::utf16_len(&self.0.text));
        debug_assert_eq!(units, crate::measure::tokens::utf16_len(&self.0.text), "a kept UTF-16 length differs from counting the text");
        units
    }

    /// The text's xxh3-128, hashed the first time it is asked and kept with the text: the
    /// compaction loss judgements of a session's runs key the same restored files by it
    /// (`replay::loss`).
    pub fn xxh3_128(&self) -> u128 {
        let hash = *self.0.xxh3.get_or_init(|| xxhash_rust::xxh3::xxh3_128(self.0.text.as_bytes()));
        debug_assert_eq!(hash, xxhash_rust::xxh3::xxh3_128(self.0.text.as_bytes()), "a kept xxh3 differs from hashing the text");
        hash
    }
}

impl Deref for SharedText {
    type Target = String;
    fn deref(&self) -> &String {
        &self.0.text
    }
}

impl DerefMut for SharedText {
    fn deref_mut(&mut self) -> &mut String {
        let held = Arc::make_mut(&mut self.0);
        held.forget();
        &mut held.text
    }
}

impl From<String> for SharedText {
    fn from(text: String) -> SharedText {
        SharedText(Arc::new(Held::new(text)))
    }
}

impl From<&String> for SharedText {
    fn from(text: &String) -> SharedText {
        SharedText::from(text.clone())
    }
}

impl From<&str> for SharedText {
    fn from(text: &str) -> SharedText {
        SharedText::from(text.to_owned())
    }
}

impl From<SharedText> for String {
    fn from(text: SharedText) -> String {
        text.into_string()
    }
}

impl PartialEq for SharedText {
    fn eq(&self, other: &SharedText) -> bool {
        self.same(other) || self.0.text == other.0.text
    }
}

impl Eq for SharedText {}

impl PartialEq<str> for SharedText {
    fn eq(&self, other: &str) -> bool {
        self.0.text.as_str() == other
    }
}

impl PartialEq<&str> for SharedText {
    fn eq(&self, other: &&str) -> bool {
        self.0.text.as_str() == *other
    }
}

impl PartialEq<String> for SharedText {
    fn eq(&self, other: &String) -> bool {
        self.0.text == *other
    }
}

impl std::fmt::Display for SharedText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.text)
    }
}

impl Serialize for SharedText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0.text)
    }
}

impl<'de> Deserialize<'de> for SharedText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<SharedText, D::Error> {
        String::deserialize(deserializer).map(SharedText::from)
    }
}

/// The blocks of a message, shared by every body that sends the message: cloning one is a
/// reference count, so consecutive requests of a session hold the unchanged history once.
/// Reading goes through `Deref` (a `Vec<ContentBlock>`); changing through `DerefMut`, which
/// copies the blocks first when another body still holds them (copy on write), so a change
/// never reaches an earlier body. Serializes as the list it holds.
///
/// The list also keeps its blocks' structural hashes once a flattener asked for them
/// ([`SharedBlocks::block_hashes`]), and the agent's rough token count of them once a run
/// asked ([`SharedBlocks::rough_tokens`]): the replays of one session (as recorded, its
/// checkpoints, its what-ifs) send the same messages again and again. Every change drops both.
///
/// Debug-prints as the list it holds: the memo is filled by whichever flattener asks first
/// (another thread's, another run's), and a value's printed form is compared in debug checks
/// (`Scenario::into_world_with`).
#[derive(Clone, Default)]
pub struct SharedBlocks(Arc<Listed>);

impl std::fmt::Debug for SharedBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.blocks.fmt(f)
    }
}

/// The list behind [`SharedBlocks`] and its memos (hashes, rough count).
#[derive(Debug, Default)]
struct Listed {
    blocks: Vec<ContentBlock>,
    /// [`block_hash`](super::structural::block_hash) of each block under the tag (the
    /// message's role) it was asked for first.
    hashes: OnceLock<(&'static str, Box<[(u128, u32)]>)>,
    /// The agent's rough token count of the blocks ([`SharedBlocks::rough_tokens`]).
    rough: OnceLock<u64>,
}

impl Listed {
    fn new(blocks: Vec<ContentBlock>) -> Listed {
        Listed { blocks, hashes: OnceLock::new(), rough: OnceLock::new() }
    }

    /// The blocks are about to change: the memos go.
    fn forget(&mut self) {
        self.hashes.take();
        self.rough.take();
    }
}

/// A copy (copy on write) is about to change: it starts without the memo.
impl Clone for Listed {
    fn clone(&self) -> Listed {
        Listed::new(self.blocks.clone())
    }
}

impl SharedBlocks {
    /// Whether both hold the same allocation (then they are identical; unequal allocations
    /// may still hold equal blocks).
    pub fn same(&self, other: &SharedBlocks) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The blocks, taken without a copy when no other body holds them.
    pub fn into_vec(self) -> Vec<ContentBlock> {
        Arc::try_unwrap(self.0).map_or_else(|shared| shared.blocks.clone(), |listed| listed.blocks)
    }

    /// The blocks in place, the memos dropped (they are about to change). `None`
    /// when another body holds them.
    fn unique_mut(&mut self) -> Option<&mut Vec<ContentBlock>> {
        let listed = Arc::get_mut(&mut self.0)?;
        listed.forget();
        Some(&mut listed.blocks)
    }

    /// Takes the first block out (there must be one) and keeps at most `keep` of the blocks
    /// after it. No block is copied when no other body holds the list; when one does, only the
    /// first block and the kept ones are (where a change through `DerefMut` copies them all).
    pub fn take_first(&mut self, keep: usize) -> ContentBlock {
        match self.unique_mut() {
            Some(blocks) => {
                let first = blocks.remove(0);
                blocks.truncate(keep);
                first
            }
            None => {
                let first = self.0.blocks[0].clone();
                let end = self.0.blocks.len().min(keep.saturating_add(1));
                *self = SharedBlocks::from(self.0.blocks[1..end].to_vec());
                first
            }
        }
    }

    /// Puts `block` before the others, copying them only when another body holds them (into
    /// a list of their length plus one, where `DerefMut` and `insert` copy and then grow).
    pub fn insert_first(&mut self, block: ContentBlock) {
        match self.unique_mut() {
            Some(blocks) => blocks.insert(0, block),
            None => {
                let mut blocks = Vec::with_capacity(self.0.blocks.len() + 1);
                blocks.push(block);
                blocks.extend(self.0.blocks.iter().cloned());
                *self = SharedBlocks::from(blocks);
            }
        }
    }

    /// [`block_hash`](super::structural::block_hash)`(tag, block)` of each block, computed
    /// the first time they are asked for and kept with the list (under that `tag`; another
    /// tag's are computed each time).
    pub fn block_hashes(&self, tag: &'static str) -> std::borrow::Cow<'_, [(u128, u32)]> {
        let hash_all = || self.0.blocks.iter().map(|block| block_hash_kept(tag, block)).collect();
        let (kept_tag, hashes) = self.0.hashes.get_or_init(|| (tag, hash_all()));
        if *kept_tag == tag { std::borrow::Cow::Borrowed(hashes) } else { std::borrow::Cow::Owned(hash_all().into_vec()) }
    }

    /// The agent's rough token count of the blocks (`agent::compact::counting::rough_message`,
    /// the one `count` every caller passes), counted the first time it is asked and kept with
    /// the list: the runs of a session (its what-ifs, each from its own entries) count the
    /// same scripted replies, whose tool inputs are walked whole.
    pub fn rough_tokens(&self, count: impl FnOnce(&[ContentBlock]) -> u64) -> u64 {
        *self.0.rough.get_or_init(|| count(&self.0.blocks))
    }
}

impl Deref for SharedBlocks {
    type Target = Vec<ContentBlock>;
    fn deref(&self) -> &Vec<ContentBlock> {
        &self.0.blocks
    }
}

impl DerefMut for SharedBlocks {
    fn deref_mut(&mut self) -> &mut Vec<ContentBlock> {
        let listed = Arc::make_mut(&mut self.0);
        listed.forget();
        &mut listed.blocks
    }
}

impl From<Vec<ContentBlock>> for SharedBlocks {
    fn from(blocks: Vec<ContentBlock>) -> Self {
        SharedBlocks(Arc::new(Listed::new(blocks)))
    }
}

impl FromIterator<ContentBlock> for SharedBlocks {
    fn from_iter<I: IntoIterator<Item = ContentBlock>>(iter: I) -> Self {
        SharedBlocks::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> IntoIterator for &'a SharedBlocks {
    type Item = &'a ContentBlock;
    type IntoIter = std::slice::Iter<'a, ContentBlock>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.blocks.iter()
    }
}

impl<'a> IntoIterator for &'a mut SharedBlocks {
    type Item = &'a mut ContentBlock;
    type IntoIter = std::slice::IterMut<'a, ContentBlock>;
    fn into_iter(self) -> Self::IntoIter {
        self.deref_mut().iter_mut()
    }
}

impl PartialEq for SharedBlocks {
    fn eq(&self, other: &Self) -> bool {
        self.same(other) || self.0.blocks == other.0.blocks
    }
}

impl PartialEq<Vec<ContentBlock>> for SharedBlocks {
    fn eq(&self, other: &Vec<ContentBlock>) -> bool {
        self.0.blocks == *other
    }
}

impl Serialize for SharedBlocks {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.blocks.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for SharedBlocks {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<ContentBlock>::deserialize(deserializer).map(SharedBlocks::from)
    }
}

impl MessageContent {
    /// Whether both hold the same allocation, of the same kind (then they are identical;
    /// unequal allocations may still hold equal content).
    pub fn same(&self, other: &MessageContent) -> bool {
        match (self, other) {
            (MessageContent::Blocks(a), MessageContent::Blocks(b)) => a.same(b),
            (MessageContent::Text(a), MessageContent::Text(b)) => a.same(b),
            _ => false,
        }
    }

    /// The content as blocks; a string is one text block.
    pub fn to_blocks(&self) -> Vec<ContentBlock> {
        match self {
            MessageContent::Text(text) => vec![ContentBlock::text(text.clone())],
            MessageContent::Blocks(blocks) => blocks.to_vec(),
        }
    }

    /// The content as blocks, in place: a string becomes one text block first.
    pub fn blocks_mut(&mut self) -> &mut Vec<ContentBlock> {
        if let MessageContent::Text(text) = self {
            *self = MessageContent::Blocks(vec![ContentBlock::text(std::mem::take(text))].into());
        }
        match self {
            MessageContent::Blocks(blocks) => blocks,
            MessageContent::Text(_) => unreachable!("turned into blocks above"),
        }
    }

    /// [`SharedBlocks::take_first`] of the content's blocks (a string is one text block).
    pub fn take_first_block(&mut self, keep: usize) -> ContentBlock {
        if let MessageContent::Text(text) = self {
            let first = ContentBlock::text(std::mem::take(text));
            *self = MessageContent::Blocks(SharedBlocks::default());
            return first;
        }
        match self {
            MessageContent::Blocks(blocks) => blocks.take_first(keep),
            MessageContent::Text(_) => unreachable!("taken above"),
        }
    }

    /// [`SharedBlocks::insert_first`] into the content's blocks (a string becomes one text
    /// block first).
    pub fn insert_first_block(&mut self, block: ContentBlock) {
        if let MessageContent::Text(text) = self {
            *self = MessageContent::Blocks(vec![block, ContentBlock::text(std::mem::take(text))].into());
            return;
        }
        if let MessageContent::Blocks(blocks) = self {
            blocks.insert_first(block);
        }
    }

    /// The content as blocks, taking it (a string is one text block).
    pub fn into_blocks(self) -> Vec<ContentBlock> {
        match self {
            MessageContent::Text(text) => vec![ContentBlock::text(text)],
            MessageContent::Blocks(blocks) => blocks.into_vec(),
        }
    }

    /// The text the content carries: the string, or its text blocks joined by newlines.
    pub fn joined_text(&self) -> String {
        match self {
            MessageContent::Text(text) => text.to_string(),
            MessageContent::Blocks(blocks) => blocks
                .iter()
                .filter_map(|b| if let ContentBlock::Text { text, .. } = b { Some(text.as_str()) } else { None })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    pub fn block_count(&self) -> usize {
        match self {
            MessageContent::Text(_) => 1,
            MessageContent::Blocks(blocks) => blocks.len(),
        }
    }
}

/// `content` of a tool_result: a string or a list of blocks (text, image, document,
/// tool_reference, search_result, ...). The string is a [`SharedText`]: a tool's output is
/// held once by the script, the record, the messages built from it and every copy of a
/// block list that holds it (a list copied on write to mark or finalize one of its blocks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolResultContent {
    Text(SharedText),
    Blocks(Vec<ContentBlock>),
}

/// The text blocks of `blocks` joined with newlines (other blocks left out).
pub fn joined_text(blocks: &[ContentBlock]) -> String {
    blocks
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl ToolResultContent {
    /// Total characters of the text it carries (strings and text blocks).
    pub fn text_len(&self) -> usize {
        match self {
            ToolResultContent::Text(text) => text.len(),
            ToolResultContent::Blocks(blocks) => blocks
                .iter()
                .map(|b| match b {
                    ContentBlock::Text { text, .. } => text.len(),
                    _ => 0,
                })
                .sum(),
        }
    }
}

/// Source-carrying blocks: `image` and `document`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageLike {
    /// Shared: a source holds the whole base64 data, and a copy of a message's blocks (a
    /// change to another block, a checkpoint's conversation) takes a count, not the bytes.
    #[serde(default)]
    pub source: crate::api::SharedValue,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<CacheControl>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One content block of a message. Kinds the simulator does not reason about (server tool
/// results, search results, containers, compaction blocks, ...) are kept verbatim as `Other`.
#[derive(Debug, Clone, PartialEq)]
pub enum ContentBlock {
    /// The text is a [`SharedText`]: a prompt or an attachment's text is held once by the
    /// record, the messages built from it and every copy of a block list holding it.
    Text { text: SharedText, cache_control: Option<CacheControl>, extra: Map<String, Value> },
    Image(ImageLike),
    Document(ImageLike),
    ToolUse { id: String, name: String, input: Value, cache_control: Option<CacheControl>, extra: Map<String, Value> },
    ServerToolUse { id: String, name: String, input: Value, cache_control: Option<CacheControl>, extra: Map<String, Value> },
    ToolResult {
        tool_use_id: String,
        content: Option<ToolResultContent>,
        is_error: Option<bool>,
        cache_control: Option<CacheControl>,
        extra: Map<String, Value>,
    },
    /// A tool_result as the agent sends it ([`ContentBlock::finalized`]): written in the
    /// reference client's key order (`tool_use_id, type, content[, is_error]`, or `type,
    /// content, is_error, tool_use_id` for an error; then `extra`, then `cache_control`), its
    /// content kept as it was (the text shared, not copied). Every reader treats it as the raw
    /// JSON object of that order ([`ContentBlock::wire_value`]) would be read as an
    /// [`ContentBlock::Other`]: its marker is read by [`ContentBlock::raw_cache_control`] only
    /// (`cache_control` gives `None` and `set_cache_control` refuses it, as for raw JSON).
    FinalToolResult {
        tool_use_id: String,
        content: Option<ToolResultContent>,
        is_error: Option<bool>,
        cache_control: Option<CacheControl>,
        extra: Map<String, Value>,
    },
    Thinking { thinking: String, signature: String, extra: Map<String, Value> },
    RedactedThinking { data: String, extra: Map<String, Value> },
    ToolReference { tool_name: String, extra: Map<String, Value> },
    Other(Value),
}

impl ContentBlock {
    pub fn text(text: impl Into<SharedText>) -> Self {
        ContentBlock::Text { text: text.into(), cache_control: None, extra: Map::new() }
    }

    pub fn tool_use(id: impl Into<String>, name: impl Into<String>, input: Value) -> Self {
        ContentBlock::ToolUse { id: id.into(), name: name.into(), input, cache_control: None, extra: Map::new() }
    }

    pub fn tool_result(tool_use_id: impl Into<String>, content: ToolResultContent, is_error: Option<bool>) -> Self {
        ContentBlock::ToolResult {
            tool_use_id: tool_use_id.into(),
            content: Some(content),
            is_error,
            cache_control: None,
            extra: Map::new(),
        }
    }

    pub fn thinking(thinking: impl Into<String>, signature: impl Into<String>) -> Self {
        ContentBlock::Thinking { thinking: thinking.into(), signature: signature.into(), extra: Map::new() }
    }

    /// The wire `type` of the block.
    pub fn kind(&self) -> &str {
        match self {
            ContentBlock::Other(value) => value.get("type").and_then(Value::as_str).unwrap_or("unknown"),
            modelled => modelled.modelled_kind().unwrap_or("unknown"),
        }
    }

    /// The wire `type` of a modelled kind; `None` for [`ContentBlock::Other`], whose type is
    /// whatever its JSON says.
    pub fn modelled_kind(&self) -> Option<&'static str> {
        Some(match self {
            ContentBlock::Text { .. } => "text",
            ContentBlock::Image(_) => "image",
            ContentBlock::Document(_) => "document",
            ContentBlock::ToolUse { .. } => "tool_use",
            ContentBlock::ServerToolUse { .. } => "server_tool_use",
            ContentBlock::ToolResult { .. } | ContentBlock::FinalToolResult { .. } => "tool_result",
            ContentBlock::Thinking { .. } => "thinking",
            ContentBlock::RedactedThinking { .. } => "redacted_thinking",
            ContentBlock::ToolReference { .. } => "tool_reference",
            ContentBlock::Other(_) => return None,
        })
    }

    pub fn cache_control(&self) -> Option<&CacheControl> {
        match self {
            ContentBlock::Text { cache_control, .. }
            | ContentBlock::ToolUse { cache_control, .. }
            | ContentBlock::ServerToolUse { cache_control, .. }
            | ContentBlock::ToolResult { cache_control, .. } => cache_control.as_ref(),
            ContentBlock::Image(inner) | ContentBlock::Document(inner) => inner.cache_control.as_ref(),
            ContentBlock::Thinking { .. } | ContentBlock::RedactedThinking { .. } | ContentBlock::ToolReference { .. } => None,
            // As its raw JSON form: the marker is a key of the object.
            ContentBlock::FinalToolResult { .. } | ContentBlock::Other(_) => None,
        }
    }

    /// Sets or clears the marker. Returns false for kinds that cannot carry one (thinking,
    /// redacted_thinking, tool_reference, unmodelled kinds) and for a finalized tool_result (as
    /// for its raw JSON form).
    pub fn set_cache_control(&mut self, value: Option<CacheControl>) -> bool {
        match self {
            ContentBlock::Text { cache_control, .. }
            | ContentBlock::ToolUse { cache_control, .. }
            | ContentBlock::ServerToolUse { cache_control, .. }
            | ContentBlock::ToolResult { cache_control, .. } => {
                *cache_control = value;
                true
            }
            ContentBlock::Image(inner) | ContentBlock::Document(inner) => {
                inner.cache_control = value;
                true
            }
            _ => false,
        }
    }

    /// Cache control read from an unmodelled block's raw JSON (used by measurement, which must
    /// honour markers on any block kind the API accepts them on).
    pub fn raw_cache_control(&self) -> Option<CacheControl> {
        match self {
            ContentBlock::Other(value) => value.get("cache_control").and_then(|cc| {
                // Read in place: the same deserializer over a borrowed value.
                let read = CacheControl::deserialize(cc).ok();
                debug_assert_eq!(read, serde_json::from_value(cc.clone()).ok(), "a marker read in place reads as its copy does");
                read
            }),
            // (Its raw JSON form's marker reads back as the marker written: checked by
            // `finalized`.)
            ContentBlock::FinalToolResult { cache_control, .. } => cache_control.clone(),
            _ => self.cache_control().cloned(),
        }
    }

    pub fn is_thinking(&self) -> bool {
        matches!(self, ContentBlock::Thinking { .. } | ContentBlock::RedactedThinking { .. })
    }

    /// A tool_result as the agent sends it, in the reference client's key order: a
    /// [`ContentBlock::FinalToolResult`] holding the same fields (nothing copied), or, where
    /// its serialization would not be the raw JSON object's (an `extra` key that is also a
    /// field, at any depth: the object keeps one of the two), that object as an
    /// [`ContentBlock::Other`]. Other blocks are returned as they are.
    pub fn finalized(self) -> ContentBlock {
        let ContentBlock::ToolResult { tool_use_id, content, is_error, cache_control, extra } = self else { return self };
        let typed = ContentBlock::FinalToolResult { tool_use_id, content, is_error, cache_control, extra };
        if !typed.writes_each_key_once() {
            return ContentBlock::Other(typed.wire_value().expect("a tool_result has a wire form"));
        }
        typed
    }

    /// Debug builds' check of a finalized tool_result ([`ContentBlock::finalized`]): it
    /// serializes, hashes (markers left out and kept) and gives its marker as its raw JSON
    /// object does.
    #[cfg(debug_assertions)]
    pub fn check_finalized(&self) {
        if !matches!(self, ContentBlock::FinalToolResult { .. }) {
            return;
        }
        let value = ContentBlock::Other(self.wire_value().expect("a tool_result has a wire form"));
        assert_eq!(serde_json::to_string(self).ok(), serde_json::to_string(&value).ok(), "a finalized tool_result serializes as its raw JSON");
        assert_eq!(super::structural::block_hash(b"user", self), super::structural::block_hash(b"user", &value), "and hashes as it");
        assert_eq!(super::structural::sha256_hex(self), super::structural::sha256_hex(&value), "markers included");
        assert_eq!(self.raw_cache_control(), value.raw_cache_control(), "its marker reads as the raw JSON's");
    }

    /// The raw JSON object a tool_result is sent as, in the reference client's key order
    /// (see [`ContentBlock::FinalToolResult`]); `None` for other blocks.
    pub fn wire_value(&self) -> Option<Value> {
        let (ContentBlock::ToolResult { tool_use_id, content, is_error, cache_control, extra }
        | ContentBlock::FinalToolResult { tool_use_id, content, is_error, cache_control, extra }) = self
        else {
            return None;
        };
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
        Some(Value::Object(map))
    }

    /// Whether the block serializes as the JSON object `serde_json::to_value` makes of it
    /// does: no key written twice (an `extra` key that is also a field of the block or of a
    /// marker, or of a block in a tool_result's content, which the object holds once).
    /// Conservative: a field not written (a marker or content left out) still counts.
    pub fn writes_each_key_once(&self) -> bool {
        fn free_of(extra: &Map<String, Value>, keys: &[&str]) -> bool {
            keys.iter().all(|key| !extra.contains_key(*key))
        }
        fn marker(cc: &Option<CacheControl>) -> bool {
            cc.as_ref().is_none_or(|cc| free_of(&cc.extra, &["type", "ttl", "scope"]))
        }
        match self {
            ContentBlock::Text { cache_control, extra, .. } => free_of(extra, &["type", "text", "cache_control"]) && marker(cache_control),
            ContentBlock::Image(inner) | ContentBlock::Document(inner) => {
                free_of(&inner.extra, &["type", "source", "cache_control"]) && marker(&inner.cache_control)
            }
            ContentBlock::ToolUse { cache_control, extra, .. } | ContentBlock::ServerToolUse { cache_control, extra, .. } => {
                free_of(extra, &["type", "id", "name", "input", "cache_control"]) && marker(cache_control)
            }
            ContentBlock::ToolResult { content, cache_control, extra, .. } | ContentBlock::FinalToolResult { content, cache_control, extra, .. } => {
                free_of(extra, &["type", "tool_use_id", "content", "is_error", "cache_control"])
                    && marker(cache_control)
                    && match content {
                        Some(ToolResultContent::Blocks(blocks)) => blocks.iter().all(ContentBlock::writes_each_key_once),
                        _ => true,
                    }
            }
            ContentBlock::Thinking { extra, .. } => free_of(extra, &["type", "thinking", "signature"]),
            ContentBlock::RedactedThinking { extra, .. } => free_of(extra, &["type", "data"]),
            ContentBlock::ToolReference { extra, .. } => free_of(extra, &["type", "tool_name"]),
            ContentBlock::Other(_) => true,
        }
    }
}

#[derive(Serialize)]
struct TextRepr<'a> {
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: &'a Option<CacheControl>,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

#[derive(Serialize)]
struct ToolUseRepr<'a> {
    id: &'a str,
    name: &'a str,
    input: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: &'a Option<CacheControl>,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

#[derive(Serialize)]
struct ToolResultRepr<'a> {
    tool_use_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: &'a Option<ToolResultContent>,
    #[serde(skip_serializing_if = "Option::is_none")]
    is_error: &'a Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: &'a Option<CacheControl>,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

#[derive(Serialize)]
struct ThinkingRepr<'a> {
    thinking: &'a str,
    signature: &'a str,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

#[derive(Serialize)]
struct Tagged<'a, T: Serialize> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(flatten)]
    inner: T,
}

#[derive(Serialize)]
struct RedactedRepr<'a> {
    data: &'a str,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

#[derive(Serialize)]
struct ToolReferenceRepr<'a> {
    tool_name: &'a str,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

impl Serialize for ContentBlock {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let kind = self.kind();
        match self {
            ContentBlock::Text { text, cache_control, extra } => {
                Tagged { kind, inner: TextRepr { text, cache_control, extra } }.serialize(serializer)
            }
            ContentBlock::Image(inner) | ContentBlock::Document(inner) => Tagged { kind, inner }.serialize(serializer),
            ContentBlock::ToolUse { id, name, input, cache_control, extra }
            | ContentBlock::ServerToolUse { id, name, input, cache_control, extra } => {
                Tagged { kind, inner: ToolUseRepr { id, name, input, cache_control, extra } }.serialize(serializer)
            }
            ContentBlock::ToolResult { tool_use_id, content, is_error, cache_control, extra } => Tagged {
                kind,
                inner: ToolResultRepr { tool_use_id, content, is_error, cache_control, extra },
            }
            .serialize(serializer),
            ContentBlock::FinalToolResult { tool_use_id, content, is_error, cache_control, extra } => {
                // As `Value::Object` of [`ContentBlock::wire_value`] serializes: a map of
                // its length, its entries in order.
                use serde::ser::SerializeMap as _;
                let len = 2 + usize::from(content.is_some()) + usize::from(is_error.is_some()) + extra.len() + usize::from(cache_control.is_some());
                let mut map = serializer.serialize_map(Some(len))?;
                if *is_error == Some(true) {
                    map.serialize_entry("type", kind)?;
                    if let Some(content) = content {
                        map.serialize_entry("content", content)?;
                    }
                    map.serialize_entry("is_error", &true)?;
                    map.serialize_entry("tool_use_id", tool_use_id)?;
                } else {
                    map.serialize_entry("tool_use_id", tool_use_id)?;
                    map.serialize_entry("type", kind)?;
                    if let Some(content) = content {
                        map.serialize_entry("content", content)?;
                    }
                    if let Some(flag) = is_error {
                        map.serialize_entry("is_error", flag)?;
                    }
                }
                for (key, value) in extra {
                    map.serialize_entry(key, value)?;
                }
                if let Some(cc) = cache_control {
                    map.serialize_entry("cache_control", cc)?;
                }
                map.end()
            }
            ContentBlock::Thinking { thinking, signature, extra } => {
                Tagged { kind, inner: ThinkingRepr { thinking, signature, extra } }.serialize(serializer)
            }
            ContentBlock::RedactedThinking { data, extra } => {
                Tagged { kind, inner: RedactedRepr { data, extra } }.serialize(serializer)
            }
            ContentBlock::ToolReference { tool_name, extra } => {
                Tagged { kind, inner: ToolReferenceRepr { tool_name, extra } }.serialize(serializer)
            }
            ContentBlock::Other(value) => value.serialize(serializer),
        }
    }
}

/// The entries of a content block's JSON object, as [`ContentBlock::from_entries`] reads them:
/// a `Map`, or entries read otherwise (`recording::picked`) that give the same values in the
/// same order for the same operations.
pub(crate) trait BlockEntries {
    fn get(&self, key: &str) -> Option<&Value>;
    /// Removes `key` as `Map::remove` does (with `preserve_order`, a `swap_remove`: the last
    /// entry takes the removed one's place).
    fn remove(&mut self, key: &str) -> Option<Value>;
    /// The entries left, in their order.
    fn into_map(self) -> Map<String, Value>;
}

impl BlockEntries for Map<String, Value> {
    fn get(&self, key: &str) -> Option<&Value> {
        Map::get(self, key)
    }

    fn remove(&mut self, key: &str) -> Option<Value> {
        Map::remove(self, key)
    }

    fn into_map(self) -> Map<String, Value> {
        self
    }
}

fn take_string(map: &mut impl BlockEntries, key: &str, kind: &str) -> Result<String, String> {
    match map.remove(key) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!("{kind} block: field `{key}` must be a string, found {}", json_kind(&other))),
        None => Err(format!("{kind} block: missing field `{key}`")),
    }
}

fn take_cache_control(map: &mut impl BlockEntries, kind: &str) -> Result<Option<CacheControl>, String> {
    match map.remove("cache_control") {
        None | Some(Value::Null) => Ok(None),
        Some(value) => serde_json::from_value(value)
            .map(Some)
            .map_err(|e| format!("{kind} block: field `cache_control`: {e}")),
    }
}

pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl ContentBlock {
    /// Parses one block from JSON; unknown `type`s become `Other`.
    pub fn from_value(value: Value) -> Result<Self, String> {
        let Value::Object(map) = value else {
            return Err(format!("content block must be an object, found {}", json_kind(&value)));
        };
        Self::from_entries(map)
    }

    /// [`ContentBlock::from_value`] of an object, given as its entries.
    pub(crate) fn from_entries(mut map: impl BlockEntries) -> Result<Self, String> {
        let kind = match map.get("type") {
            Some(Value::String(kind)) => kind.clone(),
            Some(other) => return Err(format!("content block `type` must be a string, found {}", json_kind(other))),
            None => return Err("content block: missing field `type`".to_owned()),
        };
        let k = kind.as_str();
        let block = match k {
            "text" => {
                map.remove("type");
                let text = take_string(&mut map, "text", k)?;
                let cache_control = take_cache_control(&mut map, k)?;
                ContentBlock::Text { text: text.into(), cache_control, extra: map.into_map() }
            }
            "image" | "document" => {
                map.remove("type");
                let cache_control = take_cache_control(&mut map, k)?;
                let source = map.remove("source").unwrap_or(Value::Null);
                let inner = ImageLike { source: source.into(), cache_control, extra: map.into_map() };
                if k == "image" { ContentBlock::Image(inner) } else { ContentBlock::Document(inner) }
            }
            "tool_use" | "server_tool_use" => {
                map.remove("type");
                let id = take_string(&mut map, "id", k)?;
                let name = take_string(&mut map, "name", k)?;
                let input = map.remove("input").unwrap_or(Value::Object(Map::new()));
                let cache_control = take_cache_control(&mut map, k)?;
                if k == "tool_use" {
                    ContentBlock::ToolUse { id, name, input, cache_control, extra: map.into_map() }
                } else {
                    ContentBlock::ServerToolUse { id, name, input, cache_control, extra: map.into_map() }
                }
            }
            "tool_result" => {
                map.remove("type");
                let tool_use_id = take_string(&mut map, "tool_use_id", k)?;
                let content = match map.remove("content") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => Some(ToolResultContent::Text(s.into())),
                    Some(Value::Array(items)) => {
                        let mut blocks = Vec::with_capacity(items.len());
                        for (i, item) in items.into_iter().enumerate() {
                            blocks.push(ContentBlock::from_value(item).map_err(|e| format!("content[{i}]: {e}"))?);
                        }
                        Some(ToolResultContent::Blocks(blocks))
                    }
                    Some(other) => {
                        return Err(format!(
                            "tool_result block: field `content` must be a string or an array, found {}",
                            json_kind(&other)
                        ));
                    }
                };
                let is_error = match map.remove("is_error") {
                    None | Some(Value::Null) => None,
                    Some(Value::Bool(b)) => Some(b),
                    Some(other) => {
                        return Err(format!("tool_result block: field `is_error` must be a boolean, found {}", json_kind(&other)));
                    }
                };
                let cache_control = take_cache_control(&mut map, k)?;
                ContentBlock::ToolResult { tool_use_id, content, is_error, cache_control, extra: map.into_map() }
            }
            "thinking" => {
                map.remove("type");
                let thinking = take_string(&mut map, "thinking", k)?;
                let signature = match map.remove("signature") {
                    Some(Value::String(s)) => s,
                    _ => String::new(),
                };
                ContentBlock::Thinking { thinking, signature, extra: map.into_map() }
            }
            "redacted_thinking" => {
                map.remove("type");
                let data = take_string(&mut map, "data", k)?;
                ContentBlock::RedactedThinking { data, extra: map.into_map() }
            }
            "tool_reference" => {
                map.remove("type");
                let tool_name = take_string(&mut map, "tool_name", k)?;
                ContentBlock::ToolReference { tool_name, extra: map.into_map() }
            }
            _ => ContentBlock::Other(Value::Object(map.into_map())),
        };
        Ok(block)
    }
}

impl<'de> Deserialize<'de> for ContentBlock {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        ContentBlock::from_value(value).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod shared_blocks_tests {
    use super::*;
    use crate::api::identical::Identical;

    #[test]
    fn an_unmodelled_blocks_marker_reads_in_place_as_its_copy_does() {
        let markers = [
            serde_json::json!({"type": "ephemeral"}),
            serde_json::json!({"type": "ephemeral", "ttl": "1h", "scope": "global"}),
            serde_json::json!({"ttl": "5m", "note": [1, {"a": null}]}),
            serde_json::json!({"type": "ephemeral", "ttl": "2h"}),
            serde_json::json!("ephemeral"),
            serde_json::json!(null),
        ];
        let mut read = 0;
        for marker in markers {
            let block = ContentBlock::Other(serde_json::json!({"type": "container_upload", "file_id": "f", "cache_control": marker.clone()}));
            let copied: Option<CacheControl> = serde_json::from_value(marker).ok();
            read += usize::from(copied.is_some());
            assert_eq!(block.raw_cache_control(), copied);
        }
        assert_eq!(read, 3, "the markers that read, and those refused, as a copy reads them");
    }

    /// The kept UTF-16 length follows every change: in place, appended, through a copy.
    #[test]
    fn a_texts_kept_length_follows_its_changes() {
        let mut text = SharedText::from("a\u{1F600}é");
        assert_eq!(text.utf16_len(), 4);
        let shared = text.clone();
        text.append("bc");
        assert_eq!((text.utf16_len(), shared.utf16_len()), (6, 4), "appended to a copy; the shared text kept");
        text.append("d");
        assert_eq!(text.utf16_len(), 7, "appended in place");
        text.push('\u{1F600}');
        assert_eq!(text.utf16_len(), 9, "changed through DerefMut");
        let mut copy = text.clone();
        copy.clear();
        assert_eq!((copy.utf16_len(), text.utf16_len()), (0, 9));
    }

    #[test]
    fn a_change_copies_blocks_another_body_holds() {
        let original: SharedBlocks = vec![ContentBlock::text("a")].into();
        let mut changed = original.clone();
        assert!(changed.same(&original), "a clone shares the allocation");
        assert!(changed.identical(&original));
        changed.push(ContentBlock::text("b"));
        assert!(!changed.same(&original), "the change copied the shared blocks");
        assert_eq!(original.len(), 1, "the earlier body still holds what it sent");
        assert_eq!(changed.len(), 2);
        assert!(!changed.identical(&original));
        // Equal blocks in two allocations are identical too (compared block by block).
        let copy: SharedBlocks = vec![ContentBlock::text("a")].into();
        assert!(!copy.same(&original) && copy.identical(&original) && copy == original);
        // Serialized as the list it holds, and read back.
        let json = serde_json::to_string(&MessageContent::Blocks(changed.clone())).unwrap();
        assert_eq!(json, r#"[{"type":"text","text":"a"},{"type":"text","text":"b"}]"#);
        let back: MessageContent = serde_json::from_str(&json).unwrap();
        assert_eq!(back, MessageContent::Blocks(changed));
    }

    #[test]
    fn a_change_copies_text_another_body_holds() {
        let original = MessageContent::Text("prompt".into());
        let mut changed = original.clone();
        let (MessageContent::Text(a), MessageContent::Text(b)) = (&original, &mut changed) else { unreachable!() };
        assert!(a.same(b), "a clone shares the allocation");
        b.push('!');
        assert!(!a.same(b), "the change copied the shared text");
        assert_eq!((a.as_str(), b.as_str()), ("prompt", "prompt!"), "the earlier body still holds what it sent");
        assert!(!original.identical(&changed));
        // Equal texts in two allocations are equal and identical (compared byte by byte).
        let copy = MessageContent::Text(String::from("prompt").into());
        assert!(copy == original && copy.identical(&original));
        // Serialized and debug-printed as the string it holds, and read back as text.
        let json = serde_json::to_string(&changed).unwrap();
        assert_eq!(json, r#""prompt!""#);
        assert_eq!(format!("{changed:?}"), r#"Text("prompt!")"#);
        let back: MessageContent = serde_json::from_str(&json).unwrap();
        assert_eq!(back, changed);
    }

    /// A text block's and a tool result's text are shared by the copies of a block list (a
    /// list copied on write to change another of its blocks copies no text), a change to one
    /// copy's text leaves the others', and both serialize and print as the strings they hold.
    #[test]
    fn block_texts_are_shared_by_copies_of_their_list() {
        let json = r#"[{"type":"text","text":"a\"b"},{"type":"tool_result","tool_use_id":"t1","content":"out\nput"}]"#;
        let original: SharedBlocks = serde_json::from_str(json).unwrap();
        assert_eq!(serde_json::to_string(&original).unwrap(), json);
        let texts = |blocks: &SharedBlocks| -> Vec<SharedText> {
            blocks
                .iter()
                .filter_map(|b| match b {
                    ContentBlock::Text { text, .. } | ContentBlock::ToolResult { content: Some(ToolResultContent::Text(text)), .. } => Some(text.clone()),
                    _ => None,
                })
                .collect()
        };
        let mut marked = original.clone();
        marked[0].set_cache_control(Some(CacheControl::ephemeral()));
        assert!(!marked.same(&original), "the change copied the list");
        assert!(texts(&marked).iter().zip(texts(&original)).all(|(a, b)| a.same(&b)), "not its texts");
        let ContentBlock::ToolResult { content: Some(ToolResultContent::Text(text)), .. } = &mut marked[1] else { unreachable!() };
        text.push('!');
        assert_eq!(texts(&original).iter().map(|t| t.as_str()).collect::<Vec<_>>(), ["a\"b", "out\nput"]);
        assert_eq!(texts(&marked)[1].as_str(), "out\nput!");
        assert_eq!(format!("{:?}", original[0]), r#"Text { text: "a\"b", cache_control: None, extra: {} }"#);
        assert!(format!("{:?}", original[1]).contains(r#"Text("out\nput")"#));
        // Appending to a shared text copies it; to one no other body holds, in place.
        let mut appended = texts(&original)[0].clone();
        appended.append("\n");
        assert_eq!((texts(&original)[0].as_str(), appended.as_str()), ("a\"b", "a\"b\n"));
        // Another copy appended the same tail shares that copy; another tail makes its own, and
        // a change to the shared one copies it (the kept one stays as made).
        let mut again = texts(&original)[0].clone();
        again.append("\n");
        assert!(again.same(&appended), "a second append of the same tail copied the text again");
        let mut other = texts(&original)[0].clone();
        other.append("\n\n");
        assert_eq!(other.as_str(), "a\"b\n\n");
        again.push('!');
        assert_eq!((again.as_str(), appended.as_str()), ("a\"b\n!", "a\"b\n"));
        let mut third = texts(&original)[0].clone();
        third.append("\n");
        assert!(third.same(&appended) && third.as_str() == "a\"b\n");
        let mut own = SharedText::from(String::with_capacity(8));
        own.append("a");
        let before = own.as_ptr();
        own.append("c");
        assert_eq!((own.as_str(), own.as_ptr()), ("ac", before));
    }

    /// A list prints as the blocks it holds, whether or not a flattener filled its memo of
    /// hashes (debug checks compare printed values across runs and threads).
    #[test]
    fn a_list_prints_as_its_blocks_whatever_its_memo_holds() {
        let blocks: SharedBlocks = vec![ContentBlock::text("a")].into();
        let before = format!("{blocks:?}");
        let _ = blocks.block_hashes("user");
        assert_eq!(format!("{blocks:?}"), before);
        assert_eq!(before, format!("{:?}", vec![ContentBlock::text("a")]));
    }

    #[test]
    fn taking_the_first_block_leaves_other_bodies_as_they_were() {
        let blocks = || -> SharedBlocks { ["r", "a", "b", "c"].into_iter().map(ContentBlock::text).collect() };
        for keep in [0, 1, 2, 3, 7, usize::MAX] {
            let expected: Vec<ContentBlock> = ["a", "b", "c"].into_iter().take(keep).map(ContentBlock::text).collect();
            // Held by no other body: taken in place.
            let mut own = blocks();
            assert_eq!(own.take_first(keep), ContentBlock::text("r"));
            assert_eq!(*own, expected);
            // Held by another body: that one keeps all four.
            let other = blocks();
            let mut shared = other.clone();
            assert_eq!(shared.take_first(keep), ContentBlock::text("r"));
            assert_eq!(*shared, expected, "keep {keep}");
            assert!(!shared.same(&other));
            assert_eq!(other.len(), 4);
        }
        let mut text = MessageContent::Text("r".into());
        assert_eq!(text.take_first_block(usize::MAX), ContentBlock::text("r"));
        assert_eq!(text.block_count(), 0);
    }

    /// One change to a list of blocks, for the memo's proptest.
    #[derive(Debug, Clone)]
    enum Change {
        Push(String),
        Pop,
        TakeFirst(usize),
        InsertFirst(String),
        /// A change through `&mut SharedBlocks`'s iterator: every text block gains `x`.
        Iterate,
        /// Another body takes a reference (the next change copies on write).
        Share,
        Hash(bool),
    }

    fn change() -> impl proptest::strategy::Strategy<Value = Change> {
        use proptest::prelude::*;
        prop_oneof![
            "[a-c]{0,3}".prop_map(Change::Push),
            Just(Change::Pop),
            (0usize..4).prop_map(Change::TakeFirst),
            "[a-c]{0,3}".prop_map(Change::InsertFirst),
            Just(Change::Iterate),
            Just(Change::Share),
            any::<bool>().prop_map(Change::Hash),
        ]
    }

    proptest::proptest! {
        /// The hashes a list keeps are the hashes of what it holds after any sequence of
        /// changes, whether another body holds the list or not, and a body that held the list
        /// before a change keeps its own blocks' hashes.
        #[test]
        fn kept_block_hashes_follow_every_change(changes in proptest::collection::vec(change(), 0..24)) {
            let fresh = |blocks: &SharedBlocks, tag: &'static str| -> Vec<(u128, u32)> {
                blocks.iter().map(|block| crate::api::structural::block_hash(tag.as_bytes(), block)).collect()
            };
            let mut blocks: SharedBlocks = vec![ContentBlock::text("x")].into();
            let mut others: Vec<(SharedBlocks, Vec<ContentBlock>)> = Vec::new();
            for change in changes {
                match change {
                    Change::Push(text) => blocks.push(ContentBlock::text(text)),
                    Change::Pop => { blocks.pop(); }
                    Change::TakeFirst(keep) => if !blocks.is_empty() { blocks.take_first(keep); },
                    Change::InsertFirst(text) => blocks.insert_first(ContentBlock::text(text)),
                    Change::Iterate => for block in &mut blocks {
                        if let ContentBlock::Text { text, .. } = block { text.push('x'); }
                    },
                    Change::Share => others.push((blocks.clone(), blocks.to_vec())),
                    Change::Hash(user) => {
                        let tag = if user { "user" } else { "assistant" };
                        proptest::prop_assert_eq!(blocks.block_hashes(tag).into_owned(), fresh(&blocks, tag));
                    }
                }
            }
            for tag in ["user", "assistant"] {
                proptest::prop_assert_eq!(blocks.block_hashes(tag).into_owned(), fresh(&blocks, tag));
                for (other, held) in &others {
                    proptest::prop_assert_eq!(&**other, held);
                    proptest::prop_assert_eq!(other.block_hashes(tag).into_owned(), fresh(other, tag));
                }
            }
        }
    }

    proptest::proptest! {
        /// The same for a request's shared lists (tools, system blocks): what a list keeps is
        /// the hashes of what it holds, and of what another body holds.
        #[test]
        fn kept_system_block_hashes_follow_every_change(changes in proptest::collection::vec(change(), 0..24)) {
            use crate::api::{SharedVec, SystemBlock};
            let fresh = |list: &SharedVec<SystemBlock>, tag: &'static [u8]| -> Vec<(u128, u32)> {
                list.iter().map(|block| crate::api::structural::block_hash(tag, block)).collect()
            };
            let mut list: SharedVec<SystemBlock> = vec![SystemBlock::text("x")].into();
            let mut others: Vec<(SharedVec<SystemBlock>, Vec<SystemBlock>)> = Vec::new();
            for change in changes {
                match change {
                    Change::Push(text) | Change::InsertFirst(text) => list.push(SystemBlock::text(text)),
                    Change::Pop | Change::TakeFirst(_) => { list.pop(); }
                    Change::Iterate => for block in list.iter_mut() { block.text.push('x'); },
                    Change::Share => others.push((list.clone(), list.to_vec())),
                    Change::Hash(system) => {
                        let tag: &'static [u8] = if system { b"system" } else { b"tool" };
                        proptest::prop_assert_eq!(list.block_hashes(tag).into_owned(), fresh(&list, tag));
                    }
                }
            }
            for tag in [&b"system"[..], b"tool"] {
                proptest::prop_assert_eq!(list.block_hashes(tag).into_owned(), fresh(&list, tag));
                for (other, held) in &others {
                    proptest::prop_assert_eq!(&**other, held);
                    proptest::prop_assert_eq!(other.block_hashes(tag).into_owned(), fresh(other, tag));
                }
            }
        }
    }

    #[test]
    fn inserting_a_first_block_leaves_other_bodies_as_they_were() {
        let other: SharedBlocks = vec![ContentBlock::text("a"), ContentBlock::text("b")].into();
        let mut shared = other.clone();
        shared.insert_first(ContentBlock::text("r"));
        let mut own: SharedBlocks = vec![ContentBlock::text("a"), ContentBlock::text("b")].into();
        own.insert_first(ContentBlock::text("r"));
        let expected = vec![ContentBlock::text("r"), ContentBlock::text("a"), ContentBlock::text("b")];
        assert_eq!(*shared, expected);
        assert_eq!(*own, expected);
        assert_eq!(other.len(), 2);
        let mut text = MessageContent::Text("a".into());
        text.insert_first_block(ContentBlock::text("r"));
        let mut blocks = MessageContent::Text("a".into());
        blocks.blocks_mut().insert(0, ContentBlock::text("r"));
        assert_eq!(text, blocks);
    }
}

#[cfg(test)]
mod final_tool_result_tests {
    use super::*;
    use crate::api::identical::Identical;
    use crate::api::{CacheScope, CacheTtl};
    use proptest::prelude::*;

    /// A JSON value of every kind, numbers of each encoding included.
    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            "[a-z\"\\\\é\n]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(2, 8, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                proptest::collection::vec(("[a-c]{1,2}", inner), 0..3).prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    /// `extra` keys, some of them a field of a tool_result, a block or a marker.
    fn extra() -> impl Strategy<Value = Map<String, Value>> {
        let key = prop_oneof![
            4 => "x[a-c]".prop_map(String::from),
            1 => Just("cache_reference".to_owned()),
            1 => proptest::sample::select(vec!["type", "content", "is_error", "tool_use_id", "cache_control", "text", "ttl", "source"]).prop_map(str::to_owned),
        ];
        proptest::collection::vec((key, json()), 0..3).prop_map(|entries| entries.into_iter().collect())
    }

    fn marker() -> impl Strategy<Value = Option<CacheControl>> {
        let ttl = prop_oneof![Just(None), Just(Some(CacheTtl::FiveMinutes)), Just(Some(CacheTtl::OneHour))];
        let scope = prop_oneof![Just(None), Just(Some(CacheScope::Global))];
        proptest::option::of((ttl, scope, extra()).prop_map(|(ttl, scope, extra)| CacheControl { extra, ..CacheControl::ephemeral().with_ttl(ttl).with_scope(scope) }))
    }

    /// A block of a tool_result's content.
    fn item() -> impl Strategy<Value = ContentBlock> {
        prop_oneof![
            ("[a-z \n\"]{0,8}", marker(), extra()).prop_map(|(text, cache_control, extra)| ContentBlock::Text { text: text.into(), cache_control, extra }),
            (json(), marker()).prop_map(|(source, cache_control)| ContentBlock::Image(ImageLike { source: source.into(), cache_control, extra: Map::new() })),
            "[a-z]{1,5}".prop_map(|tool_name| ContentBlock::ToolReference { tool_name, extra: Map::new() }),
            json().prop_map(|value| ContentBlock::Other(serde_json::json!({"type": "search_result", "v": value}))),
        ]
    }

    /// A tool_result as the agent builds one: error or not, text or blocks, extra keys, marker.
    fn tool_result() -> impl Strategy<Value = ContentBlock> {
        let content = proptest::option::of(prop_oneof![
            "[a-z \n\"é]{0,12}".prop_map(|text| ToolResultContent::Text(text.into())),
            proptest::collection::vec(item(), 0..3).prop_map(ToolResultContent::Blocks),
        ]);
        let is_error = prop_oneof![Just(None), Just(Some(true)), Just(Some(false))];
        ("[a-z0-9_]{0,6}", content, is_error, marker(), extra()).prop_map(|(tool_use_id, content, is_error, cache_control, extra)| {
            ContentBlock::ToolResult { tool_use_id, content, is_error, cache_control, extra }
        })
    }

    proptest! {
        /// A finalized tool_result is written, hashed (markers left out and kept), counted and
        /// read as the raw JSON object of the reference client's key order it replaced
        /// (`wire_value`, the object every finalized result was before).
        #[test]
        fn a_finalized_result_is_its_raw_json_to_every_reader(block in tool_result()) {
            let raw = ContentBlock::Other(block.wire_value().unwrap());
            let finalized = block.clone().finalized();
            #[cfg(debug_assertions)]
            finalized.check_finalized();
            prop_assert_eq!(matches!(finalized, ContentBlock::FinalToolResult { .. }), block.writes_each_key_once());
            prop_assert_eq!(serde_json::to_string(&finalized).unwrap(), serde_json::to_string(&raw).unwrap());
            for tag in [&b"user"[..], b"assistant"] {
                prop_assert_eq!(crate::api::structural::block_hash(tag, &finalized), crate::api::structural::block_hash(tag, &raw));
            }
            prop_assert_eq!(crate::api::structural::sha256_hex(&finalized), crate::api::structural::sha256_hex(&raw));
            prop_assert_eq!(crate::measure::blocks::content_token_units(&finalized), crate::measure::blocks::content_token_units(&raw));
            prop_assert_eq!(finalized.raw_cache_control(), raw.raw_cache_control());
            prop_assert_eq!((finalized.kind(), finalized.cache_control(), finalized.is_thinking()), (raw.kind(), raw.cache_control(), raw.is_thinking()));
            prop_assert!(finalized.identical(&raw) && raw.identical(&finalized) && finalized.identical(&finalized.clone()));
            let mut unmarkable = finalized.clone();
            prop_assert!(!unmarkable.set_cache_control(None));
            prop_assert_eq!(&unmarkable, &finalized);
            // Its text is the one it was given, not a copy.
            if let (ContentBlock::ToolResult { content: Some(ToolResultContent::Text(a)), .. }, ContentBlock::FinalToolResult { content: Some(ToolResultContent::Text(b)), .. }) = (&block, &finalized) {
                prop_assert!(a.same(b));
            }
        }
    }

    proptest! {
        /// A hash kept with a text is the hash of every block that reads it: blocks of other
        /// kinds, tags, ids, error flags and markers holding the same text, in any order, and
        /// after the text changed (in place, appended, through a copy).
        #[test]
        fn a_hash_kept_with_a_text_is_each_blocks_hash(
            results in proptest::collection::vec(tool_result(), 1..6),
            picks in proptest::collection::vec((0usize..8, any::<bool>(), 0usize..3), 1..24),
        ) {
            let hash = |tag: &'static str, block: &ContentBlock| crate::api::structural::block_hash(tag.as_bytes(), block);
            let mut text = SharedText::from("shared\ntext");
            for (which, user, change) in picks {
                let tag = if user { "user" } else { "assistant" };
                let mut block = results[which % results.len()].clone();
                if let ContentBlock::ToolResult { content, .. } = &mut block {
                    *content = Some(ToolResultContent::Text(text.clone()));
                }
                let block = match which {
                    6 => ContentBlock::text(text.clone()),
                    7 => ContentBlock::Text { text: text.clone(), cache_control: Some(CacheControl::ephemeral()), extra: Map::new() },
                    _ if which % 2 == 0 => block.finalized(),
                    _ => block,
                };
                prop_assert_eq!(block_hash_kept(tag, &block), hash(tag, &block));
                match change {
                    0 => {}
                    // Appended to a copy: the block holds the text as it was.
                    1 => {
                        text.append("+");
                        prop_assert_eq!(block_hash_kept(tag, &block), hash(tag, &block));
                    }
                    // Changed in place, no block holding it any more: what was kept goes.
                    _ => {
                        drop(block);
                        text.push('!');
                    }
                }
            }
        }
    }

    /// Keys that are also fields keep the raw JSON form: the object holds each key once.
    #[test]
    fn a_result_whose_extra_repeats_a_field_stays_raw_json() {
        let mut block = ContentBlock::tool_result("t1", ToolResultContent::Text("out".into()), None);
        assert!(matches!(block.clone().finalized(), ContentBlock::FinalToolResult { .. }));
        if let ContentBlock::ToolResult { extra, .. } = &mut block {
            extra.insert("type".into(), Value::from("x"));
        }
        let raw = block.clone().finalized();
        assert!(matches!(raw, ContentBlock::Other(_)));
        assert_eq!(serde_json::to_string(&raw).unwrap(), r#"{"tool_use_id":"t1","type":"x","content":"out"}"#);
        let text = ContentBlock::Text { text: "a".into(), cache_control: None, extra: [("text".to_owned(), Value::from("b"))].into_iter().collect() };
        let nested = ContentBlock::tool_result("t2", ToolResultContent::Blocks(vec![text]), Some(true));
        assert!(matches!(nested.finalized(), ContentBlock::Other(_)), "a repeated key in its content too");
        assert!(matches!(ContentBlock::text("a").finalized(), ContentBlock::Text { .. }), "other blocks are left as they are");
    }
}
