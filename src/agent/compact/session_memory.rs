//! Session memory (§6) and session-memory compaction (§5.8).
//!
//! - **Extraction trigger** (after sampling, main thread): the conversation reached 10k tokens
//!   once, then +5k tokens since the last extraction and either 3 tool calls since then or a
//!   last turn without tool calls. The caller sends [`extraction_request`] in lane
//!   `session_memory` and hands the new notes to [`finish_extraction`], which writes the memory
//!   file in the virtual filesystem.
//! - **Compaction** (tried first inside autocompact): keeps the messages after the last
//!   summarized one, extended backwards until 10k–40k tokens and at least 5 text messages are
//!   kept; the memory file becomes the summary. **Preserves**: never splits a tool_use from its
//!   tool_result, nor thinking fragments sharing one `message.id`. Falls back to full compaction
//!   when the result would still be over the autocompact threshold.
//! - **Invalidates**: everything from `messages[0]` (the summary replaces the history).

use std::collections::BTreeSet;

use crate::api::{ContentBlock, Message, MessageContent};

use super::context::{ChainContext, CompactTrigger, Entry};
use super::counting::{estimate_message_tokens, token_count_from_last_response, token_count_with_estimation};
use super::rebuild::{AttachmentMode, rebuild};

/// Section headers of the memory file (the reference's template headings); descriptions ours.
pub const TEMPLATE: &str = "# Session Title\n_A few words naming this session._\n\n\
# Current State\n_What is being worked on right now and what comes next._\n\n\
# Task specification\n_What the user asked for, with constraints._\n\n\
# Files and Functions\n_Files and functions that matter, and why._\n\n\
# Workflow\n_Commands and steps that work here._\n\n\
# Errors & Corrections\n_What went wrong and how it was fixed._\n\n\
# Codebase and System Documentation\n_How the relevant parts of the system fit together._\n\n\
# Learnings\n_What to do and avoid next time._\n\n\
# Key results\n_Answers and outputs the user asked for._\n\n\
# Worklog\n_One line per step taken._\n";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionMemoryState {
    pub initialized: bool,
    pub tokens_at_last_extraction: u64,
    pub last_memory_uuid: Option<u64>,
    pub last_summarized_uuid: Option<u64>,
    pub extractions: u64,
}

/// The fork that updates the notes.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionMemoryRequest {
    pub lane: &'static str,
    pub messages: Vec<Message>,
    pub memory_path: String,
}

fn last_turn_has_tools(entries: &[Entry]) -> bool {
    entries.iter().rev().find(|e| e.is_assistant()).is_some_and(|e| e.tool_use_ids().next().is_some())
}

/// `shouldExtractMemory`, mutating the init latch and the last-memory marker as the client does.
pub fn should_extract(cx: &mut ChainContext<'_>) -> bool {
    let config = &cx.config.session_memory;
    if !config.enabled || !cx.source.is_main_thread() {
        return false;
    }
    let current = token_count_with_estimation(&cx.entries);
    let state = &mut cx.state.session_memory;
    if !state.initialized {
        if current < config.init_tokens {
            return false;
        }
        state.initialized = true;
    }
    let tokens_ok = current.saturating_sub(state.tokens_at_last_extraction) >= config.tokens_between_updates;
    let after = match state.last_memory_uuid {
        Some(uuid) => cx.entries.iter().position(|e| e.uuid == uuid).map_or(0, |i| i + 1),
        None => 0,
    };
    let tool_calls: usize = cx.entries[after..].iter().filter(|e| e.is_assistant()).map(|e| e.tool_use_ids().count()).sum();
    let tools_ok = tool_calls >= config.tool_calls_between_updates;
    let extract = tokens_ok && (tools_ok || !last_turn_has_tools(&cx.entries));
    if extract {
        state.last_memory_uuid = cx.entries.last().map(|e| e.uuid);
    }
    extract
}

/// The extraction fork: the conversation plus our update instruction with the current notes.
pub fn extraction_request(cx: &mut ChainContext<'_>) -> SessionMemoryRequest {
    let path = cx.state.memory_path();
    if !cx.fs.exists(&path) {
        let _ = cx.fs.write(&path, TEMPLATE, cx.clock);
    }
    let notes = cx.fs.read(&path).unwrap_or(TEMPLATE).to_owned();
    let mut messages = cx.wire_messages();
    messages.push(Message::user_text(format!(
        "Update the session notes at {path} so that someone taking over could continue the work. \
         Edit only that file; keep every section heading; be specific and brief.\n\nCurrent notes:\n{notes}"
    )));
    SessionMemoryRequest { lane: "session_memory", messages, memory_path: path }
}

/// Writes the new notes and moves the extraction markers.
pub fn finish_extraction(cx: &mut ChainContext<'_>, notes: &str) {
    let path = cx.state.memory_path();
    let _ = cx.fs.write(&path, notes, cx.clock);
    let tokens = token_count_with_estimation(&cx.entries);
    let state = &mut cx.state.session_memory;
    state.tokens_at_last_extraction = tokens;
    state.extractions += 1;
    if !last_turn_has_tools(&cx.entries) {
        state.last_summarized_uuid = cx.entries.last().map(|e| e.uuid);
    }
}

