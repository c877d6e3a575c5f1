//! The node loop (SPEC §4): startup recovery, holdings resync, long-poll claims, mirror, tell
//! the hub `mirrored`, ack; and the tasks that run turns (`sched`) and send reports (`report`).
//!
//! Tasks: the claim loop runs on the caller's task; the scheduler, the outbox, the renewal of
//! running turns with their progress (`progress`) and the retention sweep each run on their own. They share one `shared_state::Shared` (hub client, store, config, clock) and one
//! shutdown token.
//!
//! Invariant (execution gate): only a delivery the hub confirmed `delivered` is marked
//! `acked` locally, and only `acked` deliveries start (`Db::begin_attempt` checks it in SQL).
//! Invariant (crash honesty): an attempt with a start marker and no end marker at startup is
//! ended `unknown` and reported, never run again (`Db::recover_interrupted_attempts`).
//! Invariant (no orphaned harness): before that, what is left of each such attempt's recorded
//! process group is stopped (`recover`, through `group::stop_recorded`).

use crate::client::Hub;
use crate::config::NodeConfig;
use crate::exec::Gate;
use crate::group;
use crate::limits::{BACKOFF_BASE, STORE_SIZE_CHECK_PACE};
use crate::shared_state::{Shared, StartLease};
use crate::store::{CancelLocal, ExecState, Mirrored, ReportState, Store, StoreError};
use crate::{report, retention, sched};
use baton_client::{Backoff, ClientError};
use baton_shared::clock::SharedClock;
use baton_shared::crash_point;
use baton_shared::error::ErrorCode;
use baton_shared::states::DeliveryState;
use baton_shared::wire::{CancelNotice, ClaimedDelivery};
use handoff::{handoff_batch, reject, take_batch, validate};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// After an empty claim answer, the next claim waits at least this long since the last one
/// was sent, so a short `claim_wait` never turns into busy polling.
const EMPTY_CLAIM_PACE: Duration = Duration::from_secs(1);

/// The error `run_agent` ends with when the hub refused this node for good (its certificate
/// revoked): exit status `baton_shared::exit::REVOKED`, not a failure to retry.
#[derive(Debug, thiserror::Error)]
#[error("stopped for good: {0}")]
pub struct Finished(pub String);

/// The error `run_agent` ends with when a newer session of this node instance (another process
/// with this data directory, or a copy of it) replaced this one: exit status
/// `baton_shared::exit::SUPERSEDED`.
#[derive(Debug, thiserror::Error)]
#[error("taken over: {0}")]
pub struct Superseded(pub String);

/// The reason an attempt is reported `unknown` with when the hub lists a delivered run this
/// data directory has no record of: it never runs here.
pub const REASON_NO_LOCAL_RECORD: &str =
    "delivered to this instance, but this data directory has no record of it (a copy or a restore?)";

/// Why a step of the loop stopped.
#[derive(Debug)]
enum Stop {
    /// The hub could not be reached or refused; the caller backs off and retries.
    Hub(ClientError),
    /// Shutdown began.
    Shutdown,
    /// The store failed: fatal.
    Store(StoreError),
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Stop::Store(e)
    }
}

