//! Running the hub: take the data directory's lock, open the store, repair what a crash left,
//! then serve until shutdown.
//!
//! Invariant: startup repair completes every pending fan-out obligation before the listener
//! accepts its first connection, so no claim is served against a half-fanned-out message.
//! Invariant: the lock is taken before anything in the data directory is touched, so a second
//! `serve` on it changes nothing (not the store, the wake socket, nor `hub.addr`).

use crate::config::HubConfig;
use crate::datadir::DataDir;
use crate::http::app;
use crate::lock::DirLock;
use crate::runtime::Shared;
use crate::store::{self, Store};
use crate::{tls, wake};
use anyhow::Context;
use baton_shared::clock::{Clock, SharedClock};
use baton_shared::sqlite::Synchronous;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A hub that holds its data directory's lock, with its store open and repaired, ready to serve.
pub struct Hub {
    dir: DataDir,
    config: HubConfig,
    store: Store,
    lock: DirLock,
    /// How many messages startup repair fanned out.
    pub repaired: usize,
}

impl Hub {
    /// Raises the open-file limit and refuses a `limits.connections_max` that cannot fit under it
    /// (`fds::raise_and_check`), refuses a data directory or private file other users may read
    /// (`DataDir::check_private`),
    /// takes the data directory's lock (refusing when another hub holds it), opens the store
    /// (refusing a damaged or newer one) and runs startup repair. `clock` stamps everything the
    /// hub stores.
    pub fn open(dir: DataDir, config: HubConfig, clock: SharedClock) -> anyhow::Result<Hub> {
        let files = crate::fds::raise_and_check(config.limits.connections_max)?;
        if let Some(from) = files.raised_from {
            tracing::info!(from, to = files.soft, "raised the open-file limit to the hard limit");
        }
        dir.check_private().map_err(anyhow::Error::msg)?;
        let lock = DirLock::acquire(&dir)?;
        let store = open_store(&dir, &config, clock)?;
        let repaired = repair(&store).context("startup repair")?;
        if repaired > 0 {
            tracing::info!(repaired, "startup repair completed fan-out a crash interrupted");
        }
        Ok(Hub { dir, config, store, lock, repaired })
    }

    /// Makes the bound address known: in the lock file (for `status` and a refused second hub)
    /// and in `DIR/hub.addr` (written whole, then renamed into place).
    pub fn announce(&mut self, addr: SocketAddr) -> anyhow::Result<()> {
        self.lock.record_listen(addr)?;
        let file = self.dir.addr_file();
        let tmp = file.with_extension("addr.tmp");
        std::fs::write(&tmp, format!("{addr}\n"))
            .and_then(|_| std::fs::rename(&tmp, &file))
            .with_context(|| format!("writing {}", file.display()))
    }

