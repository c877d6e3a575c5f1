//! The hub's node API (SPEC §12), behind the `Hub` trait so the loop can be tested against an
//! in-memory hub, and `HubClient`, its mTLS implementation over reqwest.
//!
//! `HubClient::reload` re-reads the CA, certificate and key files and builds a new TLS client
//! for the requests that follow (renewal without a restart, on SIGHUP). Each client has a
//! generation; a request refused for good that was sent with an older generation than the
//! current one is reported as a passing failure, so revoking the old serial after a renewal
//! never stops the node.

use crate::config::{ConfigError, NodeConfig};
use crate::limits::{CONNECT_TIMEOUT, REQUEST_TIMEOUT};
use baton_shared::error::ErrorCode;
use baton_shared::wire::{
    BatchHolderRequest, BatchReportRequest, BatchReportResponse, BatchTransitionResponse, ClaimRequest, ClaimResponse,
    ClaimedDelivery, ErrorBody, HolderItem, HolderRequest, HoldingsResponse, ItemResult, RejectRequest, ReportRequest,
    ReportResponse, SESSION_HEADER, SessionEndRequest, SessionRequest, SessionResponse, StartItem, StartRequest,
    StartResponse, StartResult, TransitionResponse,
};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// The error code with which the hub refuses a request of a session older than the host's
/// newest one (another process registered a newer session for this node instance).
pub const SESSION_SUPERSEDED: &str = "session_superseded";
use std::time::Duration;

/// Why a hub call did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HubError {
    /// The hub answered with an error body.
    #[error("hub refused ({status} {code}): {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The stable error code as sent (see `ErrorCode`).
        code: String,
        /// The hub's message.
        message: String,
    },
    /// No answer arrived. `maybe_sent` is true when the request may have reached the hub
    /// (a timeout or a connection lost after sending), so its effect may have happened.
    #[error("hub unreachable: {detail}")]
    Unreachable {
        /// What failed, with a hint when it looks like a certificate problem.
        detail: String,
        /// Whether the hub may have acted on the request.
        maybe_sent: bool,
    },
    /// The hub answered 2xx with a body that is not the documented answer.
    #[error("hub sent an unexpected answer: {0}")]
    BadAnswer(String),
    /// The TLS handshake failed with the hub's alert that our certificate is revoked.
    #[error("the hub refused our client certificate as revoked in the TLS handshake: {0}")]
    CertificateRevoked(String),
    /// A refusal of the certificate a request presented that has been replaced since (SIGHUP):
    /// the next try presents the new one.
    #[error("{0} (sent with the certificate in use before the reload; retrying with the new one)")]
    SentBeforeReload(Box<HubError>),
}

