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
//!
//! Late-2026 API (reference/current-client-and-api.md §1.1–§1.4), also folded in
//! ([`HeadFolds`]): the top-level `output_config.effort`, where the messages level starts (an
//! effort change invalidates the messages like a thinking change; effort carried by a
//! `role:"system"` message is message content and changes nothing before it); and, at the very
//! start, whether a tool is defined by value in a system message while `tools` holds no
//! non-deferred tool (the definition then opens the rendered prompt: one full miss on the
//! request that first carries it). A `role:"system"` message's blocks are positions like any
//! message's (its role is part of their hash); one with empty content (an effort-only message)
//! renders nothing and has none.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::api::canonical::{chain, hash128, to_canonical_bytes};
use crate::api::structural::block_hash;
use crate::api::{CacheControl, ContentBlock, Message, MessageContent, Request, Role, SystemPrompt, ToolResultContent};

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

impl BlockPath {
    /// The path as [`fmt::Display`] writes it, built at its size without the formatting
    /// machinery: every request's prefix report names the block its cache read ends at (and
    /// where it diverged), ~1,200 instructions a path through `to_string`.
    pub fn render(&self) -> String {
        let mut digits = itoa::Buffer::new();
        let mut out = String::with_capacity(48);
        out.push_str(self.region.as_str());
        out.push('[');
        out.push_str(digits.format(self.index));
        out.push(']');
        if let Some(c) = self.content {
            out.push_str(".content[");
            out.push_str(digits.format(c));
            out.push(']');
        }
        debug_assert_eq!(out, self.to_string(), "a rendered block path differs from its Display");
        out
    }
}

/// One block position of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptBlock {
    pub path: BlockPath,
    pub role: Option<Role>,
    /// `tool`, `system_text`, or the content block's wire type.
    pub kind: Cow<'static, str>,
    /// Hash of the block's canonical bytes (without its `cache_control`), with its role.
    pub hash: u128,
    /// Hash of the whole prefix up to and including this block.
    pub prefix_hash: u128,
    /// Tokens of the whole prefix up to and including this block (see [`FlatRequest::recount`]).
    pub prefix_tokens: u64,
    pub tokens: u32,
    /// Length of the block's canonical bytes.
    pub bytes: u32,
    /// The block's marker. Shared, as `cache_reference`: a marker is a string and a map, and
    /// copying it with every record copy would allocate.
    pub cache_control: Option<Arc<CacheControl>>,
    /// Whether the automatic (top-level) marker may land here: not thinking, not an empty text.
    pub auto_eligible: bool,
    /// A tool_result's `cache_reference` (cached microcompact: the server may delete it).
    /// Shared: a record is copied whole when a request's records are (a salted or extended
    /// copy of the last one's), and a reference count is all a copy of it costs.
    pub cache_reference: Option<Arc<str>>,
    /// The `cache_reference`s a `cache_edits` block deletes (`None`: it deletes none, or it is
    /// not a `cache_edits` block). Shared, as `cache_reference`.
    pub cache_deletes: Option<Arc<[String]>>,
}

