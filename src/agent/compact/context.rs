//! What the chain works on: the conversation as the agent keeps it (messages plus per-record
//! metadata), the state that persists across requests, and the per-request output.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::{ContentBlock, Message, MessageContent, Role, Usage};
use crate::measure::metrics::StageReport;
use crate::world::{Clock, VirtualFs};

use super::config::CompactConfig;
use super::context_collapse::CollapseState;
use super::microcompact::CachedMicrocompactState;
use super::session_memory::SessionMemoryState;
use super::tool_result_budget::ReplacementState;

/// What kind of record an entry is. Only `Message` and `Attachment`/`Summary` reach the wire;
/// boundaries are system records (dropped by the request builder).
#[derive(Debug, Clone, PartialEq)]
pub enum EntryKind {
    Message,
    /// A meta user message built from an attachment (`kind` names it: `file`, `invoked_skills`,
    /// `plan_file_reference`, `deferred_tools_delta`, `hook_result`, ...), shared by the
    /// entry's copies.
    Attachment { kind: std::rc::Rc<str> },
    /// The compact summary (`isCompactSummary`).
    Summary,
    /// `compact_boundary` system record with its metadata.
    CompactBoundary { trigger: CompactTrigger, pre_tokens: u64, logical_parent: Option<u64>, preserved: Option<(u64, u64, u64)> },
    /// Summary of a committed context-collapse span.
    Collapsed { span: (u64, u64) },
}

/// One record of the conversation.
///
/// The message is reached through [`Entry::message`] and [`Entry::message_mut`] so that its
/// rough token count ([`Entry::rough`]) is computed once and forgotten whenever the message
/// may have been rewritten.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    message: Message,
    pub kind: EntryKind,
    /// Stable per-session id (the reference's uuid).
    pub uuid: u64,
    pub timestamp_ms: u64,
    pub is_meta: bool,
    /// `message.id` of an assistant record (API-round grouping, sibling walk of §7.1), shared
    /// by the entry's copies and its record's meta.
    pub message_id: Option<std::rc::Rc<str>>,
    /// Usage of an assistant record (only the last sibling carries the final usage).
    pub usage: Option<Usage>,
    /// True for synthetic assistant records (API errors, interrupts): they never anchor counts.
    pub synthetic: bool,
    rough: NotValue<std::cell::Cell<Option<u64>>>,
    pristine: NotValue<bool>,
    /// The tool results `tool_result_budget` may weigh, found once per version of the message
    /// ([`Entry::budget_candidates`]) and shared by the entry's copies (a run's checkpoint).
    candidates: NotValue<std::cell::OnceCell<std::rc::Rc<[super::tool_result_budget::EntryCandidate]>>>,
    /// The run of `tool_result_budget` that last found this message settled, and the entry's
    /// position then ([`super::tool_result_budget::BudgetScan`]); forgotten with the message.
    budget_mark: NotValue<std::cell::Cell<Option<(u64, usize)>>>,
}

/// Bookkeeping an entry carries that is not part of its value: two entries that differ only
/// in it are equal, and `Debug` shows `_`. Used for whether the message is still the one the
/// entry was made with (set by [`Entry::mark_pristine`], cleared by [`Entry::message_mut`]) and
/// for the memoized rough count of the message.
#[derive(Clone, Default)]
struct NotValue<T>(T);

impl<T> PartialEq for NotValue<T> {
    fn eq(&self, _: &NotValue<T>) -> bool {
        true
    }
}

impl<T> std::fmt::Debug for NotValue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("_")
    }
}

impl Entry {
    pub fn new(message: Message, uuid: u64, timestamp_ms: u64) -> Entry {
        Entry {
            message,
            kind: EntryKind::Message,
            uuid,
            timestamp_ms,
            is_meta: false,
            message_id: None,
            usage: None,
            synthetic: false,
            rough: NotValue::default(),
            pristine: NotValue::default(),
            candidates: NotValue::default(),
            budget_mark: NotValue::default(),
        }
    }

    pub fn message(&self) -> &Message {
        &self.message
    }

    /// The message for rewriting; forgets the memoized rough count.
    pub fn message_mut(&mut self) -> &mut Message {
        self.rough.0.set(None);
        self.candidates.0.take();
        self.budget_mark.0.set(None);
        self.pristine.0 = false;
        &mut self.message
    }

