//! The scenario types. [`WorldSpec`] and [`Expect`] are read as they are; the script is read
//! as raw steps ([`super::raw`]) and checked into [`Step`] values.

use std::collections::BTreeMap;

use indexmap::IndexMap;
use serde::Deserialize;

use crate::api::{ContentBlock, SharedBlocks, SharedText, StopReason, Usage};
use crate::world::{GitState, HookAnswer, Latency, McpServer, McpToolDef, Reply};

use super::values::{EnvValue, FileSpec, Rfc3339, TimeZoneName};

/// A loaded, validated scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// File name as given to the loader (used in messages and reports).
    pub file: String,
    pub name: String,
    pub description: Option<String>,
    pub world: WorldSpec,
    pub script: Vec<Step>,
    pub expect: Expect,
}

/// `world:` — the starting state of everything outside the agent.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorldSpec {
    /// Model id, kept as written (resolution against the model table happens elsewhere).
    pub model: String,
    /// Overrides the model's context window.
    #[serde(default)]
    pub context_window: Option<u64>,
    /// Overrides the model's default max output tokens.
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    /// Virtual time 0, RFC 3339. Default `2026-01-01T09:00:00Z`.
    #[serde(default = "default_clock_start")]
    pub clock_start: Rfc3339,
    /// Zone for local dates ("currentDate", date rollover). Default `UTC`.
    #[serde(default)]
    pub timezone: TimeZoneName,
    /// Seed of the world's rng. Default 0: runs are reproducible unless a seed is chosen.
    #[serde(default)]
    pub seed: u64,
    /// Working directory (absolute). Default `/repo`.
    #[serde(default = "default_cwd")]
    pub cwd: String,
    /// Initial files: path (absolute, or relative to `cwd`) → contents, or `{contents, mtime}`.
    /// Not journaled.
    #[serde(default)]
    pub files: IndexMap<String, FileSpec>,
    /// Environment variables the agent honours (`DISABLE_AUTO_COMPACT`, ...).
    #[serde(default)]
    pub env: BTreeMap<String, EnvValue>,
    /// When present, lanes without a script get synthesized replies instead of an error.
    #[serde(default)]
    pub fallback: Option<FallbackSpec>,
    /// The user's home directory (config home `{home}/.claude`). Default `/home/user`.
    #[serde(default = "default_home")]
    pub home: String,
    /// Settings the agent reads (the merged result of every settings level).
    #[serde(default)]
    pub settings: SettingsSpec,
    /// Scripted MCP servers, in configuration order.
    #[serde(default)]
    pub mcp_servers: Vec<McpServer>,
    /// Scripted hook answers, in settings order.
    #[serde(default)]
    pub hook_answers: Vec<HookAnswer>,
    /// Plugin folders (virtual paths) enabled at start.
    #[serde(default)]
    pub plugins: Vec<String>,
    /// The git repository at the cwd (branch, status lines, recent commits); absent means not a
    /// scripted repository.
    #[serde(default)]
    pub git: Option<GitState>,
    /// Real directories loaded into the virtual fs: `from` relative to the scenario file,
    /// mounted `at` a virtual path. Resolved by `load_scenario` into `files` (explicit files win).
    #[serde(default)]
    pub mount: Vec<MountSpec>,
    /// `claude --append-system-prompt TEXT`: text appended to the system prompt's dynamic part
    /// (after the boundary). `ctxsim import --to scenario` puts there, as sized filler, what the
    /// recorded client's prompt held that the agent does not model.
    #[serde(default)]
    pub append_system_prompt: Option<String>,
    /// Text the system prompt's static part ends with (before the boundary, under its
    /// global-scope marker). `ctxsim import --to scenario` puts there, as sized filler, the part
    /// of the recorded client's prompt the record shows cached at its global-scope level.
    #[serde(default)]
    pub static_system_prompt: Option<String>,
    /// Per built-in agent type, text its prompt ends with. `ctxsim import --to scenario` puts
    /// there, as sized filler, what the recorded client's request of a subagent it drives held
    /// beyond the agent's own (a built-in type whose prompt the profile has no size for).
    #[serde(default)]
    pub agent_prompt_extra: std::collections::BTreeMap<String, String>,
    /// The system prompt's dynamic part (after the boundary) carries a marker of its own (org
    /// scope), so the whole system prompt is cached at its end, as the recorded clients' was:
    /// every shipped session whose record shows a read falling into its system prompt read all
    /// of it. Set by `ctxsim import --to scenario`; no effect without the boundary.
    #[serde(default)]
    pub dynamic_system_marker: bool,
    /// The attachments are the script's (`attachment` steps, the ones a recorded client sent):
    /// the agent adds none of its own per-turn attachments and reminders. `ctxsim fidelity
    /// --engine agent` sets it for a transcript that records its attachments.
    #[serde(default)]
    pub recorded_attachments: bool,
    /// The client runs with redacted thinking (`isRedactThinkingActive`: replies carry their
    /// thinking without its text): it sends no `clear_thinking` edit of its own, so neither
    /// `keep: "all"` nor the >1h-idle latch's one turn. `ctxsim fidelity --engine agent` sets it
    /// for a transcript whose main-lane thinking has no stored text.
    #[serde(default)]
    pub redact_thinking: bool,
    /// Text every full compaction of the main thread restores (an attachment after the agent's
    /// own restored files and skills). `ctxsim import --to scenario` puts there, as sized filler,
    /// what a recorded client that `/clear`ed into the file restored beyond them: what the
    /// record shows after the file's first compaction beyond its prefix, memory and context, the
    /// files the client's rule restores and the command bodies the agent restores.
    #[serde(default)]
    pub restored_unrecorded: Option<String>,
}

