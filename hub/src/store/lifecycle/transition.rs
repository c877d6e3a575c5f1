//! The SPEC §2 transition table, and the one guarded update that every state change uses.
//!
//! Invariant: every change of `deliveries.state` goes through `apply`, which checks the pair
//! against `allowed`, guards the UPDATE on the expected state (and holder, when given), checks
//! the affected-row count, and appends the event in the same transaction; or through
//! `deliver`, the holder's handoff, which does the same for each step it passes in one UPDATE.

use crate::store::engine::Db;
use crate::store::engine::dialect;
use crate::store::engine::params;
use crate::store::lifecycle::pool_flight;
use crate::store::{Actor, ActorKind, StoreError, StoreResult};
use baton_shared::states::DeliveryState::{self, *};

/// Locks the rows of the deliveries `ids` names, in id order, before a job that shares the
/// record's write lock reads them (a start or report batch; `dialect::DELIVERIES_LOCK`, nothing
/// on SQLite, whose writer is alone). Another hub's job that changed one of them has committed
/// when the lock is granted, and the statements after it (each a fresh snapshot under READ
/// COMMITTED) see that change; one that comes later waits for this job. Sent unread: it rides
/// with the next statement, which runs once the locks are granted.
pub fn lock_rows(conn: &dyn Db, ids: &[&str]) -> StoreResult<()> {
    let (Some(many), Some(one)) = (dialect::DELIVERIES_LOCK.of(conn), dialect::DELIVERY_LOCK.of(conn)) else {
        return Ok(());
    };
    let mut plain: Vec<&str> = ids.iter().copied().filter(|id| dialect::listable(id)).collect();
    plain.sort_unstable();
    plain.dedup();
    if !plain.is_empty() {
        let list = serde_json::to_string(&plain).map_err(|e| StoreError::Invalid(format!("delivery ids: {e}")))?;
        conn.prepare_cached(many)?.execute_unread([list])?;
    }
    for id in ids.iter().filter(|id| !dialect::listable(id)) {
        conn.prepare_cached(one)?.execute_unread([*id])?;
    }
    Ok(())
}

/// Whether `actor` may move a delivery from `from` to `to`: the SPEC §2 table, and nothing else
/// but what turn control adds to it (the retries, `requeue_silent_after`, and held → failed by
/// the hub for an approval that timed out, `approval::expire`).
pub fn allowed(from: DeliveryState, to: DeliveryState, actor: ActorKind) -> bool {
    use ActorKind::*;
    matches!(
        (from, to, actor),
        (Queued, Claimed, Node)
            | (Queued, Held, Hub)
            | (Queued | Held, Failed, Hub)
            | (Held, Queued, Operator)
            | (Queued | Held | Claimed | Mirrored, Failed, Operator)
            | (Mirrored, Unknown, Operator)
            | (Claimed | Mirrored, Queued, Operator | Hub)
            | (Claimed, Mirrored, Node)
            | (Claimed | Mirrored, Failed, Node)
            | (Mirrored, Delivered, Node)
            | (Delivered, Queued, Hub)
            | (Delivered | Failed | Unknown, Queued, Operator)
    )
}

/// The holder a guarded transition expects (instance and claim token).
#[derive(Debug, Clone, Copy)]
pub struct Holder<'a> {
    /// The holding instance.
    pub instance_id: &'a str,
    /// The claim token.
    pub claim_token: &'a str,
}

/// One requested transition.
#[derive(Debug, Clone, Copy)]
pub struct Change<'a> {
    /// The delivery.
    pub delivery_id: &'a str,
    /// The state it must be in now.
    pub from: DeliveryState,
    /// The state it moves to.
    pub to: DeliveryState,
    /// The holder it must have now, when the caller is a node.
    pub expect_holder: Option<Holder<'a>>,
    /// The new holder, when moving into claimed.
    pub new_holder: Option<Holder<'a>>,
    /// Why, recorded on the delivery (for failed, unknown, held) and in the event.
    pub reason: Option<&'a str>,
}

