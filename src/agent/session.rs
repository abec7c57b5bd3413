//! The agent session: the state Claude Code keeps across a conversation and the request it
//! builds from it (layers 1–5).
//!
//! Per user turn: the prompt is recorded, hooks run (SessionStart once, UserPromptSubmit), and
//! `getAttachments` adds its attachments. Per model call: the system prompt (memoized sections),
//! the tool pool (tool search, discovered tools), the user context prepended at index 0, the
//! records normalized into API messages, the deferred-tools announcement, one message-level
//! marker, tool_result key order. After a reply: tools run (PreToolUse/PostToolUse hooks), their
//! results and in-loop hook context are recorded, and the thread attachments follow.
//!
//! Every change that can move the cached prefix is journalled as an event string from the
//! closed cause list (`mcp_connected:x`, `tool_loaded:X`, `system_section_changed:<name>`,
//! `date_changed`, `hook_context_folded`, ...); `build_request` hands them to the caller.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::agent::attachments::{Attachment, InvokedSkill, Todo};
use crate::agent::hooks::{ConfiguredHook, HookCall, HookRun, ParsedHooks, Permission, load_settings_hooks, run_hooks};
use crate::agent::instructions::{Discovery, DiscoveryOptions, MANAGED_DIR, discover, nested_memory_for};
use crate::agent::normalize::{MessageMemo, NormalizeOptions, Record, finalize_tool_results, mark_last_block};
use crate::agent::profile::SizeProfile;
use crate::agent::read_state::ReadState;
use crate::agent::skills::{Skill, format_listing};
use crate::agent::system_prompt::{
    GitStatus, McpServerInstructions, SECTION_ATTRIBUTION, SystemPromptBuild, SystemPromptCache, SystemPromptInputs, SystemPromptOptions,
    build_subagent_system_prompt,
};
use crate::agent::tools::exec::{ExecContext, ExecOutcome, absolute, execute};
use crate::agent::tools::{McpToolSpec, PoolInputs, ToolPool, assemble_pool};
use crate::agent::user_context::{UserContextInputs, render_user_context};
use crate::api::{CacheControl, ContentBlock, Message, MessageContent, Request, Role, SystemPrompt, ToolResultContent};
use crate::strategy::{BaseUrl, McpInstructionsMode, Strategy};
use crate::world::{Reply, World};

/// `max_tokens` of the memory selection request (ours).
const SELECTION_MAX_TOKENS: u64 = 256;

/// `max_tokens` of a prompt or agent hook's request (ours).
const HOOK_MAX_TOKENS: u64 = 512;

const PROMPT_HOOK_INSTRUCTION: &str = "You check a condition for a coding assistant's hook. Read the condition and the event data, and reply with JSON only: {\"ok\": true} when the condition holds, or {\"ok\": false, \"reason\": \"…\"} saying what is wrong.";

const AGENT_HOOK_INSTRUCTION: &str = "You verify a coding assistant's work for a hook. Inspect the files you need with the read-only tools, then reply with JSON only: {\"ok\": true} when the condition holds, or {\"ok\": false, \"reason\": \"…\"} saying what is wrong.";

/// Client version written into the billing header.
pub const CLIENT_VERSION: &str = "2.1.88";

/// What a session under no peer mechanism recorded for the strategies that may go on from its
/// run ([`Session::probe_peers`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerProbe {
    /// The highest count a count-triggered peer mechanism would have compared with its trigger.
    pub counted: Option<u64>,
    /// Connected MCP servers had instructions where a placement reads them.
    pub mcp_instructions: bool,
    /// The mechanisms run dry ([`Session::dry_run_peers`], by their tags) that would have
    /// rewritten something.
    pub rewrote: Vec<usize>,
    /// For each main request made (each [`Session::take_peer_reports`]), the stage reports each
    /// mechanism run dry would have put on it, with its tag.
    pub reports: Vec<Vec<(usize, crate::measure::StageReport)>>,
}

/// How many pools [`ASSEMBLED_POOLS`] keeps (the strategies of a session's what-ifs make a few).
const ASSEMBLED_POOLS_KEPT: usize = 8;

/// How many user contexts [`RENDERED_CONTEXTS`] keeps.
const RENDERED_CONTEXTS_KEPT: usize = 8;

