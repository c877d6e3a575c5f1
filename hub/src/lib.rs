//! The Baton hub: the delivery record in transactional SQLite, the mTLS HTTP API that nodes and
//! producers use, and the operator CLI.
//!
//! Layout:
//! - `store`: the record (SQLite), behind one narrow interface; every state transition.
//! - `config`: the hub's validated configuration and limits.
//! - `datadir`: the files in the hub's data directory.
//! - `tls`: the rustls server config and the accept loop that turns a verified client
//!   certificate into a request extension.
//! - `http`: the axum router (`app`), extractors, error mapping and handlers.
//! - `server`: `run`, which opens the store, repairs, and serves until shutdown.
//! - `wake`: the local socket through which CLI changes wake waiting long-polls.
//! - `verify`: the offline invariant check.
//! - `cli`: the operator commands.

pub mod cli;
pub mod config;
pub mod datadir;
pub mod http;
pub mod lock;
pub mod server;
pub mod store;
pub mod tls;
pub mod wake;

/// The offline invariant check, at the path tools outside the hub (the fault checker) use.
pub use store::verify;

/// Wall-clock milliseconds since the Unix epoch, the unit of every stored timestamp. The hub
/// itself reads time through an injected `Clock` (`baton_shared::clock`); this is for tools
/// outside it that call the store functions directly (the benchmark's prefill).
pub fn now_ms() -> i64 {
    baton_shared::clock::system_now_ms()
}
