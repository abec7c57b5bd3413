//! Incremental flattening: a request that repeats most of an earlier one is flattened for the
//! price of comparing what it repeats and hashing what is new.
//!
//! Successive requests of a session share almost everything: the tools, the system prompt and
//! the history, with a few new messages at the end and the message marker moved. Flattening
//! each from scratch hashes every block of every request (and the body SHA-256 every byte), so a
//! long session costs its size times its length. The [`Flattener`] keeps, per *track* (one line
//! of requests that extend each other), the previous request's levels, messages, block records
//! and body-hash checkpoints, and for a new request:
//!
//! - compares the tools, `tool_choice`, system and `thinking` with the track's; identical → their
//!   records and the chain state entering `messages` are kept, otherwise recomputed;
//! - counts the leading messages identical to the track's ([`crate::api::identical`]: exact,
//!   stricter than `==`); their records are kept as they are (prefix hashes too, when the head
//!   was the same; rechained otherwise);
//! - for each later message, takes the records of the track's message at the same index when
//!   the two are identical (rechained: something before them changed), else hashes and counts
//!   it afresh (token counts still come from the memo);
//! - resumes the body SHA-256 from its state before the first non-identical message
//!   ([`BodyHasher`]).
//!
//! Identical values hash alike and count alike, so the result equals [`super::flatten`] of the
//! request (a property test checks it over sessions with rewrites, marker moves and
//! interleaved lanes). A track is chosen by model and a cheap key of the first message, most
//! recently used first; choosing badly only costs time. At most [`MAX_TRACKS`] are kept.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use serde_json::Value;

use crate::api::canonical::chain;
use crate::api::identical::Identical;
use crate::api::structural::BodyHasher;
use crate::api::{ContentBlock, Message, MessageContent, Request, Role, SharedVec, SystemPrompt, Tool, ToolResultContent};

use super::blocks::{FlatRequest, HeadFolds, Positions, PromptBlock, finish, head_blocks, initial_state, normalize_salts, push_message, salt_of, sum_tokens_from, xor_salts};
use super::tokens::TokenCounter;

/// Tracks kept at once (main lane, compaction and memory forks, subagents, side requests).
pub const MAX_TRACKS: usize = 8;

/// Flattens requests reusing the work done for earlier ones (see the module documentation).
#[derive(Debug, Clone)]
pub struct Flattener {
    tracks: Vec<Track>,
    tick: u64,
    /// Whether flat requests carry their `body_sha256` (see [`Flattener::without_body_hashes`]).
    body_hashes: bool,
    /// Whether the billing block is part of the cache key ([`super::blocks::BillingKey`]).
    billing: super::blocks::BillingKey,
    /// Requests flattened, and message blocks taken from a track rather than hashed.
    pub requests: u64,
    pub reused_blocks: u64,
    /// Records of keyed messages hashed ahead ([`Flattener::prepare`]): by message key, with
    /// the family they were counted for. Taken (removed) by the first request that needs them.
    prepared: FxHashMap<u128, (String, Vec<PromptBlock>)>,
    /// What the caller knows of the next request ([`Flattener::expect_shared`]): its leading
    /// messages that are those of the request flattened with that stamp, as it sent them.
    shared_hint: Option<(u64, usize)>,
    /// The stamp of the last request flattened ([`Flattener::last_stamp`]).
    last_stamp: u64,
    /// The track the last request flattened left ([`Flattener::last_system_messages`]).
    last_track: Option<usize>,
}

/// The last request of one line of requests, as flattening left it.
#[derive(Debug, Clone)]
struct Track {
    last_used: u64,
    /// The stamp of the request that left the track as it is.
    stamp: u64,
    model: String,
    family: String,
    /// The last request's tools (shared with it: the agent's requests share one list while
    /// the tools do not change, compared by pointer).
    tools: SharedVec<Tool>,
    tool_choice: Option<Value>,
    system: Option<SystemPrompt>,
    thinking: Option<crate::api::SharedValue>,
    folds: HeadFolds,
    /// The last request's messages when it carried no keys (compared by content), else empty.
    /// Shared with the track's copies up to the last [`Flattener::freeze`].
    messages: crate::shared::Chunked<Message>,
    /// The keys of the last request's messages ([`Flattener::flatten_keyed`]), when it carried
    /// them.
    keys: Option<Vec<u128>>,
    /// How many messages the last request had, and the cheap key of its first.
    len: usize,
    first: Option<(Role, usize, usize)>,
    /// The key of the last request's other fields ([`Flattener::flatten_with_keys`]).
    head_key: Option<u128>,
    /// The positions of the last request's `role: "system"` messages
    /// ([`crate::api::system_messages::system_positions`]), kept where its messages are.
    systems: Vec<usize>,
    /// The block records; the first `head` are the tools and system levels. Shared with the
    /// last [`FlatRequest`] handed out: extended in place once that is dropped.
    blocks: Arc<Vec<PromptBlock>>,
    head: usize,
    /// The chain state where the messages level starts.
    messages_state: u128,
    /// `blocks` index of each message's first block, then `blocks.len()`.
    starts: Vec<usize>,
    /// The marker and `cache_edits` positions of `blocks`.
    positions: Positions,
    /// The salts `blocks` carry ([`FlatRequest::salts`]).
    salts: Vec<(usize, u128)>,
    body: BodyHasher,
}

