//! R3, disk full, with the real binaries: the hub's (and, separately, a node's) data directory is
//! a small `tmpfs` that a ballast file fills for real (ENOSPC from the kernel, not a simulation).
//!
//! Hub: while full, every accept is either accepted (durable: it stays) or refused `503
//! storage_unavailable` with a body that names no SQL, no SQLite error and no path. The hub's
//! write-ahead log is checkpointed and reused in place, so the hub still commits into the room
//! its log already has; once that is used up by pages the full disk cannot take into the
//! database file (no checkpoint can free the log again until space returns), a node's writes
//! are refused the same way (a running node's claims and hand-off steps, a starting node's
//! session) and it keeps retrying; the same process stays up, and once the ballast is gone it
//! accepts again; every accepted message is delivered exactly once (checker, with liveness),
//! and `integrity_check` is ok.
//!
//! Node: while full it cannot mirror, so no claim of its is acked; the node stops with a log
//! line naming the store (it fails closed), a restart while still full does not run anything,
//! and after the space returns a restart resumes: every turn runs once (checker).
//!
//! Needs root (to mount the `tmpfs`); otherwise skipped with the reason, unless
//! `BATON_REQUIRE_FAULTS` is set.

use crate::support;
use crate::support::{Msg, Submitter, Tmpfs};
use baton_fault::cluster::Cluster;
use baton_testkit::{Binaries, Signal, Started};
use std::time::{Duration, Instant};

/// The size of the small filesystem: room for the store, not for a ballast too.
const FS_SIZE: &str = "16m";
/// Filler per message while the disk is full, so the write-ahead log must grow.
const FULL_PAD: usize = 16 * 1024;
/// Messages submitted while the disk is full.
const FULL_MESSAGES: usize = 40;
/// Most small messages sent after the padded ones, to use up the log's last room.
const SMALL_MESSAGES_MAX: usize = 200;
/// How long a drain after the heal may take.
const DRAIN: Duration = Duration::from_secs(90);

#[test]
fn a_full_disk_on_the_hub_is_refused_503_and_the_same_hub_serves_when_space_returns() {
    if !support::available("disk_full (hub)", Tmpfs::probe()) {
        return;
    }
    let bins = Binaries::build().unwrap();
    support::runtime().block_on(async {
        let mut c = Cluster::new(&bins, &["host-a", "host-b"]).await.unwrap();
        let fs = Tmpfs::mount_over(c.hub.data_dir(), FS_SIZE).unwrap();
        let Started::Ready(hub) = c.start_hub(None).unwrap() else { panic!("the hub did not start:\n{}", c.logs()) };
        let pid = c.hub.proc().pid();
        let s = Submitter::new(&c);
        // host-a registers, then is stopped (SIGSTOP) while messages for it are accepted: when it
        // resumes, the disk is full and the log's room used up, and what it writes at the hub
        // (claims, `mirrored`, acks) is refused. host-b starts only then: its session, the write
        // before any claim, is refused.
        c.nodes[0].start(None).unwrap();
        baton_testkit::wait::until("host-a registers", DRAIN, || {
            Ok(c.nodes[0].proc().stderr().contains("registered session").then_some(()))
        })
        .unwrap();
        c.nodes[0].proc().signal(Signal::SIGSTOP).unwrap();
        let before: Vec<Msg> = (0..6).map(|i| Msg::new("before", i, &["host-a", "host-b"], 16)).collect();
        for m in &before {
            s.until_accepted(hub, m, Duration::from_secs(30)).await;
        }

        let ballast = fs.fill();
        eprintln!("ballast: {ballast} bytes");
        // The padded messages use up the log's room with new pages (which no checkpoint can copy
        // into the full file), the small ones what room is left: from then on a write is refused.
        let full: Vec<Msg> = (0..FULL_MESSAGES).map(|i| Msg::new("full", i, &["host-a"], FULL_PAD)).collect();
        let (mut accepted, mut refused) = (0, 0);
        for m in &full {
            let a = s.submit(hub, m).await;
            if a.ok() {
                accepted += 1;
            } else {
                support::assert_storage_refusal(&a, &[c.root(), c.hub.data_dir()]);
                refused += 1;
            }
        }
        let mut small = Vec::new();
        loop {
            assert!(small.len() < SMALL_MESSAGES_MAX, "{SMALL_MESSAGES_MAX} small messages accepted on a full disk");
            let m = Msg::new("small", small.len(), &["host-a"], 16);
            let a = s.submit(hub, &m).await;
            small.push(m);
            if !a.ok() {
                support::assert_storage_refusal(&a, &[c.root(), c.hub.data_dir()]);
                break;
            }
        }
        eprintln!("while full: {accepted} padded accepted, {refused} refused 503; {} small sent", small.len());
        assert!(refused > 0, "the full disk refused nothing ({accepted} accepted): the fault did not bite");
        c.nodes[0].proc().signal(Signal::SIGCONT).unwrap();
        c.nodes[1].start(None).unwrap();
        for i in 0..c.nodes.len() {
            baton_testkit::wait::until("the node is refused 503 storage_unavailable", DRAIN, || {
                Ok(c.nodes[i].proc().stderr().contains("storage_unavailable").then_some(()))
            })
            .unwrap();
            let said = c.nodes[i].proc().stderr();
            let line = said.lines().find(|l| l.contains("storage_unavailable")).unwrap();
            eprintln!("{} on the hub's full disk: {line}", c.nodes[i].proc().stem());
        }
        assert!(c.hub.proc_mut().running(), "the hub stopped on a full disk:\n{}", c.hub.proc().stderr());
        let log = c.hub.proc().stderr();
        assert!(log.contains("storage error") || log.contains("write transaction failed"), "no log line:\n{log}");
        for n in &mut c.nodes {
            assert!(n.proc_mut().running(), "a node stopped on the hub's full disk:\n{}", n.proc().stderr());
        }

        fs.drain();
        for m in full.iter().chain(&small).chain(&[Msg::new("after", 0, &["host-a", "host-b"], 16)]) {
            s.until_accepted(hub, m, Duration::from_secs(30)).await;
        }
        assert_eq!(c.hub.proc().pid(), pid, "the hub was restarted");
        assert!(c.hub.proc_mut().running());
        let report = support::drain_and_check(&mut c, DRAIN).await;
        assert_eq!(report.counts.get("messages").copied(), Some((before.len() + full.len() + small.len() + 1) as u64));
        drop(fs);
    });
}

