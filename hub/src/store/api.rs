//! `Store`: the one door to the hub's record. The HTTP handlers, the background tasks, the
//! status page, the metrics, the TLS revocation look-ups and the CLI hold a `Store` and call
//! one async method per operation the hub performs (`submit`, `claim`, `ack`, `report`,
//! `fence_set`, ...). Arguments and results are plain Rust and wire types; errors are
//! `StoreError`. No caller sees a connection, a transaction or SQL.
//!
//! The backend is chosen inside, by `Backend`. Today it has one variant, `Sqlite`, which runs
//! each operation exactly as the hub always has: a change is one job on the single writer
//! thread (`Writer`: group commit, one savepoint per job), a read is one read transaction on a
//! pooled connection (`Readers`), and the job's body composes the store module's functions
//! (`accept`, `claim`, `sessions`, ...) over the `rusqlite::Connection`. A second backend is a
//! second variant: every method's `match` then fails to compile until it has an arm for it,
//! and no caller changes.
//!
//! Invariant: an operation that composes several steps (a session check, then the step; a
//! claim, then its cancel notices) runs them in one transaction, as one method.
//!
//! Why one file over 700 lines: one forwarding method per operation, an arm per backend. It is
//! to go: each operation's `impl Store` method belongs at the top of its own module, above its
//! synchronous body, with every backend difference in one engine folder.

use super::accept::{self, AcceptLimits, Accepted, NewMessage, RetryPolicy};
use super::approval;
use super::claim::{self, Claimant, RebindLimit};
use super::db::{Db, PgConn};
use super::fences::{self, FenceRow};
use super::fleet::{self, HostRow, SilentHost};
use super::gauges;
use super::hosts::{self, CertStatus, Standing};
use super::overview::{self, ConversationBacklog, HostBacklog};
use super::read::{self, DeliveryDetail, DeliveryRow, StatusView};
use super::report::{self, NewReport, RunReport};
use super::silence::{self, SilentHolder};
use super::transition::Holder;
use super::writer::{Opener, OwnedDb, StandingClaim};
use super::{
    Readers, StoreError, StoreResult, Writer, audit, backup, batch, explain, in_write_txn, listing, members, operator,
    producers, purge, retention, sessions, turns, verify,
};
use baton_shared::clock::SharedClock;
use baton_shared::crash_point;
use baton_shared::sqlite::{Checkpointer, OpenError, Synchronous};
use baton_shared::states::Outcome;
use baton_shared::wire::{
    AttemptView, CancelNotice, ClaimedDelivery, ConversationView, DeliverySummary, DeliveryView, HolderItem,
    MessageView, RejectItem, ReportRequest, ReportResponse, StartItem, StartResult, TransitionResponse,
};
use rusqlite::Connection;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Fan-out obligations startup repair takes per look.
pub const REPAIR_BATCH: usize = 512;

/// The hub's record: one handle, cloned freely, behind which the backend lives.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    /// Wall-clock time for everything stored; read inside each change, as it runs.
    clock: SharedClock,
}

/// The backends. Adding one is adding a variant and an arm in each method.
#[derive(Clone)]
enum Backend {
    /// One SQLite file: the single writer thread and the pool of read connections.
    Sqlite(Conns),
    /// A PostgreSQL database, which several hubs may share: the writer thread (each
    /// transaction first takes the record's write lock) and the pool of read connections.
    Postgres(Conns),
}

/// How a backend's operations reach the record.
#[derive(Clone)]
enum Conns {
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
    async fn write<R, F>(&self, f: F) -> StoreResult<R>
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
    async fn write_gaining<R, F, G>(&self, f: F, gains: G) -> StoreResult<R>
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
    async fn write_claims<R, F>(&self, host: String, f: F) -> StoreResult<R>
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

    /// Runs a read-only `f` (in one read transaction when served; see `Readers::read`).
    async fn read<R, F>(&self, f: F) -> StoreResult<R>
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

/// The claim of `Store::claim` (and `Store::stand_claim`): up to `max` deliveries for the
/// claimant, with its pending cancel notices and the next retry, in the caller's transaction.
/// It may run more than once (a claim the server ended in a conflict runs again).
fn claim_job(
    who: Claimer,
    max: u32,
    clock: SharedClock,
) -> impl Fn(&dyn Db) -> StoreResult<Claimed> + Clone + Send + 'static {
    move |c| {
        let now = clock.now_ms();
        sessions::check(c, &who.host, who.session)?;
        let deliveries = claim::claim_as(c, who.claimant(), max, now)?;
        let cancels = turns::cancels_for(c, &who.host, &who.instance_id)?;
        // A retired host's claim hands out nothing; only an empty one asks why.
        let retired = deliveries.is_empty() && hosts::standing(c, &who.host)? == Standing::Retired;
        let next_retry_at_ms = turns::next_retry_at(c, &who.host, now)?;
        Ok(Claimed { deliveries, cancels, next_retry_at_ms, retired })
    }
}

/// The hosts that accepts gave claimable work: those of their queued deliveries (a duplicate
/// gave none).
fn gained_hosts<'a>(accepts: impl Iterator<Item = &'a (Accepted, Vec<DeliverySummary>)>) -> Vec<String> {
    accepts
        .filter(|(a, _)| matches!(a, Accepted::New { .. }))
        .flat_map(|(_, ds)| ds.iter().filter(|d| d.state == baton_shared::states::DeliveryState::Queued))
        .map(|d| d.host.clone())
        .collect()
}

/// Why an operation of an SQLite file was asked of a PostgreSQL record.
fn sqlite_only(operation: &str) -> StoreError {
    StoreError::Invalid(format!(
        "{operation} works on an SQLite record only; on PostgreSQL use the server's own tools (pg_dump, pg_amcheck)"
    ))
}

/// The SQLite connection under `c`, for an operation of an SQLite file.
fn sqlite_conn(c: &dyn Db) -> StoreResult<&Connection> {
    c.sqlite().ok_or_else(|| sqlite_only("this operation"))
}

/// The connection of a `Direct` store.
fn lock(conn: &Mutex<Connection>) -> StoreResult<std::sync::MutexGuard<'_, Connection>> {
    conn.lock().map_err(|_| StoreError::Internal("the connection's lock was poisoned by a panic".into()))
}

/// A claimant: the host (from its certificate), the certificate's serial, the node instance and
/// its node session.
#[derive(Debug, Clone)]
pub struct Claimer {
    /// The host.
    pub host: String,
    /// The presenting certificate's serial; re-checked inside the claim.
    pub serial: String,
    /// The node instance.
    pub instance_id: String,
    /// The request's node session (`None` for a node that predates sessions).
    pub session: Option<u64>,
    /// How often the host may change its bound instance.
    pub rebind: RebindLimit,
}

impl Claimer {
    fn claimant(&self) -> Claimant<'_> {
        Claimant { host: &self.host, serial: Some(&self.serial), instance_id: &self.instance_id, rebind: self.rebind }
    }
}

/// What a look before a claim found (a read; nothing changes).
#[derive(Debug, Clone)]
pub struct ClaimLook {
    /// Something may be handed out (or a retired host's work failed, or the instance bound):
    /// the claim itself must run.
    pub worth_claiming: bool,
    /// Cancel notices pending for the instance (empty when `worth_claiming`).
    pub cancels: Vec<CancelNotice>,
    /// When the host's next retry becomes due (`None` when `worth_claiming`).
    pub next_retry_at_ms: Option<i64>,
}

/// What a claim did.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The deliveries handed out.
    pub deliveries: Vec<ClaimedDelivery>,
    /// Cancel notices pending for the instance.
    pub cancels: Vec<CancelNotice>,
    /// When the host's next retry becomes due.
    pub next_retry_at_ms: Option<i64>,
    /// Nothing was handed out because the host is retired.
    pub retired: bool,
}