/// The block view of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatRequest {
    pub model: String,
    /// Shared with the flattener, which extends it in place for the next request when nothing
    /// else holds it (copy on write).
    pub blocks: Arc<Vec<PromptBlock>>,
    /// Top-level automatic `cache_control`, if any.
    pub auto_cache_control: Option<CacheControl>,
    pub total_tokens: u64,
    pub counts: RegionCounts,
    /// Positions of the blocks that carry a `cache_control` marker, ascending.
    pub markers: Vec<usize>,
    /// Positions of the `cache_edits` blocks (those with `cache_deletes`), ascending.
    pub edit_blocks: Vec<usize>,
    /// The trace row's `body_sha256`: SHA-256 of the whole body's structural stream, markers
    /// included ([`crate::api::structural::body_sha256`]).
    pub body_sha256: String,
    /// The salts mixed into message blocks' hashes (same tokens, other cache identities: a
    /// prompt the client renders otherwise, [`FlatRequest::set_salts`]): per message index,
    /// ascending, none zero, only messages with a block and a block before them.
    pub salts: Vec<(usize, u128)>,
    /// The chain state where the messages level starts (the head's folds chained in): the
    /// first message block chains from it unless salted.
    pub messages_state: u128,
    /// Markers sent with another TTL than their block record's, by block position, ascending
    /// ([`FlatRequest::set_marker_ttl`]): a request retimed (a what-if's TTL measured beside
    /// the run, the recorded client's TTL change) keeps its records shared with the flattener
    /// instead of copying them all to change a few markers. Read a marker's TTL with
    /// [`FlatRequest::marker_ttl`], never from the record.
    pub ttl_overrides: Vec<(usize, Option<crate::api::CacheTtl>)>,
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
        self.blocks[i].prefix_tokens
    }

    /// Recomputes the blocks' `prefix_tokens` and `total_tokens` after blocks' `tokens` were
    /// changed in place.
    pub fn recount(&mut self) {
        sum_tokens_from(Arc::make_mut(&mut self.blocks).as_mut_slice(), 0);
        self.total_tokens = self.blocks.last().map_or(0, |b| b.prefix_tokens);
    }

    /// The prefix hash where `messages[index]` ends: that of its last block, or of the last
    /// block before it when it has none (binary search: blocks are in body order).
    pub fn message_boundary(&self, index: usize) -> Option<u128> {
        let end = self.blocks.partition_point(|b| (b.path.region, b.path.index) <= (Region::Messages, index));
        end.checked_sub(1).map(|last| self.blocks[last].prefix_hash)
    }

    /// Position of the first block of `messages[index]` (`None`: it has none).
    fn first_block_of(&self, index: usize) -> Option<usize> {
        let at = self.blocks.partition_point(|b| (b.path.region, b.path.index) < (Region::Messages, index));
        self.blocks.get(at).filter(|b| b.path.region == Region::Messages && b.path.index == index).map(|_| at)
    }

    /// Sends every marker with `ttl` (`None`: 5 minutes, no `ttl` sent): the request as a
    /// client that times its markers otherwise sends it. No hash changes (a marker is an
    /// address for the server, not prompt content).
    pub fn set_markers_ttl(&mut self, ttl: Option<crate::api::CacheTtl>) {
        self.set_markers_ttl_where(ttl, |_| true);
    }

    /// [`Self::set_markers_ttl`] of the markers of the blocks `which` holds.
    pub fn set_markers_ttl_where(&mut self, ttl: Option<crate::api::CacheTtl>, which: impl Fn(&PromptBlock) -> bool) {
        for k in 0..self.markers.len() {
            let i = self.markers[k];
            if which(&self.blocks[i]) {
                self.set_marker_ttl(i, ttl);
            }
        }
    }

    /// The TTL block `i`'s marker is sent with (`None` inside: no `ttl` sent, 5 minutes);
    /// `None` when the block carries no marker.
    pub fn marker_ttl(&self, i: usize) -> Option<Option<crate::api::CacheTtl>> {
        let marker = self.blocks[i].cache_control.as_ref()?;
        Some(match self.ttl_overrides.binary_search_by_key(&i, |&(at, _)| at) {
            Ok(k) => self.ttl_overrides[k].1,
            Err(_) => marker.ttl,
        })
    }

    /// The request with every TTL of [`FlatRequest::ttl_overrides`] written into its records
    /// (copied) and none left over: what retiming did before overrides, and what debug builds
    /// compare them with.
    pub fn with_ttl_overrides_applied(&self) -> FlatRequest {
        let mut applied = self.clone();
        let overrides = std::mem::take(&mut applied.ttl_overrides);
        if !overrides.is_empty() {
            let blocks = Arc::make_mut(&mut applied.blocks);
            for (i, ttl) in overrides {
                Arc::make_mut(blocks[i].cache_control.as_mut().expect("an override is of a marker")).ttl = ttl;
            }
        }
        applied
    }

    /// Sends block `i`'s marker with `ttl` (a block without a marker is left as it is). The
    /// record is not changed (it stays shared): the TTL is kept in
    /// [`FlatRequest::ttl_overrides`] while it differs from the record's.
    pub fn set_marker_ttl(&mut self, i: usize, ttl: Option<crate::api::CacheTtl>) {
        let Some(marker) = self.blocks[i].cache_control.as_ref() else { return };
        let own = marker.ttl == ttl;
        match self.ttl_overrides.binary_search_by_key(&i, |&(at, _)| at) {
            Ok(k) if own => {
                self.ttl_overrides.remove(k);
            }
            Ok(k) => self.ttl_overrides[k].1 = ttl,
            Err(k) if !own => self.ttl_overrides.insert(k, (i, ttl)),
            Err(_) => {}
        }
    }

    /// Gives the blocks of each salted message (per message index, the salt mixed into its
    /// blocks' hashes; salts of one index compose) other cache identities with the same tokens,
    /// and carries the change into every later prefix hash. The salts replace those the blocks
    /// carry ([`Self::salts`]): only messages whose salt changes are rehashed, from the first
    /// of them on. A message with no block, or none before it, is never salted.
    ///
    /// The chain is taken up again from the prefix hash of the block before the first salted
    /// message: when that message's block is the first message block, the head's folds
    /// ([`Self::messages_state`]) are not chained in (as salting has always done).
    pub fn set_salts(&mut self, wanted: &[(usize, u128)]) {
        let wanted = normalize_salts(wanted, |m| self.first_block_of(m).is_some_and(|at| at > 0));
        if wanted == self.salts {
            return;
        }
        let head = self.counts.tools + self.counts.system;
        let at_head = |salts: &[(usize, u128)]| salts.first().and_then(|&(m, _)| self.first_block_of(m)) == Some(head);
        let (was_at_head, now_at_head) = (at_head(&self.salts), at_head(&wanted));
        let delta = xor_salts(&self.salts, &wanted);
        self.salts = wanted;
        let Some(mut first) = delta.first().and_then(|&(m, _)| self.first_block_of(m)).filter(|&at| at > 0) else { return };
        if was_at_head != now_at_head {
            first = head;
        }
        let messages_state = self.messages_state;
        let blocks = Arc::make_mut(&mut self.blocks);
        let mut state = if first == head && !now_at_head { messages_state } else { blocks[first - 1].prefix_hash };
        let mut next = delta.iter().peekable();
        for block in &mut blocks[first..] {
            while next.peek().is_some_and(|&&(m, _)| m < block.path.index) {
                next.next();
            }
            if let Some(&&(m, salt)) = next.peek()
                && m == block.path.index
                && block.path.region == Region::Messages
            {
                block.hash ^= salt;
            }
            state = chain(state, block.hash);
            block.prefix_hash = state;
        }
    }

    /// Context tokens in a region.
    pub fn region_tokens(&self, region: Region) -> u64 {
        self.blocks.iter().filter(|b| b.path.region == region).map(|b| u64::from(b.tokens)).sum()
    }
}

