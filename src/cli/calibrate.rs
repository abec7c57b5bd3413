//! `ctxsim calibrate --from-api`: the `calibrated` estimator fitted on the user's own sessions'
//! texts against the real `count_tokens` endpoint.
//!
//! Per model family the sessions used (with the model called most in that family), each sampled
//! text is counted twice: as the one text block of a user message, and as two such blocks. The
//! difference is what one block of that text costs, framing included; the fit is that cost
//! against the text's `bpe` count (`scale` per `bpe` token plus `per_block`), by least squares
//! ([`crate::replay::fidelity::fit_block_costs`]). The rest of the calibration (the families
//! not seen, the user context and prefix levels) is the shipped one.
//!
//! The API key is read from `ANTHROPIC_API_KEY` and sent as the `x-api-key` header; it is never
//! printed or written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde_json::{Value, json};

use crate::api::{ContentBlock, ToolResultContent};
use crate::measure::{Calibration, ModelTable};
use crate::recording::EventKind;
use crate::replay::fidelity::fit_block_costs;
use crate::replay::load_session;
use crate::report::output::write_atomic;

use super::sessions::SessionInputs;

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    #[command(flatten)]
    pub sessions: SessionInputs,
    /// Fit against the `count_tokens` endpoint (key from `ANTHROPIC_API_KEY`, never written).
    #[arg(long, required = true)]
    pub from_api: bool,
    /// The API's base URL (default: `$ANTHROPIC_BASE_URL`, else https://api.anthropic.com).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// Texts counted per model family (two requests each), spread over the texts' lengths.
    #[arg(long, value_name = "N", default_value_t = 40)]
    pub max_texts: usize,
    /// Write the fitted calibration (JSON, for `--calibration FILE`) here.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// A model table replacing the shipped one (same shape as data/models.toml).
    #[arg(long, value_name = "FILE")]
    pub model_table: Option<PathBuf>,
}

/// Texts longer than this are not sampled (a count request stays small).
const MAX_TEXT_BYTES: usize = 60_000;

fn push_blocks<'a>(blocks: impl IntoIterator<Item = &'a ContentBlock>, out: &mut Vec<String>) {
    for block in blocks {
        match block {
            ContentBlock::Text { text, .. } => out.push(String::clone(text)),
            ContentBlock::ToolResult { content: Some(content), .. } => push_result(content, out),
            _ => {}
        }
    }
}

fn push_result(content: &ToolResultContent, out: &mut Vec<String>) {
    match content {
        ToolResultContent::Text(text) => out.push(String::clone(text)),
        ToolResultContent::Blocks(blocks) => push_blocks(blocks, out),
    }
}

/// `n` of `texts` (distinct, sorted by length then content) spread evenly over their lengths.
fn sample(texts: BTreeSet<String>, n: usize) -> Vec<String> {
    let mut texts: Vec<String> = texts.into_iter().filter(|t| !t.trim().is_empty() && t.len() <= MAX_TEXT_BYTES).collect();
    texts.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
    if texts.len() <= n {
        return texts;
    }
    (0..n).map(|i| texts[i * (texts.len() - 1) / (n.max(2) - 1)].clone()).collect()
}

/// A `count_tokens` client: the input tokens of `messages` for `model`.
struct CountTokens {
    agent: ureq::Agent,
    url: String,
    key: String,
}

impl CountTokens {
    fn count(&self, model: &str, blocks: usize, text: &str) -> anyhow::Result<u64> {
        let content: Vec<Value> = (0..blocks).map(|_| json!({"type": "text", "text": text})).collect();
        let body = json!({"model": model, "messages": [{"role": "user", "content": content}]});
        for attempt in 0.. {
            let mut response = self
                .agent
                .post(&self.url)
                .header("x-api-key", &self.key)
                .header("anthropic-version", "2023-06-01")
                .header("content-type", "application/json")
                .send(body.to_string())
                .with_context(|| format!("POST {}", self.url))?;
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
            let text = response.body_mut().read_to_string().unwrap_or_default();
            if (status == 429 || status == 529) && attempt < 5 {
                std::thread::sleep(Duration::from_secs(retry_after.unwrap_or(2 << attempt).min(60)));
                continue;
            }
            if status != 200 {
                anyhow::bail!("POST {}: HTTP {status}: {}", self.url, crate::input::cap_message(&text));
            }
            let value: Value = serde_json::from_str(&text).with_context(|| format!("POST {}: the answer is not JSON", self.url))?;
            return value["input_tokens"].as_u64().with_context(|| format!("POST {}: no input_tokens in the answer", self.url));
        }
        unreachable!("the loop returns")
    }
}

