//! Replays an imported session: for every recorded API call, the request the client would have
//! sent, measured with [`Measurer`] at the time it was sent (the time of the user prompt or tool
//! result recorded before it; its recorded time, the first streamed block, is its first token).
//!
//! What each rebuilt request holds, in order:
//! - `tools`: empty, except deferred tools loaded by ToolSearch (appended on their first load,
//!   which puts them ahead of everything cached: the full miss the real client shows);
//! - `system`: one block with the lane's prefix level of tokens (see [`super::profile`]) and a
//!   breakpoint, as Claude Code marks its system blocks;
//! - `messages`: the user-context reminder (the unrecorded rest of the first call's size) opening
//!   `messages[0]`, then the messages the call saw ([`ImportedSession::messages_for_call_loaded`]:
//!   after a resume, without the parallel results the client lost; for the compaction request, the
//!   main thread's view plus its own) with tool results cleared by a recorded microcompact,
//!   thinking whose text was not stored filled to its estimate, parallel tool results in tool_use
//!   order, and the working set the client restores after a compaction
//!   ([`super::working_set`]); one breakpoint on the last block, or on the parallel result that
//!   completed last.
//!
//! The TTL of every breakpoint is the one in force for the call, read from the recorded
//! `cache_creation` split (1h when any 1h tokens were written, 5m when 5m were, else the
//! lane's last one). Because every request marks its last block, a call reads what the
//! previous call *cached* (its read + creation), not its whole prompt, as the API does.
//!
//! The record also corrects the replay's picture of the cache where it shows what was cached: a
//! warm first call's prefix is seeded, and a read that falls into the unrecorded part at a
//! re-render sets the prefix level from then on (`prefix_level`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::api::{
    CacheControl, CacheTtl, ContentBlock, Message, MessageContent, Request, Role, SharedBlocks, SystemBlock, SystemPrompt, Tool,
    ToolResultContent, Usage,
};
use crate::measure::blocks::Region;
use crate::measure::token_cache::{SharedCounts, bpe_shared};
use crate::measure::tokens::chars4;
use crate::measure::{EstimatorKind, FlatRequest, MeasureInput, Measurer, RequestMetrics};
use crate::recording::format::{LANE_COMPACT, LANE_MAIN};
use crate::recording::{
    EventKind, ImportError, ImportedSession, InputFormat, RecordedCall, detect_format_at, import_claude_code,
    read_recording,
};

use super::profile::{ClientProfile, fitted_with_note};
use super::turns::{TurnState, current_prompt_index, salt_message, side_cut};
use super::working_set::WorkingSet;

/// Text a microcompact leaves in place of a cleared tool result.
pub const CLEARED_TOOL_RESULT: &str = "[Old tool result content cleared]";

/// Knobs of a replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayOptions {
    /// Render the prompts the client re-renders at the next user turn (the N-pattern of
    /// 2.0.76–2.1.39) the transient way during their turn ([`super::turns`]).
    pub rerender_prompts: bool,
    /// Seed the side entry a finished turn leaves (the conversation through the last reply).
    pub side_entries: bool,
    /// Restore recently read files after a compaction.
    pub restore_files: bool,
    /// Apply the microcompacts the recording shows (clear the results they cleared).
    pub recorded_microcompact: bool,
    /// Judge the information lost ([`SessionReplay::info_loss`]); callers that do not report it
    /// (`audit`) skip the walk of every request it costs.
    #[serde(skip)]
    pub info_loss: bool,
    /// Judge the information each main-lane compaction loses
    /// ([`SessionReplay::compaction_losses`]); a caller that reads counts only skips it.
    #[serde(skip)]
    pub compaction_losses: bool,
    /// Measure the request a 2.1.2xx/3xx transcript recorded sending (`api-request` records,
    /// [`crate::recording::api_requests`]) instead of reconstructing it, wherever it can be
    /// rebuilt exactly and the options leave the recorded requests as they were.
    pub recorded_requests: bool,
    /// The first main call after a compaction the recording holds sizes the new segment's
    /// unrecorded part (its recorded total less the prefix level and its messages), in whole
    /// sessions as in head-truncated ones (docs/fidelity.md, "Compaction anchor").
    #[serde(skip)]
    pub compaction_anchor: bool,
}

impl ReplayOptions {
    /// Whether these options change what the model would have seen (beyond the cache): the
    /// recorded microcompacts left out.
    pub fn changes_view(&self) -> bool {
        !self.recorded_microcompact
    }
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            rerender_prompts: true,
            side_entries: true,
            restore_files: true,
            recorded_microcompact: true,
            info_loss: true,
            compaction_losses: true,
            recorded_requests: true,
            compaction_anchor: true,
        }
    }
}

