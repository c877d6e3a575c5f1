//! The kill/pause/partition/fence soak (RELIABILITY.md R5, R7, R8): hub + 3 nodes (each dialing
//! the hub through its own fault proxy) + producers that retry with the same keys, against a
//! nemesis driven by a printed seed. Then heal, restart, drain, and run the checker.
//!
//! With `SoakConfig::database_url`, two hubs share that PostgreSQL record: each node dials both
//! through a proxy per hub (preferring one by its position), each producer attempt goes through
//! a hub picked at random among those up (so a key's replay may reach the other hub), and the
//! nemesis kills, pauses and cuts off either hub, both at once included. The checker then reads
//! the PostgreSQL record and every node database.
//!
//! The nemesis also copies a node's data directory while the node is cut off (RELIABILITY.md
//! I17): it blackholes every link of the node, copies its directory and starts the copy elsewhere
//! on links of its own (`Cluster::copy_node`), so a newer session of the same instance runs while
//! the original, cut off, still holds what it acked. The copy takes the node's place; the
//! original's links heal later, and it must find out that it was taken over and exit 6. The
//! checker reads both directories.
//!
//! Part of the traffic (`POOL_PERCENT`) is addressed to a pool (`POOL`) of some of the hosts
//! (`POOL_MEMBERS`) instead of to hosts (RELIABILITY.md I18): the kills, pauses and cuts of the
//! nemesis hit its members while they hold its conversations, and the host outside it must
//! never take its work.

use crate::checker::{self, Report};
use crate::cluster::{AcceptOutcome, Cluster, Retries};
use crate::proxy::Fault;
use crate::records::{PROGRESS, RETRY_FIRST_RUN, SLOW};
use baton_testkit::{Binaries, Signal, Started};
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Hosts the soak runs.
pub const HOSTS: [&str; 3] = ["host-a", "host-b", "host-c"];
/// Concurrent producer tasks, each on its own connections, all submitting into the same few
/// shared conversations so their messages interleave in each conversation's `seq` (I15).
const PRODUCERS: usize = 8;
/// The shared conversations every producer submits into (and the nemesis fences).
pub const CONVERSATIONS: u32 = 2;
/// Pause after each new message a producer got accepted (8 producers: at most ~40 messages/s).
const PRODUCER_PACE: Duration = Duration::from_millis(200);
/// The same pause with turn control. Its slow turns (`SLOW_PERCENT`, `SLOW_TURN_SECS` each) run
/// one after another per conversation, so the 2 conversations × 3 hosts run about 15 turns/s
/// at most, retries included; 8 producers each at most one message a second, to 1.5 hosts on
/// average, stay under that even when a hub is always up (two hubs), so the drain after heal
/// measures recovery, not a backlog. (At `PRODUCER_PACE` two hubs offered about 40 deliveries/s
/// and the drain never finished.)
const TURN_CONTROL_PRODUCER_PACE: Duration = Duration::from_millis(1000);
/// The pool part of the traffic is addressed to.
pub const POOL: &str = "soak";
/// The pool's members: two of the three hosts, so that one host that is no member runs beside
/// them (and must take none of the pool's work), and two of every three node kills hit one.
pub const POOL_MEMBERS: [&str; 2] = ["host-b", "host-c"];
/// Percent of new messages addressed to `POOL` alone instead of to hosts.
const POOL_PERCENT: u32 = 30;
/// Conversations beyond the shared ones that only the pool's messages go to (`c2`, `c3`, …; a
/// pool message picks among these and the shared ones): each gets a turn every second or so,
/// so it is often free between turns and its next turn goes to either member, while the
/// shared ones mix pool turns with the hosts' own under the nemesis's fences.
const POOL_CONVERSATIONS: u32 = 4;
/// The hubs' `limits.pool_affinity_wait` in the soak (the default is 2 s): none, so that every
/// turn of a free pool conversation goes to whichever member claims first, and its order
/// passes between hosts often in a short run (with 250 ms, a 30 s soak passed it once).
const POOL_AFFINITY_WAIT: &str = "0s";
/// How long the drain after heal may take before liveness counts as violated.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// What the soak does.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// Seconds of faults and load.
    pub seconds: u64,
    /// The nemesis and workload seed.
    pub seed: u64,
    /// Longest SIGSTOP, in milliseconds.
    pub pause_ms_max: u64,
    /// Exercise turn control (`baton-soak --turn-control`; the test suite runs both modes): some
    /// messages allow `TURN_CONTROL_MAX_ATTEMPTS` runs and their harness exits 75 on run 1, some
    /// turns run slowly, and the nemesis cancels deliveries with `baton-hub deliveries cancel`,
    /// running ones included.
    pub turn_control: bool,
    /// Run two hubs sharing the (empty) PostgreSQL database at this URL instead of one hub on
    /// an SQLite file (`baton-soak --database-url`).
    pub database_url: Option<String>,
    /// Also copy a node's data directory while the node is cut off (`baton-soak --copies`).
    /// Off in the test command's soaks: the start lease does not yet cover a turn the cut-off
    /// original starts on its own within its lease, which the copy may run again once the
    /// lease has run out (see docs/reliability.md).
    pub copies: bool,
}

