//! Producer endpoints: accept a message, read it back (by id or idempotency key) with an
//! optional long-poll for outcomes, within `limits.message_view_bytes_max` (what does not fit
//! is named, and read one delivery at a time), cancel it, and read a conversation's
//! membership.

use super::replay;
use super::trace::{self, MessageTrace, TraceHeader};
use super::{ApiError, ApiJson, ApiQuery, Caller, ProducerCaller, check_path_id};
use crate::runtime::AppState;
use crate::store::lifecycle::accept::{AcceptLimits, Accepted, NewMessage, RetryPolicy};
use crate::store::lifecycle::approval::ApprovalBy;
use crate::store::lifecycle::approval::Decision;
use crate::store::{upkeep::canonical, views::read};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use baton_shared::crash_point;
use baton_shared::error::ErrorCode;
use baton_shared::ids::{check_key, check_name};
use baton_shared::limits::REASON_CHARS_MAX;
use baton_shared::wire::{
    ApprovalRequest, ApprovalResponse, CancelRequest, CancelResponse, ConversationView, DeliveryView, MessagePage,
    MessageView, SubmitRequest, SubmitResponse, ViewOmitted,
};
use serde::Deserialize;
use std::time::Duration;
use tokio::time::Instant;

/// Validates a message's retry policy against the hub's bounds.
fn validate_retry(req: &SubmitRequest, state: &AppState) -> Result<RetryPolicy, ApiError> {
    let max = state.limits.max_attempts_max;
    if let Some(n) = req.max_attempts
        && !(1..=max).contains(&n)
    {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("max_attempts: {n} is out of range; allowed 1..={max} (limits.max_attempts_max)"),
        ));
    }
    let max_ms = state.limits.retry_backoff_max.as_millis() as u64;
    if let Some(ms) = req.retry_backoff_ms
        && ms > max_ms
    {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("retry_backoff_ms: {ms} is over {max_ms} (limits.retry_backoff_max)"),
        ));
    }
    let approval_required = match req.approval.as_deref() {
        None | Some("none") => false,
        Some("required") => true,
        Some(other) => {
            return Err(ApiError::new(
                ErrorCode::InvalidField,
                format!(
                    "approval: {:?} is neither \"required\" nor \"none\"",
                    other.chars().take(REASON_CHARS_MAX).collect::<String>()
                ),
            ));
        }
    };
    let max_ms = state.limits.approval_timeout_max.as_millis() as u64;
    // Without an approval there is nothing to time out: the field is left out (neither stored
    // nor part of the content), as the document says.
    let approval_timeout_ms = req.approval_timeout_ms.filter(|_| approval_required);
    if let Some(ms) = approval_timeout_ms
        && !(1..=max_ms).contains(&ms)
    {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("approval_timeout_ms: {ms} is out of range; allowed 1..={max_ms} (limits.approval_timeout_max)"),
        ));
    }
    let bounded = |field: &str, value: Option<u64>, max: Duration, key: &str| match value {
        Some(ms) if !(1..=max.as_millis() as u64).contains(&ms) => Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("{field}: {ms} is out of range; allowed 1..={} ({key})", max.as_millis()),
        )),
        _ => Ok(value),
    };
    let deadline_ms = bounded("deadline_ms", req.deadline_ms, state.limits.deadline_max, "limits.deadline_max")?;
    let stall_ms = bounded("stall_ms", req.stall_ms, state.limits.stall_max, "limits.stall_max")?;
    Ok(RetryPolicy {
        max_attempts: req.max_attempts,
        retry_backoff_ms: req.retry_backoff_ms,
        approval_required,
        approval_timeout_ms,
        deadline_ms,
        stall_ms,
    })
}

