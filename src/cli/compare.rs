use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::report::compare::{compare, compare_csv, compare_table, load_inputs};
use crate::report::output::write_atomic;
use crate::strategy::Strategy;

use super::args::{Format, MeasureOpts};
use super::common::measurer;

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Scenarios (YAML), recordings or Claude Code transcripts, or directories of them.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Comma-separated presets or strategy files.
    #[arg(long, value_delimiter = ',', required = true)]
    pub strategies: Vec<String>,
    /// `key=value` applied to every strategy (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Write compare.csv, compare.json and the HTML report with plots under DIR.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Worker threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub measure: MeasureOpts,
}

pub fn run(args: CompareArgs, diag: &mut super::diag::Diagnostics) -> anyhow::Result<i32> {
    let strategies: Vec<Strategy> = args.strategies.iter().map(|s| Strategy::resolve_with(s, &args.sets)).collect::<Result<_, _>>()?;
    let inputs = load_inputs(&args.inputs)?;
    for input in &inputs {
        diag.report(&input.warnings);
    }
    measurer(&args.measure)?;
    let make = || measurer(&args.measure).expect("options were checked");
    let pool = rayon::ThreadPoolBuilder::new().num_threads(args.threads.unwrap_or(0)).build()?;
    let evaluations = pool.install(|| compare(&inputs, &strategies, &make, args.out.is_some()))?;
    if let Some(dir) = &args.out {
        write_atomic(&dir.join("compare.csv"), &compare_csv(&evaluations))?;
        write_atomic(&dir.join("compare.json"), serde_json::to_string_pretty(&evaluations)?.as_bytes())?;
        crate::report::compare::write_compare_report(dir, &evaluations).with_context(|| format!("failed to write the report under {}", dir.display()))?;
    }
    if !args.measure.quiet {
        match args.measure.format {
            Format::Table => println!("{}", compare_table(&evaluations)),
            Format::Json => println!("{}", serde_json::to_string_pretty(&evaluations)?),
            Format::Csv => print!("{}", String::from_utf8_lossy(&compare_csv(&evaluations))),
        }
    }
    Ok(super::exit::OK)
}
