//! The PostgreSQL schema against the SQLite one: every SQLite table, column, index and trigger
//! has its PostgreSQL counterpart (so the two cannot drift apart silently), and the same
//! writes leave the same record on both: the `conversation_queues` counters, `messages.settled_at`
//! and the CHECK constraints. The SQLite side is an in-memory database with the hub's
//! migrations; the PostgreSQL side a throwaway cluster (skipped without PostgreSQL server
//! binaries unless `BATON_REQUIRE_POSTGRES=1`).

use baton_hub::store::engine::postgres::{self as pg, PgUrl};
use baton_testkit::pg::cluster_or_skip;
use rusqlite::Connection;
use std::collections::{BTreeMap, BTreeSet};

fn sqlite() -> Connection {
    let conn = Connection::open_in_memory().unwrap();
    conn.pragma_update(None, "foreign_keys", true).unwrap();
    for m in baton_hub::store::MIGRATIONS {
        conn.execute_batch(m).unwrap();
    }
    conn
}

async fn postgres(url: &str) -> tokio_postgres::Client {
    let url = PgUrl::parse(url).unwrap();
    let mut c = pg::connect(&url).await.unwrap();
    pg::migrate(&mut c, &url).await.unwrap();
    c
}

/// The `NNNN-*.sql` files of a schema folder, sorted.
fn migration_files(folder: &str) -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schema").join(folder);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".sql"))
        .collect();
    names.sort();
    names
}

/// The schema migrations on disk are numbered from 0001 without gaps, each is embedded, and the
/// two histories are in lockstep: PostgreSQL's migration N has SQLite's name (the same change).
#[test]
fn postgres_migrations_are_numbered_in_lockstep_with_sqlite_and_all_embedded() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schema/postgres");
    let names = migration_files("postgres");
    for (i, name) in names.iter().enumerate() {
        assert!(name.starts_with(&format!("{:04}-", i + 1)), "{name} out of sequence");
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        assert_eq!(pg::MIGRATIONS.get(i), Some(&text.as_str()), "{name} is migration {}", i + 1);
    }
    assert_eq!(names.len(), pg::MIGRATIONS.len());
    assert_eq!(names, migration_files("hub"), "PostgreSQL's history (left) against SQLite's (right)");
    for (i, also) in pg::FIRST_ALSO.iter().enumerate() {
        assert!(also.contains(&format!("migration {:04}", i + 2)), "FIRST_ALSO keeps the files as they were");
    }
}

/// (table → column → (type, not null)) as SQLite declares it, in PostgreSQL's words.
type Columns = BTreeMap<String, BTreeMap<String, (String, bool)>>;

