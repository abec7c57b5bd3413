//! `ctxsim audit` and the session inputs every session command shares.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use ctxsim::api::Usage;
use ctxsim::measure::billing::bill_call;
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::replay::audit::{Engine, GroupBy, SessionAudit, audit_session, bill_session, group, sort_audits};
use ctxsim::replay::discover::{SessionFilter, discover, parse_date};
use ctxsim::replay::load_session;
use ctxsim::report::audit::{audit_csv, audit_table, write_audit_html};
use rayon::prelude::*;
use serde_json::Value;

use super::support::realdata;

fn transcripts() -> PathBuf {
    realdata().join("transcripts")
}

fn ccusage() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ccusage/session.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ctxsim(args: &[&str], env: &[(&str, &Path)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ctxsim"));
    cmd.args(args).env_remove("CLAUDE_CONFIG_DIR");
    // The token-count cache of these runs, shared by them, never the user's.
    cmd.env("CTXSIM_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("token-cache"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn a_directory_is_walked_for_sessions_with_subagents_attached_to_their_parent() {
    let files = discover(&[transcripts()], &SessionFilter::default()).unwrap();
    let ids: Vec<&str> = files.iter().map(|f| f.session_id.as_str()).collect();
    assert_eq!(files.len(), 16, "{ids:?}");
    assert!(ids.contains(&"258c7280-ae70-4798-800f-63464d01a85d") && !ids.iter().any(|i| i.starts_with("agent-")), "{ids:?}");
    assert!(ids.contains(&"af1dd25ebb3e-8"), "Entire checkpoints are named by their id: {ids:?}");
    let mut sorted = files.clone();
    sorted.sort();
    assert_eq!(files, sorted);
    // The same file through its directory and by name is one session.
    let again = discover(&[transcripts().join("spotter"), transcripts().join("spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl")], &SessionFilter::default()).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].project, "spotter");
}

#[test]
fn filters_by_project_session_and_day() {
    let only = |filter: SessionFilter| -> Vec<String> { discover(&[transcripts()], &filter).unwrap().into_iter().map(|f| f.session_id).collect() };
    assert_eq!(only(SessionFilter { project: Some("cipher".into()), ..Default::default() }), ["af1dd25ebb3e-8", "c644f3afc869-1", "e89fb6a2d646-0"]);
    assert_eq!(only(SessionFilter { session: Some("cd95adddad32-0".into()), ..Default::default() }), ["cd95adddad32-0"]);
    // 2026-02-21: af1dd25ebb3e-8 (22:34–23:25 UTC) and c644f3afc869-1 (05:22–06:25 UTC).
    let day = parse_date("20260221").unwrap();
    assert_eq!(only(SessionFilter { since: Some(day), until: Some(day), ..Default::default() }), ["af1dd25ebb3e-8", "c644f3afc869-1"]);
    let after = only(SessionFilter { since: Some(parse_date("2026-08-12").unwrap()), ..Default::default() });
    assert_eq!(after, ["01M0EE5721NRN8FGE1238MD50T-0", "01M0FWRPX72AX3CYC2HMV1W2SN-1"]);
}

/// A tree shaped like `~/.claude/projects` (links to two shipped sessions).
fn config_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("projects/-home-me-numwordify");
    std::fs::create_dir_all(&project).unwrap();
    let src = transcripts().join("NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl");
    std::os::unix::fs::symlink(&src, project.join("01KZRVZ8V3GCEFGVQHVV9WP86W.jsonl")).unwrap();
    dir
}

