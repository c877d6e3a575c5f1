//! Retention through the real binary: audit rows older than `limits.audit_retention` are
//! removed by the running hub (counted from when each was written), newer ones stay; the key is
//! validated like every other. Retention of messages from their settling time is tested with an
//! injected clock beside `store::retention`.

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
