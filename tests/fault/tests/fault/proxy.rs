//! The fault proxy against a local echo server: pass, blackhole, reset, cut after N bytes,
//! delay, and moving the upstream. Then a node cut off from the hub through it while its data
//! directory is copied and the copy started elsewhere (`a_cut_off_node_and_its_copy_…`, with
//! the real binaries, on SQLite and on PostgreSQL): no turn runs twice, neither when the
//! original's lease runs out before it could start the next turn nor when it starts it within.

use baton_fault::checker::{self, HubRecord};
use baton_fault::cluster::{AcceptOutcome, Cluster};
use baton_fault::proxy::{Fault, Proxy};
use baton_fault::records::{EffectLine, HOLD, hold_release, read_lines};
use baton_testkit::{Binaries, Started};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Long enough for any answer that should come, however loaded the machine: only a broken
/// proxy makes a test wait this long.
const ANSWER_WAIT: Duration = Duration::from_secs(20);
/// How long a blackholed link is watched for an answer that must not come.
const SILENCE: Duration = Duration::from_millis(500);

async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// Sends `msg` and reads up to its length back, within `limit`. Returns what came back.
async fn roundtrip(addr: SocketAddr, msg: &[u8], limit: Duration) -> Result<Vec<u8>, String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    s.write_all(msg).await.map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(limit, async {
        while got.len() < msg.len() {
            match s.read(&mut buf).await {
                Ok(0) => return Err("closed".to_string()),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    })
    .await;
    match read {
        Err(_) => Err(format!("timeout after {} bytes", got.len())),
        Ok(Err(e)) => Err(format!("{e} after {} bytes", got.len())),
        Ok(Ok(())) => Ok(got),
    }
}

#[tokio::test]
async fn pass_blackhole_reset_cut_delay_and_heal() {
    let echo = echo_server().await;
    let p = Proxy::start(([127, 0, 0, 1], 0).into(), echo).await.unwrap();
    assert_eq!(roundtrip(p.addr(), b"hello", ANSWER_WAIT).await.unwrap(), b"hello");

    p.set(Fault::Blackhole);
    let e = roundtrip(p.addr(), b"hello", SILENCE).await.unwrap_err();
    assert!(e.starts_with("timeout after 0"), "{e}");

    p.set(Fault::Reset);
    let e = roundtrip(p.addr(), b"hello", ANSWER_WAIT).await.unwrap_err();
    assert!(!e.starts_with("timeout"), "a reset closes at once: {e}");

    p.set(Fault::CutAfter(3));
    let e = roundtrip(p.addr(), b"hello", ANSWER_WAIT).await.unwrap_err();
    assert!(!e.starts_with("timeout") && !e.contains("after 5"), "{e}");

    p.set(Fault::Delay(Duration::from_millis(150)));
    let t = Instant::now();
    assert_eq!(roundtrip(p.addr(), b"hello", ANSWER_WAIT).await.unwrap(), b"hello");
    assert!(t.elapsed() >= Duration::from_millis(300), "two delayed chunks: {:?}", t.elapsed());

    p.heal();
    assert_eq!(roundtrip(p.addr(), b"healed", ANSWER_WAIT).await.unwrap(), b"healed");
    assert!(p.stats().cut.load(std::sync::atomic::Ordering::Relaxed) >= 2);
}

#[tokio::test]
async fn a_reset_closes_open_connections_and_the_upstream_can_move() {
    let echo = echo_server().await;
    let p = Proxy::start(([127, 0, 0, 1], 0).into(), ([127, 0, 0, 1], 9).into()).await.unwrap();
    // The upstream is unreachable: the client is dropped.
    assert!(roundtrip(p.addr(), b"x", ANSWER_WAIT).await.is_err());
    p.set_upstream(echo);
    let mut s = TcpStream::connect(p.addr()).await.unwrap();
    s.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).await.unwrap();
    p.set(Fault::Reset);
    let r = tokio::time::timeout(ANSWER_WAIT, s.read(&mut buf)).await.unwrap();
    assert!(matches!(r, Ok(0) | Err(_)), "the open connection was closed: {r:?}");
}

