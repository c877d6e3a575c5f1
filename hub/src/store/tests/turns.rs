//! The turn-control operations' tests (`turns.rs`): starts, the start lease, cancels, retries.

use super::*;
use crate::store::engine::params;
use crate::store::lifecycle::accept::testing::accept_one;
use crate::store::lifecycle::claim;
use crate::store::lifecycle::handoff::{ack, mirrored};
use crate::store::lifecycle::report::{NewReport, RunReport, report_run};
use crate::store::lifecycle::transition::Holder;
use crate::store::testing;
use baton_shared::wire::ClaimedDelivery;
use std::time::Duration;

/// Accepts a message to host-a with `max_attempts` runs and a 1 s backoff.
fn message(conn: &dyn Db, conv: &str, key: &str, max_attempts: u32) -> String {
    let m = accept_one(conn, conv, key, &["host-a"]);
    conn.execute(
        "UPDATE messages SET max_attempts = $2, retry_backoff_ms = 1000 WHERE id = $1",
        params![m, max_attempts],
    )
    .unwrap();
    conn.query_row("SELECT id FROM deliveries WHERE message_id = $1", [&m], |r| r.get(0)).unwrap()
}

fn claim_all(conn: &dyn Db, now: i64) -> Vec<ClaimedDelivery> {
    claim::claim(conn, "host-a", "i", 10, now).unwrap()
}

fn holder(d: &ClaimedDelivery) -> Holder<'_> {
    Holder { instance_id: "i", claim_token: &d.claim_token }
}

/// Claimed → mirrored → delivered.
fn deliver(conn: &dyn Db, d: &ClaimedDelivery, now: i64) {
    mirrored(conn, "host-a", &d.delivery_id, holder(d), now).unwrap();
    ack(conn, "host-a", &d.delivery_id, holder(d), now).unwrap();
}

fn report(
    conn: &dyn Db,
    d: &ClaimedDelivery,
    report_id: &str,
    outcome: Outcome,
    exit_code: Option<i32>,
    now: i64,
) -> StoreResult<(baton_shared::wire::AttemptView, bool, Option<i64>)> {
    let r = NewReport {
        delivery_id: &d.delivery_id,
        holder: holder(d),
        report_id,
        outcome,
        exit_code,
        duration_ms: Some(1),
        result: None,
        reason: None,
        stderr_tail: None,
        stderr_dropped_bytes: None,
    };
    let run = RunReport {
        attempt: Some(d.attempt),
        retry_backoff: Duration::from_secs(1),
        retry_backoff_max: Duration::from_secs(60),
        ..RunReport::default()
    };
    report_run(conn, "host-a", &r, &run, now)
}

fn state(conn: &dyn Db, id: &str) -> DeliveryState {
    transition::state_of(conn, id).unwrap().unwrap()
}

fn events(conn: &dyn Db, id: &str) -> i64 {
    conn.query_row("SELECT count(*) FROM delivery_events WHERE delivery_id = $1", [id], |r| r.get(0)).unwrap()
}

fn item(d: &ClaimedDelivery) -> StartItem {
    StartItem { delivery_id: d.delivery_id.clone(), claim_token: d.claim_token.clone(), attempt: d.attempt }
}

