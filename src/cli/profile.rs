//! `ctxsim profile capture`: a real Claude Code client driven through the probe scenarios
//! against `serve`, its requests turned into a version profile (src/client_profile/).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::client_profile::{CaptureError, CaptureOptions, VersionProfile, capture, snapshots};

#[derive(Debug, Args)]
pub struct ProfileArgs {
    #[command(subcommand)]
    pub command: ProfileCommand,
}

#[derive(Debug, Subcommand)]
pub enum ProfileCommand {
    /// Drive a real Claude Code client (native binary or cli.js) through the probes and write
    /// its version profile and request snapshots.
    Capture(CaptureArgs),
}

#[derive(Debug, Args)]
pub struct CaptureArgs {
    /// The client: a native `claude` binary, or the `cli.js` of an npm install (run with node).
    #[arg(long, value_name = "PATH")]
    pub client: PathBuf,
    /// The version to name the profile by (default: what `--version` of the client prints).
    #[arg(long)]
    pub version: Option<String>,
    /// Where to write the profile (default `data/profiles/<version>.toml`); the snapshots go
    /// beside it as `<version>.shapes.json`.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Working directory of the probes (their projects' paths reach the requests).
    #[arg(long, value_name = "DIR", default_value = "/tmp/ctxsim-probe")]
    pub work: PathBuf,
    /// Run only this probe (repeatable).
    #[arg(long = "probe", value_name = "NAME")]
    pub probes: Vec<String>,
    /// Seconds one client process may take.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
}

pub fn run(args: ProfileArgs) -> anyhow::Result<i32> {
    match args.command {
        ProfileCommand::Capture(a) => run_capture(a),
    }
}

fn run_capture(args: CaptureArgs) -> anyhow::Result<i32> {
    let options = CaptureOptions {
        client: args.client.clone(),
        ctxsim: std::env::current_exe()?,
        work: args.work.clone(),
        timeout: Duration::from_secs(args.timeout),
        only: args.probes.clone(),
    };
    let (kind, detected, logs) = match capture::capture(&options) {
        Ok(result) => result,
        Err(CaptureError::Missing(why)) => {
            eprintln!("profile capture: {why}");
            return Ok(super::exit::BAD_INPUT);
        }
        Err(CaptureError::Failed(why)) => anyhow::bail!(why),
    };
    let version = args.version.unwrap_or(detected);
    let profile = VersionProfile::derive(&version, &kind, &args.work.display().to_string(), &logs).map_err(anyhow::Error::msg)?;
    let out = args.out.unwrap_or_else(|| PathBuf::from(format!("data/profiles/{version}.toml")));
    let shapes_path = out.with_file_name(format!("{}.shapes.json", out.file_stem().map_or_else(|| version.clone(), |s| s.to_string_lossy().into_owned())));
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    crate::report::output::write_atomic(&out, profile.to_toml().as_bytes())?;
    let mut shapes = serde_json::to_string_pretty(&snapshots(&logs))?;
    shapes.push('\n');
    crate::report::output::write_atomic(&shapes_path, shapes.as_bytes())?;
    let mut noted = 0;
    for probe in &profile.probes {
        outln!("{:<14} {:>2} requests  {:>7} o200k  {:>7} calibrated  lanes {}", probe.name, probe.requests, probe.total.o200k, probe.total.calibrated, probe.lanes.join(","));
        for note in &probe.notes {
            eprintln!("warning: probe {}: {note}", probe.name);
            noted += 1;
        }
    }
    outln!("Claude Code {version} ({} build): wrote {} and {}", kind.name(), out.display(), shapes_path.display());
    Ok(if noted == 0 { super::exit::OK } else { super::exit::CHECK_FAILED })
}
