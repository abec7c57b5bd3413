//! The measurement of one request (a trace row) and of a whole run (the summary).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::api::canonical::sha256_hex;
use crate::api::{Request, SharedVec, Usage};

use super::blocks::{FlatRequest, RegionCounts};
use super::incremental::Flattener;
use super::cache::{CacheError, CacheSim};
use super::context_editing::{self, ContextManagementResponse, Edited};
use super::models::{ModelInfo, ModelTable, UnknownModel};
use super::prefix::{LaneMemory, PrefixReport, attribute};
use super::tokens::TokenCounter;

/// A stage's report on one request, as the trace carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageReport {
    /// The stage's name: a constant (a copy of the report, a checkpoint's row changed, copies
    /// no text).
    pub name: std::borrow::Cow<'static, str>,
    pub fired: bool,
    /// Why it fired or did not: a constant where it can be (a copy of the report copies no
    /// text then).
    pub reason: std::borrow::Cow<'static, str>,
    pub tokens_before: u64,
    pub tokens_after: u64,
    /// The first block path whose cached prefix the stage invalidated, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalidated_from: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheCreationSplit {
    pub ephemeral_5m_input_tokens: u64,
    pub ephemeral_1h_input_tokens: u64,
}

/// One trace row (CONTRACT.md "Trace JSONL").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestMetrics {
    pub index: usize,
    pub lane: String,
    pub turn: u32,
    pub time_ms: u64,
    pub model: String,
    pub input_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_creation: CacheCreationSplit,
    pub output_tokens: u64,
    pub context_tokens: u64,
    pub blocks: RegionCounts,
    pub prefix: PrefixReport,
    /// Shared by the row's copies (a run gone on from a checkpoint copies the rows before it),
    /// copied on write.
    pub stages: SharedVec<StageReport>,
    pub events: Vec<String>,
    pub cost_usd: f64,
    pub body_sha256: String,
    pub cache_break: bool,
    /// The API error this request would get (too many breakpoints, TTL order, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The usage the API reported for this request, when measuring a recording.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_usage: Option<Usage>,
    /// What server-side context editing did (the response's `context_management`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_management: Option<ContextManagementResponse>,
}

/// What a caller hands the measurer for one request.
#[derive(Debug, Clone)]
pub struct MeasureInput<'a> {
    pub lane: &'a str,
    pub turn: u32,
    pub time_ms: u64,
    pub body: &'a Request,
    /// Events journalled since the previous request (of any lane).
    pub events: Vec<String>,
    pub output_tokens: u64,
    /// Time to first token: entries written become readable from `time_ms + first_token_ms`.
    pub first_token_ms: u64,
    /// The row's stages: a copy of the input (a mirror's) shares them.
    pub stages: SharedVec<StageReport>,
    pub recorded_usage: Option<Usage>,
    /// The simulated API rejected the request before any caching (`prompt is too long: …`):
    /// the row carries the error, reads and writes nothing.
    pub rejected: Option<String>,
}

