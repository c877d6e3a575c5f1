//! Membership families (`member_families`): `members add --conversation 'support-*' HOST`
//! makes a host a member of every conversation the pattern covers (the publish scopes' grammar,
//! `producers::check_pattern`), each from its next post on: the join writes an interval
//! (marked with its family) for each matching conversation that exists, at its `last_seq`; a
//! matching conversation created later gets one from 0 (`adopt_families`, in the transaction
//! that creates it, which every new conversation's first cursor goes through: `cursor`); the
//! leave closes them all, each at its `last_seq`. A host matched by several rows (a family and
//! an exact one) is still one recipient per post. The intervals are the registry's (see
//! `members` for their invariant).

use crate::store::engine::{Db, params};
use crate::store::registry::audit::record_operator_event;
use crate::store::registry::roster::{MemberChange, check_member_count, sorted_unique};
use crate::store::{StoreError, StoreResult};

/// Most open family rows (pattern, host) the registry may hold: a post into a new conversation
/// reads them all (`adopt_families`), so this bounds that read.
pub const MEMBER_FAMILIES_MAX: usize = 64;

/// The conversation's `last_seq`, creating the conversation (at 0, adopting the open families
/// that cover it) if it has no message yet.
pub(crate) fn cursor(conn: &dyn Db, conversation: &str) -> StoreResult<i64> {
    adopt_families(conn, conversation)?;
    Ok(conn
        .prepare_cached(
            "INSERT INTO conversations (name, last_seq) VALUES ($1, 0)
             ON CONFLICT (name) DO UPDATE SET last_seq = conversations.last_seq RETURNING last_seq",
        )?
        .query_row([conversation], |r| r.get(0))?)
}

/// Refuses a family's conversation pattern that is not a prefix and `*`.
pub(crate) fn pattern(value: &str) -> StoreResult<()> {
    crate::store::registry::producers::check_pattern(value)
        .map_err(|e| StoreError::Invalid(format!("conversation: {e}")))
        .and_then(|()| match value.ends_with('*') {
            true => Ok(()),
            false => Err(StoreError::Invalid(format!("conversation: {value:?} is not a pattern"))),
        })
}

/// The open family rows `(id, pattern)` of the registry, or of one host.
pub(crate) fn open_families(conn: &dyn Db, host: Option<&str>) -> StoreResult<Vec<(i64, String, String)>> {
    Ok(conn
        .prepare_cached(
            "SELECT id, pattern, host FROM member_families
             WHERE left_at IS NULL AND (CAST($1 AS TEXT) IS NULL OR host = $1) ORDER BY id",
        )?
        .query_map([host], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?)
}

pub(crate) fn insert_family_interval(conn: &dyn Db, conversation: &str, join_seq: i64, family: i64) -> StoreResult<()> {
    // The family row carries who and why; each interval repeats them for `members list`.
    conn.prepare_cached(
        "INSERT INTO memberships (conversation, host, join_seq, joined_at, joined_by, join_reason, family)
         SELECT CAST($1 AS TEXT), host, CAST($2 AS BIGINT), joined_at, joined_by, join_reason, id
         FROM member_families WHERE id = $3",
    )?
    .execute(params![conversation, join_seq, family])?;
    Ok(())
}

/// Makes a new conversation's first cursor: when no row names `conversation` yet and an open
/// family covers it, creates it (at 0) and gives each such family's host an interval from 0,
/// so a conversation first posted to after a family join is covered from its first post. Does
/// nothing for a conversation that exists or that no family covers. Call inside a write
/// transaction, before the conversation is created otherwise.
pub fn adopt_families(conn: &dyn Db, conversation: &str) -> StoreResult<()> {
    let exists: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM conversations WHERE name = $1)")?
        .query_row([conversation], |r| r.get(0))?;
    if !exists {
        adopt_families_of_new(conn, conversation)?;
    }
    Ok(())
}

/// `adopt_families` for a conversation the caller read has no row yet (in this transaction):
/// whether any family covered it (it now exists, with their intervals).
pub(crate) fn adopt_families_of_new(conn: &dyn Db, conversation: &str) -> StoreResult<bool> {
    let covering: Vec<(i64, String, String)> = open_families(conn, None)?
        .into_iter()
        .filter(|(_, p, _)| crate::store::registry::producers::covers(p, conversation))
        .collect();
    if covering.is_empty() {
        return Ok(false);
    }
    conn.prepare_cached("INSERT INTO conversations (name, last_seq) VALUES ($1, 0)")?.execute([conversation])?;
    for (family, _, host) in &covering {
        if crate::store::registry::hosts::standing(conn, host)? == crate::store::registry::hosts::Standing::Active {
            insert_family_interval(conn, conversation, 0, *family)?;
        }
    }
    check_member_count(conn, conversation)?;
    Ok(true)
}

