//! The agent's long-context stages on a real session: before every recorded main call, the
//! agent's own chain ([`crate::agent::compact::Chain`]) runs on the messages the replay built
//! for that call (time-based and cached microcompact, the aggregate tool result budget, snip,
//! context collapse), and its output is what the request carries.
//!
//! The recording rebuilds a call's messages from the transcript every time, where the agent keeps
//! its rewritten conversation from request to request. What a stage decided is therefore kept
//! here and put back on the next call's messages before the chain runs again:
//! - results cleared by microcompact go to the lane's cleared set, by tool_use id (the replay
//!   clears them in every later call and in the compaction fork, as it does the recorded ones);
//! - messages snip dropped and the digests collapse put in their place, by their index in the
//!   lane's recorded view (stable between compactions: a view extends the previous one), checked
//!   against the identity of the last one dropped;
//! - the tool result budget's replacement state and cached microcompact's registry live in the
//!   agent's own [`ChainState`], as in a scripted run; cached microcompact's `cache_edits` blocks
//!   stay pinned to the message they were first sent in ([`crate::runner::insert_cache_edits`]).
//!
//! A compaction (recorded, or moved by another autocompact setting) starts the conversation
//! over: the kept drops, digests and pins go with it.
//!
//! Autocompact, session-memory compaction and the blocking limit do not run here: where the
//! session compacts is [`super::whatif`]'s decision, and every recorded call is sent.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::agent::compact::config::CachedMicrocompactMode;
use crate::agent::compact::microcompact::CLEARED_MARKER;
use crate::agent::compact::{Chain, ChainContext, ChainState, CompactConfig, Entry, ModelLimits, QuerySource};
use crate::api::{ContentBlock, Message, MessageContent, Role, ToolResultContent};
use crate::measure::StageReport;
use crate::world::{Clock, VirtualFs};

/// Whether `config` turns on or changes a stage this module runs (else a replay keeps the
/// recorded messages as they are, byte for byte).
pub fn configured(config: &CompactConfig) -> bool {
    let defaults = CompactConfig::default();
    let mc = &config.microcompact;
    let microcompact = (mc.time_based_enabled || mc.cached != CachedMicrocompactMode::Off) && *mc != defaults.microcompact;
    microcompact || config.snip.enabled || config.context_collapse.enabled || config.tool_result_budget.aggregate_enabled
}

/// The configuration the chain runs with on a real session: `config`, but for the tool result
/// budget's per-tool thresholds, which the recorded results already went through (the
/// recording's client applied its own; other thresholds are applied before the chain:
/// [`super::session::ReplayOptions::tool_result_budget`]), so that only the aggregate budget
/// persists results here.
pub fn chain_config(config: &CompactConfig) -> CompactConfig {
    let mut config = config.clone();
    without_per_tool_thresholds(&mut config.tool_result_budget);
    config
}

/// `budget` with no per-tool persistence threshold: no tool's result is persisted for its own
/// size (the aggregate budget stays as it is).
pub fn without_per_tool_thresholds(budget: &mut crate::agent::compact::config::ToolResultBudgetConfig) {
    budget.per_tool_chars.clear();
    budget.default_chars = u64::MAX;
}

/// Uuids of records the chain creates start here ([`ChainState::uuid`]); below it an entry's
/// uuid is its index in the lane's recorded view.
const CREATED: u64 = 1_000_000_000;

/// The chain's state across the main lane's calls of one replay.
#[derive(Debug)]
pub struct StagesState {
    chain: ChainState,
    fs: VirtualFs,
    clock: Clock,
    /// Indices (in the recorded view) of the messages snip or collapse took out.
    dropped: BTreeSet<usize>,
    /// Records the chain put in (collapse digests), by the recorded index they precede.
    inserted: BTreeMap<usize, Vec<Entry>>,
    /// The last dropped index and the identity of its message, to notice a view that changed.
    anchor: Option<(usize, u64)>,
    /// Cached microcompact's `cache_edits` blocks: (message index, block).
    pinned: Vec<(usize, Value)>,
    /// Microcompact cleared results since the last compaction: every later call's messages
    /// differ from the recorded ones (the lane's cleared set holds them).
    cleared_any: bool,
}

