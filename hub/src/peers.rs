//! Hubs sharing one database wake each other: after a commit, a hub (or the CLI) sends a
//! `Notice` with `NOTIFY` on `CHANNEL`, and every hub `LISTEN`s there and wakes its own waiting
//! long-polls as the notice says, as it does for its own commits.
//!
//! - `Notice`: what changed (work for some hosts or for all, an outcome, the record), a set
//!   that merges, and its payload text (`Notice::encode`, `Notice::decode`).
//! - `Origin`: who sent a notice, so a hub skips its own (it already woke its own waiters).
//! - `Announcer`: the hub's cheap handle; `announce` never waits, a background task with its own
//!   connection sends what piled up as one payload, reconnecting with bounded backoff.
//! - `announce_once`: the CLI's connect, notify, close.
//! - `listen`: a task with its own connection that calls a handler for each notice.
//!
//! Notices are sent after the commit, never inside the transaction: a hub woken by one must find
//! the change when it looks, and a notice about a change that rolled back would only wake
//! waiters for nothing. Notices are hints, not the record: one that is lost (a connection down,
//! a hub restarting) costs the waiting claim its own timeout, a delay, never a lost change,
//! since every claim reads the record. Where notices may have been missed (a listener that
//! reconnects, an announcer that could not send, a payload this binary does not read), the
//! receiver is told "everything changed" instead.

use crate::store::engine::postgres::{PgError, PgUrl};
use baton_shared::ids;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};
use tokio_postgres::{AsyncMessage, Client, Statement};
use tokio_util::sync::{CancellationToken, DropGuard};

/// The channel every hub of one database listens on.
pub const CHANNEL: &str = "baton_changes";
/// The longest payload sent: PostgreSQL takes payloads shorter than 8000 bytes (in its default
/// configuration). A notice whose hosts would not fit is sent as work for all hosts.
pub const NOTIFY_PAYLOAD_BYTES_MAX: usize = 7_999;
/// The first wait before reconnecting after a failure; it doubles up to
/// `RECONNECT_BACKOFF_MAX`, and is back here once a connection works.
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest wait between two connection attempts.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long sending a notice (or starting to listen) may take before the connection is taken
/// for dead and replaced.
pub const SEND_WAIT: Duration = Duration::from_secs(10);
/// How often a listener checks that its connection still answers: a connection cut without a
/// reset (a network partition) would otherwise leave it waiting for notices that never come.
pub const LISTEN_PING_INTERVAL: Duration = Duration::from_secs(15);
/// Notifications read from the connection and not yet handed to the handler; beyond it the
/// listener stops reading the socket until the handler catches up (the server keeps them).
pub const NOTIFICATIONS_QUEUED_MAX: usize = 1024;

/// The payload's first word: the format's name and version.
const PAYLOAD_TAG: &str = "baton1";
/// The bytes of a payload before its items: the tag, a space and the origin's 16 hex digits.
const PAYLOAD_HEADER_BYTES: usize = PAYLOAD_TAG.len() + 1 + 16;
/// The bytes of the items other than hosts, at most: ` w`, ` o` and ` r`.
const PAYLOAD_FLAGS_BYTES_MAX: usize = 6;
/// The bytes one host adds to a payload besides its name: ` w:`.
const PAYLOAD_HOST_OVERHEAD_BYTES: usize = 3;
/// The longest payload text quoted in a log line.
const LOGGED_PAYLOAD_CHARS_MAX: usize = 200;

const _: () = assert!(PAYLOAD_HEADER_BYTES + PAYLOAD_FLAGS_BYTES_MAX < NOTIFY_PAYLOAD_BYTES_MAX);
const _: () = assert!(RECONNECT_BACKOFF_MIN.as_millis() <= RECONNECT_BACKOFF_MAX.as_millis());

/// What changed in the record, as one hub tells the others after a commit: a set that merges.
///
/// Invariant: `all_hosts` leaves `hosts` empty (work for all hosts absorbs work for some), and
/// the hosts always fit one payload (`NOTIFY_PAYLOAD_BYTES_MAX`): a merge that would pass the
/// bound becomes work for all hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notice {
    /// Hosts with new claimable work (their waiting claims should look again).
    hosts: BTreeSet<String>,
    /// Bytes the hosts add to the payload (names and separators).
    host_bytes: usize,
    /// Work for every host.
    all_hosts: bool,
    /// An outcome changed: waiting producer long-polls should look again.
    outcomes: bool,
    /// The record changed otherwise (certificates, fences, membership): what the wake socket
    /// tells one hub after a CLI change.
    record: bool,
}

