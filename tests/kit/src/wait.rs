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
