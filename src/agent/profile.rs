//! Size profiles: the measured character lengths of the reference client's prompt pieces.
//!
//! ctxsim never sends the reference client's words. It writes its own instructions and pads each
//! piece with neutral filler to the length the reference measured, so that token counts, block
//! sizes and therefore cache arithmetic match the real client. A profile is a data table
//! (`data/profile-<version>.toml`); padding can be switched off to see the raw text.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The embedded profile of Claude Code 2.1.88.
const PROFILE_2_1_88: &str = include_str!("../../data/profile-2.1.88.toml");

/// Measured lengths (characters, i.e. UTF-16 units of BMP text) of sections, fragments and tools.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SizeProfile {
    pub version: String,
    /// Whole sections (or their input-independent part, for names ending in `_fixed`).
    pub sections: BTreeMap<String, usize>,
    /// Pieces inside sections: identity lines, guidance bullets, fixed environment lines, wrappers.
    pub fragments: BTreeMap<String, usize>,
    /// Per built-in tool: description length and compact `input_schema` JSON length.
    pub tools: BTreeMap<String, ToolSize>,
    /// o200k token targets from the version's capture (`data/profiles/<version>.toml`); empty
    /// (characters only) for a profile read with [`SizeProfile::from_toml`].
    #[serde(skip)]
    pub tokens: TokenTargets,
    /// The built-in tools built under this profile ([`BuiltTools`]).
    #[serde(skip)]
    pub(crate) built_tools: BuiltTools,
}

/// The built-in tools built under a profile, by name and padding
/// ([`crate::agent::tools::builtin_tool`]): building one pads its description to the profile's
/// token count (a tokenizer run), and every session of a process (each what-if of each recorded
/// session) builds the same ones from the one shared profile. A memo, not part of the profile's
/// value: profiles compare equal whatever their memos hold, and a copy starts empty (a copy may
/// be changed; debug builds build every tool found here again and compare).
#[derive(Default)]
pub(crate) struct BuiltTools(std::sync::Mutex<std::collections::HashMap<(String, bool), Option<crate::agent::tools::BuiltinTool>>>);

impl BuiltTools {
    /// The tool `name` built with `padding`, by `build` the first time.
    pub(crate) fn get_or_build(&self, name: &str, padding: bool, build: impl FnOnce() -> Option<crate::agent::tools::BuiltinTool>) -> Option<crate::agent::tools::BuiltinTool> {
        let key = (name.to_owned(), padding);
        if let Some(built) = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key) {
            debug_assert_eq!(*built, build(), "memoized built-in tool {name}");
            return built.clone();
        }
        // (Built outside the lock: two threads may build the same tool, which is the same.)
        let built = build();
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, built.clone());
        built
    }
}

impl Clone for BuiltTools {
    fn clone(&self) -> BuiltTools {
        BuiltTools::default()
    }
}

impl PartialEq for BuiltTools {
    fn eq(&self, _: &BuiltTools) -> bool {
        true
    }
}

impl Eq for BuiltTools {}

impl std::fmt::Debug for BuiltTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BuiltTools")
    }
}

/// A token density as captured: `tokens` o200k tokens over `chars` characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Density {
    pub tokens: u64,
    pub chars: usize,
}

impl Density {
    /// The tokens `chars` characters hold at this density (0 when nothing was captured, which
    /// [`pad_to_size`] reads as characters only).
    pub fn of(self, chars: usize) -> u64 {
        if self.chars == 0 { 0 } else { (chars as u64 * self.tokens + self.chars as u64 / 2) / self.chars as u64 }
    }
}

/// What the capture of the real client measured in tokens, for padding to tokens as well as
/// characters: the static and the dynamic system block (each section of ours is padded to its
/// share at the block's density), and each tool as sent.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenTargets {
    pub static_block: Density,
    pub dynamic_block: Density,
    /// A tool's whole definition as sent (compact JSON), by name.
    pub tools: BTreeMap<String, u64>,
    /// All captured tools together: the density for a tool the capture did not see.
    pub all_tools: Density,
}

