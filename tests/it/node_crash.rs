//! `baton-node` aborted at each compiled-in crash point, then restarted on the same data
//! directory: the same delivery, never run twice, the honest outcome, one attempt. Also the
//! hub losing a claim's answer, and deliveries taken away from a node before its ack.

use crate::harness::Hub;
use crate::node_harness::{NODE_WAIT, process_gone, wait_for};

/// What a crash at one point must leave and lead to.
struct Case {
    /// The node crash point.
    point: &'static str,
    /// The hub's state of the delivery right after the crash.
    hub_state_at_crash: &'static str,
    /// Whether the hub already has the outcome right after the crash.
    outcome_at_crash: bool,
    /// The final outcome after the restart.
    outcome: &'static str,
    /// How many times the harness ran (in total, across both runs).
    runs: usize,
    /// Whether the node sends `mirrored` and `ack` as two requests (`handoff = "separate"`):
    /// the points between them are reached only then.
    separate: bool,
}

fn check(case: Case) {
    let Case { point, hub_state_at_crash, outcome_at_crash, outcome, runs, separate } = case;
    let hub = Hub::with_nodes(&["host-a"]);
    let mut node = hub.node_process("host-a").crash_point(point);
    if separate {
        node = node.set("handoff", "\"separate\"");
    }
    let mut node = node.start();
    let id = hub.send_one("conv", "k1", "host-a");
    node.wait_crash(point);

    let at_crash = hub.delivery(&id);
    assert_eq!(at_crash["state"], hub_state_at_crash, "{point}: the hub's record at the crash: {at_crash:#}");
    assert_eq!(!at_crash["outcome"].is_null(), outcome_at_crash, "{point}: outcome at the crash: {at_crash:#}");
    let instance = at_crash["instance_id"].as_str().expect("held by an instance").to_string();
    if point == "node.exec.during_effect" {
        // The harness was spawned before the abort; orphaned, it still runs to its end.
        hub.exec_log().wait_ran(&id);
    }

    node.restart();
    let shown = hub.wait_outcome(&id);
    let status = node.wait_idle();
    assert_eq!(status["instance_id"], instance.as_str(), "{point}: the restart is the same instance");
    hub.assert_one_attempt(&id, outcome);
    assert_eq!(shown["delivery"]["instance_id"], instance.as_str(), "{point}: the same instance holds it");
    assert_eq!(hub.entered(&id, "claimed"), 1, "{point}: claimed once, never requeued or taken again");
    assert_eq!(hub.entered(&id, "delivered"), 1, "{point}: delivered once");
    let all = hub.deliveries();
    assert_eq!(all.len(), 1, "{point}: one delivery: {all:#?}");
    assert_eq!(hub.exec_log().runs_of(&id), runs, "{point}: harness runs:\n{:#?}", hub.exec_log().lines());
    // A late duplicate report (after_response) must not add an attempt either.
    assert_eq!(hub.status_json()["attempts"], 1, "{point}: one attempt counted");
    if outcome == "unknown" {
        assert!(
            node.logs().contains("reporting it unknown, not running it again"),
            "{point}: the restart says why it does not run the turn again"
        );
    }
    hub.verify_ok();
}

#[test]
fn crash_after_the_claim_response_resumes_the_claim() {
    check(Case {
        point: "node.claim.after_response",
        hub_state_at_crash: "claimed",
        outcome_at_crash: false,
        outcome: "succeeded",
        runs: 1,
        separate: false,
    });
}

#[test]
fn crash_after_mirroring_resumes_with_mirrored() {
    check(Case {
        point: "node.mirror.after_commit",
        hub_state_at_crash: "claimed",
        outcome_at_crash: false,
        outcome: "succeeded",
        runs: 1,
        separate: false,
    });
}

#[test]
fn crash_after_mirrored_resumes_with_the_ack() {
    check(Case {
        point: "node.mirrored.after_response",
        hub_state_at_crash: "mirrored",
        outcome_at_crash: false,
        outcome: "succeeded",
        runs: 1,
        separate: true,
    });
}

