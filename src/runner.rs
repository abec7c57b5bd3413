//! The runner: a scenario's script drives the agent through the World, and every request the
//! agent builds is measured.
//!
//! The script is walked in order. A `user` step starts a turn; each `assistant` step on the
//! main lane is one model call: the agent builds the request for the conversation as it
//! stands, the request is measured at the current virtual time, and the scripted reply is
//! appended (the clock advances by the reply's latency). Tool calls are executed at once and
//! their results appended, so the next `assistant` step sees them. `wait`, `write_file`,
//! `remove_file` and the MCP steps act on the World between calls; the agent is the full
//! [`Session`] of layers 1–5, and every event it journals reaches the measurer with the next
//! request.

use std::collections::BTreeMap;

use crate::api::{Request, Usage};
use crate::measure::loss::LossTracker;
use crate::measure::{FlatRequest, MeasureInput, Measurer, RequestMetrics, Summary};
use crate::scenario::{Scenario, Step};
use crate::world::{Reply, World};

use crate::agent::compact::Chain;
use crate::agent::compact::recovery::{
    API_MAX_MEDIA_PER_REQUEST, MaxOutputAction, MediaMemo, RESUME_MESSAGE, RecoveryState, is_media_size_error, on_max_output_tokens,
    simulated_api_error, simulated_media_error,
};
use crate::agent::session::{ForkAnswer, ModelCalls, Recovery, Session, SideCall};
use crate::api::StopReason;
use crate::strategy::Strategy;

mod mirror;
pub use mirror::{Mirror, MirrorOf};

/// The id the session notes for the reply to row `index`: `msg_{index:04}`, made at its size
/// without the formatting machinery (once per main request of every run).
fn reply_message_id(index: usize) -> String {
    let mut digits = itoa::Buffer::new();
    let number = digits.format(index);
    let mut id = String::with_capacity(8 + number.len());
    id.push_str("msg_");
    id.extend(std::iter::repeat_n('0', 4usize.saturating_sub(number.len())));
    id.push_str(number);
    debug_assert_eq!(id, format!("msg_{index:04}"));
    id
}

/// Everything a run produced.
#[derive(Debug, Clone)]
pub struct RunOutput {
    pub scenario: String,
    pub rows: Vec<RequestMetrics>,
    /// The request bodies, in order (for `--dump-requests` and snapshots).
    pub requests: Vec<Request>,
    pub summary: Summary,
    /// Why a stop rule ([`RunState::stop_when`]) ended the run: at the first step it held
    /// after, which may be the last one.
    pub stopped: Option<Stopped>,
}

/// When a run is out of the running and may end early: a what-if that would lose more than the
/// run it is weighed against, or refuse more requests, can be no better than it however it goes
/// on (both counts only grow), so the rest of its steps cannot change the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopRule {
    /// Stop once the tokens taken from the model's view ([`crate::measure::loss::InfoLoss`]'s
    /// `tokens_dropped`, as the run's loss tracker counts them) exceed this.
    pub tokens_dropped_above: u64,
    /// Stop once the main requests refused at the blocking limit and the prompt-too-long errors
    /// surfaced ([`RunState::refused`]) exceed this.
    pub refused_above: u64,
}

impl StopRule {
    /// Why a run ends under this rule once it has dropped `dropped` tokens from the model's view
    /// and refused `refused` requests, when it does.
    pub fn stopped(self, dropped: u64, refused: u64) -> Option<Stopped> {
        if dropped > self.tokens_dropped_above {
            return Some(Stopped::TokensDropped { dropped, above: self.tokens_dropped_above });
        }
        (refused > self.refused_above).then_some(Stopped::Refused { refused, above: self.refused_above })
    }
}

/// Why a stop rule ended a run: the count that went past its bound, and the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    TokensDropped { dropped: u64, above: u64 },
    Refused { refused: u64, above: u64 },
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{file}: script[{step}]: {message}")]
    Script { file: String, step: usize, message: String },
    #[error("{file}: strategy `{strategy}`: {message}")]
    Strategy { file: String, strategy: String, message: String },
}

/// The knobs that depend on the scenario's model: an autocompact buffer at or above the
/// effective window (window − min(max output, `max_output_reserve_tokens`)) would compact at
/// every request, and the compacted context would grow instead of shrink.
pub fn check_strategy_for(limits: crate::agent::compact::context::ModelLimits, strategy: &Strategy) -> Result<(), String> {
    let auto = &strategy.compact.autocompact;
    let thresholds = crate::agent::compact::counting::Thresholds::compute(limits, &strategy.compact);
    let effective = thresholds.effective_window;
    if auto.enabled && !auto.compact_disabled && auto.buffer_tokens >= effective {
        return Err(format!(
            "compact.autocompact.buffer_tokens = {} must be below the effective window of {effective} tokens (context window {} − min(max output {}, compact.autocompact.max_output_reserve_tokens {}))",
            auto.buffer_tokens, limits.context_window, limits.max_output_tokens, auto.output_reserve(crate::agent::compact::config::DEFAULT_OUTPUT_RESERVE)
        ));
    }
    if auto.blocking_limit_override.is_none() && auto.blocking_buffer_tokens >= effective {
        return Err(format!(
            "compact.autocompact.blocking_buffer_tokens = {} must be below the effective window of {effective} tokens",
            auto.blocking_buffer_tokens
        ));
    }
    Ok(())
}

/// Stages that replace the history with a summary (each takes a reply on the `compact` lane,
/// except session-memory compaction, which uses the session memory).
pub const COMPACTION_STAGES: [&str; 4] = ["autocompact", "session_memory_compact", "manual_compact", "reactive_compact"];

/// Called with every body a run measures and its row.
pub type RequestObserver<'o> = &'o mut dyn FnMut(&Request, &RequestMetrics);

