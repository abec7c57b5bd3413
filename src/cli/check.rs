use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;

use crate::report::check::{Baseline, Tolerances, check_suite_with};
use crate::report::output::write_atomic;
use crate::scenario::load_scenario;

use super::args::{Estimator, Format, MeasureOpts};
use super::common::measurer;
use super::exit;
use super::run::expand_inputs;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Scenario files, or directories of them (every *.yaml inside, sorted).
    #[arg(required = true, value_name = "SUITE")]
    pub suite: Vec<PathBuf>,
    /// Baseline file (JSON) to compare every scenario with.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// Write this run's numbers to the --baseline file (atomically) instead of comparing.
    #[arg(long, requires = "baseline")]
    pub update_baseline: bool,
    /// Write a JUnit XML report here (a testcase per scenario and check).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Relative increase of cost and peak context allowed over the baseline.
    #[arg(long, default_value_t = 0.02)]
    pub tolerance: f64,
    /// Absolute drop of the cache hit ratio allowed under the baseline.
    #[arg(long, default_value_t = 0.01)]
    pub hit_ratio_tolerance: f64,
    /// Cache breaks allowed beyond the baseline's.
    #[arg(long, default_value_t = 0)]
    pub extra_cache_breaks: u64,
    /// Token estimator.
    #[arg(long, value_enum, default_value = "bpe")]
    pub estimator: Estimator,
    /// Skip a stage of the long-context chain by name (repeatable); unknown names are an error
    /// listing the valid ones.
    #[arg(long = "disable-stage", value_name = "NAME")]
    pub disable_stage: Vec<String>,
    /// A model table replacing the shipped one.
    #[arg(long, value_name = "FILE")]
    pub model_table: Option<PathBuf>,
    /// Print the result as JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print nothing but errors (the exit code says the rest).
    #[arg(long)]
    pub quiet: bool,
}

pub fn run(args: CheckArgs) -> anyhow::Result<i32> {
    if !(args.tolerance >= 0.0 && args.hit_ratio_tolerance >= 0.0) {
        bail!("--tolerance and --hit-ratio-tolerance must be non-negative numbers");
    }
    let opts = MeasureOpts {
        estimator: args.estimator,
        model_table: args.model_table.clone(),
        calibration: None,
        format: Format::Table,
        trace: None,
        quiet: args.quiet,
        no_progress: true,
    };
    measurer(&opts)?;
    let make = || measurer(&opts).expect("options were checked above");
    let files = expand_inputs(&args.suite)?;
    let scenarios = files.iter().map(load_scenario).collect::<Result<Vec<_>, _>>()?;
    let baseline = match (&args.baseline, args.update_baseline) {
        (Some(path), false) => {
            Some(Baseline::load(path)?)
        }
        _ => None,
    };
    let tolerances = Tolerances { relative: args.tolerance, extra_cache_breaks: args.extra_cache_breaks, hit_ratio: args.hit_ratio_tolerance };
    let chain = crate::agent::compact::Chain::with_disabled(&args.disable_stage)?;
    let report = check_suite_with(&scenarios, &make, baseline.as_ref(), &tolerances, &chain)?;

    if let Some(path) = &args.junit {
        write_atomic(path, report.junit_xml().as_bytes()).with_context(|| format!("failed to write {}", path.display()))?;
    }
    if args.update_baseline
        && let Some(path) = &args.baseline
    {
        write_atomic(path, &report.to_baseline().to_json()).with_context(|| format!("failed to write {}", path.display()))?;
        if !args.quiet {
            eprintln!("baseline written: {} ({} scenarios)", path.display(), report.scenarios.len());
        }
    }
    if !args.quiet {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.render_text());
        }
    }
    Ok(if report.passed() { exit::OK } else { exit::CHECK_FAILED })
}
