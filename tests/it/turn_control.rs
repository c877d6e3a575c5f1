//! Turn control end to end, with the real `baton-hub` and `baton-node`: a cancel that reaches a
//! running turn (SIGTERM, then SIGKILL after `cancel_grace`) or stops one before it starts;
//! retries the harness asks for (exit 75), which keep the conversation's order; an operator's
//! retry of a final turn, marked as a redrive; and a copied node data directory that runs
//! nothing a second time while its takeover is visible to the operator.
//!
//! Harnesses here append `DELIVERY RUN RERUN` to a runs file when they start, so that every run
//! of a delivery (not only its first) is counted.

use crate::harness::{Hub, submit_body};
use crate::node_harness::{NODE_WAIT, lines, long_turn, process_gone, wait_for, wait_started};
use baton_testkit::Signal;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

/// The runs file: one `DELIVERY RUN RERUN` line per harness start.
struct Runs(PathBuf);

impl Runs {
    fn new(hub: &Hub) -> Runs {
        Runs(hub.scratch("runs").join("runs.log"))
    }

    /// Shell that records this run; put first in a harness.
    fn record(&self) -> String {
        format!("echo \"$BATON_DELIVERY_ID $BATON_ATTEMPT ${{BATON_RERUN:-first}}\" >> '{}'", self.0.display())
    }

    /// (run, rerun) of every start of `delivery_id`, in order.
    fn of(&self, delivery_id: &str) -> Vec<(u32, String)> {
        lines(&self.0)
            .iter()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f.first() == Some(&delivery_id)).then(|| (f[1].parse().expect("run number"), f[2].to_string()))
            })
            .collect()
    }

    /// Every line, for failure messages and order checks.
    fn all(&self) -> Vec<String> {
        lines(&self.0)
    }
}

fn attempts(shown: &Value) -> Vec<Value> {
    shown["attempts"].as_array().expect("attempts").clone()
}

/// Waits until the delivery has `n` attempts; returns `deliveries show`.
#[track_caller]
fn wait_attempts(hub: &Hub, id: &str, n: usize) -> Value {
    wait_for(&format!("{n} attempts of {id}"), NODE_WAIT, || {
        let v = hub.show(id);
        (attempts(&v).len() >= n).then_some(v)
    })
}

fn cancel(hub: &Hub, id: &str, reason: &str) -> std::process::Output {
    hub.cli(["deliveries", "cancel", id, "--reason", reason])
}

