//! Drives a real Claude Code client (the `cli.js` build with node, or the native binary) headless
//! through the probes against `ctxsim serve`, as reference/real-client-oracle.md describes: a
//! fresh HOME with a fixed userID, `IS_SANDBOX=1` for bypassPermissions, a fixed session id,
//! a working ripgrep on PATH for the `cli.js` build, the date pinned where a preload can pin it.
//! Every request the client sends lands in `serve`'s request log with its headers.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::recording::claude_trace::RequestLogEntry;

use super::probes::{self, Probe, Run};

/// How the client is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientKind {
    /// `node cli.js` (the npm builds up to 2.1.1xx); the date preload applies.
    NodeScript,
    /// A native executable (`node_modules/.bin/claude` of the current builds).
    Native,
}

impl ClientKind {
    pub fn name(&self) -> &'static str {
        match self {
            ClientKind::NodeScript => "cli.js",
            ClientKind::Native => "native",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The client, node, git or python3 is missing: the caller may skip.
    #[error("{0}")]
    Missing(String),
    #[error("{0}")]
    Failed(String),
}

/// What `capture` needs.
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    pub client: PathBuf,
    /// The ctxsim binary that serves (normally the running one).
    pub ctxsim: PathBuf,
    /// Where the probes' projects, homes and logs go (`<work>/<probe>/…`); their paths reach
    /// the requests, so the default is fixed.
    pub work: PathBuf,
    pub timeout: Duration,
    /// Only these probes (all when empty).
    pub only: Vec<String>,
    /// The calibration `serve` counts usage with (`--calibration`; the shipped one when `None`).
    pub calibration: Option<PathBuf>,
}

/// One probe's outcome: the requests served, in order, and notes (a skipped probe, a client
/// that failed).
#[derive(Debug, Clone)]
pub struct ProbeLog {
    pub probe: String,
    pub entries: Vec<RequestLogEntry>,
    /// Per entry, the headers `serve` kept (`headers.jsonl`).
    pub headers: Vec<BTreeMap<String, String>>,
    pub notes: Vec<String>,
}

/// The client's kind and its `--version` (`2.1.332 (Claude Code)` → `2.1.332`).
pub fn identify(client: &Path) -> Result<(ClientKind, String), CaptureError> {
    if !client.is_file() {
        return Err(CaptureError::Missing(format!("no Claude Code client at {}", client.display())));
    }
    let kind = if client.extension().is_some_and(|e| e == "js" || e == "cjs" || e == "mjs") { ClientKind::NodeScript } else { ClientKind::Native };
    let mut command = base_command(client, &kind);
    let output = command.arg("--version").output().map_err(|e| match kind {
        ClientKind::NodeScript => CaptureError::Missing(format!("node is not available to run {}: {e}", client.display())),
        ClientKind::Native => CaptureError::Missing(format!("{} does not start: {e}", client.display())),
    })?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = text.split_whitespace().next().filter(|v| v.chars().next().is_some_and(|c| c.is_ascii_digit())).map(str::to_owned);
    match version {
        Some(v) if output.status.success() => Ok((kind, v)),
        _ => Err(CaptureError::Failed(format!("{} --version printed no version: {}{}", client.display(), text.trim(), String::from_utf8_lossy(&output.stderr).trim()))),
    }
}

fn base_command(client: &Path, kind: &ClientKind) -> Command {
    match kind {
        ClientKind::NodeScript => {
            let mut c = Command::new("node");
            c.arg(client);
            c
        }
        ClientKind::Native => Command::new(client),
    }
}

fn tool_present(name: &str, arg: &str) -> bool {
    Command::new(name).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Runs the probes; one log per probe, in probe order.
pub fn capture(options: &CaptureOptions) -> Result<(ClientKind, String, Vec<ProbeLog>), CaptureError> {
    let (kind, version) = identify(&options.client)?;
    if !tool_present("git", "--version") {
        return Err(CaptureError::Missing("git is not installed (the probes' project is a repository)".to_owned()));
    }
    let python = tool_present("python3", "--version");
    let all = probes::probes();
    for name in &options.only {
        if !all.iter().any(|p| p.name == name) {
            return Err(CaptureError::Failed(format!("--probe {name}: no such probe (known: {})", all.iter().map(|p| p.name).collect::<Vec<_>>().join(", "))));
        }
    }
    let mut logs = Vec::new();
    for probe in all.iter().filter(|p| options.only.is_empty() || options.only.iter().any(|o| o == p.name)) {
        if probe.mcp && !python {
            logs.push(ProbeLog { probe: probe.name.to_owned(), entries: Vec::new(), headers: Vec::new(), notes: vec!["skipped: python3 (the MCP test server) is not installed".to_owned()] });
            continue;
        }
        logs.push(run_probe(options, &kind, probe)?);
    }
    Ok((kind, version, logs))
}

fn io(what: &str, path: &Path) -> impl Fn(std::io::Error) -> CaptureError {
    let message = format!("{what} {}", path.display());
    move |e| CaptureError::Failed(format!("{message}: {e}"))
}

fn write(path: &Path, text: &str) -> Result<(), CaptureError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io("failed to create", parent))?;
    }
    std::fs::write(path, text).map_err(io("failed to write", path))
}

