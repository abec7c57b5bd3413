//! Reliability of what ctxsim writes and how long it runs (docs/reliability.md, "Writes,
//! confinement, time and validation"): outputs never destroyed, inputs never overwritten,
//! generations swapped whole, numbers range-checked at load, closed pipes quiet.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::json;

use crate::support::scenario;

/// Runs ctxsim in `dir`; the output.
fn check_ctxsim(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ctxsim")).current_dir(dir).args(args).output().unwrap()
}

fn code_and_stderr(out: &Output) -> (i32, String) {
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A temporary directory with `a.yaml` (a passing scenario) in it.
fn with_scenario() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.yaml"), scenario("a", "  max_requests: 5\n")).unwrap();
    dir
}

#[cfg(unix)]
#[test]
fn a_trace_to_dev_null_leaves_the_device_a_device() {
    use std::os::unix::fs::FileTypeExt;
    let dir = with_scenario();
    let out = check_ctxsim(dir.path(), &["run", "a.yaml", "--estimator", "chars4", "--quiet", "--trace", "/dev/null"]);
    assert_eq!(code_and_stderr(&out).0, 0, "{}", code_and_stderr(&out).1);
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device(), "/dev/null was replaced");
    // Nothing was left beside it either.
    assert!(!std::fs::read_dir("/dev").unwrap().filter_map(Result::ok).any(|e| e.file_name().to_string_lossy().starts_with(".ctxsim-tmp")));
}

#[cfg(unix)]
#[test]
fn a_symlink_output_stays_a_symlink_and_a_fifo_is_written_in_place() {
    let dir = with_scenario();
    let target = dir.path().join("real-trace.jsonl");
    std::fs::write(&target, "old\n").unwrap();
    std::os::unix::fs::symlink("real-trace.jsonl", dir.path().join("link.jsonl")).unwrap();
    let out = check_ctxsim(dir.path(), &["run", "a.yaml", "--estimator", "chars4", "--quiet", "--trace", "link.jsonl"]);
    assert_eq!(code_and_stderr(&out).0, 0, "{}", code_and_stderr(&out).1);
    assert!(std::fs::symlink_metadata(dir.path().join("link.jsonl")).unwrap().file_type().is_symlink(), "the link was replaced");
    let written = std::fs::read_to_string(&target).unwrap();
    assert!(written.lines().count() >= 2 && written.contains("\"lane\""), "{written}");

    // A FIFO: the trace streams through it to a reader, the FIFO stays a FIFO.
    use std::os::unix::fs::FileTypeExt;
    let fifo = dir.path().join("trace.fifo");
    let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let out = check_ctxsim(dir.path(), &["run", "a.yaml", "--estimator", "chars4", "--quiet", "--trace", "trace.fifo"]);
    assert_eq!(code_and_stderr(&out).0, 0, "{}", code_and_stderr(&out).1);
    assert!(reader.join().unwrap().contains("\"lane\""));
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
}

#[test]
fn no_command_writes_over_its_own_input() {
    let dir = with_scenario();
    let real = super::support::realdata().join("transcripts/entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    let copy = dir.path().join("session.jsonl");
    std::fs::copy(&real, &copy).unwrap();
    let before = std::fs::read(&copy).unwrap();
    std::fs::write(dir.path().join("log.jsonl"), "{\"time_ms\": 0, \"body\": {\"model\": \"claude-sonnet-4-5\", \"max_tokens\": 10, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}}\n").unwrap();
    std::os::unix::fs::symlink("a.yaml", dir.path().join("alias.yaml")).unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["import", "session.jsonl", "-o", "session.jsonl"],
        vec!["import", "session.jsonl", "-o", "./sub/../session.jsonl"],
        vec!["run", "a.yaml", "--estimator", "chars4", "--trace", "a.yaml"],
        vec!["run", "a.yaml", "--estimator", "chars4", "--trace", "alias.yaml"],
        vec!["analyze", "log.jsonl", "--estimator", "chars4", "--trace", "log.jsonl"],
        vec!["replay", "session.jsonl", "--estimator", "chars4", "--trace", "session.jsonl"],
        vec!["diff-requests", "log.jsonl", "log.jsonl", "--shapes-out", "log.jsonl"],
        vec!["fidelity", "session.jsonl", "--fit", "session.jsonl"],
        vec!["check", "a.yaml", "--estimator", "chars4", "--junit", "a.yaml"],
        vec!["report", "log.jsonl", "--out", "."],
        vec!["audit", "session.jsonl", "--estimator", "chars4", "--no-progress", "--csv", "--output", "session.jsonl"],
    ];
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    for args in cases {
        let a_before = std::fs::read(dir.path().join("a.yaml")).unwrap();
        let log_before = std::fs::read(dir.path().join("log.jsonl")).unwrap();
        let out = check_ctxsim(dir.path(), &args);
        let (code, stderr) = code_and_stderr(&out);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains("never writes over its own input") || stderr.contains("current directory"), "{args:?}: {stderr}");
        assert_eq!(std::fs::read(&copy).unwrap(), before, "{args:?}");
        assert_eq!(std::fs::read(dir.path().join("a.yaml")).unwrap(), a_before, "{args:?}");
        assert_eq!(std::fs::read(dir.path().join("log.jsonl")).unwrap(), log_before, "{args:?}");
    }
    // A directory output whose new generation would replace an input is refused too, before
    // the swap: `report --out rep` writes rep/index.html, here also its input.
    let made = check_ctxsim(dir.path(), &["run", "a.yaml", "--estimator", "chars4", "--quiet", "--trace", "t.jsonl"]);
    assert!(made.status.success());
    std::fs::create_dir(dir.path().join("rep")).unwrap();
    std::fs::copy(dir.path().join("t.jsonl"), dir.path().join("rep/index.html")).unwrap();
    let trace = std::fs::read(dir.path().join("t.jsonl")).unwrap();
    let out = check_ctxsim(dir.path(), &["report", "rep/index.html", "--out", "rep", "--quiet"]);
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("would replace the input"), "{stderr}");
    assert_eq!(std::fs::read(dir.path().join("rep/index.html")).unwrap(), trace);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().contains("ctxsim-new")).count(), 0);
}