const SEED: &[u8] = b"ctxsim-prefix-v1";

/// The chain state before the first block of any request.
pub(super) fn initial_state() -> u128 {
    hash128(SEED)
}

fn tagged_hash(tag: &[u8], bytes: &[u8]) -> u128 {
    let mut buf = Vec::with_capacity(tag.len() + 1 + bytes.len());
    buf.extend_from_slice(tag);
    buf.push(0);
    buf.extend_from_slice(bytes);
    hash128(&buf)
}

/// An image or document whose size the block does not give (a URL or file source, a document):
/// the client's own flat estimate (reference/internals-crosscheck.md).
pub const UNSIZED_MEDIA_TOKENS: u32 = 2000;

/// Width and height in pixels of an inline (base64) image source, read from its header; `None`
/// for another source, data that is not base64, or bytes whose header gives no positive size.
pub fn image_dimensions(source: &serde_json::Value) -> Option<(u32, u32)> {
    use base64::Engine as _;
    let source = source.as_object()?;
    if source.get("type").and_then(serde_json::Value::as_str) != Some("base64") {
        return None;
    }
    let data = source.get("data").and_then(serde_json::Value::as_str)?;
    // The header is enough for every format imagesize reads; a JPEG's size can follow its
    // metadata, so the whole image is decoded (inline images are small).
    let bytes = base64::engine::general_purpose::STANDARD.decode(data.trim()).ok()?;
    let size = imagesize::blob_size(&bytes).ok()?;
    let width = u32::try_from(size.width).ok().filter(|&w| w > 0)?;
    let height = u32::try_from(size.height).ok().filter(|&h| h > 0)?;
    Some((width, height))
}

