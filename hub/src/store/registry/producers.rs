//! Producers' publish scopes (SPEC §3): the conversations a producer may post into.
//!
//! A scope is a set of patterns, each an exact conversation name or a prefix followed by `*`
//! (`support-*`; `*` alone is every conversation). It is stored with the producer's record;
//! a producer with no stored scope has the default, `*`. The acceptance transaction checks it,
//! so a post outside the scope is refused (`forbidden`, naming the conversation) and a scope
//! change takes effect on the next post.
//!
//! Quotas: a producer may also be limited in how much it has unsettled at once — messages not
//! yet settled (`messages.settled_at IS NULL`) and their payload bytes — so one producer cannot
//! use up the hosts' shared `queued_per_host_max` for all the others. The accept checks it
//! (`check_quota`, after the idempotency branch: a replay is never refused by it) and refuses
//! with `OverQuota` (429, a code naming the quota). `QUOTA_DEFAULT`: none.
//!
//! Why one file over 700 lines: a post's terms are its scope and its quota together, read in
//! one statement (`terms_of`) and checked through one `PostingTerms`; the code is about 510
//! lines, the rest is its tests, which post against both.

use crate::store::By;
use crate::store::Store;
use crate::store::engine::Db;
use crate::store::engine::OptionalExtension;
use crate::store::engine::params;
use crate::store::registry::audit::record_operator_event;
use crate::store::{StoreError, StoreResult};
use baton_shared::ids::{NAME_CHARS_MAX, check_name};

impl Store {
    /// Replaces the producer's approval right (`set_approvals`); returns it.
    pub async fn producer_approve(&self, producer: String, patterns: Vec<String>, by: By) -> StoreResult<Vec<String>> {
        let clock = self.clock.clone();
        self.conns
            .write(move |c| set_approvals(c, &producer, &patterns, &by.operator, &by.reason, clock.now_ms()))
            .await
    }

    /// Every producer's publish scope.
    pub async fn producers(&self) -> StoreResult<Vec<ProducerRow>> {
        self.conns.read(list).await
    }

    /// Sets the producer's publish scope; returns it as stored.
    pub async fn producer_scope(&self, producer: String, patterns: Vec<String>, by: By) -> StoreResult<Vec<String>> {
        let clock = self.clock.clone();
        self.conns.write(move |c| set_scope(c, &producer, &patterns, &by.operator, &by.reason, clock.now_ms())).await
    }

    /// Changes the producer's quota; returns the quota now in force.
    pub async fn producer_quota(&self, producer: String, change: QuotaChange, by: By) -> StoreResult<Quota> {
        let clock = self.clock.clone();
        self.conns.write(move |c| set_quota(c, &producer, change, &by.operator, &by.reason, clock.now_ms())).await
    }
}

/// Most patterns one producer's scope may hold; the accept checks them all on every post.
pub const SCOPE_PATTERNS_MAX: usize = 64;

/// The scope a producer has when none is stored: every conversation.
pub const SCOPE_DEFAULT: &str = "*";

/// The quota a producer has when none is stored: unlimited. The hub's own bounds
/// (`queued_per_host_max`, the payload and recipient bounds) already keep the record finite;
/// a quota is an operator's choice between producers that share hosts, which the hub cannot
/// guess, so a new producer is limited only when its enrollment (or `producers quota`) says so.
pub const QUOTA_DEFAULT: Quota = Quota { unsettled_max: None, unsettled_bytes_max: None };

/// The largest `unsettled_max` a quota may name. The accept reads up to that many index
/// entries of the producer's unsettled messages, so this bounds its cost.
pub const QUOTA_UNSETTLED_MAX: u64 = 100_000;

/// The largest `unsettled_bytes_max` a quota may name (1 GiB). Every payload has at least one
/// byte, so the accept reads at most this many entries too; a message quota cuts it further.
pub const QUOTA_UNSETTLED_BYTES_MAX: u64 = 1 << 30;

/// A producer's quota: each limit `None` for unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Quota {
    /// Most messages it may have unsettled at once.
    pub unsettled_max: Option<u64>,
    /// Most payload bytes (UTF-8) its unsettled messages may hold together.
    pub unsettled_bytes_max: Option<u64>,
}

