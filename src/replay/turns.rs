//! What the real client does around a new user turn that the transcript does not record.
//!
//! Two mechanisms, both seen only through the billed usage (reference/real-breaks.md; per turn
//! in docs/fidelity.md "What happens at a new user turn"):
//!
//! - **The post-turn side entry.** After a turn that ended with the model's reply (no tool use
//!   pending: the stop hook ran), the client sends a side request that forks the main
//!   conversation through that reply; its cache entry ends right after the last assistant
//!   message. The next turn reads through it (21 of cd95's 24 new turns read the previous call's
//!   cache plus 1.0–1.6× the chars/4 of the last reply). None follows a turn whose last call
//!   read nothing (cd95 #19, #70, #143, 7662 #24: 4 of 4), a turn ended by an interruption
//!   during a tool use (cd95 #121), or a turn a background task's notification opened (spotter
//!   #151). The entry also refreshes the TTL of the prefix it reads.
//! - **The transient prompt rendering** (the "N-pattern", 2.0.76–2.1.39). Some prompts are sent
//!   differently during their own turn than afterwards, so at the next turn the read stops at
//!   the boundary before that prompt: the side entry of the turn before, when it is within the
//!   20-position lookback, else the prefix level. Which prompts: in every version of that range,
//!   the message that opened a conversation (the session's first prompt, or the compaction
//!   summary the model went on from without a new prompt); from 2.1.37, every prompt the user
//!   sent (task notifications excepted). In the six realdata sessions this predicts all eight
//!   such breaks and no other (see docs/fidelity.md).
//!
//! The replay renders such a prompt with a salted block hash during its turn (same tokens,
//! different bytes to the cache) and seeds the side entry with [`crate::measure::Measurer::seed_cache`].

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::{ContentBlock, Message, MessageContent, Request, Role};
use crate::measure::{FlatRequest, Measurer, RequestMetrics};
use crate::recording::format::{Event, EventKind, LANE_MAIN};
use crate::recording::ImportedSession;

use super::profile::ClientProfile;

/// The event of a new turn whose prompt delivers an item queued before a compaction
/// ([`TurnStart::queued_across_compaction`]).
pub const QUEUED_ACROSS_COMPACTION: &str = "queued_across_compaction";

/// Mixed into the block hashes of a prompt rendered the transient way.
const TRANSIENT_SALT: u128 = 0x7472_616e_7369_656e_7420_7072_6f6d_7074;
/// Mixed (times the epoch) into the block hashes of the conversation's start each time the
/// client renders it anew at a new prompt (2.1.200+, [`TurnStart::rerenders_start`]).
const START_SALT: u128 = 0x7374_6172_7420_7265_7265_6e64_6572_6564;

/// Index of the message that opened the current turn: the last user message with more than tool
/// results (the final message at a new turn; `messages[0]` when a compaction summary opened it).
pub fn current_prompt_index(messages: &[Message]) -> Option<usize> {
    messages.iter().rposition(is_prompt)
}

/// A user message with anything besides tool results and the reminders attachment records
/// are rendered as.
pub fn is_prompt(message: &Message) -> bool {
    let reminder = |b: &ContentBlock| matches!(b, ContentBlock::Text { text, .. } if text.starts_with(crate::recording::claude_code::ATTACHMENT_REMINDER));
    message.role == Role::User
        && match &message.content {
            MessageContent::Text(_) => true,
            MessageContent::Blocks(blocks) => blocks.iter().any(|b| !matches!(b, ContentBlock::ToolResult { .. }) && !reminder(b)),
        }
}

fn is_task_notification(message: &Message) -> bool {
    let opens = |text: &str| text.trim_start().starts_with("<task-notification>");
    match &message.content {
        MessageContent::Text(text) => opens(text),
        MessageContent::Blocks(blocks) => blocks.iter().any(|b| matches!(b, ContentBlock::Text { text, .. } if opens(text))),
    }
}

/// Gives the blocks of `messages[message_index]` different cache identities (same tokens), and
/// carries the change into every later prefix hash.
pub fn salt_message(flat: &mut FlatRequest, message_index: usize) {
    salt_message_with(flat, message_index, TRANSIENT_SALT);
}

/// [`salt_message`] with `salt` mixed in (several salts compose, in any order).
fn salt_message_with(flat: &mut FlatRequest, message_index: usize, salt: u128) {
    let mut salts = flat.salts.clone();
    salts.push((message_index, salt));
    flat.set_salts(&salts);
}

/// The turn-level state of the main lane.
#[derive(Debug, Default, Clone)]
pub struct TurnState {
    /// New user turns seen so far.
    pub turns: u32,
    /// The prompt that opened the current turn is rendered the transient way (re-rendered at
    /// the next turn).
    pub transient_prompt: bool,
    /// A background task's notification opened the current turn.
    pub by_notification: bool,
    /// Time of the last record before the current prompt (the previous turn's end).
    pub turn_end_ms: Option<u64>,
    /// The read of the lane's previous compared call (the larger of the recorded and the
    /// replayed one).
    pub previous_read: Option<u64>,
    /// A compaction came before the call being built: the previous prompt is gone.
    pub compaction_pending: bool,
    /// A tool hook (PreToolUse, PostToolUse, PostToolUseFailure) added context to a tool result
    /// of the current turn (a `hook_additional_context` record naming a tool use).
    pub tool_hook_context: bool,
    /// The permission mode the last prompt record named.
    pub permission_mode: Option<String>,
    /// Something since the prompt the conversation start was last rendered for may have
    /// changed the project's working tree ([`super::worktree`]).
    pub tree_changed: bool,
    /// The client's command queue as the record shows it (`queue-operation` enqueues): per item
    /// not yet delivered as a prompt, a hash of its text and whether a compaction came since it
    /// was queued.
    pub queued: Vec<(u64, bool)>,
    /// The last prompt delivered an item queued before a compaction, the first such since
    /// that compaction ([`ClientProfile::queued_across_compaction_rerenders_start`]). Set by the
    /// scan of the prompt's call and taken by the next turn start ([`TurnState::on_new_turn`]);
    /// until then it carries over the scans of calls that start no turn (a tool loop's, or the
    /// calls no request stood for), and a later prompt (its own delivery decides) or a
    /// compaction clears it.
    pub delivers_queued_across_compaction: bool,
}

/// The most items [`TurnState::queued`] keeps (the oldest go first): enqueued items that are
/// never delivered as a prompt (task metadata, prompts delivered mid-turn) are not removed by
/// the record's `remove`/`dequeue` operations, which name no item.
const QUEUE_KEPT: usize = 256;

