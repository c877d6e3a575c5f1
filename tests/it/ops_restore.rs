//! `restore` and `purge` through the real binary: a restore is refused while the hub runs,
//! verifies the backup before it replaces anything, keeps the replaced database aside and says
//! what it means for producers; a purge removes settled messages only, refusing (and naming)
//! unsettled deliveries, and is recorded in the audit log.

use crate::harness::{Hub, OPERATOR};
use serde_json::{Value, json};

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn audit_of(hub: &Hub, action: &str) -> Vec<Value> {
    let all = hub.cli_json(["audit", "--json"]);
    all.as_array().unwrap().iter().filter(|e| e["action"] == action).cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_verifies_first_keeps_the_replaced_file_and_says_what_is_forgotten() {
    if crate::harness::skipped_on_postgres("restore_verifies_first_keeps_the_replaced_file_and_says_what_is_forgotten")
    {
        return;
    }
    let mut hub = Hub::start();
    let prod = hub.client("prod");
    let before = prod.submit_new("c", "k1", &["host-a"]).await;
    let backup = hub.scratch("backups").join("hub-backup.db");
    hub.cli_ok(["backup", "--out", backup.to_str().unwrap()]);
    let after = prod.submit_new("c", "k2", &["host-a"]).await;

    // Refused while the hub runs: nothing changes.
    let out = hub.cli(["restore", "--from", backup.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert!(stderr(&out).contains("refusing to restore while a hub serves"), "{}", stderr(&out));
    assert_eq!(hub.deliveries().len(), 2);
    hub.terminate();

    // A backup that is not a sound database replaces nothing.
    let junk = hub.scratch("backups").join("junk.db");
    std::fs::write(&junk, b"this is not a database, just bytes that pretend to be one").unwrap();
    let out = hub.cli(["restore", "--from", junk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(stderr(&out).contains("nothing was replaced"), "{}", stderr(&out));
    assert_eq!(hub.deliveries().len(), 2);
    assert_eq!(hub.cli(["restore", "--from", "/no/such/backup.db"]).status.code(), Some(2));

    let out = hub.cli(["restore", "--from", backup.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("verified") && text.contains("idempotency keys") && text.contains("new message"), "{text}");
    let kept = text
        .lines()
        .find_map(|l| l.strip_prefix("the replaced database is kept as "))
        .unwrap_or_else(|| panic!("no kept file named in {text}"))
        .trim()
        .to_string();
    let aside = rusqlite::Connection::open(&kept).unwrap();
    let n: i64 = aside.query_row("SELECT count(*) FROM messages", [], |r| r.get(0)).unwrap();
    assert_eq!(n, 2, "the replaced database is kept whole");
    let rows = hub.deliveries();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["delivery_id"], before.to("host-a"));
    let restores = audit_of(&hub, "restore");
    assert_eq!(restores.len(), 1);
    assert_eq!(restores[0]["actor"], OPERATOR);
    assert!(restores[0]["reason"].as_str().unwrap().contains(&kept), "{}", restores[0]);
    hub.verify_ok();

    // As told: the key accepted before the backup is a duplicate, the one after it is new.
    hub.serve(None);
    let prod = hub.client("prod");
    let again = prod.submit("c", "k1", json!({"key": "k1"}), &["host-a"]).await;
    assert_eq!(again.ok(200)["duplicate"], true);
    let again = prod.submit("c", "k2", json!({"key": "k2"}), &["host-a"]).await;
    assert_ne!(again.ok(201)["message_id"], after.message_id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_settled_messages_only_and_is_audited() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let done = prod.submit_new("c", "k1", &["host-a"]).await;
    let open = prod.submit_new("c", "k2", &["host-a"]).await;
    let node = hub.node("host-a", "inst-1");
    let got = node.claim(1, 0).await;
    assert_eq!(got[0].delivery_id, done.to("host-a"));
    node.mirror_and_ack(&got[0]).await;
    node.report(&got[0], "r1", "succeeded", 0).await.ok(201);

    // The conversation still has an unsettled delivery: refused, naming it; nothing removed.
    let out = hub.cli(["purge", "--conversation", "c", "--reason", "clean up"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains(open.to("host-a")) && stderr(&out).contains("queued"), "{}", stderr(&out));
    assert_eq!(hub.deliveries().len(), 2);

    let out = hub.cli(["purge", "--message", &done.message_id, "--dry-run", "--reason", "gdpr request"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).contains("would purge") && stdout(&out).contains("1 message(s), 1 deliveries"),
        "{}",
        stdout(&out)
    );
    assert_eq!(hub.deliveries().len(), 2, "a dry run removes nothing");
    assert!(audit_of(&hub, "purge").is_empty());

    // Without --yes, and no terminal to ask: refused (2), saying what it would remove.
    let out = hub.cli(["purge", "--message", &done.message_id, "--reason", "gdpr request"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains("would purge") && stderr(&out).contains("--yes"), "{}", stderr(&out));
    assert_eq!(hub.deliveries().len(), 2, "a refused purge removes nothing");
    assert!(audit_of(&hub, "purge").is_empty());

    let out = hub.cli(["purge", "--message", &done.message_id, "--reason", "gdpr request", "--yes"]);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("purged message"), "{}", stdout(&out));
    assert_eq!(hub.cli(["deliveries", "show", done.to("host-a")]).status.code(), Some(1));
    assert_eq!(hub.deliveries().len(), 1);
    let purges = audit_of(&hub, "purge");
    assert_eq!(purges.len(), 1);
    assert_eq!(
        (purges[0]["actor"].as_str(), purges[0]["subject"].as_str()),
        (Some(OPERATOR), Some(format!("message {}", done.message_id).as_str()))
    );
    assert!(purges[0]["reason"].as_str().unwrap().contains("gdpr request"), "{}", purges[0]);

    assert_eq!(hub.cli(["purge", "--message", &done.message_id, "--reason", "again"]).status.code(), Some(1));
    assert_eq!(hub.cli(["purge", "--message", &done.message_id]).status.code(), Some(2), "--reason is required");
    assert_eq!(hub.cli(["purge", "--reason", "what"]).status.code(), Some(2), "a target is required");
    hub.verify_ok();
}

/// Claims `n` deliveries for `host`, acks them and reports each `succeeded`: they settle.
async fn settle(hub: &Hub, host: &str, n: u32) -> Vec<String> {
    let node = hub.node(host, &format!("{host}-inst"));
    let got = node.claim(n, 0).await;
    assert_eq!(got.len(), n as usize, "{host} claims {n}");
    for (i, c) in got.iter().enumerate() {
        node.mirror_and_ack(c).await;
        node.report(c, &format!("r-{host}-{i}"), "succeeded", 0).await.ok(201);
    }
    got.into_iter().map(|c| c.delivery_id).collect()
}

/// `purge --host H` removes the host's settled deliveries and the messages no other host
/// received, keeps (and names) its unsettled ones and the other hosts' deliveries, takes
/// `--dry-run`, needs `--reason`, and is recorded in the audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_by_host_removes_its_settled_deliveries_and_the_messages_only_it_received() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let shared = prod.submit_new("c1", "k1", &["host-a", "host-b"]).await;
    let alone = prod.submit_new("c2", "k2", &["host-a"]).await;
    let open = prod.submit_new("c3", "k3", &["host-a"]).await;
    assert_eq!(settle(&hub, "host-a", 2).await, vec![shared.to("host-a").to_string(), alone.to("host-a").to_string()]);
    settle(&hub, "host-b", 1).await;

    let out = hub.cli(["purge", "--host", "host-a", "--dry-run", "--reason", "host decommissioned"]);
    assert!(out.status.success(), "{out:?}");
    let said = stdout(&out);
    assert!(said.contains("would purge host host-a: 2 settled deliveries"), "{said}");
    assert!(said.contains("1 message(s) with no other recipient"), "{said}");
    assert!(said.contains("kept 1 unsettled") && said.contains(open.to("host-a")), "{said}");
    assert_eq!(hub.deliveries().len(), 4, "a dry run removes nothing");
    assert!(audit_of(&hub, "purge").is_empty());
    assert_eq!(hub.cli(["purge", "--host", "host-a"]).status.code(), Some(2), "--reason is required");
    let out = hub.cli(["purge", "--host", "Host A", "--reason", "x"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(stderr(&out).contains("--host"), "the field is named: {}", stderr(&out));
    assert_eq!(
        hub.cli(["purge", "--host", "host-a", "--conversation", "c1", "--reason", "x"]).status.code(),
        Some(2),
        "one target at a time"
    );

    let out = hub.cli(["purge", "--host", "host-a", "--reason", "host decommissioned", "--yes"]);
    assert!(out.status.success(), "{out:?}");
    assert!(stdout(&out).contains("purged host host-a"), "{}", stdout(&out));
    let mut left: Vec<String> =
        hub.deliveries().iter().map(|d| d["delivery_id"].as_str().unwrap().to_string()).collect();
    left.sort();
    let mut want = vec![shared.to("host-b").to_string(), open.to("host-a").to_string()];
    want.sort();
    assert_eq!(left, want, "host-b's delivery of the shared message and host-a's unsettled one stay");
    assert_eq!(hub.cli(["deliveries", "show", shared.to("host-a")]).status.code(), Some(1));
    // The producer sees the shared message with its remaining recipient, the other one gone.
    let view = prod.message(&shared.message_id).await;
    let view = view.ok(200);
    assert_eq!(view["deliveries"].as_array().map(Vec::len), Some(1), "{view}");
    assert_eq!(view["deliveries"][0]["host"], "host-b");
    prod.message(&alone.message_id).await.err(404, "not_found");

    let purges = audit_of(&hub, "purge");
    assert_eq!(purges.len(), 1);
    assert_eq!((purges[0]["actor"].as_str(), purges[0]["subject"].as_str()), (Some(OPERATOR), Some("host host-a")));
    let why = purges[0]["reason"].as_str().unwrap();
    assert!(why.contains("host decommissioned") && why.contains("2 deliveries, 1 message(s)"), "{why}");
    let out = hub.cli(["purge", "--host", "host-a", "--reason", "again", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "nothing left to purge: {out:?}");
    assert!(stderr(&out).contains(open.to("host-a")), "the kept one is named: {}", stderr(&out));
    hub.verify_ok();
}
