//! Injected time. Stored timestamps are wall-clock unix milliseconds read from a `Clock`;
//! timeouts and waits use tokio's monotonic clock and never this one.
//!
//! Production code holds a `SystemClock`; tests hold a `ManualClock` and move it instead of
//! sleeping, so retention, fence expiry and retry times are tested without waiting.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// A source of wall-clock time in unix milliseconds.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        system_now_ms()
    }
}

/// The system's wall clock in unix milliseconds; a clock before 1970 reads as 0.
pub fn system_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A clock that moves only when told to. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    ms: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock that reads `start_ms`.
    pub fn new(start_ms: i64) -> Self {
        ManualClock { ms: Arc::new(AtomicI64::new(start_ms)) }
    }
    /// Moves the clock by `delta_ms` (negative steps back, as a clock step would).
    pub fn advance_ms(&self, delta_ms: i64) {
        self.ms.fetch_add(delta_ms, Ordering::SeqCst);
    }
    /// Sets the clock to `ms`.
    pub fn set_ms(&self, ms: i64) {
        self.ms.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.ms.load(Ordering::SeqCst)
    }
}

/// The clock type most code holds.
pub type SharedClock = Arc<dyn Clock>;

/// The system clock, shared.
pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(1_000);
        let shared: SharedClock = Arc::new(c.clone());
        assert_eq!(shared.now_ms(), 1_000);
        c.advance_ms(500);
        assert_eq!(shared.now_ms(), 1_500);
        c.advance_ms(-3_600_000);
        assert_eq!(shared.now_ms(), 1_500 - 3_600_000);
        c.set_ms(7);
        assert_eq!(shared.now_ms(), 7);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }
}
