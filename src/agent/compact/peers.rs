//! Other agents' context strategies (../shared/reference/peers.md §1), as pure functions over the
//! conversation's wire messages.
//!
//! Trigger: each mechanism has its own (a count of tool results, a token threshold of the
//! window). What it rewrites: tool result contents (masking, pruning), or the whole history
//! (Codex rebuild, Cline truncation). What it must preserve: every `tool_use` keeps its
//! `tool_result` (results are replaced by a placeholder, never removed on their own; truncation
//! drops whole user/assistant pairs). Which prefix it invalidates: from the first rewritten
//! message on — masking and pruning move their cut every time they fire, which is why
//! SWE-agent's docstring warns that they "break prompt caching".
//!
//! Tokens are estimated as characters / 4: the functions are pure and need no estimator; the
//! callers report the measured tokens before and after.

use serde::{Deserialize, Serialize};

use crate::api::{ContentBlock, Message, MessageContent, Role, ToolResultContent};

/// Placeholder for a masked or pruned tool result (opencode's text; SWE-agent says
/// "Old environment output").
pub const CLEARED_PLACEHOLDER: &str = "[Old tool result content cleared]";

/// Which peer mechanism runs on top of (or instead of) Claude Code's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerStrategy {
    /// None: Claude Code's own chain only.
    None,
    /// Codex: at `trigger_pct` of the window, rebuild as initial context + the last
    /// `user_message_max_tokens` of user messages + the summary.
    Codex,
    /// opencode: prune old tool outputs protecting the last `protect_tokens` when at least
    /// `minimum_tokens` can be freed; at the window minus `buffer_tokens`, summary + recent tail.
    Opencode,
    /// SWE-agent / "The Complexity Trap": all but the last `keep_recent` tool results masked.
    ObservationMasking,
    /// Cline: at window − `buffer_tokens`, drop half of the user/assistant pairs after the first.
    Cline,
    /// API server-side compaction (`context_management.edits: [{type: compact_20260112,
    /// trigger}]`): at `server_trigger_tokens` input tokens the API replaces the history before
    /// the request with a compaction block the client sends back from then on. Modelled as a
    /// summary with no tail.
    ServerCompaction,
}

/// The knobs of [`PeerStrategy`]; each mechanism reads the ones it names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PeerConfig {
    pub strategy: PeerStrategy,
    /// Codex `auto_compact_token_limit` = window × 9 / 10.
    pub trigger_pct: u64,
    /// Codex `COMPACT_USER_MESSAGE_MAX_TOKENS`.
    pub user_message_max_tokens: u64,
    /// opencode `PRUNE_PROTECT`.
    pub protect_tokens: u64,
    /// opencode `PRUNE_MINIMUM`.
    pub minimum_tokens: u64,
    /// opencode `COMPACTION_BUFFER` / Cline's reserve below the window (40k at 200k).
    pub buffer_tokens: u64,
    /// opencode's preserved recent tail after a summary (clamp(25% usable, 2k..15k)).
    pub tail_tokens: u64,
    /// Observation masking: tool results kept verbatim.
    pub keep_recent: usize,
    /// Size of a summary (Codex, opencode, server compaction) in tokens.
    pub summary_tokens: u64,
    /// Server compaction's `trigger` in input tokens (the API's default: 150,000).
    pub server_trigger_tokens: u64,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig {
            strategy: PeerStrategy::None,
            trigger_pct: 90,
            user_message_max_tokens: 20_000,
            protect_tokens: 40_000,
            minimum_tokens: 20_000,
            buffer_tokens: 20_000,
            tail_tokens: 15_000,
            keep_recent: 5,
            summary_tokens: 2_000,
            server_trigger_tokens: 150_000,
        }
    }
}

/// What one application did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerOutcome {
    /// Stage id for traces (`observation_masking`, `opencode_prune`, `opencode_summary`,
    /// `codex_compact`, `cline_truncate`); empty when nothing fired.
    pub stage: &'static str,
    pub fired: bool,
    pub reason: String,
    pub tokens_before: u64,
    pub tokens_after: u64,
}

/// Estimated tokens of messages (characters / 4, rounded up per block).
pub fn estimate_tokens(messages: &[Message]) -> u64 {
    messages.iter().map(message_tokens).sum()
}

fn message_tokens(message: &Message) -> u64 {
    match &message.content {
        MessageContent::Text(t) => chars4(t.len()),
        MessageContent::Blocks(blocks) => blocks.iter().map(block_tokens).sum(),
    }
}

fn block_tokens(block: &ContentBlock) -> u64 {
    match block {
        ContentBlock::Text { text, .. } => chars4(text.len()),
        ContentBlock::ToolUse { input, .. } | ContentBlock::ServerToolUse { input, .. } => chars4(crate::measure::tokens::json_len(input)),
        ContentBlock::ToolResult { content, .. } => chars4(content.as_ref().map_or(0, ToolResultContent::text_len)),
        ContentBlock::Thinking { thinking, .. } => chars4(thinking.len()),
        ContentBlock::RedactedThinking { data, .. } => chars4(data.len()),
        _ => 0,
    }
}

/// The tokens a tool result of `tokens` estimated tokens stands for once it is the placeholder
/// (the estimate is a sum over blocks, so a clearing changes it by this much).
fn cleared_change(tokens: u64) -> i64 {
    chars4(CLEARED_PLACEHOLDER.len()) as i64 - tokens as i64
}

fn chars4(len: usize) -> u64 {
    (len as u64).div_ceil(4)
}

/// Positions `(message, block)` of every tool result, oldest first.
fn tool_results(messages: &[Message]) -> Vec<(usize, usize, u64)> {
    let mut out = Vec::new();
    for (m, message) in messages.iter().enumerate() {
        if let MessageContent::Blocks(blocks) = &message.content {
            for (b, block) in blocks.iter().enumerate() {
                if let ContentBlock::ToolResult { content, .. } = block {
                    let is_placeholder = matches!(content, Some(ToolResultContent::Text(t)) if t == CLEARED_PLACEHOLDER);
                    if !is_placeholder {
                        out.push((m, b, block_tokens(block)));
                    }
                }
            }
        }
    }
    out
}

