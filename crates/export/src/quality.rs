//! The quality of a version: the progressive metrics of the window it was trained on, as its
//! manifest carries them (`quality`). Undefined metrics (an AUC over one class, NaN) are
//! written as `null` and read back as `None`, so a manifest always round-trips through JSON.

use serde::{Deserialize, Serialize};
use sparta_nn::metrics::Progressive;

/// Progressive metrics of every task over the window before an export.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportQuality {
    /// The configured window in rows.
    pub window: u64,
    /// Training step the metrics were taken at.
    pub step: u64,
    /// One entry per task, in the job's task order.
    pub tasks: Vec<TaskQuality>,
}

/// One task's window metrics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskQuality {
    /// The task's name.
    pub task: String,
    /// AUC over the window (`None`: undefined, e.g. one class only).
    pub auc: Option<f64>,
    /// Log loss over the window (`None`: no valid row).
    pub logloss: Option<f64>,
    /// Mean prediction over positive rate (`None`: undefined).
    pub calibration: Option<f64>,
    /// Rows the window held.
    pub rows: u64,
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

impl ExportQuality {
    /// The window metrics of every task of `p`.
    pub fn from_progressive(p: &Progressive) -> ExportQuality {
        ExportQuality {
            window: p.window,
            step: p.step,
            tasks: p
                .tasks
                .iter()
                .map(|t| TaskQuality {
                    task: t.task.clone(),
                    auc: finite(t.window.auc),
                    logloss: finite(t.window.logloss),
                    calibration: finite(t.window.calibration),
                    rows: t.window.rows as u64,
                })
                .collect(),
        }
    }

    /// The entry of task `name`.
    pub fn task(&self, name: &str) -> Option<&TaskQuality> {
        self.tasks.iter().find(|t| t.task == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sparta_nn::metrics::{EvalSummary, TaskProgressive};

    fn summary(auc: f64, logloss: f64, rows: usize) -> EvalSummary {
        EvalSummary {
            auc,
            logloss,
            positive_rate: 0.1,
            mean_prediction: 0.1,
            calibration: 1.0,
            rows,
            gauc: None,
        }
    }

    #[test]
    fn undefined_metrics_become_none_and_round_trip_through_json() {
        let p = Progressive {
            window: 5000,
            step: 42,
            tasks: vec![TaskProgressive {
                task: "ctr".into(),
                window: summary(f64::NAN, 0.45, 3000),
                cumulative: summary(0.7, 0.5, 9000),
            }],
        };
        let q = ExportQuality::from_progressive(&p);
        assert_eq!(q.window, 5000);
        assert_eq!(q.step, 42);
        let t = q.task("ctr").unwrap();
        assert_eq!((t.auc, t.logloss, t.rows), (None, Some(0.45), 3000));
        let json = serde_json::to_string(&q).unwrap();
        assert!(json.contains("\"auc\":null"), "{json}");
        let back: ExportQuality = serde_json::from_str(&json).unwrap();
        assert_eq!(back, q);
    }
}
