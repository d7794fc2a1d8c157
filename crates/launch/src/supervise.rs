//! What the launcher does when its processes exit: a small state machine over process events,
//! separate from the process handling so it can be tested alone.
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
    /// The coordinator of replicated shards (one; its index is 0).
    Coordinator,
}

impl Kind {
    /// Short name used in process labels (`ps0`, `w1`).
    pub fn label(self, index: usize) -> String {
        match self {
            Kind::Ps => format!("ps{index}"),
            Kind::Worker => format!("w{index}"),
            Kind::Coordinator => "coord".into(),
        }
    }
}

/// Exit status of a `sparta` process that stopped for a job-level reason a restart from the
/// last checkpoint would not fix (e.g. checkpoints kept failing): the launcher stops the job
/// instead of rolling back.
pub const EXIT_JOB_FAILED: i32 = 3;

/// One process that exited on its own (not stopped by the launcher).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    /// Its kind.
    pub kind: Kind,
    /// Its index among its kind (shard or rank).
    pub index: usize,
    /// Exited with status 0.
    pub success: bool,
    /// How it exited, in words (`exit status: 1`, `signal: 9 (SIGKILL)`).
    pub status: String,
    /// It exited with [`EXIT_JOB_FAILED`]: the job stops, no rollback.
    pub job_failed: bool,
}

impl Exit {
    /// Whether this exit is a failure of the job (a PS or the coordinator exiting at all, or
    /// a worker failing).
    pub fn is_failure(&self) -> bool {
        self.kind != Kind::Worker || !self.success
    }

    fn describe(&self) -> String {
        format!(
            "{} exited with {} while the job was running",
            self.kind.label(self.index),
            self.status
        )
    }
}

/// How failures are handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The job writes checkpoints, so a failure can be recovered from.
    pub recover: bool,
    /// Restarts allowed over the whole job (each process that fails counts one).
    pub max_restarts: u32,
    /// Copies of every PS shard (1: none). With more, PS processes that die fewer than this
    /// many at once are restarted alone: their shards failed over to their backups, and
    /// the restarted processes rejoin as backups; no rollback, checkpoints or not.
    pub replicas: usize,
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
        /// Which processes died and how.
        reason: String,
        /// Backoff before restarting.
        delay: Duration,
    },
    /// Stop everything; the job failed (the message says why).
    Fail(String),
    /// Stop everything; a process stopped the job for a reason a rollback would not fix
    /// (it exited with [`EXIT_JOB_FAILED`], which the launcher passes on).
    FailJob(String),
    /// Replicated shards: restart these processes alone; the rest of the cluster trains on.
    /// The coordinator first (from its saved map), then the PS processes (they rejoin as
    /// backups once the coordinator failed their shards over).
    Replace {
        /// Which processes died and how.
        reason: String,
        /// The PS indexes to restart.
        ps: Vec<usize>,
        /// Restart the coordinator.
        coordinator: bool,
    },
}

/// Restarts counted per process kind (the processes that died, not the ones stopped with them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restarts {
    /// PS shards that died.
    pub ps: u64,
    /// Workers that failed.
    pub worker: u64,
    /// Times the coordinator of replicated shards died.
    pub coordinator: u64,
}

impl Restarts {
    /// Every kind together.
    pub fn total(&self) -> u64 {
        self.ps + self.worker + self.coordinator
    }
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
pub const FIRST_DELAY: Duration = Duration::from_millis(250);
/// Longest restart delay.
pub const MAX_DELAY: Duration = Duration::from_secs(5);

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

    /// The failure of the job when `needed` more restarts exceed `--max-restarts`.
    fn over_budget(&self, what: &str, needed: usize) -> Option<Action> {
        let used = self.restarts.total();
        let needed = needed as u64;
        (used + needed > u64::from(self.policy.max_restarts)).then(|| {
            Action::Fail(format!(
                "{what}; giving up: {used} restart(s) used, {needed} more needed \
                 (--max-restarts {})",
                self.policy.max_restarts
            ))
        })
    }

    /// One process exited (see [`Supervisor::on_exits`]).
    pub fn on_exit(&mut self, kind: Kind, index: usize, success: bool, status: &str) -> Action {
        self.on_exits(&[Exit {
            kind,
            index,
            success,
            status: status.to_string(),
            job_failed: false,
        }])
    }

