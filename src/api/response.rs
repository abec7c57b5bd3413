use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::content::ContentBlock;

/// A non-streaming Messages API response (or the message assembled from a stream).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    #[serde(default)]
    pub id: String,
    #[serde(rename = "type", default = "message_type")]
    pub kind: String,
    #[serde(default = "assistant_role")]
    pub role: String,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub content: Vec<ContentBlock>,
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_sequence: Option<String>,
    #[serde(default)]
    pub usage: Usage,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn message_type() -> String {
    "message".to_owned()
}

fn assistant_role() -> String {
    "assistant".to_owned()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    MaxTokens,
    StopSequence,
    ToolUse,
    PauseTurn,
    Refusal,
    ModelContextWindowExceeded,
    Compaction,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::MaxTokens => "max_tokens",
            StopReason::StopSequence => "stop_sequence",
            StopReason::ToolUse => "tool_use",
            StopReason::PauseTurn => "pause_turn",
            StopReason::Refusal => "refusal",
            StopReason::ModelContextWindowExceeded => "model_context_window_exceeded",
            StopReason::Compaction => "compaction",
        }
    }
}

/// `usage` as the API reports it. `input_tokens` counts only what follows the last cache
/// breakpoint; the request's whole input is `input + cache_creation + cache_read`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default, deserialize_with = "null_as_zero")]
    pub cache_creation_input_tokens: u64,
    #[serde(default, deserialize_with = "null_as_zero")]
    pub cache_read_input_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_creation: Option<CacheCreation>,
    #[serde(default)]
    pub output_tokens: u64,
    /// What the simulator does not model (`service_tier`, `server_tool_use`, `iterations`,
    /// ...), shared by the copies of a usage (a recorded call's, its replay's, its trace row's).
    #[serde(flatten)]
    pub extra: SharedMap,
}

/// A JSON object held by reference count: cloning it is a count, changing it (`DerefMut`)
/// copies it first when another holder has it (copy on write). Serializes (and flattens) as
/// the object it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedMap(std::sync::Arc<Map<String, Value>>);

impl std::ops::Deref for SharedMap {
    type Target = Map<String, Value>;
    fn deref(&self) -> &Map<String, Value> {
        &self.0
    }
}

impl std::ops::DerefMut for SharedMap {
    fn deref_mut(&mut self) -> &mut Map<String, Value> {
        std::sync::Arc::make_mut(&mut self.0)
    }
}

impl From<Map<String, Value>> for SharedMap {
    fn from(map: Map<String, Value>) -> Self {
        SharedMap(std::sync::Arc::new(map))
    }
}

impl Serialize for SharedMap {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for SharedMap {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Map::<String, Value>::deserialize(deserializer).map(SharedMap::from)
    }
}

impl Usage {
    /// input + cache_creation + cache_read: everything the request sent.
    pub fn prompt_tokens(&self) -> u64 {
        self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens
    }

    /// The 5m/1h split of cache creation; when the API did not report it, all of it is 5m.
    pub fn creation_split(&self) -> CacheCreation {
        match &self.cache_creation {
            Some(split) => split.clone(),
            None => CacheCreation {
                ephemeral_5m_input_tokens: self.cache_creation_input_tokens,
                ephemeral_1h_input_tokens: 0,
            },
        }
    }
}

fn null_as_zero<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    Ok(Option::<u64>::deserialize(deserializer)?.unwrap_or(0))
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheCreation {
    #[serde(default, deserialize_with = "null_as_zero")]
    pub ephemeral_5m_input_tokens: u64,
    #[serde(default, deserialize_with = "null_as_zero")]
    pub ephemeral_1h_input_tokens: u64,
}
