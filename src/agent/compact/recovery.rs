//! Recovery after the API refuses a request (§1.4).
//!
//! - **Prompt too long** (`prompt is too long: N tokens > M maximum`): the ladder is collapse
//!   drain (once per chain of retries) → reactive compact (once per turn) → surface the error.
//!   The media-size error takes the same path without the collapse rung.
//! - **max_output_tokens**: up to 3 meta user messages telling the model to resume; then the
//!   error is surfaced.
//! - **Rewrites**: the drain collapses spans; reactive compact rebuilds the conversation through
//!   [`super::chain::Chain::finish_compaction`]. **Invalidates**: as those stages do.

use serde_json::Value;

use crate::api::{ContentBlock, Message, MessageContent, SharedBlocks, ToolResultContent};

use super::autocompact;
use super::context::{ChainContext, CompactTrigger, CompactionRequest, Entry};
use super::context_collapse;
use super::counting::{rough_entries, token_count_with_estimation};
use super::grouping::peel_tail_for_ptl;

/// The API's error text for an over-long prompt.
pub fn prompt_too_long_message(actual: u64, limit: u64) -> String {
    format!("prompt is too long: {actual} tokens > {limit} maximum")
}

/// Parses `… N tokens > M maximum` into (N, M).
pub fn parse_prompt_too_long(text: &str) -> Option<(u64, u64)> {
    let rest = &text[text.find("too long:")? + "too long:".len()..];
    let mut words = rest.split_whitespace();
    let actual = words.next()?.parse().ok()?;
    if words.next()? != "tokens" || words.next()? != ">" {
        return None;
    }
    let limit = words.next()?.parse().ok()?;
    Some((actual, limit))
}

/// What the simulated API answers for a prompt of `tokens` on a `window`-token model.
pub fn simulated_api_error(tokens: u64, window: u64) -> Option<String> {
    (tokens > window).then(|| prompt_too_long_message(tokens, window))
}

/// `API_IMAGE_MAX_BASE64_SIZE` (constants/apiLimits.ts): the API refuses an image whose base64
/// data is larger.
pub const API_IMAGE_MAX_BASE64_SIZE: usize = 5 * 1024 * 1024;
/// `API_MAX_MEDIA_PER_REQUEST`: the client drops the oldest media beyond this many
/// (`stripExcessMediaItems`).
pub const API_MAX_MEDIA_PER_REQUEST: usize = 100;

/// `isMediaSizeError` (§9.2): the error texts the client treats as a media-size error.
pub fn is_media_size_error(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    (t.contains("image exceeds") && t.contains("maximum"))
        || (t.contains("image dimensions exceed") && t.contains("many-image"))
        || t.split("maximum of ").skip(1).any(|rest| {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            digits > 0 && rest[digits..].starts_with(" pdf pages")
        })
}

/// Size of an image or document block's base64 data (0 for other sources).
fn media_bytes(source: &Value) -> usize {
    source.get("data").and_then(Value::as_str).map_or(0, str::len)
}

/// Visits the media of one content block in wire order (inside a tool_result too, typed or
/// raw), keeping those for which `keep(bytes)` is true.
fn retain_media(block: &mut ContentBlock, keep: &mut dyn FnMut(usize) -> bool) {
    match block {
        ContentBlock::ToolResult { content: Some(ToolResultContent::Blocks(blocks)), .. } => {
            blocks.retain_mut(|b| match b {
                ContentBlock::Image(m) | ContentBlock::Document(m) => keep(media_bytes(&m.source)),
                other => {
                    retain_media(other, keep);
                    true
                }
            });
        }
        ContentBlock::Other(Value::Object(map)) => {
            if let Some(Value::Array(items)) = map.get_mut("content") {
                items.retain(|item| match item.get("type").and_then(Value::as_str) {
                    Some("image" | "document") => keep(item.get("source").map_or(0, media_bytes)),
                    _ => true,
                });
            }
        }
        // As its raw JSON form: the content's own media only.
        ContentBlock::FinalToolResult { content: Some(ToolResultContent::Blocks(blocks)), .. } => {
            blocks.retain(|item| item_media(item).is_none_or(&mut *keep));
        }
        _ => {}
    }
}

