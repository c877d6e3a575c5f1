//! Read-only views: messages with deliveries and attempts, delivery listings with their event
//! history, and the status overview.

use crate::store::Store;
use crate::store::engine::OptionalExtension;
use crate::store::engine::dialect;
use crate::store::engine::params;
use crate::store::engine::{Db, DbResult, Row};
use crate::store::{
    ActorKind, StoreError, StoreResult, corrupt, json_column, parse_column, parse_column_opt, state_column,
};
use baton_shared::states::Rerun;
use baton_shared::states::{DeliveryState, Outcome};
use baton_shared::wire::{AttemptView, DeliveryView, MessageView};

impl Store {
    // ---- Reads for operators, status and metrics ----

    /// Whether the record is in use (hosts, certificates, messages): `init` refuses to put a new
    /// CA over one that is.
    pub async fn in_use(&self) -> StoreResult<InUse> {
        self.conns.read(in_use).await
    }

    /// Counts per state, pending fan-out, fences and hosts.
    pub async fn status(&self) -> StoreResult<StatusView> {
        self.conns.read(status).await
    }

    /// One delivery with its events and attempts.
    pub async fn delivery_detail(&self, delivery_id: String) -> StoreResult<DeliveryDetail> {
        self.conns.read(move |c| delivery_detail(c, &delivery_id)).await
    }

    /// The id of `producer`'s message with idempotency key `key`, if any.
    pub async fn message_id_by_key(&self, producer: String, key: String) -> StoreResult<Option<String>> {
        self.conns.read(move |c| message_id_by_key(c, &producer, &key)).await
    }

    /// A message with its deliveries and attempts.
    pub async fn message_by_id(&self, message_id: String) -> StoreResult<MessageView> {
        self.conns.read(move |c| message_view(c, &message_id)).await
    }

    /// The bytes the record takes (`store_bytes`), for `limits.store_bytes_max`.
    pub async fn store_bytes(&self) -> StoreResult<i64> {
        self.conns.read(store_bytes).await
    }

    /// One delivery of a message with all its attempts, and the message's producer.
    pub async fn delivery_of_message(
        &self,
        message_id: String,
        delivery_id: String,
    ) -> StoreResult<(String, DeliveryView)> {
        self.conns.read(move |c| delivery_view(c, &message_id, &delivery_id)).await
    }
}

/// Finds a message id by producer and idempotency key.
pub fn message_id_by_key(conn: &dyn Db, producer: &str, key: &str) -> StoreResult<Option<String>> {
    Ok(conn
        .prepare_cached("SELECT id FROM messages WHERE producer = $1 AND idempotency_key = $2")?
        .query_row([producer, key], |r| r.get(0))
        .optional()?)
}

/// A message with its deliveries and their attempts.
pub fn message_view(conn: &dyn Db, message_id: &str) -> StoreResult<MessageView> {
    let mut view = conn
        .prepare_cached(
            "SELECT id, conversation, seq, producer, idempotency_key, payload, accepted_at, traceparent
             FROM messages WHERE id = $1",
        )?
        .query_row([message_id], |r| {
            Ok(MessageView {
                message_id: r.get(0)?,
                conversation: r.get(1)?,
                seq: r.get(2)?,
                producer: r.get(3)?,
                idempotency_key: r.get(4)?,
                payload: json_column(r, 5, "messages", message_id)?,
                accepted_at_ms: r.get(6)?,
                traceparent: r.get(7)?,
                deliveries: Vec::new(),
                omitted: None,
            })
        })
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("no message {message_id}")))?;
    let mut deliveries: Vec<DeliveryView> = conn
        .prepare_cached(&format!("{DELIVERY_VIEW} WHERE d.message_id = $1 ORDER BY d.host"))?
        .query_map([message_id], delivery_view_row)?
        .collect::<Result<_, _>>()?;
    for d in &mut deliveries {
        d.attempts = attempts_of(conn, &d.delivery_id)?;
    }
    view.deliveries = deliveries;
    Ok(view)
}

