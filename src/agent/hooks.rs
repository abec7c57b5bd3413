//! Hooks (reference layers-1-5 §7): configuration from every settings level, plugins and skill
//! frontmatter; matching; answers (scripted, or real commands behind `Strategy::run_hooks`);
//! the aggregation of their outputs into effects the session applies.
//!
//! Deterministic order of parallel hooks: the reference runs every matched hook in parallel and
//! yields results in completion order. We yield them in **configuration order**: the matched
//! list after dedup and grouping by type (settings user → project → local → policy, then plugin
//! hooks in plugin order, then session hooks of invoked skills; within a source, array order),
//! followed by the scenario's standalone answers in scenario order. That is the order a run
//! would show if every hook finished at the same instant and ties broke by position.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::world::{HookAnswer, VirtualFs};

/// The 27 events, in the reference's `HOOK_EVENTS` order.
pub const HOOK_EVENTS: [&str; 27] = [
    "PreToolUse",
    "PostToolUse",
    "PostToolUseFailure",
    "Notification",
    "UserPromptSubmit",
    "SessionStart",
    "SessionEnd",
    "Stop",
    "StopFailure",
    "SubagentStart",
    "SubagentStop",
    "PreCompact",
    "PostCompact",
    "PermissionRequest",
    "PermissionDenied",
    "Setup",
    "TeammateIdle",
    "TaskCreated",
    "TaskCompleted",
    "Elicitation",
    "ElicitationResult",
    "ConfigChange",
    "WorktreeCreate",
    "WorktreeRemove",
    "InstructionsLoaded",
    "CwdChanged",
    "FileChanged",
];

/// Events whose matcher is ignored: every configured matcher runs.
const UNMATCHED_EVENTS: [&str; 8] =
    ["UserPromptSubmit", "Stop", "TeammateIdle", "TaskCreated", "TaskCompleted", "CwdChanged", "WorktreeCreate", "WorktreeRemove"];

const TOOL_EVENTS: [&str; 5] = ["PreToolUse", "PostToolUse", "PostToolUseFailure", "PermissionRequest", "PermissionDenied"];

/// Cap of one hook output string.
pub const HOOK_OUTPUT_MAX: usize = 10_000;

/// Where a configured hook came from, in merge order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HookSource {
    User,
    Project,
    Local,
    Policy,
    Plugin,
    Session,
}

impl HookSource {
    pub fn name(self) -> &'static str {
        match self {
            HookSource::User => "user",
            HookSource::Project => "project",
            HookSource::Local => "local",
            HookSource::Policy => "policy",
            HookSource::Plugin => "plugin",
            HookSource::Session => "session",
        }
    }
}

/// One hook of one matcher group.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfiguredHook {
    pub event: String,
    /// The group's matcher as written (empty when absent).
    pub matcher: String,
    /// `command`, `prompt`, `agent` or `http`.
    pub kind: String,
    /// The command (or prompt, or url) after `${CLAUDE_PLUGIN_ROOT}` substitution.
    pub command: String,
    /// The `if` permission-rule condition.
    pub condition: Option<String>,
    pub shell: Option<String>,
    pub timeout_s: Option<u64>,
    /// `prompt`/`agent` hooks: the model to ask (default: the small fast model, Haiku).
    pub model: Option<String>,
    pub source: HookSource,
    /// Plugin root or skill directory (namespaces dedup; `CLAUDE_PLUGIN_ROOT` for real runs).
    pub root: Option<String>,
}

/// Hooks of one settings file or hooks.json, plus what was skipped and why.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedHooks {
    pub hooks: Vec<ConfiguredHook>,
    pub warnings: Vec<String>,
}

