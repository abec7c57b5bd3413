//! Context-bearing attachments (reference layers-1-5 §5.2): what each carries and how it is
//! rendered for the API. Placement and merging (bubbling to the top of a human turn, folding
//! into a string tool_result) belong to [`crate::agent::normalize`].
//!
//! Wrapper shapes (`<system-reminder>`, `Contents of {path}:`, `{hookName} hook additional
//! context:`, `### Skill: {name}`) are the reference's; every sentence is our own writing.

use crate::agent::wording::{Part, CLIENT_2_1_88};
use crate::api::{ContentBlock, MessageContent, SharedText};

/// The sizes of the client's own sentences in the listings this agent sends: its profile's
/// (2.1.88), the table the rendering of a recorded attachment shares ([`crate::agent::wording`]).
const WORDING: crate::agent::wording::AttachmentWording = CLIENT_2_1_88;

/// `<system-reminder>\n{x}\n</system-reminder>` (37 characters of overhead).
pub fn system_reminder(text: &str) -> String {
    // (Made at its size: `format!` sizes its buffer by the literal parts, and a long text
    // grows it by copies.)
    ["<system-reminder>\n", text, "\n</system-reminder>"].concat()
}

/// A todo item as TodoWrite stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Todo {
    pub content: String,
    pub status: String,
}

/// An invoked skill remembered for re-attachment after compaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvokedSkill {
    pub name: String,
    /// Where the client says it came from, as its `invoked_skills` attachment shows it
    /// (`{source}:{name}`, [`crate::agent::skills::invoked_path`]); `None` for a slash command
    /// whose record names no source (the text then has no path line).
    pub path: Option<String>,
    pub content: String,
    /// When it was invoked (virtual time): a compaction restores the most recent first.
    pub invoked_at_ms: u64,
}

/// One attachment. Kinds that are not API-visible in the reference are not modelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attachment {
    /// A CLAUDE.md or rule injected when a file under its directory (or matching its `paths`)
    /// was read.
    NestedMemory { path: String, content: String },
    /// A memory file chosen for the turn (`relevant_memories`, one per memory); the header was
    /// fixed when it was chosen.
    RelevantMemory { path: String, header: String, content: String },
    /// Skills not yet announced, already formatted within the budget.
    SkillListing { listing: String },
    /// Deferred tool names added to / removed from the announced set (delta mode).
    DeferredToolsDelta { added: Vec<String>, removed: Vec<String> },
    /// Agent types added to / removed from the announced set (`CLAUDE_CODE_AGENT_LIST_IN_MESSAGES`):
    /// listing lines and removed type names, each sorted by agent type. `initial` is the first
    /// announcement of the thread (its own header and the concurrency note).
    AgentListingDelta { added: Vec<String>, removed: Vec<String>, initial: bool },
    /// MCP server instructions added / removed (delta mode), sorted by server name.
    McpInstructionsDelta { added: Vec<(String, String)>, removed: Vec<String> },
    /// `additionalContext` of a hook; `hook_name` is `PostToolUse:Read`, `SessionStart`, ...
    HookAdditionalContext { hook_name: String, lines: Vec<String> },
    /// Plain stdout of a SessionStart / UserPromptSubmit hook.
    HookSuccess { hook_name: String, content: String },
    /// Exit 2 or a JSON `block` of a Post* hook.
    HookBlockingError { hook_name: String, command: String, error: String },
    /// `continue: false` of a hook.
    HookStoppedContinuation { hook_name: String, message: String },
    /// A file the agent read changed on disk since.
    EditedTextFile { path: String, snippet: String },
    /// The local date differs from the last one seen.
    DateChange { date: String },
    TodoReminder { todos: Vec<Todo> },
    InvokedSkills { skills: Vec<InvokedSkill> },
    /// An attachment a recorded client sent (a workload's `attachment` step): `kind` is the
    /// record's type, `text` the whole text block sent, wrapper included.
    Recorded { kind: String, text: SharedText },
    /// An attachment a compaction rebuilt (restored file, plan, invoked skills, deltas), as the
    /// messages it becomes on the wire: a restored file is the Read call (a string message) and
    /// its result; the others one message.
    /// `call` is that string message, `texts` the blocks of the (other) message.
    PostCompact { call: Option<SharedText>, texts: Vec<SharedText> },
}

