//! Pools on both backends' records: the migration that brings pools brings a record of the
//! schema before it forward (SQLite rebuilds `deliveries`; PostgreSQL relaxes it in place)
//! with every delivery, event, attempt and queue count as it was, and the rebuilt table keeps
//! its rules: one delivery per (message, host) among host deliveries and per (message, pool)
//! among pool deliveries, a pool delivery counted in its pool's queue, never a host's. The
//! SQLite half always runs; the PostgreSQL half skips without PostgreSQL server binaries unless
//! `BATON_REQUIRE_POSTGRES=1`.

use baton_hub::store::engine::postgres::{self as pg, PgUrl};
use baton_testkit::pg::cluster_or_skip;

/// The record the migration is tried on (see the file's head).
const RECORD: &str = include_str!("record_before_pools.sql");

/// The SQLite schema version before pools.
const SQLITE_BEFORE: usize = 16;
/// The PostgreSQL schema version before pools (the histories are numbered in lockstep).
const POSTGRES_BEFORE: usize = 16;

/// The deliveries' columns before pools, as one text per row (NULL shown as `~`).
fn deliveries_as_text() -> String {
    let cols = [
        "n",
        "id",
        "message_id",
        "host",
        "conversation",
        "seq",
        "state",
        "instance_id",
        "claim_token",
        "reason",
        "created_at",
        "updated_at",
        "attempt",
        "rerun",
        "not_before",
        "started_session",
        "started_at",
    ];
    let row: Vec<String> = cols.iter().map(|c| format!("coalesce(CAST({c} AS TEXT), '~')")).collect();
    format!("SELECT {} FROM deliveries ORDER BY n", row.join(" || '|' || "))
}

/// What must read the same before and after the migration.
fn kept() -> Vec<String> {
    vec![
        deliveries_as_text(),
        "SELECT delivery_id || '|' || to_state FROM delivery_events ORDER BY id".into(),
        "SELECT id || '|' || delivery_id || '|' || outcome FROM attempts ORDER BY id".into(),
        "SELECT host || '|' || conversation || '|' || CAST(queued AS TEXT) || '|' || CAST(since AS TEXT) \
         FROM conversation_queues ORDER BY host, conversation"
            .into(),
        "SELECT message_id || '|' || coalesce(CAST(done_at AS TEXT), '~') FROM fanout_obligations ORDER BY message_id"
            .into(),
    ]
}

/// Statements after the migration with the answer each must give (a count), or `None` when
/// the statement must be refused.
fn after() -> Vec<(&'static str, Option<i64>)> {
    vec![
        ("SELECT count(*) FROM deliveries WHERE pool IS NOT NULL", Some(0)),
        ("SELECT count(*) FROM pool_queues", Some(0)),
        ("INSERT INTO pools (name, created_at, created_by) VALUES ('p1', 50, 'op')", Some(1)),
        ("INSERT INTO pool_members (pool, host, added_at, added_by) VALUES ('p1', 'host-b', 50, 'op')", Some(1)),
        // A pool delivery of m10 counts in its pool's queue, not a host's.
        (
            "INSERT INTO deliveries (id, message_id, host, pool, conversation, seq, state, created_at, updated_at)
             VALUES ('d10p', 'm10', NULL, 'p1', 'c1', 10, 'queued', 51, 51)",
            Some(1),
        ),
        ("SELECT queued FROM pool_queues WHERE pool = 'p1' AND conversation = 'c1'", Some(1)),
        ("SELECT CAST(sum(queued) AS BIGINT) FROM conversation_queues", Some(2)),
        // A second one for the same (message, pool) is refused; one with neither host nor pool too.
        (
            "INSERT INTO deliveries (id, message_id, host, pool, conversation, seq, state, created_at, updated_at)
             VALUES ('d10q', 'm10', NULL, 'p1', 'c1', 10, 'queued', 51, 51)",
            None,
        ),
        (
            "INSERT INTO deliveries (id, message_id, host, pool, conversation, seq, state, created_at, updated_at)
             VALUES ('d10r', 'm10', NULL, NULL, 'c1', 10, 'queued', 51, 51)",
            None,
        ),
        // Claimed by a member, it leaves the pool's queue and is that host's.
        (
            "UPDATE deliveries SET state = 'claimed', host = 'host-b', instance_id = 'i-b', claim_token = 't10'
             WHERE id = 'd10p'",
            Some(1),
        ),
        ("SELECT queued FROM pool_queues WHERE pool = 'p1' AND conversation = 'c1'", Some(0)),
        // A claimed pool delivery must name its host.
        ("UPDATE deliveries SET host = NULL WHERE id = 'd10p'", None),
        // The same message to the same host by name as well: a second delivery, allowed.
        (
            "INSERT INTO deliveries (id, message_id, host, conversation, seq, state, created_at, updated_at)
             VALUES ('d10', 'm10', 'host-b', 'c1', 10, 'queued', 52, 52)",
            Some(1),
        ),
        ("SELECT queued FROM conversation_queues WHERE host = 'host-b' AND conversation = 'c1'", Some(1)),
        // ... but not twice.
        (
            "INSERT INTO deliveries (id, message_id, host, conversation, seq, state, created_at, updated_at)
             VALUES ('d10x', 'm10', 'host-b', 'c1', 10, 'queued', 52, 52)",
            None,
        ),
        // Foreign keys hold again: removing a message takes its deliveries and their events.
        ("DELETE FROM messages WHERE id = 'm8'", Some(1)),
        ("SELECT count(*) FROM delivery_events WHERE delivery_id = 'd8'", Some(0)),
        ("SELECT count(*) FROM deliveries WHERE id = 'd8'", Some(0)),
    ]
}

