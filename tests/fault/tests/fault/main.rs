//! The fault suite, one test binary: every module's tests share one pool of test threads, so a
//! long run that mostly waits on its processes (a soak, the crash matrix, a partition) overlaps
//! the others instead of queueing behind them, and the suite links once instead of once a file.
//! Select a part by its module, e.g. `cargo test -p baton-fault --all-features --test fault --
//! crash_points::`.
//!
//! Layout:
//! - `crash_points`, `crash_points_postgres`: R1, every crash point of hub and node, on SQLite
//!   at the run's seed (the three-seed matrix by `BATON_FAULT_SEEDS`) and once on two hubs over
//!   PostgreSQL (the node's points a daily third of them, all with `BATON_FAULT_SEEDS`).
//! - `mutations`: each checker invariant, broken on purpose, is caught.
//! - `proxy`: the TCP fault proxy between nodes and hub: cuts, partitions, copies of a node's
//!   directory started while the original is cut off.
//! - `pg_link`: the hub's link to PostgreSQL cut and restored.
//! - `soak`, `soak_postgres`: short fixed-seed soaks with the nemesis.
//! - `disk_full`, `io_errors`, `clock_steps`: injected faults of the system below the hub and
//!   the node (a full disk, `EIO`, clock steps), with `support` for what they share.

mod clock_steps;
mod crash_points;
mod crash_points_postgres;
mod disk_full;
mod io_errors;
mod mutations;
mod pg_link;
mod proxy;
mod soak;
mod soak_postgres;
mod support;
