//! Progressive validation's report: every batch scored by the model before it trains on it,
//! per task, over the last `window` rows and since the start. The accumulators that fill it
//! live beside it; exports carry it in their manifest (the gate compares versions by it).

use serde::{Deserialize, Serialize};

use super::EvalSummary;

/// Progressive metrics of every task at one point of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Progressive {
    /// The configured window in rows (`[metrics] window`).
    pub window: u64,
    /// Training step when taken.
    pub step: u64,
    /// One entry per task, in `[[tasks]]` order (one, named after the label, without tasks).
    pub tasks: Vec<TaskProgressive>,
}

/// One task's progressive metrics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskProgressive {
    /// The task's name.
    pub task: String,
    /// Over the last `window` rows scored (fewer at the start).
    pub window: EvalSummary,
    /// Over every row scored since the run started.
    pub cumulative: EvalSummary,
}
