//! `baton-check`: the offline invariant checker (RELIABILITY.md §6.3).
//!
//! Reads the hub's record (an SQLite file with `--hub-db`, or a PostgreSQL database with
//! `--database-url`) and every node database read-only, plus the client history and the
//! effects ledger, prints each violation with the chain of events behind it, and exits 1 when
//! there is any (0 when clean, 2 when the inputs cannot be read).

use baton_fault::checker::{self, HubRecord, Inputs};
use clap::Parser;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Check Baton's reliability invariants over a finished run.
#[derive(Debug, Parser)]
#[command(name = "baton-check", after_help = "Exit status: 0 clean; 1 violations found; 2 inputs unreadable.")]
struct Cli {
    /// The hub database (`HUB_DATA_DIR/hub.db`).
    #[arg(long, required_unless_present = "database_url", conflicts_with = "database_url")]
    hub_db: Option<PathBuf>,
    /// The hub's record in PostgreSQL instead: the `postgres://` URL of the hubs'
    /// `database_url` (read in one read-only transaction; the SQLite file checks do not apply).
    #[arg(long)]
    database_url: Option<String>,
    /// A node database (`NODE_DATA_DIR/node.db`); repeat for every node.
    #[arg(long = "node-db")]
    node_dbs: Vec<PathBuf>,
    /// A node database whose data directory a copy took over (the copy is another
    /// `--node-db`): read like one, but what it left unsettled is not a liveness violation;
    /// repeat for every such database.
    #[arg(long = "retired-node-db")]
    retired_node_dbs: Vec<PathBuf>,
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
    /// How long a turn may run past its message's deadline_ms before I19 counts it (the
    /// nodes' kill_grace plus the stated bound, plus the longest pause of a run that paused
    /// nodes), e.g. "12s".
    #[arg(long, value_parser = |s: &str| baton_shared::duration::parse("--deadline-allowance", s), default_value = "12s")]
    deadline_allowance: std::time::Duration,
}

impl Cli {
    /// The hub's record the arguments name (clap lets through exactly one of the two).
    fn record(&self) -> Option<HubRecord> {
        match (&self.hub_db, &self.database_url) {
            (Some(path), None) => Some(HubRecord::Sqlite(path.clone())),
            (None, Some(url)) => Some(HubRecord::Postgres(url.clone())),
            _ => None,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Some(hub) = cli.record() else {
        eprintln!("baton-check: name the hub's record with either --hub-db or --database-url");
        return ExitCode::from(2);
    };
    let mut node_dbs = cli.node_dbs;
    node_dbs.extend(cli.retired_node_dbs.iter().cloned());
    let inputs = Inputs {
        hub,
        node_dbs,
        retired_node_dbs: cli.retired_node_dbs,
        history: cli.history,
        ledger: cli.ledger,
        liveness: cli.liveness,
        deadline_allowance: cli.deadline_allowance,
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

    #[test]
    fn the_hub_record_is_an_sqlite_file_or_a_postgres_url_never_both() {
        let record = |args: &[&str]| {
            let all = [&["baton-check"], args].concat();
            Cli::try_parse_from(all).map(|c| c.record()).map_err(|e| e.kind())
        };
        assert_eq!(record(&["--hub-db", "h.db"]), Ok(Some(HubRecord::Sqlite("h.db".into()))));
        let url = "postgres://baton:pw@127.0.0.1:5432/baton";
        assert_eq!(record(&["--database-url", url]), Ok(Some(HubRecord::Postgres(url.into()))));
        assert_eq!(record(&["--hub-db", "h.db", "--database-url", url]), Err(clap::error::ErrorKind::ArgumentConflict));
        assert_eq!(record(&["--node-db", "n.db"]), Err(clap::error::ErrorKind::MissingRequiredArgument));
    }
}
