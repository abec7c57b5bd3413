use anyhow::Context;

use crate::measure::{Calibration, EstimatorKind, Measurer, ModelTable, TokenCounter};
use crate::replay::crossval::{Leave, cross_validate, cross_validation_table, group_figures};
use crate::replay::{
    ReplayOptions, SessionFit, agent_triggers, agent_triggers_table, fidelity_calls_table, fidelity_for_session, fidelity_table, find_breaks, fit_calibration, load_session, session_fit,
    write_fidelity_plots, modelled_table,
};
use crate::replay::workload::agent_replay_with;
use crate::report::output::write_atomic;

use super::args::{FidelityArgs, FidelityFormat};

pub fn run(args: FidelityArgs, diag: &mut super::diag::Diagnostics) -> anyhow::Result<i32> {
    // A fit tokenizes with bpe whatever the estimator.
    super::common::warm_tokenizer(if args.fit.is_some() || args.cross_validate.is_some() { super::args::Estimator::Bpe } else { args.estimator });
    let table = ModelTable::shipped();
    let options = ReplayOptions {
        rerender_prompts: !args.no_rerender,
        side_entries: !args.no_side_entry,
        recorded_requests: !args.no_recorded_requests,
        ..ReplayOptions::default()
    };
    let files: Vec<std::path::PathBuf> = args.sessions.files()?.into_iter().map(|f| f.path).collect();
    let guarded = super::guard::Inputs::of(files.iter().chain(args.calibration.iter()));
    if let Some(out) = &args.fit {
        guarded.refuse_file("--fit", out)?;
    }
    let plot_dir = args.plot.as_deref().map(|d| super::guard::GuardedDir::begin("--plot", d, &guarded)).transpose()?;
    let mut sessions = Vec::new();
    // Per session: whether its notes already say that every ablation asked for changes nothing.
    let mut explained = Vec::new();
    for path in &files {
        let session = load_session(path).with_context(|| format!("failed to read {}", path.display()))?;
        diag.report(&session.report.warnings);
        let notes = ablation_notes(&session, &options);
        for note in &notes {
            eprintln!("note: {note} ({})", path.display());
        }
        explained.push(notes.len() == ablations(&options).len());
        sessions.push(session);
    }
    // What each session gives a fit: replayed once, shared by `--fit` and every fold.
    let fits: Vec<SessionFit> = if args.fit.is_some() || args.cross_validate.is_some() {
        files.iter().zip(&sessions).map(|(path, session)| session_fit(session, path, &table, &options)).collect()
    } else {
        Vec::new()
    };
    if let Some(out) = &args.fit {
        let calibration = fit_calibration(&fits.iter().collect::<Vec<_>>());
        let text = serde_json::to_string_pretty(&calibration)? + "\n";
        write_atomic(out, text.as_bytes()).with_context(|| format!("failed to write {}", out.display()))?;
    }
    if let Some(leave) = args.cross_validate {
        let leave = match leave {
            super::args::CrossValidate::Session => Leave::Session,
            super::args::CrossValidate::Project => Leave::Project,
        };
        let versions: Vec<String> = sessions
            .iter()
            .map(|s| s.calls.iter().find(|c| c.lane == crate::recording::format::LANE_MAIN).and_then(|c| c.version.clone()).unwrap_or_default())
            .collect();
        // Each session is scored once per fold kind (its own fold's calibration), so the only
        // work shared across folds is the fits above; through the agent each held-out session
        // is sized and driven under its fold's calibration, as `--calibration` would.
        let scored = cross_validate(&fits, &versions, leave, |i, calibration| -> anyhow::Result<_> {
            let counter = TokenCounter::with_calibration(EstimatorKind::Calibrated, calibration.clone());
            let mut measurer = Measurer::new(table.clone(), counter).without_body_hashes();
            Ok(score_session(&sessions[i], &mut measurer, &args, &options, &table, true)?.1)
        })?;
        match args.format {
            FidelityFormat::Json => {
                let groups = group_figures(&scored);
                let rows: Vec<serde_json::Value> = scored
                    .iter()
                    .map(|s| {
                        let mut report = s.report.clone();
                        report.calls.clear();
                        serde_json::json!({"session": s.session, "version": s.version, "group": s.group, "fitted_on": s.fitted_on, "report": report})
                    })
                    .collect();
                let engine = args.engine.name();
                outln!("{}", serde_json::to_string_pretty(&serde_json::json!({"leave": leave, "engine": engine, "scored": rows, "groups": groups}))?);
            }
            FidelityFormat::Table => {
                out!("{}", cross_validation_table(&scored, leave, args.engine.name()));
                // Each session's compactions under its fold's calibration.
                let triggers: Vec<(String, crate::replay::TriggerReport)> =
                    scored.iter().filter_map(|s| Some((s.report.input.clone(), s.report.compaction_triggers.clone()?))).collect();
                out!("\n{}", agent_triggers_table(&triggers));
            }
        }
        return Ok(0);
    }
    let calibration = match &args.calibration {
        Some(path) => Calibration::load(path)?,
        None => Calibration::shipped(),
    };
    let mut reports = Vec::new();
    let mut breaks = Vec::new();
    // Texts' `bpe` counts shared by every measurer of the run (the counts are the same either way).
    let shared = std::sync::Arc::new(crate::measure::token_cache::SharedCounts::default());
    for (session, explained) in sessions.iter().zip(&explained) {
        let counter = || TokenCounter::with_calibration(args.estimator.into(), calibration.clone()).with_shared(shared.clone());
        // Fidelity outputs compare usage; no trace rows, no fingerprints.
        let mut measurer = Measurer::new(table.clone(), counter()).without_body_hashes();
        let (replay, mut report) = score_session(session, &mut measurer, &args, &options, &table, args.calls || args.plot.is_some())?;
        // An ablation that changes no call says so (no silent non-answer): the run without it
        // is made once more and compared call by call.
        if !*explained {
            let mut plain = Measurer::new(table.clone(), counter()).without_body_hashes();
            let (whole, _) = score_session(session, &mut plain, &args, &ReplayOptions::default(), &table, true)?;
            if let Some(note) = unchanged_note(&options, &whole, &replay) {
                eprintln!("note: {note} ({})", report.input);
            }
        }
        if args.breaks {
            breaks.push((replay.input.clone(), find_breaks(&replay)));
        }
        if !args.interval {
            report.interval = None;
        }
        report.warnings = session.report.warnings.list.clone();
        reports.push(report);
    }
    if let Some(plot) = plot_dir {
        let written = write_fidelity_plots(plot.path(), &reports)?;
        let target = args.plot.clone().unwrap_or_default();
        plot.commit()?;
        for path in written {
            eprintln!("wrote {}", target.join(path.file_name().unwrap_or_default()).display());
        }
        if !args.calls {
            for report in &mut reports {
                report.calls.clear();
            }
        }
    }
    match args.format {
        FidelityFormat::Json => {
            // `--breaks` puts each session's breaks in its object (`breaks`).
            let mut values = Vec::new();
            for (i, report) in reports.iter().enumerate() {
                let mut value = serde_json::to_value(report)?;
                if let Some((_, rows)) = breaks.get(i) {
                    value["breaks"] = serde_json::to_value(rows)?;
                }
                values.push(value);
            }
            let text = if values.len() == 1 { serde_json::to_string_pretty(&values[0])? } else { serde_json::to_string_pretty(&values)? };
            outln!("{text}");
            return Ok(0);
        }
        FidelityFormat::Table => {
            out!("{}", fidelity_table(&reports));
            if let Some(line) = super::common::engine_line([args.engine.name()]) {
                outln!("{line}");
            }
            let triggers: Vec<(String, crate::replay::TriggerReport)> =
                reports.iter().filter_map(|r| Some((r.input.clone(), r.compaction_triggers.clone()?))).collect();
            out!("\n{}", agent_triggers_table(&triggers));
            out!("\n{}", crate::replay::fidelity::agent_lanes_table(&reports));
            out!("\n{}", modelled_table(&reports));
            if args.calls {
                for report in &reports {
                    out!("\n{}", fidelity_calls_table(report));
                }
            }
        }
    }
    for (input, rows) in &breaks {
        outln!("\nbreaks in {input}: {}", rows.len());
        for row in rows {
            outln!(
                "  #{:<4} {:<12} gap {:>6.1}s  cached {:>7} read {:>7} drop {:>7}  {:<18} predicted {:.2}",
                row.index,
                row.lane,
                row.gap_ms as f64 / 1000.0,
                row.previous_cached,
                row.cache_read,
                row.drop,
                row.cause,
                row.predicted
            );
        }
    }
    Ok(0)
}

