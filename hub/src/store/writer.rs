//! The single writer thread with group commit (the reader pool is `readers`).
//!
//! Invariant: only the writer thread touches the hub's write connection, and no connection (an
//! SQLite one or a `PgConn`) is used on an async worker thread.
//!
//! Group commit: the writer takes every job already waiting (up to `GROUP_COMMIT_JOBS_MAX`),
//! runs each in its own savepoint inside one `BEGIN IMMEDIATE` transaction, commits once (one
//! fsync), and only then answers each caller. A job that fails is rolled back to its savepoint
//! and does not disturb the others; a failed commit fails them all. Every job is counted in
//! `baton_hub_writer_jobs_total`. A batch made only of claims (`Writer::call_claims`) and
//! holders' handoff steps, starts and reports (`Writer::call_shared`, `SharedJob`) begins with
//! `Db::begin_shared` instead: on PostgreSQL such transactions of several hubs then
//! run at once; any other job in the batch makes it an ordinary write transaction.
//!
//! Standing claims: a long-poll claim with nothing to claim leaves its job with the writer
//! (`Writer::stand_claim`). A job that gives hosts claimable work names them (`Writer::call_gaining`:
//! an accept's fan-out); after the batch's jobs, in the same transaction, the writer runs the
//! oldest standing claim of each host so named, each in its own savepoint, and answers it after
//! the one commit. The waiting claim gets the new work without a wake-up, a look and a
//! transaction of its own. Only when no other job waits: a busy writer commits again soon, and
//! a claim woken the usual way then takes what those commits add as well. A claim the writer
//! has not taken can be withdrawn (its wait ended, its request went away); one it took is
//! answered like any job.
//!
//! Why one file over 700 lines: the writer is about 410 lines; the rest is its tests (group
//! commit, jobs refused alone, shared batches, standing claims), which read beside the loop
//! they hold.

use super::engine::Db;
use super::{StoreError, StoreResult};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

/// Most jobs folded into one transaction.
pub const GROUP_COMMIT_JOBS_MAX: usize = 256;
/// Most jobs waiting for the writer before callers wait for room.
pub const WRITE_QUEUE_DEPTH: usize = 4096;

type Reply = Box<dyn FnOnce(StoreResult<()>) + Send>;
/// What running a job gave: whether it succeeded (else it is rolled back to its savepoint),
/// the hosts it gave claimable work (see `Writer::call_gaining`), and its answer, sent once
/// the transaction ended.
type Ran = (bool, Vec<String>, Reply);
type Job = Box<dyn FnOnce(Option<&dyn Db>) -> Ran + Send>;
/// Names the hosts a job's result gave claimable work.
type Gains<R> = Box<dyn FnOnce(&R) -> Vec<String> + Send>;
/// A connection the writer or the reader pool owns.
pub type OwnedDb = Box<dyn Db + Send>;
/// Opens a new connection (the reader pool's, or the writer's after its connection broke).
pub type Opener = Box<dyn Fn() -> StoreResult<OwnedDb> + Send + Sync>;

/// A job waiting for the writer, and, for a job that may share the record's write lock, which
/// kind it is.
struct Queued {
    /// When it was queued (`baton_hub_write_queue_wait_seconds`).
    at: std::time::Instant,
    job: Job,
    shared: Option<Shared>,
}

/// A job that may run under the record's write lock in shared mode (`Db::begin_shared`), beside
/// the same kinds of jobs of other hubs: what it writes is kept apart from theirs by row locks.
/// The order is the order a batch of them runs in (one lock order for every hub): claims by
/// host, then holders' steps, then starts, then reports.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Shared {
    /// Claims of this host, and reads (`store::lifecycle::claim`).
    Claims(String),
    /// Jobs of one of the other kinds.
    Job(SharedJob),
}

/// The kinds of jobs besides claims that may share the record's write lock (`Writer::call_shared`),
/// in the order a batch runs them, after its claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SharedJob {
    /// Holders' handoff steps, claimed → mirrored → delivered, and reads: the guarded update of
    /// each delivery row the holder names and its events, nothing else
    /// (`store::lifecycle::handoff`: mirrored, ack, handoff).
    HolderSteps,
    /// Starts of delivered runs, and reads: the start recorded on each delivery row
    /// (`started_session`) and the session's lease renewed, nothing else
    /// (`store::lifecycle::turns::start`: `POST /v1/starts`).
    Starts,
    /// Reports of runs' outcomes by a host without a breaker to trip, and reads: each run's
    /// delivery row locked first (`store::lifecycle::report`).
    Reports,
}

