//! Mutation proof: a checker that never fails proves nothing. Each test runs a small real
//! scenario (hub + two nodes, real processes, no crash), then injects the state a specific bug
//! would leave, and asserts the checker reports exactly that invariant family. One clean run
//! must report nothing.
//!
//! The same holds for a record in PostgreSQL shared by two hubs (the tests named `…_on_postgres`,
//! skipped without PostgreSQL unless `BATON_REQUIRE_POSTGRES=1`): the bug's state is written by
//! SQL into that database, and the checker, reading it over the store's PostgreSQL connection,
//! must name the family.

use baton_fault::checker::{self, HubRecord, Report};
use baton_fault::cluster::{AcceptOutcome, Cluster, Retries};
use baton_fault::matrix::{clean_cluster, clean_cluster_on_postgres};
use baton_fault::records::{EffectLine, HistoryLine, LineWriter, read_lines};
use baton_hub::store::engine::postgres::PgUrl;
use baton_hub::store::engine::{Db, PgConn};
use baton_testkit::Binaries;
use rusqlite::Connection;
use std::collections::BTreeSet;
use std::process::{Command, Output};

fn with_cluster(seed: u64, mutate: impl FnOnce(&Cluster)) -> Report {
    let bins = Binaries::build().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let c = rt.block_on(clean_cluster(&bins, seed)).unwrap();
    let before = checker::check(&c.inputs(true)).unwrap();
    assert!(before.violations.is_empty(), "the baseline run is not clean:\n{}", before.render());
    mutate(&c);
    let report = checker::check(&c.inputs(true)).unwrap();
    drop(rt);
    report
}

fn assert_only(report: &Report, family: &str) {
    let got = report.families();
    let want: BTreeSet<String> = [family.to_string()].into();
    assert_eq!(got, want, "expected exactly {family}:\n{}", report.render());
    assert!(report.violations.iter().all(|v| !v.chain.is_empty()), "every violation has a chain:\n{}", report.render());
}

/// The hub database, writable, foreign keys off (the bug's write did not care either).
fn hub_rw(c: &Cluster) -> Connection {
    let conn = Connection::open(c.hub.db()).unwrap();
    conn.pragma_update(None, "foreign_keys", false).unwrap();
    conn
}

