//! `ctxsim audit`: per real session, what was billed, where the cache money went and what a
//! setting would have saved.
//!
//! Per session ([`SessionAudit`]):
//! - the billed tokens and cost of every recorded call ([`crate::measure::billing`]: the usage's
//!   own sums, priced with the model table and the modifiers the usage names);
//! - the recorded cache breaks ([`super::breaks::find_breaks`], from the recorded usage) by
//!   cause, with the tokens the break made the client write again and their dollars: those
//!   tokens priced as the cache write they were (5m or 1h, the call's own TTL and modifiers)
//!   minus the read they would have been;
//! - the TTL the client actually wrote with, the compactions (trigger, tokens before);
//! - the what-ifs, through the agent ([`WHATIFS_AGENT`]; as `compare`, `sweep` and `check`):
//!   the session drives the agent ([`super::agent_whatif`]) as recorded (the recorded version's
//!   defaults) and under each what-if; saving = the run as recorded's simulated cost − the
//!   what-if run's. The main lane's TTL changed; another autocompact threshold
//!   ([`AUTOCOMPACT_PCTS`], one family sharing the trunk: a threshold the session never reaches
//!   is said to change nothing); the preset of lowest cost at no more information loss (no more
//!   references lost or re-reads over its compactions, [`agent_info_loss`], and no more tokens
//!   taken from the model's view by any stage) among every preset but
//!   [`AGENT_PRESETS_LEFT_OUT`]. Each what-if whose conversation parts from the recording says
//!   from which call and why. The run as recorded goes first: a preset stops once it has
//!   dropped more tokens or refused more requests than the run as recorded did over the whole
//!   session ([`crate::runner::StopRule`]; it is out of the running, `excluded` or
//!   `not_comparable`, unpriced), whether it runs on its own or goes on from the run as
//!   recorded's trunk ([`super::agent_whatif::Stops`]).
//!
//! Everything reaching output is sorted (sessions: largest loss first, then path), so the
//! result does not depend on the order sessions were processed in.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::api::{CacheCreation, CacheTtl, Usage};
use crate::measure::billing::{Bill, BilledTokens, bill_call};
use crate::measure::models::LastLookup;
use crate::measure::{Measurer, ModelTable};
use crate::recording::format::WarningKind;
use crate::recording::{EventKind, ImportedSession, RecordedCall};

use super::discover::SessionFile;
use super::session::ReplayOptions;
pub use crate::report::compare::Engine;

/// What-ifs the audit runs through the agent (the only engine).
pub const WHATIFS_AGENT: &str = "main-lane TTL (1h, 5m), autocompact threshold (CLAUDE_AUTOCOMPACT_PCT_OVERRIDE 50, 70, 90), the cheapest preset at no more information loss (every preset of `ctxsim strategies`, but claude-code, the run as recorded, claude-code-1h, the 1h TTL, and claude-code-env)";

/// The what-ifs the audit runs under `engine`.
pub fn whatifs_available(engine: Engine) -> &'static str {
    match engine {
        Engine::Agent => WHATIFS_AGENT,
    }
}

/// How a what-if the agent could not run says so (`not_comparable`, and a warning).
const NOT_JUDGED: &str = "not judged";

/// The `CLAUDE_AUTOCOMPACT_PCT_OVERRIDE` values the audit tries: the threshold at that share of
/// the window less the output reserve, capped at the client's own (so each one compacts
/// earlier than the default; 90 is just under it on a 200k window, 50 is the value users ask
/// about for 1M windows).
pub const AUTOCOMPACT_PCTS: [u64; 3] = [50, 70, 90];

/// Breaks of one cause.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CauseLoss {
    pub breaks: u64,
    /// Tokens written again that were cached before the break.
    pub tokens: u64,
    #[serde(deserialize_with = "crate::input::exact_f64")]
    pub cost_usd: f64,
}

impl CauseLoss {
    fn add(&mut self, other: &CauseLoss) {
        self.breaks += other.breaks;
        self.tokens += other.tokens;
        self.cost_usd += other.cost_usd;
    }
}

/// A recorded compaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactionRow {
    pub time: String,
    /// `auto` or `manual`.
    pub trigger: String,
    pub pre_tokens: Option<u64>,
}

/// A what-if and what it would have changed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WhatIf {
    /// `ttl_main=1h`, ...
    pub name: String,
    /// Simulated cost as recorded minus simulated cost under the what-if (positive: cheaper).
    #[serde(deserialize_with = "crate::input::exact_f64")]
    pub saving_usd: f64,
    /// Of the billed cost.
    #[serde(deserialize_with = "crate::input::exact_f64")]
    pub saving_pct: f64,
    /// Why the what-if changes nothing on the session (then the saving is 0 and nothing was
    /// replayed for it, or the replay moved nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_effect: Option<String>,
    /// The what-if's information loss (references lost + re-reads over its compactions,
    /// [`super::loss`]) less the recording's. Through the agent: the what-if run's loss less the
    /// run as recorded's ([`agent_info_loss`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info_loss_delta: Option<i64>,
    /// Through the agent: the tokens that left the model's view under the what-if (any stage:
    /// compaction, masking, pruning, clearing) less under the run as recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_dropped_delta: Option<i64>,
    /// Through the agent: why the what-if's run cannot be priced against the run as recorded
    /// (it refused requests at the blocking limit); then the saving is 0 and it is not weighed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_comparable: Option<String>,
    /// Through the agent: why a preset is out of the running for the `preset` what-if before
    /// its run ended (it took more tokens from the model's view than the run as recorded did
    /// over the whole session); its run stopped there, so no saving is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub excluded: Option<String>,
    /// Through the agent: the first main call from which the what-if's conversation is no
    /// longer the recorded one (the recorded replies continue from there)...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diverges_from: Option<usize>,
    /// ... and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub divergence: Option<String>,
}

impl WhatIf {
    fn unchanged(name: String, why: String) -> WhatIf {
        WhatIf { name, no_effect: Some(why), ..WhatIf::default() }
    }
}

