//! What the node tells a monitoring system, and the hub's reachability as the node sees it:
//! `Watched` wraps the `Hub` the agent is given and notes every request's fate in
//! `NodeMetrics` (answered or not, claims, reports), logging once, at info, when the hub answers
//! again after it could not be reached; `serve` answers `GET /metrics` (Prometheus text) on the
//! plain-HTTP listener `metrics_listen` names (off unless configured).
//!
//! Every metric is described once (`NODE_METRICS`: name, kind, help) and rendered with its
//! `# HELP` and `# TYPE`. The queue, running and outbox gauges are read from the store at each
//! scrape, by the definitions `baton-node status` uses (`Db::gauges`). No label holds a
//! delivery, conversation or message id.

use crate::client::Hub;
use crate::limits::{METRICS_CONNECTIONS_MAX, METRICS_HEADER_READ_TIMEOUT};
use crate::store::{Gauges, Store};
use baton_client::{ClientError, ItemAnswer};
use baton_shared::clock::SharedClock;
use baton_shared::wire::{
    ClaimResponse, ClaimedDelivery, HolderItem, ReportRequest, ReportResponse, RunningTurnItem, RunningTurnResult,
    SessionResponse, StartItem, StartResult, TransitionResponse,
};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// What kind of metric a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// Every metric the node exports: name, kind and the help text on `/metrics`.
pub const NODE_METRICS: &[(&str, Kind, &str)] = &[
    ("baton_node_build_info", Kind::Gauge, "Always 1; the version label is the running node's version."),
    (
        "baton_node_queue_ahead",
        Kind::Gauge,
        "Turns mirrored here and waiting to start (what queue_ahead_batches bounds).",
    ),
    ("baton_node_turns_running", Kind::Gauge, "Turns running: a start marker and no end marker."),
    ("baton_node_outbox_depth", Kind::Gauge, "Attempt reports waiting for the hub's confirmation."),
    (
        "baton_node_outbox_oldest_age_seconds",
        Kind::Gauge,
        "Age of the oldest attempt report waiting for the hub's confirmation; 0 when none waits.",
    ),
    ("baton_node_outbox_dead", Kind::Gauge, "Attempt reports the hub refused for good (listed by status)."),
    (
        "baton_node_hub_reachable",
        Kind::Gauge,
        "1 when the node's latest request to the hub was answered (any answer, a refusal too), 0 when it got \
         none or none was sent yet.",
    ),
    (
        "baton_node_hub_last_contact_age_seconds",
        Kind::Gauge,
        "Seconds since the hub last answered a request of this node (since the node started, before the first).",
    ),
    ("baton_node_hub_requests_total", Kind::Counter, "Requests sent to the hub (each hub call, whatever came of it)."),
    (
        "baton_node_hub_requests_unanswered_total",
        Kind::Counter,
        "Requests to the hub that got no answer at all (refused connection, reset, TLS failure, timeout).",
    ),
    ("baton_node_claim_requests_total", Kind::Counter, "Claim requests (long polls) sent to the hub."),
    ("baton_node_deliveries_claimed_total", Kind::Counter, "Deliveries the hub handed to this node in claims."),
    (
        "baton_node_reports_total",
        Kind::Counter,
        "Attempt reports sent, by result: confirmed (recorded by the hub), refused (a refusal, passing or for \
         good), unanswered (no answer).",
    ),
    (
        "baton_node_progress_sent_total",
        Kind::Counter,
        "Progress events of running turns forwarded to the hub (answered; the hub may still drop some past its own bounds).",
    ),
    (
        "baton_node_progress_dropped_total",
        Kind::Counter,
        "Progress events dropped by the node, by reason: too_large, not_an_object, over_count, over_rate, \
         buffer_full (the hub did not answer for long), not_running (the hub has the run's outcome).",
    ),
];

/// The node's counters and the hub's reachability as the node sees it. One per node process,
/// shared by `Watched` and the metrics listener.
#[derive(Debug)]
pub struct NodeMetrics {
    started: Instant,
    requests: AtomicU64,
    unanswered: AtomicU64,
    claims: AtomicU64,
    claimed: AtomicU64,
    reports_confirmed: AtomicU64,
    reports_refused: AtomicU64,
    reports_unanswered: AtomicU64,
    contact: Mutex<Contact>,
}

