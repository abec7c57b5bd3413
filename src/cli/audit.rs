use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use rayon::prelude::*;

use std::sync::Arc;

use crate::measure::token_cache::{self, SharedCounts, TokenCache};
use crate::measure::{Calibration, Measurer, ModelTable, TokenCounter};
use crate::replay::audit::{GroupBy, LeadingPlots, SessionAudit, audit_session, group, sort_audits};
use crate::replay::audit_cache::{AuditCache, Lookup, RunKey};
use crate::replay::load_session;
use crate::report::audit::{AuditJson, audit_columns, audit_csv, audit_table, by_name};
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
    /// The rows (no total row) as one Parquet file; needs `--output`.
    Parquet,
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
    /// Token estimator of the what-ifs (default `calibrated`: the closest to billed tokens, per
    /// model family).
    #[arg(long, value_enum, default_value = "calibrated")]
    pub estimator: Estimator,
    /// What runs the what-ifs: `agent`, the only engine (the agent itself, driven by each
    /// session, as recorded and under each what-if, as `compare` runs it; every preset is
    /// weighed; `replay` was removed). The billed tokens, the cost and the breaks come from the
    /// recorded usage. Every output names the engine.
    #[arg(long, value_parser = super::args::parse_engine, default_value = "agent")]
    pub engine: super::args::Engine,
    /// Threads (default: every core): sessions are audited at once, and each session's what-ifs
    /// run at once on the same threads. The output is the same for any number.
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Never draw the progress bar (drawn on a terminal when the run takes over a second).
    #[arg(long)]
    pub no_progress: bool,
    /// Write the table (in `--format`) to this file instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Only sessions I, I+N, I+2N, ... of the sorted list (0 ≤ I < N): one shard of a fleet run
    /// (docs/fleet.md).
    #[arg(long, value_name = "I/N")]
    pub shard: Option<String>,
    /// Write index.html (and a page per session) here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Neither read nor write the token-count cache (`o200k-counts-v1.bin` in
    /// `$CTXSIM_CACHE_DIR`, else the user's cache directory + `ctxsim`): every text is
    /// tokenized again. The counts, hence the output, are the same either way.
    #[arg(long)]
    pub no_token_cache: bool,
    /// Neither read nor write the per-session result cache (`audit-results-v1/` in the same
    /// directory; keyed by the session's files, the executable and the options that change a
    /// result): every session is replayed. The output is the same either way.
    #[arg(long)]
    pub no_result_cache: bool,
    /// Neither cache: `--no-token-cache` and `--no-result-cache`.
    #[arg(long)]
    pub no_cache: bool,
}

