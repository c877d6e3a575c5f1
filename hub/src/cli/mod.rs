//! The operator CLI (SPEC §10). Every command takes `--data-dir`; listing commands take
//! `--json`; changing commands take `--reason` (recorded with the operator's name).
//! Destructive commands (SPEC §9: `fence block --all|--host`, `retire`, `revoke`, `purge`,
//! `redrive` without a filter, `ca retire-old`) need their reason, say what they will do, and
//! go through `confirm`: `--dry-run`, `--yes`, or a question at a terminal.
//!
//! Layout:
//! - `args`: the command line, defined once (clap derive).
//! - `output`: everything written to stdout (tables, JSON, one-line answers).
//! - `confirm`: how a destructive command shows its plan and asks (`--dry-run`, `--yes`).
//! - `identity`: `init`, `enroll`, `renew` (a holder's or the hub's server certificate),
//!   `revoke`, `certs list`.
//! - `conversations`: `members add|remove|list`, `producers scope|list`.
//! - `pools`: `pools add|remove|list|show`.
//! - `fence`: `fence pause|hold|block|lift|list`.
//! - `deliveries`: `deliveries list|show`, `held`, `retire`, `requeue`.
//! - `turns`: `deliveries cancel|retry`, `redrive`.
//! - `send`: submitting a message by hand.
//! - `inspect`: `status`, `backup`, `verify`, `config check`.
//! - `hosts`: `hosts list|show`, the fleet.
//! - `ca`: `ca rotate|retire-old`, the issuing CA.
//! - `audit`: `audit`, the operators' and the hub's actions.
//! - `restore`, `purge`: replacing the database with a verified backup; removing settled messages.
//! - `serve`: running the hub.
//! - `manuals`: `completions` and `man`, generated from `args`.
//!
//! Every command reaches the record through `Store` (held as a `Record`, with a small runtime
//! its operations run on). Read-only commands open it to read only, without a whole-file
//! check, so their cost does not grow with the database, and never wake the hub. Changing
//! commands open it to change (the strict open; each operation one transaction; the hub may or
//! may not be running, the backend serialises the writers) and then wake a running hub through
//! its socket.
//!
//! Where the record is comes from the configuration (`database_url`, whose `--database-url`
//! flag is global): the SQLite file of the data directory, or a PostgreSQL database, which
//! every command opens as `serve` does (connected, migrated) and whose server serialises the
//! writers of every hub and command. Commands about the SQLite file itself (`backup`,
//! `restore`) refuse there, naming PostgreSQL's tools.

mod args;
mod audit;
mod ca;
mod confirm;
mod conversations;
mod deliveries;
mod fence;
mod files;
mod hosts;
mod identity;
mod inspect;
mod lookup;
mod manuals;
mod migrate;
mod output;
mod pools;
mod purge;
mod restore;
mod send;
mod serve;
mod turns;
mod views;

pub use args::*;

use crate::config::{Flags, HubConfig, Sources, process_env};
use crate::datadir::DataDir;
use crate::store::{self, Store, StoreError, StoreResult};
use crate::wake;
use baton_shared::clock::SharedClock;
use baton_shared::exit;
use baton_shared::logging::{self, LogFormat};
use std::path::Path;

/// A CLI failure with its exit status (`baton_shared::exit`).
#[derive(Debug)]
pub struct CliError {
    /// The exit status.
    pub code: u8,
    /// The message (printed once, to stderr).
    pub message: String,
}

impl CliError {
    /// A failure with exit status `code`.
    pub fn new(code: u8, message: impl Into<String>) -> CliError {
        CliError { code, message: message.into() }
    }
    /// Bad usage or input (exit 2).
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::new(exit::USAGE, message)
    }
    /// Any other failure (exit 4).
    pub fn failure(message: impl Into<String>) -> CliError {
        CliError::new(exit::FAILURE, message)
    }
}

impl From<StoreError> for CliError {
    fn from(e: StoreError) -> Self {
        let code = match e {
            StoreError::NotFound(_) => exit::NOTHING,
            StoreError::Storage(_) | StoreError::Conflict(_) | StoreError::Internal(_) => exit::FAILURE,
            StoreError::Corrupt(_) => exit::REFUSED,
            _ => exit::USAGE,
        };
        CliError::new(code, e.to_string())
    }
}