/// The hub's reachability: the latest answer and the outage in progress.
#[derive(Debug, Default)]
struct Contact {
    /// When the hub last answered.
    last_answer: Option<Instant>,
    /// Whether the latest request was answered.
    reachable: bool,
    /// Since when the hub has not answered (the first unanswered request of a run of them),
    /// and how many requests went unanswered since.
    lost: Option<(Instant, u64)>,
}

impl Default for NodeMetrics {
    fn default() -> Self {
        NodeMetrics::new()
    }
}

impl NodeMetrics {
    /// Fresh counters; the hub not heard from yet.
    pub fn new() -> NodeMetrics {
        NodeMetrics {
            started: Instant::now(),
            requests: AtomicU64::new(0),
            unanswered: AtomicU64::new(0),
            claims: AtomicU64::new(0),
            claimed: AtomicU64::new(0),
            reports_confirmed: AtomicU64::new(0),
            reports_refused: AtomicU64::new(0),
            reports_unanswered: AtomicU64::new(0),
            contact: Mutex::new(Contact::default()),
        }
    }

    fn contact(&self) -> std::sync::MutexGuard<'_, Contact> {
        self.contact.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes a request's fate: no answer at all (`ClientError::unreachable`), or an answer. The
    /// first answer after unanswered requests logs, once, how long the hub was out of reach and
    /// how many requests failed meanwhile.
    pub fn request<T>(&self, answer: &Result<T, ClientError>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut c = self.contact();
        if answer.as_ref().err().is_some_and(ClientError::unreachable) {
            self.unanswered.fetch_add(1, Ordering::Relaxed);
            c.reachable = false;
            c.lost.get_or_insert((now, 0)).1 += 1;
            return;
        }
        c.reachable = true;
        c.last_answer = Some(now);
        if let Some((since, failed)) = c.lost.take() {
            drop(c);
            let after = now.duration_since(since);
            tracing::info!(
                unreachable_ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
                failed_requests = failed,
                "hub reachable again after {:.1}s, {failed} request(s) failed meanwhile",
                after.as_secs_f64()
            );
        }
    }