/// Applies one transition: guarded UPDATE, row-count check, event row. Returns `InvalidTransition`
/// when the table forbids it, and `StaleClaim` when the delivery is not (any more) in `from` with
/// the expected holder.
pub fn apply(conn: &dyn Db, change: Change<'_>, actor: &Actor, now_ms: i64) -> StoreResult<()> {
    apply_as(conn, change, actor, now_ms, Mode::Checked)
}

/// As `apply`, for a claim's hand-out (queued → claimed): the host's waiting count
/// (`host_backlog`) is the caller's to move, once for all it hands out (`adjust_backlog`)
/// instead of once per delivery, and the guarded update is sent unread (on PostgreSQL with the
/// connection's next statement, at no round trip of its own). The caller checks every row it
/// moved at once before the claim commits (`check_handed_out`): under the claim's queue locks
/// nothing else moves them, so that check finding one unmoved fails the claim as a conflict.
pub fn apply_handed_out(conn: &dyn Db, change: Change<'_>, actor: &Actor, now_ms: i64) -> StoreResult<()> {
    apply_as(conn, change, actor, now_ms, Mode::HandedOut)
}

/// How `apply_as` writes a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `apply`: the row count checked at once, the host's waiting count moved.
    Checked,
    /// `apply_handed_out`: sent unread, checked by the caller; the waiting count is the caller's.
    HandedOut,
}

/// Checks that every `(delivery id, claim token)` of `handed` is claimed by `instance_id`, in one
/// statement (`dialect::HANDED_OUT`; an id PostgreSQL stores escaped checked alone): the check
/// `apply_handed_out` leaves to its caller. A delivery that is not fails the claim
/// (`StoreError::Conflict`: nothing of it commits, and the node claims again).
pub fn check_handed_out(conn: &dyn Db, instance_id: &str, handed: &[(&str, &str)]) -> StoreResult<()> {
    let (listed, alone): (Vec<_>, Vec<_>) =
        handed.iter().partition(|(id, token)| dialect::listable(id) && dialect::listable(token));
    let mut found: i64 = 0;
    if !listed.is_empty() {
        let list: Vec<[&str; 2]> = listed.iter().map(|(id, token)| [*id, *token]).collect();
        let list = serde_json::to_string(&list).map_err(|e| StoreError::Invalid(format!("delivery ids: {e}")))?;
        found += conn
            .prepare_cached(dialect::HANDED_OUT.of(conn))?
            .query_row(params![list, instance_id], |r| r.get::<_, i64>(0))?;
    }
    for (id, token) in &alone {
        found += conn
            .prepare_cached(
                "SELECT count(*) FROM deliveries
                 WHERE id = $1 AND claim_token = $2 AND state = 'claimed' AND instance_id = $3",
            )?
            .query_row(params![id, token, instance_id], |r| r.get::<_, i64>(0))?;
    }
    if found != handed.len() as i64 {
        return Err(StoreError::Conflict(format!(
            "{} of the {} deliveries this claim handed out to instance {instance_id} were moved meanwhile; \
             the claim is not kept",
            handed.len() as i64 - found,
            handed.len()
        )));
    }
    Ok(())
}

