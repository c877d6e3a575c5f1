//! The configuration keys, each declared once with its names in every layer, its doc, its
//! default and its allowed range; the `hub.toml` template is generated from them.
//!
//! Why one file over 700 lines: it is a table, one declaration a key in the template's order,
//! read top to bottom like the `hub.toml` it generates; no key's code is here, only its name,
//! range and doc. Were it to split, the `[limits]` keys would go to a file of their own.

pub use crate::store::lifecycle::report::{RETRY_BACKOFF_DEFAULT, RETRY_BACKOFF_MAX_DEFAULT};
use baton_shared::limits::*;
use std::time::Duration;

/// Most operator-listener connections open at once (see `ops_listener`), so a flood on that
/// port cannot take the hub's file descriptors from nodes and producers: the upper bound of
/// `operator_connections_per_peer_max`, and a share of the files `fds` reserves.
pub const OPERATOR_CONNECTIONS_MAX: usize = 64;

/// The listen address used when no layer names one.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:7443";
/// How long a TLS handshake may take before the connection is dropped (slowloris guard).
pub const HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Most connections open at once, handshaking ones included; more are closed at accept.
pub const CONNECTIONS_MAX_DEFAULT: u64 = 1024;
/// Most connections open at once from one client certificate; more are closed after the
/// handshake, so one identity cannot take every slot.
pub const CONNECTIONS_PER_CERT_MAX_DEFAULT: u64 = 32;
/// How long a client may take to send a request's headers (HTTP/1), from the first byte it may
/// send (after the handshake, or after the previous answer on a kept-alive connection).
pub const HEADER_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// How long a client may take to send a whole request body, once its headers are read.
pub const REQUEST_BODY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// How long a connection may stay open with no request in progress.
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// Most requests one connection may carry before the hub closes it (after answering).
pub const REQUESTS_PER_CONNECTION_MAX_DEFAULT: u64 = 10_000;

// The header timeout is also the wait for the next request on an HTTP/1 connection, so it must
// not outlast the idle timeout it would otherwise override. A request in progress (a long poll
// waiting up to `limits.long_poll_wait_max`) is under neither: both count only while the hub
// waits for the client.
const _: () = assert!(HEADER_READ_TIMEOUT_DEFAULT.as_millis() <= IDLE_TIMEOUT_DEFAULT.as_millis());
const _: () = assert!(CONNECTIONS_PER_CERT_MAX_DEFAULT < CONNECTIONS_MAX_DEFAULT);
const _: () = assert!(HANDSHAKE_TIMEOUT_DEFAULT.as_millis() <= IDLE_TIMEOUT_DEFAULT.as_millis());

/// Most runs a message may ask for (`max_attempts` of a submission).
pub const MAX_ATTEMPTS_MAX_DEFAULT: u64 = 10;
/// Most deliveries one `redrive` transaction re-runs (it goes on in further batches).
pub const REDRIVE_BATCH_MAX_DEFAULT: u64 = 500;

/// How long a node with an open session may be silent before `status` flags it: a few long
/// polls' worth, so an idle node that keeps polling is never flagged.
pub const HOST_SILENCE_WARN_DEFAULT: Duration = Duration::from_secs(300);
const _: () = assert!(HOST_SILENCE_WARN_DEFAULT.as_millis() > 2 * LONG_POLL_WAIT_MAX_DEFAULT.as_millis());
/// Default of `limits.deadline_max` and `limits.stall_max`: a day, longer than any turn of an
/// agent a producer should wait for, short enough that a forgotten turn ends the same day.
pub const DEADLINE_MAX_DEFAULT: Duration = Duration::from_secs(24 * 3600);
/// Default of `limits.stall_max` (see `DEADLINE_MAX_DEFAULT`).
pub const STALL_MAX_DEFAULT: Duration = Duration::from_secs(24 * 3600);
/// How long a node session may go on starting the turns it acked on its own, while it cannot
/// reach the hub, after the hub last granted it a lease (its session registration, each `POST
/// /v1/starts`): long enough to ride out a hub restart, short enough that the copy of a cut-off
/// node's data directory waits no longer than this before it may start what the original acked.
pub const START_LEASE_DEFAULT: Duration = Duration::from_secs(15);
/// How long the operators' audit log (`operator_events`) is kept: a year, so last quarter's
/// "who fenced this and why" is still there, while the table cannot grow without bound.
pub const AUDIT_RETENTION_DEFAULT: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long shutdown waits for open requests.
pub const SHUTDOWN_GRACE_DEFAULT: Duration = Duration::from_secs(10);
/// The prefix of every key's environment variable.
pub const ENV_PREFIX: &str = "BATON_HUB_";
const MIB: u64 = 1024 * 1024;

/// Where a key lives and how it is named in each layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyName {
    /// Its table in the file (`[limits]`), if not at the top level.
    pub section: Option<&'static str>,
    /// Its name in the file.
    pub name: &'static str,
    /// Its `serve` flag, without the dashes: the name with `-` for `_`.
    pub flag: &'static str,
    /// Its environment variable: `BATON_HUB_` and the name in capitals.
    pub env: &'static str,
}

impl KeyName {
    /// The name messages use: `limits.claim_batch_max`, `listen`.
    pub fn field(&self) -> String {
        match self.section {
            Some(s) => format!("{s}.{}", self.name),
            None => self.name.to_string(),
        }
    }
}

/// What values a key takes, with its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// A whole number in `min..=max` (bytes or a count).
    Int {
        /// The default.
        default: u64,
        /// The smallest allowed.
        min: u64,
        /// The largest allowed.
        max: u64,
    },
    /// A duration written like `"30s"`, in `min..=max`.
    Duration {
        /// The default.
        default: Duration,
        /// The shortest allowed.
        min: Duration,
        /// The longest allowed.
        max: Duration,
    },
    /// `ADDR:PORT`.
    Addr {
        /// The default.
        default: &'static str,
    },
    /// `ADDR:PORT`, or `off` for a listener that is not started.
    AddrOrOff {
        /// The default.
        default: &'static str,
    },
    /// A `postgres://` URL naming the database that holds the record, or empty (the default)
    /// for the SQLite file in the data directory. It may carry a password, so it is never
    /// printed whole (see `crate::store::engine::postgres::PgUrl::shown`).
    DatabaseUrl,
    /// An OTLP/HTTP receiver's `http://` or `https://` URL (`baton_telemetry::OtlpEndpoint`),
    /// or empty (the default): no spans are made or exported.
    OtlpEndpoint,
    /// Host names, comma-separated (`"status.example.net,hub-1"`), or empty (the default:
    /// none). In the file also a TOML array of strings.
    Names,
    /// One word of a fixed set.
    Choice {
        /// The default.
        default: &'static str,
        /// The allowed words.
        allowed: &'static [&'static str],
    },
}

