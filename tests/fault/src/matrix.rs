//! The crash-point matrix (RELIABILITY.md R1): one short run per crash point and seed, with real
//! processes. The seed picks the message count (3–8), the routing, the payloads and the hit on
//! which the point fires. The armed process aborts there; the run restarts it without the point,
//! replays the client's retries with the same keys, waits for quiescence and runs the checker.
//! The hub's record is an SQLite file or a PostgreSQL database (`RecordAt`); the run is the same
//! either way, and the checker reads whichever record the hub wrote.

use crate::checker::{self, HubRecord, Report};
use crate::cluster::{AcceptOutcome, Cluster};
use baton_hub::store::engine::Db;
use baton_testkit::{Binaries, Started};
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How many crash runs a suite keeps in flight at once. A run is a hub and two nodes that spend
/// most of their time waiting on each other (an abort, a restart, long polls, the drain), so a
/// 2-core machine runs several side by side; each has its own directories and ports.
pub const CRASH_RUNS_AT_ONCE: usize = 3;
/// The environment variable overriding `CRASH_RUNS_AT_ONCE` (1 runs the points one by one).
pub const CRASH_RUNS_AT_ONCE_ENV: &str = "BATON_FAULT_RUNS_AT_ONCE";
/// The most runs at once the override may ask for.
pub const CRASH_RUNS_AT_ONCE_MAX: usize = 16;

/// The runs a suite keeps in flight: `BATON_FAULT_RUNS_AT_ONCE` (1 to `CRASH_RUNS_AT_ONCE_MAX`),
/// else `CRASH_RUNS_AT_ONCE`.
///
/// # Panics
/// On a value that is not a number in that range, naming the variable.
pub fn runs_at_once() -> usize {
    let Ok(v) = std::env::var(CRASH_RUNS_AT_ONCE_ENV) else { return CRASH_RUNS_AT_ONCE };
    match v.trim().parse::<usize>() {
        Ok(n) if (1..=CRASH_RUNS_AT_ONCE_MAX).contains(&n) => n,
        _ => panic!("{CRASH_RUNS_AT_ONCE_ENV}: {v:?} is not a number of runs from 1 to {CRASH_RUNS_AT_ONCE_MAX}"),
    }
}

/// Runs `run` on every job, at most `at_once` at a time (each on a thread of its own, so `run`
/// may `block_on` a shared runtime), and returns the results in the jobs' order, whatever order
/// they finished in.
pub fn run_each<J: Sync, T: Send>(jobs: &[J], at_once: usize, run: impl Fn(&J) -> T + Sync) -> Vec<T> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::Mutex::new(Vec::with_capacity(jobs.len()));
    std::thread::scope(|s| {
        for _ in 0..at_once.clamp(1, jobs.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    let out = run(job);
                    done.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((i, out));
                }
            });
        }
    });
    let mut done = done.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, out)| out).collect()
}

/// Whether a crash point must already be compiled into the binaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// In today's `baton-hub` and `baton-node`: every run of it must fire.
    Required,
    /// Part of work not merged yet: the matrix runs it once the binary that owns it contains
    /// it (`known_by`) and skips it, saying so, until then.
    Planned,
}

/// One row of the matrix's point table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashPoint {
    /// The failpoint name; its first part (`hub`, `node`) names the process it is in.
    pub name: &'static str,
    /// Whether the binaries must already have it.
    pub presence: Presence,
}

impl CrashPoint {
    const fn required(name: &'static str) -> CrashPoint {
        CrashPoint { name, presence: Presence::Required }
    }

    const fn planned(name: &'static str) -> CrashPoint {
        CrashPoint { name, presence: Presence::Planned }
    }

    /// Whether the point is in the hub (else in the node).
    pub fn on_hub(&self) -> bool {
        self.name.starts_with("hub.")
    }
}

