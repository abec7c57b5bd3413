//! What Claude Code re-attaches after a compaction, rebuilt from the transcript.
//!
//! The client keeps a `readFileState`: every file the model read, edited or wrote, with its
//! content and when. At a compaction it takes the five most recently touched files (leaving out
//! the plan file and the CLAUDE.md memory files), re-reads each one whole with a limit of
//! 5,000 tokens on its text, and attaches it as the Read tool shows it (numbered lines, which
//! adds about half as much again for code); a file over the limit comes back as a one-line
//! reference instead, and attachments are kept while their running size stays within 50,000 tokens
//! (reference/layer-6-and-caching.md §5.10). A plan file, if one exists, is attached with its
//! content (§5.4 step 9). The state is cleared, and the restored files are its new content.
//!
//! A transcript holds enough to rebuild that state: the structured result of every tool call
//! (`toolUseResult`) carries a Read's text with its line range and the file's total line count,
//! an Edit's whole original file with the replaced strings, and a Write's content. A file known
//! only from a partial Read is sized from the lines read, scaled to its total line count.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::{ContentBlock, SharedText};
use crate::measure::tokens::chars4;

/// The Read tool's default line limit: a whole-file re-read shows at most this many lines
/// (the default of the `read_max_lines` knob the agent's Read applies).
const READ_MAX_LINES: usize = 2_000;

/// What the replay knows of one file's content.
#[derive(Debug, Clone, PartialEq)]
enum Content {
    /// The whole file, as text: shared with every copy of the state and the workload's tool
    /// outputs that show it ([`WorkingSet::content_of`]).
    Known(SharedText),
    /// Only part of it was read: `slice` holds `lines` of its `total_lines` lines.
    Partial { slice: String, lines: usize, total_lines: usize },
}

#[derive(Debug, Clone, PartialEq)]
struct FileEntry {
    /// The path as the last call that touched the file spelled it (what a restore shows).
    path: String,
    /// Sequence number of the last touch (read, edit or write).
    touched: u64,
    content: Content,
}

/// One attachment the client would send after a compaction.
#[derive(Debug, Clone, PartialEq)]
pub enum Restored {
    /// A file shown whole: the rendered text.
    File { path: String, text: String },
    /// A file known only in part: its estimated size, in tokens and in characters.
    Sized { path: String, tokens: u64, chars: usize },
    /// A file too big to show: only its name.
    Reference { path: String },
    /// The plan file with its content.
    Plan { path: String, text: String },
}

impl Restored {
    /// The attachment as the text block the replay sends; `sized` makes a text of a given
    /// number of tokens (the replay's filler).
    pub fn to_block(&self, sized: impl Fn(&str, u64) -> String) -> ContentBlock {
        ContentBlock::text(match self {
            Restored::File { path, text } => read_attachment(path, text),
            Restored::Sized { path, tokens, .. } => read_attachment(path, &sized(path, *tokens)),
            Restored::Reference { path } => format!(
                "<system-reminder>\nNote: {path} was read before the conversation was summarized; it is too large to include again. Read it if it is needed.\n</system-reminder>"
            ),
            Restored::Plan { path, text } => format!(
                "<system-reminder>\nA plan file exists from plan mode at {path}:\n\n{text}\n\nContinue with it if it is relevant and not yet done.\n</system-reminder>"
            ),
        })
    }
}

fn read_attachment(path: &str, body: &str) -> String {
    format!(
        "<system-reminder>\nCalled the Read tool with the following input: {{\"file_path\":\"{path}\"}}\n</system-reminder>\n<system-reminder>\nResult of calling the Read tool:\n{body}\n</system-reminder>"
    )
}

/// The Read tool's rendering of a file as the replay restores it: numbered lines
/// ([`crate::agent::tools::exec::number_lines_as`], the agent's one rendering) in `style` (the
/// version's, [`super::profile::ClientProfile::restore_line_numbers`]), at most
/// [`READ_MAX_LINES`] lines of at most [`crate::agent::tools::exec::READ_MAX_LINE_CHARS`]
/// characters each.
///
/// Unlike the agent's Read (and the client's, in every record: a file of 46 lines ending in a
/// newline shows a 47th, empty one), the replay numbers no empty line after a final newline:
/// its restore sizes were fitted that way and are kept byte for byte; the difference is one
/// short line per restored file.
pub fn render_numbered(content: &str, style: crate::agent::tools::exec::LineNumbers) -> String {
    if content.is_empty() {
        return String::new();
    }
    crate::agent::tools::exec::number_lines_as(content.strip_suffix('\n').unwrap_or(content), 0, READ_MAX_LINES, style)
}

