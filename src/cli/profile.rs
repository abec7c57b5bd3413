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
    /// Run the probes through the agent speaking each shipped version and compare its requests
    /// with the real client's snapshots: structural identity, cache-deciding agreement, tokens.
    Check(CheckArgs),
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
    /// The calibration `serve` counts the usage it replies with (default: the shipped one); a
    /// fixed file keeps captured fixtures valid when the shipped calibration is refitted.
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
}

pub fn run(args: ProfileArgs) -> anyhow::Result<i32> {
    match args.command {
        ProfileCommand::Capture(a) => run_capture(a),
        ProfileCommand::Check(a) => run_check(a),
    }
}

fn run_capture(args: CaptureArgs) -> anyhow::Result<i32> {
    let options = CaptureOptions {
        client: args.client.clone(),
        ctxsim: std::env::current_exe()?,
        work: args.work.clone(),
        timeout: Duration::from_secs(args.timeout),
        only: args.probes.clone(),
        calibration: args.calibration.clone(),
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

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The versions to check (default: every shipped profile).
    #[arg(long = "version")]
    pub versions: Vec<String>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: super::args::FidelityFormat,
    /// Print each structural difference.
    #[arg(long)]
    pub differences: bool,
    /// Also write each probe as a ctxsim scenario here (`<version>/probe-<name>.yaml`), to run
    /// with `ctxsim run --set client_version=<version>`.
    #[arg(long, value_name = "DIR")]
    pub scenarios: Option<PathBuf>,
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn run_check(args: CheckArgs) -> anyhow::Result<i32> {
    let versions: Vec<String> = if args.versions.is_empty() { crate::client_profile::SHIPPED.iter().map(|(v, _, _)| (*v).to_owned()).collect() } else { args.versions.clone() };
    let mut scores = Vec::new();
    for version in &versions {
        let Some((profile, shapes)) = crate::client_profile::shipped(version) else {
            eprintln!("profile check: --version {version}: no shipped profile (known: {})", crate::client_profile::SHIPPED.iter().map(|(v, _, _)| *v).collect::<Vec<_>>().join(", "));
            return Ok(super::exit::BAD_INPUT);
        };
        if let Some(dir) = &args.scenarios {
            let dir = dir.join(version);
            std::fs::create_dir_all(&dir)?;
            for probe in crate::client_profile::probes::probes() {
                let text = serde_json::to_string_pretty(&crate::client_profile::conformance::scenario(&probe, &profile))? + "\n";
                crate::report::output::write_atomic(&dir.join(format!("probe-{}.yaml", probe.name)), text.as_bytes())?;
            }
        }
        scores.push(crate::client_profile::conformance::score(&profile, &shapes).map_err(anyhow::Error::msg)?);
    }
    if matches!(args.format, super::args::FidelityFormat::Json) {
        outln!("{}", serde_json::to_string_pretty(&scores)?);
        return Ok(super::exit::OK);
    }
    for score in &scores {
        outln!("Claude Code {}: the agent (client_version = {}) against the real client's probes", score.version, score.version);
        outln!("{:<14} {:>9} {:>9} {:>9} {:>11} {:>9} {:>12} {:>12}", "probe", "requests", "identical", "cache ok", "real o200k", "ours", "real calib.", "ours");
        for p in &score.probes {
            outln!(
                "{:<14} {:>4}/{:<4} {:>9} {:>9} {:>11} {:>9} {:>12} {:>12}",
                p.probe, p.our_requests, p.real_requests, p.identical, p.cache_agree, p.real_tokens.o200k, p.our_tokens.o200k, p.real_tokens.calibrated, p.our_tokens.calibrated
            );
            if args.differences {
                for d in &p.differences {
                    outln!("    {d}");
                }
            }
        }
        let (o, c) = score.token_deviation();
        outln!(
            "structurally identical {}/{} ({}); cache-deciding agreement {}/{} ({}); tokens o200k {:+.1}%, calibrated {:+.1}%\n",
            score.identical, score.requests, pct(score.structural_share()), score.cache_agree, score.requests, pct(score.cache_share()), o * 100.0, c * 100.0
        );
    }
    Ok(super::exit::OK)
}
