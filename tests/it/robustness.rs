//! Every reader of user input against mutated inputs (issue 14, docs/reliability.md
//! "Readers"): seeds from ../shared/realdata and the shipped files, mutated by truncation at
//! random offsets, invalid UTF-8, wrong JSON types, a byte-order mark, huge values, deep
//! nesting, duplicated, deleted and garbage lines, and emptiness. Most mutations run through
//! the library harnesses (`ctxsim::fuzzing`, the fuzz targets' own), which check the promises
//! themselves (no panic; warnings and errors name file and line; messages capped; every line
//! of a JSONL input used or warned about); here each mutation that is known to damage the input
//! must also be reported, and a byte-order mark must change nothing. A few hundred go through
//! the binary with `--strict`: exit 0 only when nothing was dropped, 2 naming file and line
//! otherwise. One fixed seed: the same inputs every run.

use std::path::{Path, PathBuf};
use std::process::Command;

use ctxsim::fuzzing::{self, Outcome};
use ctxsim::recording::WarningKind;
use serde_json::Value;

use crate::support::realdata;

/// splitmix64: a small deterministic generator, so the suite needs no seed from outside.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The first lines of a file, up to about `limit` bytes (whole lines, at least one).
fn head(path: &Path, limit: usize) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut end = 0;
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'\n' {
            if end > 0 && i + 1 > limit {
                break;
            }
            end = i + 1;
        }
    }
    bytes[..if end == 0 { bytes.len() } else { end }].to_vec()
}

/// How a reader's input is built, for the mutations that need to know.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// One JSON value per line.
    Jsonl,
    /// One JSON document.
    Json,
    Toml,
    Yaml,
    Csv,
}

struct Seed {
    reader: &'static str,
    kind: Kind,
    name: String,
    bytes: Vec<u8>,
}

fn seeds() -> Vec<Seed> {
    let mut seeds = Vec::new();
    let mut add = |reader: &'static str, kind: Kind, name: String, bytes: Vec<u8>| {
        let outcome = fuzzing::reader(reader).unwrap()(&bytes);
        assert!(!reports_damage(&outcome), "seed {name} for {reader} is not clean: {outcome:?}");
        seeds.push(Seed { reader, kind, name, bytes });
    };
    let recording = repo().join("recordings/entireio-7662d755ef9f-2.jsonl");
    add("recording", Kind::Jsonl, recording.display().to_string(), head(&recording, 24_000));
    let transcripts = realdata().join("transcripts");
    for project in ["NumWordify", "cipher-box", "entireio-cli", "oh-my-posh"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(transcripts.join(project))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".full.jsonl"))
            .collect();
        files.sort();
        add("transcript", Kind::Jsonl, files[0].display().to_string(), head(&files[0], 16_000));
    }
    // A 2.1.332 transcript with recorded wire requests (api-request, -shape, -blob records),
    // whole: its shape record alone is larger than the heads above.
    let recorded = repo().join("tests/data/api-requests/resume/00000000-0000-4000-8000-000000000001.jsonl");
    add("transcript", Kind::Jsonl, recorded.display().to_string(), std::fs::read(&recorded).unwrap());
    let capture = realdata().join("api_captures/claude-trace/test-traffic.jsonl");
    let capture_head = head(&capture, 40_000);
    add("claude_trace", Kind::Jsonl, capture.display().to_string(), capture_head.clone());
    let converted = ctxsim::recording::convert_claude_trace(std::io::Cursor::new(&capture_head), "capture").unwrap();
    let mut log = Vec::new();
    ctxsim::recording::write_request_log_to(&converted.entries, &mut log).unwrap();
    add("request_log", Kind::Jsonl, "request log converted from the capture".into(), log.clone());
    add("request_log", Kind::Json, ARRAY_LOG.into(), array_log(&converted.entries));
    add("shapes", Kind::Jsonl, "request log converted from the capture".into(), log);
    for name in ["compact", "multi-tool"] {
        let path = repo().join(format!("tests/conformance/{name}.real-shapes.json"));
        add("shapes", Kind::Json, path.display().to_string(), std::fs::read(&path).unwrap());
    }
    add("model_table", Kind::Toml, "data/models.toml".into(), std::fs::read(repo().join("data/models.toml")).unwrap());
    add("calibration", Kind::Json, "data/calibration.json".into(), std::fs::read(repo().join("data/calibration.json")).unwrap());
    let strategy = ctxsim::strategy::Strategy::default();
    add("strategy_toml", Kind::Toml, "the default strategy as TOML".into(), toml::to_string(&strategy).unwrap().into_bytes());
    add("strategy_yaml", Kind::Yaml, "the default strategy as YAML".into(), serde_norway::to_string(&strategy).unwrap().into_bytes());
    add("baseline", Kind::Json, "a baseline".into(), baseline_seed());
    add("sweep_csv", Kind::Csv, "reports/sweep/sweep.csv".into(), std::fs::read(repo().join("reports/sweep/sweep.csv")).unwrap());
    let trace = repo().join("reports/real-session/trace.jsonl");
    add("trace", Kind::Jsonl, trace.display().to_string(), head(&trace, 30_000));
    for name in ["read-and-answer", "git-status", "cached-microcompact", "break-session-resume"] {
        let path = repo().join(format!("scenarios/{name}.yaml"));
        add("scenario", Kind::Yaml, path.display().to_string(), std::fs::read(&path).unwrap());
    }
    seeds
}

