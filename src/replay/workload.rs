//! A recorded session as a workload for the agent: the scenario that drives
//! [`crate::agent`] through what the recording shows, so that the agent's own pipeline builds
//! every request (system, tools, messages, markers, TTL) and decides when each long-context
//! stage fires.
//!
//! What the recording gives the workload, step by step:
//! - each typed user prompt, with the time before it (`wait`);
//! - each main-lane model reply in order: its text, its thinking (the stored text, or a filler
//!   of the size the reply's output tokens leave for it when the text was not stored), its
//!   tool calls with their recorded ids, its stop reason and output tokens, and its latency
//!   from the prompt or tool result that prompted it to its first block (the request goes out
//!   when that record was written);
//! - each tool result as recorded, bound to its tool_use id (`tool_output`), so the agent's
//!   tool executor returns what the real tool returned;
//! - the recorded compaction summaries, queued on the `compact` lane: where the agent compacts,
//!   it takes the next recorded summary, and once they are used up its own stand-in;
//! - `/model` switches, `/clear`, and `/compact` (a `compact: true` step: the agent compacts
//!   there, trigger `manual`).
//!
//! What the agent produces itself, not the recording: the system prompt, the tools, CLAUDE.md
//! and the user context, every attachment and reminder, and the compactions (when they fire
//! and how the conversation is rebuilt). The workload counts what it leaves to the agent
//! ([`WorkloadReport`]): meta prompts and attachment records, the events of subagents it does
//! not drive, the recorded compaction boundaries.
//!
//! Recorded subagents ([`subagents`]): each Agent call of the main thread is bound to the
//! transcript of its subagent; a bound subagent of a type the agent knows is driven (the agent
//! runs it, its recorded replies answer it, the call's result stays the recorded one), and every
//! call or recorded lane not driven is listed with why ([`WorkloadReport::subagents`]).
//!
//! The script is built as the raw steps a scenario document's script deserializes to, and the
//! scenario loader's checks make them the scenario, so a workload obeys every rule a written
//! scenario does; `ctxsim import --to scenario` writes the same steps as a document for a user
//! to read or edit ([`step_document`]).

mod subagents;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::api::{ContentBlock, MessageContent, StopReason, ToolResultContent};
use crate::recording::format::{LANE_COMPACT, LANE_MAIN};
use crate::recording::claude_code::{ATTACHMENTS_NOT_SENT, UNWRITTEN_REPLY, attachment_text};
use crate::recording::{EventKind, ImportedSession};
use crate::scenario::raw::{AttachmentSpec, BlockSpec, LatencySpec, MicrocompactSpec, RawStep, ResumeLostSpec, ToolOutputSpec, ToolUseSpec, UsageSpec};
use crate::scenario::{DurationMs, ImageSpec, Scenario, ToolFile};

pub use subagents::SubagentRun;

/// What a workload carries over from the recording and what it leaves to the agent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadReport {
    /// Typed user prompts driven.
    pub user_prompts: usize,
    /// The file opens with the summary of a compaction before it, driven as its opening prompt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub opening_summary: bool,
    /// Main-lane replies driven (one model call each).
    pub main_replies: usize,
    /// Recorded tool results returned by the agent's executor.
    pub tool_outputs: usize,
    /// Recorded compaction summaries queued for the agent's compactions.
    pub compaction_summaries: usize,
    /// Recorded `/compact` commands driven (`compact: true` steps).
    #[serde(default)]
    pub manual_compactions: usize,
    /// Thinking blocks recorded without their text, filled to the size the reply leaves.
    pub thinking_filled: usize,
    /// Replies scripted with their recorded usage (the agent counts its context from it, as the
    /// recorded client did); 0 when the simulated usage is the agent's (`import --to scenario`).
    #[serde(default)]
    pub recorded_usage: usize,
    /// Tool outputs carrying the file the call read or wrote, as the record's structured result
    /// shows it (the agent's fs and read state follow it).
    #[serde(default)]
    pub files_shown: usize,
    /// Recorded attachments the agent sends as recorded (`attachment` steps; as recorded only,
    /// with `recorded_usage`): the agent adds none of its own then.
    #[serde(default)]
    pub recorded_attachments: usize,
    /// Tool uses whose results a compaction replaced before they were written, answered with a
    /// stand-in of the session's mean result of that tool.
    #[serde(default)]
    pub unwritten_results: usize,
    /// Replies the client made and counted but never wrote before an automatic compaction
    /// (only their tool hooks' progress shows them: `unwritten_reply`), each stood in for by an
    /// attachment of the size the boundary's `preTokens` leaves above the count of what was
    /// written.
    #[serde(default)]
    pub unwritten_replies: usize,
    /// Recorded microcompacts driven (`microcompact` steps; as recorded only, with
    /// `recorded_usage`): the results they cleared, and
    /// their share of results from before a continuing file taken from its history stand-in.
    #[serde(default)]
    pub recorded_microcompacts: usize,
    /// Resumes after which the recorded client's history lacked tool uses the agent holds
    /// (`resume_lost` steps): the resumed client loaded its history from the `parentUuid`
    /// chain, which does not hold parallel tool uses written beside it, nor their results.
    #[serde(default)]
    pub resume_losses: usize,
    /// What slash commands and Skill calls expanded into (recorded meta prompts: a skill's body,
    /// a command's prompt), driven as recorded (`attachment` steps of type `meta_prompt`).
    #[serde(default)]
    pub meta_prompts: usize,
    /// Of those, the bodies of a slash command or Skill call the recorded client remembered as
    /// invoked (`attachment.skill`; versions from [`super::profile::INVOKED_COMMANDS_RESTORED`]):
    /// the agent's compactions restore them.
    #[serde(default)]
    pub invoked_commands: usize,
    /// Recorded items the agent produces itself or that do not drive it, by kind.
    pub left_to_agent: BTreeMap<String, usize>,
    /// Each Agent call of the main thread and its recorded subagent: bound how, driven or why
    /// not ([`subagents`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subagents: Vec<SubagentRun>,
    /// Recorded subagent lanes no Agent call binds (not driven), with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unbound_subagent_lanes: Vec<String>,
}

/// A session as a scenario, with the recorded main calls the scenario's main requests stand for.
#[derive(Debug, Clone)]
pub struct Workload {
    pub scenario: Scenario,
    /// The scenario as JSON (what `import --to scenario` writes); without its `script` where
    /// the workload was built for the agent's runs only ([`sized_workload_for_runs`], which
    /// read the scenario), but in debug builds.
    pub document: Value,
    /// The recorded compaction summaries queued on the `compact` lane, as the document's
    /// script holds them (its `lane: compact` steps, in order).
    pub summary_steps: Vec<Value>,
    /// Per main reply of the script, in order: the index of the recorded call
    /// ([`crate::recording::RecordedCall::index`]).
    pub main_calls: Vec<usize>,
    /// Per scripted subagent reply, in the order the agent runs them (the order of the
    /// script's steps on each lane): the agent's lane, the recorded call and the subagent.
    pub subagent_calls: Vec<SubagentCall>,
    pub report: WorkloadReport,
    /// The events the record shows before each recorded call, as the sizing's record view read
    /// them ([`size_unmodelled`]); `None` until sized, or when the sizing read no view.
    pub record_events: Option<RecordEvents>,
}

/// Per recorded call (its index), the events the record shows before it
/// ([`super::CallView::events`]: a gap past the TTL, a new turn, a compaction, a re-rendered
/// prompt...), in the order the record view sees them.
pub type RecordEvents = BTreeMap<usize, Vec<String>>;

/// One scripted subagent reply of a [`Workload`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubagentCall {
    /// The agent's lane (`subagent:<type>`), shared by every subagent of the type.
    pub lane: String,
    /// The recorded call ([`crate::recording::RecordedCall::index`]).
    pub index: usize,
    /// The main thread's Agent call that ran the subagent ([`SubagentRun::tool_use_id`]): which
    /// subagent of the lane's type the reply is of.
    pub tool_use_id: String,
}

/// Errors building a workload: the recording has nothing to drive, or the scenario the
/// recording gives does not load (a bug or a recording the scenario format cannot express).
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("{file}: no main-lane model reply to drive the agent with")]
    Empty { file: String },
    #[error("{0}")]
    Scenario(#[from] crate::scenario::ScenarioError),
}

/// The text of a prompt: its string, or its text blocks joined by blank lines.
fn prompt_text(content: &MessageContent) -> String {
    match content {
        MessageContent::Text(text) => text.to_string(),
        MessageContent::Blocks(blocks) => blocks
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n\n"),
    }
}

/// A recorded image or document as a scenario image: its base64 size and, where its header gives
/// them, its pixels (what the API counts an image's tokens from). Its media type is the
/// default one (the document names none).
fn image_spec(source: &Value) -> ImageSpec {
    let bytes = source.get("data").and_then(Value::as_str).map_or(0, str::len);
    let (width, height) = crate::measure::blocks::image_dimensions(source).unzip();
    ImageSpec { media_type: "image/png".to_owned(), base64_bytes: bytes, width, height }
}

/// The text of a tool result and its images as scenario images ([`image_spec`]).
fn result_parts(content: Option<&ToolResultContent>) -> (String, Vec<ImageSpec>) {
    match content {
        None => (String::new(), Vec::new()),
        Some(ToolResultContent::Text(text)) => (String::clone(text), Vec::new()),
        Some(ToolResultContent::Blocks(blocks)) => {
            let mut texts = Vec::new();
            let mut images = Vec::new();
            for block in blocks {
                match block {
                    ContentBlock::Text { text, .. } => texts.push(text.as_str()),
                    ContentBlock::Image(image) | ContentBlock::Document(image) => {
                        images.push(image_spec(&image.source));
                    }
                    _ => {}
                }
            }
            (texts.join("\n"), images)
        }
    }
}

/// A recorded tool result as a scenario tool output: its text, `is_error`, and its images' sizes.
fn result_output(result: &crate::recording::format::ToolResult) -> ToolOutputSpec {
    let (text, images) = result_parts(result.content.as_ref());
    ToolOutputSpec { content: text, is_error: result.is_error, images, subagent: false, file: None }
}

/// Deterministic prose of `chars` characters standing for thinking whose text was not stored.
fn thinking_filler(chars: usize) -> String {
    crate::agent::compact::generator::filler("thinking", chars)
}

fn stop_reason_name(reason: StopReason) -> Value {
    serde_json::to_value(reason).unwrap_or(Value::Null)
}

/// Builds the workload of `session` (read from `file`, named in messages and in the scenario).
/// `window` is the context window the client ran with (see
/// [`super::triggers::session_window`]); `None` keeps the model's. Thinking whose text was not
/// stored is filled at four characters per output token left by the visible part;
/// [`sized_workload`] fills it to the replay's fitted estimate instead.
pub fn workload_from_session(session: &ImportedSession, file: &str, window: Option<u64>) -> Result<Workload, WorkloadError> {
    let background = crate::agent::dialect::background_agents(&crate::strategy::Strategy::default().client_version);
    workload_with(session, file, window, &BTreeMap::new(), false, background, true)
}

