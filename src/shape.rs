//! Request shapes: a request body rendered structurally, without its texts (lane, top-level
//! keys, system blocks, tools, messages: kinds, sizes, cache_control, reminder markers, and
//! where it stops extending the previous request of its lane), and the diff of two sequences
//! of shapes within a size tolerance. `ctxsim diff-requests` and the real-client conformance
//! test (tests/it/real_client.rs) compare request logs with it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::Request;
use crate::recording::format::{LineWarning, RawLines, WarningKind, Warnings};

/// Marker strings that name a reminder or attachment kind (facts of the wire format, first
/// match per marker kept; a block may carry several).
const MARKERS: &[(&str, &str)] = &[
    ("<available-deferred-tools>", "deferred_tools"),
    ("Skill tool", "skill_listing"),
    ("# claudeMd", "claude_md"),
    ("# currentDate", "current_date"),
    ("Contents of ", "file_contents"),
    ("malware", "read_caution"),
    ("Called the Read tool", "restored_read_call"),
    ("Result of calling the Read tool", "restored_read_result"),
    ("<system-reminder>", "system_reminder"),
];

/// One block: kind, size in characters (its text, a tool_result's content, a tool_use's input
/// as JSON), its cache_control rendered (`ephemeral`, `ephemeral/global`, `ephemeral/1h`), and
/// the markers its text contains.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockShape {
    pub kind: String,
    pub chars: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub markers: Vec<String>,
    /// A tool_use's (or server_tool_use's) tool name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A tool_result's `is_error` (absent on the wire: false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    /// A tool_result's content form: `string`, `blocks`, or `none` (no content).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_form: Option<String>,
}

