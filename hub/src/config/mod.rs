//! The hub's configuration, layered key by key: default < file (`DIR/hub.toml` or `--config`)
//! < environment (`BATON_HUB_<KEY>`) < flag (`serve --key`), then validated into a `HubConfig`
//! before the hub does any work. The node follows the same rule.
//!
//! Every key is declared once (in `keys`) with its doc, default and range; the file parser, the
//! environment, `serve`'s flags (`Flags`), the template `init` writes and `--help` derive from
//! it. Unknown keys and out-of-range values are refused naming the field, its range and where
//! the value came from.
//!
//! Layout: `keys` (the declarations, the template), `layers` (reading, merging, `Flags`).
//!
//! Why one file over 700 lines: the validation into `HubConfig` and the checks between keys are
//! about 420 lines; the rest is their tests, one per rule, beside the rule they hold.

mod keys;
mod layers;

pub use crate::store::registry::instances::RebindLimit;
pub use keys::*;
pub use layers::{Flags, Source};

use baton_shared::files::read_text_bounded;
use baton_shared::limits::*;
use baton_shared::logging::LogFormat;
use baton_shared::sqlite::Synchronous;
use layers::{Merged, Raw, read_file};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// Bytes of a request left for everything but the payload or result (ids, field names).
const REQUEST_OVERHEAD_BYTES: u64 = 4096;

/// Every bound the hub enforces, with its configured value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload (serialised JSON), bytes.
    pub payload_bytes_max: u64,
    /// Largest result body in a report, bytes.
    pub result_bytes_max: u64,
    /// Most bytes of a report's stderr tail kept (its last ones; the rest is cut, not refused).
    pub stderr_tail_bytes_max: u64,
    /// Most deliveries one claim returns.
    pub claim_batch_max: u32,
    /// Most deliveries one page of holdings carries.
    pub holdings_page_max: u32,
    /// Most messages one page of a producer's listing carries (`limits.message_page_max`).
    pub message_page_max: u32,
    /// Largest answer of a message read, bytes; past it attempts are left out and named.
    pub message_view_bytes_max: u64,
    /// Most bytes the store may hold; past it submissions get 507 `store_full`.
    pub store_bytes_max: u64,
    /// Longest a long-poll (claim or message read) waits.
    pub long_poll_wait_max: Duration,
    /// How long a pool conversation's last host is preferred (`limits.pool_affinity_wait`).
    pub pool_affinity_wait: Duration,
    /// Most recipients one message may name.
    pub recipients_max: u32,
    /// Most deliveries waiting (queued or held) per host.
    pub queued_per_host_max: u64,
    /// Most deliveries queued per pool.
    pub queued_per_pool_max: u64,
    /// How long messages (and their idempotency keys) are kept once settled.
    pub retention: Duration,
    /// How long audit rows (`operator_events`) are kept, from when each was written.
    pub audit_retention: Duration,
    /// Largest request body read, bytes.
    pub request_body_bytes_max: u64,
    /// Longest TLS handshake.
    pub handshake_timeout: Duration,
    /// Most connections open at once (handshaking ones included).
    pub connections_max: u32,
    /// Most connections open at once from one client certificate.
    pub connections_per_cert_max: u32,
    /// Longest wait for a request's headers (HTTP/1), counted from when the client may send.
    pub header_read_timeout: Duration,
    /// Longest wait for a request's whole body once its headers are read.
    pub request_body_timeout: Duration,
    /// Longest a connection stays open with no request in progress.
    pub idle_timeout: Duration,
    /// Most requests one connection carries.
    pub requests_per_connection_max: u64,
    /// Most runs a message may ask for (`max_attempts`).
    pub max_attempts_max: u32,
    /// The first retry's backoff when a message names none.
    pub retry_backoff: Duration,
    /// The longest backoff before a retry.
    pub retry_backoff_max: Duration,
    /// Most deliveries one redrive transaction re-runs.
    pub redrive_batch_max: u32,
    /// The largest `approval_timeout_ms` a message may name.
    pub approval_timeout_max: Duration,
    /// Failed turns in a row that trip a conversation's breaker (0: off).
    pub breaker_failures: u32,
    /// Turns within `breaker_period` that trip a conversation's breaker (0: off).
    pub breaker_turns: u32,
    /// The period `breaker_turns` counts over.
    pub breaker_period: Duration,
    /// The largest `deadline_ms` a message may name.
    pub deadline_max: Duration,
    /// The largest `stall_ms` a message may name.
    pub stall_max: Duration,
    /// What the hub keeps of a run's progress events.
    pub progress: crate::store::lifecycle::progress::ProgressBounds,
    /// Most items of one events feed answer.
    pub feed_page_max: u32,
    /// Most bytes of one events feed answer.
    pub feed_page_bytes_max: u64,
    /// How often one host may change its bound node instance, and over what window.
    pub rebind: RebindLimit,
    /// How long a node session may start the turns it acked on its own after the hub last
    /// granted it (`start_lease`, a top-level key).
    pub start_lease: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            payload_bytes_max: PAYLOAD_BYTES_MAX_DEFAULT,
            result_bytes_max: RESULT_BYTES_MAX_DEFAULT,
            stderr_tail_bytes_max: STDERR_TAIL_BYTES_MAX_DEFAULT,
            claim_batch_max: CLAIM_BATCH_MAX_DEFAULT,
            holdings_page_max: HOLDINGS_PAGE_MAX_DEFAULT,
            message_page_max: MESSAGE_PAGE_MAX_DEFAULT,
            message_view_bytes_max: MESSAGE_VIEW_BYTES_MAX_DEFAULT,
            store_bytes_max: STORE_BYTES_MAX_DEFAULT,
            long_poll_wait_max: LONG_POLL_WAIT_MAX_DEFAULT,
            pool_affinity_wait: baton_shared::limits::POOL_AFFINITY_WAIT,
            recipients_max: RECIPIENTS_MAX_DEFAULT,
            queued_per_host_max: QUEUED_PER_HOST_MAX_DEFAULT,
            queued_per_pool_max: QUEUED_PER_POOL_MAX_DEFAULT,
            retention: RETENTION_DEFAULT,
            audit_retention: AUDIT_RETENTION_DEFAULT,
            request_body_bytes_max: REQUEST_BODY_BYTES_MAX_DEFAULT,
            handshake_timeout: HANDSHAKE_TIMEOUT_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT as u32,
            connections_per_cert_max: CONNECTIONS_PER_CERT_MAX_DEFAULT as u32,
            header_read_timeout: HEADER_READ_TIMEOUT_DEFAULT,
            request_body_timeout: REQUEST_BODY_TIMEOUT_DEFAULT,
            idle_timeout: IDLE_TIMEOUT_DEFAULT,
            requests_per_connection_max: REQUESTS_PER_CONNECTION_MAX_DEFAULT,
            max_attempts_max: MAX_ATTEMPTS_MAX_DEFAULT as u32,
            retry_backoff: RETRY_BACKOFF_DEFAULT,
            retry_backoff_max: RETRY_BACKOFF_MAX_DEFAULT,
            redrive_batch_max: REDRIVE_BATCH_MAX_DEFAULT as u32,
            approval_timeout_max: Duration::from_secs(7 * 24 * 3600),
            breaker_failures: 0,
            breaker_turns: 0,
            breaker_period: Duration::from_secs(3600),
            deadline_max: keys::DEADLINE_MAX_DEFAULT,
            stall_max: keys::STALL_MAX_DEFAULT,
            progress: crate::store::lifecycle::progress::ProgressBounds::default(),
            feed_page_max: FEED_PAGE_MAX_DEFAULT,
            feed_page_bytes_max: FEED_PAGE_BYTES_MAX_DEFAULT,
            rebind: RebindLimit::default(),
            start_lease: START_LEASE_DEFAULT,
        }
    }
}