/// The columns `delivery_view_row` reads.
const DELIVERY_VIEW: &str =
    "SELECT d.id, d.host, d.state, d.reason, d.updated_at, d.attempt, m.max_attempts, d.not_before,
        d.cancel_requested_at, d.cancel_reason, m.producer, d.pool
    FROM deliveries d JOIN messages m ON m.id = d.message_id";

/// One delivery of a message view, without its attempts.
fn delivery_view_row(r: &Row<'_>) -> DbResult<DeliveryView> {
    let id: String = r.get(0)?;
    Ok(DeliveryView {
        host: r.get(1)?,
        pool: r.get(11)?,
        state: state_column(r, 2, "deliveries", &id)?,
        reason: r.get(3)?,
        updated_at_ms: r.get(4)?,
        attempts: Vec::new(),
        attempt: r.get(5)?,
        max_attempts: r.get(6)?,
        not_before_ms: r.get(7)?,
        cancel_requested_at_ms: r.get(8)?,
        cancel_reason: r.get(9)?,
        delivery_id: id,
    })
}

/// One delivery of message `message_id` with all its attempts, and the message's producer (for
/// the caller's ownership check): what a message view too large for its bound points to.
/// `NotFound` when the message has no such delivery.
pub fn delivery_view(conn: &dyn Db, message_id: &str, delivery_id: &str) -> StoreResult<(String, DeliveryView)> {
    let found = conn
        .prepare_cached(&format!("{DELIVERY_VIEW} WHERE d.message_id = $1 AND d.id = $2"))?
        .query_row([message_id, delivery_id], |r| {
            let producer: String = r.get(10)?;
            Ok((producer, delivery_view_row(r)?))
        })
        .optional()?;
    let Some((producer, mut d)) = found else {
        return Err(StoreError::NotFound(format!("no delivery {delivery_id} of message {message_id}")));
    };
    d.attempts = attempts_of(conn, &d.delivery_id)?;
    Ok((producer, d))
}

/// The attempts of one delivery, oldest first.
pub fn attempts_of(conn: &dyn Db, delivery_id: &str) -> StoreResult<Vec<AttemptView>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE delivery_id = $1 ORDER BY attempt, reported_at, id"
        ))?
        .query_map([delivery_id], attempt_row)?
        .collect::<Result<_, _>>()?)
}

/// Whether a delivery is settled: terminal and, when delivered, with an outcome of its current
/// run.
pub fn settled(d: &DeliveryView) -> bool {
    match d.state {
        DeliveryState::Failed | DeliveryState::Unknown => true,
        DeliveryState::Delivered => d.attempts.iter().any(|a| a.attempt == d.attempt),
        _ => false,
    }
}

/// The bytes the record takes, as `limits.store_bytes_max` counts them: on SQLite the file's
/// pages in use (free pages are reused before the file grows, so they do not count); on
/// PostgreSQL the database's size on disk.
pub fn store_bytes(conn: &dyn Db) -> StoreResult<i64> {
    Ok(conn.prepare_cached(dialect::STORE_BYTES.of(conn))?.query_row([], |r| r.get(0))?)
}

/// A delivery as listed for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRow {
    /// Its id.
    pub delivery_id: String,
    /// Its message.
    pub message_id: String,
    /// The host it is for: its recipient host, or the pool member whose claim took it; `None`
    /// for a pool delivery no member has claimed yet.
    pub host: Option<String>,
    /// The recipient pool, for a pool delivery (kept for life, also once a member holds it).
    pub pool: Option<String>,
    /// Conversation.
    pub conversation: String,
    /// Sequence in the conversation.
    pub seq: i64,
    /// State.
    pub state: DeliveryState,
    /// Holding instance.
    pub instance_id: Option<String>,
    /// Reason, for failed, unknown, held.
    pub reason: Option<String>,
    /// Last change (unix ms).
    pub updated_at_ms: i64,
    /// Outcome of the latest attempt, if any.
    pub outcome: Option<Outcome>,
}

