//! Importer of Claude Code session transcripts (`~/.claude/projects/<cwd>/<session>.jsonl`).
//!
//! The transcript format is internal to Claude Code and undocumented; what this importer relies
//! on was read off real files (see `docs/recording-format.md`, section "Import from Claude
//! Code"). The rules that matter for measurement:
//!
//! - **One API call is written as several `assistant` lines** (one per content block) sharing
//!   `message.id` and `requestId`, sometimes interleaved with the tool results of blocks already
//!   streamed. They are merged into one `model_reply` placed at the first line's position:
//!   content blocks concatenated in order, usage from the last line, except `output_tokens`,
//!   which is a placeholder on all but (possibly) the last line, so the maximum is kept.
//! - The usage totals of a session are the sums over merged calls. They equal, to the token,
//!   the `token_usage` Entire writes beside its transcripts (checked by the test suite), and
//!   Entire's `api_call_count` counts `<synthetic>` replies (usage all zero) as calls too.
//! - `compact_boundary` starts a new model view; the `isCompactSummary` user message after it is
//!   the summary the model sees first.
//! - Subagent transcripts (`<session>/subagents/agent-<id>.jsonl`) become lanes
//!   `subagent:<id>`; the compaction fork (`agent-acompact-*`) becomes lane `compact`.
//! - Virtual time is milliseconds since the first timestamped record of the main file.
//!
//! Nothing in a transcript is fatal: unknown record types are counted, bad lines are reported
//! with their line number and skipped, and a truncated last line is reported and the rest used.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::format::{
    parse_line, Attachment, Compaction, Event, EventKind, Header, LineWarning, ModelReply, SliceLines, Recording,
    SubagentInfo, SystemEvent, ToolResult, UserPrompt, WarningKind, Warnings, LANE_COMPACT, LANE_MAIN, utf8,
};
use super::api_requests::{self, ApiRequests};
use super::picked::{self, Content, UsageRead};
use super::report::{ImportError, ImportReport, UsageTotals};
use crate::api::identical::Identical;
use crate::api::{ContentBlock, Message, MessageContent, Role, SharedBlocks, StopReason, ToolResultContent, Usage};

/// Record types that carry session metadata (last value wins); they go to the header.
const METADATA_TYPES: &[&str] = &[
    "summary",
    "custom-title",
    "ai-title",
    "last-prompt",
    "pr-link",
    "mode",
    "permission-mode",
    "agent-name",
    "agent-color",
    "agent-setting",
    "tag",
    "worktree-state",
    // Links the session to a remote bridge (claude.ai / desktop); account ids, no model context.
    "bridge-session",
];

/// Envelope fields every conversation record carries; they are left out of event payloads
/// because the event already states lane, time and uuid, and the rest is per-session noise.
const ENVELOPE_FIELDS: &[&str] = &[
    "parentUuid",
    "isSidechain",
    "userType",
    "cwd",
    "sessionId",
    "session_id",
    "version",
    "gitBranch",
    "slug",
    "type",
    "uuid",
    "timestamp",
    "entrypoint",
    "agentId",
];

/// One merged API call of an imported session, the unit the fidelity report compares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedCall {
    /// Position among all calls of the recording, in event order.
    pub index: usize,
    /// Index of the `model_reply` event in [`Recording::events`].
    pub event_index: usize,
    pub lane: String,
    pub time_ms: u64,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// The `api-request` record of the call (2.1.2xx/3xx `requestRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_ref: Option<String>,
    pub usage: Usage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
    pub content_blocks: usize,
    pub tool_uses: usize,
    pub thinking_text_stored: bool,
    /// No API call was made (`<synthetic>` reply written by the client).
    pub is_synthetic: bool,
    pub is_api_error: bool,
}

/// The calls of a recording, in event order.
pub fn recorded_calls(recording: &Recording) -> Vec<RecordedCall> {
    let mut calls = Vec::new();
    for (event_index, event) in recording.events.iter().enumerate() {
        if let EventKind::ModelReply(reply) = &event.kind {
            calls.push(RecordedCall {
                index: calls.len(),
                event_index,
                lane: event.lane.clone(),
                time_ms: event.time_ms,
                model: reply.model.clone(),
                version: reply.version.clone(),
                request_id: reply.request_id.clone(),
                message_id: reply.message_id.clone(),
                request_ref: reply.request_ref.clone(),
                usage: reply.usage.clone(),
                stop_reason: reply.stop_reason,
                content_blocks: reply.content.len(),
                tool_uses: reply.content.iter().filter(|b| matches!(b, ContentBlock::ToolUse { .. })).count(),
                thinking_text_stored: reply.thinking_text_stored,
                is_synthetic: reply.is_synthetic,
                is_api_error: reply.is_api_error,
            });
        }
    }
    calls
}

/// A Claude Code session turned into a recording, with its calls and what the import saw.
#[derive(Debug, Clone)]
pub struct ImportedSession {
    pub recording: Recording,
    pub calls: Vec<RecordedCall>,
    pub report: ImportReport,
    /// The wire requests the transcript recorded (2.1.2xx/3xx `api-request*` records), over
    /// every file of the session; empty for older transcripts.
    pub api_requests: std::sync::Arc<ApiRequests>,
    /// The main file's `uuid → parentUuid` graph, mapped to event indices; used to rebuild the
    /// message list each call saw.
    chain: Chain,
    /// The references of the imported session's events, memoized for judging information loss
    /// ([`crate::replay::loss::compaction_loss`]); shared by the session's clones. Valid while
    /// the events are not changed in place (nothing does).
    references: std::sync::Arc<crate::replay::loss::ReferenceMemo>,
    /// The record views read of the session ([`crate::replay::record_view::record_view`]);
    /// shared by its clones, valid while the events are not changed in place (nothing does).
    record_views: std::sync::Arc<crate::replay::record_view::RecordViewMemo>,
    /// Each call's written time, read by the importer from the lines it parsed anyway
    /// ([`WrittenCallTimes`]); `None` for a session not imported from a transcript path.
    written_call_times: Option<std::sync::Arc<WrittenCallTimes>>,
}

/// The time of each API call of a transcript as written, keyed by `(message.id, requestId)`:
/// the first line's `timestamp` over the files in `files` (main file first, then its subagent
/// files in sorted order). The importer's virtual time never goes below the first record's; the
/// audit's days are the written times.
///
/// The rule is [`written_call_time`]'s, line by line, as a separate read of the files would
/// apply it (a line that is not UTF-8 ends its file; the lines of a duplicated record count).
/// One difference, on input no client writes: a line with a duplicated key among `timestamp`,
/// `requestId`, `message` and `message.id` is read as the importer reads it (the last value),
/// where a typed parse of the line alone rejects it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WrittenCallTimes {
    /// The files read, in the order their lines were taken.
    pub files: Vec<PathBuf>,
    pub times: BTreeMap<(String, String), i64>,
}

/// The written time of one transcript line: `(message.id, requestId, timestamp in epoch ms)`
/// when the line holds `"usage"` and all three (a typed parse of the line alone; any failure is
/// `None`).
pub fn written_call_time(line: &str) -> Option<(String, String, i64)> {
    #[derive(serde::Deserialize)]
    struct Line {
        timestamp: Option<String>,
        #[serde(rename = "requestId")]
        request_id: Option<String>,
        message: Option<Msg>,
    }
    #[derive(serde::Deserialize)]
    struct Msg {
        id: Option<String>,
    }
    if !line.contains("\"usage\"") {
        return None;
    }
    let rec = serde_json::from_str::<Line>(line).ok()?;
    let (ts, req, id) = (rec.timestamp?, rec.request_id?, rec.message.and_then(|m| m.id)?);
    let t = ts.parse::<jiff::Timestamp>().ok()?;
    Some((id, req, t.as_millisecond()))
}

#[derive(Debug, Clone, Default)]
struct ChainNode {
    parent: Option<String>,
    events: Vec<usize>,
}

/// The `parentUuid` graph with parents resolved to node numbers once, so that walking it
/// (every call of a replay does) follows numbers instead of looking up uuids.
#[derive(Debug, Clone, Default)]
struct Chain {
    /// Node number of each uuid of the file.
    index: BTreeMap<String, usize>,
    /// Per node: its parent's number (`None` when it has none or the parent is not in the
    /// file), and its event indices.
    nodes: Vec<(Option<usize>, Vec<usize>)>,
}

impl Chain {
    fn new(chain: BTreeMap<String, ChainNode>) -> Chain {
        let index: BTreeMap<String, usize> = chain.keys().enumerate().map(|(i, uuid)| (uuid.clone(), i)).collect();
        let nodes = chain.into_values().map(|node| (node.parent.and_then(|p| index.get(&p).copied()), node.events)).collect();
        Chain { index, nodes }
    }

    fn node(&self, uuid: Option<&String>) -> Option<usize> {
        uuid.and_then(|u| self.index.get(u)).copied()
    }
}

/// The last view of each lane and its messages ([`ImportedSession::messages_for_call_cached`]),
/// each message with a *serial*: a number given when the message is built and renewed whenever
/// it changes (merged into, or rebuilt with different content), so that two messages with the
/// same serial from one cache are identical ([`ImportedSession::messages_for_call_view`]).
#[derive(Debug, Clone, Default)]
pub struct ViewCache {
    lanes: BTreeMap<String, LaneView>,
    /// The next serial to give.
    next_serial: u64,
    /// Calls whose messages were appended to the previous call's rather than rebuilt.
    pub appended: u64,
    /// The last `parentUuid` walk of the main lane, extended by the next one.
    chain: ChainMemo,
}

/// The last walk of the `parentUuid` chain ([`ImportedSession::chain_view`]) kept for the next
/// one: the next call's chain is usually this one plus the nodes written since, so the next walk
/// stops where it meets this walk's leaf and takes the rest from here. A walk that meets this one
/// anywhere else (a rewind, a compaction) is made in full and replaces it. A memo serves one
/// session (as the [`ViewCache`] that holds it).
#[derive(Debug, Clone, Default)]
struct ChainMemo {
    /// The node the walk started from.
    leaf: Option<usize>,
    /// The nodes it went through, and per node whether it is one of them ([`ON_PATH`]) or one
    /// of the walk being made ([`WALKED`]).
    nodes: Vec<usize>,
    marks: Vec<u8>,
    /// Their message and sent-attachment events, sorted, without repeats (not cut at any end).
    events: Vec<usize>,
    /// Tool use ids asked (model replies) and answered (tool results) by `events[..scanned]`.
    scanned: usize,
    asked: rustc_hash::FxHashSet<String>,
    answered: rustc_hash::FxHashSet<String>,
    /// The ids of `asked` not in `answered`: with none, no result is added back.
    open: rustc_hash::FxHashSet<String>,
    /// The main lane's tool result events of the session by tool use id, ascending: where a
    /// result left off the chain is looked up instead of read for among the events. Made at the
    /// second walk that adds one back (a memo made for one walk reads), kept while the memo
    /// serves its session.
    results: Option<rustc_hash::FxHashMap<String, Vec<usize>>>,
    /// Whether a walk added results back by reading the events.
    read_back: bool,
}

/// [`ChainMemo::marks`]: a node of the memo's walk; a node of the walk being made.
const ON_PATH: u8 = 1;
const WALKED: u8 = 2;

impl ChainMemo {
    /// Empties the memo, `walked` being the nodes of an unfinished walk (the session's tool
    /// results by id stay: they are the session's, not the walk's).
    fn forget(&mut self, walked: &[usize]) {
        let mut marks = std::mem::take(&mut self.marks);
        for &node in self.nodes.iter().chain(walked) {
            marks[node] = 0;
        }
        *self = ChainMemo { marks, results: self.results.take(), read_back: self.read_back, ..ChainMemo::default() };
    }

    /// Forgets the tool use ids scanned.
    fn unscan(&mut self) {
        self.scanned = 0;
        self.asked.clear();
        self.answered.clear();
        self.open.clear();
    }

