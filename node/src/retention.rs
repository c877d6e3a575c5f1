//! The retention sweep: removes the local rows of deliveries the hub settled more than
//! `local_retention` ago (see `store::upkeep::retention` for what counts as settled and what is kept),
//! once at start and then every `RETENTION_SWEEP_PACE`, in batches of `RETENTION_BATCH_MAX`.
//! The age is read from the injected clock, so tests move time instead of waiting.

use crate::client::Hub;
use crate::limits::{RETENTION_BATCH_MAX, RETENTION_SWEEP_PACE};
use crate::shared_state::Shared;
use crate::store::StoreError;
use std::sync::Arc;

/// Sweeps until shutdown.
pub(crate) async fn retention_loop<H: Hub>(sh: Arc<Shared<H>>) -> anyhow::Result<()> {
    loop {
        sweep(&sh).await?;
        tokio::select! {
            _ = tokio::time::sleep(RETENTION_SWEEP_PACE) => {}
            _ = sh.shutdown.cancelled() => return Ok(()),
        }
    }
}

/// One sweep: removes every delivery settled before now − `local_retention`. Returns how many.
pub(crate) async fn sweep<H>(sh: &Shared<H>) -> Result<u64, StoreError> {
    let retention_ms = i64::try_from(sh.config.local_retention.as_millis()).unwrap_or(i64::MAX);
    let cutoff_ms = sh.now_ms().saturating_sub(retention_ms);
    let mut removed = 0u64;
    loop {
        let n = sh.store.call(move |db| db.remove_settled(cutoff_ms, RETENTION_BATCH_MAX)).await?;
        removed += u64::from(n);
        if n < RETENTION_BATCH_MAX || sh.shutdown.is_cancelled() {
            break;
        }
    }
    if removed > 0 {
        tracing::info!(
            removed,
            "removed the local rows of deliveries the hub settled more than local_retention ({}) ago",
            humantime::format_duration(sh.config.local_retention)
        );
    }
    Ok(removed)
}
