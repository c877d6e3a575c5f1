//! `Client`, the producer side of the v1 API, and `NodeClient`, the node side, over one mTLS
//! connection pool. Every call maps to one endpoint of `docs/api.md` and returns its wire type
//! from `baton_shared::wire`, or a `ClientError`.
//!
//! Retries are safe by construction: only submit (its idempotency key makes a repeat the same
//! message) and report (its report id makes a repeat count once) go through `retry::retrying`;
//! every other call is sent once.
//!
//! Listing (`list_messages`) pages through the producer's own messages of a conversation from
//! an opaque cursor (`MessagePage::next_cursor`).

use crate::error::{ApiError, ClientError, transport_error};
use crate::hubs::Hubs;
use crate::limits::{CLAIM_WAIT_MAX, LONG_POLL_WAIT_MAX, REQUEST_TIMEOUT, claim_timeout, long_poll_timeout};
use crate::retry::{RetryPolicy, retrying};
use crate::tls::{TlsError, TlsFiles, http_client};
use baton_shared::error::ErrorCode;
use baton_shared::traceparent::{TRACEPARENT_HEADER, TraceParent};
use baton_shared::wire::{
    ApprovalRequest, ApprovalResponse, CancelRequest, CancelResponse, ClaimRequest, ClaimResponse, ClaimedDelivery,
    ConversationView, ErrorBody, EventsPage, HolderRequest, HoldingsResponse, MessagePage, MessageView, RejectRequest,
    ReportRequest, ReportResponse, RunningRequest, RunningResponse, RunningTurnItem, RunningTurnResult, SESSION_HEADER,
    SessionEndRequest, SessionRequest, SessionResponse, StartItem, StartRequest, StartResponse, StartResult,
    SubmitRequest, SubmitResponse, TransitionResponse,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A hub URL is not an `https://` URL, the list is empty, or names one hub twice.
    #[error("hub_url: {0}")]
    HubUrl(String),
    /// A TLS file is unreadable or not what it should be.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// The client of a hub: one base URL, or several over one shared record (`with_hubs`), of
/// which it talks to one at a time until its caller moves it on (`advance_from`). Clones share
/// one connection pool and the hub in use.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The hubs' base URLs (`https://host:port`, without a trailing slash) and the one in use;
    /// shared by `with_retry` copies, so a move reaches them all.
    hubs: Arc<Hubs>,
    /// The files `reload` reads again.
    files: TlsFiles,
    /// The TLS client for new requests and its generation (1 at start, +1 per `reload`).
    current: RwLock<(u64, reqwest::Client)>,
    /// How submit and report are retried.
    retry: RetryPolicy,
}

impl Client {
    /// A client of the hub at `hub_url` (`https://host:port`) presenting `files`.
    pub fn new(hub_url: &str, files: &TlsFiles) -> Result<Client, BuildError> {
        Client::with_hubs(&[hub_url], files)
    }

    /// A client of the hubs at `hub_urls` (each `https://host:port`, at least one, no hub
    /// twice), presenting `files`. It talks to the first until `advance_from` moves it on.
    pub fn with_hubs(hub_urls: &[impl AsRef<str>], files: &TlsFiles) -> Result<Client, BuildError> {
        let hubs = check_hub_urls(hub_urls)?;
        let http = http_client(files, REQUEST_TIMEOUT)?;
        let inner = Inner {
            hubs: Arc::new(Hubs::new(hubs)),
            files: files.clone(),
            current: RwLock::new((1, http)),
            retry: RetryPolicy::default(),
        };
        Ok(Client { inner: Arc::new(inner) })
    }

    /// The same client (the same connections and generation) with another retry policy for
    /// its idempotent calls. A later `reload` of either does not reach the other.
    pub fn with_retry(&self, retry: RetryPolicy) -> Client {
        let current = RwLock::new(self.current());
        let inner = Inner { hubs: Arc::clone(&self.inner.hubs), files: self.inner.files.clone(), current, retry };
        Client { inner: Arc::new(inner) }
    }

