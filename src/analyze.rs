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
//! first message, or whose system prompt (the billing block aside) is the main lane's, but does
//! not extend it is the main lane re-rendered or restarted (a compaction, a resume); a request
//! with tools and another system prompt or tool set opens a subagent lane `subagent:N`;
//! anything else opens a new lane `side:N`. No journal comes with a log: a divergence's cause
//! is read from the bodies ([`crate::measure::structure`]).

use std::io::BufRead;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::api::{Message, Request, Usage};
use crate::recording::format::{RawLines, LineWarning, WarningKind};
use crate::measure::blocks::{FlatRequest, parse_request};
use crate::measure::{EstimatorKind, MeasureInput, Measurer, RequestMetrics, UnknownModel};

/// One entry of a request log.
#[derive(Debug, Clone)]
pub struct LogEntry {
    pub line: usize,
    pub time_ms: u64,
    pub body: Request,
    pub lane: Option<String>,
    pub usage: Option<Usage>,
    /// A key per message of `body`: the xxh3-128 of the message's JSON text as read. Equal
    /// keys mean byte-equal JSON, hence identical messages, so the measurement compares a
    /// request with the previous one by key ([`crate::measure::incremental::Flattener::flatten_keyed`])
    /// instead of walking both. `None` when the entry was not read from JSON text.
    pub message_keys: Option<Vec<u128>>,
    /// A key of every field but `messages` (names and JSON texts, in order), alike: equal
    /// keys mean identical tools, system prompt and parameters.
    pub head_key: Option<u128>,
}

impl LogEntry {
    /// An entry built in memory (no message keys).
    pub fn new(line: usize, time_ms: u64, body: Request) -> LogEntry {
        LogEntry { line, time_ms, body, lane: None, usage: None, message_keys: None, head_key: None }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    #[error("failed to read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}:{line}: {message}")]
    Line { path: String, line: usize, message: String },
    #[error("{path}:{line}: {source}")]
    Model { path: String, line: usize, source: UnknownModel },
    /// No request at all: an empty file, or its only line cut.
    #[error("{path}: no request in it ({message})")]
    Empty { path: String, message: String },
}

/// A log, read: the entries and the warnings (a truncated last line).
#[derive(Debug, Default)]
pub struct RequestLog {
    pub entries: Vec<LogEntry>,
    pub warnings: Vec<LineWarning>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLine<'a> {
    #[serde(default)]
    time_ms: Option<u64>,
    #[serde(default)]
    time: Option<String>,
    #[serde(borrow)]
    body: &'a RawValue,
    #[serde(default)]
    lane: Option<String>,
    #[serde(default)]
    usage: Option<Value>,
}

/// A JSON object's fields as JSON text, in order (names without escapes only).
struct RawFields<'a>(Vec<(&'a str, &'a RawValue)>);

impl<'de> Deserialize<'de> for RawFields<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = RawFields<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<RawFields<'de>, A::Error> {
                let mut fields = Vec::new();
                while let Some(field) = map.next_entry::<&'de str, &'de RawValue>()? {
                    fields.push(field);
                }
                Ok(RawFields(fields))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

fn line_error(path: &str, line: usize, message: impl Into<String>) -> AnalyzeError {
    AnalyzeError::Line { path: path.to_owned(), line, message: crate::input::cap_message(&message.into()) }
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

/// A JSON error's message without serde_json's position suffix (positions inside a body or a
/// line are not the file's; the line is named by the caller).
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&suffix).map_or(text.clone(), str::to_owned)
}

/// Deserializes `text` as a `T`, the error naming the JSON path under `at` (`body`,
/// `body.messages[3]`).
fn parse_at<'a, T: Deserialize<'a>>(text: &'a str, at: &str) -> Result<T, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = crate::input::json_path(e.path());
        let message = without_position(e.inner());
        if path == "." { format!("{at}: {message}") } else { format!("{at}.{}: {message}", path.trim_start_matches('.')) }
    })
}

/// A body's head key and message keys ([`LogEntry::head_key`], [`LogEntry::message_keys`]).
type BodyKeys = (u128, Vec<u128>);

