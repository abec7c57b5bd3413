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

use super::layout::{ReplayLayout, drop_deferred_listings, tool_search_selections};
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
    /// The TTL of the main lane's markers; `None` = the one the recording shows per call.
    pub ttl_main: Option<CacheTtl>,
    /// Apply the microcompacts the recording shows (clear the results they cleared).
    pub recorded_microcompact: bool,
    /// A peer mechanism applied to every call's messages (`strategy: none` = as recorded).
    pub peer: crate::agent::compact::peers::PeerConfig,
    /// API context editing `clear_tool_uses`: `(trigger input tokens, tool uses kept)`.
    pub clear_tool_uses: Option<(u64, usize)>,
    /// Autocompact settings to replay the session under (`None`: where the recording
    /// compacted). See [`super::whatif`].
    pub autocompact: Option<crate::agent::compact::config::AutocompactConfig>,
    /// Judge the information lost ([`SessionReplay::info_loss`]); callers that do not report it
    /// (`audit`) skip the walk of every request it costs.
    #[serde(skip)]
    pub info_loss: bool,
    /// Judge the information each main-lane compaction loses
    /// ([`SessionReplay::compaction_losses`]); a replay that only plans where compactions go
    /// ([`super::whatif`]) reads counts and skips it.
    #[serde(skip)]
    pub compaction_losses: bool,
    /// Per-tool persistence thresholds other than the client's (`None`: the recorded results
    /// as the client sent them): a larger recorded result becomes its preview.
    pub tool_result_budget: Option<crate::agent::compact::config::ToolResultBudgetConfig>,
    /// Tool-output limits other than the client's (`None`: the recorded results as sent): a
    /// recorded Bash, MCP or Read result beyond them becomes what the client's executor returns
    /// instead ([`crate::agent::tools::exec::limit_recorded_results`]).
    pub output_limits: Option<crate::agent::tools::exec::OutputLimits>,
    /// A request layout other than the recorded client's (`None`: as recorded); see
    /// [`ReplayLayout`].
    pub layout: Option<super::layout::ReplayLayout>,
    /// The TTL of the markers of every lane but the main one (`None`: the recorded one).
    pub ttl_other: Option<CacheTtl>,
    /// The agent's long-context stages run on the main lane's messages before every recorded
    /// main call ([`super::stages`]: time-based and cached microcompact, the aggregate tool result
    /// budget, snip, context collapse); `None`: the recording's messages as its client sent them.
    pub stages: Option<crate::agent::compact::CompactConfig>,
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
    /// The knobs of `strategy` a replay honours: the main lane's TTL (replacing the recorded
    /// one: `claude-code` is 5m, `claude-code-1h` 1h), the recorded microcompacts, a peer
    /// mechanism, API context editing, and every autocompact setting (buffer, percentage
    /// override, window, `DISABLE_AUTO_COMPACT`, `DISABLE_COMPACT`: [`super::whatif`]), and
    /// the tool result budget's per-tool thresholds, and the chain's other stages where the
    /// strategy turns them on or changes them (time-based and cached microcompact, the
    /// aggregate budget, snip, collapse: [`super::stages`]). Session-memory compaction and the
    /// request layout (tool search, MCP placement, the boundary) are still the recording's: a
    /// sweep over them says it changes nothing, and `ctxsim strategies` marks them
    /// ([`knob_on_real_sessions`]).
    pub fn from_strategy(strategy: &crate::strategy::Strategy) -> ReplayOptions {
        let editing = &strategy.compact.context_editing;
        ReplayOptions {
            ttl_main: Some(strategy.ttl_main.ttl()),
            recorded_microcompact: strategy.replay_recorded_microcompact,
            peer: strategy.compact.peer.clone(),
            clear_tool_uses: editing.clear_tool_uses.then_some((editing.trigger_input_tokens, strategy.compact.peer.keep_recent)),
            // The defaults are the recorded client's own rule (its version's reserve): the
            // recording's compactions stand. Any other setting moves them.
            autocompact: (strategy.compact.autocompact != Default::default()).then(|| strategy.compact.autocompact.clone()),
            // The recorded results are what the client's own thresholds left; other thresholds
            // are applied to them (a higher one cannot restore what the client persisted).
            // (The aggregate budget is a stage of its own: [`Self::stages`].)
            tool_result_budget: rebudgets_recorded_results(&strategy.compact.tool_result_budget).then(|| strategy.compact.tool_result_budget.clone()),
            // Like the thresholds: the defaults are the recorded client's, other limits apply
            // to what it sent.
            output_limits: {
                let limits = crate::agent::tools::exec::OutputLimits::from_strategy(strategy);
                (limits != crate::agent::tools::exec::OutputLimits::from_strategy(&crate::strategy::Strategy::default())).then_some(limits)
            },
            layout: {
                let layout = ReplayLayout::of(strategy);
                (layout != ReplayLayout::of(&crate::strategy::Strategy::default())).then_some(layout)
            },
            ttl_other: strategy.ttl_other.named(),
            stages: super::stages::configured(&strategy.compact).then(|| super::stages::chain_config(&strategy.compact)),
            ..ReplayOptions::default()
        }
    }

    /// Whether these options change what the model would have seen (beyond the cache).
    pub fn changes_view(&self) -> bool {
        !self.recorded_microcompact
            || self.autocompact.is_some()
            || self.peer.strategy != crate::agent::compact::peers::PeerStrategy::None
            || self.clear_tool_uses.is_some()
            || self.tool_result_budget.is_some()
            || self.output_limits.is_some()
            || self.layout.as_ref().is_some_and(|l| l.eager_tools)
            || self.stages.is_some()
    }
}

/// The per-tool part of a tool result budget (the aggregate settings left at their defaults).
/// Whether `budget`'s per-tool thresholds are other than the defaults. The defaults stand for
/// the recorded client's own thresholds, which a recorded session's tool results already went
/// through: under them no recorded result is persisted again, by the replay or by the agent
/// driving the recording ([`super::workload::keep_recorded_results`]); other thresholds apply
/// to the recorded results (a higher one cannot restore what the client persisted).
pub fn rebudgets_recorded_results(budget: &crate::agent::compact::config::ToolResultBudgetConfig) -> bool {
    per_tool_budget(budget) != per_tool_budget(&Default::default())
}

