//! Crashes (SPEC §3): the hub aborts at a crash point (compiled in with the `crash-points`
//! feature, armed with `BATON_CRASH_POINT`), is restarted without it, and must have repaired
//! what the crash interrupted: every accepted message has exactly one delivery per recipient,
//! a replayed accept returns the original, a committed claim is found in the holdings.

use crate::harness::{Hub, submit_body};
use serde_json::{Value, json};
use std::os::unix::process::ExitStatusExt;

/// Waits for the hub to die at `point` and checks it died by the crash point (SIGABRT), not by
/// something else.
fn assert_crashed_at(hub: &mut Hub, point: &str) {
    let status = hub
        .wait_exit(crate::harness::EVENT_WAIT)
        .unwrap_or_else(|| panic!("the hub did not exit at {point}; was it built with --features crash-points?"));
    assert!(!status.success(), "the hub exited cleanly instead of crashing at {point}");
    assert_eq!(status.signal(), Some(6), "the crash point aborts (SIGABRT): {status}");
    let stderr = hub.serve_stderr();
    assert!(stderr.contains(&format!("crash point {point} reached")), "stderr: {stderr}");
}

/// Submits through a hub armed to crash at `point` (after its commit, before its answer),
/// restarts it, and checks that the message and its deliveries were kept, nothing is left for
/// repair, and the replay of a message to `to` answers the original.
async fn check_accept_crash(point: &str, to: &[&str]) {
    let mut hub = Hub::builder().crash_point(point).start();
    let body = submit_body("c", "crash-key", json!({"n": 1}), to);
    let r = hub.client("prod").try_post("/v1/messages", &body).await;
    assert!(r.is_err(), "the client got an answer from a hub that crashed at {point}: {:?}", r.map(|r| r.text));
    assert_crashed_at(&mut hub, point);

    hub.serve(None);
    let all = hub.deliveries();
    let mut hosts: Vec<&str> = all.iter().map(|d| d["host"].as_str().unwrap()).collect();
    hosts.sort();
    assert_eq!(hosts, to, "exactly one delivery per recipient was kept: {all:?}");
    assert!(all.iter().all(|d| d["state"] == "queued"));
    let message_id = all[0]["message_id"].as_str().unwrap().to_string();
    assert!(all.iter().all(|d| d["message_id"] == message_id.as_str()), "one message: {all:?}");
    assert_eq!(hub.status_json()["pending_fanout"], 0);

    let replay = hub.client("prod").post("/v1/messages", &body).await;
    let v = replay.ok(200);
    assert_eq!(v["duplicate"], true);
    assert_eq!(v["message_id"], message_id.as_str(), "the replay returns the original message");
    let mut ids: Vec<&str> =
        v["deliveries"].as_array().unwrap().iter().map(|d| d["delivery_id"].as_str().unwrap()).collect();
    ids.sort();
    let mut listed: Vec<&str> = all.iter().map(|d| d["delivery_id"].as_str().unwrap()).collect();
    listed.sort();
    assert_eq!(ids, listed);
    assert_eq!(hub.deliveries().len(), to.len(), "the replay added nothing");

    // The kept deliveries flow normally.
    let node = hub.node(to[0], "inst-1");
    assert_eq!(node.claim(10, 0).await.len(), 1);
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_accept_commit_keeps_the_message_and_its_deliveries() {
    check_accept_crash("hub.accept.after_commit", &["host-a", "host-b"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_in_the_middle_of_fan_out_keeps_nothing_and_the_retry_is_new() {
    // Accept and fan-out are one writer job: a crash between two deliveries of one message
    // leaves neither the message nor a pending obligation, and the producer never had an answer.
    let mut hub = Hub::builder().crash_point("hub.fanout.after_k").start();
    let body = submit_body("c", "crash-key", json!({"n": 1}), &["host-a", "host-b"]);
    assert!(hub.client("prod").try_post("/v1/messages", &body).await.is_err());
    assert_crashed_at(&mut hub, "hub.fanout.after_k");
    hub.serve(None);
    let status = hub.status_json();
    assert_eq!((status["messages"].as_i64(), status["pending_fanout"].as_i64()), (Some(0), Some(0)), "{status}");
    assert!(hub.deliveries().is_empty());
    let again = hub.client("prod").post("/v1/messages", &body).await;
    assert_eq!(again.ok(201)["deliveries"].as_array().unwrap().len(), 2, "the retry is a new accept, fanned out");
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_committed_but_never_answered_is_found_in_the_holdings() {
    let mut hub = Hub::builder().crash_point("hub.claim.after_commit").start();
    let s = hub.client("prod").submit_new("c", "k", &["host-a"]).await;
    let id = s.to("host-a").to_string();
    let r = hub.node("host-a", "inst-1").api.try_post("/v1/claims", &json!({"instance_id": "inst-1", "max": 10})).await;
    assert!(r.is_err(), "the claim was answered by a hub that crashed: {:?}", r.map(|r| r.text));
    assert_crashed_at(&mut hub, "hub.claim.after_commit");

    hub.serve(None);
    let node = hub.node("host-a", "inst-1");
    let held = node.holdings().await;
    assert_eq!(held.len(), 1, "the committed claim is held by the instance");
    let c = &held[0];
    assert_eq!((c.delivery_id.as_str(), c.state.as_str()), (id.as_str(), "claimed"));
    assert_eq!(c.payload, json!({"key": "k"}));
    // It is not handed out again, to this or another instance ...
    assert!(node.claim(10, 0).await.is_empty());
    node.as_instance("inst-2").claim_raw(10, 0).await.err(409, "instance_conflict");
    // ... and the instance resumes it with the token from its holdings.
    node.mirror_and_ack(c).await;
    node.report(c, "r1", "succeeded", 0).await.ok(201);
    let events: Vec<Value> = hub.show(&id)["events"].as_array().unwrap().clone();
    assert_eq!(events.iter().filter(|e| e["to_state"] == "claimed").count(), 1, "claimed exactly once");
    hub.verify_ok();
}

/// The hub commits a holder step and dies before answering (`point`); after a restart the node
/// repeats the same call with the same token and must get a success that changes nothing more.
async fn check_lost_answer(point: &str, step: &str) {
    let mut hub = Hub::builder().crash_point(point).start();
    hub.client("prod").submit_new("c", "k", &["host-a"]).await;
    let node = hub.node("host-a", "inst-1");
    let c = node.claim(1, 0).await.remove(0);
    if step != "mirrored" && step != "handoff" {
        node.mirrored(&c).await.ok(200);
    }
    if step == "report" {
        node.ack(&c).await.ok(200);
    }
    let lost = match step {
        "mirrored" => {
            node.api
                .try_post(&format!("/v1/deliveries/{}/mirrored", c.delivery_id), &holder(&node, &c.claim_token))
                .await
        }
        "ack" => {
            node.api.try_post(&format!("/v1/deliveries/{}/ack", c.delivery_id), &holder(&node, &c.claim_token)).await
        }
        "handoff" => node.api.try_post("/v1/batch/handoff", &handoff_batch(&node, &c)).await,
        _ => node.api.try_post("/delivery-report", &node.report_body(&c, "rep-1", "succeeded", 0)).await,
    };
    assert!(lost.is_err(), "{step}: answered by a hub that crashed: {:?}", lost.map(|r| r.text));
    assert_crashed_at(&mut hub, point);

    hub.serve(None);
    let node = hub.node("host-a", "inst-1");
    let (retry, state) = match step {
        "mirrored" => (node.mirrored(&c).await, "mirrored"),
        "ack" => (node.ack(&c).await, "delivered"),
        "handoff" => (node.api.post("/v1/batch/handoff", &handoff_batch(&node, &c)).await, "delivered"),
        _ => (node.report(&c, "rep-1", "succeeded", 0).await, "delivered"),
    };
    let unchanged = json!({"delivery_id": c.delivery_id, "state": state, "changed": false});
    if step == "report" {
        assert_eq!(retry.ok(200)["duplicate"], true, "the retried report was already recorded");
        let view = hub.client("prod").get("/v1/messages?idempotency_key=k").await;
        assert_eq!(view.ok(200)["deliveries"][0]["attempts"].as_array().unwrap().len(), 1);
    } else if step == "handoff" {
        assert_eq!(retry.ok(200), &json!({"results": [{"status": 200, "ok": unchanged}]}));
    } else {
        assert_eq!(retry.ok(200), &unchanged);
    }
    assert_eq!(hub.state(&c.delivery_id), state);
    hub.verify_ok();
}

fn holder(node: &crate::harness::Node, token: &str) -> Value {
    json!({"instance_id": node.instance, "claim_token": token})
}

fn handoff_batch(node: &crate::harness::Node, c: &crate::harness::Claimed) -> Value {
    json!({"instance_id": node.instance, "deliveries": [{"delivery_id": c.delivery_id, "claim_token": c.claim_token}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_mirrored_answer_is_safe_to_retry() {
    check_lost_answer("hub.mirrored.after_commit", "mirrored").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_ack_answer_is_safe_to_retry() {
    check_lost_answer("hub.ack.after_commit", "ack").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_handoff_answer_is_safe_to_retry() {
    check_lost_answer("hub.handoff.after_commit", "handoff").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_report_answer_is_safe_to_retry() {
    check_lost_answer("hub.report.after_commit", "report").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_accept_commits_keeps_nothing() {
    let mut hub = Hub::builder().crash_point("hub.accept.before_commit").start();
    let body = submit_body("c", "k", json!(1), &["host-a"]);
    assert!(hub.client("prod").try_post("/v1/messages", &body).await.is_err());
    assert_crashed_at(&mut hub, "hub.accept.before_commit");
    hub.serve(None);
    assert!(hub.deliveries().is_empty(), "an uncommitted accept left deliveries");
    assert_eq!(hub.status_json()["messages"], 0);
    // The producer's retry is a new accept.
    let again = hub.client("prod").post("/v1/messages", &body).await;
    assert_eq!(again.ok(201)["duplicate"], false);
    assert_eq!(hub.deliveries().len(), 1);
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cli_send_that_crashes_before_fan_out_leaves_nothing_and_its_retry_is_new() {
    let hub = Hub::start();
    let args =
        ["send", "--conversation", "c", "--to", "host-a,host-b", "--key", "by-hand", "--payload", "{}", "--json"];
    let mut cmd = hub.cli_command(args);
    cmd.env("BATON_CRASH_POINT", "hub.fanout.before_first");
    let out = crate::harness::output_within(cmd, crate::harness::EVENT_WAIT);
    assert_eq!(out.status.signal(), Some(6), "the send aborted at the crash point: {out:?}");
    // Accept and fan-out are one transaction: the crash left no message and no fan-out due.
    let status = hub.status_json();
    assert_eq!((status["messages"].as_i64(), status["pending_fanout"].as_i64()), (Some(0), Some(0)), "{status}");
    assert!(hub.deliveries().is_empty());
    // The operator's retry is a new accept, fanned out in the same step.
    let again = hub.cli_json(args);
    assert_eq!(again["duplicate"], false);
    assert_eq!(again["deliveries"].as_array().unwrap().len(), 2);
    assert_eq!(hub.status_json()["pending_fanout"], 0);
    assert_eq!(hub.node("host-b", "inst-b").claim(10, 0).await.len(), 1);
    hub.verify_ok();
}
