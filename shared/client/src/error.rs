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
    #[error("the hub is unreachable: {detail}")]
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
            ClientError::Api(_) | ClientError::CertificateRevoked(_) | ClientError::Invalid(_) => false,
        }
    }

    /// Whether sending the same request again later may succeed: no answer arrived, or the hub
    /// said it could not take it now (408, 429, 5xx). Only idempotent calls act on this.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Transport { .. } | ClientError::BadAnswer { .. } => true,
            ClientError::Api(e) => e.status >= 500 || e.status == 429 || e.status == 408,
            ClientError::CertificateRevoked(_) | ClientError::Invalid(_) => false,
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
    fn a_refusal_reads_with_its_status_and_code() {
        assert_eq!(refused(404, "not_found").to_string(), "the hub refused the request (404 not_found): m");
    }
}