fn one(conn: &Connection, sql: &str) -> String {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[test]
fn a_clean_run_has_no_violations() {
    let report = with_cluster(11, |_| {});
    assert!(report.violations.is_empty(), "{}", report.render());
    assert!(report.counts["messages"] >= 3 && report.counts["effects"] >= 3, "{:?}", report.counts);
}

#[test]
fn i1_ok_answered_before_commit_is_a_lost_accept() {
    let report = with_cluster(12, |c| {
        let mut h = LineWriter::append(&c.history).unwrap();
        for phase in ["invoke", "ok"] {
            let line = HistoryLine {
                op: "accept".into(),
                phase: phase.into(),
                key: "never-committed".into(),
                payload_hash: "h".into(),
                message_id: (phase == "ok").then(|| "0190aaaa-0000-7000-8000-000000000000".into()),
                http: (phase == "ok").then_some(201),
                producer: Some("prod".into()),
                err: None,
            };
            h.write(&line).unwrap();
        }
    });
    assert_only(&report, "I1");
}

#[test]
fn i2_same_key_other_content_accepted_is_a_duplicate() {
    let report = with_cluster(13, |c| {
        let lines = read_lines::<HistoryLine>(&c.history).unwrap().items;
        let mut ok = lines.into_iter().find(|l| l.phase == "ok").unwrap();
        ok.payload_hash = "different-content".into();
        LineWriter::append(&c.history).unwrap().write(&ok).unwrap();
    });
    assert_only(&report, "I2");
}

#[test]
fn i3_accept_with_routing_but_no_obligation_is_not_atomic() {
    // A message fanned out in its accept's transaction keeps no routing rows: one beside its
    // deliveries, with no obligation to own it, is half of another kind of accept.
    let report = with_cluster(14, |c| {
        let conn = hub_rw(c);
        conn.execute(
            "INSERT INTO message_recipients (message_id, host)
             SELECT id, 'host-z' FROM messages WHERE rowid = (SELECT min(rowid) FROM messages)",
            [],
        )
        .unwrap();
    });
    assert_only(&report, "I3");
}

/// Writes message `mid`'s obligation with `obligation` (`?1` the message) and its routing from
/// its deliveries, as an accept that leaves its fan-out to a later transaction keeps them.
fn keep_routing(conn: &Connection, mid: &str, obligation: &str) {
    for sql in [
        obligation,
        "INSERT INTO message_recipients (message_id, host)
         SELECT DISTINCT message_id, host FROM deliveries WHERE message_id = ?1 AND pool IS NULL",
        "INSERT INTO message_pool_recipients (message_id, pool)
         SELECT DISTINCT message_id, pool FROM deliveries WHERE message_id = ?1 AND pool IS NOT NULL",
    ] {
        conn.execute(sql, [mid]).unwrap();
    }
}

#[test]
fn i4_fan_out_done_with_a_recipient_missing() {
    let report = with_cluster(15, |c| {
        let conn = hub_rw(c);
        let mid = one(&conn, "SELECT id FROM messages LIMIT 1");
        // Its routing kept with a done obligation, as a later fan-out keeps it, naming one host
        // more than it has deliveries for.
        keep_routing(&conn, &mid, "INSERT INTO fanout_obligations (message_id, created_at, done_at) VALUES (?1, 1, 1)");
        conn.execute("INSERT INTO message_recipients (message_id, host) VALUES (?1, 'host-z')", [&mid]).unwrap();
    });
    assert_only(&report, "I4");
}

#[test]
fn i5_mirrored_by_an_instance_that_does_not_hold_the_claim() {
    // The bug: `mirrored` without the holder check lets another instance move the delivery.
    let report = with_cluster(16, |c| {
        let conn = hub_rw(c);
        conn.execute(
            "UPDATE delivery_events SET instance_id = 'stale-instance'
             WHERE id = (SELECT min(id) FROM delivery_events WHERE to_state = 'mirrored')",
            [],
        )
        .unwrap();
    });
    assert_only(&report, "I5");
}

#[test]
fn i6_claim_under_an_active_block_fence() {
    // The bug: fences read outside the claim transaction, so a claim commits after a block.
    let report = with_cluster(17, |c| {
        let conn = hub_rw(c);
        let (conversation, at, event): (String, i64, i64) = conn
            .query_row(
                "SELECT d.conversation, e.at, e.id FROM delivery_events e JOIN deliveries d ON d.id = e.delivery_id
                 WHERE e.to_state = 'claimed' ORDER BY e.id LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        // A block fence committed just before that claim and lifted just after it.
        conn.execute(
            "INSERT INTO fences (kind, scope, target, set_by, set_at, set_after_event, reason, lifted_at,
                                 lifted_after_event, lifted_by, lifted_reason)
             VALUES ('block', 'conversation', ?1, 'op', ?2, ?3, 'mutation', ?4, ?5, 'op', 'mutation')",
            rusqlite::params![conversation, at, event - 1, at, event],
        )
        .unwrap();
    });
    assert_only(&report, "I6");
}

#[test]
fn i7_an_execution_by_an_instance_whose_ack_the_hub_never_confirmed() {
    // The bug: a node instance runs a turn whose ack the hub refused (the execution gate).
    let report = with_cluster(18, |c| {
        rewrite_ledger(c, |lines| lines[0].instance = "never-acked-instance".into());
    });
    assert_only(&report, "I7");
}

#[test]
fn i8_an_attempt_without_a_known_end_reported_succeeded() {
    // The bug: after a crash mid-turn, the node reports the attempt succeeded instead of unknown.
    let report = with_cluster(19, |c| {
        let node = Connection::open(c.nodes[0].db()).unwrap();
        let n = node
            .execute(
                "UPDATE attempts SET ended_at_ms = NULL, outcome = NULL
                 WHERE attempt_id = (SELECT min(attempt_id) FROM attempts)",
                [],
            )
            .unwrap();
        assert_eq!(n, 1);
    });
    assert_only(&report, "I8");
}

#[test]
fn i9_a_retried_report_counted_twice() {
    let report = with_cluster(20, |c| {
        let conn = hub_rw(c);
        // The bug's schema lacks the one-row-per-run index as well.
        conn.execute("DROP INDEX attempts_one_per_run", []).unwrap();
        conn.execute(
            "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, reported_at)
             SELECT id || '-again', delivery_id, host, instance_id, report_id || '-again', request_hash, 'failed',
                    reported_at + 1
             FROM attempts LIMIT 1",
            [],
        )
        .unwrap();
    });
    assert_only(&report, "I9");
}

#[test]
fn i10_an_obligation_left_pending_after_heal() {
    let report = with_cluster(21, |c| {
        let conn = hub_rw(c);
        // A message whose fan-out is still owed is not settled either.
        // (Its routing written with it, as an accept that leaves its fan-out for later writes it.)
        let mid = one(&conn, "SELECT id FROM messages WHERE rowid = (SELECT min(rowid) FROM messages)");
        keep_routing(&conn, &mid, "INSERT INTO fanout_obligations (message_id, created_at) VALUES (?1, 1)");
        conn.execute("UPDATE messages SET settled_at = NULL WHERE id = ?1", [&mid]).unwrap();
    });
    assert_only(&report, "I10");
}

#[test]
fn i9_a_finished_message_left_unsettled() {
    let report = with_cluster(36, |c| {
        // Retention would keep it for ever.
        hub_rw(c)
            .execute("UPDATE messages SET settled_at = NULL WHERE rowid = (SELECT min(rowid) FROM messages)", [])
            .unwrap();
    });
    assert_only(&report, "I9");
}

#[test]
fn i12_a_broken_foreign_key() {
    let report = with_cluster(22, |c| {
        let conn = hub_rw(c);
        conn.execute(
            "INSERT INTO delivery_events (delivery_id, from_state, to_state, actor_kind, actor, at)
             VALUES ('no-such-delivery', NULL, 'queued', 'hub', 'hub', 1)",
            [],
        )
        .unwrap();
    });
    assert_only(&report, "I12");
}

#[test]
fn i13_a_node_believes_it_acked_what_the_hub_gave_another_host() {
    let report = with_cluster(23, |c| {
        let hub = hub_rw(c);
        let other = one(&hub, "SELECT id FROM deliveries WHERE host = 'host-b' AND state = 'delivered' LIMIT 1");
        let node = Connection::open(c.nodes[0].db()).unwrap();
        node.execute(
            "INSERT INTO deliveries (delivery_id, message_id, conversation, seq, payload, claim_token, state,
                                     mirrored_at_ms, updated_at_ms)
             VALUES (?1, 'm', 'c0', 1, '{}', 't', 'done', 1, 1)",
            [&other],
        )
        .unwrap();
    });
    assert_only(&report, "I13");
}

