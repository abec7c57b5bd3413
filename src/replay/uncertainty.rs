//! How much of a replay's cache outcome rests on a modelled rule rather than on the record, and
//! the range of Σcache_creation and cost those rules leave open.
//!
//! A call's outcome *rests on a rule* when one of the replay's modelled client behaviours decided
//! whether it read the cache: the side entry a finished turn leaves, a prompt or conversation
//! start re-rendered (also by a prompt delivering an item queued before a compaction), a side
//! entry a tool hook's context made unreadable, a Skill call, a resume, a
//! ToolSearch load ([`MODELLED_RULES`]). Where the
//! record itself explains the call (the TTL ran out between it and the previous call, or a
//! compaction came before it), it does not, except where a rule overrides the TTL: Claude
//! Desktop's static prefix read past the TTL (`shared_prefix`).
//!
//! Each rule has an observed hit rate ([`RULE_RATES`]): the share of its cases in the sixteen
//! real sessions where the replay agreed with the record, taken as (hits + 1) / (cases + 2) so a
//! rule with few cases is uncertain. For every call resting on a rule, the other outcome is
//! priced: a predicted read (the side entry) that fails falls to the prefix level; a predicted
//! break that does not happen reads what the previous call cached. With q the rule's miss rate
//! and Δ the change in creation tokens, the expected Σcreation is the replay's plus Σ q·Δ and its
//! spread σ² = Σ q(1−q)·Δ²; the range is the replay's figure widened to expected ± 2σ, within
//! what all calls flipping could reach. Cost moves by Δ × (write − read price) of the call.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The event of a call past the TTL whose static prefix the replay seeded, as other clients kept
/// it warm (`ClientProfile::static_prefix_shared`): the replay and the agent's recorded client
/// (`turns`) put it on the call; fidelity and the uncertainty read it as a modelled rule.
pub const SHARED_PREFIX: &str = "shared_prefix";

/// The events that mark a call's outcome as resting on a modelled rule, in the order tried (the
/// first present names the rule).
pub const MODELLED_RULES: [&str; 9] =
    [SHARED_PREFIX, "tool_search_load", "skill", "resume", "rerendered_prompt", "side_entry", "tool_hook_context", super::turns::QUEUED_ACROSS_COMPACTION, "turn_rerender"];

/// The rule that decides a call the TTL gap would otherwise explain: the prefix read after it.
const OVER_THE_TTL: &str = SHARED_PREFIX;

/// Events that put a call's outcome on the record (a TTL gap or a compaction before it).
const RECORDED_CAUSES: [&str; 2] = ["ttl_expired", "compaction"];

/// Cases of a rule in the sixteen real sessions, with the calls where the replay agreed with the
/// record on hit and rewrite (`ctxsim fidelity ../shared/realdata/transcripts --calls`;
/// docs/fidelity.md "Break rules" and "Honest uncertainty").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RuleRate {
    pub rule: &'static str,
    pub hits: u32,
    pub cases: u32,
}

impl RuleRate {
    /// The rate the interval uses: (hits + 1) / (cases + 2).
    pub fn hit_rate(&self) -> f64 {
        f64::from(self.hits + 1) / f64::from(self.cases + 2)
    }
}

/// Observed per rule on the sixteen sessions. Skill and ToolSearch have no case left there (the
/// Skill calls and loads are all 2.1.205+, where the rules do not apply): their rate is 1/2.
pub const RULE_RATES: [RuleRate; 9] = [
    RuleRate { rule: SHARED_PREFIX, hits: 5, cases: 5 },
    RuleRate { rule: "tool_search_load", hits: 0, cases: 0 },
    RuleRate { rule: "skill", hits: 0, cases: 0 },
    RuleRate { rule: "resume", hits: 1, cases: 1 },
    RuleRate { rule: "rerendered_prompt", hits: 7, cases: 7 },
    RuleRate { rule: "side_entry", hits: 129, cases: 129 },
    RuleRate { rule: "tool_hook_context", hits: 6, cases: 6 },
    RuleRate { rule: "turn_rerender", hits: 7, cases: 7 },
    RuleRate { rule: super::turns::QUEUED_ACROSS_COMPACTION, hits: 2, cases: 2 },
];

