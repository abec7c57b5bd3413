//! A recorded session loaded for measurement ([`load_session`]), the options that say how its
//! record is read ([`ReplayOptions`]: `fidelity`'s ablations among them), and the per-call
//! output the agent's run of it gives ([`SessionReplay`], [`CallReplay`]), which the fidelity
//! report scores against the recorded usage.
//!
//! The record-based request builder that once rebuilt every recorded request here was removed
//! in session 26: every recorded session runs through the agent (recording -> workload ->
//! agent -> measure, [`super::workload`]).

use std::path::Path;

use serde::Serialize;

use crate::api::Usage;
use crate::measure::RequestMetrics;
use crate::recording::{ImportError, ImportedSession, InputFormat, RecordedCall, detect_format_at, import_claude_code, read_recording};

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

    /// Adds to each call the events the record shows before it (`events`, by call index: a gap
    /// past the TTL, a new turn, a compaction, a re-rendered prompt...) that it does not carry:
    /// what names the breaks' causes and the calls' events of the agent's run.
    pub fn add_record_events(&mut self, events: &std::collections::BTreeMap<usize, Vec<String>>) {
        for call in &mut self.calls {
            for event in events.get(&call.index).into_iter().flat_map(|e| e.iter()) {
                if !call.events.contains(event) {
                    call.events.push(event.clone());
                }
            }
        }
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

/// Convenience for callers holding a [`RecordedCall`] list only.
pub fn compared_calls(calls: &[RecordedCall]) -> usize {
    calls.iter().filter(|c| !c.is_synthetic && !c.is_api_error && c.usage.prompt_tokens() > 0).count()
}
