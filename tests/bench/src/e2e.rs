//! Step 2: end-to-end passes against the real hub and K real nodes.
//!
//! A pass starts fresh nodes (new data directories, so new instances), waits until each has
//! bound its host with a first claim, then C producer tasks submit N messages, each to one
//! host round-robin, over many conversations per host so each node can run turns in parallel.
//! A pool pass sends the same messages, in the same conversations, to one pool of every host
//! instead (`pools`, no `to`), so any member's claim may take each of them.
//! Producers either go as fast as the hub answers or follow a fixed schedule (`rate_per_s`),
//! and send either one message per request (`POST /v1/messages`) or batches of
//! `submit_batch` messages (`POST /v1/batch/messages`).
//! Each hub's PostgreSQL round trips and statements (its `/metrics` counters) are read before
//! and after the pass.
//! When every delivery's report is in, the figures are read from the hub's database: accept
//! time (`messages.accepted_at`), claim time (the `claimed` event) and report time
//! (`attempts.reported_at`), all unix milliseconds from the hub's one clock.

use crate::cluster::{self, NodeSettings};
use crate::procfs;
use crate::stats::{self, Summary};
use anyhow::{Context, bail};
use baton_client::Client;
use baton_hub::store::engine::Db;
use baton_shared::wire::{BatchSubmitRequest, SubmitRequest};
use baton_testkit::{Binaries, Hub, Node};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A pass with no new report for this long is declared stuck.
const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How often the hub database is polled for reports.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// The producer every benchmark message is submitted as.
pub const PRODUCER: &str = "bench";
/// The pool of every host that the pool pass addresses.
pub const POOL: &str = "bench-pool";

/// What one pass does.
#[derive(Debug, Clone)]
pub struct Pass {
    /// Short lowercase name; prefixes idempotency keys and conversations, so each pass's
    /// messages can be found again.
    pub name: String,
    /// How many messages.
    pub messages: usize,
    /// Submit on a fixed schedule at this many messages per second; `None` for as fast as
    /// the hub accepts.
    pub rate_per_s: Option<f64>,
    /// Conversations per host.
    pub convs_per_host: usize,
    /// Messages per submit request: 1 sends each with `POST /v1/messages`, more sends them in
    /// batches of this many with `POST /v1/batch/messages` (at most `BATCH_ITEMS_MAX`).
    pub submit_batch: usize,
    /// How each node is configured.
    pub node: NodeSettings,
    /// Address every message to this pool instead of to one host by name (the conversations
    /// stay those of the host-addressed pass).
    pub pool: Option<String>,
}

/// What one pass measured.
#[derive(Debug, Clone)]
pub struct PassResult {
    /// Messages the hub accepted (201).
    pub accepted: usize,
    /// Submissions refused or failed.
    pub errors: usize,
    /// The first refusal or failure, if any.
    pub first_error: Option<String>,
    /// Accepted messages per second, from the first submit to the last accept answer.
    pub accepted_per_s: f64,
    /// Deliveries reported per second, from the first submit to the last report committed.
    pub e2e_deliveries_per_s: f64,
    /// Deliveries reported.
    pub deliveries: usize,
    /// From accept to the claim that took it, milliseconds.
    pub accept_to_claim: Option<Summary>,
    /// From accept to its attempt report, milliseconds.
    pub accept_to_report: Option<Summary>,
    /// Hub CPU seconds used during the pass.
    pub hub_cpu_s: f64,
    /// CPU seconds used by all nodes together during the pass (harness children not included).
    pub nodes_cpu_s: f64,
    /// CPU seconds used by this benchmark process (producers, polling) during the pass.
    pub bench_cpu_s: f64,
    /// CPU seconds used by the PostgreSQL server's process tree during the pass, when the
    /// record is there and the server runs on this machine.
    pub db_cpu_s: Option<f64>,
    /// Progress events the hub kept for the pass's turns.
    pub progress_events: usize,
    /// `POST /v1/running` requests the first hub answered during the pass (the nodes'
    /// renewals, progress included), read from its `/metrics`; `None` when they could not be read.
    pub running_requests: Option<f64>,
    /// Round trips every hub made to PostgreSQL during the pass, and the statements sent in
    /// them (`baton_hub_postgres_round_trips_total`, `_statements_total`, from each hub's
    /// `/metrics`); `None` on SQLite or when a hub's metrics could not be read.
    pub db_round_trips: Option<f64>,
    /// See `db_round_trips`.
    pub db_statements: Option<f64>,
    /// Deliveries reported per host that ran them, busiest first: how a pool pass spread its
    /// work over the members (a host-addressed pass spreads it evenly by construction).
    pub per_host: Vec<usize>,
}

