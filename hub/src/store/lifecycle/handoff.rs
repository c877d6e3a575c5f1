//! What the holder of a claimed delivery does with it (SPEC §2, §4, §6): reads its holdings,
//! then `mirrored`, `ack` (or both at once, the `handoff`) or `reject`, each guarded by the
//! claim's instance and token and repeated as a no-op.
//!
//! Invariant (steps at once): on PostgreSQL a job of holders' steps (mirrored, ack, handoff;
//! not a reject, which settles) takes the record's write lock in shared mode with claims
//! (`Store::holder_step`, `Store::holder_steps`: `Writer::call_shared`), so the handoffs of
//! several hubs run at once. It writes nothing but the rows of the deliveries it names, each
//! guarded on its state and holder (row locks keep two steps on one delivery apart, and the
//! second is answered as a repeat or a refusal), and their events; it moves no count, flight or
//! queue, and reads the node's session, which only an exclusive writer changes. Its events may
//! commit out of position order, so the feeds' horizon leaves them out
//! (`engine::dialect::FEED_HORIZON`).

use crate::store::Store;
use crate::store::engine::{Db, OptionalExtension, params};
use crate::store::lifecycle::transition::{self, Change, Holder};
use crate::store::registry::sessions::{self, NodeAt};
use crate::store::writer::SharedJob;
use crate::store::{Actor, StoreError, StoreResult, bound_ms_column, json_column, parse_column_opt, state_column};
use baton_shared::states::DeliveryState::{self, *};
use baton_shared::states::Rerun;
use baton_shared::wire::{ClaimedDelivery, TransitionResponse};

/// A holder's step on one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// claimed → mirrored.
    Mirrored,
    /// mirrored → delivered.
    Ack,
    /// Both, in one transaction: claimed → mirrored → delivered (from `mirrored`, the ack
    /// alone). The node's local copy is committed before it asks, as for `mirrored`.
    Handoff,
}

/// The holder a node's step names: its instance and the claim token.
#[derive(Debug, Clone)]
pub struct HolderOf {
    /// The holding instance.
    pub instance_id: String,
    /// The claim token.
    pub claim_token: String,
}

impl HolderOf {
    fn as_holder(&self) -> Holder<'_> {
        Holder { instance_id: &self.instance_id, claim_token: &self.claim_token }
    }
}

/// A holder's step, applied on `conn`.
pub(super) fn apply_step(
    conn: &dyn Db,
    step: Step,
    node: &NodeAt,
    id: &str,
    h: Holder<'_>,
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    let host = node.host.as_str();
    // The session whose ack makes the run `delivered` is written with it: a newer session is
    // not granted its start while this one's start lease lasts (`turns::start`).
    let session = node.session.map(|s| s as i64);
    match step {
        Step::Mirrored => mirrored(conn, host, id, h, now_ms),
        Step::Ack => deliver(conn, host, id, h, session, Mirrored, now_ms),
        Step::Handoff => deliver(conn, host, id, h, session, Claimed, now_ms),
    }
}

/// Holders' steps of a batch (`Store::holder_steps`: one instance's acks or handoffs) moved at
/// once where the backend can (`transition::deliver_many`): the ids moved, each to be answered
/// `changed`, as `apply_step` would have answered it. The rest are `apply_step`'s, in turn:
/// every `mirrored` step, a delivery the batch names more than once, one not moved.
pub(super) fn deliver_many(
    conn: &dyn Db,
    step: Step,
    node: &NodeAt,
    instance_id: &str,
    items: &[baton_shared::wire::HolderItem],
    now_ms: i64,
) -> StoreResult<std::collections::HashSet<String>> {
    let from = match step {
        Step::Mirrored => return Ok(Default::default()),
        Step::Ack => Mirrored,
        Step::Handoff => Claimed,
    };
    let mut named: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for item in items {
        *named.entry(item.delivery_id.as_str()).or_default() += 1;
    }
    let once: Vec<(&str, &str)> = items
        .iter()
        .filter(|i| named[i.delivery_id.as_str()] == 1)
        .map(|i| (i.delivery_id.as_str(), i.claim_token.as_str()))
        .collect();
    let session = node.session.map(|s| s as i64);
    transition::deliver_many(conn, &node.host, &once, from, instance_id, session, &Actor::node(&node.host), now_ms)
}