fn apply_as(conn: &dyn Db, change: Change<'_>, actor: &Actor, now_ms: i64, mode: Mode) -> StoreResult<()> {
    if !allowed(change.from, change.to, actor.kind) {
        return Err(StoreError::InvalidTransition(format!(
            "a {} may not move a delivery from {} to {}",
            actor.kind.as_str(),
            change.from,
            change.to
        )));
    }
    let keeps_holder = matches!(change.to, Claimed | Mirrored | Delivered);
    let (new_instance, new_token) = match (change.to, change.new_holder, change.expect_holder) {
        (Claimed, Some(h), _) => (Some(h.instance_id), Some(h.claim_token)),
        (Claimed, None, _) => {
            return Err(StoreError::InvalidTransition("a claim needs a holder".into()));
        }
        (_, _, Some(h)) if keeps_holder => (Some(h.instance_id), Some(h.claim_token)),
        _ if keeps_holder => return Err(StoreError::InvalidTransition("the holder must be named".into())),
        _ => (None, None),
    };
    let reason_kept = match change.to {
        Failed | Unknown | Held => change.reason,
        _ => None,
    };
    // A pool delivery's host: the claimant's once claimed, none while it waits in its pool
    // again (a requeue or retry returns it to the pool), unchanged otherwise (the host that ran
    // it stays named on its outcome).
    let rehost = matches!(change.to, Claimed | Queued | Held);
    let pool_host: Option<&str> = (change.to == Claimed).then_some(actor.name.as_str());
    // A claimed or mirrored run that leaves flight ends its pool conversation's flight.
    let flight_ends = matches!(change.from, Claimed | Mirrored) && !matches!(change.to, Claimed | Mirrored | Delivered);
    let flight = if flight_ends { pool_flight::of_delivery(conn, change.delivery_id)? } else { None };
    let rows = match change.expect_holder {
        Some(h) => conn
            .prepare_cached(
                "UPDATE deliveries SET state = $1, instance_id = $2, claim_token = $3, reason = $4,
                        updated_at = $5, host = CASE WHEN pool IS NOT NULL AND $10 THEN $11 ELSE host END
                 WHERE id = $6 AND state = $7 AND instance_id = $8 AND claim_token = $9",
            )?
            .execute(params![
                change.to.as_str(),
                new_instance,
                new_token,
                reason_kept,
                now_ms,
                change.delivery_id,
                change.from.as_str(),
                h.instance_id,
                h.claim_token,
                rehost,
                pool_host
            ])?,
        None => {
            let mut update = conn.prepare_cached(
                "UPDATE deliveries SET state = $1, instance_id = $2, claim_token = $3, reason = $4,
                        updated_at = $5, host = CASE WHEN pool IS NOT NULL AND $8 THEN $9 ELSE host END
                 WHERE id = $6 AND state = $7",
            )?;
            let values = params![
                change.to.as_str(),
                new_instance,
                new_token,
                reason_kept,
                now_ms,
                change.delivery_id,
                change.from.as_str(),
                rehost,
                pool_host
            ];
            if mode == Mode::Checked {
                update.execute(values)?
            } else {
                // A claim's hand-out: its caller checks the row moved (`check_handed_out`).
                update.execute_unread(values)?;
                1
            }
        }
    };
    if rows != 1 {
        return Err(StoreError::StaleClaim(format!(
            "delivery {} is not {} with the expected holder any more",
            change.delivery_id, change.from
        )));
    }
    if let Some((pool, conversation, host)) = flight {
        pool_flight::ended(conn, &pool, &conversation, &host, now_ms)?;
    }
    let (was_waiting, now_waiting) = (matches!(change.from, Queued | Held), matches!(change.to, Queued | Held));
    if mode == Mode::Checked && was_waiting != now_waiting {
        adjust_backlog_of(conn, change.delivery_id, if now_waiting { 1 } else { -1 })?;
    }
    record_event(
        conn,
        change.delivery_id,
        Some(change.from),
        change.to,
        actor,
        new_instance.or(change.expect_holder.map(|h| h.instance_id)),
        change.reason,
        now_ms,
    )
}

