//! Liveness, readiness and Prometheus metrics: served on the mTLS listener (metrics to any
//! enrolled caller) and, with no client certificate, on the operator listener
//! (`ops_listener`), where a load balancer or a scraper can reach them.

use super::Caller;
use crate::runtime::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Liveness: the process answers.
pub(crate) async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// Readiness: the store is open, repair is done, and the hub is not shutting down.
pub(crate) async fn readyz(State(state): State<AppState>) -> Response {
    if state.is_ready() {
        (StatusCode::OK, Json(json!({"ready": true}))).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"ready": false}))).into_response()
    }
}

/// Prometheus text exposition, to an enrolled caller.
pub(super) async fn metrics(_caller: Caller, State(state): State<AppState>) -> Response {
    crate::metrics::render(&state)
}

/// Prometheus text exposition, with no caller check: only the operator listener routes it.
pub(crate) async fn metrics_open(State(state): State<AppState>) -> Response {
    crate::metrics::render(&state)
}
