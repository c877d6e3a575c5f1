//! `Spool`, the synchronous spool store: one SQLite file, `DIR/spool.db`, opened the strict way
//! (`baton_shared::sqlite::open`: checked, `synchronous=FULL`, WAL, pragmas read back, schema
//! version refused when newer), holding every spooled message the hub has not confirmed.
//!
//! Every change is one transaction, guarded on the row's expected state, its row count checked.

use super::{SpoolError, SpoolLimits};
use baton_shared::sqlite::{OpenOptions, Synchronous};
use baton_shared::wire::SubmitRequest;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use std::path::{Path, PathBuf};

/// The spool's migrations, in order. Append-only.
pub const MIGRATIONS: &[&str] = &[include_str!("../../../../schema/spool/0001-create-spool.sql")];

/// The spool's file in its directory.
pub const SPOOL_FILE: &str = "spool.db";

/// A message committed to the spool: where it stands in the spool's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spooled {
    /// Its position in the spool's order (increasing, never reused).
    pub position: i64,
    /// Its idempotency key, sent unchanged on every try.
    pub idempotency_key: String,
    /// True when the spool already held this key with this content: nothing was added.
    pub already: bool,
}

/// A waiting message, ready to be sent: no failed message of its conversation is ahead of it.
#[derive(Debug, Clone)]
pub struct Ready {
    /// Its position in the spool's order.
    pub position: i64,
    /// The exact request, as spooled.
    pub request: SubmitRequest,
}

/// A message the hub refused for good, kept for inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedMessage {
    /// Its position in the spool's order.
    pub position: i64,
    /// Its idempotency key.
    pub idempotency_key: String,
    /// Its conversation (whose later messages wait behind it).
    pub conversation: String,
    /// The hub's HTTP status.
    pub status: u16,
    /// The hub's error code (empty when its answer had none).
    pub code: String,
    /// The hub's refusal, in full.
    pub error: String,
}

/// What the spool holds now (`baton spool status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolStatus {
    /// The spool file.
    pub path: PathBuf,
    /// Messages waiting to be sent, blocked ones included.
    pub waiting: u64,
    /// Waiting messages behind a failed message of their conversation.
    pub blocked: u64,
    /// Messages the hub refused for good, kept for inspection.
    pub failed: Vec<FailedMessage>,
    /// The bytes of every spooled request (waiting and failed), counted against `bytes_max`.
    pub bytes: u64,
    /// When the oldest waiting message was spooled (ms since the epoch).
    pub oldest_spooled_at_ms: Option<i64>,
    /// The latest error a try to send a waiting message ended with, and when.
    pub last_error: Option<(i64, String)>,
    /// The bounds this spool was opened with.
    pub limits: SpoolLimits,
}

/// The spool store on one connection.
pub struct Spool {
    conn: Connection,
    path: PathBuf,
    limits: SpoolLimits,
}

impl std::fmt::Debug for Spool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spool").field("path", &self.path).field("limits", &self.limits).finish()
    }
}

impl Spool {
    /// Opens the spool in `dir` (creating the directory and the file when missing, migrating an
    /// older one); a damaged spool, or one newer than this binary, is refused naming the file.
    pub fn open(dir: &Path, limits: SpoolLimits) -> Result<Spool, SpoolError> {
        limits.check()?;
        std::fs::create_dir_all(dir)
            .map_err(|e| SpoolError::Directory { dir: dir.display().to_string(), detail: e.to_string() })?;
        let path = dir.join(SPOOL_FILE);
        let opts = OpenOptions { synchronous: Synchronous::Full, ..OpenOptions::default() };
        let conn = baton_shared::sqlite::open(&path, MIGRATIONS, opts)?;
        Ok(Spool { conn, path, limits })
    }

    /// Opens an existing spool read-only (`status`); a missing one is `Open(Missing)`.
    pub fn open_read_only(dir: &Path, limits: SpoolLimits) -> Result<Spool, SpoolError> {
        let path = dir.join(SPOOL_FILE);
        let opts = OpenOptions { read_only: true, create: false, ..OpenOptions::default() };
        let conn = baton_shared::sqlite::open(&path, MIGRATIONS, opts)?;
        Ok(Spool { conn, path, limits })
    }

