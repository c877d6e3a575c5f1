//! Pools through the real binaries: an operator makes a pool (`baton-hub pools add`); a
//! message addressed to it (`"pools"` on `POST /v1/messages`, `baton send --pool`) is one
//! delivery with no host and the pool set, shown so in the answer, the message view, the
//! operators' listing, `pools show`, `hosts list` and the pool's gauges on `/metrics`; a replay
//! is a duplicate, an unknown pool a 400 naming it; the record verifies. One hub serves every
//! check.
//!
//! Claiming from a pool with real nodes: three members take a backlog of many conversations,
//! written by 32 concurrent producers, each delivery run once, each conversation's turns
//! started in `seq` order across hosts and never two at once, more than one host at work; a
//! member SIGKILLed mid-turn and retired, another removed from the pool, and the last one
//! finishing everything else.

use crate::harness::{Api, Hub};
use crate::node_harness::{Ran, wait_for};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// The pool's members.
const MEMBERS: [&str; 3] = ["host-a", "host-b", "host-c"];
/// Concurrent producer connections.
const PRODUCERS: usize = 32;
/// Messages each producer submits, spread over `CONVERSATIONS`.
const MESSAGES_PER_PRODUCER: usize = 6;
/// Shared conversations the producers write into.
const CONVERSATIONS: usize = 12;
/// How long every turn may take to run, end to end, on a loaded 2-core machine.
const ALL_RAN_WAIT: Duration = Duration::from_secs(300);

/// Posts one message to the pool `gpu` and returns its seq.
async fn post_to_pool(api: &Api, conversation: &str, key: &str) -> i64 {
    let body = json!({"conversation": conversation, "idempotency_key": key, "payload": {}, "pools": ["gpu"]});
    let r = api.post("/v1/messages", &body).await;
    r.ok(201)["seq"].as_i64().expect("seq")
}

/// Per conversation, from the shared execution log (starts and ends in append order): turns
/// started in strictly increasing `seq` across hosts, and none started while another host's turn
/// of the conversation was running. Returns the problems found.
fn pool_order_problems(events: &[(Ran, bool)]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut last: HashMap<&str, i64> = HashMap::new();
    let mut running: HashMap<&str, Vec<(&str, i64)>> = HashMap::new();
    for (r, end) in events {
        let now = running.entry(r.conversation.as_str()).or_default();
        if *end {
            now.retain(|(h, s)| !(*h == r.host && *s == r.seq));
            continue;
        }
        if let Some(other) = now.iter().find(|(h, _)| *h != r.host) {
            problems.push(format!(
                "{} #{} started on {} while #{} ran on {}",
                r.conversation, r.seq, r.host, other.1, other.0
            ));
        }
        now.push((r.host.as_str(), r.seq));
        if let Some(&prev) = last.get(r.conversation.as_str())
            && prev >= r.seq
        {
            problems.push(format!("{} #{} started on {} after #{prev}", r.conversation, r.seq, r.host));
        }
        last.insert(r.conversation.as_str(), r.seq);
    }
    problems
}

