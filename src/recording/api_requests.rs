//! The wire requests Claude Code 2.1.2xx/3xx writes into its transcripts, and each request
//! rebuilt from them (reference/current-client-and-api.md §3.7, docs/recording-format.md
//! "Recorded wire requests").
//!
//! Three record kinds carry them:
//! - `api-request-shape` {`shapeHash`, `shape{system, tools}`}: the system blocks (without the
//!   billing block) and the tools array;
//! - `api-request-blob` {`hash`, `message`}: one message, content-addressed;
//! - `api-request` {`id`, `querySource`, `shapeHash`, `params`, `thread`, `base`, `keep`, `tail`,
//!   `cacheControl[{path, value}]`, `requestDigest`}: the messages are the first `keep` messages
//!   of request `base` followed by the messages whose hashes `tail` lists.
//!
//! Facts read off the 2.1.332 captures (tests/data/api-requests/) and relied on here:
//! - A hash is the SHA-256 of the message as compact JSON with its keys sorted at every depth,
//!   every field kept (a system message carries `output_config`), its content as a block list
//!   (a string content counts as one text block) and no `cache_control`. Shapes are hashed the
//!   same way.
//! - A tail hash without a blob is a message the ordinary records hold as sent: an assistant
//!   reply (its streamed lines merged by `message.id`) or a user record. A message the client
//!   changed on the wire (a tool result with a reminder beside it) has a blob.
//! - On the wire a `user` or `system` message whose content is one text block without a
//!   marker is sent as a plain string; every other message as a block list.
//! - `cacheControl` paths into `system` count the shape's blocks; the wire's system starts with
//!   the billing block, so they land one block later.
//! - The billing block is `x-anthropic-billing-header: cc_version=<version>.<fp>;
//!   cc_entrypoint=<entrypoint>;` (`cc_is_subagent=true;` appended for a subagent's request),
//!   `<fp>` the attribution fingerprint of the first user message's prompt text
//!   ([`crate::agent::system_prompt::fingerprint`]). Base-URL mode only: first-party requests
//!   carry per-request values no transcript records.

use std::collections::BTreeMap;
use std::rc::Rc;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::api::Request;

/// The record kinds of this module.
pub const API_REQUEST_KINDS: [&str; 3] = ["api-request", "api-request-shape", "api-request-blob"];

/// Record kinds of 2.1.2xx/3xx transcripts the importer reads and counts but does not use:
/// none of them holds anything that was sent to the model (queue bookkeeping is read as
/// `queue-operation`, `last-prompt` as metadata).
pub const NOT_USED_KINDS: [&str; 3] = ["atis-latch", "cost-state", "tools-used"];

/// One `api-request-shape`: the system blocks after the billing block, and the tools.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedShape {
    pub system: Vec<Value>,
    pub tools: Vec<Value>,
}

/// One step of a `cacheControl` path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathStep {
    Key(String),
    Index(usize),
}

/// One `api-request` record.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedApiRequest {
    pub id: String,
    /// Where it was read, for messages: file and line.
    pub file: String,
    pub line: usize,
    pub query_source: Option<String>,
    pub shape_hash: String,
    pub model: String,
    /// `params` without `model` and `betas`: the body fields (`max_tokens`, `thinking`,
    /// `context_management`, `output_config`, …) as recorded.
    pub body_params: Map<String, Value>,
    /// `params.betas`: the `anthropic-beta` header, not part of the body.
    pub betas: Vec<String>,
    pub thread: Option<Value>,
    pub base: Option<String>,
    pub keep: usize,
    pub tail: Vec<String>,
    pub cache_control: Vec<(Vec<PathStep>, Value)>,
    pub request_digest: Option<String>,
    pub version: Option<String>,
    /// The file's `entrypoint` (billing block), when a record of the file named one.
    pub entrypoint: Option<String>,
}

/// What a transcript recorded of its wire requests, over every file of a session.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApiRequests {
    pub shapes: BTreeMap<String, RecordedShape>,
    pub blobs: BTreeMap<String, Value>,
    pub requests: BTreeMap<String, RecordedApiRequest>,
    /// The ordinary records' messages by the same hash, for tail hashes without a blob.
    pub record_messages: BTreeMap<String, Value>,
}

/// A field that is missing or has the wrong type: (field path, message).
pub type FieldError = (String, String);

fn field<'v>(record: &'v Map<String, Value>, name: &str) -> Result<&'v Value, FieldError> {
    record.get(name).ok_or_else(|| (name.to_owned(), format!("missing field `{name}`")))
}

