//! The long-context chain: each stage on realistic conversations, the compaction callback, the
//! recovery ladder, and invariants over generated sessions.

use std::collections::{BTreeMap, BTreeSet};

use ctxsim::agent::compact::autocompact::{SUMMARY_MARKER, summary_instruction};
use ctxsim::agent::compact::context::{InvokedSkill, ReadFile};
use ctxsim::agent::compact::counting::{Thresholds, rough_entries, token_count_with_estimation};
use ctxsim::agent::compact::chain::orphans;
use ctxsim::agent::compact::config::PeeledTail;
use ctxsim::agent::compact::generator::{Driver, filler, generate, synthetic_summary};
use ctxsim::agent::compact::grouping::{PTL_RETRY_MARKER, Trimmed, group_by_api_round, peel_tail_for_ptl, truncate_head};
use ctxsim::agent::compact::microcompact::CLEARED_MARKER;
use ctxsim::agent::compact::recovery::{self, MaxOutputAction, RecoveryAction, RecoveryState};
use ctxsim::agent::compact::{
    Chain, ChainContext, ChainState, ChainStep, CompactConfig, CompactionReply, Entry, EntryKind, ModelLimits, STAGES,
};
use ctxsim::api::{ContentBlock, Message, MessageContent, ToolResultContent, Usage};
use ctxsim::world::{Clock, VirtualFs};
use proptest::prelude::*;
use serde_json::json;

const LIMITS: ModelLimits = ModelLimits { context_window: 200_000, max_output_tokens: 32_000 };

/// A conversation builder: prompts, tool calls with results of N chars, idle gaps.
struct Convo {
    entries: Vec<Entry>,
    now: u64,
    next: u64,
}

impl Convo {
    fn new() -> Convo {
        Convo { entries: Vec::new(), now: 0, next: 0 }
    }
    fn push(&mut self, message: Message) -> &mut Entry {
        self.next += 1;
        self.entries.push(Entry::new(message, self.next, self.now));
        self.entries.last_mut().unwrap()
    }
    fn prompt(mut self, text: &str) -> Convo {
        self.push(Message::user_text(text));
        self
    }
    /// An assistant round calling `tool` whose result has `chars` characters.
    fn tool(mut self, tool: &str, chars: usize) -> Convo {
        let id = format!("toolu_{}", self.next + 1);
        let n = self.next;
        let e = self.push(Message::assistant_blocks(vec![
            ContentBlock::text(format!("Calling {tool}.")),
            ContentBlock::tool_use(id.clone(), tool, json!({"n": n})),
        ]));
        e.message_id = Some(format!("msg_{n}").into());
        self.now += 1_000;
        self.push(Message::user_blocks(vec![ContentBlock::tool_result(id, ToolResultContent::Text(filler(tool, chars).into()), None)]));
        self
    }
    /// An assistant text reply reporting `usage_total` tokens of usage.
    fn answer(mut self, text: &str, usage_total: u64) -> Convo {
        let n = self.next;
        let e = self.push(Message::assistant_blocks(vec![ContentBlock::text(text)]));
        e.message_id = Some(format!("msg_{n}").into());
        e.usage = Some(Usage { input_tokens: usage_total.saturating_sub(10), output_tokens: 10.min(usage_total), ..Usage::default() });
        self
    }
}

struct World {
    state: ChainState,
    fs: VirtualFs,
    clock: Clock,
    config: CompactConfig,
}

impl World {
    fn new(config: CompactConfig) -> World {
        World { state: ChainState::new("/s"), fs: VirtualFs::new(), clock: Clock::new(0), config }
    }
    fn cx(&mut self, entries: Vec<Entry>) -> ChainContext<'_> {
        ChainContext::new(entries, &mut self.state, &self.config, &mut self.fs, &self.clock, LIMITS)
    }
}

fn report<'a>(cx: &'a ChainContext<'_>, name: &str) -> &'a ctxsim::measure::metrics::StageReport {
    cx.output.reports.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("no report {name}: {:?}", cx.output.reports))
}

fn result_text(entries: &[Entry], id: &str) -> String {
    for e in entries {
        for b in e.blocks() {
            if let ContentBlock::ToolResult { tool_use_id, content: Some(ToolResultContent::Text(t)), .. } = b
                && tool_use_id == id {
                    return String::clone(t);
                }
        }
    }
    panic!("no result {id}")
}