impl Notice {
    /// Work for `host` (a valid host name; anything else, a bug of ours, becomes work for all
    /// hosts, which wakes too many but never too few).
    pub fn host(host: &str) -> Notice {
        let mut n = Notice::default();
        n.add_host(host);
        n
    }

    /// Work for every host.
    pub fn all_hosts() -> Notice {
        Notice { all_hosts: true, ..Notice::default() }
    }

    /// An outcome changed.
    pub fn outcomes() -> Notice {
        Notice { outcomes: true, ..Notice::default() }
    }

    /// The record changed (certificates, fences, membership).
    pub fn record() -> Notice {
        Notice { record: true, ..Notice::default() }
    }

    /// Everything changed: what a receiver is told when notices may have been missed.
    pub fn everything() -> Notice {
        Notice { all_hosts: true, outcomes: true, record: true, ..Notice::default() }
    }

    /// Adds what `other` says to this notice.
    pub fn merge(&mut self, other: Notice) {
        self.outcomes |= other.outcomes;
        self.record |= other.record;
        if other.all_hosts {
            self.set_all_hosts();
        }
        for host in other.hosts {
            self.add_host(&host);
        }
    }

    fn set_all_hosts(&mut self) {
        self.all_hosts = true;
        self.hosts.clear();
        self.host_bytes = 0;
    }

    fn add_host(&mut self, host: &str) {
        if self.all_hosts || self.hosts.contains(host) {
            return;
        }
        let valid = ids::check_name("host", host).is_ok();
        debug_assert!(valid, "notice for an invalid host name {host:?}");
        let bytes = self.host_bytes + PAYLOAD_HOST_OVERHEAD_BYTES + host.len();
        if !valid || PAYLOAD_HEADER_BYTES + PAYLOAD_FLAGS_BYTES_MAX + bytes > NOTIFY_PAYLOAD_BYTES_MAX {
            self.set_all_hosts();
            return;
        }
        self.hosts.insert(host.to_owned());
        self.host_bytes = bytes;
    }

    /// Whether the notice says nothing.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty() && !self.all_hosts && !self.outcomes && !self.record
    }

    /// The hosts with new work (none when `is_all_hosts`, which covers them all).
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.hosts.iter().map(String::as_str)
    }

    /// Whether every host may have new work.
    pub fn is_all_hosts(&self) -> bool {
        self.all_hosts
    }

    /// Whether `host` may have new work (named, or all hosts).
    pub fn covers_host(&self, host: &str) -> bool {
        self.all_hosts || self.hosts.contains(host)
    }

    /// Whether an outcome changed.
    pub fn has_outcomes(&self) -> bool {
        self.outcomes
    }

    /// Whether the record changed otherwise (certificates, fences, membership).
    pub fn has_record(&self) -> bool {
        self.record
    }

    /// The payload text: `baton1 ORIGIN` and the items, each after a space: `w` (work for all
    /// hosts) or `w:HOST` for each host in order, then `o` (outcomes) and `r` (record). It is
    /// never longer than `NOTIFY_PAYLOAD_BYTES_MAX` (see the invariant on `Notice`).
    pub fn encode(&self, origin: Origin) -> String {
        let mut s = String::with_capacity(PAYLOAD_HEADER_BYTES + PAYLOAD_FLAGS_BYTES_MAX + self.host_bytes);
        s.push_str(PAYLOAD_TAG);
        let _ = write!(s, " {:016x}", origin.0);
        if self.all_hosts {
            s.push_str(" w");
        }
        for host in &self.hosts {
            s.push_str(" w:");
            s.push_str(host);
        }
        if self.outcomes {
            s.push_str(" o");
        }
        if self.record {
            s.push_str(" r");
        }
        debug_assert!(s.len() <= NOTIFY_PAYLOAD_BYTES_MAX, "a payload of {} bytes", s.len());
        s
    }

    /// Reads a payload written by `encode`, strictly: anything else (another format or version,
    /// an unknown item, an invalid host, items out of order or repeated, no item at all) is an
    /// error, which a listener takes as "everything changed".
    pub fn decode(payload: &str) -> Result<(Origin, Notice), NoticeError> {
        let bad = |why: &'static str| NoticeError { why, payload: shorten(payload) };
        let mut words = payload.split(' ');
        if words.next() != Some(PAYLOAD_TAG) {
            return Err(bad("not a baton1 notice"));
        }
        let origin = words
            .next()
            .filter(|w| w.len() == 16 && w.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
            .and_then(|w| u64::from_str_radix(w, 16).ok())
            .map(Origin)
            .ok_or_else(|| bad("no origin"))?;
        let mut notice = Notice::default();
        for word in words {
            match word {
                "w" => notice.all_hosts = true,
                "o" => notice.outcomes = true,
                "r" => notice.record = true,
                _ => {
                    let host = word.strip_prefix("w:").ok_or_else(|| bad("an unknown item"))?;
                    ids::check_name("host", host).map_err(|_| bad("an invalid host name"))?;
                    notice.hosts.insert(host.to_owned());
                    notice.host_bytes += PAYLOAD_HOST_OVERHEAD_BYTES + host.len();
                }
            }
        }
        if notice.is_empty() {
            return Err(bad("no item"));
        }
        // What `Notice` holds to (see its invariant), which `encode` cannot see.
        if notice.all_hosts && !notice.hosts.is_empty() {
            return Err(bad("work for all hosts and for some"));
        }
        if PAYLOAD_HEADER_BYTES + PAYLOAD_FLAGS_BYTES_MAX + notice.host_bytes > NOTIFY_PAYLOAD_BYTES_MAX {
            return Err(bad("more hosts than a notice holds"));
        }
        // Strict: exactly what `encode` writes (order, no repeats, `w` alone, within the bound).
        if notice.encode(origin) != payload {
            return Err(bad("not in canonical form"));
        }
        Ok((origin, notice))
    }
}