/// Reads a `hooks` object (`{Event: [{matcher, hooks: [..]}]}`). Unknown events and malformed
/// entries become warnings, never errors: a settings file never stops a session.
pub fn parse_hooks(value: &Value, source: HookSource, root: Option<&str>, origin: &str) -> ParsedHooks {
    let mut out = ParsedHooks::default();
    let Some(events) = value.as_object() else {
        out.warnings.push(format!("{origin}: `hooks` is not an object"));
        return out;
    };
    // Events in the reference's order, not the file's: the file's key order is not meaningful.
    let mut keys: Vec<&String> = events.keys().collect();
    keys.sort_by_key(|k| HOOK_EVENTS.iter().position(|e| e == k).unwrap_or(usize::MAX));
    for event in keys {
        if !HOOK_EVENTS.contains(&event.as_str()) {
            out.warnings.push(format!("{origin}: unknown hook event `{event}` skipped"));
            continue;
        }
        let Some(groups) = events[event].as_array() else {
            out.warnings.push(format!("{origin}: hooks.{event} is not an array"));
            continue;
        };
        for (g, group) in groups.iter().enumerate() {
            let matcher = group.get("matcher").and_then(Value::as_str).unwrap_or("").to_owned();
            let Some(hooks) = group.get("hooks").and_then(Value::as_array) else {
                out.warnings.push(format!("{origin}: hooks.{event}[{g}] has no `hooks` array"));
                continue;
            };
            for (h, hook) in hooks.iter().enumerate() {
                let kind = hook.get("type").and_then(Value::as_str).unwrap_or("command").to_owned();
                let text_key = match kind.as_str() {
                    "command" => "command",
                    "prompt" | "agent" => "prompt",
                    "http" => "url",
                    other => {
                        out.warnings.push(format!("{origin}: hooks.{event}[{g}].hooks[{h}]: unknown type `{other}` skipped"));
                        continue;
                    }
                };
                let Some(text) = hook.get(text_key).and_then(Value::as_str) else {
                    out.warnings.push(format!("{origin}: hooks.{event}[{g}].hooks[{h}]: missing `{text_key}`"));
                    continue;
                };
                let command = match root {
                    Some(root) => text.replace("${CLAUDE_PLUGIN_ROOT}", root),
                    None => text.to_owned(),
                };
                out.hooks.push(ConfiguredHook {
                    event: event.clone(),
                    matcher: matcher.clone(),
                    kind,
                    command,
                    condition: hook.get("if").and_then(Value::as_str).map(str::to_owned),
                    shell: hook.get("shell").and_then(Value::as_str).map(str::to_owned),
                    timeout_s: hook.get("timeout").and_then(Value::as_u64),
                    model: hook.get("model").and_then(Value::as_str).map(str::to_owned),
                    source,
                    root: root.map(str::to_owned),
                });
            }
        }
    }
    out
}

/// The settings files of every level, in merge order: (source, path).
pub fn settings_paths(fs: &VirtualFs, home: &str, cwd: &str, managed_dir: &str) -> Vec<(HookSource, String)> {
    let cwd = cwd.trim_end_matches('/');
    let mut out = vec![
        (HookSource::User, format!("{}/.claude/settings.json", home.trim_end_matches('/'))),
        (HookSource::Project, format!("{cwd}/.claude/settings.json")),
        (HookSource::Local, format!("{cwd}/.claude/settings.local.json")),
        (HookSource::Policy, format!("{managed_dir}/managed-settings.json")),
    ];
    if let Ok(entries) = fs.list_dir(&format!("{managed_dir}/managed-settings.d")) {
        // list_dir is sorted.
        out.extend(entries.into_iter().filter(|e| !e.is_dir && e.name.ends_with(".json")).map(|e| (HookSource::Policy, e.path)));
    }
    out
}