/// Why a what-if whose run gave the run as recorded's results changes nothing.
pub const SAME_RESULTS: &str = "the same results as the run as recorded on this session (cost, compactions, tokens dropped): nothing it changes occurs here";

/// Presets the agent engine does not weigh: `claude-code` is the run as recorded (the recorded
/// version's defaults), `claude-code-1h` is the `ttl_main=1h` what-if, `claude-code-env` takes
/// the process environment (the audit's output does not depend on it; the autocompact what-ifs
/// are its thresholds).
pub const AGENT_PRESETS_LEFT_OUT: [&str; 3] = ["claude-code", "claude-code-1h", "claude-code-env"];

/// A run's information loss through the agent: the references its compactions dropped that the
/// session used later and the re-reads after them ([`super::loss`], as the replay engine counts
/// them).
pub fn agent_info_loss(outcome: &super::agent_whatif::AgentOutcome) -> i64 {
    outcome.compaction_losses.iter().map(|l| (l.references_lost + l.rereads) as i64).sum()
}

/// What the audit keeps of one agent run.
#[derive(Debug, Clone, PartialEq)]
struct AgentRun {
    cost_usd: f64,
    loss: i64,
    /// Tokens that left the model's view, by any stage ([`crate::measure::loss::InfoLoss`]).
    tokens_dropped: u64,
    /// Requests the agent refused at the blocking limit.
    blocked: u64,
    /// (call, stage) of each compaction.
    compactions: Vec<(usize, String)>,
    divergence: Option<(usize, String)>,
    /// Where a stop rule ended the run, and why ([`super::agent_whatif::AgentOutcome::stopped`]).
    stopped: Option<(usize, crate::runner::Stopped)>,
}

impl AgentRun {
    fn of(outcome: &super::agent_whatif::AgentOutcome) -> AgentRun {
        AgentRun {
            cost_usd: outcome.summary.cost_usd,
            loss: agent_info_loss(outcome),
            tokens_dropped: outcome.info_loss.tokens_dropped,
            blocked: outcome.summary.blocked,
            compactions: outcome.compactions.iter().map(|c| (c.call, c.stage.clone())).collect(),
            divergence: outcome.divergence.clone(),
            stopped: outcome.stopped,
        }
    }

    /// [`AgentRun::whatif`], or, when the run gave what `base` gave (cost, information loss,
    /// tokens dropped, compactions, divergence), the what-if priced at no change and said to
    /// change nothing on the session, as `compare` says of a strategy with the same results.
    fn whatif_or_same(&self, name: String, base: &AgentRun, billed_usd: f64) -> WhatIf {
        let mut whatif = self.whatif(name, base, billed_usd);
        if self == base {
            whatif.no_effect = Some(SAME_RESULTS.to_owned());
        }
        whatif
    }

    /// The what-if `name` priced against `base` (the run as recorded). A run that refused more
    /// requests at the blocking limit than `base` did not do the session's work: its cost is
    /// no saving, and it is said not to be comparable. A run a stop rule ended is out of the
    /// running (more tokens dropped: `excluded`; more requests refused: not comparable), with
    /// no saving.
    fn whatif(&self, name: String, base: &AgentRun, billed_usd: f64) -> WhatIf {
        let diverges_from = self.divergence.as_ref().map(|(call, _)| *call);
        let divergence = self.divergence.as_ref().map(|(_, why)| why.clone());
        match self.stopped {
            Some((call, crate::runner::Stopped::TokensDropped { dropped, above })) => {
                let why = format!(
                    "out of the running from call {call}: by then it had taken {dropped} tokens from the model's view, more than the run as recorded over the whole session ({above}); its run stopped there (`ctxsim compare --strategies` runs it to the end)"
                );
                return WhatIf { name, excluded: Some(why), diverges_from, divergence, ..WhatIf::default() };
            }
            Some((call, crate::runner::Stopped::Refused { refused, above })) => {
                let why = format!(
                    "the agent refused {refused} requests at the blocking limit under it by call {call} ({above} as recorded over the whole session): the session's work was not done; its run stopped there"
                );
                return WhatIf { name, not_comparable: Some(why), diverges_from, divergence, ..WhatIf::default() };
            }
            None => {}
        }
        if self.blocked > base.blocked {
            let why = format!(
                "the agent refused {} requests at the blocking limit under it ({} as recorded): the session's work was not done",
                self.blocked, base.blocked
            );
            return WhatIf { name, not_comparable: Some(why), diverges_from, divergence, ..WhatIf::default() };
        }
        let saving = base.cost_usd - self.cost_usd;
        WhatIf {
            name,
            saving_usd: saving,
            saving_pct: pct(saving, billed_usd),
            info_loss_delta: Some(self.loss - base.loss),
            tokens_dropped_delta: Some(self.tokens_dropped as i64 - base.tokens_dropped as i64),
            diverges_from,
            divergence,
            ..WhatIf::default()
        }
    }
}