    /// Reads the CA, certificate and key files again and presents what they hold now on every
    /// request that starts after this returns (a renewed certificate, without a restart). On
    /// failure the current client stays. Returns the new generation.
    pub fn reload(&self) -> Result<u64, TlsError> {
        let http = http_client(&self.inner.files, REQUEST_TIMEOUT)?;
        let mut current = match self.inner.current.write() {
            Ok(c) => c,
            // Only a panic between the two assignments below poisons it; the pair is whole.
            Err(poisoned) => poisoned.into_inner(),
        };
        *current = (current.0 + 1, http);
        Ok(current.0)
    }

    /// The generation of the TLS client new requests use: 1, plus one per `reload`. A caller
    /// that compares it before and after a refused call can tell a refusal of the certificate
    /// it replaced meanwhile.
    pub fn generation(&self) -> u64 {
        self.current().0
    }

    /// The TLS client for a new request, with its generation.
    fn current(&self) -> (u64, reqwest::Client) {
        match self.inner.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub(crate) fn http(&self) -> reqwest::Client {
        self.current().1
    }

    /// How this client retries its idempotent calls.
    pub(crate) fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.retry
    }

    /// The base URL of the hub in use now.
    pub fn hub_url(&self) -> &str {
        self.inner.hubs.current()
    }

    /// Every hub's base URL, in the order given.
    pub fn hub_urls(&self) -> &[String] {
        self.inner.hubs.urls()
    }

    /// The index (into `hub_urls`) of the hub in use now. A caller notes it before a request,
    /// so that it can move on from exactly that hub if the request finds it unavailable.
    pub fn hub_index(&self) -> usize {
        self.inner.hubs.index()
    }

    /// Moves this client (and its clones) to the hub after the one at `from`, round robin,
    /// when that one is still in use; returns the new index. `None` when another request
    /// moved it first (many requests failing against one hub move it once) or there is only
    /// one hub.
    pub fn advance_from(&self, from: usize) -> Option<usize> {
        self.inner.hubs.advance_from(from)
    }