/// Validates a submission into a `NewMessage` and its retry policy.
pub(super) fn validate(
    producer: &str,
    req: SubmitRequest,
    state: &AppState,
) -> Result<(NewMessage, RetryPolicy), ApiError> {
    let retry = validate_retry(&req, state)?;
    check_name("conversation", &req.conversation)?;
    check_key("idempotency_key", &req.idempotency_key)?;
    // The exact text the producer sent: stored and handed out as is.
    let payload = req.payload.as_str().to_string();
    let max = state.limits.payload_bytes_max;
    if payload.len() as u64 > max {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!("payload is {} bytes; at most {max} are accepted (limits.payload_bytes_max)", payload.len()),
        ));
    }
    // Refused here, before the writer: a payload without a canonical form (duplicate keys,
    // nesting over the bound) has no content hash.
    canonical::canonical(&payload).map_err(|e| ApiError::new(ErrorCode::InvalidField, format!("payload: {e}")))?;
    // No `to` (or an empty one): the conversation's members at the message's seq; the store
    // refuses it with `no_recipients` when the conversation has none.
    let mut to = req.to.unwrap_or_default();
    let max = state.limits.recipients_max as usize;
    if to.len() > max {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("to: {} recipients; at most {max} are allowed (limits.recipients_max)", to.len()),
        ));
    }
    for (i, host) in to.iter().enumerate() {
        check_name("to", host).map_err(|e| ApiError::new(ErrorCode::InvalidField, format!("to[{i}]: {e}")))?;
    }
    to.sort();
    to.dedup();
    let mut pools = req.pools.unwrap_or_default();
    if pools.len() > max {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("pools: {} pools; at most {max} are allowed (limits.recipients_max)", pools.len()),
        ));
    }
    for (i, pool) in pools.iter().enumerate() {
        check_name("pools", pool).map_err(|e| ApiError::new(ErrorCode::InvalidField, format!("pools[{i}]: {e}")))?;
    }
    pools.sort();
    pools.dedup();
    if to.len() + pools.len() > max {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!(
                "pools: {} hosts and {} pools; at most {max} recipients are allowed (limits.recipients_max)",
                to.len(),
                pools.len()
            ),
        ));
    }
    let msg = NewMessage {
        traceparent: None,
        producer: producer.to_string(),
        conversation: req.conversation,
        idempotency_key: req.idempotency_key,
        payload,
        to,
        pools,
    };
    Ok((msg, retry))
}

/// `POST /v1/messages`, with the producer's trace in its `traceparent` header (or a trace the
/// hub starts).
pub(super) async fn submit(
    ProducerCaller(caller): ProducerCaller,
    State(state): State<AppState>,
    TraceHeader(given): TraceHeader,
    ApiJson(req): ApiJson<SubmitRequest>,
) -> Result<(StatusCode, Json<SubmitResponse>), ApiError> {
    let started = state.telemetry.started();
    let (mut msg, retry) = validate(&caller.name, req, &state)?;
    state.check_room()?;
    let trace = MessageTrace::begin(&state.telemetry, given, started);
    msg.traceparent = Some(trace.traceparent.clone());
    // Kept for the spans only, so not even copied with spans off.
    let conversation = if state.telemetry.is_on() { msg.conversation.clone() } else { String::new() };
    let limits = AcceptLimits {
        queued_per_host_max: state.limits.queued_per_host_max,
        queued_per_pool_max: state.limits.queued_per_pool_max,
    };
    crash_point("hub.accept.before_txn");
    // Accept and fan-out in one transaction: one round trip, one commit.
    let stored = state.telemetry.started();
    let (accepted, deliveries) = state.store.submit(msg, retry, limits).await?;
    let committed = state.telemetry.started();
    let (message_id, seq, duplicate) = match accepted {
        Accepted::New { message_id, seq } => {
            crash_point("hub.accept.after_commit");
            metrics::counter!("baton_hub_messages_accepted_total").increment(1);
            (message_id, seq, false)
        }
        Accepted::Duplicate { message_id, seq } => {
            metrics::counter!("baton_hub_messages_duplicate_total").increment(1);
            (message_id, seq, true)
        }
    };
    if !duplicate {
        // Only the hosts that gained claimable work wake their waiting claims.
        state.work_for_deliveries(&deliveries);
    }
    let at = trace::Accepted {
        message_id: message_id.as_str(),
        conversation: &conversation,
        seq,
        duplicate,
        deliveries: &deliveries,
        started,
        stored,
        committed,
    };
    trace.accepted(&state, at);
    let status = if duplicate { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, Json(SubmitResponse { message_id, seq, duplicate, deliveries })))
}

/// `POST /v1/messages/{message_id}/cancel`: the producer cancels its own message (403
/// `forbidden` for another's): each delivery is cancelled in the hub, asked of its node, or left
/// as it ended.
pub(super) async fn cancel(
    ProducerCaller(caller): ProducerCaller,
    State(state): State<AppState>,
    Path(message_id): Path<String>,
    ApiJson(req): ApiJson<CancelRequest>,
) -> Result<Json<CancelResponse>, ApiError> {
    check_path_id("message_id", &message_id)?;
    if req.reason.trim().is_empty() || req.reason.chars().count() > REASON_CHARS_MAX {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("reason: must be 1..={REASON_CHARS_MAX} characters"),
        ));
    }
    let deliveries = state.store.cancel_message(message_id.clone(), caller.name, req.reason).await?;
    // Waiting claims of the hosts concerned carry the cancel notice to the node; waiting reads
    // see the outcome.
    state.work_for(deliveries.iter().filter_map(|d| d.host.as_deref()));
    state.outcome_changed();
    Ok(Json(CancelResponse { message_id, deliveries }))
}

