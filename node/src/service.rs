//! The node as a systemd service (`Type=notify`, see `node/pkg/`): readiness, the watchdog and
//! stopping, all through `sd-notify`, which does nothing when `NOTIFY_SOCKET` is not set (a
//! node started by hand or by the tests).
//!
//! READY=1 is sent when the hub has answered the node's first request, or failed to: that first
//! request comes after local recovery (`agent::run_agent` recovers before it makes any hub
//! call), so "ready" means the store is open, this data directory is ours and every turn a
//! crash interrupted is settled. A hub that is down does not hold readiness back: the node is
//! then doing exactly its job (retrying with backoff, keeping its reports), and a start that
//! waited for the hub would fail after `TimeoutStartSec`, restart in a loop and tie every
//! node's boot to the hub's. The STATUS line says which of the two it was.
//!
//! Kept out of the agent loop: `Notifying` wraps the `Hub` the agent is given, and `run` starts
//! the watchdog and reports stopping.

use crate::client::Hub;
use baton_client::{ClientError, ItemAnswer};
use baton_shared::wire::{
    ClaimResponse, ClaimedDelivery, HolderItem, ReportRequest, ReportResponse, RunningTurnItem, RunningTurnResult,
    SessionResponse, StartItem, StartResult, TransitionResponse,
};
use sd_notify::NotifyState;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Sends `states` to systemd; a failure is logged, never fatal (the node works without it).
fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "could not notify systemd");
    }
}

/// A `Hub` that tells systemd the node is ready when the first request is answered.
pub struct Notifying<H> {
    inner: H,
    ready: Arc<AtomicBool>,
}

impl<H: Hub> Notifying<H> {
    /// Wraps `inner`; nothing is sent until its first answer.
    pub fn new(inner: H) -> Notifying<H> {
        Notifying { inner, ready: Arc::new(AtomicBool::new(false)) }
    }

    /// Sends READY=1 on the first answer, whatever it was, and passes the answer on.
    fn answered<T>(&self, answer: Result<T, ClientError>) -> Result<T, ClientError> {
        if !self.ready.swap(true, Ordering::SeqCst) {
            let status = match &answer {
                Ok(_) => "recovered; the hub answered".to_string(),
                Err(e) => format!("recovered; the hub is not answering yet ({e}), retrying"),
            };
            tracing::info!(status, "ready");
            notify(&[NotifyState::Ready, NotifyState::Status(&status)]);
        }
        answer
    }
}

impl<H: Hub> Hub for Notifying<H> {
    async fn register_session(&self) -> Result<SessionResponse, ClientError> {
        self.answered(self.inner.register_session().await)
    }
    async fn end_session(&self) -> Result<(), ClientError> {
        self.inner.end_session().await
    }
    async fn claim(&self, max: u32, wait: Duration) -> Result<ClaimResponse, ClientError> {
        self.answered(self.inner.claim(max, wait).await)
    }
    async fn starts(&self, items: Vec<StartItem>) -> Result<Vec<StartResult>, ClientError> {
        self.answered(self.inner.starts(items).await)
    }
    async fn holdings(&self) -> Result<Vec<ClaimedDelivery>, ClientError> {
        self.answered(self.inner.holdings().await)
    }
    async fn mirrored(&self, delivery_id: &str, claim_token: &str) -> Result<TransitionResponse, ClientError> {
        self.answered(self.inner.mirrored(delivery_id, claim_token).await)
    }
    async fn ack(&self, delivery_id: &str, claim_token: &str) -> Result<TransitionResponse, ClientError> {
        self.answered(self.inner.ack(delivery_id, claim_token).await)
    }
    async fn reject(
        &self,
        delivery_id: &str,
        claim_token: &str,
        reason: &str,
    ) -> Result<TransitionResponse, ClientError> {
        self.answered(self.inner.reject(delivery_id, claim_token, reason).await)
    }
    async fn report(&self, body: &ReportRequest) -> Result<ReportResponse, ClientError> {
        self.answered(self.inner.report(body).await)
    }
    async fn mirrored_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        self.answered(self.inner.mirrored_batch(items).await)
    }
    async fn ack_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        self.answered(self.inner.ack_batch(items).await)
    }
    async fn handoff_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        self.answered(self.inner.handoff_batch(items).await)
    }
    async fn report_batch(&self, reports: Vec<ReportRequest>) -> Result<Vec<ItemAnswer<ReportResponse>>, ClientError> {
        self.answered(self.inner.report_batch(reports).await)
    }
    async fn running(&self, turns: Vec<RunningTurnItem>) -> Result<Vec<RunningTurnResult>, ClientError> {
        self.answered(self.inner.running(turns).await)
    }
    fn hub_moves(&self) -> u64 {
        self.inner.hub_moves()
    }
}

/// Feeds systemd's watchdog at half its interval (`WatchdogSec=` in the unit) from a task of
/// the node's runtime, so a wedged runtime stops feeding it and systemd restarts the node.
/// Returns `None` when no watchdog is asked for.
pub fn spawn_watchdog() -> Option<tokio::task::JoinHandle<()>> {
    let interval = sd_notify::watchdog_enabled().map(|d| d / 2).filter(|d| !d.is_zero())?;
    Some(tokio::spawn(async move {
        loop {
            notify(&[NotifyState::Watchdog]);
            tokio::time::sleep(interval).await;
        }
    }))
}

/// Waits for `shutdown`, then tells systemd STOPPING=1, before the drain begins.
pub async fn stopping_on(shutdown: impl Future<Output = ()> + Send + 'static) {
    shutdown.await;
    notify(&[NotifyState::Stopping]);
}
