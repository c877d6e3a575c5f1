//! The client's bounds, named once. Time limits are `Duration`s.

use baton_shared::limits::{CLIENT_TIMEOUT_MARGIN, LONG_POLL_WAIT_MAX_DEFAULT};
use std::time::Duration;

/// Longest a connection to the hub may take to establish: a dead hub is noticed quickly.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a request that does not wait (submit, cancel, a node step) may take in total.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait the client asks the hub for in one long-poll (a message read or a claim). The
/// hub caps it by its own `long_poll_wait_max` anyway; asking for more only lengthens the
/// request timeout for nothing.
pub const LONG_POLL_WAIT_MAX: Duration = LONG_POLL_WAIT_MAX_DEFAULT;
/// Longest wait a node asks the hub for in one claim long-poll: the top of the range of the
/// hub's `long_poll_wait_max`, so a node whose `claim_wait` matches a hub configured that high
/// waits as long as both allow (the hub caps a longer wait by its own setting).
pub const CLAIM_WAIT_MAX: Duration = Duration::from_secs(5 * 60);
/// How many times an idempotent call (submit, report) is sent at most, the first try included.
pub const RETRY_ATTEMPTS_MAX: u32 = 5;
/// The pause before the first retry; each later one doubles it (equal jitter), up to
/// `RETRY_BACKOFF_MAX`.
pub const RETRY_BACKOFF_BASE: Duration = Duration::from_millis(200);
/// The longest pause between two tries of an idempotent call.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Messages a producer's spool holds at most by default (`baton send --spool-messages-max`,
/// `BATON_SPOOL_MESSAGES_MAX`): a send past it is refused, nothing spooled.
pub const SPOOL_MESSAGES_MAX_DEFAULT: u64 = 10_000;
/// Bytes of spooled requests a producer's spool holds at most by default (`--spool-bytes-max`,
/// `BATON_SPOOL_BYTES_MAX`): 256 MiB, a few thousand of the largest payloads.
pub const SPOOL_BYTES_MAX_DEFAULT: u64 = 256 * 1024 * 1024;
/// The longest pause between two tries of a spooled message while no hub answers: a restarted
/// hub is found again within it.
pub const SPOOL_RETRY_PAUSE_MAX: Duration = Duration::from_secs(2);
// The largest payload `baton` reads fits in an empty spool with room to spare.
const _: () = assert!(baton_shared::limits::PAYLOAD_FILE_BYTES_MAX * 4 <= SPOOL_BYTES_MAX_DEFAULT);

/// The request timeout of a long-poll of `wait`: the wait plus the margin the hub needs to
/// answer after it.
pub fn long_poll_timeout(wait: Duration) -> Duration {
    wait.min(LONG_POLL_WAIT_MAX) + CLIENT_TIMEOUT_MARGIN
}

/// The request timeout of a claim of `wait`: the wait plus the margin the hub needs to answer
/// after it.
pub fn claim_timeout(wait: Duration) -> Duration {
    wait.min(CLAIM_WAIT_MAX) + CLIENT_TIMEOUT_MARGIN
}

const _: () = assert!(RETRY_ATTEMPTS_MAX >= 1);
const _: () = assert!(RETRY_BACKOFF_BASE.as_millis() <= RETRY_BACKOFF_MAX.as_millis());
// A retried call's worst case (every pause at its cap) stays within a few request timeouts.
const _: () = assert!(RETRY_BACKOFF_MAX.as_secs() * (RETRY_ATTEMPTS_MAX as u64) < 4 * REQUEST_TIMEOUT.as_secs());
// A long poll never waits longer than a request that does not wait may take in total.
const _: () = assert!(LONG_POLL_WAIT_MAX.as_secs() <= REQUEST_TIMEOUT.as_secs());
// A claim may wait at least as long as a message read.
const _: () = assert!(LONG_POLL_WAIT_MAX.as_secs() <= CLAIM_WAIT_MAX.as_secs());
