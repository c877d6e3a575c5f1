//! Turn control on the node: no orphaned harness after a crash (the next start stops what is
//! left of the recorded process group before it reports the turn `unknown`), SIGTERM before
//! SIGKILL at a timeout, a node that knows when the hub refused it for good, certificate renewal
//! on SIGHUP, and the store's size in `status` (local retention itself is tested on the injected
//! clock, in the node's own tests).
//!
//! Nodes here are the kit's `Node` wrapped in `TurnNode`, which can be SIGKILLed, started again
//! and sent SIGHUP separately. Each harness writes its pid (= its process group id) to a file
//! first, so what a killed node leaves behind is reaped when the test ends.

use crate::harness::{Hub, bins};
use crate::node_harness::{NODE_WAIT, lines, long_turn, process_gone, wait_for, wait_started};
use baton_testkit::{Harness, NodeConfig, Signal};
use serde_json::Value;
use std::fs;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// One `baton-node` whose harness runs `sh -c SCRIPT` after recording its process group.
struct TurnNode {
    node: baton_testkit::Node,
    /// Every harness process group this node started, one per line.
    groups: PathBuf,
}

impl TurnNode {
    /// Writes the config (host `host`, data directory `SCRATCH/NAME/data`) and starts the node.
    fn start(hub: &Hub, host: &str, name: &str, script: &str, settings: &[(&str, &str)]) -> TurnNode {
        let mut n = TurnNode::new(hub, host, name, script, settings);
        n.start_again(None);
        n
    }

    /// Writes the config; nothing runs yet.
    fn new(hub: &Hub, host: &str, name: &str, script: &str, settings: &[(&str, &str)]) -> TurnNode {
        let dir = hub.scratch(name);
        let groups = dir.join("harness.groups");
        let harness = format!("echo $$ >> '{}'\n{script}", groups.display());
        let argv = vec!["sh".to_string(), "-c".to_string(), harness];
        let mut config = NodeConfig::new(&hub.url(), hub.identity(host), &dir.join("data"), Harness::Command(argv))
            .set("claim_wait", "\"5s\"")
            .set("backoff_max", "\"500ms\"");
        for (k, v) in settings {
            config = config.set(k, v);
        }
        let node = baton_testkit::Node::create(bins(), &dir, name, &config).unwrap_or_else(|e| panic!("{e:#}"));
        TurnNode { node, groups }
    }

    /// Starts the same instance (same data directory) again.
    fn start_again(&mut self, crash_point: Option<&str>) {
        self.node.start(crash_point).unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// SIGKILL, and reaps the node (not its harness, which lives on in its own group).
    fn kill9(&mut self) {
        self.node.proc_mut().kill().expect("kill baton-node");
    }

    /// Sends `sig` without waiting for anything.
    fn signal(&self, sig: Signal) {
        self.node.proc().signal(sig).unwrap_or_else(|e| panic!("{e:#}"));
    }

    fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        self.node.proc_mut().wait_exit(limit).expect("wait for baton-node")
    }

    fn running(&mut self) -> bool {
        self.node.proc_mut().running()
    }

    /// The log of every run so far.
    fn logs(&self) -> String {
        self.node.proc().stderr_all()
    }

    #[track_caller]
    fn wait_log(&self, text: &str) {
        wait_for(&format!("baton-node to log {text:?}"), NODE_WAIT, || self.logs().contains(text).then_some(()))
    }