    /// Notes that the message is the one its maker built (the session glue: an entry made
    /// from a transcript record); [`Entry::message_mut`] forgets it.
    pub fn mark_pristine(&mut self) {
        self.pristine.0 = true;
    }

    /// The message has not been reached mutably since [`Entry::mark_pristine`].
    pub fn is_pristine(&self) -> bool {
        self.pristine.0
    }

    pub fn into_message(self) -> Message {
        self.message
    }

    /// `roughTokenCountEstimationForMessages` of this one message, counted once per version of
    /// the message.
    pub fn rough(&self) -> u64 {
        if let Some(tokens) = self.rough.0.get() {
            return tokens;
        }
        let tokens = super::counting::rough_message(&self.message);
        self.rough.0.set(Some(tokens));
        tokens
    }

    /// The tool results of this message `tool_result_budget` may weigh (not cleared, empty,
    /// persisted or carrying media), with their sizes: found once per version of the message,
    /// so a request's budget pass reads each old result's size instead of measuring its text.
    pub fn budget_candidates(&self) -> &[super::tool_result_budget::EntryCandidate] {
        self.candidates.0.get_or_init(|| super::tool_result_budget::entry_candidates(self.blocks()).into())
    }

    /// The `tool_result_budget` run (its stamp) that found this entry settled at `position`.
    pub fn budget_mark(&self) -> Option<(u64, usize)> {
        self.budget_mark.0.get()
    }

    pub fn set_budget_mark(&self, stamp: u64, position: usize) {
        self.budget_mark.0.set(Some((stamp, position)));
    }

    /// Forgets the budget's mark: for a change of the entry's fields other than its message
    /// (its `message_id`, which groups the budget's candidates).
    pub fn forget_budget_mark(&mut self) {
        self.budget_mark.0.set(None);
    }

    pub fn is_boundary(&self) -> bool {
        matches!(self.kind, EntryKind::CompactBoundary { .. })
    }

    /// Whether the record is sent to the API.
    pub fn on_wire(&self) -> bool {
        !self.is_boundary()
    }

    pub fn blocks(&self) -> &[ContentBlock] {
        match &self.message.content {
            MessageContent::Blocks(blocks) => blocks,
            MessageContent::Text(_) => &[],
        }
    }

    pub fn tool_use_ids(&self) -> impl Iterator<Item = &str> {
        self.blocks().iter().filter_map(|b| match b {
            ContentBlock::ToolUse { id, .. } => Some(id.as_str()),
            _ => None,
        })
    }

    pub fn tool_result_ids(&self) -> impl Iterator<Item = &str> {
        self.blocks().iter().filter_map(|b| match b {
            ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id.as_str()),
            _ => None,
        })
    }

    pub fn is_assistant(&self) -> bool {
        self.message.role == Role::Assistant
    }
}

/// Who is asking: the main thread, or one of the forks that never compact themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuerySource {
    /// `repl_main_thread`.
    Main,
    /// `sdk`: not a main-thread source for microcompact or session memory.
    Sdk,
    Compact,
    SessionMemory,
}

impl QuerySource {
    pub fn is_main_thread(self) -> bool {
        self == QuerySource::Main
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactTrigger {
    Auto,
    Manual,
    Reactive,
}

impl CompactTrigger {
    pub fn as_str(self) -> &'static str {
        match self {
            CompactTrigger::Auto => "auto",
            CompactTrigger::Manual => "manual",
            CompactTrigger::Reactive => "reactive",
        }
    }
}

/// The model's limits the thresholds derive from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLimits {
    pub context_window: u64,
    pub max_output_tokens: u64,
}

/// `autoCompactTracking` of the query loop.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AutoCompactTracking {
    pub compacted: bool,
    pub turn_counter: u64,
    pub consecutive_failures: u32,
}

/// A file the agent has read (the reference's readFileState), for post-compact restoration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadFile {
    pub path: String,
    pub timestamp_ms: i64,
}

/// A skill invoked in this session, for post-compact restoration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvokedSkill {
    pub name: String,
    /// The path the client shows (`{source}:{name}`); `None` when the record names no source.
    pub path: Option<String>,
    pub content: String,
    /// When the skill was (last) invoked: the rebuild restores the most recent first.
    pub invoked_at_ms: u64,
}