/// What a new user turn brings, decided before its call is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnStart {
    /// The previous turn's prompt was rendered the transient way: this call re-renders it.
    pub rerenders_previous: bool,
    /// Seed the side entry of the previous turn (at `turn_end_ms`).
    pub side_entry: bool,
    /// The start of the conversation is rendered anew for this prompt (2.1.200+).
    pub rerenders_start: bool,
    /// The side entry would have been seeded, but a tool hook's context in the previous turn
    /// keeps the new prompt from reading it (2.1.200–2.1.231).
    pub hook_context_lost_side_entry: bool,
    /// The prompt delivers an item the client queued before a compaction: the conversation start
    /// is rendered anew after the side request went out, so nothing past the prefix is read
    /// ([`ClientProfile::queued_across_compaction_rerenders_start`]).
    pub queued_across_compaction: bool,
}

/// What the record shows around a new prompt, beyond its messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct TurnRecord<'a> {
    /// The first turn of a session recorded from its start.
    pub opens_session: bool,
    /// Side entries are modelled at all (`--no-side-entry` turns them off).
    pub side_entries: bool,
    /// A `stop_hook_summary` came after the previous turn's last call: it ended normally.
    pub ended_normally: bool,
    /// The previous turn's last reply ended the turn (`stop_reason` `end_turn`, or none
    /// recorded), rather than being cut off.
    pub ended_with_reply: bool,
    /// The permission mode the prompt's record names (else the last one a prompt named).
    pub permission_mode: Option<&'a str>,
    /// The call goes to another model than the lane's previous call: the side request of the
    /// previous turn went to the old model and cached nothing this call can read.
    pub model_switched: bool,
}

impl TurnState {
    /// A compaction the model continued from: the summary opens the conversation.
    pub fn on_compaction(&mut self, profile: &ClientProfile) {
        self.transient_prompt = profile.rerender_opening_prompt;
        self.by_notification = false;
        self.compaction_pending = true;
        self.tool_hook_context = false;
        self.tree_changed = false;
    }

    /// A new user turn whose request ends with `messages` (the last one the new prompt).
    pub fn on_new_turn(&mut self, profile: &ClientProfile, messages: &[Message], record: TurnRecord<'_>) -> TurnStart {
        let last = messages.last();
        let interrupted_tool_use = last.is_some_and(|m| m.content.to_blocks().iter().any(|b| matches!(b, ContentBlock::ToolResult { .. })));
        // Up to 2.1.169 a turn a notification opened leaves no side entry (spotter #151); from
        // 2.1.170 the record says whether the turn ended normally.
        let turn_ended = if profile.side_entry_needs_stop_summary { record.ended_normally } else { !self.by_notification };
        let side_entry = record.side_entries
            && profile.post_turn_side_entry
            && self.turns > 0
            && messages.len() >= 2
            && !interrupted_tool_use
            && turn_ended
            && !record.model_switched
            && self.previous_read.is_some_and(|read| read > 0);
        let rerenders_start = profile.turn_rerenders_start
            && self.turns > 0
            && !interrupted_tool_use
            && record.ended_with_reply
            && !self.compaction_pending
            && (self.tree_changed || !profile.start_render_follows_tree);
        // The side request renders the turn's hook context otherwise than the next prompt does:
        // only the re-rendered start matters, so the prompt reads no further than the prefix.
        // The context stays with the turn until a prompt after its reply (a Skill call's
        // expansion within it is not one).
        let hook_context_lost_side_entry = side_entry && rerenders_start && profile.tool_hook_context_loses_side_entry && self.tool_hook_context;
        if record.ended_with_reply && !interrupted_tool_use {
            self.tool_hook_context = false;
            self.tree_changed = false;
        }
        // A queued item delivered across a compaction: the start changes after the side request,
        // so neither it nor the previous call's entry is read.
        let queued_across_compaction =
            profile.queued_across_compaction_rerenders_start && std::mem::take(&mut self.delivers_queued_across_compaction) && self.turns > 0;
        let start = TurnStart {
            rerenders_previous: self.turns > 0 && self.transient_prompt && !self.compaction_pending,
            side_entry: side_entry && !hook_context_lost_side_entry && !queued_across_compaction,
            rerenders_start: rerenders_start || queued_across_compaction,
            hook_context_lost_side_entry,
            queued_across_compaction,
        };
        let notification = last.is_some_and(is_task_notification);
        let bypass = profile.typed_rerender_skips_bypass && record.permission_mode == Some("bypassPermissions");
        self.transient_prompt = if record.opens_session {
            profile.rerender_opening_prompt
        } else {
            profile.rerender_typed_prompts && !notification && !bypass
        };
        self.by_notification = notification;
        self.turns += 1;
        start
    }
}

/// A hook of a tool use added context to its result (`hookEvent` PreToolUse, PostToolUse or
/// PostToolUseFailure); not a prompt's or a session start's.
fn is_tool_hook_context(attachment: &crate::recording::Attachment) -> bool {
    attachment.attachment_type == "hook_additional_context"
        && matches!(attachment.payload.get("hookEvent").and_then(Value::as_str), Some("PreToolUse" | "PostToolUse" | "PostToolUseFailure"))
}

/// What the record shows about a turn boundary between two calls of the main lane, read event
/// by event: the facts [`TurnRecord`] and [`TurnState`] take from the record. One scan for the
/// replay (alongside its own, per call) and for the agent ([`RecordedClient`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TurnScan {
    /// Time of the `stop_hook_summary` after the previous turn's last call: it ended normally.
    pub stop_summary_ms: Option<u64>,
    /// The last reply seen ended its turn (`end_turn`, or no stop reason recorded).
    pub ended_with_reply: bool,
    /// Time of the last record that is not a prompt.
    last_record_ms: Option<u64>,
    /// Time of the last record before a prompt (the previous turn's end), when one was seen.
    turn_end_ms: Option<u64>,
    /// The permission mode a prompt record (not a meta one) named, the last one seen.
    permission_mode: Option<String>,
    /// A tool hook added context since the last compaction seen (none seen: since the start).
    tool_hook_context: bool,
    /// The project's directory, normalized ([`super::worktree::project_dir`]).
    project: Option<std::sync::Arc<str>>,
    /// A tool use or record since the last compaction seen may have changed the project's
    /// working tree ([`super::worktree`]).
    tree_changed: bool,
    /// What the scan saw of the client's command queue, in order ([`TurnState::queued`]).
    queue: Vec<QueueStep>,
}

