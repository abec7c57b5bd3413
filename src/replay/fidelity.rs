//! The fidelity report: the replay of a real session against the usage the API billed.
//!
//! Per call: simulated context (input + cache read + cache creation) against the recorded one,
//! and the cache split. Per session (CONTRACT.md, "Fidelity JSON"): the mean absolute
//! percentage error of the context and its 90th percentile, signed relative errors of the
//! summed cache read, cache creation and cost, and the share of calls where simulation and
//! record agree on whether the cached prefix was read (`cache_read > 0`) and whether it was
//! mostly rewritten (`cache_creation > context / 2`); a call whose simulated read is the
//! recorded one (within [`READ_AGREES_WITHIN`]) agrees whichever side of that line its writes
//! fall: the simulation read the cache where the API did, and the rest is context error.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::measure::tokens::{Calibration, FamilyCalibration, FittedSession};
use crate::measure::ModelTable;

use super::session::{CallReplay, SessionReplay};

/// One compared call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallComparison {
    pub index: usize,
    pub lane: String,
    pub time_ms: u64,
    pub recorded_context: u64,
    pub simulated_context: u64,
    pub recorded_cache_read: u64,
    pub simulated_cache_read: f64,
    pub recorded_cache_creation: u64,
    pub simulated_cache_creation: f64,
    pub context_ape: f64,
    pub hit_agrees: bool,
    /// Milliseconds since the previous compared call of the lane group (0 for the first).
    #[serde(default)]
    pub gap_ms: u64,
    /// What the simulated context is made of: tools + system, the user-context reminder and
    /// the recorded messages as estimated.
    #[serde(default)]
    pub prefix_tokens: u64,
    #[serde(default)]
    pub user_context_tokens: u64,
    #[serde(default)]
    pub message_tokens: u64,
    /// Events the replay saw before the call (see [`CallReplay::events`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<String>,
    /// The N-pattern probability applied (see [`CallReplay::rerender_probability`]).
    #[serde(default)]
    pub rerender_probability: f64,
    /// The modelled rule this call's cache outcome rests on, if not on the record
    /// ([`super::uncertainty`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The simulated figures are of the request the transcript recorded sending
    /// (`api-request` records), not of a reconstruction.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_record: bool,
}

/// For a transcript that recorded its wire requests (2.1.2xx/3xx `api-request` records): how
/// many calls were measured on them, and why the others were reconstructed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequests {
    /// Compared calls measured on the recorded request: their figures measure the cache
    /// simulator alone.
    pub calls_from_records: usize,
    /// Compared calls whose request was reconstructed, one line each: `call N: why`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reconstructed: Vec<String>,
}

/// The per-session figures (CONTRACT.md "Fidelity JSON", plus a few more).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FidelityReport {
    pub input: String,
    pub requests_compared: usize,
    pub requests_skipped: usize,
    pub context_tokens_mape: f64,
    pub cache_read_total_error: f64,
    pub cache_creation_total_error: f64,
    pub hit_agreement: f64,
    pub cost_error: f64,
    pub estimator: String,
    /// What rebuilt the requests (`agent` or `replay`); filled by `ctxsim fidelity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    pub context_tokens_ape_p90: f64,
    pub recorded_cache_read: u64,
    pub simulated_cache_read: f64,
    pub recorded_cache_creation: u64,
    pub simulated_cache_creation: f64,
    pub recorded_cost_usd: f64,
    pub simulated_cost_usd: f64,
    /// Tools + system and user-context tokens inferred from the first main-lane call.
    pub prefix_tokens: u64,
    pub user_context_tokens: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<CallComparison>,
    /// The calls whose outcome rests on a modelled rule, and their share of the creation.
    #[serde(default)]
    pub modelled: super::uncertainty::Modelled,
    /// The range of Σcreation and cost the rules leave open; filled by `ctxsim fidelity
    /// --interval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<super::uncertainty::Interval>,
    /// Where the agent's autocompact threshold fires against the recorded compactions
    /// ([`super::triggers`]); filled by `ctxsim fidelity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_triggers: Option<super::triggers::TriggerReport>,
    /// Lines or records of the input that were skipped (file, line, field); filled by the
    /// caller that read the input.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<crate::recording::LineWarning>,
    /// Per-version profile entries the replay took from another version than the session's
    /// ([`SessionReplay::profile_notes`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub profile_notes: Vec<String>,
    /// Filled when the agent itself was driven by the session (`ctxsim fidelity --engine agent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentDriven>,
    /// Filled when the transcript recorded its wire requests ([`RecordedRequests`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_requests: Option<RecordedRequests>,
}

/// What driving the agent with a session gave, besides the usage compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentDriven {
    /// What the workload carried over from the recording and what it left to the agent.
    pub workload: super::workload::WorkloadReport,
    /// The compactions the agent made, by the recorded call they came before.
    pub compactions: Vec<super::workload::AgentCompaction>,
    /// Main requests not paired with a recorded call, or recorded calls not answered.
    pub unpaired: usize,
    /// The sizes the agent does not model and the filler standing for them.
    pub sizing: super::workload::Sizing,
    /// The figures per lane group (`main`, `subagent`): each scored on its own calls
    /// ([`lane_figures`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lanes: BTreeMap<String, LaneFigures>,
}

/// One lane group's figures: the session's, over that group's compared calls only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaneFigures {
    pub requests_compared: usize,
    pub context_tokens_mape: f64,
    pub context_tokens_ape_p90: f64,
    pub hit_agreement: f64,
    pub cache_read_total_error: f64,
    pub cache_creation_total_error: f64,
    pub cost_error: f64,
    pub recorded_cost_usd: f64,
    pub simulated_cost_usd: f64,
}

