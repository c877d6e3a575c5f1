//! A node given several hubs (`hub_url` as a list) over one record: it works through the one
//! that answers, moves to the next when the one it uses is gone, resyncs there, and every
//! message is delivered exactly once.

use crate::harness::{EVENT_WAIT, Hub, bins, output_within};
use crate::node_harness::{NODE_WAIT, wait_for};
use baton_testkit::Started;
use serde_json::Value;
use std::collections::HashMap;
use std::net::SocketAddr;

/// A port on 127.0.0.1 that nothing listens on (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// How many deliveries have an outcome.
pub(crate) fn done_count(hub: &Hub) -> usize {
    hub.deliveries().iter().filter(|d| !d["outcome"].is_null()).count()
}

/// Sends `n` messages to `hosts` over three conversations; returns delivery id → (host,
/// conversation).
pub(crate) fn send_many(hub: &Hub, n: usize, hosts: &[&str]) -> HashMap<String, (String, String)> {
    let mut expected = HashMap::new();
    for i in 0..n {
        let conversation = format!("conv-{}", i % 3);
        for (host, id) in hub.send(&conversation, &format!("k{i}"), hosts) {
            expected.insert(id, (host, conversation.clone()));
        }
    }
    expected
}

/// Every delivery of `expected` ran once on its host, in order per conversation, and has one
/// succeeded attempt; the record verifies.
pub(crate) fn assert_each_once(hub: &Hub, expected: &HashMap<String, (String, String)>) {
    for id in expected.keys() {
        hub.assert_one_attempt(id, "succeeded");
    }
    assert_eq!(hub.deliveries().len(), expected.len());
    assert_eq!(hub.status_json()["attempts"], expected.len(), "every report counted exactly once");
    let ran = hub.exec_log().lines();
    assert_eq!(ran.len(), expected.len(), "one turn per delivery");
    for r in &ran {
        let (host, conversation) = expected.get(&r.delivery_id).expect("known delivery");
        assert_eq!((&r.host, &r.conversation), (host, conversation));
    }
    hub.exec_log().assert_one_at_a_time_in_order();
    hub.verify_ok();
}

/// `hub_url = [dead, live]`: the first hub never answers (nothing listens there), the node
/// moves to the second at its first request and everything flows through it.
#[test]
fn a_dead_first_hub_is_passed_over_and_nothing_is_lost() {
    let hub = Hub::with_nodes(&["host-a"]);
    let dead = format!("https://127.0.0.1:{}", free_port());
    let node =
        hub.node_process("host-a").trace_ends().env("BATON_NODE_HUB_URL", &format!("{dead},{}", hub.url())).start();
    let expected = send_many(&hub, 12, &["host-a"]);
    wait_for("every delivery to have an outcome", NODE_WAIT, || (done_count(&hub) == expected.len()).then_some(()));
    node.wait_idle();
    assert_each_once(&hub, &expected);
    let logs = node.logs();
    assert!(
        logs.contains(&format!("the hub at {dead} is unavailable"))
            && logs.contains(&format!("now using the hub at {}", hub.url())),
        "the node says it moved:\n{logs}"
    );
}

/// The hub serving at address A is SIGKILLed while the nodes work; the same data directory is
/// served again at address B (another port, named `localhost`, which the hub's certificate
/// covers as it covers 127.0.0.1). The nodes, given [A, B], move to B, resync, and every
/// message is delivered exactly once.
#[test]
fn a_hub_killed_at_one_address_and_served_at_another_loses_nothing() {
    let mut hub = Hub::with_nodes(&["host-a", "host-b"]);
    let port_b = free_port();
    let url_b = format!("https://localhost:{port_b}");
    let hubs = format!("{},{url_b}", hub.url());
    // Everything is sent before the nodes start, and each turn takes a second (three
    // conversations a host, so about eight seconds of turns each): the kill falls mid-way
    // however slowly a loaded machine sends and polls.
    let expected = send_many(&hub, 24, &["host-a", "host-b"]);
    let total = expected.len();
    let a = hub.node_process("host-a").then("sleep 1").trace_ends().env("BATON_NODE_HUB_URL", &hubs).start();
    let b = hub.node_process("host-b").then("sleep 1").trace_ends().env("BATON_NODE_HUB_URL", &hubs).start();

    let at_kill = wait_for("some outcomes before the kill", NODE_WAIT, || {
        let n = done_count(&hub);
        (n >= 6).then_some(n)
    });
    hub.kill9();
    let kit = hub.kit_mut();
    kit.listen_on(SocketAddr::from(([127, 0, 0, 1], port_b)));
    match kit.serve(None).unwrap_or_else(|e| panic!("{e:#}")) {
        Started::Ready(addr) => assert_eq!(addr.port(), port_b),
        Started::Exited(status) => panic!("baton-hub serve exited ({status}) at the second address"),
    }

    wait_for("every delivery to have an outcome", NODE_WAIT, || (done_count(&hub) == total).then_some(()));
    a.wait_idle();
    b.wait_idle();
    assert!(at_kill < total, "the kill happened mid-way ({at_kill} of {total} done)");
    assert_each_once(&hub, &expected);
    for node in [&a, &b] {
        let logs = node.logs();
        assert!(logs.contains(&format!("now using the hub at {url_b}")), "the node says it moved:\n{logs}");
        assert!(logs.matches("holdings resync").count() >= 2, "the node resynced at the new hub:\n{logs}");
    }
}

/// `config check --online` with `hub_url` as an array in the file: every hub is contacted and
/// the check says which answered; a standby that does not answer is a warning, which passes.
#[test]
fn config_check_online_names_every_hub_and_which_answered() {
    let hub = Hub::with_nodes(&["host-a"]);
    let dir = hub.scratch("check-list");
    let id = hub.identity("host-a");
    let dead = format!("https://127.0.0.1:{}", free_port());
    let s = |p: &std::path::Path| serde_json::to_string(&p.display().to_string()).expect("json");
    let text = format!(
        "hub_url = [{}, {}]\nca_file = {}\ncert_file = {}\nkey_file = {}\ndata_dir = {}\ncommand = [\"sh\"]\n",
        serde_json::to_string(&hub.url()).expect("json"),
        serde_json::to_string(&dead).expect("json"),
        s(&id.ca),
        s(&id.cert),
        s(&id.key),
        s(&dir.join("data")),
    );
    let config = dir.join("node.toml");
    std::fs::write(&config, text).expect("write node.toml");
    let mut cmd = bins().node_command();
    cmd.args(["config", "check", "--online", "--json", "--config"]).arg(&config);
    let out = output_within(cmd, EVENT_WAIT * 2);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    assert_eq!(out.status.code(), Some(0), "{json:#}");
    let check = json["checks"].as_array().expect("checks").iter().find(|c| c["name"] == "hub").expect("hub check");
    let detail = check["detail"].as_str().expect("detail");
    assert_eq!(check["status"], "warn", "{check:#}");
    for says in [
        "1 of 2 hubs answered".to_string(),
        format!("[1] the hub at {} answered and accepted this node's certificate", hub.url()),
        format!("[2] the hub at {dead} is unreachable"),
    ] {
        assert!(detail.contains(&says), "{detail} lacks {says}");
    }
}
