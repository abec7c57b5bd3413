//! A what-if on a real session through the agent (`compare`, `sweep`, `check`: the default engine): the
//! session drives the agent as a workload ([`super::workload`]) and the agent runs under the
//! strategy asked for, so every knob applies the way it applies to a scenario.
//!
//! What the recording gives and where it stops standing for the run:
//! - **Usage.** Each reply carries the usage the API returned to the recorded client, so the
//!   agent counts its context (and decides its compactions) from what the client counted — up to
//!   the first *divergence*: the first main call before which the agent rewrote its conversation
//!   where the recording did not (a compaction at a call the recording did not compact before, a
//!   microcompact, snip, collapse, tool result budget, peer rewrite, or a server-side context
//!   edit the strategy asked for and the client did not), or did not compact where the recording
//!   did. A stage that fired but removed nothing is no divergence. From that call on the recorded
//!   usage describes another conversation, so the agent counts from the simulated usage of what
//!   it sent.
//! - **Summaries.** A compaction of the agent at the call of a recorded one (±1 call) takes the
//!   recorded summary; any other takes a deterministic stand-in of the fitted summary length
//!   ([`SUMMARY_CHARS`]: the lower middle value of the 12 automatic compaction
//!   summaries of ../shared/realdata). A recorded compaction before the first call driven is the
//!   history the file continues from: the agent has nothing to compact there.
//! - **Replies.** After a divergence the remaining recorded replies continue (the same work is
//!   assumed to happen); the outcome says from which call and why.
//! - **Cache before the session.** Where the first recorded call read a prefix an earlier
//!   session had cached, each run starts with the prefix the recorded client sent (the agent's
//!   under the recorded version's defaults) in the cache ([`super::workload::WarmPrefix`]), as
//!   `fidelity --engine agent` does: a strategy that changes the prefix reads what it still shares.
//! - **The client's turn rules.** Every run applies the recorded client's rules around the
//!   agent's main requests ([`super::turns::RecordedClient`]: the post-turn side entry, prompts
//!   and the conversation start rendered as the recorded version rendered them), as
//!   `fidelity --engine agent` does, so the run as recorded is fidelity's run and every what-if
//!   is measured against the client fidelity validated. Each request reads the turn of the
//!   recorded call whose reply it consumes, also after a divergence.
//!
//! The run is planned by running: the first run follows the recording; when it diverges, the
//! plan (usage up to the divergence, the summary each compaction takes) is corrected and the
//! session run again, until the plan holds ([`MAX_RUNS`] at most). One run makes that search's
//! result where it can ([`Follow`]): it switches plans as it goes (the replies carry no recorded
//! usage from the first call where it parts from the recording, each compaction takes the reply
//! the search would give it) and is kept where the search's own check says it is a fixed point
//! of the plan, which is the one the search settles on; elsewhere the search runs as before.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::api::{Message, SharedValue};
use crate::measure::loss::InfoLoss;
use crate::measure::{Measurer, MeasurerState, RequestMetrics};
use crate::recording::format::LANE_MAIN;
use crate::recording::{EventKind, ImportedSession};
use crate::runner::{RunOptions, RunState, StopRule};
use crate::scenario::Scenario;
use crate::strategy::Strategy;

use super::loss::{CompactionLoss, Judgement, compaction_loss};
use super::workload::{Sizing, Workload, sized_workload_for_runs};

/// Runs of one session under one strategy at most, while the plan settles.
pub const MAX_RUNS: usize = 4;

/// Stages that rewrite what the model saw without a compaction.
const REWRITE_STAGES: [&str; 12] = [
    "tool_result_budget", "snip", "microcompact", "context_collapse", "observation_masking", "opencode_prune", "opencode_summary", "codex_compact",
    "cline_truncate", "server_compaction", "context_editing", "blocking_limit",
];

/// A session prepared once for every strategy: its workload (sized under the default strategy,
/// so that a knob that changes the agent's own prefix shows instead of being filled away) and
/// the recorded compactions.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub workload: Workload,
    pub sizing: Sizing,
    /// Recorded compactions of the main lane, in order: the call after each, its trigger, and its
    /// summary as a `compact`-lane step when recorded.
    pub recorded: Vec<RecordedCompaction>,
    /// The recorded version's autocompact output reserve.
    pub reserve: u64,
    /// The recorded TTLs, applied where a strategy keeps the default ones.
    pub settings: super::workload::RecordedSettings,
    /// The prefix an earlier session left cached, as the recorded client sent it (the agent's
    /// prefix under the recorded version's defaults, whatever strategy a run is under): seeded
    /// before every run, as `fidelity --engine agent` seeds it.
    pub warm: Option<super::workload::WarmPrefix>,
    /// The recorded client's turn rules before the first call, a copy of which every run owns
    /// (as [`super::workload::agent_replay`] applies them).
    pub client: super::turns::RecordedClient,
    /// The workload's env (`world.env`), which every run applies over its strategy.
    env: BTreeMap<String, String>,
    /// A scripted reply of the workload (any lane) calls ToolSearch without a scripted output
    /// for the call: the agent runs the search, which loads tools where tool search is on.
    tool_search_run: bool,
    /// The API's lookback rule when the session ran, every run's (as
    /// [`super::workload::agent_replay`] measures).
    pub lookback: crate::measure::LookbackRule,
    /// What the outcomes hold of the information loss: all of it, or, where the caller reads
    /// no more (the audit), only the compaction losses' counts
    /// ([`AgentOutcome::compaction_losses`]) and the runs' drops (their `info_loss` counts no
    /// recall misses nor re-reads: [`crate::measure::loss::LossTracker::drops_only`]).
    pub losses: Judgement,
    /// The scenario of the first plan and its script as built, made by the first family that
    /// runs and shared by every other (each family's trunk runs it): the workload's document
    /// copied, planned and parsed once per session instead of once per family. Emptied by
    /// [`Self::set_env`], the one change of the workload after `prepare`.
    first: std::sync::OnceLock<PlannedScenario>,
}

/// A plan's scenario and its scripted model and tool outputs as built, shared by the runs
/// that go by it.
type PlannedScenario = (std::sync::Arc<Scenario>, std::sync::Arc<crate::scenario::BuiltScript>);

impl Prepared {
    /// What of the workload's world decides the agent's thresholds, as its runs see it.
    pub fn threshold_world(&self) -> crate::agent::session::ThresholdWorld<'_> {
        let world = &self.workload.scenario.world;
        crate::agent::session::ThresholdWorld { model_id: &world.model, context_window: world.context_window, max_output_tokens: world.max_output_tokens, env: &self.env }
    }

    /// Sets the workload's env (`world.env`, in the document the runs are planned from and in its
    /// scenario): what a user's environment would be for every run of the session.
    pub fn set_env(&mut self, env: BTreeMap<String, String>, file: &str) -> Result<(), String> {
        self.workload.document["world"]["env"] = serde_json::to_value(&env).expect("a map serializes");
        let parsed = crate::scenario::parse_scenario_document(&self.workload.document, file).map_err(|e| e.to_string())?;
        if self.workload.document.get("script").is_some() {
            self.workload.scenario = parsed;
        } else {
            // A document without its script (`sized_workload_for_runs`): its world, env and all.
            self.workload.scenario.world = parsed.world;
        }
        self.env = env_of(&self.workload.scenario);
        self.first = std::sync::OnceLock::new();
        Ok(())
    }
}

/// A scenario's env as the runtime world holds it.
fn env_of(scenario: &Scenario) -> BTreeMap<String, String> {
    scenario.world.env.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect()
}

/// One recorded compaction of the main lane.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedCompaction {
    /// [`crate::recording::RecordedCall::index`] of the first main call driven after it.
    pub call: usize,
    pub trigger: String,
    /// Its summary as a `compact`-lane step. Shared: every plan and every reading of a run
    /// holds the summaries it takes (8–21 K characters each), and compares them.
    pub summary: Option<SharedValue>,
}

/// Prepares `session` (read from `file`) for agent what-ifs.
pub fn prepare(session: &ImportedSession, file: &str, measurer: &Measurer) -> Result<Prepared, String> {
    let version = super::sizing::main_version(session);
    let reserve = super::ClientProfile::for_version(&version).autocompact_output_reserve;
    let mut sizing_strategy = Strategy::default();
    sizing_strategy.compact.autocompact.max_output_reserve_tokens = Some(reserve);
    let (workload, mut sizing) = sized_workload_for_runs(session, file, measurer, &sizing_strategy, &super::ReplayOptions::default())?;
    // The recorded summaries, in the order the workload queued them.
    if let Some(script) = workload.document.get("script").and_then(Value::as_array) {
        debug_assert!(script.iter().filter(|s| is_compact_step(s)).eq(&workload.summary_steps), "the workload's summary steps are its script's");
    }
    let mut summaries = workload.summary_steps.iter().cloned().map(SharedValue::from);
    let driven: std::collections::BTreeSet<usize> = workload.main_calls.iter().copied().collect();
    let main_calls: Vec<(usize, usize)> = session.calls.iter().filter(|c| c.lane == LANE_MAIN && driven.contains(&c.index)).map(|c| (c.event_index, c.index)).collect();
    let mut recorded = Vec::new();
    for (event_index, event) in session.recording.events.iter().enumerate() {
        let EventKind::Compaction(compaction) = &event.kind else { continue };
        if event.lane != LANE_MAIN {
            continue;
        }
        let has_summary = compaction.summary.as_ref().is_some_and(|s| !s.is_empty());
        let summary = if has_summary { summaries.next() } else { None };
        // A compaction before the first call driven is the history the file continues from (the
        // workload's opening filler stands for it): the agent has nothing to compact there.
        let Some(position) = main_calls.iter().position(|(e, _)| *e > event_index) else { continue };
        if position == 0 {
            continue;
        }
        let call = main_calls[position].1;
        recorded.push(RecordedCompaction { call, trigger: compaction.trigger.clone(), summary });
    }
    let settings = super::workload::RecordedSettings::of(session, &workload);
    settings.apply(&mut sizing_strategy);
    let warm = super::workload::warm_prefix(session, &workload, measurer, &sizing_strategy)?;
    sizing.seeded_prefix_tokens = warm.as_ref().map_or(0, super::workload::WarmPrefix::tokens);
    let client = super::turns::RecordedClient::new(session, &workload.main_calls);
    let env = env_of(&workload.scenario);
    let lookback = crate::measure::LookbackRule::for_session_start(session.recording.header.start_epoch_ms);
    let tool_search_run = {
        use crate::scenario::Step;
        let scripted: std::collections::BTreeSet<&str> =
            workload.scenario.script.iter().filter_map(|step| if let Step::ToolOutput(outputs) = step { Some(outputs) } else { None }).flatten().map(|o| o.tool_use_id.as_str()).collect();
        workload.scenario.script.iter().any(|step| {
            matches!(step, Step::Assistant(reply) if reply.content.iter().any(|b| matches!(b, crate::api::ContentBlock::ToolUse { id, name, .. } if name == crate::agent::tools::TOOL_SEARCH && !scripted.contains(id.as_str()))))
        })
    };
    Ok(Prepared { workload, sizing, recorded, reserve, settings, warm, client, env, tool_search_run, lookback, losses: Judgement::Full, first: std::sync::OnceLock::new() })
}

fn is_compact_step(step: &Value) -> bool {
    step.get("lane").and_then(Value::as_str) == Some("compact")
}

/// The strategy a session runs under: `strategy` with the recorded version's autocompact reserve
/// where it sets none and the recorded TTLs where it keeps the default ones (as
/// [`super::workload::agent_replay`] does), named `""` so that two
/// strategies that differ only in name are one.
pub fn effective_strategy(strategy: &Strategy, prepared: &Prepared) -> Strategy {
    let mut strategy = strategy.clone();
    strategy.name = String::new();
    if strategy.compact.autocompact.max_output_reserve_tokens.is_none() {
        strategy.compact.autocompact.max_output_reserve_tokens = Some(prepared.reserve);
    }
    prepared.settings.apply(&mut strategy);
    super::workload::keep_recorded_results(&mut strategy);
    strategy
}

/// A content hash of the effective settings: two strategies with one key make one run. The
/// autocompact knobs that only move the thresholds (`buffer_tokens`, the PCT override, the
/// window cap) enter as the thresholds they give for this session's world (its window and env,
/// [`Prepared::threshold_world`]), so a buffer and an override that put the threshold at the same
/// count share a run; the rest enters as the run applies it (the workload's env over it).
pub fn strategy_key(effective: &Strategy, prepared: &Prepared) -> String {
    let world = prepared.threshold_world();
    let thresholds = world.thresholds(effective);
    let mut normal = world.strategy(effective);
    // A strategy the runner refuses keeps its own key.
    if !world.refuses(effective) {
        let defaults = crate::agent::compact::config::AutocompactConfig::default();
        normal.compact.autocompact.buffer_tokens = defaults.buffer_tokens;
        normal.compact.autocompact.pct_override = defaults.pct_override;
        normal.compact.autocompact.window_override = defaults.window_override;
    }
    normal.content_key(&format!("{thresholds:?}"))
}

/// `effective` with the knobs that have nothing to act on in this session set as the run as
/// recorded has them, so that [`strategy_key`] gives a strategy that differs from another only
/// there the other's run: `replay_recorded_microcompact` where the recording holds no
/// microcompact (leaving out none changes no step of the plan). A strategy's own settings, for
/// what a report says of them, are its [`strategy_key`] of `effective` itself. `effective`
/// itself, borrowed, where no knob is cleared (its key is then `effective`'s).
pub fn idle_knobs_cleared<'s>(effective: &'s Strategy, prepared: &Prepared) -> std::borrow::Cow<'s, Strategy> {
    let cleared = Strategy::default().replay_recorded_microcompact;
    if !effective.replay_recorded_microcompact && effective.replay_recorded_microcompact != cleared && microcompact_calls(prepared).is_empty() {
        let mut strategy = effective.clone();
        strategy.replay_recorded_microcompact = cleared;
        return std::borrow::Cow::Owned(strategy);
    }
    std::borrow::Cow::Borrowed(effective)
}

