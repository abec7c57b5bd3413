//! `ctxsim sweep`: a grid over strategy knobs, evaluated over every input, with the Pareto
//! front of cost against information loss and a recommendation.
//!
//! Determinism: the grid is the cartesian product of the `--param`s in the order given (the
//! first one outermost); every (point, input) job runs on its own measurer; results are
//! collected in job order and formatted into CSV cells before anything is derived from them, so
//! the outputs are byte-identical whatever the thread count, and a merge of shards (parsed back
//! from their CSVs) produces the same bytes as the unsharded run.
//!
//! Information loss of a point = tokens dropped from view + 5,000 × recall misses (a recall
//! miss is priced as a re-read of a typical file). The recommendation is the cheapest point on
//! the Pareto front whose loss is at most the bound (`--max-loss`; by default the front's
//! lowest loss plus a quarter of the front's loss range).

use std::path::Path;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::measure::Measurer;
use crate::report::compare::{Engine, Input, InputMemo, evaluate_digest};
use crate::report::effects::{NoEffect, Reason};
use crate::report::plots::{ParetoPoint, pareto_chart, pareto_front, render_svg, write_png};
use crate::strategy::Strategy;

/// Tokens a recall miss weighs in the information-loss scalar.
pub const RECALL_MISS_TOKENS: f64 = 5_000.0;

/// One `--param`: a dotted key and its values (as `--set` reads them).
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    pub key: String,
    pub values: Vec<String>,
}

impl Param {
    /// `KEY=LO..HI:STEP` (inclusive) or `KEY=a,b,c`.
    pub fn parse(text: &str) -> anyhow::Result<Param> {
        Self::parse_limited(text, u64::MAX)
    }

    /// [`Param::parse`], refusing a range of more than `max` values before making them.
    pub fn parse_limited(text: &str, max: u64) -> anyhow::Result<Param> {
        let (key, spec) = text.split_once('=').with_context(|| format!("--param {text}: expected KEY=LO..HI:STEP or KEY=a,b,c"))?;
        let key = key.trim().to_owned();
        let values: Vec<String> = if let Some((range, step)) = spec.split_once(':').filter(|(r, _)| r.contains("..")) {
            let (lo, hi) = range.split_once("..").expect("checked above");
            let integer = [lo, hi, step].iter().all(|v| v.trim().parse::<i64>().is_ok());
            if integer {
                let (lo, hi, step): (i64, i64, i64) = (lo.trim().parse()?, hi.trim().parse()?, step.trim().parse()?);
                if step <= 0 || hi < lo {
                    bail!("--param {text}: need LO ≤ HI and STEP > 0");
                }
                let count = ((hi as i128 - lo as i128) / step as i128 + 1) as u128;
                if count > u128::from(max) {
                    bail!("--param {text}: {count} values, more than --max-points {max}");
                }
                (0..).map(|i| lo + i * step).take_while(|v| *v <= hi).map(|v| v.to_string()).collect()
            } else {
                let (lo, hi, step): (f64, f64, f64) = (lo.trim().parse()?, hi.trim().parse()?, step.trim().parse()?);
                if !(lo.is_finite() && hi.is_finite() && step.is_finite()) || step <= 0.0 || hi < lo {
                    bail!("--param {text}: need finite LO ≤ HI and STEP > 0");
                }
                let count = ((hi - lo) / step + 1e-9).floor() + 1.0;
                if count.is_nan() || count > max as f64 {
                    bail!("--param {text}: {count} values, more than --max-points {max}");
                }
                let n = count as i64 - 1;
                (0..=n).map(|i| format!("{}", ((lo + i as f64 * step) * 1e9).round() / 1e9)).collect()
            }
        } else {
            spec.split(',').map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()).collect()
        };
        if values.is_empty() {
            bail!("--param {text}: no values");
        }
        Ok(Param { key, values })
    }
}

/// The grid: points in deterministic order.
#[derive(Debug, Clone)]
pub struct Grid {
    pub params: Vec<Param>,
    pub base: String,
    pub inputs: Vec<String>,
    /// What ran the recorded sessions among the inputs (`agent`, `replay`); `None` when every
    /// input is a scenario. Part of the signature, shown in every output.
    pub engine: Option<&'static str>,
}