/// The holder's durable handoff in one write of the row: `from` (claimed or mirrored) →
/// delivered, guarded on the state and holder as `apply` guards it, with one event for each
/// transition of the table it passes (claimed → mirrored → delivered), and the node session
/// whose ack it is (`acked_session`, kept as it was when `None`); guarded on `host` too. The same record as `apply`
/// once per step, without writing the row (and its state's index entries) for the state in
/// between, which nothing outside the transaction sees. Nothing waits or flies differently
/// between these states, so no count moves. On PostgreSQL the update and its events are one
/// statement (`dialect::DELIVER_WITH_EVENTS`), one round trip.
#[allow(clippy::too_many_arguments)]
pub fn deliver(
    conn: &dyn Db,
    host: &str,
    delivery_id: &str,
    from: DeliveryState,
    holder: Holder<'_>,
    acked_session: Option<i64>,
    actor: &Actor,
    now_ms: i64,
) -> StoreResult<()> {
    let steps: &[(DeliveryState, DeliveryState)] = match from {
        Claimed => &[(Claimed, Mirrored), (Mirrored, Delivered)],
        Mirrored => &[(Mirrored, Delivered)],
        other => {
            return Err(StoreError::InvalidTransition(format!(
                "delivery {delivery_id} is {other}; it must be claimed or mirrored to become delivered"
            )));
        }
    };
    if let Some((a, b)) = steps.iter().find(|(a, b)| !allowed(*a, *b, actor.kind)) {
        return Err(StoreError::InvalidTransition(format!(
            "a {} may not move a delivery from {a} to {b}",
            actor.kind.as_str()
        )));
    }
    if let Some(sql) = dialect::DELIVER_WITH_EVENTS.of(conn) {
        // The update and its events in one round trip; the events written say it moved.
        let events = conn.prepare_cached(sql)?.execute(params![
            now_ms,
            acked_session,
            delivery_id,
            from.as_str(),
            holder.instance_id,
            holder.claim_token,
            host,
            actor.kind.as_str(),
            actor.name
        ])?;
        return match events {
            0 => Err(stale_deliver(delivery_id, from, host)),
            n if n == steps.len() => Ok(()),
            n => Err(StoreError::Corrupt(format!(
                "delivery {delivery_id}: its handoff from {from} wrote {n} events, not {}",
                steps.len()
            ))),
        };
    }
    let rows = conn
        .prepare_cached(
            "UPDATE deliveries SET state = 'delivered', reason = NULL, updated_at = $1,
                    acked_session = coalesce($2, acked_session)
             WHERE id = $3 AND state = $4 AND instance_id = $5 AND claim_token = $6 AND host = $7",
        )?
        .execute(params![
            now_ms,
            acked_session,
            delivery_id,
            from.as_str(),
            holder.instance_id,
            holder.claim_token,
            host
        ])?;
    if rows != 1 {
        return Err(stale_deliver(delivery_id, from, host));
    }
    for (a, b) in steps {
        record_event(conn, delivery_id, Some(*a), *b, actor, Some(holder.instance_id), None, now_ms)?;
    }
    Ok(())
}

/// `deliver` for many deliveries of one holder instance at once, each from `from` (claimed or
/// mirrored), in one statement where the backend has one (`dialect::DELIVER_MANY_WITH_EVENTS`;
/// `handed` the `(delivery id, claim token)` pairs, each delivery once): returns the ids it
/// moved, each recorded as `deliver` records it. A delivery it did not move is the caller's to
/// step alone, as is one whose id or token PostgreSQL stores escaped (left out here); on SQLite,
/// where a statement costs no round trip, it moves none.
#[allow(clippy::too_many_arguments)]
pub fn deliver_many(
    conn: &dyn Db,
    host: &str,
    handed: &[(&str, &str)],
    from: DeliveryState,
    instance_id: &str,
    acked_session: Option<i64>,
    actor: &Actor,
    now_ms: i64,
) -> StoreResult<std::collections::HashSet<String>> {
    let mut moved = std::collections::HashSet::new();
    let Some(sql) = dialect::DELIVER_MANY_WITH_EVENTS.of(conn) else { return Ok(moved) };
    let steps: &[(DeliveryState, DeliveryState)] = match from {
        Claimed => &[(Claimed, Mirrored), (Mirrored, Delivered)],
        Mirrored => &[(Mirrored, Delivered)],
        _ => return Ok(moved),
    };
    if steps.iter().any(|(a, b)| !allowed(*a, *b, actor.kind)) {
        return Ok(moved);
    }
    let listed: Vec<[&str; 2]> = handed
        .iter()
        .filter(|(id, token)| dialect::listable(id) && dialect::listable(token))
        .map(|(id, token)| [*id, *token])
        .collect();
    if listed.is_empty() {
        return Ok(moved);
    }
    let list = serde_json::to_string(&listed).map_err(|e| StoreError::Invalid(format!("delivery ids: {e}")))?;
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(
        params![now_ms, acked_session, list, from.as_str(), instance_id, host, actor.kind.as_str(), actor.name],
        |r| r.get::<_, String>(0),
    )?;
    for id in rows {
        moved.insert(id?);
    }
    Ok(moved)
}

/// `deliver`'s refusal when its guard did not hold (its caller reads the row to say why).
fn stale_deliver(delivery_id: &str, from: DeliveryState, host: &str) -> StoreError {
    StoreError::StaleClaim(format!(
        "delivery {delivery_id} is not {from} on host {host} with the expected holder any more"
    ))
}

