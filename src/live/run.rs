//! `ctxsim live`: the agent on a scenario with the scripted model replaced by the Messages API.
//!
//! The scenario gives the world and the user's side (prompts, waits, file edits, MCP and
//! plugin steps); its `assistant` steps are ignored: each user prompt starts a turn whose model
//! calls go to the API until a reply stops calling tools (or `max_calls_per_turn` is reached).
//! Tools run in the World as in a simulation. Subagent requests (the Agent tool) go to the API
//! too. Forks the long-context chain makes (compaction, session memory) and hook questions are
//! answered as in a simulation (scripted or synthesized) and only measured: ours, to keep the
//! live path to the calls whose replies steer the conversation.
//!
//! Every request is measured before its answer is known (the estimate) and compared with the
//! usage the API reported (the actual). Time is virtual: a call takes `call_ms`; the request's
//! virtual time is sent as `x-ctxsim-time-ms`, so a `ctxsim serve` backend measures at the same
//! times and agrees with the estimate exactly.

use serde::Serialize;

use crate::agent::compact::Chain;
use crate::agent::session::{ForkAnswer, ModelCalls, Session, SideCall};
use crate::api::{ContentBlock, MessageContent, Request, Role, StopReason, Usage};
use crate::measure::{MeasureInput, Measurer, RequestMetrics, Summary};
use crate::recording::format::{Event, EventKind, Events, Header, ModelReply, Recording, SystemEvent, TimeAdvance, ToolResult, UserPrompt};
use crate::runner::{absolute, apply_world_step};
use crate::scenario::{Scenario, Step};
use crate::strategy::Strategy;
use crate::world::{Fallback, ScriptedModel, Synthesis};
use crate::world::{Reply, World};

use super::client::{LiveError, MessagesApi};

/// How a live run goes.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// Replaces the scenario's model.
    pub model: Option<String>,
    /// Model calls of one turn before it is cut (a model that never stops calling tools).
    pub max_calls_per_turn: usize,
    /// Virtual ms one call takes.
    pub call_ms: u64,
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions { model: None, max_calls_per_turn: 25, call_ms: 1000 }
    }
}

/// One request: the estimate (the measured row) and what the API reported.
#[derive(Debug, Clone, Serialize)]
pub struct LiveCall {
    pub row: RequestMetrics,
    /// `None` for a request that was only measured (a fork answered in simulation).
    pub actual: Option<Usage>,
}

/// What a live run produced.
#[derive(Debug, Clone)]
pub struct LiveOutput {
    pub calls: Vec<LiveCall>,
    pub recording: Recording,
    pub summary: Summary,
}

#[derive(Debug, thiserror::Error)]
pub enum LiveRunError {
    #[error("{file}: script[{step}]: {message}")]
    Script { file: String, step: usize, message: String },
    #[error("{file}: script[{step}]: {source}")]
    Api { file: String, step: usize, source: LiveError },
    #[error("{file}: strategy `{strategy}`: {message}")]
    Strategy { file: String, strategy: String, message: String },
}

/// Called after every answered API call with the recording and the calls so far, so what was
/// paid for is on disk before the next call can fail.
pub type Checkpoint<'a> = &'a mut dyn FnMut(&Recording, &[LiveCall]) -> std::io::Result<()>;

/// The run's state shared by the main loop and the subagent calls.
struct Live<'a> {
    checkpoint: Checkpoint<'a>,
    header: Header,
    api: &'a mut dyn MessagesApi,
    measurer: &'a mut Measurer,
    options: &'a LiveOptions,
    calls: Vec<LiveCall>,
    events: Events,
    turn: u32,
    /// The API error that ended a subagent's call (`ModelCalls` speaks in strings).
    api_error: Option<LiveError>,
}

