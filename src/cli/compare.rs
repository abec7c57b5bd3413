use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::report::compare::{compare_csv, compare_sets, compare_table, load_inputs_filtered};
use crate::report::output::write_atomic;
use crate::strategy::Strategy;

use super::args::{Format, MeasureOpts};
use super::common::measurer;

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Scenarios (YAML), recordings or Claude Code transcripts, or directories of them; the
    /// session filters apply to sessions.
    #[command(flatten)]
    pub sessions: super::sessions::SessionInputs,
    /// Comma-separated presets or strategy files.
    #[arg(long, value_delimiter = ',', required = true)]
    pub strategies: Vec<String>,
    /// `key=value` applied to every strategy (repeatable). Each set is weighed too: every
    /// strategy also runs without it (so each set adds one run per strategy and input), and a set
    /// that changed no result on an input is reported
    /// (`warning: no effect on X: --set K=V changed no result (why)`; `set_no_effect` in
    /// compare.json).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Write compare.csv, compare.json and the HTML report with plots under DIR.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Every scenario's `world.mount[].from` must resolve inside this directory.
    #[arg(long, value_name = "DIR")]
    pub mount_root: Option<PathBuf>,
    /// Worker threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// What runs a recorded session under each strategy: `agent`, the only engine (the agent
    /// itself, driven by the session; every knob applies; docs/fidelity.md, "What-ifs through
    /// the agent"; `replay` was removed). Every output names the engine.
    #[arg(long, value_parser = super::args::parse_engine, default_value = "agent")]
    pub engine: super::args::Engine,
    #[command(flatten)]
    pub measure: MeasureOpts,
}

pub fn run(args: CompareArgs, diag: &mut super::diag::Diagnostics) -> anyhow::Result<i32> {
    let engine = args.engine.report();
    // Resolved here for the error a bad name or set gives before any input is read.
    let _: Vec<Strategy> = args.strategies.iter().map(|s| Strategy::resolve_with(s, &args.sets)).collect::<Result<_, _>>()?;
    let guarded = super::common::inputs_with(&args.measure, args.sessions.inputs.iter().cloned().chain(args.strategies.iter().map(PathBuf::from)));
    let out_dir = args.out.as_deref().map(|d| super::guard::GuardedDir::begin("--out", d, &guarded)).transpose()?;
    let inputs = load_inputs_filtered(&args.sessions.inputs, &args.sessions.filter(), args.mount_root.as_deref())?;
    for input in &inputs {
        diag.report(&input.warnings);
    }
    measurer(&args.measure)?;
    let shared = std::sync::Arc::new(crate::measure::token_cache::SharedCounts::default());
    let make = || super::common::measurer_sharing(&args.measure, Some(&shared)).expect("options were checked");
    let pool = rayon::ThreadPoolBuilder::new().num_threads(args.threads.unwrap_or(0)).build()?;
    let (evaluations, set_warnings, unweighed) = pool.install(|| compare_sets(&inputs, &args.strategies, &args.sets, &make, args.out.is_some(), engine))?;
    for line in evaluations.iter().filter_map(|e| e.same_results_line()) {
        eprintln!("warning: {line}");
    }
    for warning in &set_warnings {
        eprintln!("warning: {}", warning.line());
    }
    for line in &unweighed {
        eprintln!("warning: {line}");
    }
    if let Some(out) = out_dir {
        let dir = out.path();
        write_atomic(&dir.join("compare.csv"), &compare_csv(&evaluations))?;
        write_atomic(&dir.join("compare.json"), serde_json::to_string_pretty(&evaluations)?.as_bytes())?;
        crate::report::compare::write_compare_report(dir, &evaluations).with_context(|| format!("failed to write the report under {}", dir.display()))?;
        out.commit()?;
    }
    if !args.measure.quiet {
        match args.measure.format {
            Format::Table => outln!("{}", compare_table(&evaluations)),
            Format::Json => outln!("{}", serde_json::to_string_pretty(&evaluations)?),
            Format::Csv => out!("{}", String::from_utf8_lossy(&compare_csv(&evaluations))),
        }
    }
    Ok(super::exit::OK)
}
