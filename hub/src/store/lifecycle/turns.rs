//! Turn control: hub-confirmed starts, cancel (in every state), the claim's cancel notices and
//! retry wake-up, and the operator's retry and redrive of final deliveries.
//!
//! Invariant (execution gate, second half): a node runs a delivered turn only after the hub
//! recorded its start for the caller's session (`started_session`); a run already started by
//! another session, or whose cancel was asked for, is never started.
//!
//! Invariant (starts at once): on PostgreSQL a start job takes the record's write lock in shared
//! mode (`Writer::call_shared`), beside other hubs' claims, holders' steps, starts and reports.
//! It locks the rows of the deliveries it names first (`transition::lock_rows`), then reads
//! them: another hub's report or start of one of those runs either committed before (and is
//! read) or waits for this job. A session's lease changes under it only by its own renewal:
//! registrations and clean ends are exclusive, and every shared job first passes the host's
//! session check, whose newest session cannot change while any shared job runs. So two starts
//! of one run at once are the same session's (one request sent again through another hub): the
//! second reads the first's start and answers `start` as a repeat.
//!
//! Invariant (cancel): a delivery not yet delivered is failed at once; a delivered one without
//! an outcome of its current run gets `cancel_requested_*`, which its node learns from claims
//! and holdings; a final one is left as it is. Repeating a cancel answers the same and records
//! nothing more.
//!
//! Invariant (rerun): an operator's retry or redrive moves a final delivery back to `queued` as
//! a new run (`attempt + 1`, `rerun = 'redrive'`), clearing the holder, start and cancel of the
//! run before; it is the only run handed out out of `seq` order.

use crate::store::By;
use crate::store::Store;
use crate::store::engine::Db;
use crate::store::engine::OptionalExtension;
use crate::store::engine::dialect;
use crate::store::engine::params;
use crate::store::lifecycle::transition::{self, Change};
use crate::store::registry::audit::record_operator_event;
use crate::store::registry::sessions;
use crate::store::writer::SharedJob;
use crate::store::{Actor, StoreError, StoreResult, parse_column_opt, state_column};
use baton_shared::states::DeliveryState::{self, *};
use baton_shared::states::Outcome;
use baton_shared::wire::{CancelNotice, CancelResult, StartItem, StartResult};

/// Which deliveries a cancel of many picks (owned; see `CancelScope`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOf {
    /// One delivery, by id.
    Delivery(String),
    /// Every delivery of a conversation a cancel can still change.
    Conversation(String),
    /// Every delivery to a host a cancel can still change.
    Host(String),
}

impl Store {
    /// The producer `producer` cancels its message `message_id`.
    pub async fn cancel_message(
        &self,
        message_id: String,
        producer: String,
        reason: String,
    ) -> StoreResult<Vec<baton_shared::wire::CancelResult>> {
        let clock = self.clock.clone();
        self.conns.write(move |c| cancel_message(c, &message_id, &producer, &reason, clock.now_ms())).await
    }

    /// Which of the turns the node is about to start may run (recording the starts allowed).
    pub async fn start_turns(
        &self,
        host: String,
        instance_id: String,
        session: u64,
        starts: Vec<StartItem>,
    ) -> StoreResult<Vec<StartResult>> {
        let clock = self.clock.clone();
        self.conns
            .write_shared(Some(SharedJob::Starts), move |c| {
                sessions::check(c, &host, Some(session))?;
                let now = clock.now_ms();
                let results = start(c, &host, &instance_id, session, &starts, now)?;
                sessions::renew_lease(c, &host, session, now)?;
                Ok(results)
            })
            .await
    }