    /// Adds the tool use ids asked and answered by `kind` to the sets.
    fn scan(&mut self, kind: &EventKind) {
        match kind {
            EventKind::ModelReply(reply) => {
                for id in reply.tool_use_ids() {
                    if !self.asked.contains(id) {
                        self.asked.insert(id.to_owned());
                        if !self.answered.contains(id) {
                            self.open.insert(id.to_owned());
                        }
                    }
                }
            }
            EventKind::ToolResult(result) if !self.answered.contains(result.tool_use_id.as_str()) => {
                self.answered.insert(result.tool_use_id.clone());
                self.open.remove(result.tool_use_id.as_str());
            }
            _ => {}
        }
    }
}

/// Merges `added` into `events`, both ascending without repeats, the result so too: the same as
/// appending, sorting and removing repeats, with only the part of `events` from `added`'s first
/// item on moved. Returns where the first change is (`events` before it is as it was).
fn merge_sorted(events: &mut Vec<usize>, added: &[usize]) -> usize {
    let Some(&first) = added.first() else { return events.len() };
    let cut = events.partition_point(|&e| e < first);
    let tail = events.split_off(cut);
    events.reserve(tail.len() + added.len());
    let (mut a, mut b) = (tail.iter().copied().peekable(), added.iter().copied().peekable());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(&x), Some(&y)) if x < y => a.next(),
            (Some(&x), Some(&y)) if y < x => b.next(),
            (Some(_), Some(_)) => {
                b.next();
                a.next()
            }
            (Some(_), None) => a.next(),
            (None, Some(_)) => b.next(),
            (None, None) => break,
        };
        events.extend(next);
    }
    cut
}

#[derive(Debug, Clone, Default)]
struct LaneView {
    /// The event indices `messages` were built from.
    view: Option<Vec<usize>>,
    /// The `loaded_until` they were built with.
    loaded_until: usize,
    messages: Vec<Message>,
    serials: Vec<u64>,
    /// For a resumed client's view (`loaded_until > 0`): the tool uses answered in it, and
    /// those left out because they are not.
    answered: BTreeSet<String>,
    unanswered: BTreeSet<String>,
}


impl ImportedSession {
    /// A session from a recording read back from disk: no `parentUuid` graph, so every call's
    /// view is its lane's message events since the lane's last compaction, in file order.
    pub fn from_recording(recording: Recording) -> ImportedSession {
        let calls = recorded_calls(&recording);
        let mut report = ImportReport::new(recording.header.input.as_deref().unwrap_or(""), "recording");
        report.events = recording.events.len();
        report.calls = calls.len();
        let references = std::sync::Arc::new(crate::replay::loss::ReferenceMemo::new(recording.events.len()));
        ImportedSession {
            recording,
            calls,
            report,
            api_requests: Default::default(),
            chain: Chain::default(),
            references,
            record_views: Default::default(),
            written_call_times: None,
        }
    }

    /// Each call's written time as the importer read it, and the files it read them from;
    /// `None` when the session was not imported from a transcript's path.
    pub fn written_call_times(&self) -> Option<&WrittenCallTimes> {
        self.written_call_times.as_deref()
    }

    /// The references memoized per event of the session.
    pub(crate) fn reference_memo(&self) -> &crate::replay::loss::ReferenceMemo {
        &self.references
    }

    /// The record views memoized of the session.
    pub(crate) fn record_view_memo(&self) -> &crate::replay::record_view::RecordViewMemo {
        &self.record_views
    }

    /// Event indices (ascending) that made up the model's view at `call`, best effort:
    ///
    /// For a main-lane call, the `parentUuid` chain is walked back from the call's first
    /// transcript line to the root (a compact boundary has a null parent, so the walk stops at
    /// the last compaction). This drops branches the user rewound away from. Every event on the
    /// chain that becomes message content is kept: user prompts (meta ones too: the harness
    /// sent them), tool results and earlier replies. Attachments and system events are not
    /// included because their rendered text is not in the transcript.
    ///
    /// When the call has no uuid (a recording read back from disk, or a subagent lane), the
    /// view is every message event of the call's lane since that lane's last compaction, in
    /// file order.
    pub fn view_event_indices(&self, call: &RecordedCall) -> Vec<usize> {
        self.view_event_indices_loaded(call, 0)
    }

    /// [`Self::view_event_indices`] of a client that was resumed: the events before
    /// `loaded_until` were not kept in memory but loaded back from the transcript, by the same
    /// one-chain walk, so the parallel tool results off the chain were lost to it
    /// (anthropics/claude-code#31330).
    pub fn view_event_indices_loaded(&self, call: &RecordedCall, loaded_until: usize) -> Vec<usize> {
        self.view_event_indices_memo(call, loaded_until, &mut ChainMemo::default())
    }

    /// [`Self::view_event_indices_loaded`] continuing the walk of the cache's previous main-lane
    /// call where this one extends it (the same indices).
    pub fn view_event_indices_cached(&self, call: &RecordedCall, loaded_until: usize, cache: &mut ViewCache) -> Vec<usize> {
        self.view_event_indices_memo(call, loaded_until, &mut cache.chain)
    }

    fn view_event_indices_memo(&self, call: &RecordedCall, loaded_until: usize, memo: &mut ChainMemo) -> Vec<usize> {
        let start = self.chain.node(self.recording.events.get(call.event_index).and_then(|e| e.uuid.as_ref()));
        match start {
            Some(start) if call.lane == LANE_MAIN => self.chain_view_memo(self.chain.nodes[start].0, call.event_index, loaded_until, memo),
            _ => view_in_file_order(&self.recording, call),
        }
    }

    /// The main thread's view just before event `end`: what a fork of it (the compaction
    /// request, whose transcript holds only what it added) was sent on top of.
    pub fn main_view_before(&self, end: usize, loaded_until: usize) -> Vec<usize> {
        let events = &self.recording.events;
        let leaf = events.iter().take(end).rev().find_map(|e| {
            if e.lane == LANE_MAIN && is_message_event(&e.kind) { self.chain.node(e.uuid.as_ref()) } else { None }
        });
        match leaf {
            Some(node) => self.chain_view(Some(node), end, loaded_until),
            None => Vec::new(),
        }
    }

    /// Message events on the main thread's `parentUuid` chain from `from` back to its root,
    /// before `end`, with the parallel tool results off the chain added back unless they come
    /// before `loaded_until`.
    fn chain_view(&self, from: Option<usize>, end: usize, loaded_until: usize) -> Vec<usize> {
        self.chain_view_memo(from, end, loaded_until, &mut ChainMemo::default())
    }

    /// [`Self::chain_view`] extending the walk `memo` holds when this one meets it at its leaf
    /// (the same indices as a walk of its own: a test checks every call of every real session).
    fn chain_view_memo(&self, from: Option<usize>, end: usize, loaded_until: usize, memo: &mut ChainMemo) -> Vec<usize> {
        let events = &self.recording.events;
        let kept = |i: &usize| is_message_event(&events[*i].kind) || is_sent_attachment(&events[*i].kind);
        if memo.marks.len() != self.chain.nodes.len() {
            *memo = ChainMemo { marks: vec![0; self.chain.nodes.len()], ..ChainMemo::default() };
        }
        // Walk back until the chain meets the memo's walk (or ends: its root, or a node seen
        // twice, which a well-formed transcript never has).
        let mut fresh: Vec<usize> = Vec::new();
        let mut met = None;
        let mut cursor = from;
        while let Some(node) = cursor {
            match memo.marks[node] {
                ON_PATH => {
                    met = Some(node);
                    break;
                }
                WALKED => break,
                _ => {}
            }
            memo.marks[node] = WALKED;
            fresh.push(node);
            cursor = self.chain.nodes[node].0;
        }
        if met.is_some() && met != memo.leaf {
            // Another branch of the memo's walk: walk it in full instead.
            memo.forget(&fresh);
            return self.chain_view_memo(from, end, loaded_until, memo);
        }
        if met.is_none() {
            // A walk of its own from `from`.
            memo.forget(&[]);
        }
        let mut added: Vec<usize> = fresh.iter().flat_map(|&node| self.chain.nodes[node].1.iter().copied()).filter(kept).collect();
        added.sort_unstable();
        added.dedup();
        if memo.events.last().is_some_and(|&last| added.first().is_some_and(|&first| first <= last)) {
            #[cfg(debug_assertions)]
            let sorted = {
                let mut all = [memo.events.as_slice(), added.as_slice()].concat();
                all.sort_unstable();
                all.dedup();
                all
            };
            let cut = merge_sorted(&mut memo.events, &added);
            #[cfg(debug_assertions)]
            assert_eq!(memo.events, sorted, "merged events");
            // The sets cover `events[..scanned]`: still so where the merge changed nothing there.
            if cut < memo.scanned {
                memo.unscan();
            }
        } else {
            memo.events.extend(added);
        }
        for &node in &fresh {
            memo.marks[node] = ON_PATH;
        }
        memo.nodes.extend(fresh);
        memo.leaf = from;

        let mut indices = memo.events[..memo.events.partition_point(|&i| i < end)].to_vec();
        // Parallel tool calls: since 2.1 each result record's parent is its own tool_use record,
        // and the next call hangs off the result recorded last, so the walk misses the results
        // recorded before it (a branch off the chain). The client sent every one of them (the
        // API requires a result for each tool_use), so they are added back.
        if memo.scanned > indices.len() {
            memo.unscan();
        }
        for &i in &indices[memo.scanned..] {
            memo.scan(&events[i].kind);
        }
        memo.scanned = indices.len();
        #[cfg(debug_assertions)]
        {
            let mut fresh = ChainMemo::default();
            for &i in &indices {
                fresh.scan(&events[i].kind);
            }
            assert!(fresh.asked == memo.asked && fresh.answered == memo.answered && fresh.open == memo.open, "the tool use ids scanned by the memo");
        }
        // (Every tool use asked has its result in the view: none to add back.)
        if memo.open.is_empty() {
            return indices;
        }
        let first = indices.first().copied().unwrap_or(end).max(loaded_until);
        let before = indices.len();
        // The first result of each open id in `first..end`, in the main lane: read for among the
        // events, or looked up.
        let read = |open: &rustc_hash::FxHashSet<String>| {
            let mut added_back: rustc_hash::FxHashSet<&str> = rustc_hash::FxHashSet::default();
            let mut read: Vec<usize> = Vec::new();
            for (i, event) in events.iter().enumerate().take(end).skip(first) {
                if let EventKind::ToolResult(result) = &event.kind
                    && event.lane == LANE_MAIN
                    && open.contains(result.tool_use_id.as_str())
                    && added_back.insert(result.tool_use_id.as_str())
                {
                    read.push(i);
                }
            }
            read
        };
        if !memo.read_back {
            memo.read_back = true;
            indices.extend(read(&memo.open));
        } else {
            let results = memo.results.get_or_insert_with(|| {
                let mut by_id: rustc_hash::FxHashMap<String, Vec<usize>> = rustc_hash::FxHashMap::default();
                for (i, event) in events.iter().enumerate() {
                    if let EventKind::ToolResult(result) = &event.kind
                        && event.lane == LANE_MAIN
                    {
                        by_id.entry(result.tool_use_id.clone()).or_default().push(i);
                    }
                }
                by_id
            });
            for id in &memo.open {
                if let Some(at) = results.get(id.as_str())
                    && let Some(&i) = at.get(at.partition_point(|&i| i < first))
                    && i < end
                {
                    indices.push(i);
                }
            }
            if cfg!(debug_assertions) {
                let mut looked_up = indices[before..].to_vec();
                looked_up.sort_unstable();
                assert_eq!(looked_up, read(&memo.open), "the results added back");
            }
        }
        if indices.len() > before {
            #[cfg(debug_assertions)]
            let sorted = {
                let mut all = indices.clone();
                all.sort_unstable();
                all.dedup();
                all
            };
            // The view's part (of `memo.events`) is ascending without repeats: only what was
            // added back is sorted, then merged in.
            let mut added = indices.split_off(before);
            added.sort_unstable();
            added.dedup();
            merge_sorted(&mut indices, &added);
            #[cfg(debug_assertions)]
            assert_eq!(indices, sorted, "the results added back merged");
        }
        indices
    }