/// A holder's step on one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// claimed → mirrored.
    Mirrored,
    /// mirrored → delivered.
    Ack,
    /// Both, in one transaction: claimed → mirrored → delivered (from `mirrored`, the ack
    /// alone). The node's local copy is committed before it asks, as for `mirrored`.
    Handoff,
}

/// The node a holder's request comes from: its host and its node session.
#[derive(Debug, Clone)]
pub struct NodeAt {
    /// The host, from the certificate.
    pub host: String,
    /// The request's node session (`None` for a node that predates sessions).
    pub session: Option<u64>,
}

/// The holder a node's step names: its instance and the claim token.
#[derive(Debug, Clone)]
pub struct HolderOf {
    /// The holding instance.
    pub instance_id: String,
    /// The claim token.
    pub claim_token: String,
}

impl HolderOf {
    fn as_holder(&self) -> Holder<'_> {
        Holder { instance_id: &self.instance_id, claim_token: &self.claim_token }
    }
}

/// What a report recorded: the attempt, whether it was recorded before (a replay), and when a
/// retry the harness asked for becomes due.
pub type Reported = (AttemptView, bool, Option<i64>);

/// The retry bounds a report applies (`limits.retry_backoff`, `limits.retry_backoff_max`).
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The first retry's backoff when the message names none.
    pub base: Duration,
    /// The longest backoff.
    pub max: Duration,
}

/// The bounds a report applies: its retry's backoff, and how much of its stderr tail the record
/// keeps (`limits.stderr_tail_bytes_max`).
#[derive(Debug, Clone, Copy)]
pub struct ReportBounds {
    /// The retry bounds.
    pub backoff: Backoff,
    /// Most bytes of a stderr tail kept: its last ones, the rest counted as dropped.
    pub stderr_tail_bytes_max: u64,
    /// Failed turns in a row that trip a conversation's breaker (`limits.breaker_failures`;
    /// 0: off).
    pub breaker_failures: u32,
}

impl From<Backoff> for ReportBounds {
    /// These retry bounds, and the default stderr bound.
    fn from(backoff: Backoff) -> ReportBounds {
        ReportBounds {
            backoff,
            stderr_tail_bytes_max: baton_shared::limits::STDERR_TAIL_BYTES_MAX_DEFAULT,
            breaker_failures: 0,
        }
    }
}

/// Everything the status page's overview shows, read in one snapshot.
#[derive(Debug, Clone)]
pub struct Overview {
    /// Counts per state, fences, hosts.
    pub status: StatusView,
    /// Deliveries by their current run's outcome.
    pub outcomes: Vec<(Outcome, i64)>,
    /// Every host.
    pub hosts: Vec<HostRow>,
    /// Each host's backlog.
    pub backlogs: Vec<HostBacklog>,
    /// The deepest conversation backlogs.
    pub conversations: Vec<ConversationBacklog>,
    /// Active fences.
    pub fences: Vec<FenceRow>,
    /// Hosts silent longer than the warning.
    pub silent: Vec<SilentHost>,
    /// Recent failed or `unknown` deliveries.
    pub trouble: Vec<overview::Trouble>,
    /// How many turns run now.
    pub running_total: i64,
    /// The turns that have run longest.
    pub running: Vec<overview::RunningTurn>,
}

/// Reads the overview at `now_ms` on `conn` (inside one read transaction: one snapshot).
pub(crate) fn gather(conn: &dyn Db, now_ms: i64, silence: Duration) -> StoreResult<Overview> {
    let silence_ms = i64::try_from(silence.as_millis()).unwrap_or(i64::MAX);
    let (running_total, running) = overview::running_turns(conn, overview::RUNNING_SHOWN_MAX)?;
    Ok(Overview {
        status: read::status(conn)?,
        outcomes: overview::outcome_counts(conn)?,
        hosts: fleet::hosts(conn)?,
        backlogs: overview::host_backlogs(conn)?,
        conversations: overview::conversation_backlogs(conn, overview::CONVERSATIONS_SHOWN_MAX)?,
        fences: fences::list(conn, false)?,
        silent: fleet::silent_hosts(conn, now_ms, silence_ms)?,
        trouble: overview::recent_trouble(conn, overview::TROUBLE_SHOWN_MAX)?,
        running_total,
        running,
    })
}

/// A report request as the store records it.
fn new_report(req: &ReportRequest) -> NewReport<'_> {
    NewReport {
        delivery_id: &req.delivery_id,
        holder: Holder { instance_id: &req.instance_id, claim_token: &req.claim_token },
        report_id: &req.report_id,
        outcome: req.outcome,
        exit_code: req.exit_code,
        duration_ms: req.duration_ms,
        result: req.result.as_deref(),
        reason: req.reason.as_deref(),
        stderr_tail: req.stderr_tail.as_deref(),
        stderr_dropped_bytes: req.stderr_dropped_bytes,
    }
}

/// A report's run and its bounds.
fn run_report(req: &ReportRequest, session: Option<u64>, bounds: ReportBounds) -> RunReport {
    RunReport {
        attempt: req.attempt,
        signal: req.signal,
        session,
        retry_backoff: bounds.backoff.base,
        retry_backoff_max: bounds.backoff.max,
        stderr_tail_bytes_max: bounds.stderr_tail_bytes_max,
        breaker_failures: bounds.breaker_failures,
    }
}