/// What the session tells the rebuild about the world at compaction time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactInputs {
    pub read_files: Vec<ReadFile>,
    pub invoked_skills: Vec<InvokedSkill>,
    pub plan_path: Option<String>,
    /// Delta attachments re-announced after compaction (deferred tools, agents, MCP instructions),
    /// already rendered by the session, in the reference's order.
    pub deltas: Vec<(String, String)>,
    /// SessionStart(compact) hook outputs, already rendered.
    pub hook_results: Vec<String>,
    /// Custom instructions (user, then PreCompact hooks).
    pub custom_instructions: Option<String>,
    /// Canonical memory paths that are never restored as files.
    pub memory_paths: Vec<String>,
    /// The working directory: its CLAUDE.md and CLAUDE.local.md are never restored as files
    /// ([`super::rebuild::is_memory_file`]); `None` sets apart only `memory_paths`.
    pub cwd: Option<String>,
    /// API rounds a threshold compaction keeps verbatim after the summary (Claude Code
    /// 2.1.332 routes it through the reactive compactor, which keeps the newest round on a
    /// session's first compaction: docs/profiles.md); 0 summarizes everything (2.1.88).
    pub threshold_keeps_rounds: usize,
}

/// State that lives as long as the session, across requests.
#[derive(Debug, Clone)]
pub struct ChainState {
    /// Directory of this session's files in the virtual fs (`tool-results/`, `session-memory/`).
    pub session_dir: String,
    pub replacements: ReplacementState,
    pub tracking: AutoCompactTracking,
    pub session_memory: SessionMemoryState,
    pub collapse: CollapseState,
    pub cached_microcompact: CachedMicrocompactState,
    /// `thinkingClearLatched` (§8.6): `clear_thinking` keeps one turn until the next compaction.
    pub thinking_clear_latched: bool,
    pub next_uuid: u64,
    /// Running rough counts of the entries the session keeps for the next run (it invalidates
    /// them where its records change).
    pub rough_sums: super::counting::RoughSums,
    /// How many leading records of the owner's kept list (the session's, whose entries the
    /// kept list holds) are known to carry ascending uuids; lowered with
    /// [`ChainState::kept_changed_from`].
    pub uuids_ascending: usize,
}

impl ChainState {
    pub fn new(session_dir: impl Into<String>) -> ChainState {
        ChainState {
            session_dir: session_dir.into(),
            replacements: ReplacementState::default(),
            tracking: AutoCompactTracking::default(),
            session_memory: SessionMemoryState::default(),
            collapse: CollapseState::default(),
            cached_microcompact: CachedMicrocompactState::default(),
            thinking_clear_latched: false,
            next_uuid: 1_000_000_000,
            rough_sums: Default::default(),
            uuids_ascending: 0,
        }
    }

    /// The list of entries the owner keeps from run to run ([`ChainContext::kept_list`])
    /// changed from `index` on: a context over it changed it (`Entries::untouched` of what it
    /// left), or the owner did between contexts. Work kept across runs over that list is
    /// trusted only before the lowest such index since it was done.
    pub fn kept_changed_from(&mut self, index: usize) {
        self.replacements.scan.changed_from(index);
        self.uuids_ascending = self.uuids_ascending.min(index);
    }

    /// A fresh uuid for records the chain creates (boundaries, summaries, attachments).
    pub fn uuid(&mut self) -> u64 {
        self.next_uuid += 1;
        self.next_uuid
    }

    pub fn tool_results_dir(&self) -> String {
        format!("{}/tool-results", self.session_dir.trim_end_matches('/'))
    }

    pub fn memory_path(&self) -> String {
        format!("{}/session-memory/summary.md", self.session_dir.trim_end_matches('/'))
    }
}

/// A compaction the caller must perform: a cache-sharing fork in lane `compact`.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactionRequest {
    pub lane: &'static str,
    pub trigger: CompactTrigger,
    /// The fork's messages: the main thread's messages with the summary instruction merged into
    /// the last user message (or appended as a new one).
    pub messages: Vec<Message>,
    /// Index of the message that carries the fork's cache marker (the second-to-last).
    pub marker_index: Option<usize>,
    /// `tokenCountWithEstimation` of the history before compaction.
    pub pre_tokens: u64,
    /// 0 for the first request, then 1..=max_ptl_retries after prompt-too-long answers.
    pub ptl_attempt: u32,
    /// API-round groups removed from the fork's input so far (the oldest for a proactive
    /// compaction, the newest for a reactive one), and their rough tokens.
    pub trimmed_groups: usize,
    pub trimmed_tokens: u64,
}