/// The thresholds `effective` gives a run of this session: the agent's own computation
/// ([`crate::agent::session::ThresholdWorld::thresholds`]), the workload's env applied.
pub fn thresholds_of(effective: &Strategy, prepared: &Prepared) -> crate::agent::compact::counting::Thresholds {
    prepared.threshold_world().thresholds(effective)
}

/// One compaction of the agent's run.
#[derive(Debug, Clone, PartialEq)]
pub struct Compacted {
    /// The recorded call whose request followed it.
    pub call: usize,
    pub stage: String,
    pub tokens_before: u64,
    /// Whether it took the recorded summary (else the stand-in, or none for session memory).
    pub recorded_summary: bool,
}

/// What a session gave under one strategy through the agent.
#[derive(Debug, Clone)]
pub struct AgentOutcome {
    /// Every request the agent made (main, compact and other lanes), in order.
    pub rows: Vec<RequestMetrics>,
    pub summary: crate::measure::Summary,
    pub info_loss: InfoLoss,
    pub compactions: Vec<Compacted>,
    /// The first main call from which the agent's conversation is no longer the recorded one,
    /// and why.
    pub divergence: Option<(usize, String)>,
    /// Judged as [`Prepared::losses`] says.
    pub compaction_losses: Vec<CompactionLoss>,
    /// Runs it took to settle the plan: 1 where the run that follows the recording settled it
    /// ([`Follow`]), else the plan search's runs (the run that did not settle it not counted).
    pub runs: usize,
    /// Where a stop rule ended the run ([`agent_whatif_family`]'s `stop`): the last recorded
    /// call it answered, and the count past its bound. The rows, summary and losses are those
    /// up to there.
    pub stopped: Option<(usize, crate::runner::Stopped)>,
}

/// How one run uses the recording.
#[derive(Debug, Clone, PartialEq, Default)]
struct Plan {
    /// Replies of recorded calls from this one on carry no recorded usage.
    usage_before: Option<usize>,
    /// The `compact`-lane replies, in the order the agent's compactions take them.
    lane: Vec<SharedValue>,
    /// The recorded microcompacts are left out (`replay_recorded_microcompact = false`): the
    /// results they cleared stay in view.
    without_recorded_microcompacts: bool,
}

/// Characters of a stand-in summary: the lower middle value of the 12 automatic compaction summaries in
/// ../shared/realdata (8,462–21,205 characters; fitted on all 16 sessions, no dependence on
/// preTokens visible in them).
pub const SUMMARY_CHARS: usize = 13_647;

/// The stand-in summary of a compaction the recording did not make.
fn stand_in() -> SharedValue {
    // The same value every time: made once.
    static STAND_IN: std::sync::OnceLock<SharedValue> = std::sync::OnceLock::new();
    STAND_IN
        .get_or_init(|| {
            let text = format!("<summary>\n{}\n</summary>", crate::agent::compact::generator::filler("summary", SUMMARY_CHARS));
            json!({ "assistant": [{ "text": text }], "lane": "compact" }).into()
        })
        .clone()
}

/// The workload's scenario under `plan`, from its document: what [`planned_scenario`] makes
/// faster (checked against this in debug builds).
#[cfg_attr(not(debug_assertions), allow(dead_code))]
fn planned(prepared: &Prepared, file: &str, plan: &Plan) -> Result<crate::scenario::Scenario, String> {
    let mut document = prepared.workload.document.clone();
    let steps = document["script"].as_array_mut().ok_or("the workload has no script")?;
    steps.retain(|s| !is_compact_step(s) && !(plan.without_recorded_microcompacts && s.get("microcompact").is_some()));
    if let Some(from) = plan.usage_before {
        let mut main = 0usize;
        for step in steps.iter_mut() {
            let Some(object) = step.as_object_mut() else { continue };
            if !object.contains_key("assistant") || object.contains_key("lane") {
                continue;
            }
            let call = prepared.workload.main_calls.get(main).copied().unwrap_or(usize::MAX);
            main += 1;
            if call >= from
                && let Some(usage) = object.remove("usage")
            {
                object.insert("output_tokens".into(), usage.get("output_tokens").cloned().unwrap_or(json!(0)));
            }
        }
    }
    steps.extend(plan.lane.iter().map(|step| Value::clone(step)));
    crate::scenario::parse_scenario_document(&document, file).map_err(|e| e.to_string())
}

/// [`planned`] made from the workload's parsed scenario instead of parsing its document again
/// (a plan's scenario differs from it only in the steps [`planned`] edits): the compaction
/// replies and, as `plan` says, the recorded microcompacts left out, the recorded usage of the
/// main replies from `plan.usage_before` on taken away (their output tokens kept), and the
/// plan's `compact`-lane replies parsed on their own and put at the end. Debug builds check it
/// equals [`planned`].
fn planned_scenario(prepared: &Prepared, file: &str, plan: &Plan) -> Result<Scenario, String> {
    use crate::scenario::Step;
    let base = &prepared.workload.scenario;
    let mut script = Vec::with_capacity(base.script.len() + plan.lane.len());
    let mut main = 0usize;
    for step in &base.script {
        match step {
            Step::Assistant(reply) if reply.lane == "compact" => continue,
            Step::Microcompact { .. } if plan.without_recorded_microcompacts => continue,
            Step::Assistant(reply) if reply.lane == LANE_MAIN => {
                let call = prepared.workload.main_calls.get(main).copied().unwrap_or(usize::MAX);
                main += 1;
                if plan.usage_before.is_some_and(|from| call >= from)
                    && let Some(usage) = &reply.usage
                {
                    let mut reply = reply.clone();
                    reply.output_tokens = usage.output_tokens;
                    reply.usage = None;
                    script.push(Step::Assistant(reply));
                    continue;
                }
            }
            _ => {}
        }
        script.push(step.clone());
    }
    if !plan.lane.is_empty() {
        // The replies checked as the steps of a script in the workload's world (text only: no
        // tool use whose id their position would decide).
        let mut document: serde_json::Map<String, Value> =
            prepared.workload.document.as_object().into_iter().flatten().filter(|(key, _)| *key != "script").map(|(key, value)| (key.clone(), value.clone())).collect();
        document.insert("script".to_owned(), plan.lane.iter().map(|step| Value::clone(step)).collect());
        let document = Value::Object(document);
        let lane = crate::scenario::parse_scenario_document(&document, file).map_err(|e| e.to_string())?;
        script.extend(lane.script);
    }
    let scenario = Scenario {
        file: file.to_owned(),
        name: base.name.clone(),
        description: base.description.clone(),
        world: base.world.clone(),
        script,
        expect: base.expect.clone(),
    };
    debug_assert_eq!(Ok(&scenario), planned(prepared, file, plan).as_ref());
    Ok(scenario)
}

/// One run's raw results.
struct Run {
    output: crate::runner::RunOutput,
    /// Per main row paired with a recorded call: (row position in `output.rows`, call index).
    paired: Vec<(usize, usize)>,
    /// The first main request after each compaction: (call index, its messages).
    after: BTreeMap<usize, Vec<Message>>,
}

/// The rest of `run`'s steps under `strategy`, and what the run gave.
fn finish_run(prepared: &Prepared, run: RunState<'_>, scenario: &Scenario, measurer: &mut Measurer, strategy: &Strategy) -> Result<Run, String> {
    finish_following(prepared, run, scenario, measurer, strategy).map(|(run, _)| run)
}

/// [`finish_run`], with the [`Follow`] the run went by (if it went by one) as the run left it.
fn finish_following(prepared: &Prepared, mut run: RunState<'_>, scenario: &Scenario, measurer: &mut Measurer, strategy: &Strategy) -> Result<(Run, Option<Follow>), String> {
    let chain = crate::agent::compact::chain::Chain::new();
    while !run.done(scenario) {
        run.step(scenario, measurer, strategy, &chain).map_err(|e| e.to_string())?;
    }
    let follow = run.take_reply_plan().and_then(|plan| (plan as Box<dyn std::any::Any>).downcast::<Follow>().ok()).map(|mut follow| {
        follow.end(&run.world().model);
        *follow
    });
    let compacted = run.take_compacted_requests();
    Ok((read_output(prepared, compacted, run.finish(scenario, measurer, strategy)), follow))
}

/// A finished run's output with its main rows paired with the recorded calls.
fn read_output(prepared: &Prepared, compacted: Vec<(usize, Vec<Message>)>, output: crate::runner::RunOutput) -> Run {
    let main_rows = output.rows.iter().enumerate().filter(|(_, r)| r.lane == LANE_MAIN && r.error.is_none()).map(|(i, _)| i);
    let paired: Vec<(usize, usize)> = main_rows.zip(prepared.workload.main_calls.iter().copied()).collect();
    let call_of: BTreeMap<usize, usize> = paired.iter().copied().collect();
    let after = compacted.into_iter().filter_map(|(row, messages)| call_of.get(&row).map(|call| (*call, messages))).collect();
    Run { output, paired, after }
}

/// Resets `measurer` as for a new run: the counts of earlier runs kept, its cache holding what
/// an earlier session left there (the warm first-call prefix).
fn fresh_measurer(prepared: &Prepared, measurer: &mut Measurer) -> Result<(), String> {
    measurer.set_lookback_rule(prepared.lookback);
    measurer.reset();
    measurer.set_billing_key(super::workload::REAL_SESSION_BILLING);
    measurer.set_prior_thinking_dropped(true);
    if let Some(warm) = &prepared.warm {
        warm.seed(measurer)?;
    }
    Ok(())
}

/// The options of every run: information loss tracked (only its drops where the outcomes
/// hold only counts, [`Prepared::losses`]), the recorded client's rules applied.
fn run_options(prepared: &Prepared) -> RunOptions<'static> {
    RunOptions { info_loss: true, drops_only: prepared.losses == Judgement::Counts, client: Some(Box::new(prepared.client.clone())), ..Default::default() }
}

/// A run under `plan` from the first call, ended early where `stop` holds.
fn run_once(scenarios: &mut Scenarios<'_>, measurer: &mut Measurer, strategy: &Strategy, plan: &Plan, stop: Option<StopRule>) -> Result<Run, String> {
    let prepared = scenarios.prepared;
    let index = scenarios.get(plan)?;
    let (scenario, model) = (scenarios.list[index].1.clone(), &scenarios.list[index].2);
    let options = run_options(prepared);
    // Each run is measured as by a new measurer (the counts of earlier runs kept), whose cache
    // holds what an earlier session left there.
    fresh_measurer(prepared, measurer)?;
    let mut run = RunState::start_with(&scenario, model, strategy, options).map_err(|e| e.to_string())?;
    run.keep_compacted_requests();
    if let Some(rule) = stop {
        run.stop_when(rule);
    }
    finish_run(prepared, run, &scenario, measurer, strategy)
}

/// A strategy's runs from the first call (no checkpoints), each ended early where `stop` holds
/// ([`agent_whatif_family_until`]).
struct Alone<'a> {
    scenarios: Scenarios<'a>,
    measurer: &'a mut Measurer,
    effective: &'a Strategy,
    stop: Option<StopRule>,
}

impl Runs for Alone<'_> {
    fn run(&mut self, plan: &Plan) -> Result<Run, String> {
        run_once(&mut self.scenarios, self.measurer, self.effective, plan, self.stop)
    }

    fn follow(&mut self) -> Result<Option<(Run, Follow)>, String> {
        let (prepared, strategy) = (self.scenarios.prepared, self.effective);
        let index = self.scenarios.get(&first_plan(prepared, strategy))?;
        let (scenario, model) = (self.scenarios.list[index].1.clone(), &self.scenarios.list[index].2);
        fresh_measurer(prepared, self.measurer)?;
        let mut run = RunState::start_with(&scenario, model, strategy, run_options(prepared)).map_err(|e| e.to_string())?;
        run.keep_compacted_requests();
        if let Some(rule) = self.stop {
            run.stop_when(rule);
        }
        let rules = std::rc::Rc::new(FollowRules::new(prepared, strategy, &run.world().model));
        run.set_reply_plan(Box::new(Follow::new(rules)));
        let (done, follow) = finish_following(prepared, run, &scenario, self.measurer, strategy)?;
        Ok(follow.map(|follow| (done, follow)))
    }
}

/// Drives the agent through `session` under `strategy` ([module docs](self)).
/// The measurer is given back with the lookback rule and the thinking setting it came with (the
/// runs set the session's own: a caller may go on with a replay or a scenario on it).
pub fn agent_whatif(session: &ImportedSession, file: &str, prepared: &Prepared, measurer: &mut Measurer, strategy: &Strategy) -> Result<AgentOutcome, String> {
    let (prior, lookback) = (measurer.prior_thinking_dropped(), measurer.lookback_rule());
    let effective = effective_strategy(strategy, prepared);
    let outcome = settle(session, prepared, &effective, None, &mut Alone { scenarios: Scenarios::new(prepared, file), measurer, effective: &effective, stop: None });
    measurer.set_prior_thinking_dropped(prior);
    measurer.set_lookback_rule(lookback);
    outcome
}

/// How a strategy's runs are made: from the first call ([`Alone`]) or going on from a family's
/// checkpoints ([`FromCheckpoints`]).
trait Runs {
    /// A run under `plan`.
    fn run(&mut self, plan: &Plan) -> Result<Run, String>;
    /// A run that follows the recording and switches plans as it goes ([`Follow`]), with the
    /// plan as the run left it.
    fn follow(&mut self) -> Result<Option<(Run, Follow)>, String>;
}

/// The plan search of one strategy ([module docs](self)). First one run that switches plans as
/// it goes ([`Follow`]): where it is a fixed point of the plan (the check [`settle_by_runs`]
/// makes), it is the run the search settles on, in one run; elsewhere the search runs plan by
/// plan as before. `first` is a run under the first plan already made (a family's trunk): where
/// that plan holds, it is the result.
fn settle(session: &ImportedSession, prepared: &Prepared, effective: &Strategy, first: Option<Run>, runs: &mut dyn Runs) -> Result<AgentOutcome, String> {
    let plan = first_plan(prepared, effective);
    let first = first.map(|done| {
        let read = read_run(prepared, &done, client_edits(effective), plan.without_recorded_microcompacts);
        (done, read)
    });
    settle_read(session, prepared, effective, first, runs)
}