/// The lane group of a call: `subagent` for every `subagent:*` lane, else `main` (the
/// compaction fork's calls count with the main thread, as the gap and cache figures do).
pub fn lane_group(lane: &str) -> &'static str {
    if lane.starts_with("subagent:") { "subagent" } else { "main" }
}

/// The figures of `replay` per lane group ([`lane_group`]), each scored as a session of that
/// group's calls alone.
pub fn lane_figures(replay: &SessionReplay, table: &ModelTable) -> BTreeMap<String, LaneFigures> {
    let mut groups: BTreeMap<&str, crate::shared::SharedList<CallReplay>> = BTreeMap::new();
    for (i, call) in replay.calls.iter().enumerate() {
        groups.entry(lane_group(&call.lane)).or_default().push_shared(replay.calls.shared(i).clone());
    }
    groups
        .into_iter()
        .map(|(group, calls)| {
            let part = SessionReplay { calls, ..replay.clone() };
            let r = fidelity_for_session(&part, table, false);
            let figures = LaneFigures {
                requests_compared: r.requests_compared,
                context_tokens_mape: r.context_tokens_mape,
                context_tokens_ape_p90: r.context_tokens_ape_p90,
                hit_agreement: r.hit_agreement,
                cache_read_total_error: r.cache_read_total_error,
                cache_creation_total_error: r.cache_creation_total_error,
                cost_error: r.cost_error,
                recorded_cost_usd: r.recorded_cost_usd,
                simulated_cost_usd: r.simulated_cost_usd,
            };
            (group.to_owned(), figures)
        })
        .collect()
}

/// Through the agent: each session's figures per lane group, and its Agent calls whose recorded
/// subagent was not driven, with why (none silently left out).
pub fn agent_lanes_table(reports: &[FidelityReport]) -> String {
    let mut out = format!(
        "{:<44} {:<9} {:>6} {:>7} {:>7} {:>7} {:>9} {:>9} {:>8}\n",
        "session (through the agent)", "lane", "calls", "mape%", "p90%", "hit%", "read%", "create%", "cost%"
    );
    for r in reports {
        let Some(agent) = &r.agent else { continue };
        let name = std::path::Path::new(&r.input).file_name().map_or(r.input.clone(), |n| n.to_string_lossy().into_owned());
        for (lane, f) in &agent.lanes {
            out.push_str(&format!(
                "{:<44} {:<9} {}\n",
                name,
                lane,
                columns(f.requests_compared, f.context_tokens_mape, f.context_tokens_ape_p90, f.hit_agreement, f.cache_read_total_error, f.cache_creation_total_error, f.cost_error)
            ));
        }
        let runs = &agent.workload.subagents;
        let driven = runs.iter().filter(|s| s.not_driven.is_none()).count();
        if !runs.is_empty() || !agent.workload.unbound_subagent_lanes.is_empty() {
            out.push_str(&format!("  {name}: {driven} of {} Agent calls drive their recorded subagent\n", runs.len()));
        }
        for run in runs.iter().filter(|r| r.not_driven.is_none()) {
            out.push_str(&format!(
                "    {} ({}): driven from {} (bound by {}), {} replies, {} tool results\n",
                run.tool_use_id,
                run.agent_type,
                run.recorded_lane.as_deref().unwrap_or_default(),
                run.bound_by.as_deref().unwrap_or_default(),
                run.replies,
                run.tool_outputs
            ));
        }
        // The calls not driven, by reason (each call is listed in the JSON report).
        let mut reasons: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for run in runs {
            if let Some(why) = &run.not_driven {
                *reasons.entry((why.as_str(), run.agent_type.as_str())).or_default() += 1;
            }
        }
        for ((why, agent_type), n) in reasons {
            out.push_str(&format!("    {n} × {agent_type}: not driven: {why}\n"));
        }
        for lane in &agent.workload.unbound_subagent_lanes {
            out.push_str(&format!("    {lane}\n"));
        }
    }
    out
}

fn mostly_rewritten(creation: f64, context: f64) -> bool {
    creation * 2.0 > context
}

/// How close a simulated read must be to the recorded one, as a share of the recorded read, for
/// the call to agree on its hit whichever side of the 50% line its writes fall: the Σread target
/// (±2%) applied per call. A call that read and wrote about half each (9878 #0: 49.5% recorded,
/// 50.1% simulated, reads 22,033 and 22,037) is not a disagreement on where the cache broke.
pub const READ_AGREES_WITHIN: f64 = 0.02;

/// Whether simulation and record agree on a call's cache outcome: both read something or both
/// nothing, and either both mostly rewrote (or both did not) or they read the same prefix.
fn hit_agrees(rec_read: f64, rec_creation: f64, rec_context: f64, sim_read: f64, sim_creation: f64, sim_context: f64) -> bool {
    let rec_hit = rec_read > 0.0;
    let sim_hit = sim_read >= 0.5;
    if rec_hit != sim_hit {
        return false;
    }
    let same_side = mostly_rewritten(rec_creation, rec_context) == mostly_rewritten(sim_creation, sim_context);
    // Two calls that read nothing read the same prefix only in the trivial sense: the 50% line
    // still decides them.
    same_side || (rec_hit && (sim_read - rec_read).abs() <= READ_AGREES_WITHIN * rec_read)
}

