//! Node endpoints: sessions, claims (long-poll), holdings, starts, mirrored / ack / reject,
//! attempt reports. Every one acts only on the caller's own host, read from its certificate,
//! and refuses a request whose `baton-session` is not the host's newest session (checked in the
//! same transaction that acts).

use super::{ApiError, ApiJson, ApiQuery, NodeCaller, check_path_id};
use crate::runtime::AppState;
use crate::store::lifecycle::claim::Claimed;
use crate::store::lifecycle::claim::Claimer;
use crate::store::lifecycle::handoff::HolderOf;
use crate::store::lifecycle::handoff::Step;
use crate::store::lifecycle::report::Backoff;
use crate::store::lifecycle::report::ReportBounds;
use crate::store::registry::sessions::NodeAt;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use baton_shared::crash_point;
use baton_shared::error::ErrorCode;
use baton_shared::ids::{check_key, check_token};
use baton_shared::limits::REASON_CHARS_MAX;
use baton_shared::wire::{
    ClaimRequest, ClaimResponse, HolderRequest, HoldingsResponse, RejectRequest, ReportRequest, ReportResponse,
    SESSION_HEADER, SessionEndRequest, SessionRequest, SessionResponse, StartRequest, StartResponse,
    TransitionResponse,
};
use baton_telemetry::{Attr, Kind};
use serde::Deserialize;
use std::time::Duration;
use tokio::time::Instant;

/// The request's `baton-session` header: the node session it comes from (absent for a node that
/// predates sessions).
pub(super) struct Session(pub(super) Option<u64>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Session {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get(SESSION_HEADER) else { return Ok(Session(None)) };
        value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|s| (1..=SESSION_MAX).contains(s))
            .map(|s| Session(Some(s)))
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InvalidField,
                    format!("{SESSION_HEADER}: must be a session number (1..={SESSION_MAX})"),
                )
            })
    }
}

/// The largest session number: sessions are stored as SQLite integers (signed 64 bits), so a
/// larger one in a header or a body could only be refused, never found.
const SESSION_MAX: u64 = i64::MAX as u64;

/// Longest `node_version` a session may name.
const NODE_VERSION_CHARS_MAX: usize = 100;

/// `POST /v1/sessions`: a node process registers a fresh session (refused with
/// `instance_conflict` while another instance of the host holds work).
pub(super) async fn open_session(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    ApiJson(req): ApiJson<SessionRequest>,
) -> Result<Json<SessionResponse>, ApiError> {
    check_token("instance_id", &req.instance_id)?;
    if req.node_version.as_ref().is_some_and(|v| v.chars().count() > NODE_VERSION_CHARS_MAX) {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("node_version: at most {NODE_VERSION_CHARS_MAX} characters"),
        ));
    }
    let instance = req.instance_id.clone();
    let opened = state
        .store
        .open_session(
            caller.name.clone(),
            req.instance_id,
            req.node_version,
            state.limits.rebind,
            state.limits.start_lease,
        )
        .await?;
    if let Some(previous) = opened.took_over {
        tracing::warn!(
            host = %caller.name,
            instance = %instance,
            session = opened.session,
            took_over = previous,
            "a node session took over from one that had not ended (a crash, or a copy of its data directory)"
        );
    }
    // Waiting claims of the superseded session look again, and are refused.
    state.work_for([caller.name.as_str()]);
    Ok(Json(SessionResponse {
        session: opened.session,
        took_over: opened.took_over,
        start_lease_ms: Some(opened.start_lease_ms),
    }))
}

/// `POST /v1/sessions/end`: the node ends its session cleanly.
pub(super) async fn end_session(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Session(session): Session,
    ApiJson(req): ApiJson<SessionEndRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    check_token("instance_id", &req.instance_id)?;
    if !(1..=SESSION_MAX).contains(&req.session) {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("session: {} is out of range; allowed 1..={SESSION_MAX}", req.session),
        ));
    }
    state.store.end_session(NodeAt { host: caller.name, session }, req.instance_id, req.session).await?;
    Ok(Json(serde_json::json!({})))
}

