//! Which calls of a real session the client's automatic compaction fires at, as the agent's own
//! threshold rule decides it ([`Thresholds::compute`], the rule `run` uses), against the
//! `compact_boundary` records the session holds.
//!
//! Before each main-lane request the client counts its context the way Claude Code does: the
//! last response's usage (input + cache read + cache creation + output) plus its rough estimate
//! of the tool results, prompts and sent attachments added since ([`added_tokens`], with
//! [`rough_block`], the agent's own counting).
//! The usage is what the model returned: in a replay the mock model returns the recorded reply
//! with its recorded usage as long as the replay sends what the client sent, and the simulated
//! usage once it diverged (another strategy). Automatic compaction fires when the count reaches the
//! threshold: `window − min(max output, reserve) − buffer` (or the PCT override).
//!
//! The output reserve is the one piece the record had to tell: every automatic compaction of
//! 2.0.76–2.1.14 in ../shared/realdata fired at 155.0k–156.7k tokens on a 200k window (5
//! compactions, 4 sessions: a 32,000 reserve), every one of 2.1.37–2.1.49 at 167.1k–167.6k (5
//! compactions, 4 sessions: the 20,000 of the reference). Versions between take the nearest
//! earlier observed one ([`ClientProfile::for_version`]). The window is the model's, or 1M when
//! the session's recorded context ever exceeded it (a `[1m]` model).

use serde::{Deserialize, Serialize};

use crate::agent::compact::config::AutocompactConfig;
use crate::agent::compact::context::ModelLimits;
use crate::agent::compact::counting::{Thresholds, rough, rough_block};
use crate::measure::ModelTable;
use crate::recording::claude_code::{ATTACHMENTS_NOT_SENT, attachment_text};
use crate::recording::format::LANE_MAIN;
use crate::recording::{EventKind, ImportedSession};

use super::profile::ClientProfile;
use super::session::SessionReplay;

/// The 1M context window of `[1m]` models.
pub const WINDOW_1M: u64 = 1_000_000;
/// The window Claude Code runs a model with unless 1M is asked for.
pub const DEFAULT_WINDOW: u64 = 200_000;

/// One automatic compaction, recorded or predicted, and how the two line up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TriggerRow {
    /// Position of the main-lane call the compaction preceded, among the session's main calls
    /// (recorded side); `None` when the compaction was not recorded.
    pub recorded_call: Option<usize>,
    pub recorded_pre_tokens: Option<u64>,
    /// `auto` or `manual` as recorded; `auto` for a predicted one.
    pub trigger: String,
    /// Position of the main-lane call before which the threshold rule fires.
    pub simulated_call: Option<usize>,
    /// The count the rule saw there.
    pub simulated_pre_tokens: Option<u64>,
    pub threshold: u64,
    /// `matched` (same call ±1, preTokens within 3%), `late`, `early`, `pre_tokens_off`,
    /// `missed` (recorded, never predicted), `extra` (predicted, not recorded), `manual` (a user's
    /// `/compact`: no threshold), `no_history` (the history it compacted is not in the file).
    pub verdict: String,
}

/// The compaction-trigger comparison of one session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TriggerReport {
    pub version: String,
    pub model: String,
    pub window: u64,
    pub output_reserve: u64,
    pub threshold: u64,
    pub rows: Vec<TriggerRow>,
}

impl TriggerReport {
    /// Recorded automatic compactions with their history in the file, and how many were matched.
    pub fn auto_matched(&self) -> (usize, usize) {
        let auto = self.rows.iter().filter(|r| r.trigger == "auto" && r.recorded_call.is_some() && r.verdict != "no_history");
        let (mut total, mut matched) = (0, 0);
        for row in auto {
            total += 1;
            matched += usize::from(row.verdict == "matched");
        }
        (total, matched)
    }
}

/// The context window the client ran `model` with. A model whose 1M window is opt-in runs with
/// 200k unless the record shows 1M was asked for: a `[1m]` id, the `/model` picker's
/// "1M context" in a local command's output, or a recorded context above 200k.
pub fn session_window(session: &ImportedSession, replay: &SessionReplay, model: &str, info: Option<&crate::measure::models::ModelInfo>) -> u64 {
    let peak = replay.calls.iter().map(|c| c.recorded_context()).max().unwrap_or(0);
    window_for(session, peak, model, info)
}