/// Runs a retryable message of the turn-control soak allows.
pub const TURN_CONTROL_MAX_ATTEMPTS: u32 = 3;
/// The backoff base of those messages, short so that retries happen within the soak.
pub const TURN_CONTROL_BACKOFF_MS: u64 = 200;
/// Percent of new messages that ask for a retry on their first run (turn-control soak).
const RETRYABLE_PERCENT: u32 = 20;
/// Percent of new messages whose turn runs slowly, so that cancels reach running turns.
const SLOW_PERCENT: u32 = 15;
/// Percent of new messages whose harness writes progress events (`records::PROGRESS`).
const PROGRESS_PERCENT: u32 = 30;
/// Percent of new messages with a `deadline_ms`: `SLOW_DEADLINE_MS` for a slow turn, which it
/// runs past (its node stops it), `DEADLINE_MS` for the others, which none reaches.
const DEADLINE_PERCENT: u32 = 20;
/// A slow turn's deadline: half its `SLOW_TURN_SECS`.
const SLOW_DEADLINE_MS: u64 = crate::records::SLOW_TURN_SECS as u64 * 500;
/// Any other turn's deadline: far beyond what it takes.
const DEADLINE_MS: u64 = 60_000;

/// The figures the soak prints.
#[derive(Debug, Default)]
pub struct Figures {
    /// Distinct keys answered ok.
    pub accepted: u64,
    /// SIGKILLs of hubs and nodes.
    pub kills: u64,
    /// SIGKILLs of each hub, in hub order (one entry per hub).
    pub hub_kills: Vec<u64>,
    /// Kills that left no hub running (every other hub was down too).
    pub all_hubs_down: u64,
    /// Distinct keys answered ok, by the hub that answered, in hub order.
    pub accepted_via: Vec<u64>,
    /// Times a node moved to another of its hubs (its log's "now using the hub at").
    pub hub_moves: u64,
    /// SIGSTOP/SIGCONT pauses.
    pub pauses: u64,
    /// Proxy faults applied.
    pub partitions: u64,
    /// Fences set.
    pub fences: u64,
    /// Accepts re-sent for a key already answered ok.
    pub duplicate_submissions: u64,
    /// Harness executions (effects ledger lines).
    pub executions: u64,
    /// Progress events the hub kept (I19 compared each with its run's outcome).
    pub progress_events: u64,
    /// Runs with a deadline that I19 compared with how long they ran.
    pub deadline_runs: u64,
    /// Executions the order invariant I15 compared (per host and conversation).
    pub ordered_executions: u64,
    /// Cancels the hub accepted (turn-control soak).
    pub cancels: u64,
    /// Runs after the first (retries and redrives) in the final record.
    pub reruns: u64,
    /// Node data directories copied while the node was cut off, the copy started elsewhere.
    pub copies: u64,
    /// Distinct keys answered ok that were addressed to the pool.
    pub pool_accepted: u64,
    /// Claims of pool deliveries whose claimant's membership I18 checked.
    pub pool_claims: u64,
    /// Executions of pool turns I18 ordered per (pool, conversation).
    pub pool_ordered_executions: u64,
    /// Consecutive executions of one pool conversation on two different hosts (I18 compared
    /// each pair across hosts).
    pub pool_handovers: u64,
    /// Originals of copied directories that found out they were taken over and exited 6.
    pub superseded: u64,
}

