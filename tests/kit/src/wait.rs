//! The one polling wait: ask until the answer is there, fail at the deadline.

use anyhow::bail;
use std::time::{Duration, Instant};

/// How often `until` asks again. Each question may run a CLI command, so not too often.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Calls `f` every `POLL_INTERVAL` until it returns `Some`, and returns that. Fails with a
/// message naming `what` when `limit` passes first, or as soon as `f` fails.
pub fn until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> anyhow::Result<Option<T>>) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        if start.elapsed() >= limit {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_returns_the_first_answer() {
        let mut calls = 0;
        let got = until("three calls", Duration::from_secs(20), || {
            calls += 1;
            Ok((calls == 3).then_some(calls))
        });
        assert_eq!(got.unwrap(), 3);
    }

    #[test]
    fn until_fails_at_the_deadline_naming_what_it_waited_for() {
        let err = until("nothing", Duration::from_millis(100), || Ok(None::<()>)).unwrap_err().to_string();
        assert!(err.contains("waiting for nothing"), "{err}");
    }

    #[test]
    fn until_stops_at_the_first_error() {
        let mut calls = 0;
        let err = until("an error", Duration::from_secs(20), || -> anyhow::Result<Option<()>> {
            calls += 1;
            anyhow::bail!("broken")
        });
        assert_eq!((err.unwrap_err().to_string(), calls), ("broken".to_string(), 1));
    }
}
