//! Recorded subagents in a workload: each Agent (or, before 2.1.x, Task) call of the main thread
//! bound to the subagent transcript that recorded its run, so that the agent runs the subagent
//! with its own machinery (`agent/session_subagent.rs`: the subagent's system prompt, tools and
//! layout) and the recorded replies answer its requests.
//!
//! A call is bound to a recorded subagent lane (`subagent:<agentId>`, from
//! `<session>/subagents/agent-<agentId>.jsonl` or sidechain records) by, in this order:
//! 1. `tool_use_id`: the lane's own record of the call that started it (its `.meta.json`
//!    `toolUseId`, or the main file's `agent_progress` records' `parentToolUseID`,
//!    [`crate::recording::SubagentInfo::tool_use_id`]);
//! 2. `agent_id`: the call's recorded result names the agent (`toolUseResult.agentId`);
//! 3. `prompt`: the lane's first prompt is the call's `prompt` input, word for word (a lane
//!    bound neither way, each lane bound once, calls in order).
//!
//! A bound subagent is driven when the agent knows its type (a built-in definition); its
//! replies are scripted on the agent's lane `subagent:<type>` in the order the main thread
//! called them, each followed by its tool results by tool_use id, and the call's own result in
//! the main thread stays the recorded one (`tool_output` with `subagent: true`). Every call not
//! driven and every recorded lane no call binds is reported per input ([`SubagentRun`],
//! [`super::WorkloadReport::unbound_subagent_lanes`]), never dropped silently.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::ContentBlock;
use crate::recording::format::LANE_MAIN;
use crate::recording::{EventKind, ImportedSession};

use super::{WorkloadReport, prompt_text, reply_step, result_output};

/// Names the main thread's subagent tool has had: `Task` until 2.1.x renamed it `Agent`.
const AGENT_TOOLS: [&str; 2] = ["Agent", "Task"];

/// One Agent call of the main thread and what the workload did with its recorded subagent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentRun {
    /// The main thread's Agent call.
    pub tool_use_id: String,
    /// `subagent_type` of the call (`general-purpose` when it names none).
    pub agent_type: String,
    /// The recorded lane bound to the call (`subagent:<agentId>`), when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_lane: Option<String>,
    /// The agent its recorded result names (`toolUseResult.agentId`), when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// How it was bound: `tool_use_id`, `agent_id` or `prompt` (module docs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_by: Option<String>,
    /// Replies scripted on the agent's lane and tool results returned by id.
    pub replies: usize,
    pub tool_outputs: usize,
    /// Why the recorded subagent is not driven (the call keeps its recorded result and no
    /// subagent request is made); `None` when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_driven: Option<String>,
}

/// The recorded subagents a workload drives.
#[derive(Debug, Clone, Default)]
pub(super) struct Subagents {
    /// Per Agent call of the main thread, in call order.
    pub runs: Vec<SubagentRun>,
    /// Recorded lanes no Agent call binds, with why.
    pub unbound: Vec<String>,
    /// Lanes whose events the workload scripts (the driven ones).
    driven_lanes: BTreeSet<String>,
}