#[test]
fn update_baseline_writes_only_after_a_pass_merges_by_scenario_and_records_how_it_measured() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("suite")).unwrap();
    std::fs::write(dir.path().join("suite/a.yaml"), scenario("a", "  max_requests: 5\n")).unwrap();
    std::fs::write(dir.path().join("suite/b.yaml"), scenario("b", "  max_requests: 5\n")).unwrap();
    let check = |args: &[&str]| {
        let mut all = vec!["check"];
        all.extend_from_slice(args);
        code_and_stderr(&check_ctxsim(dir.path(), &all))
    };
    let (code, stderr) = check(&["suite", "--estimator", "chars4", "--baseline", "base.json", "--update-baseline"]);
    assert_eq!(code, 0, "{stderr}");
    let read = || -> serde_json::Value { serde_json::from_slice(&std::fs::read(dir.path().join("base.json")).unwrap()).unwrap() };
    let full = read();
    assert_eq!(full["estimator"], "chars4");
    assert_eq!(full["strategy"], "claude-code");
    assert_eq!(full["scenarios"].as_object().unwrap().keys().collect::<Vec<_>>(), ["a", "b"]);

    // A subset update keeps the other scenario's entry.
    let (code, stderr) = check(&["suite/a.yaml", "--estimator", "chars4", "--baseline", "base.json", "--update-baseline"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(read(), full);

    // A failing run does not write.
    std::fs::write(dir.path().join("suite/b.yaml"), scenario("b", "  max_requests: 1\n")).unwrap();
    let (code, stderr) = check(&["suite", "--estimator", "chars4", "--baseline", "base.json", "--update-baseline"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("baseline not written"), "{stderr}");
    assert_eq!(read(), full);

    // Another estimator: a clear error naming it, not a regression.
    std::fs::write(dir.path().join("suite/b.yaml"), scenario("b", "  max_requests: 5\n")).unwrap();
    let (code, stderr) = check(&["suite", "--estimator", "bpe", "--baseline", "base.json"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("base.json") && stderr.contains("estimator `chars4`") && stderr.contains("`bpe`"), "{stderr}");
    let (code, stderr) = check(&["suite", "--estimator", "chars4", "--baseline", "base.json", "--disable-stage", "autocompact"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("strategy `claude-code`"), "{stderr}");
}

#[test]
fn serve_opens_its_log_only_after_binding() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("script.json"), json!({"main": [{"content": "one"}]}).to_string()).unwrap();
    std::fs::create_dir(dir.path().join("log")).unwrap();
    std::fs::write(dir.path().join("log/requests.jsonl"), "previous run\n").unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = check_ctxsim(dir.path(), &["serve", "--script", "script.json", "--port", &port, "--log", "log", "--estimator", "chars4"]);
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("failed to listen"), "{stderr}");
    assert_eq!(std::fs::read_to_string(dir.path().join("log/requests.jsonl")).unwrap(), "previous run\n");
}

/// Files by relative path, with their bytes.
type Files = BTreeMap<String, Vec<u8>>;

/// Every file under `dir` (relative path → bytes).
fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    if !dir.exists() {
        return out;
    }
    for entry in walkdir::WalkDir::new(dir).into_iter().filter_map(Result::ok) {
        if entry.file_type().is_file() {
            out.insert(entry.path().strip_prefix(dir).unwrap().display().to_string(), std::fs::read(entry.path()).unwrap());
        }
    }
    out
}

/// Starts `args` in `dir`, kills it (SIGKILL) after each of `delays_ms` in turn, and checks
/// after every kill that `observe` shows the previous output or the complete new one.
fn check_killed_runs(dir: &Path, args: &[&str], delays_ms: &[u64], observe: &dyn Fn() -> BTreeMap<String, Vec<u8>>, complete: &BTreeMap<String, Vec<u8>>) -> (usize, usize) {
    let whole = |after: &BTreeMap<String, Vec<u8>>| after == complete;
    check_killed_runs_with(dir, args, delays_ms, observe, &whole, &|_| Box::new(()))
}

/// [`check_killed_runs`] with the new output judged by `whole` (an output written as the run
/// goes may be one of several whole generations) and each command prepared by `setup` (its
/// result lives until the kill).
fn check_killed_runs_with(
    dir: &Path,
    args: &[&str],
    delays_ms: &[u64],
    observe: &dyn Fn() -> Files,
    whole: &dyn Fn(&Files) -> bool,
    setup: &dyn Fn(&mut Command) -> Box<dyn std::any::Any>,
) -> (usize, usize) {
    let (mut old_seen, mut new_seen) = (0, 0);
    for &delay in delays_ms {
        let before = observe();
        let mut command = Command::new(env!("CARGO_BIN_EXE_ctxsim"));
        command.current_dir(dir).args(args).stdout(Stdio::null()).stderr(Stdio::null());
        let guard = setup(&mut command);
        let mut child = command.spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay));
        let _ = child.kill();
        let _ = child.wait();
        drop(guard);
        let after = observe();
        if after == before {
            old_seen += 1;
        } else {
            assert!(whole(&after), "{args:?} killed after {delay} ms left a half-written output: {:?}", after.keys());
            new_seen += 1;
        }
    }
    (old_seen, new_seen)
}

