//! Recording format v1: a JSONL file whose first line is a [`Header`] and whose other lines are
//! [`Event`]s, in the order they happened. The format is documented for users in
//! `docs/recording-format.md`; this file is its single source of truth in code.
//!
//! Reading is forgiving on purpose: a recording is often the only copy of a real session, so a
//! bad line (a hand edit, a crash mid-write) is reported with its file, line number and JSON path
//! and skipped, and everything else is still used. Only a missing or unreadable header is fatal,
//! because without it we cannot tell that the file is a recording at all.
//!
//! Writing is atomic: the file is written to a temporary file in the destination directory and
//! renamed over the destination, so a crash never leaves half a recording behind.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::api::{ContentBlock, MessageContent, SharedBlocks, SharedValue, StopReason, ToolResultContent, Usage};

/// The version this code writes and reads.
pub const RECORDING_VERSION: u32 = 1;

/// The lane of the main conversation thread.
pub const LANE_MAIN: &str = "main";
/// The lane of a compaction (summary) request.
pub const LANE_COMPACT: &str = "compact";

/// At most this many warnings are kept per file; later ones are only counted, so a file of pure
/// garbage cannot use unbounded memory for its report.
pub const MAX_WARNINGS: usize = 200;

/// First line of a recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Format version; always [`RECORDING_VERSION`] for files this code writes.
    pub ctxsim_recording: u32,
    /// Where the events came from: `claude-code`, `scenario`, `live`, ...
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Absolute time of `time_ms == 0`, in milliseconds since the Unix epoch (from the first
    /// timestamped record of the source). Kept so virtual time can be mapped back to real time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_epoch_ms: Option<i64>,
    /// The file the recording was imported from, as given to the importer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Claude Code versions seen, in order of first appearance.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<String>,
    /// The client's `entrypoint` as the source names it (`cli`, `claude-desktop`, `sdk-cli`, ...;
    /// the first record naming one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<String>,
    /// Subagent transcripts merged into this recording, one per non-main lane.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subagents: Vec<SubagentInfo>,
    /// Session metadata records of the source (titles, PR links, last prompt, ...), last value
    /// wins, keyed by record type.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// The source starts mid-session: its first record's parent is not in it (a segment of a
    /// longer session, as Entire checkpoints store them), or it opens with a compaction whose
    /// history is not in it. Its first call then carries history older than the recording.
    #[serde(default, skip_serializing_if = "is_false")]
    pub head_truncated: bool,
    /// Fields written by newer versions are kept, not dropped.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Header {
    pub fn new(source: impl Into<String>) -> Self {
        Header {
            ctxsim_recording: RECORDING_VERSION,
            source: source.into(),
            session_id: None,
            start_epoch_ms: None,
            input: None,
            cwd: None,
            versions: Vec::new(),
            entrypoint: None,
            subagents: Vec::new(),
            metadata: Map::new(),
            head_truncated: false,
            extra: Map::new(),
        }
    }
}

/// One subagent transcript folded into a recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentInfo {
    pub agent_id: String,
    pub lane: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The main thread's Task/Agent tool_use that started it, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
}

/// One line after the header: what happened, when (virtual ms since the start), on which lane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    #[serde(flatten)]
    pub kind: EventKind,
    #[serde(default)]
    pub time_ms: u64,
    /// `main`, `compact`, `subagent:<id>`, `side`.
    #[serde(default = "lane_main", skip_serializing_if = "is_lane_main")]
    pub lane: String,
    /// Id of the source record (a transcript `uuid`), for tracing an event back to its line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

fn lane_main() -> String {
    LANE_MAIN.to_owned()
}

fn is_lane_main(lane: &str) -> bool {
    lane == LANE_MAIN
}

impl Event {
    pub fn new(kind: EventKind, time_ms: u64) -> Self {
        Event { kind, time_ms, lane: lane_main(), uuid: None }
    }

    /// The `event` tag, as written.
    pub fn name(&self) -> &'static str {
        self.kind.name()
    }
}

