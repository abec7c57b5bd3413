//! The script as written: serde shapes with `deny_unknown_fields`, before the checks that turn
//! them into [`super::Step`]s. Keeping this layer separate lets serde report unknown keys and
//! wrong types with their YAML position, and lets the checks report cross-step problems
//! (unknown tool_use ids) with a field path.

use std::fmt;

use indexmap::IndexMap;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::api::StopReason;

use super::duration::DurationMs;
use super::schema::{Expect, WorldSpec};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawScenario {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub world: WorldSpec,
    #[serde(default)]
    pub script: Vec<RawStep>,
    #[serde(default)]
    pub expect: Expect,
}

/// One script item. Exactly one of the kind keys (`user`, `assistant`, `tool_output`, `wait`,
/// `write_file`, `remove_file`) must be present; the others are modifiers of `assistant`.
/// `Default` (no key) is where a recorded session's workload builds its steps from.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStep {
    pub user: Option<String>,
    pub assistant: Option<Vec<BlockSpec>>,
    pub tool_output: Option<IndexMap<String, ToolOutputSpec>>,
    pub wait: Option<DurationMs>,
    pub write_file: Option<WriteFileSpec>,
    pub remove_file: Option<String>,
    pub mcp_connect: Option<String>,
    pub mcp_disconnect: Option<String>,
    pub mcp_list_changed: Option<McpListChangedSpec>,
    pub plugin_enable: Option<String>,
    pub plugin_reload: Option<bool>,
    pub model_switch: Option<String>,
    pub git: Option<crate::world::GitState>,
    pub clear: Option<bool>,
    pub compact: Option<bool>,
    pub resume: Option<bool>,
    pub attachment: Option<AttachmentSpec>,
    pub microcompact: Option<MicrocompactSpec>,
    pub resume_lost: Option<ResumeLostSpec>,
    pub lane: Option<String>,
    pub stop_reason: Option<StopReason>,
    pub usage: Option<UsageSpec>,
    pub output_tokens: Option<u64>,
    pub latency: Option<LatencySpec>,
}

/// One block of an assistant reply: `{text: ...}`, `{thinking: ...}`, `{tool_use: {...}}`.
#[derive(Debug)]
pub(crate) enum BlockSpec {
    Text(String),
    Thinking(String),
    RedactedThinking(String),
    ToolUse(ToolUseSpec),
}

const BLOCK_KINDS: &[&str] = &["text", "thinking", "redacted_thinking", "tool_use"];

impl<'de> Deserialize<'de> for BlockSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // serde_norway reads externally tagged enums only from `!tag` syntax; scenarios use the
        // friendlier single-key map, so the dispatch is written out here.
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = BlockSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a block: `{text: ...}`, `{thinking: ...}`, `{redacted_thinking: ...}` or `{tool_use: {...}}`")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BlockSpec, A::Error> {
                let Some(kind) = map.next_key::<String>()? else {
                    return Err(de::Error::custom(format!("empty block, expected one of `{}`", BLOCK_KINDS.join("`, `"))));
                };
                let block = match kind.as_str() {
                    "text" => BlockSpec::Text(map.next_value()?),
                    "thinking" => BlockSpec::Thinking(map.next_value()?),
                    "redacted_thinking" => BlockSpec::RedactedThinking(map.next_value()?),
                    "tool_use" => BlockSpec::ToolUse(map.next_value()?),
                    other => return Err(de::Error::unknown_field(other, BLOCK_KINDS)),
                };
                if let Some(extra) = map.next_key::<String>()? {
                    return Err(de::Error::custom(format!(
                        "a block has exactly one kind, found `{kind}` and `{extra}`; put each in its own list item"
                    )));
                }
                Ok(block)
            }
        }
        deserializer.deserialize_map(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolUseSpec {
    /// Generated deterministically when absent.
    #[serde(default)]
    pub id: Option<String>,
    pub name: String,
    #[serde(default = "empty_object")]
    pub input: Value,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct McpListChangedSpec {
    pub server: String,
    #[serde(default)]
    pub tools: Vec<crate::world::McpToolDef>,
}

/// `attachment: {type, text, skill?}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AttachmentSpec {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    #[serde(default)]
    pub skill: Option<String>,
}

/// `microcompact: {tool_use_ids, history_chars}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MicrocompactSpec {
    #[serde(default)]
    pub tool_use_ids: Vec<String>,
    #[serde(default)]
    pub history_chars: usize,
}

/// `resume_lost: {tool_use_ids}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResumeLostSpec {
    pub tool_use_ids: Vec<String>,
}

/// `write_file: {path, content}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteFileSpec {
    pub path: String,
    pub content: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UsageSpec {
    #[serde(default)]
    pub input_tokens: Option<u64>,
    #[serde(default)]
    pub output_tokens: Option<u64>,
    #[serde(default)]
    pub cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    pub cache_creation_input_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LatencySpec {
    /// Defaults to `total`.
    #[serde(default)]
    pub first_token: Option<DurationMs>,
    pub total: DurationMs,
}

/// A tool output: a string, or `{content: ..., is_error: true}`.
#[derive(Debug, Clone)]
pub(crate) struct ToolOutputSpec {
    pub content: String,
    pub is_error: bool,
    pub images: Vec<super::schema::ImageSpec>,
    pub subagent: bool,
    pub file: Option<super::schema::ToolFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolOutputMap {
    #[serde(default)]
    content: String,
    #[serde(default)]
    is_error: bool,
    #[serde(default)]
    images: Vec<super::schema::ImageSpec>,
    #[serde(default)]
    subagent: bool,
    file: Option<super::schema::ToolFile>,
}

impl<'de> Deserialize<'de> for ToolOutputSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Hand-written instead of `#[serde(untagged)]`, whose only error is "data did not match
        // any variant"; this way a map gets the usual unknown-field messages.
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ToolOutputSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a map with `content` and optional `is_error`, `images`, `file` and `subagent`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ToolOutputSpec, E> {
                Ok(ToolOutputSpec { content: v.to_owned(), is_error: false, images: Vec::new(), subagent: false, file: None })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ToolOutputSpec, A::Error> {
                let m = ToolOutputMap::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(ToolOutputSpec { content: m.content, is_error: m.is_error, images: m.images, subagent: m.subagent, file: m.file })
            }
        }
        deserializer.deserialize_any(V)
    }
}