fn clear_result(blocks: &mut [ContentBlock], b: usize) {
    if let ContentBlock::ToolResult { content, .. } = &mut blocks[b] {
        *content = Some(ToolResultContent::Text(CLEARED_PLACEHOLDER.into()));
    }
}

/// The tool results at `victims` (`(message, block, tokens)`) cleared, each message's through
/// `memo` when there is one (the same results of the same blocks cleared once, and shared with
/// the request before). Returns the change in [`estimate_tokens`].
fn clear_results(messages: &mut [Message], victims: &[(usize, usize, u64)], mut memo: Option<&mut crate::agent::normalize::BlocksMemo>) -> i64 {
    let change = victims.iter().map(|&(_, _, tokens)| cleared_change(tokens)).sum();
    // By message, then block: each message's blocks in one run (one list, no map).
    let mut positions: Vec<(usize, usize)> = victims.iter().map(|&(m, b, _)| (m, b)).collect();
    positions.sort_unstable();
    let mut at: Vec<usize> = Vec::new();
    for run in positions.chunk_by(|x, y| x.0 == y.0) {
        let m = run[0].0;
        at.clear();
        at.extend(run.iter().map(|&(_, b)| b));
        let MessageContent::Blocks(blocks) = &mut messages[m].content else { continue };
        let clear = |blocks: &mut Vec<ContentBlock>| at.iter().for_each(|&b| clear_result(blocks, b));
        match memo.as_deref_mut() {
            Some(memo) => memo.apply(m, blocks, &at, clear),
            None => clear(blocks),
        }
    }
    change
}

/// SWE-agent `last_n_observations`: every tool result but the last `keep_recent` becomes the
/// placeholder.
pub fn observation_masking(messages: &mut [Message], keep_recent: usize) -> PeerOutcome {
    masking(messages, keep_recent, None)
}

/// [`observation_masking`], its clearings through `memo` when there is one.
fn masking(messages: &mut [Message], keep_recent: usize, memo: Option<&mut PeerMemo>) -> PeerOutcome {
    let (before, clear_memo) = match memo {
        Some(memo) => {
            // A rebuilt, shorter history leaves no entries past its end alive.
            memo.cleared.truncate(messages.len());
            (memo.estimate(messages), Some(&mut memo.cleared))
        }
        None => (estimate_tokens(messages), None),
    };
    let results = tool_results(messages);
    let cut = results.len().saturating_sub(keep_recent);
    let change = clear_results(messages, &results[..cut], clear_memo);
    // The estimate is a sum over blocks: only the cleared ones changed.
    let after = before.saturating_add_signed(change);
    debug_assert_eq!(after, estimate_tokens(messages));
    masking_report(cut, results.len(), keep_recent, before, after)
}

/// The report of a masking that clears `cut` of `results` tool results.
fn masking_report(cut: usize, results: usize, keep_recent: usize, before: u64, after: u64) -> PeerOutcome {
    PeerOutcome { stage: "observation_masking", fired: cut > 0, reason: format!("{cut} of {results} tool results masked (keep {keep_recent})"), tokens_before: before, tokens_after: after }
}

/// opencode prune: walking back from the newest, skip the last two user turns, protect
/// `protect` tokens of tool output, and clear older outputs — only when at least `minimum`
/// tokens would be freed.
pub fn opencode_prune(messages: &mut [Message], protect: u64, minimum: u64) -> PeerOutcome {
    prune(messages, protect, minimum, None)
}

/// [`opencode_prune`], its clearings through `memo` when there is one.
fn prune(messages: &mut [Message], protect: u64, minimum: u64, memo: Option<&mut PeerMemo>) -> PeerOutcome {
    let (before, clear_memo) = match memo {
        Some(memo) => {
            // A rebuilt, shorter history leaves no entries past its end alive.
            memo.cleared.truncate(messages.len());
            (memo.estimate(messages), Some(&mut memo.cleared))
        }
        None => (estimate_tokens(messages), None),
    };
    let (victims, freed) = prune_victims(messages, protect);
    let fire = freed >= minimum && !victims.is_empty();
    let change = if fire { clear_results(messages, &victims, clear_memo) } else { 0 };
    // The estimate is a sum over blocks: only the cleared ones changed.
    let after = before.saturating_add_signed(change);
    debug_assert_eq!(after, estimate_tokens(messages));
    prune_report(fire, freed, protect, minimum, before, after)
}

/// The tool results opencode's prune would clear (`(message, block, tokens)`, newest first) if it
/// fired, and the tokens they free: walking back from the newest, past the last two user turns
/// and `protect` tokens of tool output.
fn prune_victims(messages: &[Message], protect: u64) -> (Vec<(usize, usize, u64)>, u64) {
    let boundary = last_two_turns(messages);
    let mut protected = 0u64;
    let mut victims = Vec::new();
    let mut freed = 0u64;
    for &(m, b, tokens) in tool_results(messages).iter().rev() {
        if m >= boundary {
            continue;
        }
        if protected < protect {
            protected += tokens;
            continue;
        }
        victims.push((m, b, tokens));
        freed += tokens;
    }
    (victims, freed)
}

/// The report of a prune that finds `freed` tokens prunable (and fired or not).
fn prune_report(fired: bool, freed: u64, protect: u64, minimum: u64, before: u64, after: u64) -> PeerOutcome {
    // (Made at its size without the formatting machinery: a prune runs dry on every request.)
    let (mut a, mut b, mut c) = (itoa::Buffer::new(), itoa::Buffer::new(), itoa::Buffer::new());
    let reason = [a.format(freed), " tokens prunable (minimum ", b.format(minimum), ", protect ", c.format(protect), ")"].concat();
    PeerOutcome { stage: "opencode_prune", fired, reason, tokens_before: before, tokens_after: after }
}

/// Where opencode's prune stops looking: the start of the last two user turns (user messages
/// carrying text, not only tool results); `0` when there are fewer.
fn last_two_turns(messages: &[Message]) -> usize {
    let mut user_turns = 0;
    for (i, message) in messages.iter().enumerate().rev() {
        if message.role == Role::User && is_prompt(message) {
            user_turns += 1;
            if user_turns == 2 {
                return i;
            }
        }
    }
    0
}

