//! The agent against a version profile: each probe written as a ctxsim scenario (the same
//! project, prompts and replies the real client got), run with `client_version` set, and its
//! requests compared with the profile's snapshots: the share of requests structurally identical
//! (`crate::shape::diff`, default tolerance), the share agreeing on what decides caching (lane,
//! where the request stops extending its lane's previous one, the marker positions), and the
//! token totals of both sides (o200k and calibrated).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use crate::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use crate::shape::{Difference, RequestShape, Tolerance, diff};

use super::probes::{self, Probe, Run};
use super::{Counters, Size, VersionProfile};

/// A scenario block from a script block (`{"text"}` or `{"tool_use": {name, input}}`).
fn block(value: &Value, proj: &str) -> Value {
    let text = value.to_string().replace("__P__", proj);
    serde_json::from_str(&text).expect("re-parses")
}

fn reply_blocks(reply: &Value, proj: &str) -> Value {
    match reply.get("content") {
        Some(Value::String(s)) => json!([{"text": s}]),
        Some(Value::Array(items)) => Value::Array(items.iter().map(|b| block(b, proj)).collect()),
        _ => json!([]),
    }
}

/// The probe as a scenario (JSON, which the YAML loader reads) for `profile`'s client: its
/// model, window and output limit, the probe's project under the profile's work directory, a
/// custom base URL, the prompts and replies in order. A compaction probe gets a summary reply
/// where the profile says the client compacted; the subagent's reply goes to its lane.
pub fn scenario(probe: &Probe, profile: &VersionProfile) -> Value {
    let root = format!("{}/{}", profile.work_dir, probe.name);
    let proj = format!("{root}/proj");
    let model: String = profile.main.fields.get("model").and_then(|m| serde_json::from_str(m).ok()).unwrap_or_else(|| "claude-sonnet-4-6".to_owned());
    let max_tokens: u64 = profile.main.fields.get("max_tokens").and_then(|m| m.parse().ok()).unwrap_or(32_000);
    // A capture whose clock is pinned writes the project at the wall-clock time, after the
    // pinned day: its files are newer than every read the client records (what a resumed client
    // sees as modified files).
    let file = |text: &str| if profile.date_pinned { json!({"contents": text, "mtime": probes::FILES_WRITTEN}) } else { json!(text) };
    let files: serde_json::Map<String, Value> = probes::PROJECT_FILES.iter().map(|(p, t)| (format!("{proj}/{p}"), file(t))).collect();
    // The window the client used: the standard one (200k or 1M) whose threshold (window −
    // 20,000 reserve − 13,000) the compaction probes bracket.
    let window = profile.threshold_between.and_then(|[below, above]| [200_000u64, 1_000_000].into_iter().find(|w| (below + 1..=above).contains(&(w - 33_000))));
    let mut world = json!({
        "model": model,
        "max_output_tokens": max_tokens,
        "clock_start": format!("{}T09:00:00Z", probes::DATE),
        "seed": 1,
        "cwd": proj,
        "home": format!("{root}/home"),
        "env": {"ANTHROPIC_BASE_URL": "http://127.0.0.1:8080"},
        "git": {"branch": "main", "recent_commits": [format!("4f1c2d9 {}", probes::COMMIT.0)]},
        "files": files,
    });
    if let Some(window) = window {
        world["context_window"] = json!(window);
    }
    if probe.mcp {
        world["mcp_servers"] = json!([{"name": "demo", "instructions": "The demo server echoes and adds.", "tools": [
            {"name": "add", "description": "Adds two numbers."},
            {"name": "echo", "description": "Returns the text it is given."}
        ]}]);
    }
    let compacted = profile.thresholds.iter().any(|t| t.probe == probe.name && t.compacted);
    let replies: Vec<Value> = probe.script.get("main").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut replies = replies.into_iter();
    let mut steps = Vec::new();
    let assistant_until_text = |steps: &mut Vec<Value>, replies: &mut std::vec::IntoIter<Value>| {
        while let Some(reply) = replies.next() {
            let content = reply_blocks(&reply, &proj);
            let calls_tool = content.as_array().is_some_and(|b| b.iter().any(|b| b.get("tool_use").is_some()));
            let mut step = json!({"assistant": content});
            if let Some(usage) = reply.get("usage") {
                step["usage"] = usage.clone();
            }
            steps.push(step);
            // What the real client's tools answered where the simulation runs nothing: the
            // probe's test command prints `ok`; the MCP echo returns its text.
            for call in content.as_array().into_iter().flatten().filter_map(|b| b.get("tool_use")) {
                match call.get("name").and_then(Value::as_str) {
                    Some("Bash") => steps.push(json!({"tool_output": {"Bash": "ok"}})),
                    Some(name @ "mcp__demo__echo") => steps.push(json!({"tool_output": {name: call["input"]["text"].clone()}})),
                    _ => {}
                }
            }
            if probe.name == "subagent" && calls_tool {
                // The subagent answers on its own lane.
                if let Some(sub) = replies.next() {
                    steps.push(json!({"assistant": reply_blocks(&sub, &proj), "lane": "subagent:general-purpose"}));
                }
            }
            if reply.get("usage").is_some() && compacted {
                let summary = probe.script.get("summary_text").and_then(Value::as_str).unwrap_or("<summary>\nDone.\n</summary>");
                steps.push(json!({"assistant": [{"text": summary}], "lane": "compact"}));
            }
            if !calls_tool {
                break;
            }
        }
    };
    for run in &probe.runs {
        let prompts: Vec<&str> = match run {
            Run::Print { prompt } => vec![prompt],
            Run::Resume { prompt } => {
                steps.push(json!({"resume": true}));
                vec![prompt]
            }
            Run::Turns { prompts } => prompts.to_vec(),
        };
        for prompt in prompts {
            steps.push(json!({"user": prompt}));
            assistant_until_text(&mut steps, &mut replies);
            if probe.name == "subagent" && crate::agent::dialect::background_agents(&profile.version) {
                // The background agent's task notification asks the main thread again.
                assistant_until_text(&mut steps, &mut replies);
            }
        }
    }
    json!({"name": format!("probe-{}", probe.name), "description": probe.what, "world": world, "script": steps})
}

