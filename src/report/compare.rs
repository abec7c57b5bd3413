//! `ctxsim compare` (and the evaluation `sweep` shares): the same inputs under several
//! strategies.
//!
//! An input is a scenario (YAML: the agent runs under the strategy) or a recorded session (a
//! Claude Code transcript or a ctxsim recording: the agent, driven by the session, runs under
//! the strategy, [`crate::replay::agent_whatif`]). A run keeps the model's recorded replies; when
//! a strategy changes what the model would have seen, the row says so (`replies_diverge`, with
//! the reason) instead of pretending the replies would be the same.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::measure::loss::InfoLoss;
use crate::measure::metrics::COMPACTION_KEYS;
use crate::measure::{Measurer, RequestMetrics, Summary};
use crate::recording::ImportedSession;
use crate::replay::discover::{SessionFile, SessionFilter, apply, discover, walk};
use crate::replay::load_session;
use crate::runner::{RunOptions, run_scenario_opts};
use crate::scenario::Scenario;
use crate::strategy::Strategy;

/// An input loaded once, evaluated under many strategies.
#[derive(Debug)]
pub enum LoadedInput {
    Scenario(Box<Scenario>),
    Session(Box<ImportedSession>),
}

/// A named loaded input.
#[derive(Debug)]
pub struct Input {
    pub name: String,
    pub loaded: LoadedInput,
    /// Lines or records skipped while reading it (a session's bad lines); every evaluation's
    /// summary carries them.
    pub warnings: crate::recording::Warnings,
}

/// Expands directories (sorted; `*.yaml`/`*.yml` scenarios at their top, sessions found as
/// [`crate::replay::discover`] finds them) and loads every input.
pub fn load_inputs(paths: &[PathBuf]) -> anyhow::Result<Vec<Input>> {
    load_inputs_filtered(paths, &SessionFilter::default(), None)
}

/// [`load_inputs`] with the session filters (no paths: the user's Claude Code projects) and
/// scenario mounts confined to `mount_root` ([`crate::scenario::load_scenario_confined`]).
pub fn load_inputs_filtered(paths: &[PathBuf], filter: &SessionFilter, mount_root: Option<&std::path::Path>) -> anyhow::Result<Vec<Input>> {
    let is_yaml = |p: &Path| p.extension().is_some_and(|e| e == "yaml" || e == "yml");
    let mut files = Vec::new();
    if paths.is_empty() {
        files.extend(discover(&[], filter)?.into_iter().map(|f| f.path));
    }
    for path in paths {
        if path.is_dir() {
            // Scenarios at the top of the directory, sessions anywhere under it.
            let mut scenarios: Vec<PathBuf> = std::fs::read_dir(path)?.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file() && is_yaml(p)).collect();
            scenarios.sort();
            let sessions = walk(path)?;
            if scenarios.is_empty() && sessions.is_empty() {
                anyhow::bail!("{}: no scenarios (*.yaml) or sessions (*.jsonl) in this directory", path.display());
            }
            files.extend(scenarios);
            files.extend(apply(sessions, filter)?.into_iter().map(|f| f.path));
        } else if is_yaml(path) {
            files.push(path.clone());
        } else {
            files.extend(apply(vec![SessionFile::new(path.clone())], filter)?.into_iter().map(|f| f.path));
        }
    }
    files
        .into_iter()
        .map(|file| {
            let name = file.display().to_string();
            let mut warnings = crate::recording::Warnings::default();
            let loaded = if is_yaml(&file) {
                LoadedInput::Scenario(Box::new(crate::scenario::load_scenario_confined(&file, mount_root)?))
            } else {
                let session = load_session(&file)?;
                warnings = session.report.warnings.clone();
                LoadedInput::Session(Box::new(session))
            };
            Ok(Input { name, loaded, warnings })
        })
        .collect()
}

/// One input under one strategy.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    pub input: String,
    pub strategy: String,
    /// `scenario` or `recording`.
    pub kind: &'static str,
    pub summary: Summary,
    /// Compactions by summary key, recorded ones included (a replay's `compaction` and
    /// `microcompact` events count as `auto` and `microcompact` when no stage reported them).
    pub compactions: std::collections::BTreeMap<String, u64>,
    /// The model's replies are the recorded ones, but the strategy changed what it saw.
    pub replies_diverge: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub divergence: Option<String>,
    /// The first strategy given that had exactly the same results on this input, and why when
    /// known ([`crate::report::effects::outcome_digest`] decides, not the knobs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub same_results_as: Option<String>,
    /// The `--set KEY=VALUE` given to `compare` that changed no result on this input under this
    /// strategy (its run without that set had the same outcome digest); absent when every set
    /// changed something or none was given.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub set_no_effect: Vec<String>,
    /// A real session's compactions under the strategy and what each lost
    /// ([`crate::replay::loss`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub compaction_losses: Vec<crate::replay::loss::CompactionLoss>,
    /// What ran a recorded session (`agent`, the only engine since session 26); absent for a
    /// scenario.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<&'static str>,
    /// Through the agent (`--engine agent`): how the session drove it. Absent for the replay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentNotes>,
    #[serde(skip)]
    pub rows: Vec<RequestMetrics>,
}

