//! Node configuration: a TOML file, `BATON_NODE_<KEY>` environment variables and command-line
//! flags, merged key by key (flag > env > file > default) and validated into a `NodeConfig`
//! before the node does any work.
//!
//! Every layer is first read into the same loose `RawConfig` (all keys optional, durations
//! and numbers kept wide) so that validation happens once, with messages that name the field
//! and the allowed range.

use crate::limits::*;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Every configuration key, as written in the file; the flag is `--key-with-dashes` and the
/// environment variable `BATON_NODE_KEY_IN_CAPITALS`.
pub const KEYS: [&str; 17] = [
    "hub_url",
    "ca_file",
    "cert_file",
    "key_file",
    "data_dir",
    "command",
    "parallel_conversations",
    "exec_timeout",
    "claim_wait",
    "claim_batch_max",
    "queue_ahead_batches",
    "result_bytes_max",
    "shutdown_grace",
    "backoff_max",
    "log_format",
    "harness",
    "synchronous",
];

/// The environment variable that sets `key`.
pub fn env_var(key: &str) -> String {
    format!("BATON_NODE_{}", key.to_ascii_uppercase())
}

/// Why a configuration was refused. Every message names the field (or the file).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid TOML, or has an unknown key or a value of the wrong type.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What the TOML parser said (it names the key and the line).
        message: String,
    },
    /// A value is out of range or malformed.
    #[error("{field}: {message}")]
    Invalid {
        /// The key.
        field: &'static str,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// A required key was given nowhere.
    #[error("{field} is required: set it in the config file, with --{flag} or with {env}")]
    Missing {
        /// The key.
        field: &'static str,
        /// Its flag name.
        flag: String,
        /// Its environment variable.
        env: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        ConfigError::Invalid { field, message: message.into() }
    }

    fn missing(field: &'static str) -> Self {
        ConfigError::Missing { field, flag: field.replace('_', "-"), env: env_var(field) }
    }
}

/// One configuration layer as written: every key optional, not yet validated.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// See `NodeConfig::hub_url`.
    pub hub_url: Option<String>,
    /// See `NodeConfig::ca_file`.
    pub ca_file: Option<PathBuf>,
    /// See `NodeConfig::cert_file`.
    pub cert_file: Option<PathBuf>,
    /// See `NodeConfig::key_file`.
    pub key_file: Option<PathBuf>,
    /// See `NodeConfig::data_dir`.
    pub data_dir: Option<PathBuf>,
    /// See `NodeConfig::command`.
    pub command: Option<Vec<String>>,
    /// See `NodeConfig::parallel_conversations`.
    pub parallel_conversations: Option<i64>,
    /// See `NodeConfig::exec_timeout`.
    pub exec_timeout: Option<String>,
    /// See `NodeConfig::claim_wait`.
    pub claim_wait: Option<String>,
    /// See `NodeConfig::claim_batch_max`.
    pub claim_batch_max: Option<i64>,
    /// See `NodeConfig::queue_ahead_batches`.
    pub queue_ahead_batches: Option<i64>,
    /// See `NodeConfig::result_bytes_max`.
    pub result_bytes_max: Option<i64>,
    /// See `NodeConfig::shutdown_grace`.
    pub shutdown_grace: Option<String>,
    /// See `NodeConfig::backoff_max`.
    pub backoff_max: Option<String>,
    /// See `NodeConfig::log_format`.
    pub log_format: Option<String>,
    /// See `NodeConfig::harness`.
    pub harness: Option<String>,
    /// See `NodeConfig::synchronous`.
    pub synchronous: Option<String>,
}

