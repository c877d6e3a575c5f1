//! What the injected-fault tests (`disk_full`, `io_errors`, `clock_steps`) share: the
//! skip-or-require rule for faults that need root or a system package, a size-limited `tmpfs`
//! mounted over a data directory, a producer that keeps every answer's status and body (so a
//! refusal can be held to `503 storage_unavailable` and checked for leaks) while writing the
//! client history the checker reads, and the checks run after a fault heals.
//!
//! Each module of the suite uses a part of it.

use baton_fault::checker::{self, Report};
use baton_fault::cluster::{Cluster, fxhash};
use baton_fault::records::{HistoryLine, LineWriter};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

/// Set (to anything) to make a fault test that cannot inject its fault here (not root, no
/// `mount`, no `cc`, no libfaketime) fail instead of skipping.
pub(crate) const REQUIRE_VAR: &str = "BATON_REQUIRE_FAULTS";

/// `Ok` when the fault can be injected; otherwise prints why and returns `false` (skip), or
/// panics when `BATON_REQUIRE_FAULTS` is set.
pub(crate) fn available(test: &str, probe: Result<(), String>) -> bool {
    match probe {
        Ok(()) => true,
        Err(why) => {
            assert!(std::env::var_os(REQUIRE_VAR).is_none(), "{REQUIRE_VAR} is set but {test} cannot run: {why}");
            eprintln!("SKIPPED: {test}: {why}; set {REQUIRE_VAR} to make this a failure");
            false
        }
    }
}

/// Runs a command to completion; its output as an error when it fails.
pub(crate) fn sh(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program).args(args).output().map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

// ---------------------------------------------------------------------------------------------
// A small filesystem that really fills

/// A `tmpfs` of a fixed size mounted over a directory; unmounted (lazily, so a process still
/// holding a file cannot keep it) when dropped.
#[derive(Debug)]
pub(crate) struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// Whether this process may mount a `tmpfs` (root with the mount capability).
    pub(crate) fn probe() -> Result<(), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let t =
            Tmpfs::mount_over(&dir.path().join("probe"), "64k").map_err(|e| format!("cannot mount a tmpfs: {e}"))?;
        drop(t);
        Ok(())
    }

    /// Mounts a `tmpfs` of `size` (`mount -o size=`) over `dir`, keeping what `dir` held: its
    /// files are moved aside, the filesystem mounted, and they are copied onto it.
    pub(crate) fn mount_over(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let aside = dir.with_extension("before-tmpfs");
        std::fs::rename(dir, &aside).map_err(|e| e.to_string())?;
        std::fs::create_dir(dir).map_err(|e| e.to_string())?;
        let d = dir.to_string_lossy();
        if let Err(e) = sh("mount", &["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs", &d]) {
            // Put the directory back as it was.
            let _ = std::fs::remove_dir(dir);
            let _ = std::fs::rename(&aside, dir);
            return Err(e);
        }
        let t = Tmpfs { path: dir.to_path_buf() };
        sh("cp", &["-a", &format!("{}/.", aside.to_string_lossy()), &d])?;
        std::fs::remove_dir_all(&aside).map_err(|e| e.to_string())?;
        Ok(t)
    }

    /// Fills the filesystem with the file `ballast` (zeros, synced) until a write fails with
    /// ENOSPC; returns its size.
    pub(crate) fn fill(&self) -> u64 {
        use std::io::Write as _;
        let mut f = std::fs::File::create(self.ballast()).unwrap();
        let chunk = vec![0u8; 4096];
        let mut written = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling {}: {e}", self.path.display()),
            }
        }
        let _ = f.sync_all();
        written
    }

    /// Removes the ballast: the space returns.
    pub(crate) fn drain(&self) {
        std::fs::remove_file(self.ballast()).unwrap();
    }

    fn ballast(&self) -> PathBuf {
        self.path.join("ballast")
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = sh("umount", &["-l", &self.path.to_string_lossy()]);
    }
}

// ---------------------------------------------------------------------------------------------
// A producer that keeps the answers

/// One answer to an accept.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    /// The HTTP status, or `None` when no answer came.
    pub(crate) status: Option<u16>,
    /// The body as text (empty without an answer).
    pub(crate) body: String,
}

impl Answer {
    /// Whether the message is accepted (or replayed).
    pub(crate) fn ok(&self) -> bool {
        matches!(self.status, Some(200 | 201))
    }
}

/// Submits messages as the cluster's producer `prod`, writing the same client history lines as
/// `cluster::Producer` (same content hash) so the checker reads one history.
pub(crate) struct Submitter {
    client: reqwest::Client,
    history: Mutex<LineWriter>,
}

impl Submitter {
    /// A submitter for the cluster's producer.
    pub(crate) fn new(c: &Cluster) -> Submitter {
        let client = c
            .hub
            .identity("prod")
            .unwrap()
            .client_builder()
            .unwrap()
            .timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        Submitter { client, history: Mutex::new(LineWriter::append(&c.history).unwrap()) }
    }