/// The messages read so far by the xxh3 of their JSON text: a message a log repeats (each
/// request repeats the whole history) is parsed once and cloned after that.
#[derive(Default)]
struct Interner {
    messages: rustc_hash::FxHashMap<u128, Message>,
}

/// Reads a body from its JSON text, with its keys ([`LogEntry::head_key`],
/// [`LogEntry::message_keys`]). The fields other than `messages` are parsed as one object;
/// each message is looked up by key and parsed only the first time it is seen.
fn parse_body_text(raw: &RawValue, interner: &mut Interner) -> Result<(Request, Option<BodyKeys>), String> {
    let text = raw.get();
    if !text.trim_start().starts_with('{') {
        return Err("body: not a Messages API request (expected an object)".to_owned());
    }
    // Field names with escapes cannot be borrowed: such a body is parsed whole, without keys.
    let Ok(RawFields(fields)) = serde_json::from_str(text) else { return Ok((parse_at(text, "body")?, None)) };
    let mut listed = fields.iter().filter(|(name, _)| *name == "messages").map(|(_, raw)| serde_json::from_str::<Vec<&RawValue>>(raw.get()));
    let (Some(Ok(messages)), None) = (listed.next(), listed.next()) else { return Ok((parse_at(text, "body")?, None)) };

    let mut head = xxhash_rust::xxh3::Xxh3::new();
    let mut rest = String::with_capacity(text.len().min(1 << 16));
    rest.push('{');
    for (name, raw) in fields.iter().filter(|(name, _)| *name != "messages") {
        head.update(name.as_bytes());
        head.update(&[0]);
        head.update(raw.get().as_bytes());
        head.update(&[0xff]);
        rest.push('"');
        rest.push_str(name);
        rest.push_str("\":");
        rest.push_str(raw.get());
        rest.push(',');
    }
    rest.push_str("\"messages\":[]}");
    let mut body: Request = parse_at(&rest, "body")?;
    let mut keys = Vec::with_capacity(messages.len());
    body.messages.reserve_exact(messages.len());
    for (i, raw) in messages.iter().enumerate() {
        let key = xxhash_rust::xxh3::xxh3_128(raw.get().as_bytes());
        let message = match interner.messages.get(&key) {
            Some(message) => message.clone(),
            None => {
                let message: Message = parse_at(raw.get(), &format!("body.messages[{i}]"))?;
                interner.messages.insert(key, message.clone());
                message
            }
        };
        body.messages.push(message);
        keys.push(key);
    }
    Ok((body, Some((head.digest128(), keys))))
}

/// Parses one log line's fields into an entry.
fn parse_line(raw: RawLine<'_>, line: usize, interner: &mut Interner) -> Result<LogEntry, String> {
    let time_ms = match (raw.time_ms, raw.time) {
        (Some(ms), _) => ms,
        (None, Some(text)) => parse_time(&text)?,
        (None, None) => return Err("missing field `time_ms` (or `time`)".to_owned()),
    };
    let (body, keys) = parse_body_text(raw.body, interner)?;
    let (head_key, message_keys) = match keys {
        Some((head, messages)) => (Some(head), Some(messages)),
        None => (None, None),
    };
    let usage = match raw.usage {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            serde_path_to_error::deserialize(value).map_err(|e| format!("usage.{}: {}", crate::input::json_path(e.path()), crate::input::cap_message(&e.inner().to_string())))?,
        ),
    };
    Ok(LogEntry { line, time_ms, body, lane: raw.lane, usage, message_keys, head_key })
}

/// Reads a request log entry by entry, so that a log is measured without holding all of it
/// ([`analyze_stream`]; [`read_log`] collects it). A malformed line is an error naming the
/// line; a truncated *last* line is a warning ([`LogReader::warnings`]) and the rest is used.
/// A log without any request (empty, blank, or only a cut line) is an error
/// ([`AnalyzeError::Empty`]). Times are made relative to the first entry's.
pub struct LogReader<R: BufRead> {
    lines: std::iter::Peekable<RawLines<R>>,
    path: String,
    interner: Interner,
    seen_content: bool,
    /// The entries of a JSON-array log, read whole, handed out in order.
    pending: std::collections::VecDeque<LogEntry>,
    first_time: Option<u64>,
    /// The time of the previous entry (relative to the first), which no later entry goes before.
    last_time: u64,
    /// Entries handed out so far.
    read: usize,
    warnings: Vec<LineWarning>,
    done: bool,
    /// Lines read so far (blank ones included), for the message of an empty log.
    lines_read: usize,
}