fn string_field(record: &Map<String, Value>, name: &str) -> Result<String, FieldError> {
    match field(record, name)? {
        Value::String(s) => Ok(s.clone()),
        other => Err((name.to_owned(), format!("`{name}` must be a string, found {}", kind(other)))),
    }
}

use crate::api::json_kind as kind;

/// A value with its object keys sorted at every depth (the crate keeps insertion order).
fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(keys.into_iter().map(|k| (k.clone(), sorted(&map[k]))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// The SHA-256 (hex) of a value as the client hashes it: compact JSON, keys sorted.
pub fn content_hash(value: &Value) -> String {
    let text = serde_json::to_string(&sorted(value)).expect("JSON values serialize");
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A message as it is hashed: every field (a system message's `output_config` too), the
/// content as a block list, no `cache_control`.
pub fn hashed_form(message: &Value) -> Value {
    let Value::Object(map) = message else { return message.clone() };
    Value::Object(
        map.iter()
            .filter(|(k, _)| *k != "cache_control")
            .map(|(k, v)| {
                let v = match (k.as_str(), v) {
                    ("content", Value::String(text)) => json!([{"type": "text", "text": text}]),
                    _ => crate::shape::without_cache_control(v),
                };
                (k.clone(), v)
            })
            .collect(),
    )
}

/// The hash of a message of the ordinary records (see [`hashed_form`]).
pub fn message_hash(message: &Value) -> String {
    content_hash(&hashed_form(message))
}

/// Reads an `api-request-shape` record.
pub fn parse_shape(record: &Map<String, Value>) -> Result<(String, RecordedShape), FieldError> {
    let hash = string_field(record, "shapeHash")?;
    let shape = match field(record, "shape")? {
        Value::Object(shape) => shape,
        other => return Err(("shape".into(), format!("`shape` must be an object, found {}", kind(other)))),
    };
    let list = |name: &str| -> Result<Vec<Value>, FieldError> {
        match shape.get(name) {
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    if !item.is_object() {
                        return Err((format!("shape.{name}[{i}]"), format!("must be an object, found {}", kind(item))));
                    }
                }
                Ok(items.clone())
            }
            None => Err((format!("shape.{name}"), format!("missing field `shape.{name}`"))),
            Some(other) => Err((format!("shape.{name}"), format!("must be an array, found {}", kind(other)))),
        }
    };
    let parsed = RecordedShape { system: list("system")?, tools: list("tools")? };
    let actual = content_hash(&Value::Object(shape.clone()));
    if actual != hash {
        return Err(("shapeHash".into(), format!("`shapeHash` {hash} is not the hash of `shape` ({actual})")));
    }
    Ok((hash, parsed))
}

/// Reads an `api-request-blob` record.
pub fn parse_blob(record: &Map<String, Value>) -> Result<(String, Value), FieldError> {
    let hash = string_field(record, "hash")?;
    let message = field(record, "message")?;
    let Value::Object(map) = message else {
        return Err(("message".into(), format!("`message` must be an object, found {}", kind(message))));
    };
    match map.get("role") {
        Some(Value::String(role)) if matches!(role.as_str(), "user" | "assistant" | "system") => {}
        Some(other) => return Err(("message.role".into(), format!("`message.role` must be user, assistant or system, found {other}"))),
        None => return Err(("message.role".into(), "missing field `message.role`".into())),
    }
    match map.get("content") {
        Some(Value::String(_) | Value::Array(_)) => {}
        Some(other) => return Err(("message.content".into(), format!("`message.content` must be a string or an array, found {}", kind(other)))),
        None => return Err(("message.content".into(), "missing field `message.content`".into())),
    }
    let actual = message_hash(message);
    if actual != hash {
        return Err(("hash".into(), format!("`hash` {hash} is not the hash of `message` ({actual})")));
    }
    Ok((hash, message.clone()))
}

fn parse_path(value: &Value, at: &str) -> Result<Vec<PathStep>, FieldError> {
    let Value::Array(items) = value else { return Err((at.to_owned(), format!("must be an array, found {}", kind(value)))) };
    let mut steps = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        steps.push(match item {
            Value::String(key) => PathStep::Key(key.clone()),
            Value::Number(n) => match n.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) => PathStep::Index(n),
                None => return Err((format!("{at}[{i}]"), format!("must be a key or an index, found {n}"))),
            },
            other => return Err((format!("{at}[{i}]"), format!("must be a key or an index, found {}", kind(other)))),
        });
    }
    match steps.first() {
        Some(PathStep::Key(root)) if root == "system" || root == "messages" || root == "tools" => Ok(steps),
        _ => Err((at.to_owned(), "must start with `system`, `messages` or `tools`".into())),
    }
}