/// The validated hub configuration.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Where the record is: `None` for the SQLite file in the data directory, else the
    /// PostgreSQL database several hubs may share.
    pub database_url: Option<crate::store::engine::postgres::PgUrl>,
    /// SQLite `synchronous`; anything below full is warned about at start.
    pub synchronous: Synchronous,
    /// What `serve` checks of the database file before it listens.
    pub startup_check: baton_shared::sqlite::Check,
    /// How often the SQLite file is checkpointed (`sqlite::Checkpointer`).
    pub checkpoint_interval: Duration,
    /// Bounds.
    pub limits: Limits,
    /// How long shutdown waits for open requests.
    pub shutdown_grace: Duration,
    /// How log lines are written.
    pub log_format: LogFormat,
    /// How long a host's open node session may be silent before `status` flags it.
    pub host_silence_warn: Duration,
    /// Where the operator listener (health, metrics, status page) listens; `None` when off.
    pub operator_listen: Option<SocketAddr>,
    /// Names (lowercase) the operator listener answers to in a Host header, besides its
    /// bound address.
    pub operator_hosts: Vec<String>,
    /// Whether the status page shows failure reasons; `None`: while the operator listener is
    /// bound to a loopback address (`status_page_reasons = "auto"`).
    pub status_page_reasons: Option<bool>,
    /// Most operator-listener connections open at once from one peer IP address.
    pub operator_connections_per_peer_max: usize,
    /// Most hosts given per-host series on `/metrics` (the first by name).
    pub metrics_hosts_max: usize,
    /// The least time between two reads of the record's gauges.
    pub gauge_interval: Duration,
    /// Most of the time, in percent (1..=100), that reading the record's gauges may take.
    pub gauge_read_share: u32,
    /// Where the hub exports its spans over OTLP/HTTP; `None` (the default): no spans.
    pub otlp_endpoint: Option<baton_telemetry::OtlpEndpoint>,
    /// How long a node instance's open session may be silent before the hub requeues its
    /// claimed and mirrored deliveries; `None`: never (the default).
    pub requeue_silent_after: Option<Duration>,
}

