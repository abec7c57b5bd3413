//! `ctxsim analyze`: measure a log of raw request bodies from any client.
//!
//! The log is JSONL, one request per line: `{"time_ms": 0, "body": {...}}` (or `"time"` as
//! RFC 3339), with optional `"lane"` and `"usage"` (as the API reported it). A JSON array of
//! bare bodies is accepted too; then requests are one second apart. Times are made relative to
//! the first request.
//!
//! Lanes not given are inferred: a request that extends the messages of an earlier lane's last
//! request (same tools and system, that lane's messages as a prefix of its own) continues that
//! lane, the longest such lane winning; a request whose first message equals the main lane's
//! first message but does not extend it is the main lane re-rendered; anything else opens a
//! new lane `side:N`.

use std::io::BufRead;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::api::{Request, Usage};
use crate::measure::blocks::{FlatRequest, Region, parse_request};
use crate::measure::{MeasureInput, Measurer, RequestMetrics, UnknownModel};

/// One entry of a request log.
#[derive(Debug, Clone)]
pub struct LogEntry {
    pub line: usize,
    pub time_ms: u64,
    pub body: Request,
    pub lane: Option<String>,
    pub usage: Option<Usage>,
}

#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error("failed to read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}:{line}: {message}")]
    Line { path: String, line: usize, message: String },
    #[error("{path}:{line}: {source}")]
    Model { path: String, line: usize, source: UnknownModel },
}

/// A log, read: the entries and the warnings (a truncated last line).
#[derive(Debug, Default)]
pub struct RequestLog {
    pub entries: Vec<LogEntry>,
    pub warnings: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLine {
    #[serde(default)]
    time_ms: Option<u64>,
    #[serde(default)]
    time: Option<String>,
    body: Value,
    #[serde(default)]
    lane: Option<String>,
    #[serde(default)]
    usage: Option<Value>,
}

fn line_error(path: &str, line: usize, message: impl Into<String>) -> AnalyzeError {
    AnalyzeError::Line { path: path.to_owned(), line, message: message.into() }
}

fn parse_time(text: &str) -> Result<u64, String> {
    let ts: jiff::Timestamp = text.parse().map_err(|e| format!("time: not an RFC 3339 timestamp `{text}`: {e}"))?;
    u64::try_from(ts.as_millisecond()).map_err(|_| format!("time: before 1970: `{text}`"))
}

fn parse_body(value: Value) -> Result<Request, String> {
    if !value.is_object() {
        return Err("body: not a Messages API request (expected an object)".to_owned());
    }
    parse_request(value).map_err(|e| format!("body.{}", e.trim_start_matches('.')))
}

/// Parses one log line (already JSON) into an entry.
fn parse_line(value: Value, line: usize) -> Result<LogEntry, String> {
    let raw: RawLine = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." { e.inner().to_string() } else { format!("{path}: {}", e.inner()) }
    })?;
    let time_ms = match (raw.time_ms, raw.time) {
        (Some(ms), _) => ms,
        (None, Some(text)) => parse_time(&text)?,
        (None, None) => return Err("missing field `time_ms` (or `time`)".to_owned()),
    };
    let body = parse_body(raw.body)?;
    let usage = match raw.usage {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            serde_path_to_error::deserialize(value).map_err(|e| format!("usage.{}: {}", e.path(), e.inner()))?,
        ),
    };
    Ok(LogEntry { line, time_ms, body, lane: raw.lane, usage })
}

/// Reads a request log from a reader. A malformed line is an error naming the line; a
/// truncated *last* line is a warning and the rest is used.
pub fn read_log(reader: impl BufRead, path: &str) -> Result<RequestLog, AnalyzeError> {
    let mut log = RequestLog::default();
    let mut lines = reader.lines().enumerate().peekable();
    let mut first_content: Option<String> = None;
    while let Some((i, line)) = lines.next() {
        let line = line.map_err(|source| AnalyzeError::Io { path: path.to_owned(), source })?;
        let number = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        if first_content.is_none() && line.trim_start().starts_with('[') {
            // A JSON array of bare bodies: read the whole rest as one document.
            let mut text = line.clone();
            for (_, rest) in lines.by_ref() {
                text.push('\n');
                text.push_str(&rest.map_err(|source| AnalyzeError::Io { path: path.to_owned(), source })?);
            }
            return read_array(&text, path);
        }
        first_content.get_or_insert_with(|| line.clone());
        let is_last = lines.peek().is_none();
        let value: Value = match serde_json::from_str(&line) {
            Ok(value) => value,
            Err(e) if is_last && e.is_eof() => {
                log.warnings.push(format!("{path}:{number}: the last line is truncated ({e}); measured the {} lines before it", log.entries.len()));
                break;
            }
            Err(e) => return Err(line_error(path, number, format!("malformed JSON: {e}"))),
        };
        let entry = parse_line(value, number).map_err(|m| line_error(path, number, m))?;
        log.entries.push(entry);
    }
    normalize_times(&mut log.entries);
    Ok(log)
}

fn read_array(text: &str, path: &str) -> Result<RequestLog, AnalyzeError> {
    let items: Vec<Value> = serde_json::from_str(text).map_err(|e| line_error(path, e.line(), format!("malformed JSON: {e}")))?;
    let mut log = RequestLog::default();
    for (i, item) in items.into_iter().enumerate() {
        let body = parse_body(item).map_err(|m| line_error(path, 1, format!("[{i}].{m}")))?;
        log.entries.push(LogEntry { line: 1, time_ms: i as u64 * 1000, body, lane: None, usage: None });
    }
    Ok(log)
}

