//! Fences (SPEC §5): pause, hold and block for a conversation, a host, or everything, evaluated
//! at claim time on the hub's record; lifting; and fences set while the hub is stopped.

use crate::harness::{Hub, OPERATOR};
use serde_json::{Value, json};

/// One case: a fence of `kind` over `scope`, two messages (`cx` to host-a and host-b, `cy` to
/// host-a), both hosts claim. The deliveries the scope covers must end in `covered_state` (with
/// the fence named in the reason for held and failed), and exactly the others are handed out.
/// After the lift, paused ones flow; held ones wait for a release; failed ones stay failed.
async fn check_fence(kind: &str, scope: &[&str], covered: &[(&str, &str)]) {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let (a, b) = (hub.node("host-a", "inst-a"), hub.node("host-b", "inst-b"));
    let fence = hub.fence(kind, scope, "case under test");
    let mx = prod.submit_new("cx", "mx", &["host-a", "host-b"]).await;
    let my = prod.submit_new("cy", "my", &["host-a"]).await;
    let all = [("cx", "host-a", mx.to("host-a")), ("cx", "host-b", mx.to("host-b")), ("cy", "host-a", my.to("host-a"))];
    let is_covered = |conv: &str, host: &str| covered.contains(&(conv, host));

    let mut handed: Vec<String> = a.claim(10, 0).await.into_iter().map(|c| c.delivery_id).collect();
    handed.extend(b.claim(10, 0).await.into_iter().map(|c| c.delivery_id));
    handed.sort();
    let mut free: Vec<String> =
        all.iter().filter(|(c, h, _)| !is_covered(c, h)).map(|(_, _, id)| id.to_string()).collect();
    free.sort();
    assert_eq!(handed, free, "{kind} {scope:?}: exactly the uncovered deliveries are handed out");

    let covered_state = match kind {
        "pause" => "queued",
        "hold" => "held",
        _ => "failed",
    };
    for (conv, host, id) in all.iter().filter(|(c, h, _)| is_covered(c, h)) {
        let (state, reason) = hub.state_reason(id);
        assert_eq!(state, covered_state, "{kind} {scope:?} on {conv}/{host}");
        if kind == "pause" {
            assert_eq!(hub.events(id).len(), 1, "a pause moves nothing");
        } else {
            let reason = reason.unwrap_or_default();
            assert!(
                reason.contains(&format!("fence {fence}")) && reason.contains("case under test"),
                "{kind}: the reason names the fence: {reason:?}"
            );
            let last = hub.events(id).pop().unwrap();
            assert_eq!((last.1.as_str(), last.2.as_str()), (covered_state, "hub"), "the hub moved it at claim time");
        }
    }

    // Lift: paused deliveries flow; held and failed ones do not come back by themselves.
    hub.lift(fence);
    let mut after: Vec<String> = a.claim(10, 0).await.into_iter().map(|c| c.delivery_id).collect();
    after.extend(b.claim(10, 0).await.into_iter().map(|c| c.delivery_id));
    after.sort();
    let mut expect: Vec<String> = if kind == "pause" {
        all.iter().filter(|(c, h, _)| is_covered(c, h)).map(|(_, _, id)| id.to_string()).collect()
    } else {
        Vec::new()
    };
    expect.sort();
    assert_eq!(after, expect, "{kind} {scope:?}: what the claims hand out after the lift");
    for (_, _, id) in all.iter().filter(|(c, h, _)| is_covered(c, h)) {
        let want = if kind == "pause" { "claimed" } else { covered_state };
        assert_eq!(hub.state(id), want);
    }
    hub.verify_ok();
}

