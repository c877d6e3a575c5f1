//! Retention: messages (with their idempotency keys, deliveries, events and attempts) are kept
//! for the retention window after they *settled* (`messages.settled_at`: their last delivery
//! reached a final outcome), not after acceptance, so a message accepted long ago that settles
//! now keeps its idempotency key for a whole window and a producer's retry still answers
//! `duplicate`. A message that is still waiting, held, in flight, or delivered without an
//! outcome has no `settled_at` and is kept however old it is: nothing unfinished ever
//! vanishes. The sweep checks that again itself, so a wrong `settled_at` could keep a message
//! too long, never remove an unfinished one. The operators' audit log (`operator_events`) has
//! its own window (`limits.audit_retention`), counted from each row's time; so do lifted fences
//! (an expired fence is lifted by the hub at its expiry), counted from their lift: a fence is
//! operator history once lifted, and without the sweep the table only ever grew. An active
//! fence is never removed, however old.

use crate::store::Store;
use crate::store::StoreResult;
use crate::store::engine::Db;
use crate::store::engine::params;

impl Store {
    /// Removes up to `max` settled messages settled before `cutoff_ms`; returns how many.
    pub async fn retention_sweep(&self, cutoff_ms: i64, max: usize) -> StoreResult<usize> {
        self.conns.write(move |c| sweep(c, cutoff_ms, max)).await
    }

    /// Removes up to `max` audit rows written before `cutoff_ms`; returns how many.
    pub async fn audit_sweep(&self, cutoff_ms: i64, max: usize) -> StoreResult<usize> {
        self.conns.write(move |c| sweep_audit(c, cutoff_ms, max)).await
    }

    /// Removes up to `max` fences lifted before `cutoff_ms`; returns how many.
    pub async fn fence_sweep(&self, cutoff_ms: i64, max: usize) -> StoreResult<usize> {
        self.conns.write(move |c| sweep_fences(c, cutoff_ms, max)).await
    }
}

/// Most messages removed per sweep transaction, so a sweep never holds the writer for long.
pub const SWEEP_MESSAGES_MAX: usize = 5_000;

/// Most audit rows removed per sweep transaction, for the same reason.
pub const SWEEP_AUDIT_ROWS_MAX: usize = 5_000;

/// The unfinished parts that keep a message (`m`) whatever its `settled_at` says.
pub(crate) const UNFINISHED: &str =
    "EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = m.id AND o.done_at IS NULL)
    OR EXISTS (
        SELECT 1 FROM deliveries d WHERE d.message_id = m.id
          AND (d.state IN ('queued', 'held', 'claimed', 'mirrored')
               OR (d.state = 'delivered'
                   AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))))";

/// Removes up to `max` messages that settled before `cutoff_ms`. Returns how many.
pub fn sweep(conn: &dyn Db, cutoff_ms: i64, max: usize) -> StoreResult<usize> {
    let n = conn
        .prepare_cached(&format!(
            "DELETE FROM messages WHERE id IN (
                SELECT m.id FROM messages m
                WHERE m.settled_at IS NOT NULL AND m.settled_at < $1 AND NOT ({UNFINISHED})
                ORDER BY m.settled_at LIMIT $2)"
        ))?
        .execute(params![cutoff_ms, max as i64])?;
    Ok(n)
}

/// Removes up to `max` audit rows (`operator_events`) written before `cutoff_ms`. Returns how
/// many.
pub fn sweep_audit(conn: &dyn Db, cutoff_ms: i64, max: usize) -> StoreResult<usize> {
    let n = conn
        .prepare_cached(
            "DELETE FROM operator_events WHERE id IN (SELECT id FROM operator_events WHERE at < $1 ORDER BY id LIMIT $2)",
        )?
        .execute(params![cutoff_ms, max as i64])?;
    Ok(n)
}

/// Most lifted fences removed per sweep transaction, for the same reason.
pub const SWEEP_FENCES_MAX: usize = 5_000;

