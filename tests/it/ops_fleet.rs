//! The fleet through the real binary: `hosts list|show` (bound instance, node session, holdings,
//! standing, certificates, events) and `status`, which flags silent hosts and expiring
//! certificates and exits 1 when anything needs attention or the hub is not running.
//!
//! Node sessions are registered by nodes; the rows here are written straight into the record,
//! as a node's registration would leave them.

use crate::harness::Hub;
use serde_json::{Value, json};

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Writes a node session row, as the hub records one when a node registers.
fn insert_session(hub: &Hub, host: &str, session: i64, last_contact_ms: i64, took_over: Option<i64>) {
    let conn = rusqlite::Connection::open(hub.data_dir().join("hub.db")).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    conn.execute(
        "UPDATE node_sessions SET ended_at = ?3, ended_how = 'superseded' WHERE host = ?1 AND session < ?2 AND ended_at IS NULL",
        rusqlite::params![host, session, last_contact_ms],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO node_sessions (host, session, instance_id, node_version, started_at, took_over, last_contact_at)
         VALUES (?1, ?2, 'inst-1', '9.9.9', ?3, ?4, ?3)",
        rusqlite::params![host, session, last_contact_ms, took_over],
    )
    .unwrap();
}

fn host<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array().unwrap().iter().find(|h| h["host"] == name).unwrap_or_else(|| panic!("{name} in {list}"))
}

