//! The HTTP API (SPEC §12): the router, the error mapping, and the extractors for identity,
//! JSON bodies and query strings. Every error leaves as `{code, message}` with its status;
//! internals are logged, never sent.
//!
//! Layout: `node` (sessions, claims, holdings, starts, mirrored/ack/reject, reports; every one
//! checks the `baton-session` header), `producer` (accept, read and cancel), `batch` (many
//! submits, holder steps or reports per request, answered per item), `replay` (a producer's
//! listing of its own messages from a cursor), `trace` (the producer's
//! `traceparent` header and the hub's spans of a message), `health` (healthz, readyz, metrics).
//!
//! Why one file over 700 lines: beside the router it holds the hub's runtime state (`Shared`,
//! `Work`, `TurnState`) that `metrics` and the role modules read; that state is to move to a
//! module of its own, which also ends the `metrics` ⇄ `http` import.

mod batch;
pub mod certs;
pub(crate) mod health;
mod node;
mod producer;
mod replay;
mod trace;

use crate::config::Limits;
use crate::store::{Store, StoreError};
use crate::tls::{PeerCerts, PeerIdentityExt, ServerTls};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use baton_shared::clock::SharedClock;
use baton_shared::error::ErrorCode;
use baton_shared::ids::Role;
use baton_shared::wire::ErrorBody;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Everything a handler needs, shared by all requests.
pub struct Shared {
    /// The hub's record: the one door to it.
    pub store: Store,
    /// Wakes waiting claims when work may have become claimable: per host (fan-out, a due
    /// retry) or all of them (a lift, a release, a CLI change).
    pub work: Work,
    /// Bumped when a delivery moved or an attempt landed (producer long-polls).
    pub outcomes: watch::Sender<u64>,
    /// Bounds.
    pub limits: Limits,
    /// Cancelled when the hub shuts down; long-polls return early.
    pub shutdown: CancellationToken,
    /// Set once the store is open and repair is done.
    pub ready: AtomicBool,
    /// The bytes the record took at its last reading (`housekeeping::watch_store_size`); 0
    /// until the first. Past `limits.store_bytes_max`, submissions get 507 `store_full`.
    pub store_bytes: AtomicU64,
    /// The Prometheus recorder's handle, when metrics are on.
    pub metrics: Option<PrometheusHandle>,
    /// Wall-clock time for everything stored (`now_ms` of the store functions).
    pub clock: SharedClock,
    /// What the hub keeps in memory about node sessions and cancel notices.
    pub turns: TurnState,
    /// The certificates' standing, cached until the record changes.
    pub certs: certs::CertCache,
    /// The other hubs serving the same PostgreSQL record, told after each commit what woke
    /// this hub's waiters (`None` on SQLite, which one hub serves alone).
    pub peers: Option<crate::peers::Announcer>,
    /// The TLS configuration the hub serves, for whether the CA that issued a caller's
    /// certificate is still trusted (`ca retire-old` drops one while its certificates'
    /// requests may be in progress); `None` where no TLS is served (socket-free tests), where
    /// nothing is re-checked against it.
    pub tls: Option<Arc<ServerTls>>,
    /// Where the hub's spans go (`otlp_endpoint`); off when none is configured, and then no
    /// span is built.
    pub telemetry: baton_telemetry::Telemetry,
}

/// Wakes waiting claims: each waits on its own host's signal and on the one for all hosts, so a
/// change for one host wakes no other host's claims (no thundering herd).
#[derive(Debug)]
pub struct Work {
    /// Bumped for changes that may concern any host.
    all: watch::Sender<u64>,
    /// One signal per host with a waiting claim (dropped once nothing waits on it).
    hosts: std::sync::Mutex<std::collections::HashMap<String, watch::Sender<u64>>>,
}

impl Default for Work {
    fn default() -> Self {
        Work { all: watch::channel(0).0, hosts: Default::default() }
    }
}

/// What one waiting claim listens to: its host's signal and the one for all hosts.
#[derive(Debug)]
pub struct WorkWatch {
    all: watch::Receiver<u64>,
    host: watch::Receiver<u64>,
}

impl WorkWatch {
    /// Returns when work may have become claimable for the host (or the hub is going away).
    pub async fn changed(&mut self) {
        tokio::select! {
            _ = self.all.changed() => {}
            _ = self.host.changed() => {}
        }
    }
}

impl Work {
    /// Starts listening for `host`: changes after this call are seen by `WorkWatch::changed`.
    pub fn watch(&self, host: &str) -> WorkWatch {
        let mut hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        let host = match hosts.get(host) {
            Some(tx) => tx.subscribe(),
            None => {
                // A new host's signal: forget those nobody waits on any more.
                hosts.retain(|_, tx| tx.receiver_count() > 0);
                let (tx, rx) = watch::channel(0u64);
                hosts.insert(host.to_string(), tx);
                rx
            }
        };
        WorkWatch { all: self.all.subscribe(), host }
    }