impl TokenTargets {
    /// The targets of the 2.1.88 capture: `system[2]` is the static block (the global marker),
    /// `system[3]` the dynamic one.
    fn from_capture(profile: &crate::client_profile::VersionProfile) -> TokenTargets {
        let density = |path: &str| profile.system.iter().find(|b| b.path == path).map_or_else(Density::default, |b| Density { tokens: b.size.o200k, chars: b.size.chars });
        let tools: BTreeMap<String, u64> = profile.tools.iter().map(|t| (t.name.clone(), t.size.o200k)).collect();
        let all_tools = Density { tokens: profile.tools.iter().map(|t| t.size.o200k).sum(), chars: profile.tools.iter().map(|t| t.size.chars).sum() };
        TokenTargets { static_block: density("system[2]"), dynamic_block: density("system[3]"), tools, all_tools }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct ToolSize {
    pub description: usize,
    pub schema: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("failed to parse size profile: {0}")]
    Parse(#[from] toml::de::Error),
}

impl SizeProfile {
    /// The profile of the reference build (2.1.88).
    pub fn claude_code_2_1_88() -> SizeProfile {
        SizeProfile::clone(&SizeProfile::claude_code_2_1_88_shared())
    }

    /// [`SizeProfile::claude_code_2_1_88`], one allocation for the process: the sessions that
    /// hold it compare it with what they built from by pointer ([`SizeProfile::same`]).
    pub fn claude_code_2_1_88_shared() -> std::sync::Arc<SizeProfile> {
        // The embedded table is part of the crate; failing to parse it is a build defect. It is
        // parsed once per process (replays ask for it at every call).
        static PARSED: std::sync::OnceLock<std::sync::Arc<SizeProfile>> = std::sync::OnceLock::new();
        PARSED
            .get_or_init(|| {
                let mut profile = SizeProfile::from_toml(PROFILE_2_1_88).expect("embedded profile-2.1.88.toml parses");
                if let Some((capture, _)) = crate::client_profile::shipped("2.1.88") {
                    profile.tokens = TokenTargets::from_capture(&capture);
                }
                std::sync::Arc::new(profile)
            })
            .clone()
    }

    /// Whether two shared profiles are equal: the same allocation without a look, else
    /// compared.
    pub fn same(a: &std::sync::Arc<SizeProfile>, b: &std::sync::Arc<SizeProfile>) -> bool {
        crate::shared::same(a, b)
    }

    pub fn from_toml(text: &str) -> Result<SizeProfile, ProfileError> {
        Ok(toml::from_str(text)?)
    }

    /// A section target. Panics on an unknown name: the names are fixed by the code that asks.
    pub fn section(&self, name: &str) -> usize {
        *self.sections.get(name).unwrap_or_else(|| panic!("size profile has no section {name:?}"))
    }

    pub fn fragment(&self, name: &str) -> usize {
        *self.fragments.get(name).unwrap_or_else(|| panic!("size profile has no fragment {name:?}"))
    }

    pub fn tool(&self, name: &str) -> Option<ToolSize> {
        self.tools.get(name).copied()
    }
}

/// Length as the reference measures it: JS string length (UTF-16 code units).
pub fn js_len(text: &str) -> usize {
    crate::measure::tokens::utf16_len(text)
}

/// How filler is laid out: on the same line (for one-line pieces such as a bullet) or as extra
/// paragraphs (for whole sections and tool descriptions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FillLayout {
    Line,
    Paragraphs,
}

/// Neutral guidance sentences used as filler. They are generic, true of any coding task and
/// harmless to the model, so a padded prompt stays a sensible prompt. ASCII only and free of
/// quotes and backslashes, so their JSON-escaped length equals their length.
const FILLER: &[&str] = &[
    "Prefer small, reviewable steps over large sweeping changes.",
    "Read the relevant code before deciding how to change it.",
    "Keep the user informed about what was done and what remains.",
    "When a result is surprising, check the assumption that produced it.",
    "Match the conventions already present in the surrounding code.",
    "State uncertainty plainly instead of guessing at facts.",
    "Verify a change by running the narrowest check that covers it.",
    "Leave unrelated code untouched unless the user asks otherwise.",
    "Choose clear names and simple control flow over clever tricks.",
    "Report failures honestly, including the exact error text.",
    "Ask for clarification only when the request is truly ambiguous.",
    "Favor the standard tools of the project over ad hoc scripts.",
    "Keep secrets and credentials out of files, logs and messages.",
    "Summarize long outputs rather than repeating them in full.",
    "Work from the most specific evidence available to you.",
    "Undo partial work that would leave the project in a broken state.",
];

/// Pads `base` with filler to exactly `target` characters (UTF-16 units). Text already at or over
/// the target is returned unchanged: the raw text is never cut, so an over-long raw text shows up
/// as a size mismatch in the tests rather than as silently lost words.
///
/// `seed` picks where in the filler cycle to start, so different pieces do not all open with the
/// same sentence; it is derived from the piece's stable name, never from anything random.
pub fn pad_to(base: &str, target: usize, layout: FillLayout, seed: &str) -> String {
    pad_with(base, target, layout, seed, FILLER)
}

/// Filler that tokenizes densely (identifiers, paths, flags, punctuation): about twice the
/// tokens per character of [`FILLER`]. Mixed with it by [`pad_to_size`] to reach a token count
/// as well as a length. ASCII, free of quotes and backslashes; our own generic examples.
const DENSE_FILLER: &[&str] = &[
    "Paths: src/main.rs, src/lib.rs, tests/it/*.rs; run cargo test --locked -q.",
    "Flags: -p, --print, --json, --max-turns=3, --cwd=./app; exit 0/1/2.",
    "Keys: tool_use_id, is_error, cache_control, max_tokens, stop_reason.",
    "Types: Vec<String>, Option<u64>, Result<(), Error>, Map<K, V>.",
    "Globs: **/*.ts, src/**/*.py, !node_modules/**, *.{json,yaml,toml}.",
    "Units: 5m, 1h, 200k, 1M, 0.1x, 1.25x, 2x; ids: toolu_01, msg_02.",
    "Calls: fs.readFile(p), git diff --stat HEAD~1, npm run lint -- --fix.",
    "Fields: {id, name, input}, [a, b, c], (x, y) => x + y; i += 1.",
];

/// Pads `base` to exactly `chars` characters (as [`pad_to`]) and, as closely as the filler
/// allows, to `tokens` o200k tokens: the padding is neutral filler followed by dense filler, the
/// split chosen by bisection on the token count. `tokens` of 0 means characters only. Results
/// are memoized per (text, targets, seed): request building asks for the same pieces every call.
pub fn pad_to_size(base: &str, chars: usize, tokens: u64, seed: &str) -> String {
    pad_to_size_as(base, chars, tokens, seed, false)
}

/// [`pad_to_size`] for a text sent as a JSON string (a tool description): the tokens counted
/// are those of the escaped string (a paragraph break is `\n\n` there), as the request holds it.
pub fn pad_to_size_escaped(base: &str, chars: usize, tokens: u64, seed: &str) -> String {
    pad_to_size_as(base, chars, tokens, seed, true)
}

fn pad_to_size_as(base: &str, chars: usize, tokens: u64, seed: &str, escaped: bool) -> String {
    use std::collections::HashMap;
    use std::sync::Mutex;
    type Memo = Mutex<HashMap<(u64, usize, u64, bool), String>>;
    static MEMO: std::sync::OnceLock<Memo> = std::sync::OnceLock::new();
    let key = (xxhash_rust::xxh3::xxh3_64(format!("{seed}\u{0}{base}").as_bytes()), chars, tokens, escaped);
    let memo = MEMO.get_or_init(Default::default);
    if let Some(hit) = memo.lock().expect("memo lock").get(&key) {
        return hit.clone();
    }
    let base_len = js_len(base);
    let build = |dense: usize| {
        let light = pad_with(base, chars.saturating_sub(dense).max(base_len), FillLayout::Paragraphs, seed, FILLER);
        pad_with(&light, chars, FillLayout::Paragraphs, seed, DENSE_FILLER)
    };
    // The texts tried are `base` and the same filler sentences cut at other places. Escaped, a
    // text is `base` escaped once and the filler after it (ASCII without quotes or backslashes:
    // only its line breaks are escaped). It is counted as the sum of its sentences' counts, each
    // sentence counted once ([`sentences`]). Debug builds escape and count the whole text too
    // and compare.
    let escaped_base = escaped.then(|| {
        let mut quoted = serde_json::to_string(base).expect("strings serialize");
        quoted.pop();
        quoted
    });
    let counted: std::cell::RefCell<rustc_hash::FxHashMap<String, u64>> = Default::default();
    let count = |text: &str| {
        let text = match (&escaped_base, text.strip_prefix(base)) {
            (Some(quoted), Some(filler)) => {
                let mut json = String::with_capacity(quoted.len() + filler.len() + filler.len() / 8 + 1);
                json.push_str(quoted);
                for (i, line) in filler.split('\n').enumerate() {
                    if i > 0 {
                        json.push_str("\\n");
                    }
                    json.push_str(line);
                }
                json.push('"');
                debug_assert_eq!(json, serde_json::to_string(text).expect("strings serialize"), "a padded text escaped by parts");
                std::borrow::Cow::Owned(json)
            }
            (Some(_), None) => std::borrow::Cow::Owned(serde_json::to_string(text).expect("strings serialize")),
            (None, _) => std::borrow::Cow::Borrowed(text),
        };
        let mut counted = counted.borrow_mut();
        let total = sentences(&text)
            .map(|sentence| match counted.get(sentence) {
                Some(&n) => n,
                None => {
                    let n = u64::from(crate::measure::tokens::bpe(sentence));
                    counted.insert(sentence.to_owned(), n);
                    n
                }
            })
            .sum::<u64>();
        debug_assert_eq!(total, u64::from(crate::measure::tokens::bpe(&text)), "the sentences' counts of a padded text");
        total
    };
    let room = chars.saturating_sub(base_len);
    let mut best = build(0);
    if tokens > 0 && room > 0 && count(&best) < tokens {
        // More dense filler, more tokens (monotone up to the filler's granularity).
        let (mut lo, mut hi) = (0usize, room);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if count(&build(mid)) < tokens { lo = mid + 1 } else { hi = mid }
        }
        let candidates = [lo.saturating_sub(1), lo];
        best = candidates.iter().map(|&d| build(d)).min_by_key(|t| count(t).abs_diff(tokens)).expect("two candidates");
    }
    memo.lock().expect("memo lock").insert(key, best.clone());
    best
}