impl<R: BufRead> LogReader<R> {
    pub fn new(reader: R, path: &str) -> LogReader<R> {
        LogReader {
            lines: RawLines::new(reader).peekable(),
            path: path.to_owned(),
            interner: Interner::default(),
            seen_content: false,
            pending: Default::default(),
            first_time: None,
            last_time: 0,
            read: 0,
            warnings: Vec::new(),
            done: false,
            lines_read: 0,
        }
    }

    /// What was read with a warning so far (a truncated last line).
    pub fn warnings(&self) -> &[LineWarning] {
        &self.warnings
    }

    /// The next entry, or `None` at the end of the log.
    pub fn next_entry(&mut self) -> Result<Option<LogEntry>, AnalyzeError> {
        let Some(mut entry) = self.next_raw()? else {
            if self.read == 0 {
                let message = match self.warnings.first() {
                    Some(first) => format!("{} lines; {first}", self.lines_read),
                    None if self.lines_read > 0 => format!("the file is empty: {} blank lines", self.lines_read),
                    None => "the file is empty".to_owned(),
                };
                return Err(AnalyzeError::Empty { path: self.path.clone(), message });
            }
            return Ok(None);
        };
        let first = *self.first_time.get_or_insert(entry.time_ms);
        let time = entry.time_ms.saturating_sub(first);
        if time < self.last_time || entry.time_ms < first {
            // Time going backwards is not a log a client wrote in order: said, with the line.
            self.warnings.push(LineWarning {
                kind: crate::recording::WarningKind::Suspect,
                file: self.path.clone(),
                line: entry.line,
                path: Some("time_ms".into()),
                message: format!(
                    "{} goes back before the previous entry's time ({} ms earlier); the entry is kept at its own time",
                    entry.time_ms,
                    (self.last_time + first).saturating_sub(entry.time_ms)
                ),
            });
        }
        entry.time_ms = time;
        self.last_time = self.last_time.max(time);
        self.read += 1;
        Ok(Some(entry))
    }

    fn next_raw(&mut self) -> Result<Option<LogEntry>, AnalyzeError> {
        if let Some(entry) = self.pending.pop_front() {
            return Ok(Some(entry));
        }
        let path = self.path.as_str();
        while !self.done
            && let Some(line) = self.lines.next()
        {
            let line = line.map_err(|source| AnalyzeError::Io { path: path.to_owned(), source })?;
            let number = line.number;
            self.lines_read = number;
            if line.is_blank() {
                continue;
            }
            let line = utf8_line(line.bytes, path, number)?;
            if !self.seen_content && line.trim_start().starts_with('[') {
                // A JSON array of bare bodies: read the whole rest as one document.
                let first_line = number;
                let mut text = line;
                for rest in self.lines.by_ref() {
                    let rest = rest.map_err(|source| AnalyzeError::Io { path: path.to_owned(), source })?;
                    self.lines_read = rest.number;
                    text.push('\n');
                    text.push_str(&utf8_line(rest.bytes, path, rest.number)?);
                }
                self.done = true;
                self.pending = read_array(&text, path, first_line)?.into();
                return Ok(self.pending.pop_front());
            }
            self.seen_content = true;
            let is_last = self.lines.peek().is_none();
            let mut de = serde_json::Deserializer::from_str(&line);
            let parsed = match serde_path_to_error::deserialize::<_, RawLine>(&mut de) {
                Ok(raw) => de.end().map(|()| raw).map_err(|e| (".".to_owned(), e)),
                Err(e) => Err((crate::input::json_path(e.path()), e.into_inner())),
            };
            let raw = match parsed {
                Ok(raw) => raw,
                Err((_, e)) if is_last && e.is_eof() => {
                    self.warnings.push(LineWarning {
                        kind: WarningKind::TruncatedTail,
                        file: path.to_owned(),
                        line: number,
                        path: None,
                        message: format!("cut before its end ({e}); measured the {} requests before it", self.read),
                    });
                    self.done = true;
                    return Ok(None);
                }
                Err((field, e)) if e.is_data() => {
                    let message = crate::input::cap_message(&without_position(&e));
                    return Err(line_error(path, number, if field == "." { message } else { format!("{field}: {message}") }));
                }
                Err((_, e)) => return Err(line_error(path, number, format!("malformed JSON: {}", crate::input::cap_message(&e.to_string())))),
            };
            let entry = parse_line(raw, number, &mut self.interner).map_err(|m| line_error(path, number, m))?;
            return Ok(Some(entry));
        }
        self.done = true;
        Ok(None)
    }
}

