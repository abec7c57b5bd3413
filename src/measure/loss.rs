//! Information-loss metrics, so that "compact less" does not always win a tuning sweep.
//!
//! - **Tokens dropped from view**: per compaction, the tokens a shrinking stage removed
//!   (`tokens_before − tokens_after` of every fired stage that shrank). A request that carries a
//!   `compaction` or `microcompact` event but no stage reports (a replayed recording) counts the
//!   drop of its context against the lane's previous request instead.
//! - **Recall misses**: a later turn names something whose content is no longer visible in the
//!   request: a tool call whose input names a file path that an earlier Read result showed and
//!   that no visible Read result shows any more, or a tool call that names an earlier
//!   `tool_use` id whose result was cleared; or a new user prompt naming such a path.
//! - **Re-reads caused by compaction**: a Read of a path whose earlier Read result was dropped
//!   (the "compaction death spiral" of openai/codex#13279). Each is also a recall miss.
//!
//! Visibility is judged on the request body as sent: a Read result is visible when its
//! `tool_result` is present, not a cleared placeholder, and not cleared server-side by context
//! editing (the row's `context_management.cleared_tool_use_ids`). Files restored as attachments after a
//! compaction are not tracked (their path is not a Read result); this undercounts visibility and
//! so can only overcount misses for strategies that restore files — documented, not hidden.
//! The tracker is streaming (one request at a time) and keeps only ids and paths.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::api::{ContentBlock, MessageContent, Request, Role, ToolResultContent};

use super::metrics::RequestMetrics;

/// Texts a stage leaves in place of a result (ours, Claude Code's, peers').
const PLACEHOLDERS: [&str; 3] = ["[Old tool result content cleared]", "[Old tool result cleared]", "Old environment output"];

/// The summary's `info_loss` object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InfoLoss {
    /// Sum of tokens that left the model's view over all compactions.
    pub tokens_dropped: u64,
    /// Compactions (stage firings or recorded events) that dropped tokens.
    pub compactions: u64,
    /// The largest single drop.
    pub max_dropped: u64,
    pub recall_misses: u64,
    pub rereads_after_compaction: u64,
}

/// Follows a run request by request.
#[derive(Debug, Clone, Default)]
pub struct LossTracker {
    loss: InfoLoss,
    /// Paths shown by a Read result in some earlier request.
    seen_paths: BTreeSet<String>,
    /// Tool use ids whose result was visible in some earlier request.
    seen_results: BTreeSet<String>,
    /// Tool uses already judged (each call is judged once, when it first appears).
    judged_uses: BTreeSet<String>,
    /// The last user prompt judged, per lane.
    judged_prompt: BTreeMap<String, u64>,
    /// Context tokens of each lane's previous request.
    previous_context: BTreeMap<String, u64>,
}

impl LossTracker {
    pub fn new() -> Self {
        LossTracker::default()
    }

    /// Observes one measured request.
    pub fn observe(&mut self, request: &Request, row: &RequestMetrics) {
        self.count_drops(row);
        let cleared: &[String] = row.context_management.as_ref().map_or(&[], |cm| &cm.cleared_tool_use_ids);
        self.judge(request, &row.lane, cleared);
    }

    /// Only the drops (when the body is not at hand).
    pub fn count_drops(&mut self, row: &RequestMetrics) {
        let mut dropped_here = 0u64;
        let mut staged = false;
        for stage in row.stages.iter().filter(|s| s.fired) {
            staged = true;
            if stage.tokens_after < stage.tokens_before {
                let d = stage.tokens_before - stage.tokens_after;
                self.loss.compactions += 1;
                self.loss.max_dropped = self.loss.max_dropped.max(d);
                dropped_here += d;
            }
        }
        if !staged
            && row.events.iter().any(|e| e == "compaction" || e == "microcompact")
            && let Some(&previous) = self.previous_context.get(&row.lane)
            && previous > row.context_tokens
        {
            let d = previous - row.context_tokens;
            self.loss.compactions += 1;
            self.loss.max_dropped = self.loss.max_dropped.max(d);
            dropped_here += d;
        }
        self.loss.tokens_dropped += dropped_here;
        if row.error.is_none() {
            self.previous_context.insert(row.lane.clone(), row.context_tokens);
        }
    }

