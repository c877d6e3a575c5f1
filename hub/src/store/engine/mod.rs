//! `Db`: the one connection type the store's operations are written against, so that every
//! operation's body is the same code on SQLite and on PostgreSQL.
//!
//! `Db` keeps rusqlite's shape: `prepare_cached(sql)` gives a `Stmt` with `execute`,
//! `query_row`, `query_map` and `exists`; a row is a `Row` whose `get` takes any `FromSql`.
//! Parameters are the engine's `Params` (a slice or array of one type, `params![..]` for
//! several), numbered `$1`, `$2`, ... in the statement, as both servers accept them. Errors are the engine's own `DbError`
//! (`error`), each backend's failures classified into the kinds the store acts on, so
//! `.optional()` (`OptionalExtension`) and `StoreError::from` never ask which backend failed. An
//! SQLite `Connection` is a `Db` as it is; `PgConn` is a `Db` over one PostgreSQL connection:
//!
//! - SQL text is written once, in the dialect both servers accept, with `$N` parameters:
//!   PostgreSQL takes them as they are; SQLite, which numbers named parameters by their first
//!   appearance, has each bound by its name (`bind_sqlite`), never by position. Only SQLite's
//!   scalar `max`/`min` and its planner hints are still rewritten for PostgreSQL when a
//!   statement is prepared (and cached by its text).
//! - Values cross as SQLite's five storage classes: a parameter is converted into whatever type
//!   PostgreSQL inferred for its slot (`BIGINT`, `INTEGER`, `BOOLEAN`, `TEXT`, ...), and a column
//!   is read back as an integer, real, text, blob or null (a `BOOLEAN` as 0/1, a `NUMERIC` as an
//!   integer when it has no fraction), so each column's `FromSql` is the same on both.
//! - Text crosses escaped (`PG_TEXT_ESCAPE`): PostgreSQL's `text` cannot hold NUL, SQLite's can,
//!   and a value is never a storage error, so NUL is written as an escape and read back as NUL.
//! - A PostgreSQL failure is classified by its SQLSTATE (`pg_error_kind`) and carries the
//!   server's message and the statement (for logs).
//!
//! `PgConn` is synchronous, like rusqlite: it owns a current-thread runtime on which its
//! connection's I/O runs, and each call waits on it. It is used only on the store's own
//! threads (the writer, the reader pool's blocking tasks), never on an async worker.
//!
//! Savepoints cost no round trip of their own on PostgreSQL: `SAVEPOINT`, `RELEASE` and
//! `ROLLBACK TO` are kept and sent in the same round trip as the connection's next statement,
//! pipelined ahead of it (`PgConn::deferred`); the server runs them in order, so the result is
//! the same, and a failure of one of them is the error of that next call (at the latest the
//! `COMMIT`, which then fails and rolls everything back). A writer job's savepoint and a batch
//! item's each were a round trip before: about a third of the statements of a delivery.
//!
//! Why one file over 700 lines: the trait, SQLite's implementation and PostgreSQL's `PgConn`
//! (its value conversions and statement cache) are the engine's one seam; about 90 lines are
//! unit tests.

pub mod dialect;
pub mod error;
pub mod postgres;

pub use error::{DbError, DbErrorKind, DbResult, OptionalExtension};
/// Values cross the seam as SQLite's five storage classes, on either backend: these are the
/// conversions into and out of them.
pub use rusqlite::ToSql;
pub use rusqlite::types::{FromSql, Value, ValueRef};

/// An SQLite connection: a `Db` as it is (and what the writer, a one-shot process and the
/// reader pool hold on an SQLite record).
pub use rusqlite::Connection as SqliteConnection;

use rusqlite::Connection;
use rusqlite::types::FromSqlError;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use tokio_postgres::types::ToSql as PgToSql;

/// Which SQL the connection speaks, for the few statements that must differ.
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
    /// Begins a write transaction that runs claims and nothing else. On SQLite it is
    /// `begin_write`. On PostgreSQL it takes the record's write lock in shared mode, so claim
    /// transactions on several hubs run at once while every other writer still waits for all of
    /// them (and they for it); what keeps two claims apart is row locks (see `store::lifecycle::claim`).
    fn begin_claims(&self) -> DbResult<()> {
        self.begin_write()
    }
    /// Begins a read transaction: every query in it sees one snapshot.
    fn begin_read(&self) -> DbResult<()>;
    /// The dialect.
    fn dialect(&self) -> Dialect;
    /// Whether the connection is gone and a new one is needed (a database server restarted).
    fn broken(&self) -> bool;
    /// The SQLite file under the connection, for the operations that exist only on a file
    /// (a copy, a checkpoint, the file's integrity check); `None` on PostgreSQL.
    fn sqlite_file(&self) -> Option<SqliteFile<'_>>;
}

