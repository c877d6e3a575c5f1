//! Batch endpoints (`POST /v1/batch/...`): many submits, holder steps or reports in one
//! request and one transaction, each item answered exactly as its single endpoint would answer
//! it (its status, and its body or its `{code, message}`), in the order of the request.
//!
//! What concerns the whole request is decided once, before any item: the caller's certificate
//! and role, the node's session, the body's size (`BATCH_BYTES_MAX`, 413 `too_large`), its
//! shape (400 `invalid_json`), the item count (1 to `BATCH_ITEMS_MAX`, 400 `invalid_field`) and,
//! for holder steps, the instance id. Refused there, nothing of the batch is applied. Each item
//! is then checked by the same code as its single endpoint and applied by the same store
//! operation of the `Store` (its batch form), so one stale or conflicting item fails alone.

use super::node::{Session, check_reason, check_report};
use super::producer::validate;
use super::trace::{MessageTrace, TraceHeader};
use super::{ApiError, ApiJson, Caller, NodeCaller, ProducerCaller, check_path_id};
use crate::runtime::AppState;
use crate::store::StoreResult;
use crate::store::lifecycle::accept::{AcceptLimits, Accepted};
use crate::store::lifecycle::handoff::Step;
use crate::store::registry::sessions::NodeAt;
use axum::Json;
use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use baton_shared::crash_point;
use baton_shared::error::ErrorCode;
use baton_shared::ids::check_token;
use baton_shared::limits::{BATCH_BYTES_MAX, BATCH_ITEMS_MAX};
use baton_shared::states::DeliveryState;
use baton_shared::wire::{
    BatchHolderRequest, BatchRejectRequest, BatchReportRequest, BatchReportResponse, BatchSubmitRequest,
    BatchSubmitResponse, BatchTransitionResponse, ErrorBody, HolderItem, ItemOutcome, ItemResult, SubmitResponse,
    TransitionResponse,
};
use serde::de::DeserializeOwned;

/// A batch body: over `BATCH_BYTES_MAX` bytes it is 413 `too_large` before it is parsed; under
/// it, it is parsed like every other body (`ApiJson`).
pub(super) struct BatchJson<T>(T);

impl<T: DeserializeOwned> FromRequest<AppState> for BatchJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        // The body was already read in whole (and bounded) by the router's body layer.
        let bytes = axum::body::to_bytes(body, usize::MAX)
            .await
            .map_err(|_| ApiError::new(ErrorCode::InvalidJson, "the request body could not be read"))?;
        if bytes.len() as u64 > BATCH_BYTES_MAX {
            return Err(ApiError::new(
                ErrorCode::TooLarge,
                format!("batch body is {} bytes; at most {BATCH_BYTES_MAX} are taken (BATCH_BYTES_MAX)", bytes.len()),
            ));
        }
        let req = Request::from_parts(parts, axum::body::Body::from(bytes));
        let ApiJson(v) = ApiJson::<T>::from_request(req, state).await?;
        Ok(BatchJson(v))
    }
}

/// Refuses an empty batch or one over `BATCH_ITEMS_MAX` items, naming its list.
fn check_count(field: &str, n: usize) -> Result<(), ApiError> {
    if n == 0 || n > BATCH_ITEMS_MAX {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("{field}: {n} items; a batch takes 1 to {BATCH_ITEMS_MAX} (BATCH_ITEMS_MAX)"),
        ));
    }
    Ok(())
}

/// An item's answer when it succeeded.
fn item_ok<T>(status: StatusCode, body: T) -> ItemResult<T> {
    ItemResult { status: status.as_u16(), outcome: ItemOutcome::Ok(body) }
}

/// An item's answer when it was refused: the status and body its single endpoint would send
/// (internals logged, never sent, as for any error).
fn item_error<T>(e: impl Into<ApiError>) -> ItemResult<T> {
    let e: ApiError = e.into();
    metrics::counter!("baton_hub_http_errors_total", "code" => e.code.as_str()).increment(1);
    ItemResult {
        status: e.code.status(),
        outcome: ItemOutcome::Error(ErrorBody { code: e.code.as_str().into(), message: e.message }),
    }
}