impl RawConfig {
    /// Reads and parses a TOML config file.
    pub fn from_file(path: &Path) -> Result<RawConfig, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: shown.clone(), source })?;
        RawConfig::from_toml(&shown, &text)
    }

    /// Parses TOML text; `shown` names its origin in errors.
    pub fn from_toml(shown: &str, text: &str) -> Result<RawConfig, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse { path: shown.to_string(), message: e.to_string() })
    }

    /// Reads the `BATON_NODE_<KEY>` variables through `lookup` (the process environment in
    /// production, a map in tests).
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<RawConfig, ConfigError> {
        let mut raw = RawConfig::default();
        for key in KEYS {
            if let Some(value) = lookup(&env_var(key)) {
                raw.set(key, &value)?;
            }
        }
        Ok(raw)
    }

    /// Sets one key from its string form (a flag or an environment variable).
    ///
    /// `command` takes a JSON array (`["sh", "-c", "cat"]`), or a single program path.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let field = KEYS
            .into_iter()
            .find(|k| *k == key)
            .ok_or_else(|| ConfigError::Invalid { field: "config", message: format!("unknown key {key:?}") })?;
        let int = |v: &str| {
            v.trim().parse::<i64>().map_err(|_| ConfigError::invalid(field, format!("{v:?} is not a whole number")))
        };
        let text = Some(value.to_string());
        match field {
            "hub_url" => self.hub_url = text,
            "ca_file" => self.ca_file = Some(value.into()),
            "cert_file" => self.cert_file = Some(value.into()),
            "key_file" => self.key_file = Some(value.into()),
            "data_dir" => self.data_dir = Some(value.into()),
            "command" => self.command = Some(parse_command(value)?),
            "parallel_conversations" => self.parallel_conversations = Some(int(value)?),
            "exec_timeout" => self.exec_timeout = text,
            "claim_wait" => self.claim_wait = text,
            "claim_batch_max" => self.claim_batch_max = Some(int(value)?),
            "queue_ahead_batches" => self.queue_ahead_batches = Some(int(value)?),
            "result_bytes_max" => self.result_bytes_max = Some(int(value)?),
            "shutdown_grace" => self.shutdown_grace = text,
            "backoff_max" => self.backoff_max = text,
            "log_format" => self.log_format = text,
            "harness" => self.harness = text,
            "synchronous" => self.synchronous = text,
            _ => unreachable!("every key in KEYS is matched above"),
        }
        Ok(())
    }

    /// This layer with every key that `top` sets taken from `top`.
    pub fn overlaid_with(self, top: RawConfig) -> RawConfig {
        RawConfig {
            hub_url: top.hub_url.or(self.hub_url),
            ca_file: top.ca_file.or(self.ca_file),
            cert_file: top.cert_file.or(self.cert_file),
            key_file: top.key_file.or(self.key_file),
            data_dir: top.data_dir.or(self.data_dir),
            command: top.command.or(self.command),
            parallel_conversations: top.parallel_conversations.or(self.parallel_conversations),
            exec_timeout: top.exec_timeout.or(self.exec_timeout),
            claim_wait: top.claim_wait.or(self.claim_wait),
            claim_batch_max: top.claim_batch_max.or(self.claim_batch_max),
            queue_ahead_batches: top.queue_ahead_batches.or(self.queue_ahead_batches),
            result_bytes_max: top.result_bytes_max.or(self.result_bytes_max),
            shutdown_grace: top.shutdown_grace.or(self.shutdown_grace),
            backoff_max: top.backoff_max.or(self.backoff_max),
            log_format: top.log_format.or(self.log_format),
            harness: top.harness.or(self.harness),
            synchronous: top.synchronous.or(self.synchronous),
        }
    }
}

fn parse_command(value: &str) -> Result<Vec<String>, ConfigError> {
    if value.trim_start().starts_with('[') {
        serde_json::from_str(value).map_err(|e| {
            ConfigError::invalid(
                "command",
                format!("{value:?} is not a JSON array of strings such as [\"sh\", \"-c\", \"cat\"] ({e})"),
            )
        })
    } else {
        Ok(vec![value.to_string()])
    }
}

pub use baton_shared::logging::LogFormat;

/// What runs a delivered turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Harness {
    /// The configured `command` argv, in its own process group.
    Command,
    /// An in-process no-op that succeeds at once. Everything else (mirror, ack, markers,
    /// report) goes through the real code; used by benchmarks.
    Noop,
}