/// Runs the node until `shutdown` completes (or the store fails), then stops claiming, lets
/// running turns finish within `shutdown_grace`, stops the rest, and flushes the outbox.
/// Stored timestamps come from `clock`; turns start through `gate`.
pub async fn run_agent<H: Hub>(
    config: NodeConfig,
    store: Store,
    hub: H,
    instance_id: String,
    clock: SharedClock,
    gate: Gate,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    recover(&store, config.kill_grace, &clock).await?;
    let progress = Arc::new(crate::progress::Progress::new(crate::progress::ProgressLimits {
        event_bytes_max: config.progress_event_bytes_max,
        events_per_turn_max: config.progress_events_per_turn_max,
        events_per_second_max: config.progress_events_per_second_max,
        buffer_events_max: config.progress_buffer_events_max,
    }));
    let telemetry = match &config.otlp_endpoint {
        Some(endpoint) => {
            let t = baton_telemetry::Telemetry::start(endpoint, "baton-node")
                .map_err(|e| anyhow::anyhow!("otlp_endpoint: {e}"))?;
            tracing::info!(otlp_endpoint = %endpoint, "exporting spans of each delivery over OTLP");
            t
        }
        None => baton_telemetry::Telemetry::off(),
    };
    let sh = Arc::new(Shared {
        progress,
        hub,
        store,
        telemetry: telemetry.clone(),
        config,
        instance_id,
        gate,
        clock,
        wake_scheduler: Notify::new(),
        wake_outbox: Notify::new(),
        wake_claimer: Notify::new(),
        shutdown: CancellationToken::new(),
        finished: std::sync::OnceLock::new(),
        superseded: std::sync::OnceLock::new(),
        kill_turns: CancellationToken::new(),
        session: std::sync::OnceLock::new(),
        after_own_crash: std::sync::OnceLock::new(),
        running: std::sync::Mutex::new(HashMap::new()),
        starts_unconfirmed: std::sync::atomic::AtomicBool::new(false),
        batch_unknown: std::sync::atomic::AtomicBool::new(false),
        handoff_unknown: std::sync::atomic::AtomicBool::new(false),
        acked_here: Mutex::new(HashMap::new()),
        lease: Mutex::new(StartLease::default()),
        started_offline: std::sync::atomic::AtomicBool::new(false),
    });
    let token = sh.shutdown.clone();
    let signal = tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutdown requested: no new claims or turns");
        token.cancel();
    });
    let ran = match session::register_session(&sh).await {
        Ok(true) => run_tasks(&sh).await,
        Ok(false) => Ok(()),
        Err(e) => Err(e),
    };
    // The last spans leave before the node does (bounded by the exporter's own timeout).
    if telemetry.is_on() {
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    }
    ran?;
    signal.abort();
    if let Some(why) = sh.superseded.get() {
        sh.store.call(|db| db.record_session_end("superseded")).await?;
        return Err(Superseded(why.clone()).into());
    }
    if let Some(why) = sh.finished.get() {
        return Err(Finished(why.clone()).into());
    }
    session::end_session(&sh).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Runs the claim loop, the scheduler, the retention sweep and the outbox until shutdown, then
/// drains them (the outbox is flushed once more, unless a newer session replaced this one).
async fn run_tasks<H: Hub>(sh: &Arc<Shared<H>>) -> anyhow::Result<()> {
    let sched = tokio::spawn(stop_all_on_error(Arc::clone(sh), sched::scheduler(Arc::clone(sh))));
    let retention = tokio::spawn(stop_all_on_error(Arc::clone(sh), retention::retention_loop(Arc::clone(sh))));
    let renewal = tokio::spawn(stop_all_on_error(Arc::clone(sh), crate::renewal::renewal_loop(Arc::clone(sh))));
    let outbox_stop = CancellationToken::new();
    let outbox =
        tokio::spawn(stop_all_on_error(Arc::clone(sh), report::outbox_loop(Arc::clone(sh), outbox_stop.clone())));
    let claimed = claim_loop(sh).await;
    sh.shutdown.cancel();
    let sched = sched.await.map_err(anyhow::Error::from).and_then(|r| r);
    let retention = retention.await.map_err(anyhow::Error::from).and_then(|r| r);
    let renewal = renewal.await.map_err(anyhow::Error::from).and_then(|r| r);
    outbox_stop.cancel();
    let outbox = outbox.await.map_err(anyhow::Error::from).and_then(|r| r);
    claimed?;
    sched?;
    retention?;
    renewal?;
    outbox?;
    if sh.superseded.get().is_some() {
        return Ok(());
    }
    match tokio::time::timeout(crate::limits::SHUTDOWN_REPORT_FLUSH, report::flush(sh)).await {
        Ok(r) => r?,
        Err(_) => tracing::warn!("reports still waiting at shutdown; they are sent at the next start"),
    }
    Ok(())
}

