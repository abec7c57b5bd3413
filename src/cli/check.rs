use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;

use crate::report::check::{Baseline, Tolerances, check_suite_with};
use crate::report::output::write_atomic;
use crate::scenario::load_scenario_confined;

use super::args::{Estimator, Format, MeasureOpts};
use super::common::measurer;
use super::exit;
use super::run::expand_inputs;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Scenario files, or directories of them (every *.yaml inside, sorted), and recorded sessions
    /// (`.jsonl` transcripts or recordings, named one by one; see `--engine`).
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
    /// Token estimator (default `calibrated`: the closest to billed tokens, per model family, as
    /// in every measuring command; the shipped suite's budgets (`expect:`) are sized in it). A
    /// baseline records its estimator: one measured with another is refused until refreshed.
    #[arg(long, value_enum, default_value = "calibrated")]
    pub estimator: Estimator,
    /// Skip a stage of the long-context chain by name (repeatable); unknown names are an error
    /// listing the valid ones.
    #[arg(long = "disable-stage", value_name = "NAME")]
    pub disable_stage: Vec<String>,
    /// A model table replacing the shipped one.
    #[arg(long, value_name = "FILE")]
    pub model_table: Option<PathBuf>,
    /// Every scenario's `world.mount[].from` must resolve inside this directory.
    #[arg(long, value_name = "DIR")]
    pub mount_root: Option<PathBuf>,
    /// Print a GitHub Actions `::error` annotation per failed check (on by itself when
    /// `GITHUB_ACTIONS=true`); names are escaped per the workflow-command rules.
    #[arg(long)]
    pub github_annotations: bool,
    /// Print the result as JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print nothing but errors (the exit code says the rest).
    #[arg(long)]
    pub quiet: bool,
    /// What runs a recorded session of the suite (a `.jsonl` file given by name): `agent`, the
    /// only engine (the agent itself driven by the session, under the check strategy; `replay`
    /// was removed). A baseline of a suite
    /// with sessions records the engine: one measured by the record-based replay is refused
    /// until refreshed with --update-baseline.
    #[arg(long, value_parser = super::args::parse_engine, default_value = "agent")]
    pub engine: super::args::Engine,
}

pub fn run(args: CheckArgs, diag: &mut super::diag::Diagnostics) -> anyhow::Result<i32> {
    let engine = args.engine.report();
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
    let mut inputs = super::guard::Inputs::of(files.iter().cloned().chain(args.model_table.iter().cloned()));
    if !args.update_baseline {
        inputs.add_all(args.baseline.iter());
    }
    if let Some(path) = &args.junit {
        inputs.refuse_file("--junit", path)?;
        if args.baseline.as_ref().is_some_and(|b| super::guard::same_file(b, path)) {
            bail!("--junit {}: this is the --baseline file", path.display());
        }
    }
    if args.update_baseline && let Some(path) = &args.baseline {
        inputs.refuse_file("--baseline (with --update-baseline)", path)?;
    }
    // Recorded sessions (named one by one) are judged beside the scenarios.
    let is_session = |f: &PathBuf| f.extension().is_some_and(|e| e == "jsonl");
    let (session_files, files): (Vec<PathBuf>, Vec<PathBuf>) = files.into_iter().partition(is_session);
    if !session_files.is_empty() && !args.disable_stage.is_empty() {
        bail!("--disable-stage applies to scenarios only; a recorded session ({}) is judged under the check strategy as it is", session_files[0].display());
    }
    let scenarios = files.iter().map(|f| load_scenario_confined(f, args.mount_root.as_deref())).collect::<Result<Vec<_>, _>>()?;
    let estimator = crate::measure::EstimatorKind::from(args.estimator).name();
    let mut disabled = args.disable_stage.clone();
    disabled.sort();
    let strategy = std::iter::once(crate::report::check::CHECK_STRATEGY.to_owned()).chain(disabled.iter().map(|s| format!("-{s}"))).collect::<Vec<_>>().join(" ");
    // The engine of the suite's recorded sessions (scenarios run through the agent either way),
    // recorded and compared apart from the strategy, so that a run of scenarios alone and a run
    // with sessions share one baseline.
    let session_engine = engine.name();
    // The baseline as it is: compared with, or merged into by --update-baseline.
    let existing = match &args.baseline {
        Some(path) if !args.update_baseline || path.exists() => {
            let baseline = Baseline::load(path)?;
            baseline.check_measured_with(&path.display().to_string(), estimator, &strategy)?;
            // A refresh replaces the engine with the agent's; a comparison needs the same engine.
            if !session_files.is_empty() && !args.update_baseline {
                baseline.check_session_engine(&path.display().to_string(), session_engine)?;
            }
            Some(baseline)
        }
        _ => None,
    };
    let baseline = if args.update_baseline { None } else { existing.clone() };
    let tolerances = Tolerances { relative: args.tolerance, extra_cache_breaks: args.extra_cache_breaks, hit_ratio: args.hit_ratio_tolerance };
    let chain = crate::agent::compact::Chain::with_disabled(&args.disable_stage)?;
    let mut report = check_suite_with(&scenarios, &make, baseline.as_ref(), &tolerances, &chain)?;
    for path in &session_files {
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        if let Some(clash) = report.scenarios.iter().find(|r| r.name == name) {
            bail!("{}: the name {name} is also {}'s; names must be unique in a suite", path.display(), clash.file);
        }
        let session = crate::replay::load_session(path).with_context(|| format!("failed to read {}", path.display()))?;
        diag.report(&session.report.warnings);
        let input = crate::report::compare::Input {
            name: path.display().to_string(),
            warnings: session.report.warnings.clone(),
            loaded: crate::report::compare::LoadedInput::Session(Box::new(session)),
        };
        let memo = crate::report::compare::InputMemo::default();
        let (evaluation, _) = crate::report::compare::evaluate_digest(&input, &crate::strategy::Strategy::default(), &mut make(), true, engine, &memo)?;
        report.scenarios.push(crate::report::check::check_session(&name, &evaluation, baseline.as_ref(), &tolerances));
    }

    if let Some(path) = &args.junit {
        write_atomic(path, report.junit_xml().as_bytes()).with_context(|| format!("failed to write {}", path.display()))?;
    }
    if args.update_baseline
        && let Some(path) = &args.baseline
    {
        if report.passed() {
            let mut update = report.to_baseline();
            update.estimator = Some(estimator.to_owned());
            update.strategy = Some(strategy.clone());
            if !session_files.is_empty() {
                update.session_engine = Some(session_engine.to_owned());
            }
            let merged = match existing {
                Some(mut baseline) => {
                    baseline.merge(update);
                    baseline
                }
                None => update,
            };
            write_atomic(path, &merged.to_json()).with_context(|| format!("failed to write {}", path.display()))?;
            if !args.quiet {
                eprintln!("baseline written: {} ({} scenarios updated, {} in the file)", path.display(), report.scenarios.len(), merged.scenarios.len());
            }
        } else {
            eprintln!("baseline not written: the run failed its checks; {} is unchanged", path.display());
        }
    }
    if args.github_annotations || std::env::var_os("GITHUB_ACTIONS").is_some_and(|v| v == "true") {
        out!("{}", report.github_annotations());
    }
    if !args.quiet {
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            out!("{}", report.render_text());
        }
    }
    Ok(if report.passed() { exit::OK } else { exit::CHECK_FAILED })
}