/// The what-ifs of one session through the agent ([`super::agent_whatif`]), each saving the run
/// as recorded (the recorded version's defaults, [`super::agent_whatif::effective_strategy`])
/// less the run under the what-if: the main-lane TTLs of `ttls`, the autocompact thresholds
/// ([`AUTOCOMPACT_PCTS`]) and every preset but [`AGENT_PRESETS_LEFT_OUT`] (the `preset` what-if:
/// the cheapest at no more information loss: [`agent_info_loss`] and the tokens dropped). Strategies with one effective
/// setting are one run; strategies that differ only in their autocompact threshold are one
/// family ([`super::agent_whatif::agent_whatif_family`]: a threshold the session never reaches
/// costs no run of its own), which the presets that are peer branches of the run as recorded
/// join ([`super::agent_whatif::peer_branch_of`]: each goes on from its trunk up to the first
/// step where it would act otherwise); families run in parallel. Returns the what-ifs, every preset
/// weighed, and where the run as recorded parts from the recording.
fn agent_whatifs(
    file: &SessionFile,
    session: &ImportedSession,
    make: &(dyn Fn() -> Measurer + Sync),
    ttls: &[(&str, CacheTtl)],
    billed_usd: f64,
) -> Result<AgentWhatIfs, String> {
    use super::agent_whatif::{Stops, agent_whatif_family_until, effective_strategy, family_key, idle_knobs_cleared, mirror_of, peer_branch_of, prepare, strategy_key, thresholds_of};
    use crate::runner::StopRule;
    use crate::strategy::Strategy;
    use rayon::prelude::*;
    let name = file.path.display().to_string();
    let mut prepared = prepare(session, &name, &make())?;
    // (The audit reads only the counts of the compaction losses, [`agent_info_loss`].)
    prepared.losses = super::loss::Judgement::Counts;
    let base = effective_strategy(&Strategy::default(), &prepared);
    enum Kind {
        AsRecorded,
        Ttl,
        Autocompact(u64),
        Preset,
    }
    let mut candidates: Vec<(String, Kind, Strategy)> = vec![(String::new(), Kind::AsRecorded, base.clone())];
    for (label, ttl) in ttls {
        // Set over the effective strategy: a TTL equal to the default one would otherwise give
        // way to the recorded one.
        let mut strategy = base.clone();
        strategy.ttl_main = (*ttl).into();
        candidates.push(((*label).to_owned(), Kind::Ttl, strategy));
    }
    for pct in AUTOCOMPACT_PCTS {
        let mut strategy = Strategy::default();
        strategy.compact.autocompact.pct_override = Some(pct);
        candidates.push((format!("autocompact_pct={pct}"), Kind::Autocompact(pct), effective_strategy(&strategy, &prepared)));
    }
    for preset in crate::strategy::presets::PRESETS.iter().filter(|p| !AGENT_PRESETS_LEFT_OUT.contains(&p.id)) {
        let strategy = Strategy::preset(preset.id).map_err(|e| format!("preset {}: {e}", preset.id))?;
        candidates.push((format!("preset={}", preset.id), Kind::Preset, effective_strategy(&strategy, &prepared)));
    }
    // One run per effective setting, a knob with nothing to act on in this session left out
    // (the what-if says it changes nothing here, from the run as recorded's own results); the
    // runs grouped by family (a refused strategy alone).
    let keys: Vec<String> = candidates.iter().map(|(_, _, s)| strategy_key(s, &prepared)).collect();
    // (A strategy with no idle knob is its own run: its key is the one above.)
    let run_keys: &Vec<String> = &candidates
        .iter()
        .zip(&keys)
        .map(|((_, _, s), key)| match idle_knobs_cleared(s, &prepared) {
            std::borrow::Cow::Borrowed(same) => {
                debug_assert_eq!(*key, strategy_key(same, &prepared), "a strategy's run key, with no idle knob cleared");
                key.clone()
            }
            std::borrow::Cow::Owned(cleared) => strategy_key(&cleared, &prepared),
        })
        .collect();
    // A preset that runs a peer mechanism with autocompact off (one that rewrites nothing below
    // a count, or one the trunk runs dry), or has the server clear old tool uses, goes on from
    // the run as recorded's trunk ([`super::agent_whatif::peer_branch_of`]); the other
    // main-lane TTL, the system prompt without the boundary and, where the workload runs no
    // ToolSearch, every tool sent up front are measured beside it
    // ([`super::agent_whatif::mirror_of`]).
    let base_family = family_key(&base, &prepared);
    let mut families: BTreeMap<String, BTreeMap<String, Strategy>> = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    for ((_, _, strategy), key) in candidates.iter().zip(run_keys) {
        // (A run is made once, under the first strategy that makes it, in that one's family.)
        if !seen.insert(key) {
            continue;
        }
        let family = match &base_family {
            Some(family) if peer_branch_of(strategy, &base, &prepared).is_some() || mirror_of(strategy, &base, &prepared).is_some() => Some(family.clone()),
            _ => family_key(strategy, &prepared),
        };
        let family = family.unwrap_or_else(|| format!("refused {key}"));
        families.entry(family).or_default().entry(key.clone()).or_insert_with(|| strategy.clone());
    }
    let families: Vec<Vec<(String, Strategy)>> = families.into_values().map(|f| f.into_iter().collect()).collect();
    let run_family = |family: &Vec<(String, Strategy)>, stop: Stops<'_>| {
        let effectives: Vec<Strategy> = family.iter().map(|(_, s)| s.clone()).collect();
        let outcomes = agent_whatif_family_until(session, &name, &prepared, make(), &effectives, stop).unwrap_or_else(|e| family.iter().map(|_| Err(e.clone())).collect());
        family.iter().zip(outcomes).map(|((key, _), outcome)| (key.clone(), outcome.map(|o| AgentRun::of(&o)))).collect::<Vec<_>>()
    };
    // The run as recorded's family first: a preset run on its own is out of the running once it
    // has taken more tokens from the model's view than the run as recorded did over the whole
    // session, or refused more requests (both counts only grow), and its run stops there
    // ([`StopRule`]): the preset what-if is the cheapest at no more loss, which that preset can
    // no longer be, whatever its cost.
    // (A key some other what-if shares runs to the end.)
    let preset_only = |key: &String| candidates.iter().zip(run_keys).filter(|(_, k)| *k == key).all(|((_, kind, _), _)| matches!(kind, Kind::Preset));
    let (first, rest): (Vec<&Vec<(String, Strategy)>>, Vec<&Vec<(String, Strategy)>>) = families.iter().partition(|f| f.iter().any(|(key, _)| *key == run_keys[0]));
    // Its own family's presets go on from its trunk once the run as recorded has made the
    // rule, and stop as the presets run on their own do.
    let mut runs: BTreeMap<String, Result<AgentRun, String>> = first
        .iter()
        .flat_map(|family| {
            let bounded: Vec<bool> = family.iter().map(|(key, _)| *key != run_keys[0] && preset_only(key)).collect();
            match family.iter().position(|(key, _)| *key == run_keys[0]) {
                Some(base) => run_family(family, Stops::BeyondRunOf { base, bounded: &bounded }),
                None => run_family(family, Stops::Never),
            }
        })
        .collect();
    let stop = match runs.get(&run_keys[0]) {
        Some(Ok(base)) => Some(StopRule { tokens_dropped_above: base.tokens_dropped, refused_above: base.blocked }),
        _ => None,
    };
    // (A family of several runs elsewhere runs to the end: its branches go on from its trunk.)
    runs.extend(
        rest.par_iter()
            .with_max_len(1)
            .flat_map_iter(|family| {
                let bounded = family.len() == 1 && family.iter().all(|(key, _)| preset_only(key));
                run_family(family, stop.filter(|_| bounded).map_or(Stops::Never, Stops::Rule))
            })
            .collect::<Vec<_>>(),
    );
    let run_of = |key: &String| runs.get(key).cloned().unwrap_or_else(|| Err("no run".to_owned()));
    let as_recorded = run_of(&run_keys[0]).map_err(|e| format!("the run as recorded: {e}"))?;
    let base_threshold = thresholds_of(&base, &prepared).autocompact;
    // (Session memory compaction fires at the autocompact threshold too.)
    let auto_compacted = |run: &AgentRun| run.compactions.iter().any(|(_, stage)| stage == "autocompact" || stage == "session_memory_compact");
    let mut whatifs = Vec::new();
    let mut presets = Vec::new();
    for (((label, kind, strategy), key), run_key) in candidates.iter().zip(&keys).zip(run_keys).skip(1) {
        if *key == keys[0] {
            let whatif = WhatIf::unchanged(label.clone(), "the same settings as the run as recorded on this session".to_owned());
            match kind {
                Kind::Preset => presets.push(whatif),
                _ => whatifs.push(whatif),
            }
            continue;
        }
        let run = match run_of(run_key) {
            Ok(run) => run,
            Err(e) => {
                // Not judged is no answer: not "no effect" (counted as unchanged), but not
                // comparable, and a warning of the session (stderr, exit code).
                let whatif = WhatIf { name: label.clone(), not_comparable: Some(format!("{NOT_JUDGED}: the agent could not run it ({e})")), ..WhatIf::default() };
                match kind {
                    Kind::Preset => presets.push(whatif),
                    _ => whatifs.push(whatif),
                }
                continue;
            }
        };
        match kind {
            Kind::AsRecorded => {}
            Kind::Ttl => whatifs.push(run.whatif_or_same(label.clone(), &as_recorded, billed_usd)),
            Kind::Autocompact(pct) => {
                let threshold = thresholds_of(strategy, &prepared).autocompact;
                let whatif = if run.compactions == as_recorded.compactions && run.cost_usd == as_recorded.cost_usd {
                    let why = if !auto_compacted(&run) {
                        format!("the session never reaches the threshold ({threshold} tokens at {pct}%; the agent's own is {base_threshold})")
                    } else {
                        "the setting compacts where the run as recorded did".to_owned()
                    };
                    WhatIf::unchanged(label.clone(), why)
                } else {
                    run.whatif(label.clone(), &as_recorded, billed_usd)
                };
                whatifs.push(whatif);
            }
            Kind::Preset => presets.push(run.whatif_or_same(label.clone(), &as_recorded, billed_usd)),
        }
    }
    // The preset of lowest cost at no more information loss: no more references lost or re-reads
    // over its compactions, and no more tokens taken from the model's view (what a preset that
    // clears outside a compaction removes). Only a preset that saves is a candidate: one that
    // costs what the run as recorded cost is no cheaper, one that costs more is dearer than the
    // default itself.
    let no_more_loss = |w: &WhatIf| w.info_loss_delta.is_some_and(|d| d <= 0) && w.tokens_dropped_delta.is_some_and(|d| d <= 0);
    let best = presets
        .iter()
        .filter(|w| w.no_effect.is_none() && w.not_comparable.is_none() && w.excluded.is_none() && no_more_loss(w) && w.saving_usd > 0.0)
        .max_by(|a, b| a.saving_usd.total_cmp(&b.saving_usd).then_with(|| b.name.cmp(&a.name)))
        .cloned();
    whatifs.push(best.unwrap_or_else(|| {
        WhatIf::unchanged("preset".to_owned(), format!("no preset of the {} weighed saves at no more information loss", presets.len()))
    }));
    let divergence = as_recorded.divergence.map(|(call, why)| format!("from call {call}: {why}"));
    Ok(AgentWhatIfs { whatifs, presets, divergence })
}

