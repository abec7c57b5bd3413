//! A deterministic generator of long sessions, and a driver that runs the whole chain over one.
//!
//! The generator draws from one seeded [`Rng`]: rounds of an assistant calling 1–3 tools with
//! results from a few bytes to ~120k chars (a long tail, so per-tool thresholds and the aggregate
//! budget both trip), new user prompts now and then, and idle gaps (some over an hour, so
//! time-based microcompact and cache TTLs come into play). The driver plays the session: before
//! every request it runs the chain, answers compaction requests with a synthetic summary, then
//! appends the assistant reply with a usage computed the client's way and the tool results.

use serde_json::json;

use crate::api::{ContentBlock, Message, ToolResultContent, Usage};
use crate::world::{Clock, Rng, VirtualFs};

use super::chain::{Chain, ChainStep};
use super::config::CompactConfig;
use super::context::{ChainContext, ChainOutput, ChainState, CompactionReply, Entry, ModelLimits};
use super::counting::rough_entries;

/// One tool call of a generated round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenCall {
    pub tool: &'static str,
    pub result_chars: usize,
}

/// One request's worth of session: an optional new prompt, an idle gap before it, and what the
/// assistant answers (tool calls; none = a final text answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenRound {
    pub idle_ms: u64,
    pub prompt: Option<String>,
    pub calls: Vec<GenCall>,
    pub answer_chars: usize,
}

const TOOLS: &[&str] = &["Bash", "Read", "Grep", "Glob", "Edit", "WebFetch", "Write", "TodoWrite"];

/// `requests` rounds drawn from `seed`.
pub fn generate(seed: u64, requests: usize) -> Vec<GenRound> {
    let mut rng = Rng::new(seed).fork("compact-generator");
    let mut rounds = Vec::with_capacity(requests);
    for i in 0..requests {
        let idle_ms = match rng.range(0..100) {
            0..=1 => rng.range(61..180) * 60_000,
            2..=9 => rng.range(5..30) * 60_000,
            _ => rng.range(1..30) * 1_000,
        };
        let prompt = (i == 0 || rng.chance(0.08)).then(|| format!("Task {i}: please continue with step {} of the plan.", rng.range(1..50)));
        let calls = if rng.chance(0.12) {
            Vec::new()
        } else {
            (0..rng.range(1..4))
                .map(|_| {
                    let tool = *rng.pick(TOOLS).expect("tools");
                    let result_chars = match rng.range(0..100) {
                        0..=59 => rng.range(20..2_000),
                        60..=89 => rng.range(2_000..15_000),
                        90..=96 => rng.range(15_000..60_000),
                        _ => rng.range(60_000..120_000),
                    } as usize;
                    GenCall { tool, result_chars }
                })
                .collect()
        };
        rounds.push(GenRound { idle_ms, prompt, calls, answer_chars: rng.range(40..1_200) as usize });
    }
    rounds
}

/// Deterministic text of `chars` characters with newlines every ~80.
///
/// A filler of a tag is the beginning of every longer one of that tag (the same lines, cut
/// later): each thread keeps the longest it made of its last [`FILLER_TAGS_KEPT`] tags, whole
/// lines, and copies the beginning asked for, making lines only beyond it (at least as many
/// again as it holds).
pub fn filler(tag: &str, chars: usize) -> String {
    thread_local! {
        static MADE: std::cell::RefCell<Vec<(String, String)>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let s = MADE.with_borrow_mut(|made| {
        let i = match made.iter().position(|(made_tag, _)| made_tag == tag) {
            Some(i) => i,
            None => {
                if made.len() == FILLER_TAGS_KEPT {
                    made.remove(0);
                }
                made.push((tag.to_owned(), String::new()));
                made.len() - 1
            }
        };
        let longest = &mut made[i].1;
        if longest.len() < chars {
            *longest = filler_lines(tag, chars.max(longest.len() * 2));
        }
        // (Where a cut is no character boundary, as `String::truncate` there.)
        longest[..chars].to_owned()
    });
    debug_assert!(s == formatted_filler(tag, chars), "a filler pushed differs from one formatted");
    s
}

/// The tags whose longest filler a thread keeps ([`filler`]).
const FILLER_TAGS_KEPT: usize = 8;

/// [`filler`]'s lines of `tag`, whole, until they hold `chars` bytes.
fn filler_lines(tag: &str, chars: usize) -> String {
    let mut s = String::with_capacity(chars + 80 + tag.len());
    let mut line = 0usize;
    // Pushed, not formatted: a workload's stand-ins are long texts of these lines.
    let mut digits = itoa::Buffer::new();
    while s.len() < chars {
        s.push_str(tag);
        s.push_str(" line ");
        s.push_str(digits.format(line));
        s.push_str(": lorem ipsum dolor sit amet consectetur adipiscing elit\n");
        line += 1;
    }
    s
}

/// [`filler`] written through `writeln!` (the reference it is checked against).
fn formatted_filler(tag: &str, chars: usize) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(chars + 80);
    let mut line = 0;
    while s.len() < chars {
        let _ = writeln!(s, "{tag} line {line}: lorem ipsum dolor sit amet consectetur adipiscing elit");
        line += 1;
    }
    s.truncate(chars);
    s
}

/// A synthetic summary of about `tokens` tokens.
pub fn synthetic_summary(tokens: u64) -> String {
    format!("<analysis>Synthetic.</analysis>\n<summary>\n{}\n</summary>", filler("summary", (tokens * 4) as usize))
}

