//! The long-context chain (layer 6) run from the session before each main-thread request.
//!
//! The session keeps its transcript as [`Record`]s; the chain works on [`Entry`]s (a message
//! plus uuid, timestamp, message id and usage). Before a request the records become entries,
//! the chain runs (tool result budget, snip, microcompact, context collapse, autocompact with
//! session-memory compaction first, blocking limit), compaction requests are sent in lane
//! `compact` as cache-sharing forks of the main request, and the entries become records again.
//! Attachments the chain kept come back as the attachment records they were (matched by uuid);
//! what compaction rebuilt (summary, restored files, skills, deltas) comes back as meta user
//! messages. Boundaries are dropped: the session's transcript starts after the last one.

use std::collections::BTreeMap;

use crate::agent::compact::chain::summary_reply;
use crate::agent::compact::context::{CompactInputs, InvokedSkill as CompactSkill, ReadFile};
use crate::agent::compact::generator::synthetic_summary;
use crate::agent::compact::{Chain, ChainStep, CompactionReply, Entry, EntryKind, ModelLimits, QuerySource};
use crate::agent::compact::autocompact::summary_instruction;
use crate::agent::compact::recovery::{RecoveryAction, RecoveryState, is_media_size_error, on_media_too_large, on_prompt_too_long, strip_oversized_media};
use crate::agent::compact::session_memory::{TEMPLATE, extraction_request, finish_extraction, should_extract};
use crate::agent::attachments::Attachment;
use crate::agent::normalize::Record;
use crate::api::{CacheControl, CacheTtl, ContentBlock, Message, MessageContent, Request, Role, Usage};
use crate::measure::StageReport;
use crate::world::{Reply, World};

use super::{ModelCalls, Session};

/// What of a world decides where a session's autocompact fires: the model (a `[1m]` model has
/// a 1M window), the scenario's window and output limit, and the env the session applies over
/// its strategy ([`Session::new`]). One computation for the agent's own thresholds and for
/// whoever must know them before a run (the what-ifs on real sessions,
/// [`crate::replay::agent_whatif`]).
#[derive(Debug, Clone, Copy)]
pub struct ThresholdWorld<'w> {
    pub model_id: &'w str,
    pub context_window: Option<u64>,
    pub max_output_tokens: Option<u64>,
    pub env: &'w BTreeMap<String, String>,
}

impl<'w> ThresholdWorld<'w> {
    pub fn of(world: &'w World) -> ThresholdWorld<'w> {
        ThresholdWorld { model_id: &world.model_id, context_window: world.context_window, max_output_tokens: world.max_output_tokens, env: &world.env }
    }

    /// `strategy` as a session of this world runs under it: the env applied over it (a bad
    /// number keeps the strategy's value; the env was validated with the scenario).
    pub fn strategy(&self, strategy: &crate::strategy::Strategy) -> crate::strategy::Strategy {
        let mut strategy = strategy.clone();
        let _ = strategy.apply_env(self.env);
        strategy
    }

    /// [`Self::strategy`] without a copy where the env names none of the variables
    /// [`crate::strategy::Strategy::apply_env`] reads ([`crate::strategy::ENV_VARS`]): then it
    /// is `strategy` itself (debug builds apply the env and compare).
    pub fn applied<'s>(&self, strategy: &'s crate::strategy::Strategy) -> std::borrow::Cow<'s, crate::strategy::Strategy> {
        if self.env.keys().any(|name| crate::strategy::ENV_VARS.contains(&name.as_str())) {
            return std::borrow::Cow::Owned(self.strategy(strategy));
        }
        debug_assert!(serde_json::to_value(self.strategy(strategy)).ok() == serde_json::to_value(strategy).ok(), "an env naming no variable the strategy reads changed it");
        std::borrow::Cow::Borrowed(strategy)
    }

    /// The autocompact knobs of `strategy` as a session of this world runs under it: those of
    /// [`Self::strategy`], without copying the rest of the strategy (debug builds compare).
    fn autocompact(&self, strategy: &crate::strategy::Strategy) -> crate::agent::compact::config::AutocompactConfig {
        let mut auto = strategy.compact.autocompact.clone();
        if crate::strategy::Strategy::env_reaches_compact(self.env) {
            auto.apply_env(self.env);
        }
        debug_assert_eq!(auto, self.strategy(strategy).compact.autocompact, "the autocompact knobs applied alone differ");
        auto
    }

    /// The model limits of a session under `applied` (a strategy this world's env is applied to).
    pub fn limits(&self, applied: &crate::strategy::Strategy) -> ModelLimits {
        self.limits_under(&applied.compact.autocompact)
    }

    /// [`Self::limits`] of a strategy whose applied autocompact knobs are `auto`.
    fn limits_under(&self, auto: &crate::agent::compact::config::AutocompactConfig) -> ModelLimits {
        let context_window = auto.context_window.or(self.context_window).unwrap_or(if self.model_id.contains("[1m]") { 1_000_000 } else { 200_000 });
        ModelLimits { context_window, max_output_tokens: self.max_output_tokens.unwrap_or(32_000) }
    }

    /// The thresholds a session of this world checks against under `strategy`.
    pub fn thresholds(&self, strategy: &crate::strategy::Strategy) -> crate::agent::compact::counting::Thresholds {
        let auto = self.autocompact(strategy);
        crate::agent::compact::counting::Thresholds::of_autocompact(self.limits_under(&auto), &auto, crate::agent::compact::config::DEFAULT_OUTPUT_RESERVE)
    }

    /// Whether the runner refuses a run under `strategy` here ([`crate::runner::check_strategy_for`]).
    pub fn refuses(&self, strategy: &crate::strategy::Strategy) -> bool {
        crate::runner::check_strategy_for(self.limits_under(&self.autocompact(strategy)), strategy).is_err()
    }

    /// The one decision of which strategies differ only in where autocompact fires: a content
    /// hash of `strategy` as a session of this world runs under it, with its name and the knobs
    /// that only move the autocompact threshold (`buffer_tokens`, the PCT override) cleared.
    /// Strategies with one family make the same run up to their first autocompact check the two
    /// thresholds decide differently, so one may go on from the other's checkpoint
    /// ([`Session::retarget_autocompact`] refuses any other).
    pub fn autocompact_family(&self, strategy: &crate::strategy::Strategy) -> String {
        let mut normal = self.strategy(strategy);
        normal.name = String::new();
        normal.compact.autocompact.buffer_tokens = 0;
        normal.compact.autocompact.pct_override = None;
        normal.content_key("")
    }
}

/// Per-record bookkeeping the chain needs, parallel to the session's records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordMeta {
    pub uuid: u64,
    pub timestamp_ms: u64,
    /// Shared with the record's entries (a copy is a reference count).
    pub message_id: Option<std::rc::Rc<str>>,
    pub usage: Option<Usage>,
}

/// What one run of the chain did before a main-thread request.
#[derive(Debug, Clone, Default)]
pub struct ChainRun {
    pub reports: Vec<StageReport>,
    pub events: Vec<String>,
    /// The blocking limit stopped the turn: the request must not be sent.
    pub blocked: Option<String>,
    pub compacted: bool,
    /// `cache_edits` block to insert (cached microcompact) and `context_management` edits.
    pub cache_edits: Option<serde_json::Value>,
    pub context_management: Option<serde_json::Value>,
    /// The thinking-clear latch is on: `clear_thinking` keeps one turn.
    pub thinking_clear_latched: bool,
    /// The count autocompact compared with its threshold, when the check was reached.
    pub autocompact_checked: Option<u64>,
}

/// What the simulated API did with a fork.
#[derive(Debug, Clone)]
pub enum ForkAnswer {
    /// Refused before sampling: the API's error text (`prompt is too long: N tokens > M maximum`).
    Refused(String),
    Answered(Reply),
}

