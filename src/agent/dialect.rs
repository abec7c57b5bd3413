//! Claude Code 2.1.332's request layout (`client_version = "2.1.332"`), built from the agent's
//! own request and the version profile `data/profiles/2.1.332.toml` (docs/profiles.md).
//!
//! What changes against 2.1.88: three system blocks (billing without `cch`, the identity line
//! and a short prompt, both marked); twelve tools in the profile's order with
//! `DeferredToolPlaceholder` deferred; `messages[0]` holds the project instructions, the git
//! snapshot and the attribution note as reminders before the prompt, and a `role:"system"`
//! message after it carries the environment, the deferred tool names, the agent types, the
//! skills and the date (the message marker while it is last, a string afterwards); Read results
//! carry no caution reminder; adaptive thinking with display omitted, effort, 128k output.
//!
//! Every text is ours, sized from the profile in characters and o200k tokens
//! ([`crate::agent::profile::pad_to_size`]); only names and wire formats are the client's.

use serde_json::{Value, json};

use crate::agent::profile::{js_len, pad_to_size};
use crate::agent::system_prompt::GitStatus;
use crate::agent::user_context::{REMINDER_CLOSE, REMINDER_OPEN};
use crate::api::{CacheControl, ContentBlock, Message, MessageContent, Role, SystemBlock, Tool, ToolResultContent};
use crate::client_profile::VersionProfile;

/// The version this layout is.
pub const VERSION: &str = "2.1.332";

/// The versions the agent can speak; the first is the default.
pub const VERSIONS: &[&str] = &["2.1.88", VERSION];

/// The tools 2.1.332 defers and names in its system message (base-URL mode, no MCP), from the
/// capture; MCP tools are added after them.
const DEFERRED: &[&str] = &["CronCreate", "CronDelete", "CronList", "EnterWorktree", "ExitWorktree", "Monitor", "NotebookEdit", "SendMessage", "TaskStop", "WebFetch", "WebSearch"];

/// The shipped 2.1.332 profile, parsed once.
pub fn profile() -> &'static VersionProfile {
    static PARSED: std::sync::OnceLock<VersionProfile> = std::sync::OnceLock::new();
    PARSED.get_or_init(|| crate::client_profile::shipped(VERSION).expect("2.1.332 is shipped").0)
}

/// What the layout needs from the session beyond the request it built.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// The `claudeMd` text (files with their paths), unpadded.
    pub claude_md: Option<String>,
    pub git: Option<GitStatus>,
    pub cwd: String,
    pub is_git_repo: bool,
    pub model_id: String,
    pub marketing_name: Option<String>,
    pub date: String,
    /// MCP tool names (deferred in 2.1.332).
    pub mcp_tools: Vec<String>,
    /// MCP server instructions (name, text).
    pub mcp_instructions: Vec<(String, String)>,
    pub agent_types: Vec<String>,
    pub skills: Vec<String>,
    /// The request is a subagent's: its system message has the subagent's size.
    pub subagent: bool,
}

fn block(path: &str) -> Option<&'static crate::client_profile::BlockEntry> {
    profile().system.iter().chain(&profile().messages).find(|b| b.path == path)
}

/// A reminder of our own words padded so the whole block has the profile's size at `path`.
fn reminder(body: &str, path: &str, seed: &str) -> String {
    let wrap = js_len(REMINDER_OPEN) + js_len(REMINDER_CLOSE) + 2;
    let (chars, tokens) = block(path).map_or((0, 0), |b| (b.size.chars.saturating_sub(wrap), b.size.o200k.saturating_sub(4)));
    format!("{REMINDER_OPEN}\n{}\n{REMINDER_CLOSE}", pad_to_size(body, chars, tokens, seed))
}

const PROMPT: &str = "You are a coding assistant working in the user's repository through the tools in this request. \
Work on what the user asks, read before you change, and keep changes as small as the request allows. \
Text inside <system-reminder> tags comes from the harness, not from the user.\n\n\
# Working style\n\
- Look at the relevant files first; follow the conventions you find there.\n\
- After a change, run the narrowest check that covers it and report what it showed.\n\
- Say plainly when something failed or is uncertain, with the exact error text.\n\
- Ask before actions that are hard to undo or that reach beyond the repository.\n\n\
# Tools\n\
Use the dedicated tools for files (Read, Edit, Write) and Bash for commands. Tools listed as deferred \
must be loaded with ToolSearch before they are called. Independent calls can go in one message.\n\n\
# Answers\n\
Keep answers short and concrete; refer to code as path:line.";

