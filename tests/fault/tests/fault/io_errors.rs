//! R2, I/O errors (EIO, not only a full disk) under the real hub: `tests/fault/eio_shim.c`,
//! compiled here with `cc` and preloaded into `baton-hub serve`, fails `write`, `pwrite`,
//! `fsync` and `fdatasync` on the hub database's files from the k-th call on, while the test's
//! control file exists (see the shim's header).
//!
//! One hub and two real nodes run a workload; each round arms a fault (k = 1.., once-only and
//! persistent in turn) and submits a message, so the accept, claim, mirrored, ack and report
//! transactions in flight meet it. Every refusal must be `503 storage_unavailable` without a
//! leak; the hub either stays up or stops and is restarted (fails closed); after the heal the
//! message is resubmitted until accepted. At the end the run drains and the checker must find no
//! violation (no client holds a success the record lacks, nothing twice, nothing lost), and
//! `PRAGMA integrity_check` is ok.
//!
//! The CI run is short (under 30 s): the accept rounds step k by about half each time until the
//! accept outlives its fault, the node rounds run k = 1..=`K_SHORT`. `BATON_FAULT_IO_LONG=1`
//! tries every k: the accept's up to its completion, the nodes' up to `K_LONG`.
//!
//! The node's own store: the same shim preloaded into one `baton-node run`, matching its
//! `node.db` (and `-wal`, `-shm`, `-journal`). Each round arms a fault (k = 1..=`K_NODE_SHORT`,
//! every k up to `K_NODE_LONG` in the long run; once-only and persistent in turn) on the running,
//! registered node and submits a message to it. Whatever the node does, the hub must have no
//! delivery of it past `claimed` that the node's store lacks (it never says `mirrored` or acks
//! what it did not commit); a node that stops must have exited non-zero with a line naming its
//! store, and is restarted after the heal. At the end the checker (no loss of an accepted
//! message, nothing delivered or run twice) and `integrity_check` of both stores must pass.
//! Needs `cc`; otherwise skipped with the reason, unless `BATON_REQUIRE_FAULTS` is set.

use crate::support;
use crate::support::{Msg, Submitter};
use baton_fault::cluster::Cluster;
use baton_testkit::{Binaries, Started};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Highest k of the accept rounds (they stop earlier, once the accept outlives its fault).
const K_ACCEPT_MAX: u64 = 400;
/// How many k in a row an accept must outlive before the accept rounds stop.
const COMPLETED_IN_A_ROW: u32 = 3;
/// Highest k of the node rounds in the CI run.
const K_SHORT: u64 = 8;
/// Highest k of the node rounds in the long run (`BATON_FAULT_IO_LONG=1`).
const K_LONG: u64 = 60;
/// Set to `1` for the long run.
const LONG_VAR: &str = "BATON_FAULT_IO_LONG";
/// How long a persistent fault lasts before the heal, so the nodes' transactions meet it too.
const PERSISTENT_FOR: Duration = Duration::from_millis(400);

fn compile_shim(dir: &Path) -> Result<PathBuf, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("eio_shim.c");
    let out = dir.join("eio_shim.so");
    support::sh("cc", &["-shared", "-fPIC", "-O1", "-o", &out.to_string_lossy(), &src.to_string_lossy(), "-ldl"])
        .map_err(|e| format!("cannot compile the EIO shim: {e}"))?;
    Ok(out)
}

/// Arms the `generation`-th fault: the k-th counted write fails (and every later one when
/// `persistent`).
fn arm(control: &Path, generation: u64, k: u64, persistent: bool) {
    std::fs::write(control, format!("{generation} {k} {}\n", u8::from(persistent))).unwrap();
}

/// What the rounds saw.
#[derive(Debug, Default)]
struct Tally {
    refused: usize,
    accepted_under_fault: usize,
    restarts: usize,
}

