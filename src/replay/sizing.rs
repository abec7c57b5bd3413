//! What a transcript does not hold, sized, and the recorded messages as the client sent them:
//! the per-lane state the record view ([`super::record_view`]) keeps from call to call, the
//! filler texts that stand for unrecorded text (the prefix, the user context, unstored
//! thinking) at a token count under the estimator measured, the first call's unrecorded part
//! ([`first_call_sizes`]), and the client's view of recorded messages (cleared results, filled
//! thinking, parallel results in tool_use order). The record view and the workload read the
//! record by them; the agent sizes its unmodelled part from them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

use crate::api::{CacheTtl, ContentBlock, Message, MessageContent, Request, Role, SharedBlocks, ToolResultContent, Usage};
use crate::measure::token_cache::{SharedCounts, bpe_shared};
use crate::measure::tokens::chars4;
use crate::measure::{EstimatorKind, FlatRequest, Measurer};
use crate::recording::format::{LANE_COMPACT, LANE_MAIN};
use crate::recording::{EventKind, ImportedSession, RecordedCall};

use super::profile::{ClientProfile, fitted_with_note};
use super::session::{CLEARED_TOOL_RESULT, UnrecordedSizes};
use super::turns::{TurnState, current_prompt_index, salt_message};
use super::working_set::WorkingSet;

/// Sizes inferred for one lane group (main + compact share one; every subagent has its own).
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupSizes {
    pub(super) prefix_tokens: u64,
    pub(super) context_tokens: u64,
}

#[derive(Debug, Clone, Default)]
pub(super) struct LaneState {
    pub(super) ttl: Option<CacheTtl>,
    pub(super) model: Option<String>,
    pub(super) last_time_ms: Option<u64>,
    /// Index of the last event of this lane already scanned.
    pub(super) scanned_to: usize,
    pub(super) cleared: BTreeSet<String>,
    pub(super) loaded_tools: Vec<String>,
    /// A ToolSearch load already changed the tools array.
    pub(super) tool_search_loaded: bool,
    pub(super) rerender_epoch: u32,
    /// (Shared with a compaction fork's request.)
    pub(super) restored: SharedBlocks,
    /// `cache_read + cache_creation` of the lane's previous compared call, as recorded.
    pub(super) prev_recorded_cached: Option<u64>,
    /// Events of skipped calls (synthetic replies, errors), passed on to the next call.
    pub(super) carried_events: Vec<String>,
    /// Events before this index were loaded back from the transcript by a resumed client.
    pub(super) loaded_until: usize,
    /// The files read, edited and written so far (what a compaction restores).
    pub(super) working_set: WorkingSet,
    /// Tool uses waiting for their result: id → (the reply holding it, shared with the
    /// recording, and its block index).
    pub(super) pending: BTreeMap<String, (Arc<crate::recording::Event>, usize)>,
    /// Tool results recorded in this lane so far.
    pub(super) seen_results: BTreeSet<String>,
    /// Tokens a microcompact freed from history older than the transcript (a session segment
    /// that starts mid-conversation): taken off the unrecorded part.
    pub(super) hidden_saved: u64,
    /// A compaction dropped the unrecorded history of a mid-conversation segment.
    pub(super) compacted: bool,
    /// The unrecorded part changed by an amount the transcript does not give (a compaction of a
    /// head-truncated segment, a microcompact of history older than the transcript): the next
    /// compared call's recorded total sizes the user context of the new segment.
    pub(super) anchor_pending: bool,
    /// The pending anchor follows a compaction the recording holds: it sizes the new segment
    /// of a whole session too (what the client restored or dropped beyond the transcript,
    /// e.g. the `@`-files a slash command attached, shows only in that call's total).
    pub(super) anchor_after_compaction: bool,
    /// The user context (with any older history) of the current segment, as its first call
    /// showed it.
    pub(super) segment_context: Option<u64>,
    /// Turn-level client behaviour (main lane only).
    pub(super) turns: TurnState,
    /// Bumped whenever `cleared` changes, and `restored`.
    pub(super) cleared_version: u64,
    pub(super) restored_version: u64,
}