    /// Wakes the waiting claims of `host` only.
    pub fn host(&self, host: &str) {
        let hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = hosts.get(host) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wakes every waiting claim.
    pub fn all(&self) {
        self.all.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// In-memory turn-control bookkeeping: when each node session was last heard from (written to
/// `node_sessions.last_contact_at` every `CONTACT_FLUSH_INTERVAL`, so no read opens a write
/// transaction for it), and which cancel notices each instance's claims were already answered
/// with (a waiting claim returns at once only for a new one).
#[derive(Debug, Default)]
pub struct TurnState {
    contacts: std::sync::Mutex<std::collections::HashMap<(String, u64), i64>>,
    announced: std::sync::Mutex<std::collections::HashMap<String, std::collections::HashSet<(String, u32)>>>,
}

/// How often the last contact of node sessions is written to the record.
pub const CONTACT_FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

impl TurnState {
    /// Notes that `host`'s session `session` was heard from at `now_ms`.
    pub fn contact(&self, host: &str, session: Option<u64>, now_ms: i64) {
        let Some(session) = session else { return };
        if let Ok(mut c) = self.contacts.lock() {
            let at = c.entry((host.to_string(), session)).or_insert(now_ms);
            *at = (*at).max(now_ms);
        }
    }

    /// Takes the contacts noted since the last call.
    pub fn take_contacts(&self) -> Vec<(String, u64, i64)> {
        match self.contacts.lock() {
            Ok(mut c) => c.drain().map(|((h, s), at)| (h, s, at)).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Records that `instance`'s claim is answered with `cancels`; returns whether any of them
    /// was not in an earlier answer. Notices no longer pending are forgotten.
    pub fn announce(&self, instance: &str, cancels: &[baton_shared::wire::CancelNotice]) -> bool {
        let Ok(mut all) = self.announced.lock() else { return !cancels.is_empty() };
        let now: std::collections::HashSet<(String, u32)> =
            cancels.iter().map(|c| (c.delivery_id.clone(), c.attempt)).collect();
        let seen = all.entry(instance.to_string()).or_default();
        let fresh = now.iter().any(|k| !seen.contains(k));
        *seen = now;
        if seen.is_empty() {
            all.remove(instance);
        }
        fresh
    }
}

/// The router's state.
pub type AppState = Arc<Shared>;

impl Shared {
    /// Refuses a submission with 507 `store_full` while the record is over
    /// `limits.store_bytes_max` (as last read): new work waits until retention or a purge
    /// frees room, while the claims, reports and reads that drain the work already accepted go
    /// on.
    pub fn check_room(&self) -> Result<(), ApiError> {
        let bytes = self.store_bytes.load(Ordering::Relaxed);
        let max = self.limits.store_bytes_max;
        if bytes > max {
            return Err(ApiError::new(
                ErrorCode::StoreFull,
                format!(
                    "the hub's store holds {bytes} bytes, over limits.store_bytes_max = {max}: submissions are \
                     refused until retention or a purge frees room (claims, reports and reads go on)"
                ),
            ));
        }
        Ok(())
    }

    /// Tells every waiting claim that work may be claimable (a change that may concern any
    /// host: a lift, a release, a CLI change).
    pub fn work_changed(&self) {
        self.work.all();
        self.tell_peers(crate::peers::Notice::all_hosts());
    }
    /// Tells the waiting claims of these hosts (only) that work may be claimable for them.
    pub fn work_for<'a>(&self, hosts: impl IntoIterator<Item = &'a str>) {
        // The notice for other hubs is built only when there are any (never on SQLite).
        let mut notice = self.peers.as_ref().map(|_| crate::peers::Notice::default());
        for host in hosts {
            self.work.host(host);
            if let Some(n) = &mut notice {
                n.merge(crate::peers::Notice::host(host));
            }
        }
        if let Some(n) = notice.filter(|n| !n.is_empty()) {
            self.tell_peers(n);
        }
    }
    /// Applies what another hub on the same record committed, to this hub's waiters only (it is
    /// not told on: each hub tells the others of its own commits).
    pub fn heard(&self, notice: &crate::peers::Notice) {
        if notice.is_all_hosts() {
            self.work.all();
        } else {
            for host in notice.hosts() {
                self.work.host(host);
            }
        }
        if notice.has_outcomes() {
            self.outcomes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
    fn tell_peers(&self, notice: crate::peers::Notice) {
        if let Some(peers) = &self.peers {
            peers.announce(notice);
        }
    }
    /// Tells waiting producer reads that a delivery or attempt changed.
    pub fn outcome_changed(&self) {
        self.outcomes.send_modify(|n| *n = n.wrapping_add(1));
        self.tell_peers(crate::peers::Notice::outcomes());
    }
    /// Whether the hub is ready to serve.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.shutdown.is_cancelled()
    }
}

/// The whole API as an axum router (no sockets: tests can drive it directly).
pub fn app(state: AppState) -> Router {
    let body_max = state.limits.request_body_bytes_max as usize;
    Router::new()
        .route("/v1/messages", post(producer::submit).get(producer::get_messages))
        .route("/v1/messages/{message_id}", get(producer::get_by_id))
        .route("/v1/messages/{message_id}/cancel", post(producer::cancel))
        .route("/v1/messages/{message_id}/approve", post(producer::approve))
        .route("/v1/messages/{message_id}/reject", post(producer::reject))
        .route("/v1/messages/{message_id}/deliveries/{delivery_id}", get(producer::get_delivery))
        .route("/v1/conversations/{conversation}", get(producer::get_conversation))
        .route("/v1/sessions", post(node::open_session))
        .route("/v1/sessions/end", post(node::end_session))
        .route("/v1/claims", post(node::claim))
        .route("/v1/starts", post(node::starts))
        .route("/v1/holdings", get(node::holdings))
        .route("/v1/deliveries/{delivery_id}/mirrored", post(node::mirrored))
        .route("/v1/deliveries/{delivery_id}/ack", post(node::ack))
        .route("/v1/deliveries/{delivery_id}/reject", post(node::reject))
        .route("/delivery-report", post(node::report))
        .route("/v1/batch/messages", post(batch::submit))
        .route("/v1/batch/mirrored", post(batch::mirrored))
        .route("/v1/batch/ack", post(batch::ack))
        .route("/v1/batch/handoff", post(batch::handoff))
        .route("/v1/batch/reject", post(batch::reject))
        .route("/v1/batch/reports", post(batch::reports))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such endpoint") })
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            ApiError::new(ErrorCode::MethodNotAllowed, format!("this endpoint does not take {method}"))
        })
        .layer(axum::middleware::from_fn(errors_in_our_shape))
        .layer(axum::middleware::from_fn_with_state(state.clone(), read_body_in_time))
        .layer(axum::middleware::from_fn_with_state(state.clone(), refuse_large_bodies))
        .layer(axum::extract::DefaultBodyLimit::max(body_max))
        .layer(axum::middleware::from_fn(crate::metrics::count_api_requests))
        .with_state(state)
}

/// Refuses a body whose declared length is over the bound before reading any of it.
async fn refuse_large_bodies(
    axum::extract::State(state): axum::extract::State<AppState>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let max = state.limits.request_body_bytes_max;
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(len) = declared
        && len > max
    {
        return ApiError::new(
            ErrorCode::TooLarge,
            format!("request body is {len} bytes; at most {max} are read (limits.request_body_bytes_max)"),
        )
        .into_response();
    }
    next.run(req).await
}

/// Puts any error answer that is not already `{code, message}` JSON (one of axum's own
/// rejections) into that shape, with a stable code and a message that names nothing internal.
async fn errors_in_our_shape(req: Request, next: axum::middleware::Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (code, message) = match status.as_u16() {
        404 => (ErrorCode::NotFound, "no such endpoint or resource"),
        405 => (ErrorCode::MethodNotAllowed, "this endpoint does not take this method"),
        408 => (ErrorCode::RequestTimeout, "the request took too long to arrive"),
        413 => (ErrorCode::TooLarge, "request body is over limits.request_body_bytes_max"),
        415 => (ErrorCode::InvalidJson, "expected a JSON body with Content-Type: application/json"),
        400..=499 => (ErrorCode::InvalidField, "the request's path or query is not valid"),
        _ => (ErrorCode::Internal, "internal error in the hub (see its log)"),
    };
    tracing::debug!(%status, "an answer was put into the {{code, message}} shape");
    ApiError::new(code, message).into_response()
}

/// Rewrites a deserialisation error so it names no Rust type: serde says "expected struct
/// SubmitRequest" where a client needs "expected a JSON object".
fn without_type_names(text: &str) -> String {
    let mut out = Vec::new();
    let mut words = text.split(' ').peekable();
    while let Some(w) = words.next() {
        match (w, words.peek()) {
            ("struct", Some(name)) if name.starts_with(|c: char| c.is_ascii_uppercase()) => {
                let rest: String = name.chars().skip_while(|c| c.is_alphanumeric() || *c == '_').collect();
                out.push(format!("a JSON object{rest}"));
                words.next();
            }
            ("enum", Some(name)) if name.starts_with(|c: char| c.is_ascii_uppercase()) => {
                let rest: String = name.chars().skip_while(|c| c.is_alphanumeric() || *c == '_').collect();
                out.push(format!("one of the allowed values{rest}"));
                words.next();
            }
            _ => out.push(w.to_string()),
        }
    }
    out.join(" ").replace("into the target type", "")
}

/// Why a request body could not be read whole.
enum BodyError {
    /// It is over the bound.
    TooLarge,
    /// The client broke off or sent something that is not HTTP.
    Broken,
}

/// Reads a body whole, at most `max` bytes.
async fn read_body(mut body: axum::body::Body, max: u64) -> Result<axum::body::Bytes, BodyError> {
    use axum::body::HttpBody;
    let mut buf = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|_| BodyError::Broken)?;
        if let Ok(data) = frame.into_data() {
            if (buf.len() + data.len()) as u64 > max {
                return Err(BodyError::TooLarge);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.into())
}

/// Reads the request body whole within `limits.request_body_timeout` (a client that trickles
/// it gets 408), before the handler runs: a handler's own wait (a long poll) is not counted.
async fn read_body_in_time(
    axum::extract::State(state): axum::extract::State<AppState>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let (max, timeout) = (state.limits.request_body_bytes_max, state.limits.request_body_timeout);
    let bytes = match tokio::time::timeout(timeout, read_body(body, max)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(BodyError::TooLarge)) => {
            return ApiError::new(
                ErrorCode::TooLarge,
                format!("request body is over {max} bytes (limits.request_body_bytes_max)"),
            )
            .into_response();
        }
        Ok(Err(BodyError::Broken)) => {
            return ApiError::new(ErrorCode::InvalidJson, "the request body broke off").into_response();
        }
        Err(_) => {
            metrics::counter!("baton_hub_request_body_timeouts_total").increment(1);
            return ApiError::new(
                ErrorCode::RequestTimeout,
                format!(
                    "the request body took longer than {} to arrive (limits.request_body_timeout)",
                    crate::config::humanize(timeout)
                ),
            )
            .into_response();
        }
    };
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await
}

/// An API error: a stable code (which fixes the status) and a message for humans.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The stable code.
    pub code: ErrorCode,
    /// What went wrong.
    pub message: String,
}

impl ApiError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError { code, message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        metrics::counter!("baton_hub_http_errors_total", "code" => self.code.as_str()).increment(1);
        (status, Json(ErrorBody { code: self.code.as_str().into(), message: self.message })).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Storage(detail) | StoreError::Conflict(detail) => {
                tracing::error!(error = %detail, "storage error");
                ApiError::new(ErrorCode::StorageUnavailable, "the hub's storage is unavailable; retry later")
            }
            StoreError::Internal(detail) => {
                tracing::error!(error = %detail, "internal error");
                ApiError::new(ErrorCode::Internal, "internal error in the hub (see its log)")
            }
            StoreError::Corrupt(detail) => {
                tracing::error!(error = %detail, "a stored value does not parse");
                ApiError::new(ErrorCode::Internal, "the hub's record holds a corrupt value (see its log)")
            }
            other => ApiError::new(other.code(), other.to_string()),
        }
    }
}

