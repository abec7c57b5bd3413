//! The scripted model: replies come from the scenario, consumed in order per lane, so the agent
//! meets exactly the conversation the scenario describes. Lanes are the request streams of
//! CONTRACT.md (`main`, `compact`, `session_memory`, `subagent:<name>`, `side`).

use std::collections::{BTreeMap, VecDeque};

use crate::api::{ContentBlock, StopReason, Usage};

use super::error::WorldError;
use super::rng::Rng;

/// Time the reply takes: to the first streamed token and to the end of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    pub first_token_ms: u64,
    pub total_ms: u64,
}

/// One model reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub content: Vec<ContentBlock>,
    pub stop_reason: StopReason,
    /// Usage as the script states it (partial: only the fields the scenario gave are non-zero).
    /// Measurement computes the input side itself; this is for replaying recorded sessions.
    pub usage: Option<Usage>,
    pub latency: Option<Latency>,
    /// Explicit (from the script) or estimated with [`estimate_output_tokens`].
    pub output_tokens: u64,
    /// True when the reply was synthesized by the fallback rather than scripted.
    pub synthetic: bool,
}

impl Reply {
    /// A scripted reply; output tokens are estimated from the content, and the stop reason
    /// follows the content (`tool_use` when it calls a tool, else `end_turn`).
    pub fn new(content: Vec<ContentBlock>) -> Self {
        let stop_reason = if content.iter().any(|b| matches!(b, ContentBlock::ToolUse { .. })) {
            StopReason::ToolUse
        } else {
            StopReason::EndTurn
        };
        let output_tokens = estimate_output_tokens(&content);
        Reply { content, stop_reason, usage: None, latency: None, output_tokens, synthetic: false }
    }

    pub fn text(text: impl Into<String>) -> Self {
        Reply::new(vec![ContentBlock::text(text)])
    }
}

/// Output tokens estimated the way Claude Code estimates tokens: characters / 4, rounded up,
/// over text, thinking and tool inputs (serialized as compact JSON).
pub fn estimate_output_tokens(content: &[ContentBlock]) -> u64 {
    let chars: usize = content
        .iter()
        .map(|block| match block {
            ContentBlock::Text { text, .. } => text.chars().count(),
            ContentBlock::Thinking { thinking, .. } => thinking.chars().count(),
            ContentBlock::ToolUse { name, input, .. } | ContentBlock::ServerToolUse { name, input, .. } => {
                name.chars().count() + serde_json::to_string(input).map_or(0, |s| s.chars().count())
            }
            _ => 0,
        })
        .sum();
    (chars as u64).div_ceil(4)
}

/// What the model does when a lane has no scripted reply.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Fallback {
    /// Fail with [`WorldError::LaneNotScripted`] / [`WorldError::ScriptExhausted`].
    #[default]
    Error,
    /// Synthesize a deterministic `end_turn` text reply.
    Synthesize(Synthesis),
}

/// Sizes of synthesized replies. Compaction lanes (`compact`, `session_memory`) get a summary of
/// `summary_tokens`; other lanes a short answer of `reply_tokens`.
#[derive(Debug, Clone, PartialEq)]
pub struct Synthesis {
    pub reply_tokens: u64,
    pub summary_tokens: u64,
    /// Also synthesize on lanes whose script ran out. Off by default: a scripted lane running
    /// dry usually means the scenario and the agent disagree, which should be loud.
    pub after_script_ends: bool,
}

impl Default for Synthesis {
    fn default() -> Self {
        Synthesis { reply_tokens: 40, summary_tokens: 2000, after_script_ends: false }
    }
}

/// Replies per lane, consumed in order.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    lanes: BTreeMap<String, VecDeque<Reply>>,
    consumed: BTreeMap<String, usize>,
    fallback: Fallback,
    rng: Rng,
}

