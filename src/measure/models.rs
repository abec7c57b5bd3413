//! The per-model data table: minimum cacheable length, prices, context window, max output.
//!
//! The shipped table is `data/models.toml`; `--model-table FILE` replaces it with a user's file
//! of the same shape. Lookup is by name fragment (longest match wins), so dated ids like
//! `claude-sonnet-4-5-20250929` and `[1m]` variants resolve to their family entry.

use serde::{Deserialize, Serialize};
use std::path::Path;

const SHIPPED: &str = include_str!("../../data/models.toml");

/// USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    pub cache_write_5m: f64,
    pub cache_write_1h: f64,
    pub cache_read: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInfo {
    pub id: String,
    #[serde(rename = "match")]
    pub fragments: Vec<String>,
    pub family: String,
    /// The tokenizer generation of the model ([`BASE_TOKENIZER`] unless the table says
    /// otherwise): Opus 4.7 and later, Fable, Mythos, Sonnet 5 and Haiku 5.5 use a newer
    /// tokenizer that makes the same text ~30% more tokens (reference/current-client-and-api.md
    /// §2). The calibrated estimator keys its parameters on family and generation
    /// ([`ModelInfo::estimator_key`]).
    #[serde(default = "base_tokenizer", skip_serializing_if = "is_base_tokenizer")]
    pub tokenizer: String,
    pub min_cacheable_tokens: u64,
    pub context_window: u64,
    pub max_output_tokens: u64,
    /// At a new user turn the API drops earlier turns' thinking from the context (not counted,
    /// the cached prefix still valid); Opus 4.5+ and Sonnet 4.6+ keep it.
    #[serde(default)]
    pub strips_prior_thinking: bool,
    /// Claude Code runs the model with a 200k window unless 1M is asked for (`[1m]`, or the
    /// `/model` picker's "1M context" entry); `context_window` is then the most it can have.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub window_1m_opt_in: bool,
    pub price: Price,
    /// Prices that replace `price` for a whole request once its prompt (input + cache reads +
    /// cache writes) exceeds `above_prompt_tokens`, output included (Haiku 5.5's tier). The
    /// highest tier exceeded applies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub price_tiers: Vec<PriceTier>,
    /// Where a value of this entry comes from, by field name (`min_cacheable_tokens`,
    /// `price`, ...), and what about it is uncertain: the table is data to be corrected.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub sources: std::collections::BTreeMap<String, String>,
}

/// A prompt-length price tier ([`ModelInfo::price_tiers`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceTier {
    pub above_prompt_tokens: u64,
    pub price: Price,
}

/// The tokenizer generation of Claude 3.x through Opus 4.6, Sonnet 4.6 and Haiku 4.5.
pub const BASE_TOKENIZER: &str = "v1";

fn base_tokenizer() -> String {
    BASE_TOKENIZER.to_owned()
}

fn is_base_tokenizer(generation: &String) -> bool {
    generation == BASE_TOKENIZER
}

impl ModelInfo {
    /// What the calibrated estimator looks its parameters up by
    /// ([`super::tokens::Calibration::for_family`]): the family for a model of the base
    /// tokenizer generation, `family/generation` otherwise.
    pub fn estimator_key(&self) -> String {
        if is_base_tokenizer(&self.tokenizer) { self.family.clone() } else { format!("{}/{}", self.family, self.tokenizer) }
    }

    /// The prices of a request whose prompt (input + cache read + cache write tokens) is
    /// `prompt_tokens` long.
    pub fn price_for(&self, prompt_tokens: u64) -> Price {
        self.price_tiers
            .iter()
            .filter(|tier| prompt_tokens > tier.above_prompt_tokens)
            .max_by_key(|tier| tier.above_prompt_tokens)
            .map_or(self.price, |tier| tier.price)
    }