/// Startup recovery, before anything else runs: for every attempt with a start marker and no
/// end marker, stops what is left of its recorded process group (SIGTERM, SIGKILL after
/// `kill_grace`; all groups at once, only after the same-process check), and then ends the
/// attempt `unknown`, to be reported and never run again.
async fn recover(store: &Store, kill_grace: Duration, clock: &SharedClock) -> Result<(), StoreError> {
    let interrupted = store.call(|db| db.interrupted_attempts()).await?;
    let mut notes = HashMap::new();
    let mut stops = JoinSet::new();
    for i in interrupted {
        match i.process {
            None => {
                notes.insert(i.attempt_id, "no harness process was recorded for it".to_string());
            }
            Some(p) => {
                tracing::info!(attempt_id = %i.attempt_id, pgid = p.pgid, "stopping what is left of an interrupted turn's harness");
                stops.spawn(async move {
                    let stopped = group::stop_recorded(&p, kill_grace).await;
                    (i.attempt_id, p.pgid, stopped)
                });
            }
        }
    }
    while let Some(joined) = stops.join_next().await {
        let (attempt_id, pgid, stopped) = joined.map_err(|e| StoreError::Task(e.to_string()))?;
        let note = match stopped {
            Ok(s) => s.describe(pgid, kill_grace),
            Err(e) => {
                tracing::error!(attempt_id, pgid, "cannot check the harness process group: {e}");
                format!("its harness process group {pgid} could not be checked ({e})")
            }
        };
        notes.insert(attempt_id, note);
    }
    let now_ms = clock.now_ms();
    let recovered = store.call(move |db| db.recover_interrupted_attempts(&notes, now_ms)).await?;
    for attempt_id in &recovered {
        tracing::warn!(
            attempt_id,
            "attempt was running when the node stopped; reporting it unknown, not running it again"
        );
    }
    Ok(())
}

async fn stop_all_on_error<H: Hub>(
    sh: Arc<Shared<H>>,
    task: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let r = task.await;
    if let Err(e) = &r {
        tracing::error!("{e:#}; stopping");
        sh.shutdown.cancel();
    }
    r
}