impl Db for Connection {
    fn prepare_cached(&self, sql: &str) -> DbResult<Stmt<'_>> {
        Ok(Stmt(Inner::Sqlite(Connection::prepare_cached(self, sql).map_err(sqlite_error)?)))
    }
    fn execute_batch(&self, sql: &str) -> DbResult<()> {
        Connection::execute_batch(self, sql).map_err(sqlite_error)
    }
    fn control(&self, sql: &str) -> DbResult<()> {
        Connection::prepare_cached(self, sql).and_then(|mut s| s.execute([])).map_err(sqlite_error)?;
        Ok(())
    }
    fn begin_write(&self) -> DbResult<()> {
        Db::control(self, "BEGIN IMMEDIATE")
    }
    fn begin_read(&self) -> DbResult<()> {
        Db::control(self, "BEGIN")
    }
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }
    fn broken(&self) -> bool {
        false
    }
    fn sqlite_file(&self) -> Option<SqliteFile<'_>> {
        Some(SqliteFile(self))
    }
}

/// The SQLite file under a connection (`Db::sqlite_file`): what only a file has.
pub struct SqliteFile<'c>(&'c Connection);

impl SqliteFile<'_> {
    /// SQLite's full `integrity_check` of the whole file: every problem it reports, none when
    /// the file is sound. Its time grows with the database.
    pub fn integrity(&self) -> DbResult<Vec<String>> {
        let mut stmt = self.0.prepare("PRAGMA integrity_check").map_err(sqlite_error)?;
        let lines: Vec<String> = stmt.query_map([], |r| r.get(0)).and_then(Iterator::collect).map_err(sqlite_error)?;
        Ok(lines.into_iter().filter(|l| l != "ok").collect())
    }

    /// Folds the write-ahead log into the database file and empties it (`wal_checkpoint(
    /// TRUNCATE)`); false when a reader kept it from finishing.
    pub fn checkpoint(&self) -> DbResult<bool> {
        let busy: i64 = self.0.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0)).map_err(sqlite_error)?;
        Ok(busy == 0)
    }

    /// Writes a consistent copy of the database into the (empty) file at `target`
    /// (`VACUUM INTO`). `VACUUM INTO` writes only the new file, which SQLite allows on a
    /// read-only connection, but `query_only` (which `open_read` sets) refuses it: it is lifted
    /// for this one statement.
    pub fn copy_into(&self, target: &str) -> DbResult<()> {
        let conn = self.0;
        let query_only: bool = conn.query_row("PRAGMA query_only", [], |r| r.get(0)).map_err(sqlite_error)?;
        conn.pragma_update(None, "query_only", false).map_err(sqlite_error)?;
        let copied = conn.execute("VACUUM INTO ?1", [target]);
        conn.pragma_update(None, "query_only", query_only).map_err(sqlite_error)?;
        copied.map_err(sqlite_error)?;
        Ok(())
    }
}

/// Prepared statements kept per SQLite connection. The store has a few dozen distinct statements
/// and one message's path alone uses more than rusqlite's default of 16; re-preparing them on
/// every call was measured to cost more than half of the store's time.
pub const STATEMENT_CACHE_CAPACITY: usize = 256;