/// [`workload_from_session`] with the texts standing for unstored thinking given per thinking
/// signature (`thinking_texts`, from the replay's estimate: [`super::sizing::unstored_thinking`],
/// which also fills a 2.1.200+ reply's stored thinking to its billed output; an unstored block
/// whose signature is not there is filled at four characters per output token), and with
/// each reply's recorded usage scripted when `recorded_usage` ([`sized_workload`]).
/// `background`: the agent runs subagents in the background, so the recorded task notifications
/// of the subagents it drives are its own ([`subagents`]). `script`: the workload's document
/// keeps its script ([`Workload::document`]); else only its other keys (debug builds keep it
/// all, to check the scenario against it).
fn workload_with(
    session: &ImportedSession,
    file: &str,
    window: Option<u64>,
    thinking_texts: &BTreeMap<String, String>,
    recorded_usage: bool,
    background: bool,
    script: bool,
) -> Result<Workload, WorkloadError> {
    let built = || workload_steps(session, file, window, thinking_texts, recorded_usage, background);
    let Built { head, steps, main_calls, subagent_calls, report } = built()?;
    let summary_steps = steps.iter().filter(|s| s.lane.as_deref() == Some(LANE_COMPACT)).map(step_document).collect();
    // Debug builds keep the script to check the scenario against it.
    let mut document = head.clone();
    if script || cfg!(debug_assertions) {
        document.insert("script".into(), Value::Array(steps.iter().map(step_document).collect()));
    }
    let document = Value::Object(document);
    let scenario = match scenario_of_steps(head, steps, file) {
        Some(scenario) => scenario,
        // What the direct reading refuses: the document's own reading says why.
        None => {
            let Built { mut head, steps, .. } = built()?;
            head.insert("script".into(), Value::Array(steps.iter().map(step_document).collect()));
            crate::scenario::parse_scenario_document(&Value::Object(head), file)?
        }
    };
    if cfg!(debug_assertions) {
        let read = crate::scenario::parse_scenario_document(&document, file)?;
        assert!(read == scenario, "the scenario of {file} made of its steps differs from the one its document gives");
    }
    Ok(Workload { scenario, document, summary_steps, main_calls, subagent_calls, report, record_events: None })
}

/// The scenario of a workload's steps under its document's `head` (every key but `script`), as
/// [`crate::scenario::parse_scenario_document`] reads the document they make
/// ([`step_document`]) where it reads it directly: the steps are the values that reading
/// deserializes from their documents. `None` where it would not read it directly (a tool
/// use's input nested too deep), or the check refuses it.
fn scenario_of_steps(head: Map<String, Value>, steps: Vec<RawStep>, file: &str) -> Option<Scenario> {
    // A tool use's input is nested in the document, its script, the step, its blocks, the
    // block and the tool use: six levels.
    let deepest_input = steps.iter().flat_map(|s| s.assistant.iter().flatten()).filter_map(|b| match b {
        BlockSpec::ToolUse(tool_use) => Some(crate::scenario::json_depth(&tool_use.input)),
        _ => None,
    });
    if deepest_input.max().is_some_and(|depth| 6 + depth >= crate::scenario::MAX_YAML_DEPTH) {
        return None;
    }
    crate::scenario::scenario_of_parts(&Value::Object(head), steps, file)
}

/// A workload's steps and what the workload keeps beside its scenario.
struct Built {
    /// The document's keys but `script`: name, description, world.
    head: Map<String, Value>,
    steps: Vec<RawStep>,
    main_calls: Vec<usize>,
    subagent_calls: Vec<SubagentCall>,
    report: WorkloadReport,
}

