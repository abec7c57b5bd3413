//! Plots and the HTML report, on a synthetic session that has every feature a plot draws:
//! two lanes, growing context, a compaction, stage firings, cache breaks with causes.

use ctxsim::measure::metrics::CacheCreationSplit;
use ctxsim::measure::{PrefixReport, RequestMetrics, StageReport};
use ctxsim::report::html::{ReportInput, escape, render_report, split_runs, write_report};
use ctxsim::report::plots::{ParetoPoint, Thresholds, pareto_chart, pareto_front, render_svg, trace_charts, write_png};

fn stage(name: &str, fired: bool, before: u64, after: u64) -> StageReport {
    StageReport { name: name.to_owned().into(), fired, reason: format!("{name} test").into(), tokens_before: before, tokens_after: after, invalidated_from: None }
}

/// A 40-request session: context grows to the threshold, autocompact fires at request 25 (with
/// its compact-lane request), microcompact fires twice, the cache breaks three times.
pub fn session() -> Vec<RequestMetrics> {
    let mut rows = Vec::new();
    let mut context = 22_000u64;
    let mut cached = 0u64;
    for index in 0..42usize {
        let lane = if index == 25 { "compact" } else { "main" };
        let mut stages = Vec::new();
        let mut cause = None;
        let mut diverged_at = None;
        let mut cache_break = false;
        match index {
            12 => {
                cause = Some("ttl_expired".to_owned());
                cache_break = true;
            }
            18 | 33 => {
                stages.push(stage("microcompact", true, context, context - 6_000));
                context -= 6_000;
                cause = Some("microcompact_cleared_tool_result".to_owned());
                diverged_at = Some("messages[7].content[0]".to_owned());
                cache_break = true;
            }
            26 => {
                stages.push(stage("autocompact", true, context, 31_000));
                context = 31_000;
                cause = Some("compaction".to_owned());
                diverged_at = Some("messages[0].content[1]".to_owned());
                cache_break = true;
            }
            _ => stages.push(stage("autocompact", false, context, context)),
        }
        let (read, creation, input) = if lane == "compact" {
            (context - 4_000, 0, 4_000)
        } else if cache_break {
            let read = if index == 12 { 0 } else { 18_000 };
            (read, context - read - 3, 3)
        } else {
            (cached, context - cached - 3, 3)
        };
        if lane == "main" {
            cached = context - 3;
        }
        rows.push(RequestMetrics {
            index,
            lane: lane.to_owned(),
            turn: (index / 3 + 1) as u32,
            time_ms: index as u64 * 30_000 + if index >= 12 { 600_000 } else { 0 },
            model: "claude-sonnet-4-5".to_owned(),
            input_tokens: input,
            cache_read_input_tokens: read,
            cache_creation_input_tokens: creation,
            cache_creation: CacheCreationSplit { ephemeral_5m_input_tokens: creation, ephemeral_1h_input_tokens: 0 },
            output_tokens: 400,
            context_tokens: context,
            blocks: Default::default(),
            prefix: PrefixReport { common_blocks: 10, common_tokens: read, diverged_at, cause, read_at: None },
            stages: stages.into(),
            events: Vec::new(),
            cost_usd: (read as f64 * 0.3 + creation as f64 * 3.75 + input as f64 * 3.0 + 400.0 * 15.0) / 1e6,
            body_sha256: format!("{index:064x}"),
            cache_break,
            error: None,
            recorded_usage: None,
            context_management: None,
        });
        if lane == "main" {
            context += 6_200;
        }
    }
    rows
}

const THRESHOLDS: Thresholds = Thresholds { autocompact: Some(167_000), blocking_limit: Some(177_000) };

#[test]
fn plots_render_identically_twice() {
    let rows = session();
    for chart in trace_charts("session <1>", &rows, THRESHOLDS) {
        let a = render_svg(&chart).unwrap();
        let b = render_svg(&chart).unwrap();
        assert_eq!(a, b, "chart {} renders the same bytes twice", chart.id);
        assert!(a.contains("<svg"), "{}", chart.id);
        assert!(a.contains("<text"), "chart {} has text", chart.id);
    }
    let context = &trace_charts("s", &rows, THRESHOLDS)[0];
    let svg = render_svg(context).unwrap();
    assert!(svg.contains("autocompact threshold 167000"));
    assert!(svg.contains("break: compaction"));
}

