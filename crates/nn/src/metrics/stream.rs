//! Metrics streamed over a test set in fixed memory: [`MetricsAccumulator`] takes batches of
//! (label, probability, sample weight) and keeps sums plus one score histogram, whatever the
//! number of rows.
//!
//! The AUC comes from the histogram: a probability's bin is its f32 bit pattern shifted right
//! by [`SHIFT`] bits (monotone for the non-negative floats), so two scores share a bin only when
//! they agree to about 2^-(23-SHIFT) relative; pairs within one bin count one half, as ties do
//! in the exact AUC. Weighted, every (positive, negative) pair counts `w_pos * w_neg`.

use super::EvalSummary;

/// Low mantissa bits dropped from a score's bits (relative bin width 2^-12 ~ 2.4e-4).
pub const SHIFT: u32 = 11;
/// Bins covering every float in [0, 1].
const BINS: usize = (0x3F80_0000u32 >> SHIFT) as usize + 1;

/// Streams one task's metrics: AUC (histogram), log loss, calibration, with sample weights.
#[derive(Clone, Debug)]
pub struct MetricsAccumulator {
    /// Weight of positives / negatives per score bin.
    pos: Vec<f64>,
    neg: Vec<f64>,
    rows: usize,
    weight: f64,
    weight_pos: f64,
    weighted_p: f64,
    weighted_loss: f64,
}

impl Default for MetricsAccumulator {
    fn default() -> Self {
        Self::new()
    }
}

impl MetricsAccumulator {
    /// An empty accumulator (two histograms of ~2 MB each).
    pub fn new() -> Self {
        MetricsAccumulator {
            pos: vec![0.0; BINS],
            neg: vec![0.0; BINS],
            rows: 0,
            weight: 0.0,
            weight_pos: 0.0,
            weighted_p: 0.0,
            weighted_loss: 0.0,
        }
    }

    /// Adds one row. Rows with a non-finite label, probability or weight, or a negative
    /// weight, are ignored (as [`super::evaluate`] ignores them); a label is positive when > 0.5.
    #[inline]
    pub fn add(&mut self, label: f32, prob: f32, weight: f32) {
        if !(label.is_finite() && prob.is_finite() && weight.is_finite() && weight >= 0.0) {
            return;
        }
        let p = prob.clamp(0.0, 1.0);
        let bin = (p.to_bits() >> SHIFT) as usize;
        let w = weight as f64;
        let positive = label > 0.5;
        if positive {
            self.pos[bin] += w;
            self.weight_pos += w;
        } else {
            self.neg[bin] += w;
        }
        self.rows += 1;
        self.weight += w;
        self.weighted_p += w * p as f64;
        let pc = (p as f64).clamp(1e-7, 1.0 - 1e-7);
        let y = label as f64;
        self.weighted_loss -= w * (y * pc.ln() + (1.0 - y) * (1.0 - pc).ln());
    }

    /// Adds a batch; `weights` empty means every weight is 1.
    pub fn add_batch(&mut self, labels: &[f32], probs: &[f32], weights: &[f32]) {
        assert_eq!(
            labels.len(),
            probs.len(),
            "labels and probs differ in length"
        );
        assert!(
            weights.is_empty() || weights.len() == labels.len(),
            "weights must be empty or one per row"
        );
        for (i, (&y, &p)) in labels.iter().zip(probs).enumerate() {
            self.add(y, p, weights.get(i).copied().unwrap_or(1.0));
        }
    }

    /// Merges another accumulator's rows into this one.
    pub fn merge(&mut self, other: &MetricsAccumulator) {
        for (a, b) in self.pos.iter_mut().zip(&other.pos) {
            *a += b;
        }
        for (a, b) in self.neg.iter_mut().zip(&other.neg) {
            *a += b;
        }
        self.rows += other.rows;
        self.weight += other.weight;
        self.weight_pos += other.weight_pos;
        self.weighted_p += other.weighted_p;
        self.weighted_loss += other.weighted_loss;
    }

