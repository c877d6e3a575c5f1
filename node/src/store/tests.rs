//! The node store against real SQLite files: migrations, the gate, markers, the outbox, and
//! corrupt rows that must be refused by name.

use super::*;
use crate::tail::StderrTail;
use baton_shared::sqlite::Synchronous;
use baton_shared::states::{DeliveryState, Outcome};
use baton_shared::wire::ClaimedDelivery;

pub(crate) fn delivery(id: &str, conversation: &str, seq: i64) -> ClaimedDelivery {
    ClaimedDelivery {
        delivery_id: id.into(),
        message_id: format!("m-{id}"),
        conversation: conversation.into(),
        seq,
        payload: serde_json::json!({"turn": seq}).into(),
        claim_token: format!("tok-{id}"),
        state: DeliveryState::Claimed,
        producer: Some("prod".into()),
        attempt: 1,
        max_attempts: 1,
        rerun: None,
        cancel_requested: false,
        deadline_ms: None,
        stall_ms: None,
        traceparent: None,
    }
}

pub(crate) fn open_temp() -> (tempfile::TempDir, Db) {
    let dir = tempfile::tempdir().unwrap();
    let mut db = Db::open(&dir.path().join("node.db"), Synchronous::Full).unwrap();
    db.instance_id().unwrap();
    (dir, db)
}

fn count(db: &Db, sql: &str) -> i64 {
    db.conn().query_row(sql, [], |r| r.get(0)).unwrap()
}

#[test]
fn migrations_apply_to_an_empty_store() {
    let (_dir, db) = open_temp();
    let p = baton_shared::sqlite::pragmas(db.conn()).unwrap();
    assert!(p.contains(&("journal_mode", "wal".into())));
    assert!(p.contains(&("synchronous", "2".into())));
    assert!(p.contains(&("user_version", MIGRATIONS.len().to_string())));
    // Its checkpoints run on a thread of their own; the store's connection checkpoints only past
    // the bound.
    let pages: i64 = db.conn().query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0)).unwrap();
    assert_eq!(pages, i64::from(baton_shared::sqlite::WRITER_CHECKPOINT_PAGES));
}

#[test]
fn reopen_keeps_the_instance_id_and_a_new_dir_gets_a_new_one() {
    let (dir, mut db) = open_temp();
    let first = db.instance_id().unwrap();
    assert!(uuid::Uuid::parse_str(&first).is_ok());
    drop(db);
    let mut again = Db::open(&dir.path().join("node.db"), Synchronous::Full).unwrap();
    assert_eq!(again.instance_id().unwrap(), first);
    let (_other, mut fresh) = open_temp();
    assert_ne!(fresh.instance_id().unwrap(), first);
}

#[test]
fn mirror_writes_delivery_and_queued_execution_together() {
    let (_dir, mut db) = open_temp();
    let d = delivery("d1", "c", 1);
    assert_eq!(db.mirror(&d, false, 10).unwrap(), Mirrored::New);
    assert_eq!(count(&db, "SELECT count(*) FROM deliveries WHERE state = 'mirrored'"), 1);
    assert_eq!(count(&db, "SELECT count(*) FROM executions WHERE state = 'queued'"), 1);
    assert_eq!(db.mirror(&d, false, 11).unwrap(), Mirrored::Existing);
    let payload: String = db.conn().query_row("SELECT payload FROM deliveries", [], |r| r.get(0)).unwrap();
    assert_eq!(payload, r#"{"turn":1}"#);
}

#[test]
fn a_failed_mirror_leaves_nothing_behind() {
    let (_dir, mut db) = open_temp();
    // An execution row for this id already exists without its delivery: the second insert
    // of the mirror transaction fails, so the first must be rolled back with it.
    db.conn().execute_batch("PRAGMA foreign_keys = OFF;").unwrap();
    db.conn().execute("INSERT INTO executions(delivery_id, conversation, seq, state, queued_at_ms) VALUES ('d1', 'c', 1, 'queued', 0)", []).unwrap();
    db.conn().execute_batch("PRAGMA foreign_keys = ON;").unwrap();
    assert!(db.mirror(&delivery("d1", "c", 1), false, 10).is_err());
    assert_eq!(count(&db, "SELECT count(*) FROM deliveries"), 0);
}

#[test]
fn the_gate_stays_closed_until_acked() {
    let (_dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), false, 10).unwrap();
    assert_eq!(db.start_attempt("d1", 11).unwrap(), None, "not acked: must not start");
    assert_eq!(count(&db, "SELECT count(*) FROM attempts"), 0);
    assert!(db.mark_acked("d1", "tok-d1", 12).unwrap());
    let turn = db.start_attempt("d1", 13).unwrap().unwrap();
    assert_eq!(turn.payload, r#"{"turn":1}"#);
    assert_eq!(turn.producer.as_deref(), Some("prod"), "the producer is kept for the harness");
    assert_eq!(db.start_attempt("d1", 14).unwrap(), None, "a started execution never starts twice");
}

#[test]
fn dropped_delivery_never_runs_and_acked_cannot_be_dropped() {
    let (_dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), false, 10).unwrap();
    assert!(db.drop_delivery("d1", "stale_claim", 11).unwrap());
    assert!(!db.mark_acked("d1", "tok-d1", 12).unwrap());
    assert_eq!(db.start_attempt("d1", 13).unwrap(), None);
    assert!(db.queued_turns().unwrap().is_empty());
    db.mirror(&delivery("d2", "c", 2), true, 10).unwrap();
    assert!(!db.drop_delivery("d2", "x", 11).unwrap());
}

