//! `ctxsim diff-requests A B`: two request sequences compared structurally (src/shape.rs).

use std::path::PathBuf;

use clap::Args;

use crate::shape::{Tolerance, diff, read_file_warned, render};

#[derive(Debug, Args)]
pub struct DiffRequestsArgs {
    /// Left input: a request log (`analyze` format) or a shapes file.
    pub left: PathBuf,
    /// Right input, the same kinds.
    pub right: PathBuf,
    /// Size tolerance as a fraction of the larger size.
    #[arg(long, default_value_t = 0.25)]
    pub tolerance: f64,
    /// Size differences up to this many characters always agree.
    #[arg(long, default_value_t = 64)]
    pub slack: usize,
    /// Print both renderings before the differences.
    #[arg(long)]
    pub show: bool,
    /// Write the left input's shapes (no texts) as JSON, e.g. as a test fixture.
    #[arg(long)]
    pub shapes_out: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: super::args::Format,
}

pub fn run(args: DiffRequestsArgs, diag: &mut super::diag::Diagnostics) -> anyhow::Result<i32> {
    let (left, left_warnings) = read_file_warned(&args.left).map_err(anyhow::Error::msg)?;
    let (right, right_warnings) = read_file_warned(&args.right).map_err(anyhow::Error::msg)?;
    diag.report(&left_warnings);
    diag.report(&right_warnings);
    if let Some(path) = &args.shapes_out {
        super::guard::Inputs::of([&args.left, &args.right]).refuse_file("--shapes-out", path)?;
        let mut text = serde_json::to_string_pretty(&left)?;
        text.push('\n');
        crate::report::output::write_atomic(path, text.as_bytes())?;
    }
    let differences = diff(&left, &right, Tolerance { fraction: args.tolerance, slack: args.slack });
    if args.show {
        outln!("== {}\n{}== {}\n{}", args.left.display(), render(&left), args.right.display(), render(&right));
    }
    if matches!(args.format, super::args::Format::Json) {
        outln!("{}", serde_json::to_string_pretty(&differences)?);
    } else {
        for d in &differences {
            outln!("{d}");
        }
        outln!("{} requests vs {}: {} structural differences", left.len(), right.len(), differences.len());
    }
    Ok(if differences.is_empty() { super::exit::OK } else { super::exit::CHECK_FAILED })
}
