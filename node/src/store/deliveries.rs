//! The mirror: the local copy of each delivery this instance took, written together with its
//! queued execution, and the execution gate (`mirrored` → `acked`) the hub's ack opens.

use super::attempts::ExecState;
use super::outbox::ReportState;
use super::{Db, StoreError};
use baton_shared::crash_point;
use baton_shared::wire::ClaimedDelivery;
use rusqlite::{OptionalExtension, TransactionBehavior, named_params};

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
    /// Every state, in the order `as_str` spells them.
    pub const ALL: [LocalState; 4] = [LocalState::Mirrored, LocalState::Acked, LocalState::Done, LocalState::Dropped];

    /// The text stored in `deliveries.state` (and shown by `status`).
    pub fn as_str(self) -> &'static str {
        match self {
            LocalState::Mirrored => "mirrored",
            LocalState::Acked => "acked",
            LocalState::Done => "done",
            LocalState::Dropped => "dropped",
        }
    }

    /// Parses `deliveries.state` of delivery `delivery_id`; any other text is corrupt.
    pub(crate) fn parse(delivery_id: &str, s: &str) -> Result<LocalState, StoreError> {
        LocalState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| StoreError::corrupt(format!("delivery {delivery_id}"), format!("unknown local state {s:?}")))
    }
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
    /// The run it was last mirrored for (1 for the first).
    pub run: u32,
    /// Its current run's execution state.
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
    /// A later run of a delivery that ran here before: its own execution was queued.
    NewRun,
}

