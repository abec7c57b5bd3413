//! The cache simulator against every worked example and rule of the provider documentation.

use ctxsim::api::{CacheControl, CacheTtl, Message, Request};
use ctxsim::measure::{EstimatorKind, MeasureInput, Measurer, ModelTable, TokenCounter};
use proptest::prelude::*;

use crate::support::*;

const MIN: u64 = 5 * 60 * 1000;

#[test]
fn lookback_example_from_the_documentation() {
    // T1: 10 blocks, breakpoint at 10 → write at 10.
    // T2: 15 blocks, breakpoint at 15 → read at 10, write at 15.
    // T3: 35 blocks, breakpoint at 35 → checks 35..16, misses the entry at 15.
    let rows = measure_all(&[
        (0, blocks_request(10, 200, Some((10, None)))),
        (1000, blocks_request(15, 200, Some((15, None)))),
        (2000, blocks_request(35, 200, Some((35, None)))),
    ]);
    assert_eq!(split(&rows[0]), (0, 2000, 0));
    assert_eq!(split(&rows[1]), (2000, 1000, 0));
    assert_eq!(split(&rows[2]), (0, 7000, 0));
    assert_eq!(rows[1].prefix.read_at.as_deref(), Some("messages[0].content[9]"));
    assert!(rows[2].cache_break);
    assert_eq!(rows[2].prefix.cause.as_deref(), Some("lookback_exceeded"));
}

#[test]
fn a_second_breakpoint_rescues_the_lookback() {
    // With an extra breakpoint at 16 the walk from 16 finds the entry at 15.
    let mut t3 = blocks_request(35, 200, Some((35, None)));
    mark(&mut t3, 16, None);
    let rows = measure_all(&[(0, blocks_request(15, 200, Some((15, None)))), (1000, t3)]);
    assert_eq!(split(&rows[1]), (3000, 4000, 0));
}

#[test]
fn input_tokens_are_only_what_follows_the_last_breakpoint() {
    let rows = measure_all(&[(0, blocks_request(10, 200, Some((6, None))))]);
    assert_eq!(split(&rows[0]), (0, 1200, 800));
    assert_eq!(rows[0].context_tokens, 2000);
}

#[test]
fn ttl_expires_after_five_minutes_and_is_refreshed_on_hit() {
    let r = blocks_request(10, 200, Some((10, None)));
    // 4 minutes later: hit, refreshed; 8 minutes after the first (4 after the refresh): hit.
    let rows = measure_all(&[(0, r.clone()), (4 * 60_000, r.clone()), (8 * 60_000, r.clone()), (8 * 60_000 + MIN, r)]);
    assert_eq!(split(&rows[1]), (2000, 0, 0));
    assert_eq!(split(&rows[2]), (2000, 0, 0));
    // Exactly five minutes after the last hit the entry is gone.
    assert_eq!(split(&rows[3]), (0, 2000, 0));
    assert_eq!(rows[3].prefix.cause.as_deref(), Some("ttl_expired"));
}

#[test]
fn one_hour_ttl_survives_a_ten_minute_gap() {
    let r = blocks_request(10, 200, Some((10, Some(CacheTtl::OneHour))));
    let rows = measure_all(&[(0, r.clone()), (10 * 60_000, r.clone()), (10 * 60_000 + 3_600_000, r)]);
    assert_eq!(rows[0].cache_creation.ephemeral_1h_input_tokens, 2000);
    assert_eq!(split(&rows[1]), (2000, 0, 0));
    assert_eq!(split(&rows[2]), (0, 2000, 0));
}

