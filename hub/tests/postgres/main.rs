//! The hub's PostgreSQL record against real throwaway clusters, one test binary (so its tests
//! share one pool of test threads and the suite links once); each module skips without
//! PostgreSQL server binaries unless `BATON_REQUIRE_POSTGRES=1`. Run one part by its module,
//! e.g. `cargo test -p baton-hub --all-features --test postgres -- pg_claims::`.
//!
//! Layout:
//! - `pg_migrate`: connecting, migrations once and in step across hubs, a newer schema refused.
//! - `pg_schema`: the PostgreSQL schema held to the SQLite one, and the same writes leaving the
//!   same record on both.
//! - `pg_notify`: hubs waking each other through `LISTEN`/`NOTIFY`.
//! - `pg_claims`: claims of several hubs at once on one record.
//! - `pg_conflicts`: a deadlocked claim run again inside the hub, never a 503.
//! - `pg_analyze`: the hub's statistics round.
//! - `pg_pools`: pools on both backends' records: the migration that brings them.
//! - `pg_settlement`: the settlement migration on both backends, and settling on the migrated record.

mod pg_analyze;
mod pg_claims;
mod pg_conflicts;
mod pg_migrate;
mod pg_notify;
mod pg_pools;
mod pg_schema;
mod pg_settlement;
