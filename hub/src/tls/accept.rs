//! The accept loop: every connection's bounds (see the module above), the handshake, and the
//! verified peer certificate handed to each request.

use super::answer431::{Answer431, HEADER_BYTES_MAX};
use super::config::ServerTls;
use super::{PeerCerts, PeerIdentityExt};
use crate::config::Limits;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use rustls_pki_types::CertificateDer;
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// How often connections refused at a limit are summed up in the log.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// The pause after a failed `accept` (out of file descriptors and the like) instead of spinning.
const ACCEPT_RETRY_PAUSE: Duration = Duration::from_millis(50);
/// How long a peer address's refused-handshake reason is not logged again (the same reason;
/// another reason is logged at once).
pub const HANDSHAKE_REASON_REPEAT: Duration = Duration::from_secs(3600);
/// Most peer addresses whose refused-handshake reason is remembered; refusals from further
/// peers are only counted (in the periodic line) until remembered ones age out.
pub const HANDSHAKE_PEERS_REMEMBERED_MAX: usize = 1024;

/// The bounds the accept loop puts on every connection (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Most connections open at once, handshaking ones included.
    pub connections_max: u32,
    /// Most connections open at once from one client certificate.
    pub connections_per_cert_max: u32,
    /// Longest TLS handshake.
    pub handshake_timeout: Duration,
    /// Longest wait for a request's headers (HTTP/1), and so for the next request.
    pub header_read_timeout: Duration,
    /// Longest time with no request in progress.
    pub idle_timeout: Duration,
    /// Most requests one connection carries.
    pub requests_per_connection_max: u64,
}

impl From<&Limits> for ConnLimits {
    fn from(l: &Limits) -> Self {
        ConnLimits {
            connections_max: l.connections_max,
            connections_per_cert_max: l.connections_per_cert_max,
            handshake_timeout: l.handshake_timeout,
            header_read_timeout: l.header_read_timeout,
            idle_timeout: l.idle_timeout,
            requests_per_connection_max: l.requests_per_connection_max,
        }
    }
}

/// A boxed answer of a `CertCheck`.
pub type CheckFuture = Pin<Box<dyn Future<Output = bool> + Send>>;

/// Asks the record whether the certificate with this serial (lowercase hex) may still be used.
pub type CertCheck = Arc<dyn Fn(String) -> CheckFuture + Send + Sync>;

/// How open connections learn that certificates may have been revoked.
#[derive(Clone)]
pub struct Revocations {
    /// Changes when the record may have changed (a CLI change woke the hub).
    pub changes: watch::Receiver<u64>,
    /// Re-checks one certificate.
    pub check: CertCheck,
}

/// Connections refused since the last log line, by reason.
#[derive(Debug, Default)]
struct Refusals {
    /// At `limits.connections_max`.
    total: AtomicU64,
    /// At `limits.connections_per_cert_max`.
    per_cert: AtomicU64,
    /// TLS handshakes that failed or timed out.
    handshakes: AtomicU64,
    /// Refused handshakes whose reason was not logged because `RefusedPeers` was full.
    handshakes_unlogged: AtomicU64,
    /// Failed accepts (out of file descriptors and the like), with the last error.
    accept_errors: AtomicU64,
    last_accept_error: Mutex<Option<String>>,
}

impl Refusals {
    /// Logs what was refused since the last call, if anything: one line per interval.
    fn log(&self) {
        let total = self.total.swap(0, Ordering::Relaxed);
        let per_cert = self.per_cert.swap(0, Ordering::Relaxed);
        let handshakes = self.handshakes.swap(0, Ordering::Relaxed);
        let unlogged = self.handshakes_unlogged.swap(0, Ordering::Relaxed);
        let accept_errors = self.accept_errors.swap(0, Ordering::Relaxed);
        if accept_errors > 0 {
            let last = self.last_accept_error.lock().unwrap_or_else(|p| p.into_inner()).take().unwrap_or_default();
            tracing::warn!(
                accept_errors,
                last_error = %last,
                interval = ?REFUSAL_LOG_INTERVAL,
                "accepting connections failed (\"Too many open files\": raise the hub's open-file limit or lower \
                 limits.connections_max)"
            );
        }
        if total + per_cert > 0 {
            tracing::warn!(
                at_connections_max = total,
                at_connections_per_cert_max = per_cert,
                interval = ?REFUSAL_LOG_INTERVAL,
                "connections refused at their limits (limits.connections_max, limits.connections_per_cert_max)"
            );
        }
        if handshakes > 0 {
            tracing::info!(
                handshakes,
                reasons_not_logged = unlogged,
                interval = ?REFUSAL_LOG_INTERVAL,
                "TLS handshakes refused or timed out"
            );
        }
    }