/// One recorded call and its replay.
#[derive(Debug, Clone, Serialize)]
pub struct CallReplay {
    pub index: usize,
    pub lane: String,
    pub time_ms: u64,
    pub model: String,
    pub version: Option<String>,
    pub recorded: Usage,
    /// Why the call is not compared (synthetic reply, API error, no usage), if it is not.
    pub skipped: Option<String>,
    /// The measured request (cache figures before the N-pattern adjustment).
    pub metrics: Option<RequestMetrics>,
    /// Simulated cache read and creation after the N-pattern expected value.
    pub sim_cache_read: f64,
    pub sim_cache_creation: f64,
    pub sim_input: f64,
    /// Events the replay saw before this call: `compaction`, `microcompact`, `model_switch`,
    /// `tool_search_load`, `skill`, `resume`, `ttl_expired`, `new_user_turn`.
    pub events: Vec<String>,
    /// 1 when this call re-renders the previous turn's prompt (the N-pattern), else 0.
    pub rerender_probability: f64,
    /// Tokens of the recorded messages as estimated (without the synthetic prefix blocks).
    pub message_tokens: u64,
    pub message_blocks: u64,
    /// Tokens of tools + system (the prefix level) and of the user-context reminder in force.
    pub prefix_tokens: u64,
    pub user_context_tokens: u64,
    /// The call's reply holds thinking whose text was not stored (the next call's messages
    /// carry it filled to its estimate).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub thinking_filled: bool,
    /// Characters (JSON) of the attachment records since the lane's previous call that the
    /// client sends as reminders (2.1.2xx: listings, hook context, token and task reminders,
    /// changed files).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attachment_chars: u64,
    /// Of those, the characters of attachments the replay does not render at the client's size
    /// ([`crate::recording::claude_code::attachment_client_sized`]); a fit leaves these steps out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unsized_attachment_chars: u64,
    /// The measured request is the one the transcript recorded sending (`api-request`
    /// records), not a reconstruction.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_record: bool,
    /// In a session that recorded its requests, why this call's request was reconstructed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconstructed_because: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl CallReplay {
    /// `call` with nothing measured: no metrics, no simulated usage, no sizes; `events` seen
    /// before it.
    pub fn unmeasured(call: &RecordedCall, events: Vec<String>) -> Self {
        CallReplay {
            index: call.index,
            lane: call.lane.clone(),
            time_ms: call.time_ms,
            model: call.model.clone(),
            version: call.version.clone(),
            recorded: call.usage.clone(),
            skipped: None,
            metrics: None,
            sim_cache_read: 0.0,
            sim_cache_creation: 0.0,
            sim_input: 0.0,
            events,
            rerender_probability: 0.0,
            message_tokens: 0,
            message_blocks: 0,
            prefix_tokens: 0,
            user_context_tokens: 0,
            thinking_filled: !call.thinking_text_stored,
            attachment_chars: 0,
            unsized_attachment_chars: 0,
            from_record: false,
            reconstructed_because: None,
        }
    }

    /// `call` answered by the measured request `metrics`: its simulated usage is the measured
    /// one. The sizes the replay knows (messages, prefix, user context) are the caller's to set.
    pub fn measured(call: &RecordedCall, metrics: RequestMetrics, events: Vec<String>) -> Self {
        CallReplay {
            sim_cache_read: metrics.cache_read_input_tokens as f64,
            sim_cache_creation: metrics.cache_creation_input_tokens as f64,
            sim_input: metrics.input_tokens as f64,
            metrics: Some(metrics),
            ..Self::unmeasured(call, events)
        }
    }

    pub fn recorded_context(&self) -> u64 {
        self.recorded.prompt_tokens()
    }

    pub fn simulated_context(&self) -> u64 {
        self.metrics.as_ref().map_or(0, |m| m.context_tokens)
    }

    pub fn compared(&self) -> bool {
        self.skipped.is_none()
    }
}

/// A replayed session.
#[derive(Debug, Clone, Serialize)]
pub struct SessionReplay {
    pub input: String,
    pub estimator: String,
    /// Each call held by reference count.
    pub calls: crate::shared::SharedList<CallReplay>,
    /// Information loss over the replayed requests.
    pub info_loss: crate::measure::loss::InfoLoss,
    /// Calls whose messages the options changed from what the recorded client sent: the
    /// recorded replies were answers to something else from there on.
    pub diverged_calls: usize,
    /// The first such call and why.
    pub first_divergence: Option<(usize, String)>,
    /// The recording starts mid-session (see [`crate::recording::format::Header::head_truncated`]).
    pub head_truncated: bool,
    pub unrecorded_main: Option<UnrecordedSizes>,
    /// Per-version profile entries (prefix level, user context, thinking fill) the replay took
    /// from another version than the session's, one sentence each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub profile_notes: Vec<String>,
    /// The information loss of each main-lane compaction ([`super::loss`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub compaction_losses: Vec<super::loss::CompactionLoss>,
    /// The user context a compaction leaves in the main lane (the fitted one of the session's
    /// version): for a session that starts mid-conversation, what stays of the unrecorded part.
    #[serde(skip)]
    pub user_context_after_compaction: u64,
    /// Calls measured on the request the transcript recorded sending ([`CallReplay::from_record`]).
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub calls_from_records: usize,
    /// The transcript recorded its requests (`api-request` records).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub records_requests: bool,
}

fn is_zero_usize(n: &usize) -> bool {
    *n == 0
}

impl SessionReplay {
    /// The measured rows, in call order (skipped calls left out).
    pub fn rows(&self) -> Vec<RequestMetrics> {
        self.calls.iter().filter_map(|c| c.metrics.clone()).collect()
    }
}

/// Reads a Claude Code transcript (with its subagent files) or a ctxsim recording.
///
/// Nothing is dropped silently: the lines skipped are in `report.warnings` (the caller prints
/// them), and an input with no record at all is an error.
pub fn load_session(path: &Path) -> Result<ImportedSession, ImportError> {
    let (format, line) = detect_format_at(path)?;
    match format {
        InputFormat::ClaudeCode => {
            let session = import_claude_code(path)?;
            if session.report.records_by_type.is_empty() {
                return Err(session.report.nothing_read("transcript record"));
            }
            Ok(session)
        }
        InputFormat::Recording => {
            let read = read_recording(path)?;
            let mut session = ImportedSession::from_recording(read.recording);
            session.report.input = path.display().to_string();
            session.report.warnings = read.warnings;
            Ok(session)
        }
        other => Err(ImportError::Unsupported {
            file: path.display().to_string(),
            message: format!("line {line} is the start of a {}; replay reads transcripts and recordings", other.as_str()),
        }),
    }
}

/// Sizes inferred for one lane group (main + compact share one; every subagent has its own).
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupSizes {
    pub(super) prefix_tokens: u64,
    pub(super) context_tokens: u64,
}

/// The unrecorded part of the main lane group as the replay ended up sizing it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct UnrecordedSizes {
    /// Tokens of the first call beyond its recorded messages (tools, system, user context, and
    /// for a head-truncated segment the older history).
    pub first_call_tokens: u64,
    /// The prefix level (tools + system) last in force.
    pub prefix_tokens: u64,
    /// Whether the record showed the prefix level (a warm first call or a later re-render);
    /// otherwise it is the replay's own split.
    pub prefix_from_record: bool,
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
    /// The lane's messages as last built ([`BuiltView`]).
    pub(super) built: BuiltView,
    pub(super) parts: Parts,
}

