//! What the real client does around a new user turn that the transcript does not record.
//!
//! Two mechanisms, both seen only through the billed usage (reference/real-breaks.md; per turn
//! in docs/fidelity.md "What happens at a new user turn"):
//!
//! - **The post-turn side entry.** After a turn that ended with the model's reply (no tool use
//!   pending: the stop hook ran), the client sends a side request that forks the main
//!   conversation through that reply; its cache entry ends right after the last assistant
//!   message. The next turn reads through it (21 of cd95's 24 new turns read the previous call's
//!   cache plus 1.0–1.6× the chars/4 of the last reply). None follows a turn whose last call
//!   read nothing (cd95 #19, #70, #143, 7662 #24: 4 of 4), a turn ended by an interruption
//!   during a tool use (cd95 #121), or a turn a background task's notification opened (spotter
//!   #151). The entry also refreshes the TTL of the prefix it reads.
//! - **The transient prompt rendering** (the "N-pattern", 2.0.76–2.1.39). Some prompts are sent
//!   differently during their own turn than afterwards, so at the next turn the read stops at
//!   the boundary before that prompt: the side entry of the turn before, when it is within the
//!   20-position lookback, else the prefix level. Which prompts: in every version of that range,
//!   the message that opened a conversation (the session's first prompt, or the compaction
//!   summary the model went on from without a new prompt); from 2.1.37, every prompt the user
//!   sent (task notifications excepted). In the six realdata sessions this predicts all eight
//!   such breaks and no other (see docs/fidelity.md).
//!
//! The replay renders such a prompt with a salted block hash during its turn (same tokens,
//! different bytes to the cache) and seeds the side entry with [`crate::measure::Measurer::seed_cache`].

use crate::api::{ContentBlock, Message, MessageContent, Role};
use crate::measure::FlatRequest;
use crate::measure::blocks::Region;

use super::profile::ClientProfile;

/// Mixed into the block hashes of a prompt rendered the transient way.
const TRANSIENT_SALT: u128 = 0x7472_616e_7369_656e_7420_7072_6f6d_7074;

/// Index of the message that opened the current turn: the last user message with more than tool
/// results (the final message at a new turn; `messages[0]` when a compaction summary opened it).
pub fn current_prompt_index(messages: &[Message]) -> Option<usize> {
    messages.iter().rposition(is_prompt)
}

/// A user message with anything besides tool results and the reminders attachment records
/// are rendered as.
pub fn is_prompt(message: &Message) -> bool {
    let reminder = |b: &ContentBlock| matches!(b, ContentBlock::Text { text, .. } if text.starts_with(crate::recording::claude_code::ATTACHMENT_REMINDER));
    message.role == Role::User
        && match &message.content {
            MessageContent::Text(_) => true,
            MessageContent::Blocks(blocks) => blocks.iter().any(|b| !matches!(b, ContentBlock::ToolResult { .. }) && !reminder(b)),
        }
}

fn is_task_notification(message: &Message) -> bool {
    let opens = |text: &str| text.trim_start().starts_with("<task-notification>");
    match &message.content {
        MessageContent::Text(text) => opens(text),
        MessageContent::Blocks(blocks) => blocks.iter().any(|b| matches!(b, ContentBlock::Text { text, .. } if opens(text))),
    }
}

/// Gives the blocks of `messages[message_index]` different cache identities (same tokens), and
/// carries the change into every later prefix hash.
pub fn salt_message(flat: &mut FlatRequest, message_index: usize) {
    let Some(first) = flat.blocks.iter().position(|b| b.path.region == Region::Messages && b.path.index == message_index) else {
        return;
    };
    if first == 0 {
        return;
    }
    let blocks = std::sync::Arc::make_mut(&mut flat.blocks);
    let mut state = blocks[first - 1].prefix_hash;
    for block in &mut blocks[first..] {
        if block.path.region == Region::Messages && block.path.index == message_index {
            block.hash ^= TRANSIENT_SALT;
        }
        state = crate::api::canonical::chain(state, block.hash);
        block.prefix_hash = state;
    }
}