/// `POST /v1/starts`: which of the turns the node is about to start may run (one write job for
/// the whole request).
pub(super) async fn starts(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Session(session): Session,
    ApiJson(req): ApiJson<StartRequest>,
) -> Result<Json<StartResponse>, ApiError> {
    check_token("instance_id", &req.instance_id)?;
    let Some(session) = session else {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("{SESSION_HEADER}: required to start turns (register one with POST /v1/sessions)"),
        ));
    };
    let max = state.limits.claim_batch_max as usize;
    if req.starts.len() > max {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("starts: {} items; at most {max} are taken (limits.claim_batch_max)", req.starts.len()),
        ));
    }
    for item in &req.starts {
        check_path_id("delivery_id", &item.delivery_id)?;
        check_token("claim_token", &item.claim_token)?;
        if item.attempt == 0 {
            return Err(ApiError::new(ErrorCode::InvalidField, "attempt: must be at least 1"));
        }
    }
    let results = state.store.start_turns(caller.name.clone(), req.instance_id, session, req.starts).await?;
    state.turns.contact(&caller.name, Some(session), state.clock.now_ms());
    Ok(Json(StartResponse { results }))
}

/// `POST /v1/claims`: answers as soon as work is claimable or a new cancel notice is pending,
/// or when the wait elapses; a wait ends early when a retry of the host becomes due. Each look
/// (`baton_hub_claim_looks_total`) is a read; only one that may hand something out (or must
/// fail a retired host's work, or bind the instance) runs a write job. A waiting claim is woken
/// by changes for its own host or for all hosts, never by another host's work. While it waits,
/// the claim stands with the writer (`Store::stand_claim`): an accept that gives its host work
/// claims for it in the accept's own transaction (when no other write waits), and the claim
/// answers once that committed.
pub(super) async fn claim(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Session(session): Session,
    ApiJson(req): ApiJson<ClaimRequest>,
) -> Result<Json<ClaimResponse>, ApiError> {
    check_token("instance_id", &req.instance_id)?;
    let max = req.max.unwrap_or(state.limits.claim_batch_max);
    if max == 0 {
        return Err(ApiError::new(ErrorCode::InvalidField, "max: must be at least 1"));
    }
    let max = max.min(state.limits.claim_batch_max);
    let wait = Duration::from_millis(req.wait_ms.unwrap_or(0)).min(state.limits.long_poll_wait_max);
    let deadline = Instant::now() + wait;
    loop {
        // A `ca retire-old` during the wait ends it (its wake-up wakes every claim): the
        // record does not know which CA issued the certificate, so the store's re-check of the
        // certificate inside the claim cannot tell.
        caller.check_issuer(&state, " while the claim was waiting")?;
        // Subscribe before looking, so a change between the look and the wait is not missed;
        // only changes for this host (or for all hosts) wake it.
        let pools = state.store.pools_of_host(caller.name.clone()).await?;
        let mut rx = state.work.watch(&caller.name, pools);
        let who = Claimer {
            host: caller.name.clone(),
            serial: caller.serial.clone(),
            instance_id: req.instance_id.clone(),
            session,
            rebind: state.limits.rebind,
            pool_affinity_wait: state.limits.pool_affinity_wait,
        };
        let now = state.clock.now_ms();
        let looked = state.telemetry.started();
        metrics::counter!("baton_hub_claim_looks_total").increment(1);
        // Read first: a claim with nothing claimable opens no write transaction.
        let look = state.store.claim_look(who.clone(), now).await?;
        let claimed = if look.worth_claiming {
            state.store.claim(who.clone(), max).await?
        } else {
            Claimed {
                deliveries: Vec::new(),
                cancels: look.cancels,
                next_retry_at_ms: look.next_retry_at_ms,
                retired: false,
            }
        };
        let (next_retry, pending) = (claimed.next_retry_at_ms, claimed.cancels.clone());
        if let Some(answer) = answer_claim(&state, &caller.name, session, &req.instance_id, claimed, deadline, looked)?
        {
            caller.check_issuer(&state, " while the claim was waiting")?;
            return Ok(answer);
        }
        // A retry that becomes due during the wait ends it (the record's clock decides when).
        let wake = match next_retry {
            Some(at) => {
                let wait = u64::try_from(at.saturating_sub(state.clock.now_ms())).unwrap_or(0);
                (Instant::now() + Duration::from_millis(wait) + RETRY_WAKE_SLACK).min(deadline)
            }
            None => deadline,
        };
        // Registered after `rx`: an accept for this host that commits without taking it has
        // bumped `rx` by the time it answers, and every wake below withdraws it.
        let mut standing = state.store.stand_claim(who, max);
        let taken = {
            let answered = async {
                match standing.as_mut() {
                    Some(s) => s.answer().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = answered => Some(r),
                _ = rx.changed() => None,
                _ = tokio::time::sleep_until(wake) => None,
                _ = state.shutdown.cancelled() => None,
            }
        };
        // Withdrawn unless the writer took it; then its answer (which may be on its way) counts.
        let taken = match (taken, standing) {
            (Some(r), _) => Some(r),
            (None, Some(s)) => s.withdraw().await,
            (None, None) => None,
        };
        // Taken by the writer inside another transaction (an accept's): the claim's span is
        // its answer, from when the wait ended.
        let answered = state.telemetry.started();
        if let Some(claimed) = taken
            && let Some(answer) =
                answer_claim(&state, &caller.name, session, &req.instance_id, claimed?, deadline, answered)?
        {
            // Taken by the writer after the CA left `ca.crt`: never sent. What it claimed stays
            // the instance's, which a renewed certificate finds in its holdings (and which
            // `requeue` or `requeue_silent_after` return to the queue otherwise).
            caller.check_issuer(&state, " while the claim was waiting")?;
            return Ok(answer);
        }
        if state.shutdown.is_cancelled() {
            return Ok(Json(ClaimResponse { deliveries: Vec::new(), cancels: pending }));
        }
    }
}

/// What a claim answers after one look or transaction (`claimed`): an error for a retired
/// host, the deliveries it handed out (each with a `claim` span from `looked`, the start of the
/// look that found it), the cancel notices when one is new or the wait is over; `None` to keep
/// waiting.
fn answer_claim(
    state: &AppState,
    host: &str,
    session: Option<u64>,
    instance_id: &str,
    claimed: Claimed,
    deadline: Instant,
    looked: Option<std::time::SystemTime>,
) -> Result<Option<Json<ClaimResponse>>, ApiError> {
    let Claimed { deliveries, cancels, retired, .. } = claimed;
    // Told once its claim's transaction committed (its queued work failed `host retired`):
    // a retired host's node stops instead of polling for work it will never get.
    if retired {
        return Err(ApiError::new(ErrorCode::HostRetired, format!("host {host} is retired: it takes no more work")));
    }
    state.turns.contact(host, session, state.clock.now_ms());
    let fresh_cancels = state.turns.announce(instance_id, &cancels);
    if !deliveries.is_empty() {
        crash_point("hub.claim.after_commit");
        metrics::counter!("baton_hub_deliveries_claimed_total").increment(deliveries.len() as u64);
        let claimed_at = state.telemetry.started();
        for d in &deliveries {
            state.telemetry.span_ending("claim", Kind::Internal, d.traceparent.as_deref(), looked, claimed_at, || {
                let mut attrs =
                    baton_telemetry::delivery_attrs(&d.delivery_id, &d.message_id, &d.conversation, d.seq, d.attempt);
                attrs.push(Attr::Str("baton.host", host.to_string()));
                attrs
            });
        }
        state.outcome_changed();
        return Ok(Some(Json(ClaimResponse { deliveries, cancels })));
    }
    if fresh_cancels || Instant::now() >= deadline {
        return Ok(Some(Json(ClaimResponse { deliveries: Vec::new(), cancels })));
    }
    Ok(None)
}

/// Added to a waiting claim's wake-up for a due retry, so the look after it finds it due.
const RETRY_WAKE_SLACK: Duration = Duration::from_millis(5);

/// Query of `GET /v1/holdings`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HoldingsQuery {
    instance_id: String,
    /// Where the page starts: a previous page's `next_cursor`; none for the first page.
    cursor: Option<i64>,
    /// At most this many deliveries (capped by `limits.holdings_page_max`).
    limit: Option<u32>,
}

