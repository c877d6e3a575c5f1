//! The hub's record, behind one narrow interface: `Store` (in `handle`).
//!
//! Everything the HTTP layer, the background tasks, the status page, the metrics and the CLI
//! may do to the record is an async method of `Store`, named for the operation (`submit`,
//! `claim`, `ack`, `report`, `fence_set`, `repair`, `verify`, ...), taking and returning plain
//! Rust and wire types and failing with `StoreError`; nothing outside this module tree writes
//! SQL or holds a connection. Each method stands at the top of the module that does the
//! operation, above its synchronous body; no method names a backend (SPEC §11): the bodies run
//! over `engine::Db`, which SQLite's connection and PostgreSQL's `PgConn` both are.
//!
//! For SQLite, the operations' bodies are the plain synchronous functions of the modules below,
//! over an SQLite connection (inside a write transaction when they change anything), run by
//! `Store` through `Writer` (the hub's single writer thread with group commit) and `Readers`,
//! or in place with `in_write_txn` (the CLI); the unit tests call them directly.
//!
//! Layout:
//! - `handle`: `Store`, the one door to the record, its constructors, and how its methods
//!   reach the record (`Conns`: the writer and readers, or one connection in place).
//! - `writer`: the writer thread (one owner of the write connection, group commit).
//! - `readers`: the pool of read connections.
//! - `engine`: every difference between SQLite and PostgreSQL (`Db`, PostgreSQL's connection,
//!   migrations and statistics).
//! - `lifecycle`: a delivery's life, every SPEC §2 transition: acceptance and fan-out, approval,
//!   claims and the handoff, starts, reports, the operator's transitions, silence.
//! - `registry`: who may do what: hosts and certificates, node sessions, members, producers,
//!   fences, the audit log.
//! - `views`: read-only views for producers, operators, the status page and the metrics.
//! - `upkeep`: retention, purge, backup, the offline check, and transfer between backends.
//!
//! Invariant: a stored value that does not parse into its type (a state, kind, scope, outcome
//! or payload) is a `StoreError::Corrupt` naming its table, row and column; it never becomes a
//! default.

/// The operator's attribution of a change: who, and why.
#[derive(Debug, Clone)]
pub struct By {
    /// The operator.
    pub operator: String,
    /// The reason recorded.
    pub reason: String,
}

pub mod engine;
pub mod handle;
pub mod lifecycle;
pub mod readers;
pub mod registry;
pub mod upkeep;
pub mod views;
pub mod writer;

#[cfg(test)]
#[path = "tests/text_values.rs"]
mod text_values;

pub use handle::Store;
pub use readers::Readers;
pub use writer::Writer;

use baton_shared::error::ErrorCode;
use baton_shared::sqlite::{self, OpenError, OpenOptions, Synchronous};
use baton_shared::states::DeliveryState;
use engine::SqliteConnection as Connection;
use engine::{Db, DbError, DbErrorKind, DbResult, Row};
use std::path::Path;

/// The hub schema's migrations, in order. Append-only.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../../../schema/hub/0001-create-hub-store.sql"),
    include_str!("../../../schema/hub/0002-conversations.sql"),
    include_str!("../../../schema/hub/0003-turn-control.sql"),
    include_str!("../../../schema/hub/0004-turn-control-indexes.sql"),
    include_str!("../../../schema/hub/0005-fence-expiry.sql"),
    include_str!("../../../schema/hub/0006-settled-at.sql"),
    include_str!("../../../schema/hub/0007-start-lease.sql"),
    include_str!("../../../schema/hub/0008-producer-quotas.sql"),
    include_str!("../../../schema/hub/0009-mention-grants.sql"),
    include_str!("../../../schema/hub/0010-member-families.sql"),
    include_str!("../../../schema/hub/0011-stderr-tail.sql"),
    include_str!("../../../schema/hub/0012-approval-and-breaker.sql"),
    include_str!("../../../schema/hub/0013-progress-and-feeds.sql"),
    include_str!("../../../schema/hub/0014-deadlines-and-stalls.sql"),
    include_str!("../../../schema/hub/0015-breaker-period.sql"),
    include_str!("../../../schema/hub/0016-traceparent.sql"),
    include_str!("../../../schema/hub/0017-pools.sql"),
    include_str!("../../../schema/hub/0018-settlement.sql"),
];

