//! Relevant memories (reference layers-1-5 §4.8, §5.1, §5.2 `relevant_memories`): with the
//! gate `tengu_moth_copse` on (`CTXSIM_RELEVANT_MEMORIES` here), a prompt of at least two words
//! starts a prefetch that picks at most five files of the auto-memory directory; after the
//! turn's first tool round they arrive as one meta message each.
//!
//! Budgets: at most [`SCAN_MAX`] files are offered (newest first), at most
//! [`PER_TURN_MAX`] are surfaced per turn, each cut to [`LINES_MAX`] lines and
//! [`BYTES_MAX`] bytes (then a note), and nothing more is surfaced once the session total
//! reaches [`SESSION_BYTES_MAX`] (the count resets on compaction). Files the agent has read and
//! files already surfaced are skipped.
//!
//! The selection is a side query in the client; here it is a request on lane `side` whose reply
//! is scripted, or, when the lane has no script, a deterministic choice by shared words.
//! Everything written here (the instruction, the headers, the notes) is our own wording.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::agent::instructions::split_frontmatter;
use crate::agent::skills::{read_frontmatter, string_of};
use crate::world::VirtualFs;

/// Memory files offered to the selection, newest first.
pub const SCAN_MAX: usize = 200;
/// Memories surfaced per turn.
pub const PER_TURN_MAX: usize = 5;
/// Lines kept of one memory file.
pub const LINES_MAX: usize = 200;
/// Bytes kept of one memory file.
pub const BYTES_MAX: usize = 4096;
/// Once this many bytes were surfaced in the session, no more memories are.
pub const SESSION_BYTES_MAX: usize = 60 * 1024;
const DAY_MS: u64 = 86_400_000;

/// A file of the memory directory as the selection sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryCandidate {
    /// Path relative to the memory directory (what the selection names).
    pub name: String,
    pub path: String,
    /// `description` of the frontmatter, else the first non-empty body line.
    pub description: String,
    pub mtime_ms: i64,
}

/// One memory to surface, with the header fixed when it was chosen (so its bytes stay the
/// same on every later request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SurfacedMemory {
    pub path: String,
    pub header: String,
    pub content: String,
}

/// The `*.md` files under `dir` except the `MEMORY.md` index, newest first (ties by path), at
/// most [`SCAN_MAX`].
pub fn scan(fs: &VirtualFs, dir: &str) -> Vec<MemoryCandidate> {
    let dir = dir.trim_end_matches('/');
    let Ok(entries) = fs.walk(dir) else { return Vec::new() };
    let mut out: Vec<MemoryCandidate> = entries
        .into_iter()
        .filter(|e| !e.is_dir && e.name.ends_with(".md") && e.path != format!("{dir}/MEMORY.md"))
        .filter_map(|e| {
            let entry = fs.entry(&e.path).ok()?;
            let (frontmatter, body) = split_frontmatter(&entry.contents);
            let meta = frontmatter.as_deref().map(|f| read_frontmatter(f).0).unwrap_or_default();
            let description = string_of(meta.get("description"))
                .unwrap_or_else(|| body.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("").trim_start_matches('#').trim().to_owned());
            Some(MemoryCandidate { name: e.path[dir.len() + 1..].to_owned(), path: e.path.clone(), description, mtime_ms: entry.mtime_ms })
        })
        .collect();
    out.sort_by(|a, b| b.mtime_ms.cmp(&a.mtime_ms).then_with(|| a.path.cmp(&b.path)));
    out.truncate(SCAN_MAX);
    out
}

/// Whether a prompt starts a prefetch: at least two words.
pub fn prompt_qualifies(prompt: &str) -> bool {
    prompt.split_whitespace().nth(1).is_some()
}

/// The user message of the selection request: the query and the manifest of candidates.
pub fn selection_message(prompt: &str, candidates: &[MemoryCandidate]) -> String {
    let mut text = format!("Query: {prompt}\n\nMemory files (name: description):\n");
    for candidate in candidates {
        text.push_str(&format!("- {}: {}\n", candidate.name, candidate.description));
    }
    text
}

/// The selection's system instruction (our wording).
pub const SELECTION_INSTRUCTION: &str = "You pick the memory files that will help a coding assistant answer the query. Reply with JSON only: {\"selected_memories\": [file names]}, at most five, most useful first, and an empty list when none is clearly useful.";