#[test]
fn compact_thresholds_match_the_reference_numbers() {
    let t = Thresholds::compute(LIMITS, &CompactConfig::default());
    assert_eq!((t.effective_window, t.autocompact, t.warning, t.error, t.blocking), (180_000, 167_000, 147_000, 147_000, 177_000));
    let t = Thresholds::compute(ModelLimits { context_window: 200_000, max_output_tokens: 8_000 }, &CompactConfig::default());
    assert_eq!((t.effective_window, t.autocompact, t.blocking), (192_000, 179_000, 189_000));
    let mut config = CompactConfig::default();
    let env: BTreeMap<String, String> = [
        ("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE", "50"),
        ("CLAUDE_CODE_BLOCKING_LIMIT_OVERRIDE", "150000"),
        ("CLAUDE_CODE_AUTO_COMPACT_WINDOW", "100000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    config.apply_env(&env);
    let t = Thresholds::compute(LIMITS, &config);
    assert_eq!((t.effective_window, t.autocompact, t.blocking), (80_000, 40_000, 150_000));
    let mut config = CompactConfig::default();
    config.apply_env(&[("DISABLE_COMPACT".to_owned(), "1".to_owned())].into_iter().collect());
    assert!(!config.autocompact.enabled && config.autocompact.compact_disabled);
}

#[test]
fn compact_config_roundtrips_and_rejects_unknown_fields() {
    let config = CompactConfig::default();
    let text = toml::to_string(&config).unwrap();
    assert_eq!(toml::from_str::<CompactConfig>(&text).unwrap(), config);
    let partial: CompactConfig = toml::from_str("[autocompact]\nbuffer_tokens = 5000\n").unwrap();
    assert_eq!(partial.autocompact.buffer_tokens, 5_000);
    assert_eq!(partial.autocompact.max_consecutive_failures, 3);
    assert!(toml::from_str::<CompactConfig>("[autocompact]\nbufer = 1\n").is_err());
}

#[test]
fn compact_unknown_stage_is_an_error_listing_valid_ones() {
    let err = Chain::with_disabled(&["snap"]).unwrap_err().to_string();
    for stage in STAGES {
        assert!(err.contains(stage), "{err}");
    }
    assert!(Chain::with_disabled(&["snip", "microcompact"]).is_ok());
}

fn at_usage(total: u64) -> Vec<Entry> {
    Convo::new().prompt("fix the bug").tool("Bash", 400).answer("done", total).entries
}

#[test]
fn compact_autocompact_fires_at_exactly_167000() {
    let mut w = World::new(CompactConfig::default());
    let mut cx = w.cx(at_usage(166_999));
    assert_eq!(token_count_with_estimation(&cx.entries), 166_999);
    assert_eq!(Chain::new().run(&mut cx), ChainStep::Ready);
    assert!(!report(&cx, "autocompact").fired);
    assert!(cx.output.pending_compaction.is_none());

    let mut w = World::new(CompactConfig::default());
    let mut cx = w.cx(at_usage(167_000));
    let chain = Chain::new();
    let ChainStep::Compact(request) = chain.run(&mut cx) else { panic!("expected a compaction request") };
    assert_eq!(request.lane, "compact");
    assert_eq!(request.pre_tokens, 167_000);
    // Ends with an assistant message, so the instruction is a new user message after it.
    let last = request.messages.last().unwrap();
    assert!(matches!(&last.content, MessageContent::Text(t) if *t == summary_instruction(None)));
    assert_eq!(request.marker_index, Some(request.messages.len() - 2));
    // blocking_limit has not run yet: the chain stopped at autocompact.
    assert!(cx.output.reports.iter().all(|r| r.name != "blocking_limit"));

    let step = chain.finish_compaction(&mut cx, CompactionReply::Summary(synthetic_summary(500)));
    assert_eq!(step, ChainStep::Ready);
    assert!(matches!(cx.entries[0].kind, EntryKind::CompactBoundary { pre_tokens: 167_000, .. }));
    assert_eq!(cx.entries[1].kind, EntryKind::Summary);
    let MessageContent::Text(summary) = &cx.entries[1].message().content else { panic!() };
    assert!(summary.contains("Summary:\nsummary line 0") && !summary.contains("<analysis>"));
    let r = report(&cx, "autocompact");
    assert!(r.fired && r.invalidated_from.as_deref() == Some("messages[0]"), "{r:?}");
    assert_eq!(report(&cx, "blocking_limit").reason, "compacted this iteration");
    assert_eq!(cx.output.events, vec!["compaction"]);
    assert!(cx.state.tracking.compacted);
}

#[test]
fn compact_summary_instruction_merges_into_a_trailing_user_message() {
    let mut entries = at_usage(170_000);
    entries.push(Entry::new(Message::user_text("next please"), 99, 0));
    let mut w = World::new(CompactConfig::default());
    let mut cx = w.cx(entries);
    let ChainStep::Compact(request) = Chain::new().run(&mut cx) else { panic!() };
    let MessageContent::Text(t) = &request.messages.last().unwrap().content else { panic!() };
    assert_eq!(t, &format!("next please\n{}", summary_instruction(None)));
    // The marker sits on the last assistant message (second-to-last).
    let marked = &request.messages[request.marker_index.unwrap()];
    let MessageContent::Blocks(blocks) = &marked.content else { panic!() };
    assert!(blocks.last().unwrap().cache_control().is_some());
}

#[test]
fn compact_circuit_breaker_opens_after_three_failures() {
    let mut w = World::new(CompactConfig::default());
    let chain = Chain::new();
    for i in 0..3 {
        let mut cx = w.cx(at_usage(170_000));
        let ChainStep::Compact(_) = chain.run(&mut cx) else { panic!("attempt {i}") };
        chain.finish_compaction(&mut cx, CompactionReply::Failed("API Error: overloaded".into()));
        assert!(report(&cx, "autocompact").reason.contains(&format!("consecutive failures {}", i + 1)));
    }
    let mut cx = w.cx(at_usage(170_000));
    assert_eq!(chain.run(&mut cx), ChainStep::Ready);
    assert!(report(&cx, "autocompact").reason.starts_with("circuit breaker open"));
}

#[test]
fn compact_prompt_too_long_summary_drops_oldest_rounds_up_to_three_times() {
    let mut convo = Convo::new().prompt("start");
    for _ in 0..10 {
        convo = convo.tool("Bash", 4_000);
    }
    let mut w = World::new(CompactConfig::default());
    let mut cx = w.cx(convo.answer("ok", 175_000).entries);
    let chain = Chain::new();
    let ChainStep::Compact(mut request) = chain.run(&mut cx) else { panic!() };
    let ptl = recovery::prompt_too_long_message(202_000, 200_000);
    for attempt in 1..=3 {
        let before = request.messages.len();
        let ChainStep::Compact(next) = chain.finish_compaction(&mut cx, CompactionReply::Summary(ptl.clone())) else {
            panic!("attempt {attempt}")
        };
        assert_eq!(next.ptl_attempt, attempt);
        assert!(next.messages.len() < before);
        let MessageContent::Text(first) = &next.messages[0].content else { panic!() };
        assert!(first.starts_with("[earlier conversation truncated for compaction retry]"));
        request = next;
    }
    assert_eq!(chain.finish_compaction(&mut cx, CompactionReply::Summary(ptl)), ChainStep::Ready);
    assert!(report(&cx, "autocompact").reason.contains("too long"));
    assert_eq!(cx.state.tracking.consecutive_failures, 1);
}

#[test]
fn compact_tool_result_budget_persists_per_tool_and_replays_byte_identically() {
    let entries = Convo::new().prompt("go").tool("Bash", 40_000).tool("Read", 100_000).tool("Grep", 19_000).entries;
    let mut w = World::new(CompactConfig::default());
    let mut cx = w.cx(entries);
    Chain::new().run(&mut cx);
    let bash = result_text(&cx.entries, "toolu_2");
    assert!(bash.starts_with("<persisted-output>\nOutput too large (39.1KB). Full output saved to: /s/tool-results/toolu_2.txt\n\nPreview (first 2KB):\n"), "{bash}");
    assert!(bash.ends_with("\n...\n</persisted-output>"));
    assert_eq!(result_text(&cx.entries, "toolu_4").len(), 100_000, "Read is never persisted");
    assert_eq!(result_text(&cx.entries, "toolu_6").len(), 19_000, "under Grep's 20k");
    let r = report(&cx, "tool_result_budget");
    assert!(r.fired && r.tokens_after < r.tokens_before);
    assert_eq!(cx.output.events, vec!["tool_result_budget"]);
    let entries = cx.entries.clone();
    assert_eq!(w.fs.read("/s/tool-results/toolu_2.txt").unwrap().len(), 40_000);

    // The same original conversation again (as a session that kept originals would send it):
    // the stored replacement comes back byte for byte, and nothing new fires.
    let originals = Convo::new().prompt("go").tool("Bash", 40_000).tool("Read", 100_000).tool("Grep", 19_000).entries;
    let mut cx = w.cx(originals);
    Chain::new().run(&mut cx);
    assert_eq!(result_text(&cx.entries, "toolu_2"), bash);
    assert_eq!(cx.entries, entries);
    assert!(!report(&cx, "tool_result_budget").fired);
}

#[test]
fn compact_aggregate_budget_replaces_largest_fresh_results() {
    let mut config = CompactConfig::default();
    config.tool_result_budget.aggregate_enabled = true;
    // One assistant message calling five tools whose results share one wire message.
    let mut convo = Convo::new().prompt("go");
    let mut uses = Vec::new();
    let mut results = Vec::new();
    for (k, chars) in [45_000, 48_000, 30_000, 49_000, 40_000].into_iter().enumerate() {
        uses.push(ContentBlock::tool_use(format!("t{k}"), "WebFetch", json!({})));
        results.push(ContentBlock::tool_result(format!("t{k}"), ToolResultContent::Text(filler("w", chars).into()), None));
    }
    convo.push(Message::assistant_blocks(uses)).message_id = Some("m1".into());
    convo.push(Message::user_blocks(results));
    let mut w = World::new(config);
    let mut cx = w.cx(convo.entries);
    Chain::new().run(&mut cx);
    // 212k > 200k: the largest (49k) alone brings it to 163k.
    let replaced: Vec<usize> = (0..5).filter(|k| result_text(&cx.entries, &format!("t{k}")).starts_with("<persisted-output>")).collect();
    assert_eq!(replaced, vec![3]);
    assert_eq!(w.state.replacements.seen_ids.len(), 5);
}

#[test]
fn compact_time_based_microcompact_clears_all_but_last_five_after_an_hour() {
    let mut config = CompactConfig::default();
    config.microcompact.time_based_enabled = true;
    let mut convo = Convo::new().prompt("go");
    for _ in 0..8 {
        convo = convo.tool("Bash", 3_000);
    }
    convo = convo.tool("TodoWrite", 3_000);
    let entries = convo.entries;
    let last_ts = entries.last().unwrap().timestamp_ms;

    let mut w = World::new(config.clone());
    w.clock.set(last_ts + 59 * 60_000);
    let mut cx = w.cx(entries.clone());
    Chain::new().run(&mut cx);
    assert!(!report(&cx, "microcompact").fired);

    let mut w = World::new(config);
    w.clock.set(last_ts + 61 * 60_000);
    let mut cx = w.cx(entries);
    Chain::new().run(&mut cx);
    let r = report(&cx, "microcompact");
    assert!(r.fired, "{r:?}");
    assert_eq!(r.invalidated_from.as_deref(), Some("messages[2].content[0]"));
    let cleared: Vec<bool> = (0..9).map(|k| result_text(&cx.entries, &format!("toolu_{}", 2 + 2 * k)) == CLEARED_MARKER).collect();
    // Bash 1..3 cleared, Bash 4..8 kept; TodoWrite is not compactable.
    assert_eq!(cleared, vec![true, true, true, false, false, false, false, false, false]);
    assert_eq!(cx.output.events, vec!["microcompact_cleared_tool_result"]);
}

#[test]
fn compact_cached_microcompact_emits_cache_edits_without_touching_messages() {
    let mut config = CompactConfig::default();
    config.microcompact.cached = ctxsim::agent::compact::config::CachedMicrocompactMode::CacheEdits;
    let mut convo = Convo::new().prompt("go");
    for _ in 0..12 {
        convo = convo.tool("Grep", 500);
    }
    let mut w = World::new(config);
    let mut cx = w.cx(convo.entries.clone());
    Chain::new().run(&mut cx);
    assert!(cx.output.cache_edits.is_none(), "nothing was sent yet, nothing deletable");
    w.state.cached_microcompact.mark_sent();
    let mut cx = w.cx(convo.entries.clone());
    Chain::new().run(&mut cx);
    assert_eq!(*cx.entries, convo.entries);
    assert_eq!(cx.output.cache_edits_deleted_tool_ids.len(), 7);
    let edits = cx.output.cache_edits.clone().unwrap();
    assert_eq!(edits["edits"][0], json!({"type": "delete", "cache_reference": "toolu_2"}));
}

#[test]
fn compact_context_editing_sends_context_management() {
    let mut config = CompactConfig::default();
    config.context_editing.clear_tool_uses = true;
    config.context_editing.clear_thinking = true;
    let mut w = World::new(config);
    let mut cx = w.cx(Convo::new().prompt("go").tool("Bash", 100).entries);
    Chain::new().run(&mut cx);
    let cm = cx.output.context_management.clone().unwrap();
    assert_eq!(cm["edits"][0]["type"], "clear_thinking_20251015");
    assert_eq!(cm["edits"][1]["clear_at_least"]["value"], 140_000);
}

#[test]
fn compact_snip_frees_tokens_for_autocompact() {
    let mut config = CompactConfig::default();
    config.snip.enabled = true;
    let mut convo = Convo::new().prompt("go");
    for _ in 0..40 {
        convo = convo.tool("Glob", 17_000);
    }
    let mut w = World::new(config);
    let mut cx = w.cx(convo.answer("ok", 175_000).entries);
    let step = Chain::new().run(&mut cx);
    let r = report(&cx, "snip");
    assert!(r.fired && r.tokens_after <= 108_000, "{r:?}");
    assert_eq!(cx.output.snip_tokens_freed, r.tokens_before - r.tokens_after);
    // 175k usage − freed is under 167k, so no autocompact.
    assert_eq!(step, ChainStep::Ready);
    assert!(!report(&cx, "autocompact").fired);
}

#[test]
fn compact_context_collapse_commits_at_90_percent() {
    let mut config = CompactConfig::default();
    config.context_collapse.enabled = true;
    let mut convo = Convo::new().prompt("go");
    for _ in 0..42 {
        convo = convo.tool("Glob", 16_000);
    }
    let mut w = World::new(config);
    let mut cx = w.cx(convo.entries);
    Chain::new().run(&mut cx);
    let r = report(&cx, "context_collapse");
    assert!(r.fired && r.tokens_before >= 162_000 && r.tokens_after <= 135_000, "{r:?}");
    assert!(matches!(cx.entries[1].kind, EntryKind::Collapsed { .. }));
    assert_eq!(report(&cx, "autocompact").reason, "context collapse owns context pressure");
    assert!(cx.output.blocked.is_none());
}

#[test]
fn compact_blocking_limit_blocks_at_177000_when_autocompact_is_off() {
    let mut config = CompactConfig::default();
    config.autocompact.enabled = false;
    let mut w = World::new(config.clone());
    let mut cx = w.cx(at_usage(176_999));
    Chain::new().run(&mut cx);
    assert!(cx.output.blocked.is_none());
    let mut w = World::new(config);
    let mut cx = w.cx(at_usage(177_000));
    Chain::new().run(&mut cx);
    assert_eq!(cx.output.blocked.as_deref(), Some("Prompt is too long"));
    assert!(report(&cx, "blocking_limit").fired);
}

#[test]
fn compact_session_memory_compaction_keeps_whole_pairs_and_minimums() {
    let mut config = CompactConfig::default();
    config.session_memory.enabled = true;
    config.session_memory.compact_enabled = true;
    let mut convo = Convo::new().prompt("go");
    for i in 0..30 {
        convo = convo.tool("Bash", 6_000);
        if i % 3 == 0 {
            convo = convo.prompt("and then?");
        }
    }
    let convo = convo.answer("all done", 170_000);
    let mut w = World::new(config);
    w.fs.write("/s/session-memory/summary.md", "# Session Title\nFixing the parser\n# Current State\nTests pass.\n", &w.clock.clone()).unwrap();
    // Everything up to entry 20 was summarized by the last extraction.
    w.state.session_memory.last_summarized_uuid = Some(convo.entries[20].uuid);
    let mut cx = w.cx(convo.entries.clone());
    let step = Chain::new().run(&mut cx);
    assert_eq!(step, ChainStep::Ready, "session memory needs no model call");
    let r = report(&cx, "session_memory_compact");
    assert!(r.fired, "{r:?}");
    assert_eq!(cx.output.events, vec!["session_memory_compaction"]);
    let kept: Vec<&Entry> = cx.entries.iter().filter(|e| e.kind == EntryKind::Message).collect();
    let kept_tokens = ctxsim::agent::compact::counting::estimate_message_tokens(&kept.iter().map(|e| (*e).clone()).collect::<Vec<_>>());
    assert!((10_000..=48_000).contains(&kept_tokens), "{kept_tokens}");
    assert!(ctxsim::agent::compact::chain::orphans(&cx.entries).is_empty());
    assert!(matches!(cx.entries[0].kind, EntryKind::CompactBoundary { preserved: Some(_), .. }));
    let MessageContent::Text(summary) = &cx.entries[1].message().content else { panic!() };
    assert!(summary.contains("Fixing the parser"));
}

#[test]
fn compact_adjust_index_never_splits_a_tool_pair_or_thinking_fragments() {
    let mut convo = Convo::new().prompt("go").tool("Bash", 100);
    // Two fragments of one assistant message (thinking, then a tool_use), then the result.
    let e = convo.push(Message::assistant_blocks(vec![ContentBlock::thinking("hmm", "sig")]));
    e.message_id = Some("same".into());
    let e = convo.push(Message::assistant_blocks(vec![ContentBlock::tool_use("tx", "Read", json!({}))]));
    e.message_id = Some("same".into());
    convo.push(Message::user_blocks(vec![ContentBlock::tool_result("tx", ToolResultContent::Text("x".into()), None)]));
    let entries = convo.entries;
    let last = entries.len() - 1;
    let start = ctxsim::agent::compact::session_memory::adjust_for_invariants(&entries, last);
    assert_eq!(start, last - 2, "back to the first fragment");
}

#[test]
fn compact_post_compact_restores_files_and_skills_within_budgets() {
    let mut w = World::new(CompactConfig::default());
    let clock = w.clock.clone();
    let mut read_files = Vec::new();
    for i in 0..7 {
        w.fs.write(&format!("/r/f{i}.rs"), filler("f", 12_000), &clock).unwrap();
        read_files.push(ReadFile { path: format!("/r/f{i}.rs"), timestamp_ms: i });
    }
    w.fs.write("/r/big.rs", filler("b", 30_000), &clock).unwrap();
    read_files.push(ReadFile { path: "/r/big.rs".into(), timestamp_ms: 100 });
    let skills: Vec<InvokedSkill> =
        (0..7).map(|i| InvokedSkill { name: format!("s{i}"), path: None, content: filler("s", 24_000), invoked_at_ms: i }).collect();
    let mut cx = w.cx(at_usage(170_000));
    cx.inputs.read_files = read_files;
    cx.inputs.invoked_skills = skills;
    cx.inputs.deltas = vec![("deferred_tools_delta".into(), "New tools: X".into())];
    cx.inputs.hook_results = vec!["hook said hi".into()];
    let chain = Chain::new();
    let ChainStep::Compact(_) = chain.run(&mut cx) else { panic!() };
    chain.finish_compaction(&mut cx, CompactionReply::Summary("<summary>s</summary>".into()));
    let kinds: Vec<String> = cx
        .entries
        .iter()
        .map(|e| match &e.kind {
            EntryKind::Attachment { kind } => kind.to_string(),
            other => format!("{other:?}").split([' ', '{']).next().unwrap().to_owned(),
        })
        .collect();
    // Newest five: big.rs (a reference), f6..f3; then skills (each cut to 5k: 5 of 7 fit 25k), delta, hook.
    assert_eq!(
        kinds,
        vec!["CompactBoundary", "Summary", "compact_file_reference", "file", "file", "file", "file", "invoked_skills", "deferred_tools_delta", "hook_result"]
    );
    let MessageContent::Text(skills) = &cx.entries[7].message().content else { panic!() };
    assert_eq!(skills.matches("Skill \"").count(), 5);
    assert!(skills.contains("\"s6\"") && skills.contains("\"s2\"") && !skills.contains("\"s1\""));
    assert_eq!(skills.matches("[skill content truncated after compaction]").count(), 5);
}

#[test]
fn compact_recovery_ladder_reactive_once_then_surface() {
    let mut config = CompactConfig::default();
    config.autocompact.reactive_enabled = true;
    let mut w = World::new(config);
    let mut state = RecoveryState::default();
    let error = recovery::prompt_too_long_message(230_000, 200_000);
    assert_eq!(recovery::parse_prompt_too_long(&error), Some((230_000, 200_000)));
    assert_eq!(recovery::simulated_api_error(200_001, 200_000).as_deref(), Some("prompt is too long: 200001 tokens > 200000 maximum"));
    let entries = Convo::new().prompt("go").tool("Read", 900_000).entries;
    let mut cx = w.cx(entries);
    let chain = Chain::new();
    let RecoveryAction::ReactiveCompact(request) = recovery::on_prompt_too_long(&mut cx, &mut state, &error) else { panic!() };
    assert_eq!(request.lane, "compact");
    assert_eq!(chain.finish_compaction(&mut cx, CompactionReply::Summary("<summary>x</summary>".into())), ChainStep::Ready);
    assert!(report(&cx, "reactive_compact").fired);
    assert!(matches!(cx.entries[0].kind, EntryKind::CompactBoundary { .. }));
    let again = recovery::on_prompt_too_long(&mut cx, &mut state, &error);
    assert_eq!(again, RecoveryAction::Surface { error: error.clone() });
}

#[test]
fn compact_recovery_drains_collapse_first() {
    let mut config = CompactConfig::default();
    config.context_collapse.enabled = true;
    config.autocompact.reactive_enabled = true;
    let mut w = World::new(config);
    let mut convo = Convo::new().prompt("go");
    for _ in 0..10 {
        convo = convo.tool("Bash", 8_000);
    }
    let mut cx = w.cx(convo.entries);
    let mut state = RecoveryState::default();
    let action = recovery::on_prompt_too_long(&mut cx, &mut state, "prompt is too long: 1 tokens > 0 maximum");
    assert_eq!(action, RecoveryAction::CollapseDrainRetry { committed: 1 });
    let action = recovery::on_prompt_too_long(&mut cx, &mut state, "prompt is too long: 1 tokens > 0 maximum");
    assert!(matches!(action, RecoveryAction::ReactiveCompact(_)));
}

#[test]
fn compact_max_output_tokens_recovery_resumes_three_times() {
    let mut state = RecoveryState::default();
    for attempt in 1..=3 {
        assert!(matches!(recovery::on_max_output_tokens(3, &mut state), MaxOutputAction::Resume { attempt: a, .. } if a == attempt));
    }
    assert_eq!(recovery::on_max_output_tokens(3, &mut state), MaxOutputAction::Surface);
    state.next_turn();
    assert!(matches!(recovery::on_max_output_tokens(3, &mut state), MaxOutputAction::Resume { attempt: 1, .. }));
}

#[test]
fn compact_session_memory_extraction_triggers() {
    let mut config = CompactConfig::default();
    config.session_memory.enabled = true;
    let mut w = World::new(config);
    let mut cx = w.cx(Convo::new().prompt("go").tool("Bash", 20_000).entries);
    assert!(!ctxsim::agent::compact::session_memory::should_extract(&mut cx), "under 10k");
    let mut cx = w.cx(Convo::new().prompt("go").tool("Bash", 44_000).answer("done", 11_000).entries);
    assert!(ctxsim::agent::compact::session_memory::should_extract(&mut cx));
    let request = ctxsim::agent::compact::session_memory::extraction_request(&mut cx);
    assert_eq!(request.lane, "session_memory");
    ctxsim::agent::compact::session_memory::finish_extraction(&mut cx, "# Session Title\nx\n");
    assert_eq!(cx.fs.read("/s/session-memory/summary.md").unwrap(), "# Session Title\nx\n");
    assert!(cx.state.session_memory.last_summarized_uuid.is_some());
}

fn budget_replay_checker() -> impl FnMut(&ChainContext<'_>) {
    let mut replaced: BTreeMap<String, String> = BTreeMap::new();
    let mut shown_plain: BTreeSet<String> = BTreeSet::new();
    move |cx: &ChainContext<'_>| {
        for e in &cx.entries {
            for b in e.blocks() {
                let ContentBlock::ToolResult { tool_use_id: id, content: Some(ToolResultContent::Text(t)), .. } = b else { continue };
                if t.starts_with("<persisted-output>") {
                    assert!(!shown_plain.contains(id), "{id} was shown unreplaced, then replaced");
                    let first = replaced.entry(id.clone()).or_insert_with(|| String::clone(t));
                    assert_eq!(first, &**t, "replacement of {id} changed");
                } else if t != CLEARED_MARKER {
                    assert!(!replaced.contains_key(id), "{id} lost its replacement");
                    shown_plain.insert(id.clone());
                }
            }
        }
    }
}

fn all_stages_on() -> CompactConfig {
    let mut config = CompactConfig::default();
    config.tool_result_budget.aggregate_enabled = true;
    config.microcompact.time_based_enabled = true;
    config.session_memory.enabled = true;
    config.session_memory.compact_enabled = true;
    config
}

#[test]
fn compact_generated_long_session_runs_the_whole_chain() {
    assert_eq!(generate(7, 1_200).len(), 1_200);
    assert_eq!(generate(7, 1_200), generate(7, 1_200), "deterministic");
    // Debug builds are slow; the bench drives 1,000 requests.
    let rounds = generate(7, 200);
    let mut driver = Driver::new(all_stages_on(), LIMITS);
    let stats = driver.play(&rounds, &mut budget_replay_checker());
    assert_eq!(stats.requests, 200);
    assert!(stats.compactions >= 1, "{stats:?}");
    assert!(stats.fired.get("tool_result_budget").copied().unwrap_or(0) > 3, "{stats:?}");
    assert!(stats.fired.get("microcompact").copied().unwrap_or(0) > 0, "{stats:?}");
    let mut again = Driver::new(all_stages_on(), LIMITS);
    assert_eq!(again.play(&rounds, &mut |_| {}), stats);
    assert_eq!(again.entries, driver.entries);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3, ..ProptestConfig::default() })]

    /// The runner panics if a stage splits a tool pair or a shrinking stage grows the context;
    /// the checker asserts byte-identical replay of the tool result budget's decisions.
    #[test]
    fn compact_generated_sessions_keep_the_invariants(seed in 0u64..10_000, snip in any::<bool>(), collapse in any::<bool>()) {
        let mut config = all_stages_on();
        config.snip.enabled = snip;
        config.context_collapse.enabled = collapse;
        config.autocompact.reactive_enabled = collapse;
        let mut driver = Driver::new(config, LIMITS);
        let stats = driver.play(&generate(seed, 120), &mut budget_replay_checker());
        prop_assert_eq!(stats.requests, 120);
    }

    /// The tool result budget reading only what earlier runs did not settle decides, reports
    /// and rewrites as reading the whole conversation at every request does, through
    /// microcompact's clears, snips, collapses and compactions.
    #[test]
    fn compact_budget_reads_what_is_new_as_a_full_scan_would(seed in 0u64..10_000, snip in any::<bool>(), collapse in any::<bool>(), aggregate in any::<bool>()) {
        let mut config = all_stages_on();
        config.snip.enabled = snip;
        config.context_collapse.enabled = collapse;
        config.autocompact.reactive_enabled = collapse;
        config.tool_result_budget.aggregate_enabled = aggregate;
        config.tool_result_budget.aggregate_chars = 60_000;
        let rounds = generate(seed, 120);
        let mut outputs = [Vec::new(), Vec::new()];
        let mut drivers = [Driver::new(config.clone(), LIMITS), Driver::new(config, LIMITS)];
        drivers[1].rescan_budget = true;
        for (driver, seen) in drivers.iter_mut().zip(outputs.iter_mut()) {
            driver.play(&rounds, &mut |cx| seen.push((cx.output.reports.clone(), cx.output.events.clone(), cx.entries.clone())));
        }
        prop_assert!(outputs[0].iter().any(|(reports, _, _)| reports.iter().any(|r| r.name == "tool_result_budget" && r.fired)));
        prop_assert_eq!(&outputs[0], &outputs[1]);
        prop_assert_eq!(&drivers[0].state.replacements.seen_ids, &drivers[1].state.replacements.seen_ids);
        prop_assert_eq!(&drivers[0].state.replacements.replacements, &drivers[1].state.replacements.replacements);
    }
}