/// Claims until shutdown. Resyncs the holdings first, again after any claim whose answer
/// was lost, and again whenever the node moved to another of its hubs (`Hub::hub_moves`): the
/// same resync as after a hub restart. Returns an error only when the store fails.
async fn claim_loop<H: Hub>(sh: &Arc<Shared<H>>) -> anyhow::Result<()> {
    let mut backoff = Backoff::new(BACKOFF_BASE, sh.config.backoff_max);
    let mut need_resync = true;
    // Claim batches being mirrored and handed off while the next claim waits at the hub.
    // Each task answers with the size of its batch: until it is reaped, its deliveries count
    // toward `queue_ahead_batches` like those already waiting in the store.
    let mut handoffs: JoinSet<(i64, Result<(), Stop>)> = JoinSet::new();
    let mut in_flight: i64 = 0;
    // At most how many executions can wait unstarted, counting those in flight: the local
    // queue's size when last read plus what was in flight then and what was claimed since
    // (only mirroring a claim batch or the holdings adds to the queue; starting a turn and
    // reaping a handoff only move or remove). `None` until read, and again after a resync.
    // While it is under the bound the next claim goes without reading the store, whose thread
    // may be busy with a commit (a lone delivery's next claim would wait for its `fsync`).
    let mut unstarted_at_most: Option<i64> = None;
    let mut hub_moves = sh.hub.hub_moves();
    let mut store_full = StoreFull::default();
    let result = loop {
        if sh.shutdown.is_cancelled() {
            break Ok(());
        }
        let moves = sh.hub.hub_moves();
        if moves != hub_moves {
            hub_moves = moves;
            if !need_resync {
                tracing::info!("the node now uses another hub: resyncing holdings there");
            }
            need_resync = true;
        }
        while let Some(done) = handoffs.try_join_next() {
            in_flight -= handoff_ended(done)?;
        }
        if handoffs.len() >= sh.config.handoffs_in_flight as usize {
            tokio::select! {
                done = handoffs.join_next() => if let Some(done) = done { in_flight -= handoff_ended(done)?; },
                _ = sh.shutdown.cancelled() => break Ok(()),
            }
            continue;
        }
        if need_resync {
            // The holdings are read once the batches in hand are handed off, so a resync does
            // not hand off the same deliveries a second time while they are in flight.
            while let Some(done) = handoffs.join_next().await {
                in_flight -= handoff_ended(done)?;
            }
            match resync(sh).await {
                Ok(()) => {
                    need_resync = false;
                    unstarted_at_most = None;
                    backoff.reset();
                }
                Err(Stop::Shutdown) => break Ok(()),
                Err(Stop::Store(e)) => return Err(e.into()),
                Err(Stop::Hub(e)) => {
                    if let Some(why) = e.refused_for_good() {
                        sh.finish(why);
                        break Ok(());
                    }
                    if let Some(message) = e.superseded() {
                        sh.supersede(&message);
                        break Ok(());
                    }
                    log_hub_error("holdings resync", &e);
                    sh.pause(sh.retry_pause(&mut backoff, &e)).await;
                    continue;
                }
            }
        }
        // A store over `store_bytes_max` takes nothing new; what it holds still runs and is
        // reported, and `local_retention` frees room.
        if store_full.over(sh).await? {
            sh.pause(STORE_SIZE_CHECK_PACE).await;
            continue;
        }
        // Work the node cannot start soon stays on the hub (`queue_ahead_batches`).
        let ahead_max = i64::from(sh.config.queue_ahead_batches) * i64::from(sh.config.claim_batch_max);
        loop {
            // Register for the wake before counting, so a turn ending in between is not missed.
            let woken = sh.wake_claimer.notified();
            if unstarted_at_most.is_some_and(|n| n < ahead_max) {
                break;
            }
            let unstarted = sh.store.call(|db| db.queued_count()).await? + in_flight;
            unstarted_at_most = Some(unstarted);
            if unstarted < ahead_max {
                break;
            }
            tokio::select! {
                _ = woken => {}
                Some(done) = handoffs.join_next(), if !handoffs.is_empty() => in_flight -= handoff_ended(done)?,
                _ = sh.shutdown.cancelled() => break,
            }
        }
        if sh.shutdown.is_cancelled() {
            break Ok(());
        }
        let sent = Instant::now();
        let answer = tokio::select! {
            r = sh.hub.claim(sh.config.claim_batch_max, sh.config.claim_wait) => r,
            _ = sh.shutdown.cancelled() => break Ok(()),
        };
        match answer {
            Ok(answer) => {
                backoff.reset();
                for notice in &answer.cancels {
                    cancel_turn(sh, notice).await?;
                }
                if answer.deliveries.is_empty() {
                    sh.pause(EMPTY_CLAIM_PACE.saturating_sub(sent.elapsed())).await;
                    continue;
                }
                crash_point("node.claim.after_response");
                let sh = Arc::clone(sh);
                let n = answer.deliveries.len() as i64;
                in_flight += n;
                unstarted_at_most = unstarted_at_most.map(|u| u + n);
                handoffs.spawn(async move { (n, take_batch(&sh, answer.deliveries).await) });
            }
            Err(e) if let Some(why) = e.refused_for_good() => {
                sh.finish(why);
                break Ok(());
            }
            Err(e) if let Some(message) = e.superseded() => {
                sh.supersede(&message);
                break Ok(());
            }
            Err(e) if e.code() == Some(ErrorCode::InstanceConflict) => {
                tracing::error!(
                    instance_id = %sh.instance_id,
                    "the hub refuses claims from this instance: another instance of this host still holds work \
                     ({e}). This node touches nothing and retries every {}; an operator can requeue the other \
                     instance's claims if it is gone for good",
                    humantime::format_duration(sh.config.backoff_max)
                );
                sh.pause(sh.config.backoff_max).await;
            }
            Err(e) => {
                if e.answer_lost() {
                    tracing::warn!(
                        "the claim's answer was lost; the hub may have claimed work for us: resyncing holdings"
                    );
                    need_resync = true;
                }
                log_hub_error("claim", &e);
                sh.pause(sh.retry_pause(&mut backoff, &e)).await;
            }
        }
    };
    // Handoffs end promptly at shutdown (their hub calls stop waiting); a store failure in
    // one of them still fails the node.
    while let Some(done) = handoffs.join_next().await {
        handoff_ended(done)?;
    }
    result
}

