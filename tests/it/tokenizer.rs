//! The `bpe` count (tiktoken-rs `o200k_base` with a DFA split, `measure::o200k`) equals
//! tiktoken-rs's own `encode_ordinary(..).len()` on every text of the real data and on
//! generated text built from the characters the split treats specially.

use std::path::Path;

use ctxsim::measure::o200k::{count, count_by_tiktoken};
use proptest::prelude::*;
use serde_json::Value;

fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

#[test]
fn bpe_counts_equal_tiktoken_on_every_real_text() {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/realdata"));
    let mut files: Vec<_> = walkdir::WalkDir::new(root).into_iter().filter_map(Result::ok).filter(|e| e.file_type().is_file()).map(|e| e.into_path()).collect();
    files.sort();
    let (mut texts, mut tokens) = (0u64, 0u64);
    for file in &files {
        let Ok(bytes) = std::fs::read(file) else { continue };
        let text = String::from_utf8_lossy(&bytes);
        let mut pieces: Vec<String> = vec![text.to_string()];
        for line in text.lines() {
            pieces.push(line.to_owned());
            if let Ok(value) = serde_json::from_str::<Value>(line) {
                strings(&value, &mut pieces);
            }
        }
        for piece in pieces {
            let expected = count_by_tiktoken(&piece);
            assert_eq!(count(&piece), expected, "{}: {:?}", file.display(), piece.chars().take(200).collect::<String>());
            texts += 1;
            tokens += u64::from(expected);
        }
    }
    assert!(files.len() > 100 && texts > 10_000 && tokens > 5_000_000, "{} files, {texts} texts, {tokens} tokens", files.len());
}

/// A thread keeps the short pieces it counted lately in a small table, one piece per slot
/// (`o200k::Recent`): 40,000 distinct one-piece words, more than it has slots, counted three
/// times over in alternating orders (so pieces that share a slot replace each other there)
/// keep tiktoken-rs's counts (the thread's memo of the short pieces that are not tokens
/// holds their counts too).
#[test]
fn bpe_counts_stay_exact_when_recent_pieces_replace_each_other() {
    let word = |mut i: u32| {
        let mut w = String::from("zq");
        while i > 0 || w.len() < 4 {
            w.push(char::from(b'a' + (i % 26) as u8));
            i /= 26;
        }
        w
    };
    let words: Vec<String> = (0..40_000).map(word).collect();
    let expected: Vec<u32> = words.iter().map(|w| count_by_tiktoken(&format!("{w} {w}"))).collect();
    for round in 0..3 {
        let order: Box<dyn Iterator<Item = usize>> = if round == 1 { Box::new((0..words.len()).rev()) } else { Box::new((0..words.len()).step_by(1 + round)) };
        for i in order {
            let text = format!("{0} {0}", words[i]);
            assert_eq!(count(&text), expected[i], "{text}");
        }
    }
}

/// Characters from every class the split distinguishes: cased and uncased letters, marks,
/// digits of several scripts, punctuation, the apostrophe suffixes, line breaks, other
/// whitespace (tab, no-break space, em space, next line), and a few four-byte characters.
fn tricky_text() -> impl Strategy<Value = String> {
    let atoms = prop::sample::select(vec![
        "a", "Z", "é", "É", "ß", "ǅ", "ʰ", "日", "\u{0301}", "1", "٣", "Ⅻ", "'", "'s", "'LL", "’", "-", "/", ".", "{", "}", "\"",
        "_", "😀", "👋🏽", " ", "  ", "\t", "\n", "\r\n", "\r", "\u{00a0}", "\u{2003}", "\u{0085}", "<|endoftext|>", "------",
    ]);
    prop::collection::vec(atoms, 0..60).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn bpe_counts_equal_tiktoken_on_generated_text(text in tricky_text()) {
        prop_assert_eq!(count(&text), count_by_tiktoken(&text));
    }

    /// Long pieces (a run of letters, of punctuation, of spaces, of one repeated syllable)
    /// around the lengths where the merge changes: tiktoken-rs's heap merge from 100 bytes,
    /// tiktoken-rs itself from 1 KiB.
    #[test]
    fn bpe_counts_equal_tiktoken_on_long_pieces(unit in prop::sample::select(vec!["a", "xq", "ab", "=", "-*", " ", "\t", "é", "na", "Zz"]), len in 40usize..1400, prefix in "[a-z ]{0,5}") {
        let text = format!("{prefix}{}", unit.repeat(len / unit.len().max(1)));
        prop_assert_eq!(count(&text), count_by_tiktoken(&text));
    }

    /// Long pieces of random letters (one piece each: no case change, no space).
    #[test]
    fn bpe_counts_equal_tiktoken_on_long_random_words(text in "[a-z]{90,1200}|[A-Z]{90,1200}|[!-/]{90,1200}") {
        prop_assert_eq!(count(&text), count_by_tiktoken(&text));
    }

    #[test]
    fn bpe_counts_equal_tiktoken_on_arbitrary_strings(text in any::<String>()) {
        prop_assert_eq!(count(&text), count_by_tiktoken(&text));
    }
}

/// Every measuring command, `check` included, counts with `calibrated` unless told otherwise, and
/// says so: in `--help`, under a table, in the JSON summary.
#[test]
fn measuring_commands_default_to_the_calibrated_estimator_and_say_so() {
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/compaction-fork-shares-cache.yaml");
    let ctxsim = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let summary = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["run", scenario, "--format", "json"];
        args.extend_from_slice(extra);
        serde_json::from_str(&ctxsim(&args)).unwrap()
    };
    let default = summary(&[]);
    assert_eq!(default["estimator"], "calibrated");
    assert_eq!(default, summary(&["--estimator", "calibrated"]));
    assert_ne!(default["tokens"], summary(&["--estimator", "bpe"])["tokens"]);
    let table = ctxsim(&["run", scenario]);
    assert!(table.trim_end().ends_with("estimator: calibrated (o200k scaled per model family to billed tokens, the default)"), "{table}");
    for command in ["run", "analyze", "replay", "compare", "sweep", "serve", "live", "tokens", "audit", "fidelity", "check"] {
        let help = ctxsim(&[command, "--help"]);
        assert!(help.contains("default `calibrated`") || help.contains("[default: calibrated]"), "{command} --help:\n{help}");
    }
    assert!(ctxsim(&["check", "--help"]).contains("[default: calibrated]"));
}
