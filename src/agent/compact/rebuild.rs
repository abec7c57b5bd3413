//! The post-compact rebuild (§5.9–5.10): boundary with its metadata, summary, kept messages,
//! attachments (restored files, plan, invoked skills, deltas), then hook results — the
//! reference's `buildPostCompactMessages` order. Wire reordering of attachments is the request
//! builder's job, not this one's.
//!
//! All text here is ours; the marker strings and budgets are the reference's.

use crate::api::{ContentBlock, Message, SharedText};

use super::context::{ChainContext, CompactTrigger, Entry, EntryKind};
use super::counting::{rough, rough_shared, rough_units, token_count_with_estimation};

/// Which attachments the rebuild restores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachmentMode {
    /// Full compaction: files, plan, skills, deltas.
    Full,
    /// Session-memory compaction: the plan only.
    PlanOnly,
}

const SKILL_TRUNCATION_MARKER: &str = "\n[skill content truncated after compaction]";

/// `formatCompactSummary`: drop the first `<analysis>` block, turn `<summary>X</summary>` into
/// `Summary:\nX`, collapse runs of blank lines, trim.
pub fn format_compact_summary(text: &str) -> String {
    let mut s = text.to_owned();
    if let (Some(a), Some(b)) = (s.find("<analysis>"), s.find("</analysis>"))
        && a < b {
            s.replace_range(a..b + "</analysis>".len(), "");
        }
    if let (Some(a), Some(b)) = (s.find("<summary>"), s.find("</summary>"))
        && a < b {
            let inner = s[a + "<summary>".len()..b].trim().to_owned();
            s.replace_range(a..b + "</summary>".len(), &format!("Summary:\n{inner}"));
        }
    let mut out = String::with_capacity(s.len());
    let mut blank_run = 0;
    for line in s.lines() {
        if line.trim().is_empty() {
            blank_run += 1;
            if blank_run > 1 {
                continue;
            }
        } else {
            blank_run = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim().to_owned()
}

/// How a restored file's Read result opens (the client's marker string).
pub const RESTORED_RESULT_HEAD: &str = "Result of calling the Read tool:";

/// How the summary message opens (our words).
pub const SUMMARY_OPENING: &str = "This session continues an earlier conversation that outgrew the context window.";

/// The summary message's note when recent messages follow it verbatim (our words).
pub const PRESERVED_NOTE: &str = "The most recent messages follow unchanged after this summary.";

/// The user message that carries the summary (our wording; the reference's parts: opening,
/// summary, the transcript's path when known, the preserved-messages note, the continuation).
pub fn summary_message_text(summary: &str, recent_preserved: bool, transcript: Option<&str>) -> String {
    let mut text = format!("{SUMMARY_OPENING} What happened before is condensed below.\n\n{}", formatted_summary(summary));
    if let Some(path) = transcript {
        text.push_str(&format!(
            "\n\nThe complete transcript of the earlier conversation, every message and tool result verbatim, is saved \
             at {path}; read it when you need something the summary leaves out, such as exact code, error output or wording."
        ));
    }
    if recent_preserved {
        text.push_str("\n\n");
        text.push_str(PRESERVED_NOTE);
    }
    text.push_str(
        "\n\nPick the work up where it stopped and carry on with the last task as if nothing had interrupted it. \
         Do not ask the user anything first, do not mention the summary and do not restate it; continue with the next step.",
    );
    text
}

/// Formatted summaries ([`format_compact_summary`]) by the summary's xxh3-128, per thread: every
/// run of a session (each what-if, each plan) takes the same few summaries (the recorded ones,
/// the stand-in) at its compactions. Emptied past [`SUMMARY_MEMO_LIMIT`] entries.
const SUMMARY_MEMO_LIMIT: usize = 64;

thread_local! {
    static SUMMARY_MEMO: std::cell::RefCell<std::collections::HashMap<u128, std::rc::Rc<str>>> = Default::default();
}

/// [`format_compact_summary`] of `summary`, memoized (debug builds format it again and compare).
fn formatted_summary(summary: &str) -> std::rc::Rc<str> {
    let key = xxhash_rust::xxh3::xxh3_128(summary.as_bytes());
    if let Some(formatted) = SUMMARY_MEMO.with(|m| m.borrow().get(&key).cloned()) {
        debug_assert_eq!(*formatted, format_compact_summary(summary), "the memoized format of a summary");
        return formatted;
    }
    let formatted: std::rc::Rc<str> = format_compact_summary(summary).into();
    remember(&SUMMARY_MEMO, SUMMARY_MEMO_LIMIT, key, formatted.clone());
    formatted
}

/// Keeps `value` under `key` in a per-thread memo of this module, emptied first when it holds
/// `limit` entries (a memo's values never change, so what it holds changes only the speed).
fn remember<V: 'static>(memo: &'static std::thread::LocalKey<std::cell::RefCell<std::collections::HashMap<u128, V>>>, limit: usize, key: u128, value: V) {
    memo.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= limit {
            m.clear();
        }
        m.insert(key, value);
    });
}

