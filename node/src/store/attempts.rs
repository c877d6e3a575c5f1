//! The execution queue and the attempts: each start marker is written before a turn runs and
//! each end marker (with its queued report) after it ends, so a turn is never run twice.

use super::{Db, REASON_RESTARTED, StoreError};
use crate::group::ProcessIdentity;
use crate::tail::StderrTail;
use baton_shared::crash_point;
use baton_shared::states::{Outcome, Rerun};
use baton_shared::wire::ReportRequest;
use rusqlite::{OptionalExtension, TransactionBehavior, named_params};
use std::collections::HashMap;

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
    /// Every state, in the order `as_str` spells them.
    pub const ALL: [ExecState; 4] = [ExecState::Queued, ExecState::Started, ExecState::Ended, ExecState::Cancelled];

    /// The text stored in `executions.state`.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecState::Queued => "queued",
            ExecState::Started => "started",
            ExecState::Ended => "ended",
            ExecState::Cancelled => "cancelled",
        }
    }

    /// Parses `executions.state` of delivery `delivery_id`; any other text is corrupt.
    pub(crate) fn parse(delivery_id: &str, s: &str) -> Result<ExecState, StoreError> {
        ExecState::ALL.into_iter().find(|st| st.as_str() == s).ok_or_else(|| {
            StoreError::corrupt(format!("execution of delivery {delivery_id}"), format!("unknown state {s:?}"))
        })
    }
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
    /// The producer that submitted the message; `None` when the hub did not say.
    pub producer: Option<String>,
    /// Which run of the delivery this is (1 for the first), given to the harness as
    /// `BATON_ATTEMPT`.
    pub run: u32,
    /// Why this run happens when it is not the first (`BATON_RERUN`).
    pub rerun: Option<Rerun>,
    /// The claim token of this run's claim (the hub's start and the report name it).
    pub claim_token: String,
    /// The message's `deadline_ms`: the turn is stopped at the shorter of it and `exec_timeout`.
    pub deadline_ms: Option<u64>,
    /// The message's `stall_ms`: the turn is stopped when it wrote no progress for this long.
    pub stall_ms: Option<u64>,
    /// The message's W3C `traceparent` (the claim's), given to the harness as `TRACEPARENT`
    /// and the parent of this node's spans of the turn; `None` when the hub sent none.
    pub traceparent: Option<String>,
}

/// An attempt found started and not ended at startup: the node stopped while it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interrupted {
    /// The attempt's id.
    pub attempt_id: String,
    /// Its delivery.
    pub delivery_id: String,
    /// Its harness's process group, when one was recorded (none: it never ran a process).
    pub process: Option<ProcessIdentity>,
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
    /// The signal that ended the harness, when one did.
    pub signal: Option<i32>,
    /// The end of its stderr, sent with the report (kept only in the outbox's report body).
    pub stderr: Option<StderrTail>,
    /// The message's bound that stopped it, when one did: `deadline` or `stall` (the report's
    /// `stopped_by`).
    pub stopped_by: Option<baton_shared::states::StoppedBy>,
}

impl Ending {
    /// An attempt that ends without its harness ever running (a cancel before the start, or a
    /// turn the node must not run): `outcome` and why, nothing else.
    pub fn unstarted(outcome: Outcome, reason: impl Into<String>) -> Ending {
        Ending {
            outcome,
            exit_code: None,
            duration_ms: None,
            result: None,
            reason: Some(reason.into()),
            signal: None,
            stderr: None,
            stopped_by: None,
        }
    }
}

/// What `Db::fold_markers` wrote, item by item, in the order it was given them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folded {
    /// Per end marker: whether it was written (false: its attempt was not running).
    pub ended: Vec<bool>,
    /// Per start marker: whether it was written (false: the turn cannot start after all).
    pub begun: Vec<bool>,
}

/// What a local cancel of one run found (`Db::cancel_unstarted`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelLocal {
    /// It had not started: it never will; its attempt is ended `cancelled` and its report
    /// queued (the attempt id).
    Cancelled(String),
    /// Its start marker is written: its process group is to be stopped.
    Started,
    /// It ended, was cancelled or dropped already, or this store has no such run: nothing to do.
    Settled,
}

impl Db {
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

