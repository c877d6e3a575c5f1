//! `deliveries explain`: why a delivery is where it is (the fence holding it, the earlier turn
//! it waits behind, its host's liveness, its run), in one screen or exact JSON; and the same
//! reason in one line on every row of `deliveries list` that is not final.

use crate::harness::{Hub, OPERATOR};
use serde_json::Value;

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
