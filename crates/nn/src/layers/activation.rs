//! ReLU (and its fused use as a GEMM epilogue / bias-gradient prologue).

/// In-place ReLU forward.
pub fn relu_forward(x: &mut [f32]) {
    for v in x {
        *v = v.max(0.0);
    }
}

/// In-place ReLU backward: `dy *= (y > 0)`, where `y` is the ReLU output.
pub fn relu_backward(dy: &mut [f32], y: &[f32]) {
    assert_eq!(dy.len(), y.len());
    for (g, &o) in dy.iter_mut().zip(y) {
        *g = if o > 0.0 { *g } else { 0.0 };
    }
}

/// Fused bias + optional ReLU epilogue: `y[r, :] = act(y[r, :] + b)`.
pub fn bias_act(y: &mut [f32], b: &[f32], relu: bool) {
    let n = b.len();
    for row in y.chunks_exact_mut(n) {
        if relu {
            for (v, &bb) in row.iter_mut().zip(b) {
                *v = (*v + bb).max(0.0);
            }
        } else {
            for (v, &bb) in row.iter_mut().zip(b) {
                *v += bb;
            }
        }
    }
}

/// Fused ReLU-mask + bias gradient: optionally `dy *= (y > 0)`, then `db += colsum(dy)`.
pub fn mask_and_bias_grad(dy: &mut [f32], relu_out: Option<&[f32]>, db: &mut [f32]) {
    let n = db.len();
    match relu_out {
        Some(y) => {
            assert_eq!(dy.len(), y.len());
            for (g, o) in dy.chunks_exact_mut(n).zip(y.chunks_exact(n)) {
                // branch-free select so the loop vectorizes
                for ((gv, &ov), d) in g.iter_mut().zip(o).zip(db.iter_mut()) {
                    let v = if ov > 0.0 { *gv } else { 0.0 };
                    *gv = v;
                    *d += v;
                }
            }
        }
        None => {
            for g in dy.chunks_exact(n) {
                for (gv, d) in g.iter().zip(db.iter_mut()) {
                    *d += *gv;
                }
            }
        }
    }
}
