//! Idle exit: a shard that no worker or coordinator has sent a request for a while stops, so
//! a PS whose job is gone (its launcher killed, its workers never coming back) does not stay
//! up forever.
//!
//! Idleness is counted from the last request *received*: a request blocked at a barrier does
//! not renew it, so the limit must exceed the workers' RPC deadline (300 s), after which a
//! waiting worker sends again or fails.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default idle limit of `sparta ps --idle-exit-secs`.
pub const DEFAULT_IDLE_EXIT: Duration = Duration::from_secs(900);

/// When the shard last received a request.
#[derive(Debug)]
pub struct Activity {
    start: Instant,
    /// Milliseconds from `start` to the last request.
    last_ms: AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
}

impl Activity {
    /// A request arrived.
    pub fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Time since the last request (or the start, before any).
    pub fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

/// Resolves once `activity` has seen no request for `limit`; returns how long it was idle.
pub async fn idle_exit(activity: Arc<Activity>, limit: Duration) -> Duration {
    loop {
        let idle = activity.idle_for();
        if idle >= limit {
            return idle;
        }
        tokio::time::sleep(limit - idle).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn requests_postpone_the_idle_exit() {
        let a = Arc::new(Activity::default());
        let limit = Duration::from_millis(300);
        let watch = tokio::spawn(idle_exit(Arc::clone(&a), limit));
        // Requests every 50 ms for 600 ms: never idle for the limit.
        let t = Instant::now();
        while t.elapsed() < 2 * limit {
            a.touch();
            assert!(!watch.is_finished(), "exited while requests arrived");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let idle = watch.await.unwrap();
        assert!(idle >= limit, "{idle:?}");
        assert!(t.elapsed() >= 2 * limit + limit - Duration::from_millis(60));
    }
}
