//! A strategy measured beside a run instead of run on its own ([`Mirror`]).
//!
//! Some knobs are of how requests are sent, not of what the agent does, and a strategy that
//! differs from a run's only in one of them makes the run's requests but for what the knob
//! changes, as long as nothing the agent, the reply plan or the client's rules read of a
//! measurement differs between the two. A mirror may change:
//!
//! - **The TTL of the main lane's cache markers.** [`crate::strategy::Strategy::ttl_for`]
//!   times every marker the agent places on a main request (the system prompt's and the
//!   messages'), and nothing else the agent decides reads it: a main request's markers, and a
//!   main-thread fork's system and tool markers ([`fork_prefix_ttl`]), are moved to the
//!   mirror's TTL on the run's flattened request (no copy of its block records).
//! - **The dynamic boundary** (`dynamic_boundary` off, [`MirrorOf::without_boundary`]). It
//!   changes only how the main thread's system prompt is cut into blocks (mode C instead of
//!   mode B: [`crate::agent::system_prompt::without_boundary`], a function of the mode-B
//!   blocks); subagents build theirs without it, and the only reader of the blocks' sizes in
//!   the agent is a peer mechanism, which such a mirror's strategy has none of. Every main
//!   request and every main-thread fork (compaction, session memory: the main request built
//!   again) is sent with its system blocks laid out again and flattened by the mirror's own
//!   measurer; the prompt's size differs, so the API's refusal (over the window) is the
//!   mirror's own.
//! - **Every tool's schema sent up front** (`ENABLE_TOOL_SEARCH=false` where the run's
//!   strategy defers tools, [`MirrorOf::tools_up_front`]). Where the run's request defers
//!   tools (ToolSearch among its tools), the mirror's carries the thread's pool assembled
//!   without tool search ([`crate::agent::session::Session::tools_without_search`], which the
//!   runner hands the mirror whenever the run's tools array is another allocation) and not the
//!   `<available-deferred-tools>` listing the run's sends as its first message; the rest of the
//!   history is the run's where ToolSearch loaded no tool (no `defer_loading` tool, no
//!   `tool_reference` block to strip: the family asks for a workload that runs no ToolSearch,
//!   each call answered by its recorded output, and debug builds look for the blocks). Checked on every request: the run's tools are the
//!   mirror's but for ToolSearch and the deferred ones, its first message lists exactly those,
//!   and a request of another thread that defers tools (a subagent's) parts the mirror. Main
//!   requests and main-thread forks that defer tools are flattened by the mirror's own
//!   measurer and refused as its measurement says; a request that defers nothing is the same
//!   under both strategies and measured as sent.
//!
//! What a measurement gives the run that the mirror's could give otherwise: the main request's
//! refusal (and its error text, which the recovery ladder parses) and a fork's, the main row's
//! error, and the usage the agent is given where the reply carries none of its own (each checked
//! where the run measures it). The cache's figures differ (what is read and written, at which
//! price), and so do the client's rules, which read the cache and the request (a shared
//! prefix needs a global-scope block): each mirror has its own measurer and its own copy of the
//! rules, and measures every request of the run, other lanes' as sent. The agent's work (the
//! chain, the request, the reply, the tools) is the run's, done once.
//!
//! Where something read differs, the mirror parts ([`Mirror::parted`]) and measures no more:
//! its strategy is then no longer the run's, and runs on its own.

use crate::agent::compact::recovery::{simulated_api_error, simulated_media_error};
use crate::agent::session::fork_prefix_ttl;
use crate::api::{CacheTtl, Message, MessageContent, Request, SharedVec, SystemBlock, SystemPrompt, Tool};
use crate::measure::{FlatRequest, MeasureInput, Measurer, PromptBlock, Region, RequestMetrics, Served};
use crate::recording::format::LANE_MAIN;

use super::{ClientRules, MainCall};

/// What a [`Mirror`]'s strategy changes of the run's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MirrorOf {
    /// The TTL the run's own main-lane markers carry, and the mirror's (`None`: 5 minutes,
    /// sent as no `ttl`).
    pub run_ttl: Option<CacheTtl>,
    pub ttl: Option<CacheTtl>,
    /// The main thread's system prompt without the dynamic boundary (the run's with it).
    pub without_boundary: bool,
    /// Every tool's schema sent up front, no ToolSearch (the run defers tools).
    pub tools_up_front: bool,
}

