use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::report::output::{summary_csv, trace_jsonl, write_atomic};
use crate::report::render::render_request;
use crate::agent::compact::Chain;
use crate::runner::{RunOptions, check_determinism_with, run_scenario_opts};

use super::args::RunArgs;
use super::common::{emit, measurer};
use super::guard::GuardedDir;

/// Expands directories into their sorted *.yaml files.
pub fn expand_inputs(inputs: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for input in inputs {
        if input.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(input)
                .with_context(|| format!("failed to list {}", input.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
                .collect();
            files.sort();
            if files.is_empty() {
                bail!("{}: no *.yaml scenarios in this directory", input.display());
            }
            out.extend(files);
        } else {
            out.push(input.clone());
        }
    }
    Ok(out)
}

fn stem(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "scenario".to_owned())
}

pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    super::common::warm_tokenizer(args.measure.estimator);
    let files = expand_inputs(&args.scenarios)?;
    let inputs = super::common::inputs_with(&args.measure, files.iter().cloned().chain([PathBuf::from(&args.strategy)]));
    super::common::guard_trace(&args.measure, &inputs)?;
    let dump_dir = args.dump_requests.as_deref().map(|d| GuardedDir::begin("--dump-requests", d, &inputs)).transpose()?;
    let out_dir = args.out.as_deref().map(|d| GuardedDir::begin("--out", d, &inputs)).transpose()?;
    let mut summaries = Vec::new();
    let mut all_rows = Vec::new();
    // requests.txt renders every request in full, so it grows with the square of a script's
    // length: it is written as the runs go, to a temporary file renamed into place at the end.
    let mut rendering = match &out_dir {
        Some(out) => {
            let dir = out.path();
            std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
            Some(std::io::BufWriter::new(tempfile::NamedTempFile::new_in(dir).with_context(|| format!("failed to write under {}", dir.display()))?))
        }
        None => None,
    };
    let mut failed_determinism = false;
    let mut strategy = crate::strategy::Strategy::resolve_with(&args.strategy, &args.sets)?;
    strategy.run_hooks = args.allow_host_commands;
    if let Some(version) = &args.client_version {
        strategy.client_version = version.clone();
        strategy.validate()?;
    }
    // Which client the agent speaks is part of every result: said where it is not chosen too.
    let chosen = if args.client_version.is_some() || strategy.client_version != crate::agent::dialect::VERSIONS[0] { "chosen" } else { "the default" };
    eprintln!("client: Claude Code {} ({chosen}; --client-version {})", strategy.client_version, crate::agent::dialect::VERSIONS.join(" | "));
    let mut report_inputs = Vec::new();
    let chain = Chain::with_disabled(&args.disable_stage)?;
    for file in &files {
        let mut scenario = crate::scenario::load_scenario_confined(file, args.mount_root.as_deref())?;
        if let Some(seed) = args.seed {
            scenario.world.seed = seed;
        }
        if args.check_determinism {
            let make = || measurer(&args.measure).expect("options were checked by the first run");
            measurer(&args.measure)?;
            if let Some(difference) = check_determinism_with(&scenario, &make, &strategy, &chain)? {
                eprintln!("determinism: {difference}");
                failed_determinism = true;
            }
        }
        let mut measurer = measurer(&args.measure)?;
        // Each body is dumped and rendered as the run produces it and then dropped: a body holds
        // the conversation so far, so keeping them all would grow with the square of the
        // script's length. The rendering flattens on a measurer of its own (same estimator, so
        // the same blocks and counts as the run's).
        let scenario_dump = dump_dir.as_ref().map(|dump| dump.path().join(stem(file)));
        let mut render = match &mut rendering {
            Some(out) => {
                out.write_all(format!("## {}\n", scenario.file).as_bytes())?;
                Some((super::common::measurer(&args.measure)?, out))
            }
            None => None,
        };
        let mut failure: Option<anyhow::Error> = None;
        let mut index = 0usize;
        let mut observer = |request: &crate::api::Request, row: &crate::measure::RequestMetrics| {
            if failure.is_some() {
                return;
            }
            if let Some(dir) = &scenario_dump {
                let bytes = serde_json::to_vec_pretty(request).expect("requests serialize");
                if let Err(e) = write_atomic(&dir.join(format!("{index:04}.json")), &bytes) {
                    failure = Some(anyhow::Error::new(e).context(format!("failed to write requests under {}", dir.display())));
                }
            }
            if let Some((render_measurer, out)) = &mut render {
                let flat = render_measurer.flatten(request).expect("the run already resolved this model");
                if let Err(e) = out.write_all(render_request(&flat, row).as_bytes()) {
                    failure = Some(anyhow::Error::new(e).context("failed to write requests.txt"));
                }
            }
            index += 1;
        };
        let options = RunOptions { keep_requests: false, info_loss: true, drops_only: false, observer: Some(&mut observer), client: None };
        let output = run_scenario_opts(&scenario, &mut measurer, &strategy, &chain, options)?;
        if let Some(e) = failure {
            return Err(e);
        }
        if let Some(out) = &mut rendering {
            out.write_all(b"\n")?;
            report_inputs.push(crate::report::ReportInput { name: output.scenario.clone(), summary: output.summary.clone(), rows: output.rows.clone() });
        }
        summaries.push(output.summary);
        all_rows.extend(output.rows);
    }
    if let Some(out) = out_dir {
        let dir = out.path();
        write_atomic(&dir.join("summary.json"), serde_json::to_string_pretty(&summaries)?.as_bytes())?;
        write_atomic(&dir.join("summary.csv"), &summary_csv(&summaries))?;
        write_atomic(&dir.join("trace.jsonl"), &trace_jsonl(&all_rows))?;
        let file = rendering.take().expect("opened with --out").into_inner().map_err(|e| e.into_error())?;
        crate::report::output::persist_with_mode(file, &dir.join("requests.txt"))?;
        crate::report::write_report(dir, &report_inputs, Default::default())?;
        out.commit()?;
    }
    if let Some(dump) = dump_dir {
        dump.commit()?;
    }
    emit(&args.measure, &summaries, &all_rows)?;
    Ok(if failed_determinism { 1 } else { 0 })
}
