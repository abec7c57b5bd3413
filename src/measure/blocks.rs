//! A request as the provider's cache sees it: an ordered list of block positions.
//!
//! **What counts as one block position** (the documentation does not define it; this is our
//! reading, used consistently by the simulator and the 20-position lookback):
//! - each tool definition in `tools` is one position (server tools too);
//! - each system text block is one position; a string `system` is one position;
//! - each content block of each message is one position; a string `content` is one position
//!   (the same as one text block with that text);
//! - blocks nested inside a tool_result (text, image, tool_reference) are part of their
//!   tool_result's position, not positions of their own.
//!
//! The prefix hash at a position chains every earlier position, in the order
//! tools → system → messages. Two request-level settings that the documentation lists as
//! invalidating a level are folded into the chain where that level starts: `tool_choice`
//! before the system level, `thinking` before the messages level. The model is not in the
//! chain: the simulator keeps a separate namespace per model.

use std::fmt;

use serde_json::Value;

use crate::api::canonical::{chain, hash128, to_canonical_bytes, write_canonical};
use crate::api::{CacheControl, ContentBlock, MessageContent, Request, Role, SystemPrompt, ToolResultContent};

use super::tokens::{TokenCounter, TokenUnit};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Region {
    Tools,
    System,
    Messages,
}

impl Region {
    pub fn as_str(self) -> &'static str {
        match self {
            Region::Tools => "tools",
            Region::System => "system",
            Region::Messages => "messages",
        }
    }
}

/// Where a block sits in the body: `tools[3]`, `system[2]`, `messages[7].content[0]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockPath {
    pub region: Region,
    pub index: usize,
    /// The content index inside a message (messages only).
    pub content: Option<usize>,
}

impl fmt::Display for BlockPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.content {
            Some(c) => write!(f, "{}[{}].content[{}]", self.region.as_str(), self.index, c),
            None => write!(f, "{}[{}]", self.region.as_str(), self.index),
        }
    }
}

/// One block position of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptBlock {
    pub path: BlockPath,
    pub role: Option<Role>,
    /// `tool`, `system_text`, or the content block's wire type.
    pub kind: String,
    /// Hash of the block's canonical bytes (without its `cache_control`), with its role.
    pub hash: u128,
    /// Hash of the whole prefix up to and including this block.
    pub prefix_hash: u128,
    pub tokens: u32,
    /// Length of the block's canonical bytes.
    pub bytes: u32,
    pub cache_control: Option<CacheControl>,
    /// Whether the automatic (top-level) marker may land here: not thinking, not an empty text.
    pub auto_eligible: bool,
    /// A tool_result's `cache_reference` (cached microcompact: the server may delete it).
    pub cache_reference: Option<String>,
    /// The `cache_reference`s a `cache_edits` block deletes.
    pub cache_deletes: Vec<String>,
}

/// The block view of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatRequest {
    pub model: String,
    pub blocks: Vec<PromptBlock>,
    /// Top-level automatic `cache_control`, if any.
    pub auto_cache_control: Option<CacheControl>,
    pub total_tokens: u64,
    pub counts: RegionCounts,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegionCounts {
    pub tools: usize,
    pub system: usize,
    pub messages: usize,
}

impl FlatRequest {
    /// Cumulative tokens through position `i` (inclusive).
    pub fn tokens_through(&self, i: usize) -> u64 {
        self.blocks[..=i].iter().map(|b| u64::from(b.tokens)).sum()
    }

    /// Context tokens in a region.
    pub fn region_tokens(&self, region: Region) -> u64 {
        self.blocks.iter().filter(|b| b.path.region == region).map(|b| u64::from(b.tokens)).sum()
    }
}

const SEED: &[u8] = b"ctxsim-prefix-v1";

