//! What a call can end with besides its answer: the hub refused it (`ClientError::Api`, typed by
//! the API's stable error code) or no answer arrived (`ClientError::Transport`). The two are
//! kept apart because they mean different things to a caller: a refusal is the hub's decision
//! and repeating the same request gets the same refusal; a transport failure says nothing about
//! whether the hub acted.

use baton_shared::error::ErrorCode;

/// A refusal the hub sent: its HTTP status and `{code, message}` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// The stable code, when it is one this client knows (`None` for a code added to the hub
    /// after this client was built, or an answer without our error body).
    pub code: Option<ErrorCode>,
    /// The code exactly as sent (empty when the body was not our error shape).
    pub code_text: String,
    /// The hub's message, for a human.
    pub message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.code_text.is_empty() {
            write!(f, "the hub refused the request ({}): {}", self.status, self.message)
        } else {
            write!(f, "the hub refused the request ({} {}): {}", self.status, self.code_text, self.message)
        }
    }
}

/// Why a call did not return its answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The hub answered with an error.
    #[error("{0}")]
    Api(ApiError),
    /// No answer arrived. `maybe_sent` is true when the request may have reached the hub (a
    /// timeout or a connection lost after sending), so its effect may have happened.
    #[error("hub unreachable: {detail}")]
    Transport {
        /// What failed, with a hint when it looks like our certificate was refused.
        detail: String,
        /// Whether the hub may have acted on the request.
        maybe_sent: bool,
    },
    /// The TLS handshake failed with the hub's alert that our certificate is revoked.
    #[error("the hub refused our client certificate as revoked in the TLS handshake: {0}")]
    CertificateRevoked(String),
    /// The hub answered 2xx with a body that is not the documented answer.
    #[error("the hub sent an unexpected answer ({status}): {detail}")]
    BadAnswer {
        /// The HTTP status.
        status: u16,
        /// Why the body did not parse.
        detail: String,
    },
    /// The request could not be made (an id or URL that does not form a request).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A refusal for good (`refused_for_good`) of the certificate this request presented, which
    /// `Client::reload` has replaced since: not a refusal of the one in use now, whose next
    /// request may succeed.
    #[error("{0} (sent with the certificate in use before the reload; the next request presents the new one)")]
    SentBeforeReload(Box<ClientError>),
}

/// Why the hub will never take this identity's requests again (`ClientError::refused_for_good`).
/// Running on cannot help; the operator has to act (renew the certificate, or un-retire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefusedForGood {
    /// The hub revoked the certificate: its 401 `certificate_revoked`, or its TLS alert naming
    /// the revocation. How it said so.
    CertificateRevoked(String),
    /// The hub retired the host this certificate names (403 `host_retired`). Its refusal.
    HostRetired(String),
}

impl RefusedForGood {
    /// The refusal in a sentence about `whose` identity (e.g. `"this node's"`).
    pub fn describe(&self, whose: &str) -> String {
        match self {
            RefusedForGood::CertificateRevoked(how) => format!("the hub revoked {whose} certificate ({how})"),
            RefusedForGood::HostRetired(how) => format!("the hub retired {whose} host ({how})"),
        }
    }
}

