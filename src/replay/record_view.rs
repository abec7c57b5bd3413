//! What the record of a session shows before each of its calls, in one pass over its records and
//! without building or measuring a request: the events the client went through (turns, gaps
//! against the recorded TTL, compactions, microcompacts, re-renders, model switches, skills,
//! side entries...), the messages each call saw as the transcript holds them (measured only where
//! a size rests on them), and the unrecorded part of each call (the prefix level the record shows,
//! the user context a segment's first call anchors).
//!
//! The agent's paths (the workload's sizing, `fidelity`'s break causes and call events, the
//! calibration fit) take this view; the record-based replay that read the record through the
//! same functions was removed in session 26.
//!
//! What it leaves out: request building (fillers for the unrecorded part, breakpoints), the
//! cache simulation and everything that rests on it (the seeded prefixes, the simulated reads). A view is of the session as recorded, under the knobs that change how the
//! record is read ([`ReplayOptions`]: rerendered prompts, side entries, recorded requests).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::api::{CacheTtl, ContentBlock, Message, Request, Role, SharedBlocks};
use crate::measure::token_cache::SharedCounts;
use crate::measure::{EstimatorKind, Measurer};
use crate::recording::claude_code::ATTACHMENTS_NOT_SENT;
use crate::recording::format::{LANE_COMPACT, LANE_MAIN};
use crate::recording::{EventKind, ImportedSession, RecordedCall};

use super::profile::ClientProfile;
use super::session::{ReplayOptions, UnrecordedSizes};
use super::sizing::{GroupSizes, LaneState, filler, marks_resume, shape_flat};
use super::turns::{TurnScan, TurnStart, TurnState};

/// Events at which the client re-renders the start of the conversation, so that a recorded read
/// falling into the unrecorded part of the request there shows the prefix level.
const REVEALING_EVENTS: [&str; 5] = ["compaction", "microcompact", "skill", "resume", "new_user_turn"];

/// What a lane's scan of its records needs of the run.
pub(super) struct ScanContext<'a> {
    pub session: &'a ImportedSession,
    /// Compactions restore the working set ([`ReplayOptions::restore_files`]), sized by these
    /// fillers' estimator, its shared counts and the per-text estimates kept across calls.
    pub restore_files: bool,
    pub kind: EstimatorKind,
    pub shared: Option<&'a SharedCounts>,
    pub file_tokens: &'a RefCell<BTreeMap<(u128, String), u64>>,
    /// [`ReplayOptions::recorded_microcompact`].
    pub recorded_microcompact: bool,
}

/// What the records of one lane since its previous call show.
pub(super) struct LaneScan {
    /// The record that prompted the call (a user prompt or tool result): when it went out.
    pub request_start: Option<u64>,
    /// The turn boundary as recorded ([`TurnScan`]).
    pub turn_scan: TurnScan,
    /// Characters of the attachments the client sends as reminders, and of those it does not
    /// size ([`super::CallReplay::attachment_chars`]).
    pub attachment_chars: u64,
    pub unsized_attachment_chars: u64,
}

