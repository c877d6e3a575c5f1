//! `PgConn`: one PostgreSQL connection as a `Db`, used synchronously like rusqlite.
//!
//! It owns a current-thread runtime on which its connection's I/O runs, and each call waits on
//! it. It is used only on the store's own threads (the writer, the reader pool's blocking
//! tasks), never on an async worker. Each statement is prepared as it is written (its `$N`
//! are PostgreSQL's own) and kept, by its text, in the connection's statement cache; values
//! are converted in `values`. A failure is classified by its SQLSTATE (`pg_error_kind`) and
//! carries the server's message and the statement (for logs).
//!
//! Savepoints cost no round trip of their own: `SAVEPOINT`, `RELEASE` and `ROLLBACK TO` are
//! kept and sent in the same round trip as the connection's next statement, pipelined ahead of
//! it (`PgConn::deferred`); the server runs them in order, so the result is the same, and a
//! failure of one of them is the error of that next call (at the latest the `COMMIT`, which
//! then fails and rolls everything back). A writer job's savepoint and a batch item's each were
//! a round trip before: about a third of the statements of a delivery.
//!
//! Writes whose answer no one reads (`Stmt::execute_unread`: an event appended, a counter moved)
//! are kept the same way, in order with the savepoint statements. Where they fail, the failure
//! must still be the failure of the part of the work they belong to, so a `RELEASE` with writes
//! waiting is not kept: it is sent with them at once, and a failure of any of them is the
//! failure of that `RELEASE` (the item's or the job's, whose caller then fails). A `ROLLBACK TO`
//! drops the waiting writes made after its savepoint instead of sending them: the server would
//! undo them anyway. Every round trip and every statement sent is counted
//! (`baton_hub_postgres_round_trips_total`, `baton_hub_postgres_statements_total`).

use super::values::{Cell, pg_params};
use crate::store::engine::sqlite::sqlite_error;
use crate::store::engine::{Db, DbError, DbErrorKind, DbResult, Dialect, Inner, SqliteFile, Stmt, Value};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use tokio_postgres::types::ToSql as PgToSql;

/// How the store must tell a PostgreSQL failure apart (see `DbErrorKind`), from its SQLSTATE
/// and whether the connection is gone.
pub fn pg_error_kind(code: Option<&str>, closed: bool) -> DbErrorKind {
    match code {
        Some("40001" | "40P01") => DbErrorKind::Conflict,
        Some(c) if c.starts_with("22") || c.starts_with("54") => DbErrorKind::BadValue,
        Some(c) if c.starts_with("23") => DbErrorKind::Constraint,
        Some("55P03") => DbErrorKind::Busy,
        _ if closed => DbErrorKind::Lost,
        _ => DbErrorKind::Other,
    }
}

fn pg_error(e: tokio_postgres::Error, sql: &str) -> DbError {
    let code = e.code().map(|c| c.code().to_string());
    let detail = match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    };
    let kind = pg_error_kind(code.as_deref(), e.is_closed());
    let statement = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    let statement: String = statement.chars().take(160).collect();
    DbError::from_server(kind, detail, Some(&statement), code)
}

/// The advisory lock every write transaction on PostgreSQL takes first: one writer at a time
/// across every hub, the rule the SQLite file's write lock gives one hub.
pub const WRITE_LOCK_KEY: i64 = 0x6261_746f_6e57; // "batonW"

/// Statements a `PgConn` keeps prepared.
pub const PG_STATEMENT_CACHE_MAX: usize = 512;

/// One statement prepared on PostgreSQL.
pub struct Prepared {
    stmt: tokio_postgres::Statement,
    /// The result's column names.
    pub(in crate::store::engine) columns: Vec<String>,
    /// The statement's text as PostgreSQL got it.
    sql: String,
}

/// What waits to be sent ahead of a connection's next call (see the module documentation).
enum Deferred {
    /// A savepoint statement (`SAVEPOINT x`, `RELEASE x`, `ROLLBACK TO x`).
    Control(String),
    /// A write whose answer no one reads.
    Write { prepared: Arc<Prepared>, values: Vec<Value> },
}

