//! Scripted counterparts of the agent's outside services: MCP servers and hook answers.

use serde::Deserialize;
use serde_json::Value;

/// A tool an MCP server offers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolDef {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default = "empty_schema")]
    pub input_schema: Value,
    /// `_meta['anthropic/alwaysLoad']`: never deferred.
    #[serde(default)]
    pub always_load: bool,
}

fn empty_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// The repository as `git` would report it when the session starts (`getGitStatus`): the
/// branch, the main branch, the user, `git status --short` lines and `git log --oneline` lines
/// (newest first; the client asks for five).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitState {
    pub branch: String,
    #[serde(default = "main_branch")]
    pub main_branch: String,
    #[serde(default)]
    pub user_name: Option<String>,
    #[serde(default)]
    pub status: Vec<String>,
    #[serde(default)]
    pub recent_commits: Vec<String>,
}

fn main_branch() -> String {
    "main".to_owned()
}

/// A scripted MCP server.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    pub name: String,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub tools: Vec<McpToolDef>,
    /// Connected before the first request (default); `false` waits for an `mcp_connect` step.
    #[serde(default = "yes")]
    pub connected: bool,
}

fn yes() -> bool {
    true
}

/// What a hook answers when it runs. With `command`, the answer belongs to the configured hook
/// of that event whose command is this string (and, when `matcher` is given, whose matcher is
/// exactly this string): it is keyed by event + matcher + command. Without `command` the answer
/// is a standalone scripted hook whose `matcher` follows the reference's matching rules (empty
/// or `*` matches all, `A|B` an exact list, anything else a regex), placed after every
/// configured hook.
///
/// For a `command` hook (and a standalone answer) the answer is turned into what the command
/// would have produced: exit code, stdout, stderr. `json` is printed as stdout; the shortcut
/// fields (`additional_context`, `decision`, `reason`, `updated_input`, `updated_output`) build
/// the event's `hookSpecificOutput` JSON when neither `json` nor `stdout` is given. An `http`
/// hook's answer is the response: `status` (default 200) and the body (`json`/`stdout` or the
/// shortcut fields). A `prompt` or `agent` hook's answer is the model's verdict: `ok` (default
/// true) and `reason`, or a `json`/`stdout` body holding them. `duration` is how long the hook
/// takes; beyond its timeout it is cancelled.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookAnswer {
    /// One of the 27 events of the reference (`PreToolUse`, `Stop`, ...).
    pub event: String,
    #[serde(default)]
    pub matcher: Option<String>,
    /// The configured command this answers (settings, plugin or skill hook).
    #[serde(default)]
    pub command: Option<String>,
    /// Exit code. Default 0; 2 is blocking; anything else a non-blocking error.
    #[serde(default)]
    pub exit_code: i32,
    /// Plain stdout (exit 0): model-visible for SessionStart and UserPromptSubmit.
    #[serde(default)]
    pub stdout: Option<String>,
    #[serde(default)]
    pub stderr: Option<String>,
    /// A JSON object printed as stdout.
    #[serde(default)]
    pub json: Option<Value>,
    /// `hookSpecificOutput.additionalContext`.
    #[serde(default)]
    pub additional_context: Option<String>,
    /// `permissionDecision` for PreToolUse (`allow`, `deny`, `ask`), or `block` for the
    /// top-level `decision` of the other events.
    #[serde(default)]
    pub decision: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
    /// PreToolUse `updatedInput`: replaces the tool's whole input.
    #[serde(default)]
    pub updated_input: Option<Value>,
    /// PostToolUse `updatedToolOutput`: replaces the tool's result.
    #[serde(default)]
    pub updated_output: Option<Value>,
    /// `prompt`/`agent` hooks: the verdict (`false` blocks with `reason`).
    #[serde(default)]
    pub ok: Option<bool>,
    /// `http` hooks: the response status.
    #[serde(default)]
    pub status: Option<u16>,
    /// How long the hook runs (`45s`, `2m`); longer than its timeout cancels it.
    #[serde(default)]
    pub duration: Option<crate::scenario::DurationMs>,
}

impl HookAnswer {
    /// How long the hook runs, in milliseconds.
    pub fn duration_ms(&self) -> u64 {
        self.duration.map_or(0, |d| d.0)
    }

    /// The verdict of a `prompt`/`agent` hook as the model's JSON text: `json`, else `stdout`,
    /// else `{"ok": ok, "reason": reason}` from the shortcut fields.
    pub fn verdict_text(&self) -> String {
        if let Some(json) = &self.json {
            return json.to_string();
        }
        if let Some(stdout) = &self.stdout {
            return stdout.clone();
        }
        let mut verdict = serde_json::Map::new();
        verdict.insert("ok".into(), Value::Bool(self.ok.unwrap_or(true)));
        if let Some(reason) = &self.reason {
            verdict.insert("reason".into(), Value::String(reason.clone()));
        }
        Value::Object(verdict).to_string()
    }

    /// Whether this standalone answer applies to `query` (tool name, source, ...).
    pub fn matches(&self, event: &str, query: &str) -> bool {
        self.event == event && crate::agent::hooks::matches_pattern(self.matcher.as_deref().unwrap_or(""), query)
    }

    /// (exit code, stdout, stderr) as a command hook of `event` would have produced them.
    pub fn output(&self, event: &str) -> (i32, String, String) {
        let stderr = self.stderr.clone().unwrap_or_default();
        if let Some(json) = &self.json {
            return (self.exit_code, json.to_string(), stderr);
        }
        if let Some(stdout) = &self.stdout {
            return (self.exit_code, stdout.clone(), stderr);
        }
        let mut specific = serde_json::Map::new();
        let mut top = serde_json::Map::new();
        if let Some(ctx) = &self.additional_context {
            specific.insert("additionalContext".into(), Value::String(ctx.clone()));
        }
        if let Some(decision) = &self.decision {
            if event == "PreToolUse" {
                specific.insert("permissionDecision".into(), Value::String(decision.clone()));
                if let Some(reason) = &self.reason {
                    specific.insert("permissionDecisionReason".into(), Value::String(reason.clone()));
                }
            } else {
                top.insert("decision".into(), Value::String(decision.clone()));
                if let Some(reason) = &self.reason {
                    top.insert("reason".into(), Value::String(reason.clone()));
                }
            }
        }
        if let Some(input) = &self.updated_input {
            specific.insert("updatedInput".into(), input.clone());
        }
        if let Some(output) = &self.updated_output {
            specific.insert("updatedToolOutput".into(), output.clone());
        }
        if specific.is_empty() && top.is_empty() {
            return (self.exit_code, String::new(), stderr);
        }
        if !specific.is_empty() {
            specific.insert("hookEventName".into(), Value::String(event.to_owned()));
            top.insert("hookSpecificOutput".into(), Value::Object(specific));
        }
        (self.exit_code, Value::Object(top).to_string(), stderr)
    }
}
