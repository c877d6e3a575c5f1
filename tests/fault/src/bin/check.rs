//! `baton-check`: the offline invariant checker (RELIABILITY.md §6.3).
//!
//! Reads the hub database and every node database read-only, plus the client history and the
//! effects ledger, prints each violation with the chain of events behind it, and exits 1 when
//! there is any (0 when clean, 2 when the inputs cannot be read).

use baton_fault::checker::{self, Inputs};
use clap::Parser;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Check Baton's reliability invariants over a finished run.
#[derive(Debug, Parser)]
#[command(name = "baton-check", after_help = "Exit status: 0 clean; 1 violations found; 2 inputs unreadable.")]
struct Cli {
    /// The hub database (`HUB_DATA_DIR/hub.db`).
    #[arg(long)]
    hub_db: PathBuf,
    /// A node database (`NODE_DATA_DIR/node.db`); repeat for every node.
    #[arg(long = "node-db")]
    node_dbs: Vec<PathBuf>,
    /// The client history (JSON lines).
    #[arg(long)]
    history: Option<PathBuf>,
    /// The effects ledger (JSON lines).
    #[arg(long)]
    ledger: Option<PathBuf>,
    /// The run was healed and drained: also check liveness (I10).
    #[arg(long)]
    liveness: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let inputs = Inputs {
        hub_db: cli.hub_db,
        node_dbs: cli.node_dbs,
        history: cli.history,
        ledger: cli.ledger,
        liveness: cli.liveness,
    };
    let report = match checker::check(&inputs) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("baton-check: {e:#}");
            return ExitCode::from(2);
        }
    };
    let text = if cli.json {
        serde_json::to_string_pretty(&report).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    } else {
        report.render()
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    if report.violations.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_valid() {
        Cli::command().debug_assert();
    }
}