/// One record bearing on the client's command queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QueueStep {
    /// A `queue-operation` enqueue, by the hash of its text.
    Enqueued(u64),
    /// A compaction.
    Compacted,
    /// A prompt (not a meta one nor a compaction summary), by the hash of its text.
    Prompt(u64),
}

/// The hash [`QueueStep`] compares texts by (trimmed; deterministic across runs).
fn text_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.trim().hash(&mut hasher);
    hasher.finish()
}

impl Default for TurnScan {
    fn default() -> Self {
        TurnScan {
            stop_summary_ms: None,
            ended_with_reply: true,
            last_record_ms: None,
            turn_end_ms: None,
            permission_mode: None,
            tool_hook_context: false,
            project: None,
            tree_changed: false,
            queue: Vec::new(),
        }
    }
}

impl TurnScan {
    /// A scan of a session run in `cwd` (the recording header's), which tells the tool uses
    /// that write the project's files from those that write elsewhere.
    pub fn in_project(cwd: Option<&str>) -> TurnScan {
        TurnScan { project: super::worktree::project_dir(cwd).map(Into::into), ..TurnScan::default() }
    }

    /// One event of the main lane, in order.
    pub fn observe(&mut self, event: &Event) {
        match &event.kind {
            // A compaction consumes the hook context (`TurnState::on_compaction`).
            EventKind::Compaction(_) => {
                self.tool_hook_context = false;
                self.tree_changed = false;
                self.queue.push(QueueStep::Compacted);
            }
            EventKind::SystemEvent(sys) if sys.subtype == "queue_operation" => {
                if sys.payload.get("operation").and_then(Value::as_str) == Some("enqueue")
                    && let Some(text) = sys.payload.get("content").and_then(Value::as_str)
                {
                    self.queue.push(QueueStep::Enqueued(text_hash(text)));
                }
            }
            EventKind::Attachment(attachment)
                if attachment.attachment_type == "edited_text_file" && super::worktree::edited_file_in_project(&attachment.payload, self.project.as_deref()) =>
            {
                self.tree_changed = true;
            }
            EventKind::SystemEvent(sys) if sys.subtype == "stop_hook_summary" => self.stop_summary_ms = Some(event.time_ms),
            EventKind::Attachment(attachment)
                if !crate::recording::claude_code::ATTACHMENTS_NOT_SENT.contains(&attachment.attachment_type.as_str()) && is_tool_hook_context(attachment) =>
            {
                self.tool_hook_context = true;
            }
            EventKind::UserPrompt(prompt) => {
                if !prompt.is_meta && prompt.permission_mode.is_some() {
                    self.permission_mode.clone_from(&prompt.permission_mode);
                }
                if !prompt.is_meta && !prompt.is_compact_summary {
                    self.queue.push(QueueStep::Prompt(text_hash(&prompt.content.joined_text())));
                }
                if self.last_record_ms.is_some() {
                    self.turn_end_ms = self.last_record_ms;
                }
            }
            EventKind::ModelReply(reply) => {
                self.ended_with_reply = reply.stop_reason.as_ref().is_none_or(|r| *r == crate::api::StopReason::EndTurn);
                let project = self.project.as_deref();
                if reply.content.iter().any(|b| matches!(b, ContentBlock::ToolUse { name, input, .. } if super::worktree::tool_use_changes_tree(name, input, project))) {
                    self.tree_changed = true;
                }
            }
            _ => {}
        }
        if !matches!(event.kind, EventKind::UserPrompt(_)) {
            self.last_record_ms = Some(event.time_ms);
        }
    }

    /// Carries what lasts beyond the call into the lane's turn state: the previous turn's end,
    /// the permission mode, a tool hook's context. Called after the scan of each call, whether
    /// or not the call is measured.
    pub fn apply(&self, turns: &mut TurnState) {
        if self.turn_end_ms.is_some() {
            turns.turn_end_ms = self.turn_end_ms;
        }
        if self.permission_mode.is_some() {
            turns.permission_mode.clone_from(&self.permission_mode);
        }
        if self.tool_hook_context {
            turns.tool_hook_context = true;
        }
        if self.tree_changed {
            turns.tree_changed = true;
        }
        for step in &self.queue {
            match *step {
                QueueStep::Enqueued(hash) => {
                    if turns.queued.len() == QUEUE_KEPT {
                        turns.queued.remove(0);
                    }
                    turns.queued.push((hash, false));
                }
                QueueStep::Compacted => {
                    turns.queued.iter_mut().for_each(|item| item.1 = true);
                    // A delivery no turn start took yet is not carried past a compaction: the
                    // compaction renders the conversation anew itself, and the turn it opens
                    // delivered nothing.
                    turns.delivers_queued_across_compaction = false;
                }
                QueueStep::Prompt(hash) => {
                    let crossed = turns.queued.iter().position(|item| item.0 == hash).is_some_and(|i| turns.queued.remove(i).1);
                    turns.delivers_queued_across_compaction = crossed;
                    // The start is rendered anew once: a second such item reads it (af1d #218).
                    if crossed {
                        turns.queued.iter_mut().for_each(|item| item.1 = false);
                    }
                }
            }
        }
    }

    /// The record of a new turn as this scan (of the turn's first call) and `turns` show it.
    pub fn record<'a>(&self, turns: &'a TurnState, opens_session: bool, side_entries: bool, model_switched: bool) -> TurnRecord<'a> {
        TurnRecord {
            opens_session,
            side_entries,
            ended_normally: self.stop_summary_ms.is_some(),
            ended_with_reply: self.ended_with_reply,
            permission_mode: turns.permission_mode.as_deref(),
            model_switched,
        }
    }

    /// When the side request of the previous turn went out: from 2.1.170 when its stop hooks
    /// ran, else at the turn's last record (else the previous call, else now); never after `now_ms`.
    pub fn side_entry_time(&self, profile: &ClientProfile, turns: &TurnState, previous_ms: Option<u64>, now_ms: u64) -> u64 {
        let turn_end = if profile.side_entry_needs_stop_summary { self.stop_summary_ms.or(turns.turn_end_ms) } else { turns.turn_end_ms };
        turn_end.or(previous_ms).unwrap_or(now_ms).min(now_ms)
    }
}