impl From<baton_shared::sqlite::OpenError> for CliError {
    fn from(e: baton_shared::sqlite::OpenError) -> Self {
        CliError::new(exit::REFUSED, e.to_string())
    }
}

impl From<crate::store::engine::postgres::PgError> for CliError {
    fn from(e: crate::store::engine::postgres::PgError) -> Self {
        CliError::new(e.exit_code(), e.to_string())
    }
}

impl From<std::io::Error> for CliError {
    /// A reader that went away early (`baton-hub audit | head -1`) closed stdout: the command
    /// ends there, quietly and successfully, as `head` meant; any other I/O error is a failure.
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return CliError::new(exit::OK, String::new());
        }
        CliError::failure(e.to_string())
    }
}

impl From<baton_shared::ids::IdError> for CliError {
    fn from(e: baton_shared::ids::IdError) -> Self {
        CliError::usage(e.to_string())
    }
}

impl From<crate::lock::LockError> for CliError {
    fn from(e: crate::lock::LockError) -> Self {
        CliError::failure(e.to_string())
    }
}

/// What a command's result is.
pub type CliResult = Result<(), CliError>;

/// What every command works with: the data directory, who is acting, and the clock that
/// stamps what it stores.
pub struct Context {
    /// The data directory.
    pub dir: DataDir,
    /// The operator recorded with changes.
    pub operator: String,
    /// Wall-clock time for everything stored.
    pub clock: SharedClock,
    /// `--database-url`, the flag layer of the `database_url` key.
    pub database_url: Option<String>,
}

impl Context {
    /// The context of `cli`, with the system clock.
    pub fn new(cli: &Cli, clock: SharedClock) -> Context {
        Context {
            dir: DataDir::new(&cli.data_dir),
            operator: operator_name(cli.operator.as_deref()),
            clock,
            database_url: cli.database_url.clone(),
        }
    }

    /// Now, for storing.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The configuration as every command but `serve` sees it: the data directory's file, then
    /// the environment, then the global flags (`--database-url`).
    pub fn config(&self, file: Option<&Path>) -> Result<HubConfig, CliError> {
        self.config_with(file, &Flags::none())
    }

    /// The configuration from `file` (or the data directory's), the environment and `flags`
    /// with the global flags added.
    pub fn config_with(&self, file: Option<&Path>, flags: &Flags) -> Result<HubConfig, CliError> {
        let config_file = self.dir.config();
        let flags = flags.with_global(&crate::config::DATABASE_URL, self.database_url.as_deref());
        let sources = Sources { file, default_file: &config_file, env: &process_env, flags: &flags };
        HubConfig::load(sources).map_err(CliError::usage)
    }

    /// Refuses a command that works on the SQLite file (`command`) when the record is in
    /// PostgreSQL, saying what to use there instead (`instead`): exit 2.
    pub fn require_sqlite(&self, command: &str, instead: &str) -> CliResult {
        match self.config(None)?.database_url {
            None => Ok(()),
            Some(url) => Err(CliError::usage(format!(
                "{command} works on the SQLite file of a data directory; this hub's record is in PostgreSQL at \
                 {}: {instead}",
                url.shown()
            ))),
        }
    }

    /// Tells "not initialised" from "permission denied" before SQLite is asked (which would
    /// call an unreadable file damaged or missing).
    fn require_db(&self) -> CliResult {
        let db = self.dir.db();
        std::fs::File::open(&db).map(drop).map_err(|e| db_open_error(self.dir.root(), &db, &e))
    }

    /// The record, to read only, without a whole-file check. A database whose schema is older
    /// than this binary is migrated first (through the write path), as the next `serve` would.
    /// In PostgreSQL (`database_url`), the database is connected to and migrated like `serve`
    /// does, whichever of the two is asked for.
    pub fn open_read(&self) -> Result<Record, CliError> {
        if let Some(url) = self.config(None)?.database_url {
            return Record::postgres(&url, self.clock.clone());
        }
        self.require_db()?;
        let record = Record::new(Store::open_read(&self.dir.db(), self.clock.clone())?)?;
        if record.run(record.schema_version())? >= store::MIGRATIONS.len() as i64 {
            return Ok(record);
        }
        drop(record);
        tracing::info!("the database's schema is older than this binary; migrating it");
        drop(self.open_write()?);
        Record::new(Store::open_read(&self.dir.db(), self.clock.clone())?)
    }

