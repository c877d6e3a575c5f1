//! Purge: an operator removes settled messages before their retention window ends (a payload
//! that must go now), one message or a whole conversation. Only settled data goes: a message
//! with any delivery still waiting, held, in flight or delivered without its outcome is never
//! touched, and a purge that names one is refused whole, naming those deliveries. The
//! conversation's sequence is never reused (its row stays), and the purge is recorded in the
//! audit log with operator, subject, counts and reason, in the same transaction.

use super::StoreResult;
use super::db::Db;
use super::hosts::record_operator_event;
use super::retention::UNFINISHED;
use baton_shared::states::DeliveryState;
use rusqlite::named_params;

/// The most unfinished deliveries a refusal names.
pub const UNSETTLED_SHOWN_MAX: usize = 20;

/// What a purge removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// One message, by id.
    Message(&'a str),
    /// Every message of a conversation.
    Conversation(&'a str),
}

impl Target<'_> {
    /// How the audit log names it: `message ID`, `conversation C`.
    pub fn subject(&self) -> String {
        match self {
            Target::Message(id) => format!("message {id}"),
            Target::Conversation(c) => format!("conversation {c}"),
        }
    }

    fn params(&self) -> (Option<&str>, Option<&str>) {
        match *self {
            Target::Message(id) => (Some(id), None),
            Target::Conversation(c) => (None, Some(c)),
        }
    }
}

/// What a purge would remove, or why it may not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The messages it removes (all of the target's).
    pub messages: Vec<String>,
    /// Their deliveries.
    pub deliveries: i64,
    /// The target's deliveries that are not settled (delivery id, state), at most
    /// `UNSETTLED_SHOWN_MAX`: while there is one, nothing is removed.
    pub unsettled: Vec<(String, DeliveryState)>,
    /// Messages of the target whose fan-out is not done (they too keep the purge back).
    pub fan_out_pending: i64,
}

impl Plan {
    /// Whether the purge may go ahead: something to remove and nothing unfinished.
    pub fn allowed(&self) -> bool {
        self.unsettled.is_empty() && self.fan_out_pending == 0
    }
}

const TARGET: &str =
    "(CAST(:m AS TEXT) IS NOT NULL AND m.id = :m) OR (CAST(:c AS TEXT) IS NOT NULL AND m.conversation = :c)";

/// What purging `target` would do.
pub fn plan(conn: &dyn Db, target: Target<'_>) -> StoreResult<Plan> {
    let (m, c) = target.params();
    let p = named_params! {":m": m, ":c": c};
    let messages: Vec<String> = conn
        .prepare_cached(&format!("SELECT m.id FROM messages m WHERE {TARGET} ORDER BY m.seq"))?
        .query_map(p, |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let deliveries: i64 = conn
        .prepare_cached(&format!(
            "SELECT count(*) FROM deliveries d JOIN messages m ON m.id = d.message_id WHERE {TARGET}"
        ))?
        .query_row(p, |r| r.get(0))?;
    let unsettled = conn
        .prepare_cached(&format!(
            "SELECT d.id, d.state FROM deliveries d JOIN messages m ON m.id = d.message_id
             WHERE ({TARGET})
               AND (d.state IN ('queued', 'held', 'claimed', 'mirrored')
                    OR (d.state = 'delivered'
                        AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)))
             ORDER BY d.n LIMIT :max"
        ))?
        .query_map(named_params! {":m": m, ":c": c, ":max": UNSETTLED_SHOWN_MAX as i64}, |r| {
            let id: String = r.get(0)?;
            Ok((id.clone(), super::state_column(r, 1, "deliveries", &id)?))
        })?
        .collect::<Result<_, _>>()?;
    let fan_out_pending: i64 = conn
        .prepare_cached(&format!(
            "SELECT count(*) FROM messages m JOIN fanout_obligations o ON o.message_id = m.id AND o.done_at IS NULL
             WHERE {TARGET}"
        ))?
        .query_row(p, |r| r.get(0))?;
    Ok(Plan { messages, deliveries, unsettled, fan_out_pending })
}

/// Purges `target` when its plan allows it (inside the caller's write transaction), recording
/// it in the audit log; returns the plan either way (nothing changed when it is not allowed or
/// there is nothing to remove).
pub fn purge(conn: &dyn Db, target: Target<'_>, operator: &str, reason: &str, now_ms: i64) -> StoreResult<Plan> {
    let plan = plan(conn, target)?;
    if !plan.allowed() || plan.messages.is_empty() {
        return Ok(plan);
    }
    let (m, c) = target.params();
    let removed = conn
        .prepare_cached(&format!(
            "DELETE FROM messages WHERE id IN (SELECT m.id FROM messages m WHERE ({TARGET}) AND NOT ({UNFINISHED}))"
        ))?
        .execute(named_params! {":m": m, ":c": c})?;
    debug_assert_eq!(removed, plan.messages.len(), "the plan and the delete read the same transaction");
    let why = format!("{reason} ({} message(s), {} deliveries removed)", plan.messages.len(), plan.deliveries);
    record_operator_event(conn, "purge", &target.subject(), operator, Some(&why), now_ms)?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::accept::testing::accept_one;
    use crate::store::testing;

    fn count(c: &dyn Db, sql: &str) -> i64 {
        c.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn only_settled_messages_go_and_an_unsettled_one_refuses_the_whole_purge() {
        let db = testing::db();
        let c = &db.conn;
        let done = accept_one(c, "c", "k1", &["host-a", "host-b"]);
        let open = accept_one(c, "c", "k2", &["host-a"]);
        c.execute("UPDATE deliveries SET state = 'failed', reason = 'x' WHERE message_id = ?1", [&done]).unwrap();

        let refused = purge(c, Target::Conversation("c"), "op", "gdpr", 5).unwrap();
        assert!(!refused.allowed());
        assert_eq!(refused.unsettled.len(), 1);
        assert_eq!(refused.unsettled[0].1, DeliveryState::Queued);
        assert_eq!(count(c, "SELECT count(*) FROM messages"), 2, "nothing removed");

        let p = purge(c, Target::Message(&done), "op", "gdpr", 5).unwrap();
        assert_eq!((p.messages.len(), p.deliveries), (1, 2));
        assert_eq!(count(c, "SELECT count(*) FROM messages"), 1);
        assert_eq!(count(c, "SELECT count(*) FROM deliveries"), 1);
        let audit: String =
            c.query_row("SELECT reason FROM operator_events WHERE action = 'purge'", [], |r| r.get(0)).unwrap();
        assert!(audit.contains("gdpr") && audit.contains("1 message(s), 2 deliveries"), "{audit}");
        assert!(purge(c, Target::Message(&open), "op", "gdpr", 6).unwrap().unsettled.len() == 1);
        assert_eq!(plan(c, Target::Message("nope")).unwrap().messages.len(), 0);
    }
}