/// [`settle`] with the run under the first plan read already.
fn settle_read(session: &ImportedSession, prepared: &Prepared, effective: &Strategy, first: Option<(Run, Reading)>, runs: &mut dyn Runs) -> Result<AgentOutcome, String> {
    let client_edits = client_edits(effective);
    let plan = first_plan(prepared, effective);
    let first = match first {
        Some((done, read)) if holds(&plan, &read) => {
            let (compactions, divergence, _) = read;
            return Ok(outcome(session, prepared, done, compactions, divergence, 1));
        }
        made => made,
    };
    if let Some((done, follow)) = runs.follow()? {
        let read = read_run(prepared, &done, client_edits, plan.without_recorded_microcompacts);
        if follow.holds(&read) {
            let (compactions, divergence, _) = read;
            let outcome = outcome(session, prepared, done, compactions, divergence, 1);
            // The fixed point is the one the search by runs settles on (the argument at
            // [`Follow`]): debug builds make that search and compare where it settled.
            #[cfg(debug_assertions)]
            if let Ok(searched) = settle_by_runs(session, prepared, effective, first, runs)
                && !searched.divergence.as_ref().is_some_and(|(_, why)| why.contains("(the plan of summaries had not settled"))
            {
                let strip = |o: &AgentOutcome| format!("{:?}", AgentOutcome { runs: 0, ..o.clone() });
                debug_assert_eq!(strip(&outcome), strip(&searched), "the run that followed the recording is the plan search's ({} runs)", searched.runs);
            }
            return Ok(outcome);
        }
    }
    settle_by_runs(session, prepared, effective, first, runs)
}

/// The server's context editing under the client's own settings (thinking of idle turns
/// cleared) is what the recorded client asked for too: its recorded usage counts it.
/// (Compared field by field: the config holds no float, and serializes every field as it is,
/// so equal fields are equal JSON values and back.)
fn client_edits(effective: &Strategy) -> bool {
    let client = crate::agent::compact::config::ContextEditingConfig::default();
    let same = effective.compact.context_editing == client;
    debug_assert_eq!(
        same,
        serde_json::to_value(&effective.compact.context_editing).ok() == serde_json::to_value(&Strategy::default().compact.context_editing).ok(),
        "the client's context editing, compared field by field and as JSON"
    );
    same
}

/// What [`read_run`] reads of a run.
type Reading = (Vec<Compacted>, Option<(usize, String)>, Vec<SharedValue>);

/// Whether a run under `plan` read as `read` holds it: the same divergence, and the
/// `compact`-lane replies its compactions should take those the plan gave them.
fn holds(plan: &Plan, read: &Reading) -> bool {
    let (_, divergence, lane) = read;
    let consumed = lane.len();
    divergence.as_ref().map(|(call, _)| *call) == plan.usage_before && plan.lane.len() >= consumed && plan.lane[..consumed] == lane[..]
}

/// The plan search by runs: runs (by `runs`) until the plan holds, from the first plan (whose
/// run `first` is when given, with its reading).
fn settle_by_runs(session: &ImportedSession, prepared: &Prepared, effective: &Strategy, first: Option<(Run, Reading)>, runs: &mut dyn Runs) -> Result<AgentOutcome, String> {
    let mut plan = first_plan(prepared, effective);
    let client_edits = client_edits(effective);
    let mut first = first;
    let mut count = 0;
    loop {
        let (done, read) = match first.take() {
            Some(made) => made,
            None => {
                let done = runs.run(&plan)?;
                let read = read_run(prepared, &done, client_edits, plan.without_recorded_microcompacts);
                (done, read)
            }
        };
        count += 1;
        let settled = holds(&plan, &read);
        let (compactions, divergence, lane) = read;
        if settled || count >= MAX_RUNS {
            let mut divergence = divergence;
            if !settled && let Some((_, why)) = &mut divergence {
                why.push_str(&format!(" (the plan of summaries had not settled after {MAX_RUNS} runs)"));
            }
            return Ok(outcome(session, prepared, done, compactions, divergence, count));
        }
        plan = Plan { usage_before: divergence.as_ref().map(|(call, _)| *call), lane, without_recorded_microcompacts: plan.without_recorded_microcompacts };
    }
}

/// The recorded compaction whose summary a compaction before the request of `call` takes, of
/// `recorded` (each its call and whether it has a summary) with those `used` taken: the first
/// within one call with a summary not taken yet; `None` is the stand-in. One rule for
/// [`read_run`] and [`Follow`].
fn matching_summary(recorded: impl Iterator<Item = (usize, bool)>, used: &[bool], call: usize) -> Option<usize> {
    recorded.zip(used).position(|((at, summary), used)| !used && summary && at.abs_diff(call) <= 1)
}

/// What a run that follows the recording goes by ([`Follow`]): where [`read_run`] finds a run
/// parts from the recording and which reply it gives each compaction, for one strategy.
#[derive(PartialEq)]
struct FollowRules {
    main_calls: Vec<usize>,
    /// Each recorded compaction: its call and, where it has one, its summary as a
    /// `compact`-lane step and as the reply the first plan's model holds for it.
    recorded: Vec<(usize, Option<(SharedValue, crate::world::Reply)>)>,
    /// The stand-in summary ([`stand_in`]) and its reply.
    stand_in: (SharedValue, crate::world::Reply),
    /// The call of the first recorded microcompact, where the strategy leaves them out.
    left_out: Option<usize>,
    client_edits: bool,
}

impl FollowRules {
    /// The rules of `effective` in `prepared`'s session; `model` is the first plan's as built
    /// (its `compact` lane holds the recorded summaries in order).
    fn new(prepared: &Prepared, effective: &Strategy, model: &crate::world::ScriptedModel) -> Self {
        let mut replies = model.scripted("compact").cloned();
        let recorded = prepared.recorded.iter().map(|r| (r.call, r.summary.clone().and_then(|step| replies.next().map(|reply| (step, reply))))).collect();
        let step = stand_in();
        let text = step["assistant"][0]["text"].as_str().unwrap_or_default().to_owned();
        let reply = crate::world::Reply::text(text);
        #[cfg(debug_assertions)]
        {
            let mut document = prepared.workload.document.clone();
            document["script"] = json!([step.clone()]);
            let parsed = crate::scenario::parse_scenario_document(&document, "stand-in").map(|s| s.scripted_model());
            debug_assert_eq!(parsed.ok().and_then(|m| m.scripted("compact").next().cloned()).as_ref(), Some(&reply), "the stand-in's reply is its step's");
        }
        let (left_out, client_edits) = Self::of_strategy(prepared, effective);
        FollowRules { main_calls: prepared.workload.main_calls.clone(), recorded, stand_in: (step, reply), left_out, client_edits }
    }

    /// What the rules read of `effective`: `left_out` and `client_edits`.
    fn of_strategy(prepared: &Prepared, effective: &Strategy) -> (Option<usize>, bool) {
        let left_out = if effective.replay_recorded_microcompact { None } else { microcompact_calls(prepared).first().copied() };
        (left_out, client_edits(effective))
    }
}

/// A run that switches plans as it goes ([`crate::runner::ReplyPlan`]): the replies carry their
/// recorded usage up to the first main call where the run parts from the recording, none from
/// there (their output tokens kept), and each compaction takes the reply [`read_run`] would
/// give it. Every reason `read_run` finds the run parts at call d is known once request d is
/// measured, before anything but the row's copy of its usage read the reply to d (a stage fired
/// on its request, a server-side context edit the measurement applied, the agent compacted or
/// did not where the recording did, the recorded microcompact left out): the reply to d is
/// then taken off its usage and the row's copy dropped, which leaves the row as measured
/// without it where the reply's output tokens are its usage's (checked). Which summary a
/// compaction takes depends on its call (that of the next main request) and on the summaries
/// taken before it.
///
/// Its run is a fixed point of the plan search ([`settle_by_runs`]) where [`Follow::holds`]:
/// the run read by `read_run` parts where it switched, and its compactions took exactly the
/// replies `read_run` gives them, in order. A run under the plan (usage up to that call, those
/// replies) is this run: up to the switch it takes the same replies with their usage, from
/// there the same replies without it (the replies a plan strips are those of the calls from the
/// switch on, checked), and its compactions the same summaries in the same order.
///
/// And it is the fixed point the search settles on, whatever number of runs the search takes:
/// a settled run of the search goes by a plan (usage up to d, replies L) under which it parts
/// at d and its compactions take L. Where this run and that one first differ, both had made the
/// same requests: a reply that carries usage in one and none in the other is one at or after
/// the first call where one of them parts, where the other parts too (it made the same
/// requests up to it); a compaction's reply is the one `read_run` gives it in both. So they
/// never differ. Where the search does not settle in [`MAX_RUNS`] runs, this run is settled
/// where the search's result is not (no what-if of the 16 shared sessions' audit does).
/// Anything the run does that this cannot stand for (a compaction whose reply no main request
/// reports, a switch at a call whose replies were taken before it) fails the check, and the
/// search runs as before.
#[derive(Clone)]
struct Follow {
    rules: std::rc::Rc<FollowRules>,
    /// Main requests answered so far (paired with `main_calls` in order, as [`read_output`]).
    paired: usize,
    /// `compact`-lane replies the model had handed out at the last main request.
    compact_seen: usize,
    /// Recorded compactions whose summary a compaction took.
    used: Vec<bool>,
    /// Recorded compactions the agent compacted at too.
    met: Vec<bool>,
    /// The replies the compactions took, in order: a recorded compaction's summary, else the
    /// stand-in (`None`).
    taken: Vec<Option<usize>>,
    /// The reply set for the next compaction.
    next: Option<usize>,
    /// The reply the `compact` lane holds, as set last (`None` before the first).
    held: Option<Option<usize>>,
    /// The call from which the replies carry no recorded usage, once the run parted.
    parted: Option<usize>,
    /// The run did something this cannot stand for: [`Follow::holds`] fails.
    lost: bool,
}

impl Follow {
    fn new(rules: std::rc::Rc<FollowRules>) -> Self {
        let n = rules.recorded.len();
        Follow { rules, paired: 0, compact_seen: 0, used: vec![false; n], met: vec![false; n], taken: Vec::new(), next: None, held: None, parted: None, lost: false }
    }

    /// The reply a compaction before the request of `call` takes ([`read_run`]'s rule): the
    /// summary of the first recorded compaction within one call whose summary no compaction
    /// took, else the stand-in.
    fn choose(&self, call: usize) -> Option<usize> {
        matching_summary(self.rules.recorded.iter().map(|(at, summary)| (*at, summary.is_some())), &self.used, call)
    }

    /// Reads the next main request's stages: the compactions they report (each taking the
    /// reply [`Follow::choose`] gives) and the first call from which the run parts from the
    /// recording, if it does by this request.
    fn read_row(&mut self, stages: &[crate::measure::StageReport]) -> (usize, Option<usize>) {
        let rules = self.rules.clone();
        let call = rules.main_calls.get(self.paired).copied().unwrap_or(usize::MAX);
        self.paired += 1;
        let mut parts: Option<usize> = None;
        let mut taking = 0;
        let mut compacted = false;
        for stage in stages.iter().filter(|s| s.fired) {
            if crate::runner::COMPACTION_STAGES.contains(&&*stage.name) {
                compacted = true;
                if !rules.recorded.iter().any(|(at, _)| *at == call) {
                    parts = Some(call);
                }
                if stage.name != "session_memory_compact" {
                    taking += 1;
                    let choice = self.choose(call);
                    if let Some(i) = choice {
                        self.used[i] = true;
                    }
                    self.taken.push(choice);
                }
            } else if REWRITE_STAGES.contains(&&*stage.name) && stage.tokens_after < stage.tokens_before && !(rules.client_edits && stage.name == "context_editing") {
                parts = Some(call);
            }
        }
        for (i, (at, _)) in rules.recorded.iter().enumerate() {
            if *at == call && compacted {
                self.met[i] = true;
            }
            if *at <= call && !self.met[i] {
                parts = Some(parts.map_or(*at, |p| p.min(*at)));
            }
        }
        if let Some(m) = rules.left_out.filter(|m| *m <= call) {
            parts = Some(parts.map_or(m, |p| p.min(m)));
        }
        (taking, parts)
    }

    /// Where the run stands at a checkpoint of a run under the first plan (`rows` its rows,
    /// `model` its model): a run that follows the recording from the first call is that run up
    /// to there when neither parted from the recording before it and its compactions took the
    /// replies this would have given them.
    fn at(rules: std::rc::Rc<FollowRules>, rows: &mut dyn Iterator<Item = &RequestMetrics>, model: &crate::world::ScriptedModel) -> Option<Follow> {
        let mut follow = Follow::new(rules);
        for row in rows.filter(|r| r.lane == LANE_MAIN && r.error.is_none()) {
            if follow.read_row(&row.stages).1.is_some() {
                return None;
            }
        }
        // The first plan's replies are the recorded summaries in order.
        let summaries = follow.rules.recorded.iter().enumerate().filter(|(_, (_, s))| s.is_some()).map(|(i, _)| Some(i));
        let taken_as_planned = follow.taken.iter().copied().eq(summaries.take(follow.taken.len()));
        let consumed = (model.consumed(LANE_MAIN), model.consumed("compact"));
        if !taken_as_planned || consumed != (follow.paired, follow.taken.len()) {
            return None;
        }
        follow.compact_seen = consumed.1;
        Some(follow)
    }