/// Drives the agent by `session` (the ablations of `options` applied to the record it reads),
/// measured by `measurer`, and scores it: the fidelity figures, the compaction-trigger table
/// (the agent's own compactions) and how the session drove the agent. One definition for
/// `fidelity` and every fold of `--cross-validate`.
fn score_session(
    session: &crate::recording::ImportedSession,
    measurer: &mut Measurer,
    args: &FidelityArgs,
    options: &ReplayOptions,
    table: &ModelTable,
    with_calls: bool,
) -> anyhow::Result<(crate::replay::SessionReplay, crate::replay::FidelityReport)> {
    let strategy = crate::strategy::Strategy::resolve_with(&args.strategy, &[])?;
    let input = session.recording.header.input.clone().unwrap_or_default();
    let mut driven = agent_replay_with(session, &input, measurer, &strategy, options).map_err(|e| anyhow::anyhow!("{input}: {e}"))?;
    let mut replay = driven.replay.clone();
    if args.breaks || with_calls {
        // What the record shows before each call (a gap past the TTL, a new turn, a compaction,
        // a re-rendered prompt...) names the breaks' causes and the calls' events: the agent's
        // calls take them from the record view. The agent's sizing read that view (under these
        // options and a measurer of this one's calibration) and kept its events; only a session
        // it did not size (no compared main call) is read for them here.
        let events = match driven.record_events.take() {
            Some(events) => events,
            None => {
                let mut recorded = Measurer::new(table.clone(), measurer.counter().fresh_like()).without_body_hashes();
                crate::replay::record_view(session, &mut recorded, options).calls.into_iter().map(|c| (c.index, c.events)).collect()
            }
        };
        replay.add_record_events(&events);
    }
    let mut report = fidelity_for_session(&replay, table, with_calls);
    report.engine = Some(args.engine.name().to_owned());
    // The agent builds every request itself: a transcript's recorded requests are not measured.
    if let Some(recorded) = &mut report.recorded_requests {
        recorded.reconstructed = vec!["every call: the agent builds its own requests (the recorded ones size its unrecorded part)".to_owned()];
    }
    // The compactions are the agent's own.
    report.compaction_triggers = Some(agent_triggers(session, &replay, &driven.compactions, driven.report.recorded_usage > 0, table, &Default::default()));
    report.agent = Some(crate::replay::fidelity::AgentDriven {
        workload: driven.report,
        compactions: driven.compactions,
        unpaired: driven.unpaired,
        sizing: driven.sizing,
        lanes: crate::replay::fidelity::lane_figures(&replay, table),
    });
    Ok((replay, report))
}