/// What rebuilds a recorded session's requests under a strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Engine {
    /// The agent, driven by the session and running under the strategy
    /// ([`crate::replay::agent_whatif`]): every knob applies. The only engine of `compare`,
    /// `sweep`, `check` and `audit` (what-ifs on recorded sessions run through the agent, the
    /// one model of the client), named in their outputs.
    #[default]
    Agent,
}

impl Engine {
    /// The engine's name in outputs: `agent` or `replay`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Agent => "agent",
        }
    }

    /// The engine of an output's name (`agent` or `replay`), if it is one.
    pub fn named(name: &str) -> Option<Engine> {
        [Engine::Agent].into_iter().find(|e| e.name() == name)
    }

    /// What ran the recorded sessions, as a sentence of the outputs.
    pub fn sentence(self) -> &'static str {
        match self {
            Engine::Agent => "recorded sessions ran through the agent (`--engine agent`, the default): every knob applies",
        }
    }
}

/// How a recorded session drove the agent under one strategy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentNotes {
    /// Runs it took to settle which summary each compaction takes and how far the recorded
    /// usage holds.
    pub runs: usize,
    /// The agent's compactions: the call after each, the stage, the agent's count before it and
    /// the summary it took (`recorded`, `stand-in`, or `session memory`).
    pub compactions: Vec<AgentCompactionNote>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentCompactionNote {
    pub call: usize,
    pub stage: String,
    pub tokens_before: u64,
    pub summary: &'static str,
}

/// What one input shares between the strategies of a comparison or the points of a sweep:
/// through the agent the prepared workload and every run by a content hash of its effective
/// strategy (two points that resolve to the same settings make one run).
#[derive(Default)]
pub struct InputMemo {
    prepared: std::sync::OnceLock<Result<crate::replay::agent_whatif::Prepared, String>>,
    runs: AgentRuns,
}

/// Agent runs by strategy key: the evaluation (its rows when kept) and its outcome digest.
type AgentRuns = std::sync::Mutex<std::collections::BTreeMap<String, std::sync::Arc<std::sync::OnceLock<Result<(Evaluation, String), String>>>>>;

impl InputMemo {
    /// Agent runs made, distinct strategies (for the sweep's report of shared runs).
    pub fn agent_runs(&self) -> usize {
        self.runs.lock().map_or(0, |r| r.len())
    }

    /// The session prepared for the agent, once.
    fn prepared(&self, input: &Input, session: &ImportedSession, measurer: &Measurer) -> anyhow::Result<&crate::replay::agent_whatif::Prepared> {
        self.prepared
            .get_or_init(|| crate::replay::agent_whatif::prepare(session, &input.name, measurer))
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{}: {e}", input.name))
    }

    /// The strategies of `strategies` whose agent runs on `input` are not made yet, grouped by
    /// [`crate::replay::agent_whatif::family_key`] (one per run, sorted by run key), the groups
    /// of two or more: each group is one [`InputMemo::run_family`]. None for a scenario.
    pub fn families(&self, input: &Input, strategies: &[Strategy], measurer: &Measurer) -> anyhow::Result<Vec<Vec<Strategy>>> {
        use crate::replay::agent_whatif::{effective_strategy, family_key, strategy_key};
        let LoadedInput::Session(session) = &input.loaded else { return Ok(Vec::new()) };
        let prepared = self.prepared(input, session, measurer)?;
        let made = self.runs.lock().map_err(|_| anyhow::anyhow!("a worker panicked"))?;
        let mut families: std::collections::BTreeMap<String, std::collections::BTreeMap<String, Strategy>> = Default::default();
        for strategy in strategies {
            let key = strategy_key(&effective_strategy(strategy, prepared), prepared);
            let Some(family) = family_key(&effective_strategy(strategy, prepared), prepared) else { continue };
            if made.get(&key).is_some_and(|cell| cell.get().is_some()) {
                continue;
            }
            families.entry(family).or_default().entry(key).or_insert_with(|| strategy.clone());
        }
        Ok(families.into_values().filter(|f| f.len() > 1).map(|f| f.into_values().collect()).collect())
    }