impl Store {
    /// One page of what the instance holds (claimed, mirrored, delivered without an outcome):
    /// at most `limit` after queue position `after_n`, and where the next page starts.
    pub async fn holdings(
        &self,
        node: NodeAt,
        instance_id: String,
        after_n: i64,
        limit: u32,
    ) -> StoreResult<(Vec<ClaimedDelivery>, Option<i64>)> {
        self.conns
            .read(move |c| {
                sessions::check(c, &node.host, node.session)?;
                holdings_page(c, &node.host, &instance_id, after_n, limit)
            })
            .await
    }

    /// The holder recorded its local copy: claimed → mirrored. Repeating it changes nothing.
    pub async fn mirrored(
        &self,
        node: NodeAt,
        delivery_id: String,
        holder: HolderOf,
    ) -> StoreResult<TransitionResponse> {
        self.holder_step(Step::Mirrored, node, delivery_id, holder).await
    }

    /// The holder acked the durable handoff: mirrored → delivered. Repeating it changes nothing.
    pub async fn ack(&self, node: NodeAt, delivery_id: String, holder: HolderOf) -> StoreResult<TransitionResponse> {
        self.holder_step(Step::Ack, node, delivery_id, holder).await
    }

    /// A holder's `step` on one delivery, after the session check.
    pub async fn holder_step(
        &self,
        step: Step,
        node: NodeAt,
        delivery_id: String,
        holder: HolderOf,
    ) -> StoreResult<TransitionResponse> {
        let clock = self.clock.clone();
        self.conns
            .write_shared(Some(SharedJob::HolderSteps), move |c| {
                sessions::check(c, &node.host, node.session)?;
                let h = holder.as_holder();
                apply_step(c, step, &node, &delivery_id, h, clock.now_ms())
            })
            .await
    }

    /// The holder refuses the delivery: claimed or mirrored → failed, with its reason.
    pub async fn reject(
        &self,
        node: NodeAt,
        delivery_id: String,
        holder: HolderOf,
        reason: String,
    ) -> StoreResult<TransitionResponse> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                sessions::check(c, &node.host, node.session)?;
                let h = holder.as_holder();
                reject(c, &node.host, &delivery_id, h, &reason, clock.now_ms())
            })
            .await
    }
}

/// What `instance_id` holds on `host`: claimed, mirrored, or delivered without an outcome of the
/// current run; each with its run and whether a cancel was asked for. Every holding, unpaged:
/// for the store's own checks; the node reads them through `holdings_page`.
pub fn holdings(conn: &dyn Db, host: &str, instance_id: &str) -> StoreResult<Vec<ClaimedDelivery>> {
    Ok(holdings_page(conn, host, instance_id, 0, u32::MAX)?.0)
}

