//! Payloads through the real hub and node: kept byte for byte (huge integers, long decimals,
//! key order, escapes) up to the harness's stdin; a replay is judged on the canonical form, so
//! payloads that differ only in a number are never duplicates; duplicate keys and numbers a
//! field cannot hold are refused naming the field.

use crate::harness::{Hub, Resp};

/// A submit body with `payload` inserted as raw JSON text.
fn body(key: &str, payload: &str) -> Vec<u8> {
    format!(r#"{{"conversation":"exact","idempotency_key":"{key}","payload":{payload},"to":["host-a"]}}"#).into_bytes()
}

async fn submit(hub: &Hub, key: &str, payload: &str) -> Resp {
    hub.client("prod").post_raw("/v1/messages", body(key, payload), "application/json").await
}

/// The raw `"payload":` text of an answer, as the hub wrote it.
fn raw_payload(text: &str) -> &str {
    let start = text.find(r#""payload":"#).unwrap_or_else(|| panic!("no payload in {text}")) + r#""payload":"#.len();
    let raw: &serde_json::value::RawValue =
        serde_json::Deserializer::from_str(&text[start..]).into_iter().next().expect("a value").expect("JSON");
    raw.get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_come_back_exactly_as_sent_and_differing_numbers_are_not_duplicates() {
    let hub = Hub::with_nodes(&["host-a"]);
    let big = r#"{"n": 12345678901234567890123, "z": "\u00e9", "a": [1.50, -0.0e+00]}"#;
    let long = r#"{"n": 1.000000000000000000001}"#;
    let first = submit(&hub, "k-big", big).await;
    let big_id = first.ok(201)["message_id"].as_str().expect("id").to_string();
    let second = submit(&hub, "k-long", long).await;
    let long_id = second.ok(201)["message_id"].as_str().expect("id").to_string();
    for (id, sent) in [(&big_id, big), (&long_id, long)] {
        let read = hub.client("prod").message(id).await;
        read.ok(200);
        assert_eq!(raw_payload(&read.text), sent, "the message read returns the payload byte for byte");
    }
    // The node gets the same bytes.
    let claim = hub
        .client("host-a")
        .post_raw("/v1/claims", br#"{"instance_id":"i-1","max":8}"#.to_vec(), "application/json")
        .await;
    claim.ok(200);
    assert_eq!(raw_payload(&claim.text), big, "the claim hands out the exact bytes");

    // Two payloads that differ only in a number beyond 64 bits, or in a long decimal's last
    // digit, are different content under one key: a conflict, never `duplicate`.
    submit(&hub, "k-n", r#"{"n": 12345678901234567890123}"#).await.ok(201);
    submit(&hub, "k-n", r#"{"n": 12345678901234567890124}"#).await.err(409, "idempotency_conflict");
    submit(&hub, "k-d", r#"{"n": 1.000000000000000000001}"#).await.ok(201);
    submit(&hub, "k-d", r#"{"n": 1.000000000000000000002}"#).await.err(409, "idempotency_conflict");
    // The same value written otherwise (key order, whitespace, escapes) is the same content.
    let again = submit(&hub, "k-big", r#"{ "a":[1.50,-0.0e+00],"z":"é","n":12345678901234567890123 }"#).await;
    assert_eq!(again.ok(200)["duplicate"], true, "{}", again.text);
    assert_eq!(again.body["message_id"], big_id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_keys_too_deep_and_out_of_range_numbers_are_refused_naming_the_field() {
    let hub = Hub::with_nodes(&["host-a"]);
    let m = submit(&hub, "dup", r#"{"a": 1, "\u0061": 2}"#).await.err(400, "invalid_field");
    assert!(m.contains("payload") && m.contains("duplicate key"), "{m}");
    let depth = baton_shared::limits::PAYLOAD_DEPTH_MAX;
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    submit(&hub, "deep-ok", &deep(depth)).await.ok(201);
    let m = submit(&hub, "deep", &deep(depth + 1)).await.err(400, "invalid_field");
    assert!(m.contains("payload") && m.contains("nested deeper"), "{m}");

    let node = hub.client("host-a");
    for (field, text) in [
        ("max", r#"{"instance_id":"i-1","max":4294967296}"#),
        ("wait_ms", r#"{"instance_id":"i-1","wait_ms":18446744073709551616}"#),
        ("wait_ms", r#"{"instance_id":"i-1","wait_ms":-1}"#),
    ] {
        let r = node.post_raw("/v1/claims", text.as_bytes().to_vec(), "application/json").await;
        let m = r.err(400, "invalid_field");
        assert!(m.starts_with(&format!("{field}:")), "{field}: {m}");
    }
    let c = hub.node("host-a", "i-1");
    let claimed = c.claim(8, 0).await;
    let first = claimed.first().expect("the depth-bound payload was claimed");
    c.mirror_and_ack(first).await;
    let mut report = c.report_body(first, "r-1", "succeeded", 0);
    report["duration_ms"] = serde_json::json!(u64::MAX);
    let m = c.api.post("/delivery-report", &report).await.err(400, "invalid_field");
    assert!(m.starts_with("duration_ms:"), "{m}");
    report["duration_ms"] = serde_json::json!(i64::MAX);
    c.api.post("/delivery-report", &report).await.ok(201);
    let read = hub.client("prod").message(&first.message_id).await;
    let attempt = &read.ok(200)["deliveries"][0]["attempts"][0];
    assert_eq!(attempt["duration_ms"], serde_json::json!(i64::MAX), "read back as sent, not 0");
}

/// The real node hands the harness the producer's bytes on stdin, unchanged.
#[test]
fn the_harness_reads_the_exact_bytes_on_stdin() {
    let hub = Hub::with_nodes(&["host-a"]);
    let got = hub.scratch("stdin").join("payload");
    let _node = hub.node_process("host-a").then(&format!("cat > '{}'", got.display())).start();
    let sent = r#"{"n": 12345678901234567890123, "d": 1.000000000000000000001, "b": "\u00e9", "a": []}"#;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let r = rt.block_on(submit(&hub, "stdin", sent));
    let id = r.ok(201)["deliveries"][0]["delivery_id"].as_str().expect("delivery id").to_string();
    hub.wait_outcome(&id);
    hub.assert_one_attempt(&id, "succeeded");
    assert_eq!(std::fs::read_to_string(&got).expect("the harness wrote its stdin"), sent);
}

/// `baton-hub send` keeps the payload as given too, and refuses what the API refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_send_keeps_the_payload_exactly_and_refuses_duplicate_keys() {
    let hub = Hub::with_nodes(&["host-a"]);
    let sent = r#"{"z": 1, "n": 12345678901234567890123, "a": 1.50}"#;
    let out = hub.cli_json([
        "send",
        "--conversation",
        "exact",
        "--to",
        "host-a",
        "--key",
        "k-cli",
        "--payload",
        sent,
        "--producer",
        "prod",
        "--json",
    ]);
    let id = out["message_id"].as_str().expect("message id").to_string();
    let read = hub.client("prod").message(&id).await;
    read.ok(200);
    assert_eq!(raw_payload(&read.text), sent, "the CLI's send keeps the payload byte for byte");
    let refused = hub.cli([
        "send",
        "--conversation",
        "exact",
        "--to",
        "host-a",
        "--key",
        "k-dup",
        "--payload",
        r#"{"a":1,"a":2}"#,
        "--producer",
        "prod",
    ]);
    assert_eq!(refused.status.code(), Some(2), "{}", String::from_utf8_lossy(&refused.stderr));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("payload"), "names the payload");
}
