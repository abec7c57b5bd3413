use anyhow::Context;

use crate::measure::{Calibration, Measurer, ModelTable, RequestMetrics, Summary, TokenCounter};
use crate::report::output::{summary_csv, summary_table, trace_csv, trace_jsonl, write_atomic};

use super::args::{Format, MeasureOpts};


/// Starts building the `bpe` tokenizer while the inputs are read, when the estimator needs it.
pub fn warm_tokenizer(estimator: super::args::Estimator) {
    if estimator != super::args::Estimator::Chars4 {
        crate::measure::o200k::warm_up_in_background();
    }
}

/// Builds a measurer from the common options.
pub fn measurer(opts: &MeasureOpts) -> anyhow::Result<Measurer> {
    measurer_sharing(opts, None)
}

/// [`measurer`] whose counter shares `bpe` text counts with the run's other measurers
/// (`TokenCounter::with_shared`; the counts are the same either way).
pub fn measurer_sharing(opts: &MeasureOpts, shared: Option<&std::sync::Arc<crate::measure::token_cache::SharedCounts>>) -> anyhow::Result<Measurer> {
    let table = match &opts.model_table {
        Some(path) => ModelTable::load(path)?,
        None => ModelTable::shipped(),
    };
    let calibration = match &opts.calibration {
        Some(path) => Calibration::load(path)?,
        None => Calibration::shipped(),
    };
    let counter = TokenCounter::with_calibration(opts.estimator.into(), calibration);
    Ok(Measurer::new(table, match shared {
        Some(shared) => counter.with_shared(shared.clone()),
        None => counter,
    }))
}

/// The inputs of the measuring options themselves (model table, calibration) plus `paths`.
pub fn inputs_with(opts: &MeasureOpts, paths: impl IntoIterator<Item = std::path::PathBuf>) -> super::guard::Inputs {
    let mut all: Vec<std::path::PathBuf> = paths.into_iter().collect();
    all.extend(opts.model_table.iter().cloned());
    all.extend(opts.calibration.iter().cloned());
    super::guard::Inputs::of(all)
}

/// Refuses a `--trace` that is one of `inputs` (call before any work).
pub fn guard_trace(opts: &MeasureOpts, inputs: &super::guard::Inputs) -> anyhow::Result<()> {
    match &opts.trace {
        Some(path) => inputs.refuse_file("--trace", path),
        None => Ok(()),
    }
}

/// The line under a table that says which estimator counted its tokens.
pub fn estimator_line<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let mut names: Vec<&str> = names.into_iter().collect();
    names.sort_unstable();
    names.dedup();
    let note = if names == ["calibrated"] { " (o200k scaled per model family to billed tokens, the default)" } else { "" };
    format!("estimator: {}{note}", names.join(", "))
}

/// The line under a table that says which engine ran its recorded sessions (none when no
/// summary names one: `run`, `analyze`).
pub fn engine_line<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut names: Vec<&str> = names.into_iter().collect();
    names.sort_unstable();
    names.dedup();
    let sentence = match names[..] {
        [] => return None,
        ["agent"] => "agent (the agent itself, driven by each session)",
        _ => return Some(format!("engine: {}", names.join(", "))),
    };
    Some(format!("engine: {sentence}"))
}

/// Prints the summaries and writes the trace, as the options say.
pub fn emit(opts: &MeasureOpts, summaries: &[Summary], rows: &[RequestMetrics]) -> anyhow::Result<()> {
    if let Some(path) = &opts.trace {
        let bytes = match path.extension().and_then(|e| e.to_str()) {
            Some("csv") => trace_csv(rows),
            Some("parquet") => crate::report::output::trace_columns(rows).to_parquet().with_context(|| format!("failed to encode trace {}", path.display()))?,
            _ => trace_jsonl(rows),
        };
        write_atomic(path, &bytes).with_context(|| format!("failed to write trace {}", path.display()))?;
    }
    if opts.quiet {
        return Ok(());
    }
    match opts.format {
        Format::Table => {
            outln!("{}", summary_table(summaries));
            outln!("{}", estimator_line(summaries.iter().map(|s| s.estimator.as_str())));
            if let Some(line) = engine_line(summaries.iter().filter_map(|s| s.engine.as_deref())) {
                outln!("{line}");
            }
        }
        Format::Json => {
            let text = if summaries.len() == 1 {
                serde_json::to_string_pretty(&summaries[0])?
            } else {
                serde_json::to_string_pretty(summaries)?
            };
            outln!("{text}");
        }
        Format::Csv => out!("{}", String::from_utf8_lossy(&summary_csv(summaries))),
    }
    Ok(())
}
