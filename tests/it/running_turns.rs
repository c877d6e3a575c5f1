//! Running turns are visible, end to end: a real node renews its running turn with the hub, the
//! operator sees it (`deliveries list --running`, `deliveries explain`) with its host, how long
//! it has run and its last progress; a node SIGKILLed mid-turn leaves its turn running on a
//! silent host, handed to no other host, until the operator retires the host, which records it
//! `unknown`.

use crate::harness::Hub;
use crate::node_harness::{NODE_WAIT, long_turn, wait_for, wait_started};
use baton_testkit::Signal;
use serde_json::Value;

/// `deliveries list --running --json`.
fn running(hub: &Hub) -> Vec<Value> {
    hub.cli_json(["deliveries", "list", "--running", "--json"]).as_array().expect("an array").clone()
}

#[test]
fn a_node_killed_mid_turn_leaves_it_running_on_a_silent_host_until_retire_records_it_unknown() {
    // The shortest silence the hub takes (at least the long poll plus the contact flush).
    let hub = Hub::builder()
        .nodes(&["host-a", "host-b"])
        .producers(&["prod"])
        .config("host_silence_warn = \"10s\"\n[limits]\nlong_poll_wait_max = \"2s\"\n")
        .start();
    let signals = hub.scratch("turn").join("signals");
    let harness = format!("echo '{{\"step\":\"thinking\"}}' >&$BATON_PROGRESS_FD\n{}", long_turn(&signals, ":"));
    let mut node = hub
        .node_process("host-a")
        .then(&harness)
        .set("renew_interval", "\"200ms\"")
        .set("progress_flush_interval", "\"20ms\"")
        .set("claim_wait", "\"2s\"")
        .start();
    let _other = hub.node_process("host-b").start();
    let id = hub.send_one("c", "k1", "host-a");
    let pid = wait_started(&signals);

    // Running, renewed, with its progress; the host is heard from.
    let row = wait_for("the turn listed as running with its progress", NODE_WAIT, || {
        running(&hub).into_iter().find(|r| r["delivery_id"] == id.as_str() && r["progress"]["events"] == 1)
    });
    assert_eq!((row["host"].as_str(), row["host_silent"].as_bool()), (Some("host-a"), Some(false)), "{row}");
    assert_eq!(row["progress"]["last"]["step"], "thinking", "{row}");
    let text = hub.cli_ok(["deliveries", "list", "--running"]);
    assert!(text.contains(&id) && text.contains("1 event(s), 0 dropped"), "{text}");
    let why = hub.cli_json(["deliveries", "explain", &id, "--json"]);
    assert_eq!(why["reason_code"], "running", "{why}");
    assert_eq!(why["run"]["progress"]["events"], 1, "{why}");
    assert!(why["reason"].as_str().unwrap().contains("last progress #1 of 1"), "{why}");

    // The node dies mid-turn: the turn stays running, on a host shown silent, and nothing of it
    // goes to another host.
    node.signal(Signal::SIGKILL);
    let row = wait_for("the host shown silent with its running turn", NODE_WAIT, || {
        running(&hub).into_iter().find(|r| r["delivery_id"] == id.as_str() && r["host_silent"] == true)
    });
    assert_eq!(row["host"], "host-a");
    assert!(hub.cli_ok(["deliveries", "list", "--running"]).contains("SILENT"));
    let why = hub.cli_json(["deliveries", "explain", &id, "--json"]);
    assert_eq!(why["reason_code"], "running", "{why}");
    assert!(why["reason"].as_str().unwrap().contains("silent"), "{why}");
    let status = hub.status_json();
    assert!(status.to_string().contains("host_silent"), "{status}");
    assert_eq!(hub.state(&id), "delivered", "not handed to another host");
    assert_eq!(hub.attempts(&id).len(), 0, "no outcome invented");

    // The operator acts: retire records the run unknown, and it is no longer running.
    hub.cli_ok(["retire", "host-a", "--reason", "the machine is gone", "--yes"]);
    let attempt = hub.assert_one_attempt(&id, "unknown");
    assert!(attempt["reason"].as_str().is_some_and(|r| r.contains("retire")), "{attempt}");
    assert!(running(&hub).is_empty());
    // The orphaned harness would tick on for a minute: stop its group.
    let _ = baton_testkit::proc::signal_group(pid, Signal::SIGKILL);
    hub.verify_ok();
}
