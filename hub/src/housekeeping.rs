//! Background tasks the hub runs beside the ones `server` owns: the audit log's (and lifted
//! fences') retention sweep, approvals past their `approval_timeout_ms`, and
//! `requeue_silent_after` (off unless configured; see `store::lifecycle::silence` for why it is safe). Each holds the shutdown token, reads time from the
//! injected clock and writes through the `Store`, one bounded transaction at a time.

use crate::runtime::Shared;
use crate::store;
use std::sync::Arc;
use std::time::Duration;

/// How often audit rows and lifted fences past `limits.audit_retention` are removed.
const AUDIT_SWEEP_INTERVAL: Duration = Duration::from_secs(3600);

/// Rows written before this time (unix ms) are past a window of `window`.
fn cutoff_ms(now_ms: i64, window: Duration) -> i64 {
    now_ms.saturating_sub(i64::try_from(window.as_millis()).unwrap_or(i64::MAX))
}

/// Removes audit rows (`operator_events`) and fences lifted (or expired) longer than
/// `limits.audit_retention` ago, at start and every `AUDIT_SWEEP_INTERVAL`, in bounded
/// transactions: both are operator history, kept for the same window.
pub(crate) async fn sweep_audit(shared: Arc<Shared>) {
    loop {
        let cutoff = cutoff_ms(shared.clock.now_ms(), shared.limits.audit_retention);
        loop {
            match shared.store.audit_sweep(cutoff, store::upkeep::retention::SWEEP_AUDIT_ROWS_MAX).await {
                Ok(0) => break,
                Ok(n) => tracing::info!(removed = n, "retention: removed audit rows"),
                Err(e) => {
                    tracing::warn!(error = %e, "audit retention sweep failed");
                    break;
                }
            }
        }
        loop {
            match shared.store.fence_sweep(cutoff, store::upkeep::retention::SWEEP_FENCES_MAX).await {
                Ok(0) => break,
                Ok(n) => tracing::info!(removed = n, "retention: removed lifted fences"),
                Err(e) => {
                    tracing::warn!(error = %e, "fence retention sweep failed");
                    break;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(AUDIT_SWEEP_INTERVAL) => {}
            _ = shared.shutdown.cancelled() => return,
        }
    }
}

/// How often the hub reads the record's size for `limits.store_bytes_max`: one cheap read
/// (SQLite's page counts, PostgreSQL's database size), so a store filling up is refused new
/// work within a few seconds.
const STORE_SIZE_CHECK_PACE: Duration = Duration::from_secs(2);

/// Reads the record's size at start and every `STORE_SIZE_CHECK_PACE` into
/// `Shared::store_bytes`, which submissions check (`Shared::check_room`); says in the log when
/// the store goes over `limits.store_bytes_max` and when it is back under.
pub(crate) async fn watch_store_size(shared: Arc<Shared>) {
    let max = shared.limits.store_bytes_max;
    let mut was_full = false;
    loop {
        match shared.store.store_bytes().await {
            Ok(bytes) => {
                let bytes = u64::try_from(bytes).unwrap_or(0);
                shared.store_bytes.store(bytes, std::sync::atomic::Ordering::Relaxed);
                let full = bytes > max;
                if full && !was_full {
                    tracing::warn!(
                        bytes,
                        store_bytes_max = max,
                        "the store is over limits.store_bytes_max: submissions get 507 store_full until retention \
                         or a purge frees room; claims, reports and reads go on"
                    );
                } else if !full && was_full {
                    tracing::info!(bytes, store_bytes_max = max, "the store is under limits.store_bytes_max again");
                }
                was_full = full;
            }
            Err(e) => tracing::warn!(error = %e, "reading the store's size failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(STORE_SIZE_CHECK_PACE) => {}
            _ = shared.shutdown.cancelled() => return,
        }
    }
}

/// How often the hub looks for silent node instances holding claimed or mirrored deliveries
/// (one indexed read; a write only when one is found).
const SILENCE_CHECK_PACE: Duration = Duration::from_secs(1);

/// Returns to the queue the claimed and mirrored deliveries of node instances whose open
/// session has been silent longer than `after` (`None`: the task does nothing), and wakes the
/// waiting claims so another instance takes them at once.
pub(crate) async fn requeue_silent(shared: Arc<Shared>, after: Option<Duration>) {
    let Some(after) = after else { return };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SILENCE_CHECK_PACE) => {}
            _ = shared.shutdown.cancelled() => return,
        }
        let cutoff = cutoff_ms(shared.clock.now_ms(), after);
        let silent = match shared.store.silent_holders(cutoff).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "reading silent node instances failed");
                continue;
            }
        };
        for who in silent {
            let now_ms = shared.clock.now_ms();
            match shared.store.requeue_silent(who.clone(), cutoff, now_ms).await {
                Ok(ids) if ids.is_empty() => {}
                Ok(ids) => {
                    tracing::warn!(
                        host = %who.host, instance = %who.instance_id, session = who.session, requeued = ids.len(),
                        "requeued what a silent node instance held unacked (requeue_silent_after)"
                    );
                    shared.work_changed();
                }
                Err(e) => {
                    tracing::warn!(error = %e, host = %who.host, "requeueing a silent instance's deliveries failed")
                }
            }
        }
    }
}

/// How often the hub looks for approvals past their `approval_timeout_ms` (one indexed read;
/// a write only when one is due).
pub(crate) const APPROVAL_EXPIRY_PACE: Duration = Duration::from_secs(1);

/// Fails, by the hub, the held deliveries of every message whose approval timed out undecided
/// (`store::lifecycle::approval::expire`), every `APPROVAL_EXPIRY_PACE`; waiting reads see the outcome.
pub(crate) async fn expire_approvals(shared: Arc<Shared>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(APPROVAL_EXPIRY_PACE) => {}
            _ = shared.shutdown.cancelled() => return,
        }
        match shared.store.expire_approvals(shared.clock.now_ms()).await {
            Ok(ids) if ids.is_empty() => {}
            Ok(ids) => {
                tracing::info!(messages = ids.len(), "approvals timed out: their held deliveries failed");
                shared.outcome_changed();
            }
            Err(e) => tracing::warn!(error = %e, "timing out approvals failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cutoff_is_one_window_before_now_and_never_overflows() {
        assert_eq!(cutoff_ms(10_000, Duration::from_secs(4)), 6_000);
        assert_eq!(cutoff_ms(0, Duration::MAX), -i64::MAX);
    }
}