/// The probe's directory with a fresh project (a git repository with one commit), HOME and bin.
fn prepare(dir: &Path, kind: &ClientKind, client: &Path) -> Result<(), CaptureError> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(io("failed to clear", dir))?;
    }
    let proj = dir.join("proj");
    for (path, text) in probes::PROJECT_FILES {
        write(&proj.join(path), text)?;
    }
    write(&dir.join("home/.claude.json"), &format!("{{\"userID\":\"{:064}\",\"hasCompletedOnboarding\":true}}\n", 1))?;
    write(&dir.join("bin/fakedate.cjs"), probes::FAKE_DATE)?;
    write(&dir.join("bin/mcp_demo.py"), probes::MCP_SERVER)?;
    // The cli.js package's bundled rg has no +x bit: a copy on PATH instead.
    if *kind == ClientKind::NodeScript
        && let Some(package) = client.parent()
    {
        let rg = package.join("vendor/ripgrep/x64-linux/rg");
        if rg.is_file() {
            let target = dir.join("bin/rg");
            std::fs::copy(&rg, &target).map_err(io("failed to copy", &rg))?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).map_err(io("failed to chmod", &target))?;
            }
        }
    }
    let (message, date) = probes::COMMIT;
    for args in [vec!["init", "-q", "-b", "main"], vec!["add", "-A"], vec!["commit", "-qm", message]] {
        let status = Command::new("git")
            .args(["-c", "user.name=demo", "-c", "user.email=demo@example.invalid", "-c", "commit.gpgsign=false"])
            .args(&args)
            .current_dir(&proj)
            .env("GIT_AUTHOR_DATE", date)
            .env("GIT_COMMITTER_DATE", date)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| CaptureError::Failed(format!("git {}: {e}", args.join(" "))))?;
        if !status.success() {
            return Err(CaptureError::Failed(format!("git {} failed in {}", args.join(" "), proj.display())));
        }
    }
    Ok(())
}

/// `serve` on a free port; returns the child and its base URL.
fn start_serve(options: &CaptureOptions, dir: &Path, probe: &Probe) -> Result<(Child, String), CaptureError> {
    let proj = dir.join("proj");
    let script = serde_json::to_string_pretty(&probe.script).expect("scripts serialize").replace("__P__", &proj.display().to_string());
    write(&dir.join("script.json"), &script)?;
    let mut child = Command::new(&options.ctxsim)
        .args(["serve", "--port", "0", "--script"])
        .arg(dir.join("script.json"))
        .arg("--log")
        .arg(dir.join("log"))
        .args(["--id-tag", &probe.name.replace('-', "")])
        .args(options.calibration.iter().flat_map(|c| [std::ffi::OsStr::new("--calibration"), c.as_os_str()]))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| CaptureError::Failed(format!("failed to start {} serve: {e}", options.ctxsim.display())))?;
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("listening on ") {
                let _ = tx.send(url.trim().to_owned());
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(url) => Ok((child, url)),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(CaptureError::Failed(format!("ctxsim serve did not start for probe {}", probe.name)))
        }
    }
}

fn client_command(options: &CaptureOptions, kind: &ClientKind, dir: &Path, base_url: &str, probe: &Probe) -> Command {
    let mut c = base_command(&options.client, kind);
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", dir.join("bin").display());
    c.current_dir(dir.join("proj"))
        .env_clear()
        .env("PATH", path)
        .env("USE_BUILTIN_RIPGREP", "0")
        .env("TERM", "dumb")
        .env("LANG", "C.UTF-8")
        .env("HOME", dir.join("home"))
        .env("ANTHROPIC_BASE_URL", base_url)
        .env("ANTHROPIC_API_KEY", "dummy")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("IS_SANDBOX", "1")
        .env("SHELL", "/bin/bash")
        .env("CC_FAKE_DATE", probes::DATE);
    if *kind == ClientKind::NodeScript {
        c.env("NODE_OPTIONS", format!("--require {}", dir.join("bin/fakedate.cjs").display()));
    }
    c.args(["--permission-mode", "bypassPermissions"]);
    if probe.mcp {
        let config = serde_json::json!({"mcpServers": {"demo": {"command": "python3", "args": [dir.join("bin/mcp_demo.py")]}}});
        c.arg("--mcp-config").arg(config.to_string());
    }
    c
}

