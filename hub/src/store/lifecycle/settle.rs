//! When a message settles: `messages.settled_at`, set in the transaction that gives the last of
//! its deliveries a final outcome.
//!
//! A message is settled when its fan-out is done, it has deliveries, and every one of them is
//! final: failed, unknown, or delivered with an outcome of its current run. Three things can make
//! that true, and each calls `message` in its own transaction:
//! - a run's outcome recorded (`report`, and `operator` for an outcome the hub records as
//!   unknown), unless the same report requeues the delivery for a retry;
//! - a fan-out that completes with every delivery already final (`accept`: each recipient
//!   retired, or the approval already refused);
//! - a delivery that fails or ends unknown: still the `messages_settled_by_state` trigger, since
//!   those transitions are rare and come from many paths.
//!
//! What undoes it stays in the schema too: `messages_unsettled_by_state` clears `settled_at` when
//! a delivery leaves a final state (a retry or a redrive). A delivery that leaves a state that is
//! not final needs nothing: its message was not settled. A new delivery needs nothing either:
//! deliveries are made only by a fan-out, in the accept's own transaction (the message is new)
//! or while the message's fan-out is pending, and neither message is settled. `upkeep::verify` checks `settled_at` against the deliveries both
//! ways.
//!
//! On PostgreSQL two hubs may end the last two deliveries of one message at once, each seeing the
//! other's still unfinished; so the message row is locked first, and the settling statement that
//! follows (a fresh snapshot under READ COMMITTED) sees the other's commit
//! (`dialect::SETTLE_LOCK`). Both statements are sent unread: they ride with the transaction's
//! next statement.

use crate::store::StoreResult;
use crate::store::engine::dialect;
use crate::store::engine::{Db, params};

/// The settling statement (`$1` the message, `$2` the time): on both backends, after
/// `dialect::SETTLE_LOCK` on PostgreSQL.
pub const SETTLE: &str = "UPDATE messages SET settled_at = $2
     WHERE id = $1 AND settled_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = $1 AND o.done_at IS NULL)
       AND EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = $1)
       AND NOT EXISTS (
           SELECT 1 FROM deliveries d WHERE d.message_id = $1
             AND (d.state IN ('queued', 'held', 'claimed', 'mirrored')
                  OR (d.state = 'delivered'
                      AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))))";

/// Settles `message_id` at `at` if it is unsettled, its fan-out is done, and it has deliveries,
/// every one of them final. Call inside a write transaction, after the change that may have
/// made it so.
pub fn message(conn: &dyn Db, message_id: &str, at: i64) -> StoreResult<()> {
    if let Some(lock) = dialect::SETTLE_LOCK.of(conn) {
        conn.prepare_cached(lock)?.execute_unread([message_id])?;
    }
    conn.prepare_cached(SETTLE)?.execute_unread(params![message_id, at])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::testing;

    fn settled_at(conn: &dyn Db, message_id: &str) -> Option<i64> {
        conn.query_row("SELECT settled_at FROM messages WHERE id = $1", [message_id], |r| r.get(0)).unwrap()
    }

    /// Settles only when every delivery is final and the fan-out is done; a call on a message
    /// already settled keeps its first time.
    #[test]
    fn settles_only_a_message_whose_deliveries_are_all_final() {
        let db = testing::db();
        let c = &db.conn;
        let m = accept_one(c, "conv", "k1", &["host-a", "host-b"]);
        let ids: Vec<String> = c
            .prepare("SELECT id FROM deliveries WHERE message_id = $1 ORDER BY host")
            .unwrap()
            .query_map([&m], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        c.execute("UPDATE deliveries SET state = 'failed', reason = 'x' WHERE id = $1", [&ids[0]]).unwrap();
        // The trigger for a failed delivery does not settle while another is queued.
        message(c, &m, 5).unwrap();
        c.flush().unwrap();
        assert_eq!(settled_at(c, &m), None);
        c.execute(
            "UPDATE deliveries SET state = 'delivered', instance_id = 'i', claim_token = 't' WHERE id = $1",
            [&ids[1]],
        )
        .unwrap();
        message(c, &m, 6).unwrap();
        c.flush().unwrap();
        assert_eq!(settled_at(c, &m), None, "delivered without an outcome of its run is not final");
        c.execute(
            "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, reported_at)
             VALUES ('a1', $1, 'host-b', 'i', 'r1', 'h', 'succeeded', 7)",
            [&ids[1]],
        )
        .unwrap();
        message(c, &m, 7).unwrap();
        c.flush().unwrap();
        assert_eq!(settled_at(c, &m), Some(7));
        message(c, &m, 9).unwrap();
        c.flush().unwrap();
        assert_eq!(settled_at(c, &m), Some(7));
        // A redrive out of a final state unsettles it (the schema's trigger).
        c.execute(
            "UPDATE deliveries SET state = 'queued', instance_id = NULL, claim_token = NULL WHERE id = $1",
            [&ids[0]],
        )
        .unwrap();
        assert_eq!(settled_at(c, &m), None);
    }

    /// A message whose fan-out is pending, or that has no delivery, does not settle.
    #[test]
    fn a_pending_fan_out_or_no_delivery_keeps_a_message_unsettled() {
        let db = testing::db();
        let c = &db.conn;
        let m = accept_one(c, "conv", "k1", &["host-a"]);
        c.execute("UPDATE deliveries SET state = 'failed', reason = 'x' WHERE message_id = $1", [&m]).unwrap();
        c.execute("UPDATE messages SET settled_at = NULL WHERE id = $1", [&m]).unwrap();
        c.execute("UPDATE fanout_obligations SET done_at = NULL WHERE message_id = $1", [&m]).unwrap();
        message(c, &m, 5).unwrap();
        c.flush().unwrap();
        assert_eq!(settled_at(c, &m), None);
        c.execute("UPDATE fanout_obligations SET done_at = 4 WHERE message_id = $1", [&m]).unwrap();
        c.execute("DELETE FROM deliveries WHERE message_id = $1", [&m]).unwrap();
        message(c, &m, 6).unwrap();
        c.flush().unwrap();
        assert_eq!(settled_at(c, &m), None);
    }
}