/// The newest schema version this binary knows, on each backend: how many migrations each
/// runner has (`MIGRATIONS` here; PostgreSQL's history is numbered apart,
/// `engine::postgres::MIGRATIONS`).
pub const KNOWN_SCHEMA_VERSIONS: engine::dialect::Both<i64> =
    engine::dialect::Both { sqlite: MIGRATIONS.len() as i64, postgres: engine::postgres::MIGRATIONS.len() as i64 };

/// Who made a change, as recorded in the event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// Hub, node or operator.
    pub kind: ActorKind,
    /// The host, operator or `hub`.
    pub name: String,
}

impl Actor {
    /// The hub itself (fences applied at claim, fan-out, repair).
    pub fn hub() -> Actor {
        Actor { kind: ActorKind::Hub, name: "hub".into() }
    }
    /// A node acting for its host.
    pub fn node(host: &str) -> Actor {
        Actor { kind: ActorKind::Node, name: host.into() }
    }
    /// An operator, by name.
    pub fn operator(name: &str) -> Actor {
        Actor { kind: ActorKind::Operator, name: name.into() }
    }
}

/// The three kinds of actor in the event log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActorKind {
    /// The hub, on its own account.
    Hub,
    /// A node instance.
    Node,
    /// An operator through the CLI.
    Operator,
}

impl ActorKind {
    /// Every kind.
    pub const ALL: [ActorKind; 3] = [ActorKind::Hub, ActorKind::Node, ActorKind::Operator];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ActorKind::Hub => "hub",
            ActorKind::Node => "node",
            ActorKind::Operator => "operator",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<ActorKind> {
        ActorKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// Why a store operation did not happen. Each maps to one stable API error code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// A field has a bad value; the text names the field.
    #[error("{0}")]
    Invalid(String),
    /// A message has no recipients: no `to`, and its conversation has no members.
    #[error("{0}")]
    NoRecipients(String),
    /// No such thing.
    #[error("{0}")]
    NotFound(String),
    /// The thing belongs to another host or producer.
    #[error("{0}")]
    NotYours(String),
    /// The claim is not held by this instance and token.
    #[error("{0}")]
    StaleClaim(String),
    /// The delivery is not in a state that allows this.
    #[error("{0}")]
    InvalidTransition(String),
    /// The idempotency key was used with different content.
    #[error("{0}")]
    IdempotencyConflict(String),
    /// The report id was used with different content.
    #[error("{0}")]
    ReportConflict(String),
    /// Another instance of this host holds work.
    #[error("{0}")]
    InstanceConflict(String),
    /// The caller's node session is older than its host's newest (another process took over).
    #[error("{0}")]
    SessionSuperseded(String),
    /// A capacity bound is reached.
    #[error("{0}")]
    OverCapacity(String),
    /// A producer's quota (`registry::producers::Quota`) leaves no room for its post.
    #[error("{1}")]
    OverQuota(registry::producers::QuotaKind, String),
    /// The caller's certificate was revoked (found when re-checked inside a transaction).
    #[error("{0}")]
    CertificateRevoked(String),
    /// The caller may not do this here (a producer posting outside its publish scope).
    #[error("{0}")]
    Forbidden(String),
    /// A producer without the approval right in the conversation approved or rejected a message.
    #[error("{0}")]
    ApprovalForbidden(String),
    /// An events feed's cursor is not one this record gave out.
    #[error("{0}")]
    BadCursor(String),
    /// An events feed's cursor lies before events removed since (retention, purge).
    #[error("{0}")]
    CursorExpired(String),
    /// SQLite failed (disk full, I/O error, busy past the timeout). Details are logged.
    #[error("storage error: {0}")]
    Storage(String),
    /// PostgreSQL ended the transaction to resolve a conflict with another one (a deadlock,
    /// 40P01, or a serialization failure, 40001): running it again may succeed. The store runs
    /// such an operation again (`handle`, `conflict_retries`); past that it is answered as
    /// storage unavailable. Details are logged.
    #[error("storage conflict: {0}")]
    Conflict(String),
    /// A stored value does not parse into its type; the text names the table, row and column.
    /// Retrying cannot help: the record needs an operator.
    #[error("{0}")]
    Corrupt(String),
    /// A bug in the hub (a write job panicked); the text is the panic message, which is logged.
    #[error("internal error: {0}")]
    Internal(String),
}

impl StoreError {
    /// The API error code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::Invalid(_) => ErrorCode::InvalidField,
            StoreError::NoRecipients(_) => ErrorCode::NoRecipients,
            StoreError::NotFound(_) => ErrorCode::NotFound,
            StoreError::NotYours(_) => ErrorCode::NotYours,
            StoreError::StaleClaim(_) => ErrorCode::StaleClaim,
            StoreError::InvalidTransition(_) => ErrorCode::InvalidTransition,
            StoreError::IdempotencyConflict(_) => ErrorCode::IdempotencyConflict,
            StoreError::ReportConflict(_) => ErrorCode::ReportConflict,
            StoreError::InstanceConflict(_) => ErrorCode::InstanceConflict,
            StoreError::SessionSuperseded(_) => ErrorCode::SessionSuperseded,
            StoreError::OverCapacity(_) => ErrorCode::OverCapacity,
            StoreError::OverQuota(registry::producers::QuotaKind::UnsettledMessages, _) => {
                ErrorCode::QuotaUnsettledMessages
            }
            StoreError::OverQuota(registry::producers::QuotaKind::UnsettledBytes, _) => ErrorCode::QuotaUnsettledBytes,
            StoreError::CertificateRevoked(_) => ErrorCode::CertificateRevoked,
            StoreError::Forbidden(_) => ErrorCode::Forbidden,
            StoreError::ApprovalForbidden(_) => ErrorCode::ApprovalForbidden,
            StoreError::BadCursor(_) => ErrorCode::BadCursor,
            StoreError::CursorExpired(_) => ErrorCode::CursorExpired,
            StoreError::Storage(_) | StoreError::Conflict(_) => ErrorCode::StorageUnavailable,
            StoreError::Corrupt(_) | StoreError::Internal(_) => ErrorCode::Internal,
        }
    }
}