impl Subagents {
    /// Binds every Agent call of `session`'s main thread to its recorded subagent lane (module
    /// docs) and decides which are driven.
    pub fn bind(session: &ImportedSession) -> Self {
        let events = &session.recording.events;
        // The main thread's Agent calls, in order, with their inputs.
        let mut calls: Vec<(String, Value)> = Vec::new();
        let mut seen = BTreeSet::new();
        // Recorded lanes: their first prompt and whether they hold a reply.
        let mut lanes: BTreeMap<String, (Option<String>, usize)> = BTreeMap::new();
        // Agent call → the agent its recorded result names.
        let mut named: BTreeMap<String, String> = BTreeMap::new();
        for event in events {
            let lane = event.lane.as_str();
            match &event.kind {
                EventKind::ModelReply(reply) if lane == LANE_MAIN => {
                    for block in &reply.content {
                        if let ContentBlock::ToolUse { id, name, input, .. } = block
                            && AGENT_TOOLS.contains(&name.as_str())
                            && seen.insert(id.clone())
                        {
                            calls.push((id.clone(), input.clone()));
                        }
                    }
                }
                EventKind::ToolResult(result) if lane == LANE_MAIN => {
                    if let Some(agent) = result.tool_use_result.as_ref().and_then(|r| r.get("agentId")).and_then(Value::as_str) {
                        named.insert(result.tool_use_id.clone(), format!("subagent:{agent}"));
                    }
                }
                EventKind::UserPrompt(prompt) if lane.starts_with("subagent:") => {
                    let entry = lanes.entry(lane.to_owned()).or_default();
                    if entry.0.is_none() && !prompt.is_meta {
                        entry.0 = Some(prompt_text(&prompt.content));
                    }
                }
                EventKind::ModelReply(reply) if lane.starts_with("subagent:") => {
                    let entry = lanes.entry(lane.to_owned()).or_default();
                    if !reply.is_synthetic && !reply.is_api_error {
                        entry.1 += 1;
                    }
                }
                _ => {}
            }
        }
        let by_tool_use: BTreeMap<&str, &str> =
            session.recording.header.subagents.iter().filter_map(|s| Some((s.tool_use_id.as_deref()?, s.lane.as_str()))).collect();
        let known: BTreeSet<String> = crate::agent::agents::built_in_agents(true).into_iter().map(|a| a.agent_type).collect();
        let mut bound: BTreeSet<String> = BTreeSet::new();
        let mut out = Subagents::default();
        for (id, input) in &calls {
            let agent_type = input.get("subagent_type").and_then(Value::as_str).filter(|t| !t.trim().is_empty()).unwrap_or(crate::agent::agents::GENERAL_PURPOSE);
            let prompt = input.get("prompt").and_then(Value::as_str).unwrap_or_default();
            let free = |lane: &str| lanes.contains_key(lane) && !bound.contains(lane);
            let found = by_tool_use
                .get(id.as_str())
                .filter(|l| free(l))
                .map(|l| ((*l).to_owned(), "tool_use_id"))
                .or_else(|| named.get(id).filter(|l| free(l)).map(|l| (l.clone(), "agent_id")))
                .or_else(|| {
                    lanes.iter().find(|(lane, (first, _))| free(lane) && !prompt.is_empty() && first.as_deref() == Some(prompt)).map(|(l, _)| (l.clone(), "prompt"))
                });
            let mut run = SubagentRun {
                tool_use_id: id.clone(),
                agent_type: agent_type.to_owned(),
                recorded_lane: None,
                agent_id: named.get(id).map(|l| l.trim_start_matches("subagent:").to_owned()),
                bound_by: None,
                replies: 0,
                tool_outputs: 0,
                not_driven: None,
            };
            match found {
                None => {
                    run.not_driven = Some("no subagent transcript: no subagent file or sidechain matches its tool_use id, agentId or prompt".to_owned());
                }
                Some((lane, how)) => {
                    bound.insert(lane.clone());
                    run.bound_by = Some(how.to_owned());
                    if !known.contains(agent_type) {
                        run.not_driven = Some(format!("agent type `{agent_type}` has no definition the agent knows (only the built-ins are modelled)"));
                    } else if lanes[&lane].1 == 0 {
                        run.not_driven = Some("its transcript records no model reply".to_owned());
                    } else {
                        out.driven_lanes.insert(lane.clone());
                    }
                    run.recorded_lane = Some(lane);
                }
            }
            out.runs.push(run);
        }
        for lane in lanes.keys().filter(|l| !bound.contains(*l)) {
            out.unbound.push(format!("{lane}: no Agent call of the main thread matches its tool_use id, agentId or first prompt; not driven"));
        }
        out
    }

