//! Step 3: the cost of one claim against a backlog of queued deliveries for one host, and
//! against the same backlog queued in a pool whose one member claims it.
//!
//! The backlog is prefilled through the hub's own store code (`accept_and_fan_out`, in big
//! transactions) into a hub data directory made by the real CLI, and grown size by size. At
//! each size a claim of one delivery is timed two ways: in-process, calling
//! `baton_hub::store::lifecycle::claim::claim` inside one write transaction that is rolled back (so the
//! backlog is not consumed; the commit is not timed), and through the real hub process
//! (`POST /v1/claims`, max 1, no wait; durable commit included).
//!
//! A pool's backlog is the same messages, in the same conversations, addressed to a pool
//! (`pools` instead of `to`) that the claiming host is the one member of, made in its own data
//! directory (`store::registry::pools::add` before the prefill): the claim then walks the
//! pool's conversation queues, not the host's.
//!
//! The prefill connection alone runs with `synchronous=OFF`: a crash during the prefill would
//! only lose benchmark data, and it keeps a 1M prefill to seconds. The hub itself opens the
//! database with `synchronous=FULL` as always.

use crate::cluster;
use crate::procfs;
use crate::stats::{self, Summary};
use anyhow::{Context, bail};
use baton_client::NodeClient;
use baton_hub::store::lifecycle::accept::{self, AcceptLimits, Accepted, NewMessage};
use baton_hub::store::registry::pools;
use baton_hub::store::{self, in_write_txn, lifecycle::claim};
use baton_shared::sqlite::Synchronous;
use baton_testkit::Binaries;
use rusqlite::Connection;
use std::path::Path;
use std::time::{Duration, Instant};

/// Messages accepted and fanned out per prefill transaction.
const PREFILL_TXN_MESSAGES: usize = 20_000;
/// Conversations the backlog is spread over.
const PREFILL_CONVERSATIONS: usize = 1_000;
/// Claims made and not timed before the timed ones (caches, connection setup).
const WARMUP_CLAIMS: usize = 10;
/// The one host the backlog is queued for (by name, or as the pool's one member).
const HOST: &str = "backlog-host";
/// The pool a pool backlog is queued in.
const POOL: &str = "backlog-pool";
/// The node instance that claims.
const INSTANCE: &str = "bench-backlog-instance";

/// Where a backlog waits, and the claim that takes from it looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// The host's own queue: every message addressed to the host by name.
    Host,
    /// A pool's queue: every message addressed to a pool the host is the one member of.
    Pool,
}