fn attachment(cx: &mut ChainContext<'_>, kind: &str, text: String, ts: u64) -> Entry {
    let uuid = cx.state.uuid();
    let mut entry = Entry::new(Message::user_text(crate::agent::attachments::system_reminder(&text)), uuid, ts);
    entry.is_meta = true;
    entry.kind = EntryKind::Attachment { kind: kind.into() };
    entry
}

/// A restored file as the client sends it: the Read call and the Read result (numbered lines
/// and the read caution), each a `<system-reminder>`.
fn restored_file(cx: &mut ChainContext<'_>, texts: &RestoredTexts, ts: u64) -> Entry {
    let uuid = cx.state.uuid();
    let mut entry = Entry::new(Message::user_blocks(vec![ContentBlock::text(texts.call.clone()), ContentBlock::text(texts.result.clone())]), uuid, ts);
    entry.is_meta = true;
    entry.kind = EntryKind::Attachment { kind: "file".into() };
    entry
}

/// A restored file's texts (the Read call, its numbered result) and the rough count of the
/// message holding them: a function of the path and contents alone. Shared by the blocks of
/// every restore that sends them, in every run (and what they keep with the texts, e.g. their
/// hashes), rather than copied: a restored file is a whole file's text.
struct RestoredTexts {
    call: SharedText,
    result: SharedText,
    cost: u64,
}

/// Restored files' texts by path and contents, per thread: every run of a session (each
/// what-if, each plan) restores the same files at its compactions. Emptied past
/// [`RESTORED_MEMO_LIMIT`] entries.
const RESTORED_MEMO_LIMIT: usize = 256;

thread_local! {
    static RESTORED_MEMO: std::cell::RefCell<std::collections::HashMap<u128, std::rc::Rc<RestoredTexts>>> = Default::default();
}

fn restored_texts(path: &str, contents: &str) -> std::rc::Rc<RestoredTexts> {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(&(path.len() as u64).to_le_bytes());
    hasher.update(path.as_bytes());
    hasher.update(contents.as_bytes());
    let key = hasher.digest128();
    if let Some(texts) = RESTORED_MEMO.with(|m| m.borrow().get(&key).cloned()) {
        return texts;
    }
    let input = serde_json::json!({ "file_path": path });
    let call = format!("<system-reminder>\nCalled the Read tool with the following input: {input}\n</system-reminder>");
    // The Read tool's one numbering (`exec::number_lines_as`), in 2.1.88's style for every
    // version: the record view's working set numbers by the recorded version
    // (`replay::profile::ClientProfile::restore_line_numbers`, `→` up to 2.1.49). The agent's
    // restore numbered so moved 7 of 8 such sessions further from the record (docs/fidelity.md,
    // "Known gaps": the restored files' numbering), so it keeps the tab.
    let numbered = crate::agent::tools::exec::number_lines(contents, 0, usize::MAX);
    let caution = crate::agent::tools::exec::READ_CAUTION;
    // (Made at its size: `format!` would grow its buffer by copies of the file's text.)
    let result = ["<system-reminder>\n", RESTORED_RESULT_HEAD, "\n", &numbered, "\n", caution, "\n</system-reminder>"].concat();
    let cost = restored_cost(&call, &result);
    let texts = std::rc::Rc::new(RestoredTexts { call: call.into(), result: result.into(), cost });
    remember(&RESTORED_MEMO, RESTORED_MEMO_LIMIT, key, texts.clone());
    texts
}

/// [`rough`] of the JSON text of the user message holding a restored file's texts (`call`,
/// then `result`, each a text block), without writing the text (the file's numbered contents,
/// escaped): the message's frame, written with both texts empty, and the two texts measured as
/// JSON strings. Debug builds write the message and compare.
fn restored_cost(call: &str, result: &str) -> u64 {
    use crate::measure::tokens::{json_string_utf16_len, serialized_utf16_len};
    let message = |call: &str, result: &str| Message::user_blocks(vec![ContentBlock::text(call), ContentBlock::text(result)]);
    // (An empty text is its two quotes.)
    let units = serialized_utf16_len(&message("", "")) - 4 + json_string_utf16_len(call) + json_string_utf16_len(result);
    let cost = rough_units(units);
    debug_assert_eq!(cost, rough(&serde_json::to_string(&message(call, result)).unwrap_or_default()), "a restored file's cost measured differs from writing its message");
    cost
}