impl Track {
    fn new(model: &str, family: &str) -> Track {
        Track {
            last_used: 0,
            stamp: 0,
            model: model.to_owned(),
            family: family.to_owned(),
            tools: SharedVec::default(),
            tool_choice: None,
            system: None,
            thinking: None,
            folds: HeadFolds::default(),
            messages: Default::default(),
            keys: None,
            len: 0,
            first: None,
            head_key: None,
            systems: Vec::new(),
            blocks: Arc::new(Vec::new()),
            head: 0,
            messages_state: initial_state(),
            starts: vec![0],
            positions: Positions::default(),
            salts: Vec::new(),
            body: BodyHasher::default(),
        }
    }
}

/// The records of a track's messages after the kept ones, as the next request finds them.
enum OldTail {
    /// Still in the track's own list (nothing else held it), after the records written so
    /// far: each message of the request from the kept ones on has taken as many blocks as the
    /// old message at its position, so its old records are where its new ones go.
    InPlace,
    /// Split off the track's own records from the given position on.
    Own(Vec<PromptBlock>, usize),
    /// All the records, still held by the last flat request: the tail is read in place.
    Shared(Arc<Vec<PromptBlock>>),
}

impl OldTail {
    /// The old records at positions `range` of the old list (not [`OldTail::InPlace`]).
    fn records(&self, range: std::ops::Range<usize>) -> &[PromptBlock] {
        match self {
            OldTail::Own(tail, from) => &tail[range.start - from..range.end - from],
            OldTail::Shared(all) => &all[range],
            OldTail::InPlace => &[],
        }
    }
}

/// Debug builds: the records of `request.messages[from..]` are their blocks' where `starts`
/// puts them (each block's structural hash, salted as `salts` says, its message and block
/// index) and chain on from the ones before (from `messages_state` at `head`, or from the
/// head's last block for a salted first message). What the records written in place, or
/// copied, or made, must all be.
#[cfg(debug_assertions)]
fn check_message_records(request: &Request, blocks: &[PromptBlock], starts: &[usize], from: usize, salts: &[(usize, u128)], head: usize, messages_state: u128) {
    for (m, message) in request.messages.iter().enumerate().skip(from) {
        let role = message.role.as_str();
        let hashes: Vec<u128> = match &message.content {
            _ if crate::api::system_messages::renders_nothing(message) => Vec::new(),
            MessageContent::Text(text) => vec![crate::api::block_hash_kept(role, &ContentBlock::text(text.clone())).0],
            MessageContent::Blocks(list) => list.block_hashes(role).iter().map(|&(hash, _)| hash).collect(),
        };
        let salt = salt_of(salts, m);
        let records = &blocks[starts[m]..starts[m + 1]];
        assert_eq!(records.len(), hashes.len(), "message {m} has a record per block");
        for (c, (record, hash)) in records.iter().zip(hashes).enumerate() {
            assert!(record.hash == hash ^ salt && record.path.index == m && record.path.content == Some(c), "the record of message {m}, block {c}, is that block's");
        }
        for i in starts[m]..starts[m + 1] {
            let chained = |previous: u128| blocks[i].prefix_hash == chain(previous, blocks[i].hash);
            assert!(if i == head { chained(messages_state) || (salt != 0 && chained(blocks[i - 1].prefix_hash)) } else { chained(blocks[i - 1].prefix_hash) }, "record {i} (message {m}) chains on from the one before");
        }
    }
}

/// A cheap key of a message for choosing a track: role, block count, and the length of the
/// first block's text. Equal keys do not mean equal messages; the comparison decides.
fn message_key(message: &Message) -> (Role, usize, usize) {
    let (count, length) = match &message.content {
        MessageContent::Text(text) => (1, text.len()),
        MessageContent::Blocks(blocks) => (
            blocks.len(),
            blocks.first().map_or(0, |block| match block {
                ContentBlock::Text { text, .. } => text.len(),
                ContentBlock::ToolResult { content: Some(ToolResultContent::Text(text)), .. } => text.len(),
                ContentBlock::ToolResult { content: Some(content), .. } => content.text_len(),
                ContentBlock::ToolUse { id, .. } => id.len(),
                _ => 0,
            }),
        ),
    };
    (message.role, count, length)
}