/// The soak's outcome.
#[derive(Debug)]
pub struct SoakResult {
    /// The figures.
    pub figures: Figures,
    /// The checker's report.
    pub report: Report,
    /// Whether the drain finished before its limit.
    pub drained: bool,
}

struct Counters {
    accepted: AtomicU64,
    /// Of `accepted`, those addressed to the pool.
    pool_accepted: AtomicU64,
    duplicates: AtomicU64,
    /// Per hub, in hub order.
    accepted_via: Vec<AtomicU64>,
}

/// The current address of each hub, in hub order (`None` while it is down).
type HubAddrs = Arc<Mutex<Vec<Option<SocketAddr>>>>;

/// Runs the soak. `log` receives one line per nemesis action.
pub async fn run(bins: &Binaries, cfg: SoakConfig, log: &mut dyn FnMut(String)) -> anyhow::Result<SoakResult> {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut c = match &cfg.database_url {
        None => Cluster::new(bins, &HOSTS).await?,
        Some(url) => Cluster::on_postgres(bins, &HOSTS, url, crate::cluster::HUBS_MAX).await?,
    };
    let hubs = c.hub_count();
    for h in 0..hubs {
        if let Some(hub) = c.hub_at_mut(h) {
            hub.set_env("BATON_HUB_POOL_AFFINITY_WAIT", POOL_AFFINITY_WAIT);
        }
    }
    let mut members = vec!["pools", "add", "--pool", POOL];
    members.extend(POOL_MEMBERS);
    members.extend(["--reason", "soak"]);
    c.hub.cli(members)?;
    for h in 0..hubs {
        if matches!(c.start_hub_at(h, None)?, Started::Exited(_)) {
            anyhow::bail!("hub {h} did not start:\n{}", c.logs());
        }
    }
    for n in &mut c.nodes {
        n.start(None)?;
    }
    let addr: HubAddrs = Arc::new(Mutex::new((0..hubs).map(|h| c.hub_at(h).and_then(|hub| hub.addr())).collect()));
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters {
        accepted: AtomicU64::new(0),
        pool_accepted: AtomicU64::new(0),
        duplicates: AtomicU64::new(0),
        accepted_via: (0..hubs).map(|_| AtomicU64::new(0)).collect(),
    });
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let seed = cfg.seed.wrapping_mul(31).wrapping_add(p as u64);
        tasks.push(tokio::spawn(produce(
            Arc::clone(&c.producer),
            Arc::clone(&addr),
            Arc::clone(&stop),
            Arc::clone(&counters),
            Workload { index: p, seed, turn_control: cfg.turn_control },
        )));
    }
    let mut f = Figures { hub_kills: vec![0; hubs], ..Figures::default() };
    let nodes = c.nodes.len();
    let mut n = Nemesis::new(nodes + hubs);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(cfg.seconds);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(rng.random_range(KILL_EVERY_MS.0..KILL_EVERY_MS.1))).await;
        n.settle(&mut c, &addr)?;
        // Every soak with copies copies at least once: past half its time without one, each tick
        // tries a copy and kills nothing, so that the nodes come back up and register (a busy
        // machine slows both) until one qualifies.
        let copy_due = cfg.copies && f.copies == 0 && started.elapsed() > Duration::from_secs(cfg.seconds) / 2;
        if copy_due && let Some(line) = n.copy_partitioned(&mut c, &mut rng).await? {
            log(line);
            f.copies += 1;
        }
        // One kill in most ticks (R5: a kill every few hundred milliseconds), never blocking:
        // the victim comes back after a random delay, while the next faults are already going.
        if !copy_due && rng.random_range(0..100u32) < KILL_PERCENT {
            let victims: Vec<usize> = (0..nodes + hubs).filter(|&i| n.restart_at[i].is_none()).collect();
            if !victims.is_empty() {
                let i = victims[rng.random_range(0..victims.len())];
                if let Some(h) = i.checked_sub(nodes) {
                    if let Some(hub) = c.hub_at_mut(h) {
                        hub.kill()?;
                    }
                    f.hub_kills[h] += 1;
                    // The hub's address is gone at once; producers pick among the others.
                    if let Ok(mut a) = addr.lock() {
                        a[h] = None;
                    }
                    if (0..hubs).all(|o| o == h || n.restart_at[nodes + o].is_some()) {
                        f.all_hubs_down += 1;
                    }
                } else {
                    c.nodes[i].proc_mut().kill()?;
                }
                log(format!("kill {}", name(&c, i)));
                f.kills += 1;
                n.restart_at[i] =
                    Some(Instant::now() + Duration::from_millis(rng.random_range(0..RESTART_DELAY_MS_MAX)));
            }
        }
        match rng.random_range(0..100u32) {
            0..12 => {
                let i = rng.random_range(0..nodes + hubs);
                let ms = rng.random_range(500..=cfg.pause_ms_max.max(500));
                let p = c.proc(i);
                if n.paused[i].is_none()
                    && let Some(pid) = p.pid()
                    && p.signal(Signal::SIGSTOP).is_ok()
                {
                    log(format!("pause {} for {ms} ms", name(&c, i)));
                    f.pauses += 1;
                    n.paused[i] = Some((pid, Instant::now() + Duration::from_millis(ms)));
                }
            }
            12..30 if n.heal_at.is_empty() => {
                // Cut links one by one; they heal later, one by one, in random order.
                let fault = match rng.random_range(0..4) {
                    0 => Fault::Blackhole,
                    1 => Fault::Reset,
                    2 => Fault::CutAfter(rng.random_range(1..4000)),
                    _ => Fault::Delay(Duration::from_millis(rng.random_range(10..500))),
                };
                let links = c.links();
                let mut order: Vec<usize> = (0..links.len()).collect();
                for i in (0..order.len()).rev() {
                    order.swap(i, rng.random_range(0..=i));
                }
                let k = rng.random_range(1..=order.len());
                for &i in order.iter().take(k) {
                    links[i].set(fault);
                    f.partitions += 1;
                    let heal = Instant::now() + Duration::from_millis(rng.random_range(200..3000));
                    n.heal_at.push((i, heal));
                }
                log(format!("partition {k} link(s) with {fault:?}"));
            }
            30..38 => {
                let conv = format!("c{}", rng.random_range(0..CONVERSATIONS));
                let kind = if rng.random_bool(0.5) { "hold" } else { "pause" };
                // Through either hub's data directory: on a shared record, the same change.
                let cli = c.hub_at(rng.random_range(0..hubs)).unwrap_or(&c.hub);
                n.resume_hubs(&c);
                if cli.cli(["fence", kind, "--conversation", &conv, "--reason", "soak"]).is_ok() {
                    log(format!("fence {kind} {conv}"));
                    f.fences += 1;
                }
            }
            38..44 => {
                n.resume_hubs(&c);
                let _ = c.lift_all_fences();
            }
            52..55 if cfg.copies => {
                if let Some(line) = n.copy_partitioned(&mut c, &mut rng).await? {
                    log(line);
                    f.copies += 1;
                }
            }
            44..52 if cfg.turn_control => {
                if let Some(id) = cancel_candidate(&c, &mut rng) {
                    // A refusal (the delivery ended meanwhile, the hub is down) is no fault.
                    let cli = c.hub_at(rng.random_range(0..hubs)).unwrap_or(&c.hub);
                    n.resume_hubs(&c);
                    if cli.cli(["deliveries", "cancel", &id, "--reason", "soak"]).is_ok() {
                        log(format!("cancel {id}"));
                        f.cancels += 1;
                    }
                }
            }
            _ => {} // no extra fault this tick
        }
    }
    n.heal_all(&mut c, &addr)?;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        let _ = t.await;
    }
    // Heal: every link passes, every process runs, every fence is lifted, everything released.
    n.heal_all(&mut c, &addr)?;
    if let Err(e) = c.lift_all_fences() {
        log(format!("heal: {e:#}"));
    }
    let drained = c.quiesce(DRAIN_LIMIT).await;
    // What was still pending, read before the processes stop.
    let pending = if drained { String::new() } else { c.pending() };
    // Every original of a copied directory, healed, has found out by now (or does soon).
    for r in &mut c.retired {
        let status = r.node.proc_mut().wait_exit(SUPERSEDED_EXIT_WAIT)?;
        if status.and_then(|s| s.code()) == Some(i32::from(baton_shared::exit::SUPERSEDED)) {
            f.superseded += 1;
        } else {
            log(format!("the original {} did not exit 6 when taken over: {status:?}", r.node.proc().stem()));
            r.node.proc_mut().kill()?;
        }
    }
    for h in 0..hubs {
        if let Some(hub) = c.hub_at_mut(h) {
            hub.kill()?;
        }
    }
    for n in &mut c.nodes {
        n.proc_mut().kill()?;
    }
    let mut inputs = c.inputs(true);
    // A paused node's timer stands still while its harness runs on: the stated bound of I19
    // grows by the longest pause.
    inputs.deadline_allowance += Duration::from_millis(cfg.pause_ms_max);
    let report = checker::check(&inputs)?;
    f.accepted = counters.accepted.load(Ordering::SeqCst);
    f.pool_accepted = counters.pool_accepted.load(Ordering::SeqCst);
    f.pool_claims = report.counts.get("pool_claims").copied().unwrap_or(0);
    f.pool_ordered_executions = report.counts.get("pool_ordered_effects").copied().unwrap_or(0);
    f.pool_handovers = report.counts.get("pool_handovers").copied().unwrap_or(0);
    f.accepted_via = counters.accepted_via.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    f.hub_moves = c.nodes.iter().map(|n| n.proc().stderr_all().matches(HUB_MOVE_LOG).count() as u64).sum();
    f.duplicate_submissions = counters.duplicates.load(Ordering::SeqCst);
    f.executions = report.counts.get("effects").copied().unwrap_or(0);
    f.ordered_executions = report.counts.get("ordered_effects").copied().unwrap_or(0);
    f.reruns = report.counts.get("reruns").copied().unwrap_or(0);
    f.progress_events = report.counts.get("progress_events").copied().unwrap_or(0);
    f.deadline_runs = report.counts.get("deadlines_checked").copied().unwrap_or(0);
    if !drained {
        log(format!("drain did not finish within {DRAIN_LIMIT:?}; still pending:\n{pending}logs:\n{}", c.logs()));
    }
    Ok(SoakResult { figures: f, report, drained })
}

