//! The serving hub's runtime state: what every request handler, background task, the metrics
//! and the status page share while the hub runs (`Shared`), and the in-memory parts of it —
//! who waits for claimable work (`work`), the node sessions' contacts and cancel notices
//! (`turns`), the certificates' standing (`certs`), the events feeds' horizon (`feed`). The record is the truth; everything here
//! is a cache or a wake-up that the record can rebuild.
//!
//! Layout:
//! - `work`: waiting claims per host and for all hosts (`Work`, `WorkWatch`).
//! - `turns`: node sessions' last contact and the cancel notices already answered (`TurnState`).
//! - `certs`: the certificates' standing, cached until the record changes (`CertCache`).
//! - `feed`: the events feeds' horizon on PostgreSQL (`FeedHorizon`).

pub mod certs;
mod feed;
mod turns;
mod work;

pub use feed::FeedHorizon;
pub use turns::{CONTACT_FLUSH_INTERVAL, TurnState};
pub use work::{Work, WorkWatch};

use crate::config::Limits;
use crate::store::Store;
use crate::tls::ServerTls;
use baton_shared::clock::SharedClock;
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Everything a handler needs, shared by all requests.
pub struct Shared {
    /// The hub's record: the one door to it.
    pub store: Store,
    /// Wakes waiting claims when work may have become claimable: per host (fan-out, a due
    /// retry) or all of them (a lift, a release, a CLI change).
    pub work: Work,
    /// Bumped when a delivery moved or an attempt landed (producer long-polls).
    pub outcomes: watch::Sender<u64>,
    /// Bounds.
    pub limits: Limits,
    /// Cancelled when the hub shuts down; long-polls return early.
    pub shutdown: CancellationToken,
    /// Set once the store is open and repair is done.
    pub ready: AtomicBool,
    /// The bytes the record took at its last reading (`housekeeping::watch_store_size`); 0
    /// until the first. Past `limits.store_bytes_max`, submissions get 507 `store_full`.
    pub store_bytes: AtomicU64,
    /// The Prometheus recorder's handle, when metrics are on.
    pub metrics: Option<PrometheusHandle>,
    /// Wall-clock time for everything stored (`now_ms` of the store functions).
    pub clock: SharedClock,
    /// What the hub keeps in memory about node sessions and cancel notices.
    pub turns: TurnState,
    /// The certificates' standing, cached until the record changes.
    pub certs: certs::CertCache,
    /// The other hubs serving the same PostgreSQL record, told after each commit what woke
    /// this hub's waiters (`None` on SQLite, which one hub serves alone).
    pub peers: Option<crate::peers::Announcer>,
    /// The events feeds' horizon (PostgreSQL: what barriers moved it to; see `FeedHorizon`).
    pub feed_horizon: FeedHorizon,
    /// The TLS configuration the hub serves, for whether the CA that issued a caller's
    /// certificate is still trusted (`ca retire-old` drops one while its certificates'
    /// requests may be in progress); `None` where no TLS is served (socket-free tests), where
    /// nothing is re-checked against it.
    pub tls: Option<Arc<ServerTls>>,
    /// Where the hub's spans go (`otlp_endpoint`); off when none is configured, and then no
    /// span is built.
    pub telemetry: baton_telemetry::Telemetry,
}

/// The router's state.
pub type AppState = Arc<Shared>;

impl Shared {
    /// Tells every waiting claim that work may be claimable (a change that may concern any
    /// host: a lift, a release, a CLI change).
    pub fn work_changed(&self) {
        self.work.all();
        self.tell_peers(crate::peers::Notice::all_hosts());
    }
    /// Tells the waiting claims of these hosts (only) that work may be claimable for them.
    pub fn work_for<'a>(&self, hosts: impl IntoIterator<Item = &'a str>) {
        // The notice for other hubs is built only when there are any (never on SQLite).
        let mut notice = self.peers.as_ref().map(|_| crate::peers::Notice::default());
        for host in hosts {
            self.work.host(host);
            if let Some(n) = &mut notice {
                n.merge(crate::peers::Notice::host(host));
            }
        }
        if let Some(n) = notice.filter(|n| !n.is_empty()) {
            self.tell_peers(n);
        }
    }
    /// Tells the waiting claims that these deliveries (an accept's, a release's) may concern:
    /// their hosts', and for pool deliveries not yet bound to a host, their pools' members'.
    pub fn work_for_deliveries(&self, deliveries: &[baton_shared::wire::DeliverySummary]) {
        let waiting = || deliveries.iter().filter(|d| d.state == baton_shared::states::DeliveryState::Queued);
        self.work_for(waiting().filter(|d| d.pool.is_none()).filter_map(|d| d.host.as_deref()));
        self.work_for_pools(waiting().filter_map(|d| d.pool.as_deref()));
    }
    /// Tells the waiting claims of these pools' members that pool work may be claimable. Other
    /// hubs are told of work for all hosts (a notice names hosts, not pools: it wakes too many,
    /// never too few).
    pub fn work_for_pools<'a>(&self, pools: impl IntoIterator<Item = &'a str>) {
        let mut any = false;
        for pool in pools {
            self.work.pool(pool);
            any = true;
        }
        if any && self.peers.is_some() {
            self.tell_peers(crate::peers::Notice::all_hosts());
        }
    }
    /// Applies what another hub on the same record committed, to this hub's waiters only (it is
    /// not told on: each hub tells the others of its own commits).
    pub fn heard(&self, notice: &crate::peers::Notice) {
        if notice.is_all_hosts() {
            self.work.all();
        } else {
            for host in notice.hosts() {
                self.work.host(host);
            }
        }
        if notice.has_outcomes() {
            self.outcomes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
    fn tell_peers(&self, notice: crate::peers::Notice) {
        if let Some(peers) = &self.peers {
            peers.announce(notice);
        }
    }
    /// Tells waiting producer reads that a delivery or attempt changed.
    pub fn outcome_changed(&self) {
        self.outcomes.send_modify(|n| *n = n.wrapping_add(1));
        self.tell_peers(crate::peers::Notice::outcomes());
    }
    /// Whether the hub is ready to serve.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.shutdown.is_cancelled()
    }
}
