//! The node's bounds, named once. Configurable ones appear here as their default and their
//! allowed range (read by the key table in `config`; whole numbers are `u64` there, and the
//! `NodeConfig` field narrows them); the rest are fixed and carry the reason they have the value
//! they have.

use std::time::Duration;

/// Default for `parallel_conversations`: conversations that may run a turn at the same time.
pub const PARALLEL_CONVERSATIONS_DEFAULT: u64 = 4;
/// Allowed range of `parallel_conversations`.
pub const PARALLEL_CONVERSATIONS_RANGE: (u64, u64) = (1, 256);

/// Most hub URLs `hub_url` may list. The node tries them one at a time and goes round the
/// whole list before it backs off, so a longer list only lengthens each round; a handful of
/// hubs over one record is what a deployment has.
pub const HUB_URLS_MAX: usize = 16;

/// Most connections the metrics listener keeps open at once; one more is closed at accept,
/// so held-open sockets cannot take the node's file descriptors.
pub const METRICS_CONNECTIONS_MAX: usize = 8;
/// Longest a metrics-listener client may take to send a request's headers (slowloris guard),
/// which is also the longest a kept-alive connection waits for its next request.
pub const METRICS_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Default for `exec_timeout`: how long one harness turn may run before its group is killed.
pub const EXEC_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10 * 60);
/// Allowed range of `exec_timeout`.
pub const EXEC_TIMEOUT_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(24 * 3600));

/// Default for `claim_wait`: how long one claim long-poll may wait for work.
pub const CLAIM_WAIT_DEFAULT: Duration = Duration::from_secs(30);
/// Allowed range of `claim_wait`.
pub const CLAIM_WAIT_RANGE: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(5 * 60));

/// Default for `claim_batch_max`: most deliveries asked for in one claim.
pub const CLAIM_BATCH_MAX_DEFAULT: u64 = 16;
/// Allowed range of `claim_batch_max`.
pub const CLAIM_BATCH_MAX_RANGE: (u64, u64) = (1, 1000);
/// Claim batches that may wait locally unstarted before the node stops claiming.
pub const QUEUE_AHEAD_BATCHES_DEFAULT: u64 = 4;
/// Allowed range of `queue_ahead_batches`.
pub const QUEUE_AHEAD_BATCHES_RANGE: (u64, u64) = (1, 1000);

/// Default for `store_bytes_max`: most bytes of pages in use the node store may hold before
/// the node stops claiming new work (it keeps running and reporting what it holds, and
/// `local_retention` frees room). A full disk would stop the reports too.
pub const STORE_BYTES_MAX_DEFAULT: u64 = 16 * 1024 * 1024 * 1024;
/// Allowed range of `store_bytes_max`: the hub's.
pub const STORE_BYTES_MAX_RANGE: (u64, u64) = baton_shared::limits::STORE_BYTES_MAX_RANGE;
/// How often the claim loop reads the store's size for `store_bytes_max` (one cheap read,
/// not one per claim), and how long it waits before looking again while over it.
pub const STORE_SIZE_CHECK_PACE: std::time::Duration = std::time::Duration::from_secs(2);
const _: () = assert!(STORE_BYTES_MAX_RANGE.0 <= STORE_BYTES_MAX_DEFAULT);
const _: () = assert!(STORE_BYTES_MAX_DEFAULT <= STORE_BYTES_MAX_RANGE.1);

/// Default for `result_bytes_max`: most stdout bytes kept as an attempt's result.
pub const RESULT_BYTES_MAX_DEFAULT: u64 = baton_shared::limits::RESULT_BYTES_MAX_DEFAULT;
/// Allowed range of `result_bytes_max`.
pub const RESULT_BYTES_MAX_RANGE: (u64, u64) = (1, 16 * 1024 * 1024);

/// Default for `stderr_tail_bytes`: most bytes of the end of a harness's stderr sent with its
/// attempt's report, enough for the last few dozen lines of an error.
pub const STDERR_TAIL_BYTES_DEFAULT: u64 = 4 * 1024;
/// Allowed range of `stderr_tail_bytes` (0 sends none): at most what a hub keeps at its default
/// `limits.stderr_tail_bytes_max`.
pub const STDERR_TAIL_BYTES_RANGE: (u64, u64) = (0, baton_shared::limits::STDERR_TAIL_BYTES_MAX_DEFAULT);
const _: () = assert!(STDERR_TAIL_BYTES_DEFAULT <= STDERR_TAIL_BYTES_RANGE.1);

