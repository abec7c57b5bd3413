//! Plots of a trace (and of sweep results) as data, rendered to SVG or PNG with plotters.
//!
//! A plot is first computed as a [`Chart`]: series, horizontal thresholds and vertical marks,
//! all in plain numbers. One renderer draws any chart on any plotters backend, so the inline
//! SVG of the HTML report and the PNG beside it come from the same data. Text is drawn with the
//! embedded DejaVu Sans (registered once), never a system font, so the bytes are the same on
//! every machine.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontStyle, FontTransform};

use crate::measure::RequestMetrics;

/// Width and height of every rendered chart, in pixels.
pub const CHART_SIZE: (u32, u32) = (960, 440);

#[derive(Debug, thiserror::Error)]
#[error("failed to draw chart {chart}: {message}")]
pub struct PlotError {
    pub chart: String,
    pub message: String,
}

/// Registers the embedded font under "sans-serif" once per process.
pub fn ensure_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
                .map_err(|_| "the embedded DejaVu Sans font did not load".to_owned())
        })
        .clone()
        .map_err(|message| PlotError { chart: "-".to_owned(), message })
}

/// How tick labels of the y axis are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AxisFormat {
    /// 167000 → "167k".
    Tokens,
    /// 0.1234 → "$0.123".
    Usd,
    Plain,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesKind {
    Line,
    Points,
    LinePoints,
    /// Bars; every `StackedBars` series of a chart stacks on the ones before it.
    StackedBars,
}

/// One named series of `(x, y)` points; `labels[i]` (when given) is written beside point i.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub kind: SeriesKind,
    pub color: usize,
    pub points: Vec<(f64, f64)>,
    pub labels: Vec<Option<String>>,
}

impl Series {
    pub fn new(name: impl Into<String>, kind: SeriesKind, color: usize, points: Vec<(f64, f64)>) -> Series {
        Series { name: name.into(), kind, color, points, labels: Vec::new() }
    }
}

/// A horizontal line across the chart (a threshold), with its label.
#[derive(Debug, Clone, PartialEq)]
pub struct HLine {
    pub y: f64,
    pub label: String,
    pub color: usize,
}

/// A vertical mark at one x (a cache break), with its label.
#[derive(Debug, Clone, PartialEq)]
pub struct VMark {
    pub x: f64,
    pub label: String,
}

/// A chart as data.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// File-name part: `context`, `cost`, `cache`, `stages`, `pareto`.
    pub id: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub y_format: AxisFormat,
    /// When set, y values are indices into these names (a timeline of categories).
    pub y_categories: Vec<String>,
    pub series: Vec<Series>,
    pub hlines: Vec<HLine>,
    pub vmarks: Vec<VMark>,
    /// The x range to show at least (the whole trace, on a timeline with few points).
    pub x_span: Option<(f64, f64)>,
}

impl Chart {
    fn new(id: &str, title: String, x_label: &str, y_label: &str, y_format: AxisFormat) -> Chart {
        Chart {
            id: id.to_owned(),
            title,
            x_label: x_label.to_owned(),
            y_label: y_label.to_owned(),
            y_format,
            y_categories: Vec::new(),
            series: Vec::new(),
            hlines: Vec::new(),
            vmarks: Vec::new(),
            x_span: None,
        }
    }
}

/// Threshold lines drawn on the context chart, when known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Thresholds {
    pub autocompact: Option<u64>,
    pub blocking_limit: Option<u64>,
}

const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
const BREAK_COLOR: RGBColor = RGBColor(200, 30, 30);

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

fn break_marks(rows: &[RequestMetrics]) -> Vec<VMark> {
    rows.iter()
        .filter(|r| r.cache_break)
        .map(|r| VMark { x: r.index as f64, label: format!("break: {}", r.prefix.cause.as_deref().unwrap_or("unexplained")) })
        .collect()
}

