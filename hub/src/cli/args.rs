//! The command line, defined once: every command, flag and help text (clap derive; doc
//! comments are the help). Nothing here does work; `cli::run` dispatches the parsed `Cli`.
//!
//! Why one file over 700 lines: it is the whole command line in one place, read top to bottom
//! as `--help` is; the argument structs that other files own (`turns`, `confirm`) are the start
//! of splitting it by command, which goes with the CLI's import circle.

use crate::config::Flags;
use crate::datadir::{DATA_DIR_DEFAULT, DATA_DIR_ENV};
use baton_shared::exit;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// The Baton hub: delivery record, mTLS API and operator commands.
#[derive(Debug, Parser)]
#[command(name = "baton-hub", version, about, after_help = exit::HELP)]
pub struct Cli {
    /// The hub's data directory.
    #[arg(long, global = true, env = DATA_DIR_ENV, default_value = DATA_DIR_DEFAULT)]
    pub data_dir: PathBuf,
    /// Operator name recorded with changes.
    #[arg(long, global = true, env = "BATON_OPERATOR")]
    pub operator: Option<String>,
    /// Where the record is (the `database_url` key; read with the configuration's layers, so
    /// this flag beats `BATON_HUB_DATABASE_URL`, which beats `hub.toml`).
    #[arg(long, global = true, value_name = "URL", help = crate::config::DATABASE_URL.flag_help())]
    pub database_url: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Operator commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the data directory, the database, the CA and the hub's server certificate. With a
    /// `database_url` (`--database-url`, or BATON_HUB_DATABASE_URL) the record is that
    /// PostgreSQL database, migrated here, and no SQLite file is made; the URL is written into
    /// `hub.toml` (mode 0600, as it may hold a password).
    Init {
        /// Extra DNS names or IP addresses nodes dial (localhost, 127.0.0.1 and ::1 are always included).
        #[arg(long = "hostname", value_name = "NAME")]
        hostnames: Vec<String>,
        /// Take the CA from an existing hub's data directory (its `ca.crt` and `ca.key`) instead
        /// of making a new one: a second hub joining the same PostgreSQL record must use the CA
        /// its node and producer certificates were issued under. This hub's server certificate
        /// is its own. Without it, a PostgreSQL record already in use (hosts enrolled or
        /// messages sent) is refused. The record does not store which CA issued its
        /// certificates: every hub on it must be given the same one.
        #[arg(long, value_name = "DIR")]
        ca_from: Option<PathBuf>,
    },
    /// Run the hub. Every configuration key is also a flag here (and an environment variable
    /// everywhere): a flag beats the environment, which beats the file.
    Serve {
        /// Configuration file (default DIR/hub.toml when it exists).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The configuration keys, one flag each.
        #[command(flatten)]
        settings: Flags,
    },
    /// Issue a certificate for a node host or a producer.
    #[command(subcommand)]
    Enroll(Enroll),
    /// Revoke every certificate of a name (or one serial). Takes effect on the next request.
    /// Destructive: names the certificates (serial, role) first, and needs --yes (or a "y" at
    /// a terminal); --dry-run only names them.
    Revoke {
        /// Host or producer name, or a certificate serial.
        name: String,
        /// Why (recorded).
        #[command(flatten)]
        why: RequiredReason,
        /// --dry-run, --yes.
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Issue a fresh certificate for an enrolled name, or (`--server`) replace the hub's own
    /// server certificate.
    #[command(group = clap::ArgGroup::new("what").required(true).args(["name", "server"]))]
    Renew {
        /// Host or producer name.
        name: Option<String>,
        /// Replace the hub's server certificate instead: a new key and serial under the current
        /// CA, with the names of the one it replaces, which is kept aside as
        /// `hub.crt.replaced-<UTC time>` (and its key likewise). A running hub serves it to new
        /// connections at once (open ones keep theirs); `kill -HUP` the hub to reload by hand.
        #[arg(long, conflicts_with_all = ["out", "revoke_old", "force"])]
        server: bool,
        /// Where to write NAME.crt, NAME.key and ca.crt.
        #[arg(long, required_unless_present = "server")]
        out: Option<PathBuf>,
        /// Validity in days [default: 365; with --server 730].
        #[arg(long)]
        days: Option<u32>,
        /// Revoke the name's older certificates in the same step (without it, both stay valid
        /// until the old one is revoked or expires, so a node can switch over first).
        #[arg(long)]
        revoke_old: bool,
        /// Renew a name whose every certificate was revoked (`revoke NAME`); without it that is
        /// refused (exit 2), naming the revocation, since the new certificate would be valid.
        #[arg(long)]
        force: bool,
        /// Why; recorded in the audit log with the operator's name (default: "renewed", or
        /// "renewed; old certificate revoked" with --revoke-old).
        #[arg(long, conflicts_with = "server")]
        reason: Option<String>,
    },
    /// Retire a host: no more work; its pending deliveries fail (mirrored ones become unknown)
    /// and it leaves every conversation it is a member of. Destructive: says how many
    /// deliveries fail or become unknown and which conversations it leaves first, and needs
    /// --yes (or a "y" at a terminal); --dry-run only says it.
    Retire {
        /// The host.
        host: String,
        /// Why (recorded).
        #[command(flatten)]
        why: RequiredReason,
        /// --dry-run, --yes.
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Requeue what a node instance that is gone for good holds.
    Requeue {
        /// The instance id (see `hosts list`).
        #[arg(long)]
        instance: String,
        /// The host whose instance it is. Instance ids are scoped per host: without `--host`
        /// the id must be in use on exactly one host, otherwise the command names the hosts and
        /// does nothing.
        #[arg(long)]
        host: Option<String>,
        /// Why (recorded).
        #[command(flatten)]
        why: Reason,
    },
    /// Conversation membership: which hosts a post without `--to` reaches.
    #[command(subcommand)]
    Members(MembersCmd),
    /// Pools: named sets of hosts, any member of which may claim a delivery addressed to the
    /// pool (kept by operators only; every change audited).
    #[command(subcommand)]
    Pools(PoolsCmd),
    /// Producers and their publish scopes.
    #[command(subcommand)]
    Producers(ProducersCmd),
    /// Fences: pause, hold or block a conversation, a host, or everything.
    #[command(subcommand)]
    Fence(FenceCmd),
    /// The held queue.
    #[command(subcommand)]
    Held(HeldCmd),
    /// Inspect, cancel and re-run deliveries.
    #[command(subcommand)]
    Deliveries(DeliveriesCmd),
    /// Re-run many final deliveries (failed, unknown or cancelled) as redrives, in bounded
    /// batches; idempotent by --request-id. Without a filter (--conversation, --host, --since,
    /// --limit) it re-runs every delivery of the outcome, so it says how many first and needs
    /// --reason and --yes (or a "y" at a terminal).
    Redrive(RedriveArgs),
    /// Submit a message by hand.
    Send {
        /// The conversation.
        #[arg(long)]
        conversation: String,
        /// Recipient hosts, comma-separated (default: the conversation's current members).
        #[arg(long, value_delimiter = ',')]
        to: Vec<String>,
        /// Idempotency key.
        #[arg(long)]
        key: String,
        /// The payload as JSON text.
        #[arg(long, conflicts_with = "payload_file")]
        payload: Option<String>,
        /// A file holding the payload JSON.
        #[arg(long)]
        payload_file: Option<PathBuf>,
        /// Producer name the message is recorded under (keys are scoped to it). The default,
        /// `operator`, is reserved: no certificate may hold it, so no producer can read or
        /// pre-empt these messages.
        #[arg(long, default_value = baton_shared::pki::CLI_SENDER)]
        producer: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Why (recorded in the audit log with the message it accepted).
        #[command(flatten)]
        why: Reason,
    },
    /// Overview of the record, and what needs attention: the hub not running, every active
    /// fence on a host or on everything, held deliveries, deliveries that ended `unknown` since
    /// `--since`, a CA rotation not finished, hosts silent longer than `host_silence_warn`,
    /// hosts with work waiting and no node serving them for as long, certificates expiring
    /// within 30 days. Exits 0 when the hub runs and nothing needs
    /// attention, 1 otherwise (like `systemctl is-active`).
    Status {
        /// How far back an `unknown` outcome needs attention: a time (UTC, "2026-05-01
        /// 12:00:00" or RFC 3339) or this long ago ("24h", the default).
        #[arg(long, value_name = "TIME", default_value = "24h")]
        since: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a consistent copy of the database while the hub runs. SQLite only: a record in
    /// PostgreSQL (`database_url`) is refused (exit 2); back it up with PostgreSQL's own tools
    /// (`pg_dump`, or a base backup with WAL archiving).
    Backup {
        /// The copy's path (must not exist).
        #[arg(long)]
        out: PathBuf,
    },
    /// Check the record's invariants offline; lists every problem found. On PostgreSQL every
    /// invariant is checked but the file's integrity check (the server checks its own pages).
    Verify {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Validate a configuration file and exit.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: baton_shared::manuals::Shell,
    },
    /// Write a man page for every command into a directory.
    Man {
        /// The directory (created if missing).
        #[arg(long)]
        out: PathBuf,
    },

    // The operator's view of the fleet, its identities and its history.
    /// The fleet: every host with its instance, node session, last contact and holdings.
    #[command(subcommand)]
    Hosts(HostsCmd),
    /// Certificates: name, role, serial, not-after, revoked.
    #[command(subcommand)]
    Certs(CertsCmd),
    /// Rotate the hub's CA with an overlap in which the old and the new CA are both trusted
    /// (README: "Rotating the CA").
    #[command(subcommand)]
    Ca(CaCmd),
    /// What operators and the hub did, newest first: enrollments, messages sent by hand,
    /// revocations, renewals, retirements, requeues, fences set, lifted and expired, releases,
    /// cancels, membership (families included), mention, scope and quota changes, with actor and
    /// reason. Exit 1 when nothing matches.
    Audit {
        /// Only what happened at or after this time (UTC, "2026-05-01 12:00:00" or RFC 3339) or
        /// this long ago ("24h").
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Only what this operator (or `hub`) did.
        #[arg(long)]
        actor: Option<String>,
        /// At most this many entries (a page).
        #[arg(long, default_value_t = 1000)]
        limit: u32,
        /// The next page: the cursor printed after the previous one.
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    // Restore and purge.
    /// Replace the hub database with a backup, with the hub stopped (refused while one serves
    /// this data directory). The backup is verified (integrity and every invariant, as `verify`)
    /// before anything is replaced; the replaced database is kept aside, next to it, under a
    /// name printed at the end. The record goes back to the backup's moment: messages accepted
    /// after it are forgotten with their idempotency keys (a producer's retry of such a key is a
    /// new message) and work handed out after it may be handed out, and run, again. SQLite
    /// only: a record in PostgreSQL (`database_url`) is refused (exit 2); restore it with
    /// PostgreSQL's own tools (`pg_restore`, or point-in-time recovery), then run `verify`.
    Restore {
        /// The backup file (`baton-hub backup --out FILE`).
        #[arg(long, value_name = "BACKUP")]
        from: PathBuf,
    },
    /// Move this hub's whole record to another backend, with no hub serving this data
    /// directory: from its SQLite file to an empty PostgreSQL database (`--to postgres://...`),
    /// or from its PostgreSQL database (`database_url`) to a new SQLite file (`--to PATH`). The
    /// copy is one transaction into an empty record; then both records are compared row by row
    /// and both verified. The source is left unchanged; the command prints the one setting to
    /// change to serve from the target.
    Migrate {
        /// The target: `postgres://...` (with `sslmode`/`sslrootcert` as for `database_url`),
        /// or the path of a new SQLite file.
        #[arg(long, value_name = "TARGET")]
        to: String,
    },
    /// Remove settled messages now, before their retention window ends: one message, or every
    /// message of a conversation, with their deliveries, events and attempts. Never an
    /// unsettled delivery: when any delivery of the target is not final (waiting, held, in
    /// flight, delivered without an outcome), nothing is removed and they are named (exit 2).
    /// With `--host H`: the settled deliveries to that host go (with their events, attempts and
    /// routing), and the messages no other host received; its unsettled ones are kept and
    /// counted. Recorded in the audit log with the operator and the reason. Exit 1 when there
    /// is nothing to purge. Destructive: says what it removes first, and needs --yes (or a "y"
    /// at a terminal).
    Purge {
        /// One message, by id.
        #[arg(
            long,
            value_name = "ID",
            conflicts_with_all = ["conversation", "host"],
            required_unless_present_any = ["conversation", "host"]
        )]
        message: Option<String>,
        /// Every message of this conversation.
        #[arg(long, value_name = "C", conflicts_with = "host")]
        conversation: Option<String>,
        /// The settled deliveries to this recipient host, and the messages it alone received.
        /// Its unsettled deliveries are kept (and counted), not waited for: a later purge takes
        /// them once settled.
        #[arg(long, value_name = "H")]
        host: Option<String>,
        /// --dry-run (say what would be removed, remove nothing), --yes.
        #[command(flatten)]
        confirm: Confirm,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
    },
}

/// `certs` subcommands.
#[derive(Debug, Subcommand)]
pub enum CertsCmd {
    /// Every certificate (or one name's): name, role, serial, not-after, revoked.
    List {
        /// Only this host or producer.
        #[arg(long)]
        name: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `ca` subcommands.
#[derive(Debug, Subcommand)]
pub enum CaCmd {
    /// Start a rotation: a new CA key and certificate; `ca.crt` becomes the new and the old CA
    /// (both trusted by the hub at once), and `enroll`, `renew` and `renew --server` issue under
    /// the new CA from now on. The old key and file are kept aside. Refused while a rotation is
    /// under way (`ca.crt` holds two CAs).
    Rotate,
    /// End a rotation: `ca.crt` keeps only the issuing CA; connections and certificates of the
    /// old CA are refused from then on, requests in progress (long polls) included. Refused
    /// while the hub's server certificate is still the old CA's (run `renew --server` first);
    /// refused (exit 2) while a node or producer holds an unexpired, unrevoked certificate of
    /// the old CA and none of the issuing CA, naming each, unless --force; exit 1 when there
    /// is no old CA. Destructive: says what it retires and who is cut off first, and needs
    /// --yes (or a "y" at a terminal); with --dry-run the exit status is the one the command
    /// would have.
    RetireOld {
        /// Retire it even though the nodes and producers named would be refused from then on.
        #[arg(long)]
        force: bool,
        /// Why (recorded).
        #[command(flatten)]
        why: RequiredReason,
        /// --dry-run, --yes.
        #[command(flatten)]
        confirm: Confirm,
    },
}

/// `hosts` subcommands.
#[derive(Debug, Subcommand)]
pub enum HostsCmd {
    /// Every host: state, bound instance, node session and version, last contact, holdings.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One host: the list's facts, its certificates (serial, not-after, revoked) and its
    /// recent events. Exit 1 when it was never enrolled.
    Show {
        /// The host.
        host: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop handing the host new work (a pause fence on it, kept until `hosts undrain`), then
    /// wait, printing progress, until it holds nothing: no delivery claimed, mirrored, or
    /// delivered without its outcome. What is queued for it stays queued. Exit 0 once drained;
    /// exit 4 when `--deadline` passes first, naming what it still holds (the fence stays).
    Drain {
        /// The host.
        host: String,
        /// Give up waiting after this long ("10m"); without it, wait until drained.
        #[arg(long, value_name = "DURATION")]
        deadline: Option<String>,
        /// Why (recorded with the fence).
        #[arg(long)]
        reason: String,
    },
    /// Hand the host work again: lift every pause fence on it (`hosts drain`'s, or one set with
    /// `fence pause --host`). Exit 1 when none is active.
    Undrain {
        /// The host.
        host: String,
        /// Why (recorded).
        #[command(flatten)]
        why: Reason,
    },
}

/// `enroll` subcommands.
#[derive(Debug, Subcommand)]
pub enum Enroll {
    /// A node host: writes DIR/HOST.crt, DIR/HOST.key, DIR/ca.crt.
    Node(EnrollArgs),
    /// A producer: writes DIR/NAME.crt, DIR/NAME.key, DIR/ca.crt.
    Producer(EnrollProducerArgs),
}

/// Arguments of `enroll producer`.
#[derive(Debug, Args)]
pub struct EnrollProducerArgs {
    /// Name, output directory and validity.
    #[command(flatten)]
    pub common: EnrollArgs,
    /// The conversations it may post into: exact names, or a prefix ending in `*` (`*` alone is
    /// every conversation). Without it, a new producer may post anywhere and an enrolled one
    /// keeps its scope.
    #[arg(long, num_args = 1.., value_name = "PATTERN")]
    pub conversations: Option<Vec<String>>,
    /// The producer's quota settings.
    #[command(flatten)]
    pub quota: QuotaArgs,
}

/// A producer's quota on the command line: each limit a number or `unlimited`; a limit not
/// given is left as it is (unlimited for a new producer, `QUOTA_DEFAULT`).
#[derive(Debug, Args)]
pub struct QuotaArgs {
    /// Most messages it may have unsettled (not every delivery final) at once; over it a post
    /// is refused 429 `quota_unsettled_messages` (1..=100000, or `unlimited`).
    #[arg(long, value_name = "N|unlimited")]
    pub max_unsettled: Option<String>,
    /// Most payload bytes its unsettled messages may hold together; over it a post is refused
    /// 429 `quota_unsettled_bytes` (1..=1073741824, or `unlimited`).
    #[arg(long, value_name = "BYTES|unlimited")]
    pub max_unsettled_bytes: Option<String>,
}

/// Arguments of `members add|remove|allow-mention|disallow-mention`.
#[derive(Debug, Args)]
pub struct MembersChange {
    /// The conversation. For `add` and `remove` also a family: a name prefix ending in `*`
    /// (`support-*`; `*` alone is every conversation), which makes the hosts members of every
    /// conversation it covers, those first posted to later included, each from its next post
    /// on; `remove` of the same pattern ends it for all of them.
    #[arg(long)]
    pub conversation: String,
    /// The hosts.
    #[arg(value_name = "HOST", required_unless_present = "pools")]
    pub hosts: Vec<String>,
    /// A pool (repeatable; `add` and `remove` only): a post without `to` or `pools` reaches one
    /// host of each member pool.
    #[arg(long = "pool", value_name = "NAME")]
    pub pools: Vec<String>,
    /// Why (recorded).
    #[command(flatten)]
    pub why: Reason,
}

/// `members` subcommands.
#[derive(Debug, Subcommand)]
pub enum MembersCmd {
    /// Make hosts members from the conversation's next post on (exit 1 when all already were).
    Add(MembersChange),
    /// End hosts' membership after the conversation's last post (exit 1 when none was a member).
    Remove(MembersChange),
    /// Let `to` name hosts that are not members, from the conversation's next post on (once a
    /// conversation has members, naming a non-member is refused otherwise). Audited; the claim
    /// still re-checks the host (certificate, retirement) and counts this as its authorization
    /// for the posts it holds. Exit 1 when all already were allowed.
    AllowMention(MembersChange),
    /// End hosts' mention authorization after the conversation's last post: posts up to it keep
    /// it (exit 1 when none had one).
    DisallowMention(MembersChange),
    /// Every member with its intervals: join and leave `seq`, when, who, why; and every mention
    /// authorization with its cursors, who and why.
    List {
        /// Only this conversation.
        #[arg(long)]
        conversation: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Arguments of `pools add|remove`.
#[derive(Debug, Args)]
pub struct PoolChange {
    /// The pool (made by its first `add`).
    #[arg(long)]
    pub pool: String,
    /// The hosts.
    #[arg(required = true, value_name = "HOST")]
    pub hosts: Vec<String>,
    /// Why (recorded).
    #[command(flatten)]
    pub why: Reason,
}

/// `pools` subcommands.
#[derive(Debug, Subcommand)]
pub enum PoolsCmd {
    /// Make hosts members of a pool, making the pool if it is new: from their next claim on
    /// they take its work (exit 1 when all already were members).
    Add(PoolChange),
    /// Remove hosts from a pool: from their next claim on they take none of its work; what
    /// they already claimed stays theirs (exit 1 when none was a member).
    Remove(PoolChange),
    /// Every pool: members, queued, oldest queued age, in flight, bound conversations.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One pool: members, queued, oldest queued age, in flight, bound conversations.
    Show {
        /// The pool.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `producers` subcommands.
#[derive(Debug, Subcommand)]
pub enum ProducersCmd {
    /// Replace a producer's publish scope; takes effect on its next post.
    Scope {
        /// The producer.
        name: String,
        /// Exact conversation names, or prefixes ending in `*` (`*` alone is every conversation).
        #[arg(required = true, value_name = "PATTERN")]
        patterns: Vec<String>,
        /// Why (recorded).
        #[command(flatten)]
        why: Reason,
    },
    /// Change a producer's quota (the limits given; the others stay); takes effect on its
    /// next post. Messages already accepted are never refused after the fact.
    Quota {
        /// The producer.
        name: String,
        /// The limits.
        #[command(flatten)]
        quota: QuotaArgs,
        /// Why (recorded).
        #[command(flatten)]
        why: Reason,
    },
    /// Replace the conversations a producer may approve or reject messages in (`POST
    /// /v1/messages/{id}/approve` and `/reject`); `--none` takes the right away. A producer
    /// has none until an operator grants it here.
    Approve {
        /// The producer.
        name: String,
        /// Exact conversation names, or prefixes ending in `*` (`*` alone is every conversation).
        #[arg(value_name = "PATTERN", required_unless_present = "none", conflicts_with = "none")]
        patterns: Vec<String>,
        /// No right to approve anywhere.
        #[arg(long)]
        none: bool,
        /// Why (recorded).
        #[command(flatten)]
        why: Reason,
    },
    /// Every enrolled producer with its publish scope, its quota and what it has unsettled.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Arguments of `enroll`.
#[derive(Debug, Args)]
pub struct EnrollArgs {
    /// Host or producer name.
    pub name: String,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Validity in days.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
    /// Why (recorded in the audit log with the enrollment).
    #[command(flatten)]
    pub why: Reason,
}

/// `--reason`, recorded with changes.
#[derive(Debug, Args)]
pub struct Reason {
    /// Why; recorded with the operator's name.
    #[arg(long, default_value = REASON_DEFAULT)]
    pub reason: String,
}

/// What a change that is not destructive records when no `--reason` is given.
pub const REASON_DEFAULT: &str = "no reason given";

/// `--reason` of a destructive command (`retire`, `revoke`): required, since the audit log is
/// where an operator looks for why work was failed or a name cut off.
#[derive(Debug, Args)]
pub struct RequiredReason {
    /// Why; recorded with the operator's name. Required.
    #[arg(long)]
    pub reason: String,
}

impl RequiredReason {
    /// The reason, or a usage error (exit 2) for one that is only whitespace, which says no
    /// more than none.
    pub fn checked(&self, what: &str) -> Result<&str, super::CliError> {
        if self.reason.trim().is_empty() {
            return Err(super::CliError::usage(format!("{what} needs a --reason that says why; nothing changed")));
        }
        Ok(&self.reason)
    }
}

/// `--reason` of a command that is destructive in some of its forms only (`fence block --all`
/// or `--host`, `redrive` without a filter): required there, checked when the command runs;
/// elsewhere it defaults to "no reason given".
#[derive(Debug, Args)]
pub struct ReasonIfDestructive {
    /// Why; recorded with the operator's name (required for `fence block --all|--host` and
    /// for `redrive` without a filter; otherwise "no reason given").
    #[arg(long)]
    pub reason: Option<String>,
}

impl ReasonIfDestructive {
    /// The reason to record: the one given, or the default.
    pub fn text(&self) -> &str {
        self.reason.as_deref().unwrap_or(REASON_DEFAULT)
    }

    /// The reason given, or a usage error (exit 2) saying that `what` needs one.
    pub fn required(&self, what: &str) -> Result<&str, super::CliError> {
        match self.reason.as_deref() {
            Some(r) if !r.trim().is_empty() => Ok(r),
            _ => Err(super::CliError::usage(format!(
                "{what} needs --reason TEXT: it is destructive, and the audit log records why; nothing changed"
            ))),
        }
    }
}

/// `--dry-run` and `--yes`, which every destructive command takes (SPEC §9); `confirm::decide`
/// acts on them.
#[derive(Debug, Args, Clone, Copy)]
pub struct Confirm {
    /// Say what it would do, change nothing (exit 0).
    #[arg(long, conflicts_with = "yes")]
    pub dry_run: bool,
    /// Do it without asking. Without it, a terminal is asked "Proceed? [y/N]"; anything else
    /// is refused (exit 2), saying what it would have done.
    #[arg(long)]
    pub yes: bool,
}

/// `fence` subcommands.
#[derive(Debug, Subcommand)]
pub enum FenceCmd {
    /// Matching deliveries stay queued until the fence lifts. Refused (exit 2) for a host never
    /// enrolled or a conversation with no messages unless --force; refused (exit 1) when the
    /// same fence is already active.
    Pause(FenceSet),
    /// Matching deliveries park in the held queue until released.
    Hold(FenceSet),
    /// Matching deliveries are refused: failed, naming the fence. On --all or --host it is
    /// destructive: it says how many queued deliveries would fail (and how many of them are
    /// paused now) first, and needs --reason and --yes (or a "y" at a terminal); --dry-run only
    /// says it.
    Block(FenceBlock),
    /// Lift a fence.
    Lift {
        /// The fence id.
        id: i64,
        /// Why (recorded).
        #[command(flatten)]
        why: Reason,
    },
    /// List active fences.
    List {
        /// Include lifted fences.
        #[arg(long)]
        all: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// What a new fence covers.
#[derive(Debug, Args)]
#[group(required = true, multiple = false, id = "scope")]
pub struct FenceTarget {
    /// One conversation.
    #[arg(long, group = "scope")]
    pub conversation: Option<String>,
    /// One host.
    #[arg(long, group = "scope")]
    pub host: Option<String>,
    /// One pool: its deliveries, whichever member would claim them.
    #[arg(long, group = "scope")]
    pub pool: Option<String>,
    /// Everything.
    #[arg(long, group = "scope")]
    pub all: bool,
}

/// Arguments of `fence pause|hold|block`.
#[derive(Debug, Args)]
pub struct FenceSet {
    /// What the fence covers.
    #[command(flatten)]
    pub target: FenceTarget,
    /// Why (recorded).
    #[command(flatten)]
    pub why: ReasonIfDestructive,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Set it even for a host never enrolled or a conversation with no messages yet.
    #[arg(long)]
    pub force: bool,
    /// The hub lifts it after this long ("30m", "2h").
    #[arg(long = "for", value_name = "DURATION", conflicts_with = "until")]
    pub for_duration: Option<String>,
    /// The hub lifts it at this time (UTC, "2026-05-01 12:00:00" or RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
}

/// Arguments of `fence block`: a fence's, and `--dry-run`/`--yes` for a block on everything or
/// on a host.
#[derive(Debug, Args)]
pub struct FenceBlock {
    /// The fence.
    #[command(flatten)]
    pub set: FenceSet,
    /// --dry-run (any scope), --yes (needed with --all or --host).
    #[command(flatten)]
    pub confirm: Confirm,
}

/// `held` subcommands.
#[derive(Debug, Subcommand)]
pub enum HeldCmd {
    /// List held deliveries, oldest first, a page at a time (the next page's cursor is printed
    /// on stderr when more remain).
    List {
        /// Only this conversation.
        #[arg(long)]
        conversation: Option<String>,
        /// At most this many (a page).
        #[arg(long, default_value_t = 1000)]
        limit: u32,
        /// The next page: the cursor printed after the previous one (in JSON, the last row's
        /// `cursor`).
        #[arg(long, value_name = "CURSOR")]
        after: Option<i64>,
        /// Show delivery ids whole (a table shows the shortest unique prefix, at least 8
        /// characters, which every command taking an id accepts).
        #[arg(long)]
        wide: bool,
        /// Print JSON (ids whole; each row with its `cursor`).
        #[arg(long)]
        json: bool,
    },
    /// Release one held delivery, or all of a conversation, back to queued. Refused (exit 2,
    /// naming the fence) while an active hold or block would catch it again, unless --force;
    /// exit 1 when nothing was held.
    Release {
        /// The delivery id, or a unique prefix of it.
        #[arg(required_unless_present = "conversation", conflicts_with = "conversation")]
        id: Option<String>,
        /// Release every held delivery of this conversation.
        #[arg(long)]
        conversation: Option<String>,
        /// Release even when an active hold or block fence would catch it again at once.
        #[arg(long)]
        force: bool,
        /// Why (recorded).
        #[command(flatten)]
        why: Reason,
    },
    /// Approve a message held awaiting approval: every delivery of it goes back to queued
    /// (where a fence may still catch it at the claim, like any other). The decision is the
    /// message's. Exit 2 when it needs no approval or was already decided.
    Approve(Decide),
    /// Reject a message held awaiting approval: every delivery of it fails with the reason.
    /// Exit 2 when it needs no approval or was already decided.
    Reject(Decide),
}

/// Arguments of `held approve|reject`.
#[derive(Debug, Args)]
pub struct Decide {
    /// A delivery id (or a unique prefix of it, as `held release` takes) or a message id: the
    /// message it names is decided, every one of its deliveries with it.
    pub id: String,
    /// Why (recorded).
    #[command(flatten)]
    pub why: Reason,
}

/// `deliveries` subcommands.
#[derive(Debug, Subcommand)]
pub enum DeliveriesCmd {
    /// List deliveries, newest first on a terminal (oldest first otherwise, or with --oldest),
    /// a page at a time: when more remain, the cursor of the next page is printed on stderr
    /// (`next page: --after N`).
    List {
        /// Only this state (queued, claimed, mirrored, delivered, held, failed, unknown).
        #[arg(long)]
        state: Option<String>,
        /// Only deliveries with this outcome (succeeded, failed, unknown, cancelled): the same
        /// word the OUTCOME column shows and `redrive --outcome` selects by (README, "State and
        /// outcome").
        #[arg(long)]
        outcome: Option<String>,
        /// Only this host.
        #[arg(long)]
        host: Option<String>,
        /// Only this conversation.
        #[arg(long)]
        conversation: Option<String>,
        /// Only deliveries last changed at or after this time (UTC, "2026-05-01 12:00:00" or
        /// RFC 3339) or this long ago ("2h").
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Only deliveries last changed before this time (same forms as --since).
        #[arg(long, value_name = "TIME")]
        until: Option<String>,
        /// Newest first.
        #[arg(long, conflicts_with = "oldest")]
        newest: bool,
        /// Oldest first.
        #[arg(long)]
        oldest: bool,
        /// At most this many (a page).
        #[arg(long, default_value_t = 1000)]
        limit: u32,
        /// The next page: the cursor printed after the previous one (in JSON, the last row's
        /// `cursor`).
        #[arg(long, value_name = "CURSOR")]
        after: Option<i64>,
        /// Show delivery ids whole (a table shows the shortest unique prefix, at least 8
        /// characters, which every command taking an id accepts).
        #[arg(long)]
        wide: bool,
        /// Only the turns running now (delivered, started on their node, no report yet), longest
        /// running first, at most --limit, with how long each has run, when its node was last
        /// heard from (SILENT past `host_silence_warn`: it stopped renewing; nothing of it is
        /// handed to another host) and its last progress. Takes --host and --conversation.
        #[arg(long, conflicts_with_all = ["state", "outcome", "since", "until", "newest", "oldest", "after"])]
        running: bool,
        /// Print JSON (ids whole; each row with its `cursor`).
        #[arg(long)]
        json: bool,
    },
    /// One delivery with its event history and attempts.
    Show {
        /// The delivery id, or a unique prefix of it.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Why a delivery is where it is, in one screen: the fence holding it, the earlier turn of
    /// its conversation it waits behind and where that one is, its host's liveness (against
    /// `host_silence_warn`), the run in progress and for how long, the report outstanding, a
    /// retry's not-before time, a cancel asked for. `deliveries list` shows the same reason in
    /// one line for every row that is not final.
    Explain {
        /// The delivery id, or a unique prefix of it.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a delivery, or those of a conversation or host that have not ended: one not yet
    /// delivered fails at once; a delivered one is stopped by its node.
    Cancel(CancelArgs),
    /// Re-run one final delivery (failed, unknown or cancelled) as a new run (a redrive).
    Retry(RetryArgs),
}

/// `config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigCmd {
    /// Validate the configuration (default DIR/hub.toml, with the environment's BATON_HUB_* keys
    /// and `--database-url` over it) and exit 0 (valid) or 2 (invalid); says where the record
    /// is (a PostgreSQL URL without its password).
    Check {
        /// The file.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_lists_the_shared_exit_statuses() {
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains(exit::HELP.lines().nth(1).unwrap_or_default().trim()), "{help}");
    }

    #[test]
    fn public_surface_parses() {
        for args in [
            vec!["baton-hub", "init", "--hostname", "hub.example"],
            vec!["baton-hub", "serve", "--listen", "127.0.0.1:0"],
            vec!["baton-hub", "serve", "--claim-batch-max", "5", "--config", "f"],
            vec!["baton-hub", "enroll", "node", "host-a", "--out", "d"],
            vec!["baton-hub", "enroll", "producer", "p", "--out", "d"],
            vec!["baton-hub", "enroll", "producer", "p", "--out", "d", "--conversations", "a", "b-*"],
            vec!["baton-hub", "members", "add", "--conversation", "c", "h1", "h2", "--reason", "r"],
            vec!["baton-hub", "members", "remove", "--conversation", "c", "h1"],
            vec!["baton-hub", "members", "add", "--conversation", "support-*", "h1", "--reason", "r"],
            vec!["baton-hub", "members", "allow-mention", "--conversation", "c", "h1", "--reason", "r"],
            vec!["baton-hub", "members", "disallow-mention", "--conversation", "c", "h1", "--reason", "r"],
            vec!["baton-hub", "members", "list", "--conversation", "c", "--json"],
            vec!["baton-hub", "pools", "add", "--pool", "p", "h1", "h2", "--reason", "r"],
            vec!["baton-hub", "pools", "remove", "--pool", "p", "h1"],
            vec!["baton-hub", "pools", "list", "--json"],
            vec!["baton-hub", "pools", "show", "p", "--json"],
            vec!["baton-hub", "producers", "scope", "p", "a", "b-*", "--reason", "r"],
            vec!["baton-hub", "producers", "list", "--json"],
            vec!["baton-hub", "producers", "quota", "p", "--max-unsettled", "5", "--max-unsettled-bytes", "unlimited"],
            vec!["baton-hub", "enroll", "producer", "p", "--out", "d", "--max-unsettled", "3"],
            vec!["baton-hub", "send", "--conversation", "c", "--key", "k", "--payload", "{}"],
            vec!["baton-hub", "send", "--conversation", "c", "--key", "k", "--payload", "{}", "--reason", "r"],
            vec!["baton-hub", "enroll", "node", "host-a", "--out", "d", "--reason", "new rack"],
            vec!["baton-hub", "revoke", "host-a", "--reason", "lost laptop", "--yes"],
            vec!["baton-hub", "revoke", "host-a", "--reason", "lost laptop", "--dry-run"],
            vec!["baton-hub", "renew", "host-a", "--out", "d"],
            vec!["baton-hub", "renew", "host-a", "--out", "d", "--reason", "key rotation"],
            vec!["baton-hub", "retire", "host-a", "--reason", "r", "--yes"],
            vec!["baton-hub", "fence", "pause", "--conversation", "c"],
            vec!["baton-hub", "fence", "hold", "--host", "h", "--reason", "r"],
            vec!["baton-hub", "fence", "block", "--all", "--reason", "r", "--yes"],
            vec!["baton-hub", "fence", "block", "--host", "h", "--reason", "r", "--dry-run", "--json"],
            vec!["baton-hub", "fence", "pause", "--host", "h", "--for", "30m", "--force"],
            vec!["baton-hub", "fence", "hold", "--all", "--until", "2030-01-01 00:00:00"],
            vec!["baton-hub", "held", "release", "abc", "--force"],
            vec!["baton-hub", "fence", "lift", "3"],
            vec!["baton-hub", "fence", "list", "--json"],
            vec!["baton-hub", "held", "list", "--json"],
            vec!["baton-hub", "held", "release", "abc"],
            vec!["baton-hub", "held", "release", "--conversation", "c"],
            vec![
                "baton-hub",
                "deliveries",
                "list",
                "--state",
                "queued",
                "--host",
                "h",
                "--conversation",
                "c",
                "--json",
            ],
            vec!["baton-hub", "deliveries", "show", "abc", "--json"],
            vec![
                "baton-hub",
                "deliveries",
                "list",
                "--outcome",
                "failed",
                "--since",
                "2h",
                "--oldest",
                "--limit",
                "5",
                "--after",
                "9",
            ],
            vec!["baton-hub", "send", "--conversation", "c", "--to", "a,b", "--key", "k", "--payload", "{}"],
            vec!["baton-hub", "status", "--json"],
            vec!["baton-hub", "backup", "--out", "f"],
            vec!["baton-hub", "verify"],
            vec!["baton-hub", "completions", "bash"],
            vec!["baton-hub", "completions", "zsh"],
            vec!["baton-hub", "completions", "fish"],
            vec!["baton-hub", "man", "--out", "d"],
            vec!["baton-hub", "hosts", "list", "--json"],
            vec!["baton-hub", "certs", "list", "--name", "host-a", "--json"],
            vec!["baton-hub", "renew", "host-a", "--out", "d", "--revoke-old"],
            vec!["baton-hub", "renew", "host-a", "--out", "d", "--force"],
            vec!["baton-hub", "renew", "--server"],
            vec!["baton-hub", "ca", "rotate"],
            vec!["baton-hub", "ca", "retire-old", "--reason", "r", "--yes"],
            vec!["baton-hub", "ca", "retire-old", "--reason", "r", "--dry-run", "--force"],
            vec!["baton-hub", "renew", "--server", "--days", "10"],
            vec!["baton-hub", "audit", "--since", "24h", "--actor", "alice", "--json"],
            vec!["baton-hub", "hosts", "show", "host-a", "--json"],
        ] {
            assert!(Cli::try_parse_from(&args).is_ok(), "{args:?}");
        }
        // A fence ends at one time at most.
        assert!(Cli::try_parse_from(["baton-hub", "fence", "pause", "--all", "--for", "1h", "--until", "x"]).is_err());
        // A fence needs exactly one scope.
        assert!(Cli::try_parse_from(["baton-hub", "fence", "pause"]).is_err());
        assert!(Cli::try_parse_from(["baton-hub", "fence", "pause", "--all", "--host", "h"]).is_err());
        // A membership change names its conversation and at least one host; a scope a pattern.
        assert!(Cli::try_parse_from(["baton-hub", "members", "add", "h1"]).is_err());
        assert!(Cli::try_parse_from(["baton-hub", "members", "add", "--conversation", "c"]).is_err());
        assert!(Cli::try_parse_from(["baton-hub", "producers", "scope", "p"]).is_err());
        // `renew` names a holder or `--server`, never both; a holder's renewal says where to.
        assert!(Cli::try_parse_from(["baton-hub", "renew"]).is_err());
        assert!(Cli::try_parse_from(["baton-hub", "renew", "host-a", "--server"]).is_err());
        assert!(Cli::try_parse_from(["baton-hub", "renew", "host-a"]).is_err());
        assert!(Cli::try_parse_from(["baton-hub", "renew", "--server", "--out", "d"]).is_err());
        // A destructive command's reason is required; a dry run and --yes exclude each other.
        assert!(Cli::try_parse_from(["baton-hub", "retire", "host-a", "--yes"]).is_err());
        assert!(Cli::try_parse_from(["baton-hub", "revoke", "host-a", "--yes"]).is_err());
        assert!(Cli::try_parse_from(["baton-hub", "retire", "h", "--reason", "r", "--yes", "--dry-run"]).is_err());
        // Configuration flags belong to `serve` only.
        assert!(Cli::try_parse_from(["baton-hub", "status", "--claim-batch-max", "5"]).is_err());
    }
}

/// `deliveries cancel ID | --conversation C | --host H --reason R [--dry-run]`.
#[derive(Debug, clap::Args)]
pub struct CancelArgs {
    /// The delivery id (or give --conversation or --host).
    pub id: Option<String>,
    /// Every delivery of this conversation that has not ended.
    #[arg(long, conflicts_with_all = ["id", "host"])]
    pub conversation: Option<String>,
    /// Every delivery to this host that has not ended.
    #[arg(long, conflicts_with = "id")]
    pub host: Option<String>,
    /// Print what would be cancelled, change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Why (recorded).
    #[command(flatten)]
    pub why: Reason,
}

/// `deliveries retry ID --reason R`.
#[derive(Debug, clap::Args)]
pub struct RetryArgs {
    /// The delivery id: failed, unknown, or delivered whose run failed, ended unknown or was
    /// cancelled.
    pub id: String,
    /// Why (recorded).
    #[command(flatten)]
    pub why: Reason,
}

/// `redrive --outcome O [filters] --reason R [--dry-run | --yes] [--request-id ID]`.
#[derive(Debug, clap::Args)]
pub struct RedriveArgs {
    /// Re-run the deliveries with this outcome: failed, unknown or cancelled, the same set
    /// `deliveries list --outcome` shows (README, "State and outcome").
    #[arg(long)]
    pub outcome: String,
    /// Only this conversation.
    #[arg(long)]
    pub conversation: Option<String>,
    /// Only this host.
    #[arg(long)]
    pub host: Option<String>,
    /// Only deliveries that ended at or after this time: UTC ("2026-05-01 12:00:00"), RFC 3339,
    /// a duration ago ("2h", "30m"), or unix milliseconds. A repeat by --request-id of a
    /// redrive given a duration compares the duration, not the moment it meant.
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// At most this many in all.
    #[arg(long)]
    pub limit: Option<u32>,
    /// --dry-run (print what would be re-run, change nothing); --yes, which a redrive without
    /// a filter needs.
    #[command(flatten)]
    pub confirm: Confirm,
    /// Makes the redrive idempotent: a repeat with the same id prints what the first did and
    /// changes nothing.
    #[arg(long)]
    pub request_id: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Why (recorded; required without a filter).
    #[command(flatten)]
    pub why: ReasonIfDestructive,
}