    /// The record, to change: the strict open (checked, migrated, pragmas asserted).
    pub fn open_write(&self) -> Result<Record, CliError> {
        let config = self.config(None)?;
        if let Some(url) = &config.database_url {
            return Record::postgres(url, self.clock.clone());
        }
        self.require_db()?;
        Record::new(Store::open_write(&self.dir.db(), config.synchronous, self.clock.clone())?)
    }

    /// Tells a running hub that the record changed, so waiting long-polls look again.
    pub fn wake_hub(&self) {
        wake::notify(&self.dir.wake_socket());
        // Hubs serving the same PostgreSQL record from other data directories (and machines)
        // hear of the change through the database. The change is committed either way: a
        // failure here delays what those hubs' waiters see, and is reported, not fatal.
        if let Ok(HubConfig { database_url: Some(url), .. }) = self.config(None) {
            let told =
                tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string()).and_then(
                    |rt| {
                        rt.block_on(crate::peers::announce_once(&url, &crate::peers::Notice::record()))
                            .map_err(|e| e.to_string())
                    },
                );
            if let Err(e) = told {
                eprintln!("warning: the change is committed, but other hubs were not told at once ({e})");
            }
        }
    }
}

/// The record as a command holds it: the `Store`, and the small runtime its operations run on
/// (the CLI is synchronous; each operation is waited for where it is called).
pub struct Record {
    store: Store,
    rt: tokio::runtime::Runtime,
}

impl Record {
    /// `store`, with a runtime of its own.
    fn new(store: Store) -> Result<Record, CliError> {
        Ok(Record { store, rt: runtime()? })
    }

    /// The record in the PostgreSQL database at `url` (connected, migrated), with a runtime of
    /// its own.
    pub fn postgres(url: &crate::store::engine::postgres::PgUrl, clock: SharedClock) -> Result<Record, CliError> {
        let rt = runtime()?;
        let store = rt.block_on(Store::open_postgres(url, clock))?;
        Ok(Record { store, rt })
    }

    /// Runs one operation of the store to its end.
    pub fn run<T>(&self, op: impl std::future::Future<Output = StoreResult<T>>) -> StoreResult<T> {
        self.rt.block_on(op)
    }
}

impl std::ops::Deref for Record {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

/// The small runtime a command's store operations run on.
fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::failure(format!("starting the async runtime: {e}")))
}

/// Why the database file could not be opened, told apart: not there (not initialised) or not
/// this user's to read (permission denied), never "damaged".
fn db_open_error(root: &std::path::Path, db: &std::path::Path, e: &std::io::Error) -> CliError {
    let root = root.display();
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => CliError::failure(format!(
            "permission denied: {} cannot be read by this user; run as the hub's user, or check the owner \
             and mode of it and of {root}",
            db.display()
        )),
        std::io::ErrorKind::NotFound => CliError::new(
            exit::REFUSED,
            format!("{root} has no hub database; run `baton-hub init --data-dir {root}` first"),
        ),
        _ => CliError::failure(format!("{}: {e}", db.display())),
    }
}

/// Reads one of the data directory's PEM files (`ca.crt`, `ca.key`, `hub.crt`, a kept copy of
/// an issued certificate), at most `PEM_FILE_BYTES_MAX` of it; an error names the file (exit 4).
pub(super) fn read_pem(path: &Path) -> Result<String, CliError> {
    use baton_shared::limits::PEM_FILE_BYTES_MAX;
    baton_shared::files::read_text_bounded(path, PEM_FILE_BYTES_MAX, "PEM_FILE_BYTES_MAX")
        .map_err(|e| CliError::failure(format!("{}: {e}", path.display())))
}

fn operator_name(cli_operator: Option<&str>) -> String {
    let name = cli_operator
        .map(str::to_string)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "operator".to_string());
    if name.is_empty() { "operator".into() } else { name }
}

