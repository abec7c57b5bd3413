use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::report::output::{summary_csv, trace_jsonl, write_atomic};
use crate::report::render::render_request;
use crate::agent::compact::Chain;
use crate::runner::{check_determinism_with, dump_requests, flatten_all, run_scenario_with};

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
    let mut rendering = String::new();
    let mut failed_determinism = false;
    let mut strategy = crate::strategy::Strategy::resolve_with(&args.strategy, &args.sets)?;
    strategy.run_hooks = args.allow_host_commands;
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
        let mut output = run_scenario_with(&scenario, &mut measurer, &strategy, &chain)?;
        output.summary.info_loss = crate::measure::loss::info_loss(&output.requests, &output.rows);
        if let Some(dump) = &dump_dir {
            let dir = dump.path().join(stem(file));
            for (name, bytes) in dump_requests(&output) {
                write_atomic(&dir.join(name), &bytes).with_context(|| format!("failed to write requests under {}", dir.display()))?;
            }
        }
        if args.out.is_some() {
            rendering.push_str(&format!("## {}\n", output.scenario));
            for (flat, row) in flatten_all(&output, &mut measurer).iter().zip(&output.rows) {
                rendering.push_str(&render_request(flat, row));
            }
            rendering.push('\n');
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
        write_atomic(&dir.join("requests.txt"), rendering.as_bytes())?;
        crate::report::write_report(dir, &report_inputs, Default::default())?;
        out.commit()?;
    }
    if let Some(dump) = dump_dir {
        dump.commit()?;
    }
    emit(&args.measure, &summaries, &all_rows)?;
    Ok(if failed_determinism { 1 } else { 0 })
}