/// A running turn that is cancelled gets SIGTERM on its process group; it exits on it, and the
/// attempt is reported `cancelled` with the operator's reason. Cancelling again changes nothing.
#[test]
fn a_cancelled_running_turn_gets_sigterm_and_ends_cancelled() {
    let hub = Hub::with_nodes(&["host-a"]);
    let signals = hub.scratch("turn").join("signals");
    let node = hub.node_process("host-a").then(&long_turn(&signals, "exit 143")).set("cancel_grace", "\"30s\"").start();
    let id = hub.send_one("conv", "k1", "host-a");
    let pgid = wait_started(&signals);

    let out = cancel(&hub, &id, "the operator changed their mind");
    assert!(out.status.success(), "cancel exits 0: {}", String::from_utf8_lossy(&out.stderr));
    let shown = wait_attempts(&hub, &id, 1);
    let a = &attempts(&shown)[0];
    assert_eq!(a["outcome"], "cancelled", "{shown:#}");
    assert!(lines(&signals).contains(&"TERM".to_string()), "the harness got SIGTERM: {shown:#}");
    assert!(process_gone(pgid), "the harness's process group is gone once the attempt is reported");
    assert_eq!(a["exit_code"], 143, "what the process returned is reported: {a:#}");
    let reason = a["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("the operator changed their mind"), "{reason}");

    let again = cancel(&hub, &id, "twice");
    let after = hub.show(&id);
    assert_eq!(attempts(&after), attempts(&shown), "a second cancel adds nothing: {after:#}");
    assert_eq!(again.status.code(), Some(1), "a cancel that changes nothing exits 1");
    assert!(String::from_utf8_lossy(&again.stdout).contains("already ended"), "and says so");
    node.wait_idle();
    hub.verify_ok();
}

/// A running turn that ignores SIGTERM is killed with SIGKILL after `cancel_grace`.
#[test]
fn a_cancelled_turn_that_ignores_sigterm_is_killed_after_cancel_grace() {
    let hub = Hub::with_nodes(&["host-a"]);
    let signals = hub.scratch("turn").join("signals");
    let _node = hub.node_process("host-a").then(&long_turn(&signals, ":")).set("cancel_grace", "\"2s\"").start();
    let id = hub.send_one("conv", "k1", "host-a");
    let pgid = wait_started(&signals);
    assert!(cancel(&hub, &id, "stop it").status.success());
    let shown = wait_attempts(&hub, &id, 1);
    let a = &attempts(&shown)[0];
    assert_eq!(a["outcome"], "cancelled", "{shown:#}");
    assert!(process_gone(pgid), "SIGKILL took the group down");
    let after_term: Vec<String> = lines(&signals).into_iter().skip_while(|l| l != "TERM").collect();
    assert!(after_term.iter().any(|l| l == "tick"), "it ran on after SIGTERM until SIGKILL: {after_term:?}");
    assert_eq!(a["signal"], 9, "SIGKILL ended it: {a:#}");
}

/// A delivered turn that waits behind an earlier turn of its conversation is cancelled: it
/// never starts; the earlier one is not disturbed.
#[test]
fn a_delivered_turn_cancelled_before_it_starts_never_starts() {
    let hub = Hub::with_nodes(&["host-a"]);
    let runs = Runs::new(&hub);
    let go = hub.scratch("turn").join("go");
    let script = format!(
        "{record}\nif [ \"$BATON_SEQ\" = 1 ]; then i=0; while [ ! -e '{go}' ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; fi",
        record = runs.record(),
        go = go.display()
    );
    let node = hub.node_process("host-a").then(&script).start();
    let first = hub.send_one("conv", "k1", "host-a");
    let second = hub.send_one("conv", "k2", "host-a");
    wait_for("the first turn to run", NODE_WAIT, || (!runs.of(&first).is_empty()).then_some(()));
    wait_for("the second to be delivered to the node", NODE_WAIT, || (hub.state(&second) == "delivered").then_some(()));

    assert!(cancel(&hub, &second, "not needed any more").status.success());
    // The node learns of the cancel while the first turn still runs: the attempt is reported
    // without the turn ever starting.
    let shown = wait_attempts(&hub, &second, 1);
    assert_eq!(attempts(&shown)[0]["outcome"], "cancelled", "{shown:#}");
    fs::write(&go, "").expect("release the first turn");
    hub.wait_outcome(&first);
    hub.assert_one_attempt(&first, "succeeded");
    node.wait_idle();
    assert!(runs.of(&second).is_empty(), "the cancelled turn never started: {:?}", runs.all());
    hub.verify_ok();
}

/// A message with `max_attempts` 3 whose harness exits 75 on its first run is run again after
/// its backoff, as run 2; the next message of the conversation runs only after it.
#[test]
fn a_retryable_failure_runs_again_and_later_turns_wait_for_it() {
    let hub = Hub::builder().nodes(&["host-a"]).producers(&["prod"]).start();
    let runs = Runs::new(&hub);
    let script = format!(
        "{record}\nif [ \"$BATON_SEQ\" = 1 ] && [ \"$BATON_ATTEMPT\" = 1 ]; then exit 75; fi",
        record = runs.record()
    );
    let node = hub.node_process("host-a").then(&script).start();
    let api = hub.client("prod");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (first, second) = rt.block_on(async {
        let mut body = submit_body("conv", "k1", json!({"n": 1}), &["host-a"]);
        body["max_attempts"] = json!(3);
        body["retry_backoff_ms"] = json!(500);
        let r = api.post("/v1/messages", &body).await;
        let first = r.ok(201)["deliveries"][0]["delivery_id"].as_str().expect("id").to_string();
        let r = api.submit("conv", "k2", json!({"n": 2}), &["host-a"]).await;
        let second = r.ok(201)["deliveries"][0]["delivery_id"].as_str().expect("id").to_string();
        (first, second)
    });
    let shown = wait_attempts(&hub, &first, 2);
    let a = attempts(&shown);
    assert_eq!((a[0]["outcome"].as_str(), a[0]["retryable"].as_bool()), (Some("failed"), Some(true)), "{shown:#}");
    assert_eq!((a[1]["outcome"].as_str(), a[1]["attempt"].as_u64()), (Some("succeeded"), Some(2)), "{shown:#}");
    assert_eq!(a[1]["rerun"], "retry", "{shown:#}");
    hub.wait_outcome(&second);
    hub.assert_one_attempt(&second, "succeeded");
    node.wait_idle();
    assert_eq!(runs.of(&first), vec![(1, "first".to_string()), (2, "retry".to_string())], "{:?}", runs.all());
    let order: Vec<String> = runs.all().iter().map(|l| l.split(' ').next().unwrap_or_default().to_string()).collect();
    assert_eq!(order, vec![first.clone(), first.clone(), second.clone()], "the later turn waited for the retry");
    hub.verify_ok();
}

/// A turn that failed for good is re-run by `deliveries retry`: a new attempt, marked as a
/// redrive, caused by the operator; the harness sees `BATON_RERUN=redrive`.
#[test]
fn an_operator_retry_reruns_a_failed_turn_as_a_redrive() {
    let hub = Hub::with_nodes(&["host-a"]);
    let runs = Runs::new(&hub);
    let script = format!("{record}\nif [ \"$BATON_ATTEMPT\" = 1 ]; then exit 3; fi", record = runs.record());
    let node = hub.node_process("host-a").then(&script).start();
    let id = hub.send_one("conv", "k1", "host-a");
    hub.wait_outcome(&id);
    hub.assert_one_attempt(&id, "failed");

    let out = hub.cli(["deliveries", "retry", &id, "--reason", "the tool is fixed"]);
    assert!(out.status.success(), "retry exits 0: {}", String::from_utf8_lossy(&out.stderr));
    let shown = wait_attempts(&hub, &id, 2);
    let a = attempts(&shown);
    assert_eq!((a[1]["outcome"].as_str(), a[1]["rerun"].as_str()), (Some("succeeded"), Some("redrive")), "{shown:#}");
    let caused = a[1]["caused_by"].as_str().unwrap_or_default();
    assert!(caused.starts_with("operator"), "{caused}");
    assert_eq!(runs.of(&id), vec![(1, "first".to_string()), (2, "redrive".to_string())]);
    node.wait_idle();
    hub.verify_ok();
}

/// A node's data directory is copied while it runs turns (the node stopped for the copy, as a
/// VM snapshot would), and the copy is started while the original still runs. No delivery runs
/// twice; the original is told it was taken over and exits 6; the hub shows the takeover; every
/// delivery ends with an outcome.
#[test]
fn a_copied_node_data_directory_runs_nothing_twice_and_the_takeover_is_visible() {
    let hub = Hub::with_nodes(&["host-a"]);
    let runs = Runs::new(&hub);
    let script = format!("{record}\nsleep 0.3", record = runs.record());
    let mut original = hub.node_process("host-a").then(&script).set("queue_ahead_batches", "4").start();
    let mut ids = Vec::new();
    for i in 0..40 {
        ids.push(hub.send_one(&format!("conv-{}", i % 4), &format!("k{i}"), "host-a"));
    }
    wait_for("some turns to run", NODE_WAIT, || (runs.all().len() >= 4).then_some(()));

    // The copy: stop the original, copy its data directory, let it go on.
    original.signal_only(Signal::SIGSTOP);
    let copy_dir = hub.scratch("node-host-a-copy");
    let st = Command::new("cp").arg("-a").arg(original.data_dir()).arg(copy_dir.join("data")).status().expect("cp");
    assert!(st.success(), "copying the data directory");
    original.signal_only(Signal::SIGCONT);

    let mut copy = hub.node_process("host-a").named("host-a-copy").then(&script).start();
    let status = original
        .wait_exit(NODE_WAIT)
        .unwrap_or_else(|| panic!("the original did not stop after the takeover:\n{}", original.log()));
    assert_eq!(status.code(), Some(6), "the original exits 6 (taken over):\n{}", original.log());
    assert!(original.log().contains("took over"), "one clear error names the takeover:\n{}", original.log());

    for id in &ids {
        hub.wait_outcome(id);
    }
    copy.wait_idle();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for l in runs.all() {
        *counts.entry(l.split(' ').next().unwrap_or_default().to_string()).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "no delivery ran twice: {twice:?}\n{:?}", runs.all());
    for id in &ids {
        let a = attempts(&hub.show(id));
        assert_eq!(a.len(), 1, "one outcome per delivery: {a:#?}");
        // A turn the copy's start-up found running (on this machine: the original's harness)
        // is stopped and may be reported failed by a signal; one the copy has no record of, or
        // one another session started, is `unknown`. Whatever the outcome, it ran at most once.
        let outcome = a[0]["outcome"].as_str().unwrap_or_default();
        if outcome == "succeeded" {
            assert_eq!(counts.get(id.as_str()), Some(&1), "a succeeded turn ran exactly once: {id}");
        }
    }
    // The operator sees the takeover: the host's current session took over the original's.
    let shown = hub.cli_json(["hosts", "show", "host-a", "--json"]);
    let took_over = shown.to_string();
    assert!(took_over.contains("\"took_over\":") && !took_over.contains("\"took_over\":null"), "{shown:#}");
    let text = hub.cli_ok(["hosts", "show", "host-a"]);
    assert!(text.contains("took over session"), "{text}");
    let _ = copy.term();
    hub.verify_ok();
}
