//! Compaction what-ifs on a real session: the session replayed with compactions where another
//! autocompact setting (buffer, `CLAUDE_AUTOCOMPACT_PCT_OVERRIDE`, `CLAUDE_CODE_AUTO_COMPACT_WINDOW`,
//! `DISABLE_AUTO_COMPACT`, `DISABLE_COMPACT`, the window) would have put them.
//!
//! The decision is the agent's own: before each main-lane call the client's count
//! ([`super::triggers::main_points`], the agent's rough counting on top of the last usage) is
//! held against [`Thresholds::compute`](crate::agent::compact::counting::Thresholds::compute).
//! Where the setting compacts and the recording did not, a compaction is inserted
//! ([`CompactionEdit::Insert`]): the summary request forks the main lane and its reply is a
//! deterministic stand-in of the fitted summary length ([`SUMMARY_CHARS`]); the working set the
//! client restores is the replay's own. Where the recording compacted and the setting does too,
//! the recorded summary stays; where it would not, the boundary goes
//! ([`CompactionEdit::Remove`]) and the history stays in view.
//!
//! The model's replies after the first change are the recorded ones (the same work is assumed
//! to happen), and the replay says so ([`super::SessionReplay::first_divergence`]).
//!
//! Counts after a change depend on what the changed session sends, so the plan is found by
//! replaying: plan from the session as it stands (counts after the first change estimated),
//! apply, replay, plan again from the replayed counts, until the plan stops changing
//! ([`MAX_ITERATIONS`] at most).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::Serialize;

use crate::agent::compact::config::AutocompactConfig;
use crate::measure::Measurer;
use crate::recording::{CompactionEdit, EventKind, ImportedSession};

use super::session::{
    CompactionsSeen, ReplayCheckpoint, ReplayCheckpoints, ReplayOptions, SessionReplay, checkpoints_apply, replay_session_checkpointed,
    replay_session_from_checkpointed, replay_session_plain, replay_session_plain_checkpointed, replay_session_plain_seen,
};
use super::triggers::{client_thresholds, main_points};

/// Characters of a stand-in summary: the median of the 12 automatic compaction summaries in
/// ../shared/realdata (8,462–21,205 characters; fitted on all 16 sessions, no dependence on
/// preTokens visible in them).
pub const SUMMARY_CHARS: usize = 13_647;

/// Tokens the client restores after a compaction (files, plan, skills), as the plan estimates
/// it before the replay measures it: the median over the 10 recorded automatic compactions of
/// the first call's context less its prefix level and summary (8.9k–39k).
pub const RESTORE_TOKENS_ESTIMATE: u64 = 21_000;

/// Replays of one session the planner makes at most.
pub const MAX_ITERATIONS: usize = 8;

/// One change to where the session compacted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompactionChange {
    /// Position of the main-lane call the compaction precedes, among the recording's main
    /// calls.
    pub call: usize,
    /// `inserted`: the setting compacts here, the recording did not; `removed`: the recording
    /// compacted here, the setting does not.
    pub change: String,
    /// The client's count there.
    pub pre_tokens: u64,
}

/// What the what-if did to a session.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompactionWhatIf {
    pub threshold: u64,
    pub changes: Vec<CompactionChange>,
    /// Replays it took to settle the plan.
    pub iterations: usize,
    /// False when [`MAX_ITERATIONS`] replays did not settle it (the last plan is used).
    pub converged: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// Compact before the main reply with this message id.
    Insert(String),
    /// Drop the recorded boundary at this event index of the recording.
    Remove(usize),
}

