//! Writers: atomic files, trace JSONL, summary tables and CSV.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};

use crate::measure::{RequestMetrics, Summary};

/// Writes `bytes` to `path` through [`write_output_with`].
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_output_with(path, |w| w.write_all(bytes))
}

/// Where an output goes, once links are followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputTarget {
    /// An existing file that is not a regular file (a device such as `/dev/null`, a FIFO, a
    /// terminal, `/dev/stdout`): written in place, never replaced.
    InPlace(PathBuf),
    /// A regular file or a new one: a temporary file beside this path, then a rename onto it.
    /// A symbolic link is followed, so the link stays a link and its target gets the output.
    Replace(PathBuf),
}

/// Decides how `path` is written: see [`OutputTarget`]. A directory is an error.
pub fn output_target(path: &Path) -> std::io::Result<OutputTarget> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {
            Err(std::io::Error::new(std::io::ErrorKind::IsADirectory, format!("{} is a directory, not a file", path.display())))
        }
        Ok(meta) if !meta.is_file() => Ok(OutputTarget::InPlace(path.to_path_buf())),
        // `/dev/stdout` redirected to a file, `/proc/self/fd/N`: the file is the one the shell
        // opened; replacing it would cut it off from the process's own output.
        Ok(_) if path.starts_with("/dev") || path.starts_with("/proc") => Ok(OutputTarget::InPlace(path.to_path_buf())),
        _ => Ok(OutputTarget::Replace(resolve_links(path)?)),
    }
}

/// `path` with every symbolic link of its last component followed (a dangling link gives the
/// path it points to, which the write then creates).
fn resolve_links(path: &Path) -> std::io::Result<PathBuf> {
    let mut current = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let link = std::fs::read_link(&current)?;
                current = if link.is_absolute() { link } else { parent_dir(&current).join(link) };
            }
            _ => return Ok(current),
        }
    }
    Err(std::io::Error::other(format!("{}: too many levels of symbolic links", path.display())))
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Opens an output that is written in place. The process's own stdout and stderr
/// (`/dev/stdout`, `/dev/fd/1`, `/proc/self/fd/1`, and the same for 2) are the streams
/// themselves, so the output lands where the stream stands, after what was printed; any other
/// regular file reached through `/dev` or `/proc` is appended to; a device or FIFO is opened
/// for writing.
fn open_in_place(path: &Path) -> std::io::Result<File> {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        let given = path.as_os_str();
        if ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"].iter().any(|p| given == *p) {
            std::io::stdout().flush()?;
            return Ok(File::from(std::io::stdout().as_fd().try_clone_to_owned()?));
        }
        if ["/dev/stderr", "/dev/fd/2", "/proc/self/fd/2"].iter().any(|p| given == *p) {
            return Ok(File::from(std::io::stderr().as_fd().try_clone_to_owned()?));
        }
    }
    let regular = std::fs::metadata(path).is_ok_and(|m| m.is_file());
    std::fs::OpenOptions::new().write(true).append(regular).open(path)
}

/// The one way every command writes an output file. A regular (or new) file is written to a
/// temporary file in the same directory, synced, then renamed onto it, so a reader or a killed
/// run sees the old file or the whole new one, never half of one. An existing output that is not
/// a regular file (device, FIFO, link to one) is written in place: renaming over `/dev/null` as
/// root would replace the device with a file.
pub fn write_output_with(path: &Path, fill: impl FnOnce(&mut BufWriter<&mut File>) -> std::io::Result<()>) -> std::io::Result<()> {
    match output_target(path)? {
        OutputTarget::InPlace(path) => {
            let mut file = open_in_place(&path)?;
            let mut writer = BufWriter::new(&mut file);
            fill(&mut writer)?;
            writer.flush()
        }
        OutputTarget::Replace(path) => {
            let dir = parent_dir(&path);
            std::fs::create_dir_all(&dir)?;
            let mut tmp = tempfile::Builder::new().prefix(".ctxsim-tmp").tempfile_in(&dir)?;
            {
                let mut writer = BufWriter::new(tmp.as_file_mut());
                fill(&mut writer)?;
                writer.flush()?;
            }
            persist_with_mode(tmp, &path)
        }
    }
}

