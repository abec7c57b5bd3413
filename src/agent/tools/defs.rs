//! The built-in tool set, by the reference client's names (reference §3.1, §3.3, §3.4).
//!
//! Input schemas have the reference's shape — property names, types, enums, defaults, required
//! lists and the zod `$schema` key, all facts of the wire format — taken from public request
//! captures of Claude Code 2.1.x and matched to the measured 2.1.88 schema sizes where known.
//! Every description (the tool's and each property's) is this project's own writing, padded by
//! the size profile to the measured lengths.

use serde_json::{Map, Value, json};

use crate::agent::profile::{FillLayout, SizeProfile, ToolSize, js_len, pad_to, pad_to_size_escaped};
use crate::api::{SharedValue, Tool};

/// The `$schema` key zod-to-json-schema writes first in every built-in schema.
pub const JSON_SCHEMA_DRAFT: &str = "https://json-schema.org/draft/2020-12/schema";

/// Names of the tools `ListMcpResourcesTool` / `ReadMcpResourceTool`: dropped from the built-in
/// pool and re-added in the MCP partition when a connected server supports resources.
pub const LIST_MCP_RESOURCES: &str = "ListMcpResourcesTool";
pub const READ_MCP_RESOURCE: &str = "ReadMcpResourceTool";
pub const TOOL_SEARCH: &str = "ToolSearch";

/// A built-in tool before pool assembly.
#[derive(Debug, Clone, PartialEq)]
pub struct BuiltinTool {
    pub name: &'static str,
    pub description: String,
    /// Shared, so that a copy of the tool, from the memo of built tools or into a request's
    /// `tools`, counts it rather than copying its object.
    pub input_schema: SharedValue,
    /// `shouldDefer`: hidden behind tool search when it is on.
    pub should_defer: bool,
}

impl BuiltinTool {
    /// The wire form: `name, description, input_schema` in that order.
    pub fn to_api(&self) -> Tool {
        Tool::custom(self.name, self.description.clone(), self.input_schema.clone())
    }
}

/// Base tools in print mode (todo v1: TodoWrite) — the 22 of the reference's standard mode.
const BASE_PRINT: &[&str] = &[
    "Agent", "AskUserQuestion", "Bash", "CronCreate", "CronDelete", "CronList", "Edit", "EnterPlanMode",
    "EnterWorktree", "ExitPlanMode", "ExitWorktree", "Glob", "Grep", "NotebookEdit", "Read", "Skill",
    "TaskOutput", "TaskStop", "TodoWrite", "WebFetch", "WebSearch", "Write",
];

/// Base tools interactive (todo v2: the four Task* tools replace TodoWrite) — 25 tools.
const BASE_INTERACTIVE: &[&str] = &[
    "Agent", "AskUserQuestion", "Bash", "CronCreate", "CronDelete", "CronList", "Edit", "EnterPlanMode",
    "EnterWorktree", "ExitPlanMode", "ExitWorktree", "Glob", "Grep", "NotebookEdit", "Read", "Skill",
    "TaskCreate", "TaskGet", "TaskList", "TaskOutput", "TaskStop", "TaskUpdate", "WebFetch", "WebSearch",
    "Write",
];

/// Names of the enabled base tools (without ToolSearch), sorted. `todo_v2` is on when
/// interactive or with `CLAUDE_CODE_ENABLE_TASKS`.
pub fn base_tool_names(todo_v2: bool) -> &'static [&'static str] {
    if todo_v2 { BASE_INTERACTIVE } else { BASE_PRINT }
}

/// Every built-in this module defines (base tools of both modes, ToolSearch, the MCP resource
/// tools), in alphabetical order.
pub fn all_builtin_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = BASE_INTERACTIVE.to_vec();
    names.extend(["TodoWrite", TOOL_SEARCH, LIST_MCP_RESOURCES, READ_MCP_RESOURCE]);
    names.sort_unstable();
    names
}

/// Where the Agent tool's description gets its list of agent types from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentToolListing {
    /// The listing lines, embedded in the description (the default; frozen at first render).
    /// Shared: the session's listing and the tool pool's key hold one list
    /// ([`AgentToolListing::same`]).
    Inline(std::sync::Arc<[String]>),
    /// `CLAUDE_CODE_AGENT_LIST_IN_MESSAGES`: the list goes to `agent_listing_delta` attachments.
    InMessages,
}

