//! The live status of a training run, for a metrics endpoint to read while it trains (`sparta
//! train --metrics-listen`, `sparta worker --metrics-listen`): the step, the samples, the
//! recent loss, the progressive validation of every task, the last checkpoint and the last
//! serving export. The trainer refreshes it between steps at most once per [`REFRESH`]
//! (progressive metrics over the window sort it: not per step), and only once a caller asked
//! for it ([`crate::Trainer::live_status`]).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use sparta_nn::metrics::Progressive;

use crate::progressive::ProgressiveMeter;

/// The least time between two refreshes of the progressive metrics.
pub const REFRESH: Duration = Duration::from_secs(1);

/// What a run has done so far.
#[derive(Clone, Debug, Default)]
pub struct LiveStatus {
    /// Training steps taken, counting those before a resume.
    pub step: u64,
    /// Training samples consumed, counting those before a resume.
    pub samples: u64,
    /// The mean loss of the recent steps.
    pub loss: f64,
    /// Progressive validation per task (window and cumulative), when the run keeps it.
    pub progressive: Option<Progressive>,
    /// The last checkpoint this process wrote or committed.
    pub last_checkpoint: Option<LastCheckpoint>,
    /// The last serving export version this process published.
    pub last_export_version: Option<u64>,
}

/// A checkpoint written by the run.
#[derive(Clone, Debug, PartialEq)]
pub struct LastCheckpoint {
    /// The checkpoint's id.
    pub id: String,
    /// The job step it holds.
    pub step: u64,
    /// When it was written, seconds since the Unix epoch.
    pub unix_seconds: f64,
}

/// Where a trainer publishes its [`LiveStatus`].
pub type LiveHandle = Arc<Mutex<LiveStatus>>;

/// The trainer's side: the handle and when the progressive metrics were last refreshed.
pub(crate) struct Live {
    handle: LiveHandle,
    refreshed: Option<Instant>,
}

impl Live {
    pub(crate) fn new() -> Self {
        Live {
            handle: LiveHandle::default(),
            refreshed: None,
        }
    }

    pub(crate) fn handle(&self) -> LiveHandle {
        Arc::clone(&self.handle)
    }

    /// After a step: the counters always (a few stores), then [`Live::refresh`].
    pub(crate) fn step(
        &mut self,
        step: u64,
        samples: u64,
        loss: f64,
        meter: Option<&ProgressiveMeter>,
        export_version: impl FnOnce() -> Option<u64>,
    ) {
        {
            let mut s = self.handle.lock();
            s.step = step;
            s.samples = samples;
            s.loss = loss;
        }
        self.refresh(step, meter, export_version);
    }

    /// The progressive metrics and the export version of the steps so far, when [`REFRESH`]
    /// passed since the last refresh (`export_version` is asked only then). Also called on
    /// the idle ticks of a followed directory or topic, so the last steps before a pause
    /// are shown.
    pub(crate) fn refresh(
        &mut self,
        step: u64,
        meter: Option<&ProgressiveMeter>,
        export_version: impl FnOnce() -> Option<u64>,
    ) {
        if self.refreshed.is_some_and(|t| t.elapsed() < REFRESH) {
            return;
        }
        self.refreshed = Some(Instant::now());
        let progressive = meter.map(|m| m.report(step));
        let mut s = self.handle.lock();
        if progressive.is_some() {
            s.progressive = progressive;
        }
        if let Some(v) = export_version() {
            s.last_export_version = Some(v);
        }
    }

    /// A checkpoint `id` holding step `step` was just written.
    pub(crate) fn checkpointed(&self, id: &str, step: u64) {
        let unix_seconds = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.handle.lock().last_checkpoint = Some(LastCheckpoint {
            id: id.to_string(),
            step,
            unix_seconds,
        });
    }

    /// The run ended: the final figures, refreshed whatever the time.
    pub(crate) fn finish(
        &mut self,
        step: u64,
        samples: u64,
        progressive: Option<&Progressive>,
        export_version: Option<u64>,
    ) {
        let mut s = self.handle.lock();
        s.step = step;
        s.samples = samples;
        if let Some(p) = progressive {
            s.progressive = Some(p.clone());
        }
        if export_version.is_some() {
            s.last_export_version = export_version;
        }
        self.refreshed = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_move_every_step_and_the_export_version_at_a_refresh() {
        let mut live = Live::new();
        let h = live.handle();
        live.step(1, 256, 0.5, None, || Some(3));
        let s = h.lock().clone();
        assert_eq!(
            (s.step, s.samples, s.last_export_version),
            (1, 256, Some(3))
        );
        // Within REFRESH of the first: the counters only (the version is not even asked).
        live.step(2, 512, 0.4, None, || panic!("asked between refreshes"));
        let s = h.lock().clone();
        assert_eq!((s.step, s.samples, s.loss), (2, 512, 0.4));
        assert_eq!(s.last_export_version, Some(3));
        live.checkpointed("7", 2);
        let step = h.lock().last_checkpoint.as_ref().map(|c| c.step);
        assert_eq!(step, Some(2));
        live.finish(3, 700, None, Some(4));
        let s = h.lock().clone();
        assert_eq!(
            (s.step, s.samples, s.last_export_version),
            (3, 700, Some(4))
        );
    }
}