#[test]
fn markers_and_outbox() {
    let (_dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), true, 10).unwrap();
    let turn = db.start_attempt("d1", 11).unwrap().unwrap();
    assert_eq!(count(&db, "SELECT count(*) FROM attempts WHERE ended_at_ms IS NULL"), 1);
    let ending = Ending {
        outcome: Outcome::Succeeded,
        exit_code: Some(0),
        duration_ms: Some(5),
        result: Some("ok".into()),
        reason: None,
        signal: None,
        stderr: None,
        stopped_by: None,
    };
    db.end_attempt(&turn.attempt_id, &ending, 16).unwrap();
    assert!(db.end_attempt(&turn.attempt_id, &ending, 17).is_err(), "an end marker is written once");
    let pending = db.pending_reports(10).unwrap();
    assert_eq!(pending.len(), 1);
    let body = &pending[0].body;
    assert_eq!((body.report_id.as_str(), body.claim_token.as_str()), (turn.attempt_id.as_str(), "tok-d1"));
    assert_eq!(body.result.as_deref(), Some("ok"));
    db.report_tried(&turn.attempt_id, "hub down", 18).unwrap();
    assert_eq!(db.pending_reports(10).unwrap().len(), 1);
    db.report_confirmed(&turn.attempt_id, 19).unwrap();
    assert!(db.pending_reports(10).unwrap().is_empty());
    assert!(db.report_confirmed(&turn.attempt_id, 20).is_err());
    let local = db.local("d1").unwrap().unwrap();
    assert_eq!(local.state, LocalState::Done);
    assert_eq!(local.report, Some((turn.attempt_id.clone(), ReportState::Confirmed)));
}

/// The claim's traceparent is mirrored with the delivery, comes back with the turn (for the
/// harness's `TRACEPARENT`) and with its report (the parent of the report's span); a later
/// claim of the same delivery replaces it; a delivery without one has none.
#[test]
fn the_traceparent_is_mirrored_and_read_back_with_the_turn_and_its_report() {
    let (_dir, mut db) = open_temp();
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = ClaimedDelivery { traceparent: Some(tp.into()), ..delivery("d1", "c", 1) };
    db.mirror(&traced, true, 10).unwrap();
    db.mirror(&delivery("d2", "e", 1), true, 10).unwrap();
    let turn = db.start_attempt("d1", 11).unwrap().unwrap();
    assert_eq!(turn.traceparent.as_deref(), Some(tp));
    assert_eq!(db.start_attempt("d2", 11).unwrap().unwrap().traceparent, None);
    let ending = Ending::unstarted(Outcome::Succeeded, "done");
    db.end_attempt(&turn.attempt_id, &ending, 12).unwrap();
    let pending = db.pending_reports(10).unwrap();
    assert_eq!(pending.iter().find(|e| e.delivery_id == "d1").and_then(|e| e.traceparent.as_deref()), Some(tp));
    let other = "00-4bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b8-00";
    let again =
        ClaimedDelivery { traceparent: Some(other.into()), claim_token: "tok-2".into(), ..delivery("d3", "f", 1) };
    db.mirror(&ClaimedDelivery { claim_token: "tok-1".into(), ..again.clone() }, false, 13).unwrap();
    db.drop_delivery("d3", "gone", 14).unwrap();
    assert_eq!(db.mirror(&again, true, 15).unwrap(), Mirrored::Replaced);
    assert_eq!(db.start_attempt("d3", 16).unwrap().unwrap().traceparent.as_deref(), Some(other));
}