/// One configuration key, declared once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// Its names.
    pub name: KeyName,
    /// Its values and default.
    pub kind: KeyKind,
    /// What it sets, for people (the template and `--help`).
    pub doc: &'static str,
}

macro_rules! key_name {
    ($section:expr, $name:literal, $flag:literal, $env:literal) => {
        KeyName { section: $section, name: $name, flag: $flag, env: $env }
    };
}

/// `listen`.
pub const LISTEN: Key = Key {
    name: key_name!(None, "listen", "listen", "BATON_HUB_LISTEN"),
    kind: KeyKind::Addr { default: LISTEN_DEFAULT },
    doc: "ADDR:PORT to listen on; port 0 picks a free port (printed, and written to DIR/hub.addr)",
};
/// `synchronous`.
pub const SYNCHRONOUS: Key = Key {
    name: key_name!(None, "synchronous", "synchronous", "BATON_HUB_SYNCHRONOUS"),
    kind: KeyKind::Choice { default: "full", allowed: &["full", "normal"] },
    doc: "\"full\": every answer is on stable storage; \"normal\" is faster and may lose answered \
          changes on power failure (warned about). SQLite only: PostgreSQL's durability is its server's \
          (synchronous_commit)",
};
/// `checkpoint_interval`.
pub const CHECKPOINT_INTERVAL: Key = Key {
    name: key_name!(None, "checkpoint_interval", "checkpoint-interval", "BATON_HUB_CHECKPOINT_INTERVAL"),
    kind: KeyKind::Duration {
        default: baton_shared::sqlite::CHECKPOINT_INTERVAL,
        min: baton_shared::sqlite::CHECKPOINT_INTERVAL_MIN,
        max: baton_shared::sqlite::CHECKPOINT_INTERVAL_MAX,
    },
    doc: "how often the SQLite file's write-ahead log is copied into the file, on a thread of its own (the \
          writer does it itself only past 10,000 pages of log); with synchronous set to \"normal\" it is also the \
          most a power failure can lose. SQLite only",
};
/// `startup_check`.
pub const STARTUP_CHECK: Key = Key {
    name: key_name!(None, "startup_check", "startup-check", "BATON_HUB_STARTUP_CHECK"),
    kind: KeyKind::Choice { default: "full", allowed: &["full", "quick"] },
    doc: "what `serve` checks of the database before it listens: \"full\" (integrity_check: \
          every index against its table) or \"quick\" (quick_check: page structure only; \
          several times faster on a large file, but a damaged index is not found). SQLite only: ignored \
          when database_url names PostgreSQL, whose server checks its own pages",
};
/// `database_url`.
pub const DATABASE_URL: Key = Key {
    name: key_name!(None, "database_url", "database-url", "BATON_HUB_DATABASE_URL"),
    kind: KeyKind::DatabaseUrl,
    doc: "where the record is: empty (the default) for the SQLite file DIR/hub.db, or \
          \"postgres://USER:PASSWORD@HOST:PORT/DB?sslmode=verify-full&sslrootcert=FILE\" for a PostgreSQL \
          database that several hubs may share (sslmode: disable, prefer, require, verify-ca, verify-full). \
          Keep a file that holds a password mode 0600. The flag is global: every command that opens the \
          record takes it",
};
/// `shutdown_grace`.
pub const SHUTDOWN_GRACE: Key = Key {
    name: key_name!(None, "shutdown_grace", "shutdown-grace", "BATON_HUB_SHUTDOWN_GRACE"),
    kind: KeyKind::Duration { default: SHUTDOWN_GRACE_DEFAULT, min: Duration::ZERO, max: Duration::from_secs(600) },
    doc: "how long SIGTERM waits for open requests",
};
/// `log_format`.
pub const LOG_FORMAT: Key = Key {
    name: key_name!(None, "log_format", "log-format", "BATON_HUB_LOG_FORMAT"),
    kind: KeyKind::Choice { default: "text", allowed: &["text", "json"] },
    doc: "log lines on stderr as text or as JSON objects (the filter is BATON_LOG)",
};
/// `host_silence_warn`.
pub const HOST_SILENCE_WARN: Key = Key {
    name: key_name!(None, "host_silence_warn", "host-silence-warn", "BATON_HUB_HOST_SILENCE_WARN"),
    kind: KeyKind::Duration {
        default: HOST_SILENCE_WARN_DEFAULT,
        min: Duration::from_secs(10),
        max: Duration::from_secs(7 * 24 * 3600),
    },
    doc: "`status` flags (and `hosts list` marks) a host whose open node session has sent nothing for longer than this; at least limits.long_poll_wait_max plus the 5s contact flush",
};
/// `otlp_endpoint`.
pub const OTLP_ENDPOINT: Key = Key {
    name: key_name!(None, "otlp_endpoint", "otlp-endpoint", "BATON_HUB_OTLP_ENDPOINT"),
    kind: KeyKind::OtlpEndpoint,
    doc: "where the hub exports its spans of each message (accept, fan-out, claim, in the producer's trace) over \
          OTLP/HTTP: an http:// or https:// URL of a collector (\"http://collector:4318\", to which /v1/traces is \
          added, or the full traces URL); empty (the default): no spans are made or exported",
};
/// The operator listener's address when no layer names one: loopback, on a port the system
/// picks (written to `DIR/operator.addr`), so that it never collides with another hub on the
/// machine and is reachable from the machine itself only.
pub const OPERATOR_LISTEN_DEFAULT: &str = "127.0.0.1:0";
/// `operator_listen`.
pub const OPERATOR_LISTEN: Key = Key {
    name: key_name!(None, "operator_listen", "operator-listen", "BATON_HUB_OPERATOR_LISTEN"),
    kind: KeyKind::AddrOrOff { default: OPERATOR_LISTEN_DEFAULT },
    doc: "ADDR:PORT of the operator listener (plain HTTP, no client certificate: /healthz, /readyz, \
          /metrics and the status page); port 0 picks a free port (written to DIR/operator.addr); \
          \"off\" disables it",
};
/// `operator_hosts`.
pub const OPERATOR_HOSTS: Key = Key {
    name: key_name!(None, "operator_hosts", "operator-hosts", "BATON_HUB_OPERATOR_HOSTS"),
    kind: KeyKind::Names,
    doc: "names, besides its bound IP address (and localhost when it is bound on loopback), that the \
          operator listener answers to in a request's Host header, comma-separated (in the file also an \
          array): a load balancer's or a proxy's name for it. A request naming any other host is answered 421, \
          so a web page that rebinds its own name to this address cannot read the listener",
};
/// `status_page_reasons`.
pub const STATUS_PAGE_REASONS: Key = Key {
    name: key_name!(None, "status_page_reasons", "status-page-reasons", "BATON_HUB_STATUS_PAGE_REASONS"),
    kind: KeyKind::Choice { default: "auto", allowed: &["auto", "shown", "hidden"] },
    doc: "whether the status page shows failure reasons and the end of each run's harness stderr (a harness's \
          or a node's text, which may say what the work was about) beside failed and unknown deliveries: \"shown\", \"hidden\", or \"auto\" (shown while \
          operator_listen is a loopback address, which only the machine itself reaches; hidden otherwise)",
};
/// The most operator-listener connections one peer address keeps open by default.
pub const OPERATOR_CONNECTIONS_PER_PEER_MAX_DEFAULT: u64 = 8;
/// `operator_connections_per_peer_max`.
pub const OPERATOR_CONNECTIONS_PER_PEER_MAX: Key = Key {
    name: key_name!(
        None,
        "operator_connections_per_peer_max",
        "operator-connections-per-peer-max",
        "BATON_HUB_OPERATOR_CONNECTIONS_PER_PEER_MAX"
    ),
    kind: KeyKind::Int {
        default: OPERATOR_CONNECTIONS_PER_PEER_MAX_DEFAULT,
        min: 1,
        max: OPERATOR_CONNECTIONS_MAX as u64,
    },
    doc: "operator-listener connections open at once from one peer IP address; a new connection from a \
          peer at the bound (or with the listener full) closes that peer's (or the listener's) oldest idle \
          connection, and is closed itself only when none is idle, so held-open sockets cannot keep a health \
          check out",
};
const _: () = assert!(OPERATOR_CONNECTIONS_PER_PEER_MAX_DEFAULT < OPERATOR_CONNECTIONS_MAX as u64);