    /// Rows added (valid ones).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The weighted AUC from the histogram (NaN without positive or negative weight).
    pub fn auc(&self) -> f64 {
        let total_neg: f64 = self.weight - self.weight_pos;
        if self.weight_pos <= 0.0 || total_neg <= 0.0 {
            return f64::NAN;
        }
        // Walk the bins upwards: each positive beats the negatives of lower bins, ties half.
        let mut below = 0.0f64;
        let mut wins = 0.0f64;
        for (&p, &n) in self.pos.iter().zip(&self.neg) {
            if p != 0.0 {
                wins += p * (below + 0.5 * n);
            }
            below += n;
        }
        wins / (self.weight_pos * total_neg)
    }

    /// The metrics so far (GAUC is not part of it).
    pub fn summary(&self) -> EvalSummary {
        let nan_if = |empty: bool, v: f64| if empty { f64::NAN } else { v };
        let empty = self.weight <= 0.0;
        let positive_rate = nan_if(empty, self.weight_pos / self.weight);
        let mean_prediction = nan_if(empty, self.weighted_p / self.weight);
        EvalSummary {
            auc: self.auc(),
            logloss: nan_if(empty, self.weighted_loss / self.weight),
            positive_rate,
            mean_prediction,
            calibration: nan_if(self.weight_pos <= 0.0, mean_prediction / positive_rate),
            rows: self.rows,
            gauc: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{auc, evaluate, lcg};

    #[test]
    fn matches_the_exact_metrics_unweighted() {
        let mut s = 7u64;
        let n = 20_000;
        let probs: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
        let labels: Vec<f32> = probs
            .iter()
            .map(|&p| f32::from(lcg(&mut s) < p * 0.6 + 0.1))
            .collect();
        let mut acc = MetricsAccumulator::new();
        // in three uneven batches, one merged from a second accumulator
        acc.add_batch(&labels[..5000], &probs[..5000], &[]);
        let mut other = MetricsAccumulator::new();
        other.add_batch(&labels[5000..12_345], &probs[5000..12_345], &[]);
        acc.merge(&other);
        acc.add_batch(&labels[12_345..], &probs[12_345..], &[]);
        let got = acc.summary();
        let want = evaluate(&labels, &probs);
        assert_eq!(got.rows, want.rows);
        assert!(
            (got.auc - want.auc).abs() < 1e-4,
            "{} vs {}",
            got.auc,
            want.auc
        );
        assert!((got.logloss - want.logloss).abs() < 1e-9);
        assert!((got.positive_rate - want.positive_rate).abs() < 1e-12);
        assert!((got.calibration - want.calibration).abs() < 1e-9);
        // exact on well separated scores (no two in one bin)
        let l = [0., 0., 1., 1.];
        let p = [0.1, 0.4, 0.35, 0.8];
        let mut a = MetricsAccumulator::new();
        a.add_batch(&l, &p, &[]);
        assert_eq!(a.auc(), auc(&l, &p));
    }

    #[test]
    fn a_weight_counts_as_repeated_rows_and_zero_weight_rows_vanish() {
        let (l, p) = ([1., 0., 1., 0., 0.], [0.9, 0.3, 0.2, 0.6, 0.05]);
        let mut weighted = MetricsAccumulator::new();
        weighted.add_batch(&l, &p, &[2.0, 1.0, 3.0, 0.0, 1.0]);
        let mut repeated = MetricsAccumulator::new();
        let rep = [(0, 2), (1, 1), (2, 3), (4, 1)];
        for (i, k) in rep {
            for _ in 0..k {
                repeated.add(l[i], p[i], 1.0);
            }
        }
        let (a, b) = (weighted.summary(), repeated.summary());
        assert!((a.auc - b.auc).abs() < 1e-12, "{} vs {}", a.auc, b.auc);
        assert!((a.logloss - b.logloss).abs() < 1e-12);
        assert!((a.calibration - b.calibration).abs() < 1e-12);
        // pairs: pos {0.9 x2, 0.2 x3} vs neg {0.3, 0.05}: 0.9 beats both (2*2), 0.2 beats 0.05 (3)
        assert!((a.auc - 7.0 / 10.0).abs() < 1e-12, "{}", a.auc);
    }

    #[test]
    fn degenerate_inputs() {
        let mut a = MetricsAccumulator::new();
        assert!(a.summary().auc.is_nan() && a.summary().logloss.is_nan());
        a.add_batch(&[1., 1., f32::NAN], &[0.2, f32::NAN, 0.3], &[1., 1., 1.]);
        a.add(0.0, 0.4, -1.0);
        assert_eq!(a.rows(), 1);
        assert!(a.auc().is_nan());
        // scores outside [0, 1] are clamped, ties count one half
        let mut t = MetricsAccumulator::new();
        t.add_batch(&[1., 0.], &[0.5, 0.5], &[]);
        assert_eq!(t.auc(), 0.5);
    }
}

/// GAUC over a stream: keeps each valid row's (group, probability, label, weight), 20 bytes a
/// row, since a group's AUC needs all its rows (memory grows with the test rows, unlike
/// [`MetricsAccumulator`]). A group's AUC counts every (positive, negative) pair with weight
/// `w_pos * w_neg`; groups average weighted by their total sample weight; groups with one
/// class only are skipped.
#[derive(Clone, Debug, Default)]
pub struct GaucAccumulator {
    rows: Vec<(u64, f32, bool, f32)>,
}

impl GaucAccumulator {
    /// Adds one row (ignored when the label, probability or weight is not finite, or the
    /// weight is negative).
    pub fn add(&mut self, group: u64, label: f32, prob: f32, weight: f32) {
        if label.is_finite() && prob.is_finite() && weight.is_finite() && weight >= 0.0 {
            self.rows.push((group, prob, label > 0.5, weight));
        }
    }

    /// (GAUC, groups used, rows in them); GAUC is NaN when no group has both classes.
    pub fn finish(&mut self) -> (f64, usize, usize) {
        self.rows
            .sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let (mut sum, mut total_w, mut used, mut rows) = (0.0f64, 0.0f64, 0usize, 0usize);
        for run in self.rows.chunk_by(|a, b| a.0 == b.0) {
            let (mut wins, mut below, mut wp, mut wn) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
            // runs of equal scores: positives beat the negatives below, ties count one half
            for tie in run.chunk_by(|a, b| a.1 == b.1) {
                let p: f64 = tie.iter().filter(|r| r.2).map(|r| r.3 as f64).sum();
                let n: f64 = tie.iter().filter(|r| !r.2).map(|r| r.3 as f64).sum();
                wins += p * (below + 0.5 * n);
                below += n;
                wp += p;
                wn += n;
            }
            if wp <= 0.0 || wn <= 0.0 {
                continue;
            }
            let w = wp + wn;
            sum += w * wins / (wp * wn);
            total_w += w;
            used += 1;
            rows += run.len();
        }
        let g = if total_w > 0.0 {
            sum / total_w
        } else {
            f64::NAN
        };
        (g, used, rows)
    }
}

#[cfg(test)]
mod gauc_tests {
    use super::*;
    use crate::metrics::gauc;

    #[test]
    fn unweighted_it_is_the_exact_gauc_and_weights_repeat_rows() {
        let groups = [7, 3, 7, 9, 7, 3, 7, 9, 3];
        let labels = [0., 1., 0., 1., 1., 0., 1., 1., 1.];
        let probs = [0.1, 0.2, 0.4, 0.5, 0.35, 0.9, 0.8, 0.6, f32::NAN];
        let mut acc = GaucAccumulator::default();
        for i in 0..9 {
            acc.add(groups[i], labels[i], probs[i], 1.0);
        }
        assert_eq!(acc.finish(), gauc(&groups, &labels, &probs));
        // weight 2 on a row = that row twice
        let mut w = GaucAccumulator::default();
        let mut rep = GaucAccumulator::default();
        for i in 0..8 {
            let k = if i % 3 == 0 { 2.0 } else { 1.0 };
            w.add(groups[i], labels[i], probs[i], k);
            for _ in 0..k as usize {
                rep.add(groups[i], labels[i], probs[i], 1.0);
            }
        }
        let (a, b) = (w.finish(), rep.finish());
        assert!((a.0 - b.0).abs() < 1e-12, "{a:?} vs {b:?}");
        assert_eq!(a.1, b.1);
    }
}
