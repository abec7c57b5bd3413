//! API-round grouping (§5.7), the head truncation that retries a proactive summary request
//! that was itself too long, and the tail peel of reactive compaction (§4.3).
//!
//! - **Trigger**: the simulated API refused the compact fork (`prompt is too long: N tokens > M
//!   maximum`), up to `max_ptl_retries` times; for reactive compaction also the main request's
//!   refusal, before the first fork is sent.
//! - **Rewrites**: the proactive fork drops the *oldest* API-round groups
//!   ([`truncate_head_for_ptl_retry`]); the reactive fork peels the *newest* ones
//!   ([`peel_tail_for_ptl`]): those are what overflowed the window. Never every group.
//! - **Preserves**: whole groups go, so a tool_use and its tool_result (same round) stay together;
//!   a head-truncated conversation that would start with an assistant message gets a meta user
//!   marker first.
//! - **Invalidates**: the fork's prefix from its first message (head) or from the first peeled
//!   message (tail); the main lane is untouched.

use std::ops::Range;

use crate::api::Message;

use super::context::Entry;
use super::counting::rough_entries;

/// The meta user marker put in front of a truncated retry.
pub const PTL_RETRY_MARKER: &str = "[earlier conversation truncated for compaction retry]";

/// `groupMessagesByApiRound`: a new group starts at an assistant record whose `message.id`
/// differs from the previous assistant's. Group 0 is the preamble before the first assistant.
pub fn group_by_api_round(entries: &[Entry]) -> Vec<Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    let mut last_id: Option<&str> = None;
    let mut seen_assistant = false;
    for (i, entry) in entries.iter().enumerate() {
        if entry.is_assistant() {
            let id = entry.message_id.as_deref();
            let same = seen_assistant && id.is_some() && id == last_id;
            if !same && i > start {
                groups.push(start..i);
                start = i;
            }
            last_id = id;
            seen_assistant = true;
        }
    }
    if start < entries.len() {
        groups.push(start..entries.len());
    }
    groups
}

/// What a truncation or a peel removed from a fork's input.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trimmed {
    /// The fork's input after the cut.
    pub kept: Vec<Entry>,
    /// The removed records, in conversation order.
    pub removed: Vec<Entry>,
    /// How many API-round groups went, and their rough tokens.
    pub groups: usize,
    pub tokens: u64,
}

/// How many groups to remove, taken from the end `groups` iterates from: enough to cover `gap`
/// when it is known, else a fifth (at least one); never all of them (`None` below two groups).
fn groups_to_remove<'g>(entries: &[Entry], groups: impl Iterator<Item = &'g Range<usize>>, count: usize, gap: Option<u64>) -> Option<(usize, u64)> {
    if count < 2 {
        return None;
    }
    let mut freed = 0;
    let mut n = 0;
    for group in groups.take(count - 1) {
        let enough = match gap {
            Some(gap) => freed >= gap,
            None => n >= (count / 5).max(1),
        };
        if enough {
            break;
        }
        freed += rough_entries(&entries[group.clone()]);
        n += 1;
    }
    (n >= 1).then_some((n, freed))
}

/// `truncateHeadForPTLRetry`: drops the oldest groups. `gap` is actual − limit from the error
/// when known.
pub fn truncate_head_for_ptl_retry(entries: &[Entry], gap: Option<u64>, marker_uuid: u64) -> Option<Vec<Entry>> {
    truncate_head(entries, gap, marker_uuid).map(|t| t.kept)
}

/// [`truncate_head_for_ptl_retry`] with what went.
pub fn truncate_head(entries: &[Entry], gap: Option<u64>, marker_uuid: u64) -> Option<Trimmed> {
    let skip = usize::from(entries.first().is_some_and(|e| e.is_meta && is_retry_marker(e.message())));
    let entries = &entries[skip..];
    let groups = group_by_api_round(entries);
    let (drop, tokens) = groups_to_remove(entries, groups.iter(), groups.len(), gap)?;
    let cut = groups[drop].start;
    let mut kept: Vec<Entry> = entries[cut..].to_vec();
    if kept.first().is_some_and(Entry::is_assistant) {
        let ts = kept[0].timestamp_ms;
        let mut marker = Entry::new(Message::user_text(PTL_RETRY_MARKER), marker_uuid, ts);
        marker.is_meta = true;
        kept.insert(0, marker);
    }
    Some(Trimmed { kept, removed: entries[..cut].to_vec(), groups: drop, tokens })
}

/// The reactive path's peel (§4.3 "peels API-round groups from the tail using the PTL token
/// gap"): drops the newest groups until their rough tokens cover `gap` (a fifth of the groups
/// when the gap is unknown), never the first group. `None` below two groups (`too_few_groups`).
pub fn peel_tail_for_ptl(entries: &[Entry], gap: Option<u64>) -> Option<Trimmed> {
    let groups = group_by_api_round(entries);
    let (peel, tokens) = groups_to_remove(entries, groups.iter().rev(), groups.len(), gap)?;
    let cut = groups[groups.len() - peel].start;
    Some(Trimmed { kept: entries[..cut].to_vec(), removed: entries[cut..].to_vec(), groups: peel, tokens })
}

fn is_retry_marker(message: &Message) -> bool {
    matches!(&message.content, crate::api::MessageContent::Text(t) if t == PTL_RETRY_MARKER)
}
