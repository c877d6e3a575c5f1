//! Bad state at rest: damaged databases are refused at start with a clear message and exit 3,
//! never served and never rewritten; a damage that SQLite cannot see must be harmless (the
//! record still verifies and holds every message). A node whose data directory was wiped comes
//! back as a new instance and takes none of the old instance's work.

use crate::harness::{Hub, output_within};
use crate::node_harness::node_status;
use std::fs;
use std::path::Path;
use std::time::Duration;

/// One way to damage a file, with its name.
type Damage = (String, Box<dyn Fn(&Path)>);

/// Damage patterns per file: truncations and single-byte flips at seeded offsets.
const FLIPS: u64 = 16;

/// Deterministic offsets in `[start, len)` from a seed (a small LCG; no extra crates).
fn offset(seed: u64, start: u64, len: u64) -> u64 {
    let x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    start + (x >> 11) % (len - start)
}

fn flip_byte(path: &Path, at: u64) {
    let mut bytes = fs::read(path).expect("read db");
    bytes[at as usize] ^= 0xff;
    fs::write(path, bytes).expect("write db");
}

fn truncate_to(path: &Path, len: u64) {
    let f = fs::OpenOptions::new().write(true).open(path).expect("open db");
    f.set_len(len).expect("truncate");
}

/// A stopped hub with 20 messages accepted and its WAL folded into the main file.
async fn stopped_hub() -> (Hub, i64) {
    let mut hub = Hub::start();
    let prod = hub.client("prod");
    for i in 0..20 {
        prod.submit_new(&format!("c{i}"), &format!("k{i}"), &["host-a", "host-b"]).await;
    }
    hub.terminate();
    let conn = rusqlite::Connection::open(hub.data_dir().join("hub.db")).expect("open");
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).expect("checkpoint");
    drop(conn);
    let _ = fs::remove_file(hub.data_dir().join("hub.addr"));
    (hub, 20)
}