/// The name of the request-log seed in its other form, a JSON array of bodies.
const ARRAY_LOG: &str = "request log converted from the capture, as a JSON array";

/// A request log as a pretty-printed JSON array of bodies (an element spans many lines).
fn array_log(entries: &[ctxsim::recording::RequestLogEntry]) -> Vec<u8> {
    let bodies: Vec<&Value> = entries.iter().map(|e| &e.body).collect();
    let mut text = serde_json::to_vec_pretty(&bodies).unwrap();
    text.push(b'\n');
    text
}

/// Whether the reader's input is line-oriented (JSONL, CSV, a JSON-array log whose elements
/// are named by their line): then every error names the line.
fn line_oriented(seed: &Seed) -> bool {
    matches!(seed.kind, Kind::Jsonl | Kind::Csv) || seed.name == ARRAY_LOG
}

fn baseline_seed() -> Vec<u8> {
    use ctxsim::report::check::{BASELINE_VERSION, Baseline, BaselineEntry, BreakRecord};
    let entry = BaselineEntry {
        file: "scenarios/read-and-answer.yaml".into(),
        requests: 4,
        cache_hit_ratio: 0.8125,
        cost_usd: 0.0421,
        cache_breaks: 1,
        compactions: [("auto".to_owned(), 0), ("microcompact".to_owned(), 1)].into_iter().collect(),
        peak_context_tokens: 23_456,
        fingerprint: "ab".repeat(32),
        breaks: vec![BreakRecord { index: 2, lane: "main".into(), diverged_at: Some("messages[3]".into()), cause: Some("session_resumed".into()) }],
    };
    let scenarios = [("read-and-answer".to_owned(), entry.clone()), ("git-status".to_owned(), entry)].into_iter().collect();
    Baseline { version: BASELINE_VERSION, estimator: Some("bpe".into()), strategy: Some("claude-code".into()), session_engine: None, scenarios }.to_json()
}

/// Line spans (start, end without the `\n`) of the input.
fn lines(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut start = 0;
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'\n' {
            spans.push((start, i));
            start = i + 1;
        }
    }
    if start < bytes.len() {
        spans.push((start, bytes.len()));
    }
    spans
}

/// A value of another JSON type than `value`'s.
fn other_type(value: &Value, rng: &mut Rng) -> Value {
    let choices = [Value::Null, Value::Bool(true), serde_json::json!(-7), serde_json::json!("text"), serde_json::json!([1]), serde_json::json!({"k": 1})];
    loop {
        let candidate = choices[rng.below(choices.len())].clone();
        if std::mem::discriminant(&candidate) != std::mem::discriminant(value) {
            return candidate;
        }
    }
}

