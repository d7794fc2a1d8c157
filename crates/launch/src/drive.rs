//! The supervision loop: start the cluster, watch its processes, feed their exits to the
//! [`Supervisor`] and carry out its actions (finish, fail, roll back to a checkpoint). The
//! processes sit behind the [`Processes`] trait, so the loop runs on fakes in tests.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::LaunchError;
use crate::supervise::{Action, Exit, Supervisor};

/// A checkpoint to start from, as the launcher chose it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumePoint {
    /// Its id.
    pub id: u64,
    /// Its name in the checkpoint dir (`ckpt-…`).
    pub name: String,
    /// Samples trained in it.
    pub samples: u64,
    /// PS shards that wrote it (a cluster of another count re-cuts it).
    pub shards: u32,
}

/// The processes of a cluster: how to start, watch and stop them.
pub trait Processes {
    /// Starts every PS (from `resume` when given), then every worker.
    fn start(&mut self, resume: Option<&ResumePoint>) -> Result<(), LaunchError>;
    /// Restarts PS `i` alone, fresh (replicated shards: it rejoins as a backup).
    fn restart_ps(&mut self, i: usize) -> Result<(), LaunchError>;
    /// Restarts the coordinator of replicated shards alone, at its address, from the map
    /// it saved.
    fn restart_coordinator(&mut self) -> Result<(), LaunchError>;
    /// The processes found exited since the last call (each reported once).
    fn exited(&mut self) -> Result<Vec<Exit>, LaunchError>;
    /// Stops every process still running and waits for them.
    fn stop(&mut self);
    /// The newest checkpoint to restart from (`None`: start from scratch).
    fn checkpoint(&mut self) -> Result<Option<ResumePoint>, LaunchError>;
    /// Reports one line to the user.
    fn say(&mut self, line: &str);
    /// Waits `d` (a fake returns at once).
    fn sleep(&mut self, d: Duration);
    /// Work of its own between looks at the processes (adding or removing PS shards at
    /// their steps: `--scale-ps-at`); none by default.
    fn tick(&mut self) -> Result<(), LaunchError> {
        Ok(())
    }
}

/// One start of the cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// The checkpoint it started from.
    pub resumed_from: Option<ResumePoint>,
    /// Seconds from its start to its end.
    pub wall_seconds: f64,
    /// The failure that ended it (`None`: it finished the job).
    pub ended_by: Option<String>,
}

/// How often the processes are looked at.
pub const POLL: Duration = Duration::from_millis(50);
/// After a failure is seen, how long to wait for other processes dying at the same time so
/// each is counted (they are stopped with the cluster otherwise).
pub const SETTLE: Duration = Duration::from_millis(200);

/// Runs the job to its end: `resume` picks the first start's checkpoint; `stop` (set by a
/// signal handler) stops the cluster and returns [`LaunchError::Interrupted`]. Returns every
/// run, the last one being the one that finished. The processes are stopped on every error.
pub fn drive(
    p: &mut impl Processes,
    sup: &mut Supervisor,
    resume: bool,
    stop: &AtomicBool,
) -> Result<Vec<Run>, LaunchError> {
    let r = drive_inner(p, sup, resume, stop);
    if r.is_err() {
        p.stop();
    }
    r
}

fn drive_inner(
    p: &mut impl Processes,
    sup: &mut Supervisor,
    resume: bool,
    stop: &AtomicBool,
) -> Result<Vec<Run>, LaunchError> {
    let mut runs = Vec::new();
    let mut from = if resume { p.checkpoint()? } else { None };
    loop {
        let started = Instant::now();
        p.start(from.as_ref())?;
        let ended_by = loop {
            if stop.load(Ordering::Relaxed) {
                return Err(LaunchError::Interrupted);
            }
            p.tick()?;
            let mut exits = p.exited()?;
            if exits.is_empty() {
                p.sleep(POLL);
                continue;
            }
            if exits.iter().any(Exit::is_failure) {
                p.sleep(SETTLE);
                exits.extend(p.exited()?);
            }
            match sup.on_exits(&exits) {
                Action::Continue => {}
                Action::Finish => break None,
                Action::Fail(m) => return Err(LaunchError::Failed(m)),
                Action::FailJob(m) => return Err(LaunchError::JobFailed(m)),
                Action::Replace {
                    reason,
                    ps,
                    coordinator,
                } => {
                    p.say(&format!(
                        "launch: {reason}; {}",
                        replacing(&ps, coordinator)
                    ));
                    if coordinator {
                        p.restart_coordinator()?;
                    }
                    for i in ps {
                        p.restart_ps(i)?;
                    }
                }
                Action::Rollback { reason, delay } => {
                    p.say(&format!(
                        "launch: {reason}; stopping the cluster and restarting it from the \
                         newest valid checkpoint in {delay:?}"
                    ));
                    p.stop();
                    wait(p, delay, stop)?;
                    break Some(reason);
                }
            }
        };
        let done = ended_by.is_none();
        runs.push(Run {
            resumed_from: from.take(),
            wall_seconds: started.elapsed().as_secs_f64(),
            ended_by,
        });
        if done {
            return Ok(runs);
        }
        from = p.checkpoint()?;
    }
}

