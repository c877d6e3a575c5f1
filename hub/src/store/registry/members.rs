//! The membership registry (SPEC §6): which hosts are members of a conversation, as intervals of
//! the conversation's `seq`.
//!
//! A join or a leave is a cursor: the conversation's `last_seq`, read in the transaction that
//! makes the change. A host receives the posts with `join_seq < seq <= leave_seq` (no upper
//! bound while it is a member), so a post and a membership change always order the same way:
//! a post committed before a join is not for the joining host, a post committed before a leave
//! still is. Leave is a hard boundary; a rejoin opens a new interval. Only operators change the
//! registry (through the CLI); nodes cannot.
//!
//! A conversation that never had a member is *open*: any enrolled host may be named in `to`.
//! Once it has had one, `to` may name only current members, and a post without `to` goes to
//! the members at its `seq` (see `accept`).
//!
//! Invariant: a (conversation, host) has at most one open interval, and intervals are never
//! rewritten: a closed interval stays closed, its cursors never move.
//!
//! This module is the registry's door (`Store::members`, `members_change`, the producer's
//! `conversation_for`), exact memberships, and what the registry answers (`authorized`, the
//! views). A pattern's membership is a family (`families`); a non-member `to` may name is a
//! mention grant (`mentions`); what every change checks is in `roster`. The unit tests here
//! walk the whole registry, families and grants included, through the door.

use crate::store::By;
use crate::store::Store;
use crate::store::engine::{Db, OptionalExtension, params};
use crate::store::registry::audit::record_operator_event;
use crate::store::registry::families::{add_family, cursor, open_families, remove_family};
use crate::store::registry::member_pools;
use crate::store::registry::mentions::{MentionRow, allow_mention, disallow_mention, mentions};
pub use crate::store::registry::roster::IntervalRow;
use crate::store::registry::roster::{MemberChange, check_member_count, existing_cursor, name, sorted_unique};
use crate::store::{StoreError, StoreResult};
use baton_shared::wire::{ConversationView, MemberView, MembershipInterval};

/// A membership change's direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    /// The hosts join.
    Join,
    /// The hosts leave.
    Leave,
    /// `to` may name the hosts from now on, though they are not members.
    AllowMention,
    /// `to` may no longer name the hosts (unless they are members).
    DisallowMention,
}

impl Store {
    /// A conversation's `last_seq` and membership registry, for a producer whose publish scope
    /// covers it.
    pub async fn conversation_for(&self, producer: String, conversation: String) -> StoreResult<ConversationView> {
        self.conns
            .read(move |c| {
                crate::store::registry::producers::check_may_post(c, &producer, &conversation)?;
                view(c, &conversation)
            })
            .await
    }

    /// The membership registry: of one conversation, or of all.
    pub async fn members(&self, conversation: Option<String>) -> StoreResult<Vec<ConversationMembers>> {
        self.conns.read(move |c| list(c, conversation.as_deref())).await
    }

    /// Makes pools members of the conversation (`join`) or ends their membership, in one
    /// transaction; one change per pool.
    pub async fn member_pools_change(
        &self,
        join: bool,
        conversation: String,
        pools: Vec<String>,
        by: By,
    ) -> StoreResult<Vec<MemberChange>> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                let now = clock.now_ms();
                let change = if join { member_pools::add } else { member_pools::remove };
                change(c, &conversation, &pools, &by.operator, &by.reason, now)
            })
            .await
    }

    /// The hosts join or leave the conversation, in one transaction; one change per host.
    pub async fn members_change(
        &self,
        direction: Membership,
        conversation: String,
        hosts: Vec<String>,
        by: By,
    ) -> StoreResult<Vec<MemberChange>> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| {
                let now = clock.now_ms();
                match direction {
                    Membership::Join => add(c, &conversation, &hosts, &by.operator, &by.reason, now),
                    Membership::Leave => remove(c, &conversation, &hosts, &by.operator, &by.reason, now),
                    Membership::AllowMention => allow_mention(c, &conversation, &hosts, &by.operator, &by.reason, now),
                    Membership::DisallowMention => {
                        disallow_mention(c, &conversation, &hosts, &by.operator, &by.reason, now)
                    }
                }
            })
            .await
    }
}

