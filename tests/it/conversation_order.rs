//! Conversation order under concurrent producers (SPEC §2 "Order"): many producer connections
//! submit at once into two shared conversations for two hosts, real nodes run every turn, and
//! each host must have run each conversation's turns in strictly increasing `seq`.
//!
//! The harness command logs `BATON_DELIVERY_ID BATON_CONVERSATION BATON_SEQ HOST` as the first
//! thing it does, so the execution log is the order in which turns started on each host.

use crate::harness::Api;
use crate::node_harness::{TestHub, wait_for};
use std::collections::{HashMap, HashSet};
use std::fs;
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
    let hub = TestHub::start(&HOSTS);
    // Small, varied claim batches: many claims interleave with the accepts.
    let _a = hub.node("host-a").set("claim_batch_max", "3").start();
    let _b = hub.node("host-b").set("claim_batch_max", "5").start();

    let started = std::time::Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let identity = hub.identity("prod");
    let (ca, pem) = (fs::read(&identity.ca).expect("ca"), identity.pem());
    let producers: Vec<Api> = (0..PRODUCERS).map(|_| Api::new(&hub.url(), Some(&ca), Some(&pem))).collect();
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
