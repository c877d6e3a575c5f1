//! TLS to the database: the `sslmode` and `sslrootcert` of a `postgres://` URL, read the way
//! libpq reads them, turned into a rustls client configuration on the workspace's aws-lc-rs
//! provider.
//!
//! | `sslmode`     | TLS                   | server certificate checked                        |
//! |---------------|-----------------------|---------------------------------------------------|
//! | `disable`     | never                 | -                                                 |
//! | `prefer`      | when the server has it| no (as libpq); the default, as in libpq           |
//! | `require`     | always                | against `sslrootcert` when given (as libpq), else no |
//! | `verify-ca`   | always                | chain to `sslrootcert`                            |
//! | `verify-full` | always                | chain to `sslrootcert`, and the host's name or IP |
//!
//! `verify-ca` and `verify-full` need `sslrootcert=FILE` (a PEM file of CA certificates):
//! there is no implicit system trust store, so a URL never trusts more than it says.

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::PgError;

/// How the connection uses TLS, as the URL's `sslmode` (and `sslrootcert`) say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SslMode {
    /// `disable`: plain TCP.
    Disable,
    /// `prefer` (the default): TLS when the server offers it, its certificate not checked.
    Prefer,
    /// `require`: TLS or nothing; the certificate is checked against the file when one is given.
    Require {
        /// `sslrootcert`, when given.
        root: Option<PathBuf>,
    },
    /// `verify-ca`: TLS, and the certificate chains to a CA in the file.
    VerifyCa {
        /// `sslrootcert`.
        root: PathBuf,
    },
    /// `verify-full`: as `verify-ca`, and the certificate names the host the URL connects to.
    VerifyFull {
        /// `sslrootcert`.
        root: PathBuf,
    },
}

impl SslMode {
    /// The mode from the URL's `sslmode` and `sslrootcert` values (`None` when absent).
    pub fn from_params(mode: Option<&str>, root: Option<&str>) -> Result<SslMode, PgError> {
        let root = root.map(PathBuf::from);
        let needs_root = |name: &str, root: Option<PathBuf>| {
            root.ok_or_else(|| PgError::Url {
                detail: format!(
                    "sslmode={name} needs sslrootcert=FILE, the PEM file of the CA that signed the server's certificate"
                ),
            })
        };
        match mode.unwrap_or("prefer") {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require { root }),
            "verify-ca" => Ok(SslMode::VerifyCa { root: needs_root("verify-ca", root)? }),
            "verify-full" => Ok(SslMode::VerifyFull { root: needs_root("verify-full", root)? }),
            other => Err(PgError::Url {
                detail: format!(
                    "sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full \
                     (allow is not supported)"
                ),
            }),
        }
    }

    /// What tokio-postgres negotiates: never, when offered, or always.
    pub fn negotiation(&self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as N;
        match self {
            SslMode::Disable => N::Disable,
            SslMode::Prefer => N::Prefer,
            SslMode::Require { .. } | SslMode::VerifyCa { .. } | SslMode::VerifyFull { .. } => N::Require,
        }
    }

    /// The rustls configuration for this mode (unused by `Disable`, built all the same so the
    /// connection code has one shape).
    pub fn client_config(&self) -> Result<ClientConfig, PgError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| PgError::Tls { detail: format!("the TLS library refused its defaults: {e}") })?;
        let verifier: Arc<dyn ServerCertVerifier> = match self {
            SslMode::Disable | SslMode::Prefer | SslMode::Require { root: None } => {
                Arc::new(Unchecked { provider: provider.clone() })
            }
            SslMode::Require { root: Some(root) } | SslMode::VerifyCa { root } => {
                Arc::new(ChainOnly { inner: webpki(root, &provider)? })
            }
            SslMode::VerifyFull { root } => webpki(root, &provider)?,
        };
        Ok(builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth())
    }
}

/// The standard verifier over the CA certificates in `root`.
fn webpki(root: &Path, provider: &Arc<CryptoProvider>) -> Result<Arc<WebPkiServerVerifier>, PgError> {
    let shown = root.display();
    use baton_shared::limits::PEM_FILE_BYTES_MAX;
    let pem = baton_shared::files::read_bounded(root, PEM_FILE_BYTES_MAX, "PEM_FILE_BYTES_MAX")
        .map_err(|e| PgError::Tls { detail: format!("cannot read sslrootcert {shown}: {e}") })?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| PgError::Tls { detail: format!("sslrootcert {shown} is not PEM: {e}") })?;
        roots
            .add(cert)
            .map_err(|e| PgError::Tls { detail: format!("sslrootcert {shown} holds an unusable certificate: {e}") })?;
    }
    if roots.is_empty() {
        return Err(PgError::Tls { detail: format!("sslrootcert {shown} holds no certificate") });
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| PgError::Tls { detail: format!("sslrootcert {shown}: {e}") })
}

/// `verify-ca`: the chain must verify, the name is not compared (libpq's meaning).
#[derive(Debug)]
struct ChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName | rustls::CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// `prefer` and `require` without a CA file: encrypted, the certificate not checked (libpq's
/// meaning). The handshake's signatures are still verified, so the session is with the holder
/// of the presented certificate's key.
#[derive(Debug)]
struct Unchecked {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_like_libpq() {
        assert_eq!(SslMode::from_params(None, None).unwrap(), SslMode::Prefer);
        assert_eq!(SslMode::from_params(Some("disable"), None).unwrap(), SslMode::Disable);
        assert_eq!(SslMode::from_params(Some("require"), None).unwrap(), SslMode::Require { root: None });
        assert_eq!(
            SslMode::from_params(Some("verify-full"), Some("/ca.pem")).unwrap(),
            SslMode::VerifyFull { root: "/ca.pem".into() }
        );
        let e = SslMode::from_params(Some("verify-full"), None).unwrap_err().to_string();
        assert!(e.contains("needs sslrootcert"), "{e}");
        let e = SslMode::from_params(Some("allow"), None).unwrap_err().to_string();
        assert!(e.contains("not one of"), "{e}");
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        let e = SslMode::VerifyFull { root: missing.clone() }.client_config().unwrap_err().to_string();
        assert!(e.contains("cannot read sslrootcert") && e.contains("nope.pem"), "{e}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let e = SslMode::VerifyCa { root: empty }.client_config().unwrap_err().to_string();
        assert!(e.contains("holds no certificate"), "{e}");
    }
}