    /// `baton-node status --json`, asserting exit 0.
    #[track_caller]
    fn status(&self) -> Value {
        let out = self.node.status(true).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(out.status.success(), "status exited {}: {}", out.status, String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("status --json is JSON")
    }

    /// The process group of the harness this node started first, once it has started.
    #[track_caller]
    fn first_group(&self) -> u32 {
        wait_for("the harness to start", NODE_WAIT, || {
            fs::read_to_string(&self.groups).ok()?.lines().next()?.trim().parse().ok()
        })
    }
}

impl Drop for TurnNode {
    fn drop(&mut self) {
        let _ = self.node.proc_mut().kill();
        let marker = self.groups.display().to_string();
        for pgid in fs::read_to_string(&self.groups).unwrap_or_default().lines().filter_map(|l| l.parse().ok()) {
            // Only a group that still is one of ours (its leader's command line names our file).
            let ours = fs::read(format!("/proc/{pgid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker.as_str()));
            if ours {
                let _ = baton_testkit::proc::signal_group(pgid, Signal::SIGKILL);
            }
        }
    }
}

/// The attempt's reason, from `deliveries show`.
fn attempt_reason(attempt: &Value) -> String {
    attempt["reason"].as_str().unwrap_or_default().to_string()
}

/// The node is SIGKILLed during a long turn; its harness lives on, orphaned. The restarted node
/// stops it (SIGTERM, which the harness records and exits on) before it reports the turn
/// `unknown`, and never runs it again.
#[test]
fn a_harness_orphaned_by_sigkill_is_stopped_at_the_restart_before_the_turn_is_reported_unknown() {
    let hub = Hub::with_nodes(&["host-a"]);
    let signals = hub.scratch("turn").join("signals");
    let mut node =
        TurnNode::start(&hub, "host-a", "node-a", &long_turn(&signals, "exit 143"), &[("kill_grace", "\"30s\"")]);
    let id = hub.send_one("conv", "k1", "host-a");
    wait_started(&signals);
    let pgid = node.first_group();

    node.kill9();
    // Orphaned, the harness goes on: it still ticks after the node is gone.
    let ticks = lines(&signals).len();
    wait_for("the orphaned harness to keep running", NODE_WAIT, || (lines(&signals).len() > ticks).then_some(()));
    assert!(!process_gone(pgid), "the harness outlived the node");
    assert!(!lines(&signals).contains(&"TERM".to_string()), "nothing signalled it yet");

    node.start_again(None);
    let shown = hub.wait_outcome(&id);
    assert!(process_gone(pgid), "the orphan is gone by the time the turn is reported: {shown:#}");
    assert!(lines(&signals).contains(&"TERM".to_string()), "the restarted node sent SIGTERM: {shown:#}");
    let attempt = hub.assert_one_attempt(&id, "unknown");
    let reason = attempt_reason(&attempt);
    assert!(reason.starts_with("node restarted during execution"), "{reason}");
    assert!(reason.contains(&format!("harness process group {pgid} ended on SIGTERM")), "{reason}");
    assert_eq!(lines(&signals).iter().filter(|l| *l == "started").count(), 1, "never run again");
    node.wait_log("reporting it unknown, not running it again");
    hub.verify_ok();
}

/// The same with a harness that ignores SIGTERM: after `kill_grace` the restarted node sends
/// SIGKILL, and says so in the report.
#[test]
fn an_orphan_that_ignores_sigterm_is_killed_after_kill_grace() {
    let hub = Hub::with_nodes(&["host-a"]);
    let signals = hub.scratch("turn").join("signals");
    let mut node = TurnNode::start(&hub, "host-a", "node-a", &long_turn(&signals, ":"), &[("kill_grace", "\"2s\"")]);
    let id = hub.send_one("conv", "k1", "host-a");
    wait_started(&signals);
    let pgid = node.first_group();
    node.kill9();
    node.start_again(None);
    hub.wait_outcome(&id);
    assert!(process_gone(pgid), "SIGKILL took it down");
    let after_term = lines(&signals).into_iter().skip_while(|l| l != "TERM").collect::<Vec<_>>();
    assert!(after_term.iter().any(|l| l == "tick"), "it ran on after SIGTERM, until SIGKILL: {after_term:?}");
    let reason = attempt_reason(&hub.assert_one_attempt(&id, "unknown"));
    assert!(reason.contains("was killed with SIGKILL after kill_grace (2s)"), "{reason}");
}

/// A turn past `exec_timeout` gets SIGTERM first (recorded; it ignores it and goes on), and
/// SIGKILL only after `kill_grace`; the attempt fails with a reason that says both.
#[test]
fn a_timeout_sends_sigterm_first_and_sigkill_only_after_kill_grace() {
    let hub = Hub::with_nodes(&["host-a"]);
    let signals = hub.scratch("turn").join("signals");
    let node = TurnNode::start(
        &hub,
        "host-a",
        "node-a",
        &long_turn(&signals, ":"),
        &[("exec_timeout", "\"1s\""), ("kill_grace", "\"3s\"")],
    );
    let id = hub.send_one("conv", "k1", "host-a");
    hub.wait_outcome(&id);
    let pgid = node.first_group();
    let attempt = hub.assert_one_attempt(&id, "failed");
    let reason = attempt_reason(&attempt);
    assert!(reason.starts_with("timeout: ran past exec_timeout (1s)"), "{reason}");
    assert!(reason.ends_with("killed with SIGKILL after kill_grace (3s)"), "{reason}");
    let log = lines(&signals);
    let term = log.iter().position(|l| l == "TERM").expect("the harness got SIGTERM");
    assert!(log[term..].iter().any(|l| l == "tick"), "SIGKILL did not come with SIGTERM: {log:?}");
    assert!(process_gone(pgid));
}

/// The window around the start marker. A crash after the harness process is spawned at the gate
/// but before the start marker (written with its process group) leaves no marker, and the gate,
/// never released, exits without running anything; the hub, though, recorded the start for the
/// crashed process's session, and from the hub's side that is indistinguishable from a copy of
/// the data directory that started it: the restart reports the turn `unknown` (saying the node
/// stopped between the hub's start record and the harness start), never running it. A crash
/// right after the marker leaves a recorded group that never ran: the restart finds it (ended,
/// or stops it) and reports the turn `unknown`, never running it.
#[test]
fn a_crash_around_the_start_marker_never_runs_a_harness_twice() {
    for (point, outcome, runs) in
        [("node.exec.after_spawn", "unknown", 0), ("node.exec.after_start_marker", "unknown", 0)]
    {
        let hub = Hub::with_nodes(&["host-a"]);
        let ran = hub.scratch("turn").join("ran");
        let mut node = TurnNode::new(&hub, "host-a", "node-a", &format!("echo ran >> '{}'", ran.display()), &[]);
        node.start_again(Some(point));
        let id = hub.send_one("conv", "k1", "host-a");
        let status = node.wait_exit(NODE_WAIT).unwrap_or_else(|| panic!("{point} was not reached"));
        assert!(!status.success(), "{point}: aborted, {status}");
        assert!(!ran.exists(), "{point}: the harness ran although it was never released");
        node.start_again(None);
        hub.wait_outcome(&id);
        let reason = attempt_reason(&hub.assert_one_attempt(&id, outcome));
        if point == "node.exec.after_start_marker" {
            assert!(reason.starts_with("node restarted during execution"), "{point}: {reason}");
            assert!(reason.contains("harness process group"), "{point}: the group was recorded: {reason}");
        } else {
            assert_eq!(reason, "the node stopped between the hub's start record and the harness start", "{point}");
        }
        assert_eq!(lines(&ran).len(), runs, "{point}: harness runs");
        assert!(node.running(), "{point}");
    }
}

/// The serials of the certificates issued to `name`, oldest first, from the hub's record.
fn serials(hub: &Hub, name: &str) -> Vec<String> {
    let conn = rusqlite::Connection::open_with_flags(
        hub.data_dir().join("hub.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open hub.db read-only");
    let mut st = conn.prepare("SELECT serial FROM certificates WHERE name = ?1 ORDER BY rowid").expect("prepare");
    st.query_map([name], |r| r.get(0)).expect("query").collect::<Result<_, _>>().expect("serials")
}

/// The operator revokes the node's certificate while it runs: the node stops claiming, logs one
/// clear error, and exits with status 5 within a bounded time instead of retrying forever. A
/// start with the same certificate ends the same way.
#[test]
fn a_node_whose_certificate_is_revoked_exits_with_status_5() {
    let hub = Hub::with_nodes(&["host-a"]);
    let mut node = TurnNode::start(&hub, "host-a", "node-a", "cat", &[]);
    let before = hub.send_one("conv", "k1", "host-a");
    hub.wait_outcome(&before);
    hub.cli_ok(["revoke", "host-a", "--reason", "host decommissioned", "--yes"]);

    let status = node.wait_exit(NODE_WAIT).expect("the node stops on its own after the revocation");
    assert_eq!(status.code(), Some(5), "{status}: {}", node.logs());
    let logs = node.logs();
    assert_eq!(logs.matches("This node stops for good").count(), 1, "one clear error: {logs}");
    assert!(logs.contains("revoked this node's certificate"), "{logs}");

    node.start_again(None);
    let status = node.wait_exit(NODE_WAIT).expect("a revoked node does not start working");
    assert_eq!(status.code(), Some(5), "{status}");
    hub.assert_one_attempt(&before, "succeeded");
}

/// The operator retires the node's host while it runs: the hub answers its next claim 403
/// `host_retired`, and the node stops for good with exit status 5 instead of polling forever.
#[test]
fn a_node_whose_host_is_retired_exits_with_status_5() {
    let hub = Hub::with_nodes(&["host-a"]);
    let mut node = TurnNode::start(&hub, "host-a", "node-a", "cat", &[]);
    let before = hub.send_one("conv", "k1", "host-a");
    hub.wait_outcome(&before);
    hub.cli_ok(["retire", "host-a", "--reason", "decommissioned", "--yes"]);

    let status = node.wait_exit(NODE_WAIT).expect("the node stops on its own after its host is retired");
    assert_eq!(status.code(), Some(5), "{status}: {}", node.logs());
    let logs = node.logs();
    assert_eq!(logs.matches("This node stops for good").count(), 1, "one clear error: {logs}");
    assert!(logs.contains("retired this node's host"), "{logs}");
    hub.assert_one_attempt(&before, "succeeded");
}

/// Renewal without a restart: the operator renews the certificate, copies the new files over
/// the ones the node reads, and sends SIGHUP; the node keeps running (SIGHUP never ends it) and
/// presents the new certificate, so revoking the old serial afterwards changes nothing.
#[test]
fn sighup_reloads_a_renewed_certificate_and_the_old_serial_can_then_be_revoked() {
    if crate::harness::skipped_on_postgres(
        "sighup_reloads_a_renewed_certificate_and_the_old_serial_can_then_be_revoked",
    ) {
        return;
    }
    let hub = Hub::with_nodes(&["host-a"]);
    let mut node = TurnNode::start(&hub, "host-a", "node-a", "cat", &[]);
    let first = hub.send_one("conv", "k1", "host-a");
    hub.wait_outcome(&first);
    let old = serials(&hub, "host-a");
    assert_eq!(old.len(), 1, "{old:?}");

    let renewed = hub.scratch("renewed");
    hub.cli_ok([std::ffi::OsStr::new("renew"), "host-a".as_ref(), "--out".as_ref(), renewed.as_os_str()]);
    let id = hub.identity("host-a").clone();
    fs::copy(renewed.join("host-a.crt"), &id.cert).expect("install the renewed certificate");
    fs::copy(renewed.join("host-a.key"), &id.key).expect("install the renewed key");
    node.signal(Signal::SIGHUP);
    node.wait_log("SIGHUP: read ca_file, cert_file and key_file again");
    assert!(node.running(), "SIGHUP does not end the node");

    hub.cli_ok(["revoke", &old[0], "--reason", "replaced by the renewed certificate", "--yes"]);
    let second = hub.send_one("conv", "k2", "host-a");
    hub.wait_outcome(&second);
    hub.assert_one_attempt(&second, "succeeded");
    node.signal(Signal::SIGHUP);
    let third = hub.send_one("conv", "k3", "host-a");
    hub.wait_outcome(&third);
    hub.assert_one_attempt(&third, "succeeded");
    assert!(node.running(), "still running after a second SIGHUP and the old serial's revocation");
    assert!(!node.logs().contains("stops for good"), "{}", node.logs());
}

/// `baton-node status` shows how big the store is: rows by table and bytes.
#[test]
fn status_shows_the_size_of_the_store() {
    let hub = Hub::with_nodes(&["host-a"]);
    let node = TurnNode::start(&hub, "host-a", "node-a", "cat", &[]);
    for key in ["k1", "k2"] {
        let id = hub.send_one("conv", key, "host-a");
        hub.wait_outcome(&id);
    }
    let s = wait_for("both reports confirmed locally", NODE_WAIT, || {
        let s = node.status();
        s["awaiting_report"].as_array().is_some_and(Vec::is_empty).then_some(s)
    });
    let rows = &s["store"]["rows"];
    assert_eq!(rows, &serde_json::json!({"deliveries": 2, "executions": 2, "attempts": 2, "outbox": 2}), "{s}");
    let bytes = s["store"]["bytes"].as_i64().unwrap_or_default();
    assert!(bytes > 0 && s["store"]["free_bytes"].as_i64().is_some_and(|f| f <= bytes), "{s}");
    assert!(s["store"]["wal_bytes"].is_u64(), "{s}");
    let out = node.node.status(false).unwrap_or_else(|e| panic!("{e:#}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("store rows:       deliveries 2, executions 2, attempts 2, outbox 2"), "{text}");
    assert!(text.contains("store bytes:      "), "{text}");
}
