//! The operator listener: plain HTTP with no client certificate, for what must be reachable
//! without one: `/healthz` and `/readyz` (a load balancer), `/metrics` (a scraper) and the
//! read-only status page (`status_page`). Configured by `operator_listen` (loopback on a free
//! port by default, its address written to `DIR/operator.addr`; `off` disables it).
//!
//! Boundary: nothing here changes the record; every route reads through the store's read
//! functions on the reader pool. The mTLS listener keeps its own `/healthz`, `/readyz` and
//! `/metrics`.
//!
//! Invariant: a request is answered only when its `Host` header names this listener (`Hosts`:
//! its bound IP address, `localhost` when bound on loopback, or a name in `operator_hosts`), so a
//! web page the operator opens cannot read the listener by rebinding its own name to this
//! address; anything else is 421.
//!
//! Invariant: one peer address keeps at most `operator_connections_per_peer_max` connections
//! and the listener `OPERATOR_CONNECTIONS_MAX`; a connection over either bound takes the place
//! of the oldest idle one (no request in progress) of that peer, or of the listener (`Conns`),
//! and is closed only when none is idle, so sockets held open cannot keep a health check out.

use crate::config::HubConfig;
use crate::config::OPERATOR_CONNECTIONS_MAX;
use crate::datadir::DataDir;
use crate::http::health;
use crate::runtime::AppState;
use crate::status_page;
use anyhow::Context;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The file, in the data directory, that holds the operator listener's bound address.
pub const OPERATOR_ADDR_FILE: &str = "operator.addr";
/// Longest an operator-listener request may take (a page over a very large record); it is
/// answered 503 after.
pub const OPERATOR_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a client may take to send a request's headers, which is also the longest a
/// kept-alive connection waits for its next request (slowloris guard).
pub const OPERATOR_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const _: () = assert!(OPERATOR_HEADER_READ_TIMEOUT.as_millis() < OPERATOR_REQUEST_TIMEOUT.as_millis());

/// Where `dir`'s operator listener address is written.
pub fn addr_file(dir: &DataDir) -> PathBuf {
    dir.addr_file().with_file_name(OPERATOR_ADDR_FILE)
}

/// The operator listener's routes over the hub's shared state, answering only requests whose
/// `Host` is one of `hosts`.
pub fn router(shared: AppState, page: status_page::PageConfig, hosts: Hosts) -> Router {
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics_open))
        .merge(status_page::routes(page))
        .layer(middleware::from_fn(time_limit))
        .layer(middleware::from_fn_with_state(Arc::new(hosts), host_check))
        .layer(middleware::from_fn(crate::metrics::count_operator_requests))
        .with_state(shared)
}

/// The names a request's `Host` header may give for the operator listener (the port is not
/// compared: a tunnel or a proxy may reach it on another one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hosts {
    /// The bound address.
    bound: IpAddr,
    /// `operator_hosts`, lowercase.
    names: Vec<String>,
}

impl Hosts {
    /// The names for a listener bound at `bound`, with the configured `names` (lowercase).
    pub fn new(bound: IpAddr, names: Vec<String>) -> Hosts {
        Hosts { bound, names }
    }

    /// Whether `host` (a `Host` header's value) names this listener: its bound IP address
    /// (any IP address when it is bound on all of them), `localhost` when it is bound on
    /// loopback or all addresses, or a configured name. An IP address cannot be rebound, so it
    /// is no way in for another site's page; a name must be listed.
    pub fn allows(&self, host: &str) -> bool {
        let name = host_part(host).to_ascii_lowercase();
        let all = self.bound.is_unspecified();
        match name.parse::<IpAddr>() {
            Ok(ip) => all || ip == self.bound || canonical(ip) == canonical(self.bound),
            Err(_) if name == "localhost" => all || self.bound.is_loopback(),
            Err(_) => self.names.contains(&name),
        }
    }

    /// What the listener answers to, for the refusal's message.
    fn describe(&self) -> String {
        let mut names =
            vec![if self.bound.is_unspecified() { "any IP address".to_string() } else { self.bound.to_string() }];
        if self.bound.is_loopback() || self.bound.is_unspecified() {
            names.push("localhost".into());
        }
        names.extend(self.names.iter().cloned());
        names.join(", ")
    }
}

/// An IPv4-mapped IPv6 address as its IPv4 address; any other as it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The host of a `Host` value without its port: `[::1]:80` is `::1`, `a.example:80` is
/// `a.example`, and a trailing dot is dropped.
fn host_part(host: &str) -> &str {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => host
            .rsplit_once(':')
            .map_or(host, |(name, port)| if port.chars().all(|c| c.is_ascii_digit()) { name } else { host }),
    };
    name.strip_suffix('.').unwrap_or(name)
}

