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

/// A duration as operators read it in CLI output and logs: days, hours and minutes as whole
/// units, then seconds with up to three decimals (`1m 0.003s`, `2h 5m`, `0.25s`, `0s`).
/// Unlike `humantime`'s `1m 3ms`, the seconds column never hides a unit change.
pub fn human(d: Duration) -> String {
    let total_ms = d.as_millis();
    let (days, rest) = (total_ms / 86_400_000, total_ms % 86_400_000);
    let (hours, rest) = (rest / 3_600_000, rest % 3_600_000);
    let (minutes, rest) = (rest / 60_000, rest % 60_000);
    let (seconds, millis) = (rest / 1000, rest % 1000);
    let mut parts: Vec<String> = Vec::new();
    for (n, unit) in [(days, "d"), (hours, "h"), (minutes, "m")] {
        if n > 0 {
            parts.push(format!("{n}{unit}"));
        }
    }
    if millis > 0 {
        let frac = format!("{millis:03}");
        parts.push(format!("{seconds}.{}s", frac.trim_end_matches('0')));
    } else if seconds > 0 || parts.is_empty() {
        parts.push(format!("{seconds}s"));
    }
    parts.join(" ")
}

/// `human` for a stored number of milliseconds; a negative one (never written by Baton) shows
/// as its number, so a damaged value is visible rather than hidden.
pub fn human_ms(ms: i64) -> String {
    match u64::try_from(ms) {
        Ok(ms) => human(Duration::from_millis(ms)),
        Err(_) => format!("{ms}ms"),
    }
}

/// Parses a moment written as RFC 3339 (`2026-05-01T12:00:00Z`) or as the CLI prints one
/// (`2026-05-01 12:00:00`, UTC), into unix milliseconds; the error names the field.
pub fn parse_time_ms(field: &str, s: &str) -> Result<i64, String> {
    let t = humantime::parse_rfc3339_weak(s.trim())
        .map_err(|e| format!("{field}: {s:?} is not a time such as \"2026-05-01 12:00:00\" (UTC) ({e})"))?;
    let since = t.duration_since(std::time::UNIX_EPOCH).map_err(|_| format!("{field}: {s:?} is before 1970"))?;
    i64::try_from(since.as_millis()).map_err(|_| format!("{field}: {s:?} is too far ahead"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(ms: u64, expected: &str) {
        assert_eq!(human(Duration::from_millis(ms)), expected, "{ms} ms");
    }

    #[test]
    fn durations_read_as_units_with_decimal_seconds() {
        check(0, "0s");
        check(3, "0.003s");
        check(250, "0.25s");
        check(1000, "1s");
        check(60_003, "1m 0.003s");
        check(60_000, "1m");
        check(61_500, "1m 1.5s");
        check(7_500_000, "2h 5m");
        check(90_061_001, "1d 1h 1m 1.001s");
        assert_eq!(human_ms(-5), "-5ms");
        assert_eq!(human_ms(60_003), "1m 0.003s");
    }

    #[test]
    fn times_parse_as_utc_in_both_spellings() {
        assert_eq!(parse_time_ms("t", "1970-01-01 00:01:00"), Ok(60_000));
        assert_eq!(parse_time_ms("t", "1970-01-01T00:01:00Z"), Ok(60_000));
        assert!(parse_time_ms("--until", "tomorrow").is_err_and(|e| e.contains("--until")));
    }
}
