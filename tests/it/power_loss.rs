//! Power loss: every answer the hub gave survives losing every write it had not synced.
//!
//! A small preloaded library wraps `fsync` and `fdatasync`: after each successful sync of a
//! database file (`*.db`, `*.db-wal`, `*.db-journal`) it copies the file to `FILE.durable`, so
//! `FILE.durable` is always exactly what stable storage holds. After SIGKILL the test replaces
//! each file by its durable copy (or removes it when it was never synced), drops the `-shm`
//! file (shared memory does not survive power loss), restarts the hub, and checks that every
//! accept, claim, ack and report the clients saw answered is still there. The same run with
//! `synchronous = "normal"` must lose acknowledged accepts: that shows the test bites.

use crate::harness::{Claimed, Hub};
use serde_json::json;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int tracked(const char *path) {
    const char *suffixes[] = {".db", ".db-wal", ".db-journal"};
    size_t n = strlen(path);
    for (int i = 0; i < 3; i++) {
        size_t m = strlen(suffixes[i]);
        if (n >= m && strcmp(path + n - m, suffixes[i]) == 0) return 1;
    }
    return 0;
}

static void shadow(int fd) {
    char link[64], path[PATH_MAX], tmp[PATH_MAX + 32], dst[PATH_MAX + 32], buf[65536];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = 0;
    if (!tracked(path)) return;
    snprintf(dst, sizeof dst, "%s.durable", path);
    snprintf(tmp, sizeof tmp, "%s.durable.tmp", path);
    pthread_mutex_lock(&lock);
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out >= 0) {
        off_t off = 0;
        ssize_t r;
        while ((r = pread(fd, buf, sizeof buf, off)) > 0) {
            if (write(out, buf, (size_t)r) != r) break;
            off += r;
        }
        close(out);
        rename(tmp, dst);
    }
    pthread_mutex_unlock(&lock);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    int r = real(fd);
    if (r == 0) shadow(fd);
    return r;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    int r = real(fd);
    if (r == 0) shadow(fd);
    return r;
}
"#;

const DB_FILES: [&str; 3] = ["hub.db", "hub.db-wal", "hub.db-journal"];
const NODE_DB_FILES: [&str; 3] = ["node.db", "node.db-wal", "node.db-journal"];

/// Compiles the sync-shadowing library into `dir`.
fn build_shim(dir: &Path) -> PathBuf {
    let src = dir.join("durable_shadow.c");
    let lib = dir.join("durable_shadow.so");
    fs::write(&src, SHIM).expect("write shim source");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .args(["-ldl", "-lpthread"])
        .output()
        .expect("run cc (a C compiler is required for the power-loss tests)");
    assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
    lib
}

/// Marks what is on disk now as durable (the set-up processes exited cleanly).
fn snapshot_durable(data: &Path) {
    snapshot_files(data, &DB_FILES);
}

fn snapshot_files(data: &Path, files: &[&str]) {
    for f in files {
        let p = data.join(f);
        let d = data.join(format!("{f}.durable"));
        if p.exists() {
            fs::copy(&p, &d).expect("snapshot");
        } else {
            let _ = fs::remove_file(&d);
        }
    }
}

/// Throws away every write that was not synced.
fn lose_power(data: &Path) {
    lose_power_of(data, &DB_FILES, "hub.db-shm");
}

fn lose_power_of(data: &Path, files: &[&str], shm: &str) {
    for f in files {
        let p = data.join(f);
        let d = data.join(format!("{f}.durable"));
        if d.exists() {
            fs::rename(&d, &p).expect("restore durable image");
        } else {
            let _ = fs::remove_file(&p);
        }
    }
    let _ = fs::remove_file(data.join(shm));
}

/// The checkpoint thread syncs the log whenever it runs, and with `synchronous = "normal"` that
/// is when commits become durable: a run of `normal` has it wait an hour (the TOML value set
/// here), so it shows what `normal` alone loses; a run of `full` keeps the default interval,
/// checkpointing as in production.
fn unsynced_checkpoints(synchronous: &str) -> Option<&'static str> {
    (synchronous == "normal").then_some("\"1h\"")
}

struct Seen {
    accepted: Vec<String>,
    claimed: Vec<Claimed>,
    acked: Vec<Claimed>,
    reported: Vec<Claimed>,
}