/// `GET /v1/holdings?instance_id=[&cursor=][&limit=]`: one page of what the instance holds.
pub(super) async fn holdings(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Session(session): Session,
    ApiQuery(q): ApiQuery<HoldingsQuery>,
) -> Result<Json<HoldingsResponse>, ApiError> {
    check_token("instance_id", &q.instance_id)?;
    let after_n = q.cursor.unwrap_or(0);
    if after_n < 0 {
        return Err(ApiError::new(ErrorCode::InvalidField, "cursor: must be 0 or more (a next_cursor of holdings)"));
    }
    let limit = q.limit.unwrap_or(state.limits.holdings_page_max);
    if limit == 0 {
        return Err(ApiError::new(ErrorCode::InvalidField, "limit: must be at least 1"));
    }
    let limit = limit.min(state.limits.holdings_page_max);
    let at = NodeAt { host: caller.name.clone(), session };
    let (deliveries, next) = state.store.holdings(at, q.instance_id, after_n, limit).await?;
    caller.recheck(&state).await?;
    state.turns.contact(&caller.name, session, state.clock.now_ms());
    Ok(Json(HoldingsResponse { deliveries, next_cursor: next }))
}

fn check_holder(req: &HolderRequest) -> Result<(), ApiError> {
    check_token("instance_id", &req.instance_id)?;
    check_token("claim_token", &req.claim_token)?;
    Ok(())
}