fn relative(simulated: f64, recorded: f64) -> f64 {
    if recorded == 0.0 { if simulated == 0.0 { 0.0 } else { 1.0 } } else { (simulated - recorded) / recorded }
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// Compares one replayed session with its record. `with_calls` keeps the per-call rows.
pub fn fidelity_for_session(replay: &SessionReplay, table: &ModelTable, with_calls: bool) -> FidelityReport {
    let mut calls = Vec::new();
    let mut skipped = 0;
    let mut last_time: BTreeMap<&str, u64> = BTreeMap::new();
    let (mut rec_read, mut rec_creation, mut sim_read, mut sim_creation) = (0u64, 0u64, 0.0, 0.0);
    let (mut rec_cost, mut sim_cost) = (0.0, 0.0);
    let mut rules = super::uncertainty::Accumulator::default();
    // The simulated read + creation of the previous compared call, per lane group.
    let mut last_cached: BTreeMap<&str, f64> = BTreeMap::new();
    for call in &replay.calls {
        if !call.compared() {
            skipped += 1;
            continue;
        }
        let group = if call.lane == "compact" { "main" } else { call.lane.as_str() };
        let gap_ms = last_time.insert(group, call.time_ms).map_or(0, |t| call.time_ms.saturating_sub(t));
        let previous_cached = last_cached.insert(group, call.sim_cache_read + call.sim_cache_creation);
        let comparison = compare(call, gap_ms);
        let rule = comparison.rule.as_deref().and_then(|r| super::uncertainty::MODELLED_RULES.into_iter().find(|m| *m == r));
        // The other outcome: a predicted read falls to the prefix level (the shared prefix: to
        // nothing); a predicted break reads what the previous call cached.
        let delta_creation = match rule {
            Some("side_entry") => (call.sim_cache_read - call.prefix_tokens as f64).max(0.0),
            Some(super::uncertainty::SHARED_PREFIX) => call.sim_cache_read,
            Some(_) => -(previous_cached.unwrap_or(0.0) - call.sim_cache_read).clamp(0.0, call.sim_cache_creation),
            None => 0.0,
        };
        rec_read += comparison.recorded_cache_read;
        rec_creation += comparison.recorded_cache_creation;
        sim_read += comparison.simulated_cache_read;
        sim_creation += comparison.simulated_cache_creation;
        if let Ok(info) = table.lookup(&call.model) {
            let split = call.recorded.creation_split();
            rec_cost += info.cost(
                call.recorded.input_tokens,
                call.recorded.output_tokens,
                call.recorded.cache_read_input_tokens,
                split.ephemeral_5m_input_tokens,
                split.ephemeral_1h_input_tokens,
            );
            let metrics = call.metrics.as_ref().expect("compared calls are measured");
            let creation = metrics.cache_creation_input_tokens as f64;
            let share_1h = if creation > 0.0 { metrics.cache_creation.ephemeral_1h_input_tokens as f64 / creation } else { 0.0 };
            let p = &info.price_for((call.sim_input + call.sim_cache_read + call.sim_cache_creation).round() as u64);
            sim_cost += (call.sim_input * p.input
                + call.recorded.output_tokens as f64 * p.output
                + call.sim_cache_read * p.cache_read
                + call.sim_cache_creation * (1.0 - share_1h) * p.cache_write_5m
                + call.sim_cache_creation * share_1h * p.cache_write_1h)
                / 1_000_000.0;
            let write = (1.0 - share_1h) * p.cache_write_5m + share_1h * p.cache_write_1h;
            rules.add(
                call.index,
                call.sim_cache_creation,
                rule.map(|rule| super::uncertainty::Flip { rule, delta_creation, price_delta: (write - p.cache_read) / 1_000_000.0 }),
            );
        } else {
            rules.add(call.index, call.sim_cache_creation, None);
        }
        calls.push(comparison);
    }
    let n = calls.len();
    let mut apes: Vec<f64> = calls.iter().map(|c| c.context_ape).collect();
    apes.sort_by(f64::total_cmp);
    let mape = if n == 0 { 0.0 } else { apes.iter().sum::<f64>() / n as f64 };
    let p90 = if n == 0 { 0.0 } else { apes[((n as f64 * 0.9).ceil() as usize).clamp(1, n) - 1] };
    let agreement = if n == 0 { 1.0 } else { calls.iter().filter(|c| c.hit_agrees).count() as f64 / n as f64 };
    FidelityReport {
        input: replay.input.clone(),
        requests_compared: n,
        requests_skipped: skipped,
        context_tokens_mape: round6(mape),
        cache_read_total_error: round6(relative(sim_read, rec_read as f64)),
        cache_creation_total_error: round6(relative(sim_creation, rec_creation as f64)),
        hit_agreement: round6(agreement),
        cost_error: round6(relative(sim_cost, rec_cost)),
        estimator: replay.estimator.clone(),
        engine: None,
        context_tokens_ape_p90: round6(p90),
        recorded_cache_read: rec_read,
        simulated_cache_read: sim_read.round(),
        recorded_cache_creation: rec_creation,
        simulated_cache_creation: sim_creation.round(),
        recorded_cost_usd: round6(rec_cost),
        simulated_cost_usd: round6(sim_cost),
        prefix_tokens: replay.calls.iter().find(|c| c.compared()).map_or(0, |c| c.prefix_tokens),
        user_context_tokens: replay.calls.iter().find(|c| c.compared()).map_or(0, |c| c.user_context_tokens),
        calls: if with_calls { calls } else { Vec::new() },
        modelled: rules.modelled(),
        interval: Some(rules.interval(sim_creation, sim_cost, rec_creation as f64, round6(rec_cost))),
        compaction_triggers: None,
        warnings: Vec::new(),
        profile_notes: replay.profile_notes.clone(),
        agent: None,
        recorded_requests: replay.records_requests.then(|| RecordedRequests {
            calls_from_records: replay.calls.iter().filter(|c| c.compared() && c.from_record).count(),
            reconstructed: replay
                .calls
                .iter()
                .filter(|c| c.compared() && !c.from_record)
                .map(|c| format!("call {}: {}", c.index, c.reconstructed_because.as_deref().unwrap_or("the replay's options change what was sent")))
                .collect(),
        }),
    }
}

fn compare(call: &CallReplay, gap_ms: u64) -> CallComparison {
    let recorded_context = call.recorded_context();
    let simulated_context = call.simulated_context();
    let rec = &call.recorded;
    let agrees = hit_agrees(
        rec.cache_read_input_tokens as f64,
        rec.cache_creation_input_tokens as f64,
        recorded_context as f64,
        call.sim_cache_read,
        call.sim_cache_creation,
        simulated_context as f64,
    );
    CallComparison {
        index: call.index,
        lane: call.lane.clone(),
        time_ms: call.time_ms,
        recorded_context,
        simulated_context,
        recorded_cache_read: rec.cache_read_input_tokens,
        simulated_cache_read: call.sim_cache_read,
        recorded_cache_creation: rec.cache_creation_input_tokens,
        simulated_cache_creation: call.sim_cache_creation,
        context_ape: relative(simulated_context as f64, recorded_context as f64).abs(),
        hit_agrees: agrees,
        gap_ms,
        prefix_tokens: call.prefix_tokens,
        user_context_tokens: call.user_context_tokens,
        message_tokens: call.message_tokens,
        events: call.events.clone(),
        rerender_probability: call.rerender_probability,
        rule: super::uncertainty::modelled_rule(&call.events).map(str::to_owned),
        from_record: call.from_record,
    }
}

/// Per-call rows of one session report as a fixed-width table (the `--calls` diagnostic):
/// recorded against simulated context, read and creation, the error, the modelled parts and
/// the events the replay saw (`turn` = a new user turn).
pub fn fidelity_calls_table(report: &FidelityReport) -> String {
    let mut out = format!("calls of {}\n", report.input);
    out.push_str(&format!(
        "{:>5} {:<10} {:>7} {:>8} {:>8} {:>7} {:>8} {:>8} {:>8} {:>8} {:>7} {:>6} {:>7} {:>5} {}\n",
        "#", "lane", "gap_s", "rec_ctx", "sim_ctx", "err%", "rec_rd", "sim_rd", "rec_cr", "sim_cr", "prefix", "uctx", "msgs", "agree", "events"
    ));
    for c in &report.calls {
        let err = relative(c.simulated_context as f64, c.recorded_context as f64);
        let events: Vec<&str> = c.events.iter().map(|e| if e == "new_user_turn" { "turn" } else { e.as_str() }).collect();
        out.push_str(&format!(
            "{:>5} {:<10} {:>7.1} {:>8} {:>8} {:>+7.1} {:>8} {:>8.0} {:>8} {:>8.0} {:>7} {:>6} {:>7} {:>5} {}\n",
            c.index,
            c.lane.chars().take(10).collect::<String>(),
            c.gap_ms as f64 / 1000.0,
            c.recorded_context,
            c.simulated_context,
            err * 100.0,
            c.recorded_cache_read,
            c.simulated_cache_read,
            c.recorded_cache_creation,
            c.simulated_cache_creation,
            c.prefix_tokens,
            c.user_context_tokens,
            c.message_tokens,
            if c.hit_agrees { "yes" } else { "NO" },
            events.join(",")
        ));
    }
    out
}

/// The figures of a session report as the tables print them: calls, MAPE, p90 and hit
/// agreement (%), the summed read, creation and cost errors (signed %).
pub fn figure_columns(r: &FidelityReport) -> String {
    columns(r.requests_compared, r.context_tokens_mape, r.context_tokens_ape_p90, r.hit_agreement, r.cache_read_total_error, r.cache_creation_total_error, r.cost_error)
}

/// The figure columns of [`figure_columns`] from the figures themselves (fractions, shown in %).
fn columns(calls: usize, mape: f64, p90: f64, hit: f64, read: f64, creation: f64, cost: f64) -> String {
    format!(
        "{:>6} {:>7.2} {:>7.2} {:>7.2} {:>+9.2} {:>+9.2} {:>+8.2}",
        calls,
        mape * 100.0,
        p90 * 100.0,
        hit * 100.0,
        read * 100.0,
        creation * 100.0,
        cost * 100.0
    )
}

/// A fixed-width table of session reports, with a pooled row when there are several.
pub fn fidelity_table(reports: &[FidelityReport]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<44} {:>6} {:>7} {:>7} {:>7} {:>9} {:>9} {:>8}\n",
        "session", "calls", "mape%", "p90%", "hit%", "read%", "create%", "cost%"
    ));
    for r in reports {
        let name = std::path::Path::new(&r.input).file_name().map_or(r.input.clone(), |n| n.to_string_lossy().into_owned());
        out.push_str(&format!("{:<44} {}\n", name, figure_columns(r)));
    }
    for r in reports {
        let name = std::path::Path::new(&r.input).file_name().map_or(r.input.clone(), |n| n.to_string_lossy().into_owned());
        for note in &r.profile_notes {
            out.push_str(&format!("note: {name}: {note}\n"));
        }
        if let Some(recorded) = &r.recorded_requests {
            out.push_str(&format!(
                "note: {name}: {} of {} calls measured on the requests the transcript recorded (api-request records)\n",
                recorded.calls_from_records, r.requests_compared
            ));
            for line in &recorded.reconstructed {
                out.push_str(&format!("note: {name}: reconstructed {line}\n"));
            }
        }
    }
    out
}