/// Opens the SQLite record at `path` the strict way (`baton_shared::sqlite::open`: pragmas
/// asserted, `migrations` applied, the file checked as `opts` says), with a statement cache of
/// `STATEMENT_CACHE_CAPACITY`.
pub fn open_sqlite(
    path: &std::path::Path,
    migrations: &[&'static str],
    opts: baton_shared::sqlite::OpenOptions,
) -> Result<Connection, baton_shared::sqlite::OpenError> {
    let conn = baton_shared::sqlite::open(path, migrations, opts)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    Ok(conn)
}

/// Opens the SQLite file at `path` to read only as it is: no pragma set, nothing migrated or
/// checked (what a restore reads of a file before it decides anything).
pub fn open_as_is(path: &std::path::Path) -> DbResult<Connection> {
    Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(sqlite_error)
}

/// An SQLite failure as the store needs to tell it apart (see `DbErrorKind`), with SQLite's
/// own text.
pub(crate) fn sqlite_error(e: rusqlite::Error) -> DbError {
    use rusqlite::ErrorCode as Code;
    let kind = match &e {
        rusqlite::Error::QueryReturnedNoRows => DbErrorKind::NoRows,
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            Code::DatabaseCorrupt | Code::NotADatabase => DbErrorKind::Damaged,
            Code::TooBig => DbErrorKind::BadValue,
            Code::ConstraintViolation => DbErrorKind::Constraint,
            Code::DatabaseBusy | Code::DatabaseLocked => DbErrorKind::Busy,
            _ => DbErrorKind::Other,
        },
        _ => DbErrorKind::Other,
    };
    DbError::new(kind, e.to_string())
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
    fn begin_claims(&self) -> DbResult<()> {
        (**self).begin_claims()
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
                bind_sqlite(s, &params)?;
                s.raw_execute().map_err(sqlite_error)
            }
            Inner::Pg { conn, prepared } => conn.execute(prepared, &pg_values(&params)?),
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
                bind_sqlite(s, &params)?;
                let mut rows = s.raw_query();
                let first = rows.next().map_err(sqlite_error)?.ok_or_else(no_rows)?;
                f(&Row(RowInner::Sqlite(first)))
            }
            Inner::Pg { conn, prepared } => {
                let rows = conn.query(prepared, &pg_values(&params)?)?;
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
                bind_sqlite(s, &params)?;
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
                let rows = conn.query(prepared, &pg_values(&params)?)?;
                all.extend(rows.iter().map(|v| f(&Row(RowInner::Pg { values: v, columns: &prepared.columns }))));
            }
        }
        Ok(all.into_iter())
    }

    /// Whether the query returns at least one row.
    pub fn exists<P: Params>(&mut self, params: P) -> DbResult<bool> {
        match &mut self.0 {
            Inner::Sqlite(s) => {
                bind_sqlite(s, &params)?;
                Ok(s.raw_query().next().map_err(sqlite_error)?.is_some())
            }
            Inner::Pg { conn, prepared } => Ok(!conn.query(prepared, &pg_values(&params)?)?.is_empty()),
        }
    }
}

/// Binds `params` to SQLite's statement `s` by name: `$N` takes the Nth parameter. Never by
/// position: SQLite numbers named parameters by their first appearance, so in `... $2 ... $1`
/// its first slot is `$2`. Every parameter given must be named by the statement.
fn bind_sqlite<P: Params + ?Sized>(s: &mut rusqlite::Statement<'_>, params: &P) -> DbResult<()> {
    let count = s.parameter_count();
    if count != params.count() {
        return Err(DbError::new(
            DbErrorKind::Other,
            format!("the statement takes {count} parameters ($1 to ${count}); {} were given", params.count()),
        ));
    }
    for slot in 1..=count {
        let name = s.parameter_name(slot).unwrap_or("?");
        let arg = name.strip_prefix('$').and_then(|n| n.parse::<usize>().ok()).and_then(|n| params.arg(n));
        let Some(arg) = arg else {
            return Err(DbError::new(
                DbErrorKind::Other,
                format!("the parameter {name} is not one of $1 to ${count} (statements number their parameters $N)"),
            ));
        };
        match arg {
            Arg::Value(v) => s.raw_bind_parameter(slot, v).map_err(sqlite_error)?,
        }
    }
    Ok(())
}