/// Reads a whole request log from a reader ([`LogReader`], collected).
pub fn read_log(reader: impl BufRead, path: &str) -> Result<RequestLog, AnalyzeError> {
    let mut reader = LogReader::new(reader, path);
    let mut log = RequestLog::default();
    while let Some(entry) = reader.next_entry()? {
        log.entries.push(entry);
    }
    log.warnings = reader.warnings;
    Ok(log)
}

/// A line as text; invalid UTF-8 is an error naming the line and byte column.
fn utf8_line(bytes: Vec<u8>, path: &str, number: usize) -> Result<String, AnalyzeError> {
    String::from_utf8(bytes).map_err(|e| {
        let column = e.utf8_error().valid_up_to() + 1;
        line_error(path, number, format!("invalid UTF-8 at byte column {column}"))
    })
}

/// A JSON-array log (`text` begins at line `first_line` of the file): one entry per element,
/// each with the line its element starts on, which every message about it names.
fn read_array(text: &str, path: &str, first_line: usize) -> Result<Vec<LogEntry>, AnalyzeError> {
    let file_line = |line: usize| first_line + line.saturating_sub(1);
    let items: Vec<&serde_json::value::RawValue> = serde_json::from_str(text)
        .map_err(|e| line_error(path, file_line(e.line()), format!("malformed JSON at column {}: {}", e.column(), crate::input::cap_message(&without_position(&e)))))?;
    let mut entries = Vec::with_capacity(items.len());
    // Line of each element: the newlines before where it starts (elements come in order).
    let (mut line, mut counted) = (first_line, 0);
    for (i, item) in items.into_iter().enumerate() {
        let start = (item.get().as_ptr() as usize).saturating_sub(text.as_ptr() as usize).min(text.len());
        line += text.as_bytes()[counted..start.max(counted)].iter().filter(|&&b| b == b'\n').count();
        counted = start.max(counted);
        let value: Value = serde_json::from_str(item.get()).map_err(|e| line_error(path, line, format!("[{i}]: {}", crate::input::cap_message(&without_position(&e)))))?;
        let body = parse_body(value).map_err(|m| line_error(path, line, format!("[{i}].{m}")))?;
        entries.push(LogEntry::new(line, i as u64 * 1000, body));
    }
    Ok(entries)
}

/// Reads a request log file.
pub fn read_log_file(path: &Path) -> Result<RequestLog, AnalyzeError> {
    let file = std::fs::File::open(path).map_err(|source| AnalyzeError::Io { path: path.display().to_string(), source })?;
    read_log(std::io::BufReader::new(file), &path.display().to_string())
}

/// Opens a request log file to read entry by entry ([`analyze_stream`]).
pub fn open_log_file(path: &Path) -> Result<LogReader<std::io::BufReader<std::fs::File>>, AnalyzeError> {
    let file = std::fs::File::open(path).map_err(|source| AnalyzeError::Io { path: path.display().to_string(), source })?;
    Ok(LogReader::new(std::io::BufReader::with_capacity(1 << 20, file), &path.display().to_string()))
}