impl From<DbError> for StoreError {
    fn from(e: DbError) -> Self {
        match e.kind() {
            DbErrorKind::Unreadable => StoreError::Corrupt(e.to_string()),
            // Damage the engine meets while reading is a damaged record, not a passing fault.
            DbErrorKind::Damaged => StoreError::Corrupt(format!("the database is damaged: {e}")),
            // A value is never a storage error: what the record refuses for a value is the
            // value's refusal (400), which a batch fails one item for and nobody retries.
            DbErrorKind::BadValue => StoreError::Invalid(format!("a value the record cannot hold: {}", e.said())),
            DbErrorKind::Conflict => StoreError::Conflict(e.to_string()),
            DbErrorKind::NoRows
            | DbErrorKind::Constraint
            | DbErrorKind::Busy
            | DbErrorKind::Lost
            | DbErrorKind::Other => StoreError::Storage(e.to_string()),
        }
    }
}

/// A stored value that does not parse into its type, named down to the row and column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupt record: {table} {row}: {column} holds {value:?}, which is not a valid {what}")]
pub struct CorruptValue {
    /// The table.
    pub table: &'static str,
    /// The row's identifier (its id, or its key columns).
    pub row: String,
    /// The column.
    pub column: String,
    /// The stored text, cut to a readable length.
    pub value: String,
    /// What the column should hold ("delivery state", "JSON payload", …).
    pub what: &'static str,
}

/// Stored text shown in a `CorruptValue`, at most this many characters.
const CORRUPT_VALUE_SHOWN_CHARS_MAX: usize = 80;

/// Reads column `idx` of `row` as text and parses it with `parse`. A value that does not parse is
/// an error naming `table`, the row (`row_id`) and the column, which `StoreError::from` turns into
/// `StoreError::Corrupt`; it never becomes a default. For use inside row closures.
pub(crate) fn parse_column<T>(
    row: &Row<'_>,
    idx: usize,
    table: &'static str,
    row_id: &str,
    what: &'static str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> DbResult<T> {
    let text: String = row.get(idx)?;
    parse(&text).ok_or_else(|| corrupt(row, idx, table, row_id, what, &text))
}

