//! What the hub's periodic gauges read from the record, in one snapshot (`gather`). Every
//! figure here reuses the definition `status` and the status page use: the backlog and the
//! outcome counts of `overview`, the silent hosts of `fleet::silent_hosts` (the same
//! `host_silence_warn` rule `attention` flags), the running turns of `overview::running_turns`,
//! the certificates that matter of `fleet::expiring_certificates` and the active fences of
//! `fences`. Read-only: every function here runs on a read connection.

use crate::store::Store;
use crate::store::StoreResult;
use crate::store::engine::Db;
use crate::store::engine::params;
use crate::store::registry::fences::{self, FenceScope};
use crate::store::views::fleet;
use crate::store::views::overview::{self, HostBacklog};
use baton_shared::ids::Role;
use baton_shared::states::Outcome;
use std::time::Duration;

impl Store {
    /// What the periodic gauges read at `now_ms`, in one snapshot (`gather`), flagging
    /// hosts silent longer than `silence` as `status` does.
    pub async fn record_gauges(&self, now_ms: i64, silence: Duration) -> StoreResult<RecordGauges> {
        let silence_ms = i64::try_from(silence.as_millis()).unwrap_or(i64::MAX);
        self.conns.read(move |c| gather(c, now_ms, silence_ms)).await
    }
}

/// The record's side of the gauges at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordGauges {
    /// Each host's backlog (`overview::host_backlogs`), by name.
    pub backlogs: Vec<HostBacklog>,
    /// Deliveries by current-run outcome (`overview::outcome_counts`).
    pub outcomes: Vec<(Outcome, i64)>,
    /// Hosts silent longer than the warning (`fleet::silent_hosts`), by name.
    pub silent: Vec<String>,
    /// Each host (not retired) whose node ever opened a session, with its newest session's last
    /// contact (unix ms), by name.
    pub contacts: Vec<(String, i64)>,
    /// How many turns run now (`overview::running_turns`).
    pub running: i64,
    /// When the longest-running of them started (unix ms).
    pub oldest_running_started_ms: Option<i64>,
    /// How many of them run on a silent host (its node stopped renewing them).
    pub running_silent: i64,
    /// When the held delivery first in queue order was created (unix ms).
    pub oldest_held_created_ms: Option<i64>,
    /// Active fences per scope, every scope listed (zero included).
    pub fences: Vec<(FenceScope, i64)>,
    /// Per role, the earliest expiry (unix seconds) among the certificates that matter: for
    /// each name in use, its longest-lasting unrevoked certificate (`fleet::expiring_certificates`);
    /// `None` when the role has none.
    pub cert_expiry: Vec<(Role, Option<i64>)>,
    /// Each pool, by name: its queued deliveries and the oldest one's creation (`pools::show`).
    pub pools: Vec<crate::store::registry::pools::PoolSummary>,
}

/// Reads the gauges at `now_ms`, flagging hosts silent longer than `silence_ms`.
pub fn gather(conn: &dyn Db, now_ms: i64, silence_ms: i64) -> StoreResult<RecordGauges> {
    // Running turns per host, counted once: the total, the earliest start and the silent
    // hosts' share all come from it.
    let running_by_host = overview::running_by_host(conn)?;
    let certs = fleet::expiring_certificates(conn, i64::MAX)?;
    let cert_expiry = [Role::Node, Role::Producer]
        .into_iter()
        .map(|role| (role, certs.iter().filter(|c| c.role == role).map(|c| c.not_after_unix).min()))
        .collect();
    let silent: Vec<String> = fleet::silent_hosts(conn, now_ms, silence_ms)?.into_iter().map(|h| h.host).collect();
    let running_silent = running_by_host.iter().filter(|(host, _, _)| silent.contains(host)).map(|(_, n, _)| n).sum();
    Ok(RecordGauges {
        backlogs: overview::host_backlogs(conn)?,
        outcomes: overview::outcome_counts(conn)?,
        silent,
        running_silent,
        contacts: contacts(conn)?,
        running: running_by_host.iter().map(|(_, n, _)| n).sum(),
        oldest_running_started_ms: running_by_host.iter().map(|(_, _, at)| *at).min(),
        oldest_held_created_ms: oldest_held(conn)?,
        fences: fences::active_counts_by_scope(conn)?,
        cert_expiry,
        pools: crate::store::registry::pools::list(conn)?,
    })
}

