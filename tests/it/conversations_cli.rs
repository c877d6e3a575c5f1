//! The operator's side of conversations through the real binaries: `members add|remove|list`
//! and `producers scope|list` (exit codes, the `--json` shapes), `enroll producer
//! --conversations`, `retire` ending memberships, and real nodes running what a post without
//! `to` routes to the members, with the producer's name in the harness environment.

use crate::harness::{Hub, OPERATOR};
use crate::node_harness::wait_for;
use serde_json::{Value, json};
use std::time::Duration;

/// How long every expected turn may take to run, end to end, on a loaded machine.
const RAN_WAIT: Duration = Duration::from_secs(120);

/// Runs the CLI and returns (exit status, stdout, stderr).
fn run(hub: &Hub, args: &[&str]) -> (Option<i32>, String, String) {
    let out = hub.cli(args);
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[track_caller]
fn assert_exit(hub: &Hub, args: &[&str], code: i32, says: &str) {
    let (status, stdout, stderr) = run(hub, args);
    assert_eq!(status, Some(code), "{args:?}: stdout {stdout} stderr {stderr}");
    assert!(stdout.contains(says) || stderr.contains(says), "{args:?} should say {says:?}: {stdout} {stderr}");
}

/// Strips the timestamps (checked to be numbers) so a shape can be compared whole.
fn without_times(mut v: Value) -> Value {
    for c in v.as_array_mut().expect("an array of conversations") {
        for m in c["members"].as_array_mut().expect("members") {
            for i in m["intervals"].as_array_mut().expect("intervals") {
                let i = i.as_object_mut().expect("an interval object");
                assert!(i.remove("joined_at_ms").is_some_and(|t| t.is_i64()), "{i:?}");
                let left = i.remove("left_at_ms").expect("left_at_ms");
                assert!(left.is_i64() || left.is_null(), "{i:?}");
            }
        }
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_commands_say_what_changed_with_their_exit_codes() {
    let hub = Hub::start();
    let add = ["members", "add", "--conversation", "team", "host-a", "host-b", "--reason", "pool"];
    assert_exit(&hub, &add, 0, "host-a: joined team after seq 0");
    assert_exit(&hub, &add, 1, "already a member");
    // An unknown host is refused by name, and nothing else changes with it.
    assert_exit(&hub, &["members", "add", "--conversation", "team", "ghost"], 2, "ghost");
    assert_exit(&hub, &["members", "remove", "--conversation", "team", "host-a", "ghost"], 2, "ghost");
    assert_exit(&hub, &["members", "add", "--conversation", "Bad", "host-a"], 2, "conversation");
    assert_exit(&hub, &["members", "remove", "--conversation", "nowhere", "host-a"], 1, "nowhere");
    assert_exit(&hub, &["members", "list", "--conversation", "nowhere"], 1, "nowhere");

    hub.client("prod").submit_new("team", "k1", &[]).await;
    let remove = ["members", "remove", "--conversation", "team", "host-b", "--reason", "moved"];
    assert_exit(&hub, &remove, 0, "host-b: left team after seq 1");
    assert_exit(&hub, &remove, 1, "not a member");
    hub.cli_ok(["members", "add", "--conversation", "team", "host-b", "--reason", "back"]);

    let listed = hub.cli_json(["members", "list", "--json"]);
    assert_eq!(hub.cli_json(["members", "list", "--conversation", "team", "--json"]), listed);
    let interval = |join: i64, why: &str, leave: Option<(i64, &str)>| {
        json!({
            "join_seq": join, "joined_by": OPERATOR, "join_reason": why,
            "leave_seq": leave.map(|l| l.0), "left_by": leave.map(|_| OPERATOR), "leave_reason": leave.map(|l| l.1),
            "family": null,
        })
    };
    assert_eq!(
        without_times(listed),
        json!([{
            "conversation": "team",
            "last_seq": 1,
            "members": [
                {"host": "host-a", "current": true, "intervals": [interval(0, "pool", None)]},
                {"host": "host-b", "current": true, "intervals": [
                    interval(0, "pool", Some((1, "moved"))),
                    interval(1, "back", None),
                ]},
            ],
            "pools": [],
            "mentions": [],
        }])
    );
    let table = hub.cli_ok(["members", "list"]);
    assert!(table.starts_with("CONVERSATION") && table.lines().count() == 4, "{table}");

    // Retiring a host ends its memberships in the same step.
    let out = hub.cli_ok(["retire", "host-a", "--reason", "decommissioned", "--yes"]);
    assert!(out.contains("left 1 conversation(s): team"), "{out}");
    let after = hub.cli_json(["members", "list", "--json"]);
    assert_eq!(after[0]["members"][0]["current"], false, "{after}");
    assert_eq!(after[0]["members"][0]["intervals"][0]["leave_reason"], "decommissioned", "{after}");
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_are_enrolled_scoped_and_listed() {
    let hub = Hub::start();
    let out_dir = hub.scratch("scoped-certs");
    let out = out_dir.to_str().expect("utf-8 path");
    // A bad pattern is refused before a certificate is issued.
    assert_exit(&hub, &["enroll", "producer", "scoped", "--out", out, "--conversations", "a*b"], 2, "a*b");
    assert!(!out_dir.join("scoped.crt").exists());
    hub.cli_ok(["enroll", "producer", "scoped", "--out", out, "--conversations", "team", "ops-*", "team"]);

    let listed = hub.cli_json(["producers", "list", "--json"]);
    let row = |name: &str, conversations: Value, default_scope: bool| {
        json!({
            "name": name, "conversations": conversations, "default_scope": default_scope,
            "active_certificates": 1, "revoked_certificates": 0,
            "max_unsettled": null, "max_unsettled_bytes": null, "unsettled": 0, "unsettled_bytes": 0,
            "may_approve": [],
        })
    };
    assert_eq!(
        listed,
        json!([
            row("prod", json!(["*"]), true),
            row("prod-two", json!(["*"]), true),
            row("scoped", json!(["ops-*", "team"]), false)
        ])
    );

    assert_exit(&hub, &["producers", "scope", "prod-two", "support-*", "--reason", "narrow"], 0, "support-*");
    assert_exit(&hub, &["producers", "scope", "ghost", "*"], 1, "ghost");
    assert_exit(&hub, &["producers", "scope", "prod", "bad*x"], 2, "bad*x");
    let listed = hub.cli_json(["producers", "list", "--json"]);
    assert_eq!(listed[1], row("prod-two", json!(["support-*"]), false));
    assert_eq!(listed[0], row("prod", json!(["*"]), true), "a refused change stored nothing");
    let table = hub.cli_ok(["producers", "list"]);
    assert!(table.contains("(default)") && table.contains("ops-* team"), "{table}");

    // The new scope holds from the next post.
    let two = hub.client("prod-two");
    let m = two.submit("team", "k1", json!({}), &["host-a"]).await.err(403, "forbidden");
    assert!(m.contains("\"team\""), "{m}");
    two.submit_new("support-1", "k2", &["host-a"]).await;
    hub.verify_ok();
}

/// Posts without `to` reach exactly the members at their `seq`; a removed member gets nothing
/// posted after its leave; each harness run sees who wrote the turn in `BATON_PRODUCER`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn posts_without_to_run_on_exactly_the_members() {
    let hub = Hub::with_nodes(&["host-a", "host-b", "host-c"]);
    hub.cli_ok(["members", "add", "--conversation", "team", "host-a", "host-b", "--reason", "pool"]);

    // seq 1 by hand (producer `desk`), seq 2 through the API, both without `to`.
    let sent = hub.cli_json([
        "send",
        "--conversation",
        "team",
        "--key",
        "k1",
        "--payload",
        "{}",
        "--producer",
        "desk",
        "--json",
    ]);
    let mut hosts: Vec<&str> =
        sent["deliveries"].as_array().expect("deliveries").iter().filter_map(|d| d["host"].as_str()).collect();
    hosts.sort_unstable();
    assert_eq!((sent["seq"].as_i64(), hosts), (Some(1), vec!["host-a", "host-b"]), "{sent}");
    let prod = hub.client("prod");
    let second = prod.submit_new("team", "k2", &[]).await;
    hub.cli_ok(["members", "remove", "--conversation", "team", "host-b", "--reason", "moved"]);
    let third = prod.submit_new("team", "k3", &[]).await;
    assert_eq!(second.deliveries.len(), 2);
    assert_eq!(third.deliveries.keys().collect::<Vec<_>>(), ["host-a"], "host-b left after seq 2");
    // A post naming a former member is refused.
    prod.submit("team", "k4", json!({}), &["host-b"]).await.err(400, "invalid_field");

    let seen = hub.scratch("producers").join("seen");
    let then = format!("echo \"$BATON_CONVERSATION $BATON_SEQ $BATON_PRODUCER\" >> '{}'", seen.display());
    let _a = hub.node_process("host-a").trace_ends().then(&then).start();
    let _b = hub.node_process("host-b").trace_ends().then(&then).start();
    let _c = hub.node_process("host-c").trace_ends().then(&then).start();
    let runs = wait_for("the members' five turns to run", RAN_WAIT, || {
        let mut runs: Vec<(String, i64)> = hub.exec_log().lines().into_iter().map(|r| (r.host, r.seq)).collect();
        runs.sort();
        (runs.len() >= 5).then_some(runs)
    });
    let expect = |h: &str, s: i64| (h.to_string(), s);
    assert_eq!(
        runs,
        [expect("host-a", 1), expect("host-a", 2), expect("host-a", 3), expect("host-b", 1), expect("host-b", 2)]
    );
    hub.exec_log().assert_one_at_a_time_in_order();
    // Each harness writes what it saw after it logged its start: wait for all five.
    let producers = wait_for("every harness to write its BATON_PRODUCER", RAN_WAIT, || {
        let text = std::fs::read_to_string(&seen).unwrap_or_default();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.sort();
        (lines.len() >= 5).then_some(lines)
    });
    assert_eq!(producers, ["team 1 desk", "team 1 desk", "team 2 prod", "team 2 prod", "team 3 prod"]);
    // Nothing was ever routed to host-c or to host-b after its leave.
    let routed: Vec<(String, i64)> = hub
        .deliveries()
        .iter()
        .map(|d| (d["host"].as_str().unwrap_or_default().to_string(), d["seq"].as_i64().unwrap_or_default()))
        .collect();
    assert_eq!(routed.len(), 5, "{routed:?}");
    assert!(!routed.iter().any(|(h, s)| h == "host-c" || (h == "host-b" && *s > 2)), "{routed:?}");
    hub.verify_ok();
}

/// A producer's quota at its bound, end to end: set at enrollment and with `producers quota`,
/// listed, N unsettled messages accepted, the next refused 429 with the quota's code, accepted
/// again once one settles (its delivery reported); the byte quota likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_quotas_refuse_past_the_bound_until_messages_settle() {
    let hub = Hub::start();
    let out_dir = hub.scratch("quota-certs");
    let out = out_dir.to_str().expect("utf-8 path");
    assert_exit(&hub, &["enroll", "producer", "q", "--out", out, "--max-unsettled", "0"], 2, "--max-unsettled 0");
    assert_exit(&hub, &["enroll", "producer", "q", "--out", out, "--max-unsettled-bytes", "lots"], 2, "lots");
    hub.cli_ok(["enroll", "producer", "q", "--out", out, "--max-unsettled", "7", "--reason", "new team"]);
    assert_exit(&hub, &["producers", "quota", "prod", "--reason", "r"], 2, "--max-unsettled");
    assert_exit(
        &hub,
        &["producers", "quota", "prod", "--max-unsettled", "2", "--reason", "noisy"],
        0,
        "max_unsettled 2",
    );
    let listed = hub.cli_json(["producers", "list", "--json"]);
    let q = listed.as_array().unwrap().iter().find(|p| p["name"] == "q").unwrap();
    assert_eq!((&q["max_unsettled"], &q["max_unsettled_bytes"]), (&json!(7), &Value::Null), "{listed}");
    assert_eq!(listed[0]["max_unsettled"], 2, "{listed}");

    let prod = hub.client("prod");
    let first = prod.submit_new("c", "k1", &["host-a"]).await;
    prod.submit_new("c", "k2", &["host-a"]).await;
    let m = prod.submit("c", "k3", json!({"key": "k3"}), &["host-a"]).await.err(429, "quota_unsettled_messages");
    assert!(m.contains("unsettled_max = 2"), "{m}");
    let table = hub.cli_ok(["producers", "list"]);
    assert!(table.contains("2 msgs") && table.contains("max_unsettled 2"), "{table}");

    // The first message settles once its only delivery has its outcome.
    let node = hub.node("host-a", "inst-1");
    let claimed = node.claim(1, 0).await;
    assert_eq!(claimed[0].delivery_id, first.to("host-a"));
    node.mirror_and_ack(&claimed[0]).await;
    node.report(&claimed[0], "r1", "succeeded", 0).await.ok(201);
    prod.submit_new("c", "k3", &["host-a"]).await;

    // Bytes: `{"key":"k4"}` is 12 bytes; 24 unsettled bytes hold k2's and k3's, not one more.
    hub.cli_ok(["producers", "quota", "prod", "--max-unsettled", "unlimited", "--max-unsettled-bytes", "24"]);
    prod.submit("c", "k4", json!({"key": "k4"}), &["host-a"]).await.err(429, "quota_unsettled_bytes");
    let audit = hub.cli_ok(["audit"]);
    assert!(audit.contains("producer_quota") && audit.contains("noisy"), "{audit}");
    hub.verify_ok();
}

/// Once a conversation has members, `to` naming a non-member is refused; an operator's
/// audited `members allow-mention` lets it through, the node claims and acks the post (the
/// claim's re-check counts the grant as its authorization), `members list` shows the grant, a
/// post without `to` still reaches the members alone, and `disallow-mention` refuses it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_mention_reaches_a_non_member_end_to_end() {
    let hub = Hub::start();
    hub.cli_ok(["members", "add", "--conversation", "team", "host-a", "--reason", "crew"]);
    let prod = hub.client("prod");
    let refused = prod.submit("team", "k1", json!({}), &["host-b"]).await.err(400, "invalid_field");
    assert!(refused.contains("to[0]") && refused.contains("host-b") && refused.contains("allow-mention"), "{refused}");

    let allow = ["members", "allow-mention", "--conversation", "team", "host-b", "--reason", "escalation"];
    assert_exit(&hub, &allow, 0, "host-b: may be mentioned in team after seq 0");
    assert_exit(&hub, &allow, 1, "already allowed");
    assert_exit(&hub, &["members", "allow-mention", "--conversation", "team", "ghost"], 2, "ghost");
    let mentioned = prod.submit_new("team", "k2", &["host-b"]).await;
    let to_members = prod.submit_new("team", "k3", &[]).await;
    assert_eq!(to_members.deliveries.keys().collect::<Vec<_>>(), ["host-a"], "a grant is no membership");

    let node = hub.node("host-b", "inst-b");
    let claimed = node.claim(5, 0).await;
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    assert_eq!(claimed[0].delivery_id, mentioned.to("host-b"));
    node.mirror_and_ack(&claimed[0]).await;
    assert_eq!(hub.state(mentioned.to("host-b")), "delivered");

    let listed = hub.cli_json(["members", "list", "--conversation", "team", "--json"]);
    let g = &listed[0]["mentions"][0];
    assert_eq!((&g["host"], &g["grant_seq"], &g["grant_reason"]), (&json!("host-b"), &json!(0), &json!("escalation")));
    assert!(hub.cli_ok(["members", "list"]).contains("may be mentioned after 0"));
    let audit = hub.cli_ok(["audit"]);
    assert!(audit.contains("mention_allow") && audit.contains("escalation"), "{audit}");

    let disallow = ["members", "disallow-mention", "--conversation", "team", "host-b", "--reason", "resolved"];
    assert_exit(&hub, &disallow, 0, "host-b: may no longer be mentioned in team after seq 2");
    assert_exit(&hub, &disallow, 1, "not allowed");
    prod.submit("team", "k4", json!({}), &["host-b"]).await.err(400, "invalid_field");
    let listed = hub.cli_json(["members", "list", "--conversation", "team", "--json"]);
    assert_eq!(listed[0]["mentions"][0]["revoke_reason"], "resolved", "{listed}");
    hub.verify_ok();
}

/// A membership family end to end: `members add --conversation 'team-*'` with an exact row for
/// the same host still gives one delivery per post; a conversation first posted to after the
/// family join is covered; `members list` says which row matched; the claim hands every such
/// delivery out (the re-check reads the family's intervals); and one `members remove` of the
/// family ends it for every conversation it matched, the exact row standing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_membership_family_and_an_exact_row_give_one_delivery_until_the_family_leaves() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    hub.cli_ok(["members", "add", "--conversation", "team-1", "host-a", "--reason", "exact"]);
    prod.submit_new("team-1", "k0", &[]).await;
    let family = ["members", "add", "--conversation", "team-*", "host-a", "host-b", "--reason", "family"];
    assert_exit(&hub, &family, 0, "host-a: joined every conversation matching team-*");
    assert_exit(&hub, &family, 1, "already a member of team-*");
    assert_exit(&hub, &["members", "add", "--conversation", "te*m-*", "host-a"], 2, "te*m-*");
    assert_exit(&hub, &["members", "allow-mention", "--conversation", "team-*", "host-a"], 2, "pattern");

    let hosts = |s: &crate::harness::Submitted| {
        let mut h: Vec<String> = s.deliveries.keys().cloned().collect();
        h.sort();
        h
    };
    let both = prod.submit_new("team-1", "k1", &[]).await;
    assert_eq!(hosts(&both), ["host-a", "host-b"], "one delivery for host-a, matched twice");
    let new = prod.submit_new("team-2", "k2", &[]).await;
    assert_eq!(hosts(&new), ["host-a", "host-b"], "a conversation first posted to after the join");
    let listed = hub.cli_json(["members", "list", "--conversation", "team-1", "--json"]);
    let a = &listed[0]["members"][0];
    assert_eq!((&a["intervals"][0]["family"], &a["intervals"][1]["family"]), (&Value::Null, &json!("team-*")), "{a}");
    assert!(hub.cli_ok(["members", "list"]).contains("(via team-*)"));

    let remove = ["members", "remove", "--conversation", "team-*", "host-a", "host-b", "--reason", "reorg"];
    assert_exit(&hub, &remove, 0, "host-b: left every conversation matching team-*");
    let exact = prod.submit_new("team-1", "k3", &[]).await;
    assert_eq!(hosts(&exact), ["host-a"], "the exact row stands, the family ended");
    prod.submit("team-2", "k4", json!({}), &[]).await.err(400, "no_recipients");
    prod.submit("team-3", "k5", json!({}), &[]).await.err(400, "no_recipients");

    // Every delivery made while a row held the host is handed out, none failed `not a member`.
    let node = hub.node("host-a", "inst-a");
    let claimed = node.claim(10, 0).await;
    let mut got: Vec<(String, i64)> = claimed.iter().map(|c| (c.conversation.clone(), c.seq)).collect();
    got.sort();
    let want: Vec<(String, i64)> = [("team-1", 1), ("team-1", 2), ("team-1", 3), ("team-2", 1)]
        .into_iter()
        .map(|(c, s)| (c.to_string(), s))
        .collect();
    assert_eq!(got, want);
    assert_eq!(node.as_instance("inst-a").claim(10, 0).await.len(), 0);
    let audit = hub.cli_ok(["audit"]);
    assert!(audit.contains("member_family_add") && audit.contains("member_family_remove"), "{audit}");
    hub.verify_ok();
}