/// Where the side entry of the previous turn ends, in a new turn's messages whose last one
/// (index `last`) holds the new prompt: through the previous turn's last reply; when the client
/// re-renders the previous prompt (at `previous_prompt`), before that prompt (what the real
/// reads land on). `None`: no side entry.
pub fn side_cut(start: &TurnStart, last: usize, previous_prompt: Option<usize>) -> Option<usize> {
    if !start.side_entry {
        return None;
    }
    let cut = if start.rerenders_previous { previous_prompt } else { Some(last) };
    cut.filter(|&cut| cut > 0)
}

/// The recorded client's turn rules applied to the agent driven by its session
/// ([`super::workload::agent_replay`], and every what-if through the agent,
/// [`super::agent_whatif`]): the agent builds each request; at each new user turn this decides,
/// with [`TurnState::on_new_turn`] as the replay does, whether the side request of the previous
/// turn cached the conversation through its reply (seeded through the measurer: the agent's own
/// request cut there, its marker on the last message, at the time the record shows the turn
/// ended), and renders the prompts and the conversation start the recorded version rendered
/// otherwise ([`salt_message`]). The record gives what the agent cannot know (each turn's
/// [`TurnScan`], the version, the models); the messages are the agent's.
///
/// **Which recorded call a request stands for.** Each of the agent's main requests stands for
/// the recorded call whose reply it consumes: the workload scripts one main reply per recorded
/// call driven ([`super::workload::Workload::main_calls`]), and the runner says which of them a
/// request consumes ([`crate::runner::MainCall::reply`]). Requests are not counted: a request
/// the blocking limit stopped, or whose prompt-too-long error surfaced, consumed its reply
/// without being sent, and the next one stands for the call after it; a compaction the recording
/// did not make (or one it made that the agent does not) takes or leaves a `compact`-lane reply
/// and moves nothing on the main lane. The scans of the recorded calls no request stood for are
/// applied, in order, before the next one that is (what the client saw happen in between).
///
/// The run owns the rules ([`crate::runner::RunOptions::client`]); a checkpoint copies them
/// (the record shared, the turn state copied), so a run that goes on from it applies them from
/// the state of that point.
#[derive(Debug, Clone)]
pub struct RecordedClient {
    /// Per recorded main call, in order: its index, version, model, cache read and the scan of
    /// the records before it (shared by every copy).
    calls: std::sync::Arc<[RecordedTurnCall]>,
    /// Per main reply of the workload's script, in order: the position in `calls` of the
    /// recorded call it came from (`None`: not a recorded main call).
    main_calls: std::sync::Arc<[Option<usize>]>,
    /// Scans applied so far (into `turns`): the calls before this position in `calls`.
    applied: usize,
    /// The session file continues an earlier one: its first prompt did not open the session.
    head_truncated: bool,
    turns: TurnState,
    /// Index of the current turn's prompt in the agent's messages.
    prompt_index: Option<usize>,
    /// How often the conversation start was rendered anew.
    start_epoch: u32,
    /// The recorded model of the previous paired call, and the agent's time of its previous main request.
    previous_model: Option<String>,
    previous_ms: Option<u64>,
    /// The recorded read of the call just measured.
    recorded_read: u64,
    /// The recorded client's `entrypoint` (Claude Desktop shares its static prefix).
    entrypoint: Option<String>,
    /// The TTL the recorded main calls wrote with, the last one named up to `ttl_seen` calls.
    ttl: Option<crate::api::CacheTtl>,
    ttl_seen: usize,
    /// The TTL the first recorded main call that wrote anything named: the one the agent runs
    /// under as recorded ([`super::workload::RecordedSettings`]).
    first_ttl: Option<crate::api::CacheTtl>,
    /// The salts the last main request was rendered with ([`crate::runner::ClientRules::salts_hint`]).
    rendered: Vec<(usize, u128)>,
    /// Render prompts the transient way and the conversation start anew where the recorded
    /// version does (`fidelity --no-rerender` turns it off).
    rerender_prompts: bool,
    /// Seed the side entry a finished turn leaves (`fidelity --no-side-entry` turns it off).
    side_entries: bool,
    /// The profile the turn rules read for the last main call's recorded version
    /// ([`RecordedClient::turn_profile`]), made again only for another version (a session's
    /// calls nearly all have one).
    profile: Option<ClientProfile>,
}

#[derive(Debug)]
struct RecordedTurnCall {
    index: usize,
    version: String,
    model: String,
    cache_read: u64,
    measured: bool,
    ttl: Option<crate::api::CacheTtl>,
    scan: TurnScan,
}

impl RecordedClient {
    /// The rules of `session`'s client for an agent whose main replies come from `main_calls`
    /// (per scripted main reply, in order, the recorded call's index).
    pub fn new(session: &ImportedSession, main_calls: &[usize]) -> RecordedClient {
        let events = &session.recording.events;
        let mut calls = Vec::new();
        let mut from = 0;
        // The record view's scans of the same events, where one was read (the audit's is):
        // debug builds scan again and compare.
        let known = session.record_view_memo().turn_scans(session);
        for call in session.calls.iter().filter(|c| c.lane == LANE_MAIN) {
            let scan_events = || {
                let mut scan = TurnScan::in_project(session.recording.header.cwd.as_deref());
                for event in events.iter().take(call.event_index).skip(from).filter(|e| e.lane == LANE_MAIN) {
                    scan.observe(event);
                }
                scan
            };
            let scan = match known.as_ref().and_then(|scans| scans.get(&(from, call.event_index))) {
                Some(scan) => {
                    debug_assert!(*scan == scan_events(), "the record view's turn scan of events {from}..{}", call.event_index);
                    scan.clone()
                }
                None => scan_events(),
            };
            from = call.event_index;
            calls.push(RecordedTurnCall {
                index: call.index,
                version: call.version.clone().unwrap_or_default(),
                model: call.model.clone(),
                cache_read: call.usage.cache_read_input_tokens,
                measured: !call.is_synthetic && !call.is_api_error && call.usage.prompt_tokens() > 0,
                ttl: super::sizing::ttl_of(&call.usage),
                scan,
            });
        }
        let position: BTreeMap<usize, usize> = calls.iter().enumerate().map(|(position, c)| (c.index, position)).collect();
        let first_ttl = calls.iter().find_map(|c| c.ttl);
        RecordedClient {
            calls: calls.into(),
            main_calls: main_calls.iter().map(|index| position.get(index).copied()).collect(),
            applied: 0,
            head_truncated: session.recording.header.head_truncated,
            turns: TurnState::default(),
            prompt_index: None,
            start_epoch: 0,
            previous_model: None,
            previous_ms: None,
            recorded_read: 0,
            entrypoint: session.recording.header.entrypoint.clone(),
            ttl: None,
            ttl_seen: 0,
            first_ttl,
            rendered: Vec::new(),
            rerender_prompts: true,
            side_entries: true,
            profile: None,
        }
    }