impl Grid {
    pub fn len(&self) -> usize {
        self.params.iter().map(|p| p.values.len()).product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The knob values of point `index` (first param outermost).
    pub fn point(&self, mut index: usize) -> Vec<&str> {
        let mut out = vec![""; self.params.len()];
        for (slot, param) in self.params.iter().enumerate().rev() {
            out[slot] = &param.values[index % param.values.len()];
            index /= param.values.len();
        }
        out
    }

    /// A line naming the grid, written at the top of every CSV; merges compare it.
    pub fn signature(&self) -> String {
        let params: Vec<String> = self.params.iter().map(|p| format!("{}={}", p.key, p.values.join(","))).collect();
        let text = format!("base={} params={} inputs={}", self.base, params.join(" "), self.inputs.join(","));
        let engine = self.engine.map(|e| format!(" engine={e}")).unwrap_or_default();
        format!("# ctxsim sweep grid {}{engine} points={}", &crate::api::canonical::sha256_hex(text.as_bytes())[..16], self.len())
    }

    pub fn strategy(&self, base: &Strategy, index: usize) -> anyhow::Result<Strategy> {
        let mut strategy = base.clone();
        for (param, value) in self.params.iter().zip(self.point(index)) {
            strategy.set(&param.key, value).with_context(|| format!("--param {}", param.key))?;
        }
        strategy.name = format!("p{index}");
        Ok(strategy)
    }

    pub fn header(&self) -> Vec<String> {
        let mut header = vec!["point".to_owned()];
        header.extend(self.params.iter().map(|p| p.key.clone()));
        header.extend(METRIC_COLUMNS.iter().map(|s| (*s).to_owned()));
        header.push(OUTCOMES_COLUMN.to_owned());
        header
    }

    /// The grid a sweep CSV's header and rows describe (each parameter's values in the order of
    /// their first appearance, which is the grid's order since the rows are in point order).
    pub fn from_rows(header: &[String], rows: &[Vec<String>], inputs: usize) -> Grid {
        let cost = header.iter().position(|h| h == "cost_usd").unwrap_or(header.len());
        let params = (1..cost)
            .map(|c| {
                let mut values: Vec<String> = Vec::new();
                for row in rows {
                    if let Some(v) = row.get(c).filter(|v| !values.contains(v)) {
                        values.push(v.clone());
                    }
                }
                Param { key: header[c].clone(), values }
            })
            .collect();
        Grid { params, base: String::new(), inputs: (0..inputs).map(|i| format!("input {i}")).collect(), engine: None }
    }
}

/// The last column: per input (in the grid's order, space-separated), `DIGEST/PEAK`: the digest
/// of its results under the point ([`crate::report::effects::outcome_digest`]; equal digests,
/// equal results) and its peak context.
pub const OUTCOMES_COLUMN: &str = "outcomes";

const METRIC_COLUMNS: [&str; 12] = [
    "cost_usd", "cache_hit_ratio", "cache_breaks", "compactions", "tokens_dropped", "recall_misses",
    "rereads_after_compaction", "information_loss", "peak_context_tokens", "requests", "replies_diverge_inputs",
    "references_lost",
];

/// What [`run_points`] produced: one CSV row (cells) per point, in index order, and per point
/// and input the peak context (for the reasons of [`crate::report::effects::explain`]).
#[derive(Debug, Clone)]
pub struct PointResults {
    pub rows: Vec<Vec<String>>,
    pub peaks: Vec<Vec<u64>>,
}

/// Evaluates the points `indices` of the grid, recorded sessions run by `engine`. Through the
/// agent, the points whose strategies resolve to the same effective settings share one run per
/// input
/// ([`crate::report::compare::InputMemo`]).
pub fn run_points(
    grid: &Grid,
    base: &Strategy,
    inputs: &[Input],
    indices: &[usize],
    make_measurer: &(dyn Fn() -> Measurer + Sync),
    progress: &indicatif::ProgressBar,
    engine: Engine,
    checkpoints: bool,
) -> anyhow::Result<PointResults> {
    use rayon::prelude::*;
    let strategies: Vec<Strategy> = indices.iter().map(|&i| grid.strategy(base, i)).collect::<anyhow::Result<_>>()?;
    let jobs: Vec<(usize, usize)> = (0..indices.len()).flat_map(|p| (0..inputs.len()).map(move |i| (p, i))).collect();
    // The agent runs of each input, shared between the points that make the same one.
    let input_memos: Vec<InputMemo> = inputs.iter().map(|_| InputMemo::default()).collect();
    // A token count is a function of a block and the estimator alone: each input is tokenized
    // once, by a run under the base strategy, and every job starts from those counts (only the
    // blocks a point rewrites are tokenized again). The results are the same.
    let memos: Vec<crate::measure::tokens::TokenMemo> = inputs
        .par_iter()
        .zip(&input_memos)
        .map(|(input, memo)| {
            let mut measurer = make_measurer();
            // Only the counts matter here; an error shows again in the jobs.
            let _ = evaluate_digest(input, base, &mut measurer, false, engine, memo);
            measurer.counter().memo()
        })
        .collect();
    // Through the agent, the points of an input that differ only in where autocompact fires
    // share their runs up to where they part ([`InputMemo::run_family`]), one family at a time;
    // the jobs below find those runs made. `checkpoints` off (`sweep --no-checkpoints`) runs each
    // point alone; the results are the same.
    if engine == Engine::Agent && checkpoints {
        let mut families = Vec::new();
        for (i, input) in inputs.iter().enumerate() {
            // A failure to prepare shows again in the jobs.
            let found = input_memos[i].families(input, &strategies, &make_measurer()).unwrap_or_default();
            families.extend(found.into_iter().map(|family| (i, family)));
        }
        families.par_iter().try_for_each(|(i, family)| {
            let mut measurer = make_measurer();
            measurer.counter_mut().seed(&memos[*i]);
            input_memos[*i].run_family(&inputs[*i], family, measurer, false)
        })?;
    }
    // Each job's rows are reduced to its outcome digest at once and dropped.
    let results: Vec<anyhow::Result<(crate::report::compare::Evaluation, String)>> = jobs
        .par_iter()
        .map(|&(p, i)| {
            let mut measurer = make_measurer();
            measurer.counter_mut().seed(&memos[i]);
            let out = evaluate_digest(&inputs[i], &strategies[p], &mut measurer, false, engine, &input_memos[i]);
            progress.inc(1);
            out
        })
        .collect();
    let mut rows = Vec::with_capacity(indices.len());
    let mut peaks = Vec::with_capacity(indices.len());
    let mut results = results.into_iter();
    for (p, &index) in indices.iter().enumerate() {
        let (mut cost, mut read, mut denominator, mut breaks, mut compactions) = (0.0, 0u64, 0u64, 0usize, 0u64);
        let (mut dropped, mut misses, mut rereads, mut peak, mut requests, mut diverge) = (0u64, 0u64, 0u64, 0u64, 0usize, 0usize);
        let mut references_lost = 0usize;
        let mut digests = Vec::with_capacity(inputs.len());
        let mut input_peaks = Vec::with_capacity(inputs.len());
        for _ in 0..inputs.len() {
            let (e, digest) = results.next().expect("one result per job")?;
            digests.push(format!("{digest}/{}", e.summary.peak_context_tokens));
            input_peaks.push(e.summary.peak_context_tokens);
            let s = &e.summary;
            cost += s.cost_usd;
            read += s.tokens.cache_read;
            denominator += s.tokens.input + s.tokens.cache_read + s.tokens.cache_creation;
            breaks += s.cache_breaks;
            compactions += e.compactions.values().sum::<u64>();
            dropped += s.info_loss.tokens_dropped;
            misses += s.info_loss.recall_misses;
            rereads += s.info_loss.rereads_after_compaction;
            peak = peak.max(s.peak_context_tokens);
            requests += s.requests;
            diverge += usize::from(e.replies_diverge);
            references_lost += e.references_lost();
        }
        let _ = p;
        let loss = dropped as f64 + RECALL_MISS_TOKENS * misses as f64;
        let mut row = vec![index.to_string()];
        row.extend(grid.point(index).iter().map(|v| (*v).to_owned()));
        row.extend([
            format!("{cost:.6}"),
            format!("{:.6}", if denominator == 0 { 0.0 } else { read as f64 / denominator as f64 }),
            breaks.to_string(),
            compactions.to_string(),
            dropped.to_string(),
            misses.to_string(),
            rereads.to_string(),
            format!("{loss:.0}"),
            peak.to_string(),
            requests.to_string(),
            diverge.to_string(),
            references_lost.to_string(),
            digests.join(" "),
        ]);
        rows.push(row);
        peaks.push(input_peaks);
    }
    Ok(PointResults { rows, peaks })
}

/// What the inputs tell the analysis besides the rows: their names and, per input and
/// parameter, the reason it would have had no effect ([`Reason::find_with`]). A partial CSV carries
/// them in `# input` and `# reason` lines, so a merge of shards says what the whole run says.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InputNotes {
    pub names: Vec<String>,
    /// `reasons[input][param]`.
    pub reasons: Vec<Vec<Reason>>,
}

