//! Bounds shared by the hub and the node. Those named `…_DEFAULT` are configurable (these are
//! the values used when the configuration does not say otherwise); the others are fixed, so
//! that both sides agree on them without configuration.

use std::time::Duration;

/// Largest payload (serialised JSON) a message may carry.
pub const PAYLOAD_BYTES_MAX_DEFAULT: u64 = 256 * 1024;
/// Largest result body a report may carry.
pub const RESULT_BYTES_MAX_DEFAULT: u64 = 64 * 1024;
/// Most bytes of a harness's stderr tail the hub keeps with an attempt (its
/// `limits.stderr_tail_bytes_max`): a longer tail is cut to its last bytes, never refused, so a
/// report's outcome is never lost to its diagnostics. Also the top of the node's
/// `stderr_tail_bytes`, so a hub at its default keeps every node's tail whole.
pub const STDERR_TAIL_BYTES_MAX_DEFAULT: u64 = 64 * 1024;
/// Allowed range of the hub's `limits.stderr_tail_bytes_max` (0 keeps none of it, only its
/// size).
pub const STDERR_TAIL_BYTES_MAX_RANGE: (u64, u64) = (0, 1024 * 1024);
/// Largest number of deliveries one claim returns.
pub const CLAIM_BATCH_MAX_DEFAULT: u32 = 64;
/// Longest a claim or a message read may wait for news.
pub const LONG_POLL_WAIT_MAX_DEFAULT: Duration = Duration::from_secs(30);
/// How long a pool conversation's last host is preferred once nothing of it is in flight (the
/// hub's `limits.pool_affinity_wait`): its next turn usually comes within seconds of the last
/// one's outcome, and the host that ran the last turn has the conversation's files warm and is
/// polling already, so it takes the turn at once; two seconds is short enough that a host that
/// went away delays the conversation little before another member takes it.
pub const POOL_AFFINITY_WAIT: Duration = Duration::from_secs(2);
/// Longest `limits.pool_affinity_wait` the hub accepts.
pub const POOL_AFFINITY_WAIT_MAX: Duration = Duration::from_secs(300);
/// Most deliveries one page of `GET /v1/holdings` carries (the hub's
/// `limits.holdings_page_max`): each carries its payload, so a node holding thousands reads
/// them in pages of bounded size instead of one answer of any size.
pub const HOLDINGS_PAGE_MAX_DEFAULT: u32 = 64;
/// Allowed range of `limits.holdings_page_max`.
pub const HOLDINGS_PAGE_MAX_RANGE: (u32, u32) = (1, 1000);
/// Most messages one page of a producer's listing (`GET /v1/messages?conversation=C`) carries
/// (the hub's `limits.message_page_max`): each carries its payload, so a page is bounded in
/// messages as well as in bytes (`limits.message_view_bytes_max`). A larger `limit` is capped.
pub const MESSAGE_PAGE_MAX_DEFAULT: u32 = 100;
/// Allowed range of `limits.message_page_max`.
pub const MESSAGE_PAGE_MAX_RANGE: (u32, u32) = (1, 1000);
/// Most of a conversation's `seq` numbers one page of a producer's listing looks through: the
/// listing reads the conversation in `seq` order and keeps the producer's own messages, so a
/// stretch of other producers' messages costs a page at most this much reading; the page then
/// ends early, its cursor past the stretch (`more` says to go on).
pub const MESSAGE_PAGE_SCAN_SEQS_MAX: i64 = 10_000;
// A page's stretch holds at least a whole page of the producer's own messages.
const _: () = assert!(MESSAGE_PAGE_SCAN_SEQS_MAX >= MESSAGE_PAGE_MAX_RANGE.1 as i64);
/// Largest answer (bytes of JSON) of a message read (`GET /v1/messages/{id}`, and by
/// idempotency key): the hub's `limits.message_view_bytes_max`. A message's deliveries carry
/// their attempts, and each attempt its result, so without a bound one answer could be
/// `recipients_max × max_attempts × result_bytes_max`. Past it the view leaves out whole
/// deliveries' attempts and says which (`omitted`); each is read by its own request.
pub const MESSAGE_VIEW_BYTES_MAX_DEFAULT: u64 = 4 * 1024 * 1024;
/// Allowed range of `limits.message_view_bytes_max`.
pub const MESSAGE_VIEW_BYTES_MAX_RANGE: (u64, u64) = (4 * 1024, 1024 * 1024 * 1024);
/// Most bytes the hub's store may hold (`limits.store_bytes_max`): past it submissions get
/// 507 `store_full`, while claims, reports and reads go on, so the work already accepted
/// drains and retention can free room. The disk filling up would stop everything at once.
pub const STORE_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024 * 1024;
/// Allowed range of the hub's `limits.store_bytes_max` and the node's `store_bytes_max`.
pub const STORE_BYTES_MAX_RANGE: (u64, u64) = (64 * 1024, 1 << 50);
/// Most recipients one message may name.
pub const RECIPIENTS_MAX_DEFAULT: u32 = 64;
/// Most deliveries waiting (queued or held) for one host before accepts are refused with 429.
pub const QUEUED_PER_HOST_MAX_DEFAULT: u64 = 1_000_000;
/// Most deliveries queued for one pool before accepts addressed to it are refused with 429 (the
/// hub's `limits.queued_per_pool_max`): as a host's bound, for the work any member may take.
pub const QUEUED_PER_POOL_MAX_DEFAULT: u64 = 1_000_000;
/// How long idempotency keys (and the messages behind them) are kept.
pub const RETENTION_DEFAULT: Duration = Duration::from_secs(7 * 24 * 3600);
/// Largest request body the hub reads; bigger bodies get 413 before they are buffered.
pub const REQUEST_BODY_BYTES_MAX_DEFAULT: u64 = 1024 * 1024;
/// Deepest nesting of objects and arrays a payload may have. Answers embed the payload a few
/// levels down (`deliveries[].payload`), and common JSON parsers stop at 128 levels
/// (`serde_json`'s default), so 64 leaves every answer readable by them.
pub const PAYLOAD_DEPTH_MAX: usize = 64;
/// How often a host's bound node instance may change: at most this many binding changes within
/// `INSTANCE_REBIND_WINDOW`; beyond it a claim or session naming yet another instance is 429
/// `over_capacity`. Each change is one `bind_instance` operator event, so a node presenting a
/// new instance id on every request cannot grow the operator log without bound.
pub const INSTANCE_REBINDS_PER_WINDOW_MAX: i64 = 10;
/// The sliding window `INSTANCE_REBINDS_PER_WINDOW_MAX` counts over.
pub const INSTANCE_REBIND_WINDOW: Duration = Duration::from_secs(600);
/// Longest reason text an operator or a node may attach.
pub const REASON_CHARS_MAX: usize = 1024;