    /// The operator cancels the deliveries `which` names (or, with `dry_run`, says what a cancel
    /// would do, changing nothing), in one transaction; one result per delivery.
    pub async fn cancel(
        &self,
        which: CancelOf,
        by: By,
        dry_run: bool,
    ) -> StoreResult<Vec<baton_shared::wire::CancelResult>> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                let ids = match &which {
                    CancelOf::Delivery(id) => vec![id.clone()],
                    CancelOf::Conversation(conv) => cancellable(c, CancelScope::Conversation(conv))?,
                    CancelOf::Host(host) => cancellable(c, CancelScope::Host(host))?,
                };
                let canceller = Canceller::Operator(&by.operator);
                ids.iter().map(|id| cancel(c, id, canceller, &by.reason, dry_run, clock.now_ms())).collect()
            })
            .await
    }

    /// The operator queues a delivery's turn again as a new run; returns the run.
    pub async fn retry(&self, delivery_id: String, by: By) -> StoreResult<u32> {
        let clock = self.clock.clone();
        self.conns.write(move |c| retry(c, &delivery_id, &by.operator, &by.reason, clock.now_ms())).await
    }

    /// The redrive recorded under `request_id`, if one was.
    pub async fn recorded_redrive(&self, request_id: String) -> StoreResult<Option<RecordedRedrive>> {
        self.conns.read(move |c| recorded_redrive(c, &request_id)).await
    }

    /// The next at most `room` deliveries the redrive `filter` picks after the cursor `after`,
    /// with their cursors, changing nothing.
    pub async fn redrive_preview(
        &self,
        filter: RedriveFilter,
        after: i64,
        room: u32,
    ) -> StoreResult<Vec<(String, i64)>> {
        self.conns.read(move |c| redrive_batch(c, &filter, after, room)).await
    }

    /// Re-runs the next at most `room` deliveries the redrive `filter` picks after the cursor
    /// `after`, in one transaction; returns them with their cursors.
    pub async fn redrive_batch(
        &self,
        filter: RedriveFilter,
        after: i64,
        room: u32,
        by: By,
    ) -> StoreResult<Vec<(String, i64)>> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                let batch = redrive_batch(c, &filter, after, room)?;
                for (id, _) in &batch {
                    retry(c, id, &by.operator, &by.reason, clock.now_ms())?;
                }
                Ok(batch)
            })
            .await
    }

    /// Records a finished redrive under its request id.
    pub async fn record_redrive(
        &self,
        request_id: String,
        by: By,
        filter: RedriveFilter,
        redriven: i64,
    ) -> StoreResult<()> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| record_redrive(c, &request_id, &by.operator, &by.reason, &filter, redriven, clock.now_ms()))
            .await
    }
}

/// When the hub recorded the ack of `delivery_id`'s current run (its latest `delivered` event).
fn acked_at(conn: &dyn Db, delivery_id: &str) -> StoreResult<Option<i64>> {
    Ok(conn
        .prepare_cached("SELECT max(at) FROM delivery_events WHERE delivery_id = $1 AND to_state = 'delivered'")?
        .query_row([delivery_id], |r| r.get::<_, Option<i64>>(0))?)
}

