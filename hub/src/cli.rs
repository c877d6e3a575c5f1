//! The operator CLI (SPEC §10). Every command takes `--data-dir`; listing commands take
//! `--json`; changing commands take `--reason` (recorded with the operator's name).
//!
//! Commands that change the record open the database directly (the hub may or may not be
//! running; SQLite serialises the writers) and then wake a running hub through its socket.

use crate::config::{CONFIG_TEMPLATE, HubConfig};
use crate::datadir::{DATA_DIR_DEFAULT, DATA_DIR_ENV, DataDir};
use crate::store::accept::{self, AcceptLimits, Accepted, NewMessage};
use crate::store::fences::{self, FenceKind, FenceScope, NewFence};
use crate::store::hosts::{self, Issued};
use crate::store::operator::{self, Selector};
use crate::store::read::{self, DeliveryFilter};
use crate::store::{self, StoreError, in_write_txn};
use crate::{now_ms, wake};
use baton_shared::ids::{Role, check_key, check_name};
use baton_shared::pki::{self, LeafKind};
use clap::{Args, Parser, Subcommand};
use rusqlite::Connection;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Exit status: success.
pub const EXIT_OK: u8 = 0;
/// Exit status: nothing matched (not found, nothing to do).
pub const EXIT_NOT_FOUND: u8 = 1;
/// Exit status: bad usage or input (clap uses it too).
pub const EXIT_USAGE: u8 = 2;
/// Exit status: the store was refused (damaged, newer than this binary, not initialised).
pub const EXIT_REFUSED: u8 = 3;
/// Exit status: any other failure.
pub const EXIT_FAILURE: u8 = 4;

const EXIT_CODES_HELP: &str = "Exit status: 0 ok; 1 not found or nothing to do; 2 usage or invalid input \
(including an invalid configuration file); 3 store refused (damaged, newer than this binary, not initialised); \
4 other failure.";

