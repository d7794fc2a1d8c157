//! Sparta's local cluster supervisor (`sparta launch`): N PS + M worker child processes of the
//! `sparta` executable on loopback, supervised, their output merged, one job summary.
//!
//! - [`supervise`]: the rollback state machine (process exits in, actions out);
//! - [`drive`]: the loop that runs it over a [`drive::Processes`] (real ones, or fakes in tests);
//! - [`local`]: the real processes (children die with the launcher: parent-death signal);
//! - [`ports`]: free loopback ports for the children (below the ephemeral range);
//! - [`summary`]: the job summary (job totals across rollbacks, one entry per run).
//!
//! With checkpoints, a process that dies is recovered from by a coordinated rollback: every
//! process restarts from the newest valid checkpoint.

pub mod drive;
pub mod error;
pub mod local;
pub mod ports;
pub mod summary;
pub mod supervise;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

pub use error::LaunchError;
pub use supervise::{Action, Exit, Kind, Policy, Restarts, Supervisor, EXIT_JOB_FAILED};

/// A cluster job to run.
#[derive(Clone, Debug)]
pub struct Spec {
    /// The `sparta` executable the children run.
    pub exe: PathBuf,
    /// PS shards.
    pub num_ps: usize,
    /// Workers.
    pub workers: usize,
    /// The job config (TOML) every process reads; written to a temporary folder removed when
    /// the launch ends (normally, with an error, or on SIGINT/SIGTERM).
    pub job_toml: String,
    /// Flags for every PS after the ones the launcher sets.
    pub ps_args: Vec<OsString>,
    /// Flags for the coordinator of replicated shards after the ones the launcher sets.
    pub coordinator_args: Vec<OsString>,
    /// Flags for every worker after the ones the launcher sets.
    pub worker_args: Vec<OsString>,
    /// The shared token.
    pub token: String,
    /// The checkpoint dir, when the job checkpoints (then failures are recovered from).
    pub checkpoint_dir: Option<PathBuf>,
    /// Start from the newest valid checkpoint of `checkpoint_dir`; the policy says whether
    /// finding none is an error.
    pub resume: Option<sparta_checkpoint::ResumePolicy>,
    /// Process failures recovered from before the job gives up.
    pub max_restarts: u32,
    /// Dense mode allreduce: every start gives the workers `--ring` with a fresh loopback
    /// address per worker.
    pub ring: bool,
    /// Copies of every PS shard (`--replicas`; 1: none): the shards then listen on ports
    /// picked by the launcher, each told every address (`--peers`).
    pub replicas: usize,
}

/// Runs the job to its end and returns its summary (see [`summary::job_summary`]). Blocks the
/// calling thread, which must live until this returns (the children's parent-death signal is
/// tied to it). SIGINT and SIGTERM stop every process and end it with
/// [`LaunchError::Interrupted`].
pub fn launch(spec: &Spec) -> Result<serde_json::Value, LaunchError> {
    let stop = Arc::new(AtomicBool::new(false));
    let _signals = StopOnSignals::install(&stop)?;
    let dir = tempfile::Builder::new()
        .prefix("sparta-launch-")
        .tempdir()
        .map_err(|e| LaunchError::io("creating a temporary folder", e))?;
    let config = dir.path().join("job.toml");
    std::fs::write(&config, &spec.job_toml)
        .map_err(|e| LaunchError::io(format!("writing {}", config.display()), e))?;
    let summaries: Vec<PathBuf> = (0..spec.workers)
        .map(|j| dir.path().join(format!("worker{j}.json")))
        .collect();
    let layout = local::Layout {
        exe: spec.exe.clone(),
        num_ps: spec.num_ps,
        workers: spec.workers,
        config,
        ps_args: spec.ps_args.clone(),
        coordinator_args: spec.coordinator_args.clone(),
        worker_args: spec.worker_args.clone(),
        token: spec.token.clone(),
        checkpoint_dir: spec.checkpoint_dir.clone(),
        summaries: summaries.clone(),
        ring: spec.ring,
        replicas: spec.replicas,
    };
    let mut cluster = local::LocalCluster::new(layout, Arc::clone(&stop));
    if let Some(policy) = spec.resume {
        cluster = cluster.with_resume_policy(policy);
    }
    let mut sup = Supervisor::new(
        Policy {
            recover: spec.checkpoint_dir.is_some(),
            max_restarts: spec.max_restarts,
            replicas: spec.replicas,
        },
        spec.workers,
    );
    let start = Instant::now();
    let resume = spec.resume.is_some() && spec.checkpoint_dir.is_some();
    let runs = drive::drive(&mut cluster, &mut sup, resume, &stop)?;
    let failover = cluster
        .coordinator_state()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
    cluster.stop_ps();
    let wall = start.elapsed().as_secs_f64();
    let mut per_worker = Vec::new();
    for p in &summaries {
        let text = std::fs::read_to_string(p)
            .map_err(|e| LaunchError::io(format!("reading {}", p.display()), e))?;
        let v = serde_json::from_str(&text)
            .map_err(|e| LaunchError::Summary(format!("{}: {e}", p.display())))?;
        per_worker.push(v);
    }
    let mut job = summary::job_summary(per_worker, &runs, sup.restarts(), sup.rollbacks(), wall);
    if let Some(f) = failover {
        // Replicated shards: what the coordinator did (0 failovers: none was needed).
        job["failovers"] = f["failovers"].clone();
        job["rejoins"] = f["rejoins"].clone();
        job["dropped_backups"] = f["dropped_backups"].clone();
    }
    Ok(job)
}

/// SIGINT and SIGTERM set a flag (instead of killing the launcher) while this lives.
struct StopOnSignals(Vec<signal_hook::SigId>);

impl StopOnSignals {
    fn install(flag: &Arc<AtomicBool>) -> Result<Self, LaunchError> {
        let mut ids = Vec::new();
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            let id = signal_hook::flag::register(sig, Arc::clone(flag))
                .map_err(|e| LaunchError::io("installing the SIGINT/SIGTERM handler", e))?;
            ids.push(id);
        }
        Ok(StopOnSignals(ids))
    }
}

impl Drop for StopOnSignals {
    fn drop(&mut self) {
        for id in self.0.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use signal_hook::consts::{SIGINT, SIGTERM};
    use signal_hook::low_level::raise;
    use std::sync::atomic::Ordering;

    #[test]
    fn sigint_and_sigterm_set_the_flag_until_dropped() {
        let stop = Arc::new(AtomicBool::new(false));
        let signals = StopOnSignals::install(&stop).unwrap();
        // `raise` runs the handler on this thread before it returns.
        raise(SIGTERM).unwrap();
        assert!(
            stop.swap(false, Ordering::SeqCst),
            "SIGTERM must set the flag"
        );
        raise(SIGINT).unwrap();
        assert!(
            stop.swap(false, Ordering::SeqCst),
            "SIGINT must set the flag"
        );
        drop(signals);
        // Unregistered: the flag stays clear (signal-hook leaves its handler in place with no
        // action, so the signal is ignored rather than ending the test process).
        raise(SIGTERM).unwrap();
        assert!(
            !stop.load(Ordering::SeqCst),
            "the flag must not be set after drop"
        );
    }
}
