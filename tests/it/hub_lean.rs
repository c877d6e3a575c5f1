//! The hub's hot path stays lean without giving anything up: a certificate's standing is cached
//! yet a revocation through the CLI refuses the very next request; waiting claims are woken
//! only for their own host, and a claim with nothing claimable opens no write transaction
//! (counted by `baton_hub_writer_jobs_total`), while claims stay exclusive.

use crate::harness::{Api, Claimed, EVENT_WAIT, Hub, Node, Resp, SETTLE};
use std::time::{Duration, Instant};

/// A counter's value on `/metrics` (it must be there: each one counted here was incremented
/// before it is read).
async fn metric(api: &Api, line_start: &str) -> f64 {
    let (value, text) = metric_listed(api, line_start).await;
    value.unwrap_or_else(|| panic!("/metrics has no {line_start}:\n{text}"))
}

/// A counter's value on `/metrics`, 0 while it was never incremented (it is not listed then).
async fn metric_or_zero(api: &Api, line_start: &str) -> f64 {
    metric_listed(api, line_start).await.0.unwrap_or(0.0)
}

/// The value of the `/metrics` line starting `line_start`, if listed, and the whole page.
async fn metric_listed(api: &Api, line_start: &str) -> (Option<f64>, String) {
    let r = api.get("/metrics").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let value = r
        .text
        .lines()
        .find_map(|l| l.strip_prefix(line_start).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.trim().parse::<f64>().unwrap_or_else(|e| panic!("{line_start}: {v:?}: {e}")));
    (value, r.text)
}

/// Writer jobs the hub ran so far, and the looks claims took.
async fn counts(api: &Api) -> (f64, f64) {
    (metric(api, "baton_hub_writer_jobs_total").await, metric(api, "baton_hub_claim_looks_total").await)
}