    /// Sets the reply of a compaction before the next main request.
    fn set_next(&mut self, model: &mut crate::world::ScriptedModel) {
        let call = self.rules.main_calls.get(self.paired).copied().unwrap_or(usize::MAX);
        let choice = self.choose(call);
        // (The lane holds it still: nothing took it since it was set.)
        if self.held == Some(choice) && model.remaining("compact") == 1 && model.consumed("compact") == self.compact_seen {
            return;
        }
        self.next = choice;
        self.held = Some(choice);
        let reply = match self.next {
            Some(i) => self.rules.recorded[i].1.as_ref().map(|(_, reply)| reply.clone()),
            None => None,
        };
        model.replace_remaining("compact", vec![reply.unwrap_or_else(|| self.rules.stand_in.1.clone())]);
    }

    /// At the run's end: a reply taken since the last main request is one no request reports.
    fn end(&mut self, model: &crate::world::ScriptedModel) {
        if model.consumed("compact") != self.compact_seen {
            self.lost = true;
        }
    }

    /// What [`Follow::holds`] and a later step read of this, as text (for debug builds'
    /// comparisons).
    #[cfg(debug_assertions)]
    fn shown(&self) -> String {
        format!("{:?}", (self.paired, self.compact_seen, &self.used, &self.met, &self.taken, self.parted, self.lost))
    }

    /// Whether the run, read as `read`, is the run of the plan it went by ([`Follow`]).
    fn holds(&self, read: &Reading) -> bool {
        let (_, divergence, lane) = read;
        let step = |choice: &Option<usize>| match choice {
            Some(i) => self.rules.recorded[*i].1.as_ref().map(|(step, _)| step),
            None => Some(&self.rules.stand_in.0),
        };
        !self.lost
            && divergence.as_ref().map(|(call, _)| *call) == self.parted
            && lane.len() == self.taken.len()
            && self.taken.iter().zip(lane).all(|(choice, value)| step(choice) == Some(value))
    }
}

impl crate::runner::ReplyPlan for Follow {
    fn clone_box(&self) -> Box<dyn crate::runner::ReplyPlan> {
        Box::new(self.clone())
    }

    fn start(&mut self, model: &mut crate::world::ScriptedModel) {
        self.set_next(model);
    }

    fn main_reply(&mut self, row: &mut RequestMetrics, reply: &mut crate::world::Reply, model: &mut crate::world::ScriptedModel) {
        let planned = self.next;
        let before = self.taken.len();
        let (taking, parts) = self.read_row(&row.stages);
        let handed = model.consumed("compact") - self.compact_seen;
        self.compact_seen = model.consumed("compact");
        // (One compaction took the reply set for it; two would have taken a reply not set.)
        if handed != taking || taking > 1 || (taking == 1 && self.taken[before] != planned) {
            self.lost = true;
        }
        if self.parted.is_none()
            && let Some(call) = parts
        {
            // The replies a plan parting at `call` takes without usage: those of the calls from
            // it on, which must be this one and those not yet taken.
            let position = model.consumed(LANE_MAIN).saturating_sub(1).min(self.rules.main_calls.len());
            let calls = &self.rules.main_calls;
            if !(calls[..position].iter().all(|&c| c < call) && calls[position..].iter().all(|&c| c >= call)) {
                self.lost = true;
            }
            // This reply's usage only went into the row as its copy (the server-side context
            // edit a row shows is measured after the reply is taken): measured without it, the
            // row is the same where the output tokens are.
            if let Some(usage) = reply.usage.take() {
                self.lost |= reply.output_tokens != usage.output_tokens;
                reply.output_tokens = usage.output_tokens;
            }
            row.recorded_usage = None;
            self.parted = Some(call);
            model.drop_usage(LANE_MAIN);
        }
        self.set_next(model);
    }
}

/// The first plan: the recording followed throughout, each compaction taking the recorded
/// summaries in order, the recorded microcompacts applied unless `effective` leaves them out.
fn first_plan(prepared: &Prepared, effective: &Strategy) -> Plan {
    plan_start(prepared, !effective.replay_recorded_microcompact)
}

fn plan_start(prepared: &Prepared, without_recorded_microcompacts: bool) -> Plan {
    Plan { usage_before: None, lane: prepared.recorded.iter().filter_map(|r| r.summary.clone()).collect(), without_recorded_microcompacts }
}

/// The recorded call each recorded microcompact of the workload comes before, in order: read
/// from its scenario (debug builds read its document's script too and compare).
fn microcompact_calls(prepared: &Prepared) -> Vec<usize> {
    use crate::scenario::Step;
    let mut calls = Vec::new();
    let (mut main, mut pending) = (0usize, 0usize);
    for step in &prepared.workload.scenario.script {
        match step {
            Step::Microcompact { .. } => pending += 1,
            Step::Assistant(reply) if reply.lane == LANE_MAIN => {
                let call = prepared.workload.main_calls.get(main).copied().unwrap_or(usize::MAX);
                calls.extend(std::iter::repeat_n(call, pending));
                pending = 0;
                main += 1;
            }
            _ => {}
        }
    }
    #[cfg(debug_assertions)]
    if let Some(script) = prepared.workload.document.get("script").and_then(Value::as_array) {
        let mut from_document = Vec::new();
        let (mut main, mut pending) = (0usize, 0usize);
        for step in script {
            if step.get("microcompact").is_some() {
                pending += 1;
            } else if step.get("assistant").is_some() && step.get("lane").is_none() {
                let call = prepared.workload.main_calls.get(main).copied().unwrap_or(usize::MAX);
                from_document.extend(std::iter::repeat_n(call, pending));
                pending = 0;
                main += 1;
            }
        }
        debug_assert_eq!(calls, from_document, "the recorded microcompacts' calls, from the scenario and from the document");
    }
    calls
}

/// Strategies that make the same runs up to their first autocompact check at or above the
/// lower of their thresholds: the agent's own decision
/// ([`crate::agent::session::ThresholdWorld::autocompact_family`], the one
/// [`crate::runner::RunState::retarget_autocompact`] goes by) in this session's world. `None`
/// for a strategy the runner refuses (a buffer at or above the effective window).
pub fn family_key(effective: &Strategy, prepared: &Prepared) -> Option<String> {
    let world = prepared.threshold_world();
    (!world.refuses(effective)).then(|| world.autocompact_family(effective))
}

/// A strategy that goes on from a family's trunk although its family differs, being otherwise
/// the trunk's strategy: one that runs a peer mechanism with autocompact off, a mechanism that
/// rewrites nothing below one count ([`PeerConfig::rewrite_trigger`]: Codex, Cline, server
/// compaction) or one the trunk can run dry ([`PeerConfig::dry_runs`]: opencode, observation
/// masking), one that places MCP instructions as delta attachments where the trunk has them
/// in the system prompt, or one that has the server clear old tool uses where the trunk does
/// not.
///
/// [`PeerConfig::rewrite_trigger`]: crate::agent::compact::peers::PeerConfig::rewrite_trigger
/// [`PeerConfig::dry_runs`]: crate::agent::compact::peers::PeerConfig::dry_runs
#[derive(Debug, Clone)]
pub enum PeerBranch {
    Peer {
        peer: crate::agent::compact::peers::PeerConfig,
        /// Its blocking limit: with autocompact off, the blocking check is its own.
        blocking: u64,
    },
    /// Acts otherwise from the first step where connected MCP servers have instructions to
    /// place (the trunk's [`crate::agent::session::PeerProbe::mcp_instructions`]). The probe is
    /// the main session's: a subagent's copy of it is dropped, so a server connected in the
    /// middle of a turn, before a subagent of that turn starts, would not be seen there. Recorded
    /// sessions' workloads connect servers only at the start (no `mcp_connect` later), which is
    /// where the audit uses this branch; a scripted scenario's family does not (`compare` and
    /// `sweep` group by [`family_key`] alone).
    McpDelta,
    /// Clears old tool uses server-side (`clear_tool_uses`, the API's context editing) where
    /// the trunk does not: acts otherwise from the first step where a request reaches
    /// `trigger` input tokens, or the chain's own count does (its `context_editing` event).
    /// Below it the server clears nothing and the chain's edit changes only the body's
    /// `context_management` field, which no row reads, and the microcompact stage's report,
    /// which runs to find no trigger where the trunk's is disabled (rewritten on the trunk's
    /// rows before the checkpoint).
    ContextEditing { trigger: u64 },
}

/// Whether `effective` is a [`PeerBranch`] of a family whose trunk runs under `trunk`. Up to the
/// first step where any of these holds, its run and the trunk's make the same requests, rows and
/// state (but for the peer's own state and the unfired stages' report texts, which nothing reads
/// before the peer first fires), so it goes on from a trunk checkpoint before that step:
/// - the count its mechanism compares (the trunk records it under no mechanism,
///   [`crate::agent::session::Session::probe_peers`]) reaches its trigger; or, for a mechanism
///   that acts on more than a count, the mechanism run dry on the trunk's requests
///   ([`crate::agent::session::Session::dry_run_peers`], on the trunk's peer state, which is
///   the state the mechanism leaves where it rewrites nothing) would rewrite anything. Its
///   reports where it would not (opencode's unfired prune on every main request) are added to
///   the trunk's rows before the checkpoint where the runner puts a peer's reports, and those
///   pending at the checkpoint (of a fork built after the last main request) are handed to
///   the branch's session ([`crate::agent::session::Session::retarget`]), so its rows are those
///   of its own run;
/// - the trunk's autocompact compares a count at or above the trunk's threshold or the
///   strategy's blocking limit (autocompact off, its blocking check refuses from there; the
///   trunk's check counts what the blocking check counts);
/// - the trunk compacts by any stage, an API error is answered by the recovery ladder, or a
///   request is refused. (Not a user's `/compact` that met no error, which the branch does the
///   same way: it goes on with the trunk through it, [`agent_whatif_family_until`].)
///
/// Anything else (another knob, a trunk that does not record its checks on every chain run:
/// compaction disabled, context collapse on) is no branch: the strategy runs on its own.
///
/// A strategy that differs only in placing MCP instructions as delta attachments (the trunk in
/// the system prompt) acts otherwise from the first step where connected servers have
/// instructions where either placement reads them: until then neither places anything.
///
/// A strategy that differs only in having the server clear old tool uses (`clear_tool_uses`, the
/// trunk under no peer mechanism, its microcompact's time-based and cached paths off:
/// [`PeerBranch::ContextEditing`]) acts otherwise from the first step where the trunk compacts,
/// meets an API error or a refusal, the server edits any request, or any request, the chain's
/// count before a stage or autocompact's check reaches the edit's trigger. Before it the server
/// fires no clearing (it compares the count after the earlier edits, which are the trunk's, with
/// the trigger), the chain journals no `context_editing` event, and the edit in the body changes
/// no row: no body hash is taken (the family runs such a branch on its own under a measurer
/// that hashes bodies), a row does not read the field, and the measurer's clearing memo is a
/// memo (checked against clearing from scratch in debug builds). The stage it enables runs and
/// reports no trigger, on the count the trunk's disabled one reports.
pub fn peer_branch_of(effective: &Strategy, trunk: &Strategy, prepared: &Prepared) -> Option<PeerBranch> {
    use crate::agent::compact::peers::PeerStrategy;
    use crate::strategy::McpInstructionsMode;
    let world = prepared.threshold_world();
    if world.refuses(effective) || world.refuses(trunk) {
        return None;
    }
    let (a, b) = (world.applied(effective), world.applied(trunk));
    if a.mcp_instructions == McpInstructionsMode::Delta && b.mcp_instructions == McpInstructionsMode::System {
        let mut same = Strategy::clone(&a);
        same.mcp_instructions = b.mcp_instructions;
        return same_settings(&same, &b)?.then_some(PeerBranch::McpDelta);
    }
    if let Some(trigger) = context_editing_branch(&a, &b) {
        return Some(PeerBranch::ContextEditing { trigger });
    }
    let (auto, trunk_auto) = (&a.compact.autocompact, &b.compact.autocompact);
    if b.compact.peer.strategy != PeerStrategy::None || !trunk_auto.enabled || trunk_auto.compact_disabled || b.compact.context_collapse.enabled {
        return None;
    }
    if auto.enabled || auto.compact_disabled || auto.reactive_enabled != trunk_auto.reactive_enabled {
        return None;
    }
    if a.compact.peer.rewrite_trigger(200_000).is_none() && !a.compact.peer.dry_runs() {
        return None;
    }
    // Only `enabled` may differ in autocompact: its other knobs also set the window the API
    // refuses at and snip's trigger, which the trunk's rows would not show.
    let mut same = Strategy::clone(&a);
    same.compact.autocompact.enabled = trunk_auto.enabled;
    same.compact.peer = b.compact.peer.clone();
    if !same_settings(&same, &b)? {
        return None;
    }
    Some(PeerBranch::Peer { peer: a.compact.peer.clone(), blocking: world.thresholds(effective).blocking })
}

/// The trigger of `a`'s server-side tool-use clearing where `a` is `b` (a trunk under no peer
/// mechanism) but for clearing tool uses: `clear_tool_uses` on in `a` and off in `b`, the other
/// settings of that edit free, the thinking edits `b`'s, and the observation-masking keep (read
/// by no other mechanism) free. The microcompact stage's other paths (time-based, cached) are
/// off, so that under `a` the stage reports only that it found no trigger.
fn context_editing_branch(a: &Strategy, b: &Strategy) -> Option<u64> {
    use crate::agent::compact::config::CachedMicrocompactMode;
    use crate::agent::compact::peers::PeerStrategy;
    let (edits, trunk_edits) = (&a.compact.context_editing, &b.compact.context_editing);
    let microcompact = &b.compact.microcompact;
    if !edits.clear_tool_uses || trunk_edits.clear_tool_uses || microcompact.time_based_enabled || microcompact.cached != CachedMicrocompactMode::Off || b.compact.peer.strategy != PeerStrategy::None {
        return None;
    }
    let mut same = a.clone();
    same.compact.context_editing = crate::agent::compact::config::ContextEditingConfig {
        clear_thinking: edits.clear_thinking,
        clear_all_thinking: edits.clear_all_thinking,
        thinking_latch_idle_minutes: edits.thinking_latch_idle_minutes,
        ..trunk_edits.clone()
    };
    same.compact.peer.keep_recent = b.compact.peer.keep_recent;
    same_settings(&same, b)?.then_some(edits.trigger_input_tokens)
}