impl AgentToolListing {
    /// `self == other`, a shared list compared by pointer first (`Arc<[T]>`'s `==` compares
    /// the contents): the session asks at every request whether its listing is the pool key's.
    pub fn same(&self, other: &AgentToolListing) -> bool {
        match (self, other) {
            (AgentToolListing::Inline(a), AgentToolListing::Inline(b)) => crate::shared::same(a, b),
            (a, b) => a == b,
        }
    }
}

impl Default for AgentToolListing {
    /// The built-in types of print mode, the set the reference measured the description with.
    fn default() -> Self {
        AgentToolListing::Inline(crate::agent::agents::built_in_agents(false).iter().map(|a| a.listing_line()).collect())
    }
}

fn agent_listing_block(lines: &[String]) -> String {
    format!("\n\n{AGENT_LISTING_HEADING}\n{}", lines.join("\n"))
}

/// The Agent tool with `listing`. The reference measured its description with the print-mode
/// built-ins listed; our own text is padded so that with that listing it has the measured
/// length, and every other listing changes the length by its own difference.
pub fn agent_tool(profile: &SizeProfile, padding: bool, listing: &AgentToolListing) -> BuiltinTool {
    // The tool before its listing is the same for every listing: built once per profile.
    let mut tool = profile.built_tools.get_or_build("Agent", padding, || Some(agent_tool_unlisted(profile, padding))).expect("Agent is a built-in");
    match listing {
        AgentToolListing::Inline(lines) => tool.description.push_str(&agent_listing_block(lines)),
        AgentToolListing::InMessages => {
            tool.description.push_str("\n\n");
            tool.description.push_str(AGENT_LISTING_ELSEWHERE);
        }
    }
    tool
}

/// [`agent_tool`] before its listing is appended.
fn agent_tool_unlisted(profile: &SizeProfile, padding: bool) -> BuiltinTool {
    let (name, description, input_schema, should_defer) = raw_tool("Agent").expect("Agent is a built-in");
    let mut tool = BuiltinTool { name, description: description.to_owned(), input_schema: input_schema.into(), should_defer };
    let measured_listing = match AgentToolListing::default() {
        AgentToolListing::Inline(lines) => js_len(&agent_listing_block(&lines)),
        AgentToolListing::InMessages => 0,
    };
    if let (Some(size), true) = (profile.tool("Agent"), padding) {
        pad_schema(&mut tool.input_schema, size.schema, "Agent");
        let listing_tokens = match AgentToolListing::default() {
            AgentToolListing::Inline(lines) => u64::from(crate::measure::tokens::bpe(&agent_listing_block(&lines))),
            AgentToolListing::InMessages => 0,
        };
        let tokens = description_tokens(profile, "Agent", size, &tool.input_schema).saturating_sub(listing_tokens);
        tool.description = pad_to_size_escaped(AGENT, size.description.saturating_sub(measured_listing), tokens, "Agent");
    }
    tool
}

/// Builds one built-in by name, padded to the profile when `padding` (and the profile knows it).
/// The Agent tool comes with the default listing (see [`agent_tool`]).
pub fn builtin_tool(name: &str, profile: &SizeProfile, padding: bool) -> Option<BuiltinTool> {
    if name == "Agent" {
        return Some(agent_tool(profile, padding, &AgentToolListing::default()));
    }
    profile.built_tools.get_or_build(name, padding, || build_builtin_tool(name, profile, padding))
}

/// [`builtin_tool`] of any tool but the Agent tool, built.
fn build_builtin_tool(name: &str, profile: &SizeProfile, padding: bool) -> Option<BuiltinTool> {
    let (name, raw_description, schema, should_defer) = raw_tool(name)?;
    let mut description = raw_description.to_owned();
    let mut input_schema = schema;
    if let (Some(size), true) = (profile.tool(name), padding) {
        pad_schema(&mut input_schema, size.schema, name);
        description = pad_to_size_escaped(&description, size.description, description_tokens(profile, name, size, &input_schema), name);
    }
    Some(BuiltinTool { name, description, input_schema: input_schema.into(), should_defer })
}

