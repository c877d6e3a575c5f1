//! Events feeds and running turns: a producer follows a message's events
//! (`GET /v1/messages/{message_id}/events`) or its own messages' events in a conversation
//! (`GET /v1/conversations/{conversation}/events`) from a cursor, long-polling for the next
//! ones; a node says which turns run and forwards their progress (`POST /v1/running`).
//!
//! Reading rule for a conversation's feed: a producer reads it only where its publish scope
//! covers the conversation (403 `forbidden` otherwise, whether or not it exists), and it carries
//! only that producer's own messages' events: another producer's payloads, progress and
//! outcomes in the same conversation are never shown to it.
//!
//! The horizon (`store::views::feed`): on PostgreSQL a feed answers only positions no later commit can
//! go below. When only claims' and holders' steps' events wait above the horizon, the hub moves it with one barrier
//! transaction, shared by every feed reader of this hub (`FeedHorizon`): the highest horizon a
//! barrier gave is kept and used by every later read, and at most one barrier runs at a time
//! (`runtime::FeedHorizon`).

use super::node::Session;
use super::{ApiError, ApiJson, ApiQuery, NodeCaller, ProducerCaller, check_path_id};
use crate::runtime::AppState;
use crate::store::registry::sessions::NodeAt;
use crate::store::views::feed::{FeedPage, FeedScope, PageBounds, parse_cursor};
use axum::Json;
use axum::extract::{Path, State};
use baton_shared::error::ErrorCode;
use baton_shared::ids::{check_name, check_token};
use baton_shared::limits::{BATCH_ITEMS_MAX, FEED_PAGE_MAX_RANGE, PROGRESS_EVENTS_PER_REQUEST_MAX};
use baton_shared::wire::{EventsPage, RunningRequest, RunningResponse, SESSION_HEADER};
use serde::Deserialize;
use std::time::Duration;
use tokio::time::Instant;

/// Query of the message feed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MessageFeedQuery {
    after: Option<String>,
    wait_ms: Option<u64>,
    limit: Option<u32>,
}

/// Query of the conversation feed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ConversationFeedQuery {
    after: Option<String>,
    wait_ms: Option<u64>,
    limit: Option<u32>,
}

/// `GET /v1/messages/{message_id}/events?after=&wait_ms=&limit=`.
pub(super) async fn message_events(
    ProducerCaller(caller): ProducerCaller,
    State(state): State<AppState>,
    Path(message_id): Path<String>,
    ApiQuery(q): ApiQuery<MessageFeedQuery>,
) -> Result<Json<EventsPage>, ApiError> {
    check_path_id("message_id", &message_id)?;
    let scope = FeedScope::Message { message_id, producer: caller.name.clone() };
    let page = follow(&state, scope, q.after.as_deref(), q.wait_ms, q.limit).await?;
    caller.recheck(&state).await?;
    Ok(Json(answer(page)))
}

/// `GET /v1/conversations/{conversation}/events?after=&wait_ms=&limit=`.
pub(super) async fn conversation_events(
    ProducerCaller(caller): ProducerCaller,
    State(state): State<AppState>,
    Path(conversation): Path<String>,
    ApiQuery(q): ApiQuery<ConversationFeedQuery>,
) -> Result<Json<EventsPage>, ApiError> {
    check_name("conversation", &conversation)?;
    let scope = FeedScope::Conversation { conversation, producer: caller.name.clone() };
    let page = follow(&state, scope, q.after.as_deref(), q.wait_ms, q.limit).await?;
    caller.recheck(&state).await?;
    Ok(Json(answer(page)))
}

fn answer(page: FeedPage) -> EventsPage {
    EventsPage { events: page.events, next_cursor: page.next.to_string(), settled: page.settled }
}