#[test]
fn i14_a_claim_recorded_as_made_by_an_operator() {
    let report = with_cluster(24, |c| {
        let conn = hub_rw(c);
        conn.execute(
            "UPDATE delivery_events SET actor_kind = 'operator'
             WHERE id = (SELECT min(id) FROM delivery_events WHERE to_state = 'claimed')",
            [],
        )
        .unwrap();
    });
    assert_only(&report, "I14");
}

/// Rewrites the ledger after `change` edits its lines.
fn rewrite_ledger(c: &Cluster, change: impl FnOnce(&mut Vec<EffectLine>)) {
    let mut lines = read_lines::<EffectLine>(&c.ledger).unwrap().items;
    change(&mut lines);
    std::fs::remove_file(&c.ledger).unwrap();
    let mut w = LineWriter::append(&c.ledger).unwrap();
    for l in &lines {
        w.write(l).unwrap();
    }
}

/// Indices of two ledger lines of one conversation on one host, in start order.
fn two_turns_of_one_conversation(lines: &[EffectLine]) -> (usize, usize) {
    let mut idx: Vec<usize> = (0..lines.len()).collect();
    idx.sort_by_key(|&i| lines[i].started_ns);
    for (n, &i) in idx.iter().enumerate() {
        for &j in &idx[n + 1..] {
            if lines[i].host == lines[j].host && lines[i].conversation == lines[j].conversation {
                assert!(lines[i].seq < lines[j].seq, "the clean run is already out of order: {lines:?}");
                return (i, j);
            }
        }
    }
    panic!("no conversation ran two turns on one host: {lines:?}");
}

#[test]
fn i15_a_later_seq_ran_before_an_earlier_one() {
    // The bug: a later message's delivery was claimed and run before an earlier one's existed.
    let report = with_cluster(25, |c| {
        rewrite_ledger(c, |lines| {
            let (i, j) = two_turns_of_one_conversation(lines);
            let (a, b) = (lines[i].seq, lines[j].seq);
            lines[i].seq = b;
            lines[j].seq = a;
        });
    });
    assert_only(&report, "I15");
}

#[test]
fn i15_a_turn_started_before_the_previous_one_ended() {
    // The bug: two turns of one conversation handed out together and run in parallel.
    let report = with_cluster(26, |c| {
        rewrite_ledger(c, |lines| {
            let (i, j) = two_turns_of_one_conversation(lines);
            let start = lines[i].started_ns.unwrap();
            lines[i].ended_ns = Some(lines[j].started_ns.unwrap() + 1);
            assert!(lines[i].ended_ns > Some(start));
        });
    });
    assert_only(&report, "I15");
}

/// Swaps the `seq`s of two turns of one conversation (as if the later one ran first) and
/// returns the delivery of the one that started first.
fn swap_two_turns(c: &Cluster) -> String {
    let mut first = String::new();
    rewrite_ledger(c, |lines| {
        let (i, j) = two_turns_of_one_conversation(lines);
        let (a, b) = (lines[i].seq, lines[j].seq);
        lines[i].seq = b;
        lines[j].seq = a;
        first = lines[i].delivery_id.clone();
    });
    first
}

/// Records delivery `did`'s one execution as run `run`, made for `rerun`, of a message that
/// allows `max_attempts`: the message, the delivery, its attempt row and the ledger line agree,
/// as the hub and node record a re-run.
fn make_run(c: &Cluster, did: &str, run: i64, rerun: &str, max_attempts: i64) {
    let hub = hub_rw(c);
    hub.execute(
        "UPDATE messages SET max_attempts = ?2 WHERE id = (SELECT message_id FROM deliveries WHERE id = ?1)",
        rusqlite::params![did, max_attempts],
    )
    .unwrap();
    let n = hub
        .execute("UPDATE deliveries SET attempt = ?2, rerun = ?3 WHERE id = ?1", rusqlite::params![did, run, rerun])
        .unwrap();
    assert_eq!(n, 1);
    let n = hub
        .execute(
            "UPDATE attempts SET attempt = ?2, rerun = ?3 WHERE delivery_id = ?1",
            rusqlite::params![did, run, rerun],
        )
        .unwrap();
    assert_eq!(n, 1);
    rewrite_ledger(c, |lines| {
        for l in lines.iter_mut().filter(|l| l.delivery_id == did) {
            l.run = Some(run);
            l.rerun = Some(rerun.into());
        }
    });
}