/// 32 producers write a backlog of 192 turns in 12 conversations to a pool of three; then the
/// three members start: every delivery runs once, each conversation in seq order across hosts
/// and never on two hosts at once, and more than one host does work.
#[test]
fn three_members_take_a_backlog_in_order_across_hosts() {
    let hub = Hub::with_nodes(&MEMBERS);
    hub.cli_ok(["pools", "add", "--pool", "gpu", "host-a", "host-b", "host-c", "--reason", "one queue"]);
    // The pool paused until every member is polling: a member that started first would
    // otherwise bind the conversations before the others could claim (affinity keeps them).
    let paused = hub.fence("pause", &["--pool", "gpu"], "the members start first");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let producers: Vec<Api> = (0..PRODUCERS).map(|_| hub.client("prod")).collect();
    let seqs: Vec<(String, i64)> = rt.block_on(async {
        let mut tasks = Vec::new();
        for (p, api) in producers.into_iter().enumerate() {
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for m in 0..MESSAGES_PER_PRODUCER {
                    let conversation = format!("conv-{}", (p + m) % CONVERSATIONS);
                    let seq = post_to_pool(&api, &conversation, &format!("p{p}-m{m}")).await;
                    got.push((conversation, seq));
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
    let expected = PRODUCERS * MESSAGES_PER_PRODUCER;
    assert_eq!(seqs.iter().collect::<HashSet<_>>().len(), expected, "each seq given once");
    // Small claim batches, a third of the conversations at a time and a short turn: the
    // members' claims interleave.
    let _nodes: Vec<_> = MEMBERS
        .iter()
        .map(|h| {
            let node = hub.node_process(h).set("claim_batch_max", "2").set("parallel_conversations", "4");
            node.then("sleep 0.02").trace_ends().start()
        })
        .collect();
    wait_for("every member to have claimed once", ALL_RAN_WAIT, || {
        let hosts = hub.cli_json(["hosts", "list", "--json"]);
        let polled = |h: &str| {
            hosts.as_array().is_some_and(|l| l.iter().any(|e| e["host"] == h && e["instance_id"].is_string()))
        };
        MEMBERS.iter().all(|h| polled(h)).then_some(())
    });
    hub.lift(paused);
    let events = wait_for("every pool delivery to run", ALL_RAN_WAIT, || {
        let events = hub.exec_log().events();
        (events.iter().filter(|(_, end)| *end).count() >= expected).then_some(events)
    });
    let starts: Vec<&Ran> = events.iter().filter(|(_, end)| !end).map(|(r, _)| r).collect();
    assert_eq!(starts.len(), expected, "one turn per delivery");
    assert_eq!(starts.iter().map(|r| &r.delivery_id).collect::<HashSet<_>>().len(), expected, "none ran twice");
    let problems = pool_order_problems(&events);
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
    let hosts: HashSet<&str> = starts.iter().map(|r| r.host.as_str()).collect();
    assert!(hosts.len() > 1, "more than one member did work: {hosts:?}");
    hub.verify_ok();
}

/// A member SIGKILLed mid-turn holds its conversation until it is retired: retiring it ends its
/// turn (`unknown`) and frees the conversation; a member removed from the pool takes nothing
/// more; the remaining member finishes everything else.
#[test]
fn a_killed_member_is_retired_and_the_others_finish() {
    let hub = Hub::with_nodes(&MEMBERS);
    hub.cli_ok(["pools", "add", "--pool", "gpu", "host-a", "host-b", "host-c", "--reason", "one queue"]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let prod = hub.client("prod");
    let gate = hub.scratch("gate").join("open");
    // host-a's turns wait for a gate that never opens: it is killed mid-turn.
    let mut a =
        hub.node_process("host-a").then(&format!("while [ ! -e '{}' ]; do sleep 0.1; done", gate.display())).start();
    rt.block_on(post_to_pool(&prod, "stuck", "s1"));
    let first = wait_for("host-a to start the first turn", Duration::from_secs(60), || {
        hub.exec_log().lines().into_iter().find(|r| r.host == "host-a")
    });
    assert_eq!((first.conversation.as_str(), first.seq), ("stuck", 1));
    a.signal(baton_testkit::Signal::SIGKILL);
    // Posted after the kill: `stuck`'s later turns wait in the pool, bound to silent host-a.
    for i in 0..4 {
        rt.block_on(post_to_pool(&prod, "stuck", &format!("s-more-{i}")));
        rt.block_on(post_to_pool(&prod, &format!("free-{i}"), &format!("f{i}")));
    }
    hub.cli_ok(["pools", "remove", "--pool", "gpu", "host-b", "--reason", "needed elsewhere"]);
    let _b = hub.node_process("host-b").start();
    let _c = hub.node_process("host-c").start();
    // The free conversations go to host-c; `stuck` stays bound to the silent host-a.
    wait_for("host-c to run the free conversations", ALL_RAN_WAIT, || {
        (hub.exec_log().lines().iter().filter(|r| r.host == "host-c").count() >= 4).then_some(())
    });
    assert!(hub.exec_log().lines().iter().all(|r| r.conversation != "stuck" || r.host == "host-a"), "stuck waits");
    hub.cli_ok(["retire", "host-a", "--reason", "gone", "--yes"]);
    let ran = wait_for("host-c to finish stuck", ALL_RAN_WAIT, || {
        let ran = hub.exec_log().lines();
        (ran.iter().filter(|r| r.conversation == "stuck").count() >= 5).then_some(ran)
    });
    let stuck: Vec<(i64, &str)> =
        ran.iter().filter(|r| r.conversation == "stuck").map(|r| (r.seq, r.host.as_str())).collect();
    assert_eq!(stuck, [(1, "host-a"), (2, "host-c"), (3, "host-c"), (4, "host-c"), (5, "host-c")]);
    assert!(ran.iter().all(|r| r.host != "host-b"), "host-b left the pool: {ran:?}");
    let outcome = &hub.show(&first.delivery_id)["delivery"]["outcome"];
    assert_eq!(outcome, "unknown", "the killed turn ended unknown at retire");
    hub.verify_ok();
}

#[test]
fn a_message_to_a_pool_is_one_delivery_no_host_holds_yet() {
    let hub = Hub::with_nodes(&["host-a", "host-b"]);
    hub.cli_ok(["pools", "add", "--pool", "gpu", "host-a", "host-b", "--reason", "more hands"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let prod = hub.client("prod");
    let body = json!({"conversation": "c", "idempotency_key": "k1", "payload": {"n": 1}, "pools": ["gpu"]});
    let sent = rt.block_on(prod.post("/v1/messages", &body));
    let sent = sent.ok(201).clone();
    let d = &sent["deliveries"];
    assert_eq!(d.as_array().map(Vec::len), Some(1), "{sent}");
    assert_eq!((&d[0]["host"], &d[0]["pool"], &d[0]["state"]), (&json!(null), &json!("gpu"), &json!("queued")));
    let again = rt.block_on(prod.post("/v1/messages", &body));
    assert_eq!(again.ok(200)["duplicate"], true, "a replay with the same pools");
    let other = json!({"conversation": "c", "idempotency_key": "k1", "payload": {"n": 1}, "to": ["host-a"]});
    rt.block_on(prod.post("/v1/messages", &other)).err(409, "idempotency_conflict");
    let unknown = json!({"conversation": "c", "idempotency_key": "k2", "payload": {}, "pools": ["gpu", "nope"]});
    let why = rt.block_on(prod.post("/v1/messages", &unknown)).err(400, "invalid_field");
    assert!(why.contains("pools[1]") && why.contains("nope"), "{why}");

    let view = rt.block_on(prod.message(sent["message_id"].as_str().unwrap()));
    let view = view.ok(200);
    assert_eq!((&view["deliveries"][0]["host"], &view["deliveries"][0]["pool"]), (&json!(null), &json!("gpu")));
    assert_eq!(hub.deliveries().len(), 1, "the operators' listing reads it");
    let gpu = hub.cli_json(["pools", "show", "gpu", "--json"]);
    assert_eq!(gpu[0]["queued"], 1, "{gpu}");

    // `baton send --pool`, beside `--to`.
    use crate::producer_cli::{baton, config_file, json as out_json, run, status};
    let config = config_file(&hub, true);
    let mut cmd = baton(["--config", &config.display().to_string(), "--json", "send", "--conversation", "c"]);
    cmd.args(["--to", "host-a", "--pool", "gpu", "--key", "k3", "--payload", "{}"]);
    let out = run(cmd);
    status(&out, 0);
    let sent = out_json(&out);
    assert_eq!(sent["deliveries"][0]["host"], "host-a", "{sent}");
    assert_eq!((&sent["deliveries"][1]["host"], &sent["deliveries"][1]["pool"]), (&json!(null), &json!("gpu")));
    assert_eq!(hub.cli_json(["pools", "show", "gpu", "--json"])[0]["queued"], 2);
    assert_eq!(hub.cli_json(["hosts", "list", "--json"])[0]["pools"], json!(["gpu"]));
    hub.verify_ok();

    // A pool as a conversation's member: a post naming no recipients reaches it.
    hub.cli_ok(["members", "add", "--conversation", "team", "--pool", "gpu", "--reason", "the team's queue"]);
    let listed = hub.cli_json(["members", "list", "--conversation", "team", "--json"]);
    assert_eq!((&listed[0]["pools"][0]["pool"], &listed[0]["pools"][0]["current"]), (&json!("gpu"), &json!(true)));
    let body = json!({"conversation": "team", "idempotency_key": "t1", "payload": {}});
    let posted = rt.block_on(prod.post("/v1/messages", &body));
    let posted = posted.ok(201).clone();
    assert_eq!((&posted["deliveries"][0]["host"], &posted["deliveries"][0]["pool"]), (&json!(null), &json!("gpu")));
    let view = rt.block_on(prod.get("/v1/conversations/team"));
    assert_eq!((&view.ok(200)["open"], &view.ok(200)["pools"]), (&json!(false), &json!(["gpu"])));
    // A fence on the pool, by name; a pool that does not exist is refused as a typo.
    hub.cli_ok(["fence", "pause", "--pool", "gpu", "--reason", "maintenance"]);
    let fences = hub.cli_json(["fence", "list", "--json"]);
    assert!(fences.as_array().unwrap().iter().any(|f| f["scope"] == "pool" && f["target"] == "gpu"), "{fences}");
    let typo = hub.cli(["fence", "pause", "--pool", "gpux", "--reason", "maintenance"]);
    assert_eq!(typo.status.code(), Some(2), "{}", String::from_utf8_lossy(&typo.stderr));
    assert!(String::from_utf8_lossy(&typo.stderr).contains("there is no pool gpux"));

    // The pool's queue on /metrics (from the hub's periodic read of the record).
    let metrics = format!("http://{}/metrics", crate::status_page::operator_addr(&hub));
    crate::node_harness::wait_for("the pool's queue on /metrics", std::time::Duration::from_secs(60), || {
        let text = rt.block_on(async { reqwest::get(&metrics).await.ok()?.text().await.ok() })?;
        (text.contains("baton_hub_pool_queued{pool=\"gpu\"} 3")
            && text.contains("baton_hub_pool_oldest_queued_age_seconds{pool=\"gpu\"}"))
        .then_some(())
    });
}
