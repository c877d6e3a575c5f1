//! Opening a Baton SQLite store the strict way, shared by the hub and the node.
//!
//! The sequence: refuse a file that is not a database or fails `quick_check`; refuse a schema
//! newer than this binary; set and read back every pragma; then apply the numbered migrations
//! in one transaction each. Nothing here ever rewrites a database it refuses.

use rusqlite::{Connection, OpenFlags};
use rusqlite_migration::{M, Migrations};
use std::path::Path;
use std::time::Duration;

/// How long a connection waits for another writer's lock before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// SQLite's `synchronous` setting for a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// Every commit is fsynced before it returns. The default, and what the answers promise.
    Full,
    /// Commits may be lost on power failure (not on a process crash). Faster; warned about.
    Normal,
}

impl Synchronous {
    fn pragma_value(self) -> i64 {
        match self {
            Synchronous::Full => 2,
            Synchronous::Normal => 1,
        }
    }
}

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The file is not an SQLite database, or is damaged.
    #[error("{path} is damaged or not a Baton database ({detail}); refusing to use it")]
    Damaged {
        /// The file.
        path: String,
        /// What SQLite said.
        detail: String,
    },
    /// The file could not be read or written: an I/O error, a full disk, or no permission.
    /// Not damage: the file is left as it is and opening it again once the cause is gone works.
    #[error(
        "{path} could not be read or written ({detail}); this is the disk or the file's permissions, not damage to \
         the database: fix that and start again, and do not delete the file"
    )]
    Unreadable {
        /// The file.
        path: String,
        /// What SQLite said.
        detail: String,
    },
    /// The schema is newer than this binary knows.
    #[error(
        "{path} has schema version {found}, newer than this binary's {known}; refusing to use it (upgrade the binary)"
    )]
    TooNew {
        /// The file.
        path: String,
        /// The version in the file.
        found: i64,
        /// The newest version this binary knows.
        known: i64,
    },
    /// A pragma did not take the value it was set to.
    #[error("{path}: pragma {pragma} reads back {found}, expected {expected}")]
    Pragma {
        /// The file.
        path: String,
        /// The pragma.
        pragma: &'static str,
        /// What it read back.
        found: String,
        /// What it was set to.
        expected: String,
    },
    /// The file does not exist and creation was not asked for.
    #[error("{path} does not exist")]
    Missing {
        /// The file.
        path: String,
    },
    /// A migration failed; the database is left as it was.
    #[error("{path}: migration failed: {detail}")]
    Migration {
        /// The file.
        path: String,
        /// What went wrong.
        detail: String,
    },
    /// The thread that checkpoints the store could not be started (`Checkpointer::start`).
    #[error("{path}: cannot start the thread that checkpoints it ({detail})")]
    CheckpointThread {
        /// The file.
        path: String,
        /// What the system said.
        detail: String,
    },
    /// Any other SQLite error while opening.
    #[error("{path}: {source}")]
    Sqlite {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: rusqlite::Error,
    },
}

/// Whether `e` is the disk's or the permissions' trouble (an I/O error, a full disk, a file that
/// cannot be opened or is not ours to read) rather than what the file holds.
fn is_io_trouble(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode as C;
    matches!(
        e.sqlite_error_code(),
        Some(C::SystemIoFailure | C::DiskFull | C::CannotOpen | C::PermissionDenied | C::ReadOnly)
    )
}

/// How to open a store.
#[derive(Debug, Clone, Copy)]
pub struct OpenOptions {
    /// The `synchronous` setting for writers.
    pub synchronous: Synchronous,
    /// Create the file when it does not exist.
    pub create: bool,
    /// Open read-only (no migrations, no pragmas that write).
    pub read_only: bool,
    /// How much of an existing file is checked before it is used.
    pub check: Check,
    /// The page size (bytes, a power of two from 512 to 65536) of a file this open creates;
    /// `None` is SQLite's default (4096). A file that exists keeps the page size it has.
    pub page_size: Option<u32>,
}

