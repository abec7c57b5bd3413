//! The audit's outputs: the table (fits 100 columns), CSV, JSON and the HTML report.

use std::fmt::Write as _;

use serde::Serialize;

use super::columns::{Columns, Values};
use crate::replay::audit::{AuditRow, Engine, GroupBy, SessionAudit, whatifs_available};

/// The whole audit as `--json` prints it.
#[derive(Debug, Serialize)]
pub struct AuditJson<'a> {
    pub by: &'static str,
    /// What ran the what-ifs: `agent`.
    pub engine: &'static str,
    pub rows: &'a [AuditRow],
    pub totals: &'a AuditRow,
    pub whatifs_available: &'static str,
    /// Per session, with every detail (only when grouping by session).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions: Option<&'a [SessionAudit]>,
}

pub fn by_name(by: GroupBy) -> &'static str {
    match by {
        GroupBy::Session => "session",
        GroupBy::Project => "project",
        GroupBy::Day => "day",
    }
}

fn fit(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n <= width {
        format!("{text:<width$}")
    } else {
        // Keep the end: project directory names differ at their end.
        let tail: String = text.chars().skip(n - (width - 1)).collect();
        format!("…{tail}")
    }
}

fn tokens(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}k", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1}M", n as f64 / 1e6),
        _ => format!("{:.2}G", n as f64 / 1e9),
    }
}

/// Dollars with the sign in front: `$1.20`, `-$0.11`.
fn usd(v: f64) -> String {
    if v < 0.0 { format!("-${:.2}", -v) } else { format!("${v:.2}") }
}

/// A what-if's name in the table's last column (17 characters): `1h`, `pct50`, `no-mc`, ...
fn whatif_label(name: &str) -> String {
    let name = name.trim_start_matches("ttl_main=").replace("autocompact_pct=", "pct");
    match name.trim_start_matches("preset=") {
        "claude-code-no-microcompact" => "no-mc".to_owned(),
        "claude-code-summary-only" => "sum-only".to_owned(),
        "claude-code-no-boundary" => "no-bound".to_owned(),
        "claude-code-mcp-in-system" => "mcp-sys".to_owned(),
        "claude-code-mcp-delta" => "mcp-delta".to_owned(),
        "claude-code-eager-tools" => "eager".to_owned(),
        "claude-code-no-session-memory" => "no-sm".to_owned(),
        "claude-code-1h" => "cc-1h".to_owned(),
        "observation-masking" => "obs-mask".to_owned(),
        "context-editing" => "ctx-edit".to_owned(),
        "server-compaction" => "srv-comp".to_owned(),
        other => other.to_owned(),
    }
}

/// The best what-if's cell in at most `width` characters: its label, saving and percent; the
/// percent left out where the three do not fit (the details line below and the JSON keep it),
/// then the label cut.
fn whatif_cell(row: &AuditRow, width: usize) -> String {
    let Some(w) = &row.best_whatif else { return "-".to_owned() };
    let label = whatif_label(&w.name);
    let full = format!("{label} ${:.2} {:.1}%", w.saving_usd, w.saving_pct);
    if full.chars().count() <= width {
        return full;
    }
    let saving = format!(" ${:.2}", w.saving_usd);
    let room = width.saturating_sub(saving.chars().count()).max(2);
    format!("{}{saving}", fit(&label, room).trim_end())
}

