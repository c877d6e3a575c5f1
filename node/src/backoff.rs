//! Bounded exponential backoff with full jitter, for every retry against the hub.

use rand::Rng as _;
use std::time::Duration;

/// Retry pacing: each failure doubles the ceiling from `base` up to `max`; each pause is drawn
/// uniformly from zero to that ceiling ("full jitter"), so a fleet of nodes that lost the hub
/// at the same moment does not come back in one burst.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    /// A backoff that starts at `base` and never pauses longer than `max`.
    pub fn new(base: Duration, max: Duration) -> Backoff {
        assert!(base <= max, "backoff base {base:?} must not exceed its cap {max:?}");
        Backoff { base, max, failures: 0 }
    }

    /// The pause before the next retry; counts one more failure.
    pub fn next_delay(&mut self) -> Duration {
        self.next_delay_within(self.max)
    }

    /// The pause before the next retry, never longer than `cap` (nor than `max`); counts one
    /// more failure. Used when the hub does not answer at all, so that a restarted hub is
    /// regained soon after it listens again whatever the length of the outage.
    pub fn next_delay_within(&mut self, cap: Duration) -> Duration {
        let ceiling = self.base.saturating_mul(1u32 << self.failures.min(20)).min(self.max).min(cap);
        self.failures = self.failures.saturating_add(1);
        let ceiling_ms = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(rand::rng().random_range(0..=ceiling_ms))
    }

    /// Forgets past failures after a success.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_and_resets() {
        let (base, max) = (Duration::from_millis(100), Duration::from_secs(2));
        let mut b = Backoff::new(base, max);
        let first = b.next_delay();
        assert!(first <= base, "{first:?}");
        let mut longest = Duration::ZERO;
        for _ in 0..200 {
            let d = b.next_delay();
            assert!(d <= max, "{d:?} exceeds the cap");
            longest = longest.max(d);
        }
        assert!(longest > max / 2, "after many failures the ceiling is the cap: longest {longest:?}");
        b.reset();
        assert!(b.next_delay() <= base);
    }

    #[test]
    fn full_jitter_spreads_pauses_from_zero() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        for _ in 0..30 {
            b.next_delay();
        }
        let shortest = (0..200).map(|_| b.next_delay()).min().unwrap_or_default();
        assert!(shortest < Duration::from_millis(500), "pauses drawn from zero: shortest {shortest:?}");
    }

    #[test]
    fn a_cap_bounds_the_pause_however_many_failures() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        let cap = Duration::from_secs(1);
        for _ in 0..200 {
            let d = b.next_delay_within(cap);
            assert!(d <= cap, "{d:?} exceeds {cap:?}");
        }
    }
}