/// Keys of the messages a replay builds, for [`Measurer::flatten_keyed`]: equal keys mean
/// identical messages. A key is derived (xxh3-128) from everything its message is built from;
/// `space` ([`Measurer::new_key_space`]) keeps the keys of two replays through one measurer
/// apart.
#[derive(Debug, Clone)]
pub(super) struct MessageKeys {
    space: u64,
}

#[derive(Debug, Clone, Copy)]
enum KeyTag {
    Built = 1,
}

impl MessageKeys {
    pub(super) fn new(space: u64) -> MessageKeys {
        MessageKeys { space }
    }

    fn derive(&self, tag: KeyTag, words: &[u64]) -> u128 {
        assert!(words.len() <= 6, "a message key has at most six inputs");
        let mut bytes = [0u8; 64];
        let mut n = 0;
        for word in [tag as u64, self.space].into_iter().chain(words.iter().copied()) {
            bytes[n..n + 8].copy_from_slice(&word.to_le_bytes());
            n += 8;
        }
        xxhash_rust::xxh3::xxh3_128(&bytes[..n])
    }
}

/// A lane's messages as the client changed them (cleared results, filled thinking, ordered
/// parallel results), kept from call to call, each with the key of what it was built from: its
/// serial and the previous message's in the [`crate::recording::ViewCache`] (equal serials =
/// identical raw messages) and the version of the lane's cleared set. A message whose key did
/// not change is identical to what rebuilding it would give, so it is kept, and its key goes to
/// the flattener.
#[derive(Debug, Clone, Default)]
pub(super) struct BuiltView {
    pub(super) messages: Vec<Message>,
    keys: Vec<u128>,
    /// Per message: what its key was derived from (the key space, its serial, the previous
    /// message's, the cleared set's version), `None` where the key is not to be kept: a message
    /// whose inputs are these again has that key without deriving it (debug builds derive it and
    /// compare).
    inputs: Vec<Option<[u64; 4]>>,
    /// Per message: the tool result its breakpoint goes on were it the last ([`order_message`]).
    marked: Vec<Option<String>>,
    /// The restored files of this version of the lane ([`LaneState::restored_version`]) follow
    /// the first message's own blocks ([`Self::with_restored`]): kept from call to call with
    /// the message instead of copied onto it for every request.
    restored: Option<u64>,
    /// What the messages were last built for: the key space, the cleared set's version and the
    /// serials. The leading messages whose serials are these again (under the same space and
    /// version) have the inputs they were built from, so they are kept without a look.
    built_for: (u64, u64, Vec<u64>),
}

impl BuiltView {
    /// `restored_version`: the lane's; a first message holding the files of another version is
    /// built again.
    pub(super) fn update(&mut self, raw: &[Message], serials: &[u64], keys: &MessageKeys, cleared: (&BTreeSet<String>, u64), thinking: &BTreeMap<String, ThinkingFill>, restored_version: u64) {
        self.messages.truncate(raw.len());
        self.keys.truncate(raw.len());
        self.inputs.truncate(raw.len());
        self.marked.truncate(raw.len());
        if self.messages.is_empty() || self.restored.is_some_and(|version| version != restored_version) {
            self.restored = None;
            if let Some(first) = self.keys.first_mut() {
                // No derived key is 0: the first message is built again below.
                *first = 0;
                self.inputs[0] = None;
            }
        }
        // Every message built last time has the inputs it was built from (set below, or kept
        // as they were): those of the leading ones whose serials are given again are these
        // again. The first is looked at anyway (its restored files can have it built again).
        let kept = if self.built_for.0 == keys.space && self.built_for.1 == cleared.1 {
            self.built_for.2.iter().zip(serials).take_while(|(a, b)| a == b).count().min(self.inputs.len())
        } else {
            0
        };
        if cfg!(debug_assertions) {
            for i in 1..kept {
                assert_eq!(self.inputs[i], Some([keys.space, serials[i], serials[i - 1], cleared.1]), "a kept message's inputs");
            }
        }
        for i in (0..raw.len().min(1)).chain(kept.max(1)..raw.len()) {
            let source = &raw[i];
            let previous = if i > 0 { serials[i - 1] } else { 0 };
            let inputs = [keys.space, serials[i], previous, cleared.1];
            if self.inputs.get(i) == Some(&Some(inputs)) {
                debug_assert_eq!(keys.derive(KeyTag::Built, &inputs[1..]), self.keys[i], "a kept message key");
                continue;
            }
            let key = keys.derive(KeyTag::Built, &inputs[1..]);
            if self.keys.get(i) == Some(&key) {
                self.inputs[i] = Some(inputs);
                continue;
            }
            if i == 0 {
                self.restored = None;
            }
            let mut message = source.clone();
            client_view(&mut message, cleared.0, thinking);
            let marked = if i > 0 { order_message(&raw[i - 1], &mut message) } else { None };
            if i < self.messages.len() {
                (self.messages[i], self.keys[i], self.inputs[i], self.marked[i]) = (message, key, Some(inputs), marked);
            } else {
                self.messages.push(message);
                self.keys.push(key);
                self.inputs.push(Some(inputs));
                self.marked.push(marked);
            }
        }
        self.built_for.0 = keys.space;
        self.built_for.1 = cleared.1;
        self.built_for.2.clear();
        self.built_for.2.extend_from_slice(serials);
    }