/// A session's what-ifs through the agent: the what-ifs, every preset weighed, and where the run
/// as recorded parts from the recording.
struct AgentWhatIfs {
    whatifs: Vec<WhatIf>,
    presets: Vec<WhatIf>,
    divergence: Option<String>,
}

/// One day's share of a session (UTC days).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DayShare {
    pub calls: u64,
    pub tokens: BilledTokens,
    #[serde(deserialize_with = "crate::input::exact_f64")]
    pub cost_usd: f64,
    /// Breaks by cause.
    pub breaks: BTreeMap<String, CauseLoss>,
}

/// One call of the main lane, for the context-per-call plot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlotPoint {
    pub call: usize,
    pub context_tokens: u64,
    /// The cause, when the call is a recorded break.
    pub break_cause: Option<String>,
}

/// The audit of one session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionAudit {
    /// What ran the what-ifs: `agent` or `replay` ([`Engine::name`]).
    #[serde(skip_deserializing)]
    pub engine: &'static str,
    pub project: String,
    pub session_id: String,
    pub path: String,
    pub first: Option<String>,
    pub last: Option<String>,
    pub versions: Vec<String>,
    pub models: Vec<String>,
    /// Calls the API billed (synthetic replies left out).
    pub calls: u64,
    pub billed: Bill,
    pub breaks: BTreeMap<String, CauseLoss>,
    pub lost: CauseLoss,
    /// Cache-write tokens by TTL, over every call.
    pub ttl_written: CacheCreation,
    /// `1h`, `5m`, `1h+5m` or `none`: the TTLs the client wrote with.
    pub ttl: String,
    pub compactions: Vec<CompactionRow>,
    /// Every what-if evaluated, and the best one (largest saving) when any saves.
    pub whatifs: Vec<WhatIf>,
    pub best_whatif: Option<WhatIf>,
    /// Through the agent: every preset weighed for the `preset` what-if, with its saving,
    /// information loss and divergence (the what-if is the cheapest at no more loss).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub presets: Vec<WhatIf>,
    /// Through the agent: where the run as recorded (the recorded version's defaults) itself
    /// parts from the recording (`from call N: why`), when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_divergence: Option<String>,
    pub days: BTreeMap<String, DayShare>,
    /// Import warnings (file, line, field), to be reported.
    pub warnings: Vec<String>,
    #[serde(skip)]
    pub plot: Vec<PlotPoint>,
}

fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { 100.0 * part / whole } else { 0.0 }
}

fn iso(epoch_ms: i64) -> String {
    jiff::Timestamp::from_millisecond(epoch_ms).map(|t| t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()).unwrap_or_default()
}

/// The cost of `tokens` re-created as cache writes instead of read, at the call's prices.
fn break_cost(table: &ModelTable, model: &str, usage: &Usage, tokens: u64, ttl: CacheTtl) -> f64 {
    let extra = usage.extra.clone();
    let (w5, w1) = if ttl == CacheTtl::OneHour { (0, tokens) } else { (tokens, 0) };
    let written = Usage {
        cache_creation_input_tokens: tokens,
        cache_creation: Some(CacheCreation { ephemeral_5m_input_tokens: w5, ephemeral_1h_input_tokens: w1 }),
        extra: extra.clone(),
        ..Usage::default()
    };
    let read = Usage { cache_read_input_tokens: tokens, extra, ..Usage::default() };
    match (bill_call(table, model, &written), bill_call(table, model, &read)) {
        (Ok(w), Ok(r)) => w.cost_usd - r.cost_usd,
        _ => 0.0,
    }
}

/// The billed tokens and cost of a session's calls (synthetic replies left out).
pub fn bill_session(session: &ImportedSession, table: &ModelTable) -> Bill {
    let mut bill = Bill::default();
    let mut lookup = LastLookup::default();
    for call in session.calls.iter().filter(|c| !c.is_synthetic) {
        bill.add_call(table, &mut lookup, &call.model, &call.usage);
    }
    bill
}