/// Kill moments spread over `span_ms` (a fixed pseudo-random sequence: the test is the same on
/// every run).
fn kill_moments(span_ms: u64, count: usize) -> Vec<u64> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..count)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % span_ms.max(1)
        })
        .collect()
}

/// Time of one uninterrupted run, in ms.
fn timed(dir: &Path, args: &[&str]) -> u64 {
    let start = std::time::Instant::now();
    let out = check_ctxsim(dir, args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    start.elapsed().as_millis() as u64
}

/// Kills each directory writer (`args`, output directory) at `kills` moments over its run
/// time; its previous generation holds a file of its own, which must survive too. The number
/// of kills.
fn check_killed_dir_writers(dir: &Path, writers: &[(Vec<&str>, &str)], kills: usize) -> usize {
    let mut total = 0;
    for (args, out) in writers {
        let path = dir.join(out);
        let previous = || {
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap();
            std::fs::write(path.join("kept.txt"), "a file of the previous generation\n").unwrap();
        };
        previous();
        let span = timed(dir, args);
        let complete = tree(&path);
        assert!(complete.contains_key("kept.txt") && complete.len() > 1, "{args:?}: {:?}", complete.keys());
        // Back to an older generation, then killed runs.
        previous();
        let (old, new) = check_killed_runs(dir, args, &kill_moments(span + span / 4, kills), &|| tree(&path), &complete);
        total += old + new;
        // No stale generation is left beside the output when the run finished.
        assert!(timed(dir, args) > 0);
        assert_eq!(tree(&path), complete);
    }
    total
}

/// Kills each file writer (`args`, output file) at `kills` moments over its run time. The
/// number of kills.
fn check_killed_file_writers(dir: &Path, writers: &[(Vec<&str>, &str)], kills: usize) -> usize {
    let mut total = 0;
    for (args, out) in writers {
        let path = dir.join(out);
        let span = timed(dir, args);
        let complete = BTreeMap::from([(out.to_string(), std::fs::read(&path).unwrap())]);
        std::fs::write(&path, "previous\n").unwrap();
        let observe = || BTreeMap::from([(out.to_string(), std::fs::read(&path).unwrap())]);
        let (old, new) = check_killed_runs(dir, args, &kill_moments(span + span / 4, kills), &observe, &complete);
        total += old + new;
    }
    total
}

#[test]
fn killed_writers_leave_the_previous_output_or_the_whole_new_one() {
    let dir = with_scenario();
    std::fs::write(dir.path().join("b.yaml"), scenario("b", "  max_requests: 5\n").replace("seed: 7", "seed: 8")).unwrap();
    let mut total = 0;
    // Directory outputs: `run --out` (and --dump-requests), `report --out`; the previous
    // generation holds a file of its own that must survive too.
    let writers: Vec<(Vec<&str>, &str)> = vec![
        (vec!["run", "a.yaml", "b.yaml", "--estimator", "chars4", "--quiet", "--out", "out"], "out"),
        (vec!["run", "a.yaml", "--estimator", "chars4", "--quiet", "--dump-requests", "dump"], "dump"),
        (vec!["report", "trace-in.jsonl", "--out", "rep", "--quiet"], "rep"),
        (vec!["compare", "a.yaml", "--strategies", "claude-code,codex", "--estimator", "chars4", "--quiet", "--out", "cmp"], "cmp"),
        (vec!["sweep", "a.yaml", "--param", "ttl_main=5m,1h", "--estimator", "chars4", "--quiet", "--threads", "1", "--out", "swp"], "swp"),
    ];
    let made = check_ctxsim(dir.path(), &["run", "a.yaml", "--estimator", "chars4", "--quiet", "--trace", "trace-in.jsonl"]);
    assert!(made.status.success());
    total += check_killed_dir_writers(dir.path(), &writers, 8);
    // File outputs: the trace, import's recording, the baseline.
    let file_writers: Vec<(Vec<&str>, &str)> = vec![
        (vec!["run", "a.yaml", "b.yaml", "--estimator", "chars4", "--quiet", "--trace", "t.jsonl"], "t.jsonl"),
        (vec!["import", "session.jsonl", "-o", "rec.jsonl", "--quiet"], "rec.jsonl"),
        (vec!["check", "a.yaml", "b.yaml", "--estimator", "chars4", "--quiet", "--baseline", "base.json", "--update-baseline"], "base.json"),
    ];
    std::fs::copy(super::support::realdata().join("transcripts/entireio-cli/a6e4c2a0fbd1-0.full.jsonl"), dir.path().join("session.jsonl")).unwrap();
    total += check_killed_file_writers(dir.path(), &file_writers, 6);
    assert_eq!(total, 5 * 8 + 3 * 6);
    // No temporary file or fresh generation left where a kill did not interrupt a write... the
    // ones a kill did leave are hidden siblings, never the output itself.
    for entry in std::fs::read_dir(dir.path()).unwrap().filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(".tmp"), "{name}");
    }
}

