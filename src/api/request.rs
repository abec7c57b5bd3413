use std::ops::{Deref, DerefMut};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::content::{ContentBlock, MessageContent};

/// A JSON value held by reference count: cloning it is a count, changing it (`DerefMut`) copies
/// it first when another holder has it (copy on write). A request's parameters (`thinking`,
/// `metadata`, ...) are the same few values on every request of a session: each request, and
/// every copy of one a measurement makes, holds them so rather than rebuilding or copying the
/// objects. Serializes, parses, compares and debug-prints as the value it holds.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SharedValue(Arc<Value>);

impl SharedValue {
    /// Whether the two hold the same allocation (then they are equal).
    pub fn same(&self, other: &SharedValue) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for SharedValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Deref for SharedValue {
    type Target = Value;
    fn deref(&self) -> &Value {
        &self.0
    }
}

impl DerefMut for SharedValue {
    fn deref_mut(&mut self) -> &mut Value {
        Arc::make_mut(&mut self.0)
    }
}

impl From<Value> for SharedValue {
    fn from(value: Value) -> Self {
        SharedValue(Arc::new(value))
    }
}

impl Serialize for SharedValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for SharedValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(SharedValue::from)
    }
}

/// A `POST /v1/messages` request body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub model: String,
    pub messages: Vec<Message>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<SystemPrompt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<SharedVec<Tool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<SharedValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<SharedValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<SharedValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_management: Option<SharedValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_config: Option<SharedValue>,
    /// Top-level automatic caching: the API places this breakpoint on the last cacheable block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<CacheControl>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Request {
    /// This request with `messages` in place of its own (which are not copied): every other
    /// field cloned.
    pub fn with_messages(&self, messages: Vec<Message>) -> Request {
        // Every field named (no `..`): a new field cannot be forgotten here.
        Request {
            model: self.model.clone(),
            messages,
            system: self.system.clone(),
            tools: self.tools.clone(),
            tool_choice: self.tool_choice.clone(),
            metadata: self.metadata.clone(),
            max_tokens: self.max_tokens,
            thinking: self.thinking.clone(),
            temperature: self.temperature.clone(),
            context_management: self.context_management.clone(),
            output_config: self.output_config.clone(),
            cache_control: self.cache_control.clone(),
            stream: self.stream,
            extra: self.extra.clone(),
        }
    }

    /// A minimal request: model, max_tokens and messages.
    pub fn new(model: impl Into<String>, max_tokens: u64) -> Self {
        Request {
            model: model.into(),
            messages: Vec::new(),
            system: None,
            tools: None,
            tool_choice: None,
            metadata: None,
            max_tokens: Some(max_tokens),
            thinking: None,
            temperature: None,
            context_management: None,
            output_config: None,
            cache_control: None,
            stream: None,
            extra: Map::new(),
        }
    }

    /// The system prompt as a list of blocks (a string system prompt is one block).
    pub fn system_blocks(&self) -> Vec<SystemBlock> {
        match &self.system {
            None => Vec::new(),
            Some(SystemPrompt::Text(text)) => vec![SystemBlock::text(text.clone())],
            Some(SystemPrompt::Blocks(blocks)) => blocks.to_vec(),
        }
    }

    pub fn tools(&self) -> &[Tool] {
        self.tools.as_ref().map_or(&[], |tools| tools.as_slice())
    }

    /// Number of `cache_control` markers in the body (tools, system, messages; the top-level
    /// automatic marker counts as one).
    pub fn breakpoint_count(&self) -> usize {
        let tools = self.tools().iter().filter(|t| t.cache_control.is_some()).count();
        let system = match &self.system {
            Some(SystemPrompt::Blocks(blocks)) => {
                blocks.iter().filter(|b| b.cache_control.is_some()).count()
            }
            _ => 0,
        };
        let messages: usize = self
            .messages
            .iter()
            .map(|m| match &m.content {
                MessageContent::Text(_) => 0,
                MessageContent::Blocks(blocks) => {
                    blocks.iter().filter(|b| b.cache_control().is_some()).count()
                }
            })
            .sum();
        tools + system + messages + usize::from(self.cache_control.is_some())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
    /// A mid-conversation system message (`{"role": "system", ...}` inside `messages`): operator
    /// instructions from its position on, cached like any other message (see
    /// [`crate::api::system_messages`] for where the API accepts one).
    System,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::System => "system",
        }
    }
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: MessageContent,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A copy shares the blocks (a reference count). `extra` is nearly always empty, and a new
/// empty map costs nothing where cloning one still walks the map's table and entries: every
/// request of a long session copies its whole history this way, message by message.
impl Clone for Message {
    fn clone(&self) -> Self {
        let extra = if self.extra.is_empty() { Map::new() } else { self.extra.clone() };
        Message { role: self.role, content: self.content.clone(), extra }
    }
}