/// The steps of [`workload_with`], as the script's raw steps (what a document's script
/// deserializes to), and its document's other keys.
fn workload_steps(session: &ImportedSession, file: &str, window: Option<u64>, thinking_texts: &BTreeMap<String, String>, recorded_usage: bool, background: bool) -> Result<Built, WorkloadError> {
    let recording = &session.recording;
    let mut report = WorkloadReport::default();
    // Room for the steps the events make (0.7–1.4 a recorded event in the shipped sessions): a
    // step is large, and a script grown by doubling copied every step made before.
    let mut script: Vec<RawStep> = Vec::with_capacity(recording.events.len() + recording.events.len() / 2);
    let mut main_calls = Vec::new();
    let mut compact_replies: Vec<RawStep> = Vec::new();
    // Tool results wait until the reply that called them is in the script.
    let mut pending_outputs: indexmap::IndexMap<String, ToolOutputSpec> = indexmap::IndexMap::new();
    // Tool uses driven so far, by id: name and input.
    let mut called: BTreeMap<&str, (&str, &Value)> = BTreeMap::new();
    // The files the record shows (structured results), as the replay's working set follows them.
    let mut files = super::working_set::WorkingSet::default();
    // Tool uses of the last main reply without a recorded result yet: a compaction that fired
    // between a reply and its results replaced them unwritten, though the client counted them.
    let mut open_uses: Vec<(String, String)> = Vec::new();
    let result_tokens_by_tool = super::triggers::mean_result_tokens(session);
    // The client's count since the last main reply: that reply's usage (prompt and output as
    // scripted) and what the client held after it, every main-lane event counted as
    // `triggers::main_points` counts it (`triggers::added_tokens`), driven or left to the agent.
    let mut count_base = 0u64;
    let mut count_tail = 0u64;
    // Tool uses of a reply the transcript never wrote, named by an `unwritten_reply` event just
    // before the compaction that followed it.
    let mut unwritten_reply: Option<Vec<String>> = None;
    // Until the first compaction, a continuing file's opening prompt stands for its history.
    let mut history_in_context = recording.header.head_truncated;
    // Where a new client process resumed the session, until the first main reply after it; and
    // the tool uses driven since the last compaction (what a resume can lose).
    let mut resumed_at: Option<usize> = None;
    let mut uses_in_context: BTreeSet<String> = BTreeSet::new();
    let mut model: Option<String> = None;
    let mut last_time = 0u64;
    // When the main thread's next request went out: the time of the last prompt or tool result
    // recorded since the last reply (the replay's `request_start`).
    let mut request_start: Option<u64> = None;
    let leave = |report: &mut WorkloadReport, kind: &str| *report.left_to_agent.entry(kind.to_owned()).or_default() += 1;
    let call_index: BTreeMap<usize, usize> = session.calls.iter().map(|c| (c.event_index, c.index)).collect();
    let mut subagents = subagents::Subagents::bind(session);
    // The skill or slash command whose body the next meta prompt is (the command just typed, the
    // Skill call just answered), while the recorded client remembers such bodies as invoked.
    let remembers_commands = super::profile::parse_version(&super::sizing::main_version(session)) >= super::profile::INVOKED_COMMANDS_RESTORED;
    let mut invoked: Option<String> = None;

    let flush = |script: &mut Vec<RawStep>, pending: &mut indexmap::IndexMap<String, ToolOutputSpec>| {
        if !pending.is_empty() {
            script.push(RawStep { tool_output: Some(std::mem::take(pending)), ..RawStep::default() });
        }
    };
    let user = |text: String| RawStep { user: Some(text), ..RawStep::default() };
    let attachment = |kind: &str, text: String| RawStep { attachment: Some(AttachmentSpec { kind: kind.to_owned(), text, skill: None }), ..RawStep::default() };

    for (event_index, event) in recording.events.iter().enumerate() {
        let main = event.lane == LANE_MAIN;
        if main && super::sizing::marks_resume(&event.kind) {
            resumed_at = Some(event_index);
        }
        if main {
            // (What a reply adds is counted from its usage below; every other event's count is
            // its rough count, memoized on the session: `mean_result_tokens` took the results'.)
            let added = match &event.kind {
                EventKind::ModelReply(_) => 0,
                kind => session.reference_memo().rough(event_index, || super::triggers::event_rough_tokens(kind)),
            };
            debug_assert_eq!(added, super::triggers::added_tokens(&event.kind), "an event's memoized rough count");
            count_tail += added;
        }
        match &event.kind {
            // Every event carries its time; the wait before a step is the gap since the last
            // step driven (`push_wait`).
            EventKind::Time(_) => {}
            EventKind::UserPrompt(prompt) if main => {
                request_start = Some(event.time_ms);
                if prompt.is_compact_summary {
                    // A file that opens with the summary of a compaction before it (a continuing
                    // file, 0254): the summary is in every request until the next compaction, as
                    // the record's messages show; driven as the opening prompt (the history
                    // stand-in goes before it). Elsewhere the agent's own compaction writes it.
                    let text = prompt_text(&prompt.content);
                    if !text.is_empty() && script.iter().all(|s| s.assistant.is_none() && s.user.is_none()) {
                        push_wait(&mut script, &mut last_time, event.time_ms);
                        script.push(user(text));
                        report.opening_summary = true;
                        continue;
                    }
                    leave(&mut report, "compact_summary_message");
                    continue;
                }
                if prompt.is_meta {
                    // What a slash command or a Skill call expanded into (a skill's body, a
                    // command's prompt) is part of the conversation the client sent: driven as
                    // recorded, after the prompt or tool result it expands. The caveat before a
                    // local command's output is the client's own and left to the agent.
                    let text = prompt_text(&prompt.content);
                    if text.is_empty() || is_local_command_caveat(&text) {
                        leave(&mut report, "meta_prompt");
                        continue;
                    }
                    flush(&mut script, &mut pending_outputs);
                    let mut step = attachment(META_PROMPT, text);
                    if let Some(name) = invoked.take().filter(|_| remembers_commands)
                        && let Some(attachment) = &mut step.attachment
                    {
                        attachment.skill = Some(name);
                        report.invoked_commands += 1;
                    }
                    script.push(step);
                    report.meta_prompts += 1;
                    continue;
                }
                let text = prompt_text(&prompt.content);
                if text.is_empty() {
                    leave(&mut report, "prompt_without_text");
                    continue;
                }
                if background && subagents.notifies(&text) {
                    // A driven background agent's `<task-notification>`: the agent running it in
                    // the background adds its own at the end of the turn.
                    leave(&mut report, "task_notification_of_driven_subagent");
                    continue;
                }
                invoked = command_name(&text);
                flush(&mut script, &mut pending_outputs);
                push_wait(&mut script, &mut last_time, event.time_ms);
                script.push(user(text));
                report.user_prompts += 1;
            }
            EventKind::ModelReply(reply) if main => {
                if reply.is_synthetic || reply.is_api_error {
                    leave(&mut report, if reply.is_synthetic { "synthetic_reply" } else { "api_error_reply" });
                    continue;
                }
                if reply.content.is_empty() {
                    leave(&mut report, "empty_reply");
                    continue;
                }
                if script.iter().all(|s| s.user.is_none()) {
                    // A session that opens mid-turn (a resumed or compacted file): the agent needs a
                    // turn to answer in.
                    script.push(user("(the recorded session opens here)".to_owned()));
                    leave(&mut report, "opening_prompt_added");
                }
                invoked = None;
                flush(&mut script, &mut pending_outputs);
                // The request went out when the record that prompted it was written; the reply's
                // first block (its recorded time) came that much later, so the request is measured
                // then, its cache entry living from the first token on (as in the replay).
                let sent = request_start.take().filter(|&t| t <= event.time_ms && t >= last_time).unwrap_or(event.time_ms);
                push_wait(&mut script, &mut last_time, sent);
                // A record timed before the one before it (a clock that went back) gives no
                // latency and does not move the run's time back.
                let first_token = event.time_ms.saturating_sub(last_time);
                last_time = last_time.max(event.time_ms);
                let switched = !reply.model.is_empty() && model.as_deref().is_some_and(|m| m != reply.model);
                if switched {
                    script.push(RawStep { model_switch: Some(reply.model.clone()), ..RawStep::default() });
                }
                if model.is_none() && !reply.model.is_empty() {
                    model = Some(reply.model.clone());
                }
                // The first call after a resume: what its loaded history lacks of the tool uses
                // driven since the last compaction leaves the agent's conversation too.
                if let Some(at) = resumed_at.take()
                    && let Some(call) = session.calls.iter().find(|c| c.event_index == event_index)
                {
                    let loaded: BTreeSet<String> = session
                        .messages_for_call_loaded(call, at)
                        .iter()
                        .flat_map(|m| m.content.to_blocks())
                        .filter_map(|b| match b {
                            ContentBlock::ToolUse { id, .. } => Some(id.clone()),
                            _ => None,
                        })
                        .collect();
                    let lost: Vec<&String> = uses_in_context.difference(&loaded).collect();
                    if !lost.is_empty() {
                        let tool_use_ids = lost.into_iter().cloned().collect();
                        script.push(RawStep { resume_lost: Some(ResumeLostSpec { tool_use_ids }), ..RawStep::default() });
                        report.resume_losses += 1;
                    }
                    // What is lost is gone: a later resume loses only what it lacks anew.
                    uses_in_context.retain(|id| loaded.contains(id));
                }
                let rough_tokens = session.reference_memo().rough(event_index, || super::triggers::event_rough_tokens(&event.kind));
                let Some(mut step) = reply_step(reply, rough_tokens, thinking_texts, recorded_usage, &mut report, &mut called) else {
                    leave(&mut report, "empty_reply");
                    continue;
                };
                if first_token > 0 {
                    step.latency = Some(LatencySpec { first_token: Some(DurationMs(first_token)), total: DurationMs(first_token) });
                }
                uses_in_context.extend(reply.content.iter().filter_map(|b| match b {
                    ContentBlock::ToolUse { id, .. } => Some(id.clone()),
                    _ => None,
                }));
                // The tool uses of this reply wait for their recorded results.
                open_uses = reply
                    .content
                    .iter()
                    .filter_map(|b| match b {
                        ContentBlock::ToolUse { id, name, .. } => Some((id.clone(), name.clone())),
                        _ => None,
                    })
                    .collect();
                let output = step.usage.as_ref().and_then(|u| u.output_tokens).or(step.output_tokens);
                count_base = reply.usage.prompt_tokens() + output.unwrap_or(0);
                count_tail = 0;
                script.push(step);
                main_calls.push(call_index.get(&event_index).copied().unwrap_or(event_index));
                report.main_replies += 1;
            }
            EventKind::ToolResult(result) if main => {
                request_start = Some(event.time_ms);
                let Some(&(name, input)) = called.get(result.tool_use_id.as_str()) else {
                    leave(&mut report, "tool_result_without_call");
                    continue;
                };
                if name == "Skill" {
                    invoked = input.get("skill").and_then(Value::as_str).map(|s| s.trim_start_matches('/').to_owned());
                }
                let mut output = result_output(result);
                // The file the call read or wrote, as the record shows it: the agent's executor
                // leaves it in its fs and counts it read, so its own compaction restores it. An
                // edit's file is the record view's, memoized on the session by event.
                let memo = session.reference_memo();
                files.observe_memoized(name, input, result.tool_use_result.as_deref(), result.is_error, &mut |edited| memo.edited(event_index, edited));
                if matches!(name, "Read" | "Edit" | "MultiEdit" | "Write")
                    && let Some(path) = input.get("file_path").and_then(Value::as_str)
                    && let Some(content) = files.content_of(path)
                {
                    output.file = Some(ToolFile { path: path.to_owned(), content });
                    report.files_shown += 1;
                }
                if subagents.drives_call(&result.tool_use_id) {
                    // The agent runs the recorded subagent; the call returns the recorded result.
                    output.subagent = true;
                }
                pending_outputs.insert(result.tool_use_id.clone(), output);
                open_uses.retain(|(id, _)| *id != result.tool_use_id);
                report.tool_outputs += 1;
            }
            EventKind::Compaction(compaction) if main => {
                history_in_context = false;
                uses_in_context.clear();
                // The results the compaction replaced before they were written: the client
                // counted them, so the agent gets a stand-in of the session's mean result of
                // that tool (the size `triggers::main_points` counts for them).
                for (id, name) in std::mem::take(&mut open_uses) {
                    let tokens = result_tokens_by_tool.get(&name).copied().unwrap_or(0);
                    let text = crate::agent::compact::generator::filler("tool result the compaction replaced unwritten", (tokens * 4) as usize);
                    pending_outputs.insert(id, ToolOutputSpec { content: text, is_error: false, images: Vec::new(), subagent: false, file: None });
                    count_tail += tokens;
                    report.unwritten_results += 1;
                }
                if let (Some(tools), Some(pre)) = (unwritten_reply.take(), compaction.pre_tokens.filter(|_| compaction.trigger == "auto")) {
                    // The client made one more call and ran its tools before compacting; the
                    // transcript holds neither. The boundary's preTokens is the only record of
                    // their size: what it leaves above the count of what was written stands in
                    // for the reply and its results, so the agent counts what the client did.
                    let unwritten = pre.saturating_sub(count_base + count_tail);
                    if unwritten > 0 {
                        flush(&mut script, &mut pending_outputs);
                        let label = format!("the call the transcript did not write ({}) and its results", tools.join(", "));
                        let text = crate::agent::compact::generator::filler(&label, (unwritten * 4) as usize);
                        script.push(attachment(UNWRITTEN_REPLY, text));
                        count_tail += unwritten;
                        report.unwritten_replies += 1;
                    }
                }
                if compaction.trigger == "manual" {
                    // `/compact`: the user asked for it here; the agent compacts now.
                    flush(&mut script, &mut pending_outputs);
                    push_wait(&mut script, &mut last_time, event.time_ms);
                    script.push(RawStep { compact: Some(true), ..RawStep::default() });
                    report.manual_compactions += 1;
                } else {
                    leave(&mut report, &format!("compaction_{}", compaction.trigger));
                }
                // A compaction before anything the file drives (a file that opens with one,
                // 0254) was not the agent's: its summary is the opening prompt, not the reply
                // to the agent's first compaction.
                let before_the_file = compaction.trigger != "manual" && script.iter().all(|s| s.assistant.is_none() && s.user.is_none());
                if let Some(summary) = compaction.summary.as_ref().filter(|s| !s.is_empty() && !before_the_file) {
                    let text = BlockSpec::Text(format!("<summary>\n{summary}\n</summary>"));
                    compact_replies.push(RawStep { assistant: Some(vec![text]), lane: Some(LANE_COMPACT.to_owned()), ..RawStep::default() });
                    report.compaction_summaries += 1;
                }
            }
            EventKind::SystemEvent(sys) if main && recorded_usage && sys.subtype == "microcompact_boundary" => {
                // As recorded, the client cleared these results here (another strategy's own
                // microcompact decides for itself). Those of this file are cleared by id;
                // those from before it (not called in the file) are in the history stand-in,
                // which loses their share of the saved tokens (as the replay counts it) as the
                // characters they were: the client's rough count is four characters a token.
                let meta = sys.payload.get("microcompactMetadata");
                let ids: Vec<&str> = meta.and_then(|m| m.get("compactedToolIds")).and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
                let saved = meta.and_then(|m| m.get("tokensSaved")).and_then(Value::as_u64).unwrap_or(0);
                let (shown, hidden): (Vec<&str>, Vec<&str>) = ids.iter().partition(|id| called.contains_key(**id));
                let history_tokens = if history_in_context && !ids.is_empty() { saved * hidden.len() as u64 / ids.len() as u64 } else { 0 };
                if shown.is_empty() && history_tokens == 0 {
                    leave(&mut report, "microcompact_clearing_nothing_driven");
                    continue;
                }
                flush(&mut script, &mut pending_outputs);
                let microcompact = MicrocompactSpec { tool_use_ids: shown.into_iter().map(str::to_owned).collect(), history_chars: (history_tokens * 4) as usize };
                script.push(RawStep { microcompact: Some(microcompact), ..RawStep::default() });
                report.recorded_microcompacts += 1;
            }
            EventKind::SystemEvent(sys) if main && sys.subtype == UNWRITTEN_REPLY => {
                let tools = sys.payload.get("tool_uses").and_then(Value::as_array).map(|uses| {
                    uses.iter().filter_map(|u| u.get("name").and_then(Value::as_str).map(str::to_owned)).collect()
                });
                unwritten_reply = Some(tools.unwrap_or_default());
            }
            EventKind::ModelReply(_) if event.lane == LANE_COMPACT => leave(&mut report, "compact_lane_reply"),
            EventKind::SystemEvent(sys) if main && sys.subtype == "local_command" => {
                let content = sys.payload.get("content").and_then(Value::as_str).unwrap_or_default();
                if content.contains("<command-name>/clear</command-name>") {
                    flush(&mut script, &mut pending_outputs);
                    script.push(RawStep { clear: Some(true), ..RawStep::default() });
                } else {
                    leave(&mut report, "local_command");
                }
            }
            EventKind::Attachment(attachment) if main && recorded_usage && !ATTACHMENTS_NOT_SENT.contains(&attachment.attachment_type.as_str()) => {
                // As recorded, the agent sends the attachment the client sent, here, as the
                // replay renders it (`attachment_text`: the recorded text where the record holds
                // it), and none of its own (`world.recorded_attachments`).
                flush(&mut script, &mut pending_outputs);
                let text = attachment_text(attachment);
                script.push(RawStep {
                    attachment: Some(AttachmentSpec { kind: attachment.attachment_type.clone(), text, skill: None }),
                    ..RawStep::default()
                });
                report.recorded_attachments += 1;
            }
            EventKind::Attachment(_) => leave(&mut report, "attachment"),
            // A driven subagent's events are scripted on its lane below.
            _ if subagents.drives_lane(&event.lane) => {}
            _ if !main => leave(&mut report, "subagent_or_side_event"),
            _ => leave(&mut report, event.name()),
        }
    }
    flush(&mut script, &mut pending_outputs);
    if main_calls.is_empty() {
        return Err(WorkloadError::Empty { file: file.to_owned() });
    }
    script.extend(compact_replies);
    let (subagent_steps, subagent_calls) = subagents.script(session, thinking_texts, recorded_usage, &mut report);
    script.extend(subagent_steps);
    report.subagents = subagents.runs;
    report.unbound_subagent_lanes = subagents.unbound;

    let mut world = Map::new();
    world.insert("model".into(), Value::String(model.unwrap_or_default()));
    // Compactions past the recorded ones get a stand-in of the fitted summary length; the
    // agent's side calls (session memory, hooks) get synthesized replies.
    world.insert(
        "fallback".into(),
        json!({ "summary_tokens": (super::agent_whatif::SUMMARY_CHARS / 4) as u64, "after_script_ends": true }),
    );
    if let Some(window) = window {
        world.insert("context_window".into(), json!(window));
    }
    if report.recorded_attachments > 0 {
        world.insert("recorded_attachments".into(), Value::Bool(true));
        // The record carries the client's own `invoked_skills` re-attachments, driven as
        // recorded: the agent remembers no invocation to restore again.
        for attachment in script.iter_mut().filter_map(|s| s.attachment.as_mut()) {
            attachment.skill = None;
        }
        report.invoked_commands = 0;
    }
    // Main-lane thinking recorded without its text: the client redacted thinking, and sent no
    // `clear_thinking` edit (after a >1h idle the recorded context keeps the earlier thinking).
    let redacted = recording.events.iter().any(|e| e.lane == LANE_MAIN && matches!(&e.kind, EventKind::ModelReply(r) if !r.thinking_text_stored));
    if redacted {
        world.insert("redact_thinking".into(), Value::Bool(true));
    }
    // The recorded cwd whatever the client's platform: a Windows or MSYS client's (`D:\omp`,
    // `/cygdrive/d/omp`) as MSYS spells it (`/d/omp`), so that the project's skills and memory
    // are the project's, as the recorded client resolved them (`recorded_invoked_path` compares
    // a skill's directory with it). One that names no absolute path leaves the default.
    if let Some(cwd) = recording.header.cwd.as_deref().map(recorded_cwd).filter(|c| c.starts_with('/')) {
        world.insert("cwd".into(), Value::String(cwd));
    }
    if let Some(start) = recording.header.start_epoch_ms.and_then(rfc3339) {
        world.insert("clock_start".into(), Value::String(start));
    }
    let name = recording.header.session_id.clone().unwrap_or_else(|| file.to_owned());
    // (Built by moves: `json!` copies a value it is given by serializing it.)
    let mut document = Map::new();
    document.insert("name".into(), Value::String(name));
    document.insert("description".into(), Value::String(format!("The recorded session {file} as a workload for the agent (ctxsim import --to scenario).")));
    document.insert("world".into(), Value::Object(world));
    Ok(Built { head: document, steps: script, main_calls, subagent_calls, report })
}

