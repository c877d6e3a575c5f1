//! The hub SIGKILLed and restarted (same address) while nodes run turns and reports are in
//! flight: nothing lost, nothing counted twice, order kept.

use crate::harness::Hub;
use crate::node_harness::{NODE_WAIT, wait_for};
use std::collections::HashMap;

#[test]
fn hub_killed_and_restarted_mid_flight_loses_nothing_and_counts_nothing_twice() {
    let mut hub = Hub::with_nodes(&["host-a", "host-b"]);
    // Turns of a second, ten a conversation. The second turn of conv-0 waits for a gate the test
    // opens once the hub is down, so a turn behind it is certainly delivered and waiting when
    // the hub is killed, however slow the machine (no race with the backlog running out).
    let gate = hub.scratch("gate").join("open");
    let then = format!(
        "if [ \"$BATON_CONVERSATION\" = conv-0 ] && [ \"$BATON_SEQ\" = 2 ]; then \
           while [ ! -e '{}' ]; do sleep 0.1; done; fi; sleep 1",
        gate.display()
    );
    let a = hub.node_process("host-a").then(&then).trace_ends().start();
    let b = hub.node_process("host-b").then(&then).trace_ends().start();
    let mut expected: HashMap<String, (String, String)> = HashMap::new();
    for i in 0..30 {
        let conversation = format!("conv-{}", i % 3);
        for (host, id) in hub.send(&conversation, &format!("k{i}"), &["host-a", "host-b"]) {
            expected.insert(id, (host, conversation.clone()));
        }
    }
    let total = expected.len();

    let done_count = |hub: &Hub| hub.deliveries().iter().filter(|d| !d["outcome"].is_null()).count();
    // Kill while a node holds a delivered turn that waits behind a running one of its
    // conversation (conv-0's third, behind the gated second), so there is a turn that can only
    // start while the hub is down.
    let waiting = wait_for("a delivered turn waiting behind the gated one", NODE_WAIT, || {
        [&a, &b].into_iter().find_map(|n| waiting_behind_gated(&n.status()))
    });
    let at_kill = done_count(&hub);
    hub.kill9();
    let started = |id: &str| hub.exec_log().lines().iter().any(|r| r.delivery_id == id);
    assert!(!started(&waiting), "the turn waiting behind the gated one did not start before the gate opened");
    std::fs::write(&gate, b"").expect("open the gate");
    // Turns already delivered go on running while the hub is down; their reports wait.
    wait_for("the waiting turn to run while the hub is down", NODE_WAIT, || started(&waiting).then_some(()));
    hub.restart();

    wait_for("every delivery to have an outcome", NODE_WAIT, || (done_count(&hub) == total).then_some(()));
    a.wait_idle();
    b.wait_idle();
    assert!(at_kill < total, "the kill happened mid-way ({at_kill} of {total} done)");
    for id in expected.keys() {
        hub.assert_one_attempt(id, "succeeded");
    }
    assert_eq!(hub.deliveries().len(), total);
    assert_eq!(hub.status_json()["attempts"], total, "every report counted exactly once");

    let ran = hub.exec_log().lines();
    assert_eq!(ran.len(), total, "one turn per delivery");
    for r in &ran {
        let (host, conversation) = expected.get(&r.delivery_id).expect("known delivery");
        assert_eq!((&r.host, &r.conversation), (host, conversation));
    }
    hub.exec_log().assert_one_at_a_time_in_order();
    assert!(
        a.logs().contains("hub unreachable") || b.logs().contains("hub unreachable"),
        "the nodes noticed the outage"
    );
    hub.verify_ok();
}

/// A delivery of conv-0 after its gated second turn, in a node's `status --json`, that is
/// delivered (acked) and not running while that second turn runs: it cannot start before the
/// gate opens.
fn waiting_behind_gated(status: &serde_json::Value) -> Option<String> {
    let running: Vec<&str> = status["running"].as_array()?.iter().filter_map(|v| v.as_str()).collect();
    let open = status["open"].as_array()?;
    let of_conv0 = |o: &&serde_json::Value| o["conversation"] == "conv-0";
    let gated_runs = open
        .iter()
        .filter(of_conv0)
        .any(|o| o["seq"].as_u64() == Some(2) && running.contains(&o["delivery_id"].as_str().unwrap_or_default()));
    if !gated_runs {
        return None;
    }
    open.iter()
        .filter(of_conv0)
        .find(|o| {
            o["state"] == "acked"
                && o["seq"].as_u64().is_some_and(|s| s > 2)
                && !running.contains(&o["delivery_id"].as_str().unwrap_or_default())
        })
        .and_then(|o| o["delivery_id"].as_str().map(str::to_string))
}

/// A turn that ends while the hub is down leaves its report in the outbox; the node stops
/// (SIGTERM, exit 0, the hub still down) and starts again later: the report is sent then,
/// once, and the turn is not run again.
#[test]
fn a_report_waiting_through_a_hub_outage_and_a_node_restart_counts_once() {
    let mut hub = Hub::with_nodes(&["host-a"]);
    let mut node = hub.node_process("host-a").then("sleep 1").start();
    let id = hub.send_one("conv", "k1", "host-a");
    hub.exec_log().wait_ran(&id);
    hub.kill9();
    wait_for("the turn to end and wait in the outbox", NODE_WAIT, || {
        let s = node.status();
        s["awaiting_report"].as_array().is_some_and(|a| a.len() == 1).then_some(())
    });
    let st = node.term();
    assert_eq!(st.code(), Some(0), "a stop with the hub down is still clean: {st}");
    assert_eq!(node.status()["awaiting_report"].as_array().map(Vec::len), Some(1), "the report waits on disk");
    assert!(hub.delivery(&id)["outcome"].is_null());

    hub.restart();
    node.restart();
    hub.wait_outcome(&id);
    node.wait_idle();
    hub.assert_one_attempt(&id, "succeeded");
    assert_eq!(hub.exec_log().runs_of(&id), 1, "reported, not run again");
    hub.verify_ok();
}
