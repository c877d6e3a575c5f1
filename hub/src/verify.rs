//! Offline invariant check of a hub database (`baton-hub verify`): the same rules the fault
//! checker applies to the hub's side. Returns a readable list of every problem found.

use crate::store::ActorKind;
use crate::store::transition::allowed;
use crate::store::{StoreError, StoreResult};
use baton_shared::states::DeliveryState;
use rusqlite::Connection;

fn list(conn: &Connection, sql: &str, what: &str, out: &mut Vec<String>) -> StoreResult<()> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
    for r in rows {
        out.push(format!("{what}: {}", r?));
    }
    Ok(())
}

/// Checks every hub-side invariant; an empty list means none is violated.
pub fn check(conn: &Connection) -> StoreResult<Vec<String>> {
    let mut out = Vec::new();
    let integrity: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    if integrity != "ok" {
        out.push(format!("integrity: {integrity}"));
    }
    list(conn, "SELECT \"table\" || ' row ' || rowid FROM pragma_foreign_key_check", "foreign key broken", &mut out)?;
    list(
        conn,
        "SELECT id FROM messages m WHERE NOT EXISTS (SELECT 1 FROM fanout_obligations o WHERE o.message_id = m.id)",
        "atomic accept: message without a fan-out obligation",
        &mut out,
    )?;
    list(
        conn,
        "SELECT id FROM messages m WHERE NOT EXISTS (SELECT 1 FROM message_recipients r WHERE r.message_id = m.id)",
        "atomic accept: message without routing",
        &mut out,
    )?;
    list(
        conn,
        "SELECT r.message_id || ' -> ' || r.host FROM message_recipients r JOIN fanout_obligations o ON o.message_id = r.message_id
         WHERE o.done_at IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = r.message_id AND d.host = r.host)",
        "fan-out: obligation done but a recipient has no delivery",
        &mut out,
    )?;
    list(
        conn,
        "SELECT d.id FROM deliveries d
         WHERE NOT EXISTS (SELECT 1 FROM message_recipients r WHERE r.message_id = d.message_id AND r.host = d.host)",
        "fan-out: delivery for a host the message was not routed to",
        &mut out,
    )?;
    list(
        conn,
        "SELECT a.id || ' on ' || d.id || ' (' || d.state || ')' FROM attempts a JOIN deliveries d ON d.id = a.delivery_id
         WHERE d.state <> 'delivered'",
        "attempt on a delivery that was never delivered",
        &mut out,
    )?;
    list(
        conn,
        "SELECT c.name FROM conversations c WHERE c.last_seq < (SELECT max(seq) FROM messages m WHERE m.conversation = c.name)",
        "conversation sequence behind its messages",
        &mut out,
    )?;
    list(
        conn,
        "SELECT h.name || ': recorded ' || coalesce(b.waiting, 0) || ', actual ' ||
                (SELECT count(*) FROM deliveries d WHERE d.host = h.name AND d.state IN ('queued', 'held'))
         FROM hosts h LEFT JOIN host_backlog b ON b.host = h.name
         WHERE coalesce(b.waiting, 0) <> (SELECT count(*) FROM deliveries d WHERE d.host = h.name AND d.state IN ('queued', 'held'))",
        "host backlog count out of step",
        &mut out,
    )?;
    check_event_chains(conn, &mut out)?;
    Ok(out)
}