#[test]
fn interrupted_attempt_becomes_unknown_and_is_never_restarted() {
    let (dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), true, 10).unwrap();
    let turn = db.start_attempt("d1", 11).unwrap().unwrap();
    drop(db);
    let mut db = Db::open(&dir.path().join("node.db"), Synchronous::Full).unwrap();
    let none = std::collections::HashMap::new();
    assert_eq!(db.recover_interrupted_attempts(&none, 20).unwrap(), vec![turn.attempt_id.clone()]);
    assert!(db.recover_interrupted_attempts(&none, 21).unwrap().is_empty());
    assert_eq!(db.start_attempt("d1", 22).unwrap(), None);
    let r = &db.pending_reports(10).unwrap()[0].body;
    assert_eq!(r.outcome, Outcome::Unknown);
    assert_eq!(r.reason.as_deref(), Some(REASON_RESTARTED));
    assert_eq!(db.local("d1").unwrap().unwrap().exec, ExecState::Ended);
}

#[test]
fn dead_report_is_not_retried() {
    let (_dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), true, 10).unwrap();
    let turn = db.start_attempt("d1", 11).unwrap().unwrap();
    let ending = Ending {
        outcome: Outcome::Failed,
        exit_code: Some(3),
        duration_ms: Some(1),
        result: None,
        reason: None,
        signal: None,
        stderr: None,
        stopped_by: None,
    };
    db.end_attempt(&turn.attempt_id, &ending, 12).unwrap();
    db.report_dead(&turn.attempt_id, "stale_claim", 13).unwrap();
    assert!(db.pending_reports(10).unwrap().is_empty());
    let dead = DeadReport { report_id: turn.attempt_id, reason: "stale_claim".to_string() };
    assert_eq!(db.summary().unwrap().dead_reports, vec![dead]);
}

/// The end of the harness's stderr travels in the outbox's report body, and is still there,
/// byte for byte, when the store is opened again after the node stopped.
#[test]
fn the_stderr_tail_is_kept_in_the_outbox_across_a_reopen() {
    let (dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), true, 10).unwrap();
    let turn = db.start_attempt("d1", 11).unwrap().unwrap();
    let tail = StderrTail { text: "traceback:\n  é \0 boom\n".into(), dropped_bytes: 12_345 };
    let ending = Ending { stderr: Some(tail.clone()), ..ending(Outcome::Failed) };
    db.end_attempt(&turn.attempt_id, &ending, 12).unwrap();
    drop(db);
    let db = Db::open(&dir.path().join("node.db"), Synchronous::Full).unwrap();
    let pending = db.pending_reports(10).unwrap();
    assert_eq!(pending[0].body.stderr_tail.as_deref(), Some(tail.text.as_str()));
    assert_eq!(pending[0].body.stderr_dropped_bytes, Some(12_345));
}

#[test]
fn a_new_claim_replaces_a_dropped_copy() {
    let (_dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), false, 10).unwrap();
    db.drop_delivery("d1", "requeued", 11).unwrap();
    let mut again = delivery("d1", "c", 1);
    again.claim_token = "tok-2".into();
    assert_eq!(db.mirror(&again, false, 12).unwrap(), Mirrored::Replaced);
    assert!(db.mark_acked("d1", "tok-2", 13).unwrap());
    assert!(db.start_attempt("d1", 14).unwrap().is_some());
}

#[test]
fn status_summary_reads_a_closed_store_read_only() {
    let (dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), false, 10).unwrap();
    db.mirror(&delivery("d2", "c", 2), true, 10).unwrap();
    db.start_attempt("d2", 11).unwrap().unwrap();
    let id = db.instance_id().unwrap();
    drop(db);
    let ro = Db::open_read_only(&dir.path().join("node.db")).unwrap();
    let s = ro.summary().unwrap();
    assert_eq!(s.instance_id, Some(id));
    assert_eq!(s.open.len(), 2);
    assert_eq!(s.running, vec!["d2".to_string()]);
    assert_eq!(s.counts, vec![(LocalState::Acked, 1), (LocalState::Mirrored, 1)]);
    assert_eq!(s.open[0].state, LocalState::Mirrored);
}