/// Restored files within the budgets: newest first, at most `max_files`, each re-read and
/// replaced by a reference when over the per-file limit, then kept while the running total
/// fits the overall budget (skip, not stop). The record view applies the same budgets
/// and order (`replay::working_set::WorkingSet::compact_memoized`, from [`super::config::PostCompactConfig`]'s
/// defaults) to the files the record shows.
/// A file the kept messages already show (their Read calls) is not restored again.
pub fn file_attachments(cx: &mut ChainContext<'_>, ts: u64, kept: &[Entry]) -> Vec<Entry> {
    let budget = cx.config.post_compact.clone();
    let mut files = cx.inputs.read_files.clone();
    let plan = cx.inputs.plan_path.clone();
    let memory = cx.inputs.memory_paths.clone();
    let cwd = cx.inputs.cwd.clone();
    let shown = read_paths(kept);
    files.retain(|f| {
        Some(&f.path) != plan.as_ref() && !is_plan_file(&f.path) && !memory.contains(&f.path) && !is_memory_file(&f.path, cwd.as_deref()) && !shown.contains(&f.path)
    });
    files.sort_by(|a, b| b.timestamp_ms.cmp(&a.timestamp_ms).then_with(|| a.path.cmp(&b.path)));
    files.dedup_by(|a, b| a.path == b.path);
    let mut out = Vec::new();
    let mut total = 0u64;
    for file in files.into_iter().take(budget.max_files) {
        // (The contents' length is counted once and kept with the text, which every copy of
        // the file system shares: each run of a session restores the same files.)
        let Ok(contents) = cx.fs.entry(&file.path).map(|entry| entry.contents.clone()) else { continue };
        let (entry, cost) = if rough_shared(&contents) > budget.max_tokens_per_file {
            let text = format!("{} was read earlier in this session; it is too large to restore here. Read it again if you need it.", file.path);
            let entry = attachment(cx, "compact_file_reference", text, ts);
            let cost = rough(&serde_json::to_string(entry.message()).unwrap_or_default());
            (entry, cost)
        } else {
            let texts = restored_texts(&file.path, &contents);
            (restored_file(cx, &texts, ts), texts.cost)
        };
        if total + cost <= budget.files_token_budget {
            total += cost;
            out.push(entry);
        }
    }
    out
}

/// A plan file (under a `.claude/plans/` directory): the client keeps it apart from the
/// restored files and attaches it on its own. One rule for the agent's rebuild
/// ([`file_attachments`], [`rebuild`]) and the record view (`replay::working_set`).
pub fn is_plan_file(path: &str) -> bool {
    crate::agent::skills::tool_path(path).contains("/.claude/plans/")
}

/// The most recently read plan file ([`is_plan_file`]).
fn newest_plan_file(files: &[super::context::ReadFile]) -> Option<String> {
    files.iter().filter(|f| is_plan_file(&f.path)).max_by(|a, b| a.timestamp_ms.cmp(&b.timestamp_ms).then_with(|| b.path.cmp(&a.path))).map(|f| f.path.clone())
}

/// The memory files the client leaves out of the restore: CLAUDE.md and CLAUDE.local.md of
/// the working directory `cwd` and the user's own CLAUDE.md (nested ones are restored like any
/// file). One rule for the agent's rebuild ([`file_attachments`], with
/// [`super::context::CompactInputs::cwd`]) and the record view (`replay::working_set`).
pub fn is_memory_file(path: &str, cwd: Option<&str>) -> bool {
    if crate::agent::skills::tool_path(path).ends_with("/.claude/CLAUDE.md") {
        return true;
    }
    cwd.is_some_and(|cwd| {
        if crate::agent::skills::is_windows_path(path) || crate::agent::skills::is_windows_path(cwd) {
            // A Windows client's (`D:\omp\CLAUDE.md` under `D:\omp`), compared in one spelling.
            let (path, cwd) = (crate::agent::skills::comparable_path(path), crate::agent::skills::comparable_path(cwd));
            return path == format!("{cwd}/claude.md") || path == format!("{cwd}/claude.local.md");
        }
        // `{cwd}/CLAUDE.md` or `{cwd}/CLAUDE.local.md`, compared without building either: a
        // compaction asks for every file read, the replay for every file its record shows.
        let cwd = cwd.trim_end_matches('/');
        path.strip_prefix(cwd).is_some_and(|rest| rest == "/CLAUDE.md" || rest == "/CLAUDE.local.md")
    })
}

/// The `file_path`s of the Read calls in `entries`, as the agent's fs spells them (a Windows
/// client's `D:\omp\a.go` is `/d/omp/a.go`: `skills::tool_path`).
fn read_paths(entries: &[Entry]) -> Vec<String> {
    entries
        .iter()
        .flat_map(|e| e.message().content.to_blocks())
        .filter_map(|b| match b {
            ContentBlock::ToolUse { name, input, .. } if name == "Read" => input.get("file_path").and_then(|p| p.as_str()).map(|p| crate::agent::skills::tool_path(p).into_owned()),
            _ => None,
        })
        .collect()
}

