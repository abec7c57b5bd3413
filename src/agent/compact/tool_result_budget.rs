//! Stage `tool_result_budget` (§2): large tool results are persisted to the virtual filesystem
//! and replaced by a `<persisted-output>` preview.
//!
//! - **Trigger**: a tool result seen for the first time ("fresh") that is larger than its tool's
//!   persistence threshold (Read never, Bash 30k, Grep 20k, others 50k chars), or, with the
//!   aggregate budget on, a wire message whose fresh plus frozen results exceed 200k chars (the
//!   largest fresh ones are replaced until it fits).
//! - **Rewrites**: the `content` of the selected tool_result blocks, to the replacement string
//!   (header line with size and path, 2 KB preview cut at a newline past 1 KB, closing tag).
//! - **Preserves**: every decision forever. A result once shown replaced is re-shown with the
//!   byte-identical stored string on every later request (mustReapply); a result once shown
//!   unreplaced is never touched again (frozen). tool_use/tool_result pairing is untouched.
//! - **Invalidates**: only fresh results are replaced, and fresh results sit after the last
//!   request's messages, so the cached prefix is never invalidated; the report names the first
//!   replaced block anyway.
//!
//! Ours, where the reference splits the work: the per-tool threshold, which the client applies at
//! tool-execution time, is applied here on first sight, so it shares the replay state and the
//! session needs no second call site. Results not larger than the preview are never selected by
//! the aggregate budget: replacing them would grow the context.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::{ContentBlock, MessageContent, Role, ToolResultContent};
use crate::measure::metrics::StageReport;
use crate::world::{Clock, VirtualFs};

use super::chain::Stage;
use super::config::{CompactConfig, ToolResultBudgetConfig};
use super::context::ChainContext;
use super::context::Entry;
use super::counting::rough_entries;

pub const PERSISTED_OPEN: &str = "<persisted-output>";
pub const PERSISTED_CLOSE: &str = "</persisted-output>";

/// `contentReplacementState`: mutated in place, never reset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplacementState {
    /// Each id shared by the state's copies (a run's checkpoints copy the set: a count per id).
    pub seen_ids: BTreeSet<std::rc::Rc<str>>,
    pub replacements: BTreeMap<String, String>,
    /// What the runs so far settled, so that a request's run reads only what is new.
    pub scan: BudgetScan,
}

/// The leading entries earlier runs settled: every tool result they carry was decided and
/// frozen (seen, not replaced), so a run would weigh them only as the frozen size of the last
/// wire message they end in. A run starts after them, with that size and the message ids
/// they hold, when every one of them is still there unchanged: each carries this scan's
/// `stamp` and its position ([`Entry::budget_mark`], forgotten when the message is rewritten),
/// else it reads the whole conversation again. Over the list the owner keeps from run to run
/// ([`ChainContext::kept_list`]), when the last run was over it too, the leading entries no
/// change was reported for since ([`crate::agent::compact::ChainState::kept_changed_from`]) are
/// not read for their marks: a request then costs its new entries, not the conversation (debug
/// builds read the marks anyway). Bookkeeping, not a value: two scans are equal.
#[derive(Debug, Clone, Default)]
pub struct BudgetScan {
    /// Which run marked the entries (0: none); a scan started afresh takes a new one.
    stamp: u64,
    /// The entries settled.
    len: usize,
    /// The `message.id`s of the assistant entries among them.
    message_ids: rustc_hash::FxHashSet<std::rc::Rc<str>>,
    /// Sizes of their results after their last assistant entry with a new id (the frozen size
    /// the group of the next results starts with).
    open_frozen: u64,
    /// How many leading entries of the owner's kept list are as the last run, over that list,
    /// settled them (0 when it was over another list): lowered by every change reported since.
    trusted: usize,
}

impl PartialEq for BudgetScan {
    fn eq(&self, _: &BudgetScan) -> bool {
        true
    }
}

impl Eq for BudgetScan {}

impl BudgetScan {
    /// How many leading entries are still as this scan settled them; forgets the scan (and
    /// returns 0) when one of them is not. The first `unchanged` are known to be as the last
    /// run left them (their marks are not read).
    fn settled(&mut self, entries: &[Entry], unchanged: usize) -> usize {
        let marked = |from: usize, to: usize| entries[from..to].iter().enumerate().all(|(k, entry)| entry.budget_mark() == Some((self.stamp, from + k)));
        let fits = self.stamp != 0 && self.len <= entries.len();
        let unchanged = unchanged.min(self.len);
        let valid = fits && marked(unchanged, self.len);
        debug_assert!(!valid || marked(0, unchanged), "an entry counted as unchanged since the last run is not as it settled it");
        if !valid {
            *self = BudgetScan { stamp: crate::shared::fresh_stamp(), ..BudgetScan::default() };
        }
        self.len
    }

