//! Bounded retries of idempotent calls. `Client` runs only two calls through `retrying`:
//! submit (the hub answers a repeat of the same idempotency key and content with the original
//! message) and report (a repeat of the same report id is counted once). Every other call is
//! sent once; its caller decides, knowing what a repeat would mean.

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
        let ceiling =
            self.backoff_base.saturating_mul(1u32 << failures.saturating_sub(1).min(20)).min(self.backoff_max);
        let half = ceiling / 2;
        let jitter_ms = rand::rng().random_range(0..=half.as_millis() as u64);
        half + Duration::from_millis(jitter_ms)
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
}
