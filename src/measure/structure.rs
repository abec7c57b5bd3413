//! Attribution from the request structure alone, for logs of any client (`serve`, `analyze`):
//! no journal says what happened between two requests, so the cause of a divergence and the
//! lane of a request are read from the bodies.
//!
//! **Causes** ([`cause`]): where the prefix diverged and how the two bodies differ there.
//! - tools: a deferred tool appeared (`defer_loading`, nothing removed) → `tool_loaded`; the
//!   same tools in another order → `tool_order_changed`; anything else → `tools_changed`. A
//!   tool defined by value in a system message while `tools` holds no non-deferred tool changes
//!   the rendered start → `tool_defined_inline`.
//! - system: the billing-header block changed → `billing_fingerprint_changed`; `tool_choice`
//!   changed → `tool_choice_changed`; else `system_changed`.
//! - messages: `thinking` changed → `thinking_changed`; the top-level effort changed →
//!   `effort_changed`; else an earlier message was re-rendered → `message_rewritten`.
//! - anywhere: the conversation restarts from a new compaction summary (a user message opening
//!   as the real client's or our summary does) → `compaction`, whatever else changed with it.
//!
//! **Lanes** ([`LaneRecognizer`]): a request continues the lane whose conversation it carries
//! (the same first message, compared by block hashes, so markers and the string/list flip do not
//! count); a new conversation with the main lane's system prompt is the main lane restarted
//! (compaction, /clear, resume); one with another system prompt or tool set is a subagent,
//! `subagent:N` per distinct (system prompt, tool set), N in order of first appearance.

use std::collections::BTreeSet;

use crate::api::canonical::{chain, hash128};
use crate::api::{ContentBlock, MessageContent, Request, Role, SystemPrompt};

use super::blocks::{FlatRequest, Region};

/// The text a billing-header system block starts with (Claude Code's first system block).
pub const BILLING_PREFIX: &str = "x-anthropic-billing-header";

/// How a compaction summary message opens: the real client's wording, then ours.
pub const SUMMARY_OPENINGS: &[&str] = &["This session is being continued from a previous conversation", "This session continues an earlier conversation"];

/// How many leading messages may carry a compaction summary (the real client puts restored
/// file reads before it: 2.1.88 sends it in `messages[1]`).
const SUMMARY_WITHIN: usize = 3;

/// What structural attribution keeps of a request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Structure {
    /// Tool names in order, with whether each is deferred (`defer_loading`).
    pub tools: Vec<(String, bool)>,
    /// Index of the billing-header block in `system`.
    pub billing: Option<usize>,
    pub tool_choice: Option<u128>,
    pub thinking: Option<u128>,
    pub effort: Option<String>,
    /// Index of the first message carrying a compaction summary, and a hash of its text.
    pub summary: Option<(usize, u128)>,
    /// A tool defined by value opens the rendered prompt ([`super::blocks::opens_with_inline_tool`]).
    pub inline_start: bool,
}

fn value_hash(value: Option<&serde_json::Value>) -> Option<u128> {
    value.map(|v| hash128(&crate::api::canonical::to_canonical_bytes(v)))
}

fn system_texts(request: &Request) -> Vec<&str> {
    match &request.system {
        None => Vec::new(),
        Some(SystemPrompt::Text(text)) => vec![text.as_str()],
        Some(SystemPrompt::Blocks(blocks)) => blocks.iter().map(|b| b.text.as_str()).collect(),
    }
}

/// Whether a message's text opens like a compaction summary.
fn is_summary(content: &MessageContent) -> bool {
    let opens = |text: &str| SUMMARY_OPENINGS.iter().any(|o| text.contains(o));
    match content {
        MessageContent::Text(text) => opens(text),
        MessageContent::Blocks(blocks) => blocks.iter().any(|b| matches!(b, ContentBlock::Text { text, .. } if opens(text))),
    }
}

impl Structure {
    pub fn of(request: &Request) -> Structure {
        Structure {
            tools: request.tools().iter().map(|t| (t.name.clone(), t.defer_loading == Some(true))).collect(),
            billing: system_texts(request).iter().position(|t| t.starts_with(BILLING_PREFIX)),
            tool_choice: value_hash(request.tool_choice.as_ref()),
            thinking: value_hash(request.thinking.as_deref()),
            effort: request.output_config.as_ref().and_then(|c| c.get("effort")).map(|e| e.to_string()),
            // A summary opens the conversation it restarts: only the first messages are read
            // (a log repeats the whole history on every request).
            summary: request
                .messages
                .iter()
                .take(SUMMARY_WITHIN)
                .position(|m| m.role == Role::User && is_summary(&m.content))
                .map(|i| (i, hash128(request.messages[i].content.joined_text().as_bytes()))),
            inline_start: super::blocks::opens_with_inline_tool(request),
        }
    }
}