/// Checks a reject's reason (the single and the batch reject).
pub(super) fn check_reason(reason: &str) -> Result<(), ApiError> {
    if reason.trim().is_empty() || reason.chars().count() > REASON_CHARS_MAX {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("reason: must be 1..={REASON_CHARS_MAX} characters"),
        ));
    }
    Ok(())
}

/// Runs a holder's step for the caller's host; the caller marks its crash point and answers.
async fn holder_step(
    caller: crate::http::Caller,
    state: &AppState,
    session: Option<u64>,
    id: String,
    req: HolderRequest,
    step: Step,
) -> Result<TransitionResponse, ApiError> {
    check_path_id("delivery_id", &id)?;
    check_holder(&req)?;
    let node = NodeAt { host: caller.name.clone(), session };
    let holder = HolderOf { instance_id: req.instance_id, claim_token: req.claim_token };
    let r = state.store.holder_step(step, node, id, holder).await?;
    state.turns.contact(&caller.name, session, state.clock.now_ms());
    Ok(r)
}

/// `POST /v1/deliveries/{id}/mirrored`.
pub(super) async fn mirrored(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Session(session): Session,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<HolderRequest>,
) -> Result<Json<TransitionResponse>, ApiError> {
    let r = holder_step(caller, &state, session, id, req, Step::Mirrored).await?;
    crash_point("hub.mirrored.after_commit");
    state.outcome_changed();
    Ok(Json(r))
}

/// `POST /v1/deliveries/{id}/ack`.
pub(super) async fn ack(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Session(session): Session,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<HolderRequest>,
) -> Result<Json<TransitionResponse>, ApiError> {
    let r = holder_step(caller, &state, session, id, req, Step::Ack).await?;
    crash_point("hub.ack.after_commit");
    state.outcome_changed();
    Ok(Json(r))
}

/// `POST /v1/deliveries/{id}/reject`.
pub(super) async fn reject(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Session(session): Session,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<RejectRequest>,
) -> Result<Json<TransitionResponse>, ApiError> {
    check_path_id("delivery_id", &id)?;
    check_token("instance_id", &req.instance_id)?;
    check_token("claim_token", &req.claim_token)?;
    check_reason(&req.reason)?;
    let node = NodeAt { host: caller.name.clone(), session };
    let holder = HolderOf { instance_id: req.instance_id, claim_token: req.claim_token };
    let r = state.store.reject(node, id, holder, req.reason).await?;
    state.turns.contact(&caller.name, session, state.clock.now_ms());
    state.outcome_changed();
    // A rejected pool turn frees its conversation for the pool's other members.
    let pools = state.store.pools_of_host(caller.name.clone()).await?;
    state.work_for_pools(pools.iter().map(String::as_str));
    Ok(Json(r))
}

