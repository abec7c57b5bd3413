use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::live::client::{ClientConfig, HttpClient};
use crate::live::run::{LiveOptions, live_table, run_live_with};
use crate::recording::format::write_recording;
use crate::scenario::load_scenario_confined;

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
    /// Every scenario's `world.mount[].from` must resolve inside this directory.
    #[arg(long, value_name = "DIR")]
    pub mount_root: Option<PathBuf>,
    /// Seconds to open a connection before the call fails.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub connect_timeout: u64,
    /// Seconds of silence from the server (waiting for the answer or the next part of its
    /// stream) before the call fails.
    #[arg(long, default_value_t = 120, value_name = "SECS")]
    pub read_timeout: u64,
    /// Seconds one call may take in all before it fails.
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    pub timeout: u64,
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
    for (flag, secs) in [("--connect-timeout", args.connect_timeout), ("--read-timeout", args.read_timeout), ("--timeout", args.timeout)] {
        if secs == 0 {
            anyhow::bail!("{flag} must be at least 1 second");
        }
    }
    config.timeouts = crate::live::client::Timeouts {
        connect: std::time::Duration::from_secs(args.connect_timeout),
        read: std::time::Duration::from_secs(args.read_timeout),
        total: std::time::Duration::from_secs(args.timeout),
    };
    let inputs = super::common::inputs_with(&args.measure, [args.scenario.clone(), PathBuf::from(&args.strategy)]);
    super::common::guard_trace(&args.measure, &inputs)?;
    if let Some(path) = &args.record {
        inputs.refuse_file("--record", path)?;
    }
    let scenario = load_scenario_confined(&args.scenario, args.mount_root.as_deref())?;
    let strategy = crate::strategy::Strategy::resolve_with(&args.strategy, &args.sets)?;
    let mut measurer = measurer(&args.measure)?;
    let options = LiveOptions { model: args.model, max_calls_per_turn: args.max_calls_per_turn, call_ms: args.call_ms };
    let mut client = HttpClient::new(config);
    // The recording and the trace are rewritten (atomically) after every answered call, so
    // the calls paid for survive a failure later in the run.
    let mut checkpoint = |recording: &crate::recording::Recording, calls: &[crate::live::run::LiveCall]| -> std::io::Result<()> {
        if let Some(path) = &args.record {
            write_recording(path, recording).map_err(std::io::Error::other)?;
        }
        if let Some(path) = &args.measure.trace {
            let rows: Vec<_> = calls.iter().map(|c| c.row.clone()).collect();
            let bytes = if path.extension().is_some_and(|e| e == "csv") { crate::report::output::trace_csv(&rows) } else { crate::report::output::trace_jsonl(&rows) };
            crate::report::output::write_atomic(path, &bytes)?;
        }
        Ok(())
    };
    let output = run_live_with(&scenario, &mut measurer, &strategy, &mut client, &options, &mut checkpoint)?;
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
