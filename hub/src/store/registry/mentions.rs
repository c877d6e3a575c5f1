//! Mention authorizations (`mention_grants`, `members allow-mention|disallow-mention`): an
//! operator may let `to` name a host that is not a member, with a reason, audited. A grant has
//! cursors as an interval has (`grant_seq < seq <= revoke_seq`) and the claim's re-check
//! (`members::authorized`) counts it as authorization for a post it holds; it never makes the
//! host a recipient of a post without `to`. The registry's invariant holds for grants too: at
//! most one open grant per (conversation, host), never rewritten.

use crate::store::engine::{Db, OptionalExtension, params};
use crate::store::registry::audit::record_operator_event;
use crate::store::registry::families::cursor;
use crate::store::registry::roster::{MemberChange, existing_cursor, name, sorted_unique};
use crate::store::{StoreError, StoreResult};

/// One mention authorization as the operator sees it: cursors, when, who and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MentionRow {
    /// The host `to` may name.
    pub host: String,
    /// The grant cursor: posts after it may name the host.
    pub grant_seq: i64,
    /// When (unix ms).
    pub granted_at_ms: i64,
    /// Which operator.
    pub granted_by: String,
    /// Why.
    pub grant_reason: String,
    /// The revoke cursor, once revoked: posts after it may not name the host.
    pub revoke_seq: Option<i64>,
    /// When it was revoked (unix ms).
    pub revoked_at_ms: Option<i64>,
    /// Which operator revoked it.
    pub revoked_by: Option<String>,
    /// Why.
    pub revoke_reason: Option<String>,
}

/// Lets `to` name `hosts` in `conversation` from its current `last_seq` on, though they are
/// not members. A host already allowed is left as it is (`changed: false`). Every host must be
/// enrolled and not retired; all are checked before anything is written. Call inside a write
/// transaction.
pub fn allow_mention(
    conn: &dyn Db,
    conversation: &str,
    hosts: &[String],
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<MemberChange>> {
    name("conversation", conversation)?;
    let hosts = sorted_unique(hosts)?;
    for host in &hosts {
        crate::store::registry::hosts::require_active(conn, host, "")?;
    }
    let grant_seq = cursor(conn, conversation)?;
    let mut out = Vec::with_capacity(hosts.len());
    for host in hosts {
        if let Some(seq) = open_grant(conn, conversation, host)? {
            out.push(MemberChange { host: host.into(), changed: false, seq: Some(seq) });
            continue;
        }
        conn.prepare_cached(
            "INSERT INTO mention_grants (conversation, host, grant_seq, granted_at, granted_by, grant_reason)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )?
        .execute(params![conversation, host, grant_seq, now_ms, operator, reason])?;
        record_operator_event(
            conn,
            "mention_allow",
            &format!("conversation {conversation} host {host} after seq {grant_seq}"),
            operator,
            Some(reason),
            now_ms,
        )?;
        out.push(MemberChange { host: host.into(), changed: true, seq: Some(grant_seq) });
    }
    Ok(out)
}

/// Ends the mention authorization of `hosts` in `conversation` at its current `last_seq`:
/// posts up to it keep theirs (the claim still hands them out), later ones may not name the
/// hosts. A host without one is left as it is (`changed: false`); one never enrolled is
/// refused before anything is written. Call inside a write transaction.
pub fn disallow_mention(
    conn: &dyn Db,
    conversation: &str,
    hosts: &[String],
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<MemberChange>> {
    name("conversation", conversation)?;
    let hosts = sorted_unique(hosts)?;
    for host in &hosts {
        if crate::store::registry::hosts::standing(conn, host)? == crate::store::registry::hosts::Standing::NotEnrolled
        {
            return Err(StoreError::Invalid(format!("host {host:?} is not enrolled")));
        }
    }
    let revoke_seq = existing_cursor(conn, conversation)?;
    let mut out = Vec::with_capacity(hosts.len());
    for host in hosts {
        let n = conn
            .prepare_cached(
                "UPDATE mention_grants SET revoke_seq = $1, revoked_at = $2, revoked_by = $3, revoke_reason = $4
                 WHERE conversation = $5 AND host = $6 AND revoke_seq IS NULL",
            )?
            .execute(params![revoke_seq, now_ms, operator, reason, conversation, host])?;
        if n == 1 {
            record_operator_event(
                conn,
                "mention_disallow",
                &format!("conversation {conversation} host {host} after seq {revoke_seq}"),
                operator,
                Some(reason),
                now_ms,
            )?;
        }
        out.push(MemberChange { host: host.into(), changed: n == 1, seq: (n == 1).then_some(revoke_seq) });
    }
    Ok(out)
}

pub(crate) fn open_grant(conn: &dyn Db, conversation: &str, host: &str) -> StoreResult<Option<i64>> {
    Ok(conn
        .prepare_cached(
            "SELECT grant_seq FROM mention_grants WHERE conversation = $1 AND host = $2 AND revoke_seq IS NULL",
        )?
        .query_row([conversation, host], |r| r.get(0))
        .optional()?)
}

/// Whether `to` may name `host` in `conversation` now though it is not a member (an open
/// mention grant).
pub fn mention_allowed(conn: &dyn Db, conversation: &str, host: &str) -> StoreResult<bool> {
    Ok(open_grant(conn, conversation, host)?.is_some())
}

pub(crate) fn mentions(conn: &dyn Db, conversation: &str) -> StoreResult<Vec<MentionRow>> {
    Ok(conn
        .prepare_cached(
            "SELECT host, grant_seq, granted_at, granted_by, grant_reason, revoke_seq, revoked_at, revoked_by,
                    revoke_reason
             FROM mention_grants WHERE conversation = $1 ORDER BY host, grant_seq, id",
        )?
        .query_map([conversation], |r| {
            Ok(MentionRow {
                host: r.get(0)?,
                grant_seq: r.get(1)?,
                granted_at_ms: r.get(2)?,
                granted_by: r.get(3)?,
                grant_reason: r.get(4)?,
                revoke_seq: r.get(5)?,
                revoked_at_ms: r.get(6)?,
                revoked_by: r.get(7)?,
                revoke_reason: r.get(8)?,
            })
        })?
        .collect::<Result<_, _>>()?)
}