/// Tokens of an inline (base64) image by the API's documented rule: `width × height / 750`
/// after the image is scaled down to fit a 1,568-pixel long edge and 1.15 megapixels; `None`
/// when the data is not an image whose header gives its size.
pub fn image_tokens(image: &crate::api::ImageLike) -> Option<u32> {
    let (width, height) = image_dimensions(&image.source)?;
    let (width, height) = (f64::from(width), f64::from(height));
    let shrink = (1568.0 / width.max(height)).min((1_150_000.0 / (width * height)).sqrt()).min(1.0);
    Some(((width * shrink) * (height * shrink) / 750.0).ceil().max(1.0) as u32)
}

/// The strings and flat counts whose estimate is a content block's token count.
pub fn content_token_units(block: &ContentBlock) -> Vec<TokenUnit<'_>> {
    match block {
        ContentBlock::Text { text, .. } => vec![TokenUnit::Text(Cow::Borrowed(text))],
        ContentBlock::Image(image) => vec![TokenUnit::Fixed(image_tokens(image).unwrap_or(UNSIZED_MEDIA_TOKENS))],
        ContentBlock::Document(_) => vec![TokenUnit::Fixed(UNSIZED_MEDIA_TOKENS)],
        ContentBlock::ToolUse { name, input, .. } | ContentBlock::ServerToolUse { name, input, .. } => {
            let json = serde_json::to_string(input).unwrap_or_default();
            vec![TokenUnit::Text(Cow::Owned([name.as_str(), &json].concat()))]
        }
        ContentBlock::ToolResult { content, .. } => result_units(content),
        // A finalized result counts as its raw JSON form did (parsed back to the typed block):
        // by its content.
        ContentBlock::FinalToolResult { content, .. } => {
            let units = result_units(content);
            #[cfg(debug_assertions)]
            {
                let raw = ContentBlock::Other(block.wire_value().expect("a tool_result has a wire form"));
                assert_eq!(units, content_token_units(&raw), "a finalized tool_result counts as its raw JSON");
            }
            units
        }
        ContentBlock::Thinking { thinking, .. } => vec![TokenUnit::Text(Cow::Borrowed(thinking))],
        ContentBlock::RedactedThinking { data, .. } => vec![TokenUnit::Text(Cow::Borrowed(data))],
        // A block kept in its wire form (the agent writes tool_results with the reference's key
        // order this way) counts by its kind, like the typed block: its `cache_control` and key
        // order are not content. Unknown kinds count as their JSON.
        ContentBlock::Other(value) => match ContentBlock::from_value(value.clone()) {
            Ok(typed) if !matches!(typed, ContentBlock::Other(_)) => content_token_units(&typed).into_iter().map(TokenUnit::into_owned).collect(),
            _ => vec![TokenUnit::Text(Cow::Owned(serde_json::to_string(block).unwrap_or_default()))],
        },
        ContentBlock::ToolReference { .. } => vec![TokenUnit::Text(Cow::Owned(serde_json::to_string(block).unwrap_or_default()))],
    }
}

/// [`content_token_units`] of a tool_result's content.
fn result_units(content: &Option<ToolResultContent>) -> Vec<TokenUnit<'_>> {
    match content {
        None => Vec::new(),
        Some(ToolResultContent::Text(text)) => vec![TokenUnit::Text(Cow::Borrowed(text))],
        Some(ToolResultContent::Blocks(blocks)) => blocks.iter().flat_map(content_token_units).collect(),
    }
}

/// Flattens a request into block positions, counting tokens with `counter`, from scratch.
/// Blocks are hashed structurally ([`crate::api::structural`]): no JSON text is produced.
/// [`super::incremental::Flattener`] gives the same result reusing an earlier request's work;
/// this is its reference.
pub fn flatten(request: &Request, counter: &mut TokenCounter, family: &str) -> FlatRequest {
    flatten_keyed_by(request, counter, family, BillingKey::Keyed)
}

/// Whether the billing-header system block (`x-anthropic-billing-header: …`, its first-message
/// fingerprint inside) is part of the cache key. `Keyed` (the default) hashes it like any
/// block, so a changed fingerprint misses everything after it. `Unkeyed` is the first-party
/// server as the shipped real sessions show it: after every recorded compaction the next call
/// reads the whole prefix although the client's fingerprint changed with its first message
/// (docs/fidelity.md, "The billing block is not in the cache key"); the block is still counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BillingKey {
    #[default]
    Keyed,
    Unkeyed,
}