impl HubError {
    /// The stable error code, when the hub sent one we know.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            HubError::Refused { code, .. } => ErrorCode::parse(code),
            _ => None,
        }
    }

    /// Whether the answer to this request is lost: the hub may have acted on it.
    pub fn answer_lost(&self) -> bool {
        match self {
            HubError::Unreachable { maybe_sent, .. } => *maybe_sent,
            HubError::BadAnswer(_) => true,
            HubError::Refused { .. } | HubError::CertificateRevoked(_) | HubError::SentBeforeReload(_) => false,
        }
    }

    /// Whether retrying the same request later may succeed (outages, overload, 5xx).
    pub fn is_transient(&self) -> bool {
        match self {
            HubError::Unreachable { .. }
            | HubError::BadAnswer(_)
            | HubError::CertificateRevoked(_)
            | HubError::SentBeforeReload(_) => true,
            // 401: an expired or unknown certificate may be renewed by the operator (a revoked one
            // is `refused_for_good`, which callers check first).
            HubError::Refused { status, .. } => *status >= 500 || *status == 429 || *status == 401,
        }
    }

    /// The hub's message when it refused the request because a newer session of this node
    /// instance replaced ours (409 `session_superseded`): this process must stop at once.
    pub fn superseded(&self) -> Option<String> {
        match self {
            HubError::Refused { status: 409, code, message } if code == SESSION_SUPERSEDED => Some(message.clone()),
            _ => None,
        }
    }

    /// Whether the hub does not know the route at all (404 or 405 to the whole request): a hub
    /// older than the route, which the node then works without.
    pub fn route_unknown(&self) -> bool {
        matches!(self, HubError::Refused { status: 404 | 405, .. })
    }

    /// Why the hub will never take this node's requests again, when this error says so: the
    /// hub revoked our certificate (401 `certificate_revoked`, or its TLS alert naming the
    /// revocation). Running on cannot help; the node stops (`agent::Finished`).
    ///
    /// A retired host (403 `host_retired` to a claim) is refused for good too.
    pub fn refused_for_good(&self) -> Option<String> {
        match self {
            HubError::Refused { status: 403, code, message }
                if ErrorCode::parse(code) == Some(ErrorCode::HostRetired) =>
            {
                Some(format!("the hub retired this node's host (403 {code}: {message})"))
            }
            HubError::Refused { status: 401, code, message }
                if ErrorCode::parse(code) == Some(ErrorCode::CertificateRevoked) =>
            {
                Some(format!("the hub revoked this node's certificate (401 {code}: {message})"))
            }
            HubError::CertificateRevoked(detail) => {
                Some(format!("the hub revoked this node's certificate (TLS handshake refused: {detail})"))
            }
            _ => None,
        }
    }
}

/// The hub calls the node makes. Every call is safe to repeat (SPEC §12). Once
/// `register_session` succeeded, every request carries the session (`SESSION_HEADER`).
pub trait Hub: Send + Sync + 'static {
    /// `POST /v1/sessions`: registers a fresh session for this process; later requests carry it.
    fn register_session(&self) -> impl Future<Output = Result<SessionResponse, HubError>> + Send;
    /// `POST /v1/sessions/end`: ends the registered session cleanly (at shutdown).
    fn end_session(&self) -> impl Future<Output = Result<(), HubError>> + Send;
    /// `POST /v1/claims`: long-polls for up to `max` deliveries (and the pending cancels).
    fn claim(&self, max: u32, wait: Duration) -> impl Future<Output = Result<ClaimResponse, HubError>> + Send;
    /// `POST /v1/starts`: asks to start these turns; one result per item.
    fn starts(&self, items: Vec<StartItem>) -> impl Future<Output = Result<Vec<StartResult>, HubError>> + Send;
    /// `GET /v1/holdings`: everything this instance holds.
    fn holdings(&self) -> impl Future<Output = Result<Vec<ClaimedDelivery>, HubError>> + Send;
    /// `POST /v1/deliveries/{id}/mirrored`.
    fn mirrored(
        &self,
        delivery_id: &str,
        claim_token: &str,
    ) -> impl Future<Output = Result<TransitionResponse, HubError>> + Send;
    /// `POST /v1/deliveries/{id}/ack`.
    fn ack(
        &self,
        delivery_id: &str,
        claim_token: &str,
    ) -> impl Future<Output = Result<TransitionResponse, HubError>> + Send;
    /// `POST /v1/deliveries/{id}/reject`.
    fn reject(
        &self,
        delivery_id: &str,
        claim_token: &str,
        reason: &str,
    ) -> impl Future<Output = Result<TransitionResponse, HubError>> + Send;
    /// `POST /delivery-report`.
    fn report(&self, body: &ReportRequest) -> impl Future<Output = Result<ReportResponse, HubError>> + Send;
    /// `POST /v1/batch/mirrored`: `mirrored` for many deliveries (at most
    /// `limits::BATCH_ITEMS_MAX`); one result per item, in order. A hub that predates batches
    /// answers 404 (`HubError::route_unknown`).
    fn mirrored_batch(
        &self,
        items: Vec<HolderItem>,
    ) -> impl Future<Output = Result<Vec<ItemResult<TransitionResponse>>, HubError>> + Send;
    /// `POST /v1/batch/ack`: `ack` for many deliveries, as `mirrored_batch`.
    fn ack_batch(
        &self,
        items: Vec<HolderItem>,
    ) -> impl Future<Output = Result<Vec<ItemResult<TransitionResponse>>, HubError>> + Send;
    /// `POST /v1/batch/reports`: many attempt reports (at most `limits::BATCH_ITEMS_MAX`, and
    /// `limits::BATCH_BYTES_MAX` bytes); one result per report, in order.
    fn report_batch(
        &self,
        reports: Vec<ReportRequest>,
    ) -> impl Future<Output = Result<Vec<ItemResult<ReportResponse>>, HubError>> + Send;
}

