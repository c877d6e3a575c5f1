//! The node store: one SQLite file (`data_dir/node.db`) holding the instance id, the mirrored
//! deliveries, the execution queue, attempts with durable start and end markers, and the
//! report outbox.
//!
//! Layout: this file opens the store (`Db`) and shares it (`Store`); the operations live with
//! their noun: `deliveries` (the mirror and its execution gate), `attempts` (the execution queue
//! and the start and end markers), `outbox` (reports until the hub confirms them), `retention`
//! (removing what the hub settled long ago), `summary` (what `baton-node status` shows).
//!
//! Invariant: one `Connection`, behind one `Mutex`, used only inside `spawn_blocking`
//! (`Store::call`); no lock is ever held across an `.await`.
//! Invariant: every state change is one `BEGIN IMMEDIATE` transaction guarded on the expected
//! current state, and the affected row count is checked.
//! Invariant (execution gate): `Db::begin_attempt` only starts an execution whose delivery is
//! `acked`, i.e. the hub confirmed `delivered`.
//! Invariant: an attempt's harness is released only after `Db::begin_attempt` committed its
//! start marker with its process group, so every attempt that may have had effects names the
//! group to stop.
//! Invariant: a stored value that does not parse (a state, a payload, a report body) is a
//! `StoreError::Corrupt` naming its row, never a default.

mod attempts;
mod deliveries;
mod outbox;
mod retention;
mod summary;

pub use attempts::{CancelLocal, Ending, ExecState, Folded, Interrupted, QueuedTurn, StartedTurn};
pub use deliveries::{LocalDelivery, LocalState, Mirrored};
pub use outbox::{OutboxEntry, ReportState};
pub use summary::{DeadReport, Gauges, LastSession, OpenDelivery, StoreSize, Summary};

use baton_shared::sqlite::{CHECKPOINT_INTERVAL, Checkpointer, OpenError, OpenOptions, Synchronous};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The node store's migrations, in order. Append-only.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../../schema/node/0001-create-node-store.sql"),
    include_str!("../../schema/node/0002-delivery-producer.sql"),
    include_str!("../../schema/node/0003-attempt-process-group.sql"),
    include_str!("../../schema/node/0004-settled-deliveries-index.sql"),
    include_str!("../../schema/node/0005-runs-and-cancel.sql"),
    include_str!("../../schema/node/0006-turn-bounds.sql"),
    include_str!("../../schema/node/0007-traceparent.sql"),
];

/// The reason recorded for an attempt found started but not ended at startup.
pub const REASON_RESTARTED: &str = "node restarted during execution";

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be opened (damaged, newer than this binary, bad pragma, ...).
    #[error(transparent)]
    Open(#[from] OpenError),
    /// SQLite failed.
    #[error("node store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A row breaks one of our own invariants, or holds a value that does not parse (a bug, or
    /// a file edited by hand). The message names the row.
    #[error("node store is inconsistent: {0}")]
    Corrupt(String),
    /// A guarded transition found the row in another state.
    #[error("node store: {0}")]
    Conflict(String),
    /// The blocking task running the store call failed.
    #[error("node store task failed: {0}")]
    Task(String),
}

impl StoreError {
    /// Whether this error means the store itself was refused (exit status 3): it could not be
    /// opened (damaged, newer than this binary, missing, unreadable), or a row in it is corrupt.
    pub fn is_refused(&self) -> bool {
        matches!(self, StoreError::Open(_) | StoreError::Corrupt(_))
    }

    /// A `Corrupt` error naming the row: `what` is the table and key, e.g. `delivery d1`.
    pub(crate) fn corrupt(what: impl std::fmt::Display, problem: impl std::fmt::Display) -> StoreError {
        StoreError::Corrupt(format!("{what}: {problem}"))
    }
}

/// The synchronous store operations on one connection.
pub struct Db {
    /// The store's checkpoints, off the thread that commits (none when read-only). Declared
    /// first so it stops before `conn` closes.
    _checkpoints: Option<Checkpointer>,
    conn: Connection,
}

/// Prepared statements kept on the store's connection. The hot path (mirror, gates, markers,
/// outbox) uses a few dozen distinct statements, more than rusqlite's default of 16; a
/// statement that falls out of the cache is parsed again on its next use.
pub const STATEMENT_CACHE_CAPACITY: usize = 128;