/// The three system blocks: the billing block (version and entry point, no `cch`), the identity
/// line and the prompt, the last two marked.
/// The fingerprint is taken over the first text of the relaid `messages[0]` (so it survives a
/// resume, as in the client).
pub fn system_blocks(agent_blocks: &[SystemBlock], marker: Option<CacheControl>, messages: &[Message]) -> Vec<SystemBlock> {
    // The first text of `messages[0]` that is not a reminder: the prompt, after a compaction
    // the summary (the capture's fingerprint changes there and survives a resume).
    let texts: Vec<String> = messages.first().map(|m| m.content.to_blocks().into_iter().filter_map(|b| match b {
        ContentBlock::Text { text, .. } => Some(text.into_string()),
        _ => None,
    }).collect()).unwrap_or_default();
    let first_text = texts.iter().find(|t| !t.starts_with(REMINDER_OPEN)).or(texts.first()).cloned();
    let entrypoint = agent_blocks.first().and_then(|b| b.text.split("cc_entrypoint=").nth(1)).and_then(|rest| rest.split(';').next()).unwrap_or("sdk-cli");
    let fingerprint = crate::agent::system_prompt::fingerprint(first_text.as_deref().unwrap_or(""), VERSION);
    let billing = format!("x-anthropic-billing-header: cc_version={VERSION}.{fingerprint}; cc_entrypoint={entrypoint};");
    let identity = agent_blocks.get(1).map(|b| b.text.clone()).unwrap_or_default();
    let prompt = block("system[2]").map_or_else(|| PROMPT.to_owned(), |b| pad_to_size(PROMPT, b.size.chars, b.size.o200k, "prompt_2_1_332"));
    vec![SystemBlock::text(billing), SystemBlock::text(identity).with_cache_control(marker.clone()), SystemBlock::text(prompt).with_cache_control(marker)]
}

/// Our own description and schema of a tool the 2.1.88 agent does not have.
fn new_tool(name: &str) -> (String, Value) {
    let object = |props: Value, required: &[&str]| json!({"type": "object", "properties": props, "required": required, "additionalProperties": false});
    match name {
        "ListAgents" => ("Lists the agents running in the background with their status.".to_owned(), object(json!({"status": {"type": "string", "enum": ["running", "done", "all"]}}), &[])),
        "ReportFindings" => ("Reports findings of a review as a structured list.".to_owned(), object(json!({"findings": {"type": "array", "items": {"type": "object", "properties": {"file": {"type": "string"}, "line": {"type": "integer"}, "note": {"type": "string"}}}}}), &["findings"])),
        "ScheduleWakeup" => ("Schedules the session to resume work after a delay.".to_owned(), object(json!({"delay_seconds": {"type": "integer"}, "reason": {"type": "string"}}), &["delay_seconds"])),
        "Workflow" => ("Runs a named multi-step workflow defined for the project.".to_owned(), object(json!({"name": {"type": "string"}, "arguments": {"type": "object"}}), &["name"])),
        "DeferredToolPlaceholder" => ("Stands for the deferred tools; never call it.".to_owned(), json!({"type": "object", "properties": {}})),
        _ => (format!("The {name} tool."), object(json!({}), &[])),
    }
}

/// A tool's unpadded definition: the agent's own words for the tools it has (the Agent tool
/// with its listing), else [`new_tool`].
fn base_tool(name: &str, listing: Option<&crate::agent::tools::AgentToolListing>) -> (String, Value) {
    let sizes = crate::agent::profile::SizeProfile::claude_code_2_1_88();
    let built = if name == "Agent" {
        Some(crate::agent::tools::agent_tool(&sizes, false, &listing.cloned().unwrap_or_default()))
    } else {
        crate::agent::tools::builtin_tool(name, &sizes, false)
    };
    match built {
        Some(tool) => (tool.description, Value::clone(&tool.input_schema)),
        None => new_tool(name),
    }
}

/// A tool padded so that its JSON has `chars` characters and about `tokens` o200k tokens.
fn sized_tool(name: &str, description: &str, schema: Value, defer: bool, chars: usize, tokens: u64) -> Tool {
    let mut tool = Tool { kind: None, name: name.to_owned(), description: Some(String::new()), input_schema: Some(schema.into()), cache_control: None, defer_loading: defer.then_some(true), extra: Default::default() };
    // The description's share of the tool's size: what the rest of the JSON leaves.
    let frame = serde_json::to_string(&tool).expect("tools serialize");
    let escaped = js_len(&serde_json::to_string(description).expect("strings serialize")) - 2;
    let room = chars.saturating_sub(js_len(&frame) + escaped.saturating_sub(js_len(description)));
    let room_tokens = tokens.saturating_sub(u64::from(crate::measure::tokens::bpe(&frame)));
    tool.description = Some(pad_to_size(description, room, room_tokens, name));
    tool
}

/// The names ToolSearch has loaded in the conversation so far (its `tool_reference` results).
fn loaded_tools(messages: &[Message]) -> Vec<String> {
    // Tool results may already be in their wire key order (plain JSON): read them as JSON.
    let mut names = Vec::new();
    for message in messages {
        let MessageContent::Blocks(blocks) = &message.content else { continue };
        for block in blocks {
            let value = serde_json::to_value(block).expect("blocks serialize");
            if value.get("type").and_then(Value::as_str) != Some("tool_result") {
                continue;
            }
            for item in value.get("content").and_then(Value::as_array).into_iter().flatten() {
                if item.get("type").and_then(Value::as_str) == Some("tool_reference")
                    && let Some(name) = item.get("tool_name").and_then(Value::as_str)
                    && !names.iter().any(|n| n == name)
                {
                    names.push(name.to_owned());
                }
            }
        }
    }
    names
}

