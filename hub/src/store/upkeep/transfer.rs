//! Moving a whole record between backends (an SQLite file and a PostgreSQL database, either
//! way): `copy` writes every row of every table into an empty record at the same schema
//! version, and `compare` reads both back and names every difference.
//!
//! The copy goes table by table, parents before children (`TABLES`), inside the target's one
//! write transaction (the caller's), so a failed copy leaves the target empty. The target's
//! triggers fire as rows arrive; what they derive is then put back exactly as the source has
//! it: `conversation_queues` and `pool_queues` are replaced by the source's rows, and every message's
//! `settled_at` is set to the source's value. The counters behind the `AUTOINCREMENT`/identity
//! columns (`SEQUENCES`) are set to the source's newest drawn number, which may lie above the
//! largest kept row (retention removes rows, never numbers), so the next number drawn on the
//! target is the one the source would have drawn.
//!
//! Bound: one table's rows are read into memory at a time (`copy` and `compare` are offline
//! operations on a stopped hub; a table of a few million rows takes a few GB).

use crate::store::engine::ToSql;
use crate::store::engine::Value;
use crate::store::engine::params;
use crate::store::engine::{Db, dialect};
use crate::store::{StoreError, StoreResult};

/// Every table of the record, parents before children (the order a copy inserts them).
pub const TABLES: &[&str] = &[
    "certificates",
    "hosts",
    "pools",
    "pool_members",
    "conversations",
    "messages",
    "message_recipients",
    "message_pool_recipients",
    "fanout_obligations",
    "deliveries",
    "host_backlog",
    "delivery_events",
    "attempts",
    "progress_events",
    "turn_progress",
    "feed_removals",
    "fences",
    "operator_events",
    "member_families",
    "memberships",
    "conversation_pools",
    "mention_grants",
    "producer_scopes",
    "producer_quotas",
    "producer_approvals",
    "breaker_counts",
    "breaker_periods",
    "node_sessions",
    "redrive_requests",
    "conversation_queues",
    "pool_queues",
];

/// The tables whose key numbers are drawn from a counter, and the column.
pub const SEQUENCES: &[(&str, &str)] = &[
    ("deliveries", "n"),
    ("delivery_events", "id"),
    ("fences", "id"),
    ("operator_events", "id"),
    ("member_families", "id"),
    ("memberships", "id"),
    ("conversation_pools", "id"),
    ("mention_grants", "id"),
];

/// Differences `compare` names before it stops listing.
pub const COMPARE_DIFFERENCES_MAX: usize = 20;

/// What a copy moved: rows per table, in `TABLES` order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// `(table, rows)`.
    pub tables: Vec<(&'static str, u64)>,
}

impl Copied {
    /// Rows moved in all.
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|(_, n)| n).sum()
    }
}

