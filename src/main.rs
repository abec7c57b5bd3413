use clap::Parser;

fn main() {
    let cli = ctxsim::cli::Cli::parse();
    let code = match ctxsim::cli::run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ctxsim::cli::exit::BAD_INPUT
        }
    };
    std::process::exit(code);
}