#[test]
fn the_pools_migration_brings_an_sqlite_record_forward_with_its_work() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hub.db");
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.pragma_update(None, "foreign_keys", true).unwrap();
        for m in &baton_hub::store::MIGRATIONS[..SQLITE_BEFORE] {
            c.execute_batch(m).unwrap();
        }
        c.pragma_update(None, "user_version", SQLITE_BEFORE as i64).unwrap();
        c.execute_batch(RECORD).unwrap();
        // Retention removed the newest positions once: the numbers drawn stay drawn.
        c.execute("UPDATE sqlite_sequence SET seq = 50 WHERE name = 'deliveries'", []).unwrap();
    }
    let read = |c: &rusqlite::Connection| -> Vec<Vec<String>> {
        kept()
            .iter()
            .map(|q| c.prepare(q).unwrap().query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect())
            .collect()
    };
    let before = read(&rusqlite::Connection::open(&path).unwrap());
    assert_eq!(before[0].len(), 9, "{before:?}");

    let c = baton_hub::store::open_write(&path, baton_shared::sqlite::Synchronous::Full).unwrap();
    let version: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(version, baton_hub::store::MIGRATIONS.len() as i64);
    let fk: i64 = c.query_row("PRAGMA foreign_keys", [], |r| r.get(0)).unwrap();
    assert_eq!(fk, 1, "foreign keys are enforced again after the migration");
    assert_eq!(read(&c), before, "every delivery, event, attempt and queue count as it was");
    for (sql, want) in after() {
        let got = if sql.starts_with("SELECT") {
            c.query_row(sql, [], |r| r.get::<_, i64>(0)).map_err(|e| e.to_string())
        } else {
            c.execute(sql, []).map(|n| n as i64).map_err(|e| e.to_string())
        };
        match want {
            Some(n) => assert_eq!(got, Ok(n), "{sql}"),
            None => assert!(got.is_err(), "{sql} must be refused: {got:?}"),
        }
    }
    let n: i64 = c.query_row("SELECT n FROM deliveries WHERE id = 'd10p'", [], |r| r.get(0)).unwrap();
    assert_eq!(n, 51, "the queue position goes on from the newest drawn");
    let check: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(check, "ok");
}

#[tokio::test]
async fn the_pools_migration_brings_a_postgres_record_forward_with_its_work() {
    let Some(cluster) = cluster_or_skip("pools_migration", false) else { return };
    let url = PgUrl::parse(&cluster.url()).unwrap();
    let mut c = pg::connect(&url).await.unwrap();
    c.batch_execute(
        "CREATE TABLE baton_schema (
             one       BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
             version   BIGINT NOT NULL CHECK (version >= 0),
             lockstep  BOOLEAN NOT NULL DEFAULT true);",
    )
    .await
    .unwrap();
    c.execute("INSERT INTO baton_schema (one, version) VALUES (true, $1)", &[&(POSTGRES_BEFORE as i64)]).await.unwrap();
    for m in &pg::MIGRATIONS[..POSTGRES_BEFORE] {
        c.batch_execute(m).await.unwrap();
    }
    c.batch_execute(RECORD).await.unwrap();
    // The record's positions were drawn from the column's own counter.
    c.batch_execute("SELECT setval(pg_get_serial_sequence('deliveries', 'n'), 9)").await.unwrap();
    async fn read(c: &tokio_postgres::Client) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        for q in kept() {
            out.push(c.query(&q, &[]).await.unwrap().iter().map(|r| r.get(0)).collect());
        }
        out
    }
    let before = read(&c).await;
    assert_eq!(before[0].len(), 9, "{before:?}");

    let m = pg::migrate(&mut c, &url).await.unwrap();
    assert_eq!(m, pg::Migrated { from: POSTGRES_BEFORE as i64, to: pg::known_version() });
    assert_eq!(read(&c).await, before, "every delivery, event, attempt and queue count as it was");
    for (sql, want) in after() {
        let got = if sql.starts_with("SELECT") {
            c.query_one(sql, &[]).await.map(|r| r.get::<_, i64>(0)).map_err(|e| e.to_string())
        } else {
            c.execute(sql, &[]).await.map(|n| n as i64).map_err(|e| e.to_string())
        };
        match want {
            Some(n) => assert_eq!(got, Ok(n), "{sql}"),
            None => assert!(got.is_err(), "{sql} must be refused: {got:?}"),
        }
    }
    let n: i64 = c.query_one("SELECT n FROM deliveries WHERE id = 'd10p'", &[]).await.unwrap().get(0);
    assert!(n > 9, "the queue position goes on after the newest: {n}");
}
