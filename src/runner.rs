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
    let err = |step: usize, message: String| RunError::Script { file: scenario.file.clone(), step, message };

    for (i, step) in scenario.script.iter().enumerate() {
        match step {
            Step::User { text } => {
                turn += 1;
                agent.user_prompt(text, &mut world);
            }
            Step::Assistant(reply_step) if reply_step.lane == "main" => {
                let (request, events) = agent.build_request(&world);
                pending_events.extend(events);
                let reply = world.model.next_reply("main").map_err(|e| err(i, e.to_string()))?;
                let first_token_ms = reply.latency.map_or(0, |l| l.first_token_ms);
                let mut input = MeasureInput::new("main", world.clock.now_ms(), &request);
                input.turn = turn;
                input.events = std::mem::take(&mut pending_events);
                input.output_tokens = reply.output_tokens;
                input.first_token_ms = first_token_ms;
                input.recorded_usage = reply.usage.clone().filter(|u| *u != Usage::default());
                let row = measurer.measure(input).map_err(|e| err(i, e.to_string()))?;
                rows.push(row);
                requests.push(request);
                world.clock.advance(reply.latency.map_or(0, |l| l.total_ms));
                // Events of the reply's tools are kept by the session for the next request.
                agent.apply_reply(&reply, &mut world);
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
    let summary = Summary::from_rows(&scenario.file, &strategy.name, measurer.counter().kind().name(), &rows, 0);
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