impl From<baton_shared::ids::IdError> for ApiError {
    fn from(e: baton_shared::ids::IdError) -> Self {
        ApiError::new(ErrorCode::InvalidField, e.to_string())
    }
}

/// A JSON body whose rejections are API errors naming what is wrong.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        use axum::extract::rejection::JsonRejection;
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(JsonRejection::BytesRejection(r)) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::new(ErrorCode::TooLarge, "request body is over limits.request_body_bytes_max"))
            }
            Err(JsonRejection::MissingJsonContentType(_)) => {
                Err(ApiError::new(ErrorCode::InvalidJson, "expected a JSON body with Content-Type: application/json"))
            }
            // Well-formed JSON with a number its field cannot hold (`max` over 32 bits, a
            // negative `wait_ms`): the message names the field (`max: invalid value: ...`).
            Err(JsonRejection::JsonDataError(r)) if number_out_of_range(&r.body_text()) => {
                Err(ApiError::new(ErrorCode::InvalidField, out_of_range_message(&r.body_text())))
            }
            Err(r) => Err(ApiError::new(ErrorCode::InvalidJson, without_type_names(&r.body_text()))),
        }
    }
}

/// True when a body's data error is a number its field's type cannot hold.
fn number_out_of_range(text: &str) -> bool {
    ["invalid value: integer", "invalid value: floating point", "invalid type: floating point", "number out of range"]
        .iter()
        .any(|m| text.contains(m))
}