    /// Counts a failed accept; the periodic line reports it.
    fn accept_failed(&self, e: &std::io::Error) {
        self.accept_errors.fetch_add(1, Ordering::Relaxed);
        *self.last_accept_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
    }
}

/// What `RefusedPeers::note` makes of a refused handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Noted {
    /// News: log its reason.
    Log,
    /// This peer's reason was logged within `HANDSHAKE_REASON_REPEAT`.
    Repeat,
    /// `HANDSHAKE_PEERS_REMEMBERED_MAX` other peers are remembered: only counted.
    Full,
}

/// The peer addresses whose refused handshakes were logged, with the reason and when: each
/// peer's reason is logged once per `HANDSHAKE_REASON_REPEAT` (another reason of the same peer
/// at once), for at most `HANDSHAKE_PEERS_REMEMBERED_MAX` pairs of peer and reason.
#[derive(Debug, Default)]
pub(super) struct RefusedPeers {
    pub(super) seen: Mutex<HashMap<(IpAddr, String), std::time::Instant>>,
}

impl RefusedPeers {
    /// Whether `peer`'s refusal for `reason` at `now` is to be logged (and remembers it).
    pub(super) fn note(&self, peer: IpAddr, reason: &str, now: std::time::Instant) -> Noted {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let key = (peer, reason.to_string());
        match seen.get(&key) {
            Some(at) if now.saturating_duration_since(*at) < HANDSHAKE_REASON_REPEAT => return Noted::Repeat,
            Some(_) => {}
            None if seen.len() >= HANDSHAKE_PEERS_REMEMBERED_MAX => {
                seen.retain(|_, at| now.saturating_duration_since(*at) < HANDSHAKE_REASON_REPEAT);
                if seen.len() >= HANDSHAKE_PEERS_REMEMBERED_MAX {
                    return Noted::Full;
                }
            }
            None => {}
        }
        seen.insert(key, now);
        Noted::Log
    }
}

/// Why a handshake was refused, in words an operator can act on, without the details that vary
/// between attempts (times, names), so one peer's repeated refusal reads the same.
fn handshake_reason(e: &std::io::Error) -> String {
    use rustls::Error as E;
    let Some(tls) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) else {
        return match e.kind() {
            std::io::ErrorKind::UnexpectedEof => "the client closed the connection during the handshake".into(),
            kind => format!("the handshake failed: {kind}"),
        };
    };
    // A variant's name without its fields: `Expired`, `UnknownIssuer`, `Revoked`.
    let name = |debug: String| debug.split(['(', ' ', '{']).next().unwrap_or_default().to_string();
    match tls {
        E::InvalidCertificate(c) => format!("the client's certificate was refused: {}", name(format!("{c:?}"))),
        E::NoCertificatesPresented => "the client presented no certificate".into(),
        E::AlertReceived(alert) => {
            format!("the client refused the hub's certificate or the handshake: alert {alert:?}")
        }
        E::PeerIncompatible(why) => format!("the client is incompatible: {}", name(format!("{why:?}"))),
        E::PeerMisbehaved(why) => format!("the client misbehaved: {}", name(format!("{why:?}"))),
        other => format!("the handshake failed: {}", name(format!("{other:?}"))),
    }
}

/// Open connections per client certificate (keyed by the leaf's DER bytes).
#[derive(Debug, Default)]
pub(super) struct PerCert {
    pub(super) open: Mutex<HashMap<Vec<u8>, u32>>,
}

/// One connection's place in `PerCert`; leaving frees it.
pub(super) struct CertSlot {
    table: Arc<PerCert>,
    key: Vec<u8>,
}

impl PerCert {
    /// Takes a slot for `key`, or `None` when it holds `max` already.
    pub(super) fn enter(table: &Arc<PerCert>, key: Vec<u8>, max: u32) -> Option<CertSlot> {
        let mut open = table.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(key.clone()).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(CertSlot { table: table.clone(), key })
    }
}

