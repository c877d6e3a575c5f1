//! The engine: every difference between SQLite and PostgreSQL, behind `Db`, the one connection
//! type the store's operations are written against, so that every operation's body is the
//! same code on either backend.
//!
//! `Db` keeps rusqlite's shape: `prepare_cached(sql)` gives a `Stmt` with `execute`,
//! `query_row`, `query_map` and `exists`; a row is a `Row` whose `get` takes any `FromSql`.
//! Parameters are the engine's `Params` (a slice or array of one type, `params![..]` for
//! several), numbered `$1`, `$2`, ... in the statement, as both servers accept them. Values
//! cross as SQLite's five storage classes (`ToSql`, `FromSql`, `Value`) on either backend.
//!
//! - `error`: `DbError`, each backend's failures classified into the kinds the store acts on,
//!   so `.optional()` (`OptionalExtension`) and `StoreError::from` never ask which backend
//!   failed.
//! - `sqlite`: an SQLite `Connection` is a `Db` as it is; each `$N` is bound by its name (SQLite
//!   numbers named parameters by first appearance, so never by position); the strict open and
//!   the operations only a file has (`SqliteFile`: integrity check, checkpoint, copy).
//! - `postgres`: `PgConn` (`postgres/conn.rs`), a `Db` over one PostgreSQL connection, which
//!   prepares each statement as it is written (cached by its text), with its value conversions
//!   and NUL escaping (`postgres/values.rs`); connecting, TLS, migrations and statistics.
//! - `dialect`: every statement whose text must differ between the two, as named pairs (`Both`)
//!   with the reason; an operation takes its text with `Both::of(conn)` and never asks which
//!   backend it runs on. Nothing rewrites SQL at run time.

pub mod dialect;
pub mod error;
pub mod postgres;
pub mod sqlite;

pub use error::{DbError, DbErrorKind, DbResult, OptionalExtension};
pub use postgres::conn::{
    PG_CALL_WAIT_MAX, PG_CONFLICT_RETRIES, PG_STATEMENT_CACHE_MAX, PG_WRITE_IDLE_MAX, PgConn, WRITE_LOCK_KEY,
    pg_error_kind,
};
pub use postgres::values::{PG_TEXT_ESCAPE, pg_text_escaped, pg_text_unescaped};
/// Values cross the seam as SQLite's five storage classes, on either backend: these are the
/// conversions into and out of them.
pub use rusqlite::ToSql;
pub use rusqlite::types::{FromSql, Value, ValueRef};
pub use sqlite::{STATEMENT_CACHE_CAPACITY, SqliteConnection, SqliteFile, open_as_is, open_sqlite};

use postgres::conn::Prepared;
use rusqlite::types::FromSqlError;
use sqlite::sqlite_error;
use std::sync::Arc;

/// Which SQL the connection speaks: what `dialect::Both::of` picks a statement's text by. The
/// store's operations never ask it themselves (the tidy test
/// `backend_differences_live_in_the_store_engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite.
    Sqlite,
    /// PostgreSQL.
    Postgres,
}

/// A connection the store's operations run on. See the module documentation.
pub trait Db {
    /// A prepared statement for `sql`, from the connection's cache when it has been seen.
    fn prepare_cached(&self, sql: &str) -> DbResult<Stmt<'_>>;
    /// Runs one or more statements without parameters or results.
    fn execute_batch(&self, sql: &str) -> DbResult<()>;
    /// Runs one transaction-control statement (`SAVEPOINT x`, `RELEASE x`, `ROLLBACK TO x`,
    /// `COMMIT`, `ROLLBACK`).
    fn control(&self, sql: &str) -> DbResult<()>;
    /// Begins a write transaction: on SQLite `BEGIN IMMEDIATE` (the file's write lock); on
    /// PostgreSQL a transaction that first takes the record's write lock (`WRITE_LOCK_KEY`), so
    /// writers on every hub run one after another, as on one SQLite file.
    fn begin_write(&self) -> DbResult<()>;
    /// Begins a write transaction that runs claims and holders' handoff steps and nothing else
    /// (`store::writer`'s shared jobs). On SQLite it is `begin_write`. On PostgreSQL it takes
    /// the record's write lock in shared mode, so such transactions on several hubs run at once
    /// while every other writer still waits for all of them (and they for it); what keeps them
    /// apart is row locks (see `store::lifecycle::claim` and `store::lifecycle::handoff`).
    fn begin_shared(&self) -> DbResult<()> {
        self.begin_write()
    }
    /// Begins a read transaction: every query in it sees one snapshot.
    fn begin_read(&self) -> DbResult<()>;
    /// The dialect (for `dialect::Both::of`).
    fn dialect(&self) -> Dialect;
    /// Whether the connection is gone and a new one is needed (a database server restarted).
    fn broken(&self) -> bool;
    /// The SQLite file under the connection, for the operations that exist only on a file
    /// (a copy, a checkpoint, the file's integrity check); `None` on PostgreSQL.
    fn sqlite_file(&self) -> Option<SqliteFile<'_>>;
    /// Sends the writes `Stmt::execute_unread` kept and waits for them: their failure is then
    /// this call's. Nothing to do on SQLite (they ran at once) or when none wait.
    fn flush(&self) -> DbResult<()> {
        Ok(())
    }
}

