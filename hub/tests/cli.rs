//! The `baton-hub` binary itself: one hub per data directory, `status` that wakes nobody, and
//! read-only commands that neither check the whole file nor log a migration. Each test runs the
//! real binary in a fresh data directory with a scrubbed environment.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long anything may take on a loaded machine before the test gives up. Tests wait on
/// events (a file appearing, a process exiting), never on a fixed sleep.
const EVENT_WAIT: Duration = Duration::from_secs(60);
/// Pace of polling for an event.
const POLL_PACE: Duration = Duration::from_millis(20);

/// A data directory and the binary, with the environment scrubbed of anything `BATON_*`.
struct Dir {
    tmp: tempfile::TempDir,
}

impl Dir {
    fn init() -> Dir {
        let dir = Dir { tmp: tempfile::tempdir().expect("temp dir") };
        let out = dir.run(&["init"]);
        assert!(out.status.success(), "init: {}", String::from_utf8_lossy(&out.stderr));
        dir
    }

    fn data(&self) -> PathBuf {
        self.tmp.path().join("data")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_baton-hub"));
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("BATON_") || k == "RUST_LOG" {
                cmd.env_remove(k);
            }
        }
        cmd.env("BATON_LOG", "info").arg("--data-dir").arg(self.data()).args(args);
        cmd
    }

    /// Runs a command to completion, within `EVENT_WAIT`.
    fn run(&self, args: &[&str]) -> Output {
        let child = self.command(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
        wait_output(child)
    }

    /// Starts `serve` on a free port and waits until it has written `hub.addr` and opened its
    /// wake socket.
    fn serve(&self) -> Child {
        let _ = std::fs::remove_file(self.data().join("hub.addr"));
        let mut child = self
            .command(&["serve", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn serve");
        let (addr, socket) = (self.data().join("hub.addr"), self.data().join("hub.sock"));
        let started = Instant::now();
        while !addr.exists() || !socket.exists() {
            if let Some(status) = child.try_wait().expect("try_wait") {
                panic!("serve exited ({status}) before listening: {}", stderr_of(&mut child));
            }
            assert!(started.elapsed() < EVENT_WAIT, "serve did not listen within {EVENT_WAIT:?}");
            std::thread::sleep(POLL_PACE);
        }
        child
    }
}

fn stderr_of(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(e) = child.stderr.as_mut() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

/// Waits for `child` to exit within `EVENT_WAIT` (killing it past that) and collects its output.
fn wait_output(mut child: Child) -> Output {
    let started = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if started.elapsed() > EVENT_WAIT {
            let _ = child.kill();
            panic!("the command did not finish within {EVENT_WAIT:?}");
        }
        std::thread::sleep(POLL_PACE);
    }
    child.wait_with_output().expect("output")
}

fn terminate(child: Child) -> Output {
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
    assert!(status.success());
    wait_output(child)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `status --json`, asserting its exit status: 0 while a hub runs, 1 (needs attention) when
/// none does, as for `systemctl is-active`.
fn status_json(dir: &Dir) -> serde_json::Value {
    let out = dir.run(&["status", "--json"]);
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    // 0 only when the hub runs and nothing needs attention (an active fence on everything does).
    let calm = s["hub_running"] == true && s["attention"].as_array().is_some_and(Vec::is_empty);
    let expected = if calm { 0 } else { 1 };
    assert_eq!(out.status.code(), Some(expected), "status: {s} {}", text(&out.stderr));
    s
}

fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map(|m| m.ino()).expect("metadata")
}

/// A second `serve` on a data directory a hub serves is refused at once, naming the running hub
/// (pid, address), and leaves its address file, lock and socket alone; the CLI keeps working,
/// and `status` reads the lock.
#[test]
fn one_hub_per_data_directory() {
    let dir = Dir::init();
    let first = dir.serve();
    let data = dir.data();
    let addr = std::fs::read_to_string(data.join("hub.addr")).expect("hub.addr");
    let lock = std::fs::read_to_string(data.join("hub.lock")).expect("hub.lock");
    let socket = inode(&data.join("hub.sock"));

    let second = dir.run(&["serve", "--listen", "127.0.0.1:0"]);
    let stderr = text(&second.stderr);
    assert_eq!(second.status.code(), Some(4), "a second hub is refused: {stderr}");
    assert!(stderr.contains(&format!("pid {}", first.id())), "the refusal names the pid: {stderr}");
    assert!(stderr.contains(addr.trim()), "the refusal names the address {addr}: {stderr}");
    assert_eq!(std::fs::read_to_string(data.join("hub.addr")).expect("hub.addr"), addr, "hub.addr untouched");
    assert_eq!(std::fs::read_to_string(data.join("hub.lock")).expect("hub.lock"), lock, "hub.lock untouched");
    assert_eq!(inode(&data.join("hub.sock")), socket, "the running hub's socket untouched");

    let s = status_json(&dir);
    assert_eq!(s["hub_running"], true, "{s}");
    assert_eq!(s["hub_pid"], first.id(), "{s}");
    assert_eq!(s["hub_listen"], addr.trim(), "{s}");
    let fence = dir.run(&["fence", "pause", "--all", "--reason", "while it runs"]);
    assert!(fence.status.success(), "changing commands work while the hub runs: {}", text(&fence.stderr));
    assert!(dir.run(&["fence", "list"]).status.success());

    let out = terminate(first);
    assert!(out.status.success(), "SIGTERM is a clean stop: {}", text(&out.stderr));
    assert_eq!(status_json(&dir)["hub_running"], false);
    // The directory is free again: a new hub starts.
    let again = dir.serve();
    assert_eq!(status_json(&dir)["hub_running"], true);
    assert!(terminate(again).status.success());
}

/// Regression: `status` told whether the hub runs by connecting to its wake socket, which
/// woke every waiting long-poll. It reads the lock and connects to nothing.
#[test]
fn status_wakes_nobody() {
    let dir = Dir::init();
    let listener = std::os::unix::net::UnixListener::bind(dir.data().join("hub.sock")).expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let s = status_json(&dir);
    assert_eq!(s["hub_running"], false, "no hub holds the lock: {s}");
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("status connected to the wake socket: {other:?}"),
    }
}

/// Damages the free list of the database (pages no query reads), which only a whole-file
/// check notices.
fn damage_free_list(db: &Path) {
    let conn = rusqlite::Connection::open(db).expect("open");
    conn.execute_batch(
        "CREATE TABLE scratch (x BLOB); INSERT INTO scratch SELECT randomblob(3000) FROM (SELECT 1 UNION ALL SELECT 2
         UNION ALL SELECT 3 UNION ALL SELECT 4); DROP TABLE scratch; PRAGMA wal_checkpoint(TRUNCATE);",
    )
    .expect("make free pages");
    drop(conn);
    let mut bytes = std::fs::read(db).expect("read db");
    let page_size = match u16::from_be_bytes([bytes[16], bytes[17]]) {
        1 => 65536,
        n => usize::from(n),
    };
    let trunk = u32::from_be_bytes([bytes[32], bytes[33], bytes[34], bytes[35]]) as usize;
    assert!(trunk > 0, "the database has a free list");
    let at = (trunk - 1) * page_size;
    bytes[at..at + 4].copy_from_slice(&0x00ff_ffffu32.to_be_bytes());
    std::fs::write(db, bytes).expect("write db");
}

