//! Every metric the hub exports, described once (`METRICS`: name, type, help), the buckets of
//! the histograms (`BUCKETS`), the build-info gauge, the periodic gauges read from the record
//! and the data directory (`publish_record_gauges`, `publish_file_gauges`), the request counter
//! both listeners count through (`count_requests`) and the Prometheus text they serve.
//!
//! Invariant: every name passed to a `metrics::` macro anywhere in the hub is in `METRICS`, so
//! every sample on `/metrics` has its `# HELP` and `# TYPE` (a test scrapes the real hub).
//! Invariant: labels are bounded sets: states, outcomes, scopes, roles, error codes, HTTP
//! status codes, route templates (never a raw path) and hosts (at most `metrics_hosts_max`);
//! never a conversation, message or delivery id.

use crate::datadir::DataDir;
use crate::runtime::Shared;
use axum::extract::{MatchedPath, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use baton_shared::pki;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What kind of metric a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution: exported as a Prometheus histogram when `BUCKETS` gives it buckets, as a
    /// summary otherwise.
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
    (
        "baton_hub_gauges_read_seconds",
        Kind::Gauge,
        "How long the last read of the record's gauges took; the next waits at least gauge_interval, longer when reads take more than gauge_read_share of the time.",
    ),
    ("baton_hub_fanout_pending", Kind::Gauge, "Accepted messages whose fan-out to deliveries is not done yet."),
    ("baton_hub_fences_active", Kind::Gauge, "Fences (pause, hold, block) not lifted."),
    ("baton_hub_fences_active_by_scope", Kind::Gauge, "Fences (pause, hold, block) not lifted, by scope."),
    ("baton_hub_host_backlog", Kind::Gauge, "Deliveries waiting for this host (queued or held)."),
    ("baton_hub_pool_queued", Kind::Gauge, "Deliveries queued for this pool, which any member host may claim."),
    (
        "baton_hub_pool_oldest_queued_age_seconds",
        Kind::Gauge,
        "Age, since creation, of the oldest delivery queued for this pool; 0 when none is queued.",
    ),
    (
        "baton_hub_host_oldest_waiting_age_seconds",
        Kind::Gauge,
        "Age, since creation, of the oldest delivery waiting (queued or held) for this host; 0 when none waits.",
    ),
    (
        "baton_hub_hosts_silent",
        Kind::Gauge,
        "Hosts whose open node session has sent nothing for longer than host_silence_warn (what status flags).",
    ),
    (
        "baton_hub_host_silent",
        Kind::Gauge,
        "1 while this host's open node session has sent nothing for longer than host_silence_warn, else 0.",
    ),
    (
        "baton_hub_host_last_contact_age_seconds",
        Kind::Gauge,
        "Seconds since this host's newest node session was last heard from (open or ended; hosts that never \
         opened one are not listed).",
    ),
    (
        "baton_hub_metrics_hosts_omitted",
        Kind::Gauge,
        "Hosts left out of the per-host series because there are more than metrics_hosts_max.",
    ),
    (
        "baton_hub_certificate_expires_in_seconds",
        Kind::Gauge,
        "Seconds until the earliest expiry, by role: node and producer (the longest-lasting unrevoked \
         certificate of each name in use), server (the hub's own) and ca (the CAs ca.crt trusts); negative once past.",
    ),
    ("baton_hub_turns_running", Kind::Gauge, "Turns running now: delivered, started on their node, not reported."),
    (
        "baton_hub_turn_oldest_running_age_seconds",
        Kind::Gauge,
        "Seconds the longest-running turn has run; 0 when none runs.",
    ),
    (
        "baton_hub_turns_running_on_silent_hosts",
        Kind::Gauge,
        "Turns running on hosts silent longer than host_silence_warn: their node stopped renewing them. Nothing \
         of them is handed to another host; an operator decides (retire records them unknown).",
    ),
    (
        "baton_hub_held_oldest_age_seconds",
        Kind::Gauge,
        "Age, since creation, of the held delivery first in queue order; 0 when none is held.",
    ),
    ("baton_hub_deliveries_claimed_total", Kind::Counter, "Deliveries handed to nodes by claims."),
    ("baton_hub_attempts_reported_total", Kind::Counter, "Attempt reports recorded, by outcome."),
    (
        "baton_hub_turn_duration_seconds",
        Kind::Histogram,
        "How long each reported turn ran, as its node measured it, by outcome.",
    ),
    (
        "baton_hub_accept_to_outcome_seconds",
        Kind::Histogram,
        "From a message's acceptance to the report that settled its delivery (no retry following), by outcome.",
    ),
    ("baton_hub_messages_accepted_total", Kind::Counter, "New messages accepted."),
    (
        "baton_hub_messages_duplicate_total",
        Kind::Counter,
        "Submissions answered with an existing message (same idempotency key).",
    ),
    (
        "baton_hub_http_requests_total",
        Kind::Counter,
        "Requests answered, by listener (api, operator), route (the matched path template; unmatched for none) \
         and status code.",
    ),
    (
        "baton_hub_http_request_duration_seconds",
        Kind::Histogram,
        "Time to answer a request, by listener and route (a claim or read that waits counts its wait).",
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
        "baton_hub_postgres_round_trips_total",
        Kind::Counter,
        "Round trips to PostgreSQL: each waits for the server's answers to the statements sent in it (none on SQLite).",
    ),
    (
        "baton_hub_postgres_statements_total",
        Kind::Counter,
        "Statements sent to PostgreSQL, those pipelined ahead of another in one round trip included (none on SQLite).",
    ),
    (
        "baton_hub_conflict_retries_total",
        Kind::Counter,
        "Operations run again because PostgreSQL ended their transaction in a deadlock (40P01) or a serialization failure (40001).",
    ),
    ("baton_hub_writer_jobs_total", Kind::Counter, "Write jobs run by the writer (each request step or batch is one)."),
    (
        "baton_hub_batches_run_item_by_item_total",
        Kind::Counter,
        "Batches (submits, holder steps, reports) run again item by item, each in its own savepoint, because an item failed when they ran together.",
    ),
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

/// Buckets (upper bounds, seconds) of a turn: from a quick tool call to `exec_timeout`'s
/// largest value, a day.
const TURN_BUCKETS: &[f64] =
    &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0];
