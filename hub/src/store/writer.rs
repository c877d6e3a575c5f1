//! The single writer thread with group commit, and the pool of read connections.
//!
//! Invariant: only the writer thread touches the hub's write connection, and rusqlite never
//! runs on an async worker thread (readers run inside `spawn_blocking`).
//!
//! Group commit: the writer takes every job already waiting (up to `GROUP_COMMIT_JOBS_MAX`),
//! runs each in its own savepoint inside one `BEGIN IMMEDIATE` transaction, commits once (one
//! fsync), and only then answers each caller. A job that fails is rolled back to its savepoint
//! and does not disturb the others; a failed commit fails them all. Every job is counted in
//! `baton_hub_writer_jobs_total`. A batch made only of claims (`Writer::call_claims`) begins
//! with `Db::begin_claims` instead: on PostgreSQL claim transactions of several hubs then run at
//! once; any other job in the batch makes it an ordinary write transaction.
//!
//! Readers: at most `READERS_MAX` read connections, opened once and kept for the hub's life
//! (each with its prepared-statement cache, so a burst of reads parses no schema and prepares
//! no statement again); a read waits for a free connection rather than opening another.

use super::db::Db;
use super::{StoreError, StoreResult};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::{mpsc, oneshot};

/// Most jobs folded into one transaction.
pub const GROUP_COMMIT_JOBS_MAX: usize = 256;
/// Most jobs waiting for the writer before callers wait for room.
pub const WRITE_QUEUE_DEPTH: usize = 4096;
/// Most read connections open at once; each is kept once opened.
pub const READERS_MAX: usize = 8;

type Reply = Box<dyn FnOnce(StoreResult<()>) + Send>;
type Job = Box<dyn FnOnce(Option<&dyn Db>) -> (bool, Reply) + Send>;
/// A connection the writer or the reader pool owns.
pub type OwnedDb = Box<dyn Db + Send>;
/// Opens a new connection (the reader pool's, or the writer's after its connection broke).
pub type Opener = Box<dyn Fn() -> StoreResult<OwnedDb> + Send + Sync>;

/// A job waiting for the writer, and, for a job that runs claims and nothing else, the host
/// whose claim it is.
struct Queued {
    job: Job,
    claims: Option<String>,
}

/// Handle to the writer thread. Cloning shares the thread.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Queued>,
}

impl Writer {
    /// Starts the writer thread owning `conn`. The thread ends when every handle is dropped.
    pub fn start(conn: impl Db + Send + 'static) -> std::io::Result<Writer> {
        Writer::start_with(Box::new(conn), None)
    }

    /// Starts the writer thread owning `conn`; when a transaction fails on a connection that
    /// is gone (a database server restarted), `reopen` gives the next one.
    pub fn start_with(conn: OwnedDb, reopen: Option<Opener>) -> std::io::Result<Writer> {
        let (tx, rx) = mpsc::channel::<Queued>(WRITE_QUEUE_DEPTH);
        std::thread::Builder::new().name("baton-writer".into()).spawn(move || run(conn, reopen, rx))?;
        Ok(Writer { tx })
    }