/// Replays of one session shared between the points of a sweep (or the strategies of a
/// comparison): a replay is a function of the session's compaction plan and the replay options
/// alone (every replay starts from a reset measurer whose token counts are the estimator's), so
/// each distinct pair is replayed once, keyed by a content hash of both. Two threads asking for
/// one key wait for one replay. The outputs are the same with or without it.
///
/// A replay of the session as recorded made through the memo keeps checkpoints
/// ([`ReplayCheckpoints`]); a replay of the session with compactions moved under the same
/// options starts from the last one before its first edit instead of from the first call (the
/// same replay: a test compares every what-if of every real session with and without them).
#[derive(Debug)]
pub struct ReplayMemo {
    replays: Mutex<HashMap<u128, Arc<OnceLock<Arc<SessionReplay>>>>>,
    /// Checkpoints of the replays as recorded, by the key of the replay.
    checkpoints: Mutex<HashMap<u128, Arc<ReplayCheckpoints>>>,
    /// Checkpoints of the latest replays of edited sessions (at most [`PLANNED_KEPT`]), by the
    /// key of the session as recorded under the same options: a plan search's next step, whose
    /// plan usually differs from the last one only in later edits, starts from the last one
    /// before the first edit the two plans differ in.
    planned: Mutex<HashMap<u128, Vec<(Plan, Arc<ReplayCheckpoints>)>>>,
    /// The compactions each replay of an edited session that judged none went through, by the
    /// key of the replay: the same replay judging them is that one plus their judgement
    /// (a plan search's last replay and the what-if's own differ only there).
    seen: Mutex<HashMap<u128, Arc<CompactionsSeen>>>,
    use_checkpoints: bool,
    /// Replays made, and replays asked for (for the bench notes); calls a replay from a
    /// checkpoint did not replay.
    made: AtomicUsize,
    asked: AtomicUsize,
    calls_skipped: AtomicUsize,
    /// Replays made from a checkpoint of a replay of another plan ([`Self::planned`]).
    from_planned: AtomicUsize,
    /// Replays judging the compactions made from the same replay judging none ([`Self::seen`]).
    judged_only: AtomicUsize,
}

impl Default for ReplayMemo {
    fn default() -> Self {
        ReplayMemo {
            replays: Mutex::default(),
            checkpoints: Mutex::default(),
            planned: Mutex::default(),
            seen: Mutex::default(),
            use_checkpoints: true,
            made: AtomicUsize::new(0),
            asked: AtomicUsize::new(0),
            calls_skipped: AtomicUsize::new(0),
            from_planned: AtomicUsize::new(0),
            judged_only: AtomicUsize::new(0),
        }
    }
}

impl ReplayMemo {
    pub fn new() -> ReplayMemo {
        ReplayMemo::default()
    }

    /// A memo that replays every edited session from its first call (no checkpoints): the
    /// reference the checkpointed replays must equal.
    pub fn without_checkpoints() -> ReplayMemo {
        ReplayMemo { use_checkpoints: false, ..ReplayMemo::default() }
    }

    /// `(replays made, replays asked for)` so far.
    pub fn counts(&self) -> (usize, usize) {
        (self.made.load(Ordering::Relaxed), self.asked.load(Ordering::Relaxed))
    }

    /// Calls the replays made from a checkpoint took from it instead of replaying them.
    pub fn calls_skipped(&self) -> usize {
        self.calls_skipped.load(Ordering::Relaxed)
    }

    /// Replays of edited sessions made from a checkpoint of a replay of another plan (a plan
    /// search's earlier step) rather than of the session as recorded.
    pub fn from_planned(&self) -> usize {
        self.from_planned.load(Ordering::Relaxed)
    }

    /// Replays made from the same replay judging no compaction (the plan search's last) by
    /// judging its compactions, without replaying.
    pub fn judged_only(&self) -> usize {
        self.judged_only.load(Ordering::Relaxed)
    }