/// The delivery whose execution started last (any later run of it stays in order).
fn last_started(c: &Cluster) -> EffectLine {
    let lines = read_lines::<EffectLine>(&c.ledger).unwrap().items;
    lines.into_iter().max_by_key(|l| l.started_ns).unwrap()
}

#[test]
fn i15_an_operator_redrive_marked_in_the_record_is_exempt() {
    let report = with_cluster(27, |c| {
        let first = swap_two_turns(c);
        make_run(c, &first, 2, "redrive", 1);
    });
    assert!(report.violations.is_empty(), "{}", report.render());
    assert_eq!(report.counts["reruns"], 1, "{:?}", report.counts);
}

#[test]
fn i15_a_retry_out_of_order_is_not_exempt() {
    // The bug: a harness-requested retry is handed out after later turns of its conversation.
    let report = with_cluster(28, |c| {
        let first = swap_two_turns(c);
        make_run(c, &first, 2, "retry", 3);
    });
    assert_only(&report, "I15");
}

#[test]
fn i16_a_turn_started_after_its_cancel_was_confirmed() {
    // The bug: the hub confirms a start although a cancel of the run is already recorded.
    let report = with_cluster(29, |c| {
        let did = last_started(c).delivery_id;
        let hub = hub_rw(c);
        let n = hub
            .execute(
                "UPDATE deliveries SET cancel_requested_at = updated_at - 1000, cancel_by = 'op',
                        cancel_reason = 'mutation', started_at = updated_at
                 WHERE id = ?1 AND state = 'delivered'",
                [&did],
            )
            .unwrap();
        assert_eq!(n, 1);
    });
    assert_only(&report, "I16");
}

#[test]
fn i16_a_running_turn_terminated_for_its_cancel_reported_as_succeeded() {
    // The bug: the node kills a running turn for its cancel, then reports the outcome it read
    // from the dead process instead of `cancelled`.
    let report = with_cluster(34, |c| {
        let did = last_started(c).delivery_id;
        let hub = hub_rw(c);
        let n = hub
            .execute(
                "UPDATE deliveries SET started_at = updated_at, cancel_requested_at = updated_at + 1,
                        cancel_by = 'op', cancel_reason = 'mutation'
                 WHERE id = ?1 AND state = 'delivered'",
                [&did],
            )
            .unwrap();
        assert_eq!(n, 1);
        rewrite_ledger(c, |lines| {
            for l in lines.iter_mut().filter(|l| l.delivery_id == did) {
                l.signal = Some("TERM".into());
                l.exit_code = None;
            }
        });
    });
    assert_only(&report, "I16");
}

#[test]
fn i16_an_attempt_cancelled_without_a_cancel() {
    // The bug: the hub accepts outcome `cancelled` for a run nobody cancelled.
    let report = with_cluster(35, |c| {
        let did = last_started(c).delivery_id;
        let hub = hub_rw(c);
        let n = hub.execute("UPDATE attempts SET outcome = 'cancelled' WHERE delivery_id = ?1", [&did]).unwrap();
        assert_eq!(n, 1);
    });
    assert_only(&report, "I16");
}

#[test]
fn i16_a_retry_above_max_attempts() {
    // The bug: the hub requeues a harness's exit 75 although no attempts are left.
    let report = with_cluster(30, |c| {
        let did = last_started(c).delivery_id;
        make_run(c, &did, 2, "retry", 1);
    });
    assert_only(&report, "I16");
}

#[test]
fn i16_a_retry_handed_out_before_its_not_before_time() {
    // The bug: the claim ignores `not_before` and hands a retry out at once.
    let report = with_cluster(31, |c| {
        let did = last_started(c).delivery_id;
        make_run(c, &did, 2, "retry", 3);
        let hub = hub_rw(c);
        hub.execute(
            "UPDATE deliveries SET not_before =
                 (SELECT max(at) FROM delivery_events WHERE delivery_id = ?1 AND to_state = 'claimed') + 60000
             WHERE id = ?1",
            [&did],
        )
        .unwrap();
    });
    assert_only(&report, "I16");
}

#[test]
fn i16_a_rerun_that_rewrote_the_old_attempt_row() {
    // The bug: run 2's report updates run 1's attempt row instead of adding its own.
    let report = with_cluster(32, |c| {
        let old = last_started(c);
        let ended = read_lines::<EffectLine>(&c.ledger).unwrap().items.iter().filter_map(|l| l.ended_ns).max().unwrap();
        let mut rerun = old.clone();
        rerun.attempt_id = format!("{}-run2", old.attempt_id);
        rerun.nonce = "run-2".into();
        rerun.run = Some(2);
        rerun.rerun = Some("retry".into());
        rerun.started_ns = Some(ended + 1_000_000);
        rerun.ended_ns = Some(ended + 2_000_000);
        LineWriter::append(&c.ledger).unwrap().write(&rerun).unwrap();
        // The node keeps one attempt row per run.
        let copied: usize = c
            .nodes
            .iter()
            .map(|n| {
                Connection::open(n.db())
                    .unwrap()
                    .execute(
                        "INSERT INTO attempts (attempt_id, delivery_id, started_at_ms, ended_at_ms, outcome, exit_code,
                                               duration_ms, result, reason)
                         SELECT ?2, delivery_id, started_at_ms + 1, ended_at_ms + 1, outcome, exit_code, duration_ms,
                                result, reason
                         FROM attempts WHERE attempt_id = ?1",
                        [&old.attempt_id, &rerun.attempt_id],
                    )
                    .unwrap()
            })
            .sum();
        assert_eq!(copied, 1);
        let hub = hub_rw(c);
        hub.execute(
            "UPDATE messages SET max_attempts = 3 WHERE id = (SELECT message_id FROM deliveries WHERE id = ?1)",
            [&old.delivery_id],
        )
        .unwrap();
        hub.execute("UPDATE deliveries SET attempt = 2, rerun = 'retry' WHERE id = ?1", [&old.delivery_id]).unwrap();
        let n = hub
            .execute(
                "UPDATE attempts SET attempt = 2, rerun = 'retry', report_id = ?2 WHERE report_id = ?1",
                [&old.attempt_id, &rerun.attempt_id],
            )
            .unwrap();
        assert_eq!(n, 1);
    });
    assert_only(&report, "I16");
}

