//! One bound node instance per host (SPEC §1, §5): the binding, what an instance holds, and how
//! often a host may change its instance.
//!
//! Invariant: a host has at most one bound node instance. A claim (or a new session) from
//! another instance is refused (`InstanceConflict`) while the bound one still holds anything;
//! once it holds nothing, the new instance takes the binding, recorded as an operator-visible
//! event, at most `limits.instance_rebinds_max` times per `limits.instance_rebind_window`.

use crate::store::engine::{Db, params};
use crate::store::{StoreError, StoreResult};
use baton_shared::limits::{INSTANCE_REBIND_WINDOW, INSTANCE_REBINDS_PER_WINDOW_MAX};

/// How many deliveries `instance_id` holds on `host`: claimed, mirrored, or delivered with no
/// outcome of the current run. Instance ids are scoped per host: another host's deliveries under
/// the same id are not counted.
pub fn holding_count(conn: &dyn Db, host: &str, instance_id: &str) -> StoreResult<i64> {
    Ok(conn
        .prepare_cached(
            "SELECT count(*) FROM deliveries d WHERE d.host = $1 AND d.instance_id = $2
               AND (d.state IN ('claimed', 'mirrored')
                    OR (d.state = 'delivered' AND NOT EXISTS (
                        SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)))",
        )?
        .query_row([host, instance_id], |r| r.get(0))?)
}

/// How often one host may change its bound node instance (`limits.instance_rebinds_max`) and over
/// what sliding window (`limits.instance_rebind_window`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebindLimit {
    /// Most changes within `window`.
    pub max: i64,
    /// The window they are counted over.
    pub window: std::time::Duration,
}

impl Default for RebindLimit {
    fn default() -> Self {
        RebindLimit { max: INSTANCE_REBINDS_PER_WINDOW_MAX, window: INSTANCE_REBIND_WINDOW }
    }
}

/// Binds `instance_id` to `host`, or refuses when another instance of the host still holds work
/// (`InstanceConflict`) or the host changed its binding too often (`OverCapacity`). The same
/// instance again changes nothing and records nothing; each actual change is one operator event.
pub(crate) fn bind_instance(
    conn: &dyn Db,
    host: &str,
    instance_id: &str,
    rebind: RebindLimit,
    now_ms: i64,
) -> StoreResult<()> {
    let bound: Option<String> =
        conn.prepare_cached("SELECT instance_id FROM hosts WHERE name = $1")?.query_row([host], |r| r.get(0))?;
    bind_over(conn, host, instance_id, bound, rebind, now_ms)
}

/// `bind_instance` over the binding `bound` the claim already read (`host_row`).
pub(crate) fn bind_over(
    conn: &dyn Db,
    host: &str,
    instance_id: &str,
    bound: Option<String>,
    rebind: RebindLimit,
    now_ms: i64,
) -> StoreResult<()> {
    if bound.as_deref() == Some(instance_id) {
        return Ok(());
    }
    if let Some(old) = &bound {
        let held = holding_count(conn, host, old)?;
        if held > 0 {
            return Err(StoreError::InstanceConflict(format!(
                "instance {old} of host {host} still holds {held} deliveries; only one instance of a host may be \
                 active (restart it with its own data directory, or requeue its claims with \
                 `baton-hub requeue --instance {old}` if it is gone for good)"
            )));
        }
    }
    let since = now_ms.saturating_sub(rebind.window.as_millis() as i64);
    let recent: i64 = conn
        .prepare_cached(
            "SELECT count(*) FROM operator_events WHERE action = 'bind_instance' AND subject = $1 AND at > $2",
        )?
        .query_row(params![host, since], |r| r.get(0))?;
    if recent >= rebind.max {
        return Err(StoreError::OverCapacity(format!(
            "host {host} changed its node instance {recent} times in the last {}s; at most {} are allowed \
             (limits.instance_rebinds_max per limits.instance_rebind_window): keep one instance id per data \
             directory",
            rebind.window.as_secs(),
            rebind.max
        )));
    }
    conn.prepare_cached("UPDATE hosts SET instance_id = $2, instance_since = $3 WHERE name = $1")?.execute(params![
        host,
        instance_id,
        now_ms
    ])?;
    conn.prepare_cached(
        "INSERT INTO operator_events (action, subject, operator, reason, at) VALUES ('bind_instance', $1, 'hub', $2, $3)",
    )?
    .execute(params![
        host,
        format!("instance {instance_id} replaces {}", bound.as_deref().unwrap_or("none")),
        now_ms
    ])?;
    Ok(())
}