    /// These rules with the ablations of `options` (`rerender_prompts`, `side_entries`), as the
    /// record view applies them.
    pub fn with_options(mut self, options: &super::ReplayOptions) -> RecordedClient {
        self.rerender_prompts = options.rerender_prompts;
        self.side_entries = options.side_entries;
        self.profile = None;
        self
    }

    /// The profile the turn rules read: the recorded version's, without its re-rendering where
    /// the rules leave it out.
    fn turn_profile(&self, profile: ClientProfile) -> ClientProfile {
        if self.rerender_prompts {
            return profile;
        }
        ClientProfile { rerender_opening_prompt: false, rerender_typed_prompts: false, queued_across_compaction_rerenders_start: false, ..profile }
    }
}

impl crate::runner::ClientRules for RecordedClient {
    fn clone_box(&self) -> Box<dyn crate::runner::ClientRules> {
        Box::new(self.clone())
    }

    fn before_main(&mut self, call: crate::runner::MainCall<'_>, flat: &mut FlatRequest, measurer: &mut Measurer) -> Vec<String> {
        let mut events = Vec::new();
        // The recorded call whose reply this request consumes.
        let Some(&Some(position)) = self.main_calls.get(call.reply) else {
            // Sent as the agent built it.
            measurer.set_salts(flat, &[]);
            return events;
        };
        // The records up to this call, the calls the agent does not make included (none when
        // they were applied already).
        let mut model_switched = false;
        for recorded in self.calls.get(self.applied..=position).unwrap_or_default() {
            recorded.scan.apply(&mut self.turns);
            if recorded.measured {
                model_switched = self.previous_model.as_ref().is_some_and(|m| *m != recorded.model);
                self.previous_model = Some(recorded.model.clone());
            }
        }
        self.applied = self.applied.max(position + 1);
        let recorded = &self.calls[position];
        let profile = match self.profile.take() {
            Some(profile) if profile.version == recorded.version => profile,
            _ => self.turn_profile(ClientProfile::for_client(&recorded.version, self.entrypoint.as_deref())),
        };
        debug_assert!(profile == self.turn_profile(ClientProfile::for_client(&recorded.version, self.entrypoint.as_deref())), "the kept profile is the version's");
        self.recorded_read = recorded.cache_read;
        // The static prefix of a client that shares it is never cold: past the TTL the recorded
        // calls before this one wrote with, the request still reads its global-scope prefix
        // (other clients sent the same bytes; `ClientProfile::static_prefix_shared`, as the
        // replay seeds it). Seeded just before the request, without a row.
        let ttl_ms = self.calls[self.ttl_seen.min(position)..position].iter().rev().find_map(|c| c.ttl).or(self.ttl).unwrap_or(crate::api::CacheTtl::FiveMinutes).millis();
        if profile.static_prefix_shared
            && self.previous_ms.is_some_and(|p| call.time_ms.saturating_sub(p) >= ttl_ms)
            && let Some(mut prefix) = global_prefix(call.request, measurer)
        {
            if let Some(ttl) = call.markers_ttl {
                prefix.set_markers_ttl(ttl);
            }
            let _ = measurer.seed_cache(&prefix, call.time_ms.saturating_sub(1), 0);
            events.push(super::uncertainty::SHARED_PREFIX.to_owned());
        }
        if let Some(ttl) = self.calls[self.ttl_seen.min(position)..=position].iter().rev().find_map(|c| c.ttl) {
            self.ttl = Some(ttl);
        }
        self.ttl_seen = self.ttl_seen.max(position + 1);
        self.retime(flat);
        if call.compacted {
            self.turns.on_compaction(&profile);
            // The summary opens the conversation.
            self.prompt_index = Some(0);
        }
        let messages = &call.request.messages;
        // As in the replay, the first call after a compaction opens a turn: the summary (and
        // what the compaction restored after it) ends its messages.
        if call.new_turn || call.compacted {
            let opens_session = self.turns.turns == 0 && !self.head_truncated;
            let scan = recorded.scan.clone();
            let at_turns = self.turns.clone();
            let record = scan.record(&at_turns, opens_session, self.side_entries, model_switched);
            let start = self.turns.on_new_turn(&profile, messages, record);
            if start.rerenders_start && self.rerender_prompts {
                self.start_epoch += 1;
                events.push("turn_rerender".to_owned());
                if start.queued_across_compaction {
                    events.push(QUEUED_ACROSS_COMPACTION.to_owned());
                }
            }
            if start.hook_context_lost_side_entry {
                events.push("tool_hook_context".to_owned());
            }
            if start.rerenders_previous {
                events.push("rerendered_prompt".to_owned());
            }
            if let Some(cut) = messages.len().checked_sub(1).and_then(|last| side_cut(&start, last, self.prompt_index)) {
                let at = scan.side_entry_time(&profile, &at_turns, self.previous_ms, call.time_ms);
                if let Some(side) = self.side_flat(call.request, cut, call.markers_ttl, measurer) {
                    let _ = measurer.seed_cache(&side, at, 0);
                    events.push("side_entry".to_owned());
                }
            }
            self.prompt_index = messages.len().checked_sub(1);
        }
        self.turns.compaction_pending = false;
        self.render(flat, self.turns.transient_prompt, measurer);
        self.rendered.clone_from(&flat.salts);
        self.previous_ms = Some(call.time_ms);
        self.profile = Some(profile);
        events
    }

    fn after_main(&mut self, row: &RequestMetrics) {
        self.turns.previous_read = Some(self.recorded_read.max(row.cache_read_input_tokens));
    }

    fn salts_hint(&self) -> &[(usize, u128)] {
        &self.rendered
    }
}

/// The part of `request` up to its last global-scope marker (tools and the system prompt's
/// static part), as the server caches it; `None` when nothing is marked global.
fn global_prefix(request: &Request, measurer: &mut Measurer) -> Option<FlatRequest> {
    let Some(crate::api::SystemPrompt::Blocks(blocks)) = &request.system else { return None };
    let last = blocks.iter().rposition(|b| b.cache_control.as_ref().is_some_and(|c| c.scope == Some(crate::api::CacheScope::Global)))?;
    // (The request's messages not copied: `with_messages`.)
    let prefix = Request { system: Some(crate::api::SystemPrompt::Blocks(blocks[..=last].to_vec().into())), ..request.with_messages(Vec::new()) };
    measurer.flatten(&prefix).ok()
}

