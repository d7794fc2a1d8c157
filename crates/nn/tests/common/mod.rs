//! Shared test helpers.
#![allow(dead_code)]

use sparta_nn::gradcheck::{GradCheck, GradCheckReport};

/// Deterministic values in [-1, 1) (the benchmarks' generator).
pub use sparta_nn::bench::pseudo;

/// Finite-difference check of `analytic` = dLoss/dx at `x`.
pub fn fd_check(
    analytic: &[f32],
    x: &[f32],
    mut loss: impl FnMut(&[f32]) -> f64,
) -> Result<GradCheckReport, GradCheckReport> {
    assert_eq!(analytic.len(), x.len());
    let a: Vec<f64> = analytic.iter().map(|&v| v as f64).collect();
    let mut xs = x.to_vec();
    GradCheck::default().check(&a, |i, d| {
        let o = xs[i];
        xs[i] = (o as f64 + d) as f32;
        let l = loss(&xs);
        xs[i] = o;
        l
    })
}

/// Asserts a check passed with few kink skips.
pub fn assert_ok(what: &str, r: Result<GradCheckReport, GradCheckReport>) {
    match r {
        Ok(rep) => {
            assert!(
                rep.skipped * 10 <= rep.checked + rep.skipped,
                "{what}: too many skipped: {rep:?}"
            );
            assert!(rep.checked > 0, "{what}: nothing checked");
        }
        Err(rep) => panic!("{what}: gradient check failed: {rep:?}"),
    }
}

/// Weighted sum `sum_i c_i y_i` in f64 (a generic scalar loss over a layer output).
pub fn dot64(c: &[f32], y: &[f32]) -> f64 {
    c.iter().zip(y).map(|(&a, &b)| a as f64 * b as f64).sum()
}
