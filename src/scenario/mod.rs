//! Scenario files (format v1, YAML): a world, a script, and budgets.
//!
//! ```yaml
//! name: read-and-answer            # required
//! description: ...                 # optional
//! world:
//!   model: claude-sonnet-4-5       # required; kept as written
//!   context_window: 200000         # optional override of the model's window
//!   max_output_tokens: 32000       # optional override
//!   clock_start: "2026-03-01T09:00:00Z"   # RFC 3339; default 2026-01-01T09:00:00Z
//!   timezone: "+01:00"             # UTC (default), a fixed offset, or an IANA name
//!   seed: 7                        # default 0
//!   cwd: /repo                     # default /repo
//!   files:                         # initial files; keys absolute or relative to cwd
//!     /repo/src/main.rs: |
//!       fn main() {}
//!     /repo/NOTES.md: {contents: "...", mtime: "2026-02-27T18:00:00Z"}  # optional mtime
//!   env: {DISABLE_AUTO_COMPACT: 1} # values may be strings, numbers or booleans
//!   fallback:                      # optional: synthesize replies for unscripted lanes
//!     reply_tokens: 40             # default 40
//!     summary_tokens: 2000         # default 2000, for lanes compact / session_memory
//!     after_script_ends: false     # default false
//!   home: /home/user               # config home is {home}/.claude (CLAUDE.md, skills, rules)
//!   settings: {claudeMdExcludes: ["**/vendor/**"], includeGitInstructions: true}
//!   git:                           # the repository at the cwd (gitStatus in the system prompt)
//!     branch: feature/parser       # required
//!     main_branch: main            # default main
//!     user_name: Ada               # optional
//!     status: [" M src/lib.rs", "?? notes.md"]        # `git status --short` lines; [] = clean
//!     recent_commits: ["1a2b3c4 Fix the parser"]      # `git log --oneline`, newest first
//!   mcp_servers:                   # scripted servers, configuration order
//!     - {name: jira, instructions: "...", connected: false,
//!        tools: [{name: search, description: "...", input_schema: {...}, always_load: false}]}
//!   hook_answers:                  # answers of hooks; any of the 27 events
//!     - {event: PostToolUse, matcher: Read, additional_context: "..."}   # standalone (no command)
//!     - {event: Stop, command: "check.sh", exit_code: 2, stderr: "..."}  # answers that configured hook
//!       # also: stdout, json, decision (allow/deny/ask/block), reason, updated_input, updated_output
//!   plugins: [/plugins/demo]       # plugin folders (virtual paths) enabled at start
//!   redact_thinking: false         # the client redacts thinking: no clear_thinking edit of its own
//!   restored_unrecorded: "..."     # every full compaction also restores this (a real session's stand-in)
//!   mount:                         # real directories loaded into the virtual fs
//!     - {from: ../data/tree, at: /repo}   # from: relative to the scenario file
//!   git:                           # the cwd is a repository (the system prompt's git snapshot)
//!     {branch: main, main_branch: main, user_name: Ada, status: "", recent_commits: "a1b2c3d Init"}
//! script:                          # ordered steps; each has exactly one kind key
//!   - user: "Read main.rs"         # a prompt: the agent runs a turn
//!   - assistant:                   # the model's next reply on a lane
//!       - thinking: "..."          # blocks: text, thinking, redacted_thinking, tool_use
//!       - text: "Let me look."
//!       - tool_use: {name: Read, input: {file_path: /repo/src/main.rs}, id: toolu_x}  # id optional
//!     lane: main                   # default main; compact, session_memory, side, or
//!                                  # subagent:<type>: replies of the agents Agent calls start
//!     stop_reason: tool_use        # default: tool_use if a tool is called, else end_turn
//!     usage: {output_tokens: 40}   # optional: input_tokens, output_tokens, cache_*_input_tokens
//!     output_tokens: 40            # optional; else usage.output_tokens, else chars/4
//!     latency: {first_token: 800ms, total: 3s}   # optional; first_token defaults to total
//!   - tool_output: {Bash: "ok"}    # outputs for the previous tool-calling assistant step,
//!                                  # keyed by tool_use id or tool name; a value is a string or
//!                                  # {content: ..., is_error: true}; on an Agent call,
//!                                  # {content: ..., subagent: true} runs the subagent (its
//!                                  # lane's replies) and returns this content; the order
//!                                  # written is the order the tools completed (the message
//!                                  # marker goes on the result written last)
//!   - wait: 10m                    # virtual time passes: ms, or 250ms / 90s / 10m / 2h / 1h30m / 1d
//!   - write_file: {path: src/lib.rs, content: "..."}   # the user edits a file
//!   - remove_file: src/old.rs      # the user deletes a file or directory
//!   - mcp_connect: jira            # a server of world.mcp_servers connects (late)
//!   - mcp_disconnect: jira         # it disconnects
//!   - mcp_list_changed: {server: jira, tools: [{name: search, description: ...}]}
//!   - plugin_enable: /plugins/demo # enable a plugin folder; every plugin refreshes (plugin_reloaded)
//!   - plugin_reload: true          # /reload-plugins: re-read every enabled plugin
//!   - model_switch: claude-opus-4-5  # /model: later requests go to another model
//!   - git: {branch: main, status: []}  # the repository changes; the prompt keeps its snapshot
//!   - clear: true                  # /clear: new conversation (SessionEnd, SessionStart clear)
//!   - resume: true                 # --resume in a new process (SessionStart resume)
//!   - attachment: {type: task_reminder, text: "<system-reminder>...</system-reminder>"}
//!                                  # an attachment a recorded client sent here, sent as is
//!   - microcompact: {tool_use_ids: [toolu_1], history_chars: 0}
//!                                  # a recorded microcompact: these results cleared to the
//!                                  # marker, history_chars cut from the opening prompt's start
//!   - resume_lost: {tool_use_ids: [toolu_2]}
//!                                  # a recorded resume lost these tool uses and their results
//! expect:                          # budgets for `ctxsim check`, all optional
//!   cache_breaks: 0                # at most
//!   min_cache_hit_ratio: 0.8       # at least, in [0, 1]
//!   max_cost_usd: 1.5              # at most
//!   compactions: {auto: 0}         # exactly, per stage id
//!   peak_context_tokens: 50000     # at most
//!   max_requests: 10               # at most
//!   break_causes: [ttl_expired]    # exactly these causes of cache breaks, in order
//! ```
//!
//! Unknown keys are errors. Every error names the file, line, column and field:
//! `scenarios/x.yaml:12:9: script[3].assistant[0]: unknown variant `txt`, expected one of ...`.

mod build;
mod check;
mod duration;
mod error;
mod load;
mod locate;
pub(crate) mod raw;
mod schema;
mod values;

pub use build::BuiltScript;
pub use duration::{DurationMs, parse_duration};
pub use error::{Diagnostic, ScenarioError};
pub use load::{MAX_YAML_DEPTH, check_yaml_depth, load_scenario, load_scenario_confined, parse_scenario, parse_scenario_document};
pub(crate) use load::{json_depth, scenario_of_parts};
pub use schema::{AssistantStep, CompactionCounts, Expect, FallbackSpec, ImageSpec, Scenario, SettingsSpec, Step, ToolFile, ToolOutput, WorldSpec};
pub use values::{EnvValue, FileSpec, Rfc3339, TimeZoneName};