/// The items that passed their checks (with their place in the request), and a slot per item
/// for its answer: filled at once for an item its checks refused, after the transaction for
/// the others.
struct Sorted<I, T> {
    valid: Vec<(usize, I)>,
    answers: Vec<Option<ItemResult<T>>>,
}

impl<I, T> Sorted<I, T> {
    /// Checks every item with `check`.
    fn new<R>(items: Vec<R>, mut check: impl FnMut(R) -> Result<I, ApiError>) -> Self {
        let mut sorted = Sorted { valid: Vec::with_capacity(items.len()), answers: Vec::with_capacity(items.len()) };
        for (i, raw) in items.into_iter().enumerate() {
            match check(raw) {
                Ok(item) => {
                    sorted.valid.push((i, item));
                    sorted.answers.push(None);
                }
                Err(e) => sorted.answers.push(Some(item_error(e))),
            }
        }
        sorted
    }

    /// Puts the per-item outcomes in their places and returns every answer in order.
    fn finish<O>(
        mut self,
        places: Vec<usize>,
        outcomes: Vec<StoreResult<O>>,
        mut answer: impl FnMut(O) -> ItemResult<T>,
    ) -> Result<Vec<ItemResult<T>>, ApiError> {
        debug_assert_eq!(places.len(), outcomes.len(), "one outcome per applied item");
        for (i, outcome) in places.into_iter().zip(outcomes) {
            self.answers[i] = Some(match outcome {
                Ok(o) => answer(o),
                Err(e) => item_error(e),
            });
        }
        self.answers
            .into_iter()
            .map(|a| a.ok_or_else(|| ApiError::new(ErrorCode::Internal, "a batch item was left unanswered")))
            .collect()
    }

    /// Splits the valid items from their places.
    fn take(&mut self) -> (Vec<usize>, Vec<I>) {
        std::mem::take(&mut self.valid).into_iter().unzip()
    }
}

/// `POST /v1/batch/messages`: each message accepted and fanned out as `POST /v1/messages`
/// would (201 new, 200 replay, or its error).
pub(super) async fn submit(
    ProducerCaller(caller): ProducerCaller,
    State(state): State<AppState>,
    TraceHeader(given): TraceHeader,
    BatchJson(req): BatchJson<BatchSubmitRequest>,
) -> Result<Json<BatchSubmitResponse>, ApiError> {
    let started = state.telemetry.started();
    check_count("messages", req.messages.len())?;
    state.check_room()?;
    let mut sorted = Sorted::new(req.messages, |m| validate(&caller.name, m, &state));
    let (places, mut messages) = sorted.take();
    // The header is the request's: every message of the batch is kept with it (`trace`).
    let traces: Vec<MessageTrace> = messages
        .iter_mut()
        .map(|(msg, _)| {
            let t = MessageTrace::begin(&state.telemetry, given, started);
            msg.traceparent = Some(t.traceparent.clone());
            t
        })
        .collect();
    // Kept for the spans only, so not even copied with spans off.
    let conversations: Vec<String> = match state.telemetry.is_on() {
        true => messages.iter().map(|(m, _)| m.conversation.clone()).collect(),
        false => Vec::new(),
    };
    let limits = AcceptLimits {
        queued_per_host_max: state.limits.queued_per_host_max,
        queued_per_pool_max: state.limits.queued_per_pool_max,
    };
    crash_point("hub.accept.before_txn");
    // Accept and fan-out of every message in one transaction: one round trip, one commit.
    let stored = state.telemetry.started();
    let outcomes = state.store.submit_batch(messages, limits).await?;
    let committed = state.telemetry.started();
    let new = outcomes.iter().flatten().filter(|(a, _)| matches!(a, Accepted::New { .. })).count();
    if new > 0 {
        crash_point("hub.accept.after_commit");
    }
    // Only the hosts that gained claimable work (and the pools' members) wake their waiting claims.
    let queued = || {
        outcomes
            .iter()
            .flatten()
            .filter(|(a, _)| matches!(a, Accepted::New { .. }))
            .flat_map(|(_, deliveries)| deliveries.iter().filter(|d| d.state == DeliveryState::Queued))
    };
    let woken: std::collections::BTreeSet<String> =
        queued().filter(|d| d.pool.is_none()).filter_map(|d| d.host.clone()).collect();
    let woken_pools: std::collections::BTreeSet<String> = queued().filter_map(|d| d.pool.clone()).collect();
    if state.telemetry.is_on() {
        for ((trace, conversation), outcome) in traces.into_iter().zip(&conversations).zip(&outcomes) {
            let Ok((accepted, deliveries)) = outcome else { continue };
            let (message_id, seq, duplicate) = match accepted {
                Accepted::New { message_id, seq } => (message_id, *seq, false),
                Accepted::Duplicate { message_id, seq } => (message_id, *seq, true),
            };
            let at = super::trace::Accepted {
                message_id,
                conversation,
                seq,
                duplicate,
                deliveries,
                started,
                stored,
                committed,
            };
            trace.accepted(&state, at);
        }
    }
    let results = sorted.finish(places, outcomes, |(a, deliveries)| submitted(a, deliveries))?;
    metrics::counter!("baton_hub_messages_accepted_total").increment(new as u64);
    let duplicates = results.iter().filter(|r| r.status == StatusCode::OK.as_u16()).count();
    metrics::counter!("baton_hub_messages_duplicate_total").increment(duplicates as u64);
    state.work_for(woken.iter().map(String::as_str));
    state.work_for_pools(woken_pools.iter().map(String::as_str));
    Ok(Json(BatchSubmitResponse { results }))
}

