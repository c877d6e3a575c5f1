//! Commands that tell the truth: counts are rows changed, doing nothing exits 1 "nothing to
//! do", a fence that matches nothing or repeats an active one is refused, a release that a
//! fence would undo is refused unless `--force`, and time-boxed fences are lifted by the hub.

use crate::harness::{EVENT_WAIT, Hub};
use serde_json::Value;

fn code_and_stderr(out: &std::process::Output) -> (Option<i32>, String) {
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_refuse_typos_and_duplicates_and_releases_a_fence_would_undo() {
    let hub = Hub::start();
    let (code, err) = code_and_stderr(&hub.cli(["fence", "pause", "--host", "hots-a", "--reason", "typo"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("hots-a") && err.contains("never enrolled") && err.contains("--force"), "{err}");
    let (code, err) = code_and_stderr(&hub.cli(["fence", "pause", "--conversation", "nope", "--reason", "typo"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no messages"), "{err}");
    hub.cli_ok(["fence", "pause", "--conversation", "not-yet", "--force", "--reason", "ahead of time"]);

    let prod = hub.client("prod");
    let sent = prod.submit_new("c", "k1", &["host-a"]).await;
    let hold = hub.fence("hold", &["--conversation", "c"], "inspect");
    let (code, err) = code_and_stderr(&hub.cli(["fence", "hold", "--conversation", "c", "--reason", "again"]));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("nothing to do") && err.contains(&format!("hold fence {hold}")), "{err}");

    let node = hub.node("host-a", "inst-1");
    assert!(node.claim(5, 0).await.is_empty());
    assert_eq!(hub.state(sent.to("host-a")), "held");
    let (code, err) = code_and_stderr(&hub.cli(["held", "release", sent.to("host-a"), "--reason", "go"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&format!("hold fence {hold}")) && err.contains("--force"), "{err}");
    assert_eq!(hub.state(sent.to("host-a")), "held", "a refused release changes nothing");
    let (code, err) = code_and_stderr(&hub.cli(["held", "release", "--conversation", "c", "--reason", "go"]));
    assert_eq!(code, Some(2), "{err}");
    let out = hub.cli_ok(["held", "release", sent.to("host-a"), "--force", "--reason", "go"]);
    assert!(out.contains("released 1"), "{out}");
    let (code, err) = code_and_stderr(&hub.cli(["held", "release", "--conversation", "c", "--reason", "go"]));
    assert_eq!((code, err.contains("nothing to do")), (Some(1), true), "{err}");

    hub.lift(hold);
    let (code, err) = code_and_stderr(&hub.cli(["fence", "lift", &hold.to_string()]));
    assert_eq!((code, err.contains("nothing to do")), (Some(1), true), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retire_and_requeue_count_only_what_they_changed() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    prod.submit_new("c", "k1", &["host-a"]).await;
    prod.submit_new("d", "k2", &["host-a"]).await;
    let node = hub.node("host-a", "inst-1");
    let got = node.claim(2, 0).await;
    assert_eq!(got.len(), 2);
    for c in &got {
        node.mirror_and_ack(c).await;
    }
    node.report(&got[0], "r1", "succeeded", 0).await.ok(201);

    let out = hub.cli_ok(["requeue", "--instance", "inst-1", "--reason", "gone"]);
    assert!(out.contains("0 requeued, 1 delivered without outcome marked unknown"), "{out}");
    let (code, err) = code_and_stderr(&hub.cli(["requeue", "--instance", "inst-1", "--reason", "again"]));
    assert_eq!((code, err.contains("nothing to do")), (Some(1), true), "{err}");
    let out = hub.cli_ok(["retire", "host-a", "--reason", "gone"]);
    assert!(out.contains("0 failed, 0 unknown, 0 delivered without outcome marked unknown"), "{out}");
}

fn fences(hub: &Hub, all: bool) -> Vec<Value> {
    let mut args = vec!["fence", "list", "--json"];
    if all {
        args.push("--all");
    }
    hub.cli_json(args).as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_boxed_fence_is_lifted_by_the_hub_at_its_time() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let sent = prod.submit_new("c", "k1", &["host-a"]).await;
    let (code, err) = code_and_stderr(&hub.cli(["fence", "pause", "--all", "--until", "2001-01-01 00:00:00"]));
    assert_eq!(code, Some(2), "a fence ending in the past is refused: {err}");
    let set = hub.cli_json(["fence", "pause", "--conversation", "c", "--for", "3s", "--reason", "brief", "--json"]);
    assert!(set["expires_at_ms"].as_i64().is_some(), "{set}");
    let listed = fences(&hub, false);
    assert_eq!(listed[0]["expires_at_ms"], set["expires_at_ms"]);
    assert!(hub.cli_ok(["fence", "list"]).contains("(in "), "the expiry is shown");
    let node = hub.node("host-a", "inst-1");
    assert!(node.claim(5, 0).await.is_empty(), "paused while the fence lasts");

    baton_testkit::wait::until("the hub lifts the fence", EVENT_WAIT, || {
        Ok(fences(&hub, false).is_empty().then_some(()))
    })
    .unwrap();
    let lifted = fences(&hub, true);
    assert_eq!(lifted[0]["lifted_by"], "hub", "{lifted:?}");
    let got = node.claim(5, 0).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].delivery_id, sent.to("host-a"));
}