    fn get_or_replay(&self, key: u128, replay: impl FnOnce() -> Arc<SessionReplay>) -> Arc<SessionReplay> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        let slot = {
            let mut map = self.replays.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            map.entry(key).or_default().clone()
        };
        slot.get_or_init(|| {
            self.made.fetch_add(1, Ordering::Relaxed);
            replay()
        })
        .clone()
    }

    fn checkpoints_of(&self, key: u128) -> Option<Arc<ReplayCheckpoints>> {
        self.checkpoints.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key).cloned()
    }

    /// The replay under `key` (one that judged no compaction), made, and the compactions it
    /// went through.
    fn unjudged(&self, key: u128) -> Option<(Arc<SessionReplay>, Arc<CompactionsSeen>)> {
        let seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key).cloned()?;
        let replay = self.replays.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key)?.get()?.clone();
        Some((replay, seen))
    }

    fn keep_seen(&self, key: u128, seen: CompactionsSeen) {
        self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, Arc::new(seen));
    }

    fn keep_checkpoints(&self, key: u128, checkpoints: ReplayCheckpoints) {
        self.checkpoints.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, Arc::new(checkpoints));
    }

    fn planned_of(&self, original: u128) -> Vec<(Plan, Arc<ReplayCheckpoints>)> {
        self.planned.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&original).cloned().unwrap_or_default()
    }

    fn keep_planned(&self, original: u128, plan: &Plan, checkpoints: ReplayCheckpoints) {
        let mut map = self.planned.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let kept = map.entry(original).or_default();
        if kept.len() >= PLANNED_KEPT {
            kept.remove(0);
        }
        kept.push((plan.clone(), Arc::new(checkpoints)));
    }

    /// Takes `replay`, a replay of `session` as recorded under `options` made elsewhere (with
    /// `checkpoints` taken in it, [`replay_session_checkpointed`]), as this memo's replay of it:
    /// what-ifs under the same options start from its checkpoints.
    /// The replay serves under `options` without the compactions' losses judged too (a plan
    /// search's first replay), as that replay.
    pub fn record_replay(&self, options: &ReplayOptions, incremental: bool, replay: Arc<SessionReplay>, checkpoints: Vec<ReplayCheckpoint>) {
        let set = |key: u128, replay: Arc<SessionReplay>| {
            let slot = {
                let mut map = self.replays.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                map.entry(key).or_default().clone()
            };
            let _ = slot.set(replay);
        };
        set(replay_key(&BTreeMap::new(), options, incremental), replay.clone());
        let unjudged = counts_only(options);
        let key = replay_key(&BTreeMap::new(), &unjudged, incremental);
        if options.compaction_losses {
            set(key, Arc::new(SessionReplay { compaction_losses: Vec::new(), ..SessionReplay::clone(&replay) }));
        }
        if self.use_checkpoints {
            self.keep_checkpoints(key, ReplayCheckpoints::new(checkpoints, replay));
        }
    }
}

/// A compaction plan: the steps, each with the client's count there (the stand-in summary's).
type Plan = BTreeMap<Step, u64>;

/// Edited replays whose checkpoints a memo keeps per session and options: enough for the
/// three thresholds of an audit searching at once, each resuming from its own last step.
const PLANNED_KEPT: usize = 4;

/// Where the plans of one search edit the session as recorded, for resuming a replay of one
/// plan from a checkpoint of a replay of another.
struct PlanIndex<'a> {
    original: &'a ImportedSession,
    event_of: &'a BTreeMap<String, usize>,
    /// The recording's main-lane calls with a message id no other main call has, in event
    /// order: (event index, message id).
    main_calls: Vec<(usize, &'a str)>,
}