#[test]
fn a_start_is_recorded_once_per_run_and_refused_to_another_session() {
    let db = testing::db();
    let c = &db.conn;
    message(c, "c", "k1", 1);
    message(c, "c", "k2", 1);
    let got = claim_all(c, 1);
    deliver(c, &got[0], 2);
    mirrored(c, "host-a", &got[1].delivery_id, holder(&got[1]), 2).unwrap();
    let results = start(c, "host-a", "i", 7, &[item(&got[0]), item(&got[1])], 3).unwrap();
    assert!(results[0].start, "{results:?}");
    assert_eq!(results[1].code.as_deref(), Some("stale_claim"), "mirrored is not delivered yet");
    let started: (Option<i64>, Option<i64>) = c
        .query_row("SELECT started_session, started_at FROM deliveries WHERE id = $1", [&got[0].delivery_id], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(started, (Some(7), Some(3)));
    assert!(start(c, "host-a", "i", 7, &[item(&got[0])], 4).unwrap()[0].start, "the same session again");
    let other = start(c, "host-a", "i", 8, &[item(&got[0])], 5).unwrap();
    assert_eq!(other[0].code.as_deref(), Some("started_elsewhere"));
    let mut wrong_run = item(&got[0]);
    wrong_run.attempt = 2;
    let mut wrong_token = item(&got[0]);
    wrong_token.claim_token = "0".repeat(32);
    let mut unknown = item(&got[0]);
    unknown.delivery_id = crate::store::new_id();
    let r = start(c, "host-a", "i", 7, &[wrong_run, wrong_token, unknown.clone()], 6).unwrap();
    let codes: Vec<_> = r.iter().map(|r| r.code.as_deref()).collect();
    assert_eq!(codes, [Some("stale_claim"), Some("stale_claim"), Some("not_found")]);
    // Another host's delivery is not found, not revealed.
    assert_eq!(start(c, "host-b", "i", 7, &[item(&got[0])], 7).unwrap()[0].code.as_deref(), Some("not_found"));
    // A cancel asked for before the start: refused with `cancelled`.
    deliver(c, &got[1], 8);
    cancel(c, &got[1].delivery_id, Canceller::Operator("op"), "stop", false, 9).unwrap();
    let r = start(c, "host-a", "i", 7, &[item(&got[1])], 10).unwrap();
    assert_eq!((r[0].start, r[0].code.as_deref()), (false, Some("cancelled")));
}

/// A start batch reads its deliveries together and still answers each item in order as if
/// alone: a repeated item sees the first one's start, an unknown id (one PostgreSQL stores
/// escaped among them) is not found, and nothing one item reads is another's.
#[test]
fn a_start_batch_answers_each_item_as_if_alone() {
    let db = testing::db();
    let c = &db.conn;
    message(c, "c", "k1", 1);
    message(c, "d", "k2", 1);
    let got = claim_all(c, 1);
    deliver(c, &got[0], 2);
    deliver(c, &got[1], 2);
    let mut unknown = item(&got[0]);
    unknown.delivery_id = crate::store::new_id();
    let mut escaped = item(&got[0]);
    escaped.delivery_id = format!("{}\0{}", got[0].delivery_id, crate::store::engine::PG_TEXT_ESCAPE);
    let batch = [item(&got[0]), unknown, item(&got[0]), escaped, item(&got[1])];
    let ids: Vec<&str> = batch.iter().map(|i| i.delivery_id.as_str()).collect();
    let mut read: Vec<String> = load_many(c, &ids).unwrap().into_keys().collect();
    read.sort();
    let mut held: Vec<String> = got.iter().map(|d| d.delivery_id.clone()).collect();
    held.sort();
    assert_eq!(read, held, "one read finds the batch's deliveries the record holds");
    let r = start(c, "host-a", "i", 7, &batch, 3).unwrap();
    let answers: Vec<_> = r.iter().map(|r| (r.delivery_id.as_str(), r.start, r.code.as_deref())).collect();
    assert_eq!(
        answers,
        [
            (got[0].delivery_id.as_str(), true, None),
            (batch[1].delivery_id.as_str(), false, Some("not_found")),
            (got[0].delivery_id.as_str(), true, None),
            (batch[3].delivery_id.as_str(), false, Some("not_found")),
            (got[1].delivery_id.as_str(), true, None),
        ]
    );
    for d in &got {
        let started: Option<i64> = c
            .query_row("SELECT started_session FROM deliveries WHERE id = $1", [&d.delivery_id], |r| r.get(0))
            .unwrap();
        assert_eq!(started, Some(7), "{}", d.delivery_id);
    }
    let later = start(c, "host-a", "i", 8, &[item(&got[1]), item(&got[0])], 4).unwrap();
    let codes: Vec<_> = later.iter().map(|r| (r.delivery_id.as_str(), r.code.as_deref())).collect();
    assert_eq!(
        codes,
        [
            (got[1].delivery_id.as_str(), Some("started_elsewhere")),
            (got[0].delivery_id.as_str(), Some("started_elsewhere"))
        ]
    );
}

/// The start lease: a run the older session acked is not started for a newer session (a
/// copy of the data directory) while the older session's lease lasts, and is
/// `started_elsewhere` once it ran out; renewals extend it, a superseded session renews
/// nothing, a clean end gives it up (and with it the runs acked and not started); runs the
/// newer session acked itself start at once.
#[test]
fn a_newer_session_waits_for_the_older_lease_before_starting_what_the_older_acked() {
    use crate::store::lifecycle::handoff::record_acked_session;
    use crate::store::registry::instances::RebindLimit;
    use crate::store::registry::sessions;
    let db = testing::db();
    let c = &db.conn;
    message(c, "c", "k1", 1);
    let first = sessions::open(c, "host-a", "i", None, RebindLimit::default(), 1_000, 10).unwrap();
    let got = claim_all(c, 11);
    deliver(c, &got[0], 12);
    record_acked_session(c, &got[0].delivery_id, first.session).unwrap();
    // A renewal at 500: the lease of session 1 now runs until 1_500.
    assert!(start(c, "host-a", "i", first.session, &[], 500).unwrap().is_empty());
    sessions::renew_lease(c, "host-a", first.session, 500).unwrap();
    assert_eq!(sessions::lease_until(c, "host-a", first.session).unwrap(), Some(1_500));
    // A run acked after that renewal (by more than a tenth of the lease) the first session
    // could never start on its own: the newer session starts it at once.
    message(c, "u", "k9", 1);
    let uncovered = claim_all(c, 610);
    deliver(c, &uncovered[0], 620);
    record_acked_session(c, &uncovered[0].delivery_id, first.session).unwrap();
    let copy = sessions::open(c, "host-a", "i", None, RebindLimit::default(), 1_000, 650).unwrap();
    assert_eq!(copy.took_over, Some(first.session));
    let r = start(c, "host-a", "i", copy.session, &[item(&got[0])], 700).unwrap();
    assert_eq!(
        (r[0].start, r[0].code.as_deref(), r[0].retry_after_ms),
        (false, Some("start_lease_pending"), Some(800))
    );
    let started: Option<i64> = c
        .query_row("SELECT started_session FROM deliveries WHERE id = $1", [&got[0].delivery_id], |r| r.get(0))
        .unwrap();
    assert_eq!(started, None, "a pending start records nothing");
    assert!(start(c, "host-a", "i", copy.session, &[item(&uncovered[0])], 701).unwrap()[0].start);
    // The superseded session cannot renew (its requests are refused before this; the
    // renewal itself also leaves an ended session alone).
    sessions::renew_lease(c, "host-a", first.session, 1_400).unwrap();
    assert_eq!(sessions::lease_until(c, "host-a", first.session).unwrap(), Some(1_500));
    // New work the copy acked itself starts at once.
    message(c, "d", "k2", 1);
    let mine = claim_all(c, 800);
    deliver(c, &mine[0], 801);
    record_acked_session(c, &mine[0].delivery_id, copy.session).unwrap();
    assert!(start(c, "host-a", "i", copy.session, &[item(&mine[0])], 802).unwrap()[0].start);
    // At the lease's end the older run is never started again: the older process may have
    // started it within its lease, cut off from the hub.
    assert_eq!(
        start(c, "host-a", "i", copy.session, &[item(&got[0])], 1_499).unwrap()[0].code.as_deref(),
        Some("start_lease_pending")
    );
    let r = start(c, "host-a", "i", copy.session, &[item(&got[0])], 1_500).unwrap();
    assert_eq!((r[0].start, r[0].code.as_deref()), (false, Some("started_elsewhere")), "{:?}", r[0].message);
    let started: Option<i64> = c
        .query_row("SELECT started_session FROM deliveries WHERE id = $1", [&got[0].delivery_id], |r| r.get(0))
        .unwrap();
    assert_eq!(started, None, "a refused start records nothing");
    // A clean end gives the lease up: what that session acked and did not start is the next
    // session's to start.
    message(c, "e", "k3", 1);
    let later = claim_all(c, 1_600);
    deliver(c, &later[0], 1_601);
    record_acked_session(c, &later[0].delivery_id, copy.session).unwrap();
    sessions::end(c, "host-a", "i", copy.session, 2_000).unwrap();
    assert_eq!(sessions::lease_until(c, "host-a", copy.session).unwrap(), None);
    let third = sessions::open(c, "host-a", "i", None, RebindLimit::default(), 1_000, 2_100).unwrap();
    assert_eq!(third.took_over, None, "the copy's session ended cleanly");
    assert!(start(c, "host-a", "i", third.session, &[item(&later[0])], 2_200).unwrap()[0].start);
}

#[test]
fn cancel_in_every_state_is_idempotent() {
    let db = testing::db();
    let c = &db.conn;
    let op = Canceller::Operator("op");
    // queued, claimed, mirrored, delivered pending, delivered final, waiting for a retry.
    let queued = message(c, "q", "k0", 1);
    let ids: Vec<String> = (1..=5).map(|i| message(c, &format!("c{i}"), &format!("k{i}"), 2)).collect();
    let got = claim::claim(c, "host-a", "i", 5, 1).unwrap();
    assert_eq!(got.len(), 5);
    let by_id = |id: &str| got.iter().find(|d| d.delivery_id == id).unwrap().clone();
    let (claimed, mirrored_d, pending, finished, retrying) =
        (by_id(&queued), by_id(&ids[0]), by_id(&ids[1]), by_id(&ids[2]), by_id(&ids[3]));
    mirrored(c, "host-a", &mirrored_d.delivery_id, holder(&mirrored_d), 2).unwrap();
    for d in [&pending, &finished, &retrying] {
        deliver(c, d, 2);
    }
    report(c, &finished, "r-fin", Outcome::Succeeded, Some(0), 3).unwrap();
    let (_, _, retry_at) = report(c, &retrying, "r-retry", Outcome::Failed, Some(75), 3).unwrap();
    assert!(retry_at.is_some());
    assert_eq!(state(c, &retrying.delivery_id), Queued);
    // held: park the last one with a hold fence.
    use crate::store::registry::fences::{FenceKind, FenceScope, NewFence};
    let hold = NewFence {
        kind: FenceKind::Hold,
        scope: FenceScope::Conversation,
        target: Some("c5"),
        operator: "op",
        reason: "r",
    };
    crate::store::registry::fences::set(c, hold, 4).unwrap();
    claim::claim(c, "host-a", "i", 5, 5).unwrap();
    assert_eq!(state(c, &ids[4]), Held);

    let cases = [
        (claimed.delivery_id.clone(), EFFECT_CANCELLED, Failed),
        (mirrored_d.delivery_id.clone(), EFFECT_CANCELLED, Failed),
        (ids[4].clone(), EFFECT_CANCELLED, Failed),
        (retrying.delivery_id.clone(), EFFECT_CANCELLED, Failed),
        (pending.delivery_id.clone(), EFFECT_REQUESTED, Delivered),
        (finished.delivery_id.clone(), EFFECT_FINAL, Delivered),
    ];
    for (id, effect, after) in &cases {
        let dry = cancel(c, id, op, "stop", true, 6).unwrap();
        assert_eq!((dry.effect.as_str(), dry.state), (*effect, *after), "dry run of {id}");
        let before = (events(c, id), state(c, id));
        let first = cancel(c, id, op, "stop", false, 7).unwrap();
        assert_eq!((first.effect.as_str(), first.state), (*effect, *after), "{id}");
        let events_after = events(c, id);
        let again = cancel(c, id, op, "stop again", false, 8).unwrap();
        assert_eq!(again, first, "a repeated cancel answers the same");
        assert_eq!(events(c, id), events_after, "and records nothing more");
        if *effect == EFFECT_FINAL {
            assert_eq!((events_after, state(c, id)), before, "a final delivery is left as it is");
        }
    }
    let (reason, by): (Option<String>, Option<String>) = c
        .query_row("SELECT reason, cancel_by FROM deliveries WHERE id = $1", [&claimed.delivery_id], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((reason.as_deref(), by.as_deref()), (Some("cancelled: stop"), Some("operator:op")));
    let requested: i64 =
        c.query_row("SELECT count(*) FROM operator_events WHERE action = 'cancel'", [], |r| r.get(0)).unwrap();
    assert_eq!(requested, 1, "one event for the delivered turn's cancel request");
    // The node learns of it from the claim and from holdings.
    let notices = cancels_for(c, "host-a", "i").unwrap();
    assert_eq!(notices, [CancelNotice { delivery_id: pending.delivery_id.clone(), attempt: 1, reason: "stop".into() }]);
    let held = crate::store::lifecycle::handoff::holdings(c, "host-a", "i").unwrap();
    assert!(held.iter().any(|d| d.delivery_id == pending.delivery_id && d.cancel_requested));
    // `cancelled` is accepted for that run only; then the notice is gone and it is final.
    assert!(matches!(report(c, &finished, "r-x", Outcome::Cancelled, None, 9), Err(StoreError::ReportConflict(_))));
    report(c, &pending, "r-pending", Outcome::Cancelled, None, 9).unwrap();
    assert!(cancels_for(c, "host-a", "i").unwrap().is_empty());
    assert_eq!(cancel(c, &pending.delivery_id, op, "stop", false, 10).unwrap().effect, EFFECT_FINAL);
    // Nothing left to cancel in those conversations.
    assert!(cancellable(c, CancelScope::Host("host-a")).unwrap().is_empty());
    assert!(matches!(cancel(c, &crate::store::new_id(), op, "x", false, 11), Err(StoreError::NotFound(_))));
}

#[test]
fn cancelled_is_refused_without_a_cancel() {
    let db = testing::db();
    let c = &db.conn;
    message(c, "c", "k", 1);
    let d = claim_all(c, 1).remove(0);
    deliver(c, &d, 2);
    assert!(matches!(report(c, &d, "r1", Outcome::Cancelled, None, 3), Err(StoreError::Invalid(_))));
    report(c, &d, "r1", Outcome::Succeeded, Some(0), 3).unwrap();
}

#[test]
fn a_producer_cancels_its_own_messages_only() {
    let db = testing::db();
    let c = &db.conn;
    let m = accept_one(c, "c", "k", &["host-a", "host-b"]);
    assert!(matches!(cancel_message(c, &m, "someone-else", "r", 2), Err(StoreError::Forbidden(_))));
    assert!(matches!(cancel_message(c, &crate::store::new_id(), "prod", "r", 2), Err(StoreError::NotFound(_))));
    let r = cancel_message(c, &m, "prod", "not needed", 3).unwrap();
    assert_eq!(
        r.iter().map(|r| (r.host.as_deref().unwrap_or("-"), r.effect.as_str())).collect::<Vec<_>>(),
        [("host-a", EFFECT_CANCELLED), ("host-b", EFFECT_CANCELLED)]
    );
    assert_eq!(cancel_message(c, &m, "prod", "again", 4).unwrap(), r);
}

#[test]
fn a_retry_waits_for_its_time_keeps_order_and_ends_when_runs_are_spent() {
    let db = testing::db();
    let c = &db.conn;
    let first = message(c, "c", "k1", 2);
    let second = message(c, "c", "k2", 1);
    // The barrier: the retryable first turn is out, so the second waits.
    let got = claim_all(c, 1000);
    assert_eq!(got.iter().map(|d| d.delivery_id.as_str()).collect::<Vec<_>>(), [first.as_str()]);
    assert_eq!((got[0].attempt, got[0].max_attempts, got[0].rerun), (1, 2, None));
    deliver(c, &got[0], 1000);
    assert!(claim_all(c, 1001).is_empty(), "a later turn waits while the retryable one runs");
    let (attempt, dup, retry_at) = report(c, &got[0], "r1", Outcome::Failed, Some(75), 2000).unwrap();
    assert!(!dup && attempt.retryable);
    let retry_at = retry_at.unwrap();
    assert!((2800..=3200).contains(&retry_at), "1 s backoff ±20% from 2000: {retry_at}");
    assert_eq!(state(c, &first), Queued);
    assert_eq!(next_retry_at(c, "host-a", 2000).unwrap(), Some(retry_at));
    assert!(claim_all(c, retry_at - 1).is_empty(), "not before its time, and nothing passes it");
    let again = claim_all(c, retry_at);
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].delivery_id.as_str(), again[0].attempt), (first.as_str(), 2));
    assert_eq!(again[0].rerun, Some(baton_shared::states::Rerun::Retry));
    // A report for the earlier run is stale now.
    assert!(matches!(
        report(c, &got[0], "r1-late", Outcome::Failed, Some(1), retry_at),
        Err(StoreError::StaleClaim(_))
    ));
    deliver(c, &again[0], retry_at);
    let (attempt, _, retry_at2) = report(c, &again[0], "r2", Outcome::Failed, Some(75), retry_at + 1).unwrap();
    assert!(!attempt.retryable && retry_at2.is_none(), "max_attempts spent: final");
    assert_eq!(state(c, &first), Delivered);
    let runs: Vec<(u32, bool, Option<String>)> = c
        .prepare("SELECT attempt, retryable, caused_by FROM attempts WHERE delivery_id = $1 ORDER BY attempt")
        .unwrap()
        .query_map([&first], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(runs, [(1, true, Some("producer:prod".into())), (2, false, Some("hub".into()))]);
    assert_eq!(
        claim_all(c, retry_at + 2).iter().map(|d| d.delivery_id.as_str()).collect::<Vec<_>>(),
        [second.as_str()]
    );
}

