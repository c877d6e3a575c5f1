//! `baton-hub`: parses the command line, runs the command, owns the exit status (the shared
//! `baton_shared::exit` statuses, listed in `--help`).

use baton_hub::cli::{self, Cli};
use clap::Parser;
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Fails only when a provider is installed already, which is what this asks for.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    match cli::run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        // stdout closed by its reader: the command stopped writing, nothing went wrong.
        Err(e) if e.code == baton_shared::exit::OK => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "baton-hub: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}