/// What a client does around the main lane's requests beyond what the agent's pipeline builds:
/// a recorded client's turn rules ([`crate::replay::turns::RecordedClient`]). Owned by the run
/// ([`RunOptions::client`]): a checkpoint copies it ([`ClientRules::clone_box`]), so a run that
/// goes on from a checkpoint goes on with the client's state of that point.
pub trait ClientRules {
    /// A copy of the rules in their present state.
    fn clone_box(&self) -> Box<dyn ClientRules>;
    /// Called with each main-lane request the API accepts, flattened as the server sees it,
    /// before it is measured: may seed the cache (a side request the client sent before it)
    /// and change `flat` (bytes the client rendered otherwise). Returns events for its row.
    fn before_main(&mut self, call: MainCall<'_>, flat: &mut FlatRequest, measurer: &mut Measurer) -> Vec<String>;
    /// The row of that request, measured.
    fn after_main(&mut self, row: &RequestMetrics);
    /// The salts ([`FlatRequest::set_salts`]) `before_main` most likely gives the next request:
    /// it is flattened with them, so that `before_main` changes only what differs.
    fn salts_hint(&self) -> &[(usize, u128)] {
        &[]
    }
}

/// A plan that decides a run's scripted replies as the run goes (a replay that follows its
/// recording until the run parts from it: [`crate::replay::agent_whatif`]). Owned by the run
/// ([`RunState::set_reply_plan`]); a checkpoint copies it in its present state.
pub trait ReplyPlan: std::any::Any {
    /// A copy of the plan in its present state.
    fn clone_box(&self) -> Box<dyn ReplyPlan>;
    /// Called once, when the run takes the plan, with the run's model: sets what the plan
    /// decides before the next request.
    fn start(&mut self, model: &mut crate::world::ScriptedModel);
    /// Called with each main request the API accepted, measured as `row` with `reply`, the main
    /// lane's reply it took, before anything else reads either: may change the replies left in
    /// `model`, and take the scripted usage off `reply` (and `row`'s copy of it) where the
    /// measurement did not depend on it (the output tokens kept).
    fn main_reply(&mut self, row: &mut RequestMetrics, reply: &mut Reply, model: &mut crate::world::ScriptedModel);
}

/// A main-lane request as [`ClientRules`] sees it.
pub struct MainCall<'a> {
    pub request: &'a Request,
    pub time_ms: u64,
    /// The main-lane reply the request consumes: how many the scripted model answered before
    /// it (a request the blocking limit stopped, or whose prompt-too-long error surfaced, consumed
    /// one without being sent).
    pub reply: usize,
    /// The first main request since a user prompt.
    pub new_turn: bool,
    /// A compaction came before it (since the previous main request).
    pub compacted: bool,
    /// Where given, the TTL every cache marker of `request` is sent with instead of its own:
    /// the request as a [`Mirror`] of the run sends it.
    pub markers_ttl: Option<Option<crate::api::CacheTtl>>,
}

/// What a run does with each request body once it is measured.
#[derive(Default)]
pub struct RunOptions<'o> {
    /// Keep every body in [`RunOutput::requests`]. Each body holds the conversation so far, so
    /// keeping them all costs memory quadratic in the script's length; `run`, `compare` and
    /// `check` hand bodies to `observer` instead and keep none.
    pub keep_requests: bool,
    /// Fill `summary.info_loss` from the bodies as they pass ([`LossTracker`]).
    pub info_loss: bool,
    /// With `info_loss`, only its drops: the tokens taken from the model's view and the
    /// compactions that took them ([`LossTracker::drops_only`]), for a caller that reads no
    /// more of it; the recall misses and re-reads, which read every body, stay 0.
    pub drops_only: bool,
    /// Called with every body and its row, in order, before the body is dropped or kept.
    pub observer: Option<RequestObserver<'o>>,
    /// The client's rules around main requests (none: the agent's requests as built), owned
    /// by the run.
    pub client: Option<Box<dyn ClientRules>>,
}

/// A run's rows: those measured before the last [`RunState::freeze`], in shared chunks
/// that every copy of the state holds by pointer, and those measured since.
#[derive(Clone, Default)]
struct Rows {
    frozen: Vec<std::sync::Arc<Vec<RequestMetrics>>>,
    frozen_len: usize,
    tail: Vec<RequestMetrics>,
}

impl Rows {
    fn len(&self) -> usize {
        self.frozen_len + self.tail.len()
    }

    fn push(&mut self, row: RequestMetrics) {
        self.tail.push(row);
    }

    /// Moves the rows since the last freeze into a shared chunk. (The next rows get as much
    /// room as these took: a run freezes every few steps, and a row is large to move.)
    fn freeze(&mut self) {
        if !self.tail.is_empty() {
            let room = self.tail.len();
            let tail = std::mem::replace(&mut self.tail, Vec::with_capacity(room));
            self.frozen_len += tail.len();
            self.frozen.push(std::sync::Arc::new(tail));
        }
    }

    /// The rows from `from` on, in order. (Rows from the tail on, what a run's loop reads of
    /// each step, pass over no chunk.)
    fn iter_from(&self, from: usize) -> impl Iterator<Item = &RequestMetrics> {
        let chunks = if from >= self.frozen_len { &[][..] } else { &self.frozen[..] };
        let mut start = 0;
        let frozen = chunks.iter().flat_map(move |chunk| {
            let first = start;
            start += chunk.len();
            chunk.get(from.saturating_sub(first)..).unwrap_or_default()
        });
        frozen.chain(self.tail.get(from.saturating_sub(self.frozen_len)..).unwrap_or_default())
    }

    /// Every row, in order: a chunk no copy holds any more is moved, one still held is copied.
    fn into_vec(self) -> Vec<RequestMetrics> {
        let mut rows = Vec::with_capacity(self.len());
        for chunk in self.frozen {
            match std::sync::Arc::try_unwrap(chunk) {
                Ok(chunk) => rows.extend(chunk),
                Err(shared) => rows.extend(shared.iter().cloned()),
            }
        }
        rows.extend(self.tail);
        rows
    }
}

/// The rows of a run and, as the options say, its bodies and its information loss.
struct Collected<'o> {
    rows: Rows,
    requests: Vec<Request>,
    keep_requests: bool,
    loss: Option<LossTracker>,
    observer: Option<RequestObserver<'o>>,
    /// The messages of main requests a compaction stage fired for, by row index, when kept.
    compacted: Option<Vec<(usize, Vec<crate::api::Message>)>>,
}

impl<'o> Collected<'o> {
    fn new(options: RunOptions<'o>) -> Self {
        Collected {
            rows: Rows::default(),
            requests: Vec::new(),
            keep_requests: options.keep_requests,
            loss: options.info_loss.then(|| if options.drops_only { LossTracker::drops_only() } else { LossTracker::new() }),
            observer: options.observer,
            compacted: None,
        }
    }

