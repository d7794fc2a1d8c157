//! Sparta's local cluster supervisor (`sparta launch`): N PS + M worker child processes of the
//! `sparta` executable on loopback, supervised, their output merged, one job summary.
//!
//! - [`supervise`]: the recovery state machine (process exits in, actions out: roll back,
//!   or with replicated shards restart a dead PS or coordinator alone);
//! - [`drive`]: the loop that runs it over a [`drive::Processes`] (real ones, or fakes in tests);
//! - [`local`]: the real processes (children die with the launcher: parent-death signal);
//! - [`ports`]: free loopback ports for the children (below the ephemeral range);
//! - [`scale`]: PS shards added and removed at steps while the job trains;
//! - [`summary`]: the job summary (job totals across rollbacks, one entry per run).
//!
//! With checkpoints, a process that dies is recovered from by a coordinated rollback: every
//! process restarts from the newest valid checkpoint.

pub mod drive;
pub mod error;
pub mod local;
pub mod ports;
pub mod scale;
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
    /// The job config (TOML) every process reads; written to a temporary folder (the job
    /// folder) removed when the launch ends (normally, with an error, or on SIGINT/SIGTERM),
    /// or by the next launch when this one was killed (see [`remove_stale_job_folders`]).
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
    /// Every PS and worker serves metrics; their addresses are kept here (see
    /// [`local::Layout::metrics`]).
    pub metrics: Option<local::Endpoints>,
    /// PS shards added and removed while training (`--scale-ps-at`).
    pub scale: Option<scale::ScalePlan>,
}

/// Runs the job to its end and returns its summary (see [`summary::job_summary`]). Blocks the
/// calling thread, which must live until this returns (the children's parent-death signal is
/// tied to it). SIGINT and SIGTERM stop every process and end it with
/// [`LaunchError::Interrupted`].
pub fn launch(spec: &Spec) -> Result<serde_json::Value, LaunchError> {
    let stop = Arc::new(AtomicBool::new(false));
    let _signals = StopOnSignals::install(&stop)?;
    remove_stale_job_folders(&std::env::temp_dir());
    let dir = tempfile::Builder::new()
        .prefix(JOB_FOLDER_PREFIX)
        .tempdir()
        .map_err(|e| LaunchError::io("creating a temporary folder", e))?;
    let pid_file = dir.path().join(PID_FILE);
    std::fs::write(&pid_file, format!("{}\n", std::process::id()))
        .map_err(|e| LaunchError::io(format!("writing {}", pid_file.display()), e))?;
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
        metrics: spec.metrics.clone(),
        scale: spec.scale.clone(),
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
    let scaled = cluster.scaled().to_vec();
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
    if spec.scale.is_some() {
        // `--scale-ps-at`: each event carried out (step, shards before and after, seconds).
        job["ps_scaling"] = serde_json::to_value(&scaled).unwrap_or_default();
    }
    if let Some(f) = failover {
        // Replicated shards: what the coordinator did (0 failovers: none was needed).
        job["failovers"] = f["failovers"].clone();
        job["rejoins"] = f["rejoins"].clone();
        job["dropped_backups"] = f["dropped_backups"].clone();
        job["restarts"]["coordinator"] = sup.restarts().coordinator.into();
    }
    Ok(job)
}

/// The name of every job folder starts so (in the temporary directory).
pub const JOB_FOLDER_PREFIX: &str = "sparta-launch-";
/// The file of a job folder naming the launcher that made it (its pid).
pub const PID_FILE: &str = "launcher.pid";

/// Removes the job folders in `tmp` left by launchers that are gone (killed with `kill -9`,
/// or their machine's power cut: nothing ran to remove them): those whose [`PID_FILE`]
/// names no running process. Folders without one (a launcher that has just made its own)
/// and those of running launchers stay. Best effort: what cannot be removed is logged.
pub fn remove_stale_job_folders(tmp: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with(JOB_FOLDER_PREFIX) {
            continue;
        }
        let dir = e.path();
        let Ok(text) = std::fs::read_to_string(dir.join(PID_FILE)) else {
            continue;
        };
        let Ok(pid) = text.trim().parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() || running(pid) {
            continue;
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => tracing::info!(
                "removed {}: the job folder of launcher {pid}, which is gone",
                dir.display()
            ),
            Err(err) => tracing::warn!(
                "could not remove {} (the job folder of launcher {pid}, which is gone): {err}",
                dir.display()
            ),
        }
    }
}

/// Whether process `pid` exists and is no zombie (a launcher killed while its own parent
/// has not reaped it yet is gone all the same).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        // No /proc (not Linux): ask the kernel whether the pid exists.
        Err(_) if !std::path::Path::new("/proc/self").exists() => {
            // SAFETY: signal 0 checks the pid only; no signal is sent.
            let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
            r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
        }
        Err(_) => false,
    }
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
    fn only_job_folders_of_gone_launchers_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let folder = |name: &str, pid: Option<&str>| {
            let d = tmp.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("job.toml"), "").unwrap();
            if let Some(p) = pid {
                std::fs::write(d.join(PID_FILE), p).unwrap();
            }
            d
        };
        // A child that exited and was reaped: its pid is free.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id().to_string();
        child.wait().unwrap();
        let stale = folder("sparta-launch-stale", Some(&gone));
        let mine = folder("sparta-launch-mine", Some(&std::process::id().to_string()));
        let young = folder("sparta-launch-young", None);
        let other = folder("other-stale", Some(&gone));
        remove_stale_job_folders(tmp.path());
        assert!(!stale.exists());
        for kept in [mine, young, other] {
            assert!(kept.exists(), "{}", kept.display());
        }
    }

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
