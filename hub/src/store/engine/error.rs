//! `DbError`: how a statement failed, in the words the store needs, whichever backend ran it.
//!
//! Each backend classifies its own failures once, here in the engine (`sqlite::classified`,
//! `postgres::conn`), into a `DbErrorKind`; the store maps the kind to its own error
//! (`StoreError::from`) without knowing which backend spoke. The backend's own text travels
//! with it, for logs; what a caller may be shown of it is `said` (never the statement).

/// What kind of failure a `DbError` is: the distinctions the store acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbErrorKind {
    /// A query that must return a row returned none (`OptionalExtension::optional` makes that
    /// `None`).
    NoRows,
    /// A constraint refused the statement (unique, check, foreign key, not null).
    Constraint,
    /// The database was locked by another connection past the wait allowed for it.
    Busy,
    /// The database itself is damaged (SQLite's `SQLITE_CORRUPT`, `SQLITE_NOTADB`).
    Damaged,
    /// A stored value that does not parse into its type, named down to its table, row and
    /// column (`store::CorruptValue`): the record is damaged at that row.
    Unreadable,
    /// A value the record cannot hold: too long for SQLite, or refused by PostgreSQL as data
    /// (SQLSTATE class 22: a character it cannot store, a number out of range) or as past a
    /// limit (class 54: a key too long for its index). The value is at fault, not the storage.
    BadValue,
    /// PostgreSQL ended the transaction to resolve a conflict with another (a serialization
    /// failure, 40001, or a deadlock, 40P01): running it again may succeed.
    Conflict,
    /// The connection is gone (closed, or no answer within its wait): nothing more runs on it.
    Lost,
    /// Anything else (an I/O error, a full disk, a statement the server refused).
    Other,
}

/// A failed statement, transaction or conversion (see the module documentation).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{text}")]
pub struct DbError {
    kind: DbErrorKind,
    /// What the backend said, as logged: SQLite's message; PostgreSQL's `database: MESSAGE
    /// (SQLSTATE) in: STATEMENT`.
    text: String,
    /// What the backend said about the failure itself, without the statement: what a caller
    /// may be shown (a refused value's reason).
    said: String,
    /// PostgreSQL's SQLSTATE, when the server answered with one.
    code: Option<String>,
}

/// Shorthand for engine results.
pub type DbResult<T> = Result<T, DbError>;

impl DbError {
    /// A failure of `kind` whose text is `text` (shown as it is).
    pub fn new(kind: DbErrorKind, text: impl Into<String>) -> DbError {
        let text = text.into();
        DbError { kind, said: text.clone(), text, code: None }
    }

    /// A failure the server reported: `said` about the statement `statement`, with SQLSTATE
    /// `code` (PostgreSQL; the text reads `database: SAID in: STATEMENT`).
    pub fn from_server(kind: DbErrorKind, said: String, statement: Option<&str>, code: Option<String>) -> DbError {
        let text = match statement {
            Some(sql) => format!("database: {said} in: {sql}"),
            None => format!("database: {said}"),
        };
        DbError { kind, text, said, code }
    }

    /// A stored value that does not parse (`DbErrorKind::Unreadable`), `text` naming it.
    pub fn unreadable(text: impl Into<String>) -> DbError {
        DbError::new(DbErrorKind::Unreadable, text)
    }

    /// The kind.
    pub fn kind(&self) -> DbErrorKind {
        self.kind
    }

    /// What the backend said, without the statement.
    pub fn said(&self) -> &str {
        &self.said
    }

    /// PostgreSQL's SQLSTATE, when the server answered with one.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }
}

/// `.optional()` on a one-row result: no row is `None` rather than an error (as rusqlite's
/// `OptionalExtension`, over `DbError`).
pub trait OptionalExtension<T> {
    /// `Ok(None)` for `DbErrorKind::NoRows`, the row or the other error as it is.
    fn optional(self) -> DbResult<Option<T>>;
}

impl<T> OptionalExtension<T> for DbResult<T> {
    fn optional(self) -> DbResult<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind == DbErrorKind::NoRows => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server's text reaches logs whole; a caller is shown what it said, never the
    /// statement.
    #[test]
    fn the_statement_is_logged_and_never_said() {
        let e = DbError::from_server(
            DbErrorKind::BadValue,
            "invalid byte sequence (22021)".into(),
            Some("INSERT INTO attempts (result) VALUES ($1)"),
            Some("22021".into()),
        );
        assert_eq!(
            e.to_string(),
            "database: invalid byte sequence (22021) in: INSERT INTO attempts (result) VALUES ($1)"
        );
        assert_eq!(e.said(), "invalid byte sequence (22021)");
        assert_eq!(e.code(), Some("22021"));
        let plain = DbError::new(DbErrorKind::Busy, "database is locked");
        assert_eq!((plain.to_string().as_str(), plain.said()), ("database is locked", "database is locked"));
    }

    #[test]
    fn no_rows_is_none_and_every_other_failure_stays() {
        let none: DbResult<i64> = Err(DbError::new(DbErrorKind::NoRows, "Query returned no rows"));
        assert!(none.optional().unwrap().is_none());
        assert_eq!(Ok::<i64, DbError>(3).optional().unwrap(), Some(3));
        let busy: DbResult<i64> = Err(DbError::new(DbErrorKind::Busy, "database is locked"));
        assert_eq!(busy.optional().unwrap_err().kind(), DbErrorKind::Busy);
    }
}