// ---- compaction under prompt-too-long: head truncation, tail peel ---------------------------

/// The refusals of a fork: each is the simulated API's text for `actual` tokens on a 200k window.
fn refusal(actual: u64) -> CompactionReply {
    CompactionReply::Refused(recovery::prompt_too_long_message(actual, 200_000))
}

/// Checks a fork input after a cut: not empty, user first, no tool pair split, and `removed` +
/// `kept` (less a marker) is the input in order.
fn check_cut(input: &[Entry], trimmed: &Trimmed, head: bool) {
    assert!(!trimmed.kept.is_empty() && !trimmed.removed.is_empty());
    let kept: Vec<&Entry> = trimmed.kept.iter().filter(|e| !(e.is_meta && matches!(&e.message().content, MessageContent::Text(t) if t == PTL_RETRY_MARKER))).collect();
    let joined: Vec<u64> = if head {
        trimmed.removed.iter().chain(kept.iter().copied()).map(|e| e.uuid).collect()
    } else {
        kept.iter().copied().chain(trimmed.removed.iter()).map(|e| e.uuid).collect()
    };
    assert_eq!(joined, input.iter().map(|e| e.uuid).collect::<Vec<_>>());
    assert!(!trimmed.kept[0].is_assistant(), "a cut history starts with a user message");
    assert!(orphans(&trimmed.kept).is_empty() && orphans(&trimmed.removed).is_empty(), "a cut separated a tool pair");
}

