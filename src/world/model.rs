//! The scripted model: replies come from the scenario, consumed in order per lane, so the agent
//! meets exactly the conversation the scenario describes. Lanes are the request streams of
//! CONTRACT.md (`main`, `compact`, `session_memory`, `subagent:<name>`, `side`).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::{ContentBlock, SharedBlocks, StopReason, Usage};

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
    /// Shared with every copy of the reply (the lane's list another copy of the model holds,
    /// the assistant record and messages built from it): cloning a reply copies no block.
    pub content: SharedBlocks,
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
        Reply { content: content.into(), stop_reason, usage: None, latency: None, output_tokens, synthetic: false }
    }

    pub fn text(text: impl Into<String>) -> Self {
        Reply::new(vec![ContentBlock::text(Into::<String>::into(text))])
    }

    /// No content (what a lane leaves where it moved a reply out).
    fn empty() -> Self {
        Reply { content: SharedBlocks::default(), stop_reason: StopReason::EndTurn, usage: None, latency: None, output_tokens: 0, synthetic: false }
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

/// The replies of one lane: a list shared by every copy of the model (a run's checkpoints, the
/// model as built, the runs that go on from either) and where this copy stands in it. Copying
/// a model copies no reply; a reply handed out is moved out of a list no other copy holds, and
/// copied out of one that another does. Replies before `next` are never read again (those
/// moved out are left empty).
#[derive(Clone, Default)]
struct Lane {
    replies: Arc<Vec<Reply>>,
    next: usize,
}

impl Lane {
    fn new(replies: Vec<Reply>) -> Lane {
        Lane { replies: Arc::new(replies), next: 0 }
    }

    /// The replies left, in order.
    fn left(&self) -> &[Reply] {
        &self.replies[self.next..]
    }

    /// The next reply, taken out of the lane.
    fn pop_front(&mut self) -> Option<Reply> {
        let i = self.next;
        let reply = match Arc::get_mut(&mut self.replies) {
            // (The empty reply left in its place is never read: it is before `next`.)
            Some(replies) => std::mem::replace(replies.get_mut(i)?, Reply::empty()),
            None => self.replies.get(i)?.clone(),
        };
        self.next += 1;
        Some(reply)
    }

    /// The replies left, to change: copied first (only those) when another copy holds them.
    fn left_mut(&mut self) -> &mut Vec<Reply> {
        if Arc::get_mut(&mut self.replies).is_none() {
            self.replies = Arc::new(self.left().to_vec());
            self.next = 0;
        }
        let replies = Arc::get_mut(&mut self.replies).expect("a lane's replies are its own once copied");
        replies.drain(..self.next);
        self.next = 0;
        replies
    }
}

/// As the replies left (what a queue of them printed).
impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.left()).finish()
    }
}