/// A request the chain made on another lane, with the reply it got.
#[derive(Debug, Clone)]
pub struct SideCall {
    pub lane: String,
    pub request: Request,
    pub reply: Reply,
    pub time_ms: u64,
    /// The call runs alongside the conversation (a prefetch): the clock does not wait for it.
    pub concurrent: bool,
}

fn record_to_entry(record: &Record, meta: &RecordMeta) -> Entry {
    record_to_entry_rendered(record, meta, None)
}

/// [`record_to_entry`], with `rendered` (when given) as the attachment's render: a content
/// an entry made from the same record before had.
fn record_to_entry_rendered(record: &Record, meta: &RecordMeta, rendered: Option<MessageContent>) -> Entry {
    let (message, kind, is_meta) = match record {
        Record::User { content, meta } => (Message { role: Role::User, content: content.clone(), extra: Default::default() }, EntryKind::Message, *meta),
        Record::Assistant { content } => {
            (Message { role: Role::Assistant, content: MessageContent::Blocks(content.clone()), extra: Default::default() }, EntryKind::Message, false)
        }
        Record::Attachment { attachment, .. } => {
            let message = match rendered {
                Some(content) => Message { role: Role::User, content, extra: Default::default() },
                None => Message::user_blocks(attachment.render()),
            };
            (message, EntryKind::Attachment { kind: attachment.kind().into() }, true)
        }
    };
    let mut entry = Entry::new(message, meta.uuid, meta.timestamp_ms);
    entry.kind = kind;
    entry.is_meta = is_meta;
    entry.message_id = meta.message_id.clone();
    entry.usage = meta.usage.clone();
    entry.mark_pristine();
    entry
}

/// The chain's entries kept for the next run ([`Session::entries`]): for `records[..n]`, each
/// what [`record_to_entry`] makes of its record and meta, with what the runs found about its
/// message (rough count, the budget's candidates and mark).
///
/// A copy (a run's checkpoint, most of which no run ever goes on from) keeps of them only the
/// budget's marks (which the copy's budget scan reads) and the attachments' renders (rendering
/// one again costs more than the rest of its entry), not the 320-byte entries: the copy's
/// first run makes its entries again from the records, which are the copy's own, and finds
/// again what else it asks of them (little: its chain state's running counts are the copy's
/// too). Debug builds keep the entries too and compare.
#[derive(Debug, Default)]
pub(crate) struct EntryCache {
    entries: Vec<Entry>,
    /// A copy's (`entries` is then empty).
    copy: Option<CopiedEntries>,
}

/// What a copy of an [`EntryCache`] keeps.
#[derive(Debug, Clone)]
struct CopiedEntries {
    /// How many leading records the copied entries were of.
    len: usize,
    /// Their budget marks ([`Entry::budget_mark`]).
    marks: Vec<Option<(u64, usize)>>,
    /// The attachments' renders among them, by position.
    rendered: Vec<(usize, MessageContent)>,
    #[cfg(debug_assertions)]
    entries: Vec<Entry>,
}

impl Clone for EntryCache {
    fn clone(&self) -> Self {
        let copy = if self.entries.is_empty() {
            self.copy.clone()
        } else {
            let rendered = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, entry)| matches!(entry.kind, EntryKind::Attachment { .. }))
                .map(|(i, entry)| (i, entry.message().content.clone()))
                .collect();
            Some(CopiedEntries {
                len: self.entries.len(),
                marks: self.entries.iter().map(Entry::budget_mark).collect(),
                rendered,
                #[cfg(debug_assertions)]
                entries: self.entries.clone(),
            })
        };
        EntryCache { entries: Vec::new(), copy }
    }
}

impl EntryCache {
    /// How many leading records the kept entries are of.
    fn len(&self) -> usize {
        self.copy.as_ref().map_or(self.entries.len(), |copy| copy.len)
    }

    /// The kept entries, taken (the cache is left empty): made again from `records` (with
    /// their `metas`) where this is a copy.
    fn take(&mut self, records: &[Record], metas: &[RecordMeta]) -> Vec<Entry> {
        let Some(copy) = self.copy.take() else { return std::mem::take(&mut self.entries) };
        let n = copy.len.min(records.len()).min(metas.len());
        // (Room for the records appended since, which the run makes entries of, and for those
        // the next turns append: made exactly, the list would be copied to grow at the run's
        // first turn.)
        let mut entries = Vec::with_capacity(room_for(records.len()));
        let mut rendered = copy.rendered.into_iter().peekable();
        for (i, (record, meta)) in records[..n].iter().zip(&metas[..n]).enumerate() {
            let content = rendered.next_if(|(at, _)| *at == i).map(|(_, content)| content);
            let entry = record_to_entry_rendered(record, meta, content);
            if let Some(&Some((stamp, position))) = copy.marks.get(i) {
                entry.set_budget_mark(stamp, position);
            }
            entries.push(entry);
        }
        #[cfg(debug_assertions)]
        debug_assert!(
            entries.len() == copy.entries.len().min(n)
                && entries.iter().zip(&copy.entries).all(|(made, copied)| made == copied && made.budget_mark() == copied.budget_mark()),
            "an entry made again from its record is not the one the copy was made of"
        );
        entries
    }

    /// The reply of record `index` got `usage` and `message_id` (its meta's message id was
    /// `before`): its kept entry takes them, and forgets its budget mark with another id.
    fn note_usage(&mut self, index: usize, before: Option<&str>, usage: &Usage, message_id: &std::rc::Rc<str>) {
        let changed = before != Some(&**message_id);
        if let Some(entry) = self.entries.get_mut(index) {
            if changed {
                entry.forget_budget_mark();
            }
            entry.usage = Some(usage.clone());
            entry.message_id = Some(message_id.clone());
        }
        if let Some(copy) = self.copy.as_mut() {
            if changed && let Some(mark) = copy.marks.get_mut(index) {
                *mark = None;
            }
            #[cfg(debug_assertions)]
            if let Some(entry) = copy.entries.get_mut(index) {
                if changed {
                    entry.forget_budget_mark();
                }
                entry.usage = Some(usage.clone());
                entry.message_id = Some(message_id.clone());
            }
        }
    }

    fn clear(&mut self) {
        *self = EntryCache::default();
    }

    /// Keeps `entries`, those of the first records.
    fn set(&mut self, entries: Vec<Entry>) {
        *self = EntryCache { entries, copy: None };
    }
}

/// Whether `entry`, still pristine, is what [`record_to_entry`] makes of `record` under the
/// entry's own meta: then the record is what [`entry_to_record`] would give back, and the entry
/// is what the next run would make of it.
#[inline]
fn made_from(entry: &Entry, record: &Record) -> bool {
    if !entry.is_pristine() || entry.synthetic {
        return false;
    }
    match (record, &entry.kind) {
        (Record::User { meta, .. }, EntryKind::Message) => entry.is_meta == *meta,
        (Record::Assistant { .. }, EntryKind::Message) => !entry.is_meta,
        (Record::Attachment { attachment, .. }, EntryKind::Attachment { kind }) => entry.is_meta && &**kind == attachment.kind(),
        _ => false,
    }
}

fn meta_of(entry: &Entry) -> RecordMeta {
    RecordMeta { uuid: entry.uuid, timestamp_ms: entry.timestamp_ms, message_id: entry.message_id.clone(), usage: entry.usage.clone() }
}

/// The record an entry becomes: a kept attachment as it was (`original`, the record the
/// entry's uuid had), everything else by role.
fn entry_to_record(entry: &Entry, original: Option<&Record>) -> Record {
    match (&entry.kind, original) {
        (EntryKind::Attachment { .. }, Some(original @ Record::Attachment { .. })) => original.clone(),
        // An attachment the compaction rebuilt: it bubbles like any attachment (§5.9), a
        // restored file as its Read call (a string message) and its result.
        (EntryKind::Attachment { kind }, _) => {
            let mut texts: Vec<crate::api::SharedText> = entry.message().content.to_blocks().into_iter().filter_map(|b| match b {
                ContentBlock::Text { text, .. } => Some(text),
                _ => None,
            }).collect();
            let call = (&**kind == "file" && texts.len() == 2).then(|| texts.remove(0));
            Record::Attachment { attachment: Attachment::PostCompact { call, texts }.into(), in_loop: false }
        }
        _ => match entry.message().role {
            // The entry's list itself when it has one (the record's, through the chain).
            Role::Assistant => Record::Assistant {
                content: match &entry.message().content {
                    MessageContent::Blocks(blocks) => blocks.clone(),
                    MessageContent::Text(_) => entry.message().content.to_blocks().into(),
                },
            },
            Role::User | Role::System => Record::User { content: entry.message().content.clone(), meta: entry.is_meta },
        },
    }
}