/// `start_lease`.
pub const START_LEASE: Key = Key {
    name: key_name!(None, "start_lease", "start-lease", "BATON_HUB_START_LEASE"),
    kind: KeyKind::Duration {
        default: START_LEASE_DEFAULT,
        min: Duration::from_secs(1),
        max: Duration::from_secs(3600),
    },
    doc: "how long a node session may start the turns it acked while it cannot reach the hub, after the hub \
          last granted it (a newer session of the same node instance starts none of them until it ran out)",
};

/// Most hosts given series of their own on `/metrics` by default.
pub const METRICS_HOSTS_MAX_DEFAULT: u64 = 1000;
/// `metrics_hosts_max`.
pub const METRICS_HOSTS_MAX: Key = Key {
    name: key_name!(None, "metrics_hosts_max", "metrics-hosts-max", "BATON_HUB_METRICS_HOSTS_MAX"),
    kind: KeyKind::Int { default: METRICS_HOSTS_MAX_DEFAULT, min: 1, max: 100_000 },
    doc: "most hosts given per-host series on /metrics (backlog, oldest waiting age, silence, last contact), \
          the first by name; past it the rest get none and baton_hub_metrics_hosts_omitted counts them, so a \
          fleet that grows cannot grow the scrape without bound",
};
/// The least time between two reads of the record's gauges by default.
pub const GAUGE_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);
/// `gauge_interval`.
pub const GAUGE_INTERVAL: Key = Key {
    name: key_name!(None, "gauge_interval", "gauge-interval", "BATON_HUB_GAUGE_INTERVAL"),
    kind: KeyKind::Duration {
        default: GAUGE_INTERVAL_DEFAULT,
        min: Duration::from_secs(1),
        max: Duration::from_secs(3600),
    },
    doc: "the least time between two reads of the gauges /metrics takes from the record (deliveries by state \
          and by outcome, backlogs, running turns, ...); a large record's read waits longer (gauge_read_share)",
};
/// Most of the hub's time, in percent, that reading the record's gauges may take by default.
pub const GAUGE_READ_SHARE_DEFAULT: u64 = 5;
/// `gauge_read_share`.
pub const GAUGE_READ_SHARE: Key = Key {
    name: key_name!(None, "gauge_read_share", "gauge-read-share", "BATON_HUB_GAUGE_READ_SHARE"),
    kind: KeyKind::Int { default: GAUGE_READ_SHARE_DEFAULT, min: 1, max: 100 },
    doc: "most of the time, in percent, that reading the record's gauges may take: some gauges count the whole \
          record (deliveries by outcome), so after a read that took t the next waits at least t x (100 - share) \
          / share, and never less than gauge_interval (the status page's reload is paced the same way, from 10s); \
          baton_hub_gauges_read_seconds shows the last read's time",
};
/// `requeue_silent_after`.
pub const REQUEUE_SILENT_AFTER: Key = Key {
    name: key_name!(None, "requeue_silent_after", "requeue-silent-after", "BATON_HUB_REQUEUE_SILENT_AFTER"),
    kind: KeyKind::Duration { default: Duration::ZERO, min: Duration::ZERO, max: Duration::from_secs(7 * 24 * 3600) },
    doc: "off when 0s (the default). Otherwise the hub returns the claimed and mirrored (never delivered) \
          deliveries of a node instance whose open session has been silent this long to the queue (recorded as \
          by `hub`). Safe because of the execution gate: a node runs a turn only after the hub confirmed its \
          ack, and the old holder's ack is refused once its delivery was requeued, so the requeued copy never \
          runs twice. At least twice limits.long_poll_wait_max plus the 5s contact flush, so a node waiting in \
          a long poll is never taken for silent",
};
/// `limits.payload_bytes_max`.
pub const PAYLOAD_BYTES_MAX: Key = Key {
    name: key_name!(Some("limits"), "payload_bytes_max", "payload-bytes-max", "BATON_HUB_PAYLOAD_BYTES_MAX"),
    kind: KeyKind::Int {
        default: PAYLOAD_BYTES_MAX_DEFAULT,
        min: baton_shared::limits::PAYLOAD_BYTES_MAX_RANGE.0,
        max: baton_shared::limits::PAYLOAD_BYTES_MAX_RANGE.1,
    },
    doc: "bytes of serialised payload JSON per message",
};
/// `limits.result_bytes_max`.
pub const RESULT_BYTES_MAX: Key = Key {
    name: key_name!(Some("limits"), "result_bytes_max", "result-bytes-max", "BATON_HUB_RESULT_BYTES_MAX"),
    kind: KeyKind::Int { default: RESULT_BYTES_MAX_DEFAULT, min: 1, max: 16 * MIB },
    doc: "bytes of a report's result body",
};
/// `limits.stderr_tail_bytes_max`.
pub const STDERR_TAIL_BYTES_MAX: Key = Key {
    name: key_name!(
        Some("limits"),
        "stderr_tail_bytes_max",
        "stderr-tail-bytes-max",
        "BATON_HUB_STDERR_TAIL_BYTES_MAX"
    ),
    kind: KeyKind::Int {
        default: STDERR_TAIL_BYTES_MAX_DEFAULT,
        min: STDERR_TAIL_BYTES_MAX_RANGE.0,
        max: STDERR_TAIL_BYTES_MAX_RANGE.1,
    },
    doc: "bytes of the end of a harness's stderr kept with its attempt (a report's stderr_tail); a longer tail \
          is cut to its last bytes, from a character boundary, and what was cut is added to \
          stderr_dropped_bytes: never refused, so an outcome is never lost to its diagnostics; 0 keeps none of it",
};
/// `limits.claim_batch_max`.
pub const CLAIM_BATCH_MAX: Key = Key {
    name: key_name!(Some("limits"), "claim_batch_max", "claim-batch-max", "BATON_HUB_CLAIM_BATCH_MAX"),
    kind: KeyKind::Int { default: CLAIM_BATCH_MAX_DEFAULT as u64, min: 1, max: 1000 },
    doc: "deliveries per claim",
};
/// `limits.holdings_page_max`.
pub const HOLDINGS_PAGE_MAX: Key = Key {
    name: key_name!(Some("limits"), "holdings_page_max", "holdings-page-max", "BATON_HUB_HOLDINGS_PAGE_MAX"),
    kind: KeyKind::Int {
        default: HOLDINGS_PAGE_MAX_DEFAULT as u64,
        min: HOLDINGS_PAGE_MAX_RANGE.0 as u64,
        max: HOLDINGS_PAGE_MAX_RANGE.1 as u64,
    },
    doc: "deliveries per page of a node's holdings (GET /v1/holdings); the node follows the pages",
};
/// `limits.message_page_max`.
pub const MESSAGE_PAGE_MAX: Key = Key {
    name: key_name!(Some("limits"), "message_page_max", "message-page-max", "BATON_HUB_MESSAGE_PAGE_MAX"),
    kind: KeyKind::Int {
        default: MESSAGE_PAGE_MAX_DEFAULT as u64,
        min: MESSAGE_PAGE_MAX_RANGE.0 as u64,
        max: MESSAGE_PAGE_MAX_RANGE.1 as u64,
    },
    doc: "messages per page of a producer's listing (GET /v1/messages?conversation=C, baton list); a larger \
          limit is capped, and a page also stops at limits.message_view_bytes_max bytes",
};
/// `limits.message_view_bytes_max`.
pub const MESSAGE_VIEW_BYTES_MAX: Key = Key {
    name: key_name!(
        Some("limits"),
        "message_view_bytes_max",
        "message-view-bytes-max",
        "BATON_HUB_MESSAGE_VIEW_BYTES_MAX"
    ),
    kind: KeyKind::Int {
        default: MESSAGE_VIEW_BYTES_MAX_DEFAULT,
        min: MESSAGE_VIEW_BYTES_MAX_RANGE.0,
        max: MESSAGE_VIEW_BYTES_MAX_RANGE.1,
    },
    doc: "bytes of a message read's answer (GET /v1/messages/{id}); past it whole deliveries' attempts are left \
          out and named (`omitted`), each read by GET /v1/messages/{id}/deliveries/{delivery_id}; more than \
          payload_bytes_max",
};
/// `limits.store_bytes_max`.
pub const STORE_BYTES_MAX: Key = Key {
    name: key_name!(Some("limits"), "store_bytes_max", "store-bytes-max", "BATON_HUB_STORE_BYTES_MAX"),
    kind: KeyKind::Int { default: STORE_BYTES_MAX_DEFAULT, min: STORE_BYTES_MAX_RANGE.0, max: STORE_BYTES_MAX_RANGE.1 },
    doc: "bytes the hub's store may hold (SQLite: its used pages; PostgreSQL: the database's size); past it \
          submissions get 507 store_full while claims, reports and reads go on",
};
/// `limits.long_poll_wait_max`.
pub const LONG_POLL_WAIT_MAX: Key = Key {
    name: key_name!(Some("limits"), "long_poll_wait_max", "long-poll-wait-max", "BATON_HUB_LONG_POLL_WAIT_MAX"),
    kind: KeyKind::Duration { default: LONG_POLL_WAIT_MAX_DEFAULT, min: Duration::ZERO, max: Duration::from_secs(300) },
    doc: "longest wait of a claim or a message read",
};
/// `limits.pool_affinity_wait`.
pub const POOL_AFFINITY_WAIT_KEY: Key = Key {
    name: key_name!(Some("limits"), "pool_affinity_wait", "pool-affinity-wait", "BATON_HUB_POOL_AFFINITY_WAIT"),
    kind: KeyKind::Duration { default: POOL_AFFINITY_WAIT, min: Duration::ZERO, max: POOL_AFFINITY_WAIT_MAX },
    doc: "how long a pool conversation's next turn waits for the host that ran its last one before any member may \
          take it (0s: any member at once)",
};
/// `limits.recipients_max`.
pub const RECIPIENTS_MAX: Key = Key {
    name: key_name!(Some("limits"), "recipients_max", "recipients-max", "BATON_HUB_RECIPIENTS_MAX"),
    kind: KeyKind::Int { default: RECIPIENTS_MAX_DEFAULT as u64, min: 1, max: 1024 },
    doc: "recipients per message",
};
/// `limits.queued_per_host_max`.
pub const QUEUED_PER_HOST_MAX: Key = Key {
    name: key_name!(Some("limits"), "queued_per_host_max", "queued-per-host-max", "BATON_HUB_QUEUED_PER_HOST_MAX"),
    kind: KeyKind::Int { default: QUEUED_PER_HOST_MAX_DEFAULT, min: 1, max: 1_000_000_000 },
    doc: "deliveries waiting (queued or held) per host before submissions get 429",
};
/// `limits.queued_per_pool_max`.
pub const QUEUED_PER_POOL_MAX: Key = Key {
    name: key_name!(Some("limits"), "queued_per_pool_max", "queued-per-pool-max", "BATON_HUB_QUEUED_PER_POOL_MAX"),
    kind: KeyKind::Int { default: QUEUED_PER_POOL_MAX_DEFAULT, min: 1, max: 1_000_000_000 },
    doc: "deliveries queued per pool before submissions addressed to it get 429",
};
/// `limits.retention`.
pub const RETENTION: Key = Key {
    name: key_name!(Some("limits"), "retention", "retention", "BATON_HUB_RETENTION"),
    kind: KeyKind::Duration {
        default: RETENTION_DEFAULT,
        min: Duration::from_secs(3600),
        max: Duration::from_secs(3650 * 24 * 3600),
    },
    doc: "how long settled messages and their idempotency keys are kept",
};
/// `limits.audit_retention`.
pub const AUDIT_RETENTION: Key = Key {
    name: key_name!(Some("limits"), "audit_retention", "audit-retention", "BATON_HUB_AUDIT_RETENTION"),
    kind: KeyKind::Duration {
        default: AUDIT_RETENTION_DEFAULT,
        min: Duration::from_secs(24 * 3600),
        max: Duration::from_secs(3650 * 24 * 3600),
    },
    doc: "how long audit rows (operator and hub actions: enroll, revoke, fences, releases, …) are kept, from \
          when each was written; delivery transitions go with their message (`retention`)",
};
/// `limits.request_body_bytes_max`.
pub const REQUEST_BODY_BYTES_MAX: Key = Key {
    name: key_name!(
        Some("limits"),
        "request_body_bytes_max",
        "request-body-bytes-max",
        "BATON_HUB_REQUEST_BODY_BYTES_MAX"
    ),
    kind: KeyKind::Int { default: REQUEST_BODY_BYTES_MAX_DEFAULT, min: 1024, max: 64 * MIB },
    doc: "larger request bodies get 413 before they are read",
};
/// `limits.handshake_timeout`.
pub const HANDSHAKE_TIMEOUT: Key = Key {
    name: key_name!(Some("limits"), "handshake_timeout", "handshake-timeout", "BATON_HUB_HANDSHAKE_TIMEOUT"),
    kind: KeyKind::Duration {
        default: HANDSHAKE_TIMEOUT_DEFAULT,
        min: Duration::from_secs(1),
        max: Duration::from_secs(60),
    },
    doc: "longest TLS handshake",
};