#[test]
fn i17_two_executions_of_one_run_from_two_processes() {
    // The bug: a copy of a node's data directory (same instance, a later session) runs a turn
    // the original already ran.
    let report = with_cluster(33, |c| {
        let mut e: EffectLine = read_lines::<EffectLine>(&c.ledger).unwrap().items.remove(0);
        e.nonce = "another-process".into();
        e.session = Some("2".into());
        LineWriter::append(&c.ledger).unwrap().write(&e).unwrap();
    });
    assert_only(&report, "I17");
}

#[test]
fn i17_a_turn_run_again_by_a_copy_of_the_node_data_directory() {
    // The bug as it happens: a node's data directory is copied while the node is cut off; the
    // copy (the same instance, a later session) runs a turn the original acked, and the
    // original runs it too, under an attempt of its own, which the hub never counts (the copy
    // reported the run). Both data directories are read: the copy's, and the original's.
    let bins = Binaries::build().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let c = rt.block_on(clean_cluster(&bins, 36)).unwrap();
    let last = last_started(&c);
    let node = c
        .nodes
        .iter()
        .find(|n| one_or_none(&n.db(), "SELECT attempt_id FROM attempts WHERE attempt_id = ?1", &last.attempt_id))
        .expect("the node that ran the last turn");
    let copy = c.root().join("copy-of-node.db");
    for suffix in ["", "-wal"] {
        let from = std::path::PathBuf::from(format!("{}{suffix}", node.db().display()));
        if from.exists() {
            std::fs::copy(&from, format!("{}{suffix}", copy.display())).unwrap();
        }
    }
    let mut inputs = c.inputs(true);
    inputs.node_dbs.push(copy.clone());
    let before = checker::check(&inputs).unwrap();
    assert!(before.violations.is_empty(), "a copied directory alone is no violation:\n{}", before.render());

    let ended = read_lines::<EffectLine>(&c.ledger).unwrap().items.iter().filter_map(|l| l.ended_ns).max().unwrap();
    let mut again = last.clone();
    again.attempt_id = format!("{}-again", last.attempt_id);
    again.nonce = "the-original".into();
    again.started_ns = Some(ended + 1_000_000);
    again.ended_ns = Some(ended + 2_000_000);
    LineWriter::append(&c.ledger).unwrap().write(&again).unwrap();
    // The copied file stands for the original's directory: it ran the turn under its own
    // attempt (the other directory, the copy's, keeps the run the hub counted).
    let mut original = Connection::open(&copy).unwrap();
    let tx = original.transaction().unwrap();
    tx.pragma_update(None, "defer_foreign_keys", true).unwrap();
    let ids = [&last.attempt_id, &again.attempt_id];
    let n = tx.execute("UPDATE attempts SET attempt_id = ?2 WHERE attempt_id = ?1", ids).unwrap();
    assert_eq!(n, 1);
    tx.execute("UPDATE outbox SET report_id = ?2 WHERE report_id = ?1", ids).unwrap();
    tx.commit().unwrap();
    let report = checker::check(&inputs).unwrap();
    drop(rt);
    let i17: Vec<_> = report.violations.iter().filter(|v| v.invariant == "I17").collect();
    assert_eq!(i17.len(), 1, "{}", report.render());
    assert_eq!(i17[0].subject, last.delivery_id, "{}", report.render());
    assert!(i17[0].message.contains("the-original") && i17[0].message.contains(&last.nonce), "{}", report.render());
    assert!(!i17[0].chain.is_empty(), "{}", report.render());
    // The uncounted execution is also invisible on the hub (I8's finding); nothing else.
    let want: BTreeSet<String> = ["I8".to_string(), "I17".to_string()].into();
    assert_eq!(report.families(), want, "{}", report.render());
}