/// Whether two strategies are the same settings: their JSON values equal (`None` where one does
/// not serialize). Read from their JSON texts: a strategy's text is its fields in a fixed order,
/// its maps sorted (`BTreeMap`), so equal texts are equal values, and texts that differ are
/// values that differ, but for a float that is `-0.0` in one and `0.0` in the other (equal as
/// values); where a text holds a `-0`, the values are compared. Strategies equal field by field
/// (`PartialEq`, derived all the way down) are the same settings without a text: every field is
/// serialized, none is normalized on the way, and a float equal to another (`0.0 == -0.0`) is
/// an equal JSON number. And strategies that differ field by field, neither holding a NaN (each
/// equal to itself), are other settings without a text: the field that differs is a JSON value
/// of its own (a float but NaN is a number, which equals another only where the floats are
/// equal); only a NaN, `null` in JSON as `None` is, can make two different strategies one.
fn same_settings(a: &Strategy, b: &Strategy) -> Option<bool> {
    let by_values = || Some(serde_json::to_value(a).ok()? == serde_json::to_value(b).ok()?);
    if a == b {
        debug_assert!(serde_json::to_value(a).is_ok_and(|x| serde_json::to_value(b).is_ok_and(|y| x == y)), "equal strategies serialize, and equally");
        return Some(true);
    }
    #[expect(clippy::eq_op, reason = "a strategy unequal to itself holds a NaN")]
    let no_nan = a == a && b == b;
    if no_nan {
        debug_assert_eq!(by_values(), Some(false), "strategies without a NaN that differ field by field differ as settings");
        return Some(false);
    }
    let (x, y) = (serde_json::to_vec(a).ok()?, serde_json::to_vec(b).ok()?);
    let negative_zero = |text: &[u8]| memchr::memmem::find(text, b"-0").is_some();
    let same = if x == y {
        true
    } else if negative_zero(&x) || negative_zero(&y) {
        serde_json::to_value(a).ok()? == serde_json::to_value(b).ok()?
    } else {
        false
    };
    debug_assert_eq!(Some(same), by_values(), "settings read from their texts, as their values compare");
    Some(same)
}

/// Whether `effective` is measured beside a family's trunk run under `trunk` rather than run
/// ([`crate::runner::Mirror`]), and what it changes of the trunk's requests: it differs from
/// `trunk` only in the main lane's TTL, or only in sending the main thread's system prompt
/// without the dynamic boundary (the trunk with it, in the global cache scope, with no peer
/// mechanism: [`crate::agent::session::Session`]'s only reader of the system blocks' sizes),
/// or only in sending every tool's schema up front where the trunk defers tools
/// (`tools_up_front`), with caching on. Its run is the trunk's measured so where the trunk's run is the one its
/// plan search settles on, the mirror did not part from it and its rows leave everything the
/// outcome reads of them as the trunk's do (`mirrored_outcome`); elsewhere it runs on its own.
pub fn mirror_of(effective: &Strategy, trunk: &Strategy, prepared: &Prepared) -> Option<crate::runner::MirrorOf> {
    let world = prepared.threshold_world();
    if world.refuses(effective) || world.refuses(trunk) {
        return None;
    }
    let (a, b) = (world.applied(effective), world.applied(trunk));
    if !a.prompt_caching {
        return None;
    }
    if a.enable_tool_search != b.enable_tool_search {
        return tools_up_front(&a, &b, prepared);
    }
    let mut same = Strategy::clone(&a);
    let without_boundary = a.ttl_main == b.ttl_main;
    if without_boundary {
        let global = b.global_cache_scope && b.first_party && !b.disable_experimental_betas;
        if a.dynamic_boundary || !b.dynamic_boundary || !global || b.compact.peer.strategy != crate::agent::compact::peers::PeerStrategy::None {
            return None;
        }
        same.dynamic_boundary = b.dynamic_boundary;
    } else {
        same.ttl_main = b.ttl_main;
    }
    same_settings(&same, &b)?.then(|| crate::runner::MirrorOf { run_ttl: b.ttl_for(LANE_MAIN), ttl: a.ttl_for(LANE_MAIN), without_boundary, tools_up_front: false })
}

/// [`mirror_of`] where `a` differs from `b` in `ENABLE_TOOL_SEARCH` only: `a` sends every tool's
/// schema up front, `b` defers tools (tool search allowed, its listing the first message of
/// each request the agent builds itself: not 2.1.332's layout, no `deferred_tools_delta`
/// attachments), with no peer mechanism, in a session whose workload runs no ToolSearch (each
/// call it makes is answered by its recorded output, the same under both: no tool is loaded, no
/// `tool_reference` block enters the history) and connects no MCP server (an MCP tool
/// sent up front would lay the system prompt out otherwise). The requests of `b`'s run then
/// differ from `a`'s only where they defer tools: the tools array and that first message
/// ([`crate::runner::Mirror`] checks each).
fn tools_up_front(a: &Strategy, b: &Strategy, prepared: &Prepared) -> Option<crate::runner::MirrorOf> {
    use crate::agent::tools::tool_search_allowed;
    let allowed = |s: &Strategy| tool_search_allowed(s.enable_tool_search.as_deref(), s.disable_experimental_betas, s.first_party, s.base_url == crate::strategy::BaseUrl::Custom);
    let layout = b.client_version != crate::agent::dialect::VERSION && !b.deferred_tools_delta && b.compact.peer.strategy == crate::agent::compact::peers::PeerStrategy::None;
    if allowed(a) || !allowed(b) || !layout || prepared.tool_search_run || !prepared.workload.scenario.world.mcp_servers.is_empty() {
        return None;
    }
    let mut same = a.clone();
    same.enable_tool_search.clone_from(&b.enable_tool_search);
    same_settings(&same, b)?.then(|| crate::runner::MirrorOf { run_ttl: b.ttl_for(LANE_MAIN), ttl: b.ttl_for(LANE_MAIN), without_boundary: false, tools_up_front: true })
}

/// How a run goes on from a trunk checkpoint.
#[derive(Debug, Clone, Copy)]
enum Branch {
    /// Another autocompact threshold (the trunk's, the strategy's).
    Autocompact { trunk: u64, threshold: u64 },
    /// A [`PeerBranch`] that acts otherwise from this step on.
    Peer { from_step: usize },
}

/// A run under the family's first plan, checkpointed before a step, with what decides whether
/// another strategy and plan may go on from there.
struct Checkpoint {
    state: RunState<'static>,
    /// What the trunk's measurer measured up to the step (its model table and estimator are
    /// every run's: [`Measurer::restore`] onto the family's branch measurer).
    measurer: MeasurerState,
    /// The highest count autocompact compared with its threshold before the step.
    max_checked: Option<u64>,
    /// Rows before the step.
    rows: usize,
}

/// The trunk's run at its end, for the runs that go on from its end checkpoint with no step
/// left (a threshold the trunk never reached, a peer branch that never acted otherwise): such a
/// run is the trunk's own, finished under the strategy's name and stop rule, so it is read from
/// the trunk's output rather than from a copy of the end state finished again.
struct TrunkEnd {
    checkpoint: std::rc::Rc<Checkpoint>,
    output: crate::runner::RunOutput,
    /// The trunk's kept compacted requests ([`RunState::take_compacted_requests`]).
    compacted: Vec<(usize, Vec<Message>)>,
}

impl TrunkEnd {
    /// The run of `effective` under `stop` going on from the end checkpoint, with `scenario`
    /// (the plan's: the same steps, all run), as [`finish_run`] would give it.
    fn run(&self, prepared: &Prepared, scenario: &Scenario, effective: &Strategy, stop: Option<StopRule>) -> Run {
        let mut output = self.output.clone();
        output.scenario.clone_from(&scenario.file);
        output.summary.input.clone_from(&scenario.file);
        output.summary.strategy.clone_from(&effective.name);
        output.stopped = stop.and_then(|rule| rule.stopped(output.summary.info_loss.tokens_dropped, self.checkpoint.state.refused()));
        read_output(prepared, self.compacted.clone(), output)
    }
}

/// Every strategy of `effectives` (one [`family_key`], distinct thresholds, and the
/// [`PeerBranch`]es of its trunk) through the agent, as [`agent_whatif`] runs each, with the work
/// they share done once: the run under the highest threshold (the trunk) is checkpointed as it
/// goes, and every other strategy goes on from the last checkpoint before its first autocompact
/// check at or above its threshold (a peer branch: before the first step where it would act
/// otherwise, [`peer_branch_of`]; one that never does is the trunk to its end); a
/// later run of its plan search goes on from the last checkpoint its plan leaves unchanged
/// (checkpoints are kept before the main call of each recorded compaction, where a plan
/// stops following the recorded usage). A checkpoint holds the recorded client's rules in their
/// state at that step ([`RunState::checkpoint`] copies them), so a run that goes on from it
/// applies them as its own run from the first call would.
pub fn agent_whatif_family(
    session: &ImportedSession,
    file: &str,
    prepared: &Prepared,
    measurer: Measurer,
    effectives: &[Strategy],
) -> Result<Vec<Result<AgentOutcome, String>>, String> {
    agent_whatif_family_until(session, file, prepared, measurer, effectives, Stops::Never)
}

/// The outcome of a strategy measured beside the trunk ([`mirror_of`]) whose run is the
/// trunk's (`trunk`, its settled outcome), measured as `rows`: the trunk's but for what the
/// measurement gives: the rows, the summary, the tokens dropped where the rows' context sizes
/// count them ([`LossTracker::count_drops`]) and each compaction loss's (the context before and
/// after it, as [`outcome`] reads them). `None` where the rows differ from the trunk's in what
/// else the outcome reads of them: a row's lane and error (which main rows answer which
/// recorded calls) and the tool uses the server cleared (what the loss judge reads besides the
/// bodies, which are the trunk's but for the system prompt, which it does not read). A mirror
/// that sends every tool up front leaves out the listing of deferred tools, which the loss
/// judge reads after a compaction: its compaction losses are judged on the messages it sent
/// (`compacted`, its main requests after a compaction: row and messages).
///
/// [`LossTracker::count_drops`]: crate::measure::loss::LossTracker::count_drops
#[expect(clippy::too_many_arguments, reason = "the trunk's outcome and what the mirror measured of it")]
fn mirrored_outcome(
    session: &ImportedSession,
    prepared: &Prepared,
    scenario: &Scenario,
    strategy: &Strategy,
    measurer: &Measurer,
    trunk: &AgentOutcome,
    rows: Vec<RequestMetrics>,
    compacted: Option<Vec<(usize, Vec<Message>)>>,
) -> Option<AgentOutcome> {
    let cleared = |row: &RequestMetrics| row.context_management.as_ref().map(|cm| cm.cleared_tool_use_ids.clone());
    if rows.len() != trunk.rows.len() || rows.iter().zip(&trunk.rows).any(|(a, b)| a.lane != b.lane || a.error != b.error || cleared(a) != cleared(b)) {
        return None;
    }
    let mut drops = crate::measure::loss::LossTracker::new();
    rows.iter().for_each(|row| drops.count_drops(row));
    let drops = drops.finish();
    let info_loss = InfoLoss { tokens_dropped: drops.tokens_dropped, compactions: drops.compactions, max_dropped: drops.max_dropped, ..trunk.info_loss.clone() };
    let main_rows = rows.iter().filter(|r| r.lane == LANE_MAIN && r.error.is_none());
    let context_of: BTreeMap<usize, u64> = prepared.workload.main_calls.iter().zip(main_rows).map(|(&call, row)| (call, row.context_tokens)).collect();
    let compaction_losses = match compacted {
        Some(compacted) => {
            // (Rows paired with the recorded calls as [`read_output`] pairs them.)
            let main_rows = rows.iter().enumerate().filter(|(_, r)| r.lane == LANE_MAIN && r.error.is_none()).map(|(i, _)| i);
            let call_of: BTreeMap<usize, usize> = main_rows.zip(prepared.workload.main_calls.iter().copied()).collect();
            let after = compacted.into_iter().filter_map(|(row, messages)| call_of.get(&row).map(|call| (*call, messages))).collect();
            compaction_losses(session, prepared.losses, &trunk.compactions, &after, &context_of)
        }
        None => {
            let mut compaction_losses = trunk.compaction_losses.clone();
            for loss in &mut compaction_losses {
                let before = context_of.range(..loss.call).next_back().map_or(0, |(_, &tokens)| tokens);
                loss.tokens_dropped = before.saturating_sub(context_of.get(&loss.call).copied().unwrap_or(0));
            }
            compaction_losses
        }
    };
    let mut summary = crate::measure::Summary::from_rows(&scenario.file, &strategy.name, measurer.counter().kind().name(), &rows, trunk.summary.blocked);
    summary.info_loss = info_loss.clone();
    Some(AgentOutcome {
        rows,
        summary,
        info_loss,
        compactions: trunk.compactions.clone(),
        divergence: trunk.divergence.clone(),
        compaction_losses,
        runs: trunk.runs,
        stopped: trunk.stopped,
    })
}

/// How many outcomes [`agent_whatif_family_until`] took from a mirror on this thread (tests
/// read it to know a strategy was measured beside its trunk, not run on its own).
#[doc(hidden)]
pub fn mirrored_outcomes() -> usize {
    MIRRORED.with(std::cell::Cell::get)
}

/// How many runs of peer branches ([`peer_branch_of`]) went on from a checkpoint of their
/// trunk past its start on this thread (tests read it to know a strategy went on from its
/// trunk, not from the first call).
#[doc(hidden)]
pub fn peer_branch_runs() -> usize {
    PEER_BRANCH_RUNS.with(std::cell::Cell::get)
}

/// How many times a peer branch went on with its trunk through a user's `/compact` on this
/// thread, rather than from the checkpoint before it (tests read it to know the case was met).
#[doc(hidden)]
pub fn peer_branches_through_compact() -> usize {
    THROUGH_COMPACT.with(std::cell::Cell::get)
}