/// The start of `payload`, for an error or a log line.
fn shorten(payload: &str) -> String {
    payload.chars().take(LOGGED_PAYLOAD_CHARS_MAX).collect()
}

/// A payload that is not a notice this binary reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unreadable change notice ({why}): {payload:?}")]
pub struct NoticeError {
    /// What is wrong with it.
    why: &'static str,
    /// Its start (at most `LOGGED_PAYLOAD_CHARS_MAX` characters).
    payload: String,
}

/// Who sent a notice: one per hub process, shared by its `Announcer` and its `listen`, so the
/// hub skips its own notices (it woke its own waiters when it committed). Notices from the CLI
/// carry a fresh one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin(u64);

impl Origin {
    /// A new random origin.
    pub fn fresh() -> Origin {
        Origin(uuid::Uuid::new_v4().as_u64_pair().0)
    }
}

/// The prepared `pg_notify` on one connection.
async fn prepare_notify(client: &Client) -> Result<Statement, tokio_postgres::Error> {
    client.prepare("SELECT pg_notify($1, $2)").await
}

/// Sends `notice` from `origin` on `client`, within `SEND_WAIT`.
async fn send(client: &Client, statement: &Statement, origin: Origin, notice: &Notice) -> Result<(), String> {
    let payload = notice.encode(origin);
    match tokio::time::timeout(SEND_WAIT, client.execute(statement, &[&CHANNEL, &payload])).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(crate::store::engine::postgres::describe(&e)),
        Err(_) => Err(format!("no answer within {SEND_WAIT:?}")),
    }
}

/// Bounded exponential backoff between connection attempts.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff { next: RECONNECT_BACKOFF_MIN }
    }

    fn reset(&mut self) {
        self.next = RECONNECT_BACKOFF_MIN;
    }

    /// Waits the current backoff (doubling the next one); false when `stop` came first.
    async fn wait(&mut self, stop: &CancellationToken) -> bool {
        let wait = self.next;
        self.next = (self.next * 2).min(RECONNECT_BACKOFF_MAX);
        tokio::select! {
            _ = tokio::time::sleep(wait) => true,
            _ = stop.cancelled() => false,
        }
    }
}

/// What an `Announcer`'s handles and its task share.
#[derive(Debug)]
struct Queue {
    /// Everything announced and not yet sent, merged.
    pending: Mutex<Notice>,
    /// Signalled when `pending` gains something.
    ready: Notify,
}