/// One host's intervals in one conversation, for the operator.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberRow {
    /// The host.
    pub host: String,
    /// Whether its latest interval is open.
    pub current: bool,
    /// Its intervals, oldest first.
    pub intervals: Vec<IntervalRow>,
}

/// A conversation's registry, for the operator (`members list`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConversationMembers {
    /// The conversation.
    pub conversation: String,
    /// Its `last_seq`.
    pub last_seq: i64,
    /// Every host that is or was a member, by name.
    pub members: Vec<MemberRow>,
    /// Every pool that is or was a member, by name.
    pub pools: Vec<crate::store::registry::member_pools::PoolMemberRow>,
    /// Every mention authorization, current and past, by host then grant cursor.
    pub mentions: Vec<MentionRow>,
}

fn open_interval(conn: &dyn Db, conversation: &str, host: &str) -> StoreResult<Option<i64>> {
    Ok(conn
        .prepare_cached(
            "SELECT join_seq FROM memberships
             WHERE conversation = $1 AND host = $2 AND leave_seq IS NULL AND family IS NULL",
        )?
        .query_row([conversation, host], |r| r.get(0))
        .optional()?)
}

/// Makes `hosts` members of `conversation` from its current `last_seq` on. A host that is
/// already a member is left as it is (`changed: false`). Every host must be enrolled and not
/// retired; all are checked before anything is written. Call inside a write transaction.
pub fn add(
    conn: &dyn Db,
    conversation: &str,
    hosts: &[String],
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<MemberChange>> {
    if conversation.ends_with('*') {
        return add_family(conn, conversation, hosts, operator, reason, now_ms);
    }
    name("conversation", conversation)?;
    let hosts = sorted_unique(hosts)?;
    for host in &hosts {
        crate::store::registry::hosts::require_active(conn, host, "")?;
    }
    let join_seq = cursor(conn, conversation)?;
    let mut out = Vec::with_capacity(hosts.len());
    for host in hosts {
        if let Some(seq) = open_interval(conn, conversation, host)? {
            out.push(MemberChange { host: host.into(), changed: false, seq: Some(seq) });
            continue;
        }
        conn.prepare_cached(
            "INSERT INTO memberships (conversation, host, join_seq, joined_at, joined_by, join_reason)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )?
        .execute(params![conversation, host, join_seq, now_ms, operator, reason])?;
        record_operator_event(
            conn,
            "member_add",
            &format!("conversation {conversation} host {host} after seq {join_seq}"),
            operator,
            Some(reason),
            now_ms,
        )?;
        out.push(MemberChange { host: host.into(), changed: true, seq: Some(join_seq) });
    }
    check_member_count(conn, conversation)?;
    Ok(out)
}

/// Ends the membership of `hosts` in `conversation` at its current `last_seq`: posts up to
/// and including it are still theirs, later ones are not. A host that is not a member is left
/// as it is (`changed: false`); one that was never enrolled is refused, naming it, before
/// anything is written. Call inside a write transaction.
pub fn remove(
    conn: &dyn Db,
    conversation: &str,
    hosts: &[String],
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<MemberChange>> {
    if conversation.ends_with('*') {
        return remove_family(conn, conversation, hosts, operator, reason, now_ms);
    }
    name("conversation", conversation)?;
    let hosts = sorted_unique(hosts)?;
    for host in &hosts {
        let enrolled: bool = conn
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM hosts WHERE name = $1)")?
            .query_row([host], |r| r.get(0))?;
        if !enrolled {
            return Err(StoreError::Invalid(format!("host {host:?} is not enrolled")));
        }
    }
    let leave_seq = existing_cursor(conn, conversation)?;
    let mut out = Vec::with_capacity(hosts.len());
    for host in hosts {
        let n = conn
            .prepare_cached(
                "UPDATE memberships SET leave_seq = $1, left_at = $2, left_by = $3, leave_reason = $4
                 WHERE conversation = $5 AND host = $6 AND leave_seq IS NULL AND family IS NULL",
            )?
            .execute(params![leave_seq, now_ms, operator, reason, conversation, host])?;
        if n == 1 {
            record_operator_event(
                conn,
                "member_remove",
                &format!("conversation {conversation} host {host} after seq {leave_seq}"),
                operator,
                Some(reason),
                now_ms,
            )?;
        }
        out.push(MemberChange { host: host.into(), changed: n == 1, seq: (n == 1).then_some(leave_seq) });
    }
    Ok(out)
}

/// Ends every open membership of `host`, each at its conversation's `last_seq`: what `retire`
/// does to the registry, so a retired host is no member anywhere. Returns the conversations it
/// left, by name. Call inside a write transaction.
pub fn leave_all(conn: &dyn Db, host: &str, operator: &str, reason: &str, now_ms: i64) -> StoreResult<Vec<String>> {
    let conversations = memberships_of(conn, host)?;
    for (_, family_pattern, _) in open_families(conn, Some(host))? {
        remove_family(conn, &family_pattern, &[host.to_string()], operator, reason, now_ms)?;
    }
    let exact: Vec<String> = conn
        .prepare_cached(
            "SELECT conversation FROM memberships WHERE host = $1 AND leave_seq IS NULL AND family IS NULL
             ORDER BY conversation",
        )?
        .query_map([host], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for c in &exact {
        remove(conn, c, &[host.to_string()], operator, reason, now_ms)?;
    }
    let granted: Vec<String> = conn
        .prepare_cached(
            "SELECT conversation FROM mention_grants WHERE host = $1 AND revoke_seq IS NULL ORDER BY conversation",
        )?
        .query_map([host], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for c in &granted {
        disallow_mention(conn, c, &[host.to_string()], operator, reason, now_ms)?;
    }
    Ok(conversations)
}

/// The conversations `host` is a member of now (open intervals), by name: what `leave_all`
/// ends, and what a retirement's plan names before it does.
pub fn memberships_of(conn: &dyn Db, host: &str) -> StoreResult<Vec<String>> {
    Ok(conn
        .prepare_cached(
            "SELECT DISTINCT conversation FROM memberships WHERE host = $1 AND leave_seq IS NULL ORDER BY conversation",
        )?
        .query_map([host], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
}

/// Whether the conversation has ever had a member, a host or a pool (it is then not open any
/// more).
pub fn has_membership(conn: &dyn Db, conversation: &str) -> StoreResult<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM memberships WHERE conversation = $1)
                 OR EXISTS (SELECT 1 FROM conversation_pools WHERE conversation = $1)",
        )?
        .query_row([conversation], |r| r.get(0))?)
}

/// Whether `host` may receive post `seq` of `conversation`: the conversation was open at that
/// seq (no interval had begun before it), or one of the host's intervals holds it, or one of
/// its mention grants does (a delivery exists only for a host the post routed to, and a grant
/// lets only `to` name a non-member, so a grant holding the post authorized that mention).
pub fn authorized(conn: &dyn Db, conversation: &str, host: &str, seq: i64) -> StoreResult<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT (NOT EXISTS (SELECT 1 FROM memberships WHERE conversation = $1 AND join_seq < $2)
                     AND NOT EXISTS (SELECT 1 FROM conversation_pools WHERE conversation = $1 AND join_seq < $2))
                 OR EXISTS (SELECT 1 FROM memberships WHERE conversation = $1 AND host = $3 AND join_seq < $2
                                AND (leave_seq IS NULL OR $2 <= leave_seq))
                 OR EXISTS (SELECT 1 FROM mention_grants WHERE conversation = $1 AND host = $3 AND grant_seq < $2
                                AND (revoke_seq IS NULL OR $2 <= revoke_seq))",
        )?
        .query_row(params![conversation, seq, host], |r| r.get(0))?)
}

