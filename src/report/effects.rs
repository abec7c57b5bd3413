//! Knobs that change nothing, and strategies that give the same results: `sweep` and `compare`
//! say so per input instead of ranking equal results as if they had been weighed.
//!
//! "No effect" is decided by comparing results, never guessed: every (point, input) result is
//! reduced to an [`outcome_digest`] (an xxh3 of every measured row, the information loss, the
//! compactions and the divergence note), and a parameter has no effect on an input when every
//! set of grid points that differ only in that parameter's value gives one digest. The reason
//! shown is then looked up, in this order: the replay of a recording does not honour the knob
//! (the replay options of every value are equal); the knob's stage is disabled at every point;
//! the session never reaches the autocompaction threshold (its peak context against the lowest
//! threshold of the grid); otherwise no reason is claimed.

use std::path::Path;

use serde::Serialize;

use crate::report::compare::{Evaluation, Input, LoadedInput};
use crate::report::sweep::Grid;
use crate::strategy::Strategy;

/// A digest of everything measured about one input under one strategy (16 hex digits; equal
/// digests = equal results). Needs the evaluation's rows (`keep_rows`).
pub fn outcome_digest(evaluation: &Evaluation) -> String {
    use std::hash::Hasher;
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for row in &evaluation.rows {
        // Everything measured, but of the stages only those that fired: a stage that did not
        // fire reports the threshold it checked against, which is the knob, not a result.
        let mut row = row.clone();
        row.stages.retain(|s| s.fired);
        hasher.write(&serde_json::to_vec(&row).expect("rows serialize"));
        hasher.write_u8(b'\n');
    }
    hasher.write(&serde_json::to_vec(&evaluation.summary.info_loss).expect("info loss serializes"));
    hasher.write(&serde_json::to_vec(&evaluation.compactions).expect("compactions serialize"));
    hasher.write(evaluation.divergence.as_deref().unwrap_or("").as_bytes());
    format!("{:016x}", hasher.finish())
}

/// One parameter that changed no result on one input.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NoEffect {
    pub input: String,
    pub param: String,
    /// Why, when it could be established; else "".
    pub reason: String,
}

impl NoEffect {
    /// The warning line: `no effect on X: KEY changed no result (REASON)`.
    pub fn line(&self) -> String {
        let name = Path::new(&self.input).file_name().map_or_else(|| self.input.clone(), |n| n.to_string_lossy().into_owned());
        if self.reason.is_empty() {
            format!("no effect on {name}: {} changed no result", self.param)
        } else {
            format!("no effect on {name}: {} changed no result ({})", self.param, self.reason)
        }
    }
}

/// How much one parameter changed the results of one input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamEffect {
    pub input: usize,
    pub param: usize,
    /// The most distinct results the parameter's values gave with the other parameters held
    /// fixed (1 = no effect).
    pub distinct: usize,
}

/// Per input and parameter with at least two values: how many distinct results its values gave
/// (the most over the settings of the other parameters). `outcomes[point][input]` is the digest
/// of that job; points are the grid's, in order, all of them.
pub fn param_effects(grid: &Grid, outcomes: &[Vec<String>]) -> Vec<ParamEffect> {
    let mut out = Vec::new();
    let inputs = outcomes.first().map_or(0, Vec::len);
    for input in 0..inputs {
        for (k, param) in grid.params.iter().enumerate() {
            let n = param.values.len();
            if n < 2 {
                continue;
            }
            // The points where param k takes its first value; each with its n − 1 siblings
            // that differ from it in param k only.
            let stride: usize = grid.params[k + 1..].iter().map(|p| p.values.len()).product();
            let distinct = (0..outcomes.len())
                .filter(|p| (p / stride).is_multiple_of(n))
                // A family with a result missing (a merged shard whose line was dropped) is
                // left out: what it lacks cannot tell an effect.
                .filter_map(|first| {
                    let mut seen: Vec<&str> = (0..n).map(|d| outcomes.get(first + d * stride).and_then(|o| o.get(input)).map(String::as_str)).collect::<Option<_>>()?;
                    seen.sort_unstable();
                    seen.dedup();
                    Some(seen.len())
                })
                .max()
                .unwrap_or(1);
            out.push(ParamEffect { input, param: k, distinct });
        }
    }
    out
}