/// Visits the nodes of `value` in order; `pick` chooses one by index and `change` rewrites it.
fn nth_node(value: &mut Value, n: &mut usize, change: &mut dyn FnMut(&mut Value)) -> bool {
    if *n == 0 {
        change(value);
        return true;
    }
    *n -= 1;
    match value {
        Value::Array(items) => items.iter_mut().any(|v| nth_node(v, n, change)),
        Value::Object(map) => map.values_mut().any(|v| nth_node(v, n, change)),
        _ => false,
    }
}

fn count_nodes(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(count_nodes).sum(),
        Value::Object(map) => map.values().map(count_nodes).sum(),
        _ => 0,
    }
}

/// Rewrites one node of a JSON text; `None` when the text is not JSON.
fn mutate_json(text: &[u8], rng: &mut Rng, change: &mut dyn FnMut(&mut Value, &mut Rng)) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(text).ok()?;
    let mut n = rng.below(count_nodes(&value));
    nth_node(&mut value, &mut n, &mut |v| change(v, rng));
    Some(serde_json::to_vec(&value).unwrap())
}

/// One mutation: its class, the bytes, and whether it certainly damaged the input (so a
/// reader must report it) or may have left a valid input.
struct Mutant {
    class: &'static str,
    bytes: Vec<u8>,
    damaged: bool,
}

const CLASSES: &[&str] =
    &["truncate", "invalid_utf8", "wrong_type", "bom", "huge_value", "deep_nesting", "duplicate_line", "delete_line", "garbage_line", "empty"];

