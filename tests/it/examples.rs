//! The Python examples in `docs/examples/`, run against the real hub and node so they stay
//! true: `harness.py` is the node's harness command, `producer.py` submits a message over mTLS,
//! prints its events as they happen (`--watch`) and waits for its outcome; both are built on
//! the Python client package (`shared/python`), imported from the source tree.
//!
//! Needs a Python that imports the package (`baton_testkit::python`): without one the test says
//! `SKIPPED:` and passes, unless `BATON_REQUIRE_PYTHON` is set (CI sets it), when it fails.

use baton_testkit::bins::{self, Binaries};
use baton_testkit::python::{self, Python};
use baton_testkit::{EVENT_WAIT, Harness, Hub, Identity, Node, NodeConfig, Role, fresh_dir};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the producer may take: submit, the node's claim and turn, the report, the read.
const PRODUCER_WAIT: Duration = Duration::from_secs(90);

/// The interpreter, when it imports the package (else the test skips or, in CI, fails).
fn python3() -> Option<Python> {
    python::find_or_skip(&["baton_client"])
}

/// A node of `hub` running `harness`, with the package importable by its harness.
fn node_with_package(bins: &Binaries, dir: &Path, url: &str, id: &Identity, harness: Harness, py: &Python) -> Node {
    let config = NodeConfig::new(url, id, &dir.join("node-data"), harness);
    let mut node = Node::create(bins, dir, "py-node", &config).unwrap();
    for (k, v) in py.env() {
        node.set_env(k, &v);
    }
    node.start(None).unwrap();
    node
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples").join(name)
}