/// The error `parse_column` returns for a value that does not parse.
pub(crate) fn corrupt(
    row: &Row<'_>,
    idx: usize,
    table: &'static str,
    row_id: &str,
    what: &'static str,
    value: &str,
) -> DbError {
    let column = row.column_name(idx);
    let value = value.chars().take(CORRUPT_VALUE_SHOWN_CHARS_MAX).collect();
    DbError::unreadable(CorruptValue { table, row: row_id.to_string(), column, value, what }.to_string())
}

/// `parse_column` for a column that may be NULL.
pub(crate) fn parse_column_opt<T>(
    row: &Row<'_>,
    idx: usize,
    table: &'static str,
    row_id: &str,
    what: &'static str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> DbResult<Option<T>> {
    match row.get_ref(idx)? {
        engine::ValueRef::Null => Ok(None),
        _ => parse_column(row, idx, table, row_id, what, parse).map(Some),
    }
}

/// A delivery state column (`deliveries.state`, `delivery_events.to_state`, …).
pub(crate) fn state_column(row: &Row<'_>, idx: usize, table: &'static str, row_id: &str) -> DbResult<DeliveryState> {
    parse_column(row, idx, table, row_id, "delivery state", DeliveryState::parse)
}

/// A JSON payload column (`messages.payload`), kept as its exact text.
pub(crate) fn json_column(
    row: &Row<'_>,
    idx: usize,
    table: &'static str,
    row_id: &str,
) -> DbResult<baton_shared::wire::Payload> {
    parse_column(row, idx, table, row_id, "JSON payload", |s| {
        baton_shared::wire::Payload::from_text(s.to_string()).ok()
    })
}

/// A bound in milliseconds (`messages.deadline_ms`, `stall_ms`): positive when set (the
/// schema's CHECK), else the row is corrupt.
pub(crate) fn bound_ms_column(row: &Row<'_>, idx: usize, table: &'static str, row_id: &str) -> DbResult<Option<u64>> {
    match row.get::<_, Option<i64>>(idx)? {
        None => Ok(None),
        Some(ms) => u64::try_from(ms)
            .map(Some)
            .map_err(|_| corrupt(row, idx, table, row_id, "bound in milliseconds", &ms.to_string())),
    }
}

/// Shorthand for store results.
pub type StoreResult<T> = Result<T, StoreError>;

/// Opens the hub database for writing, applying migrations, with pragmas asserted and the
/// file's structure checked (`quick_check`): what a changing CLI command needs.
pub fn open_write(path: &Path, synchronous: Synchronous) -> Result<Connection, OpenError> {
    open_write_checked(path, synchronous, sqlite::Check::Quick)
}

/// Opens the hub database for serving: as `open_write`, but with the check the operator chose
/// (`startup_check`): by default the whole-file `integrity_check`, so a damaged index (which
/// `quick_check` does not compare with its table) cannot hide queued work from the claims of a
/// hub that serves from it for days.
pub fn open_serve(path: &Path, synchronous: Synchronous, check: sqlite::Check) -> Result<Connection, OpenError> {
    open_write_checked(path, synchronous, check)
}

fn open_write_checked(path: &Path, synchronous: Synchronous, check: sqlite::Check) -> Result<Connection, OpenError> {
    let opts = OpenOptions { synchronous, create: true, read_only: false, check, page_size: Some(RECORD_PAGE_BYTES) };
    engine::open_sqlite(path, MIGRATIONS, opts)
}

/// The page size of a hub record this binary creates (an existing record keeps its own). Each
/// commit writes every page it changed whole to the WAL, and a lone delivery's commits change a
/// few rows on many pages: with 2 KiB pages they write half the bytes of SQLite's default 4 KiB,
/// while batches (many rows per page) cost the same. Measured in `docs/performance.md`.
pub const RECORD_PAGE_BYTES: u32 = 2048;

/// Opens an existing hub database for reading only (no migrations; the schema must be current).
pub fn open_read(path: &Path) -> Result<Connection, OpenError> {
    engine::open_sqlite(
        path,
        MIGRATIONS,
        OpenOptions { create: false, read_only: true, check: sqlite::Check::None, ..Default::default() },
    )
}

/// The schema version of the database: how many migrations it has (SQLite's `user_version`,
/// PostgreSQL's `baton_schema` row).
pub fn schema_version(conn: &dyn Db) -> StoreResult<i64> {
    Ok(conn.query_row(engine::dialect::SCHEMA_VERSION.of(conn), [], |r| r.get(0))?)
}