/// What a transcript does not record, put around the recorded messages of one call: the system
/// prompt (tools + system, the prefix level) with its breakpoint, deferred tools loaded so far,
/// the user-context reminder opening `messages[0]`, and the breakpoint on the last block.
#[derive(Clone)]
struct Unrecorded<'a> {
    group: &'a str,
    /// Re-renders of the conversation start so far (the reminder's text changes with it).
    epoch: u32,
    loaded_tools: &'a [String],
    kind: EstimatorKind,
    params: crate::measure::tokens::FamilyCalibration,
    /// The run's shared `bpe` text counts, for the fillers' labels.
    shared: Option<&'a SharedCounts>,
    cache_control: CacheControl,
    /// The tool result the last breakpoint goes on, when not the last block.
    marked_result: Option<&'a str>,
}

impl Unrecorded<'_> {
    fn request(&self, model: &str, messages: Vec<Message>, sizes: GroupSizes) -> Request {
        self.request_with(model, messages, sizes, &mut Parts::default())
    }

    /// [`Self::request`] taking its system prompt and reminder from `parts` where they are the
    /// ones it needs (the filler texts are tens to hundreds of KB); [`Parts::recover`] takes
    /// them back.
    fn request_with(&self, model: &str, messages: Vec<Message>, sizes: GroupSizes, parts: &mut Parts) -> Request {
        let mut request = Request::new(model.to_owned(), 32_000);
        request.messages = messages;
        let label = if self.group == LANE_MAIN { "system".to_owned() } else { format!("system {}", self.group) };
        let key = (label, sizes.prefix_tokens, self.kind, self.params.scale.to_bits(), self.params.per_block.to_bits(), self.cache_control.clone());
        let system = match parts.system.take() {
            Some((k, system)) if k == key => system,
            _ => system_filler(&key, self.shared),
        };
        request.system = Some(system);
        parts.system_key = Some(key);
        if !self.loaded_tools.is_empty() {
            request.tools = Some(
                self.loaded_tools
                    .iter()
                    .map(|name| Tool::custom(name.clone(), filler(name, 80, EstimatorKind::Chars4, 1.0, 0.0, None), serde_json::json!({"type": "object"})))
                    .collect(),
            );
        }
        parts.reminder_key = self.reminder(sizes).map(|(label, target)| (label, target, self.kind, self.params.scale.to_bits(), self.params.per_block.to_bits()));
        if let Some(key) = &parts.reminder_key {
            let reminder = match parts.reminder.take() {
                Some((k, reminder)) if k == *key => reminder,
                _ => ContentBlock::text(filler(&key.0, key.1, self.kind, self.params.scale, self.params.per_block, self.shared)),
            };
            match request.messages.first_mut() {
                Some(first) if first.role == Role::User => first.content.insert_first_block(reminder),
                _ => request.messages.insert(0, Message { role: Role::User, content: MessageContent::Blocks(vec![reminder].into()), extra: Map::new() }),
            }
        }
        if let Some(last) = request.messages.last_mut() {
            let blocks = last.content.blocks_mut();
            let target = self.marked_result.and_then(|id| {
                blocks.iter().position(|b| matches!(b, ContentBlock::ToolResult { tool_use_id, .. } if tool_use_id == id))
            });
            let at = target.unwrap_or(blocks.len().saturating_sub(1));
            if let Some(block) = blocks.get_mut(at)
                && !block.is_thinking()
            {
                block.set_cache_control(Some(self.cache_control.clone()));
            }
        }
        request
    }

    /// The label and size of the user-context reminder opening `messages[0]`, if any.
    fn reminder(&self, sizes: GroupSizes) -> Option<(String, u64)> {
        let tokens = sizes.context_tokens;
        (tokens > 0).then(|| (format!("user-context {} {} {}", self.group, self.epoch, tokens), tokens))
    }

    /// The keys of [`Self::request`]'s messages when it is built around `messages` (a prefix of
    /// the lane's [`BuiltView`], whose keys are `built`) with `sizes`: the reminder and the
    /// restored files (`restored_version`) are folded into the first message's key, a message
    /// the reminder opens on its own has a key of the reminder, and the last message (it
    /// carries the marker) a fresh key.
    fn request_keys(&self, keys: &mut MessageKeys, messages: &[Message], built: &[u128], restored_version: u64, sizes: GroupSizes) -> Vec<u128> {
        let reminder = self.reminder(sizes).map(|(label, target)| {
            let mut bytes = label.into_bytes();
            for word in [target, self.kind as u64, self.params.scale.to_bits(), self.params.per_block.to_bits()] {
                bytes.extend_from_slice(&word.to_le_bytes());
            }
            xxhash_rust::xxh3::xxh3_128(&bytes)
        });
        let (has, r) = (u64::from(reminder.is_some()), reminder.unwrap_or(0));
        let mut out = Vec::with_capacity(built.len() + 1);
        if reminder.is_some() && messages.first().is_none_or(|m| m.role != Role::User) {
            out.push(keys.derive(KeyTag::Reminder, &[r as u64, (r >> 64) as u64]));
        }
        for (i, &key) in built.iter().enumerate() {
            out.push(if i == 0 { keys.derive(KeyTag::First, &[key as u64, (key >> 64) as u64, restored_version, has, r as u64, (r >> 64) as u64]) } else { key });
        }
        if let Some(last) = out.last_mut() {
            *last = keys.fresh();
        }
        out
    }
}

/// Keys of the messages a replay builds, for [`Measurer::flatten_keyed`]: equal keys mean
/// identical messages. A key is derived (xxh3-128) from everything its message is built from;
/// `space` ([`Measurer::new_key_space`]) keeps the keys of two replays through one measurer
/// apart.
#[derive(Debug, Clone)]
pub(super) struct MessageKeys {
    space: u64,
    fresh: u64,
}