/// Whether a user message is a prompt (has text) rather than only tool results.
fn is_prompt(message: &Message) -> bool {
    match &message.content {
        MessageContent::Text(_) => true,
        MessageContent::Blocks(blocks) => blocks.iter().any(|b| matches!(b, ContentBlock::Text { .. })),
    }
}

/// A summary message of about `tokens` tokens (deterministic text).
fn summary_message(label: &str, tokens: u64) -> Message {
    let mut text = format!("<summary source=\"{label}\">\n");
    let filler = "The conversation so far: goals, progress, constraints and next steps. ";
    while (text.len() as u64) < tokens * 4 {
        text.push_str(filler);
    }
    text.push_str("</summary>");
    Message { role: Role::User, content: MessageContent::Text(text.into()), extra: Default::default() }
}

/// Codex `build_compacted_history`: initial context (the first message, rebuilt) + the most
/// recent user messages up to `user_max` tokens (newest kept, the oldest one truncated) + the
/// summary as a user message. Assistant and tool items are dropped.
pub fn codex_rebuild(messages: &[Message], user_max: u64, summary_tokens: u64) -> Vec<Message> {
    let mut out = Vec::new();
    let Some(first) = messages.first() else { return out };
    out.push(first.clone());
    let mut kept: Vec<Message> = Vec::new();
    let mut budget = user_max;
    for message in messages[1..].iter().rev() {
        if message.role != Role::User || !is_prompt(message) || budget == 0 {
            continue;
        }
        let text = message.content.joined_text();
        let tokens = chars4(text.len());
        let text = if tokens > budget {
            // Keep the newest part of a too-long message.
            let keep = (budget * 4) as usize;
            let start = text.len() - keep.min(text.len());
            let start = (start..=text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(text.len());
            text[start..].to_owned()
        } else {
            text
        };
        budget = budget.saturating_sub(tokens);
        kept.push(Message { role: Role::User, content: MessageContent::Text(text.into()), extra: Default::default() });
    }
    kept.reverse();
    out.extend(kept);
    out.push(summary_message("codex", summary_tokens));
    merge_consecutive_users(out)
}

/// opencode summary checkpoint: the first message, the summary, and the most recent tail of
/// whole rounds up to `tail_tokens` (never starting on a tool result whose use was dropped).
pub fn opencode_summary(messages: &[Message], tail_tokens: u64, summary_tokens: u64) -> Vec<Message> {
    let Some(first) = messages.first() else { return Vec::new() };
    let mut start = messages.len();
    let mut tokens = 0u64;
    for i in (1..messages.len()).rev() {
        tokens += message_tokens(&messages[i]);
        if tokens > tail_tokens {
            break;
        }
        start = i;
    }
    // Start the tail on a user prompt so that no tool_result loses its tool_use.
    while start < messages.len() && !(messages[start].role == Role::User && is_prompt(&messages[start]) && !has_tool_result(&messages[start])) {
        start += 1;
    }
    let mut out = vec![first.clone(), summary_message("opencode", summary_tokens)];
    out.extend(messages[start..].iter().cloned());
    merge_consecutive_users(out)
}

fn has_tool_result(message: &Message) -> bool {
    matches!(&message.content, MessageContent::Blocks(b) if b.iter().any(|b| matches!(b, ContentBlock::ToolResult { .. })))
}

/// Cline: keep the first user/assistant pair, drop half of the pairs after it (the oldest), and
/// insert a truncation notice. Returns the number of messages dropped.
pub fn cline_truncate(messages: &mut Vec<Message>) -> usize {
    if messages.len() <= 3 {
        return 0;
    }
    let rest = messages.len() - 2;
    let mut drop = (rest / 2) & !1; // an even count: whole pairs
    // The message after the cut must be an assistant's reply to a dropped user message? No:
    // it must not be a user message made only of tool results whose uses were dropped.
    while drop > 0 && 2 + drop < messages.len() && messages[2 + drop].role == Role::User && has_tool_result(&messages[2 + drop]) {
        drop -= 2;
    }
    if drop == 0 {
        return 0;
    }
    messages.drain(2..2 + drop);
    if let MessageContent::Blocks(blocks) = &mut messages[0].content {
        blocks.push(ContentBlock::text("[NOTE] Some previous conversation history has been removed to keep the context window manageable."));
    } else if let MessageContent::Text(t) = &messages[0].content {
        messages[0].content = MessageContent::Blocks(vec![
            ContentBlock::text(t.clone()),
            ContentBlock::text("[NOTE] Some previous conversation history has been removed to keep the context window manageable."),
        ].into());
    }
    drop
}

fn merge_consecutive_users(messages: Vec<Message>) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    for message in messages {
        match out.last_mut() {
            Some(last) if last.role == Role::User && message.role == Role::User => {
                let mut blocks = last.content.to_blocks();
                blocks.extend(message.content.to_blocks());
                last.content = MessageContent::Blocks(blocks.into());
            }
            _ => out.push(message),
        }
    }
    out
}

/// State a peer keeps across requests: the rewrite of history done by its last compaction,
/// applied again to later requests that extend the same history (append-only).
#[derive(Debug, Clone, Default)]
pub struct PeerState {
    /// Length of the original history the replacement stands for, and the replacement.
    compacted: Option<(usize, Vec<Message>)>,
    /// Messages of the original history seen last (to notice a history that shrank).
    last_len: usize,
    /// What the masking and pruning did to the same messages before ([`PeerMemo`]).
    memo: PeerMemo,
}

/// What a peer's rewrites gave for each message of the history, keyed by the message's blocks
/// ([`crate::agent::normalize::BlocksMemo`]): the results cleared in it, and its estimated tokens
/// with the tool results it holds (those [`tool_results`] lists: their number and estimated
/// tokens), summed up to each position. Only saves work; every figure is what the pure
/// functions give.
#[derive(Debug, Clone, Default)]
struct PeerMemo {
    cleared: crate::agent::normalize::BlocksMemo,
    tokens: Vec<Option<(crate::api::SharedBlocks, MessageFigures)>>,
    /// `sums[i]`: the figures of the first `i` messages of the last estimate (one more entry
    /// than it had messages).
    sums: Vec<MessageFigures>,
    /// The stamp of the messages of the last estimate ([`PeerState::probe_stamped`]), `0` when
    /// they had none.
    seen: u64,
}