/// The position of each uuid among the metas of a run's records (the last, when several carry
/// one: what a map collected from them in order holds). The session hands uuids out in order,
/// so they ascend unless a compaction kept older records after newer ones; then the metas are
/// searched in place and nothing is built (a map of every record, made and dropped by every
/// request, cost a growing conversation more than its chain's stages did).
enum UuidIndex {
    /// The first `len` metas (those it was made from) ascend.
    Ascending { len: usize },
    Map(BTreeMap<u64, usize>),
}

impl UuidIndex {
    /// The index of `metas`, of which the first `known` are known to ascend (only the rest is
    /// read; debug builds read them all).
    fn new(metas: &[RecordMeta], known: usize) -> UuidIndex {
        let ascend = |metas: &[RecordMeta]| metas.windows(2).all(|pair| pair[0].uuid < pair[1].uuid);
        let ascending = ascend(&metas[known.min(metas.len()).saturating_sub(1)..]);
        debug_assert!(!ascending || ascend(metas), "metas counted as ascending do not ascend ({known} counted)");
        if ascending {
            UuidIndex::Ascending { len: metas.len() }
        } else {
            UuidIndex::Map(metas.iter().enumerate().map(|(j, m)| (m.uuid, j)).collect())
        }
    }

    /// Where `uuid` is among `metas`, the metas the index was made from.
    fn get(&self, metas: &[RecordMeta], uuid: u64) -> Option<usize> {
        match self {
            UuidIndex::Ascending { len } => metas[..metas.len().min(*len)].binary_search_by_key(&uuid, |m| m.uuid).ok(),
            UuidIndex::Map(map) => map.get(&uuid).copied(),
        }
    }

    /// Whether every meta has a uuid of its own.
    fn unique(&self, metas: &[RecordMeta]) -> bool {
        match self {
            UuidIndex::Ascending { len } => *len == metas.len(),
            UuidIndex::Map(map) => map.len() == metas.len(),
        }
    }
}

/// Whether `entry` is what [`record_to_entry`] made of `record` with its `meta`, left as it
/// was: then it becomes `record` again. The cheap tests first: this runs on every entry of the
/// conversation per request.
#[inline]
fn as_made_of(entry: &Entry, record: &Record, meta: &RecordMeta) -> bool {
    meta.uuid == entry.uuid
        && entry.is_pristine()
        && meta.timestamp_ms == entry.timestamp_ms
        && !entry.is_boundary()
        && made_from(entry, record)
        && meta.message_id == entry.message_id
        && meta.usage == entry.usage
}

/// Entries back to records (boundaries dropped), copying: `records` are the records the
/// entries' uuids were made from, with their `metas` (`index`: uuid → position).
fn entries_to_records(entries: &[Entry], records: &[Record], metas: &[RecordMeta], index: &UuidIndex) -> (Vec<Record>, Vec<RecordMeta>) {
    entries
        .iter()
        .filter(|entry| !entry.is_boundary())
        .map(|entry| (entry_to_record(entry, index.get(metas, entry.uuid).map(|j| &records[j])), meta_of(entry)))
        .unzip()
}

/// What the chain left, as the session's records, their metas and the entries the next run
/// starts from (each equal to [`record_to_entry`] of its record), and how many leading records
/// are the ones the run started from, unchanged and in place. `records` are the records the
/// run started from, moved into the result where the chain left their entry as it made it; the
/// others are copied from their entry, and only their entries are made again.
///
/// `untouched`: how many leading entries the run left as it got them, each the entry of the
/// record at its position (the chain's [`crate::agent::compact::Entries::untouched`]). They
/// are not compared again (debug builds check them); a count too low only costs comparing the
/// entries after it.
fn entries_into_records(
    entries: Vec<Entry>,
    records: Vec<Record>,
    metas: Vec<RecordMeta>,
    index: &UuidIndex,
    untouched: usize,
) -> (Vec<Record>, Vec<RecordMeta>, Vec<Entry>, usize) {
    // The leading entries the chain left as they were made from the record at their own
    // position, with that record's meta: records, metas and entries stay where they are (a
    // request's run changes the tail, so this is most of the conversation). A record whose
    // uuid several entries carry is copied for each, never moved (`uses`), so such a record
    // ends them too.
    let as_made = |i: usize, entry: &Entry| as_made_of(entry, &records[i], &metas[i]);
    // `index` was made from `metas`. With every uuid once, an entry whose uuid is its own
    // position's is that record's without a lookup, and no other leading entry carries it: the
    // leading entries are found first and only the entries after them are looked up.
    let unique = index.unique(&metas);
    let source_of = |i: usize, entry: &Entry| {
        let source = if unique && metas.get(i).is_some_and(|m| m.uuid == entry.uuid) { Some(i) } else { index.get(&metas, entry.uuid) };
        debug_assert_eq!(source, index.get(&metas, entry.uuid));
        source
    };
    let (prefix, sources) = if unique {
        let known = untouched.min(entries.len()).min(records.len()).min(metas.len());
        debug_assert!(
            entries[..known].iter().zip(&records).zip(&metas).all(|((entry, record), meta)| as_made_of(entry, record, meta)),
            "an entry the chain left untouched is not its record's as made"
        );
        let leading = known
            + entries[known..].iter().zip(&records[known..]).zip(&metas[known..]).take_while(|&((entry, record), meta)| as_made_of(entry, record, meta)).count();
        let after: Vec<Option<usize>> = entries[leading..].iter().enumerate().map(|(k, entry)| source_of(leading + k, entry)).collect();
        let prefix = after.iter().flatten().copied().filter(|&j| j < leading).min().unwrap_or(leading);
        (prefix, (prefix..leading).map(Some).chain(after).collect::<Vec<_>>())
    } else {
        let sources: Vec<Option<usize>> = entries.iter().enumerate().map(|(i, entry)| source_of(i, entry)).collect();
        let mut uses = vec![0u32; records.len()];
        for &j in sources.iter().flatten() {
            uses[j] += 1;
        }
        let prefix = sources.iter().enumerate().take_while(|&(i, &source)| source == Some(i) && uses[i] == 1 && as_made(i, &entries[i])).count();
        (prefix, sources[prefix..].to_vec())
    };
    // The sources of the entries from `prefix` on, and how many of them carry each record
    // from `prefix` on (an earlier record is never moved: it is not in `rest`).
    let mut uses = vec![0u32; records.len().saturating_sub(prefix)];
    for &j in sources.iter().flatten() {
        if let Some(k) = j.checked_sub(prefix) {
            uses[k] += 1;
        }
    }
    let (mut out, mut metas, mut next, mut entries) = (records, metas, entries, Vec::new());
    entries.extend(next.drain(prefix..));
    metas.truncate(prefix);
    let mut rest: Vec<Option<Record>> = out.drain(prefix..).map(Some).collect();
    let kept = prefix + entries.iter().filter(|entry| !entry.is_boundary()).count();
    // Room for the records the next turn appends: made with `kept` exactly, the session's next
    // push (a record, its meta, the next run's entries) would copy the whole list to grow it,
    // on every request.
    make_room(&mut out, kept);
    make_room(&mut metas, kept);
    make_room(&mut next, kept);
    let mut unchanged = prefix;
    for (entry, source) in entries.into_iter().zip(sources) {
        if entry.is_boundary() {
            continue;
        }
        let meta = meta_of(&entry);
        // Records before `prefix` are each its own entry's (used once): no later entry has one.
        let slot = |j: usize| j.checked_sub(prefix);
        let reusable = source.filter(|&j| slot(j).is_some_and(|k| uses[k] == 1 && rest[k].as_ref().is_some_and(|record| made_from(&entry, record))));
        if let Some(record) = reusable.and_then(|j| rest[j - prefix].take()) {
            if reusable == Some(out.len()) && unchanged == out.len() {
                unchanged += 1;
            }
            out.push(record);
            next.push(entry);
        } else {
            let record = entry_to_record(&entry, source.and_then(slot).and_then(|k| rest[k].as_ref()));
            next.push(record_to_entry(&record, &meta));
            out.push(record);
        }
        metas.push(meta);
    }
    (out, metas, next, unchanged)
}