#[test]
fn killed_plot_fit_shapes_junit_and_audit_writers_leave_the_previous_output_or_the_whole_new_one() {
    let dir = with_scenario();
    std::fs::write(dir.path().join("b.yaml"), scenario("b", "  max_requests: 5\n").replace("seed: 7", "seed: 8")).unwrap();
    std::fs::copy(super::support::realdata().join("transcripts/entireio-cli/a6e4c2a0fbd1-0.full.jsonl"), dir.path().join("s.jsonl")).unwrap();
    let capture = super::support::realdata().join("api_captures/claude-trace/test-traffic.jsonl");
    let made = check_ctxsim(dir.path(), &["import", "--quiet", "--from", "claude-trace", capture.to_str().unwrap(), "-o", "log.jsonl"]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    // Directory outputs, each with a file of the previous generation that must survive.
    let dir_writers: Vec<(Vec<&str>, &str)> = vec![
        (vec!["fidelity", "s.jsonl", "--estimator", "chars4", "--plot", "plots"], "plots"),
        (vec!["audit", "s.jsonl", "--estimator", "chars4", "--no-progress", "--no-result-cache", "--out", "aud"], "aud"),
    ];
    let mut total = check_killed_dir_writers(dir.path(), &dir_writers, 8);
    let file_writers: Vec<(Vec<&str>, &str)> = vec![
        (vec!["fidelity", "s.jsonl", "--estimator", "chars4", "--fit", "fit.json"], "fit.json"),
        (vec!["diff-requests", "log.jsonl", "log.jsonl", "--shapes-out", "shapes.json"], "shapes.json"),
        (vec!["check", "a.yaml", "b.yaml", "--estimator", "chars4", "--quiet", "--junit", "junit.xml"], "junit.xml"),
        (vec!["audit", "s.jsonl", "--estimator", "chars4", "--no-progress", "--no-result-cache", "--csv", "--output", "audit.csv"], "audit.csv"),
    ];
    total += check_killed_file_writers(dir.path(), &file_writers, 6);
    assert_eq!(total, 2 * 8 + 4 * 6);
}

#[test]
fn killed_live_runs_leave_a_whole_recording_and_trace_of_the_calls_answered() {
    let dir = tempfile::tempdir().unwrap();
    let turns = 6;
    let yaml: String = (0..turns).fold("name: l\nworld:\n  model: claude-sonnet-4-5\nscript:\n".to_owned(), |acc, i| acc + &format!("  - user: \"turn {i}\"\n"));
    std::fs::write(dir.path().join("l.yaml"), yaml).unwrap();
    let replies: Vec<serde_json::Value> = (0..turns).map(|i| json!({"content": format!("reply {i}")})).collect();
    let script = json!({"main": replies}).to_string();
    // Each run talks to a fresh server on 127.0.0.1 (its script is consumed as it answers).
    let setup = |command: &mut Command| -> Box<dyn std::any::Any> {
        let script = ctxsim::live::Script::parse(&script, "script.json").unwrap();
        let handle = ctxsim::live::start(0, ctxsim::live::Service::new(script, super::support::measurer(), ctxsim::live::ServeOptions::default()).unwrap()).unwrap();
        command.env("ANTHROPIC_API_KEY", "test-key").env("ANTHROPIC_BASE_URL", handle.base_url());
        Box::new(handle)
    };
    let args = ["live", "l.yaml", "--estimator", "chars4", "--quiet", "--max-retries", "0", "--record", "rec.jsonl", "--trace", "trace.jsonl"];
    let started = std::time::Instant::now();
    let mut command = Command::new(env!("CARGO_BIN_EXE_ctxsim"));
    command.current_dir(dir.path()).args(args);
    let _server = setup(&mut command);
    let out = command.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let span = started.elapsed().as_millis() as u64;
    let observe = || tree(dir.path()).into_iter().filter(|(name, _)| name == "rec.jsonl" || name == "trace.jsonl").collect::<BTreeMap<_, _>>();
    let complete = observe();
    let events = |bytes: &[u8]| {
        let read = ctxsim::recording::format::read_recording_from(std::io::Cursor::new(bytes), "rec.jsonl").unwrap();
        assert!(read.warnings.list.is_empty() && read.warnings.suppressed == 0, "{:?}", read.warnings);
        read.recording.events
    };
    let complete_events = events(&complete["rec.jsonl"]);
    let complete_trace: Vec<&[u8]> = complete["trace.jsonl"].split_inclusive(|&b| b == b'\n').collect();
    assert_eq!(complete_trace.len(), turns);
    // A generation is whole when the recording reads without a warning and holds the first
    // events of the complete run, and the trace is the complete trace's first lines.
    let whole = |after: &BTreeMap<String, Vec<u8>>| {
        let recording_whole = match after.get("rec.jsonl") {
            Some(bytes) if bytes.as_slice() == b"previous\n" => true,
            Some(bytes) => {
                let got = events(bytes);
                got.len() <= complete_events.len() && got.iter().eq(complete_events.iter().take(got.len()))
            }
            None => false,
        };
        let trace_whole = match after.get("trace.jsonl") {
            Some(bytes) if bytes.as_slice() == b"previous\n" => true,
            Some(bytes) => {
                let lines: Vec<&[u8]> = bytes.split_inclusive(|&b| b == b'\n').collect();
                lines.len() <= complete_trace.len() && lines[..] == complete_trace[..lines.len()]
            }
            None => false,
        };
        recording_whole && trace_whole
    };
    let mut seen = (0, 0);
    for delay in kill_moments(span + span / 4, 8) {
        std::fs::write(dir.path().join("rec.jsonl"), "previous\n").unwrap();
        std::fs::write(dir.path().join("trace.jsonl"), "previous\n").unwrap();
        let (old, new) = check_killed_runs_with(dir.path(), &args, &[delay], &observe, &whole, &setup);
        seen = (seen.0 + old, seen.1 + new);
    }
    assert_eq!(seen.0 + seen.1, 8);
}

#[test]
fn killed_serve_leaves_whole_log_lines_and_the_previous_trace() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let requests = 8;
    let replies: Vec<serde_json::Value> = (0..requests).map(|i| json!({"content": format!("reply {i}")})).collect();
    std::fs::write(dir.path().join("script.json"), json!({"main": replies}).to_string()).unwrap();
    let args = ["serve", "--script", "script.json", "--log", "log", "--estimator", "chars4", "--quiet", "--max-requests", "8"];
    // Starts serve, sends the requests one after the other (on a thread, giving up when the
    // server is gone) and returns the child.
    let spawn = || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ctxsim")).current_dir(dir.path()).args(args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        let addr: Option<std::net::SocketAddr> = first.trim().strip_prefix("listening on http://").and_then(|a| a.parse().ok());
        let client = std::thread::spawn(move || {
            let Some(addr) = addr else { return };
            let mut messages = Vec::new();
            for i in 0..requests {
                messages.push(json!({"role": "user", "content": format!("question {i}")}));
                let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages}).to_string();
                let Ok(mut stream) = std::net::TcpStream::connect(addr) else { return };
                let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(10)));
                let sent = write!(stream, "POST /v1/messages HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                let mut answer = String::new();
                if sent.is_err() || stream.read_to_string(&mut answer).is_err() || !answer.starts_with("HTTP/1.1 200") {
                    return;
                }
                messages.push(json!({"role": "assistant", "content": format!("reply {i}")}));
            }
        });
        (child, client)
    };
    let started = std::time::Instant::now();
    let (mut child, client) = spawn();
    assert!(child.wait().unwrap().success());
    client.join().unwrap();
    let span = started.elapsed().as_millis() as u64;
    let complete = tree(&dir.path().join("log"));
    let complete_log: Vec<Vec<u8>> = complete["requests.jsonl"].split_inclusive(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
    assert_eq!(complete_log.len(), requests);
    assert!(complete.contains_key("trace.jsonl") && complete.contains_key("summary.json"));
    let previous = BTreeMap::from([
        ("requests.jsonl".to_owned(), b"previous log\n".to_vec()),
        ("trace.jsonl".to_owned(), b"previous trace\n".to_vec()),
        ("summary.json".to_owned(), b"previous summary\n".to_vec()),
    ]);
    let mut seen_lines = Vec::new();
    for delay in kill_moments(span + span / 4, 8) {
        for (name, bytes) in &previous {
            std::fs::write(dir.path().join("log").join(name), bytes).unwrap();
        }
        let (mut child, client) = spawn();
        std::thread::sleep(std::time::Duration::from_millis(delay));
        let _ = child.kill();
        let _ = child.wait();
        client.join().unwrap();
        let after = tree(&dir.path().join("log"));
        // The trace and summary are the previous ones or the complete new ones, never a part.
        for name in ["trace.jsonl", "summary.json"] {
            assert!(after[name] == previous[name] || after[name] == complete[name], "{name} after a kill at {delay} ms: {:?}", String::from_utf8_lossy(&after[name]));
        }
        // The request log is the previous one (killed before it was opened) or whole lines, the
        // first ones of the complete log.
        let log = &after["requests.jsonl"];
        if *log != previous["requests.jsonl"] {
            let lines: Vec<Vec<u8>> = log.split_inclusive(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
            assert!(log.is_empty() || log.ends_with(b"\n"), "a half-written log line after a kill at {delay} ms");
            assert!(lines.len() <= complete_log.len() && lines[..] == complete_log[..lines.len()], "kill at {delay} ms");
            seen_lines.push(lines.len());
        }
    }
    assert!(!seen_lines.is_empty(), "no kill landed after the log was opened");
}

#[test]
fn knobs_that_would_grow_the_context_are_exit_2_not_a_panic() {
    let dir = with_scenario();
    let out = check_ctxsim(dir.path(), &["run", "a.yaml", "--estimator", "chars4", "--set", "compact.autocompact.buffer_tokens=180000"]);
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("a.yaml") && stderr.contains("compact.autocompact.buffer_tokens = 180000") && stderr.contains("effective window"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for (set, field) in [
        ("compact.snip.target_pct=90", "compact.snip.target_pct"),
        ("compact.autocompact.pct_override=250", "compact.autocompact.pct_override"),
        ("skill_listing_budget_fraction=2.5", "skill_listing_budget_fraction"),
        ("run_hooks=true", "--allow-host-commands"),
    ] {
        let out = check_ctxsim(dir.path(), &["run", "a.yaml", "--estimator", "chars4", "--set", set]);
        let (code, stderr) = code_and_stderr(&out);
        assert_eq!(code, 2, "{set}: {stderr}");
        assert!(stderr.contains(field), "{set}: {stderr}");
    }
}

#[test]
fn model_tables_and_calibrations_are_range_checked_at_load() {
    let dir = with_scenario();
    let shipped = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("data/models.toml")).unwrap();
    for (from, to, field) in [
        ("input = 3.0", "input = -3.0", "price.input"),
        ("input = 3.0", "input = nan", "price.input"),
        ("context_window = 200000", "context_window = 0", "context_window"),
    ] {
        assert!(shipped.contains(from), "{from}");
        std::fs::write(dir.path().join("models.toml"), shipped.replacen(from, to, 1)).unwrap();
        let out = check_ctxsim(dir.path(), &["run", "a.yaml", "--estimator", "chars4", "--model-table", "models.toml"]);
        let (code, stderr) = code_and_stderr(&out);
        assert_eq!(code, 2, "{to}: {stderr}");
        assert!(stderr.contains("models.toml:") && stderr.contains(field), "{to}: {stderr}");
    }
    let calibration = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("data/calibration.json")).unwrap();
    let mut value: serde_json::Value = serde_json::from_str(&calibration).unwrap();
    value["families"]["opus"]["scale"] = json!(1e300);
    std::fs::write(dir.path().join("cal.json"), value.to_string()).unwrap();
    let out = check_ctxsim(dir.path(), &["run", "a.yaml", "--estimator", "calibrated", "--calibration", "cal.json"]);
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cal.json") && stderr.contains("families.opus.scale"), "{stderr}");
}

