//! Pools: named sets of hosts kept by operators (`baton-hub pools add|remove|list|show`). A
//! message addressed to a pool is one delivery any member may claim. Membership is the
//! operators' alone (a node cannot assert its own), each change audited in `operator_events`;
//! retiring a host removes it from every pool (`leave_all`, in the retire's transaction).

use crate::store::Store;
use crate::store::engine::{Db, OptionalExtension, params};
use crate::store::registry::audit::record_operator_event;
use crate::store::registry::hosts::{self, Standing};
use crate::store::registry::roster::{name, sorted_unique};
use crate::store::{By, StoreError, StoreResult};

/// Most member hosts one pool may have: every member's claim reads the pool's queues, and the
/// operator's views list every member.
pub const POOL_MEMBERS_MAX: usize = 256;

/// What one `add` or `remove` did for one host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PoolChange {
    /// The host.
    pub host: String,
    /// False when nothing changed (already a member, or not a member).
    pub changed: bool,
}

/// A pool as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PoolSummary {
    /// The pool's name.
    pub name: String,
    /// When it was made (its first member added), unix ms.
    pub created_at_ms: i64,
    /// Its member hosts, by name.
    pub members: Vec<String>,
    /// Its deliveries waiting to be claimed.
    pub queued: i64,
    /// When the oldest of them was made (unix ms), if any waits: the oldest head of its
    /// conversations' queues (within a conversation the lowest `seq` was made first, but for a
    /// fan-out that ran a moment out of order).
    pub oldest_queued_at_ms: Option<i64>,
    /// Its deliveries claimed, mirrored, or delivered without an outcome of their run
    /// (`pool_queues.in_flight`, as the claim keeps it).
    pub in_flight: i64,
    /// Conversations with a turn in flight on one member (`pool_queues.bound_host`): their next
    /// turns go to that host.
    pub bound_conversations: i64,
}

impl Store {
    /// The hosts join (`add`) or leave the pool, in one transaction; one change per host.
    pub async fn pool_members_change(
        &self,
        add_hosts: bool,
        pool: String,
        hosts: Vec<String>,
        by: By,
    ) -> StoreResult<Vec<PoolChange>> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                let now = clock.now_ms();
                if add_hosts {
                    add(c, &pool, &hosts, &by.operator, &by.reason, now)
                } else {
                    remove(c, &pool, &hosts, &by.operator, &by.reason, now)
                }
            })
            .await
    }

    /// The pools `host` is a member of now, by name.
    pub async fn pools_of_host(&self, host: String) -> StoreResult<Vec<String>> {
        self.conns.read(move |c| pools_of(c, &host)).await
    }

    /// Every pool, by name.
    pub async fn pools(&self) -> StoreResult<Vec<PoolSummary>> {
        self.conns.read(list).await
    }

    /// One pool, or `NotFound`.
    pub async fn pool(&self, pool: String) -> StoreResult<PoolSummary> {
        self.conns.read(move |c| show(c, &pool)).await
    }
}

/// Whether the pool exists.
pub fn exists(conn: &dyn Db, pool: &str) -> StoreResult<bool> {
    Ok(conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM pools WHERE name = $1)")?.query_row([pool], |r| r.get(0))?)
}

/// The pools `host` is a member of, by name (read with the rest of a host's view, `fleet`).
pub use crate::store::views::fleet::pools_of;

