//! The steps of the calibration fit (`replay::fidelity::fit_samples`: consecutive calls of a
//! lane, read by the record view with the `bpe` estimator) with what their new content is made
//! of (the messages each call saw, as the record view hands them over), one TSV row
//! per step: `cargo run --release --example ratio_probe -- FILE... > steps.tsv`, then
//! `python3 scripts/ratio_fit.py steps.tsv v2` fits the ratio on content features and scores each
//! session held out (docs/fidelity.md, "A content model of the tokenizer's ratio").
//! Columns: session, estimator key, call index, clean (1: a step the fit uses), previous reply
//! filled, attachment chars / of them not sized from the client / a compaction or the like
//! before / messages shrunk, then growths: recorded context, the replay's message tokens, and of
//! the messages' text: bpe tokens, UTF-16 units, whitespace, punctuation (not alphanumeric, not
//! whitespace), non-ASCII characters, line breaks, blocks.
use ctxsim::api::Message;
use ctxsim::measure::tokens::{TokenUnit, bpe, utf16_len};
use std::collections::BTreeMap;

#[derive(Default, Clone, Copy, Debug)]
struct F {
    bpe: f64,
    chars: f64,
    ws: f64,
    punct: f64,
    nonascii: f64,
    nl: f64,
    blocks: f64,
}

fn feats(messages: &[Message]) -> F {
    let mut f = F::default();
    for m in messages {
        for b in m.content.to_blocks().iter() {
            f.blocks += 1.0;
            for u in ctxsim::measure::blocks::content_token_units(b) {
                match u {
                    // A fixed-size unit (an image) counts its tokens and no text.
                    TokenUnit::Fixed(n) => f.bpe += f64::from(n),
                    TokenUnit::Text(t) => {
                        let n = bpe(&t) as f64;
                        let c = utf16_len(&t) as f64;
                        f.bpe += n;
                        f.chars += c;
                        for ch in t.chars() {
                            if ch == '\n' {
                                f.nl += 1.0
                            }
                            if ch.is_whitespace() {
                                f.ws += 1.0
                            } else if !ch.is_alphanumeric() {
                                f.punct += 1.0
                            }
                            if !ch.is_ascii() {
                                f.nonascii += 1.0
                            }
                        }
                    }
                }
            }
        }
    }
    f
}

fn main() {
    let table = ctxsim::measure::ModelTable::shipped();
    let options = ctxsim::replay::ReplayOptions::default();
    println!(
        "session\tkey\tindex\tclean\tprev_filled\tattachment_chars/unsized/disturbed/shrunk\trecorded\tmessage_tokens\tbpe\tchars\tws\tpunct\tnonascii\tnewlines\tblocks"
    );
    for path in std::env::args().skip(1) {
        let path = std::path::PathBuf::from(path);
        let session = match ctxsim::replay::session::load_session(&path) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("ratio_probe: {}: {e}", path.display());
                std::process::exit(1);
            }
        };
        let blank = ctxsim::measure::Calibration {
            generations: BTreeMap::new(),
            thinking_fill: BTreeMap::new(),
            ..ctxsim::measure::Calibration::shipped()
        };
        let counter = ctxsim::measure::TokenCounter::with_calibration(
            ctxsim::measure::EstimatorKind::Bpe,
            blank,
        );
        let mut measurer =
            ctxsim::measure::Measurer::new(table.clone(), counter).without_body_hashes();
        let mut by_index: BTreeMap<usize, F> = BTreeMap::new();
        let view = ctxsim::replay::record_view_observed(
            &session,
            &mut measurer,
            &options,
            &mut |i, messages| {
                by_index.insert(i, feats(messages));
            },
        );
        let mut last: BTreeMap<String, (f64, f64, bool, F)> = BTreeMap::new();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let recorded: BTreeMap<usize, (u64, &str)> = session.calls.iter().map(|c| (c.index, (c.usage.prompt_tokens(), c.model.as_str()))).collect();
        for call in view.calls.iter().filter(|c| c.skipped.is_none()) {
            let Some(f) = by_index.get(&call.index).copied() else {
                continue;
            };
            let (rec, model) = recorded.get(&call.index).copied().unwrap_or_default();
            let rec = rec as f64;
            let now = (rec, call.message_tokens as f64, call.thinking_filled, f);
            let prev = last.insert(call.lane.clone(), now);
            let disturbed = call.events.iter().any(|e| {
                matches!(
                    e.as_str(),
                    "compaction" | "microcompact" | "resume" | "skill" | "tool_search_load"
                )
            });
            let Some(prev) = prev else { continue };
            let key = table
                .lookup(model)
                .map(|m| m.estimator_key())
                .unwrap_or_default();
            let clean = !(disturbed || now.1 < prev.1 || prev.2 || call.unsized_attachment_chars > 0);
            let d = |a: f64, b: f64| a - b;
            println!(
                "{name}\t{key}\t{}\t{}\t{}\t{}/{}/{}/{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                call.index,
                clean as u8,
                prev.2 as u8,
                call.attachment_chars,
                call.unsized_attachment_chars,
                disturbed as u8,
                (now.1 < prev.1) as u8,
                d(now.0, prev.0),
                d(now.1, prev.1),
                d(f.bpe, prev.3.bpe),
                d(f.chars, prev.3.chars),
                d(f.ws, prev.3.ws),
                d(f.punct, prev.3.punct),
                d(f.nonascii, prev.3.nonascii),
                d(f.nl, prev.3.nl),
                d(f.blocks, prev.3.blocks)
            );
        }
    }
}
