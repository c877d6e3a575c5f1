//! Batch endpoints (`POST /v1/batch/...`) through the real hub over mTLS: every item is
//! answered exactly as its single endpoint answers the same input (status and body or error),
//! in the order of the request; one refused item changes nothing of the others; a replayed
//! batch adds nothing; an over-limit batch and a revoked caller are refused whole.

use crate::harness::{Claimed, Hub, Node, Resp, random_id, submit_body};
use serde_json::{Value, json};

/// The batch answer's results, asserting the batch itself was taken (200).
#[track_caller]
fn results(r: &Resp) -> Vec<Value> {
    r.ok(200)["results"].as_array().unwrap_or_else(|| panic!("no results: {}", r.text)).clone()
}

/// A batch item as the single endpoint's answer would look: `(status, body or error)`.
fn item(v: &Value) -> (u16, Value) {
    let status = v["status"].as_u64().unwrap_or_else(|| panic!("no status: {v}")) as u16;
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 2, "an item is its status and one of ok/error: {v}");
    match (v.get("ok"), v.get("error")) {
        (Some(ok), None) => (status, ok.clone()),
        (None, Some(e)) => (status, e.clone()),
        _ => panic!("an item has exactly one of ok and error: {v}"),
    }
}

/// Asserts that a batch item is exactly the single endpoint's answer.
#[track_caller]
fn same(batch_item: &Value, single: &Resp, what: &str) {
    assert_eq!(
        item(batch_item),
        (single.status, single.body.clone()),
        "{what}: the batch item differs from the single answer"
    );
}

/// Asserts that a batch item is an error with `status` and `code`.
#[track_caller]
fn refused(batch_item: &Value, status: u16, code: &str) {
    let (s, body) = item(batch_item);
    assert_eq!((s, body["code"].as_str()), (status, Some(code)), "{batch_item}");
}

fn holder_item(c: &Claimed) -> Value {
    json!({"delivery_id": c.delivery_id, "claim_token": c.claim_token})
}

/// `POST /v1/deliveries/{id}/mirrored` for one holder item of a batch.
async fn single_mirrored(node: &Node, item: &Value) -> Resp {
    let path = format!("/v1/deliveries/{}/mirrored", item["delivery_id"].as_str().expect("delivery_id"));
    node.api.post(&path, &json!({"instance_id": node.instance, "claim_token": item["claim_token"]})).await
}

