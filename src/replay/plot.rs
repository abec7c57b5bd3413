//! Plots of a fidelity report: simulated against recorded context tokens per call.
//!
//! One chart per session, drawn with the report's renderer (`crate::report::plots`), so the
//! SVG and the PNG come from the same data and are byte-identical from run to run.

use std::path::{Path, PathBuf};

use crate::report::output::write_atomic;
use crate::report::plots::{AxisFormat, Chart, PlotError, Series, SeriesKind, render_svg, write_png};

use super::fidelity::FidelityReport;

/// The session's name for titles and file names: the transcript's file name without
/// `.jsonl` / `.full.jsonl`.
pub fn session_name(report: &FidelityReport) -> String {
    let name = Path::new(&report.input).file_name().map_or(report.input.clone(), |n| n.to_string_lossy().into_owned());
    let name = name.strip_suffix(".jsonl").unwrap_or(&name);
    name.strip_suffix(".full").unwrap_or(name).to_owned()
}

/// Recorded and simulated context tokens per compared call (x = the recorded call index).
/// The report must hold its per-call rows.
pub fn fidelity_chart(report: &FidelityReport) -> Chart {
    let recorded = report.calls.iter().map(|c| (c.index as f64, c.recorded_context as f64)).collect();
    let simulated = report.calls.iter().map(|c| (c.index as f64, c.simulated_context as f64)).collect();
    Chart {
        id: "fidelity".to_owned(),
        title: format!(
            "Context per call, simulated vs recorded: {} (MAPE {:.1}%)",
            session_name(report),
            report.context_tokens_mape * 100.0
        ),
        x_label: "call".to_owned(),
        y_label: "context tokens".to_owned(),
        y_format: AxisFormat::Tokens,
        y_categories: Vec::new(),
        series: vec![
            Series::new("recorded", SeriesKind::Line, 0, recorded),
            Series::new(format!("simulated ({})", report.estimator), SeriesKind::Line, 1, simulated),
        ],
        hlines: Vec::new(),
        vmarks: Vec::new(),
        x_span: None,
    }
}

/// Writes `<session>.svg` and `<session>.png` into `dir` for every report; returns the paths
/// written, in order.
pub fn write_fidelity_plots(dir: &Path, reports: &[FidelityReport]) -> Result<Vec<PathBuf>, PlotError> {
    let mut written = Vec::new();
    for report in reports {
        let chart = fidelity_chart(report);
        let name = session_name(report);
        let svg_path = dir.join(format!("{name}.svg"));
        let svg = render_svg(&chart)?;
        write_atomic(&svg_path, svg.as_bytes())
            .map_err(|e| PlotError { chart: chart.id.clone(), message: format!("{}: {e}", svg_path.display()) })?;
        let png_path = dir.join(format!("{name}.png"));
        write_png(&chart, &png_path)?;
        written.push(svg_path);
        written.push(png_path);
    }
    Ok(written)
}