/// Waits for a child, killing it after `timeout`; its exit status, or `None` when killed.
fn wait_for(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run_probe(options: &CaptureOptions, kind: &ClientKind, probe: &Probe) -> Result<ProbeLog, CaptureError> {
    let dir = options.work.join(probe.name);
    prepare(&dir, kind, &options.client)?;
    let (mut serve, base_url) = start_serve(options, &dir, probe)?;
    let mut notes = Vec::new();
    for (index, run) in probe.runs.iter().enumerate() {
        let mut command = client_command(options, kind, &dir, &base_url, probe);
        let outcome = match run {
            Run::Print { prompt } => {
                command.args(["-p", prompt, "--output-format", "json", "--session-id", probes::SESSION_ID]);
                spawn_and_wait(command, options.timeout, None)
            }
            Run::Resume { prompt } => {
                command.args(["--resume", probes::SESSION_ID, "-p", prompt, "--output-format", "json"]);
                spawn_and_wait(command, options.timeout, None)
            }
            Run::Turns { prompts } => {
                command.args(["-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose", "--session-id", probes::SESSION_ID]);
                spawn_and_wait(command, options.timeout, Some(prompts))
            }
        };
        if let Err(why) = outcome {
            notes.push(format!("run {index}: {why}"));
        }
    }
    let _ = serve.kill();
    let _ = serve.wait();
    let log = dir.join("log/requests.jsonl");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let mut entries = Vec::new();
    for (number, line) in text.lines().enumerate() {
        match serde_json::from_str::<RequestLogEntry>(line) {
            Ok(entry) => entries.push(entry),
            Err(e) => notes.push(format!("{}:{}: skipped: {e}", log.display(), number + 1)),
        }
    }
    let header_log = dir.join("log/headers.jsonl");
    let mut headers = Vec::new();
    for (number, line) in std::fs::read_to_string(&header_log).unwrap_or_default().lines().enumerate() {
        match serde_json::from_str(line) {
            Ok(h) => headers.push(h),
            Err(e) => notes.push(format!("{}:{}: skipped: {e}", header_log.display(), number + 1)),
        }
    }
    if headers.len() != entries.len() {
        notes.push(format!("{}: {} header lines for {} requests", header_log.display(), headers.len(), entries.len()));
        headers.resize(entries.len(), BTreeMap::new());
    }
    Ok(ProbeLog { probe: probe.name.to_owned(), entries, headers, notes })
}

/// Runs one client process; for stream-json turns, each prompt is written after the previous
/// turn's `result` line. An error names what went wrong (exit status, timeout).
fn spawn_and_wait(mut command: Command, timeout: Duration, turns: Option<&[&str]>) -> Result<(), String> {
    command.stdin(if turns.is_some() { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|e| format!("failed to start the client: {e}"))?;
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
        text
    });
    let start = Instant::now();
    if let Some(prompts) = turns {
        let mut stdin = child.stdin.take().expect("piped");
        for prompt in prompts {
            let message = serde_json::json!({"type": "user", "message": {"role": "user", "content": prompt}});
            if writeln!(stdin, "{message}").and_then(|()| stdin.flush()).is_err() {
                break;
            }
            loop {
                let left = timeout.saturating_sub(start.elapsed());
                match rx.recv_timeout(left) {
                    Ok(line) if line.contains("\"type\":\"result\"") => break,
                    Ok(_) => continue,
                    Err(_) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err("no result line before the timeout".to_owned());
                    }
                }
            }
        }
        drop(stdin);
    }
    let status = wait_for(&mut child, timeout.saturating_sub(start.elapsed()));
    let _ = reader.join();
    let stderr = err_reader.join().unwrap_or_default();
    match status {
        None => Err(format!("killed after {} s", timeout.as_secs())),
        Some(s) if s.success() => Ok(()),
        Some(s) => Err(format!("client exited with {s}: {}", stderr.lines().last().unwrap_or("").trim())),
    }
}