/// A workload's step as its document writes it (`import --to scenario`): the keys the workload
/// sets, in the order it sets them, each value as serde deserializes the step's field from it
/// (the workload's scenario is checked against its document's in debug builds, and every shared
/// session's document is read back in `tests/it/workload.rs`). Keys a workload never sets
/// (`write_file`, `git`, MCP and plugin steps) are not written.
fn step_document(step: &RawStep) -> Value {
    debug_assert!(
        step.write_file.is_none()
            && step.remove_file.is_none()
            && step.mcp_connect.is_none()
            && step.mcp_disconnect.is_none()
            && step.mcp_list_changed.is_none()
            && step.plugin_enable.is_none()
            && step.plugin_reload.is_none()
            && step.git.is_none()
            && step.resume.is_none(),
        "a workload sets no such step"
    );
    let ids = |ids: &[String]| Value::Array(ids.iter().cloned().map(Value::String).collect());
    let mut out = Map::new();
    if let Some(text) = &step.user {
        out.insert("user".into(), Value::String(text.clone()));
    }
    if let Some(blocks) = &step.assistant {
        out.insert("assistant".into(), Value::Array(blocks.iter().map(block_document).collect()));
    }
    if let Some(outputs) = &step.tool_output {
        out.insert("tool_output".into(), Value::Object(outputs.iter().map(|(id, output)| (id.clone(), output_document(output))).collect()));
    }
    if let Some(wait) = step.wait {
        out.insert("wait".into(), Value::from(wait.0));
    }
    if let Some(model) = &step.model_switch {
        out.insert("model_switch".into(), Value::String(model.clone()));
    }
    if let Some(clear) = step.clear {
        out.insert("clear".into(), Value::Bool(clear));
    }
    if let Some(compact) = step.compact {
        out.insert("compact".into(), Value::Bool(compact));
    }
    if let Some(attachment) = &step.attachment {
        let mut spec = Map::new();
        spec.insert("type".into(), Value::String(attachment.kind.clone()));
        spec.insert("text".into(), Value::String(attachment.text.clone()));
        if let Some(skill) = &attachment.skill {
            spec.insert("skill".into(), Value::String(skill.clone()));
        }
        out.insert("attachment".into(), Value::Object(spec));
    }
    if let Some(microcompact) = &step.microcompact {
        let spec = Map::from_iter([("tool_use_ids".to_owned(), ids(&microcompact.tool_use_ids)), ("history_chars".to_owned(), Value::from(microcompact.history_chars))]);
        out.insert("microcompact".into(), Value::Object(spec));
    }
    if let Some(lost) = &step.resume_lost {
        out.insert("resume_lost".into(), Value::Object(Map::from_iter([("tool_use_ids".to_owned(), ids(&lost.tool_use_ids))])));
    }
    if let Some(reason) = step.stop_reason {
        out.insert("stop_reason".into(), stop_reason_name(reason));
    }
    if let Some(usage) = &step.usage {
        let fields = [
            ("input_tokens", usage.input_tokens),
            ("cache_creation_input_tokens", usage.cache_creation_input_tokens),
            ("cache_read_input_tokens", usage.cache_read_input_tokens),
            ("output_tokens", usage.output_tokens),
        ];
        out.insert("usage".into(), Value::Object(fields.into_iter().filter_map(|(key, n)| Some((key.to_owned(), Value::from(n?)))).collect()));
    }
    if let Some(tokens) = step.output_tokens {
        out.insert("output_tokens".into(), Value::from(tokens));
    }
    if let Some(latency) = &step.latency {
        let mut spec = Map::new();
        if let Some(first) = latency.first_token {
            spec.insert("first_token".into(), Value::from(first.0));
        }
        spec.insert("total".into(), Value::from(latency.total.0));
        out.insert("latency".into(), Value::Object(spec));
    }
    if let Some(lane) = &step.lane {
        out.insert("lane".into(), Value::String(lane.clone()));
    }
    Value::Object(out)
}

/// A reply's block as a workload's document writes it ([`step_document`]).
fn block_document(block: &BlockSpec) -> Value {
    let (key, value) = match block {
        BlockSpec::Text(text) => ("text", Value::String(text.clone())),
        BlockSpec::Thinking(text) => ("thinking", Value::String(text.clone())),
        BlockSpec::RedactedThinking(data) => ("redacted_thinking", Value::String(data.clone())),
        BlockSpec::ToolUse(tool_use) => {
            let mut spec = Map::new();
            if let Some(id) = &tool_use.id {
                spec.insert("id".into(), Value::String(id.clone()));
            }
            spec.insert("name".into(), Value::String(tool_use.name.clone()));
            spec.insert("input".into(), tool_use.input.clone());
            ("tool_use", Value::Object(spec))
        }
    };
    Value::Object(Map::from_iter([(key.to_owned(), value)]))
}

/// A tool output as a workload's document writes it ([`step_document`]): its text, and
/// `is_error`, its images, the file it shows and `subagent` where it has them.
fn output_document(output: &ToolOutputSpec) -> Value {
    let mut spec = Map::new();
    spec.insert("content".into(), Value::String(output.content.clone()));
    if output.is_error {
        spec.insert("is_error".into(), Value::Bool(true));
    }
    if !output.images.is_empty() {
        let image = |image: &ImageSpec| {
            debug_assert_eq!(image.media_type, "image/png", "a workload names no media type");
            let mut spec = Map::new();
            spec.insert("base64_bytes".into(), Value::from(image.base64_bytes));
            if let Some(width) = image.width {
                spec.insert("width".into(), Value::from(width));
            }
            if let Some(height) = image.height {
                spec.insert("height".into(), Value::from(height));
            }
            Value::Object(spec)
        };
        spec.insert("images".into(), Value::Array(output.images.iter().map(image).collect()));
    }
    if let Some(file) = &output.file {
        let file = Map::from_iter([("path".to_owned(), Value::String(file.path.clone())), ("content".to_owned(), Value::String(file.content.to_string()))]);
        spec.insert("file".into(), Value::Object(file));
    }
    if output.subagent {
        spec.insert("subagent".into(), Value::Bool(true));
    }
    Value::Object(spec)
}

/// A recorded `cwd` as the workload's `world.cwd`: [`crate::agent::skills::msys_path`]'s
/// spelling (a POSIX path as recorded, the root included).
fn recorded_cwd(cwd: &str) -> String {
    let path = crate::agent::skills::msys_path(cwd);
    if path.is_empty() && cwd.trim().starts_with(['/', '\\']) { "/".to_owned() } else { path }
}

/// The script step of one recorded reply, on any lane: its text, its thinking (the stored text;
/// else `thinking_texts`' text for its signature, else a filler of the size the reply's output
/// tokens leave), its tool calls with their recorded ids (noted in `called`: name and input, as
/// recorded), its stop reason, and its recorded usage when `recorded_usage` (else its output
/// tokens). `None` when the reply has no block to script. `rough_tokens`: the rough count of the
/// reply's blocks as recorded ([`super::triggers::event_rough_tokens`], which the session
/// memoizes per event).
fn reply_step<'a>(
    reply: &'a crate::recording::format::ModelReply,
    rough_tokens: u64,
    thinking_texts: &BTreeMap<String, String>,
    recorded_usage: bool,
    report: &mut WorkloadReport,
    called: &mut BTreeMap<&'a str, (&'a str, &'a Value)>,
) -> Option<RawStep> {
    debug_assert_eq!(rough_tokens, reply.content.iter().map(crate::agent::compact::counting::rough_block).sum::<u64>(), "a reply's rough count");
    // Output tokens not spent on the visible part, at four characters a token, shared by the
    // thinking blocks without text (read only for a filler).
    let thinking_chars = || {
        let visible_chars: usize = reply
            .content
            .iter()
            .map(|b| match b {
                ContentBlock::Text { text, .. } => text.len(),
                ContentBlock::ToolUse { input, .. } => crate::measure::tokens::json_len(input),
                _ => 0,
            })
            .sum();
        let thinking_blocks = reply.content.iter().filter(|b| matches!(b, ContentBlock::Thinking { thinking, .. } if thinking.is_empty())).count();
        (reply.usage.output_tokens as usize * 4).saturating_sub(visible_chars) / thinking_blocks.max(1)
    };
    let mut blocks = Vec::new();
    // The reply's rough size as the client held it: unstored thinking at its fill (a block
    // without text counts nothing in `rough_tokens`).
    let mut held_tokens = rough_tokens;
    for block in &reply.content {
        match block {
            ContentBlock::Text { text, .. } => blocks.push(BlockSpec::Text(text.to_string())),
            ContentBlock::Thinking { thinking, signature, .. } => {
                if thinking.is_empty() {
                    report.thinking_filled += 1;
                    let text = thinking_texts.get(signature).cloned().unwrap_or_else(|| thinking_filler(thinking_chars().max(1)));
                    held_tokens += crate::agent::compact::counting::rough(&text);
                    blocks.push(BlockSpec::Thinking(text));
                } else if let Some(text) = thinking_texts.get(signature) {
                    // A stored summary of thinking the client re-sends as its billed output
                    // (2.1.200+): sent at the replay's fill, held as stored.
                    blocks.push(BlockSpec::Thinking(text.clone()));
                } else {
                    blocks.push(BlockSpec::Thinking(thinking.clone()));
                }
            }
            ContentBlock::RedactedThinking { data, .. } => blocks.push(BlockSpec::RedactedThinking(data.clone())),
            ContentBlock::ToolUse { id, name, input, .. } => {
                called.insert(id, (name, input));
                blocks.push(BlockSpec::ToolUse(ToolUseSpec { id: Some(id.clone()), name: name.clone(), input: input.clone() }));
            }
            _ => *report.left_to_agent.entry("other_reply_block".to_owned()).or_default() += 1,
        }
    }
    if blocks.is_empty() {
        return None;
    }
    let mut step = RawStep { assistant: Some(blocks), stop_reason: reply.stop_reason, ..RawStep::default() };
    let usage = &reply.usage;
    if recorded_usage && usage.prompt_tokens() > 0 {
        // What the API returned to the recorded client: the agent counts its context
        // from it, as the client did (`tokenCountWithEstimation`). Older clients wrote
        // a placeholder `output_tokens` on a reply's lines; the client counted the
        // final one, at least the reply's own size as it held it (its thinking too,
        // whose text the transcript did not keep: at its fill). Fidelity prices the
        // recorded output, not this one.
        let output = usage.output_tokens.max(held_tokens);
        step.usage = Some(UsageSpec {
            input_tokens: Some(usage.input_tokens),
            output_tokens: Some(output),
            cache_read_input_tokens: Some(usage.cache_read_input_tokens),
            cache_creation_input_tokens: Some(usage.cache_creation_input_tokens),
        });
        report.recorded_usage += 1;
    } else {
        step.output_tokens = Some(usage.output_tokens);
    }
    Some(step)
}

/// A `wait` step for the time between the last step driven and `time_ms`, when any passed.
fn push_wait(script: &mut Vec<RawStep>, last: &mut u64, time_ms: u64) {
    if time_ms > *last {
        script.push(RawStep { wait: Some(DurationMs(time_ms - *last)), ..RawStep::default() });
        *last = time_ms;
    }
}

/// Milliseconds since the epoch as RFC 3339 (UTC).
fn rfc3339(epoch_ms: i64) -> Option<String> {
    jiff::Timestamp::from_millisecond(epoch_ms).ok().map(|t| t.to_string())
}

/// One compaction the agent made while driven by a workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentCompaction {
    /// The recorded main call whose request came after it.
    pub before_call: usize,
    /// The stage that compacted (`autocompact`, `session_memory_compact`, ...) and why.
    pub stage: String,
    pub reason: String,
    /// The context the stage saw, by the agent's own count.
    pub tokens_before: u64,
    pub tokens_after: u64,
}

/// A recorded session driven through the agent, as a replay (one row per recorded main call the
/// agent answered), so the fidelity report scores it like any replay.
#[derive(Debug, Clone)]
pub struct AgentReplay {
    pub replay: super::SessionReplay,
    pub report: WorkloadReport,
    pub compactions: Vec<AgentCompaction>,
    /// Main requests of the run not paired with a recorded call (or the reverse): the agent made
    /// a different number of main calls than the recording (a blocked turn, a retry).
    pub unpaired: usize,
    pub sizing: Sizing,
    /// The record's events before each recorded call ([`Workload::record_events`]), read by the
    /// sizing: what names the causes of breaks without reading the record again.
    pub record_events: Option<RecordEvents>,
}