/// Most items one batch request may carry (`POST /v1/batch/...`: messages, deliveries or
/// reports). A batch is one writer job, so this bounds how long one request holds the writer;
/// a batch over it is refused whole with 400 `invalid_field` naming the list. Fixed, so a node
/// or producer splits its batches without asking the hub.
pub const BATCH_ITEMS_MAX: usize = 256;
/// Largest body (bytes of JSON) one batch request may have; a bigger batch is refused whole
/// with 413 `too_large` before any item is applied. It bounds the memory one batch and its
/// answer take, and (with `BATCH_ITEMS_MAX`) the work of one writer job. A hub whose
/// `limits.request_body_bytes_max` is set lower refuses bodies over that first.
pub const BATCH_BYTES_MAX: u64 = 1024 * 1024;

/// Allowed range of the hub's `limits.payload_bytes_max`: no hub accepts a payload larger than
/// its top.
pub const PAYLOAD_BYTES_MAX_RANGE: (u64, u64) = (1, 16 * 1024 * 1024);

/// Largest configuration file read (`hub.toml`, the node's file, `baton.toml`): a few dozen
/// keys take a few kilobytes, so a file over it is not a configuration file (`/dev/zero`, a
/// log named by mistake) and is refused, naming the file, after reading this much.
pub const CONFIG_FILE_BYTES_MAX: u64 = 1024 * 1024;
/// Largest PEM file read: a CA file (every CA trusted, two during a rotation), a certificate
/// (with its chain) or a private key, of the hub, a node or a producer, and a PostgreSQL
/// `sslrootcert`. One certificate is a few kilobytes, so even a bundle of every public root CA
/// fits many times over.
pub const PEM_FILE_BYTES_MAX: u64 = 1024 * 1024;
/// Largest payload read from a file or standard input (`baton send`, `baton-hub send
/// --payload-file`): twice the largest payload any hub accepts (`PAYLOAD_BYTES_MAX_RANGE`), so
/// the text of every payload a hub may take, with whitespace around it, is read whole and the
/// hub's own bound decides.
pub const PAYLOAD_FILE_BYTES_MAX: u64 = 2 * PAYLOAD_BYTES_MAX_RANGE.1;

