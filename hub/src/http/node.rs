//! Node endpoints: claims (long-poll), holdings, mirrored / ack / reject, attempt reports.
//! Every one acts only on the caller's own host, read from its certificate.

use super::{ApiError, ApiJson, ApiQuery, AppState, NodeCaller, check_path_id};
use crate::store::claim;
use crate::store::report::{self, NewReport};
use crate::store::transition::Holder;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use baton_shared::crash_point;
use baton_shared::error::ErrorCode;
use baton_shared::ids::{check_key, check_token};
use baton_shared::limits::REASON_CHARS_MAX;
use baton_shared::wire::{
    ClaimRequest, ClaimResponse, HolderRequest, HoldingsResponse, RejectRequest, ReportRequest, ReportResponse,
    TransitionResponse,
};
use serde::Deserialize;
use std::time::Duration;
use tokio::time::Instant;

/// `POST /v1/claims`: answers as soon as work is claimable, or when the wait elapses.
pub(super) async fn claim(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
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
        // Subscribe before looking, so a change between the look and the wait is not missed.
        let mut rx = state.work.subscribe();
        let (host, instance, serial) = (caller.name.clone(), req.instance_id.clone(), caller.serial.clone());
        let clock = state.clock.clone();
        let batch = state
            .writer
            .call(move |c| {
                let who = claim::Claimant { host: &host, serial: Some(&serial), instance_id: &instance };
                claim::claim_as(c, who, max, clock.now_ms())
            })
            .await?;
        if !batch.is_empty() {
            crash_point("hub.claim.after_commit");
            metrics::counter!("baton_hub_deliveries_claimed_total").increment(batch.len() as u64);
            state.outcome_changed();
            return Ok(Json(ClaimResponse { deliveries: batch, cancels: Vec::new() }));
        }
        if Instant::now() >= deadline {
            return Ok(Json(ClaimResponse { deliveries: Vec::new(), cancels: Vec::new() }));
        }
        tokio::select! {
            _ = rx.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = state.shutdown.cancelled() => return Ok(Json(ClaimResponse { deliveries: Vec::new(), cancels: Vec::new() })),
        }
    }
}

/// Query of `GET /v1/holdings`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HoldingsQuery {
    instance_id: String,
}

/// `GET /v1/holdings?instance_id=`.
pub(super) async fn holdings(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<HoldingsQuery>,
) -> Result<Json<HoldingsResponse>, ApiError> {
    check_token("instance_id", &q.instance_id)?;
    let host = caller.name.clone();
    let deliveries = state.readers.read(move |c| claim::holdings(c, &host, &q.instance_id)).await?;
    caller.recheck(&state).await?;
    Ok(Json(HoldingsResponse { deliveries }))
}

fn check_holder(req: &HolderRequest) -> Result<(), ApiError> {
    check_token("instance_id", &req.instance_id)?;
    check_token("claim_token", &req.claim_token)?;
    Ok(())
}

/// A holder's step on one delivery: `claim::mirrored` or `claim::ack`.
type HolderStep =
    fn(&rusqlite::Connection, &str, &str, Holder<'_>, i64) -> crate::store::StoreResult<TransitionResponse>;

/// Runs a holder's step for the caller's host; the caller marks its crash point and answers.
async fn holder_step(
    caller: crate::http::Caller,
    state: &AppState,
    id: String,
    req: HolderRequest,
    step: HolderStep,
) -> Result<TransitionResponse, ApiError> {
    check_path_id("delivery_id", &id)?;
    check_holder(&req)?;
    let clock = state.clock.clone();
    let r = state
        .writer
        .call(move |c| {
            let h = Holder { instance_id: &req.instance_id, claim_token: &req.claim_token };
            step(c, &caller.name, &id, h, clock.now_ms())
        })
        .await?;
    Ok(r)
}

/// `POST /v1/deliveries/{id}/mirrored`.
pub(super) async fn mirrored(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<HolderRequest>,
) -> Result<Json<TransitionResponse>, ApiError> {
    let r = holder_step(caller, &state, id, req, claim::mirrored).await?;
    crash_point("hub.mirrored.after_commit");
    state.outcome_changed();
    Ok(Json(r))
}

/// `POST /v1/deliveries/{id}/ack`.
pub(super) async fn ack(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<HolderRequest>,
) -> Result<Json<TransitionResponse>, ApiError> {
    let r = holder_step(caller, &state, id, req, claim::ack).await?;
    crash_point("hub.ack.after_commit");
    state.outcome_changed();
    Ok(Json(r))
}

/// `POST /v1/deliveries/{id}/reject`.
pub(super) async fn reject(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<RejectRequest>,
) -> Result<Json<TransitionResponse>, ApiError> {
    check_path_id("delivery_id", &id)?;
    check_token("instance_id", &req.instance_id)?;
    check_token("claim_token", &req.claim_token)?;
    if req.reason.trim().is_empty() || req.reason.chars().count() > REASON_CHARS_MAX {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("reason: must be 1..={REASON_CHARS_MAX} characters"),
        ));
    }
    let clock = state.clock.clone();
    let r = state
        .writer
        .call(move |c| {
            let h = Holder { instance_id: &req.instance_id, claim_token: &req.claim_token };
            claim::reject(c, &caller.name, &id, h, &req.reason, clock.now_ms())
        })
        .await?;
    state.outcome_changed();
    Ok(Json(r))
}

/// `POST /delivery-report`.
pub(super) async fn report(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ReportRequest>,
) -> Result<(StatusCode, Json<ReportResponse>), ApiError> {
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
    let outcome = req.outcome;
    let delivery_id = req.delivery_id.clone();
    let clock = state.clock.clone();
    let (attempt, duplicate) = state
        .writer
        .call(move |c| {
            let r = NewReport {
                delivery_id: &req.delivery_id,
                holder: Holder { instance_id: &req.instance_id, claim_token: &req.claim_token },
                report_id: &req.report_id,
                outcome: req.outcome,
                exit_code: req.exit_code,
                duration_ms: req.duration_ms,
                result: req.result.as_deref(),
                reason: req.reason.as_deref(),
            };
            report::report(c, &caller.name, &r, clock.now_ms())
        })
        .await?;
    crash_point("hub.report.after_commit");
    if !duplicate {
        metrics::counter!("baton_hub_attempts_reported_total", "outcome" => outcome.as_str()).increment(1);
        state.outcome_changed();
    }
    let status = if duplicate { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, Json(ReportResponse { attempt, delivery_id, duplicate, retry_at_ms: None })))
}