/// `POST /v1/messages/{message_id}/approve`: a producer with the right to approve in the
/// message's conversation approves it (403 `approval_forbidden` without it); its held
/// deliveries go back to queued.
pub(super) async fn approve(
    caller: ProducerCaller,
    state: State<AppState>,
    message_id: Path<String>,
    req: ApiJson<ApprovalRequest>,
) -> Result<Json<ApprovalResponse>, ApiError> {
    decide(caller, state, message_id, req, Decision::Approve).await
}

/// `POST /v1/messages/{message_id}/reject`: the same right rejects it; its held deliveries fail
/// with the reason.
pub(super) async fn reject(
    caller: ProducerCaller,
    state: State<AppState>,
    message_id: Path<String>,
    req: ApiJson<ApprovalRequest>,
) -> Result<Json<ApprovalResponse>, ApiError> {
    decide(caller, state, message_id, req, Decision::Reject).await
}

async fn decide(
    ProducerCaller(caller): ProducerCaller,
    State(state): State<AppState>,
    Path(message_id): Path<String>,
    ApiJson(req): ApiJson<ApprovalRequest>,
    decision: Decision,
) -> Result<Json<ApprovalResponse>, ApiError> {
    check_path_id("message_id", &message_id)?;
    if req.reason.trim().is_empty() || req.reason.chars().count() > REASON_CHARS_MAX {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("reason: must be 1..={REASON_CHARS_MAX} characters"),
        ));
    }
    let by = ApprovalBy::Producer(caller.name);
    let done = state.store.decide_approval(message_id, by, decision, req.reason).await?;
    match decision {
        Decision::Approve => state.work_for_deliveries(&done.deliveries),
        Decision::Reject => state.outcome_changed(),
    }
    Ok(Json(ApprovalResponse {
        message_id: done.message_id,
        decision: done.decision.to_string(),
        deliveries: done.deliveries,
    }))
}

/// Query of the message reads, and of the listing (`conversation`, `after`, `limit`) that
/// shares the path `GET /v1/messages` with the read by key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReadQuery {
    idempotency_key: Option<String>,
    wait_ms: Option<u64>,
    conversation: Option<String>,
    after: Option<String>,
    limit: Option<u32>,
}

impl ReadQuery {
    /// The listing's fields given, by name.
    fn listing_fields(&self) -> Vec<&'static str> {
        let given = [
            ("conversation", self.conversation.is_some()),
            ("after", self.after.is_some()),
            ("limit", self.limit.is_some()),
        ];
        given.into_iter().filter(|(_, g)| *g).map(|(name, _)| name).collect()
    }
}

/// `GET /v1/messages/{message_id}`.
pub(super) async fn get_by_id(
    ProducerCaller(caller): ProducerCaller,
    State(state): State<AppState>,
    Path(message_id): Path<String>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> Result<Json<MessageView>, ApiError> {
    check_path_id("message_id", &message_id)?;
    if q.idempotency_key.is_some() {
        return Err(ApiError::new(ErrorCode::InvalidField, "idempotency_key: not taken with a message id"));
    }
    if let Some(field) = q.listing_fields().first() {
        return Err(ApiError::new(ErrorCode::InvalidField, format!("{field}: not taken with a message id")));
    }
    read_waiting(&state, &caller, message_id, q.wait_ms).await.map(Json)
}

/// `GET /v1/messages`: by key (`?idempotency_key=K[&wait_ms=N]`, one message) or the
/// producer's listing of a conversation (`?conversation=C[&after=CURSOR][&limit=N]`, a page,
/// `replay`). The two forms never mix: a query naming both is refused, naming the fields.
pub(super) async fn get_messages(
    caller: ProducerCaller,
    state: State<AppState>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse as _;
    let listing = q.listing_fields();
    if let Some(field) = listing.first()
        && (q.idempotency_key.is_some() || q.wait_ms.is_some())
    {
        let other = if q.idempotency_key.is_some() { "idempotency_key" } else { "wait_ms" };
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!(
                "{other} and {field}: a read by idempotency_key (with wait_ms) and a listing of a conversation (with \
                 after, limit) are two queries; give one"
            ),
        ));
    }
    if listing.is_empty() {
        return Ok(get_by_key(caller, state, q).await?.into_response());
    }
    Ok(list(caller, state, q).await?.into_response())
}