/// [`session_window`] before any replay: the recorded context peak read from the calls' usage.
pub fn recorded_window(session: &ImportedSession, model: &str, info: Option<&crate::measure::models::ModelInfo>) -> u64 {
    let peak = session.calls.iter().map(|c| c.usage.prompt_tokens()).max().unwrap_or(0);
    window_for(session, peak, model, info)
}

/// [`session_window`] given the session's largest recorded context (`peak`).
fn window_for(session: &ImportedSession, peak: u64, model: &str, info: Option<&crate::measure::models::ModelInfo>) -> u64 {
    let Some(info) = info else { return DEFAULT_WINDOW };
    if !info.window_1m_opt_in {
        return info.context_window;
    }
    let picked_1m = session.recording.events.iter().any(|e| match &e.kind {
        EventKind::SystemEvent(sys) if sys.subtype == "local_command" => {
            sys.payload.get("content").and_then(serde_json::Value::as_str).is_some_and(|c| c.contains("1M context"))
        }
        _ => false,
    });
    if peak > DEFAULT_WINDOW || model.ends_with("[1m]") || picked_1m { info.context_window.max(WINDOW_1M) } else { DEFAULT_WINDOW }
}

/// The threshold rule of the client that wrote `session`, under `config` (whose reserve, when
/// unset, is the version's: [`ClientProfile::autocompact_output_reserve`]).
pub fn client_thresholds(session: &ImportedSession, replay: &SessionReplay, table: &ModelTable, config: &AutocompactConfig) -> (String, String, u64, u64, Thresholds) {
    let version = session.calls.iter().find_map(|c| c.version.clone()).unwrap_or_default();
    let model = session.calls.iter().find(|c| c.lane == LANE_MAIN && !c.is_synthetic).map(|c| c.model.clone()).unwrap_or_default();
    let info = table.lookup(&model).ok();
    // A window asked for is capped at what the model offers.
    let window = match config.context_window {
        Some(asked) => asked.min(info.map_or(asked, |m| m.context_window)),
        None => session_window(session, replay, &model, info),
    };
    let reserve = config.output_reserve(ClientProfile::for_version(&version).autocompact_output_reserve);
    let limits = ModelLimits { context_window: window, max_output_tokens: info.map_or(64_000, |m| m.max_output_tokens) };
    let compact = crate::agent::compact::config::CompactConfig { autocompact: config.clone(), ..Default::default() };
    let thresholds = Thresholds::compute_with_reserve(limits, &compact, reserve);
    (version, model, window, limits.max_output_tokens.min(reserve), thresholds)
}

/// A compaction boundary of the session: its trigger, recorded preTokens, event and uuid.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedBoundary {
    pub trigger: String,
    pub pre_tokens: Option<u64>,
    pub event_index: usize,
    pub uuid: Option<String>,
}

/// A compared main-lane call and the client's count before it.
#[derive(Debug, Clone, PartialEq)]
pub struct MainPoint {
    /// Index into [`SessionReplay::calls`].
    pub call: usize,
    pub event_index: usize,
    pub message_id: Option<String>,
    /// What the client counted before sending this call (0 for the first): the previous
    /// reply's usage plus its rough estimate of what was added since.
    pub count: u64,
    /// The compaction between the previous call and this one, if any.
    pub compaction: Option<RecordedBoundary>,
}

