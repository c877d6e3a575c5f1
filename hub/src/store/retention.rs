//! Retention: messages (with their idempotency keys, deliveries, events and attempts) are kept
//! for the retention window after acceptance, and removed only once every delivery is settled.
//! A delivery that is still waiting, held, in flight, or delivered without an outcome keeps its
//! message however old it is: nothing unfinished ever vanishes.

use super::StoreResult;
use rusqlite::Connection;

/// Most messages removed per sweep transaction, so a sweep never holds the writer for long.
pub const SWEEP_MESSAGES_MAX: usize = 5_000;

/// Removes up to `max` settled messages accepted before `cutoff_ms`. Returns how many.
pub fn sweep(conn: &Connection, cutoff_ms: i64, max: usize) -> StoreResult<usize> {
    let n = conn
        .prepare_cached(
            "DELETE FROM messages WHERE id IN (
                SELECT m.id FROM messages m
                WHERE m.accepted_at < ?1
                  AND NOT EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = m.id AND o.done_at IS NULL)
                  AND NOT EXISTS (
                      SELECT 1 FROM deliveries d WHERE d.message_id = m.id
                        AND (d.state IN ('queued', 'held', 'claimed', 'mirrored')
                             OR (d.state = 'delivered'
                                 AND NOT EXISTS (
                                     SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))))
                ORDER BY m.accepted_at LIMIT ?2)",
        )?
        .execute(rusqlite::params![cutoff_ms, max as i64])?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::accept::testing::accept_one;
    use crate::store::testing;

    #[test]
    fn only_old_settled_messages_go() {
        let db = testing::db();
        let waiting = accept_one(&db.conn, "c", "k1", &["host-a"]);
        let settled = accept_one(&db.conn, "c", "k2", &["host-a"]);
        db.conn
            .execute("UPDATE deliveries SET state = 'failed', reason = 'x' WHERE message_id = ?1", [&settled])
            .unwrap();
        // Accepted at t=1: a cutoff of 1 keeps everything, a later cutoff removes only the settled one.
        assert_eq!(sweep(&db.conn, 1, 100).unwrap(), 0);
        assert_eq!(sweep(&db.conn, 10, 100).unwrap(), 1);
        let left: Vec<String> = db
            .conn
            .prepare("SELECT id FROM messages")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(left, vec![waiting]);
        let orphans: i64 = db
            .conn
            .query_row(
                "SELECT (SELECT count(*) FROM deliveries) + (SELECT count(*) FROM delivery_events) - 2",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(orphans, 0, "the removed message's delivery and events went with it");
        // The conversation's sequence is never reused.
        let next = accept_one(&db.conn, "c", "k3", &["host-a"]);
        let seq: i64 = db.conn.query_row("SELECT seq FROM messages WHERE id = ?1", [&next], |r| r.get(0)).unwrap();
        assert_eq!(seq, 3);
    }

    /// A delivered delivery re-run by an operator keeps its message while the new run has no
    /// outcome, although the first run's attempt is there.
    #[test]
    fn a_rerun_waiting_for_its_outcome_is_kept() {
        let db = testing::db();
        let c = &db.conn;
        let m = accept_one(c, "c", "k1", &["host-a"]);
        let run = |now: i64| {
            let d = crate::store::claim::claim(c, "host-a", "i", 1, now).unwrap().remove(0);
            let h = crate::store::transition::Holder { instance_id: "i", claim_token: &d.claim_token };
            crate::store::claim::mirrored(c, "host-a", &d.delivery_id, h, now).unwrap();
            crate::store::claim::ack(c, "host-a", &d.delivery_id, h, now).unwrap();
            d
        };
        let d = run(2);
        let h = crate::store::transition::Holder { instance_id: "i", claim_token: &d.claim_token };
        let r = crate::store::report::NewReport {
            delivery_id: &d.delivery_id,
            holder: h,
            report_id: "r1",
            outcome: baton_shared::states::Outcome::Failed,
            exit_code: Some(1),
            duration_ms: None,
            result: None,
            reason: None,
        };
        crate::store::report::report(c, "host-a", &r, 3).unwrap();
        crate::store::turns::retry(c, &d.delivery_id, "op", "again", 4).unwrap();
        run(5);
        assert_eq!(sweep(c, 100, 100).unwrap(), 0, "run 2 has no outcome yet");
        let kept: i64 = c.query_row("SELECT count(*) FROM messages WHERE id = ?1", [&m], |r| r.get(0)).unwrap();
        assert_eq!(kept, 1);
    }
}
