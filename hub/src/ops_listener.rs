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
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// The file, in the data directory, that holds the operator listener's bound address.
pub const OPERATOR_ADDR_FILE: &str = "operator.addr";
/// Longest an operator-listener request may take (a page over a very large record); it is
/// answered 503 after.
pub const OPERATOR_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Most operator-listener connections open at once; more are closed at accept, so a flood on
/// this port cannot take the hub's file descriptors from nodes and producers.
pub const OPERATOR_CONNECTIONS_MAX: usize = 64;
/// Longest a client may take to send a request's headers, which is also the longest a
/// kept-alive connection waits for its next request (slowloris guard).
pub const OPERATOR_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const _: () = assert!(OPERATOR_HEADER_READ_TIMEOUT.as_millis() < OPERATOR_REQUEST_TIMEOUT.as_millis());

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
    tokio::spawn(accept_loop(listener, app, shutdown));
    Ok(Some(addr))
}

/// Accepts connections until `shutdown`, at most `OPERATOR_CONNECTIONS_MAX` open at once, each
/// served over HTTP/1 with `OPERATOR_HEADER_READ_TIMEOUT`.
async fn accept_loop(listener: TcpListener, app: Router, shutdown: CancellationToken) {
    let open = Arc::new(Semaphore::new(OPERATOR_CONNECTIONS_MAX));
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.cancelled() => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: pause rather than spin.
                tracing::warn!(error = %e, "the operator listener could not accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tracing::debug!("operator listener: connection limit reached, closing a new connection");
            continue;
        };
        tokio::spawn(serve_connection(stream, app.clone(), shutdown.clone(), permit));
    }
}

/// Serves one connection; on shutdown, finishes the request in progress and closes.
async fn serve_connection(stream: TcpStream, app: Router, shutdown: CancellationToken, _permit: OwnedSemaphorePermit) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(OPERATOR_HEADER_READ_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
    tokio::pin!(conn);
    let ended = tokio::select! {
        r = conn.as_mut() => r,
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.as_mut().await
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "an operator-listener connection ended with an error");
    }
}

/// Removes an address file a previous run left, so nobody reads a stale address.
fn remove_stale(file: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(file) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", file.display())),
    }
}