/// Checks a report's fields against the hub's bounds (the single and the batch report).
pub(super) fn check_report(req: &ReportRequest, state: &AppState) -> Result<(), ApiError> {
    check_path_id("delivery_id", &req.delivery_id)?;
    check_token("instance_id", &req.instance_id)?;
    check_token("claim_token", &req.claim_token)?;
    check_key("report_id", &req.report_id)?;
    let max = state.limits.result_bytes_max;
    if let Some(r) = &req.result
        && r.len() as u64 > max
    {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!("result is {} bytes; at most {max} are accepted (limits.result_bytes_max)", r.len()),
        ));
    }
    if req.reason.as_ref().is_some_and(|r| r.chars().count() > REASON_CHARS_MAX) {
        return Err(ApiError::new(ErrorCode::InvalidField, format!("reason: at most {REASON_CHARS_MAX} characters")));
    }
    if let Some(n) = req.stderr_dropped_bytes
        && i64::try_from(n).is_err()
    {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("stderr_dropped_bytes: {n} is out of range; allowed 0..={}", i64::MAX),
        ));
    }
    if req.attempt == Some(0) {
        return Err(ApiError::new(ErrorCode::InvalidField, "attempt: must be at least 1"));
    }
    if let Some(by) = &req.stopped_by
        && crate::store::lifecycle::report::StoppedBy::parse(by).is_none()
    {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("stopped_by: {:?} is neither \"deadline\" nor \"stall\"", by.chars().take(40).collect::<String>()),
        ));
    }
    if let Some(ms) = req.duration_ms
        && i64::try_from(ms).is_err()
    {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("duration_ms: {ms} is out of range; allowed 0..={}", i64::MAX),
        ));
    }
    Ok(())
}

/// The bounds the hub's limits give a report (the single and the batch report).
pub(super) fn report_bounds(state: &AppState) -> ReportBounds {
    ReportBounds {
        backoff: Backoff { base: state.limits.retry_backoff, max: state.limits.retry_backoff_max },
        stderr_tail_bytes_max: state.limits.stderr_tail_bytes_max,
        breaker_failures: state.limits.breaker_failures,
        breaker_turns: crate::store::lifecycle::breaker_period::TurnsPerPeriod {
            turns: state.limits.breaker_turns,
            period: state.limits.breaker_period,
        },
    }
}

/// `POST /delivery-report`.
pub(super) async fn report(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Session(session): Session,
    ApiJson(req): ApiJson<ReportRequest>,
) -> Result<(StatusCode, Json<ReportResponse>), ApiError> {
    check_report(&req, &state)?;
    let outcome = req.outcome;
    let delivery_id = req.delivery_id.clone();
    let node = NodeAt { host: caller.name.clone(), session };
    let ((attempt, duplicate, retry_at_ms), freed) = state.store.report(node, req, report_bounds(&state)).await?;
    crash_point("hub.report.after_commit");
    state.turns.contact(&caller.name, session, state.clock.now_ms());
    if !duplicate {
        metrics::counter!("baton_hub_attempts_reported_total", "outcome" => outcome.as_str()).increment(1);
        state.outcome_changed();
        if retry_at_ms.is_some() || freed.barrier {
            // Waiting claims of the host look again: for the turns that waited behind this
            // outcome (the retry barrier), or to wake when the retry is due.
            state.work_for([caller.name.as_str()]);
        }
        // A pool turn's outcome may free its conversation for the pool's other members.
        state.work_for_pools(freed.pool.as_deref());
    }
    let status = if duplicate { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, Json(ReportResponse { attempt, delivery_id, duplicate, retry_at_ms })))
}
