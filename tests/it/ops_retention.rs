//! Retention through the real binary: audit rows older than `limits.audit_retention` are
//! removed by the running hub (counted from when each was written), newer ones stay; the key is
//! validated like every other. Retention of messages from their settling time is tested with an
//! injected clock beside `store::upkeep::retention`. A store over `limits.store_bytes_max` refuses
//! submissions (507 `store_full`) and serves the rest until room is freed.

use crate::harness::Hub;
use baton_testkit::wait;
use std::time::Duration;

const DAY_MS: i64 = 24 * 3600 * 1000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_rows_past_their_window_are_removed_by_the_hub() {
    if crate::harness::skipped_on_postgres("audit_rows_past_their_window_are_removed_by_the_hub") {
        return;
    }
    let mut hub = Hub::builder().config("[limits]\naudit_retention = \"2d\"\n").stopped().start();
    hub.cli_ok(["fence", "pause", "--all", "--reason", "recent", "--force"]);
    let now_ms: i64 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    {
        let db = rusqlite::Connection::open(hub.data_dir().join("hub.db")).unwrap();
        db.execute(
            "INSERT INTO operator_events (action, subject, operator, reason, at) VALUES ('revoke', 'old-host', 'ann', 'long ago', ?1)",
            [now_ms - 3 * DAY_MS],
        )
        .unwrap();
    }
    let reasons = |hub: &Hub| -> Vec<String> {
        let v = hub.cli_json(["audit", "--json"]);
        v.as_array().unwrap().iter().filter_map(|e| e["reason"].as_str().map(str::to_string)).collect()
    };
    assert!(reasons(&hub).contains(&"long ago".to_string()));
    hub.serve(None);
    wait::until("the old audit row is swept", Duration::from_secs(30), || {
        Ok((!reasons(&hub).contains(&"long ago".to_string())).then_some(()))
    })
    .unwrap();
    assert!(reasons(&hub).contains(&"recent".to_string()), "a row inside the window stays");

    let out = hub.cli(["config", "check"]);
    assert!(out.status.success(), "{out:?}");
    hub.write_config("[limits]\naudit_retention = \"1h\"\n");
    let out = hub.cli(["config", "check"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("limits.audit_retention"), "{stderr}");
}

/// Past `limits.store_bytes_max` the hub answers submissions (single and batch) 507
/// `store_full`, naming the bound, while claims, reports and reads go on; `status` and the
/// hub's log say so; once a purge frees room, submissions are taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_over_its_bound_refuses_submissions_and_serves_the_rest() {
    // An empty PostgreSQL database alone takes megabytes: the bound's arithmetic below is the
    // SQLite file's (the size read itself runs on both backends in `store::views::read`'s tests).
    if crate::harness::skipped_on_postgres("a_store_over_its_bound_refuses_submissions_and_serves_the_rest") {
        return;
    }
    const STORE_BYTES_MAX: u64 = 1024 * 1024;
    let hub = Hub::builder().config(&format!("[limits]\nstore_bytes_max = {STORE_BYTES_MAX}\n")).start();
    let prod = hub.client("prod");
    let pad = "x".repeat(200 * 1024);
    let mut accepted = Vec::new();
    let refusal = wait::until("submissions to be refused as the store fills", Duration::from_secs(60), || {
        let r = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(prod.submit(
                &format!("c{}", accepted.len()),
                &format!("k{}", accepted.len()),
                serde_json::json!({"pad": pad}),
                &["host-a"],
            ))
        });
        match r.status {
            201 => {
                accepted.push(crate::harness::Submitted::from_body(r.ok(201)));
                std::thread::sleep(Duration::from_millis(250));
                Ok(None)
            }
            _ => Ok(Some(r)),
        }
    })
    .unwrap();
    let said = refusal.err(507, "store_full");
    assert!(said.contains("limits.store_bytes_max") && said.contains(&STORE_BYTES_MAX.to_string()), "{said}");
    assert!(!accepted.is_empty(), "the store had room at first");
    let batch =
        serde_json::json!({"messages": [crate::harness::submit_body("c", "kb", serde_json::json!({}), &["host-a"])]});
    prod.post("/v1/batch/messages", &batch).await.err(507, "store_full");

    // The work already accepted drains: claims, reports and reads go on.
    let node = hub.node("host-a", "inst-1");
    let got = node.claim(64, 0).await;
    assert_eq!(got.len(), accepted.len(), "every accepted delivery is claimed");
    for (i, c) in got.iter().enumerate() {
        node.mirror_and_ack(c).await;
        node.report(c, &format!("r{i}"), "succeeded", 0).await.ok(201);
    }
    assert_eq!(prod.message(&accepted[0].message_id).await.ok(200)["deliveries"][0]["state"], "delivered");

    let out = hub.cli(["status", "--json"]);
    assert_eq!(out.status.code(), Some(1), "something needs attention");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["store_full"], true, "{status}");
    assert_eq!(status["store_bytes_max"], STORE_BYTES_MAX);
    assert!(status["attention"].as_array().unwrap().iter().any(|a| a["kind"] == "store_full"), "{status}");
    let text = String::from_utf8_lossy(&hub.cli(["status"]).stdout).into_owned();
    assert!(text.contains("FULL: submissions refused"), "{text}");
    assert!(hub.serve_logs().contains("over limits.store_bytes_max"), "the hub's log says why");

    // A purge frees room: submissions are taken again.
    hub.cli_ok(["purge", "--host", "host-a", "--reason", "make room", "--yes"]);
    wait::until("submissions to be taken again", Duration::from_secs(30), || {
        let r = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(prod.submit("c", "k-after", serde_json::json!({}), &["host-a"]))
        });
        Ok((r.status == 201).then_some(()))
    })
    .unwrap();
}