/// A holder's step, applied on `conn`.
fn apply_step(
    conn: &dyn Db,
    step: Step,
    node: &NodeAt,
    id: &str,
    h: Holder<'_>,
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    let host = node.host.as_str();
    let answer = match step {
        Step::Mirrored => return claim::mirrored(conn, host, id, h, now_ms),
        Step::Ack => claim::ack(conn, host, id, h, now_ms)?,
        Step::Handoff => claim::handoff(conn, host, id, h, now_ms)?,
    };
    // The session whose ack made the run `delivered`: a newer session is not granted its
    // start while this one's start lease lasts (`turns::start`).
    if let Some(session) = node.session
        && answer.changed
        && answer.state == baton_shared::states::DeliveryState::Delivered
    {
        claim::record_acked_session(conn, id, session)?;
    }
    Ok(answer)
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
        Ok(Store { backend: Backend::Sqlite(served), clock })
    }

    /// The record in an SQLite file through the one connection `conn`, used in place (see
    /// `Conns::Direct`): for a one-shot process, never inside the hub.
    pub fn sqlite_direct(conn: Connection, clock: SharedClock) -> Store {
        Store { backend: Backend::Sqlite(Conns::Direct(Arc::new(Mutex::new(conn)))), clock }
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
    pub async fn open_postgres(url: &crate::pg::PgUrl, clock: SharedClock) -> Result<Store, crate::pg::PgError> {
        crate::pg::connect_and_migrate(url).await?;
        let opener = |url: crate::pg::PgUrl| -> Opener {
            Box::new(move || {
                let conn = PgConn::connect(&url).map_err(|e| StoreError::Storage(e.to_string()))?;
                Ok(Box::new(conn) as OwnedDb)
            })
        };
        // The connections are made and used on the store's own threads (see `PgConn`).
        let (first, reopen, readers) = (opener(url.clone()), opener(url.clone()), opener(url.clone()));
        let conn = tokio::task::spawn_blocking(first)
            .await
            .map_err(|e| crate::pg::PgError::Other { url: url.shown().to_string(), detail: e.to_string() })?
            .map_err(|e| crate::pg::PgError::Other { url: url.shown().to_string(), detail: e.to_string() })?;
        let writer = Writer::start_with(conn, Some(reopen))
            .map_err(|e| crate::pg::PgError::Other { url: url.shown().to_string(), detail: e.to_string() })?;
        let readers = Arc::new(Readers::with_opener(readers));
        let conflict_retries = url.conflict_retries().unwrap_or(super::db::PG_CONFLICT_RETRIES);
        let served = Conns::Served { writer, readers, _checkpoints: None, conflict_retries };
        Ok(Store { backend: Backend::Postgres(served), clock })
    }

    /// Whether the record is in PostgreSQL (shared by several hubs) rather than one SQLite file.
    pub fn is_postgres(&self) -> bool {
        matches!(self.backend, Backend::Postgres(_))
    }

    /// The schema version of the record: how many migrations it has.
    pub async fn schema_version(&self) -> StoreResult<i64> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(super::schema_version).await,
        }
    }

    /// The clock the store stamps changes with.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    // ---- Startup and housekeeping ----

    /// Completes every fan-out obligation a crash left pending, one message per transaction.
    /// Returns how many it completed.
    pub async fn repair(&self) -> StoreResult<usize> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                let mut done = 0;
                loop {
                    let pending = s.write(|c| accept::pending_obligations(c, REPAIR_BATCH)).await?;
                    if pending.is_empty() {
                        return Ok(done);
                    }
                    for id in pending {
                        let clock = self.clock.clone();
                        s.write(move |c| accept::fan_out(c, &id, clock.now_ms())).await?;
                        done += 1;
                        crash_point("hub.repair.mid");
                    }
                }
            }
        }
    }

    /// Removes up to `max` settled messages settled before `cutoff_ms`; returns how many.
    pub async fn retention_sweep(&self, cutoff_ms: i64, max: usize) -> StoreResult<usize> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.write(move |c| retention::sweep(c, cutoff_ms, max)).await,
        }
    }

    /// Removes up to `max` audit rows written before `cutoff_ms`; returns how many.
    pub async fn audit_sweep(&self, cutoff_ms: i64, max: usize) -> StoreResult<usize> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| retention::sweep_audit(c, cutoff_ms, max)).await
            }
        }
    }

    /// Removes up to `max` fences lifted before `cutoff_ms`; returns how many.
    pub async fn fence_sweep(&self, cutoff_ms: i64, max: usize) -> StoreResult<usize> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| retention::sweep_fences(c, cutoff_ms, max)).await
            }
        }
    }

    /// Records the node sessions' last contact: `(host, session, at_ms)`.
    pub async fn record_contacts(&self, contacts: Vec<(String, u64, i64)>) -> StoreResult<()> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| sessions::record_contacts(c, &contacts)).await
            }
        }
    }

    /// When the next time-boxed fence's time is up, if any.
    pub async fn next_fence_expiry(&self) -> StoreResult<Option<i64>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(fences::next_expiry).await,
        }
    }

    /// Lifts the fences whose time is up at `now_ms`; returns their ids.
    pub async fn lift_expired_fences(&self, now_ms: i64) -> StoreResult<Vec<i64>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.write(move |c| fences::lift_expired(c, now_ms)).await,
        }
    }

    /// Approves or rejects a message awaiting approval (`approval::decide`), in one
    /// transaction.
    pub async fn decide_approval(
        &self,
        message_id: String,
        by: ApprovalBy,
        decision: approval::Decision,
        reason: String,
    ) -> StoreResult<approval::Decided> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    let decider = match &by {
                        ApprovalBy::Operator(n) => approval::Decider::Operator(n),
                        ApprovalBy::Producer(n) => approval::Decider::Producer(n),
                    };
                    approval::decide(c, &message_id, decider, decision, &reason, clock.now_ms())
                })
                .await
            }
        }
    }

    /// The message `id` names, as a message id or a whole delivery id (`approval::message_of`).
    pub async fn approval_message(&self, id: String) -> StoreResult<Option<String>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| approval::message_of(c, &id)).await,
        }
    }

    /// Fails what every approval that timed out by `now_ms` holds (`approval::expire`), reading
    /// first and writing only when one is due. Returns the messages.
    pub async fn expire_approvals(&self, now_ms: i64) -> StoreResult<Vec<String>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => match s.read(approval::next_expiry).await? {
                Some(at) if at <= now_ms => s.write(move |c| approval::expire(c, now_ms)).await,
                _ => Ok(Vec::new()),
            },
        }
    }

    /// Replaces the producer's approval right (`producers::set_approvals`); returns it.
    pub async fn producer_approve(&self, producer: String, patterns: Vec<String>, by: By) -> StoreResult<Vec<String>> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    producers::set_approvals(c, &producer, &patterns, &by.operator, &by.reason, clock.now_ms())
                })
                .await
            }
        }
    }

    /// Node instances whose open session was last heard from before `cutoff_ms` and that hold
    /// claimed or mirrored deliveries.
    pub async fn silent_holders(&self, cutoff_ms: i64) -> StoreResult<Vec<SilentHolder>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| silence::silent_holders(c, cutoff_ms)).await,
        }
    }

    /// Returns to the queue what the silent instance `who` holds, if it is still silent;
    /// returns the deliveries requeued.
    pub async fn requeue_silent(&self, who: SilentHolder, cutoff_ms: i64, now_ms: i64) -> StoreResult<Vec<String>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| silence::requeue_silent(c, &who, cutoff_ms, now_ms)).await
            }
        }
    }

    // ---- Reads for operators, status and metrics ----

    /// Whether the record is in use (hosts, certificates, messages): `init` refuses to put a new
    /// CA over one that is.
    pub async fn in_use(&self) -> StoreResult<read::InUse> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(read::in_use).await,
        }
    }

    /// Counts per state, pending fan-out, fences and hosts.
    pub async fn status(&self) -> StoreResult<StatusView> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(read::status).await,
        }
    }

    /// The status page's overview at `now_ms`, flagging hosts silent longer than `silence`.
    pub async fn overview(&self, now_ms: i64, silence: Duration) -> StoreResult<Overview> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| gather(c, now_ms, silence)).await,
        }
    }

    /// Messages, deliveries and outcomes per minute over the last hour (`overview::rates`).
    pub async fn rates(&self, now_ms: i64) -> StoreResult<overview::Rates> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| overview::rates(c, now_ms)).await,
        }
    }

    /// The deliveries an id prefix, a message id, a conversation or a host names, newest first
    /// (`overview::search`).
    pub async fn search(&self, q: String) -> StoreResult<Vec<DeliveryRow>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.read(move |c| overview::search(c, &q, overview::SEARCH_SHOWN_MAX)).await
            }
        }
    }

    /// What the periodic gauges read at `now_ms`, in one snapshot (`gauges::gather`), flagging
    /// hosts silent longer than `silence` as `status` does.
    pub async fn record_gauges(&self, now_ms: i64, silence: Duration) -> StoreResult<gauges::RecordGauges> {
        let silence_ms = i64::try_from(silence.as_millis()).unwrap_or(i64::MAX);
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| gauges::gather(c, now_ms, silence_ms)).await,
        }
    }

    /// One delivery with its events and attempts.
    pub async fn delivery_detail(&self, delivery_id: String) -> StoreResult<DeliveryDetail> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| read::delivery_detail(c, &delivery_id)).await,
        }
    }

    /// A certificate's standing (`None`: not in the record).
    pub async fn cert_status(&self, serial: String) -> StoreResult<Option<CertStatus>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| hosts::cert_status(c, &serial)).await,
        }
    }

    // ---- Producers ----

    /// Accepts a message and fans it out, in one transaction.
    pub async fn submit(
        &self,
        msg: NewMessage,
        retry: RetryPolicy,
        limits: AcceptLimits,
    ) -> StoreResult<(Accepted, Vec<DeliverySummary>)> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write_gaining(
                    move |c| accept::accept_and_fan_out(c, &msg, retry, limits, clock.now_ms()),
                    |r| gained_hosts(std::iter::once(r)),
                )
                .await
            }
        }
    }

    /// Accepts and fans out each message as `submit` would, in one transaction; one result per
    /// message, in order (a refused one is rolled back alone).
    pub async fn submit_batch(
        &self,
        messages: Vec<(NewMessage, RetryPolicy)>,
        limits: AcceptLimits,
    ) -> StoreResult<Vec<StoreResult<(Accepted, Vec<DeliverySummary>)>>> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write_gaining(
                    move |c| {
                        let now = clock.now_ms();
                        batch::each(c, messages, |c, (msg, retry)| {
                            accept::accept_and_fan_out(c, &msg, retry, limits, now)
                        })
                    },
                    |rs| gained_hosts(rs.iter().filter_map(|r| r.as_ref().ok())),
                )
                .await
            }
        }
    }

    /// The producer `producer` cancels its message `message_id`.
    pub async fn cancel_message(
        &self,
        message_id: String,
        producer: String,
        reason: String,
    ) -> StoreResult<Vec<baton_shared::wire::CancelResult>> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| turns::cancel_message(c, &message_id, &producer, &reason, clock.now_ms())).await
            }
        }
    }

    /// The id of `producer`'s message with idempotency key `key`, if any.
    pub async fn message_id_by_key(&self, producer: String, key: String) -> StoreResult<Option<String>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.read(move |c| read::message_id_by_key(c, &producer, &key)).await
            }
        }
    }

    /// A message with its deliveries and attempts.
    pub async fn message_by_id(&self, message_id: String) -> StoreResult<MessageView> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| read::message_view(c, &message_id)).await,
        }
    }

    /// The bytes the record takes (`read::store_bytes`), for `limits.store_bytes_max`.
    pub async fn store_bytes(&self) -> StoreResult<i64> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(read::store_bytes).await,
        }
    }

    /// One delivery of a message with all its attempts, and the message's producer.
    pub async fn delivery_of_message(
        &self,
        message_id: String,
        delivery_id: String,
    ) -> StoreResult<(String, DeliveryView)> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.read(move |c| read::delivery_view(c, &message_id, &delivery_id)).await
            }
        }
    }

    /// A conversation's `last_seq` and membership registry, for a producer whose publish scope
    /// covers it.
    pub async fn conversation_for(&self, producer: String, conversation: String) -> StoreResult<ConversationView> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.read(move |c| {
                    producers::check_may_post(c, &producer, &conversation)?;
                    members::view(c, &conversation)
                })
                .await
            }
        }
    }

    // ---- Nodes ----

    /// Registers a fresh node session of `host` for `instance_id`.
    pub async fn open_session(
        &self,
        host: String,
        instance_id: String,
        node_version: Option<String>,
        rebind: RebindLimit,
        start_lease: Duration,
    ) -> StoreResult<sessions::Opened> {
        let clock = self.clock.clone();
        let lease_ms = u64::try_from(start_lease.as_millis()).unwrap_or(u64::MAX);
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    sessions::open(c, &host, &instance_id, node_version.as_deref(), rebind, lease_ms, clock.now_ms())
                })
                .await
            }
        }
    }

    /// Ends the node session `session` of `instance_id` cleanly (the request's own session,
    /// `node.session`, checked first).
    pub async fn end_session(&self, node: NodeAt, instance_id: String, session: u64) -> StoreResult<()> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    sessions::check(c, &node.host, node.session)?;
                    sessions::end(c, &node.host, &instance_id, session, clock.now_ms())
                })
                .await
            }
        }
    }

    /// Which of the turns the node is about to start may run (recording the starts allowed).
    pub async fn start_turns(
        &self,
        host: String,
        instance_id: String,
        session: u64,
        starts: Vec<StartItem>,
    ) -> StoreResult<Vec<StartResult>> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    sessions::check(c, &host, Some(session))?;
                    let now = clock.now_ms();
                    let results = turns::start(c, &host, &instance_id, session, &starts, now)?;
                    sessions::renew_lease(c, &host, session, now)?;
                    Ok(results)
                })
                .await
            }
        }
    }

    /// The look before a claim, at `now_ms` (a read): whether a claim may hand something out,
    /// and otherwise the pending cancel notices and the next retry.
    pub async fn claim_look(&self, who: Claimer, now_ms: i64) -> StoreResult<ClaimLook> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.read(move |c| {
                    sessions::check(c, &who.host, who.session)?;
                    if claim::worth_claiming(c, who.claimant(), now_ms)? {
                        return Ok(ClaimLook { worth_claiming: true, cancels: Vec::new(), next_retry_at_ms: None });
                    }
                    Ok(ClaimLook {
                        worth_claiming: false,
                        cancels: turns::cancels_for(c, &who.host, &who.instance_id)?,
                        next_retry_at_ms: turns::next_retry_at(c, &who.host, now_ms)?,
                    })
                })
                .await
            }
        }
    }

    /// The claim: up to `max` deliveries for the claimant, with its pending cancel notices and
    /// the next retry, in one transaction.
    pub async fn claim(&self, who: Claimer, max: u32) -> StoreResult<Claimed> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write_claims(who.host.clone(), claim_job(who, max, self.clock.clone())).await
            }
        }
    }

    /// Leaves the claim `claim` would make with the writer, to run in the transaction of the
    /// next change that gives the claimant's host claimable work (an accept's fan-out; see
    /// `Writer::stand_claim`). `None` where there is no writer thread (a one-shot process).
    pub fn stand_claim(&self, who: Claimer, max: u32) -> Option<StandingClaim<Claimed>> {
        match &self.backend {
            Backend::Sqlite(Conns::Served { writer, .. }) | Backend::Postgres(Conns::Served { writer, .. }) => {
                Some(writer.stand_claim(who.host.clone(), claim_job(who, max, self.clock.clone())))
            }
            Backend::Sqlite(Conns::Direct(_)) | Backend::Postgres(Conns::Direct(_)) => None,
        }
    }

    /// One page of what the instance holds (claimed, mirrored, delivered without an outcome):
    /// at most `limit` after queue position `after_n`, and where the next page starts.
    pub async fn holdings(
        &self,
        node: NodeAt,
        instance_id: String,
        after_n: i64,
        limit: u32,
    ) -> StoreResult<(Vec<ClaimedDelivery>, Option<i64>)> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.read(move |c| {
                    sessions::check(c, &node.host, node.session)?;
                    claim::holdings_page(c, &node.host, &instance_id, after_n, limit)
                })
                .await
            }
        }
    }

    /// The holder recorded its local copy: claimed → mirrored. Repeating it changes nothing.
    pub async fn mirrored(
        &self,
        node: NodeAt,
        delivery_id: String,
        holder: HolderOf,
    ) -> StoreResult<TransitionResponse> {
        self.holder_step(Step::Mirrored, node, delivery_id, holder).await
    }

    /// The holder acked the durable handoff: mirrored → delivered. Repeating it changes nothing.
    pub async fn ack(&self, node: NodeAt, delivery_id: String, holder: HolderOf) -> StoreResult<TransitionResponse> {
        self.holder_step(Step::Ack, node, delivery_id, holder).await
    }

    /// A holder's `step` on one delivery, after the session check.
    pub async fn holder_step(
        &self,
        step: Step,
        node: NodeAt,
        delivery_id: String,
        holder: HolderOf,
    ) -> StoreResult<TransitionResponse> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    sessions::check(c, &node.host, node.session)?;
                    let h = holder.as_holder();
                    apply_step(c, step, &node, &delivery_id, h, clock.now_ms())
                })
                .await
            }
        }
    }

    /// A holder's `step` on each delivery, in one transaction after one session check; one
    /// result per delivery, in order.
    pub async fn holder_steps(
        &self,
        step: Step,
        node: NodeAt,
        instance_id: String,
        items: Vec<HolderItem>,
    ) -> StoreResult<Vec<StoreResult<TransitionResponse>>> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    sessions::check(c, &node.host, node.session)?;
                    let now = clock.now_ms();
                    batch::each(c, items, |c, d| {
                        let h = Holder { instance_id: &instance_id, claim_token: &d.claim_token };
                        apply_step(c, step, &node, &d.delivery_id, h, now)
                    })
                })
                .await
            }
        }
    }

    /// The holder refuses the delivery: claimed or mirrored → failed, with its reason.
    pub async fn reject(
        &self,
        node: NodeAt,
        delivery_id: String,
        holder: HolderOf,
        reason: String,
    ) -> StoreResult<TransitionResponse> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    sessions::check(c, &node.host, node.session)?;
                    let h = holder.as_holder();
                    claim::reject(c, &node.host, &delivery_id, h, &reason, clock.now_ms())
                })
                .await
            }
        }
    }

    /// `reject` for each delivery, in one transaction after one session check; one result per
    /// delivery, in order.
    pub async fn reject_batch(
        &self,
        node: NodeAt,
        instance_id: String,
        items: Vec<RejectItem>,
    ) -> StoreResult<Vec<StoreResult<TransitionResponse>>> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    sessions::check(c, &node.host, node.session)?;
                    let now = clock.now_ms();
                    batch::each(c, items, |c, d| {
                        let h = Holder { instance_id: &instance_id, claim_token: &d.claim_token };
                        claim::reject(c, &node.host, &d.delivery_id, h, &d.reason, now)
                    })
                })
                .await
            }
        }
    }

    /// Records one attempt report (after the session check).
    pub async fn report(
        &self,
        node: NodeAt,
        req: ReportRequest,
        bounds: impl Into<ReportBounds>,
    ) -> StoreResult<Reported> {
        let (clock, bounds) = (self.clock.clone(), bounds.into());
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                let (reported, accepted_at_ms) = s
                    .write(move |c| {
                        sessions::check(c, &node.host, node.session)?;
                        let run = run_report(&req, node.session, bounds);
                        let reported = report::report_run(c, &node.host, &new_report(&req), &run, clock.now_ms())?;
                        let accepted_at_ms = if reported.1 { None } else { gauges::accepted_at(c, &req.delivery_id)? };
                        Ok((reported, accepted_at_ms))
                    })
                    .await?;
                observe_turn(&reported.0, accepted_at_ms);
                Ok(reported)
            }
        }
    }

    /// Records each report as `report` would, in one transaction after one session check; one
    /// result per report, in order.
    pub async fn report_batch(
        &self,
        node: NodeAt,
        reports: Vec<ReportRequest>,
        bounds: impl Into<ReportBounds>,
    ) -> StoreResult<Vec<StoreResult<ReportResponse>>> {
        let (clock, bounds) = (self.clock.clone(), bounds.into());
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                let answers = s
                    .write(move |c| {
                        sessions::check(c, &node.host, node.session)?;
                        let now = clock.now_ms();
                        batch::each(c, reports, |c, req| {
                            let run = run_report(&req, node.session, bounds);
                            let (attempt, duplicate, retry_at_ms) =
                                report::report_run(c, &node.host, &new_report(&req), &run, now)?;
                            let accepted_at_ms =
                                if duplicate { None } else { gauges::accepted_at(c, &req.delivery_id)? };
                            let r = ReportResponse { attempt, delivery_id: req.delivery_id, duplicate, retry_at_ms };
                            Ok((r, accepted_at_ms))
                        })
                    })
                    .await?;
                Ok(answers
                    .into_iter()
                    .map(|a| {
                        a.map(|(r, accepted_at_ms)| {
                            observe_turn(&r.attempt, accepted_at_ms);
                            r
                        })
                    })
                    .collect())
            }
        }
    }
}

