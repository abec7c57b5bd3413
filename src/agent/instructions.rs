//! CLAUDE.md memory: discovery over the virtual filesystem (reference layers-1-5 §4.4–4.7).
//!
//! Eager discovery yields the files of the `claudeMd` user context in the reference order:
//! managed, user, then every ancestor of the cwd from the outermost (the root itself is never
//! checked) down to the cwd with `CLAUDE.md`, `.claude/CLAUDE.md`, `.claude/rules/**/*.md`
//! (unconditional only) and `CLAUDE.local.md`, then the auto-memory `MEMORY.md`. Each file is
//! followed by its `@include`s (depth-first, depth limit 5, duplicates dropped). Rules with a
//! `paths` frontmatter are held back and come in as `nested_memory` when a matching file is read,
//! as do the CLAUDE.md files of directories below the cwd.
//!
//! Readdir order is unspecified in the reference; we use sorted order (documented choice).

use std::collections::BTreeSet;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::agent::user_context::{MemoryFile, MemoryKind};
use crate::world::{Reads, VirtualFs, normalize_path};

/// `MAX_INCLUDE_DEPTH`.
pub const MAX_INCLUDE_DEPTH: usize = 5;
/// Auto-memory entrypoint limits: lines, then characters (cut at the last newline).
pub const AUTO_MEMORY_MAX_LINES: usize = 200;
pub const AUTO_MEMORY_MAX_CHARS: usize = 25_000;
/// `/etc/claude-code` on Linux.
pub const MANAGED_DIR: &str = "/etc/claude-code";

/// Extensions a memory file or include may have (files without one are allowed too).
const TEXT_EXTENSIONS: &[&str] = &[
    "md", "markdown", "mdx", "txt", "text", "rst", "adoc", "org", "json", "jsonc", "json5", "yaml", "yml", "toml",
    "ini", "cfg", "conf", "xml", "html", "htm", "css", "scss", "less", "csv", "tsv", "sql", "graphql", "gql", "proto",
    "rs", "go", "py", "pyi", "rb", "php", "java", "kt", "kts", "scala", "swift", "m", "mm", "c", "h", "cc", "cpp",
    "hpp", "cxx", "cs", "fs", "js", "jsx", "mjs", "cjs", "ts", "tsx", "mts", "cts", "vue", "svelte", "astro", "lua",
    "pl", "pm", "r", "jl", "dart", "ex", "exs", "erl", "hrl", "clj", "cljs", "elm", "hs", "ml", "mli", "nim", "zig",
    "sh", "bash", "zsh", "fish", "ps1", "bat", "cmd", "env", "example", "lock", "gradle", "properties", "tf", "hcl",
    "nix", "dockerfile", "makefile", "mk", "cmake", "gitignore", "editorconfig", "prisma", "sol", "tex", "bib",
];

/// Inputs of discovery that come from settings and the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryOptions {
    pub cwd: String,
    /// The config home, `~/.claude`.
    pub config_home: String,
    pub managed_dir: String,
    /// `claudeMdExcludes` (picomatch-style globs on absolute paths).
    pub excludes: Vec<String>,
    /// `hasClaudeMdExternalIncludesApproved`.
    pub external_includes_approved: bool,
    /// Auto-memory directory (`None` = auto memory off).
    pub auto_memory_dir: Option<String>,
    /// Load `CLAUDE.local.md` (localSettings source enabled).
    pub local: bool,
}

/// A rule file held back because of its `paths` frontmatter.
#[derive(Debug, Clone)]
pub struct ConditionalRule {
    pub path: String,
    pub kind: MemoryKind,
    /// Patterns are matched against the target path relative to this directory.
    pub base: String,
    pub patterns: Vec<String>,
    pub content: String,
    matcher: GlobSet,
}

impl ConditionalRule {
    /// Gitignore-style match of `target` (absolute) relative to the rule's base.
    pub fn matches(&self, target: &str) -> bool {
        let Some(relative) = relative_to(target, &self.base) else { return false };
        if relative.is_empty() {
            return false;
        }
        self.matcher.is_match(&relative)
    }
}

/// The result of eager discovery.
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    /// Files of `claudeMd`, in order.
    pub files: Vec<MemoryFile>,
    /// Conditional rules of every level (managed, user, ancestors, and below-cwd ones are found
    /// on demand by [`nested_memory_for`]).
    pub conditional: Vec<ConditionalRule>,
}