#[tokio::test]
async fn links_cut_one_by_one_heal_in_any_order() {
    let echo = echo_server().await;
    let mut links = Vec::new();
    for _ in 0..3 {
        links.push(Proxy::start(([127, 0, 0, 1], 0).into(), echo).await.unwrap());
    }
    for (i, l) in links.iter().enumerate() {
        l.set(Fault::Blackhole);
        for (j, other) in links.iter().enumerate() {
            // A passing link gets all the time it needs; a cut one is only watched for silence.
            let limit = if j > i { ANSWER_WAIT } else { SILENCE };
            let ok = roundtrip(other.addr(), b"x", limit).await.is_ok();
            assert_eq!(ok, j > i, "link {j} after cutting {i}");
        }
    }
    for i in [2usize, 0, 1] {
        links[i].heal();
        assert!(roundtrip(links[i].addr(), b"y", ANSWER_WAIT).await.is_ok());
    }
}

#[tokio::test]
async fn close_open_resets_blackholed_connections_and_new_ones_pass() {
    let echo = echo_server().await;
    let p = Proxy::start(([127, 0, 0, 1], 0).into(), echo).await.unwrap();
    p.set(Fault::Blackhole);
    let mut s = TcpStream::connect(p.addr()).await.unwrap();
    s.write_all(b"lost").await.unwrap();
    let mut buf = [0u8; 4];
    assert!(tokio::time::timeout(SILENCE, s.read(&mut buf)).await.is_err(), "blackholed: no answer");
    p.heal();
    assert!(tokio::time::timeout(SILENCE, s.read(&mut buf)).await.is_err(), "a heal alone leaves it dead");
    p.close_open();
    let r = tokio::time::timeout(ANSWER_WAIT, s.read(&mut buf)).await.unwrap();
    assert!(matches!(r, Ok(0) | Err(_)), "the blackholed connection was closed: {r:?}");
    assert_eq!(roundtrip(p.addr(), b"again", ANSWER_WAIT).await.unwrap(), b"again");
}

#[test]
fn fault_commands_parse() {
    assert_eq!(Fault::parse("cut 10"), Some(Fault::CutAfter(10)));
    assert_eq!(Fault::parse("delay 5"), Some(Fault::Delay(Duration::from_millis(5))));
    assert_eq!(Fault::parse("pass"), Some(Fault::Pass));
    assert_eq!(Fault::parse("cut"), None);
    assert_eq!(Fault::parse("reset now"), None);
}

// ---------------------------------------------------------------------------------------------
// A partitioned node's data directory copied and started elsewhere

/// The start lease the hub grants each node session (`start_lease`): short, so that the copy
/// settles what the cut-off original acked soon after the original was cut off.
const START_LEASE: &str = "\"3s\"";
/// Long enough for anything that should happen in the copy scenario, however loaded the
/// machine (a lease or two, a start, a takeover): only a failure makes the test wait this long.
const COPY_EVENT_WAIT: Duration = Duration::from_secs(60);
/// Beyond the node's request timeout, how long the cut-off original is watched, once its held
/// turn ended, for a start of the next turn it must not make: its start request goes unanswered
/// until the timeout, and then the machine may be slow.
const START_DECISION_MARGIN: Duration = Duration::from_secs(10);
/// What the node logs when its start request failed: either the start on the local gate alone
/// (today's answer to a hub that cannot be reached) or the retry that waits for the hub.
const START_FAILED_LOGS: [&str; 2] = ["the hub cannot record starts now", "asking the hub to start turns failed"];

