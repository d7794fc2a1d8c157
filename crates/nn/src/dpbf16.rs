//! bf16 GEMM on AVX-512 BF16 dot products (`VDPBF16PS`), for CPUs that have AVX512-BF16 but
//! no AMX tiles (or guests whose hypervisor hides them): `C (+)= A B` with A and B rounded to
//! bfloat16 (nearest even) and every product summed in f32, the arithmetic of [`crate::amx`].
//!
//! Where `VDPBF16PS` is slower per FLOP than f32 FMAs (an Emerald Rapids guest: half the rate,
//! BENCHMARKS.md) the rounded operands on the f32 GEMM are the faster bf16, so `gemm_ops`
//! takes this kernel only where [`outruns_fma`] says so (or `SPARTA_BF16_KERNEL` asks for it).
//!
//! One `VDPBF16PS` multiplies 16 pairs of bf16 by 16 pairs and adds both products to 16 f32
//! sums: the operands are packed as (k, k + 1) pairs, by the same packers as the AMX tiles
//! (`crate::amx::pack_a`, `pack_b`, `pack_b_grad`), whose layouts read as:
//! * B: strips of 16 columns; in strip s the 16 columns' pairs of pair index P are 16
//!   consecutive u32 (`[strip][pair][16 columns]`, K zero-padded to a multiple of 32);
//! * A: 32 rows at a time, in tiles of 16 rows × 16 pairs (`[pair / 16][half][row][pair % 16]`).
//!
//! The microkernel keeps an 8-row × 32-column block of C in 16 zmm accumulators: per pair it
//! loads two B vectors (two strips) and broadcasts each of the 8 rows' A pair. C's blocks are taken 32 rows at a time (one packed A), split over
//! `threads` threads of the current rayon pool by rows, as the AMX path does.
//!
//! Fused elementwise work ([`crate::epilogue`]): a forward GEMM applies its [`Epilogue`] to
//! each finished 8×32 block (through the same row function as the standalone pass, so the
//! values are the same bit for bit); a dW GEMM ([`gemm_grad`]) masks dY and sums the bias
//! gradient while dY is packed (`pack_b_grad`).
//!
//! Arithmetic (Intel SDM, VDPBF16PS): per pair, `acc += a[2i+1]·b[2i+1]`, then
//! `acc += a[2i]·b[2i]`, each addition rounded to nearest even (MXCSR not consulted); a
//! product of two bf16 is exact in f32. Input denormals are treated as zero and output
//! denormals flushed to zero: a bf16 operand below 2^-126 in magnitude counts as 0, and a sum
//! that lands below 2^-126 becomes 0, where the rounded f32 fallback keeps both. With
//! `accumulate` the sums start from C's values (C is the first addend).

use std::arch::x86_64::*;
use std::sync::OnceLock;

use crate::amx::{gemm_grad_on, gemm_on, lanes, pack_a, GradB, Kernel, Operand, BLOCK, TILE, TK};
use crate::epilogue::{bias_act_row_from, Epilogue};

/// Rows of C one microkernel call computes.
const MR: usize = 8;
/// u32 pairs per row of a packed A or B tile (16).
const PAIRS: usize = TK / 2;
/// u32 entries of one packed tile (16 rows × 16 pairs).
const TILE32: usize = TILE / 2;

/// Whether this CPU runs AVX-512 BF16 (`VDPBF16PS`, `VCVTNE2PS2BF16`) with AVX-512F/BW (the
/// packing); cached like the standard library's detection.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512bf16")
    })
}

