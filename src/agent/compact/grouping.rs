//! API-round grouping (§5.7) and the head truncation that retries a summary request that was
//! itself too long.
//!
//! - **Trigger**: the compact fork answered `Prompt is too long` (up to `max_ptl_retries` times).
//! - **Rewrites**: drops the oldest API-round groups of the fork's input (never the only group).
//! - **Preserves**: whole groups go, so a tool_use and its tool_result (same round) stay together;
//!   a conversation that would start with an assistant message gets a meta user marker first.
//! - **Invalidates**: the fork's prefix from its first message (the main lane is untouched).

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

/// `truncateHeadForPTLRetry`. `gap` is actual − limit from the error when known.
pub fn truncate_head_for_ptl_retry(entries: &[Entry], gap: Option<u64>, marker_uuid: u64) -> Option<Vec<Entry>> {
    let skip = usize::from(entries.first().is_some_and(|e| e.is_meta && is_retry_marker(e.message())));
    let entries = &entries[skip..];
    let groups = group_by_api_round(entries);
    if groups.len() < 2 {
        return None;
    }
    let mut drop = match gap {
        Some(gap) => {
            let mut freed = 0;
            let mut n = 0;
            for group in &groups {
                if freed >= gap {
                    break;
                }
                freed += rough_entries(&entries[group.clone()]);
                n += 1;
            }
            n
        }
        None => (groups.len() / 5).max(1),
    };
    drop = drop.min(groups.len() - 1);
    if drop < 1 {
        return None;
    }
    let mut kept: Vec<Entry> = entries[groups[drop].start..].to_vec();
    if kept.first().is_some_and(Entry::is_assistant) {
        let ts = kept[0].timestamp_ms;
        let mut marker = Entry::new(Message::user_text(PTL_RETRY_MARKER), marker_uuid, ts);
        marker.is_meta = true;
        kept.insert(0, marker);
    }
    Some(kept)
}

fn is_retry_marker(message: &Message) -> bool {
    matches!(&message.content, crate::api::MessageContent::Text(t) if t == PTL_RETRY_MARKER)
}
