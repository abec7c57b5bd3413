//! The Messages API's streaming format (server-sent events): rendering a reply as the event
//! sequence the API sends, and reading such a stream back into the message it describes.
//!
//! Sequence: `message_start` (the message with empty content and the input side of `usage`),
//! `ping`, then per content block `content_block_start`, its deltas (`text_delta`,
//! `input_json_delta`, `thinking_delta` + `signature_delta`) and `content_block_stop`, then
//! `message_delta` (stop reason and the whole usage, as the current API reports it) and
//! `message_stop`. An `error` event ends a stream with an API error.

use serde_json::{Map, Value, json};

use crate::api::{ContentBlock, Response, StopReason, Usage};

/// Characters per delta. Deltas are split on character boundaries, so multi-byte text
/// survives; the real API's chunking varies, ours is fixed for determinism.
const DELTA_CHARS: usize = 48;

/// One event of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

fn push_event(out: &mut String, value: &Value) {
    let kind = value.get("type").and_then(Value::as_str).expect("every rendered event has a type");
    out.push_str("event: ");
    out.push_str(kind);
    out.push_str("\ndata: ");
    out.push_str(&serde_json::to_string(value).expect("events serialize"));
    out.push_str("\n\n");
}

/// Splits `text` into pieces of at most [`DELTA_CHARS`] characters (one empty piece for an
/// empty text, so the block still has a delta as the API sends it).
fn chunks(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (count, (i, _)) in text.char_indices().enumerate() {
        if count > 0 && count % DELTA_CHARS == 0 {
            out.push(&text[start..i]);
            start = i;
        }
    }
    if start < text.len() || out.is_empty() {
        out.push(&text[start..]);
    }
    out
}

fn usage_value(usage: &Usage) -> Value {
    serde_json::to_value(usage).expect("usage serializes")
}

/// The whole stream of `response`, as text.
pub fn render(response: &Response) -> String {
    let mut out = String::new();
    let mut start_usage = usage_value(&response.usage);
    // The API reports a provisional output count at the start; the final one comes last.
    start_usage["output_tokens"] = json!(1.min(response.usage.output_tokens));
    let message = json!({
        "id": response.id, "type": "message", "role": "assistant", "model": response.model,
        "content": [], "stop_reason": null, "stop_sequence": null, "usage": start_usage,
    });
    push_event(&mut out, &json!({"type": "message_start", "message": message}));
    push_event(&mut out, &json!({"type": "ping"}));
    for (index, block) in response.content.iter().enumerate() {
        let (start, deltas): (Value, Vec<Value>) = match block {
            ContentBlock::Text { text, .. } => (
                json!({"type": "text", "text": ""}),
                chunks(text).into_iter().map(|t| json!({"type": "text_delta", "text": t})).collect(),
            ),
            ContentBlock::ToolUse { id, name, input, .. } | ContentBlock::ServerToolUse { id, name, input, .. } => {
                let json = serde_json::to_string(input).expect("tool input serializes");
                (
                    json!({"type": block.kind(), "id": id, "name": name, "input": {}}),
                    chunks(&json).into_iter().map(|t| json!({"type": "input_json_delta", "partial_json": t})).collect(),
                )
            }
            ContentBlock::Thinking { thinking, signature, .. } => {
                let mut deltas: Vec<Value> =
                    chunks(thinking).into_iter().map(|t| json!({"type": "thinking_delta", "thinking": t})).collect();
                deltas.push(json!({"type": "signature_delta", "signature": signature}));
                (json!({"type": "thinking", "thinking": "", "signature": ""}), deltas)
            }
            // Other kinds (redacted thinking, ...) arrive whole in their start event.
            other => (serde_json::to_value(other).expect("blocks serialize"), Vec::new()),
        };
        push_event(&mut out, &json!({"type": "content_block_start", "index": index, "content_block": start}));
        for delta in deltas {
            push_event(&mut out, &json!({"type": "content_block_delta", "index": index, "delta": delta}));
        }
        push_event(&mut out, &json!({"type": "content_block_stop", "index": index}));
    }
    let stop_reason = response.stop_reason.map(StopReason::as_str);
    push_event(
        &mut out,
        &json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": response.stop_sequence},
                "usage": usage_value(&response.usage)}),
    );
    push_event(&mut out, &json!({"type": "message_stop"}));
    out
}

/// Splits a stream into its events. Lines other than `event:` and `data:` (comments, `id:`,
/// `retry:`) are skipped; several `data:` lines of one event are joined with newlines.
pub fn parse(text: &str) -> Vec<SseEvent> {
    let mut events = Vec::new();
    let mut event = String::new();
    let mut data: Vec<&str> = Vec::new();
    for line in text.lines().chain(std::iter::once("")) {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            if !data.is_empty() || !event.is_empty() {
                events.push(SseEvent { event: std::mem::take(&mut event), data: data.join("\n") });
                data.clear();
            }
            continue;
        }
        let field = |prefix: &str| line.strip_prefix(prefix).map(|rest| rest.strip_prefix(' ').unwrap_or(rest));
        if let Some(value) = field("event:") {
            event = value.to_owned();
        } else if let Some(value) = field("data:") {
            data.push(value);
        }
    }
    events
}