fn status(hub: &Hub) -> (Option<i32>, Value) {
    let out = hub.cli(["status", "--json"]);
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    (out.status.code(), v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_list_and_show_tell_instance_session_holdings_and_standing() {
    if crate::harness::skipped_on_postgres("hosts_list_and_show_tell_instance_session_holdings_and_standing") {
        return;
    }
    let mut hub = Hub::start();
    hub.enroll_node("host-c");
    let prod = hub.client("prod");
    prod.submit_new("c", "k1", &["host-a"]).await;
    prod.submit_new("c", "k2", &["host-a"]).await;
    prod.submit_new("d", "k3", &["host-b"]).await;
    let node = hub.node("host-a", "inst-1");
    let got = node.claim(2, 0).await;
    node.mirror_and_ack(&got[0]).await;
    hub.cli_ok(["revoke", "host-c", "--reason", "lost", "--yes"]);
    hub.cli_ok(["retire", "host-b", "--reason", "decommissioned", "--yes"]);

    let list = hub.cli_json(["hosts", "list", "--json"]);
    let a = host(&list, "host-a");
    assert_eq!((a["state"].as_str(), a["instance_id"].as_str()), (Some("active"), Some("inst-1")), "{a}");
    assert_eq!(a["holdings"], json!({"claimed": 1, "mirrored": 0, "delivered": 1}));
    assert_eq!(a["session"], Value::Null, "today's node registers no session");
    assert_eq!(host(&list, "host-b")["state"], "retired");
    assert_eq!(host(&list, "host-b")["retired_reason"], "decommissioned");
    assert_eq!(host(&list, "host-c")["state"], "revoked");
    let table = hub.cli_ok(["hosts", "list"]);
    assert!(table.contains("no session"), "{table}");
    assert_eq!(table.lines().count(), 4, "header and three hosts: {table}");

    insert_session(&hub, "host-a", 1, now_ms() - 60_000, None);
    insert_session(&hub, "host-a", 2, now_ms(), Some(1));
    let shown = hub.cli_json(["hosts", "show", "host-a", "--json"]);
    let s = &shown["host"]["session"];
    assert_eq!(
        (s["session"].as_i64(), s["took_over"].as_i64(), s["node_version"].as_str()),
        (Some(2), Some(1), Some("9.9.9"))
    );
    assert_eq!(shown["certificates"].as_array().unwrap().len(), 1);
    assert_eq!(shown["certificates"][0]["revoked"], false);
    assert!(shown["certificates"][0]["not_after_unix"].as_i64().unwrap() > now_ms() / 1000);
    assert!(shown["events"].as_array().unwrap().iter().any(|e| e["action"] == "enroll_node"), "{shown}");
    assert!(shown["events"].as_array().unwrap().iter().any(|e| e["action"] == "mirrored -> delivered"), "{shown}");
    let text = hub.cli_ok(["hosts", "show", "host-a"]);
    assert!(text.contains("took over session 1"), "{text}");
    let revoked = hub.cli_json(["hosts", "show", "host-c", "--json"]);
    assert_eq!(revoked["certificates"][0]["revoked_reason"], "lost");

    let out = hub.cli(["hosts", "show", "host-zz"]);
    assert_eq!(out.status.code(), Some(1), "an unknown host is exit 1: {out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("host-zz"));
}

/// `hosts drain` stops new work for the host and waits, saying what it still holds, until it
/// holds nothing; what is sent meanwhile stays queued, paused, until `hosts undrain`. A
/// deadline that passes first exits 4 naming what is left, the host still paused.
#[test]
fn drain_waits_until_the_host_holds_nothing_and_undrain_resumes() {
    use crate::node_harness::{NODE_WAIT, wait_for};
    let hub = Hub::with_nodes(&["host-a"]);
    // Turns of "long" outlast any deadline here; the others take a few seconds.
    let _node = hub
        .node_process("host-a")
        .then(r#"if [ "$BATON_CONVERSATION" = long ]; then sleep 60; else sleep 3; fi"#)
        .start();
    let first = hub.send_one("c", "k1", "host-a");
    wait_for("the first turn to be handed off", NODE_WAIT, || (hub.state(&first) == "delivered").then_some(()));

    let out = hub.cli(["hosts", "drain", "host-a", "--reason", "kernel upgrade"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(said.contains("pause host host-a"), "{said}");
    assert!(said.contains("host-a: 0 claimed, 0 mirrored, 1 running or unreported"), "{said}");
    assert!(said.contains("host-a holds nothing: drained in"), "{said}");
    assert_eq!(hub.show(&first)["delivery"]["outcome"], "succeeded", "the turn ran to its end");
    // Sent while drained: queued, held back by the drain's pause.
    let waiting = hub.send_one("long", "k2", "host-a");
    let why = hub.cli_json(["deliveries", "explain", &waiting, "--json"]);
    assert_eq!(why["reason_code"], "paused", "{why}");
    // Drained again: the fence is there already, and nothing is held.
    let again = hub.cli_ok(["hosts", "drain", "host-a", "--reason", "still upgrading"]);
    assert!(again.contains("already active") && again.contains("holds nothing"), "{again}");

    hub.cli_ok(["hosts", "undrain", "host-a", "--reason", "upgraded"]);
    wait_for("the queued turn to be handed off", NODE_WAIT, || (hub.state(&waiting) == "delivered").then_some(()));
    let out = hub.cli(["hosts", "drain", "host-a", "--deadline", "1s", "--reason", "once more"]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("deadline (1s) passed: host-a still holds 0 claimed, 0 mirrored, 1 running"), "{said}");
    let fences = hub.cli_json(["fence", "list", "--json"]);
    assert_eq!(fences.as_array().map(Vec::len), Some(1), "the host stays paused: {fences}");
    hub.cli_ok(["hosts", "undrain", "host-a", "--reason", "done"]);
    let none = hub.cli(["hosts", "undrain", "host-a", "--reason", "done"]);
    assert_eq!(none.status.code(), Some(1), "{none:?}");
    assert!(hub.cli(["hosts", "drain", "nobody", "--reason", "typo"]).status.code() == Some(1));
    // A typo'd host is named as never enrolled, not as a host with no pause fence.
    let typo = hub.cli(["hosts", "undrain", "nobody", "--reason", "typo"]);
    assert_eq!(typo.status.code(), Some(1), "{typo:?}");
    assert!(String::from_utf8_lossy(&typo.stderr).contains("host nobody was never enrolled"), "{typo:?}");
    // The long turn is stopped rather than waited for.
    hub.cli_ok(["deliveries", "cancel", &waiting, "--reason", "test over"]);
    hub.wait_outcome(&waiting);
}

/// `status` names what stops work fleet-wide or wants a look, and exits 1 for it: a fence on a
/// host or on everything (one on a conversation is that conversation's business), held
/// deliveries, an outcome `unknown` within `--since`, a CA rotation not finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_fleet_fences_held_work_unknown_outcomes_and_a_ca_rotation() {
    let hub = Hub::start();
    let (code, s) = status(&hub);
    assert_eq!((code, &s["attention"]), (Some(0), &json!([])), "{s}");

    // A turn whose end is not known.
    let prod = hub.client("prod");
    prod.submit_new("c", "k1", &["host-a"]).await;
    let node = hub.node("host-a", "inst-1");
    let got = node.claim(1, 0).await;
    node.mirror_and_ack(&got[0]).await;
    node.report(&got[0], "r-1", "unknown", -1).await.ok(201);
    // A delivery parked by a conversation's hold: the held queue is flagged, the fence is not.
    hub.fence("hold", &["--conversation", "d"], "look first");
    prod.submit_new("d", "k2", &["host-a"]).await;
    assert!(node.claim(1, 0).await.is_empty());
    // Fleet-wide fences, and a CA rotation begun.
    hub.fence("pause", &["--all"], "maintenance window");
    hub.fence("hold", &["--host", "host-b"], "disk check");
    hub.cli_ok(["ca", "rotate"]);

    let (code, s) = status(&hub);
    assert_eq!(code, Some(1), "{s}");
    let items: Vec<(&str, &str)> = s["attention"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["kind"].as_str().unwrap(), a["subject"].as_str().unwrap()))
        .collect();
    let kinds: Vec<&str> = items.iter().map(|(k, _)| *k).collect();
    assert_eq!(kinds, ["fence_active", "fence_active", "held", "unknown_outcomes", "ca_rotation_unfinished"], "{s}");
    assert!(items.contains(&("fence_active", "everything")) && items.contains(&("fence_active", "host host-b")), "{s}");
    let all = s["attention"].as_array().unwrap();
    assert!(all.iter().any(|a| a["detail"].as_str().unwrap().contains("maintenance window")), "{s}");
    assert!(all.iter().any(|a| a["kind"] == "held" && a["detail"].as_str().unwrap().starts_with("1 ")), "{s}");
    assert!(all.iter().any(|a| a["kind"] == "unknown_outcomes" && a["detail"].as_str().unwrap().starts_with("1 ")));
    let text = hub.cli(["status"]);
    assert!(String::from_utf8_lossy(&text.stderr).contains("5 item(s) need attention"), "{text:?}");

    // An unknown outcome before the window is not flagged.
    let out = hub.cli(["status", "--json", "--since", "2099-01-01T00:00:00Z"]);
    let later: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(later["attention"].as_array().unwrap().iter().all(|a| a["kind"] != "unknown_outcomes"), "{later}");
    let bad = hub.cli(["status", "--since", "yesterday-ish"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--since"), "{bad:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_flags_silent_hosts_and_expiring_certificates_and_exits_1() {
    if crate::harness::skipped_on_postgres("status_flags_silent_hosts_and_expiring_certificates_and_exits_1") {
        return;
    }
    let mut hub = Hub::start();
    let (code, s) = status(&hub);
    assert_eq!((code, &s["attention"]), (Some(0), &json!([])), "{s}");
    assert!(hub.cli_ok(["status"]).contains("attention     none"));

    // A node whose open session went quiet ten minutes ago (the default warning is 5m).
    insert_session(&hub, "host-a", 1, now_ms() - 600_000, None);
    hub.cli_ok(["enroll", "producer", "shortlived", "--out", hub.scratch("short").to_str().unwrap(), "--days", "10"]);
    let (code, s) = status(&hub);
    assert_eq!(code, Some(1), "{s}");
    let kinds: Vec<(&str, &str)> = s["attention"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["kind"].as_str().unwrap(), a["subject"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds, [("host_silent", "host-a"), ("certificate_expiring", "producer shortlived")], "{s}");
    let text = hub.cli(["status"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("host_silent"), "{text:?}");
    assert!(String::from_utf8_lossy(&text.stderr).contains("2 item(s) need attention"), "{text:?}");

    // `hosts list` marks the same host silent, in its table and its JSON.
    let listed = hub.cli_ok(["hosts", "list"]);
    let row = listed.lines().find(|l| l.starts_with("host-a")).expect("host-a listed");
    assert!(row.contains("SILENT"), "{listed}");
    assert!(listed.lines().filter(|l| l.contains("SILENT")).count() == 1, "{listed}");
    let hosts: serde_json::Value = serde_json::from_str(&hub.cli_ok(["hosts", "list", "--json"])).unwrap();
    let silent: Vec<&str> =
        hosts.as_array().unwrap().iter().filter(|h| h["silent"] == true).map(|h| h["host"].as_str().unwrap()).collect();
    assert_eq!(silent, ["host-a"], "{hosts}");

    // A warning under one long poll would flag idle hosts: the pair is refused, naming both.
    hub.write_config("host_silence_warn = \"20s\"\n");
    let out = hub.cli(["config", "check"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("host_silence_warn") && said.contains("limits.long_poll_wait_max"), "{said}");

    // The warning is a configuration key: an hour of silence is fine under it.
    hub.write_config("host_silence_warn = \"1h\"\n");
    let (_, s) = status(&hub);
    assert!(s["attention"].as_array().unwrap().iter().all(|a| a["kind"] != "host_silent"), "{s}");
    hub.cli_ok(["revoke", "shortlived", "--reason", "done", "--yes"]);
    assert_eq!(status(&hub).0, Some(0));

    // Not running: exit 1 too.
    hub.terminate();
    let (code, s) = status(&hub);
    assert_eq!((code, s["attention"][0]["kind"].as_str()), (Some(1), Some("hub_not_running")), "{s}");
}

/// The attention items of a `status --json` answer, as (kind, subject, detail).
fn attention(s: &Value) -> Vec<(String, String, String)> {
    let field = |a: &Value, k: &str| a[k].as_str().unwrap_or_default().to_string();
    s["attention"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (field(a, "kind"), field(a, "subject"), field(a, "detail")))
        .collect()
}

/// Work waiting for a host that no node serves is flagged (`host_no_node`) once that has lasted
/// longer than `host_silence_warn`: a host whose node never registered, and one whose node's
/// session ended (a clean stop too). A host enrolled just now is not, nor one an open session
/// serves, so a node on its way or restarting raises nothing.
#[test]
fn status_flags_work_waiting_for_a_host_no_node_serves() {
    if crate::harness::skipped_on_postgres("status_flags_work_waiting_for_a_host_no_node_serves") {
        return;
    }
    let hub = Hub::start();
    hub.cli_ok(["send", "--conversation", "c", "--to", "host-a", "--key", "k1", "--payload", "{}", "--reason", "r"]);
    let (code, s) = status(&hub);
    assert_eq!((code, attention(&s)), (Some(0), vec![]), "just enrolled: {s}");

    let db = || {
        let conn = rusqlite::Connection::open(hub.data_dir().join("hub.db")).unwrap();
        conn.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
        conn
    };
    let ten_minutes_ago = now_ms() - 600_000;
    db().execute("UPDATE hosts SET enrolled_at = ?1", [ten_minutes_ago]).unwrap();
    let (code, s) = status(&hub);
    let items = attention(&s);
    assert_eq!(code, Some(1), "{s}");
    assert_eq!(
        items.iter().map(|(k, h, _)| (k.as_str(), h.as_str())).collect::<Vec<_>>(),
        [("host_no_node", "host-a")]
    );
    assert!(items[0].2.contains("1 delivery(ies) waiting") && items[0].2.contains("no node has registered"), "{s}");
    let text = hub.cli(["status"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("host_no_node"), "{text:?}");

    // An open session serves it.
    insert_session(&hub, "host-a", 1, now_ms(), None);
    let (code, s) = status(&hub);
    assert_eq!((code, attention(&s)), (Some(0), vec![]), "{s}");

    // Its node stopped cleanly ten minutes ago, the work still waiting.
    db().execute(
        "UPDATE node_sessions SET ended_at = ?1, ended_how = 'clean' WHERE host = 'host-a'",
        [ten_minutes_ago],
    )
    .unwrap();
    let (code, s) = status(&hub);
    let items = attention(&s);
    assert_eq!(code, Some(1), "{s}");
    assert_eq!(items.len(), 1, "{s}");
    assert!(items[0].0 == "host_no_node" && items[0].2.contains("session 1 ended (clean)"), "{s}");
}