pub fn run(args: AuditArgs) -> anyhow::Result<i32> {
    let engine = args.engine.report();
    let mut files = args.sessions.files()?;
    if let Some(text) = &args.shard {
        let parsed = text.split_once('/').and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n.parse::<usize>().ok()?)));
        let Some((i, n)) = parsed.filter(|(i, n)| i < n) else { anyhow::bail!("--shard {text}: expected I/N with 0 ≤ I < N") };
        files = files.into_iter().enumerate().filter(|(k, _)| k % n == i).map(|(_, f)| f).collect();
    }
    let format = if args.json {
        AuditFormat::Json
    } else if args.csv {
        AuditFormat::Csv
    } else {
        args.format
    };
    if format == AuditFormat::Parquet && args.output.is_none() {
        anyhow::bail!("--format parquet needs --output FILE");
    }
    let table = match &args.model_table {
        Some(path) => ModelTable::load(path)?,
        None => ModelTable::shipped(),
    };
    let calibration = Calibration::shipped();
    // No output over an input; `--out` is written as a new generation swapped in at the end.
    let mut inputs = super::guard::Inputs::of(files.iter().map(|f| f.path.clone()));
    inputs.add_all(args.model_table.iter());
    if let Some(path) = &args.output {
        inputs.refuse_file("--output", path)?;
    }
    let out_dir = args.out.as_deref().map(|d| super::guard::GuardedDir::begin("--out", d, &inputs)).transpose()?;
    let progress = indicatif::ProgressBar::with_draw_target(Some(files.len() as u64), indicatif::ProgressDrawTarget::hidden());
    let may_draw = !args.no_progress && std::io::stderr().is_terminal();
    let started = Instant::now();
    let drawing = AtomicBool::new(false);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(args.jobs.unwrap_or(0)).build()?;
    // One session per worker at a time: memory is bounded by the largest sessions, not the sum.
    // Largest sessions first (their files' bytes, subagent files included), one session per
    // task: the last session to finish is a small one. Results are put back in file order, so
    // the output does not depend on the schedule.
    let bytes_of = |path: &std::path::Path| crate::replay::discover::transcript_files(path).iter().map(|p| std::fs::metadata(p).map_or(0, |m| m.len())).sum::<u64>();
    let mut order: Vec<(u64, usize)> = files.iter().enumerate().map(|(k, f)| (bytes_of(&f.path), k)).collect();
    order.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let step = || {
        progress.inc(1);
        if may_draw && started.elapsed() > Duration::from_secs(1) && !drawing.swap(true, Ordering::Relaxed) {
            progress.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
    };
    // Finished sessions' results from earlier runs (`replay::audit_cache`), looked up first:
    // when every session hits, no token count is loaded and no tokenizer built.
    let result_cache = if args.no_result_cache || args.no_cache { None } else { result_cache(&args, files.is_empty()) };
    // Only the report's sessions keep their context-per-call plots: the rest of an audit is a
    // row, so memory does not grow with the plots of every session.
    let plots = LeadingPlots::new(if args.out.is_some() { crate::report::audit::TOP_SESSIONS } else { 0 });
    let offer = |lookup: Lookup| match lookup {
        Lookup::Hit(mut audit) => {
            plots.offer(&mut audit);
            Lookup::Hit(audit)
        }
        miss => miss,
    };
    let mut lookups: Vec<Lookup> = match &result_cache {
        Some(cache) => pool.install(|| files.par_iter().with_max_len(1).map(|file| offer(cache.lookup(file))).collect()),
        None => files.iter().map(|_| Lookup::Miss { key: None, note: None }).collect(),
    };
    let mut results: Vec<Option<Result<SessionAudit, String>>> = Vec::with_capacity(files.len());
    let mut cache_notes = Vec::new();
    for lookup in &mut lookups {
        match std::mem::replace(lookup, Lookup::Miss { key: None, note: None }) {
            Lookup::Hit(audit) => {
                step();
                results.push(Some(Ok(*audit)));
            }
            Lookup::Miss { key, note } => {
                cache_notes.extend(note);
                *lookup = Lookup::Miss { key, note: None };
                results.push(None);
            }
        }
    }
    let misses: Vec<(u64, usize)> = order.into_iter().filter(|&(_, k)| results[k].is_none()).collect();
    // Texts' `bpe` counts, shared by every replay of the run and kept across runs.
    let cache = (!misses.is_empty() && !args.no_token_cache && !args.no_cache && args.estimator != Estimator::Chars4).then(token_cache::default_dir).flatten().map(|dir| TokenCache::open(&dir));
    let (cache, shared) = match cache {
        Some((cache, shared)) => (Some(cache), shared),
        None => (None, SharedCounts::default()),
    };
    // With counts from an earlier run, the tokenizer is built only if a text misses them.
    if !misses.is_empty() && shared.loaded() == 0 {
        super::common::warm_tokenizer(args.estimator);
    }
    let shared = Arc::new(shared);
    let make = || Measurer::new(table.clone(), TokenCounter::with_calibration(args.estimator.into(), calibration.clone()).with_shared(shared.clone())).without_body_hashes();
    let computed: Vec<(usize, Result<SessionAudit, String>, Option<String>)> = pool.install(|| {
        misses
            .par_iter()
            .with_max_len(1)
            .map(|&(_, k)| {
                let file = &files[k];
                let mut out = match load_session(&file.path) {
                    Ok(session) => Ok(audit_session(file, &session, &table, &make, engine)),
                    Err(e) => Err(format!("{}: skipped: {e}", file.path.display())),
                };
                // A result that cannot be kept costs the next run time, not this run its result.
                let stored = match (&result_cache, &lookups[k], &out) {
                    (Some(cache), Lookup::Miss { key: Some(key), .. }, Ok(audit)) => cache.store(file, *key, audit).err().map(|e| format!("{}: {e}", cache.entry_path(file).display())),
                    _ => None,
                };
                if let Ok(audit) = &mut out {
                    plots.offer(audit);
                }
                step();
                (k, out, stored)
            })
            .collect()
    });
    let mut unwritten = Vec::new();
    for (k, out, stored) in computed {
        results[k] = Some(out);
        unwritten.extend(stored);
    }
    progress.finish_and_clear();
    for note in &cache_notes {
        eprintln!("{note}");
    }
    unwritten.sort();
    if let Some(first) = unwritten.first() {
        eprintln!("note: audit result cache: {} of {} results not written (first: {first})", unwritten.len(), files.len());
    }
    let results = results.into_iter().map(|r| r.expect("every session audited or read from the cache"));
    if let Some(cache) = &cache {
        if let token_cache::Loaded::Ignored(reason) = &cache.loaded {
            eprintln!("note: token-count cache {} ignored ({reason}); rewritten", cache.path().display());
        }
        // A cache that cannot be written costs the next run time, not this run its result.
        if let Err(e) = cache.save(&shared) {
            eprintln!("note: token-count cache {} not written: {e}", cache.path().display());
        }
    }
    let mut audits = Vec::new();
    let mut problems = Vec::new();
    for result in results {
        match result {
            Ok(audit) => audits.push(audit),
            Err(message) => problems.push(message),
        }
    }
    plots.restore(&mut audits);
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
    let (rows, mut totals) = group(&audits, by);
    // The engine of the run, also when no session was audited (the rows carry their own).
    totals.engine = engine.name();
    let text: Vec<u8> = match format {
        AuditFormat::Table => audit_table(&rows, &totals, by, args.breakdown).into_bytes(),
        AuditFormat::Csv => audit_csv(&rows, &totals, by),
        AuditFormat::Parquet => audit_columns(&rows, None, by).to_parquet().context("failed to encode the Parquet table")?,
        AuditFormat::Json => {
            let json = AuditJson {
                by: by_name(by),
                engine: engine.name(),
                rows: &rows,
                totals: &totals,
                whatifs_available: crate::replay::audit::whatifs_available(engine),
                sessions: (by == GroupBy::Session).then_some(audits.as_slice()),
            };
            (serde_json::to_string_pretty(&json)? + "\n").into_bytes()
        }
    };
    match &args.output {
        Some(path) => write_atomic(path, &text).with_context(|| format!("failed to write {}", path.display()))?,
        None => {
            use std::io::Write;
            std::io::stdout().write_all(&text)?;
        }
    }
    if let (Some(dir), Some(out_dir)) = (&args.out, out_dir) {
        crate::report::audit::write_audit_html(out_dir.path(), &audits, engine).with_context(|| format!("failed to write the report under {}", dir.display()))?;
        write_atomic(&out_dir.path().join("audit.csv"), &audit_csv(&rows, &totals, by)).with_context(|| format!("failed to write under {}", dir.display()))?;
        out_dir.commit()?;
        eprintln!("wrote {}", dir.join("index.html").display());
    }
    for p in &problems {
        eprintln!("{p}");
    }
    Ok(if problems.is_empty() { super::exit::OK } else { super::exit::BAD_INPUT })
}

/// The result cache of this run (`replay::audit_cache`): in the token-count cache's directory,
/// keyed by the executable and the options that change a session's result (the estimator, a
/// `--model-table` file's bytes). `None`, with a note, when the key cannot be made.
fn result_cache(args: &AuditArgs, no_files: bool) -> Option<AuditCache> {
    let dir = token_cache::default_dir().filter(|_| !no_files)?;
    let table = match &args.model_table {
        Some(path) => std::fs::read(path).ok()?,
        None => b"shipped".to_vec(),
    };
    let estimator = format!("{:?}", args.estimator);
    let engine = format!("{:?}", args.engine);
    match RunKey::new(&[estimator.as_bytes(), &table, engine.as_bytes()]) {
        Ok(run) => Some(AuditCache::new(&dir, run)),
        Err(e) => {
            eprintln!("note: audit result cache not used: the running executable could not be read ({e})");
            None
        }
    }
}
