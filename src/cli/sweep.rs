use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;

use crate::report::compare::load_inputs_filtered;
use crate::report::output::write_atomic;
use crate::report::sweep::{Grid, InputNotes, Param, merge, no_effect, rows_csv, run_points, write_outputs};
use crate::strategy::Strategy;

use super::args::MeasureOpts;
use super::common::measurer;

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// Scenarios, recordings or transcripts, or directories of them; the session filters apply
    /// to sessions.
    #[command(flatten)]
    pub sessions: super::sessions::SessionInputs,
    /// `KEY=LO..HI:STEP` or `KEY=a,b,c` (repeatable; the grid is their cartesian product).
    #[arg(long = "param", value_name = "KEY=VALUES")]
    pub params: Vec<String>,
    /// The strategy every point starts from.
    #[arg(long, default_value = "claude-code")]
    pub strategy: String,
    /// `key=value` applied to the base strategy (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Output directory (sweep.csv, sweep.json, no_effect.csv, recommendation.txt, pareto.svg/png,
    /// sweep.html). Parameters that changed no result on an input are also warned about on stderr.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Run only grid points ≡ I (mod N) and write a partial CSV (`sweep.partI.csv`).
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// Join partial CSVs (written by --shard) into the outputs of the whole grid.
    #[arg(long, value_name = "PARTIAL.csv", num_args = 1..)]
    pub merge: Vec<PathBuf>,
    /// Every scenario's `world.mount[].from` must resolve inside this directory.
    #[arg(long, value_name = "DIR")]
    pub mount_root: Option<PathBuf>,
    /// Worker threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// What runs a recorded session at each point: `agent`, the only engine (the agent itself,
    /// driven by the session; every knob applies; points whose settings resolve alike share one
    /// run; `replay` was removed). The outputs name the engine.
    #[arg(long, value_parser = super::args::parse_engine, default_value = "agent")]
    pub engine: super::args::Engine,
    /// Run every point of a session alone from its first call, instead of going on from a
    /// checkpoint of the run it shares its beginning with (through the agent: the trunk run of
    /// its autocompact family; through the replay: the replay an edited session shares its
    /// first calls with). Same results; slower; for checking that.
    #[arg(long)]
    pub no_checkpoints: bool,
    /// The largest grid run (points × inputs); a bigger one is an error before anything runs.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub max_points: u64,
    /// The loss bound of the recommendation (default: see `ctxsim sweep --help` docs).
    #[arg(long)]
    pub max_loss: Option<f64>,
    #[command(flatten)]
    pub measure: MeasureOpts,
}

pub fn run(args: SweepArgs, diag: &mut super::diag::Diagnostics) -> anyhow::Result<i32> {
    let engine = args.engine.report();
    let guarded = super::common::inputs_with(&args.measure, args.sessions.inputs.iter().chain(&args.merge).cloned().chain([PathBuf::from(&args.strategy)]));
    if !args.merge.is_empty() {
        let dir = args.out.clone().context("--merge needs --out DIR")?;
        let (signature, notes, header, rows) = merge(&args.merge)?;
        let out = super::guard::GuardedDir::begin("--out", &dir, &guarded)?;
        let analysis = write_outputs(out.path(), &signature, &header, &rows, args.max_loss, no_effect(&header, &rows, &notes))?;
        out.commit()?;
        report(&analysis, args.measure.quiet)?;
        return Ok(super::exit::OK);
    }
    if args.params.is_empty() {
        bail!("sweep needs at least one --param (or --merge PARTIAL.csv...)");
    }
    let params: Vec<Param> = args.params.iter().map(|p| Param::parse_limited(p, args.max_points)).collect::<anyhow::Result<_>>()?;
    let points = params.iter().try_fold(1u64, |n, p| n.checked_mul(p.values.len() as u64)).unwrap_or(u64::MAX);
    let runs = points.saturating_mul(args.sessions.inputs.len().max(1) as u64);
    if runs > args.max_points {
        bail!("the grid has {points} points × {} inputs = {runs} runs, more than --max-points {}; narrow the --param ranges or raise --max-points", args.sessions.inputs.len(), args.max_points);
    }
    let base = Strategy::resolve_with(&args.strategy, &args.sets)?;
    let inputs = load_inputs_filtered(&args.sessions.inputs, &args.sessions.filter(), args.mount_root.as_deref())?;
    for input in &inputs {
        diag.report(&input.warnings);
    }
    // The engine of the recorded sessions is part of the grid (shards run with different
    // engines do not merge) and named in every output; scenarios run through the agent either way.
    let has_sessions = inputs.iter().any(|i| matches!(i.loaded, crate::report::compare::LoadedInput::Session(_)));
    let engine_name = has_sessions.then(|| engine.name());
    let grid = Grid { params, base: args.strategy.clone(), inputs: inputs.iter().map(|i| i.name.clone()).collect(), engine: engine_name };
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
    let shared = std::sync::Arc::new(crate::measure::token_cache::SharedCounts::default());
    let make = || super::common::measurer_sharing(&args.measure, Some(&shared)).expect("options were checked").without_body_hashes();
    let progress = indicatif::ProgressBar::new((indices.len() * inputs.len()) as u64);
    if args.measure.no_progress || args.measure.quiet || !std::io::stderr().is_terminal() {
        progress.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(args.threads.unwrap_or(0)).build()?;
    let rows = pool.install(|| run_points(&grid, &base, &inputs, &indices, &make, &progress, engine, !args.no_checkpoints))?.rows;
    progress.finish_and_clear();
    let notes = InputNotes::new_with(&grid, &base, &inputs, engine)?;
    let dir = args.out.clone().unwrap_or_else(|| PathBuf::from("."));
    if let Some((i, n)) = shard {
        let path = dir.join(format!("sweep.part{i}.csv"));
        guarded.refuse_file("--out", &path)?;
        write_atomic(&path, &rows_csv(&grid, shard, &rows, &notes))?;
        if !args.measure.quiet {
            outln!("shard {i}/{n}: {} points written to {}", rows.len(), path.display());
        }
        return Ok(super::exit::OK);
    }
    let header = grid.header();
    let out = super::guard::GuardedDir::begin("--out", &dir, &guarded)?;
    let analysis = write_outputs(out.path(), &grid.signature(), &header, &rows, args.max_loss, no_effect(&header, &rows, &notes))?;
    out.commit()?;
    report(&analysis, args.measure.quiet)?;
    Ok(super::exit::OK)
}

/// The warnings on stderr (always), the recommendation on stdout (unless quiet).
fn report(analysis: &crate::report::sweep::Analysis, quiet: bool) -> std::io::Result<()> {
    for warning in &analysis.no_effect {
        eprintln!("warning: {}", warning.line());
    }
    if !quiet {
        out!("{}", analysis.text);
    }
    Ok(())
}