/// What a configuration is read from, lowest layer first.
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    /// The file named by `--config`, which must exist.
    pub file: Option<&'a Path>,
    /// The data directory's `hub.toml`, used when no file is named and it exists.
    pub default_file: &'a Path,
    /// Reads an environment variable (`std::env::var` in the binaries; a map in tests).
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// `serve`'s flags.
    pub flags: &'a Flags,
}

/// Reads an environment variable of this process; a value that is not UTF-8 reads as given
/// in lossy form, so that its validation names the variable.
pub fn process_env(var: &str) -> Option<String> {
    std::env::var_os(var).map(|v| v.to_string_lossy().into_owned())
}

impl HubConfig {
    /// Loads the layers and validates the result. The error names the field, its allowed range
    /// and where the value came from.
    pub fn load(sources: Sources<'_>) -> Result<HubConfig, String> {
        let file = match sources.file {
            Some(p) => Some(p),
            None if sources.default_file.exists() => Some(sources.default_file),
            None => None,
        };
        let mut merged = Merged::default();
        if let Some(p) = file {
            let text = read_text_bounded(p, CONFIG_FILE_BYTES_MAX, "CONFIG_FILE_BYTES_MAX")
                .map_err(|e| format!("{}: {e}", p.display()))?;
            read_file(&text, p, &mut merged)?;
        }
        for key in KEYS {
            if let Some(v) = (sources.env)(key.name.env) {
                merged.add(key, Raw::Text(v), Source::Env(key.name.env));
            }
        }
        for (key, v) in &sources.flags.given {
            merged.add(key, Raw::Text(v.clone()), Source::Flag(key.name.flag));
        }
        HubConfig::validate(&merged)
    }

    /// Parses and validates configuration text alone (no environment, no flags).
    pub fn from_toml(text: &str) -> Result<HubConfig, String> {
        let mut merged = Merged::default();
        read_file(text, Path::new("hub.toml"), &mut merged).map_err(|e| e.replacen("hub.toml: ", "", 1))?;
        HubConfig::validate(&merged)
    }