impl Db {
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
        let mut done = Vec::with_capacity(ds.len());
        for d in ds {
            done.push(mirror_in(&tx, d, false, now_ms)?);
            if done.len() == 1 {
                crash_point("node.mirror.mid");
            }
        }
        tx.commit()?;
        Ok(done)
    }

    /// Opens the execution gate: the hub confirmed the ack of this claim. Returns whether the
    /// delivery moved (false when it was already acked, or is not this claim's).
    pub fn mark_acked(&mut self, delivery_id: &str, claim_token: &str, now_ms: i64) -> Result<bool, StoreError> {
        let n = self
            .conn
            .prepare_cached(
                "UPDATE deliveries SET state = 'acked', updated_at_ms = ?3
             WHERE delivery_id = ?1 AND claim_token = ?2 AND state = 'mirrored'",
            )?
            .execute((delivery_id, claim_token, now_ms))?;
        Ok(n == 1)
    }

    /// Opens the execution gate of every (delivery id, claim token) in `acked`, whose acks the
    /// hub confirmed, in one transaction (one sync for a claim batch). Each is guarded as in
    /// `mark_acked`; returns, per item, whether it moved. A crash before the commit opens none:
    /// the next start's resync finds them delivered on the hub and opens them then.
    pub fn mark_acked_batch(&mut self, acked: &[(String, String)], now_ms: i64) -> Result<Vec<bool>, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut moved = Vec::with_capacity(acked.len());
        {
            let mut st = tx.prepare_cached(
                "UPDATE deliveries SET state = 'acked', updated_at_ms = ?3
                 WHERE delivery_id = ?1 AND claim_token = ?2 AND state = 'mirrored'",
            )?;
            for (i, (delivery_id, claim_token)) in acked.iter().enumerate() {
                moved.push(st.execute((delivery_id, claim_token, now_ms))? == 1);
                if i == 0 {
                    crash_point("node.acked.mid");
                }
            }
        }
        tx.commit()?;
        Ok(moved)
    }

    /// Drops a delivery that is not ours any more: it will never run. Only a delivery whose gate
    /// is still closed can be dropped. Returns whether it was dropped.
    pub fn drop_delivery(&mut self, delivery_id: &str, reason: &str, now_ms: i64) -> Result<bool, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = tx
            .prepare_cached(
                "UPDATE deliveries SET state = 'dropped', reason = ?2, updated_at_ms = ?3
             WHERE delivery_id = ?1 AND state = 'mirrored'",
            )?
            .execute((delivery_id, reason, now_ms))?;
        if n == 1 {
            let e = tx
                .prepare_cached(
                    "UPDATE executions SET state = 'cancelled' WHERE delivery_id = ?1 AND state = 'queued'",
                )?
                .execute([delivery_id])?;
            assert_eq!(e, 1, "a mirrored delivery has a queued execution");
        }
        tx.commit()?;
        Ok(n == 1)
    }

    /// Drops a delivery whose gate is open but whose current run never started (the hub refused
    /// its start: the claim is stale or gone). It will never run here. Returns whether it was
    /// dropped.
    pub fn drop_unstarted(&mut self, delivery_id: &str, reason: &str, now_ms: i64) -> Result<bool, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let e = tx
            .prepare_cached(
                "UPDATE executions SET state = 'cancelled'
             WHERE delivery_id = ?1 AND state = 'queued'
               AND run = (SELECT run FROM deliveries WHERE delivery_id = ?1 AND state IN ('mirrored', 'acked'))",
            )?
            .execute([delivery_id])?;
        if e == 1 {
            let n = tx
                .prepare_cached(
                    "UPDATE deliveries SET state = 'dropped', reason = ?2, updated_at_ms = ?3 WHERE delivery_id = ?1",
                )?
                .execute((delivery_id, reason, now_ms))?;
            assert_eq!(n, 1, "the execution's delivery was just read");
        }
        tx.commit()?;
        Ok(e == 1)
    }

    /// A delivery the hub lists as `delivered` to this instance: when this store has a copy of
    /// that run (the hub's ack landed, its answer did not), only opens its gate, as `mirror`
    /// does. When it has none (a copy or a restore of the data directory, or a local record
    /// removed), the run is written with its execution never to start and an attempt ended
    /// `unknown` with `reason`, its report queued: one transaction, so it can never run here.
    pub fn adopt_delivered(&mut self, d: &ClaimedDelivery, reason: &str, now_ms: i64) -> Result<Mirrored, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let done = mirror_in(&tx, d, true, now_ms)?;
        if matches!(done, Mirrored::New | Mirrored::Replaced | Mirrored::NewRun) {
            let ending = super::Ending::unstarted(baton_shared::states::Outcome::Unknown, reason);
            let ended = super::attempts::end_unstarted_in(&tx, &d.delivery_id, d.attempt, &ending, now_ms)?;
            assert!(ended.is_some(), "a run just queued is ended unstarted");
        }
        tx.commit()?;
        Ok(done)
    }

    /// What the node knows about one delivery, if anything.
    pub fn local(&self, delivery_id: &str) -> Result<Option<LocalDelivery>, StoreError> {
        let row: Option<(String, String, Option<String>, u32)> = self
            .conn
            .prepare_cached(
                "SELECT d.claim_token, d.state, e.state, d.run FROM deliveries d
                 LEFT JOIN executions e ON e.delivery_id = d.delivery_id AND e.run = d.run WHERE d.delivery_id = ?1",
            )?
            .query_row([delivery_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .optional()?;
        let Some((claim_token, state, exec, run)) = row else { return Ok(None) };
        let (state, exec) = parse_states(delivery_id, &state, exec.as_deref())?;
        let report: Option<(String, Option<i64>, Option<i64>)> = self
            .conn
            .prepare_cached(
                "SELECT o.report_id, o.confirmed_at_ms, o.dead_at_ms FROM outbox o
                 WHERE o.delivery_id = ?1 ORDER BY o.created_at_ms DESC, o.report_id DESC LIMIT 1",
            )?
            .query_row([delivery_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?;
        let report = report.map(|(id, confirmed, dead)| {
            let st = match (confirmed, dead) {
                (_, Some(_)) => ReportState::Dead,
                (Some(_), None) => ReportState::Confirmed,
                (None, None) => ReportState::Pending,
            };
            (id, st)
        });
        Ok(Some(LocalDelivery { delivery_id: delivery_id.to_string(), claim_token, state, run, exec, report }))
    }

    /// Deliveries whose gate is still closed (`mirrored`), with their claim tokens.
    pub fn unacked(&self) -> Result<Vec<(String, String)>, StoreError> {
        let mut st = self.conn.prepare_cached(
            "SELECT delivery_id, claim_token FROM deliveries WHERE state = 'mirrored' ORDER BY conversation, seq",
        )?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

fn mirror_in(
    tx: &rusqlite::Transaction<'_>,
    d: &ClaimedDelivery,
    acked: bool,
    now_ms: i64,
) -> Result<Mirrored, StoreError> {
    // The payload's exact text, as the producer sent it: the harness gets these bytes.
    let payload = d.payload.as_str();
    let state = if acked { "acked" } else { "mirrored" };
    let existing: Option<(String, String, Option<String>, u32)> = tx
        .prepare_cached(
            "SELECT d.claim_token, d.state, e.state, d.run FROM deliveries d
             LEFT JOIN executions e ON e.delivery_id = d.delivery_id AND e.run = d.run WHERE d.delivery_id = ?1",
        )?
        .query_row([&d.delivery_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .optional()?;
    let existing = match existing {
        None => None,
        Some((token, local, exec, run)) => Some((token, parse_states(&d.delivery_id, &local, exec.as_deref())?, run)),
    };
    let params = named_params! {
        ":id": d.delivery_id, ":message": d.message_id, ":conversation": d.conversation, ":seq": d.seq,
        ":payload": payload, ":token": d.claim_token, ":state": state, ":now": now_ms, ":producer": d.producer,
        ":run": d.attempt, ":rerun": d.rerun.map(|r| r.as_str()),
        ":deadline": d.deadline_ms.and_then(|ms| i64::try_from(ms).ok()),
        ":stall": d.stall_ms.and_then(|ms| i64::try_from(ms).ok()),
        ":trace": d.traceparent,
    };
    // A new delivery's execution must not exist yet (a plain insert: a stray row fails the
    // whole mirror); a replaced copy's execution of the same run is queued again.
    let queue = |tx: &rusqlite::Transaction<'_>, replacing: bool| -> Result<(), StoreError> {
        let sql = if replacing {
            "INSERT INTO executions(delivery_id, run, conversation, seq, state, queued_at_ms)
             VALUES (?1, ?2, ?3, ?4, 'queued', ?5)
             ON CONFLICT(delivery_id, run) DO UPDATE SET state = 'queued', conversation = excluded.conversation,
                 seq = excluded.seq, queued_at_ms = excluded.queued_at_ms"
        } else {
            "INSERT INTO executions(delivery_id, run, conversation, seq, state, queued_at_ms)
             VALUES (?1, ?2, ?3, ?4, 'queued', ?5)"
        };
        tx.prepare_cached(sql)?.execute((&d.delivery_id, d.attempt, &d.conversation, d.seq, now_ms))?;
        Ok(())
    };
    let replace = |tx: &rusqlite::Transaction<'_>| -> Result<(), StoreError> {
        let n = tx
            .prepare_cached(
                "UPDATE deliveries SET message_id = :message, conversation = :conversation, seq = :seq,
                 payload = :payload, claim_token = :token, state = :state, reason = NULL,
                 mirrored_at_ms = :now, updated_at_ms = :now, producer = :producer, run = :run, rerun = :rerun,
                 deadline_ms = :deadline, stall_ms = :stall, traceparent = :trace
             WHERE delivery_id = :id",
            )?
            .execute(params)?;
        assert_eq!(n, 1, "the row was just read");
        Ok(())
    };
    let done = match existing {
        None => {
            tx.prepare_cached(
                "INSERT INTO deliveries(delivery_id, message_id, conversation, seq, payload, claim_token, state,
                     mirrored_at_ms, updated_at_ms, producer, run, rerun, deadline_ms, stall_ms, traceparent)
                 VALUES (:id, :message, :conversation, :seq, :payload, :token, :state, :now, :now, :producer,
                     :run, :rerun, :deadline, :stall, :trace)",
            )?
            .execute(params)?;
            queue(tx, false)?;
            Mirrored::New
        }
        // A run older than the one held here: the hub's answer is stale; nothing changes.
        Some((_, _, run)) if d.attempt < run => Mirrored::AlreadyRan,
        // A later run while the current one still runs here: not taken until it has ended.
        Some((_, (_, ExecState::Started), run)) if d.attempt > run => Mirrored::AlreadyRan,
        Some((_, _, run)) if d.attempt > run => {
            replace(tx)?;
            queue(tx, false)?;
            Mirrored::NewRun
        }
        Some((_, (_, ExecState::Started | ExecState::Ended), _)) => Mirrored::AlreadyRan,
        Some((token, (local, _), _)) if token == d.claim_token && local != LocalState::Dropped => {
            if acked {
                tx.prepare_cached(
                    "UPDATE deliveries SET state = 'acked', updated_at_ms = ?2
                     WHERE delivery_id = ?1 AND state = 'mirrored'",
                )?
                .execute((&d.delivery_id, now_ms))?;
            }
            Mirrored::Existing
        }
        Some(_) => {
            replace(tx)?;
            queue(tx, true)?;
            Mirrored::Replaced
        }
    };
    Ok(done)
}

/// Parses a delivery's local state and its execution's state (the execution row is written in
/// the same transaction as the delivery, so a missing one is corrupt too).
fn parse_states(delivery_id: &str, local: &str, exec: Option<&str>) -> Result<(LocalState, ExecState), StoreError> {
    let exec = exec.ok_or_else(|| StoreError::corrupt(format!("delivery {delivery_id}"), "has no execution row"))?;
    Ok((LocalState::parse(delivery_id, local)?, ExecState::parse(delivery_id, exec)?))
}
