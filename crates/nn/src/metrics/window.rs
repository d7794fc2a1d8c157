//! Exact metrics over the most recent rows of a stream: [`MetricsWindow`] keeps the last `N`
//! valid (label, probability, sample weight[, group]) rows in a ring buffer. Adding a row is
//! O(1); the metrics are computed from the rows when asked ([`MetricsWindow::summary`],
//! O(N log N)), exactly: with [`super::evaluate`] and [`super::gauc`] when every weight is 1,
//! and by the same rank rule with pair weights `w_pos * w_neg` otherwise.

use super::{evaluate, gauc, EvalSummary, GaucAccumulator};

/// The last `capacity` valid rows of a stream, for exact metrics over them.
#[derive(Clone, Debug)]
pub struct MetricsWindow {
    capacity: usize,
    /// Where the next row goes once the ring is full (the oldest row).
    next: usize,
    labels: Vec<f32>,
    probs: Vec<f32>,
    weights: Vec<f32>,
    /// One group per row when the window keeps groups (GAUC), else empty.
    groups: Vec<u64>,
    grouped: bool,
}

/// A window's rows, oldest first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowRows {
    /// Labels.
    pub labels: Vec<f32>,
    /// Probabilities.
    pub probs: Vec<f32>,
    /// Sample weights.
    pub weights: Vec<f32>,
    /// Groups (empty when the window keeps none).
    pub groups: Vec<u64>,
}

impl MetricsWindow {
    /// An empty window of `capacity` rows (at least 1) that keeps each row's group when
    /// `grouped` (for GAUC). Memory grows with the rows up to the capacity: 12 bytes a row,
    /// 20 with groups.
    ///
    /// # Panics
    /// If `capacity` is 0.
    pub fn new(capacity: usize, grouped: bool) -> Self {
        assert!(capacity >= 1, "a metrics window needs at least 1 row");
        MetricsWindow {
            capacity,
            next: 0,
            labels: Vec::new(),
            probs: Vec::new(),
            weights: Vec::new(),
            groups: Vec::new(),
            grouped,
        }
    }

    /// Rows held (at most the capacity).
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether no row is held.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The most rows held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Adds one row, replacing the oldest when full. A row whose label, probability or weight
    /// is not finite, or whose weight is negative, is ignored (as the metrics ignore it);
    /// `group` is read only by a grouped window.
    #[inline]
    pub fn push(&mut self, label: f32, prob: f32, weight: f32, group: u64) {
        if !(label.is_finite() && prob.is_finite() && weight.is_finite() && weight >= 0.0) {
            return;
        }
        if self.labels.len() < self.capacity {
            self.labels.push(label);
            self.probs.push(prob);
            self.weights.push(weight);
            if self.grouped {
                self.groups.push(group);
            }
            return;
        }
        let i = self.next;
        self.labels[i] = label;
        self.probs[i] = prob;
        self.weights[i] = weight;
        if self.grouped {
            self.groups[i] = group;
        }
        self.next = (i + 1) % self.capacity;
    }

    /// The rows held, oldest first.
    pub fn rows(&self) -> WindowRows {
        fn ordered<T: Copy>(v: &[T], next: usize) -> Vec<T> {
            let mut out = Vec::with_capacity(v.len());
            out.extend_from_slice(&v[next.min(v.len())..]);
            out.extend_from_slice(&v[..next.min(v.len())]);
            out
        }
        WindowRows {
            labels: ordered(&self.labels, self.next),
            probs: ordered(&self.probs, self.next),
            weights: ordered(&self.weights, self.next),
            groups: ordered(&self.groups, self.next),
        }
    }

    /// The exact metrics of the rows held (GAUC too when the window keeps groups).
    pub fn summary(&self) -> EvalSummary {
        let r = self.rows();
        if r.weights.iter().all(|&w| w == 1.0) {
            let mut s = evaluate(&r.labels, &r.probs);
            if self.grouped {
                let (g, used, _) = gauc(&r.groups, &r.labels, &r.probs);
                s.gauc = Some((g, used));
            }
            return s;
        }
        weighted_summary(&r, self.grouped)
    }
}