impl Default for StagesState {
    fn default() -> Self {
        StagesState {
            chain: ChainState::new("/session"),
            fs: VirtualFs::new(),
            clock: Clock::new(0),
            dropped: BTreeSet::new(),
            inserted: BTreeMap::new(),
            anchor: None,
            pinned: Vec::new(),
            cleared_any: false,
        }
    }
}

/// What one run of the chain did to a call's messages.
#[derive(Debug, Default)]
pub struct StagesRun {
    /// The reports of the stages that fired.
    pub reports: Vec<StageReport>,
    /// The chain's events (`microcompact_cleared_tool_result`, `snip`, `context_collapse`, ...).
    pub events: Vec<String>,
    /// Tool results microcompact cleared in this run.
    pub cleared: Vec<String>,
    /// The messages differ from what the recorded client sent (beyond what the lane's cleared set
    /// already explains), or the request deletes results server-side.
    pub changed: bool,
}

/// What identifies a recorded message whatever a stage did to it: its role and, per block, the
/// kind and the tool ids and texts (the stages rewrite only tool result contents).
fn identity(message: &Message) -> u64 {
    let mut bytes = Vec::new();
    bytes.push(u8::from(message.role == Role::User));
    if let MessageContent::Blocks(blocks) = &message.content {
        for block in blocks {
            bytes.extend_from_slice(block.kind().as_bytes());
            match block {
                ContentBlock::ToolUse { id, .. } => bytes.extend_from_slice(id.as_bytes()),
                ContentBlock::ToolResult { tool_use_id, .. } => bytes.extend_from_slice(tool_use_id.as_bytes()),
                ContentBlock::Text { text, .. } => bytes.extend_from_slice(text.as_bytes()),
                _ => {}
            }
            bytes.push(0);
        }
    } else if let MessageContent::Text(text) = &message.content {
        bytes.extend_from_slice(text.as_bytes());
    }
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

impl StagesState {
    /// A compaction started the conversation over.
    pub fn on_compaction(&mut self) {
        self.dropped.clear();
        self.inserted.clear();
        self.anchor = None;
        self.pinned.clear();
        self.cleared_any = false;
        self.chain.cached_microcompact = Default::default();
    }

    /// `messages` (the recorded view of a main call, index = recorded index) as the agent's
    /// conversation, with what earlier runs dropped and inserted.
    fn entries(&mut self, messages: Vec<Message>, timestamp_ms: u64) -> Vec<Entry> {
        if let Some((at, id)) = self.anchor
            && messages.get(at).map(identity) != Some(id)
        {
            // The view is not the one the drops were made on (a resumed client's history).
            self.dropped.clear();
            self.inserted.clear();
            self.anchor = None;
        }
        let n = messages.len();
        let mut entries = Vec::with_capacity(n);
        // Assistant messages in a row are one API round (the results of all their tool uses
        // follow them), so a stage that drops rounds never parts a tool use from its result.
        let (mut round, mut previous_assistant) = (0, false);
        for (i, message) in messages.into_iter().enumerate() {
            let assistant = message.role == Role::Assistant;
            if assistant && !previous_assistant {
                round = i;
            }
            previous_assistant = assistant;
            if let Some(records) = self.inserted.get(&i) {
                entries.extend(records.iter().cloned());
            }
            if self.dropped.contains(&i) {
                continue;
            }
            let mut entry = Entry::new(message, i as u64, timestamp_ms);
            if assistant {
                entry.message_id = Some(format!("recorded-{round}"));
            }
            entries.push(entry);
        }
        for (_, records) in self.inserted.range(n..) {
            entries.extend(records.iter().cloned());
        }
        entries
    }

    /// Keeps what the chain dropped and inserted, from the conversation it left (`n` recorded
    /// messages went in, `view` is the recorded view it was built from).
    fn keep(&mut self, entries: &[Entry], view: &[Message]) {
        let present: BTreeSet<usize> = entries.iter().filter(|e| e.uuid < CREATED).map(|e| e.uuid as usize).collect();
        self.dropped = (0..view.len()).filter(|i| !present.contains(i)).collect();
        self.inserted.clear();
        let mut waiting: Vec<Entry> = Vec::new();
        for entry in entries {
            if entry.uuid >= CREATED {
                waiting.push(entry.clone());
            } else if !waiting.is_empty() {
                self.inserted.insert(entry.uuid as usize, std::mem::take(&mut waiting));
            }
        }
        if !waiting.is_empty() {
            self.inserted.insert(view.len(), waiting);
        }
        self.anchor = self.dropped.last().map(|&i| (i, identity(&view[i])));
    }

    /// Runs the chain on the messages of a main call sent at `now_ms`, whose previous reply
    /// came at `previous_reply_ms`; `messages` becomes what the request carries.
    pub fn run(&mut self, config: &CompactConfig, messages: &mut Vec<Message>, limits: ModelLimits, now_ms: u64, previous_reply_ms: Option<u64>) -> StagesRun {
        let view = std::mem::take(messages);
        let before: Vec<u64> = view.iter().map(crate::agent::compact::counting::rough_message).collect();
        let entries = self.entries(view.clone(), previous_reply_ms.unwrap_or(now_ms));
        if now_ms > self.clock.now_ms() {
            self.clock.set(now_ms);
        }
        let mut disabled = vec!["autocompact", "blocking_limit"];
        if !config.tool_result_budget.aggregate_enabled {
            disabled.push("tool_result_budget");
        }
        let chain = Chain::with_disabled(&disabled).expect("stage names of the chain");
        let mut cx = ChainContext::new(entries, &mut self.chain, config, &mut self.fs, &self.clock, limits);
        cx.source = QuerySource::Main;
        let _ = chain.run(&mut cx);
        let output = std::mem::take(&mut cx.output);
        let entries = std::mem::take(&mut cx.entries);
        drop(cx);
        let mut run = StagesRun { events: output.events, ..StagesRun::default() };
        run.reports = output.reports.into_iter().filter(|r| r.fired).collect();
        for entry in entries.iter().filter(|e| e.uuid < CREATED) {
            for block in entry.blocks() {
                if let ContentBlock::ToolResult { tool_use_id, content: Some(ToolResultContent::Text(text)), .. } = block
                    && text == CLEARED_MARKER
                {
                    run.cleared.push(tool_use_id.clone());
                }
            }
        }
        let time_based = run.reports.iter().any(|r| r.name == "microcompact" && r.reason.starts_with("time_based"));
        if time_based {
            self.pinned.clear();
        }
        self.keep(&entries, &view);
        *messages = entries.into_iter().filter(Entry::on_wire).map(Entry::into_message).collect();
        if let Some(edits) = output.cache_edits
            && let Some(last_user) = messages.iter().rposition(|m| m.role == Role::User)
        {
            self.pinned.push((last_user, edits));
        }
        let after: Vec<u64> = messages.iter().map(crate::agent::compact::counting::rough_message).collect();
        self.cleared_any |= time_based && before != after;
        run.changed = before != after || !self.pinned.is_empty() || self.cleared_any;
        run
    }

    /// The pinned `cache_edits` blocks put into `request` (`offset`: messages the request holds
    /// before the call's own, the user-context reminder on its own).
    pub fn insert_cache_edits(&self, request: &mut crate::api::Request, offset: usize) {
        let pinned: Vec<(usize, Value)> = self.pinned.iter().map(|(i, v)| (i + offset, v.clone())).collect();
        crate::runner::insert_cache_edits(request, &pinned);
    }

    /// A response came back: cached microcompact counts the results it registered as sent.
    pub fn sent(&mut self) {
        self.chain.cached_microcompact.mark_sent();
    }

    /// The compaction fork of the main thread: it opens with the main lane's recorded view (same
    /// indices), which loses what the main lane's chain dropped and shows its digests; the
    /// results the budget persisted show their replacements.
    pub fn fork_view(&self, messages: &mut Vec<Message>) {
        if let Some((at, id)) = self.anchor
            && messages.get(at).map(identity) == Some(id)
        {
            let view = std::mem::take(messages);
            for (i, message) in view.into_iter().enumerate() {
                if let Some(records) = self.inserted.get(&i) {
                    messages.extend(records.iter().map(|e| e.message().clone()));
                }
                if !self.dropped.contains(&i) {
                    messages.push(message);
                }
            }
        }
        let replacements = &self.chain.replacements.replacements;
        if replacements.is_empty() {
            return;
        }
        for message in messages.iter_mut() {
            let MessageContent::Blocks(blocks) = &mut message.content else { continue };
            for block in blocks.iter_mut() {
                if let ContentBlock::ToolResult { tool_use_id, content, .. } = block
                    && let Some(text) = replacements.get(tool_use_id.as_str())
                {
                    *content = Some(ToolResultContent::Text(text.clone()));
                }
            }
        }
    }
}
