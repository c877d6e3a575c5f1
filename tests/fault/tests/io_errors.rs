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
//! Needs `cc`; otherwise skipped with the reason, unless `BATON_REQUIRE_FAULTS` is set.

mod support;

use baton_fault::cluster::Cluster;
use baton_testkit::{Binaries, Started};
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::{Msg, Submitter};

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