    /// Cost in USD of one request's usage, at the tier its prompt length reaches.
    pub fn cost(&self, input: u64, output: u64, read: u64, write_5m: u64, write_1h: u64) -> f64 {
        self.price_for(input + read + write_5m + write_1h).cost(input, output, read, write_5m, write_1h)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelTable {
    #[serde(rename = "model")]
    pub models: Vec<ModelInfo>,
    /// Price changes a call's usage object asks for (fast mode, data residency, batch); used by
    /// the billed cost ([`super::billing`]).
    #[serde(default, rename = "price_modifier", skip_serializing_if = "Vec::is_empty")]
    pub price_modifiers: Vec<PriceModifier>,
    /// Long-context rates of the models that have them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub long_context: Vec<LongContext>,
}

/// A price multiplier applied when a string field of the usage object has a value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceModifier {
    pub id: String,
    /// The usage field (`speed`, `inference_geo`, `service_tier`).
    pub field: String,
    pub equals: String,
    /// Model ids of the table it applies to; empty: every model.
    #[serde(default)]
    pub models: Vec<String>,
    pub multiplier: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_suffix: Option<String>,
    pub source: String,
}

/// Higher rates for a whole request whose prompt passes a length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LongContext {
    pub models: Vec<String>,
    /// input + cache writes + cache reads above this: the request is billed at the higher rates.
    pub above_prompt_tokens: u64,
    /// Applies to input, cache writes and cache reads.
    pub input_multiplier: f64,
    pub output_multiplier: f64,
    pub source: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelTableError {
    #[error("failed to read model table {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("failed to parse model table {path}: {message}")]
    Parse { path: String, message: String },
    #[error("failed to read model table: {0}")]
    Text(crate::input::TextError),
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown model `{model}`; known models: {known}. Pass --model-table FILE to add it")]
pub struct UnknownModel {
    pub model: String,
    pub known: String,
}

impl ModelTable {
    /// The table shipped in `data/models.toml`.
    pub fn shipped() -> ModelTable {
        Self::parse(SHIPPED, "data/models.toml").expect("the shipped model table parses")
    }

    pub fn parse(text: &str, path: &str) -> Result<ModelTable, ModelTableError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let table: ModelTable = toml::from_str(text).map_err(|e| ModelTableError::Parse { path: path.to_owned(), message: crate::input::toml_message(&e, text) })?;
        table.validate(text, path)?;
        let named = table.price_modifiers.iter().map(|m| (format!("price_modifier `{}`", m.id), &m.models));
        let long = table.long_context.iter().map(|l| ("long_context".to_owned(), &l.models));
        for (what, models) in named.chain(long) {
            if let Some(unknown) = models.iter().find(|id| !table.models.iter().any(|m| &m.id == *id)) {
                return Err(ModelTableError::Parse {
                    path: path.to_owned(),
                    message: format!("{what}: models: `{unknown}` is not the id of a [[model]] entry"),
                });
            }
        }
        Ok(table)
    }

    /// Range checks: prices finite and ≥ 0, windows and max output above 0, match fragments
    /// not empty. The message names the file, the line of the entry and the field.
    fn validate(&self, text: &str, path: &str) -> Result<(), ModelTableError> {
        if self.models.is_empty() {
            return Err(ModelTableError::Parse { path: path.to_owned(), message: "no [[model]] entries".to_owned() });
        }
        // The line of each entry's `[[model]]` header, in order.
        let headers: Vec<usize> = text.lines().enumerate().filter(|(_, l)| l.trim_start().starts_with("[[model]]")).map(|(i, _)| i + 1).collect();
        for (i, m) in self.models.iter().enumerate() {
            let at = match headers.get(i) {
                Some(line) => format!("{path}:{line}: model[{i}] ({})", m.id),
                None => format!("{path}: model[{i}] ({})", m.id),
            };
            let fail = |field: &str, message: String| Err(ModelTableError::Parse { path: path.to_owned(), message: format!("{at}: {field}: {message}") });
            let p = &m.price;
            for (field, value) in [
                ("price.input", p.input),
                ("price.output", p.output),
                ("price.cache_write_5m", p.cache_write_5m),
                ("price.cache_write_1h", p.cache_write_1h),
                ("price.cache_read", p.cache_read),
            ] {
                if !(value.is_finite() && (0.0..=1e6).contains(&value)) {
                    return fail(field, format!("{value} is not a price (a finite number of USD per million tokens, from 0 to 1e6)"));
                }
            }
            if m.context_window == 0 {
                return fail("context_window", "must be above 0".to_owned());
            }
            if m.max_output_tokens == 0 {
                return fail("max_output_tokens", "must be above 0".to_owned());
            }
            if m.tokenizer.is_empty() || m.tokenizer.contains('/') {
                return fail("tokenizer", format!("`{}` is not a generation name (not empty, no `/`)", m.tokenizer));
            }
            if m.fragments.iter().any(|f| f.is_empty()) || m.fragments.is_empty() {
                return fail("match", "needs at least one non-empty fragment".to_owned());
            }
        }
        Ok(())
    }

    /// Reads a table file: a byte-order mark is dropped; an empty file and invalid UTF-8 (with
    /// its line and byte column) are errors, as is any key the table does not know.
    pub fn load(path: &Path) -> Result<ModelTable, ModelTableError> {
        let text = crate::input::read_text(path).map_err(ModelTableError::Text)?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Resolves a wire model id to its entry.
    pub fn lookup(&self, model: &str) -> Result<&ModelInfo, UnknownModel> {
        self.lookup_index(model).map(|i| &self.models[i])
    }

    /// The index in [`Self::models`] of the entry [`Self::lookup`] finds.
    pub fn lookup_index(&self, model: &str) -> Result<usize, UnknownModel> {
        let normalized = normalize_model_id(model);
        let mut best: Option<(usize, usize)> = None;
        for (i, info) in self.models.iter().enumerate() {
            for fragment in &info.fragments {
                if best.is_none_or(|(_, len)| fragment.len() > len) && contains_short(&normalized, fragment) {
                    best = Some((i, fragment.len()));
                }
            }
        }
        best.map(|(i, _)| i).ok_or_else(|| UnknownModel {
            model: model.to_owned(),
            known: self.models.iter().map(|m| m.id.as_str()).collect::<Vec<_>>().join(", "),
        })
    }
}

/// [`ModelTable::lookup_index`] of the last model id asked, kept: a session's calls name one
/// model or two, and a lookup reads every match fragment of the table (the billed cost prices
/// each call, a measurer each request). Debug builds look up again and compare.
#[derive(Debug, Clone, Default)]
pub struct LastLookup(Option<(String, Result<usize, UnknownModel>)>);

impl LastLookup {
    /// `table.lookup_index(model)`, from the last answer when `model` is the last id asked
    /// (always of the same `table`).
    pub fn index(&mut self, table: &ModelTable, model: &str) -> Result<usize, UnknownModel> {
        let answer = match &self.0 {
            Some((last, answer)) if last == model => answer.clone(),
            _ => {
                let answer = table.lookup_index(model);
                self.0 = Some((model.to_owned(), answer.clone()));
                answer
            }
        };
        debug_assert_eq!(answer.as_ref().ok(), table.lookup_index(model).as_ref().ok(), "the kept lookup of {model} is the table's");
        answer
    }
}

/// Whether `haystack` contains `needle`, as `str::contains`, by a plain scan: a model id and a
/// match fragment are a few dozen bytes, shorter than the set-up of a substring searcher (this is
/// asked per fragment of the table, per call replayed).
fn contains_short(haystack: &str, needle: &str) -> bool {
    let (h, n) = (haystack.as_bytes(), needle.as_bytes());
    n.is_empty() || h.windows(n.len()).any(|w| w == n)
}

/// Lower-cases and strips a `[1m]`-style context suffix.
pub fn normalize_model_id(model: &str) -> String {
    let lower = model.to_ascii_lowercase();
    match lower.find('[') {
        Some(i) => lower[..i].to_owned(),
        None => lower,
    }
}

impl Price {
    /// Cost in USD of one request's usage.
    pub fn cost(&self, input: u64, output: u64, read: u64, write_5m: u64, write_1h: u64) -> f64 {
        (input as f64 * self.input
            + output as f64 * self.output
            + read as f64 * self.cache_read
            + write_5m as f64 * self.cache_write_5m
            + write_1h as f64 * self.cache_write_1h)
            / 1_000_000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The plain scan answers as `str::contains` (multi-byte text included).
        #[test]
        fn the_short_scan_is_str_contains(haystack in "[a-c4é\\[\\]-]{0,12}", needle in "[a-c4é-]{0,4}") {
            prop_assert_eq!(contains_short(&haystack, &needle), haystack.contains(needle.as_str()));
        }
    }

    #[test]
    fn longest_fragment_wins() {
        let table = ModelTable::shipped();
        assert_eq!(table.lookup("claude-opus-4-1-20250805").unwrap().id, "claude-opus-4-1");
        assert_eq!(table.lookup("claude-opus-4-20250514").unwrap().id, "claude-opus-4");
        assert_eq!(table.lookup("claude-sonnet-4-6[1m]").unwrap().id, "claude-sonnet-4-6");
        assert_eq!(table.lookup("claude-haiku-4-5-20251001").unwrap().min_cacheable_tokens, 4096);
        let err = table.lookup("gpt-4o").unwrap_err().to_string();
        assert!(err.contains("claude-sonnet-4-5"), "{err}");
    }
}