/// What the recorded client's first request held that the agent does not model, and where the
/// workload put it. The recording does not hold the client's system prompt, tools, CLAUDE.md or
/// the history before a file that continues a session; the replay infers their size from the
/// first call's billed prompt ([`super::sizing::first_call_sizes`]), split at the prefix level
/// the record shows (a warm first call's read, else the first level a later read reveals), and
/// for a file that continues a session, what a compaction keeps of it from the record after the
/// file's first compaction. The agent builds its own and the difference is added as sized
/// filler: to the system prompt (`--append-system-prompt`), to CLAUDE.md, and, for a file that
/// continues a session, as the opening history.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sizing {
    /// Tools + system of the recorded client (the replay's prefix level) and of the agent.
    pub recorded_prefix_tokens: u64,
    pub agent_prefix_tokens: u64,
    /// The first call's part before the recorded messages, beyond the prefix (user context, and
    /// the history of a file that continues a session), and the agent's own opening message.
    pub recorded_context_tokens: u64,
    pub agent_context_tokens: u64,
    /// Filler added: to the system prompt, to CLAUDE.md, as opening history.
    pub system_filler_tokens: u64,
    /// The part of `system_filler_tokens` before the boundary, under the global-scope marker
    /// (`world.static_system_prompt`); the rest follows the agent's dynamic sections
    /// (`world.append_system_prompt`), whose block carries a marker of its own.
    #[serde(default)]
    pub static_filler_tokens: u64,
    /// The lower of two levels the record shows in the prefix (the first call's read and the
    /// first level a later read falls to): the part cached with the global scope, which the
    /// static filler fills the agent's global-scope part up to (0: one level or none shown).
    #[serde(default)]
    pub recorded_global_tokens: u64,
    pub claude_md_filler_tokens: u64,
    pub history_filler_tokens: u64,
    /// The files the opening prompt @-mentions, attached to its turn, and their filler: what
    /// the gap holds beyond what the record shows outliving the file's first compaction, or
    /// without one, beyond the version's fitted user context (`Calibration::user_context_by_version`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mentioned_files: Vec<String>,
    #[serde(default)]
    pub mention_filler_tokens: u64,
    /// The agent's prefix (tools + system) written to the cache before its first request, when
    /// the recorded first call read a prefix an earlier session had cached (0: a cold start).
    #[serde(default)]
    pub seeded_prefix_tokens: u64,
    /// Per built-in agent type of a driven subagent, the filler its prompt ends with
    /// (`world.agent_prompt_extra`): the recorded first request of the type's first subagent less
    /// the agent's own, probed ([`size_subagent_prompts`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub subagent_prompt_filler_tokens: BTreeMap<String, u64>,
    /// What the recorded client restored at a compaction beyond what the file shows, for a
    /// client that `/clear`ed into the file: the record after the file's first compaction beyond
    /// its prefix, the first call's memory and context, the files the client's rule restores and
    /// the command bodies the agent restores (`world.restored_unrecorded`, restored by every
    /// compaction of the agent's). 0: none shown, or not a `/clear`ed file.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restored_unrecorded_tokens: u64,
    /// Where a fitted value of the recorded version (user context, thinking fill, prefix level)
    /// was taken from another version's fit: what, and from which
    /// ([`super::profile::fitted_with_note`]); `fidelity` prints them as notes.
    #[serde(skip)]
    pub profile_notes: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The workload of `session` with the window the client ran with, the filler of [`Sizing`], and
/// unstored thinking filled to the replay's estimate. `recorded_usage`: each reply carries the
/// usage the API returned to the recorded client, so that the agent counts its context (and
/// decides its automatic compactions) from what the client counted; right only while the agent
/// sends what the client sent (as recorded), so a scenario for other strategies leaves it out.
pub fn sized_workload(
    session: &ImportedSession,
    file: &str,
    measurer: &crate::measure::Measurer,
    strategy: &crate::strategy::Strategy,
    recorded_usage: bool,
) -> Result<(Workload, Sizing), String> {
    sized_workload_with(session, file, measurer, strategy, recorded_usage, &super::ReplayOptions::default())
}

/// [`sized_workload`] sized from the record view read under `options` (`fidelity`'s ablations).
pub fn sized_workload_with(
    session: &ImportedSession,
    file: &str,
    measurer: &crate::measure::Measurer,
    strategy: &crate::strategy::Strategy,
    recorded_usage: bool,
    options: &super::ReplayOptions,
) -> Result<(Workload, Sizing), String> {
    sized_workload_of(session, file, measurer, strategy, recorded_usage, options, true)
}

/// [`sized_workload_with`] as recorded (each reply with its recorded usage) for the agent's
/// runs, which read its scenario: the document keeps no script ([`Workload::document`]).
pub fn sized_workload_for_runs(session: &ImportedSession, file: &str, measurer: &crate::measure::Measurer, strategy: &crate::strategy::Strategy, options: &super::ReplayOptions) -> Result<(Workload, Sizing), String> {
    sized_workload_of(session, file, measurer, strategy, true, options, false)
}

/// [`sized_workload_with`], its document with its script where `script` ([`workload_with`]).
fn sized_workload_of(session: &ImportedSession, file: &str, measurer: &crate::measure::Measurer, strategy: &crate::strategy::Strategy, recorded_usage: bool, options: &super::ReplayOptions, script: bool) -> Result<(Workload, Sizing), String> {
    let model = session.calls.iter().find(|c| c.lane == LANE_MAIN && !c.is_synthetic).map(|c| c.model.clone()).unwrap_or_default();
    let info = measurer.table().lookup(&model).ok().cloned();
    let window = super::triggers::recorded_window(session, &model, info.as_ref());
    // Unstored thinking as the replay estimates it: the fitted share of the output, per version.
    let main_version = super::sizing::main_version(session);
    let thinking: BTreeMap<String, String> =
        super::sizing::unstored_thinking(session, measurer, &main_version, &mut Default::default()).into_iter().map(|(k, fill)| (k, fill.text())).collect();
    let background = crate::agent::dialect::background_agents(&strategy.client_version);
    let mut workload = workload_with(session, file, Some(window), &thinking, recorded_usage, background, script).map_err(|e| e.to_string())?;
    let sizing = size_unmodelled(session, file, &mut workload, measurer, strategy, options)?;
    Ok((workload, sizing))
}

/// What the record fixes that the agent cannot know, applied where a strategy leaves the
/// default: the main lane's TTL as the usage's 5m/1h split names it, and 1h outside the main lane
/// where subagents are driven and every recorded call outside the main lane wrote its cache at 1h
/// (the replay takes each call's from the record). One definition for the agent as recorded
/// ([`agent_replay`]) and for its what-ifs (`agent_whatif`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordedSettings {
    pub ttl_main: Option<crate::api::CacheTtl>,
    pub ttl_other_1h: bool,
}

impl RecordedSettings {
    pub fn of(session: &ImportedSession, workload: &Workload) -> RecordedSettings {
        let ttl_main = session.calls.iter().filter(|c| c.lane == LANE_MAIN).find_map(|c| super::sizing::ttl_of(&c.usage));
        let outside_main: Vec<&crate::recording::RecordedCall> =
            session.calls.iter().filter(|c| c.lane != LANE_MAIN && !c.is_synthetic && c.usage.cache_creation_input_tokens > 0).collect();
        let ttl_other_1h = !workload.subagent_calls.is_empty() && outside_main.iter().all(|c| c.usage.creation_split().ephemeral_1h_input_tokens > 0);
        RecordedSettings { ttl_main, ttl_other_1h }
    }

    /// Sets each recorded TTL where `strategy` leaves it to the client (`auto`); a strategy that
    /// names a TTL (a what-if, 5m included) keeps its own. Where nothing is recorded, `auto` is
    /// the API's default, 5m: afterwards every TTL of `strategy` is named.
    pub fn apply(&self, strategy: &mut crate::strategy::Strategy) {
        use crate::strategy::TtlSetting;
        if strategy.ttl_main == TtlSetting::Auto {
            strategy.ttl_main = self.ttl_main.unwrap_or(crate::api::CacheTtl::FiveMinutes).into();
        }
        if strategy.ttl_other == TtlSetting::Auto {
            strategy.ttl_other = if self.ttl_other_1h { TtlSetting::OneHour } else { TtlSetting::FiveMinutes };
        }
    }
}

/// The tool results a workload returns are the recorded ones, which already went through the
/// recorded client's per-tool persistence thresholds: where `strategy` keeps the default
/// thresholds (they stand for the client's own: [`rebudgets_recorded_results`]) the agent
/// persists none of them again.
/// Before, the agent cut 9878's 2.0.76 results at calls 3 and 59 to their previews (−10k and −7k
/// tokens the client sent whole, −8% to −25% on every call between). A strategy with other
/// thresholds applies them. One rule for the agent as recorded ([`agent_replay`]) and its
/// what-ifs (`agent_whatif`).
pub fn keep_recorded_results(strategy: &mut crate::strategy::Strategy) {
    if !rebudgets_recorded_results(&strategy.compact.tool_result_budget) {
        without_per_tool_thresholds(&mut strategy.compact.tool_result_budget);
    }
}

/// Whether `budget`'s per-tool thresholds are other than the defaults. The defaults stand for
/// the recorded client's own thresholds, which a recorded session's tool results already went
/// through; other thresholds apply to the recorded results (a higher one cannot restore what
/// the client persisted).
pub fn rebudgets_recorded_results(budget: &crate::agent::compact::config::ToolResultBudgetConfig) -> bool {
    per_tool_budget(budget) != per_tool_budget(&Default::default())
}

/// The per-tool part of a tool result budget (the aggregate settings left at their defaults).
fn per_tool_budget(config: &crate::agent::compact::config::ToolResultBudgetConfig) -> crate::agent::compact::config::ToolResultBudgetConfig {
    let defaults = crate::agent::compact::config::ToolResultBudgetConfig::default();
    crate::agent::compact::config::ToolResultBudgetConfig { aggregate_enabled: defaults.aggregate_enabled, aggregate_chars: defaults.aggregate_chars, ..config.clone() }
}

/// `budget` with no per-tool persistence threshold: no tool's result is persisted for its own
/// size (the aggregate budget stays as it is).
fn without_per_tool_thresholds(budget: &mut crate::agent::compact::config::ToolResultBudgetConfig) {
    budget.per_tool_chars.clear();
    budget.default_chars = u64::MAX;
}

/// Drives the agent through `session` under `strategy`, measuring with `measurer`. The
/// measurer drops earlier turns' thinking for the run, as the API does for models that drop it,
/// counts the cache's lookback by the API's rule when the session ran
/// ([`crate::measure::LookbackRule::for_session_start`]), and is given back with the settings
/// it came with (a caller may go on with the replay or a scenario on it).
pub fn agent_replay(
    session: &ImportedSession,
    file: &str,
    measurer: &mut crate::measure::Measurer,
    strategy: &crate::strategy::Strategy,
) -> Result<AgentReplay, String> {
    agent_replay_with(session, file, measurer, strategy, &super::ReplayOptions::default())
}

/// [`agent_replay`] with the ablations of `options` applied to the record the run reads: the
/// record view its sizes and events come from, and the recorded client's turn rules
/// (`rerender_prompts`, `side_entries`; `fidelity --no-rerender`, `--no-side-entry`,
/// `--no-recorded-requests`).
pub fn agent_replay_with(
    session: &ImportedSession,
    file: &str,
    measurer: &mut crate::measure::Measurer,
    strategy: &crate::strategy::Strategy,
    options: &super::ReplayOptions,
) -> Result<AgentReplay, String> {
    let (prior, lookback) = (measurer.prior_thinking_dropped(), measurer.lookback_rule());
    measurer.set_prior_thinking_dropped(true);
    measurer.set_lookback_rule(crate::measure::LookbackRule::for_session_start(session.recording.header.start_epoch_ms));
    let result = agent_replay_dropping_thinking(session, file, measurer, strategy, options);
    measurer.set_prior_thinking_dropped(prior);
    measurer.set_lookback_rule(lookback);
    result
}