/// Context tokens per request, one line per lane, thresholds and cache breaks drawn.
pub fn context_chart(name: &str, rows: &[RequestMetrics], thresholds: Thresholds) -> Chart {
    let mut chart = Chart::new("context", format!("Context tokens per request: {name}"), "request", "context tokens", AxisFormat::Tokens);
    let mut lanes: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for r in rows {
        lanes.entry(r.lane.as_str()).or_default().push((r.index as f64, r.context_tokens as f64));
    }
    // The main lane first and in the first color, the others by name.
    let mut ordered: Vec<(&str, Vec<(f64, f64)>)> = lanes.into_iter().collect();
    ordered.sort_by_key(|(lane, _)| *lane != "main");
    for (i, (lane, points)) in ordered.into_iter().enumerate() {
        chart.series.push(Series::new(lane, SeriesKind::LinePoints, i, points));
    }
    if let Some(y) = thresholds.autocompact {
        chart.hlines.push(HLine { y: y as f64, label: format!("autocompact threshold {y}"), color: 4 });
    }
    if let Some(y) = thresholds.blocking_limit {
        chart.hlines.push(HLine { y: y as f64, label: format!("blocking limit {y}"), color: 5 });
    }
    chart.vmarks = break_marks(rows);
    chart
}

/// `(request index, cost so far)` over the rows.
fn cumulative_cost(rows: &[RequestMetrics]) -> Vec<(f64, f64)> {
    let mut total = 0.0;
    rows.iter()
        .map(|r| {
            total += r.cost_usd;
            (r.index as f64, total)
        })
        .collect()
}

/// Cumulative cost over the requests.
pub fn cost_chart(name: &str, rows: &[RequestMetrics]) -> Chart {
    let mut chart = Chart::new("cost", format!("Cumulative cost: {name}"), "request", "cost (USD)", AxisFormat::Usd);
    chart.series.push(Series::new("cumulative cost", SeriesKind::LinePoints, 0, cumulative_cost(rows)));
    chart
}

/// Cache read, cache creation and uncached input tokens per request, stacked.
pub fn cache_chart(name: &str, rows: &[RequestMetrics]) -> Chart {
    let mut chart = Chart::new("cache", format!("Input tokens per request: {name}"), "request", "input tokens", AxisFormat::Tokens);
    let at = |f: fn(&RequestMetrics) -> u64| rows.iter().map(|r| (r.index as f64, f(r) as f64)).collect::<Vec<_>>();
    chart.series.push(Series::new("cache read", SeriesKind::StackedBars, 2, at(|r| r.cache_read_input_tokens)));
    chart.series.push(Series::new("cache creation", SeriesKind::StackedBars, 1, at(|r| r.cache_creation_input_tokens)));
    chart.series.push(Series::new("uncached input", SeriesKind::StackedBars, 7, at(|r| r.input_tokens)));
    chart.vmarks = break_marks(rows);
    chart
}

/// A timeline: a row per stage that fired (markers at its requests) and a row of cache breaks
/// labelled with their causes.
pub fn stages_chart(name: &str, rows: &[RequestMetrics]) -> Chart {
    let mut chart = Chart::new("stages", format!("Stage firings and cache breaks: {name}"), "request", "", AxisFormat::Plain);
    let names: BTreeSet<&str> = rows.iter().flat_map(|r| r.stages.iter().filter(|s| s.fired).map(|s| &*s.name)).collect();
    chart.y_categories = names.iter().map(|n| (*n).to_owned()).collect();
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        chart.x_span = Some((first.index as f64, last.index as f64));
    }
    for (i, stage) in names.iter().enumerate() {
        let points = rows
            .iter()
            .filter(|r| r.stages.iter().any(|s| s.fired && s.name == *stage))
            .map(|r| (r.index as f64, i as f64))
            .collect();
        chart.series.push(Series::new(*stage, SeriesKind::Points, i, points));
    }
    let row_of_breaks = chart.y_categories.len() as f64;
    chart.y_categories.push("cache break".to_owned());
    let breaks: Vec<&RequestMetrics> = rows.iter().filter(|r| r.cache_break).collect();
    let mut series = Series::new("cache break", SeriesKind::Points, 3, breaks.iter().map(|r| (r.index as f64, row_of_breaks)).collect());
    series.labels = breaks.iter().map(|r| Some(r.prefix.cause.clone().unwrap_or_else(|| "unexplained".to_owned()))).collect();
    chart.series.push(series);
    chart
}

/// Context tokens per main-lane request of one input, one series per strategy (`compare`).
pub fn compare_context_chart(input: &str, runs: &[(&str, &[RequestMetrics])]) -> Chart {
    let mut chart = Chart::new("context", format!("Context tokens per request by strategy: {input}"), "main-lane request", "context tokens", AxisFormat::Tokens);
    for (i, (strategy, rows)) in runs.iter().enumerate() {
        let points = rows.iter().filter(|r| r.lane == "main").enumerate().map(|(n, r)| (n as f64, r.context_tokens as f64)).collect();
        chart.series.push(Series::new(*strategy, SeriesKind::LinePoints, i, points));
    }
    chart
}

