//! Version profiles of the real Claude Code client, derived by `ctxsim profile capture` from
//! the requests it sends over the probe scenarios (`probes.rs`, driven by `capture.rs`).
//!
//! A profile (`data/profiles/<version>.toml`) holds no text of the client: sizes per section in
//! characters and tokens (o200k and calibrated), the tool set with its deferral, the layout
//! (system blocks, `role:"system"` messages, where reminders and cache markers sit), the
//! request parameters and betas, the compaction thresholds the probes bracketed, and per probe
//! its request count and token totals. Beside it, `<version>.shapes.json` holds the
//! structure-only snapshot of every request (`crate::shape`): what the agent is compared with.

pub mod capture;
pub mod conformance;
pub mod probes;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::Request;
use crate::measure::{EstimatorKind, ModelTable, TokenCounter};
use crate::shape::RequestShape;

pub use capture::{CaptureError, CaptureOptions, ClientKind, ProbeLog};

/// A size in characters (JS string length) and tokens by two estimators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Size {
    pub chars: usize,
    pub o200k: u64,
    pub calibrated: u64,
}

/// One system block or message block of the first request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockEntry {
    /// `system[1]`, `messages[0].content[2]`.
    pub path: String,
    /// The block's role in the layout: the reminder kinds its text names, or `prompt`/`text`.
    pub kind: String,
    #[serde(flatten)]
    pub size: Size,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolEntry {
    pub name: String,
    pub description_chars: usize,
    pub schema_chars: usize,
    #[serde(flatten)]
    pub size: Size,
    pub defer_loading: bool,
}

/// The request parameters of one lane's first request: every top-level field other than
/// `system`, `tools`, `messages` and `metadata`, as compact JSON; and the metadata's keys.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Params {
    pub keys: Vec<String>,
    pub fields: BTreeMap<String, String>,
    pub betas: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user_agent: String,
}

/// Where things sit in the first main request of the `read` probe.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Layout {
    pub system_blocks: usize,
    /// Paths of every `cache_control` marker, with its rendering (`system[2] ephemeral/global`).
    pub markers: Vec<String>,
    /// Indices and roles of the messages (`user`, `system`, …).
    pub message_roles: Vec<String>,
    /// The reminder kinds of each block of `messages[0]`, in order.
    pub first_message_blocks: Vec<String>,
    /// The reminder kinds of each `role:"system"` message of the first request.
    pub system_messages: Vec<String>,
    /// Tools with `defer_loading` in the first request.
    pub deferred_tools: Vec<String>,
    /// Whether a content string sent while last (with the marker) becomes a list, and back.
    pub string_list_flip: bool,
}

/// What a compaction probe saw: whether the claimed context made the client compact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThresholdProbe {
    pub probe: String,
    pub claimed_tokens: u64,
    pub compacted: bool,
}

/// Per probe: requests by lane, where each lane's requests stop extending the previous, token
/// totals of all its requests (the measurement's basis), notes (skips, failures).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeEntry {
    pub name: String,
    pub requests: usize,
    pub lanes: Vec<String>,
    pub divergences: Vec<String>,
    #[serde(flatten)]
    pub total: Size,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// A version profile (`data/profiles/<version>.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionProfile {
    pub version: String,
    /// `cli.js` or `native`.
    pub client: String,
    /// Whether the client's clock was pinned to [`probes::DATE`] (only the `cli.js` build can be).
    pub date_pinned: bool,
    /// Where the probes ran: paths in the requests are under it.
    pub work_dir: String,
    pub main: Params,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subagent: Option<Params>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<Params>,
    pub layout: Layout,
    pub system: Vec<BlockEntry>,
    pub messages: Vec<BlockEntry>,
    pub tools: Vec<ToolEntry>,
    /// Sums: the system prompt, the tools, the first request's messages.
    pub sections: BTreeMap<String, Size>,
    pub thresholds: Vec<ThresholdProbe>,
    /// The highest claim that did not compact and the lowest that did, where the probes show both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold_between: Option<[u64; 2]>,
    pub probes: Vec<ProbeEntry>,
}

/// Token counting for profiles: o200k and the calibrated estimator of the model's family.
pub struct Counters {
    o200k: TokenCounter,
    calibrated: TokenCounter,
    table: ModelTable,
}