/// Reads the feed after `after`; with `wait_ms`, waits until it has items (or the wait
/// elapses, or the hub shuts down), re-reading whenever a delivery moved, an outcome or
/// progress landed.
async fn follow(
    state: &AppState,
    scope: FeedScope,
    after: Option<&str>,
    wait_ms: Option<u64>,
    limit: Option<u32>,
) -> Result<FeedPage, ApiError> {
    let after = after.map(parse_cursor).transpose().map_err(|e| ApiError::new(ErrorCode::BadCursor, e))?;
    let (lo, hi) = FEED_PAGE_MAX_RANGE;
    let limit = match limit {
        None => state.limits.feed_page_max,
        Some(n) if (lo..=hi).contains(&n) => n.min(state.limits.feed_page_max),
        Some(n) => {
            return Err(ApiError::new(
                ErrorCode::InvalidField,
                format!("limit: {n} is out of range; allowed {lo}..={hi}"),
            ));
        }
    };
    let bounds = PageBounds { limit, bytes_max: state.limits.feed_page_bytes_max };
    let wait = Duration::from_millis(wait_ms.unwrap_or(0)).min(state.limits.long_poll_wait_max);
    let deadline = Instant::now() + wait;
    let mut after = after;
    let mut again = 0;
    loop {
        let mut rx = state.outcomes.subscribe();
        let page = state.store.feed_page(scope.clone(), after, state.feed_horizon.known(), bounds).await?;
        if !page.events.is_empty() || again >= FEED_READS_AT_ONCE_MAX {
            return Ok(page);
        }
        if page.more || page.pending_above {
            // More positions to look through, or events or outcomes of claims, holders' steps
            // or reports wait above the horizon (then move it): read again at once.
            if page.pending_above {
                state.feed_horizon.move_past(&state.store, page.next).await?;
            }
            again += 1;
            after = Some(page.next);
            continue;
        }
        again = 0;
        if wait.is_zero() || Instant::now() >= deadline {
            return Ok(page);
        }
        // Nothing new up to `next`: the next read starts there (the same answer, less to read).
        after = Some(page.next);
        tokio::select! {
            _ = rx.changed() => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = state.shutdown.cancelled() => return Ok(page),
        }
    }
}

/// Most reads one feed request makes in a row without waiting (each a window of positions, or
/// the read after a barrier) before it answers what it has: a bound on one request's work.
pub const FEED_READS_AT_ONCE_MAX: u32 = 4;

/// `POST /v1/running`: the node's running turns and their progress, in one request per pass.
pub(super) async fn running(
    NodeCaller(caller): NodeCaller,
    State(state): State<AppState>,
    Session(session): Session,
    ApiJson(req): ApiJson<RunningRequest>,
) -> Result<Json<RunningResponse>, ApiError> {
    check_token("instance_id", &req.instance_id)?;
    let Some(session) = session else {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("{SESSION_HEADER}: required to renew turns (register one with POST /v1/sessions)"),
        ));
    };
    if req.turns.len() > BATCH_ITEMS_MAX {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("turns: {} turns; at most {BATCH_ITEMS_MAX} in one request", req.turns.len()),
        ));
    }
    let events: usize = req.turns.iter().map(|t| t.events.len()).sum();
    if events > PROGRESS_EVENTS_PER_REQUEST_MAX {
        return Err(ApiError::new(
            ErrorCode::InvalidField,
            format!("turns[].events: {events} events; at most {PROGRESS_EVENTS_PER_REQUEST_MAX} in one request"),
        ));
    }
    for (i, t) in req.turns.iter().enumerate() {
        check_path_id("delivery_id", &t.delivery_id)
            .map_err(|e| ApiError::new(ErrorCode::InvalidField, format!("turns[{i}].{}", e.message)))?;
        check_token("claim_token", &t.claim_token)
            .map_err(|e| ApiError::new(ErrorCode::InvalidField, format!("turns[{i}].{}", ApiError::from(e).message)))?;
        if t.attempt == 0 {
            return Err(ApiError::new(ErrorCode::InvalidField, format!("turns[{i}].attempt: must be at least 1")));
        }
        if let Some(e) = t.events.iter().find(|e| e.seq == 0 || e.seq > i64::MAX as u64) {
            return Err(ApiError::new(
                ErrorCode::InvalidField,
                format!("turns[{i}].events[].seq: {} is out of range; allowed 1..={}", e.seq, i64::MAX),
            ));
        }
        if t.dropped.is_some_and(|d| d > i64::MAX as u64) {
            return Err(ApiError::new(ErrorCode::InvalidField, format!("turns[{i}].dropped: out of range")));
        }
    }
    let wrote = events > 0;
    let node = NodeAt { host: caller.name.clone(), session: Some(session) };
    let turns = state.store.running(node, req.instance_id, req.turns, state.limits.progress).await?;
    state.turns.contact(&caller.name, Some(session), state.clock.now_ms());
    if wrote && turns.iter().any(|t| t.kept > 0) {
        // Followers of these messages' feeds read again.
        state.outcome_changed();
    }
    Ok(Json(RunningResponse { turns }))
}