/// What a finished claim-batch handoff means for the claim loop: only a store failure (or a
/// task that panicked) stops the node; the hub's refusals and shutdown were handled inside.
/// Returns the size of the batch it handed off.
fn handoff_ended(done: Result<(i64, Result<(), Stop>), tokio::task::JoinError>) -> anyhow::Result<i64> {
    match done {
        Ok((n, Ok(()) | Err(Stop::Shutdown) | Err(Stop::Hub(_)))) => Ok(n),
        Ok((_, Err(Stop::Store(e)))) => Err(e.into()),
        Err(e) => Err(anyhow::anyhow!("a claim batch's handoff failed: {e}")),
    }
}

fn log_hub_error(what: &str, e: &ClientError) {
    match e.code() {
        Some(ErrorCode::CertificateRevoked | ErrorCode::UnknownCertificate) => {
            tracing::error!(
                "{what}: the hub refused our client certificate (revoked, expired or not issued by it): {e}"
            )
        }
        _ => tracing::warn!("{what}: {e}"),
    }
}

/// Whether the node store is over `store_bytes_max`, read at most every
/// `STORE_SIZE_CHECK_PACE`; a change is said once in the log and recorded for `status`. The
/// first reading is always recorded, so a pause a previous run recorded never outlives it.
#[derive(Debug, Default)]
struct StoreFull {
    /// When the size was last read.
    read_at: Option<Instant>,
    /// Whether it was over the bound then; `None` before the first reading.
    over: Option<bool>,
}

impl StoreFull {
    async fn over<H: Hub>(&mut self, sh: &Arc<Shared<H>>) -> Result<bool, StoreError> {
        if let (Some(at), Some(over)) = (self.read_at, self.over)
            && at.elapsed() < STORE_SIZE_CHECK_PACE
        {
            return Ok(over);
        }
        self.read_at = Some(Instant::now());
        let bytes = u64::try_from(sh.store.call(|db| db.used_bytes()).await?).unwrap_or(0);
        let max = sh.config.store_bytes_max;
        let over = bytes > max;
        if self.over != Some(over) {
            let why = over.then(|| {
                format!(
                    "the node store holds {bytes} bytes, over store_bytes_max = {max}: claiming no new work until \
                     local_retention frees room (what it holds still runs and is reported)"
                )
            });
            match &why {
                Some(w) => tracing::warn!("{w}"),
                None if self.over.is_some() => {
                    tracing::info!(
                        bytes,
                        store_bytes_max = max,
                        "the node store is under store_bytes_max again: claiming"
                    )
                }
                None => {}
            }
            sh.store.call(move |db| db.record_claims_paused(why.as_deref())).await?;
            self.over = Some(over);
        }
        Ok(over)
    }
}

