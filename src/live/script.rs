//! The script `ctxsim serve` answers from (docs/serve.md).
//!
//! JSON: `{"main": [reply...], "side": [reply...], "compact": [reply...], "side_text": "...",
//! "summary_text": "...", "default_text": "...", "compact_markers": ["..."]}`, every key optional.
//! A reply is `{"content": ..., "stop_reason"?, "usage"?, "usage_scale"?, "delay"?}` where
//! `content` is a string (one text block) or a list of blocks, each either a Messages API block
//! (`{"type": "tool_use", ...}`) or a scenario block (`{"text": ...}`, `{"thinking": ...}`,
//! `{"tool_use": {"name", "input", "id"?}}`). This is the oracle's scripted-model shape
//! (reference/real-client-oracle.md §1) with the scenario's block vocabulary added.
//!
//! Requests are classified into lanes as the oracle did: `compact` when the last user message's
//! text contains a compaction marker, `side` when the model is a Haiku or the request has no
//! tools, `main` otherwise (subagent turns included). Each lane consumes its replies in order;
//! a lane without replies left answers with its fallback text.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, Deserializer};
use serde_json::{Map, Value};

use crate::api::{ContentBlock, Message, MessageContent, Request, Role, StopReason};
use crate::scenario::raw::BlockSpec;

/// The real client's compaction instruction contains the first; ours
/// (`agent::compact::autocompact::SUMMARY_MARKER`) the second.
const DEFAULT_COMPACT_MARKERS: &[&str] = &["create a detailed summary of the conversation", crate::agent::compact::autocompact::SUMMARY_MARKER];
const DEFAULT_SIDE_TEXT: &str = "Noted.";
const DEFAULT_SUMMARY_TEXT: &str = "<summary>\nThe user asked for changes to the project; the work so far is done and checked. Nothing is pending.\n</summary>";
const DEFAULT_TEXT: &str = "The script has no more replies, so this is where the conversation ends.";

/// The lanes a request can be classified into.
pub const LANES: &[&str] = &["main", "side", "compact"];

/// One scripted reply.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawReplyFields")]
pub struct ScriptedReply {
    /// Blocks; a tool_use with an empty id gets a deterministic one when served.
    pub content: Vec<ContentBlock>,
    pub stop_reason: Option<StopReason>,
    /// Usage fields that replace the simulated ones in the response (e.g. a large
    /// `cache_read_input_tokens` to make a client compact).
    pub usage: Map<String, Value>,
    /// Multiplies the simulated input-side usage.
    pub usage_scale: Option<f64>,
    /// Virtual milliseconds the reply takes (the oracle's `delay`, in seconds, converted).
    pub delay_ms: u64,
}

/// Why a script did not load.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("failed to read script {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}:{line}:{column}: {field}: {message}")]
    Parse { path: String, line: usize, column: usize, field: String, message: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScript {
    #[serde(default)]
    main: Vec<ScriptedReply>,
    #[serde(default)]
    side: Vec<ScriptedReply>,
    #[serde(default)]
    compact: Vec<ScriptedReply>,
    side_text: Option<String>,
    summary_text: Option<String>,
    default_text: Option<String>,
    compact_markers: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplyFields {
    content: ReplyContent,
    #[serde(default)]
    stop_reason: Option<StopReason>,
    #[serde(default)]
    usage: Option<Map<String, Value>>,
    #[serde(default)]
    usage_scale: Option<f64>,
    #[serde(default)]
    delay: Option<f64>,
}

struct ReplyContent(Vec<ContentBlock>);

impl<'de> Deserialize<'de> for ReplyContent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(text) => Ok(ReplyContent(vec![ContentBlock::text(text)])),
            Value::Array(items) if !items.is_empty() => {
                items.into_iter().enumerate().map(|(i, item)| block(item).map_err(|m| de::Error::custom(format!("[{i}]: {m}")))).collect::<Result<_, _>>().map(ReplyContent)
            }
            Value::Array(_) => Err(de::Error::custom("a reply needs at least one block")),
            _ => Err(de::Error::custom("expected a string or a list of content blocks")),
        }
    }
}

/// One block: a Messages API block (it has `type`) or a scenario block (one key).
fn block(item: Value) -> Result<ContentBlock, String> {
    if item.get("type").is_some() {
        return ContentBlock::from_value(item);
    }
    let spec: BlockSpec = serde_json::from_value(item).map_err(|e| e.to_string())?;
    Ok(match spec {
        BlockSpec::Text(text) => ContentBlock::text(text),
        BlockSpec::Thinking(thinking) => {
            let signature = format!("sig_{:016x}", xxhash_rust::xxh3::xxh3_64(thinking.as_bytes()));
            ContentBlock::thinking(thinking, signature)
        }
        BlockSpec::RedactedThinking(data) => ContentBlock::RedactedThinking { data, extra: Map::new() },
        BlockSpec::ToolUse(tool) => ContentBlock::tool_use(tool.id.unwrap_or_default(), tool.name, tool.input),
    })
}