fn per_tool_budget(config: &crate::agent::compact::config::ToolResultBudgetConfig) -> crate::agent::compact::config::ToolResultBudgetConfig {
    let defaults = crate::agent::compact::config::ToolResultBudgetConfig::default();
    crate::agent::compact::config::ToolResultBudgetConfig { aggregate_enabled: defaults.aggregate_enabled, aggregate_chars: defaults.aggregate_chars, ..config.clone() }
}

/// Knobs a replay of a real session honours ([`ReplayOptions::from_strategy`]), as dotted keys
/// or key prefixes (a prefix ends with `.`).
pub const REPLAYED_KNOBS: [&str; 17] = [
    "ttl_main",
    "replay_recorded_microcompact",
    "compact.peer.",
    "compact.context_editing.clear_tool_uses",
    "compact.context_editing.trigger_input_tokens",
    "compact.autocompact.enabled",
    "compact.autocompact.compact_disabled",
    "compact.autocompact.buffer_tokens",
    "compact.autocompact.max_output_reserve_tokens",
    "compact.autocompact.pct_override",
    "compact.autocompact.window_override",
    "compact.autocompact.context_window",
    "compact.tool_result_budget.per_tool_chars",
    "compact.tool_result_budget.",
    "compact.microcompact.",
    "compact.snip.",
    "compact.context_collapse.",
];

/// Whether a replay of a real session honours the knob `key` (see [`REPLAYED_KNOBS`] and
/// [`super::layout::LAYOUT_KNOBS`]).
pub fn knob_on_real_sessions(key: &str) -> bool {
    REPLAYED_KNOBS
        .iter()
        .chain(&super::layout::LAYOUT_KNOBS)
        .any(|k| if k.ends_with('.') { key.starts_with(k) } else { key == *k || key.starts_with(&format!("{k}.")) })
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            rerender_prompts: true,
            side_entries: true,
            restore_files: true,
            ttl_main: None,
            recorded_microcompact: true,
            peer: Default::default(),
            clear_tool_uses: None,
            autocompact: None,
            info_loss: true,
            compaction_losses: true,
            tool_result_budget: None,
            output_limits: None,
            layout: None,
            ttl_other: None,
            stages: None,
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
    /// Each call shared (a memo's copies of a replay, and a replay resumed from a checkpoint of
    /// it, hold its calls by reference count).
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
    /// Where another autocompact setting moved the session's compactions
    /// ([`ReplayOptions::autocompact`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compaction_whatif: Option<super::whatif::CompactionWhatIf>,
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
    /// (Shared with the checkpoints and a compaction fork's request.)
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
    /// The last compaction was one a what-if inserted: the recorded totals after it are not
    /// anchors for the segment's size.
    pub(super) inserted_compaction: bool,
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
    pub(super) peer: crate::agent::compact::peers::PeerState,
    /// Turn-level client behaviour (main lane only).
    pub(super) turns: TurnState,
    /// Bumped whenever `cleared` changes, and `restored`.
    pub(super) cleared_version: u64,
    pub(super) restored_version: u64,
    /// The lane's messages as last built ([`BuiltView`]).
    pub(super) built: BuiltView,
    pub(super) parts: Parts,
    /// Under a layout what-if: new client processes so far (each recomputes the dynamic system
    /// part), and the deferred tools the lane's `deferred_tools_delta` attachments announce.
    pub(super) dynamic_epoch: u32,
    pub(super) announced_deferred: BTreeSet<String>,
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
    /// The layout what-if in force ([`ReplayOptions::layout`]).
    layout: Option<LayoutCall<'a>>,
}

/// A layout what-if at one call: the layout, the re-computations of the dynamic system part so
/// far, the deferred tools sent up front (name, tokens) and the client version.
#[derive(Clone, Copy)]
struct LayoutCall<'a> {
    layout: &'a ReplayLayout,
    dynamic_epoch: u32,
    up_front: &'a [(String, u64)],
    version: &'a str,
}