/// One step of the calibration fit: growth of the recorded context between two consecutive
/// calls of a lane against growth of the raw (bpe) estimate of the messages and of their block
/// count. Steps across a compaction, a microcompact or a re-rendered start are left out: there
/// the unrecorded part changes too.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitSample {
    pub recorded_growth: f64,
    pub raw_growth: f64,
    pub block_growth: f64,
}

/// Samples of a replay made with the `bpe` estimator, grouped by estimator key (model family,
/// and tokenizer generation when not the base one: [`ModelInfo::estimator_key`]).
///
/// [`ModelInfo::estimator_key`]: crate::measure::ModelInfo::estimator_key
pub fn fit_samples(replay: &SessionReplay, table: &ModelTable) -> BTreeMap<String, Vec<FitSample>> {
    samples_of(
        replay.calls.iter().filter(|c| c.compared()).map(|c| FitCall {
            lane: &c.lane,
            model: &c.model,
            recorded_context: c.recorded_context(),
            message_tokens: c.message_tokens,
            message_blocks: c.message_blocks,
            thinking_filled: c.thinking_filled,
            unsized_attachment_chars: c.unsized_attachment_chars,
            events: &c.events,
        }),
        table,
    )
}

/// [`fit_samples`] of `session` read by its measured record view ([`super::record_view_measured`]).
pub fn view_fit_samples(session: &crate::recording::ImportedSession, view: &super::RecordView, table: &ModelTable) -> BTreeMap<String, Vec<FitSample>> {
    let by_index: BTreeMap<usize, &crate::recording::RecordedCall> = session.calls.iter().map(|c| (c.index, c)).collect();
    samples_of(
        view.calls.iter().filter(|c| c.skipped.is_none()).filter_map(|c| {
            let call = by_index.get(&c.index)?;
            Some(FitCall {
                lane: &c.lane,
                model: &call.model,
                recorded_context: call.usage.prompt_tokens(),
                message_tokens: c.message_tokens,
                message_blocks: c.message_blocks,
                thinking_filled: c.thinking_filled,
                unsized_attachment_chars: c.unsized_attachment_chars,
                events: &c.events,
            })
        }),
        table,
    )
}

