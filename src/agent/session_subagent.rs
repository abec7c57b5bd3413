//! Subagents: the Agent tool starts a child [`Session`] that runs its own tool loop over the same
//! World (real-client-oracle §3 "Subagent"; layers-1-5 §2.5, §3.3, §5.1, §7).
//!
//! The child shares the parent's settings, hooks, plugins, memoized user context and memory
//! files, and starts afresh on everything that is per agent in the client: its transcript, its
//! sent-skill-names set, its discovered tools, its todo list, its nested-memory set, its
//! announced deltas. Its requests differ from the main thread's:
//!
//! - system: `[attribution, identity, agent prompt + notes + <env> block (+ gitStatus)]`, no
//!   boundary, so the identity and the rest carry org-scoped markers (three blocks);
//! - tools: the parent's pool filtered by the definition (`tools`, `disallowedTools`) and
//!   without the tools no subagent gets;
//! - messages: the user-context reminder (without `claudeMd` for the read-only built-ins) and
//!   the prompt; the skill listing first arrives after the first tool round, as in the
//!   oracle;
//! - no thinking and no context_management, `temperature: 1`; the model from the definition
//!   or the tool input; markers with the TTL of a non-main lane.
//!
//! Every request goes through [`ModelCalls`] on lane `subagent:<type>`: the runner measures it
//! at the current virtual time and answers with the lane's next scripted reply. The final
//! reply's text comes back as the Agent tool_result, followed by the agent id and usage line.
//!
//! Speaking 2.1.332 (`client_version`), the main thread's Agent call runs in the background: the
//! call returns a short "launched" result at once, the agent runs when the main thread's turn
//! ends (deterministic: to its end, at the virtual time then), and its result comes back as a
//! user message holding a `<task-notification>`; its requests take 2.1.332's subagent layout
//! (`crate::agent::dialect`). docs/profiles.md, "Background subagents".

use serde_json::{Value, json};

use crate::agent::agents::{AgentCatalog, AgentDefinition, GENERAL_PURPOSE, resolve_model};
use crate::agent::attachments::Attachment;
use crate::agent::instructions::MANAGED_DIR;
use crate::agent::normalize::Record;
use crate::agent::tools::AgentToolListing;
use crate::agent::tools::exec::ExecOutcome;
use crate::agent::user_context::{UserContextInputs, render_user_context};
use crate::api::{ContentBlock, MessageContent, Request, ToolResultContent, Usage};
use crate::world::{Reply, World};

use super::Session;

/// How a session sends the requests of the subagents it starts.
pub trait ModelCalls {
    /// A new agent starts on `lane`. The reference tracks prefix and cache breaks per agent id,
    /// so the lane's comparison starts afresh.
    fn lane_started(&mut self, lane: &str);

    /// Sends `request` on `lane` with the events journalled for it, at the current virtual
    /// time; returns the reply and the usage the API reported. The clock moves on by the reply's
    /// latency.
    fn call(&mut self, lane: &str, request: Request, events: Vec<String>, world: &mut World) -> Result<(Reply, Usage), String>;

    /// Measures side requests made inside the agent's tool loop (its hooks' questions) before
    /// its next request.
    fn side(&mut self, calls: Vec<super::SideCall>, world: &mut World) -> Result<(), String>;

    /// Sends a fork of the conversation (a compaction or session-memory request) on `lane` with
    /// `events`, at the current virtual time. The simulated API refuses it when it does not fit
    /// `window` or carries an oversized image (an error row; no reply is used and the clock
    /// stays); otherwise the lane's next scripted reply answers it, else `fallback`, and the
    /// clock moves on by the reply's latency.
    /// `thread` is the lane of the thread the fork copies: its request was built as that
    /// thread's, its system and tool markers at that lane's TTL ([`super::fork_prefix_ttl`]).
    #[allow(clippy::too_many_arguments)]
    fn fork(&mut self, lane: &str, thread: &str, request: Request, events: Vec<String>, window: u64, fallback: Reply, world: &mut World) -> Result<super::ForkAnswer, String>;
}

