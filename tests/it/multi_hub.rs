//! Several hubs over one PostgreSQL record, with real nodes: work sent through one hub is
//! claimed through the other at once (the hubs wake each other through the database, not at
//! the end of a long-poll), a hub killed with SIGKILL mid-flight loses nothing (its nodes move
//! to the other hub and resync), every message runs exactly once, a producer following a feed
//! meanwhile reads every item once in order, and fences, cancels, releases,
//! revocations and membership changes made through one hub hold on the other. Skipped without PostgreSQL unless
//! `BATON_REQUIRE_POSTGRES=1`.

use crate::harness::{Api, Hub, submit_body};
use crate::node_failover::{assert_each_once, done_count, send_many};
use crate::node_harness::{NODE_WAIT, lines, long_turn, wait_for, wait_started};
use baton_testkit::pg::cluster_or_skip;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The long-poll both the nodes and the second hub allow: far longer than any wait below, so
/// a claim answered within `WOKEN_WITHIN` was woken, not timed out.
const LONG_POLL: &str = "240s";
/// How soon work sent through one hub must reach a node parked on the other: generous for a
/// loaded machine, and far below `LONG_POLL`.
const WOKEN_WITHIN: Duration = Duration::from_secs(60);

/// Two hubs on one record; `host-a` and `host-b` prefer the second hub and fall back to the
/// first. Work is sent through the first hub only.
#[test]
fn two_hubs_one_record_wake_each_other_and_a_killed_hub_loses_nothing() {
    let Some(cluster) = cluster_or_skip("two_hubs_one_record", false) else { return };
    let url = cluster.url();
    let first = Hub::builder().nodes(&["host-a", "host-b"]).producers(&["prod"]).postgres(&url).start();
    let mut second =
        Hub::builder().nodes(&[]).producers(&["prod-b"]).postgres(&url).ca_from(first.data_dir()).stopped().start();
    second.kit_mut().set_env("BATON_HUB_LONG_POLL_WAIT_MAX", LONG_POLL);
    second.serve(None);
    let hubs = format!("{},{}", second.url(), first.url());
    let node = |host: &str| {
        first
            .node_process(host)
            .then("sleep 0.2")
            .trace_ends()
            .env("BATON_NODE_HUB_URL", &hubs)
            .env("BATON_NODE_CLAIM_WAIT", LONG_POLL)
            .start()
    };
    let (a, b) = (node("host-a"), node("host-b"));

    // Parked on the second hub, the nodes are woken by what the first hub commits.
    let one = first.send_one("wake", "w1", "host-a");
    a.wait_idle();
    let two = first.send_one("wake", "w2", "host-a");
    wait_for("the second message's outcome, woken across hubs", WOKEN_WITHIN, || {
        first.deliveries().iter().any(|d| d["delivery_id"] == two.as_str() && !d["outcome"].is_null()).then_some(())
    });
    first.assert_one_attempt(&one, "succeeded");

    // A producer follows a conversation's feed through the first hub while both hubs commit
    // claims and handoffs at once (their events commit out of position order).
    let stop = Arc::new(AtomicBool::new(false));
    let follower = {
        let (api, stop) = (first.client("prod"), stop.clone());
        std::thread::spawn(move || follow_feed(&api, "conv-0", &stop))
    };

    // Mid-flight, the second hub is killed: the nodes move to the first and resync there.
    let mut expected = send_many(&first, 24, &["host-a", "host-b"]);
    for id in [&one, &two] {
        expected.insert(id.clone(), ("host-a".into(), "wake".into()));
    }
    let at_kill = wait_for("some outcomes before the kill", NODE_WAIT, || {
        let n = done_count(&first);
        (n >= 8).then_some(n)
    });
    second.kill9();
    let total = expected.len();
    wait_for("every delivery to have an outcome", NODE_WAIT, || (done_count(&first) == total).then_some(()));
    a.wait_idle();
    b.wait_idle();
    assert!(at_kill < total, "the kill happened mid-way ({at_kill} of {total} done)");
    assert_each_once(&first, &expected);
    // What the follower read as it happened is the feed read again from the start, item for
    // item: no item was passed over while an earlier one was still to commit, none repeated.
    stop.store(true, Ordering::SeqCst);
    let followed = follower.join().expect("the follower");
    let again = follow_feed(&first.client("prod"), "conv-0", &AtomicBool::new(true));
    assert!(again.len() >= 8 * 5, "every turn of conv-0 has its events: {again:#?}");
    assert_eq!(followed, again, "the feed followed live is the feed read afterwards");
    for node in [&a, &b] {
        let logs = node.logs();
        assert!(logs.contains(&format!("now using the hub at {}", first.url())), "the node moved:\n{logs}");
    }
}