#[tokio::test]
async fn every_sqlite_table_column_index_and_trigger_has_its_postgres_counterpart() {
    let Some(cluster) = cluster_or_skip("schema_parity", false) else { return };
    let lite = sqlite();
    let pgc = postgres(&cluster.url()).await;

    let mut want = Columns::new();
    let tables: Vec<String> = lite
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for table in &tables {
        let mut stmt = lite.prepare("SELECT name, type, \"notnull\", pk FROM pragma_table_info(?1)").unwrap();
        let cols = stmt
            .query_map([table], |r| {
                let (name, ty, notnull, pk): (String, String, bool, i64) = (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
                let ty = match ty.as_str() {
                    "INTEGER" => "bigint",
                    "TEXT" => "text",
                    other => panic!("{table}.{name}: no PostgreSQL type for SQLite {other}"),
                };
                // A STRICT table's primary key columns cannot be NULL, declared or not.
                Ok((name, (ty.to_owned(), notnull || pk > 0)))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        want.insert(table.clone(), cols);
    }

    let mut have = Columns::new();
    for row in pgc
        .query(
            "SELECT table_name::text, column_name::text, data_type::text, is_nullable = 'NO'
             FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name <> 'baton_schema'",
            &[],
        )
        .await
        .unwrap()
    {
        have.entry(row.get(0)).or_default().insert(row.get(1), (row.get(2), row.get(3)));
    }
    assert_eq!(have, want, "PostgreSQL tables and columns (left) against SQLite's (right)");

    let lite_names = |kind: &str| -> BTreeSet<String> {
        lite.prepare("SELECT name FROM sqlite_schema WHERE type = ?1 AND name NOT LIKE 'sqlite_autoindex%'")
            .unwrap()
            .query_map([kind], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let pg_names = |rows: Vec<tokio_postgres::Row>| -> BTreeSet<String> { rows.iter().map(|r| r.get(0)).collect() };
    let indexes = pg_names(
        pgc.query("SELECT indexname::text FROM pg_indexes WHERE schemaname = current_schema()", &[]).await.unwrap(),
    );
    let missing: Vec<_> = lite_names("index").difference(&indexes).cloned().collect();
    assert!(missing.is_empty(), "indexes missing on PostgreSQL: {missing:?}");
    let triggers = pg_names(
        pgc.query(
            "SELECT t.tgname::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE NOT t.tgisinternal AND n.nspname = current_schema()",
            &[],
        )
        .await
        .unwrap(),
    );
    assert_eq!(triggers, lite_names("trigger"), "PostgreSQL triggers (left) against SQLite's (right)");
}

/// What the steps observe: every `conversation_queues` row and every message's `settled_at`.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    queues: Vec<(String, String, i64, i64, i64)>,
    settled: Vec<(String, Option<i64>)>,
}

const QUEUES: &str =
    "SELECT host, conversation, queued, served, since FROM conversation_queues ORDER BY host, conversation";
const SETTLED: &str = "SELECT id, settled_at FROM messages ORDER BY id";

fn seen_sqlite(c: &Connection) -> Seen {
    let queues = c
        .prepare(QUEUES)
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let settled = c
        .prepare(SETTLED)
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    Seen { queues, settled }
}

async fn seen_postgres(c: &tokio_postgres::Client) -> Seen {
    let queues = c
        .query(QUEUES, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    let settled = c.query(SETTLED, &[]).await.unwrap().iter().map(|r| (r.get(0), r.get(1))).collect();
    Seen { queues, settled }
}

fn message(id: &str, seq: i64) -> String {
    format!(
        "INSERT INTO messages (id, conversation, seq, producer, idempotency_key, content_hash, payload, accepted_at)
         VALUES ('{id}', 'c', {seq}, 'p', '{id}', 'h', '{{}}', 1);
         INSERT INTO fanout_obligations (message_id, created_at) VALUES ('{id}', 1);"
    )
}

fn delivery(id: &str, message: &str, host: &str, seq: i64) -> String {
    format!(
        "INSERT INTO deliveries (id, message_id, host, conversation, seq, state, created_at, updated_at)
         VALUES ('{id}', '{message}', '{host}', 'c', {seq}, 'queued', 1, 1)"
    )
}

fn to_state(id: &str, state: &str, at: i64) -> String {
    let holder = if matches!(state, "claimed" | "mirrored" | "delivered") { "'i1', 'tok'" } else { "NULL, NULL" };
    format!(
        "UPDATE deliveries SET (state, instance_id, claim_token, updated_at) = ('{state}', {holder}, {at})
         WHERE id = '{id}'"
    )
}

/// What the hub runs after a change that may settle `message` (`lifecycle::settle`), with its
/// values written in.
fn settle(message: &str, at: i64) -> String {
    baton_hub::store::lifecycle::settle::SETTLE.replace("$1", &format!("'{message}'")).replace("$2", &at.to_string())
}

/// How a step ends on both stores.
enum Expect {
    /// It succeeds; optionally with this message's `settled_at`.
    Ok(Option<(&'static str, Option<i64>)>),
    /// It is refused by a constraint (PostgreSQL's SQLSTATE class 23).
    Refused,
}

#[tokio::test]
async fn the_same_writes_leave_the_same_counters_and_settlement_on_both_stores() {
    let Some(cluster) = cluster_or_skip("trigger_parity", false) else { return };
    let lite = sqlite();
    let pgc = postgres(&cluster.url()).await;
    use Expect::{Ok as Done, Refused};

    let steps: Vec<(&str, String, Expect)> = vec![
        (
            "setup",
            format!(
                "INSERT INTO conversations (name, last_seq) VALUES ('c', 4);
                 INSERT INTO hosts (name, enrolled_at) VALUES ('h1', 1), ('h2', 1);
                 {} {} {}",
                message("m1", 1),
                message("m2", 2),
                message("m3", 3)
            ),
            Done(None),
        ),
        ("a delivery is created queued", delivery("d1", "m1", "h1", 1), Done(Some(("m1", None)))),
        ("another host's", delivery("d2", "m1", "h2", 1), Done(None)),
        ("a second turn on h1", delivery("d3", "m2", "h1", 2), Done(None)),
        ("the claim turns to h1/c", "UPDATE conversation_queues SET served = 5 WHERE host = 'h1'".into(), Done(None)),
        ("a claim leaves the queue", to_state("d1", "claimed", 10), Done(None)),
        (
            "fan-out done, m1 unfinished",
            "UPDATE fanout_obligations SET done_at = 11 WHERE message_id = 'm1'".into(),
            Done(Some(("m1", None))),
        ),
        ("one delivery fails, the other runs", to_state("d2", "failed", 20), Done(Some(("m1", None)))),
        ("the ack: delivered, no outcome yet", to_state("d1", "delivered", 30), Done(Some(("m1", None)))),
        (
            "the run's outcome settles the message",
            format!(
                "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, reported_at)
                 VALUES ('a1', 'd1', 'h1', 'i1', 'r1', 'x', 'succeeded', 40); {}",
                settle("m1", 40)
            ),
            Done(Some(("m1", Some(40)))),
        ),
        (
            "a redrive reopens it and requeues",
            "UPDATE deliveries SET (state, instance_id, claim_token, attempt, rerun, updated_at) =
                 ('queued', NULL, NULL, 2, 'redrive', 50) WHERE id = 'd1'"
                .into(),
            Done(Some(("m1", None))),
        ),
        ("h1/c drains: d3 claimed", to_state("d3", "claimed", 60), Done(None)),
        ("h1/c drains: d1 claimed", to_state("d1", "claimed", 61), Done(None)),
        ("work again after idle resets the turn", to_state("d1", "queued", 62), Done(None)),
        ("an unknown state is refused", "UPDATE deliveries SET state = 'bogus' WHERE id = 'd2'".into(), Refused),
        (
            "claimed without a holder is refused",
            "UPDATE deliveries SET state = 'claimed' WHERE id = 'd2'".into(),
            Refused,
        ),
        (
            "an open fence on all must have no target",
            "INSERT INTO fences (kind, scope, target, set_by, set_at, set_after_event, reason)
             VALUES ('hold', 'all', 'x', 'op', 1, 0, 'r')"
                .into(),
            Refused,
        ),
        ("a negative counter is refused", "UPDATE conversation_queues SET queued = -1".into(), Refused),
        ("a queued delivery removed stops counting", "DELETE FROM deliveries WHERE id = 'd1'".into(), Done(None)),
        ("m3's only delivery", delivery("d4", "m3", "h2", 3), Done(None)),
        ("fails before its fan-out is done", to_state("d4", "failed", 70), Done(Some(("m3", None)))),
        (
            "the fan-out completing does not settle it by itself",
            "UPDATE fanout_obligations SET done_at = 80 WHERE message_id = 'm3'".into(),
            Done(Some(("m3", None))),
        ),
        ("the hub's settling statement settles it", settle("m3", 80), Done(Some(("m3", Some(80))))),
        ("m4's deliveries", format!("{} {}; {}", message("m4", 4), delivery("d5", "m4", "h1", 4), delivery("d6", "m4", "h2", 4)), Done(None)),
        ("m4's fan-out done", "UPDATE fanout_obligations SET done_at = 81 WHERE message_id = 'm4'".into(), Done(Some(("m4", None)))),
        ("m4 runs on h1", to_state("d5", "claimed", 82), Done(None)),
        ("m4 runs on h1: delivered", to_state("d5", "delivered", 83), Done(None)),
        (
            "an outcome with another delivery queued does not settle",
            format!(
                "INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, reported_at)
                 VALUES ('a2', 'd5', 'h1', 'i1', 'r2', 'x', 'succeeded', 84); {}",
                settle("m4", 84)
            ),
            Done(Some(("m4", None))),
        ),
        (
            "a move between states that are not final leaves it unsettled",
            to_state("d6", "held", 85),
            Done(Some(("m4", None))),
        ),
    ];

    for (what, sql, expect) in steps {
        let on_sqlite = lite.execute_batch(&sql);
        let on_postgres = pgc.batch_execute(&sql).await;
        match expect {
            Expect::Ok(settled) => {
                on_sqlite.unwrap_or_else(|e| panic!("{what}: SQLite: {e}"));
                on_postgres.unwrap_or_else(|e| panic!("{what}: PostgreSQL: {e:?}"));
                let seen = seen_postgres(&pgc).await;
                assert_eq!(seen, seen_sqlite(&lite), "{what}: PostgreSQL (left) against SQLite (right)");
                if let Some((id, at)) = settled {
                    assert!(seen.settled.contains(&(id.to_owned(), at)), "{what}: {id} settled_at {at:?}: {seen:?}");
                }
            }
            Expect::Refused => {
                let e = on_sqlite.expect_err(what);
                assert!(e.to_string().contains("constraint failed"), "{what}: SQLite: {e}");
                let e = on_postgres.expect_err(what);
                let code = e.code().map(|c| c.code().to_owned()).unwrap_or_default();
                assert!(code.starts_with("23"), "{what}: PostgreSQL: {e:?}");
            }
        }
    }

    // The bookkeeping the steps walked through, spelled out once.
    let seen = seen_postgres(&pgc).await;
    assert_eq!(
        seen.queues,
        vec![("h1".into(), "c".into(), 0, 0, 5), ("h2".into(), "c".into(), 0, 0, 6)],
        "h1/c and h2/c: restarted after idle by m4's deliveries (served 0, since d5's and d6's positions), \
         then emptied by d5's claim and d6's hold"
    );
}

/// Two hubs end the last two deliveries of one message at once, each with `end` (the delivery,
/// the time): neither sees the other's change in its own snapshot, yet the message settles,
/// because what settles it locks the message row first and looks again once the other has
/// committed.
async fn race(name: &str, end: fn(&str, i64) -> String) {
    let Some(cluster) = cluster_or_skip(name, false) else { return };
    let first = postgres(&cluster.url()).await;
    first
        .batch_execute(&format!(
            "INSERT INTO conversations (name, last_seq) VALUES ('c', 1);
             {}
             {}; {};
             {}; {};
             UPDATE fanout_obligations SET done_at = 5 WHERE message_id = 'm1';",
            message("m1", 1),
            delivery("d1", "m1", "h1", 1),
            delivery("d2", "m1", "h2", 1),
            to_state("d1", "claimed", 2),
            to_state("d2", "claimed", 2),
        ))
        .await
        .unwrap();

    first.batch_execute(&format!("BEGIN; {};", end("d1", 10))).await.unwrap();
    let url = cluster.url();
    let second = tokio::spawn(async move {
        let c = postgres(&url).await;
        c.batch_execute(&format!("BEGIN; {}; COMMIT;", end("d2", 11))).await.unwrap();
    });
    // Commit the first only once the second is inside its statement: waiting for the lock or,
    // were there none, already done.
    let watcher = postgres(&cluster.url()).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 || second.is_finished() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the second transaction never reached its update");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    first.batch_execute("COMMIT").await.unwrap();
    second.await.unwrap();
    let settled: Option<i64> =
        watcher.query_one("SELECT settled_at FROM messages WHERE id = 'm1'", &[]).await.unwrap().get(0);
    assert_eq!(settled, Some(11), "settled by the second outcome, once it saw the first");
}

/// Both fail: the schema's `messages_settled_by_state` trigger settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_final_outcomes_settle_their_message() {
    race("concurrent_settlement", |d, at| to_state(d, "failed", at)).await;
}

/// Both runs end with an outcome: the hub's own statements (`lifecycle::settle`: the message row
/// locked, then the settling update) settle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_run_outcomes_settle_their_message_through_the_hubs_statements() {
    race("concurrent_outcomes", |d, at| {
        let lock = baton_hub::store::engine::dialect::SETTLE_LOCK.postgres.unwrap_or_default().replace("$1", "'m1'");
        format!(
            "{}; INSERT INTO attempts (id, delivery_id, host, instance_id, report_id, request_hash, outcome, reported_at)
             VALUES ('a-{d}', '{d}', 'h', 'i1', 'r-{d}', 'x', 'succeeded', {at}); {lock}; {}",
            to_state(d, "delivered", at),
            settle("m1", at)
        )
    })
    .await;
}