/// Milliseconds between nemesis ticks (uniform in this range).
const KILL_EVERY_MS: (u64, u64) = (150, 500);
/// Percent of ticks that kill the hub or a node.
const KILL_PERCENT: u32 = 90;
/// Longest a killed process stays down before it is restarted.
const RESTART_DELAY_MS_MAX: u64 = 1500;

/// How long the original of a copied directory is cut off before its links heal (uniform).
const COPY_CUT_OFF_MS: (u64, u64) = (1000, 4000);
/// Most copies one soak makes (each leaves a data directory and, until it exits, a process).
const COPIES_MAX: u64 = 4;
/// How long, after the drain, the original of a copied directory may take to exit 6.
const SUPERSEDED_EXIT_WAIT: Duration = Duration::from_secs(30);

/// What a node logs once the hub registered its session.
const REGISTERED_LOG: &str = "registered session";

/// What a node logs when it moves to another of its hubs.
const HUB_MOVE_LOG: &str = "now using the hub at";

/// The name of process `i` for the nemesis log: a node's stem, or `hub` (`hub 1`, `hub 2`
/// with two hubs).
fn name(c: &Cluster, i: usize) -> String {
    match i.checked_sub(c.nodes.len()) {
        None => c.proc(i).stem().to_string(),
        Some(_) if c.hub_count() == 1 => "hub".to_string(),
        Some(h) => format!("hub {}", h + 1),
    }
}