/// Puts a finished temporary file at `path`: renamed onto a regular (or new) file, synced
/// first; copied into an existing special file (see [`write_output_with`]). A temporary file is
/// created owner-only (0600); the output gets the ordinary mode a user expects of a file they
/// asked for, or keeps the mode of the file it replaces.
pub fn persist_with_mode(tmp: tempfile::NamedTempFile, path: &Path) -> std::io::Result<()> {
    let path = match output_target(path)? {
        OutputTarget::InPlace(path) => {
            let mut source = tmp.reopen()?;
            let mut file = open_in_place(&path)?;
            std::io::copy(&mut source, &mut file)?;
            return file.flush();
        }
        OutputTarget::Replace(path) => path,
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0o644);
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    tmp.as_file().sync_all()?;
    tmp.persist(&path).map_err(|e| e.error)?;
    Ok(())
}

/// The directory a temporary file for `path` must be created in so the final rename stays on
/// one filesystem: the directory of the link target when `path` is a link.
pub fn temp_dir_for(path: &Path) -> std::io::Result<PathBuf> {
    Ok(match output_target(path)? {
        OutputTarget::InPlace(_) => std::env::temp_dir(),
        OutputTarget::Replace(target) => parent_dir(&target),
    })
}

/// One JSON line per request.
pub fn trace_jsonl(rows: &[RequestMetrics]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() * 600);
    for row in rows {
        serde_json::to_writer(&mut out, row).expect("trace rows serialize");
        out.push(b'\n');
    }
    out
}

/// Reads a trace JSONL back.
///
/// A trace is our own output, so nothing in it is skipped: a bad line is an error naming the
/// line and field, and a trace without any row is an error.
pub fn read_trace(text: &str, path: &str) -> Result<Vec<RequestMetrics>, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut de = serde_json::Deserializer::from_str(line);
        let row: RequestMetrics = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| format!("{path}:{}: {}: {}", i + 1, crate::input::json_path(e.path()), crate::input::cap_message(&e.inner().to_string())))?;
        de.end().map_err(|e| format!("{path}:{}: {}", i + 1, crate::input::cap_message(&e.to_string())))?;
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(format!("{path}: no trace row in it (the file is empty)"));
    }
    Ok(rows)
}

/// Refuses rows a report cannot draw: a cost that is not a finite number ≥ 0, or totals that
/// overflow to infinity.
pub fn check_finite(rows: &[RequestMetrics], path: &str) -> Result<(), String> {
    let mut total = 0.0f64;
    for (i, row) in rows.iter().enumerate() {
        if !(row.cost_usd.is_finite() && row.cost_usd >= 0.0) {
            return Err(format!("{path}: row {} (request {}): cost_usd: {} is not a finite number ≥ 0", i + 1, row.index, row.cost_usd));
        }
        total += row.cost_usd;
        if !total.is_finite() {
            return Err(format!("{path}: row {} (request {}): cost_usd: the running total is not finite", i + 1, row.index));
        }
    }
    Ok(())
}

/// Reads a trace file ([`read_trace`]); a byte-order mark is dropped, invalid UTF-8 is an
/// error naming the line and byte column.
pub fn read_trace_file(path: &Path) -> Result<Vec<RequestMetrics>, String> {
    let name = path.display().to_string();
    let text = crate::input::read_text(path).map_err(|e| e.to_string())?;
    read_trace(&text, &name)
}

/// The summaries as a human table.
pub fn summary_table(summaries: &[Summary]) -> String {
    let mut table = Table::new();
    table.load_style(UTF8_FULL_CONDENSED);
    table.set_header(vec![
        "input", "strategy", "requests", "hit ratio", "read", "creation", "uncached", "output", "cost $", "breaks", "compactions", "peak ctx",
    ]);
    for s in summaries {
        let compactions: u64 = s.compactions.values().sum();
        table.add_row(vec![
            s.input.clone(),
            s.strategy.clone(),
            s.requests.to_string(),
            format!("{:.3}", s.cache_hit_ratio),
            s.tokens.cache_read.to_string(),
            s.tokens.cache_creation.to_string(),
            s.tokens.input.to_string(),
            s.tokens.output.to_string(),
            format!("{:.4}", s.cost_usd),
            s.cache_breaks.to_string(),
            compactions.to_string(),
            s.peak_context_tokens.to_string(),
        ]);
    }
    table.to_string()
}