thread_local! {
    static MIRRORED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static PEER_BRANCH_RUNS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static THROUGH_COMPACT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Which runs of a family end early ([`agent_whatif_family_until`]).
#[derive(Debug, Clone, Copy)]
pub enum Stops<'a> {
    /// Every run goes to its end.
    Never,
    /// (A family of one strategy.) Its runs end where the rule holds.
    Rule(StopRule),
    /// The strategies `bounded` marks end once they are beaten by the run of strategy `base`
    /// (unmarked) over the whole session ([`stop_rule_beyond`]): that run is made first, to its
    /// end, and the marked ones then go on from the family's checkpoints under its rule. Where
    /// `base` is not the family's trunk, every run goes to its end.
    BeyondRunOf { base: usize, bounded: &'a [bool] },
}

/// The rule under which a run is beaten by `outcome`'s run over the whole session: once it has
/// taken more tokens from the model's view, or refused more requests (both counts only grow).
pub fn stop_rule_beyond(outcome: &AgentOutcome) -> StopRule {
    StopRule { tokens_dropped_above: outcome.info_loss.tokens_dropped, refused_above: outcome.summary.blocked }
}

/// [`agent_whatif_family`] whose runs end early as `stop` says ([`crate::runner::StopRule`];
/// [`AgentOutcome::stopped`] says where and why). A family of several strategies (they go on
/// from the trunk's checkpoints: a trunk ended early would end them too) with one rule for all
/// is an error; its branches may end early beyond the trunk's own run ([`Stops::BeyondRunOf`]).
pub fn agent_whatif_family_until(
    session: &ImportedSession,
    file: &str,
    prepared: &Prepared,
    measurer: Measurer,
    effectives: &[Strategy],
    stop: Stops<'_>,
) -> Result<Vec<Result<AgentOutcome, String>>, String> {
    let (rule, beyond) = match stop {
        Stops::Never => (None, None),
        Stops::Rule(_) if effectives.len() != 1 => return Err(format!("a stop rule applies to a family of one strategy, not {}", effectives.len())),
        Stops::Rule(rule) => (Some(rule), None),
        Stops::BeyondRunOf { base, bounded } if base >= effectives.len() || bounded.len() != effectives.len() || bounded[base] => {
            return Err(format!("a family of {} strategies stopped beyond strategy {base} with {} marks", effectives.len(), bounded.len()));
        }
        Stops::BeyondRunOf { base, bounded } => (None, Some((base, bounded))),
    };
    /// Script steps between two checkpoints of the trunk. (A checkpoint costs about what a
    /// step and a half costs, and a strategy that goes on from one runs again half the steps
    /// between two on average: of 24 to 192, 32 to 64 cost least on the audit of the 16
    /// shared sessions.)
    const EVERY: usize = 48;
    if let [effective] = effectives {
        // No other strategy goes on from its run: it runs from the first call, following the
        // recording ([`settle`]), with no trunk under the first plan made first.
        let mut measurer = measurer;
        let runs = &mut Alone { scenarios: Scenarios::new(prepared, file), measurer: &mut measurer, effective, stop: rule };
        return Ok(vec![settle(session, prepared, effective, None, runs)]);
    }
    let chain = crate::agent::compact::chain::Chain::new();
    let mut scenarios = Scenarios::new(prepared, file);
    let first = scenarios.get(&first_plan(prepared, &effectives[0]))?;
    let mut measurer = measurer;
    fresh_measurer(prepared, &mut measurer)?;
    // The measurer every run that goes on from a checkpoint measures with, from that
    // checkpoint's state: one for the family, its estimator's memo kept from run to run.
    let mut branch = measurer.clone();
    let options = run_options(prepared);
    // The trunk runs under the highest threshold (the agent's own, as each run computes it) of
    // the strategies of its own family; the family's other strategies are peer branches of it.
    let thresholds: Vec<u64> = effectives.iter().map(|s| thresholds_of(s, prepared).autocompact).collect();
    let keys: Vec<Option<String>> = effectives.iter().map(|s| family_key(s, prepared)).collect();
    // (The trunk's family is that of the first strategy that is no peer branch of another.)
    let branch_of_another = |i: usize| {
        (0..effectives.len()).any(|j| j != i && keys[j] != keys[i] && (peer_branch_of(&effectives[i], &effectives[j], prepared).is_some() || mirror_of(&effectives[i], &effectives[j], prepared).is_some()))
    };
    let anchor = (0..effectives.len()).find(|&i| !branch_of_another(i)).unwrap_or(0);
    let own = |i: usize| keys[i] == keys[anchor];
    let top = (0..effectives.len()).filter(|&i| own(i)).max_by_key(|&i| (thresholds[i], std::cmp::Reverse(i))).ok_or("no strategy")?;
    let mut peers: Vec<Option<PeerBranch>> = vec![None; effectives.len()];
    let mut alone = Vec::new();
    // Strategies measured beside the trunk: (strategy, what it changes of the trunk's requests).
    let mut mirrored = Vec::new();
    let bounded = |p: usize| beyond.is_some_and(|(base, bounded)| base == top && bounded[p]);
    for i in (0..effectives.len()).filter(|&i| !own(i)) {
        // (A measurer that hashes bodies hashes the markers too, which a mirror does not send
        // through it.)
        if let Some(of) = mirror_of(&effectives[i], &effectives[top], prepared).filter(|_| !measurer.flattener().hashes_bodies()) {
            mirrored.push((i, of));
            continue;
        }
        // (Nor a tool-use clearing branch: its bodies carry the edit, which a body hash reads.)
        match peer_branch_of(&effectives[i], &effectives[top], prepared) {
            Some(PeerBranch::ContextEditing { .. }) if measurer.flattener().hashes_bodies() => alone.push(i),
            Some(branch) => peers[i] = Some(branch),
            None => alone.push(i),
        }
    }
    if !alone.is_empty() {
        // A strategy of another family that is no peer branch of this trunk (grouped against
        // another run): it runs on its own, the others as a family without it.
        let rest: Vec<usize> = (0..effectives.len()).filter(|i| !alone.contains(i)).collect();
        let subset: Vec<Strategy> = rest.iter().map(|&i| effectives[i].clone()).collect();
        let mut outcomes: Vec<Option<Result<AgentOutcome, String>>> = vec![None; effectives.len()];
        for (i, outcome) in rest.iter().zip(agent_whatif_family(session, file, prepared, measurer.clone(), &subset)?) {
            outcomes[*i] = Some(outcome);
        }
        for &i in &alone {
            let one = agent_whatif_family(session, file, prepared, measurer.clone(), std::slice::from_ref(&effectives[i]));
            outcomes[i] = Some(one.and_then(|mut v| v.pop().ok_or_else(|| "no outcome".to_owned())).unwrap_or_else(Err));
        }
        return Ok(outcomes.into_iter().map(|o| o.unwrap_or_else(|| Err("no outcome".to_owned()))).collect());
    }
    let mut trunk = RunState::start_with(&scenarios.list[first].1, &scenarios.list[first].2, &effectives[top], options).map_err(|e| e.to_string())?;
    trunk.keep_compacted_requests();
    for &(_, of) in &mirrored {
        trunk.add_mirror(crate::runner::Mirror::new(of, measurer.clone(), run_options(prepared).client));
    }
    let window = crate::agent::compact::peers::peer_window(trunk.world().context_window);
    let triggers: Vec<Option<u64>> = peers.iter().map(|p| match p {
        Some(PeerBranch::Peer { peer, .. }) => peer.rewrite_trigger(window),
        _ => None,
    }).collect();
    if peers.iter().any(|p| p.as_ref().is_some_and(|p| !matches!(p, PeerBranch::ContextEditing { .. }))) {
        trunk.agent_mut().probe_peers(true);
    }
    // The peer mechanisms that act on more than a count, of the strategies still to branch: run
    // dry on the trunk's requests.
    let dry = |pending: &[usize]| -> Vec<(usize, crate::agent::compact::peers::PeerConfig)> {
        pending.iter().filter_map(|&p| match &peers[p] {
            Some(PeerBranch::Peer { peer, .. }) if triggers[p].is_none() && peer.dry_runs() => Some((p, peer.clone())),
            _ => None,
        }).collect()
    };
    // What each would have reported on the trunk's main rows: (row, reports) per strategy.
    let mut dry_reports: Vec<Vec<(usize, Vec<crate::measure::StageReport>)>> = vec![Vec::new(); effectives.len()];
    let top_blocking = prepared.threshold_world().thresholds(&effectives[top]).blocking;
    // The steps of the main calls the recording compacted before.
    let recorded_steps: std::collections::BTreeSet<usize> = {
        let calls: std::collections::BTreeSet<usize> = prepared.recorded.iter().map(|r| r.call).collect();
        let mut main = 0usize;
        let mut steps = std::collections::BTreeSet::new();
        for (i, step) in scenarios.list[first].1.script.iter().enumerate() {
            if let crate::scenario::Step::Assistant(reply) = step
                && reply.lane == LANE_MAIN
            {
                if prepared.workload.main_calls.get(main).is_some_and(|c| calls.contains(c)) {
                    steps.insert(i);
                }
                main += 1;
            }
        }
        steps
    };
    let mut results: Vec<Option<Result<AgentOutcome, String>>> = effectives.iter().map(|_| None).collect();
    let checkpoint = |trunk: &mut RunState<'_>, measurer: &mut Measurer, max_checked: Option<u64>| {
        trunk.freeze();
        measurer.freeze();
        std::rc::Rc::new(Checkpoint { state: trunk.checkpoint(), measurer: measurer.state(), max_checked, rows: trunk.rows() })
    };
    // The start is a checkpoint every run may go on from.
    let mut kept: Vec<std::rc::Rc<Checkpoint>> = vec![checkpoint(&mut trunk, &mut measurer, None)];
    let mut latest: Option<std::rc::Rc<Checkpoint>> = kept.first().cloned();
    let mut max_checked: Option<u64> = None;
    let mut pending: Vec<usize> = (0..effectives.len()).filter(|&i| i != top && !mirrored.iter().any(|&(m, _)| m == i)).collect();
    trunk.agent_mut().dry_run_peers(dry(&pending));
    // A strategy that places MCP instructions as delta attachments acts otherwise only where a
    // connected server has instructions ([`PeerBranch::McpDelta`]): in a world whose servers
    // have none (connecting one adds none), never.
    let instructions = scenarios.list[first].1.world.mcp_servers.iter().any(|s| s.instructions.is_some());
    let may_act = |p: usize| instructions || !matches!(peers[p], Some(PeerBranch::McpDelta));
    // (Strategies that end early beyond the trunk's own run: their branches wait for its end.)
    let mut deferred: Vec<(usize, Vec<std::rc::Rc<Checkpoint>>, Branch)> = Vec::new();
    let mut since = 0;
    // The last step's highest check and how much it rose over the one before: where the next
    // step's may rise as much and reach the threshold of an autocompact strategy still to
    // branch, the trunk is checkpointed before it, and a strategy that goes on from there runs
    // no step of the trunk's again. (A step's rise is much like the last one's; the most a step
    // rose so far is not: checkpoints before every step within it cost more than they save.)
    let (mut last_high, mut rise): (Option<u64>, u64) = (None, 0);
    let near = |pending: &[usize], last_high: Option<u64>, rise: u64| {
        last_high.is_some_and(|high| pending.iter().any(|&p| peers[p].is_none() && high < thresholds[p] && high.saturating_add(rise) >= thresholds[p]))
    };
    while !trunk.done(&scenarios.list[first].1) {
        let step = trunk.next_step();
        if recorded_steps.contains(&step) {
            let c = checkpoint(&mut trunk, &mut measurer, max_checked);
            kept.push(c.clone());
            latest = Some(c);
            since = 0;
        } else if (since >= EVERY && pending.iter().any(|&p| may_act(p))) || near(&pending, last_high, rise) {
            // (Only a strategy still to branch goes on from these: none for one that never acts
            // otherwise, which goes on from the trunk's end.)
            latest = Some(checkpoint(&mut trunk, &mut measurer, max_checked));
            since = 0;
        }
        since += 1;
        // (Debug builds run each peer branch still to branch through a user's `/compact` on
        // its own, from here, and compare it with the trunk's run through it.)
        #[cfg(debug_assertions)]
        let before_compact = (matches!(scenarios.list[first].1.script.get(step), Some(crate::scenario::Step::Compact)) && pending.iter().any(|&p| matches!(peers[p], Some(PeerBranch::Peer { .. }))))
            .then(|| (trunk.checkpoint(), measurer.state()));
        let before = trunk.checks().len();
        let (rows_before, refused, compactions) = (trunk.rows(), trunk.refused(), trunk.agent().compactions());
        trunk.step(&scenarios.list[first].1, &mut measurer, &effectives[top], &chain).map_err(|e| e.to_string())?;
        let high = trunk.checks()[before..].iter().map(|&(_, n)| n).max();
        let probed = trunk.agent_mut().take_peer_probe();
        // The step's main rows, each with what the mechanisms run dry would have reported on it
        // (one report list per main request made: else they are taken to act here).
        let main_rows: Vec<usize> = trunk.rows_from(rows_before).enumerate().filter(|(_, r)| r.lane == LANE_MAIN).map(|(i, _)| rows_before + i).collect();
        let lined_up = main_rows.len() == probed.reports.len();
        if lined_up {
            for (&row, reports) in main_rows.iter().zip(&probed.reports) {
                for (tag, report) in reports {
                    match dry_reports[*tag].last_mut() {
                        Some((at, list)) if *at == row => list.push(report.clone()),
                        _ => dry_reports[*tag].push((row, vec![report.clone()])),
                    }
                }
            }
        }
        // (Anything here a peer branch cannot prove it did the same: a compaction, an API error
        // and its recovery, a refused request.)
        let failed = trunk.refused() != refused || trunk.rows_from(rows_before).any(|r| r.error.is_some());
        let acted = trunk.agent().compactions() != compactions || failed;
        // But a user's `/compact` with no error is the same compaction under a peer mechanism
        // with autocompact off ([`PeerBranch::Peer`]): its strategy differs from the trunk's only
        // in autocompact's `enabled` and the mechanism (`peer_branch_of`). `enabled` is read by
        // the chain's autocompact and blocking-limit stages (and the thresholds they compute),
        // which `/compact` does not run; the mechanism by the requests the step builds (the
        // compaction's fork), which the probes read as every request (its count, its dry run);
        // the fork, its hooks and the rebuild read the settings both share. Such a branch stays
        // with the trunk (debug builds run it through the step on its own and compare).
        let manual = !failed && matches!(scenarios.list[first].1.script.get(step), Some(crate::scenario::Step::Compact));
        max_checked = max_checked.max(high);
        if let Some(high) = high {
            rise = high.saturating_sub(last_high.unwrap_or(high));
            last_high = Some(high);
        }
        // Strategies whose threshold this step's check reached go on from the last checkpoint;
        // peer branches from the last one before the step where they would act otherwise.
        let differs = |p: usize| match &peers[p] {
            None => high.is_some_and(|high| high >= thresholds[p]),
            Some(PeerBranch::Peer { blocking, peer }) => {
                (acted && !manual)
                    || high.is_some_and(|high| high >= thresholds[top].min(*blocking).min(top_blocking))
                    || match triggers[p] {
                        Some(t) => probed.counted.is_some_and(|n| n >= t),
                        None => !peer.dry_runs() || !lined_up || probed.rewrote.contains(&p),
                    }
            }
            Some(PeerBranch::McpDelta) => probed.mcp_instructions,
            // (Any request or chain count of the step at the trigger, or any edit the server
            // made: the clearing may act there. The chain counts before its stages report.)
            Some(PeerBranch::ContextEditing { trigger }) => {
                acted
                    || high.is_some_and(|high| high >= *trigger)
                    || trunk.rows_from(rows_before).any(|r| r.context_tokens >= *trigger || r.context_management.is_some() || r.stages.iter().any(|s| s.tokens_before >= *trigger))
            }
        };
        // (In place: on most steps no strategy is reached, and two new lists a step cost more
        // than the rest of this bookkeeping.)
        let mut reached = Vec::new();
        pending.retain(|&p| {
            let differs = differs(p);
            if differs {
                reached.push(p);
            }
            !differs
        });
        // (The peer branches that go on with the trunk through a `/compact`: counted for tests.)
        let through: Vec<usize> = if acted && manual { pending.iter().copied().filter(|&p| matches!(peers[p], Some(PeerBranch::Peer { .. }))).collect() } else { Vec::new() };
        THROUGH_COMPACT.with(|n| n.set(n.get() + through.len()));
        #[cfg(debug_assertions)]
        if let Some((state, measured)) = &before_compact {
            for &p in &through {
                let mut own = state.checkpoint();
                own.retarget(&effectives[p]);
                branch.restore(measured);
                own.step(&scenarios.list[first].1, &mut branch, &effectives[p], &chain).map_err(|e| e.to_string())?;
                let mut stayed = trunk.checkpoint();
                stayed.retarget(&effectives[p]);
                debug_assert!(own.shown_from(rows_before) == stayed.shown_from(rows_before), "a peer branch that stays with the trunk through a `/compact` did what the trunk did");
            }
        }
        if reached.iter().any(|&p| !dry(&[p]).is_empty()) {
            trunk.agent_mut().dry_run_peers(dry(&pending));
        }
        for p in reached {
            let from = latest.clone().ok_or("no checkpoint")?;
            let mut candidates = kept.clone();
            candidates.push(from);
            let effective = &effectives[p];
            let how = match peers[p] {
                None => Branch::Autocompact { trunk: thresholds[top], threshold: thresholds[p] },
                Some(_) => Branch::Peer { from_step: step },
            };
            if bounded(p) {
                // It goes on from here once the trunk's run has made its rule.
                deferred.push((p, candidates, how));
                continue;
            }
            let reports = &dry_reports[p];
            results[p] = Some(settle(session, prepared, effective, None, &mut FromCheckpoints { scenarios: &mut scenarios, measurer: &mut branch, first, candidates: &candidates, how, effective, stop: None, reports, end: None }));
        }
    }
    // The trunk's own result, and the strategies whose threshold it never reached: the trunk up
    // to its end.
    let end = checkpoint(&mut trunk, &mut measurer, max_checked);
    let compacted = trunk.take_compacted_requests();
    let trunk_refused = trunk.refused();
    let mirrors = trunk.take_mirrors();
    let trunk_output = trunk.finish(&scenarios.list[first].1, &measurer, &effectives[top]);
    let trunk_dropped = trunk_output.summary.info_loss.tokens_dropped;
    // (Kept for the strategies still to branch: they go on from the end.)
    let trunk_end = (!pending.is_empty()).then(|| TrunkEnd { checkpoint: end.clone(), output: trunk_output.clone(), compacted: compacted.clone() });
    let trunk_run = read_output(prepared, compacted, trunk_output);
    let mut candidates = kept.clone();
    candidates.push(end);
    let how = Branch::Autocompact { trunk: thresholds[top], threshold: thresholds[top] };
    let runs = &mut FromCheckpoints { scenarios: &mut scenarios, measurer: &mut branch, first, candidates: &candidates, how, effective: &effectives[top], stop: None, reports: &[], end: trunk_end.as_ref() };
    let read = read_run(prepared, &trunk_run, client_edits(&effectives[top]), first_plan(prepared, &effectives[top]).without_recorded_microcompacts);
    // (Where it holds, the trunk's run is the trunk strategy's: the mirrors' runs are its too.)
    let trunk_holds = holds(&first_plan(prepared, &effectives[top]), &read);
    results[top] = Some(settle_read(session, prepared, &effectives[top], Some((trunk_run, read)), runs));
    // The rule the bounded branches end under: the trunk's settled run's. (Where that run is
    // not the trunk's own and the trunk went past it, a checkpoint could be past it too, and a
    // branch would end later than the first step past it: they then go to their end.)
    let top_rule = match &results[top] {
        Some(Ok(outcome)) => Some(stop_rule_beyond(outcome)),
        _ => None,
    };
    let rule = top_rule.filter(|rule| trunk_dropped <= rule.tokens_dropped_above && trunk_refused <= rule.refused_above);
    // A mirrored strategy's own run: from the first call, a bounded one under the rule of the
    // trunk's settled run (as a preset run on its own ends beyond the run as recorded).
    let alone_rule = |p: usize| top_rule.filter(|_| bounded(p)).map_or(Stops::Never, Stops::Rule);
    let alone = |p: usize| agent_whatif_family_until(session, file, prepared, measurer.clone(), std::slice::from_ref(&effectives[p]), alone_rule(p)).and_then(|mut v| v.pop().ok_or_else(|| "no outcome".to_owned())).unwrap_or_else(Err);
    for (&(p, of), mut mirror) in mirrored.iter().zip(mirrors) {
        let compacted = of.tools_up_front.then(|| mirror.take_compacted_requests());
        let mirrored = match (&results[top], mirror.into_rows()) {
            (Some(Ok(outcome)), Ok(rows)) if trunk_holds => mirrored_outcome(session, prepared, &scenarios.list[first].1, &effectives[p], &measurer, outcome, rows, compacted),
            _ => None,
        };
        // (A bounded one ends under the rule only beyond the trunk's run, which its run is:
        // where its own counts are not beyond it either, its run goes to its end.)
        let within = |o: &AgentOutcome| match alone_rule(p) {
            Stops::Rule(rule) => o.info_loss.tokens_dropped <= rule.tokens_dropped_above && o.summary.blocked <= rule.refused_above,
            _ => true,
        };
        let outcome = match mirrored.filter(within) {
            Some(outcome) => {
                MIRRORED.with(|n| n.set(n.get() + 1));
                // Debug builds make the mirror's own run and compare.
                #[cfg(debug_assertions)]
                if let Ok(own) = alone(p) {
                    debug_assert_eq!(format!("{outcome:?}"), format!("{own:?}"), "a strategy measured beside the trunk is its own run");
                }
                Ok(outcome)
            }
            // (Not the mirror's run: it runs on its own.)
            None => alone(p),
        };
        results[p] = Some(outcome);
    }
    // (A bounded one whose rule the trunk went past cannot end under it from the checkpoints:
    // it runs on its own, as a preset run on its own ends beyond the run as recorded.)
    let past = |p: usize| bounded(p) && rule.is_none() && top_rule.is_some();
    for (p, candidates, how) in deferred {
        let effective = &effectives[p];
        let reports = &dry_reports[p];
        results[p] = Some(if past(p) { alone(p) } else { settle(session, prepared, effective, None, &mut FromCheckpoints { scenarios: &mut scenarios, measurer: &mut branch, first, candidates: &candidates, how, effective, stop: rule, reports, end: None }) });
    }
    for p in pending {
        let effective = &effectives[p];
        // (A peer branch that never acted otherwise is the trunk to its end.)
        let how = match peers[p] {
            None => Branch::Autocompact { trunk: thresholds[top], threshold: thresholds[p] },
            Some(_) => Branch::Peer { from_step: usize::MAX },
        };
        let stop = rule.filter(|_| bounded(p));
        let reports = &dry_reports[p];
        results[p] = Some(if past(p) { alone(p) } else { settle(session, prepared, effective, None, &mut FromCheckpoints { scenarios: &mut scenarios, measurer: &mut branch, first, candidates: &candidates, how, effective, stop, reports, end: trunk_end.as_ref() }) });
    }
    // Debug builds make each peer branch's own run and compare.
    #[cfg(debug_assertions)]
    for p in (0..effectives.len()).filter(|&p| peers[p].is_some()) {
        if let (Some(Ok(outcome)), Ok(own)) = (&results[p], alone(p)) {
            debug_assert_eq!(format!("{outcome:?}"), format!("{own:?}"), "a strategy that went on from the trunk is its own run");
        }
    }
    Ok(results.into_iter().map(|r| r.unwrap_or_else(|| Err("no result".to_owned()))).collect())
}