/// How much of an existing database file is checked at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Nothing (read-only listings: the pages they read are checked by SQLite as they go).
    None,
    /// `PRAGMA quick_check`: every page's structure, not index contents.
    Quick,
    /// `PRAGMA integrity_check`: also that every index agrees with its table, so a damaged
    /// index cannot hide rows from the queries that use it. Used where a process is about to
    /// serve from the file for a long time.
    Full,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            synchronous: Synchronous::Full,
            create: true,
            read_only: false,
            check: Check::Quick,
            page_size: None,
        }
    }
}

/// Opens (and migrates) a store at `path` with the given ordered migration scripts.
///
/// A store that is refused is left as it was found: the WAL is not folded into it, and the
/// `-wal`/`-shm` side files that opening created (and only those) are removed again.
pub fn open(path: &Path, migrations: &[&'static str], opts: OpenOptions) -> Result<Connection, OpenError> {
    let side = |suffix: &str| {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        std::path::PathBuf::from(p)
    };
    let (wal, shm) = (side("-wal"), side("-shm"));
    let (had_wal, had_shm) = (wal.exists(), shm.exists());
    let result = open_inner(path, migrations, opts);
    if result.is_err() {
        // The connection is closed by now. Side files nobody had before belong to this attempt.
        if !had_wal && std::fs::metadata(&wal).is_ok_and(|m| m.len() == 0) {
            let _ = std::fs::remove_file(&wal);
        }
        if !had_shm {
            let _ = std::fs::remove_file(&shm);
        }
    }
    result
}

fn open_inner(path: &Path, migrations: &[&'static str], opts: OpenOptions) -> Result<Connection, OpenError> {
    let shown = path.display().to_string();
    let sql_err = |source| OpenError::Sqlite { path: shown.clone(), source };
    let exists = path.exists();
    if !exists && (!opts.create || opts.read_only) {
        return Err(OpenError::Missing { path: shown });
    }
    let flags = if opts.read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let mut conn = Connection::open_with_flags(path, flags).map_err(sql_err)?;
    // Until the file has passed its checks, closing must not fold a WAL into it: a refused
    // database is left exactly as it was found.
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true).map_err(sql_err)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_err)?;
    let damaged = |e: rusqlite::Error| {
        if is_io_trouble(&e) {
            OpenError::Unreadable { path: shown.clone(), detail: e.to_string() }
        } else {
            OpenError::Damaged { path: shown.clone(), detail: e.to_string() }
        }
    };
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(damaged)?;
    let pragma = match opts.check {
        Check::None => None,
        Check::Quick => Some("quick_check"),
        Check::Full => Some("integrity_check"),
    };
    if let (true, Some(pragma)) = (exists, pragma) {
        let check: String = conn.query_row(&format!("PRAGMA {pragma}"), [], |r| r.get(0)).map_err(damaged)?;
        if check != "ok" {
            return Err(OpenError::Damaged { path: shown, detail: format!("{pragma}: {check}") });
        }
    }
    let known = migrations.len() as i64;
    if version > known {
        return Err(OpenError::TooNew { path: shown, found: version, known });
    }
    if opts.read_only {
        conn.pragma_update(None, "query_only", true).map_err(sql_err)?;
        if version == known {
            check_schema(&conn, &shown, migrations)?;
        }
        return Ok(conn);
    }
    if let (false, Some(size)) = (exists, opts.page_size) {
        // Only before the first write: WAL mode and the schema fix it for good.
        conn.pragma_update(None, "page_size", size).map_err(sql_err)?;
        check_pragma(&conn, &shown, "page_size", &size.to_string())?;
    }
    set_and_check(&conn, &shown, "journal_mode", "wal", |c| {
        c.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0))
    })?;
    conn.pragma_update(None, "synchronous", opts.synchronous.pragma_value()).map_err(sql_err)?;
    check_pragma(&conn, &shown, "synchronous", &opts.synchronous.pragma_value().to_string())?;
    // A savepoint keeps the pages it changes in a statement journal, which SQLite moves into a
    // file of its own (written through the kernel) once it passes 64 KiB: a writer job of a
    // batch did that on every commit. In memory it stays bounded by one job's pages. Temporary
    // tables and indices a writer's statements build stay in memory too; every such statement
    // is bounded by a limit, and read-only connections (the listings) keep SQLite's default.
    conn.pragma_update(None, "temp_store", "MEMORY").map_err(sql_err)?;
    check_pragma(&conn, &shown, "temp_store", TEMP_STORE_MEMORY)?;
    check_pragma(&conn, &shown, "busy_timeout", &BUSY_TIMEOUT.as_millis().to_string())?;
    // Migrations run as SQLite documents for changes to a table's definition: foreign key
    // enforcement off (it cannot change inside the migration's transaction), so that rebuilding
    // a table that others reference cascades into none of them, and every foreign key checked
    // before each migration commits.
    conn.pragma_update(None, "foreign_keys", false).map_err(sql_err)?;
    let ms = Migrations::new(migrations.iter().map(|s| M::up(s).foreign_key_check()).collect());
    ms.to_latest(&mut conn).map_err(|e| OpenError::Migration { path: shown.clone(), detail: e.to_string() })?;
    conn.pragma_update(None, "foreign_keys", true).map_err(sql_err)?;
    check_pragma(&conn, &shown, "foreign_keys", "1")?;
    check_schema(&conn, &shown, migrations)?;
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, false).map_err(sql_err)?;
    Ok(conn)
}