/// The summaries as CSV (one row per input).
pub fn summary_csv(summaries: &[Summary]) -> Vec<u8> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    let mut header = vec![
        "input", "strategy", "model", "estimator", "requests", "turns", "input_tokens", "cache_read", "cache_creation",
        "cache_creation_5m", "cache_creation_1h", "output_tokens", "cache_hit_ratio", "cost_usd", "cache_breaks", "blocked",
        "peak_context_tokens", "fingerprint",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect::<Vec<_>>();
    header.extend(crate::measure::metrics::COMPACTION_KEYS.iter().map(|k| format!("compactions_{k}")));
    // `replay` names what ran its sessions; `run` and `analyze` have no engine (no column).
    let engines = summaries.iter().any(|s| s.engine.is_some());
    if engines {
        header.push("engine".to_owned());
    }
    writer.write_record(&header).expect("csv to memory");
    for s in summaries {
        let mut record = vec![
            s.input.clone(),
            s.strategy.clone(),
            s.model.clone(),
            s.estimator.clone(),
            s.requests.to_string(),
            s.turns.to_string(),
            s.tokens.input.to_string(),
            s.tokens.cache_read.to_string(),
            s.tokens.cache_creation.to_string(),
            s.tokens.cache_creation_5m.to_string(),
            s.tokens.cache_creation_1h.to_string(),
            s.tokens.output.to_string(),
            s.cache_hit_ratio.to_string(),
            s.cost_usd.to_string(),
            s.cache_breaks.to_string(),
            s.blocked.to_string(),
            s.peak_context_tokens.to_string(),
            s.fingerprint.clone(),
        ];
        record.extend(crate::measure::metrics::COMPACTION_KEYS.iter().map(|k| s.compactions.get(*k).copied().unwrap_or(0).to_string()));
        if engines {
            record.push(s.engine.clone().unwrap_or_default());
        }
        writer.write_record(&record).expect("csv to memory");
    }
    writer.into_inner().expect("csv to memory")
}

/// Per-request CSV of a trace.
pub fn trace_csv(rows: &[RequestMetrics]) -> Vec<u8> {
    trace_columns(rows).to_csv()
}

/// The trace's columns (one row per request): the CSV trace and the Parquet trace.
pub fn trace_columns(rows: &[RequestMetrics]) -> super::columns::Columns {
    use super::columns::{Columns, Values};
    let text = |f: &dyn Fn(&RequestMetrics) -> String| Values::Str(rows.iter().map(f).collect());
    let int = |f: &dyn Fn(&RequestMetrics) -> u64| Values::Int(rows.iter().map(|r| f(r) as i64).collect());
    let mut c = Columns::default();
    c.push("index", int(&|r| r.index as u64));
    c.push("lane", text(&|r| r.lane.clone()));
    c.push("turn", int(&|r| u64::from(r.turn)));
    c.push("time_ms", int(&|r| r.time_ms));
    c.push("model", text(&|r| r.model.clone()));
    c.push("input_tokens", int(&|r| r.input_tokens));
    c.push("cache_read_input_tokens", int(&|r| r.cache_read_input_tokens));
    c.push("cache_creation_input_tokens", int(&|r| r.cache_creation_input_tokens));
    c.push("cache_creation_5m", int(&|r| r.cache_creation.ephemeral_5m_input_tokens));
    c.push("cache_creation_1h", int(&|r| r.cache_creation.ephemeral_1h_input_tokens));
    c.push("output_tokens", int(&|r| r.output_tokens));
    c.push("context_tokens", int(&|r| r.context_tokens));
    c.push("common_blocks", int(&|r| r.prefix.common_blocks as u64));
    c.push("diverged_at", text(&|r| r.prefix.diverged_at.clone().unwrap_or_default()));
    c.push("cause", text(&|r| r.prefix.cause.clone().unwrap_or_default()));
    c.push("cache_break", Values::Bool(rows.iter().map(|r| r.cache_break).collect()));
    c.push("cost_usd", Values::Float(rows.iter().map(|r| r.cost_usd).collect(), None));
    c.push("error", text(&|r| r.error.clone().unwrap_or_default()));
    c
}

/// A directory output (`--out DIR`, `--dump-requests DIR`, `--plot DIR`) written as a new
/// generation: everything goes into a fresh sibling directory, and [`OutputDir::commit`] swaps
/// it in with one rename, so a run killed at any moment leaves the previous generation whole
/// (plus, at worst, a stale `.NAME.ctxsim-new*` sibling). Entries of the previous generation
/// that this run does not write are carried into the new one (hard links), so nothing a user
/// kept in the directory is lost.
#[derive(Debug)]
pub struct OutputDir {
    /// Where the generation ends up (links followed).
    target: PathBuf,
    /// The fresh sibling being filled; `None` once committed.
    fresh: Option<tempfile::TempDir>,
}