#[test]
fn minimum_cacheable_length_per_model() {
    // 1,000 tokens: below Sonnet 4.5's 1,024 → nothing cached, no error.
    let rows = measure_all(&[(0, blocks_request(5, 200, Some((5, None)))), (1000, blocks_request(5, 200, Some((5, None))))]);
    assert_eq!(split(&rows[1]), (0, 0, 1000));
    // 2,000 tokens on Haiku 4.5 (4,096) is not cached either; on Opus 4.7 (2,048) neither;
    // 2,100 on Opus 4.7 is.
    for (model, blocks, cached) in [("claude-haiku-4-5", 10, false), ("claude-opus-4-7", 10, false), ("claude-opus-4-7", 21, true), ("claude-opus-5", 3, true)] {
        let mut r = blocks_request(blocks, 200, Some((blocks, None)));
        r.model = model.to_owned();
        let rows = measure_all(&[(0, r)]);
        assert_eq!(rows[0].cache_creation_input_tokens > 0, cached, "{model} with {blocks} blocks");
    }
}

#[test]
fn mixed_ttl_billing_positions() {
    // 1h breakpoint at 5 (1000 tokens... below minimum, so use 300-token blocks), 5m at 10.
    let mut r = blocks_request(10, 300, Some((5, Some(CacheTtl::OneHour))));
    mark(&mut r, 10, None);
    let rows = measure_all(&[(0, r.clone()), (1000, r)]);
    // A = 0, B = 1500 (1h), C = 3000: 1h write 1500, 5m write 1500.
    assert_eq!(rows[0].cache_creation.ephemeral_1h_input_tokens, 1500);
    assert_eq!(rows[0].cache_creation.ephemeral_5m_input_tokens, 1500);
    assert_eq!(split(&rows[1]), (3000, 0, 0));
}

#[test]
fn mixed_ttl_after_the_five_minute_entry_expired() {
    let mut r = blocks_request(10, 300, Some((5, Some(CacheTtl::OneHour))));
    mark(&mut r, 10, None);
    let rows = measure_all(&[(0, r.clone()), (10 * 60_000, r)]);
    // The 1h entry at 5 is read (A = 1500); B = A; the 5m part is written again.
    assert_eq!(split(&rows[1]), (1500, 1500, 0));
    assert_eq!(rows[1].cache_creation.ephemeral_5m_input_tokens, 1500);
}

#[test]
fn one_hour_after_five_minutes_is_an_error() {
    let mut r = blocks_request(10, 300, Some((5, None)));
    mark(&mut r, 10, Some(CacheTtl::OneHour));
    let rows = measure_all(&[(0, r)]);
    assert!(rows[0].error.as_deref().unwrap().contains("1h entries must come first"), "{:?}", rows[0].error);
}

#[test]
fn a_fifth_breakpoint_is_an_error() {
    let mut r = blocks_request(10, 300, None);
    for p in [2, 4, 6, 8, 10] {
        mark(&mut r, p, None);
    }
    let rows = measure_all(&[(0, r)]);
    assert_eq!(rows[0].error.as_deref(), Some("A maximum of 4 blocks with cache_control may be provided. Found 5."));
}

#[test]
fn model_change_uses_another_namespace() {
    let r = blocks_request(10, 200, Some((10, None)));
    let mut other = r.clone();
    other.model = "claude-sonnet-4-6".to_owned();
    let rows = measure_all(&[(0, r.clone()), (1000, other), (2000, r)]);
    assert_eq!(split(&rows[1]), (0, 2000, 0));
    assert_eq!(rows[1].prefix.cause.as_deref(), Some("model_changed"));
    assert_eq!(split(&rows[2]), (2000, 0, 0));
}

fn layered(tools: &[&str], system: &str, user: &[&str]) -> Request {
    let mut r = Request::new(MODEL, 1024);
    r.tools = Some(tools.iter().map(|t| tool(t, 300)).collect());
    r.system = Some(ctxsim::api::SystemPrompt::Blocks(vec![
        crate::support::system(&text_of(system, 600)).with_cache_control(Some(CacheControl::ephemeral())),
    ].into()));
    let mut blocks: Vec<_> = user.iter().map(|u| ctxsim::api::ContentBlock::text(text_of(u, 300))).collect();
    blocks.last_mut().unwrap().set_cache_control(Some(CacheControl::ephemeral()));
    r.messages.push(Message::user_blocks(blocks));
    r
}