fn tagged_hash(tag: &[u8], bytes: &[u8]) -> u128 {
    let mut buf = Vec::with_capacity(tag.len() + 1 + bytes.len());
    buf.extend_from_slice(tag);
    buf.push(0);
    buf.extend_from_slice(bytes);
    hash128(&buf)
}

/// Writes `tag`, a separator and the block's canonical bytes (without its marker) into `buf`,
/// returning the hash and the length of the block's bytes.
fn block_hash<T: serde::Serialize + Clone>(buf: &mut Vec<u8>, tag: &[u8], block: &T, marked: bool, unmark: impl FnOnce(&mut T)) -> (u128, u32) {
    buf.clear();
    buf.extend_from_slice(tag);
    buf.push(0);
    let start = buf.len();
    if marked {
        let mut copy = block.clone();
        unmark(&mut copy);
        write_canonical(&copy, buf);
    } else {
        write_canonical(block, buf);
    }
    (hash128(buf), (buf.len() - start) as u32)
}

/// The strings and flat counts whose estimate is a content block's token count.
pub fn content_token_units(block: &ContentBlock) -> Vec<TokenUnit> {
    match block {
        ContentBlock::Text { text, .. } => vec![TokenUnit::Text(text.clone())],
        ContentBlock::Image(_) | ContentBlock::Document(_) => vec![TokenUnit::Fixed(2000)],
        ContentBlock::ToolUse { name, input, .. } | ContentBlock::ServerToolUse { name, input, .. } => {
            let json = serde_json::to_string(input).unwrap_or_default();
            vec![TokenUnit::Text(format!("{name}{json}"))]
        }
        ContentBlock::ToolResult { content, .. } => match content {
            None => Vec::new(),
            Some(ToolResultContent::Text(text)) => vec![TokenUnit::Text(text.clone())],
            Some(ToolResultContent::Blocks(blocks)) => blocks.iter().flat_map(content_token_units).collect(),
        },
        ContentBlock::Thinking { thinking, .. } => vec![TokenUnit::Text(thinking.clone())],
        ContentBlock::RedactedThinking { data, .. } => vec![TokenUnit::Text(data.clone())],
        ContentBlock::ToolReference { .. } | ContentBlock::Other(_) => {
            vec![TokenUnit::Text(serde_json::to_string(block).unwrap_or_default())]
        }
    }
}

/// Flattens a request into block positions, counting tokens with `counter`.
pub fn flatten(request: &Request, counter: &mut TokenCounter, family: &str) -> FlatRequest {
    flatten_reusing(request, counter, family, None)
}

/// A request flattened before, whose unchanged blocks need not be serialized again.
#[derive(Clone, Copy)]
pub struct Previous<'a> {
    pub request: &'a Request,
    pub flat: &'a FlatRequest,
}

/// The (hash, tokens, bytes) of a block that is equal (including its marker) to the block at
/// the same path of the previous request.
type Known = (u128, u32, u32);

struct Reuse<'a> {
    previous: Option<Previous<'a>>,
    /// Index into `previous.flat.blocks` of each previous message's first block.
    message_starts: Vec<usize>,
}

impl<'a> Reuse<'a> {
    fn new(previous: Option<Previous<'a>>) -> Self {
        let mut message_starts = Vec::new();
        if let Some(p) = previous {
            let mut position = p.flat.counts.tools + p.flat.counts.system;
            for message in &p.request.messages {
                message_starts.push(position);
                position += message.content.block_count();
            }
        }
        Reuse { previous, message_starts }
    }

    fn known(&self, position: usize) -> Option<Known> {
        let block = &self.previous?.flat.blocks[position];
        Some((block.hash, block.tokens, block.bytes))
    }

    fn tool(&self, i: usize, tool: &crate::api::Tool) -> Option<Known> {
        let p = self.previous?;
        (p.request.tools().get(i)? == tool).then(|| self.known(i)).flatten()
    }