impl PassResult {
    /// CPU seconds per 1,000 deliveries for `cpu_s`.
    pub fn per_1k(&self, cpu_s: f64) -> f64 {
        if self.deliveries == 0 { f64::NAN } else { cpu_s / self.deliveries as f64 * 1000.0 }
    }
}

/// The hosts' nodes for one pass; stopped (and reaped) when dropped.
struct Nodes(Vec<Node>);

/// The running system a pass drives.
pub struct Rig<'a> {
    /// Runs the producers.
    pub rt: &'a tokio::runtime::Runtime,
    /// The binaries (for the nodes).
    pub bins: &'a Binaries,
    /// The running hubs (one, or several on one PostgreSQL record): the first holds the
    /// identities and, on SQLite, the database the figures are read from.
    pub hubs: &'a [Hub],
    /// Each hub's base URL, `https://127.0.0.1:PORT`, in the order of `hubs`.
    pub urls: &'a [String],
    /// The enrolled hosts, one node each.
    pub hosts: &'a [String],
    /// One client (its own connections) per producer task.
    pub producers: &'a [Client],
    /// Where node data directories, configs and logs go.
    pub work_dir: &'a Path,
    /// The hub's record in PostgreSQL, when it is there (the figures are read from it).
    pub database_url: Option<&'a str>,
}