/// Removes the fault; a hub that stopped (failed closed) must have said why and start cleanly.
fn heal(c: &mut Cluster, control: &Path, tally: &mut Tally) {
    std::fs::remove_file(control).unwrap();
    if !c.hub.proc_mut().running() {
        let log = c.hub.proc().stderr();
        assert!(log.contains("ERROR"), "the hub stopped without an error line:\n{log}");
        tally.restarts += 1;
        let started = c.start_hub(None).unwrap();
        assert!(matches!(started, Started::Ready(_)), "the hub did not restart:\n{}", c.logs());
    }
}

/// The message of round `generation`: to one node or both.
fn msg(generation: u64) -> Msg {
    let to: &[&str] = if generation.is_multiple_of(2) { &["host-a", "host-b"] } else { &["host-b"] };
    Msg::new("io", generation as usize, to, 256)
}

#[test]
fn hub_io_errors_at_every_step_are_503_and_lose_nothing() {
    let probe_dir = tempfile::tempdir().unwrap();
    if !support::available("io_errors", compile_shim(probe_dir.path()).map(drop)) {
        return;
    }
    let long = std::env::var(LONG_VAR).is_ok_and(|v| v == "1");
    // The CI run steps k by about half each time; the long run tries every k.
    let accept_ks: Vec<u64> = if long {
        (1..=K_ACCEPT_MAX).collect()
    } else {
        std::iter::successors(Some(1u64), |k| Some(k + k.div_ceil(2))).take_while(|k| *k <= K_ACCEPT_MAX).collect()
    };
    let k_max_nodes = if long { K_LONG } else { K_SHORT };
    let bins = Binaries::build().unwrap();
    support::runtime().block_on(async {
        let mut c = Cluster::new(&bins, &["host-a", "host-b"]).await.unwrap();
        let shim = compile_shim(c.root()).unwrap();
        let control = c.root().join("eio.control");
        c.hub.set_env("LD_PRELOAD", &shim.to_string_lossy());
        c.hub.set_env("BATON_EIO_MATCH", &c.hub.db().to_string_lossy());
        c.hub.set_env("BATON_EIO_CONTROL", &control.to_string_lossy());
        let Started::Ready(_) = c.start_hub(None).unwrap() else { panic!("the hub did not start:\n{}", c.logs()) };
        for n in &mut c.nodes {
            n.start(None).unwrap();
        }
        let s = Submitter::new(&c);
        let leaks = [c.root().to_path_buf()];
        let leaks: Vec<&Path> = leaks.iter().map(PathBuf::as_path).collect();
        let mut tally = Tally::default();
        let mut generation = 0u64;
        // The accept transaction: k grows until a once-only fault at the k-th write lets it
        // commit (the transaction completed before its k-th write) `COMPLETED_IN_A_ROW` times
        // in a row (other transactions share the count, so one success can be luck).
        let mut in_a_row = 0;
        for k in accept_ks {
            let mut completed = false;
            for persistent in [false, true] {
                generation += 1;
                arm(&control, generation, k, persistent);
                let m = msg(generation);
                if let Some(hub) = c.hub.addr() {
                    let a = s.submit(hub, &m).await;
                    if a.ok() {
                        tally.accepted_under_fault += 1;
                        completed |= !persistent;
                    } else if a.status.is_some() {
                        support::assert_storage_refusal(&a, &leaks);
                        tally.refused += 1;
                    }
                }
                if persistent {
                    tokio::time::sleep(PERSISTENT_FOR).await;
                }
                heal(&mut c, &control, &mut tally);
                s.until_accepted(c.hub.addr().unwrap(), &m, Duration::from_secs(30)).await;
            }
            in_a_row = if completed { in_a_row + 1 } else { 0 };
            if in_a_row == COMPLETED_IN_A_ROW {
                eprintln!("an accept completed before its write {k} and the {} before", COMPLETED_IN_A_ROW - 1);
                break;
            }
        }
        // The nodes' transactions (claim, mirrored, ack, report) of a message accepted just
        // before the fault is armed: they meet the k-th write from then on.
        for k in 1..=k_max_nodes {
            for persistent in [false, true] {
                generation += 1;
                let m = msg(generation);
                s.until_accepted(c.hub.addr().unwrap(), &m, Duration::from_secs(30)).await;
                arm(&control, generation, k, persistent);
                tokio::time::sleep(PERSISTENT_FOR).await;
                heal(&mut c, &control, &mut tally);
            }
        }
        let failed_txns = c.hub.proc().stderr_all().matches("write transaction failed; rolled back").count();
        let node_503s: usize =
            c.nodes.iter().map(|n| n.proc().stderr_all().matches("storage_unavailable").count()).sum();
        eprintln!(
            "{generation} rounds: {} accepts refused 503, {} accepted under a fault, {failed_txns} hub write \
             transactions rolled back, {node_503s} node log lines about 503 storage_unavailable, {} hub restarts",
            tally.refused, tally.accepted_under_fault, tally.restarts
        );
        assert!(tally.refused > 0, "no accept met a fault: the shim did not bite");
        assert!(node_503s > 0, "no node request met a fault: the node rounds did not bite");
        let report = support::drain_and_check(&mut c, Duration::from_secs(90)).await;
        eprintln!("{}", report.render());
    });
}

