//! Node configuration: a TOML file, `BATON_NODE_<KEY>` environment variables and command-line
//! flags, stacked key by key (flag > environment > file > default) and validated into a
//! `NodeConfig` before the node does any work.
//!
//! Each key is declared once, in the `keys!` table below: its doc, its Rust type, its kind with
//! default and allowed range (from `limits`). The table yields the `KEYS` list (`--help`, the
//! environment variables, the file's known keys), the `NodeConfig` fields and the `ConfigFlags`
//! flags. Every layer checks its values as it reads them (`key`), so a message names the key and
//! the allowed range whichever layer was wrong; `layer` stacks them.

mod key;
mod layer;

pub use key::{Key, Kind};
pub use layer::Layer;

use crate::limits::*;
use baton_shared::sqlite::Synchronous;
use key::Words as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use baton_shared::logging::LogFormat;

/// Why a configuration was refused. Every message names the field (or the file).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error, part of the message (not a chained source, which `{:#}` would print
        /// a second time).
        reason: std::io::Error,
    },
    /// The config file is not valid TOML, or names a key that does not exist.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong: the TOML parser's message (with the line), or the unknown key.
        message: String,
    },
    /// A value is out of range, malformed or of the wrong type (in whichever layer).
    #[error("{field}: {message}")]
    Invalid {
        /// The key.
        field: &'static str,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// What a key names failed a check (`check`): the certificate files, the harness program,
    /// the key's match with the certificate, the certificate's role, chain or validity, or the
    /// hub. The detail begins with the key.
    #[error("{detail}")]
    Check {
        /// The key the check concerns most (`cert_file`, `command`…).
        field: &'static str,
        /// What is wrong and how to fix it.
        detail: String,
    },
    /// A required key was given nowhere.
    #[error("{field} is required: set it in the config file, with {flag} or with {env}")]
    Missing {
        /// The key.
        field: &'static str,
        /// Its flag, `--hub-url`.
        flag: String,
        /// Its environment variable.
        env: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        ConfigError::Invalid { field, message: message.into() }
    }
}