/// Whether `VDPBF16PS` does clearly more FLOPs per second on this core (1.25x) than f32 FMAs (`VFMADD`, what the
/// rounded f32 GEMM runs on): measured once per process (about a millisecond: 16 independent
/// accumulators of each, best of five; the answer is cached). An Emerald Rapids core (Intel
/// family 6 model 207, no AMX in its VM) issues one `VDPBF16PS` every ~2.2 cycles against two
/// FMAs per cycle: half the FLOPs, so there the rounded operands on the f32 GEMM are the faster
/// bf16 (1.7-2x on the GEMM shapes of `sparta bench train`, BENCHMARKS.md).
pub fn outruns_fma() -> bool {
    static FASTER: OnceLock<bool> = OnceLock::new();
    *FASTER.get_or_init(|| {
        let Some((dot_flops, fma_flops)) = flop_rates() else {
            return false;
        };
        tracing::debug!(
            dot_gflops = dot_flops,
            fma_gflops = fma_flops,
            "VDPBF16PS against VFMADD, one core"
        );
        // A margin, so that a core where the two run alike does not pick one kernel in one
        // process and the other in the next (their sums differ in order, so would the runs).
        dot_flops > 1.25 * fma_flops
    })
}

/// GFLOP/s of `VDPBF16PS` and of `VFMADD` on this core, measured now (about a millisecond:
/// 16 independent accumulators of each, no memory traffic, best of five); `None` without
/// AVX-512 BF16. What [`outruns_fma`] compares.
pub fn flop_rates() -> Option<(f64, f64)> {
    if !available() {
        return None;
    }
    const ITERS: usize = 20_000;
    // GFLOP/s of 16 × ITERS instructions of `flops` each: the best of five runs.
    let gflops = |flops: f64, f: &dyn Fn(usize) -> f32| {
        let best = (0..5)
            .map(|_| {
                let t = std::time::Instant::now();
                std::hint::black_box(f(ITERS));
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        flops * 16.0 * ITERS as f64 / best / 1e9
    };
    // One VDPBF16PS: 16 lanes × 2 products, each a multiply and an add; one FMA: 16 × 2.
    // SAFETY: `available()` checked AVX-512F/BF16 (the dot-product loop) and AVX-512F.
    let dot = gflops(64.0, &|n| unsafe { dot_loop(n) });
    // SAFETY: as above.
    let fma = gflops(32.0, &|n| unsafe { fma_loop(n) });
    Some((dot, fma))
}

/// `iters` rounds of 16 independent `VDPBF16PS`.
///
/// # Safety
/// AVX-512F/BF16 present.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dot_loop(iters: usize) -> f32 {
    let one = std::hint::black_box(_mm512_set1_epi32(0x3F80_3F80)); // (1.0, 1.0) in bf16
    let tiny = std::hint::black_box(_mm512_set1_epi32(0x2000_2000)); // (2^-63, 2^-63)
    let mut acc = [_mm512_setzero_ps(); 16];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_dpbf16_ps(*x, as_bh(one), as_bh(tiny));
        }
    }
    _mm512_reduce_add_ps(
        acc.iter()
            .fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x)),
    )
}

/// `iters` rounds of 16 independent `VFMADD`.
///
/// # Safety
/// AVX-512F present.
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop(iters: usize) -> f32 {
    let one = std::hint::black_box(_mm512_set1_ps(1.0));
    let tiny = std::hint::black_box(_mm512_set1_ps(f32::powi(2.0, -63)));
    let mut acc = [_mm512_setzero_ps(); 16];
    for _ in 0..iters {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(one, tiny, *x);
        }
    }
    _mm512_reduce_add_ps(
        acc.iter()
            .fold(_mm512_setzero_ps(), |s, &x| _mm512_add_ps(s, x)),
    )
}