/// Reads `conversation`'s events feed from its start as `api`'s producer, each read waiting
/// up to a second for more, until `stop` is set and a read then finds nothing new; returns
/// every item, as the hub wrote it, in the order read.
fn follow_feed(api: &Api, conversation: &str, stop: &AtomicBool) -> Vec<Value> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let (mut items, mut after) = (Vec::new(), String::new());
    loop {
        let stopping = stop.load(Ordering::SeqCst);
        let page = rt.block_on(api.get(&format!("/v1/conversations/{conversation}/events?wait_ms=1000{after}")));
        let page = page.ok(200);
        let events = page["events"].as_array().expect("events");
        items.extend(events.iter().cloned());
        after = format!("&after={}", page["next_cursor"].as_str().expect("next_cursor"));
        if stopping && events.is_empty() {
            return items;
        }
    }
}

/// PostgreSQL restarts (an immediate shutdown, every connection cut, then WAL recovery) while
/// two hubs and their nodes work: the hubs answer "storage unavailable" meanwhile, reconnect
/// when it is back, and every message still runs exactly once.
#[test]
fn postgres_restarting_under_load_loses_nothing() {
    let Some(mut cluster) = cluster_or_skip("postgres_restarting_under_load", false) else { return };
    let url = cluster.url();
    let first = Hub::builder().nodes(&["host-a", "host-b"]).producers(&["prod"]).postgres(&url).start();
    let second = Hub::builder().nodes(&[]).producers(&["prod-b"]).postgres(&url).ca_from(first.data_dir()).start();
    let hubs = format!("{},{}", second.url(), first.url());
    let node =
        |host: &str| first.node_process(host).then("sleep 0.2").trace_ends().env("BATON_NODE_HUB_URL", &hubs).start();
    let (a, b) = (node("host-a"), node("host-b"));
    let expected = send_many(&first, 24, &["host-a", "host-b"]);
    let at_restart = wait_for("some outcomes before the restart", NODE_WAIT, || {
        let n = done_count(&first);
        (n >= 8).then_some(n)
    });
    cluster.restart(Duration::from_secs(2)).unwrap_or_else(|e| panic!("{e:#}"));
    let total = expected.len();
    wait_for("every delivery to have an outcome", NODE_WAIT, || (done_count(&first) == total).then_some(()));
    a.wait_idle();
    b.wait_idle();
    assert!(at_restart < total, "the restart happened mid-way ({at_restart} of {total} done)");
    assert_each_once(&first, &expected);
    // The hub the nodes used was writing when the database went: it says it reconnected.
    let logs = second.serve_logs();
    assert!(logs.contains("connection was lost; reconnected"), "the hub says it reconnected:\n{logs}");
}

/// A fence set and lifted through one hub's CLI takes effect on the other hub at once: a node
/// parked on the second hub is handed nothing of a paused conversation, and the lift (committed
/// through the first hub's data directory) wakes it there without waiting for its long-poll.
#[test]
fn a_fence_set_and_lifted_through_one_hub_holds_and_wakes_the_other() {
    let Some(cluster) = cluster_or_skip("fence_across_hubs", false) else { return };
    let (first, second) = hub_pair(&cluster.url());
    let a = first
        .node_process("host-a")
        .trace_ends()
        .env("BATON_NODE_HUB_URL", &second.url())
        .env("BATON_NODE_CLAIM_WAIT", LONG_POLL)
        .start();
    let outcome_of = |id: &str, what: &str| {
        wait_for(what, NODE_WAIT, || {
            first.deliveries().iter().any(|d| d["delivery_id"] == id && !d["outcome"].is_null()).then_some(())
        })
    };
    let warm = first.send_one("warm", "w0", "host-a");
    outcome_of(&warm, "the first message's outcome");
    a.wait_idle();

    let fence = first.fence("pause", &["--conversation", "held"], "across hubs");
    let held = first.send_one("held", "h1", "host-a");
    // Other work still flows through the second hub while the paused conversation waits.
    let other = first.send_one("free", "f1", "host-a");
    wait_for("the unfenced message's outcome", WOKEN_WITHIN, || {
        first.deliveries().iter().any(|d| d["delivery_id"] == other.as_str() && !d["outcome"].is_null()).then_some(())
    });
    let state = |id: &str| {
        first.deliveries().into_iter().find(|d| d["delivery_id"] == id).map(|d| d["state"].clone()).expect("listed")
    };
    assert_eq!(state(&held), "queued", "the pause set through the first hub holds on the second");

    first.lift(fence);
    wait_for("the paused message's outcome after the lift, woken across hubs", WOKEN_WITHIN, || {
        first.deliveries().iter().any(|d| d["delivery_id"] == held.as_str() && !d["outcome"].is_null()).then_some(())
    });
    first.assert_one_attempt(&held, "succeeded");
    first.verify_ok();
}