/// The hooks snapshot of the settings (`getHooksFromAllowedSources`), with the policy overrides:
/// `disableAllHooks` in policy → none; `allowManagedHooksOnly` in policy or `disableAllHooks`
/// elsewhere → policy hooks only.
pub fn load_settings_hooks(fs: &VirtualFs, home: &str, cwd: &str, managed_dir: &str) -> ParsedHooks {
    let mut out = ParsedHooks::default();
    let mut per_source: Vec<(HookSource, Value)> = Vec::new();
    for (source, path) in settings_paths(fs, home, cwd, managed_dir) {
        let Ok(text) = fs.read(&path) else { continue };
        match serde_json::from_str::<Value>(text) {
            Ok(value) => per_source.push((source, value)),
            Err(e) => out.warnings.push(format!("{path}: invalid JSON, skipped: {e}")),
        }
    }
    let policy_flag = |key: &str| per_source.iter().any(|(s, v)| *s == HookSource::Policy && v.get(key) == Some(&Value::Bool(true)));
    let other_disable =
        per_source.iter().any(|(s, v)| *s != HookSource::Policy && v.get("disableAllHooks") == Some(&Value::Bool(true)));
    if policy_flag("disableAllHooks") {
        return out;
    }
    let policy_only = policy_flag("allowManagedHooksOnly") || other_disable;
    for (source, value) in &per_source {
        if policy_only && *source != HookSource::Policy {
            continue;
        }
        if let Some(hooks) = value.get("hooks") {
            let parsed = parse_hooks(hooks, *source, None, source.name());
            out.hooks.extend(parsed.hooks);
            out.warnings.extend(parsed.warnings);
        }
    }
    out
}

/// `matchesPattern`: empty or `*` matches all; `^[A-Za-z0-9_|]+$` is an exact name or `|` list
/// (commas are accepted as separators too); anything else a regex. Legacy tool names (`Task`)
/// match their current name (`Agent`). An invalid regex matches nothing.
pub fn matches_pattern(matcher: &str, query: &str) -> bool {
    let matcher = matcher.trim();
    if matcher.is_empty() || matcher == "*" {
        return true;
    }
    let legacy = legacy_name(query);
    if matcher.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '|' || c == ',' || c == ' ') {
        return matcher
            .split(['|', ','])
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .any(|m| m == query || legacy.is_some_and(|l| l == m) || normalized_name(m) == query);
    }
    regex::Regex::new(matcher).is_ok_and(|re| re.is_match(query) || legacy.is_some_and(|l| re.is_match(l)))
}

/// The legacy name of a current tool name.
fn legacy_name(name: &str) -> Option<&'static str> {
    match name {
        "Agent" => Some("Task"),
        _ => None,
    }
}

fn normalized_name(name: &str) -> &str {
    match name {
        "Task" => "Agent",
        other => other,
    }
}

/// The `if` condition in permission-rule syntax: `Tool` or `Tool(pattern)`; the pattern is a
/// glob (`*`) or a prefix (`cmd:*`) over the tool's primary argument (Bash `command`, the file
/// tools' `file_path`/`path`, else any string field).
pub fn condition_matches(condition: &str, tool_name: &str, tool_input: &Value) -> bool {
    let condition = condition.trim();
    let (tool, pattern) = match condition.split_once('(') {
        Some((tool, rest)) => (tool.trim(), Some(rest.strip_suffix(')').unwrap_or(rest))),
        None => (condition, None),
    };
    if !matches_pattern(tool, tool_name) {
        return false;
    }
    let Some(pattern) = pattern else { return true };
    let argument = ["command", "file_path", "path", "pattern", "url"].iter().find_map(|k| tool_input.get(*k).and_then(Value::as_str));
    let Some(argument) = argument else { return false };
    if let Some(prefix) = pattern.strip_suffix(":*") {
        return argument.starts_with(prefix);
    }
    let regex = format!("^{}$", pattern.split('*').map(regex::escape).collect::<Vec<_>>().join(".*"));
    regex::Regex::new(&regex).is_ok_and(|re| re.is_match(argument))
}