/// [`flatten`] with the billing block keyed as `billing` says.
pub fn flatten_keyed_by(request: &Request, counter: &mut TokenCounter, family: &str, billing: BillingKey) -> FlatRequest {
    let mut blocks = Vec::with_capacity(64);
    let mut state = head_blocks(request, counter, family, billing, &mut blocks);
    let messages_state = state;
    let head = blocks.len();
    for (m, message) in request.messages.iter().enumerate() {
        state = push_message(m, message, counter, family, state, &mut blocks);
    }
    sum_tokens_from(&mut blocks, 0);
    let mut positions = Positions::default();
    positions.scan(&blocks, 0);
    finish(request, Arc::new(blocks), head, messages_state, positions, crate::api::structural::body_sha256(request))
}

/// Sets `prefix_tokens` of `blocks[start..]`, running on from `blocks[start - 1]`.
pub(super) fn sum_tokens_from(blocks: &mut [PromptBlock], start: usize) {
    let mut running = if start == 0 { 0 } else { blocks[start - 1].prefix_tokens };
    for block in &mut blocks[start..] {
        running += u64::from(block.tokens);
        block.prefix_tokens = running;
    }
}

/// The positions a flat request lists ([`FlatRequest::markers`], [`FlatRequest::edit_blocks`]).
#[derive(Debug, Clone, Default)]
pub(super) struct Positions {
    pub markers: Vec<usize>,
    pub edit_blocks: Vec<usize>,
}

impl Positions {
    /// Forgets the positions from `start` on and lists those of `blocks[start..]`.
    pub fn scan(&mut self, blocks: &[PromptBlock], start: usize) {
        self.markers.retain(|&p| p < start);
        self.edit_blocks.retain(|&p| p < start);
        for (i, block) in blocks.iter().enumerate().skip(start) {
            if block.cache_control.is_some() {
                self.markers.push(i);
            }
            if block.cache_deletes.is_some() {
                self.edit_blocks.push(i);
            }
        }
    }
}

/// Assembles the flat request from its block records (`head` of them tools and system), whose
/// `prefix_tokens` are set.
pub(super) fn finish(request: &Request, blocks: Arc<Vec<PromptBlock>>, head: usize, messages_state: u128, positions: Positions, body_sha256: String) -> FlatRequest {
    let tools = request.tools().len();
    let counts = RegionCounts { tools, system: head - tools, messages: blocks.len() - head };
    let total_tokens = blocks.last().map_or(0, |b| b.prefix_tokens);
    let Positions { markers, edit_blocks } = positions;
    FlatRequest {
        model: request.model.clone(),
        blocks,
        auto_cache_control: request.cache_control.clone(),
        total_tokens,
        counts,
        markers,
        edit_blocks,
        body_sha256,
        salts: Vec::new(),
        messages_state,
        ttl_overrides: Vec::new(),
    }
}

/// `salts` by message index ascending, those of one index composed, without the zero ones and
/// those of messages `applies` rejects.
pub fn normalize_salts(salts: &[(usize, u128)], applies: impl Fn(usize) -> bool) -> Vec<(usize, u128)> {
    let mut sorted = salts.to_vec();
    sorted.sort_by_key(|&(m, _)| m);
    let mut out: Vec<(usize, u128)> = Vec::with_capacity(sorted.len());
    for (m, salt) in sorted {
        match out.last_mut() {
            Some(last) if last.0 == m => last.1 ^= salt,
            _ => out.push((m, salt)),
        }
    }
    out.retain(|&(m, salt)| salt != 0 && applies(m));
    out
}

/// Per message index, what turns the salts `a` into `b` (both as [`normalize_salts`] leaves
/// them): their composition, without the zero ones.
pub fn xor_salts(a: &[(usize, u128)], b: &[(usize, u128)]) -> Vec<(usize, u128)> {
    let mut joined = a.to_vec();
    joined.extend_from_slice(b);
    normalize_salts(&joined, |_| true)
}