impl Drop for CertSlot {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// What one connection's requests are doing, shared between its service and its task.
#[derive(Debug, Default)]
struct Activity {
    /// Requests in progress.
    in_flight: AtomicUsize,
    /// Requests begun on this connection.
    begun: AtomicU64,
    /// Woken when a request begins or ends.
    changed: Notify,
}

/// A request in progress; ending (or being dropped) tells the connection's task.
struct InFlight(Arc<Activity>);

impl InFlight {
    /// Counts a request that begins; also says whether it is the last one the connection
    /// carries (the `max`th).
    fn begin(activity: &Arc<Activity>, max: u64) -> (InFlight, bool) {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        let n = activity.begun.fetch_add(1, Ordering::SeqCst) + 1;
        activity.changed.notify_one();
        (InFlight(activity.clone()), n >= max)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_one();
    }
}

/// What every connection task shares.
struct Accepting {
    tls: Arc<ServerTls>,
    app: Router,
    limits: ConnLimits,
    revocations: Revocations,
    per_cert: Arc<PerCert>,
    refusals: Arc<Refusals>,
    refused_peers: RefusedPeers,
    shutdown: CancellationToken,
}

/// Serves `app` over TLS on `listener` within `limits` until `shutdown` is cancelled, then waits
/// up to `grace` for open connections to finish.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerTls>,
    app: Router,
    limits: ConnLimits,
    revocations: Revocations,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let open = Arc::new(Semaphore::new(limits.connections_max as usize));
    let refusals = Arc::new(Refusals::default());
    tokio::spawn(log_refusals(refusals.clone(), shutdown.clone()));
    let accepting = Arc::new(Accepting {
        tls,
        app,
        limits,
        revocations,
        per_cert: Arc::new(PerCert::default()),
        refusals,
        refused_peers: RefusedPeers::default(),
        shutdown: shutdown.clone(),
    });
    loop {
        let (tcp, remote) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Summed up in the periodic line: out of file descriptors, this repeats.
                    accepting.refusals.accept_failed(&e);
                    tokio::time::sleep(ACCEPT_RETRY_PAUSE).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            accepting.refusals.total.fetch_add(1, Ordering::Relaxed);
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let accepting = accepting.clone();
        tokio::spawn(async move {
            connection(&accepting, tcp, remote).await;
            drop(permit);
        });
    }
    drop(listener);
    // Every open connection holds a permit; all of them back means all have finished.
    if tokio::time::timeout(grace, open.acquire_many(limits.connections_max)).await.is_err() {
        tracing::warn!(?grace, "connections still open after the grace period; closing them");
    }
}

/// Logs the refusals once per interval until shutdown.
async fn log_refusals(refusals: Arc<Refusals>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(REFUSAL_LOG_INTERVAL) => refusals.log(),
            _ = shutdown.cancelled() => return refusals.log(),
        }
    }
}