/// The columns `delivery_row` reads, in its order (id, message, host, conversation, seq, state,
/// instance, reason, updated, latest outcome, pool), over the alias `d` of `deliveries`; a
/// statement's own columns follow them from index 11.
macro_rules! delivery_columns {
    () => {
        concat!(
            "d.id, d.message_id, d.host, d.conversation, d.seq, d.state, d.instance_id, d.reason, d.updated_at, ",
            crate::store::views::read::outcome_sql!(),
            ", d.pool"
        )
    };
}
pub(crate) use delivery_columns;

/// Maps a row in `delivery_columns`' order to a `DeliveryRow`.
pub(super) fn delivery_row(r: &Row<'_>) -> DbResult<DeliveryRow> {
    let delivery_id: String = r.get(0)?;
    Ok(DeliveryRow {
        message_id: r.get(1)?,
        host: r.get(2)?,
        conversation: r.get(3)?,
        seq: r.get(4)?,
        state: state_column(r, 5, "deliveries", &delivery_id)?,
        instance_id: r.get(6)?,
        reason: r.get(7)?,
        updated_at_ms: r.get(8)?,
        outcome: parse_column_opt(r, 9, "attempts", &format!("of delivery {delivery_id}"), "outcome", Outcome::parse)?,
        pool: r.get(10)?,
        delivery_id,
    })
}

/// Filters for `deliveries list`.
#[derive(Debug, Clone, Default)]
pub struct DeliveryFilter {
    /// Only this state.
    pub state: Option<DeliveryState>,
    /// Only this host.
    pub host: Option<String>,
    /// Only this conversation.
    pub conversation: Option<String>,
    /// At most this many rows (oldest first).
    pub limit: u32,
}

/// A delivery's outcome, the one word every listing shows, every `--outcome` filter selects by
/// and `retry`/`redrive` act on: its current run's reported outcome when delivered (`succeeded`,
/// `failed`, `unknown`, `cancelled`; none while the run goes on); `cancelled` when it was
/// cancelled before its handoff; otherwise its final state (`failed`: refused, blocked,
/// rejected; `unknown`); none while it waits or is on its way (queued, held, claimed,
/// mirrored, or redriven and not yet ended). SQL over the alias `d` of `deliveries`, the same
/// text on both backends.
macro_rules! outcome_sql {
    () => {
        "(CASE WHEN d.state = 'delivered' THEN
             (SELECT a.outcome FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)
         WHEN d.state = 'failed' AND d.cancel_requested_at IS NOT NULL THEN 'cancelled'
         WHEN d.state IN ('failed', 'unknown') THEN d.state END)"
    };
}
pub(crate) use outcome_sql;

/// Lists deliveries, oldest first.
pub fn list_deliveries(conn: &dyn Db, f: &DeliveryFilter) -> StoreResult<Vec<DeliveryRow>> {
    let rows = conn
        .prepare_cached(
            concat!(
                "SELECT ",
                delivery_columns!(),
                "
             FROM deliveries d
             WHERE (CAST($1 AS TEXT) IS NULL OR d.state = $1) AND (CAST($2 AS TEXT) IS NULL OR d.host = $2) AND (CAST($3 AS TEXT) IS NULL OR d.conversation = $3)
             ORDER BY d.n LIMIT $4"
            ),
        )?
        .query_map(
            params![f.state.map(DeliveryState::as_str), f.host, f.conversation, f.limit],
            delivery_row,
        )?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// One event of a delivery's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    /// Commit order.
    pub id: i64,
    /// Previous state (none for creation).
    pub from_state: Option<DeliveryState>,
    /// New state.
    pub to_state: DeliveryState,
    /// Hub, node or operator.
    pub actor_kind: ActorKind,
    /// Who.
    pub actor: String,
    /// The node instance involved.
    pub instance_id: Option<String>,
    /// Why.
    pub reason: Option<String>,
    /// When (unix ms).
    pub at_ms: i64,
}