/// Replies per lane, consumed in order.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    lanes: BTreeMap<String, Lane>,
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
        match self.lanes.get_mut(lane) {
            Some(queue) => queue.left_mut().push(reply),
            None => {
                self.lanes.insert(lane.to_owned(), Lane::new(vec![reply]));
            }
        }
    }

    /// The next reply on `lane`.
    pub fn next_reply(&mut self, lane: &str) -> Result<Reply, WorldError> {
        let consumed = self.consumed.get(lane).copied().unwrap_or(0);
        let scripted = self.lanes.contains_key(lane);
        if let Some(reply) = self.lanes.get_mut(lane).and_then(Lane::pop_front) {
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
        // (`fresh`'s lists shared, each from where this one stands: no reply is copied.)
        let mut lanes_now = BTreeMap::new();
        for (lane, replies) in &fresh.lanes {
            let next = (replies.next + self.consumed(lane)).min(replies.replies.len());
            lanes_now.insert(lane.clone(), Lane { replies: replies.replies.clone(), next });
        }
        self.lanes = lanes_now;
        true
    }

    /// Whether [`ScriptedModel::resume_with`] would go on.
    pub fn resumable_with(&self, original: &ScriptedModel, fresh: &ScriptedModel) -> bool {
        let lanes: std::collections::BTreeSet<&String> = original.lanes.keys().chain(fresh.lanes.keys()).chain(self.consumed.keys()).collect();
        for lane in &lanes {
            let consumed = self.consumed(lane);
            let (a, b) = (original.lanes.get(*lane).map(Lane::left), fresh.lanes.get(*lane).map(Lane::left));
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
        self.lanes.get(lane).map(Lane::left).into_iter().flatten()
    }

    /// Replaces the replies left on `lane` (a plan that decides a lane's next reply as the run
    /// goes); what it consumed stays counted.
    pub fn replace_remaining(&mut self, lane: &str, replies: Vec<Reply>) {
        self.lanes.insert(lane.to_owned(), Lane::new(replies));
    }

    /// Takes the scripted usage off every reply left on `lane`, each keeping its output tokens
    /// (`usage.output_tokens`): what a script without those usages would have made.
    pub fn drop_usage(&mut self, lane: &str) {
        for reply in self.lanes.get_mut(lane).map(Lane::left_mut).into_iter().flatten() {
            if let Some(usage) = reply.usage.take() {
                reply.output_tokens = usage.output_tokens;
            }
        }
    }

    /// Replies left on `lane`.
    pub fn remaining(&self, lane: &str) -> usize {
        self.lanes.get(lane).map_or(0, |queue| queue.left().len())
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
        self.lanes.iter().filter(|(_, q)| !q.left().is_empty()).map(|(l, q)| (l.clone(), q.left().len())).collect()
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

    fn left(model: &ScriptedModel, lane: &str) -> Vec<Reply> {
        model.scripted(lane).cloned().collect()
    }

    /// Copies share their lanes' replies: each copy hands out every reply from where it stands,
    /// whichever copy goes first, and a change to one copy's replies never reaches another.
    #[test]
    fn copies_of_a_model_go_on_alone() {
        let mut built = ScriptedModel::new(Rng::new(1));
        let texts = ["a", "b", "c", "d"];
        for (i, text) in texts.iter().enumerate() {
            built.push("main", with_usage(text, i as u64 + 1));
        }
        let mut first = built.clone();
        assert_eq!(first.next_reply("main").unwrap(), with_usage("a", 1));
        let mut second = first.clone();
        // `second` is the last holder of its list once `first` changed its own.
        first.drop_usage("main");
        assert_eq!(left(&first, "main").iter().map(|r| (r.usage.is_none(), r.output_tokens)).collect::<Vec<_>>(), vec![(true, 2), (true, 3), (true, 4)]);
        for (i, text) in texts.iter().enumerate().skip(1) {
            assert_eq!(second.next_reply("main").unwrap(), with_usage(text, i as u64 + 1));
        }
        assert!(second.next_reply("main").is_err());
        assert_eq!(left(&built, "main").len(), 4);
        assert_eq!(first.remaining("main"), 3);
        // A lane pushed to after a copy took replies from it.
        let mut third = built.clone();
        third.next_reply("main").unwrap();
        third.push("main", Reply::text("e"));
        assert_eq!(left(&third, "main").iter().map(|r| r.content.clone()).collect::<Vec<_>>(), ["b", "c", "d", "e"].map(|t| vec![ContentBlock::text(t)]).to_vec());
        assert_eq!(third.unconsumed(), vec![("main".to_owned(), 4)]);
        assert_eq!(left(&built, "main").len(), 4);
    }

    /// A reply handed out of a list another copy holds shares its blocks with that copy's
    /// (no block copied); changing the blocks of one changes the other's none.
    #[test]
    fn a_reply_shares_its_blocks_with_the_copies_of_the_model() {
        let mut built = ScriptedModel::new(Rng::new(1));
        built.push("main", Reply::new(vec![ContentBlock::text("a"), ContentBlock::tool_use("t1", "Read", serde_json::json!({ "file_path": "/x" }))]));
        let mut copy = built.clone();
        let mut taken = copy.next_reply("main").unwrap();
        let kept = built.scripted("main").next().unwrap().clone();
        assert!(taken.content.same(&kept.content));
        taken.content.push(ContentBlock::text("b"));
        assert!(!taken.content.same(&kept.content));
        assert_eq!(kept.content.len(), 2);
        assert_eq!(built.next_reply("main").unwrap(), kept);
        assert_eq!(taken.content.len(), 3);
    }

    /// Going on with another script's replies starts each lane after what this copy consumed,
    /// as copying the rest of them did.
    #[test]
    fn resuming_with_another_script_starts_where_the_copy_stands() {
        let script = |texts: &[&str]| {
            let mut model = ScriptedModel::new(Rng::new(1));
            for text in texts {
                model.push("main", Reply::text(*text));
            }
            model.push("compact", Reply::text("summary"));
            model
        };
        let original = script(&["a", "b", "c"]);
        let fresh = script(&["a", "b", "x", "y"]);
        let mut model = original.clone();
        model.next_reply("main").unwrap();
        model.next_reply("main").unwrap();
        assert!(model.resume_with(&original, &fresh));
        assert_eq!(left(&model, "main"), vec![Reply::text("x"), Reply::text("y")]);
        assert_eq!(left(&model, "compact"), vec![Reply::text("summary")]);
        assert_eq!(model.next_reply("main").unwrap(), Reply::text("x"));
        assert_eq!(model.consumed("main"), 3);
        assert_eq!(left(&fresh, "main").len(), 4);
        let mut past = fresh.clone();
        for _ in 0..4 {
            past.next_reply("main").unwrap();
        }
        assert!(!past.resumable_with(&fresh, &original));
    }
}