/// Eager discovery (`getMemoryFiles`).
pub fn discover(fs: &VirtualFs, options: &DiscoveryOptions) -> Discovery {
    // Every new conversation (a subagent, a what-if's run) discovers again; between two
    // changes of the fs it finds what the one before found.
    // A conversation started after a change of the fs elsewhere (a compaction re-reading its
    // memory after the agent edited code) finds what was found before when the files it read
    // read the same.
    fs.derived_by_reads(&format!("instructions::discover {options:?}"), |fs| read_discovery(fs, options))
}

fn read_discovery(fs: &Reads<'_>, options: &DiscoveryOptions) -> Discovery {
    let mut cx = Loader { fs, options, processed: BTreeSet::new(), out: Vec::new(), conditional: Vec::new() };
    let managed = options.managed_dir.clone();
    cx.file(&format!("{managed}/CLAUDE.md"), MemoryKind::Managed, 0, true);
    cx.rules(&format!("{managed}/.claude/rules"), MemoryKind::Managed, &options.cwd);
    let home = options.config_home.clone();
    cx.file(&format!("{home}/CLAUDE.md"), MemoryKind::User, 0, true);
    cx.rules(&format!("{home}/rules"), MemoryKind::User, &options.cwd);
    for dir in ancestors_outermost_first(&options.cwd) {
        cx.file(&join(&dir, "CLAUDE.md"), MemoryKind::Project, 0, false);
        cx.file(&join(&dir, ".claude/CLAUDE.md"), MemoryKind::Project, 0, false);
        cx.rules(&join(&dir, ".claude/rules"), MemoryKind::Project, &dir);
        if options.local {
            cx.file(&join(&dir, "CLAUDE.local.md"), MemoryKind::Local, 0, false);
        }
    }
    if let Some(dir) = &options.auto_memory_dir {
        let path = join(dir.trim_end_matches('/'), "MEMORY.md");
        if let Ok(text) = fs.read(&path)
            && cx.processed.insert(path.clone())
        {
            let content = truncate_entrypoint(text);
            if !content.trim().is_empty() {
                cx.out.push(MemoryFile { path, kind: MemoryKind::AutoMem, content: content.into() });
            }
        }
    }
    Discovery { files: cx.out, conditional: cx.conditional }
}

/// Files to inject as `nested_memory` when `target` is read (§4.7), skipping paths in
/// `loaded`, which is updated. Each result is `(path, content)`.
pub fn nested_memory_for(
    fs: &VirtualFs,
    options: &DiscoveryOptions,
    discovery: &Discovery,
    target: &str,
    loaded: &mut BTreeSet<String>,
) -> Vec<(String, String)> {
    let mut results: Vec<(String, String)> = Vec::new();
    let push = |path: &str, content: &str, loaded: &mut BTreeSet<String>, results: &mut Vec<(String, String)>| {
        if !content.trim().is_empty() && loaded.insert(path.to_owned()) {
            results.push((path.to_owned(), content.to_owned()));
        }
    };
    // 1. Managed and user conditional rules.
    for rule in discovery.conditional.iter().filter(|r| matches!(r.kind, MemoryKind::Managed | MemoryKind::User)) {
        if rule.matches(target) {
            push(&rule.path, &rule.content, loaded, &mut results);
        }
    }
    // 2. Directories below the cwd down to the target's own directory.
    let target_dir = parent(target);
    let reads = Reads::untracked(fs);
    if let Some(rel) = relative_to(&target_dir, &options.cwd) {
        let mut dir = options.cwd.clone();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            dir = join(&dir, part);
            // Each nested file goes through the loader so its includes inside the cwd follow it.
            let mut cx = Loader { fs: &reads, options, processed: loaded.clone(), out: Vec::new(), conditional: Vec::new() };
            cx.file(&join(&dir, "CLAUDE.md"), MemoryKind::Project, 0, false);
            cx.file(&join(&dir, ".claude/CLAUDE.md"), MemoryKind::Project, 0, false);
            if options.local {
                cx.file(&join(&dir, "CLAUDE.local.md"), MemoryKind::Local, 0, false);
            }
            cx.rules(&join(&dir, ".claude/rules"), MemoryKind::Project, &dir);
            for file in cx.out {
                push(&file.path, &file.content, loaded, &mut results);
            }
            for rule in cx.conditional {
                if rule.matches(target) {
                    push(&rule.path, &rule.content, loaded, &mut results);
                }
            }
        }
    }
    // 3. Conditional rules of the cwd and its ancestors.
    for rule in discovery.conditional.iter().filter(|r| matches!(r.kind, MemoryKind::Project | MemoryKind::Local)) {
        if rule.matches(target) {
            push(&rule.path, &rule.content, loaded, &mut results);
        }
    }
    results
}

