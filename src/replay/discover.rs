//! Finding sessions the way users have them: files and directories, or, with no input at all,
//! Claude Code's own store (`$CLAUDE_CONFIG_DIR/projects` for each entry of a comma-separated
//! list, else `~/.claude/projects` and `~/.config/claude/projects`), as ccusage reads it.
//!
//! A directory is walked (sorted, symbolic links followed) for transcripts:
//! - `<session>.jsonl`; its subagent files `<session>/subagents/agent-*.jsonl` belong to it (the
//!   importer attaches them) and are not sessions of their own;
//! - Entire checkpoints `<id>.full.jsonl` (their `<id>.metadata.json` is not a transcript).
//!
//! The project of a session is the name of the directory holding its file (Claude Code's
//! `projects/<project>/<session>.jsonl`), its id the file name without `.jsonl` / `.full.jsonl`.
//! Filters: `--since` / `--until` (UTC dates, inclusive) keep sessions with a timestamp in the
//! range; `--project` keeps projects whose name contains the text; `--session` keeps one id.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Serialize;

/// One session file found.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct SessionFile {
    pub path: PathBuf,
    pub project: String,
    pub session_id: String,
}

impl SessionFile {
    pub fn new(path: PathBuf) -> SessionFile {
        let project = path.parent().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let session_id = name.strip_suffix(".full.jsonl").or_else(|| name.strip_suffix(".jsonl")).unwrap_or(&name).to_owned();
        SessionFile { path, project, session_id }
    }
}

/// The session filters shared by every command that reads sessions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionFilter {
    pub since: Option<jiff::civil::Date>,
    pub until: Option<jiff::civil::Date>,
    pub project: Option<String>,
    pub session: Option<String>,
}

/// `YYYY-MM-DD` or `YYYYMMDD`, as ccusage takes them.
pub fn parse_date(text: &str) -> anyhow::Result<jiff::civil::Date> {
    let iso = if text.len() == 8 && text.bytes().all(|b| b.is_ascii_digit()) {
        format!("{}-{}-{}", &text[..4], &text[4..6], &text[6..])
    } else {
        text.to_owned()
    };
    iso.parse().with_context(|| format!("`{text}` is not a date (YYYY-MM-DD or YYYYMMDD)"))
}

impl SessionFilter {
    fn keeps_name(&self, file: &SessionFile) -> bool {
        self.project.as_ref().is_none_or(|p| file.project.contains(p.as_str()))
            && self.session.as_ref().is_none_or(|s| file.session_id == *s)
    }

    fn has_dates(&self) -> bool {
        self.since.is_some() || self.until.is_some()
    }

    fn keeps_day(&self, day: &str) -> bool {
        self.since.is_none_or(|d| day >= d.to_string().as_str()) && self.until.is_none_or(|d| day <= d.to_string().as_str())
    }
}

/// Where Claude Code keeps its projects: each entry of `$CLAUDE_CONFIG_DIR` (comma-separated)
/// with `/projects`, else `~/.claude/projects` and `~/.config/claude/projects`; those that exist.
pub fn default_roots() -> Vec<PathBuf> {
    let candidates: Vec<PathBuf> = match std::env::var("CLAUDE_CONFIG_DIR") {
        Ok(list) if !list.trim().is_empty() => {
            list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|dir| Path::new(dir).join("projects")).collect()
        }
        _ => match std::env::var_os("HOME") {
            Some(home) => {
                let home = PathBuf::from(home);
                vec![home.join(".claude/projects"), home.join(".config/claude/projects")]
            }
            None => Vec::new(),
        },
    };
    candidates.into_iter().filter(|p| p.is_dir()).collect()
}

/// Whether a walked file is a session transcript of its own.
fn is_session_file(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return false };
    if !name.ends_with(".jsonl") {
        return false;
    }
    // `<session>/subagents/agent-*.jsonl` belongs to `<session>.jsonl`.
    let in_subagents = path.parent().and_then(|p| p.file_name()).is_some_and(|n| n == "subagents");
    !in_subagents
}

/// The transcripts under a directory, sorted by path (no filter).
pub fn walk(root: &Path) -> anyhow::Result<Vec<SessionFile>> {
    let mut files = Vec::new();
    for entry in walkdir::WalkDir::new(root).follow_links(true).sort_by_file_name() {
        let entry = entry.with_context(|| format!("failed to walk {}", root.display()))?;
        if entry.file_type().is_file() && is_session_file(entry.path()) {
            files.push(SessionFile::new(entry.path().to_path_buf()));
        }
    }
    Ok(files)
}

/// The session files of the inputs (or of [`default_roots`] when there are none), sorted by
/// path, each once, filtered.
pub fn discover(inputs: &[PathBuf], filter: &SessionFilter) -> anyhow::Result<Vec<SessionFile>> {
    let roots: Vec<PathBuf> = if inputs.is_empty() {
        let roots = default_roots();
        if roots.is_empty() {
            bail!("no inputs, and no Claude Code projects directory: set CLAUDE_CONFIG_DIR or pass files or directories");
        }
        roots
    } else {
        inputs.to_vec()
    };
    let mut files = Vec::new();
    for root in &roots {
        if root.is_dir() {
            let found = walk(root)?;
            if found.is_empty() && !inputs.is_empty() {
                bail!("{}: no transcripts (*.jsonl) in this directory", root.display());
            }
            files.extend(found);
        } else if root.exists() {
            files.push(SessionFile::new(root.clone()));
        } else {
            bail!("{}: no such file or directory", root.display());
        }
    }
    apply(files, filter)
}