/// `C = epilogue(C? + A B)`: A is m×k, B is k×n (each with its own strides), C is m×n
/// row-major with row stride `ldc`; with `accumulate` the sums start from C's values. The
/// epilogue's bias (at least n long) is added to each finished block of C, then the ReLU.
/// `threads > 1` splits the rows of C over the current rayon pool.
///
/// Panics unless [`available`]; the caller checks the operands' extents (as `gemm_ops` does).
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    c: &mut [f32],
    ldc: usize,
    a: Operand<'_>,
    b: Operand<'_>,
    dims: (usize, usize, usize),
    accumulate: bool,
    epilogue: Epilogue<'_>,
    threads: usize,
) {
    assert!(available(), "dpbf16::gemm needs AVX-512 BF16");
    // SAFETY: `available()` checked AVX-512F/BW/BF16, all this kernel runs on.
    unsafe { gemm_on(DOTS, c, ldc, a, b, dims, accumulate, epilogue, threads) }
}

/// `C (+)= A dY` after dY's prologue ([`GradB`]: the ReLU mask written back into dY, the bias
/// gradient summed), both done while dY is packed. Otherwise as [`gemm`] (no epilogue). dY
/// and `db` equal [`crate::epilogue::mask_and_bias_grad`]'s bit for bit, and C equals that
/// pass followed by [`gemm`] bit for bit.
///
/// Panics unless [`available`], or when dY, `relu_out` or `db` are smaller than k×n / n.
pub fn gemm_grad(
    c: &mut [f32],
    ldc: usize,
    a: Operand<'_>,
    b: GradB<'_>,
    dims: (usize, usize, usize),
    accumulate: bool,
    threads: usize,
) {
    assert!(available(), "dpbf16::gemm_grad needs AVX-512 BF16");
    // SAFETY: `available()` checked AVX-512F/BW/BF16, all this kernel runs on.
    unsafe { gemm_grad_on(DOTS, c, ldc, a, b, dims, accumulate, threads) }
}

/// This module's kernel for the shared driver ([`crate::amx::gemm_on`]).
const DOTS: Kernel = Kernel {
    name: "dpbf16",
    block_rows,
};

/// The rows of C in `c_rows` (32-row blocks from block `first`), on this thread.
#[allow(clippy::too_many_arguments)]
fn block_rows(
    packed_a: &mut [u16],
    c_rows: &mut [f32],
    first: usize,
    ldc: usize,
    a: Operand<'_>,
    packed_b: &[u16],
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
    epilogue: Epilogue<'_>,
) {
    let kb = k.div_ceil(TK);
    let pairs = k.div_ceil(2);
    let epi = epilogue.parts();
    let rows_here = c_rows.len().div_ceil(ldc).min(m - first * BLOCK);
    for blk in 0..rows_here.div_ceil(BLOCK) {
        let r0 = (first + blk) * BLOCK;
        let rows = (m - r0).min(BLOCK);
        // SAFETY: AVX-512F/BW/BF16 available (`gemm` checked); rows r0..r0+rows of `a` (m×k)
        // exist (the caller's check); `packed_a` holds kb × 2 tiles.
        unsafe { pack_a(packed_a, a, r0, rows, k, kb) };
        for j in 0..n.div_ceil(BLOCK) {
            let c0 = j * BLOCK;
            let cols = (n - c0).min(BLOCK);
            let strips = &packed_b[2 * j * kb * TILE..(2 * j + 2) * kb * TILE];
            let bias = epi.map(|(b, relu)| (&b[c0..c0 + cols], relu));
            for i0 in (0..rows).step_by(MR) {
                let block = Block {
                    first: (blk * BLOCK + i0) * ldc + c0,
                    rows: (rows - i0).min(MR),
                    cols,
                };
                // The 8 rows' tiles: A tile (pair / 16, half) at ((pair / 16) * 2 + half)
                // tiles, row i0 % 16 of it.
                let a_rows = &packed_a[((i0 / 16) * TILE32 + (i0 % 16) * PAIRS) * 2..];
                // SAFETY: AVX-512F/BF16 available; `a_rows` reaches every pair of kb tiles
                // for its 8 rows (packed_a holds kb × 2 tiles of 32 rows), `strips` two
                // strips of kb tiles; the block lies in `c_rows` (`microkernel` asserts it).
                unsafe {
                    if cols > 16 {
                        microkernel::<2>(
                            a_rows, strips, pairs, kb, c_rows, ldc, block, accumulate, bias,
                        )
                    } else {
                        microkernel::<1>(
                            a_rows, strips, pairs, kb, c_rows, ldc, block, accumulate, bias,
                        )
                    }
                };
            }
        }
    }
}