    fn copy_without_observer(&self) -> Collected<'static> {
        Collected {
            rows: self.rows.clone(),
            requests: self.requests.clone(),
            keep_requests: self.keep_requests,
            loss: self.loss.clone(),
            observer: None,
            compacted: self.compacted.clone(),
        }
    }

    /// [`Collected::push`] of a request with `stamp` whose first messages are, as `hint` says,
    /// the ones of the request with the hint's stamp ([`LossTracker::expect_shared`]).
    fn push_shared(&mut self, row: RequestMetrics, request: Request, stamp: u64, hint: Option<(u64, usize)>) -> Option<Request> {
        if let Some(loss) = &mut self.loss {
            loss.expect_shared(stamp, hint);
        }
        self.push(row, request)
    }

    /// Records `row` and `request`; the request back when it is not kept.
    fn push(&mut self, row: RequestMetrics, request: Request) -> Option<Request> {
        if let Some(loss) = &mut self.loss {
            loss.observe(&request, &row);
        }
        if let Some(observer) = &mut self.observer {
            observer(&request, &row);
        }
        if let Some(compacted) = &mut self.compacted
            && row.lane == crate::recording::format::LANE_MAIN
            && row.error.is_none()
            && row.stages.iter().any(|s| s.fired && COMPACTION_STAGES.contains(&&*s.name))
        {
            compacted.push((self.rows.len(), request.messages.clone()));
        }
        self.rows.push(row);
        if self.keep_requests {
            self.requests.push(request);
            return None;
        }
        Some(request)
    }
}

/// Runs a scenario and measures every request (the bodies kept).
pub fn run_scenario(scenario: &Scenario, measurer: &mut Measurer, strategy: &Strategy) -> Result<RunOutput, RunError> {
    run_scenario_with(scenario, measurer, strategy, &Chain::new())
}

/// Runs a scenario with a given long-context chain (e.g. with stages disabled by name); the
/// bodies kept.
pub fn run_scenario_with(scenario: &Scenario, measurer: &mut Measurer, strategy: &Strategy, chain: &Chain) -> Result<RunOutput, RunError> {
    run_scenario_opts(scenario, measurer, strategy, chain, RunOptions { keep_requests: true, ..RunOptions::default() })
}

/// Runs a scenario; what becomes of each body is up to `options`.
pub fn run_scenario_opts(scenario: &Scenario, measurer: &mut Measurer, strategy: &Strategy, chain: &Chain, options: RunOptions<'_>) -> Result<RunOutput, RunError> {
    let mut run = RunState::start(scenario, strategy, options)?;
    while !run.done(scenario) {
        run.step(scenario, measurer, strategy, chain)?;
    }
    Ok(run.finish(scenario, measurer, strategy))
}

/// A run in progress: everything the walk over a scenario's script carries from one step to
/// the next. [`RunState::checkpoint`] copies it (with a copy of the measurer, a run can go on
/// from there twice: under another strategy that changes nothing before that step, or with
/// other scripted replies from there on, [`crate::world::ScriptedModel::resume_with`]).
pub struct RunState<'o> {
    world: World,
    agent: Session,
    out: Collected<'o>,
    turn: u32,
    pending_events: Vec<String>,
    blocked: u64,
    surfaced: u64,
    /// Cached microcompact's pinned `cache_edits` blocks: (wire message index, block).
    pinned_edits: Vec<(usize, serde_json::Value)>,
    recovery: RecoveryState,
    /// Stage reports of a chain run that ended in a retry, shown on the retried request.
    pending_stages: Vec<crate::measure::StageReport>,
    /// The next script step.
    next: usize,
    /// Every count the autocompact stage compared with its threshold, with the step it ran in.
    checks: Vec<(usize, u64)>,
    /// The client's rules around main requests (`RunOptions::client`).
    client: Option<Box<dyn ClientRules>>,
    /// The media of the main requests' messages, walked once per message.
    media: MediaMemo,
    /// For the client's rules: a prompt, a compaction since the last main request.
    prompted: bool,
    compacted: bool,
    /// The flattener's stamp of the last main request measured, for the next one's shared
    /// messages ([`Measurer::serve_shared`]).
    main_stamp: Option<u64>,
    /// When the run ends before its last step ([`RunState::stop_when`]).
    stop: Option<StopRule>,
    /// The plan deciding replies as the run goes ([`RunState::set_reply_plan`]).
    reply_plan: Option<Box<dyn ReplyPlan>>,
    /// Strategies measured beside the run ([`RunState::add_mirror`]).
    mirrors: Vec<Mirror>,
}

impl<'o> RunState<'o> {
    /// The state before the first step.
    pub fn start(scenario: &Scenario, strategy: &Strategy, options: RunOptions<'o>) -> Result<Self, RunError> {
        Self::start_with(scenario, &scenario.built_script(), strategy, options)
    }

    /// [`RunState::start`] with the scenario's scripted model and tool outputs built already
    /// (`built`: see [`Scenario::into_world_with`]).
    pub fn start_with(scenario: &Scenario, built: &crate::scenario::BuiltScript, strategy: &Strategy, mut options: RunOptions<'o>) -> Result<Self, RunError> {
        let client = options.client.take();
        let mut world = scenario.into_world_with(built);
        crate::agent::plugins::configure_project_mcp(&mut world);
        let mut agent = Session::new(strategy, &world);
        check_strategy_for(agent.model_limits(&world), strategy)
            .map_err(|message| RunError::Strategy { file: scenario.file.clone(), strategy: strategy.name.clone(), message })?;
        for root in &scenario.world.plugins {
            let root = absolute(&world, root);
            agent.plugin_enable(&root, &mut world).map_err(|e| RunError::Script { file: scenario.file.clone(), step: 0, message: e })?;
        }
        Ok(RunState {
            world,
            agent,
            out: Collected::new(options),
            turn: 0,
            pending_events: Vec::new(),
            blocked: 0,
            surfaced: 0,
            pinned_edits: Vec::new(),
            recovery: RecoveryState::default(),
            pending_stages: Vec::new(),
            next: 0,
            checks: Vec::new(),
            client,
            media: MediaMemo::default(),
            prompted: false,
            main_stamp: None,
            compacted: false,
            stop: None,
            reply_plan: None,
            mirrors: Vec::new(),
        })
    }

    /// Whether the run is over: every step has run, or the stop rule ([`RunState::stop_when`])
    /// holds.
    pub fn done(&self, scenario: &Scenario) -> bool {
        self.next >= scenario.script.len() || self.stopped().is_some()
    }

    /// Ends the run (for [`RunState::done`]) after the first step at which `rule` holds, or now
    /// if it holds already. Needs the loss tracker ([`RunOptions::info_loss`]) for its count of
    /// tokens dropped (without it, only the refused requests are weighed). Checkpoints keep
    /// the rule.
    pub fn stop_when(&mut self, rule: StopRule) {
        self.stop = Some(rule);
    }

    /// Why the stop rule ends the run, when it does.
    pub fn stopped(&self) -> Option<Stopped> {
        self.stop?.stopped(self.out.loss.as_ref().map_or(0, LossTracker::tokens_dropped), self.refused())
    }

    /// The next step to run.
    pub fn next_step(&self) -> usize {
        self.next
    }

    /// Every count the autocompact stage compared with its threshold so far, with the step.
    pub fn checks(&self) -> &[(usize, u64)] {
        &self.checks
    }