/// Totals of one drive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriveStats {
    pub requests: usize,
    pub compactions: usize,
    pub fired: std::collections::BTreeMap<String, usize>,
    pub blocked: usize,
    pub peak_tokens: u64,
    pub final_messages: usize,
}

/// Everything a drive owns.
pub struct Driver {
    pub config: CompactConfig,
    pub state: ChainState,
    pub fs: VirtualFs,
    pub clock: Clock,
    pub limits: ModelLimits,
    pub chain: Chain,
    pub entries: Vec<Entry>,
    /// Reads the whole conversation on every request, as if no earlier run of
    /// `tool_result_budget` had settled any of it (the reference its incremental run is
    /// checked against).
    pub rescan_budget: bool,
    next_uuid: u64,
}

impl Driver {
    pub fn new(config: CompactConfig, limits: ModelLimits) -> Driver {
        Driver {
            config,
            state: ChainState::new("/home/user/.claude/projects/-work/session"),
            fs: VirtualFs::new(),
            clock: Clock::new(1_760_000_000_000),
            limits,
            chain: Chain::new(),
            entries: Vec::new(),
            rescan_budget: false,
            next_uuid: 0,
        }
    }

    fn push(&mut self, message: Message) -> &mut Entry {
        self.next_uuid += 1;
        self.entries.push(Entry::new(message, self.next_uuid, self.clock.now_ms()));
        self.entries.last_mut().expect("pushed")
    }

    /// Runs the chain once before a request; `inspect` sees the context after it.
    pub fn request(&mut self, inspect: &mut dyn FnMut(&ChainContext<'_>)) -> ChainOutput {
        let entries = std::mem::take(&mut self.entries);
        if self.rescan_budget {
            self.state.replacements.scan = Default::default();
        }
        let mut cx = ChainContext::new(entries, &mut self.state, &self.config, &mut self.fs, &self.clock, self.limits);
        // The driver keeps its entries and reports its changes to them (the rescanning
        // reference reads every entry as a list made for the context).
        cx.kept_list = !self.rescan_budget;
        let mut step = self.chain.run(&mut cx);
        while let ChainStep::Compact(_) = step {
            let reply = CompactionReply::Summary(synthetic_summary(cx.config.autocompact.synthetic_summary_tokens));
            step = self.chain.finish_compaction(&mut cx, reply);
        }
        inspect(&cx);
        let output = std::mem::take(&mut cx.output);
        let left = std::mem::take(&mut cx.entries);
        cx.state.kept_changed_from(left.untouched());
        self.entries = left.into_vec();
        output
    }

    /// Plays `rounds`, calling `inspect` after the chain on every request.
    pub fn play(&mut self, rounds: &[GenRound], inspect: &mut dyn FnMut(&ChainContext<'_>)) -> DriveStats {
        let mut stats = DriveStats::default();
        for (i, round) in rounds.iter().enumerate() {
            self.clock.advance(round.idle_ms);
            if let Some(prompt) = &round.prompt {
                self.push(Message::user_text(prompt.clone()));
            } else if self.entries.last().is_none_or(Entry::is_assistant) {
                self.push(Message::user_text("Go on."));
            }
            let output = self.request(inspect);
            stats.requests += 1;
            for report in output.reports.iter().filter(|r| r.fired) {
                *stats.fired.entry(report.name.to_string()).or_default() += 1;
            }
            stats.compactions += usize::from(output.compacted);
            if output.blocked.is_some() {
                stats.blocked += 1;
                // A blocked turn ends; the user starts over with a smaller ask after a manual reset.
                self.entries.truncate(1);
                self.state.kept_changed_from(1);
                continue;
            }
            let input = rough_entries(&self.entries);
            stats.peak_tokens = stats.peak_tokens.max(input);
            self.clock.advance(2_000);
            let mut blocks = vec![ContentBlock::text(filler("answer", round.answer_chars))];
            for (k, call) in round.calls.iter().enumerate() {
                blocks.push(ContentBlock::tool_use(format!("toolu_{i:05}_{k}"), call.tool, json!({"arg": format!("{i}-{k}")})));
            }
            let output_tokens = (round.answer_chars / 4) as u64 + 20;
            let entry = self.push(Message::assistant_blocks(blocks));
            entry.message_id = Some(format!("msg_{i:05}").into());
            entry.usage = Some(Usage { input_tokens: input, output_tokens, ..Usage::default() });
            self.state.cached_microcompact.mark_sent();
            if !round.calls.is_empty() {
                let results = round
                    .calls
                    .iter()
                    .enumerate()
                    .map(|(k, call)| {
                        ContentBlock::tool_result(
                            format!("toolu_{i:05}_{k}"),
                            ToolResultContent::Text(filler(call.tool, call.result_chars).into()),
                            None,
                        )
                    })
                    .collect();
                self.clock.advance(500);
                self.push(Message::user_blocks(results));
            }
        }
        stats.final_messages = self.entries.len();
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pushed filler is the formatted one at every length, through line numbers of one to
    /// five digits, with any tag, lengths asked in any order (a longer one kept, a shorter one cut
    /// from it), more tags than a thread keeps.
    #[test]
    fn filler_pushed_equals_formatted() {
        for tag in ["", "thinking", "file known in part", "a", "b", "c", "d", "e", "f", "thinking"] {
            for chars in (0..300).chain([4_095, 4_096, 70_000, 1_000_003, 70_001, 5, 69_999, 140_003]) {
                let pushed = filler(tag, chars);
                assert_eq!(pushed, formatted_filler(tag, chars), "{tag:?} {chars}");
                assert_eq!(pushed.len(), chars);
            }
        }
    }
}
