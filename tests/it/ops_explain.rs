//! `deliveries explain`: why a delivery is where it is (the fence holding it, the earlier turn
//! it waits behind, its host's liveness, its run), in one screen or exact JSON; and the same
//! reason in one line on every row of `deliveries list` that is not final. For a pool
//! delivery: its pool, each member's standing (active, busy, fenced, silent) and whether its
//! conversation is bound, kept for its last host or free; the same standing in `pools
//! list|show` and on the status page.

use crate::harness::{Api, Hub, OPERATOR};
use serde_json::{Value, json};

fn explain(hub: &Hub, id: &str) -> Value {
    hub.cli_json(["deliveries", "explain", id, "--json"])
}

fn listed<'a>(rows: &'a [Value], id: &str) -> &'a Value {
    rows.iter().find(|r| r["delivery_id"] == id).unwrap_or_else(|| panic!("{id} not listed in {rows:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_the_fence_the_earlier_turn_the_host_and_the_run() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let hostile = "look \x1b]52;c;aGk=\x07 \x1b[2J first";
    let pause = hub.fence("pause", &["--conversation", "c"], hostile);
    let first = prod.submit_new("c", "k1", &["host-a"]).await.to("host-a").to_string();
    let second = prod.submit_new("c", "k2", &["host-a"]).await.to("host-a").to_string();

    // Paused: the fence, exactly, in JSON; escaped on the screen.
    let e = explain(&hub, &first);
    assert_eq!(e["reason_code"], "paused", "{e}");
    assert_eq!(e["fence"]["id"], pause);
    assert_eq!(
        (&e["fence"]["kind"], &e["fence"]["scope"], &e["fence"]["target"], &e["fence"]["set_by"]),
        (&Value::from("pause"), &Value::from("conversation"), &Value::from("c"), &Value::from(OPERATOR))
    );
    assert_eq!(e["fence"]["reason"], hostile, "--json is exact");
    assert_eq!(e["delivery"]["state"], "queued");
    assert_eq!(e["run"]["attempt"], 1);
    assert_eq!(e["host"]["host"], "host-a");
    assert_eq!(e["host"]["session"], Value::Null, "no node registered yet");
    let screen = hub.cli_ok(["deliveries", "explain", &first[..first.len() - 2]]);
    assert!(!screen.contains('\x1b') && !screen.contains('\x07'), "{screen:?}");
    assert!(screen.contains("\\x1b]52") && screen.contains(&format!("pause {pause} on conversation c")), "{screen}");

    // The list gives every row that is not final the same reason; the stored one stays apart.
    let rows = hub.deliveries();
    assert_eq!(listed(&rows, &second)["reason_code"], "paused");
    assert!(listed(&rows, &second)["reason"].as_str().unwrap().contains(&format!("pause fence {pause}")));
    assert_eq!(listed(&rows, &second)["stored_reason"], Value::Null);
    let table = hub.cli_ok(["deliveries", "list", "--oldest"]);
    assert!(!table.contains('\x1b') && table.contains("paused by pause fence"), "{table}");
    hub.lift(pause);

    // The first is claimed; the second could be claimed but no node session is open.
    let node = hub.node("host-a", "inst-1");
    let got = node.claim(1, 0).await;
    assert_eq!(got[0].delivery_id, first);
    let e = explain(&hub, &first);
    assert_eq!((e["reason_code"].as_str(), e["delivery"]["instance_id"].as_str()), (Some("claimed"), Some("inst-1")));
    assert_eq!(explain(&hub, &second)["reason_code"], "no_node");

    // Held by a hold fence at claim time; a later turn of the conversation waits behind it.
    let hold = hub.fence("hold", &["--conversation", "d"], "hold d");
    let held = prod.submit_new("d", "k3", &["host-a"]).await.to("host-a").to_string();
    let got = node.claim(4, 0).await;
    assert_eq!(got.iter().map(|c| c.delivery_id.as_str()).collect::<Vec<_>>(), [second.as_str()]);
    hub.lift(hold);
    let later = prod.submit_new("d", "k4", &["host-a"]).await.to("host-a").to_string();
    let e = explain(&hub, &held);
    assert_eq!((e["reason_code"].as_str(), e["delivery"]["state"].as_str()), (Some("held"), Some("held")));
    assert_eq!(e["fence"], Value::Null, "the hold was lifted; the delivery still needs a release");
    let e = explain(&hub, &later);
    assert_eq!(e["reason_code"], "behind", "{e}");
    assert_eq!(e["behind"]["delivery_id"], held.as_str());
    assert_eq!((e["behind"]["seq"].as_i64(), e["behind"]["state"].as_str()), (Some(1), Some("held")));
    assert_eq!(e["behind"]["host"], "host-a");
    let screen = hub.cli_ok(["deliveries", "explain", &later]);
    assert!(screen.contains(&format!("behind        seq 1: delivery {held}, held on host-a")), "{screen}");

    // Delivered: on its node it waits behind the first, still claimed; then final.
    node.mirror_and_ack(&got[0]).await;
    let e = explain(&hub, &second);
    assert_eq!(e["reason_code"], "behind", "{e}");
    assert_eq!(
        (e["behind"]["delivery_id"].as_str(), e["behind"]["state"].as_str()),
        (Some(first.as_str()), Some("claimed"))
    );
    assert_eq!(e["run"]["report_outstanding"], false);
    node.report(&got[0], "r1", "succeeded", 0).await.ok(201);
    let e = explain(&hub, &second);
    assert_eq!((e["reason_code"].as_str(), e["run"]["outcome"].as_str()), (Some("final"), Some("succeeded")));
    let rows = hub.deliveries();
    assert_eq!(listed(&rows, &second)["reason_code"], Value::Null, "a final row keeps its stored reason");

    // Exit statuses: an unknown id is "not found" (1), a bad one is usage (2).
    assert_eq!(hub.cli(["deliveries", "explain", "no-such-delivery"]).status.code(), Some(1));
    assert_eq!(hub.cli(["deliveries", "explain", "bad id!"]).status.code(), Some(2));
}

/// Posts one message of conversation `c` to the pool `gpu`; its delivery's id.
async fn post_to_gpu(prod: &Api, key: &str) -> String {
    let body = json!({"conversation": "c", "idempotency_key": key, "payload": {}, "pools": ["gpu"]});
    let sent = prod.post("/v1/messages", &body).await;
    sent.ok(201)["deliveries"][0]["delivery_id"].as_str().expect("delivery id").to_string()
}

/// The member `host` in a pool's JSON members.
fn member<'a>(pool: &'a Value, host: &str) -> &'a Value {
    let members = pool["members"].as_array().unwrap_or_else(|| panic!("no members in {pool}"));
    members.iter().find(|m| m["host"] == host).unwrap_or_else(|| panic!("{host} not a member in {pool}"))
}