/// `world.mount[i]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountSpec {
    pub from: String,
    pub at: String,
}

fn default_home() -> String {
    "/home/user".to_owned()
}

/// `world.settings:` — the merged settings.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SettingsSpec {
    /// `claudeMdExcludes`: globs of memory files to skip.
    #[serde(default)]
    pub claude_md_excludes: Vec<String>,
    /// `includeGitInstructions`: `false` leaves the git status out of the system prompt.
    #[serde(default)]
    pub include_git_instructions: Option<bool>,
}

fn default_clock_start() -> Rfc3339 {
    Rfc3339("2026-01-01T09:00:00Z".parse().expect("constant timestamp parses"))
}

fn default_cwd() -> String {
    "/repo".to_owned()
}

/// `world.fallback:` — synthesized replies for unscripted lanes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FallbackSpec {
    /// Size of a synthesized ordinary reply. Default 40.
    #[serde(default = "default_reply_tokens")]
    pub reply_tokens: u64,
    /// Size of a synthesized summary on `compact`/`session_memory`. Default 2000.
    #[serde(default = "default_summary_tokens")]
    pub summary_tokens: u64,
    /// Also synthesize when a scripted lane runs out. Default false.
    #[serde(default)]
    pub after_script_ends: bool,
}

fn default_reply_tokens() -> u64 {
    40
}

fn default_summary_tokens() -> u64 {
    2000
}

/// One step of the script, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// `user: "..."` — the user sends a prompt; the agent runs a turn. The text is shared with
    /// the record the agent keeps of it (and every copy of the script: a what-if's scenarios).
    User { text: crate::api::SharedText },
    /// `assistant: [...]` — the model's next reply on a lane.
    Assistant(AssistantStep),
    /// `tool_output: {Bash: "..."}` — outputs for tools the simulator does not execute, resolved
    /// to the tool_use ids of the preceding assistant step.
    ToolOutput(Vec<ToolOutput>),
    /// `wait: 10m` — virtual time passes.
    Wait { ms: u64 },
    /// `write_file: {path, content}` — the user changes a file behind the agent's back.
    WriteFile { path: String, content: String },
    /// `remove_file: path` — the user deletes a file or directory.
    RemoveFile { path: String },
    /// `mcp_connect: name` — a server of `world.mcp_servers` connects.
    McpConnect { server: String },
    /// `mcp_disconnect: name` — a server disconnects.
    McpDisconnect { server: String },
    /// `mcp_list_changed: {server, tools}` — a server replaces its tools.
    McpListChanged { server: String, tools: Vec<McpToolDef> },
    /// `plugin_enable: path` — the plugin folder at `path` is enabled; all plugins refresh.
    PluginEnable { root: String },
    /// `plugin_reload: true` — `/reload-plugins`: every enabled plugin is re-read.
    PluginReload,
    /// `model_switch: claude-opus-4-5` — `/model`: later requests go to another model.
    ModelSwitch { model: String },
    /// `git: {branch, status, recent_commits}` — the repository changes behind the agent's back
    /// (a commit, a checkout); the prompt keeps its snapshot until `/clear` or a resume.
    Git(GitState),
    /// `clear: true` — `/clear`: a new conversation (SessionEnd, then SessionStart `clear`).
    Clear,
    /// `resume: true` — `--resume` in a new process: the transcript continues, every
    /// per-process cache starts afresh (SessionStart `resume`).
    Resume,
    /// `compact: true` — `/compact`: the user compacts the conversation now (trigger `manual`).
    Compact,
    /// `attachment: {type, text, skill?}` — an attachment the recorded client sent here, as its
    /// text (`import --to scenario` of a transcript that records them); the agent sends it as
    /// is. With `skill`, the text is the body of that skill or slash command as the client
    /// expanded it: the agent also remembers it as invoked, so its compactions restore it
    /// (`invoked_skills`).
    Attachment { kind: String, text: String, skill: Option<String> },
    /// `microcompact: {tool_use_ids, history_chars}` — a microcompact the recorded client ran
    /// here (a recorded session driven as recorded, `fidelity --engine agent`): the results
    /// of these tool uses are cleared to the marker, and `history_chars` characters leave the
    /// start of the opening prompt (the stand-in for the history before a continuing file,
    /// whose results it cleared). Each id must be an earlier step's tool use.
    Microcompact { tool_use_ids: Vec<String>, history_chars: usize },
    /// `resume_lost: {tool_use_ids}` — a recorded client resumed here loaded its history back
    /// from the transcript's `parentUuid` chain, which does not hold these tool uses (parallel
    /// ones written beside it): they and their results leave the conversation.
    ResumeLost { tool_use_ids: Vec<String> },
}