    pub fn world(&self) -> &World {
        &self.world
    }

    pub fn world_mut(&mut self) -> &mut World {
        &mut self.world
    }

    pub fn agent(&self) -> &Session {
        &self.agent
    }

    pub fn agent_mut(&mut self) -> &mut Session {
        &mut self.agent
    }

    /// The rows measured from row `from` on.
    pub fn rows_from(&self, from: usize) -> impl Iterator<Item = &RequestMetrics> {
        self.out.rows.iter_from(from)
    }

    /// Shares the rows measured so far, and the session's kept messages ([`Session::freeze`]),
    /// with every later [`RunState::checkpoint`] of this state (and its copies) rather than
    /// copying them into each: a run checkpointed every few steps would otherwise copy its
    /// rows and its conversation over and over.
    pub fn freeze(&mut self) {
        self.out.rows.freeze();
        self.agent.freeze();
    }

    /// Main requests the blocking limit refused, and prompt-too-long errors surfaced, so far.
    pub fn refused(&self) -> u64 {
        self.blocked + self.surfaced
    }

    /// Goes on under `strategy`, which differs from the run's in knobs the caller has proven
    /// changed nothing before this step ([`Session::retarget`]).
    pub fn retarget(&mut self, strategy: &Strategy) {
        self.agent.retarget(strategy, &self.world);
    }

    /// Goes on under `strategy`, which differs from the run's only in where autocompact fires
    /// ([`Session::retarget_autocompact`]).
    pub fn retarget_autocompact(&mut self, strategy: &Strategy) -> Result<(), String> {
        self.agent.retarget_autocompact(strategy, &self.world)
    }

    /// Whether [`RunState::retarget_autocompact`] would take `strategy`
    /// ([`Session::autocompact_retargetable`]).
    pub fn autocompact_retargetable(&self, strategy: &Strategy) -> Result<(), String> {
        self.agent.autocompact_retargetable(strategy, &self.world)
    }

    /// Keeps the messages of every main request a compaction stage fired for (the first request
    /// after the compaction), by row index: [`RunState::take_compacted_requests`].
    pub fn keep_compacted_requests(&mut self) {
        self.out.compacted.get_or_insert_with(Vec::new);
    }

    /// The messages kept by [`RunState::keep_compacted_requests`]: (row index, messages).
    pub fn take_compacted_requests(&mut self) -> Vec<(usize, Vec<crate::api::Message>)> {
        self.out.compacted.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Goes on with `plan` deciding the replies from here ([`ReplyPlan`]).
    pub fn set_reply_plan(&mut self, mut plan: Box<dyn ReplyPlan>) {
        plan.start(&mut self.world.model);
        self.reply_plan = Some(plan);
    }

    /// The plan set by [`RunState::set_reply_plan`], in its present state.
    pub fn take_reply_plan(&mut self) -> Option<Box<dyn ReplyPlan>> {
        self.reply_plan.take()
    }

    /// Rows measured so far.
    pub fn rows(&self) -> usize {
        self.out.rows.len()
    }

    /// A copy of this state to go on from later; its requests go to no observer.
    pub fn checkpoint(&self) -> RunState<'static> {
        RunState {
            world: self.world.clone(),
            agent: self.agent.clone(),
            out: self.out.copy_without_observer(),
            turn: self.turn,
            pending_events: self.pending_events.clone(),
            blocked: self.blocked,
            surfaced: self.surfaced,
            pinned_edits: self.pinned_edits.clone(),
            recovery: self.recovery.clone(),
            pending_stages: self.pending_stages.clone(),
            next: self.next,
            checks: self.checks.clone(),
            client: self.client.as_ref().map(|c| c.clone_box()),
            media: self.media.clone(),
            prompted: self.prompted,
            main_stamp: self.main_stamp,
            compacted: self.compacted,
            stop: self.stop,
            reply_plan: self.reply_plan.as_ref().map(|p| p.clone_box()),
            // (A copy goes on as its own run: the mirrors follow this one.)
            mirrors: Vec::new(),
        }
    }

    /// Measures `mirror` beside this run from the next step on: every request the run measures
    /// from here is measured on the mirror too ([`Mirror`]). A mirror added before the first
    /// step measures the whole run.
    pub fn add_mirror(&mut self, mirror: Mirror) {
        self.mirrors.push(mirror);
    }

    /// The mirrors added ([`RunState::add_mirror`]), as they measured the run so far.
    pub fn take_mirrors(&mut self) -> Vec<Mirror> {
        std::mem::take(&mut self.mirrors)
    }

    /// The run's output once every step has run.
    pub fn finish(self, scenario: &Scenario, measurer: &Measurer, strategy: &Strategy) -> RunOutput {
        let stopped = self.stopped();
        let out = self.out;
        // A surfaced prompt-too-long ends its turn like a blocked one.
        let rows = out.rows.into_vec();
        let mut summary = Summary::from_rows(&scenario.file, &strategy.name, measurer.counter().kind().name(), &rows, self.blocked + self.surfaced);
        if let Some(loss) = out.loss {
            summary.info_loss = loss.finish();
        }
        RunOutput { scenario: scenario.file.clone(), rows, requests: out.requests, summary, stopped }
    }

    /// This state as text, but for the client's rules and the reply plan (which have no text),
    /// the mirrors (which a copy does not take), the rows before `rows` and what only saves work
    /// ([`Session::shown_without_memos`]): two states with one text, after the same steps,
    /// go on alike (for debug builds' comparisons of run states).
    #[cfg(debug_assertions)]
    pub fn shown_from(&self, rows: usize) -> String {
        let rows: Vec<&RequestMetrics> = self.rows_from(rows).collect();
        let run = (self.turn, &self.pending_events, self.blocked, self.surfaced, &self.pinned_edits, &self.recovery, &self.pending_stages);
        let more = (self.next, &self.checks, &self.media, self.prompted, self.compacted, self.main_stamp, self.stop);
        let out = (&rows, self.out.requests.len(), self.out.loss.as_ref().map(|loss| format!("{loss:?}")), &self.out.compacted);
        format!("{:?}\n{:?}\n{:?}\n{:?}\n{:?}", self.world, self.agent.shown_without_memos(), run, more, out)
    }