/// How much longer than the longest long-poll a client waits for an answer.
pub const CLIENT_TIMEOUT_MARGIN: Duration = Duration::from_secs(15);

const _: () = assert!(PAYLOAD_BYTES_MAX_DEFAULT < REQUEST_BODY_BYTES_MAX_DEFAULT);
const _: () = assert!(RESULT_BYTES_MAX_DEFAULT < REQUEST_BODY_BYTES_MAX_DEFAULT);
// Any message the hub accepts alone fits in a batch, and one claim's deliveries fit in one
// batch of `mirrored`, `ack` or reports.
const _: () = assert!(PAYLOAD_BYTES_MAX_DEFAULT < BATCH_BYTES_MAX);
const _: () = assert!(RESULT_BYTES_MAX_DEFAULT < BATCH_BYTES_MAX);
const _: () = assert!(RESULT_BYTES_MAX_DEFAULT + STDERR_TAIL_BYTES_MAX_DEFAULT < BATCH_BYTES_MAX);
const _: () = assert!(STDERR_TAIL_BYTES_MAX_DEFAULT <= STDERR_TAIL_BYTES_MAX_RANGE.1);
const _: () = assert!(BATCH_BYTES_MAX <= REQUEST_BODY_BYTES_MAX_DEFAULT);
const _: () = assert!(CLAIM_BATCH_MAX_DEFAULT as usize <= BATCH_ITEMS_MAX);
const _: () = assert!(HOLDINGS_PAGE_MAX_RANGE.0 <= HOLDINGS_PAGE_MAX_DEFAULT);
const _: () = assert!(STORE_BYTES_MAX_RANGE.0 <= STORE_BYTES_MAX_DEFAULT);
const _: () = assert!(STORE_BYTES_MAX_DEFAULT <= STORE_BYTES_MAX_RANGE.1);
// With the defaults, a message's payload always fits in its view with room for attempts.
const _: () = assert!(PAYLOAD_BYTES_MAX_DEFAULT < MESSAGE_VIEW_BYTES_MAX_DEFAULT);
const _: () = assert!(MESSAGE_VIEW_BYTES_MAX_RANGE.0 <= MESSAGE_VIEW_BYTES_MAX_DEFAULT);
const _: () = assert!(MESSAGE_VIEW_BYTES_MAX_DEFAULT <= MESSAGE_VIEW_BYTES_MAX_RANGE.1);
const _: () = assert!(HOLDINGS_PAGE_MAX_DEFAULT <= HOLDINGS_PAGE_MAX_RANGE.1);
const _: () = assert!(PAYLOAD_BYTES_MAX_RANGE.0 <= PAYLOAD_BYTES_MAX_DEFAULT);
const _: () = assert!(PAYLOAD_BYTES_MAX_DEFAULT <= PAYLOAD_BYTES_MAX_RANGE.1);
const _: () = assert!(PAYLOAD_BYTES_MAX_RANGE.1 <= PAYLOAD_FILE_BYTES_MAX);

