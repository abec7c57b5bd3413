//! The minimal agent of scenario format v1: a fixed system prompt, a handful of tools, the
//! conversation as it grows, and one message-level breakpoint on the last block, placed as the
//! reference client places it (a string last message is sent as one marked text block; earlier
//! messages go back to their string form).

use serde_json::json;

use crate::api::{CacheControl, ContentBlock, Message, MessageContent, Request, Role, SystemBlock, SystemPrompt, Tool, ToolResultContent};
use crate::world::{Reply, World};

const SYSTEM_PROMPT: &str = "You are a coding assistant working in a software repository. Read files before \
changing them, keep edits small and focused, run the project's checks after a change, and report \
what you did in a few plain sentences. Prefer the dedicated file tools over shell commands for \
reading, searching and editing files.";

/// The minimal agent's state: the conversation and the fixed prefix.
#[derive(Debug, Clone)]
pub struct MinimalAgent {
    model: String,
    max_tokens: u64,
    tools: Vec<Tool>,
    messages: Vec<Message>,
}

fn schema(properties: serde_json::Value, required: &[&str]) -> serde_json::Value {
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

/// The tools the minimal agent offers, sorted by name.
pub fn minimal_tools() -> Vec<Tool> {
    vec![
        Tool::custom("Bash", "Runs a shell command and returns its output.", schema(json!({"command": {"type": "string"}, "description": {"type": "string"}}), &["command"])),
        Tool::custom("Edit", "Replaces an exact string in a file.", schema(json!({"file_path": {"type": "string"}, "old_string": {"type": "string"}, "new_string": {"type": "string"}, "replace_all": {"type": "boolean"}}), &["file_path", "old_string", "new_string"])),
        Tool::custom("Glob", "Lists files matching a glob pattern.", schema(json!({"pattern": {"type": "string"}, "path": {"type": "string"}}), &["pattern"])),
        Tool::custom("Read", "Reads a file with line numbers.", schema(json!({"file_path": {"type": "string"}, "offset": {"type": "integer"}, "limit": {"type": "integer"}}), &["file_path"])),
        Tool::custom("Write", "Writes a whole file.", schema(json!({"file_path": {"type": "string"}, "content": {"type": "string"}}), &["file_path", "content"])),
    ]
}

impl MinimalAgent {
    pub fn new(world: &World) -> Self {
        MinimalAgent {
            model: world.model_id.clone(),
            max_tokens: world.max_output_tokens.unwrap_or(32_000),
            tools: minimal_tools(),
            messages: Vec::new(),
        }
    }

    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// A prompt from the user (merged into a trailing user message, as the API would).
    pub fn user_prompt(&mut self, text: &str) {
        match self.messages.last_mut() {
            Some(last) if last.role == Role::User => {
                let mut blocks = last.content.to_blocks();
                blocks.push(ContentBlock::text(text));
                last.content = MessageContent::Blocks(blocks);
            }
            _ => self.messages.push(Message::user_text(text)),
        }
    }

    /// The request body for the conversation as it stands.
    pub fn build_request(&self) -> Request {
        let mut request = Request::new(self.model.clone(), self.max_tokens);
        request.system = Some(SystemPrompt::Blocks(vec![SystemBlock::text(SYSTEM_PROMPT).with_cache_control(Some(CacheControl::ephemeral()))]));
        request.tools = Some(self.tools.clone());
        request.messages = self.messages.clone();
        mark_last_block(&mut request.messages);
        request
    }

    /// Appends the model's reply and the results of the tools it called.
    pub fn apply_reply(&mut self, reply: &Reply, world: &mut World) {
        self.messages.push(Message::assistant_blocks(reply.content.clone()));
        let results: Vec<ContentBlock> = reply
            .content
            .iter()
            .filter_map(|block| match block {
                ContentBlock::ToolUse { id, name, input, .. } => Some(execute(id, name, input, world)),
                _ => None,
            })
            .collect();
        if !results.is_empty() {
            self.messages.push(Message::user_blocks(results));
        }
    }
}

/// Puts the one message-level marker on the last block of the last message, skipping a
/// trailing thinking block as the reference client does (then no marker at all).
pub fn mark_last_block(messages: &mut [Message]) {
    let Some(last) = messages.last_mut() else { return };
    let mut blocks = last.content.to_blocks();
    if let Some(block) = blocks.last_mut() {
        if block.is_thinking() {
            return;
        }
        block.set_cache_control(Some(CacheControl::ephemeral()));
    }
    last.content = MessageContent::Blocks(blocks);
}

fn tool_result(id: &str, content: String, is_error: bool) -> ContentBlock {
    ContentBlock::tool_result(id, ToolResultContent::Text(content), is_error.then_some(true))
}

/// `cat -n`-style numbering as the Read tool returns it.
pub fn number_lines(text: &str, offset: usize, limit: usize) -> String {
    text.lines()
        .enumerate()
        .skip(offset)
        .take(limit)
        .map(|(i, line)| format!("{:>6}\t{line}\n", i + 1))
        .collect()
}

fn execute(id: &str, name: &str, input: &serde_json::Value, world: &mut World) -> ContentBlock {
    if let Some(scripted) = world.tool_outputs.get(id) {
        return ContentBlock::tool_result(id, scripted.content.clone(), scripted.is_error.then_some(true));
    }
    let arg = |key: &str| input.get(key).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
    let result = match name {
        "Read" => {
            let offset = input.get("offset").and_then(|v| v.as_u64()).unwrap_or(1).saturating_sub(1) as usize;
            let limit = input.get("limit").and_then(|v| v.as_u64()).unwrap_or(2000) as usize;
            world.fs.read(&arg("file_path")).map(|text| number_lines(text, offset, limit)).map_err(|e| e.to_string())
        }
        "Write" => world
            .fs
            .write(&arg("file_path"), arg("content"), &world.clock)
            .map(|()| format!("File created successfully at: {}", arg("file_path")))
            .map_err(|e| e.to_string()),
        "Edit" => {
            let replace_all = input.get("replace_all").and_then(|v| v.as_bool()).unwrap_or(false);
            world
                .fs
                .edit(&arg("file_path"), &arg("old_string"), &arg("new_string"), replace_all, &world.clock)
                .map(|_| format!("The file {} has been updated.", arg("file_path")))
                .map_err(|e| e.to_string())
        }
        "Glob" => {
            let base = input.get("path").and_then(|v| v.as_str()).map(str::to_owned).unwrap_or_else(|| world.cwd.clone());
            world.fs.glob(&arg("pattern"), &base).map(|paths| if paths.is_empty() { "No files found".to_owned() } else { paths.join("\n") }).map_err(|e| e.to_string())
        }
        "Bash" => Ok(String::new()),
        other => Err(format!("No such tool available: {other}")),
    };
    match result {
        Ok(text) => tool_result(id, text, false),
        Err(text) => tool_result(id, text, true),
    }
}