    /// Runs `call` (one request through this client) against the hub in use, moving on,
    /// round robin, from a hub that is unavailable (`ClientError::hub_unavailable`): a request
    /// that hub certainly did not act on (no connection, or 503) goes to the next hub at once,
    /// until every hub was tried once; a lost answer, a refusal or an answer ends the round and
    /// is returned. `moved(from, to, error)` hears of each move. With one hub this is `call`.
    pub async fn failover<T, F, Fut>(
        &self,
        call: F,
        moved: impl FnMut(&str, &str, &ClientError),
    ) -> Result<T, ClientError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        crate::hubs::round(&self.inner.hubs, call, moved).await
    }

    /// How many times this client moved to another hub since it was built: a caller that
    /// compares it with what it saw before can tell the hub changed under it.
    pub fn hub_moves(&self) -> u64 {
        self.inner.hubs.moves()
    }

    /// `POST /v1/messages`. Retried on transient failures (the same key and content answer
    /// with the original message, `duplicate: true`).
    pub async fn submit(&self, req: &SubmitRequest) -> Result<SubmitResponse, ClientError> {
        let url = format!("{}/v1/messages", self.hub_url());
        retrying(&self.inner.retry, || self.send(self.http().post(&url).timeout(REQUEST_TIMEOUT).json(req), 0)).await
    }

    /// `POST /v1/messages` in the producer's trace: `traceparent` (W3C Trace Context, the span
    /// that sends it) goes as the request's `traceparent` header, so the hub keeps it with the
    /// message, its spans and the node's are children of that span, and the harness finds it
    /// as `TRACEPARENT`. Retried as `submit` is (the same header each time).
    pub async fn submit_traced(
        &self,
        req: &SubmitRequest,
        traceparent: &TraceParent,
    ) -> Result<SubmitResponse, ClientError> {
        let url = format!("{}/v1/messages", self.hub_url());
        let header = traceparent.to_string();
        retrying(&self.inner.retry, || {
            let r = self.http().post(&url).timeout(REQUEST_TIMEOUT).header(TRACEPARENT_HEADER, &header).json(req);
            self.send(r, 0)
        })
        .await
    }

    /// `GET /v1/messages?conversation=C[&after=CURSOR][&limit=N]`: one page of this producer's
    /// own messages in `conversation`, oldest first, from `after` (a `next_cursor` of an earlier
    /// page; none: from the oldest the hub keeps). `limit` is capped by the hub's
    /// `limits.message_page_max`. Follow `next_cursor` while `more`; at the end, the same
    /// cursor later gives what came since. A cursor the hub no longer keeps whole is 410
    /// `cursor_expired` (start again without one); one not of this listing, 400
    /// `bad_cursor`. Sent once (a read: the caller repeats it freely).
    pub async fn list_messages(
        &self,
        conversation: &str,
        after: Option<&str>,
        limit: Option<u32>,
    ) -> Result<MessagePage, ClientError> {
        let limit = limit.map(|n| n.to_string());
        let mut query = vec![("conversation", conversation)];
        query.extend(after.map(|a| ("after", a)));
        query.extend(limit.as_deref().map(|n| ("limit", n)));
        let url = self.url("/v1/messages", &query)?;
        self.send(self.http().get(url).timeout(REQUEST_TIMEOUT), 0).await
    }

    /// `GET /v1/messages/{id}`; with `wait`, a long-poll that answers as soon as a delivery
    /// settles that had not settled when it began (the wait is capped by `LONG_POLL_WAIT_MAX`
    /// and by the hub's `long_poll_wait_max`).
    pub async fn message(&self, message_id: &str, wait: Option<Duration>) -> Result<MessageView, ClientError> {
        let url = self.url(&format!("/v1/messages/{}", path_segment(message_id)), &[])?;
        self.read(url, wait).await
    }

    /// `GET /v1/messages?idempotency_key=K`: the message this producer submitted under `key`;
    /// `wait` as in `message`.
    pub async fn message_by_key(&self, key: &str, wait: Option<Duration>) -> Result<MessageView, ClientError> {
        let url = self.url("/v1/messages", &[("idempotency_key", key)])?;
        self.read(url, wait).await
    }

    /// `POST /v1/messages/{id}/cancel`: cancels every delivery of the message that has not
    /// ended. Sent once (repeating it answers the same, but the caller decides).
    pub async fn cancel(&self, message_id: &str, reason: &str) -> Result<CancelResponse, ClientError> {
        let url = format!("{}/v1/messages/{}/cancel", self.hub_url(), path_segment(message_id));
        let body = CancelRequest { reason: reason.to_string() };
        self.send(self.http().post(url).timeout(REQUEST_TIMEOUT).json(&body), 0).await
    }

    /// `POST /v1/messages/{message_id}/approve`: approves a message awaiting approval (the
    /// caller needs the right to approve in its conversation: else 403 `approval_forbidden`).
    /// Sent once.
    pub async fn approve(&self, message_id: &str, reason: &str) -> Result<ApprovalResponse, ClientError> {
        self.decide(message_id, "approve", reason).await
    }

    /// `POST /v1/messages/{message_id}/reject`: rejects a message awaiting approval (its held
    /// deliveries fail with the reason). Sent once.
    pub async fn reject(&self, message_id: &str, reason: &str) -> Result<ApprovalResponse, ClientError> {
        self.decide(message_id, "reject", reason).await
    }

    async fn decide(&self, message_id: &str, verb: &str, reason: &str) -> Result<ApprovalResponse, ClientError> {
        let url = format!("{}/v1/messages/{}/{verb}", self.hub_url(), path_segment(message_id));
        let body = ApprovalRequest { reason: reason.to_string() };
        self.send(self.http().post(url).timeout(REQUEST_TIMEOUT).json(&body), 0).await
    }

    /// `GET /v1/conversations/{conversation}`: the conversation's position and membership registry.
    pub async fn conversation(&self, name: &str) -> Result<ConversationView, ClientError> {
        let url = format!("{}/v1/conversations/{}", self.hub_url(), path_segment(name));
        self.send(self.http().get(url).timeout(REQUEST_TIMEOUT), 0).await
    }

    /// `GET /v1/messages/{id}/events`: the message's events after `after` (a `cursor` or
    /// `next_cursor` of an earlier answer; `None` from the start), at most `limit` (`None`: the
    /// hub's `limits.feed_page_max`); with `wait`, a long poll that answers as soon as there is
    /// one (capped as `message`'s). Resuming from the last `next_cursor` after any failure
    /// neither loses nor repeats an event. Sent once.
    pub async fn message_events(
        &self,
        message_id: &str,
        after: Option<&str>,
        wait: Option<Duration>,
        limit: Option<u32>,
    ) -> Result<EventsPage, ClientError> {
        let path = format!("/v1/messages/{}/events", path_segment(message_id));
        self.feed(&path, after, wait, limit).await
    }

    /// `GET /v1/conversations/{conversation}/events`: this producer's own messages' events in
    /// the conversation (403 `forbidden` outside its publish scope), as `message_events`.
    pub async fn conversation_events(
        &self,
        conversation: &str,
        after: Option<&str>,
        wait: Option<Duration>,
        limit: Option<u32>,
    ) -> Result<EventsPage, ClientError> {
        let path = format!("/v1/conversations/{}/events", path_segment(conversation));
        self.feed(&path, after, wait, limit).await
    }

    async fn feed(
        &self,
        path: &str,
        after: Option<&str>,
        wait: Option<Duration>,
        limit: Option<u32>,
    ) -> Result<EventsPage, ClientError> {
        let limit = limit.map(|l| l.to_string());
        let wait_ms = wait.map(|w| w.min(LONG_POLL_WAIT_MAX).as_millis().to_string());
        let mut query: Vec<(&str, &str)> = Vec::new();
        if let Some(after) = after {
            query.push(("after", after));
        }
        if let Some(w) = &wait_ms {
            query.push(("wait_ms", w));
        }
        if let Some(l) = &limit {
            query.push(("limit", l));
        }
        let url = self.url(path, &query)?;
        let timeout = wait.map_or(REQUEST_TIMEOUT, long_poll_timeout);
        self.send(self.http().get(url).timeout(timeout), 0).await
    }

    /// The node side of the API for the node instance `instance_id`, over this client's
    /// connections (and certificate: a node's).
    pub fn node(&self, instance_id: &str) -> NodeClient {
        NodeClient { client: self.clone(), instance_id: instance_id.to_string(), session: Arc::new(AtomicU64::new(0)) }
    }

    async fn read(&self, mut url: reqwest::Url, wait: Option<Duration>) -> Result<MessageView, ClientError> {
        let timeout = match wait {
            Some(wait) => {
                let wait_ms = wait.min(LONG_POLL_WAIT_MAX).as_millis().to_string();
                url.query_pairs_mut().append_pair("wait_ms", &wait_ms);
                long_poll_timeout(wait)
            }
            None => REQUEST_TIMEOUT,
        };
        self.send(self.http().get(url).timeout(timeout), 0).await
    }

    fn url(&self, path: &str, query: &[(&str, &str)]) -> Result<reqwest::Url, ClientError> {
        let mut url = reqwest::Url::parse(&format!("{}{path}", self.hub_url()))
            .map_err(|e| ClientError::Invalid(format!("{path}: {e}")))?;
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        Ok(url)
    }

    /// Sends `req` (with the node session header when `session` is not 0) and reads the
    /// documented answer or the hub's refusal.
    pub(crate) async fn send<T: serde::de::DeserializeOwned>(
        &self,
        mut req: reqwest::RequestBuilder,
        session: u64,
    ) -> Result<T, ClientError> {
        if session > 0 {
            req = req.header(SESSION_HEADER, session.to_string());
        }
        let resp = req.send().await.map_err(|e| transport_error(&e))?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(|e| transport_error(&e))?;
        if (200..300).contains(&status) {
            // An empty answer reads as `null`: only a caller that expects nothing accepts it.
            let body: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
            return serde_json::from_slice(body).map_err(|e| ClientError::BadAnswer { status, detail: e.to_string() });
        }
        Err(ClientError::Api(refusal(status, &bytes)))
    }
}