/// The matrix's one table of crash points: every point compiled into `baton-hub` and
/// `baton-node` (kept equal to the source by a test that greps for `crash_point(`), plus the
/// planned points of turn control, which run once the binaries have them:
/// `node.start.after_hub` is between the hub's start record (`POST /v1/starts`) and the node's
/// local start marker (the node then reports the turn `unknown`, never runs it).
///
/// The node's batched steps, each a crash between items of one batch: `node.mirror.mid` (a
/// claim batch's mirror transaction after its first delivery, before the commit),
/// `node.acked.mid` (the gates the handoff's or the batch `ack`'s answer opens, after the
/// first), `node.markers.mid` (a scheduler pass's fold of end and start markers, after its
/// first marker) and `node.report.settle_mid` (an outbox batch's settlements, after the first). Around them,
/// `node.mirror.after_commit` (before the handoff) and `node.handoff.after_response` (after the
/// combined handoff's answer, before the gates open); with `handoff = "separate"` (see
/// `SEPARATE_HANDOFF_POINTS`) `node.mirrored.after_response` (after the batch `mirrored`
/// answer, before the batch `ack`) and `node.ack.after_response` instead.
pub const CRASH_POINTS: &[CrashPoint] = &[
    CrashPoint::required("hub.accept.before_txn"),
    CrashPoint::required("hub.accept.after_message_insert"),
    CrashPoint::required("hub.accept.before_commit"),
    CrashPoint::required("hub.accept.after_commit"),
    CrashPoint::required("hub.fanout.before_first"),
    CrashPoint::required("hub.fanout.after_k"),
    CrashPoint::required("hub.fanout.before_mark_done"),
    CrashPoint::required("hub.claim.after_fence_eval"),
    CrashPoint::required("hub.claim.after_commit"),
    CrashPoint::required("hub.mirrored.after_commit"),
    CrashPoint::required("hub.ack.after_commit"),
    CrashPoint::required("hub.handoff.after_commit"),
    CrashPoint::required("hub.report.before_commit"),
    CrashPoint::required("hub.report.after_commit"),
    CrashPoint::required("hub.repair.mid"),
    CrashPoint::required("node.claim.after_response"),
    CrashPoint::required("node.mirror.after_commit"),
    CrashPoint::required("node.mirrored.after_response"),
    CrashPoint::required("node.ack.after_response"),
    CrashPoint::required("node.handoff.after_response"),
    CrashPoint::required("node.exec.after_spawn"),
    CrashPoint::required("node.exec.after_start_marker"),
    CrashPoint::required("node.exec.during_effect"),
    CrashPoint::required("node.exec.after_end_marker"),
    CrashPoint::required("node.report.after_response"),
    CrashPoint::required("node.resync.mid"),
    CrashPoint::required("node.mirror.mid"),
    CrashPoint::required("node.acked.mid"),
    CrashPoint::required("node.markers.mid"),
    CrashPoint::required("node.report.settle_mid"),
    CrashPoint::planned("node.start.after_hub"),
];

/// The points on the way of `mirrored` and `ack` sent as two requests: a node reaches them
/// only with `handoff = "separate"` (by default both go in one request, whose points are
/// `hub.handoff.after_commit` and `node.handoff.after_response`), so their runs' nodes have it.
pub const SEPARATE_HANDOFF_POINTS: &[&str] =
    &["hub.mirrored.after_commit", "hub.ack.after_commit", "node.mirrored.after_response", "node.ack.after_response"];

/// Whether the binary that owns `point` contains it: a crash point's name is a string literal
/// the armed check compares against, so a build that has the point carries its name. This asks
/// the binaries the matrix runs, not the source tree they may lag behind.
pub fn known_by(bins: &Binaries, point: &CrashPoint) -> anyhow::Result<bool> {
    let path = if point.on_hub() { &bins.hub } else { &bins.node };
    let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let needle = point.name.as_bytes();
    Ok(bytes.windows(needle.len()).any(|w| w == needle))
}

/// How long a run may take to drain after its workload before liveness counts as violated.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(20);
/// Accept attempts per key before the workload gives up on it (it stays `info`).
const ACCEPT_TRIES_MAX: u32 = 40;

/// What one crash-point run did.
#[derive(Debug)]
pub struct CrashRun {
    /// The checker's report over the final state.
    pub report: Report,
    /// Whether the armed point actually fired (a crash happened).
    pub fired: bool,
    /// Messages accepted.
    pub accepted: usize,
    /// Restarts of crashed processes.
    pub restarts: u32,
    /// Every process's log (for failure messages).
    pub logs: String,
    /// The hub's record the checker read.
    pub record: HubRecord,
}

impl CrashRun {
    /// One line for the test log: the point, the seed and what the run came to.
    pub fn summary(&self, point: &str, seed: u64, took: Duration) -> String {
        format!(
            "{point} seed {seed}: fired={} accepted={} effects={} restarts={} violations={} ({:.1}s)",
            self.fired,
            self.accepted,
            self.report.counts.get("effects").copied().unwrap_or(0),
            self.restarts,
            self.report.violations.len(),
            took.as_secs_f64()
        )
    }