impl Message {
    pub fn user_text(text: impl Into<String>) -> Self {
        let text: String = text.into();
        Message { role: Role::User, content: MessageContent::Text(text.into()), extra: Map::new() }
    }

    pub fn user_blocks(blocks: Vec<ContentBlock>) -> Self {
        Message { role: Role::User, content: MessageContent::Blocks(blocks.into()), extra: Map::new() }
    }

    pub fn assistant_blocks(blocks: Vec<ContentBlock>) -> Self {
        Message { role: Role::Assistant, content: MessageContent::Blocks(blocks.into()), extra: Map::new() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SystemPrompt {
    Text(String),
    Blocks(SharedVec<SystemBlock>),
}

/// A list shared by every body that sends it unchanged (a request's `tools` and system
/// blocks): cloning one is a reference count, so the requests of a session hold the tool
/// schemas and the system prompt once, as the session built them. (A trace row's stage reports
/// are one too, `RequestMetrics::stages`: a run gone on from a checkpoint copies the rows
/// before it.) Reading goes through `Deref`
/// (a `Vec<T>`); changing through `DerefMut`, which copies the list first when another body
/// still holds it (copy on write), so a change never reaches another body. Serializes and
/// parses as the list it holds. Like [`SharedBlocks`](super::SharedBlocks), it keeps its items'
/// structural hashes once a flattener asked ([`SharedVec::block_hashes`]); every change drops
/// them. Debug-prints as the list it holds: the memo is filled by whichever flattener asks
/// first (another thread's, another run's), and a value's printed form is compared in debug
/// checks.
#[derive(Clone)]
pub struct SharedVec<T>(Arc<Listed<T>>);

impl<T: std::fmt::Debug> std::fmt::Debug for SharedVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.items.fmt(f)
    }
}

/// The list behind [`SharedVec`] and its memo of hashes.
#[derive(Debug)]
struct Listed<T> {
    items: Vec<T>,
    /// [`block_hash`](super::structural::block_hash) of each item under the tag it was asked
    /// for first.
    hashes: OnceLock<(&'static [u8], Box<[(u128, u32)]>)>,
}

impl<T> Listed<T> {
    fn new(items: Vec<T>) -> Listed<T> {
        Listed { items, hashes: OnceLock::new() }
    }
}

/// A copy (copy on write) is about to change: it starts without the memo.
impl<T: Clone> Clone for Listed<T> {
    fn clone(&self) -> Listed<T> {
        Listed::new(self.items.clone())
    }
}

impl<T> SharedVec<T> {
    /// Whether both hold the same allocation (then they are equal; unequal allocations may
    /// still hold equal lists).
    pub fn same(&self, other: &SharedVec<T>) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<T: Serialize> SharedVec<T> {
    /// [`block_hash`](super::structural::block_hash)`(tag, item)` of each item, computed the
    /// first time they are asked for and kept with the list (under that `tag`; another tag's
    /// are computed each time).
    pub fn block_hashes(&self, tag: &'static [u8]) -> std::borrow::Cow<'_, [(u128, u32)]> {
        let hash_all = || self.0.items.iter().map(|item| super::structural::block_hash(tag, item)).collect();
        let (kept_tag, hashes) = self.0.hashes.get_or_init(|| (tag, hash_all()));
        if *kept_tag == tag { std::borrow::Cow::Borrowed(hashes) } else { std::borrow::Cow::Owned(hash_all().into_vec()) }
    }
}

impl<T: Clone> SharedVec<T> {
    /// The list, taken without a copy when no other body holds it.
    pub fn into_vec(self) -> Vec<T> {
        Arc::try_unwrap(self.0).map_or_else(|shared| shared.items.clone(), |listed| listed.items)
    }
}

impl<T> Default for SharedVec<T> {
    fn default() -> Self {
        SharedVec::from(Vec::new())
    }
}

impl<T> Deref for SharedVec<T> {
    type Target = Vec<T>;
    fn deref(&self) -> &Vec<T> {
        &self.0.items
    }
}

impl<T: Clone> DerefMut for SharedVec<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        let listed = Arc::make_mut(&mut self.0);
        listed.hashes.take();
        &mut listed.items
    }
}

impl<T> From<Vec<T>> for SharedVec<T> {
    fn from(list: Vec<T>) -> Self {
        SharedVec(Arc::new(Listed::new(list)))
    }
}

impl<T> FromIterator<T> for SharedVec<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        SharedVec::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl<'a, T> IntoIterator for &'a SharedVec<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.items.iter()
    }
}

