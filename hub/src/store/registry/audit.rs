//! The audit log: what operators and the hub did, newest first, from the two places it is
//! recorded — `operator_events` (certificates, hosts, fences, membership, scopes, sessions),
//! which every such change writes with `record_operator_event`, and the delivery transitions
//! made by an operator or by the hub (`delivery_events`). Node transitions, and a delivery's
//! creation at fan-out, are the delivery flow itself, not audit, and are left out.

use crate::store::Store;
use crate::store::engine::Db;
use crate::store::engine::params;
use crate::store::{ActorKind, StoreResult, parse_column};

impl Store {
    /// The newest audit entries matching the query, newest first, and whether more matched.
    pub async fn audit(
        &self,
        since_ms: Option<i64>,
        actor: Option<String>,
        after: Option<AuditCursor>,
        limit: u32,
    ) -> StoreResult<(Vec<AuditEntry>, bool)> {
        self.conns.read(move |c| entries(c, AuditQuery { since_ms, actor: actor.as_deref(), after, limit })).await
    }

    /// Records an operator event in the audit log (a CA change).
    pub async fn record_operator_event(
        &self,
        action: String,
        subject: String,
        operator: String,
        note: Option<String>,
    ) -> StoreResult<()> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| record_operator_event(c, &action, &subject, &operator, note.as_deref(), clock.now_ms()))
            .await
    }
}

/// Records an operator action that is not a delivery transition.
pub fn record_operator_event(
    conn: &dyn Db,
    action: &str,
    subject: &str,
    operator: &str,
    reason: Option<&str>,
    now_ms: i64,
) -> StoreResult<()> {
    conn.prepare_cached(
        "INSERT INTO operator_events (action, subject, operator, reason, at) VALUES ($1, $2, $3, $4, $5)",
    )?
    .execute(params![action, subject, operator, reason, now_ms])?;
    Ok(())
}

/// Where an audit entry is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditSource {
    /// `operator_events`: an action that is not a delivery transition.
    Operator,
    /// `delivery_events`: a delivery transition made by an operator or the hub.
    Delivery,
}

impl AuditSource {
    /// The name shown and sent in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditSource::Operator => "operator_event",
            AuditSource::Delivery => "delivery_event",
        }
    }
}

/// One audited action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// When (unix ms).
    pub at_ms: i64,
    /// Where it is recorded.
    pub source: AuditSource,
    /// Its id in that table.
    pub id: i64,
    /// What was done: an operator action (`enroll_node`, `revoke`, `fence_pause`,
    /// `fence_expired`, …) or a transition (`held -> queued`).
    pub action: String,
    /// What it was done to: a name, a serial, `fence N`, a delivery id.
    pub subject: String,
    /// Operator or hub.
    pub actor_kind: ActorKind,
    /// Who: the operator's name, or `hub`.
    pub actor: String,
    /// Why.
    pub reason: Option<String>,
}

/// Where a page of the audit log ends: the last entry shown (time, source, id), printed as
/// `AT-o-ID` or `AT-d-ID` and given back as `--after` for the next page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditCursor {
    /// The entry's time (unix ms).
    pub at_ms: i64,
    /// Where it is recorded.
    pub source: AuditSource,
    /// Its id in that table.
    pub id: i64,
}

impl AuditCursor {
    /// The cursor after `e`.
    pub fn after(e: &AuditEntry) -> AuditCursor {
        AuditCursor { at_ms: e.at_ms, source: e.source, id: e.id }
    }

    /// Reads a cursor as `fmt::Display` prints it, naming what is wrong.
    pub fn parse(s: &str) -> Result<AuditCursor, String> {
        let bad = || format!("--after {s:?}: not an audit cursor (the `AT-o-ID` or `AT-d-ID` a previous page printed)");
        let mut parts = s.splitn(3, '-');
        let (Some(at), Some(src), Some(id)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        let source = match src {
            "o" => AuditSource::Operator,
            "d" => AuditSource::Delivery,
            _ => return Err(bad()),
        };
        Ok(AuditCursor { at_ms: at.parse().map_err(|_| bad())?, source, id: id.parse().map_err(|_| bad())? })
    }

    fn source_key(self) -> &'static str {
        match self.source {
            AuditSource::Operator => "o",
            AuditSource::Delivery => "d",
        }
    }
}

impl std::fmt::Display for AuditCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}-{}", self.at_ms, self.source_key(), self.id)
    }
}

/// What to read.
#[derive(Debug, Clone, Copy, Default)]
pub struct AuditQuery<'a> {
    /// Only entries at or after this time (unix ms).
    pub since_ms: Option<i64>,
    /// Only entries by this actor.
    pub actor: Option<&'a str>,
    /// Only entries after this one in the log's order (the next page).
    pub after: Option<AuditCursor>,
    /// At most this many.
    pub limit: u32,
}

