//! The hub's configuration, layered key by key: default < file (`DIR/hub.toml` or `--config`)
//! < environment (`BATON_HUB_<KEY>`) < flag (`serve --key`), then validated into a `HubConfig`
//! before the hub does any work. The node follows the same rule.
//!
//! Every key is declared once, below, with its doc, default and range; the file parser, the
//! environment, `serve`'s flags (`Flags`), the template `init` writes and `--help` are all
//! derived from that one declaration. Unknown keys in the file and out-of-range values are
//! refused with a message that names the field, its allowed range, and where the value came
//! from.

use baton_shared::limits::*;
use baton_shared::logging::LogFormat;
use baton_shared::sqlite::Synchronous;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The listen address used when no layer names one.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:7443";
/// How long a TLS handshake may take before the connection is dropped (slowloris guard).
pub const HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// How long shutdown waits for open requests.
pub const SHUTDOWN_GRACE_DEFAULT: Duration = Duration::from_secs(10);
/// The prefix of every key's environment variable.
pub const ENV_PREFIX: &str = "BATON_HUB_";
/// Bytes of a request left for everything but the payload or result (ids, field names).
const REQUEST_OVERHEAD_BYTES: u64 = 4096;
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
          changes on power failure (warned about)",
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
/// `limits.payload_bytes_max`.
pub const PAYLOAD_BYTES_MAX: Key = Key {
    name: key_name!(Some("limits"), "payload_bytes_max", "payload-bytes-max", "BATON_HUB_PAYLOAD_BYTES_MAX"),
    kind: KeyKind::Int { default: PAYLOAD_BYTES_MAX_DEFAULT, min: 1, max: 16 * MIB },
    doc: "bytes of serialised payload JSON per message",
};
/// `limits.result_bytes_max`.
pub const RESULT_BYTES_MAX: Key = Key {
    name: key_name!(Some("limits"), "result_bytes_max", "result-bytes-max", "BATON_HUB_RESULT_BYTES_MAX"),
    kind: KeyKind::Int { default: RESULT_BYTES_MAX_DEFAULT, min: 1, max: 16 * MIB },
    doc: "bytes of a report's result body",
};
/// `limits.claim_batch_max`.
pub const CLAIM_BATCH_MAX: Key = Key {
    name: key_name!(Some("limits"), "claim_batch_max", "claim-batch-max", "BATON_HUB_CLAIM_BATCH_MAX"),
    kind: KeyKind::Int { default: CLAIM_BATCH_MAX_DEFAULT as u64, min: 1, max: 1000 },
    doc: "deliveries per claim",
};
/// `limits.long_poll_wait_max`.
pub const LONG_POLL_WAIT_MAX: Key = Key {
    name: key_name!(Some("limits"), "long_poll_wait_max", "long-poll-wait-max", "BATON_HUB_LONG_POLL_WAIT_MAX"),
    kind: KeyKind::Duration { default: LONG_POLL_WAIT_MAX_DEFAULT, min: Duration::ZERO, max: Duration::from_secs(300) },
    doc: "longest wait of a claim or a message read",
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

/// Every key, in the order of the template.
pub const KEYS: [&Key; 13] = [
    &LISTEN,
    &SYNCHRONOUS,
    &SHUTDOWN_GRACE,
    &LOG_FORMAT,
    &PAYLOAD_BYTES_MAX,
    &RESULT_BYTES_MAX,
    &CLAIM_BATCH_MAX,
    &LONG_POLL_WAIT_MAX,
    &RECIPIENTS_MAX,
    &QUEUED_PER_HOST_MAX,
    &RETENTION,
    &REQUEST_BODY_BYTES_MAX,
    &HANDSHAKE_TIMEOUT,
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
            KeyKind::Addr { default } | KeyKind::Choice { default, .. } => format!("{default:?}"),
        }
    }

    /// The placeholder `--help` shows for the flag's value.
    fn value_name(&self) -> &'static str {
        match self.kind {
            KeyKind::Int { .. } => "N",
            KeyKind::Duration { .. } => "DURATION",
            KeyKind::Addr { .. } => "ADDR:PORT",
            KeyKind::Choice { .. } => "WORD",
        }
    }
}