/// Wraps `items` joined by `sep` into lines of at most `width` characters, each starting with
/// `indent`.
fn wrap(out: &mut String, indent: &str, items: &[String], width: usize) {
    let avail = width - indent.chars().count();
    let mut pieces = Vec::new();
    for item in items {
        if item.chars().count() <= avail {
            pieces.push(item.clone());
            continue;
        }
        // An item wider than a line is cut after its commas; a part still wider, between words.
        let mut piece = String::new();
        for part in item.split_inclusive(',') {
            if !piece.is_empty() && piece.chars().count() + part.chars().count() > avail {
                pieces.push(std::mem::take(&mut piece));
            }
            if part.chars().count() <= avail {
                piece.push_str(part);
                continue;
            }
            for word in part.split_inclusive(' ') {
                if !piece.trim().is_empty() && piece.chars().count() + word.trim_end().chars().count() > avail {
                    pieces.push(std::mem::take(&mut piece));
                }
                piece.push_str(word);
            }
        }
        pieces.push(piece);
        for p in &mut pieces {
            *p = p.trim().to_owned();
        }
    }
    let mut line = indent.to_owned();
    for item in &pieces {
        let sep = if line.len() > indent.len() { " · " } else { "" };
        if line.chars().count() + sep.chars().count() + item.chars().count() > width && line.len() > indent.len() {
            out.push_str(line.trim_end());
            out.push('\n');
            line = format!("{indent}{item}");
        } else {
            line.push_str(sep);
            line.push_str(item);
        }
    }
    if line.len() > indent.len() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

fn details(row: &AuditRow, by: GroupBy, breakdown: bool) -> Vec<String> {
    let mut items = Vec::new();
    if by == GroupBy::Session {
        items.push(format!("project {}", row.project));
    }
    if let (Some(first), Some(last)) = (&row.first, &row.last) {
        items.push(format!("{} → {}", &first[..16.min(first.len())].replace('T', " "), &last[..16.min(last.len())].replace('T', " ")));
    }
    if !row.versions.is_empty() {
        items.push(format!("v{}", row.versions.join(",")));
    }
    if !breakdown && !row.models.is_empty() {
        items.push(row.models.join(","));
    }
    for (cause, loss) in &row.breaks {
        items.push(format!("{cause} {}× {} ${:.2}", loss.breaks, tokens(loss.tokens), loss.cost_usd));
    }
    if row.compactions_auto + row.compactions_manual > 0 {
        let pre = row.compaction_max_pre_tokens.map(|p| format!(", max preTokens {}", tokens(p))).unwrap_or_default();
        items.push(format!("compactions {} auto {} manual{pre}", row.compactions_auto, row.compactions_manual));
    }
    for (name, saving) in &row.whatif_savings {
        let mut notes = Vec::new();
        match row.whatifs_diverging.get(name).map(Vec::as_slice) {
            None | Some([]) => {}
            Some([call]) if row.sessions == 1 => notes.push(format!("replies diverge from call {call}")),
            Some(calls) => notes.push(format!("replies diverge in {} sessions", calls.len())),
        }
        // A saving bought with context the model no longer sees says how much (the run as
        // recorded's loss subtracted).
        let mut loss = Vec::new();
        if let Some(d) = row.whatifs_loss.get(name) {
            let signed = |n: i64| if n > 0 { format!("+{}", tokens(n.unsigned_abs())) } else { format!("-{}", tokens(n.unsigned_abs())) };
            if d.info_loss != 0 {
                loss.push(format!("{} references lost or re-read", signed(d.info_loss)));
            }
            if d.tokens_dropped != 0 {
                loss.push(format!("{} tokens dropped", signed(d.tokens_dropped)));
            }
        }
        if !loss.is_empty() {
            notes.push(loss.join(", "));
        }
        let notes = if notes.is_empty() { String::new() } else { format!(" ({})", notes.join("; ")) };
        items.push(format!("what-if {name}: {}{notes}", usd(*saving)));
    }
    let mut unchanged: Vec<&str> = row.whatifs_no_effect.keys().filter(|n| !row.whatif_savings.contains_key(*n)).map(String::as_str).collect();
    // Through the agent the presets do change the session; "preset" unpriced means none of them
    // saves at no more information loss, which is not "no effect".
    let preset_saves_nothing = unchanged.contains(&"preset");
    unchanged.retain(|n| !(preset_saves_nothing && *n == "preset"));
    if !unchanged.is_empty() {
        items.push(format!("no effect: {}", unchanged.join(", ")));
    }
    if preset_saves_nothing {
        items.push("no preset saves at no more information loss".to_owned());
    }
    let refused: Vec<&str> = row.whatifs_not_comparable.keys().filter(|n| !row.whatif_savings.contains_key(*n)).map(String::as_str).collect();
    if !refused.is_empty() {
        items.push(format!("not comparable (requests blocked): {}", refused.join(", ")));
    }
    items
}

const WIDTH: usize = 100;

/// The table: one line per row (largest loss first) and its details under it, wrapped at 100
/// columns; then the total and the note on what-ifs.
pub fn audit_table(rows: &[AuditRow], total: &AuditRow, by: GroupBy, breakdown: bool) -> String {
    let mut out = String::new();
    let key = match by {
        GroupBy::Session => "session",
        GroupBy::Project => "project",
        GroupBy::Day => "day (UTC)",
    };
    let _ = writeln!(
        out,
        "{} {:>4} {:>5} {:>7} {:>9} {:>4} {:>7} {:>8} {:>6} {:<5} best what-if",
        fit(key, 18),
        "sess",
        "calls",
        "tokens",
        "billed $",
        "brk",
        "re-made",
        "lost $",
        "lost%",
        "ttl",
    );
    let line = |out: &mut String, name: &str, row: &AuditRow| {
        let brk: u64 = row.breaks.values().map(|b| b.breaks).sum();
        let lost_pct = if row.cost_usd > 0.0 { 100.0 * row.lost.cost_usd / row.cost_usd } else { 0.0 };
        let fixed = format!(
            "{} {:>4} {:>5} {:>7} {:>9.2} {:>4} {:>7} {:>8.2} {:>5.1}% {:<5} ",
            fit(name, 18),
            row.sessions,
            row.calls,
            tokens(row.tokens.total()),
            row.cost_usd,
            brk,
            tokens(row.lost.tokens),
            row.lost.cost_usd,
            lost_pct,
            fit(&row.ttl, 5),
        );
        let cell = whatif_cell(row, WIDTH.saturating_sub(fixed.chars().count()));
        let _ = writeln!(out, "{fixed}{cell}");
    };
    for row in rows {
        line(&mut out, &row.key, row);
        wrap(&mut out, "    ", &details(row, by, breakdown), WIDTH);
        if breakdown {
            for (label, m) in &row.by_model {
                let _ = writeln!(out, "    └ {} {:>5} {:>8} {:>10.2}", fit(label, 28), m.calls, tokens(m.tokens.total()), m.cost_usd);
            }
        }
    }
    let _ = writeln!(out, "{}", "─".repeat(WIDTH));
    line(&mut out, "total", total);
    wrap(&mut out, "    ", &details(total, GroupBy::Project, breakdown), WIDTH);
    if breakdown {
        for (label, m) in &total.by_model {
            let _ = writeln!(out, "    └ {} {:>5} {:>8} {:>10.2}", fit(label, 28), m.calls, tokens(m.tokens.total()), m.cost_usd);
        }
    }
    let mut note = String::new();
    wrap(
        &mut note,
        "",
        &[
            "re-made: tokens cached again after a cache break; lost $: their write price minus read price".to_owned(),
            "references lost or re-read, tokens dropped: a what-if's information loss less the run as recorded's".to_owned(),
            format!("what-ifs {}: {}", engine_words(total.engine), whatifs_available(engine_of(total.engine))),
        ]
        .into_iter()
        .collect::<Vec<_>>(),
        WIDTH,
    );
    out.push('\n');
    out.push_str(&note);
    out
}

/// The engine named `name` (the agent, the only one).
fn engine_of(name: &str) -> Engine {
    Engine::named(name).unwrap_or_default()
}

/// How the outputs say what ran the what-ifs.
fn engine_words(name: &str) -> &'static str {
    match engine_of(name) {
        Engine::Agent => "through the agent (the default engine, saving = run as recorded less run under the what-if)",
    }
}