/// Each host (not retired) with its newest session's last contact, by name: the session
/// `fleet::silent_hosts` judges.
fn contacts(conn: &dyn Db) -> StoreResult<Vec<(String, i64)>> {
    Ok(conn
        .prepare_cached(
            "SELECT s.host, s.last_contact_at FROM node_sessions s JOIN hosts h ON h.name = s.host
             WHERE h.retired_at IS NULL
               AND s.session = (SELECT max(session) FROM node_sessions m WHERE m.host = s.host)
             ORDER BY s.host",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?)
}

/// When the held delivery first in queue order was created: one step of the state index.
fn oldest_held(conn: &dyn Db) -> StoreResult<Option<i64>> {
    let mut stmt =
        conn.prepare_cached("SELECT created_at FROM deliveries WHERE state = $1 ORDER BY state, n LIMIT 1")?;
    let mut rows = stmt.query_map(params!["held"], |r| r.get::<_, i64>(0))?;
    Ok(rows.next().transpose()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::registry::hosts::{Issued, enroll};
    use crate::store::testing;

    /// A node session of each host, last heard from at the given moment (unix ms).
    fn sessions(c: &dyn Db, last_contacts: &[(&str, i64)]) {
        for (host, last) in last_contacts {
            c.execute(
                "INSERT INTO node_sessions (host, session, instance_id, node_version, started_at, last_contact_at)
                 VALUES ($1, 1, 'i', '0.1.0', $2, $2)",
                params![host, last],
            )
            .unwrap();
        }
    }

    /// A pool's queued deliveries and the oldest one's creation reach the gauges.
    #[test]
    fn the_gauges_read_each_pool_s_queue() {
        let db = testing::db();
        let c = &*db.conn;
        crate::store::registry::pools::add(c, "gpu", &["host-a".into()], "op", "r", 1).unwrap();
        let msg = crate::store::lifecycle::accept::NewMessage {
            producer: "prod".into(),
            conversation: "c".into(),
            idempotency_key: "k".into(),
            payload: "{}".into(),
            to: Vec::new(),
            traceparent: None,
            pools: vec!["gpu".into()],
        };
        let limits = crate::store::lifecycle::accept::AcceptLimits { queued_per_host_max: 10, queued_per_pool_max: 10 };
        let retry = crate::store::lifecycle::accept::RetryPolicy::default();
        crate::store::lifecycle::accept::accept_and_fan_out(c, &msg, retry, limits, 7).unwrap();
        let g = gather(c, 10, 1_000).unwrap();
        assert_eq!(g.pools.len(), 1);
        assert_eq!((g.pools[0].name.as_str(), g.pools[0].queued, g.pools[0].oldest_queued_at_ms), ("gpu", 1, Some(7)));
    }

    /// Running turns on two hosts (one silent), a finished one and one not started: the total,
    /// the earliest start and the silent host's share come from one count per host, and the
    /// outcomes of the current runs from one grouped count, a retried run's old outcome left out.
    #[test]
    fn the_gauges_count_running_turns_per_host_and_outcomes_once() {
        let db = testing::db();
        let c = &db.conn;
        sessions(c, &[("host-a", 1_000), ("host-b", 90_000)]);
        let mut ids = Vec::new();
        for (k, host) in [("k1", "host-a"), ("k2", "host-b"), ("k3", "host-b"), ("k4", "host-a"), ("k5", "host-a")] {
            accept_one(c, "c", k, &[host]);
            ids.push(
                c.query_row("SELECT id FROM deliveries ORDER BY n DESC LIMIT 1", [], |r| r.get::<_, String>(0))
                    .unwrap(),
            );
        }
        // k1 runs on host-a (silent) since 500, k2 on host-b since 300, k3 on host-b since 800;
        // k4 finished (failed) on host-a; k5 is delivered, not started. k2 is its second run:
        // its first ended `unknown`, which no longer counts.
        for (id, started, attempt) in [
            (&ids[0], Some(500), 1),
            (&ids[1], Some(300), 2),
            (&ids[2], Some(800), 1),
            (&ids[3], Some(100), 1),
            (&ids[4], None, 1),
        ] {
            c.execute(
                "UPDATE deliveries SET state = 'delivered', instance_id = 'i', claim_token = 't', started_at = $2,
                        started_session = $3, attempt = $4 WHERE id = $1",
                params![id, started, started.map(|_| 1i64), attempt],
            )
            .unwrap();
        }
        for (att, id, outcome, attempt) in [("a1", &ids[3], "failed", 1), ("a2", &ids[1], "unknown", 1)] {
            c.execute(
                "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, reported_at, attempt)
                 VALUES ($1, $2, 'host-a', 'i', $1, 'h', $3, 700, $4)",
                params![att, id, outcome, attempt],
            )
            .unwrap();
        }
        let g = gather(c, 100_000, 60_000).unwrap();
        assert_eq!(g.silent, ["host-a"]);
        assert_eq!(g.running, 3);
        assert_eq!(g.oldest_running_started_ms, Some(300));
        assert_eq!(g.running_silent, 1, "k1 runs on the silent host");
        let count = |o: Outcome| g.outcomes.iter().find(|(x, _)| *x == o).unwrap().1;
        assert_eq!(g.outcomes.len(), overview::OUTCOMES.len());
        assert_eq!((count(Outcome::Failed), count(Outcome::Unknown), count(Outcome::Succeeded)), (1, 0, 0));
    }

    #[test]
    fn the_gauges_read_what_status_reads() {
        let db = testing::db();
        let c = &db.conn;
        for (name, serial, not_after) in [("host-a", "a1", 5_000), ("host-b", "b1", 9_000)] {
            enroll(c, Issued { role: Role::Node, name, serial, not_after_unix: not_after }, "op", "enrolled", 1)
                .unwrap();
        }
        sessions(c, &[("host-a", 1_000), ("host-b", 90_000)]);
        accept_one(c, "c", "k1", &["host-a"]);
        let g = gather(c, 100_000, 60_000).unwrap();
        assert_eq!(g.silent, ["host-a"], "host-b was heard from 10 s ago");
        assert_eq!(g.contacts, [("host-a".to_string(), 1_000), ("host-b".to_string(), 90_000)]);
        assert_eq!(g.cert_expiry, [(Role::Node, Some(5_000)), (Role::Producer, None)]);
        assert_eq!(g.running, 0);
        assert_eq!(g.oldest_running_started_ms, None);
        assert_eq!(g.oldest_held_created_ms, None);
        assert!(g.fences.iter().all(|(_, n)| *n == 0), "{:?}", g.fences);
        assert_eq!(g.fences.len(), FenceScope::ALL.len());
        let a = g.backlogs.iter().find(|b| b.host == "host-a").unwrap();
        assert_eq!(a.waiting, 1);
    }
}