#[test]
fn crash_after_the_ack_runs_the_turn_once() {
    check(Case {
        point: "node.ack.after_response",
        hub_state_at_crash: "delivered",
        outcome_at_crash: false,
        outcome: "succeeded",
        runs: 1,
        separate: true,
    });
}

#[test]
fn crash_after_the_handoff_runs_the_turn_once() {
    check(Case {
        point: "node.handoff.after_response",
        hub_state_at_crash: "delivered",
        outcome_at_crash: false,
        outcome: "succeeded",
        runs: 1,
        separate: false,
    });
}

#[test]
fn crash_after_the_start_marker_reports_unknown_and_never_runs() {
    check(Case {
        point: "node.exec.after_start_marker",
        hub_state_at_crash: "delivered",
        outcome_at_crash: false,
        outcome: "unknown",
        runs: 0,
        separate: false,
    });
}

#[test]
fn crash_during_execution_reports_unknown_and_does_not_run_again() {
    check(Case {
        point: "node.exec.during_effect",
        hub_state_at_crash: "delivered",
        outcome_at_crash: false,
        outcome: "unknown",
        runs: 1,
        separate: false,
    });
}

#[test]
fn crash_after_the_end_marker_reports_the_recorded_outcome() {
    check(Case {
        point: "node.exec.after_end_marker",
        hub_state_at_crash: "delivered",
        outcome_at_crash: false,
        outcome: "succeeded",
        runs: 1,
        separate: false,
    });
}

#[test]
fn crash_after_the_report_response_does_not_count_twice() {
    check(Case {
        point: "node.report.after_response",
        hub_state_at_crash: "delivered",
        outcome_at_crash: true,
        outcome: "succeeded",
        runs: 1,
        separate: false,
    });
}

/// The hub commits a claim and dies before answering: the node, seeing the answer lost,
/// resyncs its holdings once the hub is back, finds the claim and completes it.
#[test]
fn a_claim_answer_lost_in_transit_is_found_through_holdings() {
    let mut hub = Hub::builder().nodes(&["host-a"]).producers(&["prod"]).crash_point("hub.claim.after_commit").start();
    let node = hub.node_process("host-a").start();
    // Let the node's first claim settle into its long poll, so the send wakes it.
    node.wait_log("holdings resync");
    let id = hub.send_one("conv", "k1", "host-a");
    let st = hub.wait_exit(NODE_WAIT).expect("the hub reached hub.claim.after_commit");
    assert!(!st.success(), "the hub aborted at hub.claim.after_commit: {st}");
    assert!(hub.serve_logs().contains("crash point hub.claim.after_commit reached"));
    assert_eq!(hub.delivery(&id)["state"], "claimed", "the claim committed before the answer was lost");
    // The node sees its claim fail with the hub gone, before the hub is back.
    node.wait_log("the claim's answer was lost");
    hub.restart();

    hub.wait_outcome(&id);
    node.wait_idle();
    assert!(node.log().contains("the claim's answer was lost"), "the node knew the answer was lost");
    hub.assert_one_attempt(&id, "succeeded");
    assert_eq!(hub.entered(&id, "claimed"), 1, "the lost claim was resumed, not claimed again");
    assert_eq!(hub.exec_log().runs_of(&id), 1);
    hub.verify_ok();
}