fn mutate(seed: &Seed, class: &'static str, rng: &mut Rng) -> Mutant {
    let bytes = &seed.bytes;
    let spans = lines(bytes);
    let json_based = matches!(seed.kind, Kind::Jsonl | Kind::Json);
    let mutant = |bytes: Vec<u8>, damaged: bool| Mutant { class, bytes, damaged };
    match class {
        "truncate" => {
            let cut = 1 + rng.below(bytes.len() - 1);
            let out = bytes[..cut].to_vec();
            // Cut inside a line of a JSONL input: that line is lost unless what is left of it
            // is still a whole JSON value.
            let damaged = seed.kind == Kind::Jsonl && {
                let start = out.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
                let last = &out[start..];
                !last.iter().all(u8::is_ascii_whitespace) && serde_json::from_slice::<Value>(last).is_err()
            };
            mutant(out, damaged)
        }
        "invalid_utf8" => {
            let mut out = bytes.clone();
            let bad: &[u8] = [&b"\xFF"[..], b"\xC3", b"\xED\xA0\x80", b"\xF8\x88\x80\x80\x80"][rng.below(4)];
            let at = rng.below(out.len() + 1);
            out.splice(at..at, bad.iter().copied());
            mutant(out, true)
        }
        "wrong_type" => {
            if json_based {
                let (start, end) = match seed.kind {
                    Kind::Json => (0, bytes.len()),
                    _ => spans[rng.below(spans.len())],
                };
                if let Some(changed) = mutate_json(&bytes[start..end], rng, &mut |v, rng| *v = other_type(v, rng)) {
                    let mut out = bytes[..start].to_vec();
                    out.extend(changed);
                    out.extend(&bytes[end..]);
                    return mutant(out, false);
                }
            }
            // Text formats: a number becomes a string, or a string a number.
            let text = String::from_utf8_lossy(bytes).into_owned();
            let digits: Vec<usize> = text.match_indices(|c: char| c.is_ascii_digit()).map(|(i, _)| i).collect();
            let at = digits[rng.below(digits.len())];
            let end = text[at..].find(|c: char| !c.is_ascii_digit() && c != '.').map_or(text.len(), |n| at + n);
            mutant(format!("{}\"x{}\"{}", &text[..at], &text[at..end], &text[end..]).into_bytes(), false)
        }
        "bom" => {
            let mut out = b"\xEF\xBB\xBF".to_vec();
            out.extend(bytes);
            mutant(out, false)
        }
        "huge_value" => {
            let huge = "A".repeat(150_000 + rng.below(100_000));
            if seed.kind == Kind::Jsonl {
                let (start, end) = spans[rng.below(spans.len())];
                if let Some(changed) = mutate_json(&bytes[start..end], rng, &mut |v, _| {
                    if !v.is_object() && !v.is_array() {
                        *v = Value::String(huge.clone());
                    }
                }) {
                    let mut out = bytes[..start].to_vec();
                    out.extend(changed);
                    out.extend(&bytes[end..]);
                    return mutant(out, false);
                }
            }
            // A huge token in a random line (it is a value or breaks the syntax).
            let (start, _) = spans[rng.below(spans.len())];
            let mut out = bytes.clone();
            out.splice(start..start, huge.into_bytes());
            mutant(out, false)
        }
        "deep_nesting" => {
            let depth = 2_000 + rng.below(3_000);
            let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            let (start, _) = spans[rng.below(spans.len())];
            let mut out = bytes[..start].to_vec();
            out.extend(nested.as_bytes());
            out.push(b'\n');
            out.extend(&bytes[start..]);
            // A line of nested arrays is no record of any JSON or TOML reader.
            mutant(out, json_based || seed.kind == Kind::Toml)
        }
        "duplicate_line" => {
            let (start, end) = spans[rng.below(spans.len())];
            let mut out = bytes[..end].to_vec();
            out.push(b'\n');
            out.extend(&bytes[start..]);
            mutant(out, false)
        }
        "delete_line" => {
            let (start, end) = spans[rng.below(spans.len())];
            let mut out = bytes[..start].to_vec();
            out.extend(&bytes[(end + 1).min(bytes.len())..]);
            if out.iter().all(u8::is_ascii_whitespace) {
                return mutant(out, true);
            }
            mutant(out, false)
        }
        "garbage_line" => {
            let garbage = ["not json at all", "{\"broken\": ", "]", "{\"event\": 42}", "\u{0}\u{1}"][rng.below(5)];
            let at = spans[rng.below(spans.len())].0;
            let mut out = bytes[..at].to_vec();
            out.extend(garbage.as_bytes());
            out.push(b'\n');
            out.extend(&bytes[at..]);
            // YAML can take a plain line as part of a multi-line scalar; every other format
            // must refuse or report it.
            mutant(out, seed.kind != Kind::Yaml)
        }
        "empty" => mutant([&b""[..], b"\n", b"  \n\n\t\n", b"\xEF\xBB\xBF"][rng.below(4)].to_vec(), true),
        other => panic!("unknown class {other}"),
    }
}

/// A refusal, or a warning about a bad or cut line (real transcripts hold records of kinds the
/// importer skips on purpose, each reported as `ignored`; those are not damage).
fn reports_damage(outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Read { warnings, suppressed, .. } => *suppressed > 0 || warnings.iter().any(|w| w.kind != WarningKind::Ignored),
        Outcome::Rejected(_) => true,
    }
}

/// Runs a reader on one mutant and checks what the reader itself cannot know: a damaged
/// input is reported, a byte-order mark changes nothing.
fn check_mutant(seed: &Seed, mutant: &Mutant, clean: &Outcome) -> Outcome {
    let reader = fuzzing::reader(seed.reader).unwrap();
    let outcome = std::panic::catch_unwind(|| reader(&mutant.bytes)).unwrap_or_else(|_| {
        panic!("{} panicked on a `{}` mutant of {} ({} bytes)", seed.reader, mutant.class, seed.name, mutant.bytes.len())
    });
    if mutant.damaged {
        assert!(
            reports_damage(&outcome),
            "{}: a `{}` mutant of {} lost input without a warning: {outcome:?}\ninput: {}",
            seed.reader,
            mutant.class,
            seed.name,
            ctxsim::input::excerpt(&String::from_utf8_lossy(&mutant.bytes))
        );
    }
    if mutant.class == "bom" {
        assert_eq!(&outcome, clean, "{}: a byte-order mark changed how {} reads", seed.reader, seed.name);
    }
    outcome
}