/// `PRAGMA temp_store` of a writer: `2`, memory (statement journals and temporary tables).
const TEMP_STORE_MEMORY: &str = "2";

/// How often a store's `Checkpointer` copies the write-ahead log into the database file.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);
/// The shortest checkpoint interval the hub's and the node's `checkpoint_interval` accept.
pub const CHECKPOINT_INTERVAL_MIN: Duration = Duration::from_millis(10);
/// The longest checkpoint interval the hub's and the node's `checkpoint_interval` accept.
pub const CHECKPOINT_INTERVAL_MAX: Duration = Duration::from_secs(3600);

/// The write-ahead log's length, in pages, at which the connection that commits checkpoints by
/// itself, as SQLite does at 1,000 pages when nothing else checkpoints: the bound on the log
/// should the `Checkpointer` fall behind (a long burst of commits with no pause between them).
pub const WRITER_CHECKPOINT_PAGES: u32 = 10_000;

/// A thread that checkpoints a store's write-ahead log on a connection of its own, at an
/// interval its caller sets (`CHECKPOINT_INTERVAL` by default), so the connection that commits
/// does not stop to copy pages into the database file and `fsync` it (SQLite's automatic
/// checkpoint runs in the committing thread, and every commit behind it waits). The
/// checkpoints are `PASSIVE`: they never wait for a reader or the writer, and copy what they can. A checkpoint syncs as the writer's
/// `synchronous` says, as the automatic one did, so nothing about durability changes: a crash
/// in the middle of one leaves the log to be checkpointed again at the next open. Dropping it
/// stops the thread (after the checkpoint in progress, if any).
pub struct Checkpointer {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts checkpointing the store at `path`, whose committing connection is `writer` (open
    /// in WAL mode): `writer` checkpoints by itself only past `WRITER_CHECKPOINT_PAGES` from now
    /// on, and a thread checkpoints every `every`.
    pub fn start(writer: &Connection, path: &Path, every: Duration) -> Result<Checkpointer, OpenError> {
        let shown = path.display().to_string();
        let sql_err = |source| OpenError::Sqlite { path: shown.clone(), source };
        let conn =
            Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)
                .map_err(sql_err)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_err)?;
        let synchronous: i64 = writer.query_row("PRAGMA synchronous", [], |r| r.get(0)).map_err(sql_err)?;
        conn.pragma_update(None, "synchronous", synchronous).map_err(sql_err)?;
        writer.pragma_update(None, "wal_autocheckpoint", WRITER_CHECKPOINT_PAGES).map_err(sql_err)?;
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || checkpoint_until_stopped(&conn, &shown, every, &stopped))
            .map_err(|e| OpenError::CheckpointThread { path: path.display().to_string(), detail: e.to_string() })?;
        Ok(Checkpointer { stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The checkpoint thread's loop: one `PASSIVE` checkpoint every `every` until `stopped` is
/// dropped. A failure is logged once until a checkpoint works again; the writer's own
/// checkpoint (`WRITER_CHECKPOINT_PAGES`) still bounds the log meanwhile.
fn checkpoint_until_stopped(conn: &Connection, path: &str, every: Duration, stopped: &std::sync::mpsc::Receiver<()>) {
    let mut failing = false;
    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
        match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0)) {
            Ok(_) => failing = false,
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(
                    "{path}: checkpointing the write-ahead log failed: {e}; the writer checkpoints past {WRITER_CHECKPOINT_PAGES} pages meanwhile"
                );
            }
            Err(_) => {}
        }
    }
}