#[test]
fn a_run_the_copy_reported_unknown_is_the_visible_outcome_of_the_originals_execution() {
    // Not a bug: the original of a copied directory ran a turn and was taken over before it
    // reported; the copy, told that another session started the run, reported it `unknown`
    // under an attempt of its own. Read with both directories the execution is visible on the
    // hub (I8); read without the original's, its execution has no start marker and no attempt.
    let bins = Binaries::build().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let c = rt.block_on(clean_cluster(&bins, 37)).unwrap();
    let last = last_started(&c);
    let node = c
        .nodes
        .iter()
        .find(|n| one_or_none(&n.db(), "SELECT attempt_id FROM attempts WHERE attempt_id = ?1", &last.attempt_id))
        .expect("the node that ran the last turn");
    // The original's directory, as it was when it ran the turn.
    let original = c.root().join("original-of-node.db");
    for suffix in ["", "-wal"] {
        let from = std::path::PathBuf::from(format!("{}{suffix}", node.db().display()));
        if from.exists() {
            std::fs::copy(&from, format!("{}{suffix}", original.display())).unwrap();
        }
    }
    // The copy's directory (the node's): the run ended `unknown` under the copy's own attempt.
    let unknown = format!("{}-copy", last.attempt_id);
    let ids = [&last.attempt_id, &unknown];
    let mut copy = Connection::open(node.db()).unwrap();
    let tx = copy.transaction().unwrap();
    tx.pragma_update(None, "defer_foreign_keys", true).unwrap();
    let n = tx
        .execute(
            "UPDATE attempts SET attempt_id = ?2, outcome = 'unknown', exit_code = NULL WHERE attempt_id = ?1",
            ids,
        )
        .unwrap();
    assert_eq!(n, 1);
    tx.execute("UPDATE outbox SET report_id = ?2 WHERE report_id = ?1", ids).unwrap();
    tx.commit().unwrap();
    let hub = hub_rw(&c);
    let n = hub.execute("UPDATE attempts SET report_id = ?2, outcome = 'unknown' WHERE report_id = ?1", ids).unwrap();
    assert_eq!(n, 1);

    let mut inputs = c.inputs(true);
    inputs.node_dbs.push(original.clone());
    inputs.retired_node_dbs.push(original);
    let both = checker::check(&inputs).unwrap();
    let copy_only = checker::check(&c.inputs(true)).unwrap();
    drop(rt);
    assert!(both.violations.is_empty(), "{}", both.render());
    assert_only(&copy_only, "I8");
}

/// The state a hub that took a node's progress after the run's outcome would leave: a progress
/// event positioned after the outcome of its run.
const PROGRESS_AFTER_OUTCOME: &str = "INSERT INTO progress_events (n, delivery_id, attempt, seq, at, body)
     SELECT a.event_n + 1000000, a.delivery_id, a.attempt, 1, a.reported_at + 1, '{}'
     FROM attempts a WHERE a.event_n IS NOT NULL ORDER BY a.event_n LIMIT 1";

#[test]
fn i19_a_progress_event_recorded_after_its_run_s_outcome() {
    // The bug: `POST /v1/running` without the check that the run has no outcome yet.
    let report = with_cluster(38, |c| {
        let n = hub_rw(c).execute(PROGRESS_AFTER_OUTCOME, []).unwrap();
        assert_eq!(n, 1);
    });
    assert_only(&report, "I19");
    assert!(report.violations[0].message.contains("after the run's outcome"), "{}", report.render());
}

#[test]
fn i19_a_turn_that_ran_past_its_deadline() {
    // The bug: a node that does not stop a turn at its message's deadline (it ran a minute; the
    // message allowed 50 ms, and kill_grace plus the stated bound are 12 s).
    let report = with_cluster(39, |c| {
        let conn = hub_rw(c);
        let d =
            one(&conn, "SELECT delivery_id FROM attempts WHERE request_hash <> '' AND outcome <> 'unknown' LIMIT 1");
        conn.execute(
            "UPDATE messages SET deadline_ms = 50 WHERE id = (SELECT message_id FROM deliveries WHERE id = ?1)",
            [&d],
        )
        .unwrap();
        conn.execute("UPDATE attempts SET duration_ms = 60000 WHERE delivery_id = ?1", [&d]).unwrap();
    });
    assert_only(&report, "I19");
    assert!(report.violations.iter().any(|v| v.message.contains("past its deadline_ms = 50")), "{}", report.render());
}

// ---------------------------------------------------------------------------------------------
// Pools (I18)

/// The pool of the pool fixture, and its one conversation.
const POOL: &str = "p";
const POOL_CONVERSATION: &str = "pc";
/// Turns of the pool conversation each host runs in the pool fixture.
const POOL_TURNS_PER_HOST: usize = 2;

