//! Pools as members of a conversation (SPEC §6 with pools): `members add --conversation C
//! --pool NAME` makes a pool a member from the conversation's next post on, `members remove
//! ... --pool NAME` ends it after its last post. A post without `to` or `pools` reaches the
//! member hosts and one host of each current member pool; a conversation with a member pool is
//! managed as one with a member host is. Every change is audited.

use crate::store::engine::{Db, OptionalExtension, params};
use crate::store::registry::audit::record_operator_event;
use crate::store::registry::families::cursor;
use crate::store::registry::roster::{IntervalRow, MemberChange, existing_cursor, name, sorted_unique};
use crate::store::{StoreError, StoreResult};

/// One pool's membership of a conversation, as `members list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PoolMemberRow {
    /// The pool.
    pub pool: String,
    /// Whether its latest interval is open (it receives posts without `to` or `pools`).
    pub current: bool,
    /// Its intervals, oldest first.
    pub intervals: Vec<IntervalRow>,
}

/// Makes `pools` members of `conversation` from its current `last_seq` on. A pool already a
/// member is left as it is (`changed: false`); a pool that does not exist is refused, naming
/// it, before anything is written. Call inside a write transaction.
pub fn add(
    conn: &dyn Db,
    conversation: &str,
    pools: &[String],
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<MemberChange>> {
    if conversation.ends_with('*') {
        return Err(StoreError::Invalid(format!(
            "conversation: {conversation:?} is a family; pools are members of one conversation at a time"
        )));
    }
    name("conversation", conversation)?;
    let pools = sorted_unique(pools)?;
    for pool in &pools {
        require_pool(conn, pool)?;
    }
    let join_seq = cursor(conn, conversation)?;
    let mut out = Vec::with_capacity(pools.len());
    for pool in pools {
        let open: Option<i64> = conn
            .prepare_cached(
                "SELECT join_seq FROM conversation_pools WHERE conversation = $1 AND pool = $2 AND leave_seq IS NULL",
            )?
            .query_row([conversation, pool], |r| r.get(0))
            .optional()?;
        if let Some(seq) = open {
            out.push(MemberChange { host: pool.into(), changed: false, seq: Some(seq) });
            continue;
        }
        conn.prepare_cached(
            "INSERT INTO conversation_pools (conversation, pool, join_seq, joined_at, joined_by, join_reason)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )?
        .execute(params![conversation, pool, join_seq, now_ms, operator, reason])?;
        let what = format!("conversation {conversation} pool {pool} after seq {join_seq}");
        record_operator_event(conn, "member_pool_add", &what, operator, Some(reason), now_ms)?;
        out.push(MemberChange { host: pool.into(), changed: true, seq: Some(join_seq) });
    }
    Ok(out)
}

/// Ends the membership of `pools` in `conversation` at its current `last_seq`. A pool that is
/// not a member is left as it is (`changed: false`). Call inside a write transaction.
pub fn remove(
    conn: &dyn Db,
    conversation: &str,
    pools: &[String],
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<MemberChange>> {
    name("conversation", conversation)?;
    let pools = sorted_unique(pools)?;
    for pool in &pools {
        require_pool(conn, pool)?;
    }
    let leave_seq = existing_cursor(conn, conversation)?;
    let mut out = Vec::with_capacity(pools.len());
    for pool in pools {
        let n = conn
            .prepare_cached(
                "UPDATE conversation_pools SET leave_seq = $1, left_at = $2, left_by = $3, leave_reason = $4
                 WHERE conversation = $5 AND pool = $6 AND leave_seq IS NULL",
            )?
            .execute(params![leave_seq, now_ms, operator, reason, conversation, pool])?;
        if n == 1 {
            let what = format!("conversation {conversation} pool {pool} after seq {leave_seq}");
            record_operator_event(conn, "member_pool_remove", &what, operator, Some(reason), now_ms)?;
        }
        out.push(MemberChange { host: pool.into(), changed: n == 1, seq: (n == 1).then_some(leave_seq) });
    }
    Ok(out)
}

fn require_pool(conn: &dyn Db, pool: &str) -> StoreResult<()> {
    name("pool", pool)?;
    if !crate::store::registry::pools::exists(conn, pool)? {
        return Err(StoreError::Invalid(format!(
            "pool {pool:?} does not exist (an operator makes one with `baton-hub pools add`)"
        )));
    }
    Ok(())
}

/// The pools that are members of `conversation` now, by name.
pub fn current(conn: &dyn Db, conversation: &str) -> StoreResult<Vec<String>> {
    Ok(conn
        .prepare_cached(
            "SELECT pool FROM conversation_pools WHERE conversation = $1 AND leave_seq IS NULL ORDER BY pool",
        )?
        .query_map([conversation], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
}

/// Every pool that is or was a member of `conversation`, with its intervals.
pub fn rows(conn: &dyn Db, conversation: &str) -> StoreResult<Vec<PoolMemberRow>> {
    let intervals: Vec<(String, IntervalRow)> = conn
        .prepare_cached(
            "SELECT pool, join_seq, joined_at, joined_by, join_reason, leave_seq, left_at, left_by, leave_reason
             FROM conversation_pools WHERE conversation = $1 ORDER BY pool, join_seq, id",
        )?
        .query_map([conversation], |r| {
            Ok((
                r.get(0)?,
                IntervalRow {
                    join_seq: r.get(1)?,
                    joined_at_ms: r.get(2)?,
                    joined_by: r.get(3)?,
                    join_reason: r.get(4)?,
                    leave_seq: r.get(5)?,
                    left_at_ms: r.get(6)?,
                    left_by: r.get(7)?,
                    leave_reason: r.get(8)?,
                    family: None,
                },
            ))
        })?
        .collect::<Result<_, _>>()?;
    let mut out: Vec<PoolMemberRow> = Vec::new();
    for (pool, interval) in intervals {
        match out.last_mut() {
            Some(row) if row.pool == pool => row.intervals.push(interval),
            _ => out.push(PoolMemberRow { pool, current: false, intervals: vec![interval] }),
        }
    }
    for row in &mut out {
        row.current = row.intervals.iter().any(|i| i.leave_seq.is_none());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::{AcceptLimits, NewMessage, RetryPolicy, accept_and_fan_out};
    use crate::store::testing;
    use baton_shared::wire::DeliverySummary;

    const BIG: AcceptLimits = AcceptLimits { queued_per_host_max: 1000, queued_per_pool_max: 1000 };

    fn post(c: &dyn Db, key: &str, to: &[&str]) -> StoreResult<Vec<DeliverySummary>> {
        let m = NewMessage {
            producer: "prod".into(),
            conversation: "c".into(),
            idempotency_key: key.into(),
            payload: "{}".into(),
            to: to.iter().map(|s| s.to_string()).collect(),
            pools: Vec::new(),
            traceparent: None,
        };
        // In a transaction, as the writer runs it: a refusal leaves nothing behind.
        Ok(crate::store::in_write_txn(c, |c| accept_and_fan_out(c, &m, RetryPolicy::default(), BIG, 2))?.1)
    }

    fn recipients(ds: &[DeliverySummary]) -> Vec<(Option<&str>, Option<&str>)> {
        ds.iter().map(|d| (d.host.as_deref(), d.pool.as_deref())).collect()
    }

    /// A member pool receives the posts without `to` or `pools` made while it is a member,
    /// beside the member hosts; it makes the conversation managed; changes are audited and
    /// shown in the registry and the producers' view.
    #[test]
    fn a_member_pool_receives_posts_without_recipients() {
        let db = testing::db();
        let c = &*db.conn;
        crate::store::registry::pools::add(c, "gpu", &["host-a".into()], "op", "r", 1).unwrap();
        let e = add(c, "c", &["nope".into()], "op", "r", 1).unwrap_err();
        assert!(matches!(&e, StoreError::Invalid(m) if m.contains("nope")), "{e:?}");
        let changed = add(c, "c", &["gpu".into()], "op", "more hands", 1).unwrap();
        assert!(changed[0].changed && changed[0].seq == Some(0));
        assert!(!add(c, "c", &["gpu".into()], "op", "again", 1).unwrap()[0].changed);
        assert_eq!(recipients(&post(c, "k1", &[]).unwrap()), [(None, Some("gpu"))]);
        let e = post(c, "k2", &["host-b"]).unwrap_err();
        assert!(matches!(&e, StoreError::Invalid(m) if m.contains("not a member")), "a pool member manages it: {e:?}");
        crate::store::registry::members::add(c, "c", &["host-b".into()], "op", "r", 3).unwrap();
        assert_eq!(recipients(&post(c, "k3", &[]).unwrap()), [(Some("host-b"), None), (None, Some("gpu"))]);
        let view = crate::store::registry::members::view(c, "c").unwrap();
        assert_eq!((view.open, view.pools.as_slice()), (false, ["gpu".to_string()].as_slice()));
        assert!(remove(c, "c", &["gpu".into()], "op", "done", 4).unwrap()[0].changed);
        assert_eq!(recipients(&post(c, "k4", &[]).unwrap()), [(Some("host-b"), None)]);
        let rows = rows(c, "c").unwrap();
        assert_eq!(
            (rows[0].current, rows[0].intervals[0].join_seq, rows[0].intervals[0].leave_seq),
            (false, 0, Some(2))
        );
        let audited: i64 = c
            .query_row("SELECT count(*) FROM operator_events WHERE action LIKE 'member_pool_%'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(audited, 2);
        assert!(crate::store::upkeep::verify::check(c).unwrap().is_empty());
    }
}
