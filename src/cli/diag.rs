//! What the readers skipped, for the user: every warning is printed to stderr as it is met and
//! kept for the JSON outputs (`warnings`); `--strict` turns any of them into exit 2.

use crate::recording::{LineWarning, Warnings};

use super::exit;

/// The warnings of one command run.
#[derive(Debug, Default)]
pub struct Diagnostics {
    strict: bool,
    count: usize,
    first: Option<LineWarning>,
}

impl Diagnostics {
    pub fn new(strict: bool) -> Self {
        Diagnostics { strict, ..Diagnostics::default() }
    }

    /// Prints `warnings` (one line each, `file:line: ...`) and counts them; returns them as
    /// the list a JSON output carries.
    pub fn report(&mut self, warnings: &Warnings) -> Vec<LineWarning> {
        for warning in &warnings.list {
            eprintln!("warning: {warning}");
        }
        if warnings.suppressed > 0 {
            let file = warnings.list.last().map_or("", |w| w.file.as_str());
            eprintln!("warning: {file}: {} more warnings not shown", warnings.suppressed);
        }
        self.count += warnings.len();
        if self.first.is_none() {
            self.first = warnings.list.first().cloned();
        }
        warnings.list.clone()
    }

    /// [`Diagnostics::report`] for a plain list.
    pub fn report_list(&mut self, list: &[LineWarning]) -> Vec<LineWarning> {
        let mut warnings = Warnings::default();
        for w in list {
            warnings.push(w.clone());
        }
        self.report(&warnings)
    }

    /// The exit code of the run: `code`, or [`exit::BAD_INPUT`] under `--strict` when anything
    /// was skipped.
    pub fn finish(&self, code: i32) -> i32 {
        match &self.first {
            Some(first) if self.strict => {
                eprintln!("error: --strict: {} input warnings, the first: {first}", self.count);
                exit::BAD_INPUT
            }
            _ => code,
        }
    }
}