    /// What a new attempt of this delivery needs to start (with a fresh attempt id), if its
    /// execution is queued and its gate open; writes nothing. The turn starts only when
    /// `begin_attempt` then writes its start marker.
    pub fn next_attempt(&self, delivery_id: &str) -> Result<Option<StartedTurn>, StoreError> {
        let turn = self
            .conn
            .prepare_cached(
                "SELECT d.message_id, d.conversation, d.seq, d.payload, d.producer, d.run, d.rerun, d.claim_token,
                        d.deadline_ms, d.stall_ms, d.traceparent
                 FROM deliveries d
                 JOIN executions e ON e.delivery_id = d.delivery_id AND e.run = d.run
                 WHERE d.delivery_id = ?1 AND d.state = 'acked' AND e.state = 'queued'",
            )?
            .query_row([delivery_id], |r| {
                Ok((
                    StartedTurn {
                        attempt_id: uuid::Uuid::now_v7().to_string(),
                        delivery_id: delivery_id.to_string(),
                        message_id: r.get(0)?,
                        conversation: r.get(1)?,
                        seq: r.get(2)?,
                        payload: r.get(3)?,
                        producer: r.get(4)?,
                        run: r.get(5)?,
                        rerun: None,
                        claim_token: r.get(7)?,
                        deadline_ms: r.get::<_, Option<i64>>(8)?.and_then(|ms| u64::try_from(ms).ok()),
                        stall_ms: r.get::<_, Option<i64>>(9)?.and_then(|ms| u64::try_from(ms).ok()),
                        traceparent: r.get(10)?,
                    },
                    r.get::<_, Option<String>>(6)?,
                ))
            })
            .optional()?;
        let turn = match turn {
            None => None,
            Some((mut t, rerun)) => {
                t.rerun = parse_rerun(delivery_id, rerun.as_deref())?;
                Some(t)
            }
        };
        // Checked again on the way out (it was checked on the way in): the harness gets JSON.
        // Checked as raw JSON text, so numbers of any size or precision pass unchanged.
        if let Some(t) = &turn
            && let Err(e) = serde_json::from_str::<&serde_json::value::RawValue>(&t.payload)
        {
            return Err(StoreError::corrupt(format!("delivery {delivery_id}"), format!("payload is not JSON ({e})")));
        }
        Ok(turn)
    }

    /// Writes the durable start marker of `turn` (from `next_attempt`), together with its
    /// harness's process group when it has one, if the execution is still queued, its gate open
    /// and its delivery what `turn` was read from. Returns whether it was written; when it was
    /// not, nothing was.
    pub fn begin_attempt(
        &mut self,
        turn: &StartedTurn,
        process: Option<&ProcessIdentity>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let begun = begin_attempt_in(&tx, turn, process, now_ms)?;
        if begun {
            tx.commit()?;
        }
        Ok(begun)
    }

    /// One scheduler pass's markers, folded into one transaction (one sync for the pass): the
    /// end markers of the turns that ended (each queues its report), then the start markers of
    /// the turns about to be released (see `begin_attempt`). Each item is guarded on its own
    /// (a savepoint each), so one that no longer applies changes nothing and fails no other: an
    /// end whose attempt is not running is `false` in `Folded::ended`, a start whose execution
    /// is no longer queued with its gate open is `false` in `Folded::begun`.
    ///
    /// A crash anywhere before the commit leaves none of them: the ended turns stay started
    /// (reported `unknown` at the next start, never run again) and the released ones never
    /// leave their gate.
    pub fn fold_markers(
        &mut self,
        ends: &[(String, Ending)],
        starts: &[(StartedTurn, Option<ProcessIdentity>)],
        now_ms: i64,
    ) -> Result<Folded, StoreError> {
        let mut tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut folded = Folded { ended: Vec::with_capacity(ends.len()), begun: Vec::with_capacity(starts.len()) };
        let mut written = 0usize;
        for (attempt_id, ending) in ends {
            let sp = tx.savepoint()?;
            match end_attempt_in(&sp, attempt_id, ending, now_ms) {
                Ok(()) => {
                    sp.commit()?;
                    folded.ended.push(true);
                }
                // Dropping the savepoint rolls back what this item wrote.
                Err(StoreError::Conflict(why)) => {
                    tracing::error!(attempt_id, "end marker not written: {why}");
                    folded.ended.push(false);
                }
                Err(e) => return Err(e),
            }
            written += 1;
            if written == 1 {
                crash_point("node.markers.mid");
            }
        }
        for (turn, process) in starts {
            let sp = tx.savepoint()?;
            match begin_attempt_in(&sp, turn, process.as_ref(), now_ms) {
                Ok(true) => {
                    sp.commit()?;
                    folded.begun.push(true);
                }
                Ok(false) => folded.begun.push(false),
                Err(StoreError::Conflict(why)) => {
                    tracing::error!(attempt_id = %turn.attempt_id, "start marker not written: {why}");
                    folded.begun.push(false);
                }
                Err(e) => return Err(e),
            }
            written += 1;
            if written == 1 {
                crash_point("node.markers.mid");
            }
        }
        tx.commit()?;
        Ok(folded)
    }

