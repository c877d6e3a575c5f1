//! `baton-testkit`: the one test kit. Every suite that drives the real `baton-hub` and
//! `baton-node` — the end-to-end tests (`tests/it`), the fault suite, the benchmark and the demo —
//! finds, starts, waits for, signals and inspects them through this crate, so each of those
//! things is done one way and fixed in one place.
//!
//! In the style of ripgrep's `tests/util.rs`: the binaries run in fresh directories with a
//! scrubbed environment, nothing is shared between two hubs of a test (port 0, own CA, own
//! certificates), and every wait is for an event (a file, an answer, an exit) with a generous
//! deadline. Hubs of different tests may share a CA: under cargo-nextest a test's first hub
//! on SQLite is a copy of one made and enrolled once per run (`Hub::init_enrolled`); they never
//! share a port or a directory.
//!
//! Layout:
//! - `bins`: `Binaries` (found through `BATON_HUB_BIN` / `BATON_NODE_BIN`, else next to the
//!   running executable; built once per test process), scrubbed commands, and `run`, one
//!   command to completion under a deadline; `producer_cli`, the producer command line `baton`
//!   (`BATON_CLI_BIN`), found and built the same way (`locate_producer_cli`: found only);
//!   `build_bins_shown`, the demo's build of the programs, with cargo's progress shown;
//!   `example`, a workspace example program (the client's), built with the binaries.
//! - `proc`: `Proc`, one restartable child process: its log files (one per stream, every run
//!   appended), signals, waiting for its exit, stopping it on drop, and printing its log when a
//!   test panics. `stop_all_on_signal` for programs that are signalled themselves.
//! - `identity`: `Identity`, an enrolled certificate on disk, and the mTLS reqwest clients.
//! - `hub`: `Hub`, a hub data directory (`init`, `enroll`, the operator CLI; `init_enrolled`,
//!   both at once, from the run's template under nextest) and its `serve` process, started on
//!   loopback and waited for until `/readyz` answers over mTLS.
//! - `node`: `NodeConfig` (the TOML file) and `Node`, one `baton-node run` process.
//! - `wait`: `until`, the one polling wait with a deadline.
//! - `otlp`: `OtlpSink`, a real OTLP/HTTP trace receiver on loopback (decodes what the hub's
//!   and the node's exporters send), for the trace tests and the benchmark's tracing-on run.
//! - `pg`: `PgCluster`, a throwaway PostgreSQL server from the installed server binaries
//!   (`initdb` as an unprivileged user, a free port, optional TLS), and `cluster_or_skip`, the
//!   skip-or-require rule (`BATON_REQUIRE_POSTGRES`).
//! - `python`: the Python interpreter (`BATON_PYTHON`, else `python3`) that imports what a
//!   suite needs, commands importing the Python client package from the source tree, and the
//!   skip-or-require rule (`BATON_REQUIRE_PYTHON`).
//!
//! Invariant: every child process started here is owned by a `Proc` (or, for `bins::run`, by
//! the call), which stops and reaps it; none outlives its owner.
//! Invariant: no wait here is a bare sleep; each polls for an event and fails at its deadline.

pub mod bins;
pub mod hub;
pub mod identity;
pub mod node;
pub mod otlp;
pub mod pg;
pub mod proc;
pub mod python;
pub mod wait;

pub use bins::Binaries;
pub use hub::{Hub, Started};
pub use identity::{Identity, Role};
pub use node::{Harness, Node, NodeConfig};
pub use proc::{Proc, Signal};

use std::time::Duration;

/// How long the kit waits for a process event (a hub ready, a CLI command, an exit) unless the
/// caller says otherwise. Generous on purpose: a loaded 2-core machine must not make a suite
/// flaky; a real hang still fails.
pub const EVENT_WAIT: Duration = Duration::from_secs(20);

/// A fresh temporary directory named `PREFIX…`, removed when the returned value is dropped.
pub fn fresh_dir(prefix: &str) -> anyhow::Result<tempfile::TempDir> {
    Ok(tempfile::Builder::new().prefix(prefix).tempdir()?)
}