/// `params` as PostgreSQL takes them: the values in `$N` order.
fn pg_values<P: Params + ?Sized>(params: &P) -> DbResult<Vec<Value>> {
    (1..=params.count())
        .map(|n| match params.arg(n) {
            Some(Arg::Value(v)) => value_of(v),
            None => Err(DbError::new(DbErrorKind::Other, format!("no parameter ${n}"))),
        })
        .collect()
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
/// here, which each backend's binding (`bind_sqlite`, `pg_values`) must then take on.
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

fn value_of(p: &dyn ToSql) -> DbResult<Value> {
    use rusqlite::types::ToSqlOutput;
    match p.to_sql().map_err(sqlite_error)? {
        ToSqlOutput::Borrowed(v) => Ok(owned(v)),
        ToSqlOutput::Owned(v) => Ok(v),
        _ => Err(DbError::new(DbErrorKind::Other, "a parameter form PostgreSQL cannot take")),
    }
}

fn owned(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(r) => Value::Real(r),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

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

/// How the store must tell a PostgreSQL failure apart (see `DbErrorKind`), from its SQLSTATE
/// and whether the connection is gone.
pub fn pg_error_kind(code: Option<&str>, closed: bool) -> DbErrorKind {
    match code {
        Some("40001" | "40P01") => DbErrorKind::Conflict,
        Some(c) if c.starts_with("22") || c.starts_with("54") => DbErrorKind::BadValue,
        Some(c) if c.starts_with("23") => DbErrorKind::Constraint,
        Some("55P03") => DbErrorKind::Busy,
        _ if closed => DbErrorKind::Lost,
        _ => DbErrorKind::Other,
    }
}

fn pg_error(e: tokio_postgres::Error, sql: &str) -> DbError {
    let code = e.code().map(|c| c.code().to_string());
    let detail = match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => e.to_string(),
    };
    let kind = pg_error_kind(code.as_deref(), e.is_closed());
    let statement = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    let statement: String = statement.chars().take(160).collect();
    DbError::from_server(kind, detail, Some(&statement), code)
}

/// The character `PgConn` writes NUL with, since PostgreSQL's `text` cannot hold NUL: NUL is
/// stored as this character and `0`, the character itself as itself twice; every other
/// character as it is. Reading undoes it, so both backends give back the same bytes for every
/// text (SPEC §9). U+FFFF is a Unicode noncharacter: no encoder emits it, and a text without
/// NUL or U+FFFF (every text stored before the escape existed, in practice) is stored unchanged.
/// A U+FFFF followed by anything else reads as itself.
pub const PG_TEXT_ESCAPE: char = '\u{FFFF}';

/// `text` as `PgConn` stores it (see `PG_TEXT_ESCAPE`); borrowed when nothing needs escaping.
pub fn pg_text_escaped(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains(['\0', PG_TEXT_ESCAPE]) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\0' => {
                out.push(PG_TEXT_ESCAPE);
                out.push('0');
            }
            PG_TEXT_ESCAPE => {
                out.push(PG_TEXT_ESCAPE);
                out.push(PG_TEXT_ESCAPE);
            }
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A text as PostgreSQL gave it back, unescaped (the inverse of `pg_text_escaped`).
pub fn pg_text_unescaped(stored: String) -> String {
    if !stored.contains(PG_TEXT_ESCAPE) {
        return stored;
    }
    let mut out = String::with_capacity(stored.len());
    let mut chars = stored.chars().peekable();
    while let Some(c) = chars.next() {
        if c != PG_TEXT_ESCAPE {
            out.push(c);
            continue;
        }
        match chars.peek() {
            Some('0') => {
                chars.next();
                out.push('\0');
            }
            Some(&PG_TEXT_ESCAPE) => {
                chars.next();
                out.push(PG_TEXT_ESCAPE);
            }
            _ => out.push(PG_TEXT_ESCAPE),
        }
    }
    out
}

/// The advisory lock every write transaction on PostgreSQL takes first: one writer at a time
/// across every hub, the rule the SQLite file's write lock gives one hub.
pub const WRITE_LOCK_KEY: i64 = 0x6261_746f_6e57; // "batonW"

/// Statements a `PgConn` keeps prepared.
pub const PG_STATEMENT_CACHE_MAX: usize = 512;

/// One statement prepared on PostgreSQL.
pub struct Prepared {
    stmt: tokio_postgres::Statement,
    /// The result's column names.
    columns: Vec<String>,
    /// The statement's text as PostgreSQL got it.
    sql: String,
}

/// One PostgreSQL connection, used synchronously (see the module documentation).
pub struct PgConn {
    rt: OwnRuntime,
    /// Set when a round trip found no answer within `wait`: the connection is not used again.
    lost: std::cell::Cell<bool>,
    /// Longest wait for one round trip (`PG_CALL_WAIT_MAX` unless a test shortens it).
    wait: std::time::Duration,
    client: tokio_postgres::Client,
    cache: RefCell<HashMap<String, Arc<Prepared>>>,
    /// How long a write transaction may sit idle before the server ends it.
    write_idle: std::time::Duration,
    /// Savepoint statements not sent yet: they go ahead of the next call, in its round trip.
    deferred: RefCell<String>,
    /// The URL without its password, for messages.
    shown: String,
}

/// Longest wait for one round trip to PostgreSQL (a statement, a prepare, a transaction-control
/// statement). Past it the connection is taken as lost — a link that swallows traffic without
/// closing, which TCP alone may not notice for many minutes — and dropped: the operation fails
/// as storage unavailable (nodes retry) and the next one opens a new connection, instead of the
/// writer waiting forever. Far longer than any statement the store runs.
pub const PG_CALL_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// Longest a write transaction may sit idle on PostgreSQL (no statement in flight) before the
/// server ends it, unless the URL's `write_idle_timeout` says otherwise. A healthy writer sends
/// its next statement within microseconds; a hub that froze (stopped, swapped out) or lost its
/// link while holding the record's write lock would otherwise stop every hub's writes for
/// `PG_CALL_WAIT_MAX`. Read transactions keep the longer bound: an export may pause between
/// statements while it writes what it read.
pub const PG_WRITE_IDLE_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// How many times an operation is run again after PostgreSQL ended its transaction to resolve
/// a conflict with another (a deadlock, 40P01, or a serialization failure, 40001), unless the
/// URL's `conflict_retries` says otherwise: claims of several hubs run at once (`begin_claims`)
/// and may meet in a deadlock, which the server resolves by ending one of them. Past it the
/// operation fails as storage unavailable (which callers retry later).
pub const PG_CONFLICT_RETRIES: u32 = 8;

/// A `PgConn`'s own runtime. Dropped without waiting for its tasks (`shutdown_background`), so
/// a connection may be dropped anywhere, an async task included (the reader pool at shutdown).
struct OwnRuntime(Option<tokio::runtime::Runtime>);

/// The connection is gone: `said` says how.
fn closed(said: String) -> DbError {
    DbError::from_server(DbErrorKind::Lost, said, None, None)
}

impl OwnRuntime {
    /// Runs `f`, waiting at most `wait`; `lost` is set when it did not finish in time.
    fn block_on<F: std::future::Future>(
        &self,
        f: F,
        wait: std::time::Duration,
        lost: &std::cell::Cell<bool>,
    ) -> DbResult<F::Output> {
        let Some(rt) = &self.0 else { return Err(closed("the connection is closed".into())) };
        if lost.get() {
            return Err(closed("the connection was lost".into()));
        }
        match rt.block_on(async { tokio::time::timeout(wait, f).await }) {
            Ok(out) => Ok(out),
            Err(_) => {
                lost.set(true);
                Err(closed(format!("no answer within {wait:?}; the connection is taken as lost")))
            }
        }
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl PgConn {
    /// Begins a READ COMMITTED write transaction bounded by `write_idle` and takes the record's
    /// write lock with `lock` (`pg_advisory_xact_lock` or its `_shared` form).
    fn begin_locked(&self, lock: &str) -> DbResult<()> {
        // Nothing of an earlier transaction is left to send.
        self.deferred.borrow_mut().clear();
        Db::execute_batch(
            self,
            &format!(
                "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL idle_in_transaction_session_timeout = {}; \
                 SELECT {lock}({WRITE_LOCK_KEY})",
                self.write_idle.as_millis()
            ),
        )
    }

    /// Connects to `url` on a runtime of the new connection's own. Must not be called on an
    /// async worker thread.
    pub fn connect(
        url: &crate::store::engine::postgres::PgUrl,
    ) -> Result<PgConn, crate::store::engine::postgres::PgError> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| {
            crate::store::engine::postgres::PgError::Other {
                url: url.shown().to_string(),
                detail: format!("starting a runtime: {e}"),
            }
        })?;
        let wait = url.call_wait().unwrap_or(PG_CALL_WAIT_MAX);
        let other =
            |detail: String| crate::store::engine::postgres::PgError::Other { url: url.shown().to_string(), detail };
        // The whole connection (TCP, TLS, the start-up exchange) is one round trip's worth of
        // waiting too: a link that accepts and then swallows must not hold the caller (the
        // writer reconnecting) for ever.
        let client = rt
            .block_on(async { tokio::time::timeout(wait, crate::store::engine::postgres::connect(url)).await })
            .map_err(|_| other(format!("no answer within {wait:?} while connecting")))??;
        // A hub that loses its link mid-transaction must not hold the record's write lock (and
        // so every hub's writes) until the server notices: the server ends a transaction left
        // idle this long (a write transaction sooner: `begin_write`).
        let set = format!("SET idle_in_transaction_session_timeout = {}", wait.as_millis());
        rt.block_on(async { tokio::time::timeout(wait, client.batch_execute(&set)).await })
            .map_err(|_| other(format!("no answer within {wait:?} while connecting")))?
            .map_err(|e| other(e.to_string()))?;
        Ok(PgConn {
            rt: OwnRuntime(Some(rt)),
            lost: std::cell::Cell::new(false),
            wait,
            client,
            cache: RefCell::new(HashMap::new()),
            deferred: RefCell::new(String::new()),
            write_idle: url.write_idle().unwrap_or(PG_WRITE_IDLE_MAX),
            shown: url.shown().to_string(),
        })
    }

    /// The URL, without its password.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Runs `call` after the deferred savepoint statements, in the same round trip: both are
    /// sent before either answer is awaited, and the server runs them in order. A failure of
    /// the deferred statements is the result (`call` then failed too: the transaction is in
    /// error).
    fn after_deferred<T, F>(&self, call: F, sql: &str) -> DbResult<T>
    where
        F: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let deferred = self.deferred.take();
        if deferred.is_empty() {
            return self.rt.block_on(call, self.wait, &self.lost)?.map_err(|e| pg_error(e, sql));
        }
        let both = async { tokio::join!(self.client.batch_execute(&deferred), call) };
        let (first, out) = self.rt.block_on(both, self.wait, &self.lost)?;
        first.map_err(|e| pg_error(e, &deferred))?;
        out.map_err(|e| pg_error(e, sql))
    }

    fn execute(&self, p: &Prepared, values: &[Value]) -> DbResult<usize> {
        let params = pg_params(values);
        let params: Vec<&(dyn PgToSql + Sync)> = params.iter().map(|p| p as &(dyn PgToSql + Sync)).collect();
        let n = self.after_deferred(self.client.execute(&p.stmt, &params), &p.sql)?;
        usize::try_from(n).map_err(|_| sqlite_error(rusqlite::Error::IntegralValueOutOfRange(0, i64::MAX)))
    }

    fn query(&self, p: &Prepared, values: &[Value]) -> DbResult<Vec<Vec<Value>>> {
        let params = pg_params(values);
        let params: Vec<&(dyn PgToSql + Sync)> = params.iter().map(|p| p as &(dyn PgToSql + Sync)).collect();
        let rows = self.after_deferred(self.client.query(&p.stmt, &params), &p.sql)?;
        rows.iter()
            .map(|row| {
                (0..row.len())
                    .map(|i| row.try_get::<_, Cell>(i).map(|c| c.0).map_err(|e| pg_error(e, &p.sql)))
                    .collect()
            })
            .collect()
    }
}