/// Which thread a session is.
#[derive(Debug, Clone, Default)]
pub(crate) enum Thread {
    #[default]
    Main,
    Subagent(Box<SubagentThread>),
}

#[derive(Debug, Clone)]
pub(crate) struct SubagentThread {
    agent: AgentDefinition,
    agent_id: String,
    model: String,
}

impl Thread {
    pub(crate) fn agent(&self) -> Option<&AgentDefinition> {
        match self {
            Thread::Main => None,
            Thread::Subagent(sub) => Some(&sub.agent),
        }
    }

    pub(crate) fn agent_id_and_definition(&self) -> Option<(&str, &AgentDefinition)> {
        match self {
            Thread::Main => None,
            Thread::Subagent(sub) => Some((&sub.agent_id, &sub.agent)),
        }
    }

    pub(crate) fn model(&self) -> Option<&str> {
        match self {
            Thread::Main => None,
            Thread::Subagent(sub) => Some(&sub.model),
        }
    }

    pub(crate) fn is_subagent(&self) -> bool {
        matches!(self, Thread::Subagent(_))
    }
}

/// An Agent call checked and given its id, before it runs.
#[derive(Debug, Clone)]
pub(crate) struct AgentStart {
    agent: AgentDefinition,
    agent_id: String,
    model: String,
    prompt: String,
    /// The call's `description` (the agent type when it has none).
    description: String,
}

/// What a finished agent hands back: its final reply's texts and its usage line.
struct AgentRun {
    texts: Vec<String>,
    total_tokens: u64,
    tool_uses: usize,
    duration_ms: u64,
}

/// What the agent id line of the Agent tool_result says after the id (our wording).
const AGENT_ID_NOTE: &str = "keep it to send this agent more work later";

impl Session {
    /// The lane this thread's requests are measured on.
    pub fn lane(&self) -> String {
        self.thread.agent().map_or_else(|| "main".to_owned(), AgentDefinition::lane)
    }

    /// The agent types active now: built-ins, enabled plugins' agents, then the user, project
    /// and policy agent directories.
    pub fn agent_catalog(&self, world: &World) -> AgentCatalog {
        let plugin_agents: Vec<AgentDefinition> = self.plugins.iter().flat_map(|p| p.agents.iter().cloned()).collect();
        AgentCatalog::load(&world.fs, &Session::config_home(world), &world.cwd, MANAGED_DIR, &plugin_agents, self.strategy.interactive)
    }

    /// The Agent tool's listing for the catalog as it is now.
    pub(crate) fn current_agent_listing(&self, world: &World) -> AgentToolListing {
        if self.strategy.agent_list_in_messages {
            AgentToolListing::InMessages
        } else {
            AgentToolListing::Inline(self.agent_catalog(world).listing_lines().into())
        }
    }

    /// Checks an Agent call and gives the agent its id: the definition, model and prompt it
    /// runs with, or the error result the call gets.
    fn start_agent(&mut self, id: &str, input: &Value, world: &World) -> Result<AgentStart, Box<ExecOutcome>> {
        let prompt = input.get("prompt").and_then(Value::as_str).unwrap_or_default().to_owned();
        let agent_type = input.get("subagent_type").and_then(Value::as_str).filter(|t| !t.trim().is_empty()).unwrap_or(GENERAL_PURPOSE);
        let catalog = self.agent_catalog(world);
        // A recorded subagent (a workload's `subagent: true` output) ran in the recorded client,
        // which may have been interactive: its built-in type is found among every built-in.
        let recorded = world.tool_outputs.get(id).is_some_and(|o| o.runs_subagent);
        let built_in = || crate::agent::agents::built_in_agents(true).into_iter().find(|a| a.agent_type == agent_type);
        let Some(agent) = catalog.find(agent_type).cloned().or_else(|| if recorded { built_in() } else { None }) else {
            let known: Vec<&str> = catalog.agents.iter().map(|a| a.agent_type.as_str()).collect();
            let text = format!("There is no agent type `{agent_type}`. The agent types are: {}.", known.join(", "));
            return Err(Box::new(ExecOutcome::text(id, text, true)));
        };
        if prompt.trim().is_empty() {
            return Err(Box::new(ExecOutcome::text(id, "An agent needs a prompt: say what it should do.".to_owned(), true)));
        }
        let model = resolve_model(&agent, input.get("model").and_then(Value::as_str), &world.model_id, &world.env);
        self.agents_started += 1;
        let mut rng = world.rng.fork("agent_ids").fork(&self.agents_started.to_string());
        let agent_id = format!("a{:06x}", rng.next_u64() & 0xff_ffff);
        let description = input.get("description").and_then(Value::as_str).unwrap_or(&agent.agent_type).to_owned();
        Ok(AgentStart { agent, agent_id, model, prompt, description })
    }

