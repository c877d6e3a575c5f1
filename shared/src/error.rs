//! Stable error codes of the HTTP API and the status each maps to (SPEC §9).

/// A stable error code. The string form is a public contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// 400: the body is not JSON, or not the JSON this endpoint takes.
    InvalidJson,
    /// 400: a field has a bad value; the message names it.
    InvalidField,
    /// 400: the message has no recipients.
    NoRecipients,
    /// 400: a cursor (`after`) is not one the hub gave for this feed or listing: malformed, not
    /// a number, another producer's or conversation's, or past every position drawn so far.
    BadCursor,
    /// 401: the client certificate is not one the hub issued.
    UnknownCertificate,
    /// 401: the client certificate was revoked.
    CertificateRevoked,
    /// 403: the certificate's role may not use this endpoint.
    WrongRole,
    /// 403: the thing exists but belongs to another host or producer.
    NotYours,
    /// 403: the caller may not do this here (a producer posting outside its publish scope).
    Forbidden,
    /// 403: the producer may not approve or reject messages in this conversation (an operator
    /// grants the right with `baton-hub producers approve`).
    ApprovalForbidden,
    /// 403: the node's host was retired: it takes no more work, and running the node on cannot
    /// help (the node stops, exit status 5).
    HostRetired,
    /// 404: no such thing.
    NotFound,
    /// 405: the endpoint exists but not with this method.
    MethodNotAllowed,
    /// 408: the client took longer than `limits.request_body_timeout` to send the body.
    RequestTimeout,
    /// 409: the idempotency key was used with different content.
    IdempotencyConflict,
    /// 409: the claim is not held by this instance and token (any more).
    StaleClaim,
    /// 409: the delivery is not in a state that allows this transition.
    InvalidTransition,
    /// 409: the report id was used with different content.
    ReportConflict,
    /// 409: another instance of this host still holds work; only one instance may be active.
    InstanceConflict,
    /// 409: the request's `baton-session` names a node session older than the host's newest:
    /// another process took over this node instance.
    SessionSuperseded,
    /// 410: a feed's or listing's `after` lies before events or messages that retention or a
    /// purge removed since: reading on from it would skip them. Start again without `after`.
    CursorExpired,
    /// 413: the body or a field is over its size bound.
    TooLarge,
    /// 431: the request's header fields are over the hub's bound (their number or their size).
    HeadersTooLarge,
    /// 429: a capacity bound is reached.
    OverCapacity,
    /// 429: the producer's quota of unsettled messages (`unsettled_max`) is used up; it may
    /// post again once some of its messages settle.
    QuotaUnsettledMessages,
    /// 429: the producer's quota of unsettled payload bytes (`unsettled_bytes_max`) leaves no
    /// room for this payload; it may post again once some of its messages settle.
    QuotaUnsettledBytes,
    /// 503: the store cannot be written or read right now.
    StorageUnavailable,
    /// 507: the hub's store is over its `limits.store_bytes_max`: submissions are refused until
    /// retention or a purge frees room; claims, reports and reads go on.
    StoreFull,
    /// 503: the hub is shutting down.
    ShuttingDown,
    /// 500: a bug; details are in the hub's log.
    Internal,
}

impl ErrorCode {
    /// Every code.
    pub const ALL: [ErrorCode; 30] = [
        ErrorCode::InvalidJson,
        ErrorCode::InvalidField,
        ErrorCode::NoRecipients,
        ErrorCode::BadCursor,
        ErrorCode::UnknownCertificate,
        ErrorCode::CertificateRevoked,
        ErrorCode::WrongRole,
        ErrorCode::NotYours,
        ErrorCode::Forbidden,
        ErrorCode::ApprovalForbidden,
        ErrorCode::HostRetired,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::RequestTimeout,
        ErrorCode::IdempotencyConflict,
        ErrorCode::StaleClaim,
        ErrorCode::InvalidTransition,
        ErrorCode::ReportConflict,
        ErrorCode::InstanceConflict,
        ErrorCode::SessionSuperseded,
        ErrorCode::CursorExpired,
        ErrorCode::TooLarge,
        ErrorCode::HeadersTooLarge,
        ErrorCode::OverCapacity,
        ErrorCode::QuotaUnsettledMessages,
        ErrorCode::QuotaUnsettledBytes,
        ErrorCode::StorageUnavailable,
        ErrorCode::StoreFull,
        ErrorCode::ShuttingDown,
        ErrorCode::Internal,
    ];

    /// The stable string.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidJson => "invalid_json",
            ErrorCode::InvalidField => "invalid_field",
            ErrorCode::NoRecipients => "no_recipients",
            ErrorCode::BadCursor => "bad_cursor",
            ErrorCode::CursorExpired => "cursor_expired",
            ErrorCode::UnknownCertificate => "unknown_certificate",
            ErrorCode::CertificateRevoked => "certificate_revoked",
            ErrorCode::WrongRole => "wrong_role",
            ErrorCode::NotYours => "not_yours",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::ApprovalForbidden => "approval_forbidden",
            ErrorCode::HostRetired => "host_retired",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::IdempotencyConflict => "idempotency_conflict",
            ErrorCode::StaleClaim => "stale_claim",
            ErrorCode::InvalidTransition => "invalid_transition",
            ErrorCode::ReportConflict => "report_conflict",
            ErrorCode::InstanceConflict => "instance_conflict",
            ErrorCode::SessionSuperseded => "session_superseded",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::HeadersTooLarge => "headers_too_large",
            ErrorCode::OverCapacity => "over_capacity",
            ErrorCode::QuotaUnsettledMessages => "quota_unsettled_messages",
            ErrorCode::QuotaUnsettledBytes => "quota_unsettled_bytes",
            ErrorCode::StorageUnavailable => "storage_unavailable",
            ErrorCode::StoreFull => "store_full",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::Internal => "internal",
        }
    }

    /// Parses the stable string back into a code.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// The HTTP status this code is sent with.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::InvalidJson | ErrorCode::InvalidField | ErrorCode::NoRecipients | ErrorCode::BadCursor => 400,
            ErrorCode::UnknownCertificate | ErrorCode::CertificateRevoked => 401,
            ErrorCode::WrongRole
            | ErrorCode::NotYours
            | ErrorCode::Forbidden
            | ErrorCode::ApprovalForbidden
            | ErrorCode::HostRetired => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::IdempotencyConflict
            | ErrorCode::StaleClaim
            | ErrorCode::InvalidTransition
            | ErrorCode::ReportConflict
            | ErrorCode::InstanceConflict
            | ErrorCode::SessionSuperseded => 409,
            ErrorCode::CursorExpired => 410,
            ErrorCode::TooLarge => 413,
            ErrorCode::HeadersTooLarge => 431,
            ErrorCode::OverCapacity | ErrorCode::QuotaUnsettledMessages | ErrorCode::QuotaUnsettledBytes => 429,
            ErrorCode::StorageUnavailable | ErrorCode::ShuttingDown => 503,
            ErrorCode::StoreFull => 507,
            ErrorCode::Internal => 500,
        }
    }
}