/// `text` cut into parts whose o200k counts add up to the text's: before each space that
/// follows a period and precedes a capital letter (`. T`), where the split always has a
/// boundary. No piece of the split holds a character and a space after it (a piece holds a
/// space only as its first character, or holds whitespace alone), and no piece's end depends
/// on what follows a period when a space does; so the pieces of the text are those of its parts.
fn sentences(text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut cuts = memchr::memmem::find_iter(bytes, b". ").map(|at| at + 1).filter(|&at| bytes.get(at + 1).is_some_and(u8::is_ascii_uppercase));
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= text.len() {
            return None;
        }
        let end = cuts.next().unwrap_or(text.len());
        // (A cut is at an ASCII space: a character boundary.)
        let part = &text[start..end];
        start = end;
        Some(part)
    })
}

/// [`pad_to`] with a given set of filler sentences.
fn pad_with(base: &str, target: usize, layout: FillLayout, seed: &str, filler: &[&str]) -> String {
    let mut len = js_len(base);
    if len >= target {
        return base.to_owned();
    }
    // (Filler is ASCII: the text's bytes grow by its length.)
    let mut out = String::with_capacity(base.len() + target - len);
    out.push_str(base);
    let start = (xxhash_rust::xxh3::xxh3_64(seed.as_bytes()) % filler.len() as u64) as usize;
    let mut index = 0usize;
    loop {
        let sentence = filler[(start + index) % filler.len()];
        // Paragraph layout starts a new paragraph every four sentences and before the first one.
        let separator = match layout {
            FillLayout::Line => " ",
            FillLayout::Paragraphs if index.is_multiple_of(4) => "\n\n",
            FillLayout::Paragraphs => " ",
        };
        // No separator at the very start, nor after text that already ends in whitespace (the
        // environment intro line ends in a space, for instance).
        let separator = if out.is_empty() || out.ends_with(char::is_whitespace) { "" } else { separator };
        let piece_len = separator.len() + sentence.len();
        if len + piece_len <= target {
            out.push_str(separator);
            out.push_str(sentence);
            len += piece_len;
            index += 1;
            if len == target {
                return out;
            }
            continue;
        }
        // The last piece does not fit whole: close with a shortened sentence (or bare spaces
        // when only one or two characters remain) so the length is exact.
        let remaining = target - len;
        if remaining <= separator.len() + 1 {
            out.push_str(&" ".repeat(remaining));
        } else {
            let room = remaining - separator.len() - 1;
            let cut = sentence[..room].trim_end();
            out.push_str(separator);
            out.push_str(cut);
            out.push_str(&".".repeat(room - cut.len() + 1));
        }
        return out;
    }
}

