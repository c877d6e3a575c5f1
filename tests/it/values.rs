//! A value is never a storage error (SPEC §9, RELIABILITY I20), through the real hub on the
//! suite's backend (SQLite, and PostgreSQL in `hub_postgres`'s rerun or with
//! `BATON_IT_BACKEND=postgres`): every text field a producer or a node sends takes NUL and its
//! maximum size and comes back byte for byte; a lone surrogate escape is refused as the field's,
//! 400, the same on both; one bad item of a batch fails alone; and a harness whose output holds
//! NUL reports like any other, the node's other turns with it.

use crate::harness::{Claimed, Hub, Resp};
use serde_json::{Value, json};

/// `unit` repeated to `chars` characters.
fn filled(unit: &str, chars: usize) -> String {
    unit.chars().cycle().take(chars).collect()
}

/// An answer that is not an error; a 503 would be a value taken for a storage failure.
#[track_caller]
fn taken(what: &str, r: &Resp) -> Value {
    assert!(r.status < 300, "{what}: {} {}", r.status, &r.text[..r.text.len().min(400)]);
    r.body.clone()
}

fn same(what: &str, got: &Value, sent: &str) {
    let got = got.as_str().unwrap_or_else(|| panic!("{what}: no text, {got}"));
    assert!(
        got == sent,
        "{what}: {} bytes sent, {} read back (first {:?})",
        sent.len(),
        got.len(),
        &got[..got.len().min(40)]
    );
}

const RESULT_BYTES: usize = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_text_field_takes_nul_and_its_maximum_and_a_lone_surrogate_is_the_fields_refusal() {
    let hub = Hub::builder()
        .nodes(&["host-a"])
        .config(&format!("[limits]\nresult_bytes_max = {RESULT_BYTES}\nrequest_body_bytes_max = {}\n", 16 << 20))
        .start();
    let prod = hub.client("prod");
    let reason_max = baton_shared::limits::REASON_CHARS_MAX;

    // Payloads: NUL and U+FFFF escaped, a whole payload of escapes; a lone surrogate refused.
    let submit = |key: &str, payload: &str| {
        format!(r#"{{"conversation":"v-{key}","idempotency_key":"{key}","payload":{payload},"to":["host-a"]}}"#)
            .into_bytes()
    };
    let escapes = r#"{"s":"a\u0000b\uffff0\u0000"}"#;
    let many = format!(r#"{{"s":"{}"}}"#, "\\u0000".repeat(200 * 1024 / 6));
    let mut ids = Vec::new();
    for (key, payload) in [("k1", escapes), ("k2", many.as_str()), ("k3", "{}"), ("k4", "{}"), ("k5", "{}")] {
        let r = prod.post_raw("/v1/messages", submit(key, payload), "application/json").await;
        let id = taken(key, &r)["message_id"].as_str().expect("id").to_string();
        let read = prod.message(&id).await;
        assert!(read.text.contains(&format!(r#""payload":{payload}"#)), "{key}: the payload comes back byte for byte");
        ids.push(id);
    }
    let r = prod.post_raw("/v1/messages", submit("bad", r#"{"s":"\ud800"}"#), "application/json").await;
    assert!(r.err(400, "invalid_field").starts_with("payload"), "{}", r.text);

    let node = hub.node("host-a", "i-1");
    let claimed = node.claim(16, 0).await;
    let of = |m: &str| -> Claimed { claimed.iter().find(|c| c.message_id == m).expect("claimed").clone() };

    // A reject reason of NUL, at its maximum.
    let reason = filled("r\0", reason_max);
    taken("reject", &node.reject(&of(&ids[0]), &reason).await);
    let view = prod.message(&ids[0]).await;
    same("reject reason", &view.body["deliveries"][0]["reason"], &format!("rejected by node: {reason}"));

    // A report's result of a mebibyte with NUL, and its reason.
    let d = of(&ids[1]);
    node.mirror_and_ack(&d).await;
    let result = filled("hello\0world\u{ffff}é😀", RESULT_BYTES / 4);
    let mut report = node.report_body(&d, "rep-1", "succeeded", 0);
    report["result"] = json!(result);
    report["reason"] = json!(reason);
    taken("report", &node.api.post("/delivery-report", &report).await);
    taken("the report's replay", &node.api.post("/delivery-report", &report).await);
    let view = prod.message(&ids[1]).await;
    same("result", &view.body["deliveries"][0]["attempts"][0]["result"], &result);
    same("report reason", &view.body["deliveries"][0]["attempts"][0]["reason"], &reason);

    // A batch of reports: the one with NUL is recorded, the one with a stale token fails alone.
    let d3 = of(&ids[2]);
    let d4 = of(&ids[3]);
    node.mirror_and_ack(&d3).await;
    node.mirror_and_ack(&d4).await;
    let mut good = node.report_body(&d3, "rep-3", "succeeded", 0);
    good["result"] = json!("batch\0result");
    let mut stale = node.report_body(&d4, "rep-4", "succeeded", 0);
    stale["claim_token"] = json!("not-the-token");
    let r = node.api.post("/v1/batch/reports", &json!({"reports": [good, stale]})).await;
    let results = taken("batch", &r)["results"].clone();
    assert_eq!(results[0]["status"], 201, "{results}");
    assert_eq!(results[1]["status"], 409, "{results}");
    same("batch result", &prod.message(&ids[2]).await.body["deliveries"][0]["attempts"][0]["result"], "batch\0result");

    // A producer's cancel reason.
    let r = prod.post(&format!("/v1/messages/{}/cancel", ids[4]), &json!({"reason": reason})).await;
    taken("cancel", &r);
    same("cancel reason", &prod.message(&ids[4]).await.body["deliveries"][0]["cancel_reason"], &reason);

    // A node version with NUL, at its maximum; a lone surrogate is refused as JSON the same way.
    let version = filled("1.0\0", 100);
    taken("session", &node.api.post("/v1/sessions", &json!({"instance_id": "i-1", "node_version": version})).await);
    let r = node
        .api
        .post_raw("/v1/sessions", br#"{"instance_id":"i-1","node_version":"\ud800"}"#.to_vec(), "application/json")
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    let host = hub.cli_json(["hosts", "show", "host-a", "--json"]);
    let shown = serde_json::to_string(&version).expect("JSON");
    assert!(host.to_string().contains(&shown), "the node version is shown as sent: {host}");
    hub.verify_ok();
}

/// The finding this file is for: a harness that echoes NUL (a producer's `"\u0000"` decoded)
/// had its report refused as storage trouble on PostgreSQL, for ever, and the node's other
/// reports stuck behind it. Here it is recorded, and every other turn of the node with it.
#[test]
fn a_harness_printing_nul_reports_and_the_nodes_other_turns_are_not_stuck() {
    let hub = Hub::with_nodes(&["host-a"]);
    let _node = hub.node_process("host-a").then(r"printf 'hello\000world'").start();
    let ids: Vec<String> = (0..4).map(|i| hub.send_one(&format!("c{i}"), &format!("k{i}"), "host-a")).collect();
    for id in &ids {
        hub.wait_outcome(id);
        let attempt = hub.assert_one_attempt(id, "succeeded");
        let result = attempt["result"].as_str().unwrap_or_default();
        assert!(result.contains("hello\0world"), "the result keeps its NUL: {attempt}");
    }
    hub.verify_ok();
}
