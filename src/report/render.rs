//! A readable rendering of built requests, one line per block, for snapshots and `--explain`.
//!
//! ```text
//! #3 main turn 2 t=65000ms model=claude-sonnet-4-5
//!   0 tools[0]                  tool              1234b  309t  9f2c1a0e
//!   4 messages[0].content[0]    user/text           82b   21t  77ab01cd  cc=5m
//!   usage: input 12 + read 3400 + write 120 (5m 120, 1h 0) = 3532; output 40; prefix common 6, diverged_at -, cause -
//! ```

use std::fmt::Write;

use crate::api::canonical::short_hex;
use crate::measure::{FlatRequest, RequestMetrics};

pub fn render_request(flat: &FlatRequest, row: &RequestMetrics) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "#{} {} turn {} t={}ms model={}", row.index, row.lane, row.turn, row.time_ms, row.model);
    for (i, block) in flat.blocks.iter().enumerate() {
        let who = match block.role {
            Some(role) => format!("{}/{}", role.as_str(), block.kind),
            None => block.kind.to_string(),
        };
        let cc = match &block.cache_control {
            None => String::new(),
            Some(cc) => {
                let ttl = flat.marker_ttl(i).flatten().unwrap_or(crate::api::CacheTtl::FiveMinutes);
                let mut s = format!("  cc={}", ttl.as_str());
                if let Some(scope) = cc.scope {
                    let _ = write!(s, ",{}", if scope == crate::api::CacheScope::Global { "global" } else { "org" });
                }
                s
            }
        };
        let _ = writeln!(
            out,
            "  {:>3} {:<26} {:<22} {:>7}b {:>6}t  {}{}",
            i,
            block.path.to_string(),
            who,
            block.bytes,
            block.tokens,
            short_hex(block.hash),
            cc
        );
    }
    let _ = writeln!(
        out,
        "  usage: input {} + read {} + write {} (5m {}, 1h {}) = {}; output {}; common {} blocks; diverged_at {}; cause {}{}",
        row.input_tokens,
        row.cache_read_input_tokens,
        row.cache_creation_input_tokens,
        row.cache_creation.ephemeral_5m_input_tokens,
        row.cache_creation.ephemeral_1h_input_tokens,
        row.context_tokens,
        row.output_tokens,
        row.prefix.common_blocks,
        row.prefix.diverged_at.as_deref().unwrap_or("-"),
        row.prefix.cause.as_deref().unwrap_or("-"),
        if row.cache_break { "; CACHE BREAK" } else { "" },
    );
    if let Some(cm) = &row.context_management {
        let edits: Vec<String> = cm
            .applied_edits
            .iter()
            .map(|e| {
                let what = match (e.cleared_tool_uses, e.cleared_thinking_turns) {
                    (Some(n), _) => format!("{n} tool uses"),
                    (_, Some(n)) => format!("{n} thinking turns"),
                    _ => String::new(),
                };
                format!("{} {what} {} tokens", e.kind, e.cleared_input_tokens)
            })
            .collect();
        let _ = writeln!(out, "  applied_edits: {}", edits.join("; "));
    }
    for stage in row.stages.iter().filter(|s| s.fired) {
        let _ = writeln!(out, "  stage {}: {} ({} -> {})", stage.name, stage.reason, stage.tokens_before, stage.tokens_after);
    }
    if !row.events.is_empty() {
        let _ = writeln!(out, "  events: {}", row.events.join(", "));
    }
    if let Some(error) = &row.error {
        let _ = writeln!(out, "  API error: {error}");
    }
    out
}