/// One item of a batch answer as the single endpoint's answer would have been: its body, or
/// `HubError::Refused` with its status and error.
pub fn item_answer<T>(item: ItemResult<T>) -> Result<T, HubError> {
    let status = item.status;
    item.into_result().map_err(|e| HubError::Refused { status, code: e.code, message: e.message })
}

/// Checks that a batch answer has one result per item sent.
fn one_per_item<T>(route: &str, sent: usize, results: Vec<T>) -> Result<Vec<T>, HubError> {
    if results.len() != sent {
        return Err(HubError::BadAnswer(format!("{route}: {} results for {sent} items", results.len())));
    }
    Ok(results)
}

/// The real hub, over HTTPS with this host's client certificate. Clones share one client, so a
/// `reload` through any clone takes effect for all.
#[derive(Clone)]
pub struct HubClient {
    inner: Arc<Inner>,
}

struct Inner {
    base: String,
    instance_id: String,
    claim_timeout: Duration,
    /// `ca_file`, `cert_file`, `key_file`, read again by `reload`.
    files: [(&'static str, PathBuf); 3],
    /// The TLS client for new requests and its generation (1 at start, +1 per reload).
    current: RwLock<(u64, reqwest::Client)>,
    /// The registered session (0 before `register_session`), sent in `SESSION_HEADER`.
    session: AtomicU64,
}

impl HubClient {
    /// Builds the mTLS client: only the hub CA is trusted, this host's certificate is
    /// presented, plain HTTP is refused.
    pub fn new(config: &NodeConfig, instance_id: String) -> Result<HubClient, ConfigError> {
        let claim_timeout = config.claim_wait + baton_shared::limits::CLIENT_TIMEOUT_MARGIN;
        let files = [
            ("ca_file", config.ca_file.clone()),
            ("cert_file", config.cert_file.clone()),
            ("key_file", config.key_file.clone()),
        ];
        let http = build_client(&files, claim_timeout)?;
        let inner = Inner {
            base: config.hub_url.clone(),
            instance_id,
            claim_timeout,
            files,
            current: RwLock::new((1, http)),
            session: AtomicU64::new(0),
        };
        Ok(HubClient { inner: Arc::new(inner) })
    }

    /// Reads the CA, certificate and key files again and uses a new TLS client, presenting
    /// what they hold now, for every request that starts after this returns. On failure the
    /// current client stays. Returns the new generation.
    pub fn reload(&self) -> Result<u64, ConfigError> {
        let http = build_client(&self.inner.files, self.inner.claim_timeout)?;
        let mut current =
            self.inner.current.write().map_err(|_| ConfigError::invalid("cert_file", "client lock poisoned"))?;
        current.0 += 1;
        current.1 = http;
        Ok(current.0)
    }

    /// The client for a new request, with its generation.
    fn client(&self) -> (u64, reqwest::Client) {
        match self.inner.current.read() {
            Ok(c) => c.clone(),
            // Only a panic inside `reload`'s two assignments poisons it; the pair is still whole.
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn generation(&self) -> u64 {
        self.client().0
    }

    fn holder(&self, claim_token: &str) -> HolderRequest {
        HolderRequest { instance_id: self.inner.instance_id.clone(), claim_token: claim_token.to_string() }
    }

    /// Sends the request `build` makes with the current client. A refusal for good of a
    /// request sent before a reload is a passing failure: the next try presents the new
    /// certificate.
    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        route: &'static str,
        items: usize,
        build: impl FnOnce(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<T, HubError> {
        // One line per request, by route (what `BATON_LOG=baton_node::requests=debug` counts).
        tracing::debug!(target: "baton_node::requests", route, items, "hub request");
        let (generation, http) = self.client();
        let mut req = build(&http);
        let session = self.inner.session.load(Ordering::SeqCst);
        if session > 0 {
            req = req.header(SESSION_HEADER, session.to_string());
        }
        let result = self.send_with(req).await;
        match result {
            Err(e) if e.refused_for_good().is_some() && self.generation() != generation => {
                Err(HubError::SentBeforeReload(Box::new(e)))
            }
            other => other,
        }
    }

    async fn send_with<T: serde::de::DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> Result<T, HubError> {
        let resp = req.send().await.map_err(transport_error)?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(transport_error)?;
        if status.is_success() {
            // An empty answer (204) reads as `null`: only a caller that expects nothing accepts it.
            let body: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
            return serde_json::from_slice(body).map_err(|e| HubError::BadAnswer(format!("{status}: {e}")));
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(b) => Err(HubError::Refused { status: status.as_u16(), code: b.code, message: b.message }),
            Err(_) => Err(HubError::Refused {
                status: status.as_u16(),
                code: String::new(),
                message: String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned(),
            }),
        }
    }

    async fn transition(
        &self,
        delivery_id: &str,
        what: &'static str,
        body: impl serde::Serialize,
    ) -> Result<TransitionResponse, HubError> {
        let url = format!("{}/v1/deliveries/{}/{what}", self.inner.base, path_segment(delivery_id));
        self.send(what, 1, |http| http.post(url).timeout(REQUEST_TIMEOUT).json(&body)).await
    }
}

impl HubClient {
    /// `POST /v1/{route}` for a batch of holder steps (`batch/mirrored`, `batch/ack`).
    async fn holder_batch(
        &self,
        route: &'static str,
        deliveries: Vec<HolderItem>,
    ) -> Result<Vec<ItemResult<TransitionResponse>>, HubError> {
        let n = deliveries.len();
        let body = BatchHolderRequest { instance_id: self.inner.instance_id.clone(), deliveries };
        let url = format!("{}/v1/{route}", self.inner.base);
        let r: BatchTransitionResponse =
            self.send(route, n, |http| http.post(url).timeout(REQUEST_TIMEOUT).json(&body)).await?;
        one_per_item(route, n, r.results)
    }
}

/// The mTLS client from the files: only the CA in `ca_file` is trusted, the certificate and key
/// are presented, plain HTTP is refused. Every message names the file's key.
fn build_client(files: &[(&'static str, PathBuf); 3], claim_timeout: Duration) -> Result<reqwest::Client, ConfigError> {
    let read = |(field, path): &(&'static str, PathBuf)| {
        std::fs::read(path).map_err(|e| ConfigError::invalid(field, format!("cannot read {}: {e}", path.display())))
    };
    let [ca, cert, key] = files;
    let ca = read(ca)?;
    let mut identity = read(cert)?;
    identity.push(b'\n');
    identity.extend(read(key)?);
    let ca = reqwest::Certificate::from_pem(&ca)
        .map_err(|e| ConfigError::invalid("ca_file", format!("not a PEM certificate: {e}")))?;
    let identity = reqwest::Identity::from_pem(&identity).map_err(|e| {
        ConfigError::invalid("cert_file", format!("cert_file and key_file are not a PEM certificate and key: {e}"))
    })?;
    reqwest::Client::builder()
        .tls_certs_only([ca])
        .identity(identity)
        .https_only(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(claim_timeout.max(REQUEST_TIMEOUT))
        .build()
        .map_err(|e| ConfigError::invalid("hub_url", format!("cannot build the TLS client: {e}")))
}

impl Hub for HubClient {
    async fn register_session(&self) -> Result<SessionResponse, HubError> {
        let body = SessionRequest {
            instance_id: self.inner.instance_id.clone(),
            node_version: Some(env!("CARGO_PKG_VERSION").to_string()),
        };
        let url = format!("{}/v1/sessions", self.inner.base);
        let r: SessionResponse =
            self.send("sessions", 0, |http| http.post(url).timeout(REQUEST_TIMEOUT).json(&body)).await?;
        self.inner.session.store(r.session, Ordering::SeqCst);
        Ok(r)
    }

    async fn end_session(&self) -> Result<(), HubError> {
        let session = self.inner.session.load(Ordering::SeqCst);
        if session == 0 {
            return Ok(());
        }
        let body = SessionEndRequest { instance_id: self.inner.instance_id.clone(), session };
        let url = format!("{}/v1/sessions/end", self.inner.base);
        let _: serde_json::Value =
            self.send("sessions/end", 0, |http| http.post(url).timeout(REQUEST_TIMEOUT).json(&body)).await?;
        Ok(())
    }

    async fn starts(&self, items: Vec<StartItem>) -> Result<Vec<StartResult>, HubError> {
        let n = items.len();
        let body = StartRequest { instance_id: self.inner.instance_id.clone(), starts: items };
        let url = format!("{}/v1/starts", self.inner.base);
        let r: StartResponse =
            self.send("starts", n, |http| http.post(url).timeout(REQUEST_TIMEOUT).json(&body)).await?;
        Ok(r.results)
    }

    async fn claim(&self, max: u32, wait: Duration) -> Result<ClaimResponse, HubError> {
        let body = ClaimRequest {
            instance_id: self.inner.instance_id.clone(),
            max: Some(max),
            wait_ms: Some(wait.as_millis() as u64),
        };
        let url = format!("{}/v1/claims", self.inner.base);
        let timeout = self.inner.claim_timeout;
        self.send("claims", 0, |http| http.post(url).timeout(timeout).json(&body)).await
    }

    async fn holdings(&self) -> Result<Vec<ClaimedDelivery>, HubError> {
        let mut url = reqwest::Url::parse(&format!("{}/v1/holdings", self.inner.base))
            .map_err(|e| HubError::BadAnswer(e.to_string()))?;
        url.query_pairs_mut().append_pair("instance_id", &self.inner.instance_id);
        let r: HoldingsResponse = self.send("holdings", 0, |http| http.get(url).timeout(REQUEST_TIMEOUT)).await?;
        Ok(r.deliveries)
    }

    async fn mirrored(&self, delivery_id: &str, claim_token: &str) -> Result<TransitionResponse, HubError> {
        self.transition(delivery_id, "mirrored", self.holder(claim_token)).await
    }

    async fn ack(&self, delivery_id: &str, claim_token: &str) -> Result<TransitionResponse, HubError> {
        self.transition(delivery_id, "ack", self.holder(claim_token)).await
    }

    async fn reject(&self, delivery_id: &str, claim_token: &str, reason: &str) -> Result<TransitionResponse, HubError> {
        let body = RejectRequest {
            instance_id: self.inner.instance_id.clone(),
            claim_token: claim_token.to_string(),
            reason: reason.to_string(),
        };
        self.transition(delivery_id, "reject", body).await
    }

    async fn mirrored_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemResult<TransitionResponse>>, HubError> {
        self.holder_batch("batch/mirrored", items).await
    }

    async fn ack_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemResult<TransitionResponse>>, HubError> {
        self.holder_batch("batch/ack", items).await
    }

    async fn report_batch(&self, reports: Vec<ReportRequest>) -> Result<Vec<ItemResult<ReportResponse>>, HubError> {
        let n = reports.len();
        let body = BatchReportRequest { reports };
        let url = format!("{}/v1/batch/reports", self.inner.base);
        let r: BatchReportResponse =
            self.send("batch/reports", n, |http| http.post(url).timeout(REQUEST_TIMEOUT).json(&body)).await?;
        one_per_item("batch/reports", n, r.results)
    }

    async fn report(&self, body: &ReportRequest) -> Result<ReportResponse, HubError> {
        let url = format!("{}/delivery-report", self.inner.base);
        self.send("report", 1, |http| http.post(url).timeout(REQUEST_TIMEOUT).json(body)).await
    }
}

/// Keeps a hub-assigned id from changing the path: anything outside `[A-Za-z0-9._:-]` is
/// percent-encoded.
fn path_segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Classifies a reqwest failure. A failure to connect means the hub never saw the request;
/// anything later (timeout, connection lost) may have reached it.
fn transport_error(e: reqwest::Error) -> HubError {
    let chain = error_chain(&e);
    // The one TLS refusal that names its reason reliably (under TLS 1.3 the client may instead
    // see only "connection closed"; the hub's log says why then).
    if chain.contains("CertificateRevoked") {
        return HubError::CertificateRevoked(chain);
    }
    let maybe_sent = !e.is_connect() && !e.is_builder();
    let lower = chain.to_ascii_lowercase();
    // Only failures that name the handshake point at our certificate; a hub that simply went
    // away (connection closed or reset, no TLS close_notify) is an outage, not a refusal.
    let tls_hint = ["certificate", "alert", "handshake"].iter().any(|w| lower.contains(w));
    let detail = if tls_hint {
        format!("{chain} (the hub may have refused our client certificate: revoked or expired? the hub's log says why)")
    } else {
        chain
    };
    HubError::Unreachable { detail, maybe_sent }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_stay_one_path_segment() {
        assert_eq!(path_segment("0190-ab_c.d:e"), "0190-ab_c.d:e");
        assert_eq!(path_segment("../x y"), "..%2Fx%20y");
    }

    #[test]
    fn error_classification() {
        let refused = |status: u16, code: &str| HubError::Refused { status, code: code.into(), message: String::new() };
        assert_eq!(refused(409, "stale_claim").code(), Some(ErrorCode::StaleClaim));
        assert!(!refused(409, "stale_claim").is_transient());
        assert!(refused(503, "storage_unavailable").is_transient());
        assert!(!refused(503, "storage_unavailable").answer_lost());
        assert!(HubError::Unreachable { detail: String::new(), maybe_sent: true }.answer_lost());
        assert!(!HubError::Unreachable { detail: String::new(), maybe_sent: false }.answer_lost());
    }

    #[test]
    fn a_newer_session_is_recognised() {
        let superseded = HubError::Refused { status: 409, code: SESSION_SUPERSEDED.into(), message: "m".into() };
        assert_eq!(superseded.superseded().as_deref(), Some("m"));
        assert!(!superseded.is_transient());
        let stale = HubError::Refused { status: 409, code: "stale_claim".into(), message: "m".into() };
        assert_eq!(stale.superseded(), None);
    }

    #[test]
    fn only_a_revoked_certificate_is_refused_for_good() {
        let refused = |status: u16, code: &str| HubError::Refused { status, code: code.into(), message: "m".into() };
        let revoked = refused(401, "certificate_revoked").refused_for_good().unwrap();
        assert!(revoked.contains("revoked this node's certificate"), "{revoked}");
        let tls = HubError::CertificateRevoked("received fatal alert: CertificateRevoked".into());
        assert!(tls.refused_for_good().is_some() && !tls.answer_lost());
        let stale = HubError::SentBeforeReload(Box::new(refused(401, "certificate_revoked")));
        assert!(stale.refused_for_good().is_none() && stale.is_transient() && !stale.answer_lost());
        for passing in [
            refused(401, "unknown_certificate"),
            refused(403, "wrong_role"),
            refused(409, "instance_conflict"),
            refused(409, SESSION_SUPERSEDED),
            refused(503, "storage_unavailable"),
            HubError::Unreachable { detail: "connection closed".into(), maybe_sent: false },
        ] {
            assert_eq!(passing.refused_for_good(), None, "{passing}");
        }
    }
}
