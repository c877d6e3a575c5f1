//! baton-node, the Baton worker agent: claims this host's deliveries from the hub, mirrors
//! them into a local SQLite store, acks them, runs the harness turn for each (one at a time per
//! conversation), and reports how each turn ended through a durable outbox (SPEC §4).
//!
//! Layout:
//! - `cli`: subcommands and the exit status (`baton_shared::exit`); `main` only calls
//!   `cli::main_with`.
//! - `config`: every key declared once (doc, type, default, range); file < `BATON_NODE_<KEY>` <
//!   flag, stacked and validated into `NodeConfig`.
//! - `check`: what `config check` proves offline (files, harness program, key, node identity, CA
//!   chain and validity) and online (`--online`: the hub accepts this certificate), and what `run`
//!   refuses to start without.
//! - `limits`: every bound, named once.
//! - `store`: the node store (instance id, mirror, execution queue, attempt markers and process
//!   groups, outbox, retention), one file per noun.
//! - `client`: the hub API as the loop sees it (`Hub` trait) and `HubClient`, the real hub
//!   through `baton_client::NodeClient`.
//! - `shared_state`: `Shared`, what the claim loop, the scheduler and the outbox share
//!   (hub, store, config, clock, wake-ups, shutdown).
//! - `agent`: startup recovery, the session with the hub, the claim loop, holdings resync,
//!   mirrored/ack handoff, cancels.
//! - `sched`: per-conversation ordering and the parallel limit; the hub-confirmed start of each
//!   turn; shutdown grace.
//! - `exec`: runs one turn in its own process group, held at a gate until the group is stored;
//!   timeout (SIGTERM, then SIGKILL after `kill_grace`), cancel (the same after
//!   `cancel_grace`), output bounds; the `turn-gate` itself.
//! - `progress`: the progress channel's events (bounded, counted when dropped, kept in memory)
//!   and the renewal: one `POST /v1/running` per pass for every running turn.
//! - `renewal`: the renewal of running turns with the hub, one request per pass, carrying their
//!   progress; the events of ended turns sent before their reports.
//! - `tail`: the last bytes of a harness's stderr, cut on a character boundary, for its report.
//! - `turn_gate`: the gate a turn's process starts behind (`turn-gate`) and the handle a hub's
//!   cancel of a running turn arrives through.
//! - `group`: a harness's process group: its identity (group id, start time, boot id), the
//!   same-process check, and stopping what a crashed node left behind.
//! - `report`: the report outbox sender.
//! - `metrics`: `Watched`, the hub wrapper that notes every request (and logs the hub reachable
//!   again after an outage), and the `/metrics` listener (`metrics_listen`, off by default).
//! - `retention`: removes what the hub settled more than `local_retention` ago.
//! - `service`: systemd's side (`Type=notify`): ready after recovery and the first hub answer,
//!   the watchdog, stopping.
//! - `status`: `baton-node status`, read-only.
//! - `manuals`: `completions` and `man`, generated from the clap definitions in `cli`.
//! - `output`: stdout writes that end quietly when the reader has gone (a broken pipe).
//!
//! Invariant: only this crate opens the node store, through one connection used on blocking
//! threads only.
//! Invariant: nothing runs before the hub confirmed its ack and recorded its start for this
//! process's session; nothing that started is run twice.

pub mod agent;
pub mod check;
pub mod cli;
pub mod client;
pub mod config;
pub mod exec;
pub mod group;
pub mod limits;
pub mod manuals;
pub mod metrics;
pub mod output;
pub mod progress;
pub mod renewal;
pub mod report;
mod retention;
pub mod sched;
pub mod service;
mod shared_state;
pub mod status;
pub mod store;
pub mod tail;
pub mod turn_gate;

use anyhow::Context as _;
use baton_shared::clock::SharedClock;
use config::NodeConfig;
use std::future::Future;
use std::path::Path;

/// The file, in `data_dir`, that holds the metrics listener's bound address while it listens.
pub const METRICS_ADDR_FILE: &str = "metrics.addr";

