//! TLS for the hub: the rustls server config (client certificates required, verified against
//! the hub's CA) and the accept loop that hands each request the verified peer certificate.
//!
//! Boundary: identity enters the HTTP layer only as `PeerCerts`, inserted here from the
//! verified handshake; handlers never read identity from bodies, headers or URLs.

use crate::datadir::DataDir;
use anyhow::Context;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The verified client certificate chain of the connection a request came on (leaf first).
#[derive(Debug, Clone)]
pub struct PeerCerts(pub Arc<Vec<CertificateDer<'static>>>);

/// Builds the server config from the data directory: our certificate, and a verifier that
/// requires a client certificate issued by our CA.
pub fn server_config(dir: &DataDir) -> anyhow::Result<Arc<ServerConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        CertificateDer::pem_file_iter(dir.ca_cert()).with_context(|| format!("reading {}", dir.ca_cert().display()))?
    {
        roots.add(cert.context("parsing the CA certificate")?).context("adding the CA certificate")?;
    }
    let verifier = WebPkiClientVerifier::builder(Arc::new(roots)).build().context("building the client verifier")?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.server_cert())
        .with_context(|| format!("reading {}", dir.server_cert().display()))?
        .collect::<Result<_, _>>()
        .context("parsing the server certificate")?;
    let key = PrivateKeyDer::from_pem_file(dir.server_key())
        .with_context(|| format!("reading {}", dir.server_key().display()))?;
    let mut config = ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .context("the server certificate and key do not match")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves `app` over TLS on `listener` until `shutdown` is cancelled, then waits up to `grace`
/// for open connections to finish.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    app: Router,
    handshake_timeout: Duration,
    shutdown: CancellationToken,
    grace: Duration,
) {
    let graceful = GracefulShutdown::new();
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let (tcp, remote) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: pause briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let watcher = graceful.watcher();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let tls = tokio::select! {
                r = tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)) => r,
                _ = shutdown.cancelled() => return,
            };
            let tls = match tls {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::info!(%remote, error = %e, "TLS handshake refused");
                    metrics::counter!("baton_hub_tls_handshake_failures_total").increment(1);
                    return;
                }
                Err(_) => {
                    tracing::info!(%remote, "TLS handshake timed out");
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
            let peer = PeerCerts(Arc::new(certs));
            let svc = app.map_request(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(peer.clone());
                req.extensions_mut().insert(axum::extract::ConnectInfo::<SocketAddr>(remote));
                req
            });
            let builder = Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), TowerToHyperService::new(svc));
            if let Err(e) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%remote, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!(?grace, "connections still open after the grace period; closing them");
    }
}
