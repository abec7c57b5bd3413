//! The break rules of the replay (src/replay/profile.rs, turns.rs; docs/fidelity.md "Break
//! rules") on the real sessions whose record decides them: each test names the calls a rule
//! decides and fails when the rule is dropped.

use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::replay::{CallComparison, ReplayOptions, SessionReplay, fidelity_for_session, load_session};

use crate::support::{realdata, replay_session};

fn replay_path(path: &std::path::Path) -> (SessionReplay, Vec<CallComparison>) {
    let session = load_session(path).unwrap();
    let table = ModelTable::shipped();
    let mut measurer = Measurer::new(table.clone(), TokenCounter::new(EstimatorKind::Calibrated));
    let replay = replay_session(&session, &mut measurer, &ReplayOptions::default());
    let calls = fidelity_for_session(&replay, &table, true).calls;
    (replay, calls)
}

fn replay(transcript: &str) -> (SessionReplay, Vec<CallComparison>) {
    replay_path(&realdata().join("transcripts").join(transcript))
}

/// Checks that call `index` agrees with the record on hit and rewrite, has every event of
/// `with` and none of `without`; returns it.
fn check<'a>(calls: &'a [CallComparison], index: usize, with: &[&str], without: &[&str]) -> &'a CallComparison {
    let call = calls.iter().find(|c| c.index == index).unwrap_or_else(|| panic!("no compared call #{index}"));
    let summary = format!(
        "#{index}: recorded read {} creation {}, simulated read {:.0} creation {:.0}, events {:?}",
        call.recorded_cache_read, call.recorded_cache_creation, call.simulated_cache_read, call.simulated_cache_creation, call.events
    );
    assert!(call.hit_agrees, "{summary}");
    for event in with {
        assert!(call.events.iter().any(|e| e == event), "no {event}: {summary}");
    }
    for event in without {
        assert!(!call.events.iter().any(|e| e == event), "{event}: {summary}");
    }
    call
}

const E89F: &str = "cipher-box/e89fb6a2d646-0.full.jsonl";
const D847: &str = "oh-my-posh/d84718082c10-3.full.jsonl";

#[test]
fn typed_prompts_in_bypass_permissions_mode_are_not_rerendered() {
    // e89f (2.1.39, bypassPermissions): 25 typed prompts, none re-rendered at the next turn; the
    // rule of 2.1.37-2.1.39 would break each of these eight.
    let (_, calls) = replay(E89F);
    for index in [17, 35, 44, 58, 85, 96, 202, 217] {
        check(&calls, index, &["new_user_turn", "side_entry"], &["rerendered_prompt"]);
    }
}

#[test]
fn skill_calls_from_2_1_200_rerender_nothing() {
    // eea3 (2.1.205): both Skill calls are followed by a full read.
    let (_, calls) = replay("oh-my-posh/eea3a34195eb-0.full.jsonl");
    for index in [35, 91] {
        check(&calls, index, &[], &["skill"]);
    }
}

#[test]
fn tool_search_loads_from_2_1_200_keep_the_cache() {
    for (transcript, indices) in [
        ("entirecontext/01M0EE5721NRN8FGE1238MD50T-0.full.jsonl", &[10][..]),
        ("entirecontext/01M0FWRPX72AX3CYC2HMV1W2SN-1.full.jsonl", &[65][..]),
        ("oh-my-posh/6d449f3da816-0.full.jsonl", &[1, 25, 71][..]),
        ("oh-my-posh/0254bffa0c17-1.full.jsonl", &[602][..]),
    ] {
        let (_, calls) = replay(transcript);
        for &index in indices {
            check(&calls, index, &[], &["tool_search_load"]);
        }
    }
}