impl<'a> PlanIndex<'a> {
    fn new(original: &'a ImportedSession, event_of: &'a BTreeMap<String, usize>) -> PlanIndex<'a> {
        let main = || original.calls.iter().filter(|c| c.lane == crate::recording::format::LANE_MAIN);
        let mut uses: HashMap<&str, usize> = HashMap::new();
        for id in main().filter_map(|c| c.message_id.as_deref()) {
            *uses.entry(id).or_default() += 1;
        }
        let mut main_calls: Vec<(usize, &str)> =
            main().filter_map(|c| c.message_id.as_deref().filter(|id| uses[id] == 1).map(|id| (c.event_index, id))).collect();
        main_calls.sort_unstable();
        PlanIndex { original, event_of, main_calls }
    }

    /// The first event of the recording the edit of `step` may change
    /// ([`ImportedSession::with_compaction_edits`]): an inserted compaction's reply; after the
    /// main reply before a removed boundary (its summary request goes too).
    fn reach(&self, step: &Step) -> usize {
        match step {
            Step::Insert(id) => self.event_of.get(id).copied().unwrap_or(0),
            Step::Remove(boundary) => {
                let events = &self.original.recording.events;
                events
                    .iter()
                    .take(*boundary)
                    .rposition(|e| e.lane == crate::recording::format::LANE_MAIN && matches!(e.kind, EventKind::ModelReply(_)))
                    .map_or(0, |i| i + 1)
            }
        }
    }

    /// The position in `session` (the recording edited by some plan) of the last main call of
    /// the recording before event `reach` of the recording, when it is known.
    fn anchor(&self, session: &ImportedSession, reach: usize) -> Option<usize> {
        let before = self.main_calls.partition_point(|&(event, _)| event < reach).checked_sub(1)?;
        let id = self.main_calls[before].1;
        let mut found = session.calls.iter().enumerate().filter(|(_, c)| c.lane == crate::recording::format::LANE_MAIN && c.message_id.as_deref() == Some(id));
        let (position, _) = found.next()?;
        found.next().is_none().then_some(position)
    }

    /// The first event of `session` (the recording edited by `plan`) at which it may differ from
    /// the recording edited by `other`: the event after the last main reply before every step
    /// the two plans differ in (events up to it are the same in both, at the same indices, as
    /// the edits before it are). `None` when no such reply is known.
    fn first_difference(&self, session: &ImportedSession, plan: &Plan, other: &Plan) -> Option<usize> {
        let differs = |a: &Plan, b: &Plan| a.iter().filter(|(step, n)| b.get(step) != Some(n)).map(|(step, _)| self.reach(step)).min();
        let reach = differs(plan, other).into_iter().chain(differs(other, plan)).min()?;
        self.anchor(session, reach).map(|position| session.calls[position].event_index + 1)
    }

    /// Positions in `session` (the recording edited by `plan`) of the calls right after the
    /// last main call before each step of `plan`: a checkpoint there serves a plan that first
    /// differs from this one at that step ([`Self::first_difference`]).
    fn checkpoint_positions(&self, session: &ImportedSession, plan: &Plan) -> Vec<usize> {
        let mut positions: Vec<usize> = plan.keys().filter_map(|step| self.anchor(session, self.reach(step))).map(|p| p + 1).collect();
        positions.sort_unstable();
        positions.dedup();
        positions
    }
}

/// The content hash of a replay's inputs: the compaction plan and the options.
fn replay_key(plan: &BTreeMap<Step, u64>, options: &ReplayOptions, incremental: bool) -> u128 {
    // `compaction_losses` is not serialized; a replay without them answers no other.
    let mut text = format!("{plan:?}\n{incremental}\n{}\n", options.compaction_losses);
    text.push_str(&serde_json::to_string(options).unwrap_or_default());
    xxhash_rust::xxh3::xxh3_128(text.as_bytes())
}

/// `options` without the compactions' losses judged.
fn counts_only(options: &ReplayOptions) -> ReplayOptions {
    ReplayOptions { compaction_losses: false, ..options.clone() }
}