/// Default for `shutdown_grace`: how long running turns may finish after SIGTERM.
pub const SHUTDOWN_GRACE_DEFAULT: Duration = Duration::from_secs(10);
/// Allowed range of `shutdown_grace`.
pub const SHUTDOWN_GRACE_RANGE: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(3600));

/// Default for `kill_grace`: how long a harness group sent SIGTERM (timeout, shutdown, or what a
/// crashed node left behind) may take to end before it gets SIGKILL.
pub const KILL_GRACE_DEFAULT: Duration = Duration::from_secs(10);
/// Allowed range of `kill_grace` (zero sends SIGKILL right after SIGTERM).
pub const KILL_GRACE_RANGE: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(10 * 60));

/// Default for `cancel_grace`: how long a running turn that was cancelled (by an operator or the
/// producer) may take to end after SIGTERM to its process group before it gets SIGKILL.
pub const CANCEL_GRACE_DEFAULT: Duration = Duration::from_secs(10);
/// Allowed range of `cancel_grace` (zero sends SIGKILL right after SIGTERM).
pub const CANCEL_GRACE_RANGE: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(10 * 60));

/// Default for `local_retention`: how long the node keeps the rows of a turn whose report the hub
/// confirmed (or of a delivery the hub took back before it ran).
pub const LOCAL_RETENTION_DEFAULT: Duration = Duration::from_secs(7 * 24 * 3600);
/// Allowed range of `local_retention`: an hour to a year (365.25 days, which `--help` shows as
/// `1year`).
pub const LOCAL_RETENTION_RANGE: (Duration, Duration) = (Duration::from_secs(3600), Duration::from_secs(31_557_600));
/// How often the node removes rows older than `local_retention` (also once at every start).
pub const RETENTION_SWEEP_PACE: Duration = Duration::from_secs(10 * 60);
/// Most deliveries removed in one store transaction, so a large sweep never holds the store
/// for long; the sweep takes batches until none is left.
pub const RETENTION_BATCH_MAX: u32 = 500;

/// Default for `backoff_max`: the longest pause between retries of a request the hub refused
/// for a passing reason (overload, 5xx); a hub that does not answer at all is retried within
/// `RECONNECT_PAUSE_MAX`.
pub const BACKOFF_MAX_DEFAULT: Duration = Duration::from_secs(30);
/// Allowed range of `backoff_max`.
pub const BACKOFF_MAX_RANGE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(3600));

/// Longest pause between tries to reach a hub that does not answer at all (connection refused,
/// reset or timed out), whatever `backoff_max` says: a restarted hub is regained within about
/// this long after it listens again. Each pause is drawn from zero to this ceiling (full
/// jitter), so 50 nodes reach a restarted hub spread over a second, about 50 connection tries
/// a second in all while it is down. Refusals the hub sends still back off to `backoff_max`.
pub const RECONNECT_PAUSE_MAX: Duration = Duration::from_secs(1);

/// First retry pause after a failure; doubled on each further failure up to `backoff_max`.
pub const BACKOFF_BASE: Duration = Duration::from_millis(100);

/// How long, after the harness exits, its stdout/stderr may stay open (held by a process it
/// left behind) before the node kills its process group to stop waiting.
pub const PIPE_DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);
/// How often a harness process group being stopped (SIGTERM sent, `kill_grace` running) is
/// looked at again: often enough that a group that ends is noticed at once, rarely enough that
/// reading `/proc` costs nothing.
pub const GROUP_POLL_PACE: Duration = Duration::from_millis(50);
/// How long, after SIGKILL to what a crashed node left behind, the next start waits for the
/// kernel to take the group down before it goes on (a process in uninterruptible sleep dies
/// only when its I/O returns; it has no effects left either way).
pub const KILLED_GROUP_WAIT: Duration = Duration::from_secs(5);
/// Most bytes of one attempt's stderr copied to the node's log; the rest is drained and counted.
pub const STDERR_LOG_BYTES_MAX: usize = 64 * 1024;

/// How long, at a clean shutdown, the node waits for the hub to record that its session ended.
pub const SESSION_END_WAIT: Duration = Duration::from_secs(5);

/// How long, at shutdown, the node keeps trying to deliver queued reports before it exits.
pub const SHUTDOWN_REPORT_FLUSH: Duration = Duration::from_secs(5);
/// Most outbox entries sent in one pass; the next pass takes the rest.
pub const OUTBOX_BATCH_MAX: u32 = 64;