/// The cause of a divergence at block `common` of `current` (see the module documentation).
pub fn cause(previous: &Structure, current: &Structure, flat: &FlatRequest, common: usize) -> &'static str {
    if current.inline_start != previous.inline_start {
        return "tool_defined_inline";
    }
    // A new summary explains whatever else changed with it (the billing fingerprint, the
    // restored files, the system message): the root cause, as when it is journalled.
    if current.summary.is_some() && current.summary.map(|(_, h)| h) != previous.summary.map(|(_, h)| h) {
        return "compaction";
    }
    let Some(block) = flat.blocks.get(common) else { return "message_rewritten" };
    match block.path.region {
        Region::Tools => {
            let names = |s: &Structure| s.tools.iter().map(|(n, _)| n.clone()).collect::<BTreeSet<_>>();
            let (before, after) = (names(previous), names(current));
            let added: Vec<&String> = after.difference(&before).collect();
            if before.is_subset(&after) && !added.is_empty() && current.tools.iter().filter(|(n, _)| added.contains(&n)).all(|(_, deferred)| *deferred) {
                "tool_loaded"
            } else if before == after && previous.tools != current.tools {
                "tool_order_changed"
            } else {
                "tools_changed"
            }
        }
        Region::System if current.billing == Some(block.path.index) && previous.billing == Some(block.path.index) => "billing_fingerprint_changed",
        Region::System if current.tool_choice != previous.tool_choice => "tool_choice_changed",
        Region::System => "system_changed",
        Region::Messages if current.thinking != previous.thinking => "thinking_changed",
        Region::Messages if current.effort != previous.effort => "effort_changed",
        Region::Messages => "message_rewritten",
    }
}

/// A key of a request's first message: its blocks' hashes (markers and the string/list form
/// left out, as the cache leaves them out; the tools and system before it left out too).
pub fn first_message_key(flat: &FlatRequest) -> Option<u128> {
    let start = flat.counts.tools + flat.counts.system;
    let blocks = flat.blocks[start..].iter().take_while(|b| b.path.region == Region::Messages && b.path.index == 0);
    let mut key = None;
    for block in blocks {
        key = Some(chain(key.unwrap_or(0), block.hash));
    }
    key
}

/// A key of a request's system prompt without the billing block, and of its non-deferred tool
/// names (sorted).
pub fn signature(request: &Request, flat: &FlatRequest) -> (u128, u128) {
    let texts = system_texts(request);
    let mut system = 0;
    let start = flat.counts.tools;
    for block in &flat.blocks[start..start + flat.counts.system] {
        if !texts.get(block.path.index).is_some_and(|t| t.starts_with(BILLING_PREFIX)) {
            system = chain(system, block.hash);
        }
    }
    let names: BTreeSet<&str> = request.tools().iter().filter(|t| t.defer_loading != Some(true)).map(|t| t.name.as_str()).collect();
    let mut tools = 0;
    for name in names {
        tools = chain(tools, hash128(name.as_bytes()));
    }
    (system, tools)
}

#[derive(Debug, Clone)]
struct KnownLane {
    name: String,
    signature: (u128, u128),
    first: Option<u128>,
}

/// Recognizes the main lane and subagent lanes of a client's requests (see the module
/// documentation). Side requests (no tools, a small model) and compaction forks are the
/// caller's to tell apart first.
#[derive(Debug, Clone, Default)]
pub struct LaneRecognizer {
    lanes: Vec<KnownLane>,
    subagents: Vec<(u128, u128)>,
}

/// What [`LaneRecognizer::assign`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assigned {
    pub lane: String,
    /// A new conversation on a lane that had one (another subagent of the same kind): compare it
    /// with nothing.
    pub new_conversation: bool,
}

impl LaneRecognizer {
    pub fn assign(&mut self, request: &Request, flat: &FlatRequest) -> Assigned {
        let first = first_message_key(flat);
        let signature = signature(request, flat);
        // The conversation continues where a lane's first message is this one's.
        if let Some(lane) = self.lanes.iter_mut().find(|l| l.first.is_some() && l.first == first) {
            lane.signature = signature;
            return Assigned { lane: lane.name.clone(), new_conversation: false };
        }
        // A new conversation: the main lane restarted when its system prompt is main's.
        let main_restart = self.lanes.first().is_none_or(|main| main.signature.0 == signature.0);
        let name = if main_restart {
            "main".to_owned()
        } else {
            let n = match self.subagents.iter().position(|s| *s == signature) {
                Some(i) => i + 1,
                None => {
                    self.subagents.push(signature);
                    self.subagents.len()
                }
            };
            format!("subagent:{n}")
        };
        let new_conversation = match self.lanes.iter_mut().find(|l| l.name == name) {
            Some(lane) => {
                lane.first = first;
                lane.signature = signature;
                // The main lane restarting (a compaction, a resume) stays one lane to compare.
                name != "main"
            }
            None => {
                self.lanes.push(KnownLane { name: name.clone(), signature, first });
                false
            }
        };
        Assigned { lane: name, new_conversation }
    }
}