/// What an event is. The vocabulary is the one scenario scripts use, so a recording can drive
/// the same World a scenario does. Every variant's fields are a struct of its own so a bad line
/// can be diagnosed down to the field (see [`diagnose_event`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// Something the user (or the harness on the user's behalf, when `is_meta`) sent.
    UserPrompt(UserPrompt),
    /// One model response (one API call), however many transcript lines it was written as.
    ModelReply(ModelReply),
    /// The result of one tool call, as it was sent back to the model.
    ToolResult(ToolResult),
    /// Harness-injected context (file changes, reminders, listings, ...), kept as recorded.
    Attachment(Attachment),
    /// The conversation was compacted: the model's view restarts after this event.
    Compaction(Compaction),
    /// A client-side event with no direct effect on the request (hook summaries, turn
    /// durations, microcompact boundaries, queue operations, API errors, ...).
    SystemEvent(SystemEvent),
    /// Virtual time moves forward by `advance_ms`; `time_ms` of the event is the time after.
    Time(TimeAdvance),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserPrompt {
    pub content: MessageContent,
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_meta: bool,
    /// The summary message that opens the conversation after a compaction.
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_compact_summary: bool,
    /// The permission mode the record of the prompt names (`default`, `acceptEdits`, `plan`,
    /// `bypassPermissions`, `auto`), when it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub tool_use_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<ToolResultContent>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_error: bool,
    /// The client's structured view of the result (`toolUseResult` in Claude Code). Shared:
    /// a copy of the event does not copy it, and this is often the largest part (a read file's
    /// whole content, again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_result: Option<SharedValue>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attachment {
    pub attachment_type: String,
    #[serde(default)]
    pub payload: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compaction {
    /// `auto` or `manual`.
    pub trigger: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_tokens: Option<u64>,
    /// The summary text that replaced the history, when it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Everything else the source recorded about the compaction, verbatim.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub metadata: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemEvent {
    pub subtype: String,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub payload: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimeAdvance {
    pub advance_ms: u64,
}

impl EventKind {
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::UserPrompt(_) => "user_prompt",
            EventKind::ModelReply(_) => "model_reply",
            EventKind::ToolResult(_) => "tool_result",
            EventKind::Attachment(_) => "attachment",
            EventKind::Compaction(_) => "compaction",
            EventKind::SystemEvent(_) => "system_event",
            EventKind::Time(_) => "time",
        }
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn is_true(value: &bool) -> bool {
    *value
}

fn default_true() -> bool {
    true
}

/// One model response with the usage the API reported for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelReply {
    /// Shared: a message built from the reply holds the same blocks (copy on write).
    pub content: SharedBlocks,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
    #[serde(default)]
    pub model: String,
    /// Version of the client that made the call (Claude Code's `version`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Usage of the call, counted once even when the source wrote it on several lines.
    #[serde(default)]
    pub usage: Usage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// The transcript's `requestRef`: the id of the `api-request` record of this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_ref: Option<String>,
    /// False when a thinking block was recorded without its text (empty `thinking` with a
    /// signature): the block's size in the next request cannot be known from the recording.
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub thinking_text_stored: bool,
    /// The client wrote this reply itself (model `<synthetic>`); no API call was made.
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_synthetic: bool,
    /// The reply stands for a failed API call (Claude Code's `isApiErrorMessage`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub is_api_error: bool,
}

impl ModelReply {
    /// Ids of the tool calls in this reply, in order.
    pub fn tool_use_ids(&self) -> impl Iterator<Item = &str> {
        self.content.iter().filter_map(|b| match b {
            ContentBlock::ToolUse { id, .. } => Some(id.as_str()),
            _ => None,
        })
    }
}

/// A whole recording in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Recording {
    pub header: Header,
    pub events: Events,
}

/// The events of a recording, each held by reference count (a clone of a recording shares
/// them). Changing an event copies it first when another recording holds it.
pub type Events = crate::shared::SharedList<Event>;

/// Why a line was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WarningKind {
    /// The line is not valid JSON or not a valid event; it was skipped.
    BadLine,
    /// The last line has no newline and does not parse: the file was cut while being written.
    TruncatedTail,
    /// The line is valid but of a kind the reader does not use; it was counted and skipped.
    Ignored,
    /// The line was used, but a field holds a value a well-formed input would not (time going
    /// backwards).
    Suspect,
}