/// A change to a quota: each field `None` to keep the stored limit, `Some(None)` for unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QuotaChange {
    /// The new message limit, when it changes.
    pub unsettled_max: Option<Option<u64>>,
    /// The new byte limit, when it changes.
    pub unsettled_bytes_max: Option<Option<u64>>,
}

impl QuotaChange {
    /// Whether it changes anything.
    pub fn is_empty(&self) -> bool {
        self.unsettled_max.is_none() && self.unsettled_bytes_max.is_none()
    }
}

/// Which quota refused a post; each is its own error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaKind {
    /// `unsettled_max`: `quota_unsettled_messages`.
    UnsettledMessages,
    /// `unsettled_bytes_max`: `quota_unsettled_bytes`.
    UnsettledBytes,
}

/// Checks a limit given for `field` against its range `1..=max` (a CLI flag or a test).
pub fn check_limit(field: &str, value: Option<u64>, max: u64) -> Result<(), String> {
    match value {
        Some(v) if v == 0 || v > max => Err(format!("{field} {v} is out of range; allowed 1..={max} or `unlimited`")),
        _ => Ok(()),
    }
}

fn to_i64(v: Option<u64>) -> Option<i64> {
    v.map(|v| i64::try_from(v).unwrap_or(i64::MAX))
}

fn from_i64(v: Option<i64>) -> Option<u64> {
    v.map(|v| u64::try_from(v).unwrap_or(0))
}

/// The producer's quota (`QUOTA_DEFAULT` when none is stored).
pub fn quota_of(conn: &dyn Db, producer: &str) -> StoreResult<Quota> {
    let row: Option<(Option<i64>, Option<i64>)> = conn
        .prepare_cached("SELECT unsettled_max, unsettled_bytes_max FROM producer_quotas WHERE producer = $1")?
        .query_row([producer], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(quota_from(row))
}

/// The quota a stored row holds (`None`: no row, the default).
fn quota_from(row: Option<(Option<i64>, Option<i64>)>) -> Quota {
    match row {
        None => QUOTA_DEFAULT,
        Some((m, b)) => Quota { unsettled_max: from_i64(m), unsettled_bytes_max: from_i64(b) },
    }
}

/// What a producer has unsettled: `(messages, payload bytes)`, counting at most `limit`
/// messages (the index read stops there).
fn unsettled(conn: &dyn Db, producer: &str, limit: i64) -> StoreResult<(i64, i64)> {
    Ok(conn
        .prepare_cached(
            "SELECT count(*), coalesce(sum(octet_length(payload)), 0) FROM (
                 SELECT payload FROM messages WHERE producer = $1 AND settled_at IS NULL LIMIT $2) AS u",
        )?
        .query_row(params![producer, limit], |r| Ok((r.get(0)?, r.get(1)?)))?)
}

/// Refuses (`OverQuota`, naming the quota, its limit and what is unsettled) a new message of
/// `payload_bytes` by `producer` that its quota does not leave room for. Reads nothing more
/// than the quota row for a producer without one.
pub fn check_quota(conn: &dyn Db, producer: &str, payload_bytes: usize) -> StoreResult<()> {
    check_quota_of(conn, producer, quota_of(conn, producer)?, payload_bytes)
}

/// `check_quota` against `quota`, the producer's as read before.
fn check_quota_of(conn: &dyn Db, producer: &str, quota: Quota, payload_bytes: usize) -> StoreResult<()> {
    if quota == QUOTA_DEFAULT {
        return Ok(());
    }
    // At `unsettled_max` messages the message quota refuses whatever the bytes; at
    // `unsettled_bytes_max` messages (one byte each at least) the byte quota does.
    let limit =
        to_i64(quota.unsettled_max).unwrap_or(i64::MAX).min(to_i64(quota.unsettled_bytes_max).unwrap_or(i64::MAX));
    let (count, bytes) = unsettled(conn, producer, limit)?;
    if let Some(max) = quota.unsettled_max
        && u64::try_from(count).unwrap_or(0) >= max
    {
        return Err(StoreError::OverQuota(
            QuotaKind::UnsettledMessages,
            format!(
                "producer {producer} has {count} unsettled messages, its quota unsettled_max = {max}; \
                 post again once some settle"
            ),
        ));
    }
    if let Some(max) = quota.unsettled_bytes_max {
        let after = u64::try_from(bytes).unwrap_or(0).saturating_add(payload_bytes as u64);
        if after > max {
            return Err(StoreError::OverQuota(
                QuotaKind::UnsettledBytes,
                format!(
                    "producer {producer} has {bytes} payload bytes unsettled and this payload is {payload_bytes}, \
                     over its quota unsettled_bytes_max = {max}; post again once some settle"
                ),
            ));
        }
    }
    Ok(())
}

