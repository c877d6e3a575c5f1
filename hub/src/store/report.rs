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

/// The prefix of a request hash in the canonical encoding (`NewReport::request_hash`). A stored
/// hash without it was written by an earlier version, from `Debug` output; such rows are
/// compared field by field instead (`same_as_stored`).
pub const REQUEST_HASH_PREFIX: &str = "v2:";

impl NewReport<'_> {
    /// The request hash stored with the attempt: `v2:` and the lowercase hex SHA-256 of the
    /// canonical encoding of, in this order, `delivery_id`, `instance_id`, `claim_token`,
    /// `outcome`, `exit_code`, `duration_ms`, `result`, `reason` (the report id is the key the
    /// hash is looked up by, not part of it). Each field is one byte `0x00` when absent, or one
    /// byte `0x01`, its length in bytes as a little-endian `u64`, and its bytes when present.
    /// Text is its UTF-8; numbers are their decimal digits (with a leading `-` when negative);
    /// the outcome is its wire name. Nothing here depends on how Rust formats a value.
    pub fn request_hash(&self) -> String {
        let exit_code = self.exit_code.map(|c| c.to_string());
        let duration_ms = self.duration_ms.map(|d| d.to_string());
        let fields: [Option<&str>; 8] = [
            Some(self.delivery_id),
            Some(self.holder.instance_id),
            Some(self.holder.claim_token),
            Some(self.outcome.as_str()),
            exit_code.as_deref(),
            duration_ms.as_deref(),
            self.result,
            self.reason,
        ];
        let mut h = Sha256::new();
        for field in fields {
            match field {
                None => h.update([0u8]),
                Some(text) => {
                    h.update([1u8]);
                    h.update((text.len() as u64).to_le_bytes());
                    h.update(text.as_bytes());
                }
            }
        }
        let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        format!("{REQUEST_HASH_PREFIX}{hex}")
    }
}

/// Whether a stored request hash stands for the same report as `r`. A hash in the canonical
/// form is compared as it is; an empty one marks an outcome the hub wrote itself, which no
/// node report repeats; any other was written by an earlier version from `Debug` output, so the
/// stored attempt's fields (and its delivery's claim token) are compared with the report's.
fn same_as_stored(conn: &Connection, attempt_id: &str, stored: &str, r: &NewReport<'_>) -> StoreResult<bool> {
    if stored.starts_with(REQUEST_HASH_PREFIX) {
        return Ok(stored == r.request_hash());
    }
    if stored.is_empty() {
        return Ok(false);
    }
    let row = conn
        .prepare_cached(
            "SELECT a.delivery_id, a.instance_id, a.outcome, a.exit_code, a.duration_ms, a.result, a.reason,
                    d.claim_token
             FROM attempts a JOIN deliveries d ON d.id = a.delivery_id WHERE a.id = ?1",
        )?
        .query_row([attempt_id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, String>(2)?,
                row.get::<_, Option<i32>>(3)?,
                row.get::<_, Option<i64>>(4)?,
                row.get::<_, Option<String>>(5)?,
                row.get::<_, Option<String>>(6)?,
                row.get::<_, Option<String>>(7)?,
            ))
        })?;
    let (delivery_id, instance_id, outcome, exit_code, duration_ms, result, reason, claim_token) = row;
    Ok(delivery_id == r.delivery_id
        && instance_id == r.holder.instance_id
        && claim_token.as_deref() == Some(r.holder.claim_token)
        && outcome == r.outcome.as_str()
        && exit_code == r.exit_code
        && duration_ms == r.duration_ms.and_then(|d| i64::try_from(d).ok())
        && result.as_deref() == r.result
        && reason.as_deref() == r.reason)
}