    /// Runs `family` (one group of [`InputMemo::families`]) through the agent on `input` with
    /// the work its strategies share done once
    /// ([`crate::replay::agent_whatif::agent_whatif_family`]), and keeps each result as
    /// [`evaluate_digest`] would have made it. A strategy whose run failed is left to
    /// [`evaluate_digest`], which reports the failure.
    pub fn run_family(&self, input: &Input, family: &[Strategy], measurer: Measurer, keep_rows: bool) -> anyhow::Result<()> {
        use crate::replay::agent_whatif::{agent_whatif_family, effective_strategy, strategy_key};
        let LoadedInput::Session(session) = &input.loaded else { return Ok(()) };
        let prepared = self.prepared(input, session, &measurer)?;
        let effectives: Vec<Strategy> = family.iter().map(|s| effective_strategy(s, prepared)).collect();
        let Ok(outcomes) = agent_whatif_family(session, &input.name, prepared, measurer, &effectives) else { return Ok(()) };
        for (effective, outcome) in effectives.iter().zip(outcomes) {
            let Ok(outcome) = outcome else { continue };
            let key = strategy_key(effective, prepared);
            let cell = self.runs.lock().map_err(|_| anyhow::anyhow!("a worker panicked"))?.entry(key).or_default().clone();
            let _ = cell.set(Ok(agent_result(input, outcome, keep_rows)));
        }
        Ok(())
    }
}

/// Evaluates `input` under `strategy` with `engine`, sharing work through `memo`; returns the
/// evaluation (rows kept when `keep_rows`) and its outcome digest
/// ([`crate::report::effects::outcome_digest`]).
pub fn evaluate_digest(input: &Input, strategy: &Strategy, measurer: &mut Measurer, keep_rows: bool, engine: Engine, memo: &InputMemo) -> anyhow::Result<(Evaluation, String)> {
    let session = match (&input.loaded, engine) {
        (LoadedInput::Session(session), Engine::Agent) => session,
        (LoadedInput::Scenario(scenario), _) => {
            let mut e = evaluate_scenario(input, scenario, strategy, measurer, true)?;
            let digest = crate::report::effects::outcome_digest(&e);
            if !keep_rows {
                e.rows = Vec::new();
            }
            return Ok((e, digest));
        }
    };
    let prepared = memo.prepared(input, session, measurer)?;
    let key = crate::replay::agent_whatif::strategy_key(&crate::replay::agent_whatif::effective_strategy(strategy, prepared), prepared);
    let cell = memo.runs.lock().map_err(|_| anyhow::anyhow!("a worker panicked"))?.entry(key).or_default().clone();
    let result = cell.get_or_init(|| {
        let outcome = crate::replay::agent_whatif::agent_whatif(session, &input.name, prepared, measurer, strategy)?;
        Ok(agent_result(input, outcome, keep_rows))
    });
    let (e, digest) = result.as_ref().map_err(|e| anyhow::anyhow!("{}: {e}", input.name))?;
    let mut e = e.clone();
    e.strategy = strategy.name.clone();
    e.summary.strategy = strategy.name.clone();
    Ok((e, digest.clone()))
}

/// The memoized evaluation of a session's run through the agent and its outcome digest.
fn agent_result(input: &Input, outcome: crate::replay::agent_whatif::AgentOutcome, keep_rows: bool) -> (Evaluation, String) {
    let mut e = agent_evaluation(input, outcome);
    let digest = crate::report::effects::outcome_digest(&e);
    if !keep_rows {
        e.rows = Vec::new();
    }
    (e, digest)
}

/// The evaluation of a session's run through the agent.
fn agent_evaluation(input: &Input, outcome: crate::replay::agent_whatif::AgentOutcome) -> Evaluation {
    let mut summary = outcome.summary;
    summary.input = input.name.clone();
    summary.info_loss = outcome.info_loss;
    summary.warnings = input.warnings.list.clone();
    let compactions = summary.compactions.clone();
    let divergence = outcome.divergence.map(|(call, why)| {
        format!("from call {call}: {why}; the recorded replies continue as recorded (the same work is assumed to happen), the agent counts its own usage from there")
    });
    let notes = AgentNotes {
        runs: outcome.runs,
        compactions: outcome
            .compactions
            .iter()
            .map(|c| AgentCompactionNote {
                call: c.call,
                stage: c.stage.clone(),
                tokens_before: c.tokens_before,
                summary: if c.stage == "session_memory_compact" {
                    "session memory"
                } else if c.recorded_summary {
                    "recorded"
                } else {
                    "stand-in"
                },
            })
            .collect(),
    };
    let mut e = recording_evaluation(input, String::new(), summary, compactions, divergence, outcome.compaction_losses, outcome.rows);
    e.agent = Some(notes);
    e
}