/// The salt of message `m` in `salts` (as [`normalize_salts`] leaves them; zero: none).
pub fn salt_of(salts: &[(usize, u128)], m: usize) -> u128 {
    salts.binary_search_by_key(&m, |&(index, _)| index).map_or(0, |at| salts[at].1)
}

/// Request-level facts folded into the prefix chain besides `tool_choice` and `thinking` (see
/// the module documentation). The incremental flattener keeps a track's head only while these
/// are equal too: the first is derived from the messages, not from the head's own fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct HeadFolds {
    /// A tool is defined by value in a system message and `tools` has no non-deferred tool.
    pub inline_start: bool,
    /// The top-level `output_config.effort`, as sent.
    pub effort: Option<String>,
}

impl HeadFolds {
    pub fn of(request: &Request) -> HeadFolds {
        let effort = request.output_config.as_ref().and_then(|c| c.get("effort")).map(|e| match e {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
        HeadFolds { inline_start: opens_with_inline_tool(request), effort }
    }
}

/// Whether a tool defined by value in a system message opens the rendered prompt: `tools` has
/// no non-deferred tool (a tool-search tool counts as one) and a definition was sent.
pub fn opens_with_inline_tool(request: &Request) -> bool {
    if request.tools().iter().any(|t| t.defer_loading != Some(true)) {
        return false;
    }
    request.messages.iter().filter(|m| m.role == Role::System).any(|m| match &m.content {
        MessageContent::Text(_) => false,
        MessageContent::Blocks(blocks) => blocks.iter().any(|b| crate::api::system_messages::inline_definition(b).is_some()),
    })
}

/// Appends the records of the tools and system levels, chained, and returns the chain state
/// where the messages level starts (`tool_choice`, `thinking` and the [`HeadFolds`] folded in).
pub(super) fn head_blocks(request: &Request, counter: &mut TokenCounter, family: &str, billing: BillingKey, out: &mut Vec<PromptBlock>) -> u128 {
    let folds = HeadFolds::of(request);
    let mut state = initial_state();
    if folds.inline_start {
        state = chain(state, tagged_hash(b"inline_tool_start", &[]));
    }
    // The lists keep their hashes: the replays of a session send the same lists again.
    let tool_hashes = request.tools.as_ref().map_or(Cow::Borrowed(&[][..]), |tools| tools.block_hashes(b"tool"));
    for (i, (tool, &(hash, bytes))) in request.tools().iter().zip(tool_hashes.iter()).enumerate() {
        let tokens = counter.count(hash, family, || {
            let mut unmarked = tool.clone();
            unmarked.cache_control = None;
            vec![TokenUnit::Text(Cow::Owned(serde_json::to_string(&unmarked).unwrap_or_default()))]
        });
        state = chain(state, hash);
        out.push(PromptBlock {
            path: BlockPath { region: Region::Tools, index: i, content: None },
            role: None,
            kind: Cow::Borrowed("tool"),
            hash,
            prefix_hash: state,
            prefix_tokens: 0,
            tokens,
            bytes,
            cache_control: tool.cache_control.clone().map(Arc::new),
            auto_eligible: true,
            cache_reference: None,
            cache_deletes: None,
        });
    }

    if let Some(choice) = &request.tool_choice {
        state = chain(state, tagged_hash(b"tool_choice", &to_canonical_bytes(choice)));
    }
    let single;
    let (system, system_hashes): (&[crate::api::SystemBlock], Cow<'_, [(u128, u32)]>) = match &request.system {
        None => (&[], Cow::Borrowed(&[])),
        Some(SystemPrompt::Text(text)) => {
            single = [crate::api::SystemBlock::text(text.clone())];
            (&single, Cow::Owned(vec![block_hash(b"system", &single[0])]))
        }
        Some(SystemPrompt::Blocks(blocks)) => (blocks, blocks.block_hashes(b"system")),
    };
    for (i, (block, &(hash, bytes))) in system.iter().zip(system_hashes.iter()).enumerate() {
        let tokens = counter.count(hash, family, || vec![TokenUnit::Text(Cow::Borrowed(&block.text))]);
        // Counted as written; keyed as one constant where the server does not key it.
        let hash = if billing == BillingKey::Unkeyed && block.text.starts_with(super::structure::BILLING_PREFIX) {
            tagged_hash(b"billing_block_unkeyed", &[])
        } else {
            hash
        };
        state = chain(state, hash);
        out.push(PromptBlock {
            path: BlockPath { region: Region::System, index: i, content: None },
            role: None,
            kind: Cow::Borrowed("system_text"),
            hash,
            prefix_hash: state,
            prefix_tokens: 0,
            tokens,
            bytes,
            cache_control: block.cache_control.clone().map(Arc::new),
            auto_eligible: !block.text.is_empty(),
            cache_reference: None,
            cache_deletes: None,
        });
    }

    if let Some(thinking) = &request.thinking {
        state = chain(state, tagged_hash(b"thinking", &to_canonical_bytes(thinking)));
    }
    if let Some(effort) = &folds.effort {
        state = chain(state, tagged_hash(b"effort", effort.as_bytes()));
    }
    state
}

/// Appends the records of `messages[m]`'s blocks chained from `state`; returns the new state.
pub(super) fn push_message(m: usize, message: &Message, counter: &mut TokenCounter, family: &str, mut state: u128, out: &mut Vec<PromptBlock>) -> u128 {
    let owned;
    let role = message.role.as_str();
    // Like `cache_control`, a tool_result's `cache_reference` is an address for the server,
    // not prompt content: the structural hash leaves both out. A list of blocks keeps its
    // hashes (every replay of a session sends it again).
    let (content, hashes): (&[ContentBlock], Cow<'_, [(u128, u32)]>) = match &message.content {
        // An effort-only system message renders nothing.
        _ if crate::api::system_messages::renders_nothing(message) => (&[], Cow::Borrowed(&[])),
        MessageContent::Text(text) => {
            owned = [ContentBlock::text(text.clone())];
            (&owned, Cow::Owned(vec![crate::api::block_hash_kept(role, &owned[0])]))
        }
        MessageContent::Blocks(blocks) => (blocks, blocks.block_hashes(role)),
    };
    for (c, (block, &(hash, bytes))) in content.iter().zip(hashes.iter()).enumerate() {
        let marker = block.raw_cache_control();
        let (cache_reference, cache_deletes) = cache_edit_fields(block);
        let tokens = counter.count(hash, family, || content_token_units(block));
        state = chain(state, hash);
        let empty_text = matches!(block, ContentBlock::Text { text, .. } if text.is_empty());
        out.push(PromptBlock {
            path: BlockPath { region: Region::Messages, index: m, content: Some(c) },
            role: Some(message.role),
            kind: match block.modelled_kind() {
                Some(kind) => Cow::Borrowed(kind),
                None => Cow::Owned(block.kind().to_owned()),
            },
            hash,
            prefix_hash: state,
            prefix_tokens: 0,
            tokens,
            bytes,
            cache_control: marker.map(Arc::new),
            auto_eligible: !block.is_thinking() && !empty_text,
            cache_reference,
            cache_deletes,
        });
    }
    state
}

/// A tool_result's `cache_reference`, and the references a `cache_edits` block deletes.
fn cache_edit_fields(block: &ContentBlock) -> (Option<Arc<str>>, Option<Arc<[String]>>) {
    match block {
        ContentBlock::ToolResult { extra, .. } | ContentBlock::FinalToolResult { extra, .. } => (extra.get("cache_reference").and_then(Value::as_str).map(Arc::from), None),
        ContentBlock::Other(value) if value.get("type").and_then(Value::as_str) == Some("tool_result") => {
            (value.get("cache_reference").and_then(Value::as_str).map(Arc::from), None)
        }
        ContentBlock::Other(value) if value.get("type").and_then(Value::as_str) == Some("cache_edits") => {
            let deletes: Vec<String> = value
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
            (None, (!deletes.is_empty()).then(|| Arc::from(deletes)))
        }
        _ => (None, None),
    }
}

/// Reads a request body from JSON with a JSON path in the error.
pub fn parse_request(value: Value) -> Result<Request, String> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = crate::input::json_path(e.path());
        let message = crate::input::cap_message(&e.inner().to_string());
        if path == "." { message } else { format!("{path}: {message}") }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    /// An inline PNG of `width × height` (signature and IHDR chunk: all its header gives).
    fn png(width: u32, height: u32) -> crate::api::ImageLike {
        let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        bytes.extend_from_slice(&width.to_be_bytes());
        bytes.extend_from_slice(&height.to_be_bytes());
        bytes.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0]);
        let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
        crate::api::ImageLike { source: serde_json::json!({"type": "base64", "media_type": "image/png", "data": data}).into(), cache_control: None, extra: Default::default() }
    }

    #[test]
    fn a_rendered_block_path_is_its_display() {
        let paths = [
            BlockPath { region: Region::Tools, index: 0, content: None },
            BlockPath { region: Region::System, index: 12, content: None },
            BlockPath { region: Region::Messages, index: 1_234_567, content: Some(0) },
            BlockPath { region: Region::Messages, index: usize::MAX, content: Some(usize::MAX) },
        ];
        for path in paths {
            assert_eq!(path.render(), path.to_string());
        }
    }

    #[test]
    fn an_inline_image_counts_its_pixels_over_750_after_the_downscale() {
        // d847's 90 x 52 status-line crop: 6.24 -> 7 tokens, not the flat 2,000.
        assert_eq!(image_tokens(&png(90, 52)), Some(7));
        // af1d's 1280 x 720 screenshots fit both limits: 921,600 / 750.
        assert_eq!(image_tokens(&png(1280, 720)), Some(1229));
        // 4000 x 3000 is scaled to 1.15 megapixels (the tighter limit): 1,150,000 / 750.
        assert_eq!(image_tokens(&png(4000, 3000)), Some(1534));
        // A URL source, or data that is no image, keeps the flat estimate.
        let url = crate::api::ImageLike { source: serde_json::json!({"type": "url", "url": "https://x/y.png"}).into(), cache_control: None, extra: Default::default() };
        assert_eq!(image_tokens(&url), None);
        assert_eq!(content_token_units(&ContentBlock::Image(url)), vec![TokenUnit::Fixed(UNSIZED_MEDIA_TOKENS)]);
        assert_eq!(content_token_units(&ContentBlock::Image(png(90, 52))), vec![TokenUnit::Fixed(7)]);
    }
}