/// A clean run with pool traffic, checked clean, then `mutate`, then the checker again. Hub and
/// two nodes, both hosts members of `POOL`: the first turns of `POOL_CONVERSATION` (addressed
/// to the pool) run while only host-a's node is up, the next ones while only host-b's is (so
/// the conversation's order passes from one host to the other), each batch drained; one
/// message to a host rides along.
fn with_pool_cluster(mutate: impl FnOnce(&Cluster)) -> Report {
    let bins = Binaries::build().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let c = rt.block_on(async {
        let mut c = Cluster::new(&bins, &["host-a", "host-b"]).await.unwrap();
        // Any member may take a free conversation at once: host-b need not wait out host-a's
        // affinity.
        c.hub.set_env("BATON_HUB_POOL_AFFINITY_WAIT", "0s");
        c.hub.cli(["pools", "add", "--pool", POOL, "host-a", "host-b", "--reason", "fixture"]).unwrap();
        assert!(matches!(c.start_hub(None).unwrap(), baton_testkit::Started::Ready(_)), "{}", c.logs());
        let pools = [POOL.to_string()];
        let mut n = 0;
        for node in 0..2 {
            c.nodes[node].start(None).unwrap();
            for _ in 0..POOL_TURNS_PER_HOST {
                n += 1;
                let payload = serde_json::json!({"n": n});
                let got = c
                    .producer
                    .accept_with(
                        c.hub.addr(),
                        POOL_CONVERSATION,
                        &format!("pool-{n}"),
                        &payload,
                        &[],
                        &pools,
                        Retries::default(),
                    )
                    .await;
                assert!(matches!(got, AcceptOutcome::Ok(_)), "{got:?}");
            }
            if node == 0 {
                let to = ["host-a".to_string()];
                let got = c.producer.accept(c.hub.addr(), "own", "own-1", &serde_json::json!({}), &to).await;
                assert!(matches!(got, AcceptOutcome::Ok(_)), "{got:?}");
            }
            assert!(c.quiesce(std::time::Duration::from_secs(60)).await, "not drained:\n{}", c.pending());
            c.nodes[node].proc_mut().kill().unwrap();
        }
        c.hub.kill().unwrap();
        c
    });
    let before = checker::check(&c.inputs(true)).unwrap();
    assert!(before.violations.is_empty(), "the baseline run is not clean:\n{}", before.render());
    let turns = POOL_TURNS_PER_HOST as u64 * 2;
    assert_eq!(before.counts["pool_ordered_effects"], turns, "{:?}", before.counts);
    assert_eq!(before.counts["pool_handovers"], 1, "the conversation passed from host-a to host-b once");
    mutate(&c);
    let report = checker::check(&c.inputs(true)).unwrap();
    drop(rt);
    report
}

/// The pool fixture's ledger lines of `host`, in start order.
fn pool_lines_of(lines: &[EffectLine], host: &str) -> Vec<usize> {
    let mut idx: Vec<usize> =
        (0..lines.len()).filter(|&i| lines[i].conversation == POOL_CONVERSATION && lines[i].host == host).collect();
    idx.sort_by_key(|&i| lines[i].started_ns);
    assert_eq!(idx.len(), POOL_TURNS_PER_HOST, "{lines:?}");
    idx
}

#[test]
fn i18_a_pool_turn_claimed_by_a_host_removed_from_the_pool() {
    // The bug: the claim reads the host's pools outside its transaction, so a host removed
    // from the pool still takes its work.
    let report = with_pool_cluster(|c| {
        let conn = hub_rw(c);
        let first_claim: i64 = conn
            .query_row(
                "SELECT min(e.at) FROM delivery_events e JOIN deliveries d ON d.id = e.delivery_id
                 WHERE d.pool = ?1 AND e.to_state = 'claimed' AND e.actor = 'host-b'",
                [POOL],
                |r| r.get(0),
            )
            .unwrap();
        let subject = format!("pool {POOL} host host-b");
        conn.execute(
            "INSERT INTO operator_events (action, subject, operator, reason, at) VALUES
                 ('pool_remove', ?1, 'op', 'mutation', ?2),
                 ('pool_add', ?1, 'op', 'mutation', (SELECT max(at) + 1 FROM delivery_events))",
            rusqlite::params![subject, first_claim - 1],
        )
        .unwrap();
    });
    assert_only(&report, "I18");
    assert!(report.violations.iter().all(|v| v.message.contains("not a member")), "{}", report.render());
    assert_eq!(report.violations.len(), POOL_TURNS_PER_HOST, "each of host-b's claims:\n{}", report.render());
}

#[test]
fn i18_a_pool_run_executed_by_a_host_it_was_not_handed_to() {
    // The bug: a pool turn handed to one member runs on another (two members took one run).
    let report = with_pool_cluster(|c| {
        rewrite_ledger(c, |lines| {
            let i = pool_lines_of(lines, "host-a")[0];
            lines[i].host = "host-b".into();
        });
    });
    assert_only(&report, "I18");
    assert!(report.violations[0].message.contains("handed to host host-a"), "{}", report.render());
}

#[test]
fn i18_a_pool_conversation_out_of_seq_order_across_hosts() {
    // The bug: a later turn of a pool conversation is handed to a free member while an earlier
    // one still waits, so the next host runs it first.
    let report = with_pool_cluster(|c| {
        rewrite_ledger(c, |lines| {
            let (a, b) = (*pool_lines_of(lines, "host-a").last().unwrap(), pool_lines_of(lines, "host-b")[0]);
            let (x, y) = (lines[a].seq, lines[b].seq);
            lines[a].seq = y;
            lines[b].seq = x;
        });
    });
    assert_only(&report, "I18");
    assert!(
        report.violations.iter().any(|v| v.message.contains("started on host host-b after")),
        "{}",
        report.render()
    );
}

