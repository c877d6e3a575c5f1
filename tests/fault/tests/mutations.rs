//! Mutation proof: a checker that never fails proves nothing. Each test runs a small real
//! scenario (hub + two nodes, real processes, no crash), then injects the state a specific bug
//! would leave, and asserts the checker reports exactly that invariant family. One clean run
//! must report nothing.

use baton_fault::checker::{self, Report};
use baton_fault::cluster::Cluster;
use baton_fault::matrix::clean_cluster;
use baton_fault::records::{EffectLine, HistoryLine, LineWriter, read_lines};
use baton_testkit::Binaries;
use rusqlite::Connection;
use std::collections::BTreeSet;

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
fn i3_accept_without_obligation_is_not_atomic() {
    let report = with_cluster(14, |c| {
        let conn = hub_rw(c);
        conn.execute("DELETE FROM fanout_obligations WHERE rowid = (SELECT min(rowid) FROM fanout_obligations)", [])
            .unwrap();
    });
    assert_only(&report, "I3");
}

#[test]
fn i4_fan_out_done_with_a_recipient_missing() {
    let report = with_cluster(15, |c| {
        let conn = hub_rw(c);
        let mid = one(&conn, "SELECT id FROM messages LIMIT 1");
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
fn i7_a_second_execution_of_one_delivery() {
    let report = with_cluster(18, |c| {
        let mut e: EffectLine = read_lines::<EffectLine>(&c.ledger).unwrap().items.remove(0);
        e.nonce = "second-run".into();
        LineWriter::append(&c.ledger).unwrap().write(&e).unwrap();
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
        conn.execute(
            "UPDATE fanout_obligations SET done_at = NULL WHERE rowid = (SELECT min(rowid) FROM fanout_obligations)",
            [],
        )
        .unwrap();
    });
    assert_only(&report, "I10");
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

#[test]
fn i15_an_operator_rerun_marked_in_the_record_is_exempt() {
    let report = with_cluster(27, |c| {
        rewrite_ledger(c, |lines| {
            let (i, j) = two_turns_of_one_conversation(lines);
            let (a, b) = (lines[i].seq, lines[j].seq);
            lines[i].seq = b;
            lines[j].seq = a;
            lines[i].rerun = Some("redrive".into());
        });
    });
    assert!(report.violations.is_empty(), "{}", report.render());
}
