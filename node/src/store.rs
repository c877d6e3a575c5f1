//! The node store: one SQLite file (`data_dir/node.db`) holding the instance id, the mirrored
//! deliveries, the execution queue, attempts with durable start and end markers, and the
//! report outbox.
//!
//! Invariant: one `Connection`, behind one `Mutex`, used only inside `spawn_blocking`
//! (`Store::call`); no lock is ever held across an `.await`.
//! Invariant: every state change is one `BEGIN IMMEDIATE` transaction guarded on the expected
//! current state, and the affected row count is checked.
//! Invariant (execution gate): `Db::start_attempt` only starts an execution whose delivery is
//! `acked`, i.e. the hub confirmed `delivered`.

use baton_shared::sqlite::{OpenError, OpenOptions, Synchronous};
use baton_shared::states::Outcome;
use baton_shared::wire::{ClaimedDelivery, ReportRequest};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, named_params};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The node store's migrations, in order. Append-only.
pub const MIGRATIONS: &[&str] = &[include_str!("../../schema/node/0001-create-node-store.sql")];

/// The reason recorded for an attempt found started but not ended at startup.
pub const REASON_RESTARTED: &str = "node restarted during execution";

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be opened (damaged, newer than this binary, bad pragma, ...).
    #[error(transparent)]
    Open(#[from] OpenError),
    /// SQLite failed.
    #[error("node store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A row breaks one of our own invariants (a bug, or a file edited by hand).
    #[error("node store is inconsistent: {0}")]
    Corrupt(String),
    /// A guarded transition found the row in another state.
    #[error("node store: {0}")]
    Conflict(String),
    /// The blocking task running the store call failed.
    #[error("node store task failed: {0}")]
    Task(String),
}

impl StoreError {
    /// Whether this error means the store file itself was refused (exit code 3).
    pub fn is_refused(&self) -> bool {
        matches!(self, StoreError::Open(o) if StoreError::is_refused_open(o))
    }

    /// Whether an open error means the file was refused (damaged, newer, failed migration).
    pub fn is_refused_open(e: &OpenError) -> bool {
        matches!(e, OpenError::Damaged { .. } | OpenError::TooNew { .. } | OpenError::Migration { .. })
    }
}

/// The local lifecycle of a mirrored delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalState {
    /// Local copy committed; the hub has not confirmed the ack yet. Must not run.
    Mirrored,
    /// The hub confirmed `delivered`: the execution gate is open.
    Acked,
    /// Its attempt's report was confirmed (or is dead). Nothing more to do.
    Done,
    /// The hub said it is not ours any more. Never runs.
    Dropped,
}

impl LocalState {
    fn parse(s: &str) -> Result<LocalState, StoreError> {
        Ok(match s {
            "mirrored" => LocalState::Mirrored,
            "acked" => LocalState::Acked,
            "done" => LocalState::Done,
            "dropped" => LocalState::Dropped,
            other => return Err(StoreError::Corrupt(format!("unknown delivery state {other:?}"))),
        })
    }
}

/// Where a delivery's execution is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecState {
    /// Waiting for the gate and for its turn in the conversation.
    Queued,
    /// Start marker written; the attempt has not ended.
    Started,
    /// End marker written.
    Ended,
    /// Dropped before it ran.
    Cancelled,
}

impl ExecState {
    fn parse(s: &str) -> Result<ExecState, StoreError> {
        Ok(match s {
            "queued" => ExecState::Queued,
            "started" => ExecState::Started,
            "ended" => ExecState::Ended,
            "cancelled" => ExecState::Cancelled,
            other => return Err(StoreError::Corrupt(format!("unknown execution state {other:?}"))),
        })
    }
}

/// Where an ended attempt's report is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportState {
    /// Waiting in the outbox for the hub's confirmation.
    Pending,
    /// The hub confirmed it.
    Confirmed,
    /// The hub refused it for good (409); it will not be retried.
    Dead,
}

/// What the node knows locally about one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalDelivery {
    /// The delivery's id.
    pub delivery_id: String,
    /// The claim token it was mirrored with.
    pub claim_token: String,
    /// Its local lifecycle state.
    pub state: LocalState,
    /// Its execution's state.
    pub exec: ExecState,
    /// The report of its (latest) attempt, when that attempt ended.
    pub report: Option<(String, ReportState)>,
}

/// What `Db::mirror` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mirrored {
    /// A new local copy and a queued execution were written.
    New,
    /// The same claim was already mirrored; nothing changed (except opening the gate if asked).
    Existing,
    /// An older copy (dropped, or another claim token) was replaced by this claim.
    Replaced,
    /// Its execution already started or ended; nothing changed.
    AlreadyRan,
}