#[derive(Debug, Clone, Copy)]
enum KeyTag {
    Built = 1,
    First = 2,
    Reminder = 3,
    Fresh = 4,
}

impl MessageKeys {
    pub(super) fn new(space: u64) -> MessageKeys {
        MessageKeys { space, fresh: 0 }
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

    /// A key no other message has.
    fn fresh(&mut self) -> u128 {
        self.fresh += 1;
        self.derive(KeyTag::Fresh, &[self.fresh])
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
    /// Per message: the tool result its breakpoint goes on were it the last ([`order_message`]).
    marked: Vec<Option<String>>,
    /// The restored files of this version of the lane ([`LaneState::restored_version`]) follow
    /// the first message's own blocks ([`Self::with_restored`]): kept from call to call with
    /// the message instead of copied onto it for every request.
    restored: Option<u64>,
}

impl BuiltView {
    /// `restored_version`: the lane's; a first message holding the files of another version is
    /// built again.
    pub(super) fn update(&mut self, raw: &[Message], serials: &[u64], keys: &MessageKeys, cleared: (&BTreeSet<String>, u64), thinking: &BTreeMap<String, ThinkingFill>, restored_version: u64) {
        self.messages.truncate(raw.len());
        self.keys.truncate(raw.len());
        self.marked.truncate(raw.len());
        if self.messages.is_empty() || self.restored.is_some_and(|version| version != restored_version) {
            self.restored = None;
            if let Some(first) = self.keys.first_mut() {
                // No derived key is 0: the first message is built again below.
                *first = 0;
            }
        }
        for (i, source) in raw.iter().enumerate() {
            let previous = if i > 0 { serials[i - 1] } else { 0 };
            let key = keys.derive(KeyTag::Built, &[serials[i], previous, cleared.1]);
            if self.keys.get(i) == Some(&key) {
                continue;
            }
            if i == 0 {
                self.restored = None;
            }
            let mut message = source.clone();
            client_view(&mut message, cleared.0, thinking);
            let marked = if i > 0 { order_message(&raw[i - 1], &mut message) } else { None };
            if i < self.messages.len() {
                (self.messages[i], self.keys[i], self.marked[i]) = (message, key, marked);
            } else {
                self.messages.push(message);
                self.keys.push(key);
                self.marked.push(marked);
            }
        }
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

/// A lane's [`BuiltView`] while its messages are out in a request: the first and last message
/// as built, which the request changes.
struct Lent {
    built: BuiltView,
    undo: Undo,
}

/// What a request built around a list of messages ([`Unrecorded::request_with`]) changed in
/// them: the first and last message as they were.
struct Undo {
    first: FirstUndo,
    last: Option<Message>,
}

/// How the first message is put back as built.
enum FirstUndo {
    /// Keep its first `n` blocks (the request only added blocks around them).
    Truncate(usize),
    /// Put this copy back (it is also the last message, or not blocks).
    Restore(Message),
    None,
}

impl Lent {
    fn new(built: BuiltView, messages: &[Message]) -> Lent {
        Lent { built, undo: Undo::new(messages) }
    }

    /// The view again, from the request built around it ([`Unrecorded::request_with`]), and
    /// the system prompt and reminder kept in `parts` for the next request.
    fn give_back(self, request: Request, parts: &mut Parts) -> BuiltView {
        let Lent { mut built, undo } = self;
        built.messages = undo.take_back(request, parts, built.keys.len());
        built
    }
}

impl Undo {
    fn new(messages: &[Message]) -> Undo {
        let first = match messages.first() {
            Some(Message { content: MessageContent::Blocks(blocks), .. }) if messages.len() > 1 => FirstUndo::Truncate(blocks.len()),
            Some(first) => FirstUndo::Restore(first.clone()),
            None => FirstUndo::None,
        };
        let last = messages.last().filter(|_| messages.len() > 1).cloned();
        Undo { first, last }
    }

    /// The `own` messages a request was built around, as they were, and the system prompt and
    /// reminder kept in `parts` for the next request.
    fn take_back(self, request: Request, parts: &mut Parts, own: usize) -> Vec<Message> {
        let Undo { first, last } = self;
        let Request { mut messages, system, .. } = request;
        // (A first message put back whole keeps none of the request's.)
        let keep = match &first {
            FirstUndo::Truncate(n) => *n,
            FirstUndo::Restore(_) | FirstUndo::None => 0,
        };
        parts.keep(&mut messages, system, own, keep);
        match first {
            // (Only when the request added blocks: a change copies blocks another view holds.)
            FirstUndo::Truncate(n) if messages[0].content.block_count() > n => messages[0].content.blocks_mut().truncate(n),
            FirstUndo::Truncate(_) => {}
            FirstUndo::Restore(first) => messages[0] = first,
            FirstUndo::None => {}
        }
        if let Some(last) = last {
            let n = messages.len();
            messages[n - 1] = last;
        }
        messages
    }
}

/// What a filler text is made from: label, tokens, estimator, scale and per-block bits.
type FillerKey = (String, u64, EstimatorKind, u64, u64);
/// A system prompt's filler, and its breakpoint.
type SystemKey = (String, u64, EstimatorKind, u64, u64, CacheControl);

/// The filler parts of a lane's last request ([`Unrecorded::request_with`]), with what they were
/// made from.
#[derive(Debug, Clone, Default)]
pub(super) struct Parts {
    system: Option<(SystemKey, SystemPrompt)>,
    reminder: Option<(FillerKey, ContentBlock)>,
    /// What the request in flight was given.
    system_key: Option<SystemKey>,
    reminder_key: Option<FillerKey>,
}

impl Parts {
    /// Keeps the system prompt and the reminder of a request built by [`Unrecorded::request_with`]
    /// around `own` messages with these parts, for the next request: the reminder taken out of
    /// `messages` (the message it opened, or the first block of the first message, of whose
    /// other blocks the first `keep` stay: the blocks another body holds are copied only so far).
    fn keep(&mut self, messages: &mut Vec<Message>, system: Option<SystemPrompt>, own: usize, keep: usize) {
        self.system = self.system_key.take().zip(system);
        let reminder_key = self.reminder_key.take();
        let reminder = if messages.len() > own {
            // The reminder opened the request as a message of its own.
            Some(messages.remove(0).content.take_first_block(0))
        } else if reminder_key.is_some() {
            Some(messages[0].content.take_first_block(keep))
        } else {
            None
        };
        // (A reminder that took the marker, as the only block of the request, is not kept.)
        self.reminder = reminder_key.zip(reminder.filter(|block| block.cache_control().is_none()));
    }

    /// [`Parts::keep`] of a request that is not given back to a view.
    fn recover(&mut self, request: Request, own: usize) {
        let Request { mut messages, system, .. } = request;
        self.keep(&mut messages, system, own, 0);
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
    let calibration = measurer.counter().calibration();
    let kind = measurer.counter().kind();
    let mut thinking_estimate: BTreeMap<String, ThinkingFill> = BTreeMap::new();
    for event in &session.recording.events {
        if let EventKind::ModelReply(reply) = &event.kind
            && (!reply.thinking_text_stored || resends_its_output(reply, main_version))
        {
            let key = measurer.table().lookup(&reply.model).map(|m| m.estimator_key()).unwrap_or_default();
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

/// Puts the unrecorded prefix alone (tools + system of `prefix_tokens`) in the simulated cache
/// as written at `at`: what the record shows another process of the client cached (a warm first
/// call, Claude Desktop's shared static prefix).
fn seed_prefix(measurer: &mut Measurer, unrecorded: &Unrecorded<'_>, call: &RecordedCall, prefix_tokens: u64, at: u64) {
    let prefix_only = unrecorded.request(&call.model, Vec::new(), GroupSizes { prefix_tokens, context_tokens: 0 });
    if let Ok(flat) = measurer.flatten(&prefix_only) {
        let _ = measurer.seed_cache(&flat, at, 0);
    }
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
pub fn first_call_sizes(session: &ImportedSession, measurer: &mut Measurer) -> Option<UnrecordedSizes> {
    let call = session.calls.iter().find(|c| group_of(&c.lane) == LANE_MAIN && !c.is_synthetic && !c.is_api_error && c.usage.prompt_tokens() > 0)?;
    let calibration = measurer.counter().calibration().clone();
    let mut notes = BTreeSet::new();
    let main_version = main_version(session);
    let user_context_prior = user_context_prior(&calibration, &main_version, &mut notes);
    let thinking = unstored_thinking(session, measurer, &main_version, &mut notes);
    let mut messages = session.messages_for_call(call);
    for message in &mut messages {
        client_view(message, &BTreeSet::new(), &thinking);
    }
    let mut bare = Request::new(call.model.clone(), 32_000);
    bare.messages = messages;
    let flat = measurer.flatten(&bare).ok()?;
    let unrecorded_tokens = call.usage.prompt_tokens().saturating_sub(flat.total_tokens);
    let truncated = session.recording.header.head_truncated;
    let prefix = first_call_prefix(call, unrecorded_tokens, true, truncated, user_context_prior, &calibration.prefix_tokens, &mut notes);
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
                *content = Some(ToolResultContent::Text(CLEARED_TOOL_RESULT.to_owned()));
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

/// The system prompt of a request without a layout: one filler block (of `key`'s label, tokens
/// and estimator) with the breakpoint. Memoized per thread like [`filler`], and handed out
/// shared: requests built with equal keys (a replay's lanes and forks) hold one
/// allocation, which the flattener compares by pointer instead of by its text.
fn system_filler(key: &SystemKey, shared: Option<&SharedCounts>) -> SystemPrompt {
    thread_local! {
        static MEMO: std::cell::RefCell<Vec<(SystemKey, SystemPrompt)>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    MEMO.with_borrow_mut(|memo| {
        if let Some((_, system)) = memo.iter().find(|(k, _)| k == key) {
            return system.clone();
        }
        let (label, tokens, kind, scale, per_block, cache_control) = key;
        let text = filler(label, *tokens, *kind, f64::from_bits(*scale), f64::from_bits(*per_block), shared);
        let system = SystemPrompt::Blocks(vec![SystemBlock::text(text).with_cache_control(Some(cache_control.clone()))].into());
        if memo.len() >= SYSTEM_MEMO_ENTRIES {
            memo.remove(0);
        }
        memo.push((key.clone(), system.clone()));
        system
    })
}

/// The system prompts [`system_filler`] keeps per thread (the oldest goes first).
const SYSTEM_MEMO_ENTRIES: usize = 16;

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
        EventKind::SystemEvent(sys) => sys.payload.to_string().contains("SessionStart:resume"),
        EventKind::Attachment(attachment) => attachment.payload.get("hookName").and_then(Value::as_str) == Some("SessionStart:resume"),
        EventKind::UserPrompt(prompt) => is_exit_command(&prompt.content),
        _ => false,
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

/// Replays every call of `session` through `measurer`.
pub fn replay_session(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions) -> SessionReplay {
    replay_session_seeing(session, measurer, options, true, None)
}

/// [`replay_session`] the slow way, the reference the fast one must equal: every call's
/// messages rebuilt from its view and changed as the client did, the flattener comparing them by
/// content with the previous request's.
pub fn replay_session_reference(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions) -> SessionReplay {
    replay_session_seeing(session, measurer, options, false, None)
}

/// Called with each request a replay builds: its recorded call's index and the body.
pub type RequestObserver<'a> = dyn FnMut(usize, &Request) + 'a;

/// [`replay_session`], handing `observe` every request it builds (the index of its recorded
/// call and the body, before measurement).
pub fn replay_session_observed(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions, observe: &mut dyn FnMut(usize, &Request)) -> SessionReplay {
    replay_session_seeing(session, measurer, options, true, Some(observe))
}

/// A main-lane compaction a replay went through, judged when the replay ends
/// ([`super::loss::compaction_loss`] reads the session's later turns): the call after it, the
/// previous main call, the messages after it and the two calls' contexts.
#[derive(Debug, Clone)]
struct CompactionSeen {
    call: usize,
    previous: usize,
    after: Vec<Message>,
    context_before: u64,
    context_after: u64,
}

/// `incremental`: each lane's built messages are kept from call to call ([`BuiltView`]) and the
/// request's messages carry keys for the flattener.
fn replay_session_seeing(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions, incremental: bool, mut observe: Option<&mut RequestObserver<'_>>) -> SessionReplay {
    let input = session.recording.header.input.clone().unwrap_or_default();
    let kind = measurer.counter().kind();
    // The run's shared `bpe` text counts (audit's), for the fillers' labels.
    let shared = measurer.counter().shared().cloned();
    let events = &session.recording.events;
    let calibration = measurer.counter().calibration().clone();
    let fitted_prefixes = calibration.prefix_tokens.clone();
    // Notes on per-version profile entries taken from another version: the set-up's, and the
    // calls'.
    let mut setup_notes: BTreeSet<String> = BTreeSet::new();
    let mut profile_notes: BTreeSet<String> = BTreeSet::new();
    let main_version = main_version(session);
    let user_context_prior = user_context_prior(&calibration, &main_version, &mut setup_notes);

    let thinking_estimate = unstored_thinking(session, measurer, &main_version, &mut setup_notes);

    let mut lanes: BTreeMap<String, LaneState> = BTreeMap::new();
    let mut views = crate::recording::ViewCache::default();
    let mut keys = MessageKeys { space: measurer.new_key_space(), fresh: 0 };
    // Estimates of file texts a compaction restores, by content hash and model family.
    let file_tokens: std::cell::RefCell<BTreeMap<(u128, String), u64>> = Default::default();
    let mut sizing = super::record_view::Sizing { user_context_prior, fitted_prefixes: &fitted_prefixes, groups: BTreeMap::new(), unrecorded_main: None };
    let mut out = crate::shared::SharedList::with_capacity(session.calls.len());
    let mut turn = 0u32;
    let mut loss = crate::measure::loss::LossTracker::new();
    let mut diverged_calls = 0usize;
    let mut first_divergence: Option<(usize, String)> = None;
    // The previous compared main call and its context; the loss of each main compaction.
    let mut previous_main: Option<(usize, u64)> = None;
    let mut compactions: Vec<CompactionSeen> = Vec::new();
    // The requests the transcript recorded sending, used where the options leave them as sent.
    let records_requests = !session.api_requests.requests.is_empty();
    let use_records = records_requests && options.recorded_requests && !options.changes_view();
    let mut rebuilder = crate::recording::api_requests::Rebuilder::new(&session.api_requests);

    for call in &session.calls {
        let profile = ClientProfile::for_client(call.version.as_deref().unwrap_or(""), session.recording.header.entrypoint.as_deref());
        let group = group_of(&call.lane).to_owned();
        // A compaction request forks the main thread: its transcript holds only what it added.
        let main_fork = (call.lane == LANE_COMPACT).then(|| {
            lanes.get(LANE_MAIN).map(|m| (m.cleared.clone(), m.restored.clone(), m.loaded_until)).unwrap_or_default()
        });
        // The compaction request forks the main thread as it is rendered during the turn.
        let fork_transient = main_fork.is_some() && lanes.get(LANE_MAIN).is_some_and(|m| m.turns.transient_prompt);
        let turn_profile = if options.rerender_prompts {
            profile.clone()
        } else {
            ClientProfile { rerender_opening_prompt: false, rerender_typed_prompts: false, queued_across_compaction_rerenders_start: false, ..profile.clone() }
        };
        // It sends what the main thread holds now: after a compaction the older history of a mid-conversation segment is gone from it too.
        let main_segment = (call.lane == LANE_COMPACT)
            .then(|| lanes.get(LANE_MAIN).map(|m| (m.segment_context, m.hidden_saved, m.compacted)).unwrap_or_default());
        let state = lanes.entry(call.lane.clone()).or_default();
        if let Some((segment_context, hidden_saved, compacted)) = main_segment {
            (state.segment_context, state.hidden_saved, state.compacted) = (segment_context, hidden_saved, compacted);
        }
        // Events seen before a call that was not compared belong to the next one.
        let mut call_events: Vec<String> = std::mem::take(&mut state.carried_events);
        let family = measurer.model(&call.model).map(|m| m.estimator_key()).unwrap_or_default();
        let params = measurer.counter().calibration().for_family(&family);

        // Scan this lane's events since the last call.
        let scan_cx = super::record_view::ScanContext {
            session,
            restore_files: options.restore_files,
            kind,
            shared: shared.as_deref(),
            file_tokens: &file_tokens,
            recorded_microcompact: options.recorded_microcompact,
        };
        let scan = super::record_view::scan_lane(&scan_cx, measurer, state, call, &profile, &turn_profile, &family, params, &mut call_events);
        let super::record_view::LaneScan { request_start, turn_scan, attachment_chars, unsized_attachment_chars, .. } = scan;

        if let Some(reason) = super::record_view::skip_reason(call) {
            state.carried_events = call_events.clone();
            out.push(skipped_call(call, call_events, reason.to_owned()));
            continue;
        }
        let (ttl, start_ms, previous_time) = super::record_view::call_timing(state, call, request_start, &mut call_events);

        // The messages the call saw, with what the client changed in them. A call of its own
        // lane updates the lane's built view and borrows its messages for the request (given back
        // after the measurement, with keys for the flattener); a fork builds its own.
        let (mut messages, marked_result, mut lent) = if incremental && main_fork.is_none() {
            let (raw, serials) = session.messages_for_call_view(call, state.loaded_until, &mut views);
            state.built.update(raw, serials, &keys, (&state.cleared, state.cleared_version), &thinking_estimate, state.restored_version);
            state.built.with_restored(&state.restored, state.restored_version);
            let mut built = std::mem::take(&mut state.built);
            let messages = std::mem::take(&mut built.messages);
            let marked = built.marked.last().cloned().flatten();
            let lent = Lent::new(built, &messages);
            (messages, marked, Some(lent))
        } else {
            let (mut messages, cleared) = match &main_fork {
                Some((cleared, _, loaded_until)) => (session.fork_messages(call, *loaded_until), cleared),
                None => (session.messages_for_call_cached(call, state.loaded_until, &mut views), &state.cleared),
            };
            for message in &mut messages {
                client_view(message, cleared, &thinking_estimate);
            }
            let marked = order_tool_results(&mut messages);
            (messages, marked, None)
        };
        let restored = main_fork.as_ref().map_or(&state.restored, |(_, restored, _)| restored);
        // (A lane's built view holds them already.)
        if !restored.is_empty()
            && lent.is_none()
            && let Some(first) = messages.first_mut()
            && first.role == Role::User
        {
            first.content.blocks_mut().extend(restored.iter().cloned());
        }
        if !options.recorded_microcompact && first_divergence.is_none() && call_events.iter().any(|e| e == "microcompact") {
            first_divergence = Some((call.index, "the recorded microcompact was not applied: its cleared tool results stay visible".to_owned()));
        }
        let truncated = session.recording.header.head_truncated && group == LANE_MAIN;
        let seen = super::record_view::turn_events(
            state,
            call,
            main_fork.is_some(),
            &messages,
            &turn_scan,
            truncated,
            options,
            &turn_profile,
            &mut call_events,
            &mut |_, _, _| {},
        );
        if seen.new_turn {
            turn += 1;
        }
        let turn_start = seen.turn_start;
        let rerenders_previous = turn_start.is_some_and(|t| t.rerenders_previous);
        // Whether this call renders its current prompt the transient way.
        let transient = fork_transient || (call.lane == LANE_MAIN && state.turns.transient_prompt);
        let strips_thinking = measurer.model(&call.model).is_ok_and(|m| m.strips_prior_thinking);

        // The request as recorded, where the transcript has it and it rebuilds exactly.
        let (rebuilt, reconstructed_because) = super::record_view::recorded_request(use_records, &mut rebuilder, call);

        // Sizes of the unrecorded part: inferred from the group's first compared call.
        let sized = match sizing.size_group(measurer, call, &messages, &group, truncated, &mut profile_notes) {
            Ok(sized) => sized,
            Err(e) => {
                out.push(skipped_call(call, call_events, e));
                continue;
            }
        };
        let anchored_call_context = sizing.anchor_segment(measurer, state, call, &messages, &group, truncated, options, strips_thinking, &mut call_events);
        let mut sizes = sizing.sizes_now(state, &group, truncated);
        if let Some(context) = anchored_call_context {
            sizes.context_tokens = context;
        }
        let revealed = sizing.revealed_level(state, call, sizes, &group, rebuilt.is_some(), &call_events);
        let unrecorded = Unrecorded {
            group: &group,
            epoch: state.rerender_epoch,
            loaded_tools: &state.loaded_tools,
            kind,
            params,
            shared: shared.as_deref(),
            cache_control: CacheControl::ephemeral().with_ttl(Some(ttl)),
            marked_result: marked_result.as_deref(),
        };

        // A warm first call: an earlier session of the client cached its prefix.
        if let Some(prefix) = sized
            && call.usage.cache_read_input_tokens > 0
        {
            seed_prefix(measurer, &unrecorded, call, prefix, start_ms.saturating_sub(1));
        }
        let base = revealed.map(|_| messages.clone());
        // The side request after the previous turn, sent when that turn ended: an entry through
        // its last reply; when the client re-renders the previous prompt, the entry that counts
        // ends before that prompt (what the real reads land on; see `turns`).
        let side_cut = turn_start.and_then(|t| side_cut(&t, messages.len().checked_sub(1)?, current_prompt_index(&messages[..messages.len() - 1])));
        if let Some(cut) = side_cut.filter(|_| rebuilt.is_none()) {
            let side = Unrecorded { marked_result: None, ..unrecorded.clone() };
            let side_keys = lent.as_ref().map(|l| side.request_keys(&mut keys, &messages[..cut], &l.built.keys[..cut], state.restored_version, sizes));
            // The request borrows the first `cut` messages and gives them back as they were.
            let tail = messages.split_off(cut);
            let undo = Undo::new(&messages);
            let side_request = side.request_with(&call.model, std::mem::take(&mut messages), sizes, &mut state.parts);
            let side_flat = measurer.flatten_keyed(&side_request, side_keys.as_deref()).map(|mut flat| {
                shape_flat(&side_request, &mut flat, strips_thinking, false);
                flat
            });
            messages = undo.take_back(side_request, &mut state.parts, cut);
            messages.extend(tail);
            if let Ok(side_flat) = side_flat {
                // From 2.1.170 the side request goes out when the stop hooks ran (records written
                // later, such as a resumed process's, do not move it).
                let at = turn_scan.side_entry_time(&profile, &state.turns, previous_time, start_ms);
                let _ = measurer.seed_cache(&side_flat, at, 0);
                super::record_view::side_entry_seen(&mut call_events, at, start_ms, previous_time, ttl);
            }
        }
        // Claude Desktop's static prefix is never cold: past the TTL the call still reads the
        // prefix level in force (other clients sent the same bytes; see `ClientProfile`).
        let expired = call_events.iter().any(|e| e == "ttl_expired");
        let past_a_ttl = expired || previous_time.is_some_and(|p| start_ms.saturating_sub(p) >= ttl.millis());
        if profile.static_prefix_shared && call.lane == LANE_MAIN && rebuilt.is_none() && past_a_ttl {
            seed_prefix(measurer, &unrecorded, call, sizes.prefix_tokens, start_ms.saturating_sub(1));
            if expired {
                call_events.push(super::uncertainty::SHARED_PREFIX.into());
            }
        }
        let request_keys = if rebuilt.is_some() { None } else { lent.as_ref().map(|l| unrecorded.request_keys(&mut keys, &messages, &l.built.keys, state.restored_version, sizes)) };
        let own_messages = messages.len();
        let request = unrecorded.request_with(&call.model, messages, sizes, &mut state.parts);
        // The recorded request is measured; the reconstruction still updates the lane's view.
        let from_record = rebuilt.is_some();
        let (request, reconstructed) = match rebuilt {
            Some(recorded) => (recorded, Some(request)),
            None => (request, None),
        };
        let transient = transient && !from_record;

        if let Some(observe) = observe.as_mut() {
            observe(call.index, &request);
        }
        let mut flat = match measurer.flatten_keyed(&request, request_keys.as_deref()) {
            Ok(flat) => flat,
            Err(e) => {
                out.push(skipped_call(call, call_events, e.to_string()));
                continue;
            }
        };
        shape_flat(&request, &mut flat, strips_thinking, transient);
        let has_reminder = !from_record && unrecorded.reminder(sizes).is_some();
        let synthetic_tokens = flat.region_tokens(Region::Tools)
            + flat.region_tokens(Region::System)
            + if has_reminder { flat.blocks.get(flat.counts.tools + flat.counts.system).map_or(0, |b| u64::from(b.tokens)) } else { 0 };
        let message_tokens = flat.total_tokens - synthetic_tokens;
        let message_blocks = (flat.counts.messages - usize::from(has_reminder)) as u64;
        let mut measure_input = MeasureInput::new(&call.lane, start_ms, &request);
        measure_input.first_token_ms = call.time_ms - start_ms;
        measure_input.turn = turn;
        measure_input.output_tokens = call.usage.output_tokens;
        measure_input.events = call_events.iter().filter(|e| *e != "new_user_turn").cloned().collect();
        measure_input.recorded_usage = Some(call.usage.clone());
        let metrics = match measurer.measure_flat(measure_input, flat) {
            Ok(m) => m,
            Err(e) => {
                out.push(skipped_call(call, Vec::new(), e.to_string()));
                continue;
            }
        };
        if options.info_loss {
            loss.observe(&request, &metrics);
        }
        if call.lane == LANE_MAIN {
            if let Some((previous, context_before)) = previous_main
                && metrics.events.iter().any(|e| e == "compaction")
            {
                if options.compaction_losses {
                    compactions.push(CompactionSeen { call: call.index, previous, after: request.messages.clone(), context_before, context_after: metrics.context_tokens });
                }
            }
            previous_main = Some((call.index, metrics.context_tokens));
        }
        let built = reconstructed.unwrap_or(request);
        match lent.take() {
            Some(lent) => state.built = lent.give_back(built, &mut state.parts),
            None => state.parts.recover(built, own_messages),
        }
        // The record has just shown the prefix level: size the unrecorded part by it from now
        // on, and let the simulated cache hold what the real one does after this call.
        if let (Some(level), Some(base)) = (revealed, base) {
            let g = sizing.take_level(&group, level, &mut call_events);
            let corrected = unrecorded.request(&call.model, base, super::record_view::sizes_in(state, g, truncated, user_context_prior));
            if let Ok(mut flat) = measurer.flatten(&corrected) {
                shape_flat(&corrected, &mut flat, strips_thinking, transient);
                let _ = measurer.seed_cache(&flat, start_ms, call.time_ms - start_ms);
            }
        }
        state.prev_recorded_cached = Some(call.usage.cache_read_input_tokens + call.usage.cache_creation_input_tokens);
        // Either read counts: the record's (a prefix another process kept warm) or the replay's
        // own.
        state.turns.previous_read = Some(call.usage.cache_read_input_tokens.max(metrics.cache_read_input_tokens));
        // A reply whose thinking the replay filled brings an estimate of its own to the next step.
        let thinking_filled = !call.thinking_text_stored
            || matches!(&events[call.event_index].kind, EventKind::ModelReply(reply) if resends_its_output(reply, &main_version));
        out.push(CallReplay {
            thinking_filled,
            rerender_probability: if rerenders_previous { 1.0 } else { 0.0 },
            message_tokens,
            message_blocks,
            // A recorded request has no unrecorded part: its prefix is its tools and system.
            prefix_tokens: if from_record { synthetic_tokens } else { sizes.prefix_tokens },
            user_context_tokens: if from_record { 0 } else { sizes.context_tokens },
            attachment_chars,
            unsized_attachment_chars,
            from_record,
            reconstructed_because,
            ..CallReplay::measured(call, metrics, call_events)
        });
    }
    if first_divergence.is_some() && diverged_calls == 0 {
        diverged_calls = 1;
    }
    let compaction_losses =
        compactions.iter().map(|c| super::loss::compaction_loss(session, c.call, c.previous, &c.after, c.context_before, c.context_after)).collect();
    profile_notes.extend(setup_notes);
    SessionReplay {
        input,
        estimator: kind.name().to_owned(),
        calls: out,
        info_loss: loss.finish(),
        diverged_calls,
        first_divergence,
        head_truncated: session.recording.header.head_truncated,
        unrecorded_main: sizing.unrecorded_main,
        profile_notes: profile_notes.into_iter().collect(),
        compaction_losses,
        user_context_after_compaction: user_context_prior,
        calls_from_records: 0,
        records_requests,
    }
    .with_record_count()
}

impl SessionReplay {
    fn with_record_count(mut self) -> SessionReplay {
        self.calls_from_records = self.calls.iter().filter(|c| c.from_record).count();
        // Every compared call measured as recorded: no per-version size entered.
        let compared = self.calls.iter().filter(|c| c.compared()).count();
        if compared > 0 && self.calls_from_records == compared {
            self.profile_notes.clear();
        }
        self
    }
}

fn skipped_call(call: &RecordedCall, events: Vec<String>, reason: String) -> CallReplay {
    CallReplay { skipped: Some(reason), ..CallReplay::unmeasured(call, events) }
}

/// Convenience for callers holding a [`RecordedCall`] list only.
pub fn compared_calls(calls: &[RecordedCall]) -> usize {
    calls.iter().filter(|c| !c.is_synthetic && !c.is_api_error && c.usage.prompt_tokens() > 0).count()
}