/// The turn-level state of the main lane.
#[derive(Debug, Default, Clone)]
pub struct TurnState {
    /// New user turns seen so far.
    pub turns: u32,
    /// The prompt that opened the current turn is rendered the transient way (re-rendered at
    /// the next turn).
    pub transient_prompt: bool,
    /// A background task's notification opened the current turn.
    pub by_notification: bool,
    /// Time of the last record before the current prompt (the previous turn's end).
    pub turn_end_ms: Option<u64>,
    /// The read of the lane's previous compared call (the larger of the recorded and the
    /// replayed one).
    pub previous_read: Option<u64>,
    /// A compaction came before the call being built: the previous prompt is gone.
    pub compaction_pending: bool,
    /// A tool hook (PreToolUse, PostToolUse, PostToolUseFailure) added context to a tool result
    /// of the current turn (a `hook_additional_context` record naming a tool use).
    pub tool_hook_context: bool,
}

/// What a new user turn brings, decided before its call is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnStart {
    /// The previous turn's prompt was rendered the transient way: this call re-renders it.
    pub rerenders_previous: bool,
    /// Seed the side entry of the previous turn (at `turn_end_ms`).
    pub side_entry: bool,
    /// The start of the conversation is rendered anew for this prompt (2.1.200+).
    pub rerenders_start: bool,
    /// The side entry would have been seeded, but a tool hook's context in the previous turn
    /// keeps the new prompt from reading it (2.1.200–2.1.231).
    pub hook_context_lost_side_entry: bool,
}

/// What the record shows around a new prompt, beyond its messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct TurnRecord<'a> {
    /// The first turn of a session recorded from its start.
    pub opens_session: bool,
    /// Side entries are modelled at all (`--no-side-entry` turns them off).
    pub side_entries: bool,
    /// A `stop_hook_summary` came after the previous turn's last call: it ended normally.
    pub ended_normally: bool,
    /// The previous turn's last reply ended the turn (`stop_reason` `end_turn`, or none
    /// recorded), rather than being cut off.
    pub ended_with_reply: bool,
    /// The permission mode the prompt's record names (else the last one a prompt named).
    pub permission_mode: Option<&'a str>,
    /// The call goes to another model than the lane's previous call: the side request of the
    /// previous turn went to the old model and cached nothing this call can read.
    pub model_switched: bool,
}

impl TurnState {
    /// A compaction the model continued from: the summary opens the conversation.
    pub fn on_compaction(&mut self, profile: &ClientProfile) {
        self.transient_prompt = profile.rerender_opening_prompt;
        self.by_notification = false;
        self.compaction_pending = true;
        self.tool_hook_context = false;
    }