/// The base64 size of an image or document in a finalized tool_result's content, as its raw
/// JSON item reads (`None` for another kind of item).
fn item_media(item: &ContentBlock) -> Option<usize> {
    match item {
        ContentBlock::Image(m) | ContentBlock::Document(m) => Some(media_bytes(&m.source)),
        ContentBlock::Other(v) if matches!(v.get("type").and_then(Value::as_str), Some("image" | "document")) => Some(v.get("source").map_or(0, media_bytes)),
        _ => None,
    }
}

/// Visits every media item of the messages in order; top-level ones are kept or dropped whole.
fn retain_all_media(messages: &mut [Message], keep: &mut dyn FnMut(usize) -> bool) {
    for message in messages {
        let MessageContent::Blocks(blocks) = &mut message.content else { continue };
        blocks.retain_mut(|block| match block {
            ContentBlock::Image(m) | ContentBlock::Document(m) => keep(media_bytes(&m.source)),
            other => {
                retain_media(other, keep);
                true
            }
        });
    }
}

/// `stripExcessMediaItems`: drops the oldest media beyond `limit`; returns how many.
pub fn strip_excess_media(messages: &mut [Message], limit: usize) -> usize {
    let mut total = 0usize;
    for message in messages.iter() {
        if let MessageContent::Blocks(blocks) = &message.content {
            blocks.iter().for_each(|b| visit_media(b, &mut |_| total += 1));
        }
    }
    let mut drop = total.saturating_sub(limit);
    let dropped = drop;
    if drop > 0 {
        retain_all_media(messages, &mut |_| {
            if drop > 0 {
                drop -= 1;
                false
            } else {
                true
            }
        });
    }
    dropped
}

/// What the simulated API answers for an image over [`API_IMAGE_MAX_BASE64_SIZE`], in the shape
/// the client's matcher reads (`image exceeds … maximum`); `None` when every image fits.
pub fn simulated_media_error(messages: &[Message]) -> Option<String> {
    let mut largest = 0usize;
    for message in messages {
        let MessageContent::Blocks(blocks) = &message.content else { continue };
        largest = largest.max(media_of(blocks).largest);
    }
    media_error(largest)
}

/// The error for a request whose largest media item has `largest` base64 bytes.
fn media_error(largest: usize) -> Option<String> {
    (largest > API_IMAGE_MAX_BASE64_SIZE)
        .then(|| format!("image exceeds 5 MB maximum: {largest} bytes > {API_IMAGE_MAX_BASE64_SIZE} bytes"))
}

/// The media items of some blocks: how many, and the base64 size of the largest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Media {
    pub count: usize,
    pub largest: usize,
}

fn media_of(blocks: &[ContentBlock]) -> Media {
    let mut media = Media::default();
    for block in blocks {
        visit_media(block, &mut |bytes| {
            media.count += 1;
            media.largest = media.largest.max(bytes);
        });
    }
    media
}

/// The media of each message of the last request a runner sent, kept with the message's
/// blocks: a message whose blocks are the same allocation as the kept ones
/// ([`SharedBlocks::same`]) is not walked again. Keeping a clone of the blocks keeps the
/// allocation alive and shared, so it cannot be freed and reused for other blocks, nor changed
/// in place (a change copies shared blocks first).
///
/// With each message the memo keeps the media of the messages up to it (`through`), so a
/// request whose leading messages are the last request's own reads their media from the last
/// of them: it costs a pointer comparison per leading message and a walk of the messages from
/// the first changed one on, not a sum over the conversation (a growing conversation sends
/// its history again with every request).
#[derive(Debug, Clone, Default)]
pub struct MediaMemo {
    kept: Vec<KeptMedia>,
}

/// One message of [`MediaMemo`]: its blocks and media (`None` for a text message, which
/// carries none), and the media of the messages up to and including it.
#[derive(Debug, Clone)]
struct KeptMedia {
    blocks: Option<(SharedBlocks, Media)>,
    through: Media,
}