impl ClientError {
    /// The stable error code of a refusal, when the hub sent one this client knows.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api(e) => e.code,
            _ => None,
        }
    }

    /// The refusal, when the hub refused.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            ClientError::Api(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the answer to this request is lost: the hub may have acted on it.
    pub fn answer_lost(&self) -> bool {
        match self {
            ClientError::Transport { maybe_sent, .. } => *maybe_sent,
            ClientError::BadAnswer { .. } => true,
            ClientError::Api(_)
            | ClientError::CertificateRevoked(_)
            | ClientError::Invalid(_)
            | ClientError::SentBeforeReload(_) => false,
        }
    }

    /// Whether sending the same request again later may succeed: no answer arrived, the hub
    /// said it could not take it now (408, 429, 5xx), or it refused a certificate replaced since.
    /// Only idempotent calls act on this.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Transport { .. } | ClientError::BadAnswer { .. } | ClientError::SentBeforeReload(_) => true,
            ClientError::Api(e) => e.status >= 500 || e.status == 429 || e.status == 408,
            ClientError::CertificateRevoked(_) | ClientError::Invalid(_) => false,
        }
    }

    /// Whether a caller that keeps trying for as long as it runs (a node) sends the request
    /// again after a pause: `is_transient`, or a 401 (an expired or unknown certificate, which
    /// an operator may renew meanwhile). Such a caller checks `refused_for_good` first: a
    /// revoked certificate is a 401 too.
    pub fn retry_later(&self) -> bool {
        self.is_transient() || self.api().is_some_and(|e| e.status == 401)
    }

    /// Whether no answer came at all (the hub down, the network cut): a caller that retries
    /// keeps its pauses short, so the hub is regained soon after it listens again.
    pub fn unreachable(&self) -> bool {
        matches!(self, ClientError::Transport { .. })
    }

    /// Whether another hub of the same record may take this request when this one did not:
    /// no answer came at all (`unreachable`: connection refused or reset, the TLS handshake
    /// failed, a timeout), or the hub answered 503, that it cannot serve now (shutting down,
    /// its storage unavailable, or a proxy with no hub behind it). A refusal the hub decided
    /// (revoked, retired, superseded, a 4xx, an instance conflict) is never one: every hub of
    /// the record would answer the same.
    pub fn hub_unavailable(&self) -> bool {
        self.unreachable() || self.api().is_some_and(|e| e.status == 503)
    }

    /// The hub's message when it refused a node request because a newer session of the same
    /// node instance replaced the one this request carried (409 `session_superseded`): the
    /// process holding the older session must stop at once.
    pub fn superseded(&self) -> Option<String> {
        match self {
            ClientError::Api(e) if e.status == 409 && e.code == Some(ErrorCode::SessionSuperseded) => {
                Some(e.message.clone())
            }
            _ => None,
        }
    }

    /// Whether the hub does not know the route at all (404 or 405 to the whole request, for a
    /// route without ids in its path): a hub older than the route, which the caller then works
    /// without (a batch route: one request per item instead).
    pub fn route_unknown(&self) -> bool {
        matches!(self, ClientError::Api(e) if e.status == 404 || e.status == 405)
    }

    /// Why the hub will never take this identity's requests again, when this error says so: it
    /// revoked the certificate (401 `certificate_revoked`, or its TLS alert naming the
    /// revocation), or retired the host it names (403 `host_retired`). Not for a refusal of a
    /// certificate replaced since (`SentBeforeReload`).
    pub fn refused_for_good(&self) -> Option<RefusedForGood> {
        match self {
            ClientError::Api(e) if e.status == 403 && e.code == Some(ErrorCode::HostRetired) => {
                Some(RefusedForGood::HostRetired(format!("403 {}: {}", e.code_text, e.message)))
            }
            ClientError::Api(e) if e.status == 401 && e.code == Some(ErrorCode::CertificateRevoked) => {
                Some(RefusedForGood::CertificateRevoked(format!("401 {}: {}", e.code_text, e.message)))
            }
            ClientError::CertificateRevoked(detail) => {
                Some(RefusedForGood::CertificateRevoked(format!("TLS handshake refused: {detail}")))
            }
            _ => None,
        }
    }

    /// The error a request sent with TLS client generation `sent_with` ended with, seen from
    /// a client now at generation `now`: a refusal for good of a certificate replaced since is
    /// `SentBeforeReload`.
    pub(crate) fn sent_with(self, sent_with: u64, now: u64) -> ClientError {
        if sent_with != now && self.refused_for_good().is_some() {
            ClientError::SentBeforeReload(Box::new(self))
        } else {
            self
        }
    }
}

