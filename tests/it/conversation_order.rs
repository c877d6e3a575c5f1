//! Conversations end to end.
//!
//! - Order under concurrent producers (SPEC §2 "Order"): many producer connections submit at
//!   once into two shared conversations for two hosts, real nodes run every turn, and each host
//!   must have run each conversation's turns in strictly increasing `seq`. The harness command
//!   logs `BATON_DELIVERY_ID BATON_CONVERSATION BATON_SEQ HOST` as the first thing it does, so
//!   the execution log is the order in which turns started on each host.
//! - The producer's side of membership and publish scope (SPEC §3, §6): posts without `to`,
//!   `to` checked against the members, `GET /v1/conversations/{conversation}`, `forbidden` outside the
//!   scope, and the producer's name in claims; membership and scopes are set through the
//!   operator's CLI (`members`, `producers scope`) while the hub runs.

use crate::harness::{Api, Hub};
use crate::node_harness::wait_for;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Concurrent producer connections (each its own TLS client, so its own connection).
const PRODUCERS: usize = 32;
/// Messages each producer submits, alternating between the two conversations.
const MESSAGES_PER_PRODUCER: usize = 16;
/// The shared conversations.
const CONVERSATIONS: [&str; 2] = ["order-one", "order-two"];
/// The recipient hosts of every message.
const HOSTS: [&str; 2] = ["host-a", "host-b"];
/// How long every turn may take to run, end to end, on a loaded 2-core machine.
const ALL_RAN_WAIT: Duration = Duration::from_secs(300);