impl<T: Db + ?Sized> Db for Box<T> {
    fn prepare_cached(&self, sql: &str) -> DbResult<Stmt<'_>> {
        (**self).prepare_cached(sql)
    }
    fn execute_batch(&self, sql: &str) -> DbResult<()> {
        (**self).execute_batch(sql)
    }
    fn control(&self, sql: &str) -> DbResult<()> {
        (**self).control(sql)
    }
    fn begin_write(&self) -> DbResult<()> {
        (**self).begin_write()
    }
    fn begin_shared(&self) -> DbResult<()> {
        (**self).begin_shared()
    }
    fn begin_read(&self) -> DbResult<()> {
        (**self).begin_read()
    }
    fn dialect(&self) -> Dialect {
        (**self).dialect()
    }
    fn broken(&self) -> bool {
        (**self).broken()
    }
    fn sqlite_file(&self) -> Option<SqliteFile<'_>> {
        (**self).sqlite_file()
    }
    fn flush(&self) -> DbResult<()> {
        (**self).flush()
    }
}

impl dyn Db + '_ {
    /// `prepare_cached` (every statement is cached).
    pub fn prepare(&self, sql: &str) -> DbResult<Stmt<'_>> {
        self.prepare_cached(sql)
    }

    /// Runs one statement, returning how many rows it changed.
    pub fn execute<P: Params>(&self, sql: &str, params: P) -> DbResult<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    /// Runs one query and maps its first row (`DbErrorKind::NoRows` when it has none).
    pub fn query_row<T, P, F>(&self, sql: &str, params: P, f: F) -> DbResult<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> DbResult<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

/// A prepared statement of a `Db`.
pub struct Stmt<'c>(Inner<'c>);