/// The evaluation of a recorded session run through the agent.
fn recording_evaluation(
    input: &Input,
    strategy: String,
    summary: Summary,
    compactions: std::collections::BTreeMap<String, u64>,
    divergence: Option<String>,
    compaction_losses: Vec<crate::replay::loss::CompactionLoss>,
    rows: Vec<RequestMetrics>,
) -> Evaluation {
    Evaluation {
        input: input.name.clone(),
        strategy,
        kind: "recording",
        summary,
        compactions,
        replies_diverge: divergence.is_some(),
        divergence,
        same_results_as: None,
        set_no_effect: Vec::new(),
        compaction_losses,
        engine: Some(Engine::Agent.name()),
        agent: None,
        rows,
    }
}

impl Evaluation {
    pub fn info_loss(&self) -> &InfoLoss {
        &self.summary.info_loss
    }

    /// References the compactions lost, over all of them.
    pub fn references_lost(&self) -> usize {
        self.compaction_losses.iter().map(|l| l.references_lost).sum()
    }

    /// One line per compaction of a real session: `X under S: compaction before call N: …`.
    pub fn compaction_loss_lines(&self) -> Vec<String> {
        self.compaction_losses
            .iter()
            .map(|l| {
                let names = if l.lost.is_empty() { String::new() } else { format!(" ({}{})", l.lost.join(", "), if l.references_lost > l.lost.len() { ", …" } else { "" }) };
                format!(
                    "{} under {}: compaction before call {}: {} tokens dropped, {} of {} dropped references used later{names}, {} re-reads",
                    short_name(&self.input),
                    self.strategy,
                    l.call,
                    l.tokens_dropped,
                    l.references_lost,
                    l.references_dropped,
                    l.rereads
                )
            })
            .collect()
    }

    /// `no difference on X: S gave the same results as T (why)`, when it did.
    pub fn same_results_line(&self) -> Option<String> {
        self.same_results_as.as_ref().map(|same| format!("no difference on {}: {} gave the same results as {same}", short_name(&self.input), self.strategy))
    }
}

/// Runs one input under one strategy with a fresh measurer (a recorded session through the
/// agent: [`evaluate_digest`]).
pub fn evaluate(input: &Input, strategy: &Strategy, measurer: &mut Measurer, keep_rows: bool) -> anyhow::Result<Evaluation> {
    Ok(evaluate_digest(input, strategy, measurer, keep_rows, Engine::Agent, &InputMemo::default())?.0)
}

/// A scenario run by the agent under `strategy`.
fn evaluate_scenario(input: &Input, scenario: &Scenario, strategy: &Strategy, measurer: &mut Measurer, keep_rows: bool) -> anyhow::Result<Evaluation> {
    // The loss is tracked as the bodies pass; none is kept.
    let options = RunOptions { info_loss: true, ..RunOptions::default() };
    let output = run_scenario_opts(scenario, measurer, strategy, &crate::agent::compact::Chain::new(), options)?;
    let mut summary = output.summary;
    summary.input = input.name.clone();
    let compactions = summary.compactions.clone();
    // A peer that rewrote the context changes what the model saw; the scripted replies
    // are kept as they are, which the note says.
    // (`context_editing` is the server's clearing, which changes what the model saw too.)
    const PEER_STAGES: [&str; 7] =
        ["observation_masking", "opencode_prune", "opencode_summary", "codex_compact", "cline_truncate", "server_compaction", "context_editing"];
    let first_rewrite = output.rows.iter().find(|r| r.stages.iter().any(|s| s.fired && PEER_STAGES.contains(&&*s.name)));
    let note = first_rewrite.map(|r| {
        format!("from request {} the strategy rewrote what the model saw; the scripted replies are kept as written", r.index)
    });
    Ok(Evaluation {
        input: input.name.clone(),
        strategy: strategy.name.clone(),
        kind: "scenario",
        summary,
        compactions,
        replies_diverge: false,
        divergence: note,
        same_results_as: None,
        set_no_effect: Vec::new(),
        compaction_losses: Vec::new(),
        engine: None,
        agent: None,
        rows: if keep_rows { output.rows } else { Vec::new() },
    })
}