/// The rule a call's outcome rests on, if any.
pub fn modelled_rule(events: &[String]) -> Option<&'static str> {
    if events.iter().any(|e| e == OVER_THE_TTL) {
        return Some(OVER_THE_TTL);
    }
    if events.iter().any(|e| RECORDED_CAUSES.contains(&e.as_str())) {
        return None;
    }
    MODELLED_RULES.into_iter().find(|rule| events.iter().any(|e| e == rule))
}

fn rate_of(rule: &str) -> f64 {
    RULE_RATES.iter().find(|r| r.rule == rule).map_or(0.5, RuleRate::hit_rate)
}

/// Which calls of a session rested on a rule, and their share of the simulated creation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Modelled {
    /// Call indices per rule.
    pub calls: BTreeMap<String, Vec<usize>>,
    /// Their share of the session's simulated cache_creation tokens.
    pub creation_share: f64,
}

impl Modelled {
    pub fn count(&self) -> usize {
        self.calls.values().map(Vec::len).sum()
    }
}

/// The range of Σcache_creation and cost the rules leave open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    pub creation_low: f64,
    pub creation_high: f64,
    pub cost_low_usd: f64,
    pub cost_high_usd: f64,
    /// The recorded figures fall inside.
    pub creation_covers_record: bool,
    pub cost_covers_record: bool,
}

/// One call resting on a rule: the rule, the change in creation tokens if the other outcome
/// happened, and the price difference per token (write − read, USD).
#[derive(Debug, Clone, Copy)]
pub struct Flip {
    pub rule: &'static str,
    pub delta_creation: f64,
    pub price_delta: f64,
}

/// Collects the calls of one session.
#[derive(Debug, Default)]
pub struct Accumulator {
    modelled: Modelled,
    modelled_creation: f64,
    total_creation: f64,
    flips: Vec<Flip>,
}

impl Accumulator {
    /// A compared call: its simulated creation, and the rule and flip when it rests on one.
    pub fn add(&mut self, index: usize, creation: f64, flip: Option<Flip>) {
        self.total_creation += creation;
        if let Some(flip) = flip {
            self.modelled.calls.entry(flip.rule.to_owned()).or_default().push(index);
            self.modelled_creation += creation;
            self.flips.push(flip);
        }
    }

    pub fn modelled(&self) -> Modelled {
        let share = if self.total_creation > 0.0 { self.modelled_creation / self.total_creation } else { 0.0 };
        Modelled { creation_share: (share * 1e6).round() / 1e6, ..self.modelled.clone() }
    }

    /// The range around the replay's Σcreation and cost, checked against the recorded ones.
    pub fn interval(&self, creation: f64, cost: f64, recorded_creation: f64, recorded_cost: f64) -> Interval {
        let range = |base: f64, scale: &dyn Fn(&Flip) -> f64| {
            let (mut mean, mut var, mut floor, mut ceil) = (base, 0.0, base, base);
            for flip in &self.flips {
                let q = 1.0 - rate_of(flip.rule);
                let delta = scale(flip);
                mean += q * delta;
                var += q * (1.0 - q) * delta * delta;
                if delta < 0.0 { floor += delta } else { ceil += delta }
            }
            let sigma = var.sqrt();
            (base.min(mean - 2.0 * sigma).max(floor).max(0.0), base.max(mean + 2.0 * sigma).min(ceil))
        };
        let (creation_low, creation_high) = range(creation, &|f| f.delta_creation);
        let (cost_low, cost_high) = range(cost, &|f| f.delta_creation * f.price_delta);
        let round = |x: f64| (x * 1e6).round() / 1e6;
        Interval {
            creation_low: creation_low.round(),
            creation_high: creation_high.round(),
            cost_low_usd: round(cost_low),
            cost_high_usd: round(cost_high),
            creation_covers_record: (creation_low.round()..=creation_high.round()).contains(&recorded_creation),
            cost_covers_record: (round(cost_low)..=round(cost_high)).contains(&recorded_cost),
        }
    }
}