/// One compared call as a fit reads it.
struct FitCall<'a> {
    lane: &'a str,
    model: &'a str,
    recorded_context: u64,
    message_tokens: u64,
    message_blocks: u64,
    thinking_filled: bool,
    unsized_attachment_chars: u64,
    events: &'a [String],
}

fn samples_of<'a>(calls: impl Iterator<Item = FitCall<'a>>, table: &ModelTable) -> BTreeMap<String, Vec<FitSample>> {
    let mut last: BTreeMap<String, (f64, f64, f64, bool)> = BTreeMap::new();
    let mut samples: BTreeMap<String, Vec<FitSample>> = BTreeMap::new();
    for call in calls {
        let rec = call.recorded_context as f64;
        let now = (rec, call.message_tokens as f64, call.message_blocks as f64, call.thinking_filled);
        let previous = last.insert(call.lane.to_owned(), now);
        let disturbed = call.events.iter().any(|e| matches!(e.as_str(), "compaction" | "microcompact" | "resume" | "skill" | "tool_search_load"));
        let Some(previous) = previous else { continue };
        // A step that brings a reply whose thinking was filled grows by the fill, an estimate
        // of its own ([`ThinkingSample`]), and one with an attachment the replay does not render
        // at the client's size by what it leaves out: left out. Attachments sized from the
        // client ([`attachment_client_sized`]) stay in.
        //
        // [`attachment_client_sized`]: crate::recording::claude_code::attachment_client_sized
        if disturbed || now.1 < previous.1 || previous.3 || call.unsized_attachment_chars > 0 {
            continue;
        }
        let family = table.lookup(call.model).map(|m| m.estimator_key()).unwrap_or_default();
        samples.entry(family).or_default().push(FitSample {
            recorded_growth: now.0 - previous.0,
            raw_growth: now.1 - previous.1,
            block_growth: now.2 - previous.2,
        });
    }
    samples
}

/// Least squares of `recorded_growth ≈ scale × raw_growth + per_block × block_growth`; when
/// that gives a non-positive scale or a negative overhead, the overhead is dropped and the
/// scale alone fitted.
fn solve(samples: &[FitSample]) -> Option<FamilyCalibration> {
    solve_with(samples, |_, _| true)
}

/// How many standard errors a fitted per-block overhead must stand above zero for a fit of
/// growth steps ([`solve_shown`]) to keep it: the usual two-sigma test (about 95%) that the
/// samples show an overhead at all.
pub const OVERHEAD_SHOWN_AT_SIGMAS: f64 = 2.0;