/// A delivery's state and control columns, as the turn-control operations read them.
struct Turn {
    /// `None` for a pool delivery no claim has bound yet.
    host: Option<String>,
    /// The recipient pool of a pool delivery.
    pool: Option<String>,
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

/// A `Turn` from a row of `dialect::turn_columns!`, of the delivery `id`.
fn turn_of(r: &crate::store::engine::Row<'_>, id: &str) -> crate::store::engine::DbResult<Turn> {
    Ok(Turn {
        host: r.get(0)?,
        pool: r.get(9)?,
        state: state_column(r, 1, "deliveries", id)?,
        instance_id: r.get(2)?,
        claim_token: r.get(3)?,
        attempt: r.get(4)?,
        started_session: r.get(5)?,
        acked_session: r.get(8)?,
        cancel_requested: r.get(6)?,
        outcome: parse_column_opt(r, 7, "attempts", &format!("of delivery {id}"), "outcome", Outcome::parse)?,
    })
}

fn load(conn: &dyn Db, delivery_id: &str) -> StoreResult<Option<Turn>> {
    Ok(conn
        .prepare_cached(concat!("SELECT ", dialect::turn_columns!(), " FROM deliveries d WHERE d.id = $1"))?
        .query_row([delivery_id], |r| turn_of(r, delivery_id))
        .optional()?)
}

/// The turns of `ids` the record holds, by id, read in one statement (`dialect::TURNS_OF`):
/// a start batch's reads cost one round trip, not one per item. An id PostgreSQL stores
/// escaped (`PG_TEXT_ESCAPE`; no delivery id the hub makes has one) is left out, and read
/// alone by the caller like any id missing here.
fn load_many(conn: &dyn Db, ids: &[&str]) -> StoreResult<std::collections::HashMap<String, Turn>> {
    let plain: Vec<&str> = ids.iter().copied().filter(|id| dialect::listable(id)).collect();
    let mut turns = std::collections::HashMap::with_capacity(plain.len());
    if plain.is_empty() {
        return Ok(turns);
    }
    let list = serde_json::to_string(&plain).map_err(|e| StoreError::Invalid(format!("delivery ids: {e}")))?;
    let mut stmt = conn.prepare_cached(dialect::TURNS_OF.of(conn))?;
    let rows = stmt.query_map([list], |r| {
        let id: String = r.get(10)?;
        let turn = turn_of(r, &id)?;
        Ok((id, turn))
    })?;
    for row in rows {
        let (id, turn) = row?;
        turns.insert(id, turn);
    }
    Ok(turns)
}

/// `POST /v1/starts`: for each item, whether the caller's session may start that run (and the
/// start recorded when it may). Items are answered in order; one item's refusal does not
/// affect the others.
///
/// A run an older session of the instance acked is not started for a newer session while that
/// older session's start lease lasts (`start_lease_pending`, with when to ask again): until
/// then the older process, if it still runs cut off from the hub, may start it on its own.
/// Once the lease has run out the run is `started_elsewhere` (the newer session reports it
/// `unknown`): the hub cannot know whether the older process started it within its lease. A
/// run whose start the hub granted to an older session waits the same way while that
/// session's lease lasts (the grant's answer may never have reached it, and then it starts the
/// run on its own), and is `started_elsewhere` after. The
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
    let ids: Vec<&str> = items.iter().map(|i| i.delivery_id.as_str()).collect();
    transition::lock_rows(conn, &ids)?;
    let mut read = load_many(conn, &ids)?;
    for item in items {
        let refuse = |code: &str, message: String| StartResult {
            delivery_id: item.delivery_id.clone(),
            start: false,
            code: Some(code.to_string()),
            message: Some(message),
            retry_after_ms: None,
        };
        // Each id read once for the batch; an item repeated in it is read again, after the
        // first one's start.
        let turn = match read.remove(&item.delivery_id) {
            Some(t) => Some(t),
            None => load(conn, &item.delivery_id)?,
        };
        let turn = match turn {
            Some(t) if t.host.as_deref() == Some(host) => t,
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
        // An older session of the instance `who` may still start the run on its own for
        // `wait_ms` (its start lease): ask again then.
        let lease_pending = |wait_ms: i64, who: &str| StartResult {
            retry_after_ms: Some(wait_ms as u64),
            ..refuse(
                "start_lease_pending",
                format!(
                    "run {} of delivery {} was {who} of this node instance, which may still start it on its own \
                     for {wait_ms} ms (its start lease); ask again then",
                    turn.attempt, item.delivery_id
                ),
            )
        };
        if turn.cancel_requested {
            out.push(refuse("cancelled", format!("delivery {} was cancelled before it started", item.delivery_id)));
            continue;
        }
        if turn.started_session.is_none()
            && let Some(acked) = turn.acked_session.filter(|a| *a < session as i64)
            && let Some(lease) = crate::store::registry::sessions::lease(conn, host, acked as u64)?
            && lease.may_have_started(acked_at(conn, &item.delivery_id)?)
        {
            if lease.until > now_ms {
                out.push(lease_pending(lease.until - now_ms, &format!("acked by session {acked}")));
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
                    "UPDATE deliveries SET started_session = $2, started_at = $3 WHERE id = $1 AND started_session IS NULL",
                )?
                .execute_unread(params![item.delivery_id, session as i64, now_ms])?;
            }
            Some(s) if s == session as i64 => {}
            // Granted to an older session of the instance whose start lease lasts: if that
            // grant's answer was lost on a cut-off link, the older process starts the run on its
            // own within its lease, so the newer one waits (and reports nothing) until the lease
            // ran out, as for a run the older session acked and never asked to start.
            Some(s)
                if s < session as i64
                    && let Some(lease) = crate::store::registry::sessions::lease(conn, host, s as u64)?
                    && lease.until > now_ms =>
            {
                out.push(lease_pending(lease.until - now_ms, &format!("started by session {s}")));
                continue;
            }
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
        pool: turn.pool.clone(),
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
        "UPDATE deliveries SET cancel_requested_at = $2, cancel_by = $3, cancel_reason = $4, not_before = NULL
         WHERE id = $1",
    )?
    .execute(params![delivery_id, now_ms, by, reason])?;
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
        "SELECT d.id FROM deliveries d WHERE d.{column} = $1
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
        .prepare_cached("SELECT producer FROM messages WHERE id = $1")?
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
        .prepare_cached("SELECT id FROM deliveries WHERE message_id = $1 ORDER BY host")?
        .query_map([message_id], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    ids.iter().map(|id| cancel(conn, id, Canceller::Producer(producer), reason, false, now_ms)).collect()
}

/// The delivered turns `instance_id` holds whose cancel was asked for and whose current run has
/// no outcome yet: the claim answer's `cancels`. Read through the partial index of pending
/// cancels (`dialect::CANCELS_PENDING`): every claim asks.
pub fn cancels_for(conn: &dyn Db, host: &str, instance_id: &str) -> StoreResult<Vec<CancelNotice>> {
    Ok(conn
        .prepare_cached(dialect::CANCELS_PENDING.of(conn))?
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
             WHERE host = $1 AND state = 'queued' AND not_before IS NOT NULL AND not_before > $2",
        )?
        .query_row(params![host, now_ms], |r| r.get(0))?)
}

/// The outcome a final delivery ended with, as `retry` and `redrive` select by it, the same
/// word every listing shows (`read::outcome_sql`). `None` while it is not final.
const FINAL_OUTCOME_SQL: &str = crate::store::views::read::outcome_sql!();

/// `deliveries retry ID`: re-runs one final delivery (failed, unknown, or delivered whose current
/// run failed, ended unknown or was cancelled) as a new run marked as a redrive. Returns the new
/// run number.
pub fn retry(conn: &dyn Db, delivery_id: &str, operator: &str, reason: &str, now_ms: i64) -> StoreResult<u32> {
    let sql = format!("SELECT d.state, {FINAL_OUTCOME_SQL} FROM deliveries d WHERE d.id = $1");
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
            "UPDATE deliveries SET attempt = attempt + 1, rerun = 'redrive', rerun_by = $2, rerun_reason = $3,
                    not_before = NULL, started_session = NULL, started_at = NULL, acked_session = NULL,
                    cancel_requested_at = NULL, cancel_by = NULL, cancel_reason = NULL, reason = NULL
             WHERE id = $1 RETURNING attempt",
        )?
        .query_row(params![delivery_id, format!("operator:{operator}"), reason], |r| r.get(0))?;
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
    /// `--since` as given when it was a duration ago (`2h`): a repeat of the same request
    /// resolves it to another moment, so the idempotency check compares this text instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since_ago: Option<String>,
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
         WHERE d.n > $1 AND (CAST($2 AS TEXT) IS NULL OR d.conversation = $2) AND (CAST($3 AS TEXT) IS NULL OR d.host = $3)
           AND (CAST($4 AS BIGINT) IS NULL OR d.updated_at >= $4) AND d.state IN ('delivered', 'failed', 'unknown')
           AND {FINAL_OUTCOME_SQL} = $5
         ORDER BY d.n LIMIT $6"
    );
    Ok(conn
        .prepare_cached(&sql)?
        .query_map(params![after_n, filter.conversation, filter.host, filter.since_ms, filter.outcome, batch], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
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
        .prepare_cached("SELECT operator, reason, filter, redriven, at FROM redrive_requests WHERE request_id = $1")?
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
        "INSERT INTO redrive_requests (request_id, operator, reason, filter, redriven, at) VALUES ($1, $2, $3, $4, $5, $6)",
    )?
    .execute(params![request_id, operator, reason, filter, redriven, now_ms])?;
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
#[path = "../tests/turns.rs"]
mod tests;