/// Whether `new` is identical to `old` ([`Identical`]), looking first for what a request that
/// repeats its track's messages shares with them: the same role, the content in the same
/// allocation and no extra fields. That answers for nearly every message of a growing
/// conversation without a call; anything else is compared in full.
#[inline]
fn same_message(new: &Message, old: &Message) -> bool {
    (new.content.same(&old.content) && new.role == old.role && new.extra.is_empty() && old.extra.is_empty()) || new.identical(old)
}

/// How many leading keys two key lists share: compared 64 at a time (a `memcmp`), then one
/// by one inside the first chunk that differs.
pub fn common_keys(a: &[u128], b: &[u128]) -> usize {
    const CHUNK: usize = 64;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + CHUNK <= n && a[i..i + CHUNK] == b[i..i + CHUNK] {
        i += CHUNK;
    }
    i + a[i..n].iter().zip(&b[i..n]).position(|(x, y)| x != y).unwrap_or(n - i)
}

impl Default for Flattener {
    fn default() -> Self {
        Flattener { tracks: Vec::new(), tick: 0, body_hashes: true, billing: Default::default(), requests: 0, reused_blocks: 0, prepared: FxHashMap::default(), shared_hint: None, last_stamp: 0, last_track: None }
    }
}

impl Flattener {
    pub fn new() -> Self {
        Flattener::default()
    }

    /// Whether flat requests carry their `body_sha256` ([`Flattener::without_body_hashes`]).
    pub fn hashes_bodies(&self) -> bool {
        self.body_hashes
    }

    /// A flattener whose flat requests carry an empty `body_sha256`. The body hash reads every
    /// byte after the first changed message, the system prompt and tools included, on every
    /// request; callers that output neither trace rows nor summary fingerprints (fidelity,
    /// sweep) skip it.
    pub fn without_body_hashes() -> Self {
        Flattener { body_hashes: false, ..Flattener::default() }
    }

    /// Shares the messages each track keeps with every later copy of this flattener (a run's
    /// checkpoints) rather than copying them into each ([`crate::shared::Chunked`]).
    pub fn freeze(&mut self) {
        for track in &mut self.tracks {
            track.messages.freeze();
        }
    }

    /// A new flattener with this one's settings and none of its tracks.
    pub fn fresh_like(&self) -> Self {
        Flattener { body_hashes: self.body_hashes, billing: self.billing, ..Flattener::default() }
    }

    /// This flattener with the billing block keyed as `billing` says.
    pub fn with_billing_key(self, billing: super::blocks::BillingKey) -> Self {
        Flattener { billing, ..self }
    }

    /// How this flattener keys the billing block.
    pub fn billing_key(&self) -> super::blocks::BillingKey {
        self.billing
    }

    /// Hashes and counts `message` (at index `m` of its request) ahead of the request that
    /// brings it, keeping its records under `key` (a key as [`Self::flatten_keyed`] takes):
    /// that request takes them instead of hashing the message again. Tokenizing the new
    /// messages of a whole log this way, in one run, keeps the tokenizer's tables warm.
    pub fn prepare(&mut self, key: u128, m: usize, message: &Message, counter: &mut TokenCounter, family: &str) {
        if self.prepared.get(&key).is_some_and(|(f, _)| f == family) {
            return;
        }
        let mut records = Vec::new();
        push_message(m, message, counter, family, 0, &mut records);
        self.prepared.insert(key, (family.to_owned(), records));
    }

    /// The next request flattened starts with `count` messages that are the ones the request
    /// with `stamp` ([`Flattener::last_stamp`]) sent, unchanged (the same allocations): where
    /// that request left its track as it is, they are not compared. A count too high would
    /// give wrong records (debug builds check it); too low costs only the comparison.
    pub fn expect_shared(&mut self, hint: Option<(u64, usize)>) {
        self.shared_hint = hint;
    }

    /// The stamp of the last request flattened, for [`Flattener::expect_shared`].
    pub fn last_stamp(&self) -> u64 {
        self.last_stamp
    }

    /// The positions of the `role: "system"` messages of the last request flattened
    /// ([`crate::api::system_messages::system_positions`]): found among its messages after the
    /// ones it shares with its track's request before, not by reading every message.
    pub fn last_system_messages(&self) -> &[usize] {
        self.last_track.and_then(|t| self.tracks.get(t)).map_or(&[], |track| &track.systems)
    }

    /// The track a request most likely extends, or a new one (the least recently used goes).
    fn track_for(&mut self, request: &Request, family: &str) -> usize {
        let key = request.messages.first().map(message_key);
        let found = self
            .tracks
            .iter()
            .enumerate()
            .filter(|(_, t)| t.model == request.model && t.family == family && t.first == key)
            .max_by_key(|(_, t)| t.last_used)
            .map(|(i, _)| i);
        if let Some(i) = found {
            return i;
        }
        if self.tracks.len() == MAX_TRACKS
            && let Some(oldest) = self.tracks.iter().enumerate().min_by_key(|(_, t)| t.last_used).map(|(i, _)| i)
        {
            self.tracks.swap_remove(oldest);
        }
        self.tracks.push(Track::new(&request.model, family));
        self.tracks.len() - 1
    }