/// The room a list of the session's records (or their metas, or entries) is given for `kept`
/// of them: what the next turns append goes in without copying the list.
fn room_for(kept: usize) -> usize {
    kept + kept / 8 + 32
}

/// Gives `list`, which will hold `kept` items, [`room_for`] them where it has no room left for
/// a turn's records ([`NEXT_TURN`]); a list with that room is left as it is (one made with room
/// by [`EntryCache::take`] is not grown, which would copy it, at its run's first turns).
fn make_room<T>(list: &mut Vec<T>, kept: usize) {
    if list.capacity() < kept + NEXT_TURN {
        list.reserve(room_for(kept).saturating_sub(list.len()));
    }
}

/// The records a turn appends, as [`make_room`] counts them: its prompt, replies, tool results
/// and attachments.
const NEXT_TURN: usize = 16;

/// Moves the single message marker to the last block of message `index` (or drops it).
fn place_marker(messages: &mut [Message], index: Option<usize>, marker: Option<CacheControl>) {
    let marked = |block: &ContentBlock| match block {
        ContentBlock::Other(serde_json::Value::Object(map)) => map.contains_key("cache_control"),
        ContentBlock::FinalToolResult { cache_control, .. } => cache_control.is_some(),
        _ => block.cache_control().is_some(),
    };
    for message in messages.iter_mut() {
        // Only a list with a marker is written to: a change copies blocks another body holds.
        if let MessageContent::Blocks(blocks) = &mut message.content
            && blocks.iter().any(marked)
        {
            for block in blocks.iter_mut() {
                // Normalized tool_results are finalized (client key order; or raw values): their
                // marker is not a block's. Left in place, the compaction fork carried two message
                // markers where the real client sends one (real-client conformance test).
                if !block.set_cache_control(None) {
                    match block {
                        ContentBlock::Other(serde_json::Value::Object(map)) => {
                            map.remove("cache_control");
                        }
                        ContentBlock::FinalToolResult { cache_control, .. } => *cache_control = None,
                        _ => {}
                    }
                }
            }
        }
    }
    let (Some(i), Some(marker)) = (index, marker) else { return };
    let Some(message) = messages.get_mut(i) else { return };
    let thinking = match &message.content {
        MessageContent::Blocks(blocks) => blocks.last().is_none_or(ContentBlock::is_thinking),
        MessageContent::Text(_) => false,
    };
    if !thinking && let Some(last) = message.content.blocks_mut().last_mut() {
        last.set_cache_control(Some(marker));
    }
}

impl Session {
    /// Brings the chain bookkeeping up to date with records appended since the last call.
    pub(crate) fn sync_meta(&mut self, now_ms: u64) {
        while self.record_meta.len() < self.records.len() {
            let uuid = self.chain_state.uuid();
            self.record_meta.push(RecordMeta { uuid, timestamp_ms: now_ms, ..RecordMeta::default() });
        }
    }

    /// The records as chain entries: those the last run left (kept in step with the records,
    /// their rough counts memoized) and the records appended since, made now.
    fn entries(&mut self) -> Vec<Entry> {
        let mut entries = self.entry_cache.take(&self.records, &self.record_meta);
        self.chain_state.kept_changed_from(self.records.len());
        entries.truncate(self.records.len());
        let start = entries.len();
        entries.extend(self.records[start..].iter().zip(&self.record_meta[start..]).map(|(r, m)| record_to_entry(r, m)));
        entries
    }

    /// Forgets the entries kept for the next run (the records changed other than by appending).
    pub(crate) fn forget_entries(&mut self) {
        self.entry_cache.clear();
        self.chain_state.kept_changed_from(0);
        self.chain_state.rough_sums.clear();
        self.message_memo.clear();
    }

    /// Notes the usage the API reported for the last reply (the chain's token counting
    /// anchors on it).
    pub fn note_usage(&mut self, usage: Usage, message_id: String, now_ms: u64) {
        self.sync_meta(now_ms);
        if let Some(i) = self.records.iter().rposition(|r| matches!(r, Record::Assistant { .. })) {
            // (A copy's entry is made again from the record's meta, changed below.)
            if i < self.entry_cache.len() {
                self.chain_state.kept_changed_from(i);
            }
            let message_id: std::rc::Rc<str> = message_id.into();
            self.entry_cache.note_usage(i, self.record_meta[i].message_id.as_deref(), &usage, &message_id);
            self.record_meta[i].usage = Some(usage);
            self.record_meta[i].message_id = Some(message_id);
        }
        self.chain_state.cached_microcompact.mark_sent();
    }

    pub fn model_limits(&self, world: &World) -> ModelLimits {
        ThresholdWorld::of(world).limits(&self.strategy)
    }

    /// The autocompact threshold the chain checks against under `strategy` (the scenario's env
    /// applied over it, as [`Session::new`] does), with this session's limits.
    pub fn autocompact_threshold_under(&self, strategy: &crate::strategy::Strategy, world: &World) -> u64 {
        ThresholdWorld::of(world).thresholds(strategy).autocompact
    }

    /// Goes on under `strategy`, which may differ from the session's own only in the knobs that
    /// move the autocompact threshold (`buffer_tokens`, the PCT override) and the name: the same
    /// [`ThresholdWorld::autocompact_family`]. A run checkpointed before the first autocompact
    /// check the two thresholds decide differently goes on as a run under `strategy` from the
    /// start would have. Any other difference is refused.
    pub fn retarget_autocompact(&mut self, strategy: &crate::strategy::Strategy, world: &World) -> Result<(), String> {
        self.autocompact_retargetable(strategy, world)?;
        self.strategy = ThresholdWorld::of(world).strategy(strategy);
        self.probe_peers(false);
        Ok(())
    }

    /// Whether [`Session::retarget_autocompact`] takes `strategy`: the same
    /// [`ThresholdWorld::autocompact_family`] as the session's own.
    pub fn autocompact_retargetable(&self, strategy: &crate::strategy::Strategy, world: &World) -> Result<(), String> {
        let limits = ThresholdWorld::of(world);
        if limits.autocompact_family(strategy) != limits.autocompact_family(&self.strategy) {
            return Err("the strategy differs from the session's in more than the autocompact threshold".to_owned());
        }
        Ok(())
    }

    /// Goes on under `strategy`, which differs from the session's in knobs the caller has
    /// proven changed nothing so far (a peer mechanism that would not have fired, autocompact
    /// off where it never fired: [`crate::replay::agent_whatif`]'s peer branches). Probing
    /// stops; what the strategy's mechanism, run dry ([`Session::dry_run_peers`]), would have
    /// reported since the last main request is its report to the next one, as under it.
    pub fn retarget(&mut self, strategy: &crate::strategy::Strategy, world: &World) {
        self.strategy = ThresholdWorld::of(world).strategy(strategy);
        let peer = &self.strategy.compact.peer;
        if let Some(&(tag, _)) = self.peer_dry.iter().find(|(_, config)| config == peer) {
            self.peer_reports.extend(self.peer_dry_reports.iter().filter(|(t, _)| *t == tag).map(|(_, report)| report.clone()));
        }
        self.probe_peers(false);
    }