    /// Runs the next step of `scenario`.
    pub fn step(&mut self, scenario: &Scenario, measurer: &mut Measurer, strategy: &Strategy, chain: &Chain) -> Result<(), RunError> {
        let i = self.next;
        let Some(step) = scenario.script.get(i) else { return Ok(()) };
        self.next += 1;
        let RunState { world, agent, out, turn, pending_events, blocked, surfaced, pinned_edits, recovery, pending_stages, checks, client, media, prompted, compacted, main_stamp, reply_plan, mirrors, .. } = self;
        let err = |step: usize, message: String| RunError::Script { file: scenario.file.clone(), step, message };
        let mut note_check = |run: &crate::agent::session::ChainRun| {
            if let Some(counted) = run.autocompact_checked {
                checks.push((i, counted));
            }
        };
        match step {
            Step::User { text } => {
                *turn += 1;
                *prompted = true;
                *recovery = RecoveryState::default();
                agent.user_prompt(text, world);
                // The relevant-memory prefetch's selection request, when the gate is on.
                agent.prefetch_relevant_memories(text, world);
                // Side requests of the turn's start: prompt/agent hooks, the memory selection.
                measure_side_calls(measurer, mirrors, world, agent.take_side_calls(), *turn, out).map_err(|e| err(i, e))?;
            }
            Step::Assistant(reply_step) if reply_step.lane == "main" => {
                let mut reply = None;
                // One model call, retried after a successful rung of the prompt-too-long ladder.
                loop {
                    // The long-context chain runs first; its compaction forks are measured on
                    // their own lane before the main request.
                    let chain_run = {
                        let mut calls = MeasuredCalls { measurer: &mut *measurer, mirrors: &mut *mirrors, out: &mut *out, turn: *turn };
                        agent.run_chain(chain, world, &mut calls).map_err(|e| err(i, e))?
                    };
                    note_check(&chain_run);
                    pending_events.extend(chain_run.events.iter().cloned());
                    if let Some(reason) = &chain_run.blocked {
                        // The blocking limit ends the turn before the request is sent; the
                        // scripted reply for it is skipped.
                        *blocked += 1;
                        let _ = world.model.next_reply("main");
                        pending_events.push(format!("blocked:{reason}"));
                        break;
                    }
                    let (mut request, events) = agent.build_request_after_chain(world, &chain_run);
                    pending_events.extend(events);
                    let time_based = chain_run.reports.iter().any(|r| r.fired && r.name == "microcompact" && r.reason.starts_with("time_based"));
                    *compacted |= chain_run.compacted;
                    if chain_run.compacted || time_based {
                        pinned_edits.clear();
                    }
                    if let Some(edits) = &chain_run.cache_edits
                        && let Some(last_user) = request.messages.iter().rposition(|m| m.role == crate::api::Role::User)
                    {
                        pinned_edits.push((last_user, edits.clone()));
                    }
                    insert_cache_edits(&mut request, &pinned_edits);
                    // `stripExcessMediaItems`: at most 100 images and documents per request.
                    // The messages shared with the last main request are as its scan saw them.
                    let (stripped, sent_media) = media.strip_excess(&mut request.messages, API_MAX_MEDIA_PER_REQUEST, agent.shared_messages());
                    if stripped > 0 {
                        pending_events.push(format!("message_rewritten:excess_media_stripped:{stripped}"));
                    }
                    // The first message changed here since the build: pinned edits and stripped
                    // media may reach any (what the session need not compare when given back).
                    let changed_from = if pinned_edits.is_empty() && stripped == 0 { request.messages.len() } else { 0 };
                    // The server applies `context_management` before it counts or caches; it
                    // refuses oversized media first, then an over-long prompt.
                    let salts = client.as_deref().map_or(&[][..], |c| c.salts_hint()).to_vec();
                    // Its first messages are the last main request's own, where neither the build
                    // nor this step changed them: the flattener that measured it skips them.
                    let hint = main_stamp.map(|stamp| (stamp, agent.shared_messages().min(changed_from)));
                    let (mut served, stamp) = measurer.serve_shared(&request, &salts, hint).map_err(|e| err(i, e.to_string()))?;
                    *main_stamp = Some(stamp);
                    let window = agent.model_limits(world).context_window;
                    // The media as stripping left them: the request has not changed since.
                    let media_error = sent_media.error();
                    debug_assert_eq!(media_error, crate::agent::compact::recovery::simulated_media_error(&request.messages));
                    let rejection = media_error.clone().or_else(|| simulated_api_error(served.flat.total_tokens, window));
                    // (A mirror that sends every tool up front sends the thread's tools as
                    // assembled without tool search.)
                    if let Some(tools) = &request.tools {
                        for mirror in mirrors.iter_mut().filter(|m| m.wants_tools(tools)) {
                            mirror.send_up_front(tools.clone(), agent.tools_without_search(world));
                        }
                    }
                    for mirror in mirrors.iter_mut() {
                        mirror.serve_main(&mut request, &served, (hint, stamp), media_error.as_deref(), window, rejection.as_deref());
                    }
                    if let Some(error) = rejection {
                        // Measured as sent: the client's rules apply to accepted requests.
                        served.flat.set_salts(&[]);
                        // The API rejects the request: an error row, then the ladder.
                        let mut input = MeasureInput::new("main", world.clock.now_ms(), &request);
                        input.turn = *turn;
                        input.events = std::mem::take(pending_events);
                        let mut stages = std::mem::take(pending_stages);
                        stages.extend(chain_run.reports);
                        stages.extend(agent.take_peer_reports());
                        input.stages = stages.into();
                        input.rejected = Some(error.clone());
                        for mirror in mirrors.iter_mut() {
                            mirror.measure_refused(&input);
                        }
                        let row = measurer.measure_served(input, served).map_err(|e| err(i, e.to_string()))?;
                        if let Some(request) = out.push_shared(row, request, stamp, hint) {
                            agent.give_back_messages(request.messages, changed_from);
                        }
                        let recovery_outcome = {
                            let mut calls = MeasuredCalls { measurer: &mut *measurer, mirrors: &mut *mirrors, out: &mut *out, turn: *turn };
                            agent.recover_prompt_too_long(chain, world, &mut calls, recovery, &error).map_err(|e| err(i, e))?
                        };
                        match recovery_outcome {
                            Recovery::Retry(run) => {
                                note_check(&run);
                                // A reactive compaction is a compaction to the client's rules
                                // too, as the chain's and `/compact`'s are.
                                *compacted |= run.compacted;
                                if run.compacted {
                                    pinned_edits.clear();
                                }
                                pending_events.extend(run.events);
                                *pending_stages = run.reports;
                                continue;
                            }
                            Recovery::Surface { run, .. } => {
                                note_check(&run);
                                *compacted |= run.compacted;
                                // The error is shown and the turn ends (`prompt_too_long`, or
                                // `image_error` for media, whose offending blocks the next
                                // request no longer carries); the scripted reply is never
                                // sampled. What the ladder's stages did is reported on the next
                                // main request.
                                pending_events.extend(run.events);
                                *pending_stages = run.reports;
                                if is_media_size_error(&error) {
                                    let stripped = agent.strip_media_after_error();
                                    pending_events.push(format!("image_error_surfaced:{stripped}"));
                                    if stripped > 0 {
                                        pending_events.push("message_rewritten:oversized_media_stripped".to_owned());
                                    }
                                } else {
                                    pending_events.push("prompt_too_long_surfaced".to_owned());
                                }
                                *surfaced += 1;
                                let _ = world.model.next_reply("main");
                                break;
                            }
                        }
                    }
                    // The mirrors' events before their own rules' are the run's before its rules'.
                    let mirror_events = (!mirrors.is_empty()).then(|| pending_events.clone());
                    let (time_ms, consumed, new_turn, was_compacted) = (world.clock.now_ms(), world.model.consumed("main"), *prompted, *compacted);
                    for mirror in mirrors.iter_mut() {
                        mirror.before_main(&mut request, |request| MainCall { request, time_ms, reply: consumed, new_turn, compacted: was_compacted, markers_ttl: None });
                    }
                    if let Some(client) = client.as_deref_mut() {
                        let call = MainCall { request: &request, time_ms, reply: consumed, new_turn, compacted: was_compacted, markers_ttl: None };
                        pending_events.extend(client.before_main(call, &mut served.flat, measurer));
                    }
                    (*prompted, *compacted) = (false, false);
                    let mut this_reply = world.model.next_reply("main").map_err(|e| err(i, e.to_string()))?;
                    let first_token_ms = this_reply.latency.map_or(0, |l| l.first_token_ms);
                    let mut input = MeasureInput::new("main", world.clock.now_ms(), &request);
                    input.turn = *turn;
                    input.events = std::mem::take(pending_events);
                    input.output_tokens = this_reply.output_tokens;
                    input.first_token_ms = first_token_ms;
                    input.recorded_usage = this_reply.usage.clone().filter(|u| *u != Usage::default());
                    let mut stages = std::mem::take(pending_stages);
                    stages.extend(chain_run.reports);
                    stages.extend(agent.take_peer_reports());
                    input.stages = stages.into();
                    let mirror_input = mirror_events.map(|events| input.with_events(events));
                    let mut row = measurer.measure_served(input, served).map_err(|e| err(i, e.to_string()))?;
                    if let Some(plan) = reply_plan.as_deref_mut() {
                        plan.main_reply(&mut row, &mut this_reply, &mut world.model);
                    }
                    if let Some(input) = mirror_input
                        && let Some((last, others)) = mirrors.split_last_mut()
                    {
                        let usage_of = |row: &RequestMetrics| crate::agent::compact::counting::usage_total(&reported_usage(&this_reply, row));
                        for mirror in others {
                            mirror.main_row(input.clone(), &row, usage_of);
                        }
                        // (The last one takes the input itself.)
                        last.main_row(input, &row, usage_of);
                    }
                    if let Some(client) = client.as_deref_mut() {
                        client.after_main(&row);
                    }
                    let usage = reported_usage(&this_reply, &row);
                    let message_id = reply_message_id(row.index);
                    // The request's messages go back to the session, which lends them to the
                    // next request instead of copying the conversation again.
                    if let Some(request) = out.push_shared(row, request, stamp, hint) {
                        agent.give_back_messages(request.messages, changed_from);
                    }
                    world.clock.advance(this_reply.latency.map_or(0, |l| l.total_ms));
                    reply = Some((this_reply, usage, message_id));
                    break;
                }
                let Some((reply, usage, message_id)) = reply else { return Ok(()) };
                // Events of the reply's tools are kept by the session for the next request. An
                // Agent call runs its subagent here, each of its requests measured on its lane.
                let mut calls = MeasuredCalls { measurer: &mut *measurer, mirrors: &mut *mirrors, out: &mut *out, turn: *turn };
                agent.apply_reply(&reply, world, &mut calls).map_err(|e| err(i, e))?;
                measure_side_calls(measurer, mirrors, world, agent.take_side_calls(), *turn, out).map_err(|e| err(i, e))?;
                agent.note_usage(usage, message_id, world.clock.now_ms());
                if reply.stop_reason == StopReason::MaxTokens {
                    // max_output_tokens recovery: the partial reply stays, a meta message asks
                    // the model to resume (at most the configured number of times per turn).
                    match on_max_output_tokens(strategy.compact.recovery.max_output_tokens_recovery_limit, recovery) {
                        MaxOutputAction::Resume { attempt, .. } => {
                            agent.push_meta_user(RESUME_MESSAGE);
                            pending_events.push(format!("max_output_tokens_recovery:{attempt}"));
                        }
                        MaxOutputAction::Surface => pending_events.push("max_output_tokens_surfaced".to_owned()),
                    }
                } else if reply.content.iter().any(|b| matches!(b, crate::api::ContentBlock::ToolUse { .. })) {
                    recovery.next_turn();
                }
                // Session memory is extracted after sampling, on its own lane.
                let mut calls = MeasuredCalls { measurer: &mut *measurer, mirrors: &mut *mirrors, out: &mut *out, turn: *turn };
                agent.extract_session_memory(world, &mut calls).map_err(|e| err(i, e))?;
            }
            Step::Assistant(_) => {}
            Step::ToolOutput(_) => {}
            Step::Wait { ms } => world.clock.advance(*ms),
            Step::WriteFile { .. }
            | Step::RemoveFile { .. }
            | Step::McpConnect { .. }
            | Step::McpDisconnect { .. }
            | Step::McpListChanged { .. }
            | Step::PluginEnable { .. }
            | Step::PluginReload
            | Step::Attachment { .. }
            | Step::Microcompact { .. }
            | Step::ResumeLost { .. }
            | Step::Git(_) => apply_world_step(step, agent, world, pending_events).map_err(|e| err(i, e))?,
            Step::Clear => {
                agent.clear(world);
                measure_side_calls(measurer, mirrors, world, agent.take_side_calls(), *turn, out).map_err(|e| err(i, e))?;
            }
            Step::Compact => {
                let run = {
                    let mut calls = MeasuredCalls { measurer: &mut *measurer, mirrors: &mut *mirrors, out: &mut *out, turn: *turn };
                    agent.manual_compact(chain, world, &mut calls).map_err(|e| err(i, e))?
                };
                *compacted |= run.compacted;
                note_check(&run);
                pending_events.extend(run.events);
                pending_stages.extend(run.reports);
            }
            Step::Resume => {
                agent.resume(world);
                measure_side_calls(measurer, mirrors, world, agent.take_side_calls(), *turn, out).map_err(|e| err(i, e))?;
            }
            Step::ModelSwitch { model } => {
                world.model_id = model.clone();
                pending_events.push(format!("model_changed:{model}"));
            }
        }
        Ok(())
    }
}

