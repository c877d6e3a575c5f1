//! R10, clock steps under the real binaries: libfaketime (Debian package `faketime`) preloaded
//! into `baton-hub serve` and into a `baton-node` (only that program: its harness keeps the real
//! clock, so the ledger's wall-clock readings stay comparable), with the offset read from a file
//! the test rewrites while they run (`FAKETIME_TIMESTAMP_FILE`, `FAKETIME_NO_CACHE=1`); the
//! monotonic clock is left alone (`FAKETIME_DONT_FAKE_MONOTONIC=1`), as a stepped wall clock
//! leaves it.
//!
//! A producer submits all along while two real nodes deliver. The hub steps +1 h and back
//! (−1 h), then node `host-a` does the same, then each in turn runs an hour behind the true time
//! (behind the certificates' start of validity: a new client is refused by the hub, the
//! producer and the nodes resume their TLS sessions and go on). Across all of it: no duplicate, no loss, every
//! accepted message delivered once (checker, with liveness). A fence `pause --for 30m` is lifted
//! by the hub when its clock passes the fence's end (the +1 h step) and stays lifted when the
//! clock steps back; a fence `--for 2h` is not lifted by the same step.
//!
//! Retention (`limits.retention = 1h`) after the hub's clock steps +2 h: the sweep removes the
//! settled messages (their keys with them) and keeps every message still waiting for a node,
//! whose key stays live (a retry is the same message) and which is then delivered once. The hub
//! runs 60 times as fast there (its monotonic clock too), so its ten-minute sweep comes round
//! in seconds.
//!
//! Needs `/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1`; otherwise skipped with the reason,
//! unless `BATON_REQUIRE_FAULTS` is set.

use crate::support;
use crate::support::{Msg, Submitter};
use baton_fault::cluster::Cluster;
use baton_testkit::{Binaries, Started};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Where Debian's `faketime` package installs the library.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// How long the workload runs at each clock setting.
const PHASE: Duration = Duration::from_secs(4);
/// How much faster the hub's clocks run in the retention test.
const SPEED: u32 = 60;
/// How long a drain may take at the end.
const DRAIN: Duration = Duration::from_secs(120);

fn probe() -> Result<(), String> {
    if Path::new(LIBFAKETIME).is_file() {
        Ok(())
    } else {
        Err(format!("{LIBFAKETIME} is missing (apt-get install faketime)"))
    }
}

/// The faked clock of one process: its offset file.
struct FakeClock {
    file: PathBuf,
}

impl FakeClock {
    /// Preloads libfaketime into `env` (a hub's or node's `set_env`) for `program` only, reading
    /// its offset from a file under `dir`, starting at `initial`. The monotonic clock is faked
    /// too only when `monotonic` (with a speed-up in the offset, its timers run faster).
    fn new(
        dir: &Path,
        name: &str,
        program: &str,
        initial: &str,
        monotonic: bool,
        mut env: impl FnMut(&str, &str),
    ) -> FakeClock {
        let file = dir.join(format!("{name}.faketime"));
        let clock = FakeClock { file };
        clock.set(initial);
        env("LD_PRELOAD", LIBFAKETIME);
        env("FAKETIME_TIMESTAMP_FILE", &clock.file.to_string_lossy());
        env("FAKETIME_NO_CACHE", "1");
        if !monotonic {
            env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        env("FAKETIME_ONLY_CMDS", program);
        clock
    }

    /// Steps the clock to `offset` from the true time (`+1h`, `-1h`, `+0`).
    fn set(&self, offset: &str) {
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, format!("{offset}\n")).unwrap();
        std::fs::rename(&tmp, &self.file).unwrap();
        eprintln!("clock {}: {offset}", self.file.file_stem().unwrap_or_default().to_string_lossy());
    }
}