/// A message's estimated tokens ([`estimate_tokens`]), and the number and estimated tokens of
/// its tool results that [`tool_results`] lists (the ones not yet the placeholder).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct MessageFigures {
    tokens: u64,
    results: u64,
    result_tokens: u64,
}

impl MessageFigures {
    fn add(self, other: MessageFigures) -> MessageFigures {
        MessageFigures { tokens: self.tokens + other.tokens, results: self.results + other.results, result_tokens: self.result_tokens + other.result_tokens }
    }
}

/// The figures of one message's blocks.
fn block_figures(blocks: &[ContentBlock]) -> MessageFigures {
    let mut figures = MessageFigures::default();
    for block in blocks {
        let tokens = block_tokens(block);
        figures.tokens += tokens;
        if let ContentBlock::ToolResult { content, .. } = block
            && !matches!(content, Some(ToolResultContent::Text(t)) if t == CLEARED_PLACEHOLDER)
        {
            figures.results += 1;
            figures.result_tokens += tokens;
        }
    }
    figures
}

impl PeerMemo {
    /// [`estimate_tokens`] of `messages`, each message's blocks estimated once.
    fn estimate(&mut self, messages: &[Message]) -> u64 {
        self.seen = 0;
        self.estimate_from(messages, 0)
    }

    /// [`PeerMemo::estimate`] of messages whose first `known` are the same allocations, at the
    /// same positions, as the last estimate's: their sum is taken as it stands, and only the
    /// messages after them are looked at.
    fn estimate_from(&mut self, messages: &[Message], known: usize) -> u64 {
        let known = known.min(messages.len()).min(self.sums.len().saturating_sub(1));
        #[cfg(debug_assertions)]
        for (message, kept) in messages[..known].iter().zip(&self.tokens) {
            if let MessageContent::Blocks(blocks) = &message.content {
                debug_assert!(kept.as_ref().is_some_and(|(previous, _)| previous.same(blocks)), "a message taken as known is not the last estimate's");
            }
        }
        self.tokens.truncate(messages.len());
        self.tokens.resize(messages.len(), None);
        self.sums.truncate(known + 1);
        if self.sums.is_empty() {
            self.sums.push(MessageFigures::default());
        }
        let mut total = self.sums[known];
        self.sums.reserve(messages.len() - known);
        for (message, kept) in messages[known..].iter().zip(&mut self.tokens[known..]) {
            let figures = match &message.content {
                MessageContent::Text(t) => MessageFigures { tokens: chars4(t.len()), ..MessageFigures::default() },
                MessageContent::Blocks(blocks) => match kept {
                    Some((previous, figures)) if previous.same(blocks) => *figures,
                    _ => {
                        let figures = block_figures(blocks);
                        *kept = Some((blocks.clone(), figures));
                        figures
                    }
                },
            };
            total = total.add(figures);
            self.sums.push(total);
        }
        debug_assert_eq!(total.tokens, estimate_tokens(messages));
        total.tokens
    }

    /// Where the last estimate's messages are: what [`prune_victims`] finds on them, without
    /// listing every tool result: whether it finds any victim, and the tokens they free. The
    /// results are walked back from the newest only while they protect fewer than `protect`
    /// tokens; the older ones are read from the sums.
    fn prune_figures(&self, messages: &[Message], protect: u64) -> (bool, u64) {
        debug_assert_eq!(self.sums.len(), messages.len() + 1, "the figures are the last estimate's");
        let boundary = last_two_turns(messages);
        let mut protected = 0u64;
        for m in (0..boundary).rev() {
            let MessageContent::Blocks(blocks) = &messages[m].content else { continue };
            let mut results = blocks.iter().rev().filter_map(|block| match block {
                ContentBlock::ToolResult { content, .. } if !matches!(content, Some(ToolResultContent::Text(t)) if t == CLEARED_PLACEHOLDER) => Some(block_tokens(block)),
                _ => None,
            });
            for tokens in results.by_ref() {
                if protected < protect {
                    protected += tokens;
                    continue;
                }
                // Every result from this one back is a victim: this one, the rest of this
                // message's, and every earlier message's.
                let rest: u64 = results.sum();
                let earlier = self.sums[m].result_tokens;
                return (true, tokens + rest + earlier);
            }
            if protected >= protect {
                // Protection ends at this message's first result: every earlier one is a victim.
                let earlier = self.sums[m];
                return (earlier.results > 0, earlier.result_tokens);
            }
        }
        (false, 0)
    }
}

impl PeerConfig {
    /// The estimated count ([`PeerState::apply`]'s `before`: the messages' estimate plus the
    /// tokens outside them) from which the mechanism may rewrite anything, for the mechanisms
    /// that do nothing at all below one count (Codex, Cline, server compaction): below it,
    /// [`PeerState::apply`] leaves the messages as they are and reports nothing. `None` for the
    /// others (masking, opencode's prune: what they do depends on more than a count) and for
    /// no mechanism.
    pub fn rewrite_trigger(&self, window: u64) -> Option<u64> {
        match self.strategy {
            PeerStrategy::Codex => Some(window * self.trigger_pct / 100),
            PeerStrategy::ServerCompaction => Some(self.server_trigger_tokens),
            PeerStrategy::Cline => Some(window.saturating_sub(self.buffer_tokens).max(window * 8 / 10)),
            PeerStrategy::None | PeerStrategy::Opencode | PeerStrategy::ObservationMasking => None,
        }
    }

    /// Whether [`PeerState::dry_run`] tells, request by request, whether the mechanism would
    /// rewrite anything and what it reports where it would not: the mechanisms with no
    /// [`PeerConfig::rewrite_trigger`] (opencode's prune and summary, observation masking).
    pub fn dry_runs(&self) -> bool {
        matches!(self.strategy, PeerStrategy::Opencode | PeerStrategy::ObservationMasking)
    }
}

/// The window a peer mechanism reads (the world's context window, 200k when unset).
pub fn peer_window(context_window: Option<u64>) -> u64 {
    context_window.unwrap_or(200_000)
}

