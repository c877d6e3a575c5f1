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
//! Families (`member_families`): `members add --conversation 'support-*' HOST` makes a host a
//! member of every conversation the pattern covers (the publish scopes' grammar,
//! `producers::check_pattern`), each from its next post on: the join writes an interval
//! (marked with its family) for each matching conversation that exists, at its `last_seq`;
//! a matching conversation created later gets one from 0 (`adopt_families`, in the
//! transaction that creates it); the leave closes them all, each at its `last_seq`. A host
//! matched by several rows (a family and an exact one) is still one recipient per post.
//!
//! Mention authorizations (`mention_grants`, `members allow-mention|disallow-mention`): an
//! operator may let `to` name a host that is not a member, with a reason, audited. A grant has
//! cursors as an interval has (`grant_seq < seq <= revoke_seq`) and the claim's re-check
//! (`authorized`) counts it as authorization for a post it holds; it never makes the host a
//! recipient of a post without `to`. The same invariant holds: at most one open grant per
//! (conversation, host), never rewritten.
//!
//! Why one file over 700 lines: the interval and grant cursors are one invariant (above), and
//! the unit tests beside them are a third of the file.

use crate::store::By;
use crate::store::Store;
use crate::store::engine::Db;
use crate::store::registry::hosts::record_operator_event;
use crate::store::{StoreError, StoreResult};
use baton_shared::ids::check_name;
use baton_shared::wire::{ConversationView, MemberView, MembershipInterval};
use rusqlite::{OptionalExtension, named_params};

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
    /// The membership registry: of one conversation, or of all.
    pub async fn members(&self, conversation: Option<String>) -> StoreResult<Vec<ConversationMembers>> {
        self.conns.read(move |c| list(c, conversation.as_deref())).await
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

/// Most current members one conversation may have: every post without `to` fans out to all of
/// them, so this bounds one message's fan-out the way `recipients_max` bounds `to`.
pub const MEMBERS_PER_CONVERSATION_MAX: usize = 256;

/// Most open family rows (pattern, host) the registry may hold: a post into a new conversation
/// reads them all (`adopt_families`), so this bounds that read.
pub const MEMBER_FAMILIES_MAX: usize = 64;

/// What one `add` or `remove` did for one host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberChange {
    /// The host.
    pub host: String,
    /// False when nothing changed (already a member, or not a member).
    pub changed: bool,
    /// The cursor taken (join or leave `seq`), or for an unchanged add the open interval's
    /// join cursor; `None` for an unchanged remove.
    pub seq: Option<i64>,
}

/// One interval as the operator sees it: cursors, when, who and why. Serialised only for the
/// CLI's `--json`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IntervalRow {
    /// The join cursor.
    pub join_seq: i64,
    /// When (unix ms).
    pub joined_at_ms: i64,
    /// Which operator.
    pub joined_by: String,
    /// Why.
    pub join_reason: String,
    /// The leave cursor, once it left.
    pub leave_seq: Option<i64>,
    /// When it left (unix ms).
    pub left_at_ms: Option<i64>,
    /// Which operator removed it.
    pub left_by: Option<String>,
    /// Why.
    pub leave_reason: Option<String>,
    /// The family pattern (`support-*`) this interval is the conversation's share of; `None`
    /// for an exact membership.
    pub family: Option<String>,
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

/// A conversation's registry, for the operator (`members list`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConversationMembers {
    /// The conversation.
    pub conversation: String,
    /// Its `last_seq`.
    pub last_seq: i64,
    /// Every host that is or was a member, by name.
    pub members: Vec<MemberRow>,
    /// Every mention authorization, current and past, by host then grant cursor.
    pub mentions: Vec<MentionRow>,
}

fn name(field: &'static str, value: &str) -> StoreResult<()> {
    check_name(field, value).map_err(|e| StoreError::Invalid(e.to_string()))
}

/// The conversation's `last_seq`, creating the conversation (at 0, adopting the open families
/// that cover it) if it has no message yet.
fn cursor(conn: &dyn Db, conversation: &str) -> StoreResult<i64> {
    adopt_families(conn, conversation)?;
    Ok(conn
        .prepare_cached(
            "INSERT INTO conversations (name, last_seq) VALUES (?1, 0)
             ON CONFLICT (name) DO UPDATE SET last_seq = conversations.last_seq RETURNING last_seq",
        )?
        .query_row([conversation], |r| r.get(0))?)
}