/// A validated node configuration. Built only by `NodeConfig::resolve`, so holding one means
/// every key is present and in range.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The hub's base URL; always `https://`, without a trailing slash.
    pub hub_url: String,
    /// PEM file with the hub CA certificate; the only trusted root.
    pub ca_file: PathBuf,
    /// PEM file with this host's client certificate.
    pub cert_file: PathBuf,
    /// PEM file with this host's private key.
    pub key_file: PathBuf,
    /// Directory of the node store (`node.db`) and its lock file; it is the instance's identity.
    pub data_dir: PathBuf,
    /// The harness argv (no shell); empty only when `harness` is `Noop`.
    pub command: Vec<String>,
    /// Conversations that may run a turn at the same time.
    pub parallel_conversations: u32,
    /// How long one turn may run before its process group is killed (`failed`, `timeout`).
    pub exec_timeout: Duration,
    /// How long one claim long-poll asks the hub to wait for work.
    pub claim_wait: Duration,
    /// Most deliveries asked for in one claim.
    pub claim_batch_max: u32,
    /// The node stops claiming while this many claim batches wait locally unstarted, so work
    /// it cannot start soon stays queued on the hub, where fences and operators see it.
    pub queue_ahead_batches: u32,
    /// Most bytes of stdout kept as an attempt's result (truncation is marked inside it).
    pub result_bytes_max: usize,
    /// How long running turns may finish after SIGTERM before they are killed.
    pub shutdown_grace: Duration,
    /// Longest pause between retries while the hub is unreachable.
    pub backoff_max: Duration,
    /// Log line format.
    pub log_format: LogFormat,
    /// What runs a turn.
    pub harness: Harness,
    /// The store's `synchronous` pragma: `full` (default) or `normal` (faster, not power-safe).
    pub synchronous: baton_shared::sqlite::Synchronous,
}

impl NodeConfig {
    /// Merges the layers (flags over env over file over defaults) and validates the result.
    pub fn resolve(file: RawConfig, env: RawConfig, flags: RawConfig) -> Result<NodeConfig, ConfigError> {
        NodeConfig::validate(file.overlaid_with(env).overlaid_with(flags))
    }