impl<'a> MeasureInput<'a> {
    /// A copy of this input with `events` in place of its own (which are not copied).
    pub fn with_events(&self, events: Vec<String>) -> MeasureInput<'a> {
        let MeasureInput { lane, turn, time_ms, body, events: _, output_tokens, first_token_ms, ref stages, ref recorded_usage, ref rejected } = *self;
        MeasureInput { lane, turn, time_ms, body, events, output_tokens, first_token_ms, stages: stages.clone(), recorded_usage: recorded_usage.clone(), rejected: rejected.clone() }
    }

    pub fn new(lane: &'a str, time_ms: u64, body: &'a Request) -> Self {
        MeasureInput {
            lane,
            turn: 0,
            time_ms,
            body,
            events: Vec::new(),
            output_tokens: 0,
            first_token_ms: 0,
            stages: SharedVec::default(),
            recorded_usage: None,
            rejected: None,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct LaneState {
    memory: Option<LaneMemory>,
    pending_events: Vec<String>,
    /// What context editing had cleared from the lane's previous request (key → tokens; shared
    /// with that request's clearing).
    served_cleared: std::sync::Arc<context_editing::ClearedTokens>,
}

/// A request as the server sees it: the flattened body after `context_management` edits (see
/// [`context_editing`]), what those edits did, or the API's error for a malformed edit list.
#[derive(Debug, Clone)]
pub struct Served {
    pub flat: FlatRequest,
    pub edited: Option<Box<Edited>>,
    pub error: Option<String>,
    /// The body as sent, flattened, when the edits changed it.
    pub sent: Option<FlatRequest>,
}

impl Served {
    /// A body the server takes as sent.
    pub fn plain(flat: FlatRequest) -> Served {
        Served { flat, edited: None, error: None, sent: None }
    }

    /// The body as the client sent it.
    pub fn as_sent(&self) -> &FlatRequest {
        self.sent.as_ref().unwrap_or(&self.flat)
    }
}

/// What a [`Measurer`] carries from one request to the next ([`Measurer::state`]).
#[derive(Debug, Clone)]
pub struct MeasurerState {
    cache: CacheSim,
    lanes: BTreeMap<String, LaneState>,
    next_index: usize,
    flattener: Flattener,
    /// The bodies as served after context editing changed them: they extend each other as the
    /// sent ones do, so they keep tracks of their own, with body hashes when the sent ones have
    /// them (the settings of `flattener`; a measurer without body hashes hashes no body).
    edited: Flattener,
    /// What context editing's tool-use clearing did to each message before.
    clear_memo: context_editing::ClearMemo,
    /// The last `context_management` value served and its reading.
    edits_memo: context_editing::ParseMemo,
    /// The last model looked up and its index in the table (a session names one or two).
    last_model: super::models::LastLookup,
    /// Key spaces handed out ([`Measurer::new_key_space`]).
    key_spaces: u64,
}

impl MeasurerState {
    /// Nothing measured yet.
    fn new(flattener: Flattener) -> Self {
        let edited = flattener.fresh_like();
        MeasurerState { cache: CacheSim::new(), lanes: BTreeMap::new(), next_index: 0, flattener, edited, clear_memo: Default::default(), edits_memo: Default::default(), last_model: Default::default(), key_spaces: 0 }
    }
}

/// Measures requests in order: tokens, cache, prefix stability, cause, cost.
#[derive(Debug, Clone)]
pub struct Measurer {
    table: ModelTable,
    /// [`ModelInfo::estimator_key`] of each model of `table`, by index: every request is
    /// counted under its model's key, which for a newer tokenizer is formatted.
    estimator_keys: Vec<String>,
    counter: TokenCounter,
    /// Everything measured so far ([`Self::state`], [`Self::restore`]).
    state: MeasurerState,
    /// Divergences no journalled event explains get their cause from the bodies
    /// ([`super::structure`]) instead of `unexplained_*`.
    structural_causes: bool,
    /// Thinking of earlier turns counts no tokens for models that drop it
    /// ([`Self::set_prior_thinking_dropped`]).
    prior_thinking_dropped: bool,
    /// How the cache's lookback counts ([`Self::set_lookback_rule`]); kept across [`Self::reset`].
    lookback: super::cache::LookbackRule,
}

impl Measurer {
    pub fn new(table: ModelTable, counter: TokenCounter) -> Self {
        Measurer {
            estimator_keys: table.models.iter().map(ModelInfo::estimator_key).collect(),
            table,
            counter,
            state: MeasurerState::new(Flattener::new()),
            structural_causes: false,
            prior_thinking_dropped: false,
            lookback: super::cache::LookbackRule::Grouped,
        }
    }

    /// Counts, for models the table marks `strips_prior_thinking` (Sonnet 4.5 and earlier), no
    /// tokens for the thinking blocks before the message that opened the current user turn, as
    /// the API drops them from the context at a new turn; the blocks keep their place and hashes
    /// (the cached prefix stays valid). The replay applies the same rule to its requests; real
    /// sessions driven through the agent turn it on (`replay::workload::agent_replay`).
    /// Scenarios do not yet: their figures are counted with every thinking block.
    pub fn set_prior_thinking_dropped(&mut self, on: bool) {
        self.prior_thinking_dropped = on;
    }

    /// Counts the cache's lookback by `rule` from the next request on, and after every
    /// [`Self::reset`] and [`Self::restore`]: the API's rule when the measured requests were
    /// sent (real sessions through the agent: `replay::workload::agent_replay`).
    pub fn set_lookback_rule(&mut self, rule: super::cache::LookbackRule) {
        self.lookback = rule;
        self.state.cache.set_lookback_rule(rule);
    }

    /// The rule [`Self::set_lookback_rule`] set ([`super::cache::LookbackRule::Grouped`] by
    /// default).
    pub fn lookback_rule(&self) -> super::cache::LookbackRule {
        self.lookback
    }

    /// Whether [`Self::set_prior_thinking_dropped`] is on.
    pub fn prior_thinking_dropped(&self) -> bool {
        self.prior_thinking_dropped
    }

    /// This measurer reading causes from the request structure where nothing was journalled
    /// (a client's log: `serve`, `analyze`): a change in tools, system or an earlier message
    /// gets its class instead of `unexplained_*` ([`super::structure::cause`]).
    pub fn with_structural_causes(mut self) -> Self {
        self.structural_causes = true;
        self
    }

    /// [`Self::with_structural_causes`] on a measurer held by reference.
    pub fn set_structural_causes(&mut self, on: bool) {
        self.structural_causes = on;
    }

    pub fn counter(&self) -> &TokenCounter {
        &self.counter
    }

    pub fn counter_mut(&mut self) -> &mut TokenCounter {
        &mut self.counter
    }

    pub fn table(&self) -> &ModelTable {
        &self.table
    }

    /// The table's entry for `model` ([`ModelTable::lookup`]), the last model looked up
    /// remembered (a replay asks per call, nearly always for the same one).
    pub fn model(&mut self, model: &str) -> Result<&ModelInfo, UnknownModel> {
        let index = self.model_index(model)?;
        Ok(&self.table.models[index])
    }

    pub fn cache(&self) -> &CacheSim {
        &self.state.cache
    }

    /// This measurer without body hashes: its rows carry an empty `body_sha256` and its
    /// summaries a fingerprint of nothing. For callers that output neither (fidelity, sweep);
    /// everything else it measures is the same.
    pub fn without_body_hashes(mut self) -> Self {
        let billing = self.state.flattener.billing_key();
        self.state.flattener = Flattener::without_body_hashes().with_billing_key(billing);
        self.state.edited = self.state.flattener.fresh_like();
        self
    }

    /// Keys the billing block as `billing` says ([`super::blocks::BillingKey`]) from the next
    /// request on; `Unkeyed` for real sessions through the agent. A change forgets the
    /// flattener's tracks (their records were keyed the other way).
    pub fn set_billing_key(&mut self, billing: super::blocks::BillingKey) {
        if self.state.flattener.billing_key() != billing {
            self.state.flattener = self.state.flattener.fresh_like().with_billing_key(billing);
            self.state.edited = self.state.flattener.fresh_like();
        }
    }

    /// Forgets every request measured (cache, lanes, tracks, row numbering) and keeps the model
    /// table, the estimator and its memo of counts: the next request is measured as by a new
    /// measurer, only faster.
    pub fn reset(&mut self) {
        self.state = MeasurerState::new(self.state.flattener.fresh_like());
        self.state.cache.set_lookback_rule(self.lookback);
    }

    /// Shares the messages its flatteners keep with every later [`Self::state`] of this
    /// measurer rather than copying them into each ([`Flattener::freeze`]).
    pub fn freeze(&mut self) {
        self.state.flattener.freeze();
        self.state.edited.freeze();
    }

    /// What this measurer has measured so far (cache, lanes, tracks, row numbering, key
    /// spaces), without its model table and estimator: [`Self::restore`] puts it back.
    pub fn state(&self) -> MeasurerState {
        self.state.clone()
    }

    /// Measures on from `state` ([`Self::state`], taken from a measurer with the same model
    /// table and estimator): the next request is measured as by that measurer. The token
    /// counter and its memo stay this one's (counts do not depend on the memo).
    pub fn restore(&mut self, state: &MeasurerState) {
        self.state.clone_from(state);
        self.state.cache.set_lookback_rule(self.lookback);
    }

    /// Sets `salts` on `flat`, a request this measurer served ([`Flattener::set_salts`]: the
    /// same as [`FlatRequest::set_salts`], without copying the records its flattener shares).
    pub fn set_salts(&mut self, flat: &mut FlatRequest, salts: &[(usize, u128)]) {
        self.state.flattener.set_salts(flat, salts);
    }

    /// The incremental flattener (its counters say how much was reused).
    pub fn flattener(&self) -> &Flattener {
        &self.state.flattener
    }

    /// Writes what `flat` would cache, at `time_ms` with the first token `first_token_ms` later,
    /// without measuring it: no row, no lane memory. A replay uses it where the record shows
    /// that something was cached which the replay did not send (a prefix an earlier session
    /// warmed, or a request whose unrecorded part the record has just sized).
    pub fn seed_cache(&mut self, flat: &FlatRequest, time_ms: u64, first_token_ms: u64) -> Result<(), UnknownModel> {
        let index = self.model_index(&flat.model)?;
        let min = self.table.models[index].min_cacheable_tokens;
        // A request the simulator rejects caches nothing, seeded or not.
        let _ = self.state.cache.process(flat, min, time_ms, first_token_ms);
        Ok(())
    }

    /// Flattens a request with this measurer's estimator, as the server sees it (after any
    /// `context_management` edits).
    pub fn flatten(&mut self, body: &Request) -> Result<FlatRequest, UnknownModel> {
        Ok(self.serve(body)?.flat)
    }

    /// [`Self::flatten`] with a key per message ([`Flattener::flatten_keyed`]).
    pub fn flatten_keyed(&mut self, body: &Request, keys: Option<&[u128]>) -> Result<FlatRequest, UnknownModel> {
        Ok(self.serve_keyed(body, keys)?.flat)
    }

    /// A number no earlier call on this measurer returned: a caller deriving message keys
    /// ([`Self::serve_keyed`]) from its own serials mixes it in, so that keys of two runs
    /// through one measurer never meet.
    pub fn new_key_space(&mut self) -> u64 {
        self.state.key_spaces += 1;
        self.state.key_spaces
    }

    /// The request as the server sees it: flattened, with `context_management` applied.
    pub fn serve(&mut self, body: &Request) -> Result<Served, UnknownModel> {
        self.serve_keyed(body, None)
    }

    /// Counts the blocks of `body`'s tools and system (when `head`) and of the messages at
    /// `messages` into the memo, without measuring anything: a reader that knows which parts
    /// of a log are new ([`crate::analyze`]'s keys) tokenizes them all in one run, with the
    /// tokenizer's tables warm, before the measurement looks every count up.
    ///
    /// With `keys` (a key per message, as [`Self::serve_keyed`] takes them) the messages' block
    /// records are kept for the request that brings them ([`Flattener::prepare`]).
    pub fn count_ahead(
        &mut self,
        body: &Request,
        head: bool,
        messages: impl IntoIterator<Item = usize>,
        keys: Option<&[u128]>,
    ) -> Result<(), UnknownModel> {
        let family = self.model_info(&body.model)?.estimator_key();
        let keys = keys.filter(|k| k.len() == body.messages.len());
        let mut scratch = Vec::new();
        if head {
            super::blocks::head_blocks(body, &mut self.counter, &family, self.state.flattener.billing_key(), &mut scratch);
        }
        for m in messages {
            match keys {
                Some(keys) => self.state.flattener.prepare(keys[m], m, &body.messages[m], &mut self.counter, &family),
                None => {
                    scratch.clear();
                    super::blocks::push_message(m, &body.messages[m], &mut self.counter, &family, 0, &mut scratch);
                }
            }
        }
        Ok(())
    }

    /// The table entry of `model`, the last one remembered.
    fn model_info(&mut self, model: &str) -> Result<&ModelInfo, UnknownModel> {
        let index = self.model_index(model)?;
        Ok(&self.table.models[index])
    }

    /// The table index of `model`'s entry, the last one remembered.
    fn model_index(&mut self, model: &str) -> Result<usize, UnknownModel> {
        self.state.last_model.index(&self.table, model)
    }

    /// [`Self::serve`] with a key per message ([`Flattener::flatten_keyed`]).
    pub fn serve_keyed(&mut self, body: &Request, keys: Option<&[u128]>) -> Result<Served, UnknownModel> {
        self.serve_with_keys(body, None, keys)
    }

    /// [`Self::serve`] with a key of the fields other than `messages` and a key per message
    /// ([`Flattener::flatten_with_keys`]).
    /// A misplaced `role:"system"` message ([`crate::api::system_messages::check`]) is the API's
    /// 400: the request is served with that error.
    pub fn serve_with_keys(&mut self, body: &Request, head_key: Option<u128>, keys: Option<&[u128]>) -> Result<Served, UnknownModel> {
        self.serve_salted(body, head_key, keys, &[])
    }

    /// [`Self::serve_with_keys`] with the served flat request's salts likely to be `salts`
    /// ([`FlatRequest::set_salts`]; a guess: they may be set otherwise before it is measured).
    /// Unless the server edits the body, the flat request is served with them; the body as
    /// sent never is.
    pub fn serve_salted(&mut self, body: &Request, head_key: Option<u128>, keys: Option<&[u128]>, salts: &[(usize, u128)]) -> Result<Served, UnknownModel> {
        let mut served = self.serve_edited(body, head_key, keys, salts)?;
        // The flattener kept where the body's system messages are.
        if let Err(error) = crate::api::system_messages::check_at(body, self.state.flattener.last_system_messages()) {
            served.error = Some(error);
        }
        Ok(served)
    }

    /// [`Self::serve_salted`] of a request whose first `count` messages are the ones the
    /// request with `stamp` sent, unchanged (`hint`; [`Flattener::expect_shared`]), and the
    /// stamp this one gets ([`Flattener::last_stamp`]).
    pub fn serve_shared(&mut self, body: &Request, salts: &[(usize, u128)], hint: Option<(u64, usize)>) -> Result<(Served, u64), UnknownModel> {
        self.state.flattener.expect_shared(hint);
        let served = self.serve_salted(body, None, None, salts);
        // Never left for another request (an unknown model fails before flattening).
        self.state.flattener.expect_shared(None);
        Ok((served?, self.state.flattener.last_stamp()))
    }

    fn serve_edited(&mut self, body: &Request, head_key: Option<u128>, keys: Option<&[u128]>, salts: &[(usize, u128)]) -> Result<Served, UnknownModel> {
        let dropped = self.prior_thinking_dropped;
        let index = self.model_index(&body.model)?;
        let drops_thinking = dropped && self.table.models[index].strips_prior_thinking;
        let family = self.estimator_keys[index].as_str();
        debug_assert_eq!(family, self.table.models[index].estimator_key());
        // A body the server may edit is served edited, or else unsalted (the sent one is).
        let sent_salts = if body.context_management.is_some() { &[][..] } else { salts };
        let mut flat = self.state.flattener.flatten_salted(body, head_key, keys, sent_salts, &mut self.counter, family);
        if drops_thinking {
            super::blocks::drop_prior_thinking(body, &mut flat);
        }
        let Some(value) = &body.context_management else { return Ok(Served::plain(flat)) };
        let edits = match self.state.edits_memo.parse(value) {
            Ok(edits) => edits,
            Err(error) => return Ok(Served { error: Some(error.clone()), ..Served::plain(flat) }),
        };
        if !context_editing::may_edit(edits) {
            return Ok(Served::plain(flat));
        }
        let counter = &mut self.counter;
        let mut count = |role: crate::api::Role, block: &crate::api::ContentBlock| -> u64 {
            let (hash, _) = crate::api::block_hash_kept(role.as_str(), block);
            u64::from(counter.count(hash, family, || super::blocks::content_token_units(block)))
        };
        let edited = context_editing::apply_memo(body, edits, flat.total_tokens, &mut count, &mut self.state.clear_memo, family);
        #[cfg(debug_assertions)]
        {
            let scratch = context_editing::apply(body, edits, flat.total_tokens, &mut count);
            assert!(edited == scratch, "context editing with its memo differs from applying it from scratch:\n{edited:?}\n{scratch:?}");
        }
        match edited {
            None => Ok(Served::plain(flat)),
            Some(edited) => {
                // The edited body is not the next of the sent ones' track: flattened on the
                // edited bodies' own tracks (the same records as from scratch). Editing changes
                // messages only, so the sent body's head key is the edited one's: an unchanged
                // head is neither compared nor hashed again.
                let mut served = self.state.edited.flatten_salted(&edited.body, head_key, None, salts, &mut self.counter, family);
                if drops_thinking {
                    super::blocks::drop_prior_thinking(&edited.body, &mut served);
                }
                Ok(Served { flat: served, edited: Some(Box::new(edited)), error: None, sent: Some(flat) })
            }
        }
    }

    /// Journals an event that happened between requests, for every lane's next attribution.
    pub fn journal(&mut self, event: impl Into<String>) {
        let event = event.into();
        for lane in self.state.lanes.values_mut() {
            lane.pending_events.push(event.clone());
        }
    }

    /// A new conversation starts on `lane` (another subagent of the same type): its next
    /// request is compared with nothing, as the client tracks each agent id on its own.
    pub fn restart_lane(&mut self, lane: &str) {
        self.state.lanes.remove(lane);
    }

    /// Measures one request.
    pub fn measure(&mut self, input: MeasureInput<'_>) -> Result<RequestMetrics, UnknownModel> {
        let served = self.serve(input.body)?;
        self.measure_served(input, served)
    }

    /// Measures one request already flattened with [`Measurer::flatten`] (its context-editing
    /// report, if any, is not carried: use [`Measurer::serve`] and [`Measurer::measure_served`]).
    pub fn measure_flat(&mut self, input: MeasureInput<'_>, flat: FlatRequest) -> Result<RequestMetrics, UnknownModel> {
        self.measure_served(input, Served::plain(flat))
    }

    /// Measures one request as [`Measurer::serve`] prepared it.
    pub fn measure_served(&mut self, mut input: MeasureInput<'_>, served: Served) -> Result<RequestMetrics, UnknownModel> {
        let Served { flat, edited, error: edit_error, .. } = served;
        if input.rejected.is_none() {
            input.rejected = edit_error;
        }
        let info_index = self.model_index(&input.body.model)?;
        let min_cacheable_tokens = self.table.models[info_index].min_cacheable_tokens;
        for event in &input.events {
            for lane in self.state.lanes.values_mut() {
                lane.pending_events.push(event.clone());
            }
        }
        let body_sha256 = flat.body_sha256.clone();
        let index = self.state.next_index;
        self.state.next_index += 1;

        let lane = self.state.lanes.entry(input.lane.to_owned()).or_default();
        let mut events = std::mem::take(&mut lane.pending_events);
        if lane.memory.is_none() {
            // A new lane has seen only the events of this call.
            events = input.events.clone();
        }
        let (outcome, error) = match input.rejected.clone() {
            Some(rejected) => (None, Some(rejected)),
            None => match self.state.cache.process(&flat, min_cacheable_tokens, input.time_ms, input.first_token_ms) {
            Ok(outcome) => (Some(outcome), None),
            Err(e @ (CacheError::TooManyBreakpoints { .. } | CacheError::TtlOrder { .. } | CacheError::AutoTtlConflict { .. })) => {
                (None, Some(e.to_string()))
            }
            },
        };
        let lane = self.state.lanes.get_mut(input.lane).expect("lane inserted above");
        let outcome = outcome.unwrap_or_default();
        // A rejected request (an API error) caches nothing and reads nothing: it is an error
        // row, not a cache break.
        let is_break = match &lane.memory {
            _ if error.is_some() => false,
            // Tokens `cache_edits` deleted since the lane's previous request were expected to go
            // (the client's detector skips a check while deletions are pending).
            Some(previous) => is_cache_break(
                previous.cached_after.saturating_sub(outcome.cache_deleted_input_tokens.saturating_sub(previous.deleted_tokens)),
                outcome.cache_read_input_tokens,
            ),
            None => false,
        };
        let mut prefix = attribute(lane.memory.as_ref(), &flat, &outcome, &events, is_break);
        let structure = self.structural_causes.then(|| super::structure::Structure::of(input.body));
        if let (Some(current), Some(previous)) = (&structure, lane.memory.as_ref().and_then(|m| m.structure.as_ref()))
            && prefix.diverged_at.is_some()
            && prefix.cause.as_deref().is_some_and(|c| c.starts_with("unexplained_"))
        {
            prefix.cause = Some(super::structure::cause(previous, current, &flat, prefix.common_blocks).to_owned());
        }
        let mut stages = input.stages;
        let context_management = match (&error, edited) {
            (None, Some(edited)) => {
                context_editing_effects(lane, &flat, &edited, &mut prefix, &mut events, &mut stages);
                // What the lane's next request is compared with: shared, not copied.
                let Edited { response, cleared, .. } = *edited;
                lane.served_cleared = cleared;
                Some(response)
            }
            (None, None) => {
                if !lane.served_cleared.is_empty() {
                    lane.served_cleared = Default::default();
                }
                None
            }
            (Some(_), _) => None,
        };
        let context_tokens = if error.is_some() { 0 } else { flat.total_tokens - outcome.cache_deleted_input_tokens };
        if error.is_none() {
            lane.memory = Some(LaneMemory {
                prefix_hashes: LaneMemory::take_prefix_hashes(lane.memory.as_mut(), &flat),
                model: flat.model.clone(),
                cached_after: outcome.cached_after(),
                time_ms: input.time_ms,
                deleted_tokens: outcome.cache_deleted_input_tokens,
                structure,
            });
        }
        let output_tokens = if error.is_some() { 0 } else { input.output_tokens };
        let cost_usd = round9(self.table.models[info_index].cost(
            outcome.input_tokens,
            output_tokens,
            outcome.cache_read_input_tokens,
            outcome.ephemeral_5m_input_tokens,
            outcome.ephemeral_1h_input_tokens,
        ));
        let blocks = flat.counts;
        Ok(RequestMetrics {
            index,
            lane: input.lane.to_owned(),
            turn: input.turn,
            time_ms: input.time_ms,
            model: input.body.model.clone(),
            input_tokens: outcome.input_tokens,
            cache_read_input_tokens: outcome.cache_read_input_tokens,
            cache_creation_input_tokens: outcome.cache_creation_input_tokens,
            cache_creation: CacheCreationSplit {
                ephemeral_5m_input_tokens: outcome.ephemeral_5m_input_tokens,
                ephemeral_1h_input_tokens: outcome.ephemeral_1h_input_tokens,
            },
            output_tokens,
            context_tokens,
            blocks,
            prefix,
            stages,
            events,
            cost_usd,
            body_sha256,
            cache_break: is_break,
            error,
            recorded_usage: input.recorded_usage,
            context_management,
        })
    }
}

/// What server-side context editing means for one row: the cause where the prefix diverged at
/// an edited block, and a `context_editing` stage report (with its event) when the server cleared
/// something it had not cleared from the lane's previous request. The server clears again on
/// every request, so only the newly cleared tokens count as leaving the model's view.
fn context_editing_effects(
    lane: &mut LaneState,
    flat: &FlatRequest,
    edited: &Edited,
    prefix: &mut PrefixReport,
    events: &mut Vec<String>,
    stages: &mut SharedVec<StageReport>,
) {
    let path_of = |(m, c): (usize, usize)| super::blocks::BlockPath { region: super::blocks::Region::Messages, index: m, content: Some(c) }.to_string();
    // An expired cache stays the cause when nothing at all was read (attribution's own rule).
    if let Some(diverged) = &prefix.diverged_at
        && prefix.cause.as_deref() != Some("ttl_expired")
        && let Some(edited_block) = message_position(diverged).filter(|&position| path_of(position) == *diverged).and_then(|position| edited.positions.get(&position))
    {
        prefix.cause = Some(edited_block.cause.to_owned());
    }
    let newly = not_in(&edited.cleared, &lane.served_cleared);
    if !newly.is_empty() {
        let freed: u64 = newly.iter().map(|(_, t)| **t).sum();
        let tools = newly.iter().filter(|(k, _)| k.starts_with("tool_use:")).count();
        let thinking = newly.len() - tools;
        let applied: Vec<String> = edited
            .response
            .applied_edits
            .iter()
            .map(|e| match (e.cleared_tool_uses, e.cleared_thinking_turns) {
                (Some(n), _) => format!("{}: {n} tool uses, {} tokens", e.kind, e.cleared_input_tokens),
                (_, Some(n)) => format!("{}: {n} thinking turns, {} tokens", e.kind, e.cleared_input_tokens),
                _ => e.kind.clone(),
            })
            .collect();
        stages.push(StageReport {
            name: "context_editing".into(),
            fired: true,
            reason: format!("newly cleared server-side: {tools} tool uses, {thinking} thinking blocks ({})", applied.join("; ")).into(),
            tokens_before: flat.total_tokens + freed,
            tokens_after: flat.total_tokens,
            // Every position's key is one of `edited.cleared`: newly cleared when in `newly`.
            invalidated_from: edited
                .positions
                .iter()
                .find(|(_, block)| newly.iter().any(|(key, _)| std::sync::Arc::ptr_eq(key, &block.key) || **key == block.key))
                .map(|(p, _)| path_of(*p)),
        });
        for (kind, cause) in [("tool_use:", "context_editing:clear_tool_uses"), ("thinking:", "thinking_cleared")] {
            if newly.iter().any(|(k, _)| k.starts_with(kind)) && !events.iter().any(|e| e == cause) {
                events.push(cause.to_owned());
            }
        }
    }
}

/// The entries of `all` whose key `before` does not hold, in `all`'s order: both maps are sorted
/// by key, so one walk of each rather than a lookup per entry; a key both share (the same
/// allocation, as a request's clearing shares its keys with the one before) is passed without
/// comparing its text, and two shared maps without a walk.
fn not_in<'a>(all: &'a std::sync::Arc<context_editing::ClearedTokens>, before: &std::sync::Arc<context_editing::ClearedTokens>) -> Vec<(&'a std::sync::Arc<str>, &'a u64)> {
    use std::sync::Arc;
    let mut out = Vec::new();
    if Arc::ptr_eq(all, before) {
        return out;
    }
    let mut other = before.keys().peekable();
    for (key, tokens) in all.iter() {
        if other.next_if(|k| Arc::ptr_eq(k, key)).is_some() {
            continue;
        }
        while other.next_if(|k| ***k < **key).is_some() {}
        if other.peek().is_none_or(|k| ***k != **key) {
            out.push((key, tokens));
        }
    }
    out
}

/// The (message, content) position a `messages[m].content[c]` block path names, read back (the
/// caller checks the path is the one the position writes): one lookup where writing the path of
/// every edited position to compare it cost a `format!` each.
fn message_position(path: &str) -> Option<(usize, usize)> {
    let (message, content) = path.strip_prefix("messages[")?.strip_suffix(']')?.split_once("].content[")?;
    Some((message.parse().ok()?, content.parse().ok()?))
}

/// CONTRACT.md: a cache break is a read smaller than what the lane's previous request left
/// cached by more than 5% and at least 2,000 tokens (Claude Code's own rule).
pub fn is_cache_break(previous_cached: u64, read: u64) -> bool {
    (read as f64) < 0.95 * previous_cached as f64 && previous_cached.saturating_sub(read) >= 2_000
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenTotals {
    pub input: u64,
    pub cache_read: u64,
    pub cache_creation: u64,
    pub cache_creation_5m: u64,
    pub cache_creation_1h: u64,
    pub output: u64,
}

/// The compaction counters of the summary, by CONTRACT.md key.
pub const COMPACTION_KEYS: [&str; 8] =
    ["tool_result_budget", "snip", "microcompact", "collapse", "session_memory", "auto", "reactive", "manual"];

/// Maps a stage name to its summary key.
pub fn compaction_key(stage: &str) -> Option<&'static str> {
    Some(match stage {
        "tool_result_budget" => "tool_result_budget",
        "snip" => "snip",
        "microcompact" | "time_microcompact" | "cached_microcompact" => "microcompact",
        "context_collapse" | "collapse" => "collapse",
        "session_memory_compact" | "session_memory" => "session_memory",
        "autocompact" | "auto" => "auto",
        "reactive_compact" | "reactive" => "reactive",
        "manual_compact" | "manual" => "manual",
        // Peers' mechanisms (agent/compact/peers.rs), under the key of the stage they resemble:
        // clearing old tool results is a microcompact, a summary rebuild an autocompact, dropping
        // old rounds a snip.
        "observation_masking" | "opencode_prune" | "context_editing" => "microcompact",
        "codex_compact" | "opencode_summary" | "server_compaction" => "auto",
        "cline_truncate" => "snip",
        _ => return None,
    })
}

/// CONTRACT.md "Summary JSON".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub input: String,
    pub strategy: String,
    /// What ran a recorded session (`agent` or `replay`); set by `replay`, absent elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    pub model: String,
    pub estimator: String,
    pub requests: usize,
    pub turns: u32,
    pub tokens: TokenTotals,
    pub cache_hit_ratio: f64,
    pub cost_usd: f64,
    pub cache_breaks: usize,
    pub compactions: BTreeMap<String, u64>,
    pub blocked: u64,
    pub peak_context_tokens: u64,
    pub fingerprint: String,
    /// Requests the API would have rejected (400), with their reasons in the trace.
    #[serde(default)]
    pub api_errors: usize,
    /// Information loss (tokens dropped from view, recall misses, re-reads); filled by callers
    /// that hold the request bodies ([`super::loss::info_loss`]).
    #[serde(default)]
    pub info_loss: super::loss::InfoLoss,
    /// The same totals per lane (`main`, `compact`, `subagent:Explore`, ...), sorted by lane.
    #[serde(default)]
    pub lanes: BTreeMap<String, LaneSummary>,
    /// Lines or records of the input that were skipped, each with file, line and field (left
    /// out when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<crate::recording::LineWarning>,
}