    /// The spool file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Commits `req` to the spool, after every message spooled before it; durable when this
    /// returns. The same key with the same request again adds nothing (`already`); the same key
    /// with another request is `KeyConflict`. Refused with `Full` when it would take the spool
    /// past `messages_max` or `bytes_max`.
    pub fn push(&mut self, req: &SubmitRequest, now_ms: i64) -> Result<Spooled, SpoolError> {
        let request = serde_json::to_string(req).map_err(|e| SpoolError::Encode(e.to_string()))?;
        let bytes = request.len() as u64;
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let found: Option<(i64, String)> = tx
            .prepare_cached("SELECT position, request FROM spool WHERE idempotency_key = ?1")?
            .query_row([&req.idempotency_key], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        if let Some((position, stored)) = found {
            if stored != request {
                return Err(SpoolError::KeyConflict { key: req.idempotency_key.clone(), position });
            }
            return Ok(Spooled { position, idempotency_key: req.idempotency_key.clone(), already: true });
        }
        let (count, total): (i64, i64) = tx
            .prepare_cached("SELECT count(*), coalesce(sum(bytes), 0) FROM spool")?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let (count, total) = (count as u64, total as u64);
        if count + 1 > self.limits.messages_max {
            return Err(SpoolError::Full {
                what: format!("{count} messages are spooled; spool_messages_max is {}", self.limits.messages_max),
            });
        }
        if total + bytes > self.limits.bytes_max {
            return Err(SpoolError::Full {
                what: format!(
                    "{total} bytes are spooled and this message has {bytes}; spool_bytes_max is {}",
                    self.limits.bytes_max
                ),
            });
        }
        tx.prepare_cached(
            "INSERT INTO spool (idempotency_key, conversation, request, bytes, spooled_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute((&req.idempotency_key, &req.conversation, &request, bytes as i64, now_ms))?;
        let position = tx.last_insert_rowid();
        tx.commit()?;
        Ok(Spooled { position, idempotency_key: req.idempotency_key.clone(), already: false })
    }

    /// The oldest waiting message that no failed message of its own conversation is ahead of.
    pub fn next_ready(&self) -> Result<Option<Ready>, SpoolError> {
        let row: Option<(i64, String, String)> = self
            .conn
            .prepare_cached(
                "SELECT s.position, s.idempotency_key, s.request FROM spool s
                 WHERE s.state = 'waiting' AND NOT EXISTS (
                     SELECT 1 FROM spool f
                     WHERE f.conversation = s.conversation AND f.state = 'failed' AND f.position < s.position)
                 ORDER BY s.position LIMIT 1",
            )?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?;
        let Some((position, key, text)) = row else { return Ok(None) };
        let request: SubmitRequest = serde_json::from_str(&text).map_err(|e| {
            SpoolError::Corrupt(format!("{}: spool position {position}: not a message ({e})", self.path.display()))
        })?;
        if request.idempotency_key != key {
            return Err(SpoolError::Corrupt(format!(
                "{}: spool position {position}: its request names another idempotency key",
                self.path.display()
            )));
        }
        Ok(Some(Ready { position, request }))
    }

    /// Removes the message at `position` once the hub confirmed it (accepted, or answered that
    /// it already had it). Returns false when it was no longer there (another flush removed it).
    pub fn confirmed(&mut self, position: i64) -> Result<bool, SpoolError> {
        let n = self
            .conn
            .prepare_cached("DELETE FROM spool WHERE position = ?1 AND state = 'waiting'")?
            .execute([position])?;
        Ok(n == 1)
    }

    /// Records a try of the message at `position` that ended with no answer, or an answer that
    /// asks to try later; it keeps its place.
    pub fn tried(&mut self, position: i64, error: &str, now_ms: i64) -> Result<(), SpoolError> {
        self.conn
            .prepare_cached(
                "UPDATE spool SET tries = tries + 1, last_try_at_ms = ?2, last_error = ?3
                 WHERE position = ?1 AND state = 'waiting'",
            )?
            .execute((position, now_ms, error))?;
        Ok(())
    }

    /// Marks the message at `position` refused for good by the hub (`status`, `code`, its
    /// whole refusal `error`): kept for inspection, never sent again unless `retry` says so;
    /// the later messages of its conversation wait behind it. Returns false when it was no
    /// longer waiting.
    pub fn failed(
        &mut self,
        position: i64,
        status: u16,
        code: &str,
        error: &str,
        now_ms: i64,
    ) -> Result<bool, SpoolError> {
        let n = self
            .conn
            .prepare_cached(
                "UPDATE spool SET state = 'failed', failed_status = ?2, failed_code = ?3, last_error = ?4,
                 tries = tries + 1, last_try_at_ms = ?5 WHERE position = ?1 AND state = 'waiting'",
            )?
            .execute((position, i64::from(status), code, error, now_ms))?;
        Ok(n == 1)
    }

    /// Removes the failed message at `position` for good: the messages behind it in its
    /// conversation go on. Only a failed message can be discarded (a waiting one may be on its
    /// way to the hub).
    pub fn discard(&mut self, position: i64) -> Result<(), SpoolError> {
        let n = self
            .conn
            .prepare_cached("DELETE FROM spool WHERE position = ?1 AND state = 'failed'")?
            .execute([position])?;
        if n == 1 { Ok(()) } else { Err(SpoolError::NotFailed { position }) }
    }

    /// Makes the failed message at `position` wait again, in its old place (after, say, the
    /// operator widened the producer's publish scope).
    pub fn retry(&mut self, position: i64) -> Result<(), SpoolError> {
        let n = self
            .conn
            .prepare_cached(
                "UPDATE spool SET state = 'waiting', failed_status = NULL, failed_code = NULL
                 WHERE position = ?1 AND state = 'failed'",
            )?
            .execute([position])?;
        if n == 1 { Ok(()) } else { Err(SpoolError::NotFailed { position }) }
    }

    /// What the spool holds.
    pub fn status(&self) -> Result<SpoolStatus, SpoolError> {
        let (waiting, bytes, oldest): (i64, i64, Option<i64>) = self
            .conn
            .prepare_cached(
                "SELECT (SELECT count(*) FROM spool WHERE state = 'waiting'),
                        (SELECT coalesce(sum(bytes), 0) FROM spool),
                        (SELECT min(spooled_at_ms) FROM spool WHERE state = 'waiting')",
            )?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        let blocked: i64 = self
            .conn
            .prepare_cached(
                "SELECT count(*) FROM spool s WHERE s.state = 'waiting' AND EXISTS (
                     SELECT 1 FROM spool f
                     WHERE f.conversation = s.conversation AND f.state = 'failed' AND f.position < s.position)",
            )?
            .query_row([], |r| r.get(0))?;
        let last_error: Option<(i64, String)> = self
            .conn
            .prepare_cached(
                "SELECT last_try_at_ms, last_error FROM spool
                 WHERE state = 'waiting' AND last_error IS NOT NULL ORDER BY last_try_at_ms DESC LIMIT 1",
            )?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        let mut st = self.conn.prepare_cached(
            "SELECT position, idempotency_key, conversation, failed_status, coalesce(failed_code, ''),
                    coalesce(last_error, '')
             FROM spool WHERE state = 'failed' ORDER BY position",
        )?;
        let rows = st.query_map([], |r| {
            Ok(FailedMessage {
                position: r.get(0)?,
                idempotency_key: r.get(1)?,
                conversation: r.get(2)?,
                status: r.get::<_, i64>(3)?.clamp(0, i64::from(u16::MAX)) as u16,
                code: r.get(4)?,
                error: r.get(5)?,
            })
        })?;
        let failed = rows.collect::<Result<Vec<_>, _>>()?;
        Ok(SpoolStatus {
            path: self.path.clone(),
            waiting: waiting as u64,
            blocked: blocked as u64,
            failed,
            bytes: bytes as u64,
            oldest_spooled_at_ms: oldest,
            last_error,
            limits: self.limits,
        })
    }

    /// The idempotency keys of every spooled message, in the spool's order, with their state
    /// (for tests and inspection).
    pub fn keys(&self) -> Result<Vec<(i64, String, String)>, SpoolError> {
        let mut st =
            self.conn.prepare_cached("SELECT position, idempotency_key, state FROM spool ORDER BY position")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// The underlying connection, for tests that inspect rows directly.
    #[cfg(test)]
    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }
}