/// A cancel and a release made through one hub's CLI take effect on the other hub at once: a
/// node parked on the second hub gets the cancel of its running turn (SIGTERM, reported
/// `cancelled`) and the released held delivery (run, `succeeded`) well within its long-poll, so
/// both were announced across hubs, not found when the poll timed out.
#[test]
fn a_cancel_and_a_release_through_one_hub_reach_a_node_on_the_other() {
    let Some(cluster) = cluster_or_skip("cancel_release_across_hubs", false) else { return };
    let (first, second) = hub_pair(&cluster.url());
    let signals = first.scratch("turn").join("signals");
    // Conversation `long` runs a turn that ends only on SIGTERM; every other one ends at once.
    let harness =
        format!("if [ \"$BATON_CONVERSATION\" = long ]; then\n{}\nfi\nexit 0", long_turn(&signals, "exit 143"));
    let a = first
        .node_process("host-a")
        .then(&harness)
        .set("cancel_grace", "\"30s\"")
        .env("BATON_NODE_HUB_URL", &second.url())
        .env("BATON_NODE_CLAIM_WAIT", LONG_POLL)
        .start();
    let outcome = |id: &str, what: &str, within: Duration| -> String {
        wait_for(what, within, || {
            first
                .deliveries()
                .into_iter()
                .find(|d| d["delivery_id"] == id && !d["outcome"].is_null())
                .map(|d| d["outcome"].as_str().unwrap_or_default().to_string())
        })
    };
    let warm = first.send_one("warm", "w0", "host-a");
    outcome(&warm, "the first message's outcome", NODE_WAIT);

    // A turn running on the node through the second hub, cancelled through the first.
    let long = first.send_one("long", "l1", "host-a");
    wait_started(&signals);
    first.cli_ok(["deliveries", "cancel", &long, "--reason", "across hubs"]);
    assert_eq!(outcome(&long, "the cancelled turn's outcome, woken across hubs", WOKEN_WITHIN), "cancelled");
    assert!(lines(&signals).contains(&"TERM".to_string()), "the harness got SIGTERM");

    // A delivery parked by a hold (set and lifted through the first hub) and released there.
    let fence = first.fence("hold", &["--conversation", "parked"], "across hubs");
    let parked = first.send_one("parked", "p1", "host-a");
    wait_for("the delivery to be held", WOKEN_WITHIN, || {
        first.deliveries().into_iter().find(|d| d["delivery_id"] == parked.as_str() && d["state"] == "held").map(drop)
    });
    first.lift(fence);
    a.wait_idle();
    first.cli_ok(["held", "release", &parked, "--force"]);
    assert_eq!(outcome(&parked, "the released delivery's outcome, woken across hubs", WOKEN_WITHIN), "succeeded");
    first.assert_one_attempt(&parked, "succeeded");
    first.verify_ok();
}

/// Two hubs on the record at `url`: the first with node `host-a` and producer `prod`, the
/// second (made from the first's CA) serving with the long-poll `LONG_POLL`.
fn hub_pair(url: &str) -> (Hub, Hub) {
    let first = Hub::builder().nodes(&["host-a"]).producers(&["prod"]).postgres(url).start();
    let mut second =
        Hub::builder().nodes(&[]).producers(&["prod-b"]).postgres(url).ca_from(first.data_dir()).stopped().start();
    second.kit_mut().set_env("BATON_HUB_LONG_POLL_WAIT_MAX", LONG_POLL);
    second.serve(None);
    (first, second)
}

