//! Version profiles of the real client (`ctxsim profile capture`, src/client_profile/): the
//! shipped profiles hold what the captures saw, and a capture now still sees it where the
//! client is installed (`CTXSIM_CC88` for the cli.js of 2.1.88, `CTXSIM_CC332` for the native
//! 2.1.332 binary; defaults under /work/cc and /work/cc332). Without node or the client, the
//! live half skips with a message.

use std::path::{Path, PathBuf};
use std::process::Command;

use ctxsim::client_profile::{VersionProfile, probes::probes, shipped};
use ctxsim::shape::{Tolerance, diff};

/// The installed client of `version`, or `None` (with the reason printed) when it cannot run.
pub fn client(version: &str) -> Option<PathBuf> {
    let (var, default) = match version {
        "2.1.88" => ("CTXSIM_CC88", "/work/cc/node_modules/@anthropic-ai/claude-code/cli.js"),
        _ => ("CTXSIM_CC332", "/work/cc332/node_modules/.bin/claude"),
    };
    let path = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    let runs = if path.extension().is_some_and(|e| e == "js") { Command::new("node").arg(&path).arg("--version").output() } else { Command::new(&path).arg("--version").output() };
    if runs.is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).starts_with(version)) {
        Some(path)
    } else {
        eprintln!("skipping: Claude Code {version} is not installed at {} (npm install @anthropic-ai/claude-code@{version}, or set {var}); node is needed for cli.js", path.display());
        None
    }
}

fn check_shipped(version: &str) -> VersionProfile {
    let (profile, shapes) = shipped(version).expect("shipped");
    assert_eq!(profile.version, version);
    let names: Vec<&str> = probes().iter().map(|p| p.name).collect();
    assert_eq!(profile.probes.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), names);
    assert_eq!(shapes.keys().map(String::as_str).collect::<std::collections::BTreeSet<_>>(), names.iter().copied().collect());
    for probe in &profile.probes {
        assert!(probe.notes.is_empty(), "{version} {}: {:?}", probe.name, probe.notes);
        assert_eq!(probe.requests, shapes[&probe.name].len(), "{version} {}", probe.name);
        assert!(probe.total.o200k > 0 && probe.total.calibrated > probe.total.o200k, "{version} {}", probe.name);
    }
    // No text of the client: sizes, names and kinds only.
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("data/profiles/{version}.shapes.json"))).unwrap();
    assert!(!text.contains("calc.py") && !text.contains("You are"), "snapshots hold no texts");
    profile
}

#[test]
fn the_shipped_2_1_88_profile_is_the_inline_tool_layout_with_a_200k_threshold() {
    let p = check_shipped("2.1.88");
    assert_eq!(p.client, "cli.js");
    assert_eq!(p.tools.len(), 22);
    assert!(p.tools.iter().all(|t| !t.defer_loading));
    assert_eq!(p.layout.system_blocks, 4);
    assert_eq!(p.layout.message_roles, ["user"]);
    assert_eq!(p.main.fields["model"], "\"claude-sonnet-4-6\"");
    assert_eq!(p.threshold_between, Some([166_000, 170_000]));
    assert_eq!(p.system[2].cache_control.as_deref(), Some("ephemeral/global"));
}

#[test]
fn the_shipped_2_1_332_profile_has_the_system_message_the_placeholder_and_a_1m_threshold() {
    let p = check_shipped("2.1.332");
    assert_eq!(p.client, "native");
    assert_eq!(p.tools.len(), 12);
    assert_eq!(p.layout.deferred_tools, ["DeferredToolPlaceholder"]);
    for gone in ["Glob", "Grep", "TodoWrite"] {
        assert!(p.tools.iter().all(|t| t.name != gone), "{gone}");
    }
    assert_eq!(p.layout.system_blocks, 3);
    assert_eq!(p.layout.message_roles, ["user", "system"]);
    assert_eq!(p.layout.markers.last().map(String::as_str), Some("messages[1].content[0] ephemeral"));
    assert_eq!(p.main.fields["thinking"], r#"{"type":"adaptive","display":"omitted"}"#);
    assert_eq!(p.main.fields["output_config"], r#"{"effort":"medium"}"#);
    assert!(p.main.betas.iter().any(|b| b == "per-turn-control-2026-07-01"));
    assert!(p.compaction.as_ref().unwrap().betas.iter().any(|b| b == "fallback-credit-2026-06-01"));
    assert_eq!(p.threshold_between, Some([966_000, 970_000]));
}

/// Captures `probe_names` with the installed client into a temporary directory and compares
/// the snapshots with the shipped ones (paths differ in length: a small tolerance).
fn check_capture_matches_shipped(version: &str, probe_names: &[&str]) {
    let Some(client) = client(version) else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(format!("{version}.toml"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_ctxsim"));
    command.args(["profile", "capture", "--client"]).arg(&client).arg("--out").arg(&out).arg("--work").arg(dir.path().join("w"));
    for p in probe_names {
        command.args(["--probe", p]);
    }
    let result = command.output().unwrap();
    assert!(result.status.success(), "{}\n{}", String::from_utf8_lossy(&result.stdout), String::from_utf8_lossy(&result.stderr));
    let profile = VersionProfile::from_toml(&std::fs::read_to_string(&out).unwrap(), "captured").unwrap();
    assert_eq!(profile.version, version);
    let live: std::collections::BTreeMap<String, Vec<ctxsim::shape::RequestShape>> = serde_json::from_str(&std::fs::read_to_string(dir.path().join(format!("{version}.shapes.json"))).unwrap()).unwrap();
    let (_, shipped_shapes) = shipped(version).unwrap();
    for p in probe_names {
        let differences = diff(&shipped_shapes[*p], &live[*p], Tolerance { fraction: 0.02, slack: 64 });
        assert!(differences.is_empty(), "{version} {p}: the client no longer sends the shipped snapshot:\n{}", differences.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"));
    }
}

#[test]
fn a_capture_of_2_1_88_still_sends_the_shipped_snapshots() {
    check_capture_matches_shipped("2.1.88", &["read", "compact-170k"]);
}

#[test]
fn a_capture_of_2_1_332_still_sends_the_shipped_snapshots() {
    check_capture_matches_shipped("2.1.332", &["read", "resume", "compact-970k"]);
}

#[test]
fn capture_without_a_client_is_bad_input_naming_the_path() {
    let out = Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(["profile", "capture", "--client", "/nonexistent/claude"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no Claude Code client at /nonexistent/claude"));
}