/// Table, CSV and JSON of a comparison.
pub fn compare_table(evaluations: &[Evaluation]) -> String {
    use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
    let mut table = Table::new();
    table.load_style(UTF8_FULL_CONDENSED);
    table.set_header(vec![
        "input", "strategy", "requests", "hit ratio", "cost $", "breaks", "compactions", "peak ctx", "dropped", "recall miss", "re-reads", "note",
    ]);
    for e in evaluations {
        let mut cells = summary_cells(e, ":", " ");
        let mut note: Vec<&str> = Vec::new();
        if e.replies_diverge {
            note.push("replies diverge");
        }
        if e.same_results_as.is_some() {
            note.push("same results");
        }
        if !e.set_no_effect.is_empty() {
            note.push("--set no effect");
        }
        cells.push(note.join(", "));
        table.add_row(cells);
    }
    let mut text = table.to_string();
    let notes: Vec<String> = evaluations
        .iter()
        .flat_map(|e| {
            let divergence = e.divergence.as_ref().map(|d| format!("- {} under {}: {d}", short_name(&e.input), e.strategy));
            divergence
                .into_iter()
                .chain(e.compaction_loss_lines().into_iter().map(|l| format!("- {l}")))
                .chain(e.same_results_line().map(|l| format!("- {l}")))
        })
        .collect();
    let notes: Vec<String> = engine_line(evaluations).map(|l| format!("- {l}")).into_iter().chain(notes).collect();
    if !notes.is_empty() {
        text.push_str("\nNotes:\n");
        text.push_str(&notes.join("\n"));
    }
    text
}

/// `Engine: …` when the comparison has recorded sessions: what ran them.
fn engine_line(evaluations: &[Evaluation]) -> Option<String> {
    let engine = Engine::named(evaluations.iter().find_map(|e| e.engine)?)?;
    Some(format!("Engine: {}", engine.sentence()))
}

/// The cells both comparison tables share: input, strategy, requests, hit ratio, cost, breaks,
/// compactions (`stage{kv}n`, joined by `join`), peak context and the information loss.
fn summary_cells(e: &Evaluation, kv: &str, join: &str) -> Vec<String> {
    let s = &e.summary;
    let compactions: Vec<String> = e.compactions.iter().filter(|(_, n)| **n > 0).map(|(k, n)| format!("{k}{kv}{n}")).collect();
    vec![
        short_name(&e.input),
        e.strategy.clone(),
        s.requests.to_string(),
        format!("{:.3}", s.cache_hit_ratio),
        format!("{:.4}", s.cost_usd),
        s.cache_breaks.to_string(),
        if compactions.is_empty() { "-".to_owned() } else { compactions.join(join) },
        s.peak_context_tokens.to_string(),
        s.info_loss.tokens_dropped.to_string(),
        s.info_loss.recall_misses.to_string(),
        s.info_loss.rereads_after_compaction.to_string(),
    ]
}

fn short_name(name: &str) -> String {
    Path::new(name).file_name().map_or_else(|| name.to_owned(), |n| n.to_string_lossy().into_owned())
}

/// The compare report under `dir`: `index.html` with the comparison table, then per input the
/// strategies side by side (context tokens per main-lane request, cumulative cost), and a PNG
/// of every chart. The evaluations need their rows (`compare(.., keep_rows: true)`).
pub fn write_compare_report(dir: &Path, evaluations: &[Evaluation]) -> Result<Vec<PathBuf>, crate::report::html::ReportError> {
    use crate::report::html::{PageSection, escape, slug, write_sections_page};
    use std::fmt::Write;
    let mut intro = String::from("<table class=\"compare\">\n<tr>");
    for head in ["input", "strategy", "requests", "hit ratio", "cost $", "breaks", "compactions", "peak context", "dropped", "recall misses", "re-reads", "note"] {
        let _ = write!(intro, "<th>{head}</th>");
    }
    intro.push_str("</tr>\n");
    for e in evaluations {
        let mut cells = summary_cells(e, " ", ", ");
        let note: Vec<String> = e.divergence.iter().cloned().chain(e.same_results_line()).collect();
        cells.push(note.join("; "));
        intro.push_str("<tr>");
        for cell in cells {
            let _ = write!(intro, "<td>{}</td>", escape(&cell));
        }
        intro.push_str("</tr>\n");
    }
    intro.push_str("</table>\n");
    if let Some(line) = engine_line(evaluations) {
        let _ = writeln!(intro, "<p class=\"meta\">{}</p>", escape(&line));
    }
    let mut inputs: Vec<&str> = Vec::new();
    for e in evaluations {
        if !inputs.contains(&e.input.as_str()) {
            inputs.push(&e.input);
        }
    }
    let mut stems: Vec<String> = Vec::new();
    let sections = inputs
        .into_iter()
        .map(|input| {
            let runs: Vec<(&str, &[RequestMetrics])> =
                evaluations.iter().filter(|e| e.input == input).map(|e| (e.strategy.as_str(), e.rows.as_slice())).collect();
            let name = short_name(input);
            let mut stem = slug(input);
            while stems.contains(&stem) {
                stem.push('_');
            }
            stems.push(stem.clone());
            let kind = evaluations.iter().find(|e| e.input == input).map_or("", |e| e.kind);
            PageSection {
                title: name.clone(),
                stem,
                html: format!("<p class=\"meta\">{} · {} strategies</p>\n", escape(kind), runs.len()),
                charts: vec![crate::report::plots::compare_context_chart(&name, &runs), crate::report::plots::compare_cost_chart(&name, &runs)],
            }
        })
        .collect();
    write_sections_page(dir, "ctxsim compare", &intro, sections)
}

