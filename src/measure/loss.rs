//! Information-loss metrics, so that "compact less" does not always win a tuning sweep.
//!
//! - **Tokens dropped from view**: per compaction, the tokens a shrinking stage removed
//!   (`tokens_before − tokens_after` of every fired stage that shrank). A request that carries a
//!   `compaction` or `microcompact` event but no stage reports (a replayed recording) counts the
//!   drop of its context against the lane's previous request instead.
//! - **Recall misses**: a later turn names something whose content is no longer visible in the
//!   request: a tool call whose input names a file path that an earlier Read result showed and
//!   that no visible Read result shows any more, or a tool call that names an earlier
//!   `tool_use` id whose result was cleared; or a new user prompt naming such a path.
//! - **Re-reads caused by compaction**: a Read of a path whose earlier Read result was dropped
//!   (the "compaction death spiral" of openai/codex#13279). Each is also a recall miss.
//!
//! Visibility is judged on the request body as sent: a Read result is visible when its
//! `tool_result` is present, not a cleared placeholder, and not cleared server-side by context
//! editing (the row's `context_management.cleared_tool_use_ids`). Files restored as attachments after a
//! compaction are not tracked (their path is not a Read result); this undercounts visibility and
//! so can only overcount misses for strategies that restore files — documented, not hidden.
//! The tracker is streaming (one request at a time) and keeps only ids and paths.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::api::{ContentBlock, MessageContent, Request, Role, SharedText, ToolResultContent};

use super::metrics::RequestMetrics;

/// Texts a stage leaves in place of a result (ours, Claude Code's, peers').
const PLACEHOLDERS: [&str; 3] = ["[Old tool result content cleared]", "[Old tool result cleared]", "Old environment output"];

/// The summary's `info_loss` object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InfoLoss {
    /// Sum of tokens that left the model's view over all compactions.
    pub tokens_dropped: u64,
    /// Compactions (stage firings or recorded events) that dropped tokens.
    pub compactions: u64,
    /// The largest single drop.
    pub max_dropped: u64,
    pub recall_misses: u64,
    pub rereads_after_compaction: u64,
}

/// Follows a run request by request.
#[derive(Debug, Clone, Default)]
pub struct LossTracker {
    loss: InfoLoss,
    /// Paths shown by a Read result in some earlier request.
    seen_paths: BTreeSet<Id>,
    /// Tool use ids whose result was visible in some earlier request.
    seen_results: BTreeSet<Id>,
    /// Tool uses already judged (each call is judged once, when it first appears).
    judged_uses: BTreeSet<Id>,
    /// The last user prompt judged, per lane: its pieces ([`prompt_texts`]), held.
    judged_prompt: BTreeMap<String, Vec<SharedText>>,
    /// Context tokens of each lane's previous request.
    previous_context: BTreeMap<String, u64>,
    /// What each lane's earlier requests showed in the messages the next one is expected to
    /// begin with, so a request is read from where it departs from them.
    prefixes: BTreeMap<String, ShownPrefix>,
    /// What the caller knows of the next request observed ([`LossTracker::expect_shared`]):
    /// its stamp, and how many of its leading messages are the ones the request with the
    /// other stamp sent.
    shared_hint: Option<(u64, Option<(u64, usize)>)>,
    /// Counts only the drops ([`LossTracker::drops_only`]).
    drops_only: bool,
    /// Keeps no prefix: every request is read whole (the reference the kept prefixes are
    /// tested against).
    #[cfg(test)]
    whole: bool,
}

/// Messages a lane's earlier request began with, and what they show: the judge of a request
/// that begins with the same messages (the same block lists, held here so that the same
/// allocation means the same blocks) reads only the messages after them. A request that
/// departs from them earlier (an older message rewritten: a masked or cleared result) cuts
/// them back to the message where it departs ([`ShownPrefix::cut`]) and reads from there.
///
/// Kept only for requests that name no Read call twice, so that what the messages show is what
/// the tracker recorded as seen when it judged them: each of their calls judged, their visible
/// results and paths in `seen_results` and `seen_paths`. Results the server cleared when the
/// messages were judged are `pending`: a later request may begin with the messages only while
/// the server still clears all of those (else it shows a result the tracker never saw, and is
/// read whole). The server's clears of a later request are applied over what the prefix shows:
/// its results cleared then are hidden, and so is a path none of its other results shows.
#[derive(Debug, Clone, Default)]
struct ShownPrefix {
    /// The stamp of the request whose messages these are, when the caller gave one.
    stamp: Option<u64>,
    /// The messages' blocks (`None`: a text message, which shows nothing).
    messages: Vec<Option<crate::api::SharedBlocks>>,
    /// Path of each Read call among them, by tool use id.
    read_path_of: BTreeMap<Id, Id>,
    /// Tool use ids whose result they show.
    visible_results: BTreeSet<Id>,
    /// Paths of their Read calls whose result they show.
    visible_paths: BTreeSet<Id>,
    /// Tool use ids whose result they would show but that the server cleared when they were
    /// judged.
    pending: BTreeSet<Id>,
    /// The tool use ids of the shown results that make each of `visible_paths` visible.
    readers: BTreeMap<Id, Vec<Id>>,
    /// What each message added, in order, with its index: undone, last first, to cut the
    /// messages back to where a later request departs from them.
    added: Vec<(usize, Added)>,
}