/// `limits.connections_max`.
pub const CONNECTIONS_MAX: Key = Key {
    name: key_name!(Some("limits"), "connections_max", "connections-max", "BATON_HUB_CONNECTIONS_MAX"),
    kind: KeyKind::Int { default: CONNECTIONS_MAX_DEFAULT, min: 1, max: 1_000_000 },
    doc: "connections open at once, handshaking ones included; more are closed at accept. `serve` raises \
          its soft open-file limit to the hard one and refuses to start when this and 256 files of its own do \
          not fit under it",
};
/// `limits.connections_per_cert_max`.
pub const CONNECTIONS_PER_CERT_MAX: Key = Key {
    name: key_name!(
        Some("limits"),
        "connections_per_cert_max",
        "connections-per-cert-max",
        "BATON_HUB_CONNECTIONS_PER_CERT_MAX"
    ),
    kind: KeyKind::Int { default: CONNECTIONS_PER_CERT_MAX_DEFAULT, min: 1, max: 1_000_000 },
    doc: "connections open at once from one client certificate; more are closed after the handshake",
};
/// `limits.header_read_timeout`.
pub const HEADER_READ_TIMEOUT: Key = Key {
    name: key_name!(Some("limits"), "header_read_timeout", "header-read-timeout", "BATON_HUB_HEADER_READ_TIMEOUT"),
    kind: KeyKind::Duration {
        default: HEADER_READ_TIMEOUT_DEFAULT,
        min: Duration::from_secs(1),
        max: Duration::from_secs(300),
    },
    doc: "longest a client takes to send a request's headers, counted from when it may start \
          (slowloris guard); at most idle_timeout",
};
/// `limits.request_body_timeout`.
pub const REQUEST_BODY_TIMEOUT: Key = Key {
    name: key_name!(Some("limits"), "request_body_timeout", "request-body-timeout", "BATON_HUB_REQUEST_BODY_TIMEOUT"),
    kind: KeyKind::Duration {
        default: REQUEST_BODY_TIMEOUT_DEFAULT,
        min: Duration::from_secs(1),
        max: Duration::from_secs(600),
    },
    doc: "longest a client takes to send a request body (408 after); a long poll's wait is not counted",
};
/// `limits.idle_timeout`.
pub const IDLE_TIMEOUT: Key = Key {
    name: key_name!(Some("limits"), "idle_timeout", "idle-timeout", "BATON_HUB_IDLE_TIMEOUT"),
    kind: KeyKind::Duration {
        default: IDLE_TIMEOUT_DEFAULT,
        min: Duration::from_secs(1),
        max: Duration::from_secs(3600),
    },
    doc: "longest a kept-alive connection stays open with no request in progress",
};
/// `limits.requests_per_connection_max`.
pub const REQUESTS_PER_CONNECTION_MAX: Key = Key {
    name: key_name!(
        Some("limits"),
        "requests_per_connection_max",
        "requests-per-connection-max",
        "BATON_HUB_REQUESTS_PER_CONNECTION_MAX"
    ),
    kind: KeyKind::Int { default: REQUESTS_PER_CONNECTION_MAX_DEFAULT, min: 1, max: 1_000_000_000 },
    doc: "requests one connection carries before the hub closes it after answering",
};

