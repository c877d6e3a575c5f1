//! `baton`: the producer command line. Sends messages to a Baton hub over mTLS, reads them
//! by id or idempotency key, waits for their outcomes with an exit status that says how they
//! ended, and cancels them. Built on `baton_client::Client`.
//!
//! Layout:
//! - `args`: the command line (`Cli`), defined once, and the exit statuses (`EXIT_HELP`).
//! - `config`: the connection settings, file < environment < flag.
//! - `commands`: what each command does, and its exit status.
//! - `error`: `CliError`, how a command fails and with which exit status.
//! - `output`: everything written to stdout, and `esc` for stored text.
//! - `spool`: `send --spool` and the `spool` commands, over `baton_client::Spooler`.
//! - `verdict`: how a message's deliveries ended, as `wait`'s and `watch`'s exit status.
//! - `watch`: `watch` and `follow`, an events feed followed from a cursor.
//!
//! `main` owns the exit status: errors are printed once, on stderr.

mod args;
mod commands;
mod config;
mod error;
mod output;
mod spool;
mod verdict;
mod watch;

use clap::Parser as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    // Exactly one rustls provider is compiled in; installing it first makes that explicit.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cli = args::Cli::parse();
    match commands::run(cli) {
        Ok(status) => ExitCode::from(status),
        Err(e) => {
            eprintln!("baton: {}", e.message);
            ExitCode::from(e.status)
        }
    }
}
