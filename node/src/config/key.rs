//! One configuration key: how its value is written, its default and allowed range (`Kind`),
//! its help line, and the checks every written value passes before it joins a layer. Values
//! are checked where they are read, so a message names the key whatever layer it came from.

use super::{ConfigError, Handoff, Harness, HubUrls, KEYS, LogFormat};
use crate::limits::HUB_URLS_MAX;
use baton_shared::sqlite::Synchronous;
use baton_telemetry::OtlpEndpoint;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The address `metrics_listen` binds when it gives a port alone: loopback, since the
/// listener is plain HTTP without client certificates.
const METRICS_LOOPBACK: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// How a key's value is written, with its default and its allowed range.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// One or more `https://` URLs, each with a host and neither query nor fragment, none
    /// twice, at most `HUB_URLS_MAX`: in the file a string (one URL) or an array of strings; as a
    /// flag or variable a comma-separated list. Required.
    HttpsUrl,
    /// A file or directory path; required.
    Path,
    /// An argv: in the file an array of strings; as a flag or variable a JSON array, or a single
    /// program path. Empty when not given.
    Argv,
    /// A whole number.
    Count {
        /// The value when no layer sets it.
        default: u64,
        /// The smallest and largest allowed values.
        range: (u64, u64),
    },
    /// A duration written like `"30s"`, `"5m"` or `"250ms"`.
    Duration {
        /// The value when no layer sets it.
        default: Duration,
        /// The shortest and longest allowed values.
        range: (Duration, Duration),
    },
    /// One word of a fixed list; the first is the default.
    Word(&'static [&'static str]),
    /// A listening address: `ADDR:PORT`, a port alone (on `METRICS_LOOPBACK`), or `off`, the
    /// default.
    Listen,
    /// An OTLP/HTTP receiver's `http://` or `https://` URL (`baton_telemetry::OtlpEndpoint`),
    /// or empty, the default: none.
    OtlpUrl,
}

impl Kind {
    /// The placeholder `--help` shows after the flag.
    pub const fn value_name(&self) -> &'static str {
        match self {
            Kind::HttpsUrl => "URL[,URL...]",
            Kind::Path => "PATH",
            Kind::Argv => "ARGV",
            Kind::Count { .. } => "N",
            Kind::Duration { .. } => "DURATION",
            Kind::Word(_) => "WORD",
            Kind::Listen => "ADDR:PORT|PORT|off",
            Kind::OtlpUrl => "URL",
        }
    }
}

/// One configuration key, declared once in `config` (the `KEYS` table): its name in the file,
/// its help, and its kind. The flag and the environment variable derive from the name.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// The name as written in the file, e.g. `claim_wait`.
    pub name: &'static str,
    /// What the key is for (the doc comment of its `NodeConfig` field).
    pub doc: &'static str,
    /// How it is written, its default and its range.
    pub kind: Kind,
}

/// A written value that passed its key's checks, waiting to become a `NodeConfig` field.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value {
    /// A path or a word.
    Text(String),
    /// One or more URLs, each checked, none twice.
    Urls(Vec<String>),
    /// An argv.
    Argv(Vec<String>),
    /// A whole number within its range.
    Count(u64),
    /// A duration within its range.
    Duration(Duration),
    /// A listening address, or none (`off`).
    Listen(Option<SocketAddr>),
    /// An OTLP endpoint, or none (empty).
    Otlp(Option<OtlpEndpoint>),
}