/// Audits one imported session: bills it, names its breaks from the record view, and runs it
/// through the agent as recorded and under each what-if ([`agent_whatifs`]).
pub fn audit_session(file: &SessionFile, session: &ImportedSession, table: &ModelTable, make: &(dyn Fn() -> Measurer + Sync), engine: Engine) -> SessionAudit {
    let start = session.recording.header.start_epoch_ms.unwrap_or(0);
    // Calls at their written time; the importer's virtual time never goes below the first record's.
    let written = super::discover::call_times_of(&file.path, session);
    let epoch_of = |call: &RecordedCall| {
        let key = (call.message_id.clone().unwrap_or_default(), call.request_id.clone().unwrap_or_default());
        written.get(&key).copied().unwrap_or(start + call.time_ms as i64)
    };
    let call_epoch: BTreeMap<usize, i64> = session.calls.iter().map(|c| (c.index, epoch_of(c))).collect();
    let day_of = |index: usize| iso(call_epoch.get(&index).copied().unwrap_or(start)).get(..10).unwrap_or("").to_owned();
    let mut billed = Bill::default();
    let mut days: BTreeMap<String, DayShare> = BTreeMap::new();
    let mut versions = Vec::new();
    let mut models = Vec::new();
    let mut ttl_written = CacheCreation::default();
    let mut first_last: Option<(i64, i64)> = None;
    let mut lookup = LastLookup::default();
    for call in session.calls.iter().filter(|c| !c.is_synthetic) {
        let mut one = Bill::default();
        one.add_call(table, &mut lookup, &call.model, &call.usage);
        billed.merge(&one);
        let day = days.entry(day_of(call.index)).or_default();
        day.calls += 1;
        day.tokens.add(&one.tokens);
        day.cost_usd += one.cost_usd;
        if let Some(v) = &call.version
            && !versions.contains(v)
        {
            versions.push(v.clone());
        }
        let nested = crate::measure::billing::nested_usages(&call.usage).into_iter().map(|(m, _)| m);
        for model in std::iter::once(call.model.clone()).chain(nested) {
            if !models.contains(&model) {
                models.push(model);
            }
        }
        let tokens = BilledTokens::from_usage(&call.usage);
        ttl_written.ephemeral_5m_input_tokens += tokens.cache_write_5m;
        ttl_written.ephemeral_1h_input_tokens += tokens.cache_write_1h;
        let t = epoch_of(call);
        first_last = Some(first_last.map_or((t, t), |(f, l)| (f.min(t), l.max(t))));
    }
    versions.sort_by_key(|v| super::profile::parse_version(v));
    models.sort();
    let ttl = match (ttl_written.ephemeral_1h_input_tokens > 0, ttl_written.ephemeral_5m_input_tokens > 0) {
        (true, true) => "1h+5m",
        (true, false) => "1h",
        (false, true) => "5m",
        (false, false) => "none",
    }
    .to_owned();
    let compactions = session
        .recording
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Compaction(c) => Some(CompactionRow { time: iso(start + e.time_ms as i64), trigger: c.trigger.clone(), pre_tokens: c.pre_tokens }),
            _ => None,
        })
        .collect();

    // The what-ifs: the main lane's TTL changed, when the client wrote with the other one.
    let main_split = session.calls.iter().filter(|c| c.lane == "main" && !c.is_synthetic).fold((0u64, 0u64), |(a, b), c| {
        let s = c.usage.creation_split();
        (a + s.ephemeral_5m_input_tokens, b + s.ephemeral_1h_input_tokens)
    });
    let mut candidates = Vec::new();
    if main_split.0 > 0 {
        candidates.push(("ttl_main=1h", CacheTtl::OneHour));
    }
    if main_split.1 > 0 {
        candidates.push(("ttl_main=5m", CacheTtl::FiveMinutes));
    }

    // The breaks with their causes, as the record view names them (no replay runs).
    let mut measurer = make();
    // The audit reports no information loss: the record view skips judging it.
    let plain = ReplayOptions { info_loss: false, ..ReplayOptions::default() };
    let view = super::record_view(session, &mut measurer, &plain);
    let compared: BTreeSet<usize> = view.calls.iter().filter(|c| c.skipped.is_none()).map(|c| c.index).collect();
    let rows = super::breaks::record_breaks(session, &view);
    drop(measurer);
    let by_index: BTreeMap<usize, &RecordedCall> = session.calls.iter().map(|c| (c.index, c)).collect();
    let mut breaks: BTreeMap<String, CauseLoss> = BTreeMap::new();
    let mut lost = CauseLoss::default();
    let mut break_at: BTreeMap<usize, String> = BTreeMap::new();
    for row in rows {
        let Some(call) = by_index.get(&row.index) else { continue };
        let ttl = if call.usage.creation_split().ephemeral_1h_input_tokens > 0 { CacheTtl::OneHour } else { CacheTtl::FiveMinutes };
        let cost = break_cost(table, &call.model, &call.usage, row.drop, ttl);
        let loss = CauseLoss { breaks: 1, tokens: row.drop, cost_usd: cost };
        breaks.entry(row.cause.clone()).or_default().add(&loss);
        lost.add(&loss);
        days.entry(day_of(row.index)).or_default().breaks.entry(row.cause.clone()).or_default().add(&loss);
        break_at.insert(row.index, row.cause);
    }
    let plot = session
        .calls
        .iter()
        .filter(|c| compared.contains(&c.index) && (c.lane == "main" || c.lane == "compact"))
        .map(|c| PlotPoint { call: c.index, context_tokens: c.usage.prompt_tokens(), break_cause: break_at.get(&c.index).cloned() })
        .collect();
    let mut warnings: Vec<String> = session.report.warnings.list.iter().filter(|w| w.kind != WarningKind::Ignored).map(|w| w.to_string()).collect();
    let (whatifs, presets, agent_divergence) = match agent_whatifs(file, session, make, &candidates, billed.cost_usd) {
        Ok(judged) => {
            for w in judged.whatifs.iter().chain(&judged.presets) {
                if let Some(why) = w.not_comparable.as_deref().filter(|why| why.starts_with(NOT_JUDGED)) {
                    warnings.push(format!("{}: what-if {}: {why}", file.path.display(), w.name));
                }
            }
            (judged.whatifs, judged.presets, judged.divergence)
        }
        Err(e) => {
            warnings.push(format!("{}: the what-ifs could not run through the agent: {e}", file.path.display()));
            (Vec::new(), Vec::new(), None)
        }
    };
    let best_whatif = whatifs.iter().filter(|w| w.saving_usd > 0.0 && w.no_effect.is_none() && w.not_comparable.is_none()).max_by(|a, b| a.saving_usd.total_cmp(&b.saving_usd)).cloned();
    SessionAudit {
        engine: engine.name(),
        project: file.project.clone(),
        session_id: file.session_id.clone(),
        path: file.path.display().to_string(),
        first: first_last.map(|(f, _)| iso(f)),
        last: first_last.map(|(_, l)| iso(l)),
        versions,
        models,
        calls: billed.calls,
        billed,
        breaks,
        lost,
        ttl_written,
        ttl,
        compactions,
        whatifs,
        best_whatif,
        presets,
        agent_divergence,
        days,
        warnings,
        plot,
    }
}

/// Largest loss first, then by path: the order of every output.
pub fn sort_audits(audits: &mut [SessionAudit]) {
    audits.sort_by(audit_order);
}

/// The table's order: largest loss first, then by path.
fn audit_order(a: &SessionAudit, b: &SessionAudit) -> std::cmp::Ordering {
    rank_order((a.lost.cost_usd, &a.path), (b.lost.cost_usd, &b.path))
}

fn rank_order(a: (f64, &str), b: (f64, &str)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1))
}

/// The context-per-call plots of the sessions that lead the table ([`sort_audits`]), the only
/// ones a report draws: an audit's plot is handed over as soon as the audit is made, and kept
/// only while it is among the first `keep`, so that a run over any number of sessions holds
/// `keep` plots at most (the rest of an audit is one row). The same plots are kept whatever
/// order the audits come in.
#[derive(Debug)]
pub struct LeadingPlots {
    keep: usize,
    plots: std::sync::Mutex<BTreeMap<PlotRank, Vec<PlotPoint>>>,
}

#[derive(Debug, Clone, PartialEq)]
struct PlotRank {
    cost: f64,
    path: String,
}

impl Eq for PlotRank {}

impl PartialOrd for PlotRank {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PlotRank {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        rank_order((self.cost, &self.path), (other.cost, &other.path))
    }
}

impl LeadingPlots {
    /// Keeps the plots of the first `keep` sessions (none: every plot is dropped).
    pub fn new(keep: usize) -> LeadingPlots {
        LeadingPlots { keep, plots: Default::default() }
    }

    /// Takes `audit`'s plot, and keeps it while the audit is among the first `keep`.
    pub fn offer(&self, audit: &mut SessionAudit) {
        let plot = std::mem::take(&mut audit.plot);
        self.keep_leading(audit.lost.cost_usd, &audit.path, plot);
    }