    /// Validates one merged layer, filling defaults.
    pub fn validate(raw: RawConfig) -> Result<NodeConfig, ConfigError> {
        let harness = match raw.harness.as_deref() {
            None | Some("command") => Harness::Command,
            Some("noop") => Harness::Noop,
            Some(other) => {
                return Err(ConfigError::invalid("harness", format!("{other:?} is not one of \"command\", \"noop\"")));
            }
        };
        let hub_url = check_hub_url(raw.hub_url.ok_or_else(|| ConfigError::missing("hub_url"))?)?;
        let ca_file = required_path("ca_file", raw.ca_file)?;
        let cert_file = required_path("cert_file", raw.cert_file)?;
        let key_file = required_path("key_file", raw.key_file)?;
        let data_dir = required_path("data_dir", raw.data_dir)?;
        let command = raw.command.unwrap_or_default();
        if harness == Harness::Command {
            if command.is_empty() {
                return Err(ConfigError::invalid(
                    "command",
                    "must be a non-empty argv array such as [\"/usr/bin/harness\", \"--turn\"]",
                ));
            }
            if command[0].is_empty() {
                return Err(ConfigError::invalid("command", "the program (first element) must not be empty"));
            }
        }
        let log_format = match raw.log_format.as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(ConfigError::invalid("log_format", format!("{other:?} is not one of \"text\", \"json\"")));
            }
        };
        let synchronous = match raw.synchronous.as_deref() {
            None | Some("full") => baton_shared::sqlite::Synchronous::Full,
            Some("normal") => baton_shared::sqlite::Synchronous::Normal,
            Some(other) => {
                return Err(ConfigError::invalid(
                    "synchronous",
                    format!("{other:?} is not one of \"full\", \"normal\""),
                ));
            }
        };
        Ok(NodeConfig {
            hub_url,
            ca_file,
            cert_file,
            key_file,
            data_dir,
            command,
            parallel_conversations: int_in(
                "parallel_conversations",
                raw.parallel_conversations,
                PARALLEL_CONVERSATIONS_DEFAULT.into(),
                PARALLEL_CONVERSATIONS_RANGE.0.into(),
                PARALLEL_CONVERSATIONS_RANGE.1.into(),
            )? as u32,
            exec_timeout: duration_in("exec_timeout", raw.exec_timeout, EXEC_TIMEOUT_DEFAULT, EXEC_TIMEOUT_RANGE)?,
            claim_wait: duration_in("claim_wait", raw.claim_wait, CLAIM_WAIT_DEFAULT, CLAIM_WAIT_RANGE)?,
            claim_batch_max: int_in(
                "claim_batch_max",
                raw.claim_batch_max,
                CLAIM_BATCH_MAX_DEFAULT.into(),
                CLAIM_BATCH_MAX_RANGE.0.into(),
                CLAIM_BATCH_MAX_RANGE.1.into(),
            )? as u32,
            queue_ahead_batches: int_in(
                "queue_ahead_batches",
                raw.queue_ahead_batches,
                QUEUE_AHEAD_BATCHES_DEFAULT.into(),
                QUEUE_AHEAD_BATCHES_RANGE.0.into(),
                QUEUE_AHEAD_BATCHES_RANGE.1.into(),
            )? as u32,
            result_bytes_max: int_in(
                "result_bytes_max",
                raw.result_bytes_max,
                RESULT_BYTES_MAX_DEFAULT as i64,
                RESULT_BYTES_MAX_RANGE.0 as i64,
                RESULT_BYTES_MAX_RANGE.1 as i64,
            )? as usize,
            shutdown_grace: duration_in(
                "shutdown_grace",
                raw.shutdown_grace,
                SHUTDOWN_GRACE_DEFAULT,
                SHUTDOWN_GRACE_RANGE,
            )?,
            backoff_max: duration_in("backoff_max", raw.backoff_max, BACKOFF_MAX_DEFAULT, BACKOFF_MAX_RANGE)?,
            log_format,
            harness,
            synchronous,
        })
    }

    /// Checks that the certificate files exist and hold PEM data, naming the field otherwise.
    pub fn check_files(&self) -> Result<(), ConfigError> {
        for (field, path) in [("ca_file", &self.ca_file), ("cert_file", &self.cert_file), ("key_file", &self.key_file)]
        {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfigError::invalid(field, format!("cannot read {}: {e}", path.display())))?;
            if !text.contains("-----BEGIN ") {
                return Err(ConfigError::invalid(field, format!("{} holds no PEM data", path.display())));
            }
        }
        Ok(())
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

fn check_hub_url(s: String) -> Result<String, ConfigError> {
    let url =
        reqwest::Url::parse(&s).map_err(|e| ConfigError::invalid("hub_url", format!("{s:?} is not a URL ({e})")))?;
    if url.scheme() != "https" {
        return Err(ConfigError::invalid(
            "hub_url",
            format!("{s:?} uses {}://; only https:// is allowed (the hub requires mTLS)", url.scheme()),
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::invalid("hub_url", format!("{s:?} has no host")));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ConfigError::invalid("hub_url", format!("{s:?} must not have a query or fragment")));
    }
    Ok(s.trim_end_matches('/').to_string())
}

fn required_path(field: &'static str, p: Option<PathBuf>) -> Result<PathBuf, ConfigError> {
    match p {
        None => Err(ConfigError::missing(field)),
        Some(p) if p.as_os_str().is_empty() => Err(ConfigError::invalid(field, "must not be empty")),
        Some(p) => Ok(p),
    }
}

fn int_in(field: &'static str, v: Option<i64>, default: i64, min: i64, max: i64) -> Result<i64, ConfigError> {
    let v = v.unwrap_or(default);
    check_range(field, v, min, max, &v.to_string(), &format!("{min}..={max}"))?;
    Ok(v)
}

