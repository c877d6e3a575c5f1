//! The executor through the real node: the timeout kills the harness's whole process group;
//! SIGTERM drains running turns within the grace period and kills them after it.

use crate::harness::Hub;
use crate::node_harness::{NODE_WAIT, process_gone, wait_for};
use baton_testkit::Signal;
use std::fs;

/// A harness that leaves a background child and waits for it runs past `exec_timeout`: the
/// attempt fails with reason `timeout`, and the background child dies with its group.
#[test]
fn timeout_kills_the_whole_process_group() {
    let hub = Hub::with_nodes(&["host-a"]);
    let pidfile = hub.scratch("pids").join("child.pid");
    let _node = hub
        .node_process("host-a")
        .then(&format!("sleep 60 & echo $! > '{}'; wait", pidfile.display()))
        .set("exec_timeout", "\"1s\"")
        .start();
    let id = hub.send_one("conv", "k1", "host-a");
    hub.wait_outcome(&id);
    let attempt = hub.assert_one_attempt(&id, "failed");
    let reason = attempt["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("timeout"), "the reason names the timeout: {attempt:#}");
    let pid: u32 = fs::read_to_string(&pidfile).expect("pid file").trim().parse().expect("pid");
    wait_for(&format!("background child {pid} to be killed with its group"), NODE_WAIT, || {
        process_gone(pid).then_some(())
    });
    assert_eq!(hub.exec_log().runs_of(&id), 1);
}

/// SIGTERM (and SIGINT, the same) while a 1 s turn runs (grace 10 s): `status` shows it
/// running; the turn finishes, and its report is sent before the node exits 0.
#[test]
fn sigterm_lets_a_running_turn_finish_within_the_grace() {
    check_drain(Signal::SIGTERM);
}

#[test]
fn sigint_drains_like_sigterm() {
    check_drain(Signal::SIGINT);
}

fn check_drain(sig: Signal) {
    let hub = Hub::with_nodes(&["host-a"]);
    let mut node = hub.node_process("host-a").then("sleep 1").set("shutdown_grace", "\"10s\"").start();
    let id = hub.send_one("conv", "k1", "host-a");
    hub.exec_log().wait_ran(&id);
    let running = node.status();
    assert_eq!(running["running"], serde_json::json!([id]), "status shows the running turn: {running}");
    let st = node.signal(sig);
    assert_eq!(st.code(), Some(0), "a drained shutdown on {sig} exits 0: {st}");
    // Reported before the exit: nothing is left for a later start.
    let attempt = hub.assert_one_attempt(&id, "succeeded");
    assert_eq!(attempt["exit_code"], 0);
    assert!(attempt["result"].as_str().is_some_and(|r| r.contains(&format!("ran {id}"))), "{attempt:#}");
    let s = node.status();
    assert!(s["awaiting_report"].as_array().is_some_and(Vec::is_empty), "{s}");
    assert!(s["running"].as_array().is_some_and(Vec::is_empty), "{s}");
}

/// SIGTERM while a 300 s turn runs (grace 1 s; longer than the test waits for the exit): the
/// turn's group is killed, the attempt is
/// reported `failed` with reason `shutdown`, and the node exits 0.
#[test]
fn sigterm_kills_a_turn_that_outlives_the_grace() {
    let hub = Hub::with_nodes(&["host-a"]);
    let pidfile = hub.scratch("pids").join("turn.pid");
    let mut node = hub
        .node_process("host-a")
        .then(&format!("echo $$ > '{}'; sleep 300", pidfile.display()))
        .set("shutdown_grace", "\"1s\"")
        .start();
    let id = hub.send_one("conv", "k1", "host-a");
    let pid: u32 = wait_for("the turn to start", NODE_WAIT, || {
        fs::read_to_string(&pidfile).ok().and_then(|t| t.trim().parse().ok())
    });
    let st = node.term();
    assert_eq!(st.code(), Some(0), "shutdown after the grace still exits 0: {st}");
    let attempt = hub.assert_one_attempt(&id, "failed");
    let reason = attempt["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("shutdown"), "the reason names the shutdown: {attempt:#}");
    wait_for(&format!("harness {pid} to be killed"), NODE_WAIT, || process_gone(pid).then_some(()));
    assert_eq!(hub.exec_log().runs_of(&id), 1);
}

/// With JSON logs, the "turn ended" line carries its fields typed: the exit status and the
/// duration as numbers, the reason as a string (never `"Some(…)"`).
#[test]
fn json_logs_carry_typed_turn_fields() {
    let hub = Hub::with_nodes(&["host-a"]);
    let node = hub.node_process("host-a").then("exit 3").set("log_format", "\"json\"").start();
    let id = hub.send_one("conv", "k1", "host-a");
    hub.wait_outcome(&id);
    let line = wait_for("the turn-ended log line", NODE_WAIT, || {
        node.log().lines().find(|l| l.contains("turn ended")).map(str::to_string)
    });
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let fields = &v["fields"];
    assert_eq!(fields["exit_code"], 3, "{line}");
    assert!(fields["duration_ms"].is_u64(), "{line}");
    assert_eq!(fields["reason"], "exited with status 3", "{line}");
    assert!(!line.contains("Some("), "{line}");
}