    /// The processes in `exits` were found exited together (one look at the cluster). Every
    /// failed process counts one restart and uses one unit of `max_restarts`, however many
    /// died at once; they share one rollback.
    pub fn on_exits(&mut self, exits: &[Exit]) -> Action {
        for e in exits.iter().filter(|e| !e.is_failure()) {
            if let Some(d) = self.done.get_mut(e.index) {
                *d = true;
            }
        }
        let failed: Vec<&Exit> = exits.iter().filter(|e| e.is_failure()).collect();
        if failed.is_empty() {
            return if self.done.iter().all(|d| *d) {
                Action::Finish
            } else {
                Action::Continue
            };
        }
        let what = failed
            .iter()
            .map(|e| e.describe())
            .collect::<Vec<_>>()
            .join("; ");
        if let Some(e) = failed.iter().find(|e| e.job_failed) {
            return Action::FailJob(format!(
                "{what}; [{}] stopped the job for a reason a rollback would not fix (see its \
                 error above), so the cluster is not restarted",
                e.kind.label(e.index)
            ));
        }
        // The coordinator keeps its map in a file: it restarts alone from it, whatever else
        // happens (a rollback starts a fresh one).
        let coordinator = failed.iter().any(|e| e.kind == Kind::Coordinator);
        let ps: Vec<usize> = failed
            .iter()
            .filter(|e| e.kind == Kind::Ps)
            .map(|e| e.index)
            .collect();
        let ps_only = failed.iter().all(|e| e.kind != Kind::Worker);
        if ps_only && ps.len() < self.policy.replicas {
            if let Some(fail) = self.over_budget(&what, failed.len()) {
                return fail;
            }
            self.restarts.ps += ps.len() as u64;
            self.restarts.coordinator += u64::from(coordinator);
            return Action::Replace {
                reason: what,
                ps,
                coordinator,
            };
        }
        if !self.policy.recover {
            let who = failed
                .iter()
                .map(|e| format!("[{}]", e.kind.label(e.index)))
                .collect::<Vec<_>>()
                .join(", ");
            return Action::Fail(format!(
                "{what}; the job has no checkpoints (--checkpoint-dir), so it cannot recover \
                 (see the {who} lines above)"
            ));
        }
        if let Some(fail) = self.over_budget(&what, failed.len()) {
            return fail;
        }
        for e in &failed {
            match e.kind {
                Kind::Ps => self.restarts.ps += 1,
                Kind::Worker => self.restarts.worker += 1,
                Kind::Coordinator => self.restarts.coordinator += 1,
            }
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
        replicas: 1,
    };

    #[test]
    fn with_replicas_a_dead_ps_is_replaced_alone_and_workers_still_roll_back() {
        let policy = Policy {
            recover: false,
            max_restarts: 3,
            replicas: 2,
        };
        let mut s = Supervisor::new(policy, 2);
        let a = s.on_exit(Kind::Ps, 1, false, "signal: 9");
        assert!(
            matches!(&a, Action::Replace { ps, reason, coordinator: false }
                if ps == &[1] && reason.contains("ps1")),
            "{a:?}"
        );
        assert_eq!((s.rollbacks(), s.restarts().ps), (0, 1));
        // Two of two copies at once: a shard may have lost every copy.
        let a = s.on_exits(&[
            exit(Kind::Ps, 0, false, "signal: 9"),
            exit(Kind::Ps, 2, false, "signal: 9"),
        ]);
        assert!(
            matches!(&a, Action::Fail(m) if m.contains("no checkpoints")),
            "{a:?}"
        );
        // A worker's failure is not covered by replicas.
        let mut s = Supervisor::new(policy, 2);
        assert!(matches!(
            s.on_exit(Kind::Worker, 0, false, "1"),
            Action::Fail(_)
        ));
    }

    #[test]
    fn a_dead_coordinator_is_restarted_alone_and_counted() {
        let policy = Policy {
            recover: false,
            max_restarts: 2,
            replicas: 2,
        };
        let mut s = Supervisor::new(policy, 1);
        // Even with status 0: a coordinator exiting mid-job is a failure.
        let a = s.on_exit(Kind::Coordinator, 0, true, "exit status: 0");
        assert!(
            matches!(&a, Action::Replace { ps, coordinator: true, reason }
                if ps.is_empty() && reason.contains("coord exited")),
            "{a:?}"
        );
        // With a PS in the same look: both restarted alone, the coordinator first.
        let a = s.on_exits(&[
            exit(Kind::Coordinator, 0, false, "signal: 9"),
            exit(Kind::Ps, 1, false, "signal: 9"),
        ]);
        assert!(
            matches!(&a, Action::Fail(m) if m.contains("1 restart(s) used, 2 more needed")),
            "{a:?}"
        );
        let mut s = Supervisor::new(
            Policy {
                max_restarts: 3,
                ..policy
            },
            1,
        );
        let a = s.on_exits(&[
            exit(Kind::Coordinator, 0, false, "signal: 9"),
            exit(Kind::Ps, 1, false, "signal: 9"),
        ]);
        assert!(
            matches!(&a, Action::Replace { ps, coordinator: true, .. } if ps == &[1]),
            "{a:?}"
        );
        assert_eq!(
            s.restarts(),
            Restarts {
                ps: 1,
                worker: 0,
                coordinator: 1
            }
        );
        assert_eq!(s.rollbacks(), 0);
    }

    fn exit(kind: Kind, index: usize, success: bool, status: &str) -> Exit {
        Exit {
            kind,
            index,
            success,
            status: status.into(),
            job_failed: false,
        }
    }

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
        assert_eq!(
            s.restarts(),
            Restarts {
                ps: 1,
                worker: 1,
                coordinator: 0
            }
        );
        assert_eq!(s.rollbacks(), 2);
        // A PS that exits with status 0 mid-job is a failure too; the budget is spent.
        let a = s.on_exit(Kind::Ps, 0, true, "0");
        assert!(
            matches!(&a, Action::Fail(m) if m.contains("--max-restarts 2")),
            "{a:?}"
        );
    }

