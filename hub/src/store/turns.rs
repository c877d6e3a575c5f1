//! Turn control: hub-confirmed starts, cancel (in every state), the claim's cancel notices and
//! retry wake-up, and the operator's retry and redrive of final deliveries.
//!
//! Invariant (execution gate, second half): a node runs a delivered turn only after the hub
//! recorded its start for the caller's session (`started_session`); a run already started by
//! another session, or whose cancel was asked for, is never started.
//!
//! Invariant (cancel): a delivery not yet delivered is failed at once; a delivered one without
//! an outcome of its current run gets `cancel_requested_*`, which its node learns from claims
//! and holdings; a final one is left as it is. Repeating a cancel answers the same and records
//! nothing more.
//!
//! Invariant (rerun): an operator's retry or redrive moves a final delivery back to `queued` as
//! a new run (`attempt + 1`, `rerun = 'redrive'`), clearing the holder, start and cancel of the
//! run before; it is the only run handed out out of `seq` order.

use super::db::Db;
use super::hosts::record_operator_event;
use super::transition::{self, Change};
use super::{Actor, StoreError, StoreResult, parse_column_opt, state_column};
use baton_shared::states::DeliveryState::{self, *};
use baton_shared::states::Outcome;
use baton_shared::wire::{CancelNotice, CancelResult, StartItem, StartResult};
use rusqlite::{OptionalExtension, named_params};

/// When the hub recorded the ack of `delivery_id`'s current run (its latest `delivered` event).
fn acked_at(conn: &dyn Db, delivery_id: &str) -> StoreResult<Option<i64>> {
    Ok(conn
        .prepare_cached("SELECT max(at) FROM delivery_events WHERE delivery_id = ?1 AND to_state = 'delivered'")?
        .query_row([delivery_id], |r| r.get::<_, Option<i64>>(0))?)
}

/// A delivery's state and control columns, as the turn-control operations read them.
struct Turn {
    host: String,
    state: DeliveryState,
    instance_id: Option<String>,
    claim_token: Option<String>,
    attempt: u32,
    started_session: Option<i64>,
    /// The session whose ack made the current run delivered (none before it was acked).
    acked_session: Option<i64>,
    cancel_requested: bool,
    /// The outcome of the current run, when it has one.
    outcome: Option<Outcome>,
}

fn load(conn: &dyn Db, delivery_id: &str) -> StoreResult<Option<Turn>> {
    Ok(conn
        .prepare_cached(
            "SELECT d.host, d.state, d.instance_id, d.claim_token, d.attempt, d.started_session,
                    d.cancel_requested_at IS NOT NULL,
                    (SELECT a.outcome FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt),
                    d.acked_session
             FROM deliveries d WHERE d.id = ?1",
        )?
        .query_row([delivery_id], |r| {
            Ok(Turn {
                host: r.get(0)?,
                state: state_column(r, 1, "deliveries", delivery_id)?,
                instance_id: r.get(2)?,
                claim_token: r.get(3)?,
                attempt: r.get(4)?,
                started_session: r.get(5)?,
                acked_session: r.get(8)?,
                cancel_requested: r.get(6)?,
                outcome: parse_column_opt(
                    r,
                    7,
                    "attempts",
                    &format!("of delivery {delivery_id}"),
                    "outcome",
                    Outcome::parse,
                )?,
            })
        })
        .optional()?)
}

/// `POST /v1/starts`: for each item, whether the caller's session may start that run (and the
/// start recorded when it may). Items are answered in order; one item's refusal does not
/// affect the others.
///
/// A run an older session of the instance acked is not started for a newer session while that
/// older session's start lease lasts (`start_lease_pending`, with when to ask again): until
/// then the older process, if it still runs cut off from the hub, may start it on its own.
/// Once the lease has run out the run is `started_elsewhere` (the newer session reports it
/// `unknown`): the hub cannot know whether the older process started it within its lease. The
/// run is the newer session's to start at once when the older could never have started it on
/// its own: it ended cleanly (which gives its lease up, and which a node does only when it
/// started nothing without the hub), it never held a lease, or it renewed none after the run's
/// ack (a node starts on its own only runs a renewal it sent covers, `sessions::Lease`).
pub fn start(
    conn: &dyn Db,
    host: &str,
    instance_id: &str,
    session: u64,
    items: &[StartItem],
    now_ms: i64,
) -> StoreResult<Vec<StartResult>> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let refuse = |code: &str, message: String| StartResult {
            delivery_id: item.delivery_id.clone(),
            start: false,
            code: Some(code.to_string()),
            message: Some(message),
            retry_after_ms: None,
        };
        let turn = match load(conn, &item.delivery_id)? {
            Some(t) if t.host == host => t,
            _ => {
                out.push(refuse("not_found", format!("host {host} has no delivery {}", item.delivery_id)));
                continue;
            }
        };
        let held = turn.instance_id.as_deref() == Some(instance_id)
            && turn.claim_token.as_deref() == Some(item.claim_token.as_str());
        if !held || turn.state != Delivered || turn.attempt != item.attempt || turn.outcome.is_some() {
            out.push(refuse(
                "stale_claim",
                format!(
                    "delivery {} is {} (run {}) and not a delivered run {} held by instance {instance_id} with that \
                     claim token",
                    item.delivery_id, turn.state, turn.attempt, item.attempt
                ),
            ));
            continue;
        }
        if turn.cancel_requested {
            out.push(refuse("cancelled", format!("delivery {} was cancelled before it started", item.delivery_id)));
            continue;
        }
        if turn.started_session.is_none()
            && let Some(acked) = turn.acked_session.filter(|a| *a < session as i64)
            && let Some(lease) = super::sessions::lease(conn, host, acked as u64)?
            && lease.may_have_started(acked_at(conn, &item.delivery_id)?)
        {
            if lease.until > now_ms {
                let wait_ms = lease.until - now_ms;
                out.push(StartResult {
                    retry_after_ms: Some(wait_ms as u64),
                    ..refuse(
                        "start_lease_pending",
                        format!(
                            "run {} of delivery {} was acked by session {acked} of this node instance, which may \
                             still start it on its own for {wait_ms} ms (its start lease); ask again then",
                            turn.attempt, item.delivery_id
                        ),
                    )
                });
                continue;
            }
            if !baton_shared::crash::mutation("hub.start.grant_after_lease") {
                // The older session renewed its lease after this run's ack and did not end
                // cleanly: within the lease that process may have started the run cut off from
                // the hub, unheard. Never again.
                out.push(refuse(
                    "started_elsewhere",
                    format!(
                        "run {} of delivery {} was acked by session {acked} of this node instance, which then held \
                         a start lease and did not end cleanly: it may have started the run on its own while cut \
                         off from the hub, so it is not started again",
                        turn.attempt, item.delivery_id
                    ),
                ));
                continue;
            }
        }
        match turn.started_session {
            None => {
                conn.prepare_cached(
                    "UPDATE deliveries SET started_session = ?2, started_at = ?3 WHERE id = ?1 AND started_session IS NULL",
                )?
                .execute(rusqlite::params![item.delivery_id, session as i64, now_ms])?;
            }
            Some(s) if s == session as i64 => {}
            Some(s) => {
                out.push(refuse(
                    "started_elsewhere",
                    format!("run {} of delivery {} was started by session {s}", turn.attempt, item.delivery_id),
                ));
                continue;
            }
        }
        out.push(StartResult {
            delivery_id: item.delivery_id.clone(),
            start: true,
            code: None,
            message: None,
            retry_after_ms: None,
        });
    }
    Ok(out)
}

