//! What a recorded call was billed: its usage object priced with the model table and the price
//! modifiers the usage names (`speed: "fast"`, `inference_geo`, `service_tier: "batch"`) and
//! the long-context rates of the models that have them (`data/models.toml`, sections
//! `[[price_modifier]]` and `[[long_context]]`).
//!
//! The token sums are the usage's own; only the price changes. On the shipped real sessions the
//! per-session sums and costs equal ccusage 20.0.24's (`tests/data/ccusage/`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::models::{LastLookup, ModelTable, Price, UnknownModel};
use crate::api::Usage;

/// Billed token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BilledTokens {
    pub input: u64,
    pub output: u64,
    pub cache_write_5m: u64,
    pub cache_write_1h: u64,
    pub cache_read: u64,
}

impl BilledTokens {
    /// The usage's sums, cache writes as its 5m/1h split reports them (all 5m without a split).
    /// When the split does not add up to `cache_creation_input_tokens` (calls with advisor
    /// iterations write such usages), the split is what is counted, as ccusage does.
    pub fn from_usage(usage: &Usage) -> BilledTokens {
        let split = usage.creation_split();
        BilledTokens {
            input: usage.input_tokens,
            output: usage.output_tokens,
            cache_write_5m: split.ephemeral_5m_input_tokens,
            cache_write_1h: split.ephemeral_1h_input_tokens,
            cache_read: usage.cache_read_input_tokens,
        }
    }

    pub fn cache_creation(&self) -> u64 {
        self.cache_write_5m + self.cache_write_1h
    }

    /// input + output + cache writes + cache reads, as ccusage's `totalTokens`.
    pub fn total(&self) -> u64 {
        self.input + self.output + self.cache_creation() + self.cache_read
    }

    pub fn add(&mut self, other: &BilledTokens) {
        self.input += other.input;
        self.output += other.output;
        self.cache_write_5m += other.cache_write_5m;
        self.cache_write_1h += other.cache_write_1h;
        self.cache_read += other.cache_read;
    }
}

/// One call priced.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallBill {
    /// The model as a per-model breakdown names it: the recorded id, with the suffix of a
    /// modifier that has one (`claude-opus-4-8-fast`).
    pub label: String,
    pub tokens: BilledTokens,
    pub cost_usd: f64,
    /// Ids of the modifiers applied (`fast`, `long_context`, ...).
    pub modifiers: Vec<String>,
}

/// The price of one call's usage.
pub fn bill_call(table: &ModelTable, model: &str, usage: &Usage) -> Result<CallBill, UnknownModel> {
    bill_call_looked_up(table, &mut LastLookup::default(), model, usage)
}

/// [`bill_call`] with the model looked up through `lookup` (kept for the next call of the
/// same model).
pub fn bill_call_looked_up(table: &ModelTable, lookup: &mut LastLookup, model: &str, usage: &Usage) -> Result<CallBill, UnknownModel> {
    let index = lookup.index(table, model)?;
    let info = &table.models[index];
    let tokens = BilledTokens::from_usage(usage);
    let field = |name: &str| usage.extra.get(name).and_then(|v| v.as_str());
    let applies = |models: &[String]| models.is_empty() || models.contains(&info.id);
    let mut label = model.to_owned();
    let mut modifiers = Vec::new();
    let mut factor = 1.0;
    for m in &table.price_modifiers {
        if field(&m.field) == Some(m.equals.as_str()) && applies(&m.models) {
            factor *= m.multiplier;
            if let Some(suffix) = &m.label_suffix {
                label.push_str(suffix);
            }
            modifiers.push(m.id.clone());
        }
    }
    let (mut input_factor, mut output_factor) = (factor, factor);
    let prompt = tokens.input + tokens.cache_creation() + tokens.cache_read;
    if let Some(long) = table.long_context.iter().find(|l| applies(&l.models) && !l.models.is_empty() && prompt > l.above_prompt_tokens) {
        input_factor *= long.input_multiplier;
        output_factor *= long.output_multiplier;
        modifiers.push("long_context".to_owned());
    }
    let Price { input, output, cache_write_5m, cache_write_1h, cache_read } = info.price;
    let cost_usd = (tokens.input as f64 * input * input_factor
        + tokens.output as f64 * output * output_factor
        + tokens.cache_write_5m as f64 * cache_write_5m * input_factor
        + tokens.cache_write_1h as f64 * cache_write_1h * input_factor
        + tokens.cache_read as f64 * cache_read * input_factor)
        / 1_000_000.0;
    Ok(CallBill { label, tokens, cost_usd, modifiers })
}

/// Sums of priced calls, per model label.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Bill {
    pub tokens: BilledTokens,
    #[serde(deserialize_with = "crate::input::exact_f64")]
    pub cost_usd: f64,
    pub calls: u64,
    /// Per model label: tokens, cost, calls.
    pub by_model: BTreeMap<String, ModelBill>,
    /// Models the table does not know: label → calls. Their tokens are counted, their cost is not.
    pub unpriced: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelBill {
    pub tokens: BilledTokens,
    #[serde(deserialize_with = "crate::input::exact_f64")]
    pub cost_usd: f64,
    pub calls: u64,
}