    /// The owner's kept list changed from `index` on.
    pub(crate) fn changed_from(&mut self, index: usize) {
        self.trusted = self.trusted.min(index);
    }

    /// Extends the settled entries over `entries[self.len..]` as far as every result there is
    /// frozen, marking each entry it takes.
    fn extend(&mut self, entries: &[Entry], state_seen: &BTreeSet<std::rc::Rc<str>>, state_replaced: &BTreeMap<String, String>) {
        for (i, entry) in entries.iter().enumerate().skip(self.len) {
            if entry.on_wire() {
                if entry.message().role == Role::Assistant {
                    match &entry.message_id {
                        Some(id) => {
                            if self.message_ids.insert(id.clone()) {
                                self.open_frozen = 0;
                            }
                        }
                        None => self.open_frozen = 0,
                    }
                } else {
                    let candidates = entry.budget_candidates();
                    if candidates.iter().any(|c| !state_seen.contains(c.id.as_str()) || state_replaced.contains_key(&c.id)) {
                        return;
                    }
                    self.open_frozen += candidates.iter().map(|c| c.size).sum::<u64>();
                }
            }
            entry.set_budget_mark(self.stamp, i);
            self.len = i + 1;
        }
    }
}

pub struct ToolResultBudget;

/// Size the way the client measures it: UTF-16 length of the string or of the text blocks
/// (the length kept with each text: the chain's rough count of the message asked for it
/// first, and every run sending the text shares it).
pub fn result_size(content: &ToolResultContent) -> u64 {
    match content {
        ToolResultContent::Text(text) => text.utf16_len() as u64,
        ToolResultContent::Blocks(blocks) => blocks
            .iter()
            .map(|b| match b {
                ContentBlock::Text { text, .. } => text.utf16_len() as u64,
                _ => 0,
            })
            .sum(),
    }
}

fn has_image(content: &ToolResultContent) -> bool {
    matches!(content, ToolResultContent::Blocks(blocks) if blocks.iter().any(|b| matches!(b, ContentBlock::Image(_) | ContentBlock::Document(_))))
}

fn is_empty(content: &ToolResultContent) -> bool {
    match content {
        ToolResultContent::Text(text) => text.trim().is_empty(),
        ToolResultContent::Blocks(blocks) => blocks.iter().all(|b| matches!(b, ContentBlock::Text { text, .. } if text.trim().is_empty())),
    }
}

fn starts_persisted(content: &ToolResultContent) -> bool {
    match content {
        ToolResultContent::Text(text) => text.starts_with(PERSISTED_OPEN),
        ToolResultContent::Blocks(blocks) => {
            matches!(blocks.first(), Some(ContentBlock::Text { text, .. }) if text.starts_with(PERSISTED_OPEN))
        }
    }
}

/// `formatFileSize`: bytes below 1 KiB, else KB/MB/GB with one decimal, `.0` dropped.
pub fn format_file_size(size: u64) -> String {
    if size < 1024 {
        return format!("{size} bytes");
    }
    let units = ["KB", "MB", "GB"];
    let mut value = size as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < units.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    let text = format!("{value:.1}");
    let text = text.strip_suffix(".0").unwrap_or(&text);
    format!("{text}{}", units[unit])
}

/// `generatePreview`: the whole text up to `limit` chars, else the first `limit` chars cut at
/// the last newline if that is past half of it. Returns the preview and whether more follows.
pub fn preview(text: &str, limit: usize) -> (String, bool) {
    if text.chars().count() <= limit {
        return (text.to_owned(), false);
    }
    let slice: String = text.chars().take(limit).collect();
    match slice.rfind('\n') {
        Some(cut) if slice[..cut].chars().count() > limit / 2 => (slice[..cut].to_owned(), true),
        _ => (slice, true),
    }
}

/// The replacement string of a persisted result.
pub fn replacement_text(original: &str, path: &str, preview_chars: usize) -> String {
    let (preview, has_more) = preview(original, preview_chars);
    let size = crate::measure::tokens::utf16_len(original) as u64;
    format!(
        "{PERSISTED_OPEN}\nOutput too large ({}). Full output saved to: {path}\n\nPreview (first {}):\n{preview}{}{PERSISTED_CLOSE}",
        format_file_size(size),
        format_file_size(preview_chars as u64),
        if has_more { "\n...\n" } else { "\n" },
    )
}