/// The lowest autocompact threshold of `strategies` on `input`, computed as the agent computes
/// its own ([`crate::agent::session::ThresholdWorld`]): a scenario's model, window, output limit
/// and env; a session's main model and the window its workload gives the agent
/// (`triggers::recorded_window`), with the recorded version's output reserve where a strategy
/// sets none.
fn lowest_threshold(input: &Input, strategies: &[Strategy]) -> Option<u64> {
    use crate::agent::session::ThresholdWorld;
    match &input.loaded {
        LoadedInput::Scenario(s) => {
            let env: std::collections::BTreeMap<String, String> = s.world.env.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect();
            let world = ThresholdWorld { model_id: &s.world.model, context_window: s.world.context_window, max_output_tokens: s.world.max_output_tokens, env: &env };
            strategies.iter().map(|strategy| world.thresholds(strategy).autocompact).min()
        }
        LoadedInput::Session(s) => {
            let version = s.calls.iter().find_map(|c| c.version.as_deref()).unwrap_or("");
            let reserve = crate::replay::ClientProfile::for_version(version).autocompact_output_reserve;
            let model = s.calls.iter().find(|c| c.lane == "main").map_or("", |c| c.model.as_str());
            let env = std::collections::BTreeMap::new();
            // The window the workload gives the agent: the recorded one (a 1M opt-in the session
            // shows, or the model table's), not only what the model id says.
            let table = crate::measure::models::ModelTable::shipped();
            let window = crate::replay::triggers::recorded_window(s, model, table.lookup(model).ok());
            let world = ThresholdWorld { model_id: model, context_window: Some(window), max_output_tokens: None, env: &env };
            strategies
                .iter()
                .map(|strategy| {
                    let mut strategy = strategy.clone();
                    strategy.compact.autocompact.max_output_reserve_tokens.get_or_insert(reserve);
                    world.thresholds(&strategy).autocompact
                })
                .min()
        }
    }
}

/// "the stage S is disabled at every point of the grid" when `key` is a setting of a stage of
/// the chain that no strategy of the grid turns on (microcompact is on with its time-based or
/// its cached path).
fn stage_disabled(key: &str, strategies: &[Strategy]) -> Option<String> {
    let mut parts = key.split('.');
    let (Some("compact"), Some(stage)) = (parts.next(), parts.next()) else { return None };
    let disabled = |s: &Strategy| match stage {
        "microcompact" => !s.compact.microcompact.time_based_enabled && s.compact.microcompact.cached == crate::agent::compact::config::CachedMicrocompactMode::Off,
        "autocompact" => s.compact.autocompact.compact_disabled || !s.compact.autocompact.enabled,
        _ => knob(s, &format!("compact.{stage}.enabled")) == Some(serde_json::Value::Bool(false)),
    };
    let own_switch = key.ends_with(".enabled") || key.ends_with(".time_based_enabled") || key.ends_with(".cached") || key.ends_with(".compact_disabled");
    (!own_switch && strategies.iter().all(disabled)).then(|| format!("the stage {stage} is disabled at every point of the grid"))
}

/// The value at a dotted key of a strategy's JSON form.
fn knob(strategy: &Strategy, key: &str) -> Option<serde_json::Value> {
    let root = serde_json::to_value(strategy).ok()?;
    key.split('.').try_fold(&root, |slot, part| slot.get(part)).cloned()
}

/// Why a parameter would have changed nothing on an input, as far as the grid's strategies and
/// the input tell before any result: written into partial CSVs so that a merge of shards says
/// what the unsharded run says. [`Reason::text`] completes it with the input's peak context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// A reason that holds whatever the results.
    Known(String),
    /// The knob moves the autocompaction threshold, lowest at this many tokens over the grid:
    /// the reason holds when the input's peak context stays below it.
    BelowThreshold(u64),
    None,
}

