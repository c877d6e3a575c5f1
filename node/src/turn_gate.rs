//! What starts and stops a turn's process from outside the executor: the gate a turn starts
//! behind (`Gate`, the `turn-gate` subcommand: see the executor's module doc, "The gate") and
//! the handle a hub's cancel arrives through (`CancelHandle`). The executor (`exec`) and the
//! node's shared state both hold them, so they live apart from either.

use nix::errno::Errno;
use std::io::Write as _;
use std::os::fd::AsFd as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use tokio_util::sync::CancellationToken;

/// A cancel of one running turn, asked for by the hub (an operator or the producer): set once
/// with its reason; the turn's `Spawned::run` then stops its process group (SIGTERM, SIGKILL
/// after `cancel_grace`) and ends it `cancelled`.
#[derive(Debug, Clone, Default)]
pub struct CancelHandle {
    token: CancellationToken,
    reason: Arc<OnceLock<String>>,
}

impl CancelHandle {
    /// Asks for the cancel (the first reason given is kept).
    pub fn request(&self, reason: &str) {
        let _ = self.reason.set(reason.to_string());
        self.token.cancel();
    }

    /// Whether a cancel was asked for.
    pub fn is_requested(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Completes once a cancel was asked for.
    pub async fn requested(&self) {
        self.token.cancelled().await
    }

    /// Why, once asked for.
    pub fn reason(&self) -> String {
        self.reason.get().cloned().unwrap_or_default()
    }
}

/// The hidden subcommand that runs the gate (`baton-node turn-gate -- ARGV…`).
pub const GATE_SUBCOMMAND: &str = "turn-gate";
/// The byte the node writes to the gate's stdin to let it become the harness. A newline, so a
/// shell's `read` (the `Gate::shell` stand-in) takes exactly it and leaves the payload.
pub const GATE_RELEASE: u8 = b'\n';
/// The gate's exit status when it could not become the harness (the shell's "cannot run").
pub const GATE_EXEC_FAILED_STATUS: u8 = 127;

/// How a turn's process starts: the argv put before the harness argv. The program it names
/// must wait for `GATE_RELEASE` on stdin and then become the rest of its argv.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    argv: Vec<String>,
}

impl Gate {
    /// This very binary's `turn-gate`, through `/proc/self/exe`: the running executable even when
    /// the file on disk was replaced by an upgrade since the node started.
    pub fn this_binary() -> Gate {
        Gate::binary(Path::new("/proc/self/exe"))
    }

    /// The `turn-gate` of the `baton-node` binary at `path` (tests that run the executor from
    /// another program).
    pub fn binary(path: &Path) -> Gate {
        Gate { argv: vec![path.display().to_string(), GATE_SUBCOMMAND.into(), "--".into()] }
    }

    /// The same protocol in `sh`: `read` takes the release line, `exec` becomes the harness.
    /// For unit tests, which run inside a test binary rather than `baton-node`.
    pub fn shell() -> Gate {
        Gate { argv: vec!["sh".into(), "-c".into(), "read -r _ || exit 1; exec \"$@\"".into(), "turn-gate".into()] }
    }

    /// The argv put before the harness argv.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }
}

/// The `turn-gate` subcommand: waits for the release byte on stdin, then replaces itself with
/// `argv` (same pid, group and start time). Returns only when it does not: the node never
/// released it (end of file: nothing runs) or `argv` cannot be run.
pub fn gate(argv: &[String]) -> u8 {
    let Some((program, args)) = argv.split_first() else {
        return baton_shared::exit::USAGE;
    };
    let stdin = std::io::stdin();
    let mut byte = [0u8; 1];
    // One byte, unbuffered: whatever follows on stdin is the harness's payload.
    let read = loop {
        match nix::unistd::read(stdin.as_fd(), &mut byte) {
            Err(Errno::EINTR) => continue,
            other => break other,
        }
    };
    if read != Ok(1) || byte[0] != GATE_RELEASE {
        return baton_shared::exit::NOTHING;
    }
    let err = std::process::Command::new(program).args(args).exec();
    // stderr is the harness's stderr pipe: the node logs this line with the turn.
    let _ = writeln!(std::io::stderr(), "baton-node {GATE_SUBCOMMAND}: cannot start {program:?}: {err}");
    GATE_EXEC_FAILED_STATUS
}