/// Writes `sql` past the schema's CHECK constraints, as a hand edit or a bug could.
fn corrupt(db: &Db, sql: &str) {
    db.conn()
        .execute_batch(&format!("PRAGMA ignore_check_constraints = ON; {sql}; PRAGMA ignore_check_constraints = OFF;"))
        .unwrap();
}

/// Checks that `result` is a `Corrupt` error whose message contains every one of `expected`.
fn check_corrupt<T: std::fmt::Debug>(result: Result<T, StoreError>, expected: &[&str]) {
    let err = result.expect_err("a corrupt row must be refused");
    assert!(matches!(err, StoreError::Corrupt(_)) && err.is_refused(), "{err:?}");
    let message = err.to_string();
    for e in expected {
        assert!(message.contains(e), "{message:?} lacks {e:?}");
    }
}

#[test]
fn a_state_that_does_not_parse_is_an_error_naming_the_row_not_a_default() {
    let (_dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), false, 10).unwrap();
    db.mirror(&delivery("d2", "c", 2), false, 10).unwrap();
    corrupt(&db, "UPDATE deliveries SET state = 'bogus' WHERE delivery_id = 'd1'");
    check_corrupt(db.local("d1"), &["delivery d1", "\"bogus\""]);
    check_corrupt(db.summary(), &["delivery d1", "\"bogus\""]);
    // A claim of the same delivery must not treat the unknown state as one it can overwrite.
    check_corrupt(db.mirror(&delivery("d1", "c", 1), true, 11), &["delivery d1", "\"bogus\""]);
    corrupt(&db, "UPDATE executions SET state = 'half-run' WHERE delivery_id = 'd2'");
    check_corrupt(db.local("d2"), &["execution of delivery d2", "\"half-run\""]);
    let mut again = delivery("d2", "c", 2);
    again.claim_token = "tok-new".into();
    check_corrupt(db.mirror(&again, false, 12), &["execution of delivery d2", "\"half-run\""]);
    assert_eq!(count(&db, "SELECT count(*) FROM deliveries WHERE claim_token = 'tok-new'"), 0, "nothing replaced");
}

#[test]
fn a_payload_that_does_not_parse_is_never_handed_to_the_harness() {
    let (_dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), true, 10).unwrap();
    corrupt(&db, "UPDATE deliveries SET payload = '{\"turn\": 1' WHERE delivery_id = 'd1'");
    check_corrupt(db.start_attempt("d1", 11), &["delivery d1", "payload is not JSON"]);
    assert_eq!(count(&db, "SELECT count(*) FROM attempts"), 0, "no start marker for a turn that did not start");
    assert_eq!(db.local("d1").unwrap().unwrap().exec, ExecState::Queued);
}

#[test]
fn a_dead_report_without_its_reason_is_an_error_naming_the_row() {
    let (_dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), true, 10).unwrap();
    let turn = db.start_attempt("d1", 11).unwrap().unwrap();
    let ending = Ending {
        outcome: Outcome::Failed,
        exit_code: Some(3),
        duration_ms: Some(1),
        result: None,
        reason: None,
        signal: None,
        stderr: None,
        stopped_by: None,
    };
    db.end_attempt(&turn.attempt_id, &ending, 12).unwrap();
    db.report_dead(&turn.attempt_id, "stale_claim", 13).unwrap();
    corrupt(&db, "UPDATE outbox SET dead_reason = NULL");
    check_corrupt(db.summary(), &[&format!("outbox {}", turn.attempt_id), "without a reason"]);
    corrupt(&db, "UPDATE outbox SET dead_at_ms = NULL, dead_reason = NULL, body = 'not json'");
    check_corrupt(db.pending_reports(10), &[&format!("outbox {}", turn.attempt_id), "not a report"]);
}

fn process(pgid: i32) -> crate::group::ProcessIdentity {
    crate::group::ProcessIdentity { pgid, start_ticks: 123_456, boot_id: "boot-1".into() }
}