impl RecordedClient {
    /// The side request of the previous turn as the server saw it: the request's first `cut`
    /// messages, its marker on the last of them (at `markers_ttl` where given,
    /// [`crate::runner::MainCall::markers_ttl`]), the conversation start as now rendered.
    fn side_flat(&self, request: &Request, cut: usize, markers_ttl: Option<Option<crate::api::CacheTtl>>, measurer: &mut Measurer) -> Option<FlatRequest> {
        let marker = request.messages.iter().rev().find_map(|m| match &m.content {
            MessageContent::Blocks(blocks) => blocks.iter().rev().find_map(|b| b.cache_control().cloned()),
            MessageContent::Text(_) => None,
        })?;
        let mut side = request.with_messages(request.messages[..cut].to_vec());
        for message in &mut side.messages {
            // Only a message with a marker is changed (a change copies its shared blocks).
            if let MessageContent::Blocks(blocks) = &mut message.content
                && blocks.iter().any(|b| b.cache_control().is_some())
            {
                blocks.iter_mut().for_each(|b| {
                    b.set_cache_control(None);
                });
            }
        }
        let last = side.messages.last_mut()?.content.blocks_mut();
        let _ = last.iter_mut().rev().any(|b| b.set_cache_control(Some(marker.clone())));
        // Flattened salted as it is rendered: the track keeps the main requests' salts.
        let mut flat = measurer.serve_salted(&side, None, None, &self.salts(false)).ok()?.flat;
        if let Some(ttl) = markers_ttl {
            flat.set_markers_ttl(ttl);
        }
        self.render(&mut flat, false, measurer);
        self.retime(&mut flat);
        Some(flat)
    }

    /// Writes `flat` with the TTL the recorded calls wrote with at this point, where it departs
    /// from the session's first one (d847 turned from 1h to 5m at call 227: the client's 1h
    /// eligibility is not in the record, only the usage's split): every marker at the first TTL
    /// is moved to the one in force. A what-if's own TTL (markers at another one) is kept.
    fn retime(&self, flat: &mut FlatRequest) {
        let (Some(first), Some(now)) = (self.first_ttl, self.ttl) else { return };
        if first == now {
            return;
        }
        for k in 0..flat.markers.len() {
            let i = flat.markers[k];
            if flat.marker_ttl(i).is_some_and(|ttl| ttl.unwrap_or(crate::api::CacheTtl::FiveMinutes) == first) {
                flat.set_marker_ttl(i, Some(now));
            }
        }
    }

    /// The bytes the recorded client sent otherwise than the agent builds them: the
    /// conversation start as rendered since its last re-render, and the current prompt the
    /// transient way when `transient` (`flat`'s salts set, whatever it carried; `measurer`
    /// served it).
    fn render(&self, flat: &mut FlatRequest, transient: bool, measurer: &mut Measurer) {
        measurer.set_salts(flat, &self.salts(transient));
    }