/// One PostgreSQL connection, used synchronously (see the module documentation).
pub struct PgConn {
    rt: OwnRuntime,
    /// Set when a round trip found no answer within `wait`: the connection is not used again.
    lost: std::cell::Cell<bool>,
    /// Longest wait for one round trip (`PG_CALL_WAIT_MAX` unless a test shortens it).
    wait: std::time::Duration,
    client: tokio_postgres::Client,
    cache: RefCell<HashMap<String, Arc<Prepared>>>,
    /// How long a write transaction may sit idle before the server ends it.
    write_idle: std::time::Duration,
    /// Savepoint statements and unread writes not sent yet, in order: they go ahead of the next
    /// call, in its round trip.
    deferred: RefCell<Vec<Deferred>>,
    /// The URL without its password, for messages.
    shown: String,
}

/// Longest wait for one round trip to PostgreSQL (a statement, a prepare, a transaction-control
/// statement). Past it the connection is taken as lost — a link that swallows traffic without
/// closing, which TCP alone may not notice for many minutes — and dropped: the operation fails
/// as storage unavailable (nodes retry) and the next one opens a new connection, instead of the
/// writer waiting forever. Far longer than any statement the store runs.
pub const PG_CALL_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// Longest a write transaction may sit idle on PostgreSQL (no statement in flight) before the
/// server ends it, unless the URL's `write_idle_timeout` says otherwise. A healthy writer sends
/// its next statement within microseconds; a hub that froze (stopped, swapped out) or lost its
/// link while holding the record's write lock would otherwise stop every hub's writes for
/// `PG_CALL_WAIT_MAX`. Read transactions keep the longer bound: an export may pause between
/// statements while it writes what it read.
pub const PG_WRITE_IDLE_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// How many times an operation is run again after PostgreSQL ended its transaction to resolve
/// a conflict with another (a deadlock, 40P01, or a serialization failure, 40001), unless the
/// URL's `conflict_retries` says otherwise: claims and holders' steps of several hubs run at
/// once (`begin_shared`) and may meet in a deadlock, which the server resolves by ending one of them. Past it the
/// operation fails as storage unavailable (which callers retry later).
pub const PG_CONFLICT_RETRIES: u32 = 8;

/// A `PgConn`'s own runtime. Dropped without waiting for its tasks (`shutdown_background`), so
/// a connection may be dropped anywhere, an async task included (the reader pool at shutdown).
struct OwnRuntime(Option<tokio::runtime::Runtime>);

/// The connection is gone: `said` says how.
fn closed(said: String) -> DbError {
    DbError::from_server(DbErrorKind::Lost, said, None, None)
}

impl OwnRuntime {
    /// Runs `f`, waiting at most `wait`; `lost` is set when it did not finish in time.
    fn block_on<F: std::future::Future>(
        &self,
        f: F,
        wait: std::time::Duration,
        lost: &std::cell::Cell<bool>,
    ) -> DbResult<F::Output> {
        let Some(rt) = &self.0 else { return Err(closed("the connection is closed".into())) };
        if lost.get() {
            return Err(closed("the connection was lost".into()));
        }
        match rt.block_on(async { tokio::time::timeout(wait, f).await }) {
            Ok(out) => Ok(out),
            Err(_) => {
                lost.set(true);
                Err(closed(format!("no answer within {wait:?}; the connection is taken as lost")))
            }
        }
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl PgConn {
    /// Begins a READ COMMITTED write transaction bounded by `write_idle` and takes the record's
    /// write lock with `lock` (`pg_advisory_xact_lock` or its `_shared` form).
    fn begin_locked(&self, lock: &str) -> DbResult<()> {
        // Nothing of an earlier transaction is left to send.
        self.deferred.borrow_mut().clear();
        Db::execute_batch(
            self,
            &format!(
                "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL idle_in_transaction_session_timeout = {}; \
                 SELECT {lock}({WRITE_LOCK_KEY})",
                self.write_idle.as_millis()
            ),
        )
    }

    /// Connects to `url` on a runtime of the new connection's own. Must not be called on an
    /// async worker thread.
    pub fn connect(
        url: &crate::store::engine::postgres::PgUrl,
    ) -> Result<PgConn, crate::store::engine::postgres::PgError> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| {
            crate::store::engine::postgres::PgError::Other {
                url: url.shown().to_string(),
                detail: format!("starting a runtime: {e}"),
            }
        })?;
        let wait = url.call_wait().unwrap_or(PG_CALL_WAIT_MAX);
        let other =
            |detail: String| crate::store::engine::postgres::PgError::Other { url: url.shown().to_string(), detail };
        // The whole connection (TCP, TLS, the start-up exchange) is one round trip's worth of
        // waiting too: a link that accepts and then swallows must not hold the caller (the
        // writer reconnecting) for ever.
        let client = rt
            .block_on(async { tokio::time::timeout(wait, crate::store::engine::postgres::connect(url)).await })
            .map_err(|_| other(format!("no answer within {wait:?} while connecting")))??;
        // A hub that loses its link mid-transaction must not hold the record's write lock (and
        // so every hub's writes) until the server notices: the server ends a transaction left
        // idle this long (a write transaction sooner: `begin_write`).
        let set = format!("SET idle_in_transaction_session_timeout = {}", wait.as_millis());
        rt.block_on(async { tokio::time::timeout(wait, client.batch_execute(&set)).await })
            .map_err(|_| other(format!("no answer within {wait:?} while connecting")))?
            .map_err(|e| other(e.to_string()))?;
        Ok(PgConn {
            rt: OwnRuntime(Some(rt)),
            lost: std::cell::Cell::new(false),
            wait,
            client,
            cache: RefCell::new(HashMap::new()),
            deferred: RefCell::new(Vec::new()),
            write_idle: url.write_idle().unwrap_or(PG_WRITE_IDLE_MAX),
            shown: url.shown().to_string(),
        })
    }