fn intervals(conn: &dyn Db, conversation: &str) -> StoreResult<Vec<(String, IntervalRow)>> {
    Ok(conn
        .prepare_cached(
            "SELECT m.host, m.join_seq, m.joined_at, m.joined_by, m.join_reason, m.leave_seq, m.left_at, m.left_by,
                    m.leave_reason, f.pattern
             FROM memberships m LEFT JOIN member_families f ON f.id = m.family
             WHERE m.conversation = $1 ORDER BY m.host, m.join_seq, m.id",
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
                    family: r.get(9)?,
                },
            ))
        })?
        .collect::<Result<_, _>>()?)
}

/// One conversation's registry. `NotFound` when the conversation has neither a message nor a
/// membership change.
pub fn registry(conn: &dyn Db, conversation: &str) -> StoreResult<ConversationMembers> {
    let last_seq = existing_cursor(conn, conversation)?;
    let mut members: Vec<MemberRow> = Vec::new();
    for (host, interval) in intervals(conn, conversation)? {
        match members.last_mut() {
            Some(m) if m.host == host => m.intervals.push(interval),
            _ => members.push(MemberRow { host, current: false, intervals: vec![interval] }),
        }
    }
    for m in &mut members {
        // Several rows (an exact one, families) may hold a host at once: current if any is open.
        m.current = m.intervals.iter().any(|i| i.leave_seq.is_none());
    }
    let mentions = mentions(conn, conversation)?;
    let pools = crate::store::registry::member_pools::rows(conn, conversation)?;
    Ok(ConversationMembers { conversation: conversation.into(), last_seq, members, pools, mentions })
}

