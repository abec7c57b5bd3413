//! Writers: atomic files, trace JSONL, summary tables and CSV.

use std::io::Write;
use std::path::Path;

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};

use crate::measure::{RequestMetrics, Summary};

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, then a rename,
/// so a reader never sees half a file and an interrupted run loses nothing already written.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    persist_with_mode(tmp, path)
}

/// Syncs and renames a finished temporary file onto `path`. A temporary file is created
/// owner-only (0600); the output gets the ordinary mode a user expects of a file they asked
/// for, or keeps the mode of the file it replaces.
pub fn persist_with_mode(tmp: tempfile::NamedTempFile, path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0o644);
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// One JSON line per request.
pub fn trace_jsonl(rows: &[RequestMetrics]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() * 600);
    for row in rows {
        serde_json::to_writer(&mut out, row).expect("trace rows serialize");
        out.push(b'\n');
    }
    out
}

/// Reads a trace JSONL back.
///
/// A trace is our own output, so nothing in it is skipped: a bad line is an error naming the
/// line and field, and a trace without any row is an error.
pub fn read_trace(text: &str, path: &str) -> Result<Vec<RequestMetrics>, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut de = serde_json::Deserializer::from_str(line);
        let row: RequestMetrics = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| format!("{path}:{}: {}: {}", i + 1, e.path(), crate::input::cap_message(&e.inner().to_string())))?;
        de.end().map_err(|e| format!("{path}:{}: {}", i + 1, crate::input::cap_message(&e.to_string())))?;
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(format!("{path}: no trace row in it (the file is empty)"));
    }
    Ok(rows)
}

/// Reads a trace file ([`read_trace`]); a byte-order mark is dropped, invalid UTF-8 is an
/// error naming the line and byte column.
pub fn read_trace_file(path: &Path) -> Result<Vec<RequestMetrics>, String> {
    let name = path.display().to_string();
    let text = crate::input::read_text(path).map_err(|e| e.to_string())?;
    read_trace(&text, &name)
}

/// The summaries as a human table.
pub fn summary_table(summaries: &[Summary]) -> String {
    let mut table = Table::new();
    table.load_style(UTF8_FULL_CONDENSED);
    table.set_header(vec![
        "input", "strategy", "requests", "hit ratio", "read", "creation", "uncached", "output", "cost $", "breaks", "compactions", "peak ctx",
    ]);
    for s in summaries {
        let compactions: u64 = s.compactions.values().sum();
        table.add_row(vec![
            s.input.clone(),
            s.strategy.clone(),
            s.requests.to_string(),
            format!("{:.3}", s.cache_hit_ratio),
            s.tokens.cache_read.to_string(),
            s.tokens.cache_creation.to_string(),
            s.tokens.input.to_string(),
            s.tokens.output.to_string(),
            format!("{:.4}", s.cost_usd),
            s.cache_breaks.to_string(),
            compactions.to_string(),
            s.peak_context_tokens.to_string(),
        ]);
    }
    table.to_string()
}

/// The summaries as CSV (one row per input).
pub fn summary_csv(summaries: &[Summary]) -> Vec<u8> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    let mut header = vec![
        "input", "strategy", "model", "estimator", "requests", "turns", "input_tokens", "cache_read", "cache_creation",
        "cache_creation_5m", "cache_creation_1h", "output_tokens", "cache_hit_ratio", "cost_usd", "cache_breaks", "blocked",
        "peak_context_tokens", "fingerprint",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect::<Vec<_>>();
    header.extend(crate::measure::metrics::COMPACTION_KEYS.iter().map(|k| format!("compactions_{k}")));
    writer.write_record(&header).expect("csv to memory");
    for s in summaries {
        let mut record = vec![
            s.input.clone(),
            s.strategy.clone(),
            s.model.clone(),
            s.estimator.clone(),
            s.requests.to_string(),
            s.turns.to_string(),
            s.tokens.input.to_string(),
            s.tokens.cache_read.to_string(),
            s.tokens.cache_creation.to_string(),
            s.tokens.cache_creation_5m.to_string(),
            s.tokens.cache_creation_1h.to_string(),
            s.tokens.output.to_string(),
            s.cache_hit_ratio.to_string(),
            s.cost_usd.to_string(),
            s.cache_breaks.to_string(),
            s.blocked.to_string(),
            s.peak_context_tokens.to_string(),
            s.fingerprint.clone(),
        ];
        record.extend(crate::measure::metrics::COMPACTION_KEYS.iter().map(|k| s.compactions.get(*k).copied().unwrap_or(0).to_string()));
        writer.write_record(&record).expect("csv to memory");
    }
    writer.into_inner().expect("csv to memory")
}

/// Per-request CSV of a trace.
pub fn trace_csv(rows: &[RequestMetrics]) -> Vec<u8> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    writer
        .write_record([
            "index", "lane", "turn", "time_ms", "model", "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
            "cache_creation_5m", "cache_creation_1h", "output_tokens", "context_tokens", "common_blocks", "diverged_at", "cause",
            "cache_break", "cost_usd", "error",
        ])
        .expect("csv to memory");
    for r in rows {
        writer
            .write_record([
                r.index.to_string(),
                r.lane.clone(),
                r.turn.to_string(),
                r.time_ms.to_string(),
                r.model.clone(),
                r.input_tokens.to_string(),
                r.cache_read_input_tokens.to_string(),
                r.cache_creation_input_tokens.to_string(),
                r.cache_creation.ephemeral_5m_input_tokens.to_string(),
                r.cache_creation.ephemeral_1h_input_tokens.to_string(),
                r.output_tokens.to_string(),
                r.context_tokens.to_string(),
                r.prefix.common_blocks.to_string(),
                r.prefix.diverged_at.clone().unwrap_or_default(),
                r.prefix.cause.clone().unwrap_or_default(),
                r.cache_break.to_string(),
                r.cost_usd.to_string(),
                r.error.clone().unwrap_or_default(),
            ])
            .expect("csv to memory");
    }
    writer.into_inner().expect("csv to memory")
}