    /// Serves on `listener` until `shutdown` is cancelled.
    pub async fn serve(self, listener: TcpListener, shutdown: CancellationToken) -> anyhow::Result<()> {
        let tls_config = tls::server_config(&self.dir)?;
        let (outcomes, _) = watch::channel(0u64);
        let metrics = install_metrics();
        // CLI changes (the wake socket, or another hub's record notice) bump this counter; the
        // certificate cache follows it.
        let (wake_tx, mut wake_rx) = watch::channel(0u64);
        let wake_tx = Arc::new(wake_tx);
        let clock = self.store.clock().clone();
        // Hubs sharing a PostgreSQL record tell each other what each commit made claimable.
        let origin = crate::peers::Origin::fresh();
        let peers = self.config.database_url.clone().map(|url| crate::peers::Announcer::start(url, origin, &shutdown));
        let telemetry = match &self.config.otlp_endpoint {
            Some(endpoint) => {
                let t = baton_telemetry::Telemetry::start(endpoint, "baton-hub")
                    .map_err(|e| anyhow::anyhow!("otlp_endpoint: {e}"))?;
                tracing::info!(otlp_endpoint = %endpoint, "exporting spans of each message over OTLP");
                t
            }
            None => baton_telemetry::Telemetry::off(),
        };
        let shared = Arc::new(Shared {
            store: self.store,
            work: Default::default(),
            outcomes: outcomes.clone(),
            limits: self.config.limits,
            shutdown: shutdown.clone(),
            ready: AtomicBool::new(true),
            store_bytes: Default::default(),
            metrics,
            clock,
            turns: Default::default(),
            certs: crate::runtime::certs::CertCache::new(wake_tx.subscribe()),
            peers,
            feed_horizon: Default::default(),
            tls: Some(tls_config.clone()),
            telemetry: telemetry.clone(),
        });
        if let Some(url) = self.config.database_url.clone() {
            let (heard, record) = (shared.clone(), wake_tx.clone());
            // What other hubs (and CLI commands against the database) committed wakes the
            // waiters here; a record change is taken as a CLI change is (below).
            crate::peers::listen(
                url,
                origin,
                move |notice| {
                    heard.heard(&notice);
                    if notice.has_record() {
                        record.send_modify(|n| *n = n.wrapping_add(1));
                    }
                },
                shutdown.clone(),
            );
        }
        // SIGHUP, and CLI changes (below), reload the TLS files (`renew --server`, `ca ...`).
        match baton_shared::signal::hangups() {
            Ok(h) => drop(tokio::spawn(tls::reload_on_hangups(tls_config.clone(), h, shutdown.clone()))),
            Err(e) => tracing::warn!(error = %e, "no SIGHUP handler: the TLS files reload on CLI changes only"),
        }
        // CLI changes wake both kinds of waiter.
        if let Err(e) = wake::listen(&self.dir.wake_socket(), wake_tx, shutdown.clone()).await {
            tracing::warn!(error = %e, "no wake socket: CLI changes reach waiting long-polls only at their next claim");
        }
        // ...and make open connections re-check their certificates (a revocation).
        let (records, records_rx) = watch::channel(0u64);
        let (relay, relay_tls) = (shared.clone(), tls_config.clone());
        tokio::spawn(async move {
            while wake_rx.changed().await.is_ok() {
                relay_tls.reload("a CLI change");
                relay.work_changed();
                relay.outcome_changed();
                records.send_modify(|n| *n = n.wrapping_add(1));
            }
        });
        tokio::spawn(sweep_retention(shared.clone(), self.config.limits.retention));
        tokio::spawn(lift_expired_fences(shared.clone()));
        if let Some(url) = self.config.database_url.clone() {
            tokio::spawn(crate::store::engine::postgres::analyze::run(url, shutdown.clone()));
        }
        tokio::spawn(crate::housekeeping::sweep_audit(shared.clone()));
        tokio::spawn(crate::housekeeping::expire_approvals(shared.clone()));
        tokio::spawn(crate::housekeeping::watch_store_size(shared.clone()));
        tokio::spawn(crate::housekeeping::requeue_silent(shared.clone(), self.config.requeue_silent_after));
        let gauge_watch = crate::metrics::GaugeWatch {
            host_silence_warn: self.config.host_silence_warn,
            hosts_max: self.config.metrics_hosts_max,
            interval: self.config.gauge_interval,
            read_share: self.config.gauge_read_share,
            dir: self.dir.clone(),
        };
        tokio::spawn(publish_gauges(shared.clone(), gauge_watch));
        tokio::spawn(flush_contacts(shared.clone()));
        crate::ops_listener::start(&self.config, &self.dir, shared.clone(), shutdown.clone()).await?;
        tracing::info!(addr = %listener.local_addr()?, "serving");
        let revocations = tls::Revocations { changes: records_rx, check: cert_check(shared.clone()) };
        tls::serve(
            listener,
            tls_config,
            app(shared.clone()),
            tls::ConnLimits::from(&self.config.limits),
            revocations,
            shutdown,
            self.config.shutdown_grace,
        )
        .await;
        // The last spans leave before the hub does (bounded by the exporter's own timeout).
        if telemetry.is_on() {
            let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        }
        tracing::info!("stopped");
        // The lock is held to the very end: a second hub cannot start while this one drains.
        drop(self.lock);
        Ok(())
    }
}