/// Reads an `api-request` record (`file`, `line` and `entrypoint` are the caller's).
pub fn parse_request(record: &Map<String, Value>, file: &str, line: usize, entrypoint: Option<String>) -> Result<RecordedApiRequest, FieldError> {
    let id = string_field(record, "id")?;
    let shape_hash = string_field(record, "shapeHash")?;
    let params = match field(record, "params")? {
        Value::Object(p) => p,
        other => return Err(("params".into(), format!("`params` must be an object, found {}", kind(other)))),
    };
    let model = match params.get("model") {
        Some(Value::String(m)) => m.clone(),
        Some(other) => return Err(("params.model".into(), format!("must be a string, found {}", kind(other)))),
        None => return Err(("params.model".into(), "missing field `params.model`".into())),
    };
    let betas = match params.get("betas") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            let mut out = Vec::new();
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) => out.push(s.clone()),
                    other => return Err((format!("params.betas[{i}]"), format!("must be a string, found {}", kind(other)))),
                }
            }
            out
        }
        Some(other) => return Err(("params.betas".into(), format!("must be an array, found {}", kind(other)))),
    };
    if let Some(v) = params.get("max_tokens")
        && !v.is_u64()
    {
        return Err(("params.max_tokens".into(), format!("must be a non-negative integer, found {v}")));
    }
    let body_params: Map<String, Value> = params.iter().filter(|(k, _)| *k != "model" && *k != "betas").map(|(k, v)| (k.clone(), v.clone())).collect();
    let base = match record.get("base") {
        None | Some(Value::Null) => None,
        Some(Value::String(b)) => Some(b.clone()),
        Some(other) => return Err(("base".into(), format!("`base` must be a request id, found {}", kind(other)))),
    };
    let keep = match record.get("keep") {
        None if base.is_none() => 0,
        None => return Err(("keep".into(), "missing field `keep` beside `base`".into())),
        Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) => n,
            None => return Err(("keep".into(), format!("`keep` must be a non-negative integer, found {v}"))),
        },
    };
    if base.is_none() && keep > 0 {
        return Err(("keep".into(), format!("`keep` is {keep} but the record names no `base`")));
    }
    let tail = match field(record, "tail")? {
        Value::Array(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(h) => out.push(h.clone()),
                    other => return Err((format!("tail[{i}]"), format!("must be a message hash, found {}", kind(other)))),
                }
            }
            out
        }
        other => return Err(("tail".into(), format!("`tail` must be an array, found {}", kind(other)))),
    };
    let cache_control = match record.get("cacheControl") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let at = format!("cacheControl[{i}]");
                let Value::Object(entry) = item else { return Err((at, format!("must be an object, found {}", kind(item)))) };
                let path = parse_path(entry.get("path").unwrap_or(&Value::Null), &format!("{at}.path"))?;
                let value = match entry.get("value") {
                    Some(v @ Value::Object(_)) => v.clone(),
                    Some(other) => return Err((format!("{at}.value"), format!("must be an object, found {}", kind(other)))),
                    None => return Err((format!("{at}.value"), format!("missing field `{at}.value`"))),
                };
                out.push((path, value));
            }
            out
        }
        Some(other) => return Err(("cacheControl".into(), format!("`cacheControl` must be an array, found {}", kind(other)))),
    };
    let optional_string = |name: &str| -> Result<Option<String>, FieldError> {
        match record.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err((name.to_owned(), format!("`{name}` must be a string, found {}", kind(other)))),
        }
    };
    Ok(RecordedApiRequest {
        id,
        file: file.to_owned(),
        line,
        query_source: optional_string("querySource")?,
        shape_hash,
        model,
        body_params,
        betas,
        thread: record.get("thread").cloned(),
        base,
        keep,
        tail,
        cache_control,
        request_digest: optional_string("requestDigest")?,
        version: optional_string("version")?,
        entrypoint,
    })
}

/// A request rebuilt from the records: the body, and the `anthropic-beta` header.
#[derive(Debug, Clone, PartialEq)]
pub struct RebuiltRequest {
    pub body: Value,
    pub betas: Vec<String>,
}

impl RebuiltRequest {
    /// The body as the crate's request type.
    pub fn request(&self) -> Result<Request, String> {
        serde_json::from_value(self.body.clone()).map_err(|e| format!("the rebuilt body is not a request: {e}"))
    }

}

