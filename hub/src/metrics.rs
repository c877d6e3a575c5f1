//! Every metric the hub exports, described once (`METRICS`: name, type, help), the build-info
//! gauge, the periodic gauges read from the record (per-host backlog and oldest waiting age,
//! deliveries by current-run outcome) and the Prometheus text the listeners serve.
//!
//! Invariant: every name passed to a `metrics::` macro anywhere in the hub is in `METRICS`, so
//! every sample on `/metrics` has its `# HELP` and `# TYPE` (a test scrapes the real hub).

use crate::http::Shared;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// What kind of metric a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution (exported as a summary).
    Histogram,
}

/// Every metric the hub records: name, kind and the help text on `/metrics`.
pub const METRICS: &[(&str, Kind, &str)] = &[
    ("baton_hub_build_info", Kind::Gauge, "Always 1; the version label is the running hub's version."),
    ("baton_hub_deliveries", Kind::Gauge, "Deliveries in the record, by state."),
    (
        "baton_hub_deliveries_by_outcome",
        Kind::Gauge,
        "Deliveries whose current run ended with this outcome (a run in progress or not yet reported is not counted).",
    ),
    ("baton_hub_fanout_pending", Kind::Gauge, "Accepted messages whose fan-out to deliveries is not done yet."),
    ("baton_hub_fences_active", Kind::Gauge, "Fences (pause, hold, block) not lifted."),
    ("baton_hub_host_backlog", Kind::Gauge, "Deliveries waiting for this host (queued or held)."),
    (
        "baton_hub_host_oldest_waiting_age_seconds",
        Kind::Gauge,
        "Age, since creation, of the oldest delivery waiting (queued or held) for this host; 0 when none waits.",
    ),
    ("baton_hub_deliveries_claimed_total", Kind::Counter, "Deliveries handed to nodes by claims."),
    ("baton_hub_attempts_reported_total", Kind::Counter, "Attempt reports recorded, by outcome."),
    ("baton_hub_messages_accepted_total", Kind::Counter, "New messages accepted."),
    (
        "baton_hub_messages_duplicate_total",
        Kind::Counter,
        "Submissions answered with an existing message (same idempotency key).",
    ),
    ("baton_hub_request_body_timeouts_total", Kind::Counter, "Requests whose body did not arrive in time (408)."),
    ("baton_hub_http_errors_total", Kind::Counter, "Error answers of the API, by error code."),
    ("baton_hub_write_batch_jobs", Kind::Histogram, "Write jobs folded into one committed transaction."),
    ("baton_hub_write_transaction_seconds", Kind::Histogram, "Time to run and commit one write transaction."),
    (
        "baton_hub_write_queue_wait_seconds",
        Kind::Histogram,
        "Time a write job waited for the writer thread before its transaction began (a busy writer shows here first).",
    ),
    ("baton_hub_write_transaction_failures_total", Kind::Counter, "Write transactions that failed and rolled back."),
    (
        "baton_hub_conflict_retries_total",
        Kind::Counter,
        "Operations run again because PostgreSQL ended their transaction in a deadlock (40P01) or a serialization failure (40001).",
    ),
    ("baton_hub_writer_jobs_total", Kind::Counter, "Write jobs run by the writer (each request step or batch is one)."),
    (
        "baton_hub_claim_looks_total",
        Kind::Counter,
        "Looks for claimable work by waiting claims (reads; only a look that finds work writes).",
    ),
    (
        "baton_hub_claims_at_commit_total",
        Kind::Counter,
        "Waiting claims run in the transaction of the accept that gave their host work (no wake-up, look or transaction of their own).",
    ),
    (
        "baton_hub_cert_cache_total",
        Kind::Counter,
        "Certificate standing checks answered from the in-memory cache or read from the record, by result.",
    ),
    ("baton_hub_tls_handshake_failures_total", Kind::Counter, "TLS handshakes that failed or timed out."),
    (
        "baton_hub_connections_refused_total",
        Kind::Counter,
        "Connections closed because a connection limit was reached, by limit.",
    ),
];

/// Describes every metric in `METRICS` to the installed recorder and sets the build-info
/// gauge. Called once, right after the recorder is installed.
pub fn describe() {
    for (name, kind, help) in METRICS {
        match kind {
            Kind::Counter => metrics::describe_counter!(*name, *help),
            Kind::Gauge => metrics::describe_gauge!(*name, *help),
            Kind::Histogram => metrics::describe_histogram!(*name, *help),
        }
    }
    metrics::gauge!("baton_hub_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

/// Refreshes the gauges read from the record: each host's backlog and oldest waiting age, and
/// deliveries by current-run outcome. Called from the hub's periodic gauge update.
pub async fn publish_record_gauges(shared: &Shared) {
    let read = shared.store.backlog_gauges().await;
    let (hosts, outcomes) = match read {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the backlog for the gauges");
            return;
        }
    };
    let now_ms = shared.clock.now_ms();
    for h in hosts {
        let age_ms = h.oldest_created_at_ms.map_or(0, |at| now_ms.saturating_sub(at).max(0));
        metrics::gauge!("baton_hub_host_backlog", "host" => h.host.clone()).set(h.waiting as f64);
        metrics::gauge!("baton_hub_host_oldest_waiting_age_seconds", "host" => h.host).set(age_ms as f64 / 1000.0);
    }
    for (outcome, n) in outcomes {
        metrics::gauge!("baton_hub_deliveries_by_outcome", "outcome" => outcome.as_str()).set(n as f64);
    }
}

/// The Prometheus text exposition, or 404 when no recorder could be installed.
pub fn render(shared: &Shared) -> Response {
    match &shared.metrics {
        Some(h) => ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], h.render()).into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are not enabled").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `metrics::counter!/gauge!/histogram!` name in the hub's source is described, with
    /// the kind it is recorded as; a new metric without a description fails here first.
    #[test]
    fn every_metric_recorded_in_the_source_is_described() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![src];
        let mut seen = Vec::new();
        while let Some(p) = files.pop() {
            if p.is_dir() {
                files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            for (macro_name, kind) in [
                ("metrics::counter!(\"", Kind::Counter),
                ("metrics::gauge!(\"", Kind::Gauge),
                ("metrics::histogram!(\"", Kind::Histogram),
            ] {
                for (i, _) in text.match_indices(macro_name) {
                    let rest = &text[i + macro_name.len()..];
                    let name = &rest[..rest.find('"').unwrap()];
                    seen.push((name.to_string(), kind, p.display().to_string()));
                }
            }
        }
        assert!(seen.len() > 10, "the scan found the hub's metrics: {seen:?}");
        for (name, kind, file) in seen {
            let described = METRICS.iter().find(|(n, _, _)| *n == name);
            assert_eq!(described.map(|(_, k, _)| *k), Some(kind), "{name} in {file} is not described as a {kind:?}");
        }
        let mut names: Vec<&str> = METRICS.iter().map(|(n, _, _)| *n).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), METRICS.len(), "each metric is described once");
    }
}
