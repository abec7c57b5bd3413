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

    /// The usage a JSON object holds, read field by field: what its `Deserialize` gives, without
    /// the copy of every entry its flattened `extra` costs (a tenth of a transcript's import).
    /// `Err` gives the object back, unchanged, where a known field is not what that parse takes
    /// (its parse then names the failure).
    pub fn from_object(mut object: Map<String, Value>) -> Result<Usage, Map<String, Value>> {
        let Some(known) = KnownFields::read(USAGE_FIELDS.map(|key| object.get(key))) else {
            return Err(object);
        };
        #[cfg(debug_assertions)]
        let parsed = Usage::deserialize(Value::Object(object.clone())).ok();
        // The other entries, in their order, where they are: no key moved or hashed again.
        object.retain(|key, _| !USAGE_FIELDS.contains(&key.as_str()));
        let usage = known.with_extra(object);
        // (`extra`'s equality ignores its order; its text does not.)
        #[cfg(debug_assertions)]
        debug_assert_eq!(
            Some(serde_json::to_string(&usage).expect("a usage serializes")),
            parsed.map(|parsed| serde_json::to_string(&parsed).expect("a usage serializes")),
            "Usage::from_object differs from Usage's Deserialize"
        );
        Ok(usage)
    }

    /// The usage of an object read entry by entry: `known` the values of [`USAGE_FIELDS`] (in
    /// that order; of a repeated key the last), `extra` the other entries in their order (a
    /// repeated key where it first stood, with its last value). What [`Usage::from_object`]
    /// gives for that object, built without it; `None` where it gives `Err`.
    pub(crate) fn from_fields(known: [Option<&Value>; USAGE_FIELDS.len()], extra: Map<String, Value>) -> Option<Usage> {
        Some(KnownFields::read(known)?.with_extra(extra))
    }
}

/// The fields of [`USAGE_FIELDS`] as [`Usage::from_object`] reads them.
struct KnownFields {
    counts: [u64; 4],
    cache_creation: Option<CacheCreation>,
}

impl KnownFields {
    /// `None` where a count is not one (a missing count is zero, and null too where its
    /// `Deserialize` takes it so), or `cache_creation` does not read.
    fn read([input, creation, read, cache_creation, output]: [Option<&Value>; USAGE_FIELDS.len()]) -> Option<KnownFields> {
        let count = |value: Option<&Value>, null_as_zero: bool| match value {
            None => Some(0),
            Some(Value::Null) if null_as_zero => Some(0),
            Some(value) => value.as_u64(),
        };
        let counts = [count(input, false)?, count(creation, true)?, count(read, true)?, count(output, false)?];
        let cache_creation = match cache_creation {
            None | Some(Value::Null) => None,
            Some(value) => Some(CacheCreation::deserialize(value).ok()?),
        };
        Some(KnownFields { counts, cache_creation })
    }

    fn with_extra(self, extra: Map<String, Value>) -> Usage {
        let [input_tokens, cache_creation_input_tokens, cache_read_input_tokens, output_tokens] = self.counts;
        Usage { input_tokens, cache_creation_input_tokens, cache_read_input_tokens, cache_creation: self.cache_creation, output_tokens, extra: extra.into() }
    }
}

/// The fields of [`Usage`] other than its flattened `extra`.
pub(crate) const USAGE_FIELDS: [&str; 5] = ["input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "cache_creation", "output_tokens"];

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

#[cfg(test)]
mod usage_tests {
    use proptest::prelude::*;
    use serde::Deserialize;
    use serde_json::{Map, Value};

    use super::Usage;

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<u64>().prop_map(Value::from),
            (-5i64..0).prop_map(Value::from),
            Just(Value::from(2.5)),
            Just(Value::from("7")),
            (prop::option::of(0u64..9), prop::option::of(0u64..9)).prop_map(|(a, b)| {
                let mut split = Map::new();
                split.extend(a.map(|a| ("ephemeral_5m_input_tokens".to_owned(), Value::from(a))));
                split.extend(b.map(|b| ("ephemeral_1h_input_tokens".to_owned(), Value::from(b))));
                Value::Object(split)
            }),
        ]
    }

    proptest! {
        /// Field by field, a usage is what its `Deserialize` gives, `extra` in the same order;
        /// an object it does not take comes back as it was.
        #[test]
        fn from_object_is_the_parse(fields in prop::collection::vec((prop_oneof![
            Just("input_tokens"), Just("cache_creation_input_tokens"), Just("cache_read_input_tokens"),
            Just("cache_creation"), Just("output_tokens"), Just("service_tier"), Just("iterations"), Just("z")
        ], value()), 0..9)) {
            let object: Map<String, Value> = fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            let parsed = Usage::deserialize(Value::Object(object.clone())).ok();
            match Usage::from_object(object.clone()) {
                Ok(usage) => {
                    let parsed = parsed.expect("the parse takes what the fields take");
                    prop_assert_eq!(serde_json::to_string(&usage).unwrap(), serde_json::to_string(&parsed).unwrap());
                    prop_assert_eq!(usage, parsed);
                }
                Err(back) => prop_assert_eq!(serde_json::to_string(&back).unwrap(), serde_json::to_string(&object).unwrap()),
            }
        }
    }
}