/// The start marker and the process group are one write: read back with the interrupted
/// attempt, and never written for a turn that is not startable (any more).
#[test]
fn the_process_group_is_written_with_the_start_marker_and_read_back_when_interrupted() {
    let (_dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), true, 10).unwrap();
    db.mirror(&delivery("d2", "c2", 1), true, 10).unwrap();
    db.mirror(&delivery("d3", "c3", 1), false, 10).unwrap();
    let t1 = db.next_attempt("d1").unwrap().unwrap();
    assert_eq!(db.next_attempt("d3").unwrap(), None, "not acked: nothing to start");
    assert_eq!(count(&db, "SELECT count(*) FROM attempts"), 0, "next_attempt writes nothing");
    assert!(db.begin_attempt(&t1, Some(&process(4242)), 11).unwrap());
    assert!(!db.begin_attempt(&t1, Some(&process(4243)), 12).unwrap(), "a started execution never starts twice");
    let t2 = db.start_attempt("d2", 11).unwrap().unwrap();
    let mut got = db.interrupted_attempts().unwrap();
    got.sort_by(|a, b| a.delivery_id.cmp(&b.delivery_id));
    let expected = vec![
        Interrupted { attempt_id: t1.attempt_id.clone(), delivery_id: "d1".into(), process: Some(process(4242)) },
        Interrupted { attempt_id: t2.attempt_id.clone(), delivery_id: "d2".into(), process: None },
    ];
    assert_eq!(got, expected);
    let notes = std::collections::HashMap::from([(t1.attempt_id.clone(), "its group had ended".to_string())]);
    assert_eq!(db.recover_interrupted_attempts(&notes, 20).unwrap().len(), 2);
    assert!(db.interrupted_attempts().unwrap().is_empty());
    let reasons: Vec<(String, Option<String>)> =
        db.pending_reports(10).unwrap().into_iter().map(|e| (e.delivery_id, e.body.reason)).collect();
    assert!(reasons.contains(&("d1".into(), Some(format!("{REASON_RESTARTED}; its group had ended")))), "{reasons:?}");
    assert!(reasons.contains(&("d2".into(), Some(REASON_RESTARTED.into()))), "{reasons:?}");
}

/// A turn read for starting whose delivery changed before its start marker (a new claim
/// replaced it) does not start from the stale read.
#[test]
fn a_stale_read_does_not_start() {
    let (_dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), true, 10).unwrap();
    let mut stale = db.next_attempt("d1").unwrap().unwrap();
    stale.payload = r#"{"turn":"other"}"#.into();
    assert!(!db.begin_attempt(&stale, None, 11).unwrap());
    assert_eq!(count(&db, "SELECT count(*) FROM attempts"), 0);
    assert_eq!(db.local("d1").unwrap().unwrap().exec, ExecState::Queued);
}

#[test]
fn a_half_recorded_process_group_is_an_error_naming_the_attempt() {
    let (_dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), true, 10).unwrap();
    let t = db.start_attempt("d1", 11).unwrap().unwrap();
    db.conn().execute("UPDATE attempts SET pgid = 77", []).unwrap();
    check_corrupt(db.interrupted_attempts(), &[&format!("attempt {}", t.attempt_id), "not all set"]);
}

/// A store written before attempts recorded their process group, with a turn running, opens
/// under the current schema: the rows stay and the running attempt is interrupted without a
/// recorded process.
#[test]
fn a_store_from_before_process_groups_upgrades_with_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.db");
    {
        let opts = baton_shared::sqlite::OpenOptions::default();
        // 0001 and 0002: the schema before the process-group columns (0003).
        let conn = baton_shared::sqlite::open(&path, &MIGRATIONS[..2], opts).unwrap();
        let mut db = Db { _checkpoints: None, conn };
        db.instance_id().unwrap();
        // The mirror and the start marker as the code of that schema wrote them.
        db.conn()
            .execute_batch(
                "INSERT INTO deliveries(delivery_id, message_id, conversation, seq, payload, claim_token, state,
                     mirrored_at_ms, updated_at_ms, producer)
                 VALUES ('d1', 'm-d1', 'c', 1, '{\"turn\":1}', 'tok-d1', 'acked', 10, 10, 'prod');
                 INSERT INTO executions(delivery_id, conversation, seq, state, queued_at_ms)
                 VALUES ('d1', 'c', 1, 'started', 10);
                 INSERT INTO attempts(attempt_id, delivery_id, started_at_ms) VALUES ('a1', 'd1', 11);",
            )
            .unwrap();
    }
    let db = Db::open(&path, Synchronous::Full).unwrap();
    let p = baton_shared::sqlite::pragmas(db.conn()).unwrap();
    assert!(p.contains(&("user_version", MIGRATIONS.len().to_string())), "{p:?}");
    let got = db.interrupted_attempts().unwrap();
    assert_eq!((got.len(), got[0].delivery_id.as_str(), got[0].process.as_ref()), (1, "d1", None));
}