/// The CSV header of a comparison row.
pub fn compare_csv(evaluations: &[Evaluation]) -> Vec<u8> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    let mut header: Vec<String> = [
        "input", "strategy", "kind", "engine", "requests", "cache_hit_ratio", "cost_usd", "cache_breaks", "peak_context_tokens",
        "tokens_dropped", "recall_misses", "rereads_after_compaction", "replies_diverge", "divergence", "same_results_as",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    header.extend(COMPACTION_KEYS.iter().map(|k| format!("compactions_{k}")));
    writer.write_record(&header).expect("csv to memory");
    for e in evaluations {
        let s = &e.summary;
        let mut record = vec![
            e.input.clone(),
            e.strategy.clone(),
            e.kind.to_owned(),
            e.engine.unwrap_or_default().to_owned(),
            s.requests.to_string(),
            format!("{:.6}", s.cache_hit_ratio),
            format!("{:.6}", s.cost_usd),
            s.cache_breaks.to_string(),
            s.peak_context_tokens.to_string(),
            s.info_loss.tokens_dropped.to_string(),
            s.info_loss.recall_misses.to_string(),
            s.info_loss.rereads_after_compaction.to_string(),
            e.replies_diverge.to_string(),
            e.divergence.clone().unwrap_or_default(),
            e.same_results_as.clone().unwrap_or_default(),
        ];
        record.extend(COMPACTION_KEYS.iter().map(|k| e.compactions.get(*k).copied().unwrap_or(0).to_string()));
        writer.write_record(&record).expect("csv to memory");
    }
    writer.into_inner().expect("csv to memory")
}

/// Evaluates every input under every strategy in parallel; results in (input, strategy) order.
/// A strategy whose results on an input equal an earlier strategy's is marked
/// (`same_results_as`, with the reason when the replay of a recording explains it).
pub fn compare(
    inputs: &[Input],
    strategies: &[Strategy],
    make_measurer: &(dyn Fn() -> Measurer + Sync),
    keep_rows: bool,
) -> anyhow::Result<Vec<Evaluation>> {
    compare_with(inputs, strategies, make_measurer, keep_rows, Engine::Agent)
}

/// [`compare`] with recorded sessions run by `engine`.
pub fn compare_with(
    inputs: &[Input],
    strategies: &[Strategy],
    make_measurer: &(dyn Fn() -> Measurer + Sync),
    keep_rows: bool,
    engine: Engine,
) -> anyhow::Result<Vec<Evaluation>> {
    let checks: Vec<Vec<Option<Strategy>>> = Vec::new();
    Ok(compare_checked(inputs, strategies, &checks, make_measurer, keep_rows, engine)?.0)
}

/// A `--set KEY=VALUE` of `compare` that changed no result on one input: under every strategy
/// (`all`) or under those named.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetNoEffect {
    pub input: String,
    pub set: String,
    /// The strategies under which it changed nothing, in the order given.
    pub strategies: Vec<String>,
    /// Every strategy of the comparison.
    pub all: bool,
    /// Why, when it could be established ([`crate::report::effects::Reason`]); else "".
    pub reason: String,
}

impl SetNoEffect {
    /// `no effect on X: --set K=V changed no result (REASON)`, or `… under S, T` when the set
    /// changed the results of the other strategies.
    pub fn line(&self) -> String {
        let mut line = format!("no effect on {}: --set {} changed no result", short_name(&self.input), self.set);
        if !self.all {
            line.push_str(&format!(" under {}", self.strategies.join(", ")));
        }
        if !self.reason.is_empty() {
            line.push_str(&format!(" ({})", self.reason));
        }
        line
    }
}