fn agent_replay_dropping_thinking(
    session: &ImportedSession,
    file: &str,
    measurer: &mut crate::measure::Measurer,
    strategy: &crate::strategy::Strategy,
    options: &super::ReplayOptions,
) -> Result<AgentReplay, String> {
    // The recorded version's autocompact reserve, unless the strategy sets one.
    let mut strategy = strategy.clone();
    if strategy.compact.autocompact.max_output_reserve_tokens.is_none() {
        let version = super::sizing::main_version(session);
        strategy.compact.autocompact.max_output_reserve_tokens = Some(super::ClientProfile::for_version(&version).autocompact_output_reserve);
    }
    keep_recorded_results(&mut strategy);
    measurer.set_billing_key(REAL_SESSION_BILLING);
    let (workload, mut sizing) = sized_workload_for_runs(session, file, measurer, &strategy, options)?;
    RecordedSettings::of(session, &workload).apply(&mut strategy);
    if let Some(warm) = warm_prefix(session, &workload, measurer, &strategy)? {
        warm.seed(measurer)?;
        sizing.seeded_prefix_tokens = warm.tokens();
    }
    // Only the rows are read: the bodies (each the conversation so far) are dropped as measured.
    // The recorded client's turn rules apply around the agent's main requests.
    let client = super::turns::RecordedClient::new(session, &workload.main_calls).with_options(options);
    let run_options = crate::runner::RunOptions { client: Some(Box::new(client)), ..Default::default() };
    let output = crate::runner::run_scenario_opts(&workload.scenario, measurer, &strategy, &crate::agent::compact::chain::Chain::new(), run_options)
        .map_err(|e| e.to_string())?;
    let by_index: BTreeMap<usize, &crate::recording::RecordedCall> = session.calls.iter().map(|c| (c.index, c)).collect();
    let main_rows: Vec<&crate::measure::RequestMetrics> = output.rows.iter().filter(|r| r.lane == LANE_MAIN && r.error.is_none()).collect();
    let unpaired = main_rows.len().abs_diff(workload.main_calls.len());
    let mut calls = Vec::new();
    let mut compactions = Vec::new();
    for (row, index) in main_rows.iter().zip(&workload.main_calls) {
        let Some(call) = by_index.get(index) else { continue };
        for stage in row.stages.iter().filter(|s| s.fired && matches!(&*s.name, "autocompact" | "session_memory_compact" | "manual_compact" | "reactive_compact")) {
            compactions.push(AgentCompaction {
                before_call: call.index,
                stage: stage.name.to_string(),
                reason: stage.reason.to_string(),
                tokens_before: stage.tokens_before,
                tokens_after: stage.tokens_after,
            });
        }
        let message_tokens = row.context_tokens;
        let events = row.events.clone();
        calls.push(super::CallReplay { message_tokens, ..super::CallReplay::measured(call, (*row).clone(), events) });
    }
    // The driven subagents' requests, paired per agent lane in the order the agent made them
    // with the recorded calls their replies came from.
    let mut recorded: BTreeMap<&str, std::collections::VecDeque<usize>> = BTreeMap::new();
    for call in &workload.subagent_calls {
        recorded.entry(call.lane.as_str()).or_default().push_back(call.index);
    }
    let mut unpaired = unpaired;
    let mut made: BTreeMap<&str, usize> = BTreeMap::new();
    for row in output.rows.iter().filter(|r| r.lane.starts_with("subagent:") && r.error.is_none()) {
        *made.entry(row.lane.as_str()).or_default() += 1;
        let Some(call) = recorded.get_mut(row.lane.as_str()).and_then(|q| q.pop_front()).and_then(|index| by_index.get(&index)) else { continue };
        calls.push(super::CallReplay { message_tokens: row.context_tokens, ..super::CallReplay::measured(call, row.clone(), row.events.clone()) });
    }
    for (lane, scripted) in workload.subagent_calls.iter().fold(BTreeMap::<&str, usize>::new(), |mut m, call| {
        *m.entry(call.lane.as_str()).or_default() += 1;
        m
    }) {
        unpaired += scripted.abs_diff(made.get(lane).copied().unwrap_or(0));
    }
    calls.sort_by_key(|c| c.index);
    let replay = super::SessionReplay {
        input: file.to_owned(),
        estimator: measurer.counter().kind().name().to_owned(),
        calls: calls.into(),
        info_loss: output.summary.info_loss.clone(),
        diverged_calls: 0,
        first_divergence: None,
        head_truncated: session.recording.header.head_truncated,
        unrecorded_main: None,
        profile_notes: sizing.profile_notes.clone(),
        compaction_losses: Vec::new(),
        user_context_after_compaction: 0,
        calls_from_records: 0,
        records_requests: !session.api_requests.requests.is_empty(),
    };
    Ok(AgentReplay { replay, report: workload.report, compactions, unpaired, sizing, record_events: workload.record_events })
}

/// The slash command a prompt typed (`<command-name>/NAME</command-name>`), without its slash.
fn command_name(text: &str) -> Option<String> {
    let start = text.find("<command-name>")? + "<command-name>".len();
    let end = start + text[start..].find("</command-name>")?;
    let name = text[start..end].trim().trim_start_matches('/');
    (!name.is_empty()).then(|| name.to_owned())
}

/// The `attachment` type a recorded meta prompt is driven as (a skill's body, a command's
/// prompt): sent as its recorded text.
pub const META_PROMPT: &str = "meta_prompt";

/// The caveat Claude Code writes before a local command's output (`<local-command-caveat>`; older
/// versions without the tag).
fn is_local_command_caveat(text: &str) -> bool {
    let text = text.trim_start();
    text.starts_with("<local-command-caveat>") || text.starts_with("Caveat: The messages below were generated by the user while running local commands")
}

/// How the server keys the billing block of a real session's requests through the agent: not
/// at all. Every automatic compaction of the shipped sessions is followed by a call that reads
/// the whole prefix (a6e4 #7 34,858 of 34,858; 9878 #48, e89f #155, af1d #115, c644 #45,
/// spotter #103, entirecontext 01M0EE #38 likewise), although the client's billing fingerprint
/// changed with its first message; keyed, the agent read nothing of it there.
pub const REAL_SESSION_BILLING: crate::measure::blocks::BillingKey = crate::measure::blocks::BillingKey::Unkeyed;

/// What the agent cannot know and the record shows: the first recorded main call read a cached
/// prefix (an earlier session of the project warmed it). As the replay does, the agent's own
/// prefix (tools and system of its first request under the strategy it was computed for, its
/// messages left out) is written to the measurer's cache just before that request, without a
/// row ([`WarmPrefix::seed`]). Computed once per session ([`warm_prefix`]) and seeded before each
/// run: `fidelity --engine agent` and every what-if through the agent seed the same prefix.
#[derive(Debug, Clone)]
pub struct WarmPrefix {
    flat: crate::measure::FlatRequest,
    time_ms: u64,
}

impl WarmPrefix {
    /// The prefix's tokens.
    pub fn tokens(&self) -> u64 {
        self.flat.total_tokens
    }

    /// Writes the prefix to `measurer`'s cache (a fresh or reset one), 1 ms before the first
    /// request.
    pub fn seed(&self, measurer: &mut crate::measure::Measurer) -> Result<(), String> {
        measurer.seed_cache(&self.flat, self.time_ms, 0).map_err(|e| e.to_string())
    }
}

/// `scenario` with the first `steps` steps of its script (a probe's): its world and the rest
/// copied, the steps after them not.
fn probe_scenario(scenario: &crate::scenario::Scenario, steps: usize) -> crate::scenario::Scenario {
    crate::scenario::Scenario {
        file: scenario.file.clone(),
        name: scenario.name.clone(),
        description: scenario.description.clone(),
        world: scenario.world.clone(),
        script: scenario.script[..steps.min(scenario.script.len())].to_vec(),
        expect: scenario.expect.clone(),
    }
}

/// The [`WarmPrefix`] of `session` driven as `workload` under `strategy`, measured as by
/// `measurer`; `None` for a cold start (the first recorded main call read nothing).
pub fn warm_prefix(
    session: &ImportedSession,
    workload: &Workload,
    measurer: &crate::measure::Measurer,
    strategy: &crate::strategy::Strategy,
) -> Result<Option<WarmPrefix>, String> {
    let Some(first) = session
        .calls
        .iter()
        .find(|c| c.lane == LANE_MAIN && !c.is_synthetic && !c.is_api_error && c.usage.prompt_tokens() > 0)
        .filter(|c| c.usage.cache_read_input_tokens > 0)
    else {
        return Ok(None);
    };
    let Some(reply) = workload.scenario.script.iter().position(|s| matches!(s, crate::scenario::Step::Assistant(a) if a.lane == LANE_MAIN)) else {
        return Ok(None);
    };
    let probe = probe_scenario(&workload.scenario, reply + 1);
    let counter = measurer.counter().fresh_like();
    let mut probe_measurer = crate::measure::Measurer::new(measurer.table().clone(), counter).without_body_hashes();
    probe_measurer.set_billing_key(REAL_SESSION_BILLING);
    let options = crate::runner::RunOptions { keep_requests: true, ..Default::default() };
    let output = crate::runner::run_scenario_opts(&probe, &mut probe_measurer, strategy, &crate::agent::compact::chain::Chain::new(), options)
        .map_err(|e| e.to_string())?;
    let Some((row, request)) = output.rows.iter().zip(&output.requests).find(|(r, _)| r.lane == LANE_MAIN) else { return Ok(None) };
    let mut prefix = request.clone();
    prefix.messages.clear();
    // The recorded read covers the prefix through one of its marked levels (the global-scope
    // part, or the whole system prompt): the one nearest the read is seeded. Without a marked
    // level, the last system block carries the marker the request's own markers have.
    probe_measurer.reset();
    let whole = probe_measurer.flatten(&prefix).map_err(|e| e.to_string())?;
    let read = first.usage.cache_read_input_tokens;
    let level = whole.markers.iter().filter(|&&i| i >= whole.counts.tools).min_by_key(|&&i| (whole.tokens_through(i).abs_diff(read), std::cmp::Reverse(i))).map(|&i| i - whole.counts.tools);
    if let Some(crate::api::SystemPrompt::Blocks(blocks)) = &mut prefix.system {
        match level {
            Some(last) => blocks.truncate(last + 1),
            None => {
                let marker = blocks.iter().find_map(|b| b.cache_control.clone());
                if let (Some(marker), Some(last)) = (marker, blocks.last_mut()) {
                    last.cache_control = Some(marker);
                }
            }
        }
    }
    probe_measurer.reset();
    let flat = probe_measurer.flatten(&prefix).map_err(|e| e.to_string())?;
    Ok(Some(WarmPrefix { flat, time_ms: row.time_ms.saturating_sub(1) }))
}

/// What the record of a session shows of the unrecorded part beyond its first call
/// ([`super::record_view`]).
#[derive(Debug, Clone, Default, PartialEq)]
struct ShownSizes {
    /// The first prefix level (tools + system) a later call's read revealed (its event
    /// `prefix_level`: a read that fell into the unrecorded part at a re-render, a microcompact
    /// or a compaction).
    revealed_prefix_tokens: Option<u64>,
    /// The unrecorded part (prefix and user context) of the first main call after the file's
    /// first compaction, as the record anchors that segment (`segment_anchor`: the call's billed
    /// prompt less its recorded messages, its summary and restored files).
    kept_after_compaction: Option<u64>,
    /// Every call's events ([`Workload::record_events`]).
    events: RecordEvents,
}