impl Key {
    /// The key named `name`, if there is one.
    pub fn find(name: &str) -> Option<&'static Key> {
        KEYS.iter().find(|k| k.name == name)
    }

    /// Its flag, `--claim-wait` for `claim_wait`.
    pub fn flag(&self) -> String {
        format!("--{}", self.name.replace('_', "-"))
    }

    /// Its environment variable, `BATON_NODE_CLAIM_WAIT` for `claim_wait`.
    pub fn env_var(&self) -> String {
        format!("BATON_NODE_{}", self.name.to_ascii_uppercase())
    }

    /// Its line in `--help`: what it is for, its range and default, its environment variable.
    pub fn help(&self) -> String {
        let doc = self.doc.split_whitespace().collect::<Vec<_>>().join(" ");
        let allowed = match self.kind {
            Kind::HttpsUrl => format!("required; 1..={HUB_URLS_MAX} URLs"),
            Kind::Path => "required".to_string(),
            Kind::Argv => "no default".to_string(),
            Kind::Count { default, range: (min, max) } => format!("{min}..={max}, default {default}"),
            Kind::Duration { default, range: (min, max) } => {
                format!("{}..={}, default {}", shown(min), shown(max), shown(default))
            }
            Kind::Word(words) => format!("{}, default {}", words.join(" or "), words.first().unwrap_or(&"")),
            Kind::Listen => "ADDR:PORT, PORT (on 127.0.0.1) or off, default off".to_string(),
            Kind::OtlpUrl => "an http:// or https:// URL, or empty; default empty (no export)".to_string(),
        };
        format!("{doc} [{allowed}] [env: {}]", self.env_var())
    }

    /// The help line of the key named `name` (empty for a name that is not a key).
    pub fn help_for(name: &str) -> String {
        Key::find(name).map(Key::help).unwrap_or_default()
    }

    /// An `Invalid` error for this key.
    pub(super) fn invalid(&self, message: impl Into<String>) -> ConfigError {
        ConfigError::invalid(self.name, message)
    }

    /// The value when no layer sets the key; a required key is `Missing`.
    pub(super) fn default_value(&self) -> Result<Value, ConfigError> {
        match self.kind {
            Kind::HttpsUrl | Kind::Path => {
                Err(ConfigError::Missing { field: self.name, flag: self.flag(), env: self.env_var() })
            }
            Kind::Argv => Ok(Value::Argv(Vec::new())),
            Kind::Count { default, .. } => self.count(i128::from(default)),
            Kind::Duration { default, .. } => self.duration(default),
            Kind::Word(words) => match words.first() {
                Some(w) => Ok(Value::Text((*w).to_string())),
                None => Err(self.invalid("allows no value at all")),
            },
            Kind::Listen => Ok(Value::Listen(None)),
            Kind::OtlpUrl => Ok(Value::Otlp(None)),
        }
    }

    /// Checks a value written in the TOML file.
    pub(super) fn read_toml(&self, v: toml::Value) -> Result<Value, ConfigError> {
        match (self.kind, v) {
            (Kind::Count { .. }, toml::Value::Integer(n)) => self.count(i128::from(n)),
            (Kind::Argv, toml::Value::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    toml::Value::String(s) => Ok(s),
                    other => Err(self.invalid(format!("expected an array of strings, found a {}", other.type_str()))),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Argv),
            (Kind::HttpsUrl, toml::Value::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    toml::Value::String(s) => Ok(s),
                    other => Err(self.invalid(format!("expected an array of strings, found a {}", other.type_str()))),
                })
                .collect::<Result<Vec<_>, _>>()
                .and_then(|urls| self.https_urls(&urls))
                .map(Value::Urls),
            (Kind::HttpsUrl, toml::Value::String(s)) if s.contains(',') => Err(self.invalid(format!(
                "{s:?} holds a comma; in the file, several hubs are an array: \
                 hub_url = [\"https://a:7443\", \"https://b:7443\"]"
            ))),
            (Kind::HttpsUrl, toml::Value::String(s)) => self.https_urls(&[s]).map(Value::Urls),
            (
                Kind::Path | Kind::Duration { .. } | Kind::Word(_) | Kind::Listen | Kind::OtlpUrl,
                toml::Value::String(s),
            ) => self.read_text(&s),
            (Kind::Listen, toml::Value::Integer(n)) => self.read_text(&n.to_string()),
            (kind, other) => {
                let expected = match kind {
                    Kind::Count { .. } => "a whole number",
                    Kind::Argv => "an array of strings",
                    Kind::HttpsUrl => "a string or an array of strings",
                    Kind::Duration { .. } => "a duration string such as \"30s\"",
                    Kind::Path | Kind::Word(_) => "a string",
                    Kind::Listen => "a string such as \"127.0.0.1:9465\" or \"off\"",
                    Kind::OtlpUrl => "a string such as \"http://127.0.0.1:4318\"",
                };
                Err(self.invalid(format!("expected {expected}, found a {} ({other})", other.type_str())))
            }
        }
    }

    /// Checks a value written as a flag or an environment variable.
    pub(super) fn read_text(&self, s: &str) -> Result<Value, ConfigError> {
        match self.kind {
            Kind::HttpsUrl => {
                let entries: Vec<String> = s.split(',').map(|e| e.trim().to_string()).collect();
                self.https_urls(&entries).map(Value::Urls)
            }
            Kind::Path if s.is_empty() => Err(self.invalid("must not be empty")),
            Kind::Path => Ok(Value::Text(s.to_string())),
            Kind::Argv => self.argv(s).map(Value::Argv),
            Kind::Count { .. } => {
                let n = s.trim().parse::<i128>().map_err(|_| self.invalid(format!("{s:?} is not a whole number")))?;
                self.count(n)
            }
            Kind::Duration { .. } => {
                let d = baton_shared::duration::parse(self.name, s.trim())
                    .map_err(|e| self.invalid(e.trim_start_matches(self.name).trim_start_matches(": ").to_string()))?;
                self.duration(d)
            }
            Kind::Word(words) if words.contains(&s) => Ok(Value::Text(s.to_string())),
            Kind::Word(words) => {
                let allowed: Vec<String> = words.iter().map(|w| format!("{w:?}")).collect();
                Err(self.invalid(format!("{s:?} is not one of {}", allowed.join(", "))))
            }
            Kind::Listen => listen(s).map(Value::Listen).map_err(|m| self.invalid(m)),
            Kind::OtlpUrl if s.trim().is_empty() => Ok(Value::Otlp(None)),
            Kind::OtlpUrl => OtlpEndpoint::parse(s.trim()).map(|e| Value::Otlp(Some(e))).map_err(|m| self.invalid(m)),
        }
    }

    fn count(&self, n: i128) -> Result<Value, ConfigError> {
        let Kind::Count { range: (min, max), .. } = self.kind else {
            return Err(self.invalid("is not a whole-number key"));
        };
        match u64::try_from(n) {
            Ok(v) if (min..=max).contains(&v) => Ok(Value::Count(v)),
            _ => Err(self.invalid(format!("{n} is out of the allowed range {min}..={max}"))),
        }
    }

    fn duration(&self, d: Duration) -> Result<Value, ConfigError> {
        let Kind::Duration { range: (min, max), .. } = self.kind else {
            return Err(self.invalid("is not a duration key"));
        };
        if !(min..=max).contains(&d) {
            let range = format!("{}..={}", shown(min), shown(max));
            return Err(self.invalid(format!("{} is out of the allowed range {range}", shown(d))));
        }
        Ok(Value::Duration(d))
    }

    /// One or more hub URLs (`https_url` each), at most `HUB_URLS_MAX`, no hub twice (compared
    /// as parsed: `https://HUB:443/` and `https://hub` are one hub). A message about one entry
    /// of several says which.
    fn https_urls(&self, entries: &[String]) -> Result<Vec<String>, ConfigError> {
        if entries.is_empty() {
            return Err(self.invalid("names no hub: give at least one https:// URL"));
        }
        if entries.len() > HUB_URLS_MAX {
            return Err(self.invalid(format!("names {} hubs; at most {HUB_URLS_MAX} are allowed", entries.len())));
        }
        let mut urls: Vec<String> = Vec::with_capacity(entries.len());
        let mut seen: Vec<reqwest::Url> = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let which = |message: String| match entries.len() {
                1 => self.invalid(message),
                n => self.invalid(format!("entry {} of {n}: {message}", i + 1)),
            };
            let (url, parsed) = https_url(entry).map_err(which)?;
            if let Some(first) = seen.iter().position(|u| *u == parsed) {
                return Err(which(format!("{entry:?} names the same hub as entry {}, {:?}", first + 1, urls[first])));
            }
            seen.push(parsed);
            urls.push(url);
        }
        Ok(urls)
    }

    /// A JSON array of strings (`["sh", "-c", "cat"]`), or else a single program path.
    fn argv(&self, s: &str) -> Result<Vec<String>, ConfigError> {
        if !s.trim_start().starts_with('[') {
            return Ok(vec![s.to_string()]);
        }
        serde_json::from_str(s).map_err(|e| {
            self.invalid(format!("{s:?} is not a JSON array of strings such as [\"sh\", \"-c\", \"cat\"] ({e})"))
        })
    }
}