/// Writes the full result to `<dir>/<id>.txt` (`.json` for block content; an existing file is
/// kept, like the client's exclusive create) and returns the replacement string. `None` when
/// the content cannot be persisted (non-text blocks).
pub fn persist(
    tool_use_id: &str,
    content: &ToolResultContent,
    dir: &str,
    preview_chars: usize,
    fs: &mut VirtualFs,
    clock: &Clock,
) -> Option<String> {
    let (text, ext) = match content {
        ToolResultContent::Text(text) => (String::clone(text), "txt"),
        ToolResultContent::Blocks(blocks) => {
            if blocks.iter().any(|b| !matches!(b, ContentBlock::Text { .. })) {
                return None;
            }
            (serde_json::to_string_pretty(blocks).ok()?, "json")
        }
    };
    let path = format!("{dir}/{tool_use_id}.{ext}");
    if !fs.exists(&path) {
        fs.write(&path, text.clone(), clock).ok()?;
    }
    Some(replacement_text(&text, &path, preview_chars))
}

/// The per-tool thresholds applied to a recorded conversation (a replayed session under another
/// budget): every text result larger than its tool's threshold, not already a preview, becomes
/// the replacement string with its full text "saved" under `dir`. Deterministic: the same
/// message gets the same replacement on every call, as the client's re-applied decisions do.
/// Returns the ids replaced, in message order.
pub fn apply_to_messages(messages: &mut [crate::api::Message], config: &ToolResultBudgetConfig, dir: &str) -> Vec<String> {
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut replaced = Vec::new();
    for message in messages.iter_mut() {
        let MessageContent::Blocks(blocks) = &mut message.content else { continue };
        for block in blocks.iter_mut() {
            match block {
                ContentBlock::ToolUse { id, name, .. } => {
                    names.insert(id.clone(), name.clone());
                }
                ContentBlock::ToolResult { tool_use_id, content: Some(content), .. } => {
                    let Some(limit) = names.get(tool_use_id.as_str()).and_then(|name| config.threshold(name)) else { continue };
                    if starts_persisted(content) || has_image(content) || result_size(content) <= limit {
                        continue;
                    }
                    let text = match content {
                        ToolResultContent::Text(text) => String::clone(text),
                        ToolResultContent::Blocks(parts) => crate::api::joined_text(parts),
                    };
                    let path = format!("{dir}/{tool_use_id}.txt");
                    *content = ToolResultContent::Text(replacement_text(&text, &path, config.preview_chars as usize).into());
                    replaced.push(tool_use_id.clone());
                }
                _ => {}
            }
        }
    }
    replaced
}

/// The text an empty result is replaced with at tool-execution time.
pub fn empty_result_text(tool_name: &str) -> String {
    format!("({tool_name} completed with no output)")
}

/// The name of the tool whose call has id `id` (the last such call, as [`ChainContext::tool_names`]
/// keeps it), found from the end: a fresh result's call is among the last entries, so the
/// history is not walked for it.
fn tool_name<'e>(entries: &'e [super::context::Entry], id: &str) -> Option<&'e str> {
    entries.iter().rev().find_map(|entry| {
        entry.blocks().iter().rev().find_map(|block| match block {
            ContentBlock::ToolUse { id: use_id, name, .. } if use_id == id => Some(name.as_str()),
            _ => None,
        })
    })
}

/// Whether the block at (`entry`, `block`) is a tool result whose content is `text`.
fn shows(entries: &[super::context::Entry], entry: usize, block: usize, text: &str) -> bool {
    matches!(entries[entry].blocks().get(block),
        Some(ContentBlock::ToolResult { content: Some(ToolResultContent::Text(current)), .. }) if current == text)
}

struct Candidate<'e> {
    entry: usize,
    block: usize,
    id: &'e str,
    size: u64,
}

/// A tool result of one message the budget may weigh: its block index, id and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryCandidate {
    pub block: usize,
    pub id: String,
    pub size: u64,
}