impl InputNotes {
    /// The notes of `inputs` over the grid, recorded sessions run by `engine` (through the
    /// agent, no knob is out of a session's reach).
    pub fn new_with(grid: &Grid, base: &Strategy, inputs: &[Input], engine: Engine) -> anyhow::Result<InputNotes> {
        let strategies: Vec<Strategy> = (0..grid.len()).map(|i| grid.strategy(base, i)).collect::<anyhow::Result<_>>()?;
        let reasons = inputs.iter().map(|input| (0..grid.params.len()).map(|k| Reason::find_with(grid, &strategies, k, input, engine)).collect()).collect();
        Ok(InputNotes { names: inputs.iter().map(|i| i.name.clone()).collect(), reasons })
    }

    fn lines(&self) -> String {
        let mut out = String::new();
        for (i, name) in self.names.iter().enumerate() {
            out.push_str(&format!("# input {i} {}\n", name.replace('\n', " ")));
            for (k, reason) in self.reasons[i].iter().enumerate() {
                out.push_str(&format!("# reason {i} {k} {}\n", reason.encode()));
            }
        }
        out
    }

    /// Reads the `# input` / `# reason` lines back (line numbers from 2, after the signature).
    fn parse(path: &Path, lines: &[&str]) -> anyhow::Result<InputNotes> {
        let mut notes = InputNotes::default();
        for (n, line) in lines.iter().enumerate() {
            let bad = || anyhow::anyhow!("{}: line {}: not an `# input I NAME` or `# reason I K REASON` line", path.display(), n + 2);
            if let Some(rest) = line.strip_prefix("# input ") {
                let (i, name) = rest.split_once(' ').ok_or_else(bad)?;
                if i.parse::<usize>().ok() != Some(notes.names.len()) {
                    return Err(bad());
                }
                notes.names.push(name.to_owned());
                notes.reasons.push(Vec::new());
            } else if let Some(rest) = line.strip_prefix("# reason ") {
                let mut parts = rest.splitn(3, ' ');
                let (i, k, reason) = (parts.next(), parts.next(), parts.next().and_then(Reason::decode));
                let (Some(i), Some(k), Some(reason)) = (i.and_then(|i| i.parse::<usize>().ok()), k.and_then(|k| k.parse::<usize>().ok()), reason) else {
                    return Err(bad());
                };
                match notes.reasons.get_mut(i) {
                    Some(list) if list.len() == k => list.push(reason),
                    _ => return Err(bad()),
                }
            } else {
                return Err(bad());
            }
        }
        Ok(notes)
    }
}