/// Runs traffic against a shimmed hub, kills it, loses power, restarts it, and returns the
/// acknowledged accepts that did not survive, after checking claims, acks and reports.
async fn run(synchronous: &str) -> (usize, usize) {
    let mut config = format!("synchronous = \"{synchronous}\"\n");
    if let Some(every) = unsynced_checkpoints(synchronous) {
        config.push_str(&format!("checkpoint_interval = {every}\n"));
    }
    let mut hub = Hub::builder().config(&config).stopped().start();
    let shim = build_shim(&hub.scratch("shim"));
    snapshot_durable(hub.data_dir());
    hub.kit_mut().set_env("LD_PRELOAD", &shim.display().to_string());
    hub.serve(None);
    let producer = hub.client("prod");
    let node = hub.node("host-a", "pl-1");

    let mut seen = Seen { accepted: Vec::new(), claimed: Vec::new(), acked: Vec::new(), reported: Vec::new() };
    for i in 0..20 {
        let r = producer.submit("power", &format!("k{i}"), json!({"i": i}), &["host-a"]).await;
        seen.accepted.push(r.ok(201)["message_id"].as_str().expect("id").to_string());
    }
    seen.claimed = node.claim(12, 0).await;
    assert_eq!(seen.claimed.len(), 12);
    for c in &seen.claimed[..8] {
        node.mirror_and_ack(c).await;
        seen.acked.push(c.clone());
    }
    for c in &seen.claimed[..4] {
        node.report(c, &format!("r-{}", c.delivery_id), "succeeded", 0).await.ok(201);
        seen.reported.push(c.clone());
    }
    hub.kill9();
    hub.kit_mut().clear_env();

    lose_power(hub.data_dir());
    hub.serve(None);
    let client = hub.client("prod");
    let mut lost_accepts = 0;
    let mut lost_other = 0;
    for id in &seen.accepted {
        let r = client.message(id).await;
        if r.status == 404 {
            lost_accepts += 1;
        } else {
            assert_eq!(r.ok(200)["deliveries"].as_array().expect("deliveries").len(), 1, "fan-out survived too");
        }
    }
    if lost_accepts == 0 {
        for c in &seen.claimed {
            let state = hub.state(&c.delivery_id);
            let expected =
                if seen.acked.iter().any(|a| a.delivery_id == c.delivery_id) { "delivered" } else { "claimed" };
            if state != expected {
                lost_other += 1;
            }
        }
        for c in &seen.reported {
            let msg = client.message(&c.message_id).await;
            let attempts = msg.ok(200)["deliveries"][0]["attempts"].as_array().expect("attempts").len();
            if attempts != 1 {
                lost_other += 1;
            }
        }
    }
    hub.verify_ok();
    (lost_accepts, lost_other)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_keeps_every_answer_with_synchronous_full() {
    if crate::harness::skipped_on_postgres("power_loss_keeps_every_answer_with_synchronous_full") {
        return;
    }
    let (lost_accepts, lost_other) = run("full").await;
    assert_eq!(lost_accepts, 0, "acknowledged accepts lost to power failure");
    assert_eq!(lost_other, 0, "acknowledged claims, acks or reports lost to power failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_test_bites_when_synchronous_is_normal() {
    if crate::harness::skipped_on_postgres("power_loss_test_bites_when_synchronous_is_normal") {
        return;
    }
    let (lost_accepts, _) = run("normal").await;
    assert!(lost_accepts > 0, "with synchronous=normal unsynced commits must be lost; the simulation is not biting");
}

/// The node's start marker is durable before the harness runs: after a power cut during a turn
/// the restarted node finds it, stops what is left of the turn and reports the attempt
/// `unknown`. With the node store at `synchronous = "normal"` the marker is lost: the node then
/// does not know it ran the turn, and only the hub's record of the start (or of the delivery,
/// when the mirror is lost too) keeps it from running it again — the attempt's reason says
/// which record caught it, so the test bites. Returns (runs, the attempt's reason).
async fn node_power_cut_during_a_turn(synchronous: &str) -> (usize, String) {
    let t = Hub::with_nodes(&["host-a"]);
    let shim = build_shim(&t.scratch("shim"));
    let mut node = t.node_process("host-a").set("synchronous", &format!("\"{synchronous}\""));
    if let Some(every) = unsynced_checkpoints(synchronous) {
        node = node.set("checkpoint_interval", every);
    }
    let mut node = node.env("LD_PRELOAD", &shim.display().to_string()).start();
    let data = node.data_dir().to_path_buf();
    // A first clean run creates the store; a clean stop leaves it fully on disk.
    let warm = t.send_one("c", "k0", "host-a");
    t.wait_outcome(&warm);
    assert!(node.term().success());
    snapshot_files(&data, &NODE_DB_FILES);
    node.restart_with("node.exec.during_effect");
    let d = t.send_one("c", "k1", "host-a");
    node.wait_crash("node.exec.during_effect");
    t.exec_log().wait_ran(&d);
    lose_power_of(&data, &NODE_DB_FILES, "node.db-shm");
    node.clear_env();
    node.restart();
    t.wait_outcome(&d);
    // Once the node holds nothing (nothing queued, running or unreported), a wrongly re-run
    // turn has already shown up in the execution log: it is logged before anything else.
    node.wait_idle();
    let runs = t.exec_log().runs_of(&d);
    let attempt = t.assert_one_attempt(&d, "unknown");
    (runs, attempt["reason"].as_str().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_power_loss_never_runs_a_started_turn_again_with_synchronous_full() {
    let (runs, reason) = node_power_cut_during_a_turn("full").await;
    assert_eq!(runs, 1, "the turn ran again after a power cut");
    assert!(reason.starts_with("node restarted during execution"), "the node's own marker caught it: {reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_power_loss_test_bites_when_synchronous_is_normal() {
    let (runs, reason) = node_power_cut_during_a_turn("normal").await;
    assert!(
        !reason.starts_with("node restarted during execution"),
        "with synchronous=normal the start marker must be lost; the simulation is not biting: {reason}"
    );
    assert_eq!(runs, 1, "the hub's record kept the node from running the turn again: {reason}");
}