/// Faults in progress: restarts, resumes and heals that are due later. Index `nodes.len() + h`
/// is hub `h`.
struct Nemesis {
    restart_at: Vec<Option<Instant>>,
    paused: Vec<Option<(u32, Instant)>>,
    heal_at: Vec<(usize, Instant)>,
    /// When the links of each original of a copied directory (`Cluster::retired`, same order)
    /// heal; `None` once healed.
    retired_heal_at: Vec<Option<Instant>>,
}

impl Nemesis {
    /// Faults of `procs` processes: the nodes, then the hubs.
    fn new(procs: usize) -> Nemesis {
        Nemesis {
            restart_at: vec![None; procs],
            paused: vec![None; procs],
            heal_at: Vec::new(),
            retired_heal_at: Vec::new(),
        }
    }

    /// Copies the directory of a node that is up (neither down nor paused, its session
    /// registered, and no earlier copy's original still cut off) while it is cut off: every link of the node is blackholed, the
    /// directory copied and the copy started elsewhere in its place (`Cluster::copy_node`); the
    /// original's links heal after `COPY_CUT_OFF_MS`. Returns the log line, or `None` when no
    /// node qualifies or `COPIES_MAX` copies were made.
    async fn copy_partitioned(&mut self, c: &mut Cluster, rng: &mut StdRng) -> anyhow::Result<Option<String>> {
        if c.retired.len() as u64 >= COPIES_MAX || self.retired_heal_at.iter().any(Option::is_some) {
            return Ok(None);
        }
        // Up: neither down nor paused, running, and (only such a node) its current process has
        // registered its session: a process still registering when it is cut off would register
        // after the copy once healed, and so rightly take over from the copy instead.
        let mut up: Vec<usize> = Vec::new();
        for i in 0..c.nodes.len() {
            if self.restart_at[i].is_none()
                && self.paused[i].is_none()
                && c.nodes[i].proc_mut().running()
                && c.nodes[i].proc().stderr().contains(REGISTERED_LOG)
            {
                up.push(i);
            }
        }
        if up.is_empty() {
            return Ok(None);
        }
        let i = up[rng.random_range(0..up.len())];
        c.proxies[i].set(Fault::Blackhole);
        if let Some(p) = c.second_proxies.get(i) {
            p.set(Fault::Blackhole);
        }
        let original = c.nodes[i].proc().stem().to_string();
        let copy = c.copy_node(i).await?;
        let ms = rng.random_range(COPY_CUT_OFF_MS.0..COPY_CUT_OFF_MS.1);
        self.retired_heal_at.push(Some(Instant::now() + Duration::from_millis(ms)));
        Ok(Some(format!("copy {original} while cut off: {copy} runs in its place; the original heals in {ms} ms")))
    }