impl Live<'_> {
    /// Sends a request on `lane`, measures it, records the reply; the clock moves by `call_ms`.
    fn call(&mut self, lane: &str, request: &Request, events: Vec<String>, world: &mut World) -> Result<(Reply, Usage), LiveError> {
        let time_ms = world.clock.now_ms();
        let answer = self.api.send(request, time_ms)?;
        let actual = answer.response.usage.clone();
        let mut input = MeasureInput::new(lane, time_ms, request);
        input.turn = self.turn;
        input.events = events;
        input.output_tokens = actual.output_tokens;
        input.recorded_usage = Some(actual.clone());
        let row = self.measurer.measure(input).map_err(|e| LiveError::Malformed(e.to_string()))?;
        let response = answer.response;
        let stop_reason = response.stop_reason.unwrap_or(StopReason::EndTurn);
        let mut event = Event::new(
            EventKind::ModelReply(ModelReply {
                content: response.content.clone().into(),
                stop_reason: response.stop_reason,
                model: response.model.clone(),
                version: None,
                usage: actual.clone(),
                request_id: answer.request_id,
                request_ref: None,
                message_id: Some(response.id.clone()),
                thinking_text_stored: true,
                is_synthetic: false,
                is_api_error: false,
            }),
            time_ms,
        );
        event.lane = lane.to_owned();
        self.events.push(event);
        self.calls.push(LiveCall { row, actual: Some(actual.clone()) });
        let so_far = Recording { header: self.header.clone(), events: self.events.clone() };
        (self.checkpoint)(&so_far, &self.calls).map_err(|e| LiveError::Checkpoint(e.to_string()))?;
        world.clock.advance(self.options.call_ms);
        let reply = Reply { content: response.content.into(), stop_reason, usage: Some(actual.clone()), latency: None, output_tokens: actual.output_tokens, synthetic: false };
        Ok((reply, actual))
    }

    /// Forks answered in simulation: measured only.
    fn side(&mut self, calls: Vec<SideCall>, world: &mut World) -> Result<(), String> {
        for call in calls {
            if call.concurrent {
                self.measurer.restart_lane(&call.lane);
            }
            let mut input = MeasureInput::new(&call.lane, call.time_ms, &call.request);
            input.turn = self.turn;
            input.output_tokens = call.reply.output_tokens;
            let row = self.measurer.measure(input).map_err(|e| e.to_string())?;
            self.calls.push(LiveCall { row, actual: None });
            if !call.concurrent {
                world.clock.advance(call.reply.latency.map_or(0, |l| l.total_ms));
            }
        }
        Ok(())
    }

    /// Tool results the request carries for the tool calls of the previous reply, recorded.
    fn record_tool_results(&mut self, request: &Request, pending: &mut Vec<String>, time_ms: u64) {
        let blocks = request.messages.iter().filter(|m| m.role == Role::User).flat_map(|m| match &m.content {
            MessageContent::Blocks(blocks) => blocks.as_slice(),
            MessageContent::Text(_) => &[],
        });
        for block in blocks {
            // Normalized history keeps the client's key order (finalized, or as a raw value:
            // agent/normalize.rs).
            let value = match block {
                ContentBlock::ToolResult { .. } => serde_json::to_value(block).expect("blocks serialize"),
                ContentBlock::FinalToolResult { .. } => block.wire_value().expect("a tool_result has a wire form"),
                ContentBlock::Other(value) if value["type"] == "tool_result" => value.clone(),
                _ => continue,
            };
            let Some(tool_use_id) = value["tool_use_id"].as_str() else { continue };
            let Some(i) = pending.iter().position(|id| id == tool_use_id) else { continue };
            pending.remove(i);
            let result = ToolResult {
                tool_use_id: tool_use_id.to_owned(),
                content: serde_json::from_value(value["content"].clone()).ok(),
                is_error: value["is_error"].as_bool().unwrap_or(false),
                tool_use_result: None,
            };
            self.events.push(Event::new(EventKind::ToolResult(result), time_ms));
        }
    }
}

impl ModelCalls for Live<'_> {
    fn lane_started(&mut self, lane: &str) {
        self.measurer.restart_lane(lane);
    }

    fn call(&mut self, lane: &str, request: Request, events: Vec<String>, world: &mut World) -> Result<(Reply, Usage), String> {
        Live::call(self, lane, &request, events, world).map_err(|e| {
            let message = e.to_string();
            self.api_error = Some(e);
            message
        })
    }

    fn side(&mut self, calls: Vec<SideCall>, world: &mut World) -> Result<(), String> {
        Live::side(self, calls, world)
    }

    /// Chain forks stay simulated (`runner::measure_fork`).
    fn fork(&mut self, lane: &str, _thread: &str, request: Request, events: Vec<String>, window: u64, fallback: Reply, world: &mut World) -> Result<ForkAnswer, String> {
        let (row, answer) = crate::runner::measure_fork(self.measurer, &mut [], crate::recording::format::LANE_MAIN, lane, &request, events, window, fallback, world, self.turn)?;
        self.calls.push(LiveCall { row, actual: None });
        Ok(answer)
    }
}

/// Runs `scenario` live against `api`.
pub fn run_live(scenario: &Scenario, measurer: &mut Measurer, strategy: &Strategy, api: &mut dyn MessagesApi, options: &LiveOptions) -> Result<LiveOutput, LiveRunError> {
    run_live_with(scenario, measurer, strategy, api, options, &mut |_, _| Ok(()))
}