    /// Flattens `request` as [`super::flatten`] does, reusing the records of the track it
    /// extends.
    pub fn flatten(&mut self, request: &Request, counter: &mut TokenCounter, family: &str) -> FlatRequest {
        self.flatten_keyed(request, None, counter, family)
    }

    /// [`Self::flatten`] with a key per message (`keys.len() == request.messages.len()`, else
    /// they are ignored): two messages with equal keys are identical, so where the request and
    /// the track both carry keys the messages are compared by key instead of by content. Keys
    /// are computed where the bytes pass anyway: a log reader hashes each message's JSON text
    /// ([`crate::analyze::read_log`]). Unequal keys only cost time: the message is hashed and
    /// counted afresh, to the same records.
    pub fn flatten_keyed(&mut self, request: &Request, keys: Option<&[u128]>, counter: &mut TokenCounter, family: &str) -> FlatRequest {
        self.flatten_with_keys(request, None, keys, counter, family)
    }

    /// [`Self::flatten_keyed`] with a key of the request's fields other than `messages`, too:
    /// equal head keys mean identical tools, system prompt and parameters, so neither the
    /// flattener nor the body hash compares them (unequal ones are compared as usual).
    pub fn flatten_with_keys(
        &mut self,
        request: &Request,
        head_key: Option<u128>,
        keys: Option<&[u128]>,
        counter: &mut TokenCounter,
        family: &str,
    ) -> FlatRequest {
        self.flatten_salted(request, head_key, keys, &[], counter, family)
    }