#[test]
fn a_change_invalidates_its_level_and_everything_after() {
    let base = layered(&["a", "b"], "sys", &["u1", "u2"]);
    let tools_changed = layered(&["a", "c"], "sys", &["u1", "u2"]);
    let system_changed = layered(&["a", "b"], "sys2", &["u1", "u2"]);
    let messages_changed = layered(&["a", "b"], "sys", &["u1", "u3"]);
    let rows = measure_all(&[(0, base.clone()), (1, messages_changed), (2, system_changed), (3, base.clone()), (4, tools_changed)]);
    let system_prefix = rows[0].cache_creation_input_tokens - 600; // tools + system
    // Messages changed: the system breakpoint's entry is read.
    assert_eq!(rows[1].cache_read_input_tokens, system_prefix);
    assert_eq!(rows[1].prefix.diverged_at.as_deref(), Some("messages[0].content[1]"));
    // System changed: nothing before it is a breakpoint, so nothing is read.
    assert_eq!(rows[2].cache_read_input_tokens, 0);
    assert_eq!(rows[2].prefix.diverged_at.as_deref(), Some("system[0]"));
    assert_eq!(rows[2].prefix.cause.as_deref(), Some("unexplained_system"));
    assert_eq!(rows[3].cache_read_input_tokens, rows[0].cache_creation_input_tokens);
    assert_eq!(rows[4].cache_read_input_tokens, 0);
    assert_eq!(rows[4].prefix.diverged_at.as_deref(), Some("tools[1]"));
}

#[test]
fn automatic_caching_marks_the_last_block() {
    let mut r = blocks_request(10, 200, None);
    r.cache_control = Some(CacheControl::ephemeral());
    let mut longer = blocks_request(12, 200, None);
    longer.cache_control = Some(CacheControl::ephemeral());
    let rows = measure_all(&[(0, r), (1000, longer)]);
    assert_eq!(split(&rows[0]), (0, 2000, 0));
    assert_eq!(split(&rows[1]), (2000, 400, 0));
}

#[test]
fn automatic_caching_with_a_conflicting_explicit_ttl_is_an_error() {
    let mut r = blocks_request(10, 200, Some((10, Some(CacheTtl::OneHour))));
    r.cache_control = Some(CacheControl::ephemeral());
    assert!(measure_all(&[(0, r)])[0].error.is_some());
}

#[test]
fn entries_are_readable_only_after_the_first_token() {
    let r = blocks_request(10, 200, Some((10, None)));
    let mut m = measurer();
    let mut first = MeasureInput::new("main", 0, &r);
    first.first_token_ms = 2_000;
    m.measure(first).unwrap();
    let parallel = m.measure(MeasureInput::new("side", 1_000, &r)).unwrap();
    assert_eq!(split(&parallel), (0, 2000, 0));
    let later = m.measure(MeasureInput::new("main", 3_000, &r)).unwrap();
    assert_eq!(split(&later), (2000, 0, 0));
}

#[test]
fn the_ttl_counts_from_the_first_token() {
    // Written at 0 with the first token at 20 s: still readable 5 minutes after the first
    // token, not after the start.
    let r = blocks_request(10, 200, Some((10, None)));
    let mut m = measurer();
    let mut first = MeasureInput::new("main", 0, &r);
    first.first_token_ms = 20_000;
    m.measure(first).unwrap();
    let inside = m.measure(MeasureInput::new("main", 310_000, &r)).unwrap();
    assert_eq!(split(&inside), (2000, 0, 0));
    let after = m.measure(MeasureInput::new("main", 310_000 + 300_000, &r)).unwrap();
    assert_eq!(split(&after), (0, 2000, 0));
}

