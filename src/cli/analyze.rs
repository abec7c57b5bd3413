use crate::analyze::{analyze, analyze_stream, open_log_file, read_log_file};
use crate::measure::Summary;
use crate::report::render::render_request;

use super::args::{AnalyzeArgs, LogSource};
use super::common::{emit, measurer};

pub fn run(args: AnalyzeArgs, diag: &mut super::diag::Diagnostics) -> anyhow::Result<i32> {
    super::common::warm_tokenizer(args.measure.estimator);
    let inputs = super::common::inputs_with(&args.measure, args.logs.iter().cloned());
    super::common::guard_trace(&args.measure, &inputs)?;
    let mut summaries = Vec::new();
    let mut all_rows = Vec::new();
    for path in &args.logs {
        let name = path.display().to_string();
        let mut measurer = measurer(&args.measure)?;
        let warnings;
        let rows = if args.explain || is_claude_trace(path, args.from)? {
            let log = read_any_log(path, args.from)?;
            warnings = diag.report_list(&log.warnings);
            let rows = analyze(&log, &mut measurer, &name)?;
            if args.explain {
                for (entry, row) in log.entries.iter().zip(&rows) {
                    let flat = measurer.flatten(&entry.body)?;
                    out!("{}", render_request(&flat, row));
                }
            }
            rows
        } else {
            // Measured as it is read: memory is a batch of entries, not the whole log.
            let mut reader = open_log_file(path)?;
            let rows = analyze_stream(&mut reader, &mut measurer, &name)?;
            warnings = diag.report_list(reader.warnings());
            rows
        };
        let mut summary = Summary::from_rows(&name, "as-recorded", measurer.counter().kind().name(), &rows, 0);
        summary.warnings = warnings;
        summaries.push(summary);
        all_rows.extend(rows);
    }
    emit(&args.measure, &summaries, &all_rows)?;
    Ok(0)
}

/// Whether `path` is a claude-trace capture (as `--from` says, else detected).
fn is_claude_trace(path: &std::path::Path, from: Option<LogSource>) -> anyhow::Result<bool> {
    use crate::recording::{InputFormat, detect_format};
    Ok(match from {
        Some(LogSource::ClaudeTrace) => true,
        Some(LogSource::RequestLog) => false,
        None => detect_format(path)? == InputFormat::ClaudeTrace,
    })
}

/// Reads a request log, converting a claude-trace capture on the fly.
fn read_any_log(path: &std::path::Path, from: Option<LogSource>) -> anyhow::Result<crate::analyze::RequestLog> {
    use crate::recording::{convert_claude_trace, write_request_log_to};
    if !is_claude_trace(path, from)? {
        return Ok(read_log_file(path)?);
    }
    let name = path.display().to_string();
    let file = std::fs::File::open(path)?;
    let converted = convert_claude_trace(std::io::BufReader::new(file), &name)?;
    let mut bytes = Vec::new();
    write_request_log_to(&converted.entries, &mut bytes)?;
    let mut log = crate::analyze::read_log(std::io::Cursor::new(bytes), &name)?;
    // The converted log's lines are not the capture's: what was skipped is the capture's.
    log.warnings = converted.report.warnings.list;
    Ok(log)
}
