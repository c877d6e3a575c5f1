//! The kill/pause/partition/fence soak (RELIABILITY.md R5, R7, R8): hub + 3 nodes (each dialing
//! the hub through its own fault proxy) + producers that retry with the same keys, against a
//! nemesis driven by a printed seed. Then heal, restart, drain, and run the checker.

use crate::checker::{self, Report};
use crate::cluster::{AcceptOutcome, Cluster, Retries};
use crate::proxy::Fault;
use crate::records::{RETRY_FIRST_RUN, SLOW};
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
/// How long the drain after heal may take before liveness counts as violated.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// What the soak does.
#[derive(Debug, Clone, Copy)]
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
}

/// Runs a retryable message of the turn-control soak allows.
pub const TURN_CONTROL_MAX_ATTEMPTS: u32 = 3;
/// The backoff base of those messages, short so that retries happen within the soak.
pub const TURN_CONTROL_BACKOFF_MS: u64 = 200;
/// Percent of new messages that ask for a retry on their first run (turn-control soak).
const RETRYABLE_PERCENT: u32 = 20;
/// Percent of new messages whose turn runs slowly, so that cancels reach running turns.
const SLOW_PERCENT: u32 = 15;

/// The figures the soak prints.
#[derive(Debug, Default)]
pub struct Figures {
    /// Distinct keys answered ok.
    pub accepted: u64,
    /// SIGKILLs of hub and nodes.
    pub kills: u64,
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
    /// Executions the order invariant I15 compared (per host and conversation).
    pub ordered_executions: u64,
    /// Cancels the hub accepted (turn-control soak).
    pub cancels: u64,
    /// Runs after the first (retries and redrives) in the final record.
    pub reruns: u64,
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

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    duplicates: AtomicU64,
}