impl<T: PartialEq> PartialEq for SharedVec<T> {
    fn eq(&self, other: &Self) -> bool {
        self.same(other) || self.0.items == other.0.items
    }
}

impl<T: PartialEq> PartialEq<Vec<T>> for SharedVec<T> {
    fn eq(&self, other: &Vec<T>) -> bool {
        self.0.items == *other
    }
}

impl<T: Serialize> Serialize for SharedVec<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.items.serialize(serializer)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for SharedVec<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<T>::deserialize(deserializer).map(SharedVec::from)
    }
}

/// A system text block. The API only accepts `type: "text"` here; other types are kept as given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemBlock {
    #[serde(rename = "type", default = "text_type")]
    pub kind: String,
    #[serde(default)]
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<CacheControl>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn text_type() -> String {
    "text".to_owned()
}

impl SystemBlock {
    pub fn text(text: impl Into<String>) -> Self {
        SystemBlock { kind: text_type(), text: text.into(), cache_control: None, extra: Map::new() }
    }

    pub fn with_cache_control(mut self, cache_control: Option<CacheControl>) -> Self {
        self.cache_control = cache_control;
        self
    }
}

/// A tool definition: a custom tool (`name`, `description`, `input_schema`) or a server tool
/// identified by `type` (`web_search_20250305`, `tool_search_tool_regex_20251119`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<SharedValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<CacheControl>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defer_loading: Option<bool>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Tool {
    pub fn custom(name: impl Into<String>, description: impl Into<String>, input_schema: impl Into<SharedValue>) -> Self {
        Tool {
            kind: None,
            name: name.into(),
            description: Some(description.into()),
            input_schema: Some(input_schema.into()),
            cache_control: None,
            defer_loading: None,
            extra: Map::new(),
        }
    }

    /// True for server tools (a `type` other than `custom`).
    pub fn is_server_tool(&self) -> bool {
        matches!(&self.kind, Some(kind) if kind != "custom")
    }
}

/// `cache_control: {type, ttl?, scope?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheControl {
    #[serde(rename = "type", default = "ephemeral")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<CacheTtl>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<CacheScope>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn ephemeral() -> String {
    "ephemeral".to_owned()
}

impl CacheControl {
    pub fn ephemeral() -> Self {
        CacheControl { kind: ephemeral(), ttl: None, scope: None, extra: Map::new() }
    }

    pub fn with_ttl(mut self, ttl: Option<CacheTtl>) -> Self {
        self.ttl = ttl;
        self
    }

    pub fn with_scope(mut self, scope: Option<CacheScope>) -> Self {
        self.scope = scope;
        self
    }

    /// The TTL in force: `5m` when not given (the API default).
    pub fn ttl_or_default(&self) -> CacheTtl {
        self.ttl.unwrap_or(CacheTtl::FiveMinutes)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CacheTtl {
    #[serde(rename = "5m")]
    FiveMinutes,
    #[serde(rename = "1h")]
    OneHour,
}

impl CacheTtl {
    pub fn millis(self) -> u64 {
        match self {
            CacheTtl::FiveMinutes => 5 * 60 * 1000,
            CacheTtl::OneHour => 60 * 60 * 1000,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CacheTtl::FiveMinutes => "5m",
            CacheTtl::OneHour => "1h",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheScope {
    Global,
    Org,
}