/// Whom a prefilled message is addressed to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Recipient<'a> {
    /// One host, by name (`to`).
    Host(&'a str),
    /// One pool (`pools`).
    Pool(&'a str),
}

/// The figures at one backlog size.
#[derive(Debug, Clone)]
pub struct BacklogPoint {
    /// Queued deliveries before the timed claims.
    pub size: usize,
    /// Seconds the prefill up to this size took (from the previous size).
    pub prefill_s: f64,
    /// In-process claim of one, milliseconds (no commit).
    pub inproc_ms: Summary,
    /// `POST /v1/claims` of one through the real hub, milliseconds (durable commit included).
    pub hub_ms: Summary,
    /// Seconds from starting the hub on this database to it listening.
    pub hub_start_s: f64,
    /// The hub's peak RSS (VmHWM) after the claims, bytes.
    pub hub_peak_rss_bytes: u64,
}

/// Prefills `sizes` (ascending) in turn, in `queue`, and times `claims` claims of one at each.
pub fn run(
    rt: &tokio::runtime::Runtime,
    bins: &Binaries,
    root: &Path,
    sizes: &[usize],
    claims: usize,
    queue: Queue,
) -> anyhow::Result<Vec<BacklogPoint>> {
    let mut hub = cluster::create_hub(bins, root, &[HOST.to_string()], &[], None)?;
    let conn = store::open_write(&hub.db(), Synchronous::Normal).context("opening the backlog database")?;
    conn.execute_batch("PRAGMA synchronous = OFF")?;
    let sync: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
    if sync != 0 {
        bail!("the prefill connection reads back synchronous = {sync}, expected 0 (off)");
    }
    if queue == Queue::Pool {
        let now = baton_shared::clock::system_now_ms();
        in_write_txn(&conn, |c| pools::add(c, POOL, &[HOST.to_string()], "bench", "benchmark backlog", now))
            .context("making the backlog pool")?;
    }
    let clk = procfs::clock_ticks();
    let mut filled = 0;
    let mut points = Vec::new();
    for &size in sizes {
        let place = match queue {
            Queue::Host => "",
            Queue::Pool => " in a pool",
        };
        eprintln!("baton-bench: backlog: prefilling to {size} queued deliveries{place}");
        let started = Instant::now();
        prefill(&conn, filled, size, queue)?;
        let prefill_s = started.elapsed().as_secs_f64();
        filled = size;
        let inproc_ms = claim_in_process(&conn, claims)?;
        let (url, hub_start_s) = cluster::start_hub(&mut hub)?;
        let node = cluster::client(&hub, &url, HOST)?.node(INSTANCE);
        let hub_ms = rt.block_on(claim_over_http(&node, claims))?;
        let pid = hub.proc().pid().context("the backlog hub is not running")?;
        let hub_peak_rss_bytes = procfs::sample(pid, clk)?.peak_rss_bytes;
        let status = hub.proc_mut().stop(cluster::STOP_GRACE)?.context("the backlog hub never ran")?;
        if !status.success() {
            bail!("the backlog hub exited with {status}");
        }
        // The hub's claims consumed some of the backlog; the next size tops it up again.
        filled -= WARMUP_CLAIMS + claims;
        points.push(BacklogPoint { size, prefill_s, inproc_ms, hub_ms, hub_start_s, hub_peak_rss_bytes });
    }
    Ok(points)
}

/// Accepts and fans out messages `from..to` for the backlog host, by name or in its pool.
fn prefill(conn: &Connection, from: usize, to: usize, queue: Queue) -> anyhow::Result<()> {
    let (recipient, count) = match queue {
        Queue::Host => (Recipient::Host(HOST), "SELECT count(*) FROM deliveries WHERE host = ?1 AND state = 'queued'"),
        Queue::Pool => (Recipient::Pool(POOL), "SELECT count(*) FROM deliveries WHERE pool = ?1 AND state = 'queued'"),
    };
    let key = match recipient {
        Recipient::Host(h) | Recipient::Pool(h) => h,
    };
    accept_range(conn, from..to, "bench", recipient, |n| {
        (format!("backlog-{}", n % PREFILL_CONVERSATIONS), format!("backlog-{n}-{}", uuid::Uuid::new_v4().simple()))
    })?;
    let queued: i64 = conn.query_row(count, [key], |r| r.get(0))?;
    if queued as usize != to {
        bail!("the backlog holds {queued} queued deliveries, expected {to}");
    }
    Ok(())
}

/// Accepts and fans out one message per `n` in `range` from `producer` to `recipient` through
/// the hub's own store functions, `PREFILL_TXN_MESSAGES` to a transaction; `name(n)` gives its
/// conversation and idempotency key. The benchmark's backlog and fairness steps both fill their
/// queues with it.
pub(crate) fn accept_range(
    conn: &Connection,
    range: std::ops::Range<usize>,
    producer: &str,
    recipient: Recipient<'_>,
    name: impl Fn(usize) -> (String, String),
) -> anyhow::Result<()> {
    let (to, to_pools) = match recipient {
        Recipient::Host(host) => (vec![host.to_string()], Vec::new()),
        Recipient::Pool(pool) => (Vec::new(), vec![pool.to_string()]),
    };
    let limits = AcceptLimits { queued_per_host_max: u64::MAX, queued_per_pool_max: u64::MAX };
    let mut i = range.start;
    while i < range.end {
        let end = (i + PREFILL_TXN_MESSAGES).min(range.end);
        in_write_txn(conn, |c| {
            let now = baton_shared::clock::system_now_ms();
            for n in i..end {
                let (conversation, idempotency_key) = name(n);
                let msg = NewMessage {
                    traceparent: None,
                    producer: producer.into(),
                    conversation,
                    idempotency_key,
                    payload: format!("{{\"i\":{n}}}"),
                    to: to.clone(),
                    pools: to_pools.clone(),
                };
                // As the hub accepts a post: fanned out in the accept's own transaction.
                let (Accepted::New { .. }, _) =
                    accept::accept_and_fan_out(c, &msg, accept::RetryPolicy::default(), limits, now)?
                else {
                    return Err(store::StoreError::Invalid("a fresh key was taken as a duplicate".into()));
                };
            }
            Ok(())
        })?;
        i = end;
    }
    Ok(())
}

/// Times `claims` in-process claims of one inside one write transaction, then rolls it back.
fn claim_in_process(conn: &Connection, claims: usize) -> anyhow::Result<Summary> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let timed = (|| -> anyhow::Result<Vec<f64>> {
        let mut ms = Vec::with_capacity(claims);
        for k in 0..WARMUP_CLAIMS + claims {
            let started = Instant::now();
            let got = claim::claim(conn, HOST, INSTANCE, 1, baton_shared::clock::system_now_ms())?;
            let elapsed = started.elapsed().as_secs_f64() * 1000.0;
            if got.len() != 1 {
                bail!("an in-process claim returned {} deliveries, expected 1", got.len());
            }
            if k >= WARMUP_CLAIMS {
                ms.push(elapsed);
            }
        }
        Ok(ms)
    })();
    conn.execute_batch("ROLLBACK")?;
    stats::summarize(timed?).context("no claim was timed")
}

/// Times `claims` claims of one through `POST /v1/claims`. `NodeClient::claim` sends exactly the
/// request a node's claim is (no session opened, `max` 1, no wait) and only encodes it and
/// decodes the answer, as a raw request would, so the time is the endpoint's.
async fn claim_over_http(node: &NodeClient, claims: usize) -> anyhow::Result<Summary> {
    let mut ms = Vec::with_capacity(claims);
    for k in 0..WARMUP_CLAIMS + claims {
        let started = Instant::now();
        let got = node.claim(1, Duration::ZERO).await.context("POST /v1/claims")?;
        let elapsed = started.elapsed().as_secs_f64() * 1000.0;
        if got.deliveries.len() != 1 {
            bail!("a claim returned {} deliveries, expected 1", got.deliveries.len());
        }
        if k >= WARMUP_CLAIMS {
            ms.push(elapsed);
        }
    }
    stats::summarize(ms).context("no claim was timed")
}