/// The tool results of a message's blocks the budget may weigh: not cleared by microcompact,
/// not empty, not already a preview, carrying no media.
pub fn entry_candidates(blocks: &[ContentBlock]) -> Vec<EntryCandidate> {
    let mut out = Vec::new();
    for (b, block) in blocks.iter().enumerate() {
        if let ContentBlock::ToolResult { tool_use_id, content: Some(content), .. } = block {
            // A result microcompact already cleared is out of the budget's hands.
            let cleared = matches!(content, ToolResultContent::Text(t) if t == super::microcompact::CLEARED_MARKER);
            if cleared || is_empty(content) || starts_persisted(content) || has_image(content) {
                continue;
            }
            out.push(EntryCandidate { block: b, id: tool_use_id.clone(), size: result_size(content) });
        }
    }
    out
}

/// Candidates grouped by wire message (`collectCandidatesByMessage`), of the entries from
/// `start` on; the first group goes on from the entries before (`known_ids`: the message ids
/// they hold). A group starts at every assistant entry with a new id (an empty group is left
/// out: the reference starts one only after a group with candidates, the same partition).
/// Each entry's candidates are found once per version of its message
/// ([`super::context::Entry::budget_candidates`]).
fn candidate_groups<'e>(entries: &'e [Entry], start: usize, known_ids: &rustc_hash::FxHashSet<std::rc::Rc<str>>) -> Vec<Vec<Candidate<'e>>> {
    let mut groups: Vec<Vec<Candidate>> = vec![Vec::new()];
    let mut seen_message_ids: rustc_hash::FxHashSet<&str> = rustc_hash::FxHashSet::default();
    for (i, entry) in entries.iter().enumerate().skip(start) {
        if !entry.on_wire() {
            continue;
        }
        if entry.message().role == Role::Assistant {
            let new_id = match &entry.message_id {
                Some(id) => !known_ids.contains(&**id) && seen_message_ids.insert(&**id),
                None => true,
            };
            if new_id {
                groups.push(Vec::new());
            }
            continue;
        }
        #[cfg(debug_assertions)]
        debug_assert_eq!(entry.budget_candidates(), entry_candidates(entry.blocks()), "memoized budget candidates differ from the message's");
        for candidate in entry.budget_candidates() {
            let EntryCandidate { block, id, size } = candidate;
            groups.last_mut().expect("one group").push(Candidate { entry: i, block: *block, id, size: *size });
        }
    }
    groups
}

