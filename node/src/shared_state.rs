//! What the node's running tasks share: one `Shared` (hub client, store, configuration, clock,
//! the wake-ups between tasks, the shutdown token), held as an `Arc` by the claim loop
//! (`agent`), the scheduler (`sched`) and the outbox (`report`). It sits below all three so
//! that none of them imports another for it.

use crate::config::NodeConfig;
use crate::limits::RECONNECT_PAUSE_MAX;
use crate::store::Store;
use crate::turn_gate::{CancelHandle, Gate};
use baton_client::{Backoff, ClientError, RefusedForGood};
use baton_shared::clock::SharedClock;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// What the node's tasks share. Built once by `agent::run_agent`; lives until the node stops.
pub(crate) struct Shared<H> {
    /// The hub.
    pub(crate) hub: H,
    /// The node store.
    pub(crate) store: Store,
    /// The validated configuration.
    pub(crate) config: NodeConfig,
    /// This instance's id.
    pub(crate) instance_id: String,
    /// How a turn's process starts (`exec`): held at the gate until its group is stored.
    pub(crate) gate: Gate,
    /// Wall-clock time for stored timestamps (waits use tokio's monotonic clock instead).
    pub(crate) clock: SharedClock,
    /// The running turns' progress waiting to be forwarded, and their renewal (`progress`).
    pub(crate) progress: Arc<crate::progress::Progress>,
    /// Where this node's spans of each delivery go (`otlp_endpoint`); off when none is
    /// configured, and then nothing of a span is built.
    pub(crate) telemetry: baton_telemetry::Telemetry,
    /// Wakes the scheduler: a gate opened or a turn ended.
    pub(crate) wake_scheduler: Notify,
    /// Wakes the outbox: a report was queued.
    pub(crate) wake_outbox: Notify,
    /// Wakes the claim loop: a turn ended, so the local queue shrank.
    pub(crate) wake_claimer: Notify,
    /// Cancelled once, when the node stops: no new claims, no new turns.
    pub(crate) shutdown: CancellationToken,
    /// Set once, when the hub refused this node for good (why); the node then stops and exits
    /// with `baton_shared::exit::REVOKED`.
    pub(crate) finished: OnceLock<String>,
    /// Set once, when the hub said a newer session of this instance replaced ours (why); the
    /// node then stops at once and exits with `baton_shared::exit::SUPERSEDED`.
    pub(crate) superseded: OnceLock<String>,
    /// Cancelled when running turns must be stopped now (SIGTERM, SIGKILL after `kill_grace`):
    /// at shutdown once `shutdown_grace` is over, or at once when superseded.
    pub(crate) kill_turns: CancellationToken,
    /// The session registered with the hub (none against a hub that predates sessions).
    pub(crate) session: OnceLock<u64>,
    /// True when this session took over the one this data directory's previous process
    /// registered, and that process had not ended it (it crashed): a run the hub says an
    /// earlier session started, with no start marker here, stopped between the hub's start
    /// record and the harness start.
    pub(crate) after_own_crash: OnceLock<bool>,
    /// The turns about to start or running, by delivery id: their run and their cancel. An
    /// entry is made before the start marker is written and removed after the end marker, so a
    /// cancel that finds the execution started finds its entry.
    pub(crate) running: Mutex<HashMap<String, (u32, CancelHandle)>>,
    /// The hub does not know `POST /v1/starts` (it predates it): turns start on the local gate
    /// alone, as before. Set at the first such answer (and logged once).
    pub(crate) starts_unconfirmed: AtomicBool,
    /// The hub does not know the batch routes (`POST /v1/batch/...`; it predates them): holder
    /// steps and reports go one request per delivery, as before. Set at the first 404 to a
    /// batch route (and logged once).
    pub(crate) batch_unknown: AtomicBool,
    /// The hub does not know the combined handoff (`POST /v1/batch/handoff`; it predates it):
    /// `mirrored` and `ack` go as two batches. Set at its first 404 (and logged once).
    pub(crate) handoff_unknown: AtomicBool,
    /// The runs (delivery id, run) whose ack the hub confirmed to this process and that have
    /// not started yet, with when the confirmation arrived. While the hub cannot be reached,
    /// these — and only these — may start on the local gate without the hub's start record
    /// (SPEC §4: a node keeps running what it holds while the hub is down): this session's own
    /// ack is the hub's word that they are ours. A run acked by an earlier process of this data
    /// directory waits for the hub.
    pub(crate) acked_here: Mutex<HashMap<(String, u32), tokio::time::Instant>>,
    /// The start lease the hub granted this session: while it lasts (as the node measures it),
    /// and only then, the runs in `acked_here` that a renewal sent after their ack covers
    /// (`StartLease::covers`) may start without the hub's start record.
    pub(crate) lease: Mutex<StartLease>,
    /// This session started a turn on the local gate, without the hub's start record. Such a
    /// session never ends cleanly: a clean end gives its lease up, and with it the hub's rule
    /// that what it acked and did not start (as far as the hub knows) is never started again.
    pub(crate) started_offline: AtomicBool,
}