    /// Notes the reports of one request (`n` of them) that got no answer, or a refusal of the
    /// whole request.
    fn reports_failed(&self, n: usize, e: &ClientError) {
        let counter = if e.unreachable() { &self.reports_unanswered } else { &self.reports_refused };
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Notes one report's answer.
    fn report_answered<T>(&self, answer: &Result<T, ClientError>) {
        let counter = if answer.is_ok() { &self.reports_confirmed } else { &self.reports_refused };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of these counters and of `gauges` (read from the store),
    /// `None` when the store could not be read.
    pub fn render(&self, gauges: Option<Gauges>, now_ms: i64) -> String {
        let (reachable, last_answer) = {
            let c = self.contact();
            (c.reachable, c.last_answer)
        };
        let contact_age = last_answer.unwrap_or(self.started).elapsed().as_secs_f64();
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed).to_string();
        let mut samples: Vec<(&str, String, String)> = vec![
            ("baton_node_build_info", format!("{{version=\"{}\"}}", env!("CARGO_PKG_VERSION")), "1".into()),
            ("baton_node_hub_reachable", String::new(), if reachable { "1" } else { "0" }.into()),
            ("baton_node_hub_last_contact_age_seconds", String::new(), format!("{contact_age:.3}")),
            ("baton_node_hub_requests_total", String::new(), load(&self.requests)),
            ("baton_node_hub_requests_unanswered_total", String::new(), load(&self.unanswered)),
            ("baton_node_claim_requests_total", String::new(), load(&self.claims)),
            ("baton_node_deliveries_claimed_total", String::new(), load(&self.claimed)),
            ("baton_node_reports_total", "{result=\"confirmed\"}".into(), load(&self.reports_confirmed)),
            ("baton_node_reports_total", "{result=\"refused\"}".into(), load(&self.reports_refused)),
            ("baton_node_reports_total", "{result=\"unanswered\"}".into(), load(&self.reports_unanswered)),
        ];
        let (sent, dropped) = crate::progress::counters();
        samples.push(("baton_node_progress_sent_total", String::new(), sent.to_string()));
        for (why, n) in dropped {
            samples.push((
                "baton_node_progress_dropped_total",
                format!("{{reason=\"{}\"}}", why.as_str()),
                n.to_string(),
            ));
        }
        if let Some(g) = gauges {
            let oldest = g.oldest_awaiting_ms.map_or(0.0, |at| now_ms.saturating_sub(at).max(0) as f64 / 1000.0);
            samples.extend([
                ("baton_node_queue_ahead", String::new(), g.queued.to_string()),
                ("baton_node_turns_running", String::new(), g.running.to_string()),
                ("baton_node_outbox_depth", String::new(), g.awaiting_report.to_string()),
                ("baton_node_outbox_oldest_age_seconds", String::new(), format!("{oldest:.3}")),
                ("baton_node_outbox_dead", String::new(), g.dead_reports.to_string()),
            ]);
        }
        let mut out = String::new();
        for (name, kind, help) in NODE_METRICS {
            let mut of_name = samples.iter().filter(|(n, _, _)| n == name).peekable();
            if of_name.peek().is_none() {
                continue;
            }
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {}", kind.as_str());
            for (_, labels, value) in of_name {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        }
        out
    }
}

/// A `Hub` whose every request is noted in `NodeMetrics` (see `NodeMetrics::request`).
pub struct Watched<H> {
    inner: H,
    metrics: Arc<NodeMetrics>,
}

impl<H: Hub> Watched<H> {
    /// Wraps `inner`, noting into `metrics`.
    pub fn new(inner: H, metrics: Arc<NodeMetrics>) -> Watched<H> {
        Watched { inner, metrics }
    }

    fn seen<T>(&self, answer: Result<T, ClientError>) -> Result<T, ClientError> {
        self.metrics.request(&answer);
        answer
    }
}

impl<H: Hub> Hub for Watched<H> {
    async fn register_session(&self) -> Result<SessionResponse, ClientError> {
        self.seen(self.inner.register_session().await)
    }
    async fn end_session(&self) -> Result<(), ClientError> {
        self.seen(self.inner.end_session().await)
    }
    async fn claim(&self, max: u32, wait: Duration) -> Result<ClaimResponse, ClientError> {
        self.metrics.claims.fetch_add(1, Ordering::Relaxed);
        let answer = self.seen(self.inner.claim(max, wait).await);
        if let Ok(r) = &answer {
            self.metrics.claimed.fetch_add(r.deliveries.len() as u64, Ordering::Relaxed);
        }
        answer
    }
    async fn starts(&self, items: Vec<StartItem>) -> Result<Vec<StartResult>, ClientError> {
        self.seen(self.inner.starts(items).await)
    }
    async fn holdings(&self) -> Result<Vec<ClaimedDelivery>, ClientError> {
        self.seen(self.inner.holdings().await)
    }
    async fn mirrored(&self, delivery_id: &str, claim_token: &str) -> Result<TransitionResponse, ClientError> {
        self.seen(self.inner.mirrored(delivery_id, claim_token).await)
    }
    async fn ack(&self, delivery_id: &str, claim_token: &str) -> Result<TransitionResponse, ClientError> {
        self.seen(self.inner.ack(delivery_id, claim_token).await)
    }
    async fn reject(
        &self,
        delivery_id: &str,
        claim_token: &str,
        reason: &str,
    ) -> Result<TransitionResponse, ClientError> {
        self.seen(self.inner.reject(delivery_id, claim_token, reason).await)
    }
    async fn report(&self, body: &ReportRequest) -> Result<ReportResponse, ClientError> {
        let answer = self.seen(self.inner.report(body).await);
        match &answer {
            Err(e) if e.unreachable() => self.metrics.reports_failed(1, e),
            other => self.metrics.report_answered(other),
        }
        answer
    }
    async fn mirrored_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        self.seen(self.inner.mirrored_batch(items).await)
    }
    async fn ack_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        self.seen(self.inner.ack_batch(items).await)
    }
    async fn handoff_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        self.seen(self.inner.handoff_batch(items).await)
    }
    async fn report_batch(&self, reports: Vec<ReportRequest>) -> Result<Vec<ItemAnswer<ReportResponse>>, ClientError> {
        let n = reports.len();
        let answer = self.seen(self.inner.report_batch(reports).await);
        match &answer {
            Ok(items) => items.iter().for_each(|a| self.metrics.report_answered(a)),
            Err(e) => self.metrics.reports_failed(n, e),
        }
        answer
    }
    async fn running(&self, turns: Vec<RunningTurnItem>) -> Result<Vec<RunningTurnResult>, ClientError> {
        self.seen(self.inner.running(turns).await)
    }
    fn hub_moves(&self) -> u64 {
        self.inner.hub_moves()
    }
}