/// `add` for a pattern: a family row per host, and an interval from its `last_seq` in every
/// existing conversation the pattern covers. Reads every conversation's name (an operator's
/// rare change, not a post's path). Call inside a write transaction.
pub(crate) fn add_family(
    conn: &dyn Db,
    family_pattern: &str,
    hosts: &[String],
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<MemberChange>> {
    pattern(family_pattern)?;
    let hosts = sorted_unique(hosts)?;
    for host in &hosts {
        crate::store::registry::hosts::require_active(conn, host, "")?;
    }
    let matched: Vec<(String, i64)> = conn
        .prepare_cached("SELECT name, last_seq FROM conversations ORDER BY name")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<Vec<(String, i64)>, _>>()?
        .into_iter()
        .filter(|(c, _)| crate::store::registry::producers::covers(family_pattern, c))
        .collect();
    let mut out = Vec::with_capacity(hosts.len());
    for host in hosts {
        let open = open_families(conn, Some(host))?.into_iter().any(|(_, p, _)| p == family_pattern);
        if open {
            out.push(MemberChange { host: host.into(), changed: false, seq: None });
            continue;
        }
        let family: i64 = conn
            .prepare_cached(
                "INSERT INTO member_families (pattern, host, joined_at, joined_by, join_reason)
                 VALUES ($1, $2, $3, $4, $5) RETURNING id",
            )?
            .query_row(params![family_pattern, host, now_ms, operator, reason], |r| r.get(0))?;
        for (conversation, last_seq) in &matched {
            insert_family_interval(conn, conversation, *last_seq, family)?;
        }
        record_operator_event(
            conn,
            "member_family_add",
            &format!("pattern {family_pattern} host {host} ({} conversations so far)", matched.len()),
            operator,
            Some(reason),
            now_ms,
        )?;
        out.push(MemberChange { host: host.into(), changed: true, seq: None });
    }
    if open_families(conn, None)?.len() > MEMBER_FAMILIES_MAX {
        return Err(StoreError::OverCapacity(format!(
            "the registry would hold more than {MEMBER_FAMILIES_MAX} open membership families"
        )));
    }
    for (conversation, _) in &matched {
        check_member_count(conn, conversation)?;
    }
    Ok(out)
}

/// `remove` for a pattern: closes each host's family row and every interval it holds, each at
/// its conversation's `last_seq`; conversations created later are not covered. Call inside a
/// write transaction.
pub(crate) fn remove_family(
    conn: &dyn Db,
    family_pattern: &str,
    hosts: &[String],
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<MemberChange>> {
    pattern(family_pattern)?;
    let hosts = sorted_unique(hosts)?;
    for host in &hosts {
        if crate::store::registry::hosts::standing(conn, host)? == crate::store::registry::hosts::Standing::NotEnrolled
        {
            return Err(StoreError::Invalid(format!("host {host:?} is not enrolled")));
        }
    }
    let mut out = Vec::with_capacity(hosts.len());
    for host in hosts {
        let family = open_families(conn, Some(host))?.into_iter().find(|(_, p, _)| p == family_pattern);
        let Some((family, _, _)) = family else {
            out.push(MemberChange { host: host.into(), changed: false, seq: None });
            continue;
        };
        conn.prepare_cached("UPDATE member_families SET left_at = $1, left_by = $2, leave_reason = $3 WHERE id = $4")?
            .execute(params![now_ms, operator, reason, family])?;
        let closed = conn
            .prepare_cached(
                "UPDATE memberships SET leave_seq = (SELECT last_seq FROM conversations WHERE name = memberships.conversation),
                        left_at = $1, left_by = $2, leave_reason = $3
                 WHERE family = $4 AND leave_seq IS NULL",
            )?
            .execute(params![now_ms, operator, reason, family])?;
        record_operator_event(
            conn,
            "member_family_remove",
            &format!("pattern {family_pattern} host {host} ({closed} conversations)"),
            operator,
            Some(reason),
            now_ms,
        )?;
        out.push(MemberChange { host: host.into(), changed: true, seq: None });
    }
    Ok(out)
}
