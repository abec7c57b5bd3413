//! The session inputs every command that reads real sessions shares.
use std::path::PathBuf;

use clap::Args;

use crate::replay::discover::{SessionFile, SessionFilter, discover, parse_date};

#[derive(Debug, Clone, Args)]
pub struct SessionInputs {
    /// Transcripts or recordings, or directories of them (walked for `*.jsonl`; subagent files
    /// go with their session). None: `$CLAUDE_CONFIG_DIR/projects` (each entry of a
    /// comma-separated list), else `~/.claude/projects`.
    pub inputs: Vec<PathBuf>,
    /// Only sessions with activity on or after this UTC day (YYYY-MM-DD or YYYYMMDD).
    #[arg(long, value_parser = parse_date)]
    pub since: Option<jiff::civil::Date>,
    /// Only sessions with activity on or before this UTC day (YYYY-MM-DD or YYYYMMDD).
    #[arg(long, value_parser = parse_date)]
    pub until: Option<jiff::civil::Date>,
    /// Only projects whose directory name contains NAME.
    #[arg(long, value_name = "NAME")]
    pub project: Option<String>,
    /// Only the session with this id (its file name without `.jsonl`).
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
}

impl SessionInputs {
    pub fn filter(&self) -> SessionFilter {
        SessionFilter { since: self.since, until: self.until, project: self.project.clone(), session: self.session.clone() }
    }

    /// The session files, sorted; an error when the filters leave none.
    pub fn files(&self) -> anyhow::Result<Vec<SessionFile>> {
        let files = discover(&self.inputs, &self.filter())?;
        if files.is_empty() {
            anyhow::bail!("no sessions match the inputs and filters");
        }
        Ok(files)
    }
}
