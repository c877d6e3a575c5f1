//! The producer's spool: a durable local outbox of messages not yet accepted by the hub, so
//! that a send made while no hub answers (a restart, an outage, a laptop offline) is kept and
//! delivered later instead of being the caller's problem.
//!
//! A message is committed to the spool (`Spooler::spool`, `Spool::push`) before any hub sees
//! it; the delivering loop (`Spooler::flush`) then sends the spooled messages one at a time,
//! oldest first, each with its own idempotency key, and removes each only after the hub
//! confirmed it. Who runs the loop is the caller's choice: `baton send --spool` flushes before
//! it returns, `baton spool flush` on demand, a long-running producer whenever it likes.
//!
//! Layout: this file holds the errors, the bounds and `Spooler` (the async face: the store on
//! a blocking thread, and the loop); `store` is the SQLite file (`Spool`).
//!
//! Invariant: a message leaves the spool only after the hub confirmed it (201, or 200 marked
//! duplicate: the key was accepted before), or by `Spool::discard` of a failed one.
//! Invariant: one request in flight per flush, oldest ready message first: a message is sent
//! only after every earlier message of its conversation was confirmed, so the hub accepts one
//! conversation's spooled messages in the order they were spooled, whatever the outage.
//! Invariant: a message the hub refused for good (every 4xx but 401, 408 and 429) is kept,
//! `failed`, with the hub's status and code, and the later messages of its conversation wait
//! behind it until it is discarded or retried; other conversations go on.
//! Invariant: every try of a message sends the same bytes (the request as spooled): a replay
//! is the hub's duplicate, never a second message.

mod store;

pub use store::{FailedMessage, MIGRATIONS, Ready, SPOOL_FILE, Spool, SpoolStatus, Spooled};

use crate::client::Client;
use crate::error::ClientError;
use crate::limits::{SPOOL_BYTES_MAX_DEFAULT, SPOOL_MESSAGES_MAX_DEFAULT, SPOOL_RETRY_PAUSE_MAX};
use crate::retry::{Backoff, RetryPolicy};
use baton_shared::clock::SharedClock;
use baton_shared::sqlite::OpenError;
use baton_shared::wire::{SubmitRequest, SubmitResponse};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why a spool operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// The spool file was refused: damaged, newer than this binary, missing (read-only open),
    /// unreadable, or a pragma did not read back. The message names the file.
    #[error("spool refused: {0}")]
    Open(#[from] OpenError),
    /// The spool's directory could not be created.
    #[error("spool directory {dir}: {detail}")]
    Directory {
        /// The directory.
        dir: String,
        /// What the system said.
        detail: String,
    },
    /// SQLite failed on an open spool.
    #[error("spool: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A spooled row does not parse or breaks an invariant; the message names the file and row.
    #[error("spool is inconsistent: {0}")]
    Corrupt(String),
    /// The message would take the spool past one of its bounds; nothing was spooled.
    #[error("spool full: {what}; deliver what waits first (`baton spool flush`) or raise the bound")]
    Full {
        /// Which bound, and how full.
        what: String,
    },
    /// The spool holds another message under this idempotency key.
    #[error("spool: idempotency key {key:?} is already spooled (position {position}) with other content")]
    KeyConflict {
        /// The key.
        key: String,
        /// Where the spooled message stands.
        position: i64,
    },
    /// A discard or retry named a position that holds no failed message.
    #[error("spool: no failed message at position {position}")]
    NotFailed {
        /// The position named.
        position: i64,
    },
    /// A bound is out of its range.
    #[error("spool: {0}")]
    Limits(String),
    /// The request could not be written as JSON (a bug).
    #[error("spool: cannot encode the request: {0}")]
    Encode(String),
    /// The blocking task running a spool call failed.
    #[error("spool task failed: {0}")]
    Task(String),
}

impl SpoolError {
    /// Whether the spool itself was refused (a damaged or newer file, or a corrupt row).
    pub fn is_refused(&self) -> bool {
        matches!(self, SpoolError::Open(_) | SpoolError::Corrupt(_))
    }
}

/// The spool's bounds: a push that would pass either is refused (`SpoolError::Full`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpoolLimits {
    /// Messages the spool holds at most, waiting and failed (`spool_messages_max`).
    pub messages_max: u64,
    /// Bytes of spooled requests the spool holds at most (`spool_bytes_max`).
    pub bytes_max: u64,
}

impl Default for SpoolLimits {
    /// `SPOOL_MESSAGES_MAX_DEFAULT` messages, `SPOOL_BYTES_MAX_DEFAULT` bytes.
    fn default() -> Self {
        SpoolLimits { messages_max: SPOOL_MESSAGES_MAX_DEFAULT, bytes_max: SPOOL_BYTES_MAX_DEFAULT }
    }
}

impl SpoolLimits {
    /// Refuses a bound of zero (a spool that can hold nothing).
    pub fn check(&self) -> Result<(), SpoolError> {
        if self.messages_max == 0 {
            return Err(SpoolError::Limits("spool_messages_max must be at least 1".into()));
        }
        if self.bytes_max == 0 {
            return Err(SpoolError::Limits("spool_bytes_max must be at least 1".into()));
        }
        Ok(())
    }
}

/// One message a flush settled.
#[derive(Debug, Clone)]
pub enum Settled {
    /// The hub confirmed it (new, or `duplicate`: accepted before); it left the spool.
    Accepted {
        /// Where it stood in the spool.
        position: i64,
        /// The conversation.
        conversation: String,
        /// The hub's answer.
        response: SubmitResponse,
    },
    /// The hub refused it for good; it stays in the spool, `failed`.
    Refused {
        /// Where it stands in the spool.
        position: i64,
        /// Its idempotency key.
        idempotency_key: String,
        /// The hub's refusal.
        error: ClientError,
    },
}