    fn system(&self, i: usize, block: &crate::api::SystemBlock) -> Option<Known> {
        let p = self.previous?;
        let same = match &p.request.system {
            Some(SystemPrompt::Blocks(blocks)) => blocks.get(i) == Some(block),
            Some(SystemPrompt::Text(text)) => i == 0 && block.cache_control.is_none() && block.extra.is_empty() && *text == block.text,
            None => false,
        };
        same.then(|| self.known(p.flat.counts.tools + i)).flatten()
    }

    fn content(&self, m: usize, c: usize, role: Role, block: &ContentBlock) -> Option<Known> {
        let p = self.previous?;
        let message = p.request.messages.get(m)?;
        if message.role != role {
            return None;
        }
        let same = match &message.content {
            MessageContent::Blocks(blocks) => blocks.get(c) == Some(block),
            MessageContent::Text(text) => {
                c == 0 && matches!(block, ContentBlock::Text { text: t, cache_control: None, extra } if t == text && extra.is_empty())
            }
        };
        same.then(|| self.known(self.message_starts[m] + c)).flatten()
    }
}

/// Flattens a request, taking the hash and token count of every block that is unchanged from
/// `previous` (same path, equal value) instead of serializing it again. The result is the same
/// as [`flatten`]'s; only the work differs.
pub fn flatten_reusing(request: &Request, counter: &mut TokenCounter, family: &str, previous: Option<Previous<'_>>) -> FlatRequest {
    let reuse = Reuse::new(previous);
    let mut blocks = Vec::with_capacity(previous.map_or(64, |p| p.flat.blocks.len() + 8));
    let mut state = hash128(SEED);
    let mut counts = RegionCounts::default();

    let mut buf = Vec::with_capacity(4096);
    for (i, tool) in request.tools().iter().enumerate() {
        let (hash, tokens, bytes) = match reuse.tool(i, tool) {
            Some(known) => known,
            None => {
                let (hash, bytes) = block_hash(&mut buf, b"tool", tool, tool.cache_control.is_some(), |t| t.cache_control = None);
                // The tool's JSON follows the 5-byte tag ("tool" and a separator) in `buf`.
                let tokens = counter.count(hash, family, || vec![TokenUnit::Text(String::from_utf8_lossy(&buf[5..]).into_owned())]);
                (hash, tokens, bytes)
            }
        };
        state = chain(state, hash);
        blocks.push(PromptBlock {
            path: BlockPath { region: Region::Tools, index: i, content: None },
            role: None,
            kind: "tool".to_owned(),
            hash,
            prefix_hash: state,
            tokens,
            bytes,
            cache_control: tool.cache_control.clone(),
            auto_eligible: true,
            cache_reference: None,
            cache_deletes: Vec::new(),
        });
        counts.tools += 1;
    }

    if let Some(choice) = &request.tool_choice {
        state = chain(state, tagged_hash(b"tool_choice", &to_canonical_bytes(choice)));
    }
    let single;
    let system: &[crate::api::SystemBlock] = match &request.system {
        None => &[],
        Some(SystemPrompt::Text(text)) => {
            single = [crate::api::SystemBlock::text(text.clone())];
            &single
        }
        Some(SystemPrompt::Blocks(blocks)) => blocks,
    };
    for (i, block) in system.iter().enumerate() {
        let (hash, tokens, bytes) = match reuse.system(i, block) {
            Some(known) => known,
            None => {
                let (hash, bytes) = block_hash(&mut buf, b"system", block, block.cache_control.is_some(), |b| b.cache_control = None);
                let tokens = counter.count(hash, family, || vec![TokenUnit::Text(block.text.clone())]);
                (hash, tokens, bytes)
            }
        };
        state = chain(state, hash);
        blocks.push(PromptBlock {
            path: BlockPath { region: Region::System, index: i, content: None },
            role: None,
            kind: "system_text".to_owned(),
            hash,
            prefix_hash: state,
            tokens,
            bytes,
            cache_control: block.cache_control.clone(),
            auto_eligible: !block.text.is_empty(),
            cache_reference: None,
            cache_deletes: Vec::new(),
        });
        counts.system += 1;
    }

    if let Some(thinking) = &request.thinking {
        state = chain(state, tagged_hash(b"thinking", &to_canonical_bytes(thinking)));
    }
    for (m, message) in request.messages.iter().enumerate() {
        let owned;
        let content: &[ContentBlock] = match &message.content {
            MessageContent::Text(text) => {
                owned = [ContentBlock::text(text.clone())];
                &owned
            }
            MessageContent::Blocks(blocks) => blocks,
        };
        for (c, block) in content.iter().enumerate() {
            let marker = block.raw_cache_control();
            let (cache_reference, cache_deletes) = cache_edit_fields(block);
            let (hash, tokens, bytes) = match reuse.content(m, c, message.role, block) {
                Some(known) => known,
                None => {
                    // Like `cache_control`, a tool_result's `cache_reference` is an address for
                    // the server, not prompt content: the prefix key leaves it out.
                    let unmark = marker.is_some() || cache_reference.is_some();
                    let (hash, bytes) = block_hash(&mut buf, message.role.as_str().as_bytes(), block, unmark, |b| {
                        match b {
                            ContentBlock::ToolResult { extra, .. } => {
                                extra.remove("cache_reference");
                            }
                            ContentBlock::Other(Value::Object(map)) => {
                                map.remove("cache_reference");
                            }
                            _ => {}
                        }
                        if !b.set_cache_control(None)
                            && let ContentBlock::Other(Value::Object(map)) = b
                        {
                            map.remove("cache_control");
                        }
                    });
                    let tokens = counter.count(hash, family, || content_token_units(block));
                    (hash, tokens, bytes)
                }
            };
            state = chain(state, hash);
            let empty_text = matches!(block, ContentBlock::Text { text, .. } if text.is_empty());
            blocks.push(PromptBlock {
                path: BlockPath { region: Region::Messages, index: m, content: Some(c) },
                role: Some(message.role),
                kind: block.kind().to_owned(),
                hash,
                prefix_hash: state,
                tokens,
                bytes,
                cache_control: marker,
                auto_eligible: !block.is_thinking() && !empty_text,
                cache_reference,
                cache_deletes,
            });
            counts.messages += 1;
        }
    }

    let total_tokens = blocks.iter().map(|b| u64::from(b.tokens)).sum();
    FlatRequest {
        model: request.model.clone(),
        blocks,
        auto_cache_control: request.cache_control.clone(),
        total_tokens,
        counts,
    }
}

/// A tool_result's `cache_reference`, and the references a `cache_edits` block deletes.
fn cache_edit_fields(block: &ContentBlock) -> (Option<String>, Vec<String>) {
    match block {
        ContentBlock::ToolResult { extra, .. } => (extra.get("cache_reference").and_then(Value::as_str).map(str::to_owned), Vec::new()),
        ContentBlock::Other(value) if value.get("type").and_then(Value::as_str) == Some("tool_result") => {
            (value.get("cache_reference").and_then(Value::as_str).map(str::to_owned), Vec::new())
        }
        ContentBlock::Other(value) if value.get("type").and_then(Value::as_str) == Some("cache_edits") => {
            let deletes = value
                .get("edits")
                .and_then(Value::as_array)
                .map(|edits| {
                    edits
                        .iter()
                        .filter(|e| e.get("type").and_then(Value::as_str) == Some("delete"))
                        .filter_map(|e| e.get("cache_reference").and_then(Value::as_str).map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            (None, deletes)
        }
        _ => (None, Vec::new()),
    }
}

/// Reads a request body from JSON with a JSON path in the error.
pub fn parse_request(value: Value) -> Result<Request, String> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." { e.inner().to_string() } else { format!("{path}: {}", e.inner()) }
    })
}