/// A skill's body as a compaction restores it: cut to the per-skill limit, marked when cut.
/// (`replay::workload` sizes what the agent will restore with the same rule.)
pub fn restored_skill_content(content: &str, budget: &super::config::PostCompactConfig) -> String {
    if rough(content) <= budget.max_tokens_per_skill {
        return content.to_owned();
    }
    let max_chars = (budget.max_tokens_per_skill * 4) as usize;
    let mut cut: String = content.chars().take(max_chars - SKILL_TRUNCATION_MARKER.len()).collect();
    cut.push_str(SKILL_TRUNCATION_MARKER);
    cut
}

/// Invoked skills, most recent first, each truncated to its limit, kept while the cumulative
/// total fits (skip, not stop). One attachment holding all of them, or none.
pub fn skill_attachment(cx: &mut ChainContext<'_>, ts: u64) -> Option<Entry> {
    let budget = cx.config.post_compact.clone();
    let mut skills = cx.inputs.invoked_skills.clone();
    skills.sort_by(|a, b| b.invoked_at_ms.cmp(&a.invoked_at_ms).then_with(|| a.name.cmp(&b.name)));
    let mut total = 0u64;
    let mut parts = Vec::new();
    for skill in skills {
        let content = restored_skill_content(&skill.content, &budget);
        let cost = rough(&content);
        if total + cost <= budget.skills_token_budget {
            total += cost;
            parts.push(format!("Skill \"{}\" (invoked earlier):\n{}{content}", skill.name, crate::agent::attachments::path_line(skill.path.as_deref())));
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(attachment(cx, "invoked_skills", parts.join("\n\n"), ts))
}

/// Builds the post-compact conversation and installs it in `cx.entries`.
pub fn rebuild(
    cx: &mut ChainContext<'_>,
    trigger: CompactTrigger,
    pre_tokens: u64,
    summary: String,
    kept: Vec<Entry>,
    mode: AttachmentMode,
) {
    let ts = cx.now_ms();
    let logical_parent = cx.entries.last().map(|e| e.uuid);
    let boundary_uuid = cx.state.uuid();
    let summary_uuid = cx.state.uuid();
    let preserved = match (kept.first(), kept.last()) {
        (Some(head), Some(tail)) => Some((head.uuid, summary_uuid, tail.uuid)),
        _ => None,
    };
    let mut boundary = Entry::new(Message::user_text("Conversation compacted"), boundary_uuid, ts);
    boundary.kind = EntryKind::CompactBoundary { trigger, pre_tokens, logical_parent, preserved };
    let mut summary_entry = Entry::new(Message::user_text(summary_message_text(&summary, !kept.is_empty(), Some(&format!("{}.jsonl", cx.state.session_dir)))), summary_uuid, ts);
    summary_entry.kind = EntryKind::Summary;
    let mut out = vec![boundary, summary_entry];
    let restored = if mode == AttachmentMode::Full { file_attachments(cx, ts, &kept) } else { Vec::new() };
    out.extend(kept.into_iter().filter(|e| !e.is_boundary()));
    out.extend(restored);
    // The plan file: the one the session names, else the most recently read one.
    let plan = cx.inputs.plan_path.clone().or_else(|| newest_plan_file(&cx.inputs.read_files));
    if let Some(plan) = plan
        && cx.fs.exists(&plan) {
            out.push(attachment(cx, "plan_file_reference", format!("A plan for this work is kept at {plan}; keep following it."), ts));
        }
    if mode == AttachmentMode::Full {
        if let Some(skills) = skill_attachment(cx, ts) {
            out.push(skills);
        }
        for (kind, text) in cx.inputs.deltas.clone() {
            out.push(attachment(cx, &kind, text, ts));
        }
    }
    for text in cx.inputs.hook_results.clone() {
        out.push(attachment(cx, "hook_result", text, ts));
    }
    cx.entries.replace(out);
}

/// `preCompactTokenCount`.
pub fn pre_compact_tokens(cx: &ChainContext<'_>) -> u64 {
    token_count_with_estimation(&cx.entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restored file's cost measured without writing its message is the rough count of the
    /// message written: texts with escapes, control characters, non-ASCII and astral
    /// characters, empty ones.
    #[test]
    fn a_restored_files_cost_is_its_written_messages() {
        let texts = ["", "plain", "a \"quoted\" \\ path\n\ttab\r\u{1}\u{1f}\u{7f}", "é ü 漢字 🦀\u{2028}", &"line\n".repeat(300)];
        for call in texts {
            for result in texts {
                let message = Message::user_blocks(vec![ContentBlock::text(call), ContentBlock::text(result)]);
                assert_eq!(restored_cost(call, result), rough(&serde_json::to_string(&message).expect("a message serializes")), "{call:?} {result:?}");
            }
        }
    }
}