    /// [`Self::flatten_with_keys`] with `salts` set ([`FlatRequest::set_salts`]): the same
    /// flat request as flattening and then setting them. The track keeps its records salted,
    /// so a line of requests salted alike (a client that renders its conversation start
    /// otherwise from some turn on) rehashes only where the salts change.
    pub fn flatten_salted(
        &mut self,
        request: &Request,
        head_key: Option<u128>,
        keys: Option<&[u128]>,
        salts: &[(usize, u128)],
        counter: &mut TokenCounter,
        family: &str,
    ) -> FlatRequest {
        let keys = keys.filter(|k| k.len() == request.messages.len());
        let hint = self.shared_hint.take();
        let billing = self.billing;
        self.tick += 1;
        self.requests += 1;
        let t = self.track_for(request, family);
        let prepared = &mut self.prepared;
        let track = &mut self.tracks[t];
        track.last_used = self.tick;

        let tools = request.tools();
        let folds = HeadFolds::of(request);
        let head_same = track.folds == folds
            && ((head_key.is_some() && head_key == track.head_key)
                || (request.tools.as_ref().is_some_and(|shared| shared.same(&track.tools)) || track.tools.as_slice().identical(tools))
                    && track.tool_choice.identical(&request.tool_choice)
                    && track.system.identical(&request.system)
                    && track.thinking.identical(&request.thinking));
        // The previous request's messages are compared by key where both carry keys, else by
        // content where they were kept (an unkeyed request's are; a keyed one's need not be).
        let old_len = track.len;
        let kept = track.messages.len() == old_len;
        let reuse = match (keys, track.keys.as_deref()) {
            (Some(new), Some(old)) => common_keys(new, old),
            _ if kept => {
                // The messages the caller knows to be the last request's own, as it sent them.
                let known = match hint {
                    Some((stamp, count)) if stamp == track.stamp => count.min(old_len).min(request.messages.len()),
                    _ => 0,
                };
                debug_assert!(
                    request.messages[..known].iter().zip(track.messages.iter_from(0)).all(|(new, old)| same_message(new, old)),
                    "a message the caller counted as the last request's differs from it ({known} counted)"
                );
                known + request.messages[known..].iter().zip(track.messages.iter_from(known)).take_while(|(new, old)| same_message(new, old)).count()
            }
            _ => 0,
        };
        // The records are kept only before the first message whose salt changes (before the
        // first salted one when the head changes: whether a salt applies depends on it).
        let wanted = normalize_salts(salts, |m| m < request.messages.len());
        let old_salts = std::mem::take(&mut track.salts);
        let first_change = if head_same {
            xor_salts(&old_salts, &wanted).first().map(|&(m, _)| m)
        } else {
            old_salts.iter().chain(&wanted).map(|&(m, _)| m).min()
        };
        let reuse = first_change.map_or(reuse, |m| reuse.min(m));
        let mut new_salts: Vec<(usize, u128)> = old_salts.iter().copied().take_while(|&(m, _)| m < reuse).collect();
        let same = |m: usize, old_messages: &crate::shared::Chunked<Message>, old_keys: Option<&[u128]>| match (keys, old_keys) {
            (Some(new), Some(old)) => new[m] == old[m],
            _ => old_messages.get(m).is_some_and(|old| same_message(&request.messages[m], old)),
        };

        // Keep messages[..reuse]; set the rest aside (its records may serve again below). When
        // the last flat request still holds the records, only the kept ones are copied (with
        // room for the new ones) and the rest is read where it is. When nothing else holds
        // them and the head is kept, the records stay in the list while the request's messages
        // take as many blocks as the old ones at their positions (a rewritten message, the
        // messages after it kept): a kept message is rechained where it is, a message made
        // again written over its old records; the rest is set aside from the first message
        // that differs in count.
        let old_starts = track.starts.split_off(reuse);
        let base = old_starts[0];
        // Every block of the messages from `reuse` on (a message that renders nothing counted
        // too): with room for them, the loop below never grows the list, which would copy every
        // record before it. (The head's blocks, when it changed, are spliced in.)
        let fresh: usize = request.messages[reuse..].iter().map(|m| m.content.block_count()).sum();
        let (mut owned, mut old) = match Arc::try_unwrap(std::mem::take(&mut track.blocks)) {
            Ok(all) if head_same => (all, OldTail::InPlace),
            Ok(mut all) => {
                let tail = all.split_off(base);
                (all, OldTail::Own(tail, base))
            }
            Err(shared) => {
                // With room to grow by half: the list is copied here after every copy of the
                // measurer (a run's checkpoint holds the records), and a conversation that grows
                // past the room copies it again within a few requests.
                let mut kept = Vec::with_capacity(shared.len().max(base + fresh) + shared.len() / 2 + 32);
                kept.extend_from_slice(&shared[..base]);
                (kept, OldTail::Shared(shared))
            }
        };
        let blocks = &mut owned;
        // (In place, the kept records end at `base`, the old ones after them.)
        let kept_len = if matches!(old, OldTail::InPlace) { base } else { blocks.len() };
        blocks.reserve((kept_len + fresh).saturating_sub(blocks.len()));
        if !head_same {
            let mut head = Vec::new();
            let state = head_blocks(request, counter, family, billing, &mut head);
            let new_head = head.len();
            blocks.splice(0..track.head, head);
            for start in &mut track.starts {
                *start = *start + new_head - track.head;
            }
            let mut running = state;
            for block in &mut blocks[new_head..] {
                running = chain(running, block.hash);
                block.prefix_hash = running;
            }
            track.head = new_head;
            track.messages_state = state;
            track.tools = request.tools.clone().unwrap_or_default();
            track.tool_choice = request.tool_choice.clone();
            track.system = request.system.clone();
            track.thinking = request.thinking.clone();
            track.folds = folds;
        }
        // (With the head kept, the list holds the kept records alone, or in place the old ones
        // after them too.)
        let kept_end = if head_same { base } else { blocks.len() };
        self.reused_blocks += (kept_end - track.head) as u64;
        // Blocks from here on are new or rechained; before it, records (prefix tokens and
        // positions included) are as they were, unless the head changed.
        let fresh_from = if head_same { base } else { 0 };

        let mut state = if kept_end > track.head { blocks[kept_end - 1].prefix_hash } else { track.messages_state };
        // The end of the records written so far (in place, the old ones follow it).
        let mut end = kept_end;
        // The records of a message made again in place, before they take their place.
        let mut made: Vec<PromptBlock> = Vec::new();
        for (m, message) in request.messages.iter().enumerate().skip(reuse) {
            let start = end;
            track.starts.push(start);
            let j = m - reuse;
            let in_place = matches!(old, OldTail::InPlace);
            // Where the records go: in place, into `made` first unless they are appended.
            let appending = !in_place || m >= old_len;
            debug_assert!(!in_place || (if m < old_len { old_starts[j] == start } else { start == blocks.len() }), "records in place are not where the message's old ones were");
            // The salt this message's blocks get: none for the first blocks of the request.
            let salt = if start > 0 { salt_of(&wanted, m) } else { 0 };
            if salt != 0 && start == track.head {
                // A salted first message block chains from the head's last block (as
                // `FlatRequest::set_salts` does).
                state = blocks[start - 1].prefix_hash;
            }
            if m < old_len && same(m, &track.messages, track.keys.as_deref()) {
                let range = old_starts[j]..old_starts[j + 1];
                self.reused_blocks += range.len() as u64;
                let resalt = salt_of(&old_salts, m) ^ salt;
                if in_place {
                    end = range.end;
                    for block in &mut blocks[range] {
                        block.hash ^= resalt;
                        state = chain(state, block.hash);
                        block.prefix_hash = state;
                    }
                } else {
                    for record in old.records(range) {
                        let mut block = record.clone();
                        block.hash ^= resalt;
                        state = chain(state, block.hash);
                        block.prefix_hash = state;
                        blocks.push(block);
                    }
                    end = blocks.len();
                }
                if salt != 0 && end > start {
                    new_salts.push((m, salt));
                }
                continue;
            }
            // (The state before the message's blocks, for a salt: it chains from there.)
            let before = if salt != 0 { blocks[start - 1].prefix_hash } else { 0 };
            let out = if appending { &mut *blocks } else { &mut made };
            let first = out.len();
            if let Some((_, records)) = keys.and_then(|keys| prepared.remove(&keys[m])).filter(|(prepared_for, _)| prepared_for == family) {
                // Hashed ahead at another index, perhaps: the same records at this one.
                for mut block in records {
                    block.path.index = m;
                    block.hash ^= salt;
                    state = chain(state, block.hash);
                    block.prefix_hash = state;
                    out.push(block);
                }
            } else {
                state = push_message(m, message, counter, family, state, out);
                if salt != 0 && out.len() > first {
                    state = before;
                    for block in &mut out[first..] {
                        block.hash ^= salt;
                        state = chain(state, block.hash);
                        block.prefix_hash = state;
                    }
                }
            }
            if appending {
                end = blocks.len();
            } else if made.len() == old_starts[j + 1] - old_starts[j] {
                // As many as the old message took: over its records.
                end = start + made.len();
                for (record, block) in blocks[start..end].iter_mut().zip(made.drain(..)) {
                    *record = block;
                }
            } else {
                // From here on, the old records are read where they are set aside.
                let tail = blocks.split_off(start);
                old = OldTail::Own(tail, start);
                blocks.append(&mut made);
                end = blocks.len();
            }
            if salt != 0 && end > start {
                new_salts.push((m, salt));
            }
        }
        if matches!(old, OldTail::InPlace) {
            // The old records of messages the request no longer has.
            blocks.truncate(end);
        }
        debug_assert_eq!(end, blocks.len(), "records written end where the list does");
        track.starts.push(blocks.len());
        track.salts = new_salts;
        sum_tokens_from(blocks, fresh_from);
        track.positions.scan(blocks, fresh_from);
        #[cfg(debug_assertions)]
        check_message_records(request, blocks, &track.starts, reuse, &track.salts, track.head, track.messages_state);
        drop(old);
        track.blocks = Arc::new(owned);
        match keys {
            Some(keys) => {
                // Keyed: the keys stand for the messages (`reuse` was counted on them).
                let kept_keys = track.keys.get_or_insert_with(Vec::new);
                kept_keys.truncate(reuse);
                kept_keys.extend_from_slice(&keys[kept_keys.len()..]);
                track.messages.clear();
            }
            None => {
                track.keys = None;
                track.messages.truncate(reuse);
                track.messages.extend_from_slice(&request.messages[reuse..]);
            }
        }
        // The system messages among the kept ones are where they were.
        let kept_systems = track.systems.partition_point(|&m| m < reuse);
        track.systems.truncate(kept_systems);
        track.systems.extend(request.messages[reuse..].iter().enumerate().filter(|(_, m)| m.role == Role::System).map(|(m, _)| reuse + m));
        debug_assert_eq!(track.systems, crate::api::system_messages::system_positions(&request.messages), "kept system message positions differ");
        self.last_track = Some(t);
        track.len = request.messages.len();
        // Unique in the process ([`crate::shared::fresh_stamp`]): a copied or restored flattener
        // keeps its tracks' stamps and no later request gets one, so a stamp names one request
        // as flattened, not a position in one flattener's history.
        track.stamp = crate::shared::fresh_stamp();
        self.last_stamp = track.stamp;
        track.first = request.messages.first().map(message_key);
        track.head_key = head_key;

        let body_sha256 = if self.body_hashes { track.body.sha256_hex_keyed(request, reuse, head_key) } else { String::new() };
        let mut flat = finish(request, Arc::clone(&track.blocks), track.head, track.messages_state, track.positions.clone(), body_sha256);
        flat.salts = track.salts.clone();
        flat
    }