/// Tokens of the filler tool each deferred tool sent up front or loaded is sized as when the size
/// profile does not know it (MCP tools).
const DEFERRED_TOOL_TOKENS: u64 = 80;

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
        if let Some(layout) = &self.layout {
            let (tools, system) = self.laid_out(layout, sizes);
            request.tools = Some(tools.into());
            request.system = Some(system);
            parts.system_key = None;
        }
        let label = if self.group == LANE_MAIN { "system".to_owned() } else { format!("system {}", self.group) };
        let key = (label, sizes.prefix_tokens, self.kind, self.params.scale.to_bits(), self.params.per_block.to_bits(), self.cache_control.clone());
        if self.layout.is_none() {
            let system = match parts.system.take() {
                Some((k, system)) if k == key => system,
                _ => system_filler(&key, self.shared),
            };
            request.system = Some(system);
            parts.system_key = Some(key);
        }
        if self.layout.is_some() {
            let tools = request.tools.get_or_insert_with(Default::default);
            tools.extend(
                self.loaded_tools
                    .iter()
                    .map(|name| Tool::custom(name.clone(), filler(name, DEFERRED_TOOL_TOKENS, EstimatorKind::Chars4, 1.0, 0.0, None), serde_json::json!({"type": "object"}))),
            );
        } else if !self.loaded_tools.is_empty() {
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
                && self.layout.is_none_or(|l| l.layout.prompt_caching)
            {
                block.set_cache_control(Some(self.cache_control.clone()));
            }
        }
        request
    }

    /// The label and size of the user-context reminder opening `messages[0]`, if any.
    fn reminder(&self, sizes: GroupSizes) -> Option<(String, u64)> {
        let tokens = sizes.context_tokens - self.dynamic_tokens(sizes);
        (tokens > 0).then(|| (format!("user-context {} {} {}", self.group, self.epoch, tokens), tokens))
    }

    /// Tokens of the dynamic system part under a layout what-if: the main thread's, taken from
    /// the user-context share (see [`ReplayLayout`]); 0 otherwise.
    fn dynamic_tokens(&self, sizes: GroupSizes) -> u64 {
        match self.layout {
            Some(_) if self.group == LANE_MAIN => super::profile::layout_shares().dynamic_tokens.min(sizes.context_tokens),
            _ => 0,
        }
    }

    /// The tools and system prompt of a request under a layout what-if: the parts the prefix
    /// level is cut into ([`ReplayLayout`]), laid out by the agent's block layout.
    fn laid_out(&self, call: &LayoutCall<'_>, sizes: GroupSizes) -> (Vec<Tool>, SystemPrompt) {
        use crate::agent::system_prompt::{attribution_text, block_mode, fingerprint, identity_line, layout_blocks};
        let fill = |label: &str, tokens: u64| if tokens == 0 { String::new() } else { filler(label, tokens, self.kind, self.params.scale, self.params.per_block, self.shared) };
        let shares = super::profile::layout_shares();
        let attribution = attribution_text(call.version, &fingerprint("", call.version), "cli");
        let attribution_tokens = u64::from(chars4(&attribution));
        let identity_tokens = u64::from(chars4(identity_line(true, false)));
        let prefix = sizes.prefix_tokens;
        let tools_tokens = (prefix as f64 * shares.tools_share).round() as u64;
        let static_tokens = prefix.saturating_sub(tools_tokens + attribution_tokens + identity_tokens);
        // The tool is counted as its JSON: the filler makes up what its framing does not.
        let name = format!("tools_{}", self.group);
        let schema = serde_json::json!({"type": "object"});
        let framing = serde_json::to_string(&Tool::custom(name.clone(), String::new(), schema.clone())).unwrap_or_default();
        let framing = u64::from(match self.kind {
            EstimatorKind::Chars4 => chars4(&framing),
            _ => bpe_shared(self.shared, &framing),
        });
        let framing = if self.kind == EstimatorKind::Calibrated { (framing as f64 * self.params.scale).round() as u64 } else { framing };
        let mut tools = vec![Tool::custom(name, fill(&format!("tools {}", self.group), tools_tokens.saturating_sub(framing)), schema)];
        tools.extend(
            call.up_front
                .iter()
                .map(|(name, tokens)| Tool::custom(name.clone(), filler(name, *tokens, EstimatorKind::Chars4, 1.0, 0.0, None), serde_json::json!({"type": "object"}))),
        );
        let options = call.layout.system_options(self.group, self.cache_control.ttl.unwrap_or(CacheTtl::FiveMinutes));
        let inline_mcp = call.up_front.iter().any(|(name, _)| name.starts_with("mcp__"));
        let (mode, _) = block_mode(&options, inline_mcp);
        let attribution = call.layout.attribution.then(|| fill("attribution", attribution_tokens));
        let statics = fill(&format!("system static {}", self.group), static_tokens);
        let dynamics = fill(&format!("system dynamic {} {}", self.group, call.dynamic_epoch), self.dynamic_tokens(sizes));
        let blocks = layout_blocks(attribution.as_deref(), &fill("identity", identity_tokens), &statics, &dynamics, mode, &options);
        (tools, SystemPrompt::Blocks(blocks.into()))
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

/// Puts the unrecorded prefix alone (tools + system of `prefix_tokens`) in the simulated cache,
/// and in every TTL shadow's, as written at `at`: what the record shows another process of the
/// client cached (a warm first call, Claude Desktop's shared static prefix).
fn seed_prefix(measurer: &mut Measurer, shadows: &mut [TtlShadow], unrecorded: &Unrecorded<'_>, call: &RecordedCall, prefix_tokens: u64, at: u64) {
    let prefix_only = unrecorded.request(&call.model, Vec::new(), GroupSizes { prefix_tokens, context_tokens: 0 });
    if let Ok(flat) = measurer.flatten(&prefix_only) {
        for shadow in shadows.iter_mut() {
            shadow.process(measurer, &flat, call.lane == LANE_MAIN, at, 0);
        }
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
/// shared: requests built with equal keys (a replay's lanes, forks and what-ifs) hold one
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
    replay_dispatch(session, measurer, options, true, None)
}

/// [`replay_session`] sharing replays with other calls on the same session through `memo`
/// (the points of a sweep): the same result, each distinct replay made once.
pub fn replay_session_shared(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions, memo: &super::whatif::ReplayMemo) -> SessionReplay {
    replay_dispatch(session, measurer, options, true, Some(memo))
}

/// With another autocompact setting the compactions move first ([`super::whatif`]).
fn replay_dispatch(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions, incremental: bool, memo: Option<&super::whatif::ReplayMemo>) -> SessionReplay {
    match (&options.autocompact, memo) {
        (Some(config), _) => {
            let (mut replay, whatif) = super::whatif::replay_with_autocompact(session, measurer, options, config, incremental, memo);
            replay.compaction_whatif = Some(whatif);
            replay
        }
        (None, Some(memo)) => super::whatif::replay_memoized(session, measurer, options, incremental, memo),
        (None, None) => replay_session_with(session, measurer, options, incremental, &mut []),
    }
}

/// [`replay_session`] with the session's compactions where they are; `incremental` as in
/// [`replay_session_with`].
pub fn replay_session_plain(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions, incremental: bool) -> SessionReplay {
    replay_session_with(session, measurer, options, incremental, &mut [])
}

/// [`replay_session_plain`], with the compactions it went through (judged or not): a replay
/// that judges them is this one with [`CompactionsSeen::judge`]'s losses.
pub fn replay_session_plain_seen(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions, incremental: bool) -> (SessionReplay, CompactionsSeen) {
    replay_session_seeing(session, measurer, options, incremental, &mut [], None, Checkpointing::Off)
}

/// A what-if of the main lane's TTL simulated alongside a replay ([`replay_session_shadowed`]):
/// a second cache fed the same requests, the main lane's markers at [`TtlShadow::ttl`].
///
/// The what-if replay ([`ReplayOptions::ttl_main`]) builds the same requests but for their
/// markers' TTL, as long as nothing the replay decides from the simulated cache comes out
/// otherwise: whether a new turn seeds the previous turn's side entry (it does when the main
/// lane's previous call read anything) and whether the simulator accepted the request. When either differs at some call, or a
/// request carries an automatic marker, the shadow is not [`TtlShadow::exact`] and the what-if
/// must be replayed in full.
#[derive(Debug)]
pub struct TtlShadow {
    pub ttl: CacheTtl,
    cache: crate::measure::CacheSim,
    /// The outcome of every measured call, by call index.
    outcomes: BTreeMap<usize, crate::measure::CacheOutcome>,
    /// This cache's read of the main lane's previous measured call.
    previous_read_main: Option<u64>,
    exact: bool,
}

impl TtlShadow {
    pub fn new(ttl: CacheTtl) -> TtlShadow {
        TtlShadow { ttl, cache: crate::measure::CacheSim::new(), outcomes: BTreeMap::new(), previous_read_main: None, exact: true }
    }

    /// Whether [`Self::apply`] gives the what-if replay's figures exactly.
    pub fn exact(&self) -> bool {
        self.exact
    }

    /// Runs one request of the replay through this cache (`main`: a call of the main lane,
    /// whose markers take [`Self::ttl`]).
    fn process(&mut self, measurer: &Measurer, flat: &FlatRequest, main: bool, start_ms: u64, first_token_ms: u64) -> Option<crate::measure::CacheOutcome> {
        // The measurer caches nothing for a model it does not know.
        let min = measurer.table().lookup(&flat.model).ok()?.min_cacheable_tokens;
        if flat.auto_cache_control.is_some() {
            self.exact = false;
        }
        match self.cache.process_as(flat, min, start_ms, first_token_ms, main.then_some(self.ttl)) {
            Ok(outcome) => Some(outcome),
            Err(_) => {
                self.exact = false;
                None
            }
        }
    }

    /// The measured call `index` as the baseline measured it (`metrics`) and as this cache did.
    fn measured(&mut self, index: usize, main: bool, outcome: Option<crate::measure::CacheOutcome>, metrics: &RequestMetrics) {
        match outcome {
            Some(outcome) if metrics.error.is_none() => {
                if main {
                    self.previous_read_main = Some(outcome.cache_read_input_tokens);
                }
                self.outcomes.insert(index, outcome);
            }
            _ => self.exact = false,
        }
    }

    /// A new user turn of the main lane: whether it seeds the previous turn's side entry
    /// depends on whether the previous call read anything, which this cache may answer
    /// otherwise (`turns` as before the turn, the arguments of [`TurnState::on_new_turn`]).
    fn new_turn(&mut self, turns: &TurnState, profile: &ClientProfile, messages: &[Message], record: super::turns::TurnRecord<'_>) {
        let side_entry = |previous_read| {
            let mut turns = turns.clone();
            turns.previous_read = previous_read;
            turns.on_new_turn(profile, messages, record).side_entry
        };
        if side_entry(turns.previous_read) != side_entry(self.previous_read_main) {
            self.exact = false;
        }
    }

    /// `replay` (the baseline this shadow ran alongside) turned into the what-if replay: every
    /// measured call's simulated input, cache read and cache writes as this cache had them.
    pub fn apply(&self, replay: &mut SessionReplay) {
        for call in &mut replay.calls {
            let (Some(outcome), Some(metrics)) = (self.outcomes.get(&call.index), call.metrics.as_mut()) else { continue };
            metrics.input_tokens = outcome.input_tokens;
            metrics.cache_read_input_tokens = outcome.cache_read_input_tokens;
            metrics.cache_creation_input_tokens = outcome.cache_creation_input_tokens;
            metrics.cache_creation.ephemeral_5m_input_tokens = outcome.ephemeral_5m_input_tokens;
            metrics.cache_creation.ephemeral_1h_input_tokens = outcome.ephemeral_1h_input_tokens;
            call.sim_input = outcome.input_tokens as f64;
            call.sim_cache_read = outcome.cache_read_input_tokens as f64;
            call.sim_cache_creation = outcome.cache_creation_input_tokens as f64;
        }
    }
}

/// [`replay_session`] with what-ifs of the main lane's TTL simulated alongside (`shadows`);
/// `options` must not move compactions (`autocompact: None`).
pub fn replay_session_shadowed(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions, shadows: &mut [TtlShadow]) -> SessionReplay {
    assert!(options.autocompact.is_none(), "a TTL shadow runs alongside a replay with the recorded compactions");
    replay_session_with(session, measurer, options, true, shadows)
}

/// [`replay_session`] the slow way, the reference the fast one must equal: every call's
/// messages rebuilt from its view and changed as the client did, the flattener comparing them by
/// content with the previous request's.
pub fn replay_session_reference(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions) -> SessionReplay {
    replay_dispatch(session, measurer, options, false, None)
}

/// Called with each request a replay builds: its recorded call's index and the body.
pub type RequestObserver<'a> = dyn FnMut(usize, &Request) + 'a;

/// [`replay_session`] without a what-if, handing `observe` every request it builds (the index
/// of its recorded call and the body, before measurement).
pub fn replay_session_observed(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions, observe: &mut dyn FnMut(usize, &Request)) -> SessionReplay {
    replay_session_observing(session, measurer, options, true, &mut [], Some(observe), Checkpointing::Off)
}

/// `incremental`: each lane's built messages are kept from call to call ([`BuiltView`]) and the
/// request's messages carry keys for the flattener.
fn replay_session_with(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions, incremental: bool, shadows: &mut [TtlShadow]) -> SessionReplay {
    replay_session_observing(session, measurer, options, incremental, shadows, None, Checkpointing::Off)
}

/// Checkpoints a replay takes at most (evenly spaced over its calls).
pub const CHECKPOINTS: usize = 16;
/// Calls between two checkpoints at least.
const CHECKPOINT_MIN_STRIDE: usize = 8;

/// The state of a replay before one of its calls: everything the calls before it left for the
/// calls after it (the lanes' scan positions and state, the measurer's cache and tracks, the
/// unrecorded sizes, the notes, the compactions seen), but the lanes' built messages, which the
/// resumed replay builds again. A replay of the same session with
/// compactions moved ([`ImportedSession::with_compaction_edits`]) is the same replay up to the
/// first edited event, so it starts from the last checkpoint before that
/// ([`replay_session_from`]) instead of from the first call. Taken only when
/// [`checkpoints_apply`].
#[derive(Debug, Clone)]
pub struct ReplayCheckpoint {
    /// The position in the session's calls of the next call.
    position: usize,
    /// The event index of the call before it.
    last_event: usize,
    measurer: crate::measure::MeasurerState,
    /// Notes made by the calls so far (the notes of the set-up are the session's own).
    notes: BTreeSet<String>,
    unrecorded_main: Option<UnrecordedSizes>,
    lanes: BTreeMap<String, LaneState>,
    views: crate::recording::ViewCache,
    keys: MessageKeys,
    file_tokens: BTreeMap<(u128, String), u64>,
    groups: BTreeMap<String, GroupSizes>,
    turn: u32,
    loss: crate::measure::loss::LossTracker,
    diverged_calls: usize,
    first_divergence: Option<(usize, String)>,
    previous_main: Option<(usize, u64)>,
    compactions: Vec<std::sync::Arc<CompactionSeen>>,
    windows: BTreeMap<String, u64>,
}

/// A main-lane compaction a replay went through, judged when the replay ends
/// ([`super::loss::compaction_loss`] reads the session's later turns, which an edit after it
/// may change): the call after it, the previous main call, the messages after it and the two
/// calls' contexts.
#[derive(Debug, Clone)]
struct CompactionSeen {
    call: usize,
    previous: usize,
    after: Vec<Message>,
    context_before: u64,
    context_after: u64,
}

/// The checkpoints of one replay of a session as recorded ([`replay_session_checkpointed`]),
/// with the replay (its calls before a checkpoint are the resumed replay's).
#[derive(Debug)]
pub struct ReplayCheckpoints {
    at: Vec<ReplayCheckpoint>,
    replay: std::sync::Arc<SessionReplay>,
}

impl ReplayCheckpoint {
    /// The position in the session's calls of the call the checkpoint precedes.
    pub fn position(&self) -> usize {
        self.position
    }
}

impl ReplayCheckpoints {
    pub fn new(at: Vec<ReplayCheckpoint>, replay: std::sync::Arc<SessionReplay>) -> ReplayCheckpoints {
        ReplayCheckpoints { at, replay }
    }

    /// The replay the checkpoints were taken in.
    pub fn replay(&self) -> &std::sync::Arc<SessionReplay> {
        &self.replay
    }

    /// The last checkpoint whose calls so far all come before event `first_edited` (the first
    /// event an edited session changes).
    pub fn before(&self, first_edited: usize) -> Option<&ReplayCheckpoint> {
        self.at.iter().rev().find(|c| c.last_event < first_edited)
    }
}

/// Whether a replay under `options` takes and resumes from checkpoints: not with the agent's
/// stages on (their state is not kept).
pub fn checkpoints_apply(options: &ReplayOptions) -> bool {
    options.stages.is_none() && options.autocompact.is_none()
}

/// Where a replay starts and what it keeps.
enum Checkpointing<'a> {
    Off,
    /// Take checkpoints into this list (every [`CHECKPOINTS`]th of the calls, or before the
    /// calls at these positions).
    Record(&'a mut Vec<ReplayCheckpoint>, Option<&'a [usize]>),
    /// Start from this checkpoint, the calls before it as in this replay; take checkpoints
    /// after it into the list, before the calls at these positions, when there is one.
    Resume(&'a ReplayCheckpoint, &'a SessionReplay, Option<(&'a mut Vec<ReplayCheckpoint>, &'a [usize])>),
}

/// [`replay_session`] (with TTL `shadows` as [`replay_session_shadowed`]) taking up to
/// [`CHECKPOINTS`] checkpoints on the way, for replays of the session with compactions moved
/// ([`replay_session_from`]). The replay is the same as without them.
pub fn replay_session_checkpointed(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions, incremental: bool, shadows: &mut [TtlShadow]) -> (SessionReplay, Vec<ReplayCheckpoint>) {
    assert!(checkpoints_apply(options), "checkpoints are taken with the recorded compactions and no agent stages");
    let mut at = Vec::new();
    let replay = replay_session_observing(session, measurer, options, incremental, shadows, None, Checkpointing::Record(&mut at, None));
    (replay, at)
}

/// The replay of `session` (the session the checkpoints were taken on, its compactions moved by
/// [`ImportedSession::with_compaction_edits`] after the checkpoint's calls) from `checkpoint` of
/// `checkpoints` on: the same replay as from the first call, under the options and estimator the
/// checkpoints were taken with.
pub fn replay_session_from(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions, incremental: bool, checkpoints: &ReplayCheckpoints, checkpoint: &ReplayCheckpoint) -> SessionReplay {
    replay_session_from_seen(session, measurer, options, incremental, checkpoints, checkpoint).0
}

/// [`replay_session_from`], with the compactions it went through (as
/// [`replay_session_plain_seen`]).
pub fn replay_session_from_seen(
    session: &ImportedSession,
    measurer: &mut Measurer,
    options: &ReplayOptions,
    incremental: bool,
    checkpoints: &ReplayCheckpoints,
    checkpoint: &ReplayCheckpoint,
) -> (SessionReplay, CompactionsSeen) {
    replay_session_seeing(session, measurer, options, incremental, &mut [], None, Checkpointing::Resume(checkpoint, &checkpoints.replay, None))
}

/// [`replay_session_from_seen`] taking checkpoints after `checkpoint`, before the calls at
/// `positions` (in the session's calls): a replay of the same edited session with later edits
/// moved starts from them ([`ReplayCheckpoints::before`] with the first event the two differ
/// in). The replay is the same as without them.
pub fn replay_session_from_checkpointed(
    session: &ImportedSession,
    measurer: &mut Measurer,
    options: &ReplayOptions,
    incremental: bool,
    checkpoints: &ReplayCheckpoints,
    checkpoint: &ReplayCheckpoint,
    positions: &[usize],
) -> (SessionReplay, CompactionsSeen, Vec<ReplayCheckpoint>) {
    assert!(checkpoints_apply(options), "checkpoints are taken with no agent stages");
    let mut at = Vec::new();
    let (replay, seen) =
        replay_session_seeing(session, measurer, options, incremental, &mut [], None, Checkpointing::Resume(checkpoint, &checkpoints.replay, Some((&mut at, positions))));
    (replay, seen, at)
}

/// [`replay_session_plain_seen`] taking checkpoints before the calls at `positions`.
pub fn replay_session_plain_checkpointed(
    session: &ImportedSession,
    measurer: &mut Measurer,
    options: &ReplayOptions,
    incremental: bool,
    positions: &[usize],
) -> (SessionReplay, CompactionsSeen, Vec<ReplayCheckpoint>) {
    assert!(checkpoints_apply(options), "checkpoints are taken with no agent stages");
    let mut at = Vec::new();
    let (replay, seen) = replay_session_seeing(session, measurer, options, incremental, &mut [], None, Checkpointing::Record(&mut at, Some(positions)));
    (replay, seen, at)
}

/// The main-lane compactions a replay went through, in call order, for judging their
/// information loss after it ([`super::loss::compaction_loss`]).
#[derive(Debug, Clone, Default)]
pub struct CompactionsSeen(Vec<std::sync::Arc<CompactionSeen>>);

impl CompactionsSeen {
    /// Their losses in `session` (the session replayed): what the replay gives as
    /// [`SessionReplay::compaction_losses`] when its options judge them.
    pub fn judge(&self, session: &ImportedSession) -> Vec<super::loss::CompactionLoss> {
        self.0.iter().map(|c| super::loss::compaction_loss(session, c.call, c.previous, &c.after, c.context_before, c.context_after)).collect()
    }
}

fn replay_session_observing(
    session: &ImportedSession,
    measurer: &mut Measurer,
    options: &ReplayOptions,
    incremental: bool,
    shadows: &mut [TtlShadow],
    observe: Option<&mut RequestObserver<'_>>,
    checkpointing: Checkpointing<'_>,
) -> SessionReplay {
    replay_session_seeing(session, measurer, options, incremental, shadows, observe, checkpointing).0
}

fn replay_session_seeing(
    session: &ImportedSession,
    measurer: &mut Measurer,
    options: &ReplayOptions,
    incremental: bool,
    shadows: &mut [TtlShadow],
    mut observe: Option<&mut RequestObserver<'_>>,
    mut checkpointing: Checkpointing<'_>,
) -> (SessionReplay, CompactionsSeen) {
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

    // Tool search off: the deferred tools the session's ToolSearch calls load are sent from the
    // start.
    let eager = options.layout.as_ref().is_some_and(|l| l.eager_tools);
    let searched_tools: BTreeSet<String> = if eager { tool_search_selections(session) } else { BTreeSet::new() };

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
    let mut compactions: Vec<std::sync::Arc<CompactionSeen>> = Vec::new();
    // The agent's long-context stages on the main lane ([`super::stages`]).
    let mut stages = super::stages::StagesState::default();
    let mut windows: BTreeMap<String, u64> = BTreeMap::new();
    // The requests the transcript recorded sending, used where the options leave them as sent.
    let records_requests = !session.api_requests.requests.is_empty();
    let use_records = records_requests && options.recorded_requests && !options.changes_view() && options.layout.is_none();
    let mut rebuilder = crate::recording::api_requests::Rebuilder::new(&session.api_requests);

    let mut start = 0;
    if let Checkpointing::Resume(at, replay, _) = &checkpointing {
        assert!(shadows.is_empty() && observe.is_none(), "a resumed replay has no TTL shadow or observer");
        start = at.position;
        measurer.restore(&at.measurer);
        profile_notes.clone_from(&at.notes);
        sizing.unrecorded_main = at.unrecorded_main;
        lanes.clone_from(&at.lanes);
        views.clone_from(&at.views);
        keys = at.keys.clone();
        file_tokens.borrow_mut().clone_from(&at.file_tokens);
        sizing.groups.clone_from(&at.groups);
        out.extend_shared(&replay.calls, start);
        turn = at.turn;
        loss.clone_from(&at.loss);
        diverged_calls = at.diverged_calls;
        first_divergence.clone_from(&at.first_divergence);
        previous_main = at.previous_main;
        compactions.clone_from(&at.compactions);
        windows.clone_from(&at.windows);
    }
    let stride = (session.calls.len() / CHECKPOINTS).max(CHECKPOINT_MIN_STRIDE);
    for (position, call) in session.calls.iter().enumerate().skip(start) {
        let record = match &mut checkpointing {
            Checkpointing::Record(at, None) => (position % stride == 0).then_some(&mut **at),
            Checkpointing::Record(at, Some(positions)) => positions.contains(&position).then_some(&mut **at),
            Checkpointing::Resume(_, _, Some((at, positions))) if position > start => positions.contains(&position).then_some(&mut **at),
            _ => None,
        };
        if let Some(at) = record
            && position > 0
        {
            at.push(ReplayCheckpoint {
                position,
                last_event: session.calls[position - 1].event_index,
                measurer: measurer.state(),
                notes: profile_notes.clone(),
                unrecorded_main: sizing.unrecorded_main,
                // The lanes' built views and the view cache are not kept (the largest parts):
                // the resumed replay rebuilds each lane's messages once, with serials the
                // kept keys never saw.
                lanes: lanes
                    .iter_mut()
                    .map(|(name, lane)| {
                        // Nor the filler parts of its last request (a cache: the resumed
                        // replay takes them from the filler memo).
                        let built = std::mem::take(&mut lane.built);
                        let parts = std::mem::take(&mut lane.parts);
                        let kept = lane.clone();
                        (lane.built, lane.parts) = (built, parts);
                        (name.clone(), kept)
                    })
                    .collect(),
                views: views.restarted(),
                keys: keys.clone(),
                file_tokens: file_tokens.borrow().clone(),
                groups: sizing.groups.clone(),
                turn,
                loss: loss.clone(),
                diverged_calls,
                first_divergence: first_divergence.clone(),
                previous_main,
                compactions: compactions.clone(),
                windows: windows.clone(),
            });
        }
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
        // It sends what the main thread holds now: after a compaction (a what-if's included)
        // the older history of a mid-conversation segment is gone from it too.
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
            eager,
        };
        let scan = super::record_view::scan_lane(&scan_cx, measurer, state, call, &profile, &turn_profile, &family, params, &mut call_events);
        for _ in 0..scan.main_compactions {
            stages.on_compaction();
        }
        let super::record_view::LaneScan { request_start, turn_scan, attachment_chars, unsized_attachment_chars, .. } = scan;

        if let Some(reason) = super::record_view::skip_reason(call) {
            state.carried_events = call_events.clone();
            out.push(skipped_call(call, call_events, reason.to_owned()));
            continue;
        }
        let (ttl, start_ms, previous_time) = super::record_view::call_timing(state, call, options, request_start, &mut call_events);

        // The messages the call saw, with what the client changed in them. A call of its own
        // lane without a peer mechanism updates the lane's built view and borrows its messages
        // for the request (given back after the measurement, with keys for the flattener); a
        // fork or a peer-rewritten call builds its own.
        let peer_active = options.peer.strategy != crate::agent::compact::peers::PeerStrategy::None
            || options.clear_tool_uses.is_some()
            || options.tool_result_budget.is_some()
            || options.output_limits.is_some()
            || eager
            || options.stages.is_some();
        let (mut messages, marked_result, mut lent) = if incremental && main_fork.is_none() && !peer_active {
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
            if main_fork.is_some() && options.stages.is_some() {
                stages.fork_view(&mut messages);
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
        // The strategy's own mechanisms on what the recorded client sent.
        let mut peer_stages = Vec::new();
        // The agent's long-context stages, on the main thread.
        if let Some(config) = &options.stages
            && call.lane == LANE_MAIN
        {
            // The window the client ran with (200k unless the record shows 1M), or the one asked
            // for, capped at what the model offers.
            let info = measurer.table().lookup(&call.model).ok();
            let window = *windows.entry(call.model.clone()).or_insert_with(|| super::triggers::recorded_window(session, &call.model, info));
            let limits = crate::agent::compact::ModelLimits {
                context_window: config.autocompact.context_window.map_or(window, |asked| asked.min(info.map_or(asked, |m| m.context_window))),
                max_output_tokens: info.map_or(32_000, |m| m.max_output_tokens),
            };
            let run = stages.run(config, &mut messages, limits, start_ms, previous_time);
            for id in run.cleared {
                if state.cleared.insert(id) {
                    state.cleared_version += 1;
                }
            }
            if run.changed {
                diverged_calls += 1;
                if first_divergence.is_none() {
                    let fired: Vec<String> = run.reports.iter().map(|r| format!("{} ({})", r.name, r.reason)).collect();
                    let why = if fired.is_empty() { "the agent's stages changed the recorded messages".to_owned() } else { format!("{} changed the recorded messages", fired.join(", ")) };
                    first_divergence = Some((call.index, why));
                }
            }
            call_events.extend(run.events);
            peer_stages.extend(run.reports);
        }
        if let Some(budget) = &options.tool_result_budget {
            let replaced = crate::agent::compact::tool_result_budget::apply_to_messages(&mut messages, budget, "tool-results");
            if !replaced.is_empty() && call.lane == LANE_MAIN {
                diverged_calls += 1;
                if first_divergence.is_none() {
                    first_divergence = Some((call.index, format!("the tool result budget replaced the recorded result {} by its preview", replaced[0])));
                }
            }
        }
        if let Some(limits) = &options.output_limits {
            let changed = crate::agent::tools::exec::limit_recorded_results(&mut messages, limits);
            if !changed.is_empty() && call.lane == LANE_MAIN {
                diverged_calls += 1;
                if first_divergence.is_none() {
                    first_divergence = Some((call.index, format!("the tool-output limits replaced the recorded result {} by what the client's executor returns", changed[0])));
                }
            }
        }
        if eager && drop_deferred_listings(&mut messages) && call.lane == LANE_MAIN {
            diverged_calls += 1;
            if first_divergence.is_none() {
                first_divergence = Some((call.index, "tool search off: the deferred-tools listing the recorded client sent is not sent, every deferred tool is".to_owned()));
            }
        }
        if options.peer.strategy != crate::agent::compact::peers::PeerStrategy::None || options.clear_tool_uses.is_some() {
            let window = measurer.table().lookup(&call.model).map_or(200_000, |m| m.context_window);
            let base = sizing.groups.get(&group).map_or(0, |g| g.prefix_tokens + g.context_tokens);
            let before = crate::agent::compact::peers::estimate_tokens(&messages);
            let mut outcomes = state.peer.apply(&options.peer, &mut messages, window, base);
            if let Some((trigger, keep)) = options.clear_tool_uses {
                outcomes.push(crate::agent::compact::peers::clear_tool_uses(&mut messages, trigger, keep, base));
            }
            let changed = crate::agent::compact::peers::estimate_tokens(&messages) != before;
            if changed {
                diverged_calls += 1;
                if first_divergence.is_none() {
                    let fired: Vec<&str> = outcomes.iter().filter(|o| o.fired).map(|o| o.stage).collect();
                    first_divergence = Some((call.index, format!("{} rewrote the recorded messages", fired.join("+"))));
                }
            }
            peer_stages.extend(outcomes
                .into_iter()
                .filter(|o| o.fired)
                .map(|o| crate::measure::StageReport {
                    name: o.stage.to_owned(),
                    fired: true,
                    reason: o.reason,
                    tokens_before: o.tokens_before,
                    tokens_after: o.tokens_after,
                    invalidated_from: None,
                }));
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
            &mut |turns, messages, record| {
                for shadow in shadows.iter_mut() {
                    shadow.new_turn(turns, &turn_profile, messages, record);
                }
            },
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
        let (rebuilt, reconstructed_because) = super::record_view::recorded_request(use_records, &mut rebuilder, call, options);

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
        let up_front: Vec<(String, u64)> = if eager {
            state
                .announced_deferred
                .union(&searched_tools)
                .map(|name| (name.clone(), super::profile::builtin_tool_tokens(name).unwrap_or(DEFERRED_TOOL_TOKENS)))
                .collect()
        } else {
            Vec::new()
        };
        let version = call.version.as_deref().unwrap_or("");
        let unrecorded = Unrecorded {
            group: &group,
            epoch: state.rerender_epoch,
            loaded_tools: &state.loaded_tools,
            kind,
            params,
            shared: shared.as_deref(),
            cache_control: CacheControl::ephemeral().with_ttl(Some(ttl)),
            marked_result: marked_result.as_deref(),
            layout: options.layout.as_ref().map(|layout| LayoutCall { layout, dynamic_epoch: state.dynamic_epoch, up_front: &up_front, version }),
        };

        // A warm first call: an earlier session of the client cached its prefix.
        if let Some(prefix) = sized
            && call.usage.cache_read_input_tokens > 0
        {
            seed_prefix(measurer, shadows, &unrecorded, call, prefix, start_ms.saturating_sub(1));
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
                for shadow in shadows.iter_mut() {
                    shadow.process(measurer, &side_flat, call.lane == LANE_MAIN, at, 0);
                }
                let _ = measurer.seed_cache(&side_flat, at, 0);
                super::record_view::side_entry_seen(&mut call_events, at, start_ms, previous_time, ttl);
            }
        }
        // Claude Desktop's static prefix is never cold: past the TTL the call still reads the
        // prefix level in force (other clients sent the same bytes; see `ClientProfile`). Only
        // where the layout keeps the global-scope marker on the static block (the dynamic
        // boundary, prompt caching, and no deferred tool listed up front, which makes the
        // client drop the global scope). Seeded past the shortest TTL of the replay and its TTL
        // shadows, so each sees it where it expired.
        let expired = call_events.iter().any(|e| e == "ttl_expired");
        let global_static_block = options.layout.as_ref().is_none_or(|l| l.global_scope && l.boundary && l.prompt_caching && !l.eager_tools);
        let shortest_ttl = shadows.iter().map(|s| s.ttl.millis()).fold(ttl.millis(), u64::min);
        let past_a_ttl = expired || previous_time.is_some_and(|p| start_ms.saturating_sub(p) >= shortest_ttl);
        if profile.static_prefix_shared && call.lane == LANE_MAIN && rebuilt.is_none() && global_static_block && past_a_ttl {
            seed_prefix(measurer, shadows, &unrecorded, call, sizes.prefix_tokens, start_ms.saturating_sub(1));
            if expired {
                call_events.push(super::uncertainty::SHARED_PREFIX.into());
            }
        }
        let request_keys = if rebuilt.is_some() { None } else { lent.as_ref().map(|l| unrecorded.request_keys(&mut keys, &messages, &l.built.keys, state.restored_version, sizes)) };
        let own_messages = messages.len();
        let mut request = unrecorded.request_with(&call.model, messages, sizes, &mut state.parts);
        if options.stages.is_some() && call.lane == LANE_MAIN {
            let offset = request.messages.len() - own_messages;
            stages.insert_cache_edits(&mut request, offset);
        }
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
        measure_input.stages = peer_stages;
        let shadowed: Vec<_> = shadows.iter_mut().map(|shadow| shadow.process(measurer, &flat, call.lane == LANE_MAIN, start_ms, call.time_ms - start_ms)).collect();
        let metrics = match measurer.measure_flat(measure_input, flat) {
            Ok(m) => m,
            Err(e) => {
                out.push(skipped_call(call, Vec::new(), e.to_string()));
                continue;
            }
        };
        for (shadow, outcome) in shadows.iter_mut().zip(shadowed) {
            shadow.measured(call.index, call.lane == LANE_MAIN, outcome, &metrics);
        }
        if options.stages.is_some() && call.lane == LANE_MAIN {
            stages.sent();
        }
        if options.info_loss {
            loss.observe(&request, &metrics);
        }
        if call.lane == LANE_MAIN {
            // Kept whether or not this replay judges them: a replay resumed from its
            // checkpoints may.
            if let Some((previous, context_before)) = previous_main
                && metrics.events.iter().any(|e| e == "compaction")
            {
                compactions.push(std::sync::Arc::new(CompactionSeen { call: call.index, previous, after: request.messages.clone(), context_before, context_after: metrics.context_tokens }));
            }
            previous_main = Some((call.index, metrics.context_tokens));
        }
        let built = reconstructed.unwrap_or(request);
        match lent.take() {
            Some(lent) => state.built = lent.give_back(built, &mut state.parts),
            // (The agent's stages may have put blocks before the reminder.)
            None if options.stages.is_none() => state.parts.recover(built, own_messages),
            None => {}
        }
        // The record has just shown the prefix level: size the unrecorded part by it from now
        // on, and let the simulated cache hold what the real one does after this call.
        if let (Some(level), Some(base)) = (revealed, base) {
            let g = sizing.take_level(&group, level, &mut call_events);
            let corrected = unrecorded.request(&call.model, base, super::record_view::sizes_in(state, g, truncated, user_context_prior));
            if let Ok(mut flat) = measurer.flatten(&corrected) {
                shape_flat(&corrected, &mut flat, strips_thinking, transient);
                for shadow in shadows.iter_mut() {
                    shadow.process(measurer, &flat, call.lane == LANE_MAIN, start_ms, call.time_ms - start_ms);
                }
                let _ = measurer.seed_cache(&flat, start_ms, call.time_ms - start_ms);
            }
        }
        state.prev_recorded_cached = Some(call.usage.cache_read_input_tokens + call.usage.cache_creation_input_tokens);
        // Either read counts: the record's (a prefix another process kept warm) or the replay's
        // own (a what-if that keeps what the recording lost).
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
    let seen = CompactionsSeen(compactions);
    let compaction_losses = if options.compaction_losses { seen.judge(session) } else { Vec::new() };
    profile_notes.extend(setup_notes);
    let replay = SessionReplay {
        input,
        estimator: kind.name().to_owned(),
        calls: out,
        info_loss: loss.finish(),
        diverged_calls,
        first_divergence,
        head_truncated: session.recording.header.head_truncated,
        unrecorded_main: sizing.unrecorded_main,
        compaction_whatif: None,
        profile_notes: profile_notes.into_iter().collect(),
        compaction_losses,
        user_context_after_compaction: user_context_prior,
        calls_from_records: 0,
        records_requests,
    }
    .with_record_count();
    (replay, seen)
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
