//! ReLU as a pass of its own (after layer norm); where it follows a linear layer it is fused
//! with the bias into the GEMM ([`crate::epilogue`]).

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