/// A queued execution as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedTurn {
    /// The delivery's id.
    pub delivery_id: String,
    /// Its conversation.
    pub conversation: String,
    /// Its sequence number in the conversation.
    pub seq: i64,
    /// Whether the hub confirmed the ack (only then may it run).
    pub acked: bool,
    /// When it was queued (unix milliseconds); older conversations go first.
    pub queued_at_ms: i64,
}

/// An execution whose start marker is durable: everything the executor needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartedTurn {
    /// The attempt's id (also the report id).
    pub attempt_id: String,
    /// The delivery's id.
    pub delivery_id: String,
    /// The message's id.
    pub message_id: String,
    /// The conversation.
    pub conversation: String,
    /// The sequence number.
    pub seq: i64,
    /// The payload, serialised JSON, exactly as mirrored; fed to the harness on stdin.
    pub payload: String,
}

/// How an attempt ended, to be written as its end marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    /// The outcome.
    pub outcome: Outcome,
    /// The exit status, when the harness exited.
    pub exit_code: Option<i32>,
    /// How long it ran.
    pub duration_ms: Option<u64>,
    /// The bounded result (stdout).
    pub result: Option<String>,
    /// Why, when the outcome needs explaining (timeout, signal, shutdown, restart).
    pub reason: Option<String>,
}

/// One report waiting in the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEntry {
    /// The report id (= attempt id).
    pub report_id: String,
    /// The delivery reported on.
    pub delivery_id: String,
    /// The exact request body.
    pub body: ReportRequest,
}

/// Counts and lists for `baton-node status`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// The instance id, when one was created.
    pub instance_id: Option<String>,
    /// `(delivery_id, conversation, seq, local state)` of every delivery not done or dropped.
    pub open: Vec<(String, String, i64, String)>,
    /// Delivery ids whose attempt is running (start marker, no end marker).
    pub running: Vec<String>,
    /// Report ids waiting for the hub.
    pub awaiting_report: Vec<String>,
    /// `(report_id, reason)` of reports the hub refused for good.
    pub dead_reports: Vec<(String, String)>,
    /// `(local state, count)` for every delivery state present.
    pub counts: Vec<(String, i64)>,
}

/// The synchronous store operations on one connection.
pub struct Db {
    conn: Connection,
}

impl Db {
    /// Opens (creating and migrating when needed) the store for writing.
    pub fn open(path: &Path, synchronous: Synchronous) -> Result<Db, StoreError> {
        let conn = baton_shared::sqlite::open(path, MIGRATIONS, OpenOptions { synchronous, ..OpenOptions::default() })?;
        Ok(Db { conn })
    }

    /// Opens an existing store read-only (for `status`).
    pub fn open_read_only(path: &Path) -> Result<Db, StoreError> {
        let opts = OpenOptions { read_only: true, create: false, ..OpenOptions::default() };
        Ok(Db { conn: baton_shared::sqlite::open(path, MIGRATIONS, opts)? })
    }

