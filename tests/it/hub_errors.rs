//! Every 4xx answer (SPEC §9), data-driven: who asks, what, and the status, stable code and
//! words the `{code, message}` body must carry. Bad input must change nothing.

use crate::harness::{Hub, random_id, submit_body};
use serde_json::{Value, json};

/// Small bounds so the limits can be hit cheaply.
const LIMITS: &str = "[limits]
payload_bytes_max = 1000
result_bytes_max = 500
request_body_bytes_max = 8192
queued_per_host_max = 2
recipients_max = 3
";

enum Body {
    None,
    Json(Value),
    Raw(Vec<u8>, &'static str),
}

struct Case {
    /// The identity asking.
    who: &'static str,
    /// GET or POST.
    method: &'static str,
    path: String,
    body: Body,
    status: u16,
    code: &'static str,
    /// Words the message must contain (a field name, a limit's name).
    mentions: &'static [&'static str],
}

fn post(
    who: &'static str,
    path: &str,
    body: Value,
    status: u16,
    code: &'static str,
    mentions: &'static [&'static str],
) -> Case {
    Case { who, method: "POST", path: path.to_string(), body: Body::Json(body), status, code, mentions }
}

fn get(who: &'static str, path: &str, status: u16, code: &'static str, mentions: &'static [&'static str]) -> Case {
    Case { who, method: "GET", path: path.to_string(), body: Body::None, status, code, mentions }
}

fn raw(who: &'static str, path: &str, bytes: Vec<u8>, ctype: &'static str, status: u16, code: &'static str) -> Case {
    Case { who, method: "POST", path: path.to_string(), body: Body::Raw(bytes, ctype), status, code, mentions: &[] }
}

async fn check(hub: &Hub, case: Case) {
    let api = hub.client(case.who);
    let r = match (case.method, case.body) {
        ("GET", _) => api.get(&case.path).await,
        (_, Body::Json(v)) => api.post(&case.path, &v).await,
        (_, Body::Raw(bytes, ctype)) => api.post_raw(&case.path, bytes, ctype).await,
        (_, Body::None) => api.post_raw(&case.path, Vec::new(), "application/json").await,
    };
    assert_eq!(
        (r.status, r.body["code"].as_str()),
        (case.status, Some(case.code)),
        "{} {} as {}: {}",
        case.method,
        case.path,
        case.who,
        r.text
    );
    let message = r.err(case.status, case.code);
    for word in case.mentions {
        assert!(
            message.contains(word),
            "{} {}: the message should mention {word:?}: {message}",
            case.method,
            case.path
        );
    }
}