struct Loader<'a> {
    fs: &'a Reads<'a>,
    options: &'a DiscoveryOptions,
    processed: BTreeSet<String>,
    out: Vec<MemoryFile>,
    conditional: Vec<ConditionalRule>,
}

impl Loader<'_> {
    /// `processMemoryFile`: the file, then its includes depth-first.
    fn file(&mut self, path: &str, kind: MemoryKind, depth: usize, external_ok: bool) {
        self.load(path, kind, depth, external_ok, None);
    }

    fn load(&mut self, path: &str, kind: MemoryKind, depth: usize, external_ok: bool, rule_base: Option<&str>) {
        let Ok(path) = normalize_path(path) else { return };
        if depth >= MAX_INCLUDE_DEPTH || self.processed.contains(&path) || self.excluded(&path, kind) {
            return;
        }
        let Ok(text) = self.fs.read(&path) else { return };
        if !has_text_extension(&path) {
            return;
        }
        self.processed.insert(path.clone());
        let (frontmatter, body) = split_frontmatter(text);
        if let Some(base) = rule_base
            && let Some(patterns) = frontmatter.as_deref().and_then(frontmatter_paths)
        {
            if let Some(matcher) = build_matcher(&patterns) {
                // Sent as read, trailing newline included (the real client's nested_memory
                // reminder ends `pure.\n\n</system-reminder>`).
                let content = strip_block_comments(body).trim_start().to_owned();
                self.conditional.push(ConditionalRule { path, kind, base: base.to_owned(), patterns, content, matcher });
            }
            return;
        }
        let content = strip_block_comments(body);
        let includes = include_paths(&content, &parent(&path));
        if !content.trim().is_empty() {
            self.out.push(MemoryFile { path: path.clone(), kind, content: content.trim().into() });
        }
        for include in includes {
            let inside = relative_to(&include, &self.options.cwd).is_some();
            if inside || external_ok || kind == MemoryKind::User || self.options.external_includes_approved {
                self.load(&include, kind, depth + 1, external_ok, None);
            }
        }
    }

    /// `.claude/rules/**/*.md` under `dir`: unconditional ones loaded, conditional ones held.
    fn rules(&mut self, dir: &str, kind: MemoryKind, base: &str) {
        let Ok(entries) = self.fs.walk(dir) else { return };
        for entry in entries {
            if entry.is_dir || !entry.path.ends_with(".md") {
                continue;
            }
            self.load(&entry.path, kind, 0, kind == MemoryKind::User, Some(base));
        }
    }

    fn excluded(&self, path: &str, kind: MemoryKind) -> bool {
        if !matches!(kind, MemoryKind::User | MemoryKind::Project | MemoryKind::Local) {
            return false;
        }
        self.options.excludes.iter().any(|pattern| {
            GlobBuilder::new(pattern).literal_separator(true).build().is_ok_and(|g| g.compile_matcher().is_match(path))
        })
    }
}

fn has_text_extension(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    match name.rsplit_once('.') {
        None | Some(("", _)) => true,
        Some((_, ext)) => TEXT_EXTENSIONS.contains(&ext.to_ascii_lowercase().as_str()),
    }
}

/// Splits `---\n…\n---` frontmatter from the body.
pub fn split_frontmatter(text: &str) -> (Option<String>, &str) {
    let Some(rest) = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n")) else { return (None, text) };
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            let body = &rest[offset + line.len()..];
            return (Some(rest[..offset].to_owned()), body);
        }
        offset += line.len();
    }
    (None, text)
}

/// The `paths` of a frontmatter, expanded; `None` when absent or all `**` (unconditional).
pub fn frontmatter_paths(frontmatter: &str) -> Option<Vec<String>> {
    let value: serde_json::Value = serde_norway::from_str(frontmatter).ok().or_else(|| {
        // The reference retries with special values quoted; we fall back to a line scan.
        frontmatter.lines().find_map(|line| {
            line.strip_prefix("paths:").map(|v| serde_json::json!({"paths": v.trim().trim_matches('"').trim_matches('\'')}))
        })
    })?;
    let raw: Vec<String> = match value.get("paths")? {
        serde_json::Value::String(s) => split_outside_braces(s),
        serde_json::Value::Array(items) => items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect(),
        _ => return None,
    };
    let mut patterns = Vec::new();
    for item in raw {
        for expanded in expand_braces(item.trim()) {
            let p = expanded.strip_suffix("/**").unwrap_or(&expanded).to_owned();
            if !p.is_empty() {
                patterns.push(p);
            }
        }
    }
    if patterns.is_empty() || patterns.iter().all(|p| p == "**") {
        return None;
    }
    Some(patterns)
}