#[test]
fn compact_refused_fork_is_head_truncated_three_times_then_fails_with_the_breaker_counting() {
    let mut convo = Convo::new().prompt("start");
    for _ in 0..12 {
        convo = convo.tool("Bash", 4_000);
    }
    let mut w = World::new(CompactConfig::default());
    let mut cx = w.cx(convo.answer("ok", 175_000).prompt("next").entries);
    let chain = Chain::new();
    let ChainStep::Compact(first) = chain.run(&mut cx) else { panic!() };
    assert_eq!((first.ptl_attempt, first.trimmed_groups), (0, 0));
    // Each refusal 1,500 tokens over: one 1,000-token round does not cover it, two do.
    let mut dropped = 0;
    for attempt in 1..=3 {
        let ChainStep::Compact(next) = chain.finish_compaction(&mut cx, refusal(201_500)) else { panic!("attempt {attempt}") };
        assert_eq!(next.ptl_attempt, attempt);
        let MessageContent::Text(first) = &next.messages[0].content else { panic!() };
        assert_eq!(first, PTL_RETRY_MARKER);
        // Attempt 1 drops the preamble (the prompt) and two rounds; later ones two rounds each.
        dropped += if attempt == 1 { 3 } else { 2 };
        assert_eq!(next.trimmed_groups, dropped, "attempt {attempt}");
    }
    assert_eq!(chain.finish_compaction(&mut cx, refusal(200_100)), ChainStep::Ready);
    let reason = &report(&cx, "autocompact").reason;
    assert!(reason.starts_with("compaction failed (exhausted: The conversation is too long to summarize"), "{reason}");
    assert!(reason.ends_with("consecutive failures 1"), "{reason}");
    assert_eq!(cx.state.tracking.consecutive_failures, 1);
    let events = &cx.output.events;
    assert_eq!(events.iter().filter(|e| e.starts_with("truncation:compaction_ptl_retry:")).count(), 3, "{events:?}");
    assert!(events.contains(&"compaction_failed:exhausted".to_owned()), "{events:?}");
    assert!(!cx.output.compacted);
}