/// Holdings resync: asks the hub what this instance holds and resumes each; then drops local
/// copies still waiting for an ack that the hub no longer lists.
async fn resync<H: Hub>(sh: &Arc<Shared<H>>) -> Result<(), Stop> {
    let holdings = tokio::select! {
        r = sh.hub.holdings() => r.map_err(Stop::Hub)?,
        _ = sh.shutdown.cancelled() => return Err(Stop::Shutdown),
    };
    tracing::info!(count = holdings.len(), "holdings resync");
    // Resumed in each conversation's `seq` order, whatever order the hub lists them in (its
    // queue order, which follows fan-out, not `seq`): a later turn acked before an earlier one
    // is mirrored would be free to start first, breaking the conversation's order.
    let mut holdings = holdings;
    holdings.sort_by(|a, b| (&a.conversation, a.seq).cmp(&(&b.conversation, b.seq)));
    let half = holdings.len() / 2;
    for (i, h) in holdings.iter().enumerate() {
        if i == half {
            crash_point("node.resync.mid");
        }
        match validate(h) {
            Ok(()) => resume(sh, h).await?,
            Err(why) => reject(sh, h, &why).await,
        }
    }
    let listed: HashSet<&str> = holdings.iter().map(|h| h.delivery_id.as_str()).collect();
    let unacked = sh.store.call(|db| db.unacked()).await?;
    for (id, _) in unacked.into_iter().filter(|(id, _)| !listed.contains(id.as_str())) {
        tracing::warn!(delivery_id = %id, "the hub no longer lists this unacked delivery for us (requeued or cancelled); dropping the local copy");
        let (i, now_ms) = (id.clone(), sh.now_ms());
        sh.store.call(move |db| db.drop_delivery(&i, "no longer held by this instance", now_ms)).await?;
    }
    sh.wake_scheduler.notify_one();
    sh.wake_outbox.notify_one();
    Ok(())
}

/// Resumes one holding from where the hub says it is. A delivered run this store has no
/// record of never runs here: it is reported `unknown` (`Db::adopt_delivered`).
async fn resume<H: Hub>(sh: &Arc<Shared<H>>, h: &ClaimedDelivery) -> Result<(), Stop> {
    let acked = match h.state {
        DeliveryState::Claimed | DeliveryState::Mirrored => false,
        DeliveryState::Delivered => true,
        other => {
            tracing::warn!(delivery_id = %h.delivery_id, state = %other, "holdings listed a delivery in an unexpected state; ignoring it");
            return Ok(());
        }
    };
    let (d, now_ms) = (h.clone(), sh.now_ms());
    let m = if acked {
        sh.store.call(move |db| db.adopt_delivered(&d, REASON_NO_LOCAL_RECORD, now_ms)).await?
    } else {
        sh.store.call(move |db| db.mirror(&d, false, now_ms)).await?
    };
    if !acked {
        if m == Mirrored::AlreadyRan {
            tracing::error!(delivery_id = %h.delivery_id, "the hub lists as not acked a delivery that already ran here; not acking it");
            return Ok(());
        }
        return handoff_batch(sh, vec![(h.clone(), h.state)], sh.telemetry.started()).await;
    }
    match m {
        Mirrored::New | Mirrored::Replaced | Mirrored::NewRun => {
            tracing::error!(
                delivery_id = %h.delivery_id, attempt = h.attempt,
                "the hub lists a delivered turn this data directory has no record of (a copy or a restore?); \
                 it never runs here: reporting it unknown"
            );
            sh.wake_outbox.notify_one();
            return Ok(());
        }
        Mirrored::Existing => {
            if h.cancel_requested {
                let notice = CancelNotice {
                    delivery_id: h.delivery_id.clone(),
                    attempt: h.attempt,
                    reason: "cancel requested".into(),
                };
                cancel_turn(sh, &notice).await?;
            }
            return Ok(());
        }
        Mirrored::AlreadyRan => {}
    }
    let id = h.delivery_id.clone();
    let Some(local) = sh.store.call(move |db| db.local(&id)).await? else {
        return Err(Stop::Store(StoreError::Corrupt(format!("delivery {} vanished", h.delivery_id))));
    };
    if local.run != h.attempt {
        tracing::warn!(delivery_id = %h.delivery_id, hub_run = h.attempt, local_run = local.run, "the hub lists another run of this delivery than the one held here; leaving it");
        return Ok(());
    }
    match (local.exec, local.report) {
        // Running in this process: its report follows when it ends; a cancel reaches it.
        (ExecState::Started, _) => {
            if h.cancel_requested {
                let notice = CancelNotice {
                    delivery_id: h.delivery_id.clone(),
                    attempt: h.attempt,
                    reason: "cancel requested".into(),
                };
                cancel_turn(sh, &notice).await?;
            }
        }
        (ExecState::Ended | ExecState::Cancelled, Some((_, ReportState::Pending))) => sh.wake_outbox.notify_one(),
        (ExecState::Ended | ExecState::Cancelled, Some((report_id, ReportState::Confirmed))) => {
            tracing::warn!(delivery_id = %h.delivery_id, report_id, "the hub lists as unreported a turn whose report it confirmed; sending it again (same report id)");
            sh.store.call(move |db| db.reopen_report(&report_id)).await?;
            sh.wake_outbox.notify_one();
        }
        (ExecState::Ended | ExecState::Cancelled, Some((report_id, ReportState::Dead))) => {
            tracing::warn!(delivery_id = %h.delivery_id, report_id, "the hub lists as unreported a turn whose report it refused for good; see `baton-node status`");
        }
        (exec, report) => {
            return Err(Stop::Store(StoreError::Corrupt(format!(
                "delivery {} ran but is {exec:?} with report {report:?}",
                h.delivery_id
            ))));
        }
    }
    Ok(())
}