impl Db {
    /// Opens (creating and migrating when needed) the store for writing.
    pub fn open(path: &Path, synchronous: Synchronous) -> Result<Db, StoreError> {
        Db::open_checkpointed(path, synchronous, CHECKPOINT_INTERVAL)
    }

    /// As `open`, checkpointing every `checkpoint_interval` (the node's `checkpoint_interval`).
    pub fn open_checkpointed(
        path: &Path,
        synchronous: Synchronous,
        checkpoint_interval: std::time::Duration,
    ) -> Result<Db, StoreError> {
        let conn = baton_shared::sqlite::open(path, MIGRATIONS, OpenOptions { synchronous, ..OpenOptions::default() })?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
        let checkpoints = Checkpointer::start(&conn, path, checkpoint_interval)?;
        Ok(Db { _checkpoints: Some(checkpoints), conn })
    }

    /// Opens an existing store read-only (for `status`).
    pub fn open_read_only(path: &Path) -> Result<Db, StoreError> {
        let opts = OpenOptions { read_only: true, create: false, ..OpenOptions::default() };
        Ok(Db { _checkpoints: None, conn: baton_shared::sqlite::open(path, MIGRATIONS, opts)? })
    }

    /// The instance id, created (UUID v4) and stored on first call for this store.
    pub fn instance_id(&mut self) -> Result<String, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let found: Option<String> = tx
            .prepare_cached("SELECT value FROM meta WHERE key = 'instance_id'")?
            .query_row([], |r| r.get(0))
            .optional()?;
        let id = match found {
            Some(id) => id,
            None => {
                let id = uuid::Uuid::new_v4().to_string();
                tx.prepare_cached("INSERT INTO meta(key, value) VALUES ('instance_id', ?1)")?.execute([&id])?;
                id
            }
        };
        tx.commit()?;
        baton_shared::ids::check_token("instance_id", &id).map_err(|e| StoreError::corrupt("meta instance_id", e))?;
        Ok(id)
    }

    /// Records the session this process registered with the hub (for `status`): its number,
    /// when, and the session it took over, if any.
    pub fn record_session(&mut self, session: u64, took_over: Option<u64>, now_ms: i64) -> Result<(), StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let took_over = took_over.map(|t| t.to_string());
        for (key, value) in [
            ("session", Some(session.to_string())),
            ("session_started_at_ms", Some(now_ms.to_string())),
            ("session_took_over", took_over),
            ("session_ended", None),
        ] {
            match value {
                Some(v) => tx.prepare_cached("INSERT INTO meta(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value")?.execute((key, v))?,
                None => tx.prepare_cached("DELETE FROM meta WHERE key = ?1")?.execute([key])?,
            };
        }
        tx.commit()?;
        Ok(())
    }

    /// Records why this node claims nothing new (`None`: it claims again), for `status`.
    pub fn record_claims_paused(&mut self, why: Option<&str>) -> Result<(), StoreError> {
        match why {
            Some(v) => self
                .conn
                .prepare_cached(
                    "INSERT INTO meta(key, value) VALUES ('claims_paused', ?1)
                     ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                )?
                .execute([v])?,
            None => self.conn.prepare_cached("DELETE FROM meta WHERE key = 'claims_paused'")?.execute([])?,
        };
        Ok(())
    }

    /// Records how this process's session ended (`clean`, `superseded`).
    pub fn record_session_end(&mut self, how: &str) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO meta(key, value) VALUES ('session_ended', ?1)
             ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            )?
            .execute([how])?;
        Ok(())
    }

    /// The underlying connection, for tests that inspect rows directly.
    #[cfg(test)]
    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }
}

/// The shared, async face of the store: one `Db` behind one mutex, used only on blocking
/// threads.
#[derive(Clone)]
pub struct Store {
    db: Arc<Mutex<Db>>,
}

impl Store {
    /// Wraps an open `Db`.
    pub fn new(db: Db) -> Store {
        Store { db: Arc::new(Mutex::new(db)) }
    }

    /// Runs `f` on a blocking thread with the store locked. The lock never crosses an `.await`.
    pub async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Db) -> Result<T, StoreError> + Send + 'static,
    {
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || {
            let mut guard = db.lock().map_err(|_| StoreError::Task("store mutex poisoned by a panic".into()))?;
            f(&mut guard)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }
}

#[cfg(test)]
pub(crate) mod tests;