    /// What is wrong with the run, if anything: the armed point never fired (with the start of
    /// every process's log), or the checker found violations (each with its chain).
    pub fn failure(&self, point: &str, seed: u64) -> Option<String> {
        if self.fired && self.report.violations.is_empty() {
            return None;
        }
        let logs: String = if self.fired { String::new() } else { self.logs.chars().take(FAILURE_LOG_CHARS).collect() };
        Some(format!("{point} seed {seed}: fired={}\n{}\n{logs}", self.fired, self.report.render()))
    }
}

/// How much of the processes' logs a failure of a point that never fired carries.
const FAILURE_LOG_CHARS: usize = 4000;

/// The successive arms of the process that gets the point: some points need a state only an
/// earlier crash leaves (holdings for resync). `hub.repair.mid` gets its pending obligations
/// from `leave_fan_out_pending` instead.
fn arms(point: &str, nth: u32, hubs: usize) -> VecDeque<String> {
    let mut v = VecDeque::new();
    if point == "node.resync.mid" {
        v.push_back("node.mirror.after_commit@1".to_string());
    }
    // Points hit only once or twice in a short run fire on their first hit: the node's batched
    // steps are hit once per claim batch, scheduler pass or outbox batch, not per delivery. With
    // several hubs, a hub's point does too: each hub sees only its share of the hits (the
    // hub's claims, `mirrored`, `ack` and reports come once per batch as well).
    let n = if (hubs > 1 && point.starts_with("hub."))
        || matches!(
            point,
            "hub.repair.mid"
                | "node.resync.mid"
                | "node.claim.after_response"
                | "node.mirror.mid"
                | "node.acked.mid"
                | "node.report.settle_mid"
                | "node.mirror.after_commit"
                | "node.mirrored.after_response"
                | "node.ack.after_response"
                | "node.handoff.after_response"
                | "node.exec.after_start_marker"
                | "node.exec.after_end_marker"
        ) {
        1
    } else {
        nth
    };
    v.push_back(format!("{point}@{n}"));
    v
}

/// Where a run's hub keeps its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordAt<'a> {
    /// An SQLite file in the hub's data directory.
    Sqlite,
    /// The (empty) PostgreSQL database at `url`, shared by `hubs` hubs (1 to
    /// `cluster::HUBS_MAX`). A hub's crash point is armed on every hub at its first start (the
    /// first restart of the hub that crashed arms the point's next step, if any); with two,
    /// each key is submitted through one hub and its retry through the other.
    Postgres {
        /// The database's `postgres://` URL.
        url: &'a str,
        /// How many hubs share it.
        hubs: usize,
    },
}

/// Runs one crash point with one seed, the hub's record in SQLite.
pub async fn crash_run(bins: &Binaries, point: &str, seed: u64) -> anyhow::Result<CrashRun> {
    crash_run_at(bins, point, seed, RecordAt::Sqlite).await
}

/// Runs one crash point with one seed, the hub's record where `record` says.
pub async fn crash_run_at(bins: &Binaries, point: &str, seed: u64, record: RecordAt<'_>) -> anyhow::Result<CrashRun> {
    let (c, restarts) = settle(bins, Some(point), seed, record).await?;
    let logs = c.logs();
    let fired = logs.contains(&format!("crash point {point} reached"));
    let report = checker::check(&c.inputs(true))?;
    let accepted = report.counts.get("messages").copied().unwrap_or(0) as usize;
    Ok(CrashRun { report, fired, accepted, restarts, logs, record: c.record().clone() })
}

/// A run without any crash, drained and stopped: the clean baseline the mutation tests break.
pub async fn clean_cluster(bins: &Binaries, seed: u64) -> anyhow::Result<Cluster> {
    Ok(settle(bins, None, seed, RecordAt::Sqlite).await?.0)
}

/// As `clean_cluster`, with two hubs sharing the (empty) PostgreSQL database at `url`: each key
/// is submitted through one hub and its retry through the other.
pub async fn clean_cluster_on_postgres(bins: &Binaries, seed: u64, url: &str) -> anyhow::Result<Cluster> {
    Ok(settle(bins, None, seed, RecordAt::Postgres { url, hubs: crate::cluster::HUBS_MAX }).await?.0)
}

