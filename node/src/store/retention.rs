//! Local retention: the rows of a delivery the hub has settled are removed once they are older
//! than `local_retention`, so the store stays bounded however many turns the node runs.
//!
//! Settled means the hub has everything it will ever want from this node about the delivery:
//! its attempt's report was confirmed (`done` with a confirmed report), or the hub took the
//! delivery back before it ran (`dropped`). Never removed: anything waiting, running or
//! unreported, and a report the hub refused for good (`status` lists it for the operator).
//!
//! What removal gives up: within `local_retention` a delivery the hub hands out again (after
//! losing its own record, say from an old backup) is recognised as already run and never run
//! twice; after it, the node no longer knows it.

use super::{Db, StoreError};
use rusqlite::TransactionBehavior;

impl Db {
    /// Removes every row of up to `limit` deliveries settled before `cutoff_ms` (unix ms),
    /// oldest first, in one transaction. Returns how many deliveries were removed; fewer than
    /// `limit` means none is left to remove.
    pub fn remove_settled(&mut self, cutoff_ms: i64, limit: u32) -> Result<u32, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let ids: Vec<String> = {
            let mut st = tx.prepare_cached(
                "SELECT d.delivery_id FROM deliveries d
                 WHERE d.state IN ('done', 'dropped') AND d.updated_at_ms < ?1
                   AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = d.delivery_id
                                     AND (o.confirmed_at_ms IS NULL OR o.dead_at_ms IS NOT NULL))
                   AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.delivery_id
                                     AND a.ended_at_ms IS NULL)
                 ORDER BY d.updated_at_ms, d.delivery_id LIMIT ?2",
            )?;
            st.query_map((cutoff_ms, limit), |r| r.get(0))?.collect::<Result<_, _>>()?
        };
        for id in &ids {
            // Children first: the foreign keys point at the delivery.
            for sql in [
                "DELETE FROM outbox WHERE delivery_id = ?1",
                "DELETE FROM attempts WHERE delivery_id = ?1",
                "DELETE FROM executions WHERE delivery_id = ?1",
            ] {
                tx.prepare_cached(sql)?.execute([id])?;
            }
            let n = tx.prepare_cached("DELETE FROM deliveries WHERE delivery_id = ?1")?.execute([id])?;
            if n != 1 {
                return Err(StoreError::Conflict(format!("delivery {id} vanished while it was being removed")));
            }
        }
        tx.commit()?;
        Ok(u32::try_from(ids.len()).unwrap_or(limit))
    }
}
