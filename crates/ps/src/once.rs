//! Exactly-once pushes: per worker rank, the push last admitted and the answer it got, so a
//! retry of it (the same [`PushId`], sent again after a broken connection) is answered with
//! the first answer instead of being applied a second time.
//!
//! The log is part of a shard's state (like its tables): small, per rank, and cloneable out
//! of the lock. It knows nothing of gRPC; the server decides what an answer (`R`) and a
//! failure (`E`) are.

use parking_lot::Mutex;
use tokio::sync::watch;

/// One logical push of one worker, the same on every attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PushId {
    /// The worker's rank.
    pub rank: u32,
    /// Random per worker store: a restarted worker (or a rolled-back run) starts a new one.
    pub session: u64,
    /// Rises with every push of the session (sparse: the store's push count; dense: the step).
    pub seq: u64,
}

/// Why a push id was refused (nothing was applied).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The rank is not one of the job's workers.
    #[error("push id names worker rank {rank} but this PS was started for {workers} worker(s) (--workers)")]
    Rank {
        /// The request's rank.
        rank: u32,
        /// Workers of the job.
        workers: usize,
    },
    /// An older push than the last one admitted from the same session: a stale retry.
    #[error(
        "push {seq} of worker {rank} (session {session:#018x}) is older than its push {last} \
         already applied: a stale retry, not applied"
    )]
    Stale {
        /// The request's rank.
        rank: u32,
        /// The request's session.
        session: u64,
        /// The request's sequence number.
        seq: u64,
        /// The last sequence number admitted.
        last: u64,
    },
    /// A session of the rank that a newer one replaced (the worker restarted since).
    #[error(
        "push {seq} of worker {rank} comes from session {session:#018x}, which session \
         {current:#018x} replaced (the worker restarted): not applied"
    )]
    Replaced {
        /// The request's rank.
        rank: u32,
        /// The request's (old) session.
        session: u64,
        /// The request's sequence number.
        seq: u64,
        /// The rank's current session.
        current: u64,
    },
}

/// What became of an admitted push: `None` while it is being applied.
type Outcome<R, E> = Option<Result<R, E>>;

/// Sessions of a rank remembered as replaced (their late retries are refused).
const RETIRED: usize = 4;

/// A rank's latest push.
struct Entry<R, E> {
    session: u64,
    seq: u64,
    outcome: watch::Receiver<Outcome<R, E>>,
    /// Earlier sessions of the rank, newest last.
    retired: Vec<u64>,
}

impl<R, E> Entry<R, E> {
    /// The push was not applied: it failed, or its ticket was dropped unfinished.
    fn failed(&self) -> bool {
        let closed = self.outcome.has_changed().is_err();
        match &*self.outcome.borrow() {
            Some(Ok(_)) => false,
            Some(Err(_)) => true,
            None => closed,
        }
    }
}

/// What to do with a push.
pub enum Admit<R, E> {
    /// First time this id is seen: apply it, then [`Ticket::finish`] with the answer.
    Apply(Ticket<R, E>),
    /// Applied already, or being applied: [`Repeat::outcome`] is the first attempt's answer.
    Repeat(Repeat<R, E>),
}

/// The right and duty to apply one push; repeats of it wait for [`Ticket::finish`].
pub struct Ticket<R, E> {
    tx: watch::Sender<Outcome<R, E>>,
}

impl<R, E> Ticket<R, E> {
    /// Records the answer (an error: nothing was applied, a repeat applies it anew) and
    /// wakes the repeats waiting for it.
    pub fn finish(self, outcome: Result<R, E>) {
        self.tx.send_replace(Some(outcome));
    }
}

/// A repeat of a push admitted before.
pub struct Repeat<R, E> {
    rx: watch::Receiver<Outcome<R, E>>,
}

impl<R: Clone, E: Clone> Repeat<R, E> {
    /// Waits for the first attempt's answer; `None` when its ticket was dropped unfinished.
    pub async fn outcome(mut self) -> Option<Result<R, E>> {
        self.rx
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|o| o.clone())
    }
}

/// Per worker rank: the session, the last push admitted and its answer.
pub struct PushLog<R, E> {
    ranks: Mutex<Vec<Option<Entry<R, E>>>>,
}

impl<R, E> PushLog<R, E> {
    /// An empty log for `workers` ranks.
    pub fn new(workers: usize) -> Self {
        Self {
            ranks: Mutex::new((0..workers).map(|_| None).collect()),
        }
    }

    /// Admits push `id`: to apply (a new id, or a repeat of one that failed), or a repeat.
    /// A new session of a rank replaces its entry; an older id than the rank's last, or one
    /// of a replaced session, is refused.
    pub fn admit(&self, id: PushId) -> Result<Admit<R, E>, Refused> {
        let mut ranks = self.ranks.lock();
        let workers = ranks.len();
        let slot = ranks.get_mut(id.rank as usize).ok_or(Refused::Rank {
            rank: id.rank,
            workers,
        })?;
        let mut retired = Vec::new();
        if let Some(e) = slot.as_mut() {
            if e.session == id.session {
                if id.seq < e.seq {
                    return Err(Refused::Stale {
                        rank: id.rank,
                        session: id.session,
                        seq: id.seq,
                        last: e.seq,
                    });
                }
                if id.seq == e.seq && !e.failed() {
                    return Ok(Admit::Repeat(Repeat {
                        rx: e.outcome.clone(),
                    }));
                }
                retired = std::mem::take(&mut e.retired);
            } else if e.retired.contains(&id.session) {
                return Err(Refused::Replaced {
                    rank: id.rank,
                    session: id.session,
                    seq: id.seq,
                    current: e.session,
                });
            } else {
                retired = std::mem::take(&mut e.retired);
                if retired.len() == RETIRED {
                    retired.remove(0);
                }
                retired.push(e.session);
            }
        }
        let (tx, rx) = watch::channel(None);
        *slot = Some(Entry {
            session: id.session,
            seq: id.seq,
            outcome: rx,
            retired,
        });
        Ok(Admit::Apply(Ticket { tx }))
    }

