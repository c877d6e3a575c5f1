//! Read-only views: messages with deliveries and attempts, delivery listings with their event
//! history, and the status overview.

use super::report::attempt_row;
use super::{StoreError, StoreResult};
use baton_shared::states::DeliveryState;
use baton_shared::wire::{AttemptView, DeliveryView, MessageView};
use rusqlite::{Connection, OptionalExtension, named_params};

/// Finds a message id by producer and idempotency key.
pub fn message_id_by_key(conn: &Connection, producer: &str, key: &str) -> StoreResult<Option<String>> {
    Ok(conn
        .prepare_cached("SELECT id FROM messages WHERE producer = ?1 AND idempotency_key = ?2")?
        .query_row([producer, key], |r| r.get(0))
        .optional()?)
}

/// A message with its deliveries and their attempts.
pub fn message_view(conn: &Connection, message_id: &str) -> StoreResult<MessageView> {
    let mut view = conn
        .prepare_cached(
            "SELECT id, conversation, seq, producer, idempotency_key, payload, accepted_at FROM messages WHERE id = ?1",
        )?
        .query_row([message_id], |r| {
            let payload: String = r.get(5)?;
            Ok(MessageView {
                message_id: r.get(0)?,
                conversation: r.get(1)?,
                seq: r.get(2)?,
                producer: r.get(3)?,
                idempotency_key: r.get(4)?,
                payload: serde_json::from_str(&payload).unwrap_or(serde_json::Value::Null),
                accepted_at_ms: r.get(6)?,
                deliveries: Vec::new(),
            })
        })
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("no message {message_id}")))?;
    let deliveries: Vec<(String, String, String, Option<String>, i64)> = conn
        .prepare_cached(
            "SELECT id, host, state, reason, updated_at FROM deliveries WHERE message_id = ?1 ORDER BY host",
        )?
        .query_map([message_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))?
        .collect::<Result<_, _>>()?;
    for (id, host, state, reason, updated_at_ms) in deliveries {
        view.deliveries.push(DeliveryView {
            attempts: attempts_of(conn, &id)?,
            delivery_id: id,
            host,
            state: DeliveryState::parse(&state).unwrap_or(DeliveryState::Unknown),
            reason,
            updated_at_ms,
        });
    }
    Ok(view)
}

/// The attempts of one delivery, oldest first.
pub fn attempts_of(conn: &Connection, delivery_id: &str) -> StoreResult<Vec<AttemptView>> {
    Ok(conn
        .prepare_cached(
            "SELECT id, report_id, outcome, exit_code, duration_ms, result, reason, reported_at FROM attempts
             WHERE delivery_id = ?1 ORDER BY reported_at, id",
        )?
        .query_map([delivery_id], attempt_row)?
        .collect::<Result<_, _>>()?)
}

/// Whether a delivery is settled: terminal and, when delivered, with an outcome.
pub fn settled(d: &DeliveryView) -> bool {
    match d.state {
        DeliveryState::Failed | DeliveryState::Unknown => true,
        DeliveryState::Delivered => !d.attempts.is_empty(),
        _ => false,
    }
}

/// A delivery as listed for operators.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeliveryRow {
    /// Its id.
    pub delivery_id: String,
    /// Its message.
    pub message_id: String,
    /// Recipient host.
    pub host: String,
    /// Conversation.
    pub conversation: String,
    /// Sequence in the conversation.
    pub seq: i64,
    /// State.
    pub state: String,
    /// Holding instance.
    pub instance_id: Option<String>,
    /// Reason, for failed, unknown, held.
    pub reason: Option<String>,
    /// Last change (unix ms).
    pub updated_at_ms: i64,
    /// Outcome of the latest attempt, if any.
    pub outcome: Option<String>,
}

/// Maps a row in the listing's column order (id, message, host, conversation, seq, state,
/// instance, reason, updated, latest outcome) to a `DeliveryRow`.
fn delivery_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<DeliveryRow> {
    Ok(DeliveryRow {
        delivery_id: r.get(0)?,
        message_id: r.get(1)?,
        host: r.get(2)?,
        conversation: r.get(3)?,
        seq: r.get(4)?,
        state: r.get(5)?,
        instance_id: r.get(6)?,
        reason: r.get(7)?,
        updated_at_ms: r.get(8)?,
        outcome: r.get(9)?,
    })
}

