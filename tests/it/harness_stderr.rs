//! The end of a harness's stderr, from the real node to every view: `deliveries show` (text and
//! `--json`), the producer's message (`baton get`, `baton wait`), and the status page as
//! `status_page_reasons` says; exactly the last `stderr_tail_bytes` with the count of what came
//! before; cut further, never refused, by the hub's `limits.stderr_tail_bytes_max`; and kept in
//! the node's outbox across the hub's and the node's restart.

use crate::harness::Hub;
use crate::node_harness::{NODE_WAIT, wait_for};
use crate::producer_cli::{baton, config_file, json, run, status, text};
use crate::status_page::operator_addr;
use crate::status_view::page;
use serde_json::Value;

/// What the failing harness below writes to stderr: two lines, a terminal escape and a
/// character of two bytes among them.
const STDERR: &str = "loading model\nTraceback: boom \u{1b}[31m é\n";

/// The attempt of `deliveries show --json` for a delivery with exactly one.
#[track_caller]
fn only_attempt(hub: &Hub, id: &str, outcome: &str) -> Value {
    hub.wait_outcome(id);
    hub.assert_one_attempt(id, outcome)
}

/// A harness that writes lines to stderr and exits 3: the lines are in `deliveries show` (as
/// sent in `--json`, escaped in text), in the producer's view of the message and in `baton
/// wait`, and on both status pages (a loopback listener shows reasons), next to a result that
/// the page never shows.
#[test]
fn a_failing_harness_s_stderr_reaches_every_view() {
    let hub = Hub::with_nodes(&["host-a"]);
    let _node = hub
        .node_process("host-a")
        .then("echo 'loading model' >&2; printf 'Traceback: boom \\033[31m é\\n' >&2; echo result-TOPSECRET; exit 3")
        .start();
    let config = config_file(&hub, false);
    let producer = |args: &[&str]| {
        let mut all = vec!["--config".to_string(), config.display().to_string()];
        all.extend(args.iter().map(|s| s.to_string()));
        run(baton(all))
    };
    let out =
        producer(&["--json", "send", "--conversation", "work", "--to", "host-a", "--key", "k1", "--payload", "{}"]);
    status(&out, 0);
    let message = json(&out)["message_id"].as_str().expect("message_id").to_string();

    // The producer: `wait` ends not succeeded (7) and shows the lines escaped, one a line.
    let out = producer(&["wait", &message, "--timeout", "60s"]);
    status(&out, 7);
    let shown = text(&out.stdout);
    assert!(shown.contains("      stderr:\n        loading model\n        Traceback: boom \\x1b[31m é\n"), "{shown}");
    assert!(!out.stdout.contains(&0x1b), "{shown}");
    // The producer's view of the message carries the tail as the harness wrote it.
    let out = producer(&["--json", "get", &message]);
    status(&out, 0);
    let view = json(&out);
    let attempt = &view["deliveries"][0]["attempts"][0];
    assert_eq!(attempt["stderr_tail"], STDERR, "{view:#}");
    assert_eq!(attempt["stderr_dropped_bytes"], 0, "{view:#}");
    let id = view["deliveries"][0]["delivery_id"].as_str().expect("delivery_id").to_string();

    // The operator: --json exactly, text escaped.
    let attempt = only_attempt(&hub, &id, "failed");
    assert_eq!(attempt["stderr_tail"], STDERR, "{attempt:#}");
    assert_eq!(attempt["stderr_dropped_bytes"], 0, "{attempt:#}");
    let shown = hub.cli_ok(["deliveries", "show", &id]);
    assert!(shown.contains("    stderr: loading model\n"), "{shown}");
    assert!(shown.contains("Traceback: boom") && !shown.contains('\u{1b}'), "{shown}");

    // The status page, on loopback: the failures table and the delivery's page.
    let addr = operator_addr(&hub);
    for path in ["/".to_string(), format!("/status/deliveries/{id}")] {
        let html = page(&addr, &path);
        assert!(html.contains("Traceback: boom \u{fffd}[31m é"), "{path} shows the stderr's end:\n{html}");
        assert!(!html.contains("result-TOPSECRET"), "{path} never shows a result:\n{html}");
    }
    assert!(page(&addr, &format!("/status/deliveries/{id}")).contains("loading model"));
}