/// A lane's share of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LaneSummary {
    pub requests: usize,
    pub tokens: TokenTotals,
    pub cache_hit_ratio: f64,
    pub cost_usd: f64,
    pub cache_breaks: usize,
}

impl Summary {
    pub fn from_rows(input: &str, strategy: &str, estimator: &str, rows: &[RequestMetrics], blocked: u64) -> Summary {
        let mut tokens = TokenTotals::default();
        let mut compactions: BTreeMap<String, u64> = COMPACTION_KEYS.iter().map(|k| ((*k).to_owned(), 0)).collect();
        let mut fingerprint_input = String::with_capacity(rows.len() * 65);
        let mut cost = 0.0;
        for row in rows {
            tokens.input += row.input_tokens;
            tokens.cache_read += row.cache_read_input_tokens;
            tokens.cache_creation += row.cache_creation_input_tokens;
            tokens.cache_creation_5m += row.cache_creation.ephemeral_5m_input_tokens;
            tokens.cache_creation_1h += row.cache_creation.ephemeral_1h_input_tokens;
            tokens.output += row.output_tokens;
            cost += row.cost_usd;
            fingerprint_input.push_str(&row.body_sha256);
            fingerprint_input.push('\n');
            for stage in row.stages.iter().filter(|s| s.fired) {
                if let Some(key) = compaction_key(&stage.name) {
                    *compactions.entry(key.to_owned()).or_default() += 1;
                }
            }
        }
        let denominator = tokens.input + tokens.cache_read + tokens.cache_creation;
        // (Keyed by the rows' own names while summing: a run has a few lanes and many rows.)
        let mut by_lane: BTreeMap<&str, LaneSummary> = BTreeMap::new();
        for row in rows {
            let lane = by_lane.entry(row.lane.as_str()).or_default();
            lane.requests += 1;
            lane.tokens.input += row.input_tokens;
            lane.tokens.cache_read += row.cache_read_input_tokens;
            lane.tokens.cache_creation += row.cache_creation_input_tokens;
            lane.tokens.cache_creation_5m += row.cache_creation.ephemeral_5m_input_tokens;
            lane.tokens.cache_creation_1h += row.cache_creation.ephemeral_1h_input_tokens;
            lane.tokens.output += row.output_tokens;
            lane.cost_usd += row.cost_usd;
            lane.cache_breaks += usize::from(row.cache_break);
        }
        let mut lanes: BTreeMap<String, LaneSummary> = by_lane.into_iter().map(|(name, lane)| (name.to_owned(), lane)).collect();
        for lane in lanes.values_mut() {
            let denominator = lane.tokens.input + lane.tokens.cache_read + lane.tokens.cache_creation;
            lane.cache_hit_ratio = if denominator == 0 { 0.0 } else { round6(lane.tokens.cache_read as f64 / denominator as f64) };
            lane.cost_usd = round6(lane.cost_usd);
        }
        Summary {
            input: input.to_owned(),
            strategy: strategy.to_owned(),
            engine: None,
            model: rows.iter().find(|r| r.lane == "main").or(rows.first()).map(|r| r.model.clone()).unwrap_or_default(),
            estimator: estimator.to_owned(),
            requests: rows.len(),
            turns: rows.iter().map(|r| r.turn).max().unwrap_or(0),
            cache_hit_ratio: if denominator == 0 { 0.0 } else { round6(tokens.cache_read as f64 / denominator as f64) },
            tokens,
            cost_usd: round6(cost),
            cache_breaks: rows.iter().filter(|r| r.cache_break).count(),
            compactions,
            blocked,
            peak_context_tokens: rows.iter().map(|r| r.context_tokens).max().unwrap_or(0),
            fingerprint: sha256_hex(fingerprint_input.as_bytes()),
            api_errors: rows.iter().filter(|r| r.error.is_some()).count(),
            info_loss: Default::default(),
            lanes,
            warnings: Vec::new(),
        }
    }
}

/// Rounds to 9 decimals (a nano-dollar), so per-request costs print short and the same everywhere.
pub fn round9(x: f64) -> f64 {
    (x * 1e9).round() / 1e9
}

/// Rounds to 6 decimals so that floating sums print the same everywhere.
pub fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}