/// A lane name as the comparison sees it: every subagent lane is `subagent`.
fn lane_class(lane: &str) -> &str {
    if lane.starts_with("subagent") { "subagent" } else { lane }
}

/// Shapes with canonical lanes, stably grouped by lane (a background subagent's requests
/// interleave with the main thread's in an order the client does not fix).
fn canonical(shapes: &[RequestShape]) -> Vec<RequestShape> {
    let mut out: Vec<RequestShape> = shapes.iter().cloned().map(|mut s| {
        s.lane = lane_class(&s.lane).to_owned();
        s
    }).collect();
    out.sort_by(|a, b| a.lane.cmp(&b.lane));
    out
}

/// What decides caching in a request: its lane, where it stops extending its lane's previous
/// request, and the positions of its markers (system blocks, tools, and the message marker
/// counted from the end).
fn cache_key(shape: &RequestShape) -> String {
    let mut key = format!("{} {:?}", shape.lane, shape.diverges_at);
    for (i, b) in shape.system.iter().enumerate() {
        if let Some(cc) = &b.cache_control {
            key.push_str(&format!(" system[{i}]={cc}"));
        }
    }
    for (i, t) in shape.tools.iter().enumerate() {
        if let Some(cc) = &t.cache_control {
            key.push_str(&format!(" tools[{i}]={cc}"));
        }
    }
    let n = shape.messages.len();
    for (m, message) in shape.messages.iter().enumerate() {
        let k = message.blocks.len();
        for (b, block) in message.blocks.iter().enumerate() {
            if let Some(cc) = &block.cache_control {
                key.push_str(&format!(" messages[-{}].content[-{}]={cc}", n - m, k - b));
            }
        }
    }
    key
}

