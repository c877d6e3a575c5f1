//! A pool conversation's flight (SPEC §2, "Order in a pool"): which host its turns are bound to
//! while any of them is in flight, and which host ran its last one.
//!
//! Invariant (affinity): for each (pool, conversation), `pool_queues.in_flight` counts the pool
//! deliveries that are claimed, mirrored, or delivered without an outcome of their current run,
//! and `bound_host` is the one host they are all on, set exactly while that count is above zero.
//! A flight begins only in the claim (`began`, queued → claimed, by the bound host or on a free
//! conversation); it ends exactly once per run: when a claimed or mirrored delivery leaves those
//! states (`transition::apply`), or when a delivered one's run gets its outcome (a node's report
//! or the hub's `unknown` for a requeue or retire; the node's report that replaces the hub's
//! ends nothing again). The end records the host as `last_host`, preferred by the claim for
//! `limits.pool_affinity_wait` once nothing is in flight.

use crate::store::engine::{Db, OptionalExtension, params};
use crate::store::{StoreError, StoreResult};

/// A turn of `conversation` in `pool` is handed to `host`: the conversation is bound to it.
pub(crate) fn began(conn: &dyn Db, pool: &str, conversation: &str, host: &str) -> StoreResult<()> {
    let rows = conn
        .prepare_cached(
            "UPDATE pool_queues SET in_flight = in_flight + 1, bound_host = $3
             WHERE pool = $1 AND conversation = $2 AND (bound_host IS NULL OR bound_host = $3)",
        )?
        .execute(params![pool, conversation, host])?;
    if rows != 1 {
        return Err(StoreError::Corrupt(format!(
            "pool {pool}, conversation {conversation}: a turn was handed to {host} while the conversation is \
             bound to another host or has no queue row"
        )));
    }
    Ok(())
}

/// A turn of `conversation` in `pool` on `host` left flight at `now_ms`. Returns whether the
/// conversation is free now (nothing of it in flight): the pool's other members may take its
/// next turn once the affinity wait is over.
pub(crate) fn ended(conn: &dyn Db, pool: &str, conversation: &str, host: &str, now_ms: i64) -> StoreResult<bool> {
    let left: Option<i64> = conn
        .prepare_cached(
            "UPDATE pool_queues SET in_flight = in_flight - 1,
                    bound_host = CASE WHEN in_flight = 1 THEN NULL ELSE bound_host END,
                    last_host = $3, last_settled_at = $4
             WHERE pool = $1 AND conversation = $2 AND in_flight > 0
             RETURNING in_flight",
        )?
        .query_row(params![pool, conversation, host, now_ms], |r| r.get(0))
        .optional()?;
    match left {
        Some(n) => Ok(n == 0),
        None => Err(StoreError::Corrupt(format!(
            "pool {pool}, conversation {conversation}: a turn on {host} left flight while none was in flight"
        ))),
    }
}

/// The pool, conversation and host of a delivery, when it is a pool delivery that has a host.
pub(crate) fn of_delivery(conn: &dyn Db, delivery_id: &str) -> StoreResult<Option<(String, String, String)>> {
    let row: Option<(Option<String>, String, Option<String>)> = conn
        .prepare_cached("SELECT pool, conversation, host FROM deliveries WHERE id = $1")?
        .query_row([delivery_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    Ok(match row {
        Some((Some(pool), conversation, Some(host))) => Some((pool, conversation, host)),
        _ => None,
    })
}

/// Ends the flight of a delivery's run when it is a pool delivery: returns the pool when the
/// conversation became free.
pub(crate) fn ended_delivery(conn: &dyn Db, delivery_id: &str, now_ms: i64) -> StoreResult<Option<String>> {
    let Some((pool, conversation, host)) = of_delivery(conn, delivery_id)? else { return Ok(None) };
    Ok(ended(conn, &pool, &conversation, &host, now_ms)?.then_some(pool))
}
