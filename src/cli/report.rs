use std::path::PathBuf;

use clap::Args;

use crate::report::html::{ReportInput, split_runs, write_report};
use crate::report::output::read_trace_file;
use crate::report::plots::Thresholds;

use super::exit;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Trace files (JSONL, one row per request, as `--trace` or `run --out` write them).
    #[arg(required = true, value_name = "TRACE")]
    pub traces: Vec<PathBuf>,
    /// Directory for index.html and the PNG plots.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Draw the autocompact threshold (tokens) on the context plot.
    #[arg(long, value_name = "TOKENS")]
    pub autocompact_threshold: Option<u64>,
    /// Draw the blocking limit (tokens) on the context plot.
    #[arg(long, value_name = "TOKENS")]
    pub blocking_limit: Option<u64>,
    /// Print nothing but errors.
    #[arg(long)]
    pub quiet: bool,
}

pub fn run(args: ReportArgs) -> anyhow::Result<i32> {
    let guarded = super::guard::Inputs::of(&args.traces);
    let out = super::guard::GuardedDir::begin("--out", &args.out, &guarded)?;
    let mut inputs = Vec::new();
    for path in &args.traces {
        let name = path.display().to_string();
        let rows = read_trace_file(path).map_err(anyhow::Error::msg)?;
        crate::report::output::check_finite(&rows, &name).map_err(anyhow::Error::msg)?;
        // A trace of several runs (run --out over a suite) restarts its index at every run.
        let runs = split_runs(rows);
        let several = runs.len() > 1;
        for (i, run) in runs.into_iter().enumerate() {
            let label = if several { format!("{name} #{}", i + 1) } else { name.clone() };
            inputs.push(ReportInput::from_rows(&label, run));
        }
    }
    let thresholds = Thresholds { autocompact: args.autocompact_threshold, blocking_limit: args.blocking_limit };
    let written = write_report(out.path(), &inputs, thresholds)?;
    out.commit()?;
    if !args.quiet {
        outln!("{}", args.out.join("index.html").display());
        eprintln!("{} files written under {}", written.len(), args.out.display());
    }
    Ok(exit::OK)
}