    /// Sets `salts` on `flat` ([`FlatRequest::set_salts`]). Where `flat` holds the records a
    /// track holds (the request that track flattened last, its salts as flattened), the track
    /// lets go of them while they are salted, so that they are salted in place rather than
    /// copied, and then keeps the salted ones: as flattening with `salts` would have left it
    /// (its records salted, [`Self::flatten_salted`]), and the next request of the track, sent
    /// with the same salts, is not rechained from the first one that changed.
    pub fn set_salts(&mut self, flat: &mut FlatRequest, salts: &[(usize, u128)]) {
        let Some(track) = self.tracks.iter_mut().find(|t| Arc::ptr_eq(&t.blocks, &flat.blocks) && t.salts == flat.salts) else {
            flat.set_salts(salts);
            return;
        };
        // Debug builds salt a copy the plain way and compare.
        #[cfg(debug_assertions)]
        let expected = {
            let mut copy = flat.clone();
            copy.set_salts(salts);
            copy
        };
        track.blocks = Arc::default();
        flat.set_salts(salts);
        track.blocks = Arc::clone(&flat.blocks);
        track.salts.clone_from(&flat.salts);
        #[cfg(debug_assertions)]
        assert!(*flat == expected, "salting a flat request in place differs from salting a copy");
    }
}