/// The pool's member hosts, by name.
pub fn members(conn: &dyn Db, pool: &str) -> StoreResult<Vec<String>> {
    Ok(conn
        .prepare_cached("SELECT host FROM pool_members WHERE pool = $1 ORDER BY host")?
        .query_map([pool], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
}

/// Makes `hosts` members of `pool`, making the pool when it does not exist. Each host must be
/// enrolled and not retired (refused, naming it, before anything is written); one already a
/// member is left as it is (`changed: false`). Call inside a write transaction.
pub fn add(
    conn: &dyn Db,
    pool: &str,
    hosts: &[String],
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<PoolChange>> {
    name("pool", pool)?;
    let hosts = sorted_unique(hosts)?;
    for host in &hosts {
        hosts::require_active(conn, host, "")?;
    }
    if !exists(conn, pool)? {
        conn.prepare_cached("INSERT INTO pools (name, created_at, created_by) VALUES ($1, $2, $3)")?
            .execute(params![pool, now_ms, operator])?;
        record_operator_event(conn, "pool_create", &format!("pool {pool}"), operator, Some(reason), now_ms)?;
    }
    let mut out = Vec::with_capacity(hosts.len());
    for host in hosts {
        let added = conn
            .prepare_cached(
                "INSERT INTO pool_members (pool, host, added_at, added_by) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (pool, host) DO NOTHING",
            )?
            .execute(params![pool, host, now_ms, operator])?;
        if added > 0 {
            record_operator_event(
                conn,
                "pool_add",
                &format!("pool {pool} host {host}"),
                operator,
                Some(reason),
                now_ms,
            )?;
        }
        out.push(PoolChange { host: host.into(), changed: added > 0 });
    }
    let count = members(conn, pool)?.len();
    if count > POOL_MEMBERS_MAX {
        return Err(StoreError::OverCapacity(format!(
            "pool {pool} would have {count} members; at most {POOL_MEMBERS_MAX} are allowed"
        )));
    }
    Ok(out)
}

/// Removes `hosts` from `pool`: from the next claim on they take none of its work (what a
/// host already claimed stays its own). A host that is not a member is left as it is
/// (`changed: false`); an unknown pool is `NotFound`, a host never enrolled `Invalid`. Call
/// inside a write transaction.
pub fn remove(
    conn: &dyn Db,
    pool: &str,
    hosts: &[String],
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<PoolChange>> {
    name("pool", pool)?;
    let hosts = sorted_unique(hosts)?;
    if !exists(conn, pool)? {
        return Err(StoreError::NotFound(format!("no pool {pool:?}")));
    }
    for host in &hosts {
        if hosts::standing(conn, host)? == Standing::NotEnrolled {
            return Err(StoreError::Invalid(format!("host {host:?} is not enrolled")));
        }
    }
    let mut out = Vec::with_capacity(hosts.len());
    for host in hosts {
        let removed = leave(conn, pool, host, operator, reason, now_ms)?;
        out.push(PoolChange { host: host.into(), changed: removed });
    }
    Ok(out)
}

/// Removes `host` from `pool` and audits it; whether it was a member.
fn leave(conn: &dyn Db, pool: &str, host: &str, operator: &str, reason: &str, now_ms: i64) -> StoreResult<bool> {
    let removed =
        conn.prepare_cached("DELETE FROM pool_members WHERE pool = $1 AND host = $2")?.execute(params![pool, host])?;
    if removed > 0 {
        record_operator_event(
            conn,
            "pool_remove",
            &format!("pool {pool} host {host}"),
            operator,
            Some(reason),
            now_ms,
        )?;
    }
    Ok(removed > 0)
}

/// Removes `host` from every pool (retire), audited; the pools it left, by name. Call inside
/// the retire's write transaction.
pub fn leave_all(conn: &dyn Db, host: &str, operator: &str, reason: &str, now_ms: i64) -> StoreResult<Vec<String>> {
    let pools = pools_of(conn, host)?;
    for pool in &pools {
        leave(conn, pool, host, operator, reason, now_ms)?;
    }
    Ok(pools)
}

/// Every pool, by name.
pub fn list(conn: &dyn Db) -> StoreResult<Vec<PoolSummary>> {
    let names: Vec<String> = conn
        .prepare_cached("SELECT name FROM pools ORDER BY name")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    names.iter().map(|p| show(conn, p)).collect()
}

/// One pool with its members and its work, or `NotFound`.
pub fn show(conn: &dyn Db, pool: &str) -> StoreResult<PoolSummary> {
    let created_at_ms: i64 = conn
        .prepare_cached("SELECT created_at FROM pools WHERE name = $1")?
        .query_row([pool], |r| r.get(0))
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("no pool {pool:?}")))?;
    // Every count from the pool's queue rows (one per conversation that ever had work in it),
    // kept in step by the claim, `pool_flight` and the triggers: no scan of its deliveries.
    let (queued, in_flight, bound_conversations): (i64, i64, i64) = conn
        .prepare_cached(
            "SELECT coalesce(sum(queued), 0), coalesce(sum(in_flight), 0),
                    coalesce(sum(CASE WHEN in_flight > 0 THEN 1 ELSE 0 END), 0)
             FROM pool_queues WHERE pool = $1",
        )?
        .query_row([pool], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    // The oldest queued delivery is the head (lowest `seq`) of one of the conversations' queues:
    // one indexed look-up per conversation with queued work, not a read of the whole backlog.
    let oldest_queued_at_ms: Option<i64> = conn
        .prepare_cached(
            "SELECT min((SELECT d.created_at FROM deliveries d
                         WHERE d.pool = q.pool AND d.conversation = q.conversation AND d.state = 'queued'
                         ORDER BY d.seq LIMIT 1))
             FROM pool_queues q WHERE q.pool = $1 AND q.queued > 0",
        )?
        .query_row([pool], |r| r.get(0))?;
    Ok(PoolSummary {
        name: pool.into(),
        created_at_ms,
        members: members(conn, pool)?,
        queued,
        oldest_queued_at_ms,
        in_flight,
        bound_conversations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn actions(conn: &dyn Db) -> Vec<(String, String, String)> {
        conn.prepare("SELECT action, subject, reason FROM operator_events WHERE action LIKE 'pool%' ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn add_makes_the_pool_and_members_each_change_audited() {
        let db = testing::db();
        let c = &*db.conn;
        let out = add(c, "gpu", &hosts(&["host-b", "host-a", "host-a"]), "op", "more hands", 5).unwrap();
        assert_eq!(
            out,
            vec![
                PoolChange { host: "host-a".into(), changed: true },
                PoolChange { host: "host-b".into(), changed: true }
            ]
        );
        let again = add(c, "gpu", &hosts(&["host-a"]), "op", "again", 6).unwrap();
        assert!(!again[0].changed, "already a member: unchanged");
        assert_eq!(members(c, "gpu").unwrap(), hosts(&["host-a", "host-b"]));
        assert_eq!(pools_of(c, "host-a").unwrap(), hosts(&["gpu"]));
        let s = show(c, "gpu").unwrap();
        assert_eq!((s.created_at_ms, s.queued, s.in_flight, s.oldest_queued_at_ms), (5, 0, 0, None));
        assert_eq!(
            actions(c),
            vec![
                ("pool_create".into(), "pool gpu".into(), "more hands".into()),
                ("pool_add".into(), "pool gpu host host-a".into(), "more hands".into()),
                ("pool_add".into(), "pool gpu host host-b".into(), "more hands".into()),
            ]
        );

        let out = remove(c, "gpu", &hosts(&["host-a", "host-c"]), "op", "less", 7).unwrap();
        assert_eq!(out.iter().map(|c| c.changed).collect::<Vec<_>>(), vec![true, false]);
        assert_eq!(members(c, "gpu").unwrap(), hosts(&["host-b"]));
        assert_eq!(actions(c).last().unwrap(), &("pool_remove".into(), "pool gpu host host-a".into(), "less".into()));
        assert_eq!(list(c).unwrap().len(), 1);
    }

    #[test]
    fn bad_names_unknown_hosts_and_pools_are_refused_before_anything_is_written() {
        let db = testing::db();
        let c = &*db.conn;
        let e = add(c, "Bad Pool", &hosts(&["host-a"]), "op", "r", 1).unwrap_err();
        assert!(matches!(&e, StoreError::Invalid(m) if m.contains("pool")), "{e:?}");
        let e = add(c, "gpu", &hosts(&["host-a", "nobody"]), "op", "r", 1).unwrap_err();
        assert!(e.to_string().contains("nobody"), "{e}");
        assert!(!exists(c, "gpu").unwrap(), "nothing written");
        let e = remove(c, "gpu", &hosts(&["host-a"]), "op", "r", 1).unwrap_err();
        assert!(matches!(&e, StoreError::NotFound(m) if m.contains("gpu")), "{e:?}");
        assert!(matches!(show(c, "gpu"), Err(StoreError::NotFound(_))));
        assert!(add(c, "gpu", &[], "op", "r", 1).is_err(), "at least one host");
    }

    #[test]
    fn retiring_a_host_removes_it_from_its_pools_audited() {
        let db = testing::db();
        let c = &*db.conn;
        add(c, "gpu", &hosts(&["host-a", "host-b"]), "op", "r", 1).unwrap();
        add(c, "cpu", &hosts(&["host-a"]), "op", "r", 1).unwrap();
        let (_, _, left) = crate::store::lifecycle::operator::retire_everywhere(c, "host-a", "op", "gone", 2).unwrap();
        assert_eq!(left, hosts(&["cpu", "gpu"]));
        assert!(pools_of(c, "host-a").unwrap().is_empty());
        assert_eq!(members(c, "gpu").unwrap(), hosts(&["host-b"]));
        let gone = actions(c).into_iter().filter(|(a, _, why)| a == "pool_remove" && why == "gone").count();
        assert_eq!(gone, 2);
        let e = add(c, "gpu", &hosts(&["host-a"]), "op", "r", 3).unwrap_err();
        assert!(e.to_string().contains("retired"), "a retired host joins no pool: {e}");
    }
}