/// 32 producers × 16 messages into 2 conversations × 2 hosts = 1,024 deliveries: every one runs
/// exactly once, and per (host, conversation) the turns start in strictly increasing `seq`.
#[test]
fn concurrent_producers_into_shared_conversations_run_in_seq_order_per_host() {
    let hub = Hub::with_nodes(&HOSTS);
    // Small, varied claim batches: many claims interleave with the accepts.
    let _a = hub.node_process("host-a").set("claim_batch_max", "3").start();
    let _b = hub.node_process("host-b").set("claim_batch_max", "5").start();

    let started = std::time::Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let producers: Vec<Api> = (0..PRODUCERS).map(|_| hub.client("prod")).collect();
    let submitted: Vec<(String, i64, usize)> = rt.block_on(async {
        let mut tasks = Vec::new();
        for (p, api) in producers.into_iter().enumerate() {
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for m in 0..MESSAGES_PER_PRODUCER {
                    let conversation = CONVERSATIONS[(p + m) % CONVERSATIONS.len()];
                    let s = api.submit_new(conversation, &format!("p{p}-m{m}"), &HOSTS).await;
                    got.push((conversation.to_string(), s.seq, s.deliveries.len()));
                }
                got
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("producer task"));
        }
        all
    });
    eprintln!("submitted in {:?}", started.elapsed());
    let expected: usize = submitted.iter().map(|(_, _, n)| n).sum();
    assert_eq!(expected, PRODUCERS * MESSAGES_PER_PRODUCER * HOSTS.len());
    let mut seqs: HashMap<&str, HashSet<i64>> = HashMap::new();
    for (c, seq, _) in &submitted {
        assert!(seqs.entry(c.as_str()).or_default().insert(*seq), "seq {seq} of {c} was given twice");
    }

    let ran = wait_for("every delivery to run", ALL_RAN_WAIT, || {
        let ran = hub.exec_log().lines();
        (ran.len() >= expected).then_some(ran)
    });
    eprintln!("all ran after {:?}", started.elapsed());
    assert_eq!(ran.len(), expected, "one turn per delivery");
    let ids: HashSet<&str> = ran.iter().map(|r| r.delivery_id.as_str()).collect();
    assert_eq!(ids.len(), expected, "no delivery ran twice");

    let mut last: HashMap<(&str, &str), i64> = HashMap::new();
    let mut out_of_order = Vec::new();
    for r in &ran {
        let key = (r.host.as_str(), r.conversation.as_str());
        if let Some(&prev) = last.get(&key)
            && prev >= r.seq
        {
            out_of_order.push(format!("{} ran {} #{} after #{prev}", r.host, r.conversation, r.seq));
        }
        let e = last.entry(key).or_insert(r.seq);
        *e = (*e).max(r.seq);
    }
    assert!(
        out_of_order.is_empty(),
        "{} of {expected} turns ran after a later turn of their conversation on their host:\n{}",
        out_of_order.len(),
        out_of_order.join("\n")
    );
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_and_publish_scope_through_the_api() {
    let hub = Hub::start();
    let prod = hub.client("prod");

    // An open conversation: a post must name its recipients; the view says it is open.
    let m = prod.submit("open-c", "k0", json!({}), &[]).await.err(400, "no_recipients");
    assert!(m.contains("open-c") && m.contains("to"), "{m}");
    prod.submit_new("open-c", "k1", &["host-a"]).await;
    let v = prod.get("/v1/conversations/open-c").await;
    assert_eq!(v.ok(200), &json!({"conversation": "open-c", "last_seq": 1, "open": true, "members": []}));
    prod.get("/v1/conversations/nowhere").await.err(404, "not_found");
    prod.get("/v1/conversations/Bad").await.err(400, "invalid_field");
    hub.client("host-a").get("/v1/conversations/open-c").await.err(403, "wrong_role");

    // Members host-a and host-b from the start (the operator's command, while the hub runs):
    // a post without `to` goes to both.
    hub.cli_ok(["members", "add", "--conversation", "team", "host-a", "host-b", "--reason", "test"]);
    let first = Submitted(prod.submit("team", "t1", json!({"n": 1}), &[]).await.ok(201).clone());
    assert_eq!(first.hosts(), ["host-a", "host-b"]);
    // host-b leaves after seq 1: a later post without `to` is host-a's alone, and `to` may not
    // name host-b any more.
    hub.cli_ok(["members", "remove", "--conversation", "team", "host-b", "--reason", "test"]);
    let second = Submitted(prod.submit("team", "t2", json!({"n": 2}), &[]).await.ok(201).clone());
    assert_eq!(second.hosts(), ["host-a"]);
    let m = prod.submit("team", "t3", json!({}), &["host-b"]).await.err(400, "invalid_field");
    assert!(m.contains("to[0]") && m.contains("host-b") && m.contains("not a member"), "{m}");
    let view = prod.get("/v1/conversations/team").await;
    let view = view.ok(200);
    assert_eq!((view["last_seq"].as_i64(), view["open"].as_bool()), (Some(2), Some(false)));
    let b = &view["members"][1];
    assert_eq!((b["host"].as_str(), b["current"].as_bool()), (Some("host-b"), Some(false)));
    assert_eq!((b["intervals"][0]["join_seq"].as_i64(), b["intervals"][0]["leave_seq"].as_i64()), (Some(0), Some(1)));

    // host-b still gets the post from before its leave, and the claim names the producer.
    let got = hub.node("host-b", "inst-b").claim(10, 0).await;
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].conversation.as_str(), got[0].seq), ("team", 1));
    let raw = hub.node("host-a", "inst-a").claim_raw(10, 0).await;
    let producers: Vec<&str> = raw.ok(200)["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .filter_map(|d| d["producer"].as_str())
        .collect();
    assert_eq!(producers, ["prod", "prod", "prod"], "open-c #1, team #1, team #2, all by prod");

    // A scoped producer: only `team` and `ops-*`; elsewhere 403 forbidden naming the conversation.
    hub.cli_ok(["producers", "scope", "prod-two", "team", "ops-*", "--reason", "test"]);
    let two = hub.client("prod-two");
    let m = two.submit("open-c", "x1", json!({}), &["host-a"]).await.err(403, "forbidden");
    assert!(m.contains("\"open-c\""), "{m}");
    two.get("/v1/conversations/open-c").await.err(403, "forbidden");
    two.get("/v1/conversations/nowhere").await.err(403, "forbidden");
    two.submit_new("ops-night", "x2", &["host-b"]).await;
    assert_eq!(Submitted(two.submit("team", "x3", json!({}), &[]).await.ok(201).clone()).hosts(), ["host-a"]);
    hub.verify_ok();
}

/// A submit answer, read for its recipient hosts.
struct Submitted(serde_json::Value);

impl Submitted {
    fn hosts(&self) -> Vec<&str> {
        let mut h: Vec<&str> =
            self.0["deliveries"].as_array().expect("deliveries").iter().filter_map(|d| d["host"].as_str()).collect();
        h.sort_unstable();
        h
    }
}