const BY_CONVERSATION: (&[&str], &[(&str, &str)]) = (&["--conversation", "cx"], &[("cx", "host-a"), ("cx", "host-b")]);
const BY_HOST: (&[&str], &[(&str, &str)]) = (&["--host", "host-a"], &[("cx", "host-a"), ("cy", "host-a")]);
const EVERYTHING: (&[&str], &[(&str, &str)]) = (&["--all"], &[("cx", "host-a"), ("cx", "host-b"), ("cy", "host-a")]);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_keeps_covered_deliveries_queued_per_scope() {
    for (scope, covered) in [BY_CONVERSATION, BY_HOST, EVERYTHING] {
        check_fence("pause", scope, covered).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_parks_covered_deliveries_per_scope() {
    for (scope, covered) in [BY_CONVERSATION, BY_HOST, EVERYTHING] {
        check_fence("hold", scope, covered).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_fails_covered_deliveries_per_scope() {
    for (scope, covered) in [BY_CONVERSATION, BY_HOST, EVERYTHING] {
        check_fence("block", scope, covered).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifting_a_hold_stops_new_parking_but_held_ones_wait_for_release() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-1");
    let fence = hub.fence("hold", &["--conversation", "c"], "investigating");
    let first = prod.submit_new("c", "k1", &["host-a"]).await;
    assert!(node.claim(10, 0).await.is_empty());
    assert_eq!(hub.state(first.to("host-a")), "held");

    hub.lift(fence);
    let second = prod.submit_new("c", "k2", &["host-a"]).await;
    // The lifted hold parks nothing new, but the new turn waits behind the held earlier one:
    // a conversation's turns are handed out in seq order (SPEC §2 "Order").
    assert!(node.claim(10, 0).await.is_empty(), "c #2 must not pass the held c #1");
    assert_eq!(hub.state(second.to("host-a")), "queued");
    assert_eq!(hub.state(first.to("host-a")), "held");

    hub.cli_ok(["held", "release", first.to("host-a"), "--reason", "ok now"]);
    let got = node.claim(10, 0).await;
    let ids: Vec<&str> = got.iter().map(|c| c.delivery_id.as_str()).collect();
    assert_eq!(ids, [first.to("host-a"), second.to("host-a")], "both, in seq order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_set_while_the_hub_is_stopped_take_effect_after_start() {
    let mut hub = Hub::start();
    let prod = hub.client("prod");
    let p = prod.submit_new("paused", "p", &["host-a"]).await;
    let h = prod.submit_new("held", "h", &["host-a"]).await;
    let b = prod.submit_new("blocked", "b", &["host-a"]).await;
    let free = prod.submit_new("free", "f", &["host-a"]).await;
    hub.terminate();

    let pause = hub.fence("pause", &["--conversation", "paused"], "offline pause");
    let hold = hub.fence("hold", &["--conversation", "held"], "offline hold");
    let block = hub.fence("block", &["--conversation", "blocked"], "offline block");
    hub.serve(None);

    let node = hub.node("host-a", "inst-1");
    let got = node.claim(10, 0).await;
    let ids: Vec<&str> = got.iter().map(|c| c.delivery_id.as_str()).collect();
    assert_eq!(ids, [free.to("host-a")]);
    assert_eq!(hub.state(p.to("host-a")), "queued");
    let (st, reason) = hub.state_reason(h.to("host-a"));
    assert_eq!(st, "held");
    assert!(reason.unwrap_or_default().contains(&format!("fence {hold}")));
    let (st, reason) = hub.state_reason(b.to("host-a"));
    assert_eq!(st, "failed");
    assert!(reason.unwrap_or_default().contains(&format!("fence {block}")));

    // A lift while stopped also takes effect after the next start.
    hub.terminate();
    hub.lift(pause);
    hub.serve(None);
    let node = hub.node("host-a", "inst-1");
    let got = node.claim(10, 0).await;
    let ids: Vec<&str> = got.iter().map(|c| c.delivery_id.as_str()).collect();
    assert_eq!(ids, [p.to("host-a")]);
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_list_shows_who_set_it_when_and_why() {
    let hub = Hub::builder().stopped().start();
    let a = hub.fence("pause", &["--conversation", "c"], "deploying");
    let b = hub.fence("block", &["--host", "host-b"], "bad disk");
    let c = hub.fence("hold", &["--all"], "freeze");
    let list = hub.cli_json(["fence", "list", "--json"]);
    let rows = list.as_array().unwrap();
    let fields = ["id", "kind", "scope", "target", "set_by", "reason"];
    let got: Vec<Value> = rows.iter().map(|r| fields.iter().map(|f| r[*f].clone()).collect()).collect();
    // Newest first.
    assert_eq!(
        got,
        vec![
            json!([c, "hold", "all", null, OPERATOR, "freeze"]),
            json!([b, "block", "host", "host-b", OPERATOR, "bad disk"]),
            json!([a, "pause", "conversation", "c", OPERATOR, "deploying"]),
        ]
    );
    assert!(rows.iter().all(|r| r["set_at_ms"].as_i64().unwrap() > 0 && r["lifted_at_ms"].is_null()));

    hub.lift(b);
    let active = hub.cli_json(["fence", "list", "--json"]);
    let ids: Vec<i64> = active.as_array().unwrap().iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert!(!ids.contains(&b) && ids.len() == 2, "{ids:?}");
    let all = hub.cli_json(["fence", "list", "--all", "--json"]);
    let lifted = all.as_array().unwrap().iter().find(|r| r["id"] == b).expect("lifted fence listed with --all");
    assert!(lifted["lifted_at_ms"].as_i64().is_some());
    assert_eq!(lifted["lifted_by"], OPERATOR);
    // Lifting it again, or an unknown fence: not found (exit 1).
    assert_eq!(hub.cli(["fence", "lift", &b.to_string()]).status.code(), Some(1));
    assert_eq!(hub.cli(["fence", "lift", "9999"]).status.code(), Some(1));
    // The hub is stopped, so status exits 1 (needs attention); its counts are still printed.
    let status: serde_json::Value = serde_json::from_slice(&hub.cli(["status", "--json"]).stdout).unwrap();
    assert_eq!(status["active_fences"], 2);
}