    /// Resumes, heals and restarts whatever is due.
    fn settle(&mut self, c: &mut Cluster, addr: &Mutex<Vec<Option<SocketAddr>>>) -> anyhow::Result<()> {
        let now = Instant::now();
        for (i, p) in self.paused.iter_mut().enumerate() {
            if let Some((pid, at)) = *p
                && at <= now
            {
                // Only the run that was paused; a killed one is gone, its restart never paused.
                let proc = c.proc(i);
                if proc.pid() == Some(pid) {
                    let _ = proc.signal(Signal::SIGCONT);
                }
                *p = None;
            }
        }
        for (r, at) in c.retired.iter().zip(&mut self.retired_heal_at) {
            if at.is_some_and(|at| at <= now) {
                // Its connections lost bytes in the blackhole: closed, so it finds out at once.
                for l in &r.links {
                    l.heal();
                    l.close_open();
                }
                *at = None;
            }
        }
        let links = c.links();
        self.heal_at.retain(|&(i, at)| {
            if at <= now {
                links[i].heal();
                false
            } else {
                true
            }
        });
        for r in &mut self.restart_at {
            if r.is_some_and(|at| at <= now) {
                *r = None;
            }
        }
        let down: Vec<bool> = self.restart_at.iter().map(Option::is_some).collect();
        let nodes = c.nodes.len();
        let starting = (0..c.hub_count())
            .any(|h| !down[nodes + h] && c.hub_at_mut(h).is_some_and(|hub| !hub.proc_mut().running()));
        if starting {
            self.resume_hubs(c);
        }
        tend(c, addr, &down)
    }

