//! Fit hygiene and the size side of current clients (issue 16): the tokenizer generation per
//! model, per-version profiles taken from the nearest earlier version (and said so), the
//! thinking fill fitted from stored thinking, attachments sent as reminders, the folds of the
//! cross-validation, and which sessions the shipped calibration was fitted on.

use std::collections::BTreeMap;

use ctxsim::measure::tokens::{Calibration, FamilyCalibration, FittedSession, UNFITTED_GENERATION_RATIO};
use ctxsim::measure::{EstimatorKind, Measurer, ModelTable, TokenCounter};
use ctxsim::replay::crossval::{Leave, folds, version_group};
use ctxsim::replay::profile::fitted_for_version;
use ctxsim::replay::{ReplayOptions, SessionFit, SessionReplay, fit_calibration, load_session, session_fit};

use crate::support::{realdata, replay_session};

const NUMWORDIFY: &str = "NumWordify/01KZRVZ8V3GCEFGVQHVV9WP86W-0.full.jsonl";
const OMP_0254: &str = "oh-my-posh/0254bffa0c17-1.full.jsonl";
const OMP_EEA3: &str = "oh-my-posh/eea3a34195eb-0.full.jsonl";

fn path(transcript: &str) -> std::path::PathBuf {
    realdata().join("transcripts").join(transcript)
}

fn replayed(transcript: &str, calibration: Calibration) -> SessionReplay {
    let session = load_session(&path(transcript)).unwrap();
    let mut measurer = Measurer::new(ModelTable::shipped(), TokenCounter::with_calibration(EstimatorKind::Calibrated, calibration));
    replay_session(&session, &mut measurer, &ReplayOptions::default())
}

fn fit_of(transcript: &str) -> SessionFit {
    let session = load_session(&path(transcript)).unwrap();
    session_fit(&session, &path(transcript), &ModelTable::shipped(), &ReplayOptions::default())
}

/// The session ids of the README table scored with the shipped calibration (the rows after
/// its marker, up to the first line that is not a table row).
fn readme_rows_scored_with_the_shipped_calibration() -> Vec<String> {
    let readme = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let marker = "<!-- scored with the shipped calibration -->";
    let (_, after) = readme.split_once(marker).expect("README marks the table scored with the shipped calibration");
    after
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| row.split('|').nth(1).unwrap().split_whitespace().last().unwrap().to_owned())
        .collect()
}

