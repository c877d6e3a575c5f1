//! A report's identity: the request hash stored with its attempt, and whether a report seen
//! again under its report id is the same report (a replay, answered as before) or another one
//! (`ReportConflict`). The hash is a canonical encoding (`NewReport::request_hash`), written so
//! nothing in it depends on how Rust formats a value; rows an earlier version wrote are
//! compared field by field (`same_as_stored`).

use crate::store::StoreResult;
use crate::store::engine::Db;
use crate::store::lifecycle::transition::Holder;
use baton_shared::states::{Outcome, StoppedBy};
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
    /// The end of the harness's stderr, as the node sent it (the store keeps at most
    /// `RunReport::stderr_tail_bytes_max` of it).
    pub stderr_tail: Option<&'a str>,
    /// How many stderr bytes came before `stderr_tail`, as the node counted them.
    pub stderr_dropped_bytes: Option<u64>,
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
        self.request_hash_of_run(None, None)
    }

    /// The request hash of a report that also names its run and the signal that ended it: as
    /// `request_hash`, followed, only when either (or a stderr tail) is present, by `signal`
    /// and `attempt` in the same encoding (so a report without them hashes as before), and then,
    /// only when the report carries a stderr tail, by `stderr_tail` and `stderr_dropped_bytes`
    /// as the node sent them (so a replay matches whatever the hub's `stderr_tail_bytes_max`
    /// keeps of them).
    pub fn request_hash_of_run(&self, attempt: Option<u32>, signal: Option<i32>) -> String {
        self.request_hash_stopped(attempt, signal, None)
    }

    /// `request_hash_of_run`, followed, only when the report names the bound that stopped the
    /// turn, by a field of its wire word (so every other report hashes as before).
    pub fn request_hash_stopped(
        &self,
        attempt: Option<u32>,
        signal: Option<i32>,
        stopped: Option<StoppedBy>,
    ) -> String {
        let exit_code = self.exit_code.map(|c| c.to_string());
        let duration_ms = self.duration_ms.map(|d| d.to_string());
        let (signal, attempt) = (signal.map(|s| s.to_string()), attempt.map(|a| a.to_string()));
        let dropped = self.stderr_dropped_bytes.map(|d| d.to_string());
        let stderr = self.stderr_tail.is_some() || dropped.is_some();
        let mut fields: Vec<Option<&str>> = vec![
            Some(self.delivery_id),
            Some(self.holder.instance_id),
            Some(self.holder.claim_token),
            Some(self.outcome.as_str()),
            exit_code.as_deref(),
            duration_ms.as_deref(),
            self.result,
            self.reason,
        ];
        if signal.is_some() || attempt.is_some() || stderr {
            fields.extend([signal.as_deref(), attempt.as_deref()]);
        }
        if stderr {
            fields.extend([self.stderr_tail, dropped.as_deref()]);
        }
        if let Some(by) = stopped {
            fields.push(Some(by.as_str()));
        }
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

/// Whether a stored request hash stands for the same report as `r`, whose canonical hash (with
/// its run and signal when the report named them) is `hash`. A hash in the canonical form is
/// compared as it is; an empty one marks an outcome the hub wrote itself, which no
/// node report repeats; any other was written by an earlier version from `Debug` output, so the
/// stored attempt's fields (and its delivery's claim token) are compared with the report's.
pub(super) fn same_as_stored(
    conn: &dyn Db,
    attempt_id: &str,
    stored: &str,
    hash: &str,
    r: &NewReport<'_>,
) -> StoreResult<bool> {
    if stored.starts_with(REQUEST_HASH_PREFIX) {
        return Ok(stored == hash);
    }
    if stored.is_empty() {
        return Ok(false);
    }
    let row = conn
        .prepare_cached(
            "SELECT a.delivery_id, a.instance_id, a.outcome, a.exit_code, a.duration_ms, a.result, a.reason,
                    d.claim_token
             FROM attempts a JOIN deliveries d ON d.id = a.delivery_id WHERE a.id = $1",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::lifecycle::report::report;
    use crate::store::{lifecycle::claim, testing};

    /// A report without a stderr tail hashes as before the field existed; one with a tail but no
    /// signal or run cannot be taken for one whose signal and run spell the same text.
    #[test]
    fn the_stderr_tail_extends_the_request_hash_without_ambiguity() {
        let holder = Holder { instance_id: "inst-1", claim_token: "tok-1" };
        let bare = NewReport {
            delivery_id: "d-1",
            holder,
            report_id: "r-1",
            outcome: Outcome::Failed,
            exit_code: Some(-2),
            duration_ms: Some(1500),
            result: Some("out\n\"quoted\""),
            reason: None,
            stderr_tail: None,
            stderr_dropped_bytes: None,
        };
        assert_eq!(bare.request_hash(), "v2:7d33baf816950829c40cdcfb9ca3bd418290ae059a7a883e65c0ff26bf91e892");
        let with_tail = NewReport { stderr_tail: Some("9"), stderr_dropped_bytes: Some(1), ..bare.clone() };
        assert_ne!(with_tail.request_hash_of_run(None, None), bare.request_hash_of_run(Some(1), Some(9)));
        assert_ne!(with_tail.request_hash(), bare.request_hash());
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
            stderr_tail: None,
            stderr_dropped_bytes: None,
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
        crate::store::lifecycle::handoff::mirrored(&db.conn, "host-a", &d.delivery_id, holder, 2).unwrap();
        crate::store::lifecycle::handoff::ack(&db.conn, "host-a", &d.delivery_id, holder, 3).unwrap();
        let r = NewReport {
            delivery_id: &d.delivery_id,
            holder,
            report_id: "a1",
            outcome: Outcome::Failed,
            exit_code: Some(3),
            duration_ms: Some(40),
            result: Some("partial \"output\""),
            reason: Some("exit 3"),
            stderr_tail: None,
            stderr_dropped_bytes: None,
        };
        let (first, _) = report(&db.conn, "host-a", &r, 4).unwrap();
        db.conn.execute("UPDATE attempts SET request_hash = $1", [legacy_hash(&r)]).unwrap();
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
