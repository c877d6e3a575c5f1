//! Background tasks the hub runs beside the ones `server` owns: the audit log's retention
//! sweep. Each holds the shutdown token, reads time from the injected clock and writes through
//! the `Writer`, one bounded transaction at a time.

use crate::http::Shared;
use crate::store;
use std::sync::Arc;
use std::time::Duration;

/// How often audit rows past `limits.audit_retention` are removed.
const AUDIT_SWEEP_INTERVAL: Duration = Duration::from_secs(3600);

/// Rows written before this time (unix ms) are past a window of `window`.
fn cutoff_ms(now_ms: i64, window: Duration) -> i64 {
    now_ms.saturating_sub(i64::try_from(window.as_millis()).unwrap_or(i64::MAX))
}

/// Removes audit rows (`operator_events`) older than `limits.audit_retention`, at start and
/// every `AUDIT_SWEEP_INTERVAL`, in transactions of `SWEEP_AUDIT_ROWS_MAX`.
pub(crate) async fn sweep_audit(shared: Arc<Shared>) {
    loop {
        let cutoff = cutoff_ms(shared.clock.now_ms(), shared.limits.audit_retention);
        loop {
            match shared
                .writer
                .call(move |c| store::retention::sweep_audit(c, cutoff, store::retention::SWEEP_AUDIT_ROWS_MAX))
                .await
            {
                Ok(0) => break,
                Ok(n) => tracing::info!(removed = n, "retention: removed audit rows"),
                Err(e) => {
                    tracing::warn!(error = %e, "audit retention sweep failed");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cutoff_is_one_window_before_now_and_never_overflows() {
        assert_eq!(cutoff_ms(10_000, Duration::from_secs(4)), 6_000);
        assert_eq!(cutoff_ms(0, Duration::MAX), -i64::MAX);
    }
}