/// Polls `f` until it gives a value, every 100 ms, failing with `what` after `limit`.
async fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> anyhow::Result<Option<T>>) -> T {
    let start = Instant::now();
    loop {
        match f() {
            Ok(Some(v)) => return v,
            Ok(None) => {}
            Err(e) => panic!("while waiting for {what}: {e:#}"),
        }
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The effects ledger's lines of `delivery`.
fn executions(c: &Cluster, delivery: &str) -> Vec<EffectLine> {
    let lines = read_lines::<EffectLine>(&c.ledger).map(|l| l.items).unwrap_or_default();
    lines.into_iter().filter(|l| l.delivery_id == delivery).collect()
}

/// How often the original's log says a start request failed.
fn start_failures(log: &str) -> usize {
    START_FAILED_LOGS.iter().map(|t| log.matches(t).count()).sum()
}

/// The hub's (state, started, reported) of `delivery`: its state, whether its current run's
/// start is recorded, and whether an attempt of its current run is.
fn hub_view(c: &Cluster, delivery: &str) -> anyhow::Result<(String, bool, bool)> {
    let sql = format!(
        "SELECT d.state, d.started_at IS NOT NULL,
                EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt)
         FROM deliveries d WHERE d.id = '{delivery}'"
    );
    let rows = c.record().read(|db| checker::rows(db, &sql, |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))))?;
    rows.into_iter().next().ok_or_else(|| anyhow::anyhow!("the hub has no delivery {delivery}"))
}

/// The finding: a node runs seq 1 of a conversation and has acked seq 2 (waiting behind it);
/// its link to the hub is blackholed; its data directory is copied (the node stopped for the
/// copy and let go on) and the copy started elsewhere with a link of its own: it registers a
/// newer session of the same instance. The copy must not run seq 2: while the original's start
/// lease lasts the hub answers `start_lease_pending`, and once it ran out `started_elsewhere`
/// (the original, cut off, may have started seq 2 within it), so the copy reports seq 2
/// `unknown` and goes on with the conversation's next turn, seq 3, which it acked itself. The
/// original, still cut off, then ends seq 1 (the test holds it running until then) and, when its
/// start request for seq 2 goes unanswered, must not start seq 2 on its own: its lease has run
/// out. Healed, it finds out that it was taken over and exits 6. Judged from the effects ledger
/// (seq 2 never ran, seq 3 ran once) and by the checker over both data directories: no second
/// execution (I17), no execution the gate did not allow (I7), no turn out of order (I15).
///
/// With `ignore_lease` the original runs with its start lease switched off (the mutation switch
/// of crash-point builds): then it starts seq 2 on its own after the copy ran seq 3, which the
/// checker must find (I15) — the proof that it would catch the lease's absence.
async fn a_cut_off_node_and_its_copy_run_nothing_twice(mut c: Cluster, ignore_lease: bool) {
    c.set_hub_key("start_lease", START_LEASE).unwrap();
    let started = c.start_hub(None).unwrap();
    assert!(matches!(started, Started::Ready(_)), "the hub did not start ({started:?}):\n{}", c.logs());
    if ignore_lease {
        c.nodes[0].set_env(baton_shared::crash::MUTATION_ENV, "node.start.ignore_lease");
    }
    c.nodes[0].start(None).unwrap();
    let (first, second) = &seq_one_running_and_seq_two_waiting(&c).await;

    c.proxies[0].set(Fault::Blackhole);
    let copy = c.copy_node(0).await.unwrap();
    let settled =
        wait_for(&format!("the copy ({copy}) to settle seq 2"), COPY_EVENT_WAIT, || hub_outcome(&c, second)).await;
    assert_eq!(settled, "unknown", "the copy reports seq 2 unknown, never runs it:\n{}", c.logs());
    assert!(executions(&c, second).is_empty(), "seq 2 ran: {:?}", executions(&c, second));
    // The conversation goes on on the copy.
    let to = vec!["host-a".to_string()];
    let got = c.producer.accept(c.hub.addr(), "conv", "k3", &serde_json::json!({"n": 3}), &to).await;
    let AcceptOutcome::Ok(_) = got else { panic!("k3: {got:?}") };
    let third: String = c
        .record()
        .read(|db| checker::rows(db, "SELECT id FROM deliveries ORDER BY seq DESC LIMIT 1", |r| r.get(0)))
        .unwrap()
        .remove(0);
    wait_for("the copy to run seq 3", COPY_EVENT_WAIT, || Ok(executions(&c, &third).into_iter().next())).await;
    assert!(executions(&c, first).is_empty(), "seq 1 is still held running: {:?}", executions(&c, first));

    // Let the original's seq 1 end; it then wants to start seq 2, and cannot reach the hub.
    let original = &c.retired[0].node;
    let failures_before = start_failures(&original.proc().stderr_all());
    std::fs::write(hold_release(&c.ledger), b"").unwrap();
    wait_for("the original to end seq 1", COPY_EVENT_WAIT, || Ok(executions(&c, first).into_iter().next())).await;
    let window = baton_client::limits::REQUEST_TIMEOUT + START_DECISION_MARGIN;
    let watched = Instant::now();
    while executions(&c, second).is_empty()
        && start_failures(&original.proc().stderr_all()) == failures_before
        && watched.elapsed() < window
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    if ignore_lease {
        wait_for("the original, ignoring its lease, to run seq 2", COPY_EVENT_WAIT, || {
            Ok(executions(&c, second).into_iter().next())
        })
        .await;
        let report = checker::check(&c.inputs(false)).unwrap();
        assert!(report.families().contains("I15"), "the checker finds seq 2 after seq 3:\n{}", report.render());
        return;
    }
    assert!(
        executions(&c, second).is_empty(),
        "the original started seq 2 after its lease ended: {:?}\n{}",
        executions(&c, second),
        c.logs()
    );

    // Healed, the original learns that a newer session took over, and exits 6. Its connections
    // that lost bytes in the blackhole are closed, so it need not wait out their timeouts.
    for l in &c.retired[0].links {
        l.heal();
        l.close_open();
    }
    let status = c.retired[0].node.proc_mut().wait_exit(COPY_EVENT_WAIT).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(6), "the original exits 6 (taken over):\n{}", c.logs());
    let mut per_run: BTreeMap<(String, i64), Vec<EffectLine>> = BTreeMap::new();
    for l in read_lines::<EffectLine>(&c.ledger).unwrap().items {
        per_run.entry((l.delivery_id.clone(), l.run_number())).or_default().push(l);
    }
    let twice: Vec<_> = per_run.iter().filter(|(_, ls)| ls.len() > 1).collect();
    assert!(twice.is_empty(), "a run executed twice: {twice:#?}\n{}", c.logs());

    // Every turn ends with an outcome on the hub, and the checker finds nothing.
    for id in [first, second, &third] {
        wait_for(&format!("an outcome of {id}"), COPY_EVENT_WAIT, || Ok(hub_view(&c, id)?.2.then_some(()))).await;
    }
    let report = checker::check(&c.inputs(false)).unwrap();
    assert_eq!(report.counts["node_dbs"], 2, "the original's and the copy's data directories: {:?}", report.counts);
    let found = report.families();
    assert!(
        !found.contains("I17") && !found.contains("I7") && !found.contains("I15"),
        "{}\n{}",
        report.render(),
        c.logs()
    );
}