/// [`pad_to_size`] when `enabled`, else the raw text.
pub fn fit_size(base: &str, chars: usize, tokens: u64, seed: &str, enabled: bool) -> String {
    if enabled { pad_to_size(base, chars, tokens, seed) } else { base.to_owned() }
}

/// Pads when `enabled`, else returns the raw text: the one switch for "padding off".
pub fn fit(base: &str, target: usize, layout: FillLayout, seed: &str, enabled: bool) -> String {
    if enabled { pad_to(base, target, layout, seed) } else { base.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_text_counts_as_its_sentences(text in "([A-Za-z]{1,6}[ .,:/\\n\"é→-]{0,3}){0,40}") {
            let sum: u32 = sentences(&text).map(crate::measure::tokens::bpe).sum();
            prop_assert_eq!(sentences(&text).collect::<String>(), text.clone());
            prop_assert_eq!(sum, crate::measure::tokens::bpe(&text));
            let escaped = serde_json::to_string(&text).expect("strings serialize");
            prop_assert_eq!(sentences(&escaped).map(crate::measure::tokens::bpe).sum::<u32>(), crate::measure::tokens::bpe(&escaped));
        }
    }

    #[test]
    fn padding_counted_by_sentences_keeps_its_length_and_base() {
        // The tool descriptions and sections pad by the counts of their sentences; the whole
        // texts' counts are compared in debug builds (`pad_to_size_as`).
        let base = "Runs a command. Output is returned as text.\n\nUse it for builds: cargo test, npm run lint.";
        for (chars, tokens) in [(400, 90), (900, 260), (2_000, 400), (120, 0)] {
            for escaped in [false, true] {
                let padded = pad_to_size_as(base, chars, tokens, "seed", escaped);
                assert_eq!(js_len(&padded), chars);
                assert!(padded.starts_with(base));
            }
        }
    }
}