/// The run's `tools` array that defers tools, and what a mirror that sends every tool up front
/// sends in its place ([`MirrorOf::tools_up_front`]).
#[derive(Debug, Clone)]
struct UpFront {
    run: SharedVec<Tool>,
    mine: SharedVec<Tool>,
    /// The first message the run's requests send with `run`: the deferred tools' listing.
    listing: String,
}

impl UpFront {
    /// `mine` in place of `run` where `run` is the tools array of a request that defers what
    /// `mine` sends up front: no tool of either carries a marker or `defer_loading`, `run`
    /// holds ToolSearch and `mine` does not, `run`'s other tools are in `mine` as they are, and
    /// `mine` adds no MCP tool (an inline one lays the system prompt out otherwise). The
    /// listing is that of the tools `mine` adds, in the client's order.
    fn of(run: SharedVec<Tool>, mine: SharedVec<Tool>) -> Result<UpFront, String> {
        use crate::agent::tools::TOOL_SEARCH;
        let plain = |t: &Tool| t.cache_control.is_none() && t.defer_loading.is_none();
        if !run.iter().chain(mine.iter()).all(plain) {
            return Err("a tool with a marker or loaded by ToolSearch".to_owned());
        }
        if !run.iter().any(|t| t.name == TOOL_SEARCH) || mine.iter().any(|t| t.name == TOOL_SEARCH) {
            return Err("ToolSearch not only among the run's tools".to_owned());
        }
        if !run.iter().filter(|t| t.name != TOOL_SEARCH).all(|t| mine.iter().any(|m| m == t)) {
            return Err("a tool of the run's that is not sent up front as the run sends it".to_owned());
        }
        let mut added: Vec<String> = mine.iter().filter(|m| !run.iter().any(|t| t.name == m.name)).map(|m| m.name.clone()).collect();
        if added.iter().any(|name| name.starts_with("mcp__")) {
            return Err("an MCP tool sent up front".to_owned());
        }
        added.sort_by(|a, b| crate::agent::tools::code_unit_compare(a, b));
        Ok(UpFront { run, mine, listing: crate::agent::tools::deferred_tools_listing(&added) })
    }

    /// Whether `request` defers tools: ToolSearch, or a tool it loaded, among its tools.
    fn defers(request: &Request) -> bool {
        request.tools.as_ref().is_some_and(|tools| tools.iter().any(|t| t.name == crate::agent::tools::TOOL_SEARCH || t.defer_loading.is_some()))
    }

    /// `request` as the mirror sends it given to `f`, then put back: its tools swapped, and its
    /// messages for `messages`, which hold the messages after the first, the listing (the
    /// mirror's own list, kept from request to request: no copy of the run's); an error where
    /// `request` is not one this swaps (the tools [`UpFront::of`] took, their listing first).
    fn swapped<R>(&self, request: &mut Request, messages: &mut Vec<Message>, f: impl FnOnce(&Request) -> R) -> Result<R, String> {
        if !request.tools.as_ref().is_some_and(|tools| tools.same(&self.run)) {
            return Err("a request that defers tools with another tools array".to_owned());
        }
        let lists = request.messages.first().is_some_and(|m| m.role == crate::api::Role::User && matches!(&m.content, MessageContent::Text(text) if **text == *self.listing));
        if !lists {
            return Err("a request that defers tools without their listing first".to_owned());
        }
        #[cfg(debug_assertions)]
        {
            use crate::api::{ContentBlock, ToolResultContent};
            let reference = |m: &crate::api::Message| {
                matches!(&m.content, MessageContent::Blocks(blocks) if blocks.iter().any(|b| matches!(b, ContentBlock::ToolResult { content: Some(ToolResultContent::Blocks(inner)), .. } if inner.iter().any(|i| matches!(i, ContentBlock::ToolReference { .. })))))
            };
            debug_assert!(!request.messages.iter().any(reference), "a tool_reference block, which sent without tool search is stripped");
            use crate::api::identical::Identical;
            debug_assert!(messages[..].identical(&request.messages[1..]), "the mirror's messages are the run's after the listing");
        }
        let run_tools = request.tools.replace(self.mine.clone());
        std::mem::swap(&mut request.messages, messages);
        let out = f(request);
        std::mem::swap(&mut request.messages, messages);
        request.tools = run_tools;
        Ok(out)
    }
}

