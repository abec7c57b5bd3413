//! One harness per reader of user input, taking arbitrary bytes: the `fuzz/` targets
//! (cargo-fuzz) call them, and so do the proptest and the mutation suite of
//! `tests/it/robustness.rs`. Each reads the bytes as the file [`FILE`] the way the CLI reads a
//! file of that kind, and checks what docs/reliability.md promises for readers:
//!
//! - it never panics (a panic is the finding);
//! - every warning names the file and a line (≥ 1);
//! - an error names the file, and for a line-oriented input the line (`file:N` or `line N`),
//!   unless the input is empty; it never quotes more than a short excerpt of the input;
//! - nothing is dropped silently: for the JSONL readers, every non-blank line is used or has a
//!   warning (or the whole input is an error).
//!
//! A broken promise panics with the input's reader and the offending message, so a fuzzer
//! reports it as a crash. The returned [`Outcome`] lets a test compare readings.

use std::io::Cursor;

use crate::recording::{LineWarning, Warnings};

/// The name every harness gives its input in messages.
pub const FILE: &str = "fuzz-input";

/// Longest error message a reader may print for one input (a few excerpts and positions).
pub const MAX_MESSAGE: usize = 2_000;

/// What a reader made of an input.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Read: how many records it used, and what it skipped.
    Read { records: usize, warnings: Vec<LineWarning>, suppressed: usize },
    /// Refused, with the message the user sees.
    Rejected(String),
}

impl Outcome {
    /// True when something of the input was not used: a warning or an error.
    pub fn dropped_something(&self) -> bool {
        match self {
            Outcome::Read { warnings, suppressed, .. } => !warnings.is_empty() || *suppressed > 0,
            Outcome::Rejected(_) => true,
        }
    }
}

/// A reader's harness.
pub type Harness = fn(&[u8]) -> Outcome;

/// The readers, by name (the names of the fuzz targets).
pub const READERS: &[(&str, Harness)] = &[
    ("recording", recording),
    ("transcript", transcript),
    ("request_log", request_log),
    ("claude_trace", claude_trace),
    ("shapes", shapes),
    ("model_table", model_table),
    ("calibration", calibration),
    ("strategy_toml", strategy_toml),
    ("strategy_yaml", strategy_yaml),
    ("baseline", baseline),
    ("sweep_csv", sweep_csv),
    ("trace", trace),
    ("scenario", scenario),
];

