//! The mTLS HTTP client of the hub: only the hub CA is trusted (no system roots), the caller's
//! certificate and key are presented, plain HTTP is refused. One
//! builder for every Baton client, so how a certificate is loaded and what a bad file says are
//! decided here once.

use crate::limits::CONNECT_TIMEOUT;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The three files a client presents and trusts, as `baton-hub enroll` writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The hub CA certificate (`ca.crt`): the only certificate authority trusted.
    pub ca_file: PathBuf,
    /// This client's certificate (`NAME.crt`).
    pub cert_file: PathBuf,
    /// This client's private key (`NAME.key`).
    pub key_file: PathBuf,
}

/// Why the TLS client could not be built. Every variant names the setting at fault
/// (`ca_file`, `cert_file`, `key_file`), so a message can point at the line to fix.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{key}: cannot read {}: {source}", path.display())]
    Unreadable {
        /// The setting naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file was read but does not hold what it should.
    #[error("{key}: {detail}")]
    Invalid {
        /// The setting naming the file.
        key: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}

impl TlsError {
    /// The setting at fault: `ca_file`, `cert_file` or `key_file`.
    pub fn key(&self) -> &'static str {
        match self {
            TlsError::Unreadable { key, .. } | TlsError::Invalid { key, .. } => key,
        }
    }
}

/// Reads one of the three files, at most `PEM_FILE_BYTES_MAX` of it (a path such as
/// `/dev/zero` is refused after that much, naming the bound).
fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    use baton_shared::limits::PEM_FILE_BYTES_MAX;
    baton_shared::files::read_bounded(path, PEM_FILE_BYTES_MAX, "PEM_FILE_BYTES_MAX")
        .map_err(|source| TlsError::Unreadable { key, path: path.to_path_buf(), source })
}

/// The reqwest client presenting `files`, with `timeout` as its default total request timeout
/// (each call may set its own). Fails, naming the file, when one is unreadable or not PEM.
pub fn http_client(files: &TlsFiles, timeout: Duration) -> Result<reqwest::Client, TlsError> {
    let ca = read("ca_file", &files.ca_file)?;
    let cert = read("cert_file", &files.cert_file)?;
    let key = read("key_file", &files.key_file)?;
    let ca = reqwest::Certificate::from_pem(&ca)
        .map_err(|e| TlsError::Invalid { key: "ca_file", detail: format!("not a PEM certificate: {e}") })?;
    if !String::from_utf8_lossy(&cert).contains("-----BEGIN CERTIFICATE-----") {
        let detail = format!("{} holds no PEM certificate", files.cert_file.display());
        return Err(TlsError::Invalid { key: "cert_file", detail });
    }
    if !String::from_utf8_lossy(&key).contains("PRIVATE KEY-----") {
        let detail = format!("{} holds no PEM private key", files.key_file.display());
        return Err(TlsError::Invalid { key: "key_file", detail });
    }
    let mut identity = cert;
    identity.push(b'\n');
    identity.extend(key);
    let identity = reqwest::Identity::from_pem(&identity).map_err(|e| TlsError::Invalid {
        key: "cert_file",
        detail: format!("cert_file and key_file are not a PEM certificate and its key: {e}"),
    })?;
    reqwest::Client::builder()
        .tls_certs_only([ca])
        .identity(identity)
        .https_only(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(timeout)
        .build()
        .map_err(|e| TlsError::Invalid { key: "cert_file", detail: format!("cannot build the TLS client: {e}") })
}
