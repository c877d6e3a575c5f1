//! The PostgreSQL schema's migrations: `schema/postgres/NNNN-*.sql`, applied in order, all of
//! those a database lacks in one transaction, under a transaction-scoped advisory lock so that
//! hubs starting at once apply them once. The version is the `baton_schema` table's one row
//! (PostgreSQL has no `user_version`); a database whose version is newer than this binary's is
//! refused and left untouched.
//!
//! The two schema histories are numbered in lockstep: migration N here is the same change as
//! `schema/hub/` N. The PostgreSQL record began at SQLite's 0006, so its 0001 creates the schema
//! as SQLite's 0001 to 0006 left it (with what PostgreSQL needs besides, `FIRST_ALSO`), and its
//! 0002 to 0006 apply nothing. A record migrated before the histories were put in lockstep
//! counted apart (its 0004 was SQLite's 0007); the runner recognises it by the `lockstep` column
//! its version table lacks and renumbers it once (`before_lockstep`), in the same transaction.

use tokio_postgres::{Client, GenericClient};

use super::{PgError, PgUrl};

/// The PostgreSQL schema's migrations, in order, numbered as SQLite's. Append-only.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../../../../../schema/postgres/0001-create-hub-store.sql"),
    include_str!("../../../../../schema/postgres/0002-conversations.sql"),
    include_str!("../../../../../schema/postgres/0003-turn-control.sql"),
    include_str!("../../../../../schema/postgres/0004-turn-control-indexes.sql"),
    include_str!("../../../../../schema/postgres/0005-fence-expiry.sql"),
    include_str!("../../../../../schema/postgres/0006-settled-at.sql"),
    include_str!("../../../../../schema/postgres/0007-start-lease.sql"),
    include_str!("../../../../../schema/postgres/0008-producer-quotas.sql"),
    include_str!("../../../../../schema/postgres/0009-mention-grants.sql"),
    include_str!("../../../../../schema/postgres/0010-member-families.sql"),
    include_str!("../../../../../schema/postgres/0011-stderr-tail.sql"),
    include_str!("../../../../../schema/postgres/0012-approval-and-breaker.sql"),
    include_str!("../../../../../schema/postgres/0013-progress-and-feeds.sql"),
    include_str!("../../../../../schema/postgres/0014-deadlines-and-stalls.sql"),
    include_str!("../../../../../schema/postgres/0015-breaker-period.sql"),
    include_str!("../../../../../schema/postgres/0016-traceparent.sql"),
    include_str!("../../../../../schema/postgres/0017-pools.sql"),
    include_str!("../../../../../schema/postgres/0018-settlement.sql"),
];

const _: () = assert!(
    MIGRATIONS.len() == crate::store::MIGRATIONS.len(),
    "the PostgreSQL and SQLite schema histories are numbered in lockstep"
);

/// What migration 0001 also applies on PostgreSQL, after its file: the SQLite functions the
/// store's statements use, under SQLite's names (`json_valid`), and the settlement check in
/// PL/pgSQL so its plan is kept. Before the lockstep they were PostgreSQL's own 0002 and 0003.
pub const FIRST_ALSO: [&str; 2] = [
    include_str!("../../../../../schema/postgres/before-lockstep/0002-sqlite-functions.sql"),
    include_str!("../../../../../schema/postgres/before-lockstep/0003-settlement-plans-kept.sql"),
];

/// The first version counted in lockstep: a record numbered apart at a version `v` of at least
/// `APART_LAST_SHARED` (its 0001 and `FIRST_ALSO` applied) is at lockstep version `v + APART_OFFSET`.
const APART_LAST_SHARED: i64 = 3;
/// See `APART_LAST_SHARED`: the lockstep number of a record's migration numbered apart.
const APART_OFFSET: i64 = 3;
const _: () = assert!(APART_LAST_SHARED + APART_OFFSET == 6, "numbered apart, 0003 was SQLite's 0006");

/// The advisory lock key every hub takes while it migrates (the bytes of `baton_mi`). Taken
/// with `pg_advisory_xact_lock`, so it is released at commit or rollback, or when the
/// connection dies, and a hub that crashes mid-migration leaves nothing held.
pub const MIGRATION_LOCK_KEY: i64 = 0x6261_746f_6e5f_6d69;

/// The version table, created by the runner itself (in the same transaction as the first
/// migration) so that the version can be read before any migration has run.
const VERSION_TABLE: &str = "\
    CREATE TABLE IF NOT EXISTS baton_schema (
        one       BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
        version   BIGINT NOT NULL CHECK (version >= 0),
        lockstep  BOOLEAN NOT NULL DEFAULT true
    );
    INSERT INTO baton_schema (one, version) VALUES (true, 0) ON CONFLICT (one) DO NOTHING;";

/// Whether the version table has the `lockstep` column (a record migrated before the histories
/// were numbered in lockstep has not).
const HAS_LOCKSTEP: &str = "SELECT EXISTS (SELECT 1 FROM information_schema.columns
     WHERE table_schema = current_schema() AND table_name = 'baton_schema' AND column_name = 'lockstep')";

/// What a `migrate` call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migrated {
    /// The schema version found.
    pub from: i64,
    /// The schema version now (this binary's).
    pub to: i64,
}