/// [`solve`] for the calibration fit's growth steps, keeping the per-block overhead only where
/// the samples show it: the two-parameter fit's overhead must be at least
/// [`OVERHEAD_SHOWN_AT_SIGMAS`] standard errors (residual variance over `n − 2` degrees of
/// freedom) above zero; otherwise the overhead is dropped and the scale alone fitted, as for an
/// inadmissible fit. The simpler model stands until the samples reject it: a sample set whose
/// block growth hardly varies, or whose steps are few, cannot tell an overhead per block from a
/// little more scale, and a generation's overhead fitted there swings with the text of a few
/// steps (NumWordify's 5 v2 steps, all adding 2 blocks, give 1.637 + 18.5 ± 10.6 per block,
/// t = 1.75, where the 597 v2 steps of all sixteen sessions give 1.526 + 28.2 ± 1.8, t = 16;
/// the base generation's 1,144 steps 1.125 + 51.6 ± 2.9, t = 18). docs/fidelity.md, branch
/// v2prior.
fn solve_shown(samples: &[FitSample]) -> Option<FamilyCalibration> {
    solve_with(samples, |scale, per_block| {
        let (mut a, mut b, mut c, mut rss) = (0.0, 0.0, 0.0, 0.0);
        for s in samples {
            a += s.raw_growth * s.raw_growth;
            b += s.raw_growth * s.block_growth;
            c += s.block_growth * s.block_growth;
            let residual = s.recorded_growth - scale * s.raw_growth - per_block * s.block_growth;
            rss += residual * residual;
        }
        let freedom = samples.len().saturating_sub(2).max(1) as f64;
        let variance = rss / freedom * a / (a * c - b * b);
        per_block >= OVERHEAD_SHOWN_AT_SIGMAS * variance.max(0.0).sqrt()
    })
}

/// The two-parameter fit, kept when it is admissible and `keep(scale, per_block)` holds, else the
/// scale alone.
fn solve_with(samples: &[FitSample], keep: impl Fn(f64, f64) -> bool) -> Option<FamilyCalibration> {
    let (mut a, mut b, mut c, mut d, mut e) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for s in samples {
        a += s.raw_growth * s.raw_growth;
        b += s.raw_growth * s.block_growth;
        c += s.block_growth * s.block_growth;
        d += s.raw_growth * s.recorded_growth;
        e += s.block_growth * s.recorded_growth;
    }
    if samples.len() < 3 || a <= 0.0 {
        return None;
    }
    let det = a * c - b * b;
    if det.abs() > 1e-9 {
        let scale = (d * c - b * e) / det;
        let per_block = (a * e - b * d) / det;
        if scale > 0.0 && per_block >= 0.0 && keep(scale, per_block) {
            return Some(FamilyCalibration { scale: round6(scale), per_block: round6(per_block) });
        }
    }
    let scale = d / a;
    (scale > 0.0).then(|| FamilyCalibration { scale: round6(scale), per_block: 0.0 })
}

/// A family's calibration from what single blocks cost: `(bpe tokens of the block's text,
/// tokens the provider counted for the block)` pairs, fitted as `scale × bpe + per_block`
/// (`calibrate --from-api`). `None` with fewer than three pairs.
pub fn fit_block_costs(costs: &[(u64, u64)]) -> Option<FamilyCalibration> {
    let samples: Vec<FitSample> = costs.iter().map(|&(raw, counted)| FitSample { recorded_growth: counted as f64, raw_growth: raw as f64, block_growth: 1.0 }).collect();
    solve(&samples)
}

/// The user context a session opened with, when its transcript shows it: the first call's
/// unrecorded tokens less the prefix level the record showed. Head-truncated segments carry
/// older history in their first call and give none.
pub fn user_context_sample(replay: &SessionReplay) -> Option<u64> {
    user_context_shown(replay.unrecorded_main, replay.head_truncated)
}

/// [`user_context_sample`] of the main lane's unrecorded sizes.
fn user_context_shown(unrecorded_main: Option<super::UnrecordedSizes>, head_truncated: bool) -> Option<u64> {
    let main = unrecorded_main.filter(|m| m.prefix_from_record && !head_truncated)?;
    Some(main.first_call_tokens.saturating_sub(main.prefix_tokens))
}

/// The prefix level (tools + system) the record of a session showed, with the Claude Code
/// version of its first main-lane call: the level last in force, when a warm first call or a
/// later re-render showed it (head-truncated segments included: the level does not depend on
/// where the transcript starts).
pub fn prefix_sample(replay: &SessionReplay) -> Option<(String, u64)> {
    let version = replay.calls.iter().find(|c| c.compared() && c.lane == crate::recording::format::LANE_MAIN)?.version.clone()?;
    prefix_shown(replay.unrecorded_main, version)
}

/// [`prefix_sample`] of the main lane's unrecorded sizes, with `version`.
fn prefix_shown(unrecorded_main: Option<super::UnrecordedSizes>, version: String) -> Option<(String, u64)> {
    let main = unrecorded_main.filter(|m| m.prefix_from_record)?;
    Some((version, main.prefix_tokens))
}

fn median(values: &[u64]) -> Option<u64> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[n / 2]),
        n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2),
    }
}

/// What one session gives a fit ([`session_fit`]): its growth samples by estimator key, the
/// user context (with the session's version) and prefix level its record showed, and its
/// replies whose thinking text was stored.
#[derive(Debug, Clone)]
pub struct SessionFit {
    pub session: FittedSession,
    pub samples: BTreeMap<String, Vec<FitSample>>,
    pub user_context: Option<(String, u64)>,
    pub prefix: Option<(String, u64)>,
    /// (version, estimator key, sample).
    pub thinking: Vec<(String, String, ThinkingSample)>,
}

/// A reply whose thinking text was stored: its billed output and the raw (`bpe`) tokens of its
/// thinking and of its visible part.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThinkingSample {
    pub output_tokens: u64,
    pub thinking_raw: u64,
    pub visible_raw: u64,
}