/// What the caller got back for a [`CompactionRequest`].
#[derive(Debug, Clone, PartialEq)]
pub enum CompactionReply {
    /// The summary's assistant text (may itself be `Prompt is too long…`).
    Summary(String),
    /// The request failed (API error, no text).
    Failed(String),
    /// The simulated API refused the request before sampling (`prompt is too long: N tokens > M
    /// maximum`, or a media-size error); the text is the API's error.
    Refused(String),
}

/// Per-request output of the chain.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChainOutput {
    pub reports: Vec<StageReport>,
    /// Cause events for measurement, in order.
    pub events: Vec<String>,
    /// Tokens snip freed (subtracted in autocompact's and the blocking check's counts).
    pub snip_tokens_freed: u64,
    /// The count autocompact compared with its threshold, when the check was reached (a sweep
    /// reads where points with other thresholds part from this run).
    pub autocompact_checked: Option<u64>,
    /// A compaction happened in this iteration (skips the blocking-limit check).
    pub compacted: bool,
    /// A compaction waiting for its summary.
    pub pending_compaction: Option<CompactionRequest>,
    /// The request must not be sent: the synthetic error text (`Prompt is too long`).
    pub blocked: Option<String>,
    /// `cache_edits` block for cached microcompact, to put in the last user message.
    pub cache_edits: Option<Value>,
    /// Tool ids the cache edits delete.
    pub cache_edits_deleted_tool_ids: Vec<String>,
    /// Body `context_management` for API-side context editing.
    pub context_management: Option<Value>,
    /// The fork's input records behind `pending_compaction` (for prompt-too-long retries).
    pub fork_entries: Vec<Entry>,
    /// The newest API rounds a reactive compaction peeled off the fork's input, in order
    /// (dropped or re-appended after the summary: `autocompact.reactive_peeled_tail`).
    pub peeled_tail: Vec<Entry>,
}

/// The conversation a run of the chain rewrites, and how many of its leading entries are still
/// the ones it started with, at their positions ([`Entries::untouched`]): the session then
/// knows, without comparing, which records the run left as they were.
///
/// Reading is free (it dereferences to the list). Every way of changing it lowers the count:
/// the precise ways ([`Entries::entry_mut`], [`Entries::push`], [`Entries::truncate`],
/// [`Entries::drain`], [`Entries::splice`]) to the first position they change, any other (the list reached mutably through `DerefMut`) to zero. So
/// the count is never too high, whatever a stage does: a stage that changes the list another
/// way only costs the session a comparison of every record.
#[derive(Debug, Clone, Default)]
pub struct Entries {
    list: Vec<Entry>,
    untouched: usize,
}

impl Entries {
    /// `list`, none of it changed yet.
    pub fn new(list: Vec<Entry>) -> Entries {
        let untouched = list.len();
        Entries { list, untouched }
    }

    /// How many leading entries are the ones the list started with, unchanged and in place.
    pub fn untouched(&self) -> usize {
        self.untouched.min(self.list.len())
    }

    pub fn into_vec(self) -> Vec<Entry> {
        self.list
    }

    /// The entry at `index`, to change.
    pub fn entry_mut(&mut self, index: usize) -> &mut Entry {
        self.untouched = self.untouched.min(index);
        &mut self.list[index]
    }

    pub fn push(&mut self, entry: Entry) {
        self.untouched = self.untouched.min(self.list.len());
        self.list.push(entry);
    }

    pub fn truncate(&mut self, len: usize) {
        self.untouched = self.untouched.min(len);
        self.list.truncate(len);
    }

    /// Removes `range`.
    pub fn drain(&mut self, range: std::ops::Range<usize>) -> std::vec::Drain<'_, Entry> {
        self.untouched = self.untouched.min(range.start);
        self.list.drain(range)
    }

    /// Replaces `range` with `with`.
    pub fn splice<I: IntoIterator<Item = Entry>>(&mut self, range: std::ops::Range<usize>, with: I) {
        self.untouched = self.untouched.min(range.start);
        self.list.splice(range, with);
    }

    /// The list replaced by `list`: nothing of it is the old one's.
    pub fn replace(&mut self, list: Vec<Entry>) -> Vec<Entry> {
        self.untouched = 0;
        std::mem::replace(&mut self.list, list)
    }
}

/// Two lists of the same entries are equal, whatever each went through.
impl PartialEq for Entries {
    fn eq(&self, other: &Entries) -> bool {
        self.list == other.list
    }
}

impl std::ops::Deref for Entries {
    type Target = Vec<Entry>;

