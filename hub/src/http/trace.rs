//! The producer's trace on the hub: the `traceparent` request header of a submission, the
//! trace context kept with each message (the producer's, or one the hub starts), and the hub's
//! spans of it (`accept`, `fan-out`; the claim's own are in `node`).
//!
//! A batch's header is per request: it names the producer's one span that sent the batch, so
//! every message of the batch is kept with it and each message's spans are children of that
//! span (told apart by their `baton.message_id`). A message submitted without one starts a
//! trace of its own, in a batch too: nothing ties those messages together but the request.

use super::ApiError;
use crate::runtime::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use baton_shared::error::ErrorCode;
use baton_shared::traceparent::{TRACEPARENT_HEADER, TraceParent};
use baton_shared::wire::DeliverySummary;
use baton_telemetry::{Attr, Kind, RootSpan, Telemetry};
use std::time::SystemTime;

/// The request's `traceparent` header, parsed; `None` when absent. A malformed one (or more
/// than one) is refused with 400 naming the header, so a producer whose propagation is broken
/// hears of it rather than losing its trace silently.
pub(super) struct TraceHeader(pub(super) Option<TraceParent>);

impl<S: Send + Sync> FromRequestParts<S> for TraceHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let mut values = parts.headers.get_all(TRACEPARENT_HEADER).iter();
        let Some(value) = values.next() else { return Ok(TraceHeader(None)) };
        if values.next().is_some() {
            return Err(ApiError::new(ErrorCode::InvalidField, "traceparent: the header is given more than once"));
        }
        let text = value
            .to_str()
            .map_err(|_| ApiError::new(ErrorCode::InvalidField, "traceparent: the header is not ASCII text"))?;
        TraceParent::parse(text)
            .map(|tp| TraceHeader(Some(tp)))
            .map_err(|e| ApiError::new(ErrorCode::InvalidField, e.to_string()))
    }
}

/// One message's trace while the hub accepts it: the `traceparent` kept with it and, when the
/// hub started the trace with spans on, the open root span (`accept`) it names.
pub(super) struct MessageTrace {
    /// What is stored with the message and handed out with its claims.
    pub(super) traceparent: String,
    root: Option<RootSpan>,
}

impl MessageTrace {
    /// The trace of a message submitted with `given` (the request's header) at `started`:
    /// the producer's own; else a new trace whose root is the hub's `accept` span (spans on),
    /// or a new unsampled trace context (spans off: nothing of it is recorded, and the harness
    /// still gets a `TRACEPARENT` to continue).
    pub(super) fn begin(telemetry: &Telemetry, given: Option<TraceParent>, started: Option<SystemTime>) -> Self {
        if let Some(tp) = given {
            return MessageTrace { traceparent: tp.to_string(), root: None };
        }
        match telemetry.root("accept", Kind::Server, started) {
            Some(root) => MessageTrace { traceparent: root.traceparent().to_string(), root: Some(root) },
            None => MessageTrace { traceparent: TraceParent::generate(false).to_string(), root: None },
        }
    }

    /// Records the hub's spans of an accepted message: `accept` (the request, from `started`
    /// until now) and, for a new message, `fan-out` (the one transaction that accepted it and
    /// created a delivery per recipient, from `stored` to `committed`). A replay records its
    /// `accept` alone, in this request's trace.
    pub(super) fn accepted(self, state: &AppState, at: Accepted<'_>) {
        let telemetry = &state.telemetry;
        if !telemetry.is_on() {
            return;
        }
        let attrs = || {
            vec![
                Attr::Str("baton.message_id", at.message_id.to_string()),
                Attr::Str("baton.conversation", at.conversation.to_string()),
                Attr::Int("baton.seq", at.seq),
                Attr::Str("baton.duplicate", at.duplicate.to_string()),
            ]
        };
        match self.root {
            Some(root) => root.end(SystemTime::now(), attrs()),
            None => telemetry.span("accept", Kind::Server, Some(&self.traceparent), at.started, attrs),
        }
        if at.duplicate {
            return;
        }
        telemetry.span_ending("fan-out", Kind::Internal, Some(&self.traceparent), at.stored, at.committed, || {
            let mut attrs = vec![
                Attr::Str("baton.message_id", at.message_id.to_string()),
                Attr::Int("baton.deliveries", i64::try_from(at.deliveries.len()).unwrap_or(i64::MAX)),
            ];
            let hosts: Vec<&str> = at.deliveries.iter().filter_map(|d| d.host.as_deref()).collect();
            attrs.push(Attr::Str("baton.hosts", hosts.join(",")));
            attrs
        });
    }
}

/// What the spans of an accepted message say, and when its steps happened (each `None` with
/// spans off).
#[derive(Clone, Copy)]
pub(super) struct Accepted<'a> {
    /// The message.
    pub(super) message_id: &'a str,
    /// Its conversation.
    pub(super) conversation: &'a str,
    /// Its `seq`.
    pub(super) seq: i64,
    /// True for a replay of an earlier accept.
    pub(super) duplicate: bool,
    /// Its deliveries.
    pub(super) deliveries: &'a [DeliverySummary],
    /// When the request's handling began.
    pub(super) started: Option<SystemTime>,
    /// When its write job was handed to the store.
    pub(super) stored: Option<SystemTime>,
    /// When that job's commit was answered.
    pub(super) committed: Option<SystemTime>,
}