impl ScriptedModel {
    /// An empty script. `rng` feeds synthesized replies only.
    pub fn new(rng: Rng) -> Self {
        ScriptedModel { lanes: BTreeMap::new(), consumed: BTreeMap::new(), fallback: Fallback::Error, rng }
    }

    pub fn with_fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = fallback;
        self
    }

    pub fn fallback(&self) -> &Fallback {
        &self.fallback
    }

    /// Appends a reply to a lane's script.
    pub fn push(&mut self, lane: &str, reply: Reply) {
        self.lanes.entry(lane.to_owned()).or_default().push_back(reply);
    }

    /// The next reply on `lane`.
    pub fn next_reply(&mut self, lane: &str) -> Result<Reply, WorldError> {
        let consumed = self.consumed.get(lane).copied().unwrap_or(0);
        let scripted = self.lanes.contains_key(lane);
        if let Some(reply) = self.lanes.get_mut(lane).and_then(VecDeque::pop_front) {
            *self.consumed.entry(lane.to_owned()).or_default() += 1;
            return Ok(reply);
        }
        match &self.fallback {
            Fallback::Synthesize(synthesis) if !scripted || synthesis.after_script_ends => {
                let reply = self.synthesize(lane, consumed, synthesis);
                *self.consumed.entry(lane.to_owned()).or_default() += 1;
                Ok(reply)
            }
            _ if scripted => Err(WorldError::ScriptExhausted { lane: lane.to_owned(), consumed }),
            _ => Err(WorldError::LaneNotScripted { lane: lane.to_owned(), scripted: self.scripted_lanes().join(", ") }),
        }
    }

    /// Goes on with `fresh`'s replies (a model built from another script) where this one stands:
    /// each lane continues after as many replies as this one consumed. `original` is this model
    /// as it was built. Refused (false, nothing changed) unless `fresh` scripted the same
    /// replies as `original` for everything consumed so far, so that the run so far is one
    /// `fresh` would have made too.
    pub fn resume_with(&mut self, original: &ScriptedModel, fresh: &ScriptedModel) -> bool {
        if !self.resumable_with(original, fresh) {
            return false;
        }
        let mut lanes_now = BTreeMap::new();
        for (lane, replies) in &fresh.lanes {
            lanes_now.insert(lane.clone(), replies.iter().skip(self.consumed(lane)).cloned().collect());
        }
        self.lanes = lanes_now;
        true
    }

    /// Whether [`ScriptedModel::resume_with`] would go on.
    pub fn resumable_with(&self, original: &ScriptedModel, fresh: &ScriptedModel) -> bool {
        let lanes: std::collections::BTreeSet<&String> = original.lanes.keys().chain(fresh.lanes.keys()).chain(self.consumed.keys()).collect();
        for lane in &lanes {
            let consumed = self.consumed(lane);
            let (a, b) = (original.lanes.get(*lane), fresh.lanes.get(*lane));
            if consumed == 0 {
                continue;
            }
            let (Some(a), Some(b)) = (a, b) else {
                // Answered by the fallback (or refused) in one and scripted in the other.
                if a.is_some() != b.is_some() {
                    return false;
                }
                continue;
            };
            // Past the end of a script the fallback answered: both scripts must end there.
            if (a.len() < consumed || b.len() < consumed) && a.len() != b.len() {
                return false;
            }
            if !a.iter().take(consumed).eq(b.iter().take(consumed)) {
                return false;
            }
        }
        true
    }

    /// The replies left on `lane`, in order.
    pub fn scripted(&self, lane: &str) -> impl Iterator<Item = &Reply> {
        self.lanes.get(lane).into_iter().flatten()
    }

    /// Replaces the replies left on `lane` (a plan that decides a lane's next reply as the run
    /// goes); what it consumed stays counted.
    pub fn replace_remaining(&mut self, lane: &str, replies: Vec<Reply>) {
        self.lanes.insert(lane.to_owned(), replies.into());
    }

    /// Takes the scripted usage off every reply left on `lane`, each keeping its output tokens
    /// (`usage.output_tokens`): what a script without those usages would have made.
    pub fn drop_usage(&mut self, lane: &str) {
        for reply in self.lanes.get_mut(lane).into_iter().flatten() {
            if let Some(usage) = reply.usage.take() {
                reply.output_tokens = usage.output_tokens;
            }
        }
    }

    /// Replies left on `lane`.
    pub fn remaining(&self, lane: &str) -> usize {
        self.lanes.get(lane).map_or(0, VecDeque::len)
    }

    /// Replies consumed so far on `lane` (scripted and synthesized).
    pub fn consumed(&self, lane: &str) -> usize {
        self.consumed.get(lane).copied().unwrap_or(0)
    }

    /// Lanes that have (or had) a script, sorted.
    pub fn scripted_lanes(&self) -> Vec<String> {
        self.lanes.keys().cloned().collect()
    }

    /// Lanes with scripted replies never consumed, with their counts, sorted: a run that ends
    /// with leftovers did not follow its scenario.
    pub fn unconsumed(&self) -> Vec<(String, usize)> {
        self.lanes.iter().filter(|(_, q)| !q.is_empty()).map(|(l, q)| (l.clone(), q.len())).collect()
    }

    /// A deterministic reply that depends only on the seed, the lane and the reply's index on
    /// that lane, never on the order lanes were called in.
    fn synthesize(&self, lane: &str, index: usize, synthesis: &Synthesis) -> Reply {
        let mut rng = self.rng.fork(lane).fork(&index.to_string());
        let is_summary = lane == "compact" || lane == "session_memory";
        let tokens = if is_summary { synthesis.summary_tokens } else { synthesis.reply_tokens };
        let body = filler_text(&mut rng, tokens);
        let text = if is_summary { format!("<summary>\n{body}\n</summary>") } else { body };
        let mut reply = Reply::text(text);
        reply.synthetic = true;
        reply
    }
}

