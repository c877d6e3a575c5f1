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
//!
//! Layout: `config` (the server configuration, its certificate and its reload), `accept` (the
//! accept loop and every bound of a connection), `answer431` (hyper's 431 given our error body).

mod accept;
mod answer431;
mod config;

pub use accept::*;
pub use answer431::{HEADER_BYTES_MAX, HEADER_FIELDS_MAX};
pub use config::*;

use rustls_pki_types::CertificateDer;
use std::sync::Arc;

/// The verified client certificate chain of the connection a request came on (leaf first).
#[derive(Debug, Clone)]
pub struct PeerCerts(pub Arc<Vec<CertificateDer<'static>>>);

/// The identity of the verified leaf certificate of the connection a request came on, parsed
/// once per connection (not per request); `Err` holds why the certificate names no identity.
#[derive(Debug, Clone)]
pub struct PeerIdentityExt(pub Arc<Result<baton_shared::pki::PeerIdentity, String>>);

#[cfg(test)]
mod tests;
