//! The client's examples (`shared/client/examples/`) run as documented against a real hub and
//! node (started by the test kit): submit and wait, the listing from a cursor, and the spool.
//! The test command builds them (`cargo test` builds every example); this runs them, so an
//! example that no longer works fails here, not in a reader's hands.

use baton_testkit::bins::{example, run};
use baton_testkit::{Binaries, Harness, Hub, Identity, Node, NodeConfig, Role, Started};
use std::process::Output;
use std::time::Duration;

/// How long one example may run: it waits for a turn at most two minutes itself.
const EXAMPLE_LIMIT: Duration = Duration::from_secs(180);

/// The example `name` with `args`, connected as the producer `id` through the variables `baton`
/// reads.
fn run_example(name: &str, hub_url: &str, id: &Identity, args: &[&str]) -> Output {
    let mut cmd = baton_testkit::bins::command(&example(name).unwrap());
    cmd.env("BATON_HUB_URL", hub_url)
        .env("BATON_CA_FILE", &id.ca)
        .env("BATON_CERT_FILE", &id.cert)
        .env("BATON_KEY_FILE", &id.key)
        .args(args);
    run(cmd, EXAMPLE_LIMIT).unwrap()
}

fn stdout(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}:\n{text}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn the_examples_run_against_a_real_hub() {
    let root = tempfile::tempdir().unwrap();
    let bins = Binaries::build().unwrap();
    let mut hub = Hub::init(&bins, root.path(), "examples").unwrap();
    let host = hub.enroll(Role::Node, "worker-1").unwrap();
    let producer = hub.enroll(Role::Producer, "billing").unwrap();
    let Started::Ready(addr) = hub.serve(None).unwrap() else { panic!("the hub did not start") };
    let url = format!("https://{addr}");
    let config = NodeConfig::new(&url, &host, &root.path().join("node"), Harness::Command(vec!["cat".into()]));
    let mut node = Node::create(&bins, &root.path().join("node-run"), "worker-1", &config).unwrap();
    node.start(None).unwrap();

    // Submit and wait: accepted, the turn ran, the message kept the example's trace.
    let text = stdout(&run_example("submit_and_wait", &url, &producer, &["support", "worker-1", "order-42"]));
    assert!(text.contains("accepted: support #1") && text.contains("worker-1: succeeded"), "{text}");
    assert!(text.contains("traceparent 00-"), "{text}");
    // Again with the same key: the same message, not a second one.
    let again = stdout(&run_example("submit_and_wait", &url, &producer, &["support", "worker-1", "order-42"]));
    assert!(again.contains("already accepted: support #1"), "{again}");

    // The spool: durable first, then delivered once.
    let spool = root.path().join("spool");
    let spool = spool.to_str().unwrap();
    let text = stdout(&run_example("spool", &url, &producer, &[spool, "support", "worker-1", "order-43"]));
    assert!(text.contains("spooled order-43 at position 1") && text.contains("accepted as message"), "{text}");
    assert!(text.contains("0 message(s) still waiting, 0 refused"), "{text}");

    // The listing: both messages, in order, and a cursor to go on from that shows nothing new.
    let text = stdout(&run_example("list_messages", &url, &producer, &["support"]));
    let keys: Vec<&str> = text.lines().filter_map(|l| l.split(' ').nth(1)).collect();
    assert_eq!(&keys[..2], ["order-42", "order-43"], "{text}");
    let cursor = text.lines().last().and_then(|l| l.strip_prefix("next ")).unwrap().to_string();
    let text = stdout(&run_example("list_messages", &url, &producer, &["support", &cursor]));
    assert_eq!(text.trim(), format!("next {cursor}"), "nothing new after the cursor");
}