    /// Appends `restored` (the lane's restored files, of `version`) to the first message when
    /// it is a user message, unless it holds them already: what every request of the lane sends
    /// ([`Unrecorded::request_keys`] folds the version into the first message's key).
    pub(super) fn with_restored(&mut self, restored: &[ContentBlock], version: u64) {
        if restored.is_empty() || self.restored.is_some() {
            return;
        }
        if let Some(first) = self.messages.first_mut()
            && first.role == Role::User
        {
            first.content.blocks_mut().extend(restored.iter().cloned());
            self.restored = Some(version);
        }
    }
}

/// The thinking of a reply whose text was not stored: its estimated tokens, and the estimator
/// parameters of its model, under which the filler counts that many.
#[derive(Debug, Clone)]
pub(crate) struct ThinkingFill {
    tokens: u64,
    kind: EstimatorKind,
    scale: f64,
    per_block: f64,
    shared: Option<Arc<SharedCounts>>,
}

impl ThinkingFill {
    /// The filler standing for the thinking: counts [`ThinkingFill::tokens`] under its estimator.
    pub(crate) fn text(&self) -> String {
        filler("thinking", self.tokens, self.kind, self.scale, self.per_block, self.shared.as_deref())
    }
}

/// Estimated thinking of the replies of `session` whose text was not stored, keyed by the
/// thinking block's signature: the fitted share (per version, [`crate::measure::Calibration`]'s
/// `thinking_fill`) of the output beyond the visible part, counted in the model's tokens, to be
/// rendered to count that many tokens under the model's estimator parameters. The replay and the
/// agent-driven workload ([`super::workload`]) fill thinking from this one estimate.
pub(crate) fn unstored_thinking(session: &ImportedSession, measurer: &Measurer, main_version: &str, notes: &mut BTreeSet<String>) -> BTreeMap<String, ThinkingFill> {
    // Memoized on the session: the record view, the workload and its first call's sizing each
    // read it.
    session.record_view_memo().unstored_thinking(session, measurer, main_version, notes, |notes| estimate_unstored_thinking(session, measurer, main_version, notes))
}

/// Whether two estimates of unstored thinking are the same: signatures, tokens and estimator
/// parameters alike.
pub(super) fn same_thinking(a: &BTreeMap<String, ThinkingFill>, b: &BTreeMap<String, ThinkingFill>) -> bool {
    let same = |x: &ThinkingFill, y: &ThinkingFill| {
        let same_shared = match (&x.shared, &y.shared) {
            (Some(p), Some(q)) => Arc::ptr_eq(p, q),
            (None, None) => true,
            _ => false,
        };
        x.tokens == y.tokens && x.kind == y.kind && x.scale.to_bits() == y.scale.to_bits() && x.per_block.to_bits() == y.per_block.to_bits() && same_shared
    };
    a.len() == b.len() && a.iter().zip(b).all(|((ka, va), (kb, vb))| ka == kb && same(va, vb))
}

