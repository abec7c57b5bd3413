use crate::measure::{Measurer, RequestMetrics, Summary};
use crate::recording::ImportedSession;
use crate::replay::load_session;
use crate::strategy::Strategy;

use super::args::ReplayArgs;
use super::common::{emit, measurer};

pub fn run(args: ReplayArgs, diag: &mut super::diag::Diagnostics) -> anyhow::Result<i32> {
    super::common::warm_tokenizer(args.measure.estimator);
    // `as-recorded` is the client's own behaviour: `claude-code` under the session's recorded
    // settings (what every strategy gets).
    let as_recorded = args.strategy == "as-recorded" && args.sets.is_empty();
    let base = if args.strategy == "as-recorded" { "claude-code" } else { args.strategy.as_str() };
    let strategy = Strategy::resolve_with(base, &args.sets)?;
    let name = if as_recorded { "as-recorded".to_owned() } else { strategy.name.clone() };
    let inputs = super::common::inputs_with(&args.measure, args.sessions.inputs.iter().cloned().chain([std::path::PathBuf::from(&args.strategy)]));
    super::common::guard_trace(&args.measure, &inputs)?;
    let mut summaries = Vec::new();
    let mut all_rows = Vec::new();
    for file in args.sessions.files()? {
        let path = &file.path;
        let input = path.display().to_string();
        let session = load_session(path)?;
        let warnings = diag.report(&session.report.warnings);
        let mut measurer = measurer(&args.measure)?;
        let (rows, mut summary) = driven(&session, &input, &name, &mut measurer, &strategy, args.measure.quiet)?;
        summary.engine = Some(args.engine.name().to_owned());
        summary.warnings = warnings;
        summaries.push(summary);
        all_rows.extend(rows);
    }
    emit(&args.measure, &summaries, &all_rows)?;
    Ok(0)
}

/// `session` driving the agent under `strategy` (as `compare` runs it): every
/// request the agent made and their summary; its compactions, where they are not the recorded
/// ones, and where its conversation parts from the recording go to stderr.
fn driven(session: &ImportedSession, input: &str, name: &str, measurer: &mut Measurer, strategy: &Strategy, quiet: bool) -> anyhow::Result<(Vec<RequestMetrics>, Summary)> {
    use crate::replay::agent_whatif::{agent_whatif, prepare};
    // A file without a main-lane call gives the agent nothing to drive: no request (said on
    // stderr).
    if !session.calls.iter().any(|c| c.lane == crate::recording::format::LANE_MAIN) {
        if !quiet {
            eprintln!("{input}: no main-lane call recorded: nothing to drive the agent with (0 requests)");
        }
        return Ok((Vec::new(), Summary::from_rows(input, name, measurer.counter().kind().name(), &[], 0)));
    }
    // The errors name the file (said once).
    let named = |e: String| if e.starts_with(input) { anyhow::anyhow!(e) } else { anyhow::anyhow!("{input}: {e}") };
    let prepared = prepare(session, input, measurer).map_err(named)?;
    let outcome = agent_whatif(session, input, &prepared, measurer, strategy).map_err(named)?;
    let mut summary = outcome.summary;
    summary.input = input.to_owned();
    summary.strategy = name.to_owned();
    summary.info_loss = outcome.info_loss;
    if !quiet {
        let recorded: Vec<usize> = prepared.recorded.iter().map(|r| r.call).collect();
        let made: Vec<usize> = outcome.compactions.iter().map(|c| c.call).collect();
        if made != recorded {
            let listed: Vec<String> = outcome
                .compactions
                .iter()
                .map(|c| format!("{} before main call {} (messages ~{} tokens, {} summary)", c.stage, c.call, c.tokens_before, if c.recorded_summary { "recorded" } else { "stand-in" }))
                .collect();
            eprintln!(
                "{input}: the agent compacted {} (recorded: {}; {} runs)",
                if listed.is_empty() { "nowhere".to_owned() } else { listed.join(", ") },
                if recorded.is_empty() { "none".to_owned() } else { recorded.iter().map(|c| format!("before main call {c}")).collect::<Vec<_>>().join(", ") },
                outcome.runs
            );
        }
        if let Some((call, why)) = &outcome.divergence {
            eprintln!("{input}: replies diverge from call {call}: {why}; the recorded replies continue as recorded, the agent counts its own usage from there");
        }
    }
    Ok((outcome.rows, summary))
}
