//! Attempt reports (`POST /delivery-report`): one attempt per node-scoped report id.
//!
//! Invariant: `(host, report_id)` is unique, so a retried report is counted once; the same id
//! with different content is refused and changes nothing.

use super::transition::Holder;
use super::{StoreError, StoreResult, corrupt, new_id, parse_column};
use baton_shared::crash_point;
use baton_shared::states::{DeliveryState, Outcome};
use baton_shared::wire::AttemptView;
use rusqlite::{Connection, OptionalExtension, named_params};
use sha2::{Digest, Sha256};

/// A validated report.
#[derive(Debug, Clone)]
pub struct NewReport<'a> {
    /// The delivery the attempt ran.
    pub delivery_id: &'a str,
    /// The holder.
    pub holder: Holder<'a>,
    /// Node-scoped idempotency key.
    pub report_id: &'a str,
    /// How the turn ended.
    pub outcome: Outcome,
    /// Exit status.
    pub exit_code: Option<i32>,
    /// Duration.
    pub duration_ms: Option<u64>,
    /// Bounded result body.
    pub result: Option<&'a str>,
    /// Why.
    pub reason: Option<&'a str>,
}

impl NewReport<'_> {
    fn hash(&self) -> String {
        let mut h = Sha256::new();
        let parts = [
            self.delivery_id.to_string(),
            self.holder.instance_id.to_string(),
            self.holder.claim_token.to_string(),
            self.outcome.as_str().to_string(),
            format!("{:?}", self.exit_code),
            format!("{:?}", self.duration_ms),
            format!("{:?}", self.result),
            format!("{:?}", self.reason),
        ];
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p.as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Records one attempt. Returns the attempt and whether it was already recorded.
pub fn report(conn: &Connection, host: &str, r: &NewReport<'_>, now_ms: i64) -> StoreResult<(AttemptView, bool)> {
    let hash = r.hash();
    let existing: Option<(String, String)> = conn
        .prepare_cached("SELECT id, request_hash FROM attempts WHERE host = ?1 AND report_id = ?2")?
        .query_row([host, r.report_id], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    if let Some((attempt_id, old)) = existing {
        if old != hash {
            return Err(StoreError::ReportConflict(format!(
                "report_id {:?} was already used by host {host} for a different report (attempt {attempt_id})",
                r.report_id
            )));
        }
        return Ok((attempt(conn, &attempt_id)?, true));
    }
    let row: Option<(String, String, Option<String>, Option<String>)> = conn
        .prepare_cached("SELECT host, state, instance_id, claim_token FROM deliveries WHERE id = ?1")?
        .query_row([r.delivery_id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))
        .optional()?;
    let Some((d_host, state, inst, tok)) = row else {
        return Err(StoreError::NotFound(format!("no delivery {}", r.delivery_id)));
    };
    if d_host != host {
        return Err(StoreError::NotYours(format!("delivery {} is not for host {host}", r.delivery_id)));
    }
    if inst.as_deref() != Some(r.holder.instance_id) || tok.as_deref() != Some(r.holder.claim_token) {
        return Err(StoreError::StaleClaim(format!(
            "delivery {} is {state} and not held by instance {} with that claim token",
            r.delivery_id, r.holder.instance_id
        )));
    }
    if state != DeliveryState::Delivered.as_str() {
        return Err(StoreError::InvalidTransition(format!(
            "delivery {} is {state}; an attempt can only be reported for a delivered delivery",
            r.delivery_id
        )));
    }
    // One execution, one outcome: a second node report (under another report id) for a delivery
    // that already has one would count a turn twice. Outcomes the hub wrote itself (`unknown`
    // after a requeue or retire, empty request hash) do not stand in the way of the real one.
    let reported: i64 = conn
        .prepare_cached("SELECT count(*) FROM attempts WHERE delivery_id = ?1 AND request_hash <> ''")?
        .query_row([r.delivery_id], |row| row.get(0))?;
    if reported > 0 {
        return Err(StoreError::ReportConflict(format!(
            "delivery {} already has a reported outcome; report_id {:?} would count its turn twice",
            r.delivery_id, r.report_id
        )));
    }
    let attempt_id = new_id();
    conn.prepare_cached(
        "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, exit_code,
                               duration_ms, result, reason, reported_at)
         VALUES (:id, :d, :h, :i, :r, :hash, :o, :e, :dur, :res, :why, :now)",
    )?
    .execute(named_params! {
        ":id": attempt_id, ":d": r.delivery_id, ":h": host, ":i": r.holder.instance_id, ":r": r.report_id,
        ":hash": hash, ":o": r.outcome.as_str(), ":e": r.exit_code, ":dur": r.duration_ms.map(|d| d as i64),
        ":res": r.result, ":why": r.reason, ":now": now_ms,
    })?;
    crash_point("hub.report.before_commit");
    Ok((attempt(conn, &attempt_id)?, false))
}

/// Reads one attempt.
pub fn attempt(conn: &Connection, attempt_id: &str) -> StoreResult<AttemptView> {
    Ok(conn
        .prepare_cached(
            "SELECT id, report_id, outcome, exit_code, duration_ms, result, reason, reported_at FROM attempts WHERE id = ?1",
        )?
        .query_row([attempt_id], attempt_row)?)
}

/// Maps an attempts row (in the column order used above) to its view. An outcome that does not
/// parse, or a negative duration, is an error naming the attempt.
pub fn attempt_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<AttemptView> {
    let attempt_id: String = r.get(0)?;
    let duration = match r.get::<_, Option<i64>>(4)? {
        None => None,
        Some(d) => Some(
            u64::try_from(d)
                .map_err(|_| corrupt(r, 4, "attempts", &attempt_id, "duration in milliseconds", &d.to_string()))?,
        ),
    };
    Ok(AttemptView {
        report_id: r.get(1)?,
        outcome: parse_column(r, 2, "attempts", &attempt_id, "outcome", Outcome::parse)?,
        exit_code: r.get(3)?,
        duration_ms: duration,
        result: r.get(5)?,
        reason: r.get(6)?,
        reported_at_ms: r.get(7)?,
        attempt_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::accept::testing::accept_one;
    use crate::store::{claim, testing};

    #[test]
    fn one_outcome_per_delivery_and_per_report_id() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k", &["host-a"]);
        let d = claim::claim(&db.conn, "host-a", "i", 1, 1).unwrap().remove(0);
        let holder = Holder { instance_id: "i", claim_token: &d.claim_token };
        let r = |id: &'static str, outcome| NewReport {
            delivery_id: &d.delivery_id,
            holder,
            report_id: id,
            outcome,
            exit_code: Some(0),
            duration_ms: Some(5),
            result: Some("ok"),
            reason: None,
        };
        assert!(matches!(
            report(&db.conn, "host-a", &r("a1", Outcome::Succeeded), 2),
            Err(StoreError::InvalidTransition(_))
        ));
        claim::mirrored(&db.conn, "host-a", &d.delivery_id, holder, 2).unwrap();
        claim::ack(&db.conn, "host-a", &d.delivery_id, holder, 3).unwrap();
        let (first, dup) = report(&db.conn, "host-a", &r("a1", Outcome::Succeeded), 4).unwrap();
        assert!(!dup);
        let (again, dup) = report(&db.conn, "host-a", &r("a1", Outcome::Succeeded), 5).unwrap();
        assert!(dup);
        assert_eq!(again, first, "a replay answers the same attempt");
        assert!(matches!(report(&db.conn, "host-a", &r("a1", Outcome::Failed), 6), Err(StoreError::ReportConflict(_))));
        assert!(matches!(
            report(&db.conn, "host-a", &r("a2", Outcome::Succeeded), 6),
            Err(StoreError::ReportConflict(_))
        ));
        let n: i64 = db.conn.query_row("SELECT count(*) FROM attempts", [], |row| row.get(0)).unwrap();
        assert_eq!(n, 1);
    }
}
