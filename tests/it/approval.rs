//! Approval before a turn runs and the breaker (SPEC §8), against the real hub: a message with
//! `"approval": "required"` waits held until an operator (`held approve|reject`) or a producer
//! with the right (`producers approve`, `POST /v1/messages/{id}/approve|reject`) decides, or
//! its `approval_timeout_ms` fails it; a later turn of its conversation on the same host waits
//! behind it. A conversation whose turns fail `limits.breaker_failures` times in a row, or that
//! runs more than `limits.breaker_turns` turns within `limits.breaker_period`, is held by the
//! hub, shows in `status`, and a `fence lift` lifts it.

use crate::harness::{Hub, submit_body};
use crate::node_harness::wait_for;
use serde_json::{Value, json};

/// How long a test waits for the hub to act on its own (the approval timeout's housekeeping).
const HUB_WAIT: std::time::Duration = crate::harness::EVENT_WAIT;

fn with_approval(conversation: &str, key: &str, extra: Value) -> Value {
    let mut body = submit_body(conversation, key, json!({"k": key}), &["host-a"]);
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_approval_queues_the_turn_and_order_holds() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-a");
    let first = prod.post("/v1/messages", &with_approval("c", "k1", json!({"approval": "required"}))).await;
    let first = crate::harness::Submitted::from_body(first.ok(201));
    let second = prod.submit_new("c", "k2", &["host-a"]).await;
    let (state, reason) = hub.state_reason(first.to("host-a"));
    assert_eq!((state.as_str(), reason.as_deref()), ("held", Some("approval required")));
    assert!(node.claim(10, 0).await.is_empty(), "the later turn waits behind the one awaiting approval");
    let held = hub.cli_json(["held", "list", "--json"]);
    assert_eq!(held.as_array().unwrap().len(), 1, "in the held queue: {held}");
    // Release does not bypass the approval.
    let out = hub.cli(["held", "release", first.to("host-a"), "--reason", "try"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    // A delivery id's prefix names its message, as `held release` takes it.
    let out = hub.cli_ok(["held", "approve", &first.to("host-a")[..32], "--reason", "looks right"]);
    assert!(out.contains("approved"), "{out}");
    let got = node.claim(10, 0).await;
    assert_eq!(got.iter().map(|c| c.seq).collect::<Vec<_>>(), [first.seq, second.seq], "in seq order");
    let events = hub.events(first.to("host-a"));
    assert!(events.iter().any(|e| e.1 == "queued" && e.2 == "operator"), "{events:?}");
    let audit = hub.cli_ok(["audit", "--json"]);
    assert!(audit.contains("message_approve") && audit.contains("looks right"), "{audit}");
    let again = hub.cli(["held", "reject", &first.message_id, "--reason", "late"]);
    assert_eq!(again.status.code(), Some(2), "decided once");
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_approves_only_with_the_right_and_can_reject() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let approver = hub.client("prod-two");
    let one = prod.post("/v1/messages", &with_approval("ops-1", "k1", json!({"approval": "required"}))).await;
    let one = crate::harness::Submitted::from_body(one.ok(201));
    let two = prod.post("/v1/messages", &with_approval("ops-2", "k2", json!({"approval": "required"}))).await;
    let two = crate::harness::Submitted::from_body(two.ok(201));
    let path = |m: &str, verb: &str| format!("/v1/messages/{m}/{verb}");
    let refused = approver.post(&path(&one.message_id, "approve"), &json!({"reason": "me"})).await;
    let msg = refused.err(403, "approval_forbidden");
    assert!(msg.contains("ops-1"), "{msg}");
    hub.cli_ok(["producers", "approve", "prod-two", "ops-*", "--reason", "on call"]);
    let listed = hub.cli_json(["producers", "list", "--json"]);
    assert!(listed.to_string().contains("ops-*"), "{listed}");
    let ok = approver.post(&path(&one.message_id, "approve"), &json!({"reason": "fine"})).await;
    assert_eq!(ok.ok(200)["decision"], "approved");
    assert_eq!(hub.state(one.to("host-a")), "queued");
    let no = approver.post(&path(&two.message_id, "reject"), &json!({"reason": "not this one"})).await;
    assert_eq!(no.ok(200)["decision"], "rejected");
    let (state, reason) = hub.state_reason(two.to("host-a"));
    assert_eq!(state, "failed");
    assert_eq!(reason.as_deref(), Some("rejected by producer:prod-two: not this one"));
    let twice = approver.post(&path(&two.message_id, "approve"), &json!({"reason": "x"})).await;
    twice.err(409, "invalid_transition");
    hub.cli_ok(["producers", "approve", "prod-two", "--none", "--reason", "off call"]);
    let three = prod.post("/v1/messages", &with_approval("ops-3", "k3", json!({"approval": "required"}))).await;
    let three = crate::harness::Submitted::from_body(three.ok(201));
    approver.post(&path(&three.message_id, "approve"), &json!({"reason": "x"})).await.err(403, "approval_forbidden");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_approval_fields_are_refused_and_the_approval_is_content() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let bad = prod.post("/v1/messages", &with_approval("c", "k", json!({"approval": "maybe"}))).await;
    assert!(bad.err(400, "invalid_field").contains("approval"));
    // Without an approval there is nothing to time out: the field is left out of the message.
    let lone = prod.post("/v1/messages", &with_approval("c", "lone", json!({"approval_timeout_ms": 5}))).await;
    let lone = crate::harness::Submitted::from_body(lone.ok(201));
    assert_eq!(hub.state(lone.to("host-a")), "queued");
    let long = json!({"approval": "required", "approval_timeout_ms": 604_800_001u64});
    let over = prod.post("/v1/messages", &with_approval("c", "k", long)).await;
    assert!(over.err(400, "invalid_field").contains("limits.approval_timeout_max"));
    let body = with_approval("c", "k", json!({"approval": "required"}));
    prod.post("/v1/messages", &body).await.ok(201);
    assert_eq!(prod.post("/v1/messages", &body).await.ok(200)["duplicate"], true);
    let other = with_approval("c", "k", json!({"approval": "none"}));
    prod.post("/v1/messages", &other).await.err(409, "idempotency_conflict");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecided_approval_times_out_into_a_failure_naming_the_timeout() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let body = with_approval("c", "k", json!({"approval": "required", "approval_timeout_ms": 300}));
    let m = crate::harness::Submitted::from_body(prod.post("/v1/messages", &body).await.ok(201));
    let reason = wait_for("the approval to time out", HUB_WAIT, || {
        let (state, reason) = hub.state_reason(m.to("host-a"));
        (state == "failed").then_some(reason)
    });
    let reason = reason.unwrap_or_default();
    assert!(reason.contains("approval_timeout_ms = 300"), "{reason}");
    let last = hub.events(m.to("host-a")).pop().unwrap();
    assert_eq!(last.2, "hub", "failed by the hub: {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_holds_a_conversation_that_keeps_failing_until_lifted() {
    let hub = Hub::builder().config("[limits]\nbreaker_failures = 2\n").start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-a");
    for key in ["f1", "f2"] {
        prod.submit_new("c", key, &["host-a"]).await;
        let got = node.claim(1, 0).await;
        node.mirror_and_ack(&got[0]).await;
        node.report(&got[0], key, "failed", 1).await.ok(201);
    }
    let fences = hub.cli_json(["fence", "list", "--json"]);
    let fence = fences.as_array().unwrap().iter().find(|f| f["target"] == "c").cloned();
    let fence = fence.unwrap_or_else(|| panic!("a breaker fence: {fences}"));
    assert_eq!((fence["kind"].as_str(), fence["set_by"].as_str()), (Some("hold"), Some("hub")), "{fence}");
    assert!(fence["reason"].as_str().unwrap().contains("2 turns failed in a row"), "{fence}");
    let status = hub.cli(["status", "--json"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("breaker_tripped"), "status lists it: {text}");
    let next = prod.submit_new("c", "after", &["host-a"]).await;
    assert!(node.claim(1, 0).await.is_empty());
    assert_eq!(hub.state(next.to("host-a")), "held");
    hub.lift(fence["id"].as_i64().unwrap());
    hub.cli_ok(["held", "release", "--conversation", "c", "--reason", "fixed"]);
    assert_eq!(node.claim(1, 0).await.len(), 1, "lifted and released, the turn runs");
}

/// The breaker's second trigger: a conversation that runs more turns within
/// `limits.breaker_period` than `limits.breaker_turns` allows, each succeeding, is held by the
/// hub the same way, shows in `status`, and runs again once the fence is lifted and released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_holds_a_conversation_that_runs_too_many_turns_in_a_period_until_lifted() {
    let hub = Hub::builder().config("[limits]\nbreaker_turns = 3\nbreaker_period = \"1h\"\n").start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-a");
    let fenced = || {
        let fences = hub.cli_json(["fence", "list", "--json"]);
        fences.as_array().unwrap().iter().find(|f| f["target"] == "busy").cloned()
    };
    for (i, key) in ["t1", "t2", "t3", "t4"].into_iter().enumerate() {
        assert!(fenced().is_none(), "not tripped after {i} turn(s)");
        prod.submit_new("busy", key, &["host-a"]).await;
        let got = node.claim(1, 0).await;
        node.mirror_and_ack(&got[0]).await;
        node.report(&got[0], key, "succeeded", 0).await.ok(201);
    }
    let fence = fenced().expect("the fourth turn within the period trips the breaker");
    assert_eq!((fence["kind"].as_str(), fence["set_by"].as_str()), (Some("hold"), Some("hub")), "{fence}");
    let reason = fence["reason"].as_str().unwrap();
    assert!(reason.contains("4 turns within 1h") && reason.contains("limits.breaker_turns = 3"), "{fence}");
    let status = hub.cli(["status", "--json"]);
    assert!(String::from_utf8_lossy(&status.stdout).contains("breaker_tripped"), "status lists it");
    let next = prod.submit_new("busy", "after", &["host-a"]).await;
    assert!(node.claim(1, 0).await.is_empty());
    assert_eq!(hub.state(next.to("host-a")), "held");
    hub.lift(fence["id"].as_i64().unwrap());
    hub.cli_ok(["held", "release", "--conversation", "busy", "--reason", "looked at it"]);
    assert_eq!(node.claim(1, 0).await.len(), 1, "lifted and released, the turn runs");
}

/// `baton send --approval required` carries the field: a real node runs nothing of the
/// message until an operator approves it, then runs it.
#[test]
fn baton_send_with_approval_waits_for_the_operator_then_runs() {
    use crate::producer_cli::{baton, config_file, json, run, status};
    let hub = Hub::with_nodes(&["host-a"]);
    let _node = hub.node_process("host-a").start();
    let config = config_file(&hub, true);
    let mut cmd = baton(["--config", &config.display().to_string(), "--json", "send", "--conversation", "c"]);
    cmd.args(["--to", "host-a", "--key", "k", "--payload", "{}", "--approval", "required"]);
    let out = run(cmd);
    status(&out, 0);
    let sent = json(&out);
    let delivery = sent["deliveries"][0]["delivery_id"].as_str().unwrap().to_string();
    assert_eq!(sent["deliveries"][0]["state"], "held", "{sent}");
    assert_eq!(hub.state(&delivery), "held");
    hub.cli_ok(["held", "approve", sent["message_id"].as_str().unwrap(), "--reason", "go"]);
    wait_for("the approved turn to run", HUB_WAIT, || {
        hub.show(&delivery).to_string().contains("succeeded").then_some(())
    });
}
