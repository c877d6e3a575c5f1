//! The settlement migration (0018) on both backends: a record of the schema before it, holding work
//! in every state for hosts and a pool, comes forward with every delivery, event, attempt, queue
//! count and settlement as it was; the hub's own settling (`lifecycle::settle`) and the schema's
//! remaining trigger then keep `settled_at` right on it, and `verify` finds nothing wrong. The
//! SQLite half always runs; the PostgreSQL half skips without PostgreSQL server binaries unless
//! `BATON_REQUIRE_POSTGRES=1`.

use baton_hub::store::engine::postgres::{self as pg, PgUrl};
use baton_hub::store::engine::{Db, PgConn};
use baton_hub::store::lifecycle::settle;
use baton_hub::store::upkeep::verify;
use baton_testkit::pg::cluster_or_skip;

/// The record the migration is tried on (see the file's head).
const RECORD: &str = include_str!("record_before_settlement.sql");

/// The schema version before the settlement migration, on both backends (numbered in lockstep).
const BEFORE: usize = 17;

/// What must read the same before and after the migration, one text per row (NULL as `~`).
fn kept() -> Vec<String> {
    let cols = [
        "n",
        "id",
        "message_id",
        "host",
        "pool",
        "state",
        "instance_id",
        "claim_token",
        "reason",
        "updated_at",
        "attempt",
        "not_before",
    ];
    let row: Vec<String> = cols.iter().map(|c| format!("coalesce(CAST({c} AS TEXT), '~')")).collect();
    vec![
        format!("SELECT {} FROM deliveries ORDER BY n", row.join(" || '|' || ")),
        "SELECT delivery_id || '|' || to_state FROM delivery_events ORDER BY id".into(),
        "SELECT id || '|' || delivery_id || '|' || outcome FROM attempts ORDER BY id".into(),
        "SELECT host || '|' || conversation || '|' || CAST(queued AS TEXT) || '|' || CAST(since AS TEXT) \
         FROM conversation_queues ORDER BY host, conversation"
            .into(),
        "SELECT pool || '|' || conversation || '|' || CAST(queued AS TEXT) || '|' || CAST(in_flight AS TEXT) \
         FROM pool_queues ORDER BY pool, conversation"
            .into(),
        "SELECT message_id || '|' || coalesce(CAST(done_at AS TEXT), '~') FROM fanout_obligations ORDER BY message_id"
            .into(),
        SETTLED.into(),
    ]
}

/// Every message's settlement, `id|settled_at`.
const SETTLED: &str = "SELECT id || '|' || coalesce(CAST(settled_at AS TEXT), '~') FROM messages ORDER BY id";

fn read(c: &dyn Db) -> Vec<Vec<String>> {
    kept()
        .iter()
        .map(|q| {
            c.prepare_cached(q).unwrap().query_map([], |r| r.get::<_, String>(0)).unwrap().map(Result::unwrap).collect()
        })
        .collect()
}

fn settled_at(c: &dyn Db, message: &str) -> Option<i64> {
    c.query_row("SELECT settled_at FROM messages WHERE id = $1", [message], |r| r.get(0)).unwrap()
}

/// The record as the schema before this migration settled it: the four messages whose
/// deliveries are all final, each at its last outcome.
fn settled_before(c: &dyn Db) {
    let settled: Vec<String> = read(c).pop().unwrap();
    let want = [
        "m1|40", "m10|~", "m11|~", "m12|~", "m13|43", "m14|~", "m2|~", "m3|~", "m4|~", "m5|~", "m6|~", "m7|~", "m8|37",
        "m9|38",
    ];
    assert_eq!(settled, want, "the record before the migration, settled by that schema's triggers");
}