/// A table's column names, as the record defines them.
fn columns(conn: &dyn Db, table: &str) -> StoreResult<Vec<String>> {
    let cols: Vec<String> = conn
        .prepare_cached(dialect::TABLE_COLUMNS.of(conn))?
        .query_map([table], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if cols.is_empty() {
        return Err(StoreError::Invalid(format!("the record has no table {table}")));
    }
    Ok(cols)
}

/// Every row of `table`, its columns in `cols` order.
fn rows(conn: &dyn Db, table: &str, cols: &[String]) -> StoreResult<Vec<Vec<Value>>> {
    let sql = format!("SELECT {} FROM {table}", cols.join(", "));
    let n = cols.len();
    Ok(conn
        .prepare(&sql)?
        .query_map([], |r| (0..n).map(|i| r.get::<_, Value>(i)).collect::<Result<Vec<_>, _>>())?
        .collect::<Result<_, _>>()?)
}

/// The newest number drawn for `table`'s counter, the one behind its key `column` (0 when none
/// was).
fn drawn(conn: &dyn Db, table: &str, column: &str) -> StoreResult<i64> {
    Ok(conn.query_row(dialect::COUNTER_DRAWN.of(conn), [table, column], |r| r.get(0))?)
}

/// Sets `table`'s counter (behind its key `column`) so the next number drawn is `drawn + 1`.
fn set_drawn(conn: &dyn Db, table: &str, column: &str, drawn: i64) -> StoreResult<()> {
    for sql in dialect::COUNTER_SET.of(conn) {
        conn.execute(sql, params![table, column, drawn])?;
    }
    Ok(())
}

/// Inserts `rows` into `table`.
fn insert(conn: &dyn Db, table: &str, cols: &[String], rows: &[Vec<Value>]) -> StoreResult<()> {
    let marks: Vec<String> = (1..=cols.len()).map(|i| format!("${i}")).collect();
    let sql = format!("INSERT INTO {table} ({}) VALUES ({})", cols.join(", "), marks.join(", "));
    let mut stmt = conn.prepare(&sql)?;
    for (i, row) in rows.iter().enumerate() {
        let args: Vec<&dyn ToSql> = row.iter().map(|v| v as &dyn ToSql).collect();
        stmt.execute(&args[..]).map_err(|e| {
            StoreError::Invalid(format!("copying row {} of {table} (columns {}): {e}", i + 1, cols.join(", ")))
        })?;
    }
    Ok(())
}

/// Copies every row of the record `from` into the empty record `to` (same schema version), in
/// `to`'s current write transaction. Refuses a target that holds anything.
pub fn copy(from: &dyn Db, to: &dyn Db) -> StoreResult<Copied> {
    let (have, want) = (crate::store::schema_version(from)?, crate::store::schema_version(to)?);
    let (have_latest, want_latest) = (schema_is_latest(from, have), schema_is_latest(to, want));
    if !(have_latest && want_latest) {
        return Err(StoreError::Invalid(format!(
            "both records must be at this binary's schema (the source has version {have}, the target {want}): \
             open each once with this binary first"
        )));
    }
    for table in TABLES {
        let n: i64 = to.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?;
        if n > 0 {
            return Err(StoreError::Invalid(format!(
                "the target already holds a record ({n} rows in {table}); a copy goes only into an empty one"
            )));
        }
    }
    let mut tables = Vec::with_capacity(TABLES.len());
    let mut settled: Vec<Vec<Value>> = Vec::new();
    for table in TABLES {
        let cols = columns(from, table)?;
        let target_cols = columns(to, table)?;
        if sorted(&cols) != sorted(&target_cols) {
            return Err(StoreError::Invalid(format!(
                "{table} has columns {} in the source and {} in the target",
                cols.join(", "),
                target_cols.join(", ")
            )));
        }
        let data = rows(from, table, &cols)?;
        if *table == "conversation_queues" || *table == "pool_queues" {
            // Derived by the target's triggers as the deliveries arrived: the source's rows win.
            to.execute(&format!("DELETE FROM {table}"), [])?;
        }
        if *table == "messages" {
            let id = position(&cols, "id")?;
            let at = position(&cols, "settled_at")?;
            settled = data.iter().map(|r| vec![r[id].clone(), r[at].clone()]).collect();
        }
        insert(to, table, &cols, &data)?;
        tables.push((*table, data.len() as u64));
    }
    // The deliveries' and attempts' triggers moved `settled_at` as they arrived.
    let mut put_back = to.prepare("UPDATE messages SET settled_at = $2 WHERE id = $1")?;
    for row in &settled {
        let args: Vec<&dyn ToSql> = row.iter().map(|v| v as &dyn ToSql).collect();
        put_back.execute(&args[..])?;
    }
    for (table, column) in SEQUENCES {
        set_drawn(to, table, column, drawn(from, table, column)?)?;
    }
    Ok(Copied { tables })
}

fn schema_is_latest(conn: &dyn Db, version: i64) -> bool {
    version == crate::store::KNOWN_SCHEMA_VERSIONS.of(conn)
}

fn position(cols: &[String], name: &str) -> StoreResult<usize> {
    cols.iter().position(|c| c == name).ok_or_else(|| StoreError::Corrupt(format!("no column {name}")))
}

fn sorted(cols: &[String]) -> Vec<String> {
    let mut c = cols.to_vec();
    c.sort();
    c
}

/// Every difference between the records `a` and `b` (at most `COMPARE_DIFFERENCES_MAX`), row by
/// row and counter by counter, independent of row order: empty when they hold the same.
pub fn compare(a: &dyn Db, b: &dyn Db) -> StoreResult<Vec<String>> {
    let mut out = Vec::new();
    for table in TABLES {
        let mut cols = columns(a, table)?;
        cols.sort();
        let key = |rows: Vec<Vec<Value>>| -> Vec<String> {
            let mut k: Vec<String> = rows.iter().map(|r| format!("{r:?}")).collect();
            k.sort();
            k
        };
        let (ra, rb) = (key(rows(a, table, &cols)?), key(rows(b, table, &cols)?));
        if ra.len() != rb.len() {
            out.push(format!("{table}: {} rows against {}", ra.len(), rb.len()));
        }
        let (mut i, mut j) = (0, 0);
        while (i < ra.len() || j < rb.len()) && out.len() < COMPARE_DIFFERENCES_MAX {
            match (ra.get(i), rb.get(j)) {
                (Some(x), Some(y)) if x == y => {
                    i += 1;
                    j += 1;
                }
                (Some(x), Some(y)) if x < y => {
                    out.push(format!("{table}: only in the first: {x}"));
                    i += 1;
                }
                (Some(x), None) => {
                    out.push(format!("{table}: only in the first: {x}"));
                    i += 1;
                }
                (_, Some(y)) => {
                    out.push(format!("{table}: only in the second: {y}"));
                    j += 1;
                }
                (None, None) => break,
            }
        }
    }
    for (table, column) in SEQUENCES {
        let (x, y) = (drawn(a, table, column)?, drawn(b, table, column)?);
        if x != y {
            out.push(format!("{table}.{column}: newest number drawn {x} against {y}"));
        }
    }
    out.truncate(COMPARE_DIFFERENCES_MAX);
    Ok(out)
}

/// Where a record is, for `move_record`.
#[derive(Debug, Clone)]
pub enum Place {
    /// An SQLite file (created when it does not exist), written at this `synchronous`.
    Sqlite(std::path::PathBuf, baton_shared::sqlite::Synchronous),
    /// A PostgreSQL database (its schema created when it is empty).
    Postgres(Box<crate::store::engine::postgres::PgUrl>),
}

impl Place {
    /// How the place is named in messages (a URL without its password).
    pub fn shown(&self) -> String {
        match self {
            Place::Sqlite(path, _) => path.display().to_string(),
            Place::Postgres(url) => url.shown().to_string(),
        }
    }

    /// Opens the record (migrated to this binary's schema). Must not run on an async worker.
    fn open(&self) -> StoreResult<Box<dyn Db>> {
        match self {
            Place::Sqlite(path, synchronous) => {
                let conn = crate::store::open_write(path, *synchronous)
                    .map_err(|e| StoreError::Storage(format!("{}: {e}", path.display())))?;
                Ok(Box::new(conn))
            }
            Place::Postgres(url) => {
                let storage = |e: crate::store::engine::postgres::PgError| StoreError::Storage(e.to_string());
                crate::store::engine::postgres::connect_and_migrate_blocking(url).map_err(storage)?;
                Ok(Box::new(crate::store::engine::PgConn::connect(url).map_err(storage)?))
            }
        }
    }
}

/// Moves the whole record at `from` into the empty record at `to`: the source read in one
/// snapshot, the copy one transaction, then both compared (`compare`) and both verified. Any
/// difference or problem fails the move, naming it; the source is never changed.
pub fn move_record(from: &Place, to: &Place) -> StoreResult<Copied> {
    let (source, target) = (from.open()?, to.open()?);
    source.begin_read()?;
    unbounded_idle(&*source)?;
    let copied = crate::store::in_write_txn(&*target, |t| {
        unbounded_idle(t)?;
        copy(&*source, t)
    });
    let _ = source.control("ROLLBACK");
    let copied = copied?;
    let differences = compare(&*source, &*target)?;
    if !differences.is_empty() {
        return Err(StoreError::Internal(format!(
            "the copy at {} differs from {}:\n  {}",
            to.shown(),
            from.shown(),
            differences.join("\n  ")
        )));
    }
    for (db, place) in [(&source, from), (&target, to)] {
        let problems = crate::store::upkeep::verify::check(&**db)?;
        if !problems.is_empty() {
            let list: Vec<String> = problems.iter().map(|p| format!("{p:?}")).collect();
            return Err(StoreError::Corrupt(format!(
                "verify found problems in {}:\n  {}",
                place.shown(),
                list.join("\n  ")
            )));
        }
    }
    Ok(copied)
}

/// Lifts PostgreSQL's idle bound from the transaction open on `conn` (nothing on SQLite): each
/// side of a copy sits idle while the other reads or writes a whole table, longer than a
/// serving hub's transactions may (`db::PG_WRITE_IDLE_MAX`). A move runs with the hubs stopped.
fn unbounded_idle(conn: &dyn Db) -> StoreResult<()> {
    if let Some(sql) = dialect::IDLE_UNBOUNDED.of(conn) {
        conn.execute_batch(sql)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::engine::PgConn;
    use crate::store::lifecycle::accept::testing::{accept_one, accept_only};
    use crate::store::lifecycle::claim::claim;
    use crate::store::lifecycle::operator::{Selector, release, retire};
    use crate::store::registry::fences::{self, FenceKind, FenceScope, NewFence};
    use crate::store::{in_write_txn, testing, upkeep::verify};

    /// A record with a bit of everything: fences set and lifted, messages fanned out and one
    /// still owed its fan-out, claims, a release, a retired host, and a counter above its
    /// largest kept row.
    fn varied(c: &dyn Db) {
        let fence = |kind, scope, target, now| {
            fences::set(c, NewFence { kind, scope, target, operator: "op", reason: "r" }, now).unwrap()
        };
        let hold = fence(FenceKind::Hold, FenceScope::Conversation, Some("h"), 1);
        fence(FenceKind::Pause, FenceScope::Host, Some("host-c"), 1);
        for i in 0..4 {
            accept_one(c, "h", &format!("h{i}"), &["host-a", "host-b"]);
            accept_one(c, "q", &format!("q{i}"), &["host-a"]);
        }
        accept_only(c, "q", "owed", &["host-a"]);
        claim(c, "host-a", "i", 3, 2).unwrap();
        fences::lift(c, hold, "op", "r", 3).unwrap();
        release(c, Selector::Conversation("h"), "op", "r", 4).unwrap();
        retire(c, "host-b", "op", "r", 5).unwrap();
        c.execute("DELETE FROM operator_events WHERE id = (SELECT max(id) FROM operator_events)", []).unwrap();
    }

    fn pg(url: &str) -> PgConn {
        let url = crate::store::engine::postgres::PgUrl::parse(url).unwrap();
        crate::store::engine::postgres::connect_and_migrate_blocking(&url).unwrap();
        PgConn::connect(&url).unwrap()
    }

    /// A write transaction that sits idle past the URL's `write_idle_timeout` is ended by the
    /// server, unless the copy lifted the bound for it (`unbounded_idle`): each side of a move
    /// idles while the other reads or writes a whole table.
    #[test]
    fn a_copy_transaction_may_idle_past_the_write_idle_bound() {
        let Some(cluster) = baton_testkit::pg::cluster_or_skip("a_copy_transaction_may_idle", false) else {
            return;
        };
        let url = format!("{}&write_idle_timeout=1", cluster.url());
        let idle_then_commit = |lifted: bool| {
            let conn = pg(&url);
            conn.begin_write().unwrap();
            if lifted {
                unbounded_idle(&conn).unwrap();
            }
            conn.execute_batch("SELECT 1").unwrap();
            std::thread::sleep(std::time::Duration::from_millis(2500));
            conn.execute_batch("SELECT 1").and_then(|()| conn.control("COMMIT"))
        };
        idle_then_commit(true).expect("the lifted transaction is still there after idling");
        let ended = idle_then_commit(false).expect_err("the server ends an idle write transaction");
        assert!(ended.to_string().contains("idle"), "{ended}");
    }

    /// SQLite → PostgreSQL → a new SQLite file: each copy holds the same rows and counters as
    /// its source, verifies clean, and goes on drawing numbers where the source would have.
    #[test]
    fn a_record_moves_to_postgres_and_back_unchanged() {
        let Some(cluster) = baton_testkit::pg::cluster_or_skip("a_record_moves_to_postgres_and_back", false) else {
            return;
        };
        let source = testing::db();
        let src = &*source.conn;
        varied(src);
        assert_eq!(verify::check(src).unwrap(), vec![]);

        let target = pg(&cluster.url());
        let copied = in_write_txn(&target, |t| copy(src, t)).unwrap();
        assert!(copied.rows() > 20, "{copied:?}");
        assert_eq!(compare(src, &target).unwrap(), Vec::<String>::new());
        assert_eq!(verify::check(&target).unwrap(), vec![]);

        let dir = tempfile::tempdir().unwrap();
        let back =
            crate::store::open_write(&dir.path().join("back.db"), baton_shared::sqlite::Synchronous::Normal).unwrap();
        in_write_txn(&back, |t| copy(&target, t)).unwrap();
        assert_eq!(compare(src, &back).unwrap(), Vec::<String>::new());
        assert_eq!(verify::check(&back).unwrap(), vec![]);

        // The copies draw the number the source would have drawn next.
        for c in [src, &target as &dyn Db, &back] {
            crate::store::registry::audit::record_operator_event(c, "t", "next", "op", None, 9).unwrap();
        }
        let next = |c: &dyn Db| -> i64 {
            c.query_row("SELECT id FROM operator_events WHERE action = 't'", [], |r| r.get(0)).unwrap()
        };
        assert_eq!(next(&target), next(src));
        assert_eq!(next(&back), next(src));
    }

    /// A target that holds anything is refused, and left as it was.
    #[test]
    fn a_copy_goes_only_into_an_empty_record() {
        let source = testing::db();
        varied(&*source.conn);
        let target = testing::db();
        let e = in_write_txn(&*target.conn, |t| copy(&*source.conn, t)).unwrap_err();
        assert!(e.to_string().contains("already holds a record (3 rows in hosts)"), "{e}");
        let differences = compare(&*source.conn, &*target.conn).unwrap();
        assert!(differences.iter().any(|d| d.starts_with("hosts: only in the first")), "{differences:?}");
    }
}
