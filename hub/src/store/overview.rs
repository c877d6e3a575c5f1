//! What the operator listener shows that the other read modules do not: the backlog per host
//! and per conversation with the age of the oldest waiting delivery, current-run outcome
//! counts, and the recent deliveries that failed or ended `unknown`. Read-only: every function
//! here runs on a read connection. "Waiting" is queued or held, as in `host_backlog`.

use super::StoreResult;
use super::db::Db;
use super::read::{DeliveryRow, delivery_row};
use baton_shared::states::Outcome;
use rusqlite::named_params;

/// Most conversations the status page lists in its backlog (deepest first).
pub const CONVERSATIONS_SHOWN_MAX: u32 = 50;
/// Most recent failed or `unknown` deliveries the status page lists.
pub const TROUBLE_SHOWN_MAX: u32 = 30;

/// One host's backlog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBacklog {
    /// The host.
    pub host: String,
    /// Deliveries waiting for it (queued or held), as `host_backlog` counts them.
    pub waiting: i64,
    /// When its oldest waiting delivery was created (unix ms); `None` when none waits.
    pub oldest_created_at_ms: Option<i64>,
}

/// The backlog of every host that is enrolled or has ever had a delivery waiting, by name. A
/// host with nothing waiting is listed with zero, so a gauge built from it drops to zero
/// rather than keeping its last value. Costs one indexed look-up per host, however deep the
/// backlog.
pub fn host_backlogs(conn: &dyn Db) -> StoreResult<Vec<HostBacklog>> {
    let mut rows: Vec<HostBacklog> = conn
        .prepare_cached(
            "SELECT n.host, coalesce((SELECT waiting FROM host_backlog b WHERE b.host = n.host), 0)
             FROM (SELECT name AS host FROM hosts UNION SELECT host FROM host_backlog) n ORDER BY n.host",
        )?
        .query_map([], |r| Ok(HostBacklog { host: r.get(0)?, waiting: r.get(1)?, oldest_created_at_ms: None }))?
        .collect::<Result<_, _>>()?;
    // Queue order (`n`) is creation order, so the first waiting row of each state is the oldest.
    let mut oldest = conn.prepare_cached(
        "SELECT min(created_at) FROM (
             SELECT created_at FROM (SELECT created_at FROM deliveries WHERE host = :h AND state = 'queued' ORDER BY n LIMIT 1) q
             UNION ALL
             SELECT created_at FROM (SELECT created_at FROM deliveries WHERE host = :h AND state = 'held' ORDER BY n LIMIT 1) h
         ) f",
    )?;
    for row in &mut rows {
        if row.waiting > 0 {
            row.oldest_created_at_ms = oldest.query_row(named_params! {":h": row.host}, |r| r.get(0))?;
        }
    }
    Ok(rows)
}

/// One conversation's backlog, over every host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversationBacklog {
    /// The conversation.
    pub conversation: String,
    /// Deliveries waiting (queued or held).
    pub waiting: i64,
    /// Of them, held.
    pub held: i64,
    /// How many hosts they wait for.
    pub hosts: i64,
    /// When the oldest of them was created (unix ms).
    pub oldest_created_at_ms: i64,
}

/// The conversations with deliveries waiting, deepest first (then by name), at most `max`.
pub fn conversation_backlogs(conn: &dyn Db, max: u32) -> StoreResult<Vec<ConversationBacklog>> {
    Ok(conn
        .prepare_cached(
            "SELECT conversation, count(*), sum(CASE WHEN state = 'held' THEN 1 ELSE 0 END), count(DISTINCT host), min(created_at)
             FROM deliveries WHERE state IN ('queued', 'held')
             GROUP BY conversation ORDER BY count(*) DESC, conversation LIMIT :max",
        )?
        .query_map(named_params! {":max": max}, |r| {
            Ok(ConversationBacklog {
                conversation: r.get(0)?,
                waiting: r.get(1)?,
                held: r.get(2)?,
                hosts: r.get(3)?,
                oldest_created_at_ms: r.get(4)?,
            })
        })?
        .collect::<Result<_, _>>()?)
}

/// Every outcome, in the order the counts are given.
pub const OUTCOMES: [Outcome; 4] = [Outcome::Succeeded, Outcome::Failed, Outcome::Unknown, Outcome::Cancelled];

/// How many deliveries' current run ended with each outcome (outcomes with none included, as
/// zero), in `OUTCOMES` order.
pub fn outcome_counts(conn: &dyn Db) -> StoreResult<Vec<(Outcome, i64)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT count(*) FROM deliveries d JOIN attempts a ON a.delivery_id = d.id AND a.attempt = d.attempt
         WHERE a.outcome = :o",
    )?;
    let mut out = Vec::with_capacity(OUTCOMES.len());
    for o in OUTCOMES {
        out.push((o, stmt.query_row(named_params! {":o": o.as_str()}, |r| r.get(0))?));
    }
    Ok(out)
}

/// The most recently changed deliveries that failed or ended `unknown` (the delivery's state,
/// or its current run's outcome), newest first, at most `max`.
pub fn recent_trouble(conn: &dyn Db, max: u32) -> StoreResult<Vec<DeliveryRow>> {
    Ok(conn
        .prepare_cached(
            concat!(
                "SELECT d.id, d.message_id, d.host, d.conversation, d.seq, d.state, d.instance_id, d.reason, d.updated_at, ",
                super::read::outcome_sql!(),
                "
             FROM deliveries d
             WHERE d.state IN ('failed', 'unknown')
                OR EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt
                                                      AND a.outcome IN ('failed', 'unknown'))
             ORDER BY d.updated_at DESC, d.n DESC LIMIT :max"
            ),
        )?
        .query_map(named_params! {":max": max}, delivery_row)?
        .collect::<Result<_, _>>()?)
}

