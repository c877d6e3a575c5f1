//! TLS for the hub: the rustls server config (client certificates required, verified against
//! the hub's CA) and the accept loop that hands each request the verified peer certificate.
//!
//! The accept loop bounds every connection (`ConnLimits`): how many are open at once in total
//! (counted from accept, so handshaking ones count) and per client certificate (counted after
//! the handshake), the handshake, the wait for request headers (hyper's `header_read_timeout`,
//! which on HTTP/1 also bounds the wait for the next request), the time with no request in
//! progress, and the requests one connection carries. A request in progress is bounded by its
//! handler (a long poll by `limits.long_poll_wait_max`), never by these waits. Connections
//! refused at a limit are counted and logged once per `REFUSAL_LOG_INTERVAL`, not one line each.
//!
//! Invariant: a connection whose certificate is revoked, or whose issuing CA is no longer in
//! `ca.crt` (`ca retire-old`), is closed once the change reaches the hub (the wake socket,
//! which reloads the TLS files first): it is re-checked on every change, finishes what is in
//! progress (whose answer re-checks the certificate too) and takes no new request.
//!
//! Boundary: identity enters the HTTP layer only as `PeerIdentityExt` (the leaf certificate's
//! identity, parsed once when the connection's handshake completes) and `PeerCerts`, inserted
//! here from the verified handshake; handlers never read identity from bodies, headers or URLs.

