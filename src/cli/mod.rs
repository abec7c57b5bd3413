//! The command line: one file per subcommand, all of them thin over the library.

/// `println!` to stdout that returns an error instead of panicking when the reader went away
/// (`ctxsim strategies | head -1`); `main` ends such a run quietly with exit 0.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
}

/// `print!` to stdout, as [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)?
    }};
}

/// Whether an error is a closed stdout (`EPIPE`): the reader stopped reading, nothing failed.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| cause.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe))
}

mod analyze;
mod guard;
mod audit;
mod calibrate;
mod args;
mod check;
mod compare;
mod diff_requests;
mod common;
mod diag;
mod fidelity;
mod import;
mod live;
mod profile;
mod replay;
pub mod exit;
mod report;
mod run;
mod serve;
mod sessions;
mod strategies;
mod sweep;
mod tokens;

pub use args::Cli;

/// Runs the parsed command line; returns the process exit code (0 ok, 1 a check failed).
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    let mut diag = diag::Diagnostics::new(cli.strict);
    let code = run_command(cli.command, &mut diag)?;
    Ok(diag.finish(code))
}

fn run_command(command: args::Command, diag: &mut diag::Diagnostics) -> anyhow::Result<i32> {
    match command {
        args::Command::Run(a) => run::run(a),
        args::Command::Analyze(a) => analyze::run(a, diag),
        args::Command::Tokens(a) => tokens::run(a),
        args::Command::Import(a) => import::run(a, diag),
        args::Command::Replay(a) => replay::run(a, diag),
        args::Command::Fidelity(a) => fidelity::run(a, diag),
        args::Command::Check(a) => check::run(a, diag),
        args::Command::Report(a) => report::run(a),
        args::Command::Strategies(a) => strategies::run(a),
        args::Command::Compare(a) => compare::run(a, diag),
        args::Command::Sweep(a) => sweep::run(a, diag),
        args::Command::Serve(a) => serve::run(a),
        args::Command::Live(a) => live::run(a),
        args::Command::Audit(a) => audit::run(a),
        args::Command::Calibrate(a) => calibrate::run(a),
        args::Command::DiffRequests(a) => diff_requests::run(a, diag),
        args::Command::Profile(a) => profile::run(a),
        args::Command::Causes => {
            for (id, region, description) in crate::measure::CAUSES {
                let region = region.map(|r| r.as_str()).unwrap_or("any");
                outln!("{id:<34} {region:<9} {description}");
            }
            Ok(exit::OK)
        }
    }
}