/// A strategy that differs from a run's only in what [`MirrorOf`] says, measured beside it
/// ([module docs](self); [`super::RunState::add_mirror`]).
pub struct Mirror {
    of: MirrorOf,
    measurer: Measurer,
    client: Option<Box<dyn ClientRules>>,
    rows: Vec<RequestMetrics>,
    /// Why the mirror stopped being the run of its strategy, at which row of the run.
    parted: Option<(usize, String)>,
    /// The main request being measured: its body as served and its client's events, between
    /// [`Mirror::serve_main`] and [`Mirror::main_row`] (or [`Mirror::measure_refused`]).
    pending: Option<(Served, Vec<String>)>,
    /// The last main-thread system array laid out without the boundary, and the array it gave
    /// (one allocation while the run's is one: the mirror's flattener compares it by pointer).
    relaid: Option<(SharedVec<SystemBlock>, SharedVec<SystemBlock>)>,
    /// The stamp of the last main request the mirror's measurer flattened (its own, without
    /// the boundary or with every tool up front).
    main_stamp: Option<u64>,
    /// What a mirror that sends every tool up front sends in place of the run's last tools
    /// array that deferred tools.
    up_front: Option<UpFront>,
    /// The messages the mirror sent with every tool up front in its last main request: the
    /// run's after the listing.
    messages: Vec<Message>,
    /// The run's stamp of the main request `messages` are the messages of (after its listing).
    messages_of: Option<u64>,
    /// Of a mirror that sends every tool up front, each main request after a compaction: its
    /// row and its messages as the mirror sent them (what the loss judge reads of it).
    compacted: Vec<(usize, Vec<Message>)>,
    /// The run's last tools array [`Mirror::send_up_front`] was told of.
    tools_seen: Option<SharedVec<Tool>>,
    /// Whether the last main request the mirror's measurer flattened was sent with every tool
    /// up front where the run's deferred them.
    main_up_front: bool,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror").field("of", &self.of).field("rows", &self.rows.len()).field("parted", &self.parted).finish()
    }
}

impl Mirror {
    /// A mirror of strategy `of` beside a run, measuring on `measurer` (in the state the run's
    /// measurer starts from) under `client` (the run's rules, in their starting state).
    pub fn new(of: MirrorOf, measurer: Measurer, client: Option<Box<dyn ClientRules>>) -> Mirror {
        Mirror { of, measurer, client, rows: Vec::new(), parted: None, pending: None, relaid: None, main_stamp: None, up_front: None, messages: Vec::new(), messages_of: None, compacted: Vec::new(), tools_seen: None, main_up_front: false }
    }

    /// Where and why the mirror parted from the run: the run's row count then, and the reason.
    pub fn parted(&self) -> Option<&(usize, String)> {
        self.parted.as_ref()
    }

    /// Every request of the run as the mirror measured it, or why it parted.
    pub fn into_rows(self) -> Result<Vec<RequestMetrics>, (usize, String)> {
        match self.parted {
            Some(parted) => Err(parted),
            None => Ok(self.rows),
        }
    }

    /// Of a mirror that sends every tool up front, each main request after a compaction
    /// (its row, its messages as the mirror sent them), as [`super::RunState::keep_compacted_requests`]
    /// keeps the run's.
    pub fn take_compacted_requests(&mut self) -> Vec<(usize, Vec<Message>)> {
        std::mem::take(&mut self.compacted)
    }

    /// The measurer the mirror measures with.
    pub fn measurer(&self) -> &Measurer {
        &self.measurer
    }

    fn part(&mut self, why: String) {
        if self.parted.is_none() {
            self.parted = Some((self.rows.len(), why));
            self.pending = None;
        }
    }