/// What the metrics listener reads at each scrape.
#[derive(Clone)]
pub struct Scrape {
    /// The counters and the hub's reachability.
    pub metrics: Arc<NodeMetrics>,
    /// The node store, for the queue, running and outbox gauges.
    pub store: Store,
    /// The node's clock (the outbox's ages are against stored times).
    pub clock: SharedClock,
}

impl Scrape {
    /// The `/metrics` text now. A store that cannot be read leaves its gauges out (and is
    /// logged): the counters and the hub's reachability are still worth a scrape.
    async fn text(&self) -> String {
        let gauges = match self.store.call(|db| db.gauges()).await {
            Ok(g) => Some(g),
            Err(e) => {
                tracing::warn!(error = %e, "metrics: could not read the node store");
                None
            }
        };
        self.metrics.render(gauges, self.clock.now_ms())
    }
}

/// Answers one request: `GET /metrics` (or `HEAD`), 404 for any other path, 405 for another
/// method.
async fn answer(scrape: Scrape, req: hyper::Request<hyper::body::Incoming>) -> hyper::Response<String> {
    let status = |code: u16, body: &str| {
        let mut r = hyper::Response::new(body.to_string());
        *r.status_mut() = hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
        r
    };
    if req.uri().path() != "/metrics" {
        return status(404, "not found: the node serves /metrics only\n");
    }
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return status(405, "method not allowed: GET /metrics\n");
    }
    let mut r = hyper::Response::new(scrape.text().await);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// Serves `/metrics` on `listener` (HTTP/1, no TLS) until the task is dropped: at most
/// `METRICS_CONNECTIONS_MAX` connections at once (one more is closed at accept), each given
/// `METRICS_HEADER_READ_TIMEOUT` to send its request headers.
pub async fn serve(listener: TcpListener, scrape: Scrape) {
    let slots = Arc::new(tokio::sync::Semaphore::new(METRICS_CONNECTIONS_MAX));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "metrics listener: {METRICS_CONNECTIONS_MAX} connections open; closing one more");
            drop(stream);
            continue;
        };
        let scrape = scrape.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let scrape = scrape.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(scrape, req).await) }
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(METRICS_HEADER_READ_TIMEOUT);
            if let Err(e) = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await {
                tracing::debug!(%peer, error = %e, "metrics listener: connection ended");
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreachable() -> ClientError {
        ClientError::Transport { maybe_sent: false, detail: "connection refused".into() }
    }

    /// Every sample rendered is described, with its kind, exactly once.
    #[test]
    fn every_sample_is_described_once() {
        let m = NodeMetrics::new();
        let text = m.render(Some(Gauges::default()), 0);
        for (name, kind, _) in NODE_METRICS {
            assert_eq!(text.matches(&format!("# HELP {name} ")).count(), 1, "{name}:\n{text}");
            assert!(text.contains(&format!("# TYPE {name} {}\n", kind.as_str())), "{name}:\n{text}");
        }
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(NODE_METRICS.iter().any(|(n, _, _)| *n == name), "{line} is not described");
        }
        let without_store = m.render(None, 0);
        assert!(
            !without_store.contains("baton_node_outbox_depth") && without_store.contains("baton_node_hub_reachable")
        );
    }

    /// The hub's reachability follows the latest request; an outage ends at the first answer.
    #[test]
    fn reachability_follows_the_latest_request() {
        let m = NodeMetrics::new();
        assert!(m.render(None, 0).contains("baton_node_hub_reachable 0\n"), "nothing answered yet");
        m.request::<()>(&Ok(()));
        assert!(m.render(None, 0).contains("baton_node_hub_reachable 1\n"));
        m.request::<()>(&Err(unreachable()));
        m.request::<()>(&Err(unreachable()));
        assert_eq!(m.contact().lost.map(|(_, n)| n), Some(2));
        let text = m.render(None, 0);
        assert!(text.contains("baton_node_hub_reachable 0\n"), "{text}");
        assert!(text.contains("baton_node_hub_requests_unanswered_total 2\n"), "{text}");
        // A refusal is an answer: the hub is reachable.
        let refused = ClientError::Api(baton_client::ApiError {
            status: 409,
            code: None,
            code_text: "stale_claim".into(),
            message: "no".into(),
        });
        m.request::<()>(&Err(refused));
        assert!(m.contact().lost.is_none());
        let text = m.render(None, 0);
        assert!(text.contains("baton_node_hub_reachable 1\n") && text.contains("baton_node_hub_requests_total 4\n"));
    }
}