/// Cumulative cost over all requests of one input (every lane), one series per strategy.
pub fn compare_cost_chart(input: &str, runs: &[(&str, &[RequestMetrics])]) -> Chart {
    let mut chart = Chart::new("cost", format!("Cumulative cost by strategy: {input}"), "request", "cost (USD)", AxisFormat::Usd);
    for (i, (strategy, rows)) in runs.iter().enumerate() {
        chart.series.push(Series::new(*strategy, SeriesKind::LinePoints, i, cumulative_cost(rows)));
    }
    chart
}

/// The four charts of one trace, in report order.
pub fn trace_charts(name: &str, rows: &[RequestMetrics], thresholds: Thresholds) -> Vec<Chart> {
    vec![context_chart(name, rows, thresholds), cost_chart(name, rows), cache_chart(name, rows), stages_chart(name, rows)]
}

/// One configuration of a sweep: its cost against the information it lost.
#[derive(Debug, Clone, PartialEq)]
pub struct ParetoPoint {
    pub label: String,
    pub cost_usd: f64,
    pub information_loss: f64,
}

/// Indices of the points no other point beats on both axes (lower is better on both), sorted by
/// cost then loss. Ties keep the first point given.
pub fn pareto_front(points: &[ParetoPoint]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by(|&a, &b| {
        let (pa, pb) = (&points[a], &points[b]);
        pa.cost_usd.total_cmp(&pb.cost_usd).then(pa.information_loss.total_cmp(&pb.information_loss)).then(a.cmp(&b))
    });
    let mut front = Vec::new();
    let mut best_loss = f64::INFINITY;
    for i in order {
        if points[i].information_loss < best_loss {
            best_loss = points[i].information_loss;
            front.push(i);
        }
    }
    front
}

/// A scatter of every point, the front as a line, and the front's points labelled.
pub fn pareto_chart(title: &str, points: &[ParetoPoint], loss_label: &str) -> Chart {
    let mut chart = Chart::new("pareto", title.to_owned(), "cost (USD)", loss_label, AxisFormat::Tokens);
    chart.series.push(Series::new("configuration", SeriesKind::Points, 7, points.iter().map(|p| (p.cost_usd, p.information_loss)).collect()));
    let front = pareto_front(points);
    let mut line = Series::new("Pareto front", SeriesKind::LinePoints, 3, front.iter().map(|&i| (points[i].cost_usd, points[i].information_loss)).collect());
    line.labels = front.iter().map(|&i| Some(points[i].label.clone())).collect();
    chart.series.push(line);
    chart
}

/// The chart as an SVG document (for inlining into HTML).
pub fn render_svg(chart: &Chart) -> Result<String, PlotError> {
    ensure_font()?;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, CHART_SIZE).into_drawing_area();
        draw(&root, chart).map_err(|message| PlotError { chart: chart.id.clone(), message })?;
    }
    Ok(out)
}

/// The chart as a PNG file, written atomically (a temporary file beside `path`, then a rename).
pub fn write_png(chart: &Chart, path: &Path) -> Result<(), PlotError> {
    ensure_font()?;
    let fail = |message: String| PlotError { chart: chart.id.clone(), message };
    let dir = super::output::temp_dir_for(path).map_err(|e| fail(e.to_string()))?;
    std::fs::create_dir_all(&dir).map_err(|e| fail(e.to_string()))?;
    // plotters picks the encoder from the extension, so the temporary name ends in .png.
    let tmp = tempfile::Builder::new().prefix(".plot").suffix(".png").tempfile_in(&dir).map_err(|e| fail(e.to_string()))?;
    {
        let root = BitMapBackend::new(tmp.path(), CHART_SIZE).into_drawing_area();
        draw(&root, chart).map_err(&fail)?;
    }
    super::output::persist_with_mode(tmp, path).map_err(|e| fail(e.to_string()))
}