/// Runs the soak. `log` receives one line per nemesis action.
pub async fn run(bins: &Binaries, cfg: SoakConfig, log: &mut dyn FnMut(String)) -> anyhow::Result<SoakResult> {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut c = Cluster::new(bins, &HOSTS).await?;
    if matches!(c.start_hub(None)?, Started::Exited(_)) {
        anyhow::bail!("the hub did not start:\n{}", c.logs());
    }
    for n in &mut c.nodes {
        n.start(None)?;
    }
    let addr: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(c.hub.addr()));
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
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
    let mut f = Figures::default();
    let mut n = Nemesis::new(c.nodes.len());
    let deadline = Instant::now() + Duration::from_secs(cfg.seconds);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(rng.random_range(KILL_EVERY_MS.0..KILL_EVERY_MS.1))).await;
        n.settle(&mut c, &addr)?;
        // One kill in most ticks (R5: a kill every few hundred milliseconds), never blocking:
        // the victim comes back after a random delay, while the next faults are already going.
        if rng.random_range(0..100u32) < KILL_PERCENT {
            let victims: Vec<usize> = (0..=c.nodes.len()).filter(|&i| n.restart_at[i].is_none()).collect();
            if !victims.is_empty() {
                let i = victims[rng.random_range(0..victims.len())];
                let hub = i == c.nodes.len();
                if hub {
                    c.hub.kill()?;
                } else {
                    c.nodes[i].proc_mut().kill()?;
                }
                log(format!("kill {}", if hub { "hub" } else { c.nodes[i].proc().stem() }));
                f.kills += 1;
                n.restart_at[i] =
                    Some(Instant::now() + Duration::from_millis(rng.random_range(0..RESTART_DELAY_MS_MAX)));
            }
        }
        match rng.random_range(0..100u32) {
            0..12 => {
                let i = rng.random_range(0..=c.nodes.len());
                let ms = rng.random_range(500..=cfg.pause_ms_max.max(500));
                let p = c.proc(i);
                if n.paused[i].is_none()
                    && let Some(pid) = p.pid()
                    && p.signal(Signal::SIGSTOP).is_ok()
                {
                    log(format!("pause {} for {ms} ms", if i == c.nodes.len() { "hub" } else { p.stem() }));
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
                let mut order: Vec<usize> = (0..c.proxies.len()).collect();
                for i in (0..order.len()).rev() {
                    order.swap(i, rng.random_range(0..=i));
                }
                let k = rng.random_range(1..=order.len());
                for &i in order.iter().take(k) {
                    c.proxies[i].set(fault);
                    f.partitions += 1;
                    let heal = Instant::now() + Duration::from_millis(rng.random_range(200..3000));
                    n.heal_at.push((i, heal));
                }
                log(format!("partition {k} link(s) with {fault:?}"));
            }
            30..38 => {
                let conv = format!("c{}", rng.random_range(0..CONVERSATIONS));
                let kind = if rng.random_bool(0.5) { "hold" } else { "pause" };
                if c.hub.cli(["fence", kind, "--conversation", &conv, "--reason", "soak"]).is_ok() {
                    log(format!("fence {kind} {conv}"));
                    f.fences += 1;
                }
            }
            38..44 => {
                let _ = c.lift_all_fences();
            }
            44..52 if cfg.turn_control => {
                if let Some(id) = cancel_candidate(&c, &mut rng) {
                    // A refusal (the delivery ended meanwhile, the hub is down) is no fault.
                    if c.hub.cli(["deliveries", "cancel", &id, "--reason", "soak"]).is_ok() {
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
    c.hub.kill()?;
    for n in &mut c.nodes {
        n.proc_mut().kill()?;
    }
    let report = checker::check(&c.inputs(true))?;
    f.accepted = counters.accepted.load(Ordering::SeqCst);
    f.duplicate_submissions = counters.duplicates.load(Ordering::SeqCst);
    f.executions = report.counts.get("effects").copied().unwrap_or(0);
    f.ordered_executions = report.counts.get("ordered_effects").copied().unwrap_or(0);
    f.reruns = report.counts.get("reruns").copied().unwrap_or(0);
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

/// Faults in progress: restarts, resumes and heals that are due later. Index `nodes.len()` is
/// the hub.
struct Nemesis {
    restart_at: Vec<Option<Instant>>,
    paused: Vec<Option<(u32, Instant)>>,
    heal_at: Vec<(usize, Instant)>,
}

impl Nemesis {
    fn new(nodes: usize) -> Nemesis {
        Nemesis { restart_at: vec![None; nodes + 1], paused: vec![None; nodes + 1], heal_at: Vec::new() }
    }

    /// Resumes, heals and restarts whatever is due.
    fn settle(&mut self, c: &mut Cluster, addr: &Mutex<Option<SocketAddr>>) -> anyhow::Result<()> {
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
        self.heal_at.retain(|&(i, at)| {
            if at <= now {
                c.proxies[i].heal();
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
        tend(c, addr, &down)
    }

    /// Ends every fault now: resumes, heals, restarts.
    fn heal_all(&mut self, c: &mut Cluster, addr: &Mutex<Option<SocketAddr>>) -> anyhow::Result<()> {
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
        for p in &c.proxies {
            p.heal();
        }
        self.settle(c, addr)
    }
}

/// Restarts whatever died (except those still meant to be down) and keeps the producers' view
/// of the hub address current.
fn tend(c: &mut Cluster, addr: &Mutex<Option<SocketAddr>>, down: &[bool]) -> anyhow::Result<()> {
    let hub_down = down.last().copied().unwrap_or(false);
    if !hub_down && !c.hub.proc_mut().running() {
        c.start_hub(None)?;
        if let Ok(mut a) = addr.lock() {
            *a = c.hub.addr();
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
    let conn = crate::checker::open_read_only(&c.hub.db()).ok()?;
    let mut stmt = conn
        .prepare(
            "SELECT id FROM deliveries d WHERE state = 'queued'
                OR (state = 'delivered'
                    AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id AND a.attempt = d.attempt))
             ORDER BY n DESC LIMIT 50",
        )
        .ok()?;
    let ids: Vec<String> = stmt.query_map([], |r| r.get(0)).ok()?.collect::<Result<_, _>>().ok()?;
    (!ids.is_empty()).then(|| ids[rng.random_range(0..ids.len())].clone())
}

/// What one producer task submits.
#[derive(Debug, Clone, Copy)]
struct Workload {
    index: usize,
    seed: u64,
    turn_control: bool,
}

async fn produce(
    producer: Arc<crate::cluster::Producer>,
    addr: Arc<Mutex<Option<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    work: Workload,
) {
    let Workload { index, seed, turn_control } = work;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut done: Vec<(String, String, serde_json::Value, Vec<String>, Retries)> = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let replay = !done.is_empty() && rng.random_bool(0.2);
        let (key, conv, payload, to, retries) = if replay {
            done[rng.random_range(0..done.len())].clone()
        } else {
            i += 1;
            let mut to: Vec<String> = HOSTS.iter().filter(|_| rng.random_bool(0.5)).map(|h| h.to_string()).collect();
            if to.is_empty() {
                to.push(HOSTS[rng.random_range(0..HOSTS.len())].to_string());
            }
            let mut payload = serde_json::json!({"p": index, "i": i});
            let mut retries = Retries::default();
            if turn_control && rng.random_range(0..100u32) < RETRYABLE_PERCENT {
                payload[RETRY_FIRST_RUN] = true.into();
                retries = Retries {
                    max_attempts: Some(TURN_CONTROL_MAX_ATTEMPTS),
                    retry_backoff_ms: Some(TURN_CONTROL_BACKOFF_MS),
                };
            }
            if turn_control && rng.random_range(0..100u32) < SLOW_PERCENT {
                payload[SLOW] = true.into();
            }
            (format!("p{index}-{seed}-{i}"), format!("c{}", rng.random_range(0..CONVERSATIONS)), payload, to, retries)
        };
        if replay {
            counters.duplicates.fetch_add(1, Ordering::Relaxed);
        }
        for _ in 0..50 {
            if stop.load(Ordering::SeqCst) && !replay {
                break;
            }
            let hub = addr.lock().ok().and_then(|a| *a);
            match producer.accept_with(hub, &conv, &key, &payload, &to, retries).await {
                AcceptOutcome::Ok(_) => {
                    if !replay {
                        counters.accepted.fetch_add(1, Ordering::Relaxed);
                        done.push((key.clone(), conv.clone(), payload.clone(), to.clone(), retries));
                        // Offer a steady load the cluster can drain while it is being killed, so
                        // the liveness check after heal measures recovery, not a backlog.
                        tokio::time::sleep(PRODUCER_PACE).await;
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