/// Runs one command. `serve` sets up its own logging from its configuration; every other
/// command logs as text.
pub fn run(cli: &Cli) -> CliResult {
    let ctx = Context::new(cli, baton_shared::clock::system());
    if let Command::Serve { config, settings } = &cli.command {
        return serve::serve(&ctx, config.as_deref(), settings);
    }
    logging::init_with_default(LogFormat::Text, logging::FILTER_COMMAND_DEFAULT);
    match &cli.command {
        Command::Serve { .. } => Err(CliError::failure("serve is run above")),
        Command::Init { hostnames, ca_from } => identity::init(&ctx, hostnames, ca_from.as_deref()),
        Command::Enroll(e) => identity::enroll_cmd(&ctx, e),
        Command::Renew { name, server, out, days, revoke_old, force, reason } => match (name, out) {
            (Some(name), Some(out)) if !*server => identity::renew(
                &ctx,
                name,
                identity::RenewOptions {
                    out,
                    days: *days,
                    revoke_old: *revoke_old,
                    force: *force,
                    reason: reason.as_deref(),
                },
            ),
            _ if *server => identity::renew_server(&ctx, *days),
            _ => Err(CliError::usage("renew takes NAME --out DIR, or --server")),
        },
        Command::Revoke { name, why, confirm } => identity::revoke(&ctx, name, why.checked("revoke")?, confirm),
        Command::Retire { host, why, confirm } => deliveries::retire(&ctx, host, why.checked("retire")?, confirm),
        Command::Requeue { instance, host, why } => deliveries::requeue(&ctx, instance, host.as_deref(), &why.reason),
        Command::Members(m) => conversations::members(&ctx, m),
        Command::Pools(p) => pools::run(&ctx, p),
        Command::Producers(p) => conversations::producers(&ctx, p),
        Command::Fence(f) => fence::run(&ctx, f),
        Command::Held(h) => deliveries::held(&ctx, h),
        Command::Deliveries(d) => deliveries::run(&ctx, d),
        Command::Redrive(r) => turns::redrive(&ctx, r),
        Command::Send { conversation, to, key, payload, payload_file, producer, json, why } => {
            let s = send::Submission {
                conversation,
                to,
                key,
                payload: payload.as_deref(),
                payload_file: payload_file.as_deref(),
                producer,
                reason: &why.reason,
            };
            send::send(&ctx, s, *json)
        }
        Command::Status { since, json } => inspect::status(&ctx, since, *json),
        Command::Backup { out } => inspect::backup(&ctx, out),
        Command::Verify { json } => inspect::verify(&ctx, *json),
        Command::Config(ConfigCmd::Check { config }) => inspect::config_check(&ctx, config.as_deref()),
        Command::Completions { shell } => manuals::completions(*shell),
        Command::Man { out } => manuals::man(out),
        Command::Hosts(h) => hosts::run(&ctx, h),
        Command::Ca(CaCmd::Rotate) => ca::rotate(&ctx),
        Command::Ca(CaCmd::RetireOld { force, why, confirm }) => {
            ca::retire_old(&ctx, *force, why.checked("ca retire-old")?, confirm)
        }
        Command::Certs(CertsCmd::List { name, json }) => identity::certs(&ctx, name.as_deref(), *json),
        Command::Restore { from } => restore::restore(&ctx, from),
        Command::Migrate { to } => migrate::migrate(&ctx, to),
        Command::Purge { message, conversation, host: Some(host), confirm, reason } => {
            debug_assert!(message.is_none() && conversation.is_none(), "clap keeps the targets apart");
            purge::purge_host(&ctx, host, confirm, reason)
        }
        Command::Purge { message, conversation, host: None, confirm, reason } => {
            purge::purge(&ctx, message.as_deref(), conversation.as_deref(), confirm, reason)
        }
        Command::Audit { since, actor, limit, after, json } => audit::run(
            &ctx,
            audit::Query { since: since.as_deref(), actor: actor.as_deref(), limit: *limit, after: after.as_deref() },
            *json,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};
    use std::path::Path;

    /// One case: an open failure and the status and words the CLI answers with.
    fn check(kind: ErrorKind, code: u8, words: &str) {
        let e = db_open_error(Path::new("/d"), Path::new("/d/hub.db"), &Error::from(kind));
        assert_eq!(e.code, code, "{kind:?}: {}", e.message);
        assert!(e.message.contains(words), "{kind:?}: {}", e.message);
        assert!(!e.message.contains("damaged"), "{kind:?}: {}", e.message);
    }

    /// A database this user may not read is "permission denied", not "damaged" and
    /// not "not initialised".
    #[test]
    fn open_failures_are_told_apart() {
        check(ErrorKind::PermissionDenied, exit::FAILURE, "permission denied: /d/hub.db");
        check(ErrorKind::NotFound, exit::REFUSED, "run `baton-hub init --data-dir /d`");
    }
}