/// Runs `f` inside one `BEGIN IMMEDIATE` transaction on `conn`, committing only if it succeeds.
/// This is how the CLI (a separate process) writes; the hub's own writes go through `Writer`.
pub fn in_write_txn<R>(conn: &dyn Db, f: impl FnOnce(&dyn Db) -> StoreResult<R>) -> StoreResult<R> {
    conn.begin_write()?;
    match f(conn) {
        Ok(r) => match conn.execute_batch("COMMIT") {
            Ok(()) => Ok(r),
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(e.into())
            }
        },
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Runs one transaction-control statement (`BEGIN IMMEDIATE`, `SAVEPOINT x`, `RELEASE x`,
/// `ROLLBACK TO x`, `COMMIT`) through the connection's statement cache: the writer and every
/// batch item run these, and `execute_batch` would parse them on every use.
pub(crate) fn control(conn: &dyn Db, sql: &str) -> DbResult<()> {
    conn.control(sql)
}

/// A random, unguessable token (122 bits), as 32 hex characters.
pub fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A new time-ordered id.
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unit tests that are about SQLite itself (its file, its pragmas, its damage), which
    /// the PostgreSQL run leaves out, each with why.
    const SQLITE_ONLY: &[(&str, &str)] = &[
        ("store::tests::a_new_record", "the SQLite file's page size"),
        ("store::upkeep::backup::", "a copy of the SQLite file"),
        ("store::writer::", "the SQLite writer on a file path"),
        ("store::readers::", "the SQLite reader pool on a file path"),
        ("store::handle::", "served and direct stores over one SQLite file"),
        ("store::upkeep::transfer::", "copies between an SQLite file and a cluster of its own"),
        ("store::registry::fences::tests::a_corrupt_fence", "damage written past SQLite's CHECK constraints"),
        ("store::registry::hosts::tests::a_corrupt_role", "damage written past SQLite's CHECK constraints"),
        ("store::views::read::tests::corrupt_values", "damage written past SQLite's CHECK constraints"),
        ("store::views::listing::tests::a_prefix_names_one_delivery", "rows written with SQLite's foreign keys off"),
    ];

    /// Every store unit test again, on PostgreSQL: this test binary runs itself with
    /// `testing::PG_TEMPLATE_ENV` naming a migrated database of a throwaway cluster, so each
    /// test's `testing::db()` is a fresh PostgreSQL database and the same bodies run on the
    /// second backend. Skipped without PostgreSQL unless `BATON_REQUIRE_POSTGRES=1`.
    #[test]
    fn store_unit_tests_pass_on_postgres() {
        if std::env::var(testing::PG_TEMPLATE_ENV).is_ok() {
            return;
        }
        let Some(cluster) = baton_testkit::pg::cluster_or_skip("store_unit_tests_pass_on_postgres", false) else {
            return;
        };
        let url = cluster.url();
        crate::store::engine::postgres::connect_and_migrate_blocking(
            &crate::store::engine::postgres::PgUrl::parse(&url).unwrap(),
        )
        .unwrap();
        let mut args = vec!["store::".to_string(), "--skip".into(), "store_unit_tests_pass_on_postgres".into()];
        for (test, _why) in SQLITE_ONLY {
            args.extend(["--skip".to_string(), test.to_string()]);
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(&args)
            .env(testing::PG_TEMPLATE_ENV, &url)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let failed: Vec<&str> = stdout.lines().filter(|l| l.ends_with("FAILED")).collect();
        assert!(
            out.status.success(),
            "store unit tests failed on PostgreSQL: {failed:#?}\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ran = stdout.lines().filter(|l| l.ends_with("... ok")).count();
        assert!(ran > 50, "only {ran} store tests ran on PostgreSQL:\n{stdout}");
    }

    fn pg_failure(code: &str) -> DbError {
        DbError::from_server(
            engine::pg_error_kind(Some(code), false),
            format!("the server said no ({code})"),
            Some("INSERT INTO attempts (result) VALUES ($1)"),
            Some(code.into()),
        )
    }

    /// Damage the engine meets is a damaged record, and a stored value that does not parse is
    /// one named down to its row; every failure that is neither a value's nor a conflict is a
    /// storage failure (which callers retry).
    #[test]
    fn damage_is_corrupt_and_other_failures_are_storage() {
        let e = StoreError::from(DbError::new(DbErrorKind::Damaged, "database disk image is malformed"));
        assert!(
            matches!(&e, StoreError::Corrupt(m) if m == "the database is damaged: database disk image is malformed")
        );
        let e = StoreError::from(DbError::unreadable("corrupt record: fences 1: kind holds \"x\""));
        assert!(matches!(&e, StoreError::Corrupt(m) if m.starts_with("corrupt record: fences 1")));
        for kind in
            [DbErrorKind::NoRows, DbErrorKind::Constraint, DbErrorKind::Busy, DbErrorKind::Lost, DbErrorKind::Other]
        {
            let e = StoreError::from(DbError::new(kind, "disk I/O error"));
            assert!(matches!(&e, StoreError::Storage(m) if m == "disk I/O error"), "{kind:?}: {e:?}");
        }
    }

    /// A value PostgreSQL cannot take (its data exceptions, class 22, and program limits, class
    /// 54: a text too long for its column, a key too long for its index, a number out of range)
    /// is refused as the value's: never `storage_unavailable`, which callers retry for ever and
    /// a batch fails whole for. The server's own failures stay storage failures.
    #[test]
    fn a_value_the_server_refuses_is_never_a_storage_failure() {
        for code in ["22021", "22001", "22003", "22P02", "22P05", "22000", "54000", "54001", "54011"] {
            let e = StoreError::from(pg_failure(code));
            assert_ne!(e.code(), ErrorCode::StorageUnavailable, "{code}: {e:?}");
            assert_eq!(e.code(), ErrorCode::InvalidField, "{code}: {e:?}");
            assert!(!e.to_string().contains("INSERT"), "no statement is sent to the caller: {e}");
        }
        for code in ["08006", "53100", "53200", "57P01", "58030", "XX000", "25P02"] {
            assert!(matches!(StoreError::from(pg_failure(code)), StoreError::Storage(_)), "{code}");
        }
        let too_big = DbError::new(DbErrorKind::BadValue, "string or blob too big");
        assert_eq!(StoreError::from(too_big).code(), ErrorCode::InvalidField, "SQLite's own length bound");
    }

    /// A deadlock or a serialization failure is a conflict the store runs the operation again
    /// for; answered (once the retries are spent) as storage unavailable, never as the value's.
    #[test]
    fn deadlocks_and_serialization_failures_are_conflicts() {
        for code in ["40P01", "40001"] {
            let e = StoreError::from(pg_failure(code));
            assert!(matches!(e, StoreError::Conflict(_)), "{code}: {e:?}");
            assert_eq!(e.code(), ErrorCode::StorageUnavailable);
        }
        for code in ["40002", "40003", "23505"] {
            assert!(!matches!(StoreError::from(pg_failure(code)), StoreError::Conflict(_)), "{code}");
        }
    }

    #[test]
    fn a_new_record_has_small_pages_and_one_made_before_serves_with_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let page = |c: &Connection| c.query_row("PRAGMA page_size", [], |r| r.get::<_, u32>(0)).unwrap();
        let new = dir.path().join("new.db");
        let conn = open_serve(&new, Synchronous::Full, sqlite::Check::Full).unwrap();
        assert_eq!(page(&conn), RECORD_PAGE_BYTES);
        drop(conn);
        // A record an earlier hub made with SQLite's default pages opens and serves as it is.
        let old = dir.path().join("old.db");
        drop(sqlite::open(&old, MIGRATIONS, OpenOptions::default()).unwrap());
        let conn = open_serve(&old, Synchronous::Full, sqlite::Check::Full).unwrap();
        assert_eq!(page(&conn), 4096);
    }
}

#[cfg(test)]
pub mod testing {
    //! A fresh store with a few enrolled hosts, for unit tests: a temp SQLite file, or, when
    //! `PG_TEMPLATE_ENV` names a migrated template database, a new PostgreSQL database copied
    //! from it (see `tests::store_unit_tests_pass_on_postgres`).
    use super::*;

    /// The URL of a migrated PostgreSQL database the unit tests copy, one new database each.
    pub(crate) const PG_TEMPLATE_ENV: &str = "BATON_STORE_TEST_PG_TEMPLATE";

    pub(crate) struct TestDb {
        pub(crate) conn: Box<dyn Db>,
        pub(crate) path: std::path::PathBuf,
        _dir: tempfile::TempDir,
    }

    pub(crate) fn db() -> TestDb {
        let (conn, path, dir) = owned_db();
        TestDb { conn, path, _dir: dir }
    }

    /// How many rows of `table` `f` inserts or updates (an upsert that updates counts once), in
    /// one write transaction of its own: on SQLite by triggers of the connection's own, on
    /// PostgreSQL by the transaction's table statistics.
    pub(crate) fn row_writes(c: &dyn Db, table: &str, f: impl FnOnce()) -> i64 {
        // What earlier steps left unsent goes first: a new transaction drops it.
        c.flush().unwrap();
        c.begin_write().unwrap();
        let n = if c.sqlite_file().is_some() {
            c.execute_batch(&format!(
                "CREATE TEMP TABLE row_writes (n INTEGER);
                 CREATE TEMP TRIGGER row_writes_ins AFTER INSERT ON {table} BEGIN INSERT INTO row_writes VALUES (1); END;
                 CREATE TEMP TRIGGER row_writes_upd AFTER UPDATE ON {table} BEGIN INSERT INTO row_writes VALUES (1); END;"
            ))
            .unwrap();
            f();
            let n = c.query_row("SELECT count(*) FROM row_writes", [], |r| r.get(0)).unwrap();
            c.execute_batch("DROP TRIGGER row_writes_ins; DROP TRIGGER row_writes_upd; DROP TABLE row_writes;")
                .unwrap();
            n
        } else {
            // The transaction's own counts so far (a test connection may be in one already).
            let count = || -> i64 {
                c.flush().unwrap();
                let sql = "SELECT coalesce(sum(n_tup_ins + n_tup_upd), 0)::int8 FROM pg_stat_xact_user_tables
                           WHERE relname = $1";
                c.query_row(sql, [table], |r| r.get(0)).unwrap()
            };
            let before = count();
            f();
            count() - before
        };
        control(c, "COMMIT").unwrap();
        n
    }

    /// As `db`, as a connection a writer thread can own, its path, and the directory it must
    /// not outlive.
    pub(crate) fn owned_db() -> (Box<dyn Db + Send>, std::path::PathBuf, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.db");
        let conn: Box<dyn Db + Send> = match std::env::var(PG_TEMPLATE_ENV) {
            Ok(template) => Box::new(pg_copy(&template)),
            Err(_) => Box::new(open_write(&path, Synchronous::Normal).unwrap()),
        };
        for h in ["host-a", "host-b", "host-c"] {
            registry::hosts::add_host(&*conn, h, 0).unwrap();
        }
        (conn, path, dir)
    }

    /// A new database copied from the template at `template_url`, connected (on a thread of
    /// its own: `PgConn` must not be made on an async worker).
    fn pg_copy(template_url: &str) -> engine::PgConn {
        let template_url = template_url.to_string();
        std::thread::spawn(move || {
            let (base, query) = template_url.split_once('?').unwrap_or((&template_url, ""));
            let (server, template_name) = base.rsplit_once('/').unwrap();
            let name = format!("t_{}", uuid::Uuid::new_v4().simple());
            let postgres = crate::store::engine::postgres::PgUrl::parse(&format!("{server}/postgres?{query}")).unwrap();
            let admin = engine::PgConn::connect(&postgres).unwrap();
            let mut tries = 0;
            // Copied file by file (PostgreSQL 15's `FILE_COPY`): for a small template less work
            // than its default, which writes every page of the copy to the log.
            let create = format!("CREATE DATABASE {name} TEMPLATE {template_name} STRATEGY FILE_COPY");
            while let Err(e) = admin.execute_batch(&create) {
                // Another test's copy may hold the template for a moment (it must have no other
                // connection while it is copied).
                tries += 1;
                assert!(tries < 200, "creating {name}: {e}");
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            drop(admin);
            engine::PgConn::connect(
                &crate::store::engine::postgres::PgUrl::parse(&format!("{server}/{name}?{query}")).unwrap(),
            )
            .unwrap()
        })
        .join()
        .unwrap()
    }
}