/// The start lease the hub grants in the within-the-lease case: long enough that the cut-off
/// original, whose requests fail at once, still holds its lease when its held turn ends after
/// the copy was taken, however slow the copy.
const LONG_START_LEASE: &str = "\"20s\"";

/// Sends seq 1 (held running) and seq 2 of one conversation to the running node, and waits
/// until seq 1 runs (its start recorded), seq 2 is acked, waiting behind it, and a renewal of
/// the node's start lease covers that ack. Returns their delivery ids.
async fn seq_one_running_and_seq_two_waiting(c: &Cluster) -> (String, String) {
    let hub = c.hub.addr();
    let to = vec!["host-a".to_string()];
    for (key, payload) in [("k1", serde_json::json!({ HOLD: true })), ("k2", serde_json::json!({"n": 2}))] {
        let got = c.producer.accept(hub, "conv", key, &payload, &to).await;
        assert!(matches!(got, AcceptOutcome::Ok(_)), "{key}: {got:?}");
    }
    let ids: Vec<String> =
        c.record().read(|db| checker::rows(db, "SELECT id FROM deliveries ORDER BY seq", |r| r.get(0))).unwrap();
    let [first, second] = &ids[..] else { panic!("two deliveries, one per message: {ids:?}") };
    wait_for("seq 1 to run and seq 2 to be acked by the original", COPY_EVENT_WAIT, || {
        let (s1, started, _) = hub_view(c, first)?;
        let (s2, _, _) = hub_view(c, second)?;
        Ok((s1 == "delivered" && started && s2 == "delivered").then_some(()))
    })
    .await;
    wait_for_a_renewal_after_the_ack(c, second).await;
    (first.clone(), second.clone())
}