/// One probe's comparison.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeScore {
    pub probe: String,
    pub real_requests: usize,
    pub our_requests: usize,
    /// Requests (paired in order) without any structural difference.
    pub identical: usize,
    /// Requests (paired in order) whose cache-deciding structure agrees.
    pub cache_agree: usize,
    pub real_tokens: Size,
    pub our_tokens: Size,
    pub differences: Vec<Difference>,
}

/// A version's comparison over every probe.
#[derive(Debug, Clone, Serialize)]
pub struct Score {
    pub version: String,
    pub probes: Vec<ProbeScore>,
    pub requests: usize,
    pub identical: usize,
    pub cache_agree: usize,
    pub real_tokens: Size,
    pub our_tokens: Size,
}

impl Score {
    pub fn structural_share(&self) -> f64 {
        self.identical as f64 / self.requests.max(1) as f64
    }
    pub fn cache_share(&self) -> f64 {
        self.cache_agree as f64 / self.requests.max(1) as f64
    }
    /// Our token total over the real one, minus one (o200k, calibrated).
    pub fn token_deviation(&self) -> (f64, f64) {
        let d = |ours: u64, real: u64| ours as f64 / real.max(1) as f64 - 1.0;
        (d(self.our_tokens.o200k, self.real_tokens.o200k), d(self.our_tokens.calibrated, self.real_tokens.calibrated))
    }
}

/// Runs every probe of `profile` through the agent speaking `profile.version` and compares.
pub fn score(profile: &VersionProfile, snapshots: &BTreeMap<String, Vec<RequestShape>>) -> Result<Score, String> {
    let strategy = crate::strategy::Strategy { client_version: profile.version.clone(), ..Default::default() };
    strategy.validate().map_err(|e| e.to_string())?;
    let mut counters = Counters::default();
    let mut probes_out = Vec::new();
    for probe in probes::probes() {
        let Some(real) = snapshots.get(probe.name) else { continue };
        let text = scenario(&probe, profile).to_string();
        let scenario = crate::scenario::parse_scenario(&text, &format!("probe-{}.yaml", probe.name)).map_err(|e| format!("probe {}: {e}", probe.name))?;
        let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
        let out = crate::runner::run_scenario(&scenario, &mut measurer, &strategy).map_err(|e| format!("probe {}: {e}", probe.name))?;
        let lanes: Vec<(String, crate::api::Request)> = out.rows.iter().map(|r| r.lane.clone()).zip(out.requests.iter().cloned()).collect();
        let ours = crate::shape::shapes_of(&lanes);
        let (real_c, ours_c) = (canonical(real), canonical(&ours));
        let differences = diff(&real_c, &ours_c, Tolerance::default());
        let paired = real_c.len().min(ours_c.len());
        let identical = (0..paired).filter(|r| !differences.iter().any(|d| d.request == *r && d.path != "requests")).count();
        let cache_agree = (0..paired).filter(|&r| cache_key(&real_c[r]) == cache_key(&ours_c[r])).count();
        let bodies: Vec<Value> = out.requests.iter().map(|r| serde_json::to_value(r).expect("requests serialize")).collect();
        let our_tokens = super::totals(bodies.iter(), &mut counters)?;
        let real_tokens = profile.probes.iter().find(|p| p.name == probe.name).map(|p| p.total).ok_or_else(|| format!("the profile has no probe {}", probe.name))?;
        probes_out.push(ProbeScore { probe: probe.name.to_owned(), real_requests: real.len(), our_requests: ours.len(), identical, cache_agree, real_tokens, our_tokens, differences });
    }
    let sum = |f: &dyn Fn(&ProbeScore) -> Size| probes_out.iter().map(f).fold(super::ZERO, super::add);
    Ok(Score {
        version: profile.version.clone(),
        requests: probes_out.iter().map(|p| p.real_requests.max(p.our_requests)).sum(),
        identical: probes_out.iter().map(|p| p.identical).sum(),
        cache_agree: probes_out.iter().map(|p| p.cache_agree).sum(),
        real_tokens: sum(&|p| p.real_tokens),
        our_tokens: sum(&|p| p.our_tokens),
        probes: probes_out,
    })
}
