use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::live::client::{ClientConfig, HttpClient};
use crate::live::run::{LiveOptions, live_table, run_live};
use crate::recording::format::write_recording;
use crate::scenario::load_scenario;

use super::args::MeasureOpts;
use super::common::{emit, measurer};

#[derive(Debug, Args)]
pub struct LiveArgs {
    /// The scenario (YAML): world and user steps; the API answers instead of its assistant steps.
    pub scenario: PathBuf,
    /// Model id sent instead of the scenario's.
    #[arg(long)]
    pub model: Option<String>,
    /// Write what happened as a ctxsim recording (format v1).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Strategy: a preset name or a file.
    #[arg(long, default_value = "claude-code")]
    pub strategy: String,
    /// `key=value` knob overrides (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Model calls of one turn before it is cut.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub max_calls_per_turn: usize,
    /// Virtual milliseconds one model call takes.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub call_ms: u64,
    /// `anthropic-beta` values, comma-separated (default: the ones the real client sends).
    #[arg(long, value_delimiter = ',')]
    pub betas: Option<Vec<String>>,
    /// Retries of a 429/529 answer (`retry-after` honoured, at most 60 s each).
    #[arg(long, default_value_t = 4)]
    pub max_retries: u32,
    #[command(flatten)]
    pub measure: MeasureOpts,
}

pub fn run(args: LiveArgs) -> anyhow::Result<i32> {
    let mut config = ClientConfig::from_env(|name| std::env::var(name).ok())?;
    if let Some(betas) = args.betas {
        config.betas = betas.into_iter().filter(|b| !b.trim().is_empty()).collect();
    }
    config.max_retries = args.max_retries;
    let inputs = super::common::inputs_with(&args.measure, [args.scenario.clone(), PathBuf::from(&args.strategy)]);
    super::common::guard_trace(&args.measure, &inputs)?;
    if let Some(path) = &args.record {
        inputs.refuse_file("--record", path)?;
    }
    let scenario = load_scenario(&args.scenario)?;
    let strategy = crate::strategy::Strategy::resolve_with(&args.strategy, &args.sets)?;
    let mut measurer = measurer(&args.measure)?;
    let options = LiveOptions { model: args.model, max_calls_per_turn: args.max_calls_per_turn, call_ms: args.call_ms };
    let mut client = HttpClient::new(config);
    let output = run_live(&scenario, &mut measurer, &strategy, &mut client, &options)?;
    if let Some(path) = &args.record {
        write_recording(path, &output.recording).with_context(|| format!("failed to write the recording {}", path.display()))?;
    }
    if !args.measure.quiet {
        out!("{}", live_table(&output.calls));
    }
    let rows: Vec<_> = output.calls.iter().map(|c| c.row.clone()).collect();
    emit(&args.measure, std::slice::from_ref(&output.summary), &rows)?;
    Ok(super::exit::OK)
}
