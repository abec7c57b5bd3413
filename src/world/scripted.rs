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

/// What a hook answers when its event and matcher fire. Matchers follow the reference: empty or
/// `*` matches all, `A|B` is an exact list, anything else a regex.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookAnswer {
    /// `SessionStart`, `UserPromptSubmit`, `PreToolUse`, `PostToolUse`.
    pub event: String,
    #[serde(default)]
    pub matcher: Option<String>,
    /// Plain stdout (exit 0): model-visible for SessionStart and UserPromptSubmit.
    #[serde(default)]
    pub stdout: Option<String>,
    /// `hookSpecificOutput.additionalContext`.
    #[serde(default)]
    pub additional_context: Option<String>,
    /// `permissionDecision` for PreToolUse: `allow`, `deny`, `ask`.
    #[serde(default)]
    pub decision: Option<String>,
    #[serde(default)]
    pub reason: Option<String>,
}

impl HookAnswer {
    /// Whether this answer applies to `query` (tool name, source, ...).
    pub fn matches(&self, event: &str, query: &str) -> bool {
        if self.event != event {
            return false;
        }
        let Some(matcher) = self.matcher.as_deref().filter(|m| !m.is_empty() && *m != "*") else { return true };
        if matcher.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '|') {
            return matcher.split('|').any(|m| m == query);
        }
        regex::Regex::new(matcher).is_ok_and(|re| re.is_match(query))
    }
}
