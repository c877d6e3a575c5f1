//! Step 1: the storage ceiling on this disk, measured before anything else runs.
//!
//! Two bare-SQLite figures (one small insert per transaction; 64 per transaction), and the
//! hub's own store cycle run in-process through the hub's `Store` as the hub serves it (writer
//! thread, group commit): accept with fan-out, claim, the handoff (`mirrored` and `ack` in
//! one operation, as a node hands off by default), report, each one operation and one
//! transaction, for one message at a time, and for 64 messages at a time through the batch
//! operations (`submit_batch`, a claim of 64, `holder_steps`, `report_batch`). Every database is opened by `baton_shared::sqlite::open`, so WAL and
//! `synchronous=FULL` are read back, not assumed.

use anyhow::Context;
use baton_hub::store::lifecycle::accept::{AcceptLimits, Accepted, NewMessage, RetryPolicy};
use baton_hub::store::lifecycle::claim::Claimer;
use baton_hub::store::lifecycle::handoff::HolderOf;
use baton_hub::store::lifecycle::handoff::Step;
use baton_hub::store::lifecycle::report::Backoff;
use baton_hub::store::registry::hosts::Enrollment;
use baton_hub::store::registry::sessions::NodeAt;
use baton_hub::store::{Store, StoreError, StoreResult};
use baton_shared::ids::Role;
use baton_shared::sqlite::{self, OpenOptions, Synchronous};
use baton_shared::states::Outcome;
use baton_shared::wire::{HolderItem, ReportRequest};
use rusqlite::Connection;
use std::path::Path;
use std::time::{Duration, Instant};

/// The bare table the ceiling inserts into.
const CEILING_SCHEMA: &str =
    "CREATE TABLE ceiling (id INTEGER PRIMARY KEY, at INTEGER NOT NULL, body TEXT NOT NULL) STRICT;";
/// A small row, about the size of a delivery event.
const ROW_BODY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
/// Rows per transaction in the batched figures.
pub const BATCH_ROWS: usize = 64;

/// What the ceiling step measured.
#[derive(Debug, Clone, Copy)]
pub struct Ceiling {
    /// Durable commits per second, one small insert each.
    pub commits_per_s: f64,
    /// Rows per second at `BATCH_ROWS` inserts per durable commit.
    pub rows_per_s_batch64: f64,
    /// Full message cycles per second through the hub's `Store`, one message at a time (each
    /// step one operation and one transaction).
    pub store_cycle_per_s_single: f64,
    /// Full message cycles per second through the hub's `Store`, 64 messages per operation.
    pub store_cycle_per_s_batch64: f64,
}

/// Measures every ceiling in `dir` (the directory the hub's database will live next to),
/// each for `duration`, and removes the files it made.
pub fn measure(dir: &Path, duration: Duration) -> anyhow::Result<Ceiling> {
    let path = dir.join("ceiling.db");
    let conn =
        sqlite::open(&path, &[CEILING_SCHEMA], OpenOptions { synchronous: Synchronous::Full, ..Default::default() })
            .context("opening the ceiling database")?;
    let commits_per_s = bare_rate(&conn, 1, duration)?;
    let rows_per_s_batch64 = bare_rate(&conn, BATCH_ROWS, duration)?;
    drop(conn);
    remove_db(&path);
    let path = dir.join("ceiling-store.db");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting a runtime")?;
    let (store_cycle_per_s_single, store_cycle_per_s_batch64) = rt.block_on(async {
        let store = Store::open_serve(
            &path,
            Synchronous::Full,
            baton_shared::sqlite::Check::Full,
            baton_shared::sqlite::CHECKPOINT_INTERVAL,
            baton_shared::clock::system(),
        )
        .context("opening the store-cycle database")?;
        let cycle = Enrollment {
            role: Role::Node,
            name: CYCLE_HOST.into(),
            serial: CYCLE_SERIAL.into(),
            not_after_unix: i64::from(i32::MAX),
            scope: None,
            revoke_old: false,
            reason: "benchmark".into(),
            quota: Default::default(),
        };
        store.enroll(cycle, "bench".into()).await?;
        let single = cycle_rate(&store, "single", 1, duration).await?;
        let batch = cycle_rate(&store, "batch", BATCH_ROWS, duration).await?;
        anyhow::Ok((single, batch))
    })?;
    // The writer thread ends once the store is dropped; wait for the runtime to let it go.
    drop(rt);
    remove_db(&path);
    Ok(Ceiling { commits_per_s, rows_per_s_batch64, store_cycle_per_s_single, store_cycle_per_s_batch64 })
}

fn remove_db(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}

/// Inserts `rows` rows per `BEGIN IMMEDIATE … COMMIT` for `duration`; returns rows per second.
fn bare_rate(conn: &Connection, rows: usize, duration: Duration) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut done = 0u64;
    while start.elapsed() < duration {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let mut insert = conn.prepare_cached("INSERT INTO ceiling (at, body) VALUES (?1, ?2)")?;
        for _ in 0..rows {
            insert.execute(rusqlite::params![done as i64, ROW_BODY])?;
            done += 1;
        }
        drop(insert);
        conn.execute_batch("COMMIT")?;
    }
    Ok(done as f64 / start.elapsed().as_secs_f64())
}