/// Where one microkernel's block of C lies: its first element in the caller's rows, its rows
/// (≤ 8) and columns (≤ 32).
#[derive(Clone, Copy)]
struct Block {
    first: usize,
    rows: usize,
    cols: usize,
}

/// One block of C (≤ 8 rows × ≤ 16·V columns): `C = epi((C if accumulate) + Σ_pairs A·B)`.
/// `a` holds the block's 8 rows of packed A (row i of pair P at u32 `(P / 16) · 512 + i · 16
/// + P % 16`), `strips` two B strips of kb tiles each (pair P's 16 columns at u32 `P · 16`,
/// the second strip `kb · 256` u32 later).
///
/// # Safety
/// AVX-512F/BF16 present; `a` reaches (kb - 1) · 1024 + 8 · 32 u16 (as `pack_a` lays them out)
/// and `strips` 2 · kb tiles; `pairs` ≤ kb · 16.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn microkernel<const V: usize>(
    a: &[u16],
    strips: &[u16],
    pairs: usize,
    kb: usize,
    c: &mut [f32],
    ldc: usize,
    block: Block,
    accumulate: bool,
    epi: Option<(&[f32], bool)>,
) {
    debug_assert!(strips.len() >= 2 * kb * TILE && pairs <= kb * PAIRS);
    debug_assert!(a.len() >= ((kb - 1) * 2 * TILE32 + MR * PAIRS) * 2);
    let Block { first, rows, cols } = block;
    let last = first + (rows - 1) * ldc + cols;
    assert!(last <= c.len(), "dpbf16: C block out of range");
    let col_mask = |v: usize| lanes(cols.saturating_sub(16 * v));
    let pa = a.as_ptr().cast::<u32>();
    let pb = strips.as_ptr().cast::<u32>();
    let second = kb * TILE32;
    let mut acc = [[_mm512_setzero_ps(); V]; MR];
    // SAFETY: (caller) every pair read lies in `a` and `strips` (bounds above); the block's
    // rows × cols at `first` with stride `ldc` lie in `c` (asserted); masked-off lanes are
    // neither read nor written.
    unsafe {
        if accumulate {
            for (i, row) in acc.iter_mut().enumerate().take(rows) {
                for (v, x) in row.iter_mut().enumerate() {
                    let p = c.as_ptr().add(first + i * ldc + 16 * v);
                    *x = _mm512_maskz_loadu_ps(col_mask(v), p);
                }
            }
        }
        for t in 0..pairs.div_ceil(PAIRS) {
            let at = pa.add(t * 2 * TILE32);
            let bt = pb.add(t * TILE32);
            for q in 0..(pairs - t * PAIRS).min(PAIRS) {
                let mut bv = [_mm512_setzero_si512(); V];
                for (v, x) in bv.iter_mut().enumerate() {
                    *x = _mm512_loadu_si512(bt.add(v * second + q * 16).cast());
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai = _mm512_set1_epi32(*at.add(i * PAIRS + q) as i32);
                    for (x, &b) in row.iter_mut().zip(&bv) {
                        *x = _mm512_dpbf16_ps(*x, as_bh(ai), as_bh(b));
                    }
                }
            }
        }
        match epi {
            None => {
                for (i, row) in acc.iter().enumerate().take(rows) {
                    for (v, &x) in row.iter().enumerate() {
                        let p = c.as_mut_ptr().add(first + i * ldc + 16 * v);
                        _mm512_mask_storeu_ps(p, col_mask(v), x);
                    }
                }
            }
            Some((bias, relu)) => {
                // Through a small buffer and the standalone pass's row function: the same
                // per-element operations, bit for bit.
                let mut out = [0f32; MR * 32];
                for (i, row) in acc.iter().enumerate() {
                    for (v, &x) in row.iter().enumerate() {
                        _mm512_storeu_ps(out.as_mut_ptr().add(i * 32 + 16 * v), x);
                    }
                }
                for i in 0..rows {
                    let dst = &mut c[first + i * ldc..][..cols];
                    bias_act_row_from(dst, &out[i * 32..i * 32 + cols], false, bias, relu);
                }
            }
        }
    }
}