/// A CSV of rows under the grid's signature line; a partial one (`shard`) carries the notes.
pub fn rows_csv(grid: &Grid, shard: Option<(usize, usize)>, rows: &[Vec<String>], notes: &InputNotes) -> Vec<u8> {
    let mut out = grid.signature().into_bytes();
    if let Some((i, n)) = shard {
        out.extend(format!(" shard={i}/{n}").bytes());
    }
    out.push(b'\n');
    if shard.is_some() {
        out.extend(notes.lines().bytes());
    }
    let mut writer = csv::Writer::from_writer(out);
    writer.write_record(grid.header()).expect("csv to memory");
    for row in rows {
        writer.write_record(row).expect("csv to memory");
    }
    writer.into_inner().expect("csv to memory")
}

/// A CSV written by [`rows_csv`], parsed: the grid signature without the shard, the inputs'
/// notes, the header, and the rows, each with the line it was read from.
#[derive(Debug, Clone, PartialEq)]
pub struct PartialCsv {
    pub signature: String,
    pub notes: InputNotes,
    pub header: Vec<String>,
    /// The header's line in the file.
    pub header_line: usize,
    pub rows: Vec<(usize, Vec<String>)>,
}

/// A sweep CSV joined back: signature (without the shard), notes, header, rows.
pub type ParsedCsv = (String, InputNotes, Vec<String>, Vec<Vec<String>>);