impl BlockShape {
    /// A text block of `text` (a string system prompt or string content).
    fn text(text: &str) -> BlockShape {
        BlockShape { kind: "text".to_owned(), chars: text.chars().count(), cache_control: None, markers: markers(text), name: None, is_error: None, content_form: None }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolShape {
    pub name: String,
    pub chars: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    #[serde(default)]
    pub defer_loading: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageShape {
    pub role: String,
    /// Content sent as a plain string rather than a block list.
    pub string: bool,
    pub blocks: Vec<BlockShape>,
}

/// A request without its texts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestShape {
    pub lane: String,
    pub keys: Vec<String>,
    pub system: Vec<BlockShape>,
    pub tools: Vec<ToolShape>,
    pub messages: Vec<MessageShape>,
    /// Where this request stops extending the previous request of its lane (cache_control left
    /// out): `None` for an append (or the lane's first request), else a path like `system[0]`,
    /// `tools`, `messages[2]` (the message whose content changed or is gone).
    pub diverges_at: Option<String>,
}

fn cache_control(block: &Value) -> Option<String> {
    let cc = block.get("cache_control")?;
    let mut out = cc.get("type").and_then(Value::as_str).unwrap_or("?").to_owned();
    for key in ["scope", "ttl"] {
        if let Some(v) = cc.get(key).and_then(Value::as_str) {
            out.push('/');
            out.push_str(v);
        }
    }
    Some(out)
}

fn markers(text: &str) -> Vec<String> {
    MARKERS.iter().filter(|(m, _)| text.contains(m)).map(|(_, k)| (*k).to_owned()).collect()
}

fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(|i| i.get("text").and_then(Value::as_str).map_or_else(|| i.to_string(), str::to_owned)).collect::<Vec<_>>().join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn block_shape(block: &Value) -> BlockShape {
    let kind = block.get("type").and_then(Value::as_str).unwrap_or("?").to_owned();
    let text = match kind.as_str() {
        "text" => block.get("text").map(text_of).unwrap_or_default(),
        "tool_result" => block.get("content").map(text_of).unwrap_or_default(),
        "tool_use" => block.get("input").map(Value::to_string).unwrap_or_default(),
        "thinking" => block.get("thinking").map(text_of).unwrap_or_default(),
        _ => block.to_string(),
    };
    let name = matches!(kind.as_str(), "tool_use" | "server_tool_use").then(|| block.get("name").and_then(Value::as_str).unwrap_or("?").to_owned());
    let (is_error, content_form) = if kind == "tool_result" {
        let form = match block.get("content") {
            None | Some(Value::Null) => "none",
            Some(Value::String(_)) => "string",
            Some(_) => "blocks",
        };
        (Some(block.get("is_error").and_then(Value::as_bool).unwrap_or(false)), Some(form.to_owned()))
    } else {
        (None, None)
    };
    BlockShape { kind, chars: text.chars().count(), cache_control: cache_control(block), markers: markers(&text), name, is_error, content_form }
}

/// A value with every `cache_control` key left out, at any depth.
pub fn without_cache_control(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(map.iter().filter(|(k, _)| *k != "cache_control").map(|(k, v)| (k.clone(), without_cache_control(v))).collect()),
        Value::Array(items) => Value::Array(items.iter().map(without_cache_control).collect()),
        other => other.clone(),
    }
}

/// A message's content as a block list (a string is one text block), markers left out.
fn content_blocks(message: &Value) -> Vec<Value> {
    match message.get("content") {
        Some(Value::String(s)) => vec![serde_json::json!({"type": "text", "text": s})],
        Some(Value::Array(items)) => items.iter().map(without_cache_control).collect(),
        _ => Vec::new(),
    }
}

/// Where `body` stops extending `previous`, in the order tools → system → messages.
fn divergence(previous: &Value, body: &Value) -> Option<String> {
    let list = |v: &Value, key: &str| v.get(key).and_then(Value::as_array).cloned().unwrap_or_default();
    let (pt, bt) = (list(previous, "tools"), list(body, "tools"));
    if pt.iter().map(without_cache_control).ne(bt.iter().map(without_cache_control)) {
        return Some("tools".to_owned());
    }
    let (ps, bs) = (list(previous, "system"), list(body, "system"));
    for i in 0..ps.len().max(bs.len()) {
        if ps.get(i).map(without_cache_control) != bs.get(i).map(without_cache_control) {
            return Some(format!("system[{i}]"));
        }
    }
    let (pm, bm) = (list(previous, "messages"), list(body, "messages"));
    for (i, before) in pm.iter().enumerate() {
        let Some(after) = bm.get(i) else { return Some(format!("messages[{i}]")) };
        if before.get("role") != after.get("role") || content_blocks(before) != content_blocks(after) {
            return Some(format!("messages[{i}]"));
        }
    }
    None
}

/// Renders a sequence of request bodies with their lanes.
pub fn shapes<'a>(requests: impl IntoIterator<Item = (&'a str, Value)>) -> Vec<RequestShape> {
    let mut last: std::collections::BTreeMap<String, Value> = std::collections::BTreeMap::new();
    let mut out = Vec::new();
    for (lane, body) in requests {
        let keys = body.as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
        let system = match body.get("system") {
            Some(Value::String(s)) => vec![BlockShape::text(s)],
            Some(Value::Array(items)) => items.iter().map(block_shape).collect(),
            _ => Vec::new(),
        };
        let tools = body.get("tools").and_then(Value::as_array).map_or_else(Vec::new, |tools| {
            tools
                .iter()
                .map(|t| ToolShape {
                    name: t.get("name").and_then(Value::as_str).unwrap_or("?").to_owned(),
                    chars: without_cache_control(t).to_string().chars().count(),
                    cache_control: cache_control(t),
                    defer_loading: t.get("defer_loading").and_then(Value::as_bool).unwrap_or(false),
                })
                .collect()
        });
        let messages = body.get("messages").and_then(Value::as_array).map_or_else(Vec::new, |messages| {
            messages
                .iter()
                .map(|m| {
                    let role = m.get("role").and_then(Value::as_str).unwrap_or("?").to_owned();
                    match m.get("content") {
                        Some(Value::String(s)) => MessageShape { role, string: true, blocks: vec![BlockShape::text(s)] },
                        Some(Value::Array(items)) => MessageShape { role, string: false, blocks: items.iter().map(block_shape).collect() },
                        _ => MessageShape { role, string: false, blocks: Vec::new() },
                    }
                })
                .collect()
        });
        let diverges_at = last.get(lane).and_then(|previous| divergence(previous, &body));
        out.push(RequestShape { lane: lane.to_owned(), keys, system, tools, messages, diverges_at });
        last.insert(lane.to_owned(), body);
    }
    out
}

/// Shapes of typed requests (as sent: serialized) with their lanes.
pub fn shapes_of(requests: &[(String, Request)]) -> Vec<RequestShape> {
    shapes(requests.iter().map(|(lane, r)| (lane.as_str(), serde_json::to_value(r).expect("requests serialize"))))
}

/// How far sizes may differ: `|a − b| ≤ max(slack, fraction · max(a, b))`.
#[derive(Debug, Clone, Copy)]
pub struct Tolerance {
    pub fraction: f64,
    pub slack: usize,
}

