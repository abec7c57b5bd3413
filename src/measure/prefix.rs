//! Prefix stability and cause attribution.
//!
//! Each request is compared with the previous request of its lane by block prefix hashes.
//! Because a position's prefix hash chains every earlier block, "equal at i" implies "equal at
//! every j < i", so the longest common prefix is found by binary search.
//!
//! When the prefix diverged, or the cache read fell short, the cause comes from a closed list
//! ([`CAUSES`]). Events that the agent and the World journal between two requests (an MCP
//! server connected, a section of the system prompt changed, microcompact cleared a result,
//! ...) are matched to the region where the prefix diverged; what no event explains is derived
//! from the structure (the TTL ran out, the write lay beyond the 20-position lookback, the
//! model changed) or reported as `unexplained_*`.

use serde::{Deserialize, Serialize};

use super::blocks::{FlatRequest, Region};
use super::cache::CacheOutcome;

/// The closed list of causes: id, region it affects (None: any), description.
pub const CAUSES: &[(&str, Option<Region>, &str)] = &[
    ("cold_start", None, "first request of its lane: nothing was cached yet"),
    ("model_changed", None, "the model changed; each model has its own cache"),
    ("ttl_expired", None, "the entry the prefix would have read expired (idle gap longer than the TTL)"),
    ("lookback_exceeded", None, "the previous entry lay more than 20 block positions before the breakpoint"),
    ("below_minimum", None, "the prefix is shorter than the model's minimum cacheable length"),
    ("no_breakpoint", None, "the request carries no cache_control marker"),
    ("tools_changed", Some(Region::Tools), "tool definitions were added, removed or edited"),
    ("tool_order_changed", Some(Region::Tools), "the same tools were sent in another order"),
    ("tool_loaded", Some(Region::Tools), "a deferred tool was loaded (ToolSearch) and inserted into tools"),
    ("mcp_connected", None, "an MCP server connected"),
    ("mcp_disconnected", None, "an MCP server disconnected"),
    ("mcp_tools_changed", None, "an MCP server sent tools/list_changed"),
    ("plugin_reloaded", None, "plugins were enabled or reloaded"),
    ("system_changed", Some(Region::System), "the system prompt changed"),
    ("system_section_changed", Some(Region::System), "a named system prompt section changed"),
    ("billing_fingerprint_changed", Some(Region::System), "the billing header's first-message fingerprint changed"),
    ("tool_choice_changed", Some(Region::System), "tool_choice changed (invalidates system and messages)"),
    ("thinking_changed", Some(Region::Messages), "thinking parameters changed (invalidates messages)"),
    ("effort_changed", Some(Region::Messages), "the top-level output_config.effort changed (invalidates messages; effort in a system message does not)"),
    ("tool_defined_inline", None, "a tool defined by value in a system message opened the rendered prompt (no non-deferred tool in tools): one full miss"),
    ("date_changed", Some(Region::Messages), "the date rolled over and the user context was re-rendered"),
    ("claude_md_changed", Some(Region::Messages), "the memory files in messages[0] changed"),
    ("message_rewritten", Some(Region::Messages), "an earlier message was re-rendered"),
    ("hook_context_folded", Some(Region::Messages), "hook context after a tool_result was folded into it on the next turn"),
    ("attachment_reordered", Some(Region::Messages), "attachments were placed differently in an earlier message"),
    ("compaction", None, "the conversation was compacted"),
    ("session_memory_compaction", None, "session-memory compaction replaced the history"),
    ("microcompact_cleared_tool_result", Some(Region::Messages), "microcompact cleared an old tool result"),
    ("tool_result_budget", Some(Region::Messages), "the tool result budget replaced a result with a preview"),
    ("snip", Some(Region::Messages), "snip removed old messages"),
    ("context_collapse", Some(Region::Messages), "context collapse replaced a span with its summary"),
    ("context_editing", Some(Region::Messages), "API context editing cleared tool uses or thinking"),
    ("thinking_cleared", Some(Region::Messages), "earlier thinking blocks were cleared"),
    ("truncation", Some(Region::Messages), "older turns were dropped"),
    ("session_resumed", None, "the session was resumed and its start re-rendered"),
    ("conversation_cleared", None, "/clear started a new conversation"),
    ("unexplained_tools", Some(Region::Tools), "tools diverged with no journalled event"),
    ("unexplained_system", Some(Region::System), "the system prompt diverged with no journalled event"),
    ("unexplained_messages", Some(Region::Messages), "messages diverged with no journalled event"),
    ("unexplained", None, "the read fell short with no structural or journalled reason"),
];

/// Causes that explain the derived changes they bring along, named first when journalled.
/// `session_resumed` is not one: a resume re-reads snapshots, and the snapshot that changed
/// (`system_section_changed:git_status`, ...) is the cause worth naming; it remains the
/// fallback when nothing more specific was journalled.
pub const ROOT_CAUSES: &[&str] = &["compaction", "session_memory_compaction", "conversation_cleared", "plugin_reloaded"];

/// The id part of an event or cause (`mcp_connected:jira` → `mcp_connected`).
pub fn cause_id(event: &str) -> &str {
    event.split(':').next().unwrap_or(event)
}

/// Whether `event` names a cause in the closed list.
pub fn is_known_cause(event: &str) -> bool {
    let id = cause_id(event);
    CAUSES.iter().any(|(name, _, _)| *name == id)
}