/// Read-only commands open a read-only connection without a whole-file check (their cost
/// does not grow with the database) and log no migration; changing commands keep the strict
/// open, which refuses the damaged file.
#[test]
fn reads_skip_the_whole_file_check_and_log_no_migration() {
    let dir = Dir::init();
    let db = dir.data().join("hub.db");
    damage_free_list(&db);
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["deliveries", "list"],
        &["held", "list", "--json"],
        &["fence", "list"],
    ] {
        let out = dir.run(args);
        let stderr = text(&out.stderr);
        // `status` exits 1 because no hub runs here, and says only that.
        let ok = out.status.success() || (args[0] == "status" && stderr.trim() == "baton-hub: the hub is not running");
        assert!(ok, "{args:?} reads without a whole-file check: {stderr}");
        assert!(!stderr.contains("migrated"), "{args:?} logged a migration that did not happen: {stderr}");
    }
    let out = dir.run(&["fence", "pause", "--all"]);
    assert_eq!(out.status.code(), Some(3), "the write path checks the file: {}", text(&out.stderr));
    let out = dir.run(&["verify"]);
    assert_eq!(out.status.code(), Some(4), "verify keeps its full check: {}", text(&out.stderr));
}

/// `verify --json` prints typed problems.
#[test]
fn verify_prints_typed_problems() {
    let dir = Dir::init();
    let out = dir.run(&["verify", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v, serde_json::json!({"problems": []}));
    let conn = rusqlite::Connection::open(dir.data().join("hub.db")).expect("open");
    conn.execute("INSERT INTO hosts (name, enrolled_at) VALUES ('host-a', 0)", []).expect("host");
    conn.execute("INSERT INTO host_backlog (host, waiting) VALUES ('host-a', 3)", []).expect("backlog");
    drop(conn);
    let out = dir.run(&["verify", "--json"]);
    assert_eq!(out.status.code(), Some(4));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["problems"][0]["kind"], "backlog_count", "{v}");
    assert_eq!(v["problems"][0]["subject"], "host-a", "{v}");
}

