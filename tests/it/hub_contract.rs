//! The SPEC §2 state machine through the real API and CLI: every allowed transition, the
//! refused ones, idempotent repeats, operator moves, idempotent accept, reports, and the
//! one-instance-per-host binding.

use crate::harness::{Claimed, Hub, Node, OPERATOR, random_id};
use serde_json::{Value, json};

type Event = (Option<String>, String, String, String);

/// One expected event: (from, to, actor kind, actor).
fn ev(from: Option<&str>, to: &str, kind: &str, actor: &str) -> Event {
    (from.map(str::to_string), to.to_string(), kind.to_string(), actor.to_string())
}

fn created() -> Event {
    ev(None, "queued", "hub", "hub")
}

/// Claims exactly the deliveries of `ids`, in that order, as `node`.
async fn claim_exactly(node: &Node, max: u32, ids: &[&str]) -> Vec<Claimed> {
    let got = node.claim(max, 0).await;
    let got_ids: Vec<&str> = got.iter().map(|c| c.delivery_id.as_str()).collect();
    assert_eq!(got_ids, ids, "claim handed out the wrong deliveries");
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_mirror_ack_report_walks_the_happy_path() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-1");

    let sub = prod.submit("talk", "k-1", json!({"text": "hello"}), &["host-a"]).await;
    let body = sub.ok(201);
    assert_eq!(body["duplicate"], false);
    assert_eq!(body["seq"], 1);
    assert_eq!(body["deliveries"].as_array().unwrap().len(), 1);
    assert_eq!(body["deliveries"][0]["host"], "host-a");
    assert_eq!(body["deliveries"][0]["state"], "queued");
    let message_id = body["message_id"].as_str().unwrap().to_string();
    let id = body["deliveries"][0]["delivery_id"].as_str().unwrap().to_string();
    assert_eq!(hub.state(&id), "queued");

    let c = claim_exactly(&node, 10, &[&id]).await.remove(0);
    assert_eq!((c.message_id.as_str(), c.conversation.as_str(), c.seq), (message_id.as_str(), "talk", 1));
    assert_eq!(c.payload, json!({"text": "hello"}));
    assert_eq!(c.state, "claimed");
    assert!(c.claim_token.len() >= 16, "claim token looks guessable: {:?}", c.claim_token);
    assert_eq!(hub.state(&id), "claimed");
    assert_eq!(hub.show(&id)["delivery"]["instance_id"], "inst-1");

    let m = node.mirrored(&c).await;
    assert_eq!(m.ok(200), &json!({"delivery_id": id, "state": "mirrored", "changed": true}));
    let m2 = node.mirrored(&c).await;
    assert_eq!(m2.ok(200), &json!({"delivery_id": id, "state": "mirrored", "changed": false}));
    assert_eq!(hub.state(&id), "mirrored");

    let a = node.ack(&c).await;
    assert_eq!(a.ok(200), &json!({"delivery_id": id, "state": "delivered", "changed": true}));
    let a2 = node.ack(&c).await;
    assert_eq!(a2.ok(200), &json!({"delivery_id": id, "state": "delivered", "changed": false}));

    // Delivered without an outcome is still held by the instance (it must run and report it).
    let held = node.holdings().await;
    assert_eq!(held.len(), 1);
    assert_eq!((held[0].delivery_id.as_str(), held[0].state.as_str()), (id.as_str(), "delivered"));
    assert_eq!(held[0].claim_token, c.claim_token);

    let r = node.report(&c, "rep-1", "succeeded", 0).await;
    let body = r.ok(201);
    assert_eq!(body["duplicate"], false);
    assert_eq!(body["delivery_id"], id.as_str());
    assert_eq!(body["attempt"]["outcome"], "succeeded");
    assert_eq!(body["attempt"]["exit_code"], 0);
    assert_eq!(body["attempt"]["report_id"], "rep-1");
    assert!(node.holdings().await.is_empty(), "a delivery with an outcome is no longer held");

    // The event log has exactly one event per transition; the repeats added none.
    assert_eq!(
        hub.events(&id),
        vec![
            created(),
            ev(Some("queued"), "claimed", "node", "host-a"),
            ev(Some("claimed"), "mirrored", "node", "host-a"),
            ev(Some("mirrored"), "delivered", "node", "host-a"),
        ]
    );
    let shown = hub.show(&id);
    assert_eq!(shown["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(shown["delivery"]["outcome"], "succeeded");

    let view = prod.message(&message_id).await;
    let v = view.ok(200);
    assert_eq!((v["conversation"].as_str(), v["seq"].as_i64()), (Some("talk"), Some(1)));
    assert_eq!((v["producer"].as_str(), v["idempotency_key"].as_str()), (Some("prod"), Some("k-1")));
    assert_eq!(v["payload"], json!({"text": "hello"}));
    assert_eq!(v["deliveries"][0]["state"], "delivered");
    assert_eq!(v["deliveries"][0]["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(v["deliveries"][0]["attempts"][0]["result"], "done");
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_moves_are_refused_and_change_nothing() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-1");
    let s = prod.submit_new("c", "k", &["host-a"]).await;
    let id = s.to("host-a").to_string();
    let c = claim_exactly(&node, 1, &[&id]).await.remove(0);

    // claimed: ack and report are not yet allowed.
    node.ack(&c).await.err(409, "invalid_transition");
    node.report(&c, "r-early", "succeeded", 0).await.err(409, "invalid_transition");
    assert_eq!(hub.state(&id), "claimed");

    node.mirrored(&c).await.ok(200);
    // mirrored: a report is still not allowed.
    node.report(&c, "r-early-2", "succeeded", 0).await.err(409, "invalid_transition");
    assert_eq!(hub.state(&id), "mirrored");

    node.ack(&c).await.ok(200);
    // delivered: a reject is not allowed; a repeated mirrored is a no-op.
    node.reject(&c, "too late").await.err(409, "invalid_transition");
    let m = node.mirrored(&c).await;
    assert_eq!(m.ok(200)["changed"], false);
    assert_eq!(hub.state(&id), "delivered");
    // A delivered delivery's cancel is asked of its node: no transition, no attempt yet.
    let out = hub.cli_ok(["deliveries", "cancel", &id, "--reason", "nope"]);
    assert!(out.contains("requested"), "{out}");
    assert_eq!(hub.state(&id), "delivered");
    assert_eq!(hub.events(&id).len(), 4, "a cancel request adds no delivery event: {:?}", hub.events(&id));
    assert!(hub.show(&id)["attempts"].as_array().unwrap().is_empty());

    // A wrong claim token is a stale claim, for every holder call.
    let mut forged = c.clone();
    forged.claim_token = "0123456789abcdef0123456789abcdef".into();
    node.mirrored(&forged).await.err(409, "stale_claim");
    node.ack(&forged).await.err(409, "stale_claim");
    node.report(&forged, "r-forged", "succeeded", 0).await.err(409, "stale_claim");
    hub.verify_ok();
}

/// The holder rejects a delivery it holds in `state` (claimed or mirrored): it fails with the
/// node's reason; repeating the reject is a no-op; the delivery can no longer move.
async fn check_reject(state: &str) {
    let hub = Hub::start();
    let node = hub.node("host-a", "inst-1");
    let s = hub.client("prod").submit_new("c", "k", &["host-a"]).await;
    let id = s.to("host-a").to_string();
    let c = claim_exactly(&node, 1, &[&id]).await.remove(0);
    if state == "mirrored" {
        node.mirrored(&c).await.ok(200);
    }
    let r = node.reject(&c, "payload is not for me").await;
    assert_eq!(r.ok(200), &json!({"delivery_id": id, "state": "failed", "changed": true}), "reject from {state}");
    let (st, reason) = hub.state_reason(&id);
    assert_eq!(st, "failed");
    let reason = reason.expect("a failed delivery has a reason");
    assert!(reason.contains("payload is not for me"), "reason names the node's reason: {reason}");
    assert_eq!(hub.events(&id).last().unwrap(), &ev(Some(state), "failed", "node", "host-a"));
    let again = node.reject(&c, "payload is not for me").await;
    assert_eq!(again.ok(200)["changed"], false, "a repeated reject is a no-op");
    node.mirrored(&c).await.err(409, "stale_claim");
    node.ack(&c).await.err(409, "stale_claim");
    assert!(node.holdings().await.is_empty());
    let ev_count = hub.events(&id).len();
    assert_eq!(ev_count, if state == "mirrored" { 4 } else { 3 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_fails_a_claimed_delivery() {
    check_reject("claimed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_fails_a_mirrored_delivery() {
    check_reject("mirrored").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_cancel_fails_queued_held_claimed_and_mirrored() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-1");

    // held: parked by a hold fence at claim time.
    let fence = hub.fence("hold", &["--conversation", "parked"], "maintenance");
    let h = prod.submit_new("parked", "h", &["host-a"]).await;
    assert!(node.claim(10, 0).await.is_empty());
    hub.lift(fence);
    // claimed and mirrored.
    let c1 = prod.submit_new("c", "c1", &["host-a"]).await;
    let m1 = prod.submit_new("c", "m1", &["host-a"]).await;
    let claimed = claim_exactly(&node, 2, &[c1.to("host-a"), m1.to("host-a")]).await;
    node.mirrored(&claimed[1]).await.ok(200);
    // queued.
    let q1 = prod.submit_new("c", "q1", &["host-a"]).await;

    for (sub, from) in [(&h, "held"), (&q1, "queued"), (&c1, "claimed"), (&m1, "mirrored")] {
        let id = sub.to("host-a");
        assert_eq!(hub.state(id), from);
        let out = hub.cli_ok(["deliveries", "cancel", id, "--reason", "wrong recipient"]);
        assert!(out.contains(id), "cancel says what it cancelled: {out}");
        let (st, reason) = hub.state_reason(id);
        assert_eq!(st, "failed", "cancel from {from}");
        assert_eq!(reason.as_deref(), Some("cancelled: wrong recipient"));
        assert_eq!(hub.events(id).last().unwrap(), &ev(Some(from), "failed", "operator", OPERATOR));
    }
    // The node's late calls on cancelled deliveries are stale claims.
    node.mirrored(&claimed[0]).await.err(409, "stale_claim");
    node.ack(&claimed[1]).await.err(409, "stale_claim");
    assert!(node.holdings().await.is_empty());
    // Cancelling again changes nothing and answers the same.
    let events = hub.events(q1.to("host-a")).len();
    let out = hub.cli_ok(["deliveries", "cancel", q1.to("host-a"), "--reason", "again"]);
    assert!(out.contains("cancelled"), "{out}");
    assert_eq!(hub.events(q1.to("host-a")).len(), events);
    // An unknown delivery: exit 1.
    let out = hub.cli(["deliveries", "cancel", &random_id(), "--reason", "x"]);
    assert_eq!(out.status.code(), Some(1), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_release_one_and_a_whole_conversation() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-1");
    let fence = hub.fence("hold", &["--conversation", "h"], "inspect first");
    let subs = [
        prod.submit_new("h", "k1", &["host-a"]).await,
        prod.submit_new("h", "k2", &["host-a"]).await,
        prod.submit_new("h", "k3", &["host-a"]).await,
    ];
    let ids: Vec<&str> = subs.iter().map(|s| s.to("host-a")).collect();
    assert!(node.claim(10, 0).await.is_empty(), "held deliveries are not handed out");
    for id in &ids {
        let (st, reason) = hub.state_reason(id);
        assert_eq!(st, "held");
        let reason = reason.unwrap_or_default();
        assert!(reason.contains(&format!("fence {fence}")) && reason.contains("inspect first"), "{reason}");
        assert_eq!(hub.events(id).last().unwrap(), &ev(Some("queued"), "held", "hub", "hub"));
    }
    let listed = hub.cli_json(["held", "list", "--json"]);
    assert_eq!(listed.as_array().unwrap().len(), 3);

    // Release one. The hold is still active, so the release needs --force (without it, it is
    // refused naming the fence).
    assert_eq!(hub.cli(["held", "release", ids[0], "--reason", "looked fine"]).status.code(), Some(2));
    hub.cli_ok(["held", "release", ids[0], "--force", "--reason", "looked fine"]);
    assert_eq!(hub.state(ids[0]), "queued");
    assert_eq!(hub.events(ids[0]).last().unwrap(), &ev(Some("held"), "queued", "operator", OPERATOR));
    let listed = hub.cli_json(["held", "list", "--json"]);
    let still: Vec<&str> = listed.as_array().unwrap().iter().map(|d| d["delivery_id"].as_str().unwrap()).collect();
    assert_eq!(still, &ids[1..]);
    // Releasing a delivery that is not held is refused (exit 2); an unknown one is not found (1).
    assert_eq!(hub.cli(["held", "release", ids[0]]).status.code(), Some(2));
    assert_eq!(hub.cli(["held", "release", &random_id()]).status.code(), Some(1));

    // Release the rest of the conversation.
    let out = hub.cli_ok(["held", "release", "--conversation", "h", "--force", "--reason", "all fine"]);
    assert!(out.contains("released 2"), "{out}");
    for id in &ids {
        assert_eq!(hub.state(id), "queued");
    }
    // Nothing left to release: exit 1.
    assert_eq!(hub.cli(["held", "release", "--conversation", "h"]).status.code(), Some(1));

    // Released deliveries are claimable once the hold is lifted, oldest first.
    hub.lift(fence);
    claim_exactly(&node, 10, &ids).await;
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retire_fails_waiting_and_claimed_work_and_makes_mirrored_unknown() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-1");
    // A held delivery (parked by the claim below), and a delivered one without an outcome.
    let hold = hub.fence("hold", &["--conversation", "parked"], "h");
    let h = prod.submit_new("parked", "h", &["host-a"]).await;
    let d0 = prod.submit_new("c", "d0", &["host-a"]).await;
    let c0 = claim_exactly(&node, 1, &[d0.to("host-a")]).await.remove(0);
    hub.lift(hold);
    assert_eq!(hub.state(h.to("host-a")), "held");
    node.mirror_and_ack(&c0).await;
    // mirrored, claimed, queued; and one for host-b that retire must not touch.
    let m1 = prod.submit_new("c", "m1", &["host-a", "host-b"]).await;
    let c1 = prod.submit_new("c", "c1", &["host-a"]).await;
    let claimed = claim_exactly(&node, 2, &[m1.to("host-a"), c1.to("host-a")]).await;
    node.mirrored(&claimed[0]).await.ok(200);
    let q1 = prod.submit_new("c", "q1", &["host-a"]).await;

    let out = hub.cli_ok(["retire", "host-a", "--reason", "decommissioned", "--yes"]);
    assert!(out.contains("3 failed") && out.contains("1 unknown"), "{out}");

    for (id, from, to) in [
        (m1.to("host-a"), "mirrored", "unknown"),
        (c1.to("host-a"), "claimed", "failed"),
        (q1.to("host-a"), "queued", "failed"),
        (h.to("host-a"), "held", "failed"),
    ] {
        let (st, reason) = hub.state_reason(id);
        assert_eq!(st, to, "retire moves {from} to {to}");
        let reason = reason.unwrap_or_default();
        assert!(reason.contains("retired") && reason.contains("decommissioned"), "reason: {reason}");
        assert_eq!(hub.events(id).last().unwrap(), &ev(Some(from), to, "operator", OPERATOR));
    }
    // The delivered one stays delivered, and its missing outcome is recorded as unknown.
    let shown = hub.show(d0.to("host-a"));
    assert_eq!(shown["delivery"]["state"], "delivered");
    let attempts = shown["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["outcome"], "unknown");
    // host-b is untouched.
    assert_eq!(hub.state(m1.to("host-b")), "queued");

    // The retired host gets no work (its claim is refused: its node stops) and takes no new
    // messages.
    let msg = node.claim_raw(10, 0).await.err(403, "host_retired");
    assert!(msg.contains("host-a") && msg.contains("retired"), "{msg}");
    node.ack(&claimed[0]).await.err(409, "stale_claim");
    let msg = prod.submit("c", "after", json!(1), &["host-a"]).await.err(400, "invalid_field");
    assert!(msg.contains("to[0]") && msg.contains("retired"), "{msg}");
    // Retiring again: not found (exit 1).
    assert_eq!(hub.cli(["retire", "host-a", "--reason", "again", "--yes"]).status.code(), Some(1));
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_returns_a_gone_instances_claims_to_the_queue() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let gone = hub.node("host-a", "inst-gone");
    let a = prod.submit_new("c", "a", &["host-a"]).await;
    let b = prod.submit_new("c", "b", &["host-a"]).await;
    let ids = [a.to("host-a"), b.to("host-a")];
    let old = claim_exactly(&gone, 2, &ids).await;
    gone.mirrored(&old[1]).await.ok(200);

    let out = hub.cli_ok(["requeue", "--instance", "inst-gone", "--reason", "disk died"]);
    assert!(out.contains("2 requeued"), "{out}");
    assert_eq!(hub.events(ids[0]).last().unwrap(), &ev(Some("claimed"), "queued", "operator", OPERATOR));
    assert_eq!(hub.events(ids[1]).last().unwrap(), &ev(Some("mirrored"), "queued", "operator", OPERATOR));
    assert!(gone.holdings().await.is_empty());
    // The old instance's tokens are dead.
    gone.ack(&old[1]).await.err(409, "stale_claim");

    // A new instance takes them over with fresh tokens.
    let fresh = hub.node("host-a", "inst-new");
    let new = claim_exactly(&fresh, 10, &ids).await;
    for (n, o) in new.iter().zip(&old) {
        assert_ne!(n.claim_token, o.claim_token, "a requeued delivery gets a new claim token");
    }
    gone.mirrored(&old[0]).await.err(409, "stale_claim");
    fresh.mirror_and_ack(&new[1]).await;
    assert_eq!(fresh.holdings().await.len(), 2);
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_of_an_instance_holding_nothing_exits_1() {
    // The CLI documents exit 1 for "not found or nothing to do" (`held release` with nothing
    // held does exit 1); requeueing an instance that holds nothing is nothing to do.
    let hub = Hub::builder().stopped().start();
    let out = hub.cli(["requeue", "--instance", "never-seen"]);
    assert_eq!(out.status.code(), Some(1), "stdout: {}", String::from_utf8_lossy(&out.stdout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_accept_replays_conflicts_and_is_scoped_per_producer() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let other = hub.client("prod-two");
    let first = prod.submit("conv", "order-42", json!({"n": 1}), &["host-a", "host-b"]).await;
    let first = first.ok(201).clone();
    assert_eq!(first["duplicate"], false);

    let replay = prod.submit("conv", "order-42", json!({"n": 1}), &["host-a", "host-b"]).await;
    let replay = replay.ok(200);
    assert_eq!(replay["duplicate"], true);
    for field in ["message_id", "seq", "deliveries"] {
        assert_eq!(replay[field], first[field], "a replay answers with the original {field}");
    }

    // Same key, different content: payload, recipients, conversation.
    for (conv, payload, to) in [
        ("conv", json!({"n": 2}), vec!["host-a", "host-b"]),
        ("conv", json!({"n": 1}), vec!["host-a"]),
        ("other-conv", json!({"n": 1}), vec!["host-a", "host-b"]),
    ] {
        let msg = prod.submit(conv, "order-42", payload.clone(), &to).await.err(409, "idempotency_conflict");
        assert!(msg.contains("order-42"), "{msg}");
    }

    // Another producer may use the same key: it is a different message.
    let theirs = other.submit("conv", "order-42", json!({"n": 1}), &["host-a"]).await;
    let theirs = theirs.ok(201);
    assert_eq!(theirs["duplicate"], false);
    assert_ne!(theirs["message_id"], first["message_id"]);
    assert_eq!(theirs["seq"], 2, "sequence numbers are per conversation");

    // Exactly three deliveries exist: two for the first message, one for the other producer's.
    let all = hub.deliveries();
    assert_eq!(all.len(), 3, "{all:?}");
    let of_first = all.iter().filter(|d| d["message_id"] == first["message_id"]).count();
    assert_eq!(of_first, 2);
    let status = hub.status_json();
    assert_eq!(status["messages"], 2);
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_is_counted_once_and_a_conflicting_one_is_refused() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-1");
    let s = prod.submit_new("c", "k", &["host-a"]).await;
    let c = node.claim(1, 0).await.remove(0);
    node.mirror_and_ack(&c).await;

    let first = node.report(&c, "rep-7", "failed", 3).await;
    let first = first.ok(201).clone();
    assert_eq!(first["duplicate"], false);
    let again = node.report(&c, "rep-7", "failed", 3).await;
    let again = again.ok(200);
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["attempt"], first["attempt"], "a duplicate report answers with the same attempt");

    let msg = node.report(&c, "rep-7", "succeeded", 0).await.err(409, "report_conflict");
    assert!(msg.contains("rep-7"), "{msg}");

    let view = prod.message(&s.message_id).await;
    let attempts = view.ok(200)["deliveries"][0]["attempts"].as_array().unwrap().clone();
    assert_eq!(attempts.len(), 1, "counted once: {attempts:?}");
    assert_eq!((attempts[0]["outcome"].as_str(), attempts[0]["exit_code"].as_i64()), (Some("failed"), Some(3)));
    assert_eq!(hub.status_json()["attempts"], 1);
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_reads_its_message_by_id_and_key_and_no_one_else_does() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let other = hub.client("prod-two");
    let s = prod.submit_new("c", "mine-1", &["host-a", "host-b"]).await;

    let by_id = prod.message(&s.message_id).await;
    let by_key = prod.get("/v1/messages?idempotency_key=mine-1").await;
    assert_eq!(by_id.ok(200), by_key.ok(200), "by id and by key read the same message");
    let hosts: Vec<&str> =
        by_id.body["deliveries"].as_array().unwrap().iter().map(|d| d["host"].as_str().unwrap()).collect();
    assert_eq!(hosts, ["host-a", "host-b"]);

    other.message(&s.message_id).await.err(403, "not_yours");
    // Keys are scoped per producer: the other producer has no message under that key.
    other.get("/v1/messages?idempotency_key=mine-1").await.err(404, "not_found");
    prod.get("/v1/messages?idempotency_key=never-used").await.err(404, "not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_of_a_host_is_refused_while_the_first_holds_work() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let first = hub.node("host-a", "inst-first");
    let clone = first.as_instance("inst-clone");
    let s1 = prod.submit_new("c", "k1", &["host-a"]).await;
    let _s2 = prod.submit_new("c", "k2", &["host-a"]).await;
    let c = claim_exactly(&first, 1, &[s1.to("host-a")]).await.remove(0);

    // The clone may not claim (even though claimable work exists) ...
    let msg = clone.claim_raw(10, 0).await.err(409, "instance_conflict");
    assert!(msg.contains("inst-first"), "the refusal names the bound instance: {msg}");
    // ... nor touch the first instance's delivery, even with its claim token.
    clone.mirrored(&c).await.err(409, "stale_claim");
    clone.reject(&c, "mine now").await.err(409, "stale_claim");
    assert!(clone.holdings().await.is_empty());
    first.mirrored(&c).await.ok(200);
    clone.ack(&c).await.err(409, "stale_claim");
    first.ack(&c).await.ok(200);
    clone.report(&c, "clone-rep", "succeeded", 0).await.err(409, "stale_claim");
    clone.claim_raw(10, 0).await.err(409, "instance_conflict");
    assert_eq!(hub.state(s1.to("host-a")), "delivered");

    // Once the first instance holds nothing (its delivery has an outcome), the new one may claim.
    first.report(&c, "first-rep", "succeeded", 0).await.ok(201);
    assert!(first.holdings().await.is_empty());
    let got = clone.claim(10, 0).await;
    assert_eq!(got.len(), 1, "the new instance takes over the host's queue");
    assert_eq!(hub.show(&got[0].delivery_id)["delivery"]["instance_id"], "inst-clone");
    // And now the first instance is the one refused.
    first.claim_raw(10, 0).await.err(409, "instance_conflict");
    hub.verify_ok();
}

/// Reads a field of every delivery in `deliveries list --json` filtered by `args`.
pub(crate) fn listed(hub: &Hub, args: &[&str], field: &str) -> Vec<Value> {
    let mut all = vec!["deliveries", "list", "--json"];
    all.extend_from_slice(args);
    hub.cli_json(all).as_array().unwrap().iter().map(|d| d[field].clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_batch_is_bounded_and_conversations_take_turns() {
    let hub = Hub::builder().config("[limits]\nclaim_batch_max = 2\n").start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-1");
    let mut ids = Vec::new();
    for (i, conv) in ["c3", "c1", "c2", "c1", "c3"].iter().enumerate() {
        ids.push(prod.submit_new(conv, &format!("k{i}"), &["host-a"]).await.to("host-a").to_string());
    }
    // `max` above the bound is cut to limits.claim_batch_max; without `max`, the bound applies.
    let first = node.claim(10, 0).await;
    let second = node.api.post("/v1/claims", &json!({"instance_id": "inst-1"})).await;
    let second = Claimed::list(second.ok(200));
    let third = node.claim(1, 0).await;
    let got: Vec<Vec<&str>> =
        [&first, &second, &third].iter().map(|b| b.iter().map(|c| c.delivery_id.as_str()).collect()).collect();
    // c3 and c1 waited longest; then c2, never served, goes before c3 and c1 (served in the
    // first batch, c3 before c1), each conversation in seq order (SPEC §2 "Order").
    assert_eq!(
        got,
        vec![vec![&*ids[0], &*ids[1]], vec![&*ids[2], &*ids[4]], vec![&*ids[3]]],
        "conversations take turns, least recently served first, in bounded batches"
    );
    // Sequence numbers are per conversation.
    let seqs: Vec<(String, i64)> =
        first.iter().chain(&second).chain(&third).map(|c| (c.conversation.clone(), c.seq)).collect();
    let expect: Vec<(String, i64)> =
        [("c3", 1), ("c1", 1), ("c2", 1), ("c3", 2), ("c1", 2)].iter().map(|(c, s)| (c.to_string(), *s)).collect();
    assert_eq!(seqs, expect);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_never_hand_out_a_delivery_twice() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let mut all = Vec::new();
    for i in 0..24 {
        all.push(prod.submit_new("c", &format!("k{i}"), &["host-a"]).await.to("host-a").to_string());
    }
    let node = hub.node("host-a", "inst-1");
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let n = node.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = n.claim(3, 0).await;
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got.into_iter().map(|c| c.delivery_id));
            }
        }));
    }
    let mut handed = Vec::new();
    for t in tasks {
        handed.extend(t.await.expect("claim task"));
    }
    let total = handed.len();
    handed.sort();
    handed.dedup();
    assert_eq!(total, handed.len(), "a delivery was handed out twice");
    all.sort();
    assert_eq!(handed, all, "every delivery was handed out exactly once");
    assert_eq!(node.holdings().await.len(), 24);
    for id in &all {
        let claims = hub.events(id).iter().filter(|e| e.1 == "claimed").count();
        assert_eq!(claims, 1, "{id} claimed {claims} times");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_recipients_get_one_delivery_and_order_does_not_change_the_content() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let r = prod.submit("c", "k", json!({"a": 1}), &["host-b", "host-a", "host-b"]).await;
    let v = r.ok(201).clone();
    let hosts: Vec<&str> = v["deliveries"].as_array().unwrap().iter().map(|d| d["host"].as_str().unwrap()).collect();
    assert_eq!(hosts, ["host-a", "host-b"]);
    let replay = prod.submit("c", "k", json!({"a": 1}), &["host-a", "host-b"]).await;
    assert_eq!(
        replay.ok(200)["message_id"],
        v["message_id"],
        "the same recipients in another order are the same content"
    );
    assert_eq!(hub.deliveries().len(), 2);
}

/// A message view over `limits.message_view_bytes_max` keeps the message and every delivery,
/// leaves out the attempts that do not fit, names them with the path that reads each, and
/// that path answers each delivery whole, to the message's producer only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_view_over_its_bound_says_what_it_left_out() {
    const VIEW_BYTES_MAX: usize = 8192;
    const RESULT_BYTES: usize = 3000;
    let hosts = ["host-a", "host-b", "host-c"];
    let hub = Hub::builder()
        .nodes(&hosts)
        .config(&format!("[limits]\npayload_bytes_max = 1024\nmessage_view_bytes_max = {VIEW_BYTES_MAX}\n"))
        .start();
    let prod = hub.client("prod");
    let m = prod.submit_new("c", "k1", &hosts).await;
    for host in hosts {
        let node = hub.node(host, &format!("{host}-inst"));
        let got = node.claim(1, 0).await;
        node.mirror_and_ack(&got[0]).await;
        let mut body = node.report_body(&got[0], "r1", "succeeded", 0);
        body["result"] = json!(host.repeat(RESULT_BYTES / host.len()));
        hub.client(host).post("/delivery-report", &body).await.ok(201);
    }

    for read in [format!("/v1/messages/{}", m.message_id), "/v1/messages?idempotency_key=k1".to_string()] {
        let r = prod.get(&read).await;
        assert!(r.text.len() <= VIEW_BYTES_MAX, "{read}: {} bytes", r.text.len());
        let view = r.ok(200);
        assert_eq!(view["deliveries"].as_array().map(Vec::len), Some(3), "every delivery stays: {view}");
        let omitted = &view["omitted"];
        assert_eq!(omitted["view_bytes_max"], VIEW_BYTES_MAX, "{view}");
        let left_out: Vec<String> =
            omitted["attempts_of"].as_array().unwrap().iter().map(|d| d.as_str().unwrap().to_string()).collect();
        assert!(!left_out.is_empty(), "three results of {RESULT_BYTES} bytes do not fit: {view}");
        let path = omitted["read_each_at"].as_str().unwrap();
        for d in view["deliveries"].as_array().unwrap() {
            let id = d["delivery_id"].as_str().unwrap();
            assert_eq!(d["state"], "delivered");
            let whole = prod.get(&path.replace("{delivery_id}", id)).await;
            let whole = whole.ok(200);
            assert_eq!(whole["delivery_id"], id);
            assert_eq!(whole["attempts"][0]["result"].as_str().map(str::len), Some(RESULT_BYTES), "read whole");
            if left_out.iter().any(|l| l == id) {
                assert_eq!(d["attempts"], json!([]), "left out and named: {d}");
            } else {
                assert_eq!(&d["attempts"], &whole["attempts"], "kept whole: {d}");
            }
        }
    }
    let one = format!("/v1/messages/{}/deliveries/{}", m.message_id, m.to("host-a"));
    hub.client("prod-two").get(&one).await.err(403, "not_yours");
    prod.get(&format!("/v1/messages/{}/deliveries/{}", m.message_id, random_id())).await.err(404, "not_found");
    prod.get(&format!("/v1/messages/{}/deliveries/not-an-id", m.message_id)).await.err(400, "invalid_field");

    // A view within its bound leaves nothing out.
    let small = prod.submit_new("c", "k2", &["host-a"]).await;
    assert_eq!(prod.message(&small.message_id).await.ok(200)["omitted"], Value::Null);
}
