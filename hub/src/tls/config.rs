//! The hub's server TLS configuration: client certificates required and verified against every
//! CA in `ca.crt`, the server certificate resolved per handshake, and their reload.

use crate::datadir::DataDir;
use anyhow::Context;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::{Arc, RwLock};
use tokio_util::sync::CancellationToken;

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