/// Removes up to `max` fences lifted (by an operator, or by the hub at their expiry) before
/// `cutoff_ms`. Returns how many. Active fences stay whatever their age.
pub fn sweep_fences(conn: &dyn Db, cutoff_ms: i64, max: usize) -> StoreResult<usize> {
    let n = conn
        .prepare_cached(
            "DELETE FROM fences WHERE id IN (
                SELECT id FROM fences WHERE lifted_at IS NOT NULL AND lifted_at < $1 ORDER BY id LIMIT $2)",
        )?
        .execute(params![cutoff_ms, max as i64])?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::testing;

    #[test]
    fn only_old_settled_messages_go() {
        let db = testing::db();
        let waiting = accept_one(&db.conn, "c", "k1", &["host-a"]);
        let settled = accept_one(&db.conn, "c", "k2", &["host-a"]);
        db.conn
            .execute("UPDATE deliveries SET state = 'failed', reason = 'x' WHERE message_id = $1", [&settled])
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
        let seq: i64 = db.conn.query_row("SELECT seq FROM messages WHERE id = $1", [&next], |r| r.get(0)).unwrap();
        assert_eq!(seq, 3);
    }

    fn settled_at(c: &dyn Db, m: &str) -> Option<i64> {
        c.query_row("SELECT settled_at FROM messages WHERE id = $1", [m], |r| r.get(0)).unwrap()
    }

    fn accept_again(c: &dyn Db, key: &str, now_ms: i64) -> crate::store::lifecycle::accept::Accepted {
        let msg = crate::store::lifecycle::accept::NewMessage {
            traceparent: None,
            producer: "prod".into(),
            conversation: "c".into(),
            idempotency_key: key.into(),
            payload: "{}".into(),
            to: vec!["host-a".into()],
            pools: Vec::new(),
        };
        crate::store::lifecycle::accept::accept(
            c,
            &msg,
            crate::store::lifecycle::accept::AcceptLimits {
                queued_per_host_max: 1 << 40,
                queued_per_pool_max: 1 << 40,
            },
            now_ms,
        )
        .unwrap()
    }

    /// Regression: retention counted from acceptance, so a message accepted long ago that
    /// settled just now was swept at the next sweep, its idempotency key with it, and a
    /// producer's retry right after created a duplicate. It counts from settling.
    #[test]
    fn retention_counts_from_settling_not_from_acceptance() {
        use baton_shared::clock::{Clock, ManualClock};
        const DAY_MS: i64 = 24 * 3600 * 1000;
        let window_ms = 7 * DAY_MS;
        let cutoff = |clock: &ManualClock| clock.now_ms() - window_ms;
        let clock = ManualClock::new(1);
        let db = testing::db();
        let c = &db.conn;
        let m = accept_one(c, "c", "k1", &["host-a"]);
        assert_eq!(settled_at(c, &m), None, "queued: not settled");

        // Thirty days later its node takes it and reports.
        clock.set_ms(30 * DAY_MS);
        let now = clock.now_ms();
        let d = crate::store::lifecycle::claim::claim(c, "host-a", "i", 1, now).unwrap().remove(0);
        let h = crate::store::lifecycle::transition::Holder { instance_id: "i", claim_token: &d.claim_token };
        crate::store::lifecycle::handoff::mirrored(c, "host-a", &d.delivery_id, h, now).unwrap();
        crate::store::lifecycle::handoff::ack(c, "host-a", &d.delivery_id, h, now).unwrap();
        assert_eq!(settled_at(c, &m), None, "delivered without an outcome: not settled");
        clock.advance_ms(1_000);
        let r = crate::store::lifecycle::report::NewReport {
            delivery_id: &d.delivery_id,
            holder: h,
            report_id: "r1",
            outcome: baton_shared::states::Outcome::Succeeded,
            exit_code: Some(0),
            duration_ms: None,
            result: None,
            reason: None,
            stderr_tail: None,
            stderr_dropped_bytes: None,
        };
        crate::store::lifecycle::report::report(c, "host-a", &r, clock.now_ms()).unwrap();
        let settled = clock.now_ms();
        assert_eq!(settled_at(c, &m), Some(settled), "settled by the report, at the report's time");

        // Just settled: kept, and its key still answers duplicate.
        assert_eq!(sweep(c, cutoff(&clock), 100).unwrap(), 0);
        assert!(matches!(
            accept_again(c, "k1", clock.now_ms()),
            crate::store::lifecycle::accept::Accepted::Duplicate { .. }
        ));
        // Until the window has passed since it settled.
        clock.set_ms(settled + window_ms);
        assert_eq!(sweep(c, cutoff(&clock), 100).unwrap(), 0, "exactly one window after settling: kept");
        assert!(matches!(
            accept_again(c, "k1", clock.now_ms()),
            crate::store::lifecycle::accept::Accepted::Duplicate { .. }
        ));
        clock.advance_ms(1);
        assert_eq!(sweep(c, cutoff(&clock), 100).unwrap(), 1, "past the window: gone");
        assert!(matches!(accept_again(c, "k1", clock.now_ms()), crate::store::lifecycle::accept::Accepted::New { .. }));
    }

    /// A retry or redrive reopens a settled message; its next outcome settles it anew.
    #[test]
    fn a_rerun_reopens_a_settled_message_and_its_outcome_settles_it_again() {
        let db = testing::db();
        let c = &db.conn;
        let m = accept_one(c, "c", "k1", &["host-a"]);
        let d = crate::store::lifecycle::claim::claim(c, "host-a", "i", 1, 2).unwrap().remove(0);
        let h = crate::store::lifecycle::transition::Holder { instance_id: "i", claim_token: &d.claim_token };
        crate::store::lifecycle::handoff::reject(c, "host-a", &d.delivery_id, h, "no", 3).unwrap();
        assert_eq!(settled_at(c, &m), Some(3), "failed by its node: settled");
        crate::store::lifecycle::turns::retry(c, &d.delivery_id, "op", "again", 4).unwrap();
        assert_eq!(settled_at(c, &m), None, "redriven: open again");
        assert_eq!(sweep(c, 1_000, 100).unwrap(), 0);
        let d = crate::store::lifecycle::claim::claim(c, "host-a", "i", 1, 5).unwrap().remove(0);
        let h = crate::store::lifecycle::transition::Holder { instance_id: "i", claim_token: &d.claim_token };
        crate::store::lifecycle::handoff::reject(c, "host-a", &d.delivery_id, h, "no again", 6).unwrap();
        assert_eq!(settled_at(c, &m), Some(6));
    }

    /// Audit rows go after their own window, counted from when each was written.
    #[test]
    fn audit_rows_go_after_their_window() {
        let db = testing::db();
        let c = &db.conn;
        for at in [10, 20, 30] {
            c.execute(
                "INSERT INTO operator_events (action, subject, operator, reason, at) VALUES ('fence_set', 's', 'op', 'r', $1)",
                [at],
            )
            .unwrap();
        }
        assert_eq!(sweep_audit(c, 10, 100).unwrap(), 0);
        assert_eq!(sweep_audit(c, 25, 100).unwrap(), 2);
        let left: i64 = c.query_row("SELECT at FROM operator_events", [], |r| r.get(0)).unwrap();
        assert_eq!(left, 30);
    }

    /// A delivered delivery re-run by an operator keeps its message while the new run has no
    /// outcome, although the first run's attempt is there.
    #[test]
    fn a_rerun_waiting_for_its_outcome_is_kept() {
        let db = testing::db();
        let c = &db.conn;
        let m = accept_one(c, "c", "k1", &["host-a"]);
        let run = |now: i64| {
            let d = crate::store::lifecycle::claim::claim(c, "host-a", "i", 1, now).unwrap().remove(0);
            let h = crate::store::lifecycle::transition::Holder { instance_id: "i", claim_token: &d.claim_token };
            crate::store::lifecycle::handoff::mirrored(c, "host-a", &d.delivery_id, h, now).unwrap();
            crate::store::lifecycle::handoff::ack(c, "host-a", &d.delivery_id, h, now).unwrap();
            d
        };
        let d = run(2);
        let h = crate::store::lifecycle::transition::Holder { instance_id: "i", claim_token: &d.claim_token };
        let r = crate::store::lifecycle::report::NewReport {
            delivery_id: &d.delivery_id,
            holder: h,
            report_id: "r1",
            outcome: baton_shared::states::Outcome::Failed,
            exit_code: Some(1),
            duration_ms: None,
            result: None,
            reason: None,
            stderr_tail: None,
            stderr_dropped_bytes: None,
        };
        crate::store::lifecycle::report::report(c, "host-a", &r, 3).unwrap();
        crate::store::lifecycle::turns::retry(c, &d.delivery_id, "op", "again", 4).unwrap();
        run(5);
        assert_eq!(sweep(c, 100, 100).unwrap(), 0, "run 2 has no outcome yet");
        let kept: i64 = c.query_row("SELECT count(*) FROM messages WHERE id = $1", [&m], |r| r.get(0)).unwrap();
        assert_eq!(kept, 1);
    }

    /// Lifted and expired fences go once lifted longer than the audit window; active ones,
    /// time-boxed or not, stay however old.
    #[test]
    fn lifted_and_expired_fences_go_after_the_audit_window_active_ones_stay() {
        use crate::store::registry::fences::{self, FenceKind, FenceScope, NewFence};
        let db = testing::db();
        let c = &db.conn;
        let fence = |target: &'static str| NewFence {
            kind: FenceKind::Pause,
            scope: FenceScope::Conversation,
            target: Some(target),
            operator: "op",
            reason: "r",
        };
        let lifted = fences::set(c, fence("a"), 10).unwrap();
        fences::lift(c, lifted, "op", "done", 20).unwrap();
        let expired = fences::set_until(c, fence("b"), Some(30), 10).unwrap();
        assert_eq!(fences::lift_expired(c, 30).unwrap(), vec![expired]);
        let active = fences::set(c, fence("c"), 1).unwrap();
        let boxed = fences::set_until(c, fence("d"), Some(1_000), 1).unwrap();

        assert_eq!(sweep_fences(c, 20, 100).unwrap(), 0, "lifted at 20: not before the cutoff");
        assert_eq!(sweep_fences(c, 21, 100).unwrap(), 1);
        assert_eq!(sweep_fences(c, 500, 100).unwrap(), 1, "the expired one, lifted by the hub at 30");
        let left: Vec<i64> = c
            .prepare("SELECT id FROM fences ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(left, vec![active, boxed]);
        assert_eq!(fences::active(c).unwrap().len(), 2);
    }
}