    fn keep_leading(&self, cost: f64, path: &str, plot: Vec<PlotPoint>) {
        if self.keep == 0 {
            return;
        }
        let mut plots = self.plots.lock().unwrap_or_else(|e| e.into_inner());
        plots.insert(PlotRank { cost, path: path.to_owned() }, plot);
        while plots.len() > self.keep {
            plots.pop_last();
        }
    }

    /// Gives the kept plots back to their audits.
    pub fn restore(self, audits: &mut [SessionAudit]) {
        let mut plots = self.plots.into_inner().unwrap_or_else(|e| e.into_inner());
        for audit in audits {
            if let Some(plot) = plots.remove(&PlotRank { cost: audit.lost.cost_usd, path: audit.path.clone() }) {
                audit.plot = plot;
            }
        }
    }
}

/// How rows are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupBy {
    Session,
    Project,
    Day,
}

/// A row of the audit table: one session, project or day.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AuditRow {
    /// Session id, project name or day.
    pub key: String,
    /// What ran the what-ifs: `agent` or `replay`.
    pub engine: &'static str,
    pub project: String,
    pub sessions: u64,
    pub first: Option<String>,
    pub last: Option<String>,
    pub versions: Vec<String>,
    pub models: Vec<String>,
    pub calls: u64,
    pub tokens: BilledTokens,
    pub cost_usd: f64,
    pub breaks: BTreeMap<String, CauseLoss>,
    pub lost: CauseLoss,
    pub ttl: String,
    pub compactions_auto: u64,
    pub compactions_manual: u64,
    /// Largest `preTokens` of the compactions.
    pub compaction_max_pre_tokens: Option<u64>,
    /// Per what-if: summed saving over the rows' sessions it changes.
    pub whatif_savings: BTreeMap<String, f64>,
    /// Per what-if: the rows' sessions it changes nothing on.
    pub whatifs_no_effect: BTreeMap<String, u64>,
    /// Per what-if run through the agent: the rows' sessions where its run is not comparable
    /// (requests refused at the blocking limit).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub whatifs_not_comparable: BTreeMap<String, u64>,
    /// Per what-if run through the agent: the first call from which its conversation parts from
    /// the recording, one per session where it does.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub whatifs_diverging: BTreeMap<String, Vec<usize>>,
    /// Per priced what-if: its information loss and the tokens it takes from the model's view,
    /// less the run as recorded's, summed over the rows' sessions that report them (a saving
    /// bought with context the model no longer sees says so).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub whatifs_loss: BTreeMap<String, LossDelta>,
    pub best_whatif: Option<WhatIf>,
    pub by_model: BTreeMap<String, crate::measure::billing::ModelBill>,
}

/// A what-if's information loss less the run as recorded's ([`WhatIf::info_loss_delta`],
/// [`WhatIf::tokens_dropped_delta`]), summed over sessions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LossDelta {
    /// References lost and re-reads.
    pub info_loss: i64,
    /// Tokens taken from the model's view (through the agent).
    pub tokens_dropped: i64,
}

impl LossDelta {
    fn add(&mut self, other: &LossDelta) {
        self.info_loss += other.info_loss;
        self.tokens_dropped += other.tokens_dropped;
    }
}

fn push_unique(list: &mut Vec<String>, items: &[String]) {
    for item in items {
        if !list.contains(item) {
            list.push(item.clone());
        }
    }
}

fn row_of(audit: &SessionAudit) -> AuditRow {
    let mut row = AuditRow {
        key: audit.session_id.clone(),
        engine: audit.engine,
        project: audit.project.clone(),
        sessions: 1,
        first: audit.first.clone(),
        last: audit.last.clone(),
        versions: audit.versions.clone(),
        models: audit.models.clone(),
        calls: audit.calls,
        tokens: audit.billed.tokens,
        cost_usd: audit.billed.cost_usd,
        breaks: audit.breaks.clone(),
        lost: audit.lost.clone(),
        ttl: audit.ttl.clone(),
        by_model: audit.billed.by_model.clone(),
        ..AuditRow::default()
    };
    for c in &audit.compactions {
        if c.trigger == "manual" {
            row.compactions_manual += 1;
        } else {
            row.compactions_auto += 1;
        }
        row.compaction_max_pre_tokens = row.compaction_max_pre_tokens.max(c.pre_tokens);
    }
    for w in &audit.whatifs {
        if w.no_effect.is_some() {
            *row.whatifs_no_effect.entry(w.name.clone()).or_default() += 1;
        } else if w.not_comparable.is_some() {
            *row.whatifs_not_comparable.entry(w.name.clone()).or_default() += 1;
        } else {
            *row.whatif_savings.entry(w.name.clone()).or_default() += w.saving_usd;
            if w.info_loss_delta.is_some() || w.tokens_dropped_delta.is_some() {
                let delta = LossDelta { info_loss: w.info_loss_delta.unwrap_or(0), tokens_dropped: w.tokens_dropped_delta.unwrap_or(0) };
                row.whatifs_loss.entry(w.name.clone()).or_default().add(&delta);
            }
        }
        if let Some(call) = w.diverges_from {
            row.whatifs_diverging.entry(w.name.clone()).or_default().push(call);
        }
    }
    row.best_whatif = audit.best_whatif.clone();
    row
}

