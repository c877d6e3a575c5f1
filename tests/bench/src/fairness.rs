//! Step 2b: fairness across conversations on one host. A heavy conversation's backlog is
//! queued for one host (prefilled through the hub's own store code before the hub starts,
//! like step 3), then the hub and a node with the no-op harness start and the heavy backlog
//! drains while one producer submits a light conversation's messages one at a time. The
//! figure is the p99 of the light messages' accept→report time, from the hub's timestamps
//! (`messages.accepted_at`, `attempts.reported_at`), plus how much of the heavy backlog was
//! still waiting when the last light message was reported.

use crate::cluster::{self, NodeSettings};
use crate::stats::{self, Summary};
use anyhow::{Context, bail};
use baton_client::Client;
use baton_hub::store;
use baton_shared::sqlite::Synchronous;
use baton_shared::wire::SubmitRequest;
use baton_testkit::{Binaries, Harness};
use rusqlite::Connection;
use std::path::Path;
use std::time::{Duration, Instant};

/// The one host both conversations are routed to.
const HOST: &str = "fair-host";
/// The producer every message is submitted as.
const PRODUCER: &str = "bench-fair";
/// The heavy conversation.
const HEAVY: &str = "fair-heavy";
/// The light conversation.
const LIGHT: &str = "fair-light";
/// The gap between two light messages (one producer, one at a time).
const LIGHT_GAP: Duration = Duration::from_millis(20);
/// How long the light messages may take to be reported before the step fails.
const LIGHT_WAIT: Duration = Duration::from_secs(300);
/// How often the hub database is polled for reports.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// What the step measured.
#[derive(Debug, Clone)]
pub struct FairnessResult {
    /// Accept→report of the light conversation's messages, milliseconds.
    pub light_accept_to_report_ms: Summary,
    /// The share (0..=1) of the heavy backlog not yet reported when the last light message was.
    pub heavy_left_share: f64,
}

/// The node of this step: the no-op harness, batches of eight, the run's other node settings.
pub fn node_settings(parallel_conversations: u32, handoff: &str, handoffs_in_flight: Option<u32>) -> NodeSettings {
    NodeSettings {
        harness: Harness::Noop,
        parallel_conversations,
        claim_batch_max: 8,
        handoff: handoff.to_string(),
        handoffs_in_flight,
        otlp_endpoint: None,
    }
}

/// Runs the step: `heavy` queued turns, `light` turns submitted while they drain, on one node
/// set as `node` says (`node_settings`).
pub fn run(
    rt: &tokio::runtime::Runtime,
    bins: &Binaries,
    root: &Path,
    heavy: usize,
    light: usize,
    node: &NodeSettings,
) -> anyhow::Result<FairnessResult> {
    std::fs::create_dir_all(root)?;
    let mut hub = cluster::create_hub(bins, root, &[HOST.to_string()], &[PRODUCER], None)?;
    prefill(&hub.db(), heavy)?;
    let (url, _) = cluster::start_hub(&mut hub)?;
    let client = cluster::client(&hub, &url, PRODUCER)?;
    let mut node = cluster::start_node(bins, &hub, &url, HOST, &root.join("nodes"), node)?;
    rt.block_on(submit_light(&client, light))?;
    let db = store::open_read(&hub.db()).context("opening the hub database")?;
    let started = Instant::now();
    let heavy_done = loop {
        let (light_done, heavy_done) = reported(&db)?;
        if light_done >= light {
            break heavy_done;
        }
        if started.elapsed() > LIGHT_WAIT {
            bail!("only {light_done} of {light} light messages were reported within {LIGHT_WAIT:?}");
        }
        node.proc_mut().check_running()?;
        std::thread::sleep(POLL_INTERVAL);
    };
    let ms = light_latencies(&db)?;
    drop(db);
    let status = node.proc_mut().stop(cluster::STOP_GRACE)?.context("the fairness node never ran")?;
    if !status.success() {
        bail!("the fairness node exited with {status}");
    }
    let status = hub.proc_mut().stop(cluster::STOP_GRACE)?.context("the fairness hub never ran")?;
    if !status.success() {
        bail!("the fairness hub exited with {status}");
    }
    Ok(FairnessResult {
        light_accept_to_report_ms: stats::summarize(ms).context("no light message was timed")?,
        heavy_left_share: 1.0 - heavy_done as f64 / heavy.max(1) as f64,
    })
}

/// Queues `count` heavy messages for the host through the hub's store code, before it starts.
/// Only this connection runs with `synchronous=OFF` (a crash would lose benchmark data only).
fn prefill(db: &Path, count: usize) -> anyhow::Result<()> {
    let conn: Connection = store::open_write(db, Synchronous::Normal).context("opening the fairness database")?;
    conn.execute_batch("PRAGMA synchronous = OFF")?;
    crate::backlog::accept_range(&conn, 0..count, PRODUCER, crate::backlog::Recipient::Host(HOST), |n| {
        (HEAVY.to_string(), format!("heavy-{n}"))
    })
}

/// Submits the light messages one at a time, `LIGHT_GAP` apart.
async fn submit_light(client: &Client, count: usize) -> anyhow::Result<()> {
    for i in 0..count {
        let body = SubmitRequest {
            conversation: LIGHT.into(),
            idempotency_key: format!("light-{i}"),
            payload: serde_json::json!({ "i": i }).into(),
            to: Some(vec![HOST.into()]),
            pools: None,
            max_attempts: None,
            retry_backoff_ms: None,
            approval: None,
            approval_timeout_ms: None,
            deadline_ms: None,
            stall_ms: None,
        };
        let accepted = client.submit(&body).await.context("submitting a light message")?;
        if accepted.duplicate {
            bail!("light message {i} was answered as a replay, not accepted anew");
        }
        tokio::time::sleep(LIGHT_GAP).await;
    }
    Ok(())
}

/// (light, heavy) deliveries with a report.
fn reported(db: &Connection) -> anyhow::Result<(usize, usize)> {
    let count = |conversation: &str| -> anyhow::Result<usize> {
        let n: i64 = db.query_row(
            "SELECT count(DISTINCT a.delivery_id) FROM attempts a JOIN deliveries d ON d.id = a.delivery_id
             WHERE d.conversation = ?1",
            [conversation],
            |r| r.get(0),
        )?;
        Ok(n as usize)
    };
    Ok((count(LIGHT)?, count(HEAVY)?))
}

/// Accept→first report of every light delivery, milliseconds.
fn light_latencies(db: &Connection) -> anyhow::Result<Vec<f64>> {
    let mut stmt = db.prepare(
        "SELECT (SELECT min(a.reported_at) FROM attempts a WHERE a.delivery_id = d.id) - m.accepted_at
         FROM messages m JOIN deliveries d ON d.message_id = m.id WHERE d.conversation = ?1",
    )?;
    let rows: Vec<Option<i64>> = stmt.query_map([LIGHT], |r| r.get(0))?.collect::<Result<_, _>>()?;
    Ok(rows.into_iter().flatten().map(|ms| ms as f64).collect())
}