/// A delivery mirrored locally but cancelled at the hub before the node acked it: after the
/// restart the node drops its copy and never runs it.
#[test]
fn a_delivery_cancelled_before_the_ack_is_dropped_and_never_runs() {
    let hub = Hub::with_nodes(&["host-a"]);
    let mut node = hub.node_process("host-a").crash_point("node.mirror.after_commit").start();
    let id = hub.send_one("conv", "k1", "host-a");
    node.wait_crash("node.mirror.after_commit");
    let before = node.status();
    assert!(before["open"].to_string().contains(&id), "mirrored locally before the crash: {before}");

    hub.cli_ok(["deliveries", "cancel", &id, "--reason", "test cancels it"]);
    assert_eq!(hub.delivery(&id)["state"], "failed");
    node.restart();
    node.wait_log("dropping the local copy");
    // And the node goes on working: a later delivery runs.
    let later = hub.send_one("conv", "k2", "host-a");
    hub.wait_outcome(&later);
    let status = node.wait_idle();

    assert!(!status.to_string().contains(&id), "the dropped delivery is not held locally: {status}");
    assert_eq!(hub.exec_log().runs_of(&id), 0, "a cancelled delivery never runs");
    assert_eq!(hub.exec_log().runs_of(&later), 1);
    let shown = hub.show(&id);
    assert_eq!(shown["delivery"]["state"], "failed");
    assert!(shown["attempts"].as_array().expect("attempts").is_empty(), "no attempt for it: {shown:#}");
    hub.verify_ok();
}

/// The hub dies right after committing `mirrored` (the node sends `mirrored` and `ack` apart);
/// an operator cancels the delivery while it is down. When the hub returns, the node's retried
/// handoff is refused: it drops its local copy, says so, and nothing runs. The node keeps
/// running throughout.
#[test]
fn a_refused_handoff_drops_the_local_copy() {
    let mut hub =
        Hub::builder().nodes(&["host-a"]).producers(&["prod"]).crash_point("hub.mirrored.after_commit").start();
    let node = hub.node_process("host-a").set("handoff", "\"separate\"").start();
    node.wait_log("holdings resync");
    let id = hub.send_one("conv", "k1", "host-a");
    let st = hub.wait_exit(NODE_WAIT).expect("the hub reached hub.mirrored.after_commit");
    assert!(!st.success(), "the hub aborted at hub.mirrored.after_commit: {st}");
    assert_eq!(hub.delivery(&id)["state"], "mirrored");
    hub.cli_ok(["deliveries", "cancel", &id, "--reason", "cancelled while the hub was down"]);
    hub.restart();

    // Dropped because the hub refused the retried step, not by a resync.
    node.wait_log("the hub refused mirrored");
    node.wait_log("dropping the local copy");
    let later = hub.send_one("conv", "k2", "host-a");
    hub.wait_outcome(&later);
    let status = node.wait_idle();
    assert!(!status.to_string().contains(&id), "not held locally: {status}");
    assert_eq!(hub.exec_log().runs_of(&id), 0, "refused, so never run");
    assert_eq!(hub.state(&id), "failed");
    assert!(hub.attempts(&id).is_empty());
    hub.verify_ok();
}

/// Harness processes a crashed node left behind are the test's to reap; this checks the
/// fixture itself does it (a leaked `sleep` would outlive the suite).
#[test]
fn harness_groups_left_by_a_crashed_node_are_reaped() {
    let hub = Hub::with_nodes(&["host-a"]);
    let pidfile = hub.scratch("pids").join("sleep.pid");
    let mut node = hub
        .node_process("host-a")
        .then(&format!("sleep 60 & echo $! > '{}'; wait", pidfile.display()))
        .crash_point("node.exec.during_effect")
        .start();
    let id = hub.send_one("conv", "k1", "host-a");
    node.wait_crash("node.exec.during_effect");
    hub.exec_log().wait_ran(&id);
    let pid: u32 = wait_for("the harness to start its sleep", NODE_WAIT, || {
        std::fs::read_to_string(&pidfile).ok().and_then(|t| t.trim().parse().ok())
    });
    assert!(!process_gone(pid), "the orphaned harness still runs after the node died");
    drop(node);
    wait_for("the orphaned harness group to be killed", NODE_WAIT, || process_gone(pid).then_some(()));
}

