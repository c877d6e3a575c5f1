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

use super::accept::{self, AcceptLimits, Accepted, NewMessage, RetryPolicy};
use super::claim::{self, Claimant, RebindLimit};
use super::fences::{self, FenceRow};
use super::fleet::{self, HostRow, SilentHost};
use super::hosts::{self, CertStatus, Standing};
use super::overview::{self, ConversationBacklog, HostBacklog};
use super::read::{self, DeliveryDetail, DeliveryRow, StatusView};
use super::report::{self, NewReport, RunReport};
use super::silence::{self, SilentHolder};
use super::transition::Holder;
use super::{Readers, StoreError, StoreResult, Writer, batch, members, producers, retention, sessions, turns};
use baton_shared::clock::SharedClock;
use baton_shared::crash_point;
use baton_shared::sqlite::Synchronous;
use baton_shared::states::Outcome;
use baton_shared::wire::{
    AttemptView, CancelNotice, ClaimedDelivery, ConversationView, DeliverySummary, HolderItem, MessageView, RejectItem,
    ReportRequest, ReportResponse, StartItem, StartResult, TransitionResponse,
};
use rusqlite::Connection;
use std::path::Path;
use std::sync::Arc;
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
    Sqlite(SqliteStore),
}

/// The SQLite backend.
#[derive(Clone)]
struct SqliteStore {
    /// The single writer; `None` for a store opened to read only.
    writer: Option<Writer>,
    /// Read connections.
    readers: Arc<Readers>,
}