    fn compact_inputs(&self) -> CompactInputs {
        let mut inputs = CompactInputs { threshold_keeps_rounds: self.threshold_keeps_rounds(), ..CompactInputs::default() };
        self.add_restored(&mut inputs);
        inputs
    }

    /// API rounds a threshold compaction keeps verbatim ([`CompactInputs::threshold_keeps_rounds`]).
    fn threshold_keeps_rounds(&self) -> usize {
        // Claude Code 2.1.332 routes a threshold compaction through its reactive compactor,
        // which keeps the newest API round verbatim; the captures show it on the first
        // compaction of a session and not on the second (docs/profiles.md).
        usize::from(self.strategy.client_version == crate::agent::dialect::VERSION && !self.thread.is_subagent() && self.compactions == 0)
    }

    /// The files read and the skills invoked, which only a rebuild reads, into `inputs`.
    fn add_restored(&self, inputs: &mut CompactInputs) {
        for (path, mtime) in self.read_state.iter() {
            inputs.read_files.push(ReadFile { path: path.clone(), timestamp_ms: *mtime });
        }
        inputs.read_files.sort_by(|a, b| b.timestamp_ms.cmp(&a.timestamp_ms).then(a.path.cmp(&b.path)));
        for skill in &self.invoked_skills {
            inputs.invoked_skills.push(CompactSkill {
                name: skill.name.clone(),
                path: skill.path.clone(),
                content: skill.content.clone(),
                invoked_at_ms: skill.invoked_at_ms,
            });
        }
    }