#[test]
fn compact_reactive_peels_the_newest_rounds_by_the_gap_and_drops_them_by_default() {
    let convo = Convo::new().prompt("go").tool("Bash", 8_000).tool("Bash", 8_000).tool("Bash", 40_000);
    for (mode, kept_results) in [(PeeledTail::Drop, 0), (PeeledTail::Keep, 1)] {
        let mut config = CompactConfig::default();
        config.autocompact.reactive_enabled = true;
        config.autocompact.reactive_peeled_tail = mode;
        let mut w = World::new(config);
        let mut cx = w.cx(convo.entries.clone());
        let mut state = RecoveryState::default();
        // 9,000 over: the 10,000-token last round covers it alone.
        let error = recovery::prompt_too_long_message(209_000, 200_000);
        let RecoveryAction::ReactiveCompact(request) = recovery::on_prompt_too_long(&mut cx, &mut state, &error) else { panic!() };
        let groups = group_by_api_round(&convo.entries);
        let last = rough_entries(&convo.entries[groups[3].clone()]);
        let before_last = rough_entries(&convo.entries[groups[2].clone()]);
        assert_eq!((request.trimmed_groups, request.trimmed_tokens), (1, last));
        // The fork ends before the oversized round: its tool_use is not in the summary request.
        let last_id = convo.entries[groups[3].start].tool_use_ids().next().unwrap().to_owned();
        assert!(!serde_json::to_string(&request.messages).unwrap().contains(&last_id));
        assert_eq!(cx.output.events, ["truncation:reactive_peel:1"]);
        let chain = Chain::new();
        // The first fork is still refused: peel again by the new gap.
        let ChainStep::Compact(next) = chain.finish_compaction(&mut cx, CompactionReply::Refused(recovery::prompt_too_long_message(200_500, 200_000))) else {
            panic!()
        };
        assert_eq!((next.ptl_attempt, next.trimmed_groups), (1, 2));
        assert_eq!(chain.finish_compaction(&mut cx, CompactionReply::Summary("<summary>s</summary>".into())), ChainStep::Ready);
        let r = report(&cx, "reactive_compact");
        assert!(r.fired);
        let fate = if mode == PeeledTail::Keep { "re-appended" } else { "dropped" };
        let peeled = format!("peeled the newest 2 API-round groups ({} rough tokens), {fate})", last + before_last);
        assert!(r.reason.starts_with("reactive compaction (summary after 1 retries; ") && r.reason.ends_with(&peeled), "{}", r.reason);
        let results = cx.entries.iter().filter(|e| e.tool_result_ids().next().is_some()).count();
        assert_eq!(results, kept_results * 2, "{mode:?}");
        assert!(orphans(&cx.entries).is_empty());
    }
}

