//! Producers' publish scopes (SPEC §3): the conversations a producer may post into.
//!
//! A scope is a set of patterns, each an exact conversation name or a prefix followed by `*`
//! (`support-*`; `*` alone is every conversation). It is stored with the producer's record;
//! a producer with no stored scope has the default, `*`. The acceptance transaction checks it,
//! so a post outside the scope is refused (`forbidden`, naming the conversation) and a scope
//! change takes effect on the next post.

use super::db::Db;
use super::hosts::record_operator_event;
use super::{StoreError, StoreResult};
use baton_shared::ids::{NAME_CHARS_MAX, check_name};
use rusqlite::named_params;

/// Most patterns one producer's scope may hold; the accept checks them all on every post.
pub const SCOPE_PATTERNS_MAX: usize = 64;

/// The scope a producer has when none is stored: every conversation.
pub const SCOPE_DEFAULT: &str = "*";

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
        .prepare_cached("SELECT pattern FROM producer_scopes WHERE producer = ?1 ORDER BY pattern")?
        .query_map([producer], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
}

/// The producer's scope: its stored patterns, or `[SCOPE_DEFAULT]` when none is stored.
pub fn scope_of(conn: &dyn Db, producer: &str) -> StoreResult<Vec<String>> {
    let patterns = stored(conn, producer)?;
    Ok(if patterns.is_empty() { vec![SCOPE_DEFAULT.to_string()] } else { patterns })
}

/// Refuses (`Forbidden`, naming the conversation and the scope) a post by `producer` into a
/// conversation its scope does not cover.
pub fn check_may_post(conn: &dyn Db, producer: &str, conversation: &str) -> StoreResult<()> {
    let scope = scope_of(conn, producer)?;
    if scope.iter().any(|p| covers(p, conversation)) {
        return Ok(());
    }
    Err(StoreError::Forbidden(format!(
        "producer {producer} may not post into conversation {conversation:?} (its publish scope is {})",
        scope.join(" ")
    )))
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
    check_name("producer", producer).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let enrolled: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM certificates WHERE role = 'producer' AND name = ?1)")?
        .query_row([producer], |r| r.get(0))?;
    if !enrolled {
        return Err(StoreError::NotFound(format!("no producer {producer} was ever enrolled")));
    }
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
    conn.prepare_cached("DELETE FROM producer_scopes WHERE producer = ?1")?.execute([producer])?;
    for p in &patterns {
        conn.prepare_cached(
            "INSERT INTO producer_scopes (producer, pattern, set_by, set_at) VALUES (:p, :pattern, :op, :now)",
        )?
        .execute(named_params! {":p": producer, ":pattern": p, ":op": operator, ":now": now_ms})?;
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
        out.push(ProducerRow {
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
    use crate::store::accept::{AcceptLimits, NewMessage, accept};
    use crate::store::hosts::record_certificate;
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

    fn post(conn: &dyn Db, producer: &str, conversation: &str, key: &str) -> StoreResult<()> {
        let msg = NewMessage {
            producer: producer.into(),
            conversation: conversation.into(),
            idempotency_key: key.into(),
            payload: "{}".into(),
            to: vec!["host-a".into()],
        };
        accept(conn, &msg, AcceptLimits { queued_per_host_max: 1000 }, 1).map(|_| ())
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
