//! `Store`: the one door to the hub's record, and how its operations reach it.
//!
//! The HTTP handlers, the background tasks, the status page, the metrics, the TLS revocation
//! look-ups and the CLI hold a `Store` and call one async method per operation the hub performs
//! (`submit`, `claim`, `ack`, `report`, `fence_set`, ...). Each operation's method stands at the
//! top of the module that does it (`accept`, `claim`, `report`, ...), above its synchronous
//! body; this module holds only the handle, its constructors, and `Conns`, the one way every
//! method reaches the record on either backend: a change is one job on the single writer thread
//! (`Writer`: group commit, one savepoint per job), a read is one read transaction on a pooled
//! connection (`Readers`), and a one-shot process (the CLI, a benchmark) uses one connection in
//! place. Arguments and results are plain Rust and wire types; errors are `StoreError`. No
//! caller sees a connection, a transaction or SQL, and no method names a backend: every
//! difference between SQLite and PostgreSQL is below `Db`, in the engine.
//!
//! Invariant: an operation that composes several steps (a session check, then the step; a
//! claim, then its cancel notices) runs them in one transaction, as one method.

use super::Readers;
use super::StoreError;
use super::StoreResult;
use super::Writer;
use super::engine::Db;
use super::engine::PgConn;
use super::engine::SqliteConnection as Connection;
use super::engine::SqliteFile;
use super::in_write_txn;
use super::writer::Opener;
use super::writer::OwnedDb;
use super::writer::SharedJob;
use baton_shared::clock::SharedClock;
use baton_shared::sqlite::Checkpointer;
use baton_shared::sqlite::OpenError;
use baton_shared::sqlite::Synchronous;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

/// The hub's record: one handle, cloned freely, behind which the backend lives.
#[derive(Clone)]
pub struct Store {
    /// How the operations reach the record.
    pub(super) conns: Conns,
    /// Whether the record is in PostgreSQL (shared by several hubs) rather than one SQLite file.
    postgres: bool,
    /// Wall-clock time for everything stored; read inside each change, as it runs.
    pub(super) clock: SharedClock,
}

/// How the operations reach the record, on either backend.
#[derive(Clone)]
pub(super) enum Conns {
    /// The hub: the single writer thread (group commit) and the pool of read connections.
    Served {
        /// The single writer.
        writer: Writer,
        /// Read connections.
        readers: Arc<Readers>,
        /// The SQLite file's checkpoints, off the writer thread (none on PostgreSQL).
        _checkpoints: Option<Arc<Checkpointer>>,
        /// How many times an operation that may meet a conflict (`StoreError::Conflict`) is run
        /// again (0 on SQLite, which has none).
        conflict_retries: u32,
    },
    /// A one-shot process (the CLI, a benchmark): one connection, used in place; each change
    /// is one `BEGIN IMMEDIATE` transaction (`in_write_txn`), each read runs as it comes. Never
    /// used inside the hub's runtime, whose threads must not wait on SQLite.
    Direct(Arc<Mutex<Connection>>),
}