/// The replies of `session` whose thinking text was stored ([`ThinkingSample`]).
pub fn thinking_samples(session: &crate::recording::ImportedSession, table: &ModelTable) -> Vec<(String, String, ThinkingSample)> {
    use crate::measure::tokens::{TokenUnit, bpe};
    let raw = |units: Vec<TokenUnit>| -> u64 {
        units
            .into_iter()
            .map(|u| match u {
                TokenUnit::Text(t) => u64::from(bpe(&t)),
                TokenUnit::Fixed(n) => u64::from(n),
            })
            .sum()
    };
    let mut out = Vec::new();
    for event in &session.recording.events {
        let crate::recording::EventKind::ModelReply(reply) = &event.kind else { continue };
        let stored = reply.content.iter().any(|b| matches!(b, crate::api::ContentBlock::Thinking { thinking, .. } if !thinking.is_empty()));
        if reply.is_synthetic || reply.is_api_error || !reply.thinking_text_stored || !stored || reply.usage.output_tokens == 0 {
            continue;
        }
        let Ok(info) = table.lookup(&reply.model) else { continue };
        let (thinking, visible): (Vec<_>, Vec<_>) = reply.content.iter().partition(|b| b.is_thinking());
        let sample = ThinkingSample {
            output_tokens: reply.usage.output_tokens,
            thinking_raw: raw(thinking.into_iter().flat_map(crate::measure::blocks::content_token_units).collect()),
            visible_raw: raw(visible.into_iter().flat_map(crate::measure::blocks::content_token_units).collect()),
        };
        out.push((reply.version.clone().unwrap_or_default(), info.estimator_key(), sample));
    }
    out
}

/// The project of a transcript: the name of the directory it is in.
pub fn fitted_session(path: &std::path::Path) -> FittedSession {
    let name = |p: Option<&std::path::Path>| p.and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    FittedSession { session: name(Some(path)), project: name(path.parent()) }
}

/// What `session`'s record gives a fit, read by its measured record view (no replay): the `bpe`
/// estimator, no fitted prior (what is fitted must come from the fitted transcripts alone).
pub fn session_fit(session: &crate::recording::ImportedSession, path: &std::path::Path, table: &ModelTable, options: &super::ReplayOptions) -> SessionFit {
    let blank = Calibration {
        user_context_tokens: None,
        prefix_tokens: BTreeMap::new(),
        generations: BTreeMap::new(),
        user_context_by_version: BTreeMap::new(),
        thinking_fill: BTreeMap::new(),
        fitted_on: Vec::new(),
        ..Calibration::shipped()
    };
    let counter = crate::measure::TokenCounter::with_calibration(crate::measure::EstimatorKind::Bpe, blank);
    let mut measurer = crate::measure::Measurer::new(table.clone(), counter).without_body_hashes();
    let view = super::record_view_measured(session, &mut measurer, options);
    let first_main = view
        .calls
        .iter()
        .find(|c| c.skipped.is_none() && c.lane == crate::recording::format::LANE_MAIN)
        .and_then(|c| session.calls.iter().find(|r| r.index == c.index));
    let version = first_main.and_then(|c| c.version.clone());
    SessionFit {
        session: fitted_session(path),
        samples: view_fit_samples(session, &view, table),
        // A first call that attached @-mentioned files shows them with the user context.
        user_context: user_context_shown(view.unrecorded_main, session.recording.header.head_truncated)
            .filter(|_| super::sizing::first_call_mentions(session).is_empty())
            .map(|t| (version.clone().unwrap_or_default(), t)),
        prefix: version.and_then(|version| prefix_shown(view.unrecorded_main, version)),
        thinking: thinking_samples(session, table),
    }
}

/// Fits the calibrated estimator on several sessions ([`session_fit`]): per estimator key of
/// the base tokenizer generation a scale and per-block overhead (pooled over them, the
/// default), per newer generation one pooled over its families; the median user context; per
/// Claude Code version the median prefix level. The sessions are recorded in `fitted_on`.
pub fn fit_calibration(fits: &[&SessionFit]) -> Calibration {
    let mut samples: BTreeMap<String, Vec<FitSample>> = BTreeMap::new();
    for fit in fits {
        for (key, s) in &fit.samples {
            samples.entry(key.clone()).or_default().extend(s.iter().copied());
        }
    }
    let user_contexts: Vec<u64> = fits.iter().filter_map(|f| f.user_context.as_ref().map(|u| u.1)).collect();
    let prefixes: Vec<(String, u64)> = fits.iter().filter_map(|f| f.prefix.clone()).collect();
    let mut fitted_on: Vec<FittedSession> = fits.iter().map(|f| f.session.clone()).collect();
    fitted_on.sort();
    let projects: std::collections::BTreeSet<&str> = fitted_on.iter().map(|f| f.project.as_str()).collect();
    let source = format!("fitted by `ctxsim fidelity --fit` on {} sessions of {} projects ({})", fitted_on.len(), projects.len(), projects.into_iter().collect::<Vec<_>>().join(", "));
    let mut calibration = fit_parameters(&samples, &user_contexts, &prefixes, &source);
    calibration.user_context_by_version = per_version(fits.iter().filter_map(|f| f.user_context.clone()));
    // Thinking per token of `output − visible`, in the model's tokens under the fitted scales.
    let mut fill: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for (version, key, t) in fits.iter().flat_map(|f| f.thinking.iter()) {
        let scale = calibration.for_family(key).scale;
        let beyond = t.output_tokens as f64 - t.visible_raw as f64 * scale;
        if beyond > 0.0 {
            let entry = fill.entry(version.clone()).or_default();
            entry.0 += t.thinking_raw as f64 * scale;
            entry.1 += beyond;
        }
    }
    calibration.thinking_fill = fill.into_iter().filter(|(_, (_, x))| *x > 0.0).map(|(v, (y, x))| (v, (y / x * 1e4).round() / 1e4)).collect();
    calibration.fitted_on = fitted_on;
    calibration
}

