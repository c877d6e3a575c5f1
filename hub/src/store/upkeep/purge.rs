//! Purge: an operator removes settled messages before their retention window ends (a payload
//! that must go now), one message or a whole conversation. Only settled data goes: a message
//! with any delivery still waiting, held, in flight or delivered without its outcome is never
//! touched, and a purge that names one is refused whole, naming those deliveries. The
//! conversation's sequence is never reused (its row stays), and the purge is recorded in the
//! audit log with operator, subject, counts and reason, in the same transaction.
//!
//! A purge by recipient host (`purge_host`) is for a host whose history must go (a retired
//! machine, a data request): it removes the host's settled deliveries, with their events,
//! attempts and routing rows, and the messages that had no other recipient (with their
//! idempotency keys, as any purge). It never waits for the host's unfinished deliveries, which
//! may be many on a live host: they are kept, counted and named, and a later purge takes them
//! once settled. A message whose fan-out is not done is not touched.

use crate::store::By;
use crate::store::Store;
use crate::store::StoreResult;
use crate::store::engine::Db;
use crate::store::engine::params;
use crate::store::registry::audit::record_operator_event;
use crate::store::upkeep::retention::UNFINISHED;
use baton_shared::states::DeliveryState;

/// What a purge names, owned (see `Target`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeOf {
    /// One message, by id.
    Message(String),
    /// Every message of a conversation.
    Conversation(String),
}

impl PurgeOf {
    fn as_target(&self) -> Target<'_> {
        match self {
            PurgeOf::Message(m) => Target::Message(m),
            PurgeOf::Conversation(c) => Target::Conversation(c),
        }
    }
}

impl Store {
    /// What purging `target` would remove, changing nothing.
    pub async fn purge_plan(&self, target: PurgeOf) -> StoreResult<Plan> {
        self.conns.read(move |c| plan(c, target.as_target())).await
    }

    /// Purges `target` when every delivery of it is settled; returns the plan it followed.
    pub async fn purge(&self, target: PurgeOf, by: By) -> StoreResult<Plan> {
        let clock = self.clock.clone();
        self.conns.write(move |c| purge(c, target.as_target(), &by.operator, &by.reason, clock.now_ms())).await
    }

    /// What purging the settled deliveries of recipient `host` would remove, changing nothing.
    pub async fn purge_host_plan(&self, host: String) -> StoreResult<HostPlan> {
        self.conns.read(move |c| host_plan(c, &host)).await
    }

    /// Purges the settled deliveries of recipient `host` (and the messages only it received);
    /// returns the plan it followed.
    pub async fn purge_host(&self, host: String, by: By) -> StoreResult<HostPlan> {
        let clock = self.clock.clone();
        self.conns.write(move |c| purge_host(c, &host, &by.operator, &by.reason, clock.now_ms())).await
    }
}

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
    "(CAST($1 AS TEXT) IS NOT NULL AND m.id = $1) OR (CAST($2 AS TEXT) IS NOT NULL AND m.conversation = $2)";

/// What purging `target` would do.
pub fn plan(conn: &dyn Db, target: Target<'_>) -> StoreResult<Plan> {
    let (m, c) = target.params();
    let p = params![m, c];
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
             ORDER BY d.n LIMIT $3"
        ))?
        .query_map(params![m, c, UNSETTLED_SHOWN_MAX as i64], |r| {
            let id: String = r.get(0)?;
            Ok((id.clone(), crate::store::state_column(r, 1, "deliveries", &id)?))
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
        .execute(params![m, c])?;
    debug_assert_eq!(removed, plan.messages.len(), "the plan and the delete read the same transaction");
    let why = format!("{reason} ({} message(s), {} deliveries removed)", plan.messages.len(), plan.deliveries);
    record_operator_event(conn, "purge", &target.subject(), operator, Some(&why), now_ms)?;
    Ok(plan)
}

/// A host's delivery (`d`) that a host purge removes: settled, of a message whose fan-out is
/// done.
const SETTLED_OF_HOST: &str = "d.host = $1
    AND NOT (d.state IN ('queued', 'held', 'claimed', 'mirrored')
             OR (d.state = 'delivered'
                 AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)))
    AND NOT EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = d.message_id AND o.done_at IS NULL)";

/// The messages (`m`) a host purge removes whole: one of its deliveries is a settled one of the
/// host, and no other host has a delivery of it.
fn only_to_host() -> String {
    format!(
        "EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = m.id AND {SETTLED_OF_HOST})
         AND NOT EXISTS (SELECT 1 FROM deliveries d2 WHERE d2.message_id = m.id AND d2.host <> $1)"
    )
}

/// What a purge by recipient host would remove, and what it keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPlan {
    /// The host's settled deliveries it removes (those of removed messages included).
    pub deliveries: i64,
    /// The messages it removes whole: they had no recipient but the host.
    pub messages: i64,
    /// How many of the host's deliveries it keeps because they are not settled (or their
    /// message's fan-out is not done).
    pub kept: i64,
    /// Some of the kept ones (delivery id, state), at most `UNSETTLED_SHOWN_MAX`.
    pub kept_shown: Vec<(String, DeliveryState)>,
}