impl Conns {
    /// Runs `f` in one write transaction (see `Writer::call`, `in_write_txn`).
    pub(super) async fn write<R, F>(&self, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<R> + Send + 'static,
    {
        match self {
            Conns::Served { writer, .. } => writer.call(f).await,
            Conns::Direct(conn) => in_write_txn(&*lock(conn)?, f),
        }
    }

    /// `write` for a job that may give hosts claimable work, which `gains` names from its
    /// result: the writer runs a claim standing for each of them in the same transaction (see
    /// `Writer::call_gaining`).
    pub(super) async fn write_gaining<R, F, G>(&self, f: F, gains: G) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<R> + Send + 'static,
        G: FnOnce(&R) -> Vec<String> + Send + 'static,
    {
        match self {
            Conns::Served { writer, .. } => writer.call_gaining(f, gains).await,
            Conns::Direct(conn) => in_write_txn(&*lock(conn)?, f),
        }
    }

    /// `write` for a job that claims for `host` and writes nothing else (see
    /// `Writer::call_claims`). Claims are the transactions that run at once on several hubs of
    /// one PostgreSQL record, and so may meet in a deadlock: a job the server ended to resolve
    /// one is run again (`again_after_conflicts`), in a new transaction.
    pub(super) async fn write_claims<R, F>(&self, host: String, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: Fn(&dyn Db) -> StoreResult<R> + Clone + Send + 'static,
    {
        match self {
            Conns::Served { writer, conflict_retries, .. } => {
                again_after_conflicts(*conflict_retries, || writer.call_claims(host.clone(), f.clone())).await
            }
            Conns::Direct(conn) => in_write_txn(&*lock(conn)?, f),
        }
    }

    /// `write` for a job of `kind` (see `Writer::call_shared`; `None`: an ordinary `write`): on
    /// PostgreSQL it runs at once with other hubs' claims and jobs of those kinds, and a job the
    /// server ended in a deadlock is run again (`again_after_conflicts`), in a new transaction.
    pub(super) async fn write_shared<R, F>(&self, kind: Option<SharedJob>, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: Fn(&dyn Db) -> StoreResult<R> + Clone + Send + 'static,
    {
        match (self, kind) {
            (Conns::Served { writer, conflict_retries, .. }, Some(kind)) => {
                again_after_conflicts(*conflict_retries, || writer.call_shared(kind, f.clone())).await
            }
            _ => self.write(f).await,
        }
    }

    /// Runs a read-only `f` (in one read transaction when served; see `Readers::read`).
    pub(super) async fn read<R, F>(&self, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<R> + Send + 'static,
    {
        match self {
            Conns::Served { readers, .. } => readers.read(f).await,
            Conns::Direct(conn) => f(&*lock(conn)?),
        }
    }
}

/// Runs `run` again while it fails with `StoreError::Conflict` (the server ended its
/// transaction in a deadlock or a serialization failure), at most `retries` more times, each
/// counted in `baton_hub_conflict_retries_total`; what it ends with is returned (a conflict
/// past the last retry is answered as storage unavailable). `run` must start a new transaction
/// each time.
pub(crate) async fn again_after_conflicts<R, Fut>(retries: u32, mut run: impl FnMut() -> Fut) -> StoreResult<R>
where
    Fut: std::future::Future<Output = StoreResult<R>>,
{
    let mut left = retries;
    loop {
        match run().await {
            Err(StoreError::Conflict(detail)) if left > 0 => {
                left -= 1;
                metrics::counter!("baton_hub_conflict_retries_total").increment(1);
                tracing::info!(error = %detail, retries_left = left, "the database ended a transaction in a conflict; running it again");
            }
            done => return done,
        }
    }
}

/// Why an operation of an SQLite file was asked of a PostgreSQL record.
pub(super) fn sqlite_only(operation: &str) -> StoreError {
    StoreError::Invalid(format!(
        "{operation} works on an SQLite record only; on PostgreSQL use the server's own tools (pg_dump, pg_amcheck)"
    ))
}

/// The SQLite file under `c`, for `operation`, which works on an SQLite file only.
pub(super) fn sqlite_file<'c>(c: &'c dyn Db, operation: &str) -> StoreResult<SqliteFile<'c>> {
    c.sqlite_file().ok_or_else(|| sqlite_only(operation))
}

/// The connection of a `Direct` store.
fn lock(conn: &Mutex<Connection>) -> StoreResult<std::sync::MutexGuard<'_, Connection>> {
    conn.lock().map_err(|_| StoreError::Internal("the connection's lock was poisoned by a panic".into()))
}

impl Store {
    /// The record in the SQLite file at `path`, served by a writer thread that owns `conn`
    /// (opened by `open_serve` or `open_write`), a pool of read connections, and a thread that
    /// checkpoints the file every `checkpoint_interval` (the hub's key of that name).
    pub fn sqlite(
        conn: Connection,
        path: &Path,
        checkpoint_interval: Duration,
        clock: SharedClock,
    ) -> std::io::Result<Store> {
        let checkpoints = Checkpointer::start(&conn, path, checkpoint_interval).map_err(std::io::Error::other)?;
        let writer = Writer::start(conn)?;
        let readers = Arc::new(Readers::new(path.to_path_buf()));
        let served = Conns::Served { writer, readers, _checkpoints: Some(Arc::new(checkpoints)), conflict_retries: 0 };
        Ok(Store { conns: served, postgres: false, clock })
    }

    /// The record in an SQLite file through the one connection `conn`, used in place (see
    /// `Conns::Direct`): for a one-shot process, never inside the hub.
    pub fn sqlite_direct(conn: Connection, clock: SharedClock) -> Store {
        Store { conns: Conns::Direct(Arc::new(Mutex::new(conn))), postgres: false, clock }
    }