    /// The rebuild's deltas as (kind, text): the re-announcements `deltas`, then what the
    /// recorded client restored beyond the agent's own restore (a real session's stand-in).
    fn delta_inputs(&self, deltas: &[Attachment], world: &World) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = deltas.iter().map(|d| (d.kind().to_owned(), d.text())).collect();
        if let Some(text) = world.restored_unrecorded.as_ref().filter(|t| !t.is_empty() && !self.thread.is_subagent()) {
            out.push(("restored_unrecorded".to_owned(), text.to_string()));
        }
        out
    }

    /// Runs the long-context chain before a main-thread request. Each compaction fork is built
    /// as the main request would be from the fork's input (the conversation as the chain left
    /// it, less what a prompt-too-long retry dropped), with the summary instruction appended to
    /// the last user message and the marker on the second-to-last message, and sent through
    /// `api` on lane `compact`: the simulated API refuses it when it is too long (the chain then
    /// drops rounds and asks again), else the lane's scripted reply or a deterministic synthetic
    /// summary answers it. Hook requests around it go through `api` too, in order.
    pub fn run_chain(&mut self, chain: &Chain, world: &mut World, api: &mut dyn ModelCalls) -> Result<ChainRun, String> {
        Ok(self.drive_chain(chain, world, api, None, false)?.0)
    }

    /// `/compact`: a summary of the whole conversation now (trigger `manual`), through the same
    /// fork, hooks and rebuild as an automatic one; no other stage runs. The run's report is
    /// named `manual_compact`.
    pub fn manual_compact(&mut self, chain: &Chain, world: &mut World, api: &mut dyn ModelCalls) -> Result<ChainRun, String> {
        Ok(self.drive_chain(chain, world, api, None, true)?.0)
    }

    /// The prompt-too-long ladder (§1.4) after the simulated API rejected the main request:
    /// drain context collapse, else compact reactively once (a fork in lane `compact` sent
    /// through `api`), else surface the error. A media-size error skips the collapse rung.
    pub fn recover_prompt_too_long(
        &mut self,
        chain: &Chain,
        world: &mut World,
        api: &mut dyn ModelCalls,
        state: &mut RecoveryState,
        error: &str,
    ) -> Result<Recovery, String> {
        let (run, action) = self.drive_chain(chain, world, api, Some((state, error)), false)?;
        Ok(match action {
            Some(RecoveryAction::CollapseDrainRetry { .. }) => Recovery::Retry(run),
            Some(RecoveryAction::ReactiveCompact(_)) if run.compacted => Recovery::Retry(run),
            _ => Recovery::Surface { error: error.to_owned(), run },
        })
    }

    fn drive_chain(
        &mut self,
        chain: &Chain,
        world: &mut World,
        api: &mut dyn ModelCalls,
        mut recover: Option<(&mut RecoveryState, &str)>,
        mut manual: bool,
    ) -> Result<(ChainRun, Option<RecoveryAction>), String> {
        let now = world.clock.now_ms();
        self.sync_meta(now);
        let limits = self.model_limits(world);
        // The files read and the skills invoked are copied for a rebuild only: where no stage
        // of a plain chain run rebuilds (session-memory compaction off), when a compaction
        // fork is asked for (the session's read state and skills are as at the start: the
        // chain's stages do not reach them).
        let restored_later = recover.is_none() && !manual && !self.strategy.compact.session_memory.compact_enabled;
        let mut inputs = if restored_later {
            CompactInputs { threshold_keeps_rounds: self.threshold_keeps_rounds(), ..CompactInputs::default() }
        } else {
            self.compact_inputs()
        };
        let mut restored_missing = restored_later;
        #[cfg(debug_assertions)]
        let eager = self.compact_inputs();
        // The rebuild sets the working directory's memory files and plan files apart from the
        // restored files (`rebuild::is_memory_file`, `rebuild::is_plan_file`).
        inputs.cwd = Some(world.cwd.clone());
        let (deltas, announced) = self.compaction_deltas(world);
        if !self.attachments_recorded(world) {
            self.probe_mcp(world);
        }
        // Rendered (and the recorded client's restore copied) with the other rebuild inputs:
        // up front where a stage may rebuild within the run, else when a fork is asked for.
        if !restored_later {
            inputs.deltas = self.delta_inputs(&deltas, world);
        }
        #[cfg(debug_assertions)]
        let eager_deltas = self.delta_inputs(&deltas, world);
        let index = UuidIndex::new(&self.record_meta, self.chain_state.uuids_ascending);
        // Lowered where the records change ([`ChainState::kept_changed_from`]).
        self.chain_state.uuids_ascending = if matches!(index, UuidIndex::Ascending { .. }) { self.record_meta.len() } else { 0 };
        let mut entries = self.entries();
        // How many leading entries every step of the run left as they were: each is still the
        // entry of the record at its position.
        let mut untouched = entries.len();
        // The chain's first count reads the running counts of the entries the last run left
        // as they were, and counts the rest.
        let mut rough_known = Some(self.chain_state.rough_sums.total(&entries));
        let mut output = crate::agent::compact::ChainOutput::default();
        let mut pending_reply = None;
        let mut custom: Option<Option<String>> = None;
        let mut summary_text = String::new();
        let mut action = None;
        let mut trigger = "auto";
        loop {
            let step = {
                let World { fs, clock, .. } = &mut *world;
                let mut cx = crate::agent::compact::ChainContext::new(entries, &mut self.chain_state, &self.strategy.compact, fs, clock, limits);
                cx.source = QuerySource::Main;
                cx.message_offset = 1;
                // The session's kept entries: it reports every change to them.
                cx.kept_list = true;
                // (Lent to the run and taken back: its stages only read them.)
                cx.inputs = std::mem::take(&mut inputs);
                cx.output = output;
                // Known for the entries as the run starts only.
                cx.rough_known = rough_known.take();
                let step = match (pending_reply.take(), recover.take()) {
                    (Some(reply), _) => chain.finish_compaction(&mut cx, reply),
                    (None, Some((state, error))) => {
                        // The client tells the two apart by the error text (`isMediaSizeError`).
                        let taken = if is_media_size_error(error) {
                            on_media_too_large(&mut cx, state, error)
                        } else {
                            on_prompt_too_long(&mut cx, state, error)
                        };
                        let step = match &taken {
                            RecoveryAction::ReactiveCompact(request) => ChainStep::Compact(request.clone()),
                            _ => ChainStep::Ready,
                        };
                        action = Some(taken);
                        step
                    }
                    (None, None) if manual => {
                        manual = false;
                        let pre_tokens = crate::agent::compact::counting::token_count_with_estimation(&cx.entries);
                        let fork_entries = cx.entries.to_vec();
                        let request = crate::agent::compact::autocompact::request(
                            &mut cx,
                            crate::agent::compact::CompactTrigger::Manual,
                            fork_entries,
                            pre_tokens,
                            0,
                            (0, 0),
                        );
                        cx.output.pending_compaction = Some(request.clone());
                        ChainStep::Compact(request)
                    }
                    (None, None) => chain.run(&mut cx),
                };
                output = std::mem::take(&mut cx.output);
                inputs = std::mem::take(&mut cx.inputs);
                let left = std::mem::take(&mut cx.entries);
                cx.state.kept_changed_from(left.untouched());
                untouched = untouched.min(left.untouched());
                entries = left.into_vec();
                step
            };
            let ChainStep::Compact(request) = step else { break };
            if std::mem::take(&mut restored_missing) {
                self.add_restored(&mut inputs);
                inputs.deltas = self.delta_inputs(&deltas, world);
            }
            #[cfg(debug_assertions)]
            {
                let (mut made, mut expected) = (inputs.clone(), eager.clone());
                debug_assert_eq!(made.deltas, eager_deltas, "the rebuild's deltas made when asked for are the ones the run started with");
                (made.deltas, expected.deltas, made.cwd, expected.cwd) = (Vec::new(), Vec::new(), None, None);
                debug_assert_eq!(made, expected, "the compaction's inputs made when asked for are the ones the run started with");
            }
            trigger = request.trigger.as_str();
            if custom.is_none() {
                custom = Some(self.pre_compact_instructions(trigger, None, world));
                self.settle_hook_time(world);
                api.side(self.take_side_calls(), world)?;
            }
            // The fork sees its input as the chain chose it: the conversation as the stages
            // before autocompact left it, less what peeling or a retry removed.
            let (records, metas) = entries_to_records(&output.fork_entries, &self.records, &self.record_meta, &index);
            // The fork's leading records that are the transcript's own, in place: each made
            // from the entry its record made, which gives that record back (with every uuid
            // once, an attachment's record is the one at its position). Their messages are the
            // memo's; the fork makes the rest with a copy of it and leaves it as it was.
            let shared = if index.unique(&self.record_meta) {
                output.fork_entries.iter().zip(&self.records).zip(&self.record_meta).take_while(|&((entry, record), meta)| as_made_of(entry, record, meta)).count()
            } else {
                0
            };
            debug_assert!(records[..shared] == self.records[..shared], "a fork's record taken for the transcript's differs from it");
            let mut fork_memo = self.message_memo.clone();
            fork_memo.invalidate_from(shared);
            let saved_records = std::mem::replace(&mut self.records, records);
            let saved_meta = std::mem::replace(&mut self.record_meta, metas);
            let saved_memo = std::mem::replace(&mut self.message_memo, fork_memo);
            let fork = self.compaction_fork(world, custom.clone().flatten().as_deref());
            self.records = saved_records;
            self.record_meta = saved_meta;
            self.message_memo = saved_memo;
            // What the chain removed from this fork's input is journalled on the fork's row.
            let (fork_events, main_events): (Vec<String>, Vec<String>) =
                std::mem::take(&mut output.events).into_iter().partition(|e| e.starts_with("truncation:"));
            output.events = main_events;
            let fallback = Reply::text(synthetic_summary(self.strategy.compact.autocompact.synthetic_summary_tokens));
            pending_reply = Some(match api.fork("compact", &self.lane(), fork, fork_events, limits.context_window, fallback, world)? {
                ForkAnswer::Refused(error) => CompactionReply::Refused(error),
                ForkAnswer::Answered(reply) => {
                    summary_text = reply_text(&reply);
                    summary_reply(summary_text.clone())
                }
            });
        }
        if output.compacted {
            // `clearBetaHeaderLatches` (§8.6): compaction drops the thinking-clear latch.
            self.chain_state.thinking_clear_latched = false;
        }
        let run = ChainRun {
            reports: output.reports,
            events: output.events,
            blocked: output.blocked,
            compacted: output.compacted,
            cache_edits: output.cache_edits,
            context_management: output.context_management,
            thinking_clear_latched: self.chain_state.thinking_clear_latched,
            autocompact_checked: output.autocompact_checked,
        };
        let (records, metas, next, unchanged) =
            entries_into_records(entries, std::mem::take(&mut self.records), std::mem::take(&mut self.record_meta), &index, untouched);
        self.message_memo.invalidate_from(unchanged);
        self.chain_state.kept_changed_from(unchanged);
        // The records before `unchanged` are the ones the run started from, their entries as made.
        self.chain_state.rough_sums.invalidate_from(unchanged);
        self.records = records;
        self.record_meta = metas;
        self.entry_cache.set(next);
        if run.compacted {
            self.after_compaction();
            // A full compaction re-announces every delta; session-memory compaction keeps no
            // attachments, so the next turn announces everything again.
            let session_memory = run.reports.iter().any(|r| r.fired && r.name == "session_memory_compact");
            self.set_announced(if session_memory { Default::default() } else { announced });
            let messages = self.post_compact_hooks(trigger, &summary_text, world);
            self.push_attachments(messages);
            self.settle_hook_time(world);
            api.side(self.take_side_calls(), world)?;
            self.sync_meta(now);
        }
        Ok((run, action))
    }

    /// Session-memory extraction after sampling (§6): when the trigger holds, a fork in lane
    /// `session_memory` (same system and tools, the conversation, our update instruction with
    /// the current notes; marker on the last message, since this fork writes the cache) is
    /// sent through `api`, and the reply (scripted, else synthesized notes) becomes the memory
    /// file. A fork the API refuses as too long extracts nothing (the reference's extraction
    /// runs fire-and-forget and only logs its failure).
    pub fn extract_session_memory(&mut self, world: &mut World, api: &mut dyn ModelCalls) -> Result<bool, String> {
        if !self.strategy.compact.session_memory.enabled {
            return Ok(false);
        }
        let now = world.clock.now_ms();
        self.sync_meta(now);
        let limits = self.model_limits(world);
        let entries: Vec<Entry> = self.records.iter().zip(&self.record_meta).map(|(r, m)| record_to_entry(r, m)).collect();
        let config = self.strategy.compact.clone();
        let instruction = {
            let World { fs, clock, .. } = &mut *world;
            let mut cx = crate::agent::compact::ChainContext::new(entries.clone(), &mut self.chain_state, &config, fs, clock, limits);
            if !should_extract(&mut cx) {
                return Ok(false);
            }
            let request = extraction_request(&mut cx);
            request.messages.last().map(|m| m.content.to_blocks()).unwrap_or_default()
        };
        let instruction = instruction
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let fork = self.fork_request(world, instruction, ForkMarker::Last, "session_memory");
        let extraction = self.chain_state.session_memory.extractions + 1;
        let fallback = Reply::text(synthetic_notes(extraction, &entries));
        let ForkAnswer::Answered(reply) = api.fork("session_memory", &self.lane(), fork, Vec::new(), limits.context_window, fallback, world)? else {
            return Ok(false);
        };
        let notes = reply_text(&reply);
        let World { fs, clock, .. } = &mut *world;
        let mut cx = crate::agent::compact::ChainContext::new(entries, &mut self.chain_state, &config, fs, clock, limits);
        finish_extraction(&mut cx, &notes);
        Ok(true)
    }

    /// After a media-size error surfaced: the offending images and documents are stripped from
    /// the last message that carried them, so the next turn can be sent (§5.3 step 3). Returns
    /// how many were stripped.
    pub fn strip_media_after_error(&mut self) -> usize {
        for record in self.records.iter_mut().rev() {
            if let Record::User { content, .. } = record {
                let stripped = strip_oversized_media(content);
                if stripped > 0 {
                    self.forget_entries();
                    return stripped;
                }
            }
        }
        0
    }

    /// Appends the meta user message of max_output_tokens recovery.
    pub fn push_meta_user(&mut self, text: &str) {
        self.records.push(Record::User { content: MessageContent::Text(text.to_owned().into()), meta: true });
    }

    /// The fork request of a compaction: the main request built from the records as they are
    /// now, the summary instruction appended to the last user message, the marker moved to the
    /// second-to-last message.
    pub fn compaction_fork(&mut self, world: &World, custom_instructions: Option<&str>) -> Request {
        let instruction = summary_instruction(custom_instructions);
        self.fork_request(world, instruction, ForkMarker::SecondToLast, "compact")
    }

    /// A cache-sharing fork: the main request built from the records as they are now, with
    /// `instruction` merged into the last user message (or appended as one).
    fn fork_request(&mut self, world: &World, instruction: String, marker_at: ForkMarker, lane: &str) -> Request {
        let (mut request, events) = self.build_request(world);
        self.requeue_events(events);
        match request.messages.last_mut() {
            Some(last) if last.role == Role::User => {
                let mut blocks = last.content.to_blocks();
                blocks.push(ContentBlock::text(instruction));
                last.content = MessageContent::Blocks(blocks.into());
            }
            _ => request.messages.push(Message::user_text(instruction)),
        }
        let index = match marker_at {
            ForkMarker::SecondToLast => request.messages.len().checked_sub(2),
            ForkMarker::Last => request.messages.len().checked_sub(1),
        };
        let marker = self.marker_for(lane);
        // (The request was built as the thread's own: its prefix markers at the thread's TTL.)
        let thread_ttl = self.strategy.ttl_for(&self.lane());
        if let Some(marker) = &marker
            && let Some(ttl) = fork_prefix_ttl(thread_ttl, marker.ttl).filter(|&ttl| Some(ttl) != thread_ttl)
        {
            retime_prefix_markers(&mut request, ttl);
        }
        place_marker(&mut request.messages, index, marker);
        request
    }
}