/// `getMatchingHooks`: the hooks of `event` whose matcher accepts `query` (every matcher for the
/// events without a match query), `if` conditions checked for tool events (a hook with `if`
/// on another event is skipped), duplicates dropped (the last wins, at its position), grouped
/// by type: command, prompt, agent, http.
pub fn matching_hooks<'a>(all: &'a [ConfiguredHook], event: &str, query: &str, tool_input: &Value) -> Vec<&'a ConfiguredHook> {
    let tool_event = TOOL_EVENTS.contains(&event);
    let matched: Vec<&ConfiguredHook> = all
        .iter()
        .filter(|h| h.event == event)
        .filter(|h| UNMATCHED_EVENTS.contains(&event) || matches_pattern(&h.matcher, query))
        .filter(|h| match &h.condition {
            None => true,
            Some(c) => tool_event && condition_matches(c, query, tool_input),
        })
        .collect();
    let key = |h: &ConfiguredHook| (h.kind.clone(), h.command.clone(), h.shell.clone(), h.condition.clone(), h.root.clone());
    let mut last: BTreeMap<_, usize> = BTreeMap::new();
    for (i, h) in matched.iter().enumerate() {
        last.insert(key(h), i);
    }
    let mut kept: Vec<&ConfiguredHook> = matched.iter().enumerate().filter(|(i, h)| last[&key(h)] == *i).map(|(_, h)| *h).collect();
    let rank = |kind: &str| ["command", "prompt", "agent", "http"].iter().position(|k| *k == kind).unwrap_or(4);
    kept.sort_by_key(|h| rank(&h.kind));
    kept
}

/// PreToolUse permission decisions, in precedence order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Permission {
    Deny,
    Ask,
    Allow,
}

/// The aggregated result of running the matched hooks of one event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HookRun {
    pub event: String,
    /// How many hooks ran (configured and standalone).
    pub ran: usize,
    /// Trimmed non-JSON stdout of hooks that exited 0, non-empty, in hook order.
    pub successes: Vec<String>,
    /// Trimmed stdout of every hook that exited 0 with non-empty output (PreCompact uses it).
    pub raw_outputs: Vec<String>,
    pub additional_context: Vec<String>,
    /// Exit 2 messages and JSON `block` reasons.
    pub blocking_errors: Vec<String>,
    pub non_blocking_errors: Vec<String>,
    pub permission: Option<Permission>,
    pub permission_reason: Option<String>,
    pub updated_input: Option<Value>,
    pub updated_output: Option<Value>,
    /// `continue: false`.
    pub stop_reason: Option<String>,
    pub prevent_continuation: bool,
    /// Wall time of the run: the hooks run in parallel, so the longest one, each capped at its
    /// timeout.
    pub elapsed_ms: u64,
    /// Hooks cancelled at their timeout (their output is ignored).
    pub timed_out: usize,
    /// The model requests `prompt` and `agent` hooks made, in hook order.
    pub model_calls: Vec<HookModelCall>,
}

/// A `prompt` or `agent` hook's question to a model and the verdict it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookModelCall {
    /// `prompt` or `agent`.
    pub kind: String,
    /// The hook's prompt with `$ARGUMENTS` replaced by the hook input JSON.
    pub prompt: String,
    pub model: Option<String>,
    /// The model's answer, `{"ok": …, "reason": …}` as text.
    pub verdict: String,
}

/// Default timeouts by hook type (reference §7.2): command 600 s, prompt 30 s, agent 60 s,
/// http 600 s; SessionEnd hooks get `session_end_ms` whatever their type.
pub fn default_timeout_ms(kind: &str, event: &str, session_end_ms: u64) -> u64 {
    if event == "SessionEnd" {
        return session_end_ms;
    }
    match kind {
        "prompt" => 30_000,
        "agent" => 60_000,
        _ => 600_000,
    }
}

/// SessionEnd's default budget (`CLAUDE_CODE_SESSIONEND_HOOKS_TIMEOUT_MS` overrides it).
pub const SESSION_END_TIMEOUT_MS: u64 = 1_500;

