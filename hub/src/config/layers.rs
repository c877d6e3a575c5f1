//! The layers a configuration is read from (file, environment, `serve` flags), merged key by
//! key, and the typed, range-checked reading of each key's values.

use super::keys::{KEYS, Key, KeyKind, LISTEN_DEFAULT, humanize};
use crate::store::engine::postgres::{PgError, PgUrl};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    pub(super) fn tell(&self, message: String) -> String {
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
pub(super) enum Raw {
    Toml(toml::Value),
    Text(String),
}

/// The layers, key by key: every value given for a key, lowest layer first. Every one of them
/// is validated (an invalid file value is refused even when a flag overrides it); the highest
/// one is used.
#[derive(Debug, Default)]
pub(super) struct Merged {
    values: BTreeMap<String, Vec<(Raw, Source)>>,
}

impl Merged {
    pub(super) fn add(&mut self, key: &Key, raw: Raw, source: Source) {
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

    pub(super) fn int(&self, key: &Key) -> Result<u64, String> {
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

    pub(super) fn duration(&self, key: &Key) -> Result<Duration, String> {
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

    pub(super) fn addr(&self, key: &Key) -> Result<SocketAddr, String> {
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

    /// An `ADDR:PORT` key that also takes `off`: `None` when it is off.
    pub(super) fn addr_or_off(&self, key: &Key) -> Result<Option<SocketAddr>, String> {
        let KeyKind::AddrOrOff { default } = key.kind else {
            return Err(format!("{}: not an address-or-off key", key.name.field()));
        };
        let field = key.name.field();
        let parse = |value: &str, source: &Source| match value {
            "off" => Ok(None),
            v => v.parse().map(Some).map_err(|_| {
                source.tell(format!("{field} = {v:?} is not an ADDR:PORT such as \"127.0.0.1:9443\" or \"off\""))
            }),
        };
        let default = parse(default, &Source::Default)?;
        self.resolve(key, default, |raw, source| parse(text(raw, &field, source)?, source))
    }

    /// The `database_url` key: `None` for the SQLite file (empty, the default), else the parsed
    /// URL. A malformed one is refused naming the key, what is wrong and where it came from,
    /// never with its password.
    pub(super) fn database_url(&self, key: &Key) -> Result<Option<PgUrl>, String> {
        let KeyKind::DatabaseUrl = key.kind else {
            return Err(format!("{}: not a database URL key", key.name.field()));
        };
        let field = key.name.field();
        self.resolve(key, None, |raw, source| {
            let value = text(raw, &field, source)?;
            if value.is_empty() {
                return Ok(None);
            }
            PgUrl::parse(value).map(Some).map_err(|e| {
                let detail = match e {
                    PgError::Url { detail } => detail,
                    other => other.to_string(),
                };
                source.tell(format!("{field} is not a usable PostgreSQL URL: {detail}"))
            })
        })
    }

    /// The `otlp_endpoint` key: `None` when empty (the default), else the checked URL; a bad
    /// one is refused naming the key, what is wrong and where it came from.
    pub(super) fn otlp_endpoint(&self, key: &Key) -> Result<Option<baton_telemetry::OtlpEndpoint>, String> {
        let KeyKind::OtlpEndpoint = key.kind else {
            return Err(format!("{}: not an OTLP endpoint key", key.name.field()));
        };
        let field = key.name.field();
        self.resolve(key, None, |raw, source| {
            let value = text(raw, &field, source)?.trim();
            if value.is_empty() {
                return Ok(None);
            }
            baton_telemetry::OtlpEndpoint::parse(value).map(Some).map_err(|why| source.tell(format!("{field}: {why}")))
        })
    }

    /// A `Names` key: host names, lowercase, each checked; empty when none is given.
    pub(super) fn names(&self, key: &Key) -> Result<Vec<String>, String> {
        let KeyKind::Names = key.kind else {
            return Err(format!("{}: not a names key", key.name.field()));
        };
        let field = key.name.field();
        self.resolve(key, Vec::new(), |raw, source| {
            let given: Vec<String> = match raw {
                Raw::Toml(toml::Value::Array(items)) => items
                    .iter()
                    .map(|v| match v {
                        toml::Value::String(s) => Ok(s.clone()),
                        other => Err(source.tell(format!("{field}: {other} is not a host name (a string)"))),
                    })
                    .collect::<Result<_, _>>()?,
                raw => text(raw, &field, source)?
                    .split(',')
                    .map(|n| n.trim().to_string())
                    .filter(|n| !n.is_empty())
                    .collect(),
            };
            given
                .into_iter()
                .map(|n| host_name(&n).map_err(|why| source.tell(format!("{field}: {n:?} {why}"))))
                .collect()
        })
    }

    pub(super) fn choice(&self, key: &Key) -> Result<&'static str, String> {
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

/// Most characters of a host name (DNS's bound).
const HOST_NAME_CHARS_MAX: usize = 253;

/// A host name as a Host header carries it, lowercase: letters, digits, `-` and `.`, at most
/// `HOST_NAME_CHARS_MAX` characters, without a port; `Err` says what is wrong.
fn host_name(n: &str) -> Result<String, &'static str> {
    if n.len() > HOST_NAME_CHARS_MAX {
        return Err("is longer than 253 characters");
    }
    if n.contains(':') {
        return Err("is not a host name: give it without a port (any port is taken)");
    }
    if n.split('.').any(|label| label.is_empty() || label.starts_with('-') || label.ends_with('-'))
        || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        return Err("is not a host name (letters, digits, '-' and '.')");
    }
    Ok(n.to_ascii_lowercase())
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
    pub(super) given: Vec<(Key, String)>,
}

impl Flags {
    /// No flags (every command but `serve`).
    pub fn none() -> Flags {
        Flags::default()
    }

    /// These flags with a global key's flag (`--database-url`) given as `value`, when given.
    pub fn with_global(&self, key: &Key, value: Option<&str>) -> Flags {
        let mut flags = self.clone();
        if let Some(v) = value {
            flags.given.retain(|(k, _)| k != key);
            flags.given.push((*key, v.to_string()));
        }
        flags
    }
}

impl clap::FromArgMatches for Flags {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = Flags::default();
        flags.update_from_arg_matches(m)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        for key in KEYS.into_iter().filter(|key| !key.flag_is_global()) {
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
        // A global key's flag is defined once, on the whole command line (`cli::Cli`).
        KEYS.iter().filter(|key| !key.flag_is_global()).fold(cmd, |cmd, key| {
            cmd.arg(
                clap::Arg::new(key.name.flag).long(key.name.flag).value_name(key.value_name()).help(key.flag_help()),
            )
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// A file that is not TOML, named with what is wrong. The parser's message quotes the line it
/// stopped on, which could be `database_url`'s and hold a password: then only the line number
/// and the reason are given.
fn syntax_error(text: &str, shown: &str, e: &toml::de::Error) -> String {
    let line_of = |at: usize| text.get(..at).map(|before| before.matches('\n').count() + 1);
    match e.span().and_then(|span| line_of(span.start).map(|n| (n, span))) {
        Some((n, _)) if text.lines().nth(n - 1).is_some_and(|l| l.contains(DATABASE_URL_FIELD)) => {
            format!("{shown}: line {n}: {}", e.message())
        }
        _ => format!("{shown}: {e}"),
    }
}

/// The name of the one key whose value must never be printed whole.
const DATABASE_URL_FIELD: &str = "database_url";

/// What an unknown key `name` (in the table `section`, `None` at the top level) most likely
/// meant, as a clause for its error: a key of that name in another place (a top-level key
/// written after `[limits]`, which the generated `hub.toml` ends with, lands in that table),
/// else a key spelt within two edits of it; empty when neither.
fn unknown_hint(section: Option<&str>, name: &str) -> String {
    if let Some(key) = KEYS.iter().find(|k| k.name.name == name && k.name.section != section) {
        return match key.name.section {
            Some(table) => format!(": {name} belongs in the [{table}] table ({})", key.name.field()),
            None => format!(": {name} is a top-level key; write it above the first [table] header"),
        };
    }
    let close = KEYS.iter().filter(|k| k.name.section == section).min_by_key(|k| edits(k.name.name, name));
    match close {
        Some(key) if edits(key.name.name, name) <= 2 => format!("; did you mean {}?", key.name.field()),
        _ => String::new(),
    }
}

/// The Levenshtein distance between `a` and `b`, in characters.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = if ca == *cb { prev } else { 1 + prev.min(here).min(row[j]) };
            prev = here;
        }
    }
    row[b.len()]
}

/// Reads the file's keys into `merged`, refusing a key no `Key` declares.
pub(super) fn read_file(text: &str, path: &Path, merged: &mut Merged) -> Result<(), String> {
    let shown = path.display();
    let table: toml::Table = toml::from_str(text).map_err(|e| syntax_error(text, &shown.to_string(), &e))?;
    for (name, value) in table {
        match value {
            toml::Value::Table(inner) if KEYS.iter().any(|k| k.name.section == Some(name.as_str())) => {
                for (leaf, v) in inner {
                    let key = KEYS.iter().find(|k| k.name.section == Some(name.as_str()) && k.name.name == leaf);
                    let Some(key) = key else {
                        return Err(format!("{shown}: unknown key {name}.{leaf}{}", unknown_hint(Some(&name), &leaf)));
                    };
                    merged.add(key, Raw::Toml(v), Source::File(path.to_path_buf()));
                }
            }
            v => {
                let key = KEYS.iter().find(|k| k.name.section.is_none() && k.name.name == name);
                let Some(key) = key else {
                    return Err(format!("{shown}: unknown key {name}{}", unknown_hint(None, &name)));
                };
                merged.add(key, Raw::Toml(v), Source::File(path.to_path_buf()));
            }
        }
    }
    Ok(())
}