/// The cause columns every table has, whatever the data: the closed list of `find_breaks`.
pub fn break_causes() -> impl Iterator<Item = &'static str> {
    crate::replay::breaks::CAUSE_ORDER.iter().copied().chain(["unexplained"])
}

/// The rows (and the total, when given, as a last row keyed `total`) as typed columns: the CSV
/// and the Parquet table. The columns are fixed, whatever the data.
pub fn audit_columns(rows: &[AuditRow], total: Option<&AuditRow>, by: GroupBy) -> Columns {
    let all: Vec<&AuditRow> = rows.iter().chain(total).collect();
    let text = |f: &dyn Fn(&AuditRow) -> String| Values::Str(all.iter().map(|r| f(r)).collect());
    let int = |f: &dyn Fn(&AuditRow) -> u64| Values::Int(all.iter().map(|r| f(r) as i64).collect());
    let usd = |f: &dyn Fn(&AuditRow) -> f64| Values::Float(all.iter().map(|r| f(r)).collect(), Some(6));
    let mut c = Columns::default();
    c.push(by_name(by), text(&|r| r.key.clone()));
    c.push("engine", text(&|r| r.engine.to_owned()));
    c.push("project", text(&|r| r.project.clone()));
    c.push("sessions", int(&|r| r.sessions));
    c.push("first", text(&|r| r.first.clone().unwrap_or_default()));
    c.push("last", text(&|r| r.last.clone().unwrap_or_default()));
    c.push("versions", text(&|r| r.versions.join(" ")));
    c.push("models", text(&|r| r.models.join(" ")));
    c.push("calls", int(&|r| r.calls));
    c.push("input_tokens", int(&|r| r.tokens.input));
    c.push("output_tokens", int(&|r| r.tokens.output));
    c.push("cache_write_5m_tokens", int(&|r| r.tokens.cache_write_5m));
    c.push("cache_write_1h_tokens", int(&|r| r.tokens.cache_write_1h));
    c.push("cache_read_tokens", int(&|r| r.tokens.cache_read));
    c.push("total_tokens", int(&|r| r.tokens.total()));
    c.push("cost_usd", usd(&|r| r.cost_usd));
    c.push("breaks", int(&|r| r.breaks.values().map(|b| b.breaks).sum()));
    c.push("remade_tokens", int(&|r| r.lost.tokens));
    c.push("lost_usd", usd(&|r| r.lost.cost_usd));
    for cause in break_causes() {
        let of = move |r: &AuditRow| r.breaks.get(cause).cloned().unwrap_or_default();
        c.push(format!("{cause}_breaks"), int(&|r| of(r).breaks));
        c.push(format!("{cause}_tokens"), int(&|r| of(r).tokens));
        c.push(format!("{cause}_usd"), usd(&|r| of(r).cost_usd));
    }
    c.push("ttl", text(&|r| r.ttl.clone()));
    c.push("compactions_auto", int(&|r| r.compactions_auto));
    c.push("compactions_manual", int(&|r| r.compactions_manual));
    c.push("compaction_max_pre_tokens", int(&|r| r.compaction_max_pre_tokens.unwrap_or(0)));
    c.push("best_whatif", text(&|r| r.best_whatif.as_ref().map(|w| w.name.clone()).unwrap_or_default()));
    c.push("best_whatif_saving_usd", usd(&|r| r.best_whatif.as_ref().map_or(0.0, |w| w.saving_usd)));
    c.push("best_whatif_saving_pct", Values::Float(all.iter().map(|r| r.best_whatif.as_ref().map_or(0.0, |w| w.saving_pct)).collect(), Some(3)));
    c
}