impl KeptMedia {
    /// Whether `message` is the one kept (the same blocks, or text then and now).
    fn holds(&self, message: &Message) -> bool {
        match (&self.blocks, &message.content) {
            (Some((kept, _)), MessageContent::Blocks(blocks)) => kept.same(blocks),
            (None, MessageContent::Text(_)) => true,
            _ => false,
        }
    }
}

impl Media {
    /// [`simulated_media_error`] of the messages these are the media of.
    pub fn error(self) -> Option<String> {
        media_error(self.largest)
    }

    fn and(self, other: Media) -> Media {
        Media { count: self.count + other.count, largest: self.largest.max(other.largest) }
    }
}

impl MediaMemo {
    /// The media of `messages`: how many items in all and the largest (what
    /// [`strip_excess_media`] counts and [`simulated_media_error`] weighs).
    pub fn scan(&mut self, messages: &[Message]) -> Media {
        self.scan_after(messages, 0)
    }

    /// [`MediaMemo::scan`] of messages whose first `known` are the ones the last scan saw (the
    /// same allocations): they are not compared. A count too high would give wrong media
    /// (debug builds check it); too low costs only the comparison.
    fn scan_after(&mut self, messages: &[Message], known: usize) -> Media {
        // The leading messages still the kept ones keep their running media; after them a
        // message whose blocks are kept is not walked either (a request may change a message
        // before others it leaves as they were: a moved marker, a cache edit).
        let known = known.min(messages.len()).min(self.kept.len());
        debug_assert!(
            messages[..known].iter().zip(&self.kept).all(|(message, kept)| kept.holds(message)),
            "a message counted as scanned before differs from the one kept ({known} counted)"
        );
        let same = known + messages[known..].iter().zip(&self.kept[known..]).take_while(|(message, kept)| kept.holds(message)).count();
        self.kept.truncate(messages.len());
        let mut total = same.checked_sub(1).map_or_else(Media::default, |last| self.kept[last].through);
        for (i, message) in messages.iter().enumerate().skip(same) {
            let blocks = match &message.content {
                MessageContent::Blocks(blocks) => Some(match self.kept.get_mut(i).and_then(|kept| kept.blocks.take()) {
                    Some((kept, media)) if kept.same(blocks) => (kept, media),
                    _ => (blocks.clone(), media_of(blocks)),
                }),
                MessageContent::Text(_) => None,
            };
            total = blocks.as_ref().map_or(total, |(_, media)| total.and(*media));
            let kept = KeptMedia { blocks, through: total };
            match self.kept.get_mut(i) {
                Some(slot) => *slot = kept,
                None => self.kept.push(kept),
            }
        }
        #[cfg(debug_assertions)]
        {
            let walked = messages.iter().fold(Media::default(), |all, m| match &m.content {
                MessageContent::Blocks(blocks) => all.and(media_of(blocks)),
                MessageContent::Text(_) => all,
            });
            debug_assert_eq!(total, walked, "the media memo differs from walking every message");
        }
        total
    }

    /// [`strip_excess_media`] of `messages`, walking only the messages not seen before, and
    /// the media of `messages` as it leaves them: what [`Media::error`] weighs when the request
    /// is sent unchanged, without a second scan.
    ///
    /// `known` leading messages are the ones the last scan saw, unchanged (see
    /// [`MediaMemo::scan_after`]).
    pub fn strip_excess(&mut self, messages: &mut [Message], limit: usize, known: usize) -> (usize, Media) {
        let media = self.scan_after(messages, known);
        if media.count > limit {
            let stripped = strip_excess_media(messages, limit);
            (stripped, self.scan(messages))
        } else {
            (0, media)
        }
    }

    /// [`simulated_media_error`] of `messages`, walking only the messages not seen before.
    pub fn media_error(&mut self, messages: &[Message]) -> Option<String> {
        media_error(self.scan(messages).largest)
    }
}

