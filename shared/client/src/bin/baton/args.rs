//! The command line, defined once: every flag with its help text, its environment variable
//! where it has one, and its type. `config` turns the connection flags into `Settings`.

use baton_shared::manuals::Shell;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

/// The exit statuses, printed under `--help` and listed in README.
pub(crate) const EXIT_HELP: &str = "\
Exit status:
  0  ok: sent, found, listed, cancelled, or (wait, watch) every delivery succeeded
  1  not found, or (cancel) every delivery had already ended: nothing changed
  2  usage error, invalid input (a list cursor not of this listing, or expired) or invalid
     configuration
  3  (--spool, spool) the spool was refused: damaged, or newer than this binary
  4  any other failure: the hub unreachable or unable to answer now (worth retrying), or the
     spool full
  7  (wait, watch) every delivery ended, and at least one did not succeed: failed, cancelled or
     unknown
  8  (wait, watch) the timeout passed before every delivery ended
  9  refused: the certificate is unknown or revoked (401), or the producer may not do this (403:
     outside its publish scope, not its message); retrying unchanged cannot help
  10  (send --spool, spool flush) spooled: safe in the spool, not yet accepted (no hub answered,
      or it waits behind a failed message of its conversation); a later send or flush delivers it
  11  (spool flush) the spool holds messages the hub refused, kept for inspection (spool status)";