/// The TTL of a fork request's system and tool markers ([`Session::fork_request`]), of a thread
/// whose requests time their markers at `thread` and a fork whose own (message) marker is at
/// `fork` (`None`: 5 minutes). The client gives every marker of a request its query source's
/// TTL. A fork written at 1h beside a main lane at 5m sends its system and tool markers at 1h
/// too: kept at 5m they would stand before its 1h message marker, which the API rejects ("1h
/// entries must come first"). (A fork at 5m beside a main lane at 1h keeps the main lane's
/// system markers, a valid order: moving them would change every run of a 1h session that
/// compacts, and is left until its effect on the fit is measured.)
pub fn fork_prefix_ttl(thread: Option<CacheTtl>, fork: Option<CacheTtl>) -> Option<CacheTtl> {
    match fork {
        Some(CacheTtl::OneHour) => fork,
        _ => thread,
    }
}

/// Sets `ttl` on every marker of `request`'s system prompt and tools that carries another one.
fn retime_prefix_markers(request: &mut Request, ttl: CacheTtl) {
    let stale = |c: &Option<CacheControl>| c.as_ref().is_some_and(|c| c.ttl != Some(ttl));
    if let Some(crate::api::SystemPrompt::Blocks(blocks)) = &mut request.system
        && blocks.iter().any(|b| stale(&b.cache_control))
    {
        for block in blocks.iter_mut() {
            if let Some(c) = block.cache_control.as_mut() {
                c.ttl = Some(ttl);
            }
        }
    }
    if let Some(tools) = &mut request.tools
        && tools.iter().any(|t| stale(&t.cache_control))
    {
        for tool in tools.iter_mut() {
            if let Some(c) = tool.cache_control.as_mut() {
                c.ttl = Some(ttl);
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum ForkMarker {
    /// `skipCacheWrite` forks (compact).
    SecondToLast,
    Last,
}

/// Where the prompt-too-long ladder left the turn.
#[derive(Debug, Clone)]
pub enum Recovery {
    /// Collapses were drained or a reactive compaction succeeded: send the request again.
    Retry(ChainRun),
    /// Nothing helped: the error is shown and the turn ends (`prompt_too_long`).
    Surface { error: String, run: ChainRun },
}

fn reply_text(reply: &Reply) -> String {
    crate::api::joined_text(&reply.content)
}

/// Deterministic notes when lane `session_memory` is not scripted: the template with the
/// state and a worklog line per user prompt so far.
fn synthetic_notes(extraction: u64, entries: &[Entry]) -> String {
    let mut notes = String::new();
    for line in TEMPLATE.lines() {
        notes.push_str(line);
        notes.push('\n');
        if line == "# Current State" {
            notes.push_str(&format!("Notes update {extraction}: {} messages so far.\n", entries.len()));
        }
    }
    notes.push_str("Prompts so far:\n");
    for entry in entries.iter().filter(|e| !e.is_assistant() && !e.is_meta) {
        if let MessageContent::Text(text) = &entry.message().content {
            let short: String = text.chars().take(80).collect();
            notes.push_str(&format!("- {short}\n"));
        }
    }
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::compact::CompactTrigger;
    use proptest::prelude::*;

    fn record(kind: u8, text: String, flag: bool) -> Record {
        match kind % 4 {
            0 => Record::User { content: MessageContent::Text(text.into()), meta: flag },
            1 => Record::Assistant { content: vec![ContentBlock::text(text)].into() },
            2 => Record::Attachment { attachment: Attachment::NestedMemory { path: format!("/p/{text}"), content: text }.into(), in_loop: flag },
            _ => Record::User { content: MessageContent::Blocks(vec![ContentBlock::text(text)].into()), meta: flag },
        }
    }

    /// The previous `entries_into_records`, every record moved back one by one: the oracle.
    fn entries_into_records_moving_each(entries: Vec<Entry>, records: Vec<Record>, index: &BTreeMap<u64, usize>) -> (Vec<Record>, Vec<RecordMeta>, Vec<Entry>, usize) {
        let sources: Vec<Option<usize>> = entries.iter().map(|entry| index.get(&entry.uuid).copied()).collect();
        // A record whose uuid several entries carry is copied for each, never moved.
        let mut uses = vec![0u32; records.len()];
        for &j in sources.iter().flatten() {
            uses[j] += 1;
        }
        let mut records: Vec<Option<Record>> = records.into_iter().map(Some).collect();
        let kept = entries.iter().filter(|entry| !entry.is_boundary()).count();
        // Room for the records the next turn appends: made with `kept` exactly, the session's next
        // push (a record, its meta, the next run's entries) would copy the whole list to grow it,
        // on every request.
        let room = room_for(kept);
        let (mut out, mut metas, mut next) = (Vec::with_capacity(room), Vec::with_capacity(room), Vec::with_capacity(room));
        let mut unchanged = 0;
        for (entry, source) in entries.into_iter().zip(sources) {
            if entry.is_boundary() {
                continue;
            }
            let meta = meta_of(&entry);
            let reusable = source.filter(|&j| uses[j] == 1 && records[j].as_ref().is_some_and(|record| made_from(&entry, record)));
            if let Some(record) = reusable.and_then(|j| records[j].take()) {
                if reusable == Some(out.len()) && unchanged == out.len() {
                    unchanged += 1;
                }
                out.push(record);
                next.push(entry);
            } else {
                let record = entry_to_record(&entry, source.and_then(|j| records[j].as_ref()));
                next.push(record_to_entry(&record, &meta));
                out.push(record);
            }
            metas.push(meta);
        }
        (out, metas, next, unchanged)
    }

    proptest! {
        /// Moving the records the chain left alone and keeping their entries gives what copying
        /// every record back and making every entry again gives, whatever the chain did.
        #[test]
        fn entries_into_records_equals_copying(
            records in proptest::collection::vec((any::<u8>(), "[a-c]{0,3}", any::<bool>()), 0..24),
            edits in proptest::collection::vec(0u8..9, 0..24),
            order in 0u8..3,
            hint in 0usize..30,
        ) {
            let records: Vec<Record> = records.into_iter().map(|(k, t, f)| record(k, t, f)).collect();
            // Uuids in the order the session hands them out, else (after a compaction kept older
            // records) out of order, or carried by two records.
            let n = records.len() as u64;
            let uuid = |i: u64| match order {
                0 => 2 * i + 1,
                1 => 2 * (n - i) + 1,
                _ => i / 2 * 2 + 1,
            };
            let metas: Vec<RecordMeta> = (0..n).map(|i| RecordMeta { uuid: uuid(i), timestamp_ms: i, ..RecordMeta::default() }).collect();
            let map: BTreeMap<u64, usize> = metas.iter().enumerate().map(|(j, m)| (m.uuid, j)).collect();
            let index = UuidIndex::new(&metas, 0);
            prop_assert_eq!(matches!(index, UuidIndex::Ascending { .. }), order == 0 || n < 2);
            // The leading metas known to ascend (any count up to where they stop) are not read
            // again: the same index.
            let ascending_through = (1 + metas.windows(2).take_while(|p| p[0].uuid < p[1].uuid).count()).min(metas.len());
            let known = UuidIndex::new(&metas, hint % (ascending_through + 1));
            prop_assert_eq!(matches!(known, UuidIndex::Ascending { .. }), matches!(index, UuidIndex::Ascending { .. }));
            for m in &metas {
                prop_assert_eq!(index.get(&metas, m.uuid), map.get(&m.uuid).copied());
            }
            let mut entries = Vec::new();
            for (i, (r, m)) in records.iter().zip(&metas).enumerate() {
                let mut entry = record_to_entry(r, m);
                match edits.get(i).copied().unwrap_or(0) {
                    1 => entry.message_mut().content = MessageContent::Text("rewritten".into()),
                    2 => continue,
                    3 => entries.push(entry.clone()),
                    4 => entry.is_meta = !entry.is_meta,
                    5 => {
                        let mut rebuilt = Entry::new(Message::user_blocks(vec![ContentBlock::text("Read"), ContentBlock::text("body")]), 1000 + i as u64, 0);
                        rebuilt.kind = EntryKind::Attachment { kind: "file".into() };
                        rebuilt.is_meta = true;
                        entries.push(rebuilt);
                    }
                    6 => {
                        let mut boundary = Entry::new(Message::user_text("boundary"), 2000 + i as u64, 0);
                        boundary.kind = EntryKind::CompactBoundary { trigger: CompactTrigger::Auto, pre_tokens: 0, logical_parent: None, preserved: None };
                        entries.push(boundary);
                    }
                    7 => {
                        entry.usage = Some(Usage { input_tokens: 7, ..Usage::default() });
                        entry.message_id = Some(format!("msg_{i}").into());
                    }
                    8 => entry.kind = EntryKind::Attachment { kind: "other".into() },
                    _ => {}
                }
                entries.push(entry);
            }
            let (want_records, want_metas) = entries_to_records(&entries, &records, &metas, &index);
            let want_next: Vec<Entry> = want_records.iter().zip(&want_metas).map(|(r, m)| record_to_entry(r, m)).collect();
            let original = records.clone();
            let oracle = entries_into_records_moving_each(entries.clone(), records.clone(), &map);
            // What the chain reports it left untouched: at most the entries before the first edit.
            let untouched = hint.min(edits.iter().position(|&e| (1..=8).contains(&e)).unwrap_or(usize::MAX)).min(entries.len());
            let (got_records, got_metas, got_next, unchanged) = entries_into_records(entries, records, metas.clone(), &index, untouched);
            // The same as moving every entry's record back one by one (the previous way).
            prop_assert_eq!(&oracle.0, &got_records);
            prop_assert_eq!(&oracle.1, &got_metas);
            prop_assert_eq!(&oracle.2, &got_next);
            prop_assert_eq!(oracle.3, unchanged);
            // The records it calls unchanged are the leading records the run started from.
            prop_assert!(unchanged <= got_records.len() && unchanged <= original.len());
            prop_assert_eq!(&got_records[..unchanged], &original[..unchanged]);
            // Copying every entry's record back reads an attachment's record by uuid: the same
            // record only while every record has a uuid of its own.
            if order < 2 {
                prop_assert_eq!(got_records, want_records);
                prop_assert_eq!(got_metas, want_metas);
                prop_assert_eq!(got_next, want_next);
            }
        }
    }

    proptest! {
        /// A list left with room for a turn is not grown (which would copy it), one without is
        /// given room for a turn; entries made again from a copy of the cache have that room,
        /// so the first turns of a run from a checkpoint do not copy them to grow them (a cache of
        /// no entries is copied as none).
        #[test]
        fn lists_get_room_for_a_turn_and_keep_it(len in 0usize..300, spare in 0usize..120, more in 0usize..24, n in 1usize..40) {
            let mut list: Vec<u64> = Vec::with_capacity(len + spare);
            list.extend(0..len as u64);
            let (capacity, at) = (list.capacity(), list.as_ptr());
            let kept = len + more;
            make_room(&mut list, kept);
            prop_assert!(list.capacity() >= kept + NEXT_TURN);
            if capacity >= kept + NEXT_TURN {
                prop_assert_eq!((list.capacity(), list.as_ptr()), (capacity, at));
            }
            prop_assert_eq!(list, (0..len as u64).collect::<Vec<_>>());

            let records: Vec<Record> = (0..n).map(|i| record(i as u8, format!("r{i}"), i % 3 == 0)).collect();
            let metas: Vec<RecordMeta> = (0..n as u64).map(|i| RecordMeta { uuid: 2 * i + 1, timestamp_ms: i, ..RecordMeta::default() }).collect();
            let mut cache = EntryCache::default();
            cache.set(records.iter().zip(&metas).map(|(r, m)| record_to_entry(r, m)).collect());
            let mut copy = cache.clone();
            let mut entries = copy.take(&records, &metas);
            prop_assert_eq!(entries.len(), n);
            prop_assert!(entries.capacity() >= room_for(n));
            let at = entries.as_ptr();
            make_room(&mut entries, n);
            prop_assert_eq!(entries.as_ptr(), at);
        }
    }

    /// The thresholds and the refusal read from the autocompact knobs applied alone are those
    /// of the whole strategy applied, whatever the env sets (a number the strategy cannot read
    /// among them: it then applies none of the compaction knobs).
    #[test]
    fn thresholds_from_the_autocompact_knobs_are_the_strategy_applied() {
        let vars = [
            ("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE", "60"),
            ("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "150000"),
            ("CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE", "170000"),
            ("DISABLE_AUTO_COMPACT", "1"),
            ("DISABLE_COMPACT", "true"),
            ("CTXSIM_REACTIVE_COMPACT", "1"),
            ("MAX_MCP_OUTPUT_TOKENS", "12000"),
            ("BASH_MAX_OUTPUT_LENGTH", "lots"),
            ("ZZZ_UNREAD", "x"),
        ];
        let mut strategies = vec![crate::strategy::Strategy::default()];
        let mut big_buffer = crate::strategy::Strategy::default();
        big_buffer.compact.autocompact.buffer_tokens = 190_000;
        strategies.push(big_buffer);
        for mask in 0u32..(1 << vars.len()) {
            let env: BTreeMap<String, String> = vars.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, (k, v))| ((*k).to_owned(), (*v).to_owned())).collect();
            let world = ThresholdWorld { model_id: "claude-opus-4-5", context_window: None, max_output_tokens: None, env: &env };
            for strategy in &strategies {
                let applied = world.strategy(strategy);
                let whole = crate::agent::compact::counting::Thresholds::compute(world.limits(&applied), &applied.compact);
                assert_eq!(format!("{:?}", world.thresholds(strategy)), format!("{whole:?}"), "env {env:?}");
                assert_eq!(world.refuses(strategy), crate::runner::check_strategy_for(world.limits(&applied), strategy).is_err(), "env {env:?}");
            }
        }
    }
}