impl Default for Tolerance {
    /// 25% or 64 characters: our texts are our own, padded to the reference's sizes, and paths
    /// and ids differ in length between runs.
    fn default() -> Self {
        Tolerance { fraction: 0.25, slack: 64 }
    }
}

impl Tolerance {
    fn sizes_agree(&self, a: usize, b: usize) -> bool {
        let diff = a.abs_diff(b);
        diff <= self.slack || (diff as f64) <= self.fraction * a.max(b) as f64
    }
}

/// One structural difference: the request index, the path, and both sides rendered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Difference {
    pub request: usize,
    pub path: String,
    pub left: String,
    pub right: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "request {} {}: {} ≠ {}", self.request, self.path, self.left, self.right)
    }
}

fn same<T: PartialEq + std::fmt::Debug>(out: &mut Vec<Difference>, request: usize, path: String, a: &T, b: &T) {
    if a != b {
        out.push(Difference { request, path, left: format!("{a:?}"), right: format!("{b:?}") });
    }
}

fn blocks(out: &mut Vec<Difference>, request: usize, path: &str, a: &[BlockShape], b: &[BlockShape], tol: Tolerance) {
    same(out, request, format!("{path}.len"), &a.len(), &b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        same(out, request, format!("{path}[{i}].kind"), &x.kind, &y.kind);
        same(out, request, format!("{path}[{i}].cache_control"), &x.cache_control, &y.cache_control);
        same(out, request, format!("{path}[{i}].markers"), &x.markers, &y.markers);
        // Compared where both sides know them: shapes written before these fields existed
        // (older fixtures) carry none.
        if let (Some(a), Some(b)) = (&x.name, &y.name) {
            same(out, request, format!("{path}[{i}].name"), a, b);
        }
        if let (Some(a), Some(b)) = (&x.is_error, &y.is_error) {
            same(out, request, format!("{path}[{i}].is_error"), a, b);
        }
        if let (Some(a), Some(b)) = (&x.content_form, &y.content_form) {
            same(out, request, format!("{path}[{i}].content_form"), a, b);
        }
        if !tol.sizes_agree(x.chars, y.chars) {
            out.push(Difference { request, path: format!("{path}[{i}].chars"), left: x.chars.to_string(), right: y.chars.to_string() });
        }
    }
}

/// Compares two sequences request by request; an empty result means they agree structurally.
pub fn diff(left: &[RequestShape], right: &[RequestShape], tol: Tolerance) -> Vec<Difference> {
    let mut out = Vec::new();
    same(&mut out, 0, "requests".to_owned(), &left.len(), &right.len());
    for (r, (a, b)) in left.iter().zip(right).enumerate() {
        same(&mut out, r, "lane".to_owned(), &a.lane, &b.lane);
        same(&mut out, r, "keys".to_owned(), &a.keys, &b.keys);
        same(&mut out, r, "diverges_at".to_owned(), &a.diverges_at, &b.diverges_at);
        blocks(&mut out, r, "system", &a.system, &b.system, tol);
        let names = |s: &RequestShape| s.tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        same(&mut out, r, "tools.names".to_owned(), &names(a), &names(b));
        let marks = |s: &RequestShape| s.tools.iter().map(|t| (t.cache_control.clone(), t.defer_loading)).collect::<Vec<_>>();
        same(&mut out, r, "tools.cache_control_defer_loading".to_owned(), &marks(a), &marks(b));
        let size = |s: &RequestShape| s.tools.iter().map(|t| t.chars).sum::<usize>();
        if !tol.sizes_agree(size(a), size(b)) {
            out.push(Difference { request: r, path: "tools.chars".to_owned(), left: size(a).to_string(), right: size(b).to_string() });
        }
        same(&mut out, r, "messages.len".to_owned(), &a.messages.len(), &b.messages.len());
        for (i, (x, y)) in a.messages.iter().zip(&b.messages).enumerate() {
            same(&mut out, r, format!("messages[{i}].role"), &x.role, &y.role);
            same(&mut out, r, format!("messages[{i}].string"), &x.string, &y.string);
            blocks(&mut out, r, &format!("messages[{i}].content"), &x.blocks, &y.blocks, tol);
        }
    }
    out
}