struct LaneTrack {
    name: String,
    /// Messages of the lane's last request, and the prefix hash where the last one ends.
    messages: usize,
    last_boundary: Option<u128>,
    first_message: Option<u128>,
    /// The system prompt and tool set of its last request ([`crate::measure::structure::signature`]).
    signature: (u128, u128),
}

/// Infers lanes for entries that do not name one.
#[derive(Default)]
struct LaneInference {
    lanes: Vec<LaneTrack>,
    side_count: usize,
    subagent_count: usize,
}

impl LaneInference {
    /// The lane of a request with `messages` messages, flattened as `flat`. A lane continues
    /// when the request's prefix through the lane's last message count equals the lane's
    /// (compared by the chained prefix hash where that message ends).
    fn assign(&mut self, request: &Request, flat: &FlatRequest, messages: usize) -> String {
        // The first message's own key: the same conversation under a changed head matches.
        let first = if messages > 0 { crate::measure::structure::first_message_key(flat) } else { None };
        let signature = crate::measure::structure::signature(request, flat);
        let mut best: Option<(usize, usize)> = None;
        for (i, lane) in self.lanes.iter().enumerate() {
            let n = lane.messages;
            if n > 0 && n <= messages && flat.message_boundary(n - 1) == lane.last_boundary && best.is_none_or(|(_, len)| n > len) {
                best = Some((i, n));
            }
        }
        let index = match best {
            Some((i, _)) => i,
            None => {
                let main_rerender = self.lanes.first().is_some_and(|main| {
                    (main.first_message.is_some() && main.first_message == first) || (!request.tools().is_empty() && main.signature.0 == signature.0)
                });
                if main_rerender || self.lanes.is_empty() {
                    if self.lanes.is_empty() {
                        self.lanes.push(LaneTrack { name: "main".to_owned(), messages: 0, last_boundary: None, first_message: first, signature });
                    }
                    0
                } else {
                    let name = if request.tools().is_empty() {
                        self.side_count += 1;
                        format!("side:{}", self.side_count)
                    } else {
                        self.subagent_count += 1;
                        format!("subagent:{}", self.subagent_count)
                    };
                    self.lanes.push(LaneTrack { name, messages: 0, last_boundary: None, first_message: first, signature });
                    self.lanes.len() - 1
                }
            }
        };
        let lane = &mut self.lanes[index];
        lane.messages = messages;
        lane.last_boundary = if messages > 0 { flat.message_boundary(messages - 1) } else { None };
        lane.first_message = first;
        lane.signature = signature;
        lane.name.clone()
    }
}

/// Tokenizes the new parts of keyed entries (a head or message whose key was not seen before)
/// ahead of their measurement ([`Measurer::count_ahead`]), batch after batch: what was seen
/// in earlier batches is remembered. With `chars4` counting costs no more than the lookup, so
/// nothing is done.
#[derive(Default)]
pub struct CountAhead {
    // Membership only (never iterated); keys are hashes already, so the fast hasher suffices.
    heads: rustc_hash::FxHashSet<u128>,
    messages: rustc_hash::FxHashSet<u128>,
    /// The message keys of the last keyed entry.
    previous: Vec<u128>,
}

impl CountAhead {
    pub fn run(&mut self, entries: &[LogEntry], measurer: &mut Measurer) {
        if measurer.counter().kind() == EstimatorKind::Chars4 {
            return;
        }
        let mut previous: &[u128] = &self.previous;
        let mut last = None;
        for entry in entries {
            let (Some(head), Some(keys)) = (entry.head_key, &entry.message_keys) else { continue };
            // What the previous entry repeats was seen: only the rest is looked up.
            let repeated = crate::measure::incremental::common_keys(keys, previous);
            previous = keys;
            last = Some(keys);
            let new_messages: Vec<usize> =
                keys.iter().enumerate().skip(repeated).filter(|(_, key)| self.messages.insert(**key)).map(|(m, _)| m).collect();
            // An unknown model is the measurement's error to report, with its line.
            let _ = measurer.count_ahead(&entry.body, self.heads.insert(head), new_messages, Some(keys));
        }
        if let Some(keys) = last {
            self.previous = keys.clone();
        }
    }
}