impl Step {
    /// The step's kind as written in YAML.
    pub fn kind(&self) -> &'static str {
        match self {
            Step::User { .. } => "user",
            Step::Assistant(_) => "assistant",
            Step::ToolOutput(_) => "tool_output",
            Step::Wait { .. } => "wait",
            Step::WriteFile { .. } => "write_file",
            Step::RemoveFile { .. } => "remove_file",
            Step::McpConnect { .. } => "mcp_connect",
            Step::McpDisconnect { .. } => "mcp_disconnect",
            Step::McpListChanged { .. } => "mcp_list_changed",
            Step::PluginEnable { .. } => "plugin_enable",
            Step::PluginReload => "plugin_reload",
            Step::ModelSwitch { .. } => "model_switch",
            Step::Git(_) => "git",
            Step::Clear => "clear",
            Step::Resume => "resume",
            Step::Compact => "compact",
            Step::Attachment { .. } => "attachment",
            Step::Microcompact { .. } => "microcompact",
            Step::ResumeLost { .. } => "resume_lost",
        }
    }
}

/// A scripted model reply.
#[derive(Debug, Clone, PartialEq)]
pub struct AssistantStep {
    /// `main` unless `lane:` says otherwise.
    pub lane: String,
    /// Blocks with tool_use ids filled in; shared with the replies made from the step
    /// ([`AssistantStep::to_reply`]) and every copy of the script.
    pub content: SharedBlocks,
    /// From `stop_reason:`, else `tool_use` when a tool is called, else `end_turn`.
    pub stop_reason: StopReason,
    pub usage: Option<Usage>,
    /// From `output_tokens:` or `usage.output_tokens`, else estimated (chars / 4).
    pub output_tokens: u64,
    pub latency: Option<Latency>,
}

impl AssistantStep {
    pub fn to_reply(&self) -> Reply {
        Reply {
            content: self.content.clone(),
            stop_reason: self.stop_reason,
            usage: self.usage.clone(),
            latency: self.latency,
            output_tokens: self.output_tokens,
            synthetic: false,
        }
    }

    /// `(id, name)` of each tool_use block, in order.
    pub fn tool_uses(&self) -> impl Iterator<Item = (&str, &str)> {
        self.content.iter().filter_map(|b| match b {
            ContentBlock::ToolUse { id, name, .. } => Some((id.as_str(), name.as_str())),
            _ => None,
        })
    }
}

/// A scripted tool output bound to one tool_use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub tool_use_id: String,
    pub tool_name: String,
    /// Shared with the tool_result content made of it ([`ToolOutput::result_content`]) and
    /// every copy of the script (a plan's scenario, its built script): copying one copies no
    /// text.
    pub content: SharedText,
    pub is_error: bool,
    /// Images the tool returned after the text (a screenshot, an image file read).
    pub images: Vec<ImageSpec>,
    /// `subagent: true` on an Agent call's output: the agent runs the subagent with its own
    /// machinery (its requests answered by the scripted replies of lane `subagent:<type>`), and
    /// the call's result is this output, not the subagent's. A recorded session's workload
    /// drives its recorded subagents this way.
    pub subagent: bool,
    /// The file the call read or wrote, as recorded ([`ToolFile`]).
    pub file: Option<ToolFile>,
    /// Its place among the step's outputs as written (the step lists them in call order): a
    /// recorded session's workload writes them in the order the tools completed.
    pub written: usize,
}

/// `tool_output: {id: {file: {path, content}}}` — the file the call read or wrote, as the
/// recording shows it (a transcript's structured result): the executor leaves it in the virtual
/// fs and counts it read, so the agent's own compaction restores it. Written by `import --to
/// scenario`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolFile {
    pub path: String,
    /// Shared as [`ToolOutput::content`] is, with the file the run's fs holds.
    pub content: SharedText,
}