const CYCLE_HOST: &str = "cycle-host";
const CYCLE_INSTANCE: &str = "cycle-instance";
/// The serial of the cycle host's certificate (a claim re-checks it).
const CYCLE_SERIAL: &str = "0c0c1e";

/// Runs full message cycles through `store` for `duration`, `per_op` messages per operation
/// (one: the single operations; more: the batch ones); returns cycles per second. `tag` keeps
/// each run's idempotency keys apart.
async fn cycle_rate(store: &Store, tag: &str, per_op: usize, duration: Duration) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut done = 0u64;
    let limits = AcceptLimits { queued_per_host_max: u64::MAX, queued_per_pool_max: u64::MAX };
    let node = NodeAt { host: CYCLE_HOST.into(), session: None };
    let backoff = Backoff { base: Duration::from_secs(1), max: Duration::from_secs(60) };
    let who = Claimer {
        host: CYCLE_HOST.into(),
        serial: CYCLE_SERIAL.into(),
        instance_id: CYCLE_INSTANCE.into(),
        session: None,
        rebind: Default::default(),
        pool_affinity_wait: baton_shared::limits::POOL_AFFINITY_WAIT,
    };
    while start.elapsed() < duration {
        let messages: Vec<(NewMessage, RetryPolicy)> = (0..per_op as u64)
            .map(|i| {
                let n = done + i;
                let msg = NewMessage {
                    traceparent: None,
                    producer: "bench".into(),
                    conversation: format!("cycle-{}", n % 64),
                    idempotency_key: format!("cycle-{tag}-{n}"),
                    payload: format!("{{\"i\":{n}}}"),
                    to: vec![CYCLE_HOST.into()],
                    pools: Vec::new(),
                };
                (msg, RetryPolicy::default())
            })
            .collect();
        let accepted: Vec<Accepted> = if per_op == 1 {
            let (msg, retry) = messages.into_iter().next().context("one message")?;
            vec![store.submit(msg, retry, limits).await?.0]
        } else {
            store
                .submit_batch(messages, limits)
                .await?
                .into_iter()
                .map(|r| r.map(|(a, _)| a))
                .collect::<Result<_, _>>()?
        };
        if accepted.iter().any(|a| !matches!(a, Accepted::New { .. })) {
            anyhow::bail!("a fresh key was taken as a duplicate");
        }
        let claimed = store.claim(who.clone(), per_op as u32).await?.deliveries;
        if claimed.len() != per_op {
            anyhow::bail!("a claim of {per_op} handed out {}", claimed.len());
        }
        let items: Vec<HolderItem> = claimed
            .iter()
            .map(|d| HolderItem { delivery_id: d.delivery_id.clone(), claim_token: d.claim_token.clone() })
            .collect();
        let reports: Vec<ReportRequest> = claimed
            .iter()
            .map(|d| ReportRequest {
                delivery_id: d.delivery_id.clone(),
                instance_id: CYCLE_INSTANCE.into(),
                claim_token: d.claim_token.clone(),
                report_id: format!("r-{}", d.delivery_id),
                outcome: Outcome::Succeeded,
                exit_code: Some(0),
                duration_ms: Some(0),
                result: None,
                reason: None,
                attempt: None,
                signal: None,
                stderr_tail: None,
                stderr_dropped_bytes: None,
                stopped_by: None,
            })
            .collect();
        if per_op == 1 {
            for (item, report) in items.into_iter().zip(reports) {
                let holder = HolderOf { instance_id: CYCLE_INSTANCE.into(), claim_token: item.claim_token.clone() };
                store.holder_step(Step::Handoff, node.clone(), item.delivery_id.clone(), holder).await?;
                store.report(node.clone(), report, backoff).await?;
            }
        } else {
            all_ok(store.holder_steps(Step::Handoff, node.clone(), CYCLE_INSTANCE.into(), items).await?)?;
            all_ok(store.report_batch(node.clone(), reports, backoff).await?)?;
        }
        done += per_op as u64;
    }
    Ok(done as f64 / start.elapsed().as_secs_f64())
}

/// Fails on the first item of a batch that failed.
fn all_ok<T>(results: Vec<StoreResult<T>>) -> Result<(), StoreError> {
    results.into_iter().try_for_each(|r| r.map(drop))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store cycle runs whole through the hub's `Store`, one message and 64 messages per
    /// operation, and leaves no file behind.
    #[test]
    fn the_store_cycle_runs_through_the_store_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let c = measure(dir.path(), Duration::from_millis(200)).unwrap();
        assert!(c.store_cycle_per_s_single > 0.0, "{c:?}");
        assert!(c.store_cycle_per_s_batch64 > 0.0, "{c:?}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the databases are removed");
    }
}