/// Either the hub refuses the damaged file (exit 3, says why, file untouched), or the damage
/// is harmless: the hub opens it, `verify` passes and every message is still there.
fn refused_or_harmless(hub: &Hub, messages: i64, what: &str) -> bool {
    let db = hub.data_dir().join("hub.db");
    let before = fs::read(&db).expect("read");
    // `verify` reads the whole file (read-only listings do not, by design); whatever it does
    // not pass, `serve` must refuse without rewriting it.
    let verify = hub.cli(["verify"]);
    if verify.status.code() == Some(0) {
        // The hub is stopped, so status exits 1 for that alone ("needs attention"); anything
        // else would be the damage showing.
        let out = hub.cli(["status", "--json"]);
        assert_eq!(out.status.code(), Some(1), "{what}: verify passed but status failed");
        let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status json");
        let attention: Vec<&str> =
            status["attention"].as_array().expect("attention").iter().filter_map(|a| a["kind"].as_str()).collect();
        assert_eq!(attention, ["hub_not_running"], "{what}: verify passed but status found more");
        assert_eq!(status["messages"], messages, "{what}: verify passed, but messages are missing");
        return false;
    }
    assert_eq!(fs::read(&db).expect("read"), before, "{what}: verify rewrote a damaged file");
    // `verify` either lists what it found, or stops at damage it cannot read past (then SQLite
    // itself met the damage, which counts as an integrity problem).
    let out = hub.cli(["verify", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        assert!(!out.stderr.is_empty(), "{what}: verify failed silently");
        serde_json::json!({"problems": [{"kind": "integrity"}]})
    });
    let problems = report["problems"].as_array().cloned().unwrap_or_default();
    assert!(!problems.is_empty(), "{what}: verify failed without naming a problem");
    // Damage SQLite itself sees (its integrity check) must keep `serve` from starting. A byte
    // flipped inside a stored value leaves a well-formed file that only `verify`'s value and
    // invariant checks can see; there `verify` naming the row is the detection.
    if problems.iter().any(|p| p["kind"] == "integrity") {
        let serve = output_within(hub.cli_command(["serve", "--listen", "127.0.0.1:0"]), Duration::from_secs(20));
        let stderr = String::from_utf8_lossy(&serve.stderr);
        assert_eq!(serve.status.code(), Some(3), "{what}: serve must refuse a damaged store: {stderr}");
        assert!(
            stderr.contains("damaged") || stderr.contains("not a") || stderr.contains("corrupt"),
            "{what}: unclear refusal: {stderr}"
        );
        assert!(!hub.data_dir().join("hub.addr").exists(), "{what}: serve listened on a damaged store");
        assert_eq!(fs::read(&db).expect("read"), before, "{what}: serve rewrote a refused file");
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_hub_databases_are_refused_or_harmless() {
    if crate::harness::skipped_on_postgres("damaged_hub_databases_are_refused_or_harmless") {
        return;
    }
    let (hub, messages) = stopped_hub().await;
    let db = hub.data_dir().join("hub.db");
    let pristine = fs::read(&db).expect("read");
    let len = pristine.len() as u64;
    let mut refused = 0;
    for (what, cut) in
        [("truncated to half", len / 2), ("truncated mid-page", len - 1000), ("truncated to 100 bytes", 100)]
    {
        truncate_to(&db, cut);
        refused += usize::from(refused_or_harmless(&hub, messages, what));
        fs::write(&db, &pristine).expect("restore");
    }
    for seed in 0..FLIPS {
        let at = offset(seed, 100, len);
        flip_byte(&db, at);
        refused += usize::from(refused_or_harmless(&hub, messages, &format!("byte {at} flipped")));
        fs::write(&db, &pristine).expect("restore");
    }
    assert!(refused >= 3, "at least the truncations must be refused; {refused} refusals");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_node_databases_are_refused_and_left_alone() {
    let t = Hub::with_nodes(&["host-a"]);
    let mut node = t.node_process("host-a").start();
    let d = t.send_one("c", "k1", "host-a");
    t.wait_outcome(&d);
    t.assert_one_attempt(&d, "succeeded");
    assert!(node.term().success());
    let db = node.data_dir().join("node.db");
    let conn = rusqlite::Connection::open(&db).expect("open node db");
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).expect("checkpoint");
    drop(conn);
    let pristine = fs::read(&db).expect("read");
    let len = pristine.len() as u64;
    let mut cases: Vec<Damage> = vec![
        ("truncated to half".into(), Box::new(move |p: &Path| truncate_to(p, len / 2))),
        ("truncated to 100 bytes".into(), Box::new(|p: &Path| truncate_to(p, 100))),
    ];
    for seed in 0..FLIPS {
        let at = offset(seed + 1000, 100, len);
        cases.push((format!("byte {at} flipped"), Box::new(move |p: &Path| flip_byte(p, at))));
    }
    let mut refused = 0;
    for (what, damage) in cases {
        damage(&db);
        let damaged = fs::read(&db).expect("read");
        let status = node_status(db.parent().expect("data dir"), true);
        if status.status.code() == Some(3) {
            refused += 1;
            let stderr = String::from_utf8_lossy(&status.stderr);
            assert!(stderr.contains("damaged") || stderr.contains("not a"), "{what}: unclear refusal: {stderr}");
            node.restart();
            let exit = node
                .wait_exit(Duration::from_secs(20))
                .unwrap_or_else(|| panic!("{what}: the node ran on a damaged store"));
            assert_eq!(exit.code(), Some(3), "{what}: baton-node run must exit 3");
            assert_eq!(fs::read(&db).expect("read"), damaged, "{what}: a refused node store was rewritten");
        } else {
            // Damage SQLite cannot see (unused bytes) must be harmless: the store still opens
            // and reads, and the node must not run the finished delivery again (checked below).
            assert!(
                status.status.success(),
                "{what}: status failed oddly: {}",
                String::from_utf8_lossy(&status.stderr)
            );
        }
        fs::write(&db, &pristine).expect("restore");
    }
    assert!(refused >= 2, "the truncations must be refused; {refused} refusals");
    // The pristine store still works.
    node.restart();
    let d2 = t.send_one("c", "k2", "host-a");
    t.wait_outcome(&d2);
    t.assert_one_attempt(&d2, "succeeded");
    assert_eq!(t.exec_log().runs_of(&d), 1, "the first delivery never ran again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_comes_back_as_a_new_instance_and_takes_nothing_of_the_old() {
    let t = Hub::with_nodes(&["host-a"]);
    // The old instance crashes holding a delivered turn with no outcome.
    let mut node = t.node_process("host-a").crash_point("node.handoff.after_response").start();
    let d = t.send_one("c", "k1", "host-a");
    node.wait_crash("node.handoff.after_response");
    let old = t.delivery(&d);
    let old_instance = old["instance_id"].as_str().expect("holder").to_string();
    // Its data directory is lost; the same certificate starts again from nothing.
    fs::remove_dir_all(node.data_dir()).expect("wipe");
    node.restart();
    let refused = node.wait_log_count("instance_conflict", 1);
    let d2 = t.send_one("c", "k2", "host-a");
    // Two more refused claims after the send: the new instance had its chances at `d2`.
    node.wait_log_count("instance_conflict", refused + 2);
    assert_eq!(t.exec_log().runs_of(&d), 0, "the new instance ran the old instance's turn");
    assert_eq!(t.exec_log().runs_of(&d2), 0, "the new instance took work while the old one holds some");
    let now = t.delivery(&d);
    assert_eq!(now["state"], "delivered");
    assert_eq!(now["instance_id"].as_str(), Some(old_instance.as_str()), "the old claim was handed over");
    // The operator declares the old instance gone: its turn becomes a visible `unknown`, and
    // the new instance takes the new work.
    let out = t.cli(["requeue", "--instance", &old_instance, "--reason", "disk replaced"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let attempts = t.attempts(&d);
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["outcome"], "unknown");
    t.wait_outcome(&d2);
    t.assert_one_attempt(&d2, "succeeded");
    assert_eq!(t.exec_log().runs_of(&d), 0, "the old turn was never run again");
    t.verify_ok();
}

/// An index that disagrees with its table is what `quick_check` cannot see and
/// `integrity_check` can: `serve` refuses it by default, and serves it only when the operator
/// chose `startup_check = "quick"` (the documented trade-off for very large files), while
/// `verify` still names the damage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_index_is_refused_unless_the_startup_check_is_quick() {
    if crate::harness::skipped_on_postgres("a_damaged_index_is_refused_unless_the_startup_check_is_quick") {
        return;
    }
    let (mut hub, _) = stopped_hub().await;
    let db = hub.data_dir().join("hub.db");
    // The index is redefined on another column, the column it really covers is changed (so
    // its entries go stale), and its definition is put back: the schema is exactly Baton's,
    // and only the index's contents disagree with the table.
    let define = |column: &str| {
        let conn = rusqlite::Connection::open(&db).expect("open");
        conn.pragma_update(None, "writable_schema", true).expect("writable_schema");
        let changed = conn
            .execute(
                &format!(
                    "UPDATE sqlite_schema SET sql = 'CREATE INDEX messages_by_accepted ON messages ({column})' \
                     WHERE name = 'messages_by_accepted'"
                ),
                [],
            )
            .expect("rewrite the index definition");
        assert_eq!(changed, 1, "the index to damage exists");
    };
    define("seq");
    {
        let conn = rusqlite::Connection::open(&db).expect("open");
        conn.execute("UPDATE messages SET accepted_at = accepted_at + 1", []).expect("change the column");
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).expect("checkpoint");
    }
    define("accepted_at");
    let before = fs::read(&db).expect("read");
    let serve = output_within(hub.cli_command(["serve", "--listen", "127.0.0.1:0"]), Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&serve.stderr);
    assert_eq!(serve.status.code(), Some(3), "serve must refuse an index that disagrees with its table: {stderr}");
    assert!(stderr.contains("messages_by_accepted"), "the refusal names the damaged index: {stderr}");
    assert!(!hub.data_dir().join("hub.addr").exists(), "serve listened on a damaged store");
    assert_eq!(fs::read(&db).expect("read"), before, "serve rewrote a refused file");

    let config = hub.data_dir().join("hub.toml");
    let text = fs::read_to_string(&config).expect("read hub.toml");
    hub.write_config(&format!("startup_check = \"quick\"\n{text}"));
    hub.serve(None);
    assert!(hub.terminate().success(), "the hub serving after a quick check stops cleanly");
    let verify = hub.cli(["verify"]);
    assert_ne!(verify.status.code(), Some(0), "verify still finds the damaged index");
}