/// A problem with one line, named by file, line number (1-based) and JSON path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LineWarning {
    pub kind: WarningKind,
    pub file: String,
    pub line: usize,
    /// JSON path of the offending field (`content[2].text`), when known. Written as `field`
    /// (the name every reader's warnings use); `path` is still read.
    #[serde(default, rename = "field", alias = "path", skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub message: String,
}

impl fmt::Display for LineWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            WarningKind::BadLine => "skipped bad line",
            WarningKind::TruncatedTail => "skipped truncated last line",
            WarningKind::Ignored => "ignored line",
            WarningKind::Suspect => "suspect value",
        };
        write!(f, "{}:{}: {what}", self.file, self.line)?;
        if let Some(path) = &self.path {
            write!(f, " at `{path}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Collects warnings up to [`MAX_WARNINGS`], counting the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Warnings {
    pub list: Vec<LineWarning>,
    /// Warnings beyond [`MAX_WARNINGS`] that were counted but not kept.
    #[serde(default)]
    pub suppressed: usize,
}

impl Warnings {
    /// Keeps `warning` (its message and field capped, so a huge value of the input is never
    /// echoed whole: [`crate::input::cap_message`]) or counts it past [`MAX_WARNINGS`].
    pub fn push(&mut self, mut warning: LineWarning) {
        if self.list.len() < MAX_WARNINGS {
            warning.message = crate::input::cap_message(&warning.message);
            warning.path = warning.path.map(|p| crate::input::excerpt(&p));
            self.list.push(warning);
        } else {
            self.suppressed += 1;
        }
    }

    /// The first bad or truncated line, the one a user should look at first.
    pub fn first_bad_line(&self) -> Option<&LineWarning> {
        self.list.iter().find(|w| w.kind != WarningKind::Ignored)
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty() && self.suppressed == 0
    }

    pub fn len(&self) -> usize {
        self.list.len() + self.suppressed
    }
}

/// A recording read from a file, with what was skipped on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadRecording {
    pub recording: Recording,
    pub warnings: Warnings,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("failed to read {file}: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("failed to write {file}: {source}")]
    Write { file: String, source: std::io::Error },
    #[error("failed to read recording {file}: the file is empty (expected a header line `{{\"ctxsim_recording\": 1, ...}}`)")]
    Empty { file: String },
    #[error("failed to read recording {file}:{line}: bad header at `{path}`: {message}")]
    Header { file: String, line: usize, path: String, message: String },
    #[error("failed to read recording {file}:{line}: unsupported recording version {version} (this build reads version {RECORDING_VERSION})")]
    Version { file: String, line: usize, version: u64 },
}

/// One line of a JSONL file, as raw bytes without its line terminator: its own
/// ([`RawLines`]) or a slice of the input ([`SliceLines`]).
pub(crate) struct RawLine<B = Vec<u8>> {
    /// 1-based line number.
    pub number: usize,
    pub bytes: B,
    /// False for a last line that ended without `\n`.
    pub terminated: bool,
}

/// Iterates over the lines of a reader as bytes, so invalid UTF-8 is a per-line problem rather
/// than an error that stops the whole read.
pub(crate) struct RawLines<R> {
    reader: R,
    number: usize,
}

impl<R: BufRead> RawLines<R> {
    pub fn new(reader: R) -> Self {
        RawLines { reader, number: 0 }
    }
}

impl<R: BufRead> Iterator for RawLines<R> {
    type Item = std::io::Result<RawLine>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut bytes = Vec::new();
        match self.reader.read_until(b'\n', &mut bytes) {
            Ok(0) => None,
            Ok(_) => {
                self.number += 1;
                let (body, terminated) = line_body(&bytes, self.number);
                bytes.truncate(body.end);
                bytes.drain(..body.start);
                Some(Ok(RawLine { number: self.number, bytes, terminated }))
            }
            Err(e) => Some(Err(e)),
        }
    }
}

/// Where the record of line `number` lies in the line as read (its terminator included, if
/// any), and whether it was terminated: without its `\n` or `\r\n`, and on the first line
/// without a byte-order mark (it opens the file, not its first record). One rule for
/// [`RawLines`] and [`SliceLines`].
fn line_body(line: &[u8], number: usize) -> (std::ops::Range<usize>, bool) {
    let start = if number == 1 && line.starts_with(crate::input::BOM) { crate::input::BOM.len() } else { 0 };
    let (end, terminated) = match line.strip_suffix(b"\n") {
        Some(rest) => (rest.strip_suffix(b"\r").unwrap_or(rest).len(), true),
        None => (line.len(), false),
    };
    (start..end.max(start), terminated)
}

