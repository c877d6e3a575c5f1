//! The breaker's turns per period: a conversation whose turns keep coming (a loop that keeps it
//! busy, each turn succeeding, costs as much as one that keeps failing) gets a hold fence set by
//! the hub once it exceeds `limits.breaker_turns` turns within `limits.breaker_period`, beside
//! the failures-in-a-row trigger of `approval::count_outcome`. The fence is the same kind (a
//! hold on the conversation, set by `approval::BREAKER_ACTOR`, its reason starting as every
//! breaker's), so `status` lists it as `breaker_tripped` and lifting it is an ordinary `fence
//! lift`.
//!
//! The period is a fixed window per conversation (`breaker_periods`, migration 0015), starting
//! at its first counted turn; a turn is counted when its outcome is reported (`report::report_run`,
//! in the report's transaction). Off by default (`turns` 0): nothing is counted or written.
//!
//! Invariant: with the breaker off, a report writes nothing here.

use crate::store::StoreResult;
use crate::store::engine::{Db, params};
use crate::store::lifecycle::approval::{BREAKER_ACTOR, BREAKER_REASON_START, Tripped};
use crate::store::registry::fences::{self, FenceKind, FenceScope, NewFence};
use std::time::Duration;

/// The turns-per-period trigger's bounds (`limits.breaker_turns`, `limits.breaker_period`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TurnsPerPeriod {
    /// Most turns within one period (0: off).
    pub turns: u32,
    /// The period.
    pub period: Duration,
}

/// The reason the fence carries: the count, the period and the limits.
pub fn reason(turns: i64, limit: TurnsPerPeriod) -> String {
    let period = baton_shared::duration::human(limit.period);
    format!(
        "{BREAKER_REASON_START}{turns} turns within {period} (limits.breaker_turns = {} per limits.breaker_period = \
         {period})",
        limit.turns
    )
}

/// Counts one turn of `conversation` (its outcome was just reported) and, past the limit,
/// holds the conversation (unless a hold is active on it already); the count starts again with
/// the next turn. Call inside the report's write transaction.
pub fn count_turn(
    conn: &dyn Db,
    conversation: &str,
    limit: TurnsPerPeriod,
    now_ms: i64,
) -> StoreResult<Option<Tripped>> {
    if limit.turns == 0 {
        return Ok(None);
    }
    let period_ms = i64::try_from(limit.period.as_millis()).unwrap_or(i64::MAX);
    let turns: i64 = conn
        .prepare_cached(
            "INSERT INTO breaker_periods AS t (conversation, period_start, turns) VALUES ($1, $2, 1)
             ON CONFLICT (conversation) DO UPDATE SET
                 turns = CASE WHEN $2 - t.period_start >= $3 THEN 1 ELSE t.turns + 1 END,
                 period_start = CASE WHEN $2 - t.period_start >= $3 THEN $2 ELSE t.period_start END
             RETURNING turns",
        )?
        .query_row(params![conversation, now_ms, period_ms], |r| r.get(0))?;
    if turns <= i64::from(limit.turns) {
        return Ok(None);
    }
    conn.prepare_cached("DELETE FROM breaker_periods WHERE conversation = $1")?.execute([conversation])?;
    if fences::active_same(conn, FenceKind::Hold, FenceScope::Conversation, Some(conversation))?.is_some() {
        return Ok(None);
    }
    let why = reason(turns, limit);
    let fence = NewFence {
        kind: FenceKind::Hold,
        scope: FenceScope::Conversation,
        target: Some(conversation),
        operator: BREAKER_ACTOR,
        reason: &why,
    };
    let fence_id = fences::set(conn, fence, now_ms)?;
    Ok(Some(Tripped { fence_id, conversation: conversation.to_string(), failures: 0 }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;

    /// Within one period the limit's turns pass and the next trips the breaker (one hold fence,
    /// its reason naming the count); a new period starts the count again; off counts nothing.
    #[test]
    fn more_turns_than_the_limit_within_a_period_hold_the_conversation() {
        let db = testing::db();
        let c = &*db.conn;
        let limit = TurnsPerPeriod { turns: 3, period: Duration::from_secs(60) };
        for at in [0, 1_000, 2_000] {
            assert!(count_turn(c, "loop", limit, at).unwrap().is_none());
        }
        let tripped = count_turn(c, "loop", limit, 3_000).unwrap().expect("the fourth turn trips it");
        let fence = fences::list(c, true).unwrap().into_iter().find(|f| f.id == tripped.fence_id).unwrap();
        assert_eq!((fence.kind, fence.set_by.as_str()), (FenceKind::Hold, BREAKER_ACTOR));
        assert!(crate::store::lifecycle::approval::is_breaker(&fence), "{fence:?}");
        assert!(fence.reason.contains("4 turns within 1m") && fence.reason.contains("limits.breaker_turns = 3"));
        // Held already: counted again from zero, no second fence.
        for at in [4_000, 5_000, 6_000, 7_000] {
            assert!(count_turn(c, "loop", limit, at).unwrap().is_none());
        }
        // Spread over periods: never more than the limit in one.
        for at in [100_000, 110_000, 120_000, 200_000, 210_000, 220_000] {
            assert!(count_turn(c, "calm", limit, at).unwrap().is_none(), "{at}");
        }
        let off = TurnsPerPeriod { turns: 0, period: Duration::from_secs(60) };
        assert!(count_turn(c, "quiet", off, 0).unwrap().is_none());
        let rows: i64 =
            c.query_row("SELECT count(*) FROM breaker_periods WHERE conversation = 'quiet'", [], |r| r.get(0)).unwrap();
        assert_eq!(rows, 0, "off: nothing written");
    }
}