/// What a flush did and why it stopped.
#[derive(Debug, Clone, Default)]
pub struct FlushReport {
    /// The messages it settled, in the order it settled them.
    pub settled: Vec<Settled>,
    /// Why it stopped with messages still ready: the hub did not answer (or asked to try later)
    /// until the wait ran out, or it refused this producer's certificate (401: no message of
    /// this identity can be accepted, so none is marked failed). `None`: nothing is ready.
    pub stopped: Option<ClientError>,
}

/// The async face of a spool: the store on blocking threads (one connection behind one mutex,
/// never held across an `.await`) and the loop that delivers it through a `Client`.
#[derive(Debug, Clone)]
pub struct Spooler {
    spool: Arc<Mutex<Spool>>,
    client: Client,
    clock: SharedClock,
}

impl Spooler {
    /// Opens (creating when needed) the spool in `dir`, delivering through `client`, with
    /// `clock` for the times it records.
    pub fn open(dir: &Path, limits: SpoolLimits, client: &Client, clock: SharedClock) -> Result<Spooler, SpoolError> {
        let spool = Spool::open(dir, limits)?;
        // The loop paces its own tries; each send is one request.
        let client = client.with_retry(RetryPolicy::once());
        Ok(Spooler { spool: Arc::new(Mutex::new(spool)), client, clock })
    }

    /// Runs `f` on a blocking thread with the spool locked.
    async fn call<T, F>(&self, f: F) -> Result<T, SpoolError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Spool) -> Result<T, SpoolError> + Send + 'static,
    {
        let spool = Arc::clone(&self.spool);
        tokio::task::spawn_blocking(move || {
            let mut guard = spool.lock().map_err(|_| SpoolError::Task("spool mutex poisoned by a panic".into()))?;
            f(&mut guard)
        })
        .await
        .map_err(|e| SpoolError::Task(e.to_string()))?
    }

    /// Commits `req` to the spool (durable when this returns); `flush` delivers it.
    pub async fn spool(&self, req: SubmitRequest) -> Result<Spooled, SpoolError> {
        let now_ms = self.clock.now_ms();
        self.call(move |s| s.push(&req, now_ms)).await
    }

    /// What the spool holds.
    pub async fn status(&self) -> Result<SpoolStatus, SpoolError> {
        self.call(|s| s.status()).await
    }

    /// Delivers the spooled messages, oldest ready first, one request at a time, until none is
    /// ready, or the hub refuses this producer's certificate, or a try finds no hub (or one
    /// asking to try later) after `wait` has passed. Until then such a try is repeated after a
    /// pause (at most `SPOOL_RETRY_PAUSE_MAX`); with `wait` zero, the first such try stops it.
    pub async fn flush(&self, wait: Duration) -> Result<FlushReport, SpoolError> {
        let deadline = Instant::now() + wait;
        let mut pace = Backoff::new(Duration::from_millis(100), SPOOL_RETRY_PAUSE_MAX);
        let mut report = FlushReport::default();
        while let Some(ready) = self.call(|s| s.next_ready()).await? {
            let (position, conversation) = (ready.position, ready.request.conversation.clone());
            let answer = self.client.submit(&ready.request).await;
            let now_ms = self.clock.now_ms();
            match answer {
                Ok(response) => {
                    pace.reset();
                    self.call(move |s| s.confirmed(position)).await?;
                    report.settled.push(Settled::Accepted { position, conversation, response });
                }
                Err(e) if refuses_identity(&e) => {
                    let text = e.to_string();
                    self.call(move |s| s.tried(position, &text, now_ms)).await?;
                    report.stopped = Some(e);
                    return Ok(report);
                }
                Err(e) if refuses_message(&e) => {
                    pace.reset();
                    let (status, code) = e.api().map(|a| (a.status, a.code_text.clone())).unwrap_or((0, String::new()));
                    let text = e.to_string();
                    self.call(move |s| s.failed(position, status, &code, &text, now_ms)).await?;
                    let idempotency_key = ready.request.idempotency_key;
                    report.settled.push(Settled::Refused { position, idempotency_key, error: e });
                }
                Err(e) => {
                    let text = e.to_string();
                    self.call(move |s| s.tried(position, &text, now_ms)).await?;
                    let pause = pace.next_delay();
                    if Instant::now() + pause >= deadline {
                        report.stopped = Some(e);
                        return Ok(report);
                    }
                    tokio::time::sleep(pause).await;
                }
            }
        }
        Ok(report)
    }
}

/// A refusal of this producer, not of the message: 401 (the certificate unknown, expired or
/// revoked) or the TLS alert of a revoked one. Every message would get it; none is failed.
fn refuses_identity(e: &ClientError) -> bool {
    matches!(e, ClientError::CertificateRevoked(_)) || e.api().is_some_and(|a| a.status == 401)
}

/// A refusal of this message for good: a 4xx other than 401, 408 and 429 (invalid, too large,
/// outside the publish scope, the key taken by other content), or a request that cannot be
/// formed. Sending it again unchanged gets the same answer.
fn refuses_message(e: &ClientError) -> bool {
    match e {
        ClientError::Api(a) => (400..500).contains(&a.status) && !matches!(a.status, 401 | 408 | 429),
        ClientError::Invalid(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests;
