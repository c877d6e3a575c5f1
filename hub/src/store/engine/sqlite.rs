//! SQLite's side of the engine. An SQLite `Connection` is a `Db` as it is: statements are
//! prepared through its own cache, each `$N` parameter bound by its name (`bind`), and its
//! failures classified into the store's kinds (`sqlite_error`). Besides: the strict open of the
//! record with its statement cache (`open_sqlite`), a file opened as it is (`open_as_is`), and
//! the operations only a file has (`SqliteFile`).

use super::{Arg, Db, DbError, DbErrorKind, DbResult, Dialect, Inner, Params, Stmt};

/// An SQLite connection: a `Db` as it is (and what the writer, a one-shot process and the
/// reader pool hold on an SQLite record).
pub use rusqlite::Connection as SqliteConnection;

use rusqlite::Connection;

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

/// Binds `params` to SQLite's statement `s` by name: `$N` takes the Nth parameter. Never by
/// position: SQLite numbers named parameters by their first appearance, so in `... $2 ... $1`
/// its first slot is `$2`. Every parameter given must be named by the statement.
pub(super) fn bind<P: Params + ?Sized>(s: &mut rusqlite::Statement<'_>, params: &P) -> DbResult<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
