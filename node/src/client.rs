//! The hub as the node loop sees it: the `Hub` trait (SPEC §12), so the loop can be tested
//! against an in-memory hub, and `HubClient`, the real hub through `baton_client::NodeClient`.
//!
//! Every call, error and retry rule is `baton-client`'s: `ClientError` and its predicates
//! (`refused_for_good`, `superseded`, `route_unknown`, `answer_lost`, `retry_later`), the
//! batch calls with one typed answer per item, the session header, and `Client::reload`,
//! after which a refusal of the certificate replaced is `ClientError::SentBeforeReload`, so
//! revoking the old serial after a renewal never stops the node. `HubClient` adds only what is
//! the node's: its version on the session, one debug line per request under
//! `baton_node::requests` (route and item count), its configuration errors, and failover.
//!
//! Failover: with several `hub_url`s the node talks to one hub at a time. Every call goes
//! through `Client::failover`: a hub that does not answer, or answers 503, is left for the next
//! one (round robin; one log line names the hub now in use), and a request it certainly did
//! not act on is sent to that next hub at once, so the loops back off once per round of the
//! list rather than once per hub. A lost answer is handed back to the loop, which replays it
//! (same report id, same claim token) or resyncs as after a hub restart; `hub_moves` tells the
//! claim loop that the hub changed, and it resyncs the holdings there. A refusal the hub
//! decided never moves the node: every hub of the record would decide the same.

use crate::config::{ConfigError, NodeConfig};
use baton_client::{BuildError, Client, ClientError, ItemAnswer, NodeClient, RetryPolicy, TlsError, TlsFiles};
use baton_shared::wire::{
    ClaimResponse, ClaimedDelivery, HolderItem, ReportRequest, ReportResponse, RunningTurnItem, RunningTurnResult,
    SessionResponse, StartItem, StartResult, TransitionResponse,
};
use std::future::Future;
use std::time::Duration;

/// A `Hub` call's answer.
type Answer<T> = Result<T, ClientError>;

/// The hub calls the node makes. Every call is safe to repeat (SPEC §12) and is sent once (to
/// each of the node's hubs at most, `Client::failover`): the loop decides what to retry and
/// paces it. Once `register_session` succeeded, every request
/// carries the session.
pub trait Hub: Send + Sync + 'static {
    /// `POST /v1/sessions`: registers a fresh session for this process; later requests carry it.
    fn register_session(&self) -> impl Future<Output = Result<SessionResponse, ClientError>> + Send;
    /// `POST /v1/sessions/end`: ends the registered session cleanly (at shutdown).
    fn end_session(&self) -> impl Future<Output = Result<(), ClientError>> + Send;
    /// `POST /v1/claims`: long-polls for up to `max` deliveries (and the pending cancels).
    fn claim(&self, max: u32, wait: Duration) -> impl Future<Output = Result<ClaimResponse, ClientError>> + Send;
    /// `POST /v1/starts`: asks to start these turns; one result per item.
    fn starts(&self, items: Vec<StartItem>) -> impl Future<Output = Result<Vec<StartResult>, ClientError>> + Send;
    /// `GET /v1/holdings`: everything this instance holds.
    fn holdings(&self) -> impl Future<Output = Result<Vec<ClaimedDelivery>, ClientError>> + Send;
    /// `POST /v1/deliveries/{id}/mirrored`.
    fn mirrored(
        &self,
        delivery_id: &str,
        claim_token: &str,
    ) -> impl Future<Output = Result<TransitionResponse, ClientError>> + Send;
    /// `POST /v1/deliveries/{id}/ack`.
    fn ack(
        &self,
        delivery_id: &str,
        claim_token: &str,
    ) -> impl Future<Output = Result<TransitionResponse, ClientError>> + Send;
    /// `POST /v1/deliveries/{id}/reject`.
    fn reject(
        &self,
        delivery_id: &str,
        claim_token: &str,
        reason: &str,
    ) -> impl Future<Output = Result<TransitionResponse, ClientError>> + Send;
    /// `POST /delivery-report`.
    fn report(&self, body: &ReportRequest) -> impl Future<Output = Result<ReportResponse, ClientError>> + Send;
    /// `POST /v1/batch/mirrored`: `mirrored` for many deliveries (at most
    /// `BATCH_ITEMS_MAX`); one answer per item, in order, each as the single call's. A hub that
    /// predates batches answers 404 (`ClientError::route_unknown`).
    fn mirrored_batch(
        &self,
        items: Vec<HolderItem>,
    ) -> impl Future<Output = Result<Vec<ItemAnswer<TransitionResponse>>, ClientError>> + Send;
    /// `POST /v1/batch/ack`: `ack` for many deliveries, as `mirrored_batch`.
    fn ack_batch(
        &self,
        items: Vec<HolderItem>,
    ) -> impl Future<Output = Result<Vec<ItemAnswer<TransitionResponse>>, ClientError>> + Send;
    /// `POST /v1/batch/handoff`: `mirrored` then `ack` for many deliveries in one request and
    /// one hub transaction, as `mirrored_batch`; each answer is the `ack`'s. A hub that
    /// predates it answers 404 (`ClientError::route_unknown`).
    fn handoff_batch(
        &self,
        items: Vec<HolderItem>,
    ) -> impl Future<Output = Result<Vec<ItemAnswer<TransitionResponse>>, ClientError>> + Send;
    /// `POST /v1/batch/reports`: many attempt reports (at most `BATCH_ITEMS_MAX`, and
    /// `BATCH_BYTES_MAX` bytes); one answer per report, in order.
    fn report_batch(
        &self,
        reports: Vec<ReportRequest>,
    ) -> impl Future<Output = Result<Vec<ItemAnswer<ReportResponse>>, ClientError>> + Send;
    /// `POST /v1/running`: the turns running now and their progress events; one result per
    /// turn, in order. A hub that predates it answers 404 (`ClientError::route_unknown`).
    fn running(
        &self,
        turns: Vec<RunningTurnItem>,
    ) -> impl Future<Output = Result<Vec<RunningTurnResult>, ClientError>> + Send;
    /// How many times the node moved to another of its hubs (0 with one `hub_url`). The claim
    /// loop resyncs its holdings whenever this changed since it last looked. A wrapper passes
    /// its inner hub's count on.
    fn hub_moves(&self) -> u64;
}