/// [`unstored_thinking`] estimated.
fn estimate_unstored_thinking(session: &ImportedSession, measurer: &Measurer, main_version: &str, notes: &mut BTreeSet<String>) -> BTreeMap<String, ThinkingFill> {
    let calibration = measurer.counter().calibration();
    let kind = measurer.counter().kind();
    let mut thinking_estimate: BTreeMap<String, ThinkingFill> = BTreeMap::new();
    let mut lookup = crate::measure::models::LastLookup::default();
    for event in &session.recording.events {
        if let EventKind::ModelReply(reply) = &event.kind
            && (!reply.thinking_text_stored || resends_its_output(reply, main_version))
        {
            let key = lookup.index(measurer.table(), &reply.model).map(|i| measurer.table().models[i].estimator_key()).unwrap_or_default();
            let counter = measurer.counter();
            let params = calibration.for_family(&key);
            let resent = resends_its_output(reply, main_version);
            // A reply sent back whole counts its output: its visible blocks are counted as the
            // request counts them, each with the estimator's per-block overhead, so that the
            // thinking filled beside them brings the reply to its output and not one overhead
            // per visible block beyond it.
            let overhead = if resent && kind == EstimatorKind::Calibrated { params.per_block } else { 0.0 };
            let visible: u64 = reply
                .content
                .iter()
                .filter(|b| !b.is_thinking())
                .map(|block| {
                    let units: u64 = crate::measure::blocks::content_token_units(block)
                        .into_iter()
                        .map(|u| match u {
                            crate::measure::tokens::TokenUnit::Text(t) => u64::from(counter.count_text(&t, &key)),
                            crate::measure::tokens::TokenUnit::Fixed(n) => u64::from(n),
                        })
                        .sum();
                    (units as f64 + overhead).round().max(0.0) as u64
                })
                .sum();
            let version = reply.version.as_deref().unwrap_or(main_version);
            let ratio = if resent {
                1.0
            } else {
                fitted_with_note(&calibration.thinking_fill, version, "thinking fill", notes).copied().unwrap_or(1.0)
            };
            let filled = |block: &ContentBlock| matches!(block, ContentBlock::Thinking { thinking, .. } if thinking.is_empty() || resent);
            // Interleaved thinking: the reply's blocks share the estimate.
            let blocks = reply.content.iter().filter(|b| filled(b)).count().max(1) as f64;
            let tokens = (ratio * reply.usage.output_tokens.saturating_sub(visible) as f64 / blocks).round() as u64;
            for block in &reply.content {
                if let ContentBlock::Thinking { signature, .. } = block
                    && filled(block)
                {
                    thinking_estimate.insert(signature.clone(), ThinkingFill { tokens, kind, scale: params.scale, per_block: params.per_block, shared: measurer.counter().shared().cloned() });
                }
            }
        }
    }
    thinking_estimate
}

/// A reply of 2.1.200+ with thinking: the record's `output_tokens` is the final count, and the
/// reply is sent back whole, its thinking as generated (the stored text, when there is one, is
/// a summary). Its thinking is filled to the output beyond the visible part, whatever was stored.
/// Not where the transcript records the request that carried it back (`requestRef`): the
/// record says what was sent.
pub(super) fn resends_its_output(reply: &crate::recording::ModelReply, main_version: &str) -> bool {
    super::profile::parse_version(reply.version.as_deref().unwrap_or(main_version)) >= super::profile::CURRENT_LAYOUT
        && reply.request_ref.is_none()
        && reply.usage.output_tokens > 0
        && reply.content.iter().any(ContentBlock::is_thinking)
}

/// The prefix level (tools + system) of a lane group's first compared call, whose
/// `unrecorded_tokens` are its billed prompt beyond its recorded messages. `main`: the call is
/// the main thread's; `truncated`: its file continues a session.
pub(super) fn first_call_prefix(
    call: &RecordedCall,
    unrecorded_tokens: u64,
    main: bool,
    truncated: bool,
    user_context_prior: u64,
    fitted_prefixes: &BTreeMap<String, u64>,
    notes: &mut BTreeSet<String>,
) -> u64 {
    let warm = call.usage.cache_read_input_tokens;
    if warm > 0 {
        // A warm start: an earlier session of the same client cached exactly this prefix.
        warm.min(unrecorded_tokens)
    } else if main && !truncated {
        // The whole session is in the transcript: the first call is tools + system +
        // user context + the first prompt, and the user context is the fitted prior.
        unrecorded_tokens.saturating_sub(user_context_prior)
    } else {
        // A cold start that cannot show its prefix: the fitted level of this version
        // (or the nearest) for the main thread, else the measured 2.1.88 size.
        let version = call.version.as_deref().unwrap_or("");
        let fitted = if main { fitted_with_note(fitted_prefixes, version, "prefix level", notes).copied() } else { None };
        fitted.unwrap_or(ClientProfile::for_version(version).cold_prefix_tokens).min(unrecorded_tokens)
    }
}