/// Runs the workload (with `point` armed, if any), drains, and stops every process, the hub's
/// record where `record` says.
async fn settle(
    bins: &Binaries,
    point: Option<&str>,
    seed: u64,
    record: RecordAt<'_>,
) -> anyhow::Result<(Cluster, u32)> {
    let mut rng = StdRng::seed_from_u64(seed ^ crate::cluster::fxhash(point.unwrap_or("")));
    let count = rng.random_range(3..=8usize);
    let nth = rng.random_range(1..=2u32);
    let hosts = ["host-a", "host-b"];
    let mut c = match record {
        RecordAt::Sqlite => Cluster::new(bins, &hosts).await?,
        RecordAt::Postgres { url, hubs } => Cluster::on_postgres(bins, &hosts, url, hubs).await?,
    };
    let hubs = c.hub_count();
    if point.is_some_and(|p| SEPARATE_HANDOFF_POINTS.contains(&p)) {
        for n in &mut c.nodes {
            n.set_env("BATON_NODE_HANDOFF", "separate");
        }
    }
    let on_hub = point.is_some_and(|p| p.starts_with("hub."));
    let mut pending = point.map(|p| arms(p, nth, hubs)).unwrap_or_default();
    let mut restarts = 0;
    // Repair needs obligations left pending before its hub starts: the first messages are
    // accepted while no node runs, then the hub is killed and their fan-out undone.
    let repair = point == Some("hub.repair.mid");
    let before_nodes = if repair { count.min(2) } else { 0 };
    let first = if on_hub && !repair { pending.pop_front() } else { None };
    if matches!(c.start_hub(first.as_deref())?, Started::Exited(_)) {
        anyhow::bail!("the hub exited at its first start:\n{}", c.logs());
    }
    // Every hub is armed with a hub's point: the nodes' claims, acks and reports split between
    // the hubs, so the point fires on whichever reaches it first.
    for h in 1..hubs {
        if matches!(c.start_hub_at(h, first.as_deref())?, Started::Exited(_)) {
            anyhow::bail!("hub {h} exited at its first start:\n{}", c.logs());
        }
    }
    let mut sup = Supervisor { on_hub, pending: VecDeque::new(), restarts: 0, nodes_up: false };
    let mut keys = Vec::new();
    for i in 0..count {
        if i == before_nodes {
            if repair {
                c.hub.kill()?;
                leave_fan_out_pending(c.record())?;
                // The armed start crashes in repair; the next one completes it.
                let mut arm = pending.pop_front();
                while matches!(c.start_hub(arm.take().as_deref())?, Started::Exited(_)) {
                    sup.restarts += 1;
                }
            }
            let node_arm = if on_hub { None } else { pending.pop_front() };
            sup.pending.append(&mut pending);
            c.nodes[0].start(node_arm.as_deref())?;
            c.nodes[1].start(None)?;
            sup.nodes_up = true;
        }
        let to: Vec<String> = match rng.random_range(0..3) {
            0 => vec!["host-a".into()],
            1 => vec!["host-a".into(), "host-b".into()],
            _ => vec!["host-b".into(), "host-a".into()],
        };
        let key = format!("k-{seed}-{i}");
        let payload = serde_json::json!({"i": i, "seed": seed, "pad": rng.random::<u32>()});
        let conversation = format!("c{}", i % 2);
        keys.push((key.clone(), conversation.clone(), payload.clone(), to.clone()));
        submit(&mut c, &mut sup, i % hubs, &conversation, &key, &payload, &to).await?;
    }
    // The client's retry: every key once more, as after a lost answer (through the other hub).
    for (i, (key, conversation, payload, to)) in keys.iter().enumerate() {
        submit(&mut c, &mut sup, (i + 1) % hubs, conversation, key, payload, to).await?;
    }
    let start = Instant::now();
    while start.elapsed() < DRAIN_LIMIT {
        sup.tend(&mut c)?;
        if c.quiesce(Duration::from_millis(300)).await {
            break;
        }
    }
    restarts += sup.restarts;
    for h in 0..hubs {
        if let Some(hub) = c.hub_at_mut(h) {
            hub.kill()?;
        }
    }
    for n in &mut c.nodes {
        n.proc_mut().kill()?;
    }
    Ok((c, restarts))
}

