//! Node instance ids are scoped per host, through the real hub: a host presenting another host's
//! instance id neither blocks that host nor lets a requeue act on its work (`--host` chooses
//! when an id is in use on several hosts); binding changes are
//! one operator event each and bounded per host (429 `over_capacity` beyond the limit).

use crate::harness::Hub;
use std::time::Duration;

/// Counts the operator log's binding events for `host`.
fn bind_events(hub: &Hub, host: &str) -> i64 {
    let db = rusqlite::Connection::open_with_flags(
        hub.data_dir().join("hub.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open hub.db");
    db.busy_timeout(Duration::from_secs(10)).unwrap();
    db.query_row("SELECT count(*) FROM operator_events WHERE action = 'bind_instance' AND subject = ?1", [host], |r| {
        r.get(0)
    })
    .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_hosts_instance_id_neither_blocks_nor_exposes_a_host() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let a = hub.node("host-a", "ia");
    // host-b presents host-a's instance id.
    let b = hub.node("host-b", "ia");
    assert!(a.claim(8, 0).await.is_empty(), "host-a binds ia");
    let for_b = prod.submit_new("cb", "kb", &["host-b"]).await;
    let held_by_b = b.claim(8, 0).await;
    assert_eq!(held_by_b.len(), 1, "host-b holds work under ia");

    // host-a is re-provisioned with a new instance: host-b's work under "ia" is not host-a's.
    let a2 = a.as_instance("ia-new");
    let for_a = prod.submit_new("ca", "ka", &["host-a"]).await;
    let got = a2.claim(8, 0).await;
    assert_eq!(got.iter().map(|c| c.delivery_id.as_str()).collect::<Vec<_>>(), [for_a.to("host-a")]);
    assert!(a2.holdings().await.len() == 1);

    // Only host-b uses "ia" now: a requeue of it acts on host-b's work alone, and host-a's
    // claim under "ia-new" is untouched.
    let out = hub.cli_ok(["requeue", "--instance", "ia", "--reason", "gone"]);
    assert!(out.contains("1 requeued"), "{out}");
    assert_eq!(hub.state(for_b.to("host-b")), "queued");
    assert_eq!(hub.state(for_a.to("host-a")), "claimed");

    // Now host-b presents "ia-new" too and claims its work: the id is used by two hosts, and a
    // requeue of it is refused, changing neither host's work.
    let b2 = b.as_instance("ia-new");
    assert_eq!(b2.claim(8, 0).await.len(), 1);
    let out = hub.cli(["requeue", "--instance", "ia-new", "--reason", "gone"]);
    assert!(!out.status.success(), "a requeue of an id two hosts use is refused");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("host-a") && stderr.contains("host-b"), "{stderr}");
    assert_eq!(hub.state(for_a.to("host-a")), "claimed");
    assert_eq!(hub.state(for_b.to("host-b")), "claimed");
    assert_eq!(a2.holdings().await.len(), 1);
    assert_eq!(b2.holdings().await.len(), 1);

    // `--host` chooses: host-b's work under "ia-new" is requeued and host-a's is not touched; a
    // host that is not enrolled is named and nothing changes.
    let out = hub.cli(["requeue", "--instance", "ia-new", "--host", "host-z", "--reason", "gone"]);
    assert_eq!(out.status.code(), Some(i32::from(baton_shared::exit::USAGE)), "an unknown host is a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("host-z"), "{out:?}");
    let out = hub.cli_ok(["requeue", "--instance", "ia-new", "--host", "host-b", "--reason", "gone"]);
    assert!(out.contains("1 requeued"), "{out}");
    assert_eq!(hub.state(for_b.to("host-b")), "queued");
    assert_eq!(hub.state(for_a.to("host-a")), "claimed");
    assert_eq!(a2.holdings().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_changes_are_one_event_each_and_bounded_per_host() {
    if crate::harness::skipped_on_postgres("binding_changes_are_one_event_each_and_bounded_per_host") {
        return;
    }
    // The bound is `limits.instance_rebinds_max`; a value other than the default proves the key.
    let max: i64 = 4;
    let hub = Hub::builder().config(&format!("[limits]\ninstance_rebinds_max = {max}\n")).start();
    let a = hub.node("host-a", "steady");
    for _ in 0..25 {
        a.claim(8, 0).await;
    }
    assert_eq!(bind_events(&hub, "host-a"), 1, "the same instance again records nothing");
    // A node presenting a new instance id on every request: at most the limit of changes.
    let mut refused = 0;
    for i in 0..30 {
        let r = a.as_instance(&format!("churn-{i}")).claim_raw(8, 0).await;
        match r.status {
            200 => {}
            429 => {
                let m = r.err(429, "over_capacity");
                assert!(m.contains("host-a"), "{m}");
                refused += 1;
            }
            other => panic!("unexpected {other}: {}", r.text),
        }
    }
    assert_eq!(refused, 31 - max, "rebinding is bounded: the first binding and {} changes pass", max - 1);
    assert_eq!(bind_events(&hub, "host-a"), max, "one row per actual change, bounded");
    // Another host is not limited by host-a's churn.
    assert!(hub.node("host-b", "b-1").claim(8, 0).await.is_empty());
}