/// The lines of input held whole, as slices of it: [`RawLines`]' lines (the same numbers,
/// terminators and byte-order mark rule) without a copy of each.
pub(crate) struct SliceLines<'a> {
    rest: &'a [u8],
    number: usize,
}

impl<'a> SliceLines<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        SliceLines { rest: bytes, number: 0 }
    }
}

impl<'a> Iterator for SliceLines<'a> {
    type Item = RawLine<&'a [u8]>;

    fn next(&mut self) -> Option<Self::Item> {
        // (The end found as `read_until` finds it, by the `memchr` crate's search, which reads
        // a vector register at a time: a slice's `skip_until`, a word at a time, costs about a
        // tenth of the import.)
        if self.rest.is_empty() {
            return None;
        }
        let length = memchr::memchr(b'\n', self.rest).map_or(self.rest.len(), |newline| newline + 1);
        debug_assert_eq!(Some(length), std::io::BufRead::skip_until(&mut &*self.rest, b'\n').ok(), "a line's end as read_until finds it");
        let (line, rest) = self.rest.split_at(length);
        self.rest = rest;
        self.number += 1;
        let (body, terminated) = line_body(line, self.number);
        Some(RawLine { number: self.number, bytes: &line[body], terminated })
    }
}

impl<B: AsRef<[u8]>> RawLine<B> {
    pub fn is_blank(&self) -> bool {
        self.bytes.as_ref().iter().all(u8::is_ascii_whitespace)
    }

    /// The kind of warning a parse failure of this line deserves.
    pub fn failure_kind(&self) -> WarningKind {
        if self.terminated { WarningKind::BadLine } else { WarningKind::TruncatedTail }
    }
}

/// `bytes` as text where they are UTF-8: the same answer as `std::str::from_utf8(bytes).ok()`,
/// checked by `simdutf8` (several times fewer instructions on the long lines of a transcript;
/// a line's failure is placed by the std check, [`crate::input::invalid_utf8_column`]).
pub(crate) fn utf8(bytes: &[u8]) -> Option<&str> {
    let text = simdutf8::basic::from_utf8(bytes).ok();
    debug_assert_eq!(text, std::str::from_utf8(bytes).ok(), "simdutf8 and std part on a line's UTF-8");
    text
}

/// Deserializes one line, naming the JSON path of the failure.
pub(crate) fn parse_line<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, (Option<String>, String)> {
    // Most lines parse: tracking the path costs time on every value, so it runs only to explain
    // a failure (the same parse, so the same outcome). A line that is UTF-8 as a whole is parsed
    // as text: the parse of a slice checks the UTF-8 of every string again, one at a time (a
    // tenth of the import's parse); on UTF-8 both parses take the same steps, so the same lines
    // fail. Another line goes to the parse of the slice, which can still take it when the bad
    // bytes sit in a string the type skips.
    let parsed = match utf8(bytes) {
        Some(text) => serde_json::from_str(text),
        None => serde_json::from_slice(bytes),
    };
    if let Ok(value) = parsed {
        return Ok(value);
    }
    if let Some(column) = crate::input::invalid_utf8_column(bytes) {
        return Err((None, format!("invalid UTF-8 at byte column {column} (byte 0x{:02x})", bytes[column - 1])));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = crate::input::json_path(e.path());
        let path = if path == "." { None } else { Some(path) };
        (path, crate::input::cap_message(&e.into_inner().to_string()))
    })?;
    de.end().map_err(|e| (None, crate::input::cap_message(&e.to_string())))?;
    Ok(value)
}

/// Reads a recording file. See [`read_recording_from`].
pub fn read_recording(path: &Path) -> Result<ReadRecording, RecordingError> {
    let file_name = path.display().to_string();
    let file = File::open(path).map_err(|source| RecordingError::Read { file: file_name.clone(), source })?;
    read_recording_from(BufReader::new(file), &file_name)
}

