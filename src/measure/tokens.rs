//! Token estimators and the per-run memo of block counts.
//!
//! Claude's tokenizer is not public, so every count here is an estimate:
//!
//! - `chars4` is the rule Claude Code itself uses for its thresholds
//!   (`roughTokenCountEstimation`): `round(length / 4)` where `length` is the JavaScript string
//!   length (UTF-16 code units), rounded half up. Per block kind (see `blocks::token_units`):
//!   text → its text; image and document → 2,000 flat; tool_result → the sum over its content
//!   (a string, or each inner block by these rules); tool_use → `name + JSON(input)`; thinking →
//!   the thinking text; redacted_thinking → its data; any other block → its JSON. Tool
//!   definitions (which the reference never estimates) count as their JSON; system blocks as
//!   their text.
//! - `bpe` tokenizes the same strings with tiktoken-rs `o200k_base` (the encoder is built once
//!   per process), closer per block than chars/4 on code. The count is tiktoken-rs's exactly,
//!   reached by a faster split ([`super::o200k`]).
//! - `calibrated` is `bpe` scaled per model family plus a per-block overhead, with parameters
//!   from a data file (`data/calibration.json`, replaced by `--calibration FILE`).
//!
//! Counts are memoized by content hash: a block is tokenized once per run.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use std::path::Path;
use std::sync::Arc;

use super::token_cache::SharedCounts;

const SHIPPED_CALIBRATION: &str = include_str!("../../data/calibration.json");

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EstimatorKind {
    Chars4,
    Bpe,
    Calibrated,
}

impl EstimatorKind {
    pub const ALL: [EstimatorKind; 3] = [EstimatorKind::Chars4, EstimatorKind::Bpe, EstimatorKind::Calibrated];

    pub fn name(self) -> &'static str {
        match self {
            EstimatorKind::Chars4 => "chars4",
            EstimatorKind::Bpe => "bpe",
            EstimatorKind::Calibrated => "calibrated",
        }
    }

    pub fn parse(name: &str) -> Option<EstimatorKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// One piece of a block's token count: a string to estimate (borrowed from the block where it
/// is one of its texts, so a count asks for no copy), or a flat count.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenUnit<'a> {
    Text(std::borrow::Cow<'a, str>),
    Fixed(u32),
}

impl TokenUnit<'_> {
    /// The same unit owning its text.
    pub fn into_owned(self) -> TokenUnit<'static> {
        match self {
            TokenUnit::Text(text) => TokenUnit::Text(std::borrow::Cow::Owned(text.into_owned())),
            TokenUnit::Fixed(n) => TokenUnit::Fixed(n),
        }
    }
}

/// Per-family parameters of the calibrated estimator:
/// `tokens = round(bpe × scale) + per_block` for each block.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FamilyCalibration {
    pub scale: f64,
    pub per_block: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// Where the parameters came from (for reports).
    pub source: String,
    pub default: FamilyCalibration,
    #[serde(default)]
    pub families: BTreeMap<String, FamilyCalibration>,
    /// Not a tokenizer parameter but fitted with them (`fidelity --fit`): the tokens of the
    /// user context (CLAUDE.md files, date, reminders) that opens a real session, the median over
    /// the fitted sessions. A replay takes it where a transcript cannot show it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_context_tokens: Option<u64>,
    /// Also fitted with them: per Claude Code version, the tools + system prefix level the
    /// record of the fitted sessions showed (the median where several show one). A replay of a
    /// segment whose first call cannot show it takes it from here (nearest version).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prefix_tokens: BTreeMap<String, u64>,
    /// Per tokenizer generation other than the base one (`tokenizer` in the model table): the
    /// parameters fitted on the calls of its models, families pooled. A model of a generation
    /// with no entry takes its family's parameters with the scale times
    /// [`UNFITTED_GENERATION_RATIO`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub generations: BTreeMap<String, FamilyCalibration>,
    /// Per Claude Code version, the user context (CLAUDE.md, hooks' context, listings) a
    /// session of it opened with, the median over the fitted sessions that show it; a version
    /// without one takes the nearest earlier version's, else [`Self::user_context_tokens`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub user_context_by_version: BTreeMap<String, u64>,
    /// Per Claude Code version, thinking tokens per token of `output − visible` in replies
    /// whose thinking text was stored (fitted); a reply whose thinking text was not stored is
    /// filled to that share of its output beyond the visible part (nearest earlier version;
    /// 1 when none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub thinking_fill: BTreeMap<String, f64>,
    /// The sessions the parameters were fitted on (`fidelity --fit`), with their projects:
    /// a score on one of them is in-sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fitted_on: Vec<FittedSession>,
}