/// Records a newly recorded attempt (committed: `accepted_at_ms` is `None` for a replay) in the
/// turn histograms: how long the turn ran, as its node measured it, and, when the outcome
/// settles the delivery (no retry follows), how long after its message's acceptance.
fn observe_turn(attempt: &AttemptView, accepted_at_ms: Option<i64>) {
    let Some(accepted_at_ms) = accepted_at_ms else { return };
    let outcome = attempt.outcome.as_str();
    if let Some(ms) = attempt.duration_ms {
        metrics::histogram!("baton_hub_turn_duration_seconds", "outcome" => outcome).record(ms as f64 / 1000.0);
    }
    if !attempt.retryable {
        let ms = attempt.reported_at_ms.saturating_sub(accepted_at_ms).max(0);
        metrics::histogram!("baton_hub_accept_to_outcome_seconds", "outcome" => outcome).record(ms as f64 / 1000.0);
    }
}

/// Why a fence's target looks like a typo: it matches nothing today.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceTargetProblem {
    /// The host was never enrolled.
    NeverEnrolled,
    /// The host is retired.
    Retired,
    /// The conversation has no messages.
    NoMessages,
}

/// What `fence_set` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceSetOutcome {
    /// The fence was set, with this id.
    Set(i64),
    /// Nothing was set: the target matches nothing today (and `force` was not given).
    TargetProblem(FenceTargetProblem),
    /// Nothing was set: the same fence is already active (its description).
    AlreadyActive(String),
}