/// Records one attempt. Returns the attempt and whether it was already recorded.
pub fn report(conn: &Connection, host: &str, r: &NewReport<'_>, now_ms: i64) -> StoreResult<(AttemptView, bool)> {
    let hash = r.request_hash();
    let existing: Option<(String, String)> = conn
        .prepare_cached("SELECT id, request_hash FROM attempts WHERE host = ?1 AND report_id = ?2")?
        .query_row([host, r.report_id], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    if let Some((attempt_id, stored)) = existing {
        if !same_as_stored(conn, &attempt_id, &stored, r)? {
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
        signal: None,
        attempt: 1,
        retryable: false,
        rerun: None,
        caused_by: None,
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

    /// Regression: the request hash was built from `Debug` output, which a toolchain change can
    /// alter. These vectors were computed from the documented encoding by a separate program
    /// (Python's hashlib), not by this code.
    #[test]
    fn the_request_hash_is_the_documented_encoding() {
        let holder = Holder { instance_id: "inst-1", claim_token: "tok-1" };
        let full = NewReport {
            delivery_id: "d-1",
            holder,
            report_id: "r-1",
            outcome: Outcome::Failed,
            exit_code: Some(-2),
            duration_ms: Some(1500),
            result: Some("out\n\"quoted\""),
            reason: None,
        };
        assert_eq!(full.request_hash(), "v2:7d33baf816950829c40cdcfb9ca3bd418290ae059a7a883e65c0ff26bf91e892");
        let bare = NewReport {
            outcome: Outcome::Succeeded,
            exit_code: None,
            duration_ms: None,
            result: None,
            report_id: "another id, same hash",
            ..full
        };
        assert_eq!(bare.request_hash(), "v2:784484d2afc51351378009b1a131cb57994120da143cb74bd640e6c3561e4020");
    }

    /// The hash an earlier version stored (from `Debug` output), reproduced to fake its rows.
    fn legacy_hash(r: &NewReport<'_>) -> String {
        let mut h = Sha256::new();
        let parts = [
            r.delivery_id.to_string(),
            r.holder.instance_id.to_string(),
            r.holder.claim_token.to_string(),
            r.outcome.as_str().to_string(),
            format!("{:?}", r.exit_code),
            format!("{:?}", r.duration_ms),
            format!("{:?}", r.result),
            format!("{:?}", r.reason),
        ];
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p.as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A report replayed after an upgrade, against a row an earlier version wrote, is still the
    /// same report (compared field by field), and a different one under its id still conflicts.
    #[test]
    fn a_row_written_by_an_earlier_version_still_recognises_its_replay() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k", &["host-a"]);
        let d = claim::claim(&db.conn, "host-a", "i", 1, 1).unwrap().remove(0);
        let holder = Holder { instance_id: "i", claim_token: &d.claim_token };
        claim::mirrored(&db.conn, "host-a", &d.delivery_id, holder, 2).unwrap();
        claim::ack(&db.conn, "host-a", &d.delivery_id, holder, 3).unwrap();
        let r = NewReport {
            delivery_id: &d.delivery_id,
            holder,
            report_id: "a1",
            outcome: Outcome::Failed,
            exit_code: Some(3),
            duration_ms: Some(40),
            result: Some("partial \"output\""),
            reason: Some("exit 3"),
        };
        let (first, _) = report(&db.conn, "host-a", &r, 4).unwrap();
        db.conn.execute("UPDATE attempts SET request_hash = ?1", [legacy_hash(&r)]).unwrap();
        let (again, dup) = report(&db.conn, "host-a", &r, 5).unwrap();
        assert!(dup);
        assert_eq!(again, first);
        for other in [
            NewReport { exit_code: Some(4), ..r.clone() },
            NewReport { duration_ms: None, ..r.clone() },
            NewReport { result: Some("other"), ..r.clone() },
            NewReport { reason: None, ..r.clone() },
            NewReport { outcome: Outcome::Succeeded, ..r.clone() },
            NewReport { holder: Holder { instance_id: "i", claim_token: "another-token" }, ..r.clone() },
        ] {
            assert!(matches!(report(&db.conn, "host-a", &other, 6), Err(StoreError::ReportConflict(_))), "{other:?}");
        }
        // An outcome the hub wrote itself (empty hash) is never taken for a node's report.
        db.conn.execute("UPDATE attempts SET request_hash = ''", []).unwrap();
        assert!(matches!(report(&db.conn, "host-a", &r, 7), Err(StoreError::ReportConflict(_))));
    }
}