/// Parses a CSV written by [`rows_csv`] from a file ([`parse_csv_text`]).
pub fn parse_csv(path: &Path) -> anyhow::Result<PartialCsv> {
    let text = crate::input::read_text(path)?;
    parse_csv_text(&text, &path.display().to_string())
}

/// Parses the text of a partial CSV; `file` names it in messages, every one of which names the
/// line. A row whose point index is not a number, or whose width is not the header's, is an
/// error: a merge must not lose a point.
pub fn parse_csv_text(text: &str, file: &str) -> anyhow::Result<PartialCsv> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let (first, mut rest) = text.split_once('\n').unwrap_or((text, ""));
    if !first.starts_with("# ctxsim sweep grid ") {
        bail!("{file}:1: not a ctxsim sweep CSV (no grid signature `# ctxsim sweep grid ...`)");
    }
    let signature = first.trim_end_matches('\r').split(" shard=").next().unwrap_or(first).to_owned();
    let mut note_lines = Vec::new();
    while rest.starts_with('#') {
        let (line, tail) = rest.split_once('\n').unwrap_or((rest, ""));
        note_lines.push(line.trim_end_matches('\r'));
        rest = tail;
    }
    let notes = InputNotes::parse(Path::new(file), &note_lines)?;
    // The header's line: after the signature and the notes.
    let header_line = 2 + note_lines.len();
    let mut reader = csv::Reader::from_reader(rest.as_bytes());
    let header: Vec<String> = match reader.headers() {
        Ok(h) if !h.is_empty() && h.iter().next() != Some("") => h.iter().map(str::to_owned).collect(),
        Ok(_) => bail!("{file}:{header_line}: no header row"),
        Err(e) => bail!("{file}:{header_line}: bad header row: {}", crate::input::cap_message(&e.to_string())),
    };
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| {
            // The csv crate counts lines from the text it was given, which starts at the header.
            let line = e.position().map_or(0, |p| p.line() as usize + header_line - 1);
            anyhow::anyhow!("{file}:{line}: {}", crate::input::cap_message(&e.to_string()))
        })?;
        let line = record.position().map_or(0, |p| p.line() as usize + header_line - 1);
        if record.get(0).is_none_or(|index| index.parse::<usize>().is_err()) {
            bail!("{file}:{line}: point: `{}` is not a point index", crate::input::excerpt(record.get(0).unwrap_or("")));
        }
        rows.push((line, record.iter().map(str::to_owned).collect()));
    }
    Ok(PartialCsv { signature, notes, header, header_line, rows })
}