/// Handle to the writer thread. Cloning shares the thread.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Queued>,
    standing: Arc<Standing>,
}

/// The claims standing with the writer, by host, oldest first, each with its number.
#[derive(Default)]
struct Standing {
    next: AtomicU64,
    by_host: Mutex<HashMap<String, Vec<(u64, Job)>>>,
}

impl Standing {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(u64, Job)>>> {
        self.by_host.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the oldest standing claim of each host in `hosts` (sorted, without repeats).
    fn take(&self, hosts: &[String]) -> Vec<Job> {
        let mut by_host = self.lock();
        let mut taken = Vec::new();
        for host in hosts {
            if let Some(waiting) = by_host.get_mut(host) {
                if !waiting.is_empty() {
                    taken.push(waiting.remove(0).1);
                }
                if waiting.is_empty() {
                    by_host.remove(host);
                }
            }
        }
        taken
    }

    /// Removes claim `id` of `host`; false when the writer took it (or it was removed before).
    fn withdraw(&self, host: &str, id: u64) -> bool {
        let mut by_host = self.lock();
        let Some(waiting) = by_host.get_mut(host) else { return false };
        let Some(at) = waiting.iter().position(|(n, _)| *n == id) else { return false };
        drop(waiting.remove(at));
        if waiting.is_empty() {
            by_host.remove(host);
        }
        true
    }
}

/// A claim standing with the writer (`Writer::stand_claim`). Dropping it withdraws it unless
/// the writer took it.
pub struct StandingClaim<R> {
    standing: Arc<Standing>,
    host: String,
    id: u64,
    answer: oneshot::Receiver<StoreResult<R>>,
}

impl<R> StandingClaim<R> {
    /// The claim's answer, once a job that gave its host work committed with it.
    pub async fn answer(&mut self) -> StoreResult<R> {
        (&mut self.answer).await.map_err(|_| StoreError::Storage("the writer has stopped".into()))?
    }

    /// Withdraws the claim. `None` when it never ran; otherwise the writer took it, and its
    /// answer (which may still be on its way) is returned.
    pub async fn withdraw(mut self) -> Option<StoreResult<R>> {
        if self.standing.withdraw(&self.host, self.id) {
            return None;
        }
        Some(self.answer().await)
    }
}

impl<R> Drop for StandingClaim<R> {
    fn drop(&mut self) {
        self.standing.withdraw(&self.host, self.id);
    }
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
        let standing = Arc::new(Standing::default());
        let theirs = standing.clone();
        std::thread::Builder::new().name("baton-writer".into()).spawn(move || run(conn, reopen, rx, &theirs))?;
        Ok(Writer { tx, standing })
    }

