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

/// The repository state `git` would report (`world.git`): what the system prompt's git snapshot
/// is read from. Changed by the `git` script step (the user commits or edits behind the
/// agent's back); the agent reads it when it takes its snapshot (session start, `--resume`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitRepo {
    #[serde(default = "default_branch")]
    pub branch: String,
    #[serde(default = "default_branch")]
    pub main_branch: String,
    #[serde(default)]
    pub user_name: Option<String>,
    /// `git status --short`; empty means clean.
    #[serde(default)]
    pub status: String,
    /// `git log --oneline -n 5`.
    #[serde(default)]
    pub recent_commits: String,
}

fn default_branch() -> String {
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
/// The answer is turned into what a command hook would have produced: exit code, stdout,
/// stderr. `json` is printed as stdout; the shortcut fields (`additional_context`, `decision`,
/// `reason`, `updated_input`, `updated_output`) build the event's `hookSpecificOutput` JSON
/// when neither `json` nor `stdout` is given.
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
}

impl HookAnswer {
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