/// The harness of a reader by name.
pub fn reader(name: &str) -> Option<Harness> {
    READERS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// Non-blank lines of a JSONL input, as the line readers count them (a byte-order mark
/// opening the file is not content; a line of ASCII whitespace is blank).
pub fn non_blank_lines(data: &[u8]) -> usize {
    let data = data.strip_prefix(crate::input::BOM).unwrap_or(data);
    data.split(|&b| b == b'\n').filter(|line| !line.iter().all(u8::is_ascii_whitespace)).count()
}

fn first_non_blank_byte(data: &[u8]) -> Option<u8> {
    let data = data.strip_prefix(crate::input::BOM).unwrap_or(data);
    data.iter().copied().find(|b| !b.is_ascii_whitespace())
}

/// The line (from 1) of the first non-blank byte, or 1 when there is none.
fn first_content_line(data: &[u8]) -> usize {
    let blank = data.iter().take_while(|b| b.is_ascii_whitespace()).filter(|&&b| b == b'\n').count();
    blank + 1
}

/// Checks the warnings and wraps them.
fn read(reader: &str, records: usize, warnings: &Warnings) -> Outcome {
    for w in &warnings.list {
        assert!(w.file == FILE && w.line >= 1, "{reader}: a warning without file and line: {}", crate::input::excerpt(&w.to_string()));
        let length = w.to_string().len();
        assert!(length <= MAX_MESSAGE, "{reader}: a warning quotes too much ({length} bytes): {}", crate::input::excerpt(&w.to_string()));
    }
    Outcome::Read { records, warnings: warnings.list.clone(), suppressed: warnings.suppressed }
}

/// Checks an error message and wraps it; `line_oriented` readers must name the line.
fn rejected(reader: &str, message: String, line_oriented: bool) -> Outcome {
    assert!(message.contains(FILE), "{reader}: an error that does not name the file: {}", crate::input::excerpt(&message));
    assert!(message.len() <= MAX_MESSAGE, "{reader}: an error quotes too much ({} bytes): {}", message.len(), crate::input::excerpt(&message));
    if line_oriented {
        assert!(
            names_a_line(&message) || message.contains("empty"),
            "{reader}: an error that does not name the line: {}",
            crate::input::excerpt(&message)
        );
    }
    Outcome::Rejected(message)
}

/// `file:N` or `line N` somewhere in the message.
pub fn names_a_line(message: &str) -> bool {
    let after = |marker: &str| {
        message.match_indices(marker).any(|(i, _)| message[i + marker.len()..].starts_with(|c: char| c.is_ascii_digit()))
    };
    after(&format!("{FILE}:")) || after("line ")
}

fn warnings_of(list: &[LineWarning]) -> Warnings {
    let mut warnings = Warnings::default();
    for w in list {
        warnings.push(w.clone());
    }
    warnings
}

/// A ctxsim recording (`recording::read_recording_from`): every event line is an event or a
/// warning.
pub fn recording(data: &[u8]) -> Outcome {
    match crate::recording::read_recording_from(Cursor::new(data), FILE) {
        Ok(read) => {
            let events = read.recording.events.len();
            let lines = non_blank_lines(data);
            assert_eq!(events + read.warnings.len() + 1, lines, "recording: {lines} lines, {events} events and {} warnings", read.warnings.len());
            self::read("recording", events, &read.warnings)
        }
        Err(e) => rejected("recording", e.to_string(), true),
    }
}

/// A Claude Code transcript (`recording::import_claude_code_from`), refused when no record
/// of it could be read (as `replay` and `import` do): every line is a record or a warning.
pub fn transcript(data: &[u8]) -> Outcome {
    match crate::recording::import_claude_code_from(Cursor::new(data), FILE) {
        Ok(session) if session.report.records_by_type.is_empty() => {
            rejected("transcript", session.report.nothing_read("transcript record").to_string(), true)
        }
        Ok(session) => {
            let records: usize = session.report.records_by_type.values().sum();
            let lines = non_blank_lines(data);
            assert!(
                records + session.report.warnings.len() >= lines,
                "transcript: {lines} lines but {records} records and {} warnings",
                session.report.warnings.len()
            );
            // The recorded wire requests rebuild or say why not; never a panic.
            let mut rebuilder = crate::recording::api_requests::Rebuilder::new(&session.api_requests);
            for id in session.api_requests.requests.keys() {
                let _ = rebuilder.rebuild(id).and_then(|r| r.request());
            }
            read("transcript", session.recording.events.len(), &session.report.warnings)
        }
        Err(e) => rejected("transcript", e.to_string(), true),
    }
}

/// An `analyze` request log (`analyze::read_log`): every line is a request, or the last
/// line is a truncated tail, or the log is refused naming the line.
pub fn request_log(data: &[u8]) -> Outcome {
    match crate::analyze::read_log(Cursor::new(data), FILE) {
        Ok(log) => {
            if first_non_blank_byte(data) != Some(b'[') {
                let lines = non_blank_lines(data);
                assert_eq!(log.entries.len() + log.warnings.len(), lines, "request_log: {lines} lines, {} entries", log.entries.len());
            } else {
                // A JSON array: each element names the line it starts on, in the file and in
                // order (two elements may share a line).
                let (first, last) = (first_content_line(data), data.iter().filter(|&&b| b == b'\n').count() + 1);
                let lines: Vec<usize> = log.entries.iter().map(|e| e.line).collect();
                assert!(
                    lines.iter().all(|&l| (first..=last).contains(&l)) && lines.is_sorted(),
                    "request_log: array elements on lines {lines:?}, the array spans lines {first}..={last}"
                );
            }
            read("request_log", log.entries.len(), &warnings_of(&log.warnings))
        }
        Err(e) => rejected("request_log", e.to_string(), true),
    }
}

/// A claude-trace capture (`recording::convert_claude_trace`): every line is a request, a
/// counted other endpoint, or a warning; a capture without any request is refused.
pub fn claude_trace(data: &[u8]) -> Outcome {
    match crate::recording::convert_claude_trace(Cursor::new(data), FILE) {
        Ok(converted) => {
            let report = &converted.report;
            let lines = non_blank_lines(data);
            let accounted = converted.entries.len() + report.skipped_requests + report.warnings.len();
            assert!(accounted >= lines, "claude_trace: {lines} lines, {accounted} accounted for");
            read("claude_trace", converted.entries.len(), &report.warnings)
        }
        Err(e) => rejected("claude_trace", e.to_string(), true),
    }
}

/// Request shapes or a request log as `diff-requests` reads them (`shape::read_bytes`).
pub fn shapes(data: &[u8]) -> Outcome {
    match crate::shape::read_bytes(data, FILE) {
        Ok((shapes, warnings)) => {
            if first_non_blank_byte(data) != Some(b'[') {
                let lines = non_blank_lines(data);
                assert_eq!(shapes.len() + warnings.len(), lines, "shapes: {lines} lines, {} shapes", shapes.len());
            }
            read("shapes", shapes.len(), &warnings)
        }
        Err(e) => rejected("shapes", e, true),
    }
}

/// Whole-document text as every such reader takes it ([`crate::input::decode`]).
fn text(data: &[u8]) -> Result<&str, String> {
    crate::input::decode(data, FILE).map_err(|e| e.to_string())
}

/// A model table (TOML, `measure::ModelTable::parse`).
pub fn model_table(data: &[u8]) -> Outcome {
    match text(data).and_then(|t| crate::measure::ModelTable::parse(t, FILE).map_err(|e| e.to_string())) {
        Ok(table) => read("model_table", table.models.len(), &Warnings::default()),
        Err(e) => rejected("model_table", e, false),
    }
}

/// A calibration (JSON, `measure::Calibration::parse`).
pub fn calibration(data: &[u8]) -> Outcome {
    match text(data).and_then(|t| crate::measure::Calibration::parse(t, FILE).map_err(|e| e.to_string())) {
        Ok(_) => read("calibration", 1, &Warnings::default()),
        Err(e) => rejected("calibration", e, false),
    }
}

fn strategy(data: &[u8], toml: bool) -> Outcome {
    let name = if toml { "strategy_toml" } else { "strategy_yaml" };
    match text(data).and_then(|t| crate::strategy::Strategy::parse(t, FILE, toml).map_err(|e| e.to_string())) {
        Ok(_) => read(name, 1, &Warnings::default()),
        Err(e) => rejected(name, e, false),
    }
}

/// A strategy file in TOML (`strategy::Strategy::parse`).
pub fn strategy_toml(data: &[u8]) -> Outcome {
    strategy(data, true)
}

/// A strategy file in YAML (`strategy::Strategy::parse`).
pub fn strategy_yaml(data: &[u8]) -> Outcome {
    strategy(data, false)
}

/// A `check` baseline (JSON, `report::check::Baseline::parse`).
pub fn baseline(data: &[u8]) -> Outcome {
    match text(data).and_then(|t| crate::report::check::Baseline::parse(t, FILE).map_err(|e| e.to_string())) {
        Ok(b) => read("baseline", b.scenarios.len(), &Warnings::default()),
        Err(e) => rejected("baseline", e, false),
    }
}

/// A partial CSV of a sharded sweep (`report::sweep::parse_csv_text`).
pub fn sweep_csv(data: &[u8]) -> Outcome {
    match text(data).and_then(|t| crate::report::sweep::parse_csv_text(t, FILE).map_err(|e| format!("{e:#}"))) {
        Ok(part) => read("sweep_csv", part.rows.len(), &Warnings::default()),
        Err(e) => rejected("sweep_csv", e, true),
    }
}

/// A trace (`report::output::read_trace`): every line is a row, or the trace is refused.
pub fn trace(data: &[u8]) -> Outcome {
    match text(data).and_then(|t| crate::report::output::read_trace(t, FILE)) {
        Ok(rows) => {
            assert_eq!(rows.len(), non_blank_lines(data), "trace: a line neither read nor refused");
            read("trace", rows.len(), &Warnings::default())
        }
        Err(e) => rejected("trace", e, true),
    }
}

/// A scenario (YAML, `scenario::parse_scenario`; mounts are not read).
pub fn scenario(data: &[u8]) -> Outcome {
    match text(data).and_then(|t| crate::scenario::parse_scenario(t, FILE).map_err(|e| e.to_string())) {
        Ok(s) => read("scenario", s.script.len(), &Warnings::default()),
        Err(e) => rejected("scenario", e, false),
    }
}