/// Runs `id` to an end marker at `at`, as the scheduler would.
fn run_to_end(db: &mut Db, id: &str, conversation: &str, at: i64) -> String {
    db.mirror(&delivery(id, conversation, 1), true, at).unwrap();
    let turn = db.start_attempt(id, at).unwrap().unwrap();
    let ending = Ending {
        outcome: Outcome::Succeeded,
        exit_code: Some(0),
        duration_ms: Some(1),
        result: None,
        reason: None,
        signal: None,
        stderr: None,
        stopped_by: None,
    };
    db.end_attempt(&turn.attempt_id, &ending, at).unwrap();
    turn.attempt_id
}

fn rows_of(db: &Db, id: &str) -> i64 {
    ["deliveries", "executions", "attempts", "outbox"]
        .iter()
        .map(|t| count(db, &format!("SELECT count(*) FROM {t} WHERE delivery_id = '{id}'")))
        .sum()
}

/// Only what the hub settled before the cutoff goes: confirmed turns and dropped deliveries.
/// Waiting, running, unreported, reopened and dead-report deliveries stay, whatever their age.
#[test]
fn retention_removes_only_what_the_hub_settled_before_the_cutoff() {
    let (_dir, mut db) = open_temp();
    let old = run_to_end(&mut db, "confirmed-old", "a", 100);
    db.report_confirmed(&old, 100).unwrap();
    let new = run_to_end(&mut db, "confirmed-new", "b", 300);
    db.report_confirmed(&new, 300).unwrap();
    let dead = run_to_end(&mut db, "dead-old", "c", 100);
    db.report_dead(&dead, "stale_claim", 100).unwrap();
    run_to_end(&mut db, "unreported-old", "d", 100);
    let reopened = run_to_end(&mut db, "reopened-old", "e", 100);
    db.report_confirmed(&reopened, 100).unwrap();
    assert!(db.reopen_report(&reopened).unwrap());
    db.mirror(&delivery("running-old", "f", 1), true, 100).unwrap();
    db.start_attempt("running-old", 100).unwrap().unwrap();
    db.mirror(&delivery("dropped-old", "g", 1), false, 100).unwrap();
    db.drop_delivery("dropped-old", "requeued", 100).unwrap();
    db.mirror(&delivery("waiting-old", "h", 1), false, 100).unwrap();
    let before = db.size().unwrap();

    assert_eq!(db.remove_settled(200, 1).unwrap(), 1, "a batch holds at most its limit");
    assert_eq!(db.remove_settled(200, 500).unwrap(), 1, "the rest of what is due");
    assert_eq!(db.remove_settled(200, 500).unwrap(), 0, "nothing more is due");
    for gone in ["confirmed-old", "dropped-old"] {
        assert_eq!(rows_of(&db, gone), 0, "{gone}");
        assert_eq!(db.local(gone).unwrap(), None, "{gone}");
    }
    for kept in ["confirmed-new", "dead-old", "unreported-old", "reopened-old", "running-old", "waiting-old"] {
        assert!(rows_of(&db, kept) > 0, "{kept} must stay");
    }
    let after = db.size().unwrap();
    let n = |s: &StoreSize, t: &str| s.rows.iter().find(|(name, _)| *name == t).unwrap().1;
    assert_eq!((n(&before, "deliveries"), n(&after, "deliveries")), (8, 6));
    assert_eq!((n(&before, "outbox"), n(&after, "outbox")), (5, 4));
    assert_eq!(db.summary().unwrap().dead_reports.len(), 1, "a dead report stays for the operator");
}

/// Run 2 of a delivery that ran here: its own execution and attempt; the late confirmation of
/// run 1's report does not settle the delivery while run 2 waits, so retention keeps it.
#[test]
fn a_later_run_has_its_own_execution_and_an_earlier_report_does_not_settle_it() {
    let (_dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), true, 10).unwrap();
    let run1 = db.start_attempt("d1", 11).unwrap().unwrap();
    let ending = Ending::unstarted(Outcome::Failed, "exited with status 75");
    db.end_attempt(&run1.attempt_id, &ending, 12).unwrap();
    let mut again = delivery("d1", "c", 1);
    again.attempt = 2;
    again.claim_token = "tok-d1-2".into();
    assert_eq!(db.mirror(&again, false, 13).unwrap(), Mirrored::NewRun);
    assert_eq!(db.mirror(&delivery("d1", "c", 1), false, 13).unwrap(), Mirrored::AlreadyRan, "an older run is stale");
    db.report_confirmed(&run1.attempt_id, 14).unwrap();
    let local = db.local("d1").unwrap().unwrap();
    assert_eq!((local.state, local.run, local.exec), (LocalState::Mirrored, 2, ExecState::Queued));
    assert_eq!(db.remove_settled(i64::MAX, 10).unwrap(), 0, "run 2 waits: nothing is removed");
    assert!(db.mark_acked("d1", "tok-d1-2", 15).unwrap());
    let run2 = db.start_attempt("d1", 16).unwrap().unwrap();
    assert_eq!((run2.run, run2.claim_token.as_str()), (2, "tok-d1-2"));
    assert_ne!(run2.attempt_id, run1.attempt_id);
    assert_eq!(count(&db, "SELECT count(*) FROM executions WHERE delivery_id = 'd1'"), 2);
}