    /// The salts [`Self::render`] sets.
    fn salts(&self, transient: bool) -> Vec<(usize, u128)> {
        let mut salts = Vec::new();
        if self.start_epoch > 0 {
            salts.push((0, START_SALT.wrapping_mul(u128::from(self.start_epoch))));
        }
        if transient && let Some(index) = self.prompt_index {
            salts.push((index, TRANSIENT_SALT));
        }
        salts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MessageContent, Request};
    use crate::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};

    fn text(role: Role, text: &str) -> Message {
        Message { role, content: MessageContent::Text(text.to_owned().into()), extra: Default::default() }
    }

    fn flat(messages: Vec<Message>) -> FlatRequest {
        let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
        let mut request = Request::new("claude-opus-4-5-20251101".to_owned(), 1000);
        request.system = Some(crate::api::SystemPrompt::Text("system prompt".to_owned()));
        request.messages = messages;
        measurer.flatten(&request).expect("known model")
    }

    #[test]
    fn salting_changes_identities_from_the_message_on_and_keeps_tokens() {
        let messages = vec![text(Role::User, "first prompt"), text(Role::Assistant, "reply"), text(Role::User, "second")];
        let plain = flat(messages.clone());
        let mut salted = plain.clone();
        salt_message(&mut salted, 1);
        assert_eq!(plain.total_tokens, salted.total_tokens);
        let same: Vec<bool> = plain.blocks.iter().zip(salted.blocks.iter()).map(|(a, b)| a.prefix_hash == b.prefix_hash).collect();
        assert_eq!(same, vec![true, true, false, false]);
    }

    #[test]
    fn opening_and_typed_prompts_follow_the_version() {
        let turn = |version: &str, opens: bool, prompt: &str| {
            let mut state = TurnState::default();
            state.on_new_turn(&ClientProfile::for_version(version), &[text(Role::User, prompt)], TurnRecord { opens_session: opens, side_entries: true, ..TurnRecord::default() });
            state.transient_prompt
        };
        assert!(turn("2.0.76", true, "fix it"));
        assert!(!turn("2.0.76", false, "fix it"));
        assert!(!turn("2.1.7", false, "fix it"));
        assert!(turn("2.1.37", false, "fix it"));
        assert!(!turn("2.1.37", false, "<task-notification>\n<task-id>b0</task-id>"));
        assert!(!turn("2.1.42", true, "fix it"));
    }

    #[test]
    fn side_entry_needs_a_warm_finished_turn() {
        let profile = ClientProfile::for_version("2.1.7");
        let messages = [text(Role::User, "a"), text(Role::Assistant, "b"), text(Role::User, "c")];
        let start = |previous_read: Option<u64>, turns: u32| {
            let mut state = TurnState { turns, previous_read, ..TurnState::default() };
            state.on_new_turn(&profile, &messages, TurnRecord { side_entries: true, ..TurnRecord::default() }).side_entry
        };
        assert!(start(Some(10_000), 1));
        assert!(!start(Some(0), 1), "a cold last call leaves no side entry");
        assert!(!start(Some(10_000), 0), "no turn before the first");
        let interrupted = Message {
            role: Role::User,
            content: MessageContent::Blocks(vec![
                ContentBlock::ToolResult { tool_use_id: "t".into(), content: None, is_error: None, cache_control: None, extra: Default::default() },
                ContentBlock::text("[Request interrupted by user for tool use]".to_owned()),
            ].into()),
            extra: Default::default(),
        };
        let mut state = TurnState { turns: 1, previous_read: Some(10_000), ..TurnState::default() };
        assert!(!state.on_new_turn(&profile, &[text(Role::User, "a"), text(Role::Assistant, "b"), interrupted], TurnRecord { side_entries: true, ..TurnRecord::default() }).side_entry);
    }

    fn warm_turn(version: &str, record: TurnRecord<'_>) -> TurnStart {
        let messages = [text(Role::User, "a"), text(Role::Assistant, "b"), text(Role::User, "c")];
        let mut state = TurnState { turns: 1, previous_read: Some(10_000), tree_changed: true, ..TurnState::default() };
        state.on_new_turn(&ClientProfile::for_version(version), &messages, TurnRecord { side_entries: true, ..record })
    }

    #[test]
    fn from_2_1_170_the_side_entry_needs_a_stop_summary() {
        assert!(warm_turn("2.1.205", TurnRecord { ended_normally: true, ..TurnRecord::default() }).side_entry);
        assert!(!warm_turn("2.1.205", TurnRecord::default()).side_entry, "no stop summary, no side request");
        assert!(warm_turn("2.1.14", TurnRecord::default()).side_entry, "before 2.1.170 the record is not asked");
    }

    #[test]
    fn from_2_1_200_a_new_prompt_rerenders_the_start() {
        let ended = TurnRecord { ended_with_reply: true, ..TurnRecord::default() };
        assert!(warm_turn("2.1.215", ended).rerenders_start);
        assert!(!warm_turn("2.1.215", TurnRecord::default()).rerenders_start, "a reply cut off re-renders nothing");
        assert!(!warm_turn("2.1.49", ended).rerenders_start);
        let mut state = TurnState { turns: 1, previous_read: Some(10_000), compaction_pending: true, tree_changed: true, ..TurnState::default() };
        let messages = [text(Role::User, "summary"), text(Role::User, "c")];
        assert!(!state.on_new_turn(&ClientProfile::for_version("2.1.215"), &messages, ended).rerenders_start);
    }

    #[test]
    fn from_2_1_200_the_start_is_rendered_anew_only_after_the_tree_may_have_changed() {
        let ended = TurnRecord { ended_with_reply: true, side_entries: true, ..TurnRecord::default() };
        let messages = [text(Role::User, "a"), text(Role::Assistant, "b"), text(Role::User, "c")];
        let start = |version: &str, tree_changed: bool| {
            let mut state = TurnState { turns: 1, previous_read: Some(10_000), tree_changed, ..TurnState::default() };
            let start = state.on_new_turn(&ClientProfile::for_version(version), &messages, ended);
            assert!(!state.tree_changed, "the prompt's render takes the change in");
            start.rerenders_start
        };
        assert!(start("2.1.215", true));
        assert!(!start("2.1.215", false), "nothing written since the last prompt: the start renders the same");
        // What the scan reads as a change, from the record's events.
        let mut scan = TurnScan::in_project(Some("D:\\oh-my-posh"));
        let reply = |name: &str, input: Value| Event {
            time_ms: 0,
            lane: LANE_MAIN.to_owned(),
            uuid: None,
            kind: EventKind::ModelReply(
                serde_json::from_value(serde_json::json!({"content": [{"type": "tool_use", "id": "t", "name": name, "input": input}]})).expect("a reply"),
            ),
        };
        scan.observe(&reply("Edit", serde_json::json!({"file_path": "C:\\Users\\me\\.config.json"})));
        scan.observe(&reply("Bash", serde_json::json!({"command": "go test ./... 2>&1 | tail"})));
        let mut turns = TurnState::default();
        scan.apply(&mut turns);
        assert!(!turns.tree_changed);
        scan.observe(&reply("Bash", serde_json::json!({"command": "sed -i 's/a/b/' src/x.go"})));
        scan.apply(&mut turns);
        assert!(turns.tree_changed);
    }

    #[test]
    fn a_tool_hook_context_loses_the_side_entry_from_2_1_200_to_2_1_231() {
        let ended = TurnRecord { ended_normally: true, ended_with_reply: true, side_entries: true, ..TurnRecord::default() };
        let messages = [text(Role::User, "a"), text(Role::Assistant, "b"), text(Role::User, "c")];
        let turn = |version: &str, hook: bool| {
            let mut state = TurnState { turns: 1, previous_read: Some(10_000), tool_hook_context: hook, tree_changed: true, ..TurnState::default() };
            let start = state.on_new_turn(&ClientProfile::for_version(version), &messages, ended);
            assert!(!state.tool_hook_context, "a prompt after the reply consumes it");
            start
        };
        let lost = turn("2.1.219", true);
        assert!(lost.hook_context_lost_side_entry && !lost.side_entry && lost.rerenders_start);
        assert!(turn("2.1.219", false).side_entry);
        assert!(turn("2.1.232", true).side_entry, "2.1.232 keeps it");
        assert!(turn("2.1.49", true).side_entry, "before 2.1.200 nothing is re-rendered");
        // A turn that re-renders nothing (a Skill expansion, a cut-off reply) keeps the context
        // for the prompt that does.
        let mut state = TurnState { turns: 1, previous_read: Some(10_000), tool_hook_context: true, tree_changed: true, ..TurnState::default() };
        let cut = TurnRecord { ended_with_reply: false, ..ended };
        assert!(!state.on_new_turn(&ClientProfile::for_version("2.1.219"), &messages, cut).hook_context_lost_side_entry);
        assert!(state.tool_hook_context);
    }

    #[test]
    fn a_model_switch_seeds_no_side_entry() {
        let record = TurnRecord { ended_normally: true, model_switched: true, ..TurnRecord::default() };
        assert!(!warm_turn("2.1.205", record).side_entry);
        assert!(!warm_turn("2.1.14", record).side_entry);
    }

    #[test]
    fn an_item_queued_before_a_compaction_rerenders_the_start_once_when_delivered() {
        use crate::recording::format::{Compaction, SystemEvent, UserPrompt};
        let event = |kind: EventKind| Event { time_ms: 0, lane: LANE_MAIN.to_owned(), uuid: None, kind };
        let enqueue = |text: &str| event(EventKind::SystemEvent(SystemEvent { subtype: "queue_operation".into(), payload: serde_json::json!({"operation": "enqueue", "content": text}) }));
        let prompt = |text: &str| {
            event(EventKind::UserPrompt(UserPrompt { content: MessageContent::Text(text.to_owned().into()), is_meta: false, is_compact_summary: false, permission_mode: None }))
        };
        let compaction = event(EventKind::Compaction(Compaction { trigger: "auto".into(), pre_tokens: None, post_tokens: None, summary: None, metadata: Value::Null }));
        let messages = [text(Role::User, "a"), text(Role::Assistant, "b"), text(Role::User, "<task-notification>x</task-notification>")];
        let ended = TurnRecord { ended_normally: true, ended_with_reply: true, side_entries: true, ..TurnRecord::default() };
        // Two notifications queued before a compaction, one after; each delivered in a scan of its own.
        let mut turns = TurnState { turns: 1, previous_read: Some(10_000), ..TurnState::default() };
        let mut scan = TurnScan::default();
        for e in [enqueue("<task-notification>one</task-notification>"), enqueue("<task-notification>two</task-notification>"), compaction] {
            scan.observe(&e);
        }
        scan.observe(&enqueue("<task-notification>three</task-notification>"));
        scan.apply(&mut turns);
        let profile = ClientProfile::for_version("2.1.39");
        let mut deliver = |text: &str| {
            let mut scan = TurnScan::default();
            scan.observe(&prompt(text));
            scan.apply(&mut turns);
            turns.on_new_turn(&profile, &messages, ended)
        };
        let first = deliver("<task-notification>one</task-notification>\n");
        assert!(first.queued_across_compaction && first.rerenders_start && !first.side_entry, "{first:?}");
        let second = deliver("<task-notification>two</task-notification>");
        // (Up to 2.1.169 a turn a notification opened leaves no side entry: only the start counts.)
        assert!(!second.queued_across_compaction && !second.rerenders_start, "once per compaction: {second:?}");
        let third = deliver("<task-notification>three</task-notification>");
        assert!(!third.queued_across_compaction && !third.rerenders_start, "queued after the compaction: {third:?}");
        // Without the rule (`--no-rerender`), the side entry stands.
        let mut turns = TurnState { turns: 1, previous_read: Some(10_000), delivers_queued_across_compaction: true, ..TurnState::default() };
        let off = ClientProfile { queued_across_compaction_rerenders_start: false, ..ClientProfile::for_version("2.1.39") };
        assert!(turns.on_new_turn(&off, &messages, ended).side_entry);
    }

    /// The flag a delivery across a compaction sets waits for the next turn start: it carries
    /// over the scans of calls that start no turn, is taken once, and is cleared by a later
    /// prompt (whose own delivery decides) or by a compaction (which renders the start anew
    /// itself; the turn it opens delivered nothing).
    #[test]
    fn a_delivery_across_a_compaction_carries_to_the_next_turn_start_only() {
        use crate::recording::format::{Compaction, SystemEvent, UserPrompt};
        let event = |kind: EventKind| Event { time_ms: 0, lane: LANE_MAIN.to_owned(), uuid: None, kind };
        let enqueue = |text: &str| event(EventKind::SystemEvent(SystemEvent { subtype: "queue_operation".into(), payload: serde_json::json!({"operation": "enqueue", "content": text}) }));
        let prompt = |text: &str| {
            event(EventKind::UserPrompt(UserPrompt { content: MessageContent::Text(text.to_owned().into()), is_meta: false, is_compact_summary: false, permission_mode: None }))
        };
        let compaction = || event(EventKind::Compaction(Compaction { trigger: "auto".into(), pre_tokens: None, post_tokens: None, summary: None, metadata: Value::Null }));
        let tool_loop = event(EventKind::ModelReply(
            serde_json::from_value(serde_json::json!({"content": [{"type": "tool_use", "id": "t", "name": "Read", "input": {"file_path": "/p/a"}}], "stop_reason": "tool_use"})).expect("a reply"),
        ));
        let scan_of = |events: &[Event]| {
            let mut scan = TurnScan::default();
            events.iter().for_each(|e| scan.observe(e));
            scan
        };
        let messages = [text(Role::User, "a"), text(Role::Assistant, "b"), text(Role::User, "c")];
        let ended = TurnRecord { ended_normally: true, ended_with_reply: true, side_entries: true, ..TurnRecord::default() };
        let profile = ClientProfile::for_version("2.1.39");
        // An item queued, a compaction, the item delivered by a prompt whose call starts no turn.
        let delivered = || {
            let mut turns = TurnState { turns: 1, previous_read: Some(10_000), ..TurnState::default() };
            scan_of(&[enqueue("queued item"), compaction()]).apply(&mut turns);
            scan_of(&[prompt("queued item")]).apply(&mut turns);
            assert!(turns.delivers_queued_across_compaction);
            turns
        };
        // Carried over a tool loop's scan to the next turn start, and taken there once.
        let mut turns = delivered();
        scan_of(std::slice::from_ref(&tool_loop)).apply(&mut turns);
        assert!(turns.delivers_queued_across_compaction, "carried over a scan with no prompt");
        assert!(turns.on_new_turn(&profile, &messages, ended).queued_across_compaction);
        assert!(!turns.delivers_queued_across_compaction);
        assert!(!turns.on_new_turn(&profile, &messages, ended).queued_across_compaction, "taken once");
        // A later prompt decides by its own delivery.
        let mut turns = delivered();
        scan_of(&[prompt("another prompt")]).apply(&mut turns);
        assert!(!turns.on_new_turn(&profile, &messages, ended).queued_across_compaction);
        // A compaction before the next turn start clears it: the turn the compaction opens
        // delivered nothing.
        let mut turns = delivered();
        scan_of(&[compaction()]).apply(&mut turns);
        turns.on_compaction(&profile);
        let start = turns.on_new_turn(&profile, &messages, ended);
        assert!(!start.queued_across_compaction && !start.rerenders_start, "{start:?}");
        // Within one scan, the order decides: a delivery after the compaction stands.
        let mut turns = TurnState { turns: 1, previous_read: Some(10_000), ..TurnState::default() };
        scan_of(&[enqueue("queued item"), compaction(), prompt("queued item")]).apply(&mut turns);
        assert!(turns.on_new_turn(&profile, &messages, ended).queued_across_compaction);
    }

    #[test]
    fn typed_prompts_in_bypass_mode_are_not_rerendered() {
        let turn = |mode: Option<&str>| {
            let mut state = TurnState::default();
            let record = TurnRecord { permission_mode: mode, ..TurnRecord::default() };
            state.on_new_turn(&ClientProfile::for_version("2.1.39"), &[text(Role::User, "fix it")], record);
            state.transient_prompt
        };
        assert!(turn(Some("acceptEdits")));
        assert!(turn(None));
        assert!(!turn(Some("bypassPermissions")));
    }
}