    /// The message list the model saw for `call`, rebuilt from [`Self::view_event_indices`]:
    /// consecutive events of one role are merged into one message, as Claude Code does before
    /// sending. The system prompt, tools and attachments are not part of a transcript and are
    /// not reconstructed.
    pub fn messages_for_call(&self, call: &RecordedCall) -> Vec<Message> {
        build_messages(&self.recording, &self.view_event_indices(call))
    }

    /// The message list of a resumed client (see [`Self::view_event_indices_loaded`]): the tool
    /// uses whose results it lost are left out too, as the client's loader drops unresolved
    /// tool uses.
    pub fn messages_for_call_loaded(&self, call: &RecordedCall, loaded_until: usize) -> Vec<Message> {
        self.messages_loaded(&self.view_event_indices_loaded(call, loaded_until), loaded_until)
    }

    /// [`Self::messages_for_call_loaded`], reusing the messages built for the previous call of
    /// the same lane when this call's view extends that call's view (the usual case: a call sees
    /// what the one before it saw, plus its reply and the results that followed). A resumed
    /// client's messages (`loaded_until > 0`) drop unanswered tool uses anywhere, so they are
    /// rebuilt.
    pub fn messages_for_call_cached(&self, call: &RecordedCall, loaded_until: usize, cache: &mut ViewCache) -> Vec<Message> {
        self.messages_for_call_view(call, loaded_until, cache).0.to_vec()
    }

    /// [`Self::messages_for_call_cached`] without the copy: the lane's messages as the cache
    /// holds them, with their serials (equal serials from one cache = identical messages).
    /// Appending renews the serial of the message merged into (conservatively, the last one
    /// whenever anything is appended) and gives new messages new serials; a rebuild keeps the
    /// serial of a message only where it is identical to the one at its index before.
    pub fn messages_for_call_view<'c>(&self, call: &RecordedCall, loaded_until: usize, cache: &'c mut ViewCache) -> (&'c [Message], &'c [u64]) {
        let next = &mut cache.next_serial;
        let mut fresh = || {
            *next += 1;
            *next
        };
        let view = self.view_event_indices_memo(call, loaded_until, &mut cache.chain);
        let lane = cache.lanes.entry(call.lane.clone()).or_default();
        if let Some(last_view) = &lane.view
            && lane.loaded_until == loaded_until
            && view.starts_with(last_view)
        {
            let tail = &view[last_view.len()..];
            // A resumed client's messages leave out unanswered tool uses: they extend only while
            // no new result answers one left out.
            let answers_left_out = loaded_until > 0
                && tail.iter().any(|&i| {
                    let mut hit = false;
                    visit_tool_ids(&self.recording.events[i].kind, |id| hit |= lane.unanswered.contains(id), |_| {});
                    hit
                });
            if !answers_left_out {
                cache.appended += 1;
                if !tail.is_empty() {
                    let renew = lane.messages.len().saturating_sub(1);
                    if loaded_until == 0 {
                        append_messages(&self.recording, tail, &mut lane.messages);
                    } else {
                        append_loaded(&self.recording, tail, lane);
                    }
                    lane.serials.truncate(renew);
                    lane.serials.resize_with(lane.messages.len(), &mut fresh);
                    lane.view = Some(view);
                }
                return (&lane.messages, &lane.serials);
            }
        }
        let messages = self.messages_loaded(&view, loaded_until);
        let (mut answered, mut uses) = (BTreeSet::new(), BTreeSet::new());
        if loaded_until > 0 {
            for &i in &view {
                visit_tool_ids(&self.recording.events[i].kind, |id| { answered.insert(id.to_owned()); }, |id| { uses.insert(id.to_owned()); });
            }
        }
        let unanswered = uses.into_iter().filter(|id| !answered.contains(id)).collect();
        // Rebuilt: a serial is kept where the message at the same index is identical.
        let serials = messages
            .iter()
            .enumerate()
            .map(|(i, message)| match (lane.messages.get(i), lane.serials.get(i)) {
                (Some(old), Some(&serial)) if old.identical(message) => serial,
                _ => fresh(),
            })
            .collect();
        *lane = LaneView { view: Some(view), loaded_until, messages, serials, answered, unanswered };
        (&lane.messages, &lane.serials)
    }

    /// The messages of a fork of the main thread (`call` in lane `compact`): the main thread's
    /// view at that point, then what the fork's own transcript adds.
    pub fn fork_messages(&self, call: &RecordedCall, loaded_until: usize) -> Vec<Message> {
        let mut indices = self.main_view_before(call.event_index, loaded_until);
        indices.extend(view_in_file_order(&self.recording, call));
        self.messages_loaded(&indices, loaded_until)
    }

    fn messages_loaded(&self, indices: &[usize], loaded_until: usize) -> Vec<Message> {
        let mut messages = build_messages(&self.recording, indices);
        if loaded_until == 0 {
            return messages;
        }
        // (`build_messages` writes every content as blocks.)
        let answered: BTreeSet<String> = messages
            .iter()
            .flat_map(|m| if let MessageContent::Blocks(blocks) = &m.content { blocks.as_slice() } else { &[] })
            .filter_map(|b| match b {
                ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id.clone()),
                _ => None,
            })
            .collect();
        for message in &mut messages {
            if message.role != Role::Assistant {
                continue;
            }
            if let MessageContent::Blocks(blocks) = &mut message.content {
                blocks.retain(|b| !matches!(b, ContentBlock::ToolUse { id, .. } if !answered.contains(id)));
            }
        }
        messages.retain(|m| m.content.block_count() > 0);
        // A reply left out entirely joins the user messages around it, as the client merges them.
        let mut merged: Vec<Message> = Vec::with_capacity(messages.len());
        for message in messages {
            match merged.last_mut() {
                Some(last) if last.role == message.role => merge_into(last, message.content.into_blocks()),
                _ => merged.push(message),
            }
        }
        merged
    }
}

/// The sentence a compaction summary message opens with (our wording).
pub const SUMMARY_OPENING: &str =
    "This session continues an earlier conversation that no longer fits in the context. What follows summarizes that earlier part.";

fn is_message_event(kind: &EventKind) -> bool {
    matches!(kind, EventKind::UserPrompt(_) | EventKind::ToolResult(_) | EventKind::ModelReply(_))
}

/// Subtype of the system event an importer writes just before a compaction that followed a
/// reply the transcript never holds (only its tool hooks' progress records name it): payload
/// `parent_uuid` and `tool_uses` (`[{id, name}]`). The client made that call and counted it and
/// its results before compacting.
pub const UNWRITTEN_REPLY: &str = "unwritten_reply";

/// Attachment records the client does not send to the model: a hook's raw output (what it adds
/// to the context is a `hook_additional_context` record), a hook's message to the user, the
/// permission rules of a command.
pub const ATTACHMENTS_NOT_SENT: [&str; 3] = ["hook_success", "hook_system_message", "command_permissions"];

/// The opening of the text block an attachment record is rendered as ([`attachment_text`]).
pub const ATTACHMENT_REMINDER: &str = "<system-reminder attachment=";

/// An attachment record on the main thread's chain that the client sends (2.1.2xx: skill,
/// agent and deferred-tool listings, hook context, token and task reminders, changed and
/// restored files),
/// as a reminder in the user message it hangs off.
fn is_sent_attachment(kind: &EventKind) -> bool {
    matches!(kind, EventKind::Attachment(a) if !ATTACHMENTS_NOT_SENT.contains(&a.attachment_type.as_str()))
}

/// The text an attachment is sized as: every string in its record (lines of listings, hook
/// context, file contents) but its type, ids, paths and times, and but the names a listing
/// also renders as lines, in a reminder naming its type.
/// The client's own wording around them is not in the transcript.
pub fn attachment_text(attachment: &Attachment) -> String {
    fn strings(value: &Value, key: &str, out: &mut String) {
        match value {
            Value::String(s)
                if !matches!(
                    key,
                    "type" | "toolUseID" | "uuid" | "source_uuid" | "hookName" | "hookEvent" | "filename" | "filePath" | "displayPath" | "timestamp" | "commandMode" | "kind"
                ) =>
            {
                out.push_str(s);
                out.push('\n');
            }
            Value::Array(items) => items.iter().for_each(|v| strings(v, key, out)),
            Value::Object(map) => map.iter().for_each(|(k, v)| strings(v, k, out)),
            _ => {}
        }
    }
    let mut text = format!("{ATTACHMENT_REMINDER}\"{}\">\n", attachment.attachment_type);
    // 2.1.2xx/3xx record the exact text sent (`rendered`): that alone, not the record's fields.
    if let Some(rendered) = attachment.payload.get("rendered").and_then(Value::as_str) {
        text.push_str(rendered);
        text.push('\n');
    } else {
        // The client's sentences around what the record keeps (none of them is in the record).
        if let Some(map) = attachment.payload.as_object() {
            for part in client_wording(&attachment.attachment_type, map) {
                text.push_str(&part);
                if !part.ends_with('\n') {
                    text.push('\n');
                }
            }
        }
        match attachment.payload.as_object() {
            // A task reminder lists each task as `#{id}. [{status}] {subject}`: the record keeps
            // every field of the task (its description, its links), the client sends those three.
            // A nested memory file is sent as its path and content: the record also keeps the
            // file as written on disk (`rawContent`, the same text with its front matter), the
            // globs that matched it and its kind, none of which the client sends (the 2.1.332
            // captures' rendered text: `tests/data/api-requests`).
            Some(map) if attachment.attachment_type == "nested_memory" && map.get("content").is_some_and(Value::is_object) => {
                let memory = &map["content"];
                let path = memory.get("path").or_else(|| map.get("path")).and_then(Value::as_str).unwrap_or_default();
                let content = memory.get("content").and_then(Value::as_str).unwrap_or_default();
                text.push_str(&format!("Contents of {path}:\n\n{content}\n"));
            }
            Some(map) if attachment.attachment_type == "task_reminder" && map.get("content").is_none_or(Value::is_array) => {
                for task in map.get("content").and_then(Value::as_array).into_iter().flatten() {
                    let field = |k: &str| match task.get(k) {
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Number(n)) => n.to_string(),
                        _ => String::new(),
                    };
                    text.push_str(&format!("#{}. [{}] {}\n", field("id"), field("status"), field("subject")));
                }
            }
            // A listing record keeps its entries twice: the lines the client renders (`addedLines`,
            // `content`) and the names it diffs the next listing against (`addedNames`,
            // `addedTypes`, `names`). Only the rendered lines are sent.
            Some(map) => {
                let rendered = |k: &str| map.get(k).is_some_and(|v| !v.is_null());
                for (k, v) in map {
                    let state = match k.as_str() {
                        "addedNames" | "addedTypes" => rendered("addedLines"),
                        "names" => rendered("content"),
                        _ => false,
                    };
                    if !state {
                        strings(v, k, &mut text);
                    }
                }
            }
            None => strings(&attachment.payload, "", &mut text),
        }
    }
    text.push_str("</system-reminder>");
    text
}

/// Whether the replay renders `attachment` at the size the client sends it: the record holds
/// the exact text (`rendered`), or the record holds the data and the client's own sentences
/// around it are sized from the client ([`client_wording`]: the listings, auto mode, the task
/// reminder). Hook context, changed and restored files, nested memory and the rest carry the
/// client's wrapping unsized.
pub fn attachment_client_sized(attachment: &Attachment) -> bool {
    attachment.payload.get("rendered").is_some_and(Value::is_string) || CLIENT_WORDED.contains(&attachment.attachment_type.as_str())
}