impl Queue {
    fn add(&self, notice: Notice) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).merge(notice);
        self.ready.notify_one();
    }

    fn take(&self) -> Notice {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The hub's handle for telling the other hubs what it committed. Cloning is cheap;
/// `announce` never waits. A background task with its own connection sends what piled up
/// while it was busy as one payload; it ends at shutdown or when the last handle is dropped.
#[derive(Debug, Clone)]
pub struct Announcer {
    queue: Arc<Queue>,
    origin: Origin,
    /// Stops the task when the last handle goes.
    _stop: Arc<DropGuard>,
}

impl Announcer {
    /// Starts the task that sends to the database at `url` as `origin` (the hub's, shared with
    /// its `listen`), until `shutdown`. It connects when it first has something to send. Call
    /// it inside a tokio runtime, where the task runs.
    pub fn start(url: PgUrl, origin: Origin, shutdown: &CancellationToken) -> Announcer {
        let queue = Arc::new(Queue { pending: Mutex::new(Notice::default()), ready: Notify::new() });
        let stop = shutdown.child_token();
        tokio::spawn(announce_task(url, origin, queue.clone(), stop.clone()));
        Announcer { queue, origin, _stop: Arc::new(stop.drop_guard()) }
    }

    /// Tells the other hubs about a committed change (call it after the commit). Returns at
    /// once; the notice goes out with the others that pile up meanwhile.
    pub fn announce(&self, notice: Notice) {
        if !notice.is_empty() {
            self.queue.add(notice);
        }
    }

    /// The origin its notices carry.
    pub fn origin(&self) -> Origin {
        self.origin
    }
}

/// The announcer's loop: wait for something pending, send it all, and on any failure keep
/// "everything changed" pending, drop the connection and try again after a backoff.
async fn announce_task(url: PgUrl, origin: Origin, queue: Arc<Queue>, stop: CancellationToken) {
    let mut conn: Option<(Client, Statement)> = None;
    let mut backoff = Backoff::new();
    loop {
        tokio::select! {
            _ = queue.ready.notified() => {}
            _ = stop.cancelled() => break,
        }
        let notice = queue.take();
        if notice.is_empty() {
            continue;
        }
        let failure = tokio::select! {
            r = connect_and_send(&url, &mut conn, origin, &notice) => r.err(),
            _ = stop.cancelled() => break,
        };
        match failure {
            None => backoff.reset(),
            Some(why) => {
                tracing::warn!(database = %url.shown(), error = %why,
                    "could not tell the other hubs about a change; will say everything changed once reconnected");
                conn = None;
                // What could not be sent, and anything that was missed with it.
                queue.add(Notice::everything());
                if !backoff.wait(&stop).await {
                    break;
                }
            }
        }
    }
    // A last send of what the hub committed before it stopped, if the connection is up.
    let notice = queue.take();
    if let (false, Some((client, statement))) = (notice.is_empty(), &conn) {
        let _ = send(client, statement, origin, &notice).await;
    }
}

/// Sends `notice` on `conn`, connecting first when there is no live connection.
async fn connect_and_send(
    url: &PgUrl,
    conn: &mut Option<(Client, Statement)>,
    origin: Origin,
    notice: &Notice,
) -> Result<(), String> {
    if conn.as_ref().is_none_or(|(client, _)| client.is_closed()) {
        *conn = None;
        let client = crate::store::engine::postgres::connect(url).await.map_err(|e| e.to_string())?;
        let statement = prepare_notify(&client).await.map_err(|e| crate::store::engine::postgres::describe(&e))?;
        *conn = Some((client, statement));
    }
    match conn {
        Some((client, statement)) => send(client, statement, origin, notice).await,
        None => Err("no connection".into()),
    }
}

/// Sends one notice to the hubs of the database at `url` and closes the connection: for the
/// CLI after it committed a change. A failure is returned for the command to report; the
/// change is committed either way, and the hubs' waiting claims see it at their own timeout.
pub async fn announce_once(url: &PgUrl, notice: &Notice) -> Result<(), PgError> {
    let other = |detail: String| PgError::Other { url: url.shown().to_owned(), detail };
    let client = crate::store::engine::postgres::connect(url).await?;
    let statement = prepare_notify(&client).await.map_err(|e| PgError::from_client(url, &e))?;
    send(&client, &statement, Origin::fresh(), notice).await.map_err(other)
}

/// Listens on `CHANNEL` of the database at `url` with a connection of its own, calling
/// `handler` with each notice from another origin than `me`, until `shutdown`.
///
/// Each time it starts listening (the first time and after every reconnection) it first calls
/// `handler` with `Notice::everything()`: notices sent before that moment may have been missed.
/// A payload it cannot read is logged and handed on as `Notice::everything()`. It never ends on
/// a database error: it reconnects with bounded backoff. The task runs on the current tokio
/// runtime; `handler` runs on it too and must not block (waking watch channels is right).
pub fn listen<F>(url: PgUrl, me: Origin, mut handler: F, shutdown: CancellationToken) -> tokio::task::JoinHandle<()>
where
    F: FnMut(Notice) + Send + 'static,
{
    tokio::spawn(async move {
        let mut backoff = Backoff::new();
        loop {
            let why = match listen_once(&url, me, &mut handler, &shutdown, &mut backoff).await {
                Some(why) => why,
                None => return,
            };
            tracing::warn!(database = %url.shown(), error = %why,
                "stopped hearing other hubs' changes; reconnecting");
            if !backoff.wait(&shutdown).await {
                return;
            }
        }
    })
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One connection's listening: `None` at shutdown, else why the connection was given up.
async fn listen_once<F: FnMut(Notice)>(
    url: &PgUrl,
    me: Origin,
    handler: &mut F,
    shutdown: &CancellationToken,
    backoff: &mut Backoff,
) -> Option<String> {
    let opened = tokio::select! {
        r = crate::store::engine::postgres::open(url) => r,
        _ = shutdown.cancelled() => return None,
    };
    let (client, mut connection) = match opened {
        Ok(c) => c,
        Err(e) => return Some(e.to_string()),
    };
    // The connection is driven here, so that its notifications are seen (`connect` would
    // drive it elsewhere and drop them).
    let (tx, mut rx) = mpsc::channel(NOTIFICATIONS_QUEUED_MAX);
    let mut pump = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if tx.send(n).await.is_err() {
                        return None;
                    }
                }
                Some(Ok(AsyncMessage::Notice(n))) => tracing::debug!(message = %n.message(), "database notice"),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Some(crate::store::engine::postgres::describe(&e)),
                None => return None,
            }
        }
    });
    let _pump_guard = AbortOnDrop(pump.abort_handle());
    let statement = format!("LISTEN {CHANNEL}");
    let listening = tokio::select! {
        r = tokio::time::timeout(SEND_WAIT, client.batch_execute(&statement)) => r,
        _ = shutdown.cancelled() => return None,
    };
    match listening {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Some(crate::store::engine::postgres::describe(&e)),
        Err(_) => return Some(format!("LISTEN had no answer within {SEND_WAIT:?}")),
    }
    if backoff.next > RECONNECT_BACKOFF_MIN {
        tracing::info!(database = %url.shown(), "hearing other hubs' changes again");
    }
    backoff.reset();
    handler(Notice::everything());
    let pinger = ping(&client);
    tokio::pin!(pinger);
    loop {
        tokio::select! {
            n = rx.recv() => match n {
                Some(n) => deliver(&n, me, handler),
                None => {
                    let why = (&mut pump).await.ok().flatten();
                    return Some(why.unwrap_or_else(|| "the server closed the connection".into()));
                }
            },
            why = &mut pinger => return Some(why),
            _ = shutdown.cancelled() => return None,
        }
    }
}