fn split_outside_braces(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    out.push(current);
    out.into_iter().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect()
}

/// `a.{ts,tsx}` → `a.ts`, `a.tsx` (first brace group, recursively).
fn expand_braces(pattern: &str) -> Vec<String> {
    let Some(open) = pattern.find('{') else { return vec![pattern.to_owned()] };
    let Some(close_rel) = pattern[open..].find('}') else { return vec![pattern.to_owned()] };
    let close = open + close_rel;
    let (head, inner, tail) = (&pattern[..open], &pattern[open + 1..close], &pattern[close + 1..]);
    inner.split(',').flat_map(|alt| expand_braces(&format!("{head}{alt}{tail}"))).collect()
}

/// Gitignore semantics: a pattern without an inner `/` matches at any depth; a match on a
/// directory covers everything below it.
fn build_matcher(patterns: &[String]) -> Option<GlobSet> {
    let mut builder = GlobSetBuilder::new();
    for pattern in patterns {
        let trimmed = pattern.trim_start_matches("./");
        let anchored = trimmed.trim_end_matches('/').contains('/');
        let base = if anchored { trimmed.trim_start_matches('/').to_owned() } else { format!("**/{trimmed}") };
        let base = base.trim_end_matches('/').to_owned();
        for glob in [base.clone(), format!("{base}/**")] {
            if let Ok(g) = GlobBuilder::new(&glob).literal_separator(true).build() {
                builder.add(g);
            }
        }
    }
    builder.build().ok()
}

/// Removes block-level HTML comments (a line starting with `<!--` up to `-->`), keeping
/// comments inside fenced code, unclosed ones, and text after `-->` on its line.
pub fn strip_block_comments(text: &str) -> String {
    if !text.contains("<!--") {
        return text.to_owned();
    }
    let mut out = String::new();
    let mut fence: Option<String> = None;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if let Some(f) = &fence {
            if trimmed.starts_with(f.as_str()) {
                fence = None;
            }
            out.push_str(line);
            i += 1;
            continue;
        }
        if let Some(f) = fence_marker(trimmed) {
            fence = Some(f);
            out.push_str(line);
            i += 1;
            continue;
        }
        if trimmed.starts_with("<!--") {
            // Find the closing marker from here on.
            let rest: String = lines[i..].concat();
            let start = line.len() - trimmed.len();
            if let Some(end) = rest[start..].find("-->") {
                let after = &rest[start + end + 3..];
                let consumed_lines = rest[..start + end + 3].matches('\n').count();
                let remainder_of_line = after.split_inclusive('\n').next().unwrap_or("");
                if !remainder_of_line.trim().is_empty() {
                    out.push_str(remainder_of_line);
                }
                i += consumed_lines + 1;
                continue;
            }
        }
        out.push_str(line);
        i += 1;
    }
    out
}

fn fence_marker(trimmed: &str) -> Option<String> {
    for f in ["```", "~~~"] {
        if trimmed.starts_with(f) {
            let c = f.chars().next().expect("non-empty");
            let n = trimmed.chars().take_while(|&x| x == c).count();
            return Some(c.to_string().repeat(n));
        }
    }
    None
}

/// The `@include` targets of a file's text (outside code blocks and code spans), resolved
/// against `dir`, fragments stripped, in order of appearance.
pub fn include_paths(text: &str, dir: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(f) = &fence {
            if trimmed.starts_with(f.as_str()) {
                fence = None;
            }
            continue;
        }
        if let Some(f) = fence_marker(trimmed) {
            fence = Some(f);
            continue;
        }
        if line.starts_with("    ") || line.starts_with('\t') {
            continue; // indented code block
        }
        for raw in mentions_outside_code_spans(line) {
            if let Some(path) = resolve_include(&raw, dir)
                && !out.contains(&path) {
                    out.push(path);
                }
        }
    }
    out
}

/// `(?:^|\s)@((?:[^\s\\]|\\ )+)` over the text outside backtick code spans. Every mention
/// opens with `@` and a code span ends on its line, so a line without `@` has none: it is not
/// scanned (most lines of a memory file; [`mentions_scanned`] reads it character by character).
fn mentions_outside_code_spans(line: &str) -> Vec<String> {
    if memchr::memchr(b'@', line.as_bytes()).is_none() {
        return Vec::new();
    }
    mentions_scanned(line)
}