/// The client's `readFileState` and plan file, as far as a transcript shows them.
#[derive(Debug, Clone, Default)]
pub struct WorkingSet {
    /// By [`crate::agent::skills::file_key`]: a Windows client's `D:\omp\a.go` and `d:/omp/a.go`
    /// are one file, as the client's own state keys them.
    files: BTreeMap<String, FileEntry>,
    plan: Option<(String, String)>,
    clock: u64,
}

use crate::agent::compact::rebuild::{is_memory_file, is_plan_file};

/// `original` with `old` replaced by `new`: its first occurrence, or all of them (left to right,
/// not overlapping), as `str::replacen(old, new, 1)` and `str::replace` give it; unchanged for an
/// empty `old`. The std's two-way search over an Edit's whole original file cost a third of what
/// the replay spends on the edits, and a `memmem` finder of a whole `old` (often lines of code)
/// costs more to build than its search: the candidates are found by memchr's vectorized search
/// for the first [`SEARCHED_BYTES`] of `old`, each then compared whole. (A match of UTF-8 in
/// UTF-8 starts and ends on character boundaries.)
fn replace(original: &str, old: &str, new: &str, all: bool) -> String {
    if old.is_empty() {
        return original.to_owned();
    }
    let (bytes, needle) = (original.as_bytes(), old.as_bytes());
    let head = memchr::memmem::Finder::new(&needle[..needle.len().min(SEARCHED_BYTES)]);
    let mut replaced = String::with_capacity(original.len() + new.len());
    let (mut copied, mut from) = (0, 0);
    while let Some(found) = head.find(&bytes[from..]) {
        let at = from + found;
        if !bytes[at..].starts_with(needle) {
            from = at + 1;
            continue;
        }
        replaced.push_str(&original[copied..at]);
        replaced.push_str(new);
        copied = at + needle.len();
        from = copied;
        if !all {
            break;
        }
    }
    replaced.push_str(&original[copied..]);
    debug_assert_eq!(replaced, if all { original.replace(old, new) } else { original.replacen(old, new, 1) }, "replace differs from the std's");
    replaced
}

/// How much of an edit's `old` text [`replace`] searches for.
const SEARCHED_BYTES: usize = 32;

impl WorkingSet {
    /// Follows one finished tool call: `name` and `input` of the tool_use, `structured` the
    /// client's `toolUseResult`. Calls that touch no file, failed ones and results without a
    /// structured part leave the state as it is.
    pub fn observe(&mut self, name: &str, input: &Value, structured: Option<&Value>, is_error: bool) {
        self.observe_memoized(name, input, structured, is_error, &mut |edited| edited().into());
    }

