//! The PostgreSQL schema's migrations: `schema/postgres/NNNN-*.sql`, applied in order, all of
//! those a database lacks in one transaction, under a transaction-scoped advisory lock so that
//! hubs starting at once apply them once. The version is the `baton_schema` table's one row
//! (PostgreSQL has no `user_version`); a database whose version is newer than this binary's is
//! refused and left untouched.

use tokio_postgres::{Client, GenericClient};

use super::{PgError, PgUrl};

/// The PostgreSQL schema's migrations, in order. Append-only.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../../../../../schema/postgres/0001-create-hub-store.sql"),
    include_str!("../../../../../schema/postgres/0002-sqlite-functions.sql"),
    include_str!("../../../../../schema/postgres/0003-settlement-plans-kept.sql"),
    include_str!("../../../../../schema/postgres/0004-start-lease.sql"),
    include_str!("../../../../../schema/postgres/0005-producer-quotas.sql"),
    include_str!("../../../../../schema/postgres/0006-mention-grants.sql"),
    include_str!("../../../../../schema/postgres/0007-member-families.sql"),
    include_str!("../../../../../schema/postgres/0008-stderr-tail.sql"),
    include_str!("../../../../../schema/postgres/0009-approval-and-breaker.sql"),
    include_str!("../../../../../schema/postgres/0010-traceparent.sql"),
];

/// The advisory lock key every hub takes while it migrates (the bytes of `baton_mi`). Taken
/// with `pg_advisory_xact_lock`, so it is released at commit or rollback, or when the
/// connection dies, and a hub that crashes mid-migration leaves nothing held.
pub const MIGRATION_LOCK_KEY: i64 = 0x6261_746f_6e5f_6d69;

/// The version table, created by the runner itself (in the same transaction as the first
/// migration) so that the version can be read before any migration has run.
const VERSION_TABLE: &str = "\
    CREATE TABLE IF NOT EXISTS baton_schema (
        one       BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
        version   BIGINT NOT NULL CHECK (version >= 0)
    );
    INSERT INTO baton_schema (one, version) VALUES (true, 0) ON CONFLICT (one) DO NOTHING;";

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
    let found: i64 =
        tx.query_one("SELECT version FROM baton_schema", &[]).await.map_err(fail)?.try_get(0).map_err(fail)?;
    if found > known {
        tx.rollback().await.map_err(fail)?;
        return Err(PgError::TooNew { url: url.shown().to_owned(), found, known });
    }
    for (version, sql) in (1..).zip(MIGRATIONS.iter()).skip(usize::try_from(found).unwrap_or(usize::MAX)) {
        tx.batch_execute(sql).await.map_err(|e| PgError::Migration {
            url: url.shown().to_owned(),
            version,
            detail: super::describe(&e),
        })?;
    }
    tx.execute("UPDATE baton_schema SET version = $1", &[&known]).await.map_err(fail)?;
    tx.commit().await.map_err(fail)?;
    Ok(Migrated { from: found, to: known })
}

/// The database's schema version, `None` when no Baton schema was ever applied to it.
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
    Ok(Some(row.try_get(0).map_err(fail)?))
}