/// `limits.max_attempts_max`.
pub const MAX_ATTEMPTS_MAX: Key = Key {
    name: key_name!(Some("limits"), "max_attempts_max", "max-attempts-max", "BATON_HUB_MAX_ATTEMPTS_MAX"),
    kind: KeyKind::Int { default: MAX_ATTEMPTS_MAX_DEFAULT, min: 1, max: 1000 },
    doc: "most runs a message may ask for with max_attempts (a harness exit 75 is retried while runs remain)",
};
/// `limits.retry_backoff`.
pub const RETRY_BACKOFF: Key = Key {
    name: key_name!(Some("limits"), "retry_backoff", "retry-backoff", "BATON_HUB_RETRY_BACKOFF"),
    kind: KeyKind::Duration { default: RETRY_BACKOFF_DEFAULT, min: Duration::ZERO, max: Duration::from_secs(3600) },
    doc: "the first retry's backoff when a message names no retry_backoff_ms; each later retry doubles it",
};
/// `limits.retry_backoff_max`.
pub const RETRY_BACKOFF_MAX: Key = Key {
    name: key_name!(Some("limits"), "retry_backoff_max", "retry-backoff-max", "BATON_HUB_RETRY_BACKOFF_MAX"),
    kind: KeyKind::Duration {
        default: RETRY_BACKOFF_MAX_DEFAULT,
        min: Duration::ZERO,
        max: Duration::from_secs(24 * 3600),
    },
    doc: "the longest backoff before a retry (and the largest retry_backoff_ms a message may name)",
};
/// `limits.redrive_batch_max`.
pub const REDRIVE_BATCH_MAX: Key = Key {
    name: key_name!(Some("limits"), "redrive_batch_max", "redrive-batch-max", "BATON_HUB_REDRIVE_BATCH_MAX"),
    kind: KeyKind::Int { default: REDRIVE_BATCH_MAX_DEFAULT, min: 1, max: 100_000 },
    doc: "deliveries one redrive transaction re-runs; a larger redrive goes on in further batches",
};

