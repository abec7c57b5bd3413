use crate::measure::Summary;
use crate::replay::{ReplayOptions, load_session, replay_session};

use super::args::ReplayArgs;
use super::common::{emit, measurer};

pub fn run(args: ReplayArgs, diag: &mut super::diag::Diagnostics) -> anyhow::Result<i32> {
    super::common::warm_tokenizer(args.measure.estimator);
    let (name, options) = if args.strategy == "as-recorded" && args.sets.is_empty() {
        ("as-recorded".to_owned(), ReplayOptions::default())
    } else {
        let base = if args.strategy == "as-recorded" { "claude-code" } else { args.strategy.as_str() };
        let strategy = crate::strategy::Strategy::resolve_with(base, &args.sets)?;
        (strategy.name.clone(), ReplayOptions::from_strategy(&strategy))
    };
    let inputs = super::common::inputs_with(&args.measure, args.sessions.inputs.iter().cloned().chain([std::path::PathBuf::from(&args.strategy)]));
    super::common::guard_trace(&args.measure, &inputs)?;
    let mut summaries = Vec::new();
    let mut all_rows = Vec::new();
    for file in args.sessions.files()? {
        let path = &file.path;
        let session = load_session(path)?;
        let warnings = diag.report(&session.report.warnings);
        let mut measurer = measurer(&args.measure)?;
        let replay = replay_session(&session, &mut measurer, &options);
        let rows = replay.rows();
        let mut summary = Summary::from_rows(&path.display().to_string(), &name, measurer.counter().kind().name(), &rows, 0);
        summary.info_loss = replay.info_loss.clone();
        summary.warnings = warnings;
        if let Some(whatif) = &replay.compaction_whatif
            && !args.measure.quiet
        {
            let moved: Vec<String> = whatif.changes.iter().map(|c| format!("{} before main call {} at {}", c.change, c.call, c.pre_tokens)).collect();
            eprintln!(
                "{}: autocompact threshold {}: {} ({} replays{})",
                path.display(),
                whatif.threshold,
                if moved.is_empty() { "compactions where recorded".to_owned() } else { moved.join(", ") },
                whatif.iterations,
                if whatif.converged { "" } else { ", not settled: the last plan is used" }
            );
        }
        if let Some((call, why)) = &replay.first_divergence
            && !args.measure.quiet
        {
            eprintln!("{}: replies diverge from call {call}: {why}; the replies are replayed as recorded", path.display());
        }
        summaries.push(summary);
        all_rows.extend(rows);
    }
    emit(&args.measure, &summaries, &all_rows)?;
    Ok(0)
}