/// The ablations `options` asks for, as their flags.
fn ablations(options: &ReplayOptions) -> Vec<&'static str> {
    [("--no-rerender", !options.rerender_prompts), ("--no-side-entry", !options.side_entries), ("--no-recorded-requests", !options.recorded_requests)]
        .into_iter()
        .filter_map(|(flag, on)| on.then_some(flag))
        .collect()
}

/// The note for ablations that changed no call of a session: `whole` (the run without them)
/// and `ablated` give every call the same usage. Says how often the record shows what each
/// left out (from `whole`'s call events).
fn unchanged_note(options: &ReplayOptions, whole: &crate::replay::SessionReplay, ablated: &crate::replay::SessionReplay) -> Option<String> {
    let usage = |replay: &crate::replay::SessionReplay| -> Vec<(usize, u64, u64, u64)> {
        replay.calls.iter().filter_map(|c| Some((c.index, c.metrics.as_ref()?.input_tokens, c.metrics.as_ref()?.cache_read_input_tokens, c.metrics.as_ref()?.cache_creation_input_tokens))).collect()
    };
    if usage(whole) != usage(ablated) {
        return None;
    }
    let shown = |events: &[&str]| whole.calls.iter().filter(|c| c.events.iter().any(|e| events.contains(&e.as_str()))).count();
    let flags = ablations(options);
    let what: Vec<String> = flags
        .iter()
        .map(|flag| match *flag {
            "--no-rerender" => format!("the record shows {} calls after a re-rendered prompt or conversation start", shown(&["turn_rerender", "rerendered_prompt"])),
            "--no-side-entry" => format!("the record shows {} calls after a side entry", shown(&["side_entry"])),
            _ => "the recorded requests size only the agent's unrecorded part, to the same sizes as the reconstructed ones".to_owned(),
        })
        .collect();
    Some(format!(
        "{} {} nothing: the agent's run gives every call the same usage without {} ({})",
        flags.join(", "),
        if flags.len() == 1 { "changes" } else { "change" },
        if flags.len() == 1 { "the rule" } else { "the rules" },
        what.join("; ")
    ))
}

/// Where an ablation of `options` changes nothing on `session`, why (said once per file): the
/// record holds no api-request records, or no recorded version has the rule left out.
fn ablation_notes(session: &crate::recording::ImportedSession, options: &ReplayOptions) -> Vec<String> {
    let entrypoint = session.recording.header.entrypoint.as_deref();
    let profiles: Vec<crate::replay::ClientProfile> = session
        .calls
        .iter()
        .filter(|c| c.lane == crate::recording::format::LANE_MAIN)
        .map(|c| c.version.as_deref().unwrap_or_default())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .map(|version| crate::replay::ClientProfile::for_client(version, entrypoint))
        .collect();
    let mut notes = Vec::new();
    if !options.recorded_requests && session.api_requests.requests.is_empty() {
        notes.push("--no-recorded-requests has no effect: the session records no api requests (no api-request records)".to_owned());
    }
    let rerenders = |p: &crate::replay::ClientProfile| p.rerender_opening_prompt || p.rerender_typed_prompts || p.turn_rerenders_start || p.queued_across_compaction_rerenders_start;
    if !options.rerender_prompts && !profiles.iter().any(rerenders) {
        notes.push("--no-rerender has no effect: no recorded version of the session re-renders a prompt or the conversation start".to_owned());
    }
    if !options.side_entries && !profiles.iter().any(|p| p.post_turn_side_entry) {
        notes.push("--no-side-entry has no effect: no recorded version of the session leaves a side entry after a turn".to_owned());
    }
    notes
}