impl Attachment {
    /// The reference's type id.
    pub fn kind(&self) -> &'static str {
        match self {
            Attachment::NestedMemory { .. } => "nested_memory",
            Attachment::RelevantMemory { .. } => "relevant_memories",
            Attachment::SkillListing { .. } => "skill_listing",
            Attachment::DeferredToolsDelta { .. } => "deferred_tools_delta",
            Attachment::AgentListingDelta { .. } => "agent_listing_delta",
            Attachment::McpInstructionsDelta { .. } => "mcp_instructions_delta",
            Attachment::HookAdditionalContext { .. } => "hook_additional_context",
            Attachment::HookSuccess { .. } => "hook_success",
            Attachment::HookBlockingError { .. } => "hook_blocking_error",
            Attachment::HookStoppedContinuation { .. } => "hook_stopped_continuation",
            Attachment::EditedTextFile { .. } => "edited_text_file",
            Attachment::DateChange { .. } => "date_change",
            Attachment::TodoReminder { .. } => "todo_reminder",
            Attachment::InvokedSkills { .. } => "invoked_skills",
            Attachment::PostCompact { .. } => "post_compact",
            Attachment::Recorded { .. } => "recorded",
        }
    }

    /// The text blocks this attachment becomes (each a `<system-reminder>`).
    pub fn render(&self) -> Vec<ContentBlock> {
        match self {
            Attachment::PostCompact { call, texts } => call.iter().chain(texts).map(|t| ContentBlock::text(t.clone())).collect(),
            Attachment::Recorded { text, .. } => vec![ContentBlock::text(text.clone())],
            _ => vec![ContentBlock::text(system_reminder(&self.text()))],
        }
    }

    /// The messages a post-compact attachment of several messages becomes (`None` for every
    /// other attachment: one message, [`Self::render`]).
    pub fn split_messages(&self) -> Option<Vec<MessageContent>> {
        match self {
            Attachment::PostCompact { call: Some(call), texts } => Some(vec![
                MessageContent::Text(call.clone()),
                MessageContent::Blocks(texts.iter().map(|t| ContentBlock::text(t.clone())).collect()),
            ]),
            _ => None,
        }
    }

    /// The text inside the `<system-reminder>` wrapper.
    pub fn text(&self) -> String {
        match self {
            Attachment::NestedMemory { path, content } => format!("Contents of {path}:\n\n{content}"),
            Attachment::RelevantMemory { header, content, .. } => format!("{header}\n\n{content}"),
            Attachment::SkillListing { listing } => format!("{}\n\n{listing}", WORDING.text(Part::SkillsHeader)),
            Attachment::DeferredToolsDelta { added, removed } => {
                let mut parts = Vec::new();
                if !added.is_empty() {
                    parts.push(format!("{}\n{}", WORDING.text(Part::DeferredAdded), added.join("\n")));
                }
                if !removed.is_empty() {
                    parts.push(format!("{}\n{}", WORDING.text(Part::DeferredRemoved), removed.join("\n")));
                }
                parts.join("\n\n")
            }
            Attachment::AgentListingDelta { added, removed, initial } => {
                let mut parts = Vec::new();
                if !added.is_empty() {
                    let header = WORDING.text(if *initial { Part::AgentsInitial } else { Part::AgentsNew });
                    parts.push(format!("{header}\n{}", added.join("\n")));
                }
                if !removed.is_empty() {
                    let names: Vec<String> = removed.iter().map(|name| format!("- {name}")).collect();
                    parts.push(format!("{}\n{}", WORDING.text(Part::AgentsRemoved), names.join("\n")));
                }
                if *initial {
                    parts.push(WORDING.text(Part::AgentsConcurrency));
                }
                parts.join("\n\n")
            }
            Attachment::McpInstructionsDelta { added, removed } => {
                let mut parts = Vec::new();
                if !added.is_empty() {
                    let blocks: Vec<String> = added.iter().map(|(name, text)| format!("## {name}\n{text}")).collect();
                    parts.push(format!("{}\n\n{}", WORDING.text(Part::McpAdded), blocks.join("\n\n")));
                }
                if !removed.is_empty() {
                    parts.push(format!("{}\n{}", WORDING.text(Part::McpRemoved), removed.join("\n")));
                }
                parts.join("\n\n")
            }
            Attachment::HookAdditionalContext { hook_name, lines } => {
                format!("{hook_name} hook additional context: {}", lines.join("\n"))
            }
            Attachment::HookSuccess { hook_name, content } => format!("{hook_name} hook success: {content}"),
            Attachment::HookBlockingError { hook_name, command, error } => {
                format!("{hook_name} hook blocking error from command: \"{command}\": {error}")
            }
            Attachment::HookStoppedContinuation { hook_name, message } => format!("{hook_name} hook stopped continuation: {message}"),
            Attachment::EditedTextFile { path, snippet } => format!("{EDITED_FILE_NOTE} {path}\n{snippet}"),
            Attachment::DateChange { date } => format!("{DATE_CHANGE_NOTE} {date}."),
            Attachment::TodoReminder { todos } => {
                let mut text = TODO_REMINDER.to_owned();
                if !todos.is_empty() {
                    let items: Vec<String> =
                        todos.iter().enumerate().map(|(i, t)| format!("{}. [{}] {}", i + 1, t.status, t.content)).collect();
                    text.push_str(&format!("\n\nThe list as it stands:\n\n[{}]", items.join(", ")));
                }
                text
            }
            Attachment::PostCompact { call, texts } => call.iter().chain(texts).map(|t| t.as_str()).collect::<Vec<_>>().join("\n"),
            Attachment::Recorded { text, .. } => text.to_string(),
            Attachment::InvokedSkills { skills } => {
                let parts: Vec<String> =
                    skills.iter().map(|s| format!("### Skill: {}\n{}\n{}", s.name, path_line(s.path.as_deref()), s.content)).collect();
                format!("{INVOKED_SKILLS_HEADER}\n\n{}", parts.join("\n\n---\n\n"))
            }
        }
    }
}

/// The line naming an invoked skill's path with the newline after it (and a blank line), or
/// nothing when the path is unknown.
pub(crate) fn path_line(path: Option<&str>) -> String {
    path.map_or_else(String::new, |p| format!("Path: {p}\n"))
}

const EDITED_FILE_NOTE: &str = "A file you read earlier was changed since, by the user or a tool (a linter, \
a formatter). The change is intended: take it into account, do not revert it unless asked, and do not \
mention this note. The changed lines of";
const DATE_CHANGE_NOTE: &str = "The calendar date has moved on since this conversation began. Do not tell the \
user about it unless they ask; today's date is";
const TODO_REMINDER: &str = "The todo list has not been touched for a while. If the work in hand would \
benefit from tracking, update it with TodoWrite; if the list is stale, clean it up. Use this only when it \
helps the current task, and never mention this reminder to the user.";
/// The opening words of every skill listing's header (the dialects find the listing by them).
pub(crate) const SKILL_LISTING_HEADER: &str = crate::agent::wording::SKILLS_HEADER_OPENING;
const INVOKED_SKILLS_HEADER: &str = "Skills invoked earlier in this session, kept so their instructions still apply:";