impl Db for PgConn {
    fn prepare_cached(&self, sql: &str) -> DbResult<Stmt<'_>> {
        if let Some(p) = self.cache.borrow().get(sql) {
            return Ok(Stmt(Inner::Pg { conn: self, prepared: p.clone() }));
        }
        let stmt = self.after_deferred(self.client.prepare(sql), sql)?;
        let columns = stmt.columns().iter().map(|c| c.name().to_string()).collect();
        let prepared = Arc::new(Prepared { stmt, columns, sql: sql.to_string() });
        let mut cache = self.cache.borrow_mut();
        if cache.len() >= PG_STATEMENT_CACHE_MAX {
            cache.clear();
        }
        cache.insert(sql.to_string(), prepared.clone());
        Ok(Stmt(Inner::Pg { conn: self, prepared }))
    }
    fn execute_batch(&self, sql: &str) -> DbResult<()> {
        self.after_deferred(self.client.batch_execute(sql), sql)
    }
    fn control(&self, sql: &str) -> DbResult<()> {
        if is_savepoint_statement(sql) {
            let mut deferred = self.deferred.borrow_mut();
            deferred.push_str(sql);
            deferred.push(';');
            return Ok(());
        }
        if sql.trim().eq_ignore_ascii_case("ROLLBACK") {
            // The whole transaction goes: its savepoints do not matter, and one that failed
            // must not keep the rollback from being sent.
            self.deferred.borrow_mut().clear();
        }
        Db::execute_batch(self, sql)
    }
    fn begin_write(&self) -> DbResult<()> {
        self.begin_locked("pg_advisory_xact_lock")
    }
    fn begin_claims(&self) -> DbResult<()> {
        self.begin_locked("pg_advisory_xact_lock_shared")
    }
    fn begin_read(&self) -> DbResult<()> {
        self.deferred.borrow_mut().clear();
        Db::execute_batch(self, "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    }
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }
    fn broken(&self) -> bool {
        self.lost.get() || self.client.is_closed()
    }
    fn sqlite_file(&self) -> Option<SqliteFile<'_>> {
        None
    }
}