/// The data error's message without axum's preamble: `FIELD: invalid value: integer ...`.
fn out_of_range_message(text: &str) -> String {
    let text = without_type_names(text);
    let detail = text.split_once(": ").map_or(text.as_str(), |(_, rest)| rest).trim();
    format!("{detail} (out of range)")
}

/// A query string whose rejections are API errors naming what is wrong.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(ApiQuery(v)),
            Err(r) => Err(ApiError::new(ErrorCode::InvalidField, without_type_names(&r.body_text()))),
        }
    }
}

/// Who is calling, read from the verified client certificate and checked against the record.
#[derive(Debug, Clone)]
pub struct Caller {
    /// node or producer.
    pub role: Role,
    /// The host or producer name.
    pub name: String,
    /// The certificate's serial (lowercase hex), for re-checks inside transactions.
    pub serial: String,
    /// The verified certificate chain (leaf first), for re-checks of its issuing CA.
    peer: Option<PeerCerts>,
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let unknown = |m: String| ApiError::new(ErrorCode::UnknownCertificate, m);
        // Parsed once when the connection was accepted (`tls`), not per request.
        let peer = parts.extensions.get::<PeerIdentityExt>().ok_or_else(|| unknown("no client certificate".into()))?;
        let id = peer.0.as_ref().as_ref().map_err(|e| unknown(e.clone()))?;
        let caller = match state.certs.status(&state.store, &id.serial).await? {
            None => return Err(unknown(format!("certificate {} is not in the hub's record", id.serial))),
            Some(s) if s.revoked => {
                return Err(ApiError::new(
                    ErrorCode::CertificateRevoked,
                    format!("certificate {} was revoked", id.serial),
                ));
            }
            Some(s) if s.role != id.role || s.name != id.name => {
                return Err(unknown(format!("certificate {} does not match the hub's record", id.serial)));
            }
            Some(_) => Caller {
                role: id.role,
                name: id.name.clone(),
                serial: id.serial.clone(),
                peer: parts.extensions.get::<PeerCerts>().cloned(),
            },
        };
        caller.check_issuer(state, "")?;
        Ok(caller)
    }
}

impl Caller {
    /// Re-checks, as the answer is about to leave, that the certificate is still in the record,
    /// not revoked, and issued by a CA the hub still trusts: a request that began before a
    /// revocation or a `ca retire-old` (a long poll) answers 401, never data. The standing
    /// comes from the cache, which a revocation empties before the revoking command returns;
    /// the trusted CAs are the ones the hub reloaded from `ca.crt` at the command's wake-up.
    pub async fn recheck(&self, state: &AppState) -> Result<(), ApiError> {
        self.check_issuer(state, " while the request was in progress")?;
        match state.certs.status(&state.store, &self.serial).await? {
            Some(s) if !s.revoked => Ok(()),
            Some(_) => Err(ApiError::new(
                ErrorCode::CertificateRevoked,
                format!("certificate {} was revoked while the request was in progress", self.serial),
            )),
            None => Err(ApiError::new(
                ErrorCode::UnknownCertificate,
                format!("certificate {} is not in the hub's record", self.serial),
            )),
        }
    }

    /// Refuses (401 `unknown_certificate`) a certificate whose issuing CA is no longer in the
    /// hub's `ca.crt` (`ca retire-old`); `when` ends the message. In memory, no record read:
    /// a waiting claim checks it before every look.
    pub fn check_issuer(&self, state: &AppState, when: &str) -> Result<(), ApiError> {
        let trusted = match (&state.tls, self.peer.as_ref().and_then(|p| p.0.first())) {
            (None, _) => true,
            (Some(tls), Some(leaf)) => tls.trusts(leaf),
            (Some(_), None) => false,
        };
        if trusted {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorCode::UnknownCertificate,
            format!(
                "certificate {} was issued by a CA the hub no longer trusts (retired by `baton-hub ca retire-old`){when}",
                self.serial
            ),
        ))
    }
}

