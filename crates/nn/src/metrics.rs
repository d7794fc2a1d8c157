//! Evaluation metrics: exact AUC, log loss, calibration, and their streamed, weighted forms
//! ([`MetricsAccumulator`] in fixed memory, [`GaucAccumulator`]); progressive validation
//! while training ([`ProgressiveTracker`]: an exact [`MetricsWindow`] over the last rows and a
//! streamed accumulator since the start, per task).
//!
//! Rows whose label or probability is not finite are ignored (NaN-safe). A label counts as
//! positive when it is > 0.5.

use serde::{Deserialize, Serialize};

mod progressive;
mod stream;
mod tracker;
mod window;
pub use progressive::{Progressive, TaskProgressive};
pub use stream::{GaucAccumulator, MetricsAccumulator};
pub use tracker::ProgressiveTracker;
pub use window::{MetricsWindow, WindowRows};

fn valid<'a>(labels: &'a [f32], probs: &'a [f32]) -> impl Iterator<Item = (f32, f32)> + 'a {
    assert_eq!(
        labels.len(),
        probs.len(),
        "labels and probs differ in length"
    );
    labels
        .iter()
        .zip(probs)
        .map(|(&y, &p)| (y, p))
        .filter(|(y, p)| y.is_finite() && p.is_finite())
}

/// Exact ROC AUC via ranks (Mann-Whitney U); tied scores get their average rank. O(n log n).
///
/// Returns NaN when there are no positives or no negatives (AUC is undefined there).
pub fn auc(labels: &[f32], probs: &[f32]) -> f64 {
    let mut v: Vec<(f32, bool)> = valid(labels, probs).map(|(y, p)| (p, y > 0.5)).collect();
    let pos = v.iter().filter(|x| x.1).count();
    let neg = v.len() - pos;
    if pos == 0 || neg == 0 {
        return f64::NAN;
    }
    v.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let mut rank_sum_pos = 0.0f64;
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1].0 == v[i].0 {
            j += 1;
        }
        // ranks i+1 ..= j+1 share their average
        let avg = (i + j + 2) as f64 / 2.0;
        let p = v[i..=j].iter().filter(|x| x.1).count();
        rank_sum_pos += avg * p as f64;
        i = j + 1;
    }
    let (p, n) = (pos as f64, neg as f64);
    (rank_sum_pos - p * (p + 1.0) / 2.0) / (p * n)
}

/// Mean binary log loss with probabilities clipped to `[1e-7, 1 - 1e-7]`; NaN if no valid row.
pub fn logloss(labels: &[f32], probs: &[f32]) -> f64 {
    let (mut sum, mut n) = (0.0f64, 0usize);
    for (y, p) in valid(labels, probs) {
        let p = (p as f64).clamp(1e-7, 1.0 - 1e-7);
        let y = y as f64;
        sum -= y * p.ln() + (1.0 - y) * (1.0 - p).ln();
        n += 1;
    }
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

/// Group AUC: the AUC of each group's rows (rows sharing `groups[i]`, e.g. a user id),
/// averaged weighted by the group's valid rows. Groups with one class only have no AUC and
/// are skipped. Returns (GAUC, groups used, rows in them); GAUC is NaN when no group has both
/// classes.
pub fn gauc(groups: &[u64], labels: &[f32], probs: &[f32]) -> (f64, usize, usize) {
    assert_eq!(
        groups.len(),
        labels.len(),
        "groups and labels differ in length"
    );
    assert_eq!(
        labels.len(),
        probs.len(),
        "labels and probs differ in length"
    );
    let mut order: Vec<usize> = (0..groups.len())
        .filter(|&i| labels[i].is_finite() && probs[i].is_finite())
        .collect();
    order.sort_by_key(|&i| groups[i]);
    let (mut sum, mut used, mut rows) = (0.0f64, 0usize, 0usize);
    let (mut ys, mut ps) = (Vec::new(), Vec::new());
    for run in order.chunk_by(|&a, &b| groups[a] == groups[b]) {
        ys.clear();
        ps.clear();
        ys.extend(run.iter().map(|&i| labels[i]));
        ps.extend(run.iter().map(|&i| probs[i]));
        let a = auc(&ys, &ps);
        if a.is_nan() {
            continue;
        }
        sum += a * run.len() as f64;
        used += 1;
        rows += run.len();
    }
    let g = if rows == 0 {
        f64::NAN
    } else {
        sum / rows as f64
    };
    (g, used, rows)
}

/// Summary of one evaluation pass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalSummary {
    /// Exact AUC (NaN if one class is absent).
    pub auc: f64,
    /// Clipped log loss.
    pub logloss: f64,
    /// Fraction of positive labels.
    pub positive_rate: f64,
    /// Mean predicted probability.
    pub mean_prediction: f64,
    /// `mean_prediction / positive_rate` (NaN if no positives).
    pub calibration: f64,
    /// Number of valid rows used.
    pub rows: usize,
    /// GAUC and the groups it averaged over, when the rows had groups (see [`gauc`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gauc: Option<(f64, usize)>,
}