use crate::config::Limits;
use crate::datadir::DataDir;
use anyhow::Context;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The verified client certificate chain of the connection a request came on (leaf first).
#[derive(Debug, Clone)]
pub struct PeerCerts(pub Arc<Vec<CertificateDer<'static>>>);

/// The identity of the verified leaf certificate of the connection a request came on, parsed
/// once per connection (not per request); `Err` holds why the certificate names no identity.
#[derive(Debug, Clone)]
pub struct PeerIdentityExt(pub Arc<Result<baton_shared::pki::PeerIdentity, String>>);

/// The hub's TLS configuration, reloadable while the hub runs: the client verifier's roots
/// (every CA in `ca.crt`, so during a CA rotation both the old and the new CA are trusted) and
/// the server certificate (`ServerCert`, resolved per handshake). Each connection's handshake
/// uses the configuration current when it was accepted.
#[derive(Debug)]
pub struct ServerTls {
    dir: DataDir,
    cert: Arc<ServerCert>,
    config: RwLock<Arc<ServerConfig>>,
    /// `ca.crt` as read, and the subject key identifiers of its CAs.
    cas: RwLock<(Vec<u8>, Vec<Vec<u8>>)>,
}

/// Builds the TLS configuration from the data directory (see `ServerTls`).
pub fn server_config(dir: &DataDir) -> anyhow::Result<Arc<ServerTls>> {
    let ca_file = read_file(&dir.ca_cert())?;
    let builder = ServerConfig::builder();
    let cert = Arc::new(ServerCert::load(dir, builder.crypto_provider().clone())?);
    let (config, ids) = build_config(&ca_file, &cert)?;
    Ok(Arc::new(ServerTls { dir: dir.clone(), cert, config: RwLock::new(config), cas: RwLock::new((ca_file, ids)) }))
}

/// A server config trusting every CA in `ca_file` for client certificates and serving `cert`;
/// with the CAs' subject key identifiers.
fn build_config(ca_file: &[u8], cert: &Arc<ServerCert>) -> anyhow::Result<(Arc<ServerConfig>, Vec<Vec<u8>>)> {
    let mut roots = rustls::RootCertStore::empty();
    let mut ids = Vec::new();
    for ca in CertificateDer::pem_slice_iter(ca_file) {
        let ca = ca.context("parsing the CA certificate")?;
        ids.push(baton_shared::pki::subject_key_id(&ca).context("reading the CA certificate")?);
        roots.add(ca).context("adding the CA certificate")?;
    }
    let verifier = WebPkiClientVerifier::builder(Arc::new(roots)).build().context("building the client verifier")?;
    let mut config = ServerConfig::builder().with_client_cert_verifier(verifier).with_cert_resolver(cert.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((Arc::new(config), ids))
}

impl ServerTls {
    /// The configuration new handshakes use.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.config.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the CA that issued `leaf` (DER) is still trusted (by key identifier).
    pub fn trusts(&self, leaf: &[u8]) -> bool {
        let cas = self.cas.read().unwrap_or_else(|p| p.into_inner());
        baton_shared::pki::authority_key_id(leaf).ok().flatten().is_some_and(|a| cas.1.contains(&a))
    }

    /// Reads `ca.crt`, `hub.crt` and `hub.key` again and serves what changed to new handshakes;
    /// logs what it did (`cause` says why it ran). Files that fail to load change nothing.
    pub fn reload(&self, cause: &str) {
        match self.cert.reload(&self.dir) {
            Ok(Reloaded::Replaced(f)) => tracing::info!(
                serial = %f.serial,
                not_after = %rfc3339(f.not_after_unix),
                cause,
                "server certificate replaced; new connections get it"
            ),
            Ok(Reloaded::Unchanged) => tracing::debug!(cause, "server certificate unchanged"),
            Err(e) => tracing::warn!(
                error = format!("{e:#}"),
                cause,
                serial = %self.cert.facts().serial,
                "server certificate not reloaded; still serving the previous one"
            ),
        }
        if let Err(e) = self.reload_cas() {
            tracing::warn!(error = format!("{e:#}"), cause, "CA file not reloaded; still trusting the previous CAs");
        }
    }

    fn reload_cas(&self) -> anyhow::Result<()> {
        let ca_file = read_file(&self.dir.ca_cert())?;
        if self.cas.read().unwrap_or_else(|p| p.into_inner()).0 == ca_file {
            return Ok(());
        }
        let (config, ids) = build_config(&ca_file, &self.cert)?;
        let count = ids.len();
        *self.cas.write().unwrap_or_else(|p| p.into_inner()) = (ca_file, ids);
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = config;
        tracing::info!(cas = count, "CA file reloaded; new connections are verified against it");
        Ok(())
    }
}

/// Reads one of the data directory's PEM files, at most `PEM_FILE_BYTES_MAX` of it.
fn read_file(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    use baton_shared::limits::PEM_FILE_BYTES_MAX;
    baton_shared::files::read_bounded(path, PEM_FILE_BYTES_MAX, "PEM_FILE_BYTES_MAX")
        .with_context(|| format!("reading {}", path.display()))
}

/// What identifies one server certificate in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerCertFacts {
    /// The serial, lowercase hex.
    pub serial: String,
    /// Expiry, unix seconds.
    pub not_after_unix: i64,
}

/// One loaded certificate and key, with the file contents it was loaded from.
#[derive(Debug)]
struct LoadedCert {
    key: Arc<CertifiedKey>,
    /// `hub.crt` and `hub.key` as read, to tell a reload that changes nothing.
    files: (Vec<u8>, Vec<u8>),
    facts: ServerCertFacts,
}

/// The hub's server certificate, which every handshake asks for (`ResolvesServerCert`), and
/// which `reload` replaces from the data directory while the hub runs: connections open at
/// the time keep the certificate they were made with, new handshakes get the new one.
///
/// Invariant: what is served is always a certificate and key that were loaded together and
/// match; a reload that fails (a file missing, unparseable, or a key that is not the
/// certificate's, as between the two renames of `renew --server`) keeps the previous one.
#[derive(Debug)]
pub struct ServerCert {
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<LoadedCert>>,
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    /// The files hold the certificate already served.
    Unchanged,
    /// New handshakes get this certificate.
    Replaced(ServerCertFacts),
}

impl ServerCert {
    /// Loads `hub.crt` and `hub.key` from `dir`, with keys parsed by `provider`.
    pub fn load(dir: &DataDir, provider: Arc<CryptoProvider>) -> anyhow::Result<ServerCert> {
        let loaded = load_cert(dir, &provider)?;
        Ok(ServerCert { provider, current: RwLock::new(Arc::new(loaded)) })
    }

    /// The certificate now served.
    pub fn facts(&self) -> ServerCertFacts {
        self.now().facts.clone()
    }

    fn now(&self) -> Arc<LoadedCert> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Reads the files again; serves what they hold from the next handshake on, unless they
    /// fail to load (then the current certificate stays, and the error says why).
    pub fn reload(&self, dir: &DataDir) -> anyhow::Result<Reloaded> {
        let files = read_cert_files(dir)?;
        if self.now().files == files {
            return Ok(Reloaded::Unchanged);
        }
        let loaded = parse_cert(&files, &self.provider)?;
        let facts = loaded.facts.clone();
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(loaded);
        Ok(Reloaded::Replaced(facts))
    }
}

impl ResolvesServerCert for ServerCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.now().key.clone())
    }
}