#[test]
fn a_time_header_of_u64_max_is_refused_not_wrapped() {
    let script = ctxsim::live::Script::parse(&json!({"main": [{"content": "one"}, {"content": "two"}]}).to_string(), "script.json").unwrap();
    let mut service = ctxsim::live::Service::new(script, super::support::measurer(), ctxsim::live::ServeOptions::default()).unwrap();
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}).to_string().into_bytes();
    let request = |time: &str| ctxsim::live::HttpRequest {
        method: "POST".into(),
        url: "/v1/messages".into(),
        headers: vec![(ctxsim::live::serve::TIME_HEADER.to_owned(), time.to_owned())],
        body: body.clone(),
    };
    let reply = service.handle(&request(&u64::MAX.to_string()));
    assert_eq!(reply.status, 400, "{}", String::from_utf8_lossy(&reply.body));
    assert!(String::from_utf8_lossy(&reply.body).contains("largest virtual time"));
    // The largest time accepted still leaves the clock whole for the next request.
    let max = ctxsim::live::serve::MAX_TIME_MS.to_string();
    assert_eq!(service.handle(&request(&max)).status, 200);
    assert!(service.rows().iter().all(|r| r.time_ms <= ctxsim::live::serve::MAX_TIME_MS));
}

#[test]
fn analyze_warns_with_the_line_when_time_goes_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let line = |t: u64, text: &str| json!({"time_ms": t, "body": {"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": text}]}}).to_string();
    std::fs::write(dir.path().join("log.jsonl"), [line(5000, "a"), line(9000, "b"), line(2000, "c")].join("\n") + "\n").unwrap();
    let out = check_ctxsim(dir.path(), &["analyze", "log.jsonl", "--estimator", "chars4", "--quiet"]);
    let (_, stderr) = code_and_stderr(&out);
    assert!(stderr.contains("log.jsonl:3: suspect value at `time_ms`: 2000 goes back"), "{stderr}");
}