/// One line per request, for people: lane, system, tools, messages with their blocks.
pub fn render(shapes: &[RequestShape]) -> String {
    let block = |b: &BlockShape| {
        let mut s = match &b.name {
            Some(name) => format!("{}({name}):{}", b.kind, b.chars),
            None => format!("{}:{}", b.kind, b.chars),
        };
        if let Some(form) = &b.content_form {
            s.push_str(&format!(" ({form}{})", if b.is_error == Some(true) { ", error" } else { "" }));
        }
        if let Some(cc) = &b.cache_control {
            s.push_str(&format!(" [{cc}]"));
        }
        if !b.markers.is_empty() {
            s.push_str(&format!(" <{}>", b.markers.join(",")));
        }
        s
    };
    let mut out = String::new();
    for (i, s) in shapes.iter().enumerate() {
        out.push_str(&format!("#{i} {} diverges_at={}\n", s.lane, s.diverges_at.as_deref().unwrap_or("-")));
        out.push_str(&format!("  keys: {}\n", s.keys.join(",")));
        out.push_str(&format!("  system: {}\n", s.system.iter().map(block).collect::<Vec<_>>().join(" | ")));
        let tools: usize = s.tools.iter().map(|t| t.chars).sum();
        let marked: Vec<_> = s.tools.iter().filter(|t| t.cache_control.is_some() || t.defer_loading).map(|t| t.name.as_str()).collect();
        out.push_str(&format!("  tools: {} ({tools} chars) {} marked/deferred: {}\n", s.tools.len(), s.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(","), marked.join(",")));
        for (j, m) in s.messages.iter().enumerate() {
            out.push_str(&format!("  [{j}] {}{}: {}\n", m.role, if m.string { " (string)" } else { "" }, m.blocks.iter().map(block).collect::<Vec<_>>().join(" | ")));
        }
    }
    out
}

/// Reads shapes from a file: a JSON array of shapes (as `diff-requests --shapes-out` writes),
/// or a request log (`analyze` format: one `{"body": …, "lane": …}` per line; a missing lane
/// is `main`). A loader: the one place this module reads. See [`read_bytes`].
pub fn read_file(path: &std::path::Path) -> Result<Vec<RequestShape>, String> {
    read_file_warned(path).map(|(shapes, _)| shapes)
}

/// [`read_file`] with the lines it skipped (a truncated last line of a request log).
pub fn read_file_warned(path: &std::path::Path) -> Result<(Vec<RequestShape>, Warnings), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("failed to read {}: {e}", path.display()))?;
    read_bytes(&bytes, &path.display().to_string())
}

/// Shapes from a file's bytes; `file` names it in messages. Nothing is dropped silently: a
/// bad line is an error naming it, a truncated last line (no newline, not JSON) is a warning,
/// and an input without any request is an error.
pub fn read_bytes(bytes: &[u8], file: &str) -> Result<(Vec<RequestShape>, Warnings), String> {
    let text = crate::input::decode(bytes, file).map_err(|e| e.to_string())?;
    let mut warnings = Warnings::default();
    if text.trim_start().starts_with('[') {
        let shapes: Vec<RequestShape> = serde_json::from_str(text).map_err(|e| {
            format!("{file}:{}: not a JSON array of request shapes: {}", e.line(), crate::input::cap_message(&e.to_string()))
        })?;
        if shapes.is_empty() {
            return Err(format!("{file}:1: no request shapes in it (an empty array)"));
        }
        return Ok((shapes, warnings));
    }
    let mut bodies = Vec::new();
    for line in RawLines::new(text.as_bytes()) {
        let line = line.map_err(|e| format!("failed to read {file}: {e}"))?;
        if line.is_blank() {
            continue;
        }
        let number = line.number;
        let value: Value = match crate::recording::format::parse_line(&line.bytes) {
            Ok(v) => v,
            Err((_, message)) if !line.terminated => {
                warnings.push(LineWarning { kind: WarningKind::TruncatedTail, file: file.to_owned(), line: number, path: None, message });
                continue;
            }
            Err((_, message)) => return Err(format!("{file}:{number}: {message}")),
        };
        let Some(body) = value.get("body").filter(|b| b.is_object()).cloned() else {
            return Err(format!("{file}:{number}: body: missing or not an object (expected a request log line `{{\"body\": {{...}}}}`)"));
        };
        let lane = match value.get("lane") {
            None | Some(Value::Null) => "main".to_owned(),
            Some(Value::String(lane)) => lane.clone(),
            Some(_) => return Err(format!("{file}:{number}: lane: expected a string")),
        };
        bodies.push((lane, body));
    }
    if bodies.is_empty() {
        let why = warnings.list.first().map_or(String::new(), |w| format!("; {w}"));
        return Err(format!("{file}: no request in it{why}"));
    }
    Ok((shapes(bodies.iter().map(|(lane, body)| (lane.as_str(), body.clone()))), warnings))
}
