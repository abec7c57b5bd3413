//! The reference client's own token counting (§7.1–7.2, §3.1), used for every decision of the
//! chain. It is deliberately separate from the measurement estimators in `measure::tokens`.

use crate::api::{ContentBlock, Message, MessageContent, SharedText, ToolResultContent, Usage};
use crate::measure::tokens::{chars4, json_utf16_len, utf16_len};

use super::config::CompactConfig;
use super::context::{Entry, ModelLimits};

/// Flat cost of an image or document block.
pub const IMAGE_TOKENS: u64 = 2_000;

/// `roughTokenCountEstimation`: `round(len / 4)` in UTF-16 units.
pub fn rough(text: &str) -> u64 {
    u64::from(chars4(text))
}

/// [`rough`] of a shared text, its length counted once ([`SharedText::utf16_len`]).
pub(super) fn rough_shared(text: &SharedText) -> u64 {
    rough_units(text.utf16_len())
}

/// [`rough`] of a text of `units` UTF-16 units (a text counted without being built).
pub(super) fn rough_units(units: usize) -> u64 {
    u64::from(((units + 2) / 4) as u32)
}

/// `roughTokenCountEstimationForBlock`.
pub fn rough_block(block: &ContentBlock) -> u64 {
    match block {
        ContentBlock::Text { text, .. } => rough_shared(text),
        ContentBlock::Image(_) | ContentBlock::Document(_) => IMAGE_TOKENS,
        ContentBlock::ToolResult { content, .. } => match content {
            None => 0,
            Some(ToolResultContent::Text(text)) => rough_shared(text),
            Some(ToolResultContent::Blocks(blocks)) => blocks.iter().map(rough_block).sum(),
        },
        ContentBlock::ToolUse { name, input, .. } => rough_units(utf16_len(name) + json_utf16_len(input)),
        ContentBlock::Thinking { thinking, .. } => rough(thinking),
        ContentBlock::RedactedThinking { data, .. } => rough(data),
        other => rough_units(json_utf16_len(other)),
    }
}

/// Rough tokens of one message's content.
pub fn rough_message(message: &Message) -> u64 {
    let of_blocks = |blocks: &[ContentBlock]| blocks.iter().map(rough_block).sum();
    match &message.content {
        // Its length kept with the text (a prompt, the user context: every run's entries of
        // the record share it).
        MessageContent::Text(text) => rough_shared(text),
        MessageContent::Blocks(blocks) => {
            // Kept with the list (shared by every run that sends it).
            let kept = blocks.rough_tokens(of_blocks);
            debug_assert_eq!(kept, of_blocks(blocks), "a rough count kept with a block list differs from counting its blocks");
            kept
        }
    }
}

/// `roughTokenCountEstimationForMessages` over the records that reach the wire.
pub fn rough_entries(entries: &[Entry]) -> u64 {
    entries.iter().filter(|e| e.on_wire()).map(Entry::rough).sum()
}

/// The rough counts of a conversation's leading entries, running (each entry's count is that
/// of the entries up to and including it), kept from one run of the chain to the next: a
/// request's count reads the last of them and counts only the entries after, when the session
/// says which leading entries the last run left as they were ([`RoughSums::invalidate_from`]),
/// the way it tells its message memo. A growing conversation then costs each request a count
/// of its new entries, not a sum over all of them.
#[derive(Debug, Clone, Default)]
pub struct RoughSums {
    through: Vec<u64>,
}

impl RoughSums {
    /// [`rough_entries`] of `entries`, of which the leading ones counted before are the same.
    pub fn total(&mut self, entries: &[Entry]) -> u64 {
        self.through.truncate(entries.len());
        let mut total = self.through.last().copied().unwrap_or(0);
        for entry in &entries[self.through.len()..] {
            if entry.on_wire() {
                total += entry.rough();
            }
            self.through.push(total);
        }
        debug_assert_eq!(total, rough_entries(entries), "kept running rough counts differ from counting every entry");
        total
    }

    /// The entries from `index` on are no longer the ones counted.
    pub fn invalidate_from(&mut self, index: usize) {
        self.through.truncate(index);
    }

    pub fn clear(&mut self) {
        self.through.clear();
    }
}

/// `getTokenCountFromUsage`.
pub fn usage_total(usage: &Usage) -> u64 {
    usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens + usage.output_tokens
}

/// `tokenCountWithEstimation`: the last real usage plus a rough estimate of every record after
/// the first sibling of the record carrying it; no usage anywhere → rough estimate of all.
pub fn token_count_with_estimation(entries: &[Entry]) -> u64 {
    let Some(i) = entries.iter().rposition(|e| e.is_assistant() && !e.synthetic && e.usage.is_some()) else {
        return rough_entries(entries);
    };
    let usage = entries[i].usage.as_ref().map(usage_total).unwrap_or(0);
    let mut j = i;
    if let Some(id) = &entries[i].message_id {
        let mut k = i;
        while k > 0 {
            k -= 1;
            let e = &entries[k];
            if !e.is_assistant() {
                continue;
            }
            if e.message_id.as_ref() == Some(id) {
                j = k;
            } else {
                break;
            }
        }
    }
    usage + rough_entries(&entries[j + 1..])
}

/// `tokenCountFromLastAPIResponse`: the last real usage, no estimation.
pub fn token_count_from_last_response(entries: &[Entry]) -> u64 {
    entries
        .iter()
        .rev()
        .find(|e| e.is_assistant() && !e.synthetic && e.usage.is_some())
        .and_then(|e| e.usage.as_ref())
        .map(usage_total)
        .unwrap_or(0)
}