/// Runs the workload for `PHASE` and prints what it did: messages accepted, deliveries the hub
/// recorded as reported by host-a, and how far the hub's newest stored time is from the true
/// time.
async fn phase(c: &Cluster, sent: &AtomicUsize) {
    let count = |sql: &str| -> i64 {
        let db = baton_fault::checker::open_read_only(&c.hub.db()).unwrap();
        db.query_row(sql, [], |r| r.get(0)).unwrap()
    };
    let reported_a =
        "SELECT count(*) FROM attempts a JOIN deliveries d ON d.id = a.delivery_id WHERE d.host = 'host-a'";
    let (sent0, reported0) = (sent.load(Ordering::Relaxed), count(reported_a));
    tokio::time::sleep(PHASE).await;
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let hub_newest = count("SELECT accepted_at FROM messages ORDER BY rowid DESC LIMIT 1");
    let node = baton_fault::checker::open_read_only(&c.nodes[0].db()).unwrap();
    let node_newest: i64 =
        node.query_row("SELECT mirrored_at_ms FROM deliveries ORDER BY rowid DESC LIMIT 1", [], |r| r.get(0)).unwrap();
    eprintln!(
        "  {} accepted, {} host-a outcomes recorded; newest stored times from the true time: accept {:+} s (hub), \
         mirror {:+} s (host-a)",
        sent.load(Ordering::Relaxed) - sent0,
        count(reported_a) - reported0,
        (hub_newest - now_ms) / 1000,
        (node_newest - now_ms) / 1000
    );
}

/// Messages whose idempotency key starts with `prefix`.
fn messages_like(c: &Cluster, prefix: &str) -> i64 {
    let db = baton_fault::checker::open_read_only(&c.hub.db()).unwrap();
    db.query_row("SELECT count(*) FROM messages WHERE idempotency_key LIKE ?1 || '%'", [prefix], |r| r.get(0)).unwrap()
}

#[test]
fn after_a_forward_step_retention_removes_settled_messages_and_keeps_every_live_one() {
    if !support::available("clock_steps (retention)", probe()) {
        return;
    }
    let bins = Binaries::build().unwrap();
    support::runtime().block_on(async {
        let mut c = Cluster::new(&bins, &["host-a", "host-b"]).await.unwrap();
        let root = c.root().to_path_buf();
        c.hub.set_env("BATON_HUB_RETENTION", "1h");
        // Its longest handshake allowance: at this speed it is a second of true time.
        c.hub.set_env("BATON_HUB_HANDSHAKE_TIMEOUT", "60s");
        // The hub's clocks run `SPEED` times as fast (the monotonic one too), so its retention
        // sweep, every 10 minutes, comes round in seconds.
        let hub_clock =
            FakeClock::new(&root, "hub", "baton-hub", &format!("+0 x{SPEED}"), true, |k, v| c.hub.set_env(k, v));
        let Started::Ready(hub) = c.start_hub(None).unwrap() else { panic!("the hub did not start:\n{}", c.logs()) };
        c.nodes[0].start(None).unwrap();
        let s = Submitter::new(&c);
        let settled: Vec<Msg> = (0..3).map(|i| Msg::new("settled", i, &["host-a"], 8)).collect();
        let live: Vec<Msg> = (0..2).map(|i| Msg::new("live", i, &["host-a", "host-b"], 8)).collect();
        for m in settled.iter().chain(&live) {
            s.until_accepted(hub, m, Duration::from_secs(30)).await;
        }
        baton_testkit::wait::until("host-a runs its turns", DRAIN, || {
            let done = settled
                .iter()
                .chain(&live)
                .all(|m| delivery_states(&c, &m.key).iter().filter(|s| *s == "delivered+outcome").count() == 1);
            Ok(done.then_some(()))
        })
        .unwrap();

        hub_clock.set(&format!("+2h x{SPEED}"));
        baton_testkit::wait::until("the sweep removes the settled messages", DRAIN, || {
            Ok((messages_like(&c, "settled-") == 0).then_some(()))
        })
        .unwrap();
        assert_eq!(messages_like(&c, "live-"), 2, "a message still waiting for host-b was removed");
        assert!(c.hub.proc().stderr().contains("retention: removed settled messages"), "{}", c.hub.proc().stderr());
        // Its key is live: a retry is the same message, not a new one.
        let again = s.submit(hub, &live[0]).await;
        assert_eq!(again.status, Some(200), "{again:?}");

        c.nodes[1].start(None).unwrap();
        baton_testkit::wait::until("host-b runs the live messages once each", DRAIN, || {
            Ok(live.iter().all(|m| delivery_states(&c, &m.key).iter().all(|s| s == "delivered+outcome")).then_some(()))
        })
        .unwrap();
        c.hub.kill().unwrap();
        for n in &mut c.nodes {
            n.proc_mut().kill().unwrap();
        }
        let effects = baton_fault::records::read_lines::<baton_fault::records::EffectLine>(&c.ledger).unwrap();
        assert_eq!(effects.items.len(), settled.len() + 2 * live.len(), "{:?}", effects.items);
    });
}