impl Default for Counters {
    fn default() -> Self {
        Counters { o200k: TokenCounter::new(EstimatorKind::Bpe), calibrated: TokenCounter::new(EstimatorKind::Calibrated), table: ModelTable::shipped() }
    }
}

impl Counters {
    fn family(&self, model: &str) -> String {
        self.table.lookup(model).map(|m| m.family.clone()).unwrap_or_else(|_| "default".to_owned())
    }

    /// A free-standing text's size.
    pub fn text(&self, text: &str, model: &str) -> Size {
        let family = self.family(model);
        Size {
            chars: crate::measure::tokens::utf16_len(text),
            o200k: u64::from(self.o200k.count_text(text, &family)),
            calibrated: u64::from(self.calibrated.count_text(text, &family)),
        }
    }

    /// A whole request's size as the measurement counts it (every block, framing included).
    pub fn request(&mut self, request: &Request, chars: usize) -> Size {
        let family = self.family(&request.model);
        let o200k = crate::measure::flatten(request, &mut self.o200k, &family).total_tokens;
        let calibrated = crate::measure::flatten(request, &mut self.calibrated, &family).total_tokens;
        Size { chars, o200k, calibrated }
    }
}

fn add(a: Size, b: Size) -> Size {
    Size { chars: a.chars + b.chars, o200k: a.o200k + b.o200k, calibrated: a.calibrated + b.calibrated }
}

const ZERO: Size = Size { chars: 0, o200k: 0, calibrated: 0 };

fn text_of(block: &Value) -> String {
    match block.get("type").and_then(Value::as_str) {
        Some("text") => block.get("text").and_then(Value::as_str).unwrap_or_default().to_owned(),
        Some("tool_result") => match block.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        },
        _ => crate::shape::without_cache_control(block).to_string(),
    }
}

fn kind_of(shape: &crate::shape::BlockShape, fallback: &str) -> String {
    if shape.markers.is_empty() { fallback.to_owned() } else { shape.markers.join("+") }
}

fn params(entry: &crate::recording::claude_trace::RequestLogEntry, headers: &BTreeMap<String, String>) -> Params {
    let body = entry.body.as_object().cloned().unwrap_or_default();
    let fields = body
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "system" | "tools" | "messages" | "metadata"))
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect();
    let mut keys: Vec<String> = body.keys().cloned().collect();
    if let Some(Value::String(user_id)) = body.get("metadata").and_then(|m| m.get("user_id"))
        && let Ok(Value::Object(inner)) = serde_json::from_str::<Value>(user_id)
    {
        keys.push(format!("metadata.user_id{{{}}}", inner.keys().cloned().collect::<Vec<_>>().join(",")));
    }
    let betas = headers.get("anthropic-beta").map(|b| b.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect()).unwrap_or_default();
    Params { keys, fields, betas, user_agent: headers.get("user-agent").cloned().unwrap_or_default() }
}

/// Whether a probe's log shows a compaction: a request in the `compact` lane.
fn compacted(log: &ProbeLog) -> bool {
    log.entries.iter().any(|e| e.lane.as_deref() == Some("compact"))
}

/// The structure-only snapshots of every probe's requests.
pub fn snapshots(logs: &[ProbeLog]) -> BTreeMap<String, Vec<RequestShape>> {
    logs.iter()
        .map(|log| {
            let lane = |e: &crate::recording::claude_trace::RequestLogEntry| e.lane.clone().unwrap_or_else(|| "main".to_owned());
            (log.probe.clone(), crate::shape::shapes(log.entries.iter().map(|e| (lane(e), e.body.clone())).collect::<Vec<_>>().iter().map(|(l, b)| (l.as_str(), b.clone()))))
        })
        .collect()
}

/// Token totals of a sequence of request bodies.
pub fn totals<'a>(bodies: impl IntoIterator<Item = &'a Value>, counters: &mut Counters) -> Result<Size, String> {
    let mut total = ZERO;
    for body in bodies {
        let request: Request = serde_json::from_value(body.clone()).map_err(|e| format!("a request does not parse: {e}"))?;
        let chars = crate::measure::tokens::utf16_len(&body.to_string());
        total = add(total, counters.request(&request, chars));
    }
    Ok(total)
}