/// The main-lane calls of a replayed session in order, with the client's count before each
/// and the compactions between them; and the compactions before the first call (whose
/// history is not in the file). The count takes the previous call's recorded usage, or its
/// simulated one from replay call `diverged_from` on.
pub fn main_points(session: &ImportedSession, replay: &SessionReplay, diverged_from: Option<usize>) -> (Vec<RecordedBoundary>, Vec<MainPoint>) {
    let mut main: Vec<MainPoint> = Vec::new();
    let mut tail_tokens: u64 = 0;
    let mut tail_at_boundary: Option<u64> = None;
    // Tool uses of the last main reply not yet answered: at a boundary their results were in
    // the client's count but never written (the compaction replaced them).
    let mut open_uses: Vec<(String, String)> = Vec::new();
    let result_tokens_by_tool = mean_result_tokens(session);
    let mut reply_tokens: u64 = 0;
    let mut pending: Option<RecordedBoundary> = None;
    let calls_by_event: std::collections::BTreeMap<usize, usize> =
        replay.calls.iter().enumerate().map(|(i, c)| (session.calls[c.index].event_index, i)).collect();
    let mut opening: Vec<RecordedBoundary> = Vec::new();
    // The events' rough counts, shared by every replay of the session and its edits.
    let memo = session.reference_memo();
    for (event_index, event) in session.recording.events.iter().enumerate() {
        if event.lane != LANE_MAIN {
            continue;
        }
        match &event.kind {
            EventKind::Compaction(c) => {
                let boundary = RecordedBoundary { trigger: c.trigger.clone(), pre_tokens: c.pre_tokens, event_index, uuid: event.uuid.clone() };
                if main.is_empty() { opening.push(boundary) } else { pending = Some(boundary) }
                let unanswered: u64 = open_uses.iter().map(|(_, name)| result_tokens_by_tool.get(name.as_str()).copied().unwrap_or(0)).sum();
                tail_at_boundary.get_or_insert(tail_tokens + unanswered);
                open_uses.clear();
            }
            EventKind::ModelReply(reply) => {
                let Some(&i) = calls_by_event.get(&event_index) else { continue };
                if !replay.calls[i].compared() {
                    continue;
                }
                let tail = tail_at_boundary.take().unwrap_or(tail_tokens);
                let count = main.last().map_or(0, |previous_point| {
                    let previous = &replay.calls[previous_point.call];
                    // Older clients wrote a placeholder `output_tokens` on a reply's lines; the
                    // client counted the final one, at least the reply's own size.
                    let output = previous.recorded.output_tokens.max(reply_tokens);
                    // The usage the model returned for the previous call: the recorded one
                    // while the replay sends what the client sent, the simulated one after.
                    let diverged = diverged_from.is_some_and(|at| previous.index >= at);
                    let base = if diverged { previous.simulated_context() } else { previous.recorded_context() };
                    base + output + tail
                });
                let message_id = session.calls[replay.calls[i].index].message_id.clone();
                main.push(MainPoint { call: i, event_index, message_id, count, compaction: pending.take() });
                tail_tokens = 0;
                reply_tokens = memo.rough(event_index, || event_rough_tokens(&event.kind));
                open_uses = reply
                    .content
                    .iter()
                    .filter_map(|b| match b {
                        crate::api::ContentBlock::ToolUse { id, name, .. } => Some((id.clone(), name.clone())),
                        _ => None,
                    })
                    .collect();
            }
            EventKind::ToolResult(result) => {
                tail_tokens += memo.rough(event_index, || event_rough_tokens(&event.kind));
                open_uses.retain(|(id, _)| *id != result.tool_use_id);
            }
            kind => tail_tokens += memo.rough(event_index, || event_rough_tokens(kind)),
        }
    }
    (opening, main)
}

/// The automatic compactions the agent itself made while driven by a recorded session
/// ([`super::workload::agent_replay`]), lined up with the recorded ones: each agent compaction
/// is placed at the main call whose
/// request came after it. Its preTokens is the count before that call the client's way (the
/// previous reply's usage plus the rough estimate of what was added since, [`main_points`]):
/// the usage is the recorded one when the workload scripted it (`recorded_usage`, as the agent
/// counted), else the agent's simulated one. `/compact` (`manual_compact`) is the user's, not a
/// prediction.
pub fn agent_triggers(
    session: &ImportedSession,
    replay: &SessionReplay,
    compactions: &[super::workload::AgentCompaction],
    recorded_usage: bool,
    table: &ModelTable,
    config: &AutocompactConfig,
) -> TriggerReport {
    let (version, model, window, output_reserve, thresholds) = client_thresholds(session, replay, table, config);
    let (opening, main) = main_points(session, replay, if recorded_usage { None } else { Some(0) });
    let position: std::collections::BTreeMap<usize, usize> =
        main.iter().enumerate().map(|(pos, point)| (replay.calls[point.call].index, pos)).collect();
    let predicted: Vec<(usize, u64)> = compactions
        .iter()
        .filter(|c| c.stage != "manual_compact")
        .filter_map(|c| {
            let pos = *position.get(&c.before_call)?;
            Some((pos, main[pos].count))
        })
        .collect();
    let rows = line_up(opening, &main, &predicted, thresholds.autocompact);
    TriggerReport { version, model, window, output_reserve, threshold: thresholds.autocompact, rows }
}