    fn validate(m: &Merged) -> Result<HubConfig, String> {
        let narrow = |key: &Key| -> Result<u32, String> {
            u32::try_from(m.int(key)?).map_err(|_| format!("{} does not fit in 32 bits", key.name.field()))
        };
        let limits = Limits {
            payload_bytes_max: m.int(&PAYLOAD_BYTES_MAX)?,
            result_bytes_max: m.int(&RESULT_BYTES_MAX)?,
            stderr_tail_bytes_max: m.int(&STDERR_TAIL_BYTES_MAX)?,
            claim_batch_max: narrow(&CLAIM_BATCH_MAX)?,
            holdings_page_max: narrow(&HOLDINGS_PAGE_MAX)?,
            message_page_max: narrow(&MESSAGE_PAGE_MAX)?,
            message_view_bytes_max: m.int(&MESSAGE_VIEW_BYTES_MAX)?,
            store_bytes_max: m.int(&STORE_BYTES_MAX)?,
            long_poll_wait_max: m.duration(&LONG_POLL_WAIT_MAX)?,
            pool_affinity_wait: m.duration(&POOL_AFFINITY_WAIT_KEY)?,
            recipients_max: narrow(&RECIPIENTS_MAX)?,
            queued_per_host_max: m.int(&QUEUED_PER_HOST_MAX)?,
            queued_per_pool_max: m.int(&QUEUED_PER_POOL_MAX)?,
            retention: m.duration(&RETENTION)?,
            audit_retention: m.duration(&AUDIT_RETENTION)?,
            request_body_bytes_max: m.int(&REQUEST_BODY_BYTES_MAX)?,
            handshake_timeout: m.duration(&HANDSHAKE_TIMEOUT)?,
            connections_max: narrow(&CONNECTIONS_MAX)?,
            connections_per_cert_max: narrow(&CONNECTIONS_PER_CERT_MAX)?,
            header_read_timeout: m.duration(&HEADER_READ_TIMEOUT)?,
            request_body_timeout: m.duration(&REQUEST_BODY_TIMEOUT)?,
            idle_timeout: m.duration(&IDLE_TIMEOUT)?,
            requests_per_connection_max: m.int(&REQUESTS_PER_CONNECTION_MAX)?,
            max_attempts_max: narrow(&MAX_ATTEMPTS_MAX)?,
            retry_backoff: m.duration(&RETRY_BACKOFF)?,
            retry_backoff_max: m.duration(&RETRY_BACKOFF_MAX)?,
            redrive_batch_max: narrow(&REDRIVE_BATCH_MAX)?,
            approval_timeout_max: m.duration(&APPROVAL_TIMEOUT_MAX)?,
            breaker_failures: narrow(&BREAKER_FAILURES)?,
            breaker_turns: narrow(&BREAKER_TURNS)?,
            breaker_period: m.duration(&BREAKER_PERIOD)?,
            deadline_max: m.duration(&DEADLINE_MAX)?,
            stall_max: m.duration(&STALL_MAX)?,
            progress: crate::store::lifecycle::progress::ProgressBounds {
                event_bytes_max: m.int(&PROGRESS_EVENT_BYTES_MAX)?,
                events_per_turn_max: m.int(&PROGRESS_EVENTS_PER_TURN_MAX)?,
            },
            feed_page_max: narrow(&FEED_PAGE_MAX)?,
            feed_page_bytes_max: m.int(&FEED_PAGE_BYTES_MAX)?,
            rebind: RebindLimit {
                max: m.int(&INSTANCE_REBINDS_MAX)? as i64,
                window: m.duration(&INSTANCE_REBIND_WINDOW_KEY)?,
            },
            start_lease: m.duration(&START_LEASE)?,
        };
        if limits.message_view_bytes_max <= limits.payload_bytes_max {
            return Err(format!(
                "{} = {} is not more than {} = {} (a message's view carries its payload)",
                MESSAGE_VIEW_BYTES_MAX.name.field(),
                limits.message_view_bytes_max,
                PAYLOAD_BYTES_MAX.name.field(),
                limits.payload_bytes_max
            ));
        }
        if limits.retry_backoff > limits.retry_backoff_max {
            return Err(format!(
                "{} = {} is longer than {} = {}",
                RETRY_BACKOFF.name.field(),
                humanize(limits.retry_backoff),
                RETRY_BACKOFF_MAX.name.field(),
                humanize(limits.retry_backoff_max)
            ));
        }
        if limits.header_read_timeout > limits.idle_timeout {
            return Err(format!(
                "{} = {} is longer than {} = {} (the header wait is also the wait for the next request)",
                HEADER_READ_TIMEOUT.name.field(),
                humanize(limits.header_read_timeout),
                IDLE_TIMEOUT.name.field(),
                humanize(limits.idle_timeout)
            ));
        }
        for (key, v) in [(&PAYLOAD_BYTES_MAX, limits.payload_bytes_max), (&RESULT_BYTES_MAX, limits.result_bytes_max)] {
            if v + REQUEST_OVERHEAD_BYTES > limits.request_body_bytes_max {
                return Err(format!(
                    "{} = {v} does not fit in {} = {} (leave {REQUEST_OVERHEAD_BYTES} bytes for the rest of the request)",
                    key.name.field(),
                    REQUEST_BODY_BYTES_MAX.name.field(),
                    limits.request_body_bytes_max
                ));
            }
        }
        let synchronous = match m.choice(&SYNCHRONOUS)? {
            "normal" => Synchronous::Normal,
            _ => Synchronous::Full,
        };
        let startup_check = match m.choice(&STARTUP_CHECK)? {
            "quick" => baton_shared::sqlite::Check::Quick,
            _ => baton_shared::sqlite::Check::Full,
        };
        let log_format = match m.choice(&LOG_FORMAT)? {
            "json" => LogFormat::Json,
            _ => LogFormat::Text,
        };
        Ok(HubConfig {
            listen: m.addr(&LISTEN)?,
            database_url: m.database_url(&DATABASE_URL)?,
            synchronous,
            startup_check,
            checkpoint_interval: m.duration(&CHECKPOINT_INTERVAL)?,
            limits,
            shutdown_grace: m.duration(&SHUTDOWN_GRACE)?,
            log_format,
            host_silence_warn: host_silence_warn(m.duration(&HOST_SILENCE_WARN)?, limits.long_poll_wait_max)?,
            operator_listen: m.addr_or_off(&OPERATOR_LISTEN)?,
            operator_hosts: m.names(&OPERATOR_HOSTS)?,
            status_page_reasons: match m.choice(&STATUS_PAGE_REASONS)? {
                "shown" => Some(true),
                "hidden" => Some(false),
                _ => None,
            },
            operator_connections_per_peer_max: m.int(&OPERATOR_CONNECTIONS_PER_PEER_MAX)? as usize,
            metrics_hosts_max: usize::try_from(m.int(&METRICS_HOSTS_MAX)?).unwrap_or(usize::MAX),
            gauge_interval: m.duration(&GAUGE_INTERVAL)?,
            gauge_read_share: u32::try_from(m.int(&GAUGE_READ_SHARE)?).unwrap_or(100),
            otlp_endpoint: m.otlp_endpoint(&OTLP_ENDPOINT)?,
            requeue_silent_after: requeue_silent_after(m.duration(&REQUEUE_SILENT_AFTER)?, limits.long_poll_wait_max)?,
        })
    }
}

/// How often a node session's last contact reaches the record (the hub's contact flush), which
/// `requeue_silent_after` must outlast with the longest long poll.
const CONTACT_FLUSH_BOUND: Duration = Duration::from_secs(5);