/// The real hub, over mTLS with this host's certificate. Clones share one connection pool and
/// one certificate, so a `reload` through any clone takes effect for all.
#[derive(Clone)]
pub struct HubClient {
    node: NodeClient,
}

impl HubClient {
    /// The client of the hubs at `config.hub_url` (starting with the first), presenting
    /// `cert_file` and `key_file` and trusting only `ca_file`, for the node instance
    /// `instance_id`. Each call is sent once to each hub at most (the report too): the node's
    /// loops retry at their own pace.
    pub fn new(config: &NodeConfig, instance_id: &str) -> Result<HubClient, ConfigError> {
        let files = TlsFiles {
            ca_file: config.ca_file.clone(),
            cert_file: config.cert_file.clone(),
            key_file: config.key_file.clone(),
        };
        let client = Client::with_hubs(config.hub_url.urls(), &files).map_err(|e| match e {
            BuildError::HubUrl(message) => ConfigError::invalid("hub_url", message),
            BuildError::Tls(e) => tls_error(e),
        })?;
        Ok(HubClient { node: client.with_retry(RetryPolicy::once()).node(instance_id) })
    }

    /// Reads the CA, certificate and key files again and presents what they hold now on every
    /// request that starts after this returns. On failure the current certificate stays.
    /// Returns the new generation.
    pub fn reload(&self) -> Result<u64, ConfigError> {
        self.node.client().reload().map_err(tls_error)
    }

    /// Sends `call` to the hub in use, moving on from a hub that is unavailable
    /// (`Client::failover`), and logs each move with the hub now in use.
    async fn failover<T, Fut>(&self, call: impl FnMut() -> Fut) -> Answer<T>
    where
        Fut: Future<Output = Answer<T>>,
    {
        self.node.client().failover(call, moved).await
    }
}

/// Logs a move from the hub at `from` to the hub at `to` after `e`.
fn moved(from: &str, to: &str, e: &ClientError) {
    tracing::warn!(from, to, "the hub at {from} is unavailable ({e}); now using the hub at {to}");
}