#[test]
fn messages_without_retries_pipeline_as_before() {
    let db = testing::db();
    let c = &db.conn;
    message(c, "c", "k1", 1);
    message(c, "c", "k2", 1);
    assert_eq!(claim_all(c, 1).len(), 2);
}

#[test]
fn backoff_doubles_is_capped_and_jittered_within_a_fifth() {
    use crate::store::lifecycle::report::backoff_ms;
    assert_eq!(backoff_ms(1000, 1, 60_000, 0), 1000);
    assert_eq!(backoff_ms(1000, 3, 60_000, 0), 4000);
    assert_eq!(backoff_ms(1000, 30, 60_000, 0), 60_000);
    assert_eq!(backoff_ms(1000, 1, 60_000, 2000), 1200);
    assert_eq!(backoff_ms(1000, 1, 60_000, -2000), 800);
    assert_eq!(backoff_ms(1000, 1, 60_000, 9999), 1200, "jitter is bounded");
    assert_eq!(backoff_ms(1000, 30, 60_000, 2000), 60_000, "never over the cap");
}

#[test]
fn operator_retry_and_redrive_rerun_final_deliveries_out_of_order() {
    let db = testing::db();
    let c = &db.conn;
    let failed = message(c, "c", "k1", 1);
    let later = message(c, "c", "k2", 1);
    let got = claim_all(c, 1);
    for d in &got {
        deliver(c, d, 2);
    }
    report(c, &got[0], "r1", Outcome::Failed, Some(3), 3).unwrap();
    assert!(matches!(retry(c, &later, "op", "r", 4), Err(StoreError::InvalidTransition(_))), "run pending");
    report(c, &got[1], "r2", Outcome::Succeeded, Some(0), 3).unwrap();
    assert!(matches!(retry(c, &later, "op", "r", 4), Err(StoreError::InvalidTransition(_))), "succeeded");
    let f = RedriveFilter { outcome: "failed".into(), ..Default::default() };
    assert_eq!(
        redrive_batch(c, &f, i64::MIN, 10).unwrap().iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        [failed.as_str()]
    );
    assert_eq!(retry(c, &failed, "op", "try again", 5).unwrap(), 2);
    assert!(redrive_batch(c, &f, i64::MIN, 10).unwrap().is_empty(), "a redriven delivery is not final");
    // A later turn queued after it does not wait for the redrive, nor the redrive for it.
    let third = message(c, "c", "k3", 1);
    let got = claim_all(c, 6);
    let mut ids: Vec<_> = got.iter().map(|d| (d.delivery_id.clone(), d.attempt, d.rerun.map(|r| r.as_str()))).collect();
    ids.sort();
    let mut expected = vec![(failed.clone(), 2, Some("redrive")), (third, 1, None)];
    expected.sort();
    assert_eq!(ids, expected);
    let (by, why): (String, String) = c
        .query_row("SELECT rerun_by, rerun_reason FROM deliveries WHERE id = $1", [&failed], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((by.as_str(), why.as_str()), ("operator:op", "try again"));
    // Redrive by request id is recorded once.
    record_redrive(c, "req-1", "op", "r", &f, 1, 7).unwrap();
    assert_eq!(recorded_redrive(c, "req-1").unwrap().unwrap().redriven, 1);
    assert!(record_redrive(c, "req-1", "op", "r", &f, 1, 8).is_err());
    // A cancelled-in-the-hub delivery is redriven as `cancelled`.
    let x = message(c, "x", "kx", 1);
    cancel(c, &x, Canceller::Operator("op"), "oops", false, 9).unwrap();
    let fc = RedriveFilter { outcome: "cancelled".into(), ..Default::default() };
    assert_eq!(redrive_batch(c, &fc, i64::MIN, 10).unwrap().len(), 1);
    retry(c, &x, "op", "r", 10).unwrap();
    let cancel_cleared: bool =
        c.query_row("SELECT cancel_requested_at IS NULL FROM deliveries WHERE id = $1", [&x], |r| r.get(0)).unwrap();
    assert!(cancel_cleared);
}

/// A turn stopped for a stall is retried as exit 75 is, while `max_attempts` leaves room; one
/// stopped by its deadline is final; a report naming the bound hashes apart from one that does
/// not (a replay matches only itself). The claim carries the message's bounds to the node.
#[test]
fn a_stall_is_retried_and_a_deadline_is_final() {
    use crate::store::lifecycle::report::StoppedBy;
    let db = testing::db();
    let c = &*db.conn;
    let stalled = message(c, "c1", "k1", 2);
    let late = message(c, "c2", "k2", 2);
    c.execute("UPDATE messages SET deadline_ms = 5000, stall_ms = 700", []).unwrap();
    let claimed = claim_all(c, 10);
    assert!(claimed.iter().all(|d| (d.deadline_ms, d.stall_ms) == (Some(5000), Some(700))), "{claimed:?}");
    for d in &claimed {
        deliver(c, d, 11);
    }
    let stopped = |d: &ClaimedDelivery, by: StoppedBy, id: &str| {
        let r = NewReport {
            delivery_id: &d.delivery_id,
            holder: holder(d),
            report_id: id,
            outcome: Outcome::Failed,
            exit_code: None,
            duration_ms: Some(700),
            result: None,
            reason: Some("stopped"),
            stderr_tail: None,
            stderr_dropped_bytes: None,
        };
        let run = RunReport { attempt: Some(d.attempt), stopped_by: Some(by), ..RunReport::default() };
        report_run(c, "host-a", &r, &run, 12)
    };
    let d = claimed.iter().find(|d| d.delivery_id == stalled).unwrap();
    let (attempt, _, retry_at) = stopped(d, StoppedBy::Stall, "r1").unwrap();
    assert!(attempt.retryable && retry_at.is_some(), "{attempt:?}");
    assert_eq!(state(c, &stalled), DeliveryState::Queued);
    let d = claimed.iter().find(|d| d.delivery_id == late).unwrap();
    let (attempt, _, retry_at) = stopped(d, StoppedBy::Deadline, "r2").unwrap();
    assert!(!attempt.retryable && retry_at.is_none(), "{attempt:?}");
    assert_eq!(state(c, &late), DeliveryState::Delivered);
    assert!(matches!(stopped(d, StoppedBy::Stall, "r2"), Err(StoreError::ReportConflict(_))), "another bound");
}