/// One page of `holdings`: at most `limit` deliveries whose queue position (`deliveries.n`) is
/// after `after_n`, oldest first, and the position the next page starts after while more may
/// follow. The cursor is a position in the queue order, which never changes for a delivery, so
/// a holding that stays held is on exactly one page however the others move meanwhile.
pub fn holdings_page(
    conn: &dyn Db,
    host: &str,
    instance_id: &str,
    after_n: i64,
    limit: u32,
) -> StoreResult<(Vec<ClaimedDelivery>, Option<i64>)> {
    let mut rows: Vec<(i64, ClaimedDelivery)> = conn
        .prepare_cached(
            "SELECT d.id, d.message_id, d.conversation, d.seq, m.payload, d.claim_token, d.state, m.producer,
                    d.attempt, m.max_attempts, d.rerun, d.cancel_requested_at IS NOT NULL, d.n, m.deadline_ms,
                    m.stall_ms, m.traceparent
             FROM deliveries d JOIN messages m ON m.id = d.message_id
             WHERE d.instance_id = $1 AND d.host = $2 AND d.n > $3
               AND (d.state IN ('claimed', 'mirrored')
                    OR (d.state = 'delivered' AND NOT EXISTS (
                        SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)))
             ORDER BY d.n LIMIT $4",
        )?
        .query_map(params![instance_id, host, after_n, i64::from(limit).saturating_add(1)], |r| {
            let delivery_id: String = r.get(0)?;
            let message_id: String = r.get(1)?;
            let n: i64 = r.get(12)?;
            let (deadline_ms, stall_ms) =
                (bound_ms_column(r, 13, "messages", &message_id)?, bound_ms_column(r, 14, "messages", &message_id)?);
            Ok((
                n,
                ClaimedDelivery {
                    payload: json_column(r, 4, "messages", &message_id)?,
                    state: state_column(r, 6, "deliveries", &delivery_id)?,
                    message_id,
                    conversation: r.get(2)?,
                    seq: r.get(3)?,
                    claim_token: r.get(5)?,
                    producer: Some(r.get(7)?),
                    attempt: r.get(8)?,
                    max_attempts: r.get(9)?,
                    rerun: parse_column_opt(r, 10, "deliveries", &delivery_id, "rerun", Rerun::parse)?,
                    cancel_requested: r.get(11)?,
                    deadline_ms,
                    stall_ms,
                    traceparent: r.get(15)?,
                    delivery_id,
                },
            ))
        })?
        .collect::<Result<_, _>>()?;
    // One row past the page says whether another page follows, without a count.
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next = if more { rows.last().map(|(n, _)| *n) } else { None };
    Ok((rows.into_iter().map(|(_, d)| d).collect(), next))
}

/// A delivery's host, state and holder, for the holder checks.
struct HeldRow {
    host: String,
    state: DeliveryState,
    instance_id: Option<String>,
    claim_token: Option<String>,
}

fn load(conn: &dyn Db, delivery_id: &str, host: &str) -> StoreResult<HeldRow> {
    let row = conn
        .prepare_cached("SELECT host, state, instance_id, claim_token FROM deliveries WHERE id = $1")?
        .query_row([delivery_id], |r| {
            Ok(HeldRow {
                host: r.get(0)?,
                state: state_column(r, 1, "deliveries", delivery_id)?,
                instance_id: r.get(2)?,
                claim_token: r.get(3)?,
            })
        })
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("no delivery {delivery_id}")))?;
    if row.host != host {
        return Err(StoreError::NotYours(format!("delivery {delivery_id} is not for host {host}")));
    }
    Ok(row)
}

fn check_holder(row: &HeldRow, delivery_id: &str, holder: Holder<'_>) -> StoreResult<()> {
    if row.instance_id.as_deref() == Some(holder.instance_id) && row.claim_token.as_deref() == Some(holder.claim_token)
    {
        return Ok(());
    }
    Err(StoreError::StaleClaim(format!(
        "delivery {delivery_id} is {} and not held by instance {} with that claim token",
        row.state, holder.instance_id
    )))
}

/// The holder recorded its local copy: claimed → mirrored. Repeating it changes nothing.
pub fn mirrored(
    conn: &dyn Db,
    host: &str,
    delivery_id: &str,
    holder: Holder<'_>,
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    let row = load(conn, delivery_id, host)?;
    check_holder(&row, delivery_id, holder)?;
    match holder_step(conn, host, delivery_id, holder, row.state, Claimed, Mirrored, &[Mirrored, Delivered], now_ms) {
        // Moved between the read and the write by a transaction sharing the record's lock (the
        // same holder's step through another hub): answered from the row as it is now, as if
        // this one had come after it.
        Err(StoreError::StaleClaim(_)) => {
            let row = load(conn, delivery_id, host)?;
            check_holder(&row, delivery_id, holder)?;
            holder_step(conn, host, delivery_id, holder, row.state, Claimed, Mirrored, &[Mirrored, Delivered], now_ms)
        }
        done => done,
    }
}

/// The holder acked the durable handoff: mirrored → delivered. Repeating it changes nothing.
pub fn ack(
    conn: &dyn Db,
    host: &str,
    delivery_id: &str,
    holder: Holder<'_>,
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    deliver(conn, host, delivery_id, holder, None, Mirrored, now_ms)
}

