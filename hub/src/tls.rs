//! TLS for the hub: the rustls server config (client certificates required, verified against
//! the hub's CA) and the accept loop that hands each request the verified peer certificate.
//!
//! The accept loop bounds every connection (`ConnLimits`): how many are open at once in total
//! (counted from accept, so handshaking ones count) and per client certificate (counted after
//! the handshake), the handshake, the wait for request headers (hyper's `header_read_timeout`,
//! which on HTTP/1 also bounds the wait for the next request), the time with no request in
//! progress, and the requests one connection carries. A request in progress is bounded by its
//! handler (a long poll by `limits.long_poll_wait_max`), never by these waits. Connections
//! refused at a limit, and failed accepts (out of file descriptors), are counted and logged once
//! per `REFUSAL_LOG_INTERVAL`, not one line each. A refused TLS handshake's reason is logged at
//! warn once per peer address (`RefusedPeers`: bounded, repeated only after
//! `HANDSHAKE_REASON_REPEAT` or with another reason), so an operator sees why a fleet is cut off.
//!
//! The wait for request headers counts from the handshake: a connection that sends no request
//! is closed at `limits.header_read_timeout` (the accept loop's own deadline, as hyper's starts
//! only with the first byte), not at the idle timeout. Request heads are bounded by
//! `HEADER_FIELDS_MAX` fields and `HEADER_BYTES_MAX` bytes; hyper answers one over either with
//! a 431 of its own, which `Answer431` gives the `{code, message}` body every error has.
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
use std::net::IpAddr;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context as TaskContext, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
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
/// How long a peer address's refused-handshake reason is not logged again (the same reason;
/// another reason is logged at once).
pub const HANDSHAKE_REASON_REPEAT: Duration = Duration::from_secs(3600);
/// Most peer addresses whose refused-handshake reason is remembered; refusals from further
/// peers are only counted (in the periodic line) until remembered ones age out.
pub const HANDSHAKE_PEERS_REMEMBERED_MAX: usize = 1024;
/// Most header fields in a request head (hyper's own bound, kept: a larger one costs every
/// request a heap allocation); more are answered 431 `headers_too_large`.
pub const HEADER_FIELDS_MAX: usize = 100;
/// Most bytes of a request head, the request line included (HTTP/1: hyper's read buffer, which
/// a head must fit in whole), or of its header list (HTTP/2, announced in SETTINGS); more are
/// answered 431 `headers_too_large`.
pub const HEADER_BYTES_MAX: usize = 64 * 1024;

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
enum Noted {
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
struct RefusedPeers {
    seen: Mutex<HashMap<(IpAddr, String), std::time::Instant>>,
}

impl RefusedPeers {
    /// Whether `peer`'s refusal for `reason` at `now` is to be logged (and remembers it).
    fn note(&self, peer: IpAddr, reason: &str, now: std::time::Instant) -> Noted {
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
    let io = Answer431 { inner: tls, pending: None };
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

/// The text hyper answers a request head over its bounds with: a 431 head and no body.
const HYPER_431: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\n";

/// A connection's stream that gives hyper's own 431 answer (a head over `HEADER_FIELDS_MAX` or
/// `HEADER_BYTES_MAX`, answered before any service sees the request) the `{code, message}` body
/// every other error has. Everything else passes through unchanged. It reports no vectored
/// writes, so hyper writes each answer's head whole into one buffer, where it is found.
struct Answer431<T> {
    inner: T,
    /// The rewritten answer still to be written, and how much of it has been.
    pending: Option<(Vec<u8>, usize)>,
}

impl<T: AsyncWrite + Unpin> Answer431<T> {
    /// Writes what is pending of a rewritten answer.
    fn drain(&mut self, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        while let Some((bytes, at)) = &mut self.pending {
            if *at == bytes.len() {
                self.pending = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*at..]))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            *at += n;
        }
        Poll::Ready(Ok(()))
    }
}

/// hyper's 431 head with a JSON body: its `content-length` replaced, a `content-type` added.
fn answer_431(head: &[u8]) -> Vec<u8> {
    let body = serde_json::json!({
        "code": baton_shared::error::ErrorCode::HeadersTooLarge.as_str(),
        "message": format!(
            "the request's header fields are over the hub's bound: at most {HEADER_FIELDS_MAX} fields and \
             {HEADER_BYTES_MAX} bytes of request head"
        ),
    })
    .to_string();
    let text = String::from_utf8_lossy(head);
    let mut out = String::new();
    for line in text.split("\r\n").filter(|l| !l.is_empty()) {
        if !line.to_ascii_lowercase().starts_with("content-length:") {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str(&format!("content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len()));
    out.into_bytes()
}

/// Where `needle` first appears in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

impl<T: AsyncRead + Unpin> AsyncRead for Answer431<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Answer431<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        ready!(self.drain(cx))?;
        match find(buf, HYPER_431) {
            // What comes before it (an earlier answer) first.
            Some(at) if at > 0 => Pin::new(&mut self.inner).poll_write(cx, &buf[..at]),
            Some(_) => match find(buf, b"\r\n\r\n") {
                Some(end) => {
                    self.pending = Some((answer_431(&buf[..end + 4]), 0));
                    // Taken: what is not written yet goes out before anything else.
                    if let Poll::Ready(Err(e)) = self.drain(cx) {
                        return Poll::Ready(Err(e));
                    }
                    Poll::Ready(Ok(end + 4))
                }
                None => Pin::new(&mut self.inner).poll_write(cx, buf),
            },
            None => Pin::new(&mut self.inner).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
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

    /// A peer's refusal is logged once per reason and interval, a new reason at once (also when
    /// a peer's reasons alternate); past the remembered bound only counted, until the
    /// remembered ones age out.
    #[test]
    fn refused_handshakes_are_logged_once_per_peer_and_reason() {
        let peers = RefusedPeers::default();
        let t0 = std::time::Instant::now();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(peers.note(a, "UnknownIssuer", t0), Noted::Log);
        assert_eq!(peers.note(a, "UnknownIssuer", t0 + Duration::from_secs(60)), Noted::Repeat);
        assert_eq!(peers.note(a, "Expired", t0 + Duration::from_secs(61)), Noted::Log);
        assert_eq!(peers.note(a, "UnknownIssuer", t0 + Duration::from_secs(62)), Noted::Repeat, "reasons alternate");
        assert_eq!(peers.note(a, "Expired", t0 + HANDSHAKE_REASON_REPEAT + Duration::from_secs(62)), Noted::Log);
        for i in 2..HANDSHAKE_PEERS_REMEMBERED_MAX {
            let ip = IpAddr::from([10, 1, (i / 256) as u8, (i % 256) as u8]);
            assert_eq!(peers.note(ip, "x", t0), Noted::Log);
        }
        let late: IpAddr = "10.9.9.9".parse().unwrap();
        assert_eq!(peers.note(late, "x", t0 + Duration::from_secs(1)), Noted::Full, "the table is bounded");
        assert_eq!(peers.note(late, "x", t0 + HANDSHAKE_REASON_REPEAT + Duration::from_secs(1)), Noted::Log);
        assert!(peers.seen.lock().unwrap().len() <= HANDSHAKE_PEERS_REMEMBERED_MAX);
    }

    /// hyper's bodiless 431 gets the JSON body; earlier bytes in the same write go first,
    /// unchanged; other answers pass through.
    #[tokio::test]
    async fn a_431_answer_gets_its_json_body() {
        use tokio::io::AsyncWriteExt;
        let (client, mut server) = tokio::io::duplex(1 << 16);
        let mut io = Answer431 { inner: client, pending: None };
        let before = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let hyper = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        io.write_all(&[&before[..], &hyper[..]].concat()).await.unwrap();
        io.shutdown().await.unwrap();
        let mut seen = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut server, &mut seen).await.unwrap();
        let (ok, rest) = seen.split_at(before.len());
        assert_eq!(ok.as_bytes(), before);
        let (head, body) = rest.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 ") && head.contains("content-type: application/json"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())) && !head.contains("content-length: 0"),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["code"], "headers_too_large");
        assert!(v["message"].as_str().unwrap().contains("100 fields"), "{v}");
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
