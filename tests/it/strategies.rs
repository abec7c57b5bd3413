//! Presets, knob listing, `--set`.
use ctxsim::agent::compact::peers::PeerStrategy;
use ctxsim::strategy::Strategy;
use ctxsim::strategy::presets::{PRESETS, find, knob_table};

#[test]
fn every_preset_builds_under_its_id_and_aliases() {
    let mut ids: Vec<&str> = PRESETS.iter().map(|p| p.id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), PRESETS.len(), "preset ids are unique");
    for preset in PRESETS {
        assert!(!preset.source.is_empty(), "{} says where its knobs come from", preset.id);
        assert_eq!(Strategy::resolve(preset.id).unwrap().name, preset.id);
        for alias in preset.aliases {
            assert_eq!(Strategy::resolve(alias).unwrap().name, preset.id, "alias {alias}");
        }
    }
    for id in ["claude-code", "codex", "opencode", "observation-masking", "context-editing", "server-compaction", "cline"] {
        assert!(find(id).is_some(), "{id}");
    }
    assert!(Strategy::resolve("no-such-preset").is_err());
}

#[test]
fn peers_set_their_mechanism() {
    assert_eq!(Strategy::resolve("codex").unwrap().compact.peer.strategy, PeerStrategy::Codex);
    assert_eq!(Strategy::resolve("codex").unwrap().compact.peer.trigger_pct, 90);
    assert_eq!(Strategy::resolve("cline").unwrap().compact.peer.buffer_tokens, 40_000);
    assert!(Strategy::resolve("context-editing").unwrap().compact.context_editing.clear_tool_uses);
    assert_eq!(Strategy::resolve("claude-code").unwrap(), Strategy::default());
}

#[test]
fn set_overrides_dotted_keys() {
    let s = Strategy::resolve_with(
        "observation-masking",
        &["compact.peer.keep_recent=9".into(), "ttl_main=1h".into(), "compact.autocompact.buffer_tokens=20000".into()],
    )
    .unwrap();
    assert_eq!(s.compact.peer.keep_recent, 9);
    assert_eq!(s.ttl_main, ctxsim::strategy::TtlSetting::OneHour);
    assert_eq!(s.compact.autocompact.buffer_tokens, 20_000);
    assert!(Strategy::resolve_with("claude-code", &["compact.nope=1".into()]).is_err());
    assert!(Strategy::resolve_with("claude-code", &["no_equals".into()]).is_err());
}

#[test]
fn knob_table_lists_every_knob_with_differing_presets() {
    let table = knob_table(&Default::default());
    let peer = table.iter().find(|k| k.key == "compact.peer.strategy").expect("peer knob listed");
    assert_eq!(peer.default, serde_json::json!("none"));
    let ids: Vec<&str> = peer.presets.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["codex", "opencode", "observation-masking", "server-compaction", "cline"]);
    assert!(table.iter().any(|k| k.key == "compact.autocompact.buffer_tokens"));
    assert!(table.iter().all(|k| k.key != "name"));
}

#[test]
fn strategies_command_prints_json() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(["strategies", "--causes", "--format", "json"]).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["presets"].as_array().unwrap().len(), PRESETS.len());
    assert!(v["causes"].as_array().unwrap().len() > 5);
}

#[test]
fn peer_presets_change_what_the_agent_sends() {
    // Observation masking hides all but the last N tool results in every request it builds.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/time-microcompact.yaml");
    let scenario = ctxsim::scenario::load_scenario(&path).unwrap();
    let mut strategy = ctxsim::strategy::Strategy::resolve("observation-masking").unwrap();
    strategy.set("compact.peer.keep_recent", "0").unwrap();
    let mut m = ctxsim::measure::Measurer::new(ctxsim::measure::ModelTable::shipped(), ctxsim::measure::TokenCounter::new(ctxsim::measure::EstimatorKind::Chars4));
    let out = ctxsim::runner::run_scenario(&scenario, &mut m, &strategy).unwrap();
    let fired: Vec<_> = out.rows.iter().flat_map(|r| r.stages.iter()).filter(|s| s.fired && s.name == "observation_masking").collect();
    assert!(!fired.is_empty(), "{:?}", out.rows.iter().map(|r| &r.stages).collect::<Vec<_>>());
    assert!(fired.iter().all(|s| s.tokens_after < s.tokens_before));
}

/// `ctxsim strategies` lists no knob as replay-ignored (issue 13 deliver 5): every knob reaches a
/// recorded session through the agent, in the table and the JSON.
#[test]
fn strategies_say_only_what_the_agent_reads() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(["strategies"]).output().unwrap();
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(!table.contains("--engine replay"), "{table}");
    assert!(table.contains("Every knob reaches a recorded session through the\nagent, the engine of what-ifs on recorded sessions"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("  run_hooks = false") && !l.contains('(')), "{table}");
    assert!(!table.contains("not read"), "{table}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(["strategies", "--format", "json"]).output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["engines"].as_object().unwrap().keys().collect::<Vec<_>>(), ["agent"], "{json}");
    assert!(json["engines"]["agent"].as_str().unwrap().contains("every knob reaches a recorded session"), "{json}");
    let knobs = json["knobs"].as_array().unwrap();
    for k in knobs {
        assert_eq!(k["real_sessions"], true, "{k}");
        assert!(k.get("agent").is_none() && k.get("replay").is_none() && k.get("not_replayed").is_none(), "{k}");
    }
    assert!(knobs.iter().any(|k| k["key"] == "replay_recorded_microcompact"), "{json}");
}
