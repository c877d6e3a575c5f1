//! Exit statuses, the same for `baton-hub` and `baton-node` (and every CLI command of either),
//! and for `baton`, the producer CLI, which adds `NOT_SUCCEEDED` and `TIMED_OUT` for `wait`.
//!
//! Scripts depend on these numbers; they are listed in each binary's `--help` and in README
//! (the node's `REVOKED` and `SUPERSEDED` only in the node's).
//! A status means the same thing in every binary: 1 is never "failure" in one and "not found"
//! in another, and no number is used for two things.

/// Success, including a clean shutdown on SIGTERM or SIGINT.
pub const OK: u8 = 0;
/// Nothing to do, or what was asked for does not exist (a listing filter that matched nothing
/// is still 0; a command that was asked to change something and changed nothing is 1).
pub const NOTHING: u8 = 1;
/// Usage error, invalid input or invalid configuration (clap's own usage errors are 2 too).
pub const USAGE: u8 = 2;
/// A store was refused: damaged, newer than this binary, not initialised, or not readable.
pub const REFUSED: u8 = 3;
/// Any other failure: I/O, the network, a store write that failed, a refused credential.
pub const FAILURE: u8 = 4;
/// Refused for good: the hub revoked this node's certificate (or retired its host), so
/// running it again as it is cannot help. `baton-node` stops with it instead of retrying
/// forever; a supervisor should not restart it (systemd: `RestartPreventExitStatus=5`).
pub const REVOKED: u8 = 5;

/// Taken over: another `baton-node` process started with this node's data directory (a copy
/// of it, or the same directory twice) registered a newer session with the hub, which now
/// refuses this one. Nothing this process still held runs again here; a supervisor should not
/// restart it before an operator has looked (systemd: `RestartPreventExitStatus=6`).
pub const SUPERSEDED: u8 = 6;

/// `baton wait` (the producer CLI only): every delivery ended, and at least one did not
/// succeed (failed, cancelled or unknown).
pub const NOT_SUCCEEDED: u8 = 7;

/// `baton wait` (the producer CLI only): the timeout passed before every delivery ended.
pub const TIMED_OUT: u8 = 8;

/// The producer CLI only: the hub refused this caller, and asking again unchanged cannot help:
/// the certificate is not one it issued or was revoked (401), or the producer may not do this
/// (403: outside its publish scope, another producer's message, the wrong role). Apart from
/// `FAILURE`, which a wrapper may retry (the hub unreachable), so a retry loop on 4 ends.
pub const DENIED: u8 = 9;

/// `baton send --spool` and `baton spool flush` (the producer CLI only): the message (flush:
/// at least one message) is safe in the spool but not yet accepted: no hub answered, or it waits
/// behind a failed message of its conversation. A later send or flush delivers it.
pub const SPOOLED: u8 = 10;

/// `baton spool flush` (the producer CLI only): the spool holds messages the hub refused for
/// good, kept for inspection (`baton spool status`; `baton spool discard` or `retry`).
pub const SPOOL_FAILED: u8 = 11;

/// The text `baton-hub` prints under "Exit status" in `--help`: the statuses both binaries
/// share. The hub never exits `REVOKED` or `SUPERSEDED`, which are the node's alone.
pub const HELP: &str = "\
Exit status:
  0  ok (a clean shutdown on SIGTERM/SIGINT included)
  1  nothing to do, or not found
  2  usage error, invalid input or invalid configuration
  3  store refused (damaged, newer than this binary, not initialised, or not readable)
  4  any other failure";

/// The text `baton-node` prints under "Exit status" in `--help`: `HELP` and the node's own
/// `REVOKED` and `SUPERSEDED`.
pub const NODE_HELP: &str = "\
Exit status:
  0  ok (a clean shutdown on SIGTERM/SIGINT included)
  1  nothing to do, or not found
  2  usage error, invalid input or invalid configuration
  3  store refused (damaged, newer than this binary, not initialised, or not readable)
  4  any other failure
  5  refused for good: the hub revoked this node's certificate or retired its host
  6  taken over: a newer session of this node instance (a copied data directory) replaced it";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_distinct_and_documented() {
        let shared = [OK, NOTHING, USAGE, REFUSED, FAILURE];
        let node_only = [REVOKED, SUPERSEDED];
        let producer_cli = [NOT_SUCCEEDED, TIMED_OUT, DENIED, SPOOLED, SPOOL_FAILED];
        assert!(NODE_HELP.starts_with(HELP), "the node's list extends the hub's");
        for a in shared.into_iter().chain(node_only) {
            assert!(NODE_HELP.contains(&format!("  {a}  ")), "status {a} is not in NODE_HELP");
        }
        for a in shared {
            assert!(HELP.contains(&format!("  {a}  ")), "status {a} is not in HELP");
        }
        // The node's and the producer CLI's own statuses are not the hub's to print.
        for a in node_only.into_iter().chain(producer_cli) {
            assert!(!HELP.contains(&format!("  {a}  ")), "status {a} is in HELP");
        }
        for a in producer_cli {
            assert!(!NODE_HELP.contains(&format!("  {a}  ")), "status {a} is in NODE_HELP");
        }
        let all: Vec<u8> = shared.into_iter().chain(node_only).chain(producer_cli).collect();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