/// The Claude Code version of the session's first main-lane call (empty: none recorded).
pub fn main_version(session: &ImportedSession) -> String {
    session.calls.iter().find(|c| c.lane == LANE_MAIN).and_then(|c| c.version.clone()).unwrap_or_default()
}

/// The user context (CLAUDE.md, rules, memory) the calibration fitted for `version`, the
/// nearest fitted version's with a note in `notes`, else the fit's overall value.
pub fn user_context_prior(calibration: &crate::measure::tokens::Calibration, version: &str, notes: &mut BTreeSet<String>) -> u64 {
    fitted_with_note(&calibration.user_context_by_version, version, "user context", notes).copied().or(calibration.user_context_tokens).unwrap_or(0)
}

/// The unrecorded part of the main thread's first compared call, as the replay sizes it when it
/// reaches that call ([`SessionReplay::unrecorded_main`] before any later call revealed another
/// prefix level), without replaying the session: the call's billed prompt less its recorded
/// messages (unstored thinking filled to the replay's estimate), split by [`first_call_prefix`].
/// Where a fitted value (user context, thinking fill, prefix level) is another version's, says
/// so in `notes`.
pub fn first_call_sizes(session: &ImportedSession, measurer: &mut Measurer, notes: &mut BTreeSet<String>) -> Option<UnrecordedSizes> {
    let call = session.calls.iter().find(|c| group_of(&c.lane) == LANE_MAIN && !c.is_synthetic && !c.is_api_error && c.usage.prompt_tokens() > 0)?;
    let calibration = measurer.counter().calibration().clone();
    let main_version = main_version(session);
    let user_context_prior = user_context_prior(&calibration, &main_version, notes);
    let thinking = unstored_thinking(session, measurer, &main_version, notes);
    let mut messages = session.messages_for_call(call);
    for message in &mut messages {
        client_view(message, &BTreeSet::new(), &thinking);
    }
    let mut bare = Request::new(call.model.clone(), 32_000);
    bare.messages = messages;
    let flat = measurer.flatten(&bare).ok()?;
    let unrecorded_tokens = call.usage.prompt_tokens().saturating_sub(flat.total_tokens);
    let truncated = session.recording.header.head_truncated;
    let prefix = first_call_prefix(call, unrecorded_tokens, true, truncated, user_context_prior, &calibration.prefix_tokens, notes);
    Some(UnrecordedSizes { first_call_tokens: unrecorded_tokens, prefix_tokens: prefix, prefix_from_record: call.usage.cache_read_input_tokens > 0 })
}

/// The files the main thread's first compared call @-mentions in its user messages (a slash
/// command's text often does: `@.planning/STATE.md`), resolved against the session's working
/// directory. The client attaches each file to that turn as a Read of it: part of the
/// conversation, which a compaction drops, and not in the transcript.
pub fn first_call_mentions(session: &ImportedSession) -> Vec<String> {
    let Some(call) = session.calls.iter().find(|c| group_of(&c.lane) == LANE_MAIN && !c.is_synthetic && !c.is_api_error && c.usage.prompt_tokens() > 0) else {
        return Vec::new();
    };
    let cwd = session.recording.header.cwd.clone().unwrap_or_default();
    let mut out: Vec<String> = Vec::new();
    for message in session.messages_for_call(call).iter().filter(|m| m.role == crate::api::Role::User) {
        let texts: Vec<&str> = match &message.content {
            MessageContent::Text(text) => vec![text.as_str()],
            MessageContent::Blocks(blocks) => blocks.iter().filter_map(|b| if let ContentBlock::Text { text, .. } = b { Some(text.as_str()) } else { None }).collect(),
        };
        for path in texts.into_iter().flat_map(|t| crate::agent::instructions::include_paths(t, &cwd)) {
            if !out.contains(&path) {
                out.push(path);
            }
        }
    }
    out
}