fn cause_region(event: &str) -> Option<Region> {
    let id = cause_id(event);
    CAUSES.iter().find(|(name, _, _)| *name == id).and_then(|(_, region, _)| *region)
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PrefixReport {
    pub common_blocks: usize,
    pub common_tokens: u64,
    /// First divergent block path, or null when the request extends the previous one.
    pub diverged_at: Option<String>,
    pub cause: Option<String>,
    /// The position of the cache entry read, as a block path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_at: Option<String>,
}

/// Longest common prefix of two requests, in blocks.
pub fn common_prefix(previous: &[u128], current: &[u128]) -> usize {
    common_prefix_by(previous, current.len(), |i| current[i])
}

/// [`common_prefix`] against a request's blocks, read in place.
pub fn common_prefix_with(previous: &[u128], current: &FlatRequest) -> usize {
    common_prefix_by(previous, current.blocks.len(), |i| current.blocks[i].prefix_hash)
}

fn common_prefix_by(previous: &[u128], len: usize, current: impl Fn(usize) -> u128) -> usize {
    let (mut lo, mut hi) = (0usize, previous.len().min(len));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if previous[mid - 1] == current(mid - 1) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The lane's previous request, as attribution needs it.
#[derive(Debug, Clone, Default)]
pub struct LaneMemory {
    pub prefix_hashes: Vec<u128>,
    pub model: String,
    pub cached_after: u64,
    pub time_ms: u64,
    /// Tokens `cache_edits` had deleted from this request's prefix (cached microcompact).
    pub deleted_tokens: u64,
    /// The request's structure, kept when causes are read from the structure
    /// ([`super::Measurer::with_structural_causes`]).
    pub structure: Option<super::structure::Structure>,
}

impl LaneMemory {
    /// `prefix_hashes` made those of `current`: the common prefix kept, the rest replaced (the
    /// cost of what changed, not of the whole request).
    pub fn take_prefix_hashes(previous: Option<&mut LaneMemory>, current: &FlatRequest) -> Vec<u128> {
        let Some(previous) = previous else { return current.blocks.iter().map(|b| b.prefix_hash).collect() };
        let mut hashes = std::mem::take(&mut previous.prefix_hashes);
        let common = common_prefix_with(&hashes, current);
        hashes.truncate(common);
        hashes.extend(current.blocks[common..].iter().map(|b| b.prefix_hash));
        hashes
    }
}

/// Attributes a cause to a request given the lane's previous request and the events journalled
/// since then. `is_break` is the contract's cache-break test on the read.
pub fn attribute(
    previous: Option<&LaneMemory>,
    current: &FlatRequest,
    outcome: &CacheOutcome,
    events: &[String],
    is_break: bool,
) -> PrefixReport {
    let mut report = PrefixReport {
        read_at: outcome.read_position.map(|p| current.blocks[p].path.render()),
        ..PrefixReport::default()
    };
    let Some(previous) = previous else {
        report.cause = (outcome.cache_read_input_tokens == 0).then(|| "cold_start".to_owned());
        return report;
    };
    if previous.model != current.model {
        report.diverged_at = current.blocks.first().map(|b| b.path.render());
        report.cause = Some(events.iter().find(|e| cause_id(e) == "model_changed").cloned().unwrap_or_else(|| "model_changed".to_owned()));
        return report;
    }
    let common = common_prefix_with(&previous.prefix_hashes, current);
    report.common_blocks = common;
    report.common_tokens = if common == 0 { 0 } else { current.blocks[common - 1].prefix_tokens };
    let diverged = common < previous.prefix_hashes.len();
    let structural = || -> Option<String> {
        if outcome.expired_position.is_some() && outcome.read_position.is_none_or(|r| outcome.expired_position > Some(r)) {
            Some("ttl_expired".to_owned())
        } else if outcome.beyond_lookback_position.is_some() {
            Some("lookback_exceeded".to_owned())
        } else if outcome.below_minimum {
            Some("below_minimum".to_owned())
        } else if outcome.breakpoints.is_empty() {
            Some("no_breakpoint".to_owned())
        } else {
            None
        }
    };
    if diverged {
        let region = current.blocks.get(common).map(|b| b.path.region).unwrap_or(Region::Messages);
        report.diverged_at = Some(match current.blocks.get(common) {
            Some(block) => block.path.render(),
            None => format!("{}[end]", region.as_str()),
        });
        // Root causes ripple into derived changes (a compaction also changes the billing
        // fingerprint and messages[0]); name the root when it was journalled.
        let root = events.iter().find(|e| ROOT_CAUSES.contains(&cause_id(e)));
        let matching = root.or_else(|| events.iter().find(|e| is_known_cause(e) && cause_region(e) == Some(region)));
        let regionless = events.iter().find(|e| is_known_cause(e) && cause_region(e).is_none() && !matches!(cause_id(e), "ttl_expired"));
        report.cause = matching.or(regionless).cloned().or_else(|| {
            Some(match region {
                Region::Tools => "unexplained_tools",
                Region::System => "unexplained_system",
                Region::Messages => "unexplained_messages",
            }
            .to_owned())
        });
        // A TTL expiry hides behind a divergence only when nothing at all was read.
        if outcome.cache_read_input_tokens == 0 && outcome.expired_position.is_some() && report.cause.as_deref().is_some_and(|c| c.starts_with("unexplained")) {
            report.cause = Some("ttl_expired".to_owned());
        }
    } else if is_break {
        report.cause = structural().or_else(|| Some("unexplained".to_owned()));
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_search_finds_the_common_prefix() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 3, 4]), 3);
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 9, 9]), 1);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[5], &[6]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2]), 2);
    }
}
