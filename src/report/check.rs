//! `ctxsim check`: the CI gate. Each scenario of a suite is run and judged twice over:
//! against the `expect:` budgets written in the scenario, and against a baseline file (the
//! numbers of an earlier accepted run) with tolerances. A failure names the scenario and, for
//! every cache break behind it, the request, the lane, the first divergent block
//! (`diverged_at`) and the cause.
//!
//! Outputs are plain text for people and JUnit XML for CI dashboards; both list scenarios in
//! suite order and checks in a fixed order, and carry no times or host names.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::measure::{Measurer, RequestMetrics, Summary};
use crate::runner::{RunError, RunOutput, run_scenario_opts};
use crate::scenario::Scenario;

/// The strategy `check` runs scenarios with.
pub const CHECK_STRATEGY: &str = "claude-code";

/// Version of the baseline file format.
pub const BASELINE_VERSION: u32 = 1;

/// A baseline file: per scenario name, the numbers of the accepted run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    pub version: u32,
    /// The token estimator the numbers were measured with (`bpe`, `chars4`, `calibrated`);
    /// absent in baselines written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimator: Option<String>,
    /// The strategy and chain the numbers were measured with (`claude-code`, plus
    /// `-stage` for every stage disabled); absent in older baselines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<String>,
    /// The engine the recorded sessions among the entries were measured with (`agent`,
    /// `replay`); absent where the baseline holds no session, and in baselines written before
    /// the agent became the default engine, whose sessions went through the replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_engine: Option<String>,
    pub scenarios: BTreeMap<String, BaselineEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaselineEntry {
    pub file: String,
    pub requests: usize,
    pub cache_hit_ratio: f64,
    pub cost_usd: f64,
    pub cache_breaks: usize,
    pub compactions: BTreeMap<String, u64>,
    pub peak_context_tokens: u64,
    /// Digest of every request body, in order (the summary's fingerprint).
    pub fingerprint: String,
    /// The cache breaks of the accepted run, so that a new one can be told apart.
    #[serde(default)]
    pub breaks: Vec<BreakRecord>,
}

/// One cache break: where and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BreakRecord {
    pub index: usize,
    pub lane: String,
    pub diverged_at: Option<String>,
    pub cause: Option<String>,
}

impl BreakRecord {
    fn from_row(row: &RequestMetrics) -> BreakRecord {
        BreakRecord { index: row.index, lane: row.lane.clone(), diverged_at: row.prefix.diverged_at.clone(), cause: row.prefix.cause.clone() }
    }

    fn describe(&self) -> String {
        format!(
            "request {} ({}): diverged_at {}, cause {}",
            self.index,
            self.lane,
            self.diverged_at.as_deref().unwrap_or("-"),
            self.cause.as_deref().unwrap_or("unexplained")
        )
    }
}

impl Baseline {
    /// Reads a baseline file: a byte-order mark is dropped; an empty file and invalid UTF-8
    /// (with its line and byte column) are errors.
    pub fn load(path: &std::path::Path) -> Result<Baseline, CheckError> {
        let shown = path.display().to_string();
        let text = crate::input::read_text(path).map_err(|e| CheckError::Baseline { path: shown.clone(), message: e.to_string() })?;
        Baseline::parse(&text, &shown)
    }