/// Whether a certificate may still be used, from the record (through the certificate cache,
/// which the change that triggers this check has emptied): unknown or revoked may not. A
/// record that cannot be read leaves the connection open; its next request is re-checked.
fn cert_check(shared: Arc<Shared>) -> tls::CertCheck {
    Arc::new(move |serial: String| {
        let shared = shared.clone();
        Box::pin(async move {
            match shared.certs.status(&shared.store, &serial).await {
                Ok(Some(s)) => !s.revoked,
                Ok(None) => false,
                Err(e) => {
                    tracing::warn!(error = %e, "could not re-check a connection's certificate");
                    true
                }
            }
        })
    })
}

/// Publishes deliveries per state, pending fan-out and active fences as gauges, and the rest
/// of the record's and the data directory's gauges (`metrics::publish_record_gauges`,
/// `metrics::publish_file_gauges`), then waits as `metrics::gauge_wait` says: at least
/// `gauge_interval`, longer when the read took more than `gauge_read_share` of the time.
async fn publish_gauges(shared: Arc<Shared>, watch: crate::metrics::GaugeWatch) {
    loop {
        let began = std::time::Instant::now();
        match shared.store.status().await {
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
        crate::metrics::publish_record_gauges(&shared, &watch).await;
        let took = began.elapsed();
        metrics::gauge!("baton_hub_gauges_read_seconds").set(took.as_secs_f64());
        crate::metrics::publish_file_gauges(&watch.dir, shared.clock.now_ms());
        tokio::select! {
            _ = tokio::time::sleep(crate::metrics::gauge_wait(watch.interval, watch.read_share, took)) => {}
            _ = shared.shutdown.cancelled() => return,
        }
    }
}

/// How often settled messages past the retention window are removed.
const RETENTION_SWEEP_INTERVAL: Duration = Duration::from_secs(600);

/// Messages settled before this time (unix ms) are past the retention window.
fn retention_cutoff_ms(clock: &dyn Clock, retention: Duration) -> i64 {
    clock.now_ms().saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX))
}

/// Writes the node sessions' last contact every `CONTACT_FLUSH_INTERVAL` (and once more at
/// shutdown), in one write job.
async fn flush_contacts(shared: Arc<Shared>) {
    loop {
        let stopping = tokio::select! {
            _ = tokio::time::sleep(crate::runtime::CONTACT_FLUSH_INTERVAL) => false,
            _ = shared.shutdown.cancelled() => true,
        };
        let contacts = shared.turns.take_contacts();
        if !contacts.is_empty()
            && let Err(e) = shared.store.record_contacts(contacts).await
        {
            tracing::warn!(error = %e, "could not record the node sessions' last contact");
        }
        if stopping {
            return;
        }
    }
}

async fn sweep_retention(shared: Arc<Shared>, retention: Duration) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(RETENTION_SWEEP_INTERVAL) => {}
            _ = shared.shutdown.cancelled() => return,
        }
        let cutoff = retention_cutoff_ms(shared.clock.as_ref(), retention);
        loop {
            match shared.store.retention_sweep(cutoff, store::upkeep::retention::SWEEP_MESSAGES_MAX).await {
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

/// How often the hub looks for time-boxed fences whose time is up (one indexed read; a write
/// only when one is due).
const FENCE_EXPIRY_PACE: Duration = Duration::from_secs(1);

/// Lifts time-boxed fences when their time is up (recorded as lifted by the hub) and wakes
/// the waiting claims they held back.
async fn lift_expired_fences(shared: Arc<Shared>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(FENCE_EXPIRY_PACE) => {}
            _ = shared.shutdown.cancelled() => return,
        }
        let now_ms = shared.clock.now_ms();
        match shared.store.next_fence_expiry().await {
            Ok(Some(at)) if at <= now_ms => {}
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "reading fence expiries failed");
                continue;
            }
        }
        match shared.store.lift_expired_fences(now_ms).await {
            Ok(ids) => {
                for id in ids {
                    tracing::info!(fence = id, "lifted a fence whose time was up");
                }
                shared.work_changed();
            }
            Err(e) => tracing::warn!(error = %e, "lifting expired fences failed"),
        }
    }
}