/// Who asks for a cancel.
#[derive(Debug, Clone, Copy)]
pub enum Canceller<'a> {
    /// An operator, through the CLI.
    Operator(&'a str),
    /// The producer of the message, through the API.
    Producer(&'a str),
}

impl Canceller<'_> {
    /// How it is recorded (`cancel_by`, the operator event): `operator:NAME`, `producer:NAME`.
    pub fn recorded(&self) -> String {
        match self {
            Canceller::Operator(n) => format!("operator:{n}"),
            Canceller::Producer(n) => format!("producer:{n}"),
        }
    }

    /// The actor of the delivery event. The event log knows hub, node and operator: a producer's
    /// cancel is recorded as the operator kind under the name `producer:NAME`.
    fn actor(&self) -> Actor {
        match self {
            Canceller::Operator(n) => Actor::operator(n),
            Canceller::Producer(_) => Actor::operator(&self.recorded()),
        }
    }
}

/// What a cancel does (or did) to one delivery.
pub const EFFECT_CANCELLED: &str = "cancelled";
/// A delivered turn's cancel waits for its node.
pub const EFFECT_REQUESTED: &str = "requested";
/// It had already ended; nothing changes.
pub const EFFECT_FINAL: &str = "final";

/// Cancels one delivery (or, with `dry_run`, says what a cancel would do, changing nothing).
pub fn cancel(
    conn: &dyn Db,
    delivery_id: &str,
    by: Canceller<'_>,
    reason: &str,
    dry_run: bool,
    now_ms: i64,
) -> StoreResult<CancelResult> {
    let turn = load(conn, delivery_id)?.ok_or_else(|| StoreError::NotFound(format!("no delivery {delivery_id}")))?;
    let answer = |effect: &str, state| CancelResult {
        delivery_id: delivery_id.to_string(),
        host: turn.host.clone(),
        effect: effect.to_string(),
        state,
    };
    match turn.state {
        Queued | Held | Claimed | Mirrored => {
            if !dry_run {
                let why = format!("cancelled: {reason}");
                let change = Change {
                    delivery_id,
                    from: turn.state,
                    to: Failed,
                    expect_holder: None,
                    new_holder: None,
                    reason: Some(&why),
                };
                transition::apply(conn, change, &by.actor(), now_ms)?;
                mark_cancelled(conn, delivery_id, &by.recorded(), reason, now_ms)?;
            }
            Ok(answer(EFFECT_CANCELLED, Failed))
        }
        Delivered if turn.outcome.is_none() => {
            if !dry_run && !turn.cancel_requested {
                mark_cancelled(conn, delivery_id, &by.recorded(), reason, now_ms)?;
                record_operator_event(conn, "cancel", delivery_id, &by.recorded(), Some(reason), now_ms)?;
            }
            Ok(answer(EFFECT_REQUESTED, Delivered))
        }
        // Failed by an earlier cancel before it was delivered: the same answer again.
        Failed if turn.cancel_requested => Ok(answer(EFFECT_CANCELLED, Failed)),
        state => Ok(answer(EFFECT_FINAL, state)),
    }
}

fn mark_cancelled(conn: &dyn Db, delivery_id: &str, by: &str, reason: &str, now_ms: i64) -> StoreResult<()> {
    conn.prepare_cached(
        "UPDATE deliveries SET cancel_requested_at = ?2, cancel_by = ?3, cancel_reason = ?4, not_before = NULL
         WHERE id = ?1",
    )?
    .execute(rusqlite::params![delivery_id, now_ms, by, reason])?;
    Ok(())
}

