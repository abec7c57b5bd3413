use crate::recording::{InputFormat, import};

use super::args::{ImportArgs, ImportSource};

pub fn run(args: ImportArgs, diag: &mut super::diag::Diagnostics) -> anyhow::Result<i32> {
    let from = args.from.map(|f| match f {
        ImportSource::ClaudeCode => InputFormat::ClaudeCode,
        ImportSource::RequestLog => InputFormat::Recording,
        ImportSource::ClaudeTrace => InputFormat::ClaudeTrace,
    });
    super::guard::Inputs::of([&args.input]).refuse_file("-o", &args.output)?;
    let report = import(&args.input, from, &args.output)?;
    diag.report(&report.warnings);
    if !args.quiet {
        eprintln!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(0)
}