/// What setting a fence would do, read before it is set, so an operator sees it first (SPEC
/// §9: a block fails what it covers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencePlan {
    /// Why the target looks like a typo, if it does (`fence_set` refuses it without `force`).
    pub problem: Option<FenceTargetProblem>,
    /// The same fence, already active (`fence_set` would set nothing), described.
    pub already: Option<String>,
    /// Queued deliveries the fence covers.
    pub queued: i64,
    /// Of those, how many an active pause fence holds back now.
    pub paused: i64,
}

/// What `release` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// The deliveries released.
    Released(Vec<String>),
    /// Nothing was released: these active hold or block fences would catch the release again at
    /// the next claim (their descriptions).
    WouldHoldAgain(Vec<String>),
}

/// What a delivery selector names, owned (see `operator::Selector`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Select {
    /// One delivery by id.
    Delivery(String),
    /// Every matching delivery of a conversation.
    Conversation(String),
}

impl Select {
    fn as_selector(&self) -> operator::Selector<'_> {
        match self {
            Select::Delivery(id) => operator::Selector::Delivery(id),
            Select::Conversation(c) => operator::Selector::Conversation(c),
        }
    }
}

/// What a purge names, owned (see `purge::Target`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeOf {
    /// One message, by id.
    Message(String),
    /// Every message of a conversation.
    Conversation(String),
}

impl PurgeOf {
    fn as_target(&self) -> purge::Target<'_> {
        match self {
            PurgeOf::Message(m) => purge::Target::Message(m),
            PurgeOf::Conversation(c) => purge::Target::Conversation(c),
        }
    }
}

/// A membership change's direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    /// The hosts join.
    Join,
    /// The hosts leave.
    Leave,
    /// `to` may name the hosts from now on, though they are not members.
    AllowMention,
    /// `to` may no longer name the hosts (unless they are members).
    DisallowMention,
}

/// The operator's attribution of a change: who, and why.
#[derive(Debug, Clone)]
pub struct By {
    /// The operator.
    pub operator: String,
    /// The reason recorded.
    pub reason: String,
}

/// The active hold or block fences that would catch the selected held deliveries again at the
/// next claim, described; empty when a release would stick.
fn would_hold_again(conn: &dyn Db, sel: operator::Selector<'_>) -> StoreResult<Vec<String>> {
    let active = fences::active(conn)?;
    let mut named: Vec<String> = Vec::new();
    for (conversation, host) in operator::held_targets(conn, sel)? {
        if let Some(f) = fences::strongest(&active, &conversation, &host)
            && f.kind != fences::FenceKind::Pause
        {
            let d = f.describe();
            if !named.contains(&d) {
                named.push(d);
            }
        }
    }
    Ok(named)
}