enum Inner<'c> {
    Sqlite(rusqlite::CachedStatement<'c>),
    Pg { conn: &'c PgConn, prepared: Arc<Prepared> },
}

fn no_rows() -> DbError {
    sqlite_error(rusqlite::Error::QueryReturnedNoRows)
}

impl Stmt<'_> {
    /// Runs the statement, returning how many rows it changed.
    pub fn execute<P: Params>(&mut self, params: P) -> DbResult<usize> {
        match &mut self.0 {
            Inner::Sqlite(s) => {
                sqlite::bind(s, &params)?;
                s.raw_execute().map_err(sqlite_error)
            }
            Inner::Pg { conn, prepared } => conn.execute(prepared, &postgres::values::pg_values(&params)?),
        }
    }

    /// Runs a write whose answer the caller does not read: an append or a counter's move that
    /// nothing decides on. On SQLite it runs at once, as `execute`. On PostgreSQL it is sent
    /// ahead of the connection's next call, in that call's round trip, and its failure is that
    /// call's failure, at the latest the `RELEASE` of the savepoint it was made in or the
    /// `COMMIT` (see `postgres/conn.rs`). Use it only where a failure is not an answer the
    /// caller acts on (not for a write that a unique key may refuse, nor one whose row count
    /// is checked).
    pub fn execute_unread<P: Params>(&mut self, params: P) -> DbResult<()> {
        match &mut self.0 {
            Inner::Sqlite(s) => {
                sqlite::bind(s, &params)?;
                s.raw_execute().map(drop).map_err(sqlite_error)
            }
            Inner::Pg { conn, prepared } => {
                conn.execute_unread(prepared, postgres::values::pg_values(&params)?);
                Ok(())
            }
        }
    }

    /// Runs the query and maps its first row (`DbErrorKind::NoRows` when it has none).
    pub fn query_row<T, P, F>(&mut self, params: P, f: F) -> DbResult<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> DbResult<T>,
    {
        match &mut self.0 {
            Inner::Sqlite(s) => {
                sqlite::bind(s, &params)?;
                let mut rows = s.raw_query();
                let first = rows.next().map_err(sqlite_error)?.ok_or_else(no_rows)?;
                f(&Row(RowInner::Sqlite(first)))
            }
            Inner::Pg { conn, prepared } => {
                let rows = conn.query(prepared, &postgres::values::pg_values(&params)?)?;
                let first = rows.first().ok_or_else(no_rows)?;
                f(&Row(RowInner::Pg { values: first, columns: &prepared.columns }))
            }
        }
    }

    /// Runs the query and maps every row, in order.
    pub fn query_map<T, P, F>(&mut self, params: P, mut f: F) -> DbResult<std::vec::IntoIter<DbResult<T>>>
    where
        P: Params,
        F: FnMut(&Row<'_>) -> DbResult<T>,
    {
        let mut all: Vec<DbResult<T>> = Vec::new();
        match &mut self.0 {
            Inner::Sqlite(s) => {
                sqlite::bind(s, &params)?;
                let mut rows = s.raw_query();
                loop {
                    match rows.next() {
                        Ok(Some(r)) => all.push(f(&Row(RowInner::Sqlite(r)))),
                        Ok(None) => break,
                        Err(e) => {
                            all.push(Err(sqlite_error(e)));
                            break;
                        }
                    }
                }
            }
            Inner::Pg { conn, prepared } => {
                let rows = conn.query(prepared, &postgres::values::pg_values(&params)?)?;
                all.extend(rows.iter().map(|v| f(&Row(RowInner::Pg { values: v, columns: &prepared.columns }))));
            }
        }
        Ok(all.into_iter())
    }

    /// Whether the query returns at least one row.
    pub fn exists<P: Params>(&mut self, params: P) -> DbResult<bool> {
        match &mut self.0 {
            Inner::Sqlite(s) => {
                sqlite::bind(s, &params)?;
                Ok(s.raw_query().next().map_err(sqlite_error)?.is_some())
            }
            Inner::Pg { conn, prepared } => {
                Ok(!conn.query(prepared, &postgres::values::pg_values(&params)?)?.is_empty())
            }
        }
    }
}

/// A column's position (as rusqlite's `RowIndex`, by number only).
pub trait ColumnIndex {
    /// The zero-based position.
    fn index(self) -> usize;
}

impl ColumnIndex for usize {
    fn index(self) -> usize {
        self
    }
}

/// One result row of a `Stmt`.
pub struct Row<'a>(RowInner<'a>);

enum RowInner<'a> {
    Sqlite(&'a rusqlite::Row<'a>),
    Pg { values: &'a [Value], columns: &'a [String] },
}

impl Row<'_> {
    /// Column `idx`, converted by `T`'s `FromSql` (as rusqlite's `Row::get`).
    pub fn get<I: ColumnIndex, T: FromSql>(&self, idx: I) -> DbResult<T> {
        let idx = idx.index();
        match &self.0 {
            RowInner::Sqlite(r) => r.get(idx).map_err(sqlite_error),
            RowInner::Pg { values, .. } => {
                let value = values.get(idx).ok_or_else(|| sqlite_error(rusqlite::Error::InvalidColumnIndex(idx)))?;
                let value_ref = ValueRef::from(value);
                T::column_result(value_ref)
                    .map_err(|e| match e {
                        FromSqlError::InvalidType => {
                            rusqlite::Error::InvalidColumnType(idx, self.column_name(idx), value_ref.data_type())
                        }
                        FromSqlError::OutOfRange(i) => rusqlite::Error::IntegralValueOutOfRange(idx, i),
                        FromSqlError::Other(err) => {
                            rusqlite::Error::FromSqlConversionFailure(idx, value_ref.data_type(), err)
                        }
                        other => rusqlite::Error::FromSqlConversionFailure(idx, value_ref.data_type(), Box::new(other)),
                    })
                    .map_err(sqlite_error)
            }
        }
    }

    /// Column `idx` as it is stored.
    pub fn get_ref(&self, idx: usize) -> DbResult<ValueRef<'_>> {
        match &self.0 {
            RowInner::Sqlite(r) => r.get_ref(idx).map_err(sqlite_error),
            RowInner::Pg { values, .. } => values
                .get(idx)
                .map(ValueRef::from)
                .ok_or_else(|| sqlite_error(rusqlite::Error::InvalidColumnIndex(idx))),
        }
    }

    /// The name of column `idx` (for error messages).
    pub fn column_name(&self, idx: usize) -> String {
        let name = match &self.0 {
            RowInner::Sqlite(r) => r.as_ref().column_name(idx).ok().map(str::to_string),
            RowInner::Pg { columns, .. } => columns.get(idx).cloned(),
        };
        name.unwrap_or_else(|| format!("column {idx}"))
    }
}

