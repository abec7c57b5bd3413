use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use rayon::prelude::*;

use crate::measure::{Calibration, Measurer, ModelTable, TokenCounter};
use crate::replay::audit::{GroupBy, SessionAudit, audit_session, group, sort_audits};
use crate::replay::load_session;
use crate::report::audit::{AuditJson, audit_csv, audit_table, by_name};
use crate::report::output::write_atomic;

use super::args::Estimator;
use super::sessions::SessionInputs;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum By {
    Session,
    Project,
    Day,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuditFormat {
    Table,
    Json,
    Csv,
}

#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    pub sessions: SessionInputs,
    /// Rows per session, project or UTC day.
    #[arg(long, value_enum, default_value = "session")]
    pub by: By,
    #[arg(long, value_enum, default_value = "table")]
    pub format: AuditFormat,
    /// Same as `--format json`.
    #[arg(long, conflicts_with_all = ["format", "csv"])]
    pub json: bool,
    /// Same as `--format csv`.
    #[arg(long, conflicts_with = "format")]
    pub csv: bool,
    /// Per-model rows under each row.
    #[arg(long)]
    pub breakdown: bool,
    /// Price with the shipped model table (the default and the only mode: never a network call).
    #[arg(long)]
    pub offline: bool,
    /// A model table replacing the shipped one (same shape as data/models.toml).
    #[arg(long, value_name = "FILE")]
    pub model_table: Option<PathBuf>,
    /// Token estimator of the replay (the what-ifs).
    #[arg(long, value_enum, default_value = "calibrated")]
    pub estimator: Estimator,
    /// Sessions replayed at once (default: every core).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Never draw the progress bar (drawn on a terminal when the run takes over a second).
    #[arg(long)]
    pub no_progress: bool,
    /// Write index.html (and a page per session) here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

pub fn run(args: AuditArgs) -> anyhow::Result<i32> {
    super::common::warm_tokenizer(args.estimator);
    let files = args.sessions.files()?;
    let table = match &args.model_table {
        Some(path) => ModelTable::load(path)?,
        None => ModelTable::shipped(),
    };
    let calibration = Calibration::shipped();
    let make = || Measurer::new(table.clone(), TokenCounter::with_calibration(args.estimator.into(), calibration.clone())).without_body_hashes();
    let progress = indicatif::ProgressBar::with_draw_target(Some(files.len() as u64), indicatif::ProgressDrawTarget::hidden());
    let may_draw = !args.no_progress && std::io::stderr().is_terminal();
    let started = Instant::now();
    let drawing = AtomicBool::new(false);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(args.jobs.unwrap_or(0)).build()?;
    // One session per worker at a time: memory is bounded by the largest sessions, not the sum.
    let results: Vec<Result<SessionAudit, String>> = pool.install(|| {
        files
            .par_iter()
            .map(|file| {
                let out = match load_session(&file.path) {
                    Ok(session) => Ok(audit_session(file, &session, &table, &make)),
                    Err(e) => Err(format!("{}: skipped: {e}", file.path.display())),
                };
                progress.inc(1);
                if may_draw && started.elapsed() > Duration::from_secs(1) && !drawing.swap(true, Ordering::Relaxed) {
                    progress.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                }
                out
            })
            .collect()
    });
    progress.finish_and_clear();
    let mut audits = Vec::new();
    let mut problems = Vec::new();
    for result in results {
        match result {
            Ok(audit) => audits.push(audit),
            Err(message) => problems.push(message),
        }
    }
    sort_audits(&mut audits);
    for audit in &audits {
        problems.extend(audit.warnings.iter().cloned());
        for (model, calls) in &audit.billed.unpriced {
            problems.push(format!("{}: {calls} calls of model `{model}` not priced (not in the model table; pass --model-table FILE)", audit.path));
        }
    }
    let by = match args.by {
        By::Session => GroupBy::Session,
        By::Project => GroupBy::Project,
        By::Day => GroupBy::Day,
    };
    let (rows, totals) = group(&audits, by);
    let format = if args.json {
        AuditFormat::Json
    } else if args.csv {
        AuditFormat::Csv
    } else {
        args.format
    };
    match format {
        AuditFormat::Table => print!("{}", audit_table(&rows, &totals, by, args.breakdown)),
        AuditFormat::Csv => print!("{}", String::from_utf8_lossy(&audit_csv(&rows, &totals, by))),
        AuditFormat::Json => {
            let json = AuditJson {
                by: by_name(by),
                rows: &rows,
                totals: &totals,
                whatifs_available: crate::replay::audit::WHATIFS_AVAILABLE,
                whatifs_awaiting: crate::replay::audit::WHATIFS_AWAITING,
                sessions: (by == GroupBy::Session).then_some(audits.as_slice()),
            };
            println!("{}", serde_json::to_string_pretty(&json)?);
        }
    }
    if let Some(dir) = &args.out {
        for path in crate::report::audit::write_audit_html(dir, &audits)? {
            let _ = path;
        }
        write_atomic(&dir.join("audit.csv"), &audit_csv(&rows, &totals, by)).with_context(|| format!("failed to write under {}", dir.display()))?;
        eprintln!("wrote {}", dir.join("index.html").display());
    }
    for p in &problems {
        eprintln!("{p}");
    }
    Ok(if problems.is_empty() { super::exit::OK } else { super::exit::BAD_INPUT })
}
