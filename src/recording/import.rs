//! Format detection and the `import` entry point the CLI calls.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::claude_code::import_claude_code;
use super::claude_trace::{convert_claude_trace, write_request_log_to};
use super::format::{read_recording, write_atomically, write_recording};
use super::report::{ImportError, ImportReport};

/// The kinds of input files ctxsim reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InputFormat {
    /// A ctxsim recording (header line `{"ctxsim_recording": 1, ...}`).
    Recording,
    /// A Claude Code session transcript.
    ClaudeCode,
    /// A claude-trace capture (`{"request": ..., "response": ...}` per line).
    ClaudeTrace,
    /// An `analyze` request log (`{"time_ms", "body"}` per line, or a JSON array of bodies).
    RequestLog,
}

impl InputFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            InputFormat::Recording => "recording",
            InputFormat::ClaudeCode => "claude-code",
            InputFormat::ClaudeTrace => "claude-trace",
            InputFormat::RequestLog => "request-log",
        }
    }
}

/// Record types whose presence on a line marks a Claude Code transcript.
const TRANSCRIPT_TYPES: &[&str] = &[
    "user", "assistant", "system", "attachment", "progress", "file-history-snapshot", "summary",
    "queue-operation", "custom-title", "ai-title", "last-prompt", "pr-link", "mode", "permission-mode",
    "agent-name",
];

/// Detects the format of `path` from its first non-blank line.
pub fn detect_format(path: &Path) -> Result<InputFormat, ImportError> {
    let file_name = path.display().to_string();
    let file = File::open(path).map_err(|source| ImportError::Read { file: file_name.clone(), source })?;
    detect_format_from(BufReader::new(file), &file_name)
}

/// Detects the format of a reader from its first non-blank line.
pub fn detect_format_from<R: BufRead>(reader: R, file: &str) -> Result<InputFormat, ImportError> {
    detect_format_line(reader, file).map(|(format, _)| format)
}

/// Detects the format of `path`, with the number of the line it was told by.
pub fn detect_format_at(path: &Path) -> Result<(InputFormat, usize), ImportError> {
    let file_name = path.display().to_string();
    let file = File::open(path).map_err(|source| ImportError::Read { file: file_name.clone(), source })?;
    detect_format_line(BufReader::new(file), &file_name)
}

fn detect_format_line<R: BufRead>(mut reader: R, file: &str) -> Result<(InputFormat, usize), ImportError> {
    let mut bytes = Vec::new();
    let mut number = 0;
    loop {
        bytes.clear();
        let n = reader
            .read_until(b'\n', &mut bytes)
            .map_err(|source| ImportError::Read { file: file.to_owned(), source })?;
        if n == 0 {
            return Err(ImportError::Detect { file: file.to_owned(), message: "the file is empty".into() });
        }
        number += 1;
        if number == 1 && bytes.starts_with(crate::input::BOM) {
            bytes.drain(..crate::input::BOM.len());
        }
        if !bytes.iter().all(u8::is_ascii_whitespace) {
            break;
        }
    }
    let first = bytes.iter().copied().find(|b| !b.is_ascii_whitespace());
    if first == Some(b'[') {
        // A JSON array of bare request bodies: the alternative form of a request log.
        return Ok((InputFormat::RequestLog, number));
    }
    if let Some(column) = crate::input::invalid_utf8_column(&bytes) {
        return Err(ImportError::Detect { file: file.to_owned(), message: format!("line {number}: invalid UTF-8 at byte column {column}") });
    }
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| ImportError::Detect {
        file: file.to_owned(),
        message: format!("line {number} is not JSON: {}", crate::input::cap_message(&e.to_string())),
    })?;
    let Value::Object(map) = value else {
        return Err(ImportError::Detect { file: file.to_owned(), message: format!("line {number} is not a JSON object") });
    };
    if map.contains_key("ctxsim_recording") {
        return Ok((InputFormat::Recording, number));
    }
    if map.contains_key("request") && map.contains_key("response") {
        return Ok((InputFormat::ClaudeTrace, number));
    }
    if map.contains_key("body") && (map.contains_key("time_ms") || map.contains_key("time")) {
        return Ok((InputFormat::RequestLog, number));
    }
    let kind = map.get("type").and_then(Value::as_str);
    if kind.is_some_and(|k| TRANSCRIPT_TYPES.contains(&k))
        || map.contains_key("parentUuid")
        || map.contains_key("sessionId")
    {
        return Ok((InputFormat::ClaudeCode, number));
    }
    Err(ImportError::Detect {
        file: file.to_owned(),
        message: format!(
            "line {number} looks like none of: ctxsim recording (`ctxsim_recording`), Claude Code transcript \
             (`type`, `parentUuid`), claude-trace capture (`request` + `response`), request log (`time_ms` + `body`)"
        ),
    })
}

/// Converts `input` into `output`: a Claude Code transcript (with its subagent files) or a
/// recording becomes a recording; a claude-trace capture becomes an `analyze` request log.
/// `from` overrides detection. The output is written atomically.
pub fn import(input: &Path, from: Option<InputFormat>, output: &Path) -> Result<ImportReport, ImportError> {
    let file_name = input.display().to_string();
    let format = match from {
        Some(format) => format,
        None => detect_format(input)?,
    };
    match format {
        InputFormat::ClaudeCode => {
            let session = import_claude_code(input)?;
            if session.report.records_by_type.is_empty() {
                return Err(session.report.nothing_read("transcript record"));
            }
            write_recording(output, &session.recording)?;
            Ok(session.report)
        }
        InputFormat::ClaudeTrace => {
            let file = File::open(input).map_err(|source| ImportError::Read { file: file_name.clone(), source })?;
            let converted = convert_claude_trace(BufReader::new(file), &file_name)?;
            write_atomically(output, |w| write_request_log_to(&converted.entries, w))?;
            Ok(converted.report)
        }
        InputFormat::Recording => {
            // Reading and writing back normalizes a hand-edited recording and drops bad lines,
            // which the report lists.
            let read = read_recording(input)?;
            write_recording(output, &read.recording)?;
            let mut report = ImportReport::new(&file_name, "recording");
            report.events = read.recording.events.len();
            report.calls = super::claude_code::recorded_calls(&read.recording).len();
            report.warnings = read.warnings;
            Ok(report)
        }
        InputFormat::RequestLog => Err(ImportError::Unsupported {
            file: file_name,
            message: "the file is already a request log; measure it with `ctxsim analyze`".into(),
        }),
    }
}