/// A delivery with its history and attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryDetail {
    /// The delivery.
    pub delivery: DeliveryRow,
    /// Its events, in commit order.
    pub events: Vec<EventRow>,
    /// Its attempts.
    pub attempts: Vec<AttemptView>,
}

/// One delivery with its event history and attempts.
pub fn delivery_detail(conn: &dyn Db, delivery_id: &str) -> StoreResult<DeliveryDetail> {
    let delivery = conn
        .prepare_cached(concat!("SELECT ", delivery_columns!(), " FROM deliveries d WHERE d.id = $1"))?
        .query_row([delivery_id], delivery_row)
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("no delivery {delivery_id}")))?;
    let events = conn
        .prepare_cached(
            "SELECT id, from_state, to_state, actor_kind, actor, instance_id, reason, at FROM delivery_events
             WHERE delivery_id = $1 ORDER BY id",
        )?
        .query_map([delivery_id], |r| {
            let id: i64 = r.get(0)?;
            let row = id.to_string();
            Ok(EventRow {
                id,
                from_state: parse_column_opt(r, 1, "delivery_events", &row, "delivery state", DeliveryState::parse)?,
                to_state: state_column(r, 2, "delivery_events", &row)?,
                actor_kind: parse_column(r, 3, "delivery_events", &row, "actor kind", ActorKind::parse)?,
                actor: r.get(4)?,
                instance_id: r.get(5)?,
                reason: r.get(6)?,
                at_ms: r.get(7)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(DeliveryDetail { attempts: attempts_of(conn, delivery_id)?, delivery, events })
}

/// The overview printed by `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusView {
    /// Deliveries per state (states with none are left out), by state name.
    pub deliveries: Vec<(DeliveryState, i64)>,
    /// Messages accepted.
    pub messages: i64,
    /// Fan-out obligations not yet done.
    pub pending_fanout: i64,
    /// Active fences.
    pub active_fences: i64,
    /// Enrolled hosts (not retired).
    pub hosts: i64,
    /// Attempts recorded.
    pub attempts: i64,
    /// The schema version.
    pub schema_version: i64,
}

/// What shows that a record is in use, made under some hub's CA: hosts ever enrolled (retired
/// ones too), certificates issued (a producer's too), messages accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InUse {
    /// Hosts ever enrolled.
    pub hosts: i64,
    /// Certificates issued.
    pub certificates: i64,
    /// Messages accepted.
    pub messages: i64,
}

impl InUse {
    /// Whether anything at all is in the record.
    pub fn any(&self) -> bool {
        self.hosts > 0 || self.certificates > 0 || self.messages > 0
    }
}

/// `InUse` of the record.
pub fn in_use(conn: &dyn Db) -> StoreResult<InUse> {
    let one = |sql: &str| -> StoreResult<i64> { Ok(conn.query_row(sql, [], |r| r.get(0))?) };
    Ok(InUse {
        hosts: one("SELECT count(*) FROM hosts")?,
        certificates: one("SELECT count(*) FROM certificates")?,
        messages: one("SELECT count(*) FROM messages")?,
    })
}

/// Counts for the overview.
pub fn status(conn: &dyn Db) -> StoreResult<StatusView> {
    let deliveries = conn
        .prepare_cached("SELECT state, count(*) FROM deliveries GROUP BY state ORDER BY state")?
        .query_map([], |r| {
            let state = parse_column(r, 0, "deliveries", "(grouped by state)", "delivery state", DeliveryState::parse)?;
            Ok((state, r.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    let one = |sql: &str| -> StoreResult<i64> { Ok(conn.query_row(sql, [], |r| r.get(0))?) };
    Ok(StatusView {
        deliveries,
        messages: one("SELECT count(*) FROM messages")?,
        pending_fanout: one("SELECT count(*) FROM fanout_obligations WHERE done_at IS NULL")?,
        active_fences: crate::store::registry::fences::active_count(conn)?,
        hosts: crate::store::registry::hosts::active_count(conn)?,
        attempts: one("SELECT count(*) FROM attempts")?,
        schema_version: crate::store::schema_version(conn)?,
    })
}

/// Reads one attempt.
pub fn attempt(conn: &dyn Db, attempt_id: &str) -> StoreResult<AttemptView> {
    Ok(conn
        .prepare_cached(
            "SELECT id, report_id, outcome, exit_code, duration_ms, result, reason, reported_at, signal, attempt,
                    retryable, rerun, caused_by, stderr_tail, stderr_dropped_bytes
             FROM attempts WHERE id = $1",
        )?
        .query_row([attempt_id], attempt_row)?)
}

/// The columns `attempt_row` reads, in its order.
pub const ATTEMPT_COLUMNS: &str = "id, report_id, outcome, exit_code, duration_ms, result, reason, reported_at, signal, attempt, retryable, rerun, \
     caused_by, stderr_tail, stderr_dropped_bytes";

/// Maps an attempts row (in the column order of `ATTEMPT_COLUMNS`) to its view. An outcome that does not
/// parse, or a negative duration, is an error naming the attempt.
pub fn attempt_row(r: &Row<'_>) -> DbResult<AttemptView> {
    let attempt_id: String = r.get(0)?;
    let duration = match r.get::<_, Option<i64>>(4)? {
        None => None,
        Some(d) => Some(
            u64::try_from(d)
                .map_err(|_| corrupt(r, 4, "attempts", &attempt_id, "duration in milliseconds", &d.to_string()))?,
        ),
    };
    let stderr_dropped =
        match r.get::<_, Option<i64>>(14)? {
            None => None,
            Some(n) => Some(u64::try_from(n).map_err(|_| {
                corrupt(r, 14, "attempts", &attempt_id, "count of dropped stderr bytes", &n.to_string())
            })?),
        };
    Ok(AttemptView {
        report_id: r.get(1)?,
        outcome: parse_column(r, 2, "attempts", &attempt_id, "outcome", Outcome::parse)?,
        exit_code: r.get(3)?,
        duration_ms: duration,
        result: r.get(5)?,
        reason: r.get(6)?,
        reported_at_ms: r.get(7)?,
        signal: r.get(8)?,
        attempt: r.get(9)?,
        retryable: r.get(10)?,
        rerun: parse_column_opt(r, 11, "attempts", &attempt_id, "rerun", Rerun::parse)?,
        caused_by: r.get(12)?,
        stderr_tail: r.get(13)?,
        stderr_dropped_bytes: stderr_dropped,
        attempt_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::testing;

    /// Corrupts one stored value behind the schema's back (as damage would).
    fn corrupt(conn: &dyn Db, sql: &str, id: &str) {
        conn.execute_batch("PRAGMA ignore_check_constraints = ON").unwrap();
        conn.execute(sql, [id]).unwrap();
    }

    /// One case: `read` fails with `Corrupt`, naming `needle` (the row) and `column`.
    fn check<T: std::fmt::Debug>(read: StoreResult<T>, needle: &str, column: &str) {
        match read {
            Err(StoreError::Corrupt(text)) => {
                assert!(text.contains(needle) && text.contains(column), "{text} should name {needle} and {column}")
            }
            other => panic!("expected a corrupt-record error naming {needle}, got {other:?}"),
        }
    }

    /// Regression: unparsable stored states, outcomes, actor kinds and payloads read as
    /// `unknown`, `null` or the raw string; they are errors naming the row.
    #[test]
    fn corrupt_values_are_errors_naming_the_row() {
        let db = testing::db();
        let c = &db.conn;
        let msg = accept_one(c, "c", "k", &["host-a"]);
        let d: String = c.query_row("SELECT id FROM deliveries", [], |r| r.get(0)).unwrap();
        let all = DeliveryFilter { limit: 10, ..Default::default() };
        assert_eq!(list_deliveries(c, &all).unwrap()[0].state, DeliveryState::Queued);

        corrupt(c, "UPDATE deliveries SET state = 'lost' WHERE id = $1", &d);
        check(list_deliveries(c, &all), &d, "state");
        check(delivery_detail(c, &d), &d, "state");
        check(message_view(c, &msg), &d, "state");
        check(status(c), "deliveries", "state");
        check(crate::store::lifecycle::transition::state_of(c, &d), &d, "state");
        corrupt(c, "UPDATE deliveries SET state = 'queued' WHERE id = $1", &d);

        corrupt(c, "UPDATE delivery_events SET actor_kind = 'ghost' WHERE delivery_id = $1", &d);
        check(delivery_detail(c, &d), "delivery_events", "actor_kind");
        corrupt(c, "UPDATE delivery_events SET actor_kind = 'hub', to_state = 'gone' WHERE delivery_id = $1", &d);
        check(delivery_detail(c, &d), "delivery_events", "to_state");
        corrupt(c, "UPDATE delivery_events SET to_state = 'queued' WHERE delivery_id = $1", &d);

        c.execute(
            "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, reported_at)
             VALUES ('att-1', $1, 'host-a', 'i', 'r1', 'h', 'succeeded', 1)",
            [&d],
        )
        .unwrap();
        corrupt(c, "UPDATE attempts SET outcome = 'maybe' WHERE delivery_id = $1", &d);
        check(attempts_of(c, &d), "att-1", "outcome");
        // A listing shows the outcome of a delivered delivery's current run.
        corrupt(
            c,
            "UPDATE deliveries SET state = 'delivered', instance_id = 'i', claim_token = 't',
                                   attempt = (SELECT attempt FROM attempts WHERE id = 'att-1') WHERE id = $1",
            &d,
        );
        check(list_deliveries(c, &all), &d, "outcome");
        corrupt(c, "UPDATE deliveries SET state = 'queued', instance_id = NULL, claim_token = NULL WHERE id = $1", &d);
        corrupt(c, "UPDATE attempts SET outcome = 'failed', duration_ms = -5 WHERE delivery_id = $1", &d);
        check(attempts_of(c, &d), "att-1", "duration_ms");
        corrupt(c, "UPDATE attempts SET duration_ms = 5 WHERE delivery_id = $1", &d);

        c.execute("UPDATE messages SET payload = '{oops' WHERE id = $1", [&msg]).unwrap();
        check(message_view(c, &msg), &msg, "payload");
    }

    /// The record's size grows with what it holds (on SQLite, byte for byte; PostgreSQL
    /// compresses and preallocates, so there it is only positive).
    #[test]
    fn store_bytes_counts_what_the_record_holds() {
        let db = crate::store::testing::db();
        let c = &db.conn;
        let empty = store_bytes(c).unwrap();
        assert!(empty > 0, "{empty}");
        if c.sqlite_file().is_none() {
            return;
        }
        c.execute("INSERT INTO conversations (name, last_seq) VALUES ('c', 0)", []).unwrap();
        for i in 0..50 {
            let payload = format!("{{\"pad\": \"{}\"}}", "x".repeat(4000));
            c.execute(
                "INSERT INTO messages (id, conversation, seq, producer, idempotency_key, content_hash, payload, accepted_at)
                 VALUES ($1, 'c', $2, 'p', $1, 'h', $3, 1)",
                params![format!("m{i}"), i + 1, payload],
            )
            .unwrap();
        }
        assert!(store_bytes(c).unwrap() >= empty + 50 * 4000, "grew with the 50 payloads");
    }
}