impl PeerState {
    /// This state without its memo, which only saves work (for debug builds' comparisons of
    /// run states).
    #[cfg(debug_assertions)]
    pub fn without_memo(&self) -> PeerState {
        PeerState { compacted: self.compacted.clone(), last_len: self.last_len, memo: PeerMemo::default() }
    }

    /// The count a mechanism with a [`PeerConfig::rewrite_trigger`] would compare with it on
    /// `messages` (the messages' estimate plus `base_tokens`), without applying any: what a run
    /// under no mechanism records so that a run under one may be proven to have done the same.
    /// Only the estimate's memo is kept.
    pub fn probe(&mut self, messages: &[Message], base_tokens: u64) -> u64 {
        self.memo.estimate(messages) + base_tokens
    }

    /// [`PeerState::probe`] of messages named by `stamp` (a state of them no other messages
    /// share, [`crate::shared::fresh_stamp`]), whose first `shared.1` are, where `shared.0` is
    /// the stamp of the messages this state last read, those messages' own (the same
    /// allocations at the same positions): their estimate is not read again. Later calls with
    /// `shared` naming `stamp` read nothing of the messages it names.
    pub fn probe_stamped(&mut self, messages: &[Message], base_tokens: u64, stamp: u64, shared: Option<(u64, usize)>) -> u64 {
        let known = match shared {
            Some((previous, count)) if previous != 0 && previous == self.memo.seen => count,
            _ => 0,
        };
        let total = self.memo.estimate_from(messages, known);
        self.memo.seen = stamp;
        total + base_tokens
    }

    /// What [`PeerState::apply`] under `config` (a mechanism that [`PeerConfig::dry_runs`])
    /// would report on `messages`, where it would rewrite nothing; `None` where it would rewrite
    /// something (or has a rewrite of its own to apply again, which a state that never rewrote
    /// has not). The messages are left as they are, and the state as that application would
    /// leave it where it rewrites nothing: what a run under no mechanism records so that a run
    /// under this one may be proven to have done the same (checked against applying it in
    /// debug builds).
    pub fn dry_run(&mut self, config: &PeerConfig, messages: &[Message], window: u64, base_tokens: u64) -> Option<Vec<PeerOutcome>> {
        self.dry_run_stamped(config, messages, window, base_tokens, 0)
    }

    /// [`PeerState::dry_run`] of messages named by `stamp` ([`PeerState::probe_stamped`]; `0`:
    /// none): where they are those this state last read, their figures are taken as they
    /// stand, and opencode's prune and masking count their tool results from them.
    pub fn dry_run_stamped(&mut self, config: &PeerConfig, messages: &[Message], window: u64, base_tokens: u64, stamp: u64) -> Option<Vec<PeerOutcome>> {
        #[cfg(debug_assertions)]
        let applied = {
            let (mut state, mut copy) = (self.clone(), messages.to_vec());
            let outcomes = state.apply(config, &mut copy, window, base_tokens);
            (outcomes, copy[..] == *messages, state.last_len)
        };
        // (As `apply_after` starts.)
        if messages.len() < self.last_len {
            self.compacted = None;
        }
        self.last_len = messages.len();
        let outcomes = if self.compacted.is_some() {
            None
        } else {
            self.memo.cleared.truncate(messages.len());
            let before = if stamp != 0 && stamp == self.memo.seen {
                self.memo.estimate_from(messages, messages.len())
            } else {
                self.memo.estimate(messages)
            };
            self.memo.seen = stamp;
            match config.strategy {
                PeerStrategy::Opencode => {
                    let (any, freed) = self.memo.prune_figures(messages, config.protect_tokens);
                    #[cfg(debug_assertions)]
                    {
                        let (victims, listed) = prune_victims(messages, config.protect_tokens);
                        debug_assert_eq!((any, freed), (!victims.is_empty(), listed), "the prune's figures from the sums differ from listing its victims");
                    }
                    let prunes = freed >= config.minimum_tokens && any;
                    let summarizes = before + base_tokens >= window.saturating_sub(config.buffer_tokens);
                    (!prunes && !summarizes).then(|| vec![prune_report(false, freed, config.protect_tokens, config.minimum_tokens, before, before)])
                }
                PeerStrategy::ObservationMasking => {
                    let results = self.memo.sums.last().map_or(0, |figures| figures.results as usize);
                    debug_assert_eq!(results, tool_results(messages).len(), "the tool results counted in the sums differ from listing them");
                    (results <= config.keep_recent).then(|| vec![masking_report(0, results, config.keep_recent, before, before)])
                }
                PeerStrategy::None | PeerStrategy::Codex | PeerStrategy::Cline | PeerStrategy::ServerCompaction => None,
            }
        };
        #[cfg(debug_assertions)]
        match &outcomes {
            Some(outcomes) => debug_assert_eq!((outcomes, true, self.last_len), (&applied.0, applied.1, applied.2), "a dry run reports what applying reports"),
            None => debug_assert!(!config.dry_runs() || self.compacted.is_some() || applied.0.iter().any(|o| o.fired), "a dry run says the mechanism rewrites where it does: {:?}", applied.0),
        }
        outcomes
    }

    /// Applies the peer to the messages of one request (the history as the recorded client
    /// saw it) with a context window of `window` tokens and `base_tokens` outside the messages
    /// (system, tools). Returns what fired (possibly several stages).
    pub fn apply(&mut self, config: &PeerConfig, messages: &mut Vec<Message>, window: u64, base_tokens: u64) -> Vec<PeerOutcome> {
        self.apply_after(config, messages, 0, window, base_tokens)
    }