    /// Ends the pauses of hubs now. A paused hub may hold the record's write lock in the middle of
    /// a transaction, and a hub's start and an operator command wait for that lock; the nemesis is
    /// one loop and cannot resume the hub while it waits, so hubs are resumed before either.
    fn resume_hubs(&mut self, c: &Cluster) {
        let nodes = c.nodes.len();
        for (i, p) in self.paused.iter_mut().enumerate().skip(nodes) {
            if let Some((pid, _)) = p.take() {
                let proc = c.proc(i);
                if proc.pid() == Some(pid) {
                    let _ = proc.signal(Signal::SIGCONT);
                }
            }
        }
    }

    /// Ends every fault now: resumes, heals, restarts.
    fn heal_all(&mut self, c: &mut Cluster, addr: &Mutex<Vec<Option<SocketAddr>>>) -> anyhow::Result<()> {
        let now = Instant::now();
        for p in self.paused.iter_mut().flatten() {
            p.1 = now;
        }
        for h in &mut self.heal_at {
            h.1 = now;
        }
        for r in self.restart_at.iter_mut().flatten() {
            *r = now;
        }
        for r in self.retired_heal_at.iter_mut().flatten() {
            *r = now;
        }
        for p in c.links() {
            p.heal();
        }
        self.settle(c, addr)
    }
}

/// Restarts whatever died (except those still meant to be down: `down` has the nodes, then the
/// hubs) and keeps the producers' view of the hub addresses current.
fn tend(c: &mut Cluster, addr: &Mutex<Vec<Option<SocketAddr>>>, down: &[bool]) -> anyhow::Result<()> {
    let nodes = c.nodes.len();
    for h in 0..c.hub_count() {
        let hub_down = down.get(nodes + h).copied().unwrap_or(false);
        let stopped = c.hub_at_mut(h).is_some_and(|hub| !hub.proc_mut().running());
        if !hub_down && stopped {
            c.start_hub_at(h, None)?;
            if let Ok(mut a) = addr.lock() {
                a[h] = c.hub_at(h).and_then(|hub| hub.addr());
            }
        }
    }
    for (i, n) in c.nodes.iter_mut().enumerate() {
        if !down.get(i).copied().unwrap_or(false) && !n.proc_mut().running() {
            n.start(None)?;
        }
    }
    Ok(())
}

/// A delivery for the nemesis to cancel: queued, or delivered without an outcome of its
/// current run (running or about to), picked by the seeded generator.
fn cancel_candidate(c: &Cluster, rng: &mut StdRng) -> Option<String> {
    let ids: Vec<String> = c
        .record()
        .read(|db| {
            checker::rows(
                db,
                "SELECT id FROM deliveries d WHERE state = 'queued'
                    OR (state = 'delivered'
                        AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))
                 ORDER BY n DESC LIMIT 50",
                |r| r.get(0),
            )
        })
        .ok()?;
    (!ids.is_empty()).then(|| ids[rng.random_range(0..ids.len())].clone())
}

/// What one producer task submits.
#[derive(Debug, Clone, Copy)]
struct Workload {
    index: usize,
    seed: u64,
    turn_control: bool,
}

/// One new message of a producer, kept to be sent again with the same key.
#[derive(Debug, Clone)]
struct Submission {
    key: String,
    conv: String,
    payload: serde_json::Value,
    /// Its hosts (empty when it is addressed to the pool).
    to: Vec<String>,
    /// Its pools: `POOL`, or none.
    pools: Vec<String>,
    retries: Retries,
}