/// `GET /readyz` from a client that has never spoken to the hub (a full handshake, no session
/// to resume); the status.
async fn fresh_handshake(c: &Cluster, hub: std::net::SocketAddr) -> anyhow::Result<u16> {
    let client = c.hub.identity("prod")?.client_builder()?.timeout(Duration::from_secs(10)).build()?;
    Ok(client.get(format!("https://{hub}/readyz")).send().await?.status().as_u16())
}

/// One fence row: (lifted_at, lifted_by).
fn fence_state(c: &Cluster, id: i64) -> (Option<i64>, Option<String>) {
    let db = baton_fault::checker::open_read_only(&c.hub.db()).unwrap();
    db.query_row("SELECT lifted_at, lifted_by FROM fences WHERE id = ?1", [id], |r| Ok((r.get(0)?, r.get(1)?))).unwrap()
}

/// The states of the deliveries of the message with idempotency key `key`, `+outcome` appended
/// when its current run has one.
fn delivery_states(c: &Cluster, key: &str) -> Vec<String> {
    let db = baton_fault::checker::open_read_only(&c.hub.db()).unwrap();
    let mut st = db
        .prepare(
            "SELECT d.state || CASE WHEN EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id
                                                  AND a.attempt = d.attempt) THEN '+outcome' ELSE '' END
             FROM deliveries d JOIN messages m ON m.id = d.message_id WHERE m.idempotency_key = ?1",
        )
        .unwrap();
    st.query_map([key], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap()
}

fn pause_for(c: &Cluster, conversation: &str, d: &str) -> i64 {
    let out = c
        .hub
        .cli([
            "fence",
            "pause",
            "--conversation",
            conversation,
            "--for",
            d,
            "--reason",
            "clock test",
            "--force",
            "--json",
        ])
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["id"].as_i64().unwrap_or_else(|| panic!("no fence id in {v}"))
}