    fn deref(&self) -> &Vec<Entry> {
        &self.list
    }
}

impl<'e> IntoIterator for &'e Entries {
    type Item = &'e Entry;
    type IntoIter = std::slice::Iter<'e, Entry>;

    fn into_iter(self) -> Self::IntoIter {
        self.list.iter()
    }
}

/// Any change other than the precise ones: the whole list counts as touched.
impl std::ops::DerefMut for Entries {
    fn deref_mut(&mut self) -> &mut Vec<Entry> {
        self.untouched = 0;
        &mut self.list
    }
}

/// Everything one run of the chain needs. Owned conversation, borrowed world and state.
pub struct ChainContext<'a> {
    /// The conversation from the last compact boundary on (the loop's `messagesForQuery`);
    /// rewritten in place and flowing forward to the next request. It notes the first
    /// position a stage may have changed ([`Entries::untouched`]).
    pub entries: Entries,
    pub state: &'a mut ChainState,
    pub config: &'a CompactConfig,
    pub fs: &'a mut VirtualFs,
    pub clock: &'a Clock,
    pub limits: ModelLimits,
    pub source: QuerySource,
    /// Messages the request builder puts before `entries` (the user-context reminder), so
    /// reported positions match the wire.
    pub message_offset: usize,
    pub inputs: CompactInputs,
    pub output: ChainOutput,
    /// [`super::counting::rough_entries`] of `entries`, when whoever set it counted them and
    /// nothing changed them since: the caller before the chain runs, the chain between stages
    /// ([`ChainContext::rough_total`] takes it).
    pub rough_known: Option<u64>,
    /// Whether the entries are the list the state's owner keeps from run to run, whose every
    /// change the owner reports ([`ChainState::kept_changed_from`]: what each context over it
    /// left untouched, and its own changes between them). `false` (the default): a list made
    /// for this context. A stage that keeps work across runs over the kept list trusts the
    /// entries no change was reported for without reading them
    /// ([`super::tool_result_budget::BudgetScan`]); an unreported change could be missed
    /// (debug builds read them anyway and compare).
    pub kept_list: bool,
}

impl<'a> ChainContext<'a> {
    pub fn new(
        entries: Vec<Entry>,
        state: &'a mut ChainState,
        config: &'a CompactConfig,
        fs: &'a mut VirtualFs,
        clock: &'a Clock,
        limits: ModelLimits,
    ) -> ChainContext<'a> {
        ChainContext {
            entries: Entries::new(entries),
            state,
            config,
            fs,
            clock,
            limits,
            source: QuerySource::Main,
            message_offset: 0,
            inputs: CompactInputs::default(),
            output: ChainOutput::default(),
            rough_known: None,
            kept_list: false,
        }
    }

    /// [`super::counting::rough_entries`] of the entries, taking the count known before
    /// ([`ChainContext::rough_known`]) where there is one: a stage reads it once, before it
    /// changes anything.
    pub fn rough_total(&mut self) -> u64 {
        match self.rough_known.take() {
            Some(tokens) => {
                debug_assert_eq!(tokens, super::counting::rough_entries(&self.entries), "the known rough count is stale");
                tokens
            }
            None => super::counting::rough_entries(&self.entries),
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The messages as they go on the wire (boundaries dropped).
    pub fn wire_messages(&self) -> Vec<Message> {
        self.entries.iter().filter(|e| e.on_wire()).map(|e| e.message().clone()).collect()
    }

    /// Tool names by tool_use_id, from the assistant records (ordered map: no hash order leaks).
    pub fn tool_names(&self) -> BTreeMap<String, String> {
        tool_names(&self.entries)
    }

    /// The wire path (`messages[k].content[l]`) of block `block` of entry `index`.
    pub fn wire_path(&self, index: usize, block: Option<usize>) -> String {
        let wire = self.entries[..index].iter().filter(|e| e.on_wire()).count() + self.message_offset;
        match block {
            Some(b) => format!("messages[{wire}].content[{b}]"),
            None => format!("messages[{wire}]"),
        }
    }

    pub fn event(&mut self, name: &str) {
        self.output.events.push(name.to_owned());
    }
}

pub fn tool_names(entries: &[Entry]) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for entry in entries {
        for block in entry.blocks() {
            if let ContentBlock::ToolUse { id, name, .. } = block {
                names.insert(id.clone(), name.clone());
            }
        }
    }
    names
}