/// `host_silence_warn`: a healthy idle node is heard from at the start of each claim, and its
/// claims wait at most `limits.long_poll_wait_max`, so its last contact, flushed within the
/// contact flush, is never older than the two together. A warning under that would flag every
/// idle host as silent, so the pair is refused, naming both keys.
fn host_silence_warn(d: Duration, long_poll_wait_max: Duration) -> Result<Duration, String> {
    let least = long_poll_wait_max + CONTACT_FLUSH_BOUND;
    if d < least {
        return Err(format!(
            "host_silence_warn ({}) must be at least {} (limits.long_poll_wait_max, {}, plus the {} contact flush): \
             an idle node waiting in a long poll is heard from only when each one begins, and would be flagged silent",
            baton_shared::duration::human(d),
            baton_shared::duration::human(least),
            baton_shared::duration::human(long_poll_wait_max),
            baton_shared::duration::human(CONTACT_FLUSH_BOUND),
        ));
    }
    Ok(d)
}

/// `requeue_silent_after`: 0 is off; anything else must outlast twice the longest long poll plus
/// the contact flush, so a node waiting in a long poll (heard from only when it began) is never
/// taken for silent.
fn requeue_silent_after(d: Duration, long_poll_wait_max: Duration) -> Result<Option<Duration>, String> {
    if d.is_zero() {
        return Ok(None);
    }
    let least = 2 * (long_poll_wait_max + CONTACT_FLUSH_BOUND);
    if d < least {
        return Err(format!(
            "requeue_silent_after ({}) must be 0s (off) or at least {} (twice limits.long_poll_wait_max plus the \
             contact flush), so a node waiting in a long poll is never taken for silent",
            baton_shared::duration::human(d),
            baton_shared::duration::human(least)
        ));
    }
    Ok(Some(d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};
    use std::collections::BTreeMap;

    fn check_err(text: &str, needle: &str) {
        let e = HubConfig::from_toml(text).unwrap_err();
        assert!(e.contains(needle), "{e:?} should mention {needle:?}");
    }

    /// `host_silence_warn` under one long poll and the contact flush would flag idle hosts:
    /// refused naming both keys; the longest long poll and a warning that outlasts it pass.
    #[test]
    fn host_silence_warn_outlasts_a_long_poll() {
        check_err(
            "host_silence_warn = \"20s\"",
            "host_silence_warn (20s) must be at least 35s (limits.long_poll_wait_max",
        );
        let ok = HubConfig::from_toml("host_silence_warn = \"35s\"").unwrap();
        assert_eq!(ok.host_silence_warn, Duration::from_secs(35));
        let short = HubConfig::from_toml("host_silence_warn = \"10s\"\n[limits]\nlong_poll_wait_max = \"5s\"").unwrap();
        assert_eq!(short.host_silence_warn, Duration::from_secs(10));
        check_err("host_silence_warn = \"1m\"\n[limits]\nlong_poll_wait_max = \"1m\"", "at least 1m 5s");
    }

    /// `requeue_silent_after` is off by default and refuses a value a long poll could outlast.
    #[test]
    fn requeue_silent_after_is_off_by_default_and_outlasts_a_long_poll() {
        let p = Duration::from_secs(30);
        assert_eq!(requeue_silent_after(Duration::ZERO, p), Ok(None));
        assert_eq!(requeue_silent_after(Duration::from_secs(70), p), Ok(Some(Duration::from_secs(70))));
        let e = requeue_silent_after(Duration::from_secs(60), p).unwrap_err();
        assert!(e.contains("requeue_silent_after") && e.contains("1m 10s"), "{e}");
    }

    #[test]
    fn defaults_and_template_parse() {
        let c = HubConfig::from_toml("").unwrap();
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.listen, LISTEN_DEFAULT.parse::<SocketAddr>().unwrap());
        let uncommented: String = template()
            .lines()
            .map(|l| if l.starts_with("# ") && l.contains(" = ") { &l[2..] } else { l })
            .collect::<Vec<_>>()
            .join("\n");
        let c = HubConfig::from_toml(&uncommented).unwrap();
        assert_eq!(c.limits, Limits::default());
        assert_eq!((c.synchronous, c.log_format), (Synchronous::Full, LogFormat::Text));
        assert_eq!(c.shutdown_grace, SHUTDOWN_GRACE_DEFAULT);
    }

    #[test]
    fn refusals_name_the_field_and_range() {
        check_err("lisen = \"x\"", "lisen");
        check_err("[limits]\nclaim_batch_max = 0", "limits.claim_batch_max = 0 is out of range; allowed 1..=1000");
        check_err(
            "[limits]\npayload_bytes_max = 8192\nmessage_view_bytes_max = 8192",
            "limits.message_view_bytes_max = 8192 is not more than limits.payload_bytes_max = 8192",
        );
        check_err("[limits]\nholdings_page_max = 0", "limits.holdings_page_max = 0 is out of range; allowed 1..=1000");
        check_err("[limits]\nclaim_batch_max = \"5\"", "limits.claim_batch_max");
        check_err("[limits]\nlong_poll_wait_max = \"1h\"", "limits.long_poll_wait_max = 1h is out of range");
        check_err("checkpoint_interval = \"5ms\"", "checkpoint_interval = 5ms is out of range");
        check_err("checkpoint_interval = \"2h\"", "checkpoint_interval = 2h is out of range");
        check_err("[limits]\nretention = \"soon\"", "limits.retention");
        check_err("[limits]\nretention = \"1m\"", "allowed 1h..=3650d");
        check_err("[limits]\npayload_bytes_max = 2000000", "limits.payload_bytes_max");
        check_err("synchronous = \"off\"", "synchronous");
        check_err("startup_check = \"none\"", "startup_check");
        check_err("listen = \"nowhere\"", "listen");
        check_err("listen = 7443", "listen");
        check_err("[limits]\nbogus = 1", "limits.bogus");
        check_err("[elsewhere]\nx = 1", "elsewhere");
        check_err("[limits]\nconnections_max = 0", "limits.connections_max = 0 is out of range; allowed 1..=1000000");
        check_err(
            "[limits]\nstderr_tail_bytes_max = 1048577",
            "limits.stderr_tail_bytes_max = 1048577 is out of range; allowed 0..=1048576",
        );
        check_err(
            "[limits]\nheader_read_timeout = \"20s\"\nidle_timeout = \"15s\"",
            "longer than limits.idle_timeout = 15s",
        );
    }

    #[test]
    fn values_are_taken() {
        let c = HubConfig::from_toml(
            "synchronous = \"normal\"\nlog_format = \"json\"\n[limits]\nclaim_batch_max = 5\nlong_poll_wait_max = \"2s\"",
        )
        .unwrap();
        assert_eq!((c.synchronous, c.log_format), (Synchronous::Normal, LogFormat::Json));
        assert_eq!(c.startup_check, baton_shared::sqlite::Check::Full, "the whole-file check is the default");
        let quick = HubConfig::from_toml("startup_check = \"quick\"").unwrap();
        assert_eq!(quick.startup_check, baton_shared::sqlite::Check::Quick);
        assert_eq!(c.limits.claim_batch_max, 5);
        assert_eq!(c.limits.long_poll_wait_max, Duration::from_secs(2));
        assert_eq!(c.limits.stderr_tail_bytes_max, 64 * 1024, "the default keeps every node's tail whole");
        let none = HubConfig::from_toml("[limits]\nstderr_tail_bytes_max = 0").unwrap();
        assert_eq!(none.limits.stderr_tail_bytes_max, 0);
    }

    /// Each key's flag and variable are derived from its name by the one rule, so the table
    /// cannot drift; and every key is a `serve` flag.
    #[test]
    fn every_key_is_named_by_the_rule_and_is_a_flag() {
        let cmd = Flags::augment_args(clap::Command::new("serve"));
        let cli = <crate::cli::Cli as clap::CommandFactory>::command();
        for key in KEYS {
            assert_eq!(key.name.flag, key.name.name.replace('_', "-"));
            assert_eq!(key.name.env, format!("{ENV_PREFIX}{}", key.name.name.to_ascii_uppercase()));
            let flag = |a: &clap::Arg| a.get_long() == Some(key.name.flag);
            if key.flag_is_global() {
                assert!(cli.get_arguments().any(|a| flag(a) && a.is_global_set()), "{} is global", key.name.flag);
                assert!(!cmd.get_arguments().any(flag), "{} is defined once", key.name.flag);
            } else {
                assert!(cmd.get_arguments().any(flag), "{}", key.name.flag);
            }
        }
        cmd.debug_assert();
    }

    /// Loads `file` (TOML) under `env` and `args` (serve flags).
    fn layered(file: &str, env: &[(&str, &str)], args: &[&str]) -> Result<HubConfig, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.toml");
        std::fs::write(&path, file).unwrap();
        let cmd = Flags::augment_args(clap::Command::new("serve").no_binary_name(true));
        let flags = Flags::from_arg_matches(&cmd.try_get_matches_from(args).unwrap()).unwrap();
        let env: BTreeMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let lookup = move |var: &str| env.get(var).cloned();
        HubConfig::load(Sources { file: None, default_file: &path, env: &lookup, flags: &flags })
    }

    #[test]
    fn a_flag_beats_the_environment_which_beats_the_file() {
        let file = "listen = \"127.0.0.1:1\"\n[limits]\nclaim_batch_max = 5\nretention = \"2h\"\n";
        let c = layered(file, &[], &[]).unwrap();
        assert_eq!((c.listen.port(), c.limits.claim_batch_max, c.limits.retention.as_secs()), (1, 5, 7200));
        let env = [("BATON_HUB_CLAIM_BATCH_MAX", "7"), ("BATON_HUB_LISTEN", "127.0.0.1:2")];
        let c = layered(file, &env, &[]).unwrap();
        assert_eq!((c.listen.port(), c.limits.claim_batch_max, c.limits.retention.as_secs()), (2, 7, 7200));
        let c = layered(file, &env, &["--claim-batch-max", "9", "--listen", "127.0.0.1:3"]).unwrap();
        assert_eq!((c.listen.port(), c.limits.claim_batch_max, c.limits.retention.as_secs()), (3, 9, 7200));
    }

    /// Where the record is: the SQLite file unless a layer names a PostgreSQL URL; a flag beats
    /// the environment, which beats the file, as for every key.
    /// `otlp_endpoint`: off by default; an http(s) URL from the file, the environment or the
    /// flag (highest wins); anything else refused naming the key and where it came from.
    #[test]
    fn otlp_endpoint_is_layered_and_checked_like_every_key() {
        let url = |c: HubConfig| c.otlp_endpoint.map(|e| e.traces_url().to_string());
        assert_eq!(url(layered("", &[], &[]).unwrap()), None, "off by default");
        let file = "otlp_endpoint = \"http://file:4318\"\n";
        assert_eq!(url(layered(file, &[], &[]).unwrap()).as_deref(), Some("http://file:4318/v1/traces"));
        let env = [("BATON_HUB_OTLP_ENDPOINT", "https://env.example/v1/traces")];
        assert_eq!(url(layered(file, &env, &[]).unwrap()).as_deref(), Some("https://env.example/v1/traces"));
        let flag = ["--otlp-endpoint", "http://flag:4318"];
        assert_eq!(url(layered(file, &env, &flag).unwrap()).as_deref(), Some("http://flag:4318/v1/traces"));
        for (bad, why) in [("ftp://x", "http:// or https://"), ("http://x/?q=1", "query"), ("x", "not a URL")] {
            let e = layered(&format!("otlp_endpoint = {bad:?}\n"), &[], &[]).unwrap_err();
            assert!(e.contains("otlp_endpoint") && e.contains(why) && e.contains("hub.toml"), "{bad}: {e}");
            let e = layered("", &[("BATON_HUB_OTLP_ENDPOINT", bad)], &[]).unwrap_err();
            assert!(e.contains("otlp_endpoint") && e.contains("BATON_HUB_OTLP_ENDPOINT"), "{bad}: {e}");
        }
        assert!(template().contains("# otlp_endpoint = \"\"\n"), "the template documents the key, unset");
    }

    #[test]
    fn database_url_is_layered_like_every_key() {
        let shown = |c: HubConfig| c.database_url.map(|u| u.shown().to_string());
        assert_eq!(shown(layered("", &[], &[]).unwrap()), None, "SQLite is the default");
        assert_eq!(shown(layered("database_url = \"\"\n", &[], &[]).unwrap()), None, "empty is SQLite");
        let file = "database_url = \"postgres://f:pw@file.example/rec\"\n";
        assert_eq!(shown(layered(file, &[], &[]).unwrap()).as_deref(), Some("postgres://f@file.example:5432/rec"));
        let env = [("BATON_HUB_DATABASE_URL", "postgres://e@env.example/rec")];
        assert_eq!(shown(layered(file, &env, &[]).unwrap()).as_deref(), Some("postgres://e@env.example:5432/rec"));
        let flags = Flags::none().with_global(&DATABASE_URL, Some("postgres://g@flag.example/rec"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.toml");
        std::fs::write(&path, file).unwrap();
        let lookup = |var: &str| (var == "BATON_HUB_DATABASE_URL").then(|| "postgres://e@env.example/rec".to_string());
        let c = HubConfig::load(Sources { file: None, default_file: &path, env: &lookup, flags: &flags }).unwrap();
        assert_eq!(shown(c).as_deref(), Some("postgres://g@flag.example:5432/rec"));
        assert!(template().contains("# database_url = \"\"\n"), "the template documents the key, unset");
        let written = template_with(Some("postgres://u:p\"w@h/d"));
        let c = HubConfig::from_toml(&written).unwrap();
        assert_eq!(shown(c).as_deref(), Some("postgres://u@h:5432/d"), "the written URL reads back");
    }

    /// A malformed URL is refused naming the key, what is wrong and the layer, never the
    /// password.
    #[test]
    fn a_bad_database_url_is_named_without_its_password() {
        for (file, env, words) in [
            ("database_url = \"mysql://u:s3cret@h/d\"\n", None, "must start with postgres://"),
            ("", Some("postgres://u:s3cret@h/d?sslmode=sometimes"), "sslmode=\"sometimes\""),
            ("", Some("postgres://u:s3cret@h:port/d"), "port"),
            ("database_url = \"postgres://u:s3cret@h/d\n", None, "line 1"),
            ("database_url = \"postgres://u:s3cret@h/d?sslmode=verify-full\"\n", None, "sslrootcert"),
        ] {
            let env: Vec<(&str, &str)> = env.map(|v| ("BATON_HUB_DATABASE_URL", v)).into_iter().collect();
            let e = layered(file, &env, &[]).unwrap_err();
            assert!(e.contains(words), "{e}");
            assert!(!e.contains("s3cret"), "the password is never printed: {e}");
            if !env.is_empty() {
                assert!(
                    e.contains("database_url is not a usable PostgreSQL URL") && e.contains("BATON_HUB_DATABASE_URL"),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn a_refused_value_names_its_layer() {
        let e = layered("", &[("BATON_HUB_CLAIM_BATCH_MAX", "0")], &[]).unwrap_err();
        assert!(
            e.contains("limits.claim_batch_max = 0 is out of range") && e.contains("BATON_HUB_CLAIM_BATCH_MAX"),
            "{e}"
        );
        let e = layered("", &[], &["--retention", "soon"]).unwrap_err();
        assert!(e.contains("limits.retention") && e.contains("--retention"), "{e}");
        let e = layered("[limits]\nclaim_batch_max = 0\n", &[], &[]).unwrap_err();
        assert!(e.contains("hub.toml: limits.claim_batch_max = 0"), "{e}");
        let e = layered("listen = \"nowhere\"\n", &[], &["--listen", "127.0.0.1:0"]).unwrap_err();
        assert!(
            e.contains("hub.toml: listen = \"nowhere\""),
            "an invalid file value is refused even when overridden: {e}"
        );
        let e = layered("", &[("BATON_HUB_SYNCHRONOUS", "off")], &[]).unwrap_err();
        assert!(e.contains("synchronous = \"off\" is not one of \"full\" or \"normal\""), "{e}");
    }

    #[test]
    fn the_operator_listener_takes_an_address_or_off() {
        let default = HubConfig::from_toml("").unwrap().operator_listen;
        assert_eq!(default, Some(OPERATOR_LISTEN_DEFAULT.parse().unwrap()));
        assert!(default.unwrap().ip().is_loopback(), "the default is reachable from this machine only");
        assert_eq!(HubConfig::from_toml("operator_listen = \"off\"").unwrap().operator_listen, None);
        let c = HubConfig::from_toml("operator_listen = \"0.0.0.0:9443\"").unwrap();
        assert_eq!(c.operator_listen, Some("0.0.0.0:9443".parse().unwrap()));
        check_err("operator_listen = \"of\"", "operator_listen = \"of\" is not an ADDR:PORT");
        let e = layered("", &[("BATON_HUB_OPERATOR_LISTEN", "nowhere")], &[]).unwrap_err();
        assert!(e.contains("BATON_HUB_OPERATOR_LISTEN"), "{e}");
        let c = layered("", &[], &["--operator-listen", "off"]).unwrap();
        assert_eq!(c.operator_listen, None);
    }

    /// `operator_hosts` takes names (a list in the file, comma-separated elsewhere), lowercased,
    /// and refuses a port or what is not a name, naming the key and the layer.
    #[test]
    fn operator_hosts_are_names() {
        assert!(HubConfig::from_toml("").unwrap().operator_hosts.is_empty());
        let c = HubConfig::from_toml("operator_hosts = [\"Status.Example.net\", \"hub-1\"]").unwrap();
        assert_eq!(c.operator_hosts, ["status.example.net", "hub-1"]);
        let c = layered("", &[("BATON_HUB_OPERATOR_HOSTS", " a.example , b ")], &[]).unwrap();
        assert_eq!(c.operator_hosts, ["a.example", "b"]);
        check_err(
            "operator_hosts = \"a.example:9443\"",
            "operator_hosts: \"a.example:9443\" is not a host name: give it without a port",
        );
        check_err("operator_hosts = [\"a b\"]", "operator_hosts: \"a b\" is not a host name");
        check_err("operator_hosts = [1]", "operator_hosts: 1 is not a host name");
        let e = layered("", &[], &["--operator-hosts=a..b"]).unwrap_err();
        assert!(e.contains("--operator-hosts"), "{e}");
        assert_eq!(HubConfig::from_toml("").unwrap().operator_connections_per_peer_max, 8);
        check_err(
            "operator_connections_per_peer_max = 65",
            "operator_connections_per_peer_max = 65 is out of range; allowed 1..=64",
        );
        assert_eq!(HubConfig::from_toml("").unwrap().metrics_hosts_max, 1000);
        assert_eq!(HubConfig::from_toml("metrics_hosts_max = 3").unwrap().metrics_hosts_max, 3);
        check_err("metrics_hosts_max = 0", "metrics_hosts_max = 0 is out of range; allowed 1..=100000");
        let d = HubConfig::from_toml("").unwrap();
        assert_eq!((d.gauge_interval, d.gauge_read_share), (Duration::from_secs(10), 5));
        let set = HubConfig::from_toml("gauge_interval = \"30s\"\ngauge_read_share = 20").unwrap();
        assert_eq!((set.gauge_interval, set.gauge_read_share), (Duration::from_secs(30), 20));
        check_err("gauge_read_share = 0", "gauge_read_share = 0 is out of range; allowed 1..=100");
        check_err("gauge_interval = \"500ms\"", "gauge_interval");
    }

    #[test]
    fn durations_are_written_in_their_largest_unit() {
        for (d, text) in [(0, "0s"), (250, "250ms"), (30_000, "30s"), (3_600_000, "1h"), (604_800_000, "7d")] {
            assert_eq!(humanize(Duration::from_millis(d)), text);
        }
    }
}
