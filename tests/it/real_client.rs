//! The real Claude Code CLI as a black box against `ctxsim serve` (scripts/real-client.sh).
//! Runs only where the CLI is installed (`CTXSIM_REAL_CLIENT_DIR`, default
//! /work/cc/node_modules/@anthropic-ai/claude-code) and node is on PATH; skips with a message
//! otherwise, so CI never depends on it.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn cli_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("CTXSIM_REAL_CLIENT_DIR").map_or_else(|| PathBuf::from("/work/cc/node_modules/@anthropic-ai/claude-code"), PathBuf::from);
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    (node && dir.join("cli.js").is_file()).then_some(dir)
}

/// Runs one scripted session; the CLI's JSON result and the served request log's lines.
fn check_real_client(name: &str, script: &str, prompt: &str) -> Option<(Value, Vec<Value>)> {
    let Some(dir) = cli_dir() else {
        eprintln!("skipping {name}: the real Claude Code CLI is not installed (npm install @anthropic-ai/claude-code@2.1.88, or set CTXSIM_REAL_CLIENT_DIR)");
        return None;
    };
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    let status = Command::new("bash")
        .arg(repo.join("scripts/real-client.sh"))
        .args([name, &repo.join("scripts/real-client").join(script).display().to_string(), prompt])
        .env("CC_DIR", &dir)
        .env("CTXSIM", env!("CARGO_BIN_EXE_ctxsim"))
        .env("OUT", out.path().join(name))
        .output()
        .unwrap();
    assert!(status.status.success(), "{}\n{}", String::from_utf8_lossy(&status.stdout), String::from_utf8_lossy(&status.stderr));
    let result: Value = serde_json::from_slice(&std::fs::read(out.path().join(name).join("cli.json")).unwrap()).unwrap();
    let log = std::fs::read_to_string(out.path().join(name).join("log/requests.jsonl")).unwrap();
    Some((result, log.lines().map(|l| serde_json::from_str(l).unwrap()).collect()))
}

fn lanes(log: &[Value]) -> Vec<&str> {
    log.iter().map(|l| l["lane"].as_str().unwrap()).collect()
}

#[test]
fn real_client_runs_a_multi_tool_session_with_cache_reads() {
    let Some((result, log)) = check_real_client("multi", "multi-tool.json", "Add a mul function to calc.py") else { return };
    assert_eq!(result["result"], "Added `mul` next to `sub`; the test still passes.");
    assert_eq!(lanes(&log), ["main"; 4]);
    // Each request extends the previous one: it reads what the previous one cached.
    for pair in log.windows(2) {
        let (before, after) = (&pair[0]["usage"], &pair[1]["usage"]);
        let cached = before["cache_read_input_tokens"].as_u64().unwrap() + before["cache_creation_input_tokens"].as_u64().unwrap();
        assert_eq!(after["cache_read_input_tokens"].as_u64().unwrap(), cached);
    }
    // The client billed exactly the usage it was served.
    let served: u64 = log.iter().map(|l| l["usage"]["cache_read_input_tokens"].as_u64().unwrap()).sum();
    assert_eq!(result["usage"]["cache_read_input_tokens"].as_u64(), Some(served));
}

#[test]
fn real_client_compacts_when_the_served_usage_says_the_context_is_full() {
    let Some((result, log)) = check_real_client("compact", "compact.json", "What is in calc.py?") else { return };
    assert_eq!(result["result"], "calc.py has add and sub; both are pure.");
    assert_eq!(lanes(&log), ["main", "compact", "main"]);
    // The compaction fork shares the main thread's cached prefix.
    assert!(log[1]["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 10_000);
    // After it, the conversation starts over from the summary.
    assert!(log[2]["body"]["messages"].as_array().unwrap().len() < log[1]["body"]["messages"].as_array().unwrap().len());
}

// ---- Conformance: our agent's requests against the real client's, structurally ----------------

use ctxsim::shape::{Difference, RequestShape, Tolerance, diff, read_file, shapes_of};

/// Our agent on the scenario that reproduces a real-client session (tests/conformance/*.yaml).
fn our_shapes(scenario: &str) -> Vec<RequestShape> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance").join(scenario);
    let yaml = std::fs::read_to_string(&path).unwrap();
    let out = crate::support::run_yaml(&yaml);
    let lanes = crate::support::lanes(&out).into_iter().map(str::to_owned);
    shapes_of(&lanes.zip(out.requests.iter().cloned()).collect::<Vec<_>>())
}

/// Compares our agent's requests with the real client's shapes (the committed fixture, and the
/// real client run now where it is installed). Every difference must be an accepted one (a path
/// prefix and its reason), and every accepted one must still occur, so the list stays true.
fn check_conformance(name: &str, script: &str, prompt: &str, scenario: &str, accepted: &[(&str, &str)]) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixture = read_file(&repo.join("tests/conformance").join(scenario.replace(".yaml", ".real-shapes.json"))).unwrap();
    let mut references = vec![("fixture", fixture)];
    if let Some((_, log)) = check_real_client(name, script, prompt) {
        let live: Vec<(String, Value)> = log.iter().map(|l| (l["lane"].as_str().unwrap().to_owned(), l["body"].clone())).collect();
        let live = ctxsim::shape::shapes(live.iter().map(|(lane, body)| (lane.as_str(), body.clone())));
        // The fixture is still what the client sends.
        assert_eq!(diff(&references[0].1, &live, Tolerance { fraction: 0.02, slack: 64 }), Vec::<Difference>::new());
        references.push(("real client", live));
    }
    let ours = our_shapes(scenario);
    for (what, reference) in &references {
        let differences = diff(reference, &ours, Tolerance::default());
        // An accepted path is a prefix of the difference's path, or of `#{request} {path}`.
        let matches = |d: &Difference, p: &str| d.path.starts_with(p) || format!("#{} {}", d.request, d.path).starts_with(p);
        let unexplained: Vec<String> = differences.iter().filter(|d| !accepted.iter().any(|(p, _)| matches(d, p))).map(ToString::to_string).collect();
        assert!(unexplained.is_empty(), "{scenario} vs {what}: structural differences:\n{}", unexplained.join("\n"));
        for (path, reason) in accepted {
            assert!(differences.iter().any(|d| matches(d, path)), "{scenario}: accepted difference `{path}` ({reason}) no longer occurs: drop it");
        }
    }
}

#[test]
fn our_agent_sends_the_real_clients_requests_in_a_multi_tool_session() {
    check_conformance(
        "multi-conform",
        "multi-tool.json",
        "Add a mul function to calc.py",
        "multi-tool.yaml",
        &[],
    );
}

#[test]
fn our_agent_sends_the_real_clients_requests_around_a_compaction() {
    check_conformance(
        "compact-conform",
        "compact.json",
        "What is in calc.py?",
        "compact.yaml",
        &[],
    );
}