#[test]
fn a_closed_stdout_ends_quietly_with_exit_0() {
    let dir = with_scenario();
    for args in [vec!["strategies"], vec!["causes"], vec!["run", "a.yaml", "--estimator", "chars4", "--format", "json"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ctxsim")).current_dir(dir.path()).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        // The reader goes away before the first line (as `| head -0` would).
        drop(child.stdout.take());
        let mut stderr = String::new();
        child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
    }
}

#[test]
fn a_sweep_grid_beyond_the_limit_is_refused_before_it_runs() {
    let dir = with_scenario();
    let out = check_ctxsim(dir.path(), &["sweep", "a.yaml", "--param", "compact.autocompact.buffer_tokens=0..1000000000000:1", "--out", "s"]);
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--max-points"), "{stderr}");
    let out = check_ctxsim(dir.path(), &["sweep", "a.yaml", "--param", "ttl_main=5m,1h", "--param", "compact.autocompact.buffer_tokens=10000..12000:1000", "--out", "s", "--max-points", "5"]);
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("6 points") && stderr.contains("--max-points 5"), "{stderr}");
}

#[test]
fn report_refuses_costs_that_are_not_finite() {
    let dir = with_scenario();
    let made = check_ctxsim(dir.path(), &["run", "a.yaml", "--estimator", "chars4", "--quiet", "--trace", "t.jsonl"]);
    assert!(made.status.success());
    let text = std::fs::read_to_string(dir.path().join("t.jsonl")).unwrap();
    let huge: String = text
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["cost_usd"] = json!(1.5e308);
            v.to_string() + "\n"
        })
        .collect();
    std::fs::write(dir.path().join("t.jsonl"), huge).unwrap();
    let out = check_ctxsim(dir.path(), &["report", "t.jsonl", "--out", "rep"]);
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("t.jsonl") && stderr.contains("cost_usd") && stderr.contains("not finite"), "{stderr}");
}

#[test]
fn check_annotations_escape_names() {
    let dir = tempfile::tempdir().unwrap();
    let name = "\"evil%0A::error::injected, a:b\"";
    std::fs::write(dir.path().join("x.yaml"), scenario(name, "  max_requests: 1\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ctxsim")).current_dir(dir.path()).args(["check", "x.yaml", "--estimator", "chars4"]).env("GITHUB_ACTIONS", "true").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let commands: Vec<&str> = stdout.lines().filter(|l| l.starts_with("::")).collect();
    assert_eq!(commands.len(), 1, "{stdout}");
    let line = commands[0];
    // The name's `::` and `,` cannot end the title property, and its `%0A` is not a newline.
    assert!(line.starts_with("::error file=x.yaml,title=ctxsim check evil%250A%3A%3Aerror%3A%3Ainjected%2C a%3Ab%3A "), "{line}");
    assert!(line.contains("::evil%250A::error::injected, a:b: "), "{line}");
}