async fn batch(node: &Node, step: &str, items: Vec<Value>) -> Resp {
    node.api.post(&format!("/v1/batch/{step}"), &json!({"instance_id": node.instance, "deliveries": items})).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_submit_answers_each_message_as_the_single_endpoint_does() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let first = submit_body("c", "k0", json!({"n": 0}), &["host-a", "host-b"]);
    prod.post("/v1/messages", &first).await.ok(201);
    let items = vec![
        first.clone(),                                              // a replay
        submit_body("c", "k0", json!({"n": 1}), &["host-a"]),       // a conflicting key
        submit_body("c", "k-unknown", json!(1), &["no-such-host"]), // an unknown host
        submit_body("c", "", json!(1), &["host-a"]),                // a bad key
        submit_body("c", "k1", json!({"n": 2}), &["host-a"]),       // new
        submit_body("c", "k1", json!({"n": 2}), &["host-a"]),       // a replay of the one before
        submit_body("c", "k2", json!({"n": 3}), &["host-b"]),       // new, after refused items
    ];
    let answer = prod.post("/v1/batch/messages", &json!({"messages": items})).await;
    let got = results(&answer);
    assert_eq!(got.len(), items.len(), "one result per message");

    // The same inputs sent one by one now: every answer but a first accept is the batch's.
    for i in [0, 1, 2, 3, 5] {
        let single = prod.post("/v1/messages", &items[i]).await;
        same(&got[i], &single, &format!("message {i}"));
    }
    assert_eq!(got[0]["ok"]["duplicate"], true);
    refused(&got[1], 409, "idempotency_conflict");
    refused(&got[2], 400, "invalid_field");
    refused(&got[3], 400, "invalid_field");
    // The new ones were accepted (201) in order, and their replays agree with them.
    let (status, new) = item(&got[4]);
    assert_eq!((status, &new["duplicate"]), (201, &json!(false)));
    let mut replayed = item(&got[5]).1;
    replayed["duplicate"] = json!(false);
    assert_eq!(replayed, new, "a replay inside the batch answers the message the batch accepted");
    assert_eq!(item(&got[6]).0, 201);
    assert!(got[6]["ok"]["seq"].as_i64() > got[4]["ok"]["seq"].as_i64(), "accepted in request order");
    assert_eq!(hub.deliveries().len(), 4, "k0 twice, k1 and k2: the refused items added nothing");
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_submit_batch_adds_nothing_and_answers_as_replays() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let items: Vec<Value> = (0..5).map(|i| submit_body("c", &format!("k{i}"), json!(i), &["host-a"])).collect();
    let body = json!({"messages": items});
    let first = results(&prod.post("/v1/batch/messages", &body).await);
    let again = results(&prod.post("/v1/batch/messages", &body).await);
    for (a, b) in first.iter().zip(&again) {
        let (sa, mut va) = item(a);
        let (sb, vb) = item(b);
        assert_eq!((sa, sb), (201, 200));
        va["duplicate"] = json!(true);
        assert_eq!(va, vb, "the replay answers the original message");
    }
    assert_eq!(hub.deliveries().len(), 5);
    // Every message flows: one claim hands them out in order.
    let node = hub.node("host-a", "inst-1");
    let seqs: Vec<i64> = node.claim(10, 0).await.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_holder_steps_answer_each_delivery_as_the_single_endpoints_do() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    for i in 0..4 {
        prod.submit_new("c", &format!("a{i}"), &["host-a"]).await;
    }
    let b = prod.submit_new("c", "b0", &["host-b"]).await;
    let node = hub.node("host-a", "inst-1");
    let held = node.claim(10, 0).await;
    assert_eq!(held.len(), 4);
    let host_b = hub.node("host-b", "inst-b").claim(10, 0).await.remove(0);
    assert_eq!(host_b.delivery_id, b.to("host-b"));
    // One delivery turns stale: its producer cancels it.
    let stale = held[3].clone();
    prod.post(&format!("/v1/messages/{}/cancel", stale.message_id), &json!({"reason": "no"})).await.ok(200);

    let mut wrong_token = holder_item(&held[1]);
    wrong_token["claim_token"] = json!(random_id());
    let items = vec![
        holder_item(&held[0]),                                   // mirrored
        wrong_token.clone(),                                     // a wrong holder
        json!({"delivery_id": random_id(), "claim_token": "t"}), // unknown
        holder_item(&host_b),                                    // another host's
        holder_item(&stale),                                     // stale (cancelled)
        json!({"delivery_id": "not-an-id", "claim_token": "t"}), // a bad id
        holder_item(&held[2]),                                   // mirrored, after refused ones
        holder_item(&held[0]),                                   // a repeat inside the batch
    ];
    let got = results(&batch(&node, "mirrored", items.clone()).await);
    assert_eq!(got.len(), items.len());
    assert_eq!(item(&got[0]), (200, json!({"delivery_id": held[0].delivery_id, "state": "mirrored", "changed": true})));
    refused(&got[1], 409, "stale_claim");
    refused(&got[2], 404, "not_found");
    refused(&got[3], 403, "not_yours");
    refused(&got[4], 409, "stale_claim");
    refused(&got[5], 400, "invalid_field");
    assert_eq!(item(&got[6]).1["changed"], true);
    assert_eq!(
        item(&got[7]),
        (200, json!({"delivery_id": held[0].delivery_id, "state": "mirrored", "changed": false}))
    );
    // Each item again through its single endpoint: the same answer (the applied ones are now
    // repeats, which the batch's last item already showed).
    for i in [1, 2, 3, 4, 5, 7] {
        same(&got[i], &single_mirrored(&node, &items[i]).await, &format!("delivery {i}"));
    }
    assert_eq!(hub.state(&held[1].delivery_id), "claimed", "a refused item changed nothing");

    // ack: the mirrored ones move on, the claimed one is not mirrored yet.
    let acks = vec![holder_item(&held[0]), holder_item(&held[1]), holder_item(&held[2])];
    let got = results(&batch(&node, "ack", acks.clone()).await);
    assert_eq!(item(&got[0]).1["state"], "delivered");
    refused(&got[1], 409, "invalid_transition");
    assert_eq!(item(&got[2]).1["state"], "delivered");
    let single = node.ack(&held[1]).await;
    same(&got[1], &single, "ack of a claimed delivery");
    // A replayed ack batch changes nothing and answers as repeats.
    let again = results(&batch(&node, "ack", acks).await);
    assert_eq!(
        item(&again[0]),
        (200, json!({"delivery_id": held[0].delivery_id, "state": "delivered", "changed": false}))
    );

    // reject: the claimed one is refused by its holder; a delivered one cannot be.
    let rejects = vec![
        json!({"delivery_id": held[1].delivery_id, "claim_token": held[1].claim_token, "reason": "cannot run it"}),
        json!({"delivery_id": held[0].delivery_id, "claim_token": held[0].claim_token, "reason": "too late"}),
        json!({"delivery_id": held[2].delivery_id, "claim_token": held[2].claim_token, "reason": ""}),
    ];
    let got = results(&batch(&node, "reject", rejects.clone()).await);
    assert_eq!(item(&got[0]), (200, json!({"delivery_id": held[1].delivery_id, "state": "failed", "changed": true})));
    refused(&got[1], 409, "invalid_transition");
    refused(&got[2], 400, "invalid_field");
    for i in [1, 2] {
        let single = node.api.post(
            &format!("/v1/deliveries/{}/reject", rejects[i]["delivery_id"].as_str().unwrap()),
            &json!({"instance_id": node.instance, "claim_token": rejects[i]["claim_token"], "reason": rejects[i]["reason"]}),
        ).await;
        same(&got[i], &single, &format!("reject {i}"));
    }
    assert_eq!(hub.state(&held[1].delivery_id), "failed");
    hub.verify_ok();
}

