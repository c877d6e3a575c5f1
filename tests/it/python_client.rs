//! The Python client package (`shared/python`), end to end: its own test suite (stdlib
//! `unittest`) runs against a real hub and a real node whose harness is built on the package's
//! harness helper, and `mypy --strict` checks the package and its tests.
//!
//! One hub serves every check: the suite's unit tests and hub tests (submit, replay, conflict,
//! batch with a bad item, reads, a wait through a retry the harness asked for, cancel, refusals'
//! codes, approvals, the asyncio client, a spool whose hub answers, a message's events feed
//! followed to its outcome with its run's progress, a conversation's feed and the replay listing
//! paged, cursors refused as `bad_cursor`, blocking and asyncio); then the outage: the hub
//! is killed, the package and `baton send --spool` spool sends, `baton spool status` reads the
//! package's spool, the hub comes back at the same address, `baton spool flush` delivers the
//! package's spool and the package delivers the one `baton` wrote, each message accepted once,
//! in spool order per conversation.
//!
//! Needs a Python that imports the package's dependencies and mypy (`BATON_PYTHON`, else
//! `python3`): without one the test says `SKIPPED:` and passes, unless `BATON_REQUIRE_PYTHON`
//! is set (CI sets it), when it fails.

use baton_testkit::bins::{self, Binaries};
use baton_testkit::python::{self, Python};
use baton_testkit::{Harness, Hub, Identity, Node, NodeConfig, Role, fresh_dir};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// How long one run of the package's suite may take (its waits are 90 s at most each).
const SUITE_LIMIT: Duration = Duration::from_secs(600);
/// How long `mypy` may take (a cold cache on a loaded machine).
const MYPY_LIMIT: Duration = Duration::from_secs(300);
/// How long one `baton` command may take.
const CLI_LIMIT: Duration = Duration::from_secs(120);
/// The tests of the outage phases, skipped by the run of the whole suite.
const OUTAGE_TESTS: usize = 3;
/// The messages the package spools during the outage (`test_outage.SENT`).
const PY_SPOOLED: i64 = 5;

/// The package's tests directory.
fn tests_dir() -> PathBuf {
    python::package_dir().join("tests")
}