/// The [`ShownSizes`] of `session`: its record view under `options` (the default ones but for
/// `fidelity`'s ablations), measured by `measurer`.
fn shown_sizes(session: &ImportedSession, measurer: &mut crate::measure::Measurer, options: &super::ReplayOptions) -> ShownSizes {
    let options = super::ReplayOptions { info_loss: false, compaction_losses: false, ..options.clone() };
    let view = super::record_view(session, measurer, &options);
    let has = |c: &super::CallView, e: &str| c.events.iter().any(|x| x == e);
    let main = || view.calls.iter().filter(|c| c.lane == LANE_MAIN && c.skipped.is_none());
    let recorded_read = |index: usize| session.calls.iter().find(|c| c.index == index).map_or(0, |c| c.usage.cache_read_input_tokens);
    let revealed_prefix_tokens = main().find(|c| has(c, "prefix_level")).map(|c| recorded_read(c.index));
    let kept_after_compaction = main().skip(1).find(|c| has(c, "compaction") && has(c, "segment_anchor")).map(|c| c.prefix_tokens + c.user_context_tokens);
    let events = view.calls.into_iter().map(|c| (c.index, c.events)).collect();
    ShownSizes { revealed_prefix_tokens, kept_after_compaction, events }
}

/// Tokens of the command bodies the agent restores after a compaction (`attachment.skill`, the
/// latest body of each command before the script's first `/compact`), under the post-compact
/// budget, in the agent's own rough count (`rebuild::skill_attachment`'s rule, its per-skill cut
/// `rebuild::restored_skill_content`).
fn restored_command_tokens(script: &[crate::scenario::Step], budget: &crate::agent::compact::config::PostCompactConfig) -> u64 {
    use crate::agent::compact::counting::rough;
    let mut latest: BTreeMap<&str, &str> = BTreeMap::new();
    for step in script {
        match step {
            crate::scenario::Step::Compact => break,
            crate::scenario::Step::Attachment { skill: Some(name), text, .. } => {
                latest.insert(name, text);
            }
            _ => {}
        }
    }
    latest.values().fold(0, |total, text| {
        let cost = rough(&crate::agent::compact::rebuild::restored_skill_content(text, budget));
        if total + cost <= budget.skills_token_budget { total + cost } else { total }
    })
}

/// Sizes the filler of [`Sizing`] and writes it into `workload`'s scenario: the recorded sizes
/// are the replay's of the first main call ([`super::sizing::first_call_sizes`]) with what the
/// record shows beyond it ([`shown_sizes`]), and a probe run of the workload's first
/// request gives the agent's own sizes.
pub fn size_unmodelled(
    session: &ImportedSession,
    file: &str,
    workload: &mut Workload,
    measurer: &crate::measure::Measurer,
    strategy: &crate::strategy::Strategy,
    options: &super::ReplayOptions,
) -> Result<Sizing, String> {
    use crate::measure::{Measurer, blocks::Region};
    let fresh = || {
        let counter = measurer.counter().fresh_like();
        Measurer::new(measurer.table().clone(), counter).without_body_hashes()
    };
    let mut notes = std::collections::BTreeSet::new();
    let Some(unrecorded) = super::sizing::first_call_sizes(session, &mut fresh(), &mut notes) else { return Ok(Sizing::default()) };
    let mut shown = shown_sizes(session, &mut fresh(), options);
    workload.record_events = Some(std::mem::take(&mut shown.events));
    // The levels the record shows in the unrecorded part: a warm first call's read, and the
    // first level a later read falls to (a compaction, a re-render, a shared prefix past the
    // TTL). The higher is the whole prefix (tools and system, cached at its end); the lower, when
    // both are shown, the part cached with the global scope (an earlier session of another git
    // state wrote it: 8 of the 9 shipped sessions that show both read the lower at their first
    // call; the ninth, 0254, continues an earlier file of its own session). A first
    // call that read nothing cannot show a level: the first one a later read reveals replaces
    // the fitted one (or the total less the fitted user context).
    let warm = unrecorded.prefix_from_record.then_some(unrecorded.prefix_tokens);
    let revealed = shown.revealed_prefix_tokens.filter(|&p| p <= unrecorded.first_call_tokens);
    let (prefix, global_level) = match (warm, revealed) {
        (Some(warm), Some(revealed)) if warm != revealed => (warm.max(revealed), Some(warm.min(revealed))),
        (Some(level), _) | (None, Some(level)) => (level, None),
        (None, None) => (unrecorded.prefix_tokens, None),
    };
    let mut sizing = Sizing {
        recorded_prefix_tokens: prefix,
        recorded_context_tokens: unrecorded.first_call_tokens.saturating_sub(prefix),
        recorded_global_tokens: global_level.unwrap_or(0),
        profile_notes: notes.into_iter().collect(),
        ..Sizing::default()
    };
    // The agent's own first request.
    let first = workload.scenario.script.iter().position(|s| matches!(s, crate::scenario::Step::Assistant(a) if a.lane == LANE_MAIN));
    let probe = probe_scenario(&workload.scenario, first.map_or(0, |i| i + 1));
    let mut probe_measurer = fresh();
    let options = crate::runner::RunOptions { keep_requests: true, ..Default::default() };
    let output = crate::runner::run_scenario_opts(&probe, &mut probe_measurer, strategy, &crate::agent::compact::chain::Chain::new(), options)
        .map_err(|e| e.to_string())?;
    let Some(request) = output.rows.iter().zip(&output.requests).find(|(r, _)| r.lane == LANE_MAIN).map(|(_, q)| q.clone()) else {
        return Ok(sizing);
    };
    let key = measurer.table().lookup(&request.model).map(|m| m.estimator_key()).unwrap_or_default();
    let mut counter = measurer.counter().fresh_like();
    // Flattened without its body hash (SHA-256 of the whole request, which no size reads).
    let flat = crate::measure::incremental::Flattener::without_body_hashes().flatten(&request, &mut counter, &key);
    if cfg!(debug_assertions) {
        let hashed = crate::measure::blocks::flatten(&request, &mut counter, &key);
        assert!(hashed.blocks == flat.blocks && hashed.markers == flat.markers, "the probe's request flattened without its body hash");
    }
    sizing.agent_prefix_tokens = flat.region_tokens(Region::Tools) + flat.region_tokens(Region::System);
    // The agent's global-scope part: tools and the system prompt through its static block.
    let global = |c: &crate::api::CacheControl| c.scope == Some(crate::api::CacheScope::Global);
    let agent_global_tokens = flat.markers.iter().rev().find(|&&i| flat.blocks[i].cache_control.as_deref().is_some_and(global)).map(|&i| flat.tokens_through(i));
    // The opening message without the typed prompt (the replay counts that as recorded): its
    // blocks' tokens, each a function of the block alone (debug builds flatten the request cut
    // to it and compare).
    let opening_tokens: u64 = flat.blocks.iter().filter(|b| b.path.region == Region::Messages && b.path.index == 0).map(|b| u64::from(b.tokens)).sum();
    if cfg!(debug_assertions) {
        let mut opening = request.clone();
        opening.messages.truncate(1);
        assert_eq!(opening_tokens, crate::measure::blocks::flatten(&opening, &mut counter, &key).region_tokens(Region::Messages), "the opening message's tokens");
    }
    let prompt_tokens = workload
        .scenario
        .script
        .iter()
        .find_map(|s| match s {
            crate::scenario::Step::User { text } => Some(u64::from(counter.count_text(text, &key))),
            _ => None,
        })
        .unwrap_or(0);
    sizing.agent_context_tokens = opening_tokens.saturating_sub(prompt_tokens);

    let params = measurer.counter().calibration().for_family(&key);
    let kind = measurer.counter().kind();
    let shared = measurer.counter().shared().cloned();
    let sized = |label: &str, tokens: u64| super::sizing::filler(label, tokens, kind, params.scale, params.per_block, shared.as_deref());
    // The system filler joins a block of the agent's (its static or dynamic part): it carries no
    // block overhead of its own (before, both levels fell short of the record by `per_block`).
    let joined = |label: &str, tokens: u64| super::sizing::filler(label, tokens, kind, params.scale, 0.0, shared.as_deref());
    sizing.system_filler_tokens = sizing.recorded_prefix_tokens.saturating_sub(sizing.agent_prefix_tokens);
    // The filler goes where the recorded client's bytes were: before the boundary up to the
    // global-scope level the record shows, the rest after the agent's dynamic sections. With one
    // level shown (or none) all of it is before the boundary: the agent's own dynamic part is
    // then the part after it. Without a global-scope marker (no boundary) the two parts are one
    // block anyway.
    sizing.static_filler_tokens = match (global_level, agent_global_tokens) {
        (Some(level), Some(agent)) => level.saturating_sub(agent).min(sizing.system_filler_tokens),
        _ => sizing.system_filler_tokens,
    };
    let context_gap = sizing.recorded_context_tokens.saturating_sub(sizing.agent_context_tokens);
    // What the record shows outliving the file's first compaction beyond the prefix, less the
    // command bodies the agent restores there itself (the replay that measured it restores none,
    // so they are in its count): the rest is memory and context.
    let restored = restored_command_tokens(&workload.scenario.script, &strategy.compact.post_compact);
    let outlives_compaction = |kept: u64| kept.saturating_sub(sizing.recorded_prefix_tokens).saturating_sub(restored);
    if session.recording.header.head_truncated {
        // A file that continues a session: the gap is mostly the conversation before the file,
        // which a compaction drops; it opens the script as one prompt of that size. What of it
        // outlives a compaction (the user context, CLAUDE.md) is what the record shows beyond the
        // prefix after the file's first compaction; it stays as CLAUDE.md.
        let kept = shown.kept_after_compaction.map_or(0, outlives_compaction);
        sizing.claude_md_filler_tokens = kept.saturating_sub(sizing.agent_context_tokens).min(context_gap);
        sizing.history_filler_tokens = context_gap - sizing.claude_md_filler_tokens;
    } else {
        // Files the opening prompt @-mentions (a slash command's text often does) come with it
        // as attachments, part of the conversation a compaction drops: the gap beyond what
        // outlives a compaction is theirs, shared equally (the transcript holds neither the
        // files nor their sizes). What outlives it (memory and context) is what the record
        // shows beyond the prefix after the file's first compaction, as for a continuing file;
        // the version's fitted user context stands in when the file has no compaction. Without
        // mentions the whole gap is memory and context.
        sizing.mentioned_files = super::sizing::first_call_mentions(session);
        sizing.claude_md_filler_tokens = context_gap;
        if !sizing.mentioned_files.is_empty() {
            let outlives = match shown.kept_after_compaction {
                Some(kept) => outlives_compaction(kept),
                // (A version taken from another's fit is noted by the sizing of the same
                // session's first call, `first_call_sizes`: `Sizing::profile_notes`.)
                None => super::sizing::user_context_prior(measurer.counter().calibration(), &super::sizing::main_version(session), &mut Default::default()),
            };
            sizing.claude_md_filler_tokens = outlives.saturating_sub(sizing.agent_context_tokens).min(context_gap);
            sizing.mention_filler_tokens = context_gap - sizing.claude_md_filler_tokens;
        }
    }
    // A client that `/clear`ed into the file (a `clear` step, or the command the first prompt
    // carries, before the first reply) restored at each
    // compaction more than the file shows: af1d shows 20.9k tokens beyond the files the
    // client's rule restores after its first compaction and 19.3k after its second, e89f 5.6k
    // beyond them and the command body it invoked; what it kept from before the `/clear` (the
    // transcript holds neither its content nor its kind). Sized from the file's first
    // compaction as the replay anchors it; every compaction of the agent's restores it.
    let cleared_into = {
        let script = &workload.scenario.script;
        let first_reply = script.iter().position(|s| matches!(s, crate::scenario::Step::Assistant(a) if a.lane == LANE_MAIN));
        let is_clear = |s: &crate::scenario::Step| match s {
            crate::scenario::Step::Clear => true,
            crate::scenario::Step::User { text } => text.contains("<command-name>/clear</command-name>"),
            _ => false,
        };
        script.iter().position(is_clear).is_some_and(|clear| first_reply.is_none_or(|reply| clear < reply))
    };
    if cleared_into && !session.recording.header.head_truncated && sizing.mentioned_files.is_empty()
        && let Some(kept) = shown.kept_after_compaction
    {
        sizing.restored_unrecorded_tokens = outlives_compaction(kept).saturating_sub(sizing.recorded_context_tokens);
    }
    // The filler is written into the document and into its scenario alike (the edits the
    // scenario's check accepts as they are: no parse of the whole document again); debug builds
    // parse the document again and compare.
    use crate::scenario::Step;
    let doc = &mut workload.document;
    let scenario = &mut workload.scenario;
    let cwd = scenario.world.cwd.trim_end_matches('/').to_owned();
    if sizing.restored_unrecorded_tokens > 0 {
        let text = sized("recorded client restore not in the file", sizing.restored_unrecorded_tokens);
        doc["world"]["restored_unrecorded"] = Value::String(text.clone());
        scenario.world.restored_unrecorded = Some(text);
    }
    if sizing.static_filler_tokens > 0 {
        let text = joined("recorded client prompt before the boundary", sizing.static_filler_tokens);
        doc["world"]["static_system_prompt"] = Value::String(text.clone());
        scenario.world.static_system_prompt = Some(text);
    }
    let dynamic_filler = sizing.system_filler_tokens - sizing.static_filler_tokens;
    if dynamic_filler > 0 {
        let text = joined("recorded client prompt not modelled", dynamic_filler);
        doc["world"]["append_system_prompt"] = Value::String(text.clone());
        scenario.world.append_system_prompt = Some(text);
    }
    // Whether the recorded client's system prompt was cached at its end is its version's
    // (`ClientProfile::system_cached_at_end`: all but 2.1.88–2.1.114, whose dynamic block went
    // unmarked). Each of the 13 shipped sessions whose record shows a read falling into the
    // unrecorded part shows one of the whole prefix (its only level, or the higher of two).
    let cached_at_end = super::ClientProfile::for_version(&super::sizing::main_version(session)).system_cached_at_end;
    doc["world"]["dynamic_system_marker"] = Value::Bool(cached_at_end);
    scenario.world.dynamic_system_marker = cached_at_end;
    if sizing.claude_md_filler_tokens > 0 {
        let text = sized("recorded memory and context not modelled", sizing.claude_md_filler_tokens);
        let path = format!("{cwd}/CLAUDE.md");
        doc["world"]["files"] = json!({ path.clone(): text.clone() });
        scenario.world.files = indexmap::IndexMap::from([(path, crate::scenario::FileSpec::from(text))]);
    }
    if sizing.mention_filler_tokens > 0
        && let Some(at) = scenario.script.iter().position(|s| matches!(s, Step::Assistant(_)))
    {
        let block_text = |block: ContentBlock| match block {
            ContentBlock::Text { text, .. } => text.into_string(),
            _ => String::new(),
        };
        // One attachment per file before the first reply, each rendered as the client renders a
        // file it attached (the Read call and its result), sized to its share.
        let count = sizing.mentioned_files.len() as u64;
        let texts: Vec<String> = sizing
            .mentioned_files
            .iter()
            .enumerate()
            .map(|(i, path)| {
                let share = sizing.mention_filler_tokens / count + u64::from((i as u64) < sizing.mention_filler_tokens % count);
                let wrapper = super::working_set::Restored::Sized { path: path.clone(), tokens: 0, chars: 0 }.to_block(|_, _| String::new());
                let wrapper_tokens = u64::from(counter.count_text(&block_text(wrapper), &key));
                let body = share.saturating_sub(wrapper_tokens);
                let block = super::working_set::Restored::Sized { path: path.clone(), tokens: body, chars: 0 }.to_block(|label, tokens| sized(label, tokens));
                block_text(block)
            })
            .collect();
        if let Some(steps) = doc.get_mut("script").and_then(Value::as_array_mut) {
            let reply = steps.iter().position(|s| s.get("assistant").is_some()).unwrap_or(steps.len());
            steps.splice(reply..reply, texts.iter().map(|text| json!({ "attachment": { "type": "file", "text": text } })));
        }
        scenario.script.splice(at..at, texts.into_iter().map(|text| Step::Attachment { kind: "file".to_owned(), text, skill: None }));
    }
    // (The document's steps where it keeps its script, the scenario's always.)
    let first_user = scenario.script.iter_mut().find_map(|s| if let Step::User { text } = s { Some(text) } else { None });
    if sizing.history_filler_tokens > 0
        && let Some(typed) = first_user
    {
        let text = format!("{}\n\n{typed}", sized("conversation before this file", sizing.history_filler_tokens));
        if let Some(first) = doc.get_mut("script").and_then(Value::as_array_mut).and_then(|steps| steps.iter_mut().find(|s| s.get("user").is_some())) {
            first["user"] = Value::String(text.clone());
        }
        *typed = text.into();
    } else {
        // No history stand-in: a recorded microcompact clears only the file's own results.
        if let Some(steps) = doc.get_mut("script").and_then(Value::as_array_mut) {
            for step in steps.iter_mut() {
                // (By key: a JSON pointer is split and unescaped into new strings at every step.)
                debug_assert_eq!(step.get("microcompact").and_then(|m| m.get("history_chars")), step.pointer("/microcompact/history_chars"));
                if let Some(chars) = step.get_mut("microcompact").and_then(|m| m.get_mut("history_chars")) {
                    *chars = json!(0);
                }
            }
            steps.retain(|s| s.get("microcompact").is_none_or(|m| m["tool_use_ids"].as_array().is_some_and(|ids| !ids.is_empty())));
        }
        for step in &mut scenario.script {
            if let Step::Microcompact { history_chars, .. } = step {
                *history_chars = 0;
            }
        }
        scenario.script.retain(|s| !matches!(s, Step::Microcompact { tool_use_ids, .. } if tool_use_ids.is_empty()));
    }
    if cfg!(debug_assertions) {
        // (Debug builds keep the script: `workload_with`.)
        let parsed = crate::scenario::parse_scenario_document(&workload.document, file).map_err(|e| e.to_string())?;
        assert!(parsed == workload.scenario, "the sized scenario of {file} differs from its document's");
    }
    sizing.subagent_prompt_filler_tokens = size_subagent_prompts(session, file, workload, measurer, strategy)?;
    Ok(sizing)
}

