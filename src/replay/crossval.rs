//! Cross-validation of the calibration fit: every session scored with a calibration fitted on
//! the others, leaving out one session or one whole project (the transcript's directory) at a
//! time, with figures per version group (≤ 2.1.199, ≥ 2.1.200: the targets of issue 16 hold
//! per group).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::measure::tokens::FittedSession;

use super::fidelity::{FidelityReport, SessionFit, figure_columns, fit_calibration};

/// What a fold leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Leave {
    Session,
    Project,
}

/// The version groups the targets hold in.
pub fn version_group(version: &str) -> &'static str {
    if super::parse_version(version) <= (2, 1, 199) { "<=2.1.199" } else { ">=2.1.200" }
}

/// One held-out session and the fit it was scored with.
#[derive(Debug, Clone, Serialize)]
pub struct Scored {
    pub session: FittedSession,
    pub version: String,
    pub group: &'static str,
    /// The sessions the calibration it was scored with was fitted on.
    pub fitted_on: Vec<FittedSession>,
    pub report: FidelityReport,
}

/// The figures of a version group: MAPE and p90 over every call of its sessions (pooled), the
/// median session MAPE and the worst session's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupFigures {
    pub group: String,
    pub sessions: usize,
    pub calls: usize,
    pub context_tokens_mape: f64,
    pub context_tokens_ape_p90: f64,
    pub median_session_mape: f64,
    pub worst_session_mape: f64,
}

/// The folds: for each session (or project), the indices of the fits trained on.
pub fn folds(fits: &[SessionFit], leave: Leave) -> Vec<(usize, Vec<usize>)> {
    (0..fits.len())
        .map(|held| {
            let out = |i: usize| match leave {
                Leave::Session => i == held,
                Leave::Project => fits[i].session.project == fits[held].session.project,
            };
            (held, (0..fits.len()).filter(|&i| !out(i)).collect())
        })
        .collect()
}

/// Scores every session with a calibration fitted on its fold's training sessions; `score`
/// replays session `i` with a calibration (through the agent), and its first error stops
/// the cross-validation.
pub fn cross_validate<E>(
    fits: &[SessionFit],
    versions: &[String],
    leave: Leave,
    mut score: impl FnMut(usize, &crate::measure::Calibration) -> Result<FidelityReport, E>,
) -> Result<Vec<Scored>, E> {
    folds(fits, leave)
        .into_iter()
        .map(|(held, train)| {
            let chosen: Vec<&SessionFit> = train.iter().map(|&i| &fits[i]).collect();
            let calibration = fit_calibration(&chosen);
            let report = score(held, &calibration)?;
            Ok(Scored {
                session: fits[held].session.clone(),
                version: versions[held].clone(),
                group: version_group(&versions[held]),
                fitted_on: calibration.fitted_on,
                report,
            })
        })
        .collect()
}

/// Per version group, pooled over the calls of its sessions (needs the per-call rows).
pub fn group_figures(scored: &[Scored]) -> Vec<GroupFigures> {
    let mut groups: BTreeMap<&str, Vec<&Scored>> = BTreeMap::new();
    for s in scored {
        groups.entry(s.group).or_default().push(s);
    }
    groups
        .into_iter()
        .map(|(group, sessions)| {
            let mut apes: Vec<f64> = sessions.iter().flat_map(|s| s.report.calls.iter().map(|c| c.context_ape)).collect();
            apes.sort_by(f64::total_cmp);
            let n = apes.len();
            let mut mapes: Vec<f64> = sessions.iter().map(|s| s.report.context_tokens_mape).collect();
            mapes.sort_by(f64::total_cmp);
            let median = match mapes.len() {
                0 => 0.0,
                k if k % 2 == 1 => mapes[k / 2],
                k => (mapes[k / 2 - 1] + mapes[k / 2]) / 2.0,
            };
            GroupFigures {
                group: group.to_owned(),
                sessions: sessions.len(),
                calls: n,
                context_tokens_mape: if n == 0 { 0.0 } else { apes.iter().sum::<f64>() / n as f64 },
                context_tokens_ape_p90: if n == 0 { 0.0 } else { apes[((n as f64 * 0.9).ceil() as usize).clamp(1, n) - 1] },
                median_session_mape: median,
                worst_session_mape: mapes.last().copied().unwrap_or(0.0),
            }
        })
        .collect()
}

/// The cross-validation as a table: a row per held-out session (what scored, through `engine`,
/// the agent) with what its calibration was fitted on, then the figures per version
/// group.
pub fn cross_validation_table(scored: &[Scored], leave: Leave, engine: &str) -> String {
    let what = match leave {
        Leave::Session => "leave-one-session-out",
        Leave::Project => "leave-one-project-out",
    };
    let mut out = format!("{what}: each session scored through the {engine} with a calibration fitted (`--fit`) on the sessions of the other folds\n");
    out.push_str(&format!(
        "{:<10} {:<14} {:<32} {:>8} {:>6} {:>7} {:>7} {:>7} {:>9} {:>9} {:>8}  {}\n",
        "group", "project", "session", "version", "calls", "mape%", "p90%", "hit%", "read%", "create%", "cost%", "fitted on"
    ));
    let all: BTreeSet<&str> = scored.iter().map(|s| s.session.project.as_str()).collect();
    for s in scored {
        let projects: BTreeSet<&str> = s.fitted_on.iter().map(|f| f.project.as_str()).collect();
        let missing: Vec<&str> = all.difference(&projects).copied().collect();
        out.push_str(&format!(
            "{:<10} {:<14} {:<32} {:>8} {}  {} sessions of {} projects{}\n",
            s.group,
            s.session.project.chars().take(14).collect::<String>(),
            s.session.session.chars().take(32).collect::<String>(),
            s.version,
            figure_columns(&s.report),
            s.fitted_on.len(),
            projects.len(),
            // Only a fold that holds a project's every session leaves that project out.
            if missing.is_empty() { String::new() } else { format!(" (not {})", missing.join(", ")) },
        ));
    }
    out.push_str("\nper version group (calls pooled)\n");
    out.push_str(&format!("{:<10} {:>8} {:>6} {:>7} {:>7} {:>14} {:>13}\n", "group", "sessions", "calls", "mape%", "p90%", "median_sess%", "worst_sess%"));
    for g in group_figures(scored) {
        out.push_str(&format!(
            "{:<10} {:>8} {:>6} {:>7.2} {:>7.2} {:>14.2} {:>13.2}\n",
            g.group,
            g.sessions,
            g.calls,
            g.context_tokens_mape * 100.0,
            g.context_tokens_ape_p90 * 100.0,
            g.median_session_mape * 100.0,
            g.worst_session_mape * 100.0
        ));
    }
    out
}
