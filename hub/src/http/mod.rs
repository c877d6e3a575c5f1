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
//! The state every handler shares is the hub's runtime (`crate::runtime`), not this module's.

mod batch;
pub mod feed;
pub(crate) mod health;
mod node;
mod producer;
mod replay;
mod trace;

use crate::runtime::{AppState, Shared};
use crate::store::StoreError;
use crate::tls::{PeerCerts, PeerIdentityExt};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use baton_shared::error::ErrorCode;
use baton_shared::ids::Role;
use baton_shared::wire::ErrorBody;
use serde::de::DeserializeOwned;
use std::sync::atomic::Ordering;

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
        .route("/v1/messages/{message_id}/events", get(feed::message_events))
        .route("/v1/conversations/{conversation}", get(producer::get_conversation))
        .route("/v1/conversations/{conversation}/events", get(feed::conversation_events))
        .route("/v1/running", post(feed::running))
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
    ("GET", "/v1/messages/{message_id}/events"),
    ("GET", "/v1/conversations/{conversation}"),
    ("GET", "/v1/conversations/{conversation}/events"),
    ("POST", "/v1/running"),
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
mod tests;