/// Sorts by path, keeps each file once (a directory and a file in it, a link) and applies the
/// filter.
pub fn apply(mut files: Vec<SessionFile>, filter: &SessionFilter) -> anyhow::Result<Vec<SessionFile>> {
    let mut seen = std::collections::BTreeSet::new();
    files.retain(|f| seen.insert(std::fs::canonicalize(&f.path).unwrap_or_else(|_| f.path.clone())));
    files.sort();
    files.retain(|f| filter.keeps_name(f));
    if filter.has_dates() {
        let mut kept = Vec::new();
        for file in files {
            if days_of(&file.path)?.iter().any(|d| filter.keeps_day(d)) {
                kept.push(file);
            }
        }
        files = kept;
    }
    Ok(files)
}

/// A transcript and its subagent files (`<session>/subagents/*.jsonl`, sorted).
pub fn transcript_files(path: &Path) -> Vec<PathBuf> {
    let mut paths = vec![path.to_path_buf()];
    if let Some(stem) = path.to_str().and_then(|p| p.strip_suffix(".jsonl")) {
        let dir = Path::new(stem).join("subagents");
        if let Ok(entries) = std::fs::read_dir(&dir) {
            let mut subs: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == "jsonl")).collect();
            subs.sort();
            paths.extend(subs);
        }
    }
    paths
}

/// The time of each API call of a transcript (subagent files included), keyed by
/// `(message.id, requestId)`: the first line's `timestamp`, as written (not the importer's
/// virtual time, which never goes below the first record's). A separate read of the files; see
/// [`call_times_of`] for a session imported from them.
pub fn call_times(path: &Path) -> std::collections::BTreeMap<(String, String), i64> {
    let mut out = std::collections::BTreeMap::new();
    for p in transcript_files(path) {
        // The whole file at once, its lines slices of it; read as `BufRead::lines` would (a line
        // that is not UTF-8 ends the file).
        let Ok(bytes) = std::fs::read(&p) else { continue };
        let mut lines = bytes.split(|&b| b == b'\n');
        if bytes.last() == Some(&b'\n') {
            lines.next_back();
        }
        for line in lines {
            let Ok(line) = std::str::from_utf8(line.strip_suffix(b"\r").unwrap_or(line)) else { break };
            if let Some((id, req, ms)) = crate::recording::claude_code::written_call_time(line) {
                out.entry((id, req)).or_insert(ms);
            }
        }
    }
    out
}

/// [`call_times`] of `path`, taken from `session` when it was imported from the same files (the
/// importer keeps each call's written time as it reads the lines), else read again.
pub fn call_times_of<'s>(path: &Path, session: &'s crate::recording::claude_code::ImportedSession) -> std::borrow::Cow<'s, std::collections::BTreeMap<(String, String), i64>> {
    match session.written_call_times() {
        Some(written) if written.files == transcript_files(path) => std::borrow::Cow::Borrowed(&written.times),
        _ => std::borrow::Cow::Owned(call_times(path)),
    }
}

/// The UTC days (`YYYY-MM-DD`) of the records of a transcript, read from their `timestamp`
/// fields without parsing the records (subagent files included).
fn days_of(path: &Path) -> anyhow::Result<std::collections::BTreeSet<String>> {
    let mut days = std::collections::BTreeSet::new();
    let paths = transcript_files(path);
    const KEY: &str = "\"timestamp\":\"";
    for p in paths {
        let file = std::fs::File::open(&p).with_context(|| format!("failed to read {}", p.display()))?;
        for line in std::io::BufReader::new(file).lines() {
            let Ok(line) = line else { break };
            if let Some(i) = line.find(KEY) {
                let rest = &line[i + KEY.len()..];
                let end = rest.find('"').unwrap_or(rest.len());
                if let Ok(ts) = rest[..end].parse::<jiff::Timestamp>() {
                    days.insert(ts.strftime("%Y-%m-%d").to_string());
                }
            }
        }
    }
    Ok(days)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_in_both_forms() {
        assert_eq!(parse_date("20260201").unwrap(), parse_date("2026-02-01").unwrap());
        assert!(parse_date("2026-13-01").is_err());
    }

    #[test]
    fn names() {
        let f = SessionFile::new(PathBuf::from("/x/projects/-home-me-p/abc.jsonl"));
        assert_eq!((f.project.as_str(), f.session_id.as_str()), ("-home-me-p", "abc"));
        let f = SessionFile::new(PathBuf::from("t/cipher-box/af1dd25ebb3e-8.full.jsonl"));
        assert_eq!((f.project.as_str(), f.session_id.as_str()), ("cipher-box", "af1dd25ebb3e-8"));
    }
}
