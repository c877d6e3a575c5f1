//! The renewal of running turns with the hub, and the forwarding of their progress: one
//! `POST /v1/running` per pass (see `progress`, "The renewal"), and the events of ended turns
//! sent before their reports (`flush_ended`). Apart from `progress`, which keeps the events and
//! the bounds, because this is the part that talks to the hub through the node's shared state.

use crate::client::Hub;
use crate::shared_state::Shared;
use baton_shared::wire::{RunningTurnItem, RunningTurnResult};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Sends one request with `only_ended` (see `Progress::request`) and settles its answer.
/// Returns whether the hub answered.
async fn send<H: Hub>(sh: &Shared<H>, only_ended: bool) -> bool {
    let sent = sh.progress.request(only_ended);
    if sent.is_empty() {
        return true;
    }
    let turns: Vec<RunningTurnItem> = sent.iter().map(|(t, _, _)| t.clone()).collect();
    let events: usize = sent.iter().map(|(_, n, _)| n).sum();
    match sh.hub.running(turns).await {
        Ok(results) => {
            crate::progress::count_sent(events);
            sh.progress.answered(&sent, &results);
            true
        }
        Err(e) if let Some(why) = e.refused_for_good() => {
            sh.finish(why);
            false
        }
        Err(e) if let Some(message) = e.superseded() => {
            sh.supersede(&message);
            false
        }
        Err(e) if e.route_unknown() => {
            // A hub from before progress: nothing it could keep; what waits is dropped.
            tracing::warn!("the hub does not take progress or renewals ({e}); the node's progress is dropped");
            let results: Vec<RunningTurnResult> = sent
                .iter()
                .map(|(t, _, _)| RunningTurnResult {
                    delivery_id: t.delivery_id.clone(),
                    running: false,
                    kept: 0,
                    dropped: 0,
                })
                .collect();
            sh.progress.answered(&sent, &results);
            true
        }
        Err(e) => {
            tracing::debug!(events, "forwarding progress failed; sending it again later: {e}");
            false
        }
    }
}

/// Before the outbox sends reports: the events of ended runs go first, so the hub has them
/// before their outcome (it takes none after). Stops at the first failure.
pub(crate) async fn flush_ended<H: Hub>(sh: &Shared<H>) {
    for _ in 0..FLUSH_REQUESTS_MAX {
        let before = sh.progress.request(true);
        if before.is_empty() || !send(sh, true).await {
            return;
        }
    }
}

/// Most requests one `flush_ended` sends (a run with more waiting sends the rest later, and
/// the hub counts what came after its outcome as dropped).
pub const FLUSH_REQUESTS_MAX: usize = 16;

/// The renewal: one request per pass, while turns run or events wait: every
/// `progress_flush_interval` while events wait, else every `renew_interval` while a turn runs;
/// after a request the hub did not answer, again after `RENEW_RETRY_PACE` at the soonest.
pub(crate) async fn renewal_loop<H: Hub>(sh: Arc<Shared<H>>) -> anyhow::Result<()> {
    let (renew, flush) = (sh.config.renew_interval, sh.config.progress_flush_interval);
    let mut last = Instant::now();
    let mut failing = false;
    while !sh.shutdown.is_cancelled() {
        let pace = |p: Duration| if failing { p.max(RENEW_RETRY_PACE) } else { p };
        let due = if sh.progress.waiting() {
            Some(last + pace(flush))
        } else if sh.progress.any_running() {
            Some(last + pace(renew))
        } else {
            None
        };
        let sleep = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = sleep => {}
            // An event, or a turn that started or ended: look at what is due again.
            _ = sh.progress.wake.notified() => continue,
            _ = sh.shutdown.cancelled() => return Ok(()),
        }
        last = Instant::now();
        failing = !send(&sh, false).await;
    }
    Ok(())
}

/// How soon a renewal the hub did not answer is sent again (at least).
const RENEW_RETRY_PACE: Duration = Duration::from_secs(1);