#[test]
fn a_tool_hook_context_keeps_the_next_prompt_off_the_side_entry_until_2_1_231() {
    // 0254 (2.1.219): the six turns after a PostToolUse hook added context read only the prefix
    // level (37,991-38,231) though the stop hooks ran; the six without one read the side entry.
    let (_, calls) = replay("oh-my-posh/0254bffa0c17-1.full.jsonl");
    for index in [117, 241, 374, 461, 512, 576] {
        let call = check(&calls, index, &["turn_rerender", "tool_hook_context"], &["side_entry"]);
        assert!(call.recorded_cache_read < 40_000 && call.simulated_cache_read < 40_000.0, "#{index}: {}", call.simulated_cache_read);
    }
    for index in [250, 303, 311, 530, 538, 584] {
        check(&calls, index, &["side_entry"], &["tool_hook_context"]);
    }
    // 2.1.232 keeps it: entirecontext 01M0FWRP #86 follows a PostToolUse:Edit context.
    let (_, calls) = replay("entirecontext/01M0FWRPX72AX3CYC2HMV1W2SN-1.full.jsonl");
    check(&calls, 86, &["side_entry"], &["tool_hook_context"]);
}

#[test]
fn a_prompt_delivering_an_item_queued_before_a_compaction_reads_only_the_prefix() {
    // spotter #153 (2.1.39): the notification of task bd0afab, queued at 20:52:10 and delivered
    // at 21:36:41 after the compaction at 21:18:41, read 21,460 (the prefix level) and wrote
    // 55,541; af1d #217 (2.1.49): bf7a97f's, queued at 23:05:31 before the compaction at
    // 23:10:45, read 35,707 and wrote 100,078. Both followed a finished turn's side request.
    for (transcript, index) in [("spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl", 153), ("cipher-box/af1dd25ebb3e-8.full.jsonl", 217)] {
        let (_, calls) = replay(transcript);
        let call = check(&calls, index, &["new_user_turn", "queued_across_compaction"], &["side_entry"]);
        assert!(call.recorded_cache_creation > 50_000 && call.simulated_cache_creation > 50_000.0, "#{index}: {}", call.simulated_cache_creation);
        assert_eq!(call.rule.as_deref(), Some("queued_across_compaction"), "#{index}");
    }
    // Once per compaction: af1d's next item queued before it (b682623) read everything (#218,
    // what #217 cached: a turn a notification opened leaves no side entry before 2.1.170); e89f's
    // notification queued 12 s after its compaction read everything (#174).
    let (_, calls) = replay("cipher-box/af1dd25ebb3e-8.full.jsonl");
    let call = check(&calls, 218, &["new_user_turn"], &["queued_across_compaction", "turn_rerender"]);
    assert!(call.simulated_cache_read > 100_000.0, "#218: {}", call.simulated_cache_read);
    let (_, calls) = replay(E89F);
    check(&calls, 174, &["new_user_turn", "side_entry"], &["queued_across_compaction"]);
}

#[test]
fn claude_desktop_reads_its_static_prefix_after_a_gap_beyond_the_ttl_and_the_cli_does_not() {
    // Claude Desktop (2.1.215, 2.1.219): every gap beyond the 1h TTL still read the static prefix
    // (0254 #72 after 7.6 h, #404 after 61 min, #541 after 69 min: 33,510; d847 #54 after 82 min:
    // 32,436), which other clients keep warm.
    for (transcript, indices) in [("oh-my-posh/0254bffa0c17-1.full.jsonl", &[72, 404, 541][..]), (D847, &[54][..])] {
        let (_, calls) = replay(transcript);
        for &index in indices {
            let call = check(&calls, index, &["ttl_expired", "shared_prefix"], &[]);
            assert!((30_000..40_000).contains(&call.recorded_cache_read), "#{index}: {}", call.recorded_cache_read);
            assert!((30_000.0..40_000.0).contains(&call.simulated_cache_read), "#{index}: {}", call.simulated_cache_read);
            assert_eq!(call.rule.as_deref(), Some("shared_prefix"), "#{index}");
        }
    }
    // The CLI (2.1.232): its gaps beyond the TTL read nothing, in the record and the replay.
    let (_, calls) = replay("entirecontext/01M0EE5721NRN8FGE1238MD50T-0.full.jsonl");
    for index in [7, 90] {
        let call = check(&calls, index, &["ttl_expired"], &["shared_prefix"]);
        assert_eq!((call.recorded_cache_read, call.simulated_cache_read), (0, 0.0), "#{index}");
    }
}

