//! Sigmoid and binary cross-entropy with logits.

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

/// Forward + backward over a batch: returns the SUM of losses; writes
/// `dz[i] = (sigmoid(z_i) - y_i) * scale` (use `scale = 1 / total_rows` for a mean loss).
pub fn bce_forward_backward(z: &[f32], y: &[f32], scale: f32, dz: &mut [f32]) -> f64 {
    assert_eq!(z.len(), y.len());
    let mut sum = 0.0;
    for ((&zi, &yi), d) in z.iter().zip(y).zip(dz.iter_mut()) {
        sum += bce_with_logits(zi, yi);
        *d = (sigmoid(zi) - yi) * scale;
    }
    sum
}