/// This session's start lease, as the node measures it (tokio's monotonic clock).
///
/// The hub grants the lease at the session's registration and renews it at every accepted
/// `POST /v1/starts`, each time for `length` from when it records the renewal; the node counts
/// each renewal from when it sent the request, and only `START_LEASE_USED_PERCENT_MAX` of it, so its
/// lease always ends before the hub's. A newer session of the instance (a copy of the data
/// directory) is granted no run this session acked until the hub's lease ran out, so a turn this
/// session starts on its own within its lease can never run on the copy too.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StartLease {
    /// The lease's length the hub granted (none from a hub that grants none).
    pub(crate) length: Option<Duration>,
    /// Until when the node may start acked runs on its own.
    pub(crate) until: Option<tokio::time::Instant>,
    /// When the newest renewal the hub recorded was sent (none before the first `POST
    /// /v1/starts` the hub accepted: the registration's grant covers no ack).
    pub(crate) renewal_sent: Option<tokio::time::Instant>,
}

impl StartLease {
    /// The lease granted at registration, for a request sent at `sent`.
    pub(crate) fn granted(&mut self, sent: tokio::time::Instant) {
        if let Some(length) = self.length {
            let until = sent + length * crate::limits::START_LEASE_USED_PERCENT_MAX / 100;
            self.until = Some(self.until.map_or(until, |u| u.max(until)));
        }
    }

    /// A renewal the hub recorded (an accepted `POST /v1/starts`) for a request sent at `sent`.
    pub(crate) fn renewed(&mut self, sent: tokio::time::Instant) {
        self.granted(sent);
        self.renewal_sent = Some(self.renewal_sent.map_or(sent, |s| s.max(sent)));
    }

    /// Whether a run whose ack was confirmed at `acked` may start on the node's own: only when a
    /// renewal the hub recorded was sent after it. The hub holds the same rule from its side
    /// (`Lease::may_have_started`): a run no renewal covers is started for a newer session of
    /// the instance at once, so this session must never start it without the hub.
    pub(crate) fn covers(&self, acked: tokio::time::Instant) -> bool {
        self.renewal_sent.is_some_and(|s| s > acked)
    }

    /// How long the lease still lasts at `now` (zero once it ended, or when there is none).
    pub(crate) fn left(&self, now: tokio::time::Instant) -> Duration {
        self.until.map_or(Duration::ZERO, |u| u.saturating_duration_since(now))
    }

    /// Whether the lease should be renewed now (less than `START_LEASE_RENEW_PERCENT_MARGIN` left), and
    /// otherwise when it should be.
    pub(crate) fn renew_in(&self, now: tokio::time::Instant) -> Option<Duration> {
        let length = self.length?;
        let threshold = length * crate::limits::START_LEASE_RENEW_PERCENT_MARGIN / 100;
        Some(self.left(now).saturating_sub(threshold))
    }
}