    pub fn parse(text: &str, path: &str) -> Result<Baseline, CheckError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut de = serde_json::Deserializer::from_str(text);
        let baseline: Baseline = serde_path_to_error::deserialize(&mut de).map_err(|e| CheckError::Baseline {
            path: path.to_owned(),
            message: format!("line {}: {}: {}", e.inner().line(), crate::input::json_path(e.path()), crate::input::cap_message(&e.inner().to_string())),
        })?;
        de.end().map_err(|e| CheckError::Baseline { path: path.to_owned(), message: format!("line {}: {}", e.line(), crate::input::cap_message(&e.to_string())) })?;
        if baseline.version != BASELINE_VERSION {
            return Err(CheckError::Baseline {
                path: path.to_owned(),
                message: format!("version: {} is not a baseline version this ctxsim reads (expected {BASELINE_VERSION})", baseline.version),
            });
        }
        Ok(baseline)
    }

    /// Refuses to compare with (or merge into) numbers measured another way: a different
    /// estimator or strategy changes every number, which is not a regression.
    pub fn check_measured_with(&self, path: &str, estimator: &str, strategy: &str) -> Result<(), CheckError> {
        for (field, recorded, now) in [("estimator", &self.estimator, estimator), ("strategy", &self.strategy, strategy)] {
            if let Some(recorded) = recorded
                && recorded != now
            {
                return Err(CheckError::Baseline {
                    path: path.to_owned(),
                    message: format!(
                        "{field}: the baseline was measured with {field} `{recorded}`, this run uses `{now}`; run with the same {field}, or refresh the baseline with --update-baseline"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Whether some entry is a recorded session (a transcript, `.jsonl`) rather than a scenario.
    pub fn holds_sessions(&self) -> bool {
        self.scenarios.values().any(|e| e.file.ends_with(".jsonl"))
    }

    /// Refuses to compare a run's recorded sessions with sessions measured through another
    /// engine (a baseline of the record-based replay, removed in session 26). Scenarios run
    /// through the agent either way, so a run or a baseline without sessions is never refused
    /// for it.
    pub fn check_session_engine(&self, path: &str, engine: &str) -> Result<(), CheckError> {
        if !self.holds_sessions() {
            return Ok(());
        }
        let recorded = self.session_engine.as_deref().unwrap_or("replay");
        if recorded == "replay" {
            return Err(CheckError::Baseline {
                path: path.to_owned(),
                message: "session_engine: the baseline's recorded sessions were measured through the record-based replay (`--engine replay`), which check no longer runs: recorded sessions run through the agent only; re-run with --update-baseline to measure them through the agent".to_owned(),
            });
        }
        if recorded != engine {
            return Err(CheckError::Baseline {
                path: path.to_owned(),
                message: format!(
                    "session_engine: the baseline's recorded sessions were measured through the {recorded} (`--engine {recorded}`), this run uses `--engine {engine}`; run with the same engine, or refresh the baseline with --update-baseline"
                ),
            });
        }
        Ok(())
    }

    /// `update`'s entries replace this baseline's entries of the same scenario; the others stay.
    pub fn merge(&mut self, update: Baseline) {
        self.estimator = update.estimator;
        self.strategy = update.strategy;
        if update.session_engine.is_some() {
            self.session_engine = update.session_engine;
        }
        self.scenarios.extend(update.scenarios);
    }

    /// Pretty JSON with a final newline (keys sorted: the map is a BTreeMap).
    pub fn to_json(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("baselines serialize");
        bytes.push(b'\n');
        bytes
    }
}

/// How far a run may drift from its baseline before the check fails.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerances {
    /// Relative increase of cost and of peak context allowed (0.02 = 2%).
    pub relative: f64,
    /// Cache breaks allowed beyond the baseline's.
    pub extra_cache_breaks: u64,
    /// Absolute drop of the cache hit ratio allowed.
    pub hit_ratio: f64,
}

impl Default for Tolerances {
    fn default() -> Self {
        Tolerances { relative: 0.02, extra_cache_breaks: 0, hit_ratio: 0.01 }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("{second}: scenario name {name:?} is already used by {first}; the baseline is keyed by name")]
    DuplicateName { name: String, first: String, second: String },
    #[error("{path}: {message}")]
    Baseline { path: String, message: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Fail,
    /// Not a failure, but worth saying (request bytes changed, scenario not in the baseline).
    Note,
}

/// One check of one scenario (a JUnit testcase).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckResult {
    /// Stable id: `run`, `budget.cache_breaks`, `baseline.cost_usd`, ...
    pub name: String,
    pub status: Status,
    pub message: String,
    /// The requests behind a failure, one line each.
    pub details: Vec<String>,
}

impl CheckResult {
    fn new(name: impl Into<String>, failed: bool, message: String) -> CheckResult {
        CheckResult { name: name.into(), status: if failed { Status::Fail } else { Status::Pass }, message, details: Vec::new() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScenarioReport {
    pub name: String,
    pub file: String,
    pub checks: Vec<CheckResult>,
    pub summary: Summary,
    pub breaks: Vec<BreakRecord>,
}

impl ScenarioReport {
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.status == Status::Fail)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SuiteReport {
    pub scenarios: Vec<ScenarioReport>,
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// The budgets of `scenario.expect` against a run.
pub fn evaluate_budgets(scenario: &Scenario, output: &RunOutput) -> Vec<CheckResult> {
    let expect = &scenario.expect;
    let s = &output.summary;
    let breaks: Vec<String> = output.rows.iter().filter(|r| r.cache_break).map(|r| BreakRecord::from_row(r).describe()).collect();
    let mut checks = Vec::new();
    if let Some(max) = expect.cache_breaks {
        let mut c = CheckResult::new("budget.cache_breaks", s.cache_breaks as u64 > max, format!("{} cache breaks, budget at most {max}", s.cache_breaks));
        if c.status == Status::Fail {
            c.details = breaks.clone();
        }
        checks.push(c);
    }
    if let Some(min) = expect.min_cache_hit_ratio {
        let mut c = CheckResult::new(
            "budget.min_cache_hit_ratio",
            s.cache_hit_ratio < min,
            format!("cache hit ratio {:.4}, budget at least {min}", s.cache_hit_ratio),
        );
        if c.status == Status::Fail {
            c.details = breaks.clone();
        }
        checks.push(c);
    }
    if let Some(max) = expect.max_cost_usd {
        let mut c = CheckResult::new("budget.max_cost_usd", s.cost_usd > max, format!("cost ${:.6}, budget at most ${max}", s.cost_usd));
        if c.status == Status::Fail {
            c.details = breaks.clone();
        }
        checks.push(c);
    }
    if let Some(expected) = &expect.compactions {
        for (stage, want) in expected.iter() {
            let got = s.compactions.get(stage).copied().unwrap_or(0);
            let mut c = CheckResult::new(format!("budget.compactions.{stage}"), got != want, format!("{stage} fired {got} times, expected exactly {want}"));
            if c.status == Status::Fail {
                c.details = firings(&output.rows, stage);
            }
            checks.push(c);
        }
    }
    if let Some(max) = expect.peak_context_tokens {
        let mut c = CheckResult::new(
            "budget.peak_context_tokens",
            s.peak_context_tokens > max,
            format!("peak context {} tokens, budget at most {max}", s.peak_context_tokens),
        );
        if c.status == Status::Fail {
            c.details = output
                .rows
                .iter()
                .filter(|r| r.context_tokens > max)
                .map(|r| format!("request {} ({}): {} context tokens", r.index, r.lane, r.context_tokens))
                .collect();
        }
        checks.push(c);
    }
    if let Some(want) = &expect.break_causes {
        let got: Vec<String> =
            output.rows.iter().filter(|r| r.cache_break).map(|r| r.prefix.cause.clone().unwrap_or_else(|| "unknown".to_owned())).collect();
        let mut c = CheckResult::new(
            "budget.break_causes",
            got != *want,
            format!("cache breaks caused by [{}], expected [{}]", got.join(", "), want.join(", ")),
        );
        if c.status == Status::Fail {
            c.details = breaks.clone();
        }
        checks.push(c);
    }
    if let Some(max) = expect.max_requests {
        checks.push(CheckResult::new("budget.max_requests", s.requests as u64 > max, format!("{} requests, budget at most {max}", s.requests)));
    }
    checks
}

fn firings(rows: &[RequestMetrics], key: &str) -> Vec<String> {
    rows.iter()
        .flat_map(|r| {
            r.stages
                .iter()
                .filter(|st| st.fired && crate::measure::metrics::compaction_key(&st.name) == Some(key))
                .map(move |st| format!("request {} ({}): {} fired: {}", r.index, r.lane, st.name, st.reason))
        })
        .collect()
}

/// A run against its baseline entry.
pub fn compare_baseline(output: &RunOutput, entry: Option<&BaselineEntry>, tolerances: &Tolerances) -> Vec<CheckResult> {
    let s = &output.summary;
    let Some(base) = entry else {
        return vec![CheckResult {
            name: "baseline".to_owned(),
            status: Status::Note,
            message: "not in the baseline (run with --update-baseline to add it)".to_owned(),
            details: Vec::new(),
        }];
    };
    let mut checks = Vec::new();

    let allowed = base.cache_breaks as u64 + tolerances.extra_cache_breaks;
    let mut c = CheckResult::new(
        "baseline.cache_breaks",
        s.cache_breaks as u64 > allowed,
        format!("{} cache breaks, baseline {} (+{} allowed)", s.cache_breaks, base.cache_breaks, tolerances.extra_cache_breaks),
    );
    if c.status == Status::Fail {
        let known: Vec<(&str, Option<&str>)> = base.breaks.iter().map(|b| (b.lane.as_str(), b.cause.as_deref())).collect();
        let mut remaining = known.clone();
        // A break is new when the baseline had no break of the same lane and cause left to
        // match it (indices shift when requests are added, causes do not).
        for row in output.rows.iter().filter(|r| r.cache_break) {
            let key = (row.lane.as_str(), row.prefix.cause.as_deref());
            match remaining.iter().position(|k| *k == key) {
                Some(i) => {
                    remaining.remove(i);
                }
                None => c.details.push(format!("new: {}", BreakRecord::from_row(row).describe())),
            }
        }
    }
    checks.push(c);

    let floor = base.cache_hit_ratio - tolerances.hit_ratio;
    checks.push(CheckResult::new(
        "baseline.cache_hit_ratio",
        s.cache_hit_ratio < floor - 1e-12,
        format!("cache hit ratio {:.4}, baseline {:.4} (-{} allowed)", s.cache_hit_ratio, base.cache_hit_ratio, tolerances.hit_ratio),
    ));

    let ceiling = base.cost_usd * (1.0 + tolerances.relative);
    let change = if base.cost_usd > 0.0 { format!("{:+.1}%", (s.cost_usd / base.cost_usd - 1.0) * 100.0) } else { "new cost".to_owned() };
    checks.push(CheckResult::new(
        "baseline.cost_usd",
        s.cost_usd > ceiling + 1e-9,
        format!("cost ${:.6}, baseline ${:.6} ({change}, +{} allowed)", s.cost_usd, base.cost_usd, pct(tolerances.relative)),
    ));

    let ceiling = base.peak_context_tokens as f64 * (1.0 + tolerances.relative);
    checks.push(CheckResult::new(
        "baseline.peak_context_tokens",
        s.peak_context_tokens as f64 > ceiling,
        format!("peak context {} tokens, baseline {} (+{} allowed)", s.peak_context_tokens, base.peak_context_tokens, pct(tolerances.relative)),
    ));

    let mut more: Vec<String> = Vec::new();
    for (key, got) in &s.compactions {
        let was = base.compactions.get(key).copied().unwrap_or(0);
        if *got > was {
            more.push(format!("{key} {was} -> {got}"));
        }
    }
    let mut c = CheckResult::new(
        "baseline.compactions",
        !more.is_empty(),
        if more.is_empty() { "no stage fires more often than in the baseline".to_owned() } else { format!("more compactions: {}", more.join(", ")) },
    );
    if c.status == Status::Fail {
        for key in s.compactions.keys() {
            if s.compactions[key] > base.compactions.get(key).copied().unwrap_or(0) {
                c.details.extend(firings(&output.rows, key));
            }
        }
    }
    checks.push(c);

    if s.fingerprint != base.fingerprint {
        checks.push(CheckResult {
            name: "baseline.fingerprint".to_owned(),
            status: Status::Note,
            message: format!(
                "request bytes changed ({} requests, baseline {}; fingerprint {} -> {})",
                s.requests,
                base.requests,
                short(&base.fingerprint),
                short(&s.fingerprint)
            ),
            details: Vec::new(),
        });
    }
    checks
}

fn short(hex: &str) -> &str {
    &hex[..hex.len().min(12)]
}

/// Judges one run.
pub fn check_run(scenario: &Scenario, output: &RunOutput, baseline: Option<&Baseline>, tolerances: &Tolerances) -> ScenarioReport {
    let mut checks = vec![CheckResult::new("run", false, format!("{} requests", output.summary.requests))];
    checks.extend(evaluate_budgets(scenario, output));
    if let Some(baseline) = baseline {
        checks.extend(compare_baseline(output, baseline.scenarios.get(&scenario.name), tolerances));
    }
    ScenarioReport {
        name: scenario.name.clone(),
        file: scenario.file.clone(),
        checks,
        summary: output.summary.clone(),
        breaks: output.rows.iter().filter(|r| r.cache_break).map(BreakRecord::from_row).collect(),
    }
}

/// Judges a recorded session run under the check strategy (`ctxsim check SESSION.jsonl`,
/// through the replay or the agent): a recording has no `expect:` budgets, so the checks are the
/// run, the baseline, and a note when the strategy's requests diverged from the recording.
pub fn check_session(name: &str, evaluation: &crate::report::compare::Evaluation, baseline: Option<&Baseline>, tolerances: &Tolerances) -> ScenarioReport {
    let output = RunOutput { scenario: evaluation.input.clone(), rows: evaluation.rows.clone(), requests: Vec::new(), summary: evaluation.summary.clone(), stopped: None };
    let mut checks = vec![CheckResult::new("run", false, format!("{} requests", output.summary.requests))];
    // What ran the recorded session (the engine), in every output.
    if let Some(engine) = evaluation.engine {
        checks.push(CheckResult { name: "engine".to_owned(), status: Status::Note, message: format!("the session ran through the {engine} (--engine {engine})"), details: Vec::new() });
    }
    if let Some(divergence) = &evaluation.divergence {
        checks.push(CheckResult { name: "replies_diverge".to_owned(), status: Status::Note, message: divergence.clone(), details: Vec::new() });
    }
    if let Some(baseline) = baseline {
        checks.extend(compare_baseline(&output, baseline.scenarios.get(name), tolerances));
    }
    ScenarioReport {
        name: name.to_owned(),
        file: evaluation.input.clone(),
        checks,
        summary: output.summary.clone(),
        breaks: output.rows.iter().filter(|r| r.cache_break).map(BreakRecord::from_row).collect(),
    }
}

/// Runs every scenario with the check strategy and judges it. Scenario names must be unique.
pub fn check_suite(
    scenarios: &[Scenario],
    make_measurer: &dyn Fn() -> Measurer,
    baseline: Option<&Baseline>,
    tolerances: &Tolerances,
) -> Result<SuiteReport, CheckError> {
    check_suite_with(scenarios, make_measurer, baseline, tolerances, &crate::agent::compact::Chain::new())
}

/// [`check_suite`] with a given long-context chain (e.g. stages disabled by name).
pub fn check_suite_with(
    scenarios: &[Scenario],
    make_measurer: &dyn Fn() -> Measurer,
    baseline: Option<&Baseline>,
    tolerances: &Tolerances,
    chain: &crate::agent::compact::Chain,
) -> Result<SuiteReport, CheckError> {
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for scenario in scenarios {
        if let Some(first) = seen.insert(&scenario.name, &scenario.file) {
            return Err(CheckError::DuplicateName { name: scenario.name.clone(), first: first.to_owned(), second: scenario.file.clone() });
        }
    }
    let mut reports = Vec::with_capacity(scenarios.len());
    for scenario in scenarios {
        // The checks read rows and the summary; no body is kept.
        let options = crate::runner::RunOptions::default();
        let output = run_scenario_opts(scenario, &mut make_measurer(), &crate::strategy::Strategy::default(), chain, options)?;
        reports.push(check_run(scenario, &output, baseline, tolerances));
    }
    Ok(SuiteReport { scenarios: reports })
}

impl SuiteReport {
    pub fn passed(&self) -> bool {
        !self.scenarios.iter().any(ScenarioReport::failed)
    }

    /// The baseline this run would write (`--update-baseline`).
    pub fn to_baseline(&self) -> Baseline {
        let scenarios = self
            .scenarios
            .iter()
            .map(|r| {
                let s = &r.summary;
                let entry = BaselineEntry {
                    file: r.file.clone(),
                    requests: s.requests,
                    cache_hit_ratio: s.cache_hit_ratio,
                    cost_usd: s.cost_usd,
                    cache_breaks: s.cache_breaks,
                    compactions: s.compactions.clone(),
                    peak_context_tokens: s.peak_context_tokens,
                    fingerprint: s.fingerprint.clone(),
                    breaks: r.breaks.clone(),
                };
                (r.name.clone(), entry)
            })
            .collect();
        Baseline { version: BASELINE_VERSION, estimator: None, strategy: None, session_engine: None, scenarios }
    }

    /// The readable diff: every failed scenario with its failed checks and the requests behind
    /// them, notes, then one line per passing scenario and a total.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for r in &self.scenarios {
            let failed: Vec<&CheckResult> = r.checks.iter().filter(|c| c.status == Status::Fail).collect();
            let notes: Vec<&CheckResult> = r.checks.iter().filter(|c| c.status == Status::Note).collect();
            if failed.is_empty() {
                let _ = writeln!(out, "ok    {} ({}): {} checks passed", r.name, r.file, r.checks.iter().filter(|c| c.status == Status::Pass).count());
            } else {
                let _ = writeln!(out, "FAIL  {} ({})", r.name, r.file);
            }
            for c in failed {
                let _ = writeln!(out, "  {}: {}", c.name, c.message);
                for d in &c.details {
                    let _ = writeln!(out, "    {d}");
                }
            }
            for c in notes {
                let _ = writeln!(out, "  note {}: {}", c.name, c.message);
            }
        }
        let failed = self.scenarios.iter().filter(|r| r.failed()).count();
        let checks_failed = self.scenarios.iter().flat_map(|r| &r.checks).filter(|c| c.status == Status::Fail).count();
        if failed == 0 {
            let _ = writeln!(out, "check passed: {} scenarios", self.scenarios.len());
        } else {
            let _ = writeln!(out, "check failed: {failed} of {} scenarios, {checks_failed} failed checks", self.scenarios.len());
        }
        out
    }

    /// One GitHub Actions `::error` line per failed check, every name escaped.
    pub fn github_annotations(&self) -> String {
        let mut out = String::new();
        for r in &self.scenarios {
            for c in r.checks.iter().filter(|c| c.status == Status::Fail) {
                let _ = writeln!(
                    out,
                    "::error file={},title={}::{}",
                    github_escape_property(&r.file),
                    github_escape_property(&format!("ctxsim check {}: {}", r.name, c.name)),
                    github_escape_data(&format!("{}: {}", r.name, c.message))
                );
            }
        }
        out
    }

    /// JUnit XML: a testsuite per scenario, a testcase per check. Notes go to system-out.
    pub fn junit_xml(&self) -> String {
        let count = |r: &ScenarioReport, status: Status| r.checks.iter().filter(|c| c.status == status).count();
        let tests: usize = self.scenarios.iter().map(|r| r.checks.len()).sum();
        let failures: usize = self.scenarios.iter().map(|r| count(r, Status::Fail)).sum();
        let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(x, "<testsuites name=\"ctxsim check\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\">");
        for r in &self.scenarios {
            let _ = writeln!(
                x,
                "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"0\">",
                xml_escape(&r.name),
                r.checks.len(),
                count(r, Status::Fail)
            );
            let _ = writeln!(x, "    <properties><property name=\"file\" value=\"{}\"/></properties>", xml_escape(&r.file));
            for c in &r.checks {
                let open = format!("    <testcase classname=\"ctxsim.check.{}\" name=\"{}\"", xml_escape(&r.name), xml_escape(&c.name));
                match c.status {
                    Status::Pass => {
                        let _ = writeln!(x, "{open}/>");
                    }
                    Status::Fail => {
                        let mut body = c.message.clone();
                        for d in &c.details {
                            body.push('\n');
                            body.push_str(d);
                        }
                        let _ = writeln!(
                            x,
                            "{open}>\n      <failure message=\"{}\" type=\"{}\">{}</failure>\n    </testcase>",
                            xml_escape(&c.message),
                            xml_escape(&c.name),
                            xml_escape_text(&body)
                        );
                    }
                    Status::Note => {
                        let _ = writeln!(x, "{open}>\n      <system-out>{}</system-out>\n    </testcase>", xml_escape_text(&c.message));
                    }
                }
            }
            x.push_str("  </testsuite>\n");
        }
        x.push_str("</testsuites>\n");
        x
    }
}

/// Escapes the message of a GitHub Actions workflow command (`::error ...::MESSAGE`): `%`,
/// carriage return and newline, so a name cannot end the command and start another.
pub fn github_escape_data(text: &str) -> String {
    text.replace('%', "%25").replace('\r', "%0D").replace('\n', "%0A")
}

/// Escapes a property value of a workflow command (`file=`, `title=`): the message rules plus
/// `:` and `,`, which would end the value.
pub fn github_escape_property(text: &str) -> String {
    github_escape_data(text).replace(':', "%3A").replace(',', "%2C")
}

/// Escapes text for an XML 1.0 attribute value (newlines and tabs as character references).
pub fn xml_escape(text: &str) -> String {
    escape_xml(text, true)
}

/// Escapes text for XML 1.0 element content (newlines kept).
pub fn xml_escape_text(text: &str) -> String {
    escape_xml(text, false)
}

/// Characters XML cannot carry at all (control characters other than tab, newline, carriage
/// return) become U+FFFD.
fn escape_xml(text: &str, attribute: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' if !attribute => out.push(c),
            '\n' | '\t' | '\r' => {
                let _ = write!(out, "&#{};", c as u32);
            }
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}
