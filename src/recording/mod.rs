//! Recordings: the ctxsim JSONL format of what happened in a session, and importers that turn
//! real files (Claude Code transcripts, claude-trace captures) into recordings or request logs.
//!
//! - [`format`]: the recording format v1, its reader (lenient, reports bad lines) and writer
//!   (atomic).
//! - [`claude_code`]: Claude Code session transcripts → recording, per-call summaries and the
//!   message list each call saw.
//! - [`api_requests`]: the wire requests 2.1.2xx/3xx transcripts record, and each request
//!   rebuilt from them.
//! - [`claude_trace`]: claude-trace captures → `analyze` request log.
//! - [`import`](mod@import): format detection and the `import` entry point.

pub mod api_requests;
pub mod claude_code;
pub mod claude_trace;
pub mod format;
pub mod import;
mod line_json;
mod picked;
mod report;

pub use claude_code::{SUMMARY_OPENING, ImportedSession, RecordedCall, ViewCache, build_messages, import_claude_code, import_claude_code_from, recorded_calls};
pub use claude_trace::{ConvertedLog, RequestLogEntry, convert_claude_trace, usage_from_sse, write_request_log_to};
pub use format::{
    Attachment, Compaction, Event, EventKind, Events, Header, LineWarning, ModelReply, ReadRecording, Recording,
    RecordingError, SubagentInfo, SystemEvent, TimeAdvance, ToolResult, UserPrompt, WarningKind, Warnings,
    diagnose_event, read_recording, read_recording_from, write_atomically, write_recording, write_recording_to,
};
pub use import::{InputFormat, detect_format, detect_format_at, detect_format_from, import};
pub use report::{ImportError, ImportReport, UsageTotals};