impl Migrated {
    /// Whether nothing was applied (the database was already at this binary's version).
    pub fn was_current(&self) -> bool {
        self.from == self.to
    }
}

/// The newest schema version this binary knows.
pub fn known_version() -> i64 {
    i64::try_from(MIGRATIONS.len()).unwrap_or(i64::MAX)
}

/// Brings the database at `url` (connected as `client`) to this binary's schema version.
///
/// In one transaction: take the advisory lock (waiting for a hub that is migrating), read the
/// version, refuse one newer than this binary's (`PgError::TooNew`, exit 3), apply each missing
/// migration, record the new version, commit. A failure rolls everything back. Running it on a
/// current database changes nothing.
pub async fn migrate(client: &mut Client, url: &PgUrl) -> Result<Migrated, PgError> {
    let known = known_version();
    let fail = |e: tokio_postgres::Error| PgError::from_client(url, &e);
    let tx = client.transaction().await.map_err(fail)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY]).await.map_err(fail)?;
    // The version table exists at every start but the first: its "already exists, skipping"
    // notice would reach every hub's log. Warnings and errors still come through.
    tx.batch_execute("SET LOCAL client_min_messages = warning").await.map_err(fail)?;
    tx.batch_execute(VERSION_TABLE).await.map_err(fail)?;
    let found = before_lockstep(&tx, url).await?;
    if found > known {
        tx.rollback().await.map_err(fail)?;
        return Err(PgError::TooNew { url: url.shown().to_owned(), found, known });
    }
    for (version, sql) in (1..).zip(MIGRATIONS.iter()).skip(usize::try_from(found).unwrap_or(usize::MAX)) {
        apply(&tx, url, version, sql).await?;
        if version == 1 {
            for also in FIRST_ALSO {
                apply(&tx, url, version, also).await?;
            }
        }
    }
    tx.execute("UPDATE baton_schema SET version = $1", &[&known]).await.map_err(fail)?;
    tx.commit().await.map_err(fail)?;
    Ok(Migrated { from: found, to: known })
}

/// Applies one migration's text as part of `version`.
async fn apply(tx: &impl GenericClient, url: &PgUrl, version: i64, sql: &str) -> Result<(), PgError> {
    tx.batch_execute(sql).await.map_err(|e| PgError::Migration {
        url: url.shown().to_owned(),
        version,
        detail: super::describe(&e),
    })
}

/// The record's version in lockstep numbering. A record migrated before the lockstep (its
/// version table has no `lockstep` column) is renumbered here, in the caller's transaction: at
/// `APART_LAST_SHARED` or later it moves by `APART_OFFSET`; at 1 or 2 (its 0001, without all of
/// what is now `FIRST_ALSO`) it gets the rest of `FIRST_ALSO` and is at 6, which its schema then
/// is; at 0 nothing was applied and it stays 0.
async fn before_lockstep(tx: &impl GenericClient, url: &PgUrl) -> Result<i64, PgError> {
    let fail = |e: tokio_postgres::Error| PgError::from_client(url, &e);
    let lockstep: bool = tx.query_one(HAS_LOCKSTEP, &[]).await.map_err(fail)?.try_get(0).map_err(fail)?;
    let found: i64 =
        tx.query_one("SELECT version FROM baton_schema", &[]).await.map_err(fail)?.try_get(0).map_err(fail)?;
    if lockstep {
        return Ok(found);
    }
    let renumbered = match found {
        0 => 0,
        1 | 2 => {
            let applied = usize::try_from(found - 1).unwrap_or(0);
            for also in FIRST_ALSO.iter().skip(applied) {
                apply(tx, url, 1, also).await?;
            }
            APART_LAST_SHARED + APART_OFFSET
        }
        v => v + APART_OFFSET,
    };
    tx.batch_execute("ALTER TABLE baton_schema ADD COLUMN lockstep BOOLEAN NOT NULL DEFAULT true")
        .await
        .map_err(fail)?;
    tx.execute("UPDATE baton_schema SET version = $1", &[&renumbered]).await.map_err(fail)?;
    Ok(renumbered)
}

/// The database's schema version in lockstep numbering, `None` when no Baton schema was ever
/// applied to it.
pub async fn schema_version(client: &impl GenericClient, url: &PgUrl) -> Result<Option<i64>, PgError> {
    let fail = |e: tokio_postgres::Error| PgError::from_client(url, &e);
    let exists: bool = client
        .query_one("SELECT to_regclass('baton_schema') IS NOT NULL", &[])
        .await
        .map_err(fail)?
        .try_get(0)
        .map_err(fail)?;
    if !exists {
        return Ok(None);
    }
    let row = client.query_one("SELECT version FROM baton_schema", &[]).await.map_err(fail)?;
    let version: i64 = row.try_get(0).map_err(fail)?;
    let lockstep: bool = client.query_one(HAS_LOCKSTEP, &[]).await.map_err(fail)?.try_get(0).map_err(fail)?;
    // A record not yet renumbered (no hub of this version has opened it) is told in lockstep
    // numbers too, as `migrate` will renumber it.
    Ok(Some(if lockstep || version < APART_LAST_SHARED { version } else { version + APART_OFFSET }))
}