/// Filters for `deliveries list`.
#[derive(Debug, Clone, Default)]
pub struct DeliveryFilter {
    /// Only this state.
    pub state: Option<String>,
    /// Only this host.
    pub host: Option<String>,
    /// Only this conversation.
    pub conversation: Option<String>,
    /// At most this many rows (oldest first).
    pub limit: u32,
}

/// Lists deliveries, oldest first.
pub fn list_deliveries(conn: &Connection, f: &DeliveryFilter) -> StoreResult<Vec<DeliveryRow>> {
    let rows = conn
        .prepare_cached(
            "SELECT d.id, d.message_id, d.host, d.conversation, d.seq, d.state, d.instance_id, d.reason, d.updated_at,
                    (SELECT outcome FROM attempts a WHERE a.delivery_id = d.id ORDER BY reported_at DESC LIMIT 1)
             FROM deliveries d
             WHERE (:s IS NULL OR d.state = :s) AND (:h IS NULL OR d.host = :h) AND (:c IS NULL OR d.conversation = :c)
             ORDER BY d.n LIMIT :limit",
        )?
        .query_map(named_params! {":s": f.state, ":h": f.host, ":c": f.conversation, ":limit": f.limit}, delivery_row)?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// One event of a delivery's history.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EventRow {
    /// Commit order.
    pub id: i64,
    /// Previous state (none for creation).
    pub from_state: Option<String>,
    /// New state.
    pub to_state: String,
    /// hub, node or operator.
    pub actor_kind: String,
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
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeliveryDetail {
    /// The delivery.
    pub delivery: DeliveryRow,
    /// Its events, in commit order.
    pub events: Vec<EventRow>,
    /// Its attempts.
    pub attempts: Vec<AttemptView>,
}

/// One delivery with its event history and attempts.
pub fn delivery_detail(conn: &Connection, delivery_id: &str) -> StoreResult<DeliveryDetail> {
    let delivery = conn
        .prepare_cached(
            "SELECT d.id, d.message_id, d.host, d.conversation, d.seq, d.state, d.instance_id, d.reason, d.updated_at,
                    (SELECT outcome FROM attempts a WHERE a.delivery_id = d.id ORDER BY reported_at DESC LIMIT 1)
             FROM deliveries d WHERE d.id = ?1",
        )?
        .query_row([delivery_id], delivery_row)
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("no delivery {delivery_id}")))?;
    let events = conn
        .prepare_cached(
            "SELECT id, from_state, to_state, actor_kind, actor, instance_id, reason, at FROM delivery_events
             WHERE delivery_id = ?1 ORDER BY id",
        )?
        .query_map([delivery_id], |r| {
            Ok(EventRow {
                id: r.get(0)?,
                from_state: r.get(1)?,
                to_state: r.get(2)?,
                actor_kind: r.get(3)?,
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
#[derive(Debug, Clone, serde::Serialize)]
pub struct StatusView {
    /// Deliveries per state.
    pub deliveries: Vec<(String, i64)>,
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

/// Counts for the overview.
pub fn status(conn: &Connection) -> StoreResult<StatusView> {
    let deliveries = conn
        .prepare_cached("SELECT state, count(*) FROM deliveries GROUP BY state ORDER BY state")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let one = |sql: &str| -> StoreResult<i64> { Ok(conn.query_row(sql, [], |r| r.get(0))?) };
    Ok(StatusView {
        deliveries,
        messages: one("SELECT count(*) FROM messages")?,
        pending_fanout: one("SELECT count(*) FROM fanout_obligations WHERE done_at IS NULL")?,
        active_fences: one("SELECT count(*) FROM fences WHERE lifted_at IS NULL")?,
        hosts: one("SELECT count(*) FROM hosts WHERE retired_at IS NULL")?,
        attempts: one("SELECT count(*) FROM attempts")?,
        schema_version: one("PRAGMA user_version")?,
    })
}