    /// `next_attempt` and `begin_attempt` without a process (the no-op harness): the start
    /// marker of a new attempt, if the execution is queued and its gate open. Returns `None`
    /// (and writes nothing) otherwise.
    pub fn start_attempt(&mut self, delivery_id: &str, now_ms: i64) -> Result<Option<StartedTurn>, StoreError> {
        let Some(turn) = self.next_attempt(delivery_id)? else { return Ok(None) };
        Ok(self.begin_attempt(&turn, None, now_ms)?.then_some(turn))
    }

    /// Writes the durable end marker of an attempt and queues its report, in one transaction.
    pub fn end_attempt(&mut self, attempt_id: &str, ending: &Ending, now_ms: i64) -> Result<(), StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        end_attempt_in(&tx, attempt_id, ending, now_ms)?;
        tx.commit()?;
        Ok(())
    }

    /// Ends run `run` of `delivery_id` without starting it when it has not started, in one
    /// transaction (see `end_unstarted_in`). Returns the attempt id, or `None` when it is not
    /// queued (started, ended, cancelled, or no such run here).
    pub fn end_unstarted(
        &mut self,
        delivery_id: &str,
        run: u32,
        ending: &Ending,
        now_ms: i64,
    ) -> Result<Option<String>, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let done = end_unstarted_in(&tx, delivery_id, run, ending, now_ms)?;
        tx.commit()?;
        Ok(done)
    }

    /// A cancel of run `run` of `delivery_id`: if it has not started, it never will (one
    /// transaction ends it `cancelled` with `reason` and queues its report; the scheduler's
    /// `begin_attempt` then finds it no longer queued). Otherwise says whether it runs.
    pub fn cancel_unstarted(
        &mut self,
        delivery_id: &str,
        run: u32,
        reason: &str,
        now_ms: i64,
    ) -> Result<CancelLocal, StoreError> {
        let ending = Ending::unstarted(Outcome::Cancelled, reason);
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if let Some(attempt_id) = end_unstarted_in(&tx, delivery_id, run, &ending, now_ms)? {
            tx.commit()?;
            return Ok(CancelLocal::Cancelled(attempt_id));
        }
        let state: Option<String> = tx
            .prepare_cached(
                "SELECT e.state FROM executions e JOIN deliveries d ON d.delivery_id = e.delivery_id
                 WHERE e.delivery_id = ?1 AND e.run = ?2 AND d.state IN ('mirrored', 'acked')",
            )?
            .query_row((delivery_id, run), |r| r.get(0))
            .optional()?;
        tx.commit()?;
        Ok(match state.map(|s| ExecState::parse(delivery_id, &s)).transpose()? {
            Some(ExecState::Started) => CancelLocal::Started,
            _ => CancelLocal::Settled,
        })
    }

    /// The attempts with a start marker and no end marker, with their process groups.
    pub fn interrupted_attempts(&self) -> Result<Vec<Interrupted>, StoreError> {
        let mut st = self.conn.prepare(
            "SELECT attempt_id, delivery_id, pgid, proc_start_ticks, boot_id FROM attempts
             WHERE ended_at_ms IS NULL ORDER BY attempt_id",
        )?;
        let rows = st.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<i32>>(2)?,
                r.get::<_, Option<i64>>(3)?,
                r.get::<_, Option<String>>(4)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (attempt_id, delivery_id, pgid, start, boot_id) = row?;
            let process = match (pgid, start, boot_id) {
                (None, None, None) => None,
                (Some(pgid), Some(start), Some(boot_id)) if pgid > 0 && start >= 0 && !boot_id.is_empty() => {
                    Some(ProcessIdentity { pgid, start_ticks: start.unsigned_abs(), boot_id })
                }
                other => {
                    return Err(StoreError::corrupt(
                        format!("attempt {attempt_id}"),
                        format!("process group, start time and boot id are not all set or all unset: {other:?}"),
                    ));
                }
            };
            out.push(Interrupted { attempt_id, delivery_id, process });
        }
        Ok(out)
    }

    /// Startup recovery: every attempt with a start marker and no end marker was interrupted
    /// by a crash. It is ended as `unknown` and reported, never run again; `notes` adds, per
    /// attempt id, what became of its process group. Returns their ids.
    pub fn recover_interrupted_attempts(
        &mut self,
        notes: &HashMap<String, String>,
        now_ms: i64,
    ) -> Result<Vec<String>, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let ids: Vec<String> = {
            let mut st = tx.prepare("SELECT attempt_id FROM attempts WHERE ended_at_ms IS NULL ORDER BY attempt_id")?;
            st.query_map([], |r| r.get(0))?.collect::<Result<_, _>>()?
        };
        for id in &ids {
            let reason = match notes.get(id) {
                Some(note) => format!("{REASON_RESTARTED}; {note}"),
                None => REASON_RESTARTED.to_string(),
            };
            end_attempt_in(&tx, id, &Ending::unstarted(Outcome::Unknown, reason), now_ms)?;
        }
        tx.commit()?;
        Ok(ids)
    }
}