    /// Runs `f` in the next write transaction and answers after that transaction committed.
    pub async fn call<R, F>(&self, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<R> + Send + 'static,
    {
        self.submit(Queued::new(f, None, None)).await
    }

    /// `call` for a job that may give hosts claimable work: `gains` names them from its
    /// result, and the oldest standing claim of each runs after it in the same transaction.
    pub async fn call_gaining<R, F, G>(&self, f: F, gains: G) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<R> + Send + 'static,
        G: FnOnce(&R) -> Vec<String> + Send + 'static,
    {
        self.submit(Queued::new(f, None, Some(Box::new(gains)))).await
    }

    /// Leaves a claim of `host` (`f`, as `call_claims` would run it) with the writer, to run in
    /// the transaction of the next job that gives `host` claimable work.
    pub fn stand_claim<R, F>(&self, host: String, f: F) -> StandingClaim<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<R> + Send + 'static,
    {
        let (Queued { job, .. }, answer) = Queued::new(f, None, None);
        let id = self.standing.next.fetch_add(1, Ordering::Relaxed);
        self.standing.lock().entry(host.clone()).or_default().push((id, job));
        StandingClaim { standing: self.standing.clone(), host, id, answer }
    }

    /// `call` for a job that runs claims of `host` (`store::lifecycle::claim::claim_as` and reads) and
    /// writes nothing else: a batch of only such jobs begins with `Db::begin_shared` and runs
    /// them in host order, so claim transactions on several hubs take the hosts' row locks in
    /// one order and never wait for each other in a cycle.
    pub async fn call_claims<R, F>(&self, host: String, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<R> + Send + 'static,
    {
        self.submit(Queued::new(f, Some(Shared::Claims(host)), None)).await
    }

    /// `call` for a job of `kind` that writes nothing else (see `SharedJob`): it may share a
    /// batch begun with `Db::begin_shared` with claims and the other kinds, after the claims.
    pub async fn call_shared<R, F>(&self, kind: SharedJob, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<R> + Send + 'static,
    {
        self.submit(Queued::new(f, Some(Shared::Job(kind)), None)).await
    }

    async fn submit<R>(&self, (queued, answer): (Queued, oneshot::Receiver<StoreResult<R>>)) -> StoreResult<R> {
        self.tx.send(queued).await.map_err(|_| StoreError::Storage("the writer has stopped".into()))?;
        answer.await.map_err(|_| StoreError::Storage("the writer has stopped".into()))?
    }
}

impl Queued {
    /// `f` as a job for the writer, and where its answer will come once its transaction ended;
    /// `gains` names the hosts a successful result gave claimable work.
    fn new<R, F>(f: F, shared: Option<Shared>, gains: Option<Gains<R>>) -> (Queued, oneshot::Receiver<StoreResult<R>>)
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
                return (false, Vec::new(), reply);
            };
            let result = match std::panic::catch_unwind(AssertUnwindSafe(|| f(conn))) {
                // A write the job left unread fails the job, not the next one.
                Ok(r) => r.and_then(|v| conn.flush().map(|()| v).map_err(StoreError::from)),
                Err(panic) => {
                    // A bug, not a storage failure: answered 500 `internal` (which nodes do not
                    // retry forever), and only this job is rolled back.
                    let message = panic_message(panic.as_ref());
                    tracing::error!(panic = %message, "a write job panicked; its changes are rolled back");
                    Err(StoreError::Internal(message))
                }
            };
            let ok = result.is_ok();
            let gained = match (&result, gains) {
                (Ok(r), Some(gains)) => gains(r),
                _ => Vec::new(),
            };
            let reply: Reply = Box::new(move |commit: StoreResult<()>| {
                let _ = otx.send(commit.and(result));
            });
            (ok, gained, reply)
        });
        (Queued { at: std::time::Instant::now(), job, shared }, orx)
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

fn run(mut conn: OwnedDb, reopen: Option<Opener>, mut rx: mpsc::Receiver<Queued>, standing: &Standing) {
    let mut jobs: Vec<Queued> = Vec::with_capacity(GROUP_COMMIT_JOBS_MAX);
    while let Some(first) = rx.blocking_recv() {
        jobs.push(first);
        while jobs.len() < GROUP_COMMIT_JOBS_MAX {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        run_batch(conn.as_ref(), &mut jobs, standing, &rx);
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

fn run_batch(conn: &dyn Db, jobs: &mut Vec<Queued>, standing: &Standing, queue: &mpsc::Receiver<Queued>) {
    let started = std::time::Instant::now();
    for j in jobs.iter() {
        metrics::histogram!("baton_hub_write_queue_wait_seconds").record(started.duration_since(j.at).as_secs_f64());
    }
    metrics::histogram!("baton_hub_write_batch_jobs").record(jobs.len() as f64);
    metrics::counter!("baton_hub_writer_jobs_total").increment(jobs.len() as u64);
    let begun = if jobs.iter().all(|j| j.shared.is_some()) {
        jobs.sort_by(|a, b| a.shared.cmp(&b.shared));
        conn.begin_shared()
    } else {
        conn.begin_write()
    };
    if let Err(e) = begun {
        tracing::error!(error = %e, "cannot begin a write transaction");
        for Queued { job, .. } in jobs.drain(..) {
            let (_, _, reply) = job(None);
            reply(Err(StoreError::Storage(e.to_string())));
        }
        return;
    }
    let mut replies: Vec<Reply> = Vec::with_capacity(jobs.len());
    let mut poisoned: Option<String> = None;
    let mut gained: Vec<String> = Vec::new();
    for Queued { job, .. } in jobs.drain(..) {
        gained.extend(run_job(conn, job, &mut poisoned, &mut replies));
    }
    // The claims standing for the hosts these jobs gave work, after them, in their transaction.
    // Only when no job came in meanwhile: a writer with work queued commits again soon, and a
    // claim woken the usual way then takes what those commits add too (larger claim batches
    // under load); an idle one answers the claim at once.
    if poisoned.is_none() && !gained.is_empty() && queue.is_empty() {
        gained.sort_unstable();
        gained.dedup();
        let taken = standing.take(&gained);
        metrics::counter!("baton_hub_writer_jobs_total").increment(taken.len() as u64);
        metrics::counter!("baton_hub_claims_at_commit_total").increment(taken.len() as u64);
        for job in taken {
            run_job(conn, job, &mut poisoned, &mut replies);
        }
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

/// Runs one job of the open transaction in its own savepoint (or, once the transaction is
/// `poisoned`, only fails it), keeps its answer in `replies`, and returns the hosts it gave
/// work.
fn run_job(conn: &dyn Db, job: Job, poisoned: &mut Option<String>, replies: &mut Vec<Reply>) -> Vec<String> {
    if poisoned.is_some() {
        let (_, _, reply) = job(None);
        replies.push(reply);
        return Vec::new();
    }
    if let Err(e) = super::control(conn, "SAVEPOINT job") {
        *poisoned = Some(e.to_string());
        let (_, _, reply) = job(None);
        replies.push(reply);
        return Vec::new();
    }
    let (ok, gained, reply) = job(Some(conn));
    let rolled_back = if ok { Ok(()) } else { super::control(conn, "ROLLBACK TO job") };
    if let Err(e) = rolled_back.and_then(|()| super::control(conn, "RELEASE job")) {
        *poisoned = Some(e.to_string());
    }
    replies.push(reply);
    if ok { gained } else { Vec::new() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Readers;
    use crate::store::engine::DbResult;
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
                        "INSERT INTO operator_events (action, subject, operator, at) VALUES ('t', $1, 'x', $1)",
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
        refused_jobs_roll_back_alone(false).await;
    }

    /// The same with the insert left unread: on PostgreSQL it is sent after the job's last
    /// statement, and its refusal still fails that job, not the one after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_whose_unread_write_is_refused_fails_alone() {
        refused_jobs_roll_back_alone(true).await;
    }

    /// 40 jobs each insert a number, every number twice under a unique key: 20 must fail, and
    /// exactly the 20 others commit.
    async fn refused_jobs_roll_back_alone(unread: bool) {
        let (conn, _path, _dir) = crate::store::testing::owned_db();
        let w = Writer::start_with(conn, None).unwrap();
        w.call(|c| Ok(c.execute_batch("CREATE TEMP TABLE writer_probe (n INTEGER UNIQUE)")?)).await.unwrap();
        let mut calls = Vec::new();
        for i in 0..40i64 {
            let w = w.clone();
            calls.push(tokio::spawn(async move {
                w.call(move |c| {
                    let mut insert = c.prepare("INSERT INTO writer_probe (n) VALUES ($1)")?;
                    if unread {
                        insert.execute_unread([i % 20])?
                    } else {
                        insert.execute([i % 20]).map(drop)?
                    }
                    Ok(())
                })
                .await
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
        conn: crate::store::engine::SqliteConnection,
        begun: std::sync::Arc<Mutex<Vec<&'static str>>>,
    }

    impl Db for Recording {
        fn prepare_cached(&self, sql: &str) -> DbResult<super::super::engine::Stmt<'_>> {
            Db::prepare_cached(&self.conn, sql)
        }
        fn execute_batch(&self, sql: &str) -> DbResult<()> {
            Db::execute_batch(&self.conn, sql)
        }
        fn control(&self, sql: &str) -> DbResult<()> {
            self.conn.control(sql)
        }
        fn begin_write(&self) -> DbResult<()> {
            self.begun.lock().unwrap().push("write");
            self.conn.begin_write()
        }
        fn begin_shared(&self) -> DbResult<()> {
            self.begun.lock().unwrap().push("shared");
            self.conn.begin_write()
        }
        fn begin_read(&self) -> DbResult<()> {
            self.conn.begin_read()
        }
        fn dialect(&self) -> super::super::engine::Dialect {
            self.conn.dialect()
        }
        fn broken(&self) -> bool {
            false
        }
        fn sqlite_file(&self) -> Option<crate::store::engine::SqliteFile<'_>> {
            self.conn.sqlite_file()
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

    /// A writer on a new record whose connection notes how each write transaction began (kept
    /// while the directory lives).
    fn recording_writer() -> (Writer, std::sync::Arc<Mutex<Vec<&'static str>>>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let begun = std::sync::Arc::new(Mutex::new(Vec::new()));
        let conn = crate::store::open_write(&dir.path().join("hub.db"), Synchronous::Normal).unwrap();
        (Writer::start(Recording { conn, begun: begun.clone() }).unwrap(), begun, dir)
    }

    /// A batch made only of claim jobs, holders' steps, starts and reports begins shared and runs
    /// the claims in host order, then the holders' steps, the starts and the reports (one lock
    /// order for every hub); a batch with any other job begins as an ordinary write transaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_of_shared_jobs_only_begins_shared_claims_first_in_host_order() {
        let (w, begun, _dir) = recording_writer();
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
        let noting = |what: &'static str, shared: Option<Shared>| {
            let order = order.clone();
            Queued::new(
                move |_| {
                    order.lock().unwrap().push(what.to_string());
                    Ok(())
                },
                shared,
                None,
            )
        };
        let claim = |host: &'static str| noting(host, Some(Shared::Claims(host.to_string())));
        let steps = || noting("steps", Some(Shared::Job(SharedJob::HolderSteps)));
        let starts = || noting("starts", Some(Shared::Job(SharedJob::Starts)));
        let reports = || noting("reports", Some(Shared::Job(SharedJob::Reports)));
        let (jobs, answers): (Vec<Queued>, Vec<_>) =
            [reports(), starts(), steps(), claim("host-c"), claim("host-a"), steps(), claim("host-b")]
                .into_iter()
                .unzip();
        behind_a_held_job(jobs).await;
        for answer in answers {
            answer.await.unwrap().unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["host-a", "host-b", "host-c", "steps", "steps", "starts", "reports"]);
        assert_eq!(*begun.lock().unwrap(), ["write", "shared"]);

        // Holders' steps alone, starts alone, reports alone: shared too.
        for alone in [steps(), starts(), reports()] {
            let (alone, answered) = alone;
            behind_a_held_job(vec![alone]).await;
            answered.await.unwrap().unwrap();
        }
        assert_eq!(
            *begun.lock().unwrap(),
            ["write", "shared", "write", "shared", "write", "shared", "write", "shared"]
        );

        // A claim, holders' steps, a start and another job queued together: one ordinary write
        // transaction.
        let (a_claim, claimed) = claim("host-a");
        let (a_step, stepped) = steps();
        let (a_start, started) = starts();
        let (other, done) = noting("other", None);
        behind_a_held_job(vec![a_claim, a_step, a_start, other]).await;
        claimed.await.unwrap().unwrap();
        stepped.await.unwrap().unwrap();
        started.await.unwrap().unwrap();
        done.await.unwrap().unwrap();
        let tail = &begun.lock().unwrap()[8..];
        assert_eq!(tail, ["write", "write"]);
    }

    /// A claim standing with the writer runs in the transaction of the first job that names its
    /// host as gained, after that job (it sees the job's rows), and answers once that one
    /// transaction committed; one per host per transaction, oldest first. A failed job gains
    /// nothing, and a withdrawn or dropped standing claim never runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_standing_claim_runs_in_the_transaction_of_the_job_that_gains_its_host() {
        let (w, begun, _dir) = recording_writer();
        w.call(|c| Ok(c.execute_batch("CREATE TABLE probe (what TEXT NOT NULL)")?)).await.unwrap();
        let began = || begun.lock().unwrap().len();
        // A standing claim notes itself and answers what it saw of the probe.
        let stand = |host: &str, name: &'static str| {
            w.stand_claim(host.to_string(), move |c| {
                c.execute("INSERT INTO probe (what) VALUES ($1)", [name])?;
                let seen: Vec<String> = c
                    .prepare_cached("SELECT what FROM probe ORDER BY rowid")?
                    .query_map([], |r| r.get(0))?
                    .collect::<Result<_, _>>()?;
                Ok(seen)
            })
        };
        let gain = |name: &'static str, hosts: &'static [&'static str], fail: bool| {
            let w = w.clone();
            async move {
                w.call_gaining(
                    move |c| {
                        c.execute("INSERT INTO probe (what) VALUES ($1)", [name])?;
                        if fail { Err(StoreError::Invalid("refused".into())) } else { Ok(()) }
                    },
                    move |_| hosts.iter().map(|h| h.to_string()).collect(),
                )
                .await
            }
        };
        let probe = || async {
            w.call(|c| {
                Ok(c.prepare_cached("SELECT what FROM probe ORDER BY rowid")?
                    .query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?)
            })
            .await
            .unwrap()
        };

        let mut first_a = stand("host-a", "claim-a1");
        let second_a = stand("host-a", "claim-a2");
        let b = stand("host-b", "claim-b");
        let withdrawn = stand("host-c", "claim-c");
        let dropped = stand("host-d", "claim-d");
        assert!(withdrawn.withdraw().await.is_none(), "a claim the writer never took is withdrawn");
        drop(dropped);

        // A job that fails gains nothing: no claim runs.
        let before = began();
        assert!(gain("refused", &["host-a", "host-b", "host-c", "host-d"], true).await.is_err());
        assert_eq!(began() - before, 1);
        assert_eq!(probe().await, Vec::<String>::new());

        // One transaction: the job, then the oldest claim of host-a, answered with the job's row.
        let before = began();
        gain("accept-1", &["host-a", "host-c", "host-d"], false).await.unwrap();
        let seen = tokio::time::timeout(std::time::Duration::from_secs(10), first_a.answer()).await.unwrap().unwrap();
        assert_eq!(seen, ["accept-1", "claim-a1"]);
        assert_eq!(began() - before, 1, "the claim ran in the job's own transaction");
        // host-a's second claim and host-b's still stand; host-c's and host-d's never ran.
        assert_eq!(probe().await, ["accept-1", "claim-a1"]);

        gain("accept-2", &["host-b", "host-a", "host-b"], false).await.unwrap();
        assert_eq!(probe().await, ["accept-1", "claim-a1", "accept-2", "claim-a2", "claim-b"], "host order");
        // Taken: a withdrawal now gives the answer instead.
        let seen = second_a.withdraw().await.expect("the writer took it").unwrap();
        assert_eq!(seen, ["accept-1", "claim-a1", "accept-2", "claim-a2"]);
        assert_eq!(b.withdraw().await.expect("the writer took it").unwrap().len(), 5);
        assert!(w.standing.lock().is_empty(), "nothing is left standing");

        // A writer with jobs waiting after a batch takes no standing claim: the batch holding
        // the gaining job (first of it) leaves one job queued behind it.
        let e = stand("host-e", "claim-e");
        let (release, held) = hold(&w).await;
        let (gaining, gained) = Queued::new(
            |c| Ok(c.execute("INSERT INTO probe (what) VALUES ('accept-3')", [])?),
            None,
            Some(Box::new(|_: &usize| vec!["host-e".to_string()])),
        );
        assert!(w.tx.send(gaining).await.is_ok());
        let mut fillers = Vec::new();
        for _ in 0..GROUP_COMMIT_JOBS_MAX {
            let (filler, done) = Queued::new(|_| Ok(()), None, None);
            assert!(w.tx.send(filler).await.is_ok());
            fillers.push(done);
        }
        release.send(()).unwrap();
        held.await.unwrap().unwrap();
        gained.await.unwrap().unwrap();
        for done in fillers {
            done.await.unwrap().unwrap();
        }
        assert!(!probe().await.contains(&"claim-e".to_string()), "a busy writer took a standing claim");
        assert!(e.withdraw().await.is_none(), "the claim still stood");
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
            c.execute("INSERT INTO operator_events (action, subject, operator, at) VALUES ('t', $1, 'x', $1)", [i])
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