    /// The URL, without its password.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Runs `call` after the deferred statements, in the same round trip: all are sent before
    /// any answer is awaited, and the server runs them in order. The first failure among the
    /// deferred statements is the result (`call` then failed too: the transaction is in error).
    fn after_deferred<T, F>(&self, call: F, sql: &str) -> DbResult<T>
    where
        F: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        self.sent_after_deferred(call, sql, 1)
    }

    /// `after_deferred`, counting `call` as `own` statements (0 for `flush`, whose call sends
    /// nothing of its own).
    fn sent_after_deferred<T, F>(&self, call: F, sql: &str, own: u64) -> DbResult<T>
    where
        F: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let deferred = self.deferred.take();
        metrics::counter!("baton_hub_postgres_round_trips_total").increment(1);
        metrics::counter!("baton_hub_postgres_statements_total").increment(own + deferred.len() as u64);
        if deferred.is_empty() {
            return self.rt.block_on(call, self.wait, &self.lost)?.map_err(|e| pg_error(e, sql));
        }
        // Consecutive savepoint statements go as one simple query, as before writes were kept.
        let mut ahead: Vec<Ahead<'_>> = Vec::new();
        let mut controls = String::new();
        for d in &deferred {
            match d {
                Deferred::Control(c) => {
                    controls.push_str(c);
                    controls.push(';');
                }
                Deferred::Write { prepared, values } => {
                    if !controls.is_empty() {
                        ahead.push(self.simple(std::mem::take(&mut controls)));
                    }
                    ahead.push(Box::pin(async move {
                        let params = pg_params(values);
                        let params: Vec<&(dyn PgToSql + Sync)> =
                            params.iter().map(|p| p as &(dyn PgToSql + Sync)).collect();
                        self.client
                            .execute(&prepared.stmt, &params)
                            .await
                            .map(drop)
                            .map_err(|e| pg_error(e, &prepared.sql))
                    }));
                }
            }
        }
        if !controls.is_empty() {
            ahead.push(self.simple(controls));
        }
        let (ahead, out) = self.rt.block_on(in_order(ahead, call), self.wait, &self.lost)?;
        ahead.into_iter().collect::<DbResult<Vec<()>>>()?;
        out.map_err(|e| pg_error(e, sql))
    }

    /// `sql` sent as one simple query, failing with its own text.
    fn simple(&self, sql: String) -> Ahead<'_> {
        Box::pin(async move { self.client.batch_execute(&sql).await.map_err(|e| pg_error(e, &sql)) })
    }

    /// Keeps a write whose answer no one reads, to be sent ahead of the next call.
    pub(in crate::store::engine) fn execute_unread(&self, p: &Arc<Prepared>, values: Vec<Value>) {
        self.deferred.borrow_mut().push(Deferred::Write { prepared: p.clone(), values });
    }

    pub(in crate::store::engine) fn execute(&self, p: &Prepared, values: &[Value]) -> DbResult<usize> {
        let params = pg_params(values);
        let params: Vec<&(dyn PgToSql + Sync)> = params.iter().map(|p| p as &(dyn PgToSql + Sync)).collect();
        let n = self.after_deferred(self.client.execute(&p.stmt, &params), &p.sql)?;
        usize::try_from(n).map_err(|_| sqlite_error(rusqlite::Error::IntegralValueOutOfRange(0, i64::MAX)))
    }

    pub(in crate::store::engine) fn query(&self, p: &Prepared, values: &[Value]) -> DbResult<Vec<Vec<Value>>> {
        let params = pg_params(values);
        let params: Vec<&(dyn PgToSql + Sync)> = params.iter().map(|p| p as &(dyn PgToSql + Sync)).collect();
        let rows = self.after_deferred(self.client.query(&p.stmt, &params), &p.sql)?;
        rows.iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| row.try_get::<_, Cell>(i).map(|c| c.0).map_err(|e| pg_error(e, &p.sql)))
                    .collect()
            })
            .collect()
    }
}