/// Rows of a trigger report: the compactions before the first call (no history), each recorded
/// boundary with the nearest unused prediction (`predicted`: main-call position and count), and
/// the predictions no boundary took.
fn line_up(opening: Vec<RecordedBoundary>, main: &[MainPoint], predicted: &[(usize, u64)], threshold: u64) -> Vec<TriggerRow> {
    let mut rows: Vec<TriggerRow> = opening
        .into_iter()
        .map(|b| TriggerRow {
            recorded_call: Some(0),
            recorded_pre_tokens: b.pre_tokens,
            trigger: b.trigger,
            simulated_call: None,
            simulated_pre_tokens: None,
            threshold,
            verdict: "no_history".into(),
        })
        .collect();

    let mut used = vec![false; predicted.len()];
    for (pos, point) in main.iter().enumerate() {
        let Some(RecordedBoundary { trigger, pre_tokens: pre, .. }) = &point.compaction else { continue };
        let mut row = TriggerRow {
            recorded_call: Some(pos),
            recorded_pre_tokens: *pre,
            trigger: trigger.clone(),
            simulated_call: None,
            simulated_pre_tokens: None,
            threshold,
            verdict: String::new(),
        };
        if trigger != "auto" {
            row.verdict = "manual".into();
            rows.push(row);
            continue;
        }
        // The nearest unused prediction within the segment before this boundary or at it.
        let candidate = predicted
            .iter()
            .enumerate()
            .filter(|(k, (p, _))| !used[*k] && p.abs_diff(pos) <= 3)
            .min_by_key(|(_, (p, _))| p.abs_diff(pos));
        match candidate {
            Some((k, &(p, count))) => {
                used[k] = true;
                row.simulated_call = Some(p);
                row.simulated_pre_tokens = Some(count);
                let pre_ok = pre.is_some_and(|pre| (count as f64 - pre as f64).abs() <= 0.03 * pre as f64);
                row.verdict = if p.abs_diff(pos) > 1 {
                    if p < pos { "early" } else { "late" }.into()
                } else if !pre_ok {
                    "pre_tokens_off".into()
                } else {
                    "matched".into()
                };
            }
            None => row.verdict = "missed".into(),
        }
        rows.push(row);
    }
    for (k, &(p, count)) in predicted.iter().enumerate() {
        if !used[k] {
            rows.push(TriggerRow {
                recorded_call: None,
                recorded_pre_tokens: None,
                trigger: "auto".into(),
                simulated_call: Some(p),
                simulated_pre_tokens: Some(count),
                threshold,
                verdict: "extra".into(),
            });
        }
    }
    rows.sort_by_key(|r| (r.recorded_call.or(r.simulated_call), r.simulated_call));
    rows
}

/// What a main-lane event the client held adds to its count before the next main call, on top
/// of the last reply's usage (`tokenCountWithEstimation`, §7.1–7.2: the rough estimate of every
/// message after the reply): a tool result's content, a prompt's blocks (meta prompts, task
/// notifications and images too: the client holds and sends them), and an attachment the client
/// sends, at the size the replay renders it ([`attachment_text`]); nothing for the rest. The
/// compaction's summary prompt follows its boundary and counts nothing there. One definition
/// for [`main_points`] and for the workload's stand-in of a reply the transcript never wrote
/// ([`super::workload`]), which is what the boundary's preTokens leaves above this count.
pub(crate) fn added_tokens(kind: &EventKind) -> u64 {
    match kind {
        EventKind::ToolResult(result) => result_tokens(result.content.as_ref()),
        EventKind::UserPrompt(prompt) if !prompt.is_compact_summary => prompt.content.to_blocks().iter().map(rough_block).sum(),
        EventKind::Attachment(attachment) if !ATTACHMENTS_NOT_SENT.contains(&attachment.attachment_type.as_str()) => rough(&attachment_text(attachment)),
        _ => 0,
    }
}

/// Rough tokens of an event as [`main_points`] counts it: a model reply's content, else what
/// the event adds ([`added_tokens`]). A function of the event alone, memoized per event of the
/// imported session ([`crate::replay::loss::ReferenceMemo::rough`]).
pub(crate) fn event_rough_tokens(kind: &EventKind) -> u64 {
    match kind {
        EventKind::ModelReply(reply) => reply.content.iter().map(rough_block).sum(),
        kind => added_tokens(kind),
    }
}