/// An `https://` URL with a host, kept without a trailing slash, and its parsed form; else what
/// is wrong with it.
fn https_url(s: &str) -> Result<(String, reqwest::Url), String> {
    if s.is_empty() {
        return Err("an empty entry is not a URL".to_string());
    }
    let url = reqwest::Url::parse(s).map_err(|e| format!("{s:?} is not a URL ({e})"))?;
    if url.scheme() != "https" {
        return Err(format!("{s:?} uses {}://; only https:// is allowed (the hub requires mTLS)", url.scheme()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{s:?} has no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{s:?} must not have a query or fragment"));
    }
    Ok((s.trim_end_matches('/').to_string(), url))
}

/// A listening address as `metrics_listen` takes it: `off`, a port alone (on
/// `METRICS_LOOPBACK`) or `ADDR:PORT` (an IPv6 address in brackets); else what is wrong.
fn listen(s: &str) -> Result<Option<SocketAddr>, String> {
    let s = s.trim();
    if s == "off" {
        return Ok(None);
    }
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        let port: u16 = s.parse().map_err(|_| format!("port {s} is out of the range 0..=65535"))?;
        return Ok(Some(SocketAddr::new(METRICS_LOOPBACK, port)));
    }
    s.parse::<SocketAddr>()
        .map(Some)
        .map_err(|_| format!("{s:?} is not ADDR:PORT (\"127.0.0.1:9465\", \"[::1]:9465\"), a port alone, or \"off\""))
}

/// A duration as `--help` and the messages show it (`10m`, `1day`).
fn shown(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// The conversion of a checked `Value` into the type of its `NodeConfig` field. A mismatch is a
/// slip in the key table (a kind that does not fit its field's type), named with the key.
pub(super) trait FromValue: Sized {
    /// Converts the value of key `key`.
    fn from_value(key: &'static str, v: Value) -> Result<Self, ConfigError>;
}

fn mismatch<T>(key: &'static str, v: &Value, wanted: &str) -> Result<T, ConfigError> {
    Err(ConfigError::invalid(key, format!("the key table gives {v:?} for a field of type {wanted}")))
}

impl FromValue for String {
    fn from_value(key: &'static str, v: Value) -> Result<Self, ConfigError> {
        match v {
            Value::Text(s) => Ok(s),
            other => mismatch(key, &other, "String"),
        }
    }
}

impl FromValue for HubUrls {
    fn from_value(key: &'static str, v: Value) -> Result<Self, ConfigError> {
        match v {
            Value::Urls(urls) => Ok(HubUrls(urls)),
            other => mismatch(key, &other, "HubUrls"),
        }
    }
}

impl FromValue for PathBuf {
    fn from_value(key: &'static str, v: Value) -> Result<Self, ConfigError> {
        String::from_value(key, v).map(PathBuf::from)
    }
}

impl FromValue for Vec<String> {
    fn from_value(key: &'static str, v: Value) -> Result<Self, ConfigError> {
        match v {
            Value::Argv(argv) => Ok(argv),
            other => mismatch(key, &other, "Vec<String>"),
        }
    }
}

impl FromValue for u32 {
    fn from_value(key: &'static str, v: Value) -> Result<Self, ConfigError> {
        match v {
            Value::Count(n) => u32::try_from(n).map_err(|_| ConfigError::invalid(key, format!("{n} is too large"))),
            other => mismatch(key, &other, "u32"),
        }
    }
}

impl FromValue for usize {
    fn from_value(key: &'static str, v: Value) -> Result<Self, ConfigError> {
        match v {
            Value::Count(n) => usize::try_from(n).map_err(|_| ConfigError::invalid(key, format!("{n} is too large"))),
            other => mismatch(key, &other, "usize"),
        }
    }
}

impl FromValue for u64 {
    fn from_value(key: &'static str, v: Value) -> Result<Self, ConfigError> {
        match v {
            Value::Count(n) => Ok(n),
            other => mismatch(key, &other, "u64"),
        }
    }
}

impl FromValue for Option<SocketAddr> {
    fn from_value(key: &'static str, v: Value) -> Result<Self, ConfigError> {
        match v {
            Value::Listen(addr) => Ok(addr),
            other => mismatch(key, &other, "Option<SocketAddr>"),
        }
    }
}

impl FromValue for Option<OtlpEndpoint> {
    fn from_value(key: &'static str, v: Value) -> Result<Self, ConfigError> {
        match v {
            Value::Otlp(endpoint) => Ok(endpoint),
            other => mismatch(key, &other, "Option<OtlpEndpoint>"),
        }
    }
}

impl FromValue for Duration {
    fn from_value(key: &'static str, v: Value) -> Result<Self, ConfigError> {
        match v {
            Value::Duration(d) => Ok(d),
            other => mismatch(key, &other, "Duration"),
        }
    }
}

/// An enum a key chooses by word: `Kind::Word(T::WORDS)` in the key table, so the words a key
/// allows and the words its field's type accepts are one list.
pub(super) trait Words {
    /// Every allowed word, the default first.
    const WORDS: &'static [&'static str];
}

/// Implements `Words` and `FromValue` for an enum chosen by a word, from one list.
macro_rules! from_word {
    ($ty:ty { $($word:literal => $value:expr),+ $(,)? }) => {
        impl Words for $ty {
            const WORDS: &'static [&'static str] = &[$($word),+];
        }

        impl FromValue for $ty {
            fn from_value(key: &'static str, v: Value) -> Result<Self, ConfigError> {
                match v {
                    $(Value::Text(s) if s == $word => Ok($value),)+
                    other => mismatch(key, &other, stringify!($ty)),
                }
            }
        }
    };
}

from_word!(LogFormat { "text" => LogFormat::Text, "json" => LogFormat::Json });
from_word!(Harness { "command" => Harness::Command, "noop" => Harness::Noop });
from_word!(Handoff { "combined" => Handoff::Combined, "separate" => Handoff::Separate });
from_word!(Synchronous { "full" => Synchronous::Full, "normal" => Synchronous::Normal });