/// The usage the API reports for a reply measured as `row`. The client trusts it: a scripted
/// usage that states the input side wins over the simulated one (that is how a scenario claims
/// a big context cheaply, as the real client's oracle does).
fn reported_usage(reply: &Reply, row: &RequestMetrics) -> Usage {
    reply.usage.clone().filter(|u| u.prompt_tokens() > 0).unwrap_or(Usage {
        input_tokens: row.input_tokens,
        cache_creation_input_tokens: row.cache_creation_input_tokens,
        cache_read_input_tokens: row.cache_read_input_tokens,
        output_tokens: row.output_tokens,
        ..Usage::default()
    })
}

/// Subagent requests as the runner sends them: measured on their lane at the current virtual
/// time, answered by the lane's next scripted reply, the clock moved on by its latency.
struct MeasuredCalls<'a, 'o> {
    measurer: &'a mut Measurer,
    mirrors: &'a mut [Mirror],
    out: &'a mut Collected<'o>,
    turn: u32,
}

impl ModelCalls for MeasuredCalls<'_, '_> {
    fn lane_started(&mut self, lane: &str) {
        self.measurer.restart_lane(lane);
        for mirror in self.mirrors.iter_mut() {
            mirror.restart_lane(lane);
        }
    }

    fn side(&mut self, calls: Vec<SideCall>, world: &mut World) -> Result<(), String> {
        measure_side_calls(self.measurer, self.mirrors, world, calls, self.turn, self.out)
    }