/// `compare --set`: every strategy resolved with every set, and each set weighed by running each
/// strategy without it (`Strategy::resolve_with` over the other sets) on every input. A set
/// whose runs without it give the same outcome digest on an input changed no result there
/// ([`crate::report::effects::outcome_digest`] decides, as `sweep` does). A strategy that already
/// has the set's value is not run again. The evaluations are [`compare_with`]'s, with
/// `set_no_effect` filled in.
pub fn compare_sets(
    inputs: &[Input],
    names: &[String],
    sets: &[String],
    make_measurer: &(dyn Fn() -> Measurer + Sync),
    keep_rows: bool,
    engine: Engine,
) -> anyhow::Result<(Vec<Evaluation>, Vec<SetNoEffect>, Vec<String>)> {
    let strategies: Vec<Strategy> = names.iter().map(|s| Strategy::resolve_with(s, sets)).collect::<Result<_, _>>()?;
    let key_of = |set: &str| set.split_once('=').map_or(set, |(k, _)| k).trim().to_owned();
    // checks[j][s]: strategy s without set j.
    let checks: Vec<Vec<SetCheck>> = (0..sets.len())
        .map(|j| {
            let others: Vec<String> = sets.iter().enumerate().filter(|&(k, _)| k != j).map(|(_, s)| s.clone()).collect();
            names
                .iter()
                .zip(&strategies)
                .map(|(name, with)| match Strategy::resolve_with(name, &others) {
                    Ok(without) if serde_json::to_value(&without).ok() == serde_json::to_value(with).ok() => SetCheck::Same,
                    Ok(without) => SetCheck::Run(without),
                    Err(e) => SetCheck::NotAlone(e.to_string()),
                })
                .collect()
        })
        .collect();
    let runs: Vec<Vec<Option<Strategy>>> =
        checks.iter().map(|row| row.iter().map(|c| if let SetCheck::Run(w) = c { Some(w.clone()) } else { None }).collect()).collect();
    let (mut evaluations, digests, without) = compare_checked(inputs, &strategies, &runs, make_measurer, keep_rows, engine)?;
    let mut warnings = Vec::new();
    let mut unweighed = Vec::new();
    let n = strategies.len();
    for (j, set) in sets.iter().enumerate() {
        for (s, check) in checks[j].iter().enumerate() {
            if let SetCheck::NotAlone(why) = check {
                unweighed.push(format!("--set {set} not weighed under {}: without it the strategy is not valid ({why})", strategies[s].name));
            }
        }
    }
    for (i, input) in inputs.iter().enumerate() {
        for (j, set) in sets.iter().enumerate() {
            // Under which strategies the set changed nothing: its value was theirs already, or
            // the run without it has the same outcome.
            let unchanged: Vec<usize> = (0..n)
                .filter(|&s| match &checks[j][s] {
                    SetCheck::Same => true,
                    SetCheck::Run(_) => without[j][i * n + s].as_ref().is_some_and(|(d, _)| *d == digests[i * n + s]),
                    SetCheck::NotAlone(_) => false,
                })
                .collect();
            if unchanged.is_empty() {
                continue;
            }
            for &s in &unchanged {
                evaluations[i * n + s].set_no_effect.push(set.clone());
            }
            let all = unchanged.len() == n;
            let reason = if unchanged.iter().all(|&s| matches!(checks[j][s], SetCheck::Same)) {
                if sets[j + 1..].iter().any(|later| key_of(later) == key_of(set)) {
                    "a later --set gives the same key".to_owned()
                } else {
                    "the strategies already have this value".to_owned()
                }
            } else {
                let pairs: Vec<(Strategy, Strategy)> =
                    unchanged.iter().filter_map(|&s| runs[j][s].clone().map(|w| (w, strategies[s].clone()))).collect();
                // The peak context over the runs with the set and without it.
                let peak = (0..n)
                    .map(|s| evaluations[i * n + s].summary.peak_context_tokens.max(without[j][i * n + s].as_ref().map_or(0, |(_, p)| *p)))
                    .max()
                    .unwrap_or(0);
                set_reason(input, set, &pairs, peak, engine)
            };
            warnings.push(SetNoEffect { input: input.name.clone(), set: set.clone(), strategies: unchanged.iter().map(|&s| strategies[s].name.clone()).collect(), all, reason });
        }
    }
    Ok((evaluations, warnings, unweighed))
}

