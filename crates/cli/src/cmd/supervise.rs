//! What `sparta launch` does when one of its processes exits: a small state machine over
//! process events, separate from the process handling so it can be tested alone.
//!
//! Recovery is a coordinated rollback: when a PS exits (for any reason) or a worker fails, and
//! the job checkpoints, every process is stopped and the whole cluster restarts from the newest
//! valid checkpoint: each PS from its part, each worker from its saved input position. A
//! rollback keeps the two guarantees a partial restart cannot: the PS state and the worker
//! positions belong to the same instant (no sample skipped or applied twice), and the sync
//! barrier starts again at the checkpoint's step on every shard.

use std::time::Duration;

/// The two kinds of processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A parameter-server shard.
    Ps,
    /// A training worker.
    Worker,
}

impl Kind {
    /// Short name used in process labels (`ps0`, `w1`).
    pub fn label(self, index: usize) -> String {
        match self {
            Kind::Ps => format!("ps{index}"),
            Kind::Worker => format!("w{index}"),
        }
    }
}

/// How failures are handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The job writes checkpoints, so a failure can be recovered from.
    pub recover: bool,
    /// Restarts allowed over the whole job (each failure counts one).
    pub max_restarts: u32,
}

/// What to do after an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Keep waiting.
    Continue,
    /// Every worker finished: stop the PS shards and report.
    Finish,
    /// Stop everything and restart the cluster from the newest checkpoint after `delay`.
    Rollback {
        /// Which process died and how.
        reason: String,
        /// Backoff before restarting.
        delay: Duration,
    },
    /// Stop everything; the job failed (the message says why).
    Fail(String),
}

/// Restarts counted per process kind (the process that died, not the ones stopped with it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restarts {
    /// PS shards that died.
    pub ps: u64,
    /// Workers that failed.
    pub worker: u64,
}

/// The supervisor's state.
#[derive(Debug)]
pub struct Supervisor {
    policy: Policy,
    done: Vec<bool>,
    restarts: Restarts,
    rollbacks: u32,
}

/// First restart delay; doubles per rollback up to [`MAX_DELAY`].
const FIRST_DELAY: Duration = Duration::from_millis(250);
const MAX_DELAY: Duration = Duration::from_secs(5);

impl Supervisor {
    /// A supervisor of `workers` workers.
    pub fn new(policy: Policy, workers: usize) -> Self {
        Supervisor {
            policy,
            done: vec![false; workers],
            restarts: Restarts::default(),
            rollbacks: 0,
        }
    }

    /// Restarts so far.
    pub fn restarts(&self) -> Restarts {
        self.restarts
    }

    /// Rollbacks so far.
    pub fn rollbacks(&self) -> u32 {
        self.rollbacks
    }

    /// Process `kind` `index` exited (`status` describes how; `success` when with status 0).
    pub fn on_exit(&mut self, kind: Kind, index: usize, success: bool, status: &str) -> Action {
        if kind == Kind::Worker && success {
            if let Some(d) = self.done.get_mut(index) {
                *d = true;
            }
            return if self.done.iter().all(|d| *d) {
                Action::Finish
            } else {
                Action::Continue
            };
        }
        let who = kind.label(index);
        let what = format!("{who} exited with {status} while the job was running");
        if !self.policy.recover {
            return Action::Fail(format!(
                "{what}; the job has no checkpoints (--checkpoint-dir), so it cannot recover \
                 (see the [{who}] lines above)"
            ));
        }
        let used = self.restarts.ps + self.restarts.worker;
        if used >= u64::from(self.policy.max_restarts) {
            return Action::Fail(format!(
                "{what}; giving up after {used} restart(s) (--max-restarts {})",
                self.policy.max_restarts
            ));
        }
        match kind {
            Kind::Ps => self.restarts.ps += 1,
            Kind::Worker => self.restarts.worker += 1,
        }
        self.rollbacks += 1;
        self.done.iter_mut().for_each(|d| *d = false);
        let delay = FIRST_DELAY
            .saturating_mul(1 << (self.rollbacks - 1).min(16))
            .min(MAX_DELAY);
        Action::Rollback {
            reason: what,
            delay,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECOVER: Policy = Policy {
        recover: true,
        max_restarts: 2,
    };

    #[test]
    fn the_job_finishes_when_every_worker_succeeded() {
        let mut s = Supervisor::new(RECOVER, 2);
        assert_eq!(s.on_exit(Kind::Worker, 1, true, "0"), Action::Continue);
        assert_eq!(s.on_exit(Kind::Worker, 0, true, "0"), Action::Finish);
        assert_eq!(s.restarts(), Restarts::default());
    }

    #[test]
    fn failures_roll_back_with_growing_delay_and_count_by_kind() {
        let mut s = Supervisor::new(RECOVER, 2);
        assert_eq!(s.on_exit(Kind::Worker, 1, true, "0"), Action::Continue);
        let a = s.on_exit(Kind::Ps, 1, false, "signal 9");
        let Action::Rollback { reason, delay } = a else {
            panic!("{a:?}")
        };
        assert!(
            reason.contains("ps1") && reason.contains("signal 9"),
            "{reason}"
        );
        assert_eq!(delay, FIRST_DELAY);
        // Worker 1 had finished, but the rollback restarts it: both must finish again.
        assert_eq!(s.on_exit(Kind::Worker, 0, true, "0"), Action::Continue);
        let Action::Rollback { delay, .. } = s.on_exit(Kind::Worker, 0, false, "1") else {
            panic!()
        };
        assert_eq!(delay, FIRST_DELAY * 2);
        assert_eq!(s.restarts(), Restarts { ps: 1, worker: 1 });
        assert_eq!(s.rollbacks(), 2);
        // A PS that exits with status 0 mid-job is a failure too; the budget is spent.
        let a = s.on_exit(Kind::Ps, 0, true, "0");
        assert!(
            matches!(&a, Action::Fail(m) if m.contains("--max-restarts 2")),
            "{a:?}"
        );
    }

    #[test]
    fn without_checkpoints_a_failure_ends_the_job() {
        let mut s = Supervisor::new(
            Policy {
                recover: false,
                max_restarts: 5,
            },
            1,
        );
        let a = s.on_exit(Kind::Ps, 0, false, "signal 9");
        assert!(
            matches!(&a, Action::Fail(m) if m.contains("no checkpoints")),
            "{a:?}"
        );
    }
}
