//! Bounded exponential backoff with jitter, for every retry against the hub.

use rand::Rng as _;
use std::time::Duration;

/// Retry pacing: each failure doubles the pause from `base` up to `max`; each pause is drawn
/// uniformly from its upper half ("equal jitter"), so a fleet of nodes does not retry in step.
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
        let ceiling = self.base.saturating_mul(1u32 << self.failures.min(20)).min(self.max);
        self.failures = self.failures.saturating_add(1);
        let half = ceiling / 2;
        let jitter_ms = rand::rng().random_range(0..=half.as_millis() as u64);
        half + Duration::from_millis(jitter_ms)
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
        assert!(first >= base / 2 && first <= base, "{first:?}");
        for _ in 0..100 {
            let d = b.next_delay();
            assert!(d <= max, "{d:?} exceeds the cap");
        }
        assert!(b.next_delay() >= max / 2, "after many failures the pause sits near the cap");
        b.reset();
        assert!(b.next_delay() <= base);
    }
}
