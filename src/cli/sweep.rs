use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;

use crate::report::compare::load_inputs;
use crate::report::output::write_atomic;
use crate::report::sweep::{Grid, Param, merge, rows_csv, run_points, write_outputs};
use crate::strategy::Strategy;

use super::args::MeasureOpts;
use super::common::measurer;

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// Scenarios, recordings or transcripts, or directories of them.
    pub inputs: Vec<PathBuf>,
    /// `KEY=LO..HI:STEP` or `KEY=a,b,c` (repeatable; the grid is their cartesian product).
    #[arg(long = "param", value_name = "KEY=VALUES")]
    pub params: Vec<String>,
    /// The strategy every point starts from.
    #[arg(long, default_value = "claude-code")]
    pub strategy: String,
    /// `key=value` applied to the base strategy (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Output directory (sweep.csv, recommendation.txt, pareto.svg/png, sweep.html).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Run only grid points ≡ I (mod N) and write a partial CSV (`sweep.partI.csv`).
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// Join partial CSVs (written by --shard) into the outputs of the whole grid.
    #[arg(long, value_name = "PARTIAL.csv", num_args = 1..)]
    pub merge: Vec<PathBuf>,
    /// Worker threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The loss bound of the recommendation (default: see `ctxsim sweep --help` docs).
    #[arg(long)]
    pub max_loss: Option<f64>,
    #[command(flatten)]
    pub measure: MeasureOpts,
}

pub fn run(args: SweepArgs, diag: &mut super::diag::Diagnostics) -> anyhow::Result<i32> {
    if !args.merge.is_empty() {
        let dir = args.out.clone().context("--merge needs --out DIR")?;
        let (signature, header, rows) = merge(&args.merge)?;
        let analysis = write_outputs(&dir, &signature, &header, &rows, args.max_loss)?;
        if !args.measure.quiet {
            print!("{}", analysis.text);
        }
        return Ok(super::exit::OK);
    }
    if args.inputs.is_empty() || args.params.is_empty() {
        bail!("sweep needs inputs and at least one --param (or --merge PARTIAL.csv...)");
    }
    let params: Vec<Param> = args.params.iter().map(|p| Param::parse(p)).collect::<anyhow::Result<_>>()?;
    let base = Strategy::resolve_with(&args.strategy, &args.sets)?;
    let inputs = load_inputs(&args.inputs)?;
    for input in &inputs {
        diag.report(&input.warnings);
    }
    let grid = Grid { params, base: args.strategy.clone(), inputs: inputs.iter().map(|i| i.name.clone()).collect() };
    let shard = match &args.shard {
        Some(text) => {
            let (i, n) = text.split_once('/').context("--shard I/N")?;
            let (i, n): (usize, usize) = (i.parse()?, n.parse()?);
            if n == 0 || i >= n {
                bail!("--shard {text}: need 0 ≤ I < N");
            }
            Some((i, n))
        }
        None => None,
    };
    let indices: Vec<usize> = (0..grid.len()).filter(|i| shard.is_none_or(|(s, n)| i % n == s)).collect();
    measurer(&args.measure)?;
    // A sweep point's outputs are totals, never trace rows or fingerprints.
    let make = || measurer(&args.measure).expect("options were checked").without_body_hashes();
    let progress = indicatif::ProgressBar::new((indices.len() * inputs.len()) as u64);
    if args.measure.no_progress || args.measure.quiet || !std::io::stderr().is_terminal() {
        progress.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(args.threads.unwrap_or(0)).build()?;
    let rows = pool.install(|| run_points(&grid, &base, &inputs, &indices, &make, &progress))?;
    progress.finish_and_clear();
    let dir = args.out.clone().unwrap_or_else(|| PathBuf::from("."));
    if let Some((i, n)) = shard {
        let path = dir.join(format!("sweep.part{i}.csv"));
        write_atomic(&path, &rows_csv(&grid, shard, &rows))?;
        if !args.measure.quiet {
            println!("shard {i}/{n}: {} points written to {}", rows.len(), path.display());
        }
        return Ok(super::exit::OK);
    }
    let analysis = write_outputs(&dir, &grid.signature(), &grid.header(), &rows, args.max_loss)?;
    if !args.measure.quiet {
        print!("{}", analysis.text);
    }
    Ok(super::exit::OK)
}