/// Classifies a reqwest failure. A failure to connect means the hub never saw the request;
/// anything later (a timeout, a connection lost) may have reached it.
pub(crate) fn transport_error(e: &reqwest::Error) -> ClientError {
    let chain = error_chain(e);
    // The one TLS refusal that names its reason reliably (under TLS 1.3 the client may instead
    // see only "connection closed"; the hub's log says why then).
    if chain.contains("CertificateRevoked") {
        return ClientError::CertificateRevoked(chain);
    }
    let maybe_sent = !e.is_connect() && !e.is_builder();
    let lower = chain.to_ascii_lowercase();
    // Only failures that name the handshake point at our certificate; a hub that went away
    // (connection closed or reset) is an outage, not a refusal.
    let tls_hint = ["certificate", "alert", "handshake"].iter().any(|w| lower.contains(w));
    let detail = if tls_hint {
        format!("{chain} (the hub may have refused our client certificate: revoked or expired? the hub's log says why)")
    } else {
        chain
    };
    ClientError::Transport { detail, maybe_sent }
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

    fn refused(status: u16, code: &str) -> ClientError {
        ClientError::Api(ApiError { status, code: ErrorCode::parse(code), code_text: code.into(), message: "m".into() })
    }

    #[test]
    fn refusals_are_typed_by_their_code_and_transport_errors_are_not() {
        assert_eq!(refused(409, "idempotency_conflict").code(), Some(ErrorCode::IdempotencyConflict));
        assert_eq!(refused(409, "a_code_from_the_future").code(), None);
        let lost = ClientError::Transport { detail: "timed out".into(), maybe_sent: true };
        assert_eq!(lost.code(), None);
        assert!(lost.answer_lost() && lost.is_transient());
        let never_sent = ClientError::Transport { detail: "refused".into(), maybe_sent: false };
        assert!(!never_sent.answer_lost() && never_sent.is_transient());
    }

    #[test]
    fn only_refusals_for_now_are_transient() {
        for (status, code, transient) in [
            (503, "storage_unavailable", true),
            (503, "shutting_down", true),
            (429, "over_capacity", true),
            (408, "request_timeout", true),
            (500, "internal", true),
            (400, "invalid_field", false),
            (401, "certificate_revoked", false),
            (403, "forbidden", false),
            (404, "not_found", false),
            (409, "idempotency_conflict", false),
            (409, "report_conflict", false),
            (413, "too_large", false),
        ] {
            assert_eq!(refused(status, code).is_transient(), transient, "{status} {code}");
        }
        assert!(!ClientError::CertificateRevoked("alert".into()).is_transient());
    }

    #[test]
    fn a_newer_session_is_recognised() {
        let superseded = refused(409, "session_superseded");
        assert_eq!(superseded.superseded().as_deref(), Some("m"));
        assert!(!superseded.is_transient() && !superseded.retry_later());
        assert_eq!(refused(409, "stale_claim").superseded(), None);
        assert_eq!(refused(403, "session_superseded").superseded(), None);
    }

    #[test]
    fn a_route_the_hub_does_not_know_is_a_whole_request_404_or_405() {
        assert!(refused(404, "not_found").route_unknown());
        assert!(refused(405, "").route_unknown());
        assert!(!refused(409, "stale_claim").route_unknown());
        assert!(!ClientError::Transport { detail: "reset".into(), maybe_sent: false }.route_unknown());
    }

    #[test]
    fn only_a_revocation_or_a_retirement_is_refused_for_good() {
        let revoked = refused(401, "certificate_revoked").refused_for_good().unwrap();
        assert_eq!(revoked, RefusedForGood::CertificateRevoked("401 certificate_revoked: m".into()));
        assert_eq!(
            revoked.describe("this node's"),
            "the hub revoked this node's certificate (401 certificate_revoked: m)"
        );
        let retired = refused(403, "host_retired").refused_for_good().unwrap();
        assert_eq!(retired.describe("this node's"), "the hub retired this node's host (403 host_retired: m)");
        let tls = ClientError::CertificateRevoked("received fatal alert: CertificateRevoked".into());
        assert!(matches!(tls.refused_for_good(), Some(RefusedForGood::CertificateRevoked(_))) && !tls.answer_lost());
        for passing in [
            refused(401, "unknown_certificate"),
            refused(403, "wrong_role"),
            refused(409, "instance_conflict"),
            refused(409, "session_superseded"),
            refused(503, "storage_unavailable"),
            ClientError::Transport { detail: "connection closed".into(), maybe_sent: false },
        ] {
            assert_eq!(passing.refused_for_good(), None, "{passing}");
        }
    }

    #[test]
    fn a_refusal_of_a_certificate_replaced_since_is_not_for_good() {
        let revoked = refused(401, "certificate_revoked");
        assert!(revoked.clone().sent_with(1, 1).refused_for_good().is_some());
        let stale = revoked.sent_with(1, 2);
        assert!(matches!(stale, ClientError::SentBeforeReload(_)), "{stale}");
        assert!(stale.refused_for_good().is_none() && stale.is_transient() && stale.retry_later());
        assert!(!stale.answer_lost());
        assert!(stale.to_string().contains("before the reload"), "{stale}");
        // Only a refusal for good changes meaning; any other failure stays what it was.
        let conflict = refused(409, "stale_claim").sent_with(1, 2);
        assert_eq!(conflict.code(), Some(ErrorCode::StaleClaim));
    }

    #[test]
    fn a_caller_that_runs_on_retries_what_may_pass() {
        for (e, later) in [
            (refused(503, "storage_unavailable"), true),
            (refused(429, "over_capacity"), true),
            (refused(408, "request_timeout"), true),
            (refused(401, "unknown_certificate"), true),
            (ClientError::Transport { detail: "refused".into(), maybe_sent: false }, true),
            (ClientError::BadAnswer { status: 200, detail: "eof".into() }, true),
            (refused(409, "stale_claim"), false),
            (refused(409, "report_conflict"), false),
            (refused(400, "invalid_field"), false),
            (refused(403, "wrong_role"), false),
        ] {
            assert_eq!(e.retry_later(), later, "{e}");
        }
        assert!(ClientError::Transport { detail: "refused".into(), maybe_sent: false }.unreachable());
        assert!(!refused(503, "storage_unavailable").unreachable());
    }

    #[test]
    fn only_a_hub_that_did_not_answer_or_cannot_serve_now_is_worth_leaving() {
        for (e, leave) in [
            (ClientError::Transport { detail: "connection refused".into(), maybe_sent: false }, true),
            (ClientError::Transport { detail: "operation timed out".into(), maybe_sent: true }, true),
            (ClientError::Transport { detail: "tls handshake eof".into(), maybe_sent: false }, true),
            (refused(503, "shutting_down"), true),
            (refused(503, "storage_unavailable"), true),
            (refused(503, ""), true),
            (refused(500, "internal"), false),
            (refused(429, "over_capacity"), false),
            (refused(401, "certificate_revoked"), false),
            (refused(401, "unknown_certificate"), false),
            (refused(403, "host_retired"), false),
            (refused(409, "session_superseded"), false),
            (refused(409, "instance_conflict"), false),
            (refused(409, "stale_claim"), false),
            (refused(400, "invalid_field"), false),
            (ClientError::CertificateRevoked("alert".into()), false),
            (ClientError::BadAnswer { status: 200, detail: "eof".into() }, false),
            (ClientError::SentBeforeReload(Box::new(refused(401, "certificate_revoked"))), false),
        ] {
            assert_eq!(e.hub_unavailable(), leave, "{e}");
        }
    }

    #[test]
    fn a_refusal_reads_with_its_status_and_code() {
        assert_eq!(refused(404, "not_found").to_string(), "the hub refused the request (404 not_found): m");
    }
}