    fn live(&self) -> bool {
        self.parted.is_none()
    }

    /// Whether the mirror sends every tool up front and has not been told what it sends in
    /// place of `run`, a main request's tools array ([`Mirror::send_up_front`]).
    pub(super) fn wants_tools(&self, run: &SharedVec<Tool>) -> bool {
        self.of.tools_up_front && self.live() && !self.tools_seen.as_ref().is_some_and(|seen| seen.same(run))
    }

    /// What the mirror sends in place of `run` where a request defers tools with it: `mine`,
    /// the thread's tools assembled without tool search. Checked as [`UpFront::of`] says (a
    /// `run` that defers nothing is sent as it is), else the mirror parts.
    pub(super) fn send_up_front(&mut self, run: SharedVec<Tool>, mine: SharedVec<Tool>) {
        self.tools_seen = Some(run.clone());
        if !run.iter().any(|t| t.name == crate::agent::tools::TOOL_SEARCH || t.defer_loading.is_some()) {
            return;
        }
        match UpFront::of(run, mine) {
            Ok(up_front) => self.up_front = Some(up_front),
            Err(why) => self.part(why),
        }
    }

    /// `served` with its markers at the mirror's TTL; an error where a marker is not at the
    /// run's (the agent did not time it by the main lane's TTL) or the body asks for automatic
    /// caching.
    fn retimed(&self, served: &Served) -> Result<Served, String> {
        let mut served = served.clone();
        retime(&mut served.flat, self.of.run_ttl, self.of.ttl, |_| true)?;
        if let Some(sent) = &mut served.sent {
            retime(sent, self.of.run_ttl, self.of.ttl, |_| true)?;
        }
        Ok(served)
    }

    /// The system array of `system` (a main-thread request's) without the boundary: the last
    /// one made again while the run sends the same allocation; `keep` keeps a new one for the
    /// next request.
    fn relaid_system(&mut self, system: Option<&SystemPrompt>, keep: bool) -> Result<SharedVec<SystemBlock>, String> {
        let Some(SystemPrompt::Blocks(blocks)) = system else {
            return Err("a main-thread request without a system array".to_owned());
        };
        if let Some((run, mine)) = &self.relaid
            && run.same(blocks)
        {
            return Ok(mine.clone());
        }
        let mine: SharedVec<SystemBlock> = crate::agent::system_prompt::without_boundary(blocks).ok_or("a main-thread system array not laid out in mode B")?.into();
        if keep {
            self.relaid = Some((blocks.clone(), mine.clone()));
        }
        Ok(mine)
    }

    fn push(&mut self, input: MeasureInput<'_>, served: Served) {
        match self.measurer.measure_served(input, served) {
            Ok(row) => self.rows.push(row),
            Err(e) => self.part(e.to_string()),
        }
    }

    /// A new conversation starts on `lane` ([`Measurer::restart_lane`]).
    pub(super) fn restart_lane(&mut self, lane: &str) {
        if self.live() {
            self.measurer.restart_lane(lane);
        }
    }

    /// A request of another lane than the main one, measured as sent: none of its markers is
    /// the main lane's, and its system array is not the main thread's.
    pub(super) fn measure_as_sent(&mut self, input: &MeasureInput<'_>, served: &Served) {
        if !self.live() {
            return;
        }
        if input.lane == LANE_MAIN {
            return self.part("a main-lane request outside a main call".to_owned());
        }
        if let (Some((run, _)), Some(SystemPrompt::Blocks(blocks))) = (&self.relaid, &input.body.system)
            && run.same(blocks)
        {
            return self.part(format!("a {} request with the main thread's system array", input.lane));
        }
        if self.of.tools_up_front && UpFront::defers(input.body) {
            return self.part(format!("a {} request that defers tools", input.lane));
        }
        self.push(input.clone(), served.clone());
    }

