//! Retries with exponential backoff, on the `backon` crate: one policy ([`Backoff`]) for the
//! blocking callers (checkpoint writes) and, with the `object-store` feature, the async ones
//! (object requests on the runtime of `BlockingRuntime`).
//!
//! A policy allows `max_attempts` attempts in all. The wait after the first failure is
//! `first`; each further wait doubles, up to `max` (a `first` above `max` is waited once, then
//! `max`). No jitter: the waits are what the policy says. Only the errors the caller's
//! `retry_if` accepts are retried; any other is returned at once.

use std::time::Duration;

use backon::BlockingRetryable;

/// How a failing operation is retried (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Attempts in all, the first included (0 counts as 1).
    pub max_attempts: u32,
    /// Wait after the first failed attempt.
    pub first: Duration,
    /// Longest wait between two attempts.
    pub max: Duration,
}

impl Backoff {
    /// `max_attempts` attempts, waiting `first`, then doubling up to `max`.
    pub fn new(max_attempts: u32, first: Duration, max: Duration) -> Backoff {
        Backoff {
            max_attempts,
            first,
            max,
        }
    }

    /// The waits between the attempts, in order: `max_attempts - 1` of them.
    pub fn delays(&self) -> Delays {
        Delays {
            next: self.first,
            max: self.max,
            left: self.max_attempts.max(1) - 1,
        }
    }

    /// Runs `op` until it succeeds, fails with an error `retry_if` refuses, or has been tried
    /// `max_attempts` times; the last error then. Before each wait `notify(error, wait)` is
    /// called (to log or count the retry). Sleeps the calling thread.
    pub fn run_blocking<T, E>(
        &self,
        op: impl FnMut() -> Result<T, E>,
        retry_if: impl FnMut(&E) -> bool,
        notify: impl FnMut(&E, Duration),
    ) -> Result<T, E> {
        op.retry(self.delays())
            .sleep(std::thread::sleep)
            .when(retry_if)
            .notify(notify)
            .call()
    }

    /// [`Backoff::run_blocking`] for async operations, waiting with `tokio::time::sleep` (so it
    /// runs on a tokio runtime with the time driver, as [`crate::runtime::BlockingRuntime`]'s).
    #[cfg(feature = "object-store")]
    pub async fn run_async<T, E, Fut>(
        &self,
        op: impl FnMut() -> Fut,
        retry_if: impl FnMut(&E) -> bool,
        notify: impl FnMut(&E, Duration),
    ) -> Result<T, E>
    where
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        use backon::Retryable;
        op.retry(self.delays())
            .sleep(tokio::time::sleep)
            .when(retry_if)
            .notify(notify)
            .await
    }
}

/// The waits of a [`Backoff`], exactly doubled (`backon`'s own exponential backoff multiplies
/// in `f32`, which would not give `2 * first` exactly).
#[derive(Clone, Debug)]
pub struct Delays {
    next: Duration,
    max: Duration,
    left: u32,
}

impl Iterator for Delays {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let now = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        Some(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn delays_double_from_the_first_up_to_the_max() {
        let b = Backoff::new(6, 200 * MS, 1000 * MS);
        let got: Vec<Duration> = b.delays().collect();
        assert_eq!(got, [200 * MS, 400 * MS, 800 * MS, 1000 * MS, 1000 * MS]);
        // One attempt (or zero, counted as one): no wait.
        assert_eq!(Backoff::new(1, MS, MS).delays().count(), 0);
        assert_eq!(Backoff::new(0, MS, MS).delays().count(), 0);
        // A first wait above the max is waited once, then the max.
        let got: Vec<Duration> = Backoff::new(4, 8 * MS, 5 * MS).delays().collect();
        assert_eq!(got, [8 * MS, 5 * MS, 5 * MS]);
    }

    #[test]
    fn blocking_retries_until_success_or_the_last_attempt() {
        let b = Backoff::new(3, MS, 4 * MS);
        // Success on the third attempt: two notifications.
        let (mut calls, mut notified) = (0, Vec::new());
        let v: Result<u32, &str> = b.run_blocking(
            || {
                calls += 1;
                if calls < 3 {
                    Err("transient")
                } else {
                    Ok(calls)
                }
            },
            |_| true,
            |e, d| notified.push((e.to_string(), d)),
        );
        assert_eq!(v, Ok(3));
        assert_eq!(
            notified,
            [("transient".into(), MS), ("transient".into(), 2 * MS)]
        );
        // Always failing: `max_attempts` attempts, then the last error.
        let mut calls = 0;
        let e: Result<(), u32> = b.run_blocking(
            || {
                calls += 1;
                Err(calls)
            },
            |_| true,
            |_, _| {},
        );
        assert_eq!(e, Err(3));
        // An error `retry_if` refuses: returned at once, no notification.
        let (mut calls, mut notes) = (0, 0);
        let e: Result<(), &str> = b.run_blocking(
            || {
                calls += 1;
                Err("fatal")
            },
            |e| *e != "fatal",
            |_, _| notes += 1,
        );
        assert_eq!((e, calls, notes), (Err("fatal"), 1, 0));
    }

    #[cfg(feature = "object-store")]
    #[test]
    fn async_retries_follow_the_same_policy() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let b = Backoff::new(4, MS, 2 * MS);
        let calls = std::sync::atomic::AtomicU32::new(0);
        let mut waits = Vec::new();
        let r: Result<(), u32> = rt.block_on(b.run_async(
            || async {
                let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                Err(n)
            },
            |e| *e < 10,
            |_, d| waits.push(d),
        ));
        assert_eq!(r, Err(4));
        assert_eq!(waits, [MS, 2 * MS, 2 * MS]);
    }
}