/// Sends a POST that announces 1000 bytes of body and sends 10, then stalls.
fn check_stalled_client(addr: std::net::SocketAddr) -> std::net::TcpStream {
    let mut stalled = std::net::TcpStream::connect(addr).unwrap();
    write!(stalled, "POST /v1/messages HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"model\":").unwrap();
    stalled.flush().unwrap();
    stalled
}

/// One `/v1/messages` request on a connection of its own; the raw answer.
fn check_one_request(addr: std::net::SocketAddr) -> String {
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let mut other = std::net::TcpStream::connect(addr).unwrap();
    other.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    write!(other, "POST /v1/messages HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut answer = String::new();
    other.read_to_string(&mut answer).unwrap();
    answer
}

#[test]
fn a_client_stalled_inside_its_body_blocks_neither_others_nor_the_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let script = ctxsim::live::Script::parse(&json!({"main": [{"content": "one"}, {"content": "two"}]}).to_string(), "script.json").unwrap();
    let options = ctxsim::live::ServeOptions { log_dir: Some(dir.path().to_owned()), read_timeout: std::time::Duration::from_secs(1), ..Default::default() };
    let handle = ctxsim::live::start(0, ctxsim::live::Service::new(script, super::support::measurer(), options).unwrap()).unwrap();
    let stalled = check_stalled_client(handle.addr());
    let mut timed_out = check_stalled_client(handle.addr());
    std::thread::sleep(std::time::Duration::from_millis(200));
    // Another client is answered meanwhile.
    let answer = check_one_request(handle.addr());
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // After a second of silence the stalled connection gets a 408 and is closed.
    timed_out.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    let started = std::time::Instant::now();
    let mut answer = String::new();
    timed_out.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 408") && answer.contains("timeout_error"), "{answer}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    // And the server stops (as on SIGTERM) with a stalled client still connected, writing its
    // trace.
    let stalled_again = check_stalled_client(handle.addr());
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || done_tx.send(handle.stop().map(|r| r.rows.len())).unwrap());
    let rows = done_rx.recv_timeout(std::time::Duration::from_secs(20)).expect("the server stopped").unwrap();
    assert_eq!(rows, 1);
    assert_eq!(std::fs::read_to_string(dir.path().join("trace.jsonl")).unwrap().lines().count(), 1);
    drop((stalled, stalled_again));
}

#[cfg(unix)]
#[test]
fn sigterm_ends_serve_with_a_stalled_client_connected_and_writes_the_trace() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("script.json"), json!({"main": [{"content": "one"}, {"content": "two"}]}).to_string()).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ctxsim"))
        .current_dir(dir.path())
        .args(["serve", "--script", "script.json", "--log", "log", "--estimator", "chars4", "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let addr: std::net::SocketAddr = first.trim().strip_prefix("listening on http://").unwrap_or_else(|| panic!("{first}")).parse().unwrap();
    // One client stalls inside its body (the default read timeout, 60 s, is far away); another
    // is answered.
    let stalled = check_stalled_client(addr);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let answer = check_one_request(addr);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // SIGTERM ends the server at once, with its trace and summary written.
    let started = std::time::Instant::now();
    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > std::time::Duration::from_secs(20) {
            let _ = child.kill();
            panic!("serve did not end within 20 s of SIGTERM with a stalled client connected");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    assert_eq!(std::fs::read_to_string(dir.path().join("log/trace.jsonl")).unwrap().lines().count(), 1);
    assert!(dir.path().join("log/summary.json").exists());
    assert_eq!(std::fs::read_to_string(dir.path().join("log/requests.jsonl")).unwrap().lines().count(), 1);
    drop(stalled);
}

#[test]
fn a_mount_into_proc_or_a_special_file_is_refused_with_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = |from: &str| format!("name: m\nworld:\n  model: claude-sonnet-4-5\n  mount:\n    - {{from: {from}, at: /proj}}\nscript:\n  - user: hi\n");
    for from in ["/proc/self/environ", "/proc/self", "/dev/null", "../../../../../../../../proc/self/environ"] {
        std::fs::write(dir.path().join("m.yaml"), yaml(from)).unwrap();
        let err = ctxsim::scenario::load_scenario(dir.path().join("m.yaml")).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("m.yaml:5:") && err.contains("world.mount[0].from"), "{from}: {err}");
        assert!(err.contains("system directory"), "{from}: {err}");
    }
    // With a root, a mount must stay inside it: an absolute path or `..` leading out is refused.
    std::fs::create_dir_all(dir.path().join("suite/project")).unwrap();
    std::fs::write(dir.path().join("suite/project/CLAUDE.md"), "# rules\n").unwrap();
    std::fs::write(dir.path().join("outside.md"), "secret\n").unwrap();
    let root = dir.path().join("suite");
    std::fs::write(root.join("ok.yaml"), yaml("project")).unwrap();
    let scenario = ctxsim::scenario::load_scenario_confined(root.join("ok.yaml"), Some(&root)).unwrap();
    assert!(scenario.world.files.contains_key("/proj/CLAUDE.md"));
    let outside = dir.path().join("outside.md");
    for from in ["../outside.md", outside.to_str().unwrap()] {
        std::fs::write(root.join("escape.yaml"), yaml(from)).unwrap();
        let err = ctxsim::scenario::load_scenario_confined(root.join("escape.yaml"), Some(&root)).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("escape.yaml:5:") && err.contains("outside the mount root"), "{from}: {err}");
    }
    // The same through the command line's --mount-root.
    std::fs::write(root.join("escape.yaml"), yaml("../outside.md")).unwrap();
    let out = check_ctxsim(&root, &["run", "escape.yaml", "--estimator", "chars4", "--mount-root", "."]);
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("escape.yaml:5:") && stderr.contains("world.mount[0].from") && stderr.contains("outside the mount root"), "{stderr}");
    let out = check_ctxsim(&root, &["run", "ok.yaml", "--estimator", "chars4", "--quiet", "--mount-root", "."]);
    assert_eq!(code_and_stderr(&out).0, 0, "{}", code_and_stderr(&out).1);
}