/// Runs `cmd` to its end and fails, quoting its output, unless it exited 0.
fn run_ok(cmd: Command, limit: Duration, what: &str) -> Output {
    let out = bins::run(cmd, limit).unwrap_or_else(|e| panic!("{what}: {e:#}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// How many tests a `unittest` run that passed ran and skipped, from its summary (`Ran N
/// tests`, `OK (skipped=K)`), which nothing else printed can split.
fn summary(out: &Output) -> (usize, usize) {
    let err = String::from_utf8_lossy(&out.stderr);
    let ran = err.lines().find_map(|l| l.strip_prefix("Ran ")?.split_whitespace().next()?.parse().ok());
    let skipped = err.lines().rev().find(|l| l.starts_with("OK")).map(|l| {
        l.split_once("skipped=").and_then(|(_, n)| n.trim_end_matches(')').split(',').next()?.parse().ok()).unwrap_or(0)
    });
    match (ran, skipped) {
        (Some(ran), Some(skipped)) => (ran, skipped),
        _ => panic!("no unittest summary in:\n{err}"),
    }
}

/// Asserts that a passing run ran every one of `names` and skipped exactly `skipped` tests (the
/// outage phases outside their run): a misnamed variable would skip the hub tests and pass.
fn assert_ran(out: &Output, names: &[&str], skipped: usize) {
    let err = String::from_utf8_lossy(&out.stderr);
    let (ran, skips) = summary(out);
    assert!(ran >= names.len() && skips == skipped, "ran {ran}, skipped {skips} (expected {skipped}):\n{err}");
    for name in names {
        assert!(err.contains(&format!("{name} (")), "{name} did not run:\n{err}");
    }
}

/// The package's suite (`-m unittest` with `args`) with the hub named in its environment.
fn suite(py: &Python, url: &str, producer: &Identity, extra: &[(&str, &Path)], args: &[&str]) -> Command {
    let mut cmd = py.command();
    cmd.current_dir(tests_dir()).args(["-m", "unittest"]).args(args).arg("-v");
    cmd.env("BATON_TEST_HUB_URL", url)
        .env("BATON_TEST_CA", &producer.ca)
        .env("BATON_TEST_CERT", &producer.cert)
        .env("BATON_TEST_KEY", &producer.key)
        .env("BATON_TEST_HOST", "py-host");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd
}

/// `baton ARGS… --hub-url URL --ca-file … --cert-file … --key-file …`.
fn baton(url: &str, producer: &Identity, args: &[&str]) -> Command {
    let cli = bins::producer_cli().unwrap_or_else(|e| panic!("{e:#}"));
    let mut cmd = bins::command(&cli);
    cmd.args(args).args(["--hub-url", url]);
    cmd.arg("--ca-file").arg(&producer.ca).arg("--cert-file").arg(&producer.cert).arg("--key-file").arg(&producer.key);
    cmd
}

/// `mypy --strict` over the package and its tests, with the package's own settings.
fn type_check(py: &Python) {
    let mut cmd = py.command();
    cmd.current_dir(python::package_dir()).args(["-m", "mypy", "--strict", "--config-file", "pyproject.toml"]);
    cmd.arg("--cache-dir").arg(Path::new(env!("CARGO_TARGET_TMPDIR")).join("mypy-cache"));
    cmd.args(["src", "tests"]);
    run_ok(cmd, MYPY_LIMIT, "mypy --strict");
}

#[test]
fn the_python_package_works_against_a_real_hub_and_node() {
    let Some(py) = python::find_or_skip(&["baton_client", "httpx", "mypy"]) else { return };
    let started = Instant::now();
    // The package ships the spool's schema; it must be the repository's, byte for byte.
    let shipped = python::package_src().join("baton_client/schema/0001-create-spool.sql");
    let ours = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schema/spool/0001-create-spool.sql");
    assert_eq!(std::fs::read(&shipped).unwrap(), std::fs::read(&ours).unwrap(), "{} differs", shipped.display());
    type_check(&py);

    let bins = Binaries::build().unwrap();
    let dir = fresh_dir("python-client").unwrap();
    let mut hub = Hub::init(&bins, &dir.path().join("hub"), "ops").unwrap();
    let node_id = hub.enroll(Role::Node, "py-host").unwrap();
    let producer = hub.enroll(Role::Producer, "py-producer").unwrap();
    hub.cli(["producers", "approve", "py-producer", "py-approve*", "--reason", "the client's tests"]).unwrap();
    hub.serve(None).unwrap();
    let addr = hub.addr().expect("a serving hub");
    hub.listen_on(addr);
    let url = format!("https://localhost:{}", addr.port());

    let harness_script = tests_dir().join("e2e_harness.py");
    let argv = vec![py.exe.display().to_string(), harness_script.display().to_string()];
    let config = NodeConfig::new(&url, &node_id, &dir.path().join("node-data"), Harness::Command(argv))
        .set("cancel_grace", "\"2s\"");
    let mut node = Node::create(&bins, dir.path(), "py-node", &config).unwrap();
    for (k, v) in py.env() {
        node.set_env(k, &v);
    }
    node.start(None).unwrap();

    // The whole suite: unit tests, and the hub tests against this hub and node.
    let out = run_ok(suite(&py, &url, &producer, &[], &["discover", "-s", ".", "-t", "."]), SUITE_LIMIT, "the suite");
    assert_ran(
        &out,
        &[
            "test_submit_replay_read_and_conflict",
            "test_a_batch_answers_each_message_and_one_bad_item_spoils_no_other",
            "test_wait_follows_a_retry_the_harness_asked_for",
            "test_cancel_stops_a_running_turn_and_wait_sees_it_end",
            "test_refusals_carry_the_apis_code_and_status",
            "test_approve_and_reject",
            "test_the_async_client_submits_waits_batches_and_spools",
            "test_a_feed_is_followed_to_its_outcome_and_a_conversation_and_listing_paged",
            "test_the_async_client_follows_feeds_and_lists",
            "test_a_message_feed_is_followed_to_its_end_through_failures_from_the_last_cursor",
            "test_each_progress_object_is_one_utf8_json_line_on_the_pipe",
            "test_a_harness_process_writes_progress_on_the_descriptor_the_node_names",
        ],
        OUTAGE_TESTS,
    );

    // The outage: sends spooled by the package and by `baton` while no hub answers.
    let (py_spool, rust_spool) = (dir.path().join("py-spool"), dir.path().join("rust-spool"));
    let spools: [(&str, &Path); 2] = [("BATON_TEST_SPOOL", &py_spool), ("BATON_TEST_RUST_SPOOL", &rust_spool)];
    hub.kill().unwrap();
    let rust_spool_arg = rust_spool.display().to_string();
    let send = [
        "send",
        "--spool",
        &rust_spool_arg,
        "--conversation",
        "py-out-r",
        "--to",
        "py-host",
        "--idempotency-key",
        "rs-1",
        "--payload",
        r#"{"n": 1}"#,
    ];
    let out = bins::run(baton(&url, &producer, &send), CLI_LIMIT).unwrap();
    assert_eq!(out.status.code(), Some(10), "spooled while the hub is down: {}", String::from_utf8_lossy(&out.stderr));
    let mut phase = suite(&py, &url, &producer, &spools, &["test_outage.HubDown"]);
    phase.env("BATON_TEST_PHASE", "spool-down");
    let out = run_ok(phase, SUITE_LIMIT, "the spool-down phase");
    assert_ran(
        &out,
        &[
            "test_sends_wait_in_the_spool_while_no_hub_answers",
            "test_a_spool_baton_wrote_is_read_and_its_messages_recognised",
        ],
        0,
    );
    // `baton` reads the spool the package wrote.
    let py_spool_arg = py_spool.display().to_string();
    let out =
        run_ok(baton(&url, &producer, &["spool", "status", "--spool", &py_spool_arg, "--json"]), CLI_LIMIT, "status");
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((st["waiting"].as_i64(), st["failed"].as_array().map(Vec::len)), (Some(PY_SPOOLED), Some(0)), "{st}");
    assert!(st["last_error"]["error"].as_str().is_some_and(|e| e.contains("unreachable")), "{st}");

    // The hub is back at the same address: `baton` delivers the package's spool, and the
    // package delivers the one `baton` wrote and checks every message was accepted once, in order.
    hub.serve(None).unwrap();
    let flush = ["spool", "flush", "--spool", &py_spool_arg, "--wait", "1m", "--json"];
    let out = run_ok(baton(&url, &producer, &flush), CLI_LIMIT, "baton spool flush");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let keys: Vec<&str> = report["flush"]["settled"]
        .as_array()
        .expect("settled")
        .iter()
        .map(|s| s["result"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(keys, vec!["accepted"; PY_SPOOLED as usize], "{report}");
    let mut phase = suite(&py, &url, &producer, &spools, &["test_outage.HubBack"]);
    phase.env("BATON_TEST_PHASE", "spool-up");
    let out = run_ok(phase, SUITE_LIMIT, "the spool-up phase");
    assert_ran(&out, &["test_every_spooled_message_is_accepted_once_in_order"], 0);
    eprintln!("the Python client's end-to-end run took {:.1?}", started.elapsed());
}