impl VersionProfile {
    /// Derives the profile from the probes' logs. The `read` probe's first request gives the
    /// layout and sizes; the `subagent` and compaction probes their lanes' parameters.
    pub fn derive(version: &str, client: &ClientKind, work_dir: &str, logs: &[ProbeLog]) -> Result<VersionProfile, String> {
        let mut counters = Counters::default();
        let read = logs.iter().find(|l| l.probe == "read").ok_or("the `read` probe did not run")?;
        let first_index = read.entries.iter().position(|e| e.lane.as_deref() == Some("main")).ok_or("the `read` probe sent no main request")?;
        let first = &read.entries[first_index];
        let body = &first.body;
        let model = body.get("model").and_then(Value::as_str).unwrap_or_default().to_owned();
        let shape = crate::shape::shapes([("main", body.clone())]).remove(0);

        let list = |key: &str| body.get(key).and_then(Value::as_array).cloned().unwrap_or_default();
        let mut markers = Vec::new();
        let mut system = Vec::new();
        for (i, (block, s)) in list("system").iter().zip(&shape.system).enumerate() {
            let path = format!("system[{i}]");
            if let Some(cc) = &s.cache_control {
                markers.push(format!("{path} {cc}"));
            }
            system.push(BlockEntry { path, kind: kind_of(s, "text"), size: counters.text(&text_of(block), &model), cache_control: s.cache_control.clone() });
        }
        let mut messages = Vec::new();
        let mut system_messages = Vec::new();
        for (m, (message, ms)) in list("messages").iter().zip(&shape.messages).enumerate() {
            let blocks: Vec<Value> = match message.get("content") {
                Some(Value::String(s)) => vec![serde_json::json!({"type": "text", "text": s})],
                Some(Value::Array(items)) => items.clone(),
                _ => Vec::new(),
            };
            let last_block = blocks.len().saturating_sub(1);
            for (b, (block, s)) in blocks.iter().zip(&ms.blocks).enumerate() {
                let path = format!("messages[{m}].content[{b}]");
                if let Some(cc) = &s.cache_control {
                    markers.push(format!("{path} {cc}"));
                }
                let fallback = if ms.role == "user" && b == last_block && s.markers.is_empty() { "prompt" } else { "text" };
                messages.push(BlockEntry { path, kind: kind_of(s, fallback), size: counters.text(&text_of(block), &model), cache_control: s.cache_control.clone() });
            }
            if ms.role == "system" {
                system_messages.push(ms.blocks.iter().map(|b| kind_of(b, "text")).collect::<Vec<_>>().join(" | "));
            }
        }
        let tools: Vec<ToolEntry> = list("tools")
            .iter()
            .map(|t| {
                let name = t.get("name").and_then(Value::as_str).unwrap_or("?").to_owned();
                let description = t.get("description").and_then(Value::as_str).unwrap_or_default();
                let schema = t.get("input_schema").map(Value::to_string).unwrap_or_default();
                let whole = crate::shape::without_cache_control(t).to_string();
                ToolEntry {
                    name,
                    description_chars: crate::measure::tokens::utf16_len(description),
                    schema_chars: crate::measure::tokens::utf16_len(&schema),
                    size: counters.text(&whole, &model),
                    defer_loading: t.get("defer_loading").and_then(Value::as_bool).unwrap_or(false),
                }
            })
            .collect();
        let first_message_blocks = messages.iter().filter(|b| b.path.starts_with("messages[0].")).map(|b| b.kind.clone()).collect();
        // The flip: a message sent as a list with the marker, then as a string once not last.
        let string_list_flip = read.entries.windows(2).any(|pair| {
            let before = crate::shape::shapes([("main", pair[0].body.clone())]).remove(0);
            let after = crate::shape::shapes([("main", pair[1].body.clone())]).remove(0);
            before.messages.last().zip(after.messages.get(before.messages.len() - 1)).is_some_and(|(b, a)| !b.string && a.string)
        });
        let layout = Layout {
            system_blocks: shape.system.len(),
            markers,
            message_roles: shape.messages.iter().map(|m| m.role.clone()).collect(),
            first_message_blocks,
            system_messages,
            deferred_tools: tools.iter().filter(|t| t.defer_loading).map(|t| t.name.clone()).collect(),
            string_list_flip,
        };
        let mut sections = BTreeMap::new();
        sections.insert("system".to_owned(), system.iter().fold(ZERO, |a, b| add(a, b.size)));
        sections.insert("tools".to_owned(), tools.iter().fold(ZERO, |a, t| add(a, t.size)));
        sections.insert("tools_inline".to_owned(), tools.iter().filter(|t| !t.defer_loading).fold(ZERO, |a, t| add(a, t.size)));
        for entry in &messages {
            let section = if entry.path.starts_with("messages[0]") { "messages[0]" } else { "messages[1..]" };
            let sum = sections.entry(section.to_owned()).or_insert(ZERO);
            *sum = add(*sum, entry.size);
        }

        // The first request of a lane (`subagent:*`, `compact`) over the probes, with its headers.
        let first_of = |wanted: &dyn Fn(&str) -> bool| {
            logs.iter().flat_map(|l| l.entries.iter().zip(&l.headers)).find(|(e, _)| e.lane.as_deref().is_some_and(wanted)).map(|(e, h)| params(e, h))
        };
        let subagent = first_of(&|lane| lane.starts_with("subagent"));
        let compaction = first_of(&|lane| lane == "compact");

        let mut thresholds = Vec::new();
        for probe in probes::probes() {
            if let (Some(claimed), Some(log)) = (probe.claimed_tokens, logs.iter().find(|l| l.probe == probe.name))
                && !log.entries.is_empty()
            {
                thresholds.push(ThresholdProbe { probe: probe.name.to_owned(), claimed_tokens: claimed, compacted: compacted(log) });
            }
        }
        let below = thresholds.iter().filter(|t| !t.compacted).map(|t| t.claimed_tokens).max();
        let above = thresholds.iter().filter(|t| t.compacted).map(|t| t.claimed_tokens).min();
        let threshold_between = match (below, above) {
            (Some(b), Some(a)) if b < a => Some([b, a]),
            _ => None,
        };

        let shapes = snapshots(logs);
        let mut probes_out = Vec::new();
        for log in logs {
            let total = totals(log.entries.iter().map(|e| &e.body), &mut counters).map_err(|e| format!("probe {}: {e}", log.probe))?;
            let shapes = &shapes[&log.probe];
            probes_out.push(ProbeEntry {
                name: log.probe.clone(),
                requests: log.entries.len(),
                lanes: shapes.iter().map(|s| s.lane.clone()).collect(),
                divergences: shapes.iter().map(|s| s.diverges_at.clone().unwrap_or_else(|| "-".to_owned())).collect(),
                total,
                notes: log.notes.clone(),
            });
        }
        Ok(VersionProfile {
            version: version.to_owned(),
            client: client.name().to_owned(),
            date_pinned: *client == ClientKind::NodeScript,
            work_dir: work_dir.to_owned(),
            main: params(first, &read.headers[first_index]),
            subagent,
            compaction,
            layout,
            system,
            messages,
            tools,
            sections,
            thresholds,
            threshold_between,
            probes: probes_out,
        })
    }

