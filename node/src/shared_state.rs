//! What the node's running tasks share: one `Shared` (hub client, store, configuration, clock,
//! the wake-ups between tasks, the shutdown token), held as an `Arc` by the claim loop
//! (`agent`), the scheduler (`sched`) and the outbox (`report`). It sits below all three so
//! that none of them imports another for it.

use crate::config::NodeConfig;
use crate::exec::Gate;
use crate::store::Store;
use baton_shared::clock::SharedClock;
use std::sync::OnceLock;
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
}

impl<H> Shared<H> {
    /// Now, in unix milliseconds, from the injected clock: the `now_ms` every store call takes.
    pub(crate) fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// The hub refused this node for good: logs it once, and stops the node (no new claims or
    /// turns; running turns get `shutdown_grace`; what the hub does not take stays stored).
    pub(crate) fn finish(&self, why: String) {
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

    /// Sleeps for `d`, or less when shutdown begins first.
    pub(crate) async fn pause(&self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.shutdown.cancelled() => {}
        }
    }
}