/// The holder's whole handoff in one step: claimed → mirrored → delivered, each transition
/// guarded and recorded as `mirrored` and `ack` record it; from `mirrored` only the ack.
/// Repeating it changes nothing. `changed` when either step changed.
pub fn handoff(
    conn: &dyn Db,
    host: &str,
    delivery_id: &str,
    holder: Holder<'_>,
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    deliver(conn, host, delivery_id, holder, None, Claimed, now_ms)
}

/// `ack` (`earliest` mirrored) or `handoff` (`earliest` claimed): the row written once,
/// `delivered`, with `session` as the one whose ack it is (`transition::deliver`). A refusal is
/// the first step's, word for word: `mirrored`'s for a handoff, the ack's own for an ack.
fn deliver(
    conn: &dyn Db,
    host: &str,
    delivery_id: &str,
    holder: Holder<'_>,
    session: Option<i64>,
    earliest: DeliveryState,
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    let unchanged = TransitionResponse { delivery_id: delivery_id.into(), state: Delivered, changed: false };
    let changed = TransitionResponse { changed: true, ..unchanged.clone() };
    let node = Actor::node(host);
    // The common case in one statement: the step from the state it starts at, by its holder.
    // Anything else (a repeat, a refusal, a handoff of a delivery already mirrored) reads the
    // row to answer as each step would.
    match transition::deliver(conn, host, delivery_id, earliest, holder, session, &node, now_ms) {
        Err(StoreError::StaleClaim(_)) => {}
        done => return done.map(|()| changed),
    }
    let row = load(conn, delivery_id, host)?;
    check_holder(&row, delivery_id, holder)?;
    match (row.state, earliest) {
        (Delivered, _) => Ok(unchanged),
        (Claimed, Claimed) | (Mirrored, _) => {
            transition::deliver(conn, host, delivery_id, row.state, holder, session, &node, now_ms)?;
            Ok(changed)
        }
        (other, _) => {
            let to = if earliest == Claimed { Mirrored } else { Delivered };
            Err(StoreError::InvalidTransition(format!(
                "delivery {delivery_id} is {other}; it must be {earliest} to become {to}"
            )))
        }
    }
}