#[test]
fn without_inputs_sessions_come_from_claude_config_dir() {
    let tree = config_tree();
    let empty = tempfile::tempdir().unwrap();
    // Each entry of the comma-separated list; one without `projects` is passed over.
    let list = format!("{},{}", empty.path().display(), tree.path().display());
    let out = ctxsim(&["replay", "--estimator", "chars4", "--format", "json"], &[("CLAUDE_CONFIG_DIR", Path::new(&list))]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(summary["input"].as_str().unwrap().ends_with("01KZRVZ8V3GCEFGVQHVV9WP86W.jsonl"), "{summary}");
    // A directory given to fidelity is walked too.
    let out = ctxsim(&["fidelity", "--estimator", "chars4", "--format", "json", tree.path().to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Nothing to read: exit 2 with a message.
    let out = ctxsim(&["audit"], &[("CLAUDE_CONFIG_DIR", empty.path()), ("HOME", empty.path())]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("CLAUDE_CONFIG_DIR"));
}

#[test]
fn billed_tokens_and_cost_equal_ccusage_per_session() {
    let table = ModelTable::shipped();
    let expected = ccusage();
    let by_id: BTreeMap<&str, &Value> = expected["session"].as_array().unwrap().iter().map(|s| (s["period"].as_str().unwrap(), s)).collect();
    let files = discover(&[transcripts()], &SessionFilter::default()).unwrap();
    assert_eq!(files.len(), by_id.len());
    for file in &files {
        let bill = bill_session(&load_session(&file.path).unwrap(), &table);
        let cc = by_id[file.session_id.as_str()];
        let n = |k: &str| cc[k].as_u64().unwrap();
        let got = (bill.tokens.input, bill.tokens.output, bill.tokens.cache_creation(), bill.tokens.cache_read, bill.tokens.total());
        let want = (n("inputTokens"), n("outputTokens"), n("cacheCreationTokens"), n("cacheReadTokens"), n("totalTokens"));
        assert_eq!(got, want, "{}: tokens", file.session_id);
        let cost = cc["totalCost"].as_f64().unwrap();
        assert!((bill.cost_usd - cost).abs() < 1e-9, "{}: cost {} vs ccusage {cost}", file.session_id, bill.cost_usd);
        // Per model too (ccusage names models by their recorded id).
        for m in cc["modelBreakdowns"].as_array().unwrap() {
            let name = m["modelName"].as_str().unwrap();
            let ours = &bill.by_model[name];
            assert!((ours.cost_usd - m["cost"].as_f64().unwrap()).abs() < 1e-9, "{}: {name}", file.session_id);
            assert_eq!(ours.tokens.input, m["inputTokens"].as_u64().unwrap(), "{}: {name}", file.session_id);
        }
        assert!(bill.unpriced.is_empty());
    }
}

#[test]
fn prices_agree_with_the_ccusage_probe_where_ccusage_applies_the_modifier() {
    let table = ModelTable::shipped();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ccusage/probe-costs.json");
    let probe: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut compared = 0;
    for (model, costs) in probe["costs"].as_object().unwrap() {
        // Models ccusage 20.0.24 does not know cost 0 there; models of another branch's table.
        if costs["in"].as_f64() == Some(0.0) || table.lookup(model).is_err() || model.contains("-5-1") {
            continue;
        }
        for (variant, usage) in probe["usages"].as_object().unwrap() {
            let mut usage = usage.clone();
            for k in ["input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"] {
                usage.as_object_mut().unwrap().entry(k).or_insert(0.into());
            }
            let usage: Usage = serde_json::from_value(usage).unwrap();
            let ours = bill_call(&table, model, &usage).unwrap().cost_usd;
            let theirs = costs[variant].as_f64().unwrap();
            let long = model.contains("sonnet-4-5") || model.contains("sonnet-4-2");
            match variant.as_str() {
                // ccusage ignores data residency and batch.
                "geo_us" => assert!((ours - 1.1 * theirs).abs() < 1e-9, "{model} {variant}"),
                "batch" => assert!((ours - 0.5 * theirs).abs() < 1e-9, "{model} {variant}"),
                // ccusage splits each token kind at 200k; the provider bills the whole request
                // at the higher rates once its prompt passes 200k.
                "in" | "w5m" | "w1h" | "wnosplit" | "rd" | "mix" if long => assert!(ours > theirs, "{model} {variant}"),
                "out" if long => assert!(ours < theirs, "{model} {variant}"),
                _ => {
                    assert!((ours - theirs).abs() < 1e-9, "{model} {variant}: {ours} vs ccusage {theirs}");
                    compared += 1;
                }
            }
        }
    }
    assert!(compared > 200, "{compared}");
}

fn audits() -> &'static Vec<SessionAudit> {
    static AUDITS: OnceLock<Vec<SessionAudit>> = OnceLock::new();
    AUDITS.get_or_init(|| {
        let table = ModelTable::shipped();
        let make = || Measurer::new(ModelTable::shipped(), TokenCounter::new(EstimatorKind::Chars4)).without_body_hashes();
        let files = discover(&[transcripts()], &SessionFilter::default()).unwrap();
        let mut audits: Vec<SessionAudit> = files.par_iter().map(|f| audit_session(f, &load_session(&f.path).unwrap(), &table, &make, Engine::Agent)).collect();
        sort_audits(&mut audits);
        audits
    })
}

#[test]
fn audit_table_of_the_shipped_sessions() {
    let audits = audits();
    let (rows, total) = group(audits, GroupBy::Session);
    let table = audit_table(&rows, &total, GroupBy::Session, false);
    for line in table.lines() {
        assert!(line.chars().count() <= 100, "wider than 100 columns: {line}");
    }
    // Largest loss first.
    assert!(rows.windows(2).all(|w| w[0].lost.cost_usd >= w[1].lost.cost_usd));
    insta::assert_snapshot!("audit_table", table);
    let (rows, total) = group(audits, GroupBy::Project);
    insta::assert_snapshot!("audit_table_by_project_breakdown", audit_table(&rows, &total, GroupBy::Project, true));
}

#[test]
fn grouped_rows_add_up_to_the_total() {
    let audits = audits();
    let billed: f64 = audits.iter().map(|a| a.billed.cost_usd).sum();
    for by in [GroupBy::Session, GroupBy::Project, GroupBy::Day] {
        let (rows, total) = group(audits, by);
        let cost: f64 = rows.iter().map(|r| r.cost_usd).sum();
        let lost: f64 = rows.iter().map(|r| r.lost.cost_usd).sum();
        let tokens: u64 = rows.iter().map(|r| r.tokens.total()).sum();
        let calls: u64 = rows.iter().map(|r| r.calls).sum();
        assert!((cost - total.cost_usd).abs() < 1e-6 && (total.cost_usd - billed).abs() < 1e-6, "{by:?}");
        assert!((lost - total.lost.cost_usd).abs() < 1e-6, "{by:?}");
        assert_eq!((tokens, calls), (total.tokens.total(), total.calls), "{by:?}");
        let csv = String::from_utf8(audit_csv(&rows, &total, by)).unwrap();
        let widths: Vec<usize> = csv.lines().map(|l| l.split(',').count()).collect();
        assert_eq!(widths.len(), rows.len() + 2);
        assert!(widths.iter().all(|w| *w == widths[0]), "{by:?}: {widths:?}");
    }
    // Breaks cost what their tokens cost written instead of read: never more than the bill.
    for a in audits {
        assert!(a.lost.cost_usd <= a.billed.cost_usd, "{}", a.session_id);
        let by_cause: u64 = a.breaks.values().map(|b| b.tokens).sum();
        assert_eq!(by_cause, a.lost.tokens);
    }
}

#[test]
fn html_report_has_every_plot_and_every_link_resolves() {
    let dir = tempfile::tempdir().unwrap();
    let written = write_audit_html(dir.path(), audits(), Engine::Agent).unwrap();
    let index = std::fs::read_to_string(dir.path().join("index.html")).unwrap();
    let doc = roxmltree::Document::parse_with_options(&index, roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() }).unwrap();
    let svg_ids: Vec<&str> = doc.descendants().filter(|n| n.has_tag_name("svg")).filter_map(|n| n.attribute("id")).collect();
    assert_eq!(svg_ids, ["cost-per-day", "whatifs"]);
    let bars = doc.descendants().filter(|n| n.has_tag_name("rect") && n.attribute("class") == Some("bar")).count();
    assert!(bars > 10, "{bars}");
    let links: Vec<&str> = doc.descendants().filter(|n| n.has_tag_name("a")).filter_map(|n| n.attribute("href")).collect();
    assert_eq!(links.len(), 16);
    for link in &links {
        let page = dir.path().join(link);
        assert!(written.contains(&page), "{link}");
        let text = std::fs::read_to_string(&page).unwrap();
        let doc = roxmltree::Document::parse_with_options(&text, roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() }).unwrap();
        assert!(doc.descendants().any(|n| n.has_tag_name("svg") && n.attribute("id") == Some("context-per-call")), "{link}");
        assert!(doc.descendants().any(|n| n.has_tag_name("a") && n.attribute("href") == Some("index.html")));
    }
    // Breaks are marked and named on the pages of sessions that had them.
    let top = &audits()[0];
    assert!(top.lost.breaks > 0);
    let page = std::fs::read_to_string(dir.path().join(links[0])).unwrap();
    let marks = page.matches("class=\"break\"").count() as u64;
    assert!(marks > 0 && marks <= top.lost.breaks, "{marks}");
}