#[test]
fn png_bytes_are_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let chart = &trace_charts("s", &session(), THRESHOLDS)[2];
    write_png(chart, &dir.path().join("a.png")).unwrap();
    write_png(chart, &dir.path().join("b.png")).unwrap();
    let a = std::fs::read(dir.path().join("a.png")).unwrap();
    assert_eq!(&a[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(a, std::fs::read(dir.path().join("b.png")).unwrap());
}

#[test]
fn report_is_self_contained_escaped_and_deterministic() {
    let inputs = vec![ReportInput::from_rows("run <one> & \"two\"", session()), ReportInput::from_rows("second.jsonl", session()[..10].to_vec())];
    let dir = tempfile::tempdir().unwrap();
    let out = std::env::var_os("CTXSIM_REPORT_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| dir.path().to_owned());
    let written = write_report(&out, &inputs, THRESHOLDS).unwrap();
    let names: Vec<String> = written.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    insta::assert_snapshot!(names.join("\n"));
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    assert_eq!(html, render_report(&inputs, THRESHOLDS).unwrap());
    assert!(html.contains("run &lt;one&gt; &amp; &quot;two&quot;"));
    assert!(!html.contains("<one>"));
    assert_eq!(html.matches("<svg").count(), 8);
    assert!(!html.contains("<?xml"), "SVGs are inlined without their XML declaration");
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"), "no external resources");
    // The cache-break table: request, lane, diverged_at, cause.
    assert!(html.contains("<tr><td>26</td><td>main</td><td>9</td><td><code>messages[0].content[1]</code></td><td>compaction</td>"));
}

#[test]
fn split_runs_cuts_where_the_index_restarts() {
    let mut rows = session()[..3].to_vec();
    rows.extend(session()[..2].to_vec());
    let runs = split_runs(rows);
    assert_eq!(runs.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 2]);
}

#[test]
fn escape_covers_markup() {
    assert_eq!(escape("<a href='x'>&\"</a>"), "&lt;a href=&apos;x&apos;&gt;&amp;&quot;&lt;/a&gt;");
}

#[test]
fn pareto_front_keeps_the_undominated_points() {
    let p = |label: &str, cost: f64, loss: f64| ParetoPoint { label: label.to_owned(), cost_usd: cost, information_loss: loss };
    let points = vec![p("a", 1.0, 9.0), p("b", 2.0, 4.0), p("c", 2.5, 5.0), p("d", 3.0, 1.0), p("e", 1.0, 10.0), p("f", 4.0, 1.0)];
    assert_eq!(pareto_front(&points), vec![0, 1, 3]);
    let chart = pareto_chart("Sweep", &points, "tokens lost");
    let svg = render_svg(&chart).unwrap();
    assert_eq!(svg, render_svg(&chart).unwrap());
    for label in ["a", "b", "d", "Pareto front"] {
        assert!(svg.contains(&format!("\n{label}\n</text>")), "label {label}");
    }
    if let Some(dir) = std::env::var_os("CTXSIM_REPORT_DIR") {
        write_png(&chart, &std::path::Path::new(&dir).join("pareto.png")).unwrap();
    }
}

#[test]
fn report_command_splits_a_suite_trace_and_writes_html_and_pngs() {
    let dir = tempfile::tempdir().unwrap();
    let mut trace = ctxsim::report::output::trace_jsonl(&session());
    trace.extend(ctxsim::report::output::trace_jsonl(&session()[..5]));
    std::fs::write(dir.path().join("trace.jsonl"), trace).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxsim"))
        .current_dir(dir.path())
        .args(["report", "trace.jsonl", "--out", "rep", "--autocompact-threshold", "167000", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let mut files: Vec<String> =
        std::fs::read_dir(dir.path().join("rep")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    files.sort();
    insta::assert_snapshot!(files.join("\n"));
    let html = std::fs::read_to_string(dir.path().join("rep/index.html")).unwrap();
    assert!(html.contains("trace.jsonl #1") && html.contains("trace.jsonl #2"));
}