fn format_tokens(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn format_usd(v: f64) -> String {
    if v.abs() >= 10.0 { format!("${v:.1}") } else if v.abs() >= 0.1 { format!("${v:.2}") } else { format!("${v:.3}") }
}

/// The ranges covering every series, threshold and mark, with a margin above.
fn ranges(chart: &Chart) -> ((f64, f64), (f64, f64)) {
    let mut xs: Vec<f64> = chart.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
    xs.extend(chart.vmarks.iter().map(|m| m.x));
    if let Some((a, b)) = chart.x_span {
        xs.extend([a, b]);
    }
    let mut stack: BTreeMap<u64, f64> = BTreeMap::new();
    let mut y_max: f64 = 0.0;
    let mut y_min: f64 = 0.0;
    for s in &chart.series {
        for &(x, y) in &s.points {
            if s.kind == SeriesKind::StackedBars {
                let top = stack.entry(x.to_bits()).or_default();
                *top += y;
                y_max = y_max.max(*top);
            } else {
                y_max = y_max.max(y);
                y_min = y_min.min(y);
            }
        }
    }
    for h in &chart.hlines {
        y_max = y_max.max(h.y);
    }
    let (mut x0, mut x1) = xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    let bars = chart.series.iter().any(|s| s.kind == SeriesKind::StackedBars);
    let x_pad = if bars || chart.id != "pareto" { 0.6 } else { ((x1 - x0) * 0.08).max(1e-6) };
    if chart.id == "pareto" && x1 - x0 < 1e-9 {
        x0 -= x0.abs().max(1e-3) * 0.5;
        x1 += x1.abs().max(1e-3) * 0.5;
    }
    if !chart.y_categories.is_empty() {
        return ((x0 - x_pad, x1 + x_pad), (-0.6, chart.y_categories.len() as f64 - 0.2));
    }
    if y_max <= y_min {
        y_max = y_min + 1.0;
    }
    ((x0 - x_pad, x1 + x_pad), (y_min, y_max * 1.12))
}

/// The corner for the legend box: the one whose quarter-sized region holds the fewest data
/// points (bars count by their top), upper corners first, left before right on a tie. A fixed
/// corner covered the first points of every growing-context plot.
fn legend_corner(chart: &Chart, (x0, x1): (f64, f64), (y0, y1): (f64, f64)) -> SeriesLabelPosition {
    let (w, h) = ((x1 - x0).max(f64::MIN_POSITIVE), (y1 - y0).max(f64::MIN_POSITIVE));
    let mut points: Vec<(f64, f64)> = chart.series.iter().flat_map(|s| s.points.iter().copied()).collect();
    // A horizontal line crosses both sides.
    points.extend(chart.hlines.iter().flat_map(|l| [(x0, l.y), (x1, l.y)]));
    let count = |left: bool, upper: bool| {
        points
            .iter()
            .filter(|&&(x, y)| {
                let (fx, fy) = ((x - x0) / w, (y - y0) / h);
                (if left { fx <= 0.45 } else { fx >= 0.55 }) && (if upper { fy >= 0.6 } else { fy <= 0.4 })
            })
            .count()
    };
    let corners = [
        (SeriesLabelPosition::UpperLeft, true, true),
        (SeriesLabelPosition::UpperRight, false, true),
        (SeriesLabelPosition::LowerRight, false, false),
        (SeriesLabelPosition::LowerLeft, true, false),
    ];
    let mut best = (usize::MAX, SeriesLabelPosition::UpperLeft);
    for (pos, left, upper) in corners {
        let n = count(left, upper);
        if n < best.0 {
            best = (n, pos);
        }
    }
    best.1
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &Chart) -> Result<(), String> {
    let e = |err: DrawingAreaErrorKind<DB::ErrorType>| format!("{err:?}");
    root.fill(&WHITE).map_err(e)?;
    let ((x0, x1), (y0, y1)) = ranges(chart);
    let y_area = if chart.y_categories.is_empty() { 70 } else { 150 };
    // The caption shrinks until it fits the width (a long session name cut it off at 24 px).
    let width = root.dim_in_pixel().0.saturating_sub(40);
    let caption_size = [24u32, 22, 20, 18, 16, 14]
        .into_iter()
        .find(|&size| root.estimate_text_size(&chart.title, &TextStyle::from(("sans-serif", size).into_font())).is_ok_and(|(w, _)| w <= width))
        .unwrap_or(14);
    let mut cc = ChartBuilder::on(root)
        .caption(&chart.title, ("sans-serif", caption_size))
        .margin(14)
        .x_label_area_size(46)
        .y_label_area_size(y_area)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(e)?;

    let categories = chart.y_categories.clone();
    let y_format = chart.y_format;
    let y_fmt = move |v: &f64| -> String {
        if !categories.is_empty() {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < categories.len() {
                return categories[i as usize].clone();
            }
            return String::new();
        }
        match y_format {
            AxisFormat::Tokens => format_tokens(*v),
            AxisFormat::Usd => format_usd(*v),
            AxisFormat::Plain => format!("{v}"),
        }
    };
    let pareto = chart.id == "pareto";
    let x_fmt = move |v: &f64| -> String {
        if pareto {
            format_usd(*v)
        } else if (v - v.round()).abs() < 1e-6 {
            format!("{}", v.round() as i64)
        } else {
            String::new()
        }
    };
    let mut mesh = cc.configure_mesh();
    mesh.x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(RGBColor(235, 235, 235))
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt);
    if !chart.y_categories.is_empty() {
        mesh.y_labels(chart.y_categories.len() * 2 + 1);
    }
    mesh.draw().map_err(e)?;

    // Stacked bars first, so lines and marks are drawn over them.
    let mut stack: BTreeMap<u64, f64> = BTreeMap::new();
    for s in chart.series.iter().filter(|s| s.kind == SeriesKind::StackedBars) {
        let c = color(s.color);
        let mut bars = Vec::with_capacity(s.points.len());
        for &(x, y) in &s.points {
            let base = stack.entry(x.to_bits()).or_default();
            if y > 0.0 {
                bars.push(Rectangle::new([(x - 0.38, *base), (x + 0.38, *base + y)], c.filled()));
            }
            *base += y;
        }
        cc.draw_series(bars)
            .map_err(e)?
            .label(&*s.name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
    }

    for h in &chart.hlines {
        let c = color(h.color);
        cc.draw_series(DashedLineSeries::new(vec![(x0, h.y), (x1, h.y)], 8, 5, c.stroke_width(2)))
            .map_err(e)?
            .label(h.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }

    for (k, m) in chart.vmarks.iter().enumerate() {
        let style = BREAK_COLOR.mix(0.7).stroke_width(1);
        cc.draw_series(DashedLineSeries::new(vec![(m.x, y0), (m.x, y1)], 4, 4, style)).map_err(e)?;
        // Vertical labels beside the line, so neighbouring breaks and the right edge do not
        // cut them; staggered a little so two close breaks stay apart.
        let y = y1 - (y1 - y0) * (0.02 + 0.04 * (k % 2) as f64);
        let font = ("sans-serif", 14).into_font().transform(FontTransform::Rotate90).color(&BREAK_COLOR);
        cc.draw_series(std::iter::once(EmptyElement::at((m.x, y)) + Text::new(m.label.clone(), (4, 0), font))).map_err(e)?;
    }

    for s in chart.series.iter().filter(|s| s.kind != SeriesKind::StackedBars) {
        let c = color(s.color);
        let size = if chart.y_categories.is_empty() { 3 } else { 6 };
        if matches!(s.kind, SeriesKind::Line | SeriesKind::LinePoints) {
            cc.draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))
                .map_err(e)?
                .label(&*s.name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        }
        if matches!(s.kind, SeriesKind::Points | SeriesKind::LinePoints) {
            let dots = cc.draw_series(s.points.iter().map(|&p| Circle::new(p, size, c.filled()))).map_err(e)?;
            if s.kind == SeriesKind::Points {
                dots.label(&*s.name).legend(move |(x, y)| Circle::new((x + 10, y), 5, c.filled()));
            }
        }
        // Labels sit up-right of their point, or up-left near the right edge so they stay inside.
        let labels = s.points.iter().zip(&s.labels).filter_map(|(&(x, y), label)| label.as_ref().map(|l| (x, y, l.clone())));
        // Consecutive labels are staggered in three heights so that close points stay legible.
        let right_part = x0 + (x1 - x0) * 0.6;
        cc.draw_series(labels.enumerate().map(|(k, (x, y, l))| {
            let (dx, h) = if x > right_part { (-8, HPos::Right) } else { (8, HPos::Left) };
            let font = ("sans-serif", 14).into_font().color(&BLACK).pos(Pos::new(h, VPos::Bottom));
            EmptyElement::at((x, y)) + Text::new(l, (dx, -6 - 17 * (k % 3) as i32), font)
        }))
        .map_err(e)?;
    }

    if chart.y_categories.is_empty() {
        cc.configure_series_labels()
            .position(legend_corner(chart, (x0, x1), (y0, y1)))
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .draw()
            .map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}