/// Why a fence's target matches nothing today, if it does not.
fn fence_target_problem(
    conn: &dyn Db,
    scope: fences::FenceScope,
    target: &str,
) -> StoreResult<Option<FenceTargetProblem>> {
    Ok(match scope {
        fences::FenceScope::Host => match hosts::standing(conn, target)? {
            Standing::NotEnrolled => Some(FenceTargetProblem::NeverEnrolled),
            Standing::Retired => Some(FenceTargetProblem::Retired),
            Standing::Active => None,
        },
        fences::FenceScope::Conversation if !fences::conversation_has_messages(conn, target)? => {
            Some(FenceTargetProblem::NoMessages)
        }
        _ => None,
    })
}

/// Operations of the operator (the CLI).
impl Store {
    /// Every host.
    pub async fn hosts(&self) -> StoreResult<Vec<HostRow>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(fleet::hosts).await,
        }
    }

    /// One host in detail (`None`: never enrolled).
    pub async fn host(&self, name: String) -> StoreResult<Option<fleet::HostDetail>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| fleet::host(c, &name)).await,
        }
    }

    /// How many deliveries ended `unknown` at or after `since_ms` (`overview::unknown_since`).
    pub async fn unknown_since(&self, since_ms: i64) -> StoreResult<i64> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| overview::unknown_since(c, since_ms)).await,
        }
    }

    /// Hosts whose open node session has been silent longer than `silence_ms` at `now_ms`.
    pub async fn silent_hosts(&self, now_ms: i64, silence_ms: i64) -> StoreResult<Vec<SilentHost>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.read(move |c| fleet::silent_hosts(c, now_ms, silence_ms)).await
            }
        }
    }

    /// Certificates not revoked that expire before `until_unix`.
    pub async fn expiring_certificates(&self, until_unix: i64) -> StoreResult<Vec<fleet::CertRow>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.read(move |c| fleet::expiring_certificates(c, until_unix)).await
            }
        }
    }

    /// The newest audit entries matching the query, newest first, and whether more matched.
    pub async fn audit(
        &self,
        since_ms: Option<i64>,
        actor: Option<String>,
        after: Option<audit::AuditCursor>,
        limit: u32,
    ) -> StoreResult<(Vec<audit::AuditEntry>, bool)> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.read(move |c| {
                    audit::entries(c, audit::AuditQuery { since_ms, actor: actor.as_deref(), after, limit })
                })
                .await
            }
        }
    }

    /// The fences: active ones, or (`all`) every one ever set.
    pub async fn fences(&self, all: bool) -> StoreResult<Vec<FenceRow>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| fences::list(c, all)).await,
        }
    }

    /// Sets a fence lifted by the hub at `expires_at_ms` (`None`: by an operator), after the
    /// fences whose time is up are lifted; refuses a target that matches nothing today (unless
    /// `force`) and a fence already active, setting nothing.
    pub async fn fence_set(
        &self,
        kind: fences::FenceKind,
        scope: fences::FenceScope,
        target: Option<String>,
        by: By,
        expires_at_ms: Option<i64>,
        force: bool,
    ) -> StoreResult<FenceSetOutcome> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    let now_ms = clock.now_ms();
                    fences::lift_expired(c, now_ms)?;
                    if let (Some(t), false) = (&target, force)
                        && let Some(problem) = fence_target_problem(c, scope, t)?
                    {
                        return Ok(FenceSetOutcome::TargetProblem(problem));
                    }
                    if let Some(existing) = fences::active_same(c, kind, scope, target.as_deref())? {
                        return Ok(FenceSetOutcome::AlreadyActive(existing.describe()));
                    }
                    let new = fences::NewFence {
                        kind,
                        scope,
                        target: target.as_deref(),
                        operator: &by.operator,
                        reason: &by.reason,
                    };
                    fences::set_until(c, new, expires_at_ms, now_ms).map(FenceSetOutcome::Set)
                })
                .await
            }
        }
    }

    /// What `fence_set` of `kind` on `scope` and `target` would find, changing nothing: its
    /// target's problem, the same fence already active, and the queued deliveries it covers
    /// (of which how many are paused now).
    pub async fn fence_plan(
        &self,
        kind: fences::FenceKind,
        scope: fences::FenceScope,
        target: Option<String>,
    ) -> StoreResult<FencePlan> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.read(move |c| {
                    let problem = match &target {
                        Some(t) => fence_target_problem(c, scope, t)?,
                        None => None,
                    };
                    let already = fences::active_same(c, kind, scope, target.as_deref())?.map(|f| f.describe());
                    let active = fences::active(c)?;
                    let (mut queued, mut paused) = (0, 0);
                    for (conversation, host, n) in fences::queued_by_pair(c, scope, target.as_deref())? {
                        queued += n;
                        if fences::strongest(&active, &conversation, &host).map(|f| f.kind)
                            == Some(fences::FenceKind::Pause)
                        {
                            paused += n;
                        }
                    }
                    Ok(FencePlan { problem, already, queued, paused })
                })
                .await
            }
        }
    }

    /// Lifts the active fence `id` (after the fences whose time is up); `NotFound` when it is
    /// not active.
    pub async fn fence_lift(&self, id: i64, by: By) -> StoreResult<()> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    fences::lift_expired(c, clock.now_ms())?;
                    fences::lift(c, id, &by.operator, &by.reason, clock.now_ms())
                })
                .await
            }
        }
    }

    /// The membership registry: of one conversation, or of all.
    pub async fn members(&self, conversation: Option<String>) -> StoreResult<Vec<members::ConversationMembers>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.read(move |c| members::list(c, conversation.as_deref())).await
            }
        }
    }

    /// The hosts join or leave the conversation, in one transaction; one change per host.
    pub async fn members_change(
        &self,
        direction: Membership,
        conversation: String,
        hosts: Vec<String>,
        by: By,
    ) -> StoreResult<Vec<members::MemberChange>> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    let now = clock.now_ms();
                    match direction {
                        Membership::Join => members::add(c, &conversation, &hosts, &by.operator, &by.reason, now),
                        Membership::Leave => members::remove(c, &conversation, &hosts, &by.operator, &by.reason, now),
                        Membership::AllowMention => {
                            members::allow_mention(c, &conversation, &hosts, &by.operator, &by.reason, now)
                        }
                        Membership::DisallowMention => {
                            members::disallow_mention(c, &conversation, &hosts, &by.operator, &by.reason, now)
                        }
                    }
                })
                .await
            }
        }
    }

    /// Every producer's publish scope.
    pub async fn producers(&self) -> StoreResult<Vec<producers::ProducerRow>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(producers::list).await,
        }
    }

    /// Sets the producer's publish scope; returns it as stored.
    pub async fn producer_scope(&self, producer: String, patterns: Vec<String>, by: By) -> StoreResult<Vec<String>> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    producers::set_scope(c, &producer, &patterns, &by.operator, &by.reason, clock.now_ms())
                })
                .await
            }
        }
    }

    /// Changes the producer's quota; returns the quota now in force.
    pub async fn producer_quota(
        &self,
        producer: String,
        change: producers::QuotaChange,
        by: By,
    ) -> StoreResult<producers::Quota> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| producers::set_quota(c, &producer, change, &by.operator, &by.reason, clock.now_ms()))
                    .await
            }
        }
    }

    /// The operator's `send`: accepts the message and fans it out, in one transaction, and
    /// records a new message in the audit log with the operator's reason.
    pub async fn send(
        &self,
        msg: NewMessage,
        limits: AcceptLimits,
        by: By,
    ) -> StoreResult<(Accepted, Vec<DeliverySummary>)> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    let accepted = accept::accept(c, &msg, limits, clock.now_ms())?;
                    let id = match &accepted {
                        Accepted::New { message_id, seq } => {
                            // A message sent by hand is an operator's act: audited, with its
                            // reason, in the accepting transaction. A replay adds nothing.
                            let subject = format!("message {message_id} conversation {} seq {seq}", msg.conversation);
                            hosts::record_operator_event(
                                c,
                                "send",
                                &subject,
                                &by.operator,
                                Some(&by.reason),
                                clock.now_ms(),
                            )?;
                            message_id.clone()
                        }
                        Accepted::Duplicate { message_id, .. } => message_id.clone(),
                    };
                    let deliveries = accept::fan_out(c, &id, clock.now_ms())?;
                    Ok((accepted, deliveries))
                })
                .await
            }
        }
    }

    /// What purging `target` would remove, changing nothing.
    pub async fn purge_plan(&self, target: PurgeOf) -> StoreResult<purge::Plan> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| purge::plan(c, target.as_target())).await,
        }
    }

    /// Purges `target` when every delivery of it is settled; returns the plan it followed.
    pub async fn purge(&self, target: PurgeOf, by: By) -> StoreResult<purge::Plan> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| purge::purge(c, target.as_target(), &by.operator, &by.reason, clock.now_ms())).await
            }
        }
    }

    /// What purging the settled deliveries of recipient `host` would remove, changing nothing.
    pub async fn purge_host_plan(&self, host: String) -> StoreResult<purge::HostPlan> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| purge::host_plan(c, &host)).await,
        }
    }

    /// Purges the settled deliveries of recipient `host` (and the messages only it received);
    /// returns the plan it followed.
    pub async fn purge_host(&self, host: String, by: By) -> StoreResult<purge::HostPlan> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| purge::purge_host(c, &host, &by.operator, &by.reason, clock.now_ms())).await
            }
        }
    }

    /// The delivery an id or a unique prefix names.
    pub async fn resolve_delivery(&self, prefix: String) -> StoreResult<listing::Resolved> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| listing::resolve_delivery(c, &prefix)).await,
        }
    }

    /// Why a delivery is where it is, at `now_ms`.
    pub async fn explain(
        &self,
        delivery_id: String,
        now_ms: i64,
        silence_warn_ms: i64,
    ) -> StoreResult<explain::Explanation> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.read(move |c| explain::explain_id(c, &delivery_id, now_ms, silence_warn_ms)).await
            }
        }
    }

    /// One page of deliveries, each that is not final with its one-line reason at `now_ms`
    /// (and, with `short_ids`, its shortest unique id prefix), and the cursor of the next page.
    pub async fn deliveries_page(
        &self,
        q: listing::ListQuery,
        now_ms: i64,
        silence_warn_ms: i64,
        short_ids: bool,
    ) -> StoreResult<(Vec<listing::Listed>, Option<i64>)> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.read(move |c| {
                    let page = listing::page(c, &q)?;
                    let mut explainer = explain::Explainer::new(c, now_ms, silence_warn_ms)?;
                    let mut listed = Vec::with_capacity(page.rows.len());
                    for (row, cursor) in page.rows.into_iter().zip(page.cursors) {
                        let why = explainer.reason(&row)?;
                        let short_id = if short_ids { Some(listing::short_id(c, &row.delivery_id)?) } else { None };
                        listed.push(listing::Listed { row, why, cursor, short_id });
                    }
                    Ok((listed, page.next))
                })
                .await
            }
        }
    }

    /// Releases held deliveries (after the fences whose time is up are lifted); unless `force`,
    /// refuses, releasing nothing, when an active hold or block fence would catch them again.
    pub async fn release(&self, sel: Select, by: By, force: bool) -> StoreResult<Release> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    let now_ms = clock.now_ms();
                    fences::lift_expired(c, now_ms)?;
                    if !force {
                        let named = would_hold_again(c, sel.as_selector())?;
                        if !named.is_empty() {
                            return Ok(Release::WouldHoldAgain(named));
                        }
                    }
                    operator::release(c, sel.as_selector(), &by.operator, &by.reason, now_ms).map(Release::Released)
                })
                .await
            }
        }
    }

    /// What `retire` would do to the host, changing nothing (`NotFound` as `retire`).
    pub async fn retire_plan(&self, host: String) -> StoreResult<operator::RetirePlan> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| operator::retire_plan(c, &host)).await,
        }
    }

    /// Retires the host: its pending work swept and every membership ended, in one
    /// transaction. Returns what was swept and the conversations it left.
    pub async fn retire(&self, host: String, by: By) -> StoreResult<(operator::Swept, Vec<String>)> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    let swept = operator::retire(c, &host, &by.operator, &by.reason, clock.now_ms())?;
                    let left = members::leave_all(c, &host, &by.operator, &by.reason, clock.now_ms())?;
                    Ok((swept, left))
                })
                .await
            }
        }
    }

    /// Requeues what the instance holds (on `host` only, when given; an unenrolled host is
    /// `Invalid`).
    pub async fn requeue(&self, instance: String, host: Option<String>, by: By) -> StoreResult<operator::Swept> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| match host {
                    Some(host) => {
                        if hosts::standing(c, &host)? == Standing::NotEnrolled {
                            return Err(StoreError::Invalid(format!("host {host:?} is not enrolled")));
                        }
                        operator::requeue_host_instance(c, &host, &instance, &by.operator, &by.reason, clock.now_ms())
                    }
                    None => operator::requeue_instance(c, &instance, &by.operator, &by.reason, clock.now_ms()),
                })
                .await
            }
        }
    }

    /// Records an operator event in the audit log (a CA change).
    pub async fn record_operator_event(
        &self,
        action: String,
        subject: String,
        operator: String,
        note: Option<String>,
    ) -> StoreResult<()> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    hosts::record_operator_event(c, &action, &subject, &operator, note.as_deref(), clock.now_ms())
                })
                .await
            }
        }
    }

    /// A consistent copy of the record at `path`, checked.
    pub async fn backup_to(&self, path: std::path::PathBuf) -> StoreResult<()> {
        match &self.backend {
            Backend::Sqlite(s) => s.read(move |c| backup::copy_to(sqlite_conn(c)?, &path)).await,
            Backend::Postgres(_) => Err(sqlite_only("backup_to")),
        }
    }

    /// Every invariant, including a full integrity check; the problems found.
    pub async fn verify(&self) -> StoreResult<Vec<verify::Problem>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(verify::check).await,
        }
    }
}