/// Whether `message` opens a user turn, as the API tells turns apart when it drops earlier
/// thinking: a user message with anything besides tool results and `<system-reminder>` texts
/// (the client's reminders ride along with tool results inside a turn).
fn opens_user_turn(message: &crate::api::Message) -> bool {
    use crate::api::{ContentBlock, MessageContent};
    let reminder = |text: &str| text.trim_start().starts_with("<system-reminder");
    message.role == crate::api::Role::User
        && match &message.content {
            MessageContent::Text(text) => !reminder(text),
            MessageContent::Blocks(blocks) => blocks.iter().any(|b| match b {
                ContentBlock::ToolResult { .. } => false,
                ContentBlock::Text { text, .. } => !reminder(text),
                _ => true,
            }),
        }
}

/// Counts no tokens for the thinking blocks of `body` before the message that opened its current
/// user turn ([`crate::measure::Measurer::set_prior_thinking_dropped`]); positions and hashes
/// stay.
pub fn drop_prior_thinking(body: &Request, flat: &mut FlatRequest) {
    if let Some(turn) = body.messages.iter().rposition(opens_user_turn) {
        drop_thinking_before(flat, turn);
    }
}

/// Counts no tokens for the thinking blocks of the messages before `turn` (the message that
/// opened the current user turn); positions and hashes stay. The one mechanism of the agent's
/// measurement ([`drop_prior_thinking`]) and the replay's, which finds the turn by the recorded
/// client's prompt rule (`replay::turns::current_prompt_index`): a recorded attachment is a
/// reminder only with its `attachment=` tag, while every `<system-reminder>` the agent builds
/// is one.
pub fn drop_thinking_before(flat: &mut FlatRequest, turn: usize) {
    let dropped = |b: &PromptBlock| b.path.region == Region::Messages && b.path.index < turn && b.tokens > 0 && matches!(&*b.kind, "thinking" | "redacted_thinking");
    if !flat.blocks.iter().any(dropped) {
        return;
    }
    for block in Arc::make_mut(&mut flat.blocks).iter_mut() {
        if dropped(block) {
            block.tokens = 0;
        }
    }
    flat.recount();
}