fn require_producer(conn: &dyn Db, producer: &str) -> StoreResult<()> {
    check_name("producer", producer).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let enrolled: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM certificates WHERE role = 'producer' AND name = $1)")?
        .query_row([producer], |r| r.get(0))?;
    if !enrolled {
        return Err(StoreError::NotFound(format!("no producer {producer} was ever enrolled")));
    }
    Ok(())
}

/// Changes a producer's quota (the fields given; the others keep their stored value) and
/// records it in the audit log. The producer must have been enrolled; each limit must lie in
/// its range. Returns the quota now in force. Call inside a write transaction.
pub fn set_quota(
    conn: &dyn Db,
    producer: &str,
    change: QuotaChange,
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Quota> {
    require_producer(conn, producer)?;
    if change.is_empty() {
        return Err(StoreError::Invalid("quota: give --max-unsettled or --max-unsettled-bytes".into()));
    }
    let old = quota_of(conn, producer)?;
    let new = Quota {
        unsettled_max: change.unsettled_max.unwrap_or(old.unsettled_max),
        unsettled_bytes_max: change.unsettled_bytes_max.unwrap_or(old.unsettled_bytes_max),
    };
    check_limit("max_unsettled", new.unsettled_max, QUOTA_UNSETTLED_MAX).map_err(StoreError::Invalid)?;
    check_limit("max_unsettled_bytes", new.unsettled_bytes_max, QUOTA_UNSETTLED_BYTES_MAX)
        .map_err(StoreError::Invalid)?;
    conn.prepare_cached(
        "INSERT INTO producer_quotas (producer, unsettled_max, unsettled_bytes_max, set_by, set_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (producer) DO UPDATE SET unsettled_max = excluded.unsettled_max,
             unsettled_bytes_max = excluded.unsettled_bytes_max, set_by = excluded.set_by, set_at = excluded.set_at",
    )?
    .execute(params![producer, to_i64(new.unsettled_max), to_i64(new.unsettled_bytes_max), operator, now_ms])?;
    let shown = |v: Option<u64>| v.map_or_else(|| "unlimited".to_string(), |v| v.to_string());
    record_operator_event(
        conn,
        "producer_quota",
        &format!(
            "{producer}: max_unsettled {} max_unsettled_bytes {}",
            shown(new.unsettled_max),
            shown(new.unsettled_bytes_max)
        ),
        operator,
        Some(reason),
        now_ms,
    )?;
    Ok(new)
}

/// Checks one pattern: a conversation name, or a (possibly empty) name prefix and a final `*`.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    let refuse = || {
        format!(
            "conversation pattern {:?} is neither a conversation name nor a name prefix ending in `*`",
            pattern.chars().take(80).collect::<String>()
        )
    };
    match pattern.strip_suffix('*') {
        Some("") => Ok(()),
        Some(prefix) => {
            // A prefix is a name that may still grow; it must itself be a valid name start.
            if prefix.contains('*') || prefix.chars().count() >= NAME_CHARS_MAX {
                return Err(refuse());
            }
            check_name("pattern", prefix).map_err(|_| refuse())
        }
        None => check_name("pattern", pattern).map_err(|_| refuse()),
    }
}

/// Whether `pattern` (already checked) covers `conversation`.
pub fn covers(pattern: &str, conversation: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => conversation.starts_with(prefix),
        None => pattern == conversation,
    }
}