/// After the migration: the work goes on, settled by the hub's statements and unsettled by the
/// schema's trigger, and `verify` finds the record whole.
fn goes_on(c: &dyn Db) {
    let problems = verify::check(c).unwrap();
    assert!(problems.is_empty(), "the migrated record verifies: {problems:?}");
    // d2's run ends: m2 settles through the hub's statement.
    c.execute(
        "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, reported_at)
         VALUES ('a2', 'd2', 'host-a', 'i-a', 'r2', 'q2', 'succeeded', 50)",
        (),
    )
    .unwrap();
    settle::message(c, "m2", 50).unwrap();
    c.flush().unwrap();
    assert_eq!(settled_at(c, "m2"), Some(50));
    // A redrive of d1 (delivered with an outcome) reopens m1: the schema's trigger.
    c.execute(
        "UPDATE deliveries SET state = 'queued', instance_id = NULL, claim_token = NULL, attempt = 2, rerun = 'redrive',
                rerun_by = 'op', updated_at = 51 WHERE id = 'd1'",
        (),
    )
    .unwrap();
    assert_eq!(settled_at(c, "m1"), None);
    // d4 moves on from claimed: m4 was not settled and stays so.
    c.execute("UPDATE deliveries SET state = 'mirrored', updated_at = 52 WHERE id = 'd4'", ()).unwrap();
    assert_eq!(settled_at(c, "m4"), None);
    // m10's fan-out runs: its delivery is queued, so it does not settle.
    c.execute(
        "INSERT INTO deliveries (id, message_id, host, conversation, seq, state, created_at, updated_at)
         VALUES ('d10', 'm10', 'host-b', 'c1', 10, 'queued', 53, 53)",
        (),
    )
    .unwrap();
    c.execute("UPDATE fanout_obligations SET done_at = 53 WHERE message_id = 'm10'", ()).unwrap();
    settle::message(c, "m10", 53).unwrap();
    c.flush().unwrap();
    assert_eq!(settled_at(c, "m10"), None);
    // The pool's claimed delivery fails: m12 settles by the schema's remaining trigger.
    c.execute(
        "UPDATE deliveries SET state = 'failed', instance_id = NULL, claim_token = NULL, reason = 'x', updated_at = 54
         WHERE id = 'd12'",
        (),
    )
    .unwrap();
    assert_eq!(settled_at(c, "m12"), Some(54));
}

#[test]
fn the_settlement_migration_brings_an_sqlite_record_forward_with_its_work() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hub.db");
    let before = {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.pragma_update(None, "foreign_keys", true).unwrap();
        for m in &baton_hub::store::MIGRATIONS[..BEFORE] {
            c.execute_batch(m).unwrap();
        }
        c.pragma_update(None, "user_version", BEFORE as i64).unwrap();
        c.execute_batch(RECORD).unwrap();
        settled_before(&c);
        read(&c)
    };
    assert_eq!(before[0].len(), 13, "{before:?}");

    let c = baton_hub::store::open_write(&path, baton_shared::sqlite::Synchronous::Full).unwrap();
    let version: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
    assert_eq!(version, baton_hub::store::MIGRATIONS.len() as i64);
    assert_eq!(read(&c), before, "every delivery, event, attempt, queue count and settlement as it was");
    goes_on(&c);
    let check: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(check, "ok");
}

#[test]
fn the_settlement_migration_brings_a_postgres_record_forward_with_its_work() {
    let Some(cluster) = cluster_or_skip("settlement_migration", false) else { return };
    let url = PgUrl::parse(&cluster.url()).unwrap();
    let before = {
        let c = PgConn::connect(&url).unwrap();
        c.execute_batch(
            "CREATE TABLE baton_schema (
                 one       BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
                 version   BIGINT NOT NULL CHECK (version >= 0),
                 lockstep  BOOLEAN NOT NULL DEFAULT true);",
        )
        .unwrap();
        c.execute_batch(&format!("INSERT INTO baton_schema (one, version) VALUES (true, {BEFORE})")).unwrap();
        for (i, m) in pg::MIGRATIONS[..BEFORE].iter().enumerate() {
            c.execute_batch(m).unwrap();
            if i == 0 {
                for also in pg::FIRST_ALSO {
                    c.execute_batch(also).unwrap();
                }
            }
        }
        c.execute_batch(RECORD).unwrap();
        c.execute_batch("SELECT setval(pg_get_serial_sequence('deliveries', 'n'), 14)").unwrap();
        settled_before(&c);
        read(&c)
    };
    assert_eq!(before[0].len(), 13, "{before:?}");

    let m = pg::connect_and_migrate_blocking(&url).unwrap();
    assert_eq!(m, pg::Migrated { from: BEFORE as i64, to: pg::known_version() });
    let c = PgConn::connect(&url).unwrap();
    assert_eq!(read(&c), before, "every delivery, event, attempt, queue count and settlement as it was");
    goes_on(&c);
}