/// Where a value came from, named in messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The key's default.
    Default,
    /// The configuration file.
    File(PathBuf),
    /// Its environment variable.
    Env(&'static str),
    /// Its `serve` flag.
    Flag(&'static str),
}

impl Source {
    /// Puts the source into a message about a value.
    fn tell(&self, message: String) -> String {
        match self {
            Source::Default => message,
            Source::File(p) => format!("{}: {message}", p.display()),
            Source::Env(var) => format!("{message} (from {var})"),
            Source::Flag(flag) => format!("{message} (from --{flag})"),
        }
    }
}

/// One raw value as a layer gave it: TOML from the file, text from the environment or a flag.
#[derive(Debug, Clone)]
enum Raw {
    Toml(toml::Value),
    Text(String),
}

/// The layers, key by key: every value given for a key, lowest layer first. Every one of them
/// is validated (an invalid file value is refused even when a flag overrides it); the highest
/// one is used.
#[derive(Debug, Default)]
struct Merged {
    values: BTreeMap<String, Vec<(Raw, Source)>>,
}

impl Merged {
    fn add(&mut self, key: &Key, raw: Raw, source: Source) {
        self.values.entry(key.name.field()).or_default().push((raw, source));
    }

    /// Parses every value given for `key` with `parse`; the highest layer's, or `default`.
    fn resolve<T>(
        &self,
        key: &Key,
        default: T,
        parse: impl Fn(&Raw, &Source) -> Result<T, String>,
    ) -> Result<T, String> {
        let mut value = default;
        for (raw, source) in self.values.get(&key.name.field()).map(Vec::as_slice).unwrap_or_default() {
            value = parse(raw, source)?;
        }
        Ok(value)
    }

    fn int(&self, key: &Key) -> Result<u64, String> {
        let KeyKind::Int { default, min, max } = key.kind else {
            return Err(format!("{}: not a whole-number key", key.name.field()));
        };
        let field = key.name.field();
        self.resolve(key, default, |raw, source| {
            let out_of_range = |v: &dyn std::fmt::Display| {
                source.tell(format!("{field} = {v} is out of range; allowed {min}..={max}"))
            };
            let v: i128 = match raw {
                Raw::Toml(toml::Value::Integer(i)) => i128::from(*i),
                Raw::Text(t) => t.trim().parse().map_err(|_| {
                    source.tell(format!("{field} = {t:?} is not a whole number; allowed {min}..={max}"))
                })?,
                Raw::Toml(other) => {
                    return Err(source.tell(format!("{field} = {other} is not a whole number; allowed {min}..={max}")));
                }
            };
            if v < i128::from(min) || v > i128::from(max) {
                return Err(out_of_range(&v));
            }
            u64::try_from(v).map_err(|_| out_of_range(&v))
        })
    }

    fn duration(&self, key: &Key) -> Result<Duration, String> {
        let KeyKind::Duration { default, min, max } = key.kind else {
            return Err(format!("{}: not a duration key", key.name.field()));
        };
        let field = key.name.field();
        self.resolve(key, default, |raw, source| {
            let d = baton_shared::duration::parse(&field, text(raw, &field, source)?).map_err(|e| source.tell(e))?;
            if d < min || d > max {
                let range = key.range();
                return Err(source.tell(format!("{field} = {} is out of range; allowed {range}", humanize(d))));
            }
            Ok(d)
        })
    }

    fn addr(&self, key: &Key) -> Result<SocketAddr, String> {
        let KeyKind::Addr { default } = key.kind else {
            return Err(format!("{}: not an address key", key.name.field()));
        };
        let field = key.name.field();
        let parse = |value: &str, source: &Source| {
            value.parse().map_err(|_| {
                source.tell(format!("{field} = {value:?} is not an ADDR:PORT such as \"{LISTEN_DEFAULT}\""))
            })
        };
        let default = parse(default, &Source::Default)?;
        self.resolve(key, default, |raw, source| parse(text(raw, &field, source)?, source))
    }

    fn choice(&self, key: &Key) -> Result<&'static str, String> {
        let KeyKind::Choice { default, allowed } = key.kind else {
            return Err(format!("{}: not a choice key", key.name.field()));
        };
        let field = key.name.field();
        self.resolve(key, default, |raw, source| {
            let value = text(raw, &field, source)?;
            allowed
                .iter()
                .find(|a| **a == value)
                .copied()
                .ok_or_else(|| source.tell(format!("{field} = {value:?} is not one of {}", key.range())))
        })
    }
}