    /// Runs `f` in the next write transaction and answers after that transaction committed.
    pub async fn call<R, F>(&self, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<R> + Send + 'static,
    {
        self.submit(f, None).await
    }

    /// `call` for a job that runs claims of `host` (`store::claim::claim_as` and reads) and
    /// writes nothing else: a batch of only such jobs begins with `Db::begin_claims` and runs
    /// them in host order, so claim transactions on several hubs take the hosts' row locks in
    /// one order and never wait for each other in a cycle.
    pub async fn call_claims<R, F>(&self, host: String, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<R> + Send + 'static,
    {
        self.submit(f, Some(host)).await
    }

    async fn submit<R, F>(&self, f: F, claims: Option<String>) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<R> + Send + 'static,
    {
        let (queued, answer) = Queued::new(f, claims);
        self.tx.send(queued).await.map_err(|_| StoreError::Storage("the writer has stopped".into()))?;
        answer.await.map_err(|_| StoreError::Storage("the writer has stopped".into()))?
    }
}

impl Queued {
    /// `f` as a job for the writer, and where its answer will come once its transaction ended.
    fn new<R, F>(f: F, claims: Option<String>) -> (Queued, oneshot::Receiver<StoreResult<R>>)
    where
        R: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<R> + Send + 'static,
    {
        let (otx, orx) = oneshot::channel::<StoreResult<R>>();
        let job: Job = Box::new(move |conn| {
            let Some(conn) = conn else {
                let reply: Reply = Box::new(move |_| {
                    let _ = otx.send(Err(StoreError::Storage("could not begin a write transaction".into())));
                });
                return (false, reply);
            };
            let result = match std::panic::catch_unwind(AssertUnwindSafe(|| f(conn))) {
                Ok(r) => r,
                Err(panic) => {
                    // A bug, not a storage failure: answered 500 `internal` (which nodes do not
                    // retry forever), and only this job is rolled back.
                    let message = panic_message(panic.as_ref());
                    tracing::error!(panic = %message, "a write job panicked; its changes are rolled back");
                    Err(StoreError::Internal(message))
                }
            };
            let ok = result.is_ok();
            let reply: Reply = Box::new(move |commit: StoreResult<()>| {
                let _ = otx.send(commit.and(result));
            });
            (ok, reply)
        });
        (Queued { job, claims }, orx)
    }
}

/// The text a panic was raised with (`panic!("…")` carries a `&str` or a `String`).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

fn run(mut conn: OwnedDb, reopen: Option<Opener>, mut rx: mpsc::Receiver<Queued>) {
    let mut jobs: Vec<Queued> = Vec::with_capacity(GROUP_COMMIT_JOBS_MAX);
    while let Some(first) = rx.blocking_recv() {
        jobs.push(first);
        while jobs.len() < GROUP_COMMIT_JOBS_MAX {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        run_batch(conn.as_ref(), &mut jobs);
        if conn.broken()
            && let Some(open) = &reopen
        {
            match open() {
                Ok(c) => {
                    tracing::info!("the writer's database connection was lost; reconnected");
                    conn = c;
                }
                Err(e) => tracing::error!(error = %e, "the writer's database connection was lost; reconnecting failed"),
            }
        }
    }
}

fn run_batch(conn: &dyn Db, jobs: &mut Vec<Queued>) {
    let started = std::time::Instant::now();
    metrics::histogram!("baton_hub_write_batch_jobs").record(jobs.len() as f64);
    metrics::counter!("baton_hub_writer_jobs_total").increment(jobs.len() as u64);
    let begun = if jobs.iter().all(|j| j.claims.is_some()) {
        jobs.sort_by(|a, b| a.claims.cmp(&b.claims));
        conn.begin_claims()
    } else {
        conn.begin_write()
    };
    if let Err(e) = begun {
        tracing::error!(error = %e, "cannot begin a write transaction");
        for Queued { job, .. } in jobs.drain(..) {
            let (_, reply) = job(None);
            reply(Err(StoreError::Storage(e.to_string())));
        }
        return;
    }
    let mut replies: Vec<Reply> = Vec::with_capacity(jobs.len());
    let mut poisoned: Option<String> = None;
    for Queued { job, .. } in jobs.drain(..) {
        if poisoned.is_some() {
            let (_, reply) = job(None);
            replies.push(reply);
            continue;
        }
        if let Err(e) = super::control(conn, "SAVEPOINT job") {
            poisoned = Some(e.to_string());
            let (_, reply) = job(None);
            replies.push(reply);
            continue;
        }
        let (ok, reply) = job(Some(conn));
        let rolled_back = if ok { Ok(()) } else { super::control(conn, "ROLLBACK TO job") };
        if let Err(e) = rolled_back.and_then(|()| super::control(conn, "RELEASE job")) {
            poisoned = Some(e.to_string());
        }
        replies.push(reply);
    }
    let outcome: StoreResult<()> = match poisoned {
        Some(e) => Err(StoreError::Storage(e)),
        None => super::control(conn, "COMMIT").map_err(StoreError::from),
    };
    if let Err(e) = &outcome {
        tracing::error!(error = %e, "write transaction failed; rolled back");
        let _ = conn.control("ROLLBACK");
    }
    metrics::histogram!("baton_hub_write_transaction_seconds").record(started.elapsed().as_secs_f64());
    if outcome.is_err() {
        metrics::counter!("baton_hub_write_transaction_failures_total").increment(1);
    }
    for reply in replies {
        reply(outcome.clone());
    }
}

/// A pool of long-lived read connections, used only inside `spawn_blocking`.
pub struct Readers {
    open: Opener,
    idle: Mutex<Vec<OwnedDb>>,
    /// One permit per connection that may be in use: at most `READERS_MAX`.
    permits: std::sync::Arc<tokio::sync::Semaphore>,
    /// Connections opened so far.
    opened: AtomicUsize,
}

impl Readers {
    /// A pool reading the database at `path`.
    pub fn new(path: PathBuf) -> Readers {
        Readers::with_opener(Box::new(move || {
            let conn = super::open_read(&path).map_err(|e| StoreError::Storage(e.to_string()))?;
            Ok(Box::new(conn) as OwnedDb)
        }))
    }

    /// A pool whose connections `open` makes.
    pub fn with_opener(open: Opener) -> Readers {
        Readers {
            open,
            idle: Mutex::new(Vec::new()),
            permits: std::sync::Arc::new(tokio::sync::Semaphore::new(READERS_MAX)),
            opened: AtomicUsize::new(0),
        }
    }

    /// How many read connections the pool has opened (each is kept; a failed one is replaced).
    pub fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }

    fn take(&self) -> StoreResult<OwnedDb> {
        let pooled = self.idle.lock().map_err(|_| StoreError::Storage("reader pool poisoned".into()))?.pop();
        match pooled {
            Some(c) => Ok(c),
            None => {
                let conn = (self.open)()?;
                self.opened.fetch_add(1, Ordering::Relaxed);
                Ok(conn)
            }
        }
    }

    fn give_back(&self, conn: OwnedDb) {
        // Never more than `READERS_MAX`: each one in use holds a permit.
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn);
        }
    }