/// A cancel the hub passed on (an operator's or the producer's) for run `attempt` of a delivered
/// turn: one not started never starts and is reported `cancelled` (one local transaction, which
/// the scheduler's start checks); a running one is stopped (SIGTERM to its process group,
/// SIGKILL after `cancel_grace`) and reported `cancelled`; one that ended is left alone.
/// Repeating it changes nothing.
async fn cancel_turn<H: Hub>(sh: &Arc<Shared<H>>, notice: &CancelNotice) -> Result<(), StoreError> {
    let (id, run) = (notice.delivery_id.as_str(), notice.attempt);
    // The entry is made before the start marker: look here first, and again if the store says
    // it started in between.
    if let Some(handle) = sh.running_turn(id, run) {
        if !handle.is_requested() {
            tracing::warn!(delivery_id = id, attempt = run, reason = %notice.reason, "cancel: stopping the running turn");
        }
        handle.request(&notice.reason);
        return Ok(());
    }
    let (i, why, now_ms) = (id.to_string(), format!("cancelled before it started: {}", notice.reason), sh.now_ms());
    match sh.store.call(move |db| db.cancel_unstarted(&i, run, &why, now_ms)).await? {
        CancelLocal::Cancelled(attempt_id) => {
            sh.acked_here.lock().unwrap_or_else(|p| p.into_inner()).remove(&(id.to_string(), run));
            tracing::warn!(delivery_id = id, attempt = run, attempt_id, reason = %notice.reason, "cancel: the turn had not started and never will; reporting it cancelled");
            sh.wake_outbox.notify_one();
            sh.wake_scheduler.notify_one();
            sh.wake_claimer.notify_one();
        }
        CancelLocal::Started => match sh.running_turn(id, run) {
            Some(handle) => {
                tracing::warn!(delivery_id = id, attempt = run, reason = %notice.reason, "cancel: stopping the running turn");
                handle.request(&notice.reason);
            }
            None => tracing::debug!(delivery_id = id, "cancel: the turn has just ended; its report stands"),
        },
        CancelLocal::Settled => tracing::debug!(delivery_id = id, "cancel: nothing to stop here (ended, or not held)"),
    }
    Ok(())
}

mod handoff;
mod session;

#[cfg(test)]
mod tests;