/// One addition of a message to a [`ShownPrefix`]'s sets.
#[derive(Debug, Clone)]
enum Added {
    ReadPath(Id),
    Visible(Id),
    Pending(Id),
    VisiblePath(Id),
    /// A reader pushed to this path's list.
    Reader(Id),
}

/// A tool use id or a path the tracker keeps: shared by the sets that hold it and by their
/// copies (a checkpoint of the run copies a reference count, not the text). Ordered as the
/// text is.
type Id = std::rc::Rc<str>;

/// Messages at the end of a request that the next request of its lane may show otherwise (the
/// message that carries the cache marker, a user message that grows): left out of the kept
/// prefix.
const UNSETTLED_TAIL: usize = 2;

/// What messages show: Read calls' paths, visible results, tool calls, in order.
#[derive(Default)]
struct Shown<'r> {
    read_path_of: Vec<(&'r str, &'r str)>,
    visible_results: Vec<&'r str>,
    /// Results that would be visible but that the server cleared.
    cleared_results: Vec<&'r str>,
    uses: Vec<(&'r str, &'r str, &'r serde_json::Value)>,
}

/// The ids of the results the server cleared, sorted without repeats (as the server's list
/// comes; sorted here when not): asked whether it holds an id by a binary search, and walked
/// beside the tracker's sorted sets rather than looked up in them one by one.
struct Cleared<'a>(Vec<&'a str>);

impl<'a> Cleared<'a> {
    fn new<S: AsRef<str>>(ids: &'a [S]) -> Self {
        let mut sorted: Vec<&str> = ids.iter().map(AsRef::as_ref).collect();
        if !sorted.windows(2).all(|w| w[0] < w[1]) {
            sorted.sort_unstable();
            sorted.dedup();
        }
        Cleared(sorted)
    }