/// The exact sample-weighted metrics of `r` (every row valid): AUC counting every
/// (positive, negative) pair with weight `w_pos * w_neg` (ties one half), weighted log loss,
/// positive rate and mean prediction; GAUC with groups weighted by their total weight.
fn weighted_summary(r: &WindowRows, grouped: bool) -> EvalSummary {
    let (mut w, mut wpos, mut wp, mut wloss) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    let mut one_group = GaucAccumulator::default();
    for i in 0..r.labels.len() {
        let (y, p, wi) = (r.labels[i], r.probs[i], r.weights[i] as f64);
        w += wi;
        if y > 0.5 {
            wpos += wi;
        }
        wp += wi * p as f64;
        let pc = (p as f64).clamp(1e-7, 1.0 - 1e-7);
        let yf = y as f64;
        wloss -= wi * (yf * pc.ln() + (1.0 - yf) * (1.0 - pc).ln());
        one_group.add(0, y, p, r.weights[i]);
    }
    let nan_if = |empty: bool, v: f64| if empty { f64::NAN } else { v };
    let empty = w <= 0.0;
    let positive_rate = nan_if(empty, wpos / w);
    let mean_prediction = nan_if(empty, wp / w);
    let gauc = grouped.then(|| {
        let mut g = GaucAccumulator::default();
        for i in 0..r.labels.len() {
            g.add(r.groups[i], r.labels[i], r.probs[i], r.weights[i]);
        }
        let (v, used, _) = g.finish();
        (v, used)
    });
    EvalSummary {
        auc: one_group.finish().0,
        logloss: nan_if(empty, wloss / w),
        positive_rate,
        mean_prediction,
        calibration: nan_if(wpos <= 0.0, mean_prediction / positive_rate),
        rows: r.labels.len(),
        gauc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{auc, lcg, logloss, MetricsAccumulator};

    /// `n` rows: a probability, a label drawn from it, a group of 7.
    fn stream(n: usize, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<u64>) {
        let mut s = seed;
        let probs: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
        let labels = probs
            .iter()
            .map(|&p| f32::from(lcg(&mut s) < p * 0.7 + 0.1))
            .collect();
        let groups = (0..n as u64).map(|i| i * 2654435761 % 7).collect();
        (labels, probs, groups)
    }

    #[test]
    fn after_wraparound_the_window_auc_is_the_exact_auc_of_the_last_n_rows() {
        let (labels, probs, groups) = stream(2_537, 11);
        let n = 600;
        let mut w = MetricsWindow::new(n, true);
        for i in 0..labels.len() {
            w.push(labels[i], probs[i], 1.0, groups[i]);
            if i + 1 == 300 {
                // Before it fills: every row so far.
                assert_eq!(w.summary().auc, auc(&labels[..300], &probs[..300]));
            }
        }
        assert_eq!(w.len(), n);
        let tail = labels.len() - n;
        let (l, p, g) = (&labels[tail..], &probs[tail..], &groups[tail..]);
        let s = w.summary();
        assert_eq!(s.auc, auc(l, p));
        assert_eq!(s.logloss, logloss(l, p));
        assert_eq!(s.rows, n);
        let (want_g, want_used, _) = gauc(g, l, p);
        assert_eq!(s.gauc, Some((want_g, want_used)));
        // The rows come back oldest first.
        let r = w.rows();
        assert_eq!((&r.labels[..], &r.probs[..], &r.groups[..]), (l, p, g));
    }

    #[test]
    fn a_window_of_one_row_holds_the_last_row_and_invalid_rows_are_skipped() {
        let mut w = MetricsWindow::new(1, false);
        w.push(1.0, 0.9, 1.0, 0);
        w.push(0.0, 0.2, 1.0, 0);
        w.push(f32::NAN, 0.5, 1.0, 0);
        w.push(1.0, 0.5, -1.0, 0);
        assert_eq!(w.rows().labels, vec![0.0]);
        assert_eq!(w.rows().probs, vec![0.2]);
        assert!(w.summary().auc.is_nan());
        assert_eq!(w.summary().gauc, None);
    }

    #[test]
    fn weighted_rows_count_as_repeated_rows() {
        let (labels, probs, groups) = stream(400, 5);
        let mut weighted = MetricsWindow::new(1_000, true);
        let mut repeated = MetricsWindow::new(1_000, true);
        for i in 0..labels.len() {
            let k = (i % 3) as f32; // weights 0, 1, 2
            weighted.push(labels[i], probs[i], k, groups[i]);
            for _ in 0..k as usize {
                repeated.push(labels[i], probs[i], 1.0, groups[i]);
            }
        }
        let (a, b) = (weighted.summary(), repeated.summary());
        assert!((a.auc - b.auc).abs() < 1e-12, "{} vs {}", a.auc, b.auc);
        assert!((a.logloss - b.logloss).abs() < 1e-12);
        assert!((a.calibration - b.calibration).abs() < 1e-12);
        let (ga, gb) = (a.gauc.unwrap(), b.gauc.unwrap());
        assert!((ga.0 - gb.0).abs() < 1e-12, "{ga:?} vs {gb:?}");
        assert_eq!(ga.1, gb.1);
    }

    #[test]
    fn the_streamed_accumulator_is_within_its_histogram_tolerance_of_the_window() {
        // A window holding every row: the exact figure the histogram approximates (its bins
        // are 2.4e-4 wide relative: pairs inside one bin count one half).
        let (labels, probs, _) = stream(20_000, 3);
        let mut w = MetricsWindow::new(labels.len(), false);
        let mut acc = MetricsAccumulator::new();
        for i in 0..labels.len() {
            w.push(labels[i], probs[i], 1.0, 0);
            acc.add(labels[i], probs[i], 1.0);
        }
        let (exact, streamed) = (w.summary(), acc.summary());
        assert!((exact.auc - streamed.auc).abs() < 1e-4);
        assert!((exact.logloss - streamed.logloss).abs() < 1e-9);
        assert!((exact.calibration - streamed.calibration).abs() < 1e-9);
    }
}