/// The attachment kinds whose client sentences [`client_wording`] sizes; every other kind gets
/// none from it (`client_wording_covers_exactly_the_client_worded_kinds`).
const CLIENT_WORDED: [&str; 6] = ["deferred_tools_delta", "agent_listing_delta", "mcp_instructions_delta", "skill_listing", "auto_mode", "task_reminder"];

/// The client's own sentences around an attachment whose record keeps only its data, each our
/// text at the length of the client's ([`crate::agent::wording`], the 2.1.2xx table: the shipped
/// transcripts that record attachments are all 2.1.205–2.1.232, and both clients read give the
/// same sizes). A listing's header when it adds entries, its header and the client's note after
/// it when it removes some; the agent listing's note on running agents concurrently when the
/// record says it was shown; auto mode's instructions, the parts the record's flags choose; the
/// task tools' reminder, and its header before the tasks when it lists some.
fn client_wording(kind: &str, map: &Map<String, Value>) -> Vec<String> {
    use crate::agent::wording::{Part, CLIENT_2_1_2XX as W};
    if !CLIENT_WORDED.contains(&kind) {
        return Vec::new();
    }
    let listed = |k: &str| map.get(k).is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()) || v.as_str().is_some_and(|s| !s.is_empty()));
    let flag = |k: &str| map.get(k).and_then(Value::as_bool).unwrap_or(false);
    let mut parts = Vec::new();
    match kind {
        "deferred_tools_delta" => {
            if listed("addedLines") || listed("addedNames") {
                parts.push(W.text(Part::DeferredAdded));
            }
            if listed("removedNames") {
                parts.push(W.text(Part::DeferredRemoved));
                parts.push(W.text(Part::AfterRemoval));
            }
        }
        "agent_listing_delta" => {
            if listed("addedLines") || listed("addedTypes") {
                parts.push(W.text(if flag("isInitial") { Part::AgentsInitial } else { Part::AgentsNew }));
            }
            if listed("removedTypes") {
                parts.push(W.text(Part::AgentsRemoved));
                parts.push(W.text(Part::AfterRemoval));
            }
            if flag("isInitial") && flag("showConcurrencyNote") {
                parts.push(W.text(Part::AgentsConcurrency));
            }
        }
        "mcp_instructions_delta" => {
            if listed("addedBlocks") || listed("addedNames") {
                parts.push(W.text(Part::McpAdded));
            }
            if listed("removedNames") {
                parts.push(W.text(Part::McpRemoved));
                parts.push(W.text(Part::AfterRemoval));
            }
        }
        "skill_listing" => parts.push(W.text(Part::SkillsHeader)),
        // 2.1.2xx has one auto-mode text (no sparse one): the flags pick its parts.
        "auto_mode" if flag("bypass") || flag("steerOnly") => {
            parts.push(W.text(if flag("bypass") { Part::AutoModeBypassLead } else { Part::AutoModeSteerLead }));
            parts.push(W.text(Part::AutoModeShell));
        }
        "auto_mode" => {
            parts.push(W.text(Part::AutoMode));
            if flag("autoModeConsentFlow") {
                parts.push(W.text(Part::AutoModeConsent));
            }
            if flag("bashFirst") {
                parts.push(W.text(Part::AutoModeShell));
            }
        }
        "task_reminder" => {
            parts.push(W.text(Part::TaskReminder));
            if listed("content") {
                parts.push(W.text(Part::TasksHeader));
            }
        }
        _ => {}
    }
    parts.retain(|p| !p.is_empty());
    parts
}

fn view_in_file_order(recording: &Recording, call: &RecordedCall) -> Vec<usize> {
    let mut indices = Vec::new();
    for (i, event) in recording.events.iter().enumerate().take(call.event_index) {
        if event.lane != call.lane {
            continue;
        }
        if matches!(event.kind, EventKind::Compaction(_)) {
            indices.clear();
        } else if is_message_event(&event.kind) {
            indices.push(i);
        }
    }
    indices
}

/// Builds API messages from message events, merging consecutive same-role content.
pub fn build_messages(recording: &Recording, indices: &[usize]) -> Vec<Message> {
    let mut messages: Vec<Message> = Vec::new();
    append_messages(recording, indices, &mut messages);
    messages
}

/// Appends blocks to a message, turning a string content into blocks first.
fn merge_into(last: &mut Message, blocks: Vec<ContentBlock>) {
    match &mut last.content {
        MessageContent::Blocks(merged) => merged.extend(blocks),
        MessageContent::Text(_) => {
            let mut merged = last.content.to_blocks();
            merged.extend(blocks);
            last.content = MessageContent::Blocks(merged.into());
        }
    }
}

/// Appends message events to `messages` as [`build_messages`] does (the first may merge into
/// the last message). A message made of one event's blocks shares them with the event.
fn append_messages(recording: &Recording, indices: &[usize], messages: &mut Vec<Message>) {
    for &i in indices {
        let Some((role, blocks)) = recording.events.get(i).and_then(|e| event_blocks(&e.kind)) else { continue };
        match messages.last_mut() {
            Some(last) if last.role == role => merge_into(last, blocks.into_vec()),
            _ => messages.push(Message { role, content: MessageContent::Blocks(blocks.into_shared()), extra: Map::new() }),
        }
    }
}

/// The blocks a message event contributes: its own (shared) or built for the message.
enum EventBlocks {
    Shared(SharedBlocks),
    Built(Vec<ContentBlock>),
}

impl EventBlocks {
    fn into_vec(self) -> Vec<ContentBlock> {
        match self {
            EventBlocks::Shared(blocks) => blocks.to_vec(),
            EventBlocks::Built(blocks) => blocks,
        }
    }

    fn into_shared(self) -> SharedBlocks {
        match self {
            EventBlocks::Shared(blocks) => blocks,
            EventBlocks::Built(blocks) => blocks.into(),
        }
    }
}

/// The role and content blocks a message event contributes.
fn event_blocks(kind: &EventKind) -> Option<(Role, EventBlocks)> {
    match kind {
        EventKind::UserPrompt(UserPrompt { content: MessageContent::Blocks(blocks), .. }) => Some((Role::User, EventBlocks::Shared(blocks.clone()))),
        EventKind::UserPrompt(UserPrompt { content, .. }) => Some((Role::User, EventBlocks::Built(content.to_blocks()))),
        EventKind::ToolResult(ToolResult { tool_use_id, content, is_error, .. }) => {
            let content = content.clone().unwrap_or_else(|| ToolResultContent::Text(String::new().into()));
            let block = ContentBlock::tool_result(tool_use_id.clone(), content, is_error.then_some(true));
            Some((Role::User, EventBlocks::Built(vec![block])))
        }
        EventKind::ModelReply(reply) => Some((Role::Assistant, EventBlocks::Shared(reply.content.clone()))),
        EventKind::Attachment(attachment) if is_sent_attachment(kind) => {
            Some((Role::User, EventBlocks::Built(vec![ContentBlock::text(attachment_text(attachment))])))
        }
        _ => None,
    }
}

/// The tool ids in the blocks a message event contributes ([`event_blocks`], without building
/// them): `result` for every tool result's, `assistant_use` for every tool use of a reply.
fn visit_tool_ids<'e>(kind: &'e EventKind, mut result: impl FnMut(&'e str), mut assistant_use: impl FnMut(&'e str)) {
    let blocks: &[ContentBlock] = match kind {
        EventKind::UserPrompt(UserPrompt { content: MessageContent::Blocks(blocks), .. }) => blocks,
        EventKind::ToolResult(ToolResult { tool_use_id, .. }) => return result(tool_use_id),
        EventKind::ModelReply(reply) => &reply.content,
        _ => &[],
    };
    let assistant = matches!(kind, EventKind::ModelReply(_));
    for block in blocks {
        match block {
            ContentBlock::ToolResult { tool_use_id, .. } => result(tool_use_id),
            ContentBlock::ToolUse { id, .. } if assistant => assistant_use(id),
            _ => {}
        }
    }
}

/// Appends message events to a resumed client's messages ([`ImportedSession::messages_loaded`]
/// of the view so far, whose answered and left-out tool uses `lane` holds; no event appended
/// answers one left out): tool uses without a result in the view are left out, events left
/// empty add nothing, and an event joins the last message when their roles agree. That is what
/// rebuilding gives: its messages are the view's events so filtered, without the empty ones,
/// merged where consecutive roles agree.
fn append_loaded(recording: &Recording, indices: &[usize], lane: &mut LaneView) {
    let events = || indices.iter().filter_map(|&i| recording.events.get(i));
    for event in events() {
        visit_tool_ids(&event.kind, |id| { lane.answered.insert(id.to_owned()); }, |_| {});
    }
    for event in events() {
        let Some((role, blocks)) = event_blocks(&event.kind) else { continue };
        let mut blocks = blocks.into_vec();
        if role == Role::Assistant {
            blocks.retain(|b| match b {
                ContentBlock::ToolUse { id, .. } if !lane.answered.contains(id) => {
                    lane.unanswered.insert(id.clone());
                    false
                }
                _ => true,
            });
        }
        if blocks.is_empty() {
            continue;
        }
        match lane.messages.last_mut() {
            Some(last) if last.role == role => merge_into(last, blocks),
            _ => lane.messages.push(Message { role, content: MessageContent::Blocks(blocks.into()), extra: Map::new() }),
        }
    }
}

/// Imports a session transcript and the subagent transcripts beside it
/// (`<session>/subagents/agent-*.jsonl`, in sorted order).
pub fn import_claude_code(path: &Path) -> Result<ImportedSession, ImportError> {
    let file_name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| ImportError::Read { file: file_name.clone(), source })?;
    let mut main = FileImporter::new(&file_name, None, None);
    main.read_bytes(&bytes)?;

    let mut subagents = Vec::new();
    let mut files = vec![path.to_path_buf()];
    for sub_path in subagent_files(path) {
        files.push(sub_path.clone());
        let sub_name = sub_path.display().to_string();
        let agent_id = sub_path
            .file_stem()
            .and_then(|s| s.to_str())
            .map(|s| s.trim_start_matches("agent-").to_owned())
            .unwrap_or_default();
        let lane = lane_for_agent(&agent_id);
        let bytes = std::fs::read(&sub_path).map_err(|source| ImportError::Read { file: sub_name.clone(), source })?;
        let mut sub = FileImporter::new(&sub_name, Some(lane.clone()), main.origin_ms);
        sub.read_bytes(&bytes)?;
        let meta = read_subagent_meta(&sub_path, &mut main.warnings);
        let info = SubagentInfo {
            agent_id: agent_id.clone(),
            lane,
            file: Some(sub_name),
            agent_type: meta.as_ref().and_then(|m| m.get("agentType")).and_then(Value::as_str).map(str::to_owned),
            description: meta.as_ref().and_then(|m| m.get("description")).and_then(Value::as_str).map(str::to_owned),
            tool_use_id: meta
                .as_ref()
                .and_then(|m| m.get("toolUseId"))
                .and_then(Value::as_str)
                .map(str::to_owned)
                .or_else(|| main.agent_tool_use.get(&agent_id).cloned()),
        };
        subagents.push((info, sub));
    }
    Ok(finish(main, subagents, Some(files)))
}

/// Imports one transcript from a reader, without looking for subagent files.
pub fn import_claude_code_from<R: BufRead>(reader: R, file: &str) -> Result<ImportedSession, ImportError> {
    let mut main = FileImporter::new(file, None, None);
    main.read(reader)?;
    Ok(finish(main, Vec::new(), None))
}

fn lane_for_agent(agent_id: &str) -> String {
    // Claude Code runs its compaction summary as a forked agent whose id starts with
    // `acompact`; its call is the compaction request, not a subagent's work.
    if agent_id.starts_with("acompact") { LANE_COMPACT.to_owned() } else { format!("subagent:{agent_id}") }
}

/// `<dir>/<session>.jsonl` → sorted `<dir>/<session>/subagents/agent-*.jsonl`.
fn subagent_files(path: &Path) -> Vec<PathBuf> {
    let Some(stem) = path.file_stem() else { return Vec::new() };
    let dir = path.with_file_name(stem).join("subagents");
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("agent-") && name.ends_with(".jsonl")
        })
        .collect();
    files.sort();
    files
}

