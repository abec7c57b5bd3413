use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Deterministic simulation and measurement of a coding agent's context pipeline and the
/// provider's prompt cache.
#[derive(Debug, Parser)]
#[command(name = "ctxsim", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Treat every input warning (a skipped line or record) as an error: exit 2.
    #[arg(long, global = true)]
    pub strict: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent on scenario files (YAML) and measure every request.
    Run(RunArgs),
    /// Measure a log of raw request bodies from any client.
    Analyze(AnalyzeArgs),
    /// Count tokens of files with an estimator.
    Tokens(TokensArgs),
    /// List the closed list of cache-break causes.
    Causes,
    /// Convert a real transcript or a captured request log into a ctxsim recording (or request log).
    Import(ImportArgs),
    /// Run recordings or Claude Code transcripts (detected) under a strategy, through the agent.
    Replay(ReplayArgs),
    /// Drive the agent by real sessions and compare the simulated usage with what the API
    /// reported.
    Fidelity(FidelityArgs),
    /// CI gate: run a suite, enforce its `expect:` budgets and a baseline.
    Check(super::check::CheckArgs),
    /// HTML report with plots (inline SVG, and PNG files) from traces.
    Report(super::report::ReportArgs),
    /// List the strategy presets, their sources, and every knob with its default.
    Strategies(super::strategies::StrategiesArgs),
    /// The same inputs under several strategies: table, CSV, JSON, plots.
    Compare(super::compare::CompareArgs),
    /// A grid over strategy knobs: CSV of every point, Pareto front, recommendation.
    Sweep(super::sweep::SweepArgs),
    /// Loopback Messages API (SSE and JSON) answering from a script; measures every request.
    Serve(super::serve::ServeArgs),
    /// The agent against the real Messages API (`ANTHROPIC_API_KEY`); records; compares estimate with actual.
    Live(super::live::LiveArgs),
    /// Your real sessions: billed cost (as ccusage), cache breaks by cause and their dollars, TTL,
    /// compactions, and what a setting the replay honours would have saved.
    Audit(super::audit::AuditArgs),
    /// Fit the `calibrated` estimator on your sessions' texts against the real `count_tokens`
    /// endpoint (`--from-api`; key from `ANTHROPIC_API_KEY`, never written).
    Calibrate(super::calibrate::CalibrateArgs),
    /// Two request logs compared structurally, request by request (kinds, sizes, markers, cache_control).
    DiffRequests(super::diff_requests::DiffRequestsArgs),
    /// Version profiles of the real client: `profile capture --client PATH` drives it through the probes.
    Profile(super::profile::ProfileArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ImportSource {
    /// A Claude Code session transcript (with `<session>/subagents/` beside it).
    ClaudeCode,
    /// A ctxsim request log.
    RequestLog,
    /// A claude-trace capture; becomes an `analyze` request log.
    ClaudeTrace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ImportTarget {
    /// Recording format v1.
    Recording,
    /// Scenario format v1 (YAML): the session as a workload for the agent.
    Scenario,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    pub input: PathBuf,
    /// Where to write the recording.
    #[arg(short, long, value_name = "RECORDING")]
    pub output: PathBuf,
    /// Input format; detected from the first line when not given.
    #[arg(long, value_enum)]
    pub from: Option<ImportSource>,
    /// What to write: a recording (default), or a scenario that drives the agent through the
    /// session (`ctxsim run` takes it; sized filler stands for what the agent does not model).
    #[arg(long, value_enum, default_value = "recording")]
    pub to: ImportTarget,
    /// Do not print the import report.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub sessions: super::sessions::SessionInputs,
    /// Strategy: `as-recorded` (the client's own behaviour: `claude-code` under the recorded
    /// version's output reserve, TTL and settings), a preset or a file. Every knob applies.
    #[arg(long, default_value = "as-recorded")]
    pub strategy: String,
    /// `key=value` knob overrides (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// What runs each session: `agent`, the only engine (the agent itself, driven by the session
    /// under the strategy, as `compare` runs it). The summary names it (`engine`: table line, JSON
    /// field, CSV column).
    #[arg(long, value_parser = parse_engine, default_value = "agent")]
    pub engine: Engine,
    #[command(flatten)]
    pub measure: MeasureOpts,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FidelityFormat {
    Table,
    Json,
}

#[derive(Debug, Args)]
pub struct FidelityArgs {
    #[command(flatten)]
    pub sessions: super::sessions::SessionInputs,
    #[arg(long, value_enum, default_value = "table")]
    pub format: FidelityFormat,
    /// Token estimator (default `calibrated`: the closest to billed tokens, per model family).
    #[arg(long, value_enum, default_value = "calibrated")]
    pub estimator: Estimator,
    /// Calibration parameters for the calibrated estimator (JSON).
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    /// Fit the calibrated estimator on the given transcripts and write it here (the fit reads the
    /// recorded messages).
    #[arg(long, value_name = "OUT.json")]
    pub fit: Option<PathBuf>,
    /// Also list the recorded cache breaks with the cause the replay attributes.
    #[arg(long)]
    pub breaks: bool,
    /// Per-call rows: kept in the JSON output, printed as a table per session with `--format table`.
    #[arg(long)]
    pub calls: bool,
    /// Write `<session>.svg` and `<session>.png` (simulated vs recorded context per call) here.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Ablation: the agent's recorded-client rules leave out the prompt re-rendering at a new turn
    /// (the N-pattern of 2.0.76–2.1.39, the conversation start 2.1.200+ renders anew).
    #[arg(long, alias = "no-rerender-rate")]
    pub no_rerender: bool,
    /// Ablation: the agent's recorded-client rules seed no side entry where a finished turn
    /// leaves one (the conversation through its reply).
    #[arg(long)]
    pub no_side_entry: bool,
    /// Ablation: size the agent's unrecorded part (system, tools, user context) from the
    /// reconstructed requests, also where a 2.1.2xx/3xx transcript recorded the request it sent
    /// (`api-request` records, read by default).
    #[arg(long)]
    pub no_recorded_requests: bool,
    /// Also give a range for Σcache_creation and cost from the observed hit rates of the rules
    /// the calls' outcome rested on (JSON: `interval`; table: the columns of the rules section).
    #[arg(long)]
    pub interval: bool,
    /// Score every session with a calibration fitted on the others: leaving out one session,
    /// or its whole project (the transcript's directory), at a time.
    #[arg(long, value_enum, value_name = "session|project")]
    pub cross_validate: Option<CrossValidate>,
    /// What rebuilds each recorded request: `agent`, the only engine (the agent itself, driven
    /// by the session as a workload: its own system prompt, tools, attachments and compactions;
    /// `ctxsim import --to scenario`). Every output names it (`engine` in the JSON, a line under
    /// the table).
    #[arg(long, value_parser = parse_engine, default_value = "agent")]
    pub engine: Engine,
    /// The strategy the agent runs under with `--engine agent` (preset name or file).
    #[arg(long, default_value = "claude-code")]
    pub strategy: String,
}

/// What runs a recorded session: the agent, the one model of the client (`--engine agent`; the
/// flag stays for scripts). The record-based engine (`--engine replay`) was removed in session 26.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// The agent, driven by the recorded session: every knob applies.
    Agent,
}

/// The message `--engine replay` is refused with, on every command.
pub const ENGINE_REPLAY_REMOVED: &str = "`--engine replay` was removed: the agent measures recorded sessions as recorded (`--strategy as-recorded`, the default of `replay`; `claude-code`, the default of `fidelity`); drop the flag or pass `--engine agent`";

/// `--engine`'s value: `agent`, or an error (exit 2) for `replay` and anything else.
pub fn parse_engine(value: &str) -> Result<Engine, String> {
    match value {
        "agent" => Ok(Engine::Agent),
        "replay" => Err(ENGINE_REPLAY_REMOVED.to_owned()),
        other => Err(format!("unknown engine `{other}`: the only engine is `agent`")),
    }
}

impl Engine {
    /// The engine's name in outputs (`agent`).
    pub fn name(self) -> &'static str {
        self.report().name()
    }

    /// The engine as the comparison and report code name it.
    pub fn report(self) -> crate::report::compare::Engine {
        match self {
            Engine::Agent => crate::report::compare::Engine::Agent,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CrossValidate {
    /// Leave one session out.
    Session,
    /// Leave one project out.
    Project,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Csv,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Estimator {
    /// The client's own rough count: UTF-16 length / 4.
    Chars4,
    /// o200k_base tokens: under-counts what Claude bills.
    Bpe,
    /// o200k_base tokens scaled per model family to Claude's billed tokens
    /// (data/calibration.json): the closest to the bill, the default of every measuring command.
    Calibrated,
}

impl From<Estimator> for crate::measure::EstimatorKind {
    fn from(e: Estimator) -> Self {
        match e {
            Estimator::Chars4 => crate::measure::EstimatorKind::Chars4,
            Estimator::Bpe => crate::measure::EstimatorKind::Bpe,
            Estimator::Calibrated => crate::measure::EstimatorKind::Calibrated,
        }
    }
}

/// Options shared by every measuring command.
#[derive(Debug, Clone, Args)]
pub struct MeasureOpts {
    /// Token estimator (default `calibrated`: the closest to billed tokens, per model family).
    #[arg(long, value_enum, default_value = "calibrated")]
    pub estimator: Estimator,
    /// A model table replacing the shipped one (same shape as data/models.toml).
    #[arg(long, value_name = "FILE")]
    pub model_table: Option<PathBuf>,
    /// Calibration parameters for the calibrated estimator (JSON).
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    /// Output format of the summary.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Write one JSON line per request here (`.csv`: CSV, `.parquet`: Parquet).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Print nothing but errors.
    #[arg(long)]
    pub quiet: bool,
    /// Never draw progress bars.
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogSource {
    /// ctxsim's request log: `{"time_ms", "body", "lane"?, "usage"?}` per line.
    RequestLog,
    /// A claude-trace capture (`{"request": ..., "response": ...}` per line).
    ClaudeTrace,
}

#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// Request logs (JSONL, or a JSON array of bodies).
    #[arg(required = true)]
    pub logs: Vec<PathBuf>,
    /// Input format; detected from the first line when not given.
    #[arg(long, value_enum)]
    pub from: Option<LogSource>,
    /// Print every request block by block.
    #[arg(long)]
    pub explain: bool,
    #[command(flatten)]
    pub measure: MeasureOpts,
}

#[derive(Debug, Args)]
pub struct TokensArgs {
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Token estimator (default `calibrated`: the closest to billed tokens, per model family).
    #[arg(long, value_enum, default_value = "calibrated")]
    pub estimator: Estimator,
    /// Model family for the calibrated estimator.
    #[arg(long, default_value = "sonnet")]
    pub family: String,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Scenario files, or directories of them (every *.yaml inside, sorted).
    #[arg(required = true)]
    pub scenarios: Vec<PathBuf>,
    /// Strategy preset name or a TOML/YAML file of knob overrides.
    #[arg(long, default_value = "claude-code")]
    pub strategy: String,
    /// `key=value` knob overrides (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// The Claude Code release whose requests the agent builds: 2.1.88 (the default) or 2.1.332
    /// (the strategy knob `client_version`; docs/profiles.md).
    #[arg(long, value_name = "VERSION")]
    pub client_version: Option<String>,
    /// Override the scenarios' seeds.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run every scenario twice and name the first request whose bytes differ.
    #[arg(long)]
    pub check_determinism: bool,
    /// Write every request body as NNNN.json under DIR/<scenario>/.
    #[arg(long, value_name = "DIR")]
    pub dump_requests: Option<PathBuf>,
    /// Write summary.json, summary.csv, trace.jsonl, requests.txt and the HTML report with
    /// plots (index.html, *.png) under DIR.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Every scenario's `world.mount[].from` must resolve inside this directory.
    #[arg(long, value_name = "DIR")]
    pub mount_root: Option<PathBuf>,
    /// Run hook commands of the settings for real (`sh -c` on this machine) when the scenario
    /// scripts no answer for them. Only this flag turns it on: a strategy file or `--set` cannot.
    #[arg(long, alias = "run-hooks")]
    pub allow_host_commands: bool,
    /// Skip a stage of the long-context chain by name (repeatable). An unknown name is an
    /// error that lists the valid ones.
    #[arg(long = "disable-stage", value_name = "NAME")]
    pub disable_stage: Vec<String>,
    #[command(flatten)]
    pub measure: MeasureOpts,
}