/// `hasTextBlocks`.
fn has_text(entry: &Entry) -> bool {
    match &entry.message().content {
        MessageContent::Text(t) => !entry.is_assistant() && !t.is_empty(),
        MessageContent::Blocks(blocks) => blocks.iter().any(|b| matches!(b, ContentBlock::Text { .. })),
    }
}

/// `calculateMessagesToKeepIndex` followed by `adjustIndexToPreserveAPIInvariants`.
pub fn messages_to_keep_index(cx: &ChainContext<'_>, last_summarized: usize) -> usize {
    let config = &cx.config.session_memory;
    let entries = &cx.entries;
    let mut start = (last_summarized + 1).min(entries.len());
    let done = |s: usize| {
        let tokens = estimate_message_tokens(&entries[s..]);
        let texts = entries[s..].iter().filter(|e| e.on_wire() && has_text(e)).count();
        tokens >= config.compact_max_tokens || (tokens >= config.compact_min_tokens && texts >= config.compact_min_text_messages)
    };
    let floor = entries.iter().rposition(Entry::is_boundary).map_or(0, |i| i + 1);
    while !done(start) && start > floor {
        start -= 1;
    }
    adjust_for_invariants(entries, start)
}

/// Moves `start` back so no kept tool_result loses its tool_use and no kept assistant loses an
/// earlier fragment of the same `message.id`.
pub fn adjust_for_invariants(entries: &[Entry], mut start: usize) -> usize {
    let kept_uses: BTreeSet<&str> = entries[start..].iter().flat_map(|e| e.tool_use_ids()).collect();
    let missing: BTreeSet<&str> =
        entries[start..].iter().flat_map(|e| e.tool_result_ids()).filter(|id| !kept_uses.contains(id)).collect();
    if !missing.is_empty() {
        for i in (0..start).rev() {
            if entries[i].tool_use_ids().any(|id| missing.contains(id)) {
                start = i;
            }
        }
    }
    let ids: BTreeSet<&str> = entries[start..].iter().filter(|e| e.is_assistant()).filter_map(|e| e.message_id.as_deref()).collect();
    for i in (0..start).rev() {
        if entries[i].is_assistant() && entries[i].message_id.as_deref().is_some_and(|id| ids.contains(id)) {
            start = i;
        }
    }
    start
}

/// `truncateSessionMemoryForCompact`: each `# ` section's body limited at a line boundary.
pub fn truncate_for_compact(notes: &str, section_max_chars: usize) -> (String, bool) {
    let mut out = String::new();
    let mut truncated = false;
    let mut body_len = 0usize;
    let mut cut = false;
    for line in notes.lines() {
        if line.starts_with("# ") {
            body_len = 0;
            cut = false;
            out.push_str(line);
            out.push('\n');
            continue;
        }
        if cut {
            continue;
        }
        if body_len + line.len() + 1 > section_max_chars {
            out.push_str("[section truncated]\n");
            truncated = true;
            cut = true;
            continue;
        }
        body_len += line.len() + 1;
        out.push_str(line);
        out.push('\n');
    }
    (out, truncated)
}

/// `trySessionMemoryCompaction`: on success the conversation in `cx.entries` is rebuilt and
/// `true` returned; `false` leaves everything untouched (fall back to full compaction).
pub fn try_compact(cx: &mut ChainContext<'_>, threshold: Option<u64>) -> bool {
    if !cx.config.session_memory.compact_enabled {
        return false;
    }
    let path = cx.state.memory_path();
    let Ok(notes) = cx.fs.read(&path) else { return false };
    if notes.trim() == TEMPLATE.trim() {
        return false;
    }
    let notes = notes.to_owned();
    let last = match cx.state.session_memory.last_summarized_uuid {
        Some(uuid) => match cx.entries.iter().position(|e| e.uuid == uuid) {
            Some(i) => i,
            None => return false,
        },
        None => cx.entries.len().saturating_sub(1),
    };
    let start = messages_to_keep_index(cx, last);
    let kept: Vec<Entry> = cx.entries[start..].iter().filter(|e| !e.is_boundary()).cloned().collect();
    let (memory, truncated) = truncate_for_compact(&notes, cx.config.session_memory.section_max_chars);
    let mut summary = memory;
    if truncated {
        summary.push_str(&format!("\nSome sections were shortened; the full notes are in {path}."));
    }
    let pre = token_count_from_last_response(&cx.entries);
    let saved_entries = cx.entries.clone();
    let saved_uuid = cx.state.next_uuid;
    rebuild(cx, CompactTrigger::Auto, pre, summary, kept, AttachmentMode::PlanOnly);
    let post = estimate_message_tokens(&cx.entries);
    if threshold.is_some_and(|t| post >= t) {
        cx.entries = saved_entries;
        cx.state.next_uuid = saved_uuid;
        return false;
    }
    true
}