    /// Runs the subagent an Agent tool_use asks for and returns the tool_result for the
    /// parent: the final reply's text blocks, then `agentId: … <usage>…</usage>`.
    pub(crate) fn run_agent(&mut self, id: &str, input: &Value, world: &mut World, calls: &mut dyn ModelCalls) -> Result<ExecOutcome, String> {
        let start = match self.start_agent(id, input, world) {
            Ok(start) => start,
            Err(outcome) => return Ok(*outcome),
        };
        let run = self.run_started(&start, world, calls)?;
        let mut blocks: Vec<ContentBlock> = run.texts.into_iter().map(ContentBlock::text).collect();
        blocks.push(ContentBlock::text(format!(
            "agentId: {} ({AGENT_ID_NOTE})\n<usage>total_tokens: {}\ntool_uses: {}\nduration_ms: {}</usage>",
            start.agent_id, run.total_tokens, run.tool_uses, run.duration_ms
        )));
        let mut outcome = ExecOutcome::text(id, String::new(), false);
        outcome.result = ContentBlock::tool_result(id, ToolResultContent::Blocks(blocks), None);
        Ok(outcome)
    }

    /// Claude Code 2.1.332's Agent call: the agent is queued to run in the background and the
    /// call returns at once with a short "launched" result (a list of one text block).
    pub(crate) fn launch_agent(&mut self, id: &str, input: &Value, world: &World) -> ExecOutcome {
        let start = match self.start_agent(id, input, world) {
            Ok(start) => start,
            Err(outcome) => return *outcome,
        };
        let text = crate::agent::dialect::launched_result(&start.agent_id, &start.description);
        self.background.push(start);
        let mut outcome = ExecOutcome::text(id, String::new(), false);
        outcome.result = ContentBlock::tool_result(id, ToolResultContent::Blocks(vec![ContentBlock::text(text)]), None);
        outcome
    }

    /// Runs the background agents launched so far, in launch order, each to its end at the
    /// current virtual time (the main thread's turn has ended, so nothing else asks meanwhile),
    /// and adds one task notification per agent as a user message: the main thread's next
    /// request carries them.
    pub(crate) fn run_background_agents(&mut self, world: &mut World, calls: &mut dyn ModelCalls) -> Result<(), String> {
        for start in std::mem::take(&mut self.background) {
            let run = self.run_started(&start, world, calls)?;
            let result = run.texts.join("\n");
            let text = crate::agent::dialect::task_notification(&start.agent_id, &start.description, &result, run.total_tokens, run.tool_uses, run.duration_ms);
            self.records.push(Record::User { content: MessageContent::Blocks(vec![ContentBlock::text(text.clone())].into()), meta: false });
            self.events.push(format!("task_notification:{}", start.agent.agent_type));
            self.notifications.push(text);
        }
        Ok(())
    }

