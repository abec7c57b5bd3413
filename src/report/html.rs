//! The HTML report: one self-contained `index.html` (inline SVG plots, a summary table per
//! trace, a table of cache breaks) and a PNG of every plot beside it.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use crate::measure::{RequestMetrics, Summary};

use super::output::write_atomic;
use super::plots::{Chart, PlotError, Thresholds, render_svg, trace_charts, write_png};

/// One trace to report on.
#[derive(Debug, Clone)]
pub struct ReportInput {
    /// Shown as the section title; also the stem of the PNG file names (after cleaning).
    pub name: String,
    pub summary: Summary,
    pub rows: Vec<RequestMetrics>,
}

impl ReportInput {
    /// A report input from trace rows alone (strategy and estimator are not in a trace).
    pub fn from_rows(name: &str, rows: Vec<RequestMetrics>) -> ReportInput {
        let summary = Summary::from_rows(name, "-", "-", &rows, 0);
        ReportInput { name: name.to_owned(), summary, rows }
    }
}

/// A chart, its SVG and the file name of its PNG.
type RenderedChart = (Chart, String, String);

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Plot(#[from] PlotError),
    #[error("failed to write {path}: {source}")]
    Write { path: String, source: std::io::Error },
}

/// Splits a trace file's rows into runs: `run --out` writes every scenario's rows one after
/// the other, and each run's request index starts again at 0.
pub fn split_runs(rows: Vec<RequestMetrics>) -> Vec<Vec<RequestMetrics>> {
    let mut runs: Vec<Vec<RequestMetrics>> = Vec::new();
    for row in rows {
        match runs.last_mut() {
            Some(run) if run.last().is_some_and(|last| row.index > last.index) => run.push(row),
            _ => runs.push(vec![row]),
        }
    }
    runs
}

/// Escapes text for HTML element content and attribute values (the XML rules of
/// [`crate::report::check::xml_escape_text`]: `'` as `&apos;`, control characters as U+FFFD).
pub fn escape(text: &str) -> String {
    crate::report::check::xml_escape_text(text)
}

/// A file-name-safe stem: letters, digits, `-` and `_`; anything else becomes `-`.
pub fn slug(name: &str) -> String {
    let base = Path::new(name).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let s: String = base.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' }).collect();
    if s.is_empty() { "trace".to_owned() } else { s }
}

/// Unique stems for the inputs, in order (`a`, `a-2`, ... on collisions).
fn slugs(inputs: &[ReportInput]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(inputs.len());
    for input in inputs {
        let base = slug(&input.name);
        let mut candidate = base.clone();
        let mut n = 2;
        while out.contains(&candidate) {
            candidate = format!("{base}-{n}");
            n += 1;
        }
        out.push(candidate);
    }
    out
}

/// The report page. `charts[i]` are the charts of `inputs[i]`, with their PNG file names.
fn render_page(title: &str, inputs: &[ReportInput], charts: &[Vec<RenderedChart>]) -> String {
    let mut h = page_head(title);
    h.push_str("<nav><ul>\n");
    for (i, input) in inputs.iter().enumerate() {
        let _ = writeln!(h, "<li><a href=\"#trace-{i}\">{}</a></li>", escape(&input.name));
    }
    h.push_str("</ul></nav>\n");
    for (i, (input, charts)) in inputs.iter().zip(charts).enumerate() {
        let s = &input.summary;
        let _ = writeln!(h, "<section id=\"trace-{i}\">\n<h2>{}</h2>", escape(&input.name));
        h.push_str("<table class=\"summary\">\n<tr>");
        for head in
            ["requests", "turns", "hit ratio", "cache read", "cache creation", "uncached", "output", "cost $", "breaks", "peak context", "api errors"]
        {
            let _ = write!(h, "<th>{head}</th>");
        }
        h.push_str("</tr>\n<tr>");
        for cell in [
            s.requests.to_string(),
            s.turns.to_string(),
            format!("{:.3}", s.cache_hit_ratio),
            s.tokens.cache_read.to_string(),
            s.tokens.cache_creation.to_string(),
            s.tokens.input.to_string(),
            s.tokens.output.to_string(),
            format!("{:.4}", s.cost_usd),
            s.cache_breaks.to_string(),
            s.peak_context_tokens.to_string(),
            s.api_errors.to_string(),
        ] {
            let _ = write!(h, "<td>{}</td>", escape(&cell));
        }
        h.push_str("</tr>\n</table>\n");
        let compactions: Vec<String> =
            s.compactions.iter().filter(|(_, n)| **n > 0).map(|(k, n)| format!("{} {n}", escape(k))).collect();
        let _ = writeln!(
            h,
            "<p class=\"meta\">model {} · strategy {} · compactions: {} · fingerprint <code>{}</code></p>",
            escape(&s.model),
            escape(&s.strategy),
            if compactions.is_empty() { "none".to_owned() } else { compactions.join(", ") },
            escape(&s.fingerprint)
        );

        let breaks: Vec<&RequestMetrics> = input.rows.iter().filter(|r| r.cache_break).collect();
        if breaks.is_empty() {
            h.push_str("<p>No cache breaks.</p>\n");
        } else {
            h.push_str("<h3>Cache breaks</h3>\n<table class=\"breaks\">\n<tr><th>request</th><th>lane</th><th>turn</th><th>diverged_at</th><th>cause</th><th>cache read</th><th>cache creation</th></tr>\n");
            for r in breaks {
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    r.index,
                    escape(&r.lane),
                    r.turn,
                    escape(r.prefix.diverged_at.as_deref().unwrap_or("-")),
                    escape(r.prefix.cause.as_deref().unwrap_or("unexplained")),
                    r.cache_read_input_tokens,
                    r.cache_creation_input_tokens
                );
            }
            h.push_str("</table>\n");
        }
        for rendered in charts {
            h.push_str(&figure(rendered));
        }
        h.push_str("</section>\n");
    }
    h.push_str("</body>\n</html>\n");
    h
}