#[test]
fn a_string_last_message_reads_as_its_block_form() {
    // The real client flips the last user message from a marked text block to a plain string.
    let mut first = Request::new(MODEL, 1024);
    let mut block = ctxsim::api::ContentBlock::text(text_of("q", 1500));
    block.set_cache_control(Some(CacheControl::ephemeral()));
    first.messages.push(Message::user_blocks(vec![block]));
    let mut second = Request::new(MODEL, 1024);
    second.messages.push(Message::user_text(text_of("q", 1500)));
    let mut answer = ctxsim::api::ContentBlock::text("ok");
    answer.set_cache_control(Some(CacheControl::ephemeral()));
    second.messages.push(Message::assistant_blocks(vec![answer]));
    let rows = measure_all(&[(0, first), (1, second)]);
    assert_eq!(rows[1].cache_read_input_tokens, 1500);
    assert_eq!(rows[1].prefix.diverged_at, None);
}

fn growing_session(turns: &[(u64, usize)]) -> Vec<(u64, Request)> {
    // Each step appends `blocks` blocks after `gap` ms; the marker is on the last block.
    let mut all: Vec<ctxsim::api::ContentBlock> = Vec::new();
    let mut out = Vec::new();
    let mut t = 0;
    for (step, &(gap, n)) in turns.iter().enumerate() {
        t += gap;
        for j in 0..n {
            all.push(ctxsim::api::ContentBlock::text(text_of(&format!("s{step}b{j}"), 150 + (step * 7 + j * 13) % 200)));
        }
        let mut blocks = all.clone();
        blocks.last_mut().unwrap().set_cache_control(Some(CacheControl::ephemeral()));
        let mut r = Request::new(MODEL, 1024);
        r.messages.push(Message::user_blocks(blocks));
        out.push((t, r));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Append-only inside the TTL with the marker on the last block: every request reads
    /// exactly what the previous one cached.
    #[test]
    fn append_only_reads_the_previous_cached_prefix(turns in prop::collection::vec((0u64..290_000, 1usize..19), 2..30)) {
        let rows = measure_all(&growing_session(&turns));
        for pair in rows.windows(2) {
            let cached = pair[0].cache_read_input_tokens + pair[0].cache_creation_input_tokens;
            prop_assert_eq!(pair[1].cache_read_input_tokens, cached);
            prop_assert!(!pair[1].cache_break);
            prop_assert_eq!(pair[1].prefix.diverged_at.clone(), None);
        }
    }

    /// Same inputs, same metrics, byte for byte.
    #[test]
    fn measurement_is_deterministic(turns in prop::collection::vec((0u64..900_000, 1usize..25), 1..20)) {
        let session = growing_session(&turns);
        let a = serde_json::to_string(&measure_all(&session)).unwrap();
        let b = serde_json::to_string(&measure_all(&session)).unwrap();
        prop_assert_eq!(a, b);
    }
}

#[test]
fn every_estimator_counts_a_real_request() {
    for kind in EstimatorKind::ALL {
        let mut m = Measurer::new(ModelTable::shipped(), TokenCounter::new(kind));
        let r = layered(&["a"], "sys", &["hello"]);
        let row = m.measure(MeasureInput::new("main", 0, &r)).unwrap();
        assert!(row.context_tokens > 100, "{kind:?}: {}", row.context_tokens);
    }
}

#[test]
fn the_measurer_flattens_as_a_fresh_flattening_does() {
    // The measurer's memoized counts must give what a fresh counter gives for every request.
    let session = ctxsim::synth::growing_session(3, 60, 20_000, MODEL);
    let mut m = measurer();
    for entry in &session {
        let reused = m.flatten(&entry.body).unwrap();
        let fresh = ctxsim::measure::flatten(&entry.body, &mut TokenCounter::new(EstimatorKind::Chars4), "sonnet");
        assert_eq!(reused, fresh);
        m.measure_flat(MeasureInput::new("main", entry.time_ms, &entry.body), reused).unwrap();
    }
}

/// Cached microcompact: a `cache_edits` block deletes a tool result by `cache_reference`
/// without breaking the prefix; from the next request on its tokens stop counting.
#[test]
fn cache_edits_delete_a_referenced_tool_result_without_breaking_the_prefix() {
    let big = text_of("result", 3000);
    let body = |edits: bool, reference: bool, tail: usize| -> Request {
        let mut result = serde_json::json!({"type": "tool_result", "tool_use_id": "toolu_a", "content": big});
        if reference {
            result["cache_reference"] = serde_json::json!("toolu_a");
        }
        let mut last = vec![serde_json::json!({"type": "text", "text": text_of("ask", 1200)})];
        if edits {
            last.insert(0, serde_json::json!({"type": "cache_edits", "edits": [{"type": "delete", "cache_reference": "toolu_a"}]}));
        }
        let mut messages = vec![
            serde_json::json!({"role": "user", "content": [{"type": "text", "text": text_of("prompt", 1200)}]}),
            serde_json::json!({"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "Read", "input": {}}]}),
            serde_json::json!({"role": "user", "content": [result]}),
            serde_json::json!({"role": "assistant", "content": [{"type": "text", "text": "ok"}]}),
            serde_json::json!({"role": "user", "content": last}),
        ];
        for i in 0..tail {
            messages.push(serde_json::json!({"role": "assistant", "content": [{"type": "text", "text": format!("reply {i}")}]}));
            messages.push(serde_json::json!({"role": "user", "content": [{"type": "text", "text": format!("more {i}")}]}));
        }
        let n = messages.len();
        let content = messages[n - 1]["content"].as_array_mut().unwrap();
        let at = content.len() - 1;
        content[at]["cache_control"] = serde_json::json!({"type": "ephemeral"});
        serde_json::from_value(serde_json::json!({"model": MODEL, "max_tokens": 1024, "messages": messages})).unwrap()
    };
    // Request 1 caches the prompt and the result; request 2 adds the edit (result referenced);
    // request 3 repeats the pinned edit and goes one turn further.
    let mut before = body(false, false, 0);
    // Request 1 ends at the result's message: drop the last two messages.
    before.messages.truncate(3);
    mark(&mut before, 3, None);
    let rows = measure_all(&[(0, before), (1000, body(true, true, 0)), (2000, body(true, true, 1))]);
    assert!(rows[1].cache_read_input_tokens >= 4200, "the edit request reads the cached prefix: {:?}", split(&rows[1]));
    assert!(!rows[1].cache_break && !rows[2].cache_break);
    // The deleted result (3,000 tokens) no longer counts: not read, not written, not in context.
    assert!(rows[2].context_tokens + 2900 < rows[1].context_tokens + 20, "{} vs {}", rows[2].context_tokens, rows[1].context_tokens);
    assert!(rows[2].cache_read_input_tokens > 0);
    assert!(rows[2].cache_read_input_tokens + 2900 < rows[1].cache_read_input_tokens + rows[1].cache_creation_input_tokens);
}

/// A tool_result the agent keeps in its wire form (`ContentBlock::Other`, for the reference's
/// key order) counts like the typed block: by its content, without its `cache_control`, and
/// the same whichever form the memo sees first.
#[test]
fn wire_form_tool_results_count_by_content() {
    use ctxsim::api::ContentBlock;
    use ctxsim::measure::blocks::content_token_units;
    let wire = serde_json::json!({
        "tool_use_id": "toolu_1", "type": "tool_result",
        "content": "     1\tfn main() {}\n", "cache_control": {"type": "ephemeral"}
    });
    let typed = ContentBlock::from_value(wire.clone()).unwrap();
    assert!(matches!(typed, ContentBlock::ToolResult { .. }));
    let other = ContentBlock::Other(wire);
    assert_eq!(content_token_units(&other), content_token_units(&typed));
    let mut counter = TokenCounter::new(EstimatorKind::Chars4);
    let units = content_token_units(&other);
    assert_eq!(units.len(), 1);
    assert_eq!(counter.count(1, "claude", || units), 5, "\"     1\\tfn main() {{}}\\n\" is 19 UTF-16 units");
}