/// Writes the start marker of `turn` (see `Db::begin_attempt`) inside `conn`'s open
/// transaction. Returns whether it was written; when it was not, nothing was.
fn begin_attempt_in(
    conn: &rusqlite::Connection,
    turn: &StartedTurn,
    process: Option<&ProcessIdentity>,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let start_ticks = match process {
        None => None,
        Some(p) => Some(i64::try_from(p.start_ticks).map_err(|_| {
            StoreError::Conflict(format!("attempt {}: start time {} is out of range", turn.attempt_id, p.start_ticks))
        })?),
    };
    let n = conn
        .prepare_cached(
            "UPDATE executions SET state = 'started'
         WHERE delivery_id = :id AND run = :run AND state = 'queued'
           AND EXISTS (SELECT 1 FROM deliveries d WHERE d.delivery_id = :id AND d.state = 'acked'
                         AND d.run = :run AND d.message_id = :message AND d.payload = :payload)",
        )?
        .execute(named_params! {
            ":id": turn.delivery_id, ":run": turn.run, ":message": turn.message_id, ":payload": turn.payload,
        })?;
    if n == 0 {
        return Ok(false);
    }
    conn.prepare_cached(
        "INSERT INTO attempts(attempt_id, delivery_id, run, started_at_ms, pgid, proc_start_ticks, boot_id)
         VALUES (:attempt, :id, :run, :now, :pgid, :start, :boot)",
    )?
    .execute(named_params! {
        ":attempt": turn.attempt_id, ":id": turn.delivery_id, ":run": turn.run, ":now": now_ms,
        ":pgid": process.map(|p| p.pgid), ":start": start_ticks, ":boot": process.map(|p| p.boot_id.as_str()),
    })?;
    Ok(true)
}