/// The text of a value that must be a string.
fn text<'a>(raw: &'a Raw, field: &str, source: &Source) -> Result<&'a str, String> {
    match raw {
        Raw::Text(t) => Ok(t),
        Raw::Toml(toml::Value::String(s)) => Ok(s),
        Raw::Toml(other) => Err(source.tell(format!("{field} = {other} must be a string"))),
    }
}

/// Values given as `serve` flags, one per key; clap builds it from `KEYS` (see its `Args`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    given: Vec<(Key, String)>,
}

impl Flags {
    /// No flags (every command but `serve`).
    pub fn none() -> Flags {
        Flags::default()
    }
}

impl clap::FromArgMatches for Flags {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = Flags::default();
        flags.update_from_arg_matches(m)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        for key in KEYS {
            let value = m
                .try_get_one::<String>(key.name.flag)
                .map_err(|e| clap::Error::raw(clap::error::ErrorKind::ArgumentConflict, e))?;
            if let Some(v) = value {
                self.given.retain(|(k, _)| k != key);
                self.given.push((*key, v.clone()));
            }
        }
        Ok(())
    }
}

impl clap::Args for Flags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        KEYS.iter().fold(cmd, |cmd, key| {
            let help = format!(
                "{} [env: {}] [file: {}] [default: {}] [allowed: {}]",
                key.doc,
                key.name.env,
                key.name.field(),
                key.default_toml().trim_matches('"'),
                key.range()
            );
            cmd.arg(clap::Arg::new(key.name.flag).long(key.name.flag).value_name(key.value_name()).help(help))
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// Every bound the hub enforces, with its configured value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload (serialised JSON), bytes.
    pub payload_bytes_max: u64,
    /// Largest result body in a report, bytes.
    pub result_bytes_max: u64,
    /// Most deliveries one claim returns.
    pub claim_batch_max: u32,
    /// Longest a long-poll (claim or message read) waits.
    pub long_poll_wait_max: Duration,
    /// Most recipients one message may name.
    pub recipients_max: u32,
    /// Most deliveries waiting (queued or held) per host.
    pub queued_per_host_max: u64,
    /// How long messages (and their idempotency keys) are kept once settled.
    pub retention: Duration,
    /// Largest request body read, bytes.
    pub request_body_bytes_max: u64,
    /// Longest TLS handshake.
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            payload_bytes_max: PAYLOAD_BYTES_MAX_DEFAULT,
            result_bytes_max: RESULT_BYTES_MAX_DEFAULT,
            claim_batch_max: CLAIM_BATCH_MAX_DEFAULT,
            long_poll_wait_max: LONG_POLL_WAIT_MAX_DEFAULT,
            recipients_max: RECIPIENTS_MAX_DEFAULT,
            queued_per_host_max: QUEUED_PER_HOST_MAX_DEFAULT,
            retention: RETENTION_DEFAULT,
            request_body_bytes_max: REQUEST_BODY_BYTES_MAX_DEFAULT,
            handshake_timeout: HANDSHAKE_TIMEOUT_DEFAULT,
        }
    }
}

/// The validated hub configuration.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// SQLite `synchronous`; anything below full is warned about at start.
    pub synchronous: Synchronous,
    /// Bounds.
    pub limits: Limits,
    /// How long shutdown waits for open requests.
    pub shutdown_grace: Duration,
    /// How log lines are written.
    pub log_format: LogFormat,
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
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
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
            claim_batch_max: narrow(&CLAIM_BATCH_MAX)?,
            long_poll_wait_max: m.duration(&LONG_POLL_WAIT_MAX)?,
            recipients_max: narrow(&RECIPIENTS_MAX)?,
            queued_per_host_max: m.int(&QUEUED_PER_HOST_MAX)?,
            retention: m.duration(&RETENTION)?,
            request_body_bytes_max: m.int(&REQUEST_BODY_BYTES_MAX)?,
            handshake_timeout: m.duration(&HANDSHAKE_TIMEOUT)?,
        };
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
        let log_format = match m.choice(&LOG_FORMAT)? {
            "json" => LogFormat::Json,
            _ => LogFormat::Text,
        };
        Ok(HubConfig {
            listen: m.addr(&LISTEN)?,
            synchronous,
            limits,
            shutdown_grace: m.duration(&SHUTDOWN_GRACE)?,
            log_format,
        })
    }
}