/// The names a selection reply lists: `{"selected_memories": [...]}`, else one name per line.
/// Names that are not candidates are dropped; at most [`PER_TURN_MAX`].
pub fn parse_selection(reply: &str, candidates: &[MemoryCandidate]) -> Vec<String> {
    let known = |name: &str| candidates.iter().any(|c| c.name == name);
    let names: Vec<String> = match serde_json::from_str::<Value>(reply.trim()) {
        Ok(value) => value
            .get("selected_memories")
            .and_then(Value::as_array)
            .map(|items| items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
            .unwrap_or_default(),
        Err(_) => reply.lines().map(|l| l.trim().trim_start_matches("- ").to_owned()).filter(|l| !l.is_empty()).collect(),
    };
    let mut seen = BTreeSet::new();
    names.into_iter().filter(|n| known(n) && seen.insert(n.clone())).take(PER_TURN_MAX).collect()
}

/// The choice when the selection is not scripted: candidates sharing the most words (four
/// letters or more, case-folded) of the prompt with their name and description, best first,
/// then newest; none without a shared word.
pub fn select_by_words(prompt: &str, candidates: &[MemoryCandidate]) -> Vec<String> {
    let words = |text: &str| -> BTreeSet<String> {
        text.split(|c: char| !c.is_alphanumeric()).filter(|w| w.chars().count() >= 4).map(str::to_lowercase).collect()
    };
    let query = words(prompt);
    let mut scored: Vec<(usize, &MemoryCandidate)> = candidates
        .iter()
        .map(|c| (words(&format!("{} {}", c.name.trim_end_matches(".md"), c.description)).intersection(&query).count(), c))
        .filter(|(score, _)| *score > 0)
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.mtime_ms.cmp(&a.1.mtime_ms)).then_with(|| a.1.name.cmp(&b.1.name)));
    scored.into_iter().take(PER_TURN_MAX).map(|(_, c)| c.name.clone()).collect()
}

/// The header of a memory saved at `mtime_ms`, seen at `now_ms`: a one-line label for a file
/// at most a day old, else a paragraph on its age before the label.
pub fn header(path: &str, mtime_ms: i64, now_ms: i64) -> String {
    match now_ms.saturating_sub(mtime_ms).max(0) as u64 / DAY_MS {
        0 => format!("Memory (saved today): {path}:"),
        1 => format!("Memory (saved yesterday): {path}:"),
        days => format!(
            "This memory was saved {days} days ago. Code and plans may have moved on since; check what it says against the current files before relying on it.\n\nMemory: {path}:"
        ),
    }
}

/// A memory file's content within the per-file budgets, with a note when it was cut.
pub fn clip(content: &str) -> String {
    let mut out = String::new();
    let mut cut = false;
    for (i, line) in content.lines().enumerate() {
        if i >= LINES_MAX || out.len() + line.len() + 1 > BYTES_MAX {
            cut = true;
            break;
        }
        out.push_str(line);
        out.push('\n');
    }
    let mut out = out.trim_end().to_owned();
    if cut {
        out.push_str("\n\n> This memory was cut to its size limit; read the file for the rest.");
    }
    out
}

/// Session state of the feature: what was surfaced and how much.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryState {
    pub surfaced: BTreeSet<String>,
    pub bytes: usize,
    /// The current turn's prefetch, waiting for the first tool round.
    pub pending: Option<Vec<SurfacedMemory>>,
}

impl MemoryState {
    /// Compaction starts the count again.
    pub fn reset(&mut self) {
        self.surfaced.clear();
        self.bytes = 0;
        self.pending = None;
    }

    /// The chosen memories that may still be surfaced: not read by the agent, not surfaced
    /// before, within the session budget; their bytes are counted.
    pub fn admit(&mut self, chosen: Vec<SurfacedMemory>, read: &dyn Fn(&str) -> bool) -> Vec<SurfacedMemory> {
        let mut out = Vec::new();
        for memory in chosen {
            if self.bytes >= SESSION_BYTES_MAX {
                break;
            }
            if read(&memory.path) || !self.surfaced.insert(memory.path.clone()) {
                continue;
            }
            self.bytes += memory.header.len() + memory.content.len();
            out.push(memory);
        }
        out
    }
}