/// Scans `call`'s lane's records since its previous call into `state`, pushing what they show
/// onto `call_events`: compactions (restoring the working set), microcompacts, skills, tool
/// search loads, a resumed client; the tool uses and results that make the working set.
#[expect(clippy::too_many_arguments, reason = "the lane, the call and what the run holds for it")]
pub(super) fn scan_lane(
    cx: &ScanContext<'_>,
    measurer: &Measurer,
    state: &mut LaneState,
    call: &RecordedCall,
    profile: &ClientProfile,
    turn_profile: &ClientProfile,
    family: &str,
    params: crate::measure::tokens::FamilyCalibration,
    call_events: &mut Vec<String>,
) -> LaneScan {
    let session = cx.session;
    let events = &session.recording.events;
    let cwd = session.recording.header.cwd.as_deref();
    let from = state.scanned_to;
    let mut resumed_at = None;
    let mut request_start = None;
    // What the record shows about the turn boundary (whether the previous turn ended
    // normally, with its reply; the permission mode; a tool hook's context).
    let mut turn_scan = TurnScan::in_project(cwd);
    let mut attachment_chars = 0u64;
    let mut unsized_attachment_chars = 0u64;
    for (i, event) in events.iter().enumerate().take(call.event_index).skip(from) {
        if event.lane != call.lane {
            continue;
        }
        turn_scan.observe(event);
        match &event.kind {
            EventKind::Compaction(_) => {
                call_events.push("compaction".into());
                state.turns.on_compaction(turn_profile);
                state.restored = if cx.restore_files {
                    let counter = measurer.counter();
                    // The files of one compaction are mostly those of the one before.
                    let count = |text: &str| {
                        let key = (xxhash_rust::xxh3::xxh3_128(text.as_bytes()), family.to_owned());
                        *cx.file_tokens.borrow_mut().entry(key).or_insert_with(|| u64::from(counter.count_text(text, family)))
                    };
                    // A file over its limit is counted only until a part of it is: its count is
                    // read nowhere else.
                    let passes = |text: &str, past: &dyn Fn(u64) -> bool| {
                        let key = (xxhash_rust::xxh3::xxh3_128(text.as_bytes()), family.to_owned());
                        if let Some(&n) = cx.file_tokens.borrow().get(&key) {
                            return past(n);
                        }
                        match counter.count_text_unless(text, family, past) {
                            Some(n) => {
                                cx.file_tokens.borrow_mut().insert(key, u64::from(n));
                                past(u64::from(n))
                            }
                            None => true,
                        }
                    };
                    // Renderings shared by every replay of the session and its edits.
                    let memo = session.reference_memo();
                    let restored = state.working_set.compact_memoized(cwd, count, passes, |text| memo.rendered(text, |text| super::working_set::render_numbered(text, profile.restore_line_numbers)));
                    restored
                        .iter()
                        .map(|r| r.to_block(|label, tokens| filler(label, tokens, cx.kind, params.scale, params.per_block, cx.shared)))
                        .collect()
                } else {
                    SharedBlocks::default()
                };
                state.restored_version += 1;
                state.cleared.clear();
                state.cleared_version += 1;
                state.compacted = true;
                state.segment_context = None;
                // The recorded usage after a compaction shows what the new segment carries.
                state.anchor_pending = true;
                state.anchor_after_compaction = true;
            }
            EventKind::SystemEvent(sys) if sys.subtype == "microcompact_boundary" => {
                call_events.push("microcompact".into());
                let ids = sys.payload.get("microcompactMetadata").and_then(|m| m.get("compactedToolIds")).and_then(Value::as_array);
                let ids: Vec<&str> = ids.into_iter().flatten().filter_map(Value::as_str).collect();
                let hidden = ids.iter().filter(|id| !state.seen_results.contains(**id)).count();
                let saved = sys.payload.get("microcompactMetadata").and_then(|m| m.get("tokensSaved")).and_then(Value::as_u64).unwrap_or(0);
                if !ids.is_empty() {
                    state.hidden_saved += saved * hidden as u64 / ids.len() as u64;
                }
                if hidden > 0 {
                    state.anchor_pending = true;
                }
                if cx.recorded_microcompact {
                    for id in ids {
                        if state.cleared.insert(id.to_owned()) {
                            state.cleared_version += 1;
                        }
                    }
                }
            }
            // The SessionStart hook's source names a new client process: as a hook
            // progress record (2.1.x) or as the hook's attachment (2.1.2xx).
            EventKind::SystemEvent(_) | EventKind::Attachment(_) if marks_resume(&event.kind) => {
                resumed_at = Some(i);
            }
            EventKind::Attachment(attachment) if !ATTACHMENTS_NOT_SENT.contains(&attachment.attachment_type.as_str()) => {
                let chars = crate::measure::tokens::json_len(&attachment.payload) as u64;
                attachment_chars += chars;
                if !crate::recording::claude_code::attachment_client_sized(attachment) {
                    unsized_attachment_chars += chars;
                }
            }
            EventKind::UserPrompt(_) => {
                request_start = Some(event.time_ms);
                // `/exit` ends the process: whatever comes next is a resumed one.
                if marks_resume(&event.kind) {
                    resumed_at = Some(i);
                }
            }
            EventKind::ModelReply(reply) if i < call.event_index => {
                for (b, block) in reply.content.iter().enumerate() {
                    if let ContentBlock::ToolUse { id, name, input, .. } = block {
                        state.pending.insert(id.clone(), (events.shared(i).clone(), b));
                        match name.as_str() {
                            "Skill" if profile.skill_rerender => {
                                call_events.push("skill".into());
                                state.rerender_epoch += 1;
                            }
                            // Only the session's first load moves the tools array.
                            "ToolSearch" if profile.tool_search_full_miss && !state.tool_search_loaded => {
                                state.tool_search_loaded = true;
                                let query = input.get("query").and_then(Value::as_str).unwrap_or("");
                                for tool in query.trim_start_matches("select:").split(',') {
                                    let tool = tool.trim();
                                    if !tool.is_empty() && !state.loaded_tools.iter().any(|t| t == tool) {
                                        state.loaded_tools.push(tool.to_owned());
                                        call_events.push("tool_search_load".into());
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
            EventKind::ToolResult(result) => {
                request_start = Some(event.time_ms);
                state.seen_results.insert(result.tool_use_id.clone());
                if let Some((reply, b)) = state.pending.remove(&result.tool_use_id)
                    && let EventKind::ModelReply(reply) = &reply.kind
                    && let Some(ContentBlock::ToolUse { name, input, .. }) = reply.content.get(b)
                {
                    let memo = session.reference_memo();
                    state.working_set.observe_memoized(name, input, result.tool_use_result.as_deref(), result.is_error, &mut |edited| memo.edited(i, edited));
                }
            }
            _ => {}
        }
    }
    if call.lane == LANE_MAIN {
        turn_scan.apply(&mut state.turns);
    }
    // The next call scans from this call's own reply on: the tool uses in it (Read, Skill,
    // ToolSearch) and the results that follow belong to what the next call sees.
    state.scanned_to = call.event_index;
    // A resumed client loaded its history back from the transcript (losing parallel tool
    // results off the parentUuid chain) and re-renders the start of the conversation.
    if let Some(i) = resumed_at {
        state.loaded_until = i;
        if profile.resume_rerender {
            call_events.push("resume".into());
            state.rerender_epoch += 1;
        }
    }
    LaneScan { request_start, turn_scan, attachment_chars, unsized_attachment_chars }
}

/// Why `call` is not compared with a simulated one (a synthetic reply, an API error, no usage).
pub(super) fn skip_reason(call: &RecordedCall) -> Option<&'static str> {
    if call.is_synthetic {
        Some("synthetic reply (no API call)")
    } else if call.is_api_error {
        Some("API error")
    } else if call.usage.prompt_tokens() == 0 {
        Some("no usage recorded")
    } else {
        None
    }
}

/// When a compared call went out and under which TTL, against the lane's previous call:
/// `(ttl, start_ms, previous_time)`; pushes `model_switch` and `ttl_expired` onto `call_events`.
pub(super) fn call_timing(state: &mut LaneState, call: &RecordedCall, request_start: Option<u64>, call_events: &mut Vec<String>) -> (CacheTtl, u64, Option<u64>) {
    if let Some(ttl) = super::sizing::ttl_of(&call.usage) {
        state.ttl = Some(ttl);
    }
    let ttl = state.ttl.unwrap_or(CacheTtl::FiveMinutes);
    if state.model.as_ref().is_some_and(|m| m != &call.model) {
        call_events.push("model_switch".into());
    }
    // The recorded time of a call is its first streamed block; the request went out when
    // the record that prompted it (a user prompt or tool result) was written. The cache
    // entry of the previous call lives from its first block on.
    let start_ms = request_start.filter(|&t| t <= call.time_ms && state.last_time_ms.is_none_or(|last| t >= last)).unwrap_or(call.time_ms);
    let previous_time = state.last_time_ms;
    if let Some(last) = state.last_time_ms
        && start_ms.saturating_sub(last) >= ttl.millis()
    {
        call_events.push("ttl_expired".into());
    }
    state.model = Some(call.model.clone());
    state.last_time_ms = Some(call.time_ms);
    (ttl, start_ms, previous_time)
}

/// Whether the request opens a user turn: its last message carries something besides tool
/// results (a prompt, or an interruption with what the user sent next).
fn is_new_user_turn(messages: &[Message]) -> bool {
    messages.last().is_some_and(super::turns::is_prompt)
}

/// A new user turn as the record shows it at one call.
#[derive(Debug, Clone, Copy)]
pub(super) struct TurnSeen {
    /// What the client did at the turn's start (main lane only).
    pub turn_start: Option<TurnStart>,
}

/// Whether `messages` (of `call`, not a compaction's fork) open a new user turn, and what the
/// client does at its start; pushes `new_user_turn`, `turn_rerender` (and
/// [`super::turns::QUEUED_ACROSS_COMPACTION`]), `tool_hook_context` and `rerendered_prompt`.
/// `before_turn` sees the lane's turn state just before the new turn changes it.
#[expect(clippy::too_many_arguments, reason = "the lane, the call and what the record shows of it")]
pub(super) fn turn_events(
    state: &mut LaneState,
    call: &RecordedCall,
    fork: bool,
    messages: &[Message],
    turn_scan: &TurnScan,
    truncated: bool,
    options: &ReplayOptions,
    turn_profile: &ClientProfile,
    call_events: &mut Vec<String>,
    before_turn: &mut dyn FnMut(&TurnState, &[Message], super::turns::TurnRecord<'_>),
) -> TurnSeen {
    let new_turn = !fork && is_new_user_turn(messages);
    if new_turn {
        call_events.push("new_user_turn".into());
    }
    let model_switched = call_events.iter().any(|e| e == "model_switch");
    let turn_start = (new_turn && call.lane == LANE_MAIN).then(|| {
        let at_turns = state.turns.clone();
        let record = turn_scan.record(&at_turns, state.turns.turns == 0 && !truncated, options.side_entries, model_switched);
        before_turn(&state.turns, messages, record);
        state.turns.on_new_turn(turn_profile, messages, record)
    });
    let rerenders_previous = turn_start.is_some_and(|t| t.rerenders_previous);
    if turn_start.is_some_and(|t| t.rerenders_start) && options.rerender_prompts {
        call_events.push("turn_rerender".into());
        if turn_start.is_some_and(|t| t.queued_across_compaction) {
            call_events.push(super::turns::QUEUED_ACROSS_COMPACTION.into());
        }
        state.rerender_epoch += 1;
    }
    if turn_start.is_some_and(|t| t.hook_context_lost_side_entry) {
        call_events.push("tool_hook_context".into());
    }
    state.turns.compaction_pending = false;
    if rerenders_previous {
        call_events.push("rerendered_prompt".into());
    }
    TurnSeen { turn_start }
}

/// The request the transcript recorded sending for `call`, where it rebuilds exactly, else why it was reconstructed (`None` both when the run does not
/// use the recorded requests).
pub(super) fn recorded_request(
    use_records: bool,
    rebuilder: &mut crate::recording::api_requests::Rebuilder<'_>,
    call: &RecordedCall,
) -> (Option<Request>, Option<String>) {
    if !use_records {
        return (None, None);
    }
    if let Some(id) = &call.request_ref {
        match rebuilder.rebuild(id).and_then(|r| r.request()) {
            Ok(request) => (Some(request), None),
            Err(why) => (None, Some(why)),
        }
    } else {
        let why = if call.lane == LANE_COMPACT {
            "a compaction request (the client records main-thread and subagent requests only)".to_owned()
        } else {
            "the reply names no api-request record (no requestRef)".to_owned()
        };
        (None, Some(why))
    }
}

/// What sizes the unrecorded part of the calls: the session's fitted priors and the sizes each
/// lane group's calls showed so far.
pub(super) struct Sizing<'a> {
    pub user_context_prior: u64,
    pub fitted_prefixes: &'a BTreeMap<String, u64>,
    pub groups: BTreeMap<String, GroupSizes>,
    pub unrecorded_main: Option<UnrecordedSizes>,
}

impl Sizing<'_> {
    /// Sizes `group`'s unrecorded part from its first compared call (`messages` its recorded
    /// messages): `Ok(Some(prefix))` when this call sized it, `Ok(None)` when an earlier one did.
    pub fn size_group(
        &mut self,
        measurer: &mut Measurer,
        call: &RecordedCall,
        messages: &[Message],
        group: &str,
        truncated: bool,
        notes: &mut BTreeSet<String>,
    ) -> Result<Option<u64>, String> {
        if self.groups.contains_key(group) {
            return Ok(None);
        }
        let mut bare = Request::new(call.model.clone(), 32_000);
        bare.messages = messages.to_vec();
        let bare = measurer.flatten(&bare).map_err(|e| e.to_string())?;
        let unrecorded_tokens = call.usage.prompt_tokens().saturating_sub(bare.total_tokens);
        let warm = call.usage.cache_read_input_tokens;
        let prefix = super::sizing::first_call_prefix(call, unrecorded_tokens, group == LANE_MAIN, truncated, self.user_context_prior, self.fitted_prefixes, notes);
        self.groups.insert(group.to_owned(), GroupSizes { prefix_tokens: prefix, context_tokens: unrecorded_tokens - prefix });
        if group == LANE_MAIN {
            self.unrecorded_main = Some(UnrecordedSizes { first_call_tokens: unrecorded_tokens, prefix_tokens: prefix, prefix_from_record: warm > 0 });
        }
        Ok(Some(prefix))
    }

    /// The first call of a segment whose unrecorded part changed by an unknown amount: its
    /// recorded total less the prefix level (its read when it read the prefix, a warm start on
    /// what was cached before the segment; else the level in force) and its messages is the
    /// segment's user context. Only the record of this one call is used. The call's own user
    /// context (measured with the prefix in force), when it anchors; pushes `segment_anchor`.
    #[expect(clippy::too_many_arguments, reason = "the lane, the call and how it is measured")]
    pub fn anchor_segment(
        &self,
        measurer: &mut Measurer,
        state: &mut LaneState,
        call: &RecordedCall,
        messages: &[Message],
        group: &str,
        truncated: bool,
        options: &ReplayOptions,
        strips_thinking: bool,
        call_events: &mut Vec<String>,
    ) -> Option<u64> {
        let after_compaction = std::mem::take(&mut state.anchor_after_compaction) && options.compaction_anchor;
        if !(std::mem::take(&mut state.anchor_pending) && (truncated || after_compaction) && call.lane == LANE_MAIN) {
            return None;
        }
        let mut bare = Request::new(call.model.clone(), 32_000);
        bare.messages = messages.to_vec();
        let mut flat = measurer.flatten(&bare).ok()?;
        shape_flat(&bare, &mut flat, strips_thinking, false);
        let read = call.usage.cache_read_input_tokens;
        let total = call.usage.prompt_tokens();
        let level = if read > 0 && read + flat.total_tokens <= total { read } else { self.groups[group].prefix_tokens };
        state.segment_context = Some(total.saturating_sub(level + flat.total_tokens));
        call_events.push("segment_anchor".into());
        // This call itself is measured with the prefix in force (a read that shows a new level
        // resizes the prefix after it), so its own total agrees too.
        Some(total.saturating_sub(self.groups[group].prefix_tokens + flat.total_tokens))
    }

    /// The sizes of `group`'s unrecorded part in force for `state`'s lane.
    pub fn sizes_now(&self, state: &LaneState, group: &str, truncated: bool) -> GroupSizes {
        sizes_in(state, self.groups[group], truncated, self.user_context_prior)
    }

    /// The prefix level a recorded read of `call` shows, when it shows one other than the one
    /// in force (`sizes`): a read that fell into the unrecorded part at a re-render (after a
    /// compaction every recorded message is new, so any read there does). A read at the level
    /// in force confirms it.
    pub fn revealed_level(&mut self, state: &LaneState, call: &RecordedCall, sizes: GroupSizes, group: &str, rebuilt: bool, call_events: &[String]) -> Option<u64> {
        let recorded_read = call.usage.cache_read_input_tokens;
        let has = |e: &str| call_events.iter().any(|x| x == e);
        let shows_level = recorded_read > 0
            && state.prev_recorded_cached.is_some_and(|prev| recorded_read + super::breaks::BREAK_MIN_DROP <= prev)
            && (has("compaction") || recorded_read <= sizes.prefix_tokens + sizes.context_tokens)
            && REVEALING_EVENTS.iter().any(|e| has(e));
        // A read at the level in force confirms it (a fitted per-version level can be exact).
        if shows_level
            && recorded_read == sizes.prefix_tokens
            && group == LANE_MAIN
            && let Some(main) = &mut self.unrecorded_main
        {
            main.prefix_from_record = true;
        }
        (shows_level && recorded_read != sizes.prefix_tokens && !rebuilt).then_some(recorded_read)
    }

    /// The record has just shown the prefix level `level` of `group`: its unrecorded part is
    /// sized by it from now on (the returned sizes). Pushes `prefix_level`.
    pub fn take_level(&mut self, group: &str, level: u64, call_events: &mut Vec<String>) -> GroupSizes {
        let g = self.groups.get_mut(group).expect("sized above");
        let total = g.prefix_tokens + g.context_tokens;
        g.prefix_tokens = level;
        g.context_tokens = total.saturating_sub(level);
        let sizes = *g;
        call_events.push("prefix_level".into());
        if group == LANE_MAIN
            && let Some(main) = &mut self.unrecorded_main
        {
            main.prefix_tokens = level;
            main.prefix_from_record = true;
        }
        sizes
    }
}

/// `g`, the sizes of a lane group's unrecorded part, as they stand for `state`'s lane: the
/// segment's anchored user context, less what a microcompact freed of history older than the
/// transcript; after a compaction of a head-truncated segment, the user context alone.
pub(super) fn sizes_in(state: &LaneState, g: GroupSizes, truncated: bool, user_context_prior: u64) -> GroupSizes {
    let mut sizes = g;
    if let Some(context) = state.segment_context {
        sizes.context_tokens = context;
        return sizes;
    }
    sizes.context_tokens = sizes.context_tokens.saturating_sub(state.hidden_saved);
    if state.compacted && truncated {
        // The history older than the transcript is gone; what stays is the user context.
        sizes.context_tokens = user_context_prior;
    }
    sizes
}

/// The side request after the previous turn refreshed what it read, sent at `at`: pushes
/// `side_entry`, and the gap that counts is from it (a `ttl_expired` it bridges goes).
pub(super) fn side_entry_seen(call_events: &mut Vec<String>, at: u64, start_ms: u64, previous_time: Option<u64>, ttl: CacheTtl) {
    call_events.push("side_entry".into());
    if start_ms.saturating_sub(at) < ttl.millis() && previous_time.is_some_and(|p| at.saturating_sub(p) < ttl.millis()) {
        call_events.retain(|e| e != "ttl_expired");
    }
}

/// One recorded call as the record shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallView {
    pub index: usize,
    pub lane: String,
    /// Why the call is not compared ([`super::CallReplay::skipped`]), if it is not.
    pub skipped: Option<String>,
    /// The events before the call ([`super::CallReplay::events`]).
    pub events: Vec<String>,
    /// The prefix level (tools + system) and the user context in force: the unrecorded part of
    /// the call as the record sizes it (for a call measured on its recorded request, that
    /// request's tools and system, and no user context).
    pub prefix_tokens: u64,
    pub user_context_tokens: u64,
    /// Tokens and blocks of the call's messages as the client sent them (0 unless the view was
    /// measured: [`record_view_measured`]; [`super::CallReplay::message_tokens`]).
    pub message_tokens: u64,
    pub message_blocks: u64,
    /// The call's reply holds thinking whose text was not stored ([`super::CallReplay::thinking_filled`]).
    pub thinking_filled: bool,
    /// Characters of the attachments since the lane's previous call the client sends as
    /// reminders, and of those it does not size ([`super::CallReplay::attachment_chars`]).
    pub attachment_chars: u64,
    pub unsized_attachment_chars: u64,
}

/// A session's record, call by call ([`record_view`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordView {
    pub calls: Vec<CallView>,
    /// The main lane group's unrecorded part as the record sized it by its end.
    pub unrecorded_main: Option<UnrecordedSizes>,
}

/// The [`RecordView`] of `session` read under `options` (only what changes the reading counts:
/// [`ReplayOptions::rerender_prompts`], `side_entries`, `recorded_requests`, `restore_files`,
/// `recorded_microcompact`, `compaction_anchor`, the TTLs), messages measured by `measurer`'s
/// token counter (its cache is not used).
///
/// A session's views are memoized ([`RecordViewMemo`]): a second read under the same knobs and
/// a measurer that counts alike (the audit's break causes, then its workload's sizing) is the
/// first one's copy.
pub fn record_view(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions) -> RecordView {
    let key = ViewKey::of(measurer, options);
    let memo = session.record_view_memo();
    if let Some(view) = memo.get(&key, session) {
        // (As the read would: a key space taken.)
        measurer.new_key_space();
        debug_assert!(view == read_record(session, &mut measurer.clone(), options, false, &mut |_, _| {}), "a memoized record view differs from a read of the record");
        return view;
    }
    let view = read_record(session, measurer, options, false, &mut |_, _| {});
    memo.insert(key, &view, session);
    view
}

/// The record views read of one session, by what a read depends on ([`ViewKey`]); shared by the
/// session's clones. Valid while its events are not changed in place (nothing does).
/// With them, the session's unstored thinking as estimated under a measurer's counting
/// settings ([`super::sizing::unstored_thinking`]: the view reads it, and so do the workload's
/// sizing and its first call's).
#[derive(Debug, Default)]
pub struct RecordViewMemo {
    views: std::sync::Mutex<Vec<(ReadFrom, ViewKey, RecordView)>>,
    thinking: std::sync::Mutex<Vec<(ReadFrom, ThinkingKey, EstimatedThinking)>>,
    /// The main lane's turn scans of the last view read, by the events each read (from, end),
    /// and the session as it was read: [`super::turns::RecordedClient::new`] takes them.
    turn_scans: std::sync::Mutex<Option<(ReadFrom, TurnScans)>>,
}

/// The main lane's [`TurnScan`]s of a session by the events they read (from, end).
pub(super) type TurnScans = std::sync::Arc<BTreeMap<(usize, usize), TurnScan>>;

/// The unstored thinking of a session by signature, and the notes its estimate took.
type EstimatedThinking = (BTreeMap<String, super::sizing::ThinkingFill>, BTreeSet<String>);

/// What [`super::sizing::unstored_thinking`] depends on beside the session as it was read
/// ([`ReadFrom`], made only for an estimate kept): the main version, and of the measurer what
/// its counts rest on.
#[derive(Debug, Clone)]
struct ThinkingKey {
    main_version: String,
    table: crate::measure::ModelTable,
    kind: EstimatorKind,
    calibration: crate::measure::Calibration,
    shared: Option<std::sync::Arc<SharedCounts>>,
}

impl ThinkingKey {
    fn same_settings(&self, other: &ThinkingKey) -> bool {
        let same_shared = match (&self.shared, &other.shared) {
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        same_shared && self.main_version == other.main_version && self.kind == other.kind && self.calibration == other.calibration && self.table == other.table
    }
}

impl RecordViewMemo {
    /// The unstored thinking of `session` under `measurer`'s counting settings, `estimate`d once
    /// per session and settings: the estimate and its notes (added to `notes`). Debug builds
    /// estimate again and compare.
    pub(super) fn unstored_thinking(
        &self,
        session: &ImportedSession,
        measurer: &Measurer,
        main_version: &str,
        notes: &mut BTreeSet<String>,
        estimate: impl Fn(&mut BTreeSet<String>) -> BTreeMap<String, super::sizing::ThinkingFill>,
    ) -> BTreeMap<String, super::sizing::ThinkingFill> {
        let key = ThinkingKey {
            main_version: main_version.to_owned(),
            table: measurer.table().clone(),
            kind: measurer.counter().kind(),
            calibration: measurer.counter().calibration().clone(),
            shared: measurer.counter().shared().cloned(),
        };
        let known = {
            let memo = self.thinking.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            memo.iter().find(|(read_from, known, _)| known.same_settings(&key) && read_from.is(session)).map(|(_, _, estimated)| estimated.clone())
        };
        let (thinking, its_notes) = match known {
            Some(known) => {
                if cfg!(debug_assertions) {
                    let mut again = BTreeSet::new();
                    let fresh = estimate(&mut again);
                    assert!(again == known.1 && super::sizing::same_thinking(&fresh, &known.0), "a memoized thinking estimate differs from an estimate");
                }
                known
            }
            None => {
                let mut its_notes = BTreeSet::new();
                let thinking = estimate(&mut its_notes);
                let mut memo = self.thinking.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                // An estimate of the session as it was no longer serves.
                memo.retain(|(read_from, _, _)| read_from.is(session));
                if !memo.iter().any(|(_, known, _)| known.same_settings(&key)) {
                    memo.push((ReadFrom::of(session), key, (thinking.clone(), its_notes.clone())));
                }
                (thinking, its_notes)
            }
        };
        notes.extend(its_notes);
        thinking
    }

    /// Keeps the main lane's turn scans a view of `session` made (a scan is a function of the
    /// events it reads and the session's directory).
    fn keep_turn_scans(&self, session: &ImportedSession, scans: BTreeMap<(usize, usize), TurnScan>) {
        let mut kept = self.turn_scans.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *kept = Some((ReadFrom::of(session), std::sync::Arc::new(scans)));
    }

    /// The main lane's turn scans the last view of `session` as it is made, if any.
    pub(super) fn turn_scans(&self, session: &ImportedSession) -> Option<TurnScans> {
        let kept = self.turn_scans.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.as_ref().filter(|(read_from, _)| read_from.is(session)).map(|(_, scans)| scans.clone())
    }

    fn get(&self, key: &ViewKey, session: &ImportedSession) -> Option<RecordView> {
        let views = self.views.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        views.iter().find(|(read_from, known, _)| known.same_settings(key) && read_from.is(session)).map(|(_, _, view)| view.clone())
    }

    fn insert(&self, key: ViewKey, view: &RecordView, session: &ImportedSession) {
        let mut views = self.views.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // A view of the session as it was no longer serves.
        views.retain(|(read_from, _, _)| read_from.is(session));
        if !views.iter().any(|(_, known, _)| known.same_settings(&key)) {
            views.push((ReadFrom::of(session), key, view.clone()));
        }
    }
}

/// What of the session a view was read from: its fields are public, so a caller may change
/// them after a read (a test sets every call's version). The events are held (each by
/// reference count: a change of one held here copies it first, so the same pointers are the
/// same events), the calls and the header compared, the wire requests held.
#[derive(Debug, Clone)]
struct ReadFrom {
    header: crate::recording::Header,
    events: crate::recording::format::Events,
    calls: Vec<RecordedCall>,
    api_requests: std::sync::Arc<crate::recording::api_requests::ApiRequests>,
}

impl ReadFrom {
    fn of(session: &ImportedSession) -> ReadFrom {
        ReadFrom {
            header: session.recording.header.clone(),
            events: session.recording.events.clone(),
            calls: session.calls.clone(),
            api_requests: session.api_requests.clone(),
        }
    }

    fn is(&self, session: &ImportedSession) -> bool {
        let events = &session.recording.events;
        std::sync::Arc::ptr_eq(&self.api_requests, &session.api_requests)
            && self.events.len() == events.len()
            && (0..events.len()).all(|i| std::sync::Arc::ptr_eq(self.events.shared(i), events.shared(i)))
            && self.header == session.recording.header
            && self.calls == session.calls
    }
}

/// What a [`record_view`] depends on beside the session as it was read ([`ReadFrom`], made only
/// for a view kept): the options that change the reading
/// (the judgements of information loss, which it does not make, left out), and of the measurer
/// what its token counts and flat requests rest on (the model table, the estimator and its
/// calibration and shared counts, earlier thinking dropped, the billing block's key). Its caches
/// and what it measured before change no count.
#[derive(Debug, Clone)]
struct ViewKey {
    options: ReplayOptions,
    table: crate::measure::ModelTable,
    kind: EstimatorKind,
    calibration: crate::measure::Calibration,
    shared: Option<std::sync::Arc<SharedCounts>>,
    prior_thinking_dropped: bool,
    billing: crate::measure::blocks::BillingKey,
}

impl ViewKey {
    fn of(measurer: &Measurer, options: &ReplayOptions) -> ViewKey {
        ViewKey {
            options: ReplayOptions { info_loss: false, compaction_losses: false, ..options.clone() },
            table: measurer.table().clone(),
            kind: measurer.counter().kind(),
            calibration: measurer.counter().calibration().clone(),
            shared: measurer.counter().shared().cloned(),
            prior_thinking_dropped: measurer.prior_thinking_dropped(),
            billing: measurer.flattener().billing_key(),
        }
    }
}

impl ViewKey {
    fn same_settings(&self, other: &ViewKey) -> bool {
        let same_shared = match (&self.shared, &other.shared) {
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        same_shared
            && self.options == other.options
            && self.kind == other.kind
            && self.prior_thinking_dropped == other.prior_thinking_dropped
            && self.billing == other.billing
            && self.calibration == other.calibration
            && self.table == other.table
    }
}

/// [`record_view`] with every compared call's messages measured ([`CallView::message_tokens`]):
/// what a calibration fit reads.
pub fn record_view_measured(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions) -> RecordView {
    read_record(session, measurer, options, true, &mut |_, _| {})
}

/// [`record_view_measured`], handing `observe` the messages each compared call saw as the
/// client changed them (its index, then the messages; the recorded ones, where measured on its
/// recorded request): what `examples/ratio_probe.rs` takes its content features from.
pub fn record_view_observed(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions, observe: &mut dyn FnMut(usize, &[Message])) -> RecordView {
    read_record(session, measurer, options, true, observe)
}

fn read_record(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions, measure_messages: bool, observe: &mut dyn FnMut(usize, &[Message])) -> RecordView {
    let kind = measurer.counter().kind();
    let shared = measurer.counter().shared().cloned();
    let calibration = measurer.counter().calibration().clone();
    let mut notes: BTreeSet<String> = BTreeSet::new();
    let main_version = super::sizing::main_version(session);
    let user_context_prior = super::sizing::user_context_prior(&calibration, &main_version, &mut notes);
    let thinking_estimate = super::sizing::unstored_thinking(session, measurer, &main_version, &mut notes);
    let file_tokens: RefCell<BTreeMap<(u128, String), u64>> = Default::default();
    let cx = ScanContext {
        session,
        restore_files: options.restore_files,
        kind,
        shared: shared.as_deref(),
        file_tokens: &file_tokens,
        recorded_microcompact: options.recorded_microcompact,
    };
    let mut sizing = Sizing { user_context_prior, fitted_prefixes: &calibration.prefix_tokens, groups: BTreeMap::new(), unrecorded_main: None };
    let mut lanes: BTreeMap<String, LaneState> = BTreeMap::new();
    // Each lane's messages as last built (kept apart from its state, which the scan changes).
    let mut built_views: BTreeMap<String, super::sizing::BuiltView> = BTreeMap::new();
    let mut views = crate::recording::ViewCache::default();
    let keys = super::sizing::MessageKeys::new(measurer.new_key_space());
    // (As the replay: options that change what the client sent leave the recorded requests.)
    let use_records = !session.api_requests.requests.is_empty() && options.recorded_requests && !options.changes_view();
    let mut rebuilder = crate::recording::api_requests::Rebuilder::new(&session.api_requests);
    let mut calls = Vec::with_capacity(session.calls.len());
    // The main lane's turn scans by the events they read, kept for the recorded client's rules.
    let mut turn_scans: BTreeMap<(usize, usize), TurnScan> = BTreeMap::new();
    // Each version's profile made once (a function of the version and the session's entrypoint).
    let mut profiles: BTreeMap<&str, ClientProfile> = BTreeMap::new();
    for call in &session.calls {
        let version = call.version.as_deref().unwrap_or("");
        let entrypoint = session.recording.header.entrypoint.as_deref();
        let profile = profiles.entry(version).or_insert_with(|| ClientProfile::for_client(version, entrypoint)).clone();
        debug_assert_eq!(profile, ClientProfile::for_client(version, entrypoint), "a version's kept profile");
        let group = super::sizing::group_of(&call.lane).to_owned();
        // A compaction request forks the main thread: its transcript holds only what it added.
        let main_fork = (call.lane == LANE_COMPACT).then(|| lanes.get(LANE_MAIN).map(|m| (m.cleared.clone(), m.restored.clone(), m.loaded_until)).unwrap_or_default());
        let turn_profile = if options.rerender_prompts {
            profile.clone()
        } else {
            ClientProfile { rerender_opening_prompt: false, rerender_typed_prompts: false, queued_across_compaction_rerenders_start: false, ..profile.clone() }
        };
        // The compaction request forks the main thread as it is rendered during the turn.
        let fork_transient = main_fork.is_some() && lanes.get(LANE_MAIN).is_some_and(|m| m.turns.transient_prompt);
        let main_segment = (call.lane == LANE_COMPACT).then(|| lanes.get(LANE_MAIN).map(|m| (m.segment_context, m.hidden_saved, m.compacted)).unwrap_or_default());
        let state = lanes.entry(call.lane.clone()).or_default();
        if let Some((segment_context, hidden_saved, compacted)) = main_segment {
            (state.segment_context, state.hidden_saved, state.compacted) = (segment_context, hidden_saved, compacted);
        }
        let mut call_events: Vec<String> = std::mem::take(&mut state.carried_events);
        let family = measurer.model(&call.model).map(|m| m.estimator_key()).unwrap_or_default();
        let params = measurer.counter().calibration().for_family(&family);
        let scanned_from = state.scanned_to;
        let scan = scan_lane(&cx, measurer, state, call, &profile, &turn_profile, &family, params, &mut call_events);
        if call.lane == LANE_MAIN {
            turn_scans.insert((scanned_from, call.event_index), scan.turn_scan.clone());
        }
        let view = |skipped: Option<String>, events: Vec<String>, sizes: GroupSizes| CallView {
            index: call.index,
            lane: call.lane.clone(),
            skipped,
            events,
            prefix_tokens: sizes.prefix_tokens,
            user_context_tokens: sizes.context_tokens,
            message_tokens: 0,
            message_blocks: 0,
            thinking_filled: !call.thinking_text_stored,
            attachment_chars: 0,
            unsized_attachment_chars: 0,
        };
        let no_sizes = GroupSizes { prefix_tokens: 0, context_tokens: 0 };
        if let Some(reason) = skip_reason(call) {
            state.carried_events = call_events.clone();
            calls.push(view(Some(reason.to_owned()), call_events, no_sizes));
            continue;
        }
        let (ttl, start_ms, previous_time) = call_timing(state, call, scan.request_start, &mut call_events);
        // The messages the call saw, as the client changed them (the lane's view, or the main
        // thread's forked for a compaction request).
        let fork_messages;
        let messages: &[Message] = match &main_fork {
            None => {
                let built = built_views.entry(call.lane.clone()).or_default();
                let (raw, serials) = session.messages_for_call_view(call, state.loaded_until, &mut views);
                built.update(raw, serials, &keys, (&state.cleared, state.cleared_version), &thinking_estimate, state.restored_version);
                built.with_restored(&state.restored, state.restored_version);
                &built.messages
            }
            Some((cleared, restored, loaded_until)) => {
                let mut messages = session.fork_messages(call, *loaded_until);
                for message in &mut messages {
                    super::sizing::client_view(message, cleared, &thinking_estimate);
                }
                super::sizing::order_tool_results(&mut messages);
                if !restored.is_empty()
                    && let Some(first) = messages.first_mut()
                    && first.role == Role::User
                {
                    first.content.blocks_mut().extend(restored.iter().cloned());
                }
                fork_messages = messages;
                &fork_messages
            }
        };
        let truncated = session.recording.header.head_truncated && group == LANE_MAIN;
        let seen = turn_events(state, call, main_fork.is_some(), messages, &scan.turn_scan, truncated, options, &turn_profile, &mut call_events, &mut |_, _, _| {});
        let strips_thinking = measurer.model(&call.model).is_ok_and(|m| m.strips_prior_thinking);
        let (rebuilt, _) = recorded_request(use_records, &mut rebuilder, call);
        if let Err(e) = sizing.size_group(measurer, call, messages, &group, truncated, &mut notes) {
            calls.push(view(Some(e), call_events, no_sizes));
            continue;
        }
        let anchored = sizing.anchor_segment(measurer, state, call, messages, &group, truncated, options, strips_thinking, &mut call_events);
        let mut sizes = sizing.sizes_now(state, &group, truncated);
        if let Some(context) = anchored {
            sizes.context_tokens = context;
        }
        let revealed = sizing.revealed_level(state, call, sizes, &group, rebuilt.is_some(), &call_events);
        if let Some(start) = seen.turn_start
            && rebuilt.is_none()
            && let Some(last) = messages.len().checked_sub(1)
            && super::turns::side_cut(&start, last, super::turns::current_prompt_index(&messages[..last])).is_some()
        {
            let at = scan.turn_scan.side_entry_time(&profile, &state.turns, previous_time, start_ms);
            side_entry_seen(&mut call_events, at, start_ms, previous_time, ttl);
        }
        // Claude Desktop's static prefix is read past the TTL (see `ClientProfile`).
        if profile.static_prefix_shared && call.lane == LANE_MAIN && rebuilt.is_none() && call_events.iter().any(|e| e == "ttl_expired") {
            call_events.push(super::uncertainty::SHARED_PREFIX.into());
        }
        // A call measured on its recorded request has no unrecorded part: its prefix is its
        // tools and system.
        let mut measured = (0, 0);
        observe(call.index, rebuilt.as_ref().map_or(messages, |r| &r.messages));
        if let Some(recorded) = &rebuilt {
            let mut flat = match measurer.flatten(recorded) {
                Ok(flat) => flat,
                Err(e) => {
                    calls.push(view(Some(e.to_string()), call_events, no_sizes));
                    continue;
                }
            };
            use crate::measure::blocks::Region;
            let synthetic = flat.region_tokens(Region::Tools) + flat.region_tokens(Region::System);
            sizes = GroupSizes { prefix_tokens: synthetic, context_tokens: 0 };
            if measure_messages {
                shape_flat(recorded, &mut flat, strips_thinking, false);
                measured = (flat.total_tokens - synthetic, flat.counts.messages as u64);
            }
        } else if measure_messages {
            // The messages alone, as the request renders them (earlier thinking dropped, the
            // current prompt the transient way).
            let transient = fork_transient || (call.lane == LANE_MAIN && state.turns.transient_prompt);
            let mut bare = Request::new(call.model.clone(), 32_000);
            bare.messages = messages.to_vec();
            match measurer.flatten(&bare) {
                Ok(mut flat) => {
                    shape_flat(&bare, &mut flat, strips_thinking, transient);
                    measured = (flat.total_tokens, flat.counts.messages as u64);
                }
                Err(e) => {
                    calls.push(view(Some(e.to_string()), call_events, no_sizes));
                    continue;
                }
            }
        }
        if let Some(level) = revealed {
            sizing.take_level(&group, level, &mut call_events);
        }
        state.prev_recorded_cached = Some(call.usage.cache_read_input_tokens + call.usage.cache_creation_input_tokens);
        // (The replay takes its own simulated read too where it is higher.)
        state.turns.previous_read = Some(call.usage.cache_read_input_tokens);
        // A reply whose thinking the replay fills brings an estimate of its own to the next step.
        let thinking_filled = !call.thinking_text_stored
            || matches!(&session.recording.events[call.event_index].kind, EventKind::ModelReply(reply) if super::sizing::resends_its_output(reply, &main_version));
        calls.push(CallView {
            message_tokens: measured.0,
            message_blocks: measured.1,
            thinking_filled,
            attachment_chars: scan.attachment_chars,
            unsized_attachment_chars: scan.unsized_attachment_chars,
            ..view(None, call_events, sizes)
        });
    }
    session.record_view_memo().keep_turn_scans(session, turn_scans);
    RecordView { calls, unrecorded_main: sizing.unrecorded_main }
}