#[test]
fn compact_reactive_fails_with_the_reference_reason_codes() {
    let mut config = CompactConfig::default();
    config.autocompact.reactive_enabled = true;
    let mut w = World::new(config);
    // One API round: nothing can be peeled.
    let mut cx = w.cx(Convo::new().prompt(&filler("Paste", 900_000)).entries);
    let error = recovery::prompt_too_long_message(230_000, 200_000);
    let action = recovery::on_prompt_too_long(&mut cx, &mut RecoveryState::default(), &error);
    assert_eq!(action, RecoveryAction::Surface { error: error.clone() });
    assert!(report(&cx, "reactive_compact").reason.starts_with("compaction failed (too_few_groups: "));
    // A media error with no media in the conversation.
    let mut cx = w.cx(Convo::new().prompt("go").tool("Bash", 100).entries);
    let media = "image exceeds 5 MB maximum: 6000000 bytes > 5242880 bytes";
    let action = recovery::on_media_too_large(&mut cx, &mut RecoveryState::default(), media);
    assert!(matches!(action, RecoveryAction::Surface { .. }));
    assert!(report(&cx, "reactive_compact").reason.starts_with("compaction failed (media_unstrippable: "));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Head truncation and tail peel never split a tool pair, never return an empty or
    /// assistant-first history, never remove every group, and only ever cut whole rounds.
    #[test]
    fn compact_ptl_cuts_keep_whole_rounds(sizes in proptest::collection::vec(1usize..20_000, 0..12), gap in proptest::option::of(0u64..60_000)) {
        let mut convo = Convo::new().prompt("start");
        for (i, size) in sizes.iter().enumerate() {
            convo = if i % 3 == 2 { convo.answer("ok", 0).prompt("more") } else { convo.tool("Bash", *size) };
        }
        let input = convo.entries;
        let groups = group_by_api_round(&input).len();
        let head = truncate_head(&input, gap, 99_999);
        let tail = peel_tail_for_ptl(&input, gap);
        prop_assert_eq!(head.is_some(), groups >= 2 && gap != Some(0));
        prop_assert_eq!(tail.is_some(), groups >= 2 && gap != Some(0));
        for (cut, is_head) in [(head, true), (tail, false)] {
            let Some(cut) = cut else { continue };
            check_cut(&input, &cut, is_head);
            prop_assert!(cut.groups >= 1 && cut.groups < groups);
            prop_assert_eq!(cut.groups, group_by_api_round(&cut.removed).len());
        }
    }
}

