//! Step 1: the storage ceiling on this disk, measured before anything else runs.
//!
//! Two bare-SQLite figures (one small insert per transaction; 64 per transaction), and the
//! hub's own store cycle run in-process (accept, fan-out, claim, mirrored, ack, report through
//! `baton_hub::store`), one message per transaction and 64 per transaction. Every database is
//! opened by `baton_shared::sqlite::open`, so WAL and `synchronous=FULL` are read back, not
//! assumed.

use anyhow::Context;
use baton_hub::store::accept::{self, AcceptLimits, Accepted, NewMessage};
use baton_hub::store::report::{self, NewReport};
use baton_hub::store::transition::Holder;
use baton_hub::store::{self, claim, hosts, in_write_txn};
use baton_shared::sqlite::{self, OpenOptions, Synchronous};
use baton_shared::states::Outcome;
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
    /// Full message cycles per second through the hub's store code, one per transaction.
    pub store_cycle_per_s_single: f64,
    /// Full message cycles per second through the hub's store code, 64 per transaction.
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
    let conn = store::open_write(&path, Synchronous::Full).context("opening the store-cycle database")?;
    in_write_txn(&conn, |c| hosts::add_host(c, CYCLE_HOST, 0))?;
    let store_cycle_per_s_single = cycle_rate(&conn, "single", 1, duration)?;
    let store_cycle_per_s_batch64 = cycle_rate(&conn, "batch", BATCH_ROWS, duration)?;
    drop(conn);
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

/// Runs `per_txn` full message cycles per durable transaction for `duration` through the hub's
/// store functions; returns cycles per second. `tag` keeps each run's idempotency keys apart.
fn cycle_rate(conn: &Connection, tag: &str, per_txn: usize, duration: Duration) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut done = 0u64;
    let limits = AcceptLimits { queued_per_host_max: u64::MAX };
    while start.elapsed() < duration {
        in_write_txn(conn, |c| {
            for _ in 0..per_txn {
                let now = baton_shared::clock::system_now_ms();
                let msg = NewMessage {
                    producer: "bench".into(),
                    conversation: format!("cycle-{}", done % 64),
                    idempotency_key: format!("cycle-{tag}-{done}"),
                    payload: format!("{{\"i\":{done}}}"),
                    to: vec![CYCLE_HOST.into()],
                };
                let Accepted::New { message_id, .. } = accept::accept(c, &msg, limits, now)? else {
                    return Err(store::StoreError::Invalid("a fresh key was taken as a duplicate".into()));
                };
                accept::fan_out(c, &message_id, now)?;
                for d in claim::claim(c, CYCLE_HOST, CYCLE_INSTANCE, 1, now)? {
                    let h = Holder { instance_id: CYCLE_INSTANCE, claim_token: &d.claim_token };
                    claim::mirrored(c, CYCLE_HOST, &d.delivery_id, h, now)?;
                    claim::ack(c, CYCLE_HOST, &d.delivery_id, h, now)?;
                    let report_id = format!("r-{}", d.delivery_id);
                    let r = NewReport {
                        delivery_id: &d.delivery_id,
                        holder: h,
                        report_id: &report_id,
                        outcome: Outcome::Succeeded,
                        exit_code: Some(0),
                        duration_ms: Some(0),
                        result: None,
                        reason: None,
                    };
                    report::report(c, CYCLE_HOST, &r, now)?;
                }
                done += 1;
            }
            Ok(())
        })?;
    }
    Ok(done as f64 / start.elapsed().as_secs_f64())
}