#[cfg(test)]
mod tests {
    use super::common_keys;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn common_keys_is_the_first_difference(len in 0usize..300, other in 0usize..300, at in 0usize..300, small in any::<bool>()) {
            let a: Vec<u128> = (0..len as u128).map(|i| if small { i % 3 } else { i * 7919 }).collect();
            let mut b: Vec<u128> = (0..other as u128).map(|i| if small { i % 3 } else { i * 7919 }).collect();
            if at < b.len() {
                b[at] = u128::MAX;
            }
            let naive = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            prop_assert_eq!(common_keys(&a, &b), naive);
        }
    }
}

#[cfg(test)]
mod salt_tests {
    use super::Flattener;
    use crate::api::{Message, MessageContent, Request, Role, SystemPrompt};
    use crate::measure::blocks::{BillingKey, FlatRequest, flatten_keyed_by};
    use crate::measure::{EstimatorKind, TokenCounter};
    use proptest::prelude::*;

    fn request(len: usize, thinking: bool) -> Request {
        let mut request = Request::new("claude-opus-4-5-20251101".to_owned(), 1000);
        request.system = Some(SystemPrompt::Text("system prompt".to_owned()));
        if thinking {
            request.thinking = Some(serde_json::json!({"type": "enabled", "budget_tokens": 1024}).into());
        }
        request.messages = (0..len)
            .map(|i| Message {
                role: if i % 2 == 0 { Role::User } else { Role::Assistant },
                content: MessageContent::Text(format!("message {i}").into()),
                extra: Default::default(),
            })
            .collect();
        request
    }

    fn identities(flat: &FlatRequest) -> Vec<(u128, u128)> {
        flat.blocks.iter().map(|b| (b.hash, b.prefix_hash)).collect()
    }

    fn salts(choice: u8, len: usize) -> Vec<(usize, u128)> {
        match choice {
            0 => Vec::new(),
            1 => vec![(0, 7)],
            2 => vec![(0, 7), (len - 1, 11)],
            3 => vec![(len - 1, 11)],
            _ => vec![(len / 2, 13), (len / 2, 17)],
        }
    }

    proptest! {
        /// A line of requests flattened with salts (the track keeping its records salted) gives
        /// what flattening each from scratch and then setting its salts gives, and setting other
        /// salts on it what setting them on the plain one does.
        #[test]
        fn salted_flattening_is_flattening_then_salting(
            steps in prop::collection::vec((1usize..10, 0u8..5, 0u8..5, any::<bool>()), 1..14),
        ) {
            let mut counter = TokenCounter::new(EstimatorKind::Chars4);
            let mut flattener = Flattener::new();
            for (len, choice, then, thinking) in steps {
                let request = request(len, thinking);
                let flat = flattener.flatten_salted(&request, None, None, &salts(choice, len), &mut counter, "test");
                let mut plain = flatten_keyed_by(&request, &mut counter, "test", BillingKey::Keyed);
                let unsalted = plain.clone();
                plain.set_salts(&salts(choice, len));
                prop_assert_eq!(identities(&flat), identities(&plain));
                prop_assert_eq!(&flat.salts, &plain.salts);
                let mut resalted = flat.clone();
                resalted.set_salts(&salts(then, len));
                let mut fresh = unsalted.clone();
                fresh.set_salts(&salts(then, len));
                prop_assert_eq!(identities(&resalted), identities(&fresh));
                resalted.set_salts(&[]);
                prop_assert_eq!(identities(&resalted), identities(&unsalted));
            }
        }

        /// Salts set through the flattener ([`Flattener::set_salts`]: the track takes the
        /// salted records) give what setting them on a copy gives, and the requests after, each
        /// flattened with its own salts, what flattening from scratch and salting does, whether
        /// or not the flat request salted is still held (another copy of it, or one dropped).
        #[test]
        fn salting_through_the_flattener_is_salting(
            steps in prop::collection::vec((1usize..10, 0u8..5, 0u8..5, any::<bool>(), 0u8..3), 1..14),
        ) {
            let mut counter = TokenCounter::new(EstimatorKind::Chars4);
            let mut flattener = Flattener::new();
            let mut held = Vec::new();
            for (len, choice, then, thinking, hold) in steps {
                let request = request(len, thinking);
                let mut flat = flattener.flatten_salted(&request, None, None, &salts(choice, len), &mut counter, "test");
                let mut plain = flatten_keyed_by(&request, &mut counter, "test", BillingKey::Keyed);
                plain.set_salts(&salts(choice, len));
                prop_assert_eq!(identities(&flat), identities(&plain));
                // A copy held elsewhere keeps its records as they were.
                if hold == 1 {
                    held.push((flat.clone(), identities(&flat)));
                }
                flattener.set_salts(&mut flat, &salts(then, len));
                plain.set_salts(&salts(then, len));
                prop_assert_eq!(identities(&flat), identities(&plain));
                prop_assert_eq!(&flat.salts, &plain.salts);
                if hold == 2 {
                    let kept = identities(&flat);
                    held.push((flat, kept));
                }
            }
            for (flat, kept) in &held {
                prop_assert_eq!(&identities(flat), kept);
            }
        }
    }
}