/// Whether `sql` is a savepoint statement (`SAVEPOINT x`, `RELEASE x`, `ROLLBACK TO x`), which
/// `PgConn` sends ahead of the next call instead of on its own.
fn is_savepoint_statement(sql: &str) -> bool {
    let sql = sql.trim_start().as_bytes();
    ["SAVEPOINT ", "RELEASE ", "ROLLBACK TO "]
        .iter()
        .any(|p| sql.len() >= p.len() && sql[..p.len()].eq_ignore_ascii_case(p.as_bytes()))
}

/// A parameter converted into the type PostgreSQL inferred for its slot.
#[derive(Debug)]
struct Param<'a>(&'a Value);

fn pg_params(values: &[Value]) -> Vec<Param<'_>> {
    values.iter().map(Param).collect()
}

impl tokio_postgres::types::ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use tokio_postgres::types::{IsNull, Type};
        let wrong = |what: &str| -> Box<dyn std::error::Error + Sync + Send> {
            format!("a {what} value for a parameter of type {ty}").into()
        };
        match self.0 {
            Value::Null => Ok(IsNull::Yes),
            Value::Integer(v) => match *ty {
                Type::INT8 => PgToSql::to_sql(&v, ty, out),
                Type::INT4 => PgToSql::to_sql(&i32::try_from(*v).map_err(|_| wrong("too large integer"))?, ty, out),
                Type::INT2 => PgToSql::to_sql(&i16::try_from(*v).map_err(|_| wrong("too large integer"))?, ty, out),
                Type::BOOL => PgToSql::to_sql(&(*v != 0), ty, out),
                Type::FLOAT8 => PgToSql::to_sql(&(*v as f64), ty, out),
                Type::TEXT | Type::VARCHAR | Type::UNKNOWN => PgToSql::to_sql(&v.to_string(), &Type::TEXT, out),
                _ => Err(wrong("integer")),
            },
            Value::Real(v) => match *ty {
                Type::FLOAT8 => PgToSql::to_sql(&v, ty, out),
                Type::FLOAT4 => PgToSql::to_sql(&(*v as f32), ty, out),
                _ => Err(wrong("real")),
            },
            Value::Text(s) => match *ty {
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    PgToSql::to_sql(&&*pg_text_escaped(s), &Type::TEXT, out)
                }
                Type::BYTEA => PgToSql::to_sql(&s.as_bytes(), ty, out),
                _ => Err(wrong("text")),
            },
            Value::Blob(b) => match *ty {
                Type::BYTEA => PgToSql::to_sql(&b.as_slice(), ty, out),
                _ => Err(wrong("blob")),
            },
        }
    }

    fn accepts(_: &tokio_postgres::types::Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// A column read back as one of SQLite's storage classes.
struct Cell(Value);

impl<'a> tokio_postgres::types::FromSql<'a> for Cell {
    fn from_sql(
        ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Cell, Box<dyn std::error::Error + Sync + Send>> {
        use tokio_postgres::types::Type;
        let v = match *ty {
            Type::INT8 => Value::Integer(i64::from_sql(ty, raw)?),
            Type::INT4 => Value::Integer(i32::from_sql(ty, raw)?.into()),
            Type::INT2 => Value::Integer(i16::from_sql(ty, raw)?.into()),
            Type::OID => Value::Integer(u32::from_sql(ty, raw)?.into()),
            Type::BOOL => Value::Integer(bool::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Real(f32::from_sql(ty, raw)?.into()),
            Type::NUMERIC => numeric(raw)?,
            Type::BYTEA => Value::Blob(<Vec<u8>>::from_sql(ty, raw)?),
            _ => Value::Text(pg_text_unescaped(
                String::from_sql(&Type::TEXT, raw).map_err(|_| format!("a column of type {ty}"))?,
            )),
        };
        Ok(Cell(v))
    }

    fn from_sql_null(_: &tokio_postgres::types::Type) -> Result<Cell, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Cell(Value::Null))
    }

    fn accepts(_: &tokio_postgres::types::Type) -> bool {
        true
    }
}

/// A `NUMERIC` (what `sum` of `BIGINT` gives) in its binary form: an integer when it has no
/// fraction and fits, else a real.
fn numeric(raw: &[u8]) -> Result<Value, Box<dyn std::error::Error + Sync + Send>> {
    let word = |i: usize| -> Result<i16, Box<dyn std::error::Error + Sync + Send>> {
        let b = raw.get(i * 2..i * 2 + 2).ok_or("a short NUMERIC")?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    };
    let (ndigits, weight, sign) = (word(0)?, word(1)?, word(2)? as u16);
    if sign == 0xC000 {
        return Ok(Value::Real(f64::NAN));
    }
    let mut whole: i128 = 0;
    let mut fraction = 0f64;
    for d in 0..ndigits as usize {
        let digit = i128::from(word(4 + d)?);
        let power = i32::from(weight) - d as i32;
        if power >= 0 {
            whole = whole.checked_mul(10_000).and_then(|w| w.checked_add(digit)).ok_or("a NUMERIC too large")?;
        } else {
            fraction += digit as f64 * 10_000f64.powi(power);
        }
    }
    // Digits beyond the last stored one are zeros.
    let trailing = i32::from(weight) + 1 - i32::from(ndigits.max(0));
    for _ in 0..trailing.max(0) {
        whole = whole.checked_mul(10_000).ok_or("a NUMERIC too large")?;
    }
    let negative = sign == 0x4000;
    if fraction == 0.0
        && let Ok(v) = i64::try_from(whole)
    {
        return Ok(Value::Integer(if negative { -v } else { v }));
    }
    let v = whole as f64 + fraction;
    Ok(Value::Real(if negative { -v } else { v }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only savepoint statements are kept for the next round trip; `ROLLBACK` and `COMMIT` go
    /// at once.
    #[test]
    fn savepoint_statements_are_told_from_the_others() {
        for sql in ["SAVEPOINT job", "release job", "  ROLLBACK TO job", "Rollback To item"] {
            assert!(is_savepoint_statement(sql), "{sql}");
        }
        for sql in ["ROLLBACK", "COMMIT", "RELEASE", "SELECT 1", "SAVEPOINTS", ""] {
            assert!(!is_savepoint_statement(sql), "{sql}");
        }
    }

    /// NUL and the escape character survive the way through PostgreSQL's text, and every other
    /// text is stored as it is.
    #[test]
    fn texts_are_escaped_for_postgres_and_back() {
        let e = PG_TEXT_ESCAPE;
        for (text, stored) in [
            ("plain é😀".to_string(), "plain é😀".to_string()),
            ("a\0b".into(), format!("a{e}0b")),
            (format!("{e}"), format!("{e}{e}")),
            (format!("{e}0\0"), format!("{e}{e}0{e}0")),
            (String::new(), String::new()),
        ] {
            assert_eq!(pg_text_escaped(&text), stored);
            assert!(!stored.contains('\0'));
            assert_eq!(pg_text_unescaped(stored), text);
        }
        assert!(matches!(pg_text_escaped("no escape"), std::borrow::Cow::Borrowed(_)));
        // What an earlier hub stored with a lone U+FFFF reads as it was.
        assert_eq!(pg_text_unescaped(format!("a{e}b{e}")), format!("a{e}b{e}"));
    }

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

    /// SQLite's failures are told apart by their code: damage, a value too big, a constraint,
    /// a lock; everything else is `Other`.
    #[test]
    fn sqlite_failures_are_classified_by_their_code() {
        let failure = |code| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        for (code, kind) in [
            (rusqlite::ffi::SQLITE_CORRUPT, DbErrorKind::Damaged),
            (rusqlite::ffi::SQLITE_NOTADB, DbErrorKind::Damaged),
            (rusqlite::ffi::SQLITE_TOOBIG, DbErrorKind::BadValue),
            (rusqlite::ffi::SQLITE_CONSTRAINT, DbErrorKind::Constraint),
            (rusqlite::ffi::SQLITE_BUSY, DbErrorKind::Busy),
            (rusqlite::ffi::SQLITE_IOERR, DbErrorKind::Other),
            (rusqlite::ffi::SQLITE_FULL, DbErrorKind::Other),
        ] {
            let e = sqlite_error(failure(code));
            assert_eq!(e.kind(), kind, "{code}: {e}");
            assert_eq!(e.to_string(), failure(code).to_string(), "SQLite's own text");
        }
        assert_eq!(sqlite_error(rusqlite::Error::QueryReturnedNoRows).kind(), DbErrorKind::NoRows);
    }

    /// PostgreSQL's failures are told apart by their SQLSTATE, and a lost connection by itself.
    #[test]
    fn postgres_failures_are_classified_by_their_sqlstate() {
        for (code, kind) in [
            ("40001", DbErrorKind::Conflict),
            ("40P01", DbErrorKind::Conflict),
            ("22021", DbErrorKind::BadValue),
            ("54000", DbErrorKind::BadValue),
            ("23505", DbErrorKind::Constraint),
            ("55P03", DbErrorKind::Busy),
            ("40002", DbErrorKind::Other),
            ("XX001", DbErrorKind::Other),
        ] {
            assert_eq!(pg_error_kind(Some(code), false), kind, "{code}");
        }
        assert_eq!(pg_error_kind(None, true), DbErrorKind::Lost);
        assert_eq!(pg_error_kind(None, false), DbErrorKind::Other);
    }

    #[test]
    fn numerics_read_as_integers_when_whole() {
        // 12345678 = [1234, 5678], weight 1.
        let enc = |ndigits: i16, weight: i16, sign: u16, scale: u16, digits: &[i16]| {
            let mut v = Vec::new();
            for w in [ndigits, weight, sign as i16, scale as i16].iter().chain(digits) {
                v.extend_from_slice(&w.to_be_bytes());
            }
            v
        };
        assert_eq!(numeric(&enc(2, 1, 0, 0, &[1234, 5678])).unwrap(), Value::Integer(12_345_678));
        assert_eq!(numeric(&enc(1, 1, 0x4000, 0, &[7])).unwrap(), Value::Integer(-70_000));
        assert_eq!(numeric(&enc(0, 0, 0, 0, &[])).unwrap(), Value::Integer(0));
        assert_eq!(numeric(&enc(2, 0, 0, 1, &[3, 5000])).unwrap(), Value::Real(3.5));
    }
}