/// A strategy's runs going on from a family's checkpoints ([`run_from`]).
struct FromCheckpoints<'r, 'p> {
    scenarios: &'r mut Scenarios<'p>,
    measurer: &'r mut Measurer,
    first: usize,
    candidates: &'r [std::rc::Rc<Checkpoint>],
    how: Branch,
    effective: &'r Strategy,
    /// Where its runs end early ([`RunState::stop_when`]).
    stop: Option<StopRule>,
    /// A peer branch's reports on the trunk's main rows (by row) that the trunk, under no
    /// mechanism, did not make: what its mechanism run dry reported there.
    reports: &'r [(usize, Vec<crate::measure::StageReport>)],
    /// The trunk at its end, once it has run to there.
    end: Option<&'r TrunkEnd>,
}

impl Runs for FromCheckpoints<'_, '_> {
    fn run(&mut self, plan: &Plan) -> Result<Run, String> {
        run_from(self.scenarios, self.measurer, self.first, self.candidates, (self.how, self.reports), self.stop, self.effective, Going::Plan(plan), self.end).map(|(run, _)| run)
    }

    fn follow(&mut self) -> Result<Option<(Run, Follow)>, String> {
        let rules = self.scenarios.follow_rules(self.first, self.effective);
        let (run, follow) = run_from(self.scenarios, self.measurer, self.first, self.candidates, (self.how, self.reports), self.stop, self.effective, Going::Follow(rules), self.end)?;
        Ok(follow.map(|follow| (run, follow)))
    }
}

/// How a run goes by the recording: under a plan, or following it ([`Follow`]).
enum Going<'a> {
    Plan(&'a Plan),
    Follow(std::rc::Rc<FollowRules>),
}