/// What the launcher does about dead processes of a replicated cluster, in words.
fn replacing(ps: &[usize], coordinator: bool) -> String {
    let mut what = Vec::new();
    if coordinator {
        what.push(
            "restarting the coordinator at its address from the shard map it saved (training \
             goes on meanwhile; failovers wait for it)"
                .to_string(),
        );
    }
    if !ps.is_empty() {
        // The reason names the PS that died ("it" when it is the only process).
        let who = match ps {
            [_] if !coordinator => "it".to_string(),
            _ => ps
                .iter()
                .map(|&i| crate::Kind::Ps.label(i))
                .collect::<Vec<_>>()
                .join(", "),
        };
        what.push(format!(
            "restarting {who} alone (no rollback): the coordinator fails its shards over to \
             their backups, then it rejoins as a backup (see the [coord] lines)"
        ));
    }
    what.join("; ")
}

/// Sleeps `d` in steps of [`POLL`], returning early with an error when `stop` is set.
fn wait(p: &mut impl Processes, d: Duration, stop: &AtomicBool) -> Result<(), LaunchError> {
    let until = Instant::now() + d;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(LaunchError::Interrupted);
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        p.sleep(left.min(POLL));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Arc;

    use super::*;
    use crate::supervise::{Kind, Policy, Restarts};

    /// A cluster whose exits follow a script: each `exited` call pops one look.
    #[derive(Default)]
    struct Fake {
        looks: VecDeque<Vec<Exit>>,
        checkpoints: VecDeque<Option<ResumePoint>>,
        starts: Vec<Option<u64>>,
        replaced: Vec<usize>,
        coordinators: usize,
        stops: usize,
        said: Vec<String>,
        slept: Duration,
        stop_after_looks: Option<(usize, Arc<AtomicBool>)>,
        looked: usize,
    }

    impl Processes for Fake {
        fn start(&mut self, resume: Option<&ResumePoint>) -> Result<(), LaunchError> {
            self.starts.push(resume.map(|r| r.id));
            Ok(())
        }
        fn restart_ps(&mut self, i: usize) -> Result<(), LaunchError> {
            self.replaced.push(i);
            Ok(())
        }
        fn restart_coordinator(&mut self) -> Result<(), LaunchError> {
            self.coordinators += 1;
            Ok(())
        }
        fn exited(&mut self) -> Result<Vec<Exit>, LaunchError> {
            self.looked += 1;
            if let Some((n, flag)) = &self.stop_after_looks {
                let n = *n;
                if self.looked >= n {
                    flag.store(true, Ordering::Relaxed);
                }
            }
            Ok(self.looks.pop_front().unwrap_or_default())
        }
        fn stop(&mut self) {
            self.stops += 1;
        }
        fn checkpoint(&mut self) -> Result<Option<ResumePoint>, LaunchError> {
            Ok(self.checkpoints.pop_front().flatten())
        }
        fn say(&mut self, line: &str) {
            self.said.push(line.into());
        }
        fn sleep(&mut self, d: Duration) {
            self.slept += d;
        }
    }

    fn ok(kind: Kind, index: usize) -> Exit {
        Exit {
            kind,
            index,
            success: true,
            status: "exit status: 0".into(),
            job_failed: false,
        }
    }

    fn killed(kind: Kind, index: usize) -> Exit {
        Exit {
            kind,
            index,
            success: false,
            status: "signal: 9 (SIGKILL)".into(),
            job_failed: false,
        }
    }

    fn ckpt(id: u64, samples: u64) -> Option<ResumePoint> {
        Some(ResumePoint {
            id,
            name: format!("ckpt-{id}"),
            samples,
            shards: 2,
        })
    }

    const RECOVER: Policy = Policy {
        recover: true,
        max_restarts: 3,
        replicas: 1,
    };
    /// Replicated shards (2 copies) and no checkpoints to roll back to.
    const REPLICATED: Policy = Policy {
        recover: false,
        max_restarts: 3,
        replicas: 2,
    };

    #[test]
    fn a_clean_job_is_one_run() {
        let mut f = Fake {
            looks: [
                vec![],
                vec![ok(Kind::Worker, 1)],
                vec![],
                vec![ok(Kind::Worker, 0)],
            ]
            .into(),
            ..Fake::default()
        };
        let mut s = Supervisor::new(RECOVER, 2);
        let runs = drive(&mut f, &mut s, false, &AtomicBool::new(false)).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].ended_by, None);
        assert_eq!(f.starts, vec![None]);
        assert_eq!(f.stops, 0, "the caller stops the PS shards after a finish");
    }

    #[test]
    fn with_replicas_a_dead_ps_is_restarted_alone_and_the_run_goes_on() {
        let mut f = Fake {
            looks: [
                vec![killed(Kind::Ps, 1)],
                vec![],
                vec![ok(Kind::Worker, 0), ok(Kind::Worker, 1)],
            ]
            .into(),
            ..Fake::default()
        };
        let mut s = Supervisor::new(REPLICATED, 2);
        let runs = drive(&mut f, &mut s, false, &AtomicBool::new(false)).unwrap();
        assert_eq!(runs.len(), 1, "one run: no rollback");
        assert_eq!(f.replaced, vec![1]);
        assert_eq!((f.stops, s.rollbacks()), (0, 0));
        assert!(
            f.said.iter().any(|l| l.contains("no rollback")),
            "{:?}",
            f.said
        );
    }

    #[test]
    fn with_replicas_a_dead_coordinator_is_restarted_alone_and_the_run_goes_on() {
        let mut f = Fake {
            looks: [
                vec![killed(Kind::Coordinator, 0)],
                vec![],
                vec![killed(Kind::Ps, 2)],
                vec![],
                vec![ok(Kind::Worker, 0)],
            ]
            .into(),
            ..Fake::default()
        };
        let mut s = Supervisor::new(REPLICATED, 1);
        let runs = drive(&mut f, &mut s, false, &AtomicBool::new(false)).unwrap();
        assert_eq!(runs.len(), 1, "one run: no rollback");
        assert_eq!((f.coordinators, f.replaced.as_slice()), (1, &[2][..]));
        assert_eq!(s.restarts().total(), 2);
        assert!(
            f.said[0].contains("coord exited with signal: 9")
                && f.said[0].contains("restarting the coordinator")
                && !f.said[0].contains("ps2"),
            "{:?}",
            f.said
        );
        assert!(
            f.said[1].contains("ps2 exited") && f.said[1].contains("restarting it alone"),
            "{:?}",
            f.said
        );
    }

    #[test]
    fn a_failure_rolls_back_to_the_newest_checkpoint_and_counts_every_process_that_died() {
        // ps1 dies; w0 is found dead in the settle look: one rollback, two restarts.
        let mut f = Fake {
            looks: [
                vec![],
                vec![killed(Kind::Ps, 1)],
                vec![killed(Kind::Worker, 0)],
                vec![ok(Kind::Worker, 0), ok(Kind::Worker, 1)],
            ]
            .into(),
            checkpoints: [ckpt(1, 100), ckpt(3, 300)].into(),
            ..Fake::default()
        };
        let mut s = Supervisor::new(RECOVER, 2);
        let runs = drive(&mut f, &mut s, true, &AtomicBool::new(false)).unwrap();
        assert_eq!(f.starts, vec![Some(1), Some(3)]);
        assert_eq!(
            s.restarts(),
            Restarts {
                ps: 1,
                worker: 1,
                coordinator: 0
            }
        );
        assert_eq!(s.rollbacks(), 1);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].resumed_from, ckpt(1, 100));
        let why = runs[0].ended_by.as_deref().unwrap();
        assert!(why.contains("ps1") && why.contains("w0"), "{why}");
        assert_eq!(runs[1].resumed_from, ckpt(3, 300));
        assert_eq!(runs[1].ended_by, None);
        assert_eq!(f.stops, 1);
        assert!(f.said[0].contains("restarting"), "{:?}", f.said);
        assert!(f.slept >= SETTLE + crate::supervise::FIRST_DELAY);
    }

    #[test]
    fn too_many_failures_stop_everything_with_the_reason() {
        let mut f = Fake {
            looks: [vec![killed(Kind::Ps, 0)], vec![], vec![killed(Kind::Ps, 0)]].into(),
            ..Fake::default()
        };
        let mut s = Supervisor::new(
            Policy {
                recover: true,
                max_restarts: 1,
                replicas: 1,
            },
            1,
        );
        let e = drive(&mut f, &mut s, false, &AtomicBool::new(false)).unwrap_err();
        assert!(
            matches!(&e, LaunchError::Failed(m) if m.contains("--max-restarts 1")),
            "{e}"
        );
        assert_eq!(f.starts.len(), 2);
        assert_eq!(f.stops, 2, "stopped for the rollback and on the failure");
    }

    #[test]
    fn a_stop_request_stops_the_cluster() {
        let stop = Arc::new(AtomicBool::new(false));
        let mut f = Fake {
            stop_after_looks: Some((3, Arc::clone(&stop))),
            ..Fake::default()
        };
        let mut s = Supervisor::new(RECOVER, 1);
        let e = drive(&mut f, &mut s, false, &stop).unwrap_err();
        assert!(matches!(e, LaunchError::Interrupted), "{e}");
        assert_eq!(f.stops, 1);
    }
}