/// Buckets (seconds) of acceptance to outcome: a turn plus the wait before it, which a backlog
/// or a fence can stretch to days.
const LATENCY_BUCKETS: &[f64] =
    &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0, 604800.0];
/// Buckets (seconds) of answering one request; a long poll waits up to `long_poll_wait_max`.
const REQUEST_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The histograms exported with buckets (Prometheus histograms, which `histogram_quantile`
/// aggregates across hubs); every other `Kind::Histogram` is exported as a summary.
pub const BUCKETS: &[(&str, &[f64])] = &[
    ("baton_hub_turn_duration_seconds", TURN_BUCKETS),
    ("baton_hub_accept_to_outcome_seconds", LATENCY_BUCKETS),
    ("baton_hub_http_request_duration_seconds", REQUEST_BUCKETS),
];

/// The recorder's builder, with `BUCKETS` set (refused only for an empty list of buckets,
/// which a unit test rules out).
pub fn builder() -> Result<PrometheusBuilder, metrics_exporter_prometheus::BuildError> {
    BUCKETS.iter().try_fold(PrometheusBuilder::new(), |b, (name, buckets)| {
        b.set_buckets_for_metric(Matcher::Full((*name).to_string()), buckets)
    })
}

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

/// What the periodic gauges are measured against.
#[derive(Debug, Clone)]
pub struct GaugeWatch {
    /// `host_silence_warn`: the same rule `status` flags silent hosts by.
    pub host_silence_warn: Duration,
    /// `metrics_hosts_max`: most hosts given per-host series.
    pub hosts_max: usize,
    /// `gauge_interval`: the least wait between two reads of the gauges.
    pub interval: Duration,
    /// `gauge_read_share`: most of the time, in percent, the reads may take.
    pub read_share: u32,
    /// The data directory, for the server certificate and the CA bundle.
    pub dir: DataDir,
}

/// How long the gauges wait after a read of the record that took `took`: at least `interval`,
/// and long enough that reading takes at most `read_share` percent of the time
/// (`took x (100 - share) / share`), so a record too large to count cheaply (the outcome
/// counts read every finished delivery kept) is read less often instead of keeping a core busy.
pub fn gauge_wait(interval: Duration, read_share: u32, took: Duration) -> Duration {
    let share = read_share.clamp(1, 100);
    interval.max(took.saturating_mul(100 - share) / share)
}

/// Set once the per-host series were first cut at `metrics_hosts_max` (logged once).
static HOSTS_CUT_LOGGED: AtomicBool = AtomicBool::new(false);

/// Seconds between two unix-ms moments, never negative.
fn seconds_since(now_ms: i64, at_ms: i64) -> f64 {
    now_ms.saturating_sub(at_ms).max(0) as f64 / 1000.0
}

/// Refreshes the gauges read from the record: per host (the first `metrics_hosts_max` by
/// name) its backlog, oldest waiting age, silence and last contact; silent hosts, deliveries
/// by current-run outcome, running turns, the oldest held delivery, fences by scope and the
/// node and producer certificates' earliest expiry. Called from the hub's periodic gauge update.
pub async fn publish_record_gauges(shared: &Shared, watch: &GaugeWatch) {
    let now_ms = shared.clock.now_ms();
    let g = match shared.store.record_gauges(now_ms, watch.host_silence_warn).await {
        Ok(g) => g,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the record for the gauges");
            return;
        }
    };
    // Hosts are the operator's own enrolled set, so `host` is a bounded label; the bound is
    // `metrics_hosts_max`, beyond which the hosts last by name get no series of their own.
    let omitted = g.backlogs.len().max(g.contacts.len()).saturating_sub(watch.hosts_max);
    metrics::gauge!("baton_hub_metrics_hosts_omitted").set(omitted as f64);
    if omitted > 0 && !HOSTS_CUT_LOGGED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            omitted,
            metrics_hosts_max = watch.hosts_max,
            "more hosts than metrics_hosts_max: the hosts last by name get no per-host series (raise metrics_hosts_max)"
        );
    }
    for h in g.backlogs.into_iter().take(watch.hosts_max) {
        let age = h.oldest_created_at_ms.map_or(0.0, |at| seconds_since(now_ms, at));
        metrics::gauge!("baton_hub_host_backlog", "host" => h.host.clone()).set(h.waiting as f64);
        metrics::gauge!("baton_hub_host_oldest_waiting_age_seconds", "host" => h.host).set(age);
    }
    for (host, last_ms) in g.contacts.into_iter().take(watch.hosts_max) {
        let silent = if g.silent.contains(&host) { 1.0 } else { 0.0 };
        metrics::gauge!("baton_hub_host_silent", "host" => host.clone()).set(silent);
        metrics::gauge!("baton_hub_host_last_contact_age_seconds", "host" => host).set(seconds_since(now_ms, last_ms));
    }
    // Pools are operator-made and few; the same bound as the hosts keeps the label bounded.
    for p in g.pools.into_iter().take(watch.hosts_max) {
        let age = p.oldest_queued_at_ms.map_or(0.0, |at| seconds_since(now_ms, at));
        metrics::gauge!("baton_hub_pool_queued", "pool" => p.name.clone()).set(p.queued as f64);
        metrics::gauge!("baton_hub_pool_oldest_queued_age_seconds", "pool" => p.name).set(age);
    }
    metrics::gauge!("baton_hub_hosts_silent").set(g.silent.len() as f64);
    for (outcome, n) in g.outcomes {
        metrics::gauge!("baton_hub_deliveries_by_outcome", "outcome" => outcome.as_str()).set(n as f64);
    }
    metrics::gauge!("baton_hub_turns_running").set(g.running as f64);
    let oldest_running = g.oldest_running_started_ms.map_or(0.0, |at| seconds_since(now_ms, at));
    metrics::gauge!("baton_hub_turn_oldest_running_age_seconds").set(oldest_running);
    metrics::gauge!("baton_hub_turns_running_on_silent_hosts").set(g.running_silent as f64);
    let oldest_held = g.oldest_held_created_ms.map_or(0.0, |at| seconds_since(now_ms, at));
    metrics::gauge!("baton_hub_held_oldest_age_seconds").set(oldest_held);
    for (scope, n) in g.fences {
        metrics::gauge!("baton_hub_fences_active_by_scope", "scope" => scope.as_str()).set(n as f64);
    }
    let now_unix = now_ms / 1000;
    for (role, not_after) in g.cert_expiry {
        if let Some(at) = not_after {
            metrics::gauge!("baton_hub_certificate_expires_in_seconds", "role" => role.as_str())
                .set(at.saturating_sub(now_unix) as f64);
        }
    }
}

