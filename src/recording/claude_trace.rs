//! Converter of claude-trace captures into the `analyze` request-log format.
//!
//! claude-trace (an HTTP interceptor for Claude Code) writes one line per exchange:
//! `{"request": {timestamp, method, url, headers, body}, "response": {timestamp, status_code,
//! headers, body?, body_raw?}}` with timestamps in float seconds since the epoch. `body` of the
//! response is the JSON of a non-streaming reply; `body_raw` is the SSE text of a streamed one.
//!
//! Each `POST /v1/messages` becomes `{"time_ms", "body", "usage"?}` (CONTRACT.md, "Request
//! log"). The request body is copied verbatim, so measurement sees the bytes the client sent.
//! Usage comes from the JSON reply, or from the stream: `message_start.message.usage` gives the
//! input side, and each `message_delta.usage` overrides the fields it carries (the final output
//! count, and on newer APIs the input-side fields too). Other endpoints (count_tokens, OAuth,
//! telemetry) are counted and skipped. Lanes are not guessed here: `analyze` infers them.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::format::{parse_line, LineWarning, RawLines, WarningKind, Warnings};
use super::report::{ImportError, ImportReport};
use crate::api::{Request, Usage};

/// One line of an `analyze` request log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestLogEntry {
    pub time_ms: u64,
    pub body: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A converted capture with the report of what was kept and skipped.
#[derive(Debug, Clone)]
pub struct ConvertedLog {
    pub entries: Vec<RequestLogEntry>,
    pub report: ImportReport,
}

/// Converts a claude-trace capture read from `reader`; `file` names it in messages.
pub fn convert_claude_trace<R: BufRead>(reader: R, file: &str) -> Result<ConvertedLog, ImportError> {
    let mut report = ImportReport::new(file, "claude-trace");
    let mut warnings = Warnings::default();
    let mut timed: Vec<(Option<i64>, RequestLogEntry)> = Vec::new();
    for line in RawLines::new(reader) {
        let line = line.map_err(|source| ImportError::Read { file: file.to_owned(), source })?;
        report.lines = line.number;
        if line.is_blank() {
            continue;
        }
        let mut warn = |kind, path: Option<&str>, message: String| {
            warnings.push(LineWarning {
                kind,
                file: file.to_owned(),
                line: line.number,
                path: path.map(str::to_owned),
                message,
            });
        };
        let record = match parse_line::<Value>(&line.bytes) {
            Ok(Value::Object(record)) => record,
            Ok(_) => {
                warn(WarningKind::BadLine, None, "expected a JSON object".into());
                continue;
            }
            Err((path, message)) => {
                warn(line.failure_kind(), path.as_deref(), message);
                continue;
            }
        };
        *report.records_by_type.entry("exchange".into()).or_default() += 1;
        let Some(Value::Object(request)) = record.get("request") else {
            warn(WarningKind::BadLine, Some("request"), "missing `request` object".into());
            continue;
        };
        let method = request.get("method").and_then(Value::as_str).unwrap_or("");
        let url = request.get("url").and_then(Value::as_str).unwrap_or("");
        if !method.eq_ignore_ascii_case("POST") || !is_messages_endpoint(url) {
            report.skipped_requests += 1;
            continue;
        }
        let Some(body) = request.get("body").filter(|b| b.is_object()) else {
            warn(WarningKind::BadLine, Some("request.body"), "missing request body object".into());
            continue;
        };
        // Check the body is a Messages request now, so `analyze` never meets a bad one later.
        if let Err(e) = serde_path_to_error::deserialize::<_, Request>(body.clone()) {
            let path = format!("request.body.{}", crate::input::json_path(e.path()));
            warn(WarningKind::BadLine, Some(&path), format!("not a Messages API request: {}", e.into_inner()));
            continue;
        }
        let epoch_ms = request.get("timestamp").and_then(timestamp_ms);
        if epoch_ms.is_none() {
            warn(WarningKind::BadLine, Some("request.timestamp"), "missing or bad timestamp; using the previous request's time".into());
        }
        let usage = record.get("response").and_then(|r| response_usage(r, &mut warn));
        timed.push((epoch_ms, RequestLogEntry { time_ms: 0, body: body.clone(), lane: None, usage }));
    }
    // claude-trace writes an exchange when its response ends, so parallel requests appear out
    // of start order. Time zero is the earliest request start, and entries are put in start
    // order (stable, so equal times keep the capture's order): that is the order the provider's
    // cache saw them in.
    let origin = timed.iter().filter_map(|(ms, _)| *ms).min().unwrap_or(0);
    let mut previous = 0;
    for (ms, entry) in &mut timed {
        entry.time_ms = match ms {
            Some(ms) => u64::try_from(ms.saturating_sub(origin)).unwrap_or(0),
            None => previous,
        };
        previous = entry.time_ms;
    }
    let mut entries: Vec<RequestLogEntry> = timed.into_iter().map(|(_, e)| e).collect();
    entries.sort_by_key(|e| e.time_ms);
    report.events = entries.len();
    report.calls = entries.len();
    for entry in &entries {
        if let Some(usage) = &entry.usage {
            report.totals_all.add(usage, false);
        }
    }
    report.totals_main_file = report.totals_all;
    report.warnings = warnings;
    if entries.is_empty() {
        // An empty or garbage capture must not read as "0 requests".
        return Err(report.nothing_read("`POST /v1/messages` exchange"));
    }
    Ok(ConvertedLog { entries, report })
}

