//! Running the hub: open the store, repair what a crash left, then serve until shutdown.
//!
//! Invariant: startup repair completes every pending fan-out obligation before the listener
//! accepts its first connection, so no claim is served against a half-fanned-out message.

use crate::config::HubConfig;
use crate::datadir::DataDir;
use crate::http::{Shared, app};
use crate::store::{self, Readers, StoreError, Writer, accept, in_write_txn};
use crate::{now_ms, tls, wake};
use anyhow::Context;
use baton_shared::crash_point;
use baton_shared::sqlite::Synchronous;
use rusqlite::Connection;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Obligations repaired per query during startup repair.
const REPAIR_BATCH: usize = 512;

/// A hub whose store is open and repaired, ready to serve.
pub struct Hub {
    dir: DataDir,
    config: HubConfig,
    conn: Connection,
    /// How many messages startup repair fanned out.
    pub repaired: usize,
}

impl Hub {
    /// Opens the store (refusing a damaged or newer one) and runs startup repair.
    pub fn open(dir: DataDir, config: HubConfig) -> anyhow::Result<Hub> {
        if config.synchronous != Synchronous::Full {
            tracing::warn!(
                "synchronous = {:?}: answers are no longer promised to survive a power failure",
                config.synchronous
            );
        }
        let conn = store::open_write(&dir.db(), config.synchronous)?;
        let repaired = repair(&conn).context("startup repair")?;
        if repaired > 0 {
            tracing::info!(repaired, "startup repair completed fan-out a crash interrupted");
        }
        Ok(Hub { dir, config, conn, repaired })
    }

    /// Serves on `listener` until `shutdown` is cancelled.
    pub async fn serve(self, listener: TcpListener, shutdown: CancellationToken) -> anyhow::Result<()> {
        let tls_config = tls::server_config(&self.dir)?;
        let writer = Writer::start(self.conn).context("starting the writer thread")?;
        let readers = Arc::new(Readers::new(self.dir.db()));
        let (work, _) = watch::channel(0u64);
        let (outcomes, _) = watch::channel(0u64);
        let metrics = install_metrics();
        let shared = Arc::new(Shared {
            writer,
            readers,
            work: work.clone(),
            outcomes: outcomes.clone(),
            limits: self.config.limits,
            shutdown: shutdown.clone(),
            ready: AtomicBool::new(true),
            metrics,
        });
        // CLI changes wake both kinds of waiter.
        let (wake_tx, mut wake_rx) = watch::channel(0u64);
        if let Err(e) = wake::listen(&self.dir.wake_socket(), wake_tx, shutdown.clone()).await {
            tracing::warn!(error = %e, "no wake socket: CLI changes reach waiting long-polls only at their next claim");
        }
        let relay = shared.clone();
        tokio::spawn(async move {
            while wake_rx.changed().await.is_ok() {
                relay.work_changed();
                relay.outcome_changed();
            }
        });
        tokio::spawn(sweep_retention(shared.clone(), self.config.limits.retention));
        tokio::spawn(publish_gauges(shared.clone()));
        tracing::info!(addr = %listener.local_addr()?, "serving");
        tls::serve(
            listener,
            tls_config,
            app(shared.clone()),
            self.config.limits.handshake_timeout,
            shutdown,
            self.config.shutdown_grace,
        )
        .await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// How often the delivery-state gauges are refreshed.
const GAUGE_INTERVAL: Duration = Duration::from_secs(10);

/// Publishes deliveries per state, pending fan-out and active fences as gauges.
async fn publish_gauges(shared: Arc<Shared>) {
    loop {
        match shared.readers.read(store::read::status).await {
            Ok(s) => {
                for st in baton_shared::states::DeliveryState::ALL {
                    let n = s.deliveries.iter().find(|(state, _)| *state == st).map(|(_, n)| *n).unwrap_or(0);
                    metrics::gauge!("baton_hub_deliveries", "state" => st.as_str()).set(n as f64);
                }
                metrics::gauge!("baton_hub_fanout_pending").set(s.pending_fanout as f64);
                metrics::gauge!("baton_hub_fences_active").set(s.active_fences as f64);
            }
            Err(e) => tracing::warn!(error = %e, "could not read the status for the gauges"),
        }
        tokio::select! {
            _ = tokio::time::sleep(GAUGE_INTERVAL) => {}
            _ = shared.shutdown.cancelled() => return,
        }
    }
}

/// How often settled messages past the retention window are removed.
const RETENTION_SWEEP_INTERVAL: Duration = Duration::from_secs(600);

async fn sweep_retention(shared: Arc<Shared>, retention: Duration) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(RETENTION_SWEEP_INTERVAL) => {}
            _ = shared.shutdown.cancelled() => return,
        }
        let cutoff = now_ms() - retention.as_millis() as i64;
        loop {
            match shared
                .writer
                .call(move |c| store::retention::sweep(c, cutoff, store::retention::SWEEP_MESSAGES_MAX))
                .await
            {
                Ok(0) => break,
                Ok(n) => tracing::info!(removed = n, "retention: removed settled messages"),
                Err(e) => {
                    tracing::warn!(error = %e, "retention sweep failed");
                    break;
                }
            }
        }
    }
}

fn install_metrics() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder().ok()?;
            let upkeep = handle.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    upkeep.run_upkeep();
                }
            });
            Some(handle)
        })
        .clone()
}

/// Completes every fan-out obligation a crash left pending. Returns how many it completed.
pub fn repair(conn: &Connection) -> Result<usize, StoreError> {
    let mut done = 0;
    loop {
        let pending = accept::pending_obligations(conn, REPAIR_BATCH)?;
        if pending.is_empty() {
            return Ok(done);
        }
        for id in pending {
            in_write_txn(conn, |c| accept::fan_out(c, &id, now_ms()))?;
            done += 1;
            crash_point("hub.repair.mid");
        }
    }
}