/// The o200k tokens a tool's description is padded to: the captured tokens of the whole tool as
/// sent (for a tool the capture did not see, its length at the density of the captured tools)
/// less what the rest of its JSON (name, schema, keys) holds. 0 (characters only) without a
/// capture.
fn description_tokens(profile: &SizeProfile, name: &str, size: ToolSize, schema: &Value) -> u64 {
    let whole = match profile.tokens.tools.get(name) {
        Some(&tokens) => tokens,
        None => profile.tokens.all_tools.of(size.description + size.schema),
    };
    if whole == 0 {
        return 0;
    }
    // The empty description's quotes are counted with the escaped description.
    let frame = json!({"name": name, "description": "", "input_schema": schema});
    (whole + 1).saturating_sub(u64::from(crate::measure::tokens::bpe(&frame.to_string())))
}

/// Compact JSON length of a schema, as `JSON.stringify` writes it (non-ASCII not escaped).
pub fn schema_len(schema: &Value) -> usize {
    js_len(&serde_json::to_string(schema).expect("a JSON value serializes"))
}

/// Grows the schema to `target` compact-JSON characters by extending the first top-level
/// property description. Only descriptions carry filler, so names, types and required lists —
/// the facts — never change. Schemas without a described property stay as they are.
fn pad_schema(schema: &mut Value, target: usize, seed: &str) {
    let current = schema_len(schema);
    if current >= target {
        return;
    }
    let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) else { return };
    let Some(description) = properties
        .values_mut()
        .filter_map(|property| property.get_mut("description"))
        .find(|description| description.is_string())
    else {
        return;
    };
    let text = description.as_str().unwrap_or_default().to_owned();
    // Filler is ASCII without quotes or backslashes, so its JSON length equals its length.
    let padded = pad_to(&text, js_len(&text) + (target - current), FillLayout::Line, seed);
    *description = Value::String(padded);
}

/// A property with its description first, as zod-to-json-schema orders the keys.
fn prop(description: &str, rest: Value) -> Value {
    let mut out = Map::new();
    out.insert("description".into(), Value::String(description.into()));
    if let Value::Object(rest) = rest {
        out.extend(rest);
    }
    Value::Object(out)
}

/// A zod object schema: `$schema, type, properties, required?, additionalProperties`.
fn object(properties: Vec<(&str, Value)>, required: &[&str], additional: Value) -> Value {
    let mut out = Map::new();
    out.insert("$schema".into(), Value::String(JSON_SCHEMA_DRAFT.into()));
    out.insert("type".into(), Value::String("object".into()));
    out.insert("properties".into(), Value::Object(properties.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()));
    if !required.is_empty() {
        out.insert("required".into(), json!(required));
    }
    out.insert("additionalProperties".into(), additional);
    Value::Object(out)
}

/// A nested object (no `$schema`).
fn nested(properties: Vec<(&str, Value)>, required: &[&str]) -> Value {
    let mut out = Map::new();
    out.insert("type".into(), Value::String("object".into()));
    out.insert("properties".into(), Value::Object(properties.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()));
    if !required.is_empty() {
        out.insert("required".into(), json!(required));
    }
    out.insert("additionalProperties".into(), Value::Bool(false));
    Value::Object(out)
}

fn closed(properties: Vec<(&str, Value)>, required: &[&str]) -> Value {
    object(properties, required, Value::Bool(false))
}

fn string(description: &str) -> Value {
    prop(description, json!({"type": "string"}))
}

fn boolean(description: &str) -> Value {
    prop(description, json!({"type": "boolean"}))
}

fn number(description: &str) -> Value {
    prop(description, json!({"type": "number"}))
}

fn string_list(description: &str) -> Value {
    prop(description, json!({"type": "array", "items": {"type": "string"}}))
}

