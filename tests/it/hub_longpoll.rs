//! Long-polls: a claim (or a producer read) that asked to wait `LONG_WAIT_MS` must answer
//! within `WAKE_MAX` of the event it waits for, whichever way the event happens. The event is
//! caused `SETTLE` after the poll started, and the answer must carry the work, so a poll that
//! returned before the event (empty) or at the end of its wait (too slow) both fail. The time is
//! counted from the event (once its cause returned), so a slow cause (a CLI process on a loaded
//! machine) does not count against the wake-up.

use crate::harness::{Claimed, Hub, LONG_WAIT_MS, Node, SETTLE, WAKE_MAX, timed};
use std::time::{Duration, Instant};

/// Runs `f` and returns its result with the moment it finished.
async fn finished_at<F: std::future::Future>(f: F) -> (F::Output, Instant) {
    let r = f.await;
    (r, Instant::now())
}

/// Starts a claim that waits up to `LONG_WAIT_MS`, runs `cause` after `SETTLE`, and asserts the
/// claim answered with exactly the delivery ids `cause` returns, within `WAKE_MAX` of being asked.
async fn check_wakes<F, Fut>(node: &Node, cause: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Vec<String>>,
{
    let n = node.clone();
    let poll = tokio::spawn(async move { finished_at(n.claim(10, LONG_WAIT_MS)).await });
    tokio::time::sleep(SETTLE).await;
    assert!(!poll.is_finished(), "the claim answered before there was anything to claim");
    let expect = cause().await;
    let caused = Instant::now();
    let (got, answered) = poll.await.expect("claim task");
    let ids: Vec<String> = got.iter().map(|c: &Claimed| c.delivery_id.clone()).collect();
    assert_eq!(ids, expect, "the woken claim hands out the new work");
    let took = answered.saturating_duration_since(caused);
    assert!(took < WAKE_MAX, "the claim answered {took:?} after the work arrived; it was not woken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_wakes_when_a_message_is_submitted() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-1");
    check_wakes(&node, || async { vec![prod.submit_new("c", "k", &["host-a"]).await.to("host-a").to_string()] }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_wakes_when_the_cli_sends() {
    let hub = Hub::start();
    let node = hub.node("host-a", "inst-1");
    check_wakes(&node, || async {
        let sent = hub.cli_json([
            "send",
            "--conversation",
            "c",
            "--to",
            "host-a",
            "--key",
            "by-hand",
            "--payload",
            r#"{"x":1}"#,
            "--json",
        ]);
        vec![sent["deliveries"][0]["delivery_id"].as_str().unwrap().to_string()]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_wakes_when_a_pause_is_lifted() {
    let hub = Hub::start();
    let node = hub.node("host-a", "inst-1");
    let fence = hub.fence("pause", &["--conversation", "c"], "hold on");
    let s = hub.client("prod").submit_new("c", "k", &["host-a"]).await;
    check_wakes(&node, || async {
        hub.lift(fence);
        vec![s.to("host-a").to_string()]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_wakes_when_a_held_delivery_is_released() {
    let hub = Hub::start();
    let node = hub.node("host-a", "inst-1");
    let fence = hub.fence("hold", &["--conversation", "c"], "look first");
    let s = hub.client("prod").submit_new("c", "k", &["host-a"]).await;
    let id = s.to("host-a").to_string();
    assert!(node.claim(10, 0).await.is_empty());
    assert_eq!(hub.state(&id), "held");
    hub.lift(fence);
    check_wakes(&node, || async {
        hub.cli_ok(["held", "release", &id]);
        vec![id.clone()]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_claim_waits_for_its_wait_ms() {
    let hub = Hub::start();
    let node = hub.node("host-a", "inst-1");
    let (got, took) = timed(node.claim(10, 1000)).await;
    assert!(got.is_empty());
    assert!(took >= Duration::from_millis(900), "the claim returned after {took:?}; it asked to wait 1000 ms");
    // wait_ms 0 (or absent) answers at once; nothing to assert about its speed, only its answer.
    assert!(node.claim(10, 0).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_read_wakes_when_the_report_lands() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-1");
    let s = prod.submit_new("c", "k", &["host-a"]).await;
    let c = node.claim(1, 0).await.remove(0);
    node.mirror_and_ack(&c).await;

    let p = prod.clone();
    let path = format!("/v1/messages/{}?wait_ms={LONG_WAIT_MS}", s.message_id);
    let poll = tokio::spawn(async move { finished_at(p.get(&path)).await });
    tokio::time::sleep(SETTLE).await;
    assert!(!poll.is_finished(), "the read answered before the outcome landed");
    node.report(&c, "rep-1", "succeeded", 0).await.ok(201);
    let reported = Instant::now();
    let (view, answered) = poll.await.expect("read task");
    let took = answered.saturating_duration_since(reported);
    let attempts = view.ok(200)["deliveries"][0]["attempts"].as_array().unwrap().clone();
    assert_eq!(attempts.len(), 1, "the woken read carries the outcome");
    assert_eq!(attempts[0]["outcome"], "succeeded");
    assert!(took < WAKE_MAX, "the read answered {took:?} after the report landed; it was not woken");

    // By key, the same long-poll returns at once now that everything is settled.
    let by_key = prod.get(&format!("/v1/messages?idempotency_key=k&wait_ms={LONG_WAIT_MS}")).await;
    assert_eq!(by_key.ok(200)["deliveries"][0]["attempts"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_waits_no_longer_than_the_configured_maximum() {
    let hub = Hub::builder().config("[limits]\nlong_poll_wait_max = \"1s\"\n").start();
    let node = hub.node("host-a", "inst-1");
    // It asks for 20 s; limits.long_poll_wait_max caps it at 1 s. Ten seconds is far above the
    // cap and far below the 20 s asked for.
    let (got, took) = timed(node.claim(10, LONG_WAIT_MS)).await;
    assert!(got.is_empty());
    assert!(took >= Duration::from_millis(900), "returned after {took:?}, before the 1 s cap");
    assert!(took < Duration::from_secs(10), "waited {took:?}: limits.long_poll_wait_max = 1s was not applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_read_wakes_when_the_operator_cancels() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let s = prod.submit_new("c", "k", &["host-a"]).await;
    let p = prod.clone();
    let path = format!("/v1/messages/{}?wait_ms={LONG_WAIT_MS}", s.message_id);
    let poll = tokio::spawn(async move { finished_at(p.get(&path)).await });
    tokio::time::sleep(SETTLE).await;
    assert!(!poll.is_finished(), "the read answered before anything settled");
    hub.cli_ok(["deliveries", "cancel", s.to("host-a"), "--reason", "stop"]);
    let cancelled = Instant::now();
    let (view, answered) = poll.await.expect("read task");
    assert_eq!(view.ok(200)["deliveries"][0]["state"], "failed");
    let took = answered.saturating_duration_since(cancelled);
    assert!(took < WAKE_MAX, "the read answered {took:?} after the cancel; it was not woken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_returns_when_the_hub_shuts_down() {
    let mut hub = Hub::start();
    let node = hub.node("host-a", "inst-1");
    let n = node.clone();
    let poll = tokio::spawn(async move {
        finished_at(
            n.api.try_post("/v1/claims", &serde_json::json!({"instance_id": "inst-1", "wait_ms": LONG_WAIT_MS})),
        )
        .await
    });
    tokio::time::sleep(SETTLE).await;
    let signalled = Instant::now();
    let status = hub.terminate();
    assert!(status.success(), "SIGTERM is a clean shutdown: {status}");
    let (r, answered) = poll.await.expect("claim task");
    let took = answered.saturating_duration_since(signalled);
    assert!(took < WAKE_MAX, "the claim answered {took:?} after SIGTERM: shutdown did not end the long-poll");
    // Either an empty answer or a 503 saying the hub is shutting down; never work.
    if let Ok(r) = r {
        assert!((r.status == 200 && Claimed::list(&r.body).is_empty()) || r.status == 503, "{} {}", r.status, r.text);
    }
}

/// Submits a turn that may be retried (`max_attempts` 3) and a plain one after it in the same
/// conversation; claims, mirrors and acks the first. The second waits behind it (the retry
/// barrier: the first's retry would come back before it). Returns the first, claimed, and the
/// second's delivery id.
async fn behind_a_retryable_turn(hub: &Hub, node: &Node) -> (Claimed, String) {
    let prod = hub.client("prod");
    let mut first = crate::harness::submit_body("c", "k1", serde_json::json!({}), &["host-a"]);
    first["max_attempts"] = serde_json::json!(3);
    prod.post("/v1/messages", &first).await.ok(201);
    let second = prod.submit_new("c", "k2", &["host-a"]).await.to("host-a").to_string();
    let got = node.claim(10, 0).await;
    assert_eq!(got.len(), 1, "the turn after a retryable one waits for its outcome");
    let c = got.into_iter().next().unwrap();
    node.mirror_and_ack(&c).await;
    assert!(node.claim(10, 0).await.is_empty(), "still behind the running retryable turn");
    (c, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_wakes_when_a_report_lifts_the_retry_barrier() {
    let hub = Hub::start();
    let node = hub.node("host-a", "inst-1");
    let (c, second) = behind_a_retryable_turn(&hub, &node).await;
    check_wakes(&node, || async {
        node.report(&c, "rep-1", "succeeded", 0).await.ok(201);
        vec![second.clone()]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_wakes_when_a_batch_report_lifts_the_retry_barrier() {
    let hub = Hub::start();
    let node = hub.node("host-a", "inst-1");
    let (c, second) = behind_a_retryable_turn(&hub, &node).await;
    check_wakes(&node, || async {
        let body = serde_json::json!({"reports": [node.report_body(&c, "rep-1", "succeeded", 0)]});
        let r = node.api.post("/v1/batch/reports", &body).await;
        assert_eq!(r.ok(200)["results"][0]["status"], 201, "{:?}", r.body);
        vec![second.clone()]
    })
    .await;
}