/// `audit` runs its what-ifs through the agent by default (one model of the client): every
/// preset is weighed, those the replay engine cannot judge (observation-masking, codex, ...)
/// included, each with its saving against the agent's run as recorded, its information loss,
/// the tokens it takes from the model's view and where its conversation parts from the
/// recording. The billed figures and the breaks are the replay engine's (the recorded usage);
/// the output is the same with one and two threads and names the engine.
#[test]
fn audit_runs_its_what_ifs_through_the_agent_by_default() {
    let dir = transcripts();
    let run = |jobs: &str, engine: &[&str]| {
        let args = [&["audit", dir.to_str().unwrap(), "--session", "a6e4c2a0fbd1-0", "--estimator", "chars4", "--json", "--no-result-cache", "--jobs", jobs][..], engine].concat();
        let out = ctxsim(&args, &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    let one = run("1", &["--engine", "agent"]);
    assert_eq!(one, run("2", &["--engine", "agent"]), "--jobs 1 and 2 differ");
    let agent: Value = serde_json::from_slice(&one).unwrap();
    // The agent is the default (and only) engine.
    assert_eq!(one, run("2", &[]), "the default engine is not the agent");
    assert_eq!(agent["engine"], "agent");
    assert!(agent.get("whatifs_awaiting").is_none(), "{}", agent["whatifs_awaiting"]);
    assert!(agent["whatifs_available"].as_str().unwrap().contains("every preset"));
    let a = &agent["sessions"][0];
    assert_eq!(a["engine"], "agent");
    // Through the agent every preset but the run as recorded, the 1h TTL and the env one.
    let presets = a["presets"].as_array().unwrap();
    let names: Vec<&str> = presets.iter().map(|p| p["name"].as_str().unwrap()).collect();
    let expected: Vec<String> = ctxsim::strategy::presets::PRESETS
        .iter()
        .filter(|p| !ctxsim::replay::audit::AGENT_PRESETS_LEFT_OUT.contains(&p.id))
        .map(|p| format!("preset={}", p.id))
        .collect();
    assert_eq!(names, expected);
    // Every preset the replay engine leaves to compare is judged: priced, said not to be
    // comparable (on a6e4 the peers that do not compact where the client did hit the blocking
    // limit: the session's work was not done), or out of the running (more tokens taken from
    // the model's view than the run as recorded), each saying from which call it parts from the
    // recording.
    for id in ["codex", "opencode", "observation-masking", "context-editing", "server-compaction", "cline"] {
        let p = presets.iter().find(|p| p["name"] == format!("preset={id}")).unwrap();
        assert!(p.get("no_effect").is_none(), "{p}");
        let priced = p["info_loss_delta"].is_i64() && p["tokens_dropped_delta"].is_i64();
        let refused = p["not_comparable"].as_str().is_some_and(|why| why.contains("blocking limit"));
        let excluded = p["excluded"].as_str().is_some_and(|why| why.starts_with("out of the running from call "));
        assert_eq!([priced, refused, excluded].iter().filter(|b| **b).count(), 1, "{p}");
        assert!(p["diverges_from"].as_u64().is_some() && !p["divergence"].as_str().unwrap().is_empty(), "{p}");
    }
    // claude-code-no-microcompact differs from the run as recorded only in whether a replay
    // applies the recorded microcompacts (the agent's own microcompact is off in both), which
    // the agent does not read: its run gives the run as recorded's results, priced at no
    // change and said to change nothing (not the same settings: the same results).
    let nomc = presets.iter().find(|p| p["name"] == "preset=claude-code-no-microcompact").unwrap();
    assert_eq!(nomc["no_effect"], ctxsim::replay::audit::SAME_RESULTS, "{nomc}");
    assert!(nomc.get("not_comparable").is_none(), "{nomc}");
    assert!(nomc["saving_usd"] == 0.0 && nomc["info_loss_delta"] == 0 && nomc["tokens_dropped_delta"] == 0, "{nomc}");
    // Every preset that says it changes nothing saved nothing at no other loss.
    for p in presets.iter().filter(|p| p.get("no_effect").is_some()) {
        assert!(p["saving_usd"] == 0.0 && p["info_loss_delta"].as_i64().unwrap_or(0) == 0, "{p}");
    }
    // Context editing (the server clearing old tool uses) clears more than the recorded
    // compaction took from the model's view: not "no more information loss", so it is out of
    // the running from the call where its clearing passed the run as recorded's whole drop, and
    // its run stopped there (no saving given); it says where its conversation parts from the
    // recording.
    let editing = presets.iter().find(|p| p["name"] == "preset=context-editing").unwrap();
    assert!(editing["excluded"].as_str().unwrap().contains("more than the run as recorded over the whole session"), "{editing}");
    assert!(editing["saving_usd"] == 0.0 && editing.get("tokens_dropped_delta").is_none(), "{editing}");
    assert!(editing["divergence"].as_str().unwrap().contains("context_editing"), "{editing}");
    // The preset what-if is the cheapest preset at no more loss.
    let whatifs = a["whatifs"].as_array().unwrap();
    let preset = whatifs.iter().find(|w| w["name"].as_str().unwrap().starts_with("preset")).unwrap();
    let no_more_loss = |p: &&Value| p.get("no_effect").is_none() && p.get("not_comparable").is_none() && p.get("excluded").is_none() && p["info_loss_delta"].as_i64() <= Some(0) && p["tokens_dropped_delta"].as_i64() <= Some(0);
    let cheapest = presets.iter().filter(no_more_loss).map(|p| p["saving_usd"].as_f64().unwrap()).fold(f64::MIN, f64::max);
    if cheapest <= 0.0 {
        assert!(preset["no_effect"].as_str().unwrap().contains("saves"), "no preset saves, yet {preset}");
    } else {
        assert!(preset.get("no_effect").is_none(), "{preset}");
        assert_eq!(preset["saving_usd"].as_f64().unwrap(), cheapest, "{preset}");
        assert!(no_more_loss(&preset), "{preset}");
    }
    // The a6e4 session compacted at 155k: the lower thresholds move its compaction, and the
    // what-if says from which call its conversation is no longer the recorded one.
    for pct in ctxsim::replay::audit::AUTOCOMPACT_PCTS {
        let w = whatifs.iter().find(|w| w["name"] == format!("autocompact_pct={pct}")).unwrap();
        assert!(w.get("no_effect").is_none() && w["diverges_from"].as_u64().is_some(), "{w}");
    }
    // The table names the engine and says where the replies diverge.
    let out = ctxsim(&["audit", dir.to_str().unwrap(), "--session", "a6e4c2a0fbd1-0", "--estimator", "chars4", "--no-progress", "--engine", "agent"], &[]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("through the agent (the default engine,") && table.contains("(replies diverge from call"), "{table}");
    assert!(!table.contains("not in the audit"), "{table}");
    // Through the agent the presets change the session: an unpriced preset is "no preset saves",
    // never "no effect".
    assert!(!table.lines().any(|l| l.contains("no effect:") && l.contains("preset")), "{table}");
    assert!(table.lines().all(|l| l.chars().count() <= 100), "wider than 100 columns:\n{table}");
    let csv = ctxsim(&["audit", dir.to_str().unwrap(), "--session", "a6e4c2a0fbd1-0", "--estimator", "chars4", "--no-progress", "--csv", "--engine", "agent"], &[]);
    let csv = String::from_utf8(csv.stdout).unwrap();
    assert!(csv.lines().next().unwrap().starts_with("session,engine,"), "{csv}");
    assert!(csv.lines().nth(1).unwrap().contains(",agent,"), "{csv}");
}

/// The audit's presets of one session (JSON, chars4, results not cached).
fn audit_presets(file: &std::path::Path) -> Vec<Value> {
    let out = ctxsim(&["audit", file.to_str().unwrap(), "--estimator", "chars4", "--json", "--no-result-cache", "--no-progress"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let audit: Value = serde_json::from_slice(&out.stdout).unwrap();
    audit["sessions"][0]["presets"].as_array().unwrap().clone()
}

/// `compare`'s JSON of one session under `strategies` (chars4).
fn compare_json(file: &std::path::Path, strategies: &str) -> Value {
    let out = ctxsim(&["compare", file.to_str().unwrap(), "--strategies", strategies, "--estimator", "chars4", "--format", "json"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A preset run on its own stops once it has taken more tokens from the model's view than the
/// run as recorded did over the whole session (the count only grows: it can no longer be the
/// cheapest preset at no more loss): the audit says from which call and by how much, and the
/// verdict is the one its full run gives (`compare` runs it to the end): more tokens dropped
/// than the run as recorded, by at least as many as when it stopped.
#[test]
fn audit_stops_a_preset_out_of_the_running_with_its_full_runs_verdict() {
    let file = transcripts().join("entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    let presets = audit_presets(&file);
    let editing = presets.iter().find(|p| p["name"] == "preset=context-editing").unwrap();
    let why = editing["excluded"].as_str().unwrap();
    // "out of the running from call C: by then it had taken T tokens ..., more than the run as
    // recorded over the whole session (B); ..."
    let number_after = |marker: &str| -> u64 { why.split(marker).nth(1).unwrap().chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap() };
    let (call, taken, bound) = (number_after("from call "), number_after("it had taken "), number_after("over the whole session ("));
    assert!(taken > bound && call >= editing["diverges_from"].as_u64().unwrap(), "{why}");
    let compare = compare_json(&file, "default,context-editing");
    let dropped = |strategy: &str| compare.as_array().unwrap().iter().find(|e| e["strategy"] == strategy).unwrap()["summary"]["info_loss"]["tokens_dropped"].as_u64().unwrap();
    assert_eq!(dropped("claude-code"), bound, "the bound is the run as recorded's whole drop");
    assert!(dropped("context-editing") >= taken, "{why}: the full run drops {}", dropped("context-editing"));
}

/// Issue 15: a preset that goes on from the run as recorded's own trunk (a peer branch: codex,
/// cline) stops too once it is out of the running, after the run as recorded has been made to
/// its end; the full run (`compare`) agrees: it refuses more requests than the run as recorded.
#[test]
fn audit_stops_a_peer_branch_out_of_the_running_after_the_run_as_recorded() {
    let file = transcripts().join("entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    let presets = audit_presets(&file);
    let compare = compare_json(&file, "default,codex,cline");
    let blocked = |strategy: &str| compare.as_array().unwrap().iter().find(|e| e["strategy"] == strategy).unwrap()["summary"]["blocked"].as_u64().unwrap();
    assert_eq!(blocked("claude-code"), 0);
    for name in ["codex", "cline"] {
        let preset = presets.iter().find(|p| p["name"] == format!("preset={name}")).unwrap();
        let why = preset["not_comparable"].as_str().unwrap_or_else(|| panic!("{preset}"));
        // "the agent refused R requests at the blocking limit under it by call C (0 as recorded
        // over the whole session): ...; its run stopped there"
        let number_after = |marker: &str| -> u64 { why.split(marker).nth(1).unwrap().chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap() };
        let (refused, call) = (number_after("the agent refused "), number_after("by call "));
        assert!(why.ends_with("its run stopped there"), "{why}");
        assert!(refused == 1 && call >= preset["diverges_from"].as_u64().unwrap(), "{why}");
        assert!(blocked(name) >= refused, "{why}: the full run refuses {}", blocked(name));
        assert_eq!(preset["saving_usd"], 0.0, "{preset}");
    }
}

/// Issue 15: the audit weighs another autocompact threshold and the cheapest preset at no more
/// information loss on every session. A what-if a session cannot feel is decided without a
/// replay and said to change nothing; the decision is right (the full what-if replay moves no
/// compaction there); sessions with a recorded automatic compaction are replayed and priced.
#[test]
fn audit_weighs_autocompact_thresholds_and_presets() {
    use ctxsim::replay::audit::{AUTOCOMPACT_PCTS, WhatIf};
    let audits = audits();
    let find = |a: &SessionAudit, name: &str| -> WhatIf { a.whatifs.iter().find(|w| w.name == name).cloned().unwrap_or_else(|| panic!("{}: no {name}", a.session_id)) };
    let mut gated = Vec::new();
    for a in audits {
        for pct in AUTOCOMPACT_PCTS {
            let w = find(a, &format!("autocompact_pct={pct}"));
            match &w.no_effect {
                Some(why) => {
                    assert_eq!(w.saving_usd, 0.0, "{}", a.session_id);
                    if why.contains("never reaches the threshold") {
                        gated.push((a.path.clone(), pct));
                    }
                }
                None => assert!(w.info_loss_delta.is_some(), "{}", a.session_id),
            }
        }
        assert!(a.whatifs.iter().any(|w| w.name.starts_with("preset")), "{}", a.session_id);
        if let Some(best) = &a.best_whatif {
            assert!(best.no_effect.is_none() && best.saving_usd > 0.0);
            let max = a.whatifs.iter().filter(|w| w.no_effect.is_none()).map(|w| w.saving_usd).fold(f64::MIN, f64::max);
            assert_eq!(best.saving_usd, max, "{}", a.session_id);
        }
    }
    // Every session with a recorded automatic compaction (cipher-box, spotter, entireio-cli) is
    // replayed under the lower thresholds and the 50% one moves its compactions.
    let with_auto: Vec<&SessionAudit> = audits.iter().filter(|a| a.compactions.iter().any(|c| c.trigger == "auto")).collect();
    assert!(with_auto.len() >= 8, "{}", with_auto.len());
    for a in &with_auto {
        assert!(find(a, "autocompact_pct=50").no_effect.is_none(), "{}", a.session_id);
    }
    // The sessions that never reach a threshold are decided without a replay, and rightly.
    assert!(gated.len() >= 6, "{gated:?}");
    // The table says which what-ifs changed nothing.
    let (rows, total) = group(audits, GroupBy::Session);
    let table = audit_table(&rows, &total, GroupBy::Session, false);
    assert!(table.contains("no effect: autocompact_pct=50, autocompact_pct=70, autocompact_pct=90"), "{table}");
    // The CSV's best what-if is the total's best saving.
    let csv = String::from_utf8(audit_csv(&rows, &total, GroupBy::Session)).unwrap();
    let last = csv.lines().last().unwrap();
    let best = total.best_whatif.as_ref().expect("a what-if saves over all sessions");
    assert!(last.contains(&best.name), "{last}");
    assert!(total.whatif_savings.values().all(|s| *s <= best.saving_usd));
}

/// A Parquet file read back: column names and rows as (name → value) maps.
fn read_parquet(path: &Path) -> (Vec<String>, Vec<BTreeMap<String, parquet::record::Field>>) {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let reader = SerializedFileReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let names = reader.metadata().file_metadata().schema_descr().columns().iter().map(|c| c.name().to_owned()).collect();
    let rows = reader.get_row_iter(None).unwrap().map(|row| row.unwrap().get_column_iter().map(|(n, f)| (n.clone(), f.clone())).collect()).collect();
    (names, rows)
}

#[test]
fn parquet_shards_read_back_as_the_whole_table() {
    use parquet::record::Field;
    let dir = tempfile::tempdir().unwrap();
    let input = transcripts();
    let common = ["audit", input.to_str().unwrap(), "--project", "entireio-cli", "--estimator", "chars4", "--no-progress"];
    let csv_out = ctxsim(&[&common[..], &["--csv"]].concat(), &[]);
    assert!(csv_out.status.success());
    let csv_text = String::from_utf8(csv_out.stdout).unwrap();
    let header: Vec<&str> = csv_text.lines().next().unwrap().split(',').collect();
    let mut shard_rows = Vec::new();
    for shard in ["0/2", "1/2"] {
        let path = dir.path().join(format!("audit-{}.parquet", &shard[..1]));
        let out = ctxsim(&[&common[..], &["--format", "parquet", "-o", path.to_str().unwrap(), "--shard", shard]].concat(), &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let (names, rows) = read_parquet(&path);
        assert_eq!(names, header, "the Parquet columns are the CSV's");
        shard_rows.extend(rows);
    }
    // Five sessions over two shards (3 + 2), no total row; the cost adds up to the CSV's total.
    assert_eq!(shard_rows.len(), 5);
    let cost: f64 = shard_rows.iter().map(|r| match r["cost_usd"] { Field::Double(v) => v, ref f => panic!("{f:?}") }).sum();
    let total_line = csv_text.lines().last().unwrap();
    let total: f64 = total_line.split(',').nth(header.iter().position(|h| *h == "cost_usd").unwrap()).unwrap().parse().unwrap();
    assert!((cost - total).abs() < 1e-5, "{cost} vs {total}");
    assert!(shard_rows.iter().all(|r| matches!(&r["project"], Field::Str(p) if p == "entireio-cli")));
    // --format parquet without a file is a usage error.
    let out = ctxsim(&[&common[..], &["--format", "parquet"]].concat(), &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_trace_is_written_as_parquet_with_the_csv_columns() {
    let dir = tempfile::tempdir().unwrap();
    let session = transcripts().join("NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl");
    let (pq, csv) = (dir.path().join("t.parquet"), dir.path().join("t.csv"));
    for trace in [&pq, &csv] {
        let out = ctxsim(&["replay", session.to_str().unwrap(), "--estimator", "chars4", "--quiet", "--trace", trace.to_str().unwrap()], &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let (names, rows) = read_parquet(&pq);
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(names.join(","), csv_text.lines().next().unwrap());
    assert_eq!(rows.len(), csv_text.lines().count() - 1);
    assert!(rows.len() >= 30);
}

/// The token-count cache file (`measure::token_cache`): created by a run, read by the next
/// (its counts are used: a file with every count doubled changes the replay's figures),
/// ignored and rewritten when damaged, never touched with `--no-token-cache`; the output is the
/// same with and without it.
#[test]
fn the_token_count_cache_is_created_reused_ignored_when_damaged_and_optional() {
    let session = transcripts().join("NumWordify");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(ctxsim::measure::token_cache::FILE_NAME);
    let run = |extra: &[&str]| {
        // The results replayed every time (`--no-result-cache`): the counts decide them.
        let mut args = vec!["audit", session.to_str().unwrap(), "--json", "--no-progress", "--no-result-cache"];
        args.extend_from_slice(extra);
        let out = ctxsim(&args, &[("CTXSIM_CACHE_DIR", dir.path())]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (out.stdout, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // Disabled: the same output, no file.
    let (plain, _) = run(&["--no-token-cache"]);
    assert!(!file.exists());
    // Created.
    let (cold, _) = run(&[]);
    assert_eq!(cold, plain);
    let written = std::fs::read(&file).unwrap();
    assert!(written.len() > 1000, "{} bytes", written.len());
    // Reused: nothing new to add, so not rewritten; the same output.
    let (warm, _) = run(&[]);
    assert_eq!(warm, plain);
    assert_eq!(std::fs::read(&file).unwrap(), written);
    // Its counts are the ones used: every count doubled (checksum recomputed) changes the figures.
    let mut doubled = written.clone();
    let body_end = doubled.len() - 16;
    for entry in doubled[16..body_end].chunks_exact_mut(20) {
        let n = u32::from_le_bytes(entry[16..].try_into().unwrap());
        entry[16..].copy_from_slice(&(n * 2).to_le_bytes());
    }
    let sum = xxhash_rust::xxh3::xxh3_128(&doubled[..body_end]).to_le_bytes();
    doubled[body_end..].copy_from_slice(&sum);
    std::fs::write(&file, &doubled).unwrap();
    let (skewed, _) = run(&[]);
    assert_ne!(skewed, plain, "the doubled counts were not read");
    // Damaged (one flipped byte): ignored with a note, the output as without a cache, and the
    // file rewritten as a clean run writes it.
    let mut damaged = written.clone();
    damaged[100] ^= 0x40;
    std::fs::write(&file, &damaged).unwrap();
    let (repaired, stderr) = run(&[]);
    assert_eq!(repaired, plain);
    assert!(stderr.contains("ignored (checksum mismatch)"), "{stderr}");
    assert_eq!(std::fs::read(&file).unwrap(), written);
    // Disabled with a file present: neither read (the doubled counts would show) nor written.
    std::fs::write(&file, &doubled).unwrap();
    let (off, _) = run(&["--no-token-cache"]);
    assert_eq!(off, plain);
    assert_eq!(std::fs::read(&file).unwrap(), doubled);
}

/// The per-session result cache (`replay::audit_cache`): a second run reads every session's
/// result from it (an entry edited with a valid checksum shows in the output), with output
/// byte-identical to a run without it, the HTML report included; a damaged entry is recomputed
/// with a note naming it and rewritten; a changed session file or a new file in its subagent
/// directory misses; `--no-result-cache` and `--no-cache` neither read nor write it.
#[test]
fn the_result_cache_is_reused_byte_identical_recomputed_when_damaged_and_missed_when_a_session_changes() {
    let work = tempfile::tempdir().unwrap();
    let project = work.path().join("sessions/NumWordify");
    std::fs::create_dir_all(&project).unwrap();
    let session = project.join("S.jsonl");
    std::fs::copy(transcripts().join("NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl"), &session).unwrap();
    let cache = work.path().join("cache");
    let entries = cache.join(ctxsim::replay::audit_cache::DIR_NAME);
    let run = |extra: &[&str], out: &str| {
        let mut args = vec!["audit", session.to_str().unwrap(), "--json", "--no-progress", "--out"];
        let out = work.path().join(out);
        args.push(out.to_str().unwrap());
        args.extend_from_slice(extra);
        let done = ctxsim(&args, &[("CTXSIM_CACHE_DIR", &cache)]);
        assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
        let report: BTreeMap<String, Vec<u8>> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().path()).map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap())).collect();
        (done.stdout, report, String::from_utf8_lossy(&done.stderr).into_owned())
    };
    let entry = || {
        let files: Vec<PathBuf> = std::fs::read_dir(&entries).map(|d| d.map(|e| e.unwrap().path()).collect()).unwrap_or_default();
        assert!(files.len() <= 1, "{files:?}");
        files.into_iter().next()
    };
    // Off: nothing written.
    let (plain, plain_report, _) = run(&["--no-cache"], "plain");
    assert!(entry().is_none());
    // Written by the first run, read by the second: the same output and report.
    let (cold, cold_report, _) = run(&[], "cold");
    assert_eq!((&cold, &cold_report), (&plain, &plain_report));
    let path = entry().expect("an entry written");
    let written = std::fs::read(&path).unwrap();
    let (warm, warm_report, stderr) = run(&[], "warm");
    assert_eq!((&warm, &warm_report), (&plain, &plain_report));
    assert!(!stderr.contains("note:"), "{stderr}");
    assert_eq!(std::fs::read(&path).unwrap(), written);
    // Its result is the one used: an entry with another call count (checksum recomputed).
    let header_end = written.iter().position(|&b| b == b'\n').unwrap();
    let mut payload: Value = serde_json::from_slice(&written[header_end + 1..]).unwrap();
    payload["audit"]["calls"] = Value::from(987654321u64);
    let payload = serde_json::to_vec(&payload).unwrap();
    let header = std::str::from_utf8(&written[..header_end]).unwrap();
    let key = header.split(' ').nth(1).unwrap();
    let mut edited = format!("ctxsim-audit-result-v1 {key} {:032x}\n", xxhash_rust::xxh3::xxh3_128(&payload)).into_bytes();
    edited.extend_from_slice(&payload);
    std::fs::write(&path, &edited).unwrap();
    let shows = |out: &[u8]| String::from_utf8_lossy(out).contains("987654321");
    let (read, ..) = run(&[], "edited");
    assert!(shows(&read), "the entry was not read");
    // Not read with the cache off.
    for off in ["--no-result-cache", "--no-cache"] {
        let (out, ..) = run(&[off], "off");
        assert_eq!(out, plain, "{off}");
        assert_eq!(std::fs::read(&path).unwrap(), edited, "{off} wrote the entry");
    }
    // Damaged (a flipped byte of the payload): recomputed with a note naming it, rewritten.
    let mut damaged = written.clone();
    let last = damaged.len() - 3;
    damaged[last] ^= 0x01;
    std::fs::write(&path, &damaged).unwrap();
    let (repaired, repaired_report, stderr) = run(&[], "repaired");
    assert_eq!((&repaired, &repaired_report), (&plain, &plain_report));
    assert!(stderr.contains(&format!("audit result cache entry {} fails its checksum; the session was audited again", path.display())), "{stderr}");
    assert_eq!(std::fs::read(&path).unwrap(), written);
    // Not an entry at all (truncated to nothing): the same.
    std::fs::write(&path, b"").unwrap();
    let (_, _, stderr) = run(&[], "empty");
    assert!(stderr.contains("has no header line"), "{stderr}");
    assert_eq!(std::fs::read(&path).unwrap(), written);
    // A changed session file misses (the edited entry is not read) and its entry is replaced.
    std::fs::write(&path, &edited).unwrap();
    let mut bytes = std::fs::read(&session).unwrap();
    bytes.extend_from_slice(b"\n");
    std::fs::write(&session, &bytes).unwrap();
    let (changed, ..) = run(&[], "changed");
    assert!(!shows(&changed), "a changed session read the old entry");
    assert_eq!(changed, run(&["--no-cache"], "changed-plain").0);
    assert_ne!(std::fs::read(&path).unwrap(), edited);
    // So does a new file in its subagent directory.
    let rewritten = std::fs::read(&path).unwrap();
    let header_end = rewritten.iter().position(|&b| b == b'\n').unwrap();
    let key = std::str::from_utf8(&rewritten[..header_end]).unwrap().split(' ').nth(1).unwrap().to_owned();
    let mut edited = format!("ctxsim-audit-result-v1 {key} {:032x}\n", xxhash_rust::xxh3::xxh3_128(&payload)).into_bytes();
    edited.extend_from_slice(&payload);
    std::fs::write(&path, &edited).unwrap();
    assert!(shows(&run(&[], "edited-again").0), "the entry was not read");
    std::fs::create_dir_all(project.join("S/subagents")).unwrap();
    std::fs::write(project.join("S/subagents/agent-a.meta.json"), "{}").unwrap();
    assert!(!shows(&run(&[], "subagent").0), "a changed subagent directory read the old entry");
}
