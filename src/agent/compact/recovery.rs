//! Recovery after the API refuses a request (§1.4).
//!
//! - **Prompt too long** (`prompt is too long: N tokens > M maximum`): the ladder is collapse
//!   drain (once per chain of retries) → reactive compact (once per turn) → surface the error.
//!   The media-size error takes the same path without the collapse rung.
//! - **max_output_tokens**: up to 3 meta user messages telling the model to resume; then the
//!   error is surfaced.
//! - **Rewrites**: the drain collapses spans; reactive compact rebuilds the conversation through
//!   [`super::chain::Chain::finish_compaction`]. **Invalidates**: as those stages do.

use crate::api::Message;

use super::autocompact;
use super::context::{ChainContext, CompactTrigger, CompactionRequest, Entry};
use super::context_collapse;
use super::counting::token_count_with_estimation;

/// The API's error text for an over-long prompt.
pub fn prompt_too_long_message(actual: u64, limit: u64) -> String {
    format!("prompt is too long: {actual} tokens > {limit} maximum")
}

/// Parses `… N tokens > M maximum` into (N, M).
pub fn parse_prompt_too_long(text: &str) -> Option<(u64, u64)> {
    let rest = &text[text.find("too long:")? + "too long:".len()..];
    let mut words = rest.split_whitespace();
    let actual = words.next()?.parse().ok()?;
    if words.next()? != "tokens" || words.next()? != ">" {
        return None;
    }
    let limit = words.next()?.parse().ok()?;
    Some((actual, limit))
}

/// What the simulated API answers for a prompt of `tokens` on a `window`-token model.
pub fn simulated_api_error(tokens: u64, window: u64) -> Option<String> {
    (tokens > window).then(|| prompt_too_long_message(tokens, window))
}

/// Why the previous iteration continued (the subset recovery needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    NextTurn,
    CollapseDrainRetry,
    ReactiveCompactRetry,
    MaxOutputTokensRecovery,
}

/// Loop state of the ladder, reset at each new turn except where noted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryState {
    pub has_attempted_reactive_compact: bool,
    pub last_transition: Option<Transition>,
    pub max_output_recovery_count: u32,
}

impl RecoveryState {
    /// `next_turn`: tools ran, a new iteration starts.
    pub fn next_turn(&mut self) {
        *self = RecoveryState { last_transition: Some(Transition::NextTurn), ..RecoveryState::default() };
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum RecoveryAction {
    /// Collapses were committed; retry the request (`collapse_drain_retry`).
    CollapseDrainRetry { committed: usize },
    /// Send this compaction request, then `finish_compaction`; if it compacted, retry
    /// (`reactive_compact_retry`), else surface.
    ReactiveCompact(CompactionRequest),
    /// Give up: show the error and end the turn (`prompt_too_long` / `image_error`).
    Surface { error: String },
}

fn reactive(cx: &mut ChainContext<'_>, state: &mut RecoveryState, error: &str) -> RecoveryAction {
    if cx.config.autocompact.reactive_enabled && !cx.config.autocompact.compact_disabled && !state.has_attempted_reactive_compact {
        state.has_attempted_reactive_compact = true;
        state.last_transition = Some(Transition::ReactiveCompactRetry);
        let pre = token_count_with_estimation(&cx.entries);
        let entries: Vec<Entry> = cx.entries.clone();
        let request = autocompact::request(cx, CompactTrigger::Reactive, entries, pre, 0);
        cx.output.pending_compaction = Some(request.clone());
        return RecoveryAction::ReactiveCompact(request);
    }
    RecoveryAction::Surface { error: error.to_owned() }
}

/// The prompt-too-long ladder.
pub fn on_prompt_too_long(cx: &mut ChainContext<'_>, state: &mut RecoveryState, error: &str) -> RecoveryAction {
    if cx.config.context_collapse.enabled && state.last_transition != Some(Transition::CollapseDrainRetry) {
        let committed = context_collapse::drain(cx);
        if committed > 0 {
            state.last_transition = Some(Transition::CollapseDrainRetry);
            return RecoveryAction::CollapseDrainRetry { committed };
        }
    }
    reactive(cx, state, error)
}

/// The media-size error: reactive compact or surface.
pub fn on_media_too_large(cx: &mut ChainContext<'_>, state: &mut RecoveryState, error: &str) -> RecoveryAction {
    reactive(cx, state, error)
}

/// Our resume instruction after the output limit was hit.
pub const RESUME_MESSAGE: &str = "Your previous reply hit the output token limit and was cut off. Continue exactly where \
it stopped, even mid-sentence, with no apology and no recap. If much remains, split it into smaller pieces.";

#[derive(Debug, Clone, PartialEq)]
pub enum MaxOutputAction {
    /// Append the partial reply and this meta user message, then retry.
    Resume { attempt: u32, message: Message },
    Surface,
}

/// max_output_tokens recovery: up to `max_output_tokens_recovery_limit` resumes per turn.
pub fn on_max_output_tokens(limit: u32, state: &mut RecoveryState) -> MaxOutputAction {
    if state.max_output_recovery_count < limit {
        state.max_output_recovery_count += 1;
        state.last_transition = Some(Transition::MaxOutputTokensRecovery);
        return MaxOutputAction::Resume { attempt: state.max_output_recovery_count, message: Message::user_text(RESUME_MESSAGE) };
    }
    MaxOutputAction::Surface
}