    fn call(&mut self, lane: &str, request: Request, events: Vec<String>, world: &mut World) -> Result<(Reply, Usage), String> {
        let reply = world.model.next_reply(lane).map_err(|e| e.to_string())?;
        let mut input = MeasureInput::new(lane, world.clock.now_ms(), &request);
        input.turn = self.turn;
        input.events = events;
        input.output_tokens = reply.output_tokens;
        input.first_token_ms = reply.latency.map_or(0, |l| l.first_token_ms);
        input.recorded_usage = reply.usage.clone().filter(|u| *u != Usage::default());
        let row = measure_mirrored(self.measurer, self.mirrors, input).map_err(|e| e.to_string())?;
        let usage = reported_usage(&reply, &row);
        self.out.push(row, request);
        world.clock.advance(reply.latency.map_or(0, |l| l.total_ms));
        Ok((reply, usage))
    }

    fn fork(&mut self, lane: &str, thread: &str, request: Request, events: Vec<String>, window: u64, fallback: Reply, world: &mut World) -> Result<ForkAnswer, String> {
        let (row, answer) = measure_fork(self.measurer, self.mirrors, thread, lane, &request, events, window, fallback, world, self.turn)?;
        self.out.push(row, request);
        Ok(answer)
    }
}

/// A chain fork measured in simulation: the API refuses it before sampling as it does on the
/// main lane (an error row, the clock stays), else the lane's next scripted reply or `fallback`
/// answers it and the clock moves on by its latency; measured on every mirror too, as a fork of
/// the thread on lane `thread` ([`Mirror::measure_fork`]). Shared by the runner and `live`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn measure_fork(
    measurer: &mut Measurer,
    mirrors: &mut [Mirror],
    thread: &str,
    lane: &str,
    request: &Request,
    events: Vec<String>,
    window: u64,
    fallback: Reply,
    world: &mut World,
    turn: u32,
) -> Result<(RequestMetrics, ForkAnswer), String> {
    let served = measurer.serve(request).map_err(|e| e.to_string())?;
    let mut input = MeasureInput::new(lane, world.clock.now_ms(), request);
    input.turn = turn;
    input.events = events;
    let refusal = simulated_media_error(&request.messages).or_else(|| simulated_api_error(served.flat.total_tokens, window));
    let answer = match refusal {
        Some(error) => {
            input.rejected = Some(error.clone());
            ForkAnswer::Refused(error)
        }
        None => {
            let reply = world.model.next_reply(lane).unwrap_or(fallback);
            input.output_tokens = reply.output_tokens;
            input.first_token_ms = reply.latency.map_or(0, |l| l.first_token_ms);
            ForkAnswer::Answered(reply)
        }
    };
    for mirror in mirrors.iter_mut() {
        mirror.measure_fork(&input, &served, thread, window);
    }
    let row = measurer.measure_served(input, served).map_err(|e| e.to_string())?;
    if let ForkAnswer::Answered(reply) = &answer {
        world.clock.advance(reply.latency.map_or(0, |l| l.total_ms));
    }
    Ok((row, answer))
}

/// [`Measurer::measure`] of a request of another lane than the main one, measured as sent on
/// every mirror too.
fn measure_mirrored(measurer: &mut Measurer, mirrors: &mut [Mirror], input: MeasureInput<'_>) -> Result<RequestMetrics, crate::measure::UnknownModel> {
    if mirrors.is_empty() {
        return measurer.measure(input);
    }
    let served = measurer.serve(input.body)?;
    for mirror in mirrors.iter_mut() {
        mirror.measure_as_sent(&input, &served);
    }
    measurer.measure_served(input, served)
}

/// Measures the side calls (compaction and session-memory forks, memory selection) in order,
/// advancing the clock by each blocking reply's latency.
fn measure_side_calls(
    measurer: &mut Measurer,
    mirrors: &mut [Mirror],
    world: &mut World,
    side_calls: Vec<SideCall>,
    turn: u32,
    out: &mut Collected<'_>,
) -> Result<(), String> {
    for call in side_calls {
        if call.concurrent {
            // A prefetch's side query is a conversation of its own, not a continuation of the
            // previous one on its lane.
            measurer.restart_lane(&call.lane);
            for mirror in mirrors.iter_mut() {
                mirror.restart_lane(&call.lane);
            }
        }
        let mut input = MeasureInput::new(&call.lane, call.time_ms, &call.request);
        input.turn = turn;
        input.output_tokens = call.reply.output_tokens;
        input.first_token_ms = call.reply.latency.map_or(0, |l| l.first_token_ms);
        let row = measure_mirrored(measurer, mirrors, input).map_err(|e| e.to_string())?;
        out.push(row, call.request);
        if !call.concurrent {
            world.clock.advance(call.reply.latency.map_or(0, |l| l.total_ms));
        }
    }
    Ok(())
}