/// [`mentions_outside_code_spans`] of any line, scanned.
fn mentions_scanned(line: &str) -> Vec<String> {
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut prev_ws = true;
    while i < chars.len() {
        let c = chars[i];
        if c == '`' {
            let run = chars[i..].iter().take_while(|&&x| x == '`').count();
            // Find a closing run of the same length.
            let mut j = i + run;
            let mut closed = None;
            while j < chars.len() {
                if chars[j] == '`' {
                    let r = chars[j..].iter().take_while(|&&x| x == '`').count();
                    if r == run {
                        closed = Some(j + r);
                        break;
                    }
                    j += r;
                } else {
                    j += 1;
                }
            }
            match closed {
                Some(end) => {
                    i = end;
                    prev_ws = false;
                    continue;
                }
                None => {
                    i += run;
                    prev_ws = false;
                    continue;
                }
            }
        }
        if c == '@' && prev_ws {
            let mut j = i + 1;
            let mut token = String::new();
            while j < chars.len() {
                if chars[j] == '\\' && chars.get(j + 1) == Some(&' ') {
                    token.push(' ');
                    j += 2;
                } else if chars[j].is_whitespace() || chars[j] == '\\' {
                    break;
                } else {
                    token.push(chars[j]);
                    j += 1;
                }
            }
            if !token.is_empty() {
                out.push(token);
            }
            i = j;
            prev_ws = false;
            continue;
        }
        prev_ws = c.is_whitespace();
        i += 1;
    }
    out
}

fn resolve_include(raw: &str, dir: &str) -> Option<String> {
    let path = raw.split('#').next().unwrap_or("");
    if path.is_empty() {
        return None;
    }
    let resolved = if let Some(rest) = path.strip_prefix("~/") {
        format!("/home/user/{rest}")
    } else if path.starts_with('/') {
        if path == "/" {
            return None;
        }
        path.to_owned()
    } else {
        let first = path.chars().next()?;
        let ok = path.starts_with("./") || first.is_ascii_alphanumeric() || matches!(first, '.' | '_' | '-');
        if !ok {
            return None;
        }
        join(dir, path)
    };
    normalize_path(&resolved).ok()
}

fn truncate_entrypoint(text: &str) -> String {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut out = if lines.len() > AUTO_MEMORY_MAX_LINES { lines[..AUTO_MEMORY_MAX_LINES].join("\n") } else { text.to_owned() };
    let mut truncated = lines.len() > AUTO_MEMORY_MAX_LINES;
    if out.encode_utf16().count() > AUTO_MEMORY_MAX_CHARS {
        let cut: String = out.chars().scan(0usize, |n, c| { *n += c.len_utf16(); (*n <= AUTO_MEMORY_MAX_CHARS).then_some(c) }).collect();
        out = match cut.rfind('\n') { Some(i) => cut[..i].to_owned(), None => cut };
        truncated = true;
    }
    if truncated {
        out.push_str("\n\n> This memory index was cut to its size limit; keep it short and move details into topic files.");
    }
    out
}

/// Every directory from the outermost below `/` down to `cwd` (root excluded).
pub fn ancestors_outermost_first(cwd: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for part in cwd.split('/').filter(|p| !p.is_empty()) {
        current = format!("{current}/{part}");
        out.push(current.clone());
    }
    out
}

fn join(dir: &str, rel: &str) -> String {
    if dir == "/" { format!("/{rel}") } else { format!("{}/{rel}", dir.trim_end_matches('/')) }
}

fn parent(path: &str) -> String {
    match path.rfind('/') {
        Some(0) | None => "/".to_owned(),
        Some(i) => path[..i].to_owned(),
    }
}

/// `path` relative to `base` when inside it (`""` for equal), else `None`.
pub fn relative_to(path: &str, base: &str) -> Option<String> {
    let base = base.trim_end_matches('/');
    if path == base {
        return Some(String::new());
    }
    if base.is_empty() {
        return Some(path.trim_start_matches('/').to_owned());
    }
    path.strip_prefix(base).and_then(|rest| rest.strip_prefix('/')).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A line's mentions are the scan's, whether or not it is scanned.
        #[test]
        fn a_line_without_an_at_sign_is_not_scanned_and_mentions_what_the_scan_finds(
            parts in prop::collection::vec(prop::sample::select(vec!["@", "`", "``", " ", "\t", "\\", "\\ ", "a", "b.md", "é", "@x", "./y", "#f"]), 0..12),
        ) {
            let line = parts.concat();
            prop_assert_eq!(mentions_outside_code_spans(&line), mentions_scanned(&line));
        }
    }
}