thread_local! {
    /// The user contexts rendered last on this thread, by what rendering read (the inputs and
    /// the size profile), the oldest first. A session renders its user context afresh at its
    /// first request and after every compaction, and every run of a session (each what-if,
    /// each run of a plan search) starts a session of its own, rendering the same context
    /// from the same memory files. Rendering reads nothing else, so which renderings are
    /// shared changes no result (debug builds render again and compare).
    static RENDERED_CONTEXTS: std::cell::RefCell<Vec<(UserContextInputs, std::sync::Arc<SizeProfile>, crate::api::SharedText)>> = const { std::cell::RefCell::new(Vec::new()) };

    /// The pools assembled last on this thread, by what assembly read (the inputs and the size
    /// profile), the oldest first. A session assembles its pool once per change of the inputs
    /// ([`Session::pool`]'s own memo), but every run of a session starts a session of its own:
    /// the what-ifs of one recorded session (each strategy, each run of a plan search) assemble
    /// the same pool, each assembly padding every built-in tool to the profile's token counts.
    /// The same inputs give the same pool, so which runs share one changes no result.
    static ASSEMBLED_POOLS: std::cell::RefCell<Vec<(PoolInputs, std::sync::Arc<SizeProfile>, std::rc::Rc<ToolPool>)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The agent state of one conversation on the main thread.
#[derive(Debug, Clone)]
pub struct Session {
    strategy: Strategy,
    /// Shared (one allocation for every session of a process): compared by pointer first.
    profile: std::sync::Arc<SizeProfile>,
    records: Vec<Record>,
    system_cache: SystemPromptCache,
    /// The memoized user-context string (`getUserContext`), dropped by compaction or `/clear`.
    user_context: Option<crate::api::SharedText>,
    memory: Option<Discovery>,
    loaded_nested: BTreeSet<String>,
    /// Compactions so far that rebuilt the conversation (2.1.332 keeps the newest round on the
    /// first one only).
    pub(crate) compactions: u32,
    discovered_tools: BTreeSet<String>,
    sent_tools: BTreeSet<String>,
    sent_skill_names: BTreeSet<String>,
    activated_skills: BTreeSet<String>,
    invoked_skills: Vec<InvokedSkill>,
    todos: Vec<Todo>,
    turns_since_todo_write: u32,
    turns_since_todo_reminder: u32,
    /// MCP servers whose instructions were announced by delta (by name).
    announced_mcp: BTreeSet<String>,
    /// Deferred tool names announced by delta.
    announced_deferred: BTreeSet<String>,
    last_date: Option<String>,
    /// Files the agent has seen, with the mtime it saw.
    read_state: ReadState,
    nested_triggers: Vec<String>,
    /// MCP servers as connected at the start of the current user turn (the system prompt is
    /// built once per turn).
    turn_mcp: Vec<McpServerInstructions>,
    session_started: bool,
    previous_system: Option<std::rc::Rc<SystemPromptBuild>>,
    events: Vec<String>,
    /// The settings hooks snapshot taken at start (`getHooksFromAllowedSources`).
    settings_hooks: ParsedHooks,
    /// Hooks registered by enabled plugins, in plugin order.
    plugin_hooks: Vec<ConfiguredHook>,
    /// Session hooks registered by invoked skills' frontmatter.
    session_hooks: Vec<ConfiguredHook>,
    /// Enabled plugins, in enable order.
    plugins: Vec<crate::agent::plugins::Plugin>,
    /// Plugin roots enabled so far (reloads re-read them).
    plugin_roots: Vec<String>,
    /// `.claude/skills` directories found below the cwd on touch, deepest first per touch.
    dynamic_skill_dirs: Vec<String>,
    checked_skill_dirs: BTreeSet<String>,
    /// The `.claude/skills` directories above each touched file's directory, as last found
    /// ([`crate::agent::skills::nested_skill_dirs_kept`]).
    nested_skill_dirs: crate::world::FragmentAnswers<(String, Vec<String>)>,
    /// Every hook run, in order (display-only effects included), for traces and tests.
    hook_log: Vec<HookRun>,
    /// Consecutive Stop-hook continuations of the current turn.
    stop_continuations: u32,
    device_id: String,
    session_id: String,
    /// The main requests' `metadata` ([`request_metadata`] of the two ids above), made when
    /// either changes rather than per request.
    metadata: crate::api::SharedValue,
    /// Chain bookkeeping per record (uuid, time, message id, usage), parallel to `records`.
    record_meta: Vec<chain_glue::RecordMeta>,
    /// State of the long-context chain that persists across requests.
    chain_state: crate::agent::compact::ChainState,
    /// A peer agent's mechanism (Codex, opencode, masking, Cline, server compaction) applied
    /// to the wire messages, and what it did on the last request.
    peer_state: crate::agent::compact::peers::PeerState,
    peer_reports: Vec<crate::measure::StageReport>,
    /// [`Session::probe_peers`]: `Some` while probing, with what was seen since the last
    /// [`Session::take_peer_probe`].
    peer_probe: Option<PeerProbe>,
    /// While probing, the mechanisms run dry on every request's messages
    /// ([`Session::dry_run_peers`]), each with its tag, and the reports they would have put on
    /// the next main request (as `peer_reports` holds them).
    peer_dry: Vec<(usize, crate::agent::compact::peers::PeerConfig)>,
    peer_dry_reports: Vec<(usize, crate::measure::StageReport)>,
    /// The main thread, or the subagent this session runs for.
    thread: subagent_glue::Thread,
    /// Agents started by this thread so far (agent ids derive from it).
    agents_started: u64,
    /// Agents launched in the background (2.1.332) that have not run yet; they run when the
    /// main thread's turn ends, and their results come back as task notifications.
    background: Vec<subagent_glue::AgentStart>,
    /// Task notifications added since [`Session::take_notifications`] last asked.
    notifications: Vec<String>,
    /// The Agent tool's listing as first rendered: the tool schema is memoized for the session,
    /// so agents added later do not reach the description.
    agent_listing: Option<crate::agent::tools::AgentToolListing>,
    /// Agent types announced by `agent_listing_delta` (delta mode).
    announced_agents: BTreeMap<String, String>,
    /// The last reply ended without tool calls but a Stop (SubagentStop) hook sent it back to
    /// work.
    stop_continued: bool,
    /// Relevant memories: surfaced paths, bytes, the turn's prefetch.
    memories: crate::agent::memories::MemoryState,
    /// `getSystemContext`'s git snapshot, taken at the first request and kept (compaction
    /// included) until `/clear` or a resume; `Some(None)` when there is none to show.
    git_snapshot: Option<Option<GitStatus>>,
    /// Hook time not yet on the clock: hooks run where the session only reads the World, and
    /// the time is added at the next point it holds the World mutably.
    hook_wait_ms: u64,
    /// Side requests made since the caller last took them (prompt/agent hooks, the memory
    /// selection), in order.
    pending_side_calls: Vec<SideCall>,
    /// `/clear`s so far (each starts a new session id).
    clears: u64,
    /// The last pool assembled and the inputs it was assembled from ([`Session::pool`]).
    pool_memo: std::cell::RefCell<Option<(PoolInputs, std::rc::Rc<ToolPool>)>>,
    /// The system prompt's inputs the last request gathered ([`Session::refresh_system_inputs`]).
    system_gathered: Option<GatheredSystemInputs>,
    /// The chain's entries for `records[..n]` as the last chain run left them (each what
    /// `record_to_entry` makes of its record and meta), so the next run makes only the new
    /// ones; emptied wherever records change other than by appending.
    entry_cache: chain_glue::EntryCache,
    /// The API messages of the records up to the last assistant record, as the last request
    /// made them; told wherever records change other than by appending.
    message_memo: MessageMemo,
    /// The rewrites of every request's messages where the memo does not keep them finished (a
    /// peer mechanism, the 2.1.332 layout): the same blocks at a position rewritten once.
    mcp_memo: crate::agent::dialect::McpMemo,
    finalize_memo: crate::agent::normalize::BlocksMemo,
    /// How many messages the last request built put in front of the memo's (the deferred
    /// tools' listing), for [`Session::give_back_messages`]; `None` when its layout moved them
    /// otherwise (2.1.332) or it was handed back already.
    lent_offset: Option<usize>,
    /// How many leading messages of the last request built are as the memo lent them (its
    /// prefix's own): those before the ones it made, when nothing rewrote the history.
    lent_unchanged: usize,
    /// How many leading messages of the last request built are the ones the request before it
    /// handed back, as that one sent them ([`Session::shared_messages`]).
    lent_shared: usize,
    /// Whether a hook attachment was written inside a tool loop since the last human turn
    /// folded them ([`Session::user_prompt`]): else no record is one, and the records are
    /// not read for them.
    in_loop_written: bool,
}

#[path = "session_chain.rs"]
mod chain_glue;
pub use chain_glue::{ChainRun, ForkAnswer, RecordMeta, Recovery, SideCall, ThresholdWorld, fork_prefix_ttl};

#[path = "session_subagent.rs"]
mod subagent_glue;
pub use subagent_glue::ModelCalls;

impl Session {
    /// A fresh session. The scenario's env overrides the strategy's env-backed knobs.
    pub fn new(strategy: &Strategy, world: &World) -> Session {
        // The env was validated with the scenario; a bad number keeps the strategy's value.
        let strategy = ThresholdWorld::of(world).strategy(strategy);
        let mut rng = world.rng.fork("session");
        let device_id = format!("{:016x}{:016x}{:016x}{:016x}", rng.next_u64(), rng.next_u64(), rng.next_u64(), rng.next_u64());
        let session_id = uuid_v4(rng.next_u64(), rng.next_u64());
        let settings_hooks = load_settings_hooks(&world.fs, &world.home, &world.cwd, MANAGED_DIR);
        Session {
            settings_hooks,
            plugin_hooks: Vec::new(),
            plugins: Vec::new(),
            plugin_roots: Vec::new(),
            dynamic_skill_dirs: Vec::new(),
            checked_skill_dirs: BTreeSet::new(),
            nested_skill_dirs: crate::agent::skills::new_nested_skill_dirs_kept(),
            session_hooks: Vec::new(),
            hook_log: Vec::new(),
            stop_continuations: 0,
            strategy,
            profile: SizeProfile::claude_code_2_1_88_shared(),
            records: Vec::new(),
            system_cache: SystemPromptCache::new(),
            user_context: None,
            memory: None,
            loaded_nested: BTreeSet::new(),
            compactions: 0,
            discovered_tools: BTreeSet::new(),
            sent_tools: BTreeSet::new(),
            sent_skill_names: BTreeSet::new(),
            activated_skills: BTreeSet::new(),
            invoked_skills: Vec::new(),
            todos: Vec::new(),
            turns_since_todo_write: 0,
            turns_since_todo_reminder: 0,
            announced_mcp: BTreeSet::new(),
            announced_deferred: BTreeSet::new(),
            last_date: None,
            read_state: ReadState::default(),
            nested_triggers: Vec::new(),
            turn_mcp: Vec::new(),
            session_started: false,
            previous_system: None,
            events: Vec::new(),
            record_meta: Vec::new(),
            peer_state: Default::default(),
            peer_reports: Vec::new(),
            peer_probe: None,
            peer_dry: Vec::new(),
            peer_dry_reports: Vec::new(),
            chain_state: crate::agent::compact::ChainState::new(session_dir(world, &session_id)),
            metadata: request_metadata(&device_id, &session_id),
            device_id,
            session_id,
            thread: subagent_glue::Thread::Main,
            agents_started: 0,
            background: Vec::new(),
            notifications: Vec::new(),
            agent_listing: None,
            announced_agents: BTreeMap::new(),
            stop_continued: false,
            memories: Default::default(),
            git_snapshot: None,
            hook_wait_ms: 0,
            pending_side_calls: Vec::new(),
            clears: 0,
            pool_memo: Default::default(),
            system_gathered: None,
            entry_cache: Default::default(),
            message_memo: MessageMemo::default(),
            mcp_memo: Default::default(),
            lent_offset: None,
            lent_unchanged: 0,
            lent_shared: 0,
            in_loop_written: false,
            finalize_memo: Default::default(),
        }
    }

    /// Applies the strategy's peer mechanism to the wire messages (a view: the transcript is
    /// kept, the peer remembers its rewrite and applies it again as the history grows).
    /// The peer mechanism (or its probe) on the history after the first `front` messages.
    fn apply_peer(&mut self, messages: &mut Vec<Message>, front: usize, world: &World, system: &[crate::api::SystemBlock], pool: &ToolPool) {
        use crate::agent::compact::peers::PeerStrategy;
        let config = &self.strategy.compact.peer;
        if config.strategy == PeerStrategy::None && self.peer_probe.is_none() {
            return;
        }
        let base_chars: usize = system.iter().map(|b| b.text.len()).sum::<usize>() + pool.tools_chars();
        let window = crate::agent::compact::peers::peer_window(world.context_window);
        if config.strategy == PeerStrategy::None {
            // Probing (`probe_peers`): what a count-triggered mechanism would compare here, on
            // the history as normalized (as the mechanism reads it), the memo's where the
            // request's messages are finished in it.
            // Stamped, the messages the probe read last time are not read again.
            let (history, stamp, shared) = self.message_memo.raw_stamped().map_or((&messages[front..], 0, None), |view| (view.messages, view.stamp, view.shared));
            let counted = self.peer_state.probe_stamped(history, (base_chars / 4) as u64, stamp, shared);
            // (And what the mechanisms run dry would do.)
            for (tag, config) in &self.peer_dry {
                match self.peer_state.dry_run_stamped(config, history, window, (base_chars / 4) as u64, stamp) {
                    Some(outcomes) => self.peer_dry_reports.extend(outcomes.into_iter().filter(|o| !o.stage.is_empty()).map(|o| (*tag, peer_report(o)))),
                    None => {
                        if let Some(probe) = &mut self.peer_probe {
                            probe.rewrote.push(*tag);
                        }
                    }
                }
            }
            if let Some(probe) = &mut self.peer_probe {
                probe.counted = probe.counted.max(Some(counted));
            }
            return;
        }
        for outcome in self.peer_state.apply_after(config, messages, front, window, (base_chars / 4) as u64) {
            if outcome.stage.is_empty() {
                continue;
            }
            if outcome.fired {
                let event = match outcome.stage {
                    "codex_compact" | "opencode_summary" | "server_compaction" => "compaction",
                    "cline_truncate" => "truncation",
                    _ => "context_editing",
                };
                if !self.events.iter().any(|e| e == event) {
                    self.events.push(event.to_owned());
                }
            }
            self.peer_reports.push(peer_report(outcome));
        }
    }

    /// Under no peer mechanism, records from now on the count a count-triggered one
    /// ([`crate::agent::compact::peers::PeerConfig::rewrite_trigger`]) would compare with its
    /// trigger on every request's messages ([`Session::take_peer_probe`]). The probe reads the
    /// history as a mechanism would (as normalized: MCP results not yet blocks, tool results
    /// not finalized), which the message memo keeps beside the finished history it builds the
    /// request from as under no mechanism ([`MessageMemo::raw`]): the same requests, the
    /// history not finished again per request.
    /// Whether MCP server instructions were there to place is recorded too, wherever either
    /// placement ([`McpInstructionsMode`]) reads them.
    pub fn probe_peers(&mut self, on: bool) {
        self.peer_probe = on.then(PeerProbe::default);
        if !on {
            self.dry_run_peers(Vec::new());
        }
    }

    /// While probing ([`Session::probe_peers`]), runs each of `configs` (mechanisms that
    /// [`crate::agent::compact::peers::PeerConfig::dry_runs`], each with a tag) dry on every
    /// request's messages, on this session's peer state
    /// ([`crate::agent::compact::peers::PeerState::dry_run`]): whether it would have rewritten
    /// anything ([`PeerProbe::rewrote`]) and, request by request, what it would have reported
    /// ([`PeerProbe::reports`]). A tag dropped from the list is forgotten, reports included.
    pub fn dry_run_peers(&mut self, configs: Vec<(usize, crate::agent::compact::peers::PeerConfig)>) {
        self.peer_dry_reports.retain(|(tag, _)| configs.iter().any(|(t, _)| t == tag));
        self.peer_dry = configs;
    }

    /// What [`Session::probe_peers`] recorded since the last call (nothing when not probing).
    pub fn take_peer_probe(&mut self) -> PeerProbe {
        self.peer_probe.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// While probing: notes whether connected MCP servers have instructions now.
    fn probe_mcp(&mut self, world: &World) {
        if self.peer_probe.is_some() && !self.mcp_instructions(world).is_empty()
            && let Some(probe) = &mut self.peer_probe
        {
            probe.mcp_instructions = true;
        }
    }

    /// Shares the messages the session keeps from request to request with every later copy
    /// of it (a run's checkpoints) rather than copying them into each
    /// ([`MessageMemo::freeze`]).
    pub fn freeze(&mut self) {
        self.message_memo.freeze();
    }

    /// This session as text, without what only saves work and what only names allocations:
    /// the peer mechanism's memo, the MCP and finalize memos, the system prompt's gathered
    /// inputs (kept by the file system's change marks, which every copy of a world renews), the
    /// last pool, and what the message memo lent the last request. Two sessions with one text
    /// go on alike (for debug builds' comparisons of run states).
    #[cfg(debug_assertions)]
    pub fn shown_without_memos(&self) -> String {
        let mut session = self.clone();
        session.peer_state = self.peer_state.without_memo();
        session.mcp_memo = Default::default();
        session.finalize_memo = Default::default();
        session.system_gathered = None;
        session.pool_memo = Default::default();
        (session.lent_offset, session.lent_unchanged, session.lent_shared) = (None, 0, 0);
        format!("{session:?}")
    }

    /// Compactions of the conversation so far.
    pub fn compactions(&self) -> u32 {
        self.compactions
    }

    /// What the peer mechanism did while the last request was built.
    pub fn take_peer_reports(&mut self) -> Vec<crate::measure::StageReport> {
        if let Some(probe) = &mut self.peer_probe
            && !self.peer_dry.is_empty()
        {
            probe.reports.push(std::mem::take(&mut self.peer_dry_reports));
        }
        std::mem::take(&mut self.peer_reports)
    }

    /// Events produced while building a side request go back to the queue of the next one.
    fn requeue_events(&mut self, events: Vec<String>) {
        for event in events.into_iter().rev() {
            if !self.events.contains(&event) {
                self.events.insert(0, event);
            }
        }
    }

    /// The message marker a request on `lane` carries.
    fn marker_for(&self, lane: &str) -> Option<CacheControl> {
        self.strategy.prompt_caching.then(|| CacheControl::ephemeral().with_ttl(self.strategy.ttl_for(lane)))
    }

    /// `/clear`: SessionEnd hooks (reason `clear`), then a new conversation under a new session
    /// id. The transcript goes, and with it every session cache (`clearSessionCaches`): the
    /// system sections and the git snapshot, the user context and memory files, the sent skill
    /// names, read files, nested memory, todos, discovered tools, announced deltas, relevant
    /// memories and the long-context chain's state. SessionStart hooks with source `clear` open
    /// the new conversation. Journals `conversation_cleared`.
    pub fn clear(&mut self, world: &mut World) {
        self.hooks(world, "SessionEnd", "clear", json!({"reason": "clear"}));
        self.clears += 1;
        let mut rng = world.rng.fork("session").fork(&format!("clear{}", self.clears));
        self.session_id = uuid_v4(rng.next_u64(), rng.next_u64());
        self.metadata = request_metadata(&self.device_id, &self.session_id);
        self.start_new_conversation();
        self.chain_state = crate::agent::compact::ChainState::new(session_dir(world, &self.session_id));
        self.peer_state = Default::default();
        self.clear_session_caches();
        self.start_again(world, "clear", "conversation_cleared");
    }

    /// Journals `event` and runs the SessionStart hooks of `source`, whose messages open (or
    /// follow) the conversation.
    fn start_again(&mut self, world: &mut World, source: &str, event: &str) {
        self.events.push(event.into());
        let messages = self.session_start_messages(world, source);
        self.push_attachments(messages);
        self.settle_hook_time(world);
    }

    /// The read state a resumed client rebuilds from its transcript: each Read call's path, read
    /// at the time of the record holding the call (not at the file's modification time).
    fn reads_in_transcript(&self) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        for (record, meta) in self.records.iter().zip(&self.record_meta) {
            let Record::Assistant { content } = record else { continue };
            for block in content.iter() {
                if let ContentBlock::ToolUse { name, input, .. } = block
                    && name == "Read"
                    && let Some(path) = input.get("file_path").and_then(Value::as_str)
                {
                    out.insert(crate::agent::skills::tool_path(path).into_owned(), meta.timestamp_ms as i64);
                }
            }
        }
        out
    }

    /// `clearSessionCaches` (`/clear` and a resume): the system sections and the git snapshot,
    /// the user context and memory files, the read files and the nested memory loaded.
    fn clear_session_caches(&mut self) {
        self.system_cache.clear_session();
        self.git_snapshot = None;
        self.user_context = None;
        self.memory = None;
        self.read_state.clear();
        self.nested_triggers.clear();
        self.loaded_nested.clear();
    }

    /// Forgets the conversation and what the client keeps per conversation: the transcript,
    /// the sent skill names, discovered tools, invoked skills, todos, nested memory, announced
    /// deltas, relevant memories, the Stop-hook count (`/clear` and a new subagent).
    fn start_new_conversation(&mut self) {
        self.records.clear();
        self.record_meta.clear();
        self.forget_entries();
        self.sent_skill_names.clear();
        self.discovered_tools.clear();
        self.sent_tools.clear();
        self.invoked_skills.clear();
        self.todos.clear();
        self.turns_since_todo_write = 0;
        self.turns_since_todo_reminder = 0;
        self.nested_triggers.clear();
        self.loaded_nested.clear();
        self.announced_deferred.clear();
        self.announced_agents.clear();
        self.announced_mcp.clear();
        self.memories.reset();
        self.stop_continuations = 0;
    }

    /// `--resume` in a new process: SessionEnd hooks (reason `other`) close the process that
    /// ended; the transcript stays, but every per-process cache starts afresh: the memoized
    /// system sections and git snapshot, the user context and memory files, the Agent tool's
    /// frozen listing, nested memory and the date last seen. The skill listing does not come
    /// back from the transcript: as the oracle saw, it is attached again to the next prompt;
    /// 2.1.88 drops the path-scoped rules sent beside a Read result too (the capture's resumed
    /// request). The read files are rebuilt from the transcript's Read calls, each read at the
    /// time of its record, so a file modified after that time is announced with the next prompt
    /// (`edited_text_file`, before the skill listing, as the capture shows). SessionStart hooks
    /// with source `resume` follow the resumed messages. Journals `session_resumed`.
    pub fn resume(&mut self, world: &mut World) {
        self.hooks(world, "SessionEnd", "other", json!({"reason": "other"}));
        self.clear_session_caches();
        self.read_state = ReadState::from_seen(self.reads_in_transcript());
        self.agent_listing = None;
        self.last_date = None;
        self.stop_continuations = 0;
        // A new process: background agents of the old one never report.
        self.background.clear();
        let drop_rules = self.strategy.client_version != crate::agent::dialect::VERSION;
        let mut kept_records = Vec::with_capacity(self.records.len());
        let mut kept_meta = Vec::with_capacity(self.record_meta.len());
        for (i, record) in std::mem::take(&mut self.records).into_iter().enumerate() {
            if matches!(&record, Record::Attachment { attachment, .. } if matches!(**attachment, Attachment::SkillListing { .. })) {
                continue;
            }
            if drop_rules && matches!(&record, Record::Attachment { attachment, .. } if matches!(**attachment, Attachment::NestedMemory { .. })) {
                continue;
            }
            if let Some(meta) = self.record_meta.get(i) {
                kept_meta.push(meta.clone());
            }
            kept_records.push(match record {
                // Hook context written inside a tool loop is a plain attachment once re-read.
                Record::Attachment { attachment, .. } => Record::Attachment { attachment, in_loop: false },
                other => other,
            });
        }
        self.records = kept_records;
        self.record_meta = kept_meta;
        self.forget_entries();
        self.sent_skill_names.clear();
        self.start_again(world, "resume", "session_resumed");
    }

    /// The post-compact cleanup (`runPostCompactCleanup`): memoized system sections, the user
    /// context and the memory files are computed afresh on the next request; the skill listing
    /// is not sent again; the relevant-memory count starts again; PostCompact and
    /// SessionStart(compact) hooks run.
    fn after_compaction(&mut self) {
        self.compactions += 1;
        self.system_cache.clear_sections();
        self.user_context = None;
        self.memory = None;
        self.loaded_nested.clear();
        self.memories.reset();
    }


    pub fn strategy(&self) -> &Strategy {
        &self.strategy
    }

    /// The transcript as the agent keeps it.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    pub fn todos(&self) -> &[Todo] {
        &self.todos
    }

    pub fn invoked_skills(&self) -> &[InvokedSkill] {
        &self.invoked_skills
    }

    /// Journals an event for the next request (the runner's world events go through here too).
    pub fn journal(&mut self, event: impl Into<String>) {
        self.events.push(event.into());
    }

    // -----------------------------------------------------------------------------------------
    // Turns
    // -----------------------------------------------------------------------------------------

    /// A prompt from the user: SessionStart hooks on the first, the prompt, UserPromptSubmit
    /// hooks, then the attachments of the turn. In-loop hook context of the previous turn now
    /// comes from the transcript as raw attachments and folds into its tool_result. The
    /// prompt's record holds `text` itself (shared with the script's step).
    pub fn user_prompt(&mut self, text: &crate::api::SharedText, world: &mut World) {
        let mut folded = false;
        debug_assert!(
            self.in_loop_written || !self.records.iter().any(|r| matches!(r, Record::Attachment { in_loop: true, .. })),
            "a record is an in-loop hook attachment though none was written since the last fold"
        );
        if std::mem::take(&mut self.in_loop_written) {
            for (i, record) in self.records.iter_mut().enumerate() {
                if let Record::Attachment { in_loop: in_loop @ true, .. } = record {
                    *in_loop = false;
                    if !folded {
                        self.message_memo.invalidate_from(i);
                    }
                    folded = true;
                }
            }
        }
        if folded && self.strategy.smoosh_into_tool_result {
            self.events.push("hook_context_folded".into());
        }
        if !self.session_started {
            self.session_started = true;
            self.run_session_start_hooks(world);
        }
        self.turn_mcp = self.mcp_instructions(world);
        self.probe_mcp(world);
        self.stop_continuations = 0;
        self.memories.pending = None;
        // The input is read only by a configured hook of the event (a scripted standalone
        // answer reads none): with none configured, none is made with a copy of the prompt
        // (debug builds run the hooks with it and compare).
        let configured = self.hook_sources().any(|hook| hook.event == "UserPromptSubmit");
        let run = self.hooks(world, "UserPromptSubmit", "", if configured { json!({"prompt": text}) } else { json!({}) });
        #[cfg(debug_assertions)]
        if !configured {
            let call = HookCall {
                event: "UserPromptSubmit",
                query: "",
                input: json!({"prompt": text}),
                session_id: &self.session_id,
                cwd: &world.cwd,
                run_real: self.strategy.run_hooks,
                session_end_timeout_ms: crate::agent::hooks::SESSION_END_TIMEOUT_MS,
            };
            debug_assert!(run_hooks(&self.configured_hooks(), &world.hook_answers, &call) == run, "the UserPromptSubmit hooks ran otherwise without the prompt");
        }
        if !run.blocking_errors.is_empty() || run.prevent_continuation {
            // The prompt is dropped; the user sees a warning that is never sent.
            self.settle_hook_time(world);
            return;
        }
        self.records.push(Record::User { content: MessageContent::Text(text.clone()), meta: false });
        let success: Vec<Attachment> = run
            .successes
            .iter()
            .map(|content| Attachment::HookSuccess { hook_name: "UserPromptSubmit".into(), content: content.clone() })
            .collect();
        let attachments = self.thread_attachments(world);
        self.push_attachments(attachments);
        self.push_attachments(success);
        if !run.additional_context.is_empty() {
            self.push_attachments(vec![Attachment::HookAdditionalContext {
                hook_name: "UserPromptSubmit".into(),
                lines: run.additional_context.clone(),
            }]);
        }
        self.settle_hook_time(world);
    }

    /// Every hook configured now: settings snapshot, plugin hooks, session hooks.
    pub fn configured_hooks(&self) -> Vec<ConfiguredHook> {
        self.hook_sources().cloned().collect()
    }

    /// The hooks in force, by reference, in [`Self::configured_hooks`]'s order: settings,
    /// plugins, session.
    fn hook_sources(&self) -> impl Iterator<Item = &ConfiguredHook> {
        self.settings_hooks.hooks.iter().chain(&self.plugin_hooks).chain(&self.session_hooks)
    }

    /// Warnings of the settings hooks snapshot (unknown events, bad JSON, ...).
    pub fn hook_warnings(&self) -> &[String] {
        &self.settings_hooks.warnings
    }

    /// Every hook run so far, in order.
    pub fn hook_log(&self) -> &[HookRun] {
        &self.hook_log
    }

    /// Whether a hook of `event` may run: a configured one (settings, plugin or session) or a
    /// scripted answer standing alone. Where none can, [`run_hooks`] returns an empty run.
    fn may_run_hooks(&self, world: &World, event: &str) -> bool {
        let configured = |hooks: &[ConfiguredHook]| hooks.iter().any(|h| h.event == event);
        configured(&self.settings_hooks.hooks)
            || configured(&self.plugin_hooks)
            || configured(&self.session_hooks)
            || world.hook_answers.iter().any(|a| a.command.is_none() && a.event == event)
    }

    /// [`Session::hooks`] with the input made only when a hook of `event` may run: the tool
    /// hooks' inputs copy the call's input and its result, for every call, and most sessions
    /// configure none. Debug builds run the hooks anyway and check the run is empty.
    fn hooks_made(&mut self, world: &World, event: &str, query: &str, input: impl FnOnce() -> Value) -> HookRun {
        if self.may_run_hooks(world, event) {
            return self.hooks(world, event, query, input());
        }
        let empty = HookRun { event: event.to_owned(), ..HookRun::default() };
        #[cfg(debug_assertions)]
        {
            let (wait, side, logged) = (self.hook_wait_ms, self.pending_side_calls.len(), self.hook_log.len());
            let run = self.hooks(world, event, query, input());
            debug_assert_eq!(run, empty, "no hook of {event} may run, yet the run is not empty");
            debug_assert_eq!((self.hook_wait_ms, self.pending_side_calls.len(), self.hook_log.len()), (wait, side, logged));
        }
        empty
    }

    /// Runs the hooks of `event` for `query`; the result is logged and returned.
    fn hooks(&mut self, world: &World, event: &str, query: &str, mut input: Value) -> HookRun {
        let configured = self.configured_hooks();
        if let (Some((agent_id, agent)), Some(fields)) = (self.thread.agent_id_and_definition(), input.as_object_mut()) {
            // Base fields of every hook input inside a subagent.
            fields.entry("agent_id").or_insert_with(|| Value::String(agent_id.to_owned()));
            fields.entry("agent_type").or_insert_with(|| Value::String(agent.agent_type.clone()));
        }
        let call = HookCall {
            event,
            query,
            input,
            session_id: &self.session_id,
            cwd: &world.cwd,
            run_real: self.strategy.run_hooks,
            session_end_timeout_ms: world
                .env_var("CLAUDE_CODE_SESSIONEND_HOOKS_TIMEOUT_MS")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(crate::agent::hooks::SESSION_END_TIMEOUT_MS),
        };
        let run = run_hooks(&configured, &world.hook_answers, &call);
        self.hook_wait_ms += run.elapsed_ms;
        for model_call in &run.model_calls {
            let side = self.hook_model_request(world, model_call);
            self.pending_side_calls.push(side);
        }
        if run.ran > 0 {
            self.hook_log.push(run.clone());
        }
        run
    }

    /// The request a `prompt` hook (one question) or an `agent` hook (a verifier with the
    /// read-only file tools) sends, with the scripted verdict as its reply; lane `side`, run
    /// alongside (its time is the hook's). Only the verifier's first request is modelled.
    fn hook_model_request(&self, world: &World, call: &crate::agent::hooks::HookModelCall) -> SideCall {
        use crate::agent::agents::alias_model;
        let model = match call.model.as_deref() {
            Some(model) => alias_model(model, &world.env).unwrap_or_else(|| model.to_owned()),
            None => alias_model("haiku", &world.env).unwrap_or_else(|| world.model_id.clone()),
        };
        let mut request = Request::new(model, HOOK_MAX_TOKENS);
        let instruction = if call.kind == "agent" { AGENT_HOOK_INSTRUCTION } else { PROMPT_HOOK_INSTRUCTION };
        request.system = Some(SystemPrompt::Blocks(vec![crate::api::SystemBlock::text(instruction)].into()));
        if call.kind == "agent" {
            let tools = ["Glob", "Grep", "Read"]
                .iter()
                .filter_map(|name| crate::agent::tools::builtin_tool(name, &self.profile, self.strategy.size_profile_padding))
                .map(|tool| tool.to_api())
                .collect();
            request.tools = Some(tools);
        }
        request.messages = vec![Message::user_text(call.prompt.clone())];
        let user_id = json!({"device_id": self.device_id, "account_uuid": "", "session_id": self.session_id}).to_string();
        request.metadata = Some(json!({"user_id": user_id}).into());
        SideCall { lane: "side".to_owned(), request, reply: Reply::text(call.verdict.clone()), time_ms: world.clock.now_ms(), concurrent: true }
    }

    /// Puts the time hooks took on the clock.
    pub(crate) fn settle_hook_time(&mut self, world: &mut World) {
        world.clock.advance(std::mem::take(&mut self.hook_wait_ms));
    }

    /// The side requests made since the last call (hook questions, the memory selection), for
    /// the caller to measure in order.
    pub fn take_side_calls(&mut self) -> Vec<SideCall> {
        std::mem::take(&mut self.pending_side_calls)
    }

    /// PreCompact hooks (matcher = trigger `manual`/`auto`): the custom instructions for the
    /// summary, `{user}\n\n{hook}` or whichever exists. Compaction is never blocked.
    pub fn pre_compact_instructions(&mut self, trigger: &str, user: Option<&str>, world: &World) -> Option<String> {
        let run = self.hooks(world, "PreCompact", trigger, json!({"trigger": trigger, "custom_instructions": user}));
        let hook = (!run.raw_outputs.is_empty()).then(|| run.raw_outputs.join("\n\n"));
        match (user.filter(|u| !u.trim().is_empty()), hook) {
            (Some(u), Some(h)) => Some(format!("{u}\n\n{h}")),
            (Some(u), None) => Some(u.to_owned()),
            (None, h) => h,
        }
    }

    /// PostCompact hooks: display-only; then SessionStart hooks with source `compact`, whose
    /// messages are returned for the post-compact message list.
    pub fn post_compact_hooks(&mut self, trigger: &str, summary: &str, world: &World) -> Vec<Attachment> {
        self.hooks(world, "PostCompact", trigger, json!({"trigger": trigger, "compact_summary": summary}));
        self.session_start_messages(world, "compact")
    }

    fn run_session_start_hooks(&mut self, world: &World) {
        let messages = self.session_start_messages(world, "startup");
        self.push_attachments(messages);
    }

    /// SessionStart: one `hook_success` per plain output (hookName `SessionStart:{source}`),
    /// then one `hook_additional_context` for all contexts.
    fn session_start_messages(&mut self, world: &World, source: &str) -> Vec<Attachment> {
        let run = self.hooks(world, "SessionStart", source, json!({"source": source, "model": world.model_id}));
        let mut messages: Vec<Attachment> = run
            .successes
            .iter()
            .map(|content| Attachment::HookSuccess { hook_name: format!("SessionStart:{source}"), content: content.clone() })
            .collect();
        if !run.additional_context.is_empty() {
            messages.push(Attachment::HookAdditionalContext { hook_name: "SessionStart".into(), lines: run.additional_context });
        }
        messages
    }

    /// An attachment the recorded client sent at this point of a workload (`attachment` step),
    /// sent as recorded.
    /// With `skill`, `text` is that skill's or slash command's body as the recorded client
    /// expanded it: remembered as invoked (the latest invocation of a name wins), so a
    /// compaction restores it as the client restores invoked skills.
    pub fn recorded_attachment(&mut self, kind: &str, text: &str, skill: Option<&str>, world: &World) {
        self.push_attachments(vec![Attachment::Recorded { kind: kind.to_owned(), text: text.into() }]);
        if let Some(name) = skill {
            self.invoked_skills.retain(|s| s.name != name);
            self.invoked_skills.push(InvokedSkill {
                name: name.to_owned(),
                path: crate::agent::skills::recorded_invoked_path(name, text, &world.cwd),
                content: text.to_owned(),
                invoked_at_ms: world.clock.now_ms(),
            });
        }
    }

    /// A microcompact the recorded client ran here (a `microcompact` step, as recorded): the
    /// results of `tool_use_ids` are cleared to the marker, and `history_chars` characters leave
    /// the start of the first prompt (the stand-in for the history before a continuing file,
    /// whose results it cleared). The next request is rebuilt from the changed records.
    pub fn recorded_microcompact(&mut self, tool_use_ids: &[String], history_chars: usize) {
        for record in &mut self.records {
            let Record::User { content: MessageContent::Blocks(blocks), .. } = record else { continue };
            for block in blocks {
                if let ContentBlock::ToolResult { tool_use_id, content, .. } = block
                    && tool_use_ids.contains(tool_use_id)
                {
                    *content = Some(crate::api::ToolResultContent::Text(crate::agent::compact::microcompact::CLEARED_MARKER.into()));
                }
            }
        }
        if history_chars > 0
            && let Some(Record::User { content: MessageContent::Text(text), .. }) = self.records.iter_mut().find(|r| matches!(r, Record::User { meta: false, .. }))
        {
            let cut = text.char_indices().nth(history_chars).map_or(text.len(), |(i, _)| i);
            text.replace_range(..cut, "");
        }
        self.forget_entries();
        self.events.push("microcompact".into());
    }

    /// A recorded resume that lost `tool_use_ids` (a `resume_lost` step, as recorded): the
    /// resumed client loaded its history from the transcript's `parentUuid` chain, without these
    /// tool uses and their results. Records left empty go too; the next request is rebuilt. An
    /// id that names no tool use of the conversation is reported (`resume_lost_unknown:ID,...`),
    /// not passed over in silence.
    pub fn recorded_resume_loss(&mut self, tool_use_ids: &[String]) {
        let present: std::collections::BTreeSet<&str> = self
            .records
            .iter()
            .filter_map(|record| match record {
                Record::Assistant { content } => Some(content.iter()),
                _ => None,
            })
            .flatten()
            .filter_map(|block| match block {
                ContentBlock::ToolUse { id, .. } => Some(id.as_str()),
                _ => None,
            })
            .collect();
        let unknown: Vec<&str> = tool_use_ids.iter().map(String::as_str).filter(|id| !present.contains(id)).collect();
        if !unknown.is_empty() {
            let event = format!("resume_lost_unknown:{}", unknown.join(","));
            self.events.push(event);
        }
        let lost = |block: &ContentBlock| match block {
            ContentBlock::ToolUse { id, .. } => tool_use_ids.contains(id),
            ContentBlock::ToolResult { tool_use_id, .. } => tool_use_ids.contains(tool_use_id),
            _ => false,
        };
        self.records.retain_mut(|record| match record {
            Record::Assistant { content } => {
                content.retain(|b| !lost(b));
                !content.is_empty()
            }
            Record::User { content: MessageContent::Blocks(blocks), .. } => {
                if blocks.iter().any(lost) {
                    blocks.retain(|b| !lost(b));
                }
                !blocks.is_empty()
            }
            _ => true,
        });
        self.forget_entries();
        self.events.push("resume_lost_results".into());
    }

    /// The script supplies this thread's attachments (`world.recorded_attachments`): the main
    /// thread adds none of its own.
    fn attachments_recorded(&self, world: &World) -> bool {
        world.recorded_attachments && !self.thread.is_subagent()
    }

    fn push_attachments(&mut self, attachments: Vec<Attachment>) {
        self.records.extend(attachments.into_iter().map(|attachment| Record::Attachment { attachment: attachment.into(), in_loop: false }));
    }

    /// Appends the model's reply, runs its tools and records what they produced. Returns the
    /// events it journalled (also kept for the next request). An Agent call runs a whole
    /// subagent, whose requests go through `calls`; a failure there (its lane has no reply
    /// left) is the error.
    pub fn apply_reply(&mut self, reply: &Reply, world: &mut World, calls: &mut dyn ModelCalls) -> Result<Vec<String>, String> {
        let before = self.events.len();
        self.stop_continued = false;
        self.records.push(Record::Assistant { content: reply.content.clone() });
        self.turns_since_todo_write += 1;
        self.turns_since_todo_reminder += 1;
        let tool_calls: Vec<(&String, &String, &Value)> = reply
            .content
            .iter()
            .filter_map(|block| match block {
                ContentBlock::ToolUse { id, name, input, .. } => Some((id, name, input)),
                _ => None,
            })
            .collect();
        if tool_calls.is_empty() {
            self.run_stop_hooks(reply, world);
            self.settle_hook_time(world);
            if !self.stop_continued {
                // The turn ends: background agents run now and report back.
                self.run_background_agents(world, calls)?;
            }
            return Ok(self.events[before..].to_vec());
        }
        let pool = self.pool(world);
        // Only a ToolSearch call reads the deferred tools, only a Skill call the skills: each
        // list is made for a reply that calls its tool.
        let calls_tool = |tool: &str| tool_calls.iter().any(|(_, name, _)| *name == tool);
        let deferred: Vec<(String, String)> = if calls_tool("ToolSearch") {
            pool.all.iter().filter(|t| t.deferred).map(|t| (t.tool.name.clone(), t.tool.description.clone().unwrap_or_default())).collect()
        } else {
            Vec::new()
        };
        let all_skills = if calls_tool("Skill") { self.skills(world) } else { Vec::new() };
        let skills: Vec<(String, String, String)> =
            all_skills.iter().map(|s| (s.name.clone(), s.dir.clone(), s.invocation_body(&self.session_id))).collect();
        let cx = ExecContext {
            limits: crate::agent::tools::exec::OutputLimits::from_strategy(&self.strategy),
            deferred: &deferred,
            skills: &skills,
            tool_search: pool.tool_search || self.strategy.client_version == crate::agent::dialect::VERSION,
        };
        let mut results = Vec::new();
        let mut hook_context = Vec::new();
        let mut meta_messages = Vec::new();
        for &(id, name, input) in &tool_calls {
            // PreToolUse: deny > ask > allow; `updatedInput` replaces the input the tool runs
            // with (the tool_use block keeps what the model sent); additionalContext rides along.
            let pre = self.hooks_made(world, "PreToolUse", name, || json!({"tool_name": name, "tool_input": input, "tool_use_id": id}));
            if !pre.additional_context.is_empty() {
                hook_context.push(Attachment::HookAdditionalContext { hook_name: format!("PreToolUse:{name}"), lines: pre.additional_context.clone() });
            }
            if let Some(text) = pre.denial(name) {
                self.settle_hook_time(world);
                results.push(ContentBlock::tool_result(id.clone(), ToolResultContent::Text(text.into()), Some(true)));
                continue;
            }
            // `ask` puts the call to the user; the simulated user approves (ARCHITECTURE.md, Hooks).
            let _ = pre.permission == Some(Permission::Ask);
            let input: std::borrow::Cow<'_, Value> = match pre.effective_input() {
                Some(updated) => std::borrow::Cow::Owned(updated.clone()),
                None => std::borrow::Cow::Borrowed(input),
            };
            self.settle_hook_time(world);
            let in_pool = pool.all.iter().any(|t| t.tool.name == *name);
            // ToolSearch's presence is the executor's call (`ExecContext::tool_search`).
            let refused = !in_pool && name != "ToolSearch" && !name.starts_with("mcp__");
            let outcome = if refused && !world.tool_outputs.contains_key(id) {
                // A built-in the pool does not hold (a disallowed tool): the client answers
                // with an error result and runs nothing.
                ExecOutcome::text(id, format!("No such tool available: {name}"), true)
            } else if (name == "Agent" && !world.tool_outputs.contains_key(id) && in_pool) || world.tool_outputs.get(id).is_some_and(|o| o.runs_subagent) {
                let outcome = if crate::agent::dialect::background_agents(&self.strategy.client_version) && !self.thread.is_subagent() {
                    self.launch_agent(id, &input, world)
                } else {
                    self.run_agent(id, &input, world, calls)?
                };
                // A recorded subagent (a workload's, `subagent: true`): the agent ran it on its
                // lane; the call returns what the recorded one returned.
                if world.tool_outputs.contains_key(id) { execute(id, name, &input, world, &cx) } else { outcome }
            } else {
                execute(id, name, &input, world, &cx)
            };
            if let Some(path) = &outcome.read_path {
                self.nested_triggers.push(path.clone());
            }
            for path in &outcome.touched {
                if let Ok(entry) = world.fs.entry(path) {
                    self.read_state.insert(path.clone(), entry.mtime_ms);
                }
                self.activate_conditional_skills(path, world);
            }
            if let Some(todos) = outcome.todos.clone() {
                self.todos = todos;
                self.turns_since_todo_write = 0;
            }
            if let Some((skill, dir, body)) = outcome.invoked_skill.clone() {
                // Frontmatter hooks become session hooks, namespaced by the skill's directory.
                if let Some(hooks) = all_skills.iter().find(|s| s.name == skill).and_then(|s| s.fields.hooks.clone())
                    && !self.session_hooks.iter().any(|h| h.root.as_deref() == Some(dir.as_str()))
                {
                    let parsed = crate::agent::hooks::parse_hooks(&hooks, crate::agent::hooks::HookSource::Session, Some(&dir), &skill);
                    self.session_hooks.extend(parsed.hooks);
                }
                let path = all_skills.iter().find(|s| s.name == skill).map(|s| crate::agent::skills::invoked_path(s, &Session::config_home(world)));
                self.invoked_skills.retain(|s| s.name != skill);
                self.invoked_skills.push(InvokedSkill { name: skill, path, content: body, invoked_at_ms: world.clock.now_ms() });
            }
            self.discovered_tools.extend(outcome.loaded_tools.iter().cloned());
            if let Some(message) = outcome.meta_message.clone() {
                meta_messages.push(message);
            }
            let succeeded = !matches!(&outcome.result, ContentBlock::ToolResult { is_error: Some(true), .. });
            let mut result = outcome.result;
            let event = if succeeded { "PostToolUse" } else { "PostToolUseFailure" };
            let post_input = || {
                let response = match &result {
                    ContentBlock::ToolResult { content: Some(ToolResultContent::Text(t)), .. } => Value::String(String::clone(t)),
                    _ => Value::Null,
                };
                let mut post_input = json!({"tool_name": name, "tool_input": input, "tool_use_id": id});
                post_input[if succeeded { "tool_response" } else { "error" }] = response;
                post_input
            };
            let post = self.hooks_made(world, event, name, post_input);
            self.settle_hook_time(world);
            if let (Some(output), ContentBlock::ToolResult { content, .. }) = (&post.updated_output, &mut result) {
                let text = match output {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                *content = Some(ToolResultContent::Text(text.into()));
            }
            results.push(result);
            if !post.additional_context.is_empty() {
                hook_context.push(Attachment::HookAdditionalContext { hook_name: format!("{event}:{name}"), lines: post.additional_context.clone() });
            }
            for error in &post.blocking_errors {
                let (command, error) = split_blocking(error);
                hook_context.push(Attachment::HookBlockingError { hook_name: format!("{event}:{name}"), command, error });
            }
            if post.prevent_continuation {
                hook_context.push(Attachment::HookStoppedContinuation {
                    hook_name: format!("{event}:{name}"),
                    message: post.stop_reason.clone().unwrap_or_default(),
                });
            }
        }
        self.records.push(Record::User { content: MessageContent::Blocks(results.into()), meta: false });
        self.in_loop_written |= !hook_context.is_empty();
        self.records.extend(hook_context.into_iter().map(|attachment| Record::Attachment { attachment: attachment.into(), in_loop: true }));
        for message in meta_messages {
            self.records.push(Record::User { content: MessageContent::Blocks(vec![ContentBlock::text(message)].into()), meta: true });
        }
        let attachments = self.thread_attachments(world);
        self.push_attachments(attachments);
        // The turn's memory prefetch is consumed after its first tool round, deduplicated
        // against the files read by then.
        if let Some(chosen) = self.memories.pending.take() {
            let read_state = &self.read_state;
            let admitted = self.memories.admit(chosen, &|path| read_state.contains(path));
            let memories = admitted.into_iter().map(|m| Attachment::RelevantMemory { path: m.path, header: m.header, content: m.content }).collect();
            self.push_attachments(memories);
        }
        self.settle_hook_time(world);
        Ok(self.events[before..].to_vec())
    }

    /// Stop hooks after a reply without tool calls (`SubagentStop` inside a subagent, matched
    /// on its agent type): a blocking hook adds the meta message `{event} hook feedback:\n{err}`
    /// and the loop continues (the script's next reply on the thread's lane), at most
    /// `stop_hook_cap` times in a row.
    fn run_stop_hooks(&mut self, reply: &Reply, world: &mut World) {
        let last = reply.content.iter().rev().find_map(|b| match b {
            ContentBlock::Text { text, .. } => Some(text.clone()),
            _ => None,
        });
        let active = self.stop_continuations > 0;
        let mut input = json!({"stop_hook_active": active, "last_assistant_message": last});
        let (event, query) = match self.thread.agent_id_and_definition() {
            None => ("Stop", String::new()),
            Some((agent_id, agent)) => {
                input["agent_transcript_path"] = Value::String(format!("{}/subagents/agent-{agent_id}.jsonl", session_dir(world, &self.session_id)));
                ("SubagentStop", agent.agent_type.clone())
            }
        };
        let run = self.hooks(world, event, &query, input);
        if run.blocking_errors.is_empty() || run.prevent_continuation || self.stop_continuations >= self.strategy.stop_hook_cap {
            return;
        }
        self.stop_continuations += 1;
        self.stop_continued = true;
        let feedback = format!("{event} hook feedback:\n{}", run.blocking_errors.join("\n"));
        self.records.push(Record::User { content: MessageContent::Blocks(vec![ContentBlock::text(feedback)].into()), meta: true });
    }

    /// The thread group of `getAttachments`, in the reference order: date_change,
    /// deferred_tools_delta, agent_listing_delta, mcp_instructions_delta, edited_text_file,
    /// nested_memory, skill_listing, todo_reminder.
    /// Starts the turn's relevant-memory prefetch (gate on, main thread, a prompt of two words
    /// or more, memory files to choose from): the selection request joins the side calls (lane
    /// `side`, see [`Session::take_side_calls`]), and the chosen memories wait for the turn's first tool round. A reply that
    /// is not scripted is the deterministic word-overlap choice.
    pub fn prefetch_relevant_memories(&mut self, prompt: &str, world: &mut World) {
        use crate::agent::memories;
        if !self.strategy.relevant_memories || self.thread.is_subagent() || !memories::prompt_qualifies(prompt) {
            return;
        }
        let Some(dir) = self.auto_memory_dir(world) else { return };
        let candidates = memories::scan(&world.fs, &dir);
        if candidates.is_empty() {
            return;
        }
        let model = crate::agent::agents::alias_model("sonnet", &world.env).unwrap_or_else(|| world.model_id.clone());
        let mut request = Request::new(model, SELECTION_MAX_TOKENS);
        request.system = Some(SystemPrompt::Blocks(vec![crate::api::SystemBlock::text(memories::SELECTION_INSTRUCTION)].into()));
        request.messages = vec![Message::user_text(memories::selection_message(prompt, &candidates))];
        let user_id = json!({"device_id": self.device_id, "account_uuid": "", "session_id": self.session_id}).to_string();
        request.metadata = Some(json!({"user_id": user_id}).into());
        let reply = match world.model.next_reply("side") {
            Ok(reply) if !reply.synthetic => reply,
            _ => {
                let chosen = memories::select_by_words(prompt, &candidates);
                Reply::text(json!({"selected_memories": chosen}).to_string())
            }
        };
        let text: String = reply
            .content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        let now = world.clock.now_ms();
        let chosen = memories::parse_selection(&text, &candidates)
            .into_iter()
            .filter_map(|name| candidates.iter().find(|c| c.name == name))
            .filter_map(|c| {
                let content = world.fs.read(&c.path).ok()?;
                Some(memories::SurfacedMemory { path: c.path.clone(), header: memories::header(&c.path, c.mtime_ms, now as i64), content: memories::clip(content) })
            })
            .collect();
        self.memories.pending = Some(chosen);
        self.pending_side_calls.push(SideCall { lane: "side".to_owned(), request, reply, time_ms: now, concurrent: true });
    }

    /// The delta attachments compaction re-injects (§5.1), each announcing everything current,
    /// in the thread group's order, with the announced sets they leave behind.
    pub(crate) fn compaction_deltas(&self, world: &World) -> (Vec<Attachment>, AnnouncedSets) {
        let mut out = Vec::new();
        let mut sets = AnnouncedSets::default();
        if self.attachments_recorded(world) {
            // The recorded client's own re-announcements follow the boundary in the script.
            return (out, sets);
        }
        let pool = self.pool(world);
        if self.strategy.deferred_tools_delta && pool.tool_search {
            sets.deferred = pool.deferred_names.iter().cloned().collect();
            if !sets.deferred.is_empty() {
                out.push(Attachment::DeferredToolsDelta { added: sets.deferred.iter().cloned().collect(), removed: Vec::new() });
            }
        }
        if self.strategy.agent_list_in_messages && pool.all.iter().any(|t| t.tool.name == "Agent") {
            sets.agents = self.agent_catalog(world).sorted_lines();
            let mut lines: Vec<(&String, &String)> = sets.agents.iter().collect();
            lines.sort_by(|a, b| crate::agent::tools::locale_compare(a.0, b.0));
            out.push(Attachment::AgentListingDelta { added: lines.into_iter().map(|(_, l)| l.clone()).collect(), removed: Vec::new(), initial: true });
        }
        if self.strategy.mcp_instructions == McpInstructionsMode::Delta {
            let mut now: Vec<(String, String)> = self.mcp_instructions(world).into_iter().map(|s| (s.name, s.instructions)).collect();
            now.sort();
            sets.mcp = now.iter().map(|(n, _)| n.clone()).collect();
            if !now.is_empty() {
                out.push(Attachment::McpInstructionsDelta { added: now, removed: Vec::new() });
            }
        }
        (out, sets)
    }

    fn thread_attachments(&mut self, world: &World) -> Vec<Attachment> {
        if self.attachments_recorded(world) {
            return Vec::new();
        }
        self.probe_mcp(world);
        let mut out = Vec::new();
        let today = world.clock.date_string();
        match &self.last_date {
            None => self.last_date = Some(today),
            Some(last) if *last != today => {
                if self.strategy.date_change_attachment {
                    out.push(Attachment::DateChange { date: today.clone() });
                }
                self.events.push("date_changed".into());
                self.last_date = Some(today);
            }
            Some(_) => {}
        }
        let pool = self.pool(world);
        if self.strategy.deferred_tools_delta && pool.tool_search {
            let now: BTreeSet<String> = pool.deferred_names.iter().cloned().collect();
            let added: Vec<String> = now.difference(&self.announced_deferred).cloned().collect();
            let removed: Vec<String> = self.announced_deferred.difference(&now).cloned().collect();
            if !added.is_empty() || !removed.is_empty() {
                out.push(Attachment::DeferredToolsDelta { added, removed });
                self.announced_deferred = now;
            }
        }
        if self.strategy.agent_list_in_messages && pool.all.iter().any(|t| t.tool.name == "Agent") {
            // Announced by type: a redefinition of a known type is not announced again.
            let now = self.agent_catalog(world).sorted_lines();
            let mut added: Vec<(&String, &String)> = now.iter().filter(|(t, _)| !self.announced_agents.contains_key(*t)).collect();
            let mut removed: Vec<&String> = self.announced_agents.keys().filter(|t| !now.contains_key(*t)).collect();
            added.sort_by(|a, b| crate::agent::tools::locale_compare(a.0, b.0));
            removed.sort_by(|a, b| crate::agent::tools::locale_compare(a, b));
            if !added.is_empty() || !removed.is_empty() {
                out.push(Attachment::AgentListingDelta {
                    added: added.into_iter().map(|(_, line)| line.clone()).collect(),
                    removed: removed.into_iter().cloned().collect(),
                    initial: self.announced_agents.is_empty(),
                });
                self.announced_agents = now;
            }
        }
        if self.strategy.mcp_instructions == McpInstructionsMode::Delta {
            let mut now: Vec<(String, String)> =
                self.mcp_instructions(world).into_iter().map(|s| (s.name, s.instructions)).collect();
            now.sort();
            let names: BTreeSet<String> = now.iter().map(|(n, _)| n.clone()).collect();
            let added: Vec<(String, String)> = now.into_iter().filter(|(n, _)| !self.announced_mcp.contains(n)).collect();
            let removed: Vec<String> = self.announced_mcp.difference(&names).cloned().collect();
            if !added.is_empty() || !removed.is_empty() {
                out.push(Attachment::McpInstructionsDelta { added, removed });
                self.announced_mcp = names;
            }
        }
        for (path, entry) in self.read_state.take_changed(&world.fs) {
            let snippet: String = crate::agent::tools::exec::number_lines(&entry.contents, 0, usize::MAX);
            let snippet = if snippet.len() > 8192 {
                let cut: String = snippet.chars().take(8192).collect();
                let rest = snippet[cut.len()..].lines().count();
                format!("{cut}\n... [{rest} lines truncated] ...")
            } else {
                snippet
            };
            out.push(Attachment::EditedTextFile { path, snippet });
        }
        if self.strategy.nested_memory && self.strategy.claude_md {
            let triggers = std::mem::take(&mut self.nested_triggers);
            let discovery = self.memory(world);
            // (A copy, and the options, only when there is something to look for: it is read
            // while the loaded set is written.)
            let discovery = if triggers.is_empty() { Discovery::default() } else { discovery.clone() };
            let options = if triggers.is_empty() { None } else { Some(self.discovery_options(world)) };
            for (target, options) in triggers.into_iter().filter_map(|target| Some((target, options.as_ref()?))) {
                for (path, content) in nested_memory_for(&world.fs, options, &discovery, &target, &mut self.loaded_nested) {
                    let input = json!({"file_path": path, "memory_type": "Project", "load_reason": "nested_traversal", "trigger_file_path": target});
                    self.hooks(world, "InstructionsLoaded", "nested_traversal", input);
                    // An injected file enters the read state (layers-1-5 §5: so a compaction can
                    // restore it, and a later change to it is announced).
                    if let Ok(entry) = world.fs.entry(&path) {
                        self.read_state.insert(path.clone(), entry.mtime_ms);
                    }
                    out.push(Attachment::NestedMemory { path, content });
                }
            }
        }
        if pool.all.iter().any(|t| t.tool.name == "Skill") {
            let skills = self.skills_where(world, |s| !self.sent_skill_names.contains(&s.name));
            let fresh: Vec<&Skill> = skills.iter().collect();
            if !fresh.is_empty() {
                let window = world.context_window.unwrap_or(200_000) as f64;
                let budget = (window * 4.0 * self.strategy.skill_listing_budget_fraction).floor() as usize;
                let listing = format_listing(&fresh, budget, self.strategy.skill_description_max);
                self.sent_skill_names.extend(fresh.iter().map(|s| s.name.clone()));
                out.push(Attachment::SkillListing { listing });
            }
        }
        let todo_present = pool.all.iter().any(|t| t.tool.name == "TodoWrite");
        let n = self.strategy.todo_reminder_turns;
        if todo_present && n > 0 && self.turns_since_todo_write >= n && self.turns_since_todo_reminder >= n {
            out.push(Attachment::TodoReminder { todos: self.todos.clone() });
            self.turns_since_todo_reminder = 0;
        }
        out
    }

    // -----------------------------------------------------------------------------------------
    // MCP
    // -----------------------------------------------------------------------------------------

    /// A scripted server connects (late): its tools join the pool, its instructions the next
    /// turn's system prompt or a delta attachment.
    pub fn mcp_connect(&mut self, name: &str, world: &mut World) -> Result<(), String> {
        let server = world.mcp_servers.iter_mut().find(|s| s.name == name).ok_or_else(|| format!("no MCP server named `{name}`"))?;
        server.connected = true;
        self.events.push(format!("mcp_connected:{name}"));
        Ok(())
    }

    pub fn mcp_disconnect(&mut self, name: &str, world: &mut World) -> Result<(), String> {
        let server = world.mcp_servers.iter_mut().find(|s| s.name == name).ok_or_else(|| format!("no MCP server named `{name}`"))?;
        server.connected = false;
        self.events.push(format!("mcp_disconnected:{name}"));
        Ok(())
    }

    /// `tools/list_changed`: the server's tools are replaced.
    pub fn mcp_list_changed(&mut self, name: &str, tools: Vec<crate::world::McpToolDef>, world: &mut World) -> Result<(), String> {
        let server = world.mcp_servers.iter_mut().find(|s| s.name == name).ok_or_else(|| format!("no MCP server named `{name}`"))?;
        server.tools = tools;
        self.events.push(format!("mcp_tools_changed:{name}"));
        Ok(())
    }

    fn mcp_instructions(&self, world: &World) -> Vec<McpServerInstructions> {
        world
            .mcp_servers
            .iter()
            .filter(|s| s.connected)
            .filter_map(|s| {
                s.instructions.as_ref().map(|i| McpServerInstructions {
                    name: s.name.clone(),
                    instructions: crate::agent::system_prompt::truncate_marked(i, crate::agent::system_prompt::MCP_INSTRUCTIONS_MAX),
                })
            })
            .collect()
    }

    // -----------------------------------------------------------------------------------------
    // Request building
    // -----------------------------------------------------------------------------------------

    fn pool(&self, world: &World) -> std::rc::Rc<ToolPool> {
        // Most requests find the pool of the last one: that is seen without gathering the
        // inputs (which copies every MCP tool's schema).
        let kept = self.pool_memo.borrow_mut().as_mut().filter(|(key, _)| self.pool_key_holds(key, world)).map(|(key, pool)| {
            // The key takes the session's listing (equal, and perhaps made again since: a
            // resume drops it), so that the next request compares it by pointer.
            if let Some(listing) = &self.agent_listing {
                key.agent_listing.clone_from(listing);
            }
            std::rc::Rc::clone(pool)
        });
        if let Some(pool) = kept {
            debug_assert!(
                self.pool_memo.borrow().as_ref().is_some_and(|(key, _)| *key == self.pool_inputs(world)),
                "the pool memo's key seen to hold differs from the inputs gathered"
            );
            return pool;
        }
        let inputs = self.pool_inputs(world);
        // Assembly pads every built-in tool to the size profile (token counts of each
        // description): the same inputs give the same pool, so it is assembled once per change.
        let mut memo = self.pool_memo.borrow_mut();
        if let Some((key, pool)) = memo.as_ref()
            && *key == inputs
        {
            return std::rc::Rc::clone(pool);
        }
        let pool = self.assembled(&inputs);
        *memo = Some((inputs, std::rc::Rc::clone(&pool)));
        pool
    }

    /// The pool of `inputs` under this session's size profile, assembled once per thread
    /// ([`ASSEMBLED_POOLS`]).
    fn assembled(&self, inputs: &PoolInputs) -> std::rc::Rc<ToolPool> {
        ASSEMBLED_POOLS.with(|assembled| {
            let mut assembled = assembled.borrow_mut();
            if let Some((_, _, pool)) = assembled.iter().find(|(key, profile, _)| key == inputs && SizeProfile::same(profile, &self.profile)) {
                return std::rc::Rc::clone(pool);
            }
            let pool = std::rc::Rc::new(assemble_pool(inputs, &self.profile));
            if assembled.len() >= ASSEMBLED_POOLS_KEPT {
                assembled.remove(0);
            }
            assembled.push((inputs.clone(), self.profile.clone(), std::rc::Rc::clone(&pool)));
            pool
        })
    }

    /// The `tools` array this thread would send now with `ENABLE_TOOL_SEARCH=false` (every
    /// tool's schema up front, no ToolSearch): its pool assembled under that setting. What a
    /// mirror of that strategy sends in place of the run's ([`crate::runner::Mirror`]).
    pub fn tools_without_search(&self, world: &World) -> crate::api::SharedVec<crate::api::Tool> {
        let mut inputs = self.pool_inputs(world);
        inputs.enable_tool_search = Some("false".to_owned());
        self.assembled(&inputs).tools.clone()
    }

    /// `key` is what [`Session::pool_inputs`] would gather now, seen without gathering: `false`
    /// where that is not seen cheaply (a subagent's allowlist, an agent listing not kept).
    /// Every field is named, so a new one is not left out.
    fn pool_key_holds(&self, key: &PoolInputs, world: &World) -> bool {
        let PoolInputs {
            todo_v2,
            enable_tool_search,
            disable_experimental_betas,
            first_party,
            custom_base_url,
            model_id,
            context_window,
            mcp_tools,
            mcp_resources,
            mcp_pending,
            discovered,
            denied,
            allowed,
            agent_listing,
            padding,
        } = key;
        let Some(listing) = self.agent_listing.as_ref() else { return false };
        if self.thread.agent().is_some() || allowed.is_some() {
            return false;
        }
        let mut specs = mcp_tools.iter();
        let same_tools = world
            .mcp_servers
            .iter()
            .filter(|s| s.connected)
            .flat_map(|s| s.tools.iter().map(move |t| (s, t)))
            .all(|(s, t)| {
                specs.next().is_some_and(|spec| {
                    spec.server == s.name
                        && spec.tool == t.name
                        && spec.description == t.description
                        && spec.input_schema == t.input_schema
                        && spec.always_load == t.always_load
                })
            })
            && specs.next().is_none();
        *todo_v2 == self.strategy.interactive
            && *enable_tool_search == self.strategy.enable_tool_search
            && *disable_experimental_betas == self.strategy.disable_experimental_betas
            && *first_party == self.strategy.first_party
            && *custom_base_url == (self.strategy.base_url == BaseUrl::Custom)
            && model_id == self.model_id(world)
            && *context_window == world.context_window.unwrap_or(200_000)
            && same_tools
            && !*mcp_resources
            && *mcp_pending == world.mcp_servers.iter().any(|s| !s.connected)
            && *discovered == self.discovered_tools
            && denied.is_empty()
            && agent_listing.same(listing)
            && *padding == self.strategy.size_profile_padding
    }

    /// What the tool pool is assembled from, gathered from the strategy, the world and the thread.
    fn pool_inputs(&self, world: &World) -> PoolInputs {
        let mut inputs = PoolInputs {
            todo_v2: self.strategy.interactive,
            enable_tool_search: self.strategy.enable_tool_search.clone(),
            disable_experimental_betas: self.strategy.disable_experimental_betas,
            first_party: self.strategy.first_party,
            custom_base_url: self.strategy.base_url == BaseUrl::Custom,
            model_id: self.model_id(world).to_owned(),
            context_window: world.context_window.unwrap_or(200_000),
            mcp_tools: world
                .mcp_servers
                .iter()
                .filter(|s| s.connected)
                .flat_map(|s| {
                    s.tools.iter().map(|t| McpToolSpec {
                        server: s.name.clone(),
                        tool: t.name.clone(),
                        description: t.description.clone(),
                        input_schema: t.input_schema.clone(),
                        always_load: t.always_load,
                    })
                })
                .collect(),
            mcp_resources: false,
            mcp_pending: world.mcp_servers.iter().any(|s| !s.connected),
            discovered: self.discovered_tools.clone(),
            denied: BTreeSet::new(),
            allowed: None,
            agent_listing: self.agent_listing.clone().unwrap_or_else(|| self.current_agent_listing(world)),
            padding: self.strategy.size_profile_padding,
        };
        if let Some(agent) = self.thread.agent() {
            // The subagent's tools: the pool the parent would have, filtered by its definition.
            let mcp_names = inputs.mcp_tools.iter().map(|t| crate::agent::tools::mcp_tool_name(&t.server, &t.tool));
            let candidates = crate::agent::tools::all_builtin_names().into_iter().map(str::to_owned).chain(mcp_names);
            inputs.allowed = Some(candidates.filter(|name| agent.allows_tool(name)).collect());
        }
        inputs
    }

    /// The model this thread's requests go to.
    pub fn model_id<'a>(&'a self, world: &'a World) -> &'a str {
        self.thread.model().unwrap_or(&world.model_id)
    }

    fn config_home(world: &World) -> String {
        [world.home.trim_end_matches('/'), "/.claude"].concat()
    }

    fn auto_memory_dir(&self, world: &World) -> Option<String> {
        self.strategy.auto_memory.then(|| {
            let sanitized: String = world.cwd.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
            format!("{}/projects/{sanitized}/memory/", Session::config_home(world))
        })
    }

    fn discovery_options(&self, world: &World) -> DiscoveryOptions {
        DiscoveryOptions {
            cwd: world.cwd.clone(),
            config_home: Session::config_home(world),
            managed_dir: MANAGED_DIR.into(),
            excludes: world.claude_md_excludes.clone(),
            external_includes_approved: false,
            auto_memory_dir: self.auto_memory_dir(world),
            local: true,
        }
    }

    fn memory(&mut self, world: &World) -> &Discovery {
        if self.memory.is_none() {
            let discovery = if self.strategy.claude_md { discover(&world.fs, &self.discovery_options(world)) } else { Discovery::default() };
            // InstructionsLoaded: display-only, one run per file (matcher = load_reason).
            for file in &discovery.files {
                let input = json!({"file_path": file.path, "memory_type": format!("{:?}", file.kind), "load_reason": "session_start"});
                self.hooks(world, "InstructionsLoaded", "session_start", input);
            }
            self.memory = Some(discovery);
        }
        self.memory.as_ref().expect("just set")
    }

    /// Every skill the listing may show, in the reference's listing order: bundled, skill
    /// directories, plugin commands, plugin skills, dynamic (nested) skills; first of a name
    /// wins, conditional skills only once activated, `disable-model-invocation` ones never.
    pub fn skills(&self, world: &World) -> Vec<Skill> {
        self.skills_where(world, |_| true)
    }

    /// The skills of [`Session::skills`] that `keep` keeps, in that order: only those are
    /// copied (the agent looks for skills not yet listed at every step, and finds none on most).
    fn skills_where(&self, world: &World, keep: impl Fn(&Skill) -> bool) -> Vec<Skill> {
        let loaded = crate::agent::skills::load_skills_shared(&world.fs, &Session::config_home(world), &world.cwd);
        let dynamic = crate::agent::skills::load_skills_from_shared(&world.fs, &self.dynamic_skill_dirs, None);
        let candidates = crate::agent::skills::BUNDLED_SKILLS
            .iter()
            .chain(loaded.iter())
            .chain(self.plugins.iter().flat_map(|plugin| &plugin.commands))
            .chain(self.plugins.iter().flat_map(|plugin| &plugin.skills))
            .chain(dynamic.iter());
        // The names of the skills listed so far (the first of a name wins).
        let mut listed: Vec<&str> = Vec::new();
        let mut out: Vec<Skill> = Vec::new();
        for skill in candidates {
            if !skill.listed() || listed.contains(&skill.name.as_str()) {
                continue;
            }
            if skill.paths.is_empty() || self.activated_skills.contains(&skill.name) {
                listed.push(&skill.name);
                if keep(skill) {
                    out.push(skill.clone());
                }
            }
        }
        #[cfg(debug_assertions)]
        {
            let mut candidates = crate::agent::skills::bundled_skills();
            candidates.extend(crate::agent::skills::load_skills(&world.fs, &Session::config_home(world), &world.cwd));
            for plugin in &self.plugins {
                candidates.extend(plugin.commands.iter().cloned());
            }
            for plugin in &self.plugins {
                candidates.extend(plugin.skills.iter().cloned());
            }
            candidates.extend(crate::agent::skills::load_skills_from(&world.fs, &self.dynamic_skill_dirs, None));
            let mut all: Vec<Skill> = Vec::new();
            for skill in candidates {
                if !skill.listed() || all.iter().any(|s| s.name == skill.name) {
                    continue;
                }
                if skill.paths.is_empty() || self.activated_skills.contains(&skill.name) {
                    all.push(skill);
                }
            }
            all.retain(|skill| keep(skill));
            debug_assert!(all == out, "the skills kept differ from listing every skill and keeping them");
        }
        out
    }

    fn activate_conditional_skills(&mut self, path: &str, world: &World) {
        // Nested `.claude/skills` between the file and the cwd, each checked once; deeper
        // directories come first and win name conflicts.
        let mut fresh = Vec::new();
        for dir in crate::agent::skills::nested_skill_dirs_kept(&world.fs, path, &world.cwd, &mut self.nested_skill_dirs) {
            if self.checked_skill_dirs.insert(dir.clone()) {
                fresh.push(dir);
            }
        }
        if !fresh.is_empty() {
            fresh.extend(std::mem::take(&mut self.dynamic_skill_dirs));
            self.dynamic_skill_dirs = fresh;
        }
        let Some(relative) = crate::agent::instructions::relative_to(path, &world.cwd) else { return };
        // Read where the fs keeps them (no skill copied).
        let loaded = crate::agent::skills::load_skills_shared(&world.fs, &Session::config_home(world), &world.cwd);
        let dynamic = crate::agent::skills::load_skills_from_shared(&world.fs, &self.dynamic_skill_dirs, None);
        for skill in loaded.iter().chain(self.plugins.iter().flat_map(|p| &p.skills)).chain(dynamic.iter()) {
            if skill.paths.is_empty() || self.activated_skills.contains(&skill.name) {
                continue;
            }
            let hit = skill.paths.iter().any(|p| {
                let p = if p.contains('/') { p.trim_start_matches('/').to_owned() } else { format!("**/{p}") };
                globset::GlobBuilder::new(&p).literal_separator(true).build().is_ok_and(|g| g.compile_matcher().is_match(&relative))
            });
            if hit {
                self.activated_skills.insert(skill.name.clone());
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Plugins
    // -----------------------------------------------------------------------------------------

    /// Enables the plugin at `root` (a directory of the virtual filesystem) and refreshes every
    /// plugin, as `refreshActivePlugins` does.
    pub fn plugin_enable(&mut self, root: &str, world: &mut World) -> Result<(), String> {
        let root = root.trim_end_matches('/').to_owned();
        if !self.plugin_roots.contains(&root) {
            self.plugin_roots.push(root);
        }
        self.plugin_reload(world)
    }

    /// `refreshActivePlugins`: every enabled plugin re-read from the filesystem; commands,
    /// skills, hooks and MCP servers replaced as a whole; the sent-skill-names set reset so the
    /// full listing is sent again. Journals `plugin_reloaded`.
    pub fn plugin_reload(&mut self, world: &mut World) -> Result<(), String> {
        let mut plugins = Vec::new();
        for root in &self.plugin_roots {
            plugins.push(crate::agent::plugins::load_plugin(&world.fs, root)?);
        }
        self.plugin_hooks = plugins.iter().flat_map(|p| p.hooks.iter().cloned()).collect();
        world.mcp_servers.retain(|s| !s.name.starts_with("plugin:"));
        for plugin in &plugins {
            for (name, _) in &plugin.mcp_servers {
                world.mcp_servers.push(crate::world::McpServer { name: name.clone(), instructions: None, tools: Vec::new(), connected: true });
            }
        }
        self.plugins = plugins;
        self.sent_skill_names.clear();
        self.events.push("plugin_reloaded".into());
        Ok(())
    }

    pub fn plugins(&self) -> &[crate::agent::plugins::Plugin] {
        &self.plugins
    }

    fn user_context(&mut self, world: &World) -> crate::api::SharedText {
        self.ensure_user_context(world);
        self.user_context.clone().expect("just set")
    }

    /// Renders the user context once (until something clears it); [`Session::build_request`]
    /// reads it in place rather than copying it per request.
    fn ensure_user_context(&mut self, world: &World) {
        if self.user_context.is_none() {
            let mut files = self.memory(world).files.clone();
            if self.strategy.relevant_memories {
                // `filterInjectedMemoryFiles`: the index gives way to relevant memories.
                files.retain(|f| f.kind != crate::agent::user_context::MemoryKind::AutoMem);
            }
            let inputs = UserContextInputs {
                memory_files: files,
                claude_md_disabled: !self.strategy.claude_md,
                date: world.clock.date_string(),
                padding: self.strategy.size_profile_padding,
            };
            let text = RENDERED_CONTEXTS.with(|rendered| {
                let mut rendered = rendered.borrow_mut();
                if let Some((_, _, text)) = rendered.iter().find(|(key, profile, _)| *key == inputs && SizeProfile::same(profile, &self.profile)) {
                    debug_assert!(*text == render_user_context(&inputs, &self.profile), "a user context kept differs from rendering it again");
                    return text.clone();
                }
                let text = crate::api::SharedText::from(render_user_context(&inputs, &self.profile));
                if rendered.len() >= RENDERED_CONTEXTS_KEPT {
                    rendered.remove(0);
                }
                rendered.push((inputs, self.profile.clone(), text.clone()));
                text
            });
            self.user_context = Some(text);
        }
    }

    /// Takes back the messages of the last request built, once it is measured and no longer
    /// kept: the next request reuses them instead of copying the unchanged conversation
    /// ([`MessageMemo::give_back`], which finds what was changed in them since).
    ///
    /// `changed_from` is the first message the caller may have changed since the request was
    /// built (the list's length when it changed none); the ones before it and before the first
    /// the build changed are not compared.
    pub fn give_back_messages(&mut self, messages: Vec<Message>, changed_from: usize) {
        self.lent_shared = 0;
        if let Some(offset) = self.lent_offset.take() {
            self.message_memo.give_back(messages, offset, self.lent_unchanged.min(changed_from));
        }
    }

    /// How many leading messages of the last request built are the ones of the request that
    /// handed its messages back before it ([`Session::give_back_messages`]), as that request
    /// sent them and not changed since by the build: what the flattener that measured that
    /// request need not compare again, unless the caller changed them since.
    pub fn shared_messages(&self) -> usize {
        self.lent_shared
    }

    /// The main request after a run of the long-context chain: [`Session::build_request`] with
    /// the chain's API-side context management (cached microcompact's edits, the thinking-clear
    /// latch) merged into the body.
    pub fn build_request_after_chain(&mut self, world: &World, chain_run: &ChainRun) -> (Request, Vec<String>) {
        let (mut request, events) = self.build_request(world);
        request.context_management = crate::agent::compact::microcompact::merge_context_management(
            request.context_management.take(),
            chain_run.context_management.as_ref(),
            chain_run.thinking_clear_latched,
        );
        (request, events)
    }

    /// The request body for the conversation as it stands, and the events journalled since the
    /// previous request.
    pub fn build_request(&mut self, world: &World) -> (Request, Vec<String>) {
        if self.agent_listing.is_none() {
            self.agent_listing = Some(self.current_agent_listing(world));
        }
        let lane = self.lane();
        if self.git_snapshot.is_none() {
            self.git_snapshot = Some(self.git_status(world));
        }
        let pool = self.pool(world);
        for tool in &pool.tools {
            if tool.defer_loading == Some(true) && self.sent_tools.insert(tool.name.clone()) {
                self.events.push(format!("tool_loaded:{}", tool.name));
            }
        }

        self.ensure_user_context(world);
        let options = NormalizeOptions {
            // 2.1.332 keeps attachments beside a tool result (the smoosh gate is off there).
            smoosh_into_tool_result: self.strategy.smoosh_into_tool_result && self.strategy.client_version != crate::agent::dialect::VERSION,
            tool_loaded_sibling: self.strategy.tool_loaded_sibling,
            // 2.1.332 has tool search on even behind a custom base URL.
            strip_tool_references: !pool.tool_search && self.strategy.client_version != crate::agent::dialect::VERSION,
        };
        // With no peer mechanism and the 2.1.88 layout, nothing between normalizing and
        // finalizing rewrites the history: the memo keeps it finished (MCP results as blocks,
        // tool results finalized) and only the messages from `start` on are finalized here.
        // A peer mechanism's probe only reads the history as normalized, which the memo then
        // keeps beside it (`raw`).
        let dialect_layout = self.strategy.client_version == crate::agent::dialect::VERSION;
        let peer = !self.thread.is_subagent() && self.strategy.compact.peer.strategy != crate::agent::compact::peers::PeerStrategy::None;
        let probe = !self.thread.is_subagent() && !peer && self.peer_probe.is_some();
        let finish = !dialect_layout && !peer;
        let context = self.user_context.as_ref().expect("ensured above");
        // The deferred tools' listing goes in front of the history at once, where the memo
        // keeps its place (what reads the history before the marker, a peer mechanism and the
        // MCP results' rewrite, reads it after the listing); Claude Code 2.1.332's layout
        // places it itself.
        let front = (!dialect_layout && !self.strategy.deferred_tools_delta)
            .then(|| pool.deferred_listing())
            .flatten()
            .map(|listing| Message { role: Role::User, content: MessageContent::Text(listing), extra: Default::default() });
        let front_len = usize::from(front.is_some());
        let (mut messages, start) = self.message_memo.messages(context, &self.records, options, finish, front, finish && probe);
        let mut gathered = self.system_gathered.take();
        self.refresh_system_inputs(&mut gathered, world, &pool, first_text(&messages[front_len..]));
        let inputs = &gathered.as_ref().expect("refreshed above").inputs;
        #[cfg(debug_assertions)]
        {
            let fresh = self.system_inputs(world, &pool, first_text(&messages[front_len..]).to_owned());
            debug_assert!(*inputs == fresh, "the system prompt's inputs kept and brought up to date differ from gathering them");
        }
        let system_options = SystemPromptOptions {
            global_cache_scope: self.strategy.global_cache_scope && self.strategy.first_party && !self.strategy.disable_experimental_betas,
            boundary: self.strategy.dynamic_boundary,
            padding: self.strategy.size_profile_padding,
            ttl: self.strategy.ttl_for(&lane),
            prompt_caching: self.strategy.prompt_caching,
            attribution_header: self.strategy.attribution_header,
            dynamic_marker: world.dynamic_system_marker,
        };
        let system = match self.thread.agent() {
            None => self.system_cache.build_shared(inputs, &system_options, &self.profile),
            Some(agent) => {
                let sized_as = (agent.source == crate::agent::agents::AgentSource::BuiltIn).then_some(agent.agent_type.as_str());
                std::rc::Rc::new(build_subagent_system_prompt(inputs, &agent.prompt, agent_prompt_extra(agent, world), sized_as, &system_options, &self.profile))
            }
        };
        self.system_gathered = gathered;
        // The previous request's own build has no section changed.
        if let Some(previous) = self.previous_system.as_ref().filter(|previous| !std::rc::Rc::ptr_eq(previous, &system)) {
            for name in system.changed_sections(previous) {
                let event = if name == SECTION_ATTRIBUTION {
                    "billing_fingerprint_changed".to_owned()
                } else {
                    format!("system_section_changed:{name}")
                };
                if !self.events.contains(&event) {
                    self.events.push(event);
                }
            }
        }

        if !self.thread.is_subagent() {
            self.apply_peer(&mut messages, front_len, world, &system.blocks, &pool);
        }

        if !finish {
            crate::agent::dialect::mcp_results_as_blocks_memo(&mut messages[front_len..], &mut self.mcp_memo);
        }
        // How many messages at the end this request made (a peer mechanism, which may cut the
        // history, runs only when nothing is finished ahead).
        let made = if finish { messages.len() - start } else { 0 };
        // Claude Code 2.1.332's layout, main thread and subagents (src/agent/dialect.rs).
        let dialect = (self.strategy.client_version == crate::agent::dialect::VERSION).then(|| self.dialect_inputs(world, &pool));
        self.lent_offset = Some(front_len);
        // A finished history is rewritten only from `start` on (the marker goes on the last
        // message, which the memo's tail always makes); otherwise anything may have been.
        self.lent_unchanged = if finish { start.min(messages.len().saturating_sub(1)) } else { 0 };
        self.lent_shared = self.message_memo.lent_shared().min(self.lent_unchanged);
        if let Some(inputs) = &dialect {
            crate::agent::dialect::rewrite_results(&mut messages);
            crate::agent::dialect::relayout(&mut messages, inputs);
            self.lent_offset = None;
        }
        if let Some(marker) = self.marker_for(&lane) {
            match completed_last_result(&messages, world) {
                Some(k) => {
                    if let Some(MessageContent::Blocks(blocks)) = messages.last_mut().map(|m| &mut m.content) {
                        blocks[k].set_cache_control(Some(marker));
                    }
                }
                None => mark_last_block(&mut messages, marker),
            }
        }
        if finish {
            let from = messages.len() - made;
            finalize_tool_results(&mut messages[from..]);
        } else {
            crate::agent::normalize::finalize_tool_results_memo(&mut messages, &mut self.finalize_memo);
        }

        let model_id = self.model_id(world).to_owned();
        let max_tokens = world.max_output_tokens.unwrap_or(32_000);
        let mut request = Request::new(model_id.clone(), max_tokens);
        request.messages = messages;
        // Shared with the session's system prompt and tool pool: a reference count each.
        request.system = Some(SystemPrompt::Blocks(system.blocks.clone()));
        request.tools = Some(pool.tools.clone());
        debug_assert_eq!(self.metadata, request_metadata(&self.device_id, &self.session_id), "the metadata follows the ids");
        request.metadata = Some(self.metadata.clone());
        match self.thread.agent() {
            None if adaptive_thinking(&model_id) => {
                request.thinking = Some(ADAPTIVE_THINKING.clone());
                // `getAPIContextManagement`: no `clear_thinking` edit while thinking is redacted,
                // so the >1h-idle latch has nothing to switch to one turn.
                if !world.redact_thinking {
                    request.context_management = Some(KEEP_ALL_THINKING.clone());
                }
                request.output_config = Some(MEDIUM_EFFORT.clone());
            }
            None => {}
            Some(agent) => {
                // A subagent runs with thinking off, so no thinking-clearing edit either, and
                // the temperature the client sets when thinking is off. The effort stays the
                // model's (or the definition's `effort`).
                request.temperature = Some(json!(1).into());
                if let Some(effort) = &agent.effort {
                    request.output_config = Some(json!({"effort": effort}).into());
                } else if adaptive_thinking(&model_id) {
                    request.output_config = Some(MEDIUM_EFFORT.clone());
                }
            }
        }
        if dialect.is_some() {
            let marker = self.marker_for(&lane);
            let mut tools = crate::agent::dialect::tools(&request.messages, self.agent_listing.as_ref());
            let (max_tokens, thinking, mut output_config, context_management) = match self.thread.agent() {
                None => {
                    request.system = Some(SystemPrompt::Blocks(crate::agent::dialect::system_blocks(&system.blocks, marker, &request.messages).into()));
                    crate::agent::dialect::params()
                }
                Some(agent) => {
                    let built_in = agent.source == crate::agent::agents::AgentSource::BuiltIn;
                    let blocks = crate::agent::dialect::subagent_system_blocks(&system.blocks, marker, &request.messages, &agent_prompt(agent, world), built_in);
                    request.system = Some(SystemPrompt::Blocks(blocks.into()));
                    // The main thread's tools without its own four, then the definition's filter.
                    tools.retain(|t| {
                        !crate::agent::dialect::MAIN_ONLY_TOOLS.contains(&t.name.as_str())
                            && (t.defer_loading == Some(true)
                                || t.name == "ToolSearch"
                                || (!agent.disallowed_tools.contains(&t.name) && agent.tools.as_ref().is_none_or(|names| names.contains(&t.name))))
                    });
                    request.temperature = None;
                    crate::agent::dialect::subagent_params()
                }
            };
            if let Some(effort) = self.thread.agent().and_then(|a| a.effort.as_ref()) {
                output_config = Some(json!({"effort": effort}));
            }
            request.tools = Some(tools.into());
            request.max_tokens = world.max_output_tokens.or(max_tokens).or(request.max_tokens);
            request.thinking = thinking.map(Into::into);
            request.output_config = output_config.map(Into::into);
            request.context_management = context_management.map(Into::into);
        }
        request.stream = Some(true);
        self.previous_system = Some(system);
        (request, std::mem::take(&mut self.events))
    }

    /// What the 2.1.332 layout takes from the session (src/agent/dialect.rs).
    fn dialect_inputs(&mut self, world: &World, pool: &ToolPool) -> crate::agent::dialect::Inputs {
        let files = self.memory(world).files.clone();
        let claude_md = if self.strategy.claude_md { crate::agent::user_context::render_claude_md(&files, &self.profile, false) } else { None };
        let model_id = self.model_id(world).to_owned();
        let agent_types = match &self.agent_listing {
            Some(crate::agent::tools::AgentToolListing::Inline(lines)) => lines.to_vec(),
            _ => Vec::new(),
        };
        crate::agent::dialect::Inputs {
            claude_md,
            git: self.git_snapshot.clone().flatten(),
            cwd: world.cwd.clone(),
            is_git_repo: world.git.is_some() || world.fs.is_dir(&absolute(&world.cwd, ".git")),
            marketing_name: marketing_name(&model_id),
            model_id,
            date: world.clock.date_string(),
            mcp_tools: pool.all.iter().filter(|t| t.tool.name.starts_with("mcp__")).map(|t| t.tool.name.clone()).collect(),
            mcp_instructions: self.turn_mcp.iter().map(|m| (m.name.clone(), m.instructions.clone())).collect(),
            agent_types,
            skills: self.skills(world).iter().map(|s| format!("- {}: {}", s.name, s.description)).collect(),
            subagent: self.thread.is_subagent(),
        }
    }

    /// The git snapshot as the world's repository stands (`getGitStatus`): `None` outside a
    /// scripted repository or when git instructions are off. `git log` gives five commits.
    fn git_status(&self, world: &World) -> Option<GitStatus> {
        let git = world.git.as_ref().filter(|_| self.strategy.git_status && world.include_git_instructions)?;
        Some(GitStatus {
            branch: git.branch.clone(),
            main_branch: git.main_branch.clone(),
            user_name: git.user_name.clone(),
            status: git.status.join("\n"),
            recent_commits: git.recent_commits.iter().take(5).cloned().collect::<Vec<_>>().join("\n"),
        })
    }

    /// [`Session::system_inputs`], the ones the last request gathered brought up to date in
    /// place: each field is compared with what gathering gives now and rewritten only where it
    /// differs, so a request does not gather (and drop) tens of strings that nearly never
    /// change. The fields the pool gives are seen at once for the same pool.
    fn refresh_system_inputs(&self, gathered: &mut Option<GatheredSystemInputs>, world: &World, pool: &std::rc::Rc<ToolPool>, first_user_text: &str) {
        let Some(kept) = gathered.as_mut() else {
            *gathered = Some(GatheredSystemInputs {
                inputs: self.system_inputs(world, pool, first_user_text.to_owned()),
                pool: std::rc::Rc::clone(pool),
                home: world.home.clone(),
                git_dir: None,
            });
            return;
        };
        fn set_text(field: &mut String, value: &str) {
            if field != value {
                value.clone_into(field);
            }
        }
        fn set<T: PartialEq + Clone>(field: &mut T, value: &T) {
            if field != value {
                field.clone_from(value);
            }
        }
        // Every field is named, so a new one is not left out: those bound to `_` are
        // `SystemPromptInputs::baseline_m0`'s, which gathering never changes.
        let SystemPromptInputs {
            version,
            entrypoint,
            interactive,
            first_user_text: first_text,
            append_system_prompt,
            static_system_prompt,
            enabled_tools,
            skills_present,
            explore_agents: _,
            cwd,
            additional_dirs: _,
            in_worktree: _,
            is_git_repo,
            platform: _,
            shell: _,
            os_version: _,
            model_id: kept_model,
            model_marketing_name,
            auto_memory_dir,
            language: _,
            output_style: _,
            mcp_servers,
            mcp_instructions_delta,
            scratchpad_dir: _,
            brief_enabled: _,
            git_status: kept_git_status,
            inline_mcp_tools,
        } = &mut kept.inputs;
        set_text(version, CLIENT_VERSION);
        set_text(entrypoint, if self.strategy.interactive { "cli" } else { "sdk-cli" });
        *interactive = self.strategy.interactive;
        set_text(first_text, first_user_text);
        if !std::rc::Rc::ptr_eq(&kept.pool, pool) {
            *enabled_tools = pool.enabled_names();
            *skills_present = pool.all.iter().any(|t| t.tool.name == "Skill");
            *inline_mcp_tools = pool.inline_mcp;
            kept.pool = std::rc::Rc::clone(pool);
        }
        let moved = *cwd != world.cwd || kept.home != world.home;
        if moved {
            world.cwd.clone_into(cwd);
            world.home.clone_into(&mut kept.home);
        }
        if moved {
            kept.git_dir = None;
        }
        *is_git_repo = world.git.is_some() || world.fs.is_dir_kept(&mut kept.git_dir, || absolute(&world.cwd, ".git"));
        let git_status = if self.thread.agent().is_some_and(|a| a.omit_git_status) { None } else { self.git_snapshot.as_ref().and_then(Option::as_ref) };
        if kept_git_status.as_ref() != git_status {
            *kept_git_status = git_status.cloned();
        }
        let model_id = self.model_id(world);
        if kept_model != model_id {
            model_id.clone_into(kept_model);
            *model_marketing_name = marketing_name(model_id);
        }
        if moved || auto_memory_dir.is_some() != self.strategy.auto_memory {
            *auto_memory_dir = self.auto_memory_dir(world);
        }
        set(mcp_servers, &self.turn_mcp);
        *mcp_instructions_delta = self.strategy.mcp_instructions == McpInstructionsMode::Delta;
        if !crate::agent::system_prompt::same_shared_text(append_system_prompt, &world.append_system_prompt) {
            *append_system_prompt = world.append_system_prompt.clone();
        }
        if !crate::agent::system_prompt::same_shared_text(static_system_prompt, &world.static_system_prompt) {
            *static_system_prompt = world.static_system_prompt.clone();
        }
    }

    fn system_inputs(&self, world: &World, pool: &ToolPool, first_user_text: String) -> SystemPromptInputs {
        let mut inputs = SystemPromptInputs::baseline_m0();
        inputs.version = CLIENT_VERSION.into();
        inputs.entrypoint = if self.strategy.interactive { "cli" } else { "sdk-cli" }.into();
        inputs.interactive = self.strategy.interactive;
        inputs.first_user_text = first_user_text;
        inputs.enabled_tools = pool.enabled_names();
        inputs.skills_present = pool.all.iter().any(|t| t.tool.name == "Skill");
        inputs.cwd = world.cwd.clone();
        inputs.is_git_repo = world.git.is_some() || world.fs.is_dir(&absolute(&world.cwd, ".git"));
        // The read-only built-in agents leave the snapshot out.
        if !self.thread.agent().is_some_and(|a| a.omit_git_status) {
            inputs.git_status = self.git_snapshot.clone().flatten();
        }
        inputs.model_id = self.model_id(world).to_owned();
        inputs.model_marketing_name = marketing_name(&inputs.model_id);
        inputs.auto_memory_dir = self.auto_memory_dir(world);
        inputs.mcp_servers = self.turn_mcp.clone();
        inputs.mcp_instructions_delta = self.strategy.mcp_instructions == McpInstructionsMode::Delta;
        inputs.inline_mcp_tools = pool.inline_mcp;
        inputs.append_system_prompt = world.append_system_prompt.clone();
        inputs.static_system_prompt = world.static_system_prompt.clone();
        inputs
    }
}

/// A version-4 UUID from two random words.
fn uuid_v4(a: u64, b: u64) -> String {
    format!("{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}", a >> 32, (a >> 16) & 0xffff, a & 0xfff, ((b >> 48) & 0x3fff) | 0x8000, b & 0xffff_ffff_ffff)
}

/// What the delta attachments have announced, as compaction leaves it.
#[derive(Debug, Clone, Default)]
pub(crate) struct AnnouncedSets {
    deferred: BTreeSet<String>,
    agents: BTreeMap<String, String>,
    mcp: BTreeSet<String>,
}

impl Session {
    pub(crate) fn set_announced(&mut self, sets: AnnouncedSets) {
        self.announced_deferred = sets.deferred;
        self.announced_agents = sets.agents;
        self.announced_mcp = sets.mcp;
    }
}

/// `{home}/.claude/projects/{cwd with every non-alphanumeric as -}/{session id}`: where the
/// client keeps a session's transcript and its side files.
/// A main request's `metadata`: the user id, itself a JSON text of the device and session ids.
fn request_metadata(device_id: &str, session_id: &str) -> crate::api::SharedValue {
    let user_id = json!({"device_id": device_id, "account_uuid": "", "session_id": session_id}).to_string();
    json!({"user_id": user_id}).into()
}

fn session_dir(world: &World, session_id: &str) -> String {
    let project: String = world.cwd.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    format!("{}/.claude/projects/{project}/{session_id}", world.home.trim_end_matches('/'))
}

/// A peer mechanism's outcome as the stage report a main request carries.
fn peer_report(outcome: crate::agent::compact::peers::PeerOutcome) -> crate::measure::StageReport {
    crate::measure::StageReport { name: outcome.stage.into(), fired: outcome.fired, reason: outcome.reason.into(), tokens_before: outcome.tokens_before, tokens_after: outcome.tokens_after, invalidated_from: None }
}

/// The first user text as far as the system prompt reads it (its fingerprint's positions,
/// [`crate::agent::system_prompt::fingerprint_head`]): the whole text (the user context, often
/// tens of kilobytes) is not copied per request.
fn first_text(messages: &[Message]) -> &str {
    messages
        .iter()
        .find(|m| m.role == Role::User)
        .and_then(|m| match &m.content {
            MessageContent::Text(t) => Some(t.as_str()),
            MessageContent::Blocks(blocks) => blocks.iter().find_map(|b| match b {
                ContentBlock::Text { text, .. } => Some(text.as_str()),
                _ => None,
            }),
        })
        .map(crate::agent::system_prompt::fingerprint_head)
        .unwrap_or_default()
}

/// The system prompt's inputs as the last request gathered them ([`Session::refresh_system_inputs`]),
/// with what they were gathered from that no field shows: the tool pool and the home.
#[derive(Debug, Clone)]
struct GatheredSystemInputs {
    inputs: SystemPromptInputs,
    pool: std::rc::Rc<ToolPool>,
    home: String,
    /// Whether the working directory holds `.git`, as last asked of the fs.
    git_dir: Option<crate::world::DirAnswer>,
}


// The main thread's request parameters, the same on every request: each request holds them
// by reference count (`SharedValue`) rather than building the objects again.
static ADAPTIVE_THINKING: std::sync::LazyLock<crate::api::SharedValue> = std::sync::LazyLock::new(|| json!({"type": "adaptive"}).into());
static KEEP_ALL_THINKING: std::sync::LazyLock<crate::api::SharedValue> =
    std::sync::LazyLock::new(|| json!({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}).into());
static MEDIUM_EFFORT: std::sync::LazyLock<crate::api::SharedValue> = std::sync::LazyLock::new(|| json!({"effort": "medium"}).into());

fn adaptive_thinking(model_id: &str) -> bool {
    model_id.contains("-4-6")
}

/// Where the message marker goes after parallel tool calls whose results completed out of
/// order: the client appends each result as it completes and marks the message that completed
/// last; the API request puts the results back in tool_use order, the marker with its result, so
/// the results of later tool uses that completed earlier trail it (uncached input). The block
/// of the last message, when that message is only the results (two or more) and the one whose
/// scripted output comes last in the script (a recorded session's outputs are in completion
/// order) is not its last block; else `None` (the last block is marked).
fn completed_last_result(messages: &[Message], world: &World) -> Option<usize> {
    let last = messages.last().filter(|m| m.role == Role::User)?;
    let MessageContent::Blocks(blocks) = &last.content else { return None };
    if blocks.len() < 2 {
        return None;
    }
    let mut completed = Vec::with_capacity(blocks.len());
    for block in blocks {
        let ContentBlock::ToolResult { tool_use_id, .. } = block else { return None };
        completed.push(world.tool_outputs.get(tool_use_id)?.completed);
    }
    let k = (0..completed.len()).max_by_key(|&k| completed[k])?;
    (k + 1 < blocks.len()).then_some(k)
}

/// `claude-sonnet-4-6` → `Sonnet 4.6`; `None` for ids of another shape.
pub fn marketing_name(model_id: &str) -> Option<String> {
    let rest = model_id.strip_prefix("claude-")?;
    let mut parts = rest.split('-');
    let family = parts.next()?;
    let major = parts.next()?.parse::<u32>().ok()?;
    let minor = parts.next().and_then(|m| m.parse::<u32>().ok()).filter(|m| *m < 100);
    let mut name = family[..1].to_ascii_uppercase() + &family[1..];
    name.push(' ');
    name.push_str(&major.to_string());
    if let Some(minor) = minor {
        name.push_str(&format!(".{minor}"));
    }
    Some(name)
}

/// `[{command}]: {err}` → (command, err).
fn split_blocking(error: &str) -> (String, String) {
    error
        .strip_prefix('[')
        .and_then(|rest| rest.split_once("]: "))
        .map(|(c, e)| (c.to_owned(), e.to_owned()))
        .unwrap_or_else(|| (String::new(), error.to_owned()))
}

/// The text the world adds to a built-in agent type's prompt (`world.agent_prompt_extra`: what
/// a recorded client's prompt of that type held beyond ours).
fn agent_prompt_extra<'a>(agent: &crate::agent::agents::AgentDefinition, world: &'a World) -> Option<&'a str> {
    world.agent_prompt_extra.get(&agent.agent_type).filter(|extra| agent.source == crate::agent::agents::AgentSource::BuiltIn && !extra.is_empty()).map(String::as_str)
}

/// A subagent's prompt with [`agent_prompt_extra`] after it (the 2.1.332 layout, which pads the
/// whole to its capture's size).
fn agent_prompt<'a>(agent: &'a crate::agent::agents::AgentDefinition, world: &World) -> std::borrow::Cow<'a, str> {
    match agent_prompt_extra(agent, world) {
        Some(extra) => std::borrow::Cow::Owned(format!("{}\n\n{extra}", agent.prompt.trim_end())),
        None => std::borrow::Cow::Borrowed(&agent.prompt),
    }
}
