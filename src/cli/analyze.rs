use crate::analyze::{analyze, read_log_file};
use crate::measure::Summary;
use crate::report::render::render_request;

use super::args::AnalyzeArgs;
use super::common::{emit, measurer};

pub fn run(args: AnalyzeArgs) -> anyhow::Result<i32> {
    let mut summaries = Vec::new();
    let mut all_rows = Vec::new();
    for path in &args.logs {
        let name = path.display().to_string();
        let log = read_log_file(path)?;
        for warning in &log.warnings {
            eprintln!("warning: {warning}");
        }
        let mut measurer = measurer(&args.measure)?;
        let rows = analyze(&log, &mut measurer, &name)?;
        if args.explain {
            for (entry, row) in log.entries.iter().zip(&rows) {
                let flat = measurer.flatten(&entry.body)?;
                print!("{}", render_request(&flat, row));
            }
        }
        summaries.push(Summary::from_rows(&name, "as-recorded", measurer.counter().kind().name(), &rows, 0));
        all_rows.extend(rows);
    }
    emit(&args.measure, &summaries, &all_rows)?;
    Ok(0)
}