#[test]
fn a_node_on_a_full_disk_acks_nothing_fails_closed_and_resumes_when_space_returns() {
    if !support::available("disk_full (node)", Tmpfs::probe()) {
        return;
    }
    let bins = Binaries::build().unwrap();
    support::runtime().block_on(async {
        let mut c = Cluster::new(&bins, &["host-a"]).await.unwrap();
        let fs = Tmpfs::mount_over(c.nodes[0].data_dir(), FS_SIZE).unwrap();
        let Started::Ready(hub) = c.start_hub(None).unwrap() else { panic!("the hub did not start:\n{}", c.logs()) };
        c.nodes[0].start(None).unwrap();
        let s = Submitter::new(&c);
        for i in 0..4 {
            s.until_accepted(hub, &Msg::new("before", i, &["host-a"], 16), Duration::from_secs(30)).await;
        }
        assert!(c.quiesce(DRAIN).await, "the first messages did not drain:\n{}", c.pending());

        fs.fill();
        for i in 0..20 {
            s.until_accepted(hub, &Msg::new("full", i, &["host-a"], FULL_PAD), Duration::from_secs(30)).await;
        }
        // The node meets the full disk when it mirrors a claim: it must stop, saying why.
        let deadline = Instant::now() + DRAIN;
        while c.nodes[0].proc_mut().running() {
            assert!(Instant::now() < deadline, "the node kept running on a full disk:\n{}", c.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let log = c.nodes[0].proc().stderr();
        assert!(log.contains("database or disk is full") || log.contains("node store"), "no store error in:\n{log}");
        eprintln!("the node stopped on the full disk; its last lines:\n{}", support::last_lines(&log, 3));
        assert_nothing_acked_without_a_mirror(&c);

        // A supervisor restarts it while the disk is still full: it must not run anything new.
        c.nodes[0].start(None).unwrap();
        let again = c.nodes[0].proc_mut().wait_exit(Duration::from_secs(10)).unwrap();
        eprintln!("restarted while full: {again:?}; {}", support::last_lines(&c.nodes[0].proc().stderr(), 2));
        c.nodes[0].proc_mut().kill().unwrap();
        assert_nothing_acked_without_a_mirror(&c);

        fs.drain();
        c.nodes[0].start(None).unwrap();
        support::drain_and_check(&mut c, DRAIN).await;
        drop(fs);
    });
}

/// Every delivery the hub has past `claimed` for the `full-` messages (mirrored, delivered or
/// done) has its row in the node's store: the node told the hub nothing it had not written.
fn assert_nothing_acked_without_a_mirror(c: &Cluster) {
    let hub = baton_fault::checker::open_read_only(&c.hub.db()).unwrap();
    let mut st = hub
        .prepare(
            "SELECT d.id FROM deliveries d JOIN messages m ON m.id = d.message_id
             WHERE m.idempotency_key LIKE 'full-%' AND d.state NOT IN ('queued', 'claimed')",
        )
        .unwrap();
    let past: Vec<String> = st.query_map([], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap();
    let node = baton_fault::checker::open_read_only(&c.nodes[0].db()).unwrap();
    for id in past {
        let n: i64 =
            node.query_row("SELECT count(*) FROM deliveries WHERE delivery_id = ?1", [&id], |r| r.get(0)).unwrap();
        assert_eq!(n, 1, "the hub has {id} past claimed, the node has no copy of it");
    }
}
