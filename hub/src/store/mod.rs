//! The hub's record in SQLite, behind one narrow interface.
//!
//! Everything the HTTP layer and the CLI may do to the record is a function in this module
//! tree; nothing outside it writes SQL. The operations are plain synchronous functions over a
//! `rusqlite::Connection` already inside a write transaction (so the CLI and the tests can run
//! them directly), and `Store` runs them on the hub's single writer thread with group commit.
//! A second backend (SPEC §11) replaces `Store`'s internals, not its method set.
//!
//! Layout:
//! - `writer`: the writer thread (one owner of the write connection, group commit) and the
//!   reader pool.
//! - `transition`: the SPEC §2 transition table and the one guarded update every transition uses.
//! - `accept`: acceptance, fan-out and startup repair.
//! - `claim`: claims with fences, order and fairness, holdings, and the holder's
//!   mirrored/ack/reject.
//! - `members`: the membership registry (join/leave intervals per conversation and host).
//! - `producers`: producers' publish scopes.
//! - `report`: attempt reports.
//! - `operator`: fences, releases, cancel, retire, requeue, certificates and hosts.
//! - `read`: views for producers, operators and status.
//! - `retention`: removing settled messages older than the retention window.

pub mod accept;
pub mod claim;
pub mod members;
pub mod operator;
pub mod producers;
pub mod read;
pub mod report;
pub mod retention;
pub mod transition;
pub mod writer;

pub use writer::{Readers, Writer};

use baton_shared::error::ErrorCode;
use baton_shared::sqlite::{self, OpenError, OpenOptions, Synchronous};
use rusqlite::Connection;
use std::path::Path;

/// The hub schema's migrations, in order. Append-only.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../../../schema/hub/0001-create-hub-store.sql"),
    include_str!("../../../schema/hub/0002-conversations.sql"),
];

/// Who made a change, as recorded in the event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// Hub, node or operator.
    pub kind: ActorKind,
    /// The host, operator or `hub`.
    pub name: String,
}

impl Actor {
    /// The hub itself (fences applied at claim, fan-out, repair).
    pub fn hub() -> Actor {
        Actor { kind: ActorKind::Hub, name: "hub".into() }
    }
    /// A node acting for its host.
    pub fn node(host: &str) -> Actor {
        Actor { kind: ActorKind::Node, name: host.into() }
    }
    /// An operator, by name.
    pub fn operator(name: &str) -> Actor {
        Actor { kind: ActorKind::Operator, name: name.into() }
    }
}

/// The three kinds of actor in the event log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActorKind {
    /// The hub, on its own account.
    Hub,
    /// A node instance.
    Node,
    /// An operator through the CLI.
    Operator,
}

impl ActorKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ActorKind::Hub => "hub",
            ActorKind::Node => "node",
            ActorKind::Operator => "operator",
        }
    }
}

/// Why a store operation did not happen. Each maps to one stable API error code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// A field has a bad value; the text names the field.
    #[error("{0}")]
    Invalid(String),
    /// A message has no recipients: no `to`, and its conversation has no members.
    #[error("{0}")]
    NoRecipients(String),
    /// No such thing.
    #[error("{0}")]
    NotFound(String),
    /// The thing belongs to another host or producer.
    #[error("{0}")]
    NotYours(String),
    /// The claim is not held by this instance and token.
    #[error("{0}")]
    StaleClaim(String),
    /// The delivery is not in a state that allows this.
    #[error("{0}")]
    InvalidTransition(String),
    /// The idempotency key was used with different content.
    #[error("{0}")]
    IdempotencyConflict(String),
    /// The report id was used with different content.
    #[error("{0}")]
    ReportConflict(String),
    /// Another instance of this host holds work.
    #[error("{0}")]
    InstanceConflict(String),
    /// A capacity bound is reached.
    #[error("{0}")]
    OverCapacity(String),
    /// The caller's certificate was revoked (found when re-checked inside a transaction).
    #[error("{0}")]
    CertificateRevoked(String),
    /// The caller may not do this here (a producer posting outside its publish scope).
    #[error("{0}")]
    Forbidden(String),
    /// SQLite failed (disk full, I/O error, busy past the timeout). Details are logged.
    #[error("storage error: {0}")]
    Storage(String),
}

impl StoreError {
    /// The API error code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::Invalid(_) => ErrorCode::InvalidField,
            StoreError::NoRecipients(_) => ErrorCode::NoRecipients,
            StoreError::NotFound(_) => ErrorCode::NotFound,
            StoreError::NotYours(_) => ErrorCode::NotYours,
            StoreError::StaleClaim(_) => ErrorCode::StaleClaim,
            StoreError::InvalidTransition(_) => ErrorCode::InvalidTransition,
            StoreError::IdempotencyConflict(_) => ErrorCode::IdempotencyConflict,
            StoreError::ReportConflict(_) => ErrorCode::ReportConflict,
            StoreError::InstanceConflict(_) => ErrorCode::InstanceConflict,
            StoreError::OverCapacity(_) => ErrorCode::OverCapacity,
            StoreError::CertificateRevoked(_) => ErrorCode::CertificateRevoked,
            StoreError::Forbidden(_) => ErrorCode::Forbidden,
            StoreError::Storage(_) => ErrorCode::StorageUnavailable,
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Storage(e.to_string())
    }
}

/// Shorthand for store results.
pub type StoreResult<T> = Result<T, StoreError>;

/// Opens the hub database for writing, applying migrations, with pragmas asserted.
pub fn open_write(path: &Path, synchronous: Synchronous) -> Result<Connection, OpenError> {
    let conn =
        sqlite::open(path, MIGRATIONS, OpenOptions { synchronous, create: true, read_only: false, check: true })?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    Ok(conn)
}

/// Prepared statements kept per connection. The store has a few dozen distinct statements and
/// one message's path alone uses more than rusqlite's default of 16; re-preparing them on every
/// call was measured to cost more than half of the store's time.
pub const STATEMENT_CACHE_CAPACITY: usize = 256;

/// Opens an existing hub database for reading only (no migrations; the schema must be current).
pub fn open_read(path: &Path) -> Result<Connection, OpenError> {
    let conn = sqlite::open(
        path,
        MIGRATIONS,
        OpenOptions { create: false, read_only: true, check: false, ..Default::default() },
    )?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    Ok(conn)
}

/// Runs `f` inside one `BEGIN IMMEDIATE` transaction on `conn`, committing only if it succeeds.
/// This is how the CLI (a separate process) writes; the hub's own writes go through `Writer`.
pub fn in_write_txn<R>(conn: &Connection, f: impl FnOnce(&Connection) -> StoreResult<R>) -> StoreResult<R> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    match f(conn) {
        Ok(r) => match conn.execute_batch("COMMIT") {
            Ok(()) => Ok(r),
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(e.into())
            }
        },
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// A random, unguessable token (122 bits), as 32 hex characters.
pub fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A new time-ordered id.
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

#[cfg(test)]
pub mod testing {
    //! A fresh store in a temp dir with a few enrolled hosts, for unit tests.
    use super::*;

    pub(crate) struct TestDb {
        pub(crate) conn: Connection,
        _dir: tempfile::TempDir,
    }

    pub(crate) fn db() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_write(&dir.path().join("hub.db"), Synchronous::Normal).unwrap();
        for h in ["host-a", "host-b", "host-c"] {
            operator::add_host(&conn, h, 0).unwrap();
        }
        TestDb { conn, _dir: dir }
    }
}