/// Tokenizes the new parts of every keyed entry of a log ahead of the measurement
/// ([`CountAhead`] over the whole log).
pub fn count_ahead(log: &RequestLog, measurer: &mut Measurer) {
    CountAhead::default().run(&log.entries, measurer);
}

/// The measurement of a log's entries in order: lanes inferred as it goes, renamed at the end.
struct Measuring<'a> {
    path: &'a str,
    inference: LaneInference,
    rows: Vec<RequestMetrics>,
    /// Per row, whether the log named its lane.
    named: Vec<bool>,
}

impl<'a> Measuring<'a> {
    fn new(path: &'a str) -> Self {
        Measuring { path, inference: LaneInference::default(), rows: Vec::new(), named: Vec::new() }
    }

    fn measure(&mut self, entry: &LogEntry, measurer: &mut Measurer) -> Result<(), AnalyzeError> {
        let path = self.path;
        let served = measurer
            .serve_with_keys(&entry.body, entry.head_key, entry.message_keys.as_deref())
            .map_err(|source| AnalyzeError::Model { path: path.to_owned(), line: entry.line, source })?;
        let inferred = self.inference.assign(&entry.body, served.as_sent(), entry.body.messages.len());
        let lane = entry.lane.clone().unwrap_or(inferred);
        let mut input = MeasureInput::new(&lane, entry.time_ms, &entry.body);
        input.output_tokens = entry.usage.as_ref().map_or(0, |u| u.output_tokens);
        input.recorded_usage = entry.usage.clone();
        let row = measurer
            .measure_served(input, served)
            .map_err(|source| AnalyzeError::Model { path: path.to_owned(), line: entry.line, source })?;
        self.rows.push(row);
        self.named.push(entry.lane.is_some());
        Ok(())
    }

    fn finish(mut self) -> Vec<RequestMetrics> {
        rename_lanes(&mut self.rows, &self.named);
        self.rows
    }
}

/// Measures every entry of a log in order.
pub fn analyze(log: &RequestLog, measurer: &mut Measurer, path: &str) -> Result<Vec<RequestMetrics>, AnalyzeError> {
    measurer.set_structural_causes(true);
    count_ahead(log, measurer);
    let mut measuring = Measuring::new(path);
    for entry in &log.entries {
        measuring.measure(entry, measurer)?;
    }
    Ok(measuring.finish())
}

/// Entries read, tokenized ahead and measured together by [`analyze_stream`].
const STREAM_BATCH: usize = 64;

/// Measures a log as it is read, holding [`STREAM_BATCH`] entries at a time: the rows equal
/// [`analyze`]'s of the whole log read first ([`read_log`]), while memory stays that of a
/// batch plus each distinct message once. The reader's warnings are left in it.
pub fn analyze_stream<R: BufRead>(reader: &mut LogReader<R>, measurer: &mut Measurer, path: &str) -> Result<Vec<RequestMetrics>, AnalyzeError> {
    measurer.set_structural_causes(true);
    let mut ahead = CountAhead::default();
    let mut measuring = Measuring::new(path);
    let mut batch = Vec::with_capacity(STREAM_BATCH);
    loop {
        batch.clear();
        while batch.len() < STREAM_BATCH
            && let Some(entry) = reader.next_entry()?
        {
            batch.push(entry);
        }
        if batch.is_empty() {
            return Ok(measuring.finish());
        }
        ahead.run(&batch, measurer);
        for entry in &batch {
            measuring.measure(entry, measurer)?;
        }
    }
}

/// The inferred lane with the most requests is `main`; the others are `side:N` in order of
/// first appearance. Lanes the log named, and subagent lanes, are left alone.
fn rename_lanes(rows: &mut [RequestMetrics], named: &[bool]) {
    let mut order: Vec<(String, usize)> = Vec::new();
    for (row, named) in rows.iter().zip(named) {
        if *named || row.lane.starts_with("subagent:") {
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
    for (row, named) in rows.iter_mut().zip(named) {
        if !*named
            && !row.lane.starts_with("subagent:")
            && let Some((_, new)) = names.iter().find(|(old, _)| *old == row.lane)
        {
            row.lane = new.clone();
        }
    }
}