/// `microCompact.estimateMessageTokens`: array-content user/assistant messages only; total
/// padded by 4/3 and ceiled once.
pub fn estimate_message_tokens(entries: &[Entry]) -> u64 {
    let raw: u64 = entries
        .iter()
        .filter(|e| e.on_wire())
        .map(|e| match &e.message().content {
            MessageContent::Text(_) => 0,
            MessageContent::Blocks(_) => e.rough(),
        })
        .sum();
    (raw * 4).div_ceil(3)
}

/// The thresholds of §5.1, all derived from one window and one max output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub effective_window: u64,
    pub autocompact: u64,
    pub warning: u64,
    pub error: u64,
    pub blocking: u64,
    pub autocompact_enabled: bool,
}

impl Thresholds {
    /// The thresholds of the agent (Claude Code 2.1.88): an unset output reserve is
    /// [`DEFAULT_OUTPUT_RESERVE`](super::config::DEFAULT_OUTPUT_RESERVE).
    pub fn compute(limits: ModelLimits, config: &CompactConfig) -> Thresholds {
        Thresholds::compute_with_reserve(limits, config, super::config::DEFAULT_OUTPUT_RESERVE)
    }

    /// The thresholds of a client whose own output reserve is `client_reserve` (used when the
    /// config leaves the reserve unset).
    pub fn compute_with_reserve(limits: ModelLimits, config: &CompactConfig, client_reserve: u64) -> Thresholds {
        Thresholds::of_autocompact(limits, &config.autocompact, client_reserve)
    }

    /// [`Thresholds::compute_with_reserve`]: the autocompact knobs are all it reads.
    pub fn of_autocompact(limits: ModelLimits, auto: &super::config::AutocompactConfig, client_reserve: u64) -> Thresholds {
        let window = match auto.window_override {
            Some(cap) if cap > 0 => limits.context_window.min(cap),
            _ => limits.context_window,
        };
        let effective = window.saturating_sub(limits.max_output_tokens.min(auto.output_reserve(client_reserve)));
        let base = effective.saturating_sub(auto.buffer_tokens);
        let autocompact = match auto.pct_override {
            Some(p) if p > 0 && p <= 100 => (effective * p / 100).min(base),
            _ => base,
        };
        let warn_base = if auto.enabled { autocompact } else { effective };
        let blocking = match auto.blocking_limit_override {
            Some(limit) if limit > 0 => limit,
            _ => effective.saturating_sub(auto.blocking_buffer_tokens),
        };
        Thresholds {
            effective_window: effective,
            autocompact,
            warning: warn_base.saturating_sub(auto.warning_buffer_tokens),
            error: warn_base.saturating_sub(auto.error_buffer_tokens),
            blocking,
            autocompact_enabled: auto.enabled,
        }
    }

    pub fn above_autocompact(&self, tokens: u64) -> bool {
        self.autocompact_enabled && tokens >= self.autocompact
    }

    pub fn at_blocking_limit(&self, tokens: u64) -> bool {
        tokens >= self.blocking
    }

    /// `percentLeft` of `calculateTokenWarningState`.
    pub fn percent_left(&self, tokens: u64) -> u64 {
        let threshold = if self.autocompact_enabled { self.autocompact } else { self.effective_window };
        if threshold == 0 || tokens >= threshold {
            return 0;
        }
        ((threshold - tokens) * 100 + threshold / 2) / threshold
    }
}

#[cfg(test)]
mod rough_sums_tests {
    use super::*;
    use crate::agent::compact::context::{CompactTrigger, EntryKind};
    use crate::api::{ContentBlock, Message};
    use proptest::prelude::*;

    fn entry(n: usize, len: usize) -> Entry {
        let text = "x".repeat(len);
        let message = if n % 2 == 0 { Message::user_text(text) } else { Message::assistant_blocks(vec![ContentBlock::text(text)]) };
        Entry::new(message, n as u64, 0)
    }

    proptest! {
        /// Run after run, the kept running counts give what counting every entry gives, while
        /// entries are appended, rewritten, removed, turned into boundaries and cut, each change
        /// told as the session tells it (the first entry no longer the one counted).
        #[test]
        fn rough_sums_equal_counting_every_entry(ops in proptest::collection::vec((0u8..5, 0usize..64, any::<u8>()), 1..48)) {
            let mut sums = RoughSums::default();
            let mut entries: Vec<Entry> = Vec::new();
            for (n, (op, len, at)) in ops.into_iter().enumerate() {
                let i = if entries.is_empty() { 0 } else { at as usize % entries.len() };
                match op {
                    0 => entries.push(entry(n, len)),
                    1 if !entries.is_empty() => {
                        entries[i].message_mut().content = crate::api::MessageContent::Text("y".repeat(len).into());
                        sums.invalidate_from(i);
                    }
                    2 if !entries.is_empty() => {
                        entries.remove(i);
                        sums.invalidate_from(i);
                    }
                    3 if !entries.is_empty() => {
                        entries[i].kind = EntryKind::CompactBoundary { trigger: CompactTrigger::Auto, pre_tokens: 0, logical_parent: None, preserved: None };
                        sums.invalidate_from(i);
                    }
                    // Cut: the counts of the entries cut go with them, untold.
                    _ => entries.truncate(i),
                }
                prop_assert_eq!(sums.total(&entries), rough_entries(&entries));
            }
        }
    }
}