/// A TLS file that cannot be used, as the configuration error naming its key.
fn tls_error(e: TlsError) -> ConfigError {
    let key = e.key();
    let message = match e {
        TlsError::Unreadable { path, source, .. } => format!("cannot read {}: {source}", path.display()),
        TlsError::Invalid { detail, .. } => detail,
    };
    ConfigError::invalid(key, message)
}

/// One debug line per request, by route and item count (what `BATON_LOG=baton_node::requests=debug`
/// counts).
fn logged(route: &'static str, items: usize) {
    tracing::debug!(target: "baton_node::requests", route, items, "hub request");
}

impl Hub for HubClient {
    async fn register_session(&self) -> Result<SessionResponse, ClientError> {
        logged("sessions", 0);
        self.failover(|| self.node.open_session(Some(env!("CARGO_PKG_VERSION")))).await
    }

    async fn end_session(&self) -> Result<(), ClientError> {
        logged("sessions/end", 0);
        self.failover(|| self.node.end_session()).await
    }

    async fn claim(&self, max: u32, wait: Duration) -> Result<ClaimResponse, ClientError> {
        logged("claims", 0);
        self.failover(|| self.node.claim(max, wait)).await
    }

    async fn starts(&self, items: Vec<StartItem>) -> Result<Vec<StartResult>, ClientError> {
        logged("starts", items.len());
        self.failover(|| self.node.starts(items.clone())).await
    }

    /// Every page of the holdings (`baton_client`'s `holdings` follows `next_cursor`), so the
    /// resync sees all the instance holds however much that is; a hub lost midway means a
    /// whole new read from another, not pages of two reads mixed.
    async fn holdings(&self) -> Result<Vec<ClaimedDelivery>, ClientError> {
        logged("holdings", 0);
        self.failover(|| self.node.holdings()).await
    }

    async fn mirrored(&self, delivery_id: &str, claim_token: &str) -> Result<TransitionResponse, ClientError> {
        logged("mirrored", 1);
        self.failover(|| self.node.mirrored(delivery_id, claim_token)).await
    }

    async fn ack(&self, delivery_id: &str, claim_token: &str) -> Result<TransitionResponse, ClientError> {
        logged("ack", 1);
        self.failover(|| self.node.ack(delivery_id, claim_token)).await
    }

    async fn reject(
        &self,
        delivery_id: &str,
        claim_token: &str,
        reason: &str,
    ) -> Result<TransitionResponse, ClientError> {
        logged("reject", 1);
        self.failover(|| self.node.reject(delivery_id, claim_token, reason)).await
    }

    async fn report(&self, body: &ReportRequest) -> Result<ReportResponse, ClientError> {
        logged("report", 1);
        self.failover(|| self.node.report(body)).await
    }

    async fn mirrored_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        logged("batch/mirrored", items.len());
        self.failover(|| self.node.mirrored_batch(items.clone())).await
    }

    async fn ack_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        logged("batch/ack", items.len());
        self.failover(|| self.node.ack_batch(items.clone())).await
    }

    async fn handoff_batch(&self, items: Vec<HolderItem>) -> Result<Vec<ItemAnswer<TransitionResponse>>, ClientError> {
        logged("batch/handoff", items.len());
        self.failover(|| self.node.handoff_batch(items.clone())).await
    }

    async fn report_batch(&self, reports: Vec<ReportRequest>) -> Result<Vec<ItemAnswer<ReportResponse>>, ClientError> {
        logged("batch/reports", reports.len());
        self.failover(|| self.node.report_batch(reports.clone())).await
    }

    async fn running(&self, turns: Vec<RunningTurnItem>) -> Result<Vec<RunningTurnResult>, ClientError> {
        logged("running", turns.len());
        self.failover(|| self.node.running(turns.clone())).await
    }

    fn hub_moves(&self) -> u64 {
        self.node.client().hub_moves()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tls_file_that_cannot_be_used_is_a_config_error_naming_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.crt");
        let e = tls_error(TlsError::Unreadable {
            key: "cert_file",
            path: missing,
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
        let text = e.to_string();
        assert!(text.starts_with("cert_file") && text.contains("cannot read") && text.contains("nope.crt"), "{text}");
        let e = tls_error(TlsError::Invalid { key: "ca_file", detail: "not a PEM certificate".into() });
        assert!(e.to_string().contains("ca_file") && e.to_string().contains("not a PEM"), "{e}");
    }
}
