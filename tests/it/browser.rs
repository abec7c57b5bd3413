//! The HTML reports `audit --out` and `report --out` write, opened in a real headless browser
//! (Chromium through puppeteer-core, `tests/browser/check-html.mjs`): no console or page errors,
//! nothing fails to load, every plot is shown, and the page fits the window.
//!
//! Needs node and `npm install @sparticuz/chromium puppeteer-core` in a directory outside the
//! repository, given as `CTXSIM_BROWSER_DIR` (default `~/.cache/ctxsim/browser`; `.ci/run`
//! installs it there); skipped with a message when either is missing.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::support::realdata;

/// The browser's window: a laptop screen.
const WINDOW: (u32, u32) = (1366, 768);

fn browser_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("CTXSIM_BROWSER_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/ctxsim/browser"),
    };
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    let modules = ["puppeteer-core", "@sparticuz/chromium"].iter().all(|m| dir.join("node_modules").join(m).join("package.json").is_file());
    if node && modules {
        Some(dir)
    } else {
        eprintln!(
            "skipped: the browser check needs node and `npm install @sparticuz/chromium puppeteer-core` in {} (CTXSIM_BROWSER_DIR); node {}, packages {}",
            dir.display(),
            if node { "found" } else { "missing" },
            if modules { "found" } else { "missing" }
        );
        None
    }
}

fn ctxsim(args: &[&std::ffi::OsStr]) {
    let output = Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(args).env_remove("CLAUDE_CONFIG_DIR").env("CTXSIM_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("token-cache")).output().unwrap();
    assert!(output.status.code().is_some_and(|c| c <= 2), "ctxsim {args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

fn html_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "html")).collect();
    files.sort();
    files
}

/// Every page of `files` opened in the browser: its checks, one JSON object per page.
fn check_in_browser(modules: &Path, files: &[PathBuf]) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/check-html.mjs");
    let output = Command::new("node").arg(script).arg(modules).arg(WINDOW.0.to_string()).arg(WINDOW.1.to_string()).args(files).output().unwrap();
    assert!(output.status.success(), "the browser check failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn html_reports_open_in_a_browser_without_errors_with_every_plot_shown() {
    let Some(modules) = browser_dir() else { return };
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit");
    let report = dir.path().join("report");
    let trace = dir.path().join("trace.jsonl");
    // (One session: its what-ifs run through the agent, the default engine.)
    ctxsim(&["audit".as_ref(), realdata().join("transcripts").as_os_str(), "--project".as_ref(), "NumWordify".as_ref(), "--no-progress".as_ref(), "--out".as_ref(), audit.as_os_str()]);
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/compaction-fork-shares-cache.yaml");
    ctxsim(&["run".as_ref(), scenario.as_os_str(), "--trace".as_ref(), trace.as_os_str()]);
    ctxsim(&["report".as_ref(), trace.as_os_str(), "--out".as_ref(), report.as_os_str()]);
    let mut files = html_files(&audit);
    files.extend(html_files(&report));
    assert!(files.len() >= 3, "{files:?}");
    let pages = check_in_browser(&modules, &files);
    assert_eq!(pages.len(), files.len());
    for page in &pages {
        let file = &page["file"];
        for field in ["console_errors", "page_errors", "failed_requests"] {
            assert_eq!(page[field], serde_json::json!([]), "{file}: {field}");
        }
        assert!(page["plots"].as_u64().unwrap() >= 1, "{file}: no plot");
        assert_eq!(page["plots_shown"], page["plots"], "{file}: a plot is not shown");
        assert_eq!(page["images_shown"], page["images"], "{file}: an image is not shown");
        assert!(page["scroll_width"].as_u64() <= page["window_width"].as_u64(), "{file}: wider than the window: {page}");
    }
}