const _: () = assert!(PARALLEL_CONVERSATIONS_RANGE.1 <= u32::MAX as u64);
const _: () = assert!(CLAIM_BATCH_MAX_RANGE.1 <= u32::MAX as u64);
const _: () = assert!(QUEUE_AHEAD_BATCHES_RANGE.1 <= u32::MAX as u64);
const _: () = assert!(CLAIM_BATCH_MAX_DEFAULT <= CLAIM_BATCH_MAX_RANGE.1);
const _: () = assert!(RESULT_BYTES_MAX_DEFAULT <= RESULT_BYTES_MAX_RANGE.1);
const _: () = assert!(BACKOFF_BASE.as_millis() <= BACKOFF_MAX_RANGE.0.as_millis());
const _: () = assert!(BACKOFF_BASE.as_millis() <= RECONNECT_PAUSE_MAX.as_millis());

/// Default for `handoffs_in_flight`: claim batches whose mirror and handoff may run while the
/// next claim waits at the hub, so work that arrives during a handoff is claimed at once rather
/// than after it. Their deliveries count toward `queue_ahead_batches` until they are handed
/// off, so that key still bounds what the node holds unstarted. Each delivery's own steps stay
/// in order (mirror commit, `mirrored`, ack, gate); turns of one conversation still start in
/// sequence order whichever batch's ack lands first, since only a conversation's lowest queued
/// turn may start.
pub const HANDOFFS_IN_FLIGHT_DEFAULT: u64 = 2;
/// Allowed range of `handoffs_in_flight`.
pub const HANDOFFS_IN_FLIGHT_RANGE: (u64, u64) = (1, 16);

/// Default for `checkpoint_interval`: how often the store's write-ahead log is copied into the
/// file on a thread of its own (`sqlite::Checkpointer`).
pub const CHECKPOINT_INTERVAL_DEFAULT: Duration = baton_shared::sqlite::CHECKPOINT_INTERVAL;
/// Allowed range of `checkpoint_interval`.
pub const CHECKPOINT_INTERVAL_RANGE: (Duration, Duration) =
    (baton_shared::sqlite::CHECKPOINT_INTERVAL_MIN, baton_shared::sqlite::CHECKPOINT_INTERVAL_MAX);

/// The share of a start lease the node counts on: it measures the lease from when it sent the
/// request that renewed it (before the hub recorded it), and keeps this much of it, so its own
/// end of the lease comes before the hub's even with the hub's clock running a little slow.
pub const START_LEASE_USED_PERCENT_MAX: u32 = 90;
/// The node renews its start lease (an empty `POST /v1/starts`) while it has acked turns waiting
/// to start and less than this share of the lease is left.
pub const START_LEASE_RENEW_PERCENT_MARGIN: u32 = 50;
const _: () =
    assert!(START_LEASE_RENEW_PERCENT_MARGIN < START_LEASE_USED_PERCENT_MAX && START_LEASE_USED_PERCENT_MAX <= 100);

/// Default for `renew_interval`: how often, at least, the node tells the hub which turns run.
/// Well below the hub's default `host_silence_warn` (5 min), so a live node is never shown silent.
pub const RENEW_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);
/// Allowed range of `renew_interval`.
pub const RENEW_INTERVAL_RANGE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(600));
/// Default for `progress_flush_interval`: how long progress events gather before they go.
pub const PROGRESS_FLUSH_INTERVAL_DEFAULT: Duration = Duration::from_millis(200);
/// Allowed range of `progress_flush_interval`.
pub const PROGRESS_FLUSH_INTERVAL_RANGE: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(60));
/// Default for `progress_events_per_second_max`: a harness reporting each step of a fast loop is
/// thinned to this many events a second per run.
pub const PROGRESS_EVENTS_PER_SECOND_MAX_DEFAULT: u64 = 50;
/// Allowed range of `progress_events_per_second_max`.
pub const PROGRESS_EVENTS_PER_SECOND_MAX_RANGE: (u64, u64) = (1, 100_000);
/// Default for `progress_buffer_events_max`: events waiting in memory, the whole node. With
/// events at the default `progress_event_bytes_max` it is at most 40 MiB.
pub const PROGRESS_BUFFER_EVENTS_MAX_DEFAULT: u64 = 10_000;
/// Allowed range of `progress_buffer_events_max`.
pub const PROGRESS_BUFFER_EVENTS_MAX_RANGE: (u64, u64) = (1, 1_000_000);
const _: () = assert!(PROGRESS_FLUSH_INTERVAL_DEFAULT.as_millis() < RENEW_INTERVAL_DEFAULT.as_millis());