impl SqliteStore {
    /// Runs `f` in the next write transaction (see `Writer::call`).
    async fn write<R, F>(&self, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    {
        match &self.writer {
            Some(w) => w.call(f).await,
            None => Err(StoreError::Internal("the record was opened to read only".into())),
        }
    }

    /// Runs a read-only `f` in one read transaction (see `Readers::read`).
    async fn read<R, F>(&self, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    {
        self.readers.read(f).await
    }
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

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenFailed {
    /// The file was refused (damaged, unreadable, newer, missing).
    #[error("{0}")]
    Refused(#[from] baton_shared::sqlite::OpenError),
    /// The writer thread could not be started.
    #[error("starting the writer thread: {0}")]
    Writer(#[from] std::io::Error),
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
    pub trouble: Vec<DeliveryRow>,
}

/// Reads the overview at `now_ms` on `conn` (inside one read transaction: one snapshot).
pub(crate) fn gather(conn: &Connection, now_ms: i64, silence: Duration) -> StoreResult<Overview> {
    let silence_ms = i64::try_from(silence.as_millis()).unwrap_or(i64::MAX);
    Ok(Overview {
        status: read::status(conn)?,
        outcomes: overview::outcome_counts(conn)?,
        hosts: fleet::hosts(conn)?,
        backlogs: overview::host_backlogs(conn)?,
        conversations: overview::conversation_backlogs(conn, overview::CONVERSATIONS_SHOWN_MAX)?,
        fences: fences::list(conn, false)?,
        silent: fleet::silent_hosts(conn, now_ms, silence_ms)?,
        trouble: overview::recent_trouble(conn, overview::TROUBLE_SHOWN_MAX)?,
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
    }
}

/// A report's run and retry bounds.
fn run_report(req: &ReportRequest, session: Option<u64>, backoff: Backoff) -> RunReport {
    RunReport {
        attempt: req.attempt,
        signal: req.signal,
        session,
        retry_backoff: backoff.base,
        retry_backoff_max: backoff.max,
    }
}

/// A holder's step, applied on `conn`.
fn apply_step(
    conn: &Connection,
    step: Step,
    host: &str,
    id: &str,
    h: Holder<'_>,
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    match step {
        Step::Mirrored => claim::mirrored(conn, host, id, h, now_ms),
        Step::Ack => claim::ack(conn, host, id, h, now_ms),
    }
}

impl Store {
    /// The record in the SQLite file at `path`, served by a writer thread that owns `conn`
    /// (opened by `open_serve` or `open_write`) and a pool of read connections.
    pub fn sqlite(conn: Connection, path: &Path, clock: SharedClock) -> std::io::Result<Store> {
        let writer = Writer::start(conn)?;
        let readers = Arc::new(Readers::new(path.to_path_buf()));
        Ok(Store { backend: Backend::Sqlite(SqliteStore { writer: Some(writer), readers }), clock })
    }

    /// Opens the SQLite file at `path` for serving (`open_serve`: migrations applied, the whole
    /// file checked).
    pub fn open_serve(path: &Path, synchronous: Synchronous, clock: SharedClock) -> anyhow::Result<Store> {
        let conn = super::open_serve(path, synchronous)?;
        Ok(Store::sqlite(conn, path, clock)?)
    }

    /// Opens the SQLite file at `path` for changing (`open_write`: migrations applied, the
    /// file's structure checked), as a changing CLI command or a benchmark does.
    pub fn open_write(path: &Path, synchronous: Synchronous, clock: SharedClock) -> Result<Store, OpenFailed> {
        let conn = super::open_write(path, synchronous)?;
        Store::sqlite(conn, path, clock).map_err(OpenFailed::Writer)
    }

    /// Opens the SQLite file at `path` to read only (its schema must be current; nothing is
    /// migrated). Every changing method answers `StoreError::Internal`.
    pub fn open_read(path: &Path, clock: SharedClock) -> Result<Store, OpenFailed> {
        // Opened once here so that a missing or newer file is refused now, not at the first read.
        drop(super::open_read(path)?);
        let readers = Arc::new(Readers::new(path.to_path_buf()));
        Ok(Store { backend: Backend::Sqlite(SqliteStore { writer: None, readers }), clock })
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
            Backend::Sqlite(s) => {
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
            Backend::Sqlite(s) => s.write(move |c| retention::sweep(c, cutoff_ms, max)).await,
        }
    }

    /// Removes up to `max` audit rows written before `cutoff_ms`; returns how many.
    pub async fn audit_sweep(&self, cutoff_ms: i64, max: usize) -> StoreResult<usize> {
        match &self.backend {
            Backend::Sqlite(s) => s.write(move |c| retention::sweep_audit(c, cutoff_ms, max)).await,
        }
    }

    /// Records the node sessions' last contact: `(host, session, at_ms)`.
    pub async fn record_contacts(&self, contacts: Vec<(String, u64, i64)>) -> StoreResult<()> {
        match &self.backend {
            Backend::Sqlite(s) => s.write(move |c| sessions::record_contacts(c, &contacts)).await,
        }
    }

    /// When the next time-boxed fence's time is up, if any.
    pub async fn next_fence_expiry(&self) -> StoreResult<Option<i64>> {
        match &self.backend {
            Backend::Sqlite(s) => s.read(fences::next_expiry).await,
        }
    }

    /// Lifts the fences whose time is up at `now_ms`; returns their ids.
    pub async fn lift_expired_fences(&self, now_ms: i64) -> StoreResult<Vec<i64>> {
        match &self.backend {
            Backend::Sqlite(s) => s.write(move |c| fences::lift_expired(c, now_ms)).await,
        }
    }

    /// Node instances whose open session was last heard from before `cutoff_ms` and that hold
    /// claimed or mirrored deliveries.
    pub async fn silent_holders(&self, cutoff_ms: i64) -> StoreResult<Vec<SilentHolder>> {
        match &self.backend {
            Backend::Sqlite(s) => s.read(move |c| silence::silent_holders(c, cutoff_ms)).await,
        }
    }

    /// Returns to the queue what the silent instance `who` holds, if it is still silent;
    /// returns the deliveries requeued.
    pub async fn requeue_silent(&self, who: SilentHolder, cutoff_ms: i64, now_ms: i64) -> StoreResult<Vec<String>> {
        match &self.backend {
            Backend::Sqlite(s) => s.write(move |c| silence::requeue_silent(c, &who, cutoff_ms, now_ms)).await,
        }
    }

    // ---- Reads for operators, status and metrics ----

    /// Counts per state, pending fan-out, fences and hosts.
    pub async fn status(&self) -> StoreResult<StatusView> {
        match &self.backend {
            Backend::Sqlite(s) => s.read(read::status).await,
        }
    }

    /// The status page's overview at `now_ms`, flagging hosts silent longer than `silence`.
    pub async fn overview(&self, now_ms: i64, silence: Duration) -> StoreResult<Overview> {
        match &self.backend {
            Backend::Sqlite(s) => s.read(move |c| gather(c, now_ms, silence)).await,
        }
    }

    /// Each host's backlog and the deliveries by current-run outcome, in one snapshot.
    pub async fn backlog_gauges(&self) -> StoreResult<(Vec<HostBacklog>, Vec<(Outcome, i64)>)> {
        match &self.backend {
            Backend::Sqlite(s) => s.read(|c| Ok((overview::host_backlogs(c)?, overview::outcome_counts(c)?))).await,
        }
    }

    /// One delivery with its events and attempts.
    pub async fn delivery_detail(&self, delivery_id: String) -> StoreResult<DeliveryDetail> {
        match &self.backend {
            Backend::Sqlite(s) => s.read(move |c| read::delivery_detail(c, &delivery_id)).await,
        }
    }

    /// A certificate's standing (`None`: not in the record).
    pub async fn cert_status(&self, serial: String) -> StoreResult<Option<CertStatus>> {
        match &self.backend {
            Backend::Sqlite(s) => s.read(move |c| hosts::cert_status(c, &serial)).await,
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
            Backend::Sqlite(s) => {
                s.write(move |c| accept::accept_and_fan_out(c, &msg, retry, limits, clock.now_ms())).await
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
            Backend::Sqlite(s) => {
                s.write(move |c| {
                    let now = clock.now_ms();
                    batch::each(c, messages, |c, (msg, retry)| accept::accept_and_fan_out(c, &msg, retry, limits, now))
                })
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
            Backend::Sqlite(s) => {
                s.write(move |c| turns::cancel_message(c, &message_id, &producer, &reason, clock.now_ms())).await
            }
        }
    }

    /// The id of `producer`'s message with idempotency key `key`, if any.
    pub async fn message_id_by_key(&self, producer: String, key: String) -> StoreResult<Option<String>> {
        match &self.backend {
            Backend::Sqlite(s) => s.read(move |c| read::message_id_by_key(c, &producer, &key)).await,
        }
    }

    /// A message with its deliveries and attempts.
    pub async fn message_by_id(&self, message_id: String) -> StoreResult<MessageView> {
        match &self.backend {
            Backend::Sqlite(s) => s.read(move |c| read::message_view(c, &message_id)).await,
        }
    }

    /// A conversation's `last_seq` and membership registry, for a producer whose publish scope
    /// covers it.
    pub async fn conversation_for(&self, producer: String, conversation: String) -> StoreResult<ConversationView> {
        match &self.backend {
            Backend::Sqlite(s) => {
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
    ) -> StoreResult<sessions::Opened> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) => {
                s.write(move |c| {
                    sessions::open(c, &host, &instance_id, node_version.as_deref(), rebind, clock.now_ms())
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
            Backend::Sqlite(s) => {
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
            Backend::Sqlite(s) => {
                s.write(move |c| {
                    sessions::check(c, &host, Some(session))?;
                    turns::start(c, &host, &instance_id, session, &starts, clock.now_ms())
                })
                .await
            }
        }
    }

    /// The look before a claim, at `now_ms` (a read): whether a claim may hand something out,
    /// and otherwise the pending cancel notices and the next retry.
    pub async fn claim_look(&self, who: Claimer, now_ms: i64) -> StoreResult<ClaimLook> {
        match &self.backend {
            Backend::Sqlite(s) => {
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
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) => {
                s.write(move |c| {
                    let now = clock.now_ms();
                    sessions::check(c, &who.host, who.session)?;
                    let deliveries = claim::claim_as(c, who.claimant(), max, now)?;
                    let cancels = turns::cancels_for(c, &who.host, &who.instance_id)?;
                    // A retired host's claim hands out nothing; only an empty one asks why.
                    let retired = deliveries.is_empty() && hosts::standing(c, &who.host)? == Standing::Retired;
                    let next_retry_at_ms = turns::next_retry_at(c, &who.host, now)?;
                    Ok(Claimed { deliveries, cancels, next_retry_at_ms, retired })
                })
                .await
            }
        }
    }

    /// What the instance holds (claimed or mirrored).
    pub async fn holdings(&self, node: NodeAt, instance_id: String) -> StoreResult<Vec<ClaimedDelivery>> {
        match &self.backend {
            Backend::Sqlite(s) => {
                s.read(move |c| {
                    sessions::check(c, &node.host, node.session)?;
                    claim::holdings(c, &node.host, &instance_id)
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
            Backend::Sqlite(s) => {
                s.write(move |c| {
                    sessions::check(c, &node.host, node.session)?;
                    let h = holder.as_holder();
                    apply_step(c, step, &node.host, &delivery_id, h, clock.now_ms())
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
            Backend::Sqlite(s) => {
                s.write(move |c| {
                    sessions::check(c, &node.host, node.session)?;
                    let now = clock.now_ms();
                    batch::each(c, items, |c, d| {
                        let h = Holder { instance_id: &instance_id, claim_token: &d.claim_token };
                        apply_step(c, step, &node.host, &d.delivery_id, h, now)
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
            Backend::Sqlite(s) => {
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
            Backend::Sqlite(s) => {
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
    pub async fn report(&self, node: NodeAt, req: ReportRequest, backoff: Backoff) -> StoreResult<Reported> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) => {
                s.write(move |c| {
                    sessions::check(c, &node.host, node.session)?;
                    let run = run_report(&req, node.session, backoff);
                    report::report_run(c, &node.host, &new_report(&req), &run, clock.now_ms())
                })
                .await
            }
        }
    }

    /// Records each report as `report` would, in one transaction after one session check; one
    /// result per report, in order.
    pub async fn report_batch(
        &self,
        node: NodeAt,
        reports: Vec<ReportRequest>,
        backoff: Backoff,
    ) -> StoreResult<Vec<StoreResult<ReportResponse>>> {
        let clock = self.clock.clone();
        match &self.backend {
            Backend::Sqlite(s) => {
                s.write(move |c| {
                    sessions::check(c, &node.host, node.session)?;
                    let now = clock.now_ms();
                    batch::each(c, reports, |c, req| {
                        let run = run_report(&req, node.session, backoff);
                        let (attempt, duplicate, retry_at_ms) =
                            report::report_run(c, &node.host, &new_report(&req), &run, now)?;
                        Ok(ReportResponse { attempt, delivery_id: req.delivery_id, duplicate, retry_at_ms })
                    })
                })
                .await
            }
        }
    }
}