/// One connection: the handshake, the per-certificate slot, then HTTP until it ends, is idle
/// too long, has carried its requests, its certificate is revoked, or the hub shuts down.
async fn connection(a: &Accepting, tcp: TcpStream, remote: SocketAddr) {
    let tls = tokio::select! {
        r = tokio::time::timeout(a.limits.handshake_timeout, TlsAcceptor::from(a.tls.config()).accept(tcp)) => r,
        _ = a.shutdown.cancelled() => return,
    };
    let tls = match tls {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return refused_handshake(a, remote, handshake_reason(&e), Some(&e)),
        Err(_) => {
            return refused_handshake(a, remote, "the handshake timed out (limits.handshake_timeout)".into(), None);
        }
    };
    let handshaken = Instant::now();
    let certs: Vec<CertificateDer<'static>> = tls
        .get_ref()
        .1
        .peer_certificates()
        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
        .unwrap_or_default();
    let leaf = certs.first().map(|c| c.as_ref().to_vec()).unwrap_or_default();
    let Some(_slot) = PerCert::enter(&a.per_cert, leaf.clone(), a.limits.connections_per_cert_max) else {
        a.refusals.per_cert.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("baton_hub_connections_refused_total", "limit" => "per_cert").increment(1);
        return;
    };
    // Parsed once here; every request of the connection carries the result.
    let identity = match certs.first() {
        Some(c) => baton_shared::pki::peer_identity(c).map_err(|e| e.to_string()),
        None => Err("no client certificate".to_string()),
    };
    let serial = identity.as_ref().ok().map(|id| id.serial.clone());
    let identity = PeerIdentityExt(Arc::new(identity));
    let peer = PeerCerts(Arc::new(certs));
    let activity = Arc::new(Activity::default());
    let app = a.app.clone();
    let counted = activity.clone();
    let requests_max = a.limits.requests_per_connection_max;
    let svc = tower::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(peer.clone());
        req.extensions_mut().insert(identity.clone());
        req.extensions_mut().insert(axum::extract::ConnectInfo::<SocketAddr>(remote));
        let (in_flight, last) = InFlight::begin(&counted, requests_max);
        let http1 = req.version() < hyper::Version::HTTP_2;
        let app = app.clone();
        async move {
            let mut answer = app.oneshot(req).await;
            // HTTP/1 is told in the answer itself, so that a pipelined next request is not
            // read; HTTP/2 gets a GOAWAY from the connection's task.
            if let (true, true, Ok(a)) = (last, http1, answer.as_mut()) {
                a.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
            }
            drop(in_flight);
            answer
        }
    });
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(a.limits.header_read_timeout)
        .max_buf_size(HEADER_BYTES_MAX);
    builder.http2().timer(TokioTimer::new()).max_header_list_size(HEADER_BYTES_MAX as u32);
    let io = Answer431::new(tls);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(svc));
    tokio::pin!(conn);
    let mut changes = a.revocations.changes.clone();
    // Only changes after this connection began are news to it: its requests are checked anyway.
    changes.borrow_and_update();
    let mut watching = serial.is_some();
    let mut draining = false;
    let mut idle_since = Some(Instant::now());
    loop {
        let idle_deadline = idle_since.map(|t| t + a.limits.idle_timeout);
        // Until its first request, the header wait counts from the handshake.
        let first_request_deadline = (activity.begun.load(Ordering::SeqCst) == 0 && !draining)
            .then(|| handshaken + a.limits.header_read_timeout);
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%remote, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = activity.changed.notified() => {
                let idle = activity.in_flight.load(Ordering::SeqCst) == 0;
                idle_since = match (idle, idle_since) {
                    (true, Some(t)) => Some(t),
                    (true, None) => Some(Instant::now()),
                    (false, _) => None,
                };
                if !draining && activity.begun.load(Ordering::SeqCst) >= a.limits.requests_per_connection_max {
                    tracing::debug!(%remote, "closing a connection that carried its requests");
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
            _ = sleep_until_some(idle_deadline) => {
                tracing::debug!(%remote, "closing an idle connection");
                return;
            }
            _ = sleep_until_some(first_request_deadline) => {
                if activity.begun.load(Ordering::SeqCst) == 0 {
                    tracing::debug!(%remote, "closing a connection that sent no request within limits.header_read_timeout");
                    return;
                }
            }
            r = changes.changed(), if watching && !draining => {
                let (still_valid, issuer_trusted) = match (&serial, r) {
                    (Some(s), Ok(())) => ((a.revocations.check)(s.clone()).await, a.tls.trusts(&leaf)),
                    _ => {
                        watching = false;
                        (true, true)
                    }
                };
                if !issuer_trusted {
                    tracing::info!(%remote, "closing a connection whose certificate's CA is no longer trusted");
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                } else if !still_valid {
                    tracing::info!(%remote, "closing a connection whose certificate was revoked");
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
            _ = a.shutdown.cancelled(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Counts a refused handshake, and logs its reason at warn when `RefusedPeers` says this peer's
/// is news (else at debug).
fn refused_handshake(a: &Accepting, remote: SocketAddr, reason: String, error: Option<&std::io::Error>) {
    a.refusals.handshakes.fetch_add(1, Ordering::Relaxed);
    metrics::counter!("baton_hub_tls_handshake_failures_total").increment(1);
    let detail = error.map(|e| e.to_string()).unwrap_or_default();
    match a.refused_peers.note(remote.ip(), &reason, std::time::Instant::now()) {
        Noted::Log => tracing::warn!(
            peer = %remote.ip(),
            %reason,
            error = %detail,
            "TLS handshake refused (this peer's further refusals for this reason are only counted for an hour)"
        ),
        Noted::Repeat => tracing::debug!(%remote, %reason, error = %detail, "TLS handshake refused"),
        Noted::Full => {
            a.refusals.handshakes_unlogged.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%remote, %reason, error = %detail, "TLS handshake refused");
        }
    }
}

/// Sleeps until `deadline`, or forever when there is none.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