/// The conversation's `last_seq`, or `NotFound`.
fn existing_cursor(conn: &dyn Db, conversation: &str) -> StoreResult<i64> {
    conn.prepare_cached("SELECT last_seq FROM conversations WHERE name = ?1")?
        .query_row([conversation], |r| r.get(0))
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("no conversation {conversation:?}")))
}

fn open_interval(conn: &dyn Db, conversation: &str, host: &str) -> StoreResult<Option<i64>> {
    Ok(conn
        .prepare_cached(
            "SELECT join_seq FROM memberships
             WHERE conversation = ?1 AND host = ?2 AND leave_seq IS NULL AND family IS NULL",
        )?
        .query_row([conversation, host], |r| r.get(0))
        .optional()?)
}

fn sorted_unique(hosts: &[String]) -> StoreResult<Vec<&str>> {
    if hosts.is_empty() {
        return Err(StoreError::Invalid("hosts: name at least one host".into()));
    }
    let mut out: Vec<&str> = hosts.iter().map(String::as_str).collect();
    out.sort_unstable();
    out.dedup();
    for h in &out {
        name("host", h)?;
    }
    Ok(out)
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
             VALUES (:c, :h, :seq, :now, :op, :why)",
        )?
        .execute(named_params! {
            ":c": conversation, ":h": host, ":seq": join_seq, ":now": now_ms, ":op": operator, ":why": reason,
        })?;
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

fn check_member_count(conn: &dyn Db, conversation: &str) -> StoreResult<()> {
    let current = current_members(conn, conversation)?.len();
    if current > MEMBERS_PER_CONVERSATION_MAX {
        return Err(StoreError::OverCapacity(format!(
            "conversation {conversation} would have {current} members; at most {MEMBERS_PER_CONVERSATION_MAX} are allowed"
        )));
    }
    Ok(())
}

fn pattern(value: &str) -> StoreResult<()> {
    crate::store::registry::producers::check_pattern(value)
        .map_err(|e| StoreError::Invalid(format!("conversation: {e}")))
        .and_then(|()| match value.ends_with('*') {
            true => Ok(()),
            false => Err(StoreError::Invalid(format!("conversation: {value:?} is not a pattern"))),
        })
}

/// The open family rows `(id, pattern)` of the registry, or of one host.
fn open_families(conn: &dyn Db, host: Option<&str>) -> StoreResult<Vec<(i64, String, String)>> {
    Ok(conn
        .prepare_cached(
            "SELECT id, pattern, host FROM member_families
             WHERE left_at IS NULL AND (CAST(?1 AS TEXT) IS NULL OR host = ?1) ORDER BY id",
        )?
        .query_map([host], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?)
}

fn insert_family_interval(conn: &dyn Db, conversation: &str, join_seq: i64, family: i64) -> StoreResult<()> {
    // The family row carries who and why; each interval repeats them for `members list`.
    conn.prepare_cached(
        "INSERT INTO memberships (conversation, host, join_seq, joined_at, joined_by, join_reason, family)
         SELECT CAST(:c AS TEXT), host, CAST(:seq AS BIGINT), joined_at, joined_by, join_reason, id
         FROM member_families WHERE id = :f",
    )?
    .execute(named_params! {":c": conversation, ":seq": join_seq, ":f": family})?;
    Ok(())
}

/// Makes a new conversation's first cursor: when no row names `conversation` yet and an open
/// family covers it, creates it (at 0) and gives each such family's host an interval from 0,
/// so a conversation first posted to after a family join is covered from its first post. Does
/// nothing for a conversation that exists or that no family covers. Call inside a write
/// transaction, before the conversation is created otherwise.
pub fn adopt_families(conn: &dyn Db, conversation: &str) -> StoreResult<()> {
    let exists: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM conversations WHERE name = ?1)")?
        .query_row([conversation], |r| r.get(0))?;
    if exists {
        return Ok(());
    }
    let covering: Vec<(i64, String, String)> = open_families(conn, None)?
        .into_iter()
        .filter(|(_, p, _)| crate::store::registry::producers::covers(p, conversation))
        .collect();
    if covering.is_empty() {
        return Ok(());
    }
    conn.prepare_cached("INSERT INTO conversations (name, last_seq) VALUES (?1, 0)")?.execute([conversation])?;
    for (family, _, host) in &covering {
        if crate::store::registry::hosts::standing(conn, host)? == crate::store::registry::hosts::Standing::Active {
            insert_family_interval(conn, conversation, 0, *family)?;
        }
    }
    check_member_count(conn, conversation)
}