    pub fn to_toml(&self) -> String {
        let header = format!(
            "# Claude Code {} ({} build): written by `ctxsim profile capture`; see docs/profiles.md.\n# Sizes: chars = JS string length; o200k and calibrated tokens (data/calibration.json).\n\n",
            self.version, self.client
        );
        header + &toml::to_string(self).expect("profiles serialize")
    }

    pub fn from_toml(text: &str, path: &str) -> Result<VersionProfile, String> {
        toml::from_str(text).map_err(|e| format!("{path}: {e}"))
    }
}

/// The shipped profiles: (version, profile TOML, snapshots JSON).
pub const SHIPPED: &[(&str, &str, &str)] = &[
    ("2.1.88", include_str!("../../data/profiles/2.1.88.toml"), include_str!("../../data/profiles/2.1.88.shapes.json")),
    ("2.1.332", include_str!("../../data/profiles/2.1.332.toml"), include_str!("../../data/profiles/2.1.332.shapes.json")),
];

/// A shipped profile and its snapshots by version.
pub fn shipped(version: &str) -> Option<(VersionProfile, BTreeMap<String, Vec<RequestShape>>)> {
    let (_, toml, shapes) = SHIPPED.iter().find(|(v, _, _)| *v == version)?;
    let profile = VersionProfile::from_toml(toml, version).expect("shipped profiles parse");
    let shapes = serde_json::from_str(shapes).expect("shipped snapshots parse");
    Some((profile, shapes))
}
