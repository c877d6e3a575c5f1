//! What operators change through the CLI: hosts and certificates, fences, the held queue,
//! cancel, retire and requeue. Each change carries who made it and why.

use super::claim::{FenceKind, FenceScope};
use super::transition::{self, Change};
use super::{Actor, StoreError, StoreResult};
use baton_shared::states::DeliveryState::{self, *};
use rusqlite::{Connection, OptionalExtension, named_params};

/// Records an operator action that is not a delivery transition.
pub fn record_operator_event(
    conn: &Connection,
    action: &str,
    subject: &str,
    operator: &str,
    reason: Option<&str>,
    now_ms: i64,
) -> StoreResult<()> {
    conn.prepare_cached(
        "INSERT INTO operator_events (action, subject, operator, reason, at) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(rusqlite::params![action, subject, operator, reason, now_ms])?;
    Ok(())
}

/// Adds a host (idempotent); enrolling a node does this.
pub fn add_host(conn: &Connection, host: &str, now_ms: i64) -> StoreResult<()> {
    conn.prepare_cached("INSERT INTO hosts (name, enrolled_at) VALUES (?1, ?2) ON CONFLICT (name) DO NOTHING")?
        .execute(rusqlite::params![host, now_ms])?;
    Ok(())
}

/// Records an issued certificate.
pub fn record_certificate(
    conn: &Connection,
    serial: &str,
    role: &str,
    name: &str,
    not_after_unix: i64,
    now_ms: i64,
) -> StoreResult<()> {
    conn.prepare_cached(
        "INSERT INTO certificates (serial, role, name, issued_at, not_after) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(rusqlite::params![serial, role, name, now_ms, not_after_unix])?;
    Ok(())
}

/// What the store says about a certificate serial: its role, name, and whether it is revoked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertStatus {
    /// node or producer.
    pub role: String,
    /// The host or producer name.
    pub name: String,
    /// Set when revoked.
    pub revoked: bool,
}

/// Looks a certificate up by serial.
pub fn cert_status(conn: &Connection, serial: &str) -> StoreResult<Option<CertStatus>> {
    Ok(conn
        .prepare_cached("SELECT role, name, revoked_at IS NOT NULL FROM certificates WHERE serial = ?1")?
        .query_row([serial], |r| Ok(CertStatus { role: r.get(0)?, name: r.get(1)?, revoked: r.get(2)? }))
        .optional()?)
}

/// Revokes every unrevoked certificate of `name` (any role), or one serial. Returns the serials.
pub fn revoke(
    conn: &Connection,
    name_or_serial: &str,
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<String>> {
    let serials: Vec<String> = conn
        .prepare_cached("SELECT serial FROM certificates WHERE (name = ?1 OR serial = ?1) AND revoked_at IS NULL")?
        .query_map([name_or_serial], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if serials.is_empty() {
        return Err(StoreError::NotFound(format!("no unrevoked certificate for {name_or_serial:?}")));
    }
    for s in &serials {
        conn.prepare_cached(
            "UPDATE certificates SET revoked_at = ?2, revoked_by = ?3, revoked_reason = ?4 WHERE serial = ?1",
        )?
        .execute(rusqlite::params![s, now_ms, operator, reason])?;
        record_operator_event(conn, "revoke", s, operator, Some(reason), now_ms)?;
    }
    Ok(serials)
}

/// Sets a fence. `target` is the conversation or host (None for all). Returns its id.
///
/// The fence records the last delivery event committed before it (and its lift the same), which
/// places it exactly in the record's commit order: a claim event with a higher id committed
/// after the fence. Checkers use this to prove no claim slipped past an active fence.
pub fn fence_set(
    conn: &Connection,
    kind: FenceKind,
    scope: FenceScope,
    target: Option<&str>,
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<i64> {
    if (scope == FenceScope::All) != target.is_none() {
        return Err(StoreError::Invalid("a fence names a conversation or a host, or covers all".into()));
    }
    conn.prepare_cached(
        "INSERT INTO fences (kind, scope, target, set_by, set_at, set_after_event, reason)
         VALUES (?1, ?2, ?3, ?4, ?5, (SELECT coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = 'delivery_events'), ?6)",
    )?
    .execute(rusqlite::params![kind.as_str(), scope.as_str(), target, operator, now_ms, reason])?;
    let id = conn.last_insert_rowid();
    record_operator_event(
        conn,
        &format!("fence_{}", kind.as_str()),
        &format!("fence {id}"),
        operator,
        Some(reason),
        now_ms,
    )?;
    Ok(id)
}

/// Lifts an active fence.
pub fn fence_lift(conn: &Connection, id: i64, operator: &str, reason: &str, now_ms: i64) -> StoreResult<()> {
    let n = conn
        .prepare_cached(
            "UPDATE fences SET lifted_at = ?2, lifted_by = ?3, lifted_reason = ?4,
                    lifted_after_event = (SELECT coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = 'delivery_events')
             WHERE id = ?1 AND lifted_at IS NULL",
        )?
        .execute(rusqlite::params![id, now_ms, operator, reason])?;
    if n != 1 {
        return Err(StoreError::NotFound(format!("no active fence {id}")));
    }
    record_operator_event(conn, "fence_lift", &format!("fence {id}"), operator, Some(reason), now_ms)
}

/// A fence as listed for operators, active or lifted.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FenceRow {
    /// Its id.
    pub id: i64,
    /// pause, hold or block.
    pub kind: String,
    /// conversation, host or all.
    pub scope: String,
    /// The conversation or host.
    pub target: Option<String>,
    /// Who set it.
    pub set_by: String,
    /// When (unix ms).
    pub set_at_ms: i64,
    /// Why.
    pub reason: String,
    /// When it was lifted, if it was.
    pub lifted_at_ms: Option<i64>,
    /// Who lifted it.
    pub lifted_by: Option<String>,
}

/// Lists fences, newest first; only active ones unless `all`.
pub fn fence_list(conn: &Connection, all: bool) -> StoreResult<Vec<FenceRow>> {
    let rows = conn
        .prepare_cached(
            "SELECT id, kind, scope, target, set_by, set_at, reason, lifted_at, lifted_by FROM fences
             WHERE ?1 OR lifted_at IS NULL ORDER BY id DESC",
        )?
        .query_map([all], |r| {
            Ok(FenceRow {
                id: r.get(0)?,
                kind: r.get(1)?,
                scope: r.get(2)?,
                target: r.get(3)?,
                set_by: r.get(4)?,
                set_at_ms: r.get(5)?,
                reason: r.get(6)?,
                lifted_at_ms: r.get(7)?,
                lifted_by: r.get(8)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

fn ids_where(conn: &Connection, sql: &str, arg: &str) -> StoreResult<Vec<(String, DeliveryState)>> {
    let rows = conn
        .prepare_cached(sql)?
        .query_map([arg], |r| {
            let s: String = r.get(1)?;
            Ok((r.get(0)?, DeliveryState::parse(&s).unwrap_or(Unknown)))
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// Releases held deliveries back to queued: one by id, or all of a conversation. Returns the ids.
pub fn release(
    conn: &Connection,
    which: Selector<'_>,
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<String>> {
    let rows = match which {
        Selector::Delivery(id) => ids_where(conn, "SELECT id, state FROM deliveries WHERE id = ?1", id)?,
        Selector::Conversation(c) => ids_where(
            conn,
            "SELECT id, state FROM deliveries WHERE conversation = ?1 AND state = 'held' ORDER BY n",
            c,
        )?,
    };
    if let Selector::Delivery(id) = which {
        match rows.first() {
            None => return Err(StoreError::NotFound(format!("no delivery {id}"))),
            Some((_, s)) if *s != Held => {
                return Err(StoreError::InvalidTransition(format!("delivery {id} is {s}, not held")));
            }
            _ => {}
        }
    }
    let actor = Actor::operator(operator);
    let why = format!("released: {reason}");
    for (id, _) in &rows {
        let change = Change {
            delivery_id: id,
            from: Held,
            to: Queued,
            expect_holder: None,
            new_holder: None,
            reason: Some(&why),
        };
        transition::apply(conn, change, &actor, now_ms)?;
    }
    Ok(rows.into_iter().map(|(id, _)| id).collect())
}

/// Picks deliveries for an operator command.
#[derive(Debug, Clone, Copy)]
pub enum Selector<'a> {
    /// One delivery by id.
    Delivery(&'a str),
    /// Every matching delivery of a conversation.
    Conversation(&'a str),
}

/// Cancels one delivery that has not been delivered: queued, held, claimed or mirrored → failed.
pub fn cancel(
    conn: &Connection,
    delivery_id: &str,
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<DeliveryState> {
    let state = transition::state_of(conn, delivery_id)?
        .ok_or_else(|| StoreError::NotFound(format!("no delivery {delivery_id}")))?;
    if !matches!(state, Queued | Held | Claimed | Mirrored) {
        return Err(StoreError::InvalidTransition(format!(
            "delivery {delivery_id} is {state}; only queued, held, claimed or mirrored deliveries can be cancelled"
        )));
    }
    let why = format!("cancelled by operator {operator}: {reason}");
    let change =
        Change { delivery_id, from: state, to: Failed, expect_holder: None, new_holder: None, reason: Some(&why) };
    transition::apply(conn, change, &Actor::operator(operator), now_ms)?;
    Ok(Failed)
}

/// Records an `unknown` attempt, written by the hub for an operator, so a delivered delivery
/// whose node is gone does not stall silently.
fn unknown_attempt(conn: &Connection, delivery_id: &str, why: &str, now_ms: i64) -> StoreResult<()> {
    let row: Option<(String, String)> = conn
        .prepare_cached(
            "SELECT host, instance_id FROM deliveries d WHERE id = ?1 AND state = 'delivered'
               AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id)",
        )?
        .query_row([delivery_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    if let Some((host, instance)) = row {
        conn.prepare_cached(
            "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, reason, reported_at)
             VALUES (:id, :d, :h, :i, :r, '', 'unknown', :why, :now)",
        )?
        .execute(named_params! {
            ":id": super::new_id(), ":d": delivery_id, ":h": host, ":i": instance,
            ":r": format!("hub:{delivery_id}"), ":why": why, ":now": now_ms,
        })?;
    }
    Ok(())
}

/// What retire or requeue did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Swept {
    /// Deliveries moved to failed.
    pub failed: Vec<String>,
    /// Deliveries moved to unknown.
    pub unknown: Vec<String>,
    /// Deliveries moved back to queued.
    pub requeued: Vec<String>,
    /// Delivered deliveries given an `unknown` attempt because no outcome can come.
    pub outcome_unknown: Vec<String>,
}

/// Retires a host: it takes no more work; its waiting and claimed deliveries fail, its mirrored
/// ones become unknown, and delivered ones without an outcome get an `unknown` attempt.
pub fn retire(conn: &Connection, host: &str, operator: &str, reason: &str, now_ms: i64) -> StoreResult<Swept> {
    let n = conn
        .prepare_cached(
            "UPDATE hosts SET retired_at = ?2, retired_by = ?3, retired_reason = ?4, instance_id = NULL
             WHERE name = ?1 AND retired_at IS NULL",
        )?
        .execute(rusqlite::params![host, now_ms, operator, reason])?;
    if n != 1 {
        return Err(StoreError::NotFound(format!("no enrolled, unretired host {host}")));
    }
    record_operator_event(conn, "retire", host, operator, Some(reason), now_ms)?;
    let rows = ids_where(
        conn,
        "SELECT id, state FROM deliveries WHERE host = ?1 AND state IN ('queued', 'held', 'claimed', 'mirrored', 'delivered') ORDER BY n",
        host,
    )?;
    let actor = Actor::operator(operator);
    let why = format!("host retired by operator {operator}: {reason}");
    let mut swept = Swept::default();
    for (id, state) in rows {
        match state {
            Delivered => {
                unknown_attempt(conn, &id, &why, now_ms)?;
                swept.outcome_unknown.push(id);
            }
            _ => {
                let to = if state == Mirrored { Unknown } else { Failed };
                let change = Change {
                    delivery_id: &id,
                    from: state,
                    to,
                    expect_holder: None,
                    new_holder: None,
                    reason: Some(&why),
                };
                transition::apply(conn, change, &actor, now_ms)?;
                if to == Unknown { swept.unknown.push(id) } else { swept.failed.push(id) }
            }
        }
    }
    Ok(swept)
}

/// Requeues what a node instance that is gone for good holds: claimed and mirrored go back to
/// queued (nothing ran: the execution gate), and delivered ones without an outcome get an
/// `unknown` attempt (they may have run). The host is unbound from that instance.
pub fn requeue_instance(
    conn: &Connection,
    instance_id: &str,
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Swept> {
    let rows = ids_where(
        conn,
        "SELECT id, state FROM deliveries WHERE instance_id = ?1 AND state IN ('claimed', 'mirrored', 'delivered') ORDER BY n",
        instance_id,
    )?;
    let actor = Actor::operator(operator);
    let why = format!("requeued by operator {operator}: {reason}");
    let mut swept = Swept::default();
    for (id, state) in rows {
        if state == Delivered {
            unknown_attempt(conn, &id, &format!("instance {instance_id} gone; {why}"), now_ms)?;
            swept.outcome_unknown.push(id);
        } else {
            let change = Change {
                delivery_id: &id,
                from: state,
                to: Queued,
                expect_holder: None,
                new_holder: None,
                reason: Some(&why),
            };
            transition::apply(conn, change, &actor, now_ms)?;
            swept.requeued.push(id);
        }
    }
    swept.outcome_unknown.retain(|id| !id.is_empty());
    conn.prepare_cached("UPDATE hosts SET instance_id = NULL WHERE instance_id = ?1")?.execute([instance_id])?;
    record_operator_event(conn, "requeue_instance", instance_id, operator, Some(reason), now_ms)?;
    Ok(swept)
}
