use clap::Parser;

fn main() {
    let cli = ctxsim::cli::Cli::parse();
    let code = match ctxsim::cli::run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            2
        }
    };
    std::process::exit(code);
}