    /// The rank's session and last admitted sequence number, if it pushed.
    pub fn last(&self, rank: u32) -> Option<(u64, u64)> {
        let ranks = self.ranks.lock();
        ranks
            .get(rank as usize)?
            .as_ref()
            .map(|e| (e.session, e.seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
    use std::sync::Arc;

    type Log = PushLog<u32, String>;

    fn id(rank: u32, session: u64, seq: u64) -> PushId {
        PushId { rank, session, seq }
    }

    /// Applies `id` with `apply` unless the log says it was: the server's use of the log.
    async fn once(log: &Log, id: PushId, apply: impl FnOnce() -> u32) -> Result<u32, String> {
        match log.admit(id).map_err(|e| e.to_string())? {
            Admit::Apply(t) => {
                let r = apply();
                t.finish(Ok(r));
                Ok(r)
            }
            Admit::Repeat(r) => r.outcome().await.expect("finished"),
        }
    }

    #[tokio::test]
    async fn the_same_id_twice_is_applied_once_and_answered_alike() {
        let log = Log::new(2);
        let applied = AtomicU32::new(0);
        let apply = || applied.fetch_add(1, Relaxed) + 10;
        assert_eq!(once(&log, id(1, 7, 0), apply).await, Ok(10));
        assert_eq!(once(&log, id(1, 7, 0), apply).await, Ok(10));
        assert_eq!(applied.load(Relaxed), 1);
        // The next push of the rank, and another rank's, are applied.
        assert_eq!(once(&log, id(1, 7, 1), apply).await, Ok(11));
        assert_eq!(once(&log, id(0, 9, 0), apply).await, Ok(12));
        assert_eq!(log.last(1), Some((7, 1)));
        assert_eq!(log.last(0), Some((9, 0)));
    }

    #[tokio::test]
    async fn an_older_id_is_refused_naming_rank_session_and_seq() {
        let log = Log::new(1);
        once(&log, id(0, 7, 5), || 1).await.unwrap();
        let e = once(&log, id(0, 7, 4), || panic!("applied"))
            .await
            .unwrap_err();
        assert!(
            e.contains("push 4 of worker 0")
                && e.contains("0x0000000000000007")
                && e.contains("push 5"),
            "{e}"
        );
        let e = once(&log, id(3, 7, 4), || panic!("applied"))
            .await
            .unwrap_err();
        assert!(e.contains("rank 3") && e.contains("1 worker(s)"), "{e}");
    }

    #[tokio::test]
    async fn a_new_session_resets_the_rank_and_its_old_session_is_refused() {
        let log = Log::new(1);
        once(&log, id(0, 7, 5), || 1).await.unwrap();
        // A restarted worker counts from 0 again.
        assert_eq!(once(&log, id(0, 8, 0), || 2).await, Ok(2));
        assert_eq!(log.last(0), Some((8, 0)));
        let e = once(&log, id(0, 7, 6), || panic!("applied"))
            .await
            .unwrap_err();
        assert!(e.contains("replaced"), "{e}");
        // Only the last few sessions are remembered.
        for s in 9..9 + RETIRED as u64 {
            once(&log, id(0, s, 0), || 3).await.unwrap();
        }
        assert_eq!(once(&log, id(0, 7, 0), || 4).await, Ok(4));
    }

    #[tokio::test]
    async fn a_failed_push_is_applied_anew_when_repeated() {
        let log = Log::new(1);
        let Admit::Apply(t) = log.admit(id(0, 1, 0)).unwrap() else {
            panic!("new id")
        };
        t.finish(Err("not initialised".into()));
        assert_eq!(once(&log, id(0, 1, 0), || 5).await, Ok(5));
        // A ticket dropped unfinished (its apply panicked) also counts as not applied.
        let Admit::Apply(t) = log.admit(id(0, 1, 1)).unwrap() else {
            panic!("new id")
        };
        drop(t);
        assert_eq!(once(&log, id(0, 1, 1), || 6).await, Ok(6));
    }

    #[tokio::test]
    async fn a_repeat_during_the_first_attempt_waits_for_its_answer() {
        let log = Arc::new(Log::new(1));
        let Admit::Apply(first) = log.admit(id(0, 1, 3)).unwrap() else {
            panic!("new id")
        };
        let log2 = Arc::clone(&log);
        let repeat =
            tokio::spawn(async move { once(&log2, id(0, 1, 3), || panic!("applied twice")).await });
        // The repeat is parked on the first attempt's answer (it holds a second receiver).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while first.tx.receiver_count() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the repeat never came"
            );
            tokio::task::yield_now().await;
        }
        assert!(!repeat.is_finished());
        first.finish(Ok(42));
        assert_eq!(repeat.await.unwrap(), Ok(42));
        // A repeat of an abandoned attempt learns it was abandoned.
        let Admit::Apply(t) = log.admit(id(0, 1, 4)).unwrap() else {
            panic!("new id")
        };
        let Admit::Repeat(r) = log.admit(id(0, 1, 4)).unwrap() else {
            panic!("a repeat")
        };
        drop(t);
        assert_eq!(r.outcome().await, None);
    }
}