/// Unix seconds as an RFC 3339 UTC time, for the log (the number itself when out of range).
fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| unix.to_string())
}

fn read_cert_files(dir: &DataDir) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    Ok((read_file(&dir.server_cert())?, read_file(&dir.server_key())?))
}

fn load_cert(dir: &DataDir, provider: &CryptoProvider) -> anyhow::Result<LoadedCert> {
    parse_cert(&read_cert_files(dir)?, provider)
}

/// Parses a certificate chain and its key, refusing a key that is not the certificate's.
fn parse_cert(files: &(Vec<u8>, Vec<u8>), provider: &CryptoProvider) -> anyhow::Result<LoadedCert> {
    let (cert_pem, key_pem) = files;
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem).collect::<Result<_, _>>().context("parsing the server certificate")?;
    let leaf = chain.first().context("the server certificate file holds no certificate")?;
    let (serial, not_after_unix) = baton_shared::pki::der_facts(leaf).context("reading the server certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).context("parsing the server key")?;
    // `from_der` refuses a key that does not match the certificate.
    let key = CertifiedKey::from_der(chain, key, provider)
        .context("the server key does not load, or does not match the certificate")?;
    Ok(LoadedCert { key: Arc::new(key), files: files.clone(), facts: ServerCertFacts { serial, not_after_unix } })
}

/// Reloads `tls` on every SIGHUP in `hangups` until `shutdown`. (A CLI change reloads it from
/// the wake relay, before open connections re-check their certificates.)
pub async fn reload_on_hangups(
    tls: Arc<ServerTls>,
    mut hangups: tokio::signal::unix::Signal,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            r = hangups.recv() => match r {
                Some(()) => tls.reload("SIGHUP"),
                None => return,
            },
            _ = shutdown.cancelled() => return,
        }
    }
}

/// How often connections refused at a limit are summed up in the log.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// The pause after a failed `accept` (out of file descriptors and the like) instead of spinning.
const ACCEPT_RETRY_PAUSE: Duration = Duration::from_millis(50);

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
}

impl Refusals {
    /// Logs what was refused since the last call, if anything: one line per interval.
    fn log(&self) {
        let total = self.total.swap(0, Ordering::Relaxed);
        let per_cert = self.per_cert.swap(0, Ordering::Relaxed);
        let handshakes = self.handshakes.swap(0, Ordering::Relaxed);
        if total + per_cert > 0 {
            tracing::warn!(
                at_connections_max = total,
                at_connections_per_cert_max = per_cert,
                interval = ?REFUSAL_LOG_INTERVAL,
                "connections refused at their limits (limits.connections_max, limits.connections_per_cert_max)"
            );
        }
        if handshakes > 0 {
            tracing::info!(handshakes, interval = ?REFUSAL_LOG_INTERVAL, "TLS handshakes refused or timed out");
        }
    }
}

/// Open connections per client certificate (keyed by the leaf's DER bytes).
#[derive(Debug, Default)]
struct PerCert {
    open: Mutex<HashMap<Vec<u8>, u32>>,
}

/// One connection's place in `PerCert`; leaving frees it.
struct CertSlot {
    table: Arc<PerCert>,
    key: Vec<u8>,
}