/// `baton`: send messages to a Baton hub and follow them, from any machine holding a producer
/// certificate (`baton-hub enroll producer NAME`).
///
/// Configuration: a TOML file (`--config`, `BATON_CONFIG`, default
/// `$XDG_CONFIG_HOME/baton/baton.toml`, else `~/.config/baton/baton.toml`) with `hub_url`,
/// `ca_file`, `cert_file` and `key_file` (relative paths are relative to the file), each
/// overridden by its environment variable (`BATON_HUB_URL`, `BATON_CA_FILE`, `BATON_CERT_FILE`,
/// `BATON_KEY_FILE`), each overridden by its flag.
#[derive(Debug, Parser)]
#[command(name = "baton", version, after_help = EXIT_HELP)]
pub(crate) struct Cli {
    /// How to reach the hub.
    #[command(flatten)]
    pub(crate) connection: Connection,
    /// Print JSON (the API's own answer) instead of text.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The hub and the producer identity: file < environment < flag.
#[derive(Debug, Args)]
pub(crate) struct Connection {
    /// The configuration file (a file named here must exist).
    #[arg(long, env = "BATON_CONFIG", global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// The hub's URL, `https://HOST:PORT`.
    #[arg(long, env = "BATON_HUB_URL", global = true, value_name = "URL")]
    pub(crate) hub_url: Option<String>,
    /// The hub CA certificate (`ca.crt`).
    #[arg(long, env = "BATON_CA_FILE", global = true, value_name = "FILE")]
    pub(crate) ca_file: Option<PathBuf>,
    /// This producer's certificate (`NAME.crt`).
    #[arg(long, env = "BATON_CERT_FILE", global = true, value_name = "FILE")]
    pub(crate) cert_file: Option<PathBuf>,
    /// This producer's private key (`NAME.key`).
    #[arg(long, env = "BATON_KEY_FILE", global = true, value_name = "FILE")]
    pub(crate) key_file: Option<PathBuf>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Submit a message; sending the same key and content again answers with the same message.
    Send(Box<SendArgs>),
    /// Show a message with each delivery's state and attempts.
    Get {
        /// Which message.
        #[command(flatten)]
        which: Which,
        /// Wait up to this long (at most 30s) for a delivery to end first ("10s").
        #[arg(long, value_parser = duration("--wait"), value_name = "DURATION")]
        wait: Option<Duration>,
    },
    /// Wait until every delivery of a message has ended; the exit status says how.
    Wait {
        /// Which message.
        #[command(flatten)]
        which: Which,
        /// Give up after this long ("2m"); exit status 8.
        #[arg(long, value_parser = duration("--timeout"), value_name = "DURATION")]
        timeout: Duration,
    },
    /// Follow a message's events as they happen: its deliveries' state changes, its running
    /// turns' progress, their outcomes; ends when every delivery has ended (the exit status
    /// says how, as `wait`'s). After a disconnect it reads on from the last event printed.
    Watch {
        /// The message id.
        id: String,
        /// Start after this event (a `cursor` an earlier `watch --json` printed); default: the
        /// message's first event.
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
        /// Give up after this long ("10m"); exit status 8.
        #[arg(long, value_parser = duration("--timeout"), value_name = "DURATION")]
        timeout: Option<Duration>,
    },
    /// Follow this producer's messages' events in a conversation (its publish scope must cover
    /// it) from a cursor, until interrupted; the last line on stderr says where to read on.
    Follow {
        /// The conversation.
        #[arg(long)]
        conversation: String,
        /// Start after this event (a `cursor` an earlier `--json` line carried, or the one the
        /// last run named); default: the first event kept.
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
        /// Stop after this long ("1m").
        #[arg(long = "for", value_parser = duration("--for"), value_name = "DURATION")]
        for_: Option<Duration>,
        /// Print what is there now (one answer, without waiting) and stop.
        #[arg(long)]
        once: bool,
    },
    /// List this producer's own messages in a conversation, oldest first, a page at a time.
    ///
    /// Prints the page and the cursor to continue from (`--after`); with `--json`, the API's
    /// page (`messages`, `next_cursor`, `more`). Without `--after` it starts at the oldest
    /// message the hub keeps. A cursor past which the hub removed messages (retention, a purge)
    /// is refused as expired: list again without it.
    List {
        /// The conversation.
        #[arg(long)]
        conversation: String,
        /// Continue after this cursor (a `next` of an earlier listing).
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
        /// At most this many messages (the hub caps it at its limits.message_page_max).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        limit: Option<u32>,
    },
    /// Cancel every delivery of a message that has not ended.
    Cancel {
        /// The message id.
        id: String,
        /// Why (recorded, shown to operators).
        #[arg(long, default_value = "cancelled by the producer")]
        reason: String,
    },
    /// The producer's durable outbox (`--spool DIR`): deliver what waits, show it, or settle a
    /// message the hub refused.
    ///
    /// `baton send --spool DIR` commits its message to `DIR/spool.db` before any hub sees it,
    /// then delivers everything waiting there; `baton spool flush` delivers on demand. Nothing
    /// runs in the background. Messages go one at a time, oldest first, each with its own
    /// idempotency key, and leave the spool only once the hub confirmed them (a duplicate
    /// answer counts). A message the hub refuses for good (a 4xx but 401, 408, 429) is kept,
    /// failed, and holds back the later messages of its own conversation only, so one
    /// conversation's messages are never accepted out of spool order: `discard` or `retry` it.
    Spool {
        /// What to do with the spool.
        #[command(subcommand)]
        command: crate::spool::SpoolCommand,
    },
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Write a man page for every command into a directory.
    Man {
        /// The directory (created if missing).
        #[arg(long)]
        out: PathBuf,
    },
}

/// `baton send`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("payload_source").required(true).args(["payload", "payload_file", "stdin"]))]
pub(crate) struct SendArgs {
    /// The conversation.
    #[arg(long)]
    pub(crate) conversation: String,
    /// A recipient host (repeat, or separate with commas); none: the conversation's members.
    #[arg(long, value_delimiter = ',', value_name = "HOST")]
    pub(crate) to: Vec<String>,
    /// A recipient pool (repeat, or separate with commas): one delivery any member host of the
    /// pool may claim. With `--to` or `--pool`, the message goes to those only.
    #[arg(long = "pool", value_delimiter = ',', value_name = "POOL")]
    pub(crate) pools: Vec<String>,
    /// The idempotency key: the same key and content is one message, however often sent.
    /// (`--key`, its first spelling, still works, unlisted: it sat beside `--key-file`, the
    /// TLS key.)
    #[arg(long = "idempotency-key", alias = "key", value_name = "KEY")]
    pub(crate) key: String,
    /// The payload, JSON text, kept exactly as written.
    #[arg(long, value_name = "JSON")]
    pub(crate) payload: Option<String>,
    /// Read the payload from this file.
    #[arg(long, value_name = "FILE")]
    pub(crate) payload_file: Option<PathBuf>,
    /// `-`: read the payload from standard input.
    #[arg(value_name = "-", value_parser = clap::builder::PossibleValuesParser::new(["-"]))]
    pub(crate) stdin: Option<String>,
    /// Runs each delivery may get when the harness asks for a retry (exit 75).
    #[arg(long, value_name = "N")]
    pub(crate) max_attempts: Option<u32>,
    /// The first retry's backoff ("30s"); later ones double it.
    #[arg(long, value_parser = duration("--retry-backoff"), value_name = "DURATION")]
    pub(crate) retry_backoff: Option<Duration>,
    /// Sending through the spool.
    #[command(flatten)]
    pub(crate) spool: crate::spool::SpoolSend,
    /// `required`: the message waits held until an operator (or a producer allowed to approve
    /// in the conversation) approves or rejects it; `none` (the default): it does not.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(["none", "required"]), value_name = "none|required")]
    pub(crate) approval: Option<String>,
    /// With `--approval required`: how long it may wait undecided ("1h") before the hub fails it.
    #[arg(long, value_parser = duration("--approval-timeout"), value_name = "DURATION", requires = "approval")]
    pub(crate) approval_timeout: Option<Duration>,
    /// The longest each turn may run ("10m"): past it (or past the node's own exec_timeout,
    /// if shorter) its process group is stopped and the turn fails, naming the deadline.
    #[arg(long, value_parser = duration("--deadline"), value_name = "DURATION")]
    pub(crate) deadline: Option<Duration>,
    /// The longest a running turn may go without a progress event ("2m"): past it the turn
    /// is stopped and fails, naming the stall, and is run again while --max-attempts allows.
    #[arg(long, value_parser = duration("--stall"), value_name = "DURATION")]
    pub(crate) stall: Option<Duration>,
}

/// A message by id or by idempotency key.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct Which {
    /// The message id.
    pub(crate) id: Option<String>,
    /// The idempotency key it was sent with (`--key` still works, unlisted).
    #[arg(long = "idempotency-key", alias = "key", value_name = "KEY")]
    pub(crate) key: Option<String>,
}

