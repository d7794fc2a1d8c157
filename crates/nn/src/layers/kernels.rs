//! Small vectorizable f32 kernels. Plain `iter().sum()` of f32 products is evaluated strictly
//! in order and does not vectorize; these split the sum over independent lanes instead.

const LANES: usize = 16;

/// Dot product with 16 independent partial sums (auto-vectorizes).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..LANES {
            acc[k] += x[k] * y[k];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    #[test]
    fn dot_matches_naive() {
        for n in [0usize, 1, 15, 16, 17, 40, 429] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.3).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).cos()).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((super::dot(&a, &b) as f64 - want).abs() < 1e-4);
        }
    }
}