/// Answers 421 to a request whose `Host` does not name this listener (see `Hosts`). A request
/// without one (HTTP/1.0, which some load balancers' checks still speak) is answered: every
/// browser sends one.
async fn host_check(State(hosts): State<Arc<Hosts>>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(axum::http::header::HOST)
        .map(|v| v.to_str().unwrap_or("(not text)").to_string())
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    match host {
        Some(h) if !hosts.allows(&h) => {
            let shown: String = h.chars().take(HOST_SHOWN_CHARS_MAX).collect();
            tracing::debug!(host = %shown, "operator listener: refused a request for another host");
            (
                StatusCode::MISDIRECTED_REQUEST,
                format!(
                    "Host {shown:?} is not this listener: it answers to {}. A name of this hub (a load \
                     balancer's, a proxy's) must be listed in operator_hosts.\n",
                    hosts.describe()
                ),
            )
                .into_response()
        }
        _ => next.run(request).await,
    }
}

/// Most characters of a refused `Host` value repeated in the answer.
const HOST_SHOWN_CHARS_MAX: usize = 200;

/// A warning for `config check` and the log when `operator_listen` is not a loopback address:
/// the listener needs no certificate, so anyone who can reach the address can read it.
pub fn exposure_warning(config: &HubConfig) -> Option<String> {
    let listen = config.operator_listen?;
    if listen.ip().is_loopback() {
        return None;
    }
    Some(format!(
        "operator_listen = {listen} is not a loopback address: the operator listener (health, metrics, the \
         status page) needs no certificate, so anyone who can reach it can read it; bind it to 127.0.0.1 and \
         tunnel to it, or keep it on a network you trust"
    ))
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
    if let Some(w) = exposure_warning(config) {
        tracing::warn!("{w}");
    }
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} (operator_listen) for the operator listener"))?;
    let addr = listener.local_addr()?;
    let tmp = file.with_extension("addr.tmp");
    std::fs::write(&tmp, format!("{addr}\n"))
        .and_then(|_| std::fs::rename(&tmp, &file))
        .with_context(|| format!("writing {}", file.display()))?;
    tracing::info!(addr = %addr, "operator listener: /healthz, /readyz, /metrics and the status page");
    let app = router(
        shared,
        status_page::PageConfig {
            host_silence_warn: config.host_silence_warn,
            store_bytes_max: config.limits.store_bytes_max,
            dir: dir.clone(),
            // Failure reasons are shown by default only where nobody but the machine reaches.
            reasons: config.status_page_reasons.unwrap_or(addr.ip().is_loopback()),
            rates: Default::default(),
            read_share: config.gauge_read_share,
        },
        Hosts::new(addr.ip(), config.operator_hosts.clone()),
    );
    let conns = Arc::new(Conns::new(config.operator_connections_per_peer_max, OPERATOR_CONNECTIONS_MAX));
    tokio::spawn(accept_loop(listener, app, conns, shutdown));
    Ok(Some(addr))
}

/// The operator listener's open connections, oldest first, each with its peer's address,
/// whether a request is in progress on it, and how to close it.
#[derive(Debug)]
pub struct Conns {
    open: Mutex<Vec<Slot>>,
    next: AtomicU64,
    per_peer_max: usize,
    total_max: usize,
}

#[derive(Debug)]
struct Slot {
    id: u64,
    peer: IpAddr,
    busy: Arc<AtomicUsize>,
    close: CancellationToken,
}

/// One admitted connection's place in `Conns`: its requests in progress (`busy`), the token
/// that closes it when a newer connection takes its place, and, dropped, the place freed.
#[derive(Debug)]
pub struct Admitted {
    conns: Arc<Conns>,
    id: u64,
    /// Requests in progress on the connection.
    pub busy: Arc<AtomicUsize>,
    /// Cancelled when a newer connection takes this one's place.
    pub close: CancellationToken,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.conns.open.lock().unwrap_or_else(|p| p.into_inner()).retain(|s| s.id != self.id);
    }
}

impl Conns {
    /// At most `per_peer_max` connections per peer address and `total_max` in all.
    pub fn new(per_peer_max: usize, total_max: usize) -> Conns {
        Conns { open: Mutex::new(Vec::new()), next: AtomicU64::new(0), per_peer_max, total_max }
    }

    /// Admits a connection from `peer`: over a bound, the oldest idle connection of the peer
    /// (or, for the total, of anyone) is closed to make room; `None` when none is idle.
    pub fn admit(conns: &Arc<Conns>, peer: IpAddr) -> Option<Admitted> {
        let mut open = conns.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.iter().filter(|s| s.peer == peer).count() >= conns.per_peer_max && !evict(&mut open, Some(peer)) {
            return None;
        }
        if open.len() >= conns.total_max && !evict(&mut open, None) {
            return None;
        }
        let id = conns.next.fetch_add(1, Ordering::Relaxed);
        let (busy, close) = (Arc::new(AtomicUsize::new(0)), CancellationToken::new());
        open.push(Slot { id, peer, busy: busy.clone(), close: close.clone() });
        Some(Admitted { conns: conns.clone(), id, busy, close })
    }
}