    /// Opens the SQLite file at `path` for serving (`open_serve`: migrations applied, the file
    /// checked as `check` says, the whole-file check unless `startup_check` chose quick).
    pub fn open_serve(
        path: &Path,
        synchronous: Synchronous,
        check: baton_shared::sqlite::Check,
        checkpoint_interval: Duration,
        clock: SharedClock,
    ) -> anyhow::Result<Store> {
        let conn = super::open_serve(path, synchronous, check)?;
        Ok(Store::sqlite(conn, path, checkpoint_interval, clock)?)
    }

    /// Opens the SQLite file at `path` for changing (`open_write`: migrations applied, the
    /// file's structure checked) through one connection used in place: a changing CLI command,
    /// a benchmark.
    pub fn open_write(path: &Path, synchronous: Synchronous, clock: SharedClock) -> Result<Store, OpenError> {
        Ok(Store::sqlite_direct(super::open_write(path, synchronous)?, clock))
    }

    /// Opens the SQLite file at `path` to read only, through one connection used in place (its
    /// schema must be current; nothing is migrated). A change through it fails as storage.
    pub fn open_read(path: &Path, clock: SharedClock) -> Result<Store, OpenError> {
        Ok(Store::sqlite_direct(super::open_read(path)?, clock))
    }

    /// The record in the PostgreSQL database at `url`: connects (TLS as the URL says), applies
    /// the migrations (refusing a newer schema), and serves from it through a writer thread
    /// (group commit; each transaction first takes the record's write lock, shared by claim
    /// transactions and exclusive for every other, so several hubs' claims overlap and their
    /// other writes run one after another) and a pool of read connections. A connection the
    /// server dropped is replaced at the next transaction.
    pub async fn open_postgres(
        url: &crate::store::engine::postgres::PgUrl,
        clock: SharedClock,
    ) -> Result<Store, crate::store::engine::postgres::PgError> {
        crate::store::engine::postgres::connect_and_migrate(url).await?;
        let opener = |url: crate::store::engine::postgres::PgUrl| -> Opener {
            Box::new(move || {
                let conn = PgConn::connect(&url).map_err(|e| StoreError::Storage(e.to_string()))?;
                Ok(Box::new(conn) as OwnedDb)
            })
        };
        // The connections are made and used on the store's own threads (see `PgConn`).
        let (first, reopen, readers) = (opener(url.clone()), opener(url.clone()), opener(url.clone()));
        let conn = tokio::task::spawn_blocking(first)
            .await
            .map_err(|e| crate::store::engine::postgres::PgError::Other {
                url: url.shown().to_string(),
                detail: e.to_string(),
            })?
            .map_err(|e| crate::store::engine::postgres::PgError::Other {
                url: url.shown().to_string(),
                detail: e.to_string(),
            })?;
        let writer = Writer::start_with(conn, Some(reopen)).map_err(|e| {
            crate::store::engine::postgres::PgError::Other { url: url.shown().to_string(), detail: e.to_string() }
        })?;
        let readers = Arc::new(Readers::with_opener(readers));
        let conflict_retries = url.conflict_retries().unwrap_or(super::engine::PG_CONFLICT_RETRIES);
        let served = Conns::Served { writer, readers, _checkpoints: None, conflict_retries };
        Ok(Store { conns: served, postgres: true, clock })
    }

    /// Whether the record is in PostgreSQL (shared by several hubs) rather than one SQLite file.
    pub fn is_postgres(&self) -> bool {
        self.postgres
    }

    /// The schema version of the record: how many migrations it has.
    pub async fn schema_version(&self) -> StoreResult<i64> {
        self.conns.read(super::schema_version).await
    }