/// A chart as a figure: the inline SVG, its title and a link to its PNG.
fn figure((chart, svg, png): &RenderedChart) -> String {
    format!(
        "<figure>\n{}\n<figcaption>{} · <a href=\"{}\">PNG</a></figcaption>\n</figure>\n",
        strip_xml_declaration(svg),
        escape(&chart.title),
        escape(png)
    )
}

fn page_head(title: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>\n{}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        escape(title),
        STYLE,
        escape(title)
    )
}

/// A section of a free-form report page: HTML, then charts (each gets `{stem}-{id}.png`).
#[derive(Debug, Clone)]
pub struct PageSection {
    pub title: String,
    pub stem: String,
    pub html: String,
    pub charts: Vec<Chart>,
}

/// Writes `index.html` (an introduction, then every section with its inline SVG charts) and a
/// PNG per chart under `dir`; returns the files written, in order. Used by `compare`.
pub fn write_sections_page(dir: &Path, title: &str, intro_html: &str, sections: Vec<PageSection>) -> Result<Vec<PathBuf>, ReportError> {
    let mut h = page_head(title);
    h.push_str(intro_html);
    let mut written = Vec::new();
    for (i, section) in sections.into_iter().enumerate() {
        let _ = writeln!(h, "<section id=\"section-{i}\">\n<h2>{}</h2>", escape(&section.title));
        h.push_str(&section.html);
        for chart in section.charts {
            let svg = render_svg(&chart)?;
            let png = format!("{}-{}.png", section.stem, chart.id);
            let path = dir.join(&png);
            write_png(&chart, &path)?;
            written.push(path);
            h.push_str(&figure(&(chart, svg, png)));
        }
        h.push_str("</section>\n");
    }
    h.push_str("</body>\n</html>\n");
    let index = dir.join("index.html");
    write_atomic(&index, h.as_bytes()).map_err(|source| ReportError::Write { path: index.display().to_string(), source })?;
    written.push(index);
    Ok(written)
}

fn strip_xml_declaration(svg: &str) -> &str {
    match svg.strip_prefix("<?xml") {
        Some(rest) => rest.find("?>").map_or(svg, |end| rest[end + 2..].trim_start()),
        None => svg,
    }
}

const STYLE: &str = "body { font-family: sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 14px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; }
table.breaks td:nth-child(4), table.breaks td:nth-child(5) { text-align: left; }
table.compare td:nth-child(1), table.compare td:nth-child(2), table.compare td:last-child { text-align: left; }
figure { margin: 1em 0; }
figure svg { max-width: 100%; height: auto; }
figcaption { font-size: 13px; color: #555; }
p.meta { font-size: 13px; color: #555; }
section { border-top: 2px solid #ddd; margin-top: 2em; }
";

/// Every chart of every input, rendered to SVG, with the PNG file name it gets.
fn build_charts(inputs: &[ReportInput], thresholds: Thresholds) -> Result<Vec<Vec<RenderedChart>>, ReportError> {
    let mut all_charts = Vec::with_capacity(inputs.len());
    for (input, stem) in inputs.iter().zip(slugs(inputs)) {
        let mut charts = Vec::new();
        for chart in trace_charts(&input.name, &input.rows, thresholds) {
            let svg = render_svg(&chart)?;
            let png = format!("{stem}-{}.png", chart.id);
            charts.push((chart, svg, png));
        }
        all_charts.push(charts);
    }
    Ok(all_charts)
}

/// Writes `index.html` and a PNG per chart under `dir`; returns the files written, in order.
pub fn write_report(dir: &Path, inputs: &[ReportInput], thresholds: Thresholds) -> Result<Vec<PathBuf>, ReportError> {
    let all_charts = build_charts(inputs, thresholds)?;
    let mut written = Vec::new();
    for (chart, _, png) in all_charts.iter().flatten() {
        let path = dir.join(png);
        write_png(chart, &path)?;
        written.push(path);
    }
    let page = render_page("ctxsim report", inputs, &all_charts);
    let index = dir.join("index.html");
    write_atomic(&index, page.as_bytes()).map_err(|source| ReportError::Write { path: index.display().to_string(), source })?;
    written.push(index);
    Ok(written)
}

/// The HTML page alone (inline SVGs, no files written): for tests and callers that serve it.
pub fn render_report(inputs: &[ReportInput], thresholds: Thresholds) -> Result<String, ReportError> {
    Ok(render_page("ctxsim report", inputs, &build_charts(inputs, thresholds)?))
}