    /// [`PeerState::apply`] to the history after the first `front` messages, which the request
    /// puts in front of it (the deferred tools' listing): they stay where they are, so that
    /// neither the peer nor the request moves every message of the history.
    pub fn apply_after(&mut self, config: &PeerConfig, messages: &mut Vec<Message>, front: usize, window: u64, base_tokens: u64) -> Vec<PeerOutcome> {
        let mut out = Vec::new();
        if config.strategy == PeerStrategy::None {
            return out;
        }
        let front = front.min(messages.len());
        // The history after the front messages, replaced by `rebuilt`.
        let replace = |messages: &mut Vec<Message>, rebuilt: Vec<Message>| {
            messages.truncate(front);
            messages.extend(rebuilt);
        };
        let original_len = messages.len() - front;
        if original_len < self.last_len {
            // The recorded history was itself compacted: start over.
            self.compacted = None;
        }
        self.last_len = original_len;
        if let Some((len, replacement)) = &self.compacted
            && original_len >= *len
        {
            let tail = messages.split_off(front + *len);
            let mut history = replacement.clone();
            history.extend(tail);
            replace(messages, merge_consecutive_users(history));
        }
        let tokens = || base_tokens;
        match config.strategy {
            PeerStrategy::None => {}
            PeerStrategy::ObservationMasking => out.push(masking(&mut messages[front..], config.keep_recent, Some(&mut self.memo))),
            PeerStrategy::Codex => {
                let threshold = window * config.trigger_pct / 100;
                let before = self.memo.estimate(&messages[front..]) + tokens();
                if before >= threshold {
                    let rebuilt = codex_rebuild(&messages[front..], config.user_message_max_tokens, config.summary_tokens);
                    self.compacted = Some((original_len, rebuilt.clone()));
                    replace(messages, rebuilt);
                    out.push(outcome("codex_compact", true, format!("{before} ≥ {threshold}"), before, estimate_tokens(&messages[front..]) + tokens()));
                }
            }
            PeerStrategy::Opencode => {
                let pruned = prune(&mut messages[front..], config.protect_tokens, config.minimum_tokens, Some(&mut self.memo));
                // The prune's estimate after it is the messages' estimate now.
                let before = pruned.tokens_after + tokens();
                out.push(pruned);
                let threshold = window.saturating_sub(config.buffer_tokens);
                if before >= threshold {
                    let rebuilt = opencode_summary(&messages[front..], config.tail_tokens, config.summary_tokens);
                    // The tail of the replacement is original history: keep only the head.
                    self.compacted = Some((original_len, rebuilt.clone()));
                    replace(messages, rebuilt);
                    out.push(outcome("opencode_summary", true, format!("{before} ≥ {threshold}"), before, estimate_tokens(&messages[front..]) + tokens()));
                }
            }
            PeerStrategy::ServerCompaction => {
                let before = self.memo.estimate(&messages[front..]) + tokens();
                if before >= config.server_trigger_tokens {
                    let rebuilt = opencode_summary(&messages[front..], 0, config.summary_tokens);
                    self.compacted = Some((original_len, rebuilt.clone()));
                    replace(messages, rebuilt);
                    out.push(outcome("server_compaction", true, format!("{before} ≥ {}", config.server_trigger_tokens), before, estimate_tokens(&messages[front..]) + tokens()));
                }
            }
            PeerStrategy::Cline => {
                let threshold = window.saturating_sub(config.buffer_tokens).max(window * 8 / 10);
                let before = self.memo.estimate(&messages[front..]) + tokens();
                if before >= threshold {
                    let mut history = messages.split_off(front);
                    let dropped = cline_truncate(&mut history);
                    if dropped > 0 {
                        self.compacted = Some((original_len, history.clone()));
                        out.push(outcome("cline_truncate", true, format!("{dropped} messages dropped at {before} ≥ {threshold}"), before, estimate_tokens(&history) + tokens()));
                    }
                    messages.append(&mut history);
                }
            }
        }
        out
    }
}

/// API context editing `clear_tool_uses_20250919`: once the input reaches `trigger` tokens,
/// the oldest tool results are cleared server-side, keeping the last `keep` tool uses.
pub fn clear_tool_uses(messages: &mut [Message], trigger: u64, keep: usize, base_tokens: u64) -> PeerOutcome {
    let before = estimate_tokens(messages) + base_tokens;
    if before < trigger {
        return outcome("context_editing", false, format!("{before} < trigger {trigger}"), before, before);
    }
    let mut o = observation_masking(messages, keep);
    o.stage = "context_editing";
    o.tokens_before += base_tokens;
    o.tokens_after += base_tokens;
    o
}