/// A message submitted by `producer.py` runs through `harness.py` on a real node, and the
/// producer prints the harness's result once its long-poll read sees the delivery settle.
#[test]
fn python_producer_and_harness_work_against_the_real_hub_and_node() {
    let Some(python) = python3() else { return };
    let bins = Binaries::build().unwrap();
    let dir = fresh_dir("examples").unwrap();
    let mut hub = Hub::init(&bins, &dir.path().join("hub"), "ops").unwrap();
    let node_id = hub.enroll(Role::Node, "py-host").unwrap();
    let producer = hub.enroll(Role::Producer, "py-producer").unwrap();
    hub.serve(None).unwrap();
    let url = format!("https://localhost:{}", hub.addr().expect("a serving hub").port());

    let harness = vec![python.exe.display().to_string(), example("harness.py").display().to_string()];
    let node = node_with_package(&bins, dir.path(), &url, &node_id, Harness::Command(harness), &python);

    let mut cmd = producer_command(&python, &url, &producer, "py-1", r#"{"text": "three little words"}"#);
    cmd.arg("--watch");
    let out = bins::run(cmd, PRODUCER_WAIT).unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}\nnode log:\n{}", node.proc().stderr());
    // `--watch` printed the message's events as they came: the harness's progress, then the outcome.
    let progress = stderr.find(r#"progress #1 (run 1) {"step": "counting", "chars": 18}"#);
    let outcome = stderr.find("run 1 succeeded");
    assert!(progress.is_some() && progress < outcome, "{stderr}");

    let message: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(message["conversation"], "py-demo", "{message}");
    let delivery = &message["deliveries"][0];
    assert_eq!(delivery["state"], "delivered", "{message}");
    let attempt = &delivery["attempts"][0];
    assert_eq!(attempt["outcome"], "succeeded", "{message}");
    let result: serde_json::Value = serde_json::from_str(attempt["result"].as_str().unwrap()).unwrap();
    assert_eq!(result["upper"], "THREE LITTLE WORDS", "{result}");
    assert_eq!(result["words"], 3, "{result}");
    assert_eq!(result["delivery_id"], delivery["delivery_id"], "the harness sees its delivery: {result}");
    assert_eq!(result["producer"], "py-producer", "{result}");

    // The same key again is the same message: the producer's retry is safe.
    let again = producer_command(&python, &url, &producer, "py-1", r#"{"text": "three little words"}"#);
    let out = bins::run(again, EVENT_WAIT).unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let repeat: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(repeat["message_id"], message["message_id"]);

    // A payload the harness refuses fails the turn, and the producer's exit status says so.
    let refused = producer_command(&python, &url, &producer, "py-2", "[1, 2]");
    let out = bins::run(refused, PRODUCER_WAIT).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let failed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(failed["deliveries"][0]["attempts"][0]["outcome"], "failed", "{failed}");
}

/// An operator's redrive starts a new run while the old run's failed attempt stays listed:
/// `producer.py`, asked again with the same key, waits for the new run's outcome (as `baton
/// wait` does) instead of ending at once with the old one.
#[test]
fn python_producer_waits_for_the_run_a_redrive_started() {
    let Some(python) = python3() else { return };
    let bins = Binaries::build().unwrap();
    let dir = fresh_dir("examples-redrive").unwrap();
    let mut hub = Hub::init(&bins, &dir.path().join("hub"), "ops").unwrap();
    let node_id = hub.enroll(Role::Node, "py-slow").unwrap();
    let producer = hub.enroll(Role::Producer, "py-producer").unwrap();
    hub.serve(None).unwrap();
    let url = format!("https://localhost:{}", hub.addr().expect("a serving hub").port());
    // The first run fails; a later one takes a while (the producer asks while it runs), then
    // succeeds.
    let script = r#"cat >/dev/null; [ "$BATON_ATTEMPT" = 1 ] && exit 3; sleep 8; echo '{"ok": true}'"#;
    let harness = Harness::Command(vec!["/bin/sh".into(), "-c".into(), script.into()]);
    let node = node_with_package(&bins, dir.path(), &url, &node_id, harness, &python);

    let first =
        bins::run(producer_command_to(&python, &url, &producer, "py-slow", "redo", "{}"), PRODUCER_WAIT).unwrap();
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert_eq!(first.status.code(), Some(1), "{stdout}\n{}", String::from_utf8_lossy(&first.stderr));
    let failed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let delivery_id = failed["deliveries"][0]["delivery_id"].as_str().expect("a delivery id").to_string();

    hub.cli(["deliveries", "retry", &delivery_id, "--reason", "the tool is fixed"]).unwrap();
    // The new run is handed off and running: delivered, with only the old run's attempt listed.
    baton_testkit::wait::until("the redriven run to be handed off", EVENT_WAIT, || {
        let shown = hub.cli(["deliveries", "show", &delivery_id, "--json"])?;
        let view: serde_json::Value = serde_json::from_str(&shown)?;
        Ok((view["delivery"]["state"] == "delivered").then_some(()))
    })
    .unwrap();
    let again =
        bins::run(producer_command_to(&python, &url, &producer, "py-slow", "redo", "{}"), PRODUCER_WAIT).unwrap();
    let stdout = String::from_utf8_lossy(&again.stdout);
    assert_eq!(
        again.status.code(),
        Some(0),
        "the producer waits for the redriven run:\n{stdout}\n{}\nnode log:\n{}",
        String::from_utf8_lossy(&again.stderr),
        node.proc().stderr()
    );
    let message: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let attempts = message["deliveries"][0]["attempts"].as_array().expect("attempts");
    let outcomes: Vec<&str> = attempts.iter().filter_map(|a| a["outcome"].as_str()).collect();
    assert_eq!(outcomes, ["failed", "succeeded"], "{message}");
}

/// `producer.py` sending `payload` under `key` to `py-host` in `py-demo`.
fn producer_command(python: &Python, url: &str, id: &Identity, key: &str, payload: &str) -> std::process::Command {
    producer_command_to(python, url, id, "py-host", key, payload)
}

/// `producer.py` sending `payload` under `key` to `host` in `py-demo`.
fn producer_command_to(
    python: &Python,
    url: &str,
    id: &Identity,
    host: &str,
    key: &str,
    payload: &str,
) -> std::process::Command {
    let mut cmd = python.command();
    cmd.arg(example("producer.py"))
        .args(["--hub", url, "--conversation", "py-demo", "--to", host, "--idempotency-key", key])
        .arg("--ca")
        .arg(&id.ca)
        .arg("--cert")
        .arg(&id.cert)
        .arg("--key")
        .arg(&id.key)
        .args(["--payload", payload, "--timeout", "60"]);
    cmd
}