    /// A fork of the thread on lane `thread` ([`crate::agent::session::ModelCalls::fork`]): its
    /// request was built as the thread's, then given its own marker on the messages. A fork of
    /// the main thread sends its system and tool markers at the TTL [`fork_prefix_ttl`] gives
    /// under the main lane's (the run's, the mirror's), and its system array without the
    /// boundary where the mirror's is, every tool up front where it defers tools (then
    /// flattened by the mirror, refused by the API over `window` as the mirror's measurement
    /// says: it parts where that is not the run's refusal); any other is measured as sent.
    pub(super) fn measure_fork(&mut self, input: &MeasureInput<'_>, served: &Served, thread: &str, window: u64) {
        if thread != LANE_MAIN || !self.live() {
            return self.measure_as_sent(input, served);
        }
        let up_front = self.of.tools_up_front && UpFront::defers(input.body);
        if self.of.without_boundary || up_front {
            let system = match self.of.without_boundary.then(|| self.relaid_system(input.body.system.as_ref(), false)).transpose() {
                Ok(system) => system,
                Err(why) => return self.part(why),
            };
            let mut request = input.body.clone();
            let mut messages = request.messages.get(1..).unwrap_or_default().to_vec();
            let request = match laid_out(up_front, self.up_front.as_ref(), &mut messages, &mut request, system.as_ref(), Request::clone) {
                Ok(request) => request,
                Err(why) => return self.part(why),
            };
            let mine = match self.measurer.serve(&request) {
                Ok(mine) => mine,
                Err(e) => return self.part(e.to_string()),
            };
            let refusal = simulated_media_error(&request.messages).or_else(|| simulated_api_error(mine.flat.total_tokens, window));
            if refusal != input.rejected {
                return self.part(format!("a {} fork's refusal differs as the mirror sends it ({refusal:?}, the run's {:?})", input.lane, input.rejected));
            }
            return self.push(MeasureInput { body: &request, ..input.clone() }, mine);
        }
        let mut mine = served.clone();
        for flat in std::iter::once(&mut mine.flat).chain(mine.sent.as_mut()) {
            let fork = flat.markers.iter().find(|&&i| flat.blocks[i].path.region == Region::Messages).and_then(|&i| flat.marker_ttl(i)).flatten();
            let prefix = |b: &PromptBlock| b.path.region != Region::Messages;
            if let Err(why) = retime(flat, fork_prefix_ttl(self.of.run_ttl, fork), fork_prefix_ttl(self.of.ttl, fork), prefix) {
                return self.part(why);
            }
        }
        self.push(input.clone(), mine);
    }