/// One statement parameter, bound to the `$N` its place names.
///
/// Today each is one value in one of SQLite's storage classes. A set-based statement could
/// hand PostgreSQL a whole array for one `$N` (`unnest($1)`): that would be another variant
/// here, which each backend's binding (`sqlite::bind`, `postgres::values::pg_values`) must then take on.
pub enum Arg<'a> {
    /// One value.
    Value(&'a dyn ToSql),
}

/// A statement's parameters: the first is `$1`, the second `$2`, and so on; every statement
/// names each of them. A slice or an array of one type, `()` or `[]` for none, or
/// `params![a, b, ..]` for values of several types.
pub trait Params {
    /// How many there are.
    fn count(&self) -> usize;
    /// Parameter `$n` (counted from 1), or `None` past the last.
    fn arg(&self, n: usize) -> Option<Arg<'_>>;
}

/// Parameters of several types, `$1` first: `params![host, 3, now_ms]`.
macro_rules! params {
    ($($param:expr),* $(,)?) => {
        &[$(&$param as &dyn $crate::store::engine::ToSql),*] as &[&dyn $crate::store::engine::ToSql]
    };
}
pub(crate) use params;

impl Params for () {
    fn count(&self) -> usize {
        0
    }
    fn arg(&self, _: usize) -> Option<Arg<'_>> {
        None
    }
}

/// `[]`: no parameters (the element type a bare `[]` is inferred as).
impl Params for [&(dyn ToSql + Send + Sync); 0] {
    fn count(&self) -> usize {
        0
    }
    fn arg(&self, _: usize) -> Option<Arg<'_>> {
        None
    }
}

impl<T: ToSql> Params for [T] {
    fn count(&self) -> usize {
        self.len()
    }
    fn arg(&self, n: usize) -> Option<Arg<'_>> {
        self.get(n.checked_sub(1)?).map(|v| Arg::Value(v))
    }
}

impl<T: ToSql> Params for Vec<T> {
    fn count(&self) -> usize {
        self.len()
    }
    fn arg(&self, n: usize) -> Option<Arg<'_>> {
        self.as_slice().arg(n)
    }
}

impl<P: Params + ?Sized> Params for &P {
    fn count(&self) -> usize {
        (**self).count()
    }
    fn arg(&self, n: usize) -> Option<Arg<'_>> {
        (**self).arg(n)
    }
}

macro_rules! array_params {
    ($($n:literal)*) => {$(
        impl<T: ToSql> Params for [T; $n] {
            fn count(&self) -> usize {
                $n
            }
            fn arg(&self, n: usize) -> Option<Arg<'_>> {
                self.as_slice().arg(n)
            }
        }
    )*};
}
array_params!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);

#[cfg(test)]
mod tests {
    use super::*;

    /// `$N` is the Nth parameter on both backends, wherever it first appears (SQLite numbers
    /// named parameters by first appearance; they are bound by name); a statement must name
    /// every parameter it is given, and only `$N` parameters.
    #[test]
    fn parameters_are_bound_by_their_number() {
        let db = crate::store::testing::db();
        let c = &db.conn;
        let got: (String, i64, String) = c
            .query_row(
                "SELECT CAST($3 AS TEXT), CAST($1 AS BIGINT) + 1, CAST($3 AS TEXT) || CAST($2 AS TEXT)",
                params![41i64, "b", "c"],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(got, ("c".to_string(), 42, "cb".to_string()));
        let swapped: (i64, i64) = c
            .query_row("SELECT CAST($2 AS BIGINT), CAST($1 AS BIGINT)", [1i64, 2], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        assert_eq!(swapped, (2, 1));
        assert!(
            c.query_row("SELECT CAST($1 AS BIGINT)", [1i64, 2], |r| r.get::<_, i64>(0)).is_err(),
            "$2 named nowhere"
        );
        assert!(c.query_row("SELECT CAST($2 AS BIGINT)", [1i64], |r| r.get::<_, i64>(0)).is_err(), "no $2 given");
        if c.dialect() == Dialect::Sqlite {
            for sql in ["SELECT ?1", "SELECT :x", "SELECT $x"] {
                let e = c.query_row(sql, [1i64], |r| r.get::<_, i64>(0)).unwrap_err();
                assert!(e.to_string().contains("$N"), "{sql}: {e}");
            }
        }
    }
}