fn read_subagent_meta(sub_path: &Path, warnings: &mut Warnings) -> Option<Map<String, Value>> {
    let meta_path = sub_path.with_extension("meta.json");
    let text = std::fs::read(&meta_path).ok()?;
    match serde_json::from_slice::<Value>(&text) {
        Ok(Value::Object(map)) => Some(map),
        Ok(_) | Err(_) => {
            warnings.push(LineWarning {
                kind: WarningKind::BadLine,
                file: meta_path.display().to_string(),
                line: 1,
                path: None,
                message: "subagent .meta.json is not a JSON object; ignored".to_owned(),
            });
            None
        }
    }
}

/// Merges the main file and subagent files into one recording; `files` are the paths read (main
/// file first), when the session was read from them.
fn finish(mut main: FileImporter, mut subagents: Vec<(SubagentInfo, FileImporter)>, files: Option<Vec<PathBuf>>) -> ImportedSession {
    // Each call's first written line, the main file's lines first, then each subagent file's.
    let written_call_times = files.map(|files| {
        let mut times = BTreeMap::new();
        let lists = std::iter::once(std::mem::take(&mut main.call_times)).chain(subagents.iter_mut().map(|(_, sub)| std::mem::take(&mut sub.call_times)));
        for (id, request, ms) in lists.flatten() {
            times.entry((id, request)).or_insert(ms);
        }
        std::sync::Arc::new(WrittenCallTimes { files, times })
    });
    let mut header = Header::new("claude-code");
    header.session_id = main.session_id.clone();
    header.start_epoch_ms = main.origin_ms;
    header.input = Some(main.file.clone());
    header.cwd = main.cwd.clone();
    header.versions = main.versions.clone();
    header.entrypoint = main.entrypoint.clone();
    header.metadata = main.metadata.clone();
    header.head_truncated =
        main.opens_with_compaction || main.first_parent.as_ref().is_some_and(|parent| !main.seen_uuids.contains(parent));

    let mut report = ImportReport::new(&main.file, "claude-code");
    main.add_to_report(&mut report);
    report.totals_main_file = main.totals();

    // Merge lanes by time, keeping each lane's own order: at equal times the main lane comes
    // first, then subagents in file-name order. Main-lane indices are remapped for the chain.
    let mut lanes: Vec<Vec<Event>> = vec![main.events];
    for (info, sub) in &subagents {
        header.subagents.push(info.clone());
        report.subagent_files.push(sub.file.clone());
    }
    let mut api = main.api;
    let mut sub_reports = Vec::new();
    for (_, mut sub) in subagents {
        let sub_api = std::mem::take(&mut sub.api);
        api.shapes.extend(sub_api.shapes);
        api.blobs.extend(sub_api.blobs);
        api.requests.extend(sub_api.requests);
        api.record_messages.extend(sub_api.record_messages);
        let mut sub_report = ImportReport::new(&sub.file, "claude-code");
        sub.add_to_report(&mut sub_report);
        sub_reports.push(sub_report);
        lanes.push(sub.events);
    }
    for sub_report in sub_reports {
        report.absorb(sub_report);
    }
    let (events, main_index_map) = merge_by_time(lanes);
    let mut chain = main.chain;
    for node in chain.values_mut() {
        for i in &mut node.events {
            *i = main_index_map[*i];
        }
    }
    let recording = Recording { header, events: events.into() };
    let calls = recorded_calls(&recording);
    report.events = recording.events.len();
    report.calls = calls.len();
    let mut by_lane: BTreeMap<String, UsageTotals> = BTreeMap::new();
    for call in &calls {
        let totals = by_lane.entry(call.lane.clone()).or_default();
        totals.add(&call.usage, call.is_synthetic);
        report.totals_all.add(&call.usage, call.is_synthetic);
    }
    report.totals_by_lane = by_lane;
    report.api_requests = api.requests.len();
    report.api_requests_of_calls = calls.iter().filter(|c| c.request_ref.as_ref().is_some_and(|r| api.requests.contains_key(r))).count();
    let references = std::sync::Arc::new(crate::replay::loss::ReferenceMemo::new(recording.events.len()));
    ImportedSession {
        recording,
        calls,
        report,
        api_requests: api.into(),
        chain: Chain::new(chain),
        references,
        record_views: Default::default(),
        written_call_times,
    }
}

/// Stable k-way merge by time; returns the merged events and, for lane 0, old → new index.
///
/// Each lane keeps its own order. A record a file holds out of time order (a checkpoint that
/// writes late queue operations at its top) is merged by the earliest time at or after it in its
/// lane, so it cannot hold back the records that follow it.
fn merge_by_time(lanes: Vec<Vec<Event>>) -> (Vec<Event>, Vec<usize>) {
    let total: usize = lanes.iter().map(Vec::len).sum();
    let first_len = lanes.first().map_or(0, Vec::len);
    let keys: Vec<Vec<u64>> = lanes
        .iter()
        .map(|lane| {
            let mut keys: Vec<u64> = lane.iter().map(|e| e.time_ms).collect();
            for i in (0..keys.len().saturating_sub(1)).rev() {
                keys[i] = keys[i].min(keys[i + 1]);
            }
            keys
        })
        .collect();
    let mut iters: Vec<std::vec::IntoIter<Event>> = lanes.into_iter().map(Vec::into_iter).collect();
    let mut next = vec![0usize; iters.len()];
    let mut out = Vec::with_capacity(total);
    let mut map = Vec::with_capacity(first_len);
    loop {
        let mut best: Option<(usize, u64)> = None;
        for (lane, lane_keys) in keys.iter().enumerate() {
            if let Some(&key) = lane_keys.get(next[lane])
                && best.is_none_or(|(_, t)| key < t) {
                    best = Some((lane, key));
                }
        }
        let Some((lane, _)) = best else { break };
        let Some(event) = iters[lane].next() else { break };
        next[lane] += 1;
        if lane == 0 {
            map.push(out.len());
        }
        out.push(event);
    }
    (out, map)
}

/// State of reading one transcript file.
struct FileImporter {
    file: String,
    /// Lane of every record of a subagent file; `None` for the main file.
    file_lane: Option<String>,
    origin_ms: Option<i64>,
    /// Time of the last timestamped record, in ms after `origin_ms` (negative when earlier).
    last_time_ms: i64,
    events: Vec<Event>,
    /// Each event's time in ms after `origin_ms`, signed until the file is read.
    event_times: Vec<i64>,
    /// The origin was given (a subagent file takes its main file's) rather than provisional.
    origin_fixed: bool,
    /// `message.id` → index of its merged `model_reply` (only looked up: never iterated).
    reply_index: rustc_hash::FxHashMap<String, usize>,
    /// (Only looked up: never iterated.)
    seen_uuids: rustc_hash::FxHashSet<String>,
    chain: BTreeMap<String, ChainNode>,
    /// `parentUuid` of the first record that has the field (`None` when it is null).
    first_parent: Option<String>,
    saw_parent_field: bool,
    /// The file opens with a compaction whose history is not in it (the conversation it
    /// summarized was written to an earlier file).
    opens_with_compaction: bool,
    /// The last compaction event, waiting for its summary message.
    pending_compaction: Option<usize>,
    /// `agentId` → the Task tool_use that started it (from `agent_progress` records).
    agent_tool_use: BTreeMap<String, String>,
    /// Tool hooks' progress under a parent record the file does not hold: parent uuid → the
    /// tool uses (id, tool name) the hooks ran for. A reply the client made and counted but
    /// never wrote (a compaction rewrote the chain first) leaves only these.
    unwritten_parent_tool_uses: BTreeMap<String, Vec<(String, String)>>,
    session_id: Option<String>,
    cwd: Option<String>,
    versions: Vec<String>,
    metadata: Map<String, Value>,
    lines: usize,
    records_by_type: BTreeMap<String, usize>,
    unknown_by_type: BTreeMap<String, usize>,
    duplicates: usize,
    chunks_merged: usize,
    warnings: Warnings,
    /// `permissionMode` of the user record being read.
    prompt_mode: Option<String>,
    /// The wire requests the file recorded (`api-request*` records), and the ordinary
    /// records' messages by hash once the first of them was read.
    api: ApiRequests,
    api_seen: bool,
    /// Assistant records' raw content by `message.id`, in file order (hashed when the file is read).
    assistant_raw: Vec<Vec<Value>>,
    assistant_raw_index: BTreeMap<String, usize>,
    /// The client's `entrypoint` (the first record naming one).
    entrypoint: Option<String>,
    /// Attachment records carrying `rendered`, by `renderedRole`.
    rendered_attachments: BTreeMap<String, usize>,
    not_used_by_type: BTreeMap<String, usize>,
    /// `(message.id, requestId, written ms)` of the lines [`written_call_time`] takes, in file
    /// order.
    call_times: Vec<(String, String, i64)>,
    /// A line that is not UTF-8 was met: a read of the file for call times ends there.
    call_times_ended: bool,
    /// The reply the last assistant line's usage went to, and that usage's JSON text, where it
    /// was read whole (no warning): a streamed message's next chunk that repeats the text byte
    /// for byte leaves the reply's usage as it is, unparsed (`FileImporter::assistant`).
    last_usage: Option<(usize, String)>,
}

impl FileImporter {
    fn new(file: &str, file_lane: Option<String>, origin_ms: Option<i64>) -> Self {
        FileImporter {
            file: file.to_owned(),
            file_lane,
            origin_ms,
            last_time_ms: 0,
            events: Vec::new(),
            event_times: Vec::new(),
            origin_fixed: origin_ms.is_some(),
            reply_index: rustc_hash::FxHashMap::default(),
            seen_uuids: rustc_hash::FxHashSet::default(),
            chain: BTreeMap::new(),
            first_parent: None,
            saw_parent_field: false,
            opens_with_compaction: false,
            pending_compaction: None,
            agent_tool_use: BTreeMap::new(),
            unwritten_parent_tool_uses: BTreeMap::new(),
            session_id: None,
            cwd: None,
            versions: Vec::new(),
            metadata: Map::new(),
            lines: 0,
            records_by_type: BTreeMap::new(),
            unknown_by_type: BTreeMap::new(),
            duplicates: 0,
            chunks_merged: 0,
            warnings: Warnings::default(),
            prompt_mode: None,
            api: ApiRequests::default(),
            api_seen: false,
            assistant_raw: Vec::new(),
            assistant_raw_index: BTreeMap::new(),
            entrypoint: None,
            rendered_attachments: BTreeMap::new(),
            not_used_by_type: BTreeMap::new(),
            call_times: Vec::new(),
            call_times_ended: false,
            last_usage: None,
        }
    }