#[test]
fn robustness_every_reader_reports_what_it_drops() {
    let seeds = seeds();
    let mut rng = Rng(0x1514_0c75_1d00_0014);
    let mut total = 0;
    let mut by_reader: std::collections::BTreeMap<&str, (usize, usize)> = Default::default();
    for seed in &seeds {
        let clean = fuzzing::reader(seed.reader).unwrap()(&seed.bytes);
        // Several seeds share a reader; every reader gets about the same number of mutants.
        let per_seed = 440 / seeds.iter().filter(|s| s.reader == seed.reader).count();
        for i in 0..per_seed {
            let class = CLASSES[i % CLASSES.len()];
            // Huge values cost a copy of 250 KB each: one in four classes' turns is enough.
            if class == "huge_value" && i % (4 * CLASSES.len()) != CLASSES.iter().position(|c| *c == "huge_value").unwrap() {
                continue;
            }
            let mutant = mutate(seed, class, &mut rng);
            let outcome = check_mutant(seed, &mutant, &clean);
            total += 1;
            let counts = by_reader.entry(seed.reader).or_default();
            counts.0 += 1;
            counts.1 += usize::from(outcome.dropped_something());
        }
    }
    println!("robustness: {total} mutated inputs over {} readers (reader: inputs, reported): {by_reader:?}", by_reader.len());
    assert!(total >= 5_000, "only {total} mutated inputs");
    assert_eq!(by_reader.len(), fuzzing::READERS.len(), "a reader without mutants");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

    /// The fuzz targets' harnesses on arbitrary bytes (the fuzz campaign's job, a little of it in
    /// CI): they check their own promises and panic when one breaks.
    #[test]
    fn robustness_harnesses_hold_on_arbitrary_bytes(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        for (_, reader) in fuzzing::READERS {
            reader(&data);
        }
    }

    /// The same on arbitrary JSON-ish lines: records close enough to the real ones to reach the
    /// field checks.
    #[test]
    fn robustness_harnesses_hold_on_json_lines(lines in proptest::collection::vec("[{}\\[\\]\":,a-z0-9 ]{0,40}", 1..6)) {
        let data = lines.join("\n");
        for (_, reader) in fuzzing::READERS {
            reader(data.as_bytes());
        }
    }
}

/// A command line per reader, over a mutated file, with `--strict`: exit 0 only when the reader
/// dropped nothing (then 1 or a 2 about something other than reading may follow, e.g. an
/// unknown model), 2 naming the file and line when it dropped something.
fn cli_args(reader: &str, file: &Path, dir: &Path) -> Option<Vec<String>> {
    let f = file.display().to_string();
    let log = dir.join("log.jsonl").display().to_string();
    let out = dir.join("out").display().to_string();
    let args: Vec<&str> = match reader {
        "recording" | "transcript" => vec!["replay", &f, "--estimator", "chars4", "--quiet"],
        "request_log" => vec!["analyze", &f, "--estimator", "chars4", "--quiet"],
        "claude_trace" => vec!["analyze", "--from", "claude-trace", &f, "--estimator", "chars4", "--quiet"],
        "shapes" => vec!["diff-requests", &f, &f],
        "model_table" => vec!["analyze", &log, "--model-table", &f, "--estimator", "chars4", "--quiet"],
        "calibration" => vec!["analyze", &log, "--calibration", &f, "--estimator", "calibrated", "--quiet"],
        "sweep_csv" => vec!["sweep", "--merge", &f, "--out", &out, "--quiet"],
        "trace" => vec!["report", &f, "--out", &out, "--quiet"],
        "scenario" => vec!["run", &f, "--estimator", "chars4", "--quiet"],
        _ => return None,
    };
    Some(args.into_iter().map(str::to_owned).chain(["--strict".to_owned()]).collect())
}

