//! CPU per sample: a short embedded training run of the job on the sample data, timed by the
//! process's CPU time (user + system, every thread: `getrusage(RUSAGE_SELF)`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use sparta_core::Job;

/// The embedded run's cost.
#[derive(Clone, Debug)]
pub struct CpuCost {
    /// Rows trained.
    pub rows: u64,
    /// CPU seconds of the process during the run (every thread).
    pub cpu_seconds: f64,
    /// Wall seconds of the run.
    pub wall_seconds: f64,
    /// Compute threads the job ran with.
    pub threads: usize,
}

impl CpuCost {
    /// CPU seconds per sample.
    pub fn per_sample(&self) -> f64 {
        self.cpu_seconds / self.rows.max(1) as f64
    }

    /// Share of the run's threads' time spent on a CPU.
    pub fn utilisation(&self) -> f64 {
        self.cpu_seconds / (self.wall_seconds * self.threads.max(1) as f64).max(1e-9)
    }
}

/// User + system CPU time of this process so far, every thread, seconds.
fn process_cpu_seconds() -> Result<f64> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` through the pointer, which points at memory of
    // that type and size owned by this frame.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("getrusage");
    }
    // SAFETY: getrusage returned 0: it filled the struct (and it was zeroed before).
    let ru = unsafe { ru.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Ok(secs(ru.ru_utime) + secs(ru.ru_stime))
}

/// Trains `job` embedded on `paths` (its row limit and epochs as set) and measures it.
pub fn measure_cpu(job: Job, paths: &[PathBuf]) -> Result<CpuCost> {
    let threads = job.threads;
    let mut trainer = sparta_worker::Trainer::embedded(job)?;
    let (cpu, wall) = (process_cpu_seconds()?, Instant::now());
    let summary = trainer.run(&sparta_worker::RunOptions {
        train: paths.to_vec(),
        progress: false,
        ..Default::default()
    })?;
    let cpu_seconds = process_cpu_seconds()? - cpu;
    Ok(CpuCost {
        rows: summary.train_rows,
        cpu_seconds,
        wall_seconds: wall.elapsed().as_secs_f64(),
        threads,
    })
}