impl<H> Shared<H> {
    /// The start lease, locked.
    pub(crate) fn start_lease(&self) -> std::sync::MutexGuard<'_, StartLease> {
        self.lease.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Now, in unix milliseconds, from the injected clock: the `now_ms` every store call takes.
    pub(crate) fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The hub refused this node for good: logs it once, and stops the node (no new claims or
    /// turns; running turns get `shutdown_grace`; what the hub does not take stays stored).
    pub(crate) fn finish(&self, why: RefusedForGood) {
        let why = why.describe("this node's");
        if self.finished.set(why.clone()).is_ok() {
            tracing::error!(
                "{why}. This node stops for good: no new claims, running turns get shutdown_grace, reports the hub \
                 refuses stay in the store; exit status {}. Renew the certificate (baton-hub renew) and start \
                 the node again",
                baton_shared::exit::REVOKED
            );
        }
        self.shutdown.cancel();
    }

    /// The hub refused a request because a newer session of this node instance replaced ours
    /// (a copy of the data directory, or the same one started twice): logs it once, stops
    /// claiming and starting at once, and stops the running turns now (their outcome is not
    /// ours to report any more). The node exits with `baton_shared::exit::SUPERSEDED`.
    pub(crate) fn supersede(&self, hub_message: &str) {
        let ours = self.session.get().map_or_else(|| "(none)".to_string(), u64::to_string);
        let why = format!(
            "another process took over this node instance (a copy of its data directory?): a newer session \
             replaced this one (session {ours}; the hub said: {hub_message})"
        );
        if self.superseded.set(why.clone()).is_ok() {
            tracing::error!(
                "{why}. This node stops now: no claims, no starts, running turns get SIGTERM (SIGKILL after \
                 kill_grace) and are not reported by it; exit status {}. Find the other process before \
                 starting this one again",
                baton_shared::exit::SUPERSEDED
            );
        }
        self.shutdown.cancel();
        self.kill_turns.cancel();
    }

    /// The cancel handle of the running (or starting) turn of `delivery_id` when it is run
    /// `run`.
    pub(crate) fn running_turn(&self, delivery_id: &str, run: u32) -> Option<CancelHandle> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.get(delivery_id).filter(|(r, _)| *r == run).map(|(_, h)| h.clone())
    }

    /// Whether the hub's batch routes may be used (none has answered 404 yet).
    pub(crate) fn batches(&self) -> bool {
        !self.batch_unknown.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether to ask for `mirrored` and `ack` in one request (`handoff = "combined"`, and no
    /// hub has answered 404 to it or to a batch yet).
    pub(crate) fn combined_handoff(&self) -> bool {
        self.config.handoff == crate::config::Handoff::Combined
            && self.batches()
            && !self.handoff_unknown.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The combined handoff answered 404: this hub predates it; `mirrored` and `ack` as two
    /// batches from now on.
    pub(crate) fn no_combined_handoff(&self, e: &ClientError) {
        if !self.handoff_unknown.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!("the hub does not know the combined handoff ({e}); sending mirrored and ack apart");
        }
    }

    /// A batch route answered 404: this hub predates batches; single requests from now on.
    pub(crate) fn no_batches(&self, e: &ClientError) {
        if !self.batch_unknown.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!("the hub does not know batch requests ({e}); sending one request per delivery");
        }
    }

    /// The pause before retrying after `e`: when the hub did not answer at all, within
    /// `RECONNECT_PAUSE_MAX`, so a restarted hub is regained soon after it listens again;
    /// otherwise the backoff runs up to `backoff_max`. (That the hub is reachable again is
    /// logged where every request is noted, `metrics::Watched`.)
    pub(crate) fn retry_pause(&self, backoff: &mut Backoff, e: &ClientError) -> Duration {
        if e.unreachable() { backoff.next_delay_within(RECONNECT_PAUSE_MAX) } else { backoff.next_delay() }
    }

    /// Sleeps for `d`, or less when shutdown begins first.
    pub(crate) async fn pause(&self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.shutdown.cancelled() => {}
        }
    }
}