fn install_metrics() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = crate::metrics::builder().ok()?.install_recorder().ok()?;
            crate::metrics::describe();
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

/// Completes every fan-out obligation a crash left pending (`Store::repair`), before the hub
/// serves: on a runtime of its own, since the hub's runtime starts only once it is open.
/// Returns how many it completed.
fn repair(store: &Store) -> anyhow::Result<usize> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting a runtime")?;
    Ok(rt.block_on(store.repair())?)
}

/// Warns when the configuration file, which may hold the database's password, is open to
/// other users (`init` writes it 0600 when it holds `database_url`).
fn warn_if_readable(config_file: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(config_file)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            file = %config_file.display(),
            mode = format!("{:04o}", meta.permissions().mode() & 0o7777),
            "the configuration may hold the database's password and other users may read it: chmod 600 it"
        );
    }
}

/// Opens the record where the configuration says: the SQLite file in `dir` (checked as
/// `startup_check` says; `synchronous` below full is warned about), or the PostgreSQL database
/// of `database_url` (connected and migrated on a runtime of its own, as the hub's starts only
/// once it is open; `synchronous`, `startup_check` and `checkpoint_interval` are about the SQLite
/// file and do not apply: PostgreSQL's durability is its server's, and the server checks its own
/// pages).
fn open_store(dir: &DataDir, config: &HubConfig, clock: SharedClock) -> anyhow::Result<Store> {
    if let Some(url) = &config.database_url {
        tracing::info!(database = %url.shown(), "the record is in PostgreSQL; synchronous, startup_check and checkpoint_interval do not apply");
        warn_if_readable(&dir.config());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting a runtime")?;
        return Ok(rt.block_on(Store::open_postgres(url, clock))?);
    }
    if config.synchronous != Synchronous::Full {
        tracing::warn!(
            "synchronous = {:?}: answers are no longer promised to survive a power failure",
            config.synchronous
        );
    }
    Store::open_serve(&dir.db(), config.synchronous, config.startup_check, config.checkpoint_interval, clock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::in_write_txn;
    use crate::store::lifecycle::accept::{self, AcceptLimits, Accepted, NewMessage};
    use baton_shared::clock::ManualClock;

    /// Repair stamps what it creates with the injected clock, and the retention cutoff reads it.
    #[test]
    fn repair_and_retention_read_the_injected_clock() {
        let db = store::testing::db();
        let msg = NewMessage {
            traceparent: None,
            producer: "p".into(),
            conversation: "c".into(),
            idempotency_key: "k".into(),
            payload: "{}".into(),
            to: vec!["host-a".into()],
            pools: Vec::new(),
        };
        let limits = AcceptLimits { queued_per_host_max: 10, queued_per_pool_max: 10 };
        let Ok(Accepted::New { .. }) = in_write_txn(&db.conn, |c| accept::accept(c, &msg, limits, 1)) else {
            panic!("not accepted")
        };
        let clock = ManualClock::new(1_234_567);
        let shared: SharedClock = Arc::new(clock.clone());
        let store = Store::open_write(&db.path, Synchronous::Normal, shared).unwrap();
        assert_eq!(repair(&store).unwrap(), 1);
        let created: i64 = db.conn.query_row("SELECT created_at FROM deliveries", [], |r| r.get(0)).unwrap();
        assert_eq!(created, 1_234_567);
        assert_eq!(retention_cutoff_ms(&clock, Duration::from_secs(1_000)), 234_567);
    }
}