/// The refusal in an error answer: our `{code, message}` body, or the start of whatever else
/// came (a proxy's page).
fn refusal(status: u16, bytes: &[u8]) -> ApiError {
    match serde_json::from_slice::<ErrorBody>(bytes) {
        Ok(b) => ApiError { status, code: ErrorCode::parse(&b.code), code_text: b.code, message: b.message },
        Err(_) => ApiError {
            status,
            code: None,
            code_text: String::new(),
            message: String::from_utf8_lossy(&bytes[..bytes.len().min(ERROR_QUOTE_BYTES_MAX)]).into_owned(),
        },
    }
}

/// How much of an error answer that is not our error body is quoted in the error.
const ERROR_QUOTE_BYTES_MAX: usize = 200;

/// Every one of `hub_urls` checked (`check_hub_url`): at least one, and no hub named twice
/// (compared as parsed, so `https://HUB:443/` and `https://hub` are one hub).
fn check_hub_urls(hub_urls: &[impl AsRef<str>]) -> Result<Vec<String>, BuildError> {
    if hub_urls.is_empty() {
        return Err(BuildError::HubUrl("names no hub: give at least one https://HOST[:PORT]".into()));
    }
    let mut checked: Vec<String> = Vec::with_capacity(hub_urls.len());
    let mut seen: Vec<reqwest::Url> = Vec::with_capacity(hub_urls.len());
    for url in hub_urls {
        let url = url.as_ref();
        let base = check_hub_url(url)?;
        let parsed =
            reqwest::Url::parse(&base).map_err(|e| BuildError::HubUrl(format!("{url:?} is not a URL: {e}")))?;
        if let Some(i) = seen.iter().position(|u| *u == parsed) {
            return Err(BuildError::HubUrl(format!("{url:?} names the same hub as {:?}", checked[i])));
        }
        seen.push(parsed);
        checked.push(base);
    }
    Ok(checked)
}