/// One session a calibration was fitted on: its file name and its project (the transcript's
/// directory).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FittedSession {
    pub session: String,
    pub project: String,
}

/// The scale of a newer tokenizer generation against its family's, where no fit gives one:
/// "about 30% more tokens" (reference/current-client-and-api.md §2).
pub const UNFITTED_GENERATION_RATIO: f64 = 1.30;

/// The scales a calibration may hold: a tokenizer differs from `bpe` by tens of percent, not by
/// orders of magnitude (1e300 once gave a $187k cost for a $0.39 log).
pub const SCALE_RANGE: std::ops::RangeInclusive<f64> = 0.1..=10.0;
/// The largest flat per-block correction a calibration may hold, in tokens.
pub const PER_BLOCK_LIMIT: f64 = 10_000.0;

#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error("failed to read calibration {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("failed to parse calibration {path}: {message}")]
    Parse { path: String, message: String },
    #[error("failed to read calibration: {0}")]
    Text(crate::input::TextError),
}

impl Calibration {
    pub fn shipped() -> Calibration {
        Self::parse(SHIPPED_CALIBRATION, "data/calibration.json").expect("the shipped calibration parses")
    }

    pub fn parse(text: &str, path: &str) -> Result<Calibration, CalibrationError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut de = serde_json::Deserializer::from_str(text);
        let calibration: Calibration = serde_path_to_error::deserialize(&mut de).map_err(|e| CalibrationError::Parse {
            path: path.to_owned(),
            message: format!("line {}: {}: {}", e.inner().line(), crate::input::json_path(e.path()), crate::input::cap_message(&e.inner().to_string())),
        })?;
        de.end().map_err(|e| CalibrationError::Parse {
            path: path.to_owned(),
            message: format!("line {}: {}", e.line(), crate::input::cap_message(&e.to_string())),
        })?;
        calibration.validate(path)?;
        Ok(calibration)
    }

    /// Range checks: every scale in [`SCALE_RANGE`], every `per_block` finite and within
    /// ±[`PER_BLOCK_LIMIT`] tokens; the message names the field.
    pub fn validate(&self, path: &str) -> Result<(), CalibrationError> {
        let families = std::iter::once(("default".to_owned(), &self.default))
            .chain(self.families.iter().map(|(k, v)| (format!("families.{k}"), v)))
            .chain(self.generations.iter().map(|(k, v)| (format!("generations.{k}"), v)));
        for (field, family) in families {
            let fail = |message: String| Err(CalibrationError::Parse { path: path.to_owned(), message });
            if !(family.scale.is_finite() && SCALE_RANGE.contains(&family.scale)) {
                return fail(format!("{field}.scale: {} is outside the sane range {}..={} (tokens per bpe token)", family.scale, SCALE_RANGE.start(), SCALE_RANGE.end()));
            }
            if !(family.per_block.is_finite() && family.per_block.abs() <= PER_BLOCK_LIMIT) {
                return fail(format!("{field}.per_block: {} is not a finite number of tokens within ±{PER_BLOCK_LIMIT}", family.per_block));
            }
        }
        Ok(())
    }

    /// Reads a calibration file: a byte-order mark is dropped; an empty file and invalid UTF-8
    /// (with its line and byte column) are errors.
    pub fn load(path: &Path) -> Result<Calibration, CalibrationError> {
        let text = crate::input::read_text(path).map_err(CalibrationError::Text)?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The parameters for an estimator key ([`super::ModelInfo::estimator_key`]): `family`, or
    /// `family/generation` for a model of a newer tokenizer generation, which takes the
    /// generation's fitted parameters, else its family's with the scale times
    /// [`UNFITTED_GENERATION_RATIO`].
    pub fn for_family(&self, key: &str) -> FamilyCalibration {
        if let Some(params) = self.families.get(key) {
            return *params;
        }
        match key.split_once('/') {
            Some((family, generation)) => self.generations.get(generation).copied().unwrap_or_else(|| {
                let base = self.families.get(family).copied().unwrap_or(self.default);
                FamilyCalibration { scale: base.scale * UNFITTED_GENERATION_RATIO, per_block: base.per_block }
            }),
            None => self.default,
        }
    }
}

/// JavaScript `Math.round(len / 4)` over UTF-16 code units.
pub fn chars4(text: &str) -> u32 {
    ((utf16_len(text) + 2) / 4) as u32
}