fn open_record(description: &str) -> Value {
    prop(description, json!({"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {}}))
}

/// Name, raw description, schema and `shouldDefer` of each built-in.
fn raw_tool(name: &str) -> Option<(&'static str, &'static str, Value, bool)> {
    let tool = match name {
        "Agent" => ("Agent", AGENT, closed(
            vec![
                ("description", string("A three-to-five word label for the job.")),
                ("prompt", string("The full brief for the agent.")),
                ("subagent_type", string("Which kind of agent to start.")),
                ("model", prop("Model override for this agent.", json!({"type": "string", "enum": ["sonnet", "opus", "haiku"]}))),
                ("run_in_background", boolean("Start the agent and return at once; you are told when it finishes.")),
                ("isolation", prop("Run the agent in its own git worktree.", json!({"type": "string", "enum": ["worktree"]}))),
            ],
            &["description", "prompt"],
        ), false),
        "AskUserQuestion" => {
            let option = nested(
                vec![
                    ("label", string("Short text of the choice.")),
                    ("description", string("What choosing it means.")),
                    ("preview", string("Optional preview shown beside the choice.")),
                ],
                &["label", "description"],
            );
            let question = nested(
                vec![
                    ("question", string("The question, ending with a question mark.")),
                    ("header", string("A label of at most 12 characters.")),
                    ("options", prop("Two to four distinct choices.", json!({"minItems": 2, "maxItems": 4, "type": "array", "items": option}))),
                    ("multiSelect", prop("Allow several choices.", json!({"default": false, "type": "boolean"}))),
                ],
                &["question", "header", "options", "multiSelect"],
            );
            ("AskUserQuestion", ASK_USER_QUESTION, closed(
                vec![
                    ("questions", prop("One to four questions.", json!({"minItems": 1, "maxItems": 4, "type": "array", "items": question}))),
                    ("answers", open_record("Answers collected by the client, keyed by question.")),
                    ("annotations", open_record("Notes the user attached to answers.")),
                    ("metadata", prop("Tracking data; not shown to the user.", json!({"type": "object", "properties": {"source": {"description": "Where the question came from.", "type": "string"}}, "additionalProperties": false}))),
                ],
                &["questions"],
            ), true)
        }
        "Bash" => ("Bash", BASH, closed(
            vec![
                ("command", string("The shell command to run.")),
                ("timeout", number("Time limit in milliseconds, at most 600000.")),
                ("description", string("A short active-voice summary of what the command does.")),
                ("run_in_background", boolean("Run without waiting; read the output later with TaskOutput.")),
                ("dangerouslyDisableSandbox", boolean("Run outside the sandbox. Only when the user asks or the sandbox caused a failure.")),
            ],
            &["command"],
        ), false),
        "CronCreate" => ("CronCreate", CRON_CREATE, closed(
            vec![
                ("cron", string("Five-field cron expression in local time.")),
                ("prompt", string("The prompt to run on each firing.")),
                ("recurring", prop("Repeat on every match (true) or fire once (false).", json!({"default": true, "type": "boolean"}))),
                ("durable", prop("Keep the job across restarts.", json!({"default": false, "type": "boolean"}))),
            ],
            &["cron", "prompt"],
        ), true),
        "CronDelete" => ("CronDelete", CRON_DELETE, closed(vec![("id", string("ID returned by CronCreate."))], &["id"]), true),
        "CronList" => ("CronList", CRON_LIST, closed(vec![], &[]), true),
        "Edit" => ("Edit", EDIT, closed(
            vec![
                ("file_path", string("Absolute path of the file to change.")),
                ("old_string", string("The exact text to replace.")),
                ("new_string", string("The replacement text; must differ.")),
                ("replace_all", prop("Replace every occurrence.", json!({"default": false, "type": "boolean"}))),
            ],
            &["file_path", "old_string", "new_string"],
        ), false),
        "EnterPlanMode" => ("EnterPlanMode", ENTER_PLAN_MODE, closed(vec![], &[]), true),
        "EnterWorktree" => ("EnterWorktree", ENTER_WORKTREE, closed(vec![("name", string("Optional worktree name; one is generated if left out."))], &[]), true),
        "ExitPlanMode" => ("ExitPlanMode", EXIT_PLAN_MODE, object(
            vec![(
                "allowedPrompts",
                prop(
                    "Permissions the plan needs, by category.",
                    json!({"type": "array", "items": nested(
                        vec![
                            ("tool", prop("The tool the permission is for.", json!({"type": "string", "enum": ["Bash"]}))),
                            ("prompt", string("What the permission allows.")),
                        ],
                        &["tool", "prompt"],
                    )}),
                ),
            )],
            &[],
            json!({}),
        ), true),
        "ExitWorktree" => ("ExitWorktree", EXIT_WORKTREE, closed(
            vec![
                ("action", prop("Keep the worktree on disk or remove it.", json!({"type": "string", "enum": ["keep", "remove"]}))),
                ("discard_changes", boolean("Confirm removal even with uncommitted work.")),
            ],
            &["action"],
        ), true),
        "Glob" => ("Glob", GLOB, closed(
            vec![
                ("pattern", string("Glob pattern to match.")),
                ("path", string("Directory to search; defaults to the working directory.")),
            ],
            &["pattern"],
        ), false),
        "Grep" => ("Grep", GREP, closed(
            vec![
                ("pattern", string("Regular expression to search for.")),
                ("path", string("File or directory to search.")),
                ("glob", string("Glob filter for file names.")),
                ("output_mode", prop("What to return.", json!({"type": "string", "enum": ["content", "files_with_matches", "count"]}))),
                ("-B", number("Lines of context before each match.")),
                ("-A", number("Lines of context after each match.")),
                ("-C", number("Lines of context around each match.")),
                ("context", number("Same as -C.")),
                ("-n", boolean("Show line numbers.")),
                ("-i", boolean("Ignore case.")),
                ("type", string("File type filter, such as rust or py.")),
                ("head_limit", number("Return at most this many entries.")),
                ("offset", number("Skip this many entries first.")),
                ("multiline", boolean("Let patterns span lines.")),
            ],
            &["pattern"],
        ), false),
        "NotebookEdit" => ("NotebookEdit", NOTEBOOK_EDIT, closed(
            vec![
                ("notebook_path", string("Absolute path of the notebook.")),
                ("cell_id", string("ID of the cell to change, or to insert after.")),
                ("new_source", string("New source of the cell.")),
                ("cell_type", prop("Cell type.", json!({"type": "string", "enum": ["code", "markdown"]}))),
                ("edit_mode", prop("Kind of edit.", json!({"type": "string", "enum": ["replace", "insert", "delete"]}))),
            ],
            &["notebook_path", "new_source"],
        ), true),
        "Read" => ("Read", READ, closed(
            vec![
                ("file_path", string("Absolute path of the file.")),
                ("offset", prop("First line to read.", json!({"type": "integer", "minimum": 0, "maximum": 9007199254740991_u64}))),
                ("limit", prop("Number of lines to read.", json!({"type": "integer", "exclusiveMinimum": 0, "maximum": 9007199254740991_u64}))),
                ("pages", string("Page range for PDF files, such as 1-5.")),
            ],
            &["file_path"],
        ), false),
        "Skill" => ("Skill", SKILL, closed(
            vec![("skill", string("Name of the skill.")), ("args", string("Optional arguments."))],
            &["skill"],
        ), false),
        "TaskCreate" => ("TaskCreate", TASK_CREATE, closed(
            vec![
                ("subject", string("Short imperative title.")),
                ("description", string("What needs doing.")),
                ("activeForm", string("Present-continuous label shown while in progress.")),
                ("metadata", open_record("Arbitrary data to attach.")),
            ],
            &["subject", "description"],
        ), true),
        "TaskGet" => ("TaskGet", TASK_GET, closed(vec![("taskId", string("ID of the task."))], &["taskId"]), true),
        "TaskList" => ("TaskList", TASK_LIST, closed(vec![], &[]), true),
        "TaskOutput" => ("TaskOutput", TASK_OUTPUT, closed(
            vec![
                ("task_id", string("ID of the background task.")),
                ("block", prop("Wait for it to finish.", json!({"default": true, "type": "boolean"}))),
                ("timeout", prop("Longest wait in milliseconds.", json!({"default": 30000, "type": "number", "minimum": 0, "maximum": 600000}))),
            ],
            &["task_id", "block", "timeout"],
        ), true),
        "TaskStop" => ("TaskStop", TASK_STOP, closed(
            vec![
                ("task_id", string("ID of the background task to stop.")),
                ("shell_id", string("Older name for task_id.")),
            ],
            &[],
        ), true),
        "TaskUpdate" => ("TaskUpdate", TASK_UPDATE, closed(
            vec![
                ("taskId", string("ID of the task.")),
                ("subject", string("New title.")),
                ("description", string("New description.")),
                ("activeForm", string("New in-progress label.")),
                ("status", prop("New status.", json!({"type": "string", "enum": ["pending", "in_progress", "completed", "deleted"]}))),
                ("addBlocks", string_list("Tasks that wait on this one.")),
                ("addBlockedBy", string_list("Tasks this one waits on.")),
                ("owner", string("Who works on it.")),
                ("metadata", open_record("Data to merge; null removes a key.")),
            ],
            &["taskId"],
        ), true),
        "TodoWrite" => {
            let item = nested(
                vec![
                    ("content", json!({"type": "string", "minLength": 1})),
                    ("status", json!({"type": "string", "enum": ["pending", "in_progress", "completed"]})),
                    ("activeForm", json!({"type": "string", "minLength": 1})),
                ],
                &["content", "status", "activeForm"],
            );
            ("TodoWrite", TODO_WRITE, closed(
                vec![("todos", prop("The updated list.", json!({"type": "array", "items": item})))],
                &["todos"],
            ), true)
        }
        "ToolSearch" => ("ToolSearch", TOOL_SEARCH_TEXT, closed(
            vec![
                ("query", string("Keywords, or select:Name1,Name2 to load tools by name.")),
                ("max_results", prop("How many tools to return.", json!({"default": 5, "type": "number"}))),
            ],
            &["query", "max_results"],
        ), false),
        "WebFetch" => ("WebFetch", WEB_FETCH, closed(
            vec![
                ("url", prop("The URL to fetch.", json!({"type": "string", "format": "uri"}))),
                ("prompt", string("What to extract from the page.")),
            ],
            &["url", "prompt"],
        ), true),
        "WebSearch" => ("WebSearch", WEB_SEARCH, closed(
            vec![
                ("query", prop("The search query.", json!({"type": "string", "minLength": 2}))),
                ("allowed_domains", string_list("Only return results from these domains.")),
                ("blocked_domains", string_list("Never return results from these domains.")),
            ],
            &["query"],
        ), true),
        "Write" => ("Write", WRITE, closed(
            vec![
                ("file_path", string("Absolute path of the file.")),
                ("content", string("The complete file content.")),
            ],
            &["file_path", "content"],
        ), false),
        "ListMcpResourcesTool" => ("ListMcpResourcesTool", LIST_RESOURCES, closed(
            vec![("server", string("Only list resources of this server."))],
            &[],
        ), true),
        "ReadMcpResourceTool" => ("ReadMcpResourceTool", READ_RESOURCE, closed(
            vec![("server", string("The server name.")), ("uri", string("The resource URI."))],
            &["server", "uri"],
        ), true),
        _ => return None,
    };
    Some(tool)
}

// ---------------------------------------------------------------------------------------------
// Our own tool descriptions (padded to the profile at build time).
// ---------------------------------------------------------------------------------------------

const AGENT: &str = "Starts a subagent that works on its own with a fresh context and returns one final report.

Brief the agent completely: it cannot see this conversation. Say what to do, what is known already, and what to return. Independent agents can run in parallel from one message. The report comes back to you, not to the user, so relay what matters.";

/// Heading of the agent listing inside the Agent description.
const AGENT_LISTING_HEADING: &str = "Agent types and the tools each has:";

/// What the Agent description says when the listing travels in `agent_listing_delta`.
const AGENT_LISTING_ELSEWHERE: &str = "The agent types you can start are listed in system reminders in the conversation.";

const ASK_USER_QUESTION: &str = "Asks the user one to four multiple-choice questions while you work, to settle a preference, resolve an ambiguity or choose between approaches. Users can always answer in their own words, so do not add an Other choice. Put a recommended choice first and say it is recommended.";

const BASH: &str = "Runs a shell command in a persistent shell session and returns its output.

The working directory persists between calls; shell variables do not. Quote paths that contain spaces. Prefer absolute paths over cd.

Use this tool for builds, tests, version control, package managers and other real system commands. For reading, searching, editing and creating files use the dedicated tools instead.

Commands time out after two minutes unless a timeout is given (at most ten minutes). Long output is cut. Set run_in_background for long-running servers or watchers and read their output later.

Version control:
- Never change git config, skip hooks, or force-push unless the user asks.
- Commit only when the user asks. Stage specific files rather than everything, check the diff first, and write a message that says why.
- When a hook fails, fix the problem and make a new commit rather than amending.
- To open a pull request, use the gh CLI with a short title and a summary plus test plan in the body.";

const CRON_CREATE: &str = "Schedules a prompt to run later in this session, once or on a cron schedule (five fields, local time). Jobs end with the session unless durable is set. Recurring jobs expire after a week. Spread jobs across the hour instead of putting them all on minute zero.";

const CRON_DELETE: &str = "Cancels a scheduled job by the ID CronCreate returned.";

const CRON_LIST: &str = "Lists the jobs scheduled in this session.";

const EDIT: &str = "Replaces exact text in a file. Read the file first in this conversation. old_string must match the file exactly, including indentation, and must be unique unless replace_all is set; give more surrounding lines to make it unique. Keep edits minimal and do not add emojis unless asked.";

const ENTER_PLAN_MODE: &str = "Switches to plan mode for work that deserves agreement before any change: new features, changes across several files, unclear requirements or several reasonable approaches. In plan mode you explore the code read-only, write a plan, and present it with ExitPlanMode for approval.

Skip plan mode for small, obvious fixes and for pure research questions.";

const ENTER_WORKTREE: &str = "Creates an isolated git worktree on a new branch and moves the session into it. Use it only when the user asks for a worktree. Requires a git repository or configured worktree hooks.";

const EXIT_PLAN_MODE: &str = "Presents the plan you wrote in plan mode and asks the user to approve it. Use it only for planning implementation work, not for research. The plan should already be written to the plan file; this tool reads it from there. Do not ask for approval in other ways.";

const EXIT_WORKTREE: &str = "Leaves a worktree created by EnterWorktree in this session and returns to the original directory. keep leaves the worktree and branch on disk; remove deletes them and refuses when there is uncommitted work unless discard_changes is set, in which case confirm with the user first.";

const GLOB: &str = "Finds files by glob pattern, such as src/**/*.rs, in any size of codebase. Returns paths sorted by modification time. Call several searches in parallel when useful.";

const GREP: &str = "Searches file contents with ripgrep regular expressions. Filter files with glob or type. output_mode chooses between matching lines, file paths (the default) or counts. Use multiline for patterns that span lines. Always use this tool rather than running grep in the shell.";

const NOTEBOOK_EDIT: &str = "Replaces, inserts or deletes one cell of a Jupyter notebook, addressed by cell_id.";

const READ: &str = "Reads a file from the local filesystem by absolute path. By default returns up to 2000 lines from the start, with line numbers; use offset and limit for long files. Reads images, PDFs (with pages for large ones) and notebooks too. Reading a missing file returns an error, not a crash.";

const SKILL: &str = "Loads a skill: packaged instructions and resources for a specific kind of job. When a listed skill matches the request, call this tool before doing anything else for that request. Do not call it for a skill that is already loaded in this conversation.";

const TASK_CREATE: &str = "Adds a task to the session's task list. Use it for work with three or more steps, or when the user gives several things to do. Give each task a short imperative subject and a present-continuous activeForm.";

const TASK_GET: &str = "Returns one task by ID with its description, status and dependencies.";

const TASK_LIST: &str = "Lists all tasks with their status, owner and blockers. Use it to pick the next task once one is finished.";

const TASK_OUTPUT: &str = "Returns the output of a background task such as a shell or agent, waiting for it to finish by default.";

const TASK_STOP: &str = "Stops a running background task by ID.";

const TASK_UPDATE: &str = "Changes a task: status, subject, description, owner or dependencies. Mark a task in progress before starting it and completed only when it is fully done and verified.";

const TODO_WRITE: &str = "Writes the session's todo list. Use it to plan and track work with several steps so the user can follow progress.

When to use it:
- Tasks with three or more distinct steps.
- Requests that list several things to do.
- Right after receiving new instructions, to capture them.

When to skip it:
- A single, simple step.
- Purely conversational or informational requests.

Keep exactly one item in progress at a time, mark items completed as soon as they are done, and remove items that no longer apply. Each item has content (imperative) and activeForm (present continuous).";

const TOOL_SEARCH_TEXT: &str = "Loads deferred tools. Deferred tools are listed by name only and cannot be called until this tool returns their full definitions. Query with keywords to search, or with select:Name to load specific tools by name.";

const WEB_FETCH: &str = "Fetches a URL, converts the page to Markdown and answers the prompt about it with a small model. Results are cached for fifteen minutes. Redirects to another host are reported, not followed; fetch the new URL yourself. Prefer a more specific tool when one is available.";

const WEB_SEARCH: &str = "Searches the web and returns result blocks with titles and links, for information newer than your training data. After answering from results, list the sources you used as Markdown links.";

const WRITE: &str = "Writes a whole file, replacing any existing content. Read an existing file before overwriting it. Prefer Edit for changes to existing files, and do not create documentation files unless asked.";

const LIST_RESOURCES: &str = "Lists the resources offered by connected MCP servers.";

const READ_RESOURCE: &str = "Reads one resource from an MCP server by server name and URI.";