/// What went wrong reading a stream.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StreamError {
    /// The stream carried an `error` event: the API's error type and message.
    #[error("the API sent an error event: {kind}: {message}")]
    Api { kind: String, message: String },
    #[error("malformed stream at event {index} (`{event}`): {message}")]
    Malformed { index: usize, event: String, message: String },
}

/// Assembles the message a stream describes. Unknown event types are skipped (the API may add
/// new ones); a stream without `message_start` is malformed, and so is one that ends without
/// `message_stop` (a reply cut off by the network is not a finished reply).
pub fn assemble(events: &[SseEvent]) -> Result<Response, StreamError> {
    let mut message: Option<Map<String, Value>> = None;
    let mut blocks: Vec<Value> = Vec::new();
    let mut partial_json: Vec<String> = Vec::new();
    let mut stopped = false;
    for (index, event) in events.iter().enumerate() {
        let malformed = |message: String| StreamError::Malformed { index, event: event.event.clone(), message };
        let value: Value = serde_json::from_str(&event.data).map_err(|e| malformed(format!("data is not JSON: {e}")))?;
        let kind = value.get("type").and_then(Value::as_str).unwrap_or(event.event.as_str());
        let block_index = || -> Result<usize, StreamError> {
            let i = value.get("index").and_then(Value::as_u64).ok_or_else(|| malformed("missing field `index`".to_owned()))? as usize;
            if i < blocks.len() { Ok(i) } else { Err(malformed(format!("index {i} names no started block"))) }
        };
        match kind {
            "message_start" => {
                let Some(Value::Object(start)) = value.get("message") else { return Err(malformed("missing field `message`".to_owned())) };
                message = Some(start.clone());
            }
            "content_block_start" => {
                let block = value.get("content_block").cloned().ok_or_else(|| malformed("missing field `content_block`".to_owned()))?;
                blocks.push(block);
                partial_json.push(String::new());
            }
            "content_block_delta" => {
                let i = block_index()?;
                let delta = value.get("delta").ok_or_else(|| malformed("missing field `delta`".to_owned()))?;
                let text = |key: &str| delta.get(key).and_then(Value::as_str).ok_or_else(|| malformed(format!("missing field `delta.{key}`")));
                let mut append = |key: &str, piece: &str| {
                    let slot = &mut blocks[i][key];
                    let mut current = slot.as_str().unwrap_or("").to_owned();
                    current.push_str(piece);
                    *slot = Value::String(current);
                };
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => append("text", text("text")?),
                    Some("thinking_delta") => append("thinking", text("thinking")?),
                    Some("signature_delta") => append("signature", text("signature")?),
                    Some("input_json_delta") => partial_json[i].push_str(text("partial_json")?),
                    _ => {}
                }
            }
            "content_block_stop" => {
                let i = block_index()?;
                if !partial_json[i].is_empty() {
                    let input: Value = serde_json::from_str(&partial_json[i])
                        .map_err(|e| malformed(format!("tool input of block {i} is not JSON: {e}")))?;
                    blocks[i]["input"] = input;
                }
            }
            "message_delta" => {
                let Some(message) = message.as_mut() else { return Err(malformed("message_delta before message_start".to_owned())) };
                if let Some(Value::Object(delta)) = value.get("delta") {
                    for (k, v) in delta {
                        message.insert(k.clone(), v.clone());
                    }
                }
                if let Some(Value::Object(usage)) = value.get("usage") {
                    let base = message.entry("usage").or_insert_with(|| Value::Object(Map::new()));
                    if let Value::Object(base) = base {
                        for (k, v) in usage {
                            // A null in a delta means "not reported here", not zero.
                            if !v.is_null() {
                                base.insert(k.clone(), v.clone());
                            }
                        }
                    }
                }
            }
            "message_stop" => stopped = true,
            "error" => {
                let error = value.get("error");
                let field = |key: &str| error.and_then(|e| e.get(key)).and_then(Value::as_str).unwrap_or("").to_owned();
                return Err(StreamError::Api { kind: field("type"), message: field("message") });
            }
            _ => {}
        }
    }
    let Some(mut message) = message else {
        return Err(StreamError::Malformed { index: events.len(), event: String::new(), message: "no message_start event".to_owned() });
    };
    if !stopped {
        return Err(StreamError::Malformed {
            index: events.len(),
            event: events.last().map_or_else(String::new, |e| e.event.clone()),
            message: format!("the stream ended after {} events without message_stop: the reply was cut off", events.len()),
        });
    }
    message.insert("content".to_owned(), Value::Array(blocks));
    serde_json::from_value(Value::Object(message))
        .map_err(|e| StreamError::Malformed { index: events.len(), event: "message_stop".to_owned(), message: e.to_string() })
}

/// Reads a whole stream's text into its message.
pub fn read_stream(text: &str) -> Result<Response, StreamError> {
    assemble(&parse(text))
}