    /// Reads the whole input first: each line is then one copy out of it, rather than a buffer
    /// grown chunk by chunk from the reader's.
    fn read<R: BufRead>(&mut self, mut reader: R) -> Result<(), ImportError> {
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes).map_err(|source| ImportError::Read { file: self.file.clone(), source })?;
        self.read_bytes(&bytes)
    }

    fn read_bytes(&mut self, bytes: &[u8]) -> Result<(), ImportError> {
        // A first line opening with a byte-order mark is no JSON to a read of the file for call
        // times.
        let bom = bytes.starts_with(crate::input::BOM);
        // A file that is UTF-8 as a whole has its record lines read by `picked::Lines` (the
        // crate's reader of a JSON line, with a buffer kept over the file); each line is text
        // too (a line ends at a line break, and the byte-order mark is a whole character).
        let text = utf8(bytes);
        let mut records = text.map(picked::Lines::new);
        for line in SliceLines::new(bytes) {
            self.lines = line.number;
            if line.is_blank() {
                continue;
            }
            if bom && line.number == 1 && std::str::from_utf8(line.bytes).is_err() {
                // A read for call times stops at a line that is not UTF-8, this one too.
                self.call_times_ended = true;
            }
            let times = !self.call_times_ended && !(bom && line.number == 1);
            // (Where the line lies in the file: `SliceLines` gives slices of it.)
            let at = line.bytes.as_ptr() as usize - bytes.as_ptr() as usize;
            debug_assert!(std::ptr::eq(&bytes[at..at + line.bytes.len()], line.bytes), "a line is a slice of the file");
            match self.parse_record(line.bytes, records.as_mut().map(|records| (records, at..at + line.bytes.len()))) {
                Ok(Ok(record)) => {
                    let time = if times { self.note_call_time(&record, line.bytes) } else { None };
                    self.record(record, line.number, time)
                }
                Ok(Err(other)) => {
                    if times {
                        self.note_call_time_of_line(line.bytes);
                    }
                    self.warn(WarningKind::BadLine, line.number, None, format!("expected a JSON object, found {}", kind_of(&other)))
                }
                Err((path, message)) => {
                    if times {
                        self.note_call_time_of_line(line.bytes);
                    }
                    self.warn(line.failure_kind(), line.number, path, message)
                }
            }
        }
        self.settle_times();
        self.hash_assistant_messages();
        Ok(())
    }

    /// A line's record as [`FileImporter::record`] reads it: the fields it reads
    /// ([`picked::record`]) where its type is read from those alone, the whole `Value` parse
    /// otherwise (and for a line the picked parse does not take). `records` is the file's
    /// [`picked::Lines`] where the file is UTF-8, with the line's place in it. Debug builds parse
    /// every picked line whole too and compare.
    fn parse_record<'b>(&self, bytes: &'b [u8], records: Option<(&mut picked::Lines<'b>, Range<usize>)>) -> Result<Result<Record<'b>, Value>, (Option<String>, String)> {
        let repeated = self.last_usage.as_ref().map(|(_, text)| text.as_str());
        let picked = match records {
            Some((records, range)) if !self.api_seen => records.record(range, repeated),
            _ => utf8(bytes).and_then(|text| picked::record(text, repeated, self.api_seen)),
        };
        let picked = picked
            .map(Record::Picked)
            .filter(|record| !reads_whole_record(record));
        let Some(record) = picked else {
            return parse_line::<Value>(bytes).map(|value| match value {
                Value::Object(map) => Ok(Record::Whole(map)),
                other => Err(other),
            });
        };
        if cfg!(debug_assertions) {
            let (Record::Picked(fields), Ok(Value::Object(whole))) = (&record, parse_line::<Value>(bytes)) else {
                panic!("{}: picked a record the whole parse refuses", self.file)
            };
            picked::assert_same_as_whole(fields, &whole, repeated, &self.file);
        }
        Ok(Ok(record))
    }

    /// Keeps the written time of a line parsed as `record` ([`written_call_time`]'s rule, read
    /// off the parsed record): only a line with a string `timestamp`, `requestId` and
    /// `message.id` can have one; a `message` of another shape goes to the typed parse. The
    /// record's `timestamp` in ms where it read it.
    fn note_call_time(&mut self, record: &Record, line: &[u8]) -> Option<i64> {
        let (Some(ts), Some(request)) = (record.str("timestamp"), record.str("requestId")) else { return None };
        let id = match record.message_kind() {
            Some(MessageKind::Object) => match record.message_get("id") {
                Some(Value::String(id)) => id,
                _ => return None,
            },
            // A sequence can deserialize as the typed parse's struct.
            Some(MessageKind::Array) => {
                self.note_call_time_of_line(line);
                return None;
            }
            _ => return None,
        };
        // (The line parsed, so it is UTF-8: its text holds `"usage"` where its bytes do.)
        // (One searcher for every line: `memmem::find` builds one per call.)
        static USAGE_KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> = std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"usage\""));
        let usage = USAGE_KEY.find(line).is_some();
        debug_assert_eq!(usage, std::str::from_utf8(line).is_ok_and(|text| text.contains("\"usage\"")));
        if !usage {
            return None;
        }
        let ms = ts.parse::<jiff::Timestamp>().ok()?.as_millisecond();
        self.call_times.push((id.clone(), request.to_owned(), ms));
        Some(ms)
    }

    /// Keeps the written time of a line the record parse did not take as an object
    /// ([`written_call_time`] on the line); a line that is not UTF-8 ends the file's call times.
    fn note_call_time_of_line(&mut self, line: &[u8]) {
        match std::str::from_utf8(line) {
            Ok(text) => self.call_times.extend(written_call_time(text)),
            Err(_) => self.call_times_ended = true,
        }
    }

    /// The merged assistant messages, by hash, for `tail` hashes without a blob.
    fn hash_assistant_messages(&mut self) {
        if !self.api_seen {
            return;
        }
        for content in std::mem::take(&mut self.assistant_raw) {
            let message = serde_json::json!({"role": "assistant", "content": content});
            self.api.record_messages.insert(api_requests::message_hash(&message), message);
        }
    }

    /// A user record's message by hash, for `tail` hashes without a blob.
    fn index_user_message(&mut self, record: &Record) {
        if let Some(content) = record.message_get("content") {
            let message = serde_json::json!({"role": "user", "content": content});
            self.api.record_messages.insert(api_requests::message_hash(&message), message);
        }
    }

    /// An assistant record's content blocks, merged with the earlier lines of its message.
    fn collect_assistant_content(&mut self, record: &Record) {
        let blocks: Vec<Value> = match record.message_get("content") {
            Some(Value::Array(items)) => items.clone(),
            Some(Value::String(text)) => vec![serde_json::json!({"type": "text", "text": text})],
            _ => return,
        };
        match record.message_get("id").and_then(Value::as_str) {
            Some(id) => match self.assistant_raw_index.get(id) {
                Some(&i) => self.assistant_raw[i].extend(blocks),
                None => {
                    self.assistant_raw_index.insert(id.to_owned(), self.assistant_raw.len());
                    self.assistant_raw.push(blocks);
                }
            },
            None => self.assistant_raw.push(blocks),
        }
    }

    /// Reads an `api-request`, `api-request-shape` or `api-request-blob` record; a malformed
    /// one is reported with its line and field and skipped.
    fn api_record(&mut self, kind: &str, record: &Map<String, Value>, line: usize) {
        self.api_seen = true;
        let outcome = match kind {
            "api-request-shape" => api_requests::parse_shape(record).map(|(hash, shape)| {
                self.api.shapes.insert(hash, shape);
            }),
            "api-request-blob" => api_requests::parse_blob(record).map(|(hash, message)| {
                self.api.blobs.insert(hash, message);
            }),
            _ => api_requests::parse_request(record, &self.file, line, self.entrypoint.clone()).map(|request| {
                self.api.requests.insert(request.id.clone(), request);
            }),
        };
        if let Err((path, message)) = outcome {
            self.warn(WarningKind::BadLine, line, Some(path), format!("{kind} record: {message}; skipped"));
        }
    }

    fn warn(&mut self, kind: WarningKind, line: usize, path: Option<String>, message: String) {
        self.warnings.push(LineWarning { kind, file: self.file.clone(), line, path, message });
    }

    /// Reads a record: of a type [`reads_whole_record`] leaves to the picked parse, only its
    /// [`picked::RECORD_FIELDS`] (and `data`'s [`picked::DATA_FIELDS`], `message`'s
    /// [`picked::MESSAGE_FIELDS`]) are here.
    /// `time` is the record's `timestamp` in ms where the line's call time read it already.
    fn record(&mut self, mut record: Record, line: usize, time: Option<i64>) {
        let Some(kind) = record.str("type").map(str::to_owned) else {
            self.warn(WarningKind::BadLine, line, Some("type".into()), "missing or non-string field `type`".into());
            return;
        };
        let subtype = record.str("subtype");
        let key = match subtype {
            Some(sub) if kind == "system" => format!("system:{sub}"),
            _ => kind.clone(),
        };
        *self.records_by_type.entry(key).or_default() += 1;

        let uuid = record.str("uuid").map(str::to_owned);
        if !self.saw_parent_field && record.contains_key("parentUuid") {
            self.saw_parent_field = true;
            self.first_parent = record.str("parentUuid").map(str::to_owned);
        }
        if let Some(uuid) = &uuid {
            // Resumed sessions can copy earlier records into a file again; count them once.
            if !self.seen_uuids.insert(uuid.clone()) {
                self.duplicates += 1;
                return;
            }
        }
        let time_ms = self.time_of(&record, line, time);
        if self.session_id.is_none() {
            self.session_id = record.str("sessionId").map(str::to_owned);
        }
        if self.cwd.is_none() {
            self.cwd = record.str("cwd").map(str::to_owned);
        }
        if self.entrypoint.is_none() {
            self.entrypoint = record.str("entrypoint").map(str::to_owned);
        }
        let version = record.str("version").map(str::to_owned);
        if let Some(v) = &version
            && !self.versions.contains(v) {
                self.versions.push(v.clone());
            }
        let lane = self.lane_of(&record);
        // Read before the record's fields are moved into events.
        let parent = uuid.as_ref().and_then(|_| record.str("parentUuid").map(str::to_owned));
        let first_event = self.events.len();
        let mut merged_into: Option<usize> = None;

        match kind.as_str() {
            "user" => {
                if self.api_seen {
                    self.index_user_message(&record);
                }
                self.user(&mut record, line, time_ms, &lane, uuid.as_deref());
            }
            "assistant" => {
                if self.api_seen {
                    self.collect_assistant_content(&record);
                }
                merged_into = self.assistant(&mut record, line, time_ms, &lane, uuid.as_deref(), version);
            }
            "system" => {
                let subtype = subtype.unwrap_or("").to_owned();
                self.system(record.into_whole(), &subtype, time_ms, &lane, uuid.as_deref());
            }
            "attachment" => {
                let attachment = record.remove("attachment").unwrap_or(Value::Null);
                let attachment_type =
                    attachment.get("type").and_then(Value::as_str).unwrap_or("unknown").to_owned();
                if attachment.get("rendered").is_some() {
                    let role = attachment.get("renderedRole").and_then(Value::as_str).unwrap_or("unstated").to_owned();
                    *self.rendered_attachments.entry(role).or_default() += 1;
                }
                self.push(EventKind::Attachment(Attachment { attachment_type, payload: attachment }), time_ms, &lane, uuid.as_deref());
            }
            "queue-operation" => {
                let payload = strip_envelope(record.into_whole());
                self.push(
                    EventKind::SystemEvent(SystemEvent { subtype: "queue_operation".into(), payload }),
                    time_ms,
                    &lane,
                    uuid.as_deref(),
                );
            }
            "progress" => {
                // Hook and bash progress are UI updates that never reach the model. Agent
                // progress is kept only for the link from a subagent to its Task call, and the
                // SessionStart hook's progress because its source (`startup`, `resume`, `clear`,
                // `compact`) is, in some transcripts, the only trace of a new client process.
                let data = record.get("data");
                let data_type = data.and_then(|d| d.get("type")).and_then(Value::as_str);
                if data_type == Some("hook_progress")
                    && data.and_then(|d| d.get("hookEvent")).and_then(Value::as_str) == Some("SessionStart")
                {
                    let payload = record.remove("data").unwrap_or(Value::Null);
                    self.push(
                        EventKind::SystemEvent(SystemEvent { subtype: "session_start".into(), payload }),
                        time_ms,
                        &lane,
                        uuid.as_deref(),
                    );
                } else if data_type == Some("hook_progress")
                    && let Some(parent) = record.str("parentUuid").filter(|p| !self.seen_uuids.contains(*p))
                    && let Some(id) = record.str("toolUseID")
                    && let Some(tool) = data.and_then(|d| d.get("hookName")).and_then(Value::as_str).and_then(|n| {
                        n.strip_prefix("PreToolUse:").or_else(|| n.strip_prefix("PostToolUse:"))
                    })
                {
                    // A tool hook's progress under a record the file does not hold: the only
                    // trace of a reply that was never written, kept until a compaction names
                    // that record as its logical parent.
                    let uses = self.unwritten_parent_tool_uses.entry(parent.to_owned()).or_default();
                    if !uses.iter().any(|(known, _)| known == id) {
                        uses.push((id.to_owned(), tool.to_owned()));
                    }
                } else if data_type == Some("agent_progress") {
                    let agent = data.and_then(|d| d.get("agentId")).and_then(Value::as_str);
                    let tool_use = record.str("parentToolUseID");
                    if let (Some(agent), Some(tool_use)) = (agent, tool_use) {
                        self.agent_tool_use.entry(agent.to_owned()).or_insert_with(|| tool_use.to_owned());
                    }
                }
            }
            // File-history snapshots and deltas back up edited files for /rewind; not model
            // context.
            "file-history-snapshot" | "file-history-delta" => {}
            other if api_requests::API_REQUEST_KINDS.contains(&other) => self.api_record(other, &record.into_whole(), line),
            other if api_requests::NOT_USED_KINDS.contains(&other) => {
                *self.not_used_by_type.entry(other.to_owned()).or_default() += 1;
            }
            other if METADATA_TYPES.contains(&other) => {
                let other = other.to_owned();
                self.metadata.insert(other, strip_envelope(record.into_whole()));
            }
            other => {
                *self.unknown_by_type.entry(other.to_owned()).or_default() += 1;
                self.warn(WarningKind::Ignored, line, Some("type".into()), format!("unknown record type `{other}`; skipped"));
            }
        }

        // Keep the parent graph even for records that produced no event (progress, system
        // records without events), because the chain of the main thread runs through them.
        if let Some(uuid) = uuid {
            let mut events: Vec<usize> = (first_event..self.events.len()).collect();
            events.extend(merged_into);
            self.chain.insert(uuid, ChainNode { parent, events });
        }
    }

    /// The record's time (`read`: its `timestamp` in ms, where read already).
    fn time_of(&mut self, record: &Record, line: usize, read: Option<i64>) -> i64 {
        let Some(text) = record.str("timestamp") else { return self.last_time_ms };
        debug_assert!(read.is_none_or(|ms| text.parse::<jiff::Timestamp>().is_ok_and(|ts| ts.as_millisecond() == ms)), "a timestamp read before differs");
        let ms = match read.map_or_else(|| text.parse::<jiff::Timestamp>().map(|ts| ts.as_millisecond()), Ok) {
            Ok(ms) => ms,
            Err(e) => {
                self.warn(WarningKind::BadLine, line, Some("timestamp".into()), format!("bad timestamp `{text}`: {e}; using the previous record's time"));
                return self.last_time_ms;
            }
        };
        // Until the file is read the origin is provisional: its first timestamp. Records can
        // come out of order (queued operations written at the top of a checkpoint, subagents
        // that started before the main file's first record), so times stay signed here.
        let origin = *self.origin_ms.get_or_insert(ms);
        self.last_time_ms = ms.saturating_sub(origin);
        self.last_time_ms
    }

    /// Fixes every event's time once the file is read. The main file's origin becomes its
    /// earliest record, so no record sits before time zero and none is clamped onto another;
    /// a subagent file keeps its main file's origin, and anything earlier is clamped to zero.
    fn settle_times(&mut self) {
        let shift = if self.origin_fixed { 0 } else { self.event_times.iter().copied().min().unwrap_or(0).min(0) };
        if let Some(origin) = &mut self.origin_ms {
            *origin += shift;
        }
        for (event, &time) in self.events.iter_mut().zip(&self.event_times) {
            event.time_ms = u64::try_from(time - shift).unwrap_or(0);
        }
    }

    fn lane_of(&self, record: &Record) -> String {
        if let Some(lane) = &self.file_lane {
            return lane.clone();
        }
        if record.bool("isSidechain") == Some(true) {
            // Older Claude Code wrote subagent records into the main file, flagged as sidechain.
            let agent = record.str("agentId").unwrap_or("sidechain");
            return lane_for_agent(agent);
        }
        LANE_MAIN.to_owned()
    }

    /// Adds an event at `time_ms` after the provisional origin (negative when earlier); its
    /// `time_ms` is set when the file has been read ([`FileImporter::settle_times`]).
    fn push(&mut self, kind: EventKind, time_ms: i64, lane: &str, uuid: Option<&str>) -> usize {
        self.event_times.push(time_ms);
        self.events.push(Event { kind, time_ms: 0, lane: lane.to_owned(), uuid: uuid.map(str::to_owned) });
        self.events.len() - 1
    }

    fn user(&mut self, record: &mut Record, line: usize, time_ms: i64, lane: &str, uuid: Option<&str>) {
        let is_meta = record.bool("isMeta").unwrap_or(false);
        let is_compact_summary = record.bool("isCompactSummary").unwrap_or(false);
        self.prompt_mode = record.str("permissionMode").map(str::to_owned);
        let Some(content) = record.message_take_content() else {
            self.warn(WarningKind::BadLine, line, Some("message.content".into()), "user record without message content; skipped".into());
            return;
        };
        if is_compact_summary
            && let Some(i) = self.pending_compaction.take()
                && let EventKind::Compaction(Compaction { summary, .. }) = &mut self.events[i].kind {
                    *summary = Some(content.text());
                }
        let blocks = match content {
            Content::Value(Value::String(text)) => {
                let permission_mode = self.prompt_mode.clone();
                let kind = EventKind::UserPrompt(UserPrompt { content: MessageContent::Text(text.into()), is_meta, is_compact_summary, permission_mode });
                self.push(kind, time_ms, lane, uuid);
                return;
            }
            Content::Value(Value::Array(items)) => self.blocks(items.into_iter().map(ContentBlock::from_value), line, "message.content"),
            Content::Items(items) => self.blocks(items.into_iter().map(|item| item.map_err(|error| error.message)), line, "message.content"),
            Content::Value(other) => {
                let message = format!("message.content must be a string or an array, found {}", kind_of(&other));
                self.warn(WarningKind::BadLine, line, Some("message.content".into()), message);
                return;
            }
        };
        let tool_results = blocks.iter().filter(|b| matches!(b, ContentBlock::ToolResult { .. })).count();
        // The structured result belongs to the tool call when the record answers exactly one.
        let mut structured = if tool_results == 1 { record.remove("toolUseResult").map(crate::api::SharedValue::from) } else { None };
        let mut pending: Vec<ContentBlock> = Vec::new();
        for block in blocks {
            match block {
                ContentBlock::ToolResult { tool_use_id, content, is_error, .. } => {
                    self.flush_prompt(&mut pending, is_meta, is_compact_summary, time_ms, lane, uuid);
                    let kind = EventKind::ToolResult(ToolResult {
                        tool_use_id,
                        content,
                        is_error: is_error.unwrap_or(false),
                        tool_use_result: structured.take(),
                    });
                    self.push(kind, time_ms, lane, uuid);
                }
                other => pending.push(other),
            }
        }
        self.flush_prompt(&mut pending, is_meta, is_compact_summary, time_ms, lane, uuid);
    }

    fn flush_prompt(
        &mut self,
        pending: &mut Vec<ContentBlock>,
        is_meta: bool,
        is_compact_summary: bool,
        time_ms: i64,
        lane: &str,
        uuid: Option<&str>,
    ) {
        if pending.is_empty() {
            return;
        }
        let content = MessageContent::Blocks(std::mem::take(pending).into());
        let permission_mode = self.prompt_mode.clone();
        self.push(EventKind::UserPrompt(UserPrompt { content, is_meta, is_compact_summary, permission_mode }), time_ms, lane, uuid);
    }

    /// Content blocks read one by one (`ContentBlock::from_value` of each item) so one bad
    /// block costs only itself.
    fn blocks(&mut self, items: impl ExactSizeIterator<Item = Result<ContentBlock, String>>, line: usize, path: &str) -> Vec<ContentBlock> {
        let mut blocks = Vec::with_capacity(items.len());
        for (i, item) in items.enumerate() {
            match item {
                Ok(block) => blocks.push(block),
                Err(message) => {
                    self.warn(WarningKind::BadLine, line, Some(format!("{path}[{i}]")), format!("{message}; block skipped"))
                }
            }
        }
        blocks
    }

    /// Returns the index of the reply a continuation chunk was merged into.
    fn assistant(
        &mut self,
        record: &mut Record,
        line: usize,
        time_ms: i64,
        lane: &str,
        uuid: Option<&str>,
        version: Option<String>,
    ) -> Option<usize> {
        // The usage's text where the picked parse read it; this reply's usage is written again
        // below, or kept as it is.
        let usage_text = match record {
            Record::Picked(fields) => fields.take_usage(),
            Record::Whole(_) => None,
        };
        let last_usage = self.last_usage.take();
        if record.message_kind() != Some(MessageKind::Object) {
            self.warn(WarningKind::BadLine, line, Some("message".into()), "assistant record without a message object; skipped".into());
            return None;
        }
        let content = record.message_take_content();
        let message_id = record.message_get("id").and_then(Value::as_str).map(str::to_owned);
        let merged_into = message_id.as_ref().and_then(|id| self.reply_index.get(id)).copied();
        // A chunk whose usage text is the one the same reply took last (read whole) leaves it as
        // it is: that text gives the same usage, and the largest `output_tokens` is already the
        // reply's (below).
        let usage_kept = match (&usage_text, &last_usage) {
            (Some((_, UsageRead::Repeated)), Some((reply, _))) => merged_into == Some(*reply),
            _ => false,
        };
        let (usage_text, usage) = match usage_text {
            // The repeated text was not read: its value (the last usage, read before).
            Some((text, UsageRead::Repeated)) if !usage_kept => {
                let read = last_usage.as_ref().map(|(_, last)| picked::usage_read(last).expect("a usage text read before reads again"));
                (Some(text), read.and_then(UsageRead::into_usage))
            }
            Some((text, read)) => (Some(text), read.into_usage()),
            None => match record {
                Record::Whole(_) => (None, record.message_take("usage").map(Err)),
                Record::Picked(_) => (None, None),
            },
        };
        let stop_reason = record.message_take("stop_reason");
        let model = record.message_get("model").and_then(Value::as_str).unwrap_or("").to_owned();
        let content = match content {
            Some(Content::Value(Value::Array(items))) => self.blocks(items.into_iter().map(ContentBlock::from_value), line, "message.content"),
            Some(Content::Items(items)) => self.blocks(items.into_iter().map(|item| item.map_err(|error| error.message)), line, "message.content"),
            Some(Content::Value(Value::String(text))) => vec![ContentBlock::text(text)],
            _ => Vec::new(),
        };
        let mut usage_read = false;
        let usage = match usage {
            None | Some(Err(Value::Null)) => Usage::default(),
            Some(Ok(usage)) => {
                usage_read = true;
                usage
            }
            // Field by field where it can be; the parse that names the failure otherwise.
            Some(Err(Value::Object(object))) => match Usage::from_object(object) {
                Ok(usage) => {
                    usage_read = true;
                    usage
                }
                Err(object) => self.parse_usage(Value::Object(object), line),
            },
            Some(Err(other)) => self.parse_usage(other, line),
        };
        // The text to compare the next chunk's with: a usage read field by field.
        let usage_text = usage_text.filter(|_| usage_read);
        let stop_reason = match stop_reason {
            None | Some(Value::Null) => None,
            Some(value) => match StopReason::deserialize(&value) {
                Ok(reason) => Some(reason),
                Err(_) => {
                    self.warn(WarningKind::BadLine, line, Some("message.stop_reason".into()), format!("unknown stop_reason {value}; left out"));
                    None
                }
            },
        };
        let request_id = record.str("requestId").map(str::to_owned);
        let request_ref = record.str("requestRef").map(str::to_owned);
        let thinking_text_stored = !content.iter().any(thinking_without_text);
        let is_api_error = record.bool("isApiErrorMessage").unwrap_or(false);

        if let Some(index) = merged_into {
                if let EventKind::ModelReply(reply) = &mut self.events[index].kind {
                    self.chunks_merged += 1;
                    reply.content.extend(content);
                    if usage_kept {
                        if cfg!(debug_assertions) {
                            let Some((_, text)) = &last_usage else { unreachable!("a usage kept has a text") };
                            let Ok(Value::Object(object)) = picked::usage_value(text) else { panic!("a usage kept is no object: {text}") };
                            let Ok(mut again) = Usage::from_object(object) else { panic!("a usage kept does not read: {text}") };
                            again.output_tokens = again.output_tokens.max(reply.usage.output_tokens);
                            assert_eq!(again, reply.usage, "{}:{line}: a repeated usage kept changes the reply's", self.file);
                        }
                        self.last_usage = last_usage;
                    } else {
                        // Every chunk repeats the call's input-side usage; `output_tokens` is a
                        // placeholder until the last chunk, so the largest value is the real one.
                        let output_tokens = reply.usage.output_tokens.max(usage.output_tokens);
                        reply.usage = usage;
                        reply.usage.output_tokens = output_tokens;
                        self.last_usage = usage_text.map(|text| (index, text));
                    }
                    if stop_reason.is_some() {
                        reply.stop_reason = stop_reason;
                    }
                    reply.thinking_text_stored &= thinking_text_stored;
                    reply.is_api_error |= is_api_error;
                    if reply.request_id.is_none() {
                        reply.request_id = request_id;
                    }
                    if reply.request_ref.is_none() {
                        reply.request_ref = request_ref;
                    }
                }
                return Some(index);
            }
        let reply = ModelReply {
            content: content.into(),
            stop_reason,
            is_synthetic: model == "<synthetic>",
            model,
            version,
            usage,
            request_id,
            request_ref,
            message_id: message_id.clone(),
            thinking_text_stored,
            is_api_error,
        };
        let index = self.push(EventKind::ModelReply(reply), time_ms, lane, uuid);
        if let Some(id) = message_id {
            self.reply_index.insert(id, index);
        }
        self.last_usage = usage_text.map(|text| (index, text));
        None
    }

    /// `message.usage` as its `Deserialize` takes it; a failure is warned about, with the path
    /// of the field, and taken as zero.
    fn parse_usage(&mut self, value: Value, line: usize) -> Usage {
        serde_path_to_error::deserialize::<_, Usage>(value).unwrap_or_else(|e| {
            let path = format!("message.usage.{}", crate::input::json_path(e.path()));
            self.warn(WarningKind::BadLine, line, Some(path), format!("{}; usage taken as zero", e.into_inner()));
            Usage::default()
        })
    }

    fn system(&mut self, mut record: Map<String, Value>, subtype: &str, time_ms: i64, lane: &str, uuid: Option<&str>) {
        if subtype == "compact_boundary" {
            let metadata = record.remove("compactMetadata").unwrap_or(Value::Null);
            let number = |key: &str| metadata.get(key).and_then(Value::as_u64);
            let (pre_tokens, post_tokens) = (number("preTokens"), number("postTokens"));
            let kind = EventKind::Compaction(Compaction {
                trigger: metadata.get("trigger").and_then(Value::as_str).unwrap_or("unknown").to_owned(),
                pre_tokens,
                post_tokens,
                summary: None,
                metadata,
            });
            let logical_parent = record.get("logicalParentUuid").and_then(Value::as_str);
            let unwritten = logical_parent
                .filter(|p| !self.seen_uuids.contains(*p))
                .and_then(|p| self.unwritten_parent_tool_uses.remove(p))
                .map(|uses| {
                    // A tool use the file holds belongs to a written reply (only its result
                    // went unwritten).
                    let written = |id: &str| {
                        self.events.iter().any(|e| match &e.kind {
                            EventKind::ModelReply(reply) => reply.content.iter().any(|b| matches!(b, ContentBlock::ToolUse { id: known, .. } if known == id)),
                            _ => false,
                        })
                    };
                    uses.into_iter().filter(|(id, _)| !written(id)).collect::<Vec<_>>()
                })
                .filter(|uses| !uses.is_empty());
            if let Some(uses) = unwritten {
                // The compaction followed a reply the file never holds (its tool hooks ran):
                // the client counted that call and its results before compacting.
                let payload = serde_json::json!({
                    "parent_uuid": logical_parent,
                    "tool_uses": uses.iter().map(|(id, name)| serde_json::json!({ "id": id, "name": name })).collect::<Vec<_>>(),
                });
                self.push(EventKind::SystemEvent(SystemEvent { subtype: UNWRITTEN_REPLY.into(), payload }), time_ms, lane, None);
            }
            if self.file_lane.is_none()
                && !self.events.iter().any(|e| is_message_event(&e.kind))
                && logical_parent.is_some_and(|parent| !self.seen_uuids.contains(parent))
            {
                self.opens_with_compaction = true;
            }
            let index = self.push(kind, time_ms, lane, uuid);
            self.pending_compaction = Some(index);
            return;
        }
        let mut payload = strip_envelope(record);
        if let Value::Object(map) = &mut payload {
            map.remove("subtype");
        }
        let subtype = if subtype.is_empty() { "unknown" } else { subtype };
        self.push(EventKind::SystemEvent(SystemEvent { subtype: subtype.to_owned(), payload }), time_ms, lane, uuid);
    }

    fn totals(&self) -> UsageTotals {
        let mut totals = UsageTotals::default();
        for event in &self.events {
            if let EventKind::ModelReply(reply) = &event.kind {
                totals.add(&reply.usage, reply.is_synthetic);
            }
        }
        totals
    }

    fn add_to_report(&self, report: &mut ImportReport) {
        report.lines += self.lines;
        for (k, v) in &self.records_by_type {
            *report.records_by_type.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &self.unknown_by_type {
            *report.unknown_by_type.entry(k.clone()).or_default() += v;
        }
        report.duplicate_records += self.duplicates;
        report.chunks_merged += self.chunks_merged;
        for (k, v) in &self.not_used_by_type {
            *report.not_used_by_type.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &self.rendered_attachments {
            *report.rendered_attachments.entry(k.clone()).or_default() += v;
        }
        for w in &self.warnings.list {
            report.warnings.push(w.clone());
        }
        report.warnings.suppressed += self.warnings.suppressed;
    }
}

/// A record line's object as [`FileImporter::record`] reads it: the whole `Value` parse, or the
/// fields it reads of a record type [`reads_whole_record`] leaves to the picked parse.
enum Record<'t> {
    Whole(Map<String, Value>),
    Picked(Box<picked::Fields<'t>>),
}

impl Record<'_> {
    /// A field the importer reads as a value (of a picked record, one of `picked::VALUE_FIELDS`).
    fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Record::Whole(map) => map.get(key),
            Record::Picked(fields) => fields.get(key),
        }
    }

    /// A field that is a string.
    fn str(&self, key: &str) -> Option<&str> {
        match self {
            Record::Whole(map) => map.get(key).and_then(Value::as_str),
            Record::Picked(fields) => fields.str(key),
        }
    }

    /// A field that is a boolean.
    fn bool(&self, key: &str) -> Option<bool> {
        match self {
            Record::Whole(map) => map.get(key).and_then(Value::as_bool),
            Record::Picked(fields) => fields.bool(key),
        }
    }

    /// A field the importer reads as a value, taken (as [`Record::get`]).
    fn remove(&mut self, key: &str) -> Option<Value> {
        match self {
            Record::Whole(map) => map.remove(key),
            Record::Picked(fields) => fields.remove(key),
        }
    }

    fn contains_key(&self, key: &str) -> bool {
        match self {
            Record::Whole(map) => map.contains_key(key),
            Record::Picked(fields) => fields.has(key),
        }
    }

    /// What the record's `message` is, where it has one.
    fn message_kind(&self) -> Option<MessageKind> {
        match self {
            Record::Whole(map) => map.get("message").map(|message| match message {
                Value::Object(_) => MessageKind::Object,
                Value::Array(_) => MessageKind::Array,
                _ => MessageKind::Other,
            }),
            Record::Picked(fields) => fields.message().map(|_| MessageKind::Object),
        }
    }

    /// A field of the record's `message` (none where the message is no object). Of a picked
    /// record, one of [`picked::MESSAGE_FIELDS`] but `usage`.
    fn message_get(&self, key: &str) -> Option<&Value> {
        match self {
            Record::Whole(map) => map.get("message").and_then(|message| message.get(key)),
            Record::Picked(fields) => fields.message().and_then(|message| message.get(key)),
        }
    }

    /// The record's `message.content`, taken: a picked record's as read ([`Content`]).
    fn message_take_content(&mut self) -> Option<Content> {
        match self {
            Record::Whole(_) => self.message_take("content").map(Content::Value),
            Record::Picked(fields) => fields.message_mut().and_then(picked::Message::take_content),
        }
    }

    /// A field of the record's `message`, taken (a whole record's left null).
    fn message_take(&mut self, key: &str) -> Option<Value> {
        match self {
            Record::Whole(map) => map.get_mut("message").and_then(|message| message.get_mut(key)).map(Value::take),
            Record::Picked(fields) => fields.message_mut().and_then(|message| message.take(key)),
        }
    }

    /// The whole record, for the record types that keep it ([`reads_whole_record`]).
    fn into_whole(self) -> Map<String, Value> {
        match self {
            Record::Whole(map) => map,
            Record::Picked(fields) => panic!("a picked record read whole (reads_whole_record leaves its type out): {fields:?}"),
        }
    }
}

