//! Fills a [`Progressive`] report: per task, a [`MetricsWindow`] over the last `window` rows
//! scored (exact metrics) and a [`MetricsAccumulator`] since the start (streamed: its AUC from
//! a score histogram of relative bin width 2.4e-4, sample-weighted; no GAUC, which would keep
//! every row).
//!
//! Adding a batch only appends to both (O(rows)); the window's metrics are computed when a
//! report is taken ([`ProgressiveTracker::report`], O(window log window)).

use super::{EvalSummary, MetricsAccumulator, MetricsWindow, Progressive, TaskProgressive};

/// Progressive validation of every task of a model.
#[derive(Clone, Debug)]
pub struct ProgressiveTracker {
    window: u64,
    tasks: Vec<TaskTracker>,
}

#[derive(Clone, Debug)]
struct TaskTracker {
    name: String,
    window: MetricsWindow,
    cumulative: MetricsAccumulator,
}

impl ProgressiveTracker {
    /// A tracker of the tasks `names` (in the model's task order) over a window of `window`
    /// rows (at least 1), keeping each row's group (for the window's GAUC) when `grouped`.
    ///
    /// # Panics
    /// If `window` is 0.
    pub fn new(names: Vec<String>, window: u64, grouped: bool) -> Self {
        let capacity = usize::try_from(window).unwrap_or(usize::MAX);
        let tasks = names
            .into_iter()
            .map(|name| TaskTracker {
                name,
                window: MetricsWindow::new(capacity, grouped),
                cumulative: MetricsAccumulator::new(),
            })
            .collect();
        ProgressiveTracker { window, tasks }
    }

    /// Number of tasks.
    pub fn num_tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Adds one scored row of task `task` (ignored when not valid: see [`MetricsWindow::push`]).
    #[inline]
    pub fn add(&mut self, task: usize, label: f32, prob: f32, weight: f32, group: u64) {
        let t = &mut self.tasks[task];
        t.window.push(label, prob, weight, group);
        t.cumulative.add(label, prob, weight);
    }

    /// Valid rows of the first task scored since the start.
    pub fn rows(&self) -> usize {
        self.tasks.first().map_or(0, |t| t.cumulative.rows())
    }

    /// The exact metrics of task `task`'s window.
    pub fn window_summary(&self, task: usize) -> EvalSummary {
        self.tasks[task].window.summary()
    }

    /// Task `task`'s streamed accumulator since the start (to merge another worker's into).
    pub fn cumulative(&self, task: usize) -> &MetricsAccumulator {
        &self.tasks[task].cumulative
    }

    /// The report at training step `step`: every task's window (exact) and cumulative
    /// (streamed) metrics.
    pub fn report(&self, step: u64) -> Progressive {
        Progressive {
            window: self.window,
            step,
            tasks: self
                .tasks
                .iter()
                .map(|t| TaskProgressive {
                    task: t.name.clone(),
                    window: t.window.summary(),
                    cumulative: t.cumulative.summary(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{auc, evaluate, gauc};

    #[test]
    fn a_report_holds_each_tasks_exact_window_and_streamed_cumulative_metrics() {
        let mut t = ProgressiveTracker::new(vec!["ctr".into(), "cvr".into()], 4, true);
        let rows: [(f32, f32, u64); 6] = [
            (1.0, 0.9, 1),
            (0.0, 0.8, 1),
            (1.0, 0.7, 2),
            (0.0, 0.2, 2),
            (1.0, 0.6, 1),
            (0.0, 0.1, 1),
        ];
        for &(y, p, g) in &rows {
            t.add(0, y, p, 1.0, g);
            t.add(1, 1.0 - y, p, 1.0, g);
        }
        let r = t.report(17);
        assert_eq!((r.window, r.step), (4, 17));
        assert_eq!(r.tasks.len(), 2);
        assert_eq!(
            (r.tasks[0].task.as_str(), r.tasks[1].task.as_str()),
            ("ctr", "cvr")
        );
        let last: Vec<_> = rows[2..].to_vec();
        let l: Vec<f32> = last.iter().map(|r| r.0).collect();
        let p: Vec<f32> = last.iter().map(|r| r.1).collect();
        let g: Vec<u64> = last.iter().map(|r| r.2).collect();
        let w = &r.tasks[0].window;
        assert_eq!(w.rows, 4);
        assert_eq!(w.auc, auc(&l, &p));
        let (gv, used, _) = gauc(&g, &l, &p);
        assert_eq!(w.gauc, Some((gv, used)));
        // Cumulative: all six rows (well separated scores: the histogram is exact here).
        let c = &r.tasks[0].cumulative;
        assert_eq!(c.rows, 6);
        let all_l: Vec<f32> = rows.iter().map(|r| r.0).collect();
        let all_p: Vec<f32> = rows.iter().map(|r| r.1).collect();
        let want = evaluate(&all_l, &all_p);
        assert_eq!(c.auc, want.auc);
        assert!((c.logloss - want.logloss).abs() < 1e-12);
        assert_eq!(c.gauc, None);
        // The second task is its own.
        let l1: Vec<f32> = l.iter().map(|y| 1.0 - y).collect();
        assert_eq!(r.tasks[1].window.auc, auc(&l1, &p));
        assert_eq!(t.rows(), 6);
    }
}