/// Most progress events one `POST /v1/running` carries, all turns together; the node also stops
/// adding events before the body would pass `BATCH_BYTES_MAX`, and sends the rest in its next
/// request. It bounds the work of the one writer job a request is.
pub const PROGRESS_EVENTS_PER_REQUEST_MAX: usize = 1_000;
/// Largest progress event (bytes of its JSON line) the hub keeps by default
/// (`limits.progress_event_bytes_max`; the node's own bound is `progress_event_bytes_max`).
pub const PROGRESS_EVENT_BYTES_MAX_DEFAULT: u64 = 4 * 1024;
/// Allowed range of the hub's and the node's `progress_event_bytes_max`.
pub const PROGRESS_EVENT_BYTES_MAX_RANGE: (u64, u64) = (16, 64 * 1024);
/// Most progress events of one run the hub keeps by default (`limits.progress_events_per_turn_max`;
/// 0 keeps none).
pub const PROGRESS_EVENTS_PER_TURN_MAX_DEFAULT: u64 = 10_000;
/// Allowed range of the hub's and the node's `progress_events_per_turn_max`.
pub const PROGRESS_EVENTS_PER_TURN_MAX_RANGE: (u64, u64) = (0, 1_000_000);
/// Most items one events feed answer carries by default (`limits.feed_page_max`), also the
/// default of a request's `limit`.
pub const FEED_PAGE_MAX_DEFAULT: u32 = 500;
/// Allowed range of `limits.feed_page_max` and of a feed request's `limit`.
pub const FEED_PAGE_MAX_RANGE: (u32, u32) = (1, 10_000);
/// Most bytes of JSON one events feed answer carries by default (`limits.feed_page_bytes_max`):
/// the items stop before the one that would pass it (one item always goes).
pub const FEED_PAGE_BYTES_MAX_DEFAULT: u64 = 1024 * 1024;
/// Allowed range of `limits.feed_page_bytes_max`.
pub const FEED_PAGE_BYTES_MAX_RANGE: (u64, u64) = (16 * 1024, 64 * 1024 * 1024);

const _: () = assert!(PROGRESS_EVENT_BYTES_MAX_RANGE.0 <= PROGRESS_EVENT_BYTES_MAX_DEFAULT);
const _: () = assert!(PROGRESS_EVENT_BYTES_MAX_DEFAULT <= PROGRESS_EVENT_BYTES_MAX_RANGE.1);
// The largest event fits in a request, and in a feed answer at the bound's bottom.
const _: () = assert!(PROGRESS_EVENT_BYTES_MAX_RANGE.1 < BATCH_BYTES_MAX);
const _: () = assert!(PROGRESS_EVENT_BYTES_MAX_RANGE.1 < FEED_PAGE_BYTES_MAX_RANGE.0 * 8);
const _: () = assert!(PROGRESS_EVENTS_PER_TURN_MAX_DEFAULT <= PROGRESS_EVENTS_PER_TURN_MAX_RANGE.1);
const _: () = assert!(FEED_PAGE_MAX_RANGE.0 <= FEED_PAGE_MAX_DEFAULT && FEED_PAGE_MAX_DEFAULT <= FEED_PAGE_MAX_RANGE.1);
const _: () = assert!(
    FEED_PAGE_BYTES_MAX_RANGE.0 <= FEED_PAGE_BYTES_MAX_DEFAULT
        && FEED_PAGE_BYTES_MAX_DEFAULT <= FEED_PAGE_BYTES_MAX_RANGE.1
);