impl OutputDir {
    /// Creates the fresh sibling of `dir` (which must not be the current directory or one of
    /// its ancestors: the swap would pull the directory out from under the caller).
    pub fn begin(dir: &Path) -> std::io::Result<OutputDir> {
        let target = resolve_links(dir)?;
        if let Ok(meta) = std::fs::metadata(&target)
            && !meta.is_dir()
        {
            return Err(std::io::Error::new(std::io::ErrorKind::NotADirectory, format!("{} exists and is not a directory", dir.display())));
        }
        let absolute = if target.is_absolute() { target.clone() } else { std::env::current_dir()?.join(&target) };
        let absolute = normalize(&absolute);
        let name = absolute.file_name().map(|n| n.to_string_lossy().into_owned()).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{}: an output directory needs a name of its own", dir.display()))
        })?;
        if let Ok(cwd) = std::env::current_dir().and_then(std::fs::canonicalize)
            && let Ok(existing) = std::fs::canonicalize(&absolute)
            && cwd.starts_with(&existing)
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{}: the output directory contains the current directory; give a directory below it", dir.display()),
            ));
        }
        let parent = parent_dir(&absolute);
        std::fs::create_dir_all(&parent)?;
        let fresh = tempfile::Builder::new().prefix(&format!(".{name}.ctxsim-new")).tempdir_in(&parent)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(fresh.path(), std::fs::Permissions::from_mode(0o755))?;
        }
        Ok(OutputDir { target: absolute, fresh: Some(fresh) })
    }

    /// Where the generation is swapped in (links followed, absolute).
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The directory to write this generation's files into.
    pub fn path(&self) -> &Path {
        self.fresh.as_ref().expect("not committed").path()
    }

    /// Carries the previous generation's other entries over and swaps the new one in.
    pub fn commit(mut self) -> std::io::Result<()> {
        let fresh = self.fresh.take().expect("committed once");
        if std::fs::symlink_metadata(&self.target).is_ok() {
            carry_over(&self.target, fresh.path())?;
        }
        sync_dir(fresh.path());
        let fresh = fresh.keep();
        match swap_in(&fresh, &self.target) {
            Ok(()) => {
                sync_dir(&parent_dir(&self.target));
                // After an exchange the previous generation sits at the fresh name.
                if fresh.exists() {
                    std::fs::remove_dir_all(&fresh)?;
                }
                Ok(())
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&fresh);
                Err(e)
            }
        }
    }
}

/// `.` and `..` components of an absolute path resolved lexically.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn sync_dir(dir: &Path) {
    if let Ok(file) = File::open(dir) {
        let _ = file.sync_all();
    }
}

/// Hard-links (or recreates) every entry of `old` missing from `new`, recursively.
fn carry_over(old: &Path, new: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(old)? {
        let entry = entry?;
        let to = new.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            if !to.exists() {
                std::fs::create_dir(&to)?;
                std::fs::set_permissions(&to, entry.metadata()?.permissions())?;
            }
            if std::fs::metadata(&to)?.is_dir() {
                carry_over(&entry.path(), &to)?;
            }
        } else if std::fs::symlink_metadata(&to).is_ok() {
            continue;
        } else if kind.is_symlink() {
            #[cfg(unix)]
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &to)?;
        } else if kind.is_file() {
            std::fs::hard_link(entry.path(), &to).or_else(|_| std::fs::copy(entry.path(), &to).map(|_| ()))?;
        } else {
            return Err(std::io::Error::other(format!(
                "{}: a special file in an output directory cannot be carried into the new generation; move it away",
                entry.path().display()
            )));
        }
    }
    Ok(())
}

/// Puts `fresh` at `target` in one step: an atomic exchange when `target` exists (Linux
/// `renameat2(RENAME_EXCHANGE)`), a rename otherwise.
fn swap_in(fresh: &Path, target: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(target).is_err() {
        return std::fs::rename(fresh, target);
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        let a = std::ffi::CString::new(fresh.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
        let b = std::ffi::CString::new(target.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
        // SAFETY: two valid NUL-terminated paths; renameat2 reads them and nothing else.
        let rc = unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), libc::RENAME_EXCHANGE) };
        if rc == 0 {
            return Ok(());
        }
        let error = std::io::Error::last_os_error();
        if !matches!(error.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
            return Err(error);
        }
    }
    // No exchange on this system: the previous generation is moved aside first (a kill between
    // the two renames leaves it whole under the fresh name's sibling).
    let aside = parent_dir(fresh).join(format!("{}.old", fresh.file_name().unwrap_or_default().to_string_lossy()));
    std::fs::rename(target, &aside)?;
    std::fs::rename(fresh, target)?;
    std::fs::rename(&aside, fresh)
}