/// Moves the waiting count of a delivery's host by `delta` (host deliveries only: a pool's
/// waiting deliveries count in its pool's queue).
fn adjust_backlog_of(conn: &dyn Db, delivery_id: &str, delta: i64) -> StoreResult<()> {
    conn.prepare_cached(dialect::BACKLOG_OF_DELIVERY.of(conn))?.execute_unread(params![delivery_id, delta])?;
    Ok(())
}

/// Adds `delta` to the waiting count of `host`.
pub fn adjust_backlog(conn: &dyn Db, host: &str, delta: i64) -> StoreResult<()> {
    conn.prepare_cached(dialect::BACKLOG_OF_HOST.of(conn))?.execute_unread(params![host, delta])?;
    Ok(())
}

/// Appends one row to the delivery event log.
#[allow(clippy::too_many_arguments)]
pub fn record_event(
    conn: &dyn Db,
    delivery_id: &str,
    from: Option<DeliveryState>,
    to: DeliveryState,
    actor: &Actor,
    instance_id: Option<&str>,
    reason: Option<&str>,
    now_ms: i64,
) -> StoreResult<()> {
    conn.prepare_cached(
        "INSERT INTO delivery_events (delivery_id, from_state, to_state, actor_kind, actor, instance_id, reason, at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )?
    .execute_unread(params![
        delivery_id,
        from.map(|s| s.as_str()),
        to.as_str(),
        actor.kind.as_str(),
        actor.name,
        instance_id,
        reason,
        now_ms
    ])?;
    Ok(())
}

/// Reads a delivery's current state (`None`: no such delivery; a state that does not parse is
/// `StoreError::Corrupt`).
pub fn state_of(conn: &dyn Db, delivery_id: &str) -> StoreResult<Option<DeliveryState>> {
    use crate::store::engine::OptionalExtension;
    Ok(conn
        .prepare_cached("SELECT state FROM deliveries WHERE id = $1")?
        .query_row([delivery_id], |r| crate::store::state_column(r, 0, "deliveries", delivery_id))
        .optional()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;
    use crate::store::{lifecycle::accept, new_token};
    use baton_shared::states::DeliveryState;

    /// Puts a fresh delivery into `state` directly (bypassing the table, as a fixture).
    fn delivery_in(conn: &dyn Db, state: DeliveryState, n: usize) -> (String, String, String) {
        let msg = accept::testing::accept_one(conn, "conv", &format!("k{n}"), &["host-a"]);
        let id: String =
            conn.query_row("SELECT id FROM deliveries WHERE message_id = $1", [&msg], |r| r.get(0)).unwrap();
        let (inst, tok) = ("inst-1".to_string(), new_token());
        let holder = matches!(state, Claimed | Mirrored | Delivered);
        conn.execute(
            "UPDATE deliveries SET state = $1, instance_id = $2, claim_token = $3 WHERE id = $4",
            params![state.as_str(), holder.then_some(&inst), holder.then_some(&tok), id],
        )
        .unwrap();
        if !matches!(state, Queued | Held) {
            adjust_backlog(conn, "host-a", -1).unwrap();
        }
        (id, inst, tok)
    }

    #[test]
    fn walks_the_whole_table_including_every_forbidden_pair() {
        let db = testing::db();
        let kinds = [ActorKind::Hub, ActorKind::Node, ActorKind::Operator];
        let mut n = 0;
        let mut allowed_count = 0;
        for from in DeliveryState::ALL {
            for to in DeliveryState::ALL {
                for kind in kinds {
                    n += 1;
                    let (id, inst, tok) = delivery_in(&db.conn, from, n);
                    let actor = Actor { kind, name: "x".into() };
                    let holder = Holder { instance_id: &inst, claim_token: &tok };
                    let has_holder = matches!(from, Claimed | Mirrored | Delivered);
                    let change = Change {
                        delivery_id: &id,
                        from,
                        to,
                        expect_holder: has_holder.then_some(holder),
                        new_holder: (to == Claimed).then_some(holder),
                        reason: Some("test"),
                    };
                    let r = apply(&db.conn, change, &actor, 1);
                    let after = state_of(&db.conn, &id).unwrap().unwrap();
                    if allowed(from, to, kind) {
                        allowed_count += 1;
                        assert!(r.is_ok(), "{from}->{to} by {kind:?} should work: {r:?}");
                        assert_eq!(after, to);
                        let events: i64 = db
                            .conn
                            .query_row("SELECT count(*) FROM delivery_events WHERE delivery_id = $1 AND from_state IS NOT NULL", [&id], |r| r.get(0))
                            .unwrap();
                        assert_eq!(events, 1, "one event per transition");
                    } else {
                        assert!(matches!(r, Err(StoreError::InvalidTransition(_))), "{from}->{to} by {kind:?}: {r:?}");
                        assert_eq!(after, from, "a refused transition changes nothing");
                    }
                }
            }
        }
        // The SPEC table has 19 (from, to, actor) rows once the "or" cells are spelled out: 15,
        // and the retry (delivered → queued by the hub) and the operator's retry and redrive
        // (delivered, failed or unknown → queued); and 2 for `requeue_silent_after` (claimed,
        // mirrored → queued by the hub); and 1 for an approval that timed out (held → failed by
        // the hub).
        assert_eq!(allowed_count, 22);
    }

    #[test]
    fn guard_refuses_wrong_state_or_holder() {
        let db = testing::db();
        let (id, inst, tok) = delivery_in(&db.conn, Claimed, 1);
        let node = Actor::node("host-a");
        let wrong = Holder { instance_id: "other", claim_token: &tok };
        let change = |h| Change {
            delivery_id: &id,
            from: Claimed,
            to: Mirrored,
            expect_holder: Some(h),
            new_holder: None,
            reason: None,
        };
        assert!(matches!(apply(&db.conn, change(wrong), &node, 1), Err(StoreError::StaleClaim(_))));
        let wrong_tok = Holder { instance_id: &inst, claim_token: "nope" };
        assert!(matches!(apply(&db.conn, change(wrong_tok), &node, 1), Err(StoreError::StaleClaim(_))));
        let right = Holder { instance_id: &inst, claim_token: &tok };
        apply(&db.conn, change(right), &node, 1).unwrap();
        // Now it is mirrored: the same change again no longer matches the guard.
        assert!(matches!(apply(&db.conn, change(right), &node, 1), Err(StoreError::StaleClaim(_))));
    }

    /// A claim's hand-outs are checked together before it commits: all still claimed with their
    /// tokens by the instance passes; one moved meanwhile (or another token, or another
    /// instance) fails the claim as a conflict naming how many.
    #[test]
    fn a_claim_checks_every_delivery_it_handed_out() {
        let db = testing::db();
        let c = &*db.conn;
        for n in 0..3 {
            accept::testing::accept_one(c, &format!("conv{n}"), &format!("k{n}"), &["host-a"]);
        }
        let got = crate::store::lifecycle::claim::claim(c, "host-a", "i", 10, 1).unwrap();
        assert_eq!(got.len(), 3);
        let handed: Vec<(&str, &str)> = got.iter().map(|d| (d.delivery_id.as_str(), d.claim_token.as_str())).collect();
        check_handed_out(c, "i", &handed).unwrap();
        let conflict = |r: StoreResult<()>| matches!(&r, Err(StoreError::Conflict(m)) if m.contains("1 of the 3"));
        let other = check_handed_out(c, "other", &handed);
        assert!(matches!(&other, Err(StoreError::Conflict(m)) if m.contains("3 of the 3")), "{other:?}");
        let mut wrong = handed.clone();
        wrong[1].1 = "0000";
        assert!(conflict(check_handed_out(c, "i", &wrong)), "another token");
        let escaped = format!("{}\0", handed[2].0);
        let mut alone = handed.clone();
        alone[2].0 = &escaped;
        assert!(conflict(check_handed_out(c, "i", &alone)), "an id checked alone, and not found");
        c.execute(
            "UPDATE deliveries SET state = 'queued', instance_id = NULL, claim_token = NULL WHERE id = $1",
            [handed[0].0],
        )
        .unwrap();
        assert!(conflict(check_handed_out(c, "i", &handed)), "moved meanwhile");
    }
}