/// Undoes the fan-out of every message in the stopped hub's record, as a hub that committed
/// an accept before its fan-out left it when it crashed in between (today's hub commits both
/// together, so only such a record gives startup repair work). Every delivery must still be
/// queued: no node has run. The same statements serve both backends.
fn leave_fan_out_pending(record: &HubRecord) -> anyhow::Result<()> {
    match record {
        HubRecord::Sqlite(path) => undo_fan_out(&rusqlite::Connection::open(path)?),
        // A PostgreSQL connection runs on a runtime of its own, so it is made and used off the
        // async worker threads.
        HubRecord::Postgres(url) => std::thread::scope(|s| {
            s.spawn(|| -> anyhow::Result<()> {
                let conn =
                    baton_hub::store::engine::PgConn::connect(&baton_hub::store::engine::postgres::PgUrl::parse(url)?)
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                undo_fan_out(&conn)
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the thread undoing the fan-out panicked"))?
        }),
    }
}

/// `leave_fan_out_pending`'s statements, in one write transaction on `db`.
fn undo_fan_out(db: &dyn Db) -> anyhow::Result<()> {
    let not_queued: i64 = db.query_row("SELECT count(*) FROM deliveries WHERE state <> 'queued'", [], |r| r.get(0))?;
    anyhow::ensure!(not_queued == 0, "{not_queued} deliveries left the queue before any node ran");
    db.begin_write()?;
    // A message fanned out in its accept's transaction keeps no routing or obligation: they are
    // written here from its deliveries, as an accept that left its fan-out for later writes them.
    for sql in [
        "INSERT INTO message_recipients (message_id, host)
         SELECT DISTINCT message_id, host FROM deliveries WHERE pool IS NULL ON CONFLICT DO NOTHING",
        "INSERT INTO message_pool_recipients (message_id, pool)
         SELECT DISTINCT message_id, pool FROM deliveries WHERE pool IS NOT NULL ON CONFLICT DO NOTHING",
        "INSERT INTO fanout_obligations (message_id, created_at)
         SELECT id, accepted_at FROM messages WHERE true ON CONFLICT (message_id) DO UPDATE SET done_at = NULL",
        "UPDATE host_backlog SET waiting = waiting - (SELECT count(*) FROM deliveries d WHERE d.host = host_backlog.host)",
        "DELETE FROM delivery_events",
        "DELETE FROM deliveries",
    ] {
        if let Err(e) = db.execute(sql, []) {
            let _ = db.control("ROLLBACK");
            return Err(e.into());
        }
    }
    db.control("COMMIT")?;
    Ok(())
}

/// Restarts whatever died, arming the next pending point on the process that gets it.
struct Supervisor {
    on_hub: bool,
    pending: VecDeque<String>,
    restarts: u32,
    /// Whether the nodes have been started (before, a stopped node is not a dead one).
    nodes_up: bool,
}

impl Supervisor {
    fn tend(&mut self, c: &mut Cluster) -> anyhow::Result<()> {
        if !c.hub.proc_mut().running() {
            let mut arm = if self.on_hub { self.pending.pop_front() } else { None };
            self.restarts += 1;
            while matches!(c.start_hub(arm.as_deref())?, Started::Exited(_)) {
                self.restarts += 1;
                arm = if self.on_hub { self.pending.pop_front() } else { None };
            }
        }
        // A further hub is armed at its first start only; it is restarted if it stopped.
        for h in 1..c.hub_count() {
            if c.hub_at_mut(h).is_some_and(|hub| !hub.proc_mut().running()) {
                self.restarts += 1;
                c.start_hub_at(h, None)?;
            }
        }
        for (i, n) in c.nodes.iter_mut().enumerate() {
            if self.nodes_up && !n.proc_mut().running() {
                let arm = if !self.on_hub && i == 0 { self.pending.pop_front() } else { None };
                self.restarts += 1;
                n.start(arm.as_deref())?;
            }
        }
        Ok(())
    }
}

/// Submits one key through hub `via` until it is answered (or `ACCEPT_TRIES_MAX` attempts).
async fn submit(
    c: &mut Cluster,
    sup: &mut Supervisor,
    via: usize,
    conversation: &str,
    key: &str,
    payload: &serde_json::Value,
    to: &[String],
) -> anyhow::Result<()> {
    for _ in 0..ACCEPT_TRIES_MAX {
        sup.tend(c)?;
        let hub = c.hub_at(via).and_then(|h| h.addr());
        match c.producer.accept(hub, conversation, key, payload, to).await {
            AcceptOutcome::Ok(_) | AcceptOutcome::Fail(_) => return Ok(()),
            AcceptOutcome::Info => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    Ok(())
}