/// Runs one pass: fresh nodes, producers, wait for every report, read the figures.
pub fn run_pass(rig: &Rig<'_>, pass: &Pass) -> anyhow::Result<PassResult> {
    let Rig { rt, bins, hubs, urls, hosts, producers, work_dir, database_url } = *rig;
    let hub = &hubs[0];
    let clk = procfs::clock_ticks();
    let db: Box<dyn Db> = match database_url {
        None => Box::new(baton_hub::store::open_read(&hub.db()).context("opening the hub database read-only")?),
        Some(u) => {
            Box::new(baton_hub::store::engine::PgConn::connect(&baton_hub::store::engine::postgres::PgUrl::parse(u)?)?)
        }
    };
    let db = &*db;
    let dir = work_dir.join(format!("nodes-{}", pass.name));
    let started_ms = baton_shared::clock::system_now_ms();
    let mut nodes = Nodes(
        hosts
            .iter()
            .enumerate()
            .map(|(i, h)| cluster::start_node(bins, hub, &preferring(urls, i), h, &dir, &pass.node))
            .collect::<anyhow::Result<_>>()?,
    );
    wait_bound(db, &mut nodes, hosts, started_ms)?;
    let base_attempts = count_attempts(db)?;
    let cpu = |pid: Option<u32>| procfs::sample(pid.context("a process is not running")?, clk).map(|s| s.cpu_s);
    let node_cpu = |nodes: &Nodes| -> anyhow::Result<f64> { nodes.0.iter().map(|n| cpu(n.proc().pid())).sum() };
    let hubs_cpu = || -> anyhow::Result<f64> { hubs.iter().map(|h| cpu(h.proc().pid())).sum() };
    // The database server's processes, when the record is in PostgreSQL on this machine.
    // The database server, when it runs on this machine: the postmaster is the parent of the
    // backend serving this connection, and its process tree is the server (other servers on
    // the machine are not counted).
    let postmaster = match database_url {
        Some(_) => db
            .query_row("SELECT pg_backend_pid()", [], |r| r.get::<_, i64>(0))
            .ok()
            .and_then(|pid| procfs::parent_of(u32::try_from(pid).ok()?)),
        None => None,
    };
    let db_cpu = || postmaster.and_then(|pid| procfs::cpu_s_of_tree(pid, clk));
    let (hub0, nodes0, bench0, db0) = (hubs_cpu()?, node_cpu(&nodes)?, cpu(Some(std::process::id()))?, db_cpu());
    let running0 = running_requests(hub);
    let pg_counters = || {
        let each: Option<Vec<(f64, f64)>> = hubs
            .iter()
            .map(|h| {
                let body = scrape(h)?;
                Some((
                    counter(&body, "baton_hub_postgres_round_trips_total")?,
                    counter(&body, "baton_hub_postgres_statements_total")?,
                ))
            })
            .collect();
        each.map(|v| v.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y)))
    };
    let pg0 = pg_counters();

    let t0_ms = baton_shared::clock::system_now_ms();
    let tally = rt.block_on(submit_all(pass, hosts, producers))?;
    if tally.ok == 0 {
        bail!("pass {}: the hub accepted nothing; first error: {}", pass.name, tally.first_error.unwrap_or_default());
    }
    wait_reported(db, &mut nodes, base_attempts, tally.ok)?;
    let (hub1, nodes1, bench1, db1) = (hubs_cpu()?, node_cpu(&nodes)?, cpu(Some(std::process::id()))?, db_cpu());
    let running1 = running_requests(hub);
    let pg1 = pg_counters();
    drop(nodes);
    let progress_events = db.query_row(
        "SELECT count(*) FROM progress_events p JOIN deliveries d ON d.id = p.delivery_id
         JOIN messages m ON m.id = d.message_id WHERE m.producer = $1 AND m.idempotency_key LIKE $2",
        rusqlite::params![PRODUCER, format!("{}-%", pass.name)],
        |r| r.get::<_, i64>(0),
    )? as usize;

    let per_host = per_host(db, &pass.name)?;
    let rows = latencies(db, &pass.name)?;
    let last_report_ms = rows.iter().filter_map(|r| r.2).max().unwrap_or(t0_ms);
    let deliveries = rows.iter().filter(|r| r.2.is_some()).count();
    let e2e_s = ((last_report_ms - t0_ms) as f64 / 1000.0).max(1e-3);
    let to_claim = rows.iter().filter_map(|(a, c, _)| c.map(|c| (c - a) as f64)).collect();
    let to_report = rows.iter().filter_map(|(a, _, r)| r.map(|r| (r - a) as f64)).collect();
    Ok(PassResult {
        accepted: tally.ok,
        errors: tally.errors,
        first_error: tally.first_error,
        accepted_per_s: tally.ok as f64 / tally.accept_s.max(1e-3),
        e2e_deliveries_per_s: deliveries as f64 / e2e_s,
        deliveries,
        accept_to_claim: stats::summarize(to_claim),
        accept_to_report: stats::summarize(to_report),
        hub_cpu_s: hub1 - hub0,
        nodes_cpu_s: nodes1 - nodes0,
        bench_cpu_s: bench1 - bench0,
        db_cpu_s: db0.zip(db1).map(|(a, b)| b - a),
        progress_events,
        running_requests: running0.zip(running1).map(|(a, b)| b - a),
        db_round_trips: pg0.zip(pg1).map(|(a, b)| b.0 - a.0),
        db_statements: pg0.zip(pg1).map(|(a, b)| b.1 - a.1),
        per_host,
    })
}