/// Records `session` as the one whose ack made the current run of `delivery_id` delivered.
pub fn record_acked_session(conn: &dyn Db, delivery_id: &str, session: u64) -> StoreResult<()> {
    conn.prepare_cached("UPDATE deliveries SET acked_session = $2 WHERE id = $1")?
        .execute_unread(params![delivery_id, session as i64])?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn holder_step(
    conn: &dyn Db,
    host: &str,
    delivery_id: &str,
    holder: Holder<'_>,
    state: DeliveryState,
    from: DeliveryState,
    to: DeliveryState,
    already: &[DeliveryState],
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    if already.contains(&state) {
        return Ok(TransitionResponse { delivery_id: delivery_id.into(), state, changed: false });
    }
    if state != from {
        return Err(StoreError::InvalidTransition(format!(
            "delivery {delivery_id} is {state}; it must be {from} to become {to}"
        )));
    }
    let change = Change { delivery_id, from, to, expect_holder: Some(holder), new_holder: None, reason: None };
    transition::apply(conn, change, &Actor::node(host), now_ms)?;
    Ok(TransitionResponse { delivery_id: delivery_id.into(), state: to, changed: true })
}

/// The holder refuses the delivery: claimed or mirrored → failed, with its reason.
pub fn reject(
    conn: &dyn Db,
    host: &str,
    delivery_id: &str,
    holder: Holder<'_>,
    reason: &str,
    now_ms: i64,
) -> StoreResult<TransitionResponse> {
    let row = load(conn, delivery_id, host)?;
    if row.state == Failed {
        // A repeated reject by the same instance is a no-op success.
        let last: Option<(String, Option<String>)> = conn
            .prepare_cached(
                "SELECT actor_kind, instance_id FROM delivery_events WHERE delivery_id = $1 ORDER BY id DESC LIMIT 1",
            )?
            .query_row([delivery_id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        if let Some((kind, Some(inst))) = last
            && kind == "node"
            && inst == holder.instance_id
        {
            return Ok(TransitionResponse { delivery_id: delivery_id.into(), state: Failed, changed: false });
        }
    }
    check_holder(&row, delivery_id, holder)?;
    if !matches!(row.state, Claimed | Mirrored) {
        return Err(StoreError::InvalidTransition(format!(
            "delivery {delivery_id} is {}; only claimed or mirrored deliveries can be rejected",
            row.state
        )));
    }
    let why = format!("rejected by node: {reason}");
    let change = Change {
        delivery_id,
        from: row.state,
        to: Failed,
        expect_holder: Some(holder),
        new_holder: None,
        reason: Some(&why),
    };
    transition::apply(conn, change, &Actor::node(host), now_ms)?;
    Ok(TransitionResponse { delivery_id: delivery_id.into(), state: Failed, changed: true })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::lifecycle::claim::claim;
    use crate::store::testing;

    #[test]
    fn holder_steps_repeat_as_no_ops() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k1", &["host-a"]);
        let d = claim(&db.conn, "host-a", "i", 10, 1).unwrap().remove(0);
        let h = Holder { instance_id: "i", claim_token: &d.claim_token };
        assert!(matches!(ack(&db.conn, "host-a", &d.delivery_id, h, 2), Err(StoreError::InvalidTransition(_))));
        assert!(mirrored(&db.conn, "host-a", &d.delivery_id, h, 2).unwrap().changed);
        assert!(!mirrored(&db.conn, "host-a", &d.delivery_id, h, 3).unwrap().changed);
        assert!(ack(&db.conn, "host-a", &d.delivery_id, h, 4).unwrap().changed);
        assert!(!ack(&db.conn, "host-a", &d.delivery_id, h, 5).unwrap().changed);
        assert!(matches!(reject(&db.conn, "host-a", &d.delivery_id, h, "x", 6), Err(StoreError::InvalidTransition(_))));
        assert!(matches!(mirrored(&db.conn, "host-b", &d.delivery_id, h, 6), Err(StoreError::NotYours(_))));
        assert_eq!(holdings(&db.conn, "host-a", "i").unwrap().len(), 1, "delivered without outcome is still held");
    }

    /// A delivery row's `(state, instance_id, acked_session)`.
    type Row = (String, Option<String>, Option<i64>);
    /// An event's `(from_state, to_state, instance_id)`.
    type Event = (Option<String>, String, Option<String>);

    /// What the record keeps of a delivery: its row, and its events in order.
    fn written(c: &dyn Db, id: &str) -> (Row, Vec<Event>) {
        let row = c
            .prepare_cached("SELECT state, instance_id, acked_session FROM deliveries WHERE id = $1")
            .unwrap()
            .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap();
        let events = c
            .prepare_cached(
                "SELECT from_state, to_state, instance_id FROM delivery_events WHERE delivery_id = $1 ORDER BY id",
            )
            .unwrap()
            .query_map([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        (row, events)
    }

    /// The handoff writes the delivery's row once, `delivered`, with the session whose ack it
    /// is, and records both transitions it passes, as `mirrored` then `ack` record them.
    #[test]
    fn the_handoff_writes_the_row_once_and_records_each_step() {
        let db = testing::db();
        let c = &*db.conn;
        accept_one(c, "c", "k1", &["host-a"]);
        accept_one(c, "d", "k2", &["host-a"]);
        let got = claim(c, "host-a", "i", 10, 2).unwrap();
        let node = NodeAt { host: "host-a".into(), session: Some(7) };
        let writes = |f: &dyn Fn()| testing::row_writes(c, "deliveries", f);
        let h = |i: usize| Holder { instance_id: "i", claim_token: &got[i].claim_token };
        let n = writes(&|| {
            assert!(apply_step(c, Step::Handoff, &node, &got[0].delivery_id, h(0), 5).unwrap().changed);
        });
        assert_eq!(n, 1, "one write of the row for the whole handoff");
        let step = |from: &str, to: &str| (Some(from.to_string()), to.to_string(), Some("i".to_string()));
        let (row, events) = written(c, &got[0].delivery_id);
        assert_eq!(row, ("delivered".to_string(), Some("i".to_string()), Some(7)));
        assert_eq!(
            events[1..],
            [step("queued", "claimed"), step("claimed", "mirrored"), step("mirrored", "delivered")]
        );
        // Repeated: no write, no event.
        let n = writes(&|| {
            assert!(!apply_step(c, Step::Handoff, &node, &got[0].delivery_id, h(0), 6).unwrap().changed);
        });
        assert_eq!((n, written(c, &got[0].delivery_id).1.len()), (0, 4));
        // The two steps apart: the ack writes the session too; a node without sessions keeps
        // what the row had.
        mirrored(c, "host-a", &got[1].delivery_id, h(1), 5).unwrap();
        let old = NodeAt { host: "host-a".into(), session: None };
        let n = writes(&|| {
            assert!(apply_step(c, Step::Ack, &old, &got[1].delivery_id, h(1), 6).unwrap().changed);
        });
        assert_eq!(n, 1);
        let (row, events) = written(c, &got[1].delivery_id);
        assert_eq!(row, ("delivered".to_string(), Some("i".to_string()), None));
        assert_eq!(events[2..], [step("claimed", "mirrored"), step("mirrored", "delivered")], "{events:?}");
    }

    /// A handoff's refusals are `mirrored`'s, an ack's its own, and change nothing.
    #[test]
    fn the_handoff_refuses_as_its_first_step_would() {
        let db = testing::db();
        let c = &*db.conn;
        accept_one(c, "c", "k1", &["host-a"]);
        let d = claim(c, "host-a", "i", 10, 1).unwrap().remove(0);
        let h = Holder { instance_id: "i", claim_token: &d.claim_token };
        let wrong = Holder { instance_id: "j", claim_token: &d.claim_token };
        assert!(matches!(handoff(c, "host-a", &d.delivery_id, wrong, 2), Err(StoreError::StaleClaim(_))));
        assert!(matches!(handoff(c, "host-b", &d.delivery_id, h, 2), Err(StoreError::NotYours(_))));
        let e = ack(c, "host-a", &d.delivery_id, h, 2).unwrap_err();
        assert!(e.to_string().contains("is claimed; it must be mirrored to become delivered"), "{e}");
        reject(c, "host-a", &d.delivery_id, h, "no", 3).unwrap();
        // A failed delivery has no holder any more: the holder check refuses first.
        assert!(matches!(handoff(c, "host-a", &d.delivery_id, h, 4), Err(StoreError::StaleClaim(_))));
        assert_eq!(written(c, &d.delivery_id).0.0, "failed");
    }

    /// Holdings come in pages in queue order; following the cursor yields each holding once,
    /// also when one in the middle settles between two pages.
    #[test]
    fn holdings_come_in_pages_that_the_cursor_walks_once_each() {
        let db = testing::db();
        let c = &db.conn;
        for i in 0..5 {
            crate::store::lifecycle::accept::testing::accept_one(c, &format!("c{i}"), &format!("k{i}"), &["host-a"]);
        }
        let got = claim(c, "host-a", "i", 5, 2).unwrap();
        assert_eq!(got.len(), 5);
        let (first, next) = holdings_page(c, "host-a", "i", 0, 2).unwrap();
        assert_eq!(
            first.iter().map(|d| d.delivery_id.as_str()).collect::<Vec<_>>(),
            [&got[0].delivery_id, &got[1].delivery_id]
        );
        let next = next.expect("more follow");
        // The third one leaves the holdings (its node rejects it) before the next page is read.
        let h = crate::store::lifecycle::transition::Holder { instance_id: "i", claim_token: &got[2].claim_token };
        reject(c, "host-a", &got[2].delivery_id, h, "no", 3).unwrap();
        let (second, next) = holdings_page(c, "host-a", "i", next, 2).unwrap();
        assert_eq!(
            second.iter().map(|d| d.delivery_id.as_str()).collect::<Vec<_>>(),
            [&got[3].delivery_id, &got[4].delivery_id]
        );
        assert_eq!(next, None, "the last page says so");
        let (exact, next) = holdings_page(c, "host-a", "i", 0, 4).unwrap();
        assert_eq!((exact.len(), next), (4, None), "four holdings, a page of four: no next page");
        assert_eq!(holdings(c, "host-a", "i").unwrap().len(), 4);
    }
}
