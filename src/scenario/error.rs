use std::fmt;
use std::path::PathBuf;

/// A problem in a scenario file, located by file, line, column and field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file name as given to the loader.
    pub file: String,
    /// 1-based line and column, when known.
    pub line: Option<usize>,
    pub column: Option<usize>,
    /// Field path such as `script[3].assistant[0]`; empty for the document root.
    pub field: String,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    /// `file:line:column: field: message`, the shape editors and CI annotators understand.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        f.write_str(": ")?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

/// Failure to load a scenario.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("failed to read scenario {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// The file is not valid YAML, does not fit the schema, or fails validation.
    #[error("{0}")]
    Invalid(Diagnostic),
}

impl ScenarioError {
    /// The diagnostic, for errors about the file's content.
    pub fn diagnostic(&self) -> Option<&Diagnostic> {
        match self {
            ScenarioError::Invalid(d) => Some(d),
            ScenarioError::Io { .. } => None,
        }
    }
}