/// The `POST /v1/running` requests `hub` answered so far, from its operator listener's
/// `/metrics` (`baton_hub_http_requests_total` of that route, every status); `None` when the
/// listener is off or does not answer.
fn running_requests(hub: &Hub) -> Option<f64> {
    Some(
        scrape(hub)?
            .lines()
            .filter(|l| l.starts_with("baton_hub_http_requests_total{") && l.contains("route=\"/v1/running\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    )
}

/// `hub`'s `/metrics` page from its operator listener; `None` when the listener is off or does
/// not answer.
fn scrape(hub: &Hub) -> Option<String> {
    use std::io::{Read as _, Write as _};
    let addr = std::fs::read_to_string(hub.data_dir().join("operator.addr")).ok()?;
    let addr = addr.trim();
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    // HTTP/1.0: the answer is not chunked, so no metric line is split.
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// The value of the unlabelled counter `name` on a `/metrics` page; `None` when it is not there
/// (never counted: a hub on SQLite has no PostgreSQL round trips).
fn counter(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The hub list node `i` is given: every hub, starting with hub `i mod n`, so the nodes spread
/// over the hubs and each falls back to the others.
fn preferring(urls: &[String], i: usize) -> String {
    let n = urls.len().max(1);
    (0..urls.len()).map(|k| urls[(i + k) % n].as_str()).collect::<Vec<_>>().join(",")
}

/// Waits until every host is bound to an instance that claimed after `since_ms`; fails at
/// once when a node exits.
fn wait_bound(db: &dyn Db, nodes: &mut Nodes, hosts: &[String], since_ms: i64) -> anyhow::Result<()> {
    let what = format!("all {} nodes to claim", hosts.len());
    baton_testkit::wait::until(&what, cluster::NODE_START_TIMEOUT, || {
        let mut bound = 0;
        for h in hosts {
            let since: Option<i64> =
                db.query_row("SELECT instance_since FROM hosts WHERE name = $1", [h], |r| r.get(0))?;
            bound += usize::from(since.is_some_and(|s| s >= since_ms));
        }
        for n in &mut nodes.0 {
            n.proc_mut().check_running()?;
        }
        Ok((bound == hosts.len()).then_some(()))
    })
}

fn count_attempts(db: &dyn Db) -> anyhow::Result<usize> {
    Ok(db.query_row("SELECT count(*) FROM attempts", [], |r| r.get::<_, i64>(0))? as usize)
}

/// Waits until `expected` new attempts are recorded, failing when progress stops.
fn wait_reported(db: &dyn Db, nodes: &mut Nodes, base: usize, expected: usize) -> anyhow::Result<()> {
    let mut last = (0usize, Instant::now());
    loop {
        let done = count_attempts(db)?.saturating_sub(base);
        if done >= expected {
            return Ok(());
        }
        if done != last.0 {
            last = (done, Instant::now());
        } else if last.1.elapsed() > STALL_TIMEOUT {
            bail!("stuck: {done} of {expected} deliveries reported, none in the last {STALL_TIMEOUT:?}");
        }
        for n in &mut nodes.0 {
            n.proc_mut().check_running()?;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// (accepted_at, first claimed event, first report) of every delivery of a pass's messages.
type LatencyRow = (i64, Option<i64>, Option<i64>);

fn latencies(db: &dyn Db, pass: &str) -> anyhow::Result<Vec<LatencyRow>> {
    let mut stmt = db.prepare(
        "SELECT m.accepted_at,
                (SELECT min(e.at) FROM delivery_events e WHERE e.delivery_id = d.id AND e.to_state = 'claimed'),
                (SELECT min(a.reported_at) FROM attempts a WHERE a.delivery_id = d.id)
         FROM messages m JOIN deliveries d ON d.message_id = m.id
         WHERE m.producer = $1 AND m.idempotency_key LIKE $2",
    )?;
    let rows = stmt
        .query_map(rusqlite::params![PRODUCER, format!("{pass}-%")], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// The deliveries of a pass's messages that were reported, counted per host, busiest first.
fn per_host(db: &dyn Db, pass: &str) -> anyhow::Result<Vec<usize>> {
    let mut stmt = db.prepare(
        "SELECT count(*) FROM messages m JOIN deliveries d ON d.message_id = m.id
         WHERE m.producer = $1 AND m.idempotency_key LIKE $2
           AND EXISTS (SELECT 1 FROM attempts a WHERE a.delivery_id = d.id)
         GROUP BY d.host ORDER BY count(*) DESC",
    )?;
    let counts = stmt
        .query_map(rusqlite::params![PRODUCER, format!("{pass}-%")], |r| r.get::<_, i64>(0))?
        .collect::<Result<Vec<i64>, _>>()?;
    Ok(counts.into_iter().map(|n| n as usize).collect())
}

/// What the producers got back.
#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    errors: usize,
    first_error: Option<String>,
    accept_s: f64,
}

/// Submits every message of the pass from one task per producer client.
async fn submit_all(pass: &Pass, hosts: &[String], producers: &[Client]) -> anyhow::Result<Tally> {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in producers {
        let (client, next, pass, hosts) = (client.clone(), next.clone(), pass.clone(), hosts.to_vec());
        tasks.spawn(async move { produce(client, next, pass, hosts, start).await });
    }
    let mut tally = Tally::default();
    let mut last_ok = start;
    while let Some(r) = tasks.join_next().await {
        let (t, last) = r.context("a producer task failed")?;
        tally.ok += t.ok;
        tally.errors += t.errors;
        tally.first_error = tally.first_error.or(t.first_error);
        last_ok = last_ok.max(last);
    }
    tally.accept_s = (last_ok - start).as_secs_f64();
    Ok(tally)
}

/// One producer: takes the next `submit_batch` message numbers until all are taken, and sends
/// them in one request (on a schedule, not before the last of them is due).
async fn produce(
    client: Client,
    next: Arc<AtomicUsize>,
    pass: Pass,
    hosts: Vec<String>,
    start: Instant,
) -> (Tally, Instant) {
    let mut tally = Tally::default();
    let mut last_ok = start;
    let batch = pass.submit_batch.max(1);
    loop {
        let first = next.fetch_add(batch, Ordering::Relaxed);
        if first >= pass.messages {
            return (tally, last_ok);
        }
        let numbers = first..(first + batch).min(pass.messages);
        if let Some(rate) = pass.rate_per_s {
            let due = (numbers.end - 1) as f64 / rate;
            tokio::time::sleep_until((start + Duration::from_secs_f64(due)).into()).await;
        }
        let messages: Vec<SubmitRequest> = numbers.clone().map(|i| message(&pass, &hosts, i)).collect();
        let answers = if pass.submit_batch > 1 {
            submit_batch(&client, messages).await
        } else {
            let n = messages.len();
            let mut answers = Vec::with_capacity(n);
            for m in messages {
                answers.push(submit_one(&client, &m).await);
            }
            answers
        };
        for answer in answers {
            match answer {
                Ok(()) => {
                    tally.ok += 1;
                    last_ok = Instant::now();
                }
                Err(e) => {
                    tally.errors += 1;
                    tally.first_error.get_or_insert(e);
                }
            }
        }
    }
}

/// Message number `i` of a pass: to one host round-robin, in one of its conversations; in a
/// pool pass, the same conversation, to the pool.
fn message(pass: &Pass, hosts: &[String], i: usize) -> SubmitRequest {
    let k = hosts.len();
    let (to, pools) = match &pass.pool {
        None => (Some(vec![hosts[i % k].clone()]), None),
        Some(pool) => (None, Some(vec![pool.clone()])),
    };
    SubmitRequest {
        conversation: format!("{}-{}-{}", pass.name, i % k, (i / k) % pass.convs_per_host),
        idempotency_key: format!("{}-{i}", pass.name),
        payload: serde_json::json!({ "i": i }).into(),
        to,
        pools,
        max_attempts: None,
        retry_backoff_ms: None,
        approval: None,
        approval_timeout_ms: None,
        deadline_ms: None,
        stall_ms: None,
    }
}

/// `POST /v1/messages`: accepted anew (201) or why not.
async fn submit_one(client: &Client, body: &SubmitRequest) -> Result<(), String> {
    match client.submit(body).await {
        Ok(r) => new_message(&r),
        Err(e) => Err(e.to_string()),
    }
}

/// `POST /v1/batch/messages`: per message, accepted anew (201) or why not; a batch refused or
/// lost whole is every message's error.
async fn submit_batch(client: &Client, messages: Vec<SubmitRequest>) -> Vec<Result<(), String>> {
    let n = messages.len();
    match client.submit_batch(&BatchSubmitRequest { messages }).await {
        Ok(answers) => answers
            .into_iter()
            .map(|answer| match answer {
                Ok(r) => new_message(&r),
                Err(e) => Err(e.to_string()),
            })
            .collect(),
        Err(e) => (0..n).map(|_| Err(e.to_string())).collect(),
    }
}

/// Only a message accepted anew counts: every benchmark key is used once, so a replay means a
/// key was sent twice.
fn new_message(r: &baton_shared::wire::SubmitResponse) -> Result<(), String> {
    if r.duplicate { Err(format!("200: message {} is a replay, not a new message", r.message_id)) } else { Ok(()) }
}