    /// The task notifications added since the last call (a client's loop records them and
    /// asks the model again).
    pub fn take_notifications(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notifications)
    }

    /// Runs a started agent's tool loop to its end: its final reply's texts and usage line.
    fn run_started(&mut self, start: &AgentStart, world: &mut World, calls: &mut dyn ModelCalls) -> Result<AgentRun, String> {
        let AgentStart { agent, agent_id, model, prompt, .. } = start;
        let lane = agent.lane();
        let started_ms = world.clock.now_ms();

        let hook = self.hooks(world, "SubagentStart", &agent.agent_type, json!({"agent_id": agent_id, "agent_type": agent.agent_type}));
        self.settle_hook_time(world);
        // What this thread asked before the agent starts is measured first.
        calls.side(self.take_side_calls(), world)?;
        let mut child = self.spawn_subagent(agent.clone(), agent_id.clone(), model.clone(), world);
        child.records.push(Record::User { content: MessageContent::Text(prompt.clone().into()), meta: false });
        if !hook.additional_context.is_empty() {
            child.push_attachments(vec![Attachment::HookAdditionalContext { hook_name: "SubagentStart".into(), lines: hook.additional_context }]);
        }
        // Skills named in the definition are preloaded: each body as a meta message.
        let skills = self.skills(world);
        for name in &agent.skills {
            if let Some(skill) = skills.iter().find(|s| &s.name == name) {
                let body = format!("Base directory for this skill: {}\n\n{}", skill.dir, skill.invocation_body(&self.session_id));
                child.records.push(Record::User { content: MessageContent::Blocks(vec![ContentBlock::text(body)].into()), meta: true });
            }
        }

        calls.lane_started(&lane);
        let mut tool_uses = 0usize;
        let mut turns = 0u32;
        let (final_reply, usage) = loop {
            let (request, events) = child.build_request(world);
            let (reply, usage) = calls.call(&lane, request, events, world)?;
            turns += 1;
            let called = reply.content.iter().filter(|b| matches!(b, ContentBlock::ToolUse { .. })).count();
            tool_uses += called;
            child.apply_reply(&reply, world, calls)?;
            calls.side(child.take_side_calls(), world)?;
            let more = called > 0 || child.stop_continued;
            if !more || agent.max_turns.is_some_and(|max| turns >= max) {
                break (reply, usage);
            }
        };

        // What outlives the agent in the parent: its hook runs and the skills it activated.
        self.hook_log.append(&mut child.hook_log);
        self.activated_skills.append(&mut child.activated_skills);
        let texts = final_reply
            .content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text, .. } if !text.trim().is_empty() => Some(String::clone(text)),
                _ => None,
            })
            .collect();
        Ok(AgentRun { texts, total_tokens: usage.prompt_tokens() + usage.output_tokens, tool_uses, duration_ms: world.clock.now_ms() - started_ms })
    }

    /// A child session for `agent`: the parent's configuration, a fresh conversation.
    fn spawn_subagent(&mut self, agent: AgentDefinition, agent_id: String, model: String, world: &World) -> Session {
        // `getUserContext` is memoized for the session; the read-only built-ins leave claudeMd
        // out of it.
        let user_context = if agent.omit_claude_md {
            let inputs = UserContextInputs {
                memory_files: Vec::new(),
                claude_md_disabled: true,
                date: world.clock.date_string(),
                padding: self.strategy.size_profile_padding,
            };
            render_user_context(&inputs, &self.profile).into()
        } else {
            self.user_context(world)
        };
        let mut child = self.clone();
        if let Some(hooks) = &agent.hooks {
            // Frontmatter hooks live as long as the agent; its `Stop` is the `SubagentStop` event.
            let mut hooks = hooks.clone();
            if let Some(map) = hooks.as_object_mut()
                && let Some(stop) = map.remove("Stop")
            {
                map.insert("SubagentStop".into(), stop);
            }
            let root = agent.path.clone().unwrap_or_else(|| agent.agent_type.clone());
            let parsed = crate::agent::hooks::parse_hooks(&hooks, crate::agent::hooks::HookSource::Session, Some(&root), &root);
            child.session_hooks.extend(parsed.hooks);
        }
        child.thread = Thread::Subagent(Box::new(SubagentThread { agent, agent_id, model }));
        child.start_new_conversation();
        child.system_cache = crate::agent::system_prompt::SystemPromptCache::new();
        child.previous_system = None;
        child.user_context = Some(user_context);
        child.events.clear();
        child.last_date = None;
        child.hook_log.clear();
        child.stop_continued = false;
        child.session_started = true;
        child.agents_started = 0;
        child.background.clear();
        child.notifications.clear();
        child.peer_reports.clear();
        child
    }
}
