//! Pools through the real binaries: an operator makes a pool (`baton-hub pools add`); a
//! message addressed to it (`"pools"` on `POST /v1/messages`, `baton send --pool`) is one
//! delivery with no host and the pool set, shown so in the answer, the message view, the
//! operators' listing, `pools show`, `hosts list` and the pool's gauges on `/metrics`; a replay
//! is a duplicate, an unknown pool a 400 naming it; the record verifies. One hub serves every
//! check.

use crate::harness::Hub;
use serde_json::json;

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

    // The pool's queue on /metrics (from the hub's periodic read of the record).
    let metrics = format!("http://{}/metrics", crate::status_page::operator_addr(&hub));
    crate::node_harness::wait_for("the pool's queue on /metrics", std::time::Duration::from_secs(60), || {
        let text = rt.block_on(async { reqwest::get(&metrics).await.ok()?.text().await.ok() })?;
        (text.contains("baton_hub_pool_queued{pool=\"gpu\"} 2")
            && text.contains("baton_hub_pool_oldest_queued_age_seconds{pool=\"gpu\"}"))
        .then_some(())
    });
}