/// Work another model did inside a call and billed at its own rate: the `advisor_message`
/// iterations of the usage (the advisor tool), each with its `model`.
pub fn nested_usages(usage: &Usage) -> Vec<(String, Usage)> {
    let Some(iterations) = usage.extra.get("iterations").and_then(|v| v.as_array()) else { return Vec::new() };
    iterations
        .iter()
        .filter(|it| it.get("type").and_then(|t| t.as_str()) == Some("advisor_message"))
        .filter_map(|it| {
            let model = it.get("model")?.as_str()?.to_owned();
            let mut nested: Usage = serde_json::from_value(it.clone()).ok()?;
            // The call's price modifiers apply to the work done for it.
            for key in ["speed", "inference_geo", "service_tier"] {
                if let Some(v) = usage.extra.get(key) {
                    nested.extra.insert(key.to_owned(), v.clone());
                }
            }
            nested.extra.remove("iterations");
            Some((model, nested))
        })
        .collect()
}

impl Bill {
    /// Adds one call and the advisor work inside it ([`nested_usages`]); a model the table does
    /// not know is counted in [`Bill::unpriced`]. Models are looked up through `lookup`, which
    /// a session's calls share.
    pub fn add_call(&mut self, table: &ModelTable, lookup: &mut LastLookup, model: &str, usage: &Usage) {
        self.add_one(table, lookup, model, usage);
        self.calls += 1;
        for (nested_model, nested) in nested_usages(usage) {
            self.add_one(table, lookup, &nested_model, &nested);
        }
    }

    fn add_one(&mut self, table: &ModelTable, lookup: &mut LastLookup, model: &str, usage: &Usage) {
        let (label, tokens, cost) = match bill_call_looked_up(table, lookup, model, usage) {
            Ok(bill) => (bill.label, bill.tokens, bill.cost_usd),
            Err(_) => {
                *self.unpriced.entry(model.to_owned()).or_default() += 1;
                (model.to_owned(), BilledTokens::from_usage(usage), 0.0)
            }
        };
        self.tokens.add(&tokens);
        self.cost_usd += cost;
        let entry = self.by_model.entry(label).or_default();
        entry.tokens.add(&tokens);
        entry.cost_usd += cost;
        entry.calls += 1;
    }

    pub fn merge(&mut self, other: &Bill) {
        self.tokens.add(&other.tokens);
        self.cost_usd += other.cost_usd;
        self.calls += other.calls;
        for (label, m) in &other.by_model {
            let entry = self.by_model.entry(label.clone()).or_default();
            entry.tokens.add(&m.tokens);
            entry.cost_usd += m.cost_usd;
            entry.calls += m.calls;
        }
        for (label, n) in &other.unpriced {
            *self.unpriced.entry(label.clone()).or_default() += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(json: &str) -> Usage {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn modifiers_scale_every_price() {
        let table = ModelTable::shipped();
        let base = bill_call(&table, "claude-opus-4-8", &usage(r#"{"input_tokens":1000000,"output_tokens":1000000}"#)).unwrap();
        assert_eq!(base.cost_usd, 30.0);
        let fast = bill_call(&table, "claude-opus-4-8", &usage(r#"{"input_tokens":1000000,"output_tokens":1000000,"speed":"fast"}"#)).unwrap();
        assert_eq!((fast.cost_usd, fast.label.as_str()), (60.0, "claude-opus-4-8-fast"));
        let fast46 = bill_call(&table, "claude-opus-4-6", &usage(r#"{"input_tokens":1000000,"speed":"fast"}"#)).unwrap();
        assert_eq!(fast46.cost_usd, 30.0);
        // Fast mode does not exist on Sonnet: no change.
        let sonnet = bill_call(&table, "claude-sonnet-5", &usage(r#"{"input_tokens":1000000,"speed":"fast"}"#)).unwrap();
        assert_eq!((sonnet.cost_usd, sonnet.modifiers.len()), (2.0, 0));
        let geo = bill_call(&table, "claude-opus-5", &usage(r#"{"cache_read_input_tokens":1000000,"inference_geo":"us","service_tier":"batch"}"#)).unwrap();
        assert!((geo.cost_usd - 0.5 * 1.1 * 0.5).abs() < 1e-12, "{}", geo.cost_usd);
        assert_eq!(geo.modifiers, ["data_residency_us", "batch"]);
    }

    #[test]
    fn long_context_rates_apply_to_the_whole_request_above_the_threshold() {
        let table = ModelTable::shipped();
        let under = bill_call(&table, "claude-sonnet-4-5-20250929", &usage(r#"{"input_tokens":100000,"cache_read_input_tokens":100000,"output_tokens":1000}"#)).unwrap();
        assert!((under.cost_usd - (0.3 + 0.03 + 0.015)).abs() < 1e-12);
        let over = bill_call(&table, "claude-sonnet-4-5-20250929", &usage(r#"{"input_tokens":100000,"cache_read_input_tokens":100001,"output_tokens":1000}"#)).unwrap();
        assert!((over.cost_usd - (0.6 + 100001.0 * 0.6 / 1e6 + 0.0225)).abs() < 1e-12, "{}", over.cost_usd);
        // 1M models have no surcharge.
        let opus = bill_call(&table, "claude-opus-4-6", &usage(r#"{"cache_read_input_tokens":900000}"#)).unwrap();
        assert_eq!(opus.modifiers.len(), 0);
    }

    #[test]
    fn a_modifier_naming_an_unknown_model_is_an_error() {
        let text = r#"
[[model]]
id = "m"
match = ["m"]
family = "x"
min_cacheable_tokens = 1
context_window = 1
max_output_tokens = 1
price = { input = 1.0, output = 1.0, cache_write_5m = 1.0, cache_write_1h = 1.0, cache_read = 1.0 }
[[price_modifier]]
id = "fast"
field = "speed"
equals = "fast"
models = ["nope"]
multiplier = 2.0
source = "test"
"#;
        let err = ModelTable::parse(text, "t.toml").unwrap_err().to_string();
        assert!(err.contains("t.toml") && err.contains("`nope`"), "{err}");
    }
}
