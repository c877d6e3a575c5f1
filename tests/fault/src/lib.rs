//! Baton's fault suite: the invariant checker, the TCP fault proxy, the process cluster the
//! crash-point matrix and the soak drive, and the soak itself.
//!
//! Layout:
//! - `records`: the client history and effects-ledger JSON lines, and the ledger harness command.
//! - `checker`: loads hub and node databases read-only plus the records, checks RELIABILITY.md
//!   §6.3 (I1–I10, I12–I19) and explains every violation with its chain of events.
//! - `proxy`: the loopback TCP fault proxy (blackhole, reset, cut after N bytes, delay).
//! - `cluster`: the hub and its nodes as test-kit processes (`baton_testkit`, killed and reaped
//!   on drop), each node behind its own proxy, and the producer that writes the client history.
//! - `matrix`: one crash-point run (arm, crash, restart, retry, drain, check).
//! - `soak`: the seeded kill/pause/partition/fence soak behind `baton-soak`.

pub mod checker;
pub mod cluster;
pub mod matrix;
pub mod proxy;
pub mod records;
pub mod soak;