#[test]
fn clock_steps_on_hub_and_node_lose_nothing_and_run_nothing_twice() {
    if !support::available("clock_steps", probe()) {
        return;
    }
    let bins = Binaries::build().unwrap();
    support::runtime().block_on(async {
        let mut c = Cluster::new(&bins, &["host-a", "host-b"]).await.unwrap();
        let root = c.root().to_path_buf();
        let hub_clock = FakeClock::new(&root, "hub", "baton-hub", "+0", false, |k, v| c.hub.set_env(k, v));
        let node_clock = FakeClock::new(&root, "host-a", "baton-node", "+0", false, |k, v| c.nodes[0].set_env(k, v));
        let Started::Ready(hub) = c.start_hub(None).unwrap() else { panic!("the hub did not start:\n{}", c.logs()) };
        for n in &mut c.nodes {
            n.start(None).unwrap();
        }

        // The producer, all along: each message submitted until accepted (or the run stops).
        let s = Arc::new(Submitter::new(&c));
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let workload = tokio::spawn({
            let (s, stop, sent) = (s.clone(), stop.clone(), sent.clone());
            async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let to: &[&str] = match i % 3 {
                        0 => &["host-a"],
                        1 => &["host-b"],
                        _ => &["host-a", "host-b"],
                    };
                    let m = Msg::new("run", i, to, 32);
                    while !s.submit(hub, &m).await.ok() && !stop.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    sent.store(i + 1, Ordering::Relaxed);
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });

        phase(&c, &sent).await;
        // Two time-boxed fences, each holding back one message.
        let short = pause_for(&c, "fenced-30m", "30m");
        let long = pause_for(&c, "fenced-2h", "2h");
        let held_short = Msg { conversation: "fenced-30m".into(), ..Msg::new("fence", 0, &["host-b"], 8) };
        let held_long = Msg { conversation: "fenced-2h".into(), ..Msg::new("fence", 1, &["host-b"], 8) };
        s.until_accepted(hub, &held_short, Duration::from_secs(30)).await;
        s.until_accepted(hub, &held_long, Duration::from_secs(30)).await;
        phase(&c, &sent).await;
        assert!(delivery_states(&c, &held_short.key).iter().all(|s| s == "queued" || s == "held"));

        hub_clock.set("+1h");
        baton_testkit::wait::until("the hub lifts the 30m fence after its clock steps +1h", DRAIN, || {
            Ok(fence_state(&c, short).0.is_some().then_some(()))
        })
        .unwrap();
        assert_eq!(fence_state(&c, short).1.as_deref(), Some("hub"));
        baton_testkit::wait::until("the message behind the lifted fence is delivered", DRAIN, || {
            Ok(delivery_states(&c, &held_short.key).iter().all(|s| s == "delivered+outcome").then_some(()))
        })
        .unwrap();
        phase(&c, &sent).await;
        assert_eq!(fence_state(&c, long).0, None, "the 2h fence was lifted by a 1h step");

        hub_clock.set("+0");
        phase(&c, &sent).await;
        assert!(fence_state(&c, short).0.is_some(), "a lifted fence came back when the clock stepped back");
        assert_eq!(fence_state(&c, long).0, None);
        assert!(delivery_states(&c, &held_long.key).iter().all(|s| s == "queued" || s == "held"));

        node_clock.set("+1h");
        phase(&c, &sent).await;
        node_clock.set("+0");
        phase(&c, &sent).await;
        let before_behind = sent.load(Ordering::Relaxed);
        node_clock.set("-1h");
        phase(&c, &sent).await;
        node_clock.set("+0");
        phase(&c, &sent).await;
        hub_clock.set("-1h");
        phase(&c, &sent).await;
        // The certificates start to be valid 5 minutes before they were issued, an hour after
        // the hub's clock now: a client without a TLS session to resume is refused; the
        // producer and the nodes above resume theirs and go on.
        let fresh = fresh_handshake(&c, hub).await;
        assert!(fresh.is_err(), "a new client was served by a hub whose clock is behind its certificates");
        eprintln!("  a new client: {:#}", fresh.unwrap_err());
        hub_clock.set("+0");
        phase(&c, &sent).await;
        fresh_handshake(&c, hub).await.unwrap();

        stop.store(true, Ordering::Relaxed);
        workload.await.unwrap();
        let total = sent.load(Ordering::Relaxed);
        eprintln!("{total} messages submitted ({before_behind} before the node ran behind)");
        // Whatever was refused while a clock ran behind is resubmitted with its key.
        let start = Instant::now();
        for i in 0..total {
            let to: &[&str] = match i % 3 {
                0 => &["host-a"],
                1 => &["host-b"],
                _ => &["host-a", "host-b"],
            };
            s.until_accepted(hub, &Msg::new("run", i, to, 32), DRAIN.saturating_sub(start.elapsed())).await;
        }
        c.lift_all_fences().unwrap();
        let report = support::drain_and_check(&mut c, DRAIN).await;
        eprintln!("{}", report.render());
        for (who, log) in [("hub", c.hub.proc().stderr_all()), ("host-a", c.nodes[0].proc().stderr_all())] {
            eprintln!("=== {who}: warnings and errors, by kind\n{}", kinds(&log));
        }
    });
}

/// The log's WARN and ERROR lines counted by kind (the message's start, digits and hex masked).
fn kinds(log: &str) -> String {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for line in log.lines() {
        let Some(at) = line.find(" WARN ").or_else(|| line.find(" ERROR ")) else { continue };
        let kind: String = line[at..].chars().map(|ch| if ch.is_ascii_digit() { '#' } else { ch }).take(160).collect();
        *counts.entry(kind).or_default() += 1;
    }
    counts.iter().map(|(k, n)| format!("{n:>5} {k}\n")).collect()
}