/// Computes all metrics of [`EvalSummary`].
pub fn evaluate(labels: &[f32], probs: &[f32]) -> EvalSummary {
    let (mut n, mut pos, mut psum) = (0usize, 0usize, 0.0f64);
    for (y, p) in valid(labels, probs) {
        n += 1;
        pos += usize::from(y > 0.5);
        psum += p as f64;
    }
    let positive_rate = if n == 0 {
        f64::NAN
    } else {
        pos as f64 / n as f64
    };
    let mean_prediction = if n == 0 { f64::NAN } else { psum / n as f64 };
    let calibration = if pos == 0 {
        f64::NAN
    } else {
        mean_prediction / positive_rate
    };
    EvalSummary {
        auc: auc(labels, probs),
        logloss: logloss(labels, probs),
        positive_rate,
        mean_prediction,
        calibration,
        rows: n,
        gauc: None,
    }
}

/// A uniform draw in [0, 1) from a 64-bit LCG: the metrics tests' deterministic stream.
#[cfg(test)]
pub(crate) fn lcg(state: &mut u64) -> f32 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*state >> 40) as f32) / (1u64 << 24) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auc_hand_computed() {
        assert_eq!(auc(&[0., 0., 1., 1.], &[0.1, 0.4, 0.35, 0.8]), 0.75);
        assert_eq!(auc(&[0., 1.], &[0.9, 0.1]), 0.0);
        assert_eq!(auc(&[1., 0.], &[0.9, 0.1]), 1.0);
        // all tied -> 0.5
        assert_eq!(auc(&[0., 1., 0., 1.], &[0.5; 4]), 0.5);
        // one tie across classes: pairs (pos 0.5 vs neg 0.5) count 1/2.
        // pos {0.5, 0.9}, neg {0.5, 0.1}: wins = (0.5>0.1)=1 + tie 0.5 + (0.9>both)=2 -> 3.5/4
        assert_eq!(auc(&[1., 1., 0., 0.], &[0.5, 0.9, 0.5, 0.1]), 0.875);
    }

    #[test]
    fn gauc_weights_groups_by_rows_and_skips_one_class_groups() {
        // Group 7: 4 rows, AUC 0.75; group 3: 2 rows, AUC 0; group 9: positives only (skipped);
        // a NaN row in group 3 is ignored.
        let groups = [7, 3, 7, 9, 7, 3, 7, 9, 3];
        let labels = [0., 1., 0., 1., 1., 0., 1., 1., 1.];
        let probs = [0.1, 0.2, 0.4, 0.5, 0.35, 0.9, 0.8, 0.6, f32::NAN];
        let (g, used, rows) = gauc(&groups, &labels, &probs);
        assert_eq!((used, rows), (2, 6));
        assert!((g - (0.75 * 4.0 + 0.0 * 2.0) / 6.0).abs() < 1e-12, "{g}");
        // One group: GAUC is the AUC.
        let one = [5u64; 4];
        let (l, p) = ([0., 0., 1., 1.], [0.1, 0.4, 0.35, 0.8]);
        assert_eq!(gauc(&one, &l, &p), (auc(&l, &p), 1, 4));
        // No group with both classes.
        assert!(gauc(&[1, 2], &[0., 1.], &[0.3, 0.6]).0.is_nan());
    }

    #[test]
    fn auc_degenerate_and_nan_rows() {
        assert!(auc(&[1., 1.], &[0.2, 0.3]).is_nan());
        assert!(auc(&[], &[]).is_nan());
        // NaN prob and NaN label rows are ignored.
        assert_eq!(
            auc(&[0., 1., 1., f32::NAN], &[0.1, f32::NAN, 0.9, 0.0]),
            1.0
        );
    }

    #[test]
    fn auc_matches_brute_force() {
        let n = 300;
        let labels: Vec<f32> = (0..n).map(|i| ((i * 7919 % 13) < 5) as u8 as f32).collect();
        let probs: Vec<f32> = (0..n).map(|i| ((i * 104729 % 17) as f32) / 16.0).collect();
        let mut wins = 0.0;
        let mut pairs = 0.0;
        for i in 0..n {
            for j in 0..n {
                if labels[i] == 1.0 && labels[j] == 0.0 {
                    pairs += 1.0;
                    wins += if probs[i] > probs[j] {
                        1.0
                    } else if probs[i] == probs[j] {
                        0.5
                    } else {
                        0.0
                    };
                }
            }
        }
        assert!((auc(&labels, &probs) - wins / pairs).abs() < 1e-12);
    }

    #[test]
    fn logloss_and_summary() {
        let ll = logloss(&[1., 0.], &[0.8, 0.4]);
        let want = -(0.8f64.ln() + 0.6f64.ln()) / 2.0;
        assert!((ll - want).abs() < 1e-6);
        // clipping keeps it finite
        let c = logloss(&[1.], &[0.0]);
        assert!((c - (1e7f64).ln()).abs() < 1e-3);
        let s = evaluate(&[1., 0., 0., 0.], &[0.5, 0.5, 0.0, 0.0]);
        assert_eq!(s.rows, 4);
        assert_eq!(s.positive_rate, 0.25);
        assert_eq!(s.mean_prediction, 0.25);
        assert_eq!(s.calibration, 1.0);
        assert_eq!(s.auc, (0.5 + 1.0 + 1.0) / 3.0);
    }
}