/// What the client changes in a recorded message before sending it: the results a recorded
/// microcompact cleared, and thinking whose text was not stored filled to its estimate.
pub(super) fn client_view(message: &mut Message, cleared: &BTreeSet<String>, thinking_estimate: &BTreeMap<String, ThinkingFill>) {
    let MessageContent::Blocks(blocks) = &mut message.content else { return };
    // Blocks shared with the recording are copied only when one of them changes.
    let changes = |block: &ContentBlock| match block {
        ContentBlock::ToolResult { tool_use_id, .. } => cleared.contains(tool_use_id),
        ContentBlock::Thinking { signature, .. } => thinking_estimate.contains_key(signature.as_str()),
        _ => false,
    };
    let Some(first) = blocks.iter().position(changes) else { return };
    for block in blocks.iter_mut().skip(first) {
        match block {
            ContentBlock::ToolResult { tool_use_id, content, .. } if cleared.contains(tool_use_id) => {
                *content = Some(ToolResultContent::Text(CLEARED_TOOL_RESULT.into()));
            }
            ContentBlock::Thinking { thinking, signature, .. } => {
                if let Some(fill) = thinking_estimate.get(signature.as_str()) {
                    *thinking = fill.text();
                }
            }
            _ => {}
        }
    }
}

pub(super) fn group_of(lane: &str) -> &str {
    if lane == LANE_COMPACT { LANE_MAIN } else { lane }
}

/// A text whose estimate under `kind` is `target` tokens: a label, then words that are one
/// token each under both chars/4 (four characters) and o200k (one pre-token per word).
///
/// Not the agent's padding ([`crate::agent::profile::pad_to_size`]), on purpose: that one pads
/// our own prompt text to the characters and o200k tokens a capture of the client measured;
/// this one stands in for text the record does not hold (the unrecorded prefix, unstored
/// thinking, a file known in part) at a token count under the estimator being measured.
///
/// Memoized per thread: a replay asks for the same texts at every call (the prefix level, the
/// user context, the thinking of every earlier reply), a sweep at every point. The memo holds
/// at most [`FILLER_MEMO_BYTES`] of text and starts over when full.
pub(crate) fn filler(label: &str, target: u64, kind: EstimatorKind, scale: f64, per_block: f64, shared: Option<&SharedCounts>) -> String {
    type Key = (String, u64, EstimatorKind, u64, u64);
    thread_local! {
        static MEMO: std::cell::RefCell<(BTreeMap<Key, String>, usize)> = const { std::cell::RefCell::new((BTreeMap::new(), 0)) };
    }
    let key = (label.to_owned(), target, kind, scale.to_bits(), per_block.to_bits());
    MEMO.with_borrow_mut(|(memo, bytes)| {
        if let Some(text) = memo.get(&key) {
            return text.clone();
        }
        let text = render_filler(label, target, kind, scale, per_block, shared);
        if *bytes + text.len() > FILLER_MEMO_BYTES {
            memo.clear();
            *bytes = 0;
        }
        *bytes += text.len();
        memo.insert(key, text.clone());
        text
    })
}

/// The most filler text [`filler`] keeps per thread.
const FILLER_MEMO_BYTES: usize = 64 << 20;

fn render_filler(label: &str, target: u64, kind: EstimatorKind, scale: f64, per_block: f64, shared: Option<&SharedCounts>) -> String {
    let raw_target = match kind {
        EstimatorKind::Calibrated => (((target as f64) - per_block) / scale.max(0.05)).round().clamp(0.0, 4.0 * target as f64) as u64,
        _ => target,
    };
    let head = format!("<{label}>");
    let head_tokens = u64::from(match kind {
        EstimatorKind::Chars4 => chars4(&head),
        _ => bpe_shared(shared, &head),
    });
    let words = raw_target.saturating_sub(head_tokens) as usize;
    const WORDS: [&str; 6] = [" the", " and", " for", " not", " you", " are"];
    let mut text = String::with_capacity(head.len() + words * 4);
    text.push_str(&head);
    for i in 0..words {
        text.push_str(WORDS[i % WORDS.len()]);
    }
    text
}