/// With `status_page_reasons = "hidden"`, the stderr is on neither page, while the operator's
/// CLI still has it.
#[test]
fn the_status_page_hides_stderr_with_the_reasons() {
    let hub = Hub::builder().nodes(&["host-a"]).config("status_page_reasons = \"hidden\"\n").start();
    let _node = hub.node_process("host-a").then("echo stderr-TOPSECRET >&2; exit 3").start();
    let id = hub.send_one("work", "k1", "host-a");
    assert_eq!(only_attempt(&hub, &id, "failed")["stderr_tail"], "stderr-TOPSECRET\n");
    let addr = operator_addr(&hub);
    for path in ["/".to_string(), format!("/status/deliveries/{id}")] {
        let html = page(&addr, &path);
        assert!(html.contains(&id), "{path} lists the delivery:\n{html}");
        assert!(!html.contains("TOPSECRET"), "{path} shows the stderr:\n{html}");
    }
}

/// 200,000 bytes of "é" and then "END", through a node keeping 1,000: the last 999 bytes, since
/// the 1,000th from the end is the second byte of an "é", and the count of all before them; the
/// node's log still has the stderr.
#[test]
fn far_more_than_the_node_keeps_gives_exactly_the_last_bytes_and_the_count() {
    let hub = Hub::with_nodes(&["host-a"]);
    let node = hub
        .node_process("host-a")
        .then("yes é | head -n 100000 | tr -d '\\n' >&2; printf END >&2; exit 1")
        .set("stderr_tail_bytes", "1000")
        .start();
    let id = hub.send_one("work", "k1", "host-a");
    let attempt = only_attempt(&hub, &id, "failed");
    assert_eq!(attempt["stderr_tail"], format!("{}END", "é".repeat(498)), "{attempt:#}");
    assert_eq!(attempt["stderr_dropped_bytes"], 200_003 - 999, "{attempt:#}");
    node.wait_log("harness stderr: ééé");
}

/// A hub keeping 100 bytes (`limits.stderr_tail_bytes_max`) takes the node's whole tail of 1,022
/// bytes, keeps its last 100 and counts the rest: the report is recorded, not refused.
#[test]
fn the_hub_cuts_a_tail_over_its_own_bound_and_counts_what_it_cut() {
    let hub = Hub::builder().nodes(&["host-a"]).config("[limits]\nstderr_tail_bytes_max = 100\n").start();
    let _node = hub
        .node_process("host-a")
        .then("echo first-line >&2; head -c 1000 /dev/zero | tr '\\0' y >&2; printf '\\nlast-line\\n' >&2; exit 2")
        .start();
    let id = hub.send_one("work", "k1", "host-a");
    let attempt = only_attempt(&hub, &id, "failed");
    assert_eq!(attempt["exit_code"], 2);
    assert_eq!(attempt["stderr_tail"], format!("{}\nlast-line\n", "y".repeat(89)), "{attempt:#}");
    assert_eq!(attempt["stderr_dropped_bytes"], 1022 - 100, "{attempt:#}");
}

/// A turn that ends while the hub is down: its report, tail included, waits in the node's
/// outbox, survives the node's SIGKILL and restart, and reaches the restarted hub whole.
#[test]
fn the_tail_survives_the_outbox_and_a_restart_of_both() {
    let mut hub = Hub::with_nodes(&["host-a"]);
    let go = hub.scratch("gate").join("go");
    let mut node = hub
        .node_process("host-a")
        .then(&format!(
            "while [ ! -e '{}' ]; do sleep 0.05; done; echo 'written while the hub was down' >&2; exit 4",
            go.display()
        ))
        .start();
    let id = hub.send_one("work", "k1", "host-a");
    hub.exec_log().wait_ran(&id);
    hub.kill9();
    std::fs::write(&go, "").expect("release the harness");
    wait_for("the report to wait in the node's outbox", NODE_WAIT, || {
        node.status()["awaiting_report"].as_array().is_some_and(|r| r.len() == 1).then_some(())
    });
    node.restart();
    hub.restart();
    let attempt = only_attempt(&hub, &id, "failed");
    assert_eq!(attempt["exit_code"], 4);
    assert_eq!(attempt["stderr_tail"], "written while the hub was down\n", "{attempt:#}");
    assert_eq!(attempt["stderr_dropped_bytes"], 0, "{attempt:#}");
}