/// Joins partial CSVs into the rows of the whole grid, verifying they share one grid and cover
/// every point exactly once. Returns (signature, notes, header, rows in point order). Every
/// message names the file (and the line) at fault: a duplicated point both of its places, a
/// missing point the files given.
pub fn merge(paths: &[std::path::PathBuf]) -> anyhow::Result<ParsedCsv> {
    let mut first: Option<(String, PartialCsv)> = None;
    let mut rows: Vec<(usize, String, usize, Vec<String>)> = Vec::new();
    // Where each file's rows would start (the line after its header), for a grid with no rows.
    let mut row_starts: Vec<String> = Vec::new();
    for path in paths {
        let name = path.display().to_string();
        let part = parse_csv(path)?;
        row_starts.push(format!("{name}:{}", part.header_line + 1));
        if let Some((first_name, first)) = &first {
            if first.signature != part.signature {
                bail!("{name}:1: a different grid ({}) from the first file {first_name} ({})", part.signature, first.signature);
            }
            if first.notes != part.notes {
                bail!("{name}:2: its inputs' notes differ from the first file {first_name}'s");
            }
            if first.header != part.header {
                bail!("{name}:{}: columns differ from the first file {first_name}", part.header_line);
            }
        }
        for (line, row) in &part.rows {
            let index: usize = row[0].parse().expect("checked by parse_csv");
            rows.push((index, name.clone(), *line, row.clone()));
        }
        if first.is_none() {
            first = Some((name, part));
        }
    }
    let (_, first) = first.context("no partial CSV given")?;
    let signature = first.signature;
    let points: usize = signature
        .rsplit("points=")
        .next()
        .and_then(|n| n.trim().parse().ok())
        .with_context(|| format!("{}:1: grid signature without points=", paths[0].display()))?;
    rows.sort_by_key(|(index, ..)| *index);
    for (i, (index, file, line, _)) in rows.iter().enumerate() {
        if i > 0 && rows[i - 1].0 == *index {
            let (_, first_file, first_line, _) = &rows[i - 1];
            bail!("{file}:{line}: point {index} is duplicated (also at {first_file}:{first_line}; shards overlap)");
        }
        if *index >= points {
            bail!("{file}:{line}: point {index} is outside the grid of {points} points");
        }
    }
    let mut expected = 0;
    for (index, ..) in &rows {
        if *index != expected {
            break;
        }
        expected += 1;
    }
    if rows.len() != points {
        let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        // Where the point is missing: after the row of the point before it (or before the first).
        let place = match expected.checked_sub(1).and_then(|before| rows.get(before)) {
            Some((before, file, line, _)) => format!("{file}:{line}: point {expected} is missing after point {before} here"),
            None => match rows.first() {
                Some((_, file, line, _)) => format!("{file}:{line}: point {expected} is missing before this row"),
                None => format!("{}: point {expected} is missing (no rows after the header)", row_starts.join(", ")),
            },
        };
        bail!("{place}: the shards {} hold {} of the grid's {points} points", names.join(", "), rows.len());
    }
    Ok((signature, first.notes, first.header, rows.into_iter().map(|(.., row)| row).collect()))
}

/// The recommendation and the front, from the rows.
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    /// Row positions of the Pareto front.
    pub front: Vec<usize>,
    #[serde(skip)]
    pub points: Vec<ParetoPoint>,
    pub bound: f64,
    /// The recommended row; `None` when no point is within the bound or when the points do not
    /// differ on the objectives (then `equal` says how).
    pub recommended: Option<usize>,
    /// The other rows tied with the recommended one on cost and information loss.
    pub tied: Vec<usize>,
    /// Set when the grid gives nothing to choose from: every point's results are identical, or
    /// every point ties on both objectives.
    pub equal: Option<String>,
    /// Per input, the parameters that changed no result there.
    pub no_effect: Vec<NoEffect>,
    #[serde(skip)]
    pub text: String,
}

/// Per input, the parameters that changed no result there, with their reasons: the outcome
/// digests of the rows' last column compared by [`crate::report::effects::param_effects`].
pub fn no_effect(header: &[String], rows: &[Vec<String>], notes: &InputNotes) -> Vec<NoEffect> {
    let Some(column) = header.iter().position(|h| h == OUTCOMES_COLUMN) else { return Vec::new() };
    let cells: Vec<Vec<(&str, u64)>> = rows
        .iter()
        .map(|r| r[column].split(' ').map(|c| c.split_once('/').map_or((c, 0), |(d, p)| (d, p.parse().unwrap_or(0)))).collect())
        .collect();
    let outcomes: Vec<Vec<String>> = cells.iter().map(|r| r.iter().map(|(d, _)| (*d).to_owned()).collect()).collect();
    let grid = Grid::from_rows(header, rows, notes.names.len());
    crate::report::effects::param_effects(&grid, &outcomes)
        .into_iter()
        .filter(|e| e.distinct == 1)
        .map(|e| {
            let peak = cells.iter().filter_map(|r| r.get(e.input).map(|c| c.1)).max().unwrap_or(0);
            let reason = notes.reasons.get(e.input).and_then(|r| r.get(e.param)).map_or_else(String::new, |r| r.text(peak));
            NoEffect { input: notes.names.get(e.input).cloned().unwrap_or_default(), param: grid.params[e.param].key.clone(), reason }
        })
        .collect()
}