#[cfg(test)]
mod shared_tests {
    use super::Flattener;
    use crate::api::{ContentBlock, Message, MessageContent, Request, Role};
    use crate::measure::blocks::{BillingKey, flatten_keyed_by};
    use crate::measure::{EstimatorKind, TokenCounter};
    use proptest::prelude::*;

    fn message(n: usize, blocks: bool) -> Message {
        let role = if n % 2 == 0 { Role::User } else { Role::Assistant };
        let content = if blocks {
            MessageContent::Blocks(vec![ContentBlock::text(format!("block {n}"))].into())
        } else {
            MessageContent::Text(format!("text {n}").into())
        };
        Message { role, content, extra: Default::default() }
    }

    proptest! {
        /// Requests that share their messages' allocations with the previous one, as the
        /// agent's do (compared by the words of their contents), flatten as each does from
        /// scratch, whatever changes between them: messages appended, replaced, moved, cut, a
        /// role or an extra field changed on a shared allocation. The caller says how many
        /// leading messages are the last request's ([`Flattener::expect_shared`]; any count up
        /// to the first changed), and now and then another request on the same track comes
        /// between (the count is then the wrong request's and is not used).
        #[test]
        fn shared_messages_flatten_as_from_scratch(ops in prop::collection::vec((0u8..7, 0usize..16, any::<bool>(), any::<u8>()), 1..30)) {
            let mut counter = TokenCounter::new(EstimatorKind::Chars4);
            let mut flattener = Flattener::new();
            let mut messages: Vec<Message> = Vec::new();
            let mut stamp = None;
            for (n, (op, at, blocks, known)) in ops.into_iter().enumerate() {
                let mut next = messages.clone();
                let i = if next.is_empty() { None } else { Some(at % next.len()) };
                let changed = match (op, i) {
                    (1, Some(i)) => {
                        next[i] = message(n, blocks);
                        i
                    }
                    (2, Some(i)) => {
                        next[i].role = match (next[i].role, n % 3) {
                            (_, 0) => Role::System,
                            (Role::User, _) => Role::Assistant,
                            _ => Role::User,
                        };
                        i
                    }
                    (3, Some(i)) => {
                        next[i].extra.insert("note".to_owned(), serde_json::json!(n));
                        i
                    }
                    (4, Some(i)) => {
                        let copy = next[i].clone();
                        next.push(copy);
                        next.len() - 1
                    }
                    (5, _) => {
                        next.truncate(at % (next.len() + 1));
                        next.len()
                    }
                    _ => {
                        next.push(message(n, blocks));
                        next.len() - 1
                    }
                };
                messages = next;
                if known % 5 == 0 && !messages.is_empty() {
                    // Another request extending the same first message.
                    let mut side = Request::new("claude-opus-4-5-20251101".to_owned(), 1000);
                    side.messages = vec![messages[0].clone(), message(n + 1000, blocks)];
                    flattener.flatten(&side, &mut counter, "test");
                }
                let mut request = Request::new("claude-opus-4-5-20251101".to_owned(), 1000);
                request.messages = messages.clone();
                flattener.expect_shared(stamp.map(|stamp| (stamp, usize::from(known) % (changed + 1))));
                let flat = flattener.flatten(&request, &mut counter, "test");
                stamp = Some(flattener.last_stamp());
                let plain = flatten_keyed_by(&request, &mut counter, "test", BillingKey::Keyed);
                let identities = |f: &crate::measure::blocks::FlatRequest| f.blocks.iter().map(|b| (b.hash, b.prefix_hash, b.prefix_tokens)).collect::<Vec<_>>();
                prop_assert_eq!(identities(&flat), identities(&plain));
                prop_assert_eq!(flat.total_tokens, plain.total_tokens);
                prop_assert_eq!(flattener.last_system_messages(), crate::api::system_messages::system_positions(&request.messages));
                prop_assert_eq!(crate::api::system_messages::check_at(&request, flattener.last_system_messages()), crate::api::system_messages::check(&request));
            }
        }
    }
}
