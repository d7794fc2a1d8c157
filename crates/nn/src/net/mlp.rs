//! A stack of [`Linear`] layers over any input buffer (the DCN-v2 and DLRM graphs; wdl, deepfm
//! and dcn keep their own loops over `x0`).

use crate::gemm_ops::Parallelism;
use crate::layers::linear::Linear;

/// Forward through `layers`: `acts[i]` receives layer i's output.
pub(super) fn forward(
    layers: &[Linear],
    p: &[f32],
    input: &[f32],
    acts: &mut [Vec<f32>],
    rows: usize,
    par: Parallelism,
) {
    for (i, l) in layers.iter().enumerate() {
        let (prev, cur) = acts.split_at_mut(i);
        let x: &[f32] = if i == 0 { input } else { &prev[i - 1] };
        l.forward(p, x, rows, &mut cur[0], par);
    }
}

/// Backward through `layers`; `dacts.last()` must hold dL/d(output). Accumulates the parameter
/// gradients into `grads`; writes dL/d(input) into `dx` (`(buffer, row stride, cols)`) if given.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    layers: &[Linear],
    p: &[f32],
    input: &[f32],
    acts: &[Vec<f32>],
    dacts: &mut [Vec<f32>],
    rows: usize,
    grads: &mut [f32],
    mut dx: Option<(&mut [f32], usize, usize)>,
    par: Parallelism,
) {
    for (i, l) in layers.iter().enumerate().rev() {
        let x: &[f32] = if i == 0 { input } else { &acts[i - 1] };
        let (lo, hi) = dacts.split_at_mut(i);
        let d = if i == 0 {
            dx.take()
        } else {
            Some((&mut lo[i - 1][..], l.in_dim, l.in_dim))
        };
        l.backward(p, x, &acts[i], &mut hi[0], rows, grads, d, par);
    }
}