pub fn analyze(header: &[String], rows: &[Vec<String>], max_loss: Option<f64>, no_effect: Vec<NoEffect>) -> Analysis {
    let col = |name: &str| header.iter().position(|h| h == name).expect("metric column present");
    let (cost, loss, hit, breaks, misses) = (col("cost_usd"), col("information_loss"), col("cache_hit_ratio"), col("cache_breaks"), col("recall_misses"));
    let knobs = &header[1..cost];
    let label = |row: &Vec<String>| knobs.iter().zip(&row[1..cost]).map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
    let points: Vec<ParetoPoint> = rows
        .iter()
        .map(|r| ParetoPoint { label: format!("p{}", r[0]), cost_usd: r[cost].parse().unwrap_or(0.0), information_loss: r[loss].parse().unwrap_or(0.0) })
        .collect();
    let front = pareto_front(&points);
    let losses: Vec<f64> = front.iter().map(|&i| points[i].information_loss).collect();
    let lo = losses.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = losses.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let bound = max_loss.unwrap_or(if front.is_empty() { 0.0 } else { lo + 0.25 * (hi - lo) });
    let same_objectives = |a: usize, b: usize| points[a].cost_usd == points[b].cost_usd && points[a].information_loss == points[b].information_loss;
    // Nothing to choose from: every result identical (every metric cell, the outcome digests
    // included), or every point tied on both objectives.
    let equal = if rows.len() < 2 {
        None
    } else if rows.iter().all(|r| r[cost..] == rows[0][cost..]) {
        Some(format!("every one of the {} points gave the same results on every input: the swept knobs changed nothing here", rows.len()))
    } else if (1..rows.len()).all(|i| same_objectives(0, i)) {
        Some(format!(
            "all {} points tie on cost (${}) and information loss ({}); they differ only in other metrics, so the objectives cannot choose",
            rows.len(),
            rows[0][cost],
            rows[0][loss]
        ))
    } else {
        None
    };
    let recommended = if equal.is_some() {
        None
    } else {
        front
            .iter()
            .copied()
            .filter(|&i| points[i].information_loss <= bound)
            .min_by(|&a, &b| points[a].cost_usd.total_cmp(&points[b].cost_usd).then(a.cmp(&b)))
    };
    let tied: Vec<usize> = recommended.map_or_else(Vec::new, |r| (0..rows.len()).filter(|&i| i != r && same_objectives(r, i)).collect());
    let mut text = String::new();
    for warning in &no_effect {
        text.push_str(&format!("warning: {}\n", warning.line()));
    }
    text.push_str(&format!(
        "{} points, {} on the Pareto front of cost against information loss (tokens dropped + {} × recall misses).\n",
        rows.len(),
        front.len(),
        RECALL_MISS_TOKENS
    ));
    text.push_str(&format!("Rule: the cheapest point on the front with information loss ≤ {bound:.0}{}.\n", if max_loss.is_some() { " (--max-loss)" } else { " (front's lowest loss + 25% of its range)" }));
    match (recommended, &equal) {
        (_, Some(why)) => text.push_str(&format!("Recommended: none ({why}).\n")),
        (Some(i), None) => {
            let r = &rows[i];
            text.push_str(&format!(
                "Recommended: point {} ({}): cost ${}, hit ratio {}, {} cache breaks, information loss {} ({} recall misses).\n",
                r[0], label(r), r[cost], r[hit], r[breaks], r[loss], r[misses]
            ));
            if !tied.is_empty() {
                let names: Vec<&str> = tied.iter().map(|&t| rows[t][0].as_str()).collect();
                let (noun, verb) = if names.len() == 1 { ("point", "has") } else { ("points", "have") };
                text.push_str(&format!(
                    "Tie: {noun} {} {verb} the same cost and information loss as point {}; the recommendation is over these {} tied points (the lowest index is shown), not a choice between them.\n",
                    names.join(", "),
                    r[0],
                    tied.len() + 1
                ));
            }
        }
        (None, None) => text.push_str("Recommended: none (no point on the front within the bound).\n"),
    }
    text.push_str("Front:\n");
    for &i in &front {
        let r = &rows[i];
        text.push_str(&format!("  point {:>4}  cost ${}  loss {:>10}  {}\n", r[0], r[cost], r[loss], label(r)));
    }
    Analysis { front, points, bound, recommended, tied, equal, no_effect, text }
}

