//! `baton-bench`: end-to-end throughput, latency and memory of Baton, set against the SQLite
//! ceiling measured on the same disk in the same run. A benchmark is a command that prints
//! figures; nothing here asserts a time.

//! Layout:
//! - `ceiling`: step 1, bare SQLite commits/s and rows/s, and the hub's store cycle in-process.
//! - `pg_ceiling`: step 1 on PostgreSQL, a bare `FOR UPDATE SKIP LOCKED` job queue on the
//!   server the record is on.
//! - `cluster`: the real `baton-hub` and `baton-node` processes through the test kit (stopped
//!   gracefully and reaped on drop), their data directories and certificates, and the
//!   `baton_client` clients the producers and the timed claims use.
//! - `e2e`: step 2, passes with producers against the hub and K nodes, addressed to each host
//!   by name or to one pool of every host.
//! - `fairness`: step 2b, a light conversation's latency while a heavy one drains on its host.
//! - `backlog`: step 3, claim latency with 10k, 100k and 1M queued deliveries, in the host's own
//!   queue and in a pool's.
//! - `figures`: the table, the JSON, the targets.
//! - `stats`, `procfs`: percentiles; CPU time and peak RSS from `/proc`.

pub mod backlog;
pub mod ceiling;
pub mod cluster;
pub mod e2e;
pub mod fairness;
pub mod figures;
pub mod pg_ceiling;
pub mod procfs;
pub mod stats;