fn duration_in(
    field: &'static str,
    v: Option<String>,
    default: Duration,
    (min, max): (Duration, Duration),
) -> Result<Duration, ConfigError> {
    let d = match v {
        None => default,
        Some(s) => baton_shared::duration::parse(field, s.trim()).map_err(|e| {
            ConfigError::invalid(field, e.trim_start_matches(field).trim_start_matches(": ").to_string())
        })?,
    };
    let shown = |d: Duration| humantime::format_duration(d).to_string();
    check_range(field, d, min, max, &shown(d), &format!("{}..={}", shown(min), shown(max)))?;
    Ok(d)
}

fn check_range<T: PartialOrd>(
    field: &'static str,
    v: T,
    min: T,
    max: T,
    shown: &str,
    range: &str,
) -> Result<(), ConfigError> {
    if v < min || v > max {
        return Err(ConfigError::invalid(field, format!("{shown} is out of the allowed range {range}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const BASE: &str = r#"
hub_url = "https://hub.example:7443"
ca_file = "/etc/baton/ca.crt"
cert_file = "/etc/baton/h.crt"
key_file = "/etc/baton/h.key"
data_dir = "/var/lib/baton-node"
command = ["/usr/bin/harness", "--turn"]
"#;

    fn parse(extra: &str) -> Result<NodeConfig, ConfigError> {
        let raw = RawConfig::from_toml("test.toml", &format!("{BASE}{extra}"))?;
        NodeConfig::validate(raw)
    }

    /// Checks that `extra` appended to a valid file is refused with a message containing every
    /// one of `expected`.
    fn check_refused(extra: &str, expected: &[&str]) {
        let err = parse(extra).expect_err(extra).to_string();
        for e in expected {
            assert!(err.contains(e), "{extra:?}: {err:?} lacks {e:?}");
        }
    }

    #[test]
    fn defaults_fill_the_optional_keys() {
        let c = parse("").unwrap();
        assert_eq!(c.hub_url, "https://hub.example:7443");
        assert_eq!(c.command, ["/usr/bin/harness", "--turn"]);
        assert_eq!(c.parallel_conversations, 4);
        assert_eq!(c.exec_timeout, Duration::from_secs(600));
        assert_eq!(c.claim_wait, Duration::from_secs(30));
        assert_eq!(c.claim_batch_max, 16);
        assert_eq!(c.result_bytes_max, 65536);
        assert_eq!(c.shutdown_grace, Duration::from_secs(10));
        assert_eq!(c.backoff_max, Duration::from_secs(30));
        assert_eq!(c.log_format, LogFormat::Text);
        assert_eq!(c.harness, Harness::Command);
    }

    #[test]
    fn unknown_key_is_refused_by_name() {
        check_refused("ca_fiel = \"x\"\n", &["unknown field", "ca_fiel"]);
    }

    #[test]
    fn out_of_range_values_name_the_field_and_range() {
        check_refused("parallel_conversations = 0\n", &["parallel_conversations", "1..=256"]);
        check_refused("parallel_conversations = 257\n", &["parallel_conversations", "1..=256"]);
        check_refused("claim_batch_max = 1001\n", &["claim_batch_max", "1..=1000"]);
        check_refused("queue_ahead_batches = 0\n", &["queue_ahead_batches", "1..=1000"]);
        check_refused("result_bytes_max = 16777217\n", &["result_bytes_max", "1..=16777216"]);
        check_refused("exec_timeout = \"0s\"\n", &["exec_timeout", "1s..=1day"]);
        check_refused("exec_timeout = \"25h\"\n", &["exec_timeout", "out of the allowed range"]);
        check_refused("claim_wait = \"6m\"\n", &["claim_wait", "0s..=5m"]);
        check_refused("claim_wait = \"soon\"\n", &["claim_wait", "not a duration"]);
        check_refused("log_format = \"xml\"\n", &["log_format", "\"text\""]);
        check_refused("harness = \"magic\"\n", &["harness", "\"noop\""]);
        check_refused("parallel_conversations = \"4\"\n", &["parallel_conversations", "expected i64"]);
    }

    #[test]
    fn http_hub_url_is_refused() {
        let raw = RawConfig { hub_url: Some("http://hub:7443".into()), ..RawConfig::from_toml("t", BASE).unwrap() };
        let err = NodeConfig::validate(raw).unwrap_err().to_string();
        assert!(err.starts_with("hub_url:") && err.contains("only https://"), "{err}");
    }

    #[test]
    fn empty_command_is_refused_unless_noop() {
        let mut raw = RawConfig::from_toml("t", BASE).unwrap();
        raw.command = Some(vec![]);
        let err = NodeConfig::validate(raw.clone()).unwrap_err().to_string();
        assert!(err.starts_with("command:"), "{err}");
        raw.harness = Some("noop".into());
        assert_eq!(NodeConfig::validate(raw).unwrap().harness, Harness::Noop);
    }

    #[test]
    fn missing_required_key_names_flag_and_env() {
        let err = NodeConfig::validate(RawConfig::default()).unwrap_err().to_string();
        assert!(err.contains("hub_url is required") && err.contains("--hub-url") && err.contains("BATON_NODE_HUB_URL"));
    }

    #[test]
    fn precedence_is_flag_then_env_then_file_then_default() {
        let file = RawConfig::from_toml(
            "t",
            &format!("{BASE}claim_wait = \"5s\"\nexec_timeout = \"1m\"\nclaim_batch_max = 3\n"),
        )
        .unwrap();
        let vars: HashMap<String, String> = [
            ("BATON_NODE_CLAIM_WAIT", "7s"),
            ("BATON_NODE_EXEC_TIMEOUT", "2m"),
            ("BATON_NODE_COMMAND", r#"["sh", "-c", "cat"]"#),
            ("OTHER", "x"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let env = RawConfig::from_env(|k| vars.get(k).cloned()).unwrap();
        let mut flags = RawConfig::default();
        flags.set("claim_wait", "9s").unwrap();
        let c = NodeConfig::resolve(file, env, flags).unwrap();
        assert_eq!(c.claim_wait, Duration::from_secs(9), "flag beats env and file");
        assert_eq!(c.exec_timeout, Duration::from_secs(120), "env beats file");
        assert_eq!(c.claim_batch_max, 3, "file beats default");
        assert_eq!(c.parallel_conversations, 4, "default");
        assert_eq!(c.command, ["sh", "-c", "cat"]);
    }

    #[test]
    fn everything_can_come_from_env_without_a_file() {
        let vars: HashMap<String, String> = [
            ("BATON_NODE_HUB_URL", "https://127.0.0.1:9/"),
            ("BATON_NODE_CA_FILE", "ca.crt"),
            ("BATON_NODE_CERT_FILE", "h.crt"),
            ("BATON_NODE_KEY_FILE", "h.key"),
            ("BATON_NODE_DATA_DIR", "d"),
            ("BATON_NODE_COMMAND", "/bin/true"),
            ("BATON_NODE_PARALLEL_CONVERSATIONS", "8"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let env = RawConfig::from_env(|k| vars.get(k).cloned()).unwrap();
        let c = NodeConfig::resolve(RawConfig::default(), env, RawConfig::default()).unwrap();
        assert_eq!(c.hub_url, "https://127.0.0.1:9");
        assert_eq!(c.command, ["/bin/true"]);
        assert_eq!(c.parallel_conversations, 8);
    }

    #[test]
    fn bad_env_number_names_the_field() {
        let err = RawConfig::from_env(|k| (k == "BATON_NODE_CLAIM_BATCH_MAX").then(|| "lots".to_string())).unwrap_err();
        assert!(err.to_string().starts_with("claim_batch_max:"), "{err}");
    }

    #[test]
    fn every_key_has_a_setter() {
        for key in KEYS {
            let value = if key == "command" { "[\"x\"]" } else { "1" };
            RawConfig::default().set(key, value).unwrap();
        }
    }
}