/// A submitted message's answer, as `POST /v1/messages` gives it.
fn submitted(a: Accepted, deliveries: Vec<baton_shared::wire::DeliverySummary>) -> ItemResult<SubmitResponse> {
    match a {
        Accepted::New { message_id, seq } => {
            item_ok(StatusCode::CREATED, SubmitResponse { message_id, seq, duplicate: false, deliveries })
        }
        Accepted::Duplicate { message_id, seq } => {
            item_ok(StatusCode::OK, SubmitResponse { message_id, seq, duplicate: true, deliveries })
        }
    }
}

/// Runs `step` for every delivery of a batch in one transaction, after the session check.
async fn holder_steps(
    caller: &Caller,
    state: &AppState,
    session: Option<u64>,
    req: BatchHolderRequest,
    step: Step,
) -> Result<Vec<ItemResult<TransitionResponse>>, ApiError> {
    check_token("instance_id", &req.instance_id)?;
    check_count("deliveries", req.deliveries.len())?;
    let mut sorted = Sorted::new(req.deliveries, |d: HolderItem| {
        check_path_id("delivery_id", &d.delivery_id)?;
        check_token("claim_token", &d.claim_token)?;
        Ok(d)
    });
    let (places, items) = sorted.take();
    let node = NodeAt { host: caller.name.clone(), session };
    let outcomes = state.store.holder_steps(step, node, req.instance_id, items).await?;
    state.turns.contact(&caller.name, session, state.clock.now_ms());
    sorted.finish(places, outcomes, |r| item_ok(StatusCode::OK, r))
}

/// `POST /v1/batch/mirrored`: claimed → mirrored for each delivery, as
/// `POST /v1/deliveries/{id}/mirrored` would.
pub(super) async fn mirrored(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Session(session): Session,
    BatchJson(req): BatchJson<BatchHolderRequest>,
) -> Result<Json<BatchTransitionResponse>, ApiError> {
    let results = holder_steps(&caller, &state, session, req, Step::Mirrored).await?;
    crash_point("hub.mirrored.after_commit");
    state.outcome_changed();
    Ok(Json(BatchTransitionResponse { results }))
}

/// `POST /v1/batch/ack`: mirrored → delivered for each delivery, as
/// `POST /v1/deliveries/{id}/ack` would.
pub(super) async fn ack(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Session(session): Session,
    BatchJson(req): BatchJson<BatchHolderRequest>,
) -> Result<Json<BatchTransitionResponse>, ApiError> {
    let results = holder_steps(&caller, &state, session, req, Step::Ack).await?;
    crash_point("hub.ack.after_commit");
    state.outcome_changed();
    Ok(Json(BatchTransitionResponse { results }))
}