/// The Baton hub: delivery record, mTLS API and operator commands.
#[derive(Debug, Parser)]
#[command(name = "baton-hub", version, about, after_help = EXIT_CODES_HELP)]
pub struct Cli {
    /// The hub's data directory.
    #[arg(long, global = true, env = DATA_DIR_ENV, default_value = DATA_DIR_DEFAULT)]
    pub data_dir: PathBuf,
    /// Operator name recorded with changes.
    #[arg(long, global = true, env = "BATON_OPERATOR")]
    pub operator: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Operator commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the data directory, the database, the CA and the hub's server certificate.
    Init {
        /// Extra DNS names or IP addresses nodes dial (localhost, 127.0.0.1 and ::1 are always included).
        #[arg(long = "hostname", value_name = "NAME")]
        hostnames: Vec<String>,
    },
    /// Run the hub.
    Serve {
        /// ADDR:PORT to listen on; port 0 picks a free port (printed, and written to DIR/hub.addr).
        #[arg(long)]
        listen: Option<String>,
        /// Configuration file (default DIR/hub.toml when it exists).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Issue a certificate for a node host or a producer.
    #[command(subcommand)]
    Enroll(Enroll),
    /// Revoke every certificate of a name (or one serial). Takes effect on the next request.
    Revoke {
        /// Host or producer name, or a certificate serial.
        name: String,
        /// Why (recorded).
        #[command(flatten)]
        why: Reason,
    },
    /// Issue a fresh certificate for an enrolled name.
    Renew {
        /// Host or producer name.
        name: String,
        /// Where to write NAME.crt, NAME.key and ca.crt.
        #[arg(long)]
        out: PathBuf,
        /// Validity in days.
        #[arg(long, default_value_t = 365)]
        days: u32,
    },
    /// Retire a host: no more work; its pending deliveries fail (mirrored ones become unknown).
    Retire {
        /// The host.
        host: String,
        /// Why (recorded).
        #[command(flatten)]
        why: Reason,
    },
    /// Requeue what a node instance that is gone for good holds.
    Requeue {
        /// The instance id (see `deliveries list`).
        #[arg(long)]
        instance: String,
        /// Why (recorded).
        #[command(flatten)]
        why: Reason,
    },
    /// Fences: pause, hold or block a conversation, a host, or everything.
    #[command(subcommand)]
    Fence(FenceCmd),
    /// The held queue.
    #[command(subcommand)]
    Held(HeldCmd),
    /// Inspect and cancel deliveries.
    #[command(subcommand)]
    Deliveries(DeliveriesCmd),
    /// Submit a message by hand.
    Send {
        /// The conversation.
        #[arg(long)]
        conversation: String,
        /// Recipient hosts, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
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
        /// Producer name the message is recorded under (keys are scoped to it).
        #[arg(long, default_value = "operator")]
        producer: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Overview of the record.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a consistent copy of the database while the hub runs.
    Backup {
        /// The copy's path (must not exist).
        #[arg(long)]
        out: PathBuf,
    },
    /// Check the record's invariants offline; lists every problem found.
    Verify {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Validate a configuration file and exit.
    #[command(subcommand)]
    Config(ConfigCmd),
}

/// `enroll` subcommands.
#[derive(Debug, Subcommand)]
pub enum Enroll {
    /// A node host: writes DIR/HOST.crt, DIR/HOST.key, DIR/ca.crt.
    Node(EnrollArgs),
    /// A producer: writes DIR/NAME.crt, DIR/NAME.key, DIR/ca.crt.
    Producer(EnrollArgs),
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
}

/// `--reason`, recorded with changes.
#[derive(Debug, Args)]
pub struct Reason {
    /// Why; recorded with the operator's name.
    #[arg(long, default_value = "no reason given")]
    pub reason: String,
}

/// `fence` subcommands.
#[derive(Debug, Subcommand)]
pub enum FenceCmd {
    /// Matching deliveries stay queued until the fence lifts.
    Pause(FenceSet),
    /// Matching deliveries park in the held queue until released.
    Hold(FenceSet),
    /// Matching deliveries are refused: failed, naming the fence.
    Block(FenceSet),
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
    /// Everything.
    #[arg(long, group = "scope")]
    pub all: bool,
}

/// Arguments of `fence pause|hold|block`.
#[derive(Debug, Args)]
pub struct FenceSet {
    #[command(flatten)]
    target: FenceTarget,
    #[command(flatten)]
    why: Reason,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `held` subcommands.
#[derive(Debug, Subcommand)]
pub enum HeldCmd {
    /// List held deliveries.
    List {
        /// Only this conversation.
        #[arg(long)]
        conversation: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Release one held delivery, or all of a conversation, back to queued.
    Release {
        /// The delivery id.
        #[arg(required_unless_present = "conversation", conflicts_with = "conversation")]
        id: Option<String>,
        /// Release every held delivery of this conversation.
        #[arg(long)]
        conversation: Option<String>,
        /// Why (recorded).
        #[command(flatten)]
        why: Reason,
    },
}

/// `deliveries` subcommands.
#[derive(Debug, Subcommand)]
pub enum DeliveriesCmd {
    /// List deliveries, oldest first.
    List {
        /// Only this state.
        #[arg(long)]
        state: Option<String>,
        /// Only this host.
        #[arg(long)]
        host: Option<String>,
        /// Only this conversation.
        #[arg(long)]
        conversation: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 1000)]
        limit: u32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// One delivery with its event history and attempts.
    Show {
        /// The delivery id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a delivery that has not been delivered (it fails, naming you).
    Cancel {
        /// The delivery id.
        id: String,
        /// Why (recorded).
        #[command(flatten)]
        why: Reason,
    },
}

/// `config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigCmd {
    /// Validate the configuration (default DIR/hub.toml) and exit 0 (valid) or 2 (invalid).
    Check {
        /// The file.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

/// A CLI failure with its exit status.
#[derive(Debug)]
pub struct CliError {
    /// The exit status.
    pub code: u8,
    /// The message (printed once, to stderr).
    pub message: String,
}

impl CliError {
    fn new(code: u8, message: impl Into<String>) -> CliError {
        CliError { code, message: message.into() }
    }
}

impl From<StoreError> for CliError {
    fn from(e: StoreError) -> Self {
        let code = match e {
            StoreError::NotFound(_) => EXIT_NOT_FOUND,
            StoreError::Storage(_) => EXIT_FAILURE,
            _ => EXIT_USAGE,
        };
        CliError::new(code, e.to_string())
    }
}

impl From<baton_shared::sqlite::OpenError> for CliError {
    fn from(e: baton_shared::sqlite::OpenError) -> Self {
        CliError::new(EXIT_REFUSED, e.to_string())
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        CliError::new(EXIT_FAILURE, e.to_string())
    }
}

impl From<baton_shared::ids::IdError> for CliError {
    fn from(e: baton_shared::ids::IdError) -> Self {
        CliError::new(EXIT_USAGE, e.to_string())
    }
}

type CliResult = Result<(), CliError>;

fn operator_name(cli_operator: Option<&str>) -> String {
    let name = cli_operator
        .map(str::to_string)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "operator".to_string());
    if name.is_empty() { "operator".into() } else { name }
}

fn open_db(dir: &DataDir) -> Result<Connection, CliError> {
    if !dir.db().exists() {
        return Err(CliError::new(
            EXIT_REFUSED,
            format!(
                "{} has no hub database; run `baton-hub init --data-dir {}` first",
                dir.root().display(),
                dir.root().display()
            ),
        ));
    }
    let config = HubConfig::load(None, &dir.config()).map_err(|e| CliError::new(EXIT_USAGE, e))?;
    Ok(store::open_write(&dir.db(), config.synchronous)?)
}

fn out() -> std::io::StdoutLock<'static> {
    std::io::stdout().lock()
}

fn print_json(v: &impl serde::Serialize) -> CliResult {
    let text = serde_json::to_string_pretty(v).map_err(|e| CliError::new(EXIT_FAILURE, e.to_string()))?;
    writeln!(out(), "{text}")?;
    Ok(())
}

/// Prints rows as an aligned table with a header.
fn print_table(header: &[&str], rows: &[Vec<String>]) -> CliResult {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut o = out();
    let line = |cells: Vec<String>| -> String {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        s.trim_end().to_string()
    };
    writeln!(o, "{}", line(header.iter().map(|h| h.to_string()).collect()))?;
    for row in rows {
        writeln!(o, "{}", line(row.clone()))?;
    }
    Ok(())
}

fn fence_json(r: &fences::FenceRow) -> serde_json::Value {
    serde_json::json!({
        "id": r.id, "kind": r.kind.as_str(), "scope": r.scope.as_str(), "target": r.target, "set_by": r.set_by,
        "set_at_ms": r.set_at_ms, "reason": r.reason, "lifted_at_ms": r.lifted_at_ms, "lifted_by": r.lifted_by,
    })
}

fn delivery_json(r: &read::DeliveryRow) -> serde_json::Value {
    serde_json::json!({
        "delivery_id": r.delivery_id, "message_id": r.message_id, "host": r.host, "conversation": r.conversation,
        "seq": r.seq, "state": r.state.as_str(), "instance_id": r.instance_id, "reason": r.reason,
        "updated_at_ms": r.updated_at_ms, "outcome": r.outcome.map(|o| o.as_str()),
    })
}

fn detail_json(d: &read::DeliveryDetail) -> serde_json::Value {
    let events: Vec<_> = d
        .events
        .iter()
        .map(|e| {
            serde_json::json!({
                "id": e.id, "from_state": e.from_state.map(|s| s.as_str()), "to_state": e.to_state.as_str(),
                "actor_kind": e.actor_kind.as_str(), "actor": e.actor, "instance_id": e.instance_id,
                "reason": e.reason, "at_ms": e.at_ms,
            })
        })
        .collect();
    serde_json::json!({"delivery": delivery_json(&d.delivery), "events": events, "attempts": d.attempts})
}

fn status_json(s: &read::StatusView) -> serde_json::Value {
    let deliveries: Vec<_> = s.deliveries.iter().map(|(st, n)| serde_json::json!([st.as_str(), n])).collect();
    serde_json::json!({
        "deliveries": deliveries, "messages": s.messages, "pending_fanout": s.pending_fanout,
        "active_fences": s.active_fences, "hosts": s.hosts, "attempts": s.attempts, "schema_version": s.schema_version,
    })
}

fn fmt_ms(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let f = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    t.format(&f).unwrap_or_default()
}

/// Runs one CLI command except `serve` (which `main` runs on the async runtime).
pub fn run(cli: &Cli) -> CliResult {
    let dir = DataDir::new(&cli.data_dir);
    let op = operator_name(cli.operator.as_deref());
    match &cli.command {
        Command::Init { hostnames } => init(&dir, hostnames),
        Command::Serve { .. } => Err(CliError::new(EXIT_FAILURE, "serve runs from main")),
        Command::Enroll(e) => {
            let (role, args) = match e {
                Enroll::Node(a) => (Role::Node, a),
                Enroll::Producer(a) => (Role::Producer, a),
            };
            enroll(&dir, role, &args.name, &args.out, args.days)
        }
        Command::Renew { name, out, days } => {
            let conn = open_db(&dir)?;
            let roles = hosts::enrolled_roles(&conn, name)?;
            let role = match roles.as_slice() {
                [r] => *r,
                [] => return Err(CliError::new(EXIT_NOT_FOUND, format!("{name} was never enrolled"))),
                _ => return Err(CliError::new(EXIT_USAGE, format!("{name} is enrolled as both node and producer"))),
            };
            enroll(&dir, role, name, out, *days)
        }
        Command::Revoke { name, why } => {
            let conn = open_db(&dir)?;
            let serials = in_write_txn(&conn, |c| hosts::revoke(c, name, &op, &why.reason, now_ms()))?;
            writeln!(out(), "revoked {} certificate(s) of {name}: {}", serials.len(), serials.join(", "))?;
            Ok(())
        }
        Command::Retire { host, why } => {
            let conn = open_db(&dir)?;
            let swept = in_write_txn(&conn, |c| operator::retire(c, host, &op, &why.reason, now_ms()))?;
            wake::notify(&dir.wake_socket());
            writeln!(
                out(),
                "retired {host}: {} failed, {} unknown, {} delivered without outcome marked unknown",
                swept.failed.len(),
                swept.unknown.len(),
                swept.outcome_unknown.len()
            )?;
            Ok(())
        }
        Command::Requeue { instance, why } => {
            let conn = open_db(&dir)?;
            let swept = in_write_txn(&conn, |c| operator::requeue_instance(c, instance, &op, &why.reason, now_ms()))?;
            wake::notify(&dir.wake_socket());
            if swept.requeued.is_empty() && swept.outcome_unknown.is_empty() {
                return Err(CliError::new(EXIT_NOT_FOUND, format!("instance {instance} holds nothing")));
            }
            writeln!(
                out(),
                "instance {instance}: {} requeued, {} delivered without outcome marked unknown",
                swept.requeued.len(),
                swept.outcome_unknown.len()
            )?;
            Ok(())
        }
        Command::Fence(f) => fence(&dir, &op, f),
        Command::Held(h) => held(&dir, &op, h),
        Command::Deliveries(d) => deliveries(&dir, &op, d),
        Command::Send { conversation, to, key, payload, payload_file, producer, json } => {
            send(&dir, conversation, to, key, payload.as_deref(), payload_file.as_deref(), producer, *json)
        }
        Command::Status { json } => status(&dir, *json),
        Command::Backup { out: path } => backup(&dir, path),
        Command::Verify { json } => verify(&dir, *json),
        Command::Config(ConfigCmd::Check { config }) => match HubConfig::load(config.as_deref(), &dir.config()) {
            Ok(_) => {
                writeln!(out(), "configuration is valid")?;
                Ok(())
            }
            Err(e) => Err(CliError::new(EXIT_USAGE, e)),
        },
    }
}

fn write_new(path: &Path, contents: &str, private: bool) -> CliResult {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)
        .map_err(|e| CliError::new(EXIT_FAILURE, format!("{}: {e}", path.display())))?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    Ok(())
}

fn init(dir: &DataDir, hostnames: &[String]) -> CliResult {
    if dir.ca_cert().exists() || dir.db().exists() {
        return Err(CliError::new(
            EXIT_USAGE,
            format!("{} is already initialised; refusing to overwrite it", dir.root().display()),
        ));
    }
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir.root())?;
    }
    let ca = pki::create_ca("Baton hub CA").map_err(|e| CliError::new(EXIT_FAILURE, e.to_string()))?;
    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    for h in hostnames {
        if !names.contains(h) {
            names.push(h.clone());
        }
    }
    let server = pki::issue(&ca.cert_pem, &ca.key_pem, &LeafKind::Server { hostnames: names.clone() })
        .map_err(|e| CliError::new(EXIT_USAGE, e.to_string()))?;
    write_new(&dir.ca_key(), &ca.key_pem, true)?;
    write_new(&dir.ca_cert(), &ca.cert_pem, false)?;
    write_new(&dir.server_key(), &server.key_pem, true)?;
    write_new(&dir.server_cert(), &server.cert_pem, false)?;
    if !dir.config().exists() {
        write_new(&dir.config(), CONFIG_TEMPLATE, false)?;
    }
    drop(store::open_write(&dir.db(), baton_shared::sqlite::Synchronous::Full)?);
    writeln!(out(), "initialised {} (server names: {})", dir.root().display(), names.join(", "))?;
    Ok(())
}

fn enroll(dir: &DataDir, role: Role, name: &str, out_dir: &Path, days: u32) -> CliResult {
    check_name("name", name)?;
    if days == 0 || days > 3650 {
        return Err(CliError::new(EXIT_USAGE, format!("--days {days} is out of range; allowed 1..=3650")));
    }
    let conn = open_db(dir)?;
    let ca_cert = std::fs::read_to_string(dir.ca_cert())?;
    let ca_key = std::fs::read_to_string(dir.ca_key())?;
    let lifetime = Duration::from_secs(u64::from(days) * 24 * 3600);
    let leaf = pki::issue(&ca_cert, &ca_key, &LeafKind::Client { role, name: name.into(), lifetime })
        .map_err(|e| CliError::new(EXIT_USAGE, e.to_string()))?;
    std::fs::create_dir_all(out_dir)?;
    let cert_path = out_dir.join(format!("{name}.crt"));
    let key_path = out_dir.join(format!("{name}.key"));
    for p in [&cert_path, &key_path] {
        if p.exists() {
            return Err(CliError::new(EXIT_USAGE, format!("{} exists; refusing to overwrite it", p.display())));
        }
    }
    let issued = Issued { role, name, serial: &leaf.serial, not_after_unix: leaf.not_after_unix };
    in_write_txn(&conn, |c| hosts::enroll(c, issued, "cli", now_ms()))?;
    write_new(&key_path, &leaf.key_pem, true)?;
    write_new(&cert_path, &leaf.cert_pem, false)?;
    let ca_out = out_dir.join("ca.crt");
    if !ca_out.exists() {
        write_new(&ca_out, &ca_cert, false)?;
    }
    writeln!(out(), "enrolled {role} {name}: {} (serial {})", cert_path.display(), leaf.serial)?;
    Ok(())
}

fn fence(dir: &DataDir, op: &str, f: &FenceCmd) -> CliResult {
    let conn = open_db(dir)?;
    let (kind, set) = match f {
        FenceCmd::Pause(s) => (FenceKind::Pause, s),
        FenceCmd::Hold(s) => (FenceKind::Hold, s),
        FenceCmd::Block(s) => (FenceKind::Block, s),
        FenceCmd::Lift { id, why } => {
            in_write_txn(&conn, |c| fences::lift(c, *id, op, &why.reason, now_ms()))?;
            wake::notify(&dir.wake_socket());
            writeln!(out(), "lifted fence {id}")?;
            return Ok(());
        }
        FenceCmd::List { all, json } => {
            let rows = fences::list(&conn, *all)?;
            if *json {
                return print_json(&rows.iter().map(fence_json).collect::<Vec<_>>());
            }
            let rows: Vec<Vec<String>> = rows
                .iter()
                .map(|r| {
                    vec![
                        r.id.to_string(),
                        r.kind.as_str().to_string(),
                        r.scope.as_str().to_string(),
                        r.target.clone().unwrap_or_else(|| "*".into()),
                        r.set_by.clone(),
                        fmt_ms(r.set_at_ms),
                        r.lifted_at_ms.map(fmt_ms).unwrap_or_else(|| "active".into()),
                        r.reason.clone(),
                    ]
                })
                .collect();
            return print_table(&["ID", "KIND", "SCOPE", "TARGET", "SET BY", "SET AT", "LIFTED", "REASON"], &rows);
        }
    };
    let (scope, target) = match (&set.target.conversation, &set.target.host, set.target.all) {
        (Some(c), _, _) => {
            check_name("conversation", c)?;
            (FenceScope::Conversation, Some(c.as_str()))
        }
        (_, Some(h), _) => {
            check_name("host", h)?;
            (FenceScope::Host, Some(h.as_str()))
        }
        _ => (FenceScope::All, None),
    };
    let new = NewFence { kind, scope, target, operator: op, reason: &set.why.reason };
    let id = in_write_txn(&conn, |c| fences::set(c, new, now_ms()))?;
    if set.json {
        return print_json(
            &serde_json::json!({"id": id, "kind": kind.as_str(), "scope": scope.as_str(), "target": target}),
        );
    }
    writeln!(
        out(),
        "fence {id}: {} {}{}",
        kind.as_str(),
        scope.as_str(),
        target.map(|t| format!(" {t}")).unwrap_or_default()
    )?;
    Ok(())
}

fn delivery_rows(rows: &[read::DeliveryRow]) -> Vec<Vec<String>> {
    rows.iter()
        .map(|r| {
            vec![
                r.delivery_id.clone(),
                r.host.clone(),
                r.conversation.clone(),
                r.seq.to_string(),
                r.state.to_string(),
                r.outcome.map(|o| o.to_string()).unwrap_or_else(|| "-".into()),
                fmt_ms(r.updated_at_ms),
                r.reason.clone().unwrap_or_default(),
            ]
        })
        .collect()
}

const DELIVERY_HEADER: [&str; 8] = ["DELIVERY", "HOST", "CONVERSATION", "SEQ", "STATE", "OUTCOME", "UPDATED", "REASON"];

fn held(dir: &DataDir, op: &str, h: &HeldCmd) -> CliResult {
    let conn = open_db(dir)?;
    match h {
        HeldCmd::List { conversation, json } => {
            let f = DeliveryFilter {
                state: Some(baton_shared::states::DeliveryState::Held),
                conversation: conversation.clone(),
                limit: 100_000,
                ..Default::default()
            };
            let rows = read::list_deliveries(&conn, &f)?;
            if *json {
                return print_json(&rows.iter().map(delivery_json).collect::<Vec<_>>());
            }
            print_table(&DELIVERY_HEADER, &delivery_rows(&rows))
        }
        HeldCmd::Release { id, conversation, why } => {
            let sel = match (id, conversation) {
                (Some(id), _) => Selector::Delivery(id),
                (None, Some(c)) => Selector::Conversation(c),
                (None, None) => return Err(CliError::new(EXIT_USAGE, "give a delivery id or --conversation")),
            };
            let ids = in_write_txn(&conn, |c| operator::release(c, sel, op, &why.reason, now_ms()))?;
            wake::notify(&dir.wake_socket());
            writeln!(out(), "released {} deliveries", ids.len())?;
            if ids.is_empty() {
                return Err(CliError::new(EXIT_NOT_FOUND, "nothing was held"));
            }
            Ok(())
        }
    }
}

fn deliveries(dir: &DataDir, op: &str, d: &DeliveriesCmd) -> CliResult {
    let conn = open_db(dir)?;
    match d {
        DeliveriesCmd::List { state, host, conversation, limit, json } => {
            let state = match state {
                None => None,
                Some(s) => Some(baton_shared::states::DeliveryState::parse(s).ok_or_else(|| {
                    CliError::new(
                        EXIT_USAGE,
                        format!(
                            "--state {s:?} is not one of queued, claimed, mirrored, delivered, held, failed, unknown"
                        ),
                    )
                })?),
            };
            let f = DeliveryFilter { state, host: host.clone(), conversation: conversation.clone(), limit: *limit };
            let rows = read::list_deliveries(&conn, &f)?;
            if *json {
                return print_json(&rows.iter().map(delivery_json).collect::<Vec<_>>());
            }
            print_table(&DELIVERY_HEADER, &delivery_rows(&rows))
        }
        DeliveriesCmd::Show { id, json } => {
            let detail = read::delivery_detail(&conn, id)?;
            if *json {
                return print_json(&detail_json(&detail));
            }
            let d = &detail.delivery;
            let mut o = out();
            writeln!(o, "delivery      {}", d.delivery_id)?;
            writeln!(o, "message       {}", d.message_id)?;
            writeln!(o, "host          {}", d.host)?;
            writeln!(o, "conversation  {} (seq {})", d.conversation, d.seq)?;
            writeln!(o, "state         {}", d.state)?;
            if let Some(i) = &d.instance_id {
                writeln!(o, "instance      {i}")?;
            }
            if let Some(r) = &d.reason {
                writeln!(o, "reason        {r}")?;
            }
            writeln!(o, "events:")?;
            for e in &detail.events {
                writeln!(
                    o,
                    "  {}  {:>9} -> {:<9}  {} {}{}",
                    fmt_ms(e.at_ms),
                    e.from_state.map(|s| s.to_string()).unwrap_or_else(|| "(new)".into()),
                    e.to_state,
                    e.actor_kind.as_str(),
                    e.actor,
                    e.reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()
                )?;
            }
            writeln!(o, "attempts:")?;
            for a in &detail.attempts {
                writeln!(
                    o,
                    "  {}  {}  exit {}  {} ms{}",
                    fmt_ms(a.reported_at_ms),
                    a.outcome,
                    a.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
                    a.duration_ms.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
                    a.reason.as_ref().map(|r| format!("  ({r})")).unwrap_or_default()
                )?;
                if let Some(r) = &a.result {
                    writeln!(o, "    result: {}", r.trim_end())?;
                }
            }
            Ok(())
        }
        DeliveriesCmd::Cancel { id, why } => {
            in_write_txn(&conn, |c| operator::cancel(c, id, op, &why.reason, now_ms()))?;
            wake::notify(&dir.wake_socket());
            writeln!(out(), "cancelled {id}")?;
            Ok(())
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn send(
    dir: &DataDir,
    conversation: &str,
    to: &[String],
    key: &str,
    payload: Option<&str>,
    payload_file: Option<&Path>,
    producer: &str,
    json: bool,
) -> CliResult {
    check_name("conversation", conversation)?;
    check_key("key", key)?;
    check_name("producer", producer)?;
    for h in to {
        check_name("to", h)?;
    }
    let text = match (payload, payload_file) {
        (Some(p), _) => p.to_string(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).map_err(|e| CliError::new(EXIT_USAGE, format!("{}: {e}", f.display())))?
        }
        (None, None) => return Err(CliError::new(EXIT_USAGE, "give --payload JSON or --payload-file FILE")),
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| CliError::new(EXIT_USAGE, format!("payload is not JSON: {e}")))?;
    let config = HubConfig::load(None, &dir.config()).map_err(|e| CliError::new(EXIT_USAGE, e))?;
    let payload = value.to_string();
    if payload.len() as u64 > config.limits.payload_bytes_max {
        return Err(CliError::new(
            EXIT_USAGE,
            format!("payload is {} bytes; at most {} are accepted", payload.len(), config.limits.payload_bytes_max),
        ));
    }
    let mut to = to.to_vec();
    to.sort();
    to.dedup();
    let msg = NewMessage {
        producer: producer.into(),
        conversation: conversation.into(),
        idempotency_key: key.into(),
        payload,
        to,
    };
    let conn = open_db(dir)?;
    let limits = AcceptLimits { queued_per_host_max: config.limits.queued_per_host_max };
    let accepted = in_write_txn(&conn, |c| accept::accept(c, &msg, limits, now_ms()))?;
    let (id, seq, duplicate) = match accepted {
        Accepted::New { message_id, seq } => (message_id, seq, false),
        Accepted::Duplicate { message_id, seq } => (message_id, seq, true),
    };
    let deliveries = in_write_txn(&conn, |c| accept::fan_out(c, &id, now_ms()))?;
    wake::notify(&dir.wake_socket());
    if json {
        return print_json(&baton_shared::wire::SubmitResponse { message_id: id, seq, duplicate, deliveries });
    }
    writeln!(out(), "message {id} seq {seq}{}", if duplicate { " (duplicate: already accepted)" } else { "" })?;
    for d in deliveries {
        writeln!(out(), "  delivery {} -> {} ({})", d.delivery_id, d.host, d.state)?;
    }
    Ok(())
}

fn status(dir: &DataDir, json: bool) -> CliResult {
    let conn = open_db(dir)?;
    let s = read::status(&conn)?;
    let running = wake::notify(&dir.wake_socket());
    if json {
        let mut v = status_json(&s);
        v["hub_running"] = serde_json::Value::Bool(running);
        return print_json(&v);
    }
    let mut o = out();
    writeln!(o, "hub           {}", if running { "running" } else { "not running" })?;
    writeln!(o, "schema        version {}", s.schema_version)?;
    writeln!(o, "hosts         {}", s.hosts)?;
    writeln!(o, "messages      {}", s.messages)?;
    writeln!(o, "fan-out due   {}", s.pending_fanout)?;
    writeln!(o, "fences        {} active", s.active_fences)?;
    writeln!(o, "attempts      {}", s.attempts)?;
    writeln!(o, "deliveries:")?;
    for (state, n) in &s.deliveries {
        writeln!(o, "  {state:<10} {n}")?;
    }
    Ok(())
}

fn backup(dir: &DataDir, path: &Path) -> CliResult {
    if path.exists() {
        return Err(CliError::new(EXIT_USAGE, format!("{} exists; refusing to overwrite it", path.display())));
    }
    let conn = open_db(dir)?;
    store::backup::copy_to(&conn, path)?;
    writeln!(out(), "backup written to {} (integrity ok)", path.display())?;
    Ok(())
}

fn verify(dir: &DataDir, json: bool) -> CliResult {
    let conn = store::open_read(&dir.db())?;
    let problems = store::verify::check(&conn).map_err(CliError::from)?;
    if json {
        let typed: Vec<_> = problems
            .iter()
            .map(|p| serde_json::json!({"kind": p.kind.as_str(), "subject": p.subject, "detail": p.detail}))
            .collect();
        print_json(&serde_json::json!({"problems": typed}))?;
    } else if problems.is_empty() {
        writeln!(out(), "ok: no invariant violated")?;
    } else {
        for p in &problems {
            writeln!(out(), "{p}")?;
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CliError::new(EXIT_FAILURE, format!("{} problem(s) found", problems.len())))
    }
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
    fn public_surface_parses() {
        for args in [
            vec!["baton-hub", "init", "--hostname", "hub.example"],
            vec!["baton-hub", "serve", "--listen", "127.0.0.1:0"],
            vec!["baton-hub", "enroll", "node", "host-a", "--out", "d"],
            vec!["baton-hub", "enroll", "producer", "p", "--out", "d"],
            vec!["baton-hub", "revoke", "host-a", "--reason", "lost laptop"],
            vec!["baton-hub", "renew", "host-a", "--out", "d"],
            vec!["baton-hub", "retire", "host-a"],
            vec!["baton-hub", "fence", "pause", "--conversation", "c"],
            vec!["baton-hub", "fence", "hold", "--host", "h", "--reason", "r"],
            vec!["baton-hub", "fence", "block", "--all"],
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
            vec!["baton-hub", "send", "--conversation", "c", "--to", "a,b", "--key", "k", "--payload", "{}"],
            vec!["baton-hub", "status", "--json"],
            vec!["baton-hub", "backup", "--out", "f"],
            vec!["baton-hub", "verify"],
        ] {
            assert!(Cli::try_parse_from(&args).is_ok(), "{args:?}");
        }
        // A fence needs exactly one scope.
        assert!(Cli::try_parse_from(["baton-hub", "fence", "pause"]).is_err());
        assert!(Cli::try_parse_from(["baton-hub", "fence", "pause", "--all", "--host", "h"]).is_err());
    }
}