/// Read-only [`retain_media`]: the base64 size of every media item of a block.
fn visit_media(block: &ContentBlock, seen: &mut dyn FnMut(usize)) {
    match block {
        ContentBlock::Image(m) | ContentBlock::Document(m) => seen(media_bytes(&m.source)),
        ContentBlock::ToolResult { content: Some(ToolResultContent::Blocks(blocks)), .. } => blocks.iter().for_each(|b| visit_media(b, seen)),
        ContentBlock::Other(v) => {
            for item in v.get("content").and_then(Value::as_array).into_iter().flatten() {
                if matches!(item.get("type").and_then(Value::as_str), Some("image" | "document")) {
                    seen(item.get("source").map_or(0, media_bytes));
                }
            }
        }
        ContentBlock::FinalToolResult { content: Some(ToolResultContent::Blocks(blocks)), .. } => blocks.iter().filter_map(item_media).for_each(seen),
        _ => {}
    }
}

/// After a media-size error surfaced, the client strips the offending images and documents from
/// the message that carried them (§5.3 step 3); returns how many went.
pub fn strip_oversized_media(content: &mut MessageContent) -> usize {
    let MessageContent::Blocks(blocks) = content else { return 0 };
    let mut messages = [Message { role: crate::api::Role::User, content: MessageContent::Blocks(std::mem::take(blocks)), extra: Default::default() }];
    let mut stripped = 0usize;
    retain_all_media(&mut messages, &mut |bytes| {
        let keep = bytes <= API_IMAGE_MAX_BASE64_SIZE;
        stripped += usize::from(!keep);
        keep
    });
    let [message] = messages;
    *content = message.content;
    stripped
}

/// Why the previous iteration continued (the subset recovery needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    NextTurn,
    CollapseDrainRetry,
    ReactiveCompactRetry,
    MaxOutputTokensRecovery,
}

/// Loop state of the ladder, reset at each new turn except where noted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryState {
    pub has_attempted_reactive_compact: bool,
    pub last_transition: Option<Transition>,
    pub max_output_recovery_count: u32,
}