/// `pools add|remove|list|show`: operators keep pools; a change that changes nothing exits 1,
/// a host never enrolled is refused naming it (exit 2) with nothing written, every change is
/// audited, and retiring a host removes it from its pools in the same step.
#[test]
fn pools_are_kept_by_operators_audited_and_left_at_retire() {
    let dir = Dir::init();
    let certs = dir.tmp.path().join("certs");
    for h in ["w1", "w2"] {
        let out = dir.run(&["enroll", "node", h, "--out", certs.to_str().unwrap(), "--reason", "r"]);
        assert!(out.status.success(), "enroll {h}: {}", text(&out.stderr));
    }
    let out = dir.run(&["pools", "add", "--pool", "gpu", "w2", "w1", "--reason", "more hands"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "w1: joined pool gpu\nw2: joined pool gpu\n");
    let out = dir.run(&["pools", "add", "--pool", "gpu", "w1"]);
    assert_eq!(out.status.code(), Some(1), "already a member: {}", text(&out.stdout));
    let out = dir.run(&["pools", "add", "--pool", "cpu", "w1", "nobody"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("nobody"), "{}", text(&out.stderr));
    let out = dir.run(&["pools", "add", "--pool", "Not A Name", "w1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("pool"), "{}", text(&out.stderr));

    let show = |name: &str| -> serde_json::Value {
        let out = dir.run(&["pools", "show", name, "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON")[0].clone()
    };
    let gpu = show("gpu");
    assert_eq!(member_names(&gpu), ["w1", "w2"], "{gpu}");
    assert_eq!((gpu["queued"].as_i64(), gpu["in_flight"].as_i64()), (Some(0), Some(0)), "{gpu}");
    let out = dir.run(&["pools", "show", "cpu"]);
    assert_eq!(out.status.code(), Some(1), "no such pool: nothing was written by the refused add");

    let out = dir.run(&["hosts", "list", "--json"]);
    let hosts: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(hosts[0]["pools"], serde_json::json!(["gpu"]), "hosts list shows each host's pools: {hosts}");
    let out = dir.run(&["hosts", "list"]);
    assert!(text(&out.stdout).lines().next().is_some_and(|h| h.ends_with("POOLS")), "{}", text(&out.stdout));
    let out = dir.run(&["pools", "remove", "--pool", "gpu", "w1", "--reason", "less"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = dir.run(&["pools", "list", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(member_names(&list[0]), ["w2"], "{list}");
    let out = dir.run(&["pools", "list"]);
    assert!(text(&out.stdout).starts_with("POOL"), "{}", text(&out.stdout));

    let out = dir.run(&["retire", "w2", "--reason", "gone", "--yes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("left pool(s): gpu"), "{}", text(&out.stdout));
    assert!(member_names(&show("gpu")).is_empty());

    let out = dir.run(&["audit", "--json"]);
    let audit = text(&out.stdout);
    for action in ["pool_create", "pool_add", "pool_remove"] {
        assert!(audit.contains(action), "{action} audited: {audit}");
    }
    assert!(audit.contains("pool gpu host w2") && audit.contains("gone"), "the retire's removal: {audit}");
}

/// The host names of a pool's members in `pools show|list --json` (each member is an object
/// with its standing).
fn member_names(pool: &serde_json::Value) -> Vec<String> {
    pool["members"].as_array().expect("members").iter().map(|m| m["host"].as_str().expect("host").to_string()).collect()
}