/// What a record's `message` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MessageKind {
    Object,
    Array,
    Other,
}

/// Whether [`FileImporter::record`] reads more of `record` (a picked parse of its line) than
/// its picked fields: the records whose payload keeps every field but the envelope's (system
/// records, queued operations, session metadata), the wire requests, and a `SessionStart` hook's
/// progress (its whole `data`). Every other type reads only [`picked::RECORD_FIELDS`].
fn reads_whole_record(record: &Record) -> bool {
    match record.str("type") {
        Some("system" | "queue-operation") => true,
        Some("progress") => {
            let data = record.get("data");
            let field = |key: &str| data.and_then(|d| d.get(key)).and_then(Value::as_str);
            field("type") == Some("hook_progress") && field("hookEvent") == Some("SessionStart")
        }
        Some(kind) => api_requests::API_REQUEST_KINDS.contains(&kind) || METADATA_TYPES.contains(&kind),
        None => false,
    }
}

fn thinking_without_text(block: &ContentBlock) -> bool {
    matches!(block, ContentBlock::Thinking { thinking, signature, .. } if thinking.is_empty() && !signature.is_empty())
}

fn strip_envelope(record: Map<String, Value>) -> Value {
    let mut map = record;
    for field in ENVELOPE_FIELDS {
        map.remove(*field);
    }
    Value::Object(map)
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::{client_wording, CLIENT_WORDED};
    use serde_json::{json, Map, Value};

    /// Every kind the replay counts as sized from the client gets the client's sentences from
    /// [`client_wording`] when its record lists something, and no other kind gets any: the one
    /// list and the renderer cannot drift apart.
    #[test]
    fn client_wording_covers_exactly_the_client_worded_kinds() {
        let Value::Object(full) = json!({
            "addedLines": ["a"], "addedNames": ["a"], "removedNames": ["b"], "addedTypes": ["t"], "removedTypes": ["u"],
            "addedBlocks": ["x"], "isInitial": true, "showConcurrencyNote": true, "content": [{"id": "1"}],
            "autoModeConsentFlow": true, "bashFirst": true,
        }) else {
            unreachable!()
        };
        for kind in CLIENT_WORDED {
            assert!(!client_wording(kind, &full).is_empty(), "{kind}: no client sentence");
        }
        for kind in ["hook_additional_context", "nested_memory", "edited_text_file", "plan_mode", "todo_reminder", ""] {
            assert!(client_wording(kind, &full).is_empty(), "{kind}: worded but not in CLIENT_WORDED");
            assert!(client_wording(kind, &Map::new()).is_empty());
        }
    }
}
