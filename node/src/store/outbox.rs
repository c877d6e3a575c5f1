//! The report outbox: every ended attempt's report, kept until the hub confirms it (or refuses
//! it for good, which marks it dead).

use super::{Db, StoreError};
use baton_shared::crash_point;
use baton_shared::wire::ReportRequest;
use rusqlite::TransactionBehavior;

/// Where an ended attempt's report is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportState {
    /// Waiting in the outbox for the hub's confirmation.
    Pending,
    /// The hub confirmed it.
    Confirmed,
    /// The hub refused it for good (409); it will not be retried.
    Dead,
}

/// One report waiting in the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEntry {
    /// The report id (= attempt id).
    pub report_id: String,
    /// The delivery reported on.
    pub delivery_id: String,
    /// The exact request body.
    pub body: ReportRequest,
    /// The delivery's W3C `traceparent`, the parent of the report's span (`None` when the hub
    /// sent none, or the local copy is gone).
    pub traceparent: Option<String>,
}

impl Db {
    /// Up to `limit` reports not yet confirmed nor dead, oldest first.
    pub fn pending_reports(&self, limit: u32) -> Result<Vec<OutboxEntry>, StoreError> {
        let mut st = self.conn.prepare_cached(
            "SELECT o.report_id, o.delivery_id, o.body, d.traceparent FROM outbox o
             LEFT JOIN deliveries d ON d.delivery_id = o.delivery_id
             WHERE o.confirmed_at_ms IS NULL AND o.dead_at_ms IS NULL ORDER BY o.created_at_ms, o.report_id LIMIT ?1",
        )?;
        let rows = st.query_map([limit], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, Option<String>>(3)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (report_id, delivery_id, body, traceparent) = row?;
            let body: ReportRequest = serde_json::from_str(&body).map_err(|e| {
                StoreError::corrupt(format!("outbox {report_id}"), format!("body is not a report ({e})"))
            })?;
            if body.report_id != report_id || body.delivery_id != delivery_id {
                return Err(StoreError::corrupt(format!("outbox {report_id}"), "body names another report"));
            }
            out.push(OutboxEntry { report_id, delivery_id, body, traceparent });
        }
        Ok(out)
    }

    /// Records a failed try to send a report.
    pub fn report_tried(&mut self, report_id: &str, error: &str, now_ms: i64) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "UPDATE outbox SET tries = tries + 1, last_try_at_ms = ?2, last_error = ?3 WHERE report_id = ?1",
            )?
            .execute((report_id, now_ms, error))?;
        Ok(())
    }

    /// Marks a report confirmed by the hub; its delivery is done.
    pub fn report_confirmed(&mut self, report_id: &str, now_ms: i64) -> Result<(), StoreError> {
        self.finish_report(report_id, None, now_ms)
    }

    /// Marks a report refused for good (never retried); its delivery is done, with the reason.
    pub fn report_dead(&mut self, report_id: &str, reason: &str, now_ms: i64) -> Result<(), StoreError> {
        self.finish_report(report_id, Some(reason), now_ms)
    }

    /// Settles many reports in one transaction (one sync for an outbox batch): each
    /// `(report id, None)` confirmed by the hub, each `(report id, Some(reason))` refused for
    /// good. Each is guarded as in `report_confirmed`; one that is no longer pending changes
    /// nothing and fails no other. Returns, per item, whether it was settled. A crash before
    /// the commit settles none: they are sent again (same report ids, counted once).
    pub fn finish_reports(&mut self, done: &[(String, Option<String>)], now_ms: i64) -> Result<Vec<bool>, StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut settled = Vec::with_capacity(done.len());
        for (i, (report_id, dead)) in done.iter().enumerate() {
            settled.push(finish_report_in(&tx, report_id, dead.as_deref(), now_ms)?);
            if i == 0 {
                crash_point("node.report.settle_mid");
            }
        }
        tx.commit()?;
        Ok(settled)
    }

    /// Records a failed try to send each of `report_ids` (one request carried them all), in one
    /// transaction.
    pub fn reports_tried(&mut self, report_ids: &[String], error: &str, now_ms: i64) -> Result<(), StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for report_id in report_ids {
            tx.prepare_cached(
                "UPDATE outbox SET tries = tries + 1, last_try_at_ms = ?2, last_error = ?3 WHERE report_id = ?1",
            )?
            .execute((report_id, now_ms, error))?;
        }
        tx.commit()?;
        Ok(())
    }

    fn finish_report(&mut self, report_id: &str, dead: Option<&str>, now_ms: i64) -> Result<(), StoreError> {
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if !finish_report_in(&tx, report_id, dead, now_ms)? {
            return Err(StoreError::Conflict(format!("report {report_id} is not pending")));
        }
        tx.commit()?;
        Ok(())
    }

    /// Puts a confirmed report back in the outbox (the hub lists its delivery without an
    /// outcome, so it must not have kept it). The same report id makes the resend idempotent.
    pub fn reopen_report(&mut self, report_id: &str) -> Result<bool, StoreError> {
        let n = self
            .conn
            .prepare_cached(
                "UPDATE outbox SET confirmed_at_ms = NULL WHERE report_id = ?1 AND confirmed_at_ms IS NOT NULL",
            )?
            .execute([report_id])?;
        Ok(n == 1)
    }
}

/// Settles one pending report (confirmed, or dead with `dead`'s reason) and, when it is the
/// report of its delivery's current run, the delivery. Returns false (nothing written) when the
/// report is not pending.
fn finish_report_in(
    tx: &rusqlite::Connection,
    report_id: &str,
    dead: Option<&str>,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let n = match dead {
        None => tx
            .prepare_cached(
                "UPDATE outbox SET confirmed_at_ms = ?2, tries = tries + 1, last_try_at_ms = ?2, last_error = NULL
             WHERE report_id = ?1 AND confirmed_at_ms IS NULL AND dead_at_ms IS NULL",
            )?
            .execute((report_id, now_ms))?,
        Some(reason) => tx
            .prepare_cached(
                "UPDATE outbox SET dead_at_ms = ?2, dead_reason = ?3, tries = tries + 1, last_try_at_ms = ?2
             WHERE report_id = ?1 AND confirmed_at_ms IS NULL AND dead_at_ms IS NULL",
            )?
            .execute((report_id, now_ms, reason))?,
    };
    if n != 1 {
        return Ok(false);
    }
    // Only the report of the delivery's current run settles it: a later run may be waiting.
    tx.prepare_cached(
        "UPDATE deliveries SET state = 'done', reason = ?2, updated_at_ms = ?3
         WHERE (delivery_id, run) = (SELECT a.delivery_id, a.run FROM attempts a WHERE a.attempt_id = ?1)",
    )?
    .execute((report_id, dead, now_ms))?;
    Ok(true)
}