#[test]
fn deeply_nested_yaml_is_refused_fast() {
    let dir = with_scenario();
    // 128 KB of nested flow lists, and of nested block lists.
    let flow = format!("name: deep\nworld: {}{}\n", "[".repeat(64 * 1024), "]".repeat(64 * 1024));
    let block: String = (0..3000).map(|i| format!("{}- \n", " ".repeat(i % 40 * 2))).collect::<String>() + &"- - ".repeat(20_000);
    for (name, text) in [("flow.yaml", flow.clone()), ("block.yaml", format!("name: deep\nworld:\n  files:\n{block}"))] {
        std::fs::write(dir.path().join(name), &text).unwrap();
        let start = std::time::Instant::now();
        let out = check_ctxsim(dir.path(), &["run", name, "--estimator", "chars4"]);
        let (code, stderr) = code_and_stderr(&out);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains(name) && stderr.contains("levels deep"), "{stderr}");
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "{name}: {:?}", start.elapsed());
    }
    std::fs::write(dir.path().join("deep-strategy.yaml"), flow.replace("name: deep\n", "")).unwrap();
    let out = check_ctxsim(dir.path(), &["run", "a.yaml", "--estimator", "chars4", "--strategy", "deep-strategy.yaml"]);
    let (code, stderr) = code_and_stderr(&out);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("deep-strategy.yaml") && stderr.contains("levels deep"), "{stderr}");
}

/// A local Messages API on 127.0.0.1 that answers the first request with a finished reply and
/// then does what `then` says: stall (never answer) or cut its stream off before `message_stop`.
fn check_flaky_server(then: &'static str) -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let thread = std::thread::spawn(move || {
        for (n, stream) in listener.incoming().enumerate() {
            let Ok(mut stream) = stream else { return };
            // The request: headers, then content-length bytes.
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
            let length: usize = text.lines().find_map(|l| l.strip_prefix("content-length:")).map_or(0, |v| v.trim().parse().unwrap());
            let mut body = vec![0u8; length];
            let _ = stream.read_exact(&mut body);
            if n == 0 {
                let reply = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                    "content": [{"type": "text", "text": "Done."}], "stop_reason": "end_turn", "stop_sequence": null,
                    "usage": {"input_tokens": 12, "output_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}})
                .to_string();
                let _ = write!(stream, "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}", reply.len());
            } else if then == "cut" {
                let events = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Half a rep\"}}\n\n";
                let _ = write!(stream, "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{events}");
                // The connection closes here, mid-reply.
            } else {
                std::thread::sleep(std::time::Duration::from_secs(30));
            }
            if n >= 1 {
                return;
            }
        }
    });
    (addr, thread)
}

#[test]
fn live_ends_a_stalled_or_cut_off_call_with_an_error_and_keeps_the_calls_already_paid() {
    for then in ["stall", "cut"] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("l.yaml"), "name: l\nworld:\n  model: claude-sonnet-4-5\nscript:\n  - user: \"first\"\n  - user: \"second\"\n").unwrap();
        let (addr, _server) = check_flaky_server(then);
        let start = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_ctxsim"))
            .current_dir(dir.path())
            .args(["live", "l.yaml", "--estimator", "chars4", "--quiet", "--record", "rec.jsonl", "--trace", "trace.jsonl", "--read-timeout", "2", "--max-retries", "0"])
            .env("ANTHROPIC_API_KEY", "test-key")
            .env("ANTHROPIC_BASE_URL", format!("http://{addr}"))
            .output()
            .unwrap();
        let (code, stderr) = code_and_stderr(&out);
        assert_eq!(code, 2, "{then}: {stderr}");
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "{then}: {:?}", start.elapsed());
        let expected = if then == "cut" { "without message_stop" } else { "imeout" };
        assert!(stderr.contains(expected) && stderr.contains("script[1]"), "{then}: {stderr}");
        // The first, answered call is on disk: in the recording and the trace.
        let recording = std::fs::read_to_string(dir.path().join("rec.jsonl")).unwrap();
        assert!(recording.contains("\"Done.\""), "{then}: {recording}");
        assert!(!recording.contains("Half a rep"), "{then}: {recording}");
        assert_eq!(std::fs::read_to_string(dir.path().join("trace.jsonl")).unwrap().lines().count(), 1, "{then}");
    }
}

#[test]
fn a_trace_to_dev_stdout_follows_the_printed_output_into_a_redirected_file() {
    let dir = with_scenario();
    let file = std::fs::File::create(dir.path().join("out.txt")).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_ctxsim"))
        .current_dir(dir.path())
        .args(["run", "a.yaml", "--estimator", "chars4", "--format", "csv", "--trace", "/dev/stdout"])
        .stdout(file)
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(dir.path().join("out.txt")).unwrap();
    // The trace lines and the summary are both there: the file was neither replaced nor
    // overwritten from its start.
    assert!(text.lines().filter(|l| l.starts_with('{') && l.contains("\"lane\"")).count() >= 2, "{text}");
    assert!(text.contains("input,strategy,model"), "{text}");
}