    fn record(&self, phase: &str, key: &str, hash: &str, id: Option<String>, http: Option<u16>, err: Option<String>) {
        let line = HistoryLine {
            op: "accept".into(),
            phase: phase.into(),
            key: key.into(),
            payload_hash: hash.into(),
            message_id: id,
            http,
            producer: Some("prod".into()),
            err,
        };
        self.history.lock().unwrap().write(&line).unwrap();
    }

    /// One accept of `msg` at `hub`.
    pub(crate) async fn submit(&self, hub: SocketAddr, msg: &Msg) -> Answer {
        let hash = format!("{:x}", fxhash(&format!("{}|{}|{}", msg.conversation, msg.payload, msg.to.join(","))));
        self.record("invoke", &msg.key, &hash, None, None, None);
        let body = serde_json::json!({
            "conversation": msg.conversation, "idempotency_key": msg.key, "payload": msg.payload, "to": msg.to,
        });
        let resp = match self.client.post(format!("https://{hub}/v1/messages")).json(&body).send().await {
            Ok(r) => r,
            Err(e) => {
                self.record("info", &msg.key, &hash, None, None, Some(e.to_string()));
                return Answer { status: None, body: String::new() };
            }
        };
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        match (status, json["message_id"].as_str()) {
            (200 | 201, Some(id)) => self.record("ok", &msg.key, &hash, Some(id.into()), Some(status), None),
            (400..=499, _) if status != 429 => {
                self.record("fail", &msg.key, &hash, None, Some(status), Some(text.clone()))
            }
            _ => self.record("info", &msg.key, &hash, None, Some(status), None),
        }
        Answer { status: Some(status), body: text }
    }

    /// Submits `msg` until it is accepted, within `limit`; panics otherwise.
    pub(crate) async fn until_accepted(&self, hub: SocketAddr, msg: &Msg, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let a = self.submit(hub, msg).await;
            if a.ok() {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{} not accepted within {limit:?}: {a:?}", msg.key);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// One message of a workload.
#[derive(Debug, Clone)]
pub(crate) struct Msg {
    /// The idempotency key.
    pub(crate) key: String,
    /// The conversation.
    pub(crate) conversation: String,
    /// The payload.
    pub(crate) payload: serde_json::Value,
    /// The recipients.
    pub(crate) to: Vec<String>,
}

impl Msg {
    /// Message `i` of the run `tag`, to `to`, with `pad` bytes of filler in its payload.
    pub(crate) fn new(tag: &str, i: usize, to: &[&str], pad: usize) -> Msg {
        Msg {
            key: format!("{tag}-{i}"),
            conversation: format!("{tag}-c{}", i % 3),
            payload: serde_json::json!({"i": i, "pad": "x".repeat(pad)}),
            to: to.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// Holds a refusal to the storage contract: `503` with code `storage_unavailable`, and a body
/// that names no SQL, no SQLite error and no path (`leaks`: the directories it must not name).
pub(crate) fn assert_storage_refusal(a: &Answer, leaks: &[&Path]) {
    assert_eq!(a.status, Some(503), "a refusal that is not 503: {a:?}");
    let json: serde_json::Value =
        serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("503 body is not JSON ({e}): {}", a.body));
    assert_eq!(json["code"], "storage_unavailable", "{}", a.body);
    let lower = a.body.to_lowercase();
    for word in ["sqlite", "select ", "insert ", "update ", "database", "disk i/o", "full", ".db", "/"] {
        assert!(!lower.contains(word), "the 503 body leaks {word:?}: {}", a.body);
    }
    for p in leaks {
        assert!(!a.body.contains(&*p.to_string_lossy()), "the 503 body names {}: {}", p.display(), a.body);
    }
}

/// `PRAGMA integrity_check` on a stopped process's database: must say `ok`.
pub(crate) fn assert_integrity(db: &Path) {
    let conn = rusqlite::Connection::open(db).unwrap();
    let r: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(r, "ok", "integrity_check of {}", db.display());
}

/// Drains (nodes running), stops every process and runs the checker with liveness; panics with
/// the report, what is pending and the logs on a violation.
pub(crate) async fn drain_and_check(c: &mut Cluster, limit: Duration) -> Report {
    let quiet = c.quiesce(limit).await;
    let pending = c.pending();
    c.hub.kill().unwrap();
    for n in &mut c.nodes {
        n.proc_mut().kill().unwrap();
    }
    let report = checker::check(&c.inputs(true)).unwrap();
    assert!(
        quiet && report.violations.is_empty(),
        "quiescent={quiet}\npending:\n{pending}\n{}\n{}",
        report.render(),
        c.logs().chars().rev().take(20_000).collect::<String>().chars().rev().collect::<String>()
    );
    assert_integrity(&c.hub.db());
    for n in &c.nodes {
        if n.db().exists() {
            assert_integrity(&n.db());
        }
    }
    report
}

/// A multi-threaded runtime of two workers (the machine's share).
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The last `n` lines of `s`.
pub(crate) fn last_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