    /// A new user turn whose request ends with `messages` (the last one the new prompt).
    pub fn on_new_turn(&mut self, profile: &ClientProfile, messages: &[Message], record: TurnRecord<'_>) -> TurnStart {
        let last = messages.last();
        let interrupted_tool_use = last.is_some_and(|m| m.content.to_blocks().iter().any(|b| matches!(b, ContentBlock::ToolResult { .. })));
        // Up to 2.1.169 a turn a notification opened leaves no side entry (spotter #151); from
        // 2.1.170 the record says whether the turn ended normally.
        let turn_ended = if profile.side_entry_needs_stop_summary { record.ended_normally } else { !self.by_notification };
        let side_entry = record.side_entries
            && profile.post_turn_side_entry
            && self.turns > 0
            && messages.len() >= 2
            && !interrupted_tool_use
            && turn_ended
            && !record.model_switched
            && self.previous_read.is_some_and(|read| read > 0);
        let rerenders_start =
            profile.turn_rerenders_start && self.turns > 0 && !interrupted_tool_use && record.ended_with_reply && !self.compaction_pending;
        // The side request renders the turn's hook context otherwise than the next prompt does:
        // only the re-rendered start matters, so the prompt reads no further than the prefix.
        // The context stays with the turn until a prompt after its reply (a Skill call's
        // expansion within it is not one).
        let hook_context_lost_side_entry = side_entry && rerenders_start && profile.tool_hook_context_loses_side_entry && self.tool_hook_context;
        if record.ended_with_reply && !interrupted_tool_use {
            self.tool_hook_context = false;
        }
        let start = TurnStart {
            rerenders_previous: self.turns > 0 && self.transient_prompt && !self.compaction_pending,
            side_entry: side_entry && !hook_context_lost_side_entry,
            rerenders_start,
            hook_context_lost_side_entry,
        };
        let notification = last.is_some_and(is_task_notification);
        let bypass = profile.typed_rerender_skips_bypass && record.permission_mode == Some("bypassPermissions");
        self.transient_prompt = if record.opens_session {
            profile.rerender_opening_prompt
        } else {
            profile.rerender_typed_prompts && !notification && !bypass
        };
        self.by_notification = notification;
        self.turns += 1;
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MessageContent, Request};
    use crate::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};

    fn text(role: Role, text: &str) -> Message {
        Message { role, content: MessageContent::Text(text.to_owned()), extra: Default::default() }
    }

    fn flat(messages: Vec<Message>) -> FlatRequest {
        let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4));
        let mut request = Request::new("claude-opus-4-5-20251101".to_owned(), 1000);
        request.system = Some(crate::api::SystemPrompt::Text("system prompt".to_owned()));
        request.messages = messages;
        measurer.flatten(&request).expect("known model")
    }

    #[test]
    fn salting_changes_identities_from_the_message_on_and_keeps_tokens() {
        let messages = vec![text(Role::User, "first prompt"), text(Role::Assistant, "reply"), text(Role::User, "second")];
        let plain = flat(messages.clone());
        let mut salted = plain.clone();
        salt_message(&mut salted, 1);
        assert_eq!(plain.total_tokens, salted.total_tokens);
        let same: Vec<bool> = plain.blocks.iter().zip(salted.blocks.iter()).map(|(a, b)| a.prefix_hash == b.prefix_hash).collect();
        assert_eq!(same, vec![true, true, false, false]);
    }

    #[test]
    fn opening_and_typed_prompts_follow_the_version() {
        let turn = |version: &str, opens: bool, prompt: &str| {
            let mut state = TurnState::default();
            state.on_new_turn(&ClientProfile::for_version(version), &[text(Role::User, prompt)], TurnRecord { opens_session: opens, side_entries: true, ..TurnRecord::default() });
            state.transient_prompt
        };
        assert!(turn("2.0.76", true, "fix it"));
        assert!(!turn("2.0.76", false, "fix it"));
        assert!(!turn("2.1.7", false, "fix it"));
        assert!(turn("2.1.37", false, "fix it"));
        assert!(!turn("2.1.37", false, "<task-notification>\n<task-id>b0</task-id>"));
        assert!(!turn("2.1.42", true, "fix it"));
    }

    #[test]
    fn side_entry_needs_a_warm_finished_turn() {
        let profile = ClientProfile::for_version("2.1.7");
        let messages = [text(Role::User, "a"), text(Role::Assistant, "b"), text(Role::User, "c")];
        let start = |previous_read: Option<u64>, turns: u32| {
            let mut state = TurnState { turns, previous_read, ..TurnState::default() };
            state.on_new_turn(&profile, &messages, TurnRecord { side_entries: true, ..TurnRecord::default() }).side_entry
        };
        assert!(start(Some(10_000), 1));
        assert!(!start(Some(0), 1), "a cold last call leaves no side entry");
        assert!(!start(Some(10_000), 0), "no turn before the first");
        let interrupted = Message {
            role: Role::User,
            content: MessageContent::Blocks(vec![
                ContentBlock::ToolResult { tool_use_id: "t".into(), content: None, is_error: None, cache_control: None, extra: Default::default() },
                ContentBlock::text("[Request interrupted by user for tool use]".to_owned()),
            ].into()),
            extra: Default::default(),
        };
        let mut state = TurnState { turns: 1, previous_read: Some(10_000), ..TurnState::default() };
        assert!(!state.on_new_turn(&profile, &[text(Role::User, "a"), text(Role::Assistant, "b"), interrupted], TurnRecord { side_entries: true, ..TurnRecord::default() }).side_entry);
    }

    fn warm_turn(version: &str, record: TurnRecord<'_>) -> TurnStart {
        let messages = [text(Role::User, "a"), text(Role::Assistant, "b"), text(Role::User, "c")];
        let mut state = TurnState { turns: 1, previous_read: Some(10_000), ..TurnState::default() };
        state.on_new_turn(&ClientProfile::for_version(version), &messages, TurnRecord { side_entries: true, ..record })
    }

    #[test]
    fn from_2_1_170_the_side_entry_needs_a_stop_summary() {
        assert!(warm_turn("2.1.205", TurnRecord { ended_normally: true, ..TurnRecord::default() }).side_entry);
        assert!(!warm_turn("2.1.205", TurnRecord::default()).side_entry, "no stop summary, no side request");
        assert!(warm_turn("2.1.14", TurnRecord::default()).side_entry, "before 2.1.170 the record is not asked");
    }

    #[test]
    fn from_2_1_200_a_new_prompt_rerenders_the_start() {
        let ended = TurnRecord { ended_with_reply: true, ..TurnRecord::default() };
        assert!(warm_turn("2.1.215", ended).rerenders_start);
        assert!(!warm_turn("2.1.215", TurnRecord::default()).rerenders_start, "a reply cut off re-renders nothing");
        assert!(!warm_turn("2.1.49", ended).rerenders_start);
        let mut state = TurnState { turns: 1, previous_read: Some(10_000), compaction_pending: true, ..TurnState::default() };
        let messages = [text(Role::User, "summary"), text(Role::User, "c")];
        assert!(!state.on_new_turn(&ClientProfile::for_version("2.1.215"), &messages, ended).rerenders_start);
    }

    #[test]
    fn a_tool_hook_context_loses_the_side_entry_from_2_1_200_to_2_1_231() {
        let ended = TurnRecord { ended_normally: true, ended_with_reply: true, side_entries: true, ..TurnRecord::default() };
        let messages = [text(Role::User, "a"), text(Role::Assistant, "b"), text(Role::User, "c")];
        let turn = |version: &str, hook: bool| {
            let mut state = TurnState { turns: 1, previous_read: Some(10_000), tool_hook_context: hook, ..TurnState::default() };
            let start = state.on_new_turn(&ClientProfile::for_version(version), &messages, ended);
            assert!(!state.tool_hook_context, "a prompt after the reply consumes it");
            start
        };
        let lost = turn("2.1.219", true);
        assert!(lost.hook_context_lost_side_entry && !lost.side_entry && lost.rerenders_start);
        assert!(turn("2.1.219", false).side_entry);
        assert!(turn("2.1.232", true).side_entry, "2.1.232 keeps it");
        assert!(turn("2.1.49", true).side_entry, "before 2.1.200 nothing is re-rendered");
        // A turn that re-renders nothing (a Skill expansion, a cut-off reply) keeps the context
        // for the prompt that does.
        let mut state = TurnState { turns: 1, previous_read: Some(10_000), tool_hook_context: true, ..TurnState::default() };
        let cut = TurnRecord { ended_with_reply: false, ..ended };
        assert!(!state.on_new_turn(&ClientProfile::for_version("2.1.219"), &messages, cut).hook_context_lost_side_entry);
        assert!(state.tool_hook_context);
    }

    #[test]
    fn a_model_switch_seeds_no_side_entry() {
        let record = TurnRecord { ended_normally: true, model_switched: true, ..TurnRecord::default() };
        assert!(!warm_turn("2.1.205", record).side_entry);
        assert!(!warm_turn("2.1.14", record).side_entry);
    }

    #[test]
    fn typed_prompts_in_bypass_mode_are_not_rerendered() {
        let turn = |mode: Option<&str>| {
            let mut state = TurnState::default();
            let record = TurnRecord { permission_mode: mode, ..TurnRecord::default() };
            state.on_new_turn(&ClientProfile::for_version("2.1.39"), &[text(Role::User, "fix it")], record);
            state.transient_prompt
        };
        assert!(turn(Some("acceptEdits")));
        assert!(turn(None));
        assert!(!turn(Some("bypassPermissions")));
    }
}