/// Per session: the calls resting on a rule (count, share of the simulated creation, indices
/// per rule) and, when computed, the range of Σcreation and cost with the recorded figures.
pub fn modelled_table(reports: &[super::FidelityReport]) -> String {
    let mut out = String::from("calls whose cache outcome rests on a modelled rule, not on the record\n");
    out.push_str(&format!("{:<44} {:>6} {:>8}", "session", "calls", "create%"));
    let with_interval = reports.iter().any(|r| r.interval.is_some());
    if with_interval {
        out.push_str(&format!(" {:>12} {:>12} {:>12}  {:>9} {:>9} {:>9}", "rec_create", "sim_low", "sim_high", "rec_cost", "cost_low", "cost_high"));
    }
    out.push('\n');
    for r in reports {
        let name = std::path::Path::new(&r.input).file_name().map_or(r.input.clone(), |n| n.to_string_lossy().into_owned());
        out.push_str(&format!("{:<44} {:>6} {:>8.1}", name, r.modelled.count(), r.modelled.creation_share * 100.0));
        if let Some(i) = &r.interval {
            let mark = |inside: bool| if inside { ' ' } else { '!' };
            out.push_str(&format!(
                " {:>12} {:>12.0} {:>12.0}{} {:>9.2} {:>9.2} {:>9.2}{}",
                r.recorded_cache_creation,
                i.creation_low,
                i.creation_high,
                mark(i.creation_covers_record),
                r.recorded_cost_usd,
                i.cost_low_usd,
                i.cost_high_usd,
                mark(i.cost_covers_record)
            ));
        }
        out.push('\n');
        for (rule, calls) in &r.modelled.calls {
            let list: Vec<String> = calls.iter().map(|c| format!("#{c}")).collect();
            out.push_str(&format!("    {rule}: {}\n", list.join(" ")));
        }
    }
    if with_interval {
        out.push_str("(! = the recorded figure is outside the range)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(list: &[&str]) -> Vec<String> {
        list.iter().map(|e| (*e).to_owned()).collect()
    }

    #[test]
    fn the_record_outranks_a_rule() {
        assert_eq!(modelled_rule(&events(&["new_user_turn", "turn_rerender", "side_entry"])), Some("side_entry"));
        assert_eq!(modelled_rule(&events(&["ttl_expired", "new_user_turn", "side_entry"])), None);
        assert_eq!(modelled_rule(&events(&["new_user_turn"])), None);
        assert_eq!(modelled_rule(&events(&["ttl_expired", "new_user_turn", "turn_rerender", SHARED_PREFIX])), Some(SHARED_PREFIX));
    }

    #[test]
    fn the_interval_holds_the_replay_and_widens_with_doubt() {
        let mut sure = Accumulator::default();
        let mut doubtful = Accumulator::default();
        for i in 0..10 {
            sure.add(i, 100.0, Some(Flip { rule: "side_entry", delta_creation: 10_000.0, price_delta: 3e-6 }));
            doubtful.add(i, 100.0, Some(Flip { rule: "skill", delta_creation: 10_000.0, price_delta: 3e-6 }));
        }
        let a = sure.interval(1_000.0, 1.0, 1_000.0, 1.0);
        let b = doubtful.interval(1_000.0, 1.0, 1_000.0, 1.0);
        assert!(a.creation_low <= 1_000.0 && a.creation_high > 1_000.0, "{a:?}");
        assert!(b.creation_high > a.creation_high, "{a:?} {b:?}");
        assert!(b.creation_high <= 101_000.0, "within all calls flipping: {b:?}");
        assert!(a.creation_covers_record && a.cost_covers_record);
        assert_eq!(sure.modelled().creation_share, 1.0);
        assert_eq!(sure.modelled().count(), 10);
    }
}