/// The schema (every table, index and trigger with its SQL) as `name: sql` lines.
fn schema_of(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare(
        "SELECT type, name, coalesce(sql, '') FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(format!("{} {}: {}", r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
    })?;
    rows.collect()
}

/// Refuses a file whose schema is not exactly what the migrations build: a damaged schema
/// record can still parse, and would otherwise surface later as baffling SQL errors.
fn check_schema(conn: &Connection, path: &str, migrations: &[&'static str]) -> Result<(), OpenError> {
    let damaged = |detail: String| OpenError::Damaged { path: path.to_string(), detail };
    let found = schema_of(conn).map_err(|e| damaged(e.to_string()))?;
    // Built by running the scripts directly: through the migration runner, every open would log
    // "Database migrated" for this throwaway copy although no real migration ran.
    let reference = Connection::open_in_memory().map_err(|e| damaged(e.to_string()))?;
    for script in migrations {
        reference.execute_batch(script).map_err(|e| damaged(format!("reference schema: {e}")))?;
    }
    let expected = schema_of(&reference).map_err(|e| damaged(e.to_string()))?;
    if found != expected {
        let first = found.iter().zip(&expected).position(|(a, b)| a != b).unwrap_or(found.len().min(expected.len()));
        let shown =
            found.get(first).map(|s| s.chars().take(120).collect::<String>()).unwrap_or_else(|| "(missing)".into());
        return Err(damaged(format!("its schema differs from the one this binary builds, at {shown:?}")));
    }
    Ok(())
}

fn set_and_check(
    conn: &Connection,
    path: &str,
    pragma: &'static str,
    expected: &str,
    set: impl FnOnce(&Connection) -> rusqlite::Result<String>,
) -> Result<(), OpenError> {
    let found = set(conn).map_err(|source| OpenError::Sqlite { path: path.to_string(), source })?;
    if found.eq_ignore_ascii_case(expected) {
        Ok(())
    } else {
        Err(OpenError::Pragma { path: path.to_string(), pragma, found, expected: expected.to_string() })
    }
}

fn check_pragma(conn: &Connection, path: &str, pragma: &'static str, expected: &str) -> Result<(), OpenError> {
    let found: rusqlite::types::Value = conn
        .query_row(&format!("PRAGMA {pragma}"), [], |r| r.get(0))
        .map_err(|source| OpenError::Sqlite { path: path.to_string(), source })?;
    let found = match found {
        rusqlite::types::Value::Integer(i) => i.to_string(),
        rusqlite::types::Value::Text(t) => t,
        other => format!("{other:?}"),
    };
    if found == expected {
        Ok(())
    } else {
        Err(OpenError::Pragma { path: path.to_string(), pragma, found, expected: expected.to_string() })
    }
}

/// Reads back the pragmas a writer depends on, as `(name, value)` pairs, for status output.
pub fn pragmas(conn: &Connection) -> rusqlite::Result<Vec<(&'static str, String)>> {
    let mut out = Vec::new();
    for p in ["journal_mode", "synchronous", "foreign_keys", "busy_timeout", "user_version"] {
        let v: rusqlite::types::Value = conn.query_row(&format!("PRAGMA {p}"), [], |r| r.get(0))?;
        let v = match v {
            rusqlite::types::Value::Integer(i) => i.to_string(),
            rusqlite::types::Value::Text(t) => t,
            other => format!("{other:?}"),
        };
        out.push((p, v));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: &[&str] = &["CREATE TABLE t(x INTEGER);", "ALTER TABLE t ADD COLUMN y TEXT;"];

    /// An I/O error, a full disk or a permission problem while a store is checked is not called
    /// damage (an operator told "damaged" may delete a good file); what the file holds is.
    #[test]
    fn disk_trouble_is_not_called_damage() {
        let err = |code| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        for code in [
            rusqlite::ffi::SQLITE_IOERR_WRITE,
            rusqlite::ffi::SQLITE_IOERR_FSYNC,
            rusqlite::ffi::SQLITE_IOERR_READ,
            rusqlite::ffi::SQLITE_FULL,
            rusqlite::ffi::SQLITE_CANTOPEN,
            rusqlite::ffi::SQLITE_PERM,
        ] {
            assert!(is_io_trouble(&err(code)), "code {code}");
        }
        for code in [rusqlite::ffi::SQLITE_CORRUPT, rusqlite::ffi::SQLITE_NOTADB] {
            assert!(!is_io_trouble(&err(code)), "code {code}");
        }
        let shown = OpenError::Unreadable { path: "node.db".into(), detail: "disk I/O error".into() }.to_string();
        assert!(shown.contains("not damage") && !shown.contains("damaged"), "{shown}");
    }

    #[test]
    fn fresh_store_is_migrated_with_pragmas_asserted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let conn = open(&path, MS, OpenOptions::default()).unwrap();
        let p = pragmas(&conn).unwrap();
        assert!(p.contains(&("journal_mode", "wal".into())));
        assert!(p.contains(&("synchronous", "2".into())));
        assert!(p.contains(&("foreign_keys", "1".into())));
        assert!(p.contains(&("user_version", "2".into())));
    }

    #[test]
    fn newer_schema_is_refused_and_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        drop(open(&path, MS, OpenOptions::default()).unwrap());
        let err = open(&path, &MS[..1], OpenOptions::default()).unwrap_err();
        assert!(matches!(err, OpenError::TooNew { found: 2, known: 1, .. }), "{err}");
        let conn = open(&path, MS, OpenOptions::default()).unwrap();
        assert_eq!(pragmas(&conn).unwrap()[4].1, "2");
    }

    #[test]
    fn garbage_file_is_refused_and_not_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let garbage = vec![0x42u8; 8192];
        std::fs::write(&path, &garbage).unwrap();
        let err = open(&path, MS, OpenOptions::default()).unwrap_err();
        assert!(matches!(err, OpenError::Damaged { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), garbage);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("s.db")], "no side files are left behind");
    }

    #[test]
    fn damaged_file_with_a_wal_is_refused_and_neither_file_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let conn = open(&path, MS, OpenOptions::default()).unwrap();
        conn.execute_batch("PRAGMA wal_autocheckpoint = 0; CREATE TABLE big (x BLOB);").unwrap();
        for _ in 0..20 {
            conn.execute("INSERT INTO big (x) VALUES (randomblob(3000))", []).unwrap();
        }
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);").unwrap();
        conn.execute("INSERT INTO big (x) VALUES (randomblob(3000))", []).unwrap();
        // Leave the WAL behind as a crash would, then damage a page of the main file.
        let wal = dir.path().join("s.db-wal");
        let wal_before = std::fs::read(&wal).unwrap();
        std::mem::forget(conn);
        let mut bytes = std::fs::read(&path).unwrap();
        for b in &mut bytes[4096..8192] {
            *b = 0x5a;
        }
        std::fs::write(&path, &bytes).unwrap();
        let err = open(&path, MS, OpenOptions::default()).unwrap_err();
        assert!(matches!(err, OpenError::Damaged { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "the damaged file was rewritten");
        assert_eq!(std::fs::read(&wal).unwrap(), wal_before, "the WAL was folded in or removed");
    }

    #[test]
    fn a_new_file_takes_the_page_size_asked_for_and_an_existing_one_keeps_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let page = |c: &Connection| c.query_row("PRAGMA page_size", [], |r| r.get::<_, i64>(0)).unwrap();
        let small = OpenOptions { page_size: Some(2048), ..Default::default() };
        let (new, old) = (dir.path().join("new.db"), dir.path().join("old.db"));
        let conn = open(&new, MS, small).unwrap();
        conn.execute("INSERT INTO t(x) VALUES (1)", []).unwrap();
        assert_eq!(page(&conn), 2048);
        drop(conn);
        assert_eq!(page(&open(&new, MS, OpenOptions::default()).unwrap()), 2048, "kept at the next open");
        drop(open(&old, MS, OpenOptions::default()).unwrap());
        let conn = open(&old, MS, small).unwrap();
        assert_eq!(page(&conn), 4096, "a file made before keeps its pages");
        conn.execute("INSERT INTO t(x) VALUES (2)", []).unwrap();
    }

    #[test]
    fn a_tampered_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let conn = open(&path, MS, OpenOptions::default()).unwrap();
        conn.execute_batch("PRAGMA writable_schema = ON; UPDATE sqlite_master SET sql = replace(sql, 'y TEXT', 'z TEXT') WHERE name = 't'; PRAGMA writable_schema = OFF;").unwrap();
        drop(conn);
        let err = open(&path, MS, OpenOptions::default()).unwrap_err();
        assert!(matches!(err, OpenError::Damaged { .. }) && err.to_string().contains("schema"), "{err}");
        let ro = OpenOptions { read_only: true, create: false, ..Default::default() };
        assert!(matches!(open(&path, MS, ro), Err(OpenError::Damaged { .. })));
    }

    #[test]
    fn failed_migration_leaves_data_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let conn = open(&path, &MS[..1], OpenOptions::default()).unwrap();
        conn.execute("INSERT INTO t(x) VALUES (7)", []).unwrap();
        drop(conn);
        let bad: &[&str] = &[MS[0], "ALTER TABLE t ADD COLUMN y TEXT; THIS IS NOT SQL;"];
        assert!(open(&path, bad, OpenOptions::default()).is_err());
        let conn = open(&path, &MS[..1], OpenOptions::default()).unwrap();
        let x: i64 = conn.query_row("SELECT x FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(x, 7);
        assert_eq!(pragmas(&conn).unwrap()[4].1, "1");
    }

    /// The temporary files SQLite has open in this process (it unlinks them at once, so they
    /// show only among the process's file descriptors).
    fn sqlite_temp_files() -> std::collections::BTreeSet<String> {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .map(|target| target.to_string_lossy().into_owned())
            .filter(|target| target.contains("etilqs_"))
            .collect()
    }

    /// A writer's savepoint that changes far more than 64 KiB of pages keeps its statement
    /// journal in memory: no temporary file is opened (the writer's jobs of a batch each ran
    /// in such a savepoint and wrote that file on every commit). The same savepoint with
    /// `temp_store = FILE` does open one, which shows the check can see it.
    #[test]
    fn a_writer_keeps_its_savepoint_journal_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let mut conn = open(&path, &["CREATE TABLE big(x BLOB);"], OpenOptions::default()).unwrap();
        let temp_store: i64 = conn.query_row("PRAGMA temp_store", [], |r| r.get(0)).unwrap();
        assert_eq!(temp_store.to_string(), TEMP_STORE_MEMORY);
        write_pages(&conn, 100);
        let rewrite_in_savepoint = |conn: &mut Connection| {
            let before = sqlite_temp_files();
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).unwrap();
            tx.execute_batch("SAVEPOINT job; UPDATE big SET x = randomblob(3000);").unwrap();
            let opened: Vec<String> = sqlite_temp_files().difference(&before).cloned().collect();
            tx.rollback().unwrap();
            opened
        };
        let opened = rewrite_in_savepoint(&mut conn);
        assert!(opened.is_empty(), "a writer's savepoint journal went to a file: {opened:?}");
        conn.pragma_update(None, "temp_store", "FILE").unwrap();
        let opened = rewrite_in_savepoint(&mut conn);
        assert!(!opened.is_empty(), "with temp_store = FILE the journal should spill to a file");
        let reader =
            open(&path, &["CREATE TABLE big(x BLOB);"], OpenOptions { read_only: true, ..Default::default() }).unwrap();
        let temp_store: i64 = reader.query_row("PRAGMA temp_store", [], |r| r.get(0)).unwrap();
        assert_eq!(temp_store, 0, "read-only connections keep SQLite's default");
    }

    /// Writes `pages` rows of about a page each in one transaction.
    fn write_pages(conn: &Connection, pages: usize) {
        conn.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
             INSERT INTO big (x) SELECT randomblob(3000) FROM n",
            [pages as i64],
        )
        .unwrap();
    }

    fn file_len(path: &Path) -> u64 {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    }

    #[test]
    fn the_checkpointer_copies_the_log_into_the_file_and_the_log_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let (path, wal) = (dir.path().join("s.db"), dir.path().join("s.db-wal"));
        let conn = open(&path, MS, OpenOptions::default()).unwrap();
        conn.execute_batch("CREATE TABLE big (x BLOB);").unwrap();
        let _checkpoints = Checkpointer::start(&conn, &path, Duration::from_millis(10)).unwrap();
        write_pages(&conn, 200);
        // Only a checkpoint puts the rows into the database file itself.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while file_len(&path) < 200 * 3000 {
            assert!(std::time::Instant::now() < deadline, "no checkpoint copied the log into the file");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Once a checkpoint has copied all of it, a commit starts the log over instead of
        // growing it (one page at a time: far below the writer's own bound).
        let mut written = 200;
        let mut longest = file_len(&wal);
        loop {
            write_pages(&conn, 1);
            written += 1;
            if file_len(&wal) <= longest {
                break;
            }
            longest = file_len(&wal);
            assert!(std::time::Instant::now() < deadline, "the log only grew, to {longest} bytes");
            std::thread::sleep(Duration::from_millis(20));
        }
        let rows: i64 = conn.query_row("SELECT count(*) FROM big", [], |r| r.get(0)).unwrap();
        assert_eq!(rows, written);
    }

    #[test]
    fn with_a_checkpointer_the_writer_checkpoints_only_past_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let (path, wal) = (dir.path().join("s.db"), dir.path().join("s.db-wal"));
        let conn = open(&path, MS, OpenOptions::default()).unwrap();
        conn.execute_batch("CREATE TABLE big (x BLOB);").unwrap();
        let start = file_len(&path);
        // A checkpointer that never gets to run: every checkpoint is the writer's own.
        let checkpoints = Checkpointer::start(&conn, &path, Duration::from_secs(3600)).unwrap();
        let page = 4096;
        // Past SQLite's own 1,000 pages, the writer leaves the log alone.
        for _ in 0..3 {
            write_pages(&conn, 1000);
        }
        assert_eq!(file_len(&path), start, "the writer checkpointed below its bound");
        assert!(file_len(&wal) > 3000 * page);
        // Past its bound it checkpoints by itself: the log stays bounded without the thread.
        let bound = u64::from(WRITER_CHECKPOINT_PAGES);
        while file_len(&path) == start {
            assert!(file_len(&wal) < (bound + 2000) * page, "the log grew past the writer's bound");
            write_pages(&conn, 1000);
        }
        drop(checkpoints);
        let rows: i64 = conn.query_row("SELECT count(*) FROM big", [], |r| r.get(0)).unwrap();
        assert!(rows > i64::from(WRITER_CHECKPOINT_PAGES) - 2000, "{rows} rows");
    }
}
