//! Step 1 on PostgreSQL: the bare queue ceiling of the server the record is on.
//!
//! What an established PostgreSQL job queue does per job, and nothing else: `PG_CEILING_WORKERS`
//! connections each enqueue `PG_CEILING_BATCH` jobs in one statement (a durable commit), then
//! take up to `PG_CEILING_BATCH` of them with `FOR UPDATE SKIP LOCKED`, delete them and record
//! their completion, in one statement (one more durable commit). Completed jobs per second is
//! `pg_ceiling_jobs_per_s`, the figure Baton's deliveries on the same server are set against.
//! The tables live in a schema of their own, made before and dropped after, so the database is
//! as empty as it was when the hub's record is created in it.

use anyhow::Context;
use baton_hub::store::engine::postgres::{PgUrl, connect};
use std::time::{Duration, Instant};

/// Connections running the cycle at once: PostgreSQL commits the waiting transactions of
/// several connections with one flush, as it does for the hub's connections.
pub const PG_CEILING_WORKERS: usize = 4;
/// Jobs per enqueue and per take: the claim batch a node asks for.
pub const PG_CEILING_BATCH: i64 = 64;
/// The schema the ceiling's tables are made in and dropped with.
const SCHEMA: &str = "baton_bench_ceiling";
/// A small job body, about the size of a delivery's payload in the end-to-end passes.
const BODY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Completed jobs per second of the bare cycle against the database at `url`, over `duration`.
pub fn measure(rt: &tokio::runtime::Runtime, url: &str, duration: Duration) -> anyhow::Result<f64> {
    let url = PgUrl::parse(url).context("the database URL")?;
    rt.block_on(async {
        let admin = connect(&url).await.context("connecting for the ceiling")?;
        admin
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE;
                 CREATE SCHEMA {SCHEMA};
                 CREATE TABLE {SCHEMA}.jobs (id bigserial PRIMARY KEY, body text NOT NULL);
                 CREATE TABLE {SCHEMA}.done (id bigint PRIMARY KEY, body text NOT NULL);"
            ))
            .await
            .context("making the ceiling's tables")?;
        let start = Instant::now();
        let deadline = start + duration;
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..PG_CEILING_WORKERS {
            let url = url.clone();
            workers.spawn(async move { cycle_until(&url, deadline).await });
        }
        let mut done = 0u64;
        while let Some(r) = workers.join_next().await {
            done += r.context("a ceiling worker")??;
        }
        let rate = done as f64 / start.elapsed().as_secs_f64();
        admin.batch_execute(&format!("DROP SCHEMA {SCHEMA} CASCADE")).await.context("dropping the ceiling's tables")?;
        Ok(rate)
    })
}

/// One worker: enqueue a batch, take a batch, until `deadline`; returns the jobs it completed.
async fn cycle_until(url: &PgUrl, deadline: Instant) -> anyhow::Result<u64> {
    let client = connect(url).await.context("connecting a ceiling worker")?;
    let enqueue = client
        .prepare(&format!("INSERT INTO {SCHEMA}.jobs (body) SELECT $1 FROM generate_series(1, $2::bigint)"))
        .await?;
    let take = client
        .prepare(&format!(
            "WITH taken AS (
                 DELETE FROM {SCHEMA}.jobs WHERE id IN (
                     SELECT id FROM {SCHEMA}.jobs ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
                 RETURNING id, body)
             INSERT INTO {SCHEMA}.done (id, body) SELECT id, body FROM taken"
        ))
        .await?;
    let mut done = 0u64;
    while Instant::now() < deadline {
        client.execute(&enqueue, &[&BODY, &PG_CEILING_BATCH]).await.context("enqueueing")?;
        done += client.execute(&take, &[&PG_CEILING_BATCH]).await.context("taking")?;
    }
    Ok(done)
}