/// `hub_url` without its trailing slash, when it is an `https://` URL with a host and no path.
fn check_hub_url(hub_url: &str) -> Result<String, BuildError> {
    let url = reqwest::Url::parse(hub_url).map_err(|e| BuildError::HubUrl(format!("{hub_url:?} is not a URL: {e}")))?;
    if url.scheme() != "https" {
        return Err(BuildError::HubUrl(format!("{hub_url:?} must start with https:// (the hub speaks mTLS only)")));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(BuildError::HubUrl(format!("{hub_url:?} names no host")));
    }
    if url.path() != "/" || url.query().is_some() {
        return Err(BuildError::HubUrl(format!("{hub_url:?} must be https://HOST[:PORT], without a path")));
    }
    Ok(hub_url.trim_end_matches('/').to_string())
}

/// Keeps an id from changing the path: anything outside `[A-Za-z0-9._:-]` is percent-encoded.
fn path_segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The node side of the API for one node instance. After `open_session`, every request carries
/// the session (`SESSION_HEADER`); clones share it.
#[derive(Debug, Clone)]
pub struct NodeClient {
    client: Client,
    instance_id: String,
    /// The registered session (0 before `open_session`).
    session: Arc<AtomicU64>,
}

impl NodeClient {
    /// The instance this client acts for.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The session registered by `open_session` (0 before).
    pub fn session(&self) -> u64 {
        self.session.load(Ordering::SeqCst)
    }

