//! Barrier waits that say who they wait for: a wait longer than a threshold logs the ranks of
//! the workers it waits for, again at that interval, and shows their count in the metrics.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sparta_proto::metrics::{BarrierKind, Metrics};

/// Default wait before a barrier logs who it waits for.
pub const DEFAULT_WARN_AFTER: Duration = Duration::from_secs(10);

/// Who a barrier waits for, as seen by the waiter that reports it.
pub struct Missing {
    /// The barrier round (`sync step of generation 12`, `checkpoint after step 40`).
    pub what: String,
    /// Ranks of the workers it waits for.
    pub ranks: Vec<usize>,
}

/// Watches barrier waits: logs and counts the slow ones.
#[derive(Clone)]
pub struct StallWatch {
    after: Duration,
    metrics: Option<Arc<Metrics>>,
}

impl Default for StallWatch {
    fn default() -> Self {
        Self::new(DEFAULT_WARN_AFTER, None)
    }
}

impl StallWatch {
    /// Logs waits longer than `after` (and every `after` more), counting them in `metrics`.
    pub fn new(after: Duration, metrics: Option<Arc<Metrics>>) -> Self {
        Self {
            after: after.max(Duration::from_millis(1)),
            metrics,
        }
    }

    /// Awaits `done`. Each time `after` passes while it is pending, `missing` says who the
    /// barrier waits for (`None`: another waiter reports this round, or no one is missing);
    /// that is logged and set in the metrics until `done` resolves.
    pub async fn wait<T>(
        &self,
        kind: BarrierKind,
        done: impl Future<Output = T>,
        missing: impl Fn() -> Option<Missing>,
    ) -> T {
        let mut done = std::pin::pin!(done);
        let start = Instant::now();
        let mut reported = false;
        let out = loop {
            match tokio::time::timeout(self.after, &mut done).await {
                Ok(v) => break v,
                Err(_) => {
                    let Some(m) = missing() else { continue };
                    if m.ranks.is_empty() {
                        continue;
                    }
                    tracing::warn!(
                        "{}: waiting for worker(s) {} for {:.0} s (stopped, slow or gone?)",
                        m.what,
                        ranks(&m.ranks),
                        start.elapsed().as_secs_f64()
                    );
                    if let Some(metrics) = &self.metrics {
                        if !reported {
                            metrics.slow_barrier_wait(kind);
                        }
                        metrics.set_barrier_waiting(kind, m.ranks.len() as u64);
                    }
                    reported = true;
                }
            }
        };
        if reported {
            if let Some(metrics) = &self.metrics {
                metrics.set_barrier_waiting(kind, 0);
            }
        }
        out
    }
}

/// `0, 2, 5`.
fn ranks(r: &[usize]) -> String {
    r.iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_slow_wait_is_counted_and_shown_until_it_ends() {
        let m = Arc::new(Metrics::new("ps"));
        let w = StallWatch::new(Duration::from_millis(10), Some(Arc::clone(&m)));
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let w2 = w.clone();
        let waiting = tokio::spawn(async move {
            w2.wait(BarrierKind::Checkpoint, async { rx.await.unwrap() }, || {
                Some(Missing {
                    what: "checkpoint after step 5".into(),
                    ranks: vec![1, 2],
                })
            })
            .await
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while m.barrier_waiting(BarrierKind::Checkpoint) != 2 {
            assert!(Instant::now() < deadline, "the slow wait was never shown");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!waiting.is_finished());
        tx.send(7).unwrap();
        assert_eq!(waiting.await.unwrap(), 7);
        assert_eq!(m.barrier_waiting(BarrierKind::Checkpoint), 0);
        assert_eq!(m.barrier_slow_waits(BarrierKind::Checkpoint), 1);
        assert_eq!(m.barrier_slow_waits(BarrierKind::Sync), 0);
        assert!(m
            .render()
            .contains("sparta_barrier_slow_waits_total{role=\"ps\",barrier=\"checkpoint\"} 1"));
        // A fast wait, or one another waiter reports, leaves no trace.
        let v = w
            .wait(BarrierKind::Sync, async { 3 }, || unreachable!())
            .await;
        assert_eq!(v, 3);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (w2, asked2) = (w.clone(), Arc::clone(&asked));
        let quiet = tokio::spawn(async move {
            w2.wait(BarrierKind::Sync, async { rx.await.unwrap() }, || {
                asked2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                None
            })
            .await
        });
        while asked.load(std::sync::atomic::Ordering::SeqCst) < 2 {
            assert!(Instant::now() < deadline, "the wait was never checked");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tx.send(()).unwrap();
        quiet.await.unwrap();
        assert_eq!(m.barrier_slow_waits(BarrierKind::Sync), 0);
    }
}