    /// Runs a read-only `f` on a pooled connection off the async threads, waiting for a free
    /// connection when all `READERS_MAX` are in use.
    pub async fn read<R, F>(self: &std::sync::Arc<Self>, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<R> + Send + 'static,
    {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Storage("the reader pool is closed".into()))?;
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let conn = this.take()?;
            // One read transaction: every query in `f` sees the same snapshot.
            conn.begin_read()?;
            let r = f(conn.as_ref());
            // A read ends with a rollback: it changed nothing, and on PostgreSQL a failed
            // statement leaves the transaction unable to commit.
            if conn.control("ROLLBACK").is_ok() && !conn.broken() {
                this.give_back(conn);
            }
            r
        })
        .await
        .map_err(|e| match e.try_into_panic() {
            Ok(panic) => {
                let message = panic_message(panic.as_ref());
                tracing::error!(panic = %message, "a read job panicked");
                StoreError::Internal(message)
            }
            Err(_) => StoreError::Storage("the read task was cancelled".into()),
        })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_shared::sqlite::Synchronous;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_job_rolls_back_alone_and_others_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.db");
        let conn = crate::store::open_write(&path, Synchronous::Full).unwrap();
        let w = Writer::start(conn).unwrap();
        let mut calls = Vec::new();
        for i in 0..50i64 {
            let w = w.clone();
            calls.push(tokio::spawn(async move {
                w.call(move |c| {
                    c.execute(
                        "INSERT INTO operator_events (action, subject, operator, at) VALUES ('t', ?1, 'x', ?1)",
                        [i],
                    )?;
                    if i % 5 == 0 { Err(StoreError::Invalid("refused".into())) } else { Ok(i) }
                })
                .await
            }));
        }
        let mut ok = 0;
        for c in calls {
            if c.await.unwrap().is_ok() {
                ok += 1;
            }
        }
        assert_eq!(ok, 40);
        let readers = std::sync::Arc::new(Readers::new(path));
        let (n, bad): (i64, i64) = readers
            .read(|c| {
                Ok(c.query_row("SELECT count(*), count(*) FILTER (WHERE at % 5 = 0) FROM operator_events", [], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?)
            })
            .await
            .unwrap();
        assert_eq!((n, bad), (40, 0), "every successful job committed, no refused job left a row");
    }

    /// Jobs whose statements the database refuses (a unique key broken) roll back alone and the
    /// others commit, on either backend: on PostgreSQL a refused statement leaves the
    /// transaction in error until the job's `ROLLBACK TO`, which rides ahead of the next job's
    /// first statement.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_whose_statements_are_refused_roll_back_alone() {
        let (conn, _path, _dir) = crate::store::testing::owned_db();
        let w = Writer::start_with(conn, None).unwrap();
        w.call(|c| Ok(c.execute_batch("CREATE TEMP TABLE writer_probe (n INTEGER UNIQUE)")?)).await.unwrap();
        let mut calls = Vec::new();
        for i in 0..40i64 {
            let w = w.clone();
            calls.push(tokio::spawn(async move {
                w.call(move |c| Ok(c.execute("INSERT INTO writer_probe (n) VALUES (?1)", [i % 20])?)).await
            }));
        }
        let mut refused = 0;
        for c in calls {
            if c.await.unwrap().is_err() {
                refused += 1;
            }
        }
        assert_eq!(refused, 20, "each second insert of a number breaks the key");
        let kept: (i64, i64) = w
            .call(|c| {
                Ok(c.query_row("SELECT count(*), count(DISTINCT n) FROM writer_probe", [], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })?)
            })
            .await
            .unwrap();
        assert_eq!(kept, (20, 20), "every accepted insert committed, no refused one left a row");
    }

    /// An SQLite connection that records how each write transaction began.
    struct Recording {
        conn: rusqlite::Connection,
        begun: std::sync::Arc<Mutex<Vec<&'static str>>>,
    }

    impl Db for Recording {
        fn prepare_cached(&self, sql: &str) -> rusqlite::Result<super::super::db::Stmt<'_>> {
            Db::prepare_cached(&self.conn, sql)
        }
        fn execute_batch(&self, sql: &str) -> rusqlite::Result<()> {
            Db::execute_batch(&self.conn, sql)
        }
        fn control(&self, sql: &str) -> rusqlite::Result<()> {
            self.conn.control(sql)
        }
        fn begin_write(&self) -> rusqlite::Result<()> {
            self.begun.lock().unwrap().push("write");
            self.conn.begin_write()
        }
        fn begin_claims(&self) -> rusqlite::Result<()> {
            self.begun.lock().unwrap().push("claims");
            self.conn.begin_write()
        }
        fn begin_read(&self) -> rusqlite::Result<()> {
            self.conn.begin_read()
        }
        fn dialect(&self) -> super::super::db::Dialect {
            self.conn.dialect()
        }
        fn broken(&self) -> bool {
            false
        }
        fn sqlite(&self) -> Option<&rusqlite::Connection> {
            Some(&self.conn)
        }
    }

    /// Starts a job that keeps the writer busy until the sender is used; returns once it runs.
    async fn hold(w: &Writer) -> (std::sync::mpsc::Sender<()>, tokio::task::JoinHandle<StoreResult<()>>) {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (running, started) = oneshot::channel::<()>();
        let w = w.clone();
        let job = tokio::spawn(async move {
            w.call(move |_| {
                let _ = running.send(());
                held.recv().unwrap();
                Ok(())
            })
            .await
        });
        started.await.unwrap();
        (release, job)
    }

    /// A batch made only of claim jobs begins as a claim transaction and runs them in host
    /// order (one lock order for every hub); a batch with any other job begins as an ordinary
    /// write transaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_of_claims_only_begins_as_claims_in_host_order() {
        let dir = tempfile::tempdir().unwrap();
        let begun = std::sync::Arc::new(Mutex::new(Vec::new()));
        let conn = crate::store::open_write(&dir.path().join("hub.db"), Synchronous::Normal).unwrap();
        let w = Writer::start(Recording { conn, begun: begun.clone() }).unwrap();
        let order = std::sync::Arc::new(Mutex::new(Vec::<String>::new()));
        // Jobs sent while a first one holds the writer (in a batch of its own) are in its queue,
        // every one of them, when it is released: the next batch takes them all.
        let behind_a_held_job = |jobs: Vec<Queued>| {
            let w = w.clone();
            async move {
                let (release, first) = hold(&w).await;
                for job in jobs {
                    assert!(w.tx.send(job).await.is_ok());
                }
                release.send(()).unwrap();
                first.await.unwrap().unwrap();
            }
        };
        let claim = |host: &'static str| {
            let order = order.clone();
            Queued::new(
                move |_| {
                    order.lock().unwrap().push(host.to_string());
                    Ok(())
                },
                Some(host.to_string()),
            )
        };
        let (jobs, answers): (Vec<Queued>, Vec<_>) = ["host-c", "host-a", "host-b"].map(claim).into_iter().unzip();
        behind_a_held_job(jobs).await;
        for answer in answers {
            answer.await.unwrap().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["host-a", "host-b", "host-c"]);
        assert_eq!(*begun.lock().unwrap(), ["write", "claims"]);

        // A claim and another job queued together: one ordinary write transaction.
        let (a_claim, claimed) = claim("host-a");
        let (other, done) = Queued::new(|_| Ok(()), None);
        behind_a_held_job(vec![a_claim, other]).await;
        claimed.await.unwrap().unwrap();
        done.await.unwrap().unwrap();
        assert_eq!(*begun.lock().unwrap(), ["write", "claims", "write", "write"]);
    }

    /// A burst of reads far wider than the pool opens no more than `READERS_MAX` connections,
    /// and later bursts reuse them: no connection (schema, statements) is built per burst.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_connections_are_bounded_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.db");
        drop(crate::store::open_write(&path, Synchronous::Normal).unwrap());
        let readers = std::sync::Arc::new(Readers::new(path));
        for _ in 0..3 {
            let mut reads = Vec::new();
            for _ in 0..64 {
                let readers = readers.clone();
                reads.push(tokio::spawn(async move {
                    readers
                        .read(|c| {
                            std::thread::sleep(std::time::Duration::from_millis(2));
                            Ok(c.query_row("SELECT count(*) FROM deliveries", [], |r| r.get::<_, i64>(0))?)
                        })
                        .await
                }));
            }
            for r in reads {
                assert_eq!(r.await.unwrap().unwrap(), 0);
            }
        }
        let opened = readers.opened();
        assert!((1..=READERS_MAX).contains(&opened), "opened {opened}");
    }

    /// Regression: a panic inside a write job was answered as `Storage` (503
    /// `storage_unavailable`), which nodes retry forever. It is `Internal` (500 `internal`),
    /// carrying the panic message, and the other jobs of its batch still commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_job_is_an_internal_error_and_rolls_back_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.db");
        let w = Writer::start(crate::store::open_write(&path, Synchronous::Normal).unwrap()).unwrap();
        let insert = |c: &dyn Db, i: i64| {
            c.execute("INSERT INTO operator_events (action, subject, operator, at) VALUES ('t', ?1, 'x', ?1)", [i])
        };
        let (a, b, c) = tokio::join!(
            w.call(move |c| Ok(insert(c, 1)?)),
            w.call(move |c| -> StoreResult<usize> {
                insert(c, 2)?;
                panic!("the job's own bug")
            }),
            w.call(move |c| Ok(insert(c, 3)?)),
        );
        assert!((a.is_ok(), c.is_ok()) == (true, true), "{a:?} {c:?}");
        let e = b.unwrap_err();
        assert!(matches!(&e, StoreError::Internal(m) if m.contains("the job's own bug")), "{e:?}");
        assert_eq!(e.code(), baton_shared::error::ErrorCode::Internal);
        let readers = std::sync::Arc::new(Readers::new(path));
        let ats: Vec<i64> = readers
            .read(|c| {
                let mut s = c.prepare("SELECT at FROM operator_events ORDER BY at")?;
                Ok(s.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?)
            })
            .await
            .unwrap();
        assert_eq!(ats, vec![1, 3]);
    }
}