/// Declares every configuration key once and derives from that one list the `KEYS` table,
/// the `NodeConfig` struct (the doc becomes the field's doc) and the `ConfigFlags` flags (the
/// doc, range, default and environment variable become the flag's help).
macro_rules! keys {
    ($($(#[doc = $doc:literal])+ $name:ident: $ty:ty = $kind:expr;)+) => {
        /// Every configuration key, in the order `--help` lists them.
        pub const KEYS: &[Key] = &[$(Key { name: stringify!($name), doc: concat!($($doc, "\n"),+), kind: $kind }),+];

        /// A validated node configuration. Built only by `NodeConfig::resolve` (or `validate`),
        /// so holding one means every key is present and in range.
        #[derive(Debug, Clone)]
        pub struct NodeConfig {
            $($(#[doc = $doc])+ pub $name: $ty,)+
        }

        /// One flag per configuration key; `--help` shows each key's range, default and
        /// environment variable.
        #[derive(Debug, Default, clap::Args)]
        pub struct ConfigFlags {
            $(#[arg(long, value_name = Kind::value_name(&$kind), help = Key::help_for(stringify!($name)))]
            $name: Option<String>,)+
        }

        impl ConfigFlags {
            /// The flags given, as a configuration layer.
            pub fn layer(&self) -> Result<Layer, ConfigError> {
                let mut layer = Layer::default();
                $(if let Some(text) = &self.$name {
                    layer.set(stringify!($name), text)?;
                })+
                Ok(layer)
            }
        }

        impl NodeConfig {
            /// Every field from the merged layer, or its key's default.
            fn from_layer(mut layer: Layer) -> Result<NodeConfig, ConfigError> {
                Ok(NodeConfig { $($name: layer.take(stringify!($name))?,)+ })
            }
        }
    };
}

keys! {
    /// The hub's base URL, or several hubs over one shared record: `https://` only (the hub
    /// requires mTLS), each kept without a trailing slash, none twice. In the file a string or
    /// an array of strings; as a flag or variable a comma-separated list. The node talks to one
    /// at a time and moves to the next (round robin) when that one does not answer or answers
    /// 503, then resyncs its holdings.
    hub_url: HubUrls = Kind::HttpsUrl;
    /// PEM file with the hub CA certificate, the only trusted root.
    ca_file: PathBuf = Kind::Path;
    /// PEM file with this host's client certificate.
    cert_file: PathBuf = Kind::Path;
    /// PEM file with this host's private key.
    key_file: PathBuf = Kind::Path;
    /// Directory of the node store (`node.db`) and its lock file; it is the instance's identity.
    data_dir: PathBuf = Kind::Path;
    /// The harness argv, run without a shell: in the file an array of strings; as a flag or a
    /// variable a JSON array ('["/usr/bin/harness","--turn"]') or one program path. Required
    /// unless `harness` is `noop`.
    command: Vec<String> = Kind::Argv;
    /// Conversations that may run a turn at the same time.
    parallel_conversations: u32 =
        Kind::Count { default: PARALLEL_CONVERSATIONS_DEFAULT, range: PARALLEL_CONVERSATIONS_RANGE };
    /// How long one turn may run before its process group is stopped (`failed`, `timeout`):
    /// SIGTERM, then SIGKILL after `kill_grace`.
    exec_timeout: Duration = Kind::Duration { default: EXEC_TIMEOUT_DEFAULT, range: EXEC_TIMEOUT_RANGE };
    /// How long one claim long-poll asks the hub to wait for work.
    claim_wait: Duration = Kind::Duration { default: CLAIM_WAIT_DEFAULT, range: CLAIM_WAIT_RANGE };
    /// Most deliveries asked for in one claim.
    claim_batch_max: u32 = Kind::Count { default: CLAIM_BATCH_MAX_DEFAULT, range: CLAIM_BATCH_MAX_RANGE };
    /// Claim batches that may wait here unstarted before the node stops claiming, so work it
    /// cannot start soon stays queued on the hub, where fences and operators see it.
    queue_ahead_batches: u32 =
        Kind::Count { default: QUEUE_AHEAD_BATCHES_DEFAULT, range: QUEUE_AHEAD_BATCHES_RANGE };
    /// Claim batches that may be mirrored and handed off while the next claim waits at the hub.
    /// More lets a node that gets many small batches (lone messages at a high rate) claim again
    /// sooner; fewer makes the batches larger when the node is saturated.
    handoffs_in_flight: u32 =
        Kind::Count { default: HANDOFFS_IN_FLIGHT_DEFAULT, range: HANDOFFS_IN_FLIGHT_RANGE };
    /// Most bytes the node store may hold (its pages in use): past it the node claims no new
    /// work, and says why in its log and in `status`, while it keeps running, resuming and
    /// reporting what it holds, until `local_retention` frees room.
    store_bytes_max: u64 = Kind::Count { default: STORE_BYTES_MAX_DEFAULT, range: STORE_BYTES_MAX_RANGE };
    /// Most bytes of stdout kept as an attempt's result (a truncation marker counts inside it).
    result_bytes_max: usize = Kind::Count { default: RESULT_BYTES_MAX_DEFAULT, range: RESULT_BYTES_MAX_RANGE };
    /// Most bytes of the end of the harness's stderr sent with each attempt's report (the last
    /// ones, from a character boundary, with how many came before); 0 sends none. The node's log
    /// still gets its stderr line by line.
    stderr_tail_bytes: usize = Kind::Count { default: STDERR_TAIL_BYTES_DEFAULT, range: STDERR_TAIL_BYTES_RANGE };
    /// How long running turns may finish after the node gets SIGTERM; then their process groups
    /// get SIGTERM, and SIGKILL after `kill_grace`.
    shutdown_grace: Duration = Kind::Duration { default: SHUTDOWN_GRACE_DEFAULT, range: SHUTDOWN_GRACE_RANGE };
    /// How long a harness process group sent SIGTERM (at a timeout, at shutdown after
    /// `shutdown_grace`, or left behind by a crashed node and found at the next start) may take
    /// to end before the node sends it SIGKILL.
    kill_grace: Duration = Kind::Duration { default: KILL_GRACE_DEFAULT, range: KILL_GRACE_RANGE };
    /// How long a running turn that was cancelled (by an operator or the producer, through the
    /// hub) may take to end after SIGTERM to its process group before the node sends it SIGKILL;
    /// it is then reported `cancelled` with what the process returned.
    cancel_grace: Duration = Kind::Duration { default: CANCEL_GRACE_DEFAULT, range: CANCEL_GRACE_RANGE };
    /// How often, at least, the node tells the hub which turns run now (one `POST /v1/running`
    /// for all of them): a host whose node stops telling it is shown silent, with its running
    /// turns, once the hub's `host_silence_warn` passes. Keep it well below that.
    renew_interval: Duration = Kind::Duration { default: RENEW_INTERVAL_DEFAULT, range: RENEW_INTERVAL_RANGE };
    /// How long progress events may gather before they are forwarded (with the renewal): the
    /// delay a follower sees, against one request per interval however many events come.
    progress_flush_interval: Duration =
        Kind::Duration { default: PROGRESS_FLUSH_INTERVAL_DEFAULT, range: PROGRESS_FLUSH_INTERVAL_RANGE };
    /// Longest progress line (bytes, its newline excluded) a harness may write on its progress
    /// channel (`BATON_PROGRESS_FD`); a longer one is dropped and counted.
    progress_event_bytes_max: usize = Kind::Count {
        default: baton_shared::limits::PROGRESS_EVENT_BYTES_MAX_DEFAULT,
        range: baton_shared::limits::PROGRESS_EVENT_BYTES_MAX_RANGE
    };
    /// Most progress events of one run forwarded; later ones are dropped and counted (0
    /// forwards none).
    progress_events_per_turn_max: u64 = Kind::Count {
        default: baton_shared::limits::PROGRESS_EVENTS_PER_TURN_MAX_DEFAULT,
        range: baton_shared::limits::PROGRESS_EVENTS_PER_TURN_MAX_RANGE
    };
    /// Most progress events of one run forwarded per second (a burst of as many is allowed);
    /// beyond it events are dropped and counted.
    progress_events_per_second_max: u64 =
        Kind::Count { default: PROGRESS_EVENTS_PER_SECOND_MAX_DEFAULT, range: PROGRESS_EVENTS_PER_SECOND_MAX_RANGE };
    /// Most progress events waiting in memory to be forwarded, all turns together (while the
    /// hub does not answer they wait here); beyond it new events are dropped and counted.
    progress_buffer_events_max: usize =
        Kind::Count { default: PROGRESS_BUFFER_EVENTS_MAX_DEFAULT, range: PROGRESS_BUFFER_EVENTS_MAX_RANGE };
    /// How long the node keeps the local rows of a turn whose report the hub confirmed (and of
    /// a delivery the hub took back before it ran); older ones are removed, so the store stays
    /// bounded. Within it, a turn the hub hands out again is recognised and never run twice.
    local_retention: Duration = Kind::Duration { default: LOCAL_RETENTION_DEFAULT, range: LOCAL_RETENTION_RANGE };
    /// Longest pause between retries while the hub is unreachable.
    backoff_max: Duration = Kind::Duration { default: BACKOFF_MAX_DEFAULT, range: BACKOFF_MAX_RANGE };
    /// Log line format on stderr (the filter is the BATON_LOG variable).
    log_format: LogFormat = Kind::Word(LogFormat::WORDS);
    /// What runs a turn: the `command` argv, or an in-process no-op for benchmarks.
    harness: Harness = Kind::Word(Harness::WORDS);
    /// The store's durability: `full` fsyncs every commit; `normal` is faster but a power
    /// failure can lose a start marker, and that turn can then run twice.
    synchronous: Synchronous = Kind::Word(Synchronous::WORDS);
    /// How often the store's write-ahead log is copied into the file, on a thread of its own
    /// (the store's connection does it itself only past 10,000 pages of log); with
    /// `synchronous` set to `normal` it is also the most a power failure can lose.
    checkpoint_interval: Duration =
        Kind::Duration { default: CHECKPOINT_INTERVAL_DEFAULT, range: CHECKPOINT_INTERVAL_RANGE };
    /// How a claim batch is handed off once mirrored: `combined` asks the hub for `mirrored`
    /// and `ack` in one request (`POST /v1/batch/handoff`, one hub transaction); `separate`
    /// sends them as two requests, as nodes did before. A hub that predates the combined
    /// request is noticed at its first 404 and gets two.
    handoff: Handoff = Kind::Word(Handoff::WORDS);
    /// Where the node serves Prometheus metrics (`GET /metrics`, plain HTTP, no certificate):
    /// `ADDR:PORT`, a port alone (on 127.0.0.1), or `off` (the default: no listener). Port 0
    /// picks a free port. The bound address is written to `data_dir/metrics.addr`. Bind it
    /// beyond loopback only on a network you trust.
    metrics_listen: Option<std::net::SocketAddr> = Kind::Listen;
    /// Where the node exports its spans of each delivery (handoff, start, run, report, in the
    /// producer's trace) over OTLP/HTTP: an `http://` or `https://` URL of a collector
    /// (`http://collector:4318`, to which `/v1/traces` is added, or the full traces URL), or
    /// empty (the default): no spans are made or exported.
    otlp_endpoint: Option<baton_telemetry::OtlpEndpoint> = Kind::OtlpUrl;
}

/// The hubs a node may talk to (`hub_url`), in the order given: at least one, at most
/// `HUB_URLS_MAX`, each an `https://` URL without a trailing slash, no hub twice. Built only by
/// the `hub_url` key's checks (from a layer, or `parse` of its flag form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubUrls(Vec<String>);

impl HubUrls {
    /// Every URL, in order; the node starts with the first.
    pub fn urls(&self) -> &[String] {
        &self.0
    }
}

impl std::fmt::Display for HubUrls {
    /// The URLs as the flag writes them: comma-separated.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

impl std::str::FromStr for HubUrls {
    type Err = ConfigError;

    /// The `hub_url` key's flag form, `https://a:7443,https://b:7443`, with its checks.
    fn from_str(s: &str) -> Result<HubUrls, ConfigError> {
        let mut layer = Layer::default();
        layer.set("hub_url", s)?;
        layer.take("hub_url")
    }
}

/// What runs a delivered turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Harness {
    /// The configured `command` argv, in its own process group.
    Command,
    /// An in-process no-op that succeeds at once. Everything else (mirror, ack, markers,
    /// report) goes through the real code; used by benchmarks.
    Noop,
}

/// How a mirrored claim batch is handed off (`handoff`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handoff {
    /// `mirrored` and `ack` in one request and one hub transaction.
    Combined,
    /// `mirrored`, then `ack`: two requests, two hub transactions.
    Separate,
}

impl NodeConfig {
    /// Stacks the layers (flags over environment over file over defaults) and validates the
    /// result.
    pub fn resolve(file: Layer, env: Layer, flags: Layer) -> Result<NodeConfig, ConfigError> {
        NodeConfig::validate(file.overlaid_with(env).overlaid_with(flags))
    }

    /// Validates one merged layer, filling defaults, then checks the keys that depend on each
    /// other.
    pub fn validate(layer: Layer) -> Result<NodeConfig, ConfigError> {
        let config = NodeConfig::from_layer(layer)?;
        if config.harness == Harness::Command {
            match config.command.first() {
                None => {
                    return Err(ConfigError::invalid(
                        "command",
                        "must be a non-empty argv array such as [\"/usr/bin/harness\", \"--turn\"]",
                    ));
                }
                Some(program) if program.is_empty() => {
                    return Err(ConfigError::invalid("command", "the program (first element) must not be empty"));
                }
                Some(_) => {}
            }
        }
        Ok(config)
    }

    /// The node store's path.
    pub fn db_path(&self) -> PathBuf {
        db_path(&self.data_dir)
    }
}

/// The node store's path inside a data directory.
pub fn db_path(data_dir: &Path) -> PathBuf {
    data_dir.join("node.db")
}

#[cfg(test)]
mod tests;