/// One CSV line per row, then the total.
pub fn audit_csv(rows: &[AuditRow], total: &AuditRow, by: GroupBy) -> Vec<u8> {
    audit_columns(rows, Some(total), by).to_csv()
}

// ---------------------------------------------------------------------------------------------
// HTML: index.html with three plots (inline SVG) and one page per session in the top list.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::html::escape;

/// Sessions listed (and given a page) in the report, by dollars lost.
pub const TOP_SESSIONS: usize = 20;

const PALETTE: [&str; 10] = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
const BILLED_REST: &str = "billed, no break";

fn svg_open(out: &mut String, id: &str, w: u32, h: u32, title: &str) {
    let _ = write!(
        out,
        r#"<svg id="{id}" class="plot" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11"><title>{}</title>"#,
        escape(title)
    );
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

/// Cost per day, stacked: the dollars lost per cause of break, and the rest of the bill.
pub fn cost_per_day_svg(audits: &[SessionAudit]) -> String {
    let mut days: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for a in audits {
        for (day, share) in &a.days {
            let d = days.entry(day.clone()).or_default();
            let lost: f64 = share.breaks.values().map(|b| b.cost_usd).sum();
            *d.entry(BILLED_REST.to_owned()).or_default() += share.cost_usd - lost;
            for (cause, loss) in &share.breaks {
                *d.entry(cause.clone()).or_default() += loss.cost_usd;
            }
        }
    }
    let mut series: Vec<String> = vec![BILLED_REST.to_owned()];
    series.extend(break_causes().filter(|c| days.values().any(|d| d.contains_key(*c))).map(String::from));
    let (w, h, left, bottom, top) = (900u32, 340u32, 60.0, 60.0, 30.0);
    let plot_h = h as f64 - bottom - top;
    let max = nice_max(days.values().map(|d| d.values().sum::<f64>()).fold(0.0, f64::max));
    let n = days.len().max(1) as f64;
    let slot = (w as f64 - left - 180.0) / n;
    let mut out = String::new();
    svg_open(&mut out, "cost-per-day", w, h, "Cost per day, stacked by cause of waste");
    let _ = write!(out, r#"<text x="{left}" y="18" font-size="13">Cost per day (USD), stacked by cause of waste</text>"#);
    for i in 0..=4 {
        let v = max * i as f64 / 4.0;
        let y = top + plot_h - plot_h * i as f64 / 4.0;
        let _ = write!(out, r##"<line x1="{left}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v:.0}</text>"##, left + slot * n, left - 4.0, y + 4.0);
    }
    for (i, (day, parts)) in days.iter().enumerate() {
        let x = left + slot * i as f64 + slot * 0.1;
        let mut y = top + plot_h;
        for (s, name) in series.iter().enumerate() {
            let v = parts.get(name).copied().unwrap_or(0.0).max(0.0);
            let bh = plot_h * v / max;
            y -= bh;
            let _ = write!(
                out,
                r#"<rect class="bar" data-series="{}" x="{x:.1}" y="{y:.1}" width="{:.1}" height="{bh:.1}" fill="{}"><title>{} {}: ${v:.2}</title></rect>"#,
                escape(name),
                slot * 0.8,
                PALETTE[s % PALETTE.len()],
                escape(day),
                escape(name)
            );
        }
        let _ = write!(out, r#"<text x="{:.1}" y="{:.1}" transform="rotate(45 {:.1} {:.1})">{}</text>"#, x, top + plot_h + 14.0, x, top + plot_h + 14.0, escape(day));
    }
    for (s, name) in series.iter().enumerate() {
        let y = top + 16.0 * s as f64;
        let lx = w as f64 - 170.0;
        let _ = write!(out, r#"<rect x="{lx}" y="{y}" width="10" height="10" fill="{}"/><text x="{}" y="{}">{}</text>"#, PALETTE[s % PALETTE.len()], lx + 14.0, y + 9.0, escape(name));
    }
    out.push_str("</svg>");
    out
}

/// Summed saving of each what-if over the sessions, as horizontal bars.
pub fn whatif_svg(audits: &[SessionAudit], engine: Engine) -> String {
    // Per what-if: the summed saving and the sessions it changed.
    let mut sums: BTreeMap<String, f64> = BTreeMap::new();
    let mut changed: BTreeMap<String, usize> = BTreeMap::new();
    // Per what-if: its information loss less the run as recorded's, summed (the bar's tooltip).
    let mut losses: BTreeMap<String, crate::replay::audit::LossDelta> = BTreeMap::new();
    for a in audits {
        for w in &a.whatifs {
            *sums.entry(w.name.clone()).or_default() += w.saving_usd;
            *changed.entry(w.name.clone()).or_default() += usize::from(w.no_effect.is_none() && w.not_comparable.is_none());
            if w.no_effect.is_none() && w.not_comparable.is_none() {
                let loss = losses.entry(w.name.clone()).or_default();
                loss.info_loss += w.info_loss_delta.unwrap_or(0);
                loss.tokens_dropped += w.tokens_dropped_delta.unwrap_or(0);
            }
        }
    }
    let (w, left) = (900u32, 160.0);
    let h = 60 + 30 * sums.len().max(1) as u32;
    let max = nice_max(sums.values().map(|v| v.abs()).fold(0.0, f64::max));
    let zero = left + (w as f64 - left - 80.0) / 2.0;
    let half = (w as f64 - left - 80.0) / 2.0;
    let mut out = String::new();
    svg_open(&mut out, "whatifs", w, h, "What-ifs: saving over all sessions");
    let engine = engine.name();
    let _ = write!(out, r#"<text x="10" y="18" font-size="13">What-ifs ({engine} engine): saving over all sessions (USD; right = cheaper)</text>"#);
    let _ = write!(out, r##"<line x1="{zero}" x2="{zero}" y1="28" y2="{}" stroke="#888"/>"##, h - 10);
    if sums.is_empty() {
        let _ = write!(out, r#"<text x="{left}" y="50">no what-if applies to these sessions</text>"#);
    }
    for (i, (name, v)) in sums.iter().enumerate() {
        let y = 36.0 + 30.0 * i as f64;
        let len = half * v.abs() / max;
        let x = if *v >= 0.0 { zero } else { zero - len };
        let color = if *v >= 0.0 { PALETTE[4] } else { PALETTE[2] };
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><rect class="bar" data-series="{}" x="{x:.1}" y="{y:.1}" width="{len:.1}" height="20" fill="{color}"><title>{}</title></rect><text x="{:.1}" y="{:.1}">${v:.2} ({})</text>"#,
            left - 6.0,
            y + 14.0,
            escape(name),
            escape(name),
            escape(&{
                let loss = losses.get(name).copied().unwrap_or_default();
                format!("{name}: ${v:.2} saved; against the run as recorded {:+} references lost or re-read, {:+} tokens dropped", loss.info_loss, loss.tokens_dropped)
            }),
            zero.max(x + len) + 6.0,
            y + 14.0,
            match changed.get(name).copied().unwrap_or(0) {
                0 => "no effect".to_owned(),
                n => format!("changes {n} of {} sessions", audits.len()),
            }
        );
    }
    out.push_str("</svg>");
    out
}

/// Context per call of the main lane, breaks marked and named.
pub fn context_svg(audit: &SessionAudit) -> String {
    let (w, h, left, bottom, top) = (900u32, 360u32, 70.0, 40.0, 30.0);
    let plot_w = w as f64 - left - 20.0;
    let plot_h = h as f64 - bottom - top;
    let max = nice_max(audit.plot.iter().map(|p| p.context_tokens as f64).fold(0.0, f64::max));
    let n = audit.plot.len().max(2) as f64 - 1.0;
    let xy = |i: usize, v: u64| (left + plot_w * i as f64 / n, top + plot_h - plot_h * v as f64 / max);
    let mut out = String::new();
    svg_open(&mut out, "context-per-call", w, h, &format!("Context per call: {}", audit.session_id));
    let _ = write!(out, r#"<text x="{left}" y="18" font-size="13">Recorded context per call (tokens), main lane; cache breaks marked</text>"#);
    for i in 0..=4 {
        let v = max * i as f64 / 4.0;
        let y = top + plot_h - plot_h * i as f64 / 4.0;
        let _ = write!(out, r##"<line x1="{left}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##, left + plot_w, left - 4.0, y + 4.0, tokens(v as u64));
    }
    let points: Vec<String> = audit.plot.iter().enumerate().map(|(i, p)| {
        let (x, y) = xy(i, p.context_tokens);
        format!("{x:.1},{y:.1}")
    }).collect();
    let _ = write!(out, r#"<polyline class="series" fill="none" stroke="{}" stroke-width="1.5" points="{}"/>"#, PALETTE[0], points.join(" "));
    for (i, p) in audit.plot.iter().enumerate() {
        if let Some(cause) = &p.break_cause {
            let (x, y) = xy(i, p.context_tokens);
            let _ = write!(
                out,
                r#"<circle class="break" data-cause="{}" cx="{x:.1}" cy="{y:.1}" r="4" fill="{}"><title>call {}: {}</title></circle><text x="{:.1}" y="{:.1}" font-size="9">{}</text>"#,
                escape(cause),
                PALETTE[2],
                p.call,
                escape(cause),
                x + 5.0,
                y - 5.0,
                escape(cause)
            );
        }
    }
    let _ = write!(out, r#"<text x="{:.1}" y="{}" text-anchor="middle">call</text>"#, left + plot_w / 2.0, h - 8);
    out.push_str("</svg>");
    out
}

const STYLE: &str = "body{font-family:sans-serif;margin:2em;max-width:960px}table{border-collapse:collapse}td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child,td:nth-child(2),th:nth-child(2){text-align:left}";

fn page(title: &str, body: &str) -> String {
    format!("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/><title>{}</title><style>{STYLE}</style></head><body>\n{body}\n</body></html>\n", escape(title))
}

/// The page name of a session: its project and id, file-name safe, unique.
fn page_names(audits: &[SessionAudit]) -> Vec<String> {
    let mut used = std::collections::BTreeSet::new();
    audits
        .iter()
        .map(|a| {
            let base: String = format!("{}-{}", a.project, a.session_id).chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' }).collect();
            let mut name = format!("session-{base}.html");
            let mut k = 2;
            while !used.insert(name.clone()) {
                name = format!("session-{base}-{k}.html");
                k += 1;
            }
            name
        })
        .collect()
}

/// Writes `index.html` and one page per listed session under `dir`; returns the files written.
/// `audits` must be sorted ([`crate::replay::audit::sort_audits`]).
/// `engine`: what ran the what-ifs (named even when no session was audited).
pub fn write_audit_html(dir: &Path, audits: &[SessionAudit], engine: Engine) -> std::io::Result<Vec<PathBuf>> {
    use super::output::write_atomic;
    let top = &audits[..audits.len().min(TOP_SESSIONS)];
    let names = page_names(top);
    let mut written = Vec::new();
    let mut body = String::new();
    let total: f64 = audits.iter().map(|a| a.billed.cost_usd).sum();
    let lost: f64 = audits.iter().map(|a| a.lost.cost_usd).sum();
    let _ = write!(body, "<h1>ctxsim audit</h1><p>{} sessions, billed ${total:.2}, lost to cache breaks ${lost:.2}.</p>", audits.len());
    body.push_str("<h2>Cost per day</h2>");
    body.push_str(&cost_per_day_svg(audits));
    let _ = write!(body, "<h2>Top sessions by dollars lost</h2><table><tr><th>session</th><th>project</th><th>billed $</th><th>lost $</th><th>breaks</th><th>best what-if</th></tr>");
    for (a, name) in top.iter().zip(&names) {
        let brk: u64 = a.breaks.values().map(|b| b.breaks).sum();
        let best = a.best_whatif.as_ref().map(|w| format!("{} ${:.2}", w.name, w.saving_usd)).unwrap_or_else(|| "-".into());
        let _ = write!(
            body,
            r#"<tr><td><a href="{}">{}</a></td><td>{}</td><td>{:.2}</td><td>{:.2}</td><td>{brk}</td><td>{}</td></tr>"#,
            escape(name),
            escape(&a.session_id),
            escape(&a.project),
            a.billed.cost_usd,
            a.lost.cost_usd,
            escape(&best)
        );
    }
    body.push_str("</table>");
    body.push_str("<h2>What-ifs</h2>");
    body.push_str(&whatif_svg(audits, engine));
    let _ = write!(body, "<p>What-ifs run through the agent (<code>--engine agent</code>), each saving the agent's run as recorded less its run under the what-if: {}. A threshold a session never reaches counts as no effect; a what-if whose conversation parts from the recording says from which call in <code>--json</code>.</p>", escape(whatifs_available(engine)));
    let index = dir.join("index.html");
    write_atomic(&index, page("ctxsim audit", &body).as_bytes())?;
    written.push(index);
    for (a, name) in top.iter().zip(&names) {
        let mut body = String::new();
        let _ = write!(body, r#"<p><a href="index.html">← all sessions</a></p><h1>{}</h1><p>project {}, {} calls, billed ${:.2}, lost ${:.2}</p>"#, escape(&a.session_id), escape(&a.project), a.calls, a.billed.cost_usd, a.lost.cost_usd);
        body.push_str(&context_svg(a));
        body.push_str("<table><tr><th>cause</th><th>breaks</th><th>tokens re-made</th><th>$</th></tr>");
        for (cause, loss) in &a.breaks {
            let _ = write!(body, "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td></tr>", escape(cause), loss.breaks, loss.tokens, loss.cost_usd);
        }
        body.push_str("</table>");
        let path = dir.join(name);
        write_atomic(&path, page(&a.session_id, &body).as_bytes())?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::audit::{LossDelta, WhatIf};

    /// A session row whose what-if cell and details are as wide as real sessions make them (the
    /// largest shipped session's best what-if and its loss note ran to 101–104 characters).
    fn wide_row() -> AuditRow {
        let name = "autocompact_pct=50".to_owned();
        AuditRow {
            key: "0254bffa0c17-1c2d3e4f".to_owned(),
            engine: "agent",
            project: "oh-my-posh".to_owned(),
            sessions: 1,
            calls: 12_345,
            cost_usd: 123_456.78,
            ttl: "5m+1h".to_owned(),
            whatif_savings: [(name.clone(), 18_600.25)].into(),
            whatifs_diverging: [(name.clone(), vec![551])].into(),
            whatifs_loss: [(name.clone(), LossDelta { info_loss: 76, tokens_dropped: 1_234_567 })].into(),
            best_whatif: Some(WhatIf { name, saving_usd: 18_600.25, saving_pct: 15.1, ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn every_line_fits_the_width_and_the_cell_keeps_label_and_saving() {
        let row = wide_row();
        let table = audit_table(std::slice::from_ref(&row), &row, GroupBy::Session, false);
        for line in table.lines() {
            assert!(line.chars().count() <= WIDTH, "{} characters: {line}", line.chars().count());
        }
        let first = table.lines().nth(1).unwrap();
        assert!(first.ends_with("pct50 $18600.25"), "{first}");
        // The details keep what the cell left out, cut between words.
        assert!(table.contains("what-if autocompact_pct=50: $18600.25 (replies diverge from call 551;"), "{table}");
        assert!(table.contains("references lost or re-read"), "{table}");
    }

    #[test]
    fn a_cell_that_fits_keeps_its_percent() {
        let mut row = wide_row();
        row.calls = 12;
        row.cost_usd = 12.0;
        row.best_whatif.as_mut().unwrap().saving_usd = 1.5;
        assert_eq!(whatif_cell(&row, 40), "pct50 $1.50 15.1%");
        assert_eq!(whatif_cell(&row, 12), "pct50 $1.50");
        assert_eq!(whatif_cell(&row, 9), "…50 $1.50");
    }
}
