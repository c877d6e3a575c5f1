//! The operator listener: plain HTTP with no client certificate, for what must be reachable
//! without one: `/healthz` and `/readyz` (a load balancer), `/metrics` (a scraper) and the
//! read-only status page (`status_page`). Configured by `operator_listen` (loopback on a free
//! port by default, its address written to `DIR/operator.addr`; `off` disables it).
//!
//! Boundary: nothing here changes the record; every route reads through the store's read
//! functions on the reader pool. The mTLS listener keeps its own `/healthz`, `/readyz` and
//! `/metrics`.

use crate::config::HubConfig;
use crate::datadir::DataDir;
use crate::http::{AppState, health};
use crate::status_page;
use anyhow::Context;
use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The file, in the data directory, that holds the operator listener's bound address.
pub const OPERATOR_ADDR_FILE: &str = "operator.addr";
/// Longest an operator-listener request may take (a page over a very large record); it is
/// answered 503 after.
pub const OPERATOR_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where `dir`'s operator listener address is written.
pub fn addr_file(dir: &DataDir) -> PathBuf {
    dir.addr_file().with_file_name(OPERATOR_ADDR_FILE)
}

/// The operator listener's routes over the hub's shared state.
pub fn router(shared: AppState, page: status_page::PageConfig) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics_open))
        .merge(status_page::routes(page))
        .layer(middleware::from_fn(time_limit))
        .with_state(shared)
}

/// Answers 503 for a request that takes longer than `OPERATOR_REQUEST_TIMEOUT`.
async fn time_limit(request: Request, next: Next) -> Response {
    match tokio::time::timeout(OPERATOR_REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "the page took too long to read; try again").into_response(),
    }
}

/// Binds the operator listener as `config` says, writes its address to `DIR/operator.addr`,
/// and serves it from a task until `shutdown`. With `operator_listen = "off"` it only removes
/// an address file a previous run left. Returns the bound address; a bind failure stops the
/// hub's start (an operator who configured a listener relies on it).
pub async fn start(
    config: &HubConfig,
    dir: &DataDir,
    shared: AppState,
    shutdown: CancellationToken,
) -> anyhow::Result<Option<SocketAddr>> {
    let file = addr_file(dir);
    remove_stale(&file)?;
    let Some(listen) = config.operator_listen else {
        tracing::info!("operator listener off");
        return Ok(None);
    };
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} (operator_listen) for the operator listener"))?;
    let addr = listener.local_addr()?;
    let tmp = file.with_extension("addr.tmp");
    std::fs::write(&tmp, format!("{addr}\n"))
        .and_then(|_| std::fs::rename(&tmp, &file))
        .with_context(|| format!("writing {}", file.display()))?;
    tracing::info!(addr = %addr, "operator listener: /healthz, /readyz, /metrics and the status page");
    let app = router(shared, status_page::PageConfig { host_silence_warn: config.host_silence_warn });
    tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await;
        if let Err(e) = served {
            tracing::warn!(error = %e, "the operator listener stopped");
        }
    });
    Ok(Some(addr))
}

/// Removes an address file a previous run left, so nobody reads a stale address.
fn remove_stale(file: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(file) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", file.display())),
    }
}