/// `sweep.json`: the grid's signature, every point's cells by column, and the analysis.
fn sweep_json(signature: &str, header: &[String], rows: &[Vec<String>], analysis: &Analysis) -> anyhow::Result<Vec<u8>> {
    let points: Vec<serde_json::Map<String, serde_json::Value>> =
        rows.iter().map(|r| header.iter().zip(r).map(|(h, v)| (h.clone(), serde_json::Value::String(v.clone()))).collect()).collect();
    let label = |i: usize| rows[i][0].parse::<usize>().unwrap_or(i);
    let json = serde_json::json!({
        "grid": signature,
        "engine": engine_of(signature).map(Engine::name),
        "points": points,
        "front": analysis.front.iter().map(|&i| label(i)).collect::<Vec<_>>(),
        "bound": analysis.bound,
        "recommended": analysis.recommended.map(label),
        "tied_with_recommended": analysis.tied.iter().map(|&i| label(i)).collect::<Vec<_>>(),
        "no_recommendation_because": analysis.equal,
        "no_effect": analysis.no_effect,
        "warnings": analysis.no_effect.iter().map(NoEffect::line).collect::<Vec<_>>(),
    });
    let mut out = serde_json::to_vec_pretty(&json)?;
    out.push(b'\n');
    Ok(out)
}

/// The engine a grid signature names (`engine=agent`), if its inputs had recorded sessions.
fn engine_of(signature: &str) -> Option<Engine> {
    Engine::named(signature.split_whitespace().find_map(|w| w.strip_prefix("engine="))?)
}

/// `no_effect.csv`: one line per input and parameter that changed no result there.
fn no_effect_csv(no_effect: &[NoEffect]) -> anyhow::Result<Vec<u8>> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    writer.write_record(["input", "param", "reason"])?;
    for n in no_effect {
        writer.write_record([n.input.as_str(), n.param.as_str(), n.reason.as_str()])?;
    }
    Ok(writer.into_inner()?)
}

/// Writes sweep.csv, sweep.json, no_effect.csv, recommendation.txt, pareto.svg, pareto.png and
/// sweep.html under `dir`.
pub fn write_outputs(dir: &Path, signature: &str, header: &[String], rows: &[Vec<String>], max_loss: Option<f64>, no_effect: Vec<NoEffect>) -> anyhow::Result<Analysis> {
    use crate::report::output::write_atomic;
    let mut out = signature.as_bytes().to_vec();
    out.push(b'\n');
    let mut writer = csv::Writer::from_writer(out);
    writer.write_record(header)?;
    for row in rows {
        writer.write_record(row)?;
    }
    write_atomic(&dir.join("sweep.csv"), &writer.into_inner()?)?;
    let mut analysis = analyze(header, rows, max_loss, no_effect);
    if let Some(engine) = engine_of(signature) {
        // What ran the recorded sessions, after the warnings.
        let at = analysis.text.lines().take_while(|l| l.starts_with("warning: ")).map(|l| l.len() + 1).sum();
        analysis.text.insert_str(at, &format!("Engine: {}.\n", engine.sentence()));
    }
    write_atomic(&dir.join("sweep.json"), &sweep_json(signature, header, rows, &analysis)?)?;
    write_atomic(&dir.join("no_effect.csv"), &no_effect_csv(&analysis.no_effect)?)?;
    write_atomic(&dir.join("recommendation.txt"), analysis.text.as_bytes())?;
    let chart = pareto_chart("Cost against information loss", &analysis.points, "information loss (tokens)");
    let svg = render_svg(&chart).map_err(|e| anyhow::anyhow!("{}: {}", e.chart, e.message))?;
    write_atomic(&dir.join("pareto.svg"), svg.as_bytes())?;
    write_png(&chart, &dir.join("pareto.png")).map_err(|e| anyhow::anyhow!("{}: {}", e.chart, e.message))?;
    let warnings: String = analysis
        .no_effect
        .iter()
        .map(|n| format!("<li class=\"warning\">{}</li>", crate::report::html::escape(&n.line())))
        .collect();
    let warnings = if warnings.is_empty() { String::new() } else { format!("<section id=\"no-effect\"><h2>Parameters without effect</h2><ul>{warnings}</ul></section>") };
    let html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>ctxsim sweep</title></head><body><h1>Sweep</h1>{warnings}<section id=\"pareto\">{svg}</section><pre>{}</pre></body></html>\n",
        crate::report::html::escape(&analysis.text)
    );
    write_atomic(&dir.join("sweep.html"), html.as_bytes())?;
    Ok(analysis)
}