async fn produce(
    producer: Arc<crate::cluster::Producer>,
    addr: HubAddrs,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    work: Workload,
) {
    let Workload { index, seed, turn_control } = work;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut done: Vec<Submission> = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let replay = !done.is_empty() && rng.random_bool(0.2);
        let Submission { key, conv, payload, to, pools, retries } = if replay {
            done[rng.random_range(0..done.len())].clone()
        } else {
            i += 1;
            let mut to: Vec<String> = HOSTS.iter().filter(|_| rng.random_bool(0.5)).map(|h| h.to_string()).collect();
            if to.is_empty() {
                to.push(HOSTS[rng.random_range(0..HOSTS.len())].to_string());
            }
            let mut pools = Vec::new();
            let mut conversations = CONVERSATIONS;
            if rng.random_range(0..100u32) < POOL_PERCENT {
                to.clear();
                pools.push(POOL.to_string());
                conversations += POOL_CONVERSATIONS;
            }
            let mut payload = serde_json::json!({"p": index, "i": i});
            let mut retries = Retries::default();
            if turn_control && rng.random_range(0..100u32) < RETRYABLE_PERCENT {
                payload[RETRY_FIRST_RUN] = true.into();
                retries = Retries {
                    max_attempts: Some(TURN_CONTROL_MAX_ATTEMPTS),
                    retry_backoff_ms: Some(TURN_CONTROL_BACKOFF_MS),
                    deadline_ms: None,
                };
            }
            let slow = turn_control && rng.random_range(0..100u32) < SLOW_PERCENT;
            if slow {
                payload[SLOW] = true.into();
            }
            // Part of the traffic writes progress, and part carries a deadline: one a slow turn
            // runs past (its node stops it, I19), or one no turn reaches.
            if rng.random_range(0..100u32) < PROGRESS_PERCENT {
                payload[PROGRESS] = true.into();
            }
            if rng.random_range(0..100u32) < DEADLINE_PERCENT {
                retries.deadline_ms = Some(if slow { SLOW_DEADLINE_MS } else { DEADLINE_MS });
            }
            let (key, conv) = (format!("p{index}-{seed}-{i}"), format!("c{}", rng.random_range(0..conversations)));
            Submission { key, conv, payload, to, pools, retries }
        };
        if replay {
            counters.duplicates.fetch_add(1, Ordering::Relaxed);
        }
        for _ in 0..50 {
            if stop.load(Ordering::SeqCst) && !replay {
                break;
            }
            // Any hub that is up (a key's retries and replays may reach another hub).
            let up: Vec<(usize, SocketAddr)> = addr
                .lock()
                .map(|a| a.iter().enumerate().filter_map(|(h, x)| x.map(|x| (h, x))).collect())
                .unwrap_or_default();
            // (With one hub no draw is made, so the workload is the seed's as it always was.)
            let via = match up.len() {
                0 | 1 => up.first().copied(),
                n => Some(up[rng.random_range(0..n)]),
            };
            match producer.accept_with(via.map(|(_, a)| a), &conv, &key, &payload, &to, &pools, retries).await {
                AcceptOutcome::Ok(_) => {
                    if !replay {
                        counters.accepted.fetch_add(1, Ordering::Relaxed);
                        if !pools.is_empty() {
                            counters.pool_accepted.fetch_add(1, Ordering::Relaxed);
                        }
                        if let Some(c) = via.and_then(|(h, _)| counters.accepted_via.get(h)) {
                            c.fetch_add(1, Ordering::Relaxed);
                        }
                        done.push(Submission {
                            key: key.clone(),
                            conv: conv.clone(),
                            payload: payload.clone(),
                            to: to.clone(),
                            pools: pools.clone(),
                            retries,
                        });
                        // Offer a steady load the cluster can drain while it is being killed, so
                        // the liveness check after heal measures recovery, not a backlog.
                        tokio::time::sleep(if turn_control { TURN_CONTROL_PRODUCER_PACE } else { PRODUCER_PACE }).await;
                    }
                    break;
                }
                AcceptOutcome::Fail(_) => break,
                AcceptOutcome::Info => {
                    counters.duplicates.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}
