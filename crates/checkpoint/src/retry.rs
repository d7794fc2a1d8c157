//! Checkpoint writes that fail (a full disk, an unreachable store): each failed attempt's
//! partial checkpoint is removed and the write retried with backoff; after `max_failures`
//! consecutive failures the caller gets [`CheckpointError::GaveUp`] and stops the job. The
//! attempts and waits are the blob layer's [`Backoff`] (on `backon`).

use std::cell::Cell;
use std::time::Duration;

use sparta_blob::Backoff;

use crate::error::{CheckpointError, Result};

/// How failed checkpoint writes are retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Consecutive failed attempts after which the write gives up (at least 1).
    pub max_failures: u32,
    /// Wait after the first failure; doubles after each further one.
    pub first_backoff: Duration,
    /// Longest wait between two attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// One attempt: no retry.
    fn default() -> Self {
        Self::new(1)
    }
}

impl RetryPolicy {
    /// `max_failures` attempts, 1 s apart at first, doubling up to 30 s.
    pub fn new(max_failures: u32) -> Self {
        Self {
            max_failures: max_failures.max(1),
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
        }
    }

    /// The same number of attempts with the given first backoff.
    pub fn with_backoff(mut self, first: Duration) -> Self {
        self.first_backoff = first;
        self.max_backoff = self.max_backoff.max(first);
        self
    }

    /// Runs `attempt` until it succeeds. After each failure `cleanup` removes what the attempt
    /// left; a storage failure ([`CheckpointError::Io`]) is retried after a backoff, up to
    /// `max_failures` attempts in all, then reported as [`CheckpointError::GaveUp`]; any other
    /// error is returned at once. `what` names the write in logs and errors.
    pub fn run<T>(
        &self,
        what: &str,
        mut attempt: impl FnMut() -> Result<T>,
        mut cleanup: impl FnMut(),
    ) -> Result<T> {
        let failures = Cell::new(0u32);
        let backoff = Backoff::new(self.max_failures, self.first_backoff, self.max_backoff);
        let result = backoff.run_blocking(
            || {
                attempt().inspect_err(|e| {
                    cleanup();
                    if is_retried(e) {
                        failures.set(failures.get() + 1);
                    }
                })
            },
            is_retried,
            |e, delay| {
                tracing::warn!(
                    "{what} failed ({} of at most {} consecutive failures): {e}; the partial \
                     checkpoint was removed, retrying in {delay:?}",
                    failures.get(),
                    self.max_failures
                )
            },
        );
        result.map_err(|e| {
            if is_retried(&e) {
                CheckpointError::GaveUp {
                    what: what.to_string(),
                    failures: failures.get(),
                    last: Box::new(e),
                }
            } else {
                e
            }
        })
    }
}

/// Whether a failed write is retried: storage failures are.
fn is_retried(e: &CheckpointError) -> bool {
    matches!(e, CheckpointError::Io { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> CheckpointError {
        CheckpointError::io("x", std::io::Error::other("No space left on device"))
    }

    #[test]
    fn failures_are_cleaned_up_retried_and_given_up_after_the_limit() {
        let p = RetryPolicy::new(3).with_backoff(Duration::from_millis(1));
        let (mut calls, mut cleanups) = (0, 0);
        let r: Result<()> = p.run(
            "checkpoint 4",
            || {
                calls += 1;
                Err(io())
            },
            || cleanups += 1,
        );
        let e = r.unwrap_err();
        assert!(
            matches!(&e, CheckpointError::GaveUp { failures: 3, .. }),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("checkpoint 4") && msg.contains("3 times") && msg.contains("No space"),
            "{msg}"
        );
        assert_eq!((calls, cleanups), (3, 3));
        // Success after two failures: the count starts over next time.
        let mut calls = 0;
        let v = p
            .run(
                "c",
                || {
                    calls += 1;
                    if calls < 3 {
                        Err(io())
                    } else {
                        Ok(calls)
                    }
                },
                || {},
            )
            .unwrap();
        assert_eq!(v, 3);
        // Not a storage failure: no retry.
        let mut calls = 0;
        let e = p
            .run::<()>(
                "c",
                || {
                    calls += 1;
                    Err(CheckpointError::Usage("bug".into()))
                },
                || {},
            )
            .unwrap_err();
        assert!(matches!(e, CheckpointError::Usage(_)));
        assert_eq!(calls, 1);
    }
}