/// The newest entries matching `q`, newest first, and whether more matched than `limit`.
pub fn entries(conn: &dyn Db, q: AuditQuery<'_>) -> StoreResult<(Vec<AuditEntry>, bool)> {
    let mut rows: Vec<AuditEntry> = conn
        .prepare_cached(
            "SELECT * FROM (
               SELECT at AS at, 'o' AS src, id AS id, action, subject,
                      CASE WHEN operator = 'hub' THEN 'hub' ELSE 'operator' END, operator, reason
                 FROM operator_events
                WHERE (CAST($1 AS BIGINT) IS NULL OR at >= $1) AND (CAST($2 AS TEXT) IS NULL OR operator = $2)
               UNION ALL
               SELECT at, 'd', id, coalesce(from_state, '(new)') || ' -> ' || to_state, delivery_id, actor_kind, actor,
                      reason
                 FROM delivery_events
                WHERE actor_kind IN ('operator', 'hub') AND from_state IS NOT NULL
                  AND (CAST($1 AS BIGINT) IS NULL OR at >= $1) AND (CAST($2 AS TEXT) IS NULL OR actor = $2)) e
             WHERE CAST($3 AS BIGINT) IS NULL OR at < $3 OR (at = $3 AND (src > $4 OR (src = $4 AND id < $5)))
             ORDER BY at DESC, src, id DESC LIMIT $6",
        )?
        .query_map(
            params![
                q.since_ms,
                q.actor,
                q.after.map(|c| c.at_ms),
                q.after.map(AuditCursor::source_key),
                q.after.map(|c| c.id),
                i64::from(q.limit) + 1
            ],
            |r| {
                let id: i64 = r.get(2)?;
                let source = if r.get::<_, String>(1)? == "o" { AuditSource::Operator } else { AuditSource::Delivery };
                let table = match source {
                    AuditSource::Operator => "operator_events",
                    AuditSource::Delivery => "delivery_events",
                };
                Ok(AuditEntry {
                    at_ms: r.get(0)?,
                    source,
                    id,
                    action: r.get(3)?,
                    subject: r.get(4)?,
                    actor_kind: parse_column(r, 5, table, &id.to_string(), "actor kind", ActorKind::parse)?,
                    actor: r.get(6)?,
                    reason: r.get(7)?,
                })
            },
        )?
        .collect::<Result<_, _>>()?;
    let more = rows.len() > q.limit as usize;
    rows.truncate(q.limit as usize);
    Ok((rows, more))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::lifecycle::turns::{Canceller, cancel};
    use crate::store::testing;

    #[test]
    fn operator_and_hub_actions_newest_first_node_transitions_left_out() {
        let db = testing::db();
        let c = &db.conn;
        record_operator_event(c, "enroll_node", "host-a", "alice", None, 10).unwrap();
        accept_one(c, "c", "k", &["host-a"]);
        let d: String = c.query_row("SELECT id FROM deliveries", [], |r| r.get(0)).unwrap();
        cancel(c, &d, Canceller::Operator("bob"), "wrong host", false, 20).unwrap();
        record_operator_event(c, "fence_expired", "fence 1", "hub", Some("its time was up"), 30).unwrap();

        let all = entries(c, AuditQuery { limit: 10, ..Default::default() }).unwrap().0;
        let seen: Vec<(&str, &str, ActorKind)> =
            all.iter().map(|e| (e.action.as_str(), e.actor.as_str(), e.actor_kind)).collect();
        assert_eq!(
            seen,
            [
                ("fence_expired", "hub", ActorKind::Hub),
                ("queued -> failed", "bob", ActorKind::Operator),
                ("enroll_node", "alice", ActorKind::Operator)
            ],
            "a delivery's creation is the flow, not an action: {all:?}"
        );
        let bob = entries(c, AuditQuery { actor: Some("bob"), limit: 10, ..Default::default() }).unwrap().0;
        assert_eq!(bob.len(), 1);
        let (recent, more) = entries(c, AuditQuery { since_ms: Some(15), limit: 1, ..Default::default() }).unwrap();
        assert_eq!((recent.len(), more), (1, true));
    }

    #[test]
    fn pages_follow_one_another_without_gap_or_repeat() {
        let db = testing::db();
        let c = &db.conn;
        // Entries that share a time, from both tables, are ordered and paged exactly.
        for i in 0..5 {
            record_operator_event(c, "enroll_node", &format!("host-{i}"), "alice", None, 10).unwrap();
        }
        accept_one(c, "c", "k", &["host-a"]);
        let d: String = c.query_row("SELECT id FROM deliveries", [], |r| r.get(0)).unwrap();
        cancel(c, &d, Canceller::Operator("bob"), "wrong host", false, 10).unwrap();
        let all = entries(c, AuditQuery { limit: 100, ..Default::default() }).unwrap().0;
        assert_eq!(all.len(), 6);
        let mut paged = Vec::new();
        let mut after = None;
        loop {
            let (page, more) = entries(c, AuditQuery { after, limit: 2, ..Default::default() }).unwrap();
            paged.extend(page.iter().cloned());
            if !more {
                break;
            }
            let cursor = AuditCursor::after(page.last().unwrap());
            assert_eq!(AuditCursor::parse(&cursor.to_string()), Ok(cursor));
            after = Some(cursor);
        }
        assert_eq!(paged, all);
        assert!(AuditCursor::parse("12-x-3").unwrap_err().contains("not an audit cursor"));
    }
}