/// The length of `text` in UTF-16 code units, counted over its bytes without decoding (the
/// long-context chain counts whole histories several times per request): every character is
/// one unit except those of four UTF-8 bytes, which are two. Characters are the bytes that are
/// not continuation bytes (`0b10xx_xxxx`); four-byte characters are those whose lead byte is
/// at least `0xF0`.
pub fn utf16_len(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mut units = bytes.len();
    // Byte counters in chunks of 255 (a chunk cannot overflow them) vectorize well.
    for chunk in bytes.chunks(255) {
        let (mut continuation, mut four) = (0u8, 0u8);
        for &b in chunk {
            continuation += u8::from((b as i8) < -0x40);
            four += u8::from(b >= 0xF0);
        }
        units = units - usize::from(continuation) + usize::from(four);
    }
    units
}

/// A value [`json_utf16_len`] measures.
pub trait JsonUtf16Len {
    /// The [`utf16_len`] of the value's JSON text (`serde_json::to_string`).
    fn json_utf16_len(&self) -> usize;
}

/// The [`utf16_len`] of `value`'s JSON text (`serde_json::to_string`; 0 when it cannot be
/// serialized, as the empty text), without writing the text. The long-context chain counts
/// every tool call's input of a conversation this way.
pub fn json_utf16_len<T: JsonUtf16Len + ?Sized>(value: &T) -> usize {
    value.json_utf16_len()
}

/// A JSON value's text measured by walking it: what `serde_json` writes for each kind, a
/// string's escapes counted over its bytes ([`json_string_utf16_len`]). Debug builds
/// serialize it too and compare.
impl JsonUtf16Len for serde_json::Value {
    fn json_utf16_len(&self) -> usize {
        let units = value_text_len(self, json_string_utf16_len);
        debug_assert_eq!(units, serialized_utf16_len(self), "the JSON length walked differs from the serialized one: {self}");
        units
    }
}

/// A content block's JSON text, serialized (a block other than text, thinking, tool use or
/// result, or media: rare).
impl JsonUtf16Len for crate::api::ContentBlock {
    fn json_utf16_len(&self) -> usize {
        serialized_utf16_len(self)
    }
}

/// The length in bytes of `value`'s compact JSON text (`value.to_string().len()`), walked
/// as [`json_utf16_len`] walks it, without the text. Debug builds serialize it and compare.
pub fn json_len(value: &serde_json::Value) -> usize {
    let bytes = value_text_len(value, json_string_len);
    debug_assert_eq!(bytes, value.to_string().len(), "the JSON length in bytes walked differs from the serialized one: {value}");
    bytes
}

/// The length of `value`'s JSON text in the units `string` counts a string's JSON text in
/// (the rest of the text is ASCII, one unit a byte).
fn value_text_len(value: &serde_json::Value, string: fn(&str) -> usize) -> usize {
    use serde_json::Value;
    let value_len = |value: &Value| value_text_len(value, string);
    match value {
        Value::Null => 4,
        Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(number) => match (number.as_u64(), number.as_i64()) {
            (Some(n), _) => decimal_digits(n),
            (None, Some(n)) => 1 + decimal_digits(n.unsigned_abs()),
            // A float: written by `ryu`, rare enough to be written here.
            (None, None) => serialized_utf16_len(number),
        },
        Value::String(text) => string(text),
        // Brackets, and a comma between items.
        Value::Array(items) => 2 + items.len().saturating_sub(1) + items.iter().map(value_len).sum::<usize>(),
        // Braces, a comma between entries, a colon in each.
        Value::Object(map) => 2 + map.len().saturating_sub(1) + map.iter().map(|(key, value)| string(key) + 1 + value_len(value)).sum::<usize>(),
    }
}

/// Digits of `n` in decimal.
fn decimal_digits(mut n: u64) -> usize {
    let mut digits = 1;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    digits
}

/// Units a byte adds to its string's JSON text by being escaped, as `serde_json` escapes:
/// `"` and `\` and the control characters with a short escape (`\b \t \n \f \r`) one
/// (two characters for one), the other control characters five (`\u00XX`); DEL and every
/// other byte none.
const ESCAPE_EXTRA: [u8; 256] = {
    let mut extra = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        extra[b] = match b {
            0x08 | 0x09 | 0x0A | 0x0C | 0x0D => 1,
            _ => 5,
        };
        b += 1;
    }
    extra[b'"' as usize] = 1;
    extra[b'\\' as usize] = 1;
    extra
};