/// One replay of `session` (the original edited by `plan`), from `memo` when it holds it.
/// `checkpointed` (with a memo): the replay of the session as recorded takes checkpoints, and a
/// replay of an edited session starts from the last one before its first edit.
fn replay_planned(
    session: &ImportedSession,
    plan: &BTreeMap<Step, u64>,
    measurer: &mut Measurer,
    options: &ReplayOptions,
    incremental: bool,
    memo: Option<&ReplayMemo>,
    checkpointed: bool,
    index: Option<&PlanIndex<'_>>,
) -> Arc<SessionReplay> {
    let Some(memo) = memo else {
        measurer.reset();
        return Arc::new(replay_session_plain(session, measurer, options, incremental));
    };
    let checkpointed = checkpointed && memo.use_checkpoints && checkpoints_apply(options);
    let key = replay_key(plan, options, incremental);
    // A replay of an edited session judging no compaction keeps the compactions it went through.
    let kept = |(replay, seen): (SessionReplay, CompactionsSeen)| {
        if !options.compaction_losses && !plan.is_empty() {
            memo.keep_seen(key, seen);
        }
        Arc::new(replay)
    };
    let run = || {
        // The compactions' losses judged: the same replay judging none (the plan search's last),
        // when made, with its compactions judged. The options differ in nothing else.
        if options.compaction_losses
            && let Some((unjudged, seen)) = memo.unjudged(replay_key(plan, &counts_only(options), incremental))
        {
            memo.judged_only.fetch_add(1, Ordering::Relaxed);
            return Arc::new(SessionReplay { compaction_losses: seen.judge(session), ..SessionReplay::clone(&unjudged) });
        }
        measurer.reset();
        if !checkpointed {
            return kept(replay_session_plain_seen(session, measurer, options, incremental));
        }
        // Checkpoints serve a replay whether or not it judges the compactions' losses.
        let original = replay_key(&BTreeMap::new(), &counts_only(options), incremental);
        if plan.is_empty() {
            let (replay, at) = replay_session_checkpointed(session, measurer, options, incremental, &mut []);
            let replay = Arc::new(replay);
            memo.keep_checkpoints(original, ReplayCheckpoints::new(at, replay.clone()));
            return replay;
        }
        // The latest checkpoint before the session differs from one replayed: the session as
        // recorded, or (in a plan search) the last plans replayed.
        // (checkpoints, first edited event, position of the checkpoint, from another plan's)
        let mut best: Option<(Arc<ReplayCheckpoints>, usize, usize, bool)> = None;
        let mut consider = |checkpoints: Arc<ReplayCheckpoints>, first: usize, planned: bool| {
            let position = checkpoints.before(first).map(ReplayCheckpoint::position);
            if let Some(position) = position
                && best.as_ref().is_none_or(|&(_, _, p, _)| position > p)
            {
                best = Some((checkpoints, first, position, planned));
            }
        };
        if let Some(checkpoints) = memo.checkpoints_of(original)
            && let Some(first) = session.first_edited_event()
        {
            consider(checkpoints, first, false);
        }
        if let Some(index) = index {
            for (other, checkpoints) in memo.planned_of(original) {
                if let Some(first) = index.first_difference(session, plan, &other) {
                    consider(checkpoints, first, true);
                }
            }
        }
        // Checkpoints before each edit of this plan: the next plan's first change is usually
        // one of them moved.
        let positions = index.map(|index| index.checkpoint_positions(session, plan)).unwrap_or_default();
        let (replay, seen, at) = match &best {
            Some((checkpoints, first, position, planned)) => {
                memo.calls_skipped.fetch_add(*position, Ordering::Relaxed);
                memo.from_planned.fetch_add(usize::from(*planned), Ordering::Relaxed);
                let at = checkpoints.before(*first).expect("found above");
                replay_session_from_checkpointed(session, measurer, options, incremental, checkpoints, at, &positions)
            }
            None => replay_session_plain_checkpointed(session, measurer, options, incremental, &positions),
        };
        let replay = kept((replay, seen));
        if index.is_some() {
            memo.keep_planned(original, plan, ReplayCheckpoints::new(at, replay.clone()));
        }
        replay
    };
    memo.get_or_replay(key, run)
}