/// A caller holding a node certificate; the name is the host.
pub struct NodeCaller(pub Caller);

impl FromRequestParts<AppState> for NodeCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let c = Caller::from_request_parts(parts, state).await?;
        if c.role != Role::Node {
            return Err(ApiError::new(
                ErrorCode::WrongRole,
                format!("a {} certificate may not use node endpoints", c.role),
            ));
        }
        Ok(NodeCaller(c))
    }
}

/// A caller holding a producer certificate.
pub struct ProducerCaller(pub Caller);

impl FromRequestParts<AppState> for ProducerCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let c = Caller::from_request_parts(parts, state).await?;
        if c.role != Role::Producer {
            return Err(ApiError::new(
                ErrorCode::WrongRole,
                format!("a {} certificate may not use producer endpoints", c.role),
            ));
        }
        Ok(ProducerCaller(c))
    }
}

/// Checks a delivery or message id (in the URL path or a body): ids are hub-made UUIDs, always
/// written in their lowercase hyphenated form (`docs/openapi.json` gives the pattern), so any
/// other spelling of a UUID (braced, simple, `urn:uuid:`, uppercase) is refused like any other
/// malformed id instead of being looked up and not found.
pub fn check_path_id(field: &'static str, id: &str) -> Result<(), ApiError> {
    if uuid::Uuid::parse_str(id).is_ok_and(|u| u.hyphenated().to_string() == id) {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("{field} {:?} is not a valid id", id.chars().take(80).collect::<String>()),
        ))
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;

    /// One case: a store error and the status and code it leaves with.
    fn check(e: StoreError, status: u16, code: &str) {
        let resp = ApiError::from(e.clone()).into_response();
        assert_eq!(resp.status().as_u16(), status, "{e:?}");
        let api = ApiError::from(e);
        assert_eq!(api.code.as_str(), code);
    }

    /// Serde's messages lose the Rust type names they carry.
    #[test]
    fn type_names_are_not_sent() {
        for (given, sent) in [
            (
                "invalid type: string, expected struct SubmitRequest at line 1",
                "invalid type: string, expected a JSON object at line 1",
            ),
            ("expected enum Outcome, found x", "expected one of the allowed values, found x"),
            ("missing field `to`", "missing field `to`"),
        ] {
            assert_eq!(without_type_names(given), sent);
        }
    }

    /// Ids are taken only in the form the hub writes them; another spelling of the same UUID is
    /// refused as malformed (400), not looked up.
    #[test]
    fn ids_are_taken_only_as_the_hub_writes_them() {
        let id = uuid::Uuid::now_v7();
        assert!(check_path_id("delivery_id", &id.hyphenated().to_string()).is_ok());
        for other in [
            id.simple().to_string(),
            id.braced().to_string(),
            id.urn().to_string(),
            id.hyphenated().to_string().to_uppercase(),
            String::new(),
            "not-an-id".into(),
        ] {
            let e = check_path_id("delivery_id", &other).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidField, "{other}");
            assert!(e.message.contains("delivery_id"), "{}", e.message);
        }
    }

    /// Internals are never sent; a bug or a corrupt record is 500 `internal`, which nodes do not
    /// retry forever, and only storage trouble is 503.
    #[test]
    fn store_errors_map_to_stable_codes() {
        check(StoreError::Storage("disk I/O error".into()), 503, "storage_unavailable");
        check(StoreError::Conflict("deadlock detected (40P01)".into()), 503, "storage_unavailable");
        check(StoreError::Invalid("a value the record cannot hold: x".into()), 400, "invalid_field");
        check(StoreError::Internal("index out of bounds".into()), 500, "internal");
        check(StoreError::Corrupt("corrupt record".into()), 500, "internal");
        check(StoreError::StaleClaim("x".into()), 409, "stale_claim");
        let sent = ApiError::from(StoreError::Internal("secret detail".into())).message;
        assert!(!sent.contains("secret detail"), "{sent}");
    }
}

#[cfg(test)]
mod turn_state_tests {
    use super::*;
    use baton_shared::wire::CancelNotice;

    fn notice(id: &str) -> CancelNotice {
        CancelNotice { delivery_id: id.into(), attempt: 1, reason: "r".into() }
    }

    /// A waiting claim returns early only for a notice its instance was not answered with yet;
    /// a notice that stops being pending is forgotten.
    #[test]
    fn only_a_new_cancel_notice_is_fresh() {
        let t = TurnState::default();
        assert!(!t.announce("i", &[]));
        assert!(t.announce("i", &[notice("a")]));
        assert!(!t.announce("i", &[notice("a")]), "already answered with it");
        assert!(t.announce("j", &[notice("a")]), "per instance");
        assert!(t.announce("i", &[notice("a"), notice("b")]));
        assert!(!t.announce("i", &[notice("b")]));
        assert!(t.announce("i", &[notice("a")]), "a gone and back again is new");
        t.contact("host", Some(1), 5);
        t.contact("host", Some(1), 3);
        t.contact("host", None, 9);
        assert_eq!(t.take_contacts(), vec![("host".to_string(), 1, 5)]);
        assert!(t.take_contacts().is_empty());
    }
}

