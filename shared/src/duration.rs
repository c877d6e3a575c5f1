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
}