/// Reads a recording from any buffered reader; `file` names it in messages. Bad event lines are
/// skipped and reported; the header must be the first non-blank line and must parse.
pub fn read_recording_from<R: BufRead>(reader: R, file: &str) -> Result<ReadRecording, RecordingError> {
    let mut header: Option<Header> = None;
    let mut events = Vec::new();
    let mut warnings = Warnings::default();
    for line in RawLines::new(reader) {
        let line = line.map_err(|source| RecordingError::Read { file: file.to_owned(), source })?;
        if line.is_blank() {
            continue;
        }
        if header.is_none() {
            header = Some(parse_header(&line, file)?);
            continue;
        }
        match parse_line::<Event>(&line.bytes) {
            Ok(event) => events.push(event),
            Err(first) => {
                let (path, message) = diagnose_event(&line.bytes).unwrap_or(first);
                warnings.push(LineWarning {
                kind: line.failure_kind(),
                file: file.to_owned(),
                line: line.number,
                    path,
                    message,
                })
            }
        }
    }
    let header = header.ok_or_else(|| RecordingError::Empty { file: file.to_owned() })?;
    Ok(ReadRecording { recording: Recording { header, events: events.into() }, warnings })
}

/// Finds the JSON path of what is wrong with an event line that failed to parse.
///
/// serde loses the path inside an internally tagged enum (it buffers the fields before it knows
/// the variant), so the line is parsed again in two steps: the common fields, then the fields of
/// the variant its `event` tag names, each with path tracking. `None` when the line is not an
/// object with a known tag (the first error already says what is wrong then).
pub fn diagnose_event(bytes: &[u8]) -> Option<(Option<String>, String)> {
    #[derive(Deserialize)]
    struct Common {
        #[serde(default)]
        #[expect(dead_code, reason = "parsed only to check its type")]
        time_ms: u64,
        #[serde(default)]
        #[expect(dead_code, reason = "parsed only to check its type")]
        lane: Option<String>,
        #[serde(default)]
        #[expect(dead_code, reason = "parsed only to check its type")]
        uuid: Option<String>,
    }
    fn check<T: serde::de::DeserializeOwned>(value: Value) -> Option<(Option<String>, String)> {
        serde_path_to_error::deserialize::<_, T>(value)
            .err()
            .map(|e| (Some(crate::input::json_path(e.path())), crate::input::cap_message(&e.into_inner().to_string())))
    }
    let Ok(Value::Object(mut map)) = serde_json::from_slice::<Value>(bytes) else { return None };
    if let Some(found) = check::<Common>(Value::Object(map.clone())) {
        return Some(found);
    }
    let tag = map.remove("event")?;
    for key in ["time_ms", "lane", "uuid"] {
        map.remove(key);
    }
    let fields = Value::Object(map);
    match tag.as_str()? {
        "user_prompt" => check::<UserPrompt>(fields),
        "model_reply" => check::<ModelReply>(fields),
        "tool_result" => check::<ToolResult>(fields),
        "attachment" => check::<Attachment>(fields),
        "compaction" => check::<Compaction>(fields),
        "system_event" => check::<SystemEvent>(fields),
        "time" => check::<TimeAdvance>(fields),
        _ => None,
    }
}

fn parse_header(line: &RawLine, file: &str) -> Result<Header, RecordingError> {
    // Check the version before the full parse so a future format gets a clear message rather
    // than a confusing missing-field error.
    if let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(&line.bytes) {
        match map.get("ctxsim_recording").and_then(Value::as_u64) {
            Some(v) if v != u64::from(RECORDING_VERSION) => {
                return Err(RecordingError::Version { file: file.to_owned(), line: line.number, version: v });
            }
            _ => {}
        }
    }
    parse_line::<Header>(&line.bytes).map_err(|(path, message)| RecordingError::Header {
        file: file.to_owned(),
        line: line.number,
        path: path.unwrap_or_else(|| ".".to_owned()),
        message,
    })
}

/// Writes a recording to `writer` as JSONL (header first, one event per line).
pub fn write_recording_to<W: Write>(recording: &Recording, mut writer: W) -> std::io::Result<()> {
    serde_json::to_writer(&mut writer, &recording.header)?;
    writer.write_all(b"\n")?;
    for event in &recording.events {
        serde_json::to_writer(&mut writer, event)?;
        writer.write_all(b"\n")?;
    }
    writer.flush()
}