/// The registries of every conversation that has (had) members or mention grants, or of the
/// one named.
pub fn list(conn: &dyn Db, conversation: Option<&str>) -> StoreResult<Vec<ConversationMembers>> {
    if let Some(c) = conversation {
        return Ok(vec![registry(conn, c)?]);
    }
    let names: Vec<String> = conn
        .prepare_cached(
            "SELECT conversation FROM memberships UNION SELECT conversation FROM mention_grants
             UNION SELECT conversation FROM conversation_pools ORDER BY 1",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    names.iter().map(|c| registry(conn, c)).collect()
}

/// The producer's view of a conversation (`GET /v1/conversations/{conversation}`): who operated on the
/// registry, and why, stays with the operators.
pub fn view(conn: &dyn Db, conversation: &str) -> StoreResult<ConversationView> {
    let r = registry(conn, conversation)?;
    Ok(ConversationView {
        conversation: r.conversation,
        last_seq: r.last_seq,
        open: r.members.is_empty() && r.pools.is_empty(),
        pools: r.pools.iter().filter(|p| p.current).map(|p| p.pool.clone()).collect(),
        members: r
            .members
            .into_iter()
            .map(|m| MemberView {
                host: m.host,
                current: m.current,
                intervals: m
                    .intervals
                    .into_iter()
                    .map(|i| MembershipInterval {
                        join_seq: i.join_seq,
                        joined_at_ms: i.joined_at_ms,
                        leave_seq: i.leave_seq,
                        left_at_ms: i.left_at_ms,
                    })
                    .collect(),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::{accept_one, accept_only};
    use crate::store::lifecycle::accept::{AcceptLimits, NewMessage, accept, deliveries_of};
    use crate::store::registry::mentions::mention_allowed;
    use crate::store::registry::roster::current_members;
    use crate::store::testing;

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn routed(conn: &dyn Db, message_id: &str) -> Vec<String> {
        deliveries_of(conn, message_id).unwrap().into_iter().filter_map(|d| d.host).collect()
    }

    fn post(conn: &dyn Db, key: &str, to: &[&str]) -> StoreResult<crate::store::lifecycle::accept::Accepted> {
        let msg = NewMessage {
            traceparent: None,
            producer: "prod".into(),
            conversation: "c".into(),
            idempotency_key: key.into(),
            payload: "{}".into(),
            to: hosts(to),
            pools: Vec::new(),
        };
        // In a transaction, as the writer runs it: a refusal leaves nothing behind.
        crate::store::in_write_txn(conn, |c| {
            accept(c, &msg, AcceptLimits { queued_per_host_max: 1000, queued_per_pool_max: 1000 }, 1)
        })
    }

    /// Joins and leaves are cursors at the conversation's `last_seq`; a post goes to the members
    /// whose interval holds its seq; leave is a hard boundary; a rejoin opens a new interval.
    #[test]
    fn intervals_follow_the_conversation_cursor() {
        let db = testing::db();
        let c = &db.conn;
        let added = add(c, "c", &hosts(&["host-a"]), "op", "start", 10).unwrap();
        assert_eq!(added, [MemberChange { host: "host-a".into(), changed: true, seq: Some(0) }]);
        let m1 = accept_one(c, "c", "k1", &[]);
        add(c, "c", &hosts(&["host-b", "host-a"]), "op", "grow", 11).unwrap();
        let m2 = accept_one(c, "c", "k2", &[]);
        let removed = remove(c, "c", &hosts(&["host-a", "host-c"]), "op", "shrink", 12).unwrap();
        assert_eq!(
            removed,
            [
                MemberChange { host: "host-a".into(), changed: true, seq: Some(2) },
                MemberChange { host: "host-c".into(), changed: false, seq: None },
            ]
        );
        let m3 = accept_one(c, "c", "k3", &[]);
        add(c, "c", &hosts(&["host-a"]), "op", "back", 13).unwrap();
        let m4 = accept_one(c, "c", "k4", &[]);
        assert_eq!(routed(c, &m1), ["host-a"]);
        assert_eq!(routed(c, &m2), ["host-a", "host-b"]);
        assert_eq!(routed(c, &m3), ["host-b"], "host-a left after seq 2");
        assert_eq!(routed(c, &m4), ["host-a", "host-b"], "host-a rejoined after seq 3");

        // (join, leave] per host, as the registry records them.
        for (host, seq, member) in [
            ("host-a", 1, true),
            ("host-a", 2, true),
            ("host-a", 3, false),
            ("host-a", 4, true),
            ("host-b", 1, false),
            ("host-b", 2, true),
        ] {
            assert_eq!(authorized(c, "c", host, seq).unwrap(), member, "{host} for seq {seq}");
        }
        let r = registry(c, "c").unwrap();
        assert_eq!(r.last_seq, 4);
        let a = &r.members[0];
        assert!(a.current);
        let cursors: Vec<(i64, Option<i64>)> = a.intervals.iter().map(|i| (i.join_seq, i.leave_seq)).collect();
        assert_eq!(cursors, [(0, Some(2)), (3, None)]);
        assert_eq!(
            (a.intervals[0].left_by.as_deref(), a.intervals[0].leave_reason.as_deref()),
            (Some("op"), Some("shrink"))
        );
        assert_eq!(a.intervals[1].joined_at_ms, 13);
        let v = view(c, "c").unwrap();
        assert!(!v.open);
        assert_eq!(v.members.iter().map(|m| m.host.as_str()).collect::<Vec<_>>(), ["host-a", "host-b"]);
    }

    /// Adding a member again or removing a non-member changes nothing; unknown and retired hosts
    /// and bad names are refused; an unknown conversation is not found.
    #[test]
    fn changes_are_checked_and_idempotent() {
        let db = testing::db();
        let c = &db.conn;
        add(c, "c", &hosts(&["host-a"]), "op", "r", 1).unwrap();
        let again = add(c, "c", &hosts(&["host-a"]), "op", "r", 2).unwrap();
        assert_eq!(again, [MemberChange { host: "host-a".into(), changed: false, seq: Some(0) }]);
        assert!(matches!(add(c, "c", &hosts(&["nobody"]), "op", "r", 3), Err(StoreError::Invalid(_))));
        crate::store::lifecycle::operator::retire(c, "host-c", "op", "r", 3).unwrap();
        let e = add(c, "c", &hosts(&["host-b", "host-c"]), "op", "r", 3).unwrap_err();
        assert!(e.to_string().contains("host-c") && e.to_string().contains("retired"), "{e}");
        assert!(matches!(add(c, "Bad", &hosts(&["host-a"]), "op", "r", 3), Err(StoreError::Invalid(_))));
        assert!(matches!(add(c, "c", &[], "op", "r", 3), Err(StoreError::Invalid(_))));
        assert!(matches!(remove(c, "nope", &hosts(&["host-a"]), "op", "r", 3), Err(StoreError::NotFound(_))));
        let e = remove(c, "c", &hosts(&["host-a", "ghost"]), "op", "r", 3).unwrap_err();
        assert!(matches!(e, StoreError::Invalid(_)) && e.to_string().contains("ghost"), "{e}");
        assert!(matches!(registry(c, "nope"), Err(StoreError::NotFound(_))));
        let events: i64 =
            c.query_row("SELECT count(*) FROM operator_events WHERE action LIKE 'member_%'", [], |r| r.get(0)).unwrap();
        assert_eq!(events, 1, "only the one real change is recorded");
        assert_eq!(list(c, None).unwrap().len(), 1);
    }

    /// Routing at accept: an open conversation keeps `to` as it was and refuses a post without
    /// it; one with members routes a post without `to` to them, accepts only members in `to`,
    /// and refuses a post when no member is left.
    #[test]
    fn accept_routes_by_the_registry() {
        let db = testing::db();
        let c = &db.conn;
        let e = post(c, "k0", &[]).unwrap_err();
        assert!(matches!(e, StoreError::NoRecipients(_)) && e.to_string().contains("\"c\""), "{e}");
        accept_one(c, "c", "k1", &["host-c"]);
        add(c, "c", &hosts(&["host-a", "host-b"]), "op", "r", 1).unwrap();
        let e = post(c, "k2", &["host-a", "host-c"]).unwrap_err();
        assert!(
            matches!(e, StoreError::Invalid(_)) && e.to_string().contains("to[1]") && e.to_string().contains("host-c"),
            "{e}"
        );
        let m = accept_one(c, "c", "k3", &["host-b"]);
        assert_eq!(routed(c, &m), ["host-b"]);
        crate::store::lifecycle::operator::retire(c, "host-b", "op", "r", 2).unwrap();
        let m = accept_one(c, "c", "k4", &[]);
        assert_eq!(routed(c, &m), ["host-a"], "a retired member gets no new work");
        remove(c, "c", &hosts(&["host-a", "host-b"]), "op", "r", 3).unwrap();
        let e = post(c, "k5", &[]).unwrap_err();
        assert!(matches!(e, StoreError::NoRecipients(_)) && e.to_string().contains("no current members"), "{e}");
        assert!(matches!(post(c, "k6", &["host-a"]), Err(StoreError::Invalid(_))), "a former member is not a member");
        // Nothing refused left a trace: seqs 1..=3 only.
        let last: i64 = c.query_row("SELECT last_seq FROM conversations WHERE name = 'c'", [], |r| r.get(0)).unwrap();
        assert_eq!(last, 3);
    }

    #[test]
    fn leave_all_closes_every_open_interval_of_a_host() {
        let db = testing::db();
        let c = &db.conn;
        add(c, "c1", &hosts(&["host-a", "host-b"]), "op", "r", 1).unwrap();
        add(c, "c2", &hosts(&["host-a"]), "op", "r", 1).unwrap();
        accept_one(c, "c2", "k", &[]);
        assert_eq!(leave_all(c, "host-a", "op", "retired", 2).unwrap(), ["c1", "c2"]);
        assert_eq!(current_members(c, "c1").unwrap(), ["host-b"]);
        let r = registry(c, "c2").unwrap();
        assert_eq!(r.members[0].intervals[0].leave_seq, Some(1));
        assert!(!r.members[0].current);
        assert!(leave_all(c, "host-a", "op", "again", 3).unwrap().is_empty());
    }

    fn post_into(conn: &dyn Db, conversation: &str, key: &str) -> StoreResult<Vec<String>> {
        let msg = NewMessage {
            traceparent: None,
            producer: "prod".into(),
            conversation: conversation.into(),
            idempotency_key: key.into(),
            payload: "{}".into(),
            to: vec![],
            pools: Vec::new(),
        };
        let limits = AcceptLimits { queued_per_host_max: 1000, queued_per_pool_max: 1000 };
        let (_, d) = crate::store::lifecycle::accept::accept_and_fan_out(conn, &msg, Default::default(), limits, 1)?;
        Ok(d.into_iter().filter_map(|d| d.host).collect())
    }

    /// A family (`team-*`) makes its hosts members of every conversation it covers from each
    /// one's next post on, those first posted to later included; with an exact row for the
    /// same host it is still one delivery per post; its leave ends it everywhere at once and
    /// leaves the exact row standing; a conversation created after the leave is not covered.
    #[test]
    fn a_family_covers_every_matching_conversation_until_it_leaves() {
        let db = testing::db();
        let c = &db.conn;
        add(c, "team-1", &hosts(&["host-a"]), "op", "exact", 1).unwrap();
        assert_eq!(post_into(c, "team-1", "k0").unwrap(), ["host-a"]);
        let joined = add(c, "team-*", &hosts(&["host-a", "host-b"]), "op", "family", 2).unwrap();
        assert!(joined.iter().all(|j| j.changed && j.seq.is_none()), "{joined:?}");
        assert!(add(c, "team-*", &hosts(&["host-a"]), "op", "again", 2).unwrap().iter().all(|j| !j.changed));
        assert_eq!(post_into(c, "team-1", "k1").unwrap(), ["host-a", "host-b"], "one delivery for host-a");
        assert_eq!(post_into(c, "team-2", "k2").unwrap(), ["host-a", "host-b"], "a new conversation is covered");
        assert!(matches!(post_into(c, "other", "k3"), Err(StoreError::NoRecipients(_))), "not covered");
        assert!(!authorized(c, "team-1", "host-b", 1).unwrap(), "the family joined team-1 after seq 1");
        assert!(authorized(c, "team-1", "host-b", 2).unwrap() && authorized(c, "team-2", "host-b", 1).unwrap());

        let r = registry(c, "team-1").unwrap();
        let families: Vec<Option<&str>> = r.members[0].intervals.iter().map(|i| i.family.as_deref()).collect();
        assert_eq!(families, [None, Some("team-*")], "members list says which row matched");

        let left = remove(c, "team-*", &hosts(&["host-a", "host-c"]), "op", "done", 3).unwrap();
        assert_eq!((left[0].changed, left[1].changed), (true, false));
        assert_eq!(post_into(c, "team-1", "k4").unwrap(), ["host-a", "host-b"], "host-a's exact row stands");
        assert_eq!(post_into(c, "team-2", "k5").unwrap(), ["host-b"], "host-a left team-2 with its family");
        assert!(!authorized(c, "team-2", "host-a", 2).unwrap() && authorized(c, "team-2", "host-a", 1).unwrap());
        remove(c, "team-*", &hosts(&["host-b"]), "op", "done", 4).unwrap();
        assert!(matches!(post_into(c, "team-3", "k6"), Err(StoreError::NoRecipients(_))), "created after the leave");
        assert_eq!(post_into(c, "team-1", "k7").unwrap(), ["host-a"]);
        assert!(matches!(add(c, "te*m-*", &hosts(&["host-a"]), "op", "r", 5), Err(StoreError::Invalid(_))));

        // Retiring a host ends its families.
        add(c, "ops-*", &hosts(&["host-c"]), "op", "r", 6).unwrap();
        assert_eq!(post_into(c, "ops-1", "k8").unwrap(), ["host-c"]);
        leave_all(c, "host-c", "op", "retired", 7).unwrap();
        assert!(matches!(post_into(c, "ops-2", "k9"), Err(StoreError::NoRecipients(_))));
        assert_eq!(crate::store::upkeep::verify::check(c).unwrap(), Vec::new());
    }

    /// Once a conversation has members, `to` may name a non-member only under a mention grant;
    /// the claim counts the grant as the authorization for the posts it holds (also after it
    /// is revoked, as a leave keeps earlier posts), and a grant never makes its host a
    /// recipient of posts without `to`.
    #[test]
    fn a_mention_grant_lets_to_name_a_non_member() {
        let db = testing::db();
        let c = &db.conn;
        add(c, "c", &hosts(&["host-a"]), "op", "r", 1).unwrap();
        let e = post(c, "k1", &["host-b"]).unwrap_err();
        assert!(matches!(e, StoreError::Invalid(_)) && e.to_string().contains("allow-mention"), "{e}");
        let granted = allow_mention(c, "c", &hosts(&["host-b"]), "op", "escalation", 2).unwrap();
        assert_eq!(granted, [MemberChange { host: "host-b".into(), changed: true, seq: Some(0) }]);
        assert!(!allow_mention(c, "c", &hosts(&["host-b"]), "op", "again", 2).unwrap()[0].changed);
        let m1 = accept_one(c, "c", "k2", &["host-b"]);
        assert_eq!(routed(c, &m1), ["host-b"]);
        let m2 = accept_one(c, "c", "k3", &[]);
        assert_eq!(routed(c, &m2), ["host-a"], "a grant is no membership");
        let revoked = disallow_mention(c, "c", &hosts(&["host-b"]), "op", "done", 3).unwrap();
        assert_eq!(revoked, [MemberChange { host: "host-b".into(), changed: true, seq: Some(2) }]);
        assert!(!disallow_mention(c, "c", &hosts(&["host-b"]), "op", "done", 3).unwrap()[0].changed);
        assert!(matches!(post(c, "k4", &["host-b"]), Err(StoreError::Invalid(_))));
        assert!(authorized(c, "c", "host-b", 1).unwrap() && !authorized(c, "c", "host-b", 3).unwrap());
        let got = crate::store::lifecycle::claim::claim(c, "host-b", "i", 10, 4).unwrap();
        assert_eq!(got.len(), 1, "the post made under the grant is handed out, not failed `not a member`");
        assert_eq!(got[0].seq, 1);
        let r = registry(c, "c").unwrap();
        let g = &r.mentions[0];
        assert_eq!((g.host.as_str(), g.grant_seq, g.revoke_seq), ("host-b", 0, Some(2)));
        assert_eq!((g.grant_reason.as_str(), g.revoke_reason.as_deref()), ("escalation", Some("done")));
        assert!(r.members.iter().all(|m| m.host != "host-b"));
        let e = allow_mention(c, "c", &hosts(&["ghost"]), "op", "r", 5).unwrap_err();
        assert!(e.to_string().contains("ghost"), "{e}");
        // Retiring a host (`leave_all`, in the retiring transaction) ends its grants too.
        allow_mention(c, "c", &hosts(&["host-c"]), "op", "r", 5).unwrap();
        leave_all(c, "host-c", "op", "gone", 6).unwrap();
        assert!(!mention_allowed(c, "c", "host-c").unwrap());
    }

    /// A post and a membership change made in either order land on the same side of the cursor:
    /// the post accepted before the leave is still the leaving host's, the one after is not.
    #[test]
    fn a_leave_between_two_posts_splits_them() {
        let db = testing::db();
        let c = &db.conn;
        add(c, "c", &hosts(&["host-a", "host-b"]), "op", "r", 1).unwrap();
        let before = accept_only(c, "c", "k1", &[]);
        remove(c, "c", &hosts(&["host-b"]), "op", "r", 2).unwrap();
        let after = accept_only(c, "c", "k2", &[]);
        crate::store::lifecycle::accept::fan_out(c, &after, 3).unwrap();
        crate::store::lifecycle::accept::fan_out(c, &before, 3).unwrap();
        assert_eq!(routed(c, &before), ["host-a", "host-b"]);
        assert_eq!(routed(c, &after), ["host-a"]);
        let got = crate::store::lifecycle::claim::claim(c, "host-b", "i", 10, 4).unwrap();
        assert_eq!(got.len(), 1, "host-b still gets the post from before its leave");
        assert_eq!(got[0].seq, 1);
    }
}