    /// The instance id, created (UUID v4) and stored on first call for this store.
    pub fn instance_id(&mut self) -> Result<String, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let found: Option<String> =
            tx.query_row("SELECT value FROM meta WHERE key = 'instance_id'", [], |r| r.get(0)).optional()?;
        let id = match found {
            Some(id) => id,
            None => {
                let id = uuid::Uuid::new_v4().to_string();
                tx.execute("INSERT INTO meta(key, value) VALUES ('instance_id', ?1)", [&id])?;
                id
            }
        };
        tx.commit()?;
        baton_shared::ids::check_token("instance_id", &id).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        Ok(id)
    }

    /// Mirrors a delivery and queues its execution, in one transaction. With `acked` (the hub
    /// already lists it delivered) the gate is opened in the same transaction.
    pub fn mirror(&mut self, d: &ClaimedDelivery, acked: bool, now_ms: i64) -> Result<Mirrored, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let done = mirror_in(&tx, d, acked, now_ms)?;
        tx.commit()?;
        Ok(done)
    }

    /// Mirrors a claim batch: every delivery with its queued execution, all in one
    /// transaction (one fsync for the batch).
    pub fn mirror_batch(&mut self, ds: &[ClaimedDelivery], now_ms: i64) -> Result<Vec<Mirrored>, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let done = ds.iter().map(|d| mirror_in(&tx, d, false, now_ms)).collect::<Result<Vec<_>, _>>()?;
        tx.commit()?;
        Ok(done)
    }

    /// Opens the execution gate: the hub confirmed the ack of this claim. Returns whether the
    /// delivery moved (false when it was already acked, or is not this claim's).
    pub fn mark_acked(&mut self, delivery_id: &str, claim_token: &str, now_ms: i64) -> Result<bool, StoreError> {
        let n = self.conn.execute(
            "UPDATE deliveries SET state = 'acked', updated_at_ms = ?3
             WHERE delivery_id = ?1 AND claim_token = ?2 AND state = 'mirrored'",
            (delivery_id, claim_token, now_ms),
        )?;
        Ok(n == 1)
    }

    /// Drops a delivery that is not ours any more: it will never run. Only a delivery whose gate
    /// is still closed can be dropped. Returns whether it was dropped.
    pub fn drop_delivery(&mut self, delivery_id: &str, reason: &str, now_ms: i64) -> Result<bool, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = tx.execute(
            "UPDATE deliveries SET state = 'dropped', reason = ?2, updated_at_ms = ?3
             WHERE delivery_id = ?1 AND state = 'mirrored'",
            (delivery_id, reason, now_ms),
        )?;
        if n == 1 {
            let e = tx.execute(
                "UPDATE executions SET state = 'cancelled' WHERE delivery_id = ?1 AND state = 'queued'",
                [delivery_id],
            )?;
            assert_eq!(e, 1, "a mirrored delivery has a queued execution");
        }
        tx.commit()?;
        Ok(n == 1)
    }

    /// What the node knows about one delivery, if anything.
    pub fn local(&self, delivery_id: &str) -> Result<Option<LocalDelivery>, StoreError> {
        let row: Option<(String, String, Option<String>)> = self
            .conn
            .query_row(
                "SELECT d.claim_token, d.state, e.state FROM deliveries d
                 LEFT JOIN executions e ON e.delivery_id = d.delivery_id WHERE d.delivery_id = ?1",
                [delivery_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((claim_token, state, exec)) = row else { return Ok(None) };
        let exec = exec.ok_or_else(|| StoreError::Corrupt(format!("delivery {delivery_id} has no execution row")))?;
        let report: Option<(String, Option<i64>, Option<i64>)> = self
            .conn
            .query_row(
                "SELECT o.report_id, o.confirmed_at_ms, o.dead_at_ms FROM outbox o
                 WHERE o.delivery_id = ?1 ORDER BY o.created_at_ms DESC LIMIT 1",
                [delivery_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let report = report.map(|(id, confirmed, dead)| {
            let st = match (confirmed, dead) {
                (_, Some(_)) => ReportState::Dead,
                (Some(_), None) => ReportState::Confirmed,
                (None, None) => ReportState::Pending,
            };
            (id, st)
        });
        Ok(Some(LocalDelivery {
            delivery_id: delivery_id.to_string(),
            claim_token,
            state: LocalState::parse(&state)?,
            exec: ExecState::parse(&exec)?,
            report,
        }))
    }

    /// Deliveries whose gate is still closed (`mirrored`), with their claim tokens.
    pub fn unacked(&self) -> Result<Vec<(String, String)>, StoreError> {
        let mut st = self.conn.prepare_cached(
            "SELECT delivery_id, claim_token FROM deliveries WHERE state = 'mirrored' ORDER BY conversation, seq",
        )?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// How many executions wait locally (queued, not started).
    pub fn queued_count(&self) -> Result<i64, StoreError> {
        Ok(self
            .conn
            .prepare_cached("SELECT count(*) FROM executions WHERE state = 'queued'")?
            .query_row([], |r| r.get(0))?)
    }

    /// The head turn of every conversation with queued work (its lowest queued sequence).
    pub fn queued_turns(&self) -> Result<Vec<QueuedTurn>, StoreError> {
        let mut st = self.conn.prepare_cached(
            // Only each conversation's head (lowest queued seq) can start, so only heads are read:
            // the scheduler runs this on every wake, and the local queue can be long.
            "SELECT e.delivery_id, e.conversation, e.seq, d.state = 'acked', e.queued_at_ms
             FROM (SELECT conversation, min(seq) AS seq FROM executions WHERE state = 'queued' GROUP BY conversation) h
             JOIN executions e ON e.conversation = h.conversation AND e.seq = h.seq AND e.state = 'queued'
             JOIN deliveries d ON d.delivery_id = e.delivery_id
             ORDER BY e.conversation, e.seq",
        )?;
        let rows = st.query_map([], |r| {
            Ok(QueuedTurn {
                delivery_id: r.get(0)?,
                conversation: r.get(1)?,
                seq: r.get(2)?,
                acked: r.get(3)?,
                queued_at_ms: r.get(4)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Writes the durable start marker of a new attempt, if the execution is queued and its
    /// gate is open. Returns `None` (and writes nothing) otherwise.
    pub fn start_attempt(&mut self, delivery_id: &str, now_ms: i64) -> Result<Option<StartedTurn>, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = tx.execute(
            "UPDATE executions SET state = 'started'
             WHERE delivery_id = ?1 AND state = 'queued'
               AND EXISTS (SELECT 1 FROM deliveries d WHERE d.delivery_id = ?1 AND d.state = 'acked')",
            [delivery_id],
        )?;
        if n == 0 {
            return Ok(None);
        }
        let attempt_id = uuid::Uuid::now_v7().to_string();
        tx.execute(
            "INSERT INTO attempts(attempt_id, delivery_id, started_at_ms) VALUES (?1, ?2, ?3)",
            (&attempt_id, delivery_id, now_ms),
        )?;
        let turn = tx.query_row(
            "SELECT message_id, conversation, seq, payload FROM deliveries WHERE delivery_id = ?1",
            [delivery_id],
            |r| {
                Ok(StartedTurn {
                    attempt_id: attempt_id.clone(),
                    delivery_id: delivery_id.to_string(),
                    message_id: r.get(0)?,
                    conversation: r.get(1)?,
                    seq: r.get(2)?,
                    payload: r.get(3)?,
                })
            },
        )?;
        tx.commit()?;
        Ok(Some(turn))
    }

    /// Writes the durable end marker of an attempt and queues its report, in one transaction.
    pub fn end_attempt(&mut self, attempt_id: &str, ending: &Ending, now_ms: i64) -> Result<(), StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        end_attempt_in(&tx, attempt_id, ending, now_ms)?;
        tx.commit()?;
        Ok(())
    }

    /// Startup recovery: every attempt with a start marker and no end marker was interrupted
    /// by a crash. It is ended as `unknown` and reported, never run again. Returns their ids.
    pub fn recover_interrupted_attempts(&mut self, now_ms: i64) -> Result<Vec<String>, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let ids: Vec<String> = {
            let mut st = tx.prepare("SELECT attempt_id FROM attempts WHERE ended_at_ms IS NULL ORDER BY attempt_id")?;
            st.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?
        };
        let ending = Ending {
            outcome: Outcome::Unknown,
            exit_code: None,
            duration_ms: None,
            result: None,
            reason: Some(REASON_RESTARTED.to_string()),
        };
        for id in &ids {
            end_attempt_in(&tx, id, &ending, now_ms)?;
        }
        tx.commit()?;
        Ok(ids)
    }

    /// Up to `limit` reports not yet confirmed nor dead, oldest first.
    pub fn pending_reports(&self, limit: u32) -> Result<Vec<OutboxEntry>, StoreError> {
        let mut st = self.conn.prepare_cached(
            "SELECT report_id, delivery_id, body FROM outbox
             WHERE confirmed_at_ms IS NULL AND dead_at_ms IS NULL ORDER BY created_at_ms, report_id LIMIT ?1",
        )?;
        let rows =
            st.query_map([limit], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (report_id, delivery_id, body) = row?;
            let body: ReportRequest = serde_json::from_str(&body)
                .map_err(|e| StoreError::Corrupt(format!("outbox {report_id}: body is not a report: {e}")))?;
            if body.report_id != report_id || body.delivery_id != delivery_id {
                return Err(StoreError::Corrupt(format!("outbox {report_id}: body names another report")));
            }
            out.push(OutboxEntry { report_id, delivery_id, body });
        }
        Ok(out)
    }

    /// Records a failed try to send a report.
    pub fn report_tried(&mut self, report_id: &str, error: &str, now_ms: i64) -> Result<(), StoreError> {
        self.conn.execute(
            "UPDATE outbox SET tries = tries + 1, last_try_at_ms = ?2, last_error = ?3 WHERE report_id = ?1",
            (report_id, now_ms, error),
        )?;
        Ok(())
    }

    /// Marks a report confirmed by the hub; its delivery is done.
    pub fn report_confirmed(&mut self, report_id: &str, now_ms: i64) -> Result<(), StoreError> {
        self.finish_report(report_id, None, now_ms)
    }

    /// Marks a report refused for good (never retried); its delivery is done, with the reason.
    pub fn report_dead(&mut self, report_id: &str, reason: &str, now_ms: i64) -> Result<(), StoreError> {
        self.finish_report(report_id, Some(reason), now_ms)
    }

    fn finish_report(&mut self, report_id: &str, dead: Option<&str>, now_ms: i64) -> Result<(), StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = match dead {
            None => tx.execute(
                "UPDATE outbox SET confirmed_at_ms = ?2, tries = tries + 1, last_try_at_ms = ?2, last_error = NULL
                 WHERE report_id = ?1 AND confirmed_at_ms IS NULL AND dead_at_ms IS NULL",
                (report_id, now_ms),
            )?,
            Some(reason) => tx.execute(
                "UPDATE outbox SET dead_at_ms = ?2, dead_reason = ?3, tries = tries + 1, last_try_at_ms = ?2
                 WHERE report_id = ?1 AND confirmed_at_ms IS NULL AND dead_at_ms IS NULL",
                (report_id, now_ms, reason),
            )?,
        };
        if n != 1 {
            return Err(StoreError::Conflict(format!("report {report_id} is not pending")));
        }
        tx.execute(
            "UPDATE deliveries SET state = 'done', reason = ?2, updated_at_ms = ?3
             WHERE delivery_id = (SELECT delivery_id FROM outbox WHERE report_id = ?1)",
            (report_id, dead, now_ms),
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Puts a confirmed report back in the outbox (the hub lists its delivery without an
    /// outcome, so it must not have kept it). The same report id makes the resend idempotent.
    pub fn reopen_report(&mut self, report_id: &str) -> Result<bool, StoreError> {
        let n = self.conn.execute(
            "UPDATE outbox SET confirmed_at_ms = NULL WHERE report_id = ?1 AND confirmed_at_ms IS NOT NULL",
            [report_id],
        )?;
        Ok(n == 1)
    }

    /// Counts and lists of what the node holds, for `status`.
    pub fn summary(&self) -> Result<Summary, StoreError> {
        let instance_id =
            self.conn.query_row("SELECT value FROM meta WHERE key = 'instance_id'", [], |r| r.get(0)).optional()?;
        let strings = |sql: &str| -> Result<Vec<String>, StoreError> {
            let mut st = self.conn.prepare(sql)?;
            Ok(st.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?)
        };
        let mut st = self.conn.prepare(
            "SELECT delivery_id, conversation, seq, state FROM deliveries
             WHERE state IN ('mirrored', 'acked') ORDER BY conversation, seq",
        )?;
        let open = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?.collect::<Result<_, _>>()?;
        let mut st = self.conn.prepare(
            "SELECT report_id, coalesce(dead_reason, '') FROM outbox WHERE dead_at_ms IS NOT NULL ORDER BY created_at_ms",
        )?;
        let dead_reports = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?;
        let mut st = self.conn.prepare("SELECT state, count(*) FROM deliveries GROUP BY state ORDER BY state")?;
        let counts = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?;
        Ok(Summary {
            instance_id,
            open,
            running: strings("SELECT delivery_id FROM attempts WHERE ended_at_ms IS NULL ORDER BY started_at_ms")?,
            awaiting_report: strings(
                "SELECT report_id FROM outbox WHERE confirmed_at_ms IS NULL AND dead_at_ms IS NULL ORDER BY created_at_ms",
            )?,
            dead_reports,
            counts,
        })
    }

    /// The underlying connection, for tests that inspect rows directly.
    #[cfg(test)]
    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }
}

fn mirror_in(
    tx: &rusqlite::Transaction<'_>,
    d: &ClaimedDelivery,
    acked: bool,
    now_ms: i64,
) -> Result<Mirrored, StoreError> {
    let payload = serde_json::to_string(&d.payload).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let state = if acked { "acked" } else { "mirrored" };
    let existing: Option<(String, String, Option<String>)> = tx
        .query_row(
            "SELECT d.claim_token, d.state, e.state FROM deliveries d
             LEFT JOIN executions e ON e.delivery_id = d.delivery_id WHERE d.delivery_id = ?1",
            [&d.delivery_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    let params = named_params! {
        ":id": d.delivery_id, ":message": d.message_id, ":conversation": d.conversation, ":seq": d.seq,
        ":payload": payload, ":token": d.claim_token, ":state": state, ":now": now_ms,
    };
    let done = match existing {
        None => {
            tx.execute(
                "INSERT INTO deliveries(delivery_id, message_id, conversation, seq, payload, claim_token, state,
                     mirrored_at_ms, updated_at_ms)
                 VALUES (:id, :message, :conversation, :seq, :payload, :token, :state, :now, :now)",
                params,
            )?;
            tx.execute(
                "INSERT INTO executions(delivery_id, conversation, seq, state, queued_at_ms)
                 VALUES (?1, ?2, ?3, 'queued', ?4)",
                (&d.delivery_id, &d.conversation, d.seq, now_ms),
            )?;
            Mirrored::New
        }
        Some((_, _, Some(exec))) if exec == "started" || exec == "ended" => Mirrored::AlreadyRan,
        Some((token, local, _)) if token == d.claim_token && local != "dropped" => {
            if acked {
                tx.execute(
                    "UPDATE deliveries SET state = 'acked', updated_at_ms = ?2
                     WHERE delivery_id = ?1 AND state = 'mirrored'",
                    (&d.delivery_id, now_ms),
                )?;
            }
            Mirrored::Existing
        }
        Some(_) => {
            let n = tx.execute(
                "UPDATE deliveries SET message_id = :message, conversation = :conversation, seq = :seq,
                     payload = :payload, claim_token = :token, state = :state, reason = NULL,
                     mirrored_at_ms = :now, updated_at_ms = :now
                 WHERE delivery_id = :id",
                params,
            )?;
            assert_eq!(n, 1, "the row was just read");
            tx.execute(
                "INSERT INTO executions(delivery_id, conversation, seq, state, queued_at_ms)
                 VALUES (?1, ?2, ?3, 'queued', ?4)
                 ON CONFLICT(delivery_id) DO UPDATE SET state = 'queued', conversation = excluded.conversation,
                     seq = excluded.seq, queued_at_ms = excluded.queued_at_ms",
                (&d.delivery_id, &d.conversation, d.seq, now_ms),
            )?;
            Mirrored::Replaced
        }
    };
    Ok(done)
}

fn end_attempt_in(tx: &rusqlite::Transaction<'_>, attempt_id: &str, e: &Ending, now_ms: i64) -> Result<(), StoreError> {
    let n = tx.execute(
        "UPDATE attempts SET ended_at_ms = :now, outcome = :outcome, exit_code = :exit, duration_ms = :duration,
             result = :result, reason = :reason
         WHERE attempt_id = :id AND ended_at_ms IS NULL",
        named_params! {
            ":id": attempt_id, ":now": now_ms, ":outcome": e.outcome.as_str(), ":exit": e.exit_code,
            ":duration": e.duration_ms.map(|d| d as i64), ":result": e.result, ":reason": e.reason,
        },
    )?;
    if n != 1 {
        return Err(StoreError::Conflict(format!("attempt {attempt_id} is not running")));
    }
    let (delivery_id, claim_token): (String, String) = tx.query_row(
        "SELECT d.delivery_id, d.claim_token FROM attempts a JOIN deliveries d ON d.delivery_id = a.delivery_id
         WHERE a.attempt_id = ?1",
        [attempt_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let x = tx.execute(
        "UPDATE executions SET state = 'ended' WHERE delivery_id = ?1 AND state = 'started'",
        [&delivery_id],
    )?;
    if x != 1 {
        return Err(StoreError::Corrupt(format!("attempt {attempt_id} ended but its execution was not started")));
    }
    let instance_id: String = tx.query_row("SELECT value FROM meta WHERE key = 'instance_id'", [], |r| r.get(0))?;
    let body = ReportRequest {
        delivery_id: delivery_id.clone(),
        instance_id,
        claim_token,
        report_id: attempt_id.to_string(),
        outcome: e.outcome,
        exit_code: e.exit_code,
        duration_ms: e.duration_ms,
        result: e.result.clone(),
        reason: e.reason.clone(),
    };
    let body = serde_json::to_string(&body).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    tx.execute(
        "INSERT INTO outbox(report_id, delivery_id, body, created_at_ms) VALUES (?1, ?2, ?3, ?4)",
        (attempt_id, &delivery_id, &body, now_ms),
    )?;
    Ok(())
}

/// The shared, async face of the store: one `Db` behind one mutex, used only on blocking
/// threads.
#[derive(Clone)]
pub struct Store {
    db: Arc<Mutex<Db>>,
}

impl Store {
    /// Wraps an open `Db`.
    pub fn new(db: Db) -> Store {
        Store { db: Arc::new(Mutex::new(db)) }
    }

    /// Runs `f` on a blocking thread with the store locked. The lock never crosses an `.await`.
    pub async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Db) -> Result<T, StoreError> + Send + 'static,
    {
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || {
            let mut guard = db.lock().map_err(|_| StoreError::Task("store mutex poisoned by a panic".into()))?;
            f(&mut guard)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use baton_shared::states::DeliveryState;

    pub(crate) fn delivery(id: &str, conversation: &str, seq: i64) -> ClaimedDelivery {
        ClaimedDelivery {
            delivery_id: id.into(),
            message_id: format!("m-{id}"),
            conversation: conversation.into(),
            seq,
            payload: serde_json::json!({"turn": seq}),
            claim_token: format!("tok-{id}"),
            state: DeliveryState::Claimed,
            producer: Some("prod".into()),
        }
    }

    pub(crate) fn open_temp() -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().unwrap();
        let mut db = Db::open(&dir.path().join("node.db"), Synchronous::Full).unwrap();
        db.instance_id().unwrap();
        (dir, db)
    }

    fn count(db: &Db, sql: &str) -> i64 {
        db.conn().query_row(sql, [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn migrations_apply_to_an_empty_store() {
        let (_dir, db) = open_temp();
        let p = baton_shared::sqlite::pragmas(db.conn()).unwrap();
        assert!(p.contains(&("journal_mode", "wal".into())));
        assert!(p.contains(&("synchronous", "2".into())));
        assert!(p.contains(&("user_version", MIGRATIONS.len().to_string())));
    }

    #[test]
    fn reopen_keeps_the_instance_id_and_a_new_dir_gets_a_new_one() {
        let (dir, mut db) = open_temp();
        let first = db.instance_id().unwrap();
        assert!(uuid::Uuid::parse_str(&first).is_ok());
        drop(db);
        let mut again = Db::open(&dir.path().join("node.db"), Synchronous::Full).unwrap();
        assert_eq!(again.instance_id().unwrap(), first);
        let (_other, mut fresh) = open_temp();
        assert_ne!(fresh.instance_id().unwrap(), first);
    }

    #[test]
    fn mirror_writes_delivery_and_queued_execution_together() {
        let (_dir, mut db) = open_temp();
        let d = delivery("d1", "c", 1);
        assert_eq!(db.mirror(&d, false, 10).unwrap(), Mirrored::New);
        assert_eq!(count(&db, "SELECT count(*) FROM deliveries WHERE state = 'mirrored'"), 1);
        assert_eq!(count(&db, "SELECT count(*) FROM executions WHERE state = 'queued'"), 1);
        assert_eq!(db.mirror(&d, false, 11).unwrap(), Mirrored::Existing);
        let payload: String = db.conn().query_row("SELECT payload FROM deliveries", [], |r| r.get(0)).unwrap();
        assert_eq!(payload, r#"{"turn":1}"#);
    }

    #[test]
    fn a_failed_mirror_leaves_nothing_behind() {
        let (_dir, mut db) = open_temp();
        // An execution row for this id already exists without its delivery: the second insert
        // of the mirror transaction fails, so the first must be rolled back with it.
        db.conn().execute_batch("PRAGMA foreign_keys = OFF;").unwrap();
        db.conn().execute("INSERT INTO executions VALUES ('d1', 'c', 1, 'queued', 0)", []).unwrap();
        db.conn().execute_batch("PRAGMA foreign_keys = ON;").unwrap();
        assert!(db.mirror(&delivery("d1", "c", 1), false, 10).is_err());
        assert_eq!(count(&db, "SELECT count(*) FROM deliveries"), 0);
    }

    #[test]
    fn the_gate_stays_closed_until_acked() {
        let (_dir, mut db) = open_temp();
        db.mirror(&delivery("d1", "c", 1), false, 10).unwrap();
        assert_eq!(db.start_attempt("d1", 11).unwrap(), None, "not acked: must not start");
        assert_eq!(count(&db, "SELECT count(*) FROM attempts"), 0);
        assert!(db.mark_acked("d1", "tok-d1", 12).unwrap());
        let turn = db.start_attempt("d1", 13).unwrap().unwrap();
        assert_eq!(turn.payload, r#"{"turn":1}"#);
        assert_eq!(db.start_attempt("d1", 14).unwrap(), None, "a started execution never starts twice");
    }

    #[test]
    fn dropped_delivery_never_runs_and_acked_cannot_be_dropped() {
        let (_dir, mut db) = open_temp();
        db.mirror(&delivery("d1", "c", 1), false, 10).unwrap();
        assert!(db.drop_delivery("d1", "stale_claim", 11).unwrap());
        assert!(!db.mark_acked("d1", "tok-d1", 12).unwrap());
        assert_eq!(db.start_attempt("d1", 13).unwrap(), None);
        assert!(db.queued_turns().unwrap().is_empty());
        db.mirror(&delivery("d2", "c", 2), true, 10).unwrap();
        assert!(!db.drop_delivery("d2", "x", 11).unwrap());
    }

    #[test]
    fn markers_and_outbox() {
        let (_dir, mut db) = open_temp();
        db.mirror(&delivery("d1", "c", 1), true, 10).unwrap();
        let turn = db.start_attempt("d1", 11).unwrap().unwrap();
        assert_eq!(count(&db, "SELECT count(*) FROM attempts WHERE ended_at_ms IS NULL"), 1);
        let ending = Ending {
            outcome: Outcome::Succeeded,
            exit_code: Some(0),
            duration_ms: Some(5),
            result: Some("ok".into()),
            reason: None,
        };
        db.end_attempt(&turn.attempt_id, &ending, 16).unwrap();
        assert!(db.end_attempt(&turn.attempt_id, &ending, 17).is_err(), "an end marker is written once");
        let pending = db.pending_reports(10).unwrap();
        assert_eq!(pending.len(), 1);
        let body = &pending[0].body;
        assert_eq!((body.report_id.as_str(), body.claim_token.as_str()), (turn.attempt_id.as_str(), "tok-d1"));
        assert_eq!(body.result.as_deref(), Some("ok"));
        db.report_tried(&turn.attempt_id, "hub down", 18).unwrap();
        assert_eq!(db.pending_reports(10).unwrap().len(), 1);
        db.report_confirmed(&turn.attempt_id, 19).unwrap();
        assert!(db.pending_reports(10).unwrap().is_empty());
        assert!(db.report_confirmed(&turn.attempt_id, 20).is_err());
        let local = db.local("d1").unwrap().unwrap();
        assert_eq!(local.state, LocalState::Done);
        assert_eq!(local.report, Some((turn.attempt_id.clone(), ReportState::Confirmed)));
    }

    #[test]
    fn interrupted_attempt_becomes_unknown_and_is_never_restarted() {
        let (dir, mut db) = open_temp();
        db.mirror(&delivery("d1", "c", 1), true, 10).unwrap();
        let turn = db.start_attempt("d1", 11).unwrap().unwrap();
        drop(db);
        let mut db = Db::open(&dir.path().join("node.db"), Synchronous::Full).unwrap();
        assert_eq!(db.recover_interrupted_attempts(20).unwrap(), vec![turn.attempt_id.clone()]);
        assert!(db.recover_interrupted_attempts(21).unwrap().is_empty());
        assert_eq!(db.start_attempt("d1", 22).unwrap(), None);
        let r = &db.pending_reports(10).unwrap()[0].body;
        assert_eq!(r.outcome, Outcome::Unknown);
        assert_eq!(r.reason.as_deref(), Some(REASON_RESTARTED));
        assert_eq!(db.local("d1").unwrap().unwrap().exec, ExecState::Ended);
    }

    #[test]
    fn dead_report_is_not_retried() {
        let (_dir, mut db) = open_temp();
        db.mirror(&delivery("d1", "c", 1), true, 10).unwrap();
        let turn = db.start_attempt("d1", 11).unwrap().unwrap();
        let ending =
            Ending { outcome: Outcome::Failed, exit_code: Some(3), duration_ms: Some(1), result: None, reason: None };
        db.end_attempt(&turn.attempt_id, &ending, 12).unwrap();
        db.report_dead(&turn.attempt_id, "stale_claim", 13).unwrap();
        assert!(db.pending_reports(10).unwrap().is_empty());
        assert_eq!(db.summary().unwrap().dead_reports, vec![(turn.attempt_id, "stale_claim".to_string())]);
    }

    #[test]
    fn a_new_claim_replaces_a_dropped_copy() {
        let (_dir, mut db) = open_temp();
        db.mirror(&delivery("d1", "c", 1), false, 10).unwrap();
        db.drop_delivery("d1", "requeued", 11).unwrap();
        let mut again = delivery("d1", "c", 1);
        again.claim_token = "tok-2".into();
        assert_eq!(db.mirror(&again, false, 12).unwrap(), Mirrored::Replaced);
        assert!(db.mark_acked("d1", "tok-2", 13).unwrap());
        assert!(db.start_attempt("d1", 14).unwrap().is_some());
    }

    #[test]
    fn status_summary_reads_a_closed_store_read_only() {
        let (dir, mut db) = open_temp();
        db.mirror(&delivery("d1", "c", 1), false, 10).unwrap();
        db.mirror(&delivery("d2", "c", 2), true, 10).unwrap();
        db.start_attempt("d2", 11).unwrap().unwrap();
        let id = db.instance_id().unwrap();
        drop(db);
        let ro = Db::open_read_only(&dir.path().join("node.db")).unwrap();
        let s = ro.summary().unwrap();
        assert_eq!(s.instance_id, Some(id));
        assert_eq!(s.open.len(), 2);
        assert_eq!(s.running, vec!["d2".to_string()]);
        assert_eq!(s.counts, vec![("acked".to_string(), 1), ("mirrored".to_string(), 1)]);
    }
}
