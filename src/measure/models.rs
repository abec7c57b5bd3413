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
    pub min_cacheable_tokens: u64,
    pub context_window: u64,
    pub max_output_tokens: u64,
    /// At a new user turn the API drops earlier turns' thinking from the context (not counted,
    /// the cached prefix still valid); Opus 4.5+ and Sonnet 4.6+ keep it.
    #[serde(default)]
    pub strips_prior_thinking: bool,
    pub price: Price,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelTable {
    #[serde(rename = "model")]
    pub models: Vec<ModelInfo>,
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
        toml::from_str(text).map_err(|e| ModelTableError::Parse { path: path.to_owned(), message: crate::input::toml_message(&e, text) })
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
                if normalized.contains(fragment.as_str()) && best.is_none_or(|(_, len)| fragment.len() > len) {
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