/// Writes request-log entries as JSONL.
pub fn write_request_log_to<W: Write>(entries: &[RequestLogEntry], mut writer: W) -> std::io::Result<()> {
    for entry in entries {
        serde_json::to_writer(&mut writer, entry)?;
        writer.write_all(b"\n")?;
    }
    writer.flush()
}

/// True for `…/v1/messages` with or without a query string (not `/v1/messages/count_tokens`).
fn is_messages_endpoint(url: &str) -> bool {
    let path = url.split(['?', '#']).next().unwrap_or("");
    path.trim_end_matches('/').ends_with("/v1/messages")
}

/// Float seconds (claude-trace) or an RFC 3339 string → epoch milliseconds.
fn timestamp_ms(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => {
            let secs = n.as_f64()?;
            if !secs.is_finite() {
                return None;
            }
            // Rounded to the millisecond; the capture's microseconds do not matter to a cache
            // whose TTL is minutes, and rounding keeps the conversion deterministic.
            let ms = (secs * 1000.0).round();
            if ms.abs() > 9.0e15 { None } else { Some(ms as i64) }
        }
        Value::String(text) => text.parse::<jiff::Timestamp>().ok().map(|t| t.as_millisecond()),
        _ => None,
    }
}

fn response_usage(response: &Value, warn: &mut impl FnMut(WarningKind, Option<&str>, String)) -> Option<Usage> {
    if let Some(usage) = response.get("body").and_then(|b| b.get("usage")) {
        return match serde_path_to_error::deserialize::<_, Usage>(usage.clone()) {
            Ok(usage) => Some(usage),
            Err(e) => {
                let path = format!("response.body.usage.{}", crate::input::json_path(e.path()));
                warn(WarningKind::BadLine, Some(&path), format!("{}; usage left out", e.into_inner()));
                None
            }
        };
    }
    let raw = response.get("body_raw").and_then(Value::as_str)?;
    usage_from_sse(raw)
}

/// Usage of a streamed reply: `message_start` then every `message_delta` laid over it.
pub fn usage_from_sse(raw: &str) -> Option<Usage> {
    let mut merged: Option<Map<String, Value>> = None;
    for line in raw.lines() {
        let Some(data) = line.strip_prefix("data:") else { continue };
        let Ok(event) = serde_json::from_str::<Value>(data.trim()) else { continue };
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                if let Some(Value::Object(usage)) = event.get("message").and_then(|m| m.get("usage")) {
                    merged = Some(usage.clone());
                }
            }
            Some("message_delta") => {
                if let Some(Value::Object(delta)) = event.get("usage") {
                    let base = merged.get_or_insert_with(Map::new);
                    for (k, v) in delta {
                        // A null in a delta means "not reported here", not zero.
                        if !v.is_null() {
                            base.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    merged.and_then(|m| serde_json::from_value(Value::Object(m)).ok())
}
