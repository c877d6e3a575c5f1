//! Keeping the record: retention, purge, backup, the offline check, and moving it between backends.
//!
//! Layout:
//! - `retention`: removing settled messages older than the retention window.
//! - `purge`: `purge`: settled deliveries and messages an operator removes.
//! - `backup`: a consistent copy of the SQLite file, checked.
//! - `verify`: the offline invariant check, returning typed problems.
//! - `transfer`: copying a record between SQLite and PostgreSQL.
//! - `canonical`: the backend-neutral dump `transfer` and its tests compare.

pub mod backup;
pub mod canonical;
pub mod purge;
pub mod retention;
pub mod transfer;
pub mod verify;