/// The median per version of `(version, tokens)` samples.
fn per_version(samples: impl Iterator<Item = (String, u64)>) -> BTreeMap<String, u64> {
    let mut by_version: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (version, tokens) in samples {
        by_version.entry(version).or_default().push(tokens);
    }
    by_version.into_iter().filter_map(|(v, t)| median(&t).map(|m| (v, m))).collect()
}

/// [`fit_calibration`] from the pooled parts.
pub fn fit_parameters(samples: &BTreeMap<String, Vec<FitSample>>, user_contexts: &[u64], prefixes: &[(String, u64)], source: &str) -> Calibration {
    let base: Vec<FitSample> = samples.iter().filter(|(k, _)| !k.contains('/')).flat_map(|(_, s)| s.iter().copied()).collect();
    let default = solve_shown(&base).unwrap_or(FamilyCalibration { scale: 1.0, per_block: 0.0 });
    let families = samples.iter().filter(|(k, _)| !k.contains('/')).filter_map(|(family, s)| solve_shown(s).map(|p| (family.clone(), p))).collect();
    let mut by_generation: BTreeMap<String, Vec<FitSample>> = BTreeMap::new();
    for (key, s) in samples {
        if let Some((_, generation)) = key.split_once('/') {
            by_generation.entry(generation.to_owned()).or_default().extend(s.iter().copied());
        }
    }
    let generations = by_generation.into_iter().filter_map(|(g, s)| solve_shown(&s).map(|p| (g, p))).collect();
    let user_context_tokens = median(user_contexts);
    let prefix_tokens = per_version(prefixes.iter().cloned());
    Calibration {
        source: source.to_owned(),
        default,
        families,
        user_context_tokens,
        prefix_tokens,
        generations,
        user_context_by_version: BTreeMap::new(),
        thinking_fill: BTreeMap::new(),
        fitted_on: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::{FitSample, hit_agrees, solve, solve_shown};

    fn steps(rows: &[(f64, f64, f64)]) -> Vec<FitSample> {
        rows.iter().map(|&(recorded_growth, raw_growth, block_growth)| FitSample { recorded_growth, raw_growth, block_growth }).collect()
    }

    #[test]
    fn an_overhead_the_samples_do_not_show_is_dropped_and_the_scale_fitted_alone() {
        // NumWordify's 5 clean v2 steps (recorded, bpe, blocks): every one adds 2 blocks, so the
        // overhead is an intercept over five points (18.5 ± 10.6 tokens, t = 1.75).
        let few = steps(&[(201.0, 88.0, 2.0), (666.0, 391.0, 2.0), (3722.0, 2238.0, 2.0), (1567.0, 964.0, 2.0), (173.0, 72.0, 2.0)]);
        let free = solve(&few).unwrap();
        assert!((free.scale - 1.637).abs() < 1e-3 && (free.per_block - 18.53).abs() < 0.01, "{free:?}");
        let shown = solve_shown(&few).unwrap();
        assert_eq!(shown.per_block, 0.0, "{shown:?}");
        assert!((shown.scale - 1.6598).abs() < 1e-3, "{shown:?}");
        // Steps whose block growth varies, made by 1.5 per bpe token + 30 per block with a
        // deterministic ±5% error: the overhead is shown and kept, near what made them.
        let varied: Vec<(f64, f64, f64)> = (0..40)
            .map(|i| {
                let (raw, blocks) = (50.0 + 37.0 * f64::from(i % 11), f64::from(1 + i % 5));
                let exact = 1.5 * raw + 30.0 * blocks;
                (exact * (1.0 + 0.05 * f64::from(i % 3 - 1)), raw, blocks)
            })
            .collect();
        let kept = solve_shown(&steps(&varied)).unwrap();
        assert_eq!(kept, solve(&steps(&varied)).unwrap());
        assert!((kept.per_block - 30.0).abs() < 6.0 && (kept.scale - 1.5).abs() < 0.05, "{kept:?}");
    }

    #[test]
    fn the_read_rule_needs_a_read_and_the_50_percent_line_decides_the_rest() {
        // Both read the same prefix, their writes on either side of half: agree.
        assert!(hit_agrees(22_033.0, 21_700.0, 44_000.0, 22_037.0, 22_300.0, 44_600.0));
        // Both read, the reads apart and the writes across the line: disagree.
        assert!(!hit_agrees(22_033.0, 21_700.0, 44_000.0, 15_000.0, 30_000.0, 45_000.0));
        // Neither read: the line decides (the whole prompt written against nothing written).
        assert!(!hit_agrees(0.0, 40_000.0, 40_000.0, 0.0, 0.0, 40_000.0));
        assert!(hit_agrees(0.0, 40_000.0, 40_000.0, 0.0, 39_000.0, 40_000.0));
        // One read and the other did not: disagree.
        assert!(!hit_agrees(10_000.0, 0.0, 10_000.0, 0.0, 10_000.0, 10_000.0));
    }
}