fn msg(conversation: &str, key: &str, payload: Value, to: &[&str]) -> Value {
    submit_body(conversation, key, payload, to)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_request_gets_its_status_and_code() {
    let mut hub = Hub::builder().config(LIMITS).stopped().start();
    hub.enroll_node("host-c");
    hub.serve(None);
    let prod = hub.client("prod");
    let owned = prod.submit_new("c", "owned", &["host-a"]).await;
    let a_delivery = owned.to("host-a").to_string();
    let node_a = hub.node("host-a", "inst-a");
    let claimed = node_a.claim(1, 0).await.remove(0);
    let mut no_to = msg("c", "k", json!(1), &[]);
    no_to.as_object_mut().unwrap().remove("to");
    let mut unknown_field = msg("c", "k", json!(1), &["host-a"]);
    unknown_field["priority"] = json!(1);
    let mut missing = msg("c", "k", json!(1), &["host-a"]);
    missing.as_object_mut().unwrap().remove("payload");
    let big_payload = json!({"blob": "x".repeat(2000)});
    let big_body = serde_json::to_vec(&msg("c", "k", json!({"blob": "y".repeat(20_000)}), &["host-a"])).unwrap();
    let report = |extra: (&str, Value)| {
        let mut b = json!({
            "delivery_id": claimed.delivery_id, "instance_id": "inst-a", "claim_token": claimed.claim_token,
            "report_id": "r1", "outcome": "succeeded",
        });
        b[extra.0] = extra.1;
        b
    };
    let id = random_id();
    let holder = json!({"instance_id": "inst-b", "claim_token": claimed.claim_token});

    let cases = vec![
        // 400 invalid_json: not JSON, not this endpoint's JSON, not declared as JSON.
        raw("prod", "/v1/messages", b"{\"conversation\":".to_vec(), "application/json", 400, "invalid_json"),
        post("prod", "/v1/messages", unknown_field, 400, "invalid_json", &["priority"]),
        post("prod", "/v1/messages", missing, 400, "invalid_json", &["payload"]),
        raw(
            "prod",
            "/v1/messages",
            serde_json::to_vec(&msg("c", "k", json!(1), &["host-a"])).unwrap(),
            "text/plain",
            400,
            "invalid_json",
        ),
        post("host-a", "/v1/claims", json!({"instance_id": "i", "extra": 1}), 400, "invalid_json", &["extra"]),
        post("host-a", "/delivery-report", report(("outcome", json!("great"))), 400, "invalid_json", &[]),
        // 400 invalid_field, naming the field.
        post(
            "prod",
            "/v1/messages",
            msg("Bad Name", "k", json!(1), &["host-a"]),
            400,
            "invalid_field",
            &["conversation"],
        ),
        post(
            "prod",
            "/v1/messages",
            msg(&"c".repeat(65), "k", json!(1), &["host-a"]),
            400,
            "invalid_field",
            &["conversation"],
        ),
        post(
            "prod",
            "/v1/messages",
            msg("c", "bad key!", json!(1), &["host-a"]),
            400,
            "invalid_field",
            &["idempotency_key"],
        ),
        post(
            "prod",
            "/v1/messages",
            msg("c", &"k".repeat(129), json!(1), &["host-a"]),
            400,
            "invalid_field",
            &["idempotency_key"],
        ),
        post("prod", "/v1/messages", msg("c", "k", json!(1), &["Bad Host"]), 400, "invalid_field", &["to[0]"]),
        post(
            "prod",
            "/v1/messages",
            msg("c", "k", json!(1), &["host-a", "nobody"]),
            400,
            "invalid_field",
            &["to[1]", "nobody"],
        ),
        post(
            "prod",
            "/v1/messages",
            msg("c", "k", json!(1), &["host-a", "host-b", "host-c", "host-d"]),
            400,
            "invalid_field",
            &["to", "recipients_max"],
        ),
        get("prod", "/v1/messages/not-a-uuid", 400, "invalid_field", &["message_id"]),
        get("prod", "/v1/messages", 400, "invalid_field", &["idempotency_key"]),
        get("prod", "/v1/messages?idempotency_key=bad%20key", 400, "invalid_field", &["idempotency_key"]),
        get("prod", &format!("/v1/messages/{}?bogus=1", owned.message_id), 400, "invalid_field", &["bogus"]),
        post("host-a", "/v1/claims", json!({"instance_id": "bad id!"}), 400, "invalid_field", &["instance_id"]),
        post("host-a", "/v1/claims", json!({"instance_id": "i", "max": 0}), 400, "invalid_field", &["max"]),
        get("host-a", "/v1/holdings", 400, "invalid_field", &[]),
        post("host-a", "/v1/deliveries/not-a-uuid/mirrored", holder.clone(), 400, "invalid_field", &["delivery_id"]),
        post(
            "host-a",
            &format!("/v1/deliveries/{a_delivery}/reject"),
            json!({"instance_id": "inst-a", "claim_token": claimed.claim_token, "reason": ""}),
            400,
            "invalid_field",
            &["reason"],
        ),
        post(
            "host-a",
            "/delivery-report",
            report(("report_id", json!("bad id!"))),
            400,
            "invalid_field",
            &["report_id"],
        ),
        post(
            "host-a",
            "/delivery-report",
            report(("reason", json!("r".repeat(1025)))),
            400,
            "invalid_field",
            &["reason"],
        ),
        post(
            "host-a",
            &format!("/v1/deliveries/{a_delivery}/reject"),
            json!({"instance_id": "inst-a", "claim_token": claimed.claim_token, "reason": "r".repeat(1025)}),
            400,
            "invalid_field",
            &["reason"],
        ),
        // 400 no_recipients.
        post("prod", "/v1/messages", no_to, 400, "no_recipients", &["to"]),
        post("prod", "/v1/messages", msg("c", "k", json!(1), &[]), 400, "no_recipients", &["to"]),
        // 403: the thing exists but is another host's.
        post("host-b", &format!("/v1/deliveries/{a_delivery}/mirrored"), holder.clone(), 403, "not_yours", &[]),
        post("host-b", &format!("/v1/deliveries/{a_delivery}/ack"), holder.clone(), 403, "not_yours", &[]),
        // 404.
        get("prod", &format!("/v1/messages/{id}"), 404, "not_found", &[]),
        post("host-a", &format!("/v1/deliveries/{id}/mirrored"), holder.clone(), 404, "not_found", &[]),
        post(
            "host-a",
            "/delivery-report",
            json!({"delivery_id": id, "instance_id": "i", "claim_token": "t", "report_id": "r", "outcome": "failed"}),
            404,
            "not_found",
            &[],
        ),
        get("prod", "/v1/nowhere", 404, "not_found", &[]),
        // 413: a payload over limits.payload_bytes_max, a result over limits.result_bytes_max,
        // a body over limits.request_body_bytes_max.
        post("prod", "/v1/messages", msg("c", "k", big_payload, &["host-a"]), 413, "too_large", &["payload_bytes_max"]),
        post(
            "host-a",
            "/delivery-report",
            report(("result", json!("r".repeat(600)))),
            413,
            "too_large",
            &["result_bytes_max"],
        ),
        raw("prod", "/v1/messages", big_body, "application/json", 413, "too_large"),
    ];
    for case in cases {
        check(&hub, case).await;
    }
    // Nothing of the above changed the record: one message, its one delivery, still claimed.
    assert_eq!(hub.deliveries().len(), 1);
    assert_eq!(hub.state(&a_delivery), "claimed");
    assert!(hub.show(&a_delivery)["attempts"].as_array().unwrap().is_empty());
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_over_its_queue_bound_gets_429_and_replays_still_answer() {
    let mut hub = Hub::builder().config(LIMITS).stopped().start();
    hub.enroll_node("host-c");
    hub.serve(None);
    let prod = hub.client("prod");
    prod.submit_new("c", "k1", &["host-c"]).await;
    prod.submit_new("c", "k2", &["host-c"]).await;
    let msg = prod.submit("c", "k3", json!(3), &["host-c"]).await.err(429, "over_capacity");
    assert!(msg.contains("host-c") && msg.contains("queued_per_host_max"), "{msg}");
    // A message naming the full host and another is refused whole.
    prod.submit("c", "k4", json!(4), &["host-a", "host-c"]).await.err(429, "over_capacity");
    // A replay of an accepted message is not new work: it still answers.
    let replay = prod.submit("c", "k2", json!({"key": "k2"}), &["host-c"]).await;
    assert_eq!(replay.ok(200)["duplicate"], true);
    // Other hosts are not affected.
    prod.submit_new("c", "k5", &["host-a"]).await;
    // Claiming frees room: waiting means queued or held.
    let node = hub.node("host-c", "inst-c");
    assert_eq!(node.claim(1, 0).await.len(), 1);
    prod.submit_new("c", "k3", &["host-c"]).await;
    assert_eq!(hub.deliveries().len(), 4);
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn size_bounds_are_inclusive_and_exact() {
    let hub = Hub::builder().config(LIMITS).start();
    let prod = hub.client("prod");
    // A JSON string of n characters serialises to n + 2 bytes.
    let at = json!("x".repeat(998));
    prod.submit("c", "at-limit", at, &["host-a"]).await.ok(201);
    let over = json!("x".repeat(999));
    prod.submit("c", "over-limit", over, &["host-a"]).await.err(413, "too_large");

    // Whitespace pads a small message to exactly limits.request_body_bytes_max, then one more.
    let body = serde_json::to_string(&msg("c", "padded", json!(1), &["host-b"])).unwrap();
    let pad = |total: usize| {
        let mut b = body.clone().into_bytes();
        b.extend(std::iter::repeat_n(b' ', total - body.len()));
        b
    };
    prod.post_raw("/v1/messages", pad(8193), "application/json").await.err(413, "too_large");
    let r = prod.post_raw("/v1/messages", pad(8192), "application/json").await;
    assert_eq!(r.ok(201)["duplicate"], false);
    assert_eq!(hub.deliveries().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_bound_counts_exactly_the_waiting_deliveries() {
    // Waiting means queued or held (limits.queued_per_host_max = 2). Every way in and out of
    // waiting must move the count the bound is checked against.
    let mut hub = Hub::builder().config(LIMITS).stopped().start();
    hub.enroll_node("host-c");
    hub.serve(None);
    let prod = hub.client("prod");
    let node = hub.node("host-c", "inst-c");
    let mut n = 0;
    let mut submit = |expect: u16| {
        n += 1;
        let (prod, key) = (prod.clone(), format!("k{n}"));
        async move {
            let r = prod.submit("c", &key, json!(1), &["host-c"]).await;
            assert_eq!(r.status, expect, "{key}: {}", r.text);
            r
        }
    };
    let k1 = submit(201).await;
    submit(201).await;
    submit(429).await;
    // Held deliveries still wait.
    let hold = hub.fence("hold", &["--host", "host-c"], "h");
    assert!(node.claim(10, 0).await.is_empty());
    submit(429).await;
    // Cancelling a held one frees one place.
    let first = k1.body["deliveries"][0]["delivery_id"].as_str().unwrap().to_string();
    hub.cli_ok(["deliveries", "cancel", &first]);
    submit(201).await;
    submit(429).await;
    // Released (held → queued) still waits; claimed does not.
    hub.lift(hold);
    hub.cli_ok(["held", "release", "--conversation", "c"]);
    submit(429).await;
    assert_eq!(node.claim(10, 0).await.len(), 2);
    submit(201).await;
    submit(201).await;
    submit(429).await;
    // Requeued claims wait again.
    hub.cli_ok(["requeue", "--instance", "inst-c"]);
    submit(429).await;
    // Blocked at claim time: failed, no longer waiting.
    let block = hub.fence("block", &["--host", "host-c"], "b");
    assert!(node.claim(10, 0).await.is_empty());
    hub.lift(block);
    submit(201).await;
    submit(201).await;
    submit(429).await;
    hub.verify_ok();
}