/// A replay of `session` as it is under `options` (no what-if), through `memo`.
pub fn replay_memoized(session: &ImportedSession, measurer: &mut Measurer, options: &ReplayOptions, incremental: bool, memo: &ReplayMemo) -> SessionReplay {
    SessionReplay::clone(&replay_planned(session, &BTreeMap::new(), measurer, options, incremental, Some(memo), false, None))
}

/// The options the plan is searched under: the counts the plan reads (recorded usage, the
/// simulated context of a call) do not depend on the main lane's TTL, so every TTL set shares
/// one search (under 5m, `claude-code`'s); the what-if itself is what the search decides. With
/// the recorded TTLs (`ttl_main: None`, the audit's) the search runs under them: its first
/// replay is the session as recorded (the audit's baseline, [`ReplayMemo::record_replay`]) and
/// its last the what-if's own.
fn planning_options(options: &ReplayOptions) -> ReplayOptions {
    ReplayOptions { ttl_main: options.ttl_main.map(|_| crate::api::CacheTtl::FiveMinutes), autocompact: None, ..options.clone() }
}

/// Replays `original` with its compactions where `config` puts them. Each replay starts from a
/// reset `measurer` ([`Measurer::reset`]): the session is measured as by a new measurer.
/// `memo` shares replays between calls on the same session.
pub fn replay_with_autocompact(
    original: &ImportedSession,
    measurer: &mut Measurer,
    options: &ReplayOptions,
    config: &AutocompactConfig,
    incremental: bool,
    memo: Option<&ReplayMemo>,
) -> (SessionReplay, CompactionWhatIf) {
    let table = measurer.table().clone();
    let final_options = ReplayOptions { autocompact: None, ..options.clone() };
    let mut plan_options = planning_options(options);
    // The plan reads counts, not the compactions' information loss: its replays skip judging
    // it (the final replay, under the options asked for, starts from their checkpoints).
    plan_options.compaction_losses = false;
    // Original event index of each main reply, by message id.
    let event_of: BTreeMap<String, usize> =
        original.calls.iter().filter_map(|c| c.message_id.clone().map(|id| (id, c.event_index))).collect();
    let main_position: BTreeMap<usize, usize> = original
        .calls
        .iter()
        .filter(|c| c.lane == crate::recording::format::LANE_MAIN && !c.is_synthetic)
        .enumerate()
        .map(|(pos, c)| (c.event_index, pos))
        .collect();
    let index = PlanIndex::new(original, &event_of);

    // The recording's compactions, by the main reply that follows each: (boundary event,
    // trigger, preTokens).
    let mut recorded_boundaries: BTreeMap<String, (usize, String, Option<u64>)> = BTreeMap::new();
    let mut last_boundary: Option<(usize, String, Option<u64>)> = None;
    for (i, event) in original.recording.events.iter().enumerate() {
        if event.lane != crate::recording::format::LANE_MAIN {
            continue;
        }
        match &event.kind {
            EventKind::Compaction(c) => last_boundary = Some((i, c.trigger.clone(), c.pre_tokens)),
            EventKind::ModelReply(reply) => {
                if let (Some(boundary), Some(id)) = (last_boundary.take(), &reply.message_id) {
                    recorded_boundaries.insert(id.clone(), boundary);
                }
            }
            _ => {}
        }
    }
    let mut plan: BTreeMap<Step, u64> = BTreeMap::new();
    let mut iterations = 0;
    let mut converged = false;
    let mut threshold;
    let mut session_store: Option<ImportedSession> = None;
    loop {
        iterations += 1;
        let session = session_store.as_ref().unwrap_or(original);
        let replay = replay_planned(session, &plan, measurer, &plan_options, incremental, memo, true, Some(&index));
        let replay = replay.as_ref();
        let (.., thresholds) = client_thresholds(session, replay, &table, config);
        threshold = thresholds.autocompact;
        // Where the session first differs from the recording, in replay call indices.
        let first_edit_event = plan.keys().map(|step| match step {
            Step::Insert(id) => event_of.get(id).copied().unwrap_or(usize::MAX),
            Step::Remove(boundary) => *boundary,
        }).min();
        let original_event = |message_id: Option<&String>| message_id.and_then(|id| event_of.get(id)).copied();
        let diverged_from = first_edit_event.and_then(|first| {
            replay
                .calls
                .iter()
                .find(|c| c.lane == crate::recording::format::LANE_MAIN && original_event(session.calls[c.index].message_id.as_ref()).is_some_and(|e| e >= first))
                .map(|c| c.index)
        });
        let (_, points) = main_points(session, replay, diverged_from);
        let diverged_at = |p: &super::triggers::MainPoint| diverged_from.is_some_and(|at| replay.calls[p.call].index > at);
        let mut next: BTreeMap<Step, u64> = BTreeMap::new();
        // What this pass changed relative to `session`, added to its later counts.
        let mut offset: i64 = 0;
        for point in points.iter().skip(1) {
            let count = (point.count as i64 + offset).max(0) as u64;
            let context = |p: &super::triggers::MainPoint| {
                let call = &replay.calls[p.call];
                if diverged_at(p) || diverged_from.is_some_and(|at| call.index >= at) { call.simulated_context() } else { call.recorded_context() }
            };
            let call = &replay.calls[point.call];
            // A session that starts mid-conversation carries its older history in the call's
            // user context; a compaction leaves only the user context itself.
            let user_context = if replay.head_truncated { replay.user_context_after_compaction } else { call.user_context_tokens };
            let after_compaction = call.prefix_tokens + user_context + (SUMMARY_CHARS / 4) as u64 + RESTORE_TOKENS_ESTIMATE;
            // A compaction the recording holds before this call, whether or not the session
            // as it stands still holds it.
            let recorded = point.message_id.as_ref().and_then(|id| recorded_boundaries.get(id));
            if let Some(&(boundary_event, ref trigger, pre_tokens)) = recorded {
                let present = point.compaction.is_some();
                // A recorded boundary shows what the client counted there.
                let counted = if !diverged_at(point) { count.max(pre_tokens.unwrap_or(0)) } else { count };
                let keep = if trigger == "auto" { thresholds.above_autocompact(counted) } else { !config.compact_disabled };
                if keep {
                    offset = if present { 0 } else { after_compaction as i64 - point.count as i64 };
                } else {
                    next.insert(Step::Remove(boundary_event), counted);
                    if present {
                        // The history stays: later counts grow from where this one was.
                        offset = counted as i64 - context(point) as i64;
                    }
                }
                continue;
            }
            if point.compaction.is_some() {
                // One this plan inserted earlier.
                if thresholds.above_autocompact(count)
                    && let Some(id) = &point.message_id
                {
                    next.insert(Step::Insert(id.clone()), count);
                    offset = 0;
                } else {
                    offset = count as i64 - context(point) as i64;
                }
                continue;
            }
            if thresholds.above_autocompact(count)
                && let Some(id) = &point.message_id
            {
                next.insert(Step::Insert(id.clone()), count);
                offset = after_compaction as i64 - point.count as i64;
            }
        }
        if next == plan {
            converged = true;
            break;
        }
        plan = next;
        if iterations >= MAX_ITERATIONS {
            break;
        }
        session_store = Some(original.with_compaction_edits(&edits(original, &plan, &event_of)));
    }
    // The plan's session under the options asked for (the same replay as the last search step
    // when the TTL is the recorded one).
    let edited;
    let session = if plan.is_empty() {
        original
    } else {
        if !converged || session_store.is_none() {
            session_store = Some(original.with_compaction_edits(&edits(original, &plan, &event_of)));
        }
        edited = session_store.take().expect("set above");
        &edited
    };
    let mut replay = SessionReplay::clone(&replay_planned(session, &plan, measurer, &final_options, incremental, memo, true, Some(&index)));
    if !converged {
        iterations += 1;
    }

    let mut changes: Vec<CompactionChange> = plan
        .iter()
        .filter_map(|(step, &pre_tokens)| {
            let (event, change) = match step {
                Step::Insert(id) => (*event_of.get(id)?, "inserted"),
                Step::Remove(boundary) => {
                    let next_reply = original.calls.iter().find(|c| c.lane == "main" && c.event_index > *boundary)?;
                    (next_reply.event_index, "removed")
                }
            };
            Some(CompactionChange { call: *main_position.get(&event)?, change: change.to_owned(), pre_tokens })
        })
        .collect();
    changes.sort_by_key(|c| c.call);
    if let Some(first) = changes.first() {
        let call_index = original.calls.iter().filter(|c| c.lane == "main" && !c.is_synthetic).nth(first.call).map_or(0, |c| c.index);
        let why = match first.change.as_str() {
            "inserted" => format!("the setting compacts before main call {} ({} ≥ {threshold}), where the recording did not", first.call, first.pre_tokens),
            _ => format!("the recording compacted before main call {} ({} counted), the setting does not (threshold {threshold})", first.call, first.pre_tokens),
        };
        if replay.first_divergence.as_ref().is_none_or(|(at, _)| *at > call_index) {
            replay.first_divergence = Some((call_index, why));
        }
    }
    (replay, CompactionWhatIf { threshold, changes, iterations, converged })
}