/// What the hook runner needs besides the hooks.
pub struct HookCall<'a> {
    pub event: &'a str,
    /// The match query (tool name, source, trigger, ...).
    pub query: &'a str,
    /// Event-specific input fields (merged over the base fields).
    pub input: Value,
    pub session_id: &'a str,
    pub cwd: &'a str,
    /// Run configured command hooks without a scripted answer for real.
    pub run_real: bool,
    /// SessionEnd's timeout.
    pub session_end_timeout_ms: u64,
}

/// Runs the configured hooks matching the call plus the standalone scripted answers, and
/// aggregates their outputs in the documented deterministic order.
pub fn run_hooks(configured: &[ConfiguredHook], answers: &[HookAnswer], call: &HookCall) -> HookRun {
    let tool_input = call.input.get("tool_input").unwrap_or(&Value::Null);
    // The hook's input JSON, made when a hook reads it (most calls match none).
    let made = std::cell::OnceCell::new();
    let input = || {
        made.get_or_init(|| {
            let mut input = json!({
                "session_id": call.session_id,
                "transcript_path": format!("/virtual/transcripts/{}.jsonl", call.session_id),
                "cwd": call.cwd,
                "hook_event_name": call.event,
            });
            if let (Some(base), Some(extra)) = (input.as_object_mut(), call.input.as_object()) {
                for (k, v) in extra {
                    base.insert(k.clone(), v.clone());
                }
            }
            input
        })
    };
    let mut run = HookRun { event: call.event.to_owned(), ..HookRun::default() };
    for hook in matching_hooks(configured, call.event, call.query, tool_input) {
        // HTTP hooks never run for SessionStart and Setup.
        if hook.kind == "http" && matches!(call.event, "SessionStart" | "Setup") {
            continue;
        }
        let answer = answers.iter().find(|a| {
            a.event == call.event
                && a.command.as_deref() == Some(hook.command.as_str())
                && a.matcher.as_deref().is_none_or(|m| m == hook.matcher)
        });
        run.ran += 1;
        let timeout_ms = hook.timeout_s.map_or_else(|| default_timeout_ms(&hook.kind, call.event, call.session_end_timeout_ms), |s| s * 1000);
        let duration_ms = answer.map_or(0, HookAnswer::duration_ms);
        run.elapsed_ms = run.elapsed_ms.max(duration_ms.min(timeout_ms));
        if duration_ms > timeout_ms {
            // Cancelled at the timeout: a non-blocking outcome that is never sent to the model.
            run.timed_out += 1;
            run.non_blocking_errors.push(format!("[{}]: timed out after {} ms", hook.command, timeout_ms));
            continue;
        }
        match hook.kind.as_str() {
            "prompt" | "agent" => {
                let verdict = answer.map_or_else(|| json!({"ok": true}).to_string(), HookAnswer::verdict_text);
                run.model_calls.push(HookModelCall {
                    kind: hook.kind.clone(),
                    prompt: hook.command.replace("$ARGUMENTS", &input().to_string()),
                    model: hook.model.clone(),
                    verdict: verdict.clone(),
                });
                absorb_verdict(&mut run, call.event, &hook.command, &verdict);
            }
            "http" => {
                let (status, body) = answer.map_or((200, String::new()), |a| (a.status.unwrap_or(200), a.output(call.event).1));
                if (200..300).contains(&status) {
                    absorb(&mut run, call.event, &hook.command, (0, body, String::new()));
                } else {
                    run.non_blocking_errors.push(format!("[{}]: HTTP {status}", hook.command));
                }
            }
            _ => {
                let output = match answer {
                    Some(answer) => answer.output(call.event),
                    None if call.run_real => execute_command(hook, input(), call.cwd),
                    None => (0, String::new(), String::new()),
                };
                absorb(&mut run, call.event, &hook.command, output);
            }
        }
    }
    let query_free = UNMATCHED_EVENTS.contains(&call.event);
    for answer in answers.iter().filter(|a| a.command.is_none() && a.event == call.event) {
        if !query_free && !answer.matches(call.event, call.query) {
            continue;
        }
        run.ran += 1;
        let timeout_ms = default_timeout_ms("command", call.event, call.session_end_timeout_ms);
        run.elapsed_ms = run.elapsed_ms.max(answer.duration_ms().min(timeout_ms));
        if answer.duration_ms() > timeout_ms {
            run.timed_out += 1;
            run.non_blocking_errors.push(format!("[scripted]: timed out after {timeout_ms} ms"));
            continue;
        }
        absorb(&mut run, call.event, "scripted", answer.output(call.event));
    }
    run
}