/// `add` for a pattern: a family row per host, and an interval from its `last_seq` in every
/// existing conversation the pattern covers. Reads every conversation's name (an operator's
/// rare change, not a post's path). Call inside a write transaction.
fn add_family(
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
                 VALUES (:p, :h, :now, :op, :why) RETURNING id",
            )?
            .query_row(
                named_params! {":p": family_pattern, ":h": host, ":now": now_ms, ":op": operator, ":why": reason},
                |r| r.get(0),
            )?;
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
fn remove_family(
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
        conn.prepare_cached(
            "UPDATE member_families SET left_at = :now, left_by = :op, leave_reason = :why WHERE id = :f",
        )?
        .execute(named_params! {":f": family, ":now": now_ms, ":op": operator, ":why": reason})?;
        let closed = conn
            .prepare_cached(
                "UPDATE memberships SET leave_seq = (SELECT last_seq FROM conversations WHERE name = memberships.conversation),
                        left_at = :now, left_by = :op, leave_reason = :why
                 WHERE family = :f AND leave_seq IS NULL",
            )?
            .execute(named_params! {":f": family, ":now": now_ms, ":op": operator, ":why": reason})?;
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
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM hosts WHERE name = ?1)")?
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
                "UPDATE memberships SET leave_seq = :seq, left_at = :now, left_by = :op, leave_reason = :why
                 WHERE conversation = :c AND host = :h AND leave_seq IS NULL AND family IS NULL",
            )?
            .execute(named_params! {
                ":c": conversation, ":h": host, ":seq": leave_seq, ":now": now_ms, ":op": operator, ":why": reason,
            })?;
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
            "SELECT conversation FROM memberships WHERE host = ?1 AND leave_seq IS NULL AND family IS NULL
             ORDER BY conversation",
        )?
        .query_map([host], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for c in &exact {
        remove(conn, c, &[host.to_string()], operator, reason, now_ms)?;
    }
    let granted: Vec<String> = conn
        .prepare_cached(
            "SELECT conversation FROM mention_grants WHERE host = ?1 AND revoke_seq IS NULL ORDER BY conversation",
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
            "SELECT DISTINCT conversation FROM memberships WHERE host = ?1 AND leave_seq IS NULL ORDER BY conversation",
        )?
        .query_map([host], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
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
             VALUES (:c, :h, :seq, :now, :op, :why)",
        )?
        .execute(named_params! {
            ":c": conversation, ":h": host, ":seq": grant_seq, ":now": now_ms, ":op": operator, ":why": reason,
        })?;
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
                "UPDATE mention_grants SET revoke_seq = :seq, revoked_at = :now, revoked_by = :op, revoke_reason = :why
                 WHERE conversation = :c AND host = :h AND revoke_seq IS NULL",
            )?
            .execute(named_params! {
                ":c": conversation, ":h": host, ":seq": revoke_seq, ":now": now_ms, ":op": operator, ":why": reason,
            })?;
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

fn open_grant(conn: &dyn Db, conversation: &str, host: &str) -> StoreResult<Option<i64>> {
    Ok(conn
        .prepare_cached(
            "SELECT grant_seq FROM mention_grants WHERE conversation = ?1 AND host = ?2 AND revoke_seq IS NULL",
        )?
        .query_row([conversation, host], |r| r.get(0))
        .optional()?)
}

/// Whether `to` may name `host` in `conversation` now though it is not a member (an open
/// mention grant).
pub fn mention_allowed(conn: &dyn Db, conversation: &str, host: &str) -> StoreResult<bool> {
    Ok(open_grant(conn, conversation, host)?.is_some())
}