/// A vector of 32 bf16 (16 pairs) from its raw bits.
#[target_feature(enable = "avx512f,avx512bf16")]
fn as_bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 512-bit plain-data vectors; this reinterprets the bits.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epilogue::{bias_act, mask_and_bias_grad};
    use crate::gemm_ops::round_bf16;

    fn values(len: usize, seed: u64) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let h = sparta_mix::mix64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                (h >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    fn at(o: Operand<'_>, r: usize, c: usize) -> f32 {
        o.data[r * o.rs + c * o.cs]
    }

    /// Reference: A and B rounded to bf16, products summed in f64.
    fn reference(a: Operand<'_>, b: Operand<'_>, (m, k, n): (usize, usize, usize)) -> Vec<f64> {
        let mut c = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| round_bf16(at(a, i, p)) as f64 * round_bf16(at(b, p, j)) as f64)
                    .sum();
            }
        }
        c
    }

    /// The SDM's VDPBF16PS arithmetic in scalar f32: from `start`, per pair the odd product,
    /// then the even one, each addition rounded (the products of two bf16 are exact in f32;
    /// the values here are multiples of 2^-23 in [-1, 1], so no operand, product or sum is a
    /// denormal and DAZ/FTZ change nothing).
    fn sdm(a: Operand<'_>, b: Operand<'_>, i: usize, j: usize, k: usize, start: f32) -> f32 {
        let mut acc = start;
        for p in (0..k).step_by(2) {
            if p + 1 < k {
                acc += round_bf16(at(a, i, p + 1)) * round_bf16(at(b, p + 1, j));
            }
            acc += round_bf16(at(a, i, p)) * round_bf16(at(b, p, j));
        }
        acc
    }

    fn operand(data: &[f32], rows: usize, cols: usize, transposed: bool) -> Operand<'_> {
        if transposed {
            Operand {
                data,
                rs: 1,
                cs: rows,
            }
        } else {
            Operand {
                data,
                rs: cols,
                cs: 1,
            }
        }
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    const SHAPES: [(usize, usize, usize); 9] = [
        (1, 1, 1),
        (7, 5, 3),
        (8, 2, 16),
        (9, 1, 40),
        (33, 65, 17),
        (41, 33, 47),
        (100, 429, 70),
        (64, 7, 130),
        (5, 300, 3),
    ];

    fn pool() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap()
    }

    /// C against the f64 sums of the rounded operands, within the worst-case error of k + 1
    /// f32 additions (C's start value, then the k products, each exact): |error| ≤ (k + 1) ·
    /// 2^-24 · (|start| + Σ |products|). And against the SDM's arithmetic bit for bit.
    fn check(m: usize, k: usize, n: usize, a_t: bool, b_t: bool, threads: usize) {
        let av = values(m * k, 1);
        let bv = values(k * n, 2);
        let (a, b) = (operand(&av, m, k, a_t), operand(&bv, k, n, b_t));
        let want = reference(a, b, (m, k, n));
        let abs_a: Vec<f32> = av.iter().map(|x| x.abs()).collect();
        let abs_b: Vec<f32> = bv.iter().map(|x| x.abs()).collect();
        let magnitude = reference(
            operand(&abs_a, m, k, a_t),
            operand(&abs_b, k, n, b_t),
            (m, k, n),
        );
        let ldc = n + 3;
        let start = values(m * ldc, 3);
        for accumulate in [false, true] {
            let what =
                format!("{m}x{k}x{n} a_t={a_t} b_t={b_t} threads={threads} acc={accumulate}");
            let mut c = start.clone();
            pool().install(|| {
                gemm(
                    &mut c,
                    ldc,
                    a,
                    b,
                    (m, k, n),
                    accumulate,
                    Epilogue::None,
                    threads,
                )
            });
            for i in 0..m {
                for j in 0..n {
                    let s = if accumulate { start[i * ldc + j] } else { 0.0 };
                    let got = c[i * ldc + j];
                    let w = want[i * n + j] + s as f64;
                    let tol = (k + 1) as f64
                        * f64::powi(2.0, -24)
                        * (s.abs() as f64 + magnitude[i * n + j]);
                    assert!(
                        (got as f64 - w).abs() <= tol,
                        "({i},{j}) {what}: {got} vs {w} (tol {tol})"
                    );
                    let exact = sdm(a, b, i, j, k, s);
                    assert_eq!(
                        got.to_bits(),
                        exact.to_bits(),
                        "({i},{j}) {what}: {got} vs the SDM's {exact}"
                    );
                }
                // The padding columns of C are untouched.
                for j in n..ldc {
                    if i + 1 < m {
                        assert_eq!(
                            c[i * ldc + j].to_bits(),
                            start[i * ldc + j].to_bits(),
                            "{what}"
                        );
                    }
                }
            }
        }
    }

    /// What the kernel gives and the rounded f32 fallback does not: its sums are the SDM's
    /// order (pairs, odd product first), not the f32 GEMM's blocking, so the two agree within
    /// the tolerance of [`check`], not bit for bit; everything else (rounding of the operands,
    /// the epilogues, the dY prologue) is the same bit for bit (the fused tests).
    #[test]
    #[ignore = "needs a CPU with AVX512-BF16 (Cooper Lake, Sapphire Rapids, Zen 4 or later): \
                .ci/run runs it with --ignored where /proc/cpuinfo lists avx512_bf16; gemm_ops' \
                bf16 tests run everywhere"]
    fn every_layout_and_edge_matches_the_bf16_reference_and_the_sdm_order() {
        assert!(available(), "this CPU offers no AVX512-BF16");
        for &(m, k, n) in &SHAPES {
            for a_t in [false, true] {
                for b_t in [false, true] {
                    check(m, k, n, a_t, b_t, 1);
                }
            }
        }
        check(200, 96, 64, false, false, 2);
        check(130, 77, 45, true, true, 2);
        check(96, 301, 33, true, false, 2);
    }

    /// VDPBF16PS treats denormal inputs as zero and flushes denormal results to zero (SDM),
    /// where the rounded f32 fallback keeps them: the one place the arithmetic differs beyond
    /// the order of the sums. bf16 keeps f32's exponent range, so an operand below 2^-126
    /// stays a (bf16) denormal after rounding.
    #[test]
    #[ignore = "needs a CPU with AVX512-BF16: .ci/run runs it with --ignored where \
                /proc/cpuinfo lists avx512_bf16"]
    fn denormal_operands_and_sums_are_zero_unlike_the_fallback() {
        assert!(available(), "this CPU offers no AVX512-BF16");
        let tiny = f32::powi(2.0, -130); // a bf16 denormal
        let cases = [
            (tiny, f32::powi(2.0, 100)),                // denormal input
            (f32::powi(2.0, -70), f32::powi(2.0, -60)), // normal inputs, denormal product
        ];
        for (x, y) in cases {
            let fallback = round_bf16(x) * round_bf16(y);
            assert!(fallback != 0.0, "the f32 fallback keeps {x:e} x {y:e}");
            let mut c = [1.0f32];
            let a = [x];
            let b = [y];
            let (a, b) = (operand(&a, 1, 1, false), operand(&b, 1, 1, false));
            gemm(&mut c, 1, a, b, (1, 1, 1), false, Epilogue::None, 1);
            assert_eq!(c[0].to_bits(), 0, "{x:e} x {y:e} flushed to +0");
        }
    }

    /// The fused forward (the epilogue on each finished block) equals the plain kernel followed
    /// by the standalone pass, and the fused dW (mask and bias gradient while dY is packed) the
    /// standalone pass followed by the plain kernel, bit for bit (C, the masked dY and db).
    #[test]
    #[ignore = "needs a CPU with AVX512-BF16: .ci/run runs it with --ignored where \
                /proc/cpuinfo lists avx512_bf16; gemm_ops' fused tests run everywhere"]
    fn fused_epilogues_match_the_unfused_passes_bit_for_bit() {
        assert!(available(), "this CPU offers no AVX512-BF16");
        let pool = pool();
        for &(m, k, n) in SHAPES.iter().chain(&[(200, 96, 64), (2048, 128, 1)]) {
            for threads in [1, 2] {
                let av = values(m * k, 1);
                let bv = values(k * n, 2);
                let bias = values(n, 3);
                let (a, b) = (operand(&av, m, k, false), operand(&bv, k, n, false));
                for relu in [false, true] {
                    for accumulate in [false, true] {
                        let what =
                            format!("{m}x{k}x{n} threads={threads} relu={relu} acc={accumulate}");
                        let start = values(m * n, 4);
                        let mut want = start.clone();
                        pool.install(|| {
                            gemm(
                                &mut want,
                                n,
                                a,
                                b,
                                (m, k, n),
                                accumulate,
                                Epilogue::None,
                                threads,
                            )
                        });
                        bias_act(&mut want, &bias, relu, 1);
                        let mut got = start.clone();
                        let epi = Epilogue::bias(&bias, relu);
                        pool.install(|| {
                            gemm(&mut got, n, a, b, (m, k, n), accumulate, epi, threads)
                        });
                        assert!(same_bits(&got, &want), "forward {what}");
                        if relu && m * n >= 8 {
                            assert!(got.contains(&0.0), "the ReLU clips something: {what}");
                        }
                    }
                }
                // dW = X^T dY: X stored k×m (A transposed), dY k×n.
                let xv = values(k * m, 5);
                let x = operand(&xv, m, k, true);
                let y = values(k * n, 6);
                for relu in [false, true] {
                    for accumulate in [false, true] {
                        let what = format!(
                            "dW {m}x{k}x{n} threads={threads} relu={relu} acc={accumulate}"
                        );
                        let relu_out = relu.then_some(&y[..]);
                        let (mut dy_w, mut db_w, mut c_w) =
                            (values(k * n, 7), values(n, 8), values(m * n, 9));
                        mask_and_bias_grad(&mut dy_w, relu_out, &mut db_w, 1);
                        let dy_op = operand(&dy_w, k, n, false);
                        pool.install(|| {
                            gemm(
                                &mut c_w,
                                n,
                                x,
                                dy_op,
                                (m, k, n),
                                accumulate,
                                Epilogue::None,
                                threads,
                            )
                        });
                        let (mut dy, mut db, mut c) =
                            (values(k * n, 7), values(n, 8), values(m * n, 9));
                        let gb = GradB {
                            dy: &mut dy,
                            ld: n,
                            relu_out,
                            db: &mut db,
                        };
                        pool.install(|| {
                            gemm_grad(&mut c, n, x, gb, (m, k, n), accumulate, threads)
                        });
                        assert!(same_bits(&dy, &dy_w), "dY {what}");
                        assert!(same_bits(&db, &db_w), "db {what}");
                        assert!(same_bits(&c, &c_w), "C {what}");
                        if relu && k * n >= 8 {
                            assert!(dy.contains(&0.0), "the mask zeroes something: {what}");
                        }
                    }
                }
            }
        }
    }
}