/// Checks every `LISTEN_PING_INTERVAL` that `client`'s connection answers (within
/// `SEND_WAIT`); returns why once it does not.
async fn ping(client: &Client) -> String {
    loop {
        tokio::time::sleep(LISTEN_PING_INTERVAL).await;
        match tokio::time::timeout(SEND_WAIT, client.batch_execute("SELECT 1")).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return crate::store::engine::postgres::describe(&e),
            Err(_) => return format!("the connection did not answer within {SEND_WAIT:?}"),
        }
    }
}

/// Hands one notification to `handler`, unless `me` sent it.
fn deliver<F: FnMut(Notice)>(n: &tokio_postgres::Notification, me: Origin, handler: &mut F) {
    if n.channel() != CHANNEL {
        return;
    }
    match Notice::decode(n.payload()) {
        Ok((origin, _)) if origin == me => {}
        Ok((_, notice)) => handler(notice),
        Err(e) => {
            tracing::warn!(error = %e, sender = n.process_id(), "taking an unreadable change notice as everything changed");
            handler(Notice::everything());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const O: Origin = Origin(0x0123_4567_89ab_cdef);

    /// Encodes `notice`, checks the text, and reads it back to the same notice.
    fn check(notice: &Notice, expected: &str) {
        let text = notice.encode(O);
        assert_eq!(text, expected);
        assert_eq!(Notice::decode(&text), Ok((O, notice.clone())));
    }

    fn merged(parts: impl IntoIterator<Item = Notice>) -> Notice {
        let mut n = Notice::default();
        for p in parts {
            n.merge(p);
        }
        n
    }

    #[test]
    fn notices_encode_compactly_and_read_back() {
        check(&Notice::host("alpha"), "baton1 0123456789abcdef w:alpha");
        check(&Notice::all_hosts(), "baton1 0123456789abcdef w");
        check(&Notice::outcomes(), "baton1 0123456789abcdef o");
        check(&Notice::record(), "baton1 0123456789abcdef r");
        check(&Notice::everything(), "baton1 0123456789abcdef w o r");
        check(
            &merged([Notice::host("b"), Notice::outcomes(), Notice::host("a"), Notice::host("b")]),
            "baton1 0123456789abcdef w:a w:b o",
        );
    }

    #[test]
    fn all_hosts_absorbs_hosts_in_either_order() {
        let a = merged([Notice::host("a"), Notice::all_hosts(), Notice::host("b")]);
        assert_eq!(a, Notice::all_hosts());
        assert!(a.covers_host("zed"));
        assert_eq!(a.hosts().count(), 0);
        let b = merged([Notice::record(), Notice::everything()]);
        assert_eq!(b, Notice::everything());
    }

    #[test]
    fn hosts_beyond_the_payload_bound_become_all_hosts() {
        let name = |i: usize| format!("h{i:063}");
        let mut n = Notice::default();
        let mut i = 0;
        while !n.is_all_hosts() {
            n.merge(Notice::host(&name(i)));
            assert!(n.encode(O).len() <= NOTIFY_PAYLOAD_BYTES_MAX);
            i += 1;
        }
        // It held as many as fit, and the one that did not fit made it all hosts.
        let per_host = PAYLOAD_HOST_OVERHEAD_BYTES + 64;
        assert_eq!(i - 1, (NOTIFY_PAYLOAD_BYTES_MAX - PAYLOAD_HEADER_BYTES - PAYLOAD_FLAGS_BYTES_MAX) / per_host);
        assert_eq!(n.encode(O), "baton1 0123456789abcdef w");
        // A full notice with every flag still fits.
        let mut full = Notice::everything();
        full.all_hosts = false;
        for j in 0..i - 1 {
            full.merge(Notice::host(&name(j)));
        }
        assert!(!full.is_all_hosts());
        assert!(full.encode(O).len() <= NOTIFY_PAYLOAD_BYTES_MAX);
    }

    #[test]
    fn anything_but_what_encode_writes_is_refused() {
        for bad in [
            "",
            "baton1",
            "baton2 0123456789abcdef w",
            "baton1 0123456789ABCDEF w",
            "baton1 0123456789abcde w",
            "baton1 0123456789abcdef",
            "baton1 0123456789abcdef x",
            "baton1 0123456789abcdef w:Bad",
            "baton1 0123456789abcdef w:",
            "baton1 0123456789abcdef w:b w:a",
            "baton1 0123456789abcdef w:a w:a",
            "baton1 0123456789abcdef w w:a",
            "baton1 0123456789abcdef o w",
            "baton1 0123456789abcdef  w",
            "baton1 0123456789abcdef w ",
            "baton1 0123456789abcdef r r",
        ] {
            assert!(Notice::decode(bad).is_err(), "{bad:?} was read");
        }
        // Hosts `Notice` would have turned into all hosts.
        let too_many: String = (0..119).map(|i| format!(" w:h{i:063}")).collect();
        assert!(too_many.len() < NOTIFY_PAYLOAD_BYTES_MAX);
        assert!(Notice::decode(&format!("baton1 0123456789abcdef{too_many}")).is_err());
        let e = Notice::decode(&format!("nonsense {}", "x".repeat(1000))).unwrap_err();
        assert!(e.to_string().len() < 300, "{e}");
    }

    #[test]
    fn origins_differ() {
        assert_ne!(Origin::fresh(), Origin::fresh());
    }
}