/// A value parser for a human duration, naming the flag in its error.
pub(crate) fn duration(
    flag: &'static str,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |s| baton_shared::duration::parse(flag, s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn exactly_one_payload_source_is_taken() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(["baton", "send", "--conversation", "c", "--key", "k"].iter().chain(args))
        };
        assert!(parse(&["--payload", "{}"]).is_ok());
        assert!(parse(&["-"]).is_ok());
        assert!(parse(&[]).is_err());
        assert!(parse(&["--payload", "{}", "-"]).is_err());
        assert!(parse(&["x"]).is_err());
        let cli = parse(&["--to", "a,b", "--to", "c", "--payload", "1"]).unwrap();
        let Command::Send(send) = cli.command else { panic!("not send") };
        assert_eq!(send.to, ["a", "b", "c"]);
        let cli = parse(&["--pool", "gpu", "--pool", "cpu,arm", "--payload", "1"]).unwrap();
        let Command::Send(send) = cli.command else { panic!("not send") };
        assert_eq!(send.pools, ["gpu", "cpu", "arm"]);
    }

    #[test]
    fn the_idempotency_key_is_spelled_out_and_the_old_flag_still_works() {
        for flag in ["--idempotency-key", "--key"] {
            let cli =
                Cli::try_parse_from(["baton", "send", "--conversation", "c", flag, "k1", "--payload", "{}"]).unwrap();
            let Command::Send(send) = cli.command else { panic!("not send") };
            assert_eq!(send.key, "k1", "{flag}");
            assert!(Cli::try_parse_from(["baton", "get", flag, "k1"]).is_ok(), "{flag}");
        }
        let mut cmd = Cli::command();
        let help = cmd.find_subcommand_mut("send").unwrap().render_long_help().to_string();
        assert!(help.contains("--idempotency-key") && !help.contains("--key <"), "{help}");
    }

    #[test]
    fn a_message_is_named_by_id_or_key_not_both() {
        assert!(Cli::try_parse_from(["baton", "get", "ID"]).is_ok());
        assert!(Cli::try_parse_from(["baton", "get", "--key", "k", "--wait", "5s"]).is_ok());
        assert!(Cli::try_parse_from(["baton", "get", "ID", "--key", "k"]).is_err());
        assert!(Cli::try_parse_from(["baton", "wait", "ID"]).is_err(), "--timeout is required");
        let e = Cli::try_parse_from(["baton", "wait", "ID", "--timeout", "soon"]).unwrap_err().to_string();
        assert!(e.contains("--timeout"), "{e}");
    }
}