/// One hub, a pool of three (host-c fenced): a pool delivery waiting in the pool has no host,
/// names its pool and members and waits behind its earlier turn; a fence on the pool pauses
/// it; once host-a claims the first turn the conversation is bound to host-a (named with the
/// turn in flight) and host-a is busy, in `explain`, `pools show|list` and on the status page;
/// once that turn ends the next is kept for host-a (`pool_affinity_wait`), and another member
/// takes nothing of it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_a_pool_deliverys_pool_its_members_and_its_binding() {
    let hub = Hub::builder()
        .nodes(&["host-a", "host-b", "host-c"])
        .producers(&["prod"])
        .config("[limits]\npool_affinity_wait = \"5m\"\n")
        .start();
    hub.cli_ok(["pools", "add", "--pool", "gpu", "host-a", "host-b", "host-c", "--reason", "one queue"]);
    let drain = hub.fence("pause", &["--host", "host-c"], "draining c");
    let prod = hub.client("prod");
    let first = post_to_gpu(&prod, "k1").await;
    let second = post_to_gpu(&prod, "k2").await;

    // Waiting in the pool: no host of its own, the pool's members, the conversation free.
    let e = explain(&hub, &first);
    assert_eq!(
        (&e["host"], &e["delivery"]["host"], &e["delivery"]["pool"]),
        (&Value::Null, &Value::Null, &json!("gpu"))
    );
    let pool = &e["pool"];
    assert_eq!((pool["name"].as_str(), pool["members"].as_array().map(Vec::len)), (Some("gpu"), Some(3)), "{e}");
    assert_eq!(
        (&member(pool, "host-c")["fenced"], &member(pool, "host-c")["fence"]["id"]),
        (&json!(true), &json!(drain))
    );
    let a = member(pool, "host-a");
    assert_eq!(
        (&a["active"], &a["fenced"], &a["busy"], &a["connected"]),
        (&json!(true), &json!(false), &json!(false), &json!(false))
    );
    assert_eq!(pool["members_may_claim"], 2);
    assert_eq!(
        (pool["conversation"]["kind"].as_str(), &pool["conversation"]["last_host"]),
        (Some("free"), &Value::Null)
    );
    assert_eq!(e["reason_code"], "no_node", "no member has a node session: {e}");
    let e = explain(&hub, &second);
    assert_eq!(
        (e["reason_code"].as_str(), e["behind"]["delivery_id"].as_str()),
        (Some("behind"), Some(first.as_str()))
    );
    assert_eq!((&e["behind"]["host"], &e["behind"]["pool"]), (&Value::Null, &json!("gpu")));
    assert_eq!(hub.show(&second)["delivery"]["pool"], "gpu", "deliveries show reads a pool delivery");
    let screen = hub.cli_ok(["deliveries", "explain", &first]);
    for line in
        ["pool          gpu: 3 member(s), 2 may take pool work", "  member      host-c fenced", "conversation  free"]
    {
        assert!(screen.contains(line), "{line:?} in:\n{screen}");
    }
    let pause = hub.fence("pause", &["--pool", "gpu"], "pool paused");
    let e = explain(&hub, &first);
    assert_eq!(
        (e["reason_code"].as_str(), e["fence"]["scope"].as_str(), e["fence"]["id"].as_i64()),
        (Some("paused"), Some("pool"), Some(pause))
    );
    hub.lift(pause);

    // host-a claims the first turn: the conversation is bound to it, the second waits for it.
    let node_a = hub.node("host-a", "inst-a");
    let got = node_a.claim(1, 0).await;
    assert_eq!(got.iter().map(|c| c.delivery_id.as_str()).collect::<Vec<_>>(), [first.as_str()], "the first turn");
    let e = explain(&hub, &first);
    assert_eq!(
        (e["reason_code"].as_str(), e["host"]["host"].as_str(), e["pool"]["name"].as_str()),
        (Some("claimed"), Some("host-a"), Some("gpu"))
    );
    let e = explain(&hub, &second);
    assert_eq!(e["reason_code"], "pool_bound", "{e}");
    let bound = &e["pool"]["conversation"];
    assert_eq!(
        (bound["kind"].as_str(), bound["host"].as_str(), bound["in_flight"].as_i64()),
        (Some("bound"), Some("host-a"), Some(1))
    );
    assert_eq!(
        (bound["turn"]["delivery_id"].as_str(), bound["turn"]["state"].as_str()),
        (Some(first.as_str()), Some("claimed"))
    );
    assert!(e["reason"].as_str().unwrap().contains(&format!("seq 1 (delivery {first}, claimed)")), "{e}");
    assert_eq!(
        (&member(&e["pool"], "host-a")["busy"], &member(&e["pool"], "host-a")["in_flight"]),
        (&json!(true), &json!(1))
    );

    let shown = hub.cli_json(["pools", "show", "gpu", "--json"]);
    let gpu = &shown[0];
    assert_eq!(
        (gpu["queued"].as_i64(), gpu["in_flight"].as_i64(), gpu["bound_conversations"].as_i64()),
        (Some(1), Some(1), Some(1)),
        "{gpu}"
    );
    assert_eq!(
        (&member(gpu, "host-a")["bound_conversations"], &member(gpu, "host-c")["fenced"]),
        (&json!(1), &json!(true))
    );
    let table = hub.cli_ok(["pools", "list"]);
    assert!(table.contains("host-a (no node, busy)") && table.contains("host-c (fenced)"), "{table}");

    // The status page shows the pool with the same counts and standings.
    let addr = crate::status_page::operator_addr(&hub);
    let page = crate::status_page::get_as(&addr, &addr, "/").expect("the status page");
    for cell in [
        "data-pool-queued=\"gpu\">1<",
        "data-pool-in-flight=\"gpu\">1<",
        "data-pool-bound=\"gpu\">1<",
        "data-pool-member=\"gpu/host-a\">host-a no node, busy<",
        "data-pool-member=\"gpu/host-c\">host-c fenced<",
    ] {
        assert!(page.contains(cell), "{cell} on the page:\n{page}");
    }

    // The first turn ends: the second is kept for host-a, and host-b takes nothing of it.
    node_a.mirror_and_ack(&got[0]).await;
    node_a.report(&got[0], "r1", "succeeded", 0).await.ok(201);
    let e = explain(&hub, &second);
    assert_eq!(e["reason_code"], "pool_affinity", "{e}");
    let kept = &e["pool"]["conversation"];
    assert_eq!((kept["kind"].as_str(), kept["host"].as_str()), (Some("preferred"), Some("host-a")));
    assert!(kept["until_ms"].as_i64().is_some_and(|t| t > e["delivery"]["updated_at_ms"].as_i64().unwrap()), "{kept}");
    assert!(hub.node("host-b", "inst-b").claim(4, 0).await.is_empty(), "kept for host-a");
    let rows = hub.deliveries();
    let row = listed(&rows, &second);
    assert_eq!(
        (row["reason_code"].as_str(), &row["host"], row["pool"].as_str()),
        (Some("pool_affinity"), &Value::Null, Some("gpu"))
    );
    let shown = hub.cli_json(["pools", "show", "gpu", "--json"]);
    assert_eq!((shown[0]["in_flight"].as_i64(), shown[0]["bound_conversations"].as_i64()), (Some(0), Some(0)));
    hub.verify_ok();
}