/// The earliest expiry (unix seconds) of the hub's server certificate and of the CAs `ca.crt`
/// trusts, read from the data directory; a file that cannot be read is an error naming it.
pub fn file_expiries(dir: &DataDir) -> Result<[(&'static str, i64); 2], String> {
    let read = |p: &std::path::Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    let server = dir.server_cert();
    let (_, server_after) = pki::cert_facts(&read(&server)?).map_err(|e| format!("{}: {e}", server.display()))?;
    let ca = dir.ca_cert();
    let named = |e: pki::PkiError| format!("{}: {e}", ca.display());
    let mut ca_after = i64::MAX;
    for der in pki::pem_certs(&read(&ca)?).map_err(named)? {
        ca_after = ca_after.min(pki::der_facts(&der).map_err(named)?.1);
    }
    Ok([("server", server_after), ("ca", ca_after)])
}

/// Refreshes the expiry gauges of the hub's server certificate and CA bundle at `now_ms`.
pub fn publish_file_gauges(dir: &DataDir, now_ms: i64) {
    match file_expiries(dir) {
        Ok(expiries) => {
            for (role, at) in expiries {
                metrics::gauge!("baton_hub_certificate_expires_in_seconds", "role" => role)
                    .set(at.saturating_sub(now_ms / 1000) as f64);
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not read the hub's certificates for the expiry gauges"),
    }
}

/// The route label of a request: the path template it matched (`/v1/deliveries/{delivery_id}/ack`),
/// never the raw path, or `unmatched`.
fn route_of(req: &Request) -> String {
    req.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string())
}

/// Counts and times every request of the API listener (`baton_hub_http_requests_total`,
/// `baton_hub_http_request_duration_seconds`), labelled `listener="api"`.
pub async fn count_api_requests(req: Request, next: Next) -> Response {
    count_requests("api", req, next).await
}

/// As `count_api_requests`, for the operator listener (`listener="operator"`).
pub async fn count_operator_requests(req: Request, next: Next) -> Response {
    count_requests("operator", req, next).await
}

async fn count_requests(listener: &'static str, req: Request, next: Next) -> Response {
    let route = route_of(&req);
    let started = Instant::now();
    let resp = next.run(req).await;
    let code = resp.status().as_u16().to_string();
    metrics::histogram!("baton_hub_http_request_duration_seconds", "listener" => listener, "route" => route.clone())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!("baton_hub_http_requests_total", "listener" => listener, "route" => route, "code" => code)
        .increment(1);
    resp
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

    /// The gauges wait `gauge_interval` after a quick read, and after a slow one long enough
    /// that reading takes no more than `gauge_read_share` of the time.
    #[test]
    fn a_slow_gauge_read_stretches_the_wait_to_its_share() {
        let s = std::time::Duration::from_secs;
        let ms = std::time::Duration::from_millis;
        assert_eq!(gauge_wait(s(10), 5, ms(20)), s(10), "a quick read waits the interval");
        assert_eq!(gauge_wait(s(10), 5, s(2)), s(38), "2 s at 5 %: 38 s of wait");
        let took = ms(2_345);
        let wait = gauge_wait(s(10), 5, took);
        assert!(took.as_secs_f64() / (took + wait).as_secs_f64() <= 0.05 + 1e-9);
        assert_eq!(gauge_wait(s(10), 100, s(30)), s(10), "a share of 100 % never waits longer");
        assert_eq!(gauge_wait(s(1), 50, s(3)), s(3));
        assert_eq!(gauge_wait(s(10), 0, s(1)), s(99), "a share below 1 % counts as 1 %");
    }

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

    /// Every entry of `BUCKETS` is a described histogram with increasing buckets.
    #[test]
    fn bucketed_metrics_are_described_histograms() {
        for (name, buckets) in BUCKETS {
            assert_eq!(METRICS.iter().find(|(n, _, _)| n == name).map(|(_, k, _)| *k), Some(Kind::Histogram), "{name}");
            assert!(!buckets.is_empty() && buckets.windows(2).all(|w| w[0] < w[1]), "{name}: {buckets:?}");
        }
    }

    /// The recorder `builder` makes exports the bucketed metrics as histograms (with `le`
    /// buckets, `_sum` and `_count`) and the others as summaries.
    #[test]
    fn bucketed_metrics_render_as_histograms() {
        let recorder = builder().unwrap().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            metrics::histogram!("baton_hub_turn_duration_seconds", "outcome" => "succeeded").record(3.0);
            metrics::histogram!("baton_hub_write_transaction_seconds").record(0.01);
        });
        let text = handle.render();
        assert!(text.contains("baton_hub_turn_duration_seconds_bucket{outcome=\"succeeded\",le=\"5\"} 1"), "{text}");
        assert!(text.contains("baton_hub_turn_duration_seconds_bucket{outcome=\"succeeded\",le=\"2.5\"} 0"), "{text}");
        assert!(text.contains("baton_hub_turn_duration_seconds_count{outcome=\"succeeded\"} 1"), "{text}");
        assert!(text.contains("baton_hub_write_transaction_seconds{quantile="), "a summary still: {text}");
    }
}