/// A run under `effective` and `going` from the last of `candidates` it may go on from (else
/// from the start), measured by `measurer` from the checkpoint's state, with the [`Follow`] it
/// went by as the run left it. A run that follows the recording goes on from a checkpoint of
/// the first plan's run where it would have been that run so far ([`Follow::at`]), ended
/// early where `stop` holds.
#[expect(clippy::too_many_arguments, reason = "the family's runs and checkpoints, and how this one goes on from them")]
fn run_from(
    scenarios: &mut Scenarios<'_>,
    measurer: &mut Measurer,
    first: usize,
    candidates: &[std::rc::Rc<Checkpoint>],
    (how, reports): (Branch, &[(usize, Vec<crate::measure::StageReport>)]),
    stop: Option<StopRule>,
    effective: &Strategy,
    going: Going<'_>,
    end: Option<&TrunkEnd>,
) -> Result<(Run, Option<Follow>), String> {
    let prepared = scenarios.prepared;
    let index = match &going {
        Going::Plan(plan) => scenarios.get(plan)?,
        Going::Follow(_) => first,
    };
    let (scenario, model) = (&scenarios.list[index].1, &scenarios.list[index].2.model);
    let original = &scenarios.list[first].2.model;
    let mut ordered: Vec<&std::rc::Rc<Checkpoint>> = candidates.iter().collect();
    ordered.sort_by_key(|c| std::cmp::Reverse(c.state.next_step()));
    for c in ordered {
        match how {
            // Every check before it below both thresholds: nothing there depended on which.
            Branch::Autocompact { trunk, threshold } if threshold != trunk && c.max_checked.is_some_and(|n| n >= threshold.min(trunk)) => continue,
            Branch::Peer { from_step } if c.state.next_step() > from_step => continue,
            _ => {}
        }
        let follow = match &going {
            Going::Plan(_) if !c.state.world().model.resumable_with(original, model) => continue,
            Going::Plan(_) => None,
            Going::Follow(rules) => match Follow::at(rules.clone(), &mut c.state.rows_from(0), &c.state.world().model) {
                Some(follow) => Some(follow),
                None => continue,
            },
        };
        if matches!(how, Branch::Peer { .. }) && c.rows > 0 {
            PEER_BRANCH_RUNS.with(|n| n.set(n.get() + 1));
        }
        let going_on = |follow: Option<Follow>, measurer: &mut Measurer| -> Result<(Run, Option<Follow>), String> {
            let mut state = c.state.checkpoint();
            if follow.is_none() {
                state.world_mut().model.resume_with(original, model);
            }
            match how {
                Branch::Autocompact { .. } => state.retarget_autocompact(effective)?,
                Branch::Peer { .. } => state.retarget(effective),
            }
            if let Some(follow) = follow {
                state.set_reply_plan(Box::new(follow));
            }
            if let Some(rule) = stop {
                state.stop_when(rule);
            }
            measurer.restore(&c.measurer);
            finish_following(prepared, state, scenario, measurer, effective)
        };
        let (mut run, follow) = match end.filter(|end| std::rc::Rc::ptr_eq(&end.checkpoint, c) && c.state.next_step() >= scenario.script.len()) {
            Some(end) => {
                if let Branch::Autocompact { .. } = how {
                    c.state.autocompact_retargetable(effective)?;
                }
                let ended = end.run(prepared, scenario, effective, stop);
                // Debug builds go on from the end checkpoint the long way and compare.
                #[cfg(debug_assertions)]
                {
                    let shown = |run: &Run, follow: Option<&Follow>| format!("{:?}", (&run.output, &run.paired, &run.after, follow.map(Follow::shown)));
                    let long = going_on(follow.clone(), measurer).map(|(run, follow)| shown(&run, follow.as_ref()));
                    debug_assert_eq!(long, Ok(shown(&ended, follow.as_ref())), "a run with no step left is the trunk's at its end");
                }
                (ended, follow)
            }
            None => going_on(follow, measurer)?,
        };
        // The reports of a mechanism run dry on the trunk's rows before the checkpoint go where
        // the runner puts the peer's reports: after the chain's, before a context edit's the
        // measurement adds (the only stage it adds, and the only `context_editing` stage).
        for (row, add) in reports.iter().take_while(|(row, _)| *row < c.rows) {
            let row = &mut run.output.rows[*row];
            let measured = row.context_management.is_some() && row.stages.last().is_some_and(|s| s.fired && s.name == "context_editing");
            let at = row.stages.len() - usize::from(measured);
            // (Made at its size: the row's stages are the checkpoint's, which a change in
            // place would copy and then grow.)
            let mut stages = Vec::with_capacity(row.stages.len() + add.len());
            stages.extend_from_slice(&row.stages[..at]);
            stages.extend_from_slice(add);
            stages.extend_from_slice(&row.stages[at..]);
            row.stages = stages.into();
        }
        // The microcompact stage the strategy runs where the trunk's was disabled (server-side
        // tool-use clearing, [`PeerBranch::ContextEditing`]) found no trigger on the trunk's
        // rows before the checkpoint (its other paths off), with the same count.
        if matches!(how, Branch::Peer { .. }) && crate::agent::compact::chain::Stage::enabled(&crate::agent::compact::microcompact::Microcompact, &effective.compact) {
            let disabled = |s: &crate::measure::StageReport| s.name == "microcompact" && s.reason == "disabled_by_config";
            // (Read before writing: a row's stages are shared with the checkpoint's copy, and
            // are copied only where one changes.)
            for row in run.output.rows[..c.rows].iter_mut().filter(|row| row.stages.iter().any(disabled)) {
                for stage in row.stages.iter_mut().filter(|s| disabled(s)) {
                    stage.reason = "no trigger".into();
                }
            }
        }
        match how {
            Branch::Peer { .. } if effective.compact.autocompact.enabled => {}
            Branch::Peer { .. } => {
                // The trunk's rows before the checkpoint say what its autocompact and blocking
                // checks found; autocompact off, the check is skipped and the blocking check is
                // the strategy's own, on the same count (below its limit there: else the branch
                // would have gone on from an earlier checkpoint).
                let blocking = prepared.threshold_world().thresholds(effective).blocking;
                let count_of = |s: &crate::measure::StageReport| s.reason.strip_prefix("below threshold (").and_then(|r| r.split(' ').next()).and_then(|n| n.parse::<u64>().ok());
                // (Read before writing, as above: a row changes only where its autocompact check
                // counted.)
                for row in run.output.rows[..c.rows].iter_mut().filter(|row| row.stages.iter().any(|s| !s.fired && s.name == "autocompact" && count_of(s).is_some())) {
                    let mut counted = None;
                    for stage in row.stages.iter_mut().filter(|s| !s.fired) {
                        if stage.name == "autocompact" {
                            counted = count_of(stage);
                            if counted.is_some() {
                                stage.reason = "auto-compact disabled".into();
                            }
                        } else if stage.name == "blocking_limit"
                            && let Some(n) = counted.take()
                            && (stage.reason == "reactive compact owns overflow" || stage.reason.starts_with("under blocking limit ("))
                        {
                            stage.reason = crate::shared::counted_against("under blocking limit (", n, " < ", blocking).into();
                        }
                    }
                }
            }
            // The trunk's rows before the checkpoint name the trunk's threshold where autocompact
            // found the count below it; below this strategy's too, they name that one.
            Branch::Autocompact { trunk, threshold } if threshold != trunk => {
                let (suffix, replaced) = (format!(" < {trunk})"), format!(" < {threshold})"));
                let below = |s: &crate::measure::StageReport| s.name == "autocompact" && !s.fired && s.reason.starts_with("below threshold (") && s.reason.ends_with(&suffix);
                // (Read before writing, as above.)
                for row in run.output.rows[..c.rows].iter_mut().filter(|row| row.stages.iter().any(below)) {
                    for stage in row.stages.iter_mut().filter(|s| below(s)) {
                        // (A below-threshold reason is formatted, so owned: no copy here.)
                        let reason = stage.reason.to_mut();
                        reason.truncate(reason.len() - suffix.len());
                        reason.push_str(&replaced);
                    }
                }
            }
            Branch::Autocompact { .. } => {}
        }
        return Ok((run, follow));
    }
    Err("no checkpoint to go on from (the start is one)".to_owned())
}

/// The scenarios of the plans a family ran, each parsed once, with its model as built (the
/// first plan's from [`Prepared`], parsed once for every family of the session).
struct Scenarios<'p> {
    prepared: &'p Prepared,
    file: &'p str,
    list: Vec<(Plan, std::sync::Arc<Scenario>, std::sync::Arc<crate::scenario::BuiltScript>)>,
    /// The [`FollowRules`] made so far, each with the position in `list` of the plan whose
    /// model it was made of ([`Scenarios::follow_rules`]).
    follow: Vec<(usize, std::rc::Rc<FollowRules>)>,
}

impl<'p> Scenarios<'p> {
    fn new(prepared: &'p Prepared, file: &'p str) -> Self {
        Scenarios { prepared, file, list: Vec::new(), follow: Vec::new() }
    }

    /// The [`FollowRules`] of `effective` for the model of plan `index` of `list`: made once
    /// for the family's strategies that read the same of a strategy (whether they leave the
    /// recorded microcompacts out, whether their context editing is the client's).
    fn follow_rules(&mut self, index: usize, effective: &Strategy) -> std::rc::Rc<FollowRules> {
        let model = &self.list[index].2.model;
        let (left_out, client_edits) = FollowRules::of_strategy(self.prepared, effective);
        if let Some((_, rules)) = self.follow.iter().find(|(i, rules)| *i == index && rules.left_out == left_out && rules.client_edits == client_edits) {
            debug_assert!(**rules == FollowRules::new(self.prepared, effective, model), "the rules made for another strategy are this one's");
            return rules.clone();
        }
        let rules = std::rc::Rc::new(FollowRules::new(self.prepared, effective, model));
        self.follow.push((index, rules.clone()));
        rules
    }

    fn get(&mut self, plan: &Plan) -> Result<usize, String> {
        if let Some(i) = self.list.iter().position(|(p, _, _)| p == plan) {
            return Ok(i);
        }
        // (The parsed first plan kept for every family is the one that applies the recorded
        // microcompacts.)
        let first = *plan == plan_start(self.prepared, false);
        let (scenario, model) = match self.prepared.first.get() {
            Some((scenario, model)) if first => (scenario.clone(), model.clone()),
            _ => {
                let scenario = planned_scenario(self.prepared, self.file, plan)?;
                let script = scenario.built_script();
                let built = (std::sync::Arc::new(scenario), std::sync::Arc::new(script));
                if first {
                    // (Another family may have set it meanwhile, to the same.)
                    let _ = self.prepared.first.set(built.clone());
                }
                built
            }
        };
        self.list.push((plan.clone(), scenario, model));
        Ok(self.list.len() - 1)
    }
}

/// The information loss of each of a run's `compactions` that a main request followed, judged
/// as `judgement` says: `after` holds that request's messages by call, `context_of` each main
/// call's context.
fn compaction_losses(
    session: &ImportedSession,
    judgement: Judgement,
    compactions: &[Compacted],
    after: &BTreeMap<usize, Vec<Message>>,
    context_of: &BTreeMap<usize, u64>,
) -> Vec<CompactionLoss> {
    let position: BTreeMap<usize, usize> = session.calls.iter().enumerate().map(|(p, c)| (c.index, p)).collect();
    let mut losses = Vec::new();
    for c in compactions {
        let (Some(after), Some(&at)) = (after.get(&c.call), position.get(&c.call)) else { continue };
        // The main call before it that the agent answered.
        let Some((&previous_call, &before)) = context_of.range(..c.call).next_back() else { continue };
        let Some(&previous) = position.get(&previous_call) else { continue };
        let after_tokens = context_of.get(&c.call).copied().unwrap_or(0);
        losses.push(compaction_loss(session, at, previous, after, before, after_tokens, judgement));
    }
    losses
}

/// The agent's compactions in a run, the divergence from the recording, and the `compact`-lane
/// replies its compactions should take.
fn read_run(prepared: &Prepared, run: &Run, client_edits: bool, without_recorded_microcompacts: bool) -> Reading {
    let mut compactions = Vec::new();
    let mut rewrites: Vec<(usize, String)> = Vec::new();
    for &(row, call) in &run.paired {
        for stage in run.output.rows[row].stages.iter().filter(|s| s.fired) {
            if crate::runner::COMPACTION_STAGES.contains(&&*stage.name) {
                compactions.push(Compacted { call, stage: stage.name.to_string(), tokens_before: stage.tokens_before, recorded_summary: false });
            } else if REWRITE_STAGES.contains(&&*stage.name) && stage.tokens_after < stage.tokens_before && !(client_edits && stage.name == "context_editing") {
                // (A stage that fired but removed nothing, e.g. a context edit that cleared no
                // tool use, left the conversation as recorded.)
                rewrites.push((call, format!("the agent's {} stage rewrote the conversation ({})", stage.name, stage.reason)));
            }
        }
    }
    // The first call where the agent's history and the recorded one part.
    let mut candidates = rewrites;
    if without_recorded_microcompacts && let Some(&call) = microcompact_calls(prepared).first() {
        candidates.push((call, "the recorded microcompact was left out (replay_recorded_microcompact = false): the tool results it cleared stay in view".to_owned()));
    }
    for c in &compactions {
        if !prepared.recorded.iter().any(|r| r.call == c.call) {
            candidates.push((c.call, format!("the agent compacted ({}, at {} tokens) where the recording did not", c.stage, c.tokens_before)));
        }
    }
    for r in &prepared.recorded {
        if !compactions.iter().any(|c| c.call == r.call) {
            candidates.push((r.call, format!("the recording compacted ({}) where the agent did not", r.trigger)));
        }
    }
    candidates.sort_by_key(|(call, _)| *call);
    let divergence = candidates.into_iter().next();
    // Each compaction that takes a `compact`-lane reply: the recorded summary of an unused
    // recorded compaction within one call, else the stand-in.
    let mut used = vec![false; prepared.recorded.len()];
    let mut lane = Vec::new();
    for c in &mut compactions {
        if c.stage == "session_memory_compact" {
            continue;
        }
        let matched = matching_summary(prepared.recorded.iter().map(|r| (r.call, r.summary.is_some())), &used, c.call);
        match matched {
            Some(i) => {
                used[i] = true;
                c.recorded_summary = true;
                lane.push(prepared.recorded[i].summary.clone().expect("matched on a summary"));
            }
            None => lane.push(stand_in()),
        }
    }
    (compactions, divergence, lane)
}

fn outcome(session: &ImportedSession, prepared: &Prepared, run: Run, compactions: Vec<Compacted>, divergence: Option<(usize, String)>, runs: usize) -> AgentOutcome {
    let context_of: BTreeMap<usize, u64> = run.paired.iter().map(|&(row, call)| (call, run.output.rows[row].context_tokens)).collect();
    let compaction_losses = compaction_losses(session, prepared.losses, &compactions, &run.after, &context_of);
    AgentOutcome {
        info_loss: run.output.summary.info_loss.clone(),
        summary: run.output.summary,
        rows: run.output.rows,
        compactions,
        divergence,
        compaction_losses,
        runs,
        stopped: run.output.stopped.map(|why| (run.paired.last().map_or(0, |&(_, call)| call), why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn settings_compared_by_their_texts_compare_as_their_values(preset in 0usize..crate::strategy::presets::PRESETS.len(), other in 0usize..crate::strategy::presets::PRESETS.len(), fraction in prop_oneof![Just(0.0f64), Just(-0.0f64), Just(0.01f64), Just(f64::NAN), any::<f64>()], same_fraction in any::<bool>(), ttl in any::<bool>()) {
            let mut a = crate::strategy::Strategy::preset(crate::strategy::presets::PRESETS[preset].id).expect("a shipped preset");
            let mut b = crate::strategy::Strategy::preset(crate::strategy::presets::PRESETS[other].id).expect("a shipped preset");
            a.skill_listing_budget_fraction = fraction;
            // Equal as values, spelled apart in the texts: 0.0 and -0.0.
            b.skill_listing_budget_fraction = if same_fraction { -fraction } else { fraction };
            if ttl {
                b.ttl_main = a.ttl_main.clone();
            }
            let values = serde_json::to_value(&a).ok().zip(serde_json::to_value(&b).ok()).map(|(x, y)| x == y);
            prop_assert_eq!(same_settings(&a, &b), values);
            // (A NaN is no value equal to itself, but one `null` of JSON.)
            prop_assert_eq!(same_settings(&a, &a.clone()), Some(true));
        }
    }
}