impl Db for PgConn {
    fn prepare_cached(&self, sql: &str) -> DbResult<Stmt<'_>> {
        if let Some(p) = self.cache.borrow().get(sql) {
            return Ok(Stmt(Inner::Pg { conn: self, prepared: p.clone() }));
        }
        let stmt = self.after_deferred(self.client.prepare(sql), sql)?;
        let columns = stmt.columns().iter().map(|c| c.name().to_string()).collect();
        let prepared = Arc::new(Prepared { stmt, columns, sql: sql.to_string() });
        let mut cache = self.cache.borrow_mut();
        if cache.len() >= PG_STATEMENT_CACHE_MAX {
            cache.clear();
        }
        cache.insert(sql.to_string(), prepared.clone());
        Ok(Stmt(Inner::Pg { conn: self, prepared }))
    }
    fn execute_batch(&self, sql: &str) -> DbResult<()> {
        self.after_deferred(self.client.batch_execute(sql), sql)
    }
    fn control(&self, sql: &str) -> DbResult<()> {
        if let Some(kind) = savepoint_statement(sql) {
            let mut deferred = self.deferred.borrow_mut();
            let writes_wait = deferred.iter().any(|d| matches!(d, Deferred::Write { .. }));
            match kind {
                // Its writes' failures are its part of the work's: sent now, with them.
                Savepoint::Release if writes_wait => {
                    drop(deferred);
                    return Db::execute_batch(self, sql);
                }
                Savepoint::RollbackTo(name) => {
                    // The writes made since that savepoint are undone anyway: never sent. When
                    // the savepoint itself was sent already, every waiting write is younger.
                    let since = deferred
                        .iter()
                        .rposition(|d| matches!(d, Deferred::Control(c) if savepoint_statement(c) == Some(Savepoint::Make(name))))
                        .map_or(0, |at| at + 1);
                    let younger = deferred.split_off(since);
                    deferred.extend(younger.into_iter().filter(|d| matches!(d, Deferred::Control(_))));
                }
                _ => {}
            }
            deferred.push(Deferred::Control(sql.to_string()));
            return Ok(());
        }
        if sql.trim().eq_ignore_ascii_case("ROLLBACK") {
            // The whole transaction goes: its savepoints do not matter, and one that failed
            // must not keep the rollback from being sent.
            self.deferred.borrow_mut().clear();
        }
        Db::execute_batch(self, sql)
    }
    fn begin_write(&self) -> DbResult<()> {
        self.begin_locked("pg_advisory_xact_lock")
    }
    fn begin_shared(&self) -> DbResult<()> {
        self.begin_locked("pg_advisory_xact_lock_shared")
    }
    fn begin_read(&self) -> DbResult<()> {
        self.deferred.borrow_mut().clear();
        Db::execute_batch(self, "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    }
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }
    fn broken(&self) -> bool {
        self.lost.get() || self.client.is_closed()
    }
    fn sqlite_file(&self) -> Option<SqliteFile<'_>> {
        None
    }
    fn flush(&self) -> DbResult<()> {
        if !self.deferred.borrow().iter().any(|d| matches!(d, Deferred::Write { .. })) {
            return Ok(());
        }
        self.sent_after_deferred(async { Ok::<(), tokio_postgres::Error>(()) }, "(unread writes)", 0)
    }
}