/// A cancel of a run that has not started is one transaction that the start checks: after it
/// the run never starts; a cancel of a started run says so and changes nothing.
#[test]
fn a_local_cancel_wins_over_a_later_start_and_leaves_a_started_run_alone() {
    let (_dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c", 1), true, 10).unwrap();
    let turn = db.next_attempt("d1").unwrap().unwrap();
    assert!(matches!(
        db.cancel_unstarted("d1", 1, "cancelled before it started: r", 11).unwrap(),
        CancelLocal::Cancelled(_)
    ));
    assert!(!db.begin_attempt(&turn, None, 12).unwrap(), "a cancelled run never starts");
    assert_eq!(db.cancel_unstarted("d1", 1, "again", 13).unwrap(), CancelLocal::Settled, "idempotent");
    let pending = db.pending_reports(10).unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].body.outcome, Outcome::Cancelled);
    assert_eq!(pending[0].body.attempt, Some(1));
    db.mirror(&delivery("d2", "c", 2), true, 10).unwrap();
    db.start_attempt("d2", 14).unwrap().unwrap();
    assert_eq!(db.cancel_unstarted("d2", 1, "r", 15).unwrap(), CancelLocal::Started);
    assert_eq!(db.pending_reports(10).unwrap().len(), 1, "nothing written for a started run");
}

fn ending(outcome: Outcome) -> Ending {
    Ending {
        outcome,
        exit_code: Some(0),
        duration_ms: Some(5),
        result: None,
        reason: None,
        signal: None,
        stderr: None,
        stopped_by: None,
    }
}

/// A scheduler pass's end and start markers are one transaction, guarded item by item: an item
/// that no longer applies is refused alone and the others are written.
#[test]
fn a_pass_folds_its_end_and_start_markers_item_by_item() {
    let (_dir, mut db) = open_temp();
    for (id, c, acked) in [("d1", "c1", true), ("d2", "c2", true), ("d3", "c3", false)] {
        db.mirror(&delivery(id, c, 1), acked, 10).unwrap();
    }
    let t1 = db.start_attempt("d1", 11).unwrap().unwrap();
    let t2 = db.next_attempt("d2").unwrap().unwrap();
    let not_acked = StartedTurn { delivery_id: "d3".into(), attempt_id: "a-d3".into(), ..t2.clone() };
    let ends =
        [(t1.attempt_id.clone(), ending(Outcome::Succeeded)), ("no-such-attempt".into(), ending(Outcome::Failed))];
    let starts = [(t2.clone(), Some(process(77))), (not_acked, None)];
    let folded = db.fold_markers(&ends, &starts, 12).unwrap();
    assert_eq!(folded, Folded { ended: vec![true, false], begun: vec![true, false] });
    let reported: Vec<String> = db.pending_reports(10).unwrap().into_iter().map(|e| e.report_id).collect();
    assert_eq!(reported, vec![t1.attempt_id.clone()], "the ended turn's report is queued with its end marker");
    let interrupted: Vec<String> = db.interrupted_attempts().unwrap().into_iter().map(|i| i.attempt_id).collect();
    assert_eq!(interrupted, vec![t2.attempt_id.clone()], "the released turn's start marker is written");
    assert_eq!(count(&db, "SELECT count(*) FROM attempts WHERE delivery_id = 'd3'"), 0);
    assert_eq!(count(&db, "SELECT count(*) FROM executions WHERE delivery_id = 'd3' AND state = 'queued'"), 1);
}

