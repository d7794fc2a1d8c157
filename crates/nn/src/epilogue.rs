//! The elementwise work around a dense layer's GEMMs: the forward epilogue (`+ bias`, then
//! ReLU or identity) and the backward prologue on dY (the ReLU mask, the bias gradient).
//!
//! The per-element operations are written here once ([`bias_act_row`], [`mask_bias_grad_row`])
//! and used both where they are fused into the AMX kernel (`crate::amx`: the epilogue on each
//! finished 32×32 block of C, the prologue while dY is packed into tiles) and by the standalone
//! passes after (before) the f32 GEMM ([`bias_act`], [`mask_and_bias_grad`]), so every path
//! computes the same values bit for bit. The standalone passes run AVX-512 code where the CPU
//! has it (the same operations, wider registers) and split large matrices over the GEMM's
//! threads when it has more than one.

use rayon::prelude::*;

/// What a forward GEMM applies to each element of C once its sum is complete:
/// `C = act(A B + bias)`.
#[derive(Clone, Copy, Debug, Default)]
pub enum Epilogue<'a> {
    /// `C = A B`.
    #[default]
    None,
    /// `C[r, j] = (A B)[r, j] + bias[j]`.
    Bias(&'a [f32]),
    /// `C[r, j] = max((A B)[r, j] + bias[j], 0)`.
    BiasRelu(&'a [f32]),
}

impl<'a> Epilogue<'a> {
    /// `Bias(bias)`, or `BiasRelu(bias)` when `relu`.
    pub fn bias(bias: &'a [f32], relu: bool) -> Epilogue<'a> {
        if relu {
            Epilogue::BiasRelu(bias)
        } else {
            Epilogue::Bias(bias)
        }
    }

    /// The bias and whether a ReLU follows (`None` for [`Epilogue::None`]).
    pub fn parts(self) -> Option<(&'a [f32], bool)> {
        match self {
            Epilogue::None => None,
            Epilogue::Bias(b) => Some((b, false)),
            Epilogue::BiasRelu(b) => Some((b, true)),
        }
    }
}

/// `row[j] = act(row[j] + b[j])` over `row.len()` columns (`b` at least as long).
#[inline(always)]
pub(crate) fn bias_act_row(row: &mut [f32], b: &[f32], relu: bool) {
    let b = &b[..row.len()];
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

/// [`bias_act_row`] of `src` into `dst` (`dst[j] = act(src[j] + b[j])`), or of `dst + src`
/// with `add`: the copy of a finished block of C and its epilogue in one sweep.
#[inline(always)]
pub(crate) fn bias_act_row_from(dst: &mut [f32], src: &[f32], add: bool, b: &[f32], relu: bool) {
    let (src, b) = (&src[..dst.len()], &b[..dst.len()]);
    match (add, relu) {
        (false, true) => {
            for ((d, &s), &bb) in dst.iter_mut().zip(src).zip(b) {
                *d = (s + bb).max(0.0);
            }
        }
        (false, false) => {
            for ((d, &s), &bb) in dst.iter_mut().zip(src).zip(b) {
                *d = s + bb;
            }
        }
        (true, true) => {
            for ((d, &s), &bb) in dst.iter_mut().zip(src).zip(b) {
                *d = (*d + s + bb).max(0.0);
            }
        }
        (true, false) => {
            for ((d, &s), &bb) in dst.iter_mut().zip(src).zip(b) {
                *d = *d + s + bb;
            }
        }
    }
}

/// One row of dY: with `y` (the ReLU's output) `dy[j] = if y[j] > 0 { dy[j] } else { 0 }`;
/// then `db[j] += dy[j]`.
#[inline(always)]
pub(crate) fn mask_bias_grad_row(dy: &mut [f32], y: Option<&[f32]>, db: &mut [f32]) {
    let db = &mut db[..dy.len()];
    match y {
        Some(y) => {
            let y = &y[..dy.len()];
            // branch-free select so the loop vectorizes
            for ((gv, &ov), d) in dy.iter_mut().zip(y).zip(db.iter_mut()) {
                let v = if ov > 0.0 { *gv } else { 0.0 };
                *gv = v;
                *d += v;
            }
        }
        None => {
            for (gv, d) in dy.iter().zip(db.iter_mut()) {
                *d += *gv;
            }
        }
    }
}

/// Elements below which a standalone pass stays on the calling thread.
const PAR_MIN: usize = 1 << 16;

/// The standalone forward epilogue: `y[r, :] = act(y[r, :] + b)` for every row of `y`
/// (`b.len()` columns, contiguous rows), on up to `threads` threads of the current rayon pool.
pub fn bias_act(y: &mut [f32], b: &[f32], relu: bool, threads: usize) {
    let n = b.len();
    if n == 0 {
        return;
    }
    assert_eq!(y.len() % n, 0, "bias_act: y is not whole rows of {n}");
    if threads > 1 && y.len() >= PAR_MIN {
        let rows = (y.len() / n).div_ceil(threads);
        y.par_chunks_mut(rows * n)
            .for_each(|part| bias_act_serial(part, b, relu));
    } else {
        bias_act_serial(y, b, relu);
    }
}

#[inline(always)]
fn bias_act_rows(y: &mut [f32], b: &[f32], relu: bool) {
    for row in y.chunks_exact_mut(b.len()) {
        bias_act_row(row, b, relu);
    }
}

fn bias_act_serial(y: &mut [f32], b: &[f32], relu: bool) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        #[target_feature(enable = "avx512f")]
        unsafe fn wide(y: &mut [f32], b: &[f32], relu: bool) {
            bias_act_rows(y, b, relu);
        }
        // SAFETY: the CPU has AVX-512F (checked above); `wide` only compiles the same safe
        // loop with it.
        return unsafe { wide(y, b, relu) };
    }
    bias_act_rows(y, b, relu);
}

/// The standalone backward prologue: with `relu_out` (the forward's ReLU output, the shape of
/// `dy`) `dy *= (relu_out > 0)` in place; then `db += colsum(dy)` (row by row, in row order).
/// Splits the columns over up to `threads` threads of the current rayon pool (each column's
/// sum keeps its order).
pub fn mask_and_bias_grad(
    dy: &mut [f32],
    relu_out: Option<&[f32]>,
    db: &mut [f32],
    threads: usize,
) {
    let n = db.len();
    if n == 0 {
        return;
    }
    assert_eq!(
        dy.len() % n,
        0,
        "mask_and_bias_grad: dy is not whole rows of {n}"
    );
    if let Some(y) = relu_out {
        assert_eq!(dy.len(), y.len(), "mask_and_bias_grad: dy and y differ");
    }
    // Column parts of whole 64-byte lines.
    let part = n.div_ceil(threads.max(1)).next_multiple_of(16);
    if threads > 1 && dy.len() >= PAR_MIN && part < n {
        let dy_rows = SharedRows {
            ptr: dy.as_mut_ptr(),
            len: dy.len(),
        };
        db.par_chunks_mut(part).enumerate().for_each(|(i, db)| {
            let c0 = i * part;
            // SAFETY: every task touches only columns c0..c0 + db.len() of each row of `dy`,
            // disjoint from every other task's, and `dy` stays exclusively borrowed until the
            // tasks end.
            unsafe { mask_bias_grad_columns(dy_rows, relu_out, db, c0, n) };
        });
    } else {
        // SAFETY: one task over every column of `dy`, exclusively borrowed.
        unsafe {
            mask_bias_grad_columns(
                SharedRows {
                    ptr: dy.as_mut_ptr(),
                    len: dy.len(),
                },
                relu_out,
                db,
                0,
                n,
            )
        };
    }
}

/// A row-major matrix that tasks update in disjoint column ranges.
#[derive(Clone, Copy)]
struct SharedRows {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: `SharedRows` is only handed to tasks that write disjoint columns (see
// `mask_and_bias_grad`); the pointer stays valid while they run.
unsafe impl Send for SharedRows {}
// SAFETY: as for `Send`.
unsafe impl Sync for SharedRows {}

/// [`mask_bias_grad_row`] on columns `c0..c0 + db.len()` of every row (`n` columns) of `dy`.
///
/// # Safety
/// `dy` points to `len` valid f32 (whole rows of `n`) that no one else reads or writes in these
/// columns while this runs.
unsafe fn mask_bias_grad_columns(
    dy: SharedRows,
    y: Option<&[f32]>,
    db: &mut [f32],
    c0: usize,
    n: usize,
) {
    #[inline(always)]
    unsafe fn body(dy: SharedRows, y: Option<&[f32]>, db: &mut [f32], c0: usize, n: usize) {
        let w = db.len();
        for r in 0..dy.len / n {
            // SAFETY: (caller) row r's columns c0..c0 + w lie inside `dy` and are this task's.
            let g = unsafe { std::slice::from_raw_parts_mut(dy.ptr.add(r * n + c0), w) };
            let o = y.map(|y| &y[r * n + c0..r * n + c0 + w]);
            mask_bias_grad_row(g, o, db);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        #[target_feature(enable = "avx512f")]
        unsafe fn wide(dy: SharedRows, y: Option<&[f32]>, db: &mut [f32], c0: usize, n: usize) {
            // SAFETY: (caller) as for `mask_bias_grad_columns`.
            unsafe { body(dy, y, db, c0, n) }
        }
        // SAFETY: the CPU has AVX-512F (checked above); the caller's guarantee passes on.
        return unsafe { wide(dy, y, db, c0, n) };
    }
    // SAFETY: the caller's guarantee passes on.
    unsafe { body(dy, y, db, c0, n) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: today's scalar loops, element by element.
    fn bias_act_ref(y: &mut [f32], b: &[f32], relu: bool) {
        for row in y.chunks_exact_mut(b.len()) {
            for (v, &bb) in row.iter_mut().zip(b) {
                *v = if relu { (*v + bb).max(0.0) } else { *v + bb };
            }
        }
    }

    fn mask_ref(dy: &mut [f32], y: Option<&[f32]>, db: &mut [f32]) {
        let n = db.len();
        for r in 0..dy.len() / n {
            for (j, d) in db.iter_mut().enumerate() {
                let i = r * n + j;
                if y.is_some_and(|y| y[i].partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)) {
                    dy[i] = 0.0;
                }
                *d += dy[i];
            }
        }
    }

    /// Values with the edge cases in: ±0, NaN, infinities, tiny and large magnitudes.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let special = [
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            -f32::INFINITY,
            1e-40,
            -3e38,
        ];
        (0..len)
            .map(|i| {
                let h = sparta_mix::mix64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                if h.is_multiple_of(11) {
                    special[(h >> 8) as usize % special.len()]
                } else {
                    (h >> 40) as f32 / (1u64 << 23) as f32 - 1.0
                }
            })
            .collect()
    }

    /// The same bits, or both NaN: Rust does not fix the sign and payload of a NaN that an
    /// operation makes (the optimizer may swap an addition's operands, and x86 keeps the
    /// first operand's NaN), so only NaN-ness is a promise.
    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    }

    /// Both standalone passes equal the scalar loops bit for bit (±0 and infinities included;
    /// a NaN where the loops have a NaN, whatever its payload), serial and split over threads,
    /// for odd widths.
    #[test]
    fn standalone_passes_match_the_scalar_loops_bit_for_bit_up_to_nan_payloads() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for &(rows, n) in &[(1, 1), (7, 5), (33, 17), (300, 429), (2048, 40), (9, 512)] {
            let b = values(n, 3);
            let y0 = values(rows * n, 4);
            let g0 = values(rows * n, 5);
            let db0 = values(n, 6);
            for threads in [1, 3] {
                for relu in [false, true] {
                    let mut want = y0.clone();
                    bias_act_ref(&mut want, &b, relu);
                    let mut got = y0.clone();
                    pool.install(|| bias_act(&mut got, &b, relu, threads));
                    assert!(same_bits(&got, &want), "bias_act {rows}x{n} relu={relu}");

                    let y = relu.then_some(&y0[..]);
                    let (mut gw, mut dbw) = (g0.clone(), db0.clone());
                    mask_ref(&mut gw, y, &mut dbw);
                    let (mut gg, mut dbg) = (g0.clone(), db0.clone());
                    pool.install(|| mask_and_bias_grad(&mut gg, y, &mut dbg, threads));
                    assert!(same_bits(&gg, &gw), "mask {rows}x{n} relu={relu}");
                    assert!(same_bits(&dbg, &dbw), "db {rows}x{n} relu={relu}");
                }
            }
        }
    }

    #[test]
    fn epilogue_parts() {
        let b = [1.0f32, 2.0];
        assert!(Epilogue::None.parts().is_none());
        assert_eq!(Epilogue::bias(&b, true).parts(), Some((&b[..], true)));
        assert_eq!(Epilogue::bias(&b, false).parts(), Some((&b[..], false)));
    }
}