    /// A main request, `served` as the run's measurer flattened it (salted as the run's rules
    /// guessed), before the API's answer: the mirror's own (its markers at the mirror's TTL, or
    /// `request` without the boundary or with every tool up front flattened by the mirror, its
    /// first `shared` messages those of the previous main request as [`Measurer::serve_shared`]
    /// is told, less the listing the mirror does not send), kept for [`Mirror::measure_refused`]
    /// or [`Mirror::before_main`]. The API refuses it with the media error `media` or over
    /// `window`; the mirror parts where that is not `rejection`, the run's.
    /// `run` is what the run told its measurer of the request (the run's stamp of its last
    /// main request and how many leading messages this one holds as that one sent them), and
    /// the run's stamp of this request.
    pub(super) fn serve_main(&mut self, request: &mut Request, served: &Served, run: (Option<(u64, usize)>, u64), media: Option<&str>, window: u64, rejection: Option<&str>) {
        let (run_hint, run_stamp) = run;
        let shared = run_hint.map(|(_, shared)| shared);
        if !self.live() {
            return;
        }
        let up_front = self.of.tools_up_front && UpFront::defers(request);
        if !self.of.without_boundary && !up_front {
            match self.retimed(served) {
                Ok(mine) => self.pending = Some((mine, Vec::new())),
                Err(why) => self.part(why),
            }
            return;
        }
        let system = match self.of.without_boundary.then(|| self.relaid_system(request.system.as_ref(), true)).transpose() {
            Ok(system) => system,
            Err(why) => return self.part(why),
        };
        let salts = self.client.as_deref().map_or(&[][..], |c| c.salts_hint()).to_vec();
        // (The messages the mirror shares with its last main request: the run's less the
        // listing where both took it out.)
        let shared = shared.filter(|_| self.main_up_front == up_front).map(|n| if up_front { n.saturating_sub(1) } else { n });
        if up_front {
            // The mirror's messages are the last main request's after its listing: the leading
            // ones this request holds as they are (the same content by pointer) are kept, the
            // rest taken from it. Where they are the messages of the run's last main request,
            // those the run says this one holds as that one sent them are not compared.
            let known = match run_hint {
                Some((previous, shared)) if self.messages_of == Some(previous) => shared.saturating_sub(1).min(self.messages.len()).min(request.messages.len().saturating_sub(1)),
                _ => 0,
            };
            #[cfg(debug_assertions)]
            {
                use crate::api::identical::Identical;
                debug_assert!(self.messages[..known].identical(&request.messages[1..=known]), "a message the run counts as its last main request's differs from the mirror's");
            }
            let same = |(a, b): &(&Message, &Message)| a.role == b.role && a.content.same(&b.content) && a.extra == b.extra;
            let keep = known + self.messages[known..].iter().zip(request.messages.iter().skip(known + 1)).take_while(same).count();
            self.messages.truncate(keep);
            self.messages.extend(request.messages.iter().skip(keep + 1).cloned());
            self.messages_of = Some(run_stamp);
        }
        let hint = self.main_stamp.zip(shared);
        let Mirror { up_front: tools, measurer, messages, .. } = self;
        let mine = match laid_out(up_front, tools.as_ref(), messages, request, system.as_ref(), |request| measurer.serve_shared(request, &salts, hint)) {
            Ok(mine) => mine,
            Err(why) => return self.part(why),
        };
        let (mine, stamp) = match mine {
            Ok(mine) => mine,
            Err(e) => return self.part(e.to_string()),
        };
        self.main_stamp = Some(stamp);
        self.main_up_front = up_front;
        let refusal = media.map(str::to_owned).or_else(|| simulated_api_error(mine.flat.total_tokens, window));
        if refusal.as_deref() != rejection {
            return self.part(format!("the main request's refusal differs as the mirror sends it ({refusal:?}, the run's {rejection:?})"));
        }
        self.pending = Some((mine, Vec::new()));
    }

    /// The main request [`Mirror::serve_main`] kept, which the API refused before sampling:
    /// measured as sent (no client's rules applied).
    pub(super) fn measure_refused(&mut self, input: &MeasureInput<'_>) {
        let Some((mut served, _)) = self.pending.take() else { return };
        served.flat.set_salts(&[]);
        self.push(input.clone(), served);
    }

    /// The main request [`Mirror::serve_main`] kept, which the API accepted: the mirror's own
    /// rules applied to it (their events kept for its row, [`Mirror::main_row`]), given the
    /// request as the mirror sends it (`request`, its system array, tools and first message
    /// swapped for the call) in the call `call` makes of it.
    pub(super) fn before_main(&mut self, request: &mut Request, call: impl FnOnce(&Request) -> MainCall<'_>) {
        let Some((mut mine, _)) = self.pending.take() else { return };
        let Some(client) = self.client.as_deref_mut() else {
            self.pending = Some((mine, Vec::new()));
            return;
        };
        let up_front = self.of.tools_up_front && UpFront::defers(request);
        let events = if self.of.without_boundary || up_front {
            let system = self.relaid.as_ref().filter(|_| self.of.without_boundary).map(|(_, mine)| mine.clone());
            match laid_out(up_front, self.up_front.as_ref(), &mut self.messages, request, system.as_ref(), |request| client.before_main(call(request), &mut mine.flat, &mut self.measurer)) {
                Ok(events) => events,
                Err(why) => return self.part(why),
            }
        } else {
            client.before_main(MainCall { markers_ttl: Some(self.of.ttl), ..call(request) }, &mut mine.flat, &mut self.measurer)
        };
        self.pending = Some((mine, events));
    }