/// `limits.approval_timeout_max`.
pub const APPROVAL_TIMEOUT_MAX: Key = Key {
    name: key_name!(Some("limits"), "approval_timeout_max", "approval-timeout-max", "BATON_HUB_APPROVAL_TIMEOUT_MAX"),
    kind: KeyKind::Duration {
        default: Duration::from_secs(7 * 24 * 3600),
        min: Duration::from_secs(1),
        max: Duration::from_millis(crate::store::lifecycle::approval::APPROVAL_TIMEOUT_MAX_MS),
    },
    doc: "the largest approval_timeout_ms a message may name; past its timeout an undecided approval fails the \
          message's held deliveries, naming the timeout (a message without approval_timeout_ms waits for a \
          decision however long it takes)",
};
/// `limits.breaker_failures`.
pub const BREAKER_FAILURES: Key = Key {
    name: key_name!(Some("limits"), "breaker_failures", "breaker-failures", "BATON_HUB_BREAKER_FAILURES"),
    kind: KeyKind::Int { default: 0, min: 0, max: 1000 },
    doc: "off when 0 (the default). Otherwise a conversation whose turns fail this many times in a row (failed \
          outcomes on any host, a succeeded one starting the count again) gets a hold fence set by the hub, its \
          reason naming the count, which `status` lists and `fence lift` lifts. Off by default because a failing \
          harness is not always a runaway one (a flaky dependency, a bad payload the producer retries): an \
          operator who knows their turns opts in",
};