/// Highest k of the node-store rounds in the CI run.
const K_NODE_SHORT: u64 = 6;
/// Highest k of the node-store rounds in the long run (`BATON_FAULT_IO_LONG=1`).
const K_NODE_LONG: u64 = 40;
/// How long a node-store round waits for its message to be done or the node to stop.
const NODE_ROUND: Duration = Duration::from_secs(3);
/// How long a drain after the node rounds may take.
const NODE_DRAIN: Duration = Duration::from_secs(90);

/// What the node-store rounds saw.
#[derive(Debug, Default)]
struct NodeTally {
    /// Rounds whose message was done before the heal (the fault was absorbed or missed).
    done_under_fault: usize,
    /// Rounds in which the node stopped (failed closed) and was restarted after the heal.
    stopped: usize,
    /// Rounds in which the node still ran at the heal with its message not done (retrying).
    running_at_heal: usize,
    /// How many stopped runs exited with each status (`None`: killed by a signal).
    exits: std::collections::BTreeMap<Option<i32>, usize>,
}

/// Whether the hub has the report of the delivery of the message `key` to `host` (it is done).
fn hub_done(c: &Cluster, key: &str, host: &str) -> bool {
    let Ok(hub) = baton_fault::checker::open_read_only(&c.hub.db()) else { return false };
    hub.query_row(
        "SELECT count(*) FROM deliveries d JOIN messages m ON m.id = d.message_id
         WHERE m.idempotency_key = ?1 AND d.host = ?2 AND d.state = 'delivered'
           AND EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)",
        [key, host],
        |r| r.get::<_, i64>(0),
    )
    .is_ok_and(|n| n == 1)
}