/// A savepoint statement, with the savepoint's name as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Savepoint<'a> {
    /// `SAVEPOINT x`.
    Make(&'a str),
    /// `RELEASE x`.
    Release,
    /// `ROLLBACK TO x`.
    RollbackTo(&'a str),
}

/// Whether `sql` is a savepoint statement (`SAVEPOINT x`, `RELEASE x`, `ROLLBACK TO x`), which
/// `PgConn` sends ahead of the next call instead of on its own, and which.
fn savepoint_statement(sql: &str) -> Option<Savepoint<'_>> {
    let sql = sql.trim();
    let after = |prefix: &str| {
        let head = sql.get(..prefix.len())?;
        let name = sql[prefix.len()..].trim();
        (head.eq_ignore_ascii_case(prefix) && !name.is_empty()).then_some(name)
    };
    if let Some(name) = after("SAVEPOINT ") {
        Some(Savepoint::Make(name))
    } else if after("RELEASE ").is_some() {
        Some(Savepoint::Release)
    } else {
        after("ROLLBACK TO ").map(Savepoint::RollbackTo)
    }
}

/// A statement kept for the next round trip, on its way.
type Ahead<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = DbResult<()>> + 'a>>;

/// Runs `ahead` and then `call`, each first polled in that order, so their requests reach the
/// server in that order (tokio-postgres sends a request when its future is first polled), and
/// waits for all of them.
async fn in_order<T, F: std::future::Future<Output = T>>(mut ahead: Vec<Ahead<'_>>, call: F) -> (Vec<DbResult<()>>, T) {
    use std::task::Poll;
    let mut done: Vec<Option<DbResult<()>>> = ahead.iter().map(|_| None).collect();
    let mut call = std::pin::pin!(call);
    let mut out = None;
    let out = std::future::poll_fn(|cx| {
        for (f, d) in ahead.iter_mut().zip(done.iter_mut()) {
            if d.is_none()
                && let Poll::Ready(r) = f.as_mut().poll(cx)
            {
                *d = Some(r);
            }
        }
        if out.is_none()
            && let Poll::Ready(r) = call.as_mut().poll(cx)
        {
            out = Some(r);
        }
        match out.take_if(|_| done.iter().all(Option::is_some)) {
            Some(out) => Poll::Ready(out),
            None => Poll::Pending,
        }
    })
    .await;
    (done.into_iter().flatten().collect(), out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only savepoint statements are kept for the next round trip; `ROLLBACK` and `COMMIT` go
    /// at once.
    #[test]
    fn savepoint_statements_are_told_from_the_others() {
        assert_eq!(savepoint_statement("SAVEPOINT job"), Some(Savepoint::Make("job")));
        assert_eq!(savepoint_statement("release job"), Some(Savepoint::Release));
        assert_eq!(savepoint_statement("  ROLLBACK TO job"), Some(Savepoint::RollbackTo("job")));
        assert_eq!(savepoint_statement("Rollback To item"), Some(Savepoint::RollbackTo("item")));
        for sql in ["ROLLBACK", "COMMIT", "RELEASE", "SELECT 1", "SAVEPOINTS", ""] {
            assert_eq!(savepoint_statement(sql), None, "{sql}");
        }
    }

    /// PostgreSQL's failures are told apart by their SQLSTATE, and a lost connection by itself.
    #[test]
    fn postgres_failures_are_classified_by_their_sqlstate() {
        for (code, kind) in [
            ("40001", DbErrorKind::Conflict),
            ("40P01", DbErrorKind::Conflict),
            ("22021", DbErrorKind::BadValue),
            ("54000", DbErrorKind::BadValue),
            ("23505", DbErrorKind::Constraint),
            ("55P03", DbErrorKind::Busy),
            ("40002", DbErrorKind::Other),
            ("XX001", DbErrorKind::Other),
        ] {
            assert_eq!(pg_error_kind(Some(code), false), kind, "{code}");
        }
        assert_eq!(pg_error_kind(None, true), DbErrorKind::Lost);
        assert_eq!(pg_error_kind(None, false), DbErrorKind::Other);
    }
}
