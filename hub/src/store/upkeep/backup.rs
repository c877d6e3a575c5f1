//! A consistent copy of the hub database (`baton-hub backup`), taken while the hub may be
//! running, and checked before it is reported good; and what `restore` reads of a copy
//! (`facts`, `checkpoint`).

use crate::store::Store;
use crate::store::engine::{Db, SqliteFile};
use crate::store::handle::sqlite_file;
use crate::store::{StoreError, StoreResult};
use std::path::Path;

impl Store {
    /// A consistent copy of the record at `path`, checked.
    pub async fn backup_to(&self, path: std::path::PathBuf) -> StoreResult<()> {
        self.conns.read(move |c| copy_to(sqlite_file(c, "backup_to")?, &path)).await
    }

    /// SQLite's full integrity check: what it found wrong (empty when nothing).
    pub async fn integrity(&self) -> StoreResult<Vec<String>> {
        self.conns.read(|c| Ok(sqlite_file(c, "integrity")?.integrity()?)).await
    }

    /// What the record holds, for a restore's report (`schema_version` as found before any
    /// migration).
    pub async fn backup_facts(&self, schema_version: i64) -> StoreResult<Facts> {
        self.conns
            .read(move |c| {
                sqlite_file(c, "backup_facts")?;
                facts(c, schema_version)
            })
            .await
    }

    /// Folds the write-ahead log into the database file.
    pub async fn checkpoint(&self) -> StoreResult<()> {
        self.conns.read(|c| checkpoint(sqlite_file(c, "checkpoint")?)).await
    }
}

/// Writes a consistent copy of the database `conn` reads to `path` (which must not exist), then
/// opens the copy and runs a full integrity check on it. A read-only connection is enough.
///
/// The copy holds every payload, so it is created readable by its owner only (mode 0600,
/// whatever the umask), as the database itself is: the empty file is made first, exclusively,
/// and SQLite writes into it.
pub fn copy_to(file: SqliteFile<'_>, path: &Path) -> StoreResult<()> {
    let target = path
        .to_str()
        .ok_or_else(|| StoreError::Invalid(format!("{}: the backup path is not UTF-8", path.display())))?;
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(|e| {
            StoreError::Invalid(format!("{}: cannot create the backup file ({e}); it must not exist", path.display()))
        })?;
    }
    let written = write_copy(file, target, path);
    if written.is_err() {
        // Only the file this call created, which holds nothing usable.
        let _ = std::fs::remove_file(path);
    }
    written
}

/// Copies into the (empty, owner-only) file at `target`, then the integrity check of the copy.
fn write_copy(file: SqliteFile<'_>, target: &str, path: &Path) -> StoreResult<()> {
    file.copy_into(target)?;
    let copy = crate::store::open_read(path).map_err(|e| StoreError::Storage(e.to_string()))?;
    let problems = integrity(&copy)?;
    if problems.is_empty() {
        Ok(())
    } else {
        Err(StoreError::Storage(format!("the copy failed its integrity check: {}", problems.join("; "))))
    }
}

/// SQLite's full `integrity_check` of the whole file `conn` reads: every problem it reports,
/// none when the file is sound. Its time grows with the database; only `verify` and `backup`
/// run it.
pub fn integrity(conn: &dyn Db) -> StoreResult<Vec<String>> {
    Ok(sqlite_file(conn, "integrity")?.integrity()?)
}

/// What a database holds, as `restore` tells the operator before and after it replaces one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Its schema version (`PRAGMA user_version`) as found, before any migration.
    pub schema_version: i64,
    /// Messages it holds.
    pub messages: i64,
    /// When its newest message was accepted (unix ms), if it holds any.
    pub newest_accepted_at_ms: Option<i64>,
    /// Its last recorded change of any kind (a delivery event, an operator event; unix ms).
    pub last_change_at_ms: Option<i64>,
}

/// The facts of a database (`schema_version` as the caller read it before opening for write).
pub fn facts(conn: &dyn Db, schema_version: i64) -> StoreResult<Facts> {
    let (messages, newest_accepted_at_ms) =
        conn.query_row("SELECT count(*), max(accepted_at) FROM messages", [], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let (delivery_event_at, operator_event_at): (i64, i64) = conn.query_row(
        "SELECT coalesce((SELECT max(at) FROM delivery_events), 0), coalesce((SELECT max(at) FROM operator_events), 0)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let last_change_at_ms = delivery_event_at.max(operator_event_at);
    Ok(Facts {
        schema_version,
        messages,
        newest_accepted_at_ms,
        last_change_at_ms: (last_change_at_ms > 0).then_some(last_change_at_ms),
    })
}

/// Folds the write-ahead log into the database file and empties it, so the file alone holds
/// everything (before `restore` moves it).
pub fn checkpoint(file: SqliteFile<'_>) -> StoreResult<()> {
    if !file.checkpoint()? {
        return Err(StoreError::Storage("the write-ahead log could not be folded into the database".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::testing;

    #[test]
    fn a_copy_is_complete_and_checked() {
        let db = testing::db();
        accept_one(&db.conn, "c", "k", &["host-a"]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("copy.db");
        let reader = crate::store::open_read(&db.path).unwrap();
        copy_to(reader.sqlite_file().unwrap(), &path).unwrap();
        let copy = crate::store::open_read(&path).unwrap();
        let n: i64 = copy.query_row("SELECT count(*) FROM deliveries", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 1);
        assert!(copy_to(reader.sqlite_file().unwrap(), &path).is_err(), "an existing file is never overwritten");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the backup holds every payload: owner-only, whatever the umask");
        assert!(integrity(&copy).unwrap().is_empty());
    }
}