/// `limits.breaker_turns`.
pub const BREAKER_TURNS: Key = Key {
    name: key_name!(Some("limits"), "breaker_turns", "breaker-turns", "BATON_HUB_BREAKER_TURNS"),
    kind: KeyKind::Int { default: 0, min: 0, max: 1_000_000 },
    doc: "off when 0 (the default). Otherwise a conversation that runs more turns than this within \
          limits.breaker_period (counted as their outcomes are reported, on any host) gets a hold fence set by \
          the hub, its reason naming the count and the period, which `status` lists and `fence lift` lifts. Off \
          by default because how many turns a busy conversation legitimately runs depends on the deployment: any \
          default would either never trip or hold healthy conversations, so an operator who knows their traffic \
          opts in",
};
/// `limits.breaker_period`.
pub const BREAKER_PERIOD: Key = Key {
    name: key_name!(Some("limits"), "breaker_period", "breaker-period", "BATON_HUB_BREAKER_PERIOD"),
    kind: KeyKind::Duration {
        default: Duration::from_secs(3600),
        min: Duration::from_secs(1),
        max: Duration::from_secs(7 * 24 * 3600),
    },
    doc: "the period limits.breaker_turns counts over: a fixed window per conversation, starting at its first \
          counted turn",
};
/// `limits.deadline_max`.
pub const DEADLINE_MAX: Key = Key {
    name: key_name!(Some("limits"), "deadline_max", "deadline-max", "BATON_HUB_DEADLINE_MAX"),
    kind: KeyKind::Duration {
        default: DEADLINE_MAX_DEFAULT,
        min: Duration::from_secs(1),
        max: Duration::from_secs(30 * 24 * 3600),
    },
    doc: "the largest deadline_ms a message may name: the longest any of its turns may run (its node stops \
          it at the shorter of this deadline and its own exec_timeout, SIGTERM then SIGKILL after kill_grace, \
          and reports it failed naming the deadline)",
};
/// `limits.stall_max`.
pub const STALL_MAX: Key = Key {
    name: key_name!(Some("limits"), "stall_max", "stall-max", "BATON_HUB_STALL_MAX"),
    kind: KeyKind::Duration {
        default: STALL_MAX_DEFAULT,
        min: Duration::from_secs(1),
        max: Duration::from_secs(30 * 24 * 3600),
    },
    doc: "the largest stall_ms a message may name: the longest a running turn may go without a progress event \
          before its node stops it and reports it failed naming the stall (retried while max_attempts allows)",
};
/// `limits.progress_event_bytes_max`.
pub const PROGRESS_EVENT_BYTES_MAX: Key = Key {
    name: key_name!(
        Some("limits"),
        "progress_event_bytes_max",
        "progress-event-bytes-max",
        "BATON_HUB_PROGRESS_EVENT_BYTES_MAX"
    ),
    kind: KeyKind::Int {
        default: PROGRESS_EVENT_BYTES_MAX_DEFAULT,
        min: PROGRESS_EVENT_BYTES_MAX_RANGE.0,
        max: PROGRESS_EVENT_BYTES_MAX_RANGE.1,
    },
    doc: "bytes of one progress event (the JSON object a harness wrote on its progress channel) the hub keeps; a \
          larger one is dropped and counted with its run (progress_dropped), never refused with the request",
};
/// `limits.progress_events_per_turn_max`.
pub const PROGRESS_EVENTS_PER_TURN_MAX: Key = Key {
    name: key_name!(
        Some("limits"),
        "progress_events_per_turn_max",
        "progress-events-per-turn-max",
        "BATON_HUB_PROGRESS_EVENTS_PER_TURN_MAX"
    ),
    kind: KeyKind::Int {
        default: PROGRESS_EVENTS_PER_TURN_MAX_DEFAULT,
        min: PROGRESS_EVENTS_PER_TURN_MAX_RANGE.0,
        max: PROGRESS_EVENTS_PER_TURN_MAX_RANGE.1,
    },
    doc: "progress events of one run of a delivery the hub keeps (they are kept with the delivery, under the \
          same retention as its attempts); later ones are dropped and counted; 0 keeps none",
};
/// `limits.feed_page_max`.
pub const FEED_PAGE_MAX: Key = Key {
    name: key_name!(Some("limits"), "feed_page_max", "feed-page-max", "BATON_HUB_FEED_PAGE_MAX"),
    kind: KeyKind::Int {
        default: FEED_PAGE_MAX_DEFAULT as u64,
        min: FEED_PAGE_MAX_RANGE.0 as u64,
        max: FEED_PAGE_MAX_RANGE.1 as u64,
    },
    doc: "items one answer of an events feed carries at most (a message's or a conversation's events; a \
          request's limit is capped by it); the answer's next_cursor reads on",
};
/// `limits.feed_page_bytes_max`.
pub const FEED_PAGE_BYTES_MAX: Key = Key {
    name: key_name!(Some("limits"), "feed_page_bytes_max", "feed-page-bytes-max", "BATON_HUB_FEED_PAGE_BYTES_MAX"),
    kind: KeyKind::Int {
        default: FEED_PAGE_BYTES_MAX_DEFAULT,
        min: FEED_PAGE_BYTES_MAX_RANGE.0,
        max: FEED_PAGE_BYTES_MAX_RANGE.1,
    },
    doc: "bytes of JSON one answer of an events feed carries at most: its items stop before the one that would \
          pass it (one item always goes)",
};

/// `limits.instance_rebinds_max`.
pub const INSTANCE_REBINDS_MAX: Key = Key {
    name: key_name!(Some("limits"), "instance_rebinds_max", "instance-rebinds-max", "BATON_HUB_INSTANCE_REBINDS_MAX"),
    kind: KeyKind::Int { default: INSTANCE_REBINDS_PER_WINDOW_MAX as u64, min: 1, max: 10_000 },
    doc: "times one host may change its bound node instance within instance_rebind_window (429 beyond)",
};
/// `limits.instance_rebind_window`.
pub const INSTANCE_REBIND_WINDOW_KEY: Key = Key {
    name: key_name!(
        Some("limits"),
        "instance_rebind_window",
        "instance-rebind-window",
        "BATON_HUB_INSTANCE_REBIND_WINDOW"
    ),
    kind: KeyKind::Duration {
        default: INSTANCE_REBIND_WINDOW,
        min: Duration::from_secs(60),
        max: Duration::from_secs(24 * 3600),
    },
    doc: "the sliding window instance_rebinds_max counts a host's instance changes over",
};