/// Who approves or rejects, as `Store::decide_approval` takes it.
#[derive(Debug, Clone)]
pub enum ApprovalBy {
    /// An operator, by name.
    Operator(String),
    /// A producer (its approval right is checked), by name.
    Producer(String),
}

/// A certificate just issued, to be recorded (owned; see `hosts::Issued`).
#[derive(Debug, Clone)]
pub struct Enrollment {
    /// Node or producer.
    pub role: baton_shared::ids::Role,
    /// The host or producer name.
    pub name: String,
    /// The certificate's serial (lowercase hex).
    pub serial: String,
    /// When it expires (unix seconds).
    pub not_after_unix: i64,
    /// A producer's publish scope, set in the same transaction, when given.
    pub scope: Option<Vec<String>>,
    /// Revoke the name's other unrevoked certificates in the same transaction (a renewal).
    pub revoke_old: bool,
    /// Why, recorded in the audit log with the enrollment (as every changing command's
    /// `--reason` is).
    pub reason: String,
    /// A producer's quota, set in the same transaction when it changes anything (an empty
    /// change leaves the stored quota, or the default, as it is).
    pub quota: producers::QuotaChange,
}

/// Operations on identities (the CLI's `enroll`, `renew`, `revoke`, `certs`).
impl Store {
    /// The roles `name` is enrolled in.
    pub async fn enrolled_roles(&self, name: String) -> StoreResult<Vec<baton_shared::ids::Role>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| hosts::enrolled_roles(c, &name)).await,
        }
    }

    /// Every certificate.
    pub async fn certificates(&self) -> StoreResult<Vec<fleet::CertRow>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(|c| fleet::certificates(c, None)).await,
        }
    }

    /// Records an issued certificate, in one transaction: refused (`Invalid`) when the name is
    /// enrolled in the other role; with the producer's scope when given; revoking the name's
    /// other certificates when asked. Returns the serials revoked.
    pub async fn enroll(&self, e: Enrollment, operator: String) -> StoreResult<Vec<String>> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    let now_ms = clock.now_ms();
                    let (role, name) = (e.role, e.name.as_str());
                    if let Some(r) = hosts::enrolled_roles(c, name)?.into_iter().find(|r| *r != role) {
                        return Err(StoreError::Invalid(format!(
                            "{name} is already enrolled as a {r}; a name has one role only"
                        )));
                    }
                    let issued = hosts::Issued { role, name, serial: &e.serial, not_after_unix: e.not_after_unix };
                    hosts::enroll(c, issued, &operator, &e.reason, now_ms)?;
                    if let Some(patterns) = &e.scope {
                        producers::set_scope(c, name, patterns, &operator, "enrolled", now_ms)?;
                    }
                    if !e.quota.is_empty() {
                        producers::set_quota(c, name, e.quota, &operator, &e.reason, now_ms)?;
                    }
                    let mut revoked = Vec::new();
                    if e.revoke_old {
                        for old in fleet::certificates(c, Some((role, name)))? {
                            if old.revoked.is_none() && old.serial != e.serial {
                                revoked.extend(hosts::revoke(
                                    c,
                                    &old.serial,
                                    &operator,
                                    "renewed; old certificate revoked",
                                    now_ms,
                                )?);
                            }
                        }
                    }
                    Ok(revoked)
                })
                .await
            }
        }
    }

    /// Revokes every unrevoked certificate of a name, or one by serial; returns the serials.
    pub async fn revoke(&self, name_or_serial: String, by: By) -> StoreResult<Vec<String>> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| hosts::revoke(c, &name_or_serial, &by.operator, &by.reason, clock.now_ms())).await
            }
        }
    }
}