    fn contains(&self, id: &str) -> bool {
        self.0.binary_search(&id).is_ok()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'r> Shown<'r> {
    fn clear(&mut self) {
        let Shown { read_path_of, visible_results, cleared_results, uses } = self;
        read_path_of.clear();
        visible_results.clear();
        cleared_results.clear();
        uses.clear();
    }

    fn scan(&mut self, messages: &'r [crate::api::Message], cleared: &Cleared<'_>) {
        for message in messages {
            let MessageContent::Blocks(blocks) = &message.content else { continue };
            for block in blocks {
                match block {
                    ContentBlock::ToolUse { id, name, input, .. } => {
                        if name == "Read"
                            && let Some(path) = input.get("file_path").and_then(|v| v.as_str())
                        {
                            self.read_path_of.push((id, path));
                        }
                        self.uses.push((id, name, input));
                    }
                    ContentBlock::ToolResult { tool_use_id, content, is_error, .. }
                        if is_error != &Some(true) && content.as_ref().is_some_and(|c| !is_placeholder(c)) => {
                            if cleared.contains(tool_use_id.as_str()) {
                                self.cleared_results.push(tool_use_id);
                            } else {
                                self.visible_results.push(tool_use_id);
                            }
                        }
                    _ => {}
                }
            }
        }
    }
}

impl ShownPrefix {
    /// How many of the kept messages `messages` begin with, of which the first `known` are
    /// known to be the kept ones (not compared; debug builds check they show the same).
    fn common(&self, messages: &[crate::api::Message], known: usize) -> usize {
        let known = known.min(self.messages.len()).min(messages.len());
        debug_assert!(
            self.messages[..known].iter().zip(messages).all(|(kept, message)| match (kept, &message.content) {
                (Some(kept), MessageContent::Blocks(blocks)) => kept.same(blocks) || kept[..] == blocks[..],
                (None, MessageContent::Text(_)) => true,
                _ => false,
            }),
            "a message counted as the kept prefix's differs from it ({known} counted)"
        );
        known
            + self.messages[known..]
                .iter()
                .zip(&messages[known..])
                .take_while(|(kept, message)| match (kept, &message.content) {
                    (Some(kept), MessageContent::Blocks(blocks)) => kept.same(blocks),
                    (None, MessageContent::Text(_)) => true,
                    _ => false,
                })
                .count()
    }

    /// Cuts the messages back to their first `len` (what the later ones added undone, last
    /// first).
    fn cut(&mut self, len: usize) {
        if len >= self.messages.len() {
            return;
        }
        while let Some((from, _)) = self.added.last()
            && *from >= len
        {
            let (_, added) = self.added.pop().expect("just seen");
            match added {
                Added::ReadPath(id) => {
                    self.read_path_of.remove(&id);
                }
                Added::Visible(id) => {
                    self.visible_results.remove(&id);
                }
                Added::Pending(id) => {
                    self.pending.remove(&id);
                }
                Added::VisiblePath(path) => {
                    self.visible_paths.remove(&path);
                }
                Added::Reader(path) => {
                    if let Some(ids) = self.readers.get_mut(&path) {
                        ids.pop();
                        if ids.is_empty() {
                            self.readers.remove(&path);
                        }
                    }
                }
            }
        }
        self.messages.truncate(len);
    }

    /// Appends `message`, which shows `shown` (no Read call in it named before). One message
    /// at a time, so that the prefix can be cut back to any message.
    fn extend(&mut self, message: &crate::api::Message, shown: &Shown<'_>) {
        let start = self.messages.len();
        self.messages.push(match &message.content {
            MessageContent::Blocks(blocks) => Some(blocks.clone()),
            MessageContent::Text(_) => None,
        });
        for &(id, path) in &shown.read_path_of {
            if !self.read_path_of.contains_key(id) {
                let id = Id::from(id);
                self.read_path_of.insert(id.clone(), path.into());
                self.added.push((start, Added::ReadPath(id)));
            }
        }
        for &id in &shown.visible_results {
            if !self.visible_results.contains(id) {
                let id = Id::from(id);
                self.visible_results.insert(id.clone());
                self.added.push((start, Added::Visible(id)));
            }
        }
        for &id in &shown.cleared_results {
            if !self.pending.contains(id) {
                let id = Id::from(id);
                self.pending.insert(id.clone());
                self.added.push((start, Added::Pending(id)));
            }
        }
        // Paths now visible: the new Read calls shown anywhere in the prefix, the earlier Read
        // calls whose result the new messages show.
        let reader = |prefix: &mut ShownPrefix, path: &Id, id: &str| {
            if prefix.visible_paths.insert(path.clone()) {
                prefix.added.push((start, Added::VisiblePath(path.clone())));
            }
            prefix.readers.entry(path.clone()).or_default().push(id.into());
            prefix.added.push((start, Added::Reader(path.clone())));
        };
        for &(id, path) in &shown.read_path_of {
            if self.visible_results.contains(id) {
                // The path as the prefix keeps it (inserted above, or there before).
                let path = self.read_path_of.get(id).filter(|kept| ***kept == *path).cloned().unwrap_or_else(|| path.into());
                reader(self, &path, id);
            }
        }
        for &id in &shown.visible_results {
            if let Some(path) = self.read_path_of.get(id).cloned() {
                reader(self, &path, id);
            }
        }
    }

    /// Whether the messages may stand for what they show in a request the server clears
    /// `cleared` of: every result cleared when they were judged is cleared still (both sorted:
    /// one walk of each).
    fn holds_under(&self, cleared: &Cleared<'_>) -> bool {
        let mut ids = cleared.0.iter().peekable();
        self.pending.iter().all(|id| {
            while ids.next_if(|c| **c < &**id).is_some() {}
            ids.peek().is_some_and(|c| **c == &**id)
        })
    }

    /// Their visible paths that `cleared` hides: every result showing the path cleared (the
    /// Read calls and `cleared` both sorted by id: one walk of each).
    fn hidden_paths(&self, cleared: &Cleared<'_>) -> BTreeSet<&str> {
        let mut hidden = BTreeSet::new();
        let mut ids = cleared.0.iter().peekable();
        for (id, path) in &self.read_path_of {
            while ids.next_if(|c| **c < &**id).is_some() {}
            if ids.peek().is_none_or(|c| **c != &**id) || !self.visible_results.contains(id) {
                continue;
            }
            if !hidden.contains(&**path) && self.readers.get(path).is_none_or(|ids| ids.iter().all(|r| cleared.contains(r))) {
                hidden.insert(&**path);
            }
        }
        hidden
    }
}

impl LossTracker {
    pub fn new() -> Self {
        LossTracker::default()
    }

    /// A tracker that counts only the drops ([`Self::count_drops`]: `tokens_dropped`,
    /// `compactions`, `max_dropped`) of the requests it observes, and does not judge their
    /// bodies: `recall_misses` and `rereads_after_compaction` stay 0. For a caller that reads
    /// no more (the audit reads the tokens dropped).
    pub fn drops_only() -> Self {
        LossTracker { drops_only: true, ..LossTracker::default() }
    }

    /// The next request observed has `stamp` (unique in the process, as
    /// [`crate::measure::incremental::Flattener::last_stamp`]'s), and its first `count` messages
    /// are the ones the request with stamp `previous` sent (`hint`: `(previous, count)`), as
    /// [`crate::measure::incremental::Flattener::expect_shared`] is told. Where that request
    /// left its lane's kept prefix, those messages are not compared with it. A count too high
    /// would judge wrongly (debug builds check it); too low costs only the comparison.
    pub fn expect_shared(&mut self, stamp: u64, hint: Option<(u64, usize)>) {
        if !self.drops_only {
            self.shared_hint = Some((stamp, hint));
        }
    }

    /// Observes one measured request.
    pub fn observe(&mut self, request: &Request, row: &RequestMetrics) {
        self.count_drops(row);
        if self.drops_only {
            return;
        }
        let cleared: &[std::sync::Arc<str>] = row.context_management.as_ref().map_or(&[], |cm| &cm.cleared_tool_use_ids);
        self.judge(request, &row.lane, cleared);
    }

    /// Only the drops (when the body is not at hand).
    pub fn count_drops(&mut self, row: &RequestMetrics) {
        let mut dropped_here = 0u64;
        let mut staged = false;
        for stage in row.stages.iter().filter(|s| s.fired) {
            staged = true;
            if stage.tokens_after < stage.tokens_before {
                let d = stage.tokens_before - stage.tokens_after;
                self.loss.compactions += 1;
                self.loss.max_dropped = self.loss.max_dropped.max(d);
                dropped_here += d;
            }
        }
        if !staged
            && row.events.iter().any(|e| e == "compaction" || e == "microcompact")
            && let Some(&previous) = self.previous_context.get(&row.lane)
            && previous > row.context_tokens
        {
            let d = previous - row.context_tokens;
            self.loss.compactions += 1;
            self.loss.max_dropped = self.loss.max_dropped.max(d);
            dropped_here += d;
        }
        self.loss.tokens_dropped += dropped_here;
        if row.error.is_none() {
            self.previous_context.insert(row.lane.clone(), row.context_tokens);
        }
    }

    /// `cleared`: tool uses whose results the server cleared (context editing) though the body
    /// still carries them.
    fn judge<S: AsRef<str>>(&mut self, request: &Request, lane: &str, cleared: &[S]) {
        let messages = &request.messages;
        let cleared = Cleared::new(cleared);
        let (stamp, hint) = self.shared_hint.take().map_or((None, None), |(stamp, hint)| (Some(stamp), hint));
        // The messages this lane's earlier request showed, as far as this request begins with
        // them, when the server clears every result it cleared then.
        let mut prefix = self
            .prefixes
            .remove(lane)
            .map(|mut p| {
                let known = match (hint, p.stamp) {
                    (Some((previous, count)), Some(kept)) if previous == kept => count,
                    _ => 0,
                };
                p.cut(p.common(messages, known));
                p
            })
            .filter(|p| p.holds_under(&cleared));
        #[cfg(test)]
        if self.whole {
            prefix = None;
        }
        let from = prefix.as_ref().map_or(0, |p| p.messages.len());
        let mut tail = Shown::default();
        tail.scan(&messages[from..], &cleared);
        // A Read call named twice: its path is the last one's, which the kept prefix cannot
        // tell; read everything again.
        let mut tail_reads: BTreeMap<&str, &str> = BTreeMap::new();
        let mut named_twice = false;
        for &(id, path) in &tail.read_path_of {
            named_twice |= tail_reads.insert(id, path).is_some() || prefix.as_ref().is_some_and(|p| p.read_path_of.contains_key(id));
        }
        if named_twice && prefix.is_some() {
            prefix = None;
            tail = Shown::default();
            tail.scan(messages, &cleared);
            tail_reads.clear();
            named_twice = false;
            for &(id, path) in &tail.read_path_of {
                named_twice |= tail_reads.insert(id, path).is_some();
            }
        }
        let empty = ShownPrefix::default();
        let kept = prefix.as_ref().unwrap_or(&empty);
        // The kept prefix's paths this request's server-side clears hide.
        let hidden = if cleared.is_empty() { BTreeSet::new() } else { kept.hidden_paths(&cleared) };

        // What this request shows: the kept prefix's (less what the server cleared), plus the
        // tail's.
        let tail_visible: BTreeSet<&str> = tail.visible_results.iter().copied().collect();
        let visible = |id: &str| tail_visible.contains(id) || (kept.visible_results.contains(id) && !cleared.contains(id));
        // Paths the tail makes visible: its own Read calls shown anywhere, the prefix's Read
        // calls whose result the tail shows.
        let mut tail_paths: BTreeSet<&str> = BTreeSet::new();
        for (&id, &path) in &tail_reads {
            if visible(id) {
                tail_paths.insert(path);
            }
        }
        for &id in &tail_visible {
            if let Some(path) = kept.read_path_of.get(id) {
                tail_paths.insert(&**path);
            }
        }
        let invisible = |path: &str| !tail_paths.contains(path) && (!kept.visible_paths.contains(path) || hidden.contains(path));
        // The paths seen before that this request does not show, found once (the seen paths
        // walked beside the prefix's visible ones, both sorted) when a new call or prompt asks.
        let seen_paths = &self.seen_paths;
        let find_invisible = || -> Vec<&str> {
            let mut shown = kept.visible_paths.iter().peekable();
            seen_paths
                .iter()
                .filter(|path| {
                    while shown.next_if(|v| *v < *path).is_some() {}
                    let in_kept = shown.peek() == Some(path);
                    !tail_paths.contains(&***path) && (!in_kept || hidden.contains(&***path))
                })
                .map(|path| &**path)
                .collect()
        };
        let mut invisible_seen: Option<Vec<&str>> = None;
        // A new call's input as JSON text, written straight into one buffer (what `Display`
        // writes, without its formatter between each piece and the text).
        let mut input_json: Vec<u8> = Vec::new();

        // New tool calls: judged against what was seen before this request (the prefix's
        // calls were judged when it was first seen).
        for (id, name, input) in &tail.uses {
            if self.judged_uses.contains(*id) {
                continue;
            }
            self.judged_uses.insert((*id).into());
            if *name == "Read"
                && let Some(path) = input.get("file_path").and_then(|v| v.as_str())
            {
                // The call's own result is not in this request yet: what matters is whether an
                // earlier read of the path is still visible.
                if seen_paths.contains(path) && invisible(path) {
                    self.loss.rereads_after_compaction += 1;
                    self.loss.recall_misses += 1;
                }
                continue;
            }
            // The input's JSON text is read for the paths no longer visible and for `toolu_`
            // ids. With no such path, and no string of the input holding `oolu_`, nothing can
            // be found in it, and it is not written ([`may_name_a_tool_use`]).
            if invisible_seen.get_or_insert_with(&find_invisible).is_empty() && !may_name_a_tool_use(input) {
                debug_assert!(tool_use_ids_in(&input.to_string()).next().is_none(), "a tool input names a tool use id its strings do not hold: {input}");
                continue;
            }
            input_json.clear();
            serde_json::to_writer(&mut input_json, input).expect("a JSON value always serializes");
            let text = std::str::from_utf8(&input_json).expect("serde_json writes UTF-8");
            debug_assert_eq!(text, input.to_string(), "a tool input's JSON text differs from its Display");
            let miss_path = invisible_seen.get_or_insert_with(&find_invisible).iter().any(|p| text.contains(p));
            let miss_id = tool_use_ids_in(text).any(|r| self.seen_results.contains(r) && !visible(r));
            if miss_path || miss_id {
                self.loss.recall_misses += 1;
            }
        }

        // A new user prompt (the last user message with text) naming a path no longer visible.
        if let Some(last) = messages.iter().rev().find(|m| m.role == Role::User)
            && has_prompt(&last.content)
            && self.judged_prompt.get(lane).is_none_or(|judged| !same_prompt(judged, &last.content))
        {
            self.judged_prompt.insert(lane.to_owned(), prompt_texts(&last.content).cloned().collect());
            if invisible_seen.get_or_insert_with(&find_invisible).iter().any(|p| prompt_names(&last.content, p)) {
                self.loss.recall_misses += 1;
            }
        }

        // The prefix's visible paths and results are seen already.
        for path in &tail_paths {
            if !self.seen_paths.contains(*path) {
                self.seen_paths.insert((*path).into());
            }
        }
        for id in &tail_visible {
            if !self.seen_results.contains(*id) {
                self.seen_results.insert((*id).into());
            }
        }

        // Keep what the settled messages show for the lane's next request.
        if named_twice {
            return;
        }
        let mut prefix = prefix.unwrap_or_default();
        prefix.stamp = stamp;
        let settled = messages.len().saturating_sub(UNSETTLED_TAIL).max(from);
        // (One list of each kind for every message: emptied, not made again.)
        let mut more = Shown::default();
        for message in &messages[from..settled] {
            more.clear();
            more.scan(std::slice::from_ref(message), &cleared);
            prefix.extend(message, &more);
        }
        self.prefixes.insert(lane.to_owned(), prefix);
    }

    /// The tokens that left the model's view so far ([`InfoLoss::tokens_dropped`]).
    pub fn tokens_dropped(&self) -> u64 {
        self.loss.tokens_dropped
    }

    pub fn finish(self) -> InfoLoss {
        self.loss
    }
}

/// The pieces of a user message's text, where they are: the string, or the text blocks
/// ([`MessageContent::joined_text`] joins them with line breaks).
fn prompt_texts(content: &MessageContent) -> impl Iterator<Item = &SharedText> {
    let (text, blocks) = match content {
        MessageContent::Text(text) => (Some(text), &[][..]),
        MessageContent::Blocks(blocks) => (None, &blocks[..]),
    };
    text.into_iter().chain(blocks.iter().filter_map(|b| match b {
        ContentBlock::Text { text, .. } => Some(text),
        _ => None,
    }))
}

/// [`prompt_texts`] as `str`s.
fn prompt_pieces(content: &MessageContent) -> impl Iterator<Item = &str> {
    prompt_texts(content).map(|text| text.as_str())
}

/// Whether a user message holds a prompt to judge: its joined text is not empty (two pieces
/// or more hold a line break).
fn has_prompt(content: &MessageContent) -> bool {
    let mut pieces = prompt_pieces(content);
    match (pieces.next(), pieces.next()) {
        (None, _) => false,
        (Some(one), None) => !one.is_empty(),
        (Some(_), Some(_)) => true,
    }
}

/// Whether the joined text of `content`'s prompt is that of `judged` (a prompt's
/// [`prompt_texts`]), found without joining them (every request's last user message is asked,
/// and most are new prompts or the one judged before): the same allocations hold the same text,
/// joined texts of different lengths differ, and only texts of one length, not the same
/// allocations (a prompt made again), are joined and compared.
fn same_prompt(judged: &[SharedText], content: &MessageContent) -> bool {
    let joined_len = |(count, sum): (usize, usize)| sum + count.saturating_sub(1);
    let (mut count, mut sum, mut allocations) = (0, 0, true);
    for text in prompt_texts(content) {
        allocations &= judged.get(count).is_some_and(|held| held.same(text));
        (count, sum) = (count + 1, sum + text.len());
    }
    let joined_judged = || judged.iter().map(|text| text.as_str()).collect::<Vec<_>>().join("\n");
    let same = if allocations && count == judged.len() {
        true
    } else if joined_len((count, sum)) != joined_len((judged.len(), judged.iter().map(|text| text.len()).sum())) {
        false
    } else {
        joined_judged() == content.joined_text()
    };
    debug_assert_eq!(same, joined_judged() == content.joined_text(), "a prompt is found the judged one where its joined text is not");
    same
}

/// Whether a user message's text names `path`: a path without a line break is in the joined
/// text only inside one piece (the pieces are joined by line breaks), so the pieces are
/// searched where they are (an empty one is in every text, even of no piece).
fn prompt_names(content: &MessageContent, path: &str) -> bool {
    let found = if path.is_empty() {
        true
    } else if path.contains('\n') {
        content.joined_text().contains(path)
    } else {
        prompt_pieces(content).any(|piece| piece.contains(path))
    };
    debug_assert_eq!(found, content.joined_text().contains(path), "a prompt's pieces and its joined text differ in naming {path:?}");
    found
}

/// Whether the JSON text of `value` may hold `toolu_` ([`tool_use_ids_in`]): only inside one
/// string's characters (no `o` or `_` is written outside strings, and escaping writes neither,
/// nor `l`, nor a `u` before `_`), so only where a key or a string value holds `oolu_`.
fn may_name_a_tool_use(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    // (One searcher for every string: `str::contains` builds one per call.)
    static TAIL: std::sync::LazyLock<memchr::memmem::Finder<'static>> = std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"oolu_"));
    let holds = |text: &str| TAIL.find(text.as_bytes()).is_some();
    match value {
        Value::String(text) => holds(text),
        Value::Array(items) => items.iter().any(may_name_a_tool_use),
        Value::Object(map) => map.iter().any(|(key, value)| holds(key) || may_name_a_tool_use(value)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// `toolu_…` ids named in a text.
fn tool_use_ids_in(text: &str) -> impl Iterator<Item = &str> {
    text.match_indices("toolu_").map(move |(start, _)| {
        let end = text[start..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(text.len(), |e| start + e);
        &text[start..end]
    })
}

fn is_placeholder(content: &ToolResultContent) -> bool {
    match content {
        ToolResultContent::Text(t) => t.is_empty() || PLACEHOLDERS.iter().any(|p| t.starts_with(p)),
        ToolResultContent::Blocks(blocks) => {
            blocks.iter().all(|b| matches!(b, ContentBlock::Text { text, .. } if PLACEHOLDERS.iter().any(|p| text.starts_with(p))))
        }
    }
}

/// Information loss of a whole run (bodies and rows in the same order).
pub fn info_loss(requests: &[Request], rows: &[RequestMetrics]) -> InfoLoss {
    let mut tracker = LossTracker::new();
    for (request, row) in requests.iter().zip(rows) {
        tracker.observe(request, row);
    }
    tracker.finish()
}

#[cfg(test)]
mod prefix_tests {
    use super::*;
    use crate::api::{Message, SharedBlocks};
    use proptest::prelude::*;
    use serde_json::json;

    const PATHS: [&str; 3] = ["/r/a.rs", "/r/b.rs", "/r/c.rs"];

    /// The last message made again (its blocks in a new list), as the cache marker's move does.
    fn remade(message: &Message) -> Message {
        let mut again = message.clone();
        if let MessageContent::Blocks(blocks) = &message.content {
            again.content = MessageContent::Blocks(SharedBlocks::from(blocks.to_vec()));
        }
        again
    }

    /// JSON values whose strings are made of the letters of `toolu_` and what escaping writes.
    fn any_input() -> impl Strategy<Value = serde_json::Value> {
        let piece = prop::sample::select(vec!["t", "o", "l", "u", "_", "oolu_", "olu_", "toolu_", "\t", "\u{1}", "\\", "\"", "a", "0", "n"]);
        let text = prop::collection::vec(piece, 0..8).prop_map(|pieces| pieces.concat());
        let leaf = prop_oneof![Just(serde_json::Value::Null), any::<bool>().prop_map(serde_json::Value::Bool), any::<i64>().prop_map(serde_json::Value::from), text.clone().prop_map(serde_json::Value::String)];
        leaf.prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::vec((text.clone(), inner), 0..4).prop_map(|entries| serde_json::Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// A message holds a prompt where its joined text is not empty, is the prompt judged
        /// before where their joined texts are equal (in the same allocations or not), and
        /// names a path where its joined text holds it: text blocks (empty ones too) among
        /// others, in one piece or several, or a plain string; paths with and without a line
        /// break, across pieces or inside one.
        #[test]
        fn a_prompts_sameness_and_names_are_its_joined_texts(
            pieces in prop::collection::vec(prop_oneof![Just(None), prop::sample::select(vec!["", "a", "/r/a.rs", "x\ny", "s\n/r"]).prop_map(Some)], 0..5),
            plain in any::<bool>(),
            judged in prop::collection::vec(prop::sample::select(vec!["", "a", "/r/a.rs", "x", "y", "x\ny", "s\n/r", "s", "/r"]), 0..4),
            path in prop::sample::select(vec!["", "a", "/r/a.rs", "y\n/r", "\n", "rs\na"]),
        ) {
            let blocks: Vec<ContentBlock> = pieces
                .iter()
                .enumerate()
                .map(|(i, piece)| match piece {
                    Some(text) => ContentBlock::text(*text),
                    None => ContentBlock::ToolResult { tool_use_id: format!("toolu_{i}"), content: None, is_error: None, cache_control: None, extra: Default::default() },
                })
                .collect();
            let content = if plain { MessageContent::Text(pieces.iter().flatten().copied().collect::<Vec<_>>().join("\n").into()) } else { MessageContent::Blocks(blocks.into()) };
            let joined = content.joined_text();
            prop_assert_eq!(has_prompt(&content), !joined.is_empty());
            let held: Vec<SharedText> = prompt_texts(&content).cloned().collect();
            prop_assert!(same_prompt(&held, &content));
            let judged: Vec<SharedText> = judged.into_iter().map(SharedText::from).collect();
            prop_assert_eq!(same_prompt(&judged, &content), judged.iter().map(|text| text.as_str()).collect::<Vec<_>>().join("\n") == joined);
            prop_assert_eq!(prompt_names(&content, path), joined.contains(path));
        }

        /// An input whose strings hold no `oolu_` names no tool use id in its JSON text.
        #[test]
        fn an_input_without_the_ids_tail_names_no_id(input in any_input()) {
            if !may_name_a_tool_use(&input) {
                prop_assert_eq!(tool_use_ids_in(&input.to_string()).count(), 0, "{}", input);
            }
        }

        /// Reading each request from where it departs from the lane's kept prefix judges as
        /// reading it whole does, through cleared results, compactions, rewritten messages,
        /// repeated Read ids, server-side clears (one request's, lasting, lifted) and a second
        /// lane.
        #[test]
        fn kept_prefixes_judge_as_whole_requests(ops in proptest::collection::vec((0u8..10, 0usize..3, 0usize..40, 0usize..64), 1..60)) {
            let (mut kept, mut whole) = (LossTracker::new(), LossTracker { whole: true, ..LossTracker::new() });
            let mut lanes: [Vec<Message>; 2] = [Vec::new(), Vec::new()];
            let mut next = 0usize;
            // Results the server goes on clearing from request to request (context editing).
            let mut server: Vec<String> = Vec::new();
            // Each lane's last request as sent, with its stamp (`None`: observed without one).
            let mut sent: [(Vec<Message>, Option<u64>); 2] = [(Vec::new(), None), (Vec::new(), None)];
            let mut stamps = 0u64;
            for (op, p, k, h) in ops {
                let path = PATHS[p];
                let lane = usize::from(op == 9);
                let messages = &mut lanes[lane];
                let mut cleared = Vec::new();
                let earlier = format!("toolu_{}", k % (next + 1));
                fn call(next: &mut usize, name: &str, input: serde_json::Value, result: &str, messages: &mut Vec<Message>) {
                    *next += 1;
                    let id = format!("toolu_{next}");
                    messages.push(Message::assistant_blocks(vec![ContentBlock::tool_use(id.clone(), name, input)]));
                    messages.push(Message::user_blocks(vec![ContentBlock::tool_result(id, ToolResultContent::Text(result.into()), None)]));
                }
                match op {
                    0 | 9 => call(&mut next, "Read", json!({"file_path": path}), "fn main() {}", messages),
                    1 => call(&mut next, "Read", json!({"file_path": path}), PLACEHOLDERS[0], messages),
                    2 => call(&mut next, "Bash", json!({"command": format!("cat {path}")}), "ok", messages),
                    3 => call(&mut next, "Grep", json!({"pattern": earlier}), "ok", messages),
                    4 => messages.push(Message::user_text(format!("look at {path} again"))),
                    5 => *messages = vec![Message::user_text("summary")],
                    6 => {
                        // An older result cleared in place (a new list for that message).
                        let at = k % messages.len().max(1);
                        if let Some(MessageContent::Blocks(blocks)) = messages.get_mut(at).map(|m| &mut m.content) {
                            for block in blocks.iter_mut() {
                                if let ContentBlock::ToolResult { content, .. } = block {
                                    *content = Some(ToolResultContent::Text(PLACEHOLDERS[1].into()));
                                }
                            }
                        }
                    }
                    7 => {
                        // A Read id named again.
                        let id = format!("toolu_{}", k % (next + 1));
                        messages.push(Message::assistant_blocks(vec![ContentBlock::tool_use(id.clone(), "Read", json!({"file_path": path}))]));
                        messages.push(Message::user_blocks(vec![ContentBlock::tool_result(id, ToolResultContent::Text("again".into()), None)]));
                    }
                    // A result cleared server-side in this request only, from now on, or every
                    // one cleared so far shown again.
                    _ => match k % 4 {
                        0 => cleared.push(format!("toolu_{}", k % (next + 1))),
                        3 => server.clear(),
                        _ => server.push(format!("toolu_{}", k % (next + 1))),
                    },
                }
                cleared.extend(server.iter().cloned());
                if let Some(last) = messages.last_mut() {
                    *last = remade(last);
                }
                let mut request = Request::new("m", 100);
                request.messages = messages.clone();
                // The caller's count of leading messages the lane's last request sent as they
                // are: any count up to the first one that differs (sometimes no stamp at all).
                let (previous, previous_stamp) = &sent[lane];
                let shared = request.messages.iter().zip(previous).take_while(|(new, old)| match (&new.content, &old.content) {
                    (MessageContent::Blocks(a), MessageContent::Blocks(b)) => a.same(b),
                    (MessageContent::Text(a), MessageContent::Text(b)) => a == b,
                    _ => false,
                }).count();
                stamps += 1;
                if h % 7 != 0 {
                    kept.expect_shared(stamps, previous_stamp.map(|s| (s, h % (shared + 1))));
                }
                sent[lane] = (request.messages.clone(), (h % 7 != 0).then_some(stamps));
                let lane = ["main", "sub"][lane];
                kept.judge(&request, lane, &cleared);
                whole.judge(&request, lane, &cleared);
                prop_assert_eq!(&kept.loss, &whole.loss);
                prop_assert_eq!(&kept.seen_paths, &whole.seen_paths);
                prop_assert_eq!(&kept.seen_results, &whole.seen_results);
                prop_assert_eq!(&kept.judged_uses, &whole.judged_uses);
            }
        }
    }
}