    /// `cleared`: tool uses whose results the server cleared (context editing) though the body
    /// still carries them.
    fn judge(&mut self, request: &Request, lane: &str, cleared: &[String]) {
        // What this request shows.
        let mut read_path_of: BTreeMap<&str, &str> = BTreeMap::new();
        let mut visible_results: BTreeSet<&str> = BTreeSet::new();
        let mut uses: Vec<(&str, &str, &serde_json::Value)> = Vec::new();
        for message in &request.messages {
            let MessageContent::Blocks(blocks) = &message.content else { continue };
            for block in blocks {
                match block {
                    ContentBlock::ToolUse { id, name, input, .. } => {
                        if name == "Read"
                            && let Some(path) = input.get("file_path").and_then(|v| v.as_str())
                        {
                            read_path_of.insert(id, path);
                        }
                        uses.push((id, name, input));
                    }
                    ContentBlock::ToolResult { tool_use_id, content, is_error, .. }
                        if is_error != &Some(true) && content.as_ref().is_some_and(|c| !is_placeholder(c)) && !cleared.contains(tool_use_id) => {
                            visible_results.insert(tool_use_id);
                        }
                    _ => {}
                }
            }
        }
        let visible_paths: BTreeSet<&str> =
            read_path_of.iter().filter(|(id, _)| visible_results.contains(**id)).map(|(_, p)| *p).collect();
        let invisible = |path: &str| !visible_paths.contains(path);

        // New tool calls: judged against what was seen before this request.
        for (id, name, input) in &uses {
            if self.judged_uses.contains(*id) {
                continue;
            }
            self.judged_uses.insert((*id).to_owned());
            if *name == "Read"
                && let Some(path) = input.get("file_path").and_then(|v| v.as_str())
            {
                // The call's own result is not in this request yet: what matters is whether an
                // earlier read of the path is still visible.
                if self.seen_paths.contains(path) && invisible(path) {
                    self.loss.rereads_after_compaction += 1;
                    self.loss.recall_misses += 1;
                }
                continue;
            }
            let text = input.to_string();
            let miss_path = self.seen_paths.iter().any(|p| invisible(p) && text.contains(p.as_str()));
            let miss_id = tool_use_ids_in(&text).any(|r| self.seen_results.contains(r) && !visible_results.contains(r));
            if miss_path || miss_id {
                self.loss.recall_misses += 1;
            }
        }

        // A new user prompt (the last user message with text) naming a path no longer visible.
        if let Some(last) = request.messages.iter().rev().find(|m| m.role == Role::User) {
            let text = last.content.joined_text();
            if !text.is_empty() {
                let key = xxhash_rust::xxh3::xxh3_64(text.as_bytes());
                if self.judged_prompt.get(lane) != Some(&key) {
                    self.judged_prompt.insert(lane.to_owned(), key);
                    if self.seen_paths.iter().any(|p| invisible(p) && text.contains(p.as_str())) {
                        self.loss.recall_misses += 1;
                    }
                }
            }
        }

        for path in visible_paths {
            if !self.seen_paths.contains(path) {
                self.seen_paths.insert(path.to_owned());
            }
        }
        for id in visible_results {
            if !self.seen_results.contains(id) {
                self.seen_results.insert(id.to_owned());
            }
        }
    }

    pub fn finish(self) -> InfoLoss {
        self.loss
    }
}

/// `toolu_…` ids named in a text.
fn tool_use_ids_in(text: &str) -> impl Iterator<Item = &str> {
    text.match_indices("toolu_").map(move |(start, _)| {
        let end = text[start..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(text.len(), |e| start + e);
        &text[start..end]
    })
}

fn is_placeholder(content: &ToolResultContent) -> bool {
    match content {
        ToolResultContent::Text(t) => t.is_empty() || PLACEHOLDERS.iter().any(|p| t.starts_with(p)),
        ToolResultContent::Blocks(blocks) => {
            blocks.iter().all(|b| matches!(b, ContentBlock::Text { text, .. } if PLACEHOLDERS.iter().any(|p| text.starts_with(p))))
        }
    }
}

/// Information loss of a whole run (bodies and rows in the same order).
pub fn info_loss(requests: &[Request], rows: &[RequestMetrics]) -> InfoLoss {
    let mut tracker = LossTracker::new();
    for (request, row) in requests.iter().zip(rows) {
        tracker.observe(request, row);
    }
    tracker.finish()
}
