use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::live::{Script, ServeOptions, Service, start};

use super::args::MeasureOpts;
use super::common::{emit, measurer};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The script to answer from (JSON; docs/serve.md).
    #[arg(long, value_name = "FILE")]
    pub script: PathBuf,
    /// Port on 127.0.0.1; 0 picks a free one (printed first: `listening on http://127.0.0.1:PORT`).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Write the request log (`requests.jsonl`, an `analyze` input, flushed per request), and at
    /// shutdown the trace and summary, into this directory.
    #[arg(long, value_name = "DIR")]
    pub log: Option<PathBuf>,
    /// Stop after this many measured `/v1/messages` requests (malformed ones do not count).
    #[arg(long, value_name = "N")]
    pub max_requests: Option<usize>,
    /// Stop once every scripted main reply was served.
    #[arg(long)]
    pub exit_when_done: bool,
    /// Virtual milliseconds between two requests without an `x-ctxsim-time-ms` header.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub step_ms: u64,
    /// Seconds of silence after which a connection whose request is unfinished gets a 408 and is
    /// closed (an idle kept-alive connection is closed then too); a whole request must arrive
    /// within 600 s.
    #[arg(long, default_value_t = 60, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub read_timeout: u64,
    /// Tag in generated message and tool ids (distinct per process when a run resumes another).
    #[arg(long, default_value = "ctxsim")]
    pub id_tag: String,
    #[command(flatten)]
    pub measure: MeasureOpts,
}

pub fn run(args: ServeArgs) -> anyhow::Result<i32> {
    let inputs = super::common::inputs_with(&args.measure, [args.script.clone()]);
    super::common::guard_trace(&args.measure, &inputs)?;
    if let Some(dir) = &args.log {
        for name in ["requests.jsonl", "trace.jsonl", "summary.json"] {
            inputs.refuse_file("--log", &dir.join(name))?;
        }
    }
    let script = Script::load(&args.script)?;
    let options = ServeOptions {
        step_ms: args.step_ms,
        id_tag: args.id_tag.clone(),
        log_dir: args.log.clone(),
        max_requests: args.max_requests,
        exit_when_done: args.exit_when_done,
        input_name: args.script.display().to_string(),
        read_timeout: std::time::Duration::from_secs(args.read_timeout),
        ..ServeOptions::default()
    };
    let service = Service::new(script, measurer(&args.measure)?, options)
        .with_context(|| format!("failed to create the request log in {}", args.log.as_ref().map_or(String::new(), |d| d.display().to_string())))?;
    let handle = start(args.port, service).with_context(|| format!("failed to listen on 127.0.0.1:{}", args.port))?;
    outln!("listening on {}", handle.base_url());
    std::io::stdout().flush()?;
    let stopper = handle.stopper();
    ctrlc::set_handler(move || stopper.stop()).context("failed to install the SIGINT/SIGTERM handler")?;
    let report = handle.wait().context("the server failed")?;
    if report.unserved_main > 0 && !args.measure.quiet {
        eprintln!("note: {} scripted main replies were not served", report.unserved_main);
    }
    emit(&args.measure, std::slice::from_ref(&report.summary), &report.rows)?;
    Ok(super::exit::OK)
}
