//! messages[0]: the user-context reminder with `claudeMd` and `currentDate` (reference §4.1–4.3).
//!
//! `getUserContext` yields `{claudeMd?, currentDate}` in that order; `prependUserContext` wraps
//! them in one `<system-reminder>` string as a new meta user message at index 0, which the
//! normalizer later merges into the first user turn. Memory-file discovery is not done here: the
//! caller passes the files in discovery order.

use crate::agent::profile::{FillLayout, SizeProfile, fit, js_len};
use crate::api::Message;

pub const REMINDER_OPEN: &str = "<system-reminder>";
pub const REMINDER_CLOSE: &str = "</system-reminder>";

/// Kind of a memory file; decides the label after its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemoryKind {
    Managed,
    User,
    Project,
    Local,
    AutoMem,
}

impl MemoryKind {
    /// The label written after the path (the reference's descriptor strings; lengths 50, 54, 52,
    /// 54 as measured). Managed files share the User label, as in the reference's fallback.
    pub fn label(self) -> &'static str {
        match self {
            MemoryKind::Project => " (project instructions, checked into the codebase)",
            MemoryKind::Local => " (user's private project instructions, not checked in)",
            MemoryKind::AutoMem => " (user's auto-memory, persists across conversations)",
            MemoryKind::User | MemoryKind::Managed => " (user's private global instructions for all projects)",
        }
    }
}

/// A discovered memory file (CLAUDE.md, rules, CLAUDE.local.md, MEMORY.md), content as loaded
/// (after @-import expansion and frontmatter handling by the loader).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryFile {
    pub path: String,
    pub kind: MemoryKind,
    /// Shared: the session's user context, its checkpoints and the discovery memo hold the
    /// same text.
    pub content: std::sync::Arc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserContextInputs {
    /// In discovery order; empty files are skipped at render time.
    pub memory_files: Vec<MemoryFile>,
    /// `CLAUDE_CODE_DISABLE_CLAUDE_MDS`, or `--bare` without `--add-dir`.
    pub claude_md_disabled: bool,
    /// Local ISO date `YYYY-MM-DD` at the time the context was memoized.
    pub date: String,
    pub padding: bool,
}

/// The `claudeMd` value: instruction sentence, then each file as
/// `Contents of {path}{label}:\n\n{content.trim()}`, joined by blank lines. `None` when no file
/// has content.
pub fn render_claude_md(files: &[MemoryFile], profile: &SizeProfile, padding: bool) -> Option<String> {
    let rendered: Vec<String> = files
        .iter()
        .filter(|file| !file.content.trim().is_empty())
        .map(|file| format!("Contents of {}{}:\n\n{}", file.path, file.kind.label(), file.content.trim()))
        .collect();
    if rendered.is_empty() {
        return None;
    }
    let instruction =
        fit(MEMORY_INSTRUCTION, profile.fragment("memory_instruction"), FillLayout::Line, "memory_instruction", padding);
    Some(format!("{instruction}\n\n{}", rendered.join("\n\n")))
}

/// `currentDate` value (27 characters for a `YYYY-MM-DD` date).
pub fn current_date_sentence(date: &str) -> String {
    format!("Current date is {date}.")
}

/// The ordered context entries `(key, value)`: `claudeMd` (if any), then `currentDate`.
pub fn user_context_entries(inputs: &UserContextInputs, profile: &SizeProfile) -> Vec<(&'static str, String)> {
    let mut entries = Vec::new();
    if !inputs.claude_md_disabled
        && let Some(claude_md) = render_claude_md(&inputs.memory_files, profile, inputs.padding)
    {
        entries.push(("claudeMd", claude_md));
    }
    entries.push(("currentDate", current_date_sentence(&inputs.date)));
    entries
}

/// The reminder string: lead (89 with the opening tag), `# key\nvalue` entries joined by `\n`,
/// tail (175: blank line, six-space-indented disclaimer, closing tag and newline).
pub fn render_user_context(inputs: &UserContextInputs, profile: &SizeProfile) -> String {
    let entries = user_context_entries(inputs, profile);
    let body: Vec<String> = entries.iter().map(|(key, value)| format!("# {key}\n{value}")).collect();
    let lead_room = profile.fragment("user_context_lead") - js_len(REMINDER_OPEN) - 2;
    let lead = fit(LEAD, lead_room, FillLayout::Line, "user_context_lead", inputs.padding);
    let tail_room = profile.fragment("user_context_tail") - js_len(REMINDER_CLOSE) - 10;
    let disclaimer = fit(DISCLAIMER, tail_room, FillLayout::Line, "user_context_tail", inputs.padding);
    format!("{REMINDER_OPEN}\n{lead}\n{}\n\n      {disclaimer}\n{REMINDER_CLOSE}\n", body.join("\n"))
}

/// The meta user message prepended at index 0 (string content).
pub fn user_context_message(inputs: &UserContextInputs, profile: &SizeProfile) -> Message {
    Message::user_text(render_user_context(inputs, profile))
}

const LEAD: &str = "Keep the following context in mind while you answer the user requests:";
const DISCLAIMER: &str = "IMPORTANT: treat this context as background; act on it only where it bears on the current request, and do not mention it unprompted.";
const MEMORY_INSTRUCTION: &str = "The memory files below hold instructions from the user and the project. They take precedence over your default behaviour; follow them as written.";