/// A request's messages in their hashed form, shared with the requests that extend it.
type Messages = Rc<Vec<Rc<Value>>>;

/// Rebuilds requests from [`ApiRequests`], keeping each request's messages for the requests
/// that extend it.
pub struct Rebuilder<'a> {
    records: &'a ApiRequests,
    memo: BTreeMap<String, Result<Messages, String>>,
}

impl<'a> Rebuilder<'a> {
    pub fn new(records: &'a ApiRequests) -> Self {
        Rebuilder { records, memo: BTreeMap::new() }
    }

    fn resolve(&self, hash: &str) -> Option<&'a Value> {
        self.records.blobs.get(hash).or_else(|| self.records.record_messages.get(hash))
    }

    /// The messages of request `id` in their hashed form (block lists, no markers).
    fn messages(&mut self, id: &str) -> Result<Messages, String> {
        // The chain back to a request already known (or to one without a base), then forward.
        let mut chain: Vec<&'a RecordedApiRequest> = Vec::new();
        let mut at = id.to_owned();
        loop {
            if self.memo.contains_key(&at) {
                break;
            }
            let Some(request) = self.records.requests.get(&at) else {
                return Err(format!("request {at} is not recorded"));
            };
            if chain.len() > self.records.requests.len() {
                return Err(format!("request {id}: its `base` chain loops"));
            }
            chain.push(request);
            match &request.base {
                Some(base) => at = base.clone(),
                None => break,
            }
        }
        for request in chain.into_iter().rev() {
            let built = self.extend(request);
            self.memo.insert(request.id.clone(), built);
        }
        self.memo.get(id).cloned().unwrap_or_else(|| Err(format!("request {id} is not recorded")))
    }

    fn extend(&self, request: &RecordedApiRequest) -> Result<Messages, String> {
        let mut messages: Vec<Rc<Value>> = match &request.base {
            Some(base) => {
                let earlier = self.memo.get(base).cloned().unwrap_or_else(|| Err(format!("base request {base} is not recorded")));
                let earlier = earlier.map_err(|why| format!("{}:{}: base {base}: {why}", request.file, request.line))?;
                if request.keep > earlier.len() {
                    return Err(format!("{}:{}: keep: {} messages kept of base {base}, which has {}", request.file, request.line, request.keep, earlier.len()));
                }
                earlier[..request.keep].to_vec()
            }
            None => Vec::new(),
        };
        for (i, hash) in request.tail.iter().enumerate() {
            match self.resolve(hash) {
                Some(message) => messages.push(Rc::new(hashed_form(message))),
                None => return Err(format!("{}:{}: tail[{i}]: message {hash} has no blob and no transcript record", request.file, request.line)),
            }
        }
        Ok(Rc::new(messages))
    }

    /// Request `id` as it was sent, or why it cannot be rebuilt exactly.
    pub fn rebuild(&mut self, id: &str) -> Result<RebuiltRequest, String> {
        let messages = self.messages(id)?;
        let request = &self.records.requests[id];
        let at = format!("{}:{}", request.file, request.line);
        let shape = self.records.shapes.get(&request.shape_hash).ok_or_else(|| format!("{at}: shapeHash: no api-request-shape {}", request.shape_hash))?;
        let mut messages: Vec<Value> = messages.iter().map(|m| (**m).clone()).collect();
        let version = request.version.as_deref().ok_or_else(|| format!("{at}: version: the record names no client version (the billing block needs it)"))?;
        let entrypoint = request.entrypoint.as_deref().ok_or_else(|| format!("{at}: entrypoint: no record of the file names the client's entrypoint (the billing block needs it)"))?;
        let billing = billing_text(version, entrypoint, &messages, request.query_source.as_deref().is_some_and(|q| q.starts_with("agent:")));
        let mut system = vec![json!({"type": "text", "text": billing})];
        system.extend(shape.system.iter().cloned());
        let mut tools = shape.tools.clone();
        for (i, (path, value)) in request.cache_control.iter().enumerate() {
            let target = match path.split_first() {
                Some((PathStep::Key(root), rest)) if root == "system" => match rest.split_first() {
                    Some((PathStep::Index(n), rest)) => locate(&mut system, *n + 1, rest),
                    _ => None,
                },
                Some((PathStep::Key(root), rest)) if root == "tools" => match rest.split_first() {
                    Some((PathStep::Index(n), rest)) => locate(&mut tools, *n, rest),
                    _ => None,
                },
                Some((PathStep::Key(_), rest)) => match rest.split_first() {
                    Some((PathStep::Index(n), rest)) => locate(&mut messages, *n, rest),
                    _ => None,
                },
                _ => None,
            };
            match target {
                Some(Value::Object(block)) => {
                    block.insert("cache_control".into(), value.clone());
                }
                _ => return Err(format!("{at}: cacheControl[{i}].path: no block at {}", render_path(path))),
            }
        }
        for message in &mut messages {
            wire_form(message);
        }
        let mut body = Map::new();
        body.insert("model".into(), Value::String(request.model.clone()));
        body.insert("messages".into(), Value::Array(messages));
        body.insert("system".into(), Value::Array(system));
        body.insert("tools".into(), Value::Array(tools));
        for (key, value) in &request.body_params {
            body.insert(key.clone(), value.clone());
        }
        // Claude Code always streams; `metadata.user_id` is not recorded (and is no part of
        // the cache key).
        body.insert("stream".into(), Value::Bool(true));
        Ok(RebuiltRequest { body: Value::Object(body), betas: request.betas.clone() })
    }
}