/// Four deliveries claimed and mirrored (crash after the mirror commit), then a crash in the
/// middle of the restart's holdings resync (some resumed, maybe running), then a clean start:
/// each delivery ends with one attempt, none ran twice, and only a turn that really started
/// may be `unknown`.
#[test]
fn crash_in_the_middle_of_the_holdings_resync() {
    let hub = Hub::with_nodes(&["host-a"]);
    let ids: Vec<String> = (0..4).map(|i| hub.send_one(&format!("conv-{i}"), &format!("k{i}"), "host-a")).collect();
    let mut node = hub.node_process("host-a").crash_point("node.mirror.after_commit").start();
    node.wait_crash("node.mirror.after_commit");
    for id in &ids {
        assert_eq!(hub.state(id), "claimed", "one batch claimed all four");
    }
    node.restart_with("node.resync.mid");
    node.wait_crash("node.resync.mid");
    node.restart();
    for id in &ids {
        hub.wait_outcome(id);
    }
    node.wait_idle();
    for id in &ids {
        let attempts = hub.attempts(id);
        assert_eq!(attempts.len(), 1, "{id}: one attempt: {attempts:#?}");
        let runs = hub.exec_log().runs_of(id);
        match attempts[0]["outcome"].as_str() {
            Some("succeeded") => assert_eq!(runs, 1, "{id} succeeded, so it ran once"),
            Some("unknown") => assert!(runs <= 1, "{id} ran {runs} times"),
            other => panic!("{id}: unexpected outcome {other:?}"),
        }
        assert_eq!(hub.entered(id, "claimed"), 1, "{id}: claimed once");
    }
    hub.verify_ok();
}

/// A node holding more than one page of holdings (`limits.holdings_page_max = 2`, five held)
/// resumes every one after a crash: it follows `next_cursor` to the last page, so none of its
/// unacked local copies looks dropped by the hub, and each runs exactly once.
#[test]
fn a_node_holding_more_than_one_page_resumes_them_all() {
    let hub =
        Hub::builder().nodes(&["host-a"]).producers(&["prod"]).config("[limits]\nholdings_page_max = 2\n").start();
    let ids: Vec<String> = (0..5).map(|i| hub.send_one(&format!("conv-{i}"), &format!("k{i}"), "host-a")).collect();
    let mut node = hub.node_process("host-a").crash_point("node.mirror.after_commit").start();
    node.wait_crash("node.mirror.after_commit");
    for id in &ids {
        assert_eq!(hub.state(id), "claimed", "one batch claimed all five");
    }
    node.restart();
    for id in &ids {
        hub.wait_outcome(id);
    }
    node.wait_idle();
    for id in &ids {
        hub.assert_one_attempt(id, "succeeded");
        assert_eq!(hub.exec_log().runs_of(id), 1, "{id} ran once");
        assert_eq!(hub.entered(id, "claimed"), 1, "{id}: claimed once, never requeued");
    }
    assert!(node.log().contains("holdings resync") && !node.log().contains("no longer lists"), "{}", node.log());
    hub.verify_ok();
}

/// The operator requeues the claims of an instance that crashed after mirroring (it looked
/// gone for good), and then the instance comes back: it drops its stale local copy, claims the
/// delivery again with a fresh token, and runs it once.
#[test]
fn a_requeued_claim_is_claimed_again_by_the_returning_instance_and_runs_once() {
    let hub = Hub::with_nodes(&["host-a"]);
    let mut node = hub.node_process("host-a").crash_point("node.mirror.after_commit").start();
    let id = hub.send_one("conv", "k1", "host-a");
    node.wait_crash("node.mirror.after_commit");
    let instance = hub.delivery(&id)["instance_id"].as_str().expect("claimed by the instance").to_string();
    hub.cli_ok(["requeue", "--instance", &instance, "--reason", "looked gone"]);
    assert_eq!(hub.state(&id), "queued");

    node.restart();
    hub.wait_outcome(&id);
    node.wait_idle();
    hub.assert_one_attempt(&id, "succeeded");
    assert_eq!(hub.entered(&id, "claimed"), 2, "claimed, requeued, claimed again");
    assert_eq!(hub.delivery(&id)["instance_id"], instance.as_str());
    assert_eq!(hub.exec_log().runs_of(&id), 1);
    hub.verify_ok();
}
