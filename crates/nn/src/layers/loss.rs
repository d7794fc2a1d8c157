//! Sigmoid and binary cross-entropy with logits (optionally sample-weighted), and ESMM's
//! pCTCVR = σ(z0)·σ(z1) cross-entropy.

/// Numerically stable logistic function.
pub fn sigmoid(z: f32) -> f32 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}

/// BCE with logits for one sample: `max(z, 0) - z y + ln(1 + exp(-|z|))`, in f64.
pub fn bce_with_logits(z: f32, y: f32) -> f64 {
    let (z, y) = (z as f64, y as f64);
    z.max(0.0) - z * y + (-z.abs()).exp().ln_1p()
}

/// Forward + backward over a batch: returns the SUM of (sample-weighted) losses
/// `sum_i s_i BCE(z_i, y_i)`; writes `dz[i] = (sigmoid(z_i) - y_i) * s_i * scale` (use
/// `scale = 1 / total_rows` for a mean loss). `weights` = `None` means every `s_i` is 1.
pub fn bce_forward_backward(
    z: &[f32],
    y: &[f32],
    weights: Option<&[f32]>,
    scale: f32,
    dz: &mut [f32],
) -> f64 {
    assert_eq!(z.len(), y.len());
    let mut sum = 0.0;
    match weights {
        None => {
            for ((&zi, &yi), d) in z.iter().zip(y).zip(dz.iter_mut()) {
                sum += bce_with_logits(zi, yi);
                *d = (sigmoid(zi) - yi) * scale;
            }
        }
        Some(w) => {
            assert_eq!(w.len(), z.len(), "one sample weight per row");
            for (((&zi, &yi), &si), d) in z.iter().zip(y).zip(w).zip(dz.iter_mut()) {
                sum += si as f64 * bce_with_logits(zi, yi);
                *d = (sigmoid(zi) - yi) * (si * scale);
            }
        }
    }
    sum
}

/// `ln σ(z)` in f64, stable for any z: `-ln(1 + e^{-z})`.
fn log_sigmoid(z: f64) -> f64 {
    if z >= 0.0 {
        -(-z).exp().ln_1p()
    } else {
        z - z.exp().ln_1p()
    }
}

/// ESMM's pCTCVR term for one sample: `p = σ(z0) σ(z1)` against target `y` (= click ·
/// conversion). Returns `(BCE(p, y), dBCE/dz0, dBCE/dz1)`, all computed in log space:
/// `ln p = lnσ(z0) + lnσ(z1)` and `ln(1 - p) = ln(σ(-z0) + σ(z0) σ(-z1))` (a log-sum-exp of
/// two log terms), so neither saturating logit gives `ln 0`. The gradients are
/// `dBCE/dz_k = (p - y) (1 - σ(z_k)) / (1 - p)`, where `(1 - σ(z_k)) / (1 - p)` lies in [0, 1]
/// and is taken as `exp(lnσ(-z_k) - ln(1 - p))`.
pub fn ctcvr_bce(z0: f32, z1: f32, y: f32) -> (f64, f64, f64) {
    let (z0, z1, y) = (z0 as f64, z1 as f64, y as f64);
    let log_p = log_sigmoid(z0) + log_sigmoid(z1);
    let a = log_sigmoid(-z0);
    let b = log_sigmoid(z0) + log_sigmoid(-z1);
    let m = a.max(b);
    let log_q = m + ((a - m).exp() + (b - m).exp()).ln();
    let loss = -y * log_p - (1.0 - y) * log_q;
    let p = log_p.exp();
    let r0 = (a - log_q).exp().min(1.0);
    let r1 = (log_sigmoid(-z1) - log_q).exp().min(1.0);
    (loss, (p - y) * r0, (p - y) * r1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctcvr_matches_the_direct_formula_and_stays_finite() {
        for &(z0, z1) in &[(0.3f32, -1.2f32), (-2.0, 0.5), (4.0, 3.0)] {
            let p = (sigmoid(z0) * sigmoid(z1)) as f64;
            for y in [0.0f32, 1.0] {
                let (l, _, _) = ctcvr_bce(z0, z1, y);
                let want = -(y as f64) * p.ln() - (1.0 - y as f64) * (1.0 - p).ln();
                assert!((l - want).abs() < 1e-6, "{z0} {z1} {y}: {l} vs {want}");
            }
        }
        for &(z0, z1) in &[
            (60.0f32, 60.0f32),
            (-60.0, -60.0),
            (60.0, -60.0),
            (-60.0, 60.0),
        ] {
            for y in [0.0f32, 1.0] {
                let (l, a, b) = ctcvr_bce(z0, z1, y);
                assert!(
                    l.is_finite() && a.is_finite() && b.is_finite(),
                    "{z0} {z1} {y}"
                );
            }
        }
        // both logits very positive, no conversion: the loss is large but finite, and both
        // gradients push down
        let (l, a, b) = ctcvr_bce(30.0, 30.0, 0.0);
        assert!(l > 25.0 && a > 0.4 && b > 0.4, "{l} {a} {b}");
    }
}
