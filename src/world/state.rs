//! The [`World`] struct: the pieces bundled for the agent, plus the settings a scenario fixes.

use std::collections::BTreeMap;

use crate::api::ToolResultContent;

use super::clock::Clock;
use super::fs::VirtualFs;
use super::model::ScriptedModel;
use super::rng::Rng;
use super::scripted::{GitState, HookAnswer, McpServer};

/// A scripted output for a tool the simulator does not execute itself (Bash, WebFetch, MCP
/// tools), keyed by tool_use id in [`World::tool_outputs`].
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedToolOutput {
    pub content: ToolResultContent,
    pub is_error: bool,
    /// An Agent call's recorded output whose subagent the agent still runs (its requests are
    /// measured, answered by its lane's scripted replies); the call returns this output.
    pub runs_subagent: bool,
    /// The file the call read or wrote, as recorded (path, content): left in the fs and counted
    /// read, as the real tool would have.
    pub file: Option<(String, crate::api::SharedText)>,
    /// Its place among the script's outputs as written ([`crate::scenario::ToolOutput::written`]):
    /// a recorded session's workload writes them in the order the tools completed.
    pub completed: usize,
}

/// Everything outside the agent. Built by `Scenario::into_world`; the agent takes `&mut World`.
#[derive(Debug, Clone)]
pub struct World {
    pub clock: Clock,
    pub fs: VirtualFs,
    /// The root stream; subsystems take `rng.fork("<subsystem>")`.
    pub rng: Rng,
    pub model: ScriptedModel,
    /// Environment variables the agent honours (sorted).
    pub env: BTreeMap<String, String>,
    /// Working directory of the session (absolute).
    pub cwd: String,
    /// Model id the session runs on.
    pub model_id: String,
    /// Overrides of the model's context window / max output tokens, when the scenario sets them.
    pub context_window: Option<u64>,
    pub max_output_tokens: Option<u64>,
    /// Scripted tool outputs by tool_use id: read only once built, so shared by every copy of
    /// the world (a run's checkpoints copy the world; the outputs hold the session's results).
    pub tool_outputs: std::sync::Arc<BTreeMap<String, ScriptedToolOutput>>,
    /// Scripted MCP servers in configuration order, with their connection state.
    pub mcp_servers: Vec<McpServer>,
    /// Scripted hook answers, in settings order.
    pub hook_answers: Vec<HookAnswer>,
    /// `claudeMdExcludes` of the merged settings.
    pub claude_md_excludes: Vec<String>,
    /// `includeGitInstructions` of the merged settings (default true).
    pub include_git_instructions: bool,
    /// The repository's state; `None` when the cwd is not a scripted git repository.
    pub git: Option<GitState>,
    /// The user's home directory (config home is `{home}/.claude`).
    pub home: String,
    /// `claude --append-system-prompt TEXT`: appended to the system prompt's dynamic part.
    pub append_system_prompt: Option<std::sync::Arc<str>>,
    /// Appended to the system prompt's static part, before the boundary (`world.static_system_prompt`).
    pub static_system_prompt: Option<std::sync::Arc<str>>,
    /// Per built-in agent type, text its prompt ends with (`world.agent_prompt_extra`).
    pub agent_prompt_extra: std::collections::BTreeMap<String, String>,
    /// The dynamic part carries its own marker (`world.dynamic_system_marker`).
    pub dynamic_system_marker: bool,
    /// The script supplies the attachments (`attachment` steps): the agent adds none of its
    /// own per-turn ones.
    pub recorded_attachments: bool,
    /// The client redacts thinking: no `clear_thinking` edit of its own (`world.redact_thinking`).
    pub redact_thinking: bool,
    /// What every full compaction of the main thread restores beyond the agent's own restore:
    /// a real session's sized stand-in for what its client kept from before the file
    /// (`world.restored_unrecorded`). Shared by every copy of the world, as the tool outputs
    /// are (a run's checkpoints copy the world).
    pub restored_unrecorded: Option<std::sync::Arc<str>>,
}

impl World {
    /// An empty world: UTC clock at `epoch_unix_ms`, empty fs, no script, cwd `/`.
    pub fn new(epoch_unix_ms: i64, seed: u64, model_id: impl Into<String>) -> Self {
        let rng = Rng::new(seed);
        World {
            clock: Clock::new(epoch_unix_ms),
            fs: VirtualFs::new(),
            model: ScriptedModel::new(rng.fork("model")),
            rng,
            env: BTreeMap::new(),
            cwd: "/".to_owned(),
            model_id: model_id.into(),
            context_window: None,
            max_output_tokens: None,
            tool_outputs: Default::default(),
            mcp_servers: Vec::new(),
            hook_answers: Vec::new(),
            claude_md_excludes: Vec::new(),
            include_git_instructions: true,
            git: None,
            home: "/home/user".to_owned(),
            append_system_prompt: None,
            static_system_prompt: None,
            agent_prompt_extra: std::collections::BTreeMap::new(),
            dynamic_system_marker: false,
            recorded_attachments: false,
            redact_thinking: false,
            restored_unrecorded: None,
        }
    }

    /// The value of an environment variable the agent honours.
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env.get(name).map(String::as_str)
    }
}