    #[test]
    fn two_processes_dying_together_count_two_restarts_and_one_rollback() {
        let mut s = Supervisor::new(RECOVER, 2);
        let a = s.on_exits(&[
            exit(Kind::Ps, 0, false, "signal: 9"),
            exit(Kind::Worker, 1, false, "signal: 9"),
        ]);
        let Action::Rollback { reason, .. } = a else {
            panic!("{a:?}")
        };
        assert!(reason.contains("ps0") && reason.contains("w1"), "{reason}");
        assert_eq!(
            s.restarts(),
            Restarts {
                ps: 1,
                worker: 1,
                coordinator: 0
            }
        );
        assert_eq!(s.rollbacks(), 1);
        // Both units of --max-restarts 2 are used: the next failure ends the job.
        let a = s.on_exit(Kind::Worker, 0, false, "exit status: 1");
        assert!(
            matches!(&a, Action::Fail(m) if m.contains("2 restart(s) used")),
            "{a:?}"
        );
    }

    #[test]
    fn a_group_larger_than_the_budget_left_fails_without_counting() {
        let mut s = Supervisor::new(
            Policy {
                recover: true,
                max_restarts: 1,
                replicas: 1,
            },
            2,
        );
        let a = s.on_exits(&[
            exit(Kind::Ps, 0, false, "signal: 9"),
            exit(Kind::Ps, 1, false, "signal: 9"),
        ]);
        assert!(
            matches!(&a, Action::Fail(m) if m.contains("2 more needed")),
            "{a:?}"
        );
        assert_eq!(s.restarts(), Restarts::default());
    }

    #[test]
    fn a_worker_finishing_with_a_failure_in_one_look_still_rolls_back() {
        let mut s = Supervisor::new(RECOVER, 2);
        let a = s.on_exits(&[
            exit(Kind::Worker, 0, true, "exit status: 0"),
            exit(Kind::Ps, 0, false, "signal: 9"),
        ]);
        assert!(matches!(a, Action::Rollback { .. }), "{a:?}");
        // The rollback restarts worker 0 too: one success is not the end of the job.
        assert_eq!(s.on_exit(Kind::Worker, 1, true, "0"), Action::Continue);
    }

    #[test]
    fn without_checkpoints_a_failure_ends_the_job() {
        let mut s = Supervisor::new(
            Policy {
                recover: false,
                max_restarts: 5,
                replicas: 1,
            },
            1,
        );
        let a = s.on_exit(Kind::Ps, 0, false, "signal 9");
        assert!(
            matches!(&a, Action::Fail(m) if m.contains("no checkpoints")),
            "{a:?}"
        );
    }

    #[test]
    fn a_job_level_failure_stops_the_job_without_a_rollback() {
        let mut s = Supervisor::new(RECOVER, 2);
        let a = s.on_exits(&[Exit {
            job_failed: true,
            ..exit(Kind::Worker, 0, false, "exit status: 3")
        }]);
        let Action::FailJob(why) = a else {
            panic!("expected FailJob, got {a:?}")
        };
        assert!(why.contains("[w0] stopped the job"), "{why}");
        assert_eq!(s.rollbacks(), 0);
    }
}