    /// The row of the main request [`Mirror::before_main`] prepared: measured with `input` (the
    /// run's, whose events are those before the run's client rules: the mirror's follow; its
    /// body the run's, whose system array the measurement reads only for the attribution
    /// block's position, the same without the boundary), its recorded usage as the reply plan
    /// left the run's `row`. The mirror parts where the two rows differ in what the run goes on
    /// by: the error, and the usage `usage_of` gives the agent from a row.
    pub(super) fn main_row(&mut self, mut input: MeasureInput<'_>, row: &RequestMetrics, usage_of: impl Fn(&RequestMetrics) -> u64) {
        let Some((served, events)) = self.pending.take() else { return };
        input.events.extend(events);
        let input_messages = input.body.messages.as_slice();
        let mut mine = match self.measurer.measure_served(input, served) {
            Ok(mine) => mine,
            Err(e) => return self.part(e.to_string()),
        };
        mine.recorded_usage.clone_from(&row.recorded_usage);
        if mine.error != row.error {
            return self.part(format!("the main request's error differs under the mirror ({:?}, the run's {:?})", mine.error, row.error));
        }
        let (usage, run_usage) = (usage_of(&mine), usage_of(row));
        if usage != run_usage {
            return self.part(format!("the usage the agent is given differs under the mirror ({usage} tokens, the run's {run_usage})"));
        }
        if let Some(client) = self.client.as_deref_mut() {
            client.after_main(&mine);
        }
        if self.of.tools_up_front && mine.error.is_none() && mine.stages.iter().any(|s| s.fired && super::COMPACTION_STAGES.contains(&&*s.name)) {
            let messages = if self.main_up_front { self.messages.clone() } else { input_messages.to_vec() };
            self.compacted.push((self.rows.len(), messages));
        }
        self.rows.push(mine);
    }
}

/// `request` as a mirror sends it, given to `f`, then put back as it was: its system array
/// `system` where given, every tool up front (`up_front`'s, the messages after the listing
/// `messages`) where `swap` says; an error where the mirror cannot send it so (no `up_front`,
/// or one of other tools).
fn laid_out<R>(swap: bool, up_front: Option<&UpFront>, messages: &mut Vec<Message>, request: &mut Request, system: Option<&SharedVec<SystemBlock>>, f: impl FnOnce(&Request) -> R) -> Result<R, String> {
    let run_system = system.map(|system| request.system.replace(SystemPrompt::Blocks(system.clone())));
    let out = match up_front {
        Some(up_front) if swap => up_front.swapped(request, messages, f),
        None if swap => Err("a request that defers tools before the mirror knows what it sends up front".to_owned()),
        _ => Ok(f(request)),
    };
    if let Some(run_system) = run_system {
        request.system = run_system;
    }
    out
}