/// Cached microcompact on the wire (§8.4). Every pinned `cache_edits` block goes back into the
/// user message it was first sent in, right after that message's last tool_result (a `.` text
/// block follows when that would make it last; with no tool_result, before the last block), so
/// the bytes the server cached stay the same. Then every tool_result of a user message before
/// the last message holding a marker gets `cache_reference` = its tool_use_id, so the server
/// can address it. Ours: pins are indexed by wire message, and dropped on any compaction (the
/// reference resets cached-microcompact state there too).
pub fn insert_cache_edits(request: &mut Request, pinned: &[(usize, serde_json::Value)]) {
    use crate::api::{ContentBlock, MessageContent, Role};
    if pinned.is_empty() {
        return;
    }
    for (index, edits) in pinned {
        let Some(message) = request.messages.get_mut(*index).filter(|m| m.role == Role::User) else { continue };
        let mut blocks = message.content.to_blocks();
        let edit = ContentBlock::Other(edits.clone());
        // A block carrying the marker may be held as raw JSON: match on the wire type.
        match blocks.iter().rposition(|b| b.kind() == "tool_result") {
            Some(i) => {
                blocks.insert(i + 1, edit);
                if i + 2 == blocks.len() {
                    blocks.push(ContentBlock::text("."));
                }
            }
            None => {
                let at = blocks.len().saturating_sub(1);
                blocks.insert(at, edit);
            }
        }
        message.content = MessageContent::Blocks(blocks.into());
    }
    let marked = request.messages.iter().rposition(|m| match &m.content {
        MessageContent::Blocks(blocks) => blocks.iter().any(|b| b.cache_control().is_some()),
        MessageContent::Text(_) => false,
    });
    let Some(marked) = marked else { return };
    for message in request.messages[..marked].iter_mut().filter(|m| m.role == Role::User) {
        if let MessageContent::Blocks(blocks) = &mut message.content {
            for block in blocks.iter_mut() {
                match block {
                    ContentBlock::ToolResult { tool_use_id, extra, .. } => {
                        extra.insert("cache_reference".to_owned(), serde_json::Value::String(tool_use_id.clone()));
                    }
                    ContentBlock::Other(serde_json::Value::Object(map)) if map.get("type").and_then(|t| t.as_str()) == Some("tool_result") => {
                        if let Some(id) = map.get("tool_use_id").cloned() {
                            map.insert("cache_reference".to_owned(), id);
                        }
                    }
                    // As its raw JSON form: a new key goes after the marker, so a marked result
                    // without one becomes that form.
                    ContentBlock::FinalToolResult { tool_use_id, cache_control, extra, .. } if cache_control.is_none() || extra.contains_key("cache_reference") => {
                        extra.insert("cache_reference".to_owned(), serde_json::Value::String(tool_use_id.clone()));
                    }
                    ContentBlock::FinalToolResult { tool_use_id, .. } => {
                        let id = serde_json::Value::String(tool_use_id.clone());
                        if let Some(serde_json::Value::Object(mut map)) = block.wire_value() {
                            map.insert("cache_reference".to_owned(), id);
                            *block = ContentBlock::Other(serde_json::Value::Object(map));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Applies a step that changes the World or the session's capabilities without a model call
/// (file edits by the user, MCP and plugin steps, git state, a recorded attachment); other
/// steps are left alone.
/// Events for the next request go to `pending_events`.
pub fn apply_world_step(step: &Step, agent: &mut Session, world: &mut World, pending_events: &mut Vec<String>) -> Result<(), String> {
    match step {
        Step::WriteFile { path, content } => {
            let path = absolute(world, path);
            world.fs.write(&path, content.clone(), &world.clock).map_err(|e| e.to_string())?;
            pending_events.push(format!("file_edited_by_user:{path}"));
        }
        Step::RemoveFile { path } => {
            let path = absolute(world, path);
            world.fs.remove(&path, &world.clock).map_err(|e| e.to_string())?;
        }
        Step::McpConnect { server } => agent.mcp_connect(server, world)?,
        Step::McpDisconnect { server } => agent.mcp_disconnect(server, world)?,
        Step::McpListChanged { server, tools } => agent.mcp_list_changed(server, tools.clone(), world)?,
        Step::PluginEnable { root } => agent.plugin_enable(root, world)?,
        Step::PluginReload => agent.plugin_reload(world)?,
        Step::Git(state) => world.git = Some(state.clone()),
        Step::Attachment { kind, text, skill } => agent.recorded_attachment(kind, text, skill.as_deref(), world),
        Step::Microcompact { tool_use_ids, history_chars } => agent.recorded_microcompact(tool_use_ids, *history_chars),
        Step::ResumeLost { tool_use_ids } => agent.recorded_resume_loss(tool_use_ids),
        _ => {}
    }
    Ok(())
}

/// A scenario path made absolute against the session's working directory.
pub fn absolute(world: &World, path: &str) -> String {
    if path.starts_with('/') { path.to_owned() } else { format!("{}/{}", world.cwd.trim_end_matches('/'), path) }
}

/// Runs a scenario twice and names the first request whose bytes differ.
pub fn check_determinism(scenario: &Scenario, make_measurer: &dyn Fn() -> Measurer, strategy: &Strategy) -> Result<Option<String>, RunError> {
    check_determinism_with(scenario, make_measurer, strategy, &Chain::new())
}

/// [`check_determinism`] with a given long-context chain.
pub fn check_determinism_with(
    scenario: &Scenario,
    make_measurer: &dyn Fn() -> Measurer,
    strategy: &Strategy,
    chain: &Chain,
) -> Result<Option<String>, RunError> {
    // Rows and fingerprints are compared; the bodies are not kept.
    let a = run_scenario_opts(scenario, &mut make_measurer(), strategy, chain, RunOptions::default())?;
    let b = run_scenario_opts(scenario, &mut make_measurer(), strategy, chain, RunOptions::default())?;
    for (i, (x, y)) in a.rows.iter().zip(&b.rows).enumerate() {
        if x.body_sha256 != y.body_sha256 {
            return Ok(Some(format!("{}: request {i} differs between two runs ({} vs {})", scenario.file, x.body_sha256, y.body_sha256)));
        }
    }
    if a.rows.len() != b.rows.len() {
        return Ok(Some(format!("{}: the runs made {} and {} requests", scenario.file, a.rows.len(), b.rows.len())));
    }
    if a.summary.fingerprint != b.summary.fingerprint {
        return Ok(Some(format!("{}: fingerprints differ", scenario.file)));
    }
    Ok(None)
}

/// Flattens every request of a run again (same estimator) for renderings.
pub fn flatten_all(output: &RunOutput, measurer: &mut Measurer) -> Vec<FlatRequest> {
    output.requests.iter().map(|r| measurer.flatten(r).expect("the run already resolved this model")).collect()
}

/// Request bodies as `NNNN.json` files (pretty JSON), by file name.
pub fn dump_requests(output: &RunOutput) -> BTreeMap<String, Vec<u8>> {
    output
        .requests
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("{i:04}.json"), serde_json::to_vec_pretty(r).expect("requests serialize")))
        .collect()
}
