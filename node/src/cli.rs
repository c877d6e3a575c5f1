//! The command line: flags defined once with their help, parsed into low-level args, then
//! turned into a validated `NodeConfig` before any work. `main` only calls `main_with`, which
//! owns the exit status (`baton_shared::exit`).

use crate::config::{ConfigError, ConfigFlags, Layer, NodeConfig};
use anyhow::Context as _;
use baton_shared::exit;
use clap::{Args, Parser, Subcommand};
use std::io::Write as _;
use std::path::PathBuf;

/// How the configuration layers stack, printed above the exit statuses in `--help`.
const LAYERING_HELP: &str = "\
Every configuration key can be set in the TOML file, by its flag (--claim-wait) or by the
environment variable BATON_NODE_<KEY> (BATON_NODE_CLAIM_WAIT); a flag beats the environment,
which beats the file, which beats the default. The log filter is BATON_LOG (default info).";

/// The text under the flags in `--help`: the configuration layering and the exit statuses.
fn after_help() -> String {
    format!("{LAYERING_HELP}\n\n{}", exit::NODE_HELP)
}

/// baton-node: the Baton worker agent. Claims this host's deliveries from the hub, mirrors
/// them locally, acks them, runs the harness turn for each, and reports how it ended.
#[derive(Debug, Parser)]
#[command(name = "baton-node", version, after_help = after_help())]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node until SIGTERM or SIGINT (SIGHUP re-reads the certificate and key files).
    #[command(after_help = after_help())]
    Run(RunArgs),
    /// Configuration tools.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Show what this node holds locally (no hub needed).
    Status(StatusArgs),
    /// How the node starts a turn: waits for the node's go on stdin, then becomes ARGV (same
    /// process, same group). Not for operators; see `exec`.
    #[command(name = crate::exec::GATE_SUBCOMMAND, hide = true)]
    TurnGate(TurnGateArgs),
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: baton_shared::manuals::Shell,
    },
    /// Write a man page for every command into a directory.
    Man {
        /// The directory (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// `turn-gate` arguments.
#[derive(Debug, Args)]
pub struct TurnGateArgs {
    /// The harness argv.
    #[arg(last = true, required = true, value_name = "ARGV")]
    pub argv: Vec<String>,
}

/// `config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Check the configuration and what it names: exit 0 if nothing failed, 2 if anything did.
    ///
    /// Reads the configuration as `run` does (file, environment, flags) and prints one line per
    /// check, ok, warn or FAIL: files (ca_file, cert_file and key_file read and hold PEM);
    /// harness (the program in `command` exists and this user may execute it, found as `run`
    /// finds it: a path as given, else on PATH); key (key_file is cert_file's private key);
    /// identity (the certificate names a node, not a producer); ca (it chains to ca_file and is
    /// valid now; a warning, which passes, when it expires within 30 days). With --online, also
    /// hub: one read that changes nothing proves the hub answers and accepts this certificate.
    /// `run` refuses to start (exit 2, the same message) when files, harness, key or identity
    /// fails.
    #[command(after_help = after_help())]
    Check(CheckArgs),
}

/// `config check` arguments.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Also contact every hub of hub_url with the configured certificate (`GET /v1/holdings`,
    /// which changes nothing) and say which answered: an unreachable hub, a TLS failure and a
    /// refused certificate are told apart.
    #[arg(long)]
    pub online: bool,
    /// Print one JSON object, `{"checks": [{"name", "status", "detail"}], "ok"}`, instead of text.
    #[arg(long)]
    pub json: bool,
    /// Where the configuration comes from.
    #[command(flatten)]
    pub run: RunArgs,
}

/// `status` arguments.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The node's data directory.
    #[arg(long, env = "BATON_NODE_DATA_DIR", value_name = "DIR")]
    pub data_dir: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Where the configuration comes from.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The TOML config file; may be omitted when flags and environment give every required key.
    #[arg(long, env = "BATON_NODE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// One flag per configuration key, generated from the key table (`config::KEYS`).
    #[command(flatten)]
    pub flags: ConfigFlags,
}

impl RunArgs {
    /// Builds the validated configuration: flags > environment > file > defaults.
    pub fn resolve(&self, env: impl Fn(&str) -> Option<String>) -> Result<NodeConfig, ConfigError> {
        let file = match &self.config {
            Some(path) => Layer::from_file(path)?,
            None => Layer::default(),
        };
        NodeConfig::resolve(file, Layer::from_env(env)?, self.flags.layer()?)
    }
}