/// Runs a node until `shutdown` completes: opens (or creates) the store in `data_dir`, takes
/// the data directory's lock, and runs the loop against the hub at `config.hub_url`. Stored
/// timestamps are read from `clock`. Each arrival on `hangups` (SIGHUP) re-reads the CA,
/// certificate and key files for the requests that follow; a reload that fails is logged and
/// the node goes on with what it had.
///
/// Ends with `agent::Finished` when the hub refused this node for good, and with
/// `agent::Superseded` when a newer session of this instance replaced this process's.
pub async fn run(
    config: NodeConfig,
    clock: SharedClock,
    shutdown: impl Future<Output = ()> + Send + 'static,
    mut hangups: tokio::signal::unix::Signal,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating data_dir {}", config.data_dir.display()))?;
    let _lock = lock_data_dir(&config.data_dir)?;
    let (path, sync, every) = (config.db_path(), config.synchronous, config.checkpoint_interval);
    let db = tokio::task::spawn_blocking(move || store::Db::open_checkpointed(&path, sync, every)).await??;
    let store = store::Store::new(db);
    let instance_id = store.call(|db| db.instance_id()).await?;
    tracing::info!(
        instance_id, data_dir = %config.data_dir.display(), hub_url = %config.hub_url,
        version = env!("CARGO_PKG_VERSION"), "baton-node starting"
    );
    if config.synchronous != baton_shared::sqlite::Synchronous::Full {
        tracing::warn!(
            "synchronous = normal: after a power failure a started turn's marker can be lost, and that turn \
             can then run a second time; use \"full\" (the default) wherever that matters"
        );
    }
    let hub = client::HubClient::new(&config, &instance_id)?;
    let noted = std::sync::Arc::new(metrics::NodeMetrics::new());
    let scrape = metrics::Scrape { metrics: noted.clone(), store: store.clone(), clock: clock.clone() };
    let metrics_listener = match config.metrics_listen {
        Some(addr) => Some(start_metrics(addr, &config.data_dir, scrape).await?),
        None => None,
    };
    let reloader = hub.clone();
    let reloads = tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            let hub = reloader.clone();
            match tokio::task::spawn_blocking(move || hub.reload()).await {
                Ok(Ok(generation)) => tracing::info!(
                    generation,
                    "SIGHUP: read ca_file, cert_file and key_file again; the next requests present that certificate"
                ),
                Ok(Err(e)) => {
                    tracing::error!("SIGHUP: cannot reload the certificate ({e}); still using the one before")
                }
                Err(e) => tracing::error!("SIGHUP: the reload failed ({e}); still using the certificate before"),
            }
        }
    });
    // systemd (nothing without NOTIFY_SOCKET): ready at the first hub answer, which comes after
    // recovery; stopping as soon as shutdown begins; the watchdog fed meanwhile.
    let (hub, shutdown, watchdog) = (
        service::Notifying::new(metrics::Watched::new(hub, noted)),
        service::stopping_on(shutdown),
        service::spawn_watchdog(),
    );
    let data_dir = config.data_dir.clone();
    let ran = agent::run_agent(config, store, hub, instance_id, clock, exec::Gate::this_binary(), shutdown).await;
    if let Some(task) = metrics_listener {
        task.abort();
        let _ = std::fs::remove_file(data_dir.join(METRICS_ADDR_FILE));
    }
    reloads.abort();
    if let Some(w) = watchdog {
        w.abort();
    }
    ran
}

/// Binds the metrics listener at `addr` (`metrics_listen`), writes the bound address to
/// `data_dir/metrics.addr` (whole, then renamed into place) and serves it on a task of its own.
/// An address that cannot be bound stops the node at start, naming the key.
async fn start_metrics(
    addr: std::net::SocketAddr,
    data_dir: &Path,
    scrape: metrics::Scrape,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("metrics_listen: cannot listen on {addr}"))?;
    let bound = listener.local_addr().context("metrics_listen: reading the bound address")?;
    let file = data_dir.join(METRICS_ADDR_FILE);
    let tmp = file.with_extension("addr.tmp");
    std::fs::write(&tmp, format!("{bound}\n"))
        .and_then(|_| std::fs::rename(&tmp, &file))
        .with_context(|| format!("writing {}", file.display()))?;
    if bound.ip().is_loopback() {
        tracing::info!(addr = %bound, "serving metrics on http://{bound}/metrics");
    } else {
        tracing::warn!(
            addr = %bound,
            "serving metrics on http://{bound}/metrics, beyond loopback: anyone who reaches it reads them, with no \
             certificate"
        );
    }
    Ok(tokio::spawn(metrics::serve(listener, scrape)))
}

/// Holds an exclusive lock on `data_dir/node.lock` for as long as the returned file lives, so
/// two processes never share one data directory (one instance, one process).
fn lock_data_dir(data_dir: &Path) -> anyhow::Result<std::fs::File> {
    let path = data_dir.join("node.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => {
            anyhow::bail!("another baton-node is running with data_dir {}", data_dir.display())
        }
        Err(std::fs::TryLockError::Error(e)) => Err(e).with_context(|| format!("locking {}", path.display())),
    }
}