fn end_attempt_in(tx: &rusqlite::Connection, attempt_id: &str, e: &Ending, now_ms: i64) -> Result<(), StoreError> {
    let n = tx
        .prepare_cached(
            "UPDATE attempts SET ended_at_ms = :now, outcome = :outcome, exit_code = :exit, signal = :signal,
             duration_ms = :duration, result = :result, reason = :reason
         WHERE attempt_id = :id AND ended_at_ms IS NULL",
        )?
        .execute(named_params! {
            ":id": attempt_id, ":now": now_ms, ":outcome": e.outcome.as_str(), ":exit": e.exit_code,
            ":signal": e.signal, ":duration": e.duration_ms.map(|d| d as i64), ":result": e.result,
            ":reason": e.reason,
        })?;
    if n != 1 {
        return Err(StoreError::Conflict(format!("attempt {attempt_id} is not running")));
    }
    let (delivery_id, run): (String, u32) = tx
        .prepare_cached("SELECT delivery_id, run FROM attempts WHERE attempt_id = ?1")?
        .query_row([attempt_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let x = tx
        .prepare_cached(
            "UPDATE executions SET state = 'ended' WHERE delivery_id = ?1 AND run = ?2 AND state = 'started'",
        )?
        .execute((&delivery_id, run))?;
    if x != 1 {
        return Err(StoreError::corrupt(format!("attempt {attempt_id}"), "ended but its execution was not started"));
    }
    queue_report(tx, attempt_id, &delivery_id, run, e, now_ms)
}

/// Ends run `run` of `delivery_id` without starting it, if its execution is still queued: the
/// execution becomes `cancelled` (so the scheduler never starts it: `begin_attempt` needs it
/// queued) and an attempt with no start marker is written with `ending`, its report queued.
/// Returns the attempt id, or `None` (nothing written) when the execution is not queued.
pub(super) fn end_unstarted_in(
    tx: &rusqlite::Connection,
    delivery_id: &str,
    run: u32,
    ending: &Ending,
    now_ms: i64,
) -> Result<Option<String>, StoreError> {
    let n = tx
        .prepare_cached(
            "UPDATE executions SET state = 'cancelled' WHERE delivery_id = ?1 AND run = ?2 AND state = 'queued'",
        )?
        .execute((delivery_id, run))?;
    if n == 0 {
        return Ok(None);
    }
    let attempt_id = uuid::Uuid::now_v7().to_string();
    tx.prepare_cached(
        "INSERT INTO attempts(attempt_id, delivery_id, run, started_at_ms, ended_at_ms, outcome, exit_code, signal,
             duration_ms, result, reason)
         VALUES (:attempt, :id, :run, NULL, :now, :outcome, :exit, :signal, :duration, :result, :reason)",
    )?
    .execute(named_params! {
        ":attempt": attempt_id, ":id": delivery_id, ":run": run, ":now": now_ms,
        ":outcome": ending.outcome.as_str(), ":exit": ending.exit_code, ":signal": ending.signal,
        ":duration": ending.duration_ms.map(|d| d as i64), ":result": ending.result, ":reason": ending.reason,
    })?;
    queue_report(tx, &attempt_id, delivery_id, run, ending, now_ms)?;
    Ok(Some(attempt_id))
}

/// Queues the report of attempt `attempt_id` (run `run` of `delivery_id`) in the outbox.
fn queue_report(
    tx: &rusqlite::Connection,
    attempt_id: &str,
    delivery_id: &str,
    run: u32,
    e: &Ending,
    now_ms: i64,
) -> Result<(), StoreError> {
    let claim_token: String = tx
        .prepare_cached("SELECT claim_token FROM deliveries WHERE delivery_id = ?1")?
        .query_row([delivery_id], |r| r.get(0))?;
    let instance_id: String = tx
        .prepare_cached("SELECT value FROM meta WHERE key = 'instance_id'")?
        .query_row([], |r| r.get(0))
        .optional()?
        .ok_or_else(|| StoreError::corrupt("meta", "has no instance_id"))?;
    let body = ReportRequest {
        delivery_id: delivery_id.to_string(),
        instance_id,
        claim_token,
        report_id: attempt_id.to_string(),
        outcome: e.outcome,
        exit_code: e.exit_code,
        duration_ms: e.duration_ms,
        result: e.result.clone(),
        reason: e.reason.clone(),
        attempt: Some(run),
        signal: e.signal,
        stderr_tail: e.stderr.as_ref().map(|t| t.text.clone()),
        stderr_dropped_bytes: e.stderr.as_ref().map(|t| t.dropped_bytes),
        stopped_by: e.stopped_by.map(|b| b.as_str().to_string()),
    };
    let body = serde_json::to_string(&body).map_err(|e| {
        StoreError::corrupt(format!("attempt {attempt_id}"), format!("report does not serialise ({e})"))
    })?;
    tx.prepare_cached("INSERT INTO outbox(report_id, delivery_id, body, created_at_ms) VALUES (?1, ?2, ?3, ?4)")?
        .execute((attempt_id, delivery_id, &body, now_ms))?;
    Ok(())
}

/// Parses `deliveries.rerun` of `delivery_id`; any other text is corrupt.
pub(super) fn parse_rerun(delivery_id: &str, s: Option<&str>) -> Result<Option<Rerun>, StoreError> {
    match s {
        None => Ok(None),
        Some(s) => Rerun::parse(s)
            .map(Some)
            .ok_or_else(|| StoreError::corrupt(format!("delivery {delivery_id}"), format!("unknown rerun {s:?}"))),
    }
}