/// Picks deliveries for a cancel of many.
#[derive(Debug, Clone, Copy)]
pub enum CancelScope<'a> {
    /// Every delivery of a conversation.
    Conversation(&'a str),
    /// Every delivery to a host.
    Host(&'a str),
    /// Every delivery of a message.
    Message(&'a str),
}

/// The deliveries of `scope` a cancel can still change (not final), oldest first.
pub fn cancellable(conn: &dyn Db, scope: CancelScope<'_>) -> StoreResult<Vec<String>> {
    let (column, value) = match scope {
        CancelScope::Conversation(c) => ("conversation", c),
        CancelScope::Host(h) => ("host", h),
        CancelScope::Message(m) => ("message_id", m),
    };
    let sql = format!(
        "SELECT d.id FROM deliveries d WHERE d.{column} = ?1
           AND (d.state IN ('queued', 'held', 'claimed', 'mirrored')
                OR (d.state = 'delivered' AND d.cancel_requested_at IS NULL AND NOT EXISTS (
                    SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)))
         ORDER BY d.n"
    );
    Ok(conn.prepare_cached(&sql)?.query_map([value], |r| r.get(0))?.collect::<Result<_, _>>()?)
}

/// Cancels every delivery of message `message_id` for its producer (`POST
/// /v1/messages/{id}/cancel`): `NotFound` for an unknown message, `Forbidden` for another
/// producer's.
pub fn cancel_message(
    conn: &dyn Db,
    message_id: &str,
    producer: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<CancelResult>> {
    let owner: Option<String> = conn
        .prepare_cached("SELECT producer FROM messages WHERE id = ?1")?
        .query_row([message_id], |r| r.get(0))
        .optional()?;
    match owner {
        None => return Err(StoreError::NotFound(format!("no message {message_id}"))),
        Some(o) if o != producer => {
            return Err(StoreError::Forbidden(format!("message {message_id} belongs to another producer")));
        }
        Some(_) => {}
    }
    let ids: Vec<String> = conn
        .prepare_cached("SELECT id FROM deliveries WHERE message_id = ?1 ORDER BY host")?
        .query_map([message_id], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    ids.iter().map(|id| cancel(conn, id, Canceller::Producer(producer), reason, false, now_ms)).collect()
}

/// The delivered turns `instance_id` holds whose cancel was asked for and whose current run has
/// no outcome yet: the claim answer's `cancels`. Read through the partial index of pending
/// cancels (named, so the planner never walks the instance's whole delivered history instead):
/// every claim asks.
pub fn cancels_for(conn: &dyn Db, host: &str, instance_id: &str) -> StoreResult<Vec<CancelNotice>> {
    Ok(conn
        .prepare_cached(
            "SELECT d.id, d.attempt, coalesce(d.cancel_reason, '') FROM deliveries d INDEXED BY deliveries_cancel_pending
             WHERE d.instance_id = ?1 AND d.host = ?2 AND d.state = 'delivered' AND d.cancel_requested_at IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)
             ORDER BY d.n",
        )?
        .query_map([instance_id, host], |r| {
            Ok(CancelNotice { delivery_id: r.get(0)?, attempt: r.get(1)?, reason: r.get(2)? })
        })?
        .collect::<Result<_, _>>()?)
}

/// The earliest not-before time after `now_ms` of the host's deliveries queued for a retry: a
/// waiting claim wakes then.
pub fn next_retry_at(conn: &dyn Db, host: &str, now_ms: i64) -> StoreResult<Option<i64>> {
    Ok(conn
        .prepare_cached(
            "SELECT min(not_before) FROM deliveries
             WHERE host = ?1 AND state = 'queued' AND not_before IS NOT NULL AND not_before > ?2",
        )?
        .query_row(rusqlite::params![host, now_ms], |r| r.get(0))?)
}

/// The outcome a final delivery ended with, as `retry` and `redrive` select by it: its current
/// run's outcome when delivered; `cancelled` when the hub cancelled it before delivery;
/// otherwise its state (`failed`, `unknown`). `None` while it is not final.
const FINAL_OUTCOME_SQL: &str = "CASE WHEN d.state = 'delivered' THEN
        (SELECT a.outcome FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)
     WHEN d.state = 'failed' AND d.cancel_requested_at IS NOT NULL THEN 'cancelled'
     WHEN d.state IN ('failed', 'unknown') THEN d.state END";

/// `deliveries retry ID`: re-runs one final delivery (failed, unknown, or delivered whose current
/// run failed, ended unknown or was cancelled) as a new run marked as a redrive. Returns the new
/// run number.
pub fn retry(conn: &dyn Db, delivery_id: &str, operator: &str, reason: &str, now_ms: i64) -> StoreResult<u32> {
    let sql = format!("SELECT d.state, {FINAL_OUTCOME_SQL} FROM deliveries d WHERE d.id = ?1");
    let row: Option<(DeliveryState, Option<String>)> = conn
        .prepare_cached(&sql)?
        .query_row([delivery_id], |r| Ok((state_column(r, 0, "deliveries", delivery_id)?, r.get(1)?)))
        .optional()?;
    let Some((state, outcome)) = row else {
        return Err(StoreError::NotFound(format!("no delivery {delivery_id}")));
    };
    match outcome.as_deref() {
        Some("failed" | "unknown" | "cancelled") => {}
        Some(o) => {
            return Err(StoreError::InvalidTransition(format!(
                "delivery {delivery_id} {o}; only a failed, unknown or cancelled delivery can be re-run"
            )));
        }
        None => {
            return Err(StoreError::InvalidTransition(format!(
                "delivery {delivery_id} is {state} and its run has not ended; only a failed, unknown or cancelled \
                 delivery can be re-run"
            )));
        }
    }
    let why = format!("redrive by operator {operator}: {reason}");
    let change =
        Change { delivery_id, from: state, to: Queued, expect_holder: None, new_holder: None, reason: Some(&why) };
    transition::apply(conn, change, &Actor::operator(operator), now_ms)?;
    let attempt: u32 = conn
        .prepare_cached(
            "UPDATE deliveries SET attempt = attempt + 1, rerun = 'redrive', rerun_by = ?2, rerun_reason = ?3,
                    not_before = NULL, started_session = NULL, started_at = NULL, acked_session = NULL,
                    cancel_requested_at = NULL, cancel_by = NULL, cancel_reason = NULL, reason = NULL
             WHERE id = ?1 RETURNING attempt",
        )?
        .query_row(rusqlite::params![delivery_id, format!("operator:{operator}"), reason], |r| r.get(0))?;
    Ok(attempt)
}

/// What `redrive` selects.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RedriveFilter {
    /// The final outcome: `failed`, `unknown` or `cancelled`.
    pub outcome: String,
    /// Only this conversation.
    pub conversation: Option<String>,
    /// Only this host.
    pub host: Option<String>,
    /// Only deliveries that ended at or after this time (unix ms).
    pub since_ms: Option<i64>,
    /// At most this many in all.
    pub limit: Option<u32>,
}

/// The next `batch` deliveries `filter` selects after position `after_n` (the deliveries'
/// insertion order), with their positions.
pub fn redrive_batch(
    conn: &dyn Db,
    filter: &RedriveFilter,
    after_n: i64,
    batch: u32,
) -> StoreResult<Vec<(String, i64)>> {
    let sql = format!(
        "SELECT d.id, d.n FROM deliveries d
         WHERE d.n > :after AND (CAST(:c AS TEXT) IS NULL OR d.conversation = :c) AND (CAST(:h AS TEXT) IS NULL OR d.host = :h)
           AND (CAST(:since AS BIGINT) IS NULL OR d.updated_at >= :since) AND d.state IN ('delivered', 'failed', 'unknown')
           AND {FINAL_OUTCOME_SQL} = :o
         ORDER BY d.n LIMIT :batch"
    );
    Ok(conn
        .prepare_cached(&sql)?
        .query_map(
            named_params! {
                ":after": after_n, ":c": filter.conversation, ":h": filter.host, ":since": filter.since_ms,
                ":o": filter.outcome, ":batch": batch,
            },
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?
        .collect::<Result<_, _>>()?)
}

/// A redrive request already recorded under its request id: what it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRedrive {
    /// Who ran it.
    pub operator: String,
    /// Why.
    pub reason: String,
    /// Its selection, as JSON.
    pub filter: String,
    /// How many deliveries it re-ran.
    pub redriven: i64,
    /// When (unix ms).
    pub at_ms: i64,
}

/// The redrive recorded under `request_id`, when there is one.
pub fn recorded_redrive(conn: &dyn Db, request_id: &str) -> StoreResult<Option<RecordedRedrive>> {
    Ok(conn
        .prepare_cached("SELECT operator, reason, filter, redriven, at FROM redrive_requests WHERE request_id = ?1")?
        .query_row([request_id], |r| {
            Ok(RecordedRedrive {
                operator: r.get(0)?,
                reason: r.get(1)?,
                filter: r.get(2)?,
                redriven: r.get(3)?,
                at_ms: r.get(4)?,
            })
        })
        .optional()?)
}

/// Records a finished redrive under its request id (and an operator event).
pub fn record_redrive(
    conn: &dyn Db,
    request_id: &str,
    operator: &str,
    reason: &str,
    filter: &RedriveFilter,
    redriven: i64,
    now_ms: i64,
) -> StoreResult<()> {
    let filter = serde_json::to_string(filter).map_err(|e| StoreError::Internal(e.to_string()))?;
    conn.prepare_cached(
        "INSERT INTO redrive_requests (request_id, operator, reason, filter, redriven, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(rusqlite::params![request_id, operator, reason, filter, redriven, now_ms])?;
    record_operator_event(
        conn,
        "redrive",
        request_id,
        operator,
        Some(&format!("{redriven} deliveries re-run ({filter}): {reason}")),
        now_ms,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::accept::testing::accept_one;
    use crate::store::claim::{self, ack, mirrored};
    use crate::store::report::{NewReport, RunReport, report_run};
    use crate::store::testing;
    use crate::store::transition::Holder;
    use baton_shared::wire::ClaimedDelivery;
    use std::time::Duration;

    /// Accepts a message to host-a with `max_attempts` runs and a 1 s backoff.
    fn message(conn: &dyn Db, conv: &str, key: &str, max_attempts: u32) -> String {
        let m = accept_one(conn, conv, key, &["host-a"]);
        conn.execute(
            "UPDATE messages SET max_attempts = ?2, retry_backoff_ms = 1000 WHERE id = ?1",
            rusqlite::params![m, max_attempts],
        )
        .unwrap();
        conn.query_row("SELECT id FROM deliveries WHERE message_id = ?1", [&m], |r| r.get(0)).unwrap()
    }

    fn claim_all(conn: &dyn Db, now: i64) -> Vec<ClaimedDelivery> {
        claim::claim(conn, "host-a", "i", 10, now).unwrap()
    }

    fn holder(d: &ClaimedDelivery) -> Holder<'_> {
        Holder { instance_id: "i", claim_token: &d.claim_token }
    }

    /// Claimed → mirrored → delivered.
    fn deliver(conn: &dyn Db, d: &ClaimedDelivery, now: i64) {
        mirrored(conn, "host-a", &d.delivery_id, holder(d), now).unwrap();
        ack(conn, "host-a", &d.delivery_id, holder(d), now).unwrap();
    }

    fn report(
        conn: &dyn Db,
        d: &ClaimedDelivery,
        report_id: &str,
        outcome: Outcome,
        exit_code: Option<i32>,
        now: i64,
    ) -> StoreResult<(baton_shared::wire::AttemptView, bool, Option<i64>)> {
        let r = NewReport {
            delivery_id: &d.delivery_id,
            holder: holder(d),
            report_id,
            outcome,
            exit_code,
            duration_ms: Some(1),
            result: None,
            reason: None,
        };
        let run = RunReport {
            attempt: Some(d.attempt),
            retry_backoff: Duration::from_secs(1),
            retry_backoff_max: Duration::from_secs(60),
            ..RunReport::default()
        };
        report_run(conn, "host-a", &r, &run, now)
    }

    fn state(conn: &dyn Db, id: &str) -> DeliveryState {
        transition::state_of(conn, id).unwrap().unwrap()
    }

    fn events(conn: &dyn Db, id: &str) -> i64 {
        conn.query_row("SELECT count(*) FROM delivery_events WHERE delivery_id = ?1", [id], |r| r.get(0)).unwrap()
    }

    fn item(d: &ClaimedDelivery) -> StartItem {
        StartItem { delivery_id: d.delivery_id.clone(), claim_token: d.claim_token.clone(), attempt: d.attempt }
    }

    #[test]
    fn a_start_is_recorded_once_per_run_and_refused_to_another_session() {
        let db = testing::db();
        let c = &db.conn;
        message(c, "c", "k1", 1);
        message(c, "c", "k2", 1);
        let got = claim_all(c, 1);
        deliver(c, &got[0], 2);
        mirrored(c, "host-a", &got[1].delivery_id, holder(&got[1]), 2).unwrap();
        let results = start(c, "host-a", "i", 7, &[item(&got[0]), item(&got[1])], 3).unwrap();
        assert!(results[0].start, "{results:?}");
        assert_eq!(results[1].code.as_deref(), Some("stale_claim"), "mirrored is not delivered yet");
        let started: (Option<i64>, Option<i64>) = c
            .query_row("SELECT started_session, started_at FROM deliveries WHERE id = ?1", [&got[0].delivery_id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!(started, (Some(7), Some(3)));
        assert!(start(c, "host-a", "i", 7, &[item(&got[0])], 4).unwrap()[0].start, "the same session again");
        let other = start(c, "host-a", "i", 8, &[item(&got[0])], 5).unwrap();
        assert_eq!(other[0].code.as_deref(), Some("started_elsewhere"));
        let mut wrong_run = item(&got[0]);
        wrong_run.attempt = 2;
        let mut wrong_token = item(&got[0]);
        wrong_token.claim_token = "0".repeat(32);
        let mut unknown = item(&got[0]);
        unknown.delivery_id = crate::store::new_id();
        let r = start(c, "host-a", "i", 7, &[wrong_run, wrong_token, unknown.clone()], 6).unwrap();
        let codes: Vec<_> = r.iter().map(|r| r.code.as_deref()).collect();
        assert_eq!(codes, [Some("stale_claim"), Some("stale_claim"), Some("not_found")]);
        // Another host's delivery is not found, not revealed.
        assert_eq!(start(c, "host-b", "i", 7, &[item(&got[0])], 7).unwrap()[0].code.as_deref(), Some("not_found"));
        // A cancel asked for before the start: refused with `cancelled`.
        deliver(c, &got[1], 8);
        cancel(c, &got[1].delivery_id, Canceller::Operator("op"), "stop", false, 9).unwrap();
        let r = start(c, "host-a", "i", 7, &[item(&got[1])], 10).unwrap();
        assert_eq!((r[0].start, r[0].code.as_deref()), (false, Some("cancelled")));
    }

    /// The start lease: a run the older session acked is not started for a newer session (a
    /// copy of the data directory) while the older session's lease lasts, and is
    /// `started_elsewhere` once it ran out; renewals extend it, a superseded session renews
    /// nothing, a clean end gives it up (and with it the runs acked and not started); runs the
    /// newer session acked itself start at once.
    #[test]
    fn a_newer_session_waits_for_the_older_lease_before_starting_what_the_older_acked() {
        use crate::store::claim::{RebindLimit, record_acked_session};
        use crate::store::sessions;
        let db = testing::db();
        let c = &db.conn;
        message(c, "c", "k1", 1);
        let first = sessions::open(c, "host-a", "i", None, RebindLimit::default(), 1_000, 10).unwrap();
        let got = claim_all(c, 11);
        deliver(c, &got[0], 12);
        record_acked_session(c, &got[0].delivery_id, first.session).unwrap();
        // A renewal at 500: the lease of session 1 now runs until 1_500.
        assert!(start(c, "host-a", "i", first.session, &[], 500).unwrap().is_empty());
        sessions::renew_lease(c, "host-a", first.session, 500).unwrap();
        assert_eq!(sessions::lease_until(c, "host-a", first.session).unwrap(), Some(1_500));
        // A run acked after that renewal (by more than a tenth of the lease) the first session
        // could never start on its own: the newer session starts it at once.
        message(c, "u", "k9", 1);
        let uncovered = claim_all(c, 610);
        deliver(c, &uncovered[0], 620);
        record_acked_session(c, &uncovered[0].delivery_id, first.session).unwrap();
        let copy = sessions::open(c, "host-a", "i", None, RebindLimit::default(), 1_000, 650).unwrap();
        assert_eq!(copy.took_over, Some(first.session));
        let r = start(c, "host-a", "i", copy.session, &[item(&got[0])], 700).unwrap();
        assert_eq!(
            (r[0].start, r[0].code.as_deref(), r[0].retry_after_ms),
            (false, Some("start_lease_pending"), Some(800))
        );
        let started: Option<i64> = c
            .query_row("SELECT started_session FROM deliveries WHERE id = ?1", [&got[0].delivery_id], |r| r.get(0))
            .unwrap();
        assert_eq!(started, None, "a pending start records nothing");
        assert!(start(c, "host-a", "i", copy.session, &[item(&uncovered[0])], 701).unwrap()[0].start);
        // The superseded session cannot renew (its requests are refused before this; the
        // renewal itself also leaves an ended session alone).
        sessions::renew_lease(c, "host-a", first.session, 1_400).unwrap();
        assert_eq!(sessions::lease_until(c, "host-a", first.session).unwrap(), Some(1_500));
        // New work the copy acked itself starts at once.
        message(c, "d", "k2", 1);
        let mine = claim_all(c, 800);
        deliver(c, &mine[0], 801);
        record_acked_session(c, &mine[0].delivery_id, copy.session).unwrap();
        assert!(start(c, "host-a", "i", copy.session, &[item(&mine[0])], 802).unwrap()[0].start);
        // At the lease's end the older run is never started again: the older process may have
        // started it within its lease, cut off from the hub.
        assert_eq!(
            start(c, "host-a", "i", copy.session, &[item(&got[0])], 1_499).unwrap()[0].code.as_deref(),
            Some("start_lease_pending")
        );
        let r = start(c, "host-a", "i", copy.session, &[item(&got[0])], 1_500).unwrap();
        assert_eq!((r[0].start, r[0].code.as_deref()), (false, Some("started_elsewhere")), "{:?}", r[0].message);
        let started: Option<i64> = c
            .query_row("SELECT started_session FROM deliveries WHERE id = ?1", [&got[0].delivery_id], |r| r.get(0))
            .unwrap();
        assert_eq!(started, None, "a refused start records nothing");
        // A clean end gives the lease up: what that session acked and did not start is the next
        // session's to start.
        message(c, "e", "k3", 1);
        let later = claim_all(c, 1_600);
        deliver(c, &later[0], 1_601);
        record_acked_session(c, &later[0].delivery_id, copy.session).unwrap();
        sessions::end(c, "host-a", "i", copy.session, 2_000).unwrap();
        assert_eq!(sessions::lease_until(c, "host-a", copy.session).unwrap(), None);
        let third = sessions::open(c, "host-a", "i", None, RebindLimit::default(), 1_000, 2_100).unwrap();
        assert_eq!(third.took_over, None, "the copy's session ended cleanly");
        assert!(start(c, "host-a", "i", third.session, &[item(&later[0])], 2_200).unwrap()[0].start);
    }

    #[test]
    fn cancel_in_every_state_is_idempotent() {
        let db = testing::db();
        let c = &db.conn;
        let op = Canceller::Operator("op");
        // queued, claimed, mirrored, delivered pending, delivered final, waiting for a retry.
        let queued = message(c, "q", "k0", 1);
        let ids: Vec<String> = (1..=5).map(|i| message(c, &format!("c{i}"), &format!("k{i}"), 2)).collect();
        let got = claim::claim(c, "host-a", "i", 5, 1).unwrap();
        assert_eq!(got.len(), 5);
        let by_id = |id: &str| got.iter().find(|d| d.delivery_id == id).unwrap().clone();
        let (claimed, mirrored_d, pending, finished, retrying) =
            (by_id(&queued), by_id(&ids[0]), by_id(&ids[1]), by_id(&ids[2]), by_id(&ids[3]));
        mirrored(c, "host-a", &mirrored_d.delivery_id, holder(&mirrored_d), 2).unwrap();
        for d in [&pending, &finished, &retrying] {
            deliver(c, d, 2);
        }
        report(c, &finished, "r-fin", Outcome::Succeeded, Some(0), 3).unwrap();
        let (_, _, retry_at) = report(c, &retrying, "r-retry", Outcome::Failed, Some(75), 3).unwrap();
        assert!(retry_at.is_some());
        assert_eq!(state(c, &retrying.delivery_id), Queued);
        // held: park the last one with a hold fence.
        use crate::store::fences::{FenceKind, FenceScope, NewFence};
        let hold = NewFence {
            kind: FenceKind::Hold,
            scope: FenceScope::Conversation,
            target: Some("c5"),
            operator: "op",
            reason: "r",
        };
        crate::store::fences::set(c, hold, 4).unwrap();
        claim::claim(c, "host-a", "i", 5, 5).unwrap();
        assert_eq!(state(c, &ids[4]), Held);

        let cases = [
            (claimed.delivery_id.clone(), EFFECT_CANCELLED, Failed),
            (mirrored_d.delivery_id.clone(), EFFECT_CANCELLED, Failed),
            (ids[4].clone(), EFFECT_CANCELLED, Failed),
            (retrying.delivery_id.clone(), EFFECT_CANCELLED, Failed),
            (pending.delivery_id.clone(), EFFECT_REQUESTED, Delivered),
            (finished.delivery_id.clone(), EFFECT_FINAL, Delivered),
        ];
        for (id, effect, after) in &cases {
            let dry = cancel(c, id, op, "stop", true, 6).unwrap();
            assert_eq!((dry.effect.as_str(), dry.state), (*effect, *after), "dry run of {id}");
            let before = (events(c, id), state(c, id));
            let first = cancel(c, id, op, "stop", false, 7).unwrap();
            assert_eq!((first.effect.as_str(), first.state), (*effect, *after), "{id}");
            let events_after = events(c, id);
            let again = cancel(c, id, op, "stop again", false, 8).unwrap();
            assert_eq!(again, first, "a repeated cancel answers the same");
            assert_eq!(events(c, id), events_after, "and records nothing more");
            if *effect == EFFECT_FINAL {
                assert_eq!((events_after, state(c, id)), before, "a final delivery is left as it is");
            }
        }
        let (reason, by): (Option<String>, Option<String>) = c
            .query_row("SELECT reason, cancel_by FROM deliveries WHERE id = ?1", [&claimed.delivery_id], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!((reason.as_deref(), by.as_deref()), (Some("cancelled: stop"), Some("operator:op")));
        let requested: i64 =
            c.query_row("SELECT count(*) FROM operator_events WHERE action = 'cancel'", [], |r| r.get(0)).unwrap();
        assert_eq!(requested, 1, "one event for the delivered turn's cancel request");
        // The node learns of it from the claim and from holdings.
        let notices = cancels_for(c, "host-a", "i").unwrap();
        assert_eq!(
            notices,
            [CancelNotice { delivery_id: pending.delivery_id.clone(), attempt: 1, reason: "stop".into() }]
        );
        let held = claim::holdings(c, "host-a", "i").unwrap();
        assert!(held.iter().any(|d| d.delivery_id == pending.delivery_id && d.cancel_requested));
        // `cancelled` is accepted for that run only; then the notice is gone and it is final.
        assert!(matches!(report(c, &finished, "r-x", Outcome::Cancelled, None, 9), Err(StoreError::ReportConflict(_))));
        report(c, &pending, "r-pending", Outcome::Cancelled, None, 9).unwrap();
        assert!(cancels_for(c, "host-a", "i").unwrap().is_empty());
        assert_eq!(cancel(c, &pending.delivery_id, op, "stop", false, 10).unwrap().effect, EFFECT_FINAL);
        // Nothing left to cancel in those conversations.
        assert!(cancellable(c, CancelScope::Host("host-a")).unwrap().is_empty());
        assert!(matches!(cancel(c, &crate::store::new_id(), op, "x", false, 11), Err(StoreError::NotFound(_))));
    }

    #[test]
    fn cancelled_is_refused_without_a_cancel() {
        let db = testing::db();
        let c = &db.conn;
        message(c, "c", "k", 1);
        let d = claim_all(c, 1).remove(0);
        deliver(c, &d, 2);
        assert!(matches!(report(c, &d, "r1", Outcome::Cancelled, None, 3), Err(StoreError::Invalid(_))));
        report(c, &d, "r1", Outcome::Succeeded, Some(0), 3).unwrap();
    }

    #[test]
    fn a_producer_cancels_its_own_messages_only() {
        let db = testing::db();
        let c = &db.conn;
        let m = accept_one(c, "c", "k", &["host-a", "host-b"]);
        assert!(matches!(cancel_message(c, &m, "someone-else", "r", 2), Err(StoreError::Forbidden(_))));
        assert!(matches!(cancel_message(c, &crate::store::new_id(), "prod", "r", 2), Err(StoreError::NotFound(_))));
        let r = cancel_message(c, &m, "prod", "not needed", 3).unwrap();
        assert_eq!(
            r.iter().map(|r| (r.host.as_str(), r.effect.as_str())).collect::<Vec<_>>(),
            [("host-a", EFFECT_CANCELLED), ("host-b", EFFECT_CANCELLED)]
        );
        assert_eq!(cancel_message(c, &m, "prod", "again", 4).unwrap(), r);
    }

    #[test]
    fn a_retry_waits_for_its_time_keeps_order_and_ends_when_runs_are_spent() {
        let db = testing::db();
        let c = &db.conn;
        let first = message(c, "c", "k1", 2);
        let second = message(c, "c", "k2", 1);
        // The barrier: the retryable first turn is out, so the second waits.
        let got = claim_all(c, 1000);
        assert_eq!(got.iter().map(|d| d.delivery_id.as_str()).collect::<Vec<_>>(), [first.as_str()]);
        assert_eq!((got[0].attempt, got[0].max_attempts, got[0].rerun), (1, 2, None));
        deliver(c, &got[0], 1000);
        assert!(claim_all(c, 1001).is_empty(), "a later turn waits while the retryable one runs");
        let (attempt, dup, retry_at) = report(c, &got[0], "r1", Outcome::Failed, Some(75), 2000).unwrap();
        assert!(!dup && attempt.retryable);
        let retry_at = retry_at.unwrap();
        assert!((2800..=3200).contains(&retry_at), "1 s backoff ±20% from 2000: {retry_at}");
        assert_eq!(state(c, &first), Queued);
        assert_eq!(next_retry_at(c, "host-a", 2000).unwrap(), Some(retry_at));
        assert!(claim_all(c, retry_at - 1).is_empty(), "not before its time, and nothing passes it");
        let again = claim_all(c, retry_at);
        assert_eq!(again.len(), 1);
        assert_eq!((again[0].delivery_id.as_str(), again[0].attempt), (first.as_str(), 2));
        assert_eq!(again[0].rerun, Some(baton_shared::states::Rerun::Retry));
        // A report for the earlier run is stale now.
        assert!(matches!(
            report(c, &got[0], "r1-late", Outcome::Failed, Some(1), retry_at),
            Err(StoreError::StaleClaim(_))
        ));
        deliver(c, &again[0], retry_at);
        let (attempt, _, retry_at2) = report(c, &again[0], "r2", Outcome::Failed, Some(75), retry_at + 1).unwrap();
        assert!(!attempt.retryable && retry_at2.is_none(), "max_attempts spent: final");
        assert_eq!(state(c, &first), Delivered);
        let runs: Vec<(u32, bool, Option<String>)> = c
            .prepare("SELECT attempt, retryable, caused_by FROM attempts WHERE delivery_id = ?1 ORDER BY attempt")
            .unwrap()
            .query_map([&first], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(runs, [(1, true, Some("producer:prod".into())), (2, false, Some("hub".into()))]);
        assert_eq!(
            claim_all(c, retry_at + 2).iter().map(|d| d.delivery_id.as_str()).collect::<Vec<_>>(),
            [second.as_str()]
        );
    }

    #[test]
    fn messages_without_retries_pipeline_as_before() {
        let db = testing::db();
        let c = &db.conn;
        message(c, "c", "k1", 1);
        message(c, "c", "k2", 1);
        assert_eq!(claim_all(c, 1).len(), 2);
    }

    #[test]
    fn backoff_doubles_is_capped_and_jittered_within_a_fifth() {
        use crate::store::report::backoff_ms;
        assert_eq!(backoff_ms(1000, 1, 60_000, 0), 1000);
        assert_eq!(backoff_ms(1000, 3, 60_000, 0), 4000);
        assert_eq!(backoff_ms(1000, 30, 60_000, 0), 60_000);
        assert_eq!(backoff_ms(1000, 1, 60_000, 2000), 1200);
        assert_eq!(backoff_ms(1000, 1, 60_000, -2000), 800);
        assert_eq!(backoff_ms(1000, 1, 60_000, 9999), 1200, "jitter is bounded");
        assert_eq!(backoff_ms(1000, 30, 60_000, 2000), 60_000, "never over the cap");
    }

    #[test]
    fn operator_retry_and_redrive_rerun_final_deliveries_out_of_order() {
        let db = testing::db();
        let c = &db.conn;
        let failed = message(c, "c", "k1", 1);
        let later = message(c, "c", "k2", 1);
        let got = claim_all(c, 1);
        for d in &got {
            deliver(c, d, 2);
        }
        report(c, &got[0], "r1", Outcome::Failed, Some(3), 3).unwrap();
        assert!(matches!(retry(c, &later, "op", "r", 4), Err(StoreError::InvalidTransition(_))), "run pending");
        report(c, &got[1], "r2", Outcome::Succeeded, Some(0), 3).unwrap();
        assert!(matches!(retry(c, &later, "op", "r", 4), Err(StoreError::InvalidTransition(_))), "succeeded");
        let f = RedriveFilter { outcome: "failed".into(), ..Default::default() };
        assert_eq!(
            redrive_batch(c, &f, i64::MIN, 10).unwrap().iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
            [failed.as_str()]
        );
        assert_eq!(retry(c, &failed, "op", "try again", 5).unwrap(), 2);
        assert!(redrive_batch(c, &f, i64::MIN, 10).unwrap().is_empty(), "a redriven delivery is not final");
        // A later turn queued after it does not wait for the redrive, nor the redrive for it.
        let third = message(c, "c", "k3", 1);
        let got = claim_all(c, 6);
        let mut ids: Vec<_> =
            got.iter().map(|d| (d.delivery_id.clone(), d.attempt, d.rerun.map(|r| r.as_str()))).collect();
        ids.sort();
        let mut expected = vec![(failed.clone(), 2, Some("redrive")), (third, 1, None)];
        expected.sort();
        assert_eq!(ids, expected);
        let (by, why): (String, String) = c
            .query_row("SELECT rerun_by, rerun_reason FROM deliveries WHERE id = ?1", [&failed], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!((by.as_str(), why.as_str()), ("operator:op", "try again"));
        // Redrive by request id is recorded once.
        record_redrive(c, "req-1", "op", "r", &f, 1, 7).unwrap();
        assert_eq!(recorded_redrive(c, "req-1").unwrap().unwrap().redriven, 1);
        assert!(record_redrive(c, "req-1", "op", "r", &f, 1, 8).is_err());
        // A cancelled-in-the-hub delivery is redriven as `cancelled`.
        let x = message(c, "x", "kx", 1);
        cancel(c, &x, Canceller::Operator("op"), "oops", false, 9).unwrap();
        let fc = RedriveFilter { outcome: "cancelled".into(), ..Default::default() };
        assert_eq!(redrive_batch(c, &fc, i64::MIN, 10).unwrap().len(), 1);
        retry(c, &x, "op", "r", 10).unwrap();
        let cancel_cleared: bool = c
            .query_row("SELECT cancel_requested_at IS NULL FROM deliveries WHERE id = ?1", [&x], |r| r.get(0))
            .unwrap();
        assert!(cancel_cleared);
    }
}