/// What purging the settled deliveries of recipient `host` would do.
pub fn host_plan(conn: &dyn Db, host: &str) -> StoreResult<HostPlan> {
    let p = params![host];
    let deliveries: i64 = conn
        .prepare_cached(&format!("SELECT count(*) FROM deliveries d WHERE {SETTLED_OF_HOST}"))?
        .query_row(p, |r| r.get(0))?;
    let only = only_to_host();
    let messages: i64 =
        conn.prepare_cached(&format!("SELECT count(*) FROM messages m WHERE {only}"))?.query_row(p, |r| r.get(0))?;
    let kept: i64 = conn
        .prepare_cached(&format!("SELECT count(*) FROM deliveries d WHERE d.host = $1 AND NOT ({SETTLED_OF_HOST})"))?
        .query_row(p, |r| r.get(0))?;
    let kept_shown = conn
        .prepare_cached(&format!(
            "SELECT d.id, d.state FROM deliveries d WHERE d.host = $1 AND NOT ({SETTLED_OF_HOST}) ORDER BY d.n LIMIT $2"
        ))?
        .query_map(params![host, UNSETTLED_SHOWN_MAX as i64], |r| {
            let id: String = r.get(0)?;
            Ok((id.clone(), crate::store::state_column(r, 1, "deliveries", &id)?))
        })?
        .collect::<Result<_, _>>()?;
    Ok(HostPlan { deliveries, messages, kept, kept_shown })
}

/// Removes the settled deliveries of recipient `host` (inside the caller's write transaction):
/// first the messages that had no other recipient, then the host's remaining settled
/// deliveries with their routing rows (so the record still reads as fully fanned out), and
/// records it in the audit log when anything went. Returns the plan it followed.
pub fn purge_host(conn: &dyn Db, host: &str, operator: &str, reason: &str, now_ms: i64) -> StoreResult<HostPlan> {
    let plan = host_plan(conn, host)?;
    if plan.deliveries == 0 {
        return Ok(plan);
    }
    let p = params![host];
    let only = only_to_host();
    let messages = conn
        .prepare_cached(&format!("DELETE FROM messages WHERE id IN (SELECT m.id FROM messages m WHERE {only})"))?
        .execute(p)?;
    conn.prepare_cached(&format!(
        "DELETE FROM message_recipients WHERE host = $1
           AND message_id IN (SELECT d.message_id FROM deliveries d WHERE {SETTLED_OF_HOST})"
    ))?
    .execute(p)?;
    let deliveries = conn
        .prepare_cached(&format!(
            "DELETE FROM deliveries WHERE id IN (SELECT d.id FROM deliveries d WHERE {SETTLED_OF_HOST})"
        ))?
        .execute(p)?;
    debug_assert_eq!(messages as i64, plan.messages, "the plan and the delete read the same transaction");
    debug_assert!(deliveries as i64 <= plan.deliveries, "the removed messages took some deliveries with them");
    let why = format!(
        "{reason} ({} deliveries, {} message(s) removed; {} unsettled deliveries kept)",
        plan.deliveries, plan.messages, plan.kept
    );
    record_operator_event(conn, "purge", &format!("host {host}"), operator, Some(&why), now_ms)?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
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
        c.execute("UPDATE deliveries SET state = 'failed', reason = 'x' WHERE message_id = $1", [&done]).unwrap();

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

    #[test]
    fn a_host_purge_removes_its_settled_deliveries_and_the_messages_only_it_received() {
        let db = testing::db();
        let c = &db.conn;
        let shared = accept_one(c, "c", "k1", &["host-a", "host-b"]);
        let alone = accept_one(c, "c", "k2", &["host-a"]);
        let open = accept_one(c, "c", "k3", &["host-a"]);
        let other = accept_one(c, "c", "k4", &["host-b"]);
        c.execute(
            "UPDATE deliveries SET state = 'failed', reason = 'x' WHERE message_id IN ($1, $2) OR (message_id = $3)",
            [&shared, &alone, &other],
        )
        .unwrap();

        // The raw updates above leave the record's own bookkeeping behind (backlog counts, event
        // chains): what matters is that the purge adds no problem of its own.
        let before = crate::store::upkeep::verify::check(c).unwrap();
        let dry = host_plan(c, "host-a").unwrap();
        assert_eq!((dry.deliveries, dry.messages, dry.kept), (2, 1, 1));
        assert_eq!(dry.kept_shown[0].1, DeliveryState::Queued);
        assert_eq!(count(c, "SELECT count(*) FROM deliveries"), 5, "a plan removes nothing");

        let done = purge_host(c, "host-a", "op", "host gone", 7).unwrap();
        assert_eq!(done, dry);
        let left: Vec<(String, String)> = c
            .prepare("SELECT message_id, host FROM deliveries ORDER BY message_id, host")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        let mut want = vec![
            (shared.clone(), "host-b".to_string()),
            (open.clone(), "host-a".into()),
            (other.clone(), "host-b".into()),
        ];
        want.sort();
        assert_eq!(left, want);
        assert_eq!(count(c, "SELECT count(*) FROM messages"), 3, "only the message host-a alone received went");
        assert_eq!(
            count(c, "SELECT count(*) FROM message_recipients WHERE host = 'host-a'"),
            1,
            "routing rows went with the deliveries; the unsettled one keeps its"
        );
        let audit: (String, String) = c
            .query_row("SELECT subject, reason FROM operator_events WHERE action = 'purge'", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        assert_eq!(audit.0, "host host-a");
        assert!(audit.1.contains("host gone") && audit.1.contains("2 deliveries, 1 message(s)"), "{}", audit.1);
        let after = crate::store::upkeep::verify::check(c).unwrap();
        assert!(after.iter().all(|p| before.contains(p)), "the purge breaks no invariant: {after:?}");

        let again = purge_host(c, "host-a", "op", "again", 8).unwrap();
        assert_eq!((again.deliveries, again.kept), (0, 1));
        assert_eq!(
            count(c, "SELECT count(*) FROM operator_events WHERE action = 'purge'"),
            1,
            "nothing removed, nothing recorded"
        );
    }
}