#[test]
fn a_side_entry_is_sent_when_the_stop_hooks_ran_not_when_the_process_resumed() {
    // NumWordify #6 (2.1.227) resumes 2 h 56 min after the turn ended: the side entry dates
    // from the stop summary, long expired, and the call reads nothing.
    let (_, calls) = replay("NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl");
    let call = check(&calls, 6, &["resume", "ttl_expired"], &[]);
    assert_eq!(call.simulated_cache_read, 0.0);
}

#[test]
fn a_model_command_that_keeps_the_model_is_no_break() {
    // entirecontext 01M0FWRP #12: `/model` answered "Kept model as Opus 4.6 (1M context)"; the
    // next call read everything the previous one cached (the only /model in the data).
    let (_, calls) = replay("entirecontext/01M0FWRPX72AX3CYC2HMV1W2SN-1.full.jsonl");
    let call = check(&calls, 12, &["new_user_turn"], &["model_switch"]);
    assert_eq!(call.recorded_cache_read, 105_731);
}

/// `fidelity` (through the agent, the one engine).
fn fidelity_cli(args: &[&str]) -> (String, i32) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim")).arg("fidelity").args(args).output().unwrap();
    (String::from_utf8(out.stdout).unwrap(), out.status.code().unwrap_or(-1))
}

#[test]
fn fidelity_names_the_calls_that_rest_on_a_rule_and_their_share() {
    let path = realdata().join("transcripts").join(D847);
    let (json, code) = fidelity_cli(&[path.to_str().unwrap(), "--format", "json"]);
    assert_eq!(code, 0);
    let report: ctxsim::replay::FidelityReport = serde_json::from_str(&json).unwrap();
    // Without --interval, no range.
    assert!(report.interval.is_none());
    let calls = &report.modelled.calls;
    assert!(calls["turn_rerender"].contains(&63) && calls["turn_rerender"].contains(&211), "{calls:?}");
    assert!(calls["side_entry"].contains(&12), "{calls:?}");
    // Past the TTL, Claude Desktop's read of its static prefix rests on a rule (#54 after
    // 82 min, #232 past a 5m TTL); the record alone would say nothing is read.
    assert_eq!(calls["shared_prefix"], vec![54, 232], "{calls:?}");
    assert!((0.2..0.9).contains(&report.modelled.creation_share), "{}", report.modelled.creation_share);
    // The same list, call by call.
    let (json, _) = fidelity_cli(&[path.to_str().unwrap(), "--format", "json", "--calls"]);
    let report: ctxsim::replay::FidelityReport = serde_json::from_str(&json).unwrap();
    let by_call: usize = report.calls.iter().filter(|c| c.rule.is_some()).count();
    assert_eq!(by_call, report.modelled.count());
    // The table prints the section.
    let (table, _) = fidelity_cli(&[path.to_str().unwrap()]);
    assert!(table.contains("rests on a modelled rule") && table.contains("turn_rerender: #63"), "{table}");
}

#[test]
fn the_interval_holds_the_agents_figures_and_is_wider_where_more_rests_on_rules() {
    let interval = |transcript: &str| {
        let path = realdata().join("transcripts").join(transcript);
        let (json, code) = fidelity_cli(&[path.to_str().unwrap(), "--format", "json", "--interval"]);
        assert_eq!(code, 0);
        let report: ctxsim::replay::FidelityReport = serde_json::from_str(&json).unwrap();
        let i = report.interval.expect("--interval fills it");
        assert!(i.creation_low <= report.simulated_cache_creation && report.simulated_cache_creation <= i.creation_high, "{i:?}");
        assert!(i.cost_low_usd <= report.simulated_cost_usd && report.simulated_cost_usd <= i.cost_high_usd, "{i:?}");
        (i.creation_high - i.creation_low) / report.simulated_cache_creation
    };
    // d847 rests on rules for three quarters of its creation, 7662 for little of it.
    let wide = interval(D847);
    let narrow = interval("entireio-cli/7662d755ef9f-2.full.jsonl");
    assert!(wide > 0.3 && narrow < wide / 2.0, "{wide} {narrow}");
}