/// Sizes the prompt of each built-in agent type a driven subagent runs as, as the main system
/// prompt is sized: the recorded client's first request of the type's first subagent (its
/// billed prompt) less the agent's own first request of it, probed with a script of the first
/// prompt, the Agent call alone and the subagent's first reply (text only, so it ends there).
/// The recorded request, the Agent call, its output and the reply are all that subagent's
/// (several subagents of one type share the agent's lane: each reply is known by its Agent call,
/// [`SubagentCall::tool_use_id`]); a subagent that cannot be probed (its Agent call has no
/// recorded output, or the probe makes no request of it) leaves the type to the next one, and
/// the first probed decides, a gap of none included.
/// The difference (when the agent's is shorter) is written into the scenario as sized filler
/// after the agent's prompt of that type (`world.agent_prompt_extra`). The recorded request's
/// messages are the agent's too (the user context with the sized CLAUDE.md, the Agent call's
/// prompt), so what is left is the recorded client's prompt of the type: its text (our own
/// stand-in is one paragraph) and what it embeds of the user's configuration.
fn size_subagent_prompts(
    session: &ImportedSession,
    file: &str,
    workload: &mut Workload,
    measurer: &crate::measure::Measurer,
    strategy: &crate::strategy::Strategy,
) -> Result<BTreeMap<String, u64>, String> {
    use crate::scenario::Step;
    let mut sized = BTreeMap::new();
    let script = &workload.scenario.script;
    let Some(first_user) = script.iter().position(|s| matches!(s, Step::User { .. })) else { return Ok(sized) };
    let catalog_types: BTreeSet<String> =
        crate::agent::agents::built_in_agents(true).into_iter().map(|a| a.agent_type).collect();
    // Types whose first probed subagent decided (sized or not).
    let mut decided: BTreeSet<String> = BTreeSet::new();
    for run in workload.report.subagents.iter().filter(|r| r.not_driven.is_none() && r.replies > 0) {
        let lane = format!("subagent:{}", run.agent_type);
        if decided.contains(&run.agent_type) || !catalog_types.contains(&run.agent_type) {
            continue;
        }
        // This subagent's first scripted reply: its place among the lane's replies (the script
        // holds them in the order of `subagent_calls`) and the recorded call it stands for.
        let Some((ordinal, first)) =
            workload.subagent_calls.iter().filter(|c| c.lane == lane).enumerate().find(|(_, c)| c.tool_use_id == run.tool_use_id)
        else {
            continue;
        };
        let Some(recorded) = session.calls.iter().find(|c| c.index == first.index).filter(|c| !c.is_synthetic && !c.is_api_error) else {
            continue;
        };
        let recorded_tokens = recorded.usage.prompt_tokens();
        // The Agent call alone, its recorded output, and the subagent's first reply as text.
        let call = script.iter().enumerate().find_map(|(i, s)| match s {
            Step::Assistant(a) if a.lane == LANE_MAIN => {
                a.content.iter().find(|b| matches!(b, ContentBlock::ToolUse { id, .. } if *id == run.tool_use_id)).map(|b| (i, a, b.clone()))
            }
            _ => None,
        });
        let Some((at, main, agent_call)) = call else { continue };
        let output = script[at + 1..].iter().find_map(|s| match s {
            Step::ToolOutput(outputs) => outputs.iter().find(|o| o.tool_use_id == run.tool_use_id).cloned(),
            _ => None,
        });
        let reply = script
            .iter()
            .filter_map(|s| match s {
                Step::Assistant(a) if a.lane == lane => Some(a),
                _ => None,
            })
            .nth(ordinal);
        let (Some(output), Some(reply)) = (output, reply) else { continue };
        let mut main = main.clone();
        main.content = vec![agent_call].into();
        main.stop_reason = crate::api::StopReason::ToolUse;
        let mut reply = reply.clone();
        reply.content.retain(|b| matches!(b, ContentBlock::Text { .. }));
        if reply.content.is_empty() {
            reply.content = vec![serde_json::from_value(json!({ "type": "text", "text": "." })).map_err(|e| e.to_string())?].into();
        }
        reply.stop_reason = crate::api::StopReason::EndTurn;
        let mut probe = probe_scenario(&workload.scenario, 0);
        probe.script = script[..=first_user].to_vec();
        probe.script.extend([Step::Assistant(main), Step::ToolOutput(vec![output]), Step::Assistant(reply)]);
        let counter = measurer.counter().fresh_like();
        let mut probe_measurer = crate::measure::Measurer::new(measurer.table().clone(), counter).without_body_hashes();
        let options = crate::runner::RunOptions { keep_requests: true, ..Default::default() };
        let Ok(output) = crate::runner::run_scenario_opts(&probe, &mut probe_measurer, strategy, &crate::agent::compact::chain::Chain::new(), options) else {
            continue;
        };
        let Some((row, request)) = output.rows.iter().zip(&output.requests).find(|(r, _)| r.lane == lane && r.error.is_none()) else { continue };
        decided.insert(run.agent_type.clone());
        let agent_tokens = row.input_tokens + row.cache_read_input_tokens + row.cache_creation_input_tokens;
        let gap = recorded_tokens.saturating_sub(agent_tokens);
        if gap == 0 {
            continue;
        }
        let key = measurer.table().lookup(&request.model).map(|m| m.estimator_key()).unwrap_or_default();
        let params = measurer.counter().calibration().for_family(&key);
        let shared = measurer.counter().shared().cloned();
        let text = super::sizing::filler("recorded agent prompt not modelled", gap, measurer.counter().kind(), params.scale, 0.0, shared.as_deref());
        // Into the document and its scenario alike, as the other fillers ([`size_unmodelled`]).
        workload.document["world"]["agent_prompt_extra"][run.agent_type.as_str()] = Value::String(text.clone());
        workload.scenario.world.agent_prompt_extra.insert(run.agent_type.clone(), text);
        sized.insert(run.agent_type.clone(), gap);
    }
    if cfg!(debug_assertions) && !sized.is_empty() {
        let parsed = crate::scenario::parse_scenario_document(&workload.document, file).map_err(|e| e.to_string())?;
        assert!(parsed == workload.scenario, "the scenario of {file} with its agent prompt filler differs from its document's");
    }
    Ok(sized)
}