/// Runs a parsed command line and returns the process exit status. Errors are printed once,
/// as a chain, to stderr.
pub fn main_with(cli: Cli) -> u8 {
    if let Command::TurnGate(gate) = &cli.command {
        // Returns only when it could not become the harness.
        return crate::exec::gate(&gate.argv);
    }
    match dispatch(cli) {
        Ok(()) => exit::OK,
        Err(e) => {
            // A closed stderr leaves nowhere to say it; the exit status still does.
            let _ = writeln!(std::io::stderr(), "baton-node: {e:#}");
            exit_code(&e)
        }
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<()> {
    let env = |k: &str| std::env::var(k).ok();
    match cli.command {
        Command::Config(ConfigCommand::Check(args)) => config_check(&args, env),
        Command::Status(args) => {
            let mut text = crate::status::status(&args.data_dir, args.json)?;
            if args.json {
                text.push('\n');
            }
            crate::output::print(&text).context("writing to stdout")
        }
        Command::Completions { shell } => crate::manuals::completions(<Cli as clap::CommandFactory>::command(), shell),
        Command::Man { out } => crate::manuals::man(<Cli as clap::CommandFactory>::command(), &out),
        Command::TurnGate(gate) => {
            anyhow::bail!("{} runs from main_with ({} arguments)", crate::exec::GATE_SUBCOMMAND, gate.argv.len())
        }
        Command::Run(args) => {
            let config = args.resolve(env)?;
            crate::check::before_run(&config)?;
            baton_shared::logging::init(config.log_format);
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async move {
                let shutdown =
                    baton_shared::signal::shutdown_token().context("installing the SIGTERM/SIGINT handlers")?;
                // Installed before anything else runs: SIGHUP's default action would end the node.
                let hangups = baton_shared::signal::hangups().context("installing the SIGHUP handler")?;
                crate::run(config, baton_shared::clock::system(), shutdown.cancelled_owned(), hangups).await
            })
        }
    }
}

/// `config check`: every check, printed as text or JSON; the first failure is the error (exit 2).
fn config_check(args: &CheckArgs, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<()> {
    let config = args.run.resolve(env)?;
    let mut report = crate::check::offline(&config, baton_shared::clock::system_now_ms());
    if args.online {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        report.checks.push(runtime.block_on(crate::check::online(&config)));
    }
    let text = if args.json { format!("{}\n", report.json()) } else { report.human(&config) };
    crate::output::print(&text).context("writing to stdout")?;
    match report.error() {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// The documented exit status for an error (`baton_shared::exit`).
pub fn exit_code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if cause.downcast_ref::<crate::agent::Finished>().is_some() {
            return exit::REVOKED;
        }
        if cause.downcast_ref::<crate::agent::Superseded>().is_some() {
            return exit::SUPERSEDED;
        }
        if cause.downcast_ref::<ConfigError>().is_some() {
            return exit::USAGE;
        }
        if let Some(s) = cause.downcast_ref::<crate::store::StoreError>() {
            return if s.is_refused() { exit::REFUSED } else { exit::FAILURE };
        }
        if cause.downcast_ref::<baton_shared::sqlite::OpenError>().is_some() {
            return exit::REFUSED;
        }
    }
    exit::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_documents_the_shared_exit_statuses_and_the_log_variable() {
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains(exit::NODE_HELP), "{help}");
        assert!(help.contains(baton_shared::logging::FILTER_VAR), "{help}");
    }

    #[test]
    fn flags_reach_the_config() {
        let cli = Cli::try_parse_from([
            "baton-node",
            "run",
            "--hub-url",
            "https://h:1",
            "--ca-file",
            "a",
            "--cert-file",
            "b",
            "--key-file",
            "c",
            "--data-dir",
            "d",
            "--command",
            r#"["sh","-c","cat"]"#,
            "--claim-wait",
            "2s",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else { panic!("run expected") };
        let c = args.resolve(|k| (k == "BATON_NODE_CLAIM_WAIT").then(|| "9s".to_string())).unwrap();
        assert_eq!(c.claim_wait, std::time::Duration::from_secs(2));
        assert_eq!(c.command, ["sh", "-c", "cat"]);
    }

    #[test]
    fn config_errors_exit_2_refused_stores_exit_3_and_other_failures_exit_4() {
        let e = anyhow::Error::from(NodeConfig::validate(Layer::default()).unwrap_err());
        assert_eq!(exit_code(&e), exit::USAGE);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.db");
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        let e =
            anyhow::Error::from(crate::store::Db::open(&path, baton_shared::sqlite::Synchronous::Full).err().unwrap());
        assert_eq!(exit_code(&e), exit::REFUSED);
        let missing = crate::status::status(&dir.path().join("nowhere"), false).unwrap_err();
        assert_eq!(exit_code(&anyhow::Error::from(missing).context("status")), exit::REFUSED, "not initialised");
        assert_eq!(exit_code(&anyhow::anyhow!("boom")), exit::FAILURE);
        assert_eq!(exit::FAILURE, 4);
    }

    #[test]
    fn a_node_taken_over_by_a_newer_session_exits_6() {
        let taken = anyhow::Error::from(crate::agent::Superseded("a newer session replaced this one".into()));
        assert_eq!(exit_code(&taken.context("running the node")), exit::SUPERSEDED);
        assert_eq!(exit::SUPERSEDED, 6);
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("6  taken over"), "{help}");
    }

    #[test]
    fn a_node_the_hub_refused_for_good_exits_5() {
        let finished = anyhow::Error::from(crate::agent::Finished("the hub revoked this node's certificate".into()));
        assert_eq!(exit_code(&finished.context("running the node")), exit::REVOKED);
        assert_eq!(exit::REVOKED, 5);
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("5  refused for good"), "{help}");
    }
}