/// Moves the markers of `flat`'s blocks `which` holds from `from` to `to`; an error where one is
/// not at `from`, or where the body asks for automatic caching (the API places that marker
/// itself).
fn retime(flat: &mut FlatRequest, from: Option<CacheTtl>, to: Option<CacheTtl>, which: impl Fn(&PromptBlock) -> bool + Copy) -> Result<(), String> {
    if flat.auto_cache_control.is_some() {
        return Err("a main-lane request with automatic caching".to_owned());
    }
    if let Some(other) = flat.markers.iter().filter(|&&i| which(&flat.blocks[i])).filter_map(|&i| flat.marker_ttl(i)).find(|&ttl| ttl != from) {
        return Err(format!("a main-lane marker at {other:?}, not the run's main-lane TTL {from:?}"));
    }
    flat.set_markers_ttl_where(to, which);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CacheControl, ContentBlock, Message, MessageContent, Request, Role, SystemBlock, SystemPrompt};

    /// A request with a system marker and a message marker, both at `ttl`, flattened.
    fn flat(ttl: Option<CacheTtl>) -> FlatRequest {
        let marker = CacheControl::ephemeral().with_ttl(ttl);
        let mut request = Request::new("claude-opus-4-5-20251101", 1000);
        request.system = Some(SystemPrompt::Blocks(vec![SystemBlock::text("the system prompt").with_cache_control(Some(marker.clone()))].into()));
        let mut block = ContentBlock::text("a question");
        block.set_cache_control(Some(marker));
        request.messages = vec![Message { role: Role::User, content: MessageContent::Blocks(vec![block].into()), extra: Default::default() }];
        let mut counter = crate::measure::TokenCounter::new(crate::measure::EstimatorKind::Chars4);
        crate::measure::flatten(&request, &mut counter, "claude")
    }

    fn ttls(flat: &FlatRequest) -> Vec<(Region, Option<CacheTtl>)> {
        flat.markers.iter().map(|&i| (flat.blocks[i].path.region, flat.marker_ttl(i).flatten())).collect()
    }

    #[test]
    fn retiming_moves_the_markers_asked_for_and_no_hash() {
        let before = flat(None);
        let mut all = before.clone();
        retime(&mut all, None, Some(CacheTtl::OneHour), |_| true).unwrap();
        assert_eq!(ttls(&all), vec![(Region::System, Some(CacheTtl::OneHour)), (Region::Messages, Some(CacheTtl::OneHour))]);
        let hashes = |f: &FlatRequest| f.blocks.iter().map(|b| (b.hash, b.prefix_hash, b.tokens)).collect::<Vec<_>>();
        assert_eq!(hashes(&all), hashes(&before));
        // As the agent sends it at 1h.
        assert_eq!(ttls(&all), ttls(&flat(Some(CacheTtl::OneHour))));
        let mut prefix = before.clone();
        retime(&mut prefix, None, Some(CacheTtl::OneHour), |b| b.path.region != Region::Messages).unwrap();
        assert_eq!(ttls(&prefix), vec![(Region::System, Some(CacheTtl::OneHour)), (Region::Messages, None)]);
    }

    #[test]
    fn retiming_copies_no_record_and_the_cache_reads_the_new_ttls() {
        use crate::measure::cache::CacheSim;
        let before = flat(None);
        let mut all = before.clone();
        retime(&mut all, None, Some(CacheTtl::OneHour), |_| true).unwrap();
        assert!(std::sync::Arc::ptr_eq(&all.blocks, &before.blocks), "the records are shared, not copied");
        let sent_at_1h = flat(Some(CacheTtl::OneHour));
        assert_eq!(CacheSim::breakpoints(&all).unwrap(), CacheSim::breakpoints(&sent_at_1h).unwrap());
        assert_eq!(*all.with_ttl_overrides_applied().blocks, *sent_at_1h.blocks);
        // Back at the records' own TTL: no override left.
        retime(&mut all, Some(CacheTtl::OneHour), None, |_| true).unwrap();
        assert!(all.ttl_overrides.is_empty());
        assert_eq!(all, before);
        // Only the messages' marker: the 5-minute marker after the 1-hour one is accepted, and
        // the other way round is refused (1h must come first).
        let mut messages = flat(Some(CacheTtl::OneHour));
        retime(&mut messages, Some(CacheTtl::OneHour), None, |b| b.path.region == Region::Messages).unwrap();
        assert_eq!(CacheSim::breakpoints(&messages).unwrap(), CacheSim::breakpoints(&messages.with_ttl_overrides_applied()).unwrap());
        let mut system = before.clone();
        retime(&mut system, None, Some(CacheTtl::OneHour), |b| b.path.region == Region::Messages).unwrap();
        assert!(CacheSim::breakpoints(&system).is_err());
    }

    #[test]
    fn a_marker_at_another_ttl_than_the_runs_is_refused() {
        let mut one_hour = flat(Some(CacheTtl::OneHour));
        let error = retime(&mut one_hour, None, Some(CacheTtl::OneHour), |_| true).unwrap_err();
        assert!(error.contains("not the run's main-lane TTL"), "{error}");
        assert_eq!(ttls(&one_hour), ttls(&flat(Some(CacheTtl::OneHour))));
    }

    #[test]
    fn a_fork_at_1h_sends_its_prefix_at_1h_else_at_the_threads_ttl() {
        assert_eq!(fork_prefix_ttl(None, Some(CacheTtl::OneHour)), Some(CacheTtl::OneHour));
        assert_eq!(fork_prefix_ttl(Some(CacheTtl::OneHour), None), Some(CacheTtl::OneHour));
        assert_eq!(fork_prefix_ttl(None, None), None);
    }
}