/// The listing form of `get_messages`.
async fn list(
    ProducerCaller(caller): ProducerCaller,
    State(state): State<AppState>,
    q: ReadQuery,
) -> Result<Json<MessagePage>, ApiError> {
    let conversation = q.conversation.ok_or_else(|| {
        ApiError::new(ErrorCode::InvalidField, "conversation: required to list (or give idempotency_key to read one)")
    })?;
    check_name("conversation", &conversation)?;
    let page = replay::page(&state, &caller.name, conversation, q.after.as_deref(), q.limit).await?;
    caller.recheck(&state).await?;
    Ok(Json(page))
}

/// The read-by-key form of `get_messages`.
async fn get_by_key(
    ProducerCaller(caller): ProducerCaller,
    State(state): State<AppState>,
    q: ReadQuery,
) -> Result<Json<MessageView>, ApiError> {
    let key = q.idempotency_key.ok_or_else(|| {
        ApiError::new(ErrorCode::InvalidField, "idempotency_key: required (or give conversation to list messages)")
    })?;
    check_key("idempotency_key", &key)?;
    let found = state.store.message_id_by_key(caller.name.clone(), key).await?;
    let id = found.ok_or_else(|| ApiError::new(ErrorCode::NotFound, "no message with that idempotency key"))?;
    read_waiting(&state, &caller, id, q.wait_ms).await.map(Json)
}

/// Reads a message; with `wait_ms`, waits until a delivery settles that had not settled when
/// the read began (or all are settled already), or the wait elapses. The caller's certificate
/// is re-checked when the answer leaves, so a revocation during the wait answers 401.
async fn read_waiting(
    state: &AppState,
    caller: &Caller,
    id: String,
    wait_ms: Option<u64>,
) -> Result<MessageView, ApiError> {
    let view = wait_for_outcomes(state, &caller.name, id, wait_ms).await?;
    caller.recheck(state).await?;
    Ok(bounded(view, state.limits.message_view_bytes_max))
}

/// Bytes of JSON `v` takes (what it adds to an answer).
fn json_len<T: serde::Serialize>(v: &T) -> u64 {
    serde_json::to_vec(v).map_or(u64::MAX, |b| b.len() as u64)
}

/// Keeps a message view within `max` bytes of JSON: the message, its payload and every
/// delivery's state always stay (a view that drops them answers nothing); the deliveries'
/// attempts, which carry the results and make a view large, stay while they fit, in the
/// view's order, and the ones that do not are left out and named in `omitted` with the path
/// that reads each whole.
fn bounded(mut view: MessageView, max: u64) -> MessageView {
    if json_len(&view) <= max {
        return view;
    }
    let mut attempts: Vec<_> = view.deliveries.iter_mut().map(|d| std::mem::take(&mut d.attempts)).collect();
    let mut omitted = ViewOmitted {
        attempts_of: view.deliveries.iter().map(|d| d.delivery_id.clone()).collect(),
        view_bytes_max: max,
        read_each_at: format!("/v1/messages/{}/deliveries/{{delivery_id}}", view.message_id),
    };
    // Room is counted with every delivery named as left out: naming fewer only frees room.
    view.omitted = Some(omitted.clone());
    let mut used = json_len(&view);
    let mut kept = Vec::new();
    for (d, a) in view.deliveries.iter_mut().zip(attempts.iter_mut()) {
        // `[]` becomes the list: its length less the two brackets already counted.
        let adds = json_len(a).saturating_sub(2);
        if used.saturating_add(adds) <= max {
            used += adds;
            d.attempts = std::mem::take(a);
            kept.push(d.delivery_id.clone());
        }
    }
    omitted.attempts_of.retain(|id| !kept.contains(id));
    view.omitted = Some(omitted);
    debug_assert!(
        view.deliveries
            .iter()
            .all(|d| d.attempts.is_empty() || !view.omitted.iter().any(|o| o.attempts_of.contains(&d.delivery_id))),
        "a delivery is either whole or named"
    );
    view
}

/// `GET /v1/messages/{message_id}/deliveries/{delivery_id}`: one delivery of the producer's
/// own message with all its attempts: how a message view too large for its bound is read whole.
pub(super) async fn get_delivery(
    ProducerCaller(caller): ProducerCaller,
    State(state): State<AppState>,
    Path((message_id, delivery_id)): Path<(String, String)>,
) -> Result<Json<DeliveryView>, ApiError> {
    check_path_id("message_id", &message_id)?;
    check_path_id("delivery_id", &delivery_id)?;
    let (producer, view) = state.store.delivery_of_message(message_id, delivery_id).await?;
    if producer != caller.name {
        return Err(ApiError::new(ErrorCode::NotYours, "that message belongs to another producer"));
    }
    caller.recheck(&state).await?;
    Ok(Json(view))
}