/// Waits until the hub recorded a renewal of the original's start lease at or after the ack of
/// `delivery`: from then on the original may start it on its own (a node starts on its own only
/// runs a renewal covers, and the hub holds the same rule).
async fn wait_for_a_renewal_after_the_ack(c: &Cluster, delivery: &str) {
    let sql = format!(
        "SELECT (SELECT start_lease_until - start_lease_ms FROM node_sessions WHERE host = 'host-a' AND session = 1)
                >= (SELECT max(at) FROM delivery_events WHERE delivery_id = '{delivery}' AND to_state = 'delivered')"
    );
    wait_for("the original to renew its start lease after the ack of seq 2", COPY_EVENT_WAIT, || {
        let covered: Vec<Option<bool>> = c.record().read(|db| checker::rows(db, &sql, |r| r.get(0)))?;
        Ok((covered.first() == Some(&Some(true))).then_some(()))
    })
    .await;
}

/// The outcome the hub records for the current run of `delivery`, once it has one.
fn hub_outcome(c: &Cluster, delivery: &str) -> anyhow::Result<Option<String>> {
    let sql = format!(
        "SELECT a.outcome FROM deliveries d JOIN attempts a ON a.delivery_id = d.id AND a.attempt = d.attempt
         WHERE d.id = '{delivery}'"
    );
    Ok(c.record().read(|db| checker::rows(db, &sql, |r| r.get(0)))?.into_iter().next())
}

/// The other way to a second run: the cut-off original starts the acked seq 2 on its own
/// *within* its lease (its requests fail at once, so it does not wait out a request timeout),
/// which the hub never hears of. The copy, taken before that start, asks to start seq 2: the
/// hub answers `start_lease_pending` while the original's lease lasts, and then
/// `started_elsewhere` (the original may have started it, and did), so the copy reports it
/// `unknown` instead of running it. Judged from the effects ledger (seq 2 ran once, on the
/// original) and by the checker over both data directories.
///
/// With `grant_after_lease` the hub grants the start once the lease ran out (the mutation
/// switch of crash-point builds): the copy runs seq 2 too, and the test and the checker's I17
/// must see it.
async fn a_turn_the_cut_off_original_starts_within_its_lease_never_runs_on_the_copy(
    mut c: Cluster,
    grant_after_lease: bool,
) {
    c.set_hub_key("start_lease", LONG_START_LEASE).unwrap();
    if grant_after_lease {
        c.hub.set_env(baton_shared::crash::MUTATION_ENV, "hub.start.grant_after_lease");
    }
    let started = c.start_hub(None).unwrap();
    assert!(matches!(started, Started::Ready(_)), "the hub did not start ({started:?}):\n{}", c.logs());
    c.nodes[0].start(None).unwrap();
    let (_, second) = &seq_one_running_and_seq_two_waiting(&c).await;

    // Cut off (every request fails at once), copied while seq 2 waits; then seq 1 ends.
    c.proxies[0].set(Fault::Reset);
    let copy = c.copy_node(0).await.unwrap();
    std::fs::write(hold_release(&c.ledger), b"").unwrap();
    let ran = wait_for("the cut-off original to start seq 2 on its own, within its lease", COPY_EVENT_WAIT, || {
        Ok(executions(&c, second).into_iter().next())
    })
    .await;
    let original_log = c.retired[0].node.proc().stderr_all();
    assert!(
        original_log.contains("within this session's start lease"),
        "seq 2 ({ran:?}) was started on the local gate:\n{}",
        c.logs()
    );

    // The copy learns the run is not its to start once the original's lease ran out.
    let outcome =
        wait_for(&format!("the copy ({copy}) to settle seq 2"), COPY_EVENT_WAIT, || hub_outcome(&c, second)).await;
    let runs = executions(&c, second);
    if grant_after_lease {
        assert_eq!(runs.len(), 2, "with the lease's end granting the start, the copy runs seq 2 too: {runs:?}");
        let report = checker::check(&c.inputs(false)).unwrap();
        assert!(report.families().contains("I17"), "the checker finds the second run:\n{}", report.render());
        return;
    }
    assert_eq!(runs.len(), 1, "seq 2 ran once, on the original: {runs:?}\n{}", c.logs());
    assert_eq!(outcome, "unknown", "the copy reports seq 2 unknown:\n{}", c.logs());

    // Healed, the original learns that a newer session took over, and exits 6.
    for l in &c.retired[0].links {
        l.heal();
        l.close_open();
    }
    let status = c.retired[0].node.proc_mut().wait_exit(COPY_EVENT_WAIT).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(6), "the original exits 6 (taken over):\n{}", c.logs());
    let report = checker::check(&c.inputs(false)).unwrap();
    assert_eq!(report.counts["node_dbs"], 2, "the original's and the copy's data directories: {:?}", report.counts);
    let found = report.families();
    assert!(!found.contains("I17") && !found.contains("I7"), "{}\n{}", report.render(), c.logs());
}