#[test]
fn compact_summary_instruction_has_the_reference_structure_and_size() {
    let plain = summary_instruction(None);
    // 2.1.88's is 5,581 characters in tests/conformance/compact.real-shapes.json.
    assert_eq!(plain.chars().count(), 5_534);
    assert!(plain.contains(SUMMARY_MARKER));
    let sections = ["Primary Request and Intent", "Key Technical Concepts", "Files and Code Sections", "Errors and fixes", "Problem Solving", "All user messages", "Pending Tasks", "Current Work", "Optional Next Step"];
    let mut at = 0;
    for (i, name) in sections.iter().enumerate() {
        let found = plain[at..].find(&format!("{}. {name}:", i + 1)).unwrap_or_else(|| panic!("section {name}"));
        at += found;
    }
    assert!(plain.find("<analysis>").unwrap() < plain.find("<summary>").unwrap());
    assert!(plain.starts_with("IMPORTANT: answer in plain text only") && plain.contains("\n\nREMINDER: no tool calls."));
    assert!(!plain.contains("Additional Instructions:"));
    let custom = summary_instruction(Some("Focus on the tests."));
    let (body, trailer) = custom.split_once("\n\nREMINDER").unwrap();
    assert!(body.ends_with("\n\nAdditional Instructions:\nFocus on the tests."), "{body}");
    assert!(trailer.starts_with(": no tool calls."));
}