#[test]
fn robustness_the_binary_exits_2_naming_the_line_of_what_it_dropped() {
    let seeds = seeds();
    let dir = tempfile::tempdir().unwrap();
    let log = seeds.iter().find(|s| s.reader == "request_log").unwrap();
    std::fs::write(dir.path().join("log.jsonl"), &log.bytes).unwrap();
    let mut rng = Rng(0x0c71_0014);
    let (mut runs, mut dropped, mut exit_2_lines) = (0, 0, 0);
    for seed in &seeds {
        let extension = match seed.kind {
            Kind::Jsonl => "jsonl",
            Kind::Json => "json",
            Kind::Toml => "toml",
            Kind::Yaml => "yaml",
            Kind::Csv => "csv",
        };
        let file = dir.path().join(format!("input-{}.{extension}", seed.reader));
        // The array log also goes through the classes that change a field (its elements' lines).
        let classes: &[&str] = if seed.name == ARRAY_LOG {
            &["wrong_type", "truncate", "garbage_line", "invalid_utf8", "deep_nesting", "wrong_type", "bom"]
        } else {
            &["truncate", "invalid_utf8", "bom", "garbage_line", "empty", "duplicate_line", "deep_nesting"]
        };
        let Some(args) = cli_args(seed.reader, &file, dir.path()) else { continue };
        let per_seed = 30_usize.div_ceil(seeds.iter().filter(|s| s.reader == seed.reader).count());
        for i in 0..per_seed {
            // The classes whose reading is certain (the others' outcome depends on which
            // field changed, which the in-process suite covers).
            let class = classes[i % classes.len()];
            let mutant = mutate(seed, class, &mut rng);
            // The file is named in messages by its path, not by the harness's name.
            let outcome = fuzzing::reader(seed.reader).unwrap()(&mutant.bytes);
            std::fs::write(&file, &mutant.bytes).unwrap();
            let output = Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(&args).output().unwrap();
            let code = output.status.code();
            let stderr = String::from_utf8_lossy(&output.stderr);
            let name = file.display().to_string();
            let context = || format!("{} on a `{class}` mutant of {} ({args:?}): exit {code:?}\n{}", seed.reader, seed.name, ctxsim::input::excerpt(&stderr));
            assert!(stderr.len() < 20_000, "stderr too long: {}", context());
            runs += 1;
            let names_line = stderr.match_indices(&format!("{name}:")).any(|(i, m)| stderr[i + m.len()..].starts_with(|c: char| c.is_ascii_digit()))
                || (stderr.contains(&name) && stderr.contains("line "))
                || stderr.contains("empty");
            if code == Some(2) && line_oriented(seed) {
                // Every exit 2 about a line-oriented input names its line, dropped or not.
                exit_2_lines += 1;
                assert!(names_line, "an exit-2 message about a line-oriented input names no line: {}", context());
            }
            if outcome.dropped_something() {
                dropped += 1;
                assert_eq!(code, Some(2), "{}", context());
                assert!(names_line, "the message names no file and line: {}", context());
            } else {
                assert!(matches!(code, Some(0..=2)), "{}", context());
                if code == Some(2) {
                    assert!(stderr.contains("error:"), "{}", context());
                }
                if code == Some(0) {
                    // A sweep's `no effect on …` lines are its findings, not input it dropped.
                    let dropped_input = stderr.lines().any(|l| l.starts_with("warning:") && !l.starts_with("warning: no effect on"));
                    assert!(!dropped_input, "a warning with exit 0 under --strict: {}", context());
                }
            }
        }
    }
    println!("robustness (binary): {runs} runs, {dropped} with input dropped and exit 2, {exit_2_lines} exit-2 messages about line-oriented inputs (each naming the line)");
    assert!(runs >= 300, "only {runs} runs");
}