/// [`run_live`], calling `checkpoint` after every answered call.
pub fn run_live_with(
    scenario: &Scenario,
    measurer: &mut Measurer,
    strategy: &Strategy,
    api: &mut dyn MessagesApi,
    options: &LiveOptions,
    checkpoint: Checkpoint<'_>,
) -> Result<LiveOutput, LiveRunError> {
    let mut world = scenario.into_world();
    if let Some(model) = &options.model {
        world.model_id = model.clone();
    }
    // Forks the chain makes are answered in simulation; unscripted, they are synthesized.
    world.model = std::mem::replace(&mut world.model, ScriptedModel::new(world.rng.fork("live")))
        .with_fallback(Fallback::Synthesize(Synthesis { after_script_ends: true, ..Synthesis::default() }));
    crate::agent::plugins::configure_project_mcp(&mut world);
    let mut agent = Session::new(strategy, &world);
    crate::runner::check_strategy_for(agent.model_limits(&world), strategy)
        .map_err(|message| LiveRunError::Strategy { file: scenario.file.clone(), strategy: strategy.name.clone(), message })?;
    let script_err = |step: usize, message: String| LiveRunError::Script { file: scenario.file.clone(), step, message };
    for root in &scenario.world.plugins {
        agent.plugin_enable(&absolute(&world, root), &mut world).map_err(|e| script_err(0, e))?;
    }
    let chain = Chain::new();
    let mut header = Header::new("live");
    header.input = Some(scenario.file.clone());
    header.cwd = Some(world.cwd.clone());
    header.start_epoch_ms = Some(world.clock.epoch_unix_ms());
    let mut live = Live { checkpoint, header, api, measurer, options, calls: Vec::new(), events: Events::new(), turn: 0, api_error: None };
    let mut pending_events: Vec<String> = Vec::new();
    for (i, step) in scenario.script.iter().enumerate() {
        let api_err = |source: LiveError| LiveRunError::Api { file: scenario.file.clone(), step: i, source };
        match step {
            Step::User { text } => {
                live.turn += 1;
                live.events.push(Event::new(EventKind::UserPrompt(UserPrompt { content: MessageContent::Text(text.clone()), is_meta: false, is_compact_summary: false, permission_mode: None }), world.clock.now_ms()));
                agent.user_prompt(text, &mut world);
                let side_calls = agent.take_side_calls();
                live.side(side_calls, &mut world).map_err(|e| script_err(i, e))?;
                let mut pending_tools: Vec<String> = Vec::new();
                for call in 0.. {
                    if call == options.max_calls_per_turn {
                        live.events.push(Event::new(EventKind::SystemEvent(SystemEvent { subtype: "turn_cut".to_owned(), payload: serde_json::json!({"calls": call}) }), world.clock.now_ms()));
                        break;
                    }
                    let chain_run = agent.run_chain(&chain, &mut world, &mut live);
                    if let Some(error) = live.api_error.take() {
                        return Err(api_err(error));
                    }
                    let chain_run = chain_run.map_err(|e| script_err(i, e))?;
                    pending_events.extend(chain_run.events.iter().cloned());
                    if chain_run.blocked.is_some() {
                        break;
                    }
                    let (request, events) = agent.build_request_after_chain(&world, &chain_run);
                    pending_events.extend(events);
                    live.record_tool_results(&request, &mut pending_tools, world.clock.now_ms());
                    let (reply, usage) = live.call("main", &request, std::mem::take(&mut pending_events), &mut world).map_err(api_err)?;
                    let message_id = live.events.iter().rev().find_map(|e| match &e.kind {
                        EventKind::ModelReply(r) => r.message_id.clone(),
                        _ => None,
                    });
                    pending_tools = reply.content.iter().filter_map(|b| match b {
                        ContentBlock::ToolUse { id, .. } => Some(id.clone()),
                        _ => None,
                    }).collect();
                    let calls_tools = !pending_tools.is_empty();
                    let applied = agent.apply_reply(&reply, &mut world, &mut live);
                    if let Some(error) = live.api_error.take() {
                        return Err(api_err(error));
                    }
                    applied.map_err(|e| script_err(i, e))?;
                    let side_calls = agent.take_side_calls();
                    live.side(side_calls, &mut world).map_err(|e| script_err(i, e))?;
                    agent.note_usage(usage, message_id.unwrap_or_default(), world.clock.now_ms());
                    let extracted = agent.extract_session_memory(&mut world, &mut live);
                    if let Some(error) = live.api_error.take() {
                        return Err(api_err(error));
                    }
                    extracted.map_err(|e| script_err(i, e))?;
                    if !calls_tools || reply.stop_reason != StopReason::ToolUse {
                        // Background agents (2.1.332) that finished report back as user
                        // messages, and the model is asked again.
                        let notifications = agent.take_notifications();
                        if notifications.is_empty() {
                            break;
                        }
                        for text in notifications {
                            let content = MessageContent::Blocks(vec![ContentBlock::text(text)].into());
                            live.events.push(Event::new(EventKind::UserPrompt(UserPrompt { content, is_meta: false, is_compact_summary: false, permission_mode: None }), world.clock.now_ms()));
                        }
                    }
                }
            }
            Step::Wait { ms } => {
                world.clock.advance(*ms);
                live.events.push(Event::new(EventKind::Time(TimeAdvance { advance_ms: *ms }), world.clock.now_ms()));
            }
            Step::Clear => {
                agent.clear(&mut world);
                let side_calls = agent.take_side_calls();
                live.side(side_calls, &mut world).map_err(|e| script_err(i, e))?;
            }
            Step::Resume => {
                agent.resume(&mut world);
                let side_calls = agent.take_side_calls();
                live.side(side_calls, &mut world).map_err(|e| script_err(i, e))?;
            }
            Step::Compact => {
                // `/compact`: the summary request goes to the API like an automatic one.
                let run = agent.manual_compact(&chain, &mut world, &mut live);
                if let Some(error) = live.api_error.take() {
                    return Err(api_err(error));
                }
                pending_events.extend(run.map_err(|e| script_err(i, e))?.events);
            }
            Step::ModelSwitch { model } => {
                if options.model.is_none() {
                    world.model_id = model.clone();
                    pending_events.push(format!("model_changed:{model}"));
                }
            }
            // File, MCP, plugin and git steps act on the World as in a simulation; the API answers
            // instead of `assistant` steps, and scripted tool outputs are not used.
            other => apply_world_step(other, &mut agent, &mut world, &mut pending_events).map_err(|e| script_err(i, e))?,
        }
    }
    let rows: Vec<RequestMetrics> = live.calls.iter().map(|c| c.row.clone()).collect();
    let summary = Summary::from_rows(&scenario.file, &strategy.name, live.measurer.counter().kind().name(), &rows, 0);
    let recording = Recording { header: live.header, events: live.events };
    Ok(LiveOutput { calls: live.calls, recording, summary })
}