fn render_path(path: &[PathStep]) -> String {
    path.iter()
        .map(|s| match s {
            PathStep::Key(k) => k.clone(),
            PathStep::Index(i) => i.to_string(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The value at `rest` inside `items[index]` (messages are stored as block lists, so a
/// `content` index always finds its block).
fn locate<'v>(items: &'v mut [Value], index: usize, rest: &[PathStep]) -> Option<&'v mut Value> {
    let mut at = items.get_mut(index)?;
    for step in rest {
        at = match step {
            PathStep::Key(k) => at.get_mut(k.as_str())?,
            PathStep::Index(i) => at.get_mut(*i)?,
        };
    }
    Some(at)
}

/// A user or system message of one text block without a marker goes out as a string.
fn wire_form(message: &mut Value) {
    let role = message.get("role").and_then(Value::as_str).unwrap_or("");
    if role != "user" && role != "system" {
        return;
    }
    let text = match message.get("content") {
        Some(Value::Array(blocks)) if blocks.len() == 1 => match blocks[0].as_object() {
            Some(block) if block.len() == 2 && block.get("type").and_then(Value::as_str) == Some("text") => block.get("text").and_then(Value::as_str).map(str::to_owned),
            _ => None,
        },
        _ => None,
    };
    if let Some(text) = text {
        message["content"] = Value::String(text);
    }
}

/// The billing block's text: the fingerprint of the first user message's prompt text (its
/// first text block that is not a `<system-reminder>`, else its last text block).
fn billing_text(version: &str, entrypoint: &str, messages: &[Value], subagent: bool) -> String {
    let texts: Vec<&str> = messages
        .first()
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect();
    let prompt = texts.iter().find(|t| !t.starts_with("<system-reminder>")).or(texts.last()).copied().unwrap_or("");
    let fingerprint = crate::agent::system_prompt::fingerprint(prompt, version);
    let mut text = format!("x-anthropic-billing-header: cc_version={version}.{fingerprint}; cc_entrypoint={entrypoint};");
    if subagent {
        text.push_str(" cc_is_subagent=true;");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_sorts_keys_and_lists_string_content() {
        let a = json!({"role": "user", "content": "hi"});
        let b = json!({"content": [{"text": "hi", "type": "text", "cache_control": {"type": "ephemeral"}}], "role": "user"});
        assert_eq!(message_hash(&a), message_hash(&b));
        assert_ne!(message_hash(&a), message_hash(&json!({"role": "user", "content": "ho"})));
    }

    #[test]
    fn hash_keeps_a_system_messages_effort() {
        let plain = json!({"role": "system", "content": "x"});
        let with_effort = json!({"role": "system", "content": "x", "output_config": {"effort": "medium"}});
        assert_ne!(message_hash(&plain), message_hash(&with_effort));
        assert_eq!(hashed_form(&with_effort)["output_config"], json!({"effort": "medium"}));
    }

    #[test]
    fn wire_form_flips_single_unmarked_text() {
        let mut m = json!({"role": "system", "content": [{"type": "text", "text": "x"}]});
        wire_form(&mut m);
        assert_eq!(m, json!({"role": "system", "content": "x"}));
        let mut marked = json!({"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]});
        let before = marked.clone();
        wire_form(&mut marked);
        assert_eq!(marked, before);
        let mut assistant = json!({"role": "assistant", "content": [{"type": "text", "text": "x"}]});
        let before = assistant.clone();
        wire_form(&mut assistant);
        assert_eq!(assistant, before);
    }
}