/// `tool_output: {id: {images: [{media_type: image/png, base64_bytes: 6000000, width: 512,
/// height: 320}]}}` — an image block whose base64 data has that many bytes (deterministic
/// filler). The size is what the API's limits read; `width` and `height`, when both are given,
/// are written into the filler's PNG header, so the image counts `width × height / 750` tokens
/// as a real one of those pixels does ([`crate::measure::blocks::image_tokens`]); without them
/// the header gives no size and the image counts the flat 2,000 of an unsized one. A recorded
/// session's workload writes the recorded image's pixels.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    #[serde(default = "default_media_type")]
    pub media_type: String,
    pub base64_bytes: usize,
    #[serde(default)]
    pub width: Option<u32>,
    #[serde(default)]
    pub height: Option<u32>,
}

impl ToolOutput {
    /// The tool_result content: the text alone, or the text (when any) followed by the images.
    pub fn result_content(&self) -> crate::api::ToolResultContent {
        if self.images.is_empty() {
            return crate::api::ToolResultContent::Text(self.content.clone());
        }
        let text = (!self.content.is_empty()).then(|| ContentBlock::text(self.content.clone()));
        crate::api::ToolResultContent::Blocks(text.into_iter().chain(self.images.iter().map(ImageSpec::block)).collect())
    }
}

/// The first 33 bytes of a PNG of `width` × `height` pixels (8-bit RGBA): the signature and the
/// `IHDR` chunk with its CRC, all a reader needs for the image's size.
fn png_header(width: u32, height: u32) -> Vec<u8> {
    let mut chunk = b"IHDR".to_vec();
    chunk.extend_from_slice(&width.to_be_bytes());
    chunk.extend_from_slice(&height.to_be_bytes());
    chunk.extend_from_slice(&[8, 6, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    out.extend_from_slice(&13u32.to_be_bytes());
    out.extend_from_slice(&chunk);
    out.extend_from_slice(&crc32(&chunk).to_be_bytes());
    out
}

/// CRC-32 (ISO-HDLC, the polynomial PNG chunks use).
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

fn default_media_type() -> String {
    "image/png".to_owned()
}

impl ImageSpec {
    /// The image block: a PNG signature, its `IHDR` chunk when the pixels are known, then
    /// filler up to `base64_bytes` (a header longer than that is cut, and gives no size).
    pub fn block(&self) -> ContentBlock {
        use base64::Engine as _;
        let mut data = String::with_capacity(self.base64_bytes.max(44));
        match (self.width, self.height) {
            (Some(width), Some(height)) => {
                base64::engine::general_purpose::STANDARD.encode_string(png_header(width, height), &mut data);
            }
            _ => data.push_str("iVBORw0KGgo"),
        }
        data.truncate(self.base64_bytes);
        while data.len() < self.base64_bytes {
            data.push('A');
        }
        let source = serde_json::json!({"type": "base64", "media_type": self.media_type, "data": data});
        ContentBlock::Image(crate::api::ImageLike { source: source.into(), cache_control: None, extra: Default::default() })
    }
}

/// `expect:` — budgets that `ctxsim check` enforces. All optional.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Maximum number of cache breaks.
    #[serde(default)]
    pub cache_breaks: Option<u64>,
    /// Minimum cache_read / (input + cache_read + cache_creation), in `[0, 1]`.
    #[serde(default)]
    pub min_cache_hit_ratio: Option<f64>,
    /// Maximum total cost in USD.
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
    /// Exact number of firings per compaction stage.
    #[serde(default)]
    pub compactions: Option<CompactionCounts>,
    /// Maximum context tokens of any request.
    #[serde(default)]
    pub peak_context_tokens: Option<u64>,
    /// Maximum number of requests.
    #[serde(default)]
    pub max_requests: Option<u64>,
    /// The exact causes of the run's cache breaks, in order (`[]` = no break at all).
    #[serde(default)]
    pub break_causes: Option<Vec<String>>,
}

/// `expect.compactions:` — keys are the stage ids of the summary JSON.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionCounts {
    #[serde(default)]
    pub tool_result_budget: Option<u64>,
    #[serde(default)]
    pub snip: Option<u64>,
    #[serde(default)]
    pub microcompact: Option<u64>,
    #[serde(default)]
    pub collapse: Option<u64>,
    #[serde(default)]
    pub session_memory: Option<u64>,
    #[serde(default)]
    pub auto: Option<u64>,
    #[serde(default)]
    pub reactive: Option<u64>,
    #[serde(default)]
    pub manual: Option<u64>,
}

impl CompactionCounts {
    /// `(stage, expected count)` for the stages given, in the summary JSON's order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("tool_result_budget", self.tool_result_budget),
            ("snip", self.snip),
            ("microcompact", self.microcompact),
            ("collapse", self.collapse),
            ("session_memory", self.session_memory),
            ("auto", self.auto),
            ("reactive", self.reactive),
            ("manual", self.manual),
        ]
        .into_iter()
        .filter_map(|(name, count)| count.map(|c| (name, c)))
    }
}