/// Every delivery's events form a path in the SPEC §2 table from creation to its current state.
fn check_event_chains(conn: &Connection, out: &mut Vec<String>) -> StoreResult<()> {
    let mut stmt = conn.prepare(
        "SELECT d.id, d.state, e.from_state, e.to_state, e.actor_kind FROM deliveries d
         LEFT JOIN delivery_events e ON e.delivery_id = d.id ORDER BY d.id, e.id",
    )?;
    let mut rows = stmt.query([])?;
    let mut current: Option<(String, String, Option<String>)> = None; // id, state, last to
    let finish = |cur: &Option<(String, String, Option<String>)>, out: &mut Vec<String>| {
        if let Some((id, state, last)) = cur
            && last.as_deref() != Some(state.as_str())
        {
            out.push(format!("event log: delivery {id} is {state} but its last event says {last:?}"));
        }
    };
    while let Some(r) = rows.next()? {
        let id: String = r.get(0)?;
        let state: String = r.get(1)?;
        let from: Option<String> = r.get(2)?;
        let to: Option<String> = r.get(3)?;
        let kind: Option<String> = r.get(4)?;
        if current.as_ref().map(|c| &c.0) != Some(&id) {
            finish(&current, out);
            current = Some((id.clone(), state.clone(), None));
            if to.is_none() {
                out.push(format!("event log: delivery {id} has no events"));
                continue;
            }
            if from.is_some() || to.as_deref() != Some("queued") || kind.as_deref() != Some("hub") {
                out.push(format!("event log: delivery {id} does not start with its creation by the hub"));
            }
        } else {
            let prev = current.as_ref().and_then(|c| c.2.clone());
            if from != prev {
                out.push(format!("event log: delivery {id} jumps from {prev:?} to an event from {from:?}"));
            }
            let parsed = (
                from.as_deref().and_then(DeliveryState::parse),
                to.as_deref().and_then(DeliveryState::parse),
                match kind.as_deref() {
                    Some("hub") => Some(ActorKind::Hub),
                    Some("node") => Some(ActorKind::Node),
                    Some("operator") => Some(ActorKind::Operator),
                    _ => None,
                },
            );
            match parsed {
                (Some(f), Some(t), Some(k)) if allowed(f, t, k) => {}
                _ => out.push(format!("illegal transition: delivery {id} {from:?} -> {to:?} by {kind:?}")),
            }
        }
        if let Some(c) = current.as_mut() {
            c.2 = to;
        }
    }
    finish(&current, out);
    Ok(())
}

impl From<StoreError> for String {
    fn from(e: StoreError) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::accept::testing::accept_one;
    use crate::store::claim::{self, FenceKind, FenceScope};
    use crate::store::operator::{self, Selector};
    use crate::store::testing;
    use crate::store::transition::Holder;

    #[test]
    fn a_legal_history_verifies_and_each_breakage_is_named() {
        let db = testing::db();
        let c = &db.conn;
        accept_one(c, "a", "k1", &["host-a", "host-b"]);
        let held = accept_one(c, "b", "k2", &["host-a"]);
        operator::fence_set(c, FenceKind::Hold, FenceScope::Conversation, Some("b"), "op", "r", 1).unwrap();
        let got = claim::claim(c, "host-a", "i", 10, 2).unwrap();
        let h = Holder { instance_id: "i", claim_token: &got[0].claim_token };
        claim::mirrored(c, "host-a", &got[0].delivery_id, h, 3).unwrap();
        claim::ack(c, "host-a", &got[0].delivery_id, h, 4).unwrap();
        operator::release(c, Selector::Conversation("b"), "op", "r", 5).unwrap();
        operator::retire(c, "host-b", "op", "r", 6).unwrap();
        assert_eq!(check(c).unwrap(), Vec::<String>::new());
        assert!(!held.is_empty());

        // A state changed behind the event log's back is found, and so is a broken backlog count.
        c.execute("UPDATE deliveries SET state = 'failed', reason = 'x' WHERE message_id = ?1", [&held]).unwrap();
        let problems = check(c).unwrap();
        assert!(problems.iter().any(|p| p.starts_with("event log:")), "{problems:?}");
        assert!(problems.iter().any(|p| p.starts_with("host backlog")), "{problems:?}");
        // A delivery missing from a completed fan-out is found.
        c.execute("DELETE FROM deliveries WHERE host = 'host-b'", []).unwrap();
        let problems = check(c).unwrap();
        assert!(problems.iter().any(|p| p.starts_with("fan-out: obligation done")), "{problems:?}");
    }
}