#[test]
fn the_shipped_calibration_was_fitted_on_no_session_the_readme_scores_with_it() {
    let shipped = Calibration::shipped();
    assert!(shipped.fitted_on.len() >= 6, "the shipped calibration names the sessions it was fitted on");
    let scored = readme_rows_scored_with_the_shipped_calibration();
    assert!(scored.len() >= 4, "{scored:?}");
    for id in &scored {
        let fitted: Vec<&FittedSession> = shipped.fitted_on.iter().filter(|f| f.session.starts_with(id.as_str())).collect();
        assert!(fitted.is_empty(), "README scores {id} with the shipped calibration, which was fitted on it: {fitted:?}");
        // The row names a real session.
        let exists = walk(&realdata().join("transcripts")).iter().any(|p| p.file_name().unwrap().to_string_lossy().starts_with(id.as_str()));
        assert!(exists, "{id} is no session of ../shared/realdata/transcripts");
    }
    // Every session it was fitted on exists, in the project it names.
    for f in &shipped.fitted_on {
        assert!(realdata().join("transcripts").join(&f.project).join(&f.session).is_file(), "{f:?}");
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.extension().is_some_and(|e| e == "jsonl") {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_model_of_the_newer_tokenizer_generation_takes_its_generation_scale() {
    let table = ModelTable::shipped();
    let key = |m: &str| table.lookup(m).unwrap().estimator_key();
    assert_eq!(key("claude-opus-4-6"), "opus");
    assert_eq!(key("claude-sonnet-4-5-20250929"), "sonnet");
    for (model, family) in [("claude-opus-5", "opus"), ("claude-opus-4-7", "opus"), ("claude-sonnet-5", "sonnet"), ("claude-fable-5", "fable"), ("claude-haiku-5-5", "haiku")] {
        assert_eq!(key(model), format!("{family}/v2"), "{model}");
    }
    let mut calibration = Calibration::shipped();
    calibration.families.insert("opus".into(), FamilyCalibration { scale: 1.1, per_block: 40.0 });
    calibration.generations.clear();
    // No fit for the generation: the family's scale times the documented ratio.
    let unfitted = calibration.for_family("opus/v2");
    assert!((unfitted.scale - 1.1 * UNFITTED_GENERATION_RATIO).abs() < 1e-9 && unfitted.per_block == 40.0, "{unfitted:?}");
    calibration.generations.insert("v2".into(), FamilyCalibration { scale: 1.8, per_block: 50.0 });
    assert_eq!(calibration.for_family("opus/v2"), FamilyCalibration { scale: 1.8, per_block: 50.0 });
    assert_eq!(calibration.for_family("opus").scale, 1.1);
    // The same text counts more under a model of the newer generation.
    let counter = TokenCounter::with_calibration(EstimatorKind::Calibrated, calibration);
    let text = "fn main() { println!(\"the same text on both generations\"); }";
    let old = counter.count_text(text, &key("claude-opus-4-6"));
    let new = counter.count_text(text, &key("claude-opus-5"));
    assert!(new as f64 >= old as f64 * 1.5, "{old} {new}");
    // A table whose generation name is not one is refused, naming the field.
    let shipped = include_str!("../../data/models.toml");
    let bad = shipped.replacen("tokenizer = \"v2\"", "tokenizer = \"a/b\"", 1);
    let err = ModelTable::parse(&bad, "models.toml").unwrap_err().to_string();
    assert!(err.contains("tokenizer"), "{err}");
}

#[test]
fn the_shipped_calibration_fits_the_newer_generation_on_claude_5_sessions() {
    let shipped = Calibration::shipped();
    let v2 = shipped.generations.get("v2").expect("a fitted v2 scale");
    let opus = shipped.for_family("opus");
    // About 30% more tokens than the older generation (reference §2), content-dependent.
    assert!(v2.scale / opus.scale > 1.2 && v2.scale / opus.scale < 2.0, "{v2:?} {opus:?}");
    assert!(shipped.fitted_on.iter().any(|f| f.project == "oh-my-posh"));
}

#[test]
fn fitted_profiles_take_the_nearest_earlier_version_and_say_so() {
    let profile: BTreeMap<String, u64> = [("2.1.209", 1), ("2.1.219", 2), ("2.1.39", 3)].map(|(v, t)| (v.to_owned(), t)).into();
    assert_eq!(fitted_for_version(&profile, "2.1.219"), Some((&2, "2.1.219")));
    assert_eq!(fitted_for_version(&profile, "2.1.227"), Some((&2, "2.1.219")));
    assert_eq!(fitted_for_version(&profile, "2.1.215"), Some((&1, "2.1.209")));
    assert_eq!(fitted_for_version(&profile, "2.1.100"), Some((&3, "2.1.39")));
    // Older than every fitted version: the earliest.
    assert_eq!(fitted_for_version(&profile, "2.0.76"), Some((&3, "2.1.39")));
    // The agent driven by a session of a version the calibration has no entry for says what it took.
    let mut calibration = Calibration::shipped();
    calibration.thinking_fill = [("2.1.219".to_owned(), 0.5)].into();
    calibration.user_context_by_version = [("2.1.215".to_owned(), 7_000)].into();
    let replay = replayed(NUMWORDIFY, calibration);
    // From 2.1.200 a reply with thinking counts its billed output: no fitted share is taken.
    assert!(!replay.profile_notes.iter().any(|n| n.starts_with("thinking fill")), "{:?}", replay.profile_notes);
    assert!(replay.profile_notes.iter().any(|n| n.starts_with("user context of 2.1.227 taken from 2.1.215")), "{:?}", replay.profile_notes);
}

#[test]
fn the_fit_keeps_a_step_whose_only_new_record_is_a_task_reminder() {
    // eea3's steps whose only new record beyond the messages is a task reminder (calls 22, 31,
    // 39, 49, 65, each after a stored-thinking reply) are fit samples: 31 clean steps and those 5.
    let fit = fit_of(OMP_EEA3);
    let samples: usize = fit.samples.iter().filter(|(key, _)| key.ends_with("/v2")).map(|(_, s)| s.len()).sum();
    assert_eq!(samples, 36, "{:?}", fit.samples.keys().collect::<Vec<_>>());
}

#[test]
fn thinking_fill_is_fitted_from_stored_thinking_and_fills_the_rest() {
    // 0254 stores its thinking; eea3 (2.1.205) does not.
    let stored = fit_of(OMP_0254);
    assert!(stored.thinking.len() > 100, "{}", stored.thinking.len());
    assert!(stored.thinking.iter().all(|(v, k, _)| v == "2.1.219" && k == "opus/v2"));
    let unstored = fit_of(OMP_EEA3);
    assert!(unstored.thinking.is_empty());
    let fitted = fit_calibration(&[&stored]);
    let ratio = fitted.thinking_fill["2.1.219"];
    assert!((0.2..1.0).contains(&ratio), "{ratio}");
    // A fit step that brings a filled reply is left out: eea3 fills nearly every reply.
    let steps: usize = unstored.samples.values().map(Vec::len).sum();
    let calls = replayed(OMP_EEA3, Calibration::shipped()).calls.len();
    assert!(steps * 2 < calls, "{steps} of {calls}");
    // From 2.1.200 the fill is the reply's billed output beyond its visible part, not the
    // fitted share (the share measures the stored summaries, not what is sent back).
    let mut full = Calibration::shipped();
    full.thinking_fill = [("2.1.200".to_owned(), 1.0)].into();
    let mut half = full.clone();
    half.thinking_fill = [("2.1.200".to_owned(), 0.5)].into();
    let context = |c: Calibration| replayed(OMP_EEA3, c).calls.last().unwrap().simulated_context();
    assert_eq!(context(half), context(full));
}

fn named(session: &str, project: &str) -> SessionFit {
    SessionFit {
        session: FittedSession { session: session.into(), project: project.into() },
        samples: BTreeMap::new(),
        user_context: None,
        prefix: None,
        thinking: Vec::new(),
    }
}

#[test]
fn no_fold_scores_a_session_with_a_fit_that_saw_it_or_its_project() {
    let fits = vec![named("a", "p"), named("b", "p"), named("c", "q"), named("d", "r")];
    for (held, train) in folds(&fits, Leave::Session) {
        assert!(!train.contains(&held));
        assert_eq!(train.len(), 3);
    }
    for (held, train) in folds(&fits, Leave::Project) {
        assert!(train.iter().all(|&i| fits[i].session.project != fits[held].session.project), "{held} {train:?}");
    }
    let fitted = fit_calibration(&[&fits[2], &fits[0]]);
    assert_eq!(fitted.fitted_on, vec![fits[0].session.clone(), fits[2].session.clone()]);
    assert!(fitted.source.contains("2 sessions of 2 projects (p, q)"), "{}", fitted.source);
    assert_eq!(version_group("2.1.199"), "<=2.1.199");
    assert_eq!(version_group("2.1.200"), ">=2.1.200");
}

#[test]
fn fit_and_cross_validation_on_the_command_line_record_what_was_fitted() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cal.json");
    let a6e4 = path("entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    let spotter = path("spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim"))
        .args(["fidelity", "--fit"])
        .arg(&out)
        .arg(&a6e4)
        .arg(&spotter)
        .args(["--cross-validate", "project"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let fitted = Calibration::load(&out).unwrap();
    let projects: std::collections::BTreeSet<&str> = fitted.fitted_on.iter().map(|f| f.project.as_str()).collect();
    assert_eq!(projects, ["entireio-cli", "spotter"].into());
    assert!(fitted.source.contains("2 sessions of 2 projects"), "{}", fitted.source);
    assert!(stdout.starts_with("leave-one-project-out"), "{stdout}");
    assert!(stdout.contains("1 sessions of 1 projects (not entireio-cli)") && stdout.contains("1 sessions of 1 projects (not spotter)"), "{stdout}");
    assert!(stdout.contains("<=2.1.199"), "{stdout}");
}

fn ctxsim_stdout(args: &[&std::ffi::OsStr]) -> String {
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim")).args(args).output().unwrap();
    assert!(run.status.success(), "{args:?}: {}", String::from_utf8_lossy(&run.stderr));
    String::from_utf8(run.stdout).unwrap()
}

/// `--cross-validate` through the agent (issue 13): each held-out session is driven through the
/// agent under its fold's calibration, and scores exactly as `fidelity --engine agent
/// --calibration` with a calibration `--fit` on the fold's other sessions; the table says what
/// scored, and adds the agent's compaction triggers per held-out session.
#[test]
fn cross_validation_through_the_agent_scores_each_session_under_its_folds_fit() {
    let a6e4 = path("entireio-cli/a6e4c2a0fbd1-0.full.jsonl");
    let e7662 = path("entireio-cli/7662d755ef9f-2.full.jsonl");
    let numwordify = path(NUMWORDIFY);
    let os = |s: &str| std::ffi::OsString::from(s);
    let mut args = vec![os("fidelity"), a6e4.clone().into(), e7662.clone().into(), numwordify.clone().into()];
    args.extend(["--engine", "agent", "--cross-validate", "session", "--format", "json"].map(os));
    let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let cv: serde_json::Value = serde_json::from_str(&ctxsim_stdout(&refs)).unwrap();
    assert_eq!(cv["engine"], "agent");
    assert_eq!(cv["leave"], "session");
    let scored = cv["scored"].as_array().unwrap();
    assert_eq!(scored.len(), 3);
    // a6e4 held out: the calibration of its fold is the fit on the other two.
    let held = scored.iter().find(|s| s["session"]["session"] == "a6e4c2a0fbd1-0.full.jsonl").unwrap();
    assert_eq!(held["fitted_on"].as_array().unwrap().len(), 2);
    let report = &held["report"];
    assert!(report["agent"]["workload"]["main_replies"].as_u64().unwrap() > 0, "driven through the agent: {report}");
    assert_eq!(report["compaction_triggers"]["rows"][0]["verdict"], "matched", "{report}");
    let dir = tempfile::tempdir().unwrap();
    let fold = dir.path().join("fold.json");
    ctxsim_stdout(&[os("fidelity").as_os_str(), os("--fit").as_os_str(), fold.as_os_str(), e7662.as_os_str(), numwordify.as_os_str()]);
    let alone: serde_json::Value = serde_json::from_str(&ctxsim_stdout(&[
        os("fidelity").as_os_str(),
        a6e4.as_os_str(),
        os("--engine").as_os_str(),
        os("agent").as_os_str(),
        os("--calibration").as_os_str(),
        fold.as_os_str(),
        os("--format").as_os_str(),
        os("json").as_os_str(),
    ]))
    .unwrap();
    for figure in ["requests_compared", "context_tokens_mape", "context_tokens_ape_p90", "hit_agreement", "cache_read_total_error", "cache_creation_total_error", "cost_error"] {
        assert_eq!(report[figure], alone[figure], "{figure}");
    }
    // Per version group, pooled over the held-out sessions' calls.
    let groups = cv["groups"].as_array().unwrap();
    let calls: u64 = groups.iter().map(|g| g["calls"].as_u64().unwrap()).sum();
    let scored_calls: u64 = scored.iter().map(|s| s["report"]["requests_compared"].as_u64().unwrap()).sum();
    assert_eq!(calls, scored_calls);
    assert_eq!(groups.iter().map(|g| g["group"].as_str().unwrap()).collect::<Vec<_>>(), ["<=2.1.199", ">=2.1.200"]);
    // The table: what scored, what it was fitted on, and the agent's compactions per session.
    let mut args = vec![os("fidelity"), a6e4.into(), e7662.into(), numwordify.into()];
    args.extend(["--engine", "agent", "--cross-validate", "project"].map(os));
    let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let table = ctxsim_stdout(&refs);
    assert!(table.starts_with("leave-one-project-out: each session scored through the agent"), "{table}");
    assert!(table.contains("1 sessions of 1 projects (not entireio-cli)"), "{table}");
    assert!(table.contains("recorded vs the agent's own compactions"), "{table}");
    assert!(table.contains("recorded automatic compactions with their history: 2, predicted at the same call (±1) with preTokens within 3%:"), "{table}");
}
