//! Small vectorizable f32 kernels. Plain `iter().sum()` of f32 products is evaluated strictly
//! in order and does not vectorize; these split the sum over independent lanes instead.

const LANES: usize = 16;

/// Dot product with 16 independent partial sums (auto-vectorizes; always inlined, so it
/// vectorizes as wide as its caller's target features allow).
#[inline(always)]
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

/// Sum with 16 independent partial sums (auto-vectorizes).
#[inline]
pub fn sum(a: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let tail: f32 = ca.remainder().iter().sum();
    for x in ca {
        for k in 0..LANES {
            acc[k] += x[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `sum (a_i - c)^2` with 16 independent partial sums.
#[inline]
pub fn sum_sq_dev(a: &[f32], c: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let tail: f32 = ca.remainder().iter().map(|v| (v - c) * (v - c)).sum();
    for x in ca {
        for k in 0..LANES {
            acc[k] += (x[k] - c) * (x[k] - c);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `sum a_i b_i c_i` with 16 independent partial sums.
#[inline]
pub fn dot3(a: &[f32], b: &[f32], c: &[f32]) -> f32 {
    assert!(a.len() == b.len() && b.len() == c.len());
    let mut acc = [0.0f32; LANES];
    let (ca, cb, cc) = (
        a.chunks_exact(LANES),
        b.chunks_exact(LANES),
        c.chunks_exact(LANES),
    );
    let mut tail = 0.0f32;
    for ((x, y), z) in ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .zip(cc.remainder())
    {
        tail += x * y * z;
    }
    for ((x, y), z) in ca.zip(cb).zip(cc) {
        for k in 0..LANES {
            acc[k] += x[k] * y[k] * z[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    #[test]
    fn sums_match_naive() {
        for n in [0usize, 1, 15, 16, 17, 40, 429] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.3).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).cos()).collect();
            let c: Vec<f32> = (0..n).map(|i| (i as f32 * 0.2).cos()).collect();
            let s: f64 = a.iter().map(|&x| x as f64).sum();
            let d: f64 = a.iter().map(|&x| (x as f64 - 0.5).powi(2)).sum();
            let t: f64 = (0..n)
                .map(|i| a[i] as f64 * b[i] as f64 * c[i] as f64)
                .sum();
            assert!((super::sum(&a) as f64 - s).abs() < 1e-4);
            assert!((super::sum_sq_dev(&a, 0.5) as f64 - d).abs() < 1e-4);
            assert!((super::dot3(&a, &b, &c) as f64 - t).abs() < 1e-4);
        }
    }

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