    /// The producer-side client this node client shares its connections, certificate and
    /// retry policy with: `reload` and `generation` through it reach this node client too.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// `POST {path}` with `body` and the session; the answer or the refusal.
    pub(crate) async fn post<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        timeout: Duration,
    ) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.client.hub_url());
        self.call(|http| http.post(url).timeout(timeout).json(body)).await
    }

    /// Sends the request `build` makes with the current TLS client, with the session. A
    /// refusal for good of a certificate that `Client::reload` replaced while the request was
    /// out is `ClientError::SentBeforeReload`, not a refusal of the certificate in use now.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        build: impl FnOnce(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        let c = &self.client;
        let (generation, http) = c.current();
        let answer = c.send(build(&http), self.session()).await;
        answer.map_err(|e| e.sent_with(generation, c.generation()))
    }

    fn holder(&self, claim_token: &str) -> HolderRequest {
        HolderRequest { instance_id: self.instance_id.clone(), claim_token: claim_token.to_string() }
    }

    /// `POST /v1/sessions`: registers a fresh session; later requests carry it.
    pub async fn open_session(&self, node_version: Option<&str>) -> Result<SessionResponse, ClientError> {
        let body =
            SessionRequest { instance_id: self.instance_id.clone(), node_version: node_version.map(str::to_string) };
        let r: SessionResponse = self.post("/v1/sessions", &body, REQUEST_TIMEOUT).await?;
        self.session.store(r.session, Ordering::SeqCst);
        Ok(r)
    }

    /// `POST /v1/sessions/end`: ends the registered session cleanly (nothing before one).
    pub async fn end_session(&self) -> Result<(), ClientError> {
        let session = self.session();
        if session == 0 {
            return Ok(());
        }
        let body = SessionEndRequest { instance_id: self.instance_id.clone(), session };
        let _: serde_json::Value = self.post("/v1/sessions/end", &body, REQUEST_TIMEOUT).await?;
        Ok(())
    }

    /// `POST /v1/claims`: long-polls up to `wait` (at most `CLAIM_WAIT_MAX`; the hub caps it
    /// by its `long_poll_wait_max`) for at most `max` deliveries and the pending cancel notices.
    pub async fn claim(&self, max: u32, wait: Duration) -> Result<ClaimResponse, ClientError> {
        let wait = wait.min(CLAIM_WAIT_MAX);
        let body = ClaimRequest {
            instance_id: self.instance_id.clone(),
            max: Some(max),
            wait_ms: Some(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)),
        };
        self.post("/v1/claims", &body, claim_timeout(wait)).await
    }

    /// `POST /v1/starts`: asks to start these turns; one result per item, in order.
    pub async fn starts(&self, items: Vec<StartItem>) -> Result<Vec<StartResult>, ClientError> {
        let body = StartRequest { instance_id: self.instance_id.clone(), starts: items };
        let r: StartResponse = self.post("/v1/starts", &body, REQUEST_TIMEOUT).await?;
        Ok(r.results)
    }

    /// `POST /v1/running`: the turns running now and their progress events since the last
    /// answer, in one request for all of them; one result per turn, in order.
    pub async fn running(&self, turns: Vec<RunningTurnItem>) -> Result<Vec<RunningTurnResult>, ClientError> {
        let body = RunningRequest { instance_id: self.instance_id.clone(), turns };
        let r: RunningResponse = self.post("/v1/running", &body, REQUEST_TIMEOUT).await?;
        Ok(r.turns)
    }

    /// `GET /v1/holdings`: everything this instance holds, every page followed (see
    /// `holdings_page`).
    pub async fn holdings(&self) -> Result<Vec<ClaimedDelivery>, ClientError> {
        let mut all = Vec::new();
        let mut cursor: Option<i64> = None;
        loop {
            let page = self.holdings_page(cursor).await?;
            all.extend(page.deliveries);
            match page.next_cursor {
                // A cursor that does not move on would page forever: the hub's answer is wrong.
                Some(next) if cursor.is_some_and(|c| next <= c) => {
                    let detail = format!("holdings: next_cursor {next} does not move past the page's cursor");
                    return Err(ClientError::BadAnswer { status: 200, detail });
                }
                Some(next) => cursor = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// `GET /v1/holdings`: one page of what this instance holds, from `cursor` (a previous
    /// page's `next_cursor`; `None` for the first), as large as the hub's
    /// `limits.holdings_page_max`.
    pub async fn holdings_page(&self, cursor: Option<i64>) -> Result<HoldingsResponse, ClientError> {
        let cursor = cursor.map(|c| c.to_string());
        let mut query = vec![("instance_id", self.instance_id.as_str())];
        if let Some(c) = &cursor {
            query.push(("cursor", c.as_str()));
        }
        let url = self.client.url("/v1/holdings", &query)?;
        self.call(|http| http.get(url).timeout(REQUEST_TIMEOUT)).await
    }

    /// `POST /v1/deliveries/{id}/mirrored`: claimed → mirrored.
    pub async fn mirrored(&self, delivery_id: &str, claim_token: &str) -> Result<TransitionResponse, ClientError> {
        let path = format!("/v1/deliveries/{}/mirrored", path_segment(delivery_id));
        self.post(&path, &self.holder(claim_token), REQUEST_TIMEOUT).await
    }

    /// `POST /v1/deliveries/{id}/ack`: mirrored → delivered (the execution gate).
    pub async fn ack(&self, delivery_id: &str, claim_token: &str) -> Result<TransitionResponse, ClientError> {
        let path = format!("/v1/deliveries/{}/ack", path_segment(delivery_id));
        self.post(&path, &self.holder(claim_token), REQUEST_TIMEOUT).await
    }

    /// `POST /v1/deliveries/{id}/reject`: claimed or mirrored → failed, with `reason`.
    pub async fn reject(
        &self,
        delivery_id: &str,
        claim_token: &str,
        reason: &str,
    ) -> Result<TransitionResponse, ClientError> {
        let body = RejectRequest {
            instance_id: self.instance_id.clone(),
            claim_token: claim_token.to_string(),
            reason: reason.to_string(),
        };
        let path = format!("/v1/deliveries/{}/reject", path_segment(delivery_id));
        self.post(&path, &body, REQUEST_TIMEOUT).await
    }

    /// `POST /delivery-report`: one attempt's outcome. Retried on transient failures (the same
    /// `report_id` and body is counted once, `duplicate: true`).
    pub async fn report(&self, body: &ReportRequest) -> Result<ReportResponse, ClientError> {
        retrying(&self.client.inner.retry, || self.post("/delivery-report", body, REQUEST_TIMEOUT)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_stay_one_path_segment() {
        assert_eq!(path_segment("0190-ab_c.d:e"), "0190-ab_c.d:e");
        assert_eq!(path_segment("../x y"), "..%2Fx%20y");
    }

    #[test]
    fn hub_urls_are_https_without_a_path() {
        let check = |url: &str| check_hub_url(url).map_err(|e| e.to_string());
        assert_eq!(check("https://hub.example:8443/").as_deref(), Ok("https://hub.example:8443"));
        assert_eq!(check("https://127.0.0.1:1").as_deref(), Ok("https://127.0.0.1:1"));
        for (bad, says) in [
            ("http://hub:1", "must start with https://"),
            ("hub:1", "must start with https://"),
            ("https://hub:1/v1", "without a path"),
            ("not a url", "is not a URL"),
        ] {
            let e = check(bad).unwrap_err();
            assert!(e.starts_with("hub_url: ") && e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_list_of_hubs_is_checked_entry_by_entry_and_names_each_hub_once() {
        let check = |urls: &[&str]| check_hub_urls(urls).map_err(|e| e.to_string());
        assert_eq!(
            check(&["https://a:1/", "https://b:1"]),
            Ok(vec!["https://a:1".to_string(), "https://b:1".to_string()])
        );
        for (bad, says) in [
            (vec![], "names no hub"),
            (vec!["https://a:1", "http://b:1"], "\"http://b:1\" must start with https://"),
            (vec!["https://a:1", "https://A:1/"], "\"https://A:1/\" names the same hub as \"https://a:1\""),
            (vec!["https://a", "https://a:443"], "names the same hub"),
        ] {
            let e = check(&bad).unwrap_err();
            assert!(e.starts_with("hub_url: ") && e.contains(says), "{bad:?}: {e}");
        }
        assert!(check(&["https://a:1", "https://a:2"]).is_ok(), "two ports are two hubs");
    }

    #[test]
    fn a_refusal_in_another_shape_is_quoted_not_parsed() {
        let ours = refusal(409, br#"{"code":"idempotency_conflict","message":"m"}"#);
        assert_eq!(ours.code, Some(ErrorCode::IdempotencyConflict));
        let theirs = refusal(502, &[b'x'; 1000]);
        assert_eq!((theirs.code, theirs.code_text.as_str(), theirs.message.len()), (None, "", ERROR_QUOTE_BYTES_MAX));
    }
}