    /// [`Self::observe`], the text an edit result makes of the `originalFile` it carries (a
    /// function of the result alone) got through `edited`, which may give it from a memo.
    pub fn observe_memoized(&mut self, name: &str, input: &Value, structured: Option<&Value>, is_error: bool, edited: &mut dyn FnMut(&dyn Fn() -> String) -> SharedText) {
        if is_error {
            return;
        }
        let Some(result) = structured else { return };
        let path = input.get("file_path").and_then(Value::as_str).or_else(|| result.get("filePath").and_then(Value::as_str));
        let Some(path) = path.map(str::to_owned) else { return };
        let key = crate::agent::skills::file_key(&path).into_owned();
        let content = match name {
            "Read" => {
                let Some(file) = result.get("file") else { return };
                if result.get("type").and_then(Value::as_str).is_some_and(|t| t != "text") {
                    return;
                }
                let Some(text) = file.get("content").and_then(Value::as_str) else { return };
                let num = |key: &str| file.get(key).and_then(Value::as_u64).map(|n| n as usize);
                let lines = num("numLines").unwrap_or_else(|| text.lines().count());
                let start = num("startLine").unwrap_or(1);
                let total = num("totalLines").unwrap_or(lines);
                if start <= 1 && lines >= total {
                    Content::Known(text.into())
                } else {
                    match self.files.get(&key).map(|e| &e.content) {
                        // A partial re-read of a file already known whole changes nothing.
                        Some(Content::Known(known)) => Content::Known(known.clone()),
                        _ => Content::Partial { slice: text.to_owned(), lines: lines.max(1), total_lines: total.max(lines) },
                    }
                }
            }
            "Edit" | "MultiEdit" => {
                let apply = |original: String| {
                    let edits: Vec<(&str, &str, bool)> = match result.get("edits").and_then(Value::as_array) {
                        Some(edits) => edits
                            .iter()
                            .map(|e| {
                                (
                                    e.get("old_string").and_then(Value::as_str).unwrap_or(""),
                                    e.get("new_string").and_then(Value::as_str).unwrap_or(""),
                                    e.get("replace_all").and_then(Value::as_bool).unwrap_or(false),
                                )
                            })
                            .collect(),
                        None => vec![(
                            result.get("oldString").and_then(Value::as_str).unwrap_or(""),
                            result.get("newString").and_then(Value::as_str).unwrap_or(""),
                            result.get("replaceAll").and_then(Value::as_bool).unwrap_or(false),
                        )],
                    };
                    edits.into_iter().fold(original, |text, (old, new, all)| replace(&text, old, new, all))
                };
                if let Some(original) = result.get("originalFile").and_then(Value::as_str) {
                    Content::Known(edited(&|| apply(original.to_owned())))
                } else {
                    match self.files.get(&key) {
                        Some(FileEntry { content: Content::Known(known), .. }) => Content::Known(apply(String::clone(known)).into()),
                        Some(entry) => entry.content.clone(),
                        None => return,
                    }
                }
            }
            "Write" => match result.get("content").and_then(Value::as_str) {
                Some(text) => Content::Known(text.into()),
                None => return,
            },
            _ => return,
        };
        if is_plan_file(&path) {
            if let Content::Known(text) = &content {
                self.plan = Some((path, String::clone(text)));
            }
            return;
        }
        self.clock += 1;
        self.files.insert(key, FileEntry { path, touched: self.clock, content });
    }

    /// What the record shows of `path`'s content now: its whole text, or for a file known only
    /// in part, a stand-in of the whole file's size at the density of the part read (the size
    /// [`Self::compact`] restores it at). `None` for a file the record does not show (and for
    /// the plan file, kept apart). A whole text is the state's own, shared.
    pub fn content_of(&self, path: &str) -> Option<SharedText> {
        match &self.files.get(crate::agent::skills::file_key(path).as_ref())?.content {
            Content::Known(text) => Some(text.clone()),
            Content::Partial { slice, lines, total_lines } => {
                let chars = slice.len() * (*total_lines).min(READ_MAX_LINES) / (*lines).max(1);
                Some(crate::agent::compact::generator::filler("file known in part", chars).into())
            }
        }
    }

    /// The attachments after a compaction, in the client's order (files, then the plan), and
    /// the state the compaction leaves: only the restored files. `tokens` estimates a text as
    /// the API counts it (the client checks the 5,000-token limit with the API's count).
    /// `style` numbers the restored files' lines (the version's).
    pub fn compact(&mut self, cwd: Option<&str>, tokens: impl Fn(&str) -> u64, style: crate::agent::tools::exec::LineNumbers) -> Vec<Restored> {
        self.compact_memoized(cwd, &tokens, |text, past| past(tokens(text)), |text| render_numbered(text, style))
    }