/// A `prompt`/`agent` hook's verdict: `{"ok": false, "reason": …}` blocks with the reason (what
/// blocking means is the event's: deny the tool, send Stop feedback, drop the prompt, ...);
/// `ok: true` passes; an answer that is not that JSON is a non-blocking error.
fn absorb_verdict(run: &mut HookRun, event: &str, hook: &str, verdict: &str) {
    let parsed = serde_json::from_str::<Value>(verdict.trim()).ok();
    match parsed.as_ref().and_then(|v| v.get("ok")).and_then(Value::as_bool) {
        Some(true) => {}
        Some(false) => {
            let reason = parsed.as_ref().and_then(|v| v.get("reason")).and_then(Value::as_str).unwrap_or("the condition was not met");
            if event == "PreToolUse" {
                merge_permission(run, Permission::Deny, Some(reason.to_owned()));
            }
            run.blocking_errors.push(format!("[{hook}]: {reason}"));
        }
        None => run.non_blocking_errors.push(format!("[{hook}]: the model's answer is not a verdict")),
    }
}

/// The one place a simulation may touch the OS, and only with `run_hooks` on: `sh -c` with the
/// input JSON on stdin. Timeouts are not enforced.
fn execute_command(hook: &ConfiguredHook, input: &Value, cwd: &str) -> (i32, String, String) {
    use std::io::Write;
    let shell = if hook.shell.as_deref() == Some("powershell") { "pwsh" } else { "sh" };
    let mut command = std::process::Command::new(shell);
    command.arg("-c").arg(&hook.command).env("CLAUDE_PROJECT_DIR", cwd);
    if let Some(root) = &hook.root {
        command.env("CLAUDE_PLUGIN_ROOT", root);
    }
    command.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let Ok(mut child) = command.spawn() else { return (1, String::new(), format!("failed to start `{}`", hook.command)) };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input.to_string().as_bytes());
    }
    match child.wait_with_output() {
        Ok(out) => (
            out.status.code().unwrap_or(1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ),
        Err(e) => (1, String::new(), e.to_string()),
    }
}