/// Every route of the API as (method, path). `docs/openapi.json` describes exactly these; a
/// test holds the two together and checks that the router serves each one.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/messages"),
    ("GET", "/v1/messages"),
    ("GET", "/v1/messages/{message_id}"),
    ("POST", "/v1/messages/{message_id}/cancel"),
    ("POST", "/v1/messages/{message_id}/approve"),
    ("POST", "/v1/messages/{message_id}/reject"),
    ("GET", "/v1/messages/{message_id}/deliveries/{delivery_id}"),
    ("GET", "/v1/conversations/{conversation}"),
    ("POST", "/v1/sessions"),
    ("POST", "/v1/sessions/end"),
    ("POST", "/v1/claims"),
    ("POST", "/v1/starts"),
    ("GET", "/v1/holdings"),
    ("POST", "/v1/deliveries/{delivery_id}/mirrored"),
    ("POST", "/v1/deliveries/{delivery_id}/ack"),
    ("POST", "/v1/deliveries/{delivery_id}/reject"),
    ("POST", "/delivery-report"),
    ("POST", "/v1/batch/messages"),
    ("POST", "/v1/batch/mirrored"),
    ("POST", "/v1/batch/ack"),
    ("POST", "/v1/batch/handoff"),
    ("POST", "/v1/batch/reject"),
    ("POST", "/v1/batch/reports"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
];

#[cfg(test)]
mod openapi_tests {
    use super::*;
    use baton_shared::states::{DeliveryState, Outcome};
    use baton_shared::wire::*;
    use std::collections::BTreeSet;
    use tower::ServiceExt;

    const OPENAPI: &str = include_str!("../../../docs/openapi.json");

    fn spec() -> serde_json::Value {
        serde_json::from_str(OPENAPI).unwrap()
    }