/// The UTF-16 length of `text` written as a JSON string: its quotes, its characters and
/// what escaping them adds.
pub fn json_string_utf16_len(text: &str) -> usize {
    let escapes: usize = text.bytes().map(|b| usize::from(ESCAPE_EXTRA[usize::from(b)])).sum();
    2 + utf16_len(text) + escapes
}

/// [`json_string_utf16_len`] in bytes.
fn json_string_len(text: &str) -> usize {
    let escapes: usize = text.bytes().map(|b| usize::from(ESCAPE_EXTRA[usize::from(b)])).sum();
    2 + text.len() + escapes
}

/// The [`utf16_len`] of `value`'s JSON text, counted as `serde_json` writes it, without the
/// text (0 when it cannot be serialized, as the empty text).
pub fn serialized_utf16_len(value: &(impl Serialize + ?Sized)) -> usize {
    /// Counts the UTF-16 units of the UTF-8 bytes written to it (whole characters in all).
    struct Units(usize);
    impl std::io::Write for Units {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            for &b in bytes {
                // A lead byte starts a unit, a four-byte lead two; continuation bytes none.
                self.0 += usize::from((b as i8) >= -0x40) + usize::from(b >= 0xF0);
            }
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut units = Units(0);
    match serde_json::to_writer(&mut units, value) {
        Ok(()) => units.0,
        Err(_) => 0,
    }
}

/// o200k_base token count of a string (special-token text counted as ordinary text).
/// Exactly tiktoken-rs's `encode_ordinary(text).len()`, split faster ([`super::o200k`]).
pub fn bpe(text: &str) -> u32 {
    super::o200k::count(text)
}

/// The raw counts a [`TokenCounter`] memoized, to start another counter from
/// ([`TokenCounter::seed`]).
#[derive(Debug, Clone)]
pub struct TokenMemo {
    /// The estimator the raw counts are of: `chars4` or `bpe` (`calibrated` memoizes `bpe`).
    raw: EstimatorKind,
    counts: FxHashMap<u128, u32>,
    /// The `bpe` counts by text ([`TokenCounter`]'s `texts`).
    texts: FxHashMap<u128, u32>,
}

fn raw_kind(kind: EstimatorKind) -> EstimatorKind {
    match kind {
        EstimatorKind::Chars4 => EstimatorKind::Chars4,
        EstimatorKind::Bpe | EstimatorKind::Calibrated => EstimatorKind::Bpe,
    }
}

/// Counts blocks with one estimator, memoizing by the block's content hash.
#[derive(Debug, Clone)]
pub struct TokenCounter {
    kind: EstimatorKind,
    calibration: Calibration,
    /// Keyed by content hash (already uniform: the fast hasher suffices).
    memo: FxHashMap<u128, u32>,
    /// `bpe` counts of texts by their xxh3: blocks that differ outside their texts (a
    /// tool_use's id) or hold a text another block held are not tokenized again.
    texts: FxHashMap<u128, u32>,
    /// Number of blocks actually tokenized (memo misses); the rest were memo hits.
    pub tokenized_blocks: u64,
    pub memo_hits: u64,
    /// The texts tokenized, in order, when asked for ([`TokenCounter::keep_tokenized_texts`]).
    kept_texts: Option<Vec<String>>,
    /// `bpe` text counts shared with the run's other counters and earlier runs
    /// ([`super::token_cache`]), consulted before tokenizing and given every count made.
    shared: Option<Arc<SharedCounts>>,
    /// The family [`TokenCounter::count`] estimated for last and its parameters: a run's blocks
    /// are nearly all of one family, whose parameters are otherwise looked up by name in the
    /// calibration's maps for every block (memo hits too). The calibration never changes.
    last_family: Option<(Box<str>, FamilyCalibration)>,
}

impl TokenCounter {
    pub fn new(kind: EstimatorKind) -> Self {
        Self::with_calibration(kind, Calibration::shipped())
    }

    pub fn with_calibration(kind: EstimatorKind, calibration: Calibration) -> Self {
        TokenCounter { kind, calibration, memo: FxHashMap::default(), texts: FxHashMap::default(), tokenized_blocks: 0, memo_hits: 0, kept_texts: None, shared: None, last_family: None }
    }

    /// Shares `bpe` text counts with `shared` (ignored by `chars4`): a text another counter of
    /// the run, or an earlier run through the cache file, counted is not tokenized again. The
    /// counts are the same either way.
    pub fn with_shared(mut self, shared: Arc<SharedCounts>) -> Self {
        if raw_kind(self.kind) == EstimatorKind::Bpe {
            self.shared = Some(shared);
        }
        self
    }

    /// A new counter (empty memo) of the same estimator and calibration, sharing this one's
    /// `bpe` text counts: for the extra measurers a replay makes (probe runs, sizing replays), so
    /// a text one of them counted is not tokenized again by the others.
    pub fn fresh_like(&self) -> TokenCounter {
        let counter = TokenCounter::with_calibration(self.kind, self.calibration.clone());
        match &self.shared {
            Some(shared) => counter.with_shared(shared.clone()),
            None => counter,
        }
    }

    pub fn kind(&self) -> EstimatorKind {
        self.kind
    }

    /// The run's shared `bpe` text counts ([`TokenCounter::with_shared`]), if any.
    pub fn shared(&self) -> Option<&Arc<SharedCounts>> {
        self.shared.as_ref()
    }

    pub fn calibration(&self) -> &Calibration {
        &self.calibration
    }

    /// The raw counts memoized so far.
    pub fn memo(&self) -> TokenMemo {
        TokenMemo { raw: raw_kind(self.kind), counts: self.memo.clone(), texts: self.texts.clone() }
    }

    /// Starts from the counts of `memo` (when it holds the same raw estimator's counts; returns
    /// whether it did). A count is a function of the block's content and the estimator alone, so
    /// seeding changes no result, only what is tokenized again: a sweep's points share the
    /// blocks of their inputs.
    pub fn seed(&mut self, memo: &TokenMemo) -> bool {
        if memo.raw != raw_kind(self.kind) {
            return false;
        }
        // Copied map to map: the order of the copy cannot show anywhere.
        self.memo.extend(memo.counts.iter().map(|(k, v)| (*k, *v)));
        self.texts.extend(memo.texts.iter().map(|(k, v)| (*k, *v)));
        true
    }

    /// Keeps a copy of every text tokenized from now on: the benches time tokenizing exactly
    /// these (each unique block once, the floor of any measurement).
    pub fn keep_tokenized_texts(&mut self) {
        self.kept_texts.get_or_insert_with(Vec::new);
    }

    /// The texts kept since [`TokenCounter::keep_tokenized_texts`] (empty when not asked for).
    pub fn tokenized_texts(&self) -> &[String] {
        self.kept_texts.as_deref().unwrap_or(&[])
    }

    /// The raw count of a block (chars4 or bpe; calibrated memoizes the bpe count), computed
    /// once per content hash. `units` is only called on a memo miss.
    fn raw_count<'a>(&mut self, key: u128, units: impl FnOnce() -> Vec<TokenUnit<'a>>) -> u32 {
        if let Some(&count) = self.memo.get(&key) {
            self.memo_hits += 1;
            return count;
        }
        // Another counter of the run counted the same block (a raw count is a function of
        // the content and the raw estimator alone; only `bpe` counters share a table).
        if let Some(count) = self.shared.as_ref().and_then(|s| s.block(key)) {
            #[cfg(debug_assertions)]
            {
                let kept = self.kept_texts.take();
                let made = self.units_count(units);
                self.kept_texts = kept;
                debug_assert_eq!(made, count, "a shared block count is the block's count");
            }
            self.memo_hits += 1;
            self.memo.insert(key, count);
            return count;
        }
        self.tokenized_blocks += 1;
        let count = self.units_count(units);
        if let Some(shared) = &self.shared {
            shared.insert_block(key, count);
        }
        self.memo.insert(key, count);
        count
    }

    /// The raw count of a block's units (texts looked up in the text counts first).
    fn units_count<'a>(&mut self, units: impl FnOnce() -> Vec<TokenUnit<'a>>) -> u32 {
        let mut count = 0;
        for unit in units() {
            count += match unit {
                TokenUnit::Fixed(n) => n,
                TokenUnit::Text(text) => {
                    let (n, tokenized) = match self.kind {
                        EstimatorKind::Chars4 => (chars4(&text), true),
                        EstimatorKind::Bpe | EstimatorKind::Calibrated => {
                            let key = xxhash_rust::xxh3::xxh3_128(text.as_bytes());
                            match self.texts.get(&key) {
                                Some(&n) => (n, false),
                                None => {
                                    let known = self.shared.as_ref().and_then(|s| s.get(key));
                                    let n = match known {
                                        Some(n) => n,
                                        None => {
                                            let n = super::o200k::count(&text);
                                            if let Some(shared) = &self.shared {
                                                shared.insert(key, n);
                                            }
                                            n
                                        }
                                    };
                                    self.texts.insert(key, n);
                                    (n, known.is_none())
                                }
                            }
                        }
                    };
                    if tokenized && let Some(kept) = &mut self.kept_texts {
                        kept.push(text.into_owned());
                    }
                    n
                }
            };
        }
        count
    }

    /// The estimated tokens of one block of a request to a model of `family`.
    pub fn count<'a>(&mut self, key: u128, family: &str, units: impl FnOnce() -> Vec<TokenUnit<'a>>) -> u32 {
        let raw = self.raw_count(key, units);
        match self.kind {
            EstimatorKind::Chars4 | EstimatorKind::Bpe => raw,
            EstimatorKind::Calibrated => {
                let params = match &self.last_family {
                    Some((last, params)) if **last == *family => *params,
                    _ => {
                        let params = self.calibration.for_family(family);
                        self.last_family = Some((family.into(), params));
                        params
                    }
                };
                #[cfg(debug_assertions)]
                {
                    let looked_up = self.calibration.for_family(family);
                    let bits = |p: FamilyCalibration| (p.scale.to_bits(), p.per_block.to_bits());
                    debug_assert_eq!(bits(params), bits(looked_up), "the last family's parameters are the family's");
                }
                ((raw as f64 * params.scale) + params.per_block).round().max(0.0) as u32
            }
        }
    }

    /// Estimate of a free-standing string (memoized in the shared counts only, when the
    /// counter has them).
    pub fn count_text(&self, text: &str, family: &str) -> u32 {
        match self.kind {
            EstimatorKind::Chars4 => chars4(text),
            EstimatorKind::Bpe => self.bpe_shared(text),
            EstimatorKind::Calibrated => {
                let params = self.calibration.for_family(family);
                (self.bpe_shared(text) as f64 * params.scale).round() as u32
            }
        }
    }

    /// [`Self::count_text`] (`Some`), or `None` where `past` holds for the estimate of a leading
    /// part of `text` ([`super::o200k::count_unless`]): `past` must hold for every count above
    /// one it holds for (a limit passed), so that `None` says it holds for the whole text's
    /// estimate, and the rest of a long text is not tokenized (a file's text against a restore's
    /// per-file limit). A whole count goes to the shared counts as [`Self::count_text`]'s does;
    /// one cut short is kept nowhere. Debug builds count the whole text and check `past` of it.
    pub fn count_text_unless(&self, text: &str, family: &str, past: &dyn Fn(u64) -> bool) -> Option<u32> {
        let scale = match self.kind {
            EstimatorKind::Chars4 => return Some(chars4(text)),
            EstimatorKind::Bpe => None,
            EstimatorKind::Calibrated => Some(self.calibration.for_family(family).scale),
        };
        // (`count_text`'s estimate of a raw count: never lower for a higher one, the scale
        // being at least 0; a negative or NaN scale is counted whole.)
        let estimate = |raw: u32| scale.map_or(raw, |scale| (raw as f64 * scale).round() as u32);
        if scale.is_some_and(|scale| scale.is_nan() || scale < 0.0) {
            return Some(self.count_text(text, family));
        }
        let key = self.shared.as_ref().map(|_| xxhash_rust::xxh3::xxh3_128(text.as_bytes()));
        let known = key.and_then(|key| self.texts.get(&key).copied().or_else(|| self.shared.as_ref()?.get(key)));
        if let Some(raw) = known {
            return Some(estimate(raw));
        }
        match super::o200k::count_unless(text, &|raw| past(u64::from(estimate(raw)))) {
            Ok(raw) => {
                if let (Some(shared), Some(key)) = (&self.shared, key) {
                    shared.insert(key, raw);
                }
                Some(estimate(raw))
            }
            Err(_) => {
                debug_assert!(past(u64::from(estimate(bpe(text)))), "a text cut short at a count its whole count does not pass");
                None
            }
        }
    }

    /// `bpe(text)`, looked up in this counter's and the shared counts first.
    fn bpe_shared(&self, text: &str) -> u32 {
        let Some(shared) = &self.shared else { return bpe(text) };
        let key = xxhash_rust::xxh3::xxh3_128(text.as_bytes());
        self.texts.get(&key).copied().unwrap_or_else(|| shared.bpe(key, text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A count cut short answers the limit as the whole estimate does, under every estimator,
    /// a scale above and below 1, and with shared counts (which get whole counts only).
    #[test]
    fn a_text_count_cut_short_at_a_limit_answers_as_the_whole_count() {
        let text: String = (0..2500).map(|i| format!("    let v{i} = read(\"/src/file_{i}.rs\")?; // line {i}\n")).collect();
        let short = "fn main() { println!(\"hi\"); }\n";
        for scale in [0.8, 1.0, 1.37] {
            let mut calibration = Calibration::shipped();
            calibration.families.insert("test".into(), FamilyCalibration { scale, per_block: 3.0 });
            for kind in [EstimatorKind::Chars4, EstimatorKind::Bpe, EstimatorKind::Calibrated] {
                let shared = Arc::new(SharedCounts::default());
                for counter in [TokenCounter::with_calibration(kind, calibration.clone()), TokenCounter::with_calibration(kind, calibration.clone()).with_shared(shared.clone())] {
                    for text in [text.as_str(), short] {
                        let whole = counter.count_text(text, "test");
                        for limit in [0, 5, 5_000, u64::from(whole).saturating_sub(1), u64::from(whole), 1_000_000] {
                            match counter.count_text_unless(text, "test", &|n| n > limit) {
                                Some(n) => assert_eq!(n, whole, "{kind:?} {scale}"),
                                None => assert!(u64::from(whole) > limit && kind != EstimatorKind::Chars4, "{kind:?} {scale}: {whole} under {limit}"),
                            }
                        }
                    }
                }
                if kind != EstimatorKind::Chars4 {
                    // Only the whole counts were shared: the long text's was, by `count_text`.
                    assert_eq!(shared.get(xxhash_rust::xxh3::xxh3_128(text.as_bytes())), Some(bpe(&text)));
                }
            }
        }
        // Cut short where the count passes early: a 5,000-token limit on a text far past it.
        let counter = TokenCounter::new(EstimatorKind::Bpe);
        assert!(bpe(&text) > 20_000);
        assert_eq!(counter.count_text_unless(&text, "test", &|n| n > 5_000), None);
    }

    #[test]
    fn chars4_rounds_half_up_over_utf16_units() {
        assert_eq!(chars4(""), 0);
        assert_eq!(chars4("a"), 0);
        assert_eq!(chars4("ab"), 1);
        assert_eq!(chars4("abcdef"), 2);
        // U+1F600 is two UTF-16 code units, as JavaScript counts it.
        assert_eq!(chars4("\u{1F600}"), 1);
    }

    #[test]
    fn json_utf16_length_is_the_length_of_the_json_text() {
        let values = [
            serde_json::json!({"file_path": "/tmp/a.rs", "n": 3, "nested": [1, "two", {"é": "日本\u{1F600}\n\"q\""}], "null": null}),
            serde_json::json!("\u{0}\u{1f}\u{7f}\\ tab\t"),
            serde_json::json!([]),
            serde_json::json!(1.5e300),
            serde_json::json!([i64::MIN, u64::MAX, 0, -1, 10, -0.0, 0.1, null, true, false]),
        ];
        for value in values {
            assert_eq!(json_utf16_len(&value), utf16_len(&serde_json::to_string(&value).unwrap()), "{value}");
        }
    }

    /// Texts with every kind of character a JSON string escapes (or not) among any others.
    fn any_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let special = prop::sample::select(vec!['"', '\\', '\n', '\r', '\t', '\u{8}', '\u{c}', '\u{0}', '\u{1f}', '\u{7f}', '/', 'é', '日', '\u{1F600}']);
        prop::collection::vec(prop_oneof![any::<char>(), special], 0..12).prop_map(String::from_iter)
    }

    fn any_json() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            // Not finite: null.
            any::<f64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            any_text().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::vec((any_text(), inner), 0..8).prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn the_walked_json_length_is_the_serialized_one(value in any_json()) {
            proptest::prop_assert_eq!(value_text_len(&value, json_string_utf16_len), utf16_len(&serde_json::to_string(&value).unwrap()), "{}", value);
            proptest::prop_assert_eq!(json_utf16_len(&value), serialized_utf16_len(&value));
            proptest::prop_assert_eq!(value_text_len(&value, json_string_len), value.to_string().len(), "{}", value);
            proptest::prop_assert_eq!(json_len(&value), value.to_string().len());
        }
    }

    #[test]
    fn utf16_length_from_bytes_is_the_decoded_length() {
        for text in ["", "ascii only", "café", "日本語のテキスト", "\u{1F600} emoji \u{1F680}", "mixed é 漢 \u{10FFFF} \u{7F} \u{80} \u{7FF} \u{800} \u{FFFF} \u{10000}"] {
            assert_eq!(utf16_len(text), text.chars().map(char::len_utf16).sum::<usize>(), "{text:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn utf16_length_of_any_text(text in ".*") {
            proptest::prop_assert_eq!(utf16_len(&text), text.chars().map(char::len_utf16).sum::<usize>());
        }
    }

    #[test]
    fn a_seeded_counter_counts_as_its_seed_did() {
        let mut bpe_counter = TokenCounter::new(EstimatorKind::Bpe);
        let n = bpe_counter.count(7, "sonnet", || vec![TokenUnit::Text("fn main() { println!(\"hi\"); }".into())]);
        let mut calibrated = TokenCounter::new(EstimatorKind::Calibrated);
        assert!(calibrated.seed(&bpe_counter.memo()));
        let seeded = calibrated.count(7, "sonnet", || panic!("a seeded count must not recompute"));
        let fresh = TokenCounter::new(EstimatorKind::Calibrated).count(7, "sonnet", || vec![TokenUnit::Text("fn main() { println!(\"hi\"); }".into())]);
        assert_eq!(seeded, fresh);
        assert!(n > 0);
        // chars4 counts are not bpe counts.
        assert!(!TokenCounter::new(EstimatorKind::Chars4).seed(&bpe_counter.memo()));
    }

    proptest::proptest! {
        /// Counters sharing a table count every block as a counter of their own would, in any
        /// order, and a block one of them counted is not counted again by another.
        #[test]
        fn counters_sharing_block_counts_count_as_alone(texts in proptest::collection::vec("[a-z ]{0,40}", 1..12), order in proptest::collection::vec(0usize..12, 1..24)) {
            let shared = Arc::new(SharedCounts::default());
            let mut first = TokenCounter::new(EstimatorKind::Calibrated).with_shared(shared.clone());
            let mut second = TokenCounter::new(EstimatorKind::Bpe).with_shared(shared.clone());
            let key = |i: usize| xxhash_rust::xxh3::xxh3_128(texts[i].as_bytes());
            for (n, &pick) in order.iter().enumerate() {
                let i = pick % texts.len();
                let alone = TokenCounter::new(EstimatorKind::Calibrated).count(key(i), "sonnet", || vec![TokenUnit::Text(texts[i].as_str().into())]);
                let counter = if n % 2 == 0 { &mut first } else { &mut second };
                let made = counter.count(key(i), "sonnet", || vec![TokenUnit::Text(texts[i].as_str().into())]);
                let raw = TokenCounter::new(EstimatorKind::Bpe).count(key(i), "sonnet", || vec![TokenUnit::Text(texts[i].as_str().into())]);
                proptest::prop_assert_eq!(made, if n % 2 == 0 { alone } else { raw });
                proptest::prop_assert_eq!(shared.block(key(i)), Some(raw));
            }
            proptest::prop_assert_eq!(first.tokenized_blocks + second.tokenized_blocks, order.iter().map(|&p| key(p % texts.len())).collect::<std::collections::BTreeSet<_>>().len() as u64);
        }
    }

    /// A calibrated counter that goes from one family to another and back estimates each block
    /// with the parameters of the family asked for (it keeps the last family's).
    #[test]
    fn a_calibrated_count_takes_the_family_asked_for() {
        let mut counter = TokenCounter::new(EstimatorKind::Calibrated);
        let raw = bpe("fn main() { println!(\"hi\"); }");
        let families = ["sonnet", "opus", "opus", "haiku", "sonnet", "opus/v2", "sonnet"];
        for (i, family) in families.into_iter().enumerate() {
            let params = counter.calibration().for_family(family);
            let expected = ((raw as f64 * params.scale) + params.per_block).round().max(0.0) as u32;
            let made = counter.count(i as u128 % 2, family, || vec![TokenUnit::Text("fn main() { println!(\"hi\"); }".into())]);
            assert_eq!(made, expected, "{family}");
        }
        let (sonnet, opus) = (counter.calibration().for_family("sonnet"), counter.calibration().for_family("opus"));
        assert!(sonnet.scale != opus.scale && sonnet.per_block != opus.per_block, "the families' parameters differ");
    }

    #[test]
    fn counts_are_memoized_by_key() {
        let mut counter = TokenCounter::new(EstimatorKind::Chars4);
        let a = counter.count(1, "sonnet", || vec![TokenUnit::Text("abcdefgh".into())]);
        let b = counter.count(1, "sonnet", || panic!("a memo hit must not recompute"));
        assert_eq!((a, b), (2, 2));
        assert_eq!((counter.tokenized_blocks, counter.memo_hits), (1, 1));
    }
}