/// A JSON-array request log: an error about an element names the line the element starts on
/// (and its index), for every element, in the library and through the binary.
#[test]
fn robustness_a_json_array_log_names_the_line_of_each_element() {
    let capture = head(&realdata().join("api_captures/claude-trace/test-traffic.jsonl"), 40_000);
    let converted = ctxsim::recording::convert_claude_trace(std::io::Cursor::new(&capture), "capture").unwrap();
    let text = String::from_utf8(array_log(&converted.entries)).unwrap();
    // The line each element starts on: two spaces of indent and a `{` in the pretty printing.
    let starts: Vec<usize> = text.lines().enumerate().filter(|(_, l)| *l == "  {").map(|(n, _)| n + 1).collect();
    assert_eq!(starts.len(), converted.entries.len());
    assert!(starts.len() >= 3 && starts[1] > 2, "{starts:?}");
    let mut bodies: Vec<Value> = converted.entries.iter().map(|e| e.body.clone()).collect();
    let dir = tempfile::tempdir().unwrap();
    for (i, &line) in starts.iter().enumerate() {
        let kept = std::mem::replace(&mut bodies[i]["messages"], Value::from(5));
        let mut bad = serde_json::to_vec_pretty(&bodies).unwrap();
        bad.push(b'\n');
        bodies[i]["messages"] = kept;
        let ctxsim::fuzzing::Outcome::Rejected(message) = fuzzing::request_log(&bad) else { panic!("element {i}: not refused") };
        assert!(message.contains(&format!("{}:{line}:", fuzzing::FILE)) && message.contains(&format!("[{i}]")), "element {i} at line {line}: {message}");
        // Through the binary, with blank lines before the array (the lines count from the file's
        // first line).
        if i == starts.len() - 1 {
            let file = dir.path().join("array.json");
            let mut shifted = b"\n\n".to_vec();
            shifted.extend(&bad);
            std::fs::write(&file, &shifted).unwrap();
            let output = Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(["analyze", file.to_str().unwrap(), "--estimator", "chars4"]).output().unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{stderr}");
            assert!(stderr.contains(&format!("{}:{}:", file.display(), line + 2)) && stderr.contains(&format!("[{i}]")), "{stderr}");
        }
    }
    // A malformed array names the line (and column) where the JSON breaks.
    let cut = format!("\n{}", &text[..text.len() / 2]);
    let ctxsim::fuzzing::Outcome::Rejected(message) = fuzzing::request_log(cut.as_bytes()) else { panic!("a cut array was read") };
    let last_line = cut.lines().count();
    assert!(message.contains(&format!("{}:{last_line}:", fuzzing::FILE)) && message.contains("column"), "{message}");
}