/// Writes a recording atomically: a temporary file in the destination directory, then a rename.
pub fn write_recording(path: &Path, recording: &Recording) -> Result<(), RecordingError> {
    write_atomically(path, |w| write_recording_to(recording, w))
}

/// Writes `path` through `fill` so the destination is either the old file or the complete new
/// one, never a partial write.
pub fn write_atomically(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<&mut File>) -> std::io::Result<()>,
) -> Result<(), RecordingError> {
    crate::report::output::write_output_with(path, fill).map_err(|source| RecordingError::Write { file: path.display().to_string(), source })
}

#[cfg(test)]
mod parse_line_tests {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::parse_line;

    /// A line of JSON-like text: values with escapes, non-ASCII text, numbers past `f64`,
    /// then one byte maybe replaced by a byte that cannot stand in UTF-8 there.
    fn line() -> impl Strategy<Value = Vec<u8>> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("1e999".to_owned()),
            Just("-12.5e-3".to_owned()),
            Just("18446744073709551616".to_owned()),
            "[a-zé\\\\\"→ ]{0,6}".prop_map(|s| format!("\"{s}\"")),
            Just("\"\\ud800\"".to_owned()),
            Just("\"\\u00e9\\n\"".to_owned()),
        ];
        let value = leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec(("[a-c]{1,2}", inner), 0..4)
                    .prop_map(|fields| format!("{{{}}}", fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect::<Vec<_>>().join(","))),
            ]
        });
        (value, any::<prop::sample::Index>(), prop::option::of(prop_oneof![Just(0xffu8), Just(0xc3), Just(0x80), Just(b'"')]))
            .prop_map(|(text, at, byte)| {
                let mut bytes = text.into_bytes();
                if let Some(byte) = byte {
                    let i = at.index(bytes.len());
                    bytes[i] = byte;
                }
                bytes
            })
    }

    proptest! {
        /// Parsing a UTF-8 line as text takes the same lines, to the same values, as the
        /// parse of the slice, and fails on the others (their error comes from the same
        /// explaining parse as before).
        #[test]
        fn a_line_parses_as_text_as_it_parses_as_bytes(bytes in line()) {
            let by_slice = serde_json::from_slice::<Value>(&bytes);
            match parse_line::<Value>(&bytes) {
                Ok(value) => prop_assert_eq!(Some(value), by_slice.ok()),
                Err(_) => prop_assert!(by_slice.is_err()),
            }
        }
    }
}

#[cfg(test)]
mod slice_lines_tests {
    use proptest::prelude::*;

    use super::{RawLines, SliceLines};

    proptest! {
        /// The slices are the lines a reader gives: numbers, bytes and terminators, byte-order
        /// mark and `\r` included; lines long enough for the vector search (more than 64 bytes)
        /// too.
        #[test]
        fn slice_lines_are_the_read_lines(pieces in prop::collection::vec(prop_oneof![
            prop::sample::select(vec![b'\n', b'\r', b' ', b'a', 0xEF, 0xBB, 0xBF]).prop_map(|byte| vec![byte]),
            (1usize..90).prop_map(|n| vec![b'a'; n]),
        ], 0..40)) {
            let bytes = pieces.concat();
            let read: Vec<(usize, Vec<u8>, bool)> =
                RawLines::new(&bytes[..]).map(|l| l.expect("a slice reads")).map(|l| (l.number, l.bytes, l.terminated)).collect();
            let sliced: Vec<(usize, Vec<u8>, bool)> = SliceLines::new(&bytes).map(|l| (l.number, l.bytes.to_vec(), l.terminated)).collect();
            prop_assert_eq!(sliced, read);
        }
    }

    #[test]
    fn byte_order_mark_opens_only_the_first_line() {
        let bytes = b"\xEF\xBB\xBF{}\r\n\xEF\xBB\xBF{}\nlast";
        let lines: Vec<(usize, &[u8], bool)> = SliceLines::new(bytes).map(|l| (l.number, l.bytes, l.terminated)).collect();
        assert_eq!(lines, vec![(1, &b"{}"[..], true), (2, &b"\xEF\xBB\xBF{}"[..], true), (3, &b"last"[..], false)]);
    }
}