/// Knobs whose no-effect reason is a fact of the recording: the tool-output limits (its largest
/// result) and whether the recorded microcompacts apply (whether it has any).
const RECORD_FACT_KNOBS: [&str; 6] = ["bash_max_output_length", "max_mcp_output_tokens", "read_max_lines", "read_max_bytes", "read_max_tokens", "replay_recorded_microcompact"];

impl Reason {
    /// The reason for `param` on `input`, with recorded sessions run by `engine` (the agent:
    /// every knob reaches a session): the knob's stage is disabled at every point; a tool-output
    /// limit below which the recording has no result, or recorded microcompacts the session does
    /// not have; the knob moves the autocompaction threshold. `strategies` are every point's.
    pub fn find_with(grid: &Grid, strategies: &[Strategy], param: usize, input: &Input, engine: crate::report::compare::Engine) -> Reason {
        let key = &grid.params[param].key;
        if let Some(reason) = stage_disabled(key, strategies) {
            return Reason::Known(reason);
        }
        // Facts of the recording (no recorded result above the lowest limit, no recorded
        // microcompact), which hold through the agent too: its executor returns the recorded
        // results, and a limit cannot restore what the client cut.
        if let LoadedInput::Session(session) = &input.loaded
            && engine == crate::report::compare::Engine::Agent
            && RECORD_FACT_KNOBS.contains(&key.as_str())
            && let Some(why) = crate::replay::no_effect::knob_no_effect_reason(key, strategies, session)
        {
            return Reason::Known(why);
        }
        // Through the agent the env vars of the threshold are the same knobs under their
        // users' names (the replay's reasons, and so its outputs, are kept as they were).
        let threshold_env = engine == crate::report::compare::Engine::Agent && matches!(key.as_str(), "env.CLAUDE_AUTOCOMPACT_PCT_OVERRIDE" | "env.CLAUDE_CODE_AUTO_COMPACT_WINDOW");
        if key.starts_with("compact.autocompact.") || threshold_env {
            if let Some(lowest) = lowest_threshold(input, strategies) {
                return Reason::BelowThreshold(lowest);
            }
        }
        Reason::None
    }

    /// The reason shown, given the input's peak context over the grid ("" for none).
    pub fn text(&self, peak: u64) -> String {
        match self {
            Reason::Known(text) => text.clone(),
            Reason::BelowThreshold(lowest) if peak < *lowest => format!(
                "the session never reaches the autocompaction threshold: its peak context is {} tokens, the lowest threshold in the grid is {}",
                thousands(peak),
                thousands(*lowest)
            ),
            _ => String::new(),
        }
    }

    /// One line of text (for the partial CSVs' header lines).
    pub fn encode(&self) -> String {
        match self {
            Reason::Known(text) => format!("known {}", text.replace('\n', " ")),
            Reason::BelowThreshold(lowest) => format!("threshold {lowest}"),
            Reason::None => "none".to_owned(),
        }
    }

    pub fn decode(line: &str) -> Option<Reason> {
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        match kind {
            "known" => Some(Reason::Known(rest.to_owned())),
            "threshold" => rest.parse().ok().map(Reason::BelowThreshold),
            "none" => Some(Reason::None),
            _ => None,
        }
    }
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Per input, strategies of a comparison that gave exactly the same results as an earlier one:
/// (input, the strategies of one group, in the order given), for groups of two or more.
pub fn equal_strategies(evaluations: &[Evaluation], digests: &[String]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut inputs: Vec<&str> = Vec::new();
    for e in evaluations {
        if !inputs.contains(&e.input.as_str()) {
            inputs.push(&e.input);
        }
    }
    for input in inputs {
        let of_input: Vec<usize> = (0..evaluations.len()).filter(|&i| evaluations[i].input == input).collect();
        let mut grouped = vec![false; of_input.len()];
        for (a, &i) in of_input.iter().enumerate() {
            if grouped[a] {
                continue;
            }
            let group: Vec<usize> = (a..of_input.len()).filter(|&b| digests[of_input[b]] == digests[i]).collect();
            if group.len() > 1 {
                for &b in &group {
                    grouped[b] = true;
                }
                out.push((input.to_owned(), group.iter().map(|&b| evaluations[of_input[b]].strategy.clone()).collect()));
            }
        }
    }
    out
}