#[test]
fn i18_two_hosts_ran_turns_of_one_pool_conversation_at_once() {
    // The bug: the conversation is freed while its turn still runs (its flight ended early),
    // and another member starts the next turn beside it.
    let report = with_pool_cluster(|c| {
        rewrite_ledger(c, |lines| {
            let (a, b) = (*pool_lines_of(lines, "host-a").last().unwrap(), pool_lines_of(lines, "host-b")[0]);
            lines[a].ended_ns = Some(lines[b].started_ns.unwrap() + 1);
        });
    });
    assert_only(&report, "I18");
    assert!(report.violations[0].message.contains("on hosts host-a and host-b at once"), "{}", report.render());
}

/// Whether `sql` (one `?1` parameter) finds a row in the SQLite file `db`.
fn one_or_none(db: &std::path::Path, sql: &str, param: &str) -> bool {
    let conn = Connection::open(db).unwrap();
    conn.query_row(sql, [param], |_| Ok(())).is_ok()
}

// ---------------------------------------------------------------------------------------------
// The record in PostgreSQL, shared by two hubs

/// A clean run of two hubs sharing one PostgreSQL record (each key submitted through one hub and
/// retried through the other), checked clean; then `mutate` writes the bug's state into the
/// record by SQL and the checker runs again, in this process and as `baton-check
/// --database-url`. `None` when the test is skipped (no PostgreSQL).
fn with_postgres_cluster(test: &str, seed: u64, mutate: impl FnOnce(&dyn Db)) -> Option<(Report, Output)> {
    let pg = baton_testkit::pg::cluster_or_skip(test, false)?;
    let bins = Binaries::build().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let c = rt.block_on(clean_cluster_on_postgres(&bins, seed, &pg.url())).unwrap_or_else(|e| panic!("{e:#}"));
    let inputs = c.inputs(true);
    assert_eq!(inputs.hub, HubRecord::Postgres(pg.url()), "the checker reads the PostgreSQL record");
    let before = checker::check(&inputs).unwrap();
    assert!(before.violations.is_empty(), "the baseline run is not clean:\n{}", before.render());
    let conn = PgConn::connect(&PgUrl::parse(&pg.url()).unwrap()).unwrap();
    mutate(&conn);
    drop(conn);
    let report = checker::check(&inputs).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_baton-check"));
    cmd.arg("--database-url").arg(pg.url()).arg("--liveness");
    for node in &inputs.node_dbs {
        cmd.arg("--node-db").arg(node);
    }
    cmd.arg("--history").arg(&c.history).arg("--ledger").arg(&c.ledger);
    let out = cmd.output().unwrap();
    drop(rt);
    Some((report, out))
}

/// Asserts that `baton-check` exited with `code` (showing its output otherwise); its stdout.
fn assert_exit(out: &Output, code: i32) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(code), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn a_clean_run_of_two_hubs_on_postgres_has_no_violations() {
    let Some((report, out)) = with_postgres_cluster("clean_on_postgres", 31, |_| {}) else { return };
    assert!(report.violations.is_empty(), "{}", report.render());
    assert!(assert_exit(&out, 0).contains("violations: 0"));
    assert!(report.counts["messages"] >= 3 && report.counts["effects"] >= 3, "{:?}", report.counts);
    assert_eq!(report.counts["node_dbs"], 2, "{:?}", report.counts);
}

/// A mutation of the PostgreSQL record: `sql` must change exactly one row.
fn one_row(sql: &'static str) -> impl FnOnce(&dyn Db) {
    move |db| assert_eq!(db.execute(sql, []).unwrap(), 1, "the mutation changes one row: {sql}")
}

#[test]
fn i3_accept_with_routing_but_no_obligation_on_postgres() {
    let Some((report, out)) = with_postgres_cluster(
        "i3_on_postgres",
        32,
        one_row("INSERT INTO message_recipients (message_id, host) SELECT min(id), 'host-z' FROM messages"),
    ) else {
        return;
    };
    assert_only(&report, "I3");
    assert!(assert_exit(&out, 1).contains("\n[I3] "), "baton-check names the family too");
}

#[test]
fn i5_mirrored_by_an_instance_that_does_not_hold_the_claim_on_postgres() {
    let Some((report, _)) = with_postgres_cluster(
        "i5_on_postgres",
        33,
        one_row(
            "UPDATE delivery_events SET instance_id = 'stale-instance'
             WHERE id = (SELECT min(id) FROM delivery_events WHERE to_state = 'mirrored')",
        ),
    ) else {
        return;
    };
    assert_only(&report, "I5");
}

#[test]
fn i14_a_claim_recorded_as_made_by_an_operator_on_postgres() {
    let Some((report, _)) = with_postgres_cluster(
        "i14_on_postgres",
        34,
        one_row(
            "UPDATE delivery_events SET actor_kind = 'operator'
             WHERE id = (SELECT min(id) FROM delivery_events WHERE to_state = 'claimed')",
        ),
    ) else {
        return;
    };
    assert_only(&report, "I14");
}

#[test]
fn i19_a_progress_event_recorded_after_its_run_s_outcome_on_postgres() {
    let Some((report, out)) = with_postgres_cluster("i19_on_postgres", 35, |db| {
        assert_eq!(db.execute(PROGRESS_AFTER_OUTCOME, []).unwrap(), 1);
    }) else {
        return;
    };
    assert_only(&report, "I19");
    assert!(assert_exit(&out, 1).contains("\n[I19] "), "baton-check names the family too");
}