/// Waits (up to `EVENT_WAIT`) until claims took at least `n` looks in all.
async fn looks_reach(api: &Api, n: f64) {
    let deadline = Instant::now() + EVENT_WAIT;
    loop {
        let (_, looks) = counts(api).await;
        if looks >= n {
            return;
        }
        assert!(Instant::now() < deadline, "claims took {looks} looks, not {n}, within {EVENT_WAIT:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cli_revocation_refuses_the_very_next_request_although_standing_is_cached() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let s = prod.submit_new("c", "k1", &["host-a", "host-b"]).await;
    // Many requests of the same certificate: its standing is served from the cache.
    for _ in 0..20 {
        prod.get("/v1/messages?idempotency_key=k1").await.ok(200);
    }
    let hits = metric(&prod, "baton_hub_cert_cache_total{result=\"hit\"}").await;
    assert!(hits >= 20.0, "the certificate's standing was not cached: {hits} hits");
    let node_a = hub.node("host-a", "inst-a");
    let first = node_a.claim(1, 0).await;
    assert_eq!(first.len(), 1);
    let node_b = hub.node("host-b", "inst-b");
    assert_eq!(node_b.claim(1, 0).await.len(), 1, "host-b works before its revocation");

    // Waiting when their certificates are revoked: a claim of host-b, and a read of prod-two.
    let parked = node_b.clone();
    let poll = tokio::spawn(async move { parked.claim_raw(10, crate::harness::LONG_WAIT_MS).await });
    let reader = hub.client("prod-two");
    let mine = reader.submit_new("c-two", "k-two", &["host-a"]).await;
    let read_path = format!("/v1/messages/{}?wait_ms={}", mine.message_id, crate::harness::LONG_WAIT_MS);
    let waiting_read = tokio::spawn(async move { reader.get(&read_path).await });
    tokio::time::sleep(SETTLE).await;

    hub.cli_ok(["revoke", "prod", "--reason", "laptop stolen", "--yes"]);
    // The very next request of that certificate is refused: on the connection the cache was
    // warmed through (unless the hub closed it first) and on a new one.
    match prod.try_get("/v1/messages?idempotency_key=k1").await {
        Ok(r) => {
            r.err(401, "certificate_revoked");
        }
        Err(e) => eprintln!("the revoked certificate's connection was closed: {e}"),
    }
    hub.client("prod").get("/v1/messages?idempotency_key=k1").await.err(401, "certificate_revoked");
    hub.cli_ok(["revoke", "host-b", "--reason", "host compromised", "--yes"]);
    hub.node("host-b", "inst-b").claim_raw(1, 0).await.err(401, "certificate_revoked");
    hub.cli_ok(["revoke", "prod-two", "--reason", "rotated", "--yes"]);
    hub.client("prod-two").get(&format!("/v1/messages/{}", mine.message_id)).await.err(401, "certificate_revoked");

    // Work for host-b after its revocation: the claim that was waiting hands none of it out.
    hub.cli_ok([
        "send",
        "--conversation",
        "c3",
        "--key",
        "kb",
        "--payload",
        "{}",
        "--to",
        "host-b",
        "--producer",
        "desk",
    ]);
    let r = tokio::time::timeout(EVENT_WAIT, poll).await.expect("the waiting claim answered").expect("claim task");
    let handed = if r.status == 200 { Claimed::list(&r.body).len() } else { 0 };
    assert_eq!(handed, 0, "a revoked certificate was handed work: {}", r.text);

    // host-a is unaffected; its run of prod-two's message settles, and prod-two's waiting read
    // answers 401, not the message.
    node_a.mirror_and_ack(&first[0]).await;
    assert_eq!(hub.state(s.to("host-a")), "delivered");
    let two = node_a.claim(1, 0).await;
    assert_eq!(two.len(), 1);
    node_a.mirror_and_ack(&two[0]).await;
    node_a.report(&two[0], "r-two", "succeeded", 0).await.ok(201);
    let r = tokio::time::timeout(EVENT_WAIT, waiting_read).await.expect("the waiting read answered").expect("read");
    r.err(401, "certificate_revoked");
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_claims_wake_per_host_and_a_claim_with_nothing_to_claim_writes_nothing() {
    const OTHER_HOSTS: usize = 10;
    const PARKED_PER_HOST: usize = 5;
    const SUBMITS: usize = 100;
    let others: Vec<String> = (1..=OTHER_HOSTS).map(|i| format!("host-{i:02}")).collect();
    let mut names: Vec<&str> = vec!["host-a"];
    names.extend(others.iter().map(String::as_str));
    let hub =
        Hub::builder().nodes(&names).producers(&["prod"]).config("[limits]\nlong_poll_wait_max = \"55s\"\n").start();
    let prod = hub.client("prod");
    // Each host binds its instance first (a binding is a write, once).
    for h in &names {
        assert!(hub.node(h, "inst").claim(1, 0).await.is_empty());
    }
    // 50 claims of the other hosts wait.
    let mut parked = Vec::new();
    for h in &others {
        let node = hub.node(h, "inst");
        for _ in 0..PARKED_PER_HOST {
            let n = node.clone();
            parked.push((h.clone(), tokio::spawn(async move { n.claim_raw(1, 50_000).await })));
        }
    }
    // Every one of them has looked (one look per binding claim, one per parked claim).
    let parked_looks = (names.len() + parked.len()) as f64;
    looks_reach(&prod, parked_looks).await;
    tokio::time::sleep(SETTLE).await;

    let (before, looks_before) = counts(&prod).await;
    for i in 0..SUBMITS {
        prod.submit_new("c", &format!("k{i}"), &["host-a"]).await;
    }
    let (after_submits, looks) = counts(&prod).await;
    // Each submit is an accept and a fan-out; woken claims of other hosts would add a look
    // (and before, a write job) each per submit: 5,000 here. Generous bounds, not a time.
    let bound = (SUBMITS * 4) as f64;
    assert!(
        after_submits - before <= bound,
        "{} writer jobs for {SUBMITS} submits to one host with {} claims of other hosts waiting (bound {bound})",
        after_submits - before,
        parked.len()
    );
    assert!(
        looks - looks_before <= 10.0,
        "claims of other hosts looked {} times while one host gained work",
        looks - looks_before
    );
    assert!(parked.iter().all(|(_, p)| !p.is_finished()), "a claim of another host answered");

    // A change that concerns every host (a CLI change) wakes every waiting claim; with nothing
    // claimable for them, each only reads.
    let fence = hub.fence("pause", &["--conversation", "unrelated"], "wake everyone");
    hub.lift(fence);
    // The change for every host wakes every waiting claim: each looks again.
    looks_reach(&prod, looks + parked.len() as f64).await;
    tokio::time::sleep(SETTLE).await;
    let (after_wakes, _) = counts(&prod).await;
    assert!(
        after_wakes - after_submits <= 10.0,
        "{} writer jobs after waking {} claims with nothing to claim",
        after_wakes - after_submits,
        parked.len()
    );

    // A submit to one of them wakes that host's claims; exactly one gets the delivery.
    let target = &others[2];
    let started = Instant::now();
    let s = prod.submit_new("c-target", "k-target", &[target]).await;
    let mut got = Vec::new();
    let deadline = Instant::now() + EVENT_WAIT;
    while got.is_empty() && Instant::now() < deadline {
        for (h, p) in &parked {
            if h == target && p.is_finished() {
                got.push(h.clone());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!got.is_empty(), "no claim of {target} was woken within {:?}", started.elapsed());
    let mut handed = Vec::new();
    let mut still = Vec::new();
    for (h, p) in parked {
        if p.is_finished() {
            let r = p.await.expect("claim task");
            assert_eq!(&h, target, "a claim of {h} answered: {}", r.text);
            handed.extend(Claimed::list(r.ok(200)));
        } else {
            still.push(h);
        }
    }
    assert_eq!(handed.len(), 1, "the delivery was handed out exactly once");
    assert_eq!(handed[0].delivery_id, s.to(target));
    assert_eq!(still.len(), OTHER_HOSTS * PARKED_PER_HOST - 1);
    // host-a's work is all there for it.
    let claimed = hub.node("host-a", "inst").claim(64, 0).await;
    assert_eq!(claimed.len(), 64);
}

/// A claim of `node` waiting (long-poll), once claims took `looks` looks in all.
async fn parked_claim(node: &Node, prod: &Api, looks: f64) -> tokio::task::JoinHandle<Resp> {
    let n = node.clone();
    let poll = tokio::spawn(async move { n.claim_raw(10, crate::harness::LONG_WAIT_MS).await });
    looks_reach(prod, looks).await;
    tokio::time::sleep(SETTLE).await;
    poll
}

/// A waiting claim stands with the writer: the accept that gives its host work claims for it in
/// the accept's own transaction (`baton_hub_claims_at_commit_total`), without a look of its own.
/// One that finds nothing claimable there (its conversation paused) keeps waiting, and the
/// lift hands the work out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_is_served_in_the_transaction_of_the_accept_that_gives_it_work() {
    const AT_COMMIT: &str = "baton_hub_claims_at_commit_total";
    let hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-a");
    assert!(node.claim(1, 0).await.is_empty(), "binds the instance");
    let poll = parked_claim(&node, &prod, 2.0).await;
    let (_, looks) = counts(&prod).await;
    let served = metric_or_zero(&prod, AT_COMMIT).await;
    let s = prod.submit_new("c", "k1", &["host-a"]).await;
    let r = tokio::time::timeout(EVENT_WAIT, poll).await.expect("the waiting claim answered").expect("claim task");
    let got = Claimed::list(r.ok(200));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].delivery_id, s.to("host-a"));
    assert_eq!(metric_or_zero(&prod, AT_COMMIT).await - served, 1.0, "the accept's transaction claimed it");
    assert_eq!(counts(&prod).await.1, looks, "the waiting claim looked again");
    // Every write job's wait for the writer is measured (the accept's at least).
    let waits = metric(&prod, "baton_hub_write_queue_wait_seconds_count").await;
    assert!(waits >= 1.0, "no write job's wait was recorded: {waits}");
    assert_eq!(hub.state(s.to("host-a")), "claimed");

    // Nothing claimable in the accept's transaction: the claim keeps waiting.
    let fence = hub.fence("pause", &["--conversation", "c-paused"], "not yet");
    let poll = parked_claim(&node, &prod, looks + 1.0).await;
    let paused = prod.submit_new("c-paused", "k2", &["host-a"]).await;
    let deadline = Instant::now() + EVENT_WAIT;
    while metric_or_zero(&prod, AT_COMMIT).await - served < 2.0 {
        assert!(Instant::now() < deadline, "the accept of a paused conversation's message took no standing claim");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(SETTLE).await;
    assert!(!poll.is_finished(), "a claim answered with nothing claimable");
    hub.lift(fence);
    let r = tokio::time::timeout(EVENT_WAIT, poll).await.expect("the lift woke the claim").expect("claim task");
    let got = Claimed::list(r.ok(200));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].delivery_id, paused.to("host-a"));
    hub.verify_ok();
}