#[test]
fn compact_threshold_keeping_the_newest_round_summarizes_before_it_and_keeps_it_verbatim() {
    // Claude Code 2.1.332's threshold compaction through the reactive path (docs/profiles.md):
    // the fork ends before the newest API round, which follows the summary unchanged; a file
    // that round read is not restored again, older ones are.
    let mut entries = Convo::new().prompt("look at both").tool("Read", 300).tool("Read", 200).entries;
    let last_round_start = entries.iter().rposition(|e| e.is_assistant()).unwrap();
    // The newest round reads new.py and reports the usage that crosses the threshold.
    let round = &mut entries[last_round_start];
    round.usage = Some(Usage { input_tokens: 170_000, ..Usage::default() });
    if let MessageContent::Blocks(blocks) = &mut round.message_mut().content
        && let Some(ContentBlock::ToolUse { input, .. }) = blocks.last_mut()
    {
        *input = json!({"file_path": "/p/new.py"});
    }
    let mut w = World::new(CompactConfig::default());
    w.fs.write("/p/old.py", "x = 1\n", &w.clock).unwrap();
    w.fs.write("/p/new.py", "y = 2\n", &w.clock).unwrap();
    let mut cx = w.cx(entries.clone());
    cx.inputs.threshold_keeps_rounds = 1;
    cx.inputs.read_files = vec![ReadFile { path: "/p/old.py".into(), timestamp_ms: 1 }, ReadFile { path: "/p/new.py".into(), timestamp_ms: 2 }];
    let kept_entries = entries.clone();
    let chain = Chain::new();
    let ChainStep::Compact(request) = chain.run(&mut cx) else { panic!("expected a compaction request") };
    // The fork: every message before the newest round, the instruction appended to its last
    // user message (the previous round's tool_result), the marker on the message before it.
    assert_eq!(request.messages.len(), last_round_start);
    let MessageContent::Blocks(last) = &request.messages.last().unwrap().content else { panic!() };
    assert!(matches!(&last[0], ContentBlock::ToolResult { .. }));
    assert!(matches!(last.last().unwrap(), ContentBlock::Text { text, .. } if text.contains(SUMMARY_MARKER)));
    assert_eq!(request.marker_index, Some(request.messages.len() - 2));
    assert_eq!(chain.finish_compaction(&mut cx, CompactionReply::Summary(synthetic_summary(200))), ChainStep::Ready);
    // Boundary, summary (saying what follows), the kept round as it was, then old.py only.
    assert_eq!(cx.entries[1].kind, EntryKind::Summary);
    let MessageContent::Text(summary) = &cx.entries[1].message().content else { panic!() };
    assert!(summary.contains(ctxsim::agent::compact::rebuild::PRESERVED_NOTE));
    let kept: Vec<_> = kept_entries[last_round_start..].iter().map(|e| e.message().clone()).collect();
    assert_eq!(cx.entries[2..2 + kept.len()].iter().map(|e| e.message().clone()).collect::<Vec<_>>(), kept);
    let restored: Vec<String> = cx.entries[2 + kept.len()..].iter().map(|e| serde_json::to_string(e.message()).unwrap()).collect();
    assert_eq!(restored.len(), 1, "{restored:?}");
    assert!(restored[0].contains("/p/old.py"));
    assert!(report(&cx, "autocompact").reason.contains("kept the newest 1 API round(s) verbatim"), "{:?}", report(&cx, "autocompact"));

    // Without the setting (2.1.88), or with nothing before the round to summarize, nothing is kept.
    for (entries, rounds) in [(entries.clone(), 0), (Convo::new().answer("hi", 170_000).entries, 1)] {
        let mut w = World::new(CompactConfig::default());
        let mut cx = w.cx(entries.clone());
        cx.inputs.threshold_keeps_rounds = rounds;
        let ChainStep::Compact(request) = chain.run(&mut cx) else { panic!() };
        assert_eq!(request.messages.len(), entries.len() + usize::from(entries.last().unwrap().is_assistant()));
        chain.finish_compaction(&mut cx, CompactionReply::Summary(synthetic_summary(200)));
        assert!(cx.entries.iter().all(|e| !e.is_assistant()));
    }
}