fn normalize_times(entries: &mut [LogEntry]) {
    if let Some(first) = entries.first().map(|e| e.time_ms) {
        for entry in entries.iter_mut() {
            entry.time_ms = entry.time_ms.saturating_sub(first);
        }
    }
}

/// Reads a request log file.
pub fn read_log_file(path: &Path) -> Result<RequestLog, AnalyzeError> {
    let file = std::fs::File::open(path).map_err(|source| AnalyzeError::Io { path: path.display().to_string(), source })?;
    read_log(std::io::BufReader::new(file), &path.display().to_string())
}

struct LaneTrack {
    name: String,
    /// Prefix hash at the last block of each message of the lane's last request.
    boundaries: Vec<u128>,
    first_message: Option<u128>,
}

fn message_boundaries(flat: &FlatRequest) -> Vec<u128> {
    let mut out: Vec<u128> = Vec::new();
    let mut current: Option<usize> = None;
    for block in flat.blocks.iter().filter(|b| b.path.region == Region::Messages) {
        if current == Some(block.path.index) {
            *out.last_mut().expect("a message was opened") = block.prefix_hash;
        } else {
            current = Some(block.path.index);
            out.push(block.prefix_hash);
        }
    }
    out
}

/// Infers lanes for entries that do not name one.
#[derive(Default)]
struct LaneInference {
    lanes: Vec<LaneTrack>,
    side_count: usize,
}

impl LaneInference {
    fn assign(&mut self, flat: &FlatRequest) -> String {
        let boundaries = message_boundaries(flat);
        let first = boundaries.first().copied();
        let mut best: Option<(usize, usize)> = None;
        for (i, lane) in self.lanes.iter().enumerate() {
            let n = lane.boundaries.len();
            if n > 0 && n <= boundaries.len() && boundaries[n - 1] == lane.boundaries[n - 1] && best.is_none_or(|(_, len)| n > len) {
                best = Some((i, n));
            }
        }
        let index = match best {
            Some((i, _)) => i,
            None => {
                let main_rerender = self.lanes.first().is_some_and(|main| main.first_message.is_some() && main.first_message == first);
                if main_rerender || self.lanes.is_empty() {
                    if self.lanes.is_empty() {
                        self.lanes.push(LaneTrack { name: "main".to_owned(), boundaries: Vec::new(), first_message: first });
                    }
                    0
                } else {
                    self.side_count += 1;
                    self.lanes.push(LaneTrack { name: format!("side:{}", self.side_count), boundaries: Vec::new(), first_message: first });
                    self.lanes.len() - 1
                }
            }
        };
        let lane = &mut self.lanes[index];
        lane.boundaries = boundaries;
        lane.first_message = first;
        lane.name.clone()
    }
}

/// Measures every entry of a log in order.
pub fn analyze(log: &RequestLog, measurer: &mut Measurer, path: &str) -> Result<Vec<RequestMetrics>, AnalyzeError> {
    let mut inference = LaneInference::default();
    let mut rows = Vec::with_capacity(log.entries.len());
    for entry in &log.entries {
        let served = measurer
            .serve(&entry.body)
            .map_err(|source| AnalyzeError::Model { path: path.to_owned(), line: entry.line, source })?;
        let inferred = inference.assign(served.as_sent());
        let lane = entry.lane.clone().unwrap_or(inferred);
        let mut input = MeasureInput::new(&lane, entry.time_ms, &entry.body);
        input.output_tokens = entry.usage.as_ref().map_or(0, |u| u.output_tokens);
        input.recorded_usage = entry.usage.clone();
        let row = measurer
            .measure_served(input, served)
            .map_err(|source| AnalyzeError::Model { path: path.to_owned(), line: entry.line, source })?;
        rows.push(row);
    }
    rename_lanes(&mut rows, log);
    Ok(rows)
}

/// The inferred lane with the most requests is `main`; the others are `side:N` in order of
/// first appearance. Lanes the log named are left alone.
fn rename_lanes(rows: &mut [RequestMetrics], log: &RequestLog) {
    let mut order: Vec<(String, usize)> = Vec::new();
    for (row, entry) in rows.iter().zip(&log.entries) {
        if entry.lane.is_some() {
            continue;
        }
        match order.iter_mut().find(|(name, _)| *name == row.lane) {
            Some((_, count)) => *count += 1,
            None => order.push((row.lane.clone(), 1)),
        }
    }
    let Some(main) = order.iter().enumerate().max_by_key(|(i, (_, count))| (*count, std::cmp::Reverse(*i))).map(|(_, (name, _))| name.clone()) else {
        return;
    };
    let mut names: Vec<(String, String)> = Vec::new();
    let mut side = 0;
    for (name, _) in &order {
        let new = if *name == main {
            "main".to_owned()
        } else {
            side += 1;
            format!("side:{side}")
        };
        names.push((name.clone(), new));
    }
    for (row, entry) in rows.iter_mut().zip(&log.entries) {
        if entry.lane.is_none()
            && let Some((_, new)) = names.iter().find(|(old, _)| *old == row.lane)
        {
            row.lane = new.clone();
        }
    }
}