fn merge_into(into: &mut AuditRow, row: &AuditRow) {
    into.sessions += row.sessions;
    if into.engine.is_empty() {
        into.engine = row.engine;
    }
    into.first = match (into.first.take(), &row.first) {
        (Some(a), Some(b)) => Some(a.min(b.clone())),
        (a, b) => a.or(b.clone()),
    };
    into.last = match (into.last.take(), &row.last) {
        (Some(a), Some(b)) => Some(a.max(b.clone())),
        (a, b) => a.or(b.clone()),
    };
    push_unique(&mut into.versions, &row.versions);
    push_unique(&mut into.models, &row.models);
    into.versions.sort_by_key(|v| super::profile::parse_version(v));
    into.models.sort();
    into.calls += row.calls;
    into.tokens.add(&row.tokens);
    into.cost_usd += row.cost_usd;
    for (cause, loss) in &row.breaks {
        into.breaks.entry(cause.clone()).or_default().add(loss);
    }
    into.lost.add(&row.lost);
    into.ttl = match (into.ttl.as_str(), row.ttl.as_str()) {
        ("", t) | (t, "none") => t.to_owned(),
        ("none", t) => t.to_owned(),
        (a, b) if a == b => a.to_owned(),
        _ => "1h+5m".to_owned(),
    };
    into.compactions_auto += row.compactions_auto;
    into.compactions_manual += row.compactions_manual;
    into.compaction_max_pre_tokens = into.compaction_max_pre_tokens.max(row.compaction_max_pre_tokens);
    for (name, saving) in &row.whatif_savings {
        *into.whatif_savings.entry(name.clone()).or_default() += saving;
    }
    for (name, n) in &row.whatifs_no_effect {
        *into.whatifs_no_effect.entry(name.clone()).or_default() += n;
    }
    for (name, n) in &row.whatifs_not_comparable {
        *into.whatifs_not_comparable.entry(name.clone()).or_default() += n;
    }
    for (name, calls) in &row.whatifs_diverging {
        into.whatifs_diverging.entry(name.clone()).or_default().extend(calls);
    }
    for (name, delta) in &row.whatifs_loss {
        into.whatifs_loss.entry(name.clone()).or_default().add(delta);
    }
    for (label, m) in &row.by_model {
        let e = into.by_model.entry(label.clone()).or_default();
        e.tokens.add(&m.tokens);
        e.cost_usd += m.cost_usd;
        e.calls += m.calls;
    }
}

fn best_of(row: &mut AuditRow, base_cost: f64) {
    row.best_whatif = row
        .whatif_savings
        .iter()
        .filter(|(_, s)| **s > 0.0)
        .max_by(|a, b| a.1.total_cmp(b.1).then_with(|| b.0.cmp(a.0)))
        .map(|(name, s)| WhatIf { name: name.clone(), saving_usd: *s, saving_pct: pct(*s, base_cost), no_effect: None, info_loss_delta: None, ..WhatIf::default() });
}

/// The rows of the table (sorted largest loss first, then key) and the total row.
pub fn group(audits: &[SessionAudit], by: GroupBy) -> (Vec<AuditRow>, AuditRow) {
    let mut rows: Vec<AuditRow> = match by {
        GroupBy::Session => audits.iter().map(row_of).collect(),
        GroupBy::Project => {
            let mut map: BTreeMap<String, AuditRow> = BTreeMap::new();
            for a in audits {
                let row = row_of(a);
                let into = map.entry(a.project.clone()).or_insert_with(|| AuditRow { key: a.project.clone(), project: a.project.clone(), ..AuditRow::default() });
                merge_into(into, &row);
            }
            map.into_values().collect()
        }
        GroupBy::Day => {
            // A session's calls, cost and breaks go to the day they happened on; what-ifs are
            // per session and not split over days.
            let mut map: BTreeMap<String, AuditRow> = BTreeMap::new();
            for a in audits {
                for (day, share) in &a.days {
                    let into = map.entry(day.clone()).or_insert_with(|| AuditRow { key: day.clone(), engine: a.engine, ..AuditRow::default() });
                    into.sessions += 1;
                    into.calls += share.calls;
                    into.tokens.add(&share.tokens);
                    into.cost_usd += share.cost_usd;
                    for (cause, loss) in &share.breaks {
                        into.breaks.entry(cause.clone()).or_default().add(loss);
                        into.lost.add(loss);
                    }
                    push_unique(&mut into.models, &a.models);
                    into.models.sort();
                }
            }
            map.into_values().collect()
        }
    };
    if by == GroupBy::Project {
        for row in &mut rows {
            let base = row.cost_usd;
            best_of(row, base);
        }
    }
    rows.sort_by(|a, b| b.lost.cost_usd.total_cmp(&a.lost.cost_usd).then_with(|| a.key.cmp(&b.key)).then_with(|| a.project.cmp(&b.project)));
    let mut total = AuditRow { key: "total".to_owned(), engine: audits.first().map_or("", |a| a.engine), ..AuditRow::default() };
    for a in audits {
        merge_into(&mut total, &row_of(a));
    }
    let base = total.cost_usd;
    best_of(&mut total, base);
    (rows, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Whatever order the audits come in, the plots kept are those of the first `keep`
        /// audits in the table's order.
        #[test]
        fn the_plots_kept_are_the_leading_sessions_whatever_the_order(costs in proptest::collection::vec(0u8..6, 0..40), keep in 0usize..8, seed in proptest::prelude::any::<u64>()) {
            let audits: Vec<(f64, String)> = costs.iter().enumerate().map(|(i, &c)| (c as f64 * 0.5, format!("s{:02}", (i * 7) % 41))).collect();
            let mut arrival = audits.clone();
            // A fixed shuffle from the seed.
            let mut state = seed | 1;
            for i in (1..arrival.len()).rev() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                arrival.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let plots = LeadingPlots::new(keep);
            for (cost, path) in &arrival {
                plots.keep_leading(*cost, path, vec![PlotPoint { call: 0, context_tokens: *cost as u64, break_cause: None }]);
            }
            let mut sorted = audits.clone();
            sorted.sort_by(|a, b| rank_order((a.0, &a.1), (b.0, &b.1)));
            sorted.dedup_by(|a, b| a.1 == b.1);
            let kept: Vec<(f64, String)> = plots.plots.into_inner().unwrap().into_keys().map(|r| (r.cost, r.path)).collect();
            let leading: Vec<(f64, String)> = sorted.into_iter().take(keep).collect();
            proptest::prop_assert_eq!(kept, leading);
        }
    }
}