pub fn run(args: CalibrateArgs) -> anyhow::Result<i32> {
    let Ok(key) = std::env::var("ANTHROPIC_API_KEY") else {
        eprintln!("calibrate --from-api: ANTHROPIC_API_KEY is not set");
        return Ok(super::exit::BAD_INPUT);
    };
    let base = args.base_url.clone().or_else(|| std::env::var("ANTHROPIC_BASE_URL").ok()).unwrap_or_else(|| "https://api.anthropic.com".to_owned());
    let table = match &args.model_table {
        Some(path) => ModelTable::load(path)?,
        None => ModelTable::shipped(),
    };
    let files = args.sessions.files()?;
    // Per family, calls by model; the texts of every session.
    let mut models: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut texts: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for file in &files {
        let session = match load_session(&file.path) {
            Ok(session) => session,
            Err(e) => {
                problems.push(format!("{}: skipped: {e}", file.path.display()));
                continue;
            }
        };
        let mut own = Vec::new();
        for event in &session.recording.events {
            match &event.kind {
                EventKind::UserPrompt(prompt) => push_blocks(prompt.content.to_blocks().iter(), &mut own),
                EventKind::ModelReply(reply) => push_blocks(&reply.content, &mut own),
                EventKind::ToolResult(result) => {
                    if let Some(content) = &result.content {
                        push_result(content, &mut own);
                    }
                }
                _ => {}
            }
        }
        let mut families = BTreeSet::new();
        for call in session.calls.iter().filter(|c| !c.is_synthetic) {
            match table.lookup(&call.model) {
                Ok(info) => {
                    *models.entry(info.family.clone()).or_default().entry(call.model.clone()).or_default() += 1;
                    families.insert(info.family.clone());
                }
                Err(e) => problems.push(format!("{}: {e}", file.path.display())),
            }
        }
        for family in families {
            texts.entry(family).or_default().extend(own.iter().cloned());
        }
    }
    problems.sort();
    problems.dedup();
    let client = CountTokens {
        agent: ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(120))).build().into(),
        url: format!("{}/v1/messages/count_tokens", base.trim_end_matches('/')),
        key,
    };
    let mut calibration = Calibration::shipped();
    let mut lines = vec![format!("{:<10} {:<28} {:>5} {:>9} {:>9} {:>14}", "family", "model", "texts", "scale", "per_block", "shipped")];
    let mut counted = 0usize;
    for (family, by_model) in &models {
        // The model called most in the family (ties: the first name).
        let Some((model, _)) = by_model.iter().max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0))) else { continue };
        let sampled = sample(texts.remove(family).unwrap_or_default(), args.max_texts);
        let mut costs = Vec::new();
        for text in &sampled {
            let one = client.count(model, 1, text)?;
            let two = client.count(model, 2, text)?;
            costs.push((u64::from(crate::measure::tokens::bpe(text)), two.saturating_sub(one)));
        }
        counted += sampled.len();
        let shipped = calibration.for_family(family);
        let Some(fitted) = fit_block_costs(&costs) else {
            problems.push(format!("family {family}: {} texts are too few to fit (at least 3 of different lengths)", sampled.len()));
            continue;
        };
        lines.push(format!(
            "{family:<10} {model:<28} {:>5} {:>9.6} {:>9.3} {:>6.4}/{:<7.3}",
            sampled.len(),
            fitted.scale,
            fitted.per_block,
            shipped.scale,
            shipped.per_block
        ));
        calibration.families.insert(family.clone(), fitted);
    }
    calibration.source = format!("fitted by `ctxsim calibrate --from-api` against {} on {counted} texts of {} sessions", client.url, files.len());
    calibration.validate(&args.output.display().to_string())?;
    let mut text = serde_json::to_string_pretty(&calibration)?;
    text.push('\n');
    write_atomic(&args.output, text.as_bytes()).with_context(|| format!("failed to write {}", args.output.display()))?;
    for line in &lines {
        outln!("{line}");
    }
    outln!("wrote {} (use it with --calibration {})", args.output.display(), args.output.display());
    for p in &problems {
        eprintln!("{p}");
    }
    Ok(if problems.is_empty() { super::exit::OK } else { super::exit::BAD_INPUT })
}
