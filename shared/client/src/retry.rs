//! Bounded retries of idempotent calls. `Client` runs only two calls through `retrying`:
//! submit (the hub answers a repeat of the same idempotency key and content with the original
//! message) and report (a repeat of the same report id is counted once). Every other call is
//! sent once; its caller decides, knowing what a repeat would mean.
//!
//! `Backoff` paces a caller that retries for as long as it runs (a node's loops): the same
//! doubling ceiling, no bound on tries, each pause drawn from zero.

use crate::error::ClientError;
use crate::limits::{RETRY_ATTEMPTS_MAX, RETRY_BACKOFF_BASE, RETRY_BACKOFF_MAX};
use rand::Rng as _;
use std::future::Future;
use std::time::Duration;

/// How an idempotent call is retried: at most `attempts_max` tries, paused by a backoff that
/// starts at `backoff_base` and doubles up to `backoff_max` (each pause drawn from its upper
/// half, so many clients do not retry in step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries at most, the first included (at least 1).
    pub attempts_max: u32,
    /// The pause before the first retry.
    pub backoff_base: Duration,
    /// The longest pause.
    pub backoff_max: Duration,
}

impl Default for RetryPolicy {
    /// `RETRY_ATTEMPTS_MAX` tries, `RETRY_BACKOFF_BASE` doubling to `RETRY_BACKOFF_MAX`.
    fn default() -> Self {
        RetryPolicy {
            attempts_max: RETRY_ATTEMPTS_MAX,
            backoff_base: RETRY_BACKOFF_BASE,
            backoff_max: RETRY_BACKOFF_MAX,
        }
    }
}

impl RetryPolicy {
    /// One try, no retry.
    pub fn once() -> Self {
        RetryPolicy { attempts_max: 1, ..RetryPolicy::default() }
    }

    /// The pause after `failures` failed tries (1 for the first).
    fn pause(&self, failures: u32) -> Duration {
        let ceiling = ceiling(self.backoff_base, failures.saturating_sub(1), self.backoff_max);
        let half = ceiling / 2;
        half + random_up_to(half)
    }
}

/// `base` doubled once per earlier failure (`doublings`), never above `max`.
fn ceiling(base: Duration, doublings: u32, max: Duration) -> Duration {
    base.saturating_mul(1u32 << doublings.min(20)).min(max)
}

/// A pause drawn uniformly from zero to `ceiling`, by the millisecond.
fn random_up_to(ceiling: Duration) -> Duration {
    let ceiling_ms = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rand::rng().random_range(0..=ceiling_ms))
}

/// Pacing for a caller that retries for as long as it runs: each failure doubles the ceiling
/// from `base` up to `max`; each pause is drawn uniformly from zero to that ceiling ("full
/// jitter"), so a fleet of nodes that lost the hub at the same moment does not come back in one
/// burst. A success `reset`s it.
#[derive(Debug, Clone)]
pub struct Backoff {
    /// The ceiling after the first failure.
    base: Duration,
    /// The highest ceiling.
    max: Duration,
    /// Failures since the last `reset`.
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
    /// more failure. For a hub that does not answer at all, so that a restarted hub is regained
    /// soon after it listens again whatever the length of the outage.
    pub fn next_delay_within(&mut self, cap: Duration) -> Duration {
        let ceiling = ceiling(self.base, self.failures, self.max).min(cap);
        self.failures = self.failures.saturating_add(1);
        random_up_to(ceiling)
    }

    /// Forgets past failures after a success.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// Runs `call` until it succeeds, fails for good (not `is_transient`), or has been tried
/// `policy.attempts_max` times; returns the last result. Only for calls whose repeat the hub
/// recognises as the same request.
pub(crate) async fn retrying<T, F, Fut>(policy: &RetryPolicy, mut call: F) -> Result<T, ClientError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
{
    let attempts_max = policy.attempts_max.max(1);
    let mut failures = 0;
    loop {
        match call().await {
            Err(e) if e.is_transient() && failures + 1 < attempts_max => {
                failures += 1;
                tokio::time::sleep(policy.pause(failures)).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ApiError;
    use baton_shared::error::ErrorCode;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn fast(attempts_max: u32) -> RetryPolicy {
        RetryPolicy { attempts_max, backoff_base: Duration::from_millis(1), backoff_max: Duration::from_millis(2) }
    }

    fn refusal(code: ErrorCode) -> ClientError {
        ClientError::Api(ApiError {
            status: code.status(),
            code: Some(code),
            code_text: code.as_str().into(),
            message: String::new(),
        })
    }

    /// Tries `policy` against a call failing with `errors` in turn, then succeeding; returns
    /// how many tries were made and whether the last one succeeded.
    fn check(policy: RetryPolicy, errors: Vec<ClientError>) -> (u32, bool) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let tries = AtomicU32::new(0);
        let result = rt.block_on(retrying(&policy, || {
            let n = tries.fetch_add(1, Ordering::SeqCst) as usize;
            let e = errors.get(n).cloned();
            async move { e.map_or(Ok(()), Err) }
        }));
        (tries.load(Ordering::SeqCst), result.is_ok())
    }

    #[test]
    fn transient_failures_are_retried_until_success() {
        let lost = ClientError::Transport { detail: "timed out".into(), maybe_sent: true };
        assert_eq!(check(fast(5), vec![lost.clone(), refusal(ErrorCode::StorageUnavailable)]), (3, true));
    }

    #[test]
    fn retries_stop_at_the_bound() {
        let lost = ClientError::Transport { detail: "reset".into(), maybe_sent: true };
        assert_eq!(check(fast(3), vec![lost.clone(); 10]), (3, false));
        assert_eq!(check(RetryPolicy { attempts_max: 0, ..fast(1) }, vec![lost.clone(); 10]), (1, false));
        assert_eq!(check(RetryPolicy { attempts_max: 1, ..RetryPolicy::once() }, vec![lost; 10]).0, 1);
    }

    #[test]
    fn refusals_are_not_retried() {
        assert_eq!(check(fast(5), vec![refusal(ErrorCode::IdempotencyConflict)]), (1, false));
        assert_eq!(check(fast(5), vec![refusal(ErrorCode::CertificateRevoked)]), (1, false));
    }

    #[test]
    fn pauses_grow_and_stay_under_the_cap() {
        let p = RetryPolicy::default();
        for failures in 1..30 {
            let pause = p.pause(failures);
            assert!(pause <= p.backoff_max, "{failures}: {pause:?}");
        }
        assert!(p.pause(1) <= p.backoff_base && p.pause(1) >= p.backoff_base / 2);
        assert!(p.pause(40) >= p.backoff_max / 2);
    }

    #[test]
    fn a_backoff_grows_to_its_cap_and_resets() {
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
    fn a_backoff_draws_its_pauses_from_zero() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        for _ in 0..30 {
            b.next_delay();
        }
        let shortest = (0..200).map(|_| b.next_delay()).min().unwrap_or_default();
        assert!(shortest < Duration::from_millis(500), "pauses drawn from zero: shortest {shortest:?}");
    }

    #[test]
    fn a_cap_bounds_the_backoff_however_many_failures() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        let cap = Duration::from_secs(1);
        for _ in 0..200 {
            let d = b.next_delay_within(cap);
            assert!(d <= cap, "{d:?} exceeds {cap:?}");
        }
    }
}