/// Runs `scenario` on a fresh cluster of host-a whose hub keeps its record in SQLite.
fn on_sqlite<F: std::future::Future<Output = ()>>(scenario: impl FnOnce(Cluster) -> F) {
    let bins = Binaries::build().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let c = Cluster::new(&bins, &["host-a"]).await.unwrap();
        assert!(matches!(c.record(), HubRecord::Sqlite(_)));
        scenario(c).await;
    });
}

/// Runs `scenario` on a fresh cluster of host-a whose hub keeps its record in `database` of a
/// throwaway PostgreSQL cluster; skipped without PostgreSQL (unless required) as `test`.
fn on_postgres<F: std::future::Future<Output = ()>>(test: &str, database: &str, scenario: impl FnOnce(Cluster) -> F) {
    let Some(pg) = baton_testkit::pg::cluster_or_skip(test, false) else { return };
    let bins = Binaries::build().unwrap();
    let url = pg.create_database(database).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let c = Cluster::on_postgres(&bins, &["host-a"], &url, 1).await.unwrap();
        scenario(c).await;
    });
    drop(rt);
    drop(pg);
}

#[test]
fn a_turn_the_cut_off_original_starts_within_its_lease_never_runs_on_the_copy_on_sqlite() {
    on_sqlite(|c| a_turn_the_cut_off_original_starts_within_its_lease_never_runs_on_the_copy(c, false));
}

/// The same with the hub granting the start once the older lease ran out: the second run is found.
#[test]
fn a_hub_granting_the_start_after_the_older_lease_runs_a_turn_twice_and_is_caught() {
    on_sqlite(|c| a_turn_the_cut_off_original_starts_within_its_lease_never_runs_on_the_copy(c, true));
}

#[test]
fn a_turn_the_cut_off_original_starts_within_its_lease_never_runs_on_the_copy_on_postgres() {
    on_postgres("a_turn_the_cut_off_original_starts", "copy_within", |c| {
        a_turn_the_cut_off_original_starts_within_its_lease_never_runs_on_the_copy(c, false)
    });
}

#[test]
fn a_cut_off_node_and_its_copy_run_nothing_twice_on_sqlite() {
    on_sqlite(|c| a_cut_off_node_and_its_copy_run_nothing_twice(c, false));
}

/// The same with the original ignoring its start lease: its late start of seq 2 is found.
#[test]
fn a_cut_off_node_ignoring_its_start_lease_starts_a_turn_out_of_order_and_is_caught() {
    on_sqlite(|c| a_cut_off_node_and_its_copy_run_nothing_twice(c, true));
}

#[test]
fn a_cut_off_node_and_its_copy_run_nothing_twice_on_postgres() {
    on_postgres("a_cut_off_node_and_its_copy", "copy", |c| a_cut_off_node_and_its_copy_run_nothing_twice(c, false));
}