    /// The clock the store stamps changes with.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// The schema version of the SQLite file at `path`, opened to read only as it is (older
    /// schemas included: nothing is migrated or checked).
    pub fn file_schema_version(path: &Path) -> StoreResult<i64> {
        super::schema_version(&super::engine::open_as_is(path)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::By;
    use crate::store::lifecycle::accept::{AcceptLimits, Accepted, NewMessage, RetryPolicy};
    use crate::store::testing;
    use baton_shared::sqlite::CHECKPOINT_INTERVAL;

    /// A conflict is run again, at most `retries` more times; any other outcome, and the last
    /// conflict, is returned as it is.
    #[tokio::test]
    async fn conflicts_are_run_again_a_bounded_number_of_times() {
        let runs = std::sync::atomic::AtomicU32::new(0);
        let conflict_until = |ok_at: u32| {
            let runs = &runs;
            move || {
                let n = runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                async move { if n < ok_at { Err(StoreError::Conflict(format!("deadlock {n} (40P01)"))) } else { Ok(n) } }
            }
        };
        assert_eq!(again_after_conflicts(3, conflict_until(3)).await.unwrap(), 3, "two conflicts, then done");
        runs.store(0, std::sync::atomic::Ordering::Relaxed);
        let e = again_after_conflicts(3, conflict_until(u32::MAX)).await.unwrap_err();
        assert!(matches!(&e, StoreError::Conflict(m) if m.starts_with("deadlock 4")), "{e:?}");
        assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), 4, "the first run and three more");
        assert_eq!(e.code(), baton_shared::error::ErrorCode::StorageUnavailable);
        runs.store(0, std::sync::atomic::Ordering::Relaxed);
        assert!(again_after_conflicts(0, conflict_until(2)).await.is_err(), "none when the limit is 0");
        let other = again_after_conflicts(5, || async { Err::<(), _>(StoreError::Storage("gone".into())) }).await;
        assert!(matches!(other, Err(StoreError::Storage(_))), "only conflicts are run again");
    }

    fn message(key: &str) -> NewMessage {
        NewMessage {
            traceparent: None,
            producer: "p".into(),
            conversation: "c".into(),
            idempotency_key: key.into(),
            payload: "{}".into(),
            to: vec!["host-a".into()],
            pools: Vec::new(),
        }
    }

    /// The hub's way to the file (writer thread, read pool) and the CLI's (one connection in
    /// place) run the same operations to the same record.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn served_and_direct_stores_see_one_record() {
        let db = testing::db();
        let clock = baton_shared::clock::system();
        let limits = AcceptLimits { queued_per_host_max: 10, queued_per_pool_max: 10 };
        let conn = super::super::open_write(&db.path, Synchronous::Normal).unwrap();
        let served = Store::sqlite(conn, &db.path, CHECKPOINT_INTERVAL, clock.clone()).unwrap();
        let (accepted, deliveries) = served.submit(message("k"), RetryPolicy::default(), limits).await.unwrap();
        let Accepted::New { message_id, .. } = accepted else { panic!("not new: {accepted:?}") };
        assert_eq!(deliveries.len(), 1);
        let direct = Store::open_write(&db.path, Synchronous::Normal, clock.clone()).unwrap();
        let (again, _) =
            direct.send(message("k"), limits, By { operator: "op".into(), reason: "r".into() }).await.unwrap();
        assert!(matches!(again, Accepted::Duplicate { .. }), "{again:?}");
        assert_eq!(direct.message_by_id(message_id.clone()).await.unwrap().deliveries.len(), 1);
        assert_eq!(served.message_by_id(message_id).await.unwrap().deliveries.len(), 1);
    }

    /// The served store's checkpoints run on a thread of their own: what the writer commits
    /// reaches the database file although the writer, far below SQLite's 1,000 pages and its
    /// own bound, never checkpoints.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_served_store_checkpoints_off_the_writer_thread() {
        let db = testing::db();
        let conn = super::super::open_write(&db.path, Synchronous::Normal).unwrap();
        let served = Store::sqlite(conn, &db.path, CHECKPOINT_INTERVAL, baton_shared::clock::system()).unwrap();
        let len = || std::fs::metadata(&db.path).unwrap().len();
        let before = len();
        let limits = AcceptLimits { queued_per_host_max: 100, queued_per_pool_max: 100 };
        for i in 0..20 {
            // Each payload needs pages of its own, so the file must grow to hold them.
            let m = NewMessage { payload: format!("\"{}\"", "x".repeat(3000)), ..message(&format!("k{i}")) };
            served.submit(m, RetryPolicy::default(), limits).await.unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while len() < before + 20 * 3000 {
            assert!(std::time::Instant::now() < deadline, "nothing was checkpointed into the file ({} bytes)", len());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A store opened to read only refuses a change and keeps nothing of it.
    #[tokio::test]
    async fn a_store_opened_to_read_only_refuses_changes() {
        let db = testing::db();
        let clock = baton_shared::clock::system();
        let read_only = Store::open_read(&db.path, clock).unwrap();
        let limits = AcceptLimits { queued_per_host_max: 10, queued_per_pool_max: 10 };
        assert!(read_only.send(message("k"), limits, By { operator: "op".into(), reason: "r".into() }).await.is_err());
        assert_eq!(read_only.status().await.unwrap().pending_fanout, 0);
        assert!(read_only.message_id_by_key("p".into(), "k".into()).await.unwrap().is_none());
    }
}