fn mentions(conn: &dyn Db, conversation: &str) -> StoreResult<Vec<MentionRow>> {
    Ok(conn
        .prepare_cached(
            "SELECT host, grant_seq, granted_at, granted_by, grant_reason, revoke_seq, revoked_at, revoked_by,
                    revoke_reason
             FROM mention_grants WHERE conversation = ?1 ORDER BY host, grant_seq, id",
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

/// The current members (open intervals) of a conversation, by name.
pub fn current_members(conn: &dyn Db, conversation: &str) -> StoreResult<Vec<String>> {
    Ok(conn
        .prepare_cached(
            "SELECT DISTINCT host FROM memberships WHERE conversation = ?1 AND leave_seq IS NULL ORDER BY host",
        )?
        .query_map([conversation], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
}

/// Whether the conversation has ever had a member (it is then not open any more).
pub fn has_membership(conn: &dyn Db, conversation: &str) -> StoreResult<bool> {
    Ok(conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM memberships WHERE conversation = ?1)")?
        .query_row([conversation], |r| r.get(0))?)
}

/// Whether `host` may receive post `seq` of `conversation`: the conversation was open at that
/// seq (no interval had begun before it), or one of the host's intervals holds it, or one of
/// its mention grants does (a delivery exists only for a host the post routed to, and a grant
/// lets only `to` name a non-member, so a grant holding the post authorized that mention).
pub fn authorized(conn: &dyn Db, conversation: &str, host: &str, seq: i64) -> StoreResult<bool> {
    Ok(conn
        .prepare_cached(
            "SELECT NOT EXISTS (SELECT 1 FROM memberships WHERE conversation = :c AND join_seq < :s)
                 OR EXISTS (SELECT 1 FROM memberships WHERE conversation = :c AND host = :h AND join_seq < :s
                                AND (leave_seq IS NULL OR :s <= leave_seq))
                 OR EXISTS (SELECT 1 FROM mention_grants WHERE conversation = :c AND host = :h AND grant_seq < :s
                                AND (revoke_seq IS NULL OR :s <= revoke_seq))",
        )?
        .query_row(named_params! {":c": conversation, ":h": host, ":s": seq}, |r| r.get(0))?)
}

fn intervals(conn: &dyn Db, conversation: &str) -> StoreResult<Vec<(String, IntervalRow)>> {
    Ok(conn
        .prepare_cached(
            "SELECT m.host, m.join_seq, m.joined_at, m.joined_by, m.join_reason, m.leave_seq, m.left_at, m.left_by,
                    m.leave_reason, f.pattern
             FROM memberships m LEFT JOIN member_families f ON f.id = m.family
             WHERE m.conversation = ?1 ORDER BY m.host, m.join_seq, m.id",
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
    Ok(ConversationMembers { conversation: conversation.into(), last_seq, members, mentions })
}

/// The registries of every conversation that has (had) members or mention grants, or of the
/// one named.
pub fn list(conn: &dyn Db, conversation: Option<&str>) -> StoreResult<Vec<ConversationMembers>> {
    if let Some(c) = conversation {
        return Ok(vec![registry(conn, c)?]);
    }
    let names: Vec<String> = conn
        .prepare_cached(
            "SELECT conversation FROM memberships UNION SELECT conversation FROM mention_grants ORDER BY 1",
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
        open: r.members.is_empty(),
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
    use crate::store::testing;

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn routed(conn: &dyn Db, message_id: &str) -> Vec<String> {
        deliveries_of(conn, message_id).unwrap().into_iter().map(|d| d.host).collect()
    }

    fn post(conn: &dyn Db, key: &str, to: &[&str]) -> StoreResult<crate::store::lifecycle::accept::Accepted> {
        let msg = NewMessage {
            traceparent: None,
            producer: "prod".into(),
            conversation: "c".into(),
            idempotency_key: key.into(),
            payload: "{}".into(),
            to: hosts(to),
        };
        accept(conn, &msg, AcceptLimits { queued_per_host_max: 1000 }, 1)
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
        };
        let limits = AcceptLimits { queued_per_host_max: 1000 };
        let (_, d) = crate::store::lifecycle::accept::accept_and_fan_out(conn, &msg, Default::default(), limits, 1)?;
        Ok(d.into_iter().map(|d| d.host).collect())
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