/// The producer's stored patterns, sorted; empty when none is stored (the default applies).
fn stored(conn: &dyn Db, producer: &str) -> StoreResult<Vec<String>> {
    Ok(conn
        .prepare_cached("SELECT pattern FROM producer_scopes WHERE producer = $1 ORDER BY pattern")?
        .query_map([producer], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
}

/// The producer's scope (as `scope_of`) and quota (as `quota_of`) in one read: one round trip
/// on PostgreSQL for a post's terms instead of two.
fn terms_of(conn: &dyn Db, producer: &str) -> StoreResult<(Vec<String>, Quota)> {
    /// A row of the read: a stored pattern, whether a quota is stored, its two limits.
    type TermsRow = (Option<String>, bool, Option<i64>, Option<i64>);
    let rows: Vec<TermsRow> = conn
        .prepare_cached(
            "SELECT s.pattern, q.producer IS NOT NULL, q.unsettled_max, q.unsettled_bytes_max
             FROM (SELECT 1 AS one) o
             LEFT JOIN producer_quotas q ON q.producer = $1
             LEFT JOIN producer_scopes s ON s.producer = $1
             ORDER BY s.pattern",
        )?
        .query_map([producer], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<Result<_, _>>()?;
    let quota = quota_from(rows.first().filter(|(_, stored, ..)| *stored).map(|(_, _, m, b)| (*m, *b)));
    Ok((scope_from(rows.into_iter().filter_map(|(p, ..)| p).collect()), quota))
}

/// The scope stored `patterns` give: themselves, or `[SCOPE_DEFAULT]` when none is stored.
fn scope_from(patterns: Vec<String>) -> Vec<String> {
    if patterns.is_empty() { vec![SCOPE_DEFAULT.to_string()] } else { patterns }
}

/// The producer's scope: its stored patterns, or `[SCOPE_DEFAULT]` when none is stored.
pub fn scope_of(conn: &dyn Db, producer: &str) -> StoreResult<Vec<String>> {
    Ok(scope_from(stored(conn, producer)?))
}

/// Refuses (`Forbidden`, naming the conversation and the scope) a post by `producer` into a
/// conversation its scope does not cover.
pub fn check_may_post(conn: &dyn Db, producer: &str, conversation: &str) -> StoreResult<()> {
    may_post(producer, &scope_of(conn, producer)?, conversation)
}

/// `check_may_post` against `scope`, the producer's as read before.
fn may_post(producer: &str, scope: &[String], conversation: &str) -> StoreResult<()> {
    if scope.iter().any(|p| covers(p, conversation)) {
        return Ok(());
    }
    Err(StoreError::Forbidden(format!(
        "producer {producer} may not post into conversation {conversation:?} (its publish scope is {})",
        scope.join(" ")
    )))
}

/// What a producer's posts are checked against, its publish scope and its quota, read once
/// for a batch of posts instead of once per post. Neither changes inside a writer's
/// transaction but by an operator's own job; what is unsettled, which each accepted post
/// changes, is still counted per post.
#[derive(Debug, Default)]
pub struct PostingTerms {
    /// The producer the terms were read for, with its scope and quota.
    read: Option<(String, Vec<String>, Quota)>,
}

impl PostingTerms {
    /// The producer's scope and quota: those read last if they are its, else read now.
    fn of(&mut self, conn: &dyn Db, producer: &str) -> StoreResult<&(String, Vec<String>, Quota)> {
        let read = match self.read.take() {
            Some(read) if read.0 == producer => read,
            _ => {
                let (scope, quota) = terms_of(conn, producer)?;
                (producer.to_string(), scope, quota)
            }
        };
        Ok(self.read.insert(read))
    }

    /// `check_may_post` on the terms.
    pub fn check_may_post(&mut self, conn: &dyn Db, producer: &str, conversation: &str) -> StoreResult<()> {
        let (_, scope, _) = self.of(conn, producer)?;
        may_post(producer, scope, conversation)
    }

    /// `check_quota` on the terms.
    pub fn check_quota(&mut self, conn: &dyn Db, producer: &str, payload_bytes: usize) -> StoreResult<()> {
        let quota = self.of(conn, producer)?.2;
        check_quota_of(conn, producer, quota, payload_bytes)
    }
}

/// Replaces a producer's scope with `patterns` (deduplicated). The producer must have been
/// enrolled. Returns the scope now stored. Call inside a write transaction.
pub fn set_scope(
    conn: &dyn Db,
    producer: &str,
    patterns: &[String],
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<String>> {
    require_producer(conn, producer)?;
    let mut patterns: Vec<&str> = patterns.iter().map(String::as_str).collect();
    patterns.sort_unstable();
    patterns.dedup();
    if patterns.is_empty() {
        return Err(StoreError::Invalid(format!(
            "conversations: give at least one pattern (`{SCOPE_DEFAULT}` for every conversation)"
        )));
    }
    if patterns.len() > SCOPE_PATTERNS_MAX {
        return Err(StoreError::Invalid(format!(
            "conversations: {} patterns; at most {SCOPE_PATTERNS_MAX} are allowed",
            patterns.len()
        )));
    }
    for p in &patterns {
        check_pattern(p).map_err(StoreError::Invalid)?;
    }
    conn.prepare_cached("DELETE FROM producer_scopes WHERE producer = $1")?.execute([producer])?;
    for p in &patterns {
        conn.prepare_cached("INSERT INTO producer_scopes (producer, pattern, set_by, set_at) VALUES ($1, $2, $3, $4)")?
            .execute(params![producer, p, operator, now_ms])?;
    }
    record_operator_event(
        conn,
        "producer_scope",
        &format!("{producer}: {}", patterns.join(" ")),
        operator,
        Some(reason),
        now_ms,
    )?;
    stored(conn, producer)
}

/// The conversation patterns `producer` may approve or reject messages in, sorted; empty when
/// it has no approval right (the default: approving is an operator's until one grants it).
pub fn approvals_of(conn: &dyn Db, producer: &str) -> StoreResult<Vec<String>> {
    Ok(conn
        .prepare_cached("SELECT pattern FROM producer_approvals WHERE producer = $1 ORDER BY pattern")?
        .query_map([producer], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
}

/// Replaces a producer's approval right with `patterns` (the publish scopes' grammar,
/// deduplicated, at most `SCOPE_PATTERNS_MAX`; empty: no right), recorded in the audit log.
/// The producer must have been enrolled. Returns the patterns now stored. Call inside a write
/// transaction.
pub fn set_approvals(
    conn: &dyn Db,
    producer: &str,
    patterns: &[String],
    operator: &str,
    reason: &str,
    now_ms: i64,
) -> StoreResult<Vec<String>> {
    require_producer(conn, producer)?;
    let mut patterns: Vec<&str> = patterns.iter().map(String::as_str).collect();
    patterns.sort_unstable();
    patterns.dedup();
    if patterns.len() > SCOPE_PATTERNS_MAX {
        return Err(StoreError::Invalid(format!(
            "approve: {} patterns; at most {SCOPE_PATTERNS_MAX} are allowed",
            patterns.len()
        )));
    }
    for p in &patterns {
        check_pattern(p).map_err(StoreError::Invalid)?;
    }
    conn.prepare_cached("DELETE FROM producer_approvals WHERE producer = $1")?.execute([producer])?;
    for p in &patterns {
        conn.prepare_cached(
            "INSERT INTO producer_approvals (producer, pattern, set_by, set_at) VALUES ($1, $2, $3, $4)",
        )?
        .execute(params![producer, p, operator, now_ms])?;
    }
    let shown = if patterns.is_empty() { "none".to_string() } else { patterns.join(" ") };
    record_operator_event(conn, "producer_approve", &format!("{producer}: {shown}"), operator, Some(reason), now_ms)?;
    approvals_of(conn, producer)
}

/// A producer as listed for operators (`producers list`). Serialised only for the CLI's `--json`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProducerRow {
    /// The producer's name.
    pub name: String,
    /// Its publish scope (the default when none is stored).
    pub conversations: Vec<String>,
    /// Whether the scope is the default because none was ever stored.
    pub default_scope: bool,
    /// Its certificates that are not revoked.
    pub active_certificates: i64,
    /// Its revoked certificates.
    pub revoked_certificates: i64,
    /// Its quota (`QUOTA_DEFAULT`, unlimited, when none is stored).
    pub quota: Quota,
    /// Its messages not yet settled, now.
    pub unsettled: i64,
    /// Their payload bytes.
    pub unsettled_bytes: i64,
    /// The conversation patterns it may approve or reject messages in (empty: none).
    pub may_approve: Vec<String>,
}

/// Every enrolled producer with its scope and certificate counts, by name.
pub fn list(conn: &dyn Db) -> StoreResult<Vec<ProducerRow>> {
    let rows: Vec<(String, i64, i64)> = conn
        .prepare_cached(
            "SELECT name, count(*) FILTER (WHERE revoked_at IS NULL), count(*) FILTER (WHERE revoked_at IS NOT NULL)
             FROM certificates WHERE role = 'producer' GROUP BY name ORDER BY name",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    let mut out = Vec::with_capacity(rows.len());
    for (name, active_certificates, revoked_certificates) in rows {
        let patterns = stored(conn, &name)?;
        let default_scope = patterns.is_empty();
        let quota = quota_of(conn, &name)?;
        // Counted in full for the operator's listing (read-only, off the accept's path).
        let (unsettled, unsettled_bytes) = unsettled(conn, &name, i64::MAX)?;
        let may_approve = approvals_of(conn, &name)?;
        out.push(ProducerRow {
            may_approve,
            quota,
            unsettled,
            unsettled_bytes,
            conversations: if default_scope { vec![SCOPE_DEFAULT.to_string()] } else { patterns },
            default_scope,
            name,
            active_certificates,
            revoked_certificates,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::{AcceptLimits, NewMessage, accept};
    use crate::store::registry::hosts::record_certificate;
    use crate::store::testing;

    fn check(pattern: &str, conversation: &str, expected: bool) {
        assert_eq!(check_pattern(pattern), Ok(()), "{pattern}");
        assert_eq!(covers(pattern, conversation), expected, "{pattern} covers {conversation}");
    }

    #[test]
    fn patterns_are_names_or_prefixes() {
        check("*", "anything", true);
        check("support", "support", true);
        check("support", "support-2", false);
        check("support-*", "support-2", true);
        check("support-*", "support", false);
        check("s*", "sales", true);
        check("s*", "ops", false);
        for bad in
            ["", "Support", "sup*port", "**", "-*", "*x", "a b", &"a".repeat(65), &format!("{}*", "a".repeat(64))]
        {
            assert!(check_pattern(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(check_pattern(&format!("{}*", "a".repeat(63))).is_ok());
    }

    /// The terms read in one statement are the scope and quota read apart, whatever of them is
    /// stored: nothing, a scope of several patterns, a quota, both.
    #[test]
    fn a_posts_terms_read_at_once_are_its_scope_and_quota() {
        let db = testing::db();
        let c = &*db.conn;
        record_certificate(c, "aa", baton_shared::ids::Role::Producer, "prod", i64::MAX, 1).unwrap();
        let apart = |c: &dyn Db| (scope_of(c, "prod").unwrap(), quota_of(c, "prod").unwrap());
        assert_eq!(terms_of(c, "prod").unwrap(), (vec![SCOPE_DEFAULT.to_string()], QUOTA_DEFAULT));
        set_scope(c, "prod", &["b-*".into(), "a".into()], "op", "why", 2).unwrap();
        assert_eq!(terms_of(c, "prod").unwrap(), apart(c));
        assert_eq!(terms_of(c, "prod").unwrap().0, ["a", "b-*"]);
        let change = QuotaChange { unsettled_max: Some(Some(5)), unsettled_bytes_max: None };
        set_quota(c, "prod", change, "op", "why", 3).unwrap();
        let both = terms_of(c, "prod").unwrap();
        assert_eq!(both, apart(c));
        assert_eq!(both.1.unsettled_max, Some(5));
        record_certificate(c, "bb", baton_shared::ids::Role::Producer, "other", i64::MAX, 1).unwrap();
        let change = QuotaChange { unsettled_max: None, unsettled_bytes_max: Some(Some(100)) };
        set_quota(c, "other", change, "op", "why", 4).unwrap();
        let quota_only = terms_of(c, "other").unwrap();
        assert_eq!(quota_only, (scope_of(c, "other").unwrap(), quota_of(c, "other").unwrap()));
        assert_eq!((quota_only.0, quota_only.1.unsettled_bytes_max), (vec![SCOPE_DEFAULT.to_string()], Some(100)));
    }

    /// A post of `{}` to host-a.
    fn message(producer: &str, conversation: &str, key: &str) -> NewMessage {
        NewMessage {
            traceparent: None,
            producer: producer.into(),
            conversation: conversation.into(),
            idempotency_key: key.into(),
            payload: "{}".into(),
            to: vec!["host-a".into()],
            pools: Vec::new(),
        }
    }

    fn post(conn: &dyn Db, producer: &str, conversation: &str, key: &str) -> StoreResult<()> {
        let msg = message(producer, conversation, key);
        accept(conn, &msg, AcceptLimits { queued_per_host_max: 1000, queued_per_pool_max: 1000 }, 1).map(|_| ())
    }

    /// A producer posts anywhere by default; once scoped, only where its patterns allow, and a
    /// refused post names the conversation and changes nothing.
    #[test]
    fn accept_checks_the_publish_scope() {
        let db = testing::db();
        let c = &db.conn;
        record_certificate(c, "aa", baton_shared::ids::Role::Producer, "prod", i64::MAX, 1).unwrap();
        assert_eq!(scope_of(c, "prod").unwrap(), ["*"]);
        post(c, "prod", "anything", "k0").unwrap();
        let set = set_scope(c, "prod", &["support-*".into(), "ops".into(), "ops".into()], "op", "r", 2).unwrap();
        assert_eq!(set, ["ops", "support-*"]);
        post(c, "prod", "support-7", "k1").unwrap();
        post(c, "prod", "ops", "k2").unwrap();
        for (i, conv) in ["opsx", "anything", "support"].into_iter().enumerate() {
            let e = post(c, "prod", conv, &format!("x{i}")).unwrap_err();
            assert!(matches!(e, StoreError::Forbidden(_)) && e.to_string().contains(&format!("{conv:?}")), "{e}");
        }
        // Another producer keeps the default.
        post(c, "other", "anything", "k3").unwrap();
        let n: i64 = c.query_row("SELECT count(*) FROM messages", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 4);
        let rows = list(c).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].conversations.clone(), rows[0].default_scope),
            (vec!["ops".into(), "support-*".into()], false)
        );
        set_scope(c, "prod", &["*".into()], "op", "open again", 3).unwrap();
        post(c, "prod", "anything", "k4").unwrap();
    }

    fn post_to(conn: &dyn Db, host: &str, key: &str, payload: &str) -> StoreResult<()> {
        let msg = NewMessage {
            traceparent: None,
            producer: "prod".into(),
            conversation: "c".into(),
            idempotency_key: key.into(),
            payload: payload.into(),
            to: vec![host.into()],
            pools: Vec::new(),
        };
        crate::store::lifecycle::accept::accept_and_fan_out(
            conn,
            &msg,
            Default::default(),
            AcceptLimits { queued_per_host_max: 1000, queued_per_pool_max: 1000 },
            1,
        )
        .map(|_| ())
    }

    /// Terms read once for a batch of one producer's posts answer as the per-post checks do:
    /// the scope refuses by name, and the quota still counts what each accepted post added.
    /// Another producer's post in the same batch is checked against its own terms.
    #[test]
    fn terms_read_once_for_a_batch_count_what_each_post_adds() {
        let db = testing::db();
        let c = &*db.conn;
        record_certificate(c, "aa", baton_shared::ids::Role::Producer, "prod", i64::MAX, 1).unwrap();
        set_scope(c, "prod", &["c*".into()], "op", "r", 1).unwrap();
        let two = QuotaChange { unsettled_max: Some(Some(2)), ..Default::default() };
        set_quota(c, "prod", two, "op", "r", 1).unwrap();
        let msg = message;
        let posts = [
            msg("prod", "c1", "k1"),
            msg("prod", "d1", "k2"),
            msg("prod", "c2", "k3"),
            msg("other", "d2", "k4"),
            msg("prod", "c3", "k5"),
        ];
        let limits = AcceptLimits { queued_per_host_max: 1000, queued_per_pool_max: 1000 };
        let mut terms = PostingTerms::default();
        c.begin_write().unwrap();
        let results = crate::store::lifecycle::batch::each(c, &posts, |c, m| {
            crate::store::lifecycle::accept::accept_and_fan_out_with(c, m, Default::default(), limits, 1, &mut terms)
        })
        .unwrap();
        crate::store::control(c, "COMMIT").unwrap();
        let kinds: Vec<String> = results
            .iter()
            .map(|r| match r {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("{:?}", e.code()),
            })
            .collect();
        assert_eq!(kinds, ["ok", "Forbidden", "ok", "ok", "QuotaUnsettledMessages"], "{results:?}");
        assert!(results[1].as_ref().unwrap_err().to_string().contains("\"d1\""));
        let n: i64 = c.query_row("SELECT count(*) FROM messages", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 3);
    }

    /// At the bound: N unsettled messages are accepted, the next is refused naming the quota
    /// (a replay of an accepted one is not), and once they settle the producer posts again;
    /// the byte quota counts payload bytes the same way. Other producers are not limited.
    #[test]
    fn quotas_count_what_is_unsettled() {
        let db = testing::db();
        let c = &db.conn;
        record_certificate(c, "aa", baton_shared::ids::Role::Producer, "prod", i64::MAX, 1).unwrap();
        assert_eq!(quota_of(c, "prod").unwrap(), QUOTA_DEFAULT);
        let two = QuotaChange { unsettled_max: Some(Some(2)), ..Default::default() };
        assert_eq!(set_quota(c, "prod", two, "op", "r", 1).unwrap().unsettled_max, Some(2));
        post_to(c, "host-a", "k1", "{}").unwrap();
        post_to(c, "host-a", "k2", "{}").unwrap();
        let e = post_to(c, "host-a", "k3", "{}").unwrap_err();
        assert!(matches!(e, StoreError::OverQuota(QuotaKind::UnsettledMessages, _)), "{e}");
        assert_eq!(e.code(), baton_shared::error::ErrorCode::QuotaUnsettledMessages);
        post_to(c, "host-a", "k2", "{}").unwrap();
        // Retiring host-a fails its deliveries: both messages settle, room again.
        crate::store::lifecycle::operator::retire(c, "host-a", "op", "r", 2).unwrap();
        post_to(c, "host-b", "k3", "{}").unwrap();

        // Bytes: k3's `{}` (2) and 10 more fit in 12, one more byte does not; the message
        // limit made unlimited.
        let bytes = QuotaChange { unsettled_max: Some(None), unsettled_bytes_max: Some(Some(12)) };
        let q = set_quota(c, "prod", bytes, "op", "r", 3).unwrap();
        assert_eq!(q, Quota { unsettled_max: None, unsettled_bytes_max: Some(12) });
        post_to(c, "host-b", "k4", "[1,22,333]").unwrap();
        let rows = list(c).unwrap();
        assert_eq!((rows[0].unsettled, rows[0].unsettled_bytes), (2, 12));
        let e = post_to(c, "host-b", "k5", "1").unwrap_err();
        assert!(matches!(e, StoreError::OverQuota(QuotaKind::UnsettledBytes, _)), "{e}");
        assert!(e.to_string().contains("unsettled_bytes_max = 12"), "{e}");
        let other = NewMessage {
            traceparent: None,
            producer: "other".into(),
            conversation: "c".into(),
            idempotency_key: "free".into(),
            payload: "[1,22,333]".into(),
            to: vec!["host-b".into()],
            pools: Vec::new(),
        };
        accept(c, &other, AcceptLimits { queued_per_host_max: 1000, queued_per_pool_max: 1000 }, 3).unwrap();

        // Limits are checked before anything is stored, and the producer must exist.
        let zero = QuotaChange { unsettled_max: Some(Some(0)), ..Default::default() };
        assert!(matches!(set_quota(c, "prod", zero, "op", "r", 4), Err(StoreError::Invalid(_))));
        let huge = QuotaChange { unsettled_bytes_max: Some(Some(QUOTA_UNSETTLED_BYTES_MAX + 1)), ..Default::default() };
        assert!(matches!(set_quota(c, "prod", huge, "op", "r", 4), Err(StoreError::Invalid(_))));
        assert!(matches!(set_quota(c, "ghost", two, "op", "r", 4), Err(StoreError::NotFound(_))));
        assert!(matches!(set_quota(c, "prod", QuotaChange::default(), "op", "r", 4), Err(StoreError::Invalid(_))));
        assert_eq!(quota_of(c, "prod").unwrap(), q, "nothing refused was stored");
    }

    #[test]
    fn a_scope_is_checked_before_it_is_stored() {
        let db = testing::db();
        let c = &db.conn;
        assert!(matches!(set_scope(c, "ghost", &["*".into()], "op", "r", 1), Err(StoreError::NotFound(_))));
        record_certificate(c, "aa", baton_shared::ids::Role::Producer, "prod", i64::MAX, 1).unwrap();
        assert!(matches!(set_scope(c, "prod", &[], "op", "r", 1), Err(StoreError::Invalid(_))));
        assert!(matches!(set_scope(c, "prod", &["bad*x".into()], "op", "r", 1), Err(StoreError::Invalid(_))));
        let many: Vec<String> = (0..=SCOPE_PATTERNS_MAX).map(|i| format!("c{i}")).collect();
        assert!(matches!(set_scope(c, "prod", &many, "op", "r", 1), Err(StoreError::Invalid(_))));
        assert_eq!(scope_of(c, "prod").unwrap(), ["*"], "nothing was stored");
    }
}