impl RecoveryState {
    /// `next_turn`: tools ran, a new iteration starts.
    pub fn next_turn(&mut self) {
        *self = RecoveryState { last_transition: Some(Transition::NextTurn), ..RecoveryState::default() };
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum RecoveryAction {
    /// Collapses were committed; retry the request (`collapse_drain_retry`).
    CollapseDrainRetry { committed: usize },
    /// Send this compaction request, then `finish_compaction`; if it compacted, retry
    /// (`reactive_compact_retry`), else surface.
    ReactiveCompact(CompactionRequest),
    /// Give up: show the error and end the turn (`prompt_too_long` / `image_error`).
    Surface { error: String },
}

/// `stripImagesFromMessages` over a fork's input: every image and document (top level or in a
/// tool_result) becomes the text `[image]` / `[document]`. Returns how many were replaced.
pub fn strip_media_to_text(entries: &mut [Entry]) -> usize {
    fn placeholder(kind: &str) -> ContentBlock {
        ContentBlock::text(if kind == "document" { "[document]" } else { "[image]" })
    }
    fn strip(block: &mut ContentBlock, count: &mut usize) {
        match block {
            ContentBlock::Image(_) | ContentBlock::Document(_) => {
                *count += 1;
                *block = placeholder(block.kind());
            }
            ContentBlock::ToolResult { content: Some(ToolResultContent::Blocks(blocks)), .. } => {
                blocks.iter_mut().for_each(|b| strip(b, count));
            }
            ContentBlock::Other(Value::Object(map)) => {
                for item in map.get_mut("content").and_then(Value::as_array_mut).into_iter().flatten() {
                    if let Some(kind @ ("image" | "document")) = item.get("type").and_then(Value::as_str) {
                        let text = if kind == "document" { "[document]" } else { "[image]" };
                        *item = serde_json::json!({"type": "text", "text": text});
                        *count += 1;
                    }
                }
            }
            // As its raw JSON form: the content's own media only.
            ContentBlock::FinalToolResult { content: Some(ToolResultContent::Blocks(blocks)), .. } => {
                for item in blocks.iter_mut() {
                    if item_media(item).is_some() {
                        *item = placeholder(item.kind());
                        *count += 1;
                    }
                }
            }
            _ => {}
        }
    }
    let mut count = 0;
    for entry in entries.iter_mut() {
        let mut found = 0;
        if let MessageContent::Blocks(blocks) = &entry.message().content {
            blocks.iter().for_each(|b| visit_media(b, &mut |_| found += 1));
        }
        if found == 0 {
            continue;
        }
        if let MessageContent::Blocks(blocks) = &mut entry.message_mut().content {
            blocks.iter_mut().for_each(|b| strip(b, &mut count));
        }
    }
    count
}

/// A reactive compaction that could not start: its report and the surfaced error.
fn reactive_failed(cx: &mut ChainContext<'_>, code: &str, detail: &str, error: &str) -> RecoveryAction {
    let tokens = rough_entries(&cx.entries);
    let mut report = super::chain::skipped("reactive_compact", "", tokens);
    report.reason = format!("compaction failed ({code}: {detail}); consecutive failures {}", cx.state.tracking.consecutive_failures).into();
    cx.output.reports.push(report);
    cx.event(&format!("compaction_failed:{code}"));
    RecoveryAction::Surface { error: error.to_owned() }
}

/// `tryReactiveCompact` (§1.4 step 2, §4.3): once per turn. The fork's input is the
/// conversation with the newest API-round groups peeled off until they cover the error's token
/// gap (what overflowed), or, after a media-size error, with its media replaced by text.
fn reactive(cx: &mut ChainContext<'_>, state: &mut RecoveryState, error: &str) -> RecoveryAction {
    if !cx.config.autocompact.reactive_enabled || cx.config.autocompact.compact_disabled || state.has_attempted_reactive_compact {
        return RecoveryAction::Surface { error: error.to_owned() };
    }
    state.has_attempted_reactive_compact = true;
    state.last_transition = Some(Transition::ReactiveCompactRetry);
    let pre = token_count_with_estimation(&cx.entries);
    let mut fork: Vec<Entry> = cx.entries.to_vec();
    let mut trimmed = (0, 0);
    if is_media_size_error(error) {
        if strip_media_to_text(&mut fork) == 0 {
            return reactive_failed(cx, "media_unstrippable", "no image or document to strip", error);
        }
    } else {
        let gap = parse_prompt_too_long(error).map(|(actual, limit)| actual.saturating_sub(limit));
        let Some(peel) = peel_tail_for_ptl(&fork, gap) else {
            return reactive_failed(cx, "too_few_groups", "a single API round cannot be peeled", error);
        };
        trimmed = (peel.groups, peel.tokens);
        fork = peel.kept;
        cx.output.peeled_tail = peel.removed;
        cx.event(&format!("truncation:reactive_peel:{}", peel.groups));
    }
    let request = autocompact::request(cx, CompactTrigger::Reactive, fork, pre, 0, trimmed);
    cx.output.pending_compaction = Some(request.clone());
    RecoveryAction::ReactiveCompact(request)
}

/// The prompt-too-long ladder.
pub fn on_prompt_too_long(cx: &mut ChainContext<'_>, state: &mut RecoveryState, error: &str) -> RecoveryAction {
    if cx.config.context_collapse.enabled && state.last_transition != Some(Transition::CollapseDrainRetry) {
        let committed = context_collapse::drain(cx);
        if committed > 0 {
            state.last_transition = Some(Transition::CollapseDrainRetry);
            return RecoveryAction::CollapseDrainRetry { committed };
        }
    }
    reactive(cx, state, error)
}

/// The media-size error: reactive compact or surface.
pub fn on_media_too_large(cx: &mut ChainContext<'_>, state: &mut RecoveryState, error: &str) -> RecoveryAction {
    reactive(cx, state, error)
}

/// Our resume instruction after the output limit was hit.
pub const RESUME_MESSAGE: &str = "Your previous reply hit the output token limit and was cut off. Continue exactly where \
it stopped, even mid-sentence, with no apology and no recap. If much remains, split it into smaller pieces.";

#[derive(Debug, Clone, PartialEq)]
pub enum MaxOutputAction {
    /// Append the partial reply and this meta user message, then retry.
    Resume { attempt: u32, message: Message },
    Surface,
}

/// max_output_tokens recovery: up to `max_output_tokens_recovery_limit` resumes per turn.
pub fn on_max_output_tokens(limit: u32, state: &mut RecoveryState) -> MaxOutputAction {
    if state.max_output_recovery_count < limit {
        state.max_output_recovery_count += 1;
        state.last_transition = Some(Transition::MaxOutputTokensRecovery);
        return MaxOutputAction::Resume { attempt: state.max_output_recovery_count, message: Message::user_text(RESUME_MESSAGE) };
    }
    MaxOutputAction::Surface
}

#[cfg(test)]
mod media_memo_tests {
    use super::*;
    use crate::api::ImageLike;
    use proptest::prelude::*;
    use serde_json::json;

    fn image(bytes: usize) -> ContentBlock {
        ContentBlock::Image(ImageLike { source: json!({"type": "base64", "data": "A".repeat(bytes)}).into(), cache_control: None, extra: Default::default() })
    }

    /// A user message with `images` images of `bytes` each, some inside a tool_result.
    fn message(images: usize, bytes: usize, n: usize) -> Message {
        let mut blocks = vec![ContentBlock::text(format!("m{n}"))];
        for i in 0..images {
            if i % 2 == 0 {
                blocks.push(image(bytes + i));
            } else {
                blocks.push(ContentBlock::tool_result(format!("t{n}_{i}"), ToolResultContent::Blocks(vec![image(bytes)]), None));
            }
        }
        Message::user_blocks(blocks)
    }

    proptest! {
        /// Request after request, the memo counts and weighs what a walk of every message
        /// does, while messages are appended, replaced, changed in place (copy on write of
        /// blocks the previous request still holds) and cut, with requests sharing their
        /// unchanged messages as the agent's do.
        #[test]
        fn media_memo_equals_walking_every_message(ops in proptest::collection::vec((0u8..4, 0usize..4, 1usize..40, any::<u8>()), 1..40)) {
            let mut memo = MediaMemo::default();
            let mut messages: Vec<Message> = Vec::new();
            for (n, (op, images, bytes, at)) in ops.into_iter().enumerate() {
                let mut next = messages.clone();
                match op {
                    0 => next.push(message(images, bytes, n)),
                    1 if !next.is_empty() => {
                        let i = at as usize % next.len();
                        next[i] = message(images, bytes, n);
                    }
                    2 if !next.is_empty() => {
                        let i = at as usize % next.len();
                        if let MessageContent::Blocks(blocks) = &mut next[i].content {
                            blocks.push(image(bytes));
                        }
                    }
                    _ => next.truncate(at as usize % (next.len() + 1)),
                }
                messages = next;
                let media = memo.scan(&messages);
                let mut walked = messages.clone();
                prop_assert_eq!(media.count, strip_excess_media(&mut walked, 0));
                prop_assert_eq!(memo.media_error(&messages), simulated_media_error(&messages));
                prop_assert_eq!(media.error(), simulated_media_error(&messages));
                // The copy's messages are the ones the last scan saw: any count of them is known.
                let mut stripped = messages.clone();
                let known = n * 7 % (stripped.len() + 1);
                let (count, left) = memo.strip_excess(&mut stripped, at as usize % 4, known);
                let mut walked = messages.clone();
                prop_assert_eq!(count, strip_excess_media(&mut walked, at as usize % 4));
                prop_assert_eq!(left.error(), simulated_media_error(&walked));
                prop_assert_eq!(left.count, strip_excess_media(&mut walked, 0));
                let largest = messages.iter().filter_map(|m| match &m.content {
                    MessageContent::Blocks(b) => Some(media_of(b).largest),
                    MessageContent::Text(_) => None,
                }).max().unwrap_or(0);
                prop_assert_eq!(media.largest, largest);
            }
        }
    }
}