/// The tools: the profile's, in its order (alphabetical, the placeholder before the last one),
/// each padded to its measured size; tools loaded by ToolSearch join the alphabetical order
/// with `defer_loading` (the API leaves them out of the prefix), at their 2.1.88 size.
pub fn tools(messages: &[Message], listing: Option<&crate::agent::tools::AgentToolListing>) -> Vec<Tool> {
    let entries = &profile().tools;
    let mut out: Vec<Tool> = entries
        .iter()
        .filter(|e| e.name != "DeferredToolPlaceholder")
        .map(|e| {
            let (description, schema) = base_tool(&e.name, listing);
            sized_tool(&e.name, &description, schema, e.defer_loading, e.size.chars, e.size.o200k)
        })
        .collect();
    let sizes = crate::agent::profile::SizeProfile::claude_code_2_1_88();
    for name in loaded_tools(messages) {
        if out.iter().any(|t| t.name == name) {
            continue;
        }
        let (description, schema) = base_tool(&name, listing);
        let chars = sizes.tool(&name).map_or(0, |s| s.description + s.schema);
        out.push(sized_tool(&name, &description, schema, true, chars, 0));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(placeholder) = entries.iter().find(|e| e.name == "DeferredToolPlaceholder") {
        let (description, schema) = new_tool(&placeholder.name);
        let at = out.len().saturating_sub(1);
        out.insert(at, sized_tool(&placeholder.name, &description, schema, true, placeholder.size.chars, placeholder.size.o200k));
    }
    out
}

/// `messages[0]`'s reminders: project instructions, the git snapshot, the attribution note.
pub fn first_reminders(inputs: &Inputs) -> Vec<ContentBlock> {
    let mut out = Vec::new();
    if let Some(claude_md) = &inputs.claude_md {
        out.push(ContentBlock::text(reminder(&format!("Project instructions for this session:\n\n{claude_md}"), "messages[0].content[0]", "claude_md_2_1_332")));
    }
    if let Some(git) = &inputs.git {
        let status = if git.status.is_empty() { "(clean)" } else { git.status.as_str() };
        let body = format!(
            "Repository state when the session started (a snapshot; it does not update):\nCurrent branch: {}\nMain branch: {}\nStatus:\n{status}\n\nRecent commits:\n{}",
            git.branch, git.main_branch, git.recent_commits
        );
        out.push(ContentBlock::text(reminder(&body, "messages[0].content[1]", "git_2_1_332")));
    }
    let attribution = "When you write a commit message or a pull request description, end it with a line saying it was written with the assistant.";
    out.push(ContentBlock::text(reminder(attribution, "messages[0].content[2]", "attribution_2_1_332")));
    out
}

/// The `role:"system"` message after the first prompt.
pub fn system_message(inputs: &Inputs) -> Message {
    let (chars, tokens) = if inputs.subagent {
        (subagent_sizes().system_message, density("messages[1].content[0]", subagent_sizes().system_message))
    } else {
        block("messages[1].content[0]").map_or((0, 0), |b| (b.size.chars, b.size.o200k))
    };
    system_message_sized(inputs, true, chars, tokens)
}

/// The capture's request after a compaction that kept a round (probe `compact-970k`): its
/// messages are the summary's, a date system message, the kept assistant turn, its user
/// message, the trailing system message. The trailing message's size in characters, and o200k
/// tokens at the density of the first system message.
fn kept_round_system_size() -> (usize, u64) {
    static SIZE: std::sync::OnceLock<(usize, u64)> = std::sync::OnceLock::new();
    *SIZE.get_or_init(|| {
        let shapes = crate::client_profile::shipped(VERSION).map(|(_, s)| s).unwrap_or_default();
        let roles = ["user", "system", "assistant", "user", "system"];
        let chars = shapes
            .values()
            .flatten()
            .find(|s| s.lane == "main" && s.messages.len() == roles.len() && s.messages.iter().zip(roles).all(|(m, r)| m.role == r))
            .and_then(|s| s.messages.last().and_then(|m| m.blocks.first()).map(|b| b.chars))
            .unwrap_or(0);
        let (first_chars, first_tokens) = block("messages[1].content[0]").map_or((1, 0), |b| (b.size.chars.max(1), b.size.o200k));
        (chars, (first_tokens as f64 * chars as f64 / first_chars as f64).round() as u64)
    })
}

/// The date system message after a summary that kept a round.
fn date_message(inputs: &Inputs) -> Message {
    Message { role: Role::System, content: MessageContent::Text(date_line(inputs).into()), extra: Default::default() }
}

fn date_line(inputs: &Inputs) -> String {
    format!("Today's date is {}.", inputs.date)
}

/// The system message with or without the date, padded to `chars` and about `tokens`.
fn system_message_sized(inputs: &Inputs, with_date: bool, chars: usize, tokens: u64) -> Message {
    let model = match &inputs.marketing_name {
        Some(name) => format!("Model: {name} ({})", inputs.model_id),
        None => format!("Model: {}", inputs.model_id),
    };
    let environment = format!(
        "# Environment\nWorking directory: {}\nGit repository: {}\nPlatform: linux\nShell: bash\n{model}",
        inputs.cwd,
        if inputs.is_git_repo { "yes" } else { "no" }
    );
    let mut deferred: Vec<String> = DEFERRED.iter().map(|s| (*s).to_owned()).collect();
    deferred.extend(inputs.mcp_tools.iter().cloned());
    let mut rest = format!("\n\n# Deferred tools\nLoad one with ToolSearch (query select:<name>) before calling it:\n{}", deferred.join("\n"));
    for (name, text) in &inputs.mcp_instructions {
        rest.push_str(&format!("\n\n# Instructions of the {name} server\n{text}"));
    }
    if !inputs.subagent {
        rest.push_str(&format!("\n\n# Agent types\n{}", inputs.agent_types.join("\n")));
    }
    rest.push_str(&format!("\n\n# Skills\nRun one with the Skill tool:\n{}", inputs.skills.join("\n")));
    if with_date {
        rest.push_str(&format!("\n\n{}", date_line(inputs)));
    }
    // The read probe's message sets the size of the fixed part; what the session adds (MCP
    // tools and instructions) comes on top, as in the client.
    let base_rest = js_len(&rest) - inputs.mcp_tools.iter().map(|t| js_len(t) + 1).sum::<usize>()
        - inputs.mcp_instructions.iter().map(|(n, t)| js_len(&format!("\n\n# Instructions of the {n} server\n{t}"))).sum::<usize>();
    let rest_tokens = u64::from(crate::measure::tokens::bpe(&rest));
    let head = pad_to_size(&environment, chars.saturating_sub(base_rest), tokens.saturating_sub(rest_tokens), "environment_2_1_332");
    Message { role: Role::System, content: MessageContent::Text(format!("{head}{rest}").into()), extra: Default::default() }
}

/// The request parameters of the profile's main lane: `max_tokens`, `thinking`,
/// `output_config`, `context_management` (as the capture shows them).
pub fn params() -> (Option<u64>, Option<Value>, Option<Value>, Option<Value>) {
    let field = |name: &str| profile().main.fields.get(name).and_then(|v| serde_json::from_str::<Value>(v).ok());
    (field("max_tokens").and_then(|v| v.as_u64()), field("thinking"), field("output_config"), field("context_management"))
}

/// MCP tool results as the client sends them (both versions): a list of text blocks, never a
/// string.
pub fn mcp_results_as_blocks(messages: &mut [Message]) {
    mcp_results_as_blocks_after(messages, &mut std::collections::BTreeSet::new());
}

/// [`mcp_results_as_blocks`] of messages that follow others: `mcp_ids` holds the MCP tool_use
/// ids of the messages before, and gains those of `messages`.
pub fn mcp_results_as_blocks_after(messages: &mut [Message], mcp_ids: &mut std::collections::BTreeSet<String>) {
    let gained = mcp_results_rewritten(messages, Some(mcp_ids));
    mcp_ids.extend(gained);
}

/// [`mcp_results_as_blocks_after`] of messages that follow others whose MCP tool_use ids are
/// `mcp_ids`, which stay as they are (a request's tail: the ids are not copied per request).
pub fn mcp_results_as_blocks_beside(messages: &mut [Message], mcp_ids: &std::collections::BTreeSet<String>) {
    mcp_results_rewritten(messages, Some(mcp_ids));
}

/// [`mcp_results_as_blocks`] through `memo`: the messages before the first one whose blocks
/// differ from the last call's are the last call's result (a result is rewritten by what the
/// messages up to it show), a pointer comparison each; from there on each message is read
/// again, and the same results of the same blocks at a position are rewritten once. Debug
/// builds check the result against rewriting every message anew.
pub fn mcp_results_as_blocks_memo(messages: &mut [Message], memo: &mut McpMemo) {
    #[cfg(debug_assertions)]
    let scratch = {
        let mut scratch = messages.to_vec();
        mcp_results_as_blocks(&mut scratch);
        scratch
    };
    memo.rewrite(messages);
    #[cfg(debug_assertions)]
    assert!(*messages == scratch[..], "MCP results rewritten through the memo differ from rewriting every message");
}

/// What [`mcp_results_as_blocks_memo`] read and made of each message position last time.
#[derive(Debug, Clone, Default)]
pub struct McpMemo {
    positions: Vec<McpPosition>,
    /// The positions whose results were rewritten, in order.
    rewritten_at: Vec<usize>,
    /// The MCP tool_use ids of the positions read, each with the first position naming it.
    seen: rustc_hash::FxHashMap<String, usize>,
}

#[derive(Debug, Clone, Default)]
struct McpPosition {
    /// The blocks given (held, so that the same allocation means the same blocks); `None` for a
    /// text message.
    input: Option<crate::api::SharedBlocks>,
    /// The ids of its MCP tool uses.
    ids: Vec<String>,
    /// The results rewritten (block indices) and the blocks that gave, when some were.
    rewritten: Option<(Vec<usize>, crate::api::SharedBlocks)>,
}

impl McpPosition {
    fn is(&self, message: &Message) -> bool {
        match (&self.input, &message.content) {
            (Some(input), MessageContent::Blocks(blocks)) => input.same(blocks),
            (None, MessageContent::Text(_)) => true,
            _ => false,
        }
    }
}

impl McpMemo {
    fn rewrite(&mut self, messages: &mut [Message]) {
        let same = self.positions.iter().zip(messages.iter()).take_while(|(position, message)| position.is(message)).count();
        // Forget the ids the positions from the first changed one on named first.
        for (m, position) in self.positions.iter().enumerate().skip(same) {
            for id in &position.ids {
                if self.seen.get(id) == Some(&m) {
                    self.seen.remove(id);
                }
            }
        }
        self.positions.truncate(messages.len());
        // The unchanged messages: only those rewritten are touched.
        let kept = self.rewritten_at.partition_point(|&m| m < same);
        for &m in &self.rewritten_at[..kept] {
            if let (Some((_, output)), MessageContent::Blocks(blocks)) = (&self.positions[m].rewritten, &mut messages[m].content) {
                *blocks = output.clone();
            }
        }
        self.rewritten_at.truncate(kept);
        for (m, message) in messages.iter_mut().enumerate().skip(same) {
            let MessageContent::Blocks(blocks) = &mut message.content else {
                if m >= self.positions.len() {
                    self.positions.push(McpPosition::default());
                } else {
                    self.positions[m] = McpPosition::default();
                }
                continue;
            };
            let mut ids = Vec::new();
            let mut rewrite = Vec::new();
            for (b, block) in blocks.iter().enumerate() {
                match block {
                    ContentBlock::ToolUse { id, name, .. } if name.starts_with("mcp__") => {
                        self.seen.entry(id.clone()).or_insert(m);
                        ids.push(id.clone());
                    }
                    ContentBlock::ToolResult { tool_use_id, content: Some(ToolResultContent::Text(_)), .. } if self.seen.contains_key(tool_use_id.as_str()) => {
                        rewrite.push(b)
                    }
                    _ => {}
                }
            }
            // The same blocks asked the same rewrite at this position: what it made then.
            let kept = self.positions.get_mut(m).and_then(|p| p.rewritten.take().filter(|(tag, _)| *tag == rewrite && p.input.as_ref().is_some_and(|i| i.same(blocks))));
            let input = blocks.clone();
            let rewritten = match kept {
                Some(kept) => {
                    *blocks = kept.1.clone();
                    Some(kept)
                }
                None if rewrite.is_empty() => None,
                None => {
                    for &b in &rewrite {
                        if let ContentBlock::ToolResult { content: Some(content), .. } = &mut blocks[b]
                            && let ToolResultContent::Text(text) = content
                        {
                            *content = ToolResultContent::Blocks(vec![ContentBlock::text(std::mem::take(text))]);
                        }
                    }
                    Some((rewrite, blocks.clone()))
                }
            };
            if rewritten.is_some() {
                self.rewritten_at.push(m);
            }
            let position = McpPosition { input: Some(input), ids, rewritten };
            if m >= self.positions.len() {
                self.positions.push(position);
            } else {
                self.positions[m] = position;
            }
        }
    }
}

/// `mcp_ids`: the MCP tool_use ids of the messages before (none when `messages` are all), which
/// gains those of `messages`.
/// The MCP results of `messages` as blocks, with `mcp_ids` the MCP tool_use ids of the messages
/// before them; returns the ids of these messages' MCP calls that `mcp_ids` does not hold.
fn mcp_results_rewritten(messages: &mut [Message], mcp_ids: Option<&std::collections::BTreeSet<String>>) -> Vec<String> {
    // Read first, change only the results that need it: the blocks are shared with earlier
    // bodies, and a change copies them (and costs the measurer a comparison by content). The
    // ids of these messages' MCP calls are borrowed while reading (a hash set: only asked
    // whether it holds one), then returned for the messages that follow.
    // (Message, block) of each result to rewrite, in body order: one list, no list per message.
    let mut plan: Vec<(usize, usize)> = Vec::new();
    let mut seen: rustc_hash::FxHashSet<&str> = rustc_hash::FxHashSet::default();
    for (m, message) in messages.iter().enumerate() {
        let MessageContent::Blocks(blocks) = &message.content else { continue };
        for (b, block) in blocks.iter().enumerate() {
            match block {
                ContentBlock::ToolUse { id, name, .. } if name.starts_with("mcp__") => {
                    seen.insert(id.as_str());
                }
                ContentBlock::ToolResult { tool_use_id, content: Some(ToolResultContent::Text(_)), .. }
                    if seen.contains(tool_use_id.as_str()) || mcp_ids.is_some_and(|ids| ids.contains(tool_use_id.as_str())) =>
                {
                    plan.push((m, b))
                }
                _ => {}
            }
        }
    }
    let gained: Vec<String> = seen.into_iter().filter(|id| mcp_ids.is_none_or(|ids| !ids.contains(*id))).map(str::to_owned).collect();
    let mut rewrite: Vec<usize> = Vec::new();
    for run in plan.chunk_by(|x, y| x.0 == y.0) {
        let m = run[0].0;
        rewrite.clear();
        rewrite.extend(run.iter().map(|&(_, b)| b));
        let MessageContent::Blocks(blocks) = &mut messages[m].content else { continue };
        for &b in &rewrite {
            if let ContentBlock::ToolResult { content: Some(content), .. } = &mut blocks[b]
                && let ToolResultContent::Text(text) = content
            {
                *content = ToolResultContent::Blocks(vec![ContentBlock::text(std::mem::take(text))]);
            }
        }
    }
    gained
}

/// Tool results as 2.1.332 sends them: Read results without the caution reminder the 2.1.88
/// layout appends (gone since 2.1.126; files restored after a compaction lose it too), Edit
/// results with the note that the file in context is current (our words); and no skill listing
/// beside a prompt (it lives in the system message).
pub fn rewrite_results(messages: &mut [Message]) {
    let caution = format!("\n{}\n", crate::agent::attachments::system_reminder(crate::agent::tools::exec::READ_CAUTION));
    let restored_caution = format!("\n{}\n{REMINDER_CLOSE}", crate::agent::tools::exec::READ_CAUTION);
    for message in messages.iter_mut() {
        let MessageContent::Blocks(blocks) = &mut message.content else { continue };
        if message.role == Role::User {
            blocks.retain(|b| !matches!(b, ContentBlock::Text { text, .. } if text.contains(crate::agent::attachments::SKILL_LISTING_HEADER)));
        }
        for block in blocks.iter_mut() {
            if let ContentBlock::Text { text, .. } = block
                && text.starts_with(&format!("{REMINDER_OPEN}\n{}", crate::agent::compact::rebuild::RESTORED_RESULT_HEAD))
                && let Some(kept) = text.strip_suffix(&restored_caution)
            {
                *text = format!("{kept}\n{REMINDER_CLOSE}").into();
            }
            if let ContentBlock::ToolResult { content: Some(ToolResultContent::Text(text)), is_error, .. } = block {
                if let Some(kept) = text.strip_suffix(&caution) {
                    *text = kept.to_owned().into();
                } else if is_error.is_none_or(|e| !e) && text.starts_with("The file ") && text.ends_with(" has been updated.") {
                    text.push_str(" Your context already holds the file as it is now; there is no need to read it again.");
                }
            }
        }
    }
}

/// The summary message's note on the messages kept after it, 2.1.332's longer form, a reminder
/// in the capture (our words, about the capture's length).
pub const PRESERVED_NOTE: &str = "<system-reminder>\nThe messages after this summary are the latest part of the conversation, \
kept word for word. They were not shown to the model that wrote the summary, so what they hold (the last tool calls, their \
results, the files they read) is recorded only there. Where they and the summary disagree, they are right.\n</system-reminder>";

/// `messages[0]` rebuilt: the agent's leading reminders (skill listing, user context) give way
/// to [`first_reminders`]; the prompt and anything after it stay. The system message follows.
///
/// After a compaction that kept the newest round (the summary in `messages[0]`, an assistant
/// turn next) the capture's layout is: `messages[0]` with the project instructions, the git
/// snapshot and the summary; a system message with the date; the kept assistant turn; its user
/// message with the results, the restored files and then the attribution note; the system
/// message without the date.
pub fn relayout(messages: &mut Vec<Message>, inputs: &Inputs) {
    let Some(first) = messages.first_mut() else { return };
    let blocks = std::mem::replace(&mut first.content, MessageContent::Text(Default::default())).into_blocks();
    let mut kept: Vec<ContentBlock> = blocks.into_iter().skip_while(|b| matches!(b, ContentBlock::Text { text, .. } if text.starts_with(REMINDER_OPEN))).collect();
    let mut content = first_reminders(inputs);
    let summary_first = matches!(kept.first(), Some(ContentBlock::Text { text, .. }) if text.starts_with(crate::agent::compact::rebuild::SUMMARY_OPENING));
    let answer = messages.get(1).filter(|m| m.role == Role::Assistant).and_then(|_| messages.iter().skip(2).position(|m| m.role == Role::User)).map(|i| i + 2);
    let Some(answer) = answer.filter(|_| summary_first) else {
        content.extend(kept);
        messages[0].content = MessageContent::Blocks(content.into());
        messages.insert(1, system_message(inputs));
        return;
    };
    if let Some(ContentBlock::Text { text, .. }) = kept.first_mut() {
        *text = text.replace(crate::agent::compact::rebuild::PRESERVED_NOTE, PRESERVED_NOTE).into();
    }
    let attribution = content.pop();
    content.extend(kept);
    messages[0].content = MessageContent::Blocks(content.into());
    let mut answer_blocks = std::mem::replace(&mut messages[answer].content, MessageContent::Text(Default::default())).into_blocks();
    answer_blocks.extend(attribution);
    messages[answer].content = MessageContent::Blocks(answer_blocks.into());
    let (chars, tokens) = kept_round_system_size();
    messages.insert(answer + 1, system_message_sized(inputs, false, chars, tokens));
    messages.insert(1, date_message(inputs));
}

// ---- Background subagents (2.1.332) -------------------------------------------------------
//
// The Agent tool returns at once with a short "launched" result; the main thread goes on; the
// subagent's result comes back later as a user message holding a `<task-notification>` inside a
// system reminder. The subagent's own requests have three system blocks (the billing block
// with `cc_is_subagent=true;`, the identity line, the agent's prompt, the last two marked), the
// main thread's tools without the four the main thread alone has, the main lane's parameters,
// and the `messages[0]` + system-message layout of the main thread (no agent types). The sizes
// come from the shipped snapshot of the `subagent` probe (characters; tokens at the density of
// the main thread's matching block).

/// Tools of the main thread that a 2.1.332 subagent does not get (capture: 12 tools on the main
/// thread, 8 in the subagent's request).
pub const MAIN_ONLY_TOOLS: &[&str] = &["ListAgents", "ReportFindings", "ScheduleWakeup", "Workflow"];

/// Whether the agent speaking `version` runs Agent calls of the main thread in the background.
pub fn background_agents(version: &str) -> bool {
    version == VERSION
}

/// The sizes of the subagent probe's blocks that the layout pads to (characters).
#[derive(Debug, Clone, Copy, Default)]
pub struct SubagentSizes {
    /// The subagent's `system[2]` (a built-in agent's prompt block).
    pub prompt: usize,
    /// The subagent's system message.
    pub system_message: usize,
    /// The Agent tool's "launched" result on the main thread.
    pub launched: usize,
    /// The task notification's frame: the whole block less the result it carries.
    pub notification_frame: usize,
}

/// [`SubagentSizes`] read once from the shipped snapshot of the `subagent` probe.
pub fn subagent_sizes() -> SubagentSizes {
    static SIZES: std::sync::OnceLock<SubagentSizes> = std::sync::OnceLock::new();
    *SIZES.get_or_init(|| {
        let shapes = crate::client_profile::shipped(VERSION).map(|(_, s)| s).unwrap_or_default();
        let probe = shapes.get("subagent").cloned().unwrap_or_default();
        let mut sizes = SubagentSizes::default();
        if let Some(sub) = probe.iter().find(|r| r.lane.starts_with("subagent")) {
            sizes.prompt = sub.system.get(2).map_or(0, |b| b.chars);
            sizes.system_message = sub.messages.get(1).and_then(|m| m.blocks.first()).map_or(0, |b| b.chars);
        }
        let main: Vec<_> = probe.iter().filter(|r| r.lane == "main").collect();
        // The launched result: the tool_result answering the Agent call.
        sizes.launched = main
            .iter()
            .flat_map(|r| r.messages.windows(2))
            .find(|w| w[0].blocks.iter().any(|b| b.name.as_deref() == Some("Agent")))
            .and_then(|w| w[1].blocks.iter().find(|b| b.kind == "tool_result"))
            .map_or(0, |b| b.chars);
        // The notification: the last main request's last block, less the subagent's reply that
        // the probe scripted (its result).
        let result = crate::client_profile::probes::probes()
            .into_iter()
            .find(|p| p.name == "subagent")
            .and_then(|p| p.script["main"].get(1).and_then(|r| r["content"].as_str()).map(js_len))
            .unwrap_or(0);
        let notification = main.last().and_then(|r| r.messages.last()).and_then(|m| m.blocks.last()).map_or(0, |b| b.chars);
        sizes.notification_frame = notification.saturating_sub(result);
        sizes
    })
}

/// The o200k tokens `chars` characters have at the density of the profile's block at `path`.
fn density(path: &str, chars: usize) -> u64 {
    block(path).map_or(0, |b| (chars as u64 * b.size.o200k) / b.size.chars.max(1) as u64)
}

/// What a 2.1.332 subagent's prompt block adds to the agent's own prompt (our words).
const SUBAGENT_NOTE: &str = "You run in the background for the main conversation, which sees only your final message. \
Finish the task you were given without asking questions, then end with a short report: what you found or changed, \
with file paths, and anything left undone.";

/// A 2.1.332 subagent's three system blocks: the billing block marked as a subagent's, the
/// identity line and the agent's prompt with our note, the last two marked. A built-in agent's
/// prompt is padded to the capture's size; a user's own agent prompt is sent as written.
pub fn subagent_system_blocks(agent_blocks: &[SystemBlock], marker: Option<CacheControl>, messages: &[Message], agent_prompt: &str, built_in: bool) -> Vec<SystemBlock> {
    let mut blocks = system_blocks(agent_blocks, marker.clone(), messages);
    blocks[0].text.push_str(" cc_is_subagent=true;");
    let prompt = format!("{}\n\n{SUBAGENT_NOTE}", agent_prompt.trim());
    let sizes = subagent_sizes();
    let prompt = if built_in && sizes.prompt > 0 { pad_to_size(&prompt, sizes.prompt, density("system[2]", sizes.prompt), "subagent_prompt_2_1_332") } else { prompt };
    blocks[2] = SystemBlock::text(prompt).with_cache_control(marker);
    blocks
}

/// The request parameters of the profile's subagent lane (as [`params`] for the main lane).
pub fn subagent_params() -> (Option<u64>, Option<Value>, Option<Value>, Option<Value>) {
    let Some(lane) = &profile().subagent else { return params() };
    let field = |name: &str| lane.fields.get(name).and_then(|v| serde_json::from_str::<Value>(v).ok());
    (field("max_tokens").and_then(|v| v.as_u64()), field("thinking"), field("output_config"), field("context_management"))
}

/// The Agent tool's immediate result for a background agent (our words), padded to the
/// capture's size.
pub fn launched_result(agent_id: &str, description: &str) -> String {
    let text = format!(
        "Started agent \"{description}\" in the background (agentId: {agent_id}). It works on its own; its result arrives in a task notification once it finishes. \
Go on with other work meanwhile, do not start it again, and do not guess its findings."
    );
    pad_to_size(&text, subagent_sizes().launched.max(js_len(&text)), 0, "launched_2_1_332")
}

/// The user message block that brings a background agent's result back to the main thread: a
/// `<task-notification>` (id, status, summary, result, usage) inside a system reminder, the
/// frame padded to the capture's size (our words).
pub fn task_notification(agent_id: &str, description: &str, result: &str, total_tokens: u64, tool_uses: usize, duration_ms: u64) -> String {
    let head = format!(
        "{REMINDER_OPEN}\n<task-notification>\n<task-id>{agent_id}</task-id>\n<status>completed</status>\n<summary>Agent \"{description}\" finished</summary>\n<result>"
    );
    let tail_notification = format!("</result>\n<usage>total_tokens: {total_tokens}\ntool_uses: {tool_uses}\nduration_ms: {duration_ms}</usage>\n</task-notification>\n");
    let note = "The user does not see this notification. Use the result above to continue; tell the user what the agent found if it matters to their request.";
    let close = format!("\n{REMINDER_CLOSE}");
    let frame = js_len(&head) + js_len(&tail_notification) + js_len(&close);
    let note = pad_to_size(note, subagent_sizes().notification_frame.saturating_sub(frame).max(js_len(note)), 0, "notification_2_1_332");
    format!("{head}{result}{tail_notification}{note}{close}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SharedBlocks;
    use proptest::prelude::*;

    proptest! {
        /// MCP results rewritten through the memo kept across calls are the results rewritten
        /// anew, as the history grows (MCP and other calls, a result before its call, an id
        /// named twice), has its last message made again, an older one rewritten or removed,
        /// or is cut back.
        #[test]
        fn the_kept_rewrite_is_the_rewrite_from_scratch(ops in proptest::collection::vec((0u8..8, 0usize..40), 1..60)) {
            let mut memo = McpMemo::default();
            let mut history: Vec<Message> = Vec::new();
            let mut next = 0usize;
            for (op, k) in ops {
                match op {
                    0..=2 => {
                        next += 1;
                        let id = format!("toolu_{}", if k % 7 == 0 { k % (next + 1) } else { next });
                        let name = if op == 2 { "Read" } else { "mcp__srv__tool" };
                        let result = ContentBlock::tool_result(id.clone(), ToolResultContent::Text(format!("out {k}").into()), None);
                        if k % 5 == 0 {
                            // The result before its call.
                            history.push(Message::user_blocks(vec![result]));
                            history.push(Message::assistant_blocks(vec![ContentBlock::tool_use(id, name, json!({}))]));
                        } else {
                            history.push(Message::assistant_blocks(vec![ContentBlock::tool_use(id, name, json!({}))]));
                            history.push(Message::user_blocks(vec![result]));
                        }
                    }
                    3 => history.push(Message::user_text(format!("prompt {k}"))),
                    4 => {
                        let at = k % history.len().max(1);
                        if let Some(MessageContent::Blocks(blocks)) = history.get_mut(at).map(|m| &mut m.content) {
                            *blocks = SharedBlocks::from(blocks.to_vec());
                        }
                    }
                    5 => {
                        let at = k % history.len().max(1);
                        if at < history.len() {
                            history.remove(at);
                        }
                    }
                    6 => history.truncate(k % (history.len() + 1)),
                    _ => history.clear(),
                }
                if let Some(MessageContent::Blocks(blocks)) = history.last_mut().map(|m| &mut m.content) {
                    *blocks = SharedBlocks::from(blocks.to_vec());
                }
                let mut kept = history.clone();
                mcp_results_as_blocks_memo(&mut kept, &mut memo);
                let mut scratch = history.clone();
                mcp_results_as_blocks(&mut scratch);
                prop_assert_eq!(kept, scratch);
            }
        }
    }
}