impl TryFrom<RawReplyFields> for ScriptedReply {
    type Error = String;

    fn try_from(this: RawReplyFields) -> Result<ScriptedReply, String> {
        if let Some(scale) = this.usage_scale
            && !(scale.is_finite() && scale >= 0.0)
        {
            return Err(format!("usage_scale: must be a finite number ≥ 0, got {scale}"));
        }
        let delay_ms = match this.delay {
            Some(s) if s.is_finite() && s >= 0.0 => (s * 1000.0).round() as u64,
            Some(s) => return Err(format!("delay: must be a number of seconds ≥ 0, got {s}")),
            None => 0,
        };
        if let Some(usage) = &this.usage {
            serde_json::from_value::<crate::api::Usage>(Value::Object(usage.clone())).map_err(|e| format!("usage: {e}"))?;
        }
        Ok(ScriptedReply { content: this.content.0, stop_reason: this.stop_reason, usage: this.usage.unwrap_or_default(), usage_scale: this.usage_scale, delay_ms })
    }
}

/// A loaded script with what each lane has consumed.
#[derive(Debug, Clone)]
pub struct Script {
    lanes: BTreeMap<String, VecDeque<ScriptedReply>>,
    scripted: BTreeMap<String, usize>,
    side_text: String,
    summary_text: String,
    default_text: String,
    compact_markers: Vec<String>,
}

impl Script {
    /// Parses a script; errors name the file, line, column and field.
    pub fn parse(text: &str, path: &str) -> Result<Script, ScriptError> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let raw: RawScript = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| ScriptError::Parse {
            path: path.to_owned(),
            line: e.inner().line(),
            column: e.inner().column(),
            field: crate::input::json_path(e.path()),
            message: e.inner().to_string().split(" at line ").next().unwrap_or_default().to_owned(),
        })?;
        let lanes: BTreeMap<String, VecDeque<ScriptedReply>> =
            [("main", raw.main), ("side", raw.side), ("compact", raw.compact)].into_iter().map(|(lane, replies)| (lane.to_owned(), replies.into())).collect();
        let scripted = lanes.iter().map(|(lane, q)| (lane.clone(), q.len())).collect();
        Ok(Script {
            lanes,
            scripted,
            side_text: raw.side_text.unwrap_or_else(|| DEFAULT_SIDE_TEXT.to_owned()),
            summary_text: raw.summary_text.unwrap_or_else(|| DEFAULT_SUMMARY_TEXT.to_owned()),
            default_text: raw.default_text.unwrap_or_else(|| DEFAULT_TEXT.to_owned()),
            compact_markers: raw.compact_markers.unwrap_or_else(|| DEFAULT_COMPACT_MARKERS.iter().map(|m| (*m).to_owned()).collect()),
        })
    }

    pub fn load(path: &Path) -> Result<Script, ScriptError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read { path: name.clone(), source })?;
        Self::parse(&text, &name)
    }

    /// The lane a request belongs to (the oracle's classification).
    pub fn classify(&self, body: &Request) -> &'static str {
        let last_user_text = body.messages.iter().rev().find(|m| m.role == Role::User).map(message_text).unwrap_or_default();
        if self.compact_markers.iter().any(|marker| last_user_text.contains(marker.as_str())) {
            "compact"
        } else if body.model.to_ascii_lowercase().contains("haiku") || body.tools().is_empty() {
            "side"
        } else {
            "main"
        }
    }

    /// The next reply of `lane`: scripted while any are left, else the lane's fallback text.
    pub fn next(&mut self, lane: &str) -> ScriptedReply {
        if let Some(reply) = self.lanes.get_mut(lane).and_then(VecDeque::pop_front) {
            return reply;
        }
        let text = match lane {
            "compact" => &self.summary_text,
            "side" => &self.side_text,
            _ => &self.default_text,
        };
        ScriptedReply { content: vec![ContentBlock::text(text.clone())], stop_reason: None, usage: Map::new(), usage_scale: None, delay_ms: 0 }
    }

    /// Scripted replies not yet served on `lane`.
    pub fn remaining(&self, lane: &str) -> usize {
        self.lanes.get(lane).map_or(0, VecDeque::len)
    }

    /// True once every scripted `main` reply was served (side and compact replies are
    /// answered by their fallback texts and never hold a run open).
    pub fn main_exhausted(&self) -> bool {
        self.remaining("main") == 0
    }

    /// How many replies each lane was scripted with, sorted by lane.
    pub fn scripted(&self) -> &BTreeMap<String, usize> {
        &self.scripted
    }
}

/// The text of a message: its string, or its text blocks joined.
fn message_text(message: &Message) -> String {
    match &message.content {
        MessageContent::Text(text) => text.to_string(),
        MessageContent::Blocks(blocks) => crate::api::joined_text(blocks),
    }
}