/// Every key, in the order of the template.
pub const KEYS: [&Key; 57] = [
    &LISTEN,
    &DATABASE_URL,
    &SYNCHRONOUS,
    &CHECKPOINT_INTERVAL,
    &STARTUP_CHECK,
    &SHUTDOWN_GRACE,
    &LOG_FORMAT,
    &OTLP_ENDPOINT,
    &HOST_SILENCE_WARN,
    &OPERATOR_LISTEN,
    &OPERATOR_HOSTS,
    &STATUS_PAGE_REASONS,
    &OPERATOR_CONNECTIONS_PER_PEER_MAX,
    &METRICS_HOSTS_MAX,
    &GAUGE_INTERVAL,
    &GAUGE_READ_SHARE,
    &REQUEUE_SILENT_AFTER,
    &START_LEASE,
    &PAYLOAD_BYTES_MAX,
    &RESULT_BYTES_MAX,
    &STDERR_TAIL_BYTES_MAX,
    &CLAIM_BATCH_MAX,
    &HOLDINGS_PAGE_MAX,
    &MESSAGE_PAGE_MAX,
    &MESSAGE_VIEW_BYTES_MAX,
    &STORE_BYTES_MAX,
    &LONG_POLL_WAIT_MAX,
    &POOL_AFFINITY_WAIT_KEY,
    &RECIPIENTS_MAX,
    &QUEUED_PER_HOST_MAX,
    &QUEUED_PER_POOL_MAX,
    &RETENTION,
    &AUDIT_RETENTION,
    &REQUEST_BODY_BYTES_MAX,
    &HANDSHAKE_TIMEOUT,
    &CONNECTIONS_MAX,
    &CONNECTIONS_PER_CERT_MAX,
    &HEADER_READ_TIMEOUT,
    &REQUEST_BODY_TIMEOUT,
    &IDLE_TIMEOUT,
    &REQUESTS_PER_CONNECTION_MAX,
    &MAX_ATTEMPTS_MAX,
    &RETRY_BACKOFF,
    &RETRY_BACKOFF_MAX,
    &REDRIVE_BATCH_MAX,
    &APPROVAL_TIMEOUT_MAX,
    &BREAKER_FAILURES,
    &BREAKER_TURNS,
    &BREAKER_PERIOD,
    &DEADLINE_MAX,
    &STALL_MAX,
    &PROGRESS_EVENT_BYTES_MAX,
    &PROGRESS_EVENTS_PER_TURN_MAX,
    &FEED_PAGE_MAX,
    &FEED_PAGE_BYTES_MAX,
    &INSTANCE_REBINDS_MAX,
    &INSTANCE_REBIND_WINDOW_KEY,
];

/// Writes a duration the way the configuration takes it: the largest whole unit.
pub fn humanize(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [("d", 86_400_000u128), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms != 0 && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    if ms == 0 { "0s".to_string() } else { format!("{ms}ms") }
}

impl Key {
    /// The allowed values, for messages and the template.
    pub fn range(&self) -> String {
        match self.kind {
            KeyKind::Int { min, max, .. } => format!("{min}..={max}"),
            KeyKind::Duration { min, max, .. } => format!("{}..={}", humanize(min), humanize(max)),
            KeyKind::Addr { .. } => "ADDR:PORT".to_string(),
            KeyKind::AddrOrOff { .. } => "ADDR:PORT or \"off\"".to_string(),
            KeyKind::DatabaseUrl => "\"\" or a postgres:// URL".to_string(),
            KeyKind::OtlpEndpoint => "\"\" or an http:// or https:// URL".to_string(),
            KeyKind::Names => "\"\" or comma-separated host names".to_string(),
            KeyKind::Choice { allowed, .. } => {
                allowed.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(" or ")
            }
        }
    }

    /// The default, written as the file takes it.
    pub fn default_toml(&self) -> String {
        match self.kind {
            KeyKind::Int { default, .. } => default.to_string(),
            KeyKind::Duration { default, .. } => format!("{:?}", humanize(default)),
            KeyKind::Addr { default } | KeyKind::AddrOrOff { default } | KeyKind::Choice { default, .. } => {
                format!("{default:?}")
            }
            KeyKind::DatabaseUrl | KeyKind::Names | KeyKind::OtlpEndpoint => "\"\"".to_string(),
        }
    }

    /// Whether the key's flag is global (given before or after any command, not only to `serve`):
    /// `database_url`, since every command that opens the record must know where it is.
    pub fn flag_is_global(&self) -> bool {
        matches!(self.kind, KeyKind::DatabaseUrl)
    }

    /// The flag's `--help` text: the doc, the key's other names, its default and range.
    pub fn flag_help(&self) -> String {
        format!(
            "{} [env: {}] [file: {}] [default: {}] [allowed: {}]",
            self.doc,
            self.name.env,
            self.name.field(),
            self.default_toml().trim_matches('"'),
            self.range()
        )
    }

    /// The placeholder `--help` shows for the flag's value.
    pub fn value_name(&self) -> &'static str {
        match self.kind {
            KeyKind::Int { .. } => "N",
            KeyKind::Duration { .. } => "DURATION",
            KeyKind::Addr { .. } => "ADDR:PORT",
            KeyKind::AddrOrOff { .. } => "ADDR:PORT|off",
            KeyKind::DatabaseUrl => "URL",
            KeyKind::Names => "NAMES",
            KeyKind::OtlpEndpoint => "URL",
            KeyKind::Choice { .. } => "WORD",
        }
    }
}

/// The commented configuration `init` writes, with `database_url` set (uncommented) to
/// `database_url` when one is given.
pub fn template_with(database_url: Option<&str>) -> String {
    let text = template();
    let Some(url) = database_url else {
        return text;
    };
    let commented = format!("# {} = {}\n", DATABASE_URL.name.name, DATABASE_URL.default_toml());
    let set = format!("{} = {}\n", DATABASE_URL.name.name, toml::Value::String(url.to_string()));
    text.replacen(&commented, &set, 1)
}

/// The commented configuration `init` writes: every key with its doc, range, environment
/// variable, flag and default, all from `KEYS`.
pub fn template() -> String {
    let mut out = String::from(
        "# Baton hub configuration. Every key is optional; the values shown are the defaults.\n\
         # Each key can also be set by its environment variable or, for `serve`, its flag: a flag\n\
         # beats the environment, which beats this file. Unknown keys and out-of-range values are\n\
         # refused at start, naming the field.\n",
    );
    let mut section: Option<&str> = None;
    for key in KEYS {
        if key.name.section != section {
            section = key.name.section;
            if let Some(s) = section {
                out.push_str(&format!("\n[{s}]\n"));
            }
        }
        let mut doc = key.doc.chars();
        let doc: String = doc.next().map(|c| c.to_uppercase().chain(doc).collect()).unwrap_or_default();
        out.push_str(&format!(
            "\n# {doc}.\n# Allowed: {}. Environment: {}. Flag: --{}.\n# {} = {}\n",
            key.range(),
            key.name.env,
            key.name.flag,
            key.name.name,
            key.default_toml()
        ));
    }
    out
}