    #[test]
    fn openapi_lists_exactly_the_routes() {
        let spec = spec();
        let mut documented = BTreeSet::new();
        for (path, ops) in spec["paths"].as_object().unwrap() {
            for method in ops.as_object().unwrap().keys() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
        let served: BTreeSet<(String, String)> = ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
        assert_eq!(documented, served);
    }

    /// The documented properties of each schema are exactly the fields the code sends.
    #[test]
    fn openapi_schemas_match_the_wire_types() {
        let spec = spec();
        let attempt = AttemptView {
            attempt_id: "a".into(),
            report_id: "r".into(),
            outcome: Outcome::Succeeded,
            exit_code: Some(0),
            duration_ms: Some(1),
            result: None,
            reason: None,
            reported_at_ms: 1,
            signal: None,
            attempt: 1,
            retryable: false,
            rerun: None,
            caused_by: Some("producer:p".into()),
            stderr_tail: Some("traceback".into()),
            stderr_dropped_bytes: Some(0),
        };
        let delivery = DeliveryView {
            delivery_id: "d".into(),
            host: "h".into(),
            state: DeliveryState::Delivered,
            reason: None,
            updated_at_ms: 1,
            attempts: vec![attempt.clone()],
            attempt: 1,
            max_attempts: 1,
            not_before_ms: None,
            cancel_requested_at_ms: None,
            cancel_reason: None,
        };
        let claimed = ClaimedDelivery {
            delivery_id: "d".into(),
            message_id: "m".into(),
            conversation: "c".into(),
            seq: 1,
            payload: serde_json::json!({}).into(),
            claim_token: "t".into(),
            state: DeliveryState::Claimed,
            producer: Some("p".into()),
            attempt: 1,
            max_attempts: 1,
            rerun: None,
            cancel_requested: false,
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        };
        let listed = ListedMessage {
            message_id: "m".into(),
            seq: 7,
            idempotency_key: "k".into(),
            payload: serde_json::json!({}).into(),
            accepted_at_ms: 1,
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            deliveries: vec![DeliverySummary {
                delivery_id: "d".into(),
                host: "h".into(),
                state: DeliveryState::Queued,
            }],
        };
        let interval = MembershipInterval { join_seq: 0, joined_at_ms: 1, leave_seq: Some(2), left_at_ms: Some(3) };
        let summary = DeliverySummary { delivery_id: "d".into(), host: "h".into(), state: DeliveryState::Queued };
        let notice = CancelNotice { delivery_id: "d".into(), attempt: 1, reason: "r".into() };
        let item = StartItem { delivery_id: "d".into(), claim_token: "t".into(), attempt: 1 };
        let start = StartResult {
            delivery_id: "d".into(),
            start: false,
            code: Some("cancelled".into()),
            message: Some("m".into()),
            retry_after_ms: Some(5),
        };
        let cancelled = CancelResult {
            delivery_id: "d".into(),
            host: "h".into(),
            effect: "requested".into(),
            state: DeliveryState::Delivered,
        };
        let mut samples: Vec<(&str, serde_json::Value)> = vec![
            (
                "SubmitRequest",
                serde_json::to_value(SubmitRequest {
                    conversation: "c".into(),
                    idempotency_key: "k".into(),
                    payload: serde_json::json!(1).into(),
                    to: Some(vec!["h".into()]),
                    max_attempts: Some(3),
                    retry_backoff_ms: Some(1000),
                    approval: Some("required".into()),
                    approval_timeout_ms: Some(60_000),
                })
                .unwrap(),
            ),
            (
                "SubmitResponse",
                serde_json::to_value(SubmitResponse {
                    message_id: "m".into(),
                    seq: 1,
                    duplicate: false,
                    deliveries: vec![summary.clone()],
                })
                .unwrap(),
            ),
            ("DeliverySummary", serde_json::to_value(&summary).unwrap()),
            ("Attempt", serde_json::to_value(&attempt).unwrap()),
            ("DeliveryView", serde_json::to_value(&delivery).unwrap()),
            (
                "MessageView",
                serde_json::to_value(MessageView {
                    message_id: "m".into(),
                    conversation: "c".into(),
                    seq: 1,
                    producer: "p".into(),
                    idempotency_key: "k".into(),
                    payload: serde_json::json!({}).into(),
                    accepted_at_ms: 1,
                    traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
                    deliveries: vec![delivery.clone()],
                    omitted: Some(ViewOmitted {
                        attempts_of: vec!["d".into()],
                        view_bytes_max: 4096,
                        read_each_at: "/v1/messages/m/deliveries/{delivery_id}".into(),
                    }),
                })
                .unwrap(),
            ),
            (
                "ClaimRequest",
                serde_json::to_value(ClaimRequest { instance_id: "i".into(), max: Some(1), wait_ms: Some(1) }).unwrap(),
            ),
            ("ClaimedDelivery", serde_json::to_value(&claimed).unwrap()),
            (
                "ViewOmitted",
                serde_json::to_value(ViewOmitted {
                    attempts_of: vec!["d".into()],
                    view_bytes_max: 4096,
                    read_each_at: "/v1/messages/m/deliveries/{delivery_id}".into(),
                })
                .unwrap(),
            ),
            (
                "HoldingsResponse",
                serde_json::to_value(HoldingsResponse { deliveries: vec![claimed.clone()], next_cursor: Some(7) })
                    .unwrap(),
            ),
            ("ListedMessage", serde_json::to_value(&listed).unwrap()),
            (
                "MessagePage",
                serde_json::to_value(MessagePage {
                    conversation: "c".into(),
                    messages: vec![listed.clone()],
                    next_cursor: "7.0123456789abcdef".into(),
                    more: false,
                })
                .unwrap(),
            ),
            (
                "ClaimResponse",
                serde_json::to_value(ClaimResponse {
                    deliveries: vec![claimed.clone()],
                    cancels: vec![notice.clone()],
                })
                .unwrap(),
            ),
            (
                "HolderRequest",
                serde_json::to_value(HolderRequest { instance_id: "i".into(), claim_token: "t".into() }).unwrap(),
            ),
            (
                "RejectRequest",
                serde_json::to_value(RejectRequest {
                    instance_id: "i".into(),
                    claim_token: "t".into(),
                    reason: "r".into(),
                })
                .unwrap(),
            ),
            (
                "TransitionResponse",
                serde_json::to_value(TransitionResponse {
                    delivery_id: "d".into(),
                    state: DeliveryState::Mirrored,
                    changed: true,
                })
                .unwrap(),
            ),
            (
                "ReportRequest",
                serde_json::to_value(ReportRequest {
                    delivery_id: "d".into(),
                    instance_id: "i".into(),
                    claim_token: "t".into(),
                    report_id: "r".into(),
                    outcome: Outcome::Failed,
                    exit_code: Some(1),
                    duration_ms: Some(1),
                    result: Some("x".into()),
                    reason: Some("y".into()),
                    attempt: Some(1),
                    signal: Some(15),
                    stderr_tail: Some("z".into()),
                    stderr_dropped_bytes: Some(0),
                })
                .unwrap(),
            ),
            (
                "ReportResponse",
                serde_json::to_value(ReportResponse {
                    attempt,
                    delivery_id: "d".into(),
                    duplicate: false,
                    retry_at_ms: Some(5),
                })
                .unwrap(),
            ),
            (
                "ConversationView",
                serde_json::to_value(ConversationView {
                    conversation: "c".into(),
                    last_seq: 3,
                    open: false,
                    members: vec![MemberView { host: "h".into(), current: true, intervals: vec![interval.clone()] }],
                })
                .unwrap(),
            ),
            (
                "MemberView",
                serde_json::to_value(MemberView { host: "h".into(), current: true, intervals: vec![] }).unwrap(),
            ),
            ("MembershipInterval", serde_json::to_value(&interval).unwrap()),
            ("Error", serde_json::to_value(ErrorBody { code: "c".into(), message: "m".into() }).unwrap()),
            ("CancelNotice", serde_json::to_value(&notice).unwrap()),
            (
                "SessionRequest",
                serde_json::to_value(SessionRequest { instance_id: "i".into(), node_version: Some("1".into()) })
                    .unwrap(),
            ),
            (
                "SessionResponse",
                serde_json::to_value(SessionResponse { session: 2, took_over: Some(1), start_lease_ms: Some(15_000) })
                    .unwrap(),
            ),
            (
                "SessionEndRequest",
                serde_json::to_value(SessionEndRequest { instance_id: "i".into(), session: 1 }).unwrap(),
            ),
            ("StartItem", serde_json::to_value(&item).unwrap()),
            (
                "StartRequest",
                serde_json::to_value(StartRequest { instance_id: "i".into(), starts: vec![item.clone()] }).unwrap(),
            ),
            ("StartResult", serde_json::to_value(&start).unwrap()),
            ("StartResponse", serde_json::to_value(StartResponse { results: vec![start.clone()] }).unwrap()),
            ("CancelRequest", serde_json::to_value(CancelRequest { reason: "r".into() }).unwrap()),
            ("CancelResult", serde_json::to_value(&cancelled).unwrap()),
            (
                "CancelResponse",
                serde_json::to_value(CancelResponse { message_id: "m".into(), deliveries: vec![cancelled.clone()] })
                    .unwrap(),
            ),
        ];
        // Batches: an item result's sample carries both of its alternatives, `ok` and `error`.
        let either = |ok: serde_json::Value| {
            let mut v = ok;
            v["error"] = serde_json::to_value(ErrorBody { code: "c".into(), message: "m".into() }).unwrap();
            v
        };
        let submitted = SubmitResponse { message_id: "m".into(), seq: 1, duplicate: false, deliveries: vec![summary] };
        let submit_item = ItemResult { status: 201, outcome: ItemOutcome::Ok(submitted) };
        let moved = TransitionResponse { delivery_id: "d".into(), state: DeliveryState::Mirrored, changed: true };
        let moved_item = ItemResult { status: 200, outcome: ItemOutcome::Ok(moved) };
        let holder = HolderItem { delivery_id: "d".into(), claim_token: "t".into() };
        let rejected = RejectItem { delivery_id: "d".into(), claim_token: "t".into(), reason: "r".into() };
        let sample = |name: &str| samples.iter().find(|(n, _)| *n == name).unwrap().1.clone();
        let report: ReportRequest = serde_json::from_value(sample("ReportRequest")).unwrap();
        let reported: ReportResponse = serde_json::from_value(sample("ReportResponse")).unwrap();
        let submit: SubmitRequest = serde_json::from_value(sample("SubmitRequest")).unwrap();
        let report_item = ItemResult { status: 201, outcome: ItemOutcome::Ok(reported) };
        let decided = ApprovalResponse {
            message_id: "m".into(),
            decision: "approved".into(),
            deliveries: vec![DeliverySummary {
                delivery_id: "d".into(),
                host: "h".into(),
                state: DeliveryState::Queued,
            }],
        };
        samples.extend([
            ("ApprovalRequest", serde_json::to_value(ApprovalRequest { reason: "r".into() }).unwrap()),
            ("ApprovalResponse", serde_json::to_value(&decided).unwrap()),
            ("BatchSubmitRequest", serde_json::to_value(BatchSubmitRequest { messages: vec![submit] }).unwrap()),
            ("SubmitItemResult", either(serde_json::to_value(&submit_item).unwrap())),
            ("BatchSubmitResponse", serde_json::to_value(BatchSubmitResponse { results: vec![submit_item] }).unwrap()),
            ("HolderItem", serde_json::to_value(&holder).unwrap()),
            (
                "BatchHolderRequest",
                serde_json::to_value(BatchHolderRequest { instance_id: "i".into(), deliveries: vec![holder] }).unwrap(),
            ),
            ("RejectItem", serde_json::to_value(&rejected).unwrap()),
            (
                "BatchRejectRequest",
                serde_json::to_value(BatchRejectRequest { instance_id: "i".into(), deliveries: vec![rejected] })
                    .unwrap(),
            ),
            ("TransitionItemResult", either(serde_json::to_value(&moved_item).unwrap())),
            (
                "BatchTransitionResponse",
                serde_json::to_value(BatchTransitionResponse { results: vec![moved_item] }).unwrap(),
            ),
            ("BatchReportRequest", serde_json::to_value(BatchReportRequest { reports: vec![report] }).unwrap()),
            ("ReportItemResult", either(serde_json::to_value(&report_item).unwrap())),
            ("BatchReportResponse", serde_json::to_value(BatchReportResponse { results: vec![report_item] }).unwrap()),
        ]);
        let schemas = spec["components"]["schemas"].as_object().unwrap();
        assert_eq!(schemas.len(), samples.len(), "every documented schema has a sample here");
        for (name, value) in samples {
            let documented: BTreeSet<&String> = schemas[name]["properties"].as_object().unwrap().keys().collect();
            let sent: BTreeSet<&String> = value.as_object().unwrap().keys().collect();
            assert_eq!(documented, sent, "schema {name}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_router_serves_every_documented_route() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.db");
        let clock = baton_shared::clock::system();
        let conn = crate::store::open_write(&path, baton_shared::sqlite::Synchronous::Normal).unwrap();
        let store = Store::sqlite(conn, &path, baton_shared::sqlite::CHECKPOINT_INTERVAL, clock.clone()).unwrap();
        let state = Arc::new(Shared {
            store,
            work: Work::default(),
            outcomes: watch::channel(0).0,
            limits: Limits::default(),
            shutdown: CancellationToken::new(),
            ready: AtomicBool::new(true),
            store_bytes: AtomicU64::new(0),
            metrics: None,
            clock,
            turns: TurnState::default(),
            certs: certs::CertCache::new(watch::channel(0).1),
            peers: None,
            tls: None,
            telemetry: baton_telemetry::Telemetry::off(),
        });
        let app = app(state);
        for (method, path) in ROUTES {
            let uri = path
                .replace("{message_id}", &uuid::Uuid::now_v7().to_string())
                .replace("{delivery_id}", &uuid::Uuid::now_v7().to_string())
                .replace("{conversation}", "some-conversation");
            let req = axum::http::Request::builder().method(*method).uri(&uri).body(axum::body::Body::empty()).unwrap();
            let resp = app.clone().oneshot(req).await.unwrap();
            let status = resp.status();
            let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap();
            let text = String::from_utf8_lossy(&body);
            assert!(!text.contains("no such endpoint"), "{method} {path} is not routed");
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            // Without a verified certificate, every identity-checked route refuses with 401.
            if !matches!(*path, "/healthz" | "/readyz") {
                assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}: {text}");
                let e: ErrorBody = serde_json::from_slice(&body).unwrap();
                assert_eq!(e.code, "unknown_certificate");
            }
        }
    }
}