/// How many deliveries ended `unknown` at or after `since_ms`: the delivery's state (retired
/// while mirrored), or its current run's outcome (started, end not known). What `status` flags:
/// a turn that may or may not have run wants an operator's look. An operator's read: it scans
/// the attempts (no index serves the hot path for this).
pub fn unknown_since(conn: &dyn Db, since_ms: i64) -> StoreResult<i64> {
    Ok(conn
        .prepare_cached(
            "SELECT count(*) FROM (
                 SELECT d.id FROM deliveries d WHERE d.state = 'unknown' AND d.updated_at >= :since
                 UNION
                 SELECT a.delivery_id FROM attempts a JOIN deliveries d ON d.id = a.delivery_id AND d.attempt = a.attempt
                 WHERE a.outcome = 'unknown' AND a.reported_at >= :since
             ) u",
        )?
        .query_row(named_params! {":since": since_ms}, |r| r.get(0))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::accept::testing::accept_one;
    use crate::store::hosts::{Issued, enroll};
    use crate::store::testing;
    use baton_shared::ids::Role;

    #[test]
    fn backlogs_count_waiting_deliveries_per_host_and_conversation_with_their_oldest() {
        let db = testing::db();
        let c = &db.conn;
        enroll(
            c,
            Issued { role: Role::Node, name: "host-idle", serial: "s1", not_after_unix: 10_000 },
            "op",
            "enrolled",
            1,
        )
        .unwrap();
        accept_one(c, "c1", "k1", &["host-a", "host-b"]);
        accept_one(c, "c1", "k2", &["host-a"]);
        accept_one(c, "c2", "k3", &["host-a"]);
        c.execute("UPDATE deliveries SET created_at = 1000 + n", []).unwrap();
        let first_b: String = c.query_row("SELECT id FROM deliveries WHERE host = 'host-b'", [], |r| r.get(0)).unwrap();
        c.execute("UPDATE deliveries SET state = 'held' WHERE id = ?1; ", [&first_b]).unwrap();

        let hosts = host_backlogs(c).unwrap();
        let seen: Vec<(&str, i64, bool)> =
            hosts.iter().map(|h| (h.host.as_str(), h.waiting, h.oldest_created_at_ms.is_some())).collect();
        assert_eq!(seen, [("host-a", 3, true), ("host-b", 1, true), ("host-c", 0, false), ("host-idle", 0, false)]);
        let a_oldest: i64 =
            c.query_row("SELECT min(created_at) FROM deliveries WHERE host = 'host-a'", [], |r| r.get(0)).unwrap();
        assert_eq!(hosts[0].oldest_created_at_ms, Some(a_oldest));

        let convs = conversation_backlogs(c, 10).unwrap();
        let seen: Vec<(&str, i64, i64, i64)> =
            convs.iter().map(|b| (b.conversation.as_str(), b.waiting, b.held, b.hosts)).collect();
        assert_eq!(seen, [("c1", 3, 1, 2), ("c2", 1, 0, 1)]);
        assert_eq!(conversation_backlogs(c, 1).unwrap().len(), 1, "the bound holds");
        assert!(recent_trouble(c, 10).unwrap().is_empty());
        assert!(outcome_counts(c).unwrap().iter().all(|(_, n)| *n == 0));
    }

    #[test]
    fn trouble_is_a_failed_or_unknown_state_or_current_outcome_newest_first() {
        let db = testing::db();
        let c = &db.conn;
        for k in ["k1", "k2", "k3"] {
            accept_one(c, "c", k, &["host-a"]);
        }
        let ids: Vec<String> = c
            .prepare("SELECT id FROM deliveries ORDER BY n")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        c.execute(
            "UPDATE deliveries SET state = 'failed', reason = 'blocked', updated_at = 5 WHERE id = ?1",
            [&ids[0]],
        )
        .unwrap();
        c.execute(
            "UPDATE deliveries SET state = 'delivered', instance_id = 'i', claim_token = 't', updated_at = 7
             WHERE id = ?1",
            [&ids[1]],
        )
        .unwrap();
        let attempt: i64 =
            c.query_row("SELECT attempt FROM deliveries WHERE id = ?1", [&ids[1]], |r| r.get(0)).unwrap();
        c.execute(
            "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, reported_at, attempt)
             VALUES ('att-1', ?1, 'host-a', 'i', 'r1', 'h', 'unknown', 7, ?2)",
            rusqlite::params![ids[1], attempt],
        )
        .unwrap();
        let trouble: Vec<String> = recent_trouble(c, 10).unwrap().into_iter().map(|r| r.delivery_id).collect();
        assert_eq!(trouble, [ids[1].clone(), ids[0].clone()]);
        let unknown = outcome_counts(c).unwrap().into_iter().find(|(o, _)| *o == Outcome::Unknown).unwrap();
        assert_eq!(unknown.1, 1);
        // `status` counts the current run's `unknown` from its report's time on, and a delivery
        // whose state is `unknown` from its change.
        assert_eq!((unknown_since(c, 7).unwrap(), unknown_since(c, 8).unwrap()), (1, 0));
        c.execute(
            "UPDATE deliveries SET state = 'unknown', reason = 'host retired', updated_at = 9 WHERE id = ?1",
            [&ids[0]],
        )
        .unwrap();
        assert_eq!(
            (unknown_since(c, 7).unwrap(), unknown_since(c, 9).unwrap(), unknown_since(c, 10).unwrap()),
            (2, 1, 0)
        );
    }
}