/// Closes the oldest idle connection (of `peer`, when given); whether there was one.
fn evict(open: &mut Vec<Slot>, peer: Option<IpAddr>) -> bool {
    let idle = open.iter().position(|s| peer.is_none_or(|p| s.peer == p) && s.busy.load(Ordering::SeqCst) == 0);
    match idle {
        Some(i) => {
            open.remove(i).close.cancel();
            true
        }
        None => false,
    }
}

/// Accepts connections until `shutdown`, within `conns`' bounds, each served over HTTP/1 with
/// `OPERATOR_HEADER_READ_TIMEOUT`.
async fn accept_loop(listener: TcpListener, app: Router, conns: Arc<Conns>, shutdown: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.cancelled() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: pause rather than spin.
                tracing::warn!(error = %e, "the operator listener could not accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(admitted) = Conns::admit(&conns, canonical(peer.ip())) else {
            tracing::debug!(%peer, "operator listener: every connection is busy, closing a new one");
            continue;
        };
        tokio::spawn(serve_connection(stream, app.clone(), shutdown.clone(), admitted));
    }
}

/// Serves one connection; on shutdown, finishes the request in progress and closes; closed at
/// once, idle, when a newer connection takes its place.
async fn serve_connection(stream: TcpStream, app: Router, shutdown: CancellationToken, admitted: Admitted) {
    let busy = admitted.busy.clone();
    let svc = tower::service_fn(move |request: Request<hyper::body::Incoming>| {
        busy.fetch_add(1, Ordering::SeqCst);
        let (app, busy) = (app.clone(), busy.clone());
        async move {
            let answer = tower::ServiceExt::oneshot(app, request).await;
            busy.fetch_sub(1, Ordering::SeqCst);
            answer
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(OPERATOR_HEADER_READ_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc));
    tokio::pin!(conn);
    let ended = tokio::select! {
        r = conn.as_mut() => r,
        _ = admitted.close.cancelled() => {
            tracing::debug!("operator listener: closed an idle connection to make room for a newer one");
            return;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The bound IP address (any port), localhost on loopback, and listed names are this
    /// listener; another name (a rebound one) is not.
    #[test]
    fn hosts_are_the_bound_address_localhost_and_listed_names() {
        let lo = Hosts::new("127.0.0.1".parse().unwrap(), vec!["status.example".into()]);
        for ok in ["127.0.0.1:9443", "127.0.0.1", "localhost:1", "LOCALHOST", "status.example:80", "Status.Example."] {
            assert!(lo.allows(ok), "{ok}");
        }
        for refused in ["evil.example:9443", "10.0.0.1:9443", "127.0.0.2", "status.example.evil", "", "[::1]:9443"] {
            assert!(!lo.allows(refused), "{refused}");
        }
        let all = Hosts::new("0.0.0.0".parse().unwrap(), vec![]);
        assert!(all.allows("10.1.2.3:9443") && all.allows("[::1]:9443") && all.allows("localhost"));
        assert!(!all.allows("hub.example:9443"), "a name is never taken without being listed");
        let v6 = Hosts::new("::1".parse().unwrap(), vec![]);
        assert!(v6.allows("[::1]:9443") && v6.allows("localhost") && !v6.allows("127.0.0.1"));
        let lan = Hosts::new("192.168.1.5".parse().unwrap(), vec![]);
        assert!(lan.allows("192.168.1.5:80") && !lan.allows("localhost"));
    }

    /// A peer over its bound takes the place of its own oldest idle connection; one whose
    /// connections are all busy is refused; the total bound takes anyone's oldest idle one.
    #[test]
    fn connections_over_a_bound_take_the_place_of_the_oldest_idle_one() {
        let conns = Arc::new(Conns::new(2, 3));
        let (a, b): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let a1 = Conns::admit(&conns, a).unwrap();
        let a2 = Conns::admit(&conns, a).unwrap();
        let a3 = Conns::admit(&conns, a).unwrap();
        assert!(a1.close.is_cancelled() && !a2.close.is_cancelled(), "the oldest idle one made room");
        a2.busy.store(1, Ordering::SeqCst);
        a3.busy.store(1, Ordering::SeqCst);
        assert!(Conns::admit(&conns, a).is_none(), "no idle connection of the peer: refused");
        let b1 = Conns::admit(&conns, b).unwrap();
        b1.busy.store(1, Ordering::SeqCst);
        assert!(Conns::admit(&conns, b).is_none(), "the listener is full of busy connections");
        a3.busy.store(0, Ordering::SeqCst);
        let b2 = Conns::admit(&conns, b).unwrap();
        assert!(a3.close.is_cancelled(), "the total bound made room from another peer's idle one");
        drop((a1, a2, a3, b1, b2));
        assert!(conns.open.lock().unwrap().is_empty(), "every place is freed");
    }
}