/// `POST /v1/batch/handoff`: the holder's whole handoff for each delivery, claimed or
/// mirrored → delivered, in one transaction: what `mirrored` then `ack` would do, one request
/// and one commit instead of two. Each item answers as the `ack` would (`delivered`).
pub(super) async fn handoff(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Session(session): Session,
    BatchJson(req): BatchJson<BatchHolderRequest>,
) -> Result<Json<BatchTransitionResponse>, ApiError> {
    let results = holder_steps(&caller, &state, session, req, Step::Handoff).await?;
    crash_point("hub.handoff.after_commit");
    state.outcome_changed();
    Ok(Json(BatchTransitionResponse { results }))
}

/// `POST /v1/batch/reject`: claimed or mirrored → failed for each delivery, as
/// `POST /v1/deliveries/{id}/reject` would.
pub(super) async fn reject(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Session(session): Session,
    BatchJson(req): BatchJson<BatchRejectRequest>,
) -> Result<Json<BatchTransitionResponse>, ApiError> {
    check_token("instance_id", &req.instance_id)?;
    check_count("deliveries", req.deliveries.len())?;
    let mut sorted = Sorted::new(req.deliveries, |d| {
        check_path_id("delivery_id", &d.delivery_id)?;
        check_token("claim_token", &d.claim_token)?;
        check_reason(&d.reason)?;
        Ok(d)
    });
    let (places, items) = sorted.take();
    let node = NodeAt { host: caller.name.clone(), session };
    let outcomes = state.store.reject_batch(node, req.instance_id, items).await?;
    state.turns.contact(&caller.name, session, state.clock.now_ms());
    state.outcome_changed();
    // A rejected pool turn frees its conversation for the pool's other members.
    let pools = state.store.pools_of_host(caller.name.clone()).await?;
    state.work_for_pools(pools.iter().map(String::as_str));
    let results = sorted.finish(places, outcomes, |r| item_ok(StatusCode::OK, r))?;
    Ok(Json(BatchTransitionResponse { results }))
}

/// `POST /v1/batch/reports`: each attempt report recorded as `POST /delivery-report` would
/// (201 recorded, 200 replay of its `report_id`, or its error).
pub(super) async fn reports(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Session(session): Session,
    BatchJson(req): BatchJson<BatchReportRequest>,
) -> Result<Json<BatchReportResponse>, ApiError> {
    check_count("reports", req.reports.len())?;
    let mut sorted = Sorted::new(req.reports, |r| check_report(&r, &state).map(|()| r));
    let (places, items) = sorted.take();
    let bounds = super::node::report_bounds(&state);
    let node = NodeAt { host: caller.name.clone(), session };
    let outcomes = state.store.report_batch(node, items, bounds).await?;
    crash_point("hub.report.after_commit");
    state.turns.contact(&caller.name, session, state.clock.now_ms());
    let mut recorded = false;
    let mut wake = false;
    let mut pools = std::collections::BTreeSet::new();
    for (r, freed) in outcomes.iter().flatten().filter(|(r, _)| !r.duplicate) {
        metrics::counter!("baton_hub_attempts_reported_total", "outcome" => r.attempt.outcome.as_str()).increment(1);
        recorded = true;
        wake |= r.retry_at_ms.is_some() || freed.barrier;
        pools.extend(freed.pool.clone());
    }
    // A pool turn's outcome may free its conversation for the pool's other members.
    state.work_for_pools(pools.iter().map(String::as_str));
    if recorded {
        state.outcome_changed();
    }
    if wake {
        // Waiting claims of the host look again: for the turns that waited behind these
        // outcomes (the retry barrier), or to wake when a retry is due.
        state.work_for([caller.name.as_str()]);
    }
    let outcomes = outcomes.into_iter().map(|o| o.map(|(r, _)| r)).collect();
    let results = sorted.finish(places, outcomes, |r| {
        let status = if r.duplicate { StatusCode::OK } else { StatusCode::CREATED };
        item_ok(status, r)
    })?;
    Ok(Json(BatchReportResponse { results }))
}