/// How a strategy without one `--set` stands.
enum SetCheck {
    /// The same strategy: the set gives a value it had (or a later set of the same key does).
    Same,
    /// Another strategy, run to weigh the set.
    Run(Strategy),
    /// Not a valid strategy without the set (a combination the set completes): not weighed.
    NotAlone(String),
}

/// Why a set changed nothing on `input`, as `sweep` explains a parameter
/// ([`crate::report::effects::Reason`]): `pairs` are (without the set, with it) per strategy.
fn set_reason(input: &Input, set: &str, pairs: &[(Strategy, Strategy)], peak: u64, engine: Engine) -> String {
    use crate::report::sweep::{Grid, Param};
    let (key, value) = set.split_once('=').unwrap_or((set, ""));
    let grid = Grid { params: vec![Param { key: key.trim().to_owned(), values: vec![String::new(), value.trim().to_owned()] }], base: String::new(), inputs: Vec::new(), engine: None };
    let points: Vec<Strategy> = pairs.iter().flat_map(|(without, with)| [without.clone(), with.clone()]).collect();
    // The grid's wording, said of the strategies compared.
    crate::report::effects::Reason::find_with(&grid, &points, 0, input, engine).text(peak).replace("at every point of the grid", "under every strategy compared")
}

/// Evaluates every (input, strategy) job and, for `checks[j][s]` present, that strategy without
/// set j on every input, in one parallel pass sharing each input's memo. Returns the evaluations
/// (with `same_results_as`), their outcome digests, and per set the digests and peak contexts of
/// the runs without it (`[j][input * strategies + s]`, None where not run).
#[allow(clippy::type_complexity)]
fn compare_checked(
    inputs: &[Input],
    strategies: &[Strategy],
    checks: &[Vec<Option<Strategy>>],
    make_measurer: &(dyn Fn() -> Measurer + Sync),
    keep_rows: bool,
    engine: Engine,
) -> anyhow::Result<(Vec<Evaluation>, Vec<String>, Vec<Vec<Option<(String, u64)>>>)> {
    use rayon::prelude::*;
    let n = strategies.len();
    // (input, strategy, None) for the comparison, (input, strategy, Some(set)) for the checks.
    let jobs: Vec<(usize, usize, Option<usize>)> = (0..inputs.len())
        .flat_map(|i| {
            (0..n)
                .map(move |s| (i, s, None))
                .chain((0..checks.len()).flat_map(move |j| (0..n).filter(move |&s| checks[j][s].is_some()).map(move |s| (i, s, Some(j)))))
        })
        .collect();
    // Strategies that make the same replay (or agent run) of a session share it.
    let memos: Vec<InputMemo> = inputs.iter().map(|_| InputMemo::default()).collect();
    let results: Vec<(Evaluation, String)> = jobs
        .par_iter()
        .map(|&(i, s, j)| {
            let mut measurer = make_measurer();
            let strategy = match j {
                Some(j) => checks[j][s].as_ref().expect("only checks that exist are jobs"),
                None => &strategies[s],
            };
            // The checks keep rows like the comparison (a memoized run is shared by strategy key),
            // then drop them: only their digest and peak are used.
            let result = evaluate_digest(&inputs[i], strategy, &mut measurer, keep_rows, engine, &memos[i]);
            match (result, j) {
                (Ok((mut e, digest)), Some(_)) => {
                    e.rows = Vec::new();
                    Ok((e, digest))
                }
                (Ok(done), None) => Ok(done),
                (Err(e), None) => Err(anyhow::anyhow!("{} under {}: {e}", inputs[i].name, strategy.name)),
                (Err(e), Some(_)) => Err(anyhow::anyhow!("{} under {} without one of the --set given (weighing it): {e}", inputs[i].name, strategy.name)),
            }
        })
        .collect::<anyhow::Result<_>>()?;
    let mut evaluations = Vec::with_capacity(inputs.len() * n);
    let mut digests = Vec::with_capacity(inputs.len() * n);
    let mut without: Vec<Vec<Option<(String, u64)>>> = vec![vec![None; inputs.len() * n]; checks.len()];
    for (&(i, s, j), (e, digest)) in jobs.iter().zip(results) {
        match j {
            None => {
                evaluations.push(e);
                digests.push(digest);
            }
            Some(j) => without[j][i * n + s] = Some((digest, e.summary.peak_context_tokens)),
        }
    }
    for (job, e) in evaluations.iter_mut().enumerate() {
        let s = job % n;
        let first = (0..s).find(|&t| digests[job - s + t] == digests[job]);
        if let Some(t) = first {
            e.same_results_as = Some(strategies[t].name.clone());
        }
    }
    Ok((evaluations, digests, without))
}