    /// Whether the call's recorded subagent is driven (its output gets `subagent: true`).
    pub fn drives_call(&self, tool_use_id: &str) -> bool {
        self.runs.iter().any(|r| r.tool_use_id == tool_use_id && r.not_driven.is_none())
    }

    /// Whether `text` is the `<task-notification>` of a driven subagent (it names the call's
    /// tool_use id), which an agent running subagents in the background produces itself.
    pub fn notifies(&self, text: &str) -> bool {
        let Some(rest) = text.trim_start().strip_prefix("<task-notification>") else { return false };
        let id = rest.split_once("<tool-use-id>").and_then(|(_, r)| r.split_once("</tool-use-id>")).map(|(id, _)| id.trim());
        id.is_some_and(|id| self.drives_call(id))
    }

    /// Whether `lane`'s events are scripted by [`Subagents::script`].
    pub fn drives_lane(&self, lane: &str) -> bool {
        self.driven_lanes.contains(lane)
    }

    /// The script steps of the driven subagents, in the order the main thread called them: per
    /// recorded reply an assistant step on the agent's lane `subagent:<type>`, then a
    /// `tool_output` step with the results recorded for its calls. Returns the steps and, per
    /// scripted reply, the agent's lane and the recorded call it stands for.
    pub fn script(
        &mut self,
        session: &ImportedSession,
        thinking_texts: &BTreeMap<String, String>,
        recorded_usage: bool,
        report: &mut WorkloadReport,
    ) -> (Vec<crate::scenario::raw::RawStep>, Vec<super::SubagentCall>) {
        let events = &session.recording.events;
        let call_index: BTreeMap<usize, usize> = session.calls.iter().map(|c| (c.event_index, c.index)).collect();
        let mut steps = Vec::new();
        let mut calls = Vec::new();
        for run in self.runs.iter_mut().filter(|r| r.not_driven.is_none()) {
            let Some(lane) = run.recorded_lane.clone() else { continue };
            let agent_lane = format!("subagent:{}", run.agent_type);
            let results: BTreeMap<&str, &crate::recording::format::ToolResult> = events
                .iter()
                .filter(|e| e.lane == lane)
                .filter_map(|e| match &e.kind {
                    EventKind::ToolResult(result) => Some((result.tool_use_id.as_str(), result)),
                    _ => None,
                })
                .collect();
            for (event_index, event) in events.iter().enumerate().filter(|(_, e)| e.lane == lane) {
                let EventKind::ModelReply(reply) = &event.kind else { continue };
                if reply.is_synthetic || reply.is_api_error {
                    *report.left_to_agent.entry("subagent_synthetic_or_error_reply".to_owned()).or_default() += 1;
                    continue;
                }
                let mut called = BTreeMap::new();
                let rough_tokens = session.reference_memo().rough(event_index, || crate::replay::triggers::event_rough_tokens(&event.kind));
                let Some(mut step) = reply_step(reply, rough_tokens, thinking_texts, recorded_usage, report, &mut called) else {
                    *report.left_to_agent.entry("subagent_empty_reply".to_owned()).or_default() += 1;
                    continue;
                };
                step.lane = Some(agent_lane.clone());
                steps.push(step);
                calls.push(super::SubagentCall {
                    lane: agent_lane.clone(),
                    index: call_index.get(&event_index).copied().unwrap_or(event_index),
                    tool_use_id: run.tool_use_id.clone(),
                });
                run.replies += 1;
                let mut outputs = indexmap::IndexMap::new();
                for id in called.keys() {
                    match results.get(*id) {
                        Some(result) => {
                            outputs.insert((*id).to_owned(), result_output(result));
                            run.tool_outputs += 1;
                        }
                        None => *report.left_to_agent.entry("subagent_tool_use_without_result".to_owned()).or_default() += 1,
                    }
                }
                if !outputs.is_empty() {
                    steps.push(crate::scenario::raw::RawStep { tool_output: Some(outputs), ..Default::default() });
                }
            }
        }
        (steps, calls)
    }
}
