use std::path::PathBuf;

/// Failures of world operations caused by input (a script, a path, a pattern), as opposed to
/// broken invariants, which panic.
#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    #[error("failed to resolve `{path}`: virtual paths must be absolute POSIX paths")]
    NotAbsolute { path: String },
    #[error("failed to read {path}: no such file or directory")]
    NotFound { path: String },
    #[error("failed to access {path}: is a directory")]
    IsADirectory { path: String },
    #[error("failed to access {path}: a parent path is a file, not a directory")]
    NotADirectory { path: String },
    #[error("failed to edit {path}: the text to replace was not found")]
    EditNoMatch { path: String },
    #[error("failed to edit {path}: the text to replace occurs {count} times; give more context or replace all")]
    EditAmbiguous { path: String, count: usize },
    #[error("failed to compile glob pattern `{pattern}`: {message}")]
    BadGlob { pattern: String, message: String },
    #[error("failed to load {path} into the virtual filesystem: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("failed to get a model reply on lane `{lane}`: the script has no reply left (it had {consumed})")]
    ScriptExhausted { lane: String, consumed: usize },
    #[error("failed to get a model reply on lane `{lane}`: the script has no replies for this lane (scripted lanes: {scripted})")]
    LaneNotScripted { lane: String, scripted: String },
}