/// The JSON summary carries what was skipped, with file, line and field.
#[test]
fn robustness_warnings_reach_the_json_summary_and_strict_fails() {
    let dir = tempfile::tempdir().unwrap();
    let recording = head(&repo().join("recordings/entireio-7662d755ef9f-2.jsonl"), 8_000);
    let mut text = String::from_utf8(recording).unwrap();
    text.push_str("{\"event\":\"time\",\"advance_ms\":\"soon\"}\n");
    let file = dir.path().join("bad.jsonl");
    std::fs::write(&file, &text).unwrap();
    let bad_line = text.lines().count();
    let run = |extra: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_ctxsim"))
            .args(["replay", file.to_str().unwrap(), "--estimator", "chars4", "--format", "json"])
            .args(extra)
            .output()
            .unwrap();
        (output.status.code(), String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let (code, stdout, stderr) = run(&[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains(&format!("{}:{bad_line}: skipped bad line at `advance_ms`", file.display())), "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    let warning = &summary["warnings"][0];
    assert_eq!(warning["file"], file.display().to_string());
    assert_eq!(warning["line"], bad_line);
    assert_eq!(warning["field"], "advance_ms");
    assert!(warning["message"].as_str().unwrap().contains("invalid type"), "{warning}");
    let (code, _, stderr) = run(&["--strict"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--strict: 1 input warnings"), "{stderr}");
}

/// Issue 14's reported losses, one by one.
#[test]
fn robustness_issue_14_empty_and_garbage_inputs_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.jsonl");
    std::fs::write(&garbage, "this is not a capture\n{also not\n").unwrap();
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let ctxsim = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(args).output().unwrap();
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let g = garbage.to_str().unwrap();
    let e = empty.to_str().unwrap();
    for args in [
        vec!["analyze", "--from", "claude-trace", e],
        vec!["analyze", "--from", "claude-trace", g],
        vec!["analyze", e],
        vec!["diff-requests", g, g],
        vec!["diff-requests", e, e],
        vec!["replay", e],
        vec!["import", "--from", "claude-code", e, "-o", "/dev/null/never"],
    ] {
        let (code, stderr) = ctxsim(&args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("empty.jsonl") || stderr.contains("garbage.jsonl:1"), "{args:?}: {stderr}");
    }
    // A byte-order mark is not an error, and invalid UTF-8 is located.
    let models = std::fs::read_to_string(repo().join("data/models.toml")).unwrap();
    let table = dir.path().join("models.toml");
    std::fs::write(&table, format!("\u{feff}{models}")).unwrap();
    assert!(ctxsim::measure::ModelTable::load(&table).is_ok());
    let mut bytes = models.into_bytes();
    let second_line = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
    bytes.insert(second_line, b'x');
    bytes.insert(second_line + 1, 0xFF);
    std::fs::write(&table, &bytes).unwrap();
    let message = ctxsim::measure::ModelTable::load(&table).unwrap_err().to_string();
    assert!(message.contains(&format!("{}:2:2: invalid UTF-8", table.display())), "{message}");
    // A huge line is never echoed whole.
    std::fs::write(&table, format!("[[model]]\nid = \"{}", "x".repeat(1_000_000))).unwrap();
    let message = ctxsim::measure::ModelTable::load(&table).unwrap_err().to_string();
    assert!(message.len() < 400 && message.contains("line 2"), "{}", ctxsim::input::excerpt(&message));
}

/// `sweep --merge` names the file and line of a duplicated point, and of the row a missing one
/// should follow (and the files given).
#[test]
fn robustness_sweep_merge_blames_the_right_file() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("reports/sweep/sweep.csv")).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    let (a, b) = (dir.path().join("a.csv"), dir.path().join("b.csv"));
    std::fs::write(&a, lines.join("\n") + "\n").unwrap();
    // b repeats point 5 (line 8 of a) on its line 3.
    std::fs::write(&b, format!("{}\n{}\n{}\n", lines[0], lines[1], lines[7])).unwrap();
    let err = ctxsim::report::sweep::merge(&[a.clone(), b.clone()]).unwrap_err().to_string();
    assert!(err.starts_with(&format!("{}:3: point 5 is duplicated (also at {}:8", b.display(), a.display())), "{err}");
    lines.remove(7);
    std::fs::write(&a, lines.join("\n") + "\n").unwrap();
    let err = ctxsim::report::sweep::merge(std::slice::from_ref(&a)).unwrap_err().to_string();
    assert!(err.starts_with(&format!("{}:7: point 5 is missing after point 4 here: the shards {}", a.display(), a.display())), "{err}");
    std::fs::write(&b, format!("{}\n{}\nfive,1\n", lines[0], lines[1])).unwrap();
    let err = ctxsim::report::sweep::merge(&[a, b.clone()]).unwrap_err().to_string();
    assert!(err.starts_with(&format!("{}:3:", b.display())), "{err}");
}

/// A parse error's JSON path holds the input's map keys: a key as long as the input is cut in
/// the message like a quote (found by the `baseline` fuzz target, 2026-12-02: a 1 KB key made a
/// 2 KB message).
#[test]
fn robustness_a_huge_map_key_is_cut_in_the_error_path() {
    let key = "k".repeat(5_000);
    let cases: [(&str, String, &str); 2] = [
        ("baseline", format!(r#"{{"version": 1, "scenarios": {{"{key}": 5}}}}"#), "scenarios.kkk"),
        ("calibration", format!(r#"{{"families": {{"{key}": 5}}}}"#), "families.kkk"),
    ];
    for (reader, input, path) in cases {
        // The harness itself panics on a message over fuzzing::MAX_MESSAGE.
        let Outcome::Rejected(message) = fuzzing::reader(reader).unwrap()(input.as_bytes()) else { panic!("{reader}: read") };
        assert!(message.len() <= 600, "{reader}: {} bytes: {}", message.len(), ctxsim::input::excerpt(&message));
        assert!(message.contains(path) && message.contains("bytes in all"), "{reader}: {message}");
    }
}