/// `POST /v1/batch/handoff` is `mirrored` then `ack` in one request: a claimed delivery and a
/// mirrored one both end `delivered`, each with the two events the single steps record; a
/// refused item answers what its single `mirrored` answers (the first step refuses it) and
/// changes nothing, the others go on; a repeat answers as a repeated `ack`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_handoff_answers_each_delivery_as_mirrored_then_ack_do() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    for i in 0..5 {
        prod.submit_new("c", &format!("a{i}"), &["host-a"]).await;
    }
    prod.submit_new("c", "b0", &["host-b"]).await;
    let node = hub.node("host-a", "inst-1");
    let held = node.claim(10, 0).await;
    assert_eq!(held.len(), 5);
    let host_b = hub.node("host-b", "inst-b").claim(10, 0).await.remove(0);
    node.mirrored(&held[1]).await.ok(200);
    node.reject(&held[4], "cannot run it").await.ok(200);
    let stale = held[3].clone();
    prod.post(&format!("/v1/messages/{}/cancel", stale.message_id), &json!({"reason": "no"})).await.ok(200);

    let mut wrong_token = holder_item(&held[2]);
    wrong_token["claim_token"] = json!(random_id());
    let items = vec![
        holder_item(&held[0]),                                   // claimed → delivered
        holder_item(&held[1]),                                   // mirrored → delivered
        wrong_token.clone(),                                     // a wrong holder
        json!({"delivery_id": random_id(), "claim_token": "t"}), // unknown
        holder_item(&host_b),                                    // another host's
        holder_item(&stale),                                     // stale (cancelled)
        json!({"delivery_id": "not-an-id", "claim_token": "t"}), // a bad id
        holder_item(&held[0]),                                   // a repeat inside the batch
        holder_item(&held[4]),                                   // rejected by its holder
    ];
    let got = results(&batch(&node, "handoff", items.clone()).await);
    assert_eq!(got.len(), items.len());
    for i in [0, 1] {
        let id = &held[i].delivery_id;
        assert_eq!(item(&got[i]), (200, json!({"delivery_id": id, "state": "delivered", "changed": true})));
        let steps: Vec<(Option<String>, String)> = hub.events(id).into_iter().map(|(f, t, _, _)| (f, t)).collect();
        let tail: Vec<(Option<&str>, &str)> =
            steps[steps.len() - 2..].iter().map(|(f, t)| (f.as_deref(), t.as_str())).collect();
        assert_eq!(tail, [(Some("claimed"), "mirrored"), (Some("mirrored"), "delivered")], "{id}: {steps:?}");
    }
    refused(&got[2], 409, "stale_claim");
    refused(&got[3], 404, "not_found");
    refused(&got[4], 403, "not_yours");
    refused(&got[5], 409, "stale_claim");
    refused(&got[6], 400, "invalid_field");
    refused(&got[8], 409, "stale_claim");
    for i in [2, 3, 4, 5, 6, 8] {
        same(&got[i], &single_mirrored(&node, &items[i]).await, &format!("delivery {i}"));
    }
    let repeat = node.ack(&held[0]).await;
    same(&got[7], &repeat, "a repeated handoff");
    assert_eq!(item(&got[7]).1["changed"], false);
    assert_eq!(hub.state(&held[2].delivery_id), "claimed", "a refused item changed nothing");
    assert_eq!(hub.state(&host_b.delivery_id), "claimed", "another host's delivery changed nothing");
    // A replayed handoff batch changes nothing and answers as repeated acks.
    let again = results(&batch(&node, "handoff", vec![holder_item(&held[0]), holder_item(&held[1])]).await);
    for (i, a) in again.iter().enumerate() {
        assert_eq!(item(a), (200, json!({"delivery_id": held[i].delivery_id, "state": "delivered", "changed": false})));
    }
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_reports_answer_each_report_as_the_single_endpoint_does() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    for i in 0..3 {
        prod.submit_new(&format!("c{i}"), &format!("k{i}"), &["host-a"]).await;
    }
    let node = hub.node("host-a", "inst-1");
    let held = node.claim(10, 0).await;
    assert_eq!(held.len(), 3);
    node.mirror_and_ack(&held[0]).await;
    node.mirror_and_ack(&held[1]).await;
    // held[2] stays claimed: a report for it is refused.
    let r0 = node.report_body(&held[0], "rep-0", "succeeded", 0);
    let r1 = node.report_body(&held[1], "rep-1", "failed", 3);
    let mut r0_changed = r0.clone();
    r0_changed["result"] = json!("something else");
    let mut unknown = node.report_body(&held[2], "rep-x", "succeeded", 0);
    unknown["delivery_id"] = json!(random_id());
    let reports = vec![
        r0.clone(),                                          // recorded
        r0.clone(),                                          // its replay
        r0_changed,                                          // same report id, other body
        node.report_body(&held[2], "rep-2", "succeeded", 0), // not delivered
        unknown,                                             // unknown delivery
        r1,                                                  // recorded, after refused ones
    ];
    let got = results(&node.api.post("/v1/batch/reports", &json!({"reports": reports})).await);
    assert_eq!(got.len(), reports.len());
    let (status, first) = item(&got[0]);
    assert_eq!((status, &first["duplicate"]), (201, &json!(false)));
    refused(&got[2], 409, "report_conflict");
    assert_eq!(item(&got[5]).0, 201);
    for i in 1..5 {
        let single = node.api.post("/delivery-report", &reports[i]).await;
        same(&got[i], &single, &format!("report {i}"));
    }
    assert_eq!(got[1]["ok"]["duplicate"], true);
    assert_eq!(got[1]["ok"]["attempt"], first["attempt"], "the replay answers the recorded attempt");
    // A replayed batch records nothing more.
    let again = results(&node.api.post("/v1/batch/reports", &json!({"reports": [reports[0], reports[5]]})).await);
    assert!(again.iter().all(|r| item(r).0 == 200 && r["ok"]["duplicate"] == true), "{again:?}");
    let view = prod.get("/v1/messages?idempotency_key=k0").await;
    assert_eq!(view.ok(200)["deliveries"][0]["attempts"].as_array().unwrap().len(), 1, "counted once");
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_limit_batch_is_refused_whole() {
    // Bodies up to 2 MiB reach the handlers, so the batch's own byte bound is what refuses.
    let hub = Hub::builder().config("[limits]\nrequest_body_bytes_max = 2097152\n").start();
    let prod = hub.client("prod");
    let many: Vec<Value> = (0..257).map(|i| submit_body("c", &format!("k{i}"), json!(i), &["host-a"])).collect();
    let m = prod.post("/v1/batch/messages", &json!({"messages": many})).await.err(400, "invalid_field");
    assert!(m.contains("messages") && m.contains("256"), "{m}");
    prod.post("/v1/batch/messages", &json!({"messages": []})).await.err(400, "invalid_field");
    let big = "x".repeat(200 * 1024);
    let heavy: Vec<Value> = (0..6).map(|i| submit_body("c", &format!("h{i}"), json!(big), &["host-a"])).collect();
    let m = prod.post("/v1/batch/messages", &json!({"messages": heavy})).await.err(413, "too_large");
    assert!(m.contains("BATCH_BYTES_MAX"), "{m}");
    // An unknown field anywhere refuses the batch as a whole.
    let mut odd = submit_body("c", "odd", json!(1), &["host-a"]);
    odd["colour"] = json!("blue");
    let ok = submit_body("c", "fine", json!(1), &["host-a"]);
    prod.post("/v1/batch/messages", &json!({"messages": [ok, odd]})).await.err(400, "invalid_json");
    let node = hub.node("host-a", "inst-1");
    let items: Vec<Value> = (0..257).map(|_| json!({"delivery_id": random_id(), "claim_token": "t"})).collect();
    batch(&node, "mirrored", items).await.err(400, "invalid_field");
    assert!(hub.deliveries().is_empty(), "nothing of a refused batch was applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_or_wrong_caller_is_refused_whole() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let s = prod.submit_new("c", "k0", &["host-a"]).await;
    let node = hub.node("host-a", "inst-1");
    let c = node.claim(1, 0).await.remove(0);
    assert_eq!(c.delivery_id, s.to("host-a"));
    // Roles: a node may not submit, a producer may not move deliveries.
    let body = json!({"messages": [submit_body("c", "k1", json!(1), &["host-a"])]});
    node.api.post("/v1/batch/messages", &body).await.err(403, "wrong_role");
    let as_producer = Node { api: prod.clone(), instance: "inst-1".into() };
    batch(&as_producer, "mirrored", vec![holder_item(&c)]).await.err(403, "wrong_role");

    hub.cli_ok(["revoke", "prod", "--reason", "laptop stolen", "--yes"]);
    hub.cli_ok(["revoke", "host-a", "--reason", "host compromised", "--yes"]);
    prod.post("/v1/batch/messages", &body).await.err(401, "certificate_revoked");
    batch(&node, "mirrored", vec![holder_item(&c)]).await.err(401, "certificate_revoked");
    let report = node.report_body(&c, "r", "succeeded", 0);
    node.api.post("/v1/batch/reports", &json!({"reports": [report]})).await.err(401, "certificate_revoked");
    assert_eq!(hub.deliveries().len(), 1, "the revoked producer's batch added nothing");
    assert_eq!(hub.state(&c.delivery_id), "claimed", "the revoked node's batch moved nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_session_is_refused_whole() {
    let hub = Hub::start();
    hub.client("prod").submit_new("c", "k0", &["host-a"]).await;
    let node = hub.node("host-a", "inst-1");
    let open =
        || async { node.api.post("/v1/sessions", &json!({"instance_id": "inst-1"})).await.ok(200)["session"].clone() };
    let old = open().await;
    let newer = open().await;
    assert!(newer.as_u64() > old.as_u64());
    let id = hub.identity("host-a");
    let http = baton_testkit::identity::client_builder(hub.ca_pem().as_bytes(), Some(&id.pem().unwrap()))
        .unwrap()
        .build()
        .unwrap();
    // Once the host has sessions, a claim must name one.
    let claimed: Value = http
        .post(format!("{}/v1/claims", hub.url()))
        .header("baton-session", newer.to_string())
        .json(&json!({"instance_id": "inst-1", "max": 1, "wait_ms": 0}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let c = crate::harness::Claimed::list(&claimed).remove(0);
    let r = http
        .post(format!("{}/v1/batch/mirrored", hub.url()))
        .header("baton-session", old.to_string())
        .json(&json!({"instance_id": "inst-1", "deliveries": [holder_item(&c)]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "session_superseded");
    assert_eq!(hub.state(&c.delivery_id), "claimed", "nothing of the batch was applied");
}
