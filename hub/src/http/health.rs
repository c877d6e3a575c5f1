//! Liveness, readiness and Prometheus metrics.

use super::{AppState, Caller};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Liveness: the process answers.
pub(super) async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// Readiness: the store is open, repair is done, and the hub is not shutting down.
pub(super) async fn readyz(State(state): State<AppState>) -> Response {
    if state.is_ready() {
        (StatusCode::OK, Json(json!({"ready": true}))).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"ready": false}))).into_response()
    }
}

/// Prometheus text exposition.
pub(super) async fn metrics(_caller: Caller, State(state): State<AppState>) -> Response {
    match &state.metrics {
        Some(h) => ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], h.render()).into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are not enabled").into_response(),
    }
}
