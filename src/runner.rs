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
use crate::measure::{FlatRequest, MeasureInput, Measurer, RequestMetrics, Summary};
use crate::scenario::{Scenario, Step};
use crate::world::World;

use crate::agent::session::Session;
use crate::agent::compact::Chain;
use crate::strategy::Strategy;

/// Everything a run produced.
#[derive(Debug, Clone)]
pub struct RunOutput {
    pub scenario: String,
    pub rows: Vec<RequestMetrics>,
    /// The request bodies, in order (for `--dump-requests` and snapshots).
    pub requests: Vec<Request>,
    pub summary: Summary,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{file}: script[{step}]: {message}")]
    Script { file: String, step: usize, message: String },
}

/// Runs a scenario and measures every request.
pub fn run_scenario(scenario: &Scenario, measurer: &mut Measurer, strategy: &Strategy) -> Result<RunOutput, RunError> {
    run_scenario_with(scenario, measurer, strategy, &Chain::new())
}

/// Runs a scenario with a given long-context chain (e.g. with stages disabled by name).
pub fn run_scenario_with(scenario: &Scenario, measurer: &mut Measurer, strategy: &Strategy, chain: &Chain) -> Result<RunOutput, RunError> {
    let mut world = scenario.into_world();
    crate::agent::plugins::configure_project_mcp(&mut world);
    let mut agent = Session::new(strategy, &world);
    for root in &scenario.world.plugins {
        let root = absolute(&world, root);
        agent.plugin_enable(&root, &mut world).map_err(|e| RunError::Script { file: scenario.file.clone(), step: 0, message: e })?;
    }
    let mut rows = Vec::new();
    let mut requests = Vec::new();
    let mut turn = 0u32;
    let mut pending_events: Vec<String> = Vec::new();
    let mut blocked = 0u64;
    let err = |step: usize, message: String| RunError::Script { file: scenario.file.clone(), step, message };

    for (i, step) in scenario.script.iter().enumerate() {
        match step {
            Step::User { text } => {
                turn += 1;
                agent.user_prompt(text, &mut world);
            }
            Step::Assistant(reply_step) if reply_step.lane == "main" => {
                // The long-context chain runs first; its compaction forks are measured on
                // their own lane before the main request.
                let mut side_calls = Vec::new();
                let chain_run = agent.run_chain(chain, &mut world, &mut side_calls);
                pending_events.extend(chain_run.events.iter().cloned());
                for call in side_calls {
                    let mut input = MeasureInput::new(&call.lane, call.time_ms, &call.request);
                    input.turn = turn;
                    input.output_tokens = call.reply.output_tokens;
                    input.first_token_ms = call.reply.latency.map_or(0, |l| l.first_token_ms);
                    let row = measurer.measure(input).map_err(|e| err(i, e.to_string()))?;
                    rows.push(row);
                    requests.push(call.request);
                    world.clock.advance(call.reply.latency.map_or(0, |l| l.total_ms));
                }
                if let Some(reason) = &chain_run.blocked {
                    // The blocking limit ends the turn before the request is sent; the
                    // scripted reply for it is skipped.
                    blocked += 1;
                    let _ = world.model.next_reply("main");
                    pending_events.push(format!("blocked:{reason}"));
                    continue;
                }
                let (mut request, events) = agent.build_request(&world);
                pending_events.extend(events);
                if let Some(edits) = &chain_run.context_management {
                    request.context_management = Some(edits.clone());
                }
                let reply = world.model.next_reply("main").map_err(|e| err(i, e.to_string()))?;
                let first_token_ms = reply.latency.map_or(0, |l| l.first_token_ms);
                let mut input = MeasureInput::new("main", world.clock.now_ms(), &request);
                input.turn = turn;
                input.events = std::mem::take(&mut pending_events);
                input.output_tokens = reply.output_tokens;
                input.first_token_ms = first_token_ms;
                input.recorded_usage = reply.usage.clone().filter(|u| *u != Usage::default());
                input.stages = chain_run.reports;
                let row = measurer.measure(input).map_err(|e| err(i, e.to_string()))?;
                // The client trusts the usage the API reports: a scripted usage that states the
                // input side wins over the simulated one (that is how a scenario claims a big
                // context cheaply, as the real client's oracle does).
                let scripted = reply.usage.clone().filter(|u| u.prompt_tokens() > 0);
                let usage = scripted.unwrap_or(Usage {
                    input_tokens: row.input_tokens,
                    cache_creation_input_tokens: row.cache_creation_input_tokens,
                    cache_read_input_tokens: row.cache_read_input_tokens,
                    output_tokens: row.output_tokens,
                    ..Usage::default()
                });
                let message_id = format!("msg_{:04}", row.index);
                rows.push(row);
                requests.push(request);
                world.clock.advance(reply.latency.map_or(0, |l| l.total_ms));
                // Events of the reply's tools are kept by the session for the next request.
                agent.apply_reply(&reply, &mut world);
                agent.note_usage(usage, message_id, world.clock.now_ms());
            }
            Step::Assistant(_) => {}
            Step::ToolOutput(_) => {}
            Step::Wait { ms } => world.clock.advance(*ms),
            Step::WriteFile { path, content } => {
                let path = absolute(&world, path);
                world.fs.write(&path, content.clone(), &world.clock).map_err(|e| err(i, e.to_string()))?;
                pending_events.push(format!("file_edited_by_user:{path}"));
            }
            Step::RemoveFile { path } => {
                let path = absolute(&world, path);
                world.fs.remove(&path, &world.clock).map_err(|e| err(i, e.to_string()))?;
            }
            Step::McpConnect { server } => agent.mcp_connect(server, &mut world).map_err(|e| err(i, e))?,
            Step::McpDisconnect { server } => agent.mcp_disconnect(server, &mut world).map_err(|e| err(i, e))?,
            Step::McpListChanged { server, tools } => {
                agent.mcp_list_changed(server, tools.clone(), &mut world).map_err(|e| err(i, e))?
            }
            Step::PluginEnable { root } => agent.plugin_enable(root, &mut world).map_err(|e| err(i, e))?,
            Step::PluginReload => agent.plugin_reload(&mut world).map_err(|e| err(i, e))?,
        }
    }
    let summary = Summary::from_rows(&scenario.file, &strategy.name, measurer.counter().kind().name(), &rows, blocked);
    Ok(RunOutput { scenario: scenario.file.clone(), rows, requests, summary })
}

fn absolute(world: &World, path: &str) -> String {
    if path.starts_with('/') { path.to_owned() } else { format!("{}/{}", world.cwd.trim_end_matches('/'), path) }
}

/// Runs a scenario twice and names the first request whose bytes differ.
pub fn check_determinism(scenario: &Scenario, make_measurer: &dyn Fn() -> Measurer, strategy: &Strategy) -> Result<Option<String>, RunError> {
    let a = run_scenario(scenario, &mut make_measurer(), strategy)?;
    let b = run_scenario(scenario, &mut make_measurer(), strategy)?;
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