/// Every delivery to `host` that the hub has past `claimed` (the node said `mirrored`, or more)
/// has its row in the node's store: the node told the hub nothing it had not committed.
fn assert_nothing_acked_without_a_mirror(c: &Cluster, host: &str, node_db: &Path) {
    let hub = baton_fault::checker::open_read_only(&c.hub.db()).unwrap();
    let mut st = hub
        .prepare("SELECT id FROM deliveries WHERE host = ?1 AND state NOT IN ('queued', 'claimed', 'held')")
        .unwrap();
    let past: Vec<String> = st.query_map([host], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap();
    let node = baton_fault::checker::open_read_only(node_db).unwrap();
    for id in past {
        let n: i64 =
            node.query_row("SELECT count(*) FROM deliveries WHERE delivery_id = ?1", [&id], |r| r.get(0)).unwrap();
        assert_eq!(n, 1, "the hub has {id} past claimed, the node has no copy of it");
    }
}

#[test]
fn node_store_io_errors_never_ack_unmirrored_and_lose_nothing() {
    let probe_dir = tempfile::tempdir().unwrap();
    if !support::available("io_errors (node)", compile_shim(probe_dir.path()).map(drop)) {
        return;
    }
    let long = std::env::var(LONG_VAR).is_ok_and(|v| v == "1");
    let k_max = if long { K_NODE_LONG } else { K_NODE_SHORT };
    let bins = Binaries::build().unwrap();
    support::runtime().block_on(async {
        let mut c = Cluster::new(&bins, &["host-a"]).await.unwrap();
        let shim = compile_shim(c.root()).unwrap();
        let control = c.root().join("eio.control");
        let node_db = c.nodes[0].db();
        c.nodes[0].set_env("LD_PRELOAD", &shim.to_string_lossy());
        c.nodes[0].set_env("BATON_EIO_MATCH", &node_db.to_string_lossy());
        c.nodes[0].set_env("BATON_EIO_CONTROL", &control.to_string_lossy());
        let Started::Ready(hub) = c.start_hub(None).unwrap() else { panic!("the hub did not start:\n{}", c.logs()) };
        c.nodes[0].start(None).unwrap();
        let s = Submitter::new(&c);
        for i in 0..3 {
            s.until_accepted(hub, &Msg::new("warm", i, &["host-a"], 64), Duration::from_secs(30)).await;
        }
        assert!(c.quiesce(NODE_DRAIN).await, "the first messages did not drain:\n{}", c.pending());

        let mut tally = NodeTally::default();
        let mut generation = 0u64;
        for k in 1..=k_max {
            for persistent in [false, true] {
                generation += 1;
                arm(&control, generation, k, persistent);
                let m = Msg::new("node-io", generation as usize, &["host-a"], 256);
                s.until_accepted(hub, &m, Duration::from_secs(30)).await;
                // The node mirrors, acks, runs and reports the message, or meets the fault.
                let deadline = std::time::Instant::now() + NODE_ROUND;
                let mut done = false;
                while std::time::Instant::now() < deadline && c.nodes[0].proc_mut().running() {
                    if hub_done(&c, &m.key, "host-a") {
                        done = true;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                assert_nothing_acked_without_a_mirror(&c, "host-a", &node_db);
                std::fs::remove_file(&control).unwrap();
                if c.nodes[0].proc_mut().running() {
                    if done {
                        tally.done_under_fault += 1;
                    } else {
                        tally.running_at_heal += 1;
                    }
                } else {
                    // Failed closed: a clear line naming the store and a non-zero status.
                    let status = c.nodes[0].proc_mut().wait_exit(Duration::from_secs(1)).unwrap();
                    let code = status.and_then(|s| s.code());
                    let log = c.nodes[0].proc().stderr();
                    assert!(
                        log.contains("node store") && code.is_some_and(|c| c != 0),
                        "the node stopped ({status:?}) without a store error line and a non-zero status:\n{log}"
                    );
                    eprintln!(
                        "k={k} persistent={persistent}: the node stopped ({status:?}): {}",
                        support::last_lines(&log, 1)
                    );
                    tally.stopped += 1;
                    *tally.exits.entry(code).or_default() += 1;
                    c.nodes[0].start(None).unwrap();
                    // The next fault is armed once the store is open and the session registered:
                    // the rounds are about the hand-off, not the open.
                    baton_testkit::wait::until("the restarted node registers", NODE_DRAIN, || {
                        Ok(c.nodes[0].proc().stderr().contains("registered session").then_some(()))
                    })
                    .unwrap();
                }
            }
        }
        eprintln!(
            "{generation} node-store rounds: {} done under the fault, {} node stops (exit status: count {:?}), {} still \
             running (retrying) at the heal",
            tally.done_under_fault, tally.stopped, tally.exits, tally.running_at_heal
        );
        let said = c.nodes[0].proc().stderr_all();
        assert!(tally.stopped > 0 || said.contains("disk I/O error"), "no round met a fault: the shim did not bite");
        let report = support::drain_and_check(&mut c, NODE_DRAIN).await;
        assert_eq!(report.counts.get("messages").copied(), Some(3 + generation));
        eprintln!("{}", report.render());
        let hub = baton_fault::checker::open_read_only(&c.hub.db()).unwrap();
        let mut st = hub
            .prepare("SELECT outcome || ' ' || substr(coalesce(reason, ''), 1, 40), count(*) FROM attempts GROUP BY 1 ORDER BY 1")
            .unwrap();
        let outcomes: Vec<(String, i64)> =
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().collect::<Result<_, _>>().unwrap();
        eprintln!("outcomes: {outcomes:?}");
    });
}
