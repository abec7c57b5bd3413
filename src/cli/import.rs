use crate::recording::{InputFormat, import};

use super::args::{ImportArgs, ImportSource, ImportTarget};

pub fn run(args: ImportArgs, diag: &mut super::diag::Diagnostics) -> anyhow::Result<i32> {
    let from = args.from.map(|f| match f {
        ImportSource::ClaudeCode => InputFormat::ClaudeCode,
        ImportSource::RequestLog => InputFormat::Recording,
        ImportSource::ClaudeTrace => InputFormat::ClaudeTrace,
    });
    super::guard::Inputs::of([&args.input]).refuse_file("-o", &args.output)?;
    if args.to == ImportTarget::Scenario {
        return to_scenario(&args, diag);
    }
    let report = import(&args.input, from, &args.output)?;
    diag.report(&report.warnings);
    if !args.quiet {
        eprintln!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(0)
}

/// `import --to scenario`: the session as the workload that drives the agent, sized with the
/// default (calibrated) estimator, written as YAML.
fn to_scenario(args: &ImportArgs, diag: &mut super::diag::Diagnostics) -> anyhow::Result<i32> {
    use anyhow::Context;
    let session = crate::replay::load_session(&args.input)?;
    diag.report(&session.report.warnings);
    let file = args.input.display().to_string();
    let measurer = crate::measure::Measurer::new(
        crate::measure::ModelTable::shipped(),
        crate::measure::TokenCounter::with_calibration(crate::measure::EstimatorKind::Calibrated, crate::measure::Calibration::shipped()),
    );
    let strategy = crate::strategy::Strategy::resolve_with("claude-code", &[])?;
    let (workload, sizing) = crate::replay::workload::sized_workload(&session, &file, &measurer, &strategy, false).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
    let yaml = serde_norway::to_string(&workload.document)?;
    crate::report::output::write_atomic(&args.output, yaml.as_bytes()).with_context(|| format!("failed to write {}", args.output.display()))?;
    if !args.quiet {
        eprintln!("{}", serde_json::to_string_pretty(&serde_json::json!({ "workload": workload.report, "sizing": sizing }))?);
    }
    Ok(0)
}