pub(crate) fn ttl_of(usage: &Usage) -> Option<CacheTtl> {
    let split = usage.cache_creation.as_ref()?;
    if split.ephemeral_1h_input_tokens > 0 {
        Some(CacheTtl::OneHour)
    } else if split.ephemeral_5m_input_tokens > 0 {
        Some(CacheTtl::FiveMinutes)
    } else {
        None
    }
}

/// Puts the results of parallel tool calls in the order of their tool uses, as the client sends
/// them, and returns the id of the result its breakpoint goes on when that is not the last
/// block: the client marks the message that completed last, so results of later tool uses that
/// completed earlier trail the breakpoint and are billed as uncached input (15 of the 16 calls
/// after out-of-order parallel results in ../shared/realdata show exactly that tail).
pub(super) fn order_tool_results(messages: &mut [Message]) -> Option<String> {
    let mut marked = None;
    for i in 1..messages.len() {
        let (before, rest) = messages.split_at_mut(i);
        let m = order_message(&before[i - 1], &mut rest[0]);
        if rest.len() == 1 {
            marked = m;
        }
    }
    marked
}

/// [`order_tool_results`] for one message after `previous`: the id of the result that completed
/// last when it no longer ends the message and only results follow it.
fn order_message(previous: &Message, message: &mut Message) -> Option<String> {
    if message.role != Role::User || previous.role != Role::Assistant {
        return None;
    }
    // Only a message opening with two results or more is reordered.
    let MessageContent::Blocks(blocks) = &mut message.content else { return None };
    let run = blocks.iter().take_while(|b| matches!(b, ContentBlock::ToolResult { .. })).count();
    if run < 2 {
        return None;
    }
    let uses: &[ContentBlock] = match &previous.content {
        MessageContent::Blocks(uses) => uses,
        MessageContent::Text(_) => &[],
    };
    let order: BTreeMap<&str, usize> = uses
        .iter()
        .filter_map(|b| match b {
            ContentBlock::ToolUse { id, .. } => Some(id.as_str()),
            _ => None,
        })
        .enumerate()
        .map(|(k, id)| (id, k))
        .collect();
    let id_of = |b: &ContentBlock| match b {
        ContentBlock::ToolResult { tool_use_id, .. } => tool_use_id.clone(),
        _ => String::new(),
    };
    let completed_last = id_of(&blocks[run - 1]);
    blocks[..run].sort_by_key(|b| order.get(id_of(b).as_str()).copied().unwrap_or(usize::MAX));
    (run == blocks.len() && id_of(&blocks[run - 1]) != completed_last).then_some(completed_last)
}

/// The API's view of a request to a model that drops earlier turns' thinking: the thinking
/// blocks before the last user message that is not only tool results count no tokens. Their
/// positions stay, so the cached prefix stays valid: 45 of 51 real new turns after thinking kept
/// their cache (reference/real-breaks.md), and the context drops by that thinking.
fn strip_prior_thinking(request: &Request, flat: &mut FlatRequest) {
    if let Some(last_prompt) = current_prompt_index(&request.messages) {
        crate::measure::blocks::drop_thinking_before(flat, last_prompt);
    }
}

/// A prompt that is the `/exit` (or `/quit`) local command.
/// Whether a recorded event shows a new client process resuming the session: the SessionStart
/// hook's source `resume` (a hook progress record of 2.1.x, the hook's attachment of 2.1.2xx),
/// or `/exit` (whatever comes next is a resumed process). One rule for the replay and the
/// workload ([`super::workload`]'s `resume_lost` step).
pub fn marks_resume(kind: &EventKind) -> bool {
    match kind {
        EventKind::SystemEvent(sys) => {
            let resumed = holds_resume_hook(&sys.payload);
            debug_assert_eq!(resumed, sys.payload.to_string().contains(RESUME_HOOK), "a system event's text and its strings differ on the resume hook");
            resumed
        }
        EventKind::Attachment(attachment) => attachment.payload.get("hookName").and_then(Value::as_str) == Some(RESUME_HOOK),
        EventKind::UserPrompt(prompt) => is_exit_command(&prompt.content),
        _ => false,
    }
}

/// The SessionStart hook's name with the `resume` source.
const RESUME_HOOK: &str = "SessionStart:resume";

