//! What an import saw and did, and how it can fail.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::format::{RecordingError, Warnings};
use crate::api::Usage;

/// Token sums over de-duplicated API calls, named like Entire's `token_usage` so the two can be
/// compared field by field.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageTotals {
    /// Merged calls, `<synthetic>` replies included (Entire counts them too).
    pub api_call_count: u64,
    /// Of those, replies the client wrote itself (no API call, zero usage).
    pub synthetic_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_creation_tokens: u64,
}

impl UsageTotals {
    pub fn add(&mut self, usage: &Usage, is_synthetic: bool) {
        self.api_call_count += 1;
        self.synthetic_calls += u64::from(is_synthetic);
        self.input_tokens += usage.input_tokens;
        self.output_tokens += usage.output_tokens;
        self.cache_read_tokens += usage.cache_read_input_tokens;
        self.cache_creation_tokens += usage.cache_creation_input_tokens;
    }
}

/// The result of an import, for the user and for tests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ImportReport {
    pub input: String,
    /// `claude-code`, `claude-trace`, `recording`.
    pub format: String,
    /// Lines read, over every file of the input (main transcript and subagent files).
    pub lines: usize,
    /// Records seen, by `type` (`system` records by `system:<subtype>`).
    pub records_by_type: BTreeMap<String, usize>,
    /// Record types the importer does not know; counted and skipped.
    pub unknown_by_type: BTreeMap<String, usize>,
    /// Record types read and counted but not used for measurement (2.1.2xx/3xx bookkeeping:
    /// `atis-latch`, `cost-state`, `tools-used`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub not_used_by_type: BTreeMap<String, usize>,
    /// Attachment records carrying `rendered` (the exact text sent), by `renderedRole`; the
    /// reconstruction sizes such an attachment by that text.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rendered_attachments: BTreeMap<String, usize>,
    /// `api-request` records read (the wire requests of 2.1.2xx/3xx transcripts).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub api_requests: usize,
    /// Calls whose reply names (`requestRef`) an `api-request` record that was read.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub api_requests_of_calls: usize,
    /// Records whose `uuid` had been seen before in the same file; skipped.
    pub duplicate_records: usize,
    /// Transcript lines folded into an earlier line's call (streamed chunks).
    pub chunks_merged: usize,
    /// Events (recordings) or requests (request logs) written.
    pub events: usize,
    pub calls: usize,
    /// Requests of a request log that were not `POST /v1/messages`; skipped.
    pub skipped_requests: usize,
    /// Usage sums over the calls of the main transcript file (every lane in it).
    pub totals_main_file: UsageTotals,
    /// Usage sums over every call, subagent files included.
    pub totals_all: UsageTotals,
    pub totals_by_lane: BTreeMap<String, UsageTotals>,
    pub subagent_files: Vec<String>,
    pub warnings: Warnings,
}

impl ImportReport {
    /// The error for an input of which nothing usable was read: names the file, the lines
    /// read and the first skipped line, so the user knows where to look.
    pub fn nothing_read(&self, what: &str) -> ImportError {
        let message = match self.warnings.first_bad_line().or(self.warnings.list.first()) {
            Some(first) if self.lines > 0 => {
                format!("no {what} in its {} lines; {} skipped, the first: {first}", self.lines, self.warnings.len())
            }
            _ if self.lines > 0 => format!("the file is empty ({} blank lines, no {what})", self.lines),
            _ => "the file is empty".to_owned(),
        };
        ImportError::NothingRead { file: self.input.clone(), message }
    }

    pub fn new(input: &str, format: &str) -> Self {
        ImportReport { input: input.to_owned(), format: format.to_owned(), ..ImportReport::default() }
    }

    /// Adds another file's counts and warnings (a subagent file's) to this report.
    pub(crate) fn absorb(&mut self, other: ImportReport) {
        self.lines += other.lines;
        for (k, v) in other.records_by_type {
            *self.records_by_type.entry(k).or_default() += v;
        }
        for (k, v) in other.unknown_by_type {
            *self.unknown_by_type.entry(k).or_default() += v;
        }
        for (k, v) in other.not_used_by_type {
            *self.not_used_by_type.entry(k).or_default() += v;
        }
        for (k, v) in other.rendered_attachments {
            *self.rendered_attachments.entry(k).or_default() += v;
        }
        self.duplicate_records += other.duplicate_records;
        self.chunks_merged += other.chunks_merged;
        for w in other.warnings.list {
            self.warnings.push(w);
        }
        self.warnings.suppressed += other.warnings.suppressed;
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("failed to read {file}: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("failed to detect the format of {file}: {message}")]
    Detect { file: String, message: String },
    #[error("failed to import {file}: {message}")]
    Unsupported { file: String, message: String },
    /// Nothing usable was read: an empty file, or every line skipped.
    #[error("failed to read {file}: {message}")]
    NothingRead { file: String, message: String },
    #[error(transparent)]
    Recording(#[from] RecordingError),
}