/// The long poll of `read_waiting`, without the answer-time check.
async fn wait_for_outcomes(
    state: &AppState,
    producer: &str,
    id: String,
    wait_ms: Option<u64>,
) -> Result<MessageView, ApiError> {
    let wait = Duration::from_millis(wait_ms.unwrap_or(0)).min(state.limits.long_poll_wait_max);
    let deadline = Instant::now() + wait;
    let mut settled_at_start = None;
    loop {
        let mut rx = state.outcomes.subscribe();
        let view = state.store.message_by_id(id.clone()).await?;
        if view.producer != producer {
            return Err(ApiError::new(ErrorCode::NotYours, "that message belongs to another producer"));
        }
        let settled = view.deliveries.iter().filter(|d| read::settled(d)).count();
        let start = *settled_at_start.get_or_insert(settled);
        if wait.is_zero() || settled > start || settled == view.deliveries.len() || Instant::now() >= deadline {
            return Ok(view);
        }
        tokio::select! {
            _ = rx.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = state.shutdown.cancelled() => return Ok(view),
        }
    }
}

/// `GET /v1/conversations/{conversation}`: the conversation's `last_seq` and membership registry, for a
/// producer whose publish scope covers it (else 403 `forbidden`, whether or not it exists).
pub(super) async fn get_conversation(
    ProducerCaller(caller): ProducerCaller,
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<ConversationView>, ApiError> {
    check_name("conversation", &name)?;
    let view = state.store.conversation_for(caller.name, name).await?;
    Ok(Json(view))
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_shared::states::Outcome;
    use baton_shared::wire::AttemptView;

    fn attempt(result_bytes: usize) -> AttemptView {
        AttemptView {
            attempt_id: "a".into(),
            report_id: "r".into(),
            outcome: Outcome::Succeeded,
            exit_code: Some(0),
            duration_ms: Some(1),
            result: Some("x".repeat(result_bytes)),
            reason: None,
            reported_at_ms: 1,
            signal: None,
            attempt: 1,
            retryable: false,
            rerun: None,
            caused_by: None,
            stderr_tail: None,
            stderr_dropped_bytes: None,
        }
    }

    fn view(results: &[usize]) -> MessageView {
        MessageView {
            message_id: "m".into(),
            conversation: "c".into(),
            seq: 1,
            producer: "p".into(),
            idempotency_key: "k".into(),
            payload: serde_json::json!({"n": 1}).into(),
            accepted_at_ms: 1,
            traceparent: None,
            deliveries: results
                .iter()
                .enumerate()
                .map(|(i, bytes)| DeliveryView {
                    delivery_id: format!("d{i}"),
                    host: Some(format!("host-{i}")),
                    pool: None,
                    state: baton_shared::states::DeliveryState::Delivered,
                    reason: None,
                    updated_at_ms: 1,
                    attempts: vec![attempt(*bytes)],
                    attempt: 1,
                    max_attempts: 1,
                    not_before_ms: None,
                    cancel_requested_at_ms: None,
                    cancel_reason: None,
                })
                .collect(),
            omitted: None,
        }
    }

    /// Under its bound a view is untouched; over it, the attempts that do not fit are left out
    /// and named, every delivery stays, and the answer keeps to the bound.
    #[test]
    fn a_view_over_its_bound_leaves_out_whole_attempt_lists_and_names_them() {
        let small = view(&[10, 10]);
        assert_eq!(bounded(small.clone(), 1 << 20), small);

        let big = view(&[3_000, 3_000, 100, 3_000]);
        let max = 5_000;
        assert!(json_len(&big) > max);
        let b = bounded(big, max);
        assert!(json_len(&b) <= max, "{} > {max}", json_len(&b));
        assert_eq!(b.deliveries.len(), 4, "every delivery stays");
        let o = b.omitted.as_ref().expect("omitted");
        assert_eq!(o.attempts_of, ["d1", "d3"], "the first two that do not fit; the small one after them fits");
        assert_eq!((o.view_bytes_max, o.read_each_at.as_str()), (max, "/v1/messages/m/deliveries/{delivery_id}"));
        for d in &b.deliveries {
            assert_eq!(d.attempts.is_empty(), o.attempts_of.contains(&d.delivery_id), "{}", d.delivery_id);
        }

        // A bound the message alone fills: every attempt list is left out, nothing else.
        let b = bounded(view(&[10, 10]), 10);
        assert_eq!(b.omitted.map(|o| o.attempts_of), Some(vec!["d0".to_string(), "d1".to_string()]));
    }
}