fn edits(original: &ImportedSession, plan: &BTreeMap<Step, u64>, event_of: &BTreeMap<String, usize>) -> Vec<CompactionEdit> {
    let model = original.calls.iter().find(|c| c.lane == "main" && !c.is_synthetic).map(|c| c.model.clone()).unwrap_or_default();
    plan.iter()
        .filter_map(|(step, &pre_tokens)| match step {
            Step::Insert(id) => Some(CompactionEdit::Insert {
                before: *event_of.get(id)?,
                pre_tokens,
                summary: summary_stand_in(pre_tokens),
                summary_output_tokens: (SUMMARY_CHARS / 4) as u64,
                model: model.clone(),
            }),
            Step::Remove(boundary) => Some(CompactionEdit::Remove { boundary: *boundary }),
        })
        .collect()
}

/// A summary of [`SUMMARY_CHARS`] characters: numbered sections of plain words, the same for
/// the same count, so a replay with it is deterministic and tokenizes like prose. Memoized per
/// thread by count: the plan search asks for the same compactions' summaries plan after plan.
pub fn summary_stand_in(pre_tokens: u64) -> String {
    thread_local! {
        static MEMO: std::cell::RefCell<std::collections::HashMap<u64, String>> = std::cell::RefCell::new(std::collections::HashMap::new());
    }
    MEMO.with(|memo| {
        let mut memo = memo.borrow_mut();
        if memo.len() >= 4096 {
            memo.clear();
        }
        memo.entry(pre_tokens).or_insert_with(|| build_summary_stand_in(pre_tokens)).clone()
    })
}

fn build_summary_stand_in(pre_tokens: u64) -> String {
    const WORDS: [&str; 16] = [
        "the", "request", "changed", "files", "tests", "error", "fixed", "module", "next", "step", "remains", "pending", "review",
        "function", "config", "output",
    ];
    let mut text = format!("Summary of {pre_tokens} tokens of earlier work.\n");
    let mut section = 0;
    let mut k = pre_tokens as usize;
    while text.len() < SUMMARY_CHARS {
        if text.len() / 1200 >= section {
            section += 1;
            text.push_str(&format!("\n{section}. Section {section}:\n"));
        }
        k = k.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        text.push_str(WORDS[k >> 60]);
        text.push(' ');
    }
    text.truncate(SUMMARY_CHARS);
    text
}
