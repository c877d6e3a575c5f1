//! The operator CLI's public surface: configuration validation (exit 2, field named), JSON
//! outputs, documented exit codes, `send`, `backup`, and a clean SIGTERM shutdown.

use crate::harness::{EVENT_WAIT, Hub, output_within, random_id};
use crate::hub_contract::listed;
use serde_json::json;

/// The exit status of an invalid configuration file. The README and `--help` document it as 2
/// ("usage or invalid input, including an invalid configuration file"); 3 is for a refused store.
const EXIT_INVALID: i32 = 2;

/// `serve`, `serve --config FILE` and `config check` all refuse `toml` with `EXIT_INVALID` and a
/// stderr that names `field`; `serve` never gets as far as listening.
fn check_bad_config(hub: &Hub, toml: &str, field: &str) {
    hub.write_config(toml);
    let elsewhere = hub.scratch("cfg").join("other.toml");
    std::fs::write(&elsewhere, toml).unwrap();
    let runs: [Vec<std::ffi::OsString>; 3] = [
        vec!["serve".into(), "--listen".into(), "127.0.0.1:0".into()],
        vec!["serve".into(), "--listen".into(), "127.0.0.1:0".into(), "--config".into(), elsewhere.clone().into()],
        vec!["config".into(), "check".into()],
    ];
    for args in runs {
        let out = output_within(hub.cli_command(&args), EVENT_WAIT);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(EXIT_INVALID), "{args:?} with {toml:?}: stderr {stderr}");
        assert!(stderr.contains(field), "{args:?}: stderr should name {field:?}: {stderr}");
        assert!(!hub.data_dir().join("hub.addr").exists(), "serve listened with an invalid config");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_configuration_is_refused_naming_the_field() {
    let hub = Hub::builder().stopped().start();
    for (toml, field) in [
        ("bogus = 1\n", "bogus"),
        ("[limits]\nbogus_max = 1\n", "bogus_max"),
        ("[limits]\nclaim_batch_max = 0\n", "limits.claim_batch_max"),
        ("[limits]\nclaim_batch_max = 5000\n", "1..=1000"),
        ("[limits]\nlong_poll_wait_max = \"1h\"\n", "limits.long_poll_wait_max"),
        ("[limits]\nlong_poll_wait_max = \"soon\"\n", "limits.long_poll_wait_max"),
        ("[limits]\npayload_bytes_max = 99999999\n", "limits.payload_bytes_max"),
        ("[limits]\nqueued_per_host_max = 0\n", "limits.queued_per_host_max"),
        ("[limits]\nrequest_body_bytes_max = 10\n", "limits.request_body_bytes_max"),
        ("synchronous = \"off\"\n", "synchronous"),
        ("listen = \"nowhere\"\n", "listen"),
        // An unknown key says where the key of that name lives, or what it resembles: a
        // top-level key appended to the generated hub.toml lands in its closing [limits].
        ("[limits]\nlisten = \"127.0.0.1:0\"\n", "listen is a top-level key"),
        ("claim_batch_max = 3\n", "belongs in the [limits] table (limits.claim_batch_max)"),
        ("[limits]\nclaim_batch_maxx = 3\n", "did you mean limits.claim_batch_max?"),
        ("host_silence_warm = \"10m\"\n", "did you mean host_silence_warn?"),
    ] {
        check_bad_config(&hub, toml, field);
    }
    // A valid one passes `config check`.
    hub.write_config("[limits]\nclaim_batch_max = 5\nlong_poll_wait_max = \"2s\"\n");
    let out = hub.cli_ok(["config", "check"]);
    assert!(out.contains("valid"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_by_state_and_sigterm_shuts_down_cleanly() {
    if crate::harness::skipped_on_postgres("status_counts_by_state_and_sigterm_shuts_down_cleanly") {
        return;
    }
    let mut hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-1");
    prod.submit_new("c", "k1", &["host-a"]).await;
    prod.submit_new("c", "k2", &["host-a"]).await;
    prod.submit_new("c", "k3", &["host-a", "host-b"]).await;
    let got = node.claim(2, 0).await;
    node.mirror_and_ack(&got[0]).await;
    node.report(&got[0], "r", "succeeded", 0).await.ok(201);
    hub.fence("pause", &["--host", "host-b"], "x");

    // A fence on a host needs an operator's attention: status names it and exits 1.
    let out = hub.cli(["status", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (s["attention"][0]["kind"].as_str(), s["attention"][0]["subject"].as_str()),
        (Some("fence_active"), Some("host host-b")),
        "{s}"
    );
    assert_eq!(s["deliveries"], json!([["claimed", 1], ["delivered", 1], ["queued", 2]]), "{s}");
    assert_eq!((s["messages"].as_i64(), s["attempts"].as_i64()), (Some(3), Some(1)));
    assert_eq!((s["hosts"].as_i64(), s["active_fences"].as_i64()), (Some(2), Some(1)));
    assert_eq!(s["pending_fanout"], 0);
    assert_eq!(s["hub_running"], true);

    // A consistent copy while the hub runs.
    let copy = hub.scratch("backup").join("copy.db");
    hub.cli_ok([std::ffi::OsStr::new("backup"), "--out".as_ref(), copy.as_os_str()]);
    let conn = rusqlite::Connection::open_with_flags(&copy, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let n: i64 = conn.query_row("SELECT count(*) FROM deliveries", [], |r| r.get(0)).unwrap();
    assert_eq!(n, 4);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a backup holds every payload: readable by its owner only");
    assert_eq!(hub.cli([std::ffi::OsStr::new("backup"), "--out".as_ref(), copy.as_os_str()]).status.code(), Some(2));

    let status = hub.terminate();
    assert!(status.success(), "SIGTERM is a clean shutdown: {status}; stderr: {}", hub.serve_stderr());
    assert!(hub.serve_stdout().contains("listening on 127.0.0.1:"), "stdout: {}", hub.serve_stdout());
    // A stopped hub needs attention: status says so and exits 1, like `systemctl is-active`.
    let out = hub.cli(["status", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["hub_running"], false);
    assert_eq!(s["attention"][0]["kind"], "hub_not_running", "{s}");
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_list_filters_and_show_exit_codes() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let a1 = prod.submit_new("one", "k1", &["host-a", "host-b"]).await;
    let a2 = prod.submit_new("two", "k2", &["host-a"]).await;
    let node = hub.node("host-a", "inst-1");
    assert_eq!(node.claim(1, 0).await.len(), 1);

    assert_eq!(listed(&hub, &[], "delivery_id").len(), 3);
    assert_eq!(listed(&hub, &["--host", "host-a"], "delivery_id"), [json!(a1.to("host-a")), json!(a2.to("host-a"))]);
    assert_eq!(listed(&hub, &["--conversation", "two"], "delivery_id"), [json!(a2.to("host-a"))]);
    assert_eq!(listed(&hub, &["--state", "claimed"], "delivery_id"), [json!(a1.to("host-a"))]);
    assert_eq!(listed(&hub, &["--state", "queued", "--host", "host-b"], "delivery_id"), [json!(a1.to("host-b"))]);
    assert_eq!(listed(&hub, &["--state", "claimed"], "instance_id"), [json!("inst-1")]);
    assert!(listed(&hub, &["--state", "held"], "delivery_id").is_empty());

    let unknown = random_id();
    let out = hub.cli(["deliveries", "show", &unknown, "--json"]);
    assert_eq!(out.status.code(), Some(1), "not found is exit 1");
    assert!(String::from_utf8_lossy(&out.stderr).contains(&unknown));
    let out = hub.cli(["deliveries", "list", "--state", "bogus"]);
    assert_eq!(out.status.code(), Some(2), "bad input is exit 2");
    // The human table lists the same deliveries.
    let table = hub.cli_ok(["deliveries", "list"]);
    assert!(table.lines().next().unwrap_or_default().contains("STATE"), "{table}");
    assert_eq!(table.lines().count(), 4, "header + 3 rows: {table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_send_works_with_the_hub_stopped_and_is_idempotent() {
    let mut hub = Hub::builder().stopped().start();
    let send = |key: &str, payload: &str| {
        hub.cli(["send", "--conversation", "c", "--to", "host-a,host-b", "--key", key, "--payload", payload, "--json"])
    };
    let first = send("hand-1", r#"{"a":1}"#);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let first: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(first["duplicate"], false);
    assert_eq!(first["deliveries"].as_array().unwrap().len(), 2);
    let again: serde_json::Value = serde_json::from_slice(&send("hand-1", r#"{"a":1}"#).stdout).unwrap();
    assert_eq!((&again["duplicate"], &again["message_id"]), (&json!(true), &first["message_id"]));
    // Conflicting content, bad names, unknown hosts, bad JSON: exit 2, nothing added.
    assert_eq!(send("hand-1", r#"{"a":2}"#).status.code(), Some(2));
    assert_eq!(send("bad key", r#"{"a":1}"#).status.code(), Some(2));
    assert_eq!(send("hand-2", "not json").status.code(), Some(2));
    let out = hub.cli(["send", "--conversation", "Bad", "--to", "host-a", "--key", "k", "--payload", "1"]);
    assert_eq!(out.status.code(), Some(2));
    let out = hub.cli(["send", "--conversation", "c", "--to", "nobody", "--key", "k", "--payload", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nobody"));
    assert_eq!(hub.deliveries().len(), 2);

    // Sent while stopped, claimable after start.
    hub.serve(None);
    let got = hub.node("host-a", "inst-1").claim(10, 0).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, json!({"a": 1}));
    assert_eq!(got[0].message_id, first["message_id"].as_str().unwrap());
    // `init` on an initialised directory refuses to overwrite it.
    assert_eq!(hub.cli(["init"]).status.code(), Some(2));
    hub.verify_ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics_answer_any_enrolled_certificate() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.client("host-a");
    assert_eq!(prod.get("/healthz").await.ok(200)["status"], "ok");
    assert_eq!(node.get("/readyz").await.ok(200)["ready"], true);
    prod.submit_new("c", "k", &["host-a"]).await;
    prod.submit("c", "k", json!({"key": "k"}), &["host-a"]).await.ok(200);
    let metrics = node.get("/metrics").await;
    assert_eq!(metrics.status, 200);
    for line in ["baton_hub_messages_accepted_total 1", "baton_hub_messages_duplicate_total 1"] {
        assert!(metrics.text.lines().any(|l| l == line), "/metrics lacks {line:?}:\n{}", metrics.text);
    }
}

/// The hub's database files, as bytes, to show a refused store was not rewritten.
fn db_bytes(hub: &Hub) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(hub.data_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("hub.db"))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    files.sort();
    files
}

/// Damages the stopped hub's database with `damage`, then `serve` and a CLI command must both
/// refuse it with exit 3 and a stderr containing `says`, leaving the files byte for byte as they
/// were. With `checkpoint`, the WAL is folded into the main file first (a cleanly closed store);
/// without, the damage meets a WAL still holding recent commits (a store after a crash).
async fn check_refused_store(damage: impl FnOnce(&std::path::Path), says: &str, checkpoint: bool) {
    let mut hub = Hub::start();
    let prod = hub.client("prod");
    for i in 0..20 {
        prod.submit_new(&format!("c{i}"), &format!("k{i}"), &["host-a", "host-b"]).await;
    }
    hub.terminate();
    if checkpoint {
        let conn = rusqlite::Connection::open(hub.data_dir().join("hub.db")).unwrap();
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
    }
    damage(&hub.data_dir().join("hub.db"));
    let before = db_bytes(&hub);
    std::fs::remove_file(hub.data_dir().join("hub.addr")).unwrap(); // left by the run that ended
    let out = output_within(hub.cli_command(["serve", "--listen", "127.0.0.1:0"]), EVENT_WAIT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "serve: {stderr}");
    assert!(stderr.contains(says), "serve says why: {stderr}");
    assert!(!hub.data_dir().join("hub.addr").exists(), "serve listened on a refused store");
    // Changing commands open the store as strictly as `serve`; `verify` reads it whole. Both
    // refuse it. (Read-only listings skip the whole-file check, so they may answer from the
    // pages they read; they are not the probe here.)
    let out = hub.cli(["fence", "pause", "--all", "--reason", "probe"]);
    assert_eq!(out.status.code(), Some(3), "fence pause: {}", String::from_utf8_lossy(&out.stderr));
    let out = hub.cli(["verify"]);
    assert_ne!(out.status.code(), Some(0), "verify passed a refused store: {}", String::from_utf8_lossy(&out.stdout));
    let after = db_bytes(&hub);
    // A read-only open (`verify`) may leave SQLite's empty side files behind (an empty WAL and
    // the shared-memory index, which hold no data); the database itself must be untouched.
    let after: Vec<_> = after
        .into_iter()
        .filter(|(n, b)| {
            let harmless_new = n.ends_with("-shm") || (n.ends_with("-wal") && b.is_empty());
            before.iter().any(|(m, _)| m == n) || !harmless_new
        })
        .collect();
    let names = |v: &[(String, Vec<u8>)]| v.iter().map(|(n, b)| format!("{n} ({} bytes)", b.len())).collect::<Vec<_>>();
    assert_eq!(names(&after), names(&before), "the database files changed");
    for ((name, a), (_, b)) in after.iter().zip(&before) {
        // The -shm file is SQLite's shared-memory index, rebuilt from the WAL by every opener;
        // it holds no data. The database and its WAL must be byte for byte the same.
        if name.ends_with("-shm") {
            continue;
        }
        let first = a.iter().zip(b).position(|(x, y)| x != y);
        assert!(first.is_none(), "{name} was rewritten (first difference at byte {first:?})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_newer_than_the_binary_is_refused_and_left_alone() {
    if crate::harness::skipped_on_postgres("a_database_newer_than_the_binary_is_refused_and_left_alone") {
        return;
    }
    check_refused_store(
        |db| {
            let conn = rusqlite::Connection::open(db).unwrap();
            conn.execute_batch("PRAGMA user_version = 999").unwrap();
        },
        "999",
        false,
    )
    .await;
}

/// Garbage over the second page of the main database file (a b-tree page).
fn damage_page_two(db: &std::path::Path) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(db).unwrap();
    let len = f.metadata().unwrap().len();
    assert!(len >= 4 * 4096, "the database is only {len} bytes");
    f.seek(SeekFrom::Start(4096)).unwrap();
    f.write_all(&[0xA5; 4096]).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_database_is_refused_and_left_alone() {
    if crate::harness::skipped_on_postgres("a_damaged_database_is_refused_and_left_alone") {
        return;
    }
    check_refused_store(damage_page_two, "damaged", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_database_with_a_wal_is_refused_and_left_alone() {
    if crate::harness::skipped_on_postgres("a_damaged_database_with_a_wal_is_refused_and_left_alone") {
        return;
    }
    // Refusing must not checkpoint the WAL into the damaged file on the way out: that rewrites
    // the very file the operator has to inspect or restore.
    check_refused_store(damage_page_two, "damaged", false).await;
}

/// `baton-hub --help` lists the exit statuses the hub uses, 0 to 4 as README says, and none
/// of the node's own (5 revoked, 6 taken over), which no hub command ever exits with.
#[test]
fn hub_help_lists_only_the_hubs_exit_statuses() {
    let mut cmd = crate::harness::bins().hub_command();
    cmd.arg("--help");
    let out = output_within(cmd, EVENT_WAIT);
    let help = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{help}");
    assert!(help.contains("Exit status:") && help.contains("  4  any other failure"), "{help}");
    for node_only in ["  5  ", "  6  ", "this node's certificate", "taken over"] {
        assert!(!help.contains(node_only), "the hub's help lists {node_only:?}:\n{help}");
    }
}
