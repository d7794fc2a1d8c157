//! A training process's progress gauges on `/metrics` (`sparta train` and `sparta worker` with
//! `--metrics-listen`): step, samples, recent loss, progressive validation per task, the last
//! checkpoint and the last serving export. The trainer's side fills a [`TrainingStatus`] and
//! [`crate::metrics::Metrics::set_training`] copies it into these gauges.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of a progressive gauge: `task`, `over` (`window` or `cumulative`).
type TaskLabels = Vec<(String, String)>;

/// What a training process reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrainingStatus {
    /// Training steps taken, counting those before a resume.
    pub step: u64,
    /// Training samples consumed, counting those before a resume.
    pub samples: u64,
    /// Mean loss of the recent steps.
    pub loss: f64,
    /// Progressive validation, per task and span.
    pub progressive: Vec<ProgressiveStatus>,
    /// The last checkpoint written: (seconds since the Unix epoch, its step).
    pub last_checkpoint: Option<(f64, u64)>,
    /// The last serving export version published.
    pub last_export_version: Option<u64>,
}

/// One task's progressive metrics over one span.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgressiveStatus {
    /// The task's name.
    pub task: String,
    /// `window` (the last `[metrics] window` rows) or `cumulative` (since the run started).
    pub over: &'static str,
    /// Exact AUC (NaN with one class).
    pub auc: f64,
    /// Log loss.
    pub logloss: f64,
    /// Mean prediction over the positive rate.
    pub calibration: f64,
    /// GAUC, where the job groups rows (`train.gauc_by`).
    pub gauc: Option<f64>,
    /// Rows the span holds.
    pub rows: u64,
}

/// The gauges, registered in a process's registry.
#[derive(Default)]
pub(crate) struct TrainingGauges {
    step: Gauge,
    samples: Counter,
    loss: Gauge<f64, AtomicU64>,
    auc: Family<TaskLabels, Gauge<f64, AtomicU64>>,
    logloss: Family<TaskLabels, Gauge<f64, AtomicU64>>,
    calibration: Family<TaskLabels, Gauge<f64, AtomicU64>>,
    gauc: Family<TaskLabels, Gauge<f64, AtomicU64>>,
    rows: Family<TaskLabels, Gauge>,
    checkpoint_time: Gauge<f64, AtomicU64>,
    checkpoint_step: Gauge,
    export_version: Gauge,
}

impl TrainingGauges {
    pub(crate) fn register(&self, r: &mut Registry) {
        r.register(
            "sparta_train_step",
            "Training steps taken (counting those before a resume)",
            self.step.clone(),
        );
        r.register(
            "sparta_train_samples",
            "Training samples consumed (counting those before a resume)",
            self.samples.clone(),
        );
        r.register(
            "sparta_train_loss",
            "Mean training loss of the recent steps",
            self.loss.clone(),
        );
        let progressive = [
            ("sparta_progressive_auc", "AUC", &self.auc),
            ("sparta_progressive_logloss", "log loss", &self.logloss),
            (
                "sparta_progressive_calibration",
                "calibration (mean prediction over positive rate)",
                &self.calibration,
            ),
            ("sparta_progressive_gauc", "GAUC", &self.gauc),
        ];
        for (name, what, family) in progressive {
            r.register(
                name,
                format!(
                    "Progressive validation {what} of each task (each batch scored by the \
                     training step's forward pass before its update), over the last [metrics] \
                     window rows (over=window) or since the run started (over=cumulative)"
                ),
                family.clone(),
            );
        }
        r.register(
            "sparta_progressive_rows",
            "Rows each progressive span holds",
            self.rows.clone(),
        );
        r.register(
            "sparta_last_checkpoint_timestamp_seconds",
            "When this process last wrote (or committed) a checkpoint, seconds since the Unix \
             epoch (0: none yet)",
            self.checkpoint_time.clone(),
        );
        r.register(
            "sparta_last_checkpoint_step",
            "The step the last checkpoint holds (0: none yet)",
            self.checkpoint_step.clone(),
        );
        r.register(
            "sparta_last_export_version",
            "The last serving export version this process published (0: none yet)",
            self.export_version.clone(),
        );
    }

    pub(crate) fn set(&self, s: &TrainingStatus) {
        self.step.set(i64::try_from(s.step).unwrap_or(i64::MAX));
        self.samples.inner().fetch_max(s.samples, Relaxed);
        self.loss.set(s.loss);
        for p in &s.progressive {
            let labels = vec![
                ("task".to_string(), p.task.clone()),
                ("over".to_string(), p.over.to_string()),
            ];
            self.auc.get_or_create(&labels).set(p.auc);
            self.logloss.get_or_create(&labels).set(p.logloss);
            self.calibration.get_or_create(&labels).set(p.calibration);
            if let Some(g) = p.gauc {
                self.gauc.get_or_create(&labels).set(g);
            }
            self.rows
                .get_or_create(&labels)
                .set(i64::try_from(p.rows).unwrap_or(i64::MAX));
        }
        if let Some((t, step)) = s.last_checkpoint {
            self.checkpoint_time.set(t);
            self.checkpoint_step
                .set(i64::try_from(step).unwrap_or(i64::MAX));
        }
        if let Some(v) = s.last_export_version {
            self.export_version
                .set(i64::try_from(v).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::metrics::Metrics;

    use super::*;

    #[test]
    fn a_trainer_reports_its_step_samples_loss_and_progressive_metrics() {
        let m = Metrics::new("train");
        let window = ProgressiveStatus {
            task: "click".into(),
            over: "window",
            auc: 0.75,
            logloss: 0.5,
            calibration: 1.25,
            gauc: None,
            rows: 1000,
        };
        m.set_training(&TrainingStatus {
            step: 40,
            samples: 10_240,
            loss: 0.5,
            progressive: vec![window],
            last_checkpoint: Some((1_700_000_000.5, 40)),
            last_export_version: Some(3),
        });
        let text = m.render();
        for line in [
            "sparta_train_step{role=\"train\"} 40",
            "sparta_train_samples_total{role=\"train\"} 10240",
            "sparta_train_loss{role=\"train\"} 0.5",
            "sparta_progressive_auc{role=\"train\",task=\"click\",over=\"window\"} 0.75",
            "sparta_progressive_calibration{role=\"train\",task=\"click\",over=\"window\"} 1.25",
            "sparta_progressive_rows{role=\"train\",task=\"click\",over=\"window\"} 1000",
            "sparta_last_checkpoint_step{role=\"train\"} 40",
            "sparta_last_export_version{role=\"train\"} 3",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        // A trainer has no RPCs; a PS has no training gauges.
        assert!(!text.contains("sparta_rpc_requests"), "{text}");
        assert!(!Metrics::new("ps").render().contains("sparta_train_step"));
    }
}
