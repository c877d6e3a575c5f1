//! What every change of a conversation's registry (memberships, families, mention grants)
//! checks and reads: names, the conversation's cursor, its current members and their bound,
//! and what one change did for one host.

use crate::store::engine::{Db, OptionalExtension};
use crate::store::{StoreError, StoreResult};
use baton_shared::ids::check_name;

/// Most current members one conversation may have: every post without `to` fans out to all of
/// them, so this bounds one message's fan-out the way `recipients_max` bounds `to`.
pub const MEMBERS_PER_CONVERSATION_MAX: usize = 256;

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

/// Refuses a conversation or host name outside the identifier grammar, naming `field`.
pub(crate) fn name(field: &'static str, value: &str) -> StoreResult<()> {
    check_name(field, value).map_err(|e| StoreError::Invalid(e.to_string()))
}

/// The conversation's `last_seq`, or `NotFound`.
pub(crate) fn existing_cursor(conn: &dyn Db, conversation: &str) -> StoreResult<i64> {
    conn.prepare_cached("SELECT last_seq FROM conversations WHERE name = $1")?
        .query_row([conversation], |r| r.get(0))
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("no conversation {conversation:?}")))
}

/// The hosts a change names, sorted, each once, each a valid name; refused when there is none.
pub(crate) fn sorted_unique(hosts: &[String]) -> StoreResult<Vec<&str>> {
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

/// The current members (open intervals) of a conversation, by name.
pub fn current_members(conn: &dyn Db, conversation: &str) -> StoreResult<Vec<String>> {
    Ok(conn
        .prepare_cached(
            "SELECT DISTINCT host FROM memberships WHERE conversation = $1 AND leave_seq IS NULL ORDER BY host",
        )?
        .query_map([conversation], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
}

/// Refuses a change that leaves the conversation more than `MEMBERS_PER_CONVERSATION_MAX`
/// current members (checked after the change, inside its transaction).
pub(crate) fn check_member_count(conn: &dyn Db, conversation: &str) -> StoreResult<()> {
    let current = current_members(conn, conversation)?.len();
    if current > MEMBERS_PER_CONVERSATION_MAX {
        return Err(StoreError::OverCapacity(format!(
            "conversation {conversation} would have {current} members; at most {MEMBERS_PER_CONVERSATION_MAX} are allowed"
        )));
    }
    Ok(())
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