/// Whether `value`'s JSON text holds [`RESUME_HOOK`], read from its keys and strings without
/// writing the text: the name has no quote, backslash or control character, so in the text it
/// lies within one string's characters written as they are (an escape begins with a backslash,
/// and `S` is no character an escape goes on with), and it has letters no number or literal
/// holds.
fn holds_resume_hook(value: &Value) -> bool {
    static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> = std::sync::LazyLock::new(|| memchr::memmem::Finder::new(RESUME_HOOK));
    let holds = |text: &str| FINDER.find(text.as_bytes()).is_some();
    match value {
        Value::String(text) => holds(text),
        Value::Array(items) => items.iter().any(holds_resume_hook),
        Value::Object(map) => map.iter().any(|(key, value)| holds(key) || holds_resume_hook(value)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

fn is_exit_command(content: &MessageContent) -> bool {
    content.to_blocks().iter().any(|b| match b {
        ContentBlock::Text { text, .. } => ["<command-name>/exit</command-name>", "<command-name>/quit</command-name>"].iter().any(|c| text.contains(c)),
        _ => false,
    })
}

/// What the API sees of a built request: earlier turns' thinking dropped for models that do so,
/// and the current prompt rendered the transient way when the client re-renders it later.
pub(super) fn shape_flat(request: &Request, flat: &mut FlatRequest, strips_thinking: bool, transient: bool) {
    if strips_thinking {
        strip_prior_thinking(request, flat);
    }
    if transient && let Some(index) = current_prompt_index(&request.messages) {
        salt_message(flat, index);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    use super::{RESUME_HOOK, holds_resume_hook};

    proptest! {
        /// A view updated call after call (its leading messages kept without a look where their
        /// serials come again) holds what a view built from scratch for the call holds.
        #[test]
        fn an_updated_view_is_the_view_built_anew(calls in prop::collection::vec((prop::collection::vec(0u64..4, 0..8), 0u64..2, 0u64..2), 1..12)) {
            let keys = super::MessageKeys::new(7);
            let cleared = std::collections::BTreeSet::new();
            let mut view = super::BuiltView::default();
            for (serials, cleared_version, restored_version) in calls {
                let raw: Vec<crate::api::Message> = serials.iter().map(|n| crate::api::Message::user_text(format!("message {n}"))).collect();
                view.update(&raw, &serials, &keys, (&cleared, cleared_version), &Default::default(), restored_version);
                let mut anew = super::BuiltView::default();
                anew.update(&raw, &serials, &keys, (&cleared, cleared_version), &Default::default(), restored_version);
                prop_assert_eq!(&view.messages, &anew.messages);
                prop_assert_eq!(&view.keys, &anew.keys);
                prop_assert_eq!(&view.marked, &anew.marked);
            }
        }
    }

    /// Texts made of the hook name's parts and the characters an escape writes.
    fn text() -> impl Strategy<Value = String> {
        prop::collection::vec(prop_oneof![
            Just("SessionStart"), Just(":"), Just("resume"), Just("SessionStart:resume"), Just("\""), Just("\\"), Just("\n"), Just("\u{1}"), Just("S"), Just("é")
        ], 0..6)
        .prop_map(|parts| parts.concat())
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![Just(Value::Null), any::<bool>().prop_map(Value::Bool), any::<i64>().prop_map(Value::from), text().prop_map(Value::String)];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((text(), inner), 0..4).prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<String, Value>>())),
            ]
        })
    }

    #[test]
    fn resume_hook_read_from_strings_as_from_the_text() {
        for (value, holds) in [
            (json!({"hookName": RESUME_HOOK}), true),
            (json!({RESUME_HOOK: 1}), true),
            (json!({"data": [{"x": format!("a\n\"{RESUME_HOOK}\"\\")}]}), true),
            (json!({"SessionStart": "resume"}), false),
            (json!({"hookName": "SessionStart:startup", "source": "resume"}), false),
            (json!("SessionStart\\:resume"), false),
        ] {
            assert_eq!(holds_resume_hook(&value), holds, "{value}");
            assert_eq!(value.to_string().contains(RESUME_HOOK), holds, "{value}");
        }
    }

    proptest! {
        #[test]
        fn resume_hook_in_strings_is_in_the_text(value in value()) {
            prop_assert_eq!(holds_resume_hook(&value), value.to_string().contains(RESUME_HOOK));
        }
    }
}