fn outcome(stage: &'static str, fired: bool, reason: String, before: u64, after: u64) -> PeerOutcome {
    PeerOutcome { stage, fired, reason, tokens_before: before, tokens_after: after }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user(text: &str) -> Message {
        Message { role: Role::User, content: MessageContent::Text(text.into()), extra: Default::default() }
    }
    fn call(id: &str, n: usize) -> [Message; 2] {
        [
            Message { role: Role::Assistant, content: MessageContent::Blocks(vec![ContentBlock::tool_use(id, "Read", json!({"file_path": format!("/{id}")}))].into()), extra: Default::default() },
            Message {
                role: Role::User,
                content: MessageContent::Blocks(vec![ContentBlock::tool_result(id, ToolResultContent::Text("x".repeat(n).into()), None)].into()),
                extra: Default::default(),
            },
        ]
    }
    fn conversation(results: usize, size: usize) -> Vec<Message> {
        let mut m = vec![user("start")];
        for i in 0..results {
            m.extend(call(&format!("t{i}"), size));
        }
        m
    }
    fn uses_have_results(messages: &[Message]) -> bool {
        let mut uses = Vec::new();
        let mut results = Vec::new();
        for m in messages {
            for b in m.content.to_blocks() {
                match b {
                    ContentBlock::ToolUse { id, .. } => uses.push(id),
                    ContentBlock::ToolResult { tool_use_id, .. } => results.push(tool_use_id),
                    _ => {}
                }
            }
        }
        uses == results
    }

    #[test]
    fn masking_keeps_the_last_n() {
        let mut m = conversation(6, 400);
        let o = observation_masking(&mut m, 2);
        assert!(o.fired);
        assert_eq!(tool_results(&m).len(), 2);
        assert!(o.tokens_after < o.tokens_before);
        assert!(uses_have_results(&m));
        let again = observation_masking(&mut m, 2);
        assert!(!again.fired, "masking is idempotent");
    }

    #[test]
    fn prune_needs_the_minimum() {
        let mut m = conversation(10, 40_000); // 10k tokens each
        m.push(user("next"));
        m.push(user("last"));
        let o = opencode_prune(&mut m.clone(), 40_000, 200_000);
        assert!(!o.fired);
        let o = opencode_prune(&mut m, 40_000, 20_000);
        assert!(o.fired, "{o:?}");
        assert_eq!(tool_results(&m).len(), 4, "40k tokens protected = 4 results");
    }

    #[test]
    fn codex_keeps_initial_context_user_messages_and_summary() {
        let mut m = vec![user("initial context")];
        for i in 0..5 {
            m.push(user(&format!("prompt {i} {}", "y".repeat(40_000))));
            m.extend(call(&format!("t{i}"), 100));
        }
        let rebuilt = codex_rebuild(&m, 20_000, 500);
        assert!(uses_have_results(&rebuilt));
        assert!(rebuilt.iter().all(|x| x.role == Role::User));
        let text = serde_json::to_string(&rebuilt).unwrap();
        assert!(text.contains("initial context") && text.contains("prompt 4") && text.contains("<summary"));
        assert!(!text.contains("prompt 0"), "older prompts beyond 20k tokens are dropped");
        assert!(estimate_tokens(&rebuilt) <= 20_000 + 600 + 10);
    }

    #[test]
    fn cline_drops_half_of_the_pairs_keeping_pairs_whole() {
        let mut m = vec![user("task"), Message { role: Role::Assistant, content: MessageContent::Text("ok".into()), extra: Default::default() }];
        for i in 0..8 {
            m.extend(call(&format!("t{i}"), 10));
        }
        let n = m.len();
        let dropped = cline_truncate(&mut m);
        assert_eq!(dropped, 8);
        assert_eq!(m.len(), n - 8);
        assert!(uses_have_results(&m));
    }

    /// Masking and pruning through the state's memo give what the pure functions give, and a
    /// message cleared the same way as in the request before is that request's blocks, shared.
    #[test]
    fn memoized_clearing_equals_the_pure_functions_and_shares_blocks() {
        for config in [
            PeerConfig { strategy: PeerStrategy::ObservationMasking, keep_recent: 2, ..PeerConfig::default() },
            PeerConfig { strategy: PeerStrategy::Opencode, protect_tokens: 1_000, minimum_tokens: 100, ..PeerConfig::default() },
        ] {
            let mut state = PeerState::default();
            let mut history = conversation(1, 2_000);
            let mut previous: Option<Vec<Message>> = None;
            for turn in 0..6 {
                history.push(user(&format!("prompt {turn}")));
                history.extend(call(&format!("n{turn}"), 2_000));
                let mut memoized = history.clone();
                let outcomes = state.apply(&config, &mut memoized, 1_000_000, 0);
                let mut pure = history.clone();
                let expected = match config.strategy {
                    PeerStrategy::ObservationMasking => observation_masking(&mut pure, config.keep_recent),
                    _ => opencode_prune(&mut pure, config.protect_tokens, config.minimum_tokens),
                };
                assert_eq!(memoized, pure, "{:?} turn {turn}", config.strategy);
                assert_eq!((outcomes[0].tokens_before, outcomes[0].tokens_after), (expected.tokens_before, expected.tokens_after));
                assert_eq!(expected.tokens_after, estimate_tokens(&pure));
                if let Some(previous) = &previous {
                    let shared = memoized.iter().zip(previous).filter(|(now, before)| {
                        matches!((&now.content, &before.content), (MessageContent::Blocks(a), MessageContent::Blocks(b)) if a.same(b))
                    });
                    let cleared_before = previous.iter().filter(|m| serde_json::to_string(m).unwrap().contains(CLEARED_PLACEHOLDER)).count();
                    assert!(shared.count() >= cleared_before, "{:?} turn {turn}: the messages cleared before are shared", config.strategy);
                }
                previous = Some(memoized);
            }
            assert!(previous.unwrap().iter().any(|m| serde_json::to_string(m).unwrap().contains(CLEARED_PLACEHOLDER)));
        }
    }

    /// A peer applied after messages put in front of the history leaves them where they are and
    /// does to the history what it does to the history alone, firing or not, request after
    /// request (the rewrite of a compaction applied again included).
    #[test]
    fn applying_after_front_messages_is_applying_to_the_history() {
        let configs = [
            PeerConfig { strategy: PeerStrategy::ObservationMasking, keep_recent: 2, ..PeerConfig::default() },
            PeerConfig { strategy: PeerStrategy::Opencode, protect_tokens: 1_000, minimum_tokens: 100, buffer_tokens: 0, tail_tokens: 1_000, summary_tokens: 10, ..PeerConfig::default() },
            PeerConfig { strategy: PeerStrategy::Codex, summary_tokens: 10, ..PeerConfig::default() },
            PeerConfig { strategy: PeerStrategy::ServerCompaction, server_trigger_tokens: 4_000, summary_tokens: 10, ..PeerConfig::default() },
            PeerConfig { strategy: PeerStrategy::Cline, buffer_tokens: 0, ..PeerConfig::default() },
        ];
        for config in configs {
            let (mut alone, mut after) = (PeerState::default(), PeerState::default());
            let mut history = conversation(1, 3_000);
            let mut fired = 0;
            for turn in 0..12 {
                history.push(user(&format!("prompt {turn}")));
                history.extend(call(&format!("n{turn}"), 3_000));
                let mut plain = history.clone();
                let expected = alone.apply(&config, &mut plain, 8_000, 100);
                let mut fronted = vec![user("listing")];
                fronted.extend(history.iter().cloned());
                let got = after.apply_after(&config, &mut fronted, 1, 8_000, 100);
                assert_eq!(got, expected, "{:?} turn {turn}", config.strategy);
                assert_eq!(fronted[0], user("listing"), "{:?} turn {turn}", config.strategy);
                assert_eq!(fronted[1..], plain[..], "{:?} turn {turn}", config.strategy);
                fired += expected.iter().filter(|o| o.fired).count();
            }
            assert!(fired > 0, "{:?} never fired", config.strategy);
        }
    }

    /// Run dry request after request, masking and opencode (its prune, and its summary where
    /// the prune never fires) report what applying them reports while they rewrite nothing,
    /// leaving the messages as they are, and say so at the first request where applying
    /// rewrites; not at the first.
    #[test]
    fn a_dry_run_reports_what_applying_reports_until_the_mechanism_rewrites() {
        let configs = [
            PeerConfig { strategy: PeerStrategy::ObservationMasking, keep_recent: 3, ..PeerConfig::default() },
            PeerConfig { strategy: PeerStrategy::Opencode, protect_tokens: 2_000, minimum_tokens: 3_000, buffer_tokens: 0, ..PeerConfig::default() },
            PeerConfig { strategy: PeerStrategy::Opencode, protect_tokens: 1_000_000, buffer_tokens: 2_000, ..PeerConfig::default() },
        ];
        for (i, config) in configs.iter().enumerate() {
            let (mut dry, mut applied) = (PeerState::default(), PeerState::default());
            let mut history = conversation(0, 0);
            let mut rewrote_at = None;
            for turn in 0..20 {
                history.push(user(&format!("prompt {turn}")));
                history.extend(call(&format!("n{turn}"), 2_000));
                let got = dry.dry_run(config, &history, 8_000, 100);
                let mut copy = history.clone();
                let expected = applied.apply(config, &mut copy, 8_000, 100);
                match got {
                    Some(reports) => {
                        assert_eq!(reports, expected, "config {i} turn {turn}");
                        assert!(!expected.is_empty() && expected.iter().all(|o| !o.fired), "config {i} turn {turn}");
                        assert_eq!(copy, history, "config {i} turn {turn}");
                    }
                    None => {
                        assert!(expected.iter().any(|o| o.fired), "config {i} turn {turn}: {expected:?}");
                        rewrote_at = Some(turn);
                        break;
                    }
                }
            }
            assert!(rewrote_at.is_some_and(|turn| turn > 0), "config {i}: {rewrote_at:?}");
        }
    }

    /// Probing and running dry with stamps, over a history that grows by appending (its
    /// earlier messages the same allocations, as the message memo's raw view carries them),
    /// gives what reading every message gives: the count, and each dry run's reports or its
    /// refusal, for masking and opencode (results with cleared placeholders among them, a
    /// protection crossed inside a message of several results, none at all). A stamp the state
    /// did not read last (another history read in between, a wrong count claimed for it) is
    /// not taken.
    #[test]
    fn stamped_probes_and_dry_runs_read_what_reading_everything_reads() {
        let configs = [
            PeerConfig { strategy: PeerStrategy::ObservationMasking, keep_recent: 3, ..PeerConfig::default() },
            PeerConfig { strategy: PeerStrategy::ObservationMasking, keep_recent: 1_000, ..PeerConfig::default() },
            PeerConfig { strategy: PeerStrategy::Opencode, protect_tokens: 1_200, minimum_tokens: 0, buffer_tokens: 0, ..PeerConfig::default() },
            PeerConfig { strategy: PeerStrategy::Opencode, protect_tokens: 0, minimum_tokens: 1_000_000, buffer_tokens: 0, ..PeerConfig::default() },
            PeerConfig { strategy: PeerStrategy::Opencode, protect_tokens: 1_000_000, minimum_tokens: 1_000_000, buffer_tokens: 0, ..PeerConfig::default() },
        ];
        let several = |turn: usize| Message {
            role: Role::User,
            content: MessageContent::Blocks(
                vec![
                    ContentBlock::tool_result(format!("a{turn}"), ToolResultContent::Text("y".repeat(700 + turn * 37).into()), None),
                    ContentBlock::tool_result(format!("b{turn}"), ToolResultContent::Text(CLEARED_PLACEHOLDER.into()), None),
                    ContentBlock::text("between"),
                    ContentBlock::tool_result(format!("c{turn}"), ToolResultContent::Text("z".repeat(300).into()), None),
                ]
                .into(),
            ),
            extra: Default::default(),
        };
        for (i, config) in configs.iter().enumerate() {
            let (mut stamped, mut plain) = (PeerState::default(), PeerState::default());
            let mut history = conversation(0, 0);
            let mut last: Option<(u64, usize)> = None;
            for turn in 0..16 {
                history.push(user(&format!("prompt {turn}")));
                history.extend(call(&format!("n{turn}"), 100 + turn * 211));
                history.push(several(turn));
                let stamp = crate::shared::fresh_stamp();
                // Every third request, another history read in between; every fifth, a count
                // claimed for a stamp the state never read.
                if turn % 3 == 2 {
                    let other = conversation(2, 50);
                    stamped.probe_stamped(&other, 7, crate::shared::fresh_stamp(), None);
                }
                let shared = if turn % 5 == 4 { Some((u64::MAX, history.len())) } else { last };
                let counted = stamped.probe_stamped(&history, 7, stamp, shared);
                assert_eq!(counted, estimate_tokens(&history) + 7, "config {i} turn {turn}");
                let got = stamped.dry_run_stamped(config, &history, 1_000_000, 7, stamp);
                let expected = plain.dry_run(config, &history, 1_000_000, 7);
                assert_eq!(got, expected, "config {i} turn {turn}");
                last = Some((stamp, history.len()));
            }
        }
    }

    #[test]
    fn state_reapplies_the_rewrite_to_later_requests() {
        let config = PeerConfig { strategy: PeerStrategy::Codex, summary_tokens: 10, ..PeerConfig::default() };
        let mut state = PeerState::default();
        let mut first = conversation(4, 4000);
        let fired = state.apply(&config, &mut first, 4000, 0);
        assert!(fired.iter().any(|o| o.fired));
        let mut second = conversation(4, 4000);
        second.push(user("more"));
        state.apply(&config, &mut second, 1_000_000, 0);
        assert_eq!(first.len(), 1);
        assert_eq!(second.len(), 1, "the rebuilt head and the new prompt merge into one user message");
        assert!(serde_json::to_string(&second).unwrap().contains("more"));
    }

    #[test]
    fn opencode_summary_keeps_a_tail_of_whole_rounds() {
        let mut m = conversation(6, 4000);
        m.push(user("latest prompt"));
        m.extend(call("z", 100));
        let out = opencode_summary(&m, 2_000, 100);
        assert!(uses_have_results(&out));
        assert!(serde_json::to_string(&out).unwrap().contains("latest prompt"));
    }
}