/// A store failure in the middle of a fold leaves none of it: the turn that ended stays started
/// (reported `unknown` at the next start) and the turn about to start stays queued.
#[test]
fn a_fold_that_fails_midway_writes_nothing() {
    let (_dir, mut db) = open_temp();
    db.mirror(&delivery("d1", "c1", 1), true, 10).unwrap();
    db.mirror(&delivery("d2", "c2", 1), true, 10).unwrap();
    let t1 = db.start_attempt("d1", 11).unwrap().unwrap();
    // The second start reuses the first attempt's id: its insert fails after the end marker
    // and its own execution update were written in the same transaction.
    let t2 = StartedTurn { attempt_id: t1.attempt_id.clone(), ..db.next_attempt("d2").unwrap().unwrap() };
    let ends = [(t1.attempt_id.clone(), ending(Outcome::Succeeded))];
    assert!(db.fold_markers(&ends, &[(t2, None)], 12).is_err());
    assert_eq!(count(&db, "SELECT count(*) FROM attempts WHERE ended_at_ms IS NOT NULL"), 0);
    assert_eq!(count(&db, "SELECT count(*) FROM outbox"), 0);
    assert_eq!(count(&db, "SELECT count(*) FROM executions WHERE delivery_id = 'd2' AND state = 'queued'"), 1);
}

/// The gates of a claim batch open in one transaction, each guarded on its own claim token.
#[test]
fn a_batch_of_acks_opens_each_gate_it_may() {
    let (_dir, mut db) = open_temp();
    let batch = [delivery("d1", "c", 1), delivery("d2", "c", 2), delivery("d3", "c", 3)];
    db.mirror_batch(&batch, 10).unwrap();
    let acks = [
        ("d1".to_string(), "tok-d1".to_string()),
        ("d2".to_string(), "tok-other".to_string()),
        ("d3".to_string(), "tok-d3".to_string()),
    ];
    assert_eq!(db.mark_acked_batch(&acks, 11).unwrap(), vec![true, false, true]);
    assert_eq!(db.mark_acked_batch(&acks[..1], 12).unwrap(), vec![false], "an open gate stays as it is");
    assert_eq!(count(&db, "SELECT count(*) FROM deliveries WHERE state = 'acked'"), 2);
    assert_eq!(db.local("d2").unwrap().unwrap().state, LocalState::Mirrored);
}

/// An outbox batch is settled in one transaction; a report no longer pending is left alone and
/// fails no other.
#[test]
fn an_outbox_batch_settles_each_report_it_may() {
    let (_dir, mut db) = open_temp();
    let mut ids = Vec::new();
    for (id, c) in [("d1", "c1"), ("d2", "c2"), ("d3", "c3")] {
        db.mirror(&delivery(id, c, 1), true, 10).unwrap();
        let t = db.start_attempt(id, 11).unwrap().unwrap();
        db.end_attempt(&t.attempt_id, &ending(Outcome::Succeeded), 12).unwrap();
        ids.push(t.attempt_id);
    }
    db.report_confirmed(&ids[1], 13).unwrap();
    let done = [(ids[0].clone(), None), (ids[1].clone(), None), (ids[2].clone(), Some("stale_claim".to_string()))];
    assert_eq!(db.finish_reports(&done, 14).unwrap(), vec![true, false, true]);
    assert!(db.pending_reports(10).unwrap().is_empty());
    assert_eq!(count(&db, "SELECT count(*) FROM outbox WHERE dead_reason = 'stale_claim'"), 1);
    assert_eq!(count(&db, "SELECT count(*) FROM deliveries WHERE state = 'done'"), 3);
    db.reports_tried(&ids[..1], "hub down", 15).unwrap();
    assert_eq!(count(&db, "SELECT tries FROM outbox WHERE last_error = 'hub down'"), 2);
}

/// Why claiming is paused is kept for `status` until the node claims again; the size it is
/// judged by counts the pages in use and grows with what the store holds.
#[test]
fn a_claim_pause_is_shown_until_cleared_and_used_bytes_grow_with_the_store() {
    let (_dir, mut db) = open_temp();
    assert_eq!(db.summary().unwrap().claims_paused, None);
    let empty = db.used_bytes().unwrap();
    assert!(empty > 0);
    db.record_claims_paused(Some("over store_bytes_max")).unwrap();
    assert_eq!(db.summary().unwrap().claims_paused.as_deref(), Some("over store_bytes_max"));
    db.record_claims_paused(None).unwrap();
    assert_eq!(db.summary().unwrap().claims_paused, None);
    db.conn().execute("INSERT INTO meta(key, value) VALUES ('padding', ?1)", [&"x".repeat(200_000)]).unwrap();
    let full = db.used_bytes().unwrap();
    assert!(full >= empty + 150_000, "{empty} -> {full}");
}