/// Reads the file's keys into `merged`, refusing a key no `Key` declares.
fn read_file(text: &str, path: &Path, merged: &mut Merged) -> Result<(), String> {
    let shown = path.display();
    let table: toml::Table = toml::from_str(text).map_err(|e| format!("{shown}: {e}"))?;
    for (name, value) in table {
        match value {
            toml::Value::Table(inner) if KEYS.iter().any(|k| k.name.section == Some(name.as_str())) => {
                for (leaf, v) in inner {
                    let key = KEYS.iter().find(|k| k.name.section == Some(name.as_str()) && k.name.name == leaf);
                    let Some(key) = key else {
                        return Err(format!("{shown}: unknown key {name}.{leaf}"));
                    };
                    merged.add(key, Raw::Toml(v), Source::File(path.to_path_buf()));
                }
            }
            v => {
                let key = KEYS.iter().find(|k| k.name.section.is_none() && k.name.name == name);
                let Some(key) = key else {
                    return Err(format!("{shown}: unknown key {name}"));
                };
                merged.add(key, Raw::Toml(v), Source::File(path.to_path_buf()));
            }
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};

    fn check_err(text: &str, needle: &str) {
        let e = HubConfig::from_toml(text).unwrap_err();
        assert!(e.contains(needle), "{e:?} should mention {needle:?}");
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
        check_err("[limits]\nclaim_batch_max = \"5\"", "limits.claim_batch_max");
        check_err("[limits]\nlong_poll_wait_max = \"1h\"", "limits.long_poll_wait_max = 1h is out of range");
        check_err("[limits]\nretention = \"soon\"", "limits.retention");
        check_err("[limits]\nretention = \"1m\"", "allowed 1h..=3650d");
        check_err("[limits]\npayload_bytes_max = 2000000", "limits.payload_bytes_max");
        check_err("synchronous = \"off\"", "synchronous");
        check_err("listen = \"nowhere\"", "listen");
        check_err("listen = 7443", "listen");
        check_err("[limits]\nbogus = 1", "limits.bogus");
        check_err("[elsewhere]\nx = 1", "elsewhere");
    }

    #[test]
    fn values_are_taken() {
        let c = HubConfig::from_toml(
            "synchronous = \"normal\"\nlog_format = \"json\"\n[limits]\nclaim_batch_max = 5\nlong_poll_wait_max = \"2s\"",
        )
        .unwrap();
        assert_eq!((c.synchronous, c.log_format), (Synchronous::Normal, LogFormat::Json));
        assert_eq!(c.limits.claim_batch_max, 5);
        assert_eq!(c.limits.long_poll_wait_max, Duration::from_secs(2));
    }

    /// Each key's flag and variable are derived from its name by the one rule, so the table
    /// cannot drift; and every key is a `serve` flag.
    #[test]
    fn every_key_is_named_by_the_rule_and_is_a_flag() {
        let cmd = Flags::augment_args(clap::Command::new("serve"));
        for key in KEYS {
            assert_eq!(key.name.flag, key.name.name.replace('_', "-"));
            assert_eq!(key.name.env, format!("{ENV_PREFIX}{}", key.name.name.to_ascii_uppercase()));
            assert!(cmd.get_arguments().any(|a| a.get_long() == Some(key.name.flag)), "{}", key.name.flag);
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
    fn durations_are_written_in_their_largest_unit() {
        for (d, text) in [(0, "0s"), (250, "250ms"), (30_000, "30s"), (3_600_000, "1h"), (604_800_000, "7d")] {
            assert_eq!(humanize(Duration::from_millis(d)), text);
        }
    }
}
