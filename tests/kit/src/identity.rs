//! Enrolled identities on disk and the mTLS clients that present them.
//!
//! The hub serves TLS only and requires a client certificate chaining to its own CA, so every
//! client a suite builds trusts exactly that CA (no system roots) and speaks `https` only.

use anyhow::Context;
use std::path::PathBuf;

pub use baton_shared::ids::Role;

/// A certificate and key that `baton-hub enroll` wrote, with the hub CA they chain to: what a
/// node or a producer is handed.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Node or producer.
    pub role: Role,
    /// The host or producer name (the certificate's identity).
    pub name: String,
    /// `NAME.crt`.
    pub cert: PathBuf,
    /// `NAME.key`.
    pub key: PathBuf,
    /// `ca.crt`, the hub CA; the hub's server certificate chains to it too.
    pub ca: PathBuf,
}

impl Identity {
    /// The certificate and key as one PEM, as reqwest wants them.
    pub fn pem(&self) -> anyhow::Result<Vec<u8>> {
        let read = |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        let mut pem = read(&self.cert)?;
        pem.push(b'\n');
        pem.extend(read(&self.key)?);
        Ok(pem)
    }

    /// The hub CA certificate (PEM).
    pub fn ca_pem(&self) -> anyhow::Result<Vec<u8>> {
        std::fs::read(&self.ca).with_context(|| format!("reading {}", self.ca.display()))
    }

    /// A client builder presenting this identity and trusting only the hub CA; the caller
    /// adds its timeouts and pool settings.
    pub fn client_builder(&self) -> anyhow::Result<reqwest::ClientBuilder> {
        client_builder(&self.ca_pem()?, Some(&self.pem()?))
    }
}

/// A client builder for the hub: `https` only, trusting only `ca_pem`, presenting
/// `identity_pem` (certificate and key) when given, and dialing directly (a proxy named in the
/// environment of the test process never stands between a suite and its own hub).
pub fn client_builder(ca_pem: &[u8], identity_pem: Option<&[u8]>) -> anyhow::Result<reqwest::ClientBuilder> {
    let ca = reqwest::Certificate::from_pem(ca_pem).context("the CA is not a PEM certificate")?;
    let mut b = reqwest::Client::builder().https_only(true).tls_certs_only([ca]).no_proxy();
    if let Some(pem) = identity_pem {
        b = b.identity(reqwest::Identity::from_pem(pem).context("the identity is not a PEM certificate and key")?);
    }
    Ok(b)
}