impl PerCert {
    /// Takes a slot for `key`, or `None` when it holds `max` already.
    fn enter(table: &Arc<PerCert>, key: Vec<u8>, max: u32) -> Option<CertSlot> {
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
        shutdown: shutdown.clone(),
    });
    loop {
        let (tcp, remote) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
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
        Ok(Err(e)) => {
            tracing::debug!(%remote, error = %e, "TLS handshake refused");
            a.refusals.handshakes.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("baton_hub_tls_handshake_failures_total").increment(1);
            return;
        }
        Err(_) => {
            tracing::debug!(%remote, "TLS handshake timed out");
            a.refusals.handshakes.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("baton_hub_tls_handshake_failures_total").increment(1);
            return;
        }
    };
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
    builder.http1().timer(TokioTimer::new()).header_read_timeout(a.limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), TowerToHyperService::new(svc));
    tokio::pin!(conn);
    let mut changes = a.revocations.changes.clone();
    // Only changes after this connection began are news to it: its requests are checked anyway.
    changes.borrow_and_update();
    let mut watching = serial.is_some();
    let mut draining = false;
    let mut idle_since = Some(Instant::now());
    loop {
        let idle_deadline = idle_since.map(|t| t + a.limits.idle_timeout);
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

/// Sleeps until `deadline`, or forever when there is none.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_shared::pki::{self, LeafKind};

    fn write_server_cert(dir: &DataDir, ca: &pki::Issued) -> pki::Issued {
        let kind = LeafKind::Server { hostnames: vec!["localhost".into()], lifetime: pki::SERVER_VALIDITY };
        let leaf = pki::issue(&ca.cert_pem, &ca.key_pem, &kind).unwrap();
        std::fs::write(dir.server_cert(), &leaf.cert_pem).unwrap();
        std::fs::write(dir.server_key(), &leaf.key_pem).unwrap();
        leaf
    }

    /// A reload serves new files from the next handshake; files that do not load (garbage, or
    /// a key that is not the certificate's) leave the current certificate served.
    #[test]
    fn a_reload_replaces_the_certificate_and_a_bad_one_keeps_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::new(tmp.path());
        let ca = pki::create_ca("test ca").unwrap();
        let first = write_server_cert(&dir, &ca);
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let cert = ServerCert::load(&dir, provider).unwrap();
        assert_eq!(cert.facts().serial, first.serial);
        assert_eq!(cert.reload(&dir).unwrap(), Reloaded::Unchanged);

        let second = write_server_cert(&dir, &ca);
        let facts = ServerCertFacts { serial: second.serial.clone(), not_after_unix: second.not_after_unix };
        assert_eq!(cert.reload(&dir).unwrap(), Reloaded::Replaced(facts));
        assert_eq!(cert.facts().serial, second.serial);

        std::fs::write(dir.server_cert(), "not a certificate").unwrap();
        assert!(cert.reload(&dir).is_err());
        std::fs::write(dir.server_cert(), &first.cert_pem).unwrap();
        let e = cert.reload(&dir).unwrap_err();
        assert!(format!("{e:#}").contains("does not match"), "{e:#}");
        assert_eq!(cert.facts().serial, second.serial, "the previous certificate is still served");
    }

    /// A certificate gets at most its slots; a slot left is free again, and the table forgets
    /// a certificate with no connection.
    #[test]
    fn per_cert_slots_are_bounded_and_freed() {
        let table = Arc::new(PerCert::default());
        let a1 = PerCert::enter(&table, b"a".to_vec(), 2).unwrap();
        let _a2 = PerCert::enter(&table, b"a".to_vec(), 2).unwrap();
        assert!(PerCert::enter(&table, b"a".to_vec(), 2).is_none());
        let b = PerCert::enter(&table, b"b".to_vec(), 2).unwrap();
        drop(a1);
        assert!(PerCert::enter(&table, b"a".to_vec(), 2).is_some());
        drop(b);
        assert!(!table.open.lock().unwrap().contains_key(b"b".as_slice()));
    }
}