    /// [`Self::compact`], the files' numbered renderings ([`render_numbered`]) got through
    /// `render`, which may give them from a memo, and whether a text's count passes a file's
    /// limit through `passes` (a text and the limit's test, which holds for every count above
    /// one it holds for): the same answer as the test of `tokens`' count, which it may give
    /// counting a long text only until a part of it passes
    /// ([`crate::measure::TokenCounter::count_text_unless`]).
    ///
    /// The budgets are the agent's ([`crate::agent::compact::config::PostCompactConfig`]'s
    /// defaults, the client's constants), as is the order (newest first, at most `max_files`,
    /// a file over `max_tokens_per_file` shown as a reference, skipped when the running total
    /// would pass `files_token_budget`: [`crate::agent::compact::rebuild::file_attachments`]).
    /// What differs is record knowledge: which files the client's state held and what the
    /// record shows of their content (a file read in part is sized, not shown).
    pub fn compact_memoized(
        &mut self,
        cwd: Option<&str>,
        tokens: impl Fn(&str) -> u64,
        passes: impl Fn(&str, &dyn Fn(u64) -> bool) -> bool,
        render: impl Fn(&str) -> String,
    ) -> Vec<Restored> {
        let budget = crate::agent::compact::config::PostCompactConfig::default();
        let mut recent: Vec<(&String, &FileEntry)> =
            self.files.iter().filter(|(_, entry)| !is_memory_file(&entry.path, cwd)).collect();
        recent.sort_by_key(|r| std::cmp::Reverse(r.1.touched));
        let mut out = Vec::new();
        let mut kept = BTreeMap::new();
        let mut total = 0u64;
        for (key, entry) in recent.into_iter().take(budget.max_files) {
            let path = &entry.path;
            let restored = match &entry.content {
                // The limit applies to the file's text; what is sent is its numbered rendering.
                Content::Known(text) => {
                    if passes(text, &|n| n > budget.max_tokens_per_file) {
                        Restored::Reference { path: path.clone() }
                    } else {
                        Restored::File { path: path.clone(), text: render(text) }
                    }
                }
                Content::Partial { slice, lines, total_lines } => {
                    // The whole file at the density of the part read.
                    let shown = (*total_lines).min(READ_MAX_LINES) as u64;
                    let lines = *lines as u64;
                    if passes(slice, &|n| n * shown / lines > budget.max_tokens_per_file) {
                        Restored::Reference { path: path.clone() }
                    } else {
                        let rendered = render(slice);
                        Restored::Sized {
                            path: path.clone(),
                            tokens: tokens(&rendered) * shown / lines,
                            chars: (rendered.len() as u64 * shown / lines) as usize,
                        }
                    }
                }
            };
            // The client's running total is a chars/4 estimate of each attachment message.
            let size = match &restored {
                Restored::File { path, text } => u64::from(chars4(&read_attachment(path, text))),
                Restored::Sized { chars, .. } => (*chars as u64).div_ceil(4),
                _ => 0,
            };
            if total + size > budget.files_token_budget {
                continue;
            }
            total += size;
            if !matches!(restored, Restored::Reference { .. }) {
                kept.insert(key.clone(), entry.clone());
            }
            out.push(restored);
        }
        if let Some((path, text)) = &self.plan {
            out.push(Restored::Plan { path: path.clone(), text: text.clone() });
        }
        self.files = kept;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::tools::exec::{LineNumbers, READ_MAX_LINE_CHARS};
    use proptest::prelude::*;
    use serde_json::json;

    proptest! {
        /// `replace` is the std's `replacen(old, new, 1)` or `replace`: overlapping and repeated
        /// matches, multi-byte text, an empty or absent `old`.
        #[test]
        fn replace_is_the_std_replace(original in "[aé→b]{0,12}|[ab]{30,80}", old in "[aé→]{0,3}|[ab]{30,40}", new in "[ab→]{0,2}", all in any::<bool>()) {
            let std = if old.is_empty() { original.clone() } else if all { original.replace(&old, &new) } else { original.replacen(&old, &new, 1) };
            prop_assert_eq!(replace(&original, &old, &new, all), std);
        }
    }

    #[test]
    fn numbered_rendering_cuts_lines_at_characters_and_files_at_lines() {
        // Lines longer than the limit in bytes and in characters (multi-byte), short lines, an
        // empty line, and more lines than are rendered.
        let long_ascii = "a".repeat(READ_MAX_LINE_CHARS + 5);
        let long_wide = "é→".repeat(READ_MAX_LINE_CHARS);
        let short_wide = "é".repeat(READ_MAX_LINE_CHARS - 1);
        let mut lines = vec![long_ascii.clone(), long_wide.clone(), short_wide.clone(), String::new()];
        lines.extend((0..READ_MAX_LINES).map(|i| format!("line {i}")));
        let text = lines.join("\n");
        let rendered = render_numbered(&text, LineNumbers::Arrow);
        let out: Vec<&str> = rendered.lines().collect();
        assert_eq!(out.len(), READ_MAX_LINES);
        assert_eq!(out[0], format!("     1\u{2192}{}", "a".repeat(READ_MAX_LINE_CHARS)));
        let wide: String = long_wide.chars().take(READ_MAX_LINE_CHARS).collect();
        assert_eq!(out[1], format!("     2\u{2192}{wide}"));
        assert_eq!(out[2], format!("     3\u{2192}{short_wide}"));
        assert_eq!(out[3], "     4\u{2192}");
        assert_eq!(out[READ_MAX_LINES - 1], format!("{READ_MAX_LINES:>6}\u{2192}line {}", READ_MAX_LINES - 5));
        assert!(rendered.ends_with('\n'));
    }

    fn read(set: &mut WorkingSet, path: &str, content: &str, start: u64, lines: u64, total: u64) {
        let result = json!({"type": "text", "file": {"filePath": path, "content": content, "numLines": lines, "startLine": start, "totalLines": total}});
        set.observe("Read", &json!({"file_path": path}), Some(&result), false);
    }

    #[test]
    fn the_five_most_recent_files_come_back_and_big_ones_as_references() {
        let mut set = WorkingSet::default();
        for i in 0..7 {
            read(&mut set, &format!("/r/f{i}.rs"), "fn main() {}\n", 1, 1, 1);
        }
        // A partial read of a long file: too big to restore whole.
        read(&mut set, "/r/big.rs", &"let x = 1;\n".repeat(50), 100, 50, 5_000);
        let restored = set.compact(Some("/r"), |t| chars4(t) as u64, LineNumbers::Arrow);
        assert_eq!(restored.len(), 5);
        assert_eq!(restored[0], Restored::Reference { path: "/r/big.rs".into() });
        let paths: Vec<&str> = restored[1..]
            .iter()
            .map(|r| match r {
                Restored::File { path, .. } => path.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(paths, ["/r/f6.rs", "/r/f5.rs", "/r/f4.rs", "/r/f3.rs"]);
        // The state is now the restored files only.
        assert_eq!(set.compact(Some("/r"), |t| chars4(t) as u64, LineNumbers::Arrow).len(), 4);
    }

    /// The per-file limit answered by a count cut short ([`crate::measure::TokenCounter::count_text_unless`],
    /// as the record view does) restores what the whole counts restore: a file far over the
    /// limit, one known in part over it at the whole file's size, files under it.
    #[test]
    fn a_limit_answered_by_counts_cut_short_restores_as_whole_counts() {
        use crate::measure::{EstimatorKind, TokenCounter};
        let big: String = (0..3000).map(|i| format!("item_{i}(x: u64) -> u64 {{ x * {i} + 1 }}\n")).collect();
        let mut set = WorkingSet::default();
        read(&mut set, "/r/big.rs", &big, 1, 3000, 3000);
        read(&mut set, "/r/part.rs", &big[..big.len() / 4], 1, 750, 3000);
        read(&mut set, "/r/small.rs", "fn main() {}\n", 1, 1, 1);
        read(&mut set, "/r/mid.rs", &big[..big.len() / 20], 1, 150, 150);
        let counter = TokenCounter::new(EstimatorKind::Calibrated);
        let tokens = |t: &str| u64::from(counter.count_text(t, "anthropic"));
        let whole = set.clone().compact(Some("/r"), tokens, LineNumbers::Arrow);
        let cut = set.compact_memoized(
            Some("/r"),
            tokens,
            |text, past| counter.count_text_unless(text, "anthropic", past).is_none_or(|n| past(u64::from(n))),
            |text| render_numbered(text, LineNumbers::Arrow),
        );
        assert_eq!(cut, whole);
        assert!(matches!(&whole[..], [Restored::File { .. }, Restored::File { .. }, Restored::Reference { .. }, Restored::Reference { .. }]), "{whole:?}");
    }

    #[test]
    fn edits_apply_to_the_original_file_and_memory_and_plan_files_are_set_apart() {
        let mut set = WorkingSet::default();
        let edit = json!({"filePath": "/r/a.rs", "oldString": "1", "newString": "2", "originalFile": "x = 1\ny = 1\n", "replaceAll": false});
        set.observe("Edit", &json!({"file_path": "/r/a.rs"}), Some(&edit), false);
        set.observe("Write", &json!({"file_path": "/r/CLAUDE.md"}), Some(&json!({"content": "rules"})), false);
        set.observe("Write", &json!({"file_path": "/h/.claude/plans/p.md"}), Some(&json!({"content": "# Plan"})), false);
        let restored = set.compact(Some("/r"), |t| chars4(t) as u64, LineNumbers::Arrow);
        assert_eq!(restored.len(), 2, "{restored:?}");
        assert_eq!(restored[0], Restored::File { path: "/r/a.rs".into(), text: "     1\u{2192}x = 2\n     2\u{2192}y = 1\n".into() });
        assert!(matches!(&restored[1], Restored::Plan { text, .. } if text == "# Plan"));
    }
}
