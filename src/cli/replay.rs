use anyhow::bail;

use crate::measure::Summary;
use crate::replay::{ReplayOptions, load_session, replay_session};

use super::args::ReplayArgs;
use super::common::{emit, measurer};

pub fn run(args: ReplayArgs) -> anyhow::Result<i32> {
    if args.strategy != "as-recorded" && args.strategy != "claude-code" {
        bail!("replay under strategy `{}` is not available yet; use `as-recorded`", args.strategy);
    }
    let mut summaries = Vec::new();
    let mut all_rows = Vec::new();
    for path in &args.inputs {
        let name = path.display().to_string();
        let session = load_session(path)?;
        let mut measurer = measurer(&args.measure)?;
        let replay = replay_session(&session, &mut measurer, &ReplayOptions::default());
        let rows = replay.rows();
        summaries.push(Summary::from_rows(&name, "as-recorded", measurer.counter().kind().name(), &rows, 0));
        all_rows.extend(rows);
    }
    emit(&args.measure, &summaries, &all_rows)?;
    Ok(0)
}