/// Relative error of an estimate, (estimate − actual) / actual; 0 when both are 0.
fn relative_error(estimate: u64, actual: u64) -> f64 {
    match actual {
        0 if estimate == 0 => 0.0,
        0 => 1.0,
        _ => (estimate as f64 - actual as f64) / actual as f64,
    }
}

/// Totals over the calls the API answered: (estimate, actual) per usage field and the errors.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LiveTotals {
    pub calls: usize,
    pub input: (u64, u64),
    pub cache_read: (u64, u64),
    pub cache_creation: (u64, u64),
    pub input_error: f64,
    pub cache_read_error: f64,
    pub cache_creation_error: f64,
}

pub fn live_totals(calls: &[LiveCall]) -> LiveTotals {
    let mut totals = LiveTotals::default();
    for call in calls {
        let Some(actual) = &call.actual else { continue };
        totals.calls += 1;
        totals.input.0 += call.row.input_tokens;
        totals.input.1 += actual.input_tokens;
        totals.cache_read.0 += call.row.cache_read_input_tokens;
        totals.cache_read.1 += actual.cache_read_input_tokens;
        totals.cache_creation.0 += call.row.cache_creation_input_tokens;
        totals.cache_creation.1 += actual.cache_creation_input_tokens;
    }
    totals.input_error = relative_error(totals.input.0, totals.input.1);
    totals.cache_read_error = relative_error(totals.cache_read.0, totals.cache_read.1);
    totals.cache_creation_error = relative_error(totals.cache_creation.0, totals.cache_creation.1);
    totals
}

/// One line per request: estimated usage next to the actual, then the totals' errors.
pub fn live_table(calls: &[LiveCall]) -> String {
    let mut out = String::from("  #  lane         read est/act         creation est/act      input est/act\n");
    for call in calls {
        let row = &call.row;
        let pair = |est: u64, act: Option<u64>| act.map_or(format!("{est:>9} / -        "), |a| format!("{est:>9} / {a:<9}"));
        let actual = call.actual.as_ref();
        out.push_str(&format!(
            "{:>3}  {:<12} {}  {}  {}\n",
            row.index,
            row.lane,
            pair(row.cache_read_input_tokens, actual.map(|a| a.cache_read_input_tokens)),
            pair(row.cache_creation_input_tokens, actual.map(|a| a.cache_creation_input_tokens)),
            pair(row.input_tokens, actual.map(|a| a.input_tokens)),
        ));
    }
    let t = live_totals(calls);
    out.push_str(&format!(
        "totals over {} answered calls: read {} / {} ({:+.1}%), creation {} / {} ({:+.1}%), input {} / {} ({:+.1}%)\n",
        t.calls, t.cache_read.0, t.cache_read.1, t.cache_read_error * 100.0, t.cache_creation.0, t.cache_creation.1, t.cache_creation_error * 100.0,
        t.input.0, t.input.1, t.input_error * 100.0,
    ));
    out
}