/// A certificate revoked through one hub's CLI is refused by the other hub too: the revocation
/// is committed to the shared record and announced, the other hub drops its cached standing of
/// that certificate (at the announcement; at worst when the cached entry's `CERT_CACHE_TTL`
/// ends), and the revoked producer's requests there are refused (401 `certificate_revoked`)
/// while another producer's still pass; a refused submit adds nothing to the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_revoked_through_one_hub_is_refused_by_the_other() {
    let Some(cluster) = cluster_or_skip("revoke_across_hubs", false) else { return };
    let url = cluster.url();
    let first = Hub::builder().nodes(&["host-a"]).producers(&["prod", "prod-two"]).postgres(&url).start();
    let second = Hub::builder().nodes(&[]).producers(&["prod-b"]).postgres(&url).ca_from(first.data_dir()).start();
    let pem = |name: &str| first.identity(name).pem().expect("identity pem");
    let (revoked, other) = (second.client_with_pem(&pem("prod")), second.client_with_pem(&pem("prod-two")));
    // Both are served by the second hub, and the revoked one's standing is now cached there.
    revoked.submit_new("c", "before", &["host-a"]).await;
    other.submit_new("c", "other-before", &["host-a"]).await;

    let out = first.cli_ok(["revoke", "prod", "--reason", "laptop stolen", "--yes"]);
    assert!(out.contains("revoked 1"), "{out}");
    // Sent in the moment before the other hub heard of the revocation, a submit may still be
    // accepted: counted, so the record's contents can be checked exactly.
    let (mut accepted_late, mut n) = (0, 0);
    let deadline = std::time::Instant::now() + WOKEN_WITHIN;
    let refused = loop {
        n += 1;
        let body = submit_body("c", &format!("after-{n}"), serde_json::json!(n), &["host-a"]);
        // A connection the hub closed on the revocation is an error here; the next try reconnects.
        match revoked.try_post("/v1/messages", &body).await {
            Ok(r) if r.status == 401 => break r,
            Ok(r) => {
                assert_eq!(r.status, 201, "an answer other than accepted or revoked: {}", r.text);
                accepted_late += 1;
            }
            Err(_) => {}
        }
        assert!(std::time::Instant::now() < deadline, "the second hub still serves the revoked certificate");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    refused.err(401, "certificate_revoked");
    revoked.get("/v1/messages?idempotency_key=before").await.err(401, "certificate_revoked");
    other.submit_new("c", "other-after", &["host-a"]).await;
    assert_eq!(first.deliveries().len(), 3 + accepted_late, "a refused submit added nothing");
}

/// Membership changed through one hub's CLI routes the very next post through the other hub:
/// a post without `to` fans out to the members the record holds at its commit, whichever hub
/// takes it, and a post naming a host that left is refused there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changed_through_one_hub_routes_posts_through_the_other() {
    let Some(cluster) = cluster_or_skip("members_across_hubs", false) else { return };
    let url = cluster.url();
    let first = Hub::builder().nodes(&["host-a", "host-b"]).producers(&["prod"]).postgres(&url).start();
    let second = Hub::builder().nodes(&[]).producers(&["prod-b"]).postgres(&url).ca_from(first.data_dir()).start();
    let prod = second.client_with_pem(&first.identity("prod").pem().expect("identity pem"));
    let hosts = |s: &crate::harness::Submitted| {
        let mut h: Vec<String> = s.deliveries.keys().cloned().collect();
        h.sort();
        h
    };

    first.cli_ok(["members", "add", "--conversation", "team", "host-a", "host-b", "--reason", "pool"]);
    let both = prod.submit_new("team", "k1", &[]).await;
    assert_eq!(hosts(&both), ["host-a", "host-b"], "the members added through the first hub");
    first.cli_ok(["members", "remove", "--conversation", "team", "host-b", "--reason", "moved"]);
    let one = prod.submit_new("team", "k2", &[]).await;
    assert_eq!(hosts(&one), ["host-a"], "host-b left through the first hub");
    prod.submit("team", "k3", serde_json::json!({}), &["host-b"]).await.err(400, "invalid_field");
    assert_eq!(first.deliveries().len(), 3, "the refused post added nothing");
}