/// Words of about `tokens` tokens by the chars/4 estimate.
fn filler_text(rng: &mut Rng, tokens: u64) -> String {
    const WORDS: &[&str] = &[
        "the", "file", "function", "returns", "context", "cache", "request", "module", "test", "error",
        "value", "config", "user", "change", "build", "update", "result", "check", "path", "session",
    ];
    let target = (tokens * 4) as usize;
    let mut text = String::with_capacity(target + 16);
    while text.len() < target {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(rng.pick(WORDS).expect("word list is not empty"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_usage(text: &str, output_tokens: u64) -> Reply {
        let mut reply = Reply::text(text);
        reply.usage = Some(Usage { input_tokens: 100, output_tokens, ..Usage::default() });
        reply
    }

    /// Dropping a lane's usage touches only the replies left, each as a script without that
    /// usage would have made it (its output tokens the usage's), and replacing a lane's replies
    /// keeps what it consumed counted.
    #[test]
    fn a_lane_changed_as_the_run_goes_keeps_what_it_handed_out() {
        let mut model = ScriptedModel::new(Rng::new(1));
        for (text, tokens) in [("a", 7), ("b", 9), ("c", 0)] {
            model.push("main", with_usage(text, tokens));
        }
        model.push("compact", Reply::text("first summary"));
        let first = model.next_reply("main").unwrap();
        model.drop_usage("main");
        assert!(first.usage.is_some());
        let left: Vec<(Option<Usage>, u64)> = model.scripted("main").map(|r| (r.usage.clone(), r.output_tokens)).collect();
        assert_eq!(left, vec![(None, 9), (None, 0)]);
        model.next_reply("compact").unwrap();
        model.replace_remaining("compact", vec![Reply::text("chosen")]);
        assert_eq!(model.consumed("compact"), 1);
        assert_eq!(model.next_reply("compact").unwrap(), Reply::text("chosen"));
        assert_eq!(model.consumed("compact"), 2);
    }
}