/// `parseHookOutput` + `processHookJSONOutput` for one hook's (exit, stdout, stderr).
fn absorb(run: &mut HookRun, event: &str, command: &str, (exit, stdout, stderr): (i32, String, String)) {
    let trimmed = stdout.trim();
    match exit {
        0 => {}
        2 => {
            let err = if stderr.trim().is_empty() { "No stderr output".to_owned() } else { stderr.trim().to_owned() };
            run.blocking_errors.push(format!("[{command}]: {err}"));
            return;
        }
        _ => {
            run.non_blocking_errors.push(format!("[{command}]: exit {exit}"));
            return;
        }
    }
    if trimmed.is_empty() {
        return;
    }
    run.raw_outputs.push(trimmed.to_owned());
    if !trimmed.starts_with('{') {
        run.successes.push(cap(trimmed));
        return;
    }
    let Ok(Value::Object(json)) = serde_json::from_str::<Value>(trimmed) else {
        run.non_blocking_errors.push(format!("[{command}]: stdout is not valid JSON"));
        return;
    };
    if json.get("continue") == Some(&Value::Bool(false)) {
        run.prevent_continuation = true;
        run.stop_reason = json.get("stopReason").and_then(Value::as_str).map(str::to_owned);
    }
    let reason = json.get("reason").and_then(Value::as_str).map(str::to_owned);
    match json.get("decision").and_then(Value::as_str) {
        Some("approve") => merge_permission(run, Permission::Allow, reason.clone()),
        Some("block") => {
            if event == "PreToolUse" {
                merge_permission(run, Permission::Deny, reason.clone());
            }
            run.blocking_errors.push(reason.clone().unwrap_or_else(|| "Blocked by hook".into()));
        }
        _ => {}
    }
    let Some(specific) = json.get("hookSpecificOutput").and_then(Value::as_object) else { return };
    if specific.get("hookEventName").and_then(Value::as_str) != Some(event) {
        run.non_blocking_errors.push(format!("[{command}]: hookSpecificOutput.hookEventName is not {event}"));
        return;
    }
    if let Some(ctx) = specific.get("additionalContext").and_then(Value::as_str) {
        run.additional_context.push(cap(ctx));
    }
    if event == "PreToolUse" {
        let reason = specific.get("permissionDecisionReason").and_then(Value::as_str).map(str::to_owned);
        match specific.get("permissionDecision").and_then(Value::as_str) {
            Some("deny") => merge_permission(run, Permission::Deny, reason),
            Some("ask") => merge_permission(run, Permission::Ask, reason),
            Some("allow") => merge_permission(run, Permission::Allow, reason),
            _ => {}
        }
        if let Some(input) = specific.get("updatedInput") {
            // Forwarded for allow or ask, or alone; a later hook's input wins.
            run.updated_input = Some(input.clone());
        }
    }
    if event == "PostToolUse"
        && let Some(output) = specific.get("updatedToolOutput").or_else(|| specific.get("updatedMCPToolOutput"))
    {
        run.updated_output = Some(output.clone());
    }
}

fn merge_permission(run: &mut HookRun, permission: Permission, reason: Option<String>) {
    if run.permission.is_none_or(|p| permission < p) {
        run.permission = Some(permission);
        run.permission_reason = reason;
    }
}

fn cap(text: &str) -> String {
    if text.chars().count() <= HOOK_OUTPUT_MAX {
        text.to_owned()
    } else {
        text.chars().take(HOOK_OUTPUT_MAX).collect::<String>() + "… [output truncated]"
    }
}

impl HookRun {
    /// `updatedInput` applies unless the decision is deny.
    pub fn effective_input(&self) -> Option<&Value> {
        if self.permission == Some(Permission::Deny) { None } else { self.updated_input.as_ref() }
    }

    /// The PreToolUse denial text, when the tool must not run.
    pub fn denial(&self, tool: &str) -> Option<String> {
        if let Some(err) = self.blocking_errors.first() {
            return Some(format!("PreToolUse:{tool} hook error: {err}"));
        }
        (self.permission == Some(Permission::Deny))
            .then(|| format!("PreToolUse:{tool} hook error: {}", self.permission_reason.clone().unwrap_or_else(|| "Blocked by hook".into())))
    }
}

/// A one-line-per-matcher summary of hooks (`Event [matcher] source: command`), for snapshots.
pub fn describe(hooks: &[ConfiguredHook]) -> String {
    hooks
        .iter()
        .map(|h| {
            let matcher = if h.matcher.is_empty() { "*".to_owned() } else { h.matcher.clone() };
            let cond = h.condition.as_deref().map(|c| format!(" if {c}")).unwrap_or_default();
            format!("{} [{matcher}]{cond} {} {}: {}", h.event, h.source.name(), h.kind, h.command)
        })
        .collect::<Vec<_>>()
        .join("\n")
}