/// Rough tokens of a recorded result's content, as the client estimates them.
pub(crate) fn result_tokens(content: Option<&crate::api::ToolResultContent>) -> u64 {
    use crate::api::ToolResultContent;
    match content {
        None => 0,
        Some(ToolResultContent::Text(text)) => rough(text),
        Some(ToolResultContent::Blocks(blocks)) => blocks.iter().map(rough_block).sum(),
    }
}

/// Mean rough tokens of a recorded result, per tool, over the session.
pub(crate) fn mean_result_tokens(session: &ImportedSession) -> std::collections::BTreeMap<String, u64> {
    let mut names: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
    let mut sums: std::collections::BTreeMap<&str, (u64, u64)> = std::collections::BTreeMap::new();
    let memo = session.reference_memo();
    for (i, event) in session.recording.events.iter().enumerate() {
        match &event.kind {
            EventKind::ModelReply(reply) => {
                for block in &reply.content {
                    if let crate::api::ContentBlock::ToolUse { id, name, .. } = block {
                        names.insert(id, name);
                    }
                }
            }
            EventKind::ToolResult(result) => {
                if let Some(name) = names.get(result.tool_use_id.as_str()) {
                    let entry = sums.entry(*name).or_default();
                    // A result's rough tokens (`added_tokens` of it).
                    entry.0 += memo.rough(i, || event_rough_tokens(&event.kind));
                    entry.1 += 1;
                }
            }
            _ => {}
        }
    }
    sums.into_iter().map(|(name, (sum, n))| (name.to_owned(), sum / n.max(1))).collect()
}

/// The compaction-trigger table of reports from [`agent_triggers`], for reading: the simulated
/// side is where the agent, driven by the session, compacted.
pub fn agent_triggers_table(reports: &[(String, TriggerReport)]) -> String {
    titled_table(reports, "the agent's own compactions, driven by the session")
}

fn titled_table(reports: &[(String, TriggerReport)], simulated: &str) -> String {
    let mut out = format!("compaction triggers (main-lane call positions; recorded vs {simulated})\n");
    out.push_str(&format!(
        "{:<30} {:>8} {:>8} {:>9} {:>7} {:>5} {:>8} {:>5} {:>8} {:>7}  {}\n",
        "session", "version", "window", "threshold", "trigger", "rec#", "rec pre", "sim#", "sim pre", "pre err", "verdict"
    ));
    for (name, report) in reports {
        if report.rows.is_empty() {
            out.push_str(&format!("{:<30} {:>8} {:>8} {:>9}  (no compaction recorded or predicted)\n", short(name), report.version, report.window, report.threshold));
        }
        for row in &report.rows {
            let opt = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
            let pos = |v: Option<usize>| v.map_or("-".to_owned(), |v| v.to_string());
            let err = match (row.recorded_pre_tokens, row.simulated_pre_tokens) {
                (Some(r), Some(s)) if r > 0 => format!("{:+.1}%", (s as f64 - r as f64) / r as f64 * 100.0),
                _ => "-".into(),
            };
            out.push_str(&format!(
                "{:<30} {:>8} {:>8} {:>9} {:>7} {:>5} {:>8} {:>5} {:>8} {:>7}  {}\n",
                short(name),
                report.version,
                report.window,
                row.threshold,
                row.trigger,
                pos(row.recorded_call),
                opt(row.recorded_pre_tokens),
                pos(row.simulated_call),
                opt(row.simulated_pre_tokens),
                err,
                row.verdict
            ));
        }
    }
    let (total, matched) = reports.iter().map(|(_, r)| r.auto_matched()).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    out.push_str(&format!("recorded automatic compactions with their history: {total}, predicted at the same call (±1) with preTokens within 3%: {matched}\n"));
    out
}

/// `dir/session` without the transcript suffix, at most 30 characters.
fn short(name: &str) -> String {
    let path = std::path::Path::new(name);
    let file = path.file_name().map_or(name.to_owned(), |f| f.to_string_lossy().into_owned());
    let stem = file.trim_end_matches(".jsonl").trim_end_matches(".full").to_owned();
    let parent = path.parent().and_then(|p| p.file_name()).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    let text = if parent.is_empty() { stem } else { format!("{parent}/{stem}") };
    text.chars().take(30).collect()
}