/// Which deliveries a cancel of many picks (owned; see `turns::CancelScope`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOf {
    /// One delivery, by id.
    Delivery(String),
    /// Every delivery of a conversation a cancel can still change.
    Conversation(String),
    /// Every delivery to a host a cancel can still change.
    Host(String),
}

/// Operations on turns (the CLI's `deliveries cancel|retry` and `redrive`).
impl Store {
    /// The operator cancels the deliveries `which` names (or, with `dry_run`, says what a cancel
    /// would do, changing nothing), in one transaction; one result per delivery.
    pub async fn cancel(
        &self,
        which: CancelOf,
        by: By,
        dry_run: bool,
    ) -> StoreResult<Vec<baton_shared::wire::CancelResult>> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    let ids = match &which {
                        CancelOf::Delivery(id) => vec![id.clone()],
                        CancelOf::Conversation(conv) => turns::cancellable(c, turns::CancelScope::Conversation(conv))?,
                        CancelOf::Host(host) => turns::cancellable(c, turns::CancelScope::Host(host))?,
                    };
                    let canceller = turns::Canceller::Operator(&by.operator);
                    ids.iter().map(|id| turns::cancel(c, id, canceller, &by.reason, dry_run, clock.now_ms())).collect()
                })
                .await
            }
        }
    }

    /// The operator queues a delivery's turn again as a new run; returns the run.
    pub async fn retry(&self, delivery_id: String, by: By) -> StoreResult<u32> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| turns::retry(c, &delivery_id, &by.operator, &by.reason, clock.now_ms())).await
            }
        }
    }

    /// The redrive recorded under `request_id`, if one was.
    pub async fn recorded_redrive(&self, request_id: String) -> StoreResult<Option<turns::RecordedRedrive>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => s.read(move |c| turns::recorded_redrive(c, &request_id)).await,
        }
    }

    /// The next at most `room` deliveries the redrive `filter` picks after the cursor `after`,
    /// with their cursors, changing nothing.
    pub async fn redrive_preview(
        &self,
        filter: turns::RedriveFilter,
        after: i64,
        room: u32,
    ) -> StoreResult<Vec<(String, i64)>> {
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.read(move |c| turns::redrive_batch(c, &filter, after, room)).await
            }
        }
    }

    /// Re-runs the next at most `room` deliveries the redrive `filter` picks after the cursor
    /// `after`, in one transaction; returns them with their cursors.
    pub async fn redrive_batch(
        &self,
        filter: turns::RedriveFilter,
        after: i64,
        room: u32,
        by: By,
    ) -> StoreResult<Vec<(String, i64)>> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    let batch = turns::redrive_batch(c, &filter, after, room)?;
                    for (id, _) in &batch {
                        turns::retry(c, id, &by.operator, &by.reason, clock.now_ms())?;
                    }
                    Ok(batch)
                })
                .await
            }
        }
    }

    /// Records a finished redrive under its request id.
    pub async fn record_redrive(
        &self,
        request_id: String,
        by: By,
        filter: turns::RedriveFilter,
        redriven: i64,
    ) -> StoreResult<()> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) | Backend::Postgres(s) => {
                s.write(move |c| {
                    turns::record_redrive(c, &request_id, &by.operator, &by.reason, &filter, redriven, clock.now_ms())
                })
                .await
            }
        }
    }
}

/// Operations on the record's file (the CLI's `restore`).
impl Store {
    /// The schema version of the SQLite file at `path`, opened to read only as it is (older
    /// schemas included: nothing is migrated or checked).
    pub fn file_schema_version(path: &Path) -> StoreResult<i64> {
        let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        super::schema_version(&conn)
    }

    /// SQLite's full integrity check: what it found wrong (empty when nothing).
    pub async fn integrity(&self) -> StoreResult<Vec<String>> {
        match &self.backend {
            Backend::Sqlite(s) => s.read(|c| backup::integrity(sqlite_conn(c)?)).await,
            Backend::Postgres(_) => Err(sqlite_only("integrity")),
        }
    }

    /// What the record holds, for a restore's report (`schema_version` as found before any
    /// migration).
    pub async fn backup_facts(&self, schema_version: i64) -> StoreResult<backup::Facts> {
        match &self.backend {
            Backend::Sqlite(s) => s.read(move |c| backup::facts(sqlite_conn(c)?, schema_version)).await,
            Backend::Postgres(_) => Err(sqlite_only("backup_facts")),
        }
    }

    /// Folds the write-ahead log into the database file.
    pub async fn checkpoint(&self) -> StoreResult<()> {
        match &self.backend {
            Backend::Sqlite(s) => s.read(|c| backup::checkpoint(sqlite_conn(c)?)).await,
            Backend::Postgres(_) => Err(sqlite_only("checkpoint")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
            producer: "p".into(),
            conversation: "c".into(),
            idempotency_key: key.into(),
            payload: "{}".into(),
            to: vec!["host-a".into()],
        }
    }

    /// The hub's way to the file (writer thread, read pool) and the CLI's (one connection in
    /// place) run the same operations to the same record.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn served_and_direct_stores_see_one_record() {
        let db = testing::db();
        let clock = baton_shared::clock::system();
        let limits = AcceptLimits { queued_per_host_max: 10 };
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
        let limits = AcceptLimits { queued_per_host_max: 100 };
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
        let limits = AcceptLimits { queued_per_host_max: 10 };
        assert!(read_only.send(message("k"), limits, By { operator: "op".into(), reason: "r".into() }).await.is_err());
        assert_eq!(read_only.status().await.unwrap().pending_fanout, 0);
        assert!(read_only.message_id_by_key("p".into(), "k".into()).await.unwrap().is_none());
    }
}
