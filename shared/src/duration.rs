//! Durations written the way operators write them in configuration: `"30s"`, `"5m"`, `"250ms"`.

use serde::{Deserialize, Deserializer};
use std::time::Duration;

/// Parses a human duration, naming the field in the error.
pub fn parse(field: &str, s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{field}: {s:?} is not a duration such as \"30s\" ({e})"))
}

/// Serde helper: a duration field written as a string.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s)
        .map_err(|e| serde::de::Error::custom(format!("{s:?} is not a duration such as \"30s\" ({e})")))
}

/// Serde helper: an optional duration field written as a string.
pub fn deserialize_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = Option::<String>::deserialize(d)?;
    s.map(|s| {
        humantime::parse_duration(&s)
            .map_err(|e| serde::de::Error::custom(format!("{s:?} is not a duration such as \"30s\" ({e})")))
    })
    .transpose()
}