impl Stage for ToolResultBudget {
    fn name(&self) -> &'static str {
        "tool_result_budget"
    }

    fn enabled(&self, _config: &CompactConfig) -> bool {
        true
    }

    fn reports_rough_after(&self) -> bool {
        true
    }

    fn run(&self, cx: &mut ChainContext<'_>) -> StageReport {
        let tokens_before = cx.rough_total();
        let config: &ToolResultBudgetConfig = &cx.config.tool_result_budget;
        // (Made only for a result that is persisted: the path is formatted.)
        let mut dir: Option<String> = None;
        let mut fresh_replaced: Vec<(usize, usize)> = Vec::new();
        let mut reapplied = 0usize;
        let mut apply: Vec<(usize, usize, String)> = Vec::new();
        // Entries earlier runs settled hold only frozen results: the first group starts with
        // their last message's frozen size.
        let mut scan = std::mem::take(&mut cx.state.replacements.scan);
        // Over the kept list, when the last run was too: what neither its owner nor a stage of
        // this context changed since.
        let unchanged = if cx.kept_list { scan.trusted.min(cx.entries.untouched()) } else { 0 };
        let start = scan.settled(&cx.entries, unchanged);
        for (g, group) in candidate_groups(&cx.entries, start, &scan.message_ids).into_iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            let mut frozen_size = if g == 0 { scan.open_frozen } else { 0 };
            let mut fresh: Vec<&Candidate> = Vec::new();
            for candidate in &group {
                if let Some(text) = cx.state.replacements.replacements.get(candidate.id) {
                    // A replacement the entry already shows (re-applied on every request) is not
                    // written again: the entry stays as it was made, so its record is kept as it
                    // is (and the text is not copied).
                    if !shows(&cx.entries, candidate.entry, candidate.block, text) {
                        apply.push((candidate.entry, candidate.block, text.clone()));
                    }
                    reapplied += 1;
                } else if cx.state.replacements.seen_ids.contains(candidate.id) {
                    frozen_size += candidate.size;
                } else {
                    fresh.push(candidate);
                }
            }
            let mut selected: Vec<&Candidate> = Vec::new();
            let mut eligible: Vec<&Candidate> = Vec::new();
            for candidate in fresh {
                let tool = tool_name(&cx.entries, candidate.id).unwrap_or("");
                match config.threshold(tool) {
                    None => {
                        cx.state.replacements.seen_ids.insert(candidate.id.into());
                    }
                    Some(limit) if candidate.size > limit => selected.push(candidate),
                    Some(_) => eligible.push(candidate),
                }
            }
            if config.aggregate_enabled {
                let mut total = frozen_size + eligible.iter().map(|c| c.size).sum::<u64>();
                eligible.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.id.cmp(&b.id)));
                let mut rest = Vec::new();
                for candidate in eligible {
                    if total > config.aggregate_chars && candidate.size > config.preview_chars + 200 {
                        total -= candidate.size;
                        selected.push(candidate);
                    } else {
                        rest.push(candidate);
                    }
                }
                eligible = rest;
            }
            for candidate in eligible {
                cx.state.replacements.seen_ids.insert(candidate.id.into());
            }
            for candidate in selected {
                cx.state.replacements.seen_ids.insert(candidate.id.into());
                let ContentBlock::ToolResult { content: Some(content), .. } =
                    &cx.entries[candidate.entry].blocks()[candidate.block]
                else {
                    continue;
                };
                let content = content.clone();
                let dir = dir.get_or_insert_with(|| cx.state.tool_results_dir());
                let persisted = persist(candidate.id, &content, dir, config.preview_chars as usize, cx.fs, cx.clock);
                // A replacement that is not smaller than the result would grow the context.
                if let Some(text) = persisted.filter(|t| (t.chars().count() as u64) < candidate.size) {
                    cx.state.replacements.replacements.insert(candidate.id.to_owned(), text.clone());
                    apply.push((candidate.entry, candidate.block, text));
                    fresh_replaced.push((candidate.entry, candidate.block));
                }
            }
        }
        let rewritten = !apply.is_empty();
        for (entry, block, text) in apply {
            if shows(&cx.entries, entry, block, &text) {
                continue;
            }
            if let MessageContent::Blocks(blocks) = &mut cx.entries.entry_mut(entry).message_mut().content
                && let ContentBlock::ToolResult { content, .. } = &mut blocks[block] {
                    *content = Some(ToolResultContent::Text(text.into()));
                }
        }
        // Only entries after `start` were rewritten, so the settled ones keep their marks.
        scan.extend(&cx.entries, &cx.state.replacements.seen_ids, &cx.state.replacements.replacements);
        scan.trusted = if cx.kept_list { scan.len } else { 0 };
        cx.state.replacements.scan = scan;
        let tokens_after = if rewritten { rough_entries(&cx.entries) } else { tokens_before };
        let fired = !fresh_replaced.is_empty();
        if fired {
            cx.event("tool_result_budget");
        }
        let invalidated_from = fresh_replaced.iter().min().map(|(e, b)| cx.wire_path(*e, Some(*b)));
        StageReport {
            name: self.name().into(),
            fired,
            reason: if fired {
                format!("persisted {} tool results", fresh_replaced.len()).into()
            } else if reapplied > 0 {
                format!("reapplied {reapplied} earlier replacements").into()
            } else {
                "no fresh tool result over budget".into()
            },
            tokens_before,
            tokens_after,
            invalidated_from,
        }
    }
}

#[cfg(test)]
mod candidate_memo_tests {
    use super::*;
    use crate::agent::compact::context::Entry;
    use crate::api::Message;

    #[test]
    fn an_entry_finds_its_candidates_again_after_a_rewrite() {
        let result = |id: &str, text: &str| ContentBlock::tool_result(id, ToolResultContent::Text(text.into()), None);
        let mut entry = Entry::new(Message::user_blocks(vec![result("a", "x".repeat(10).as_str()), result("b", "  ")]), 1, 0);
        let first = entry.budget_candidates().to_vec();
        assert_eq!(first, vec![EntryCandidate { block: 0, id: "a".into(), size: 10 }], "the empty result is not weighed");
        // Rewritten (as microcompact clears a result): the memo is forgotten, not served stale.
        if let MessageContent::Blocks(blocks) = &mut entry.message_mut().content {
            blocks[0] = result("a", super::super::microcompact::CLEARED_MARKER);
            blocks.push(result("c", "yyy"));
        }
        assert_eq!(entry.budget_candidates(), entry_candidates(entry.blocks()));
        assert_eq!(entry.budget_candidates(), [EntryCandidate { block: 2, id: "c".into(), size: 3 }]);
    }
}
