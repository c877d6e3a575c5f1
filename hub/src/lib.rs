//! The Baton hub: the delivery record in transactional SQLite, the mTLS HTTP API that nodes and
//! producers use, and the operator CLI.
//!
//! Layout:
//! - `store`: the record (SQLite), the only code that runs SQL; every state transition, the
//!   fences and their precedence, and the offline invariant check (`store::upkeep::verify`).
//! - `config`: every configuration key, declared once, layered file < environment < flag into
//!   the validated `HubConfig`.
//! - `datadir`: the files in the hub's data directory.
//! - `fds`: the open-file limit, raised at start, that `limits.connections_max` must fit.
//! - `lock`: one hub per data directory (`DIR/hub.lock`).
//! - `tls`: the rustls server config and the accept loop that turns a verified client
//!   certificate into a request extension.
//! - `http`: the axum router (`app`), extractors, error mapping and handlers.
//! - `ops_listener`: the operator listener (plain HTTP, no client certificate): health,
//!   readiness, metrics and the status page (`status_page`).
//! - `metrics`: every metric described once, the build info and the gauges read from the
//!   record.
//! - `server`: `Hub`: `open` (lock, store, repair), `announce`, `serve` until shutdown.
//! - `housekeeping`: background tasks beside `server`'s (the audit log's retention sweep,
//!   `requeue_silent_after`).
//! - `wake`: the local socket through which CLI changes wake waiting long-polls.
//! - `attention`: what needs an operator's attention, for `status` and the status page alike.
//! - `cli`: the operator commands: arguments, output, and the commands by job.

pub mod attention;
pub mod cli;
pub mod config;
pub mod datadir;
pub mod fds;
mod housekeeping;
pub mod http;
pub mod lock;
pub mod metrics;
pub mod ops_listener;
/// The record on PostgreSQL: connection (with TLS) and the schema's migrations.
pub mod peers;
pub mod runtime;
pub mod server;
pub mod status_page;
pub mod store;
pub mod tls;
pub mod wake;

/// The offline invariant check, at the path tools outside the hub (the fault checker) use.
pub use store::upkeep::verify;
