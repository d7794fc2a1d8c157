//! Safe, bounds-checked wrappers over the `gemm-f32` kernels for row-major f32 matrices, and the bf16
//! path ([`Precision::Bf16`], [`bf16_kernel`]: AMX tiles where the CPU has them, `crate::amx`;
//! else AVX-512 BF16 dot products, `crate::dpbf16`; else the rounded operands on the f32 GEMM).
//!
//! Transposed operands are expressed through strides, never materialized:
//! `dW = X^T dY` is [`matmul_tn`] and `dX = dY W^T` is [`matmul_nt`].
//!
//! A dense layer's elementwise work goes with its GEMMs ([`crate::epilogue`]): the forward
//! `act(X W + b)` is [`matmul_nn_fused`], the backward's `dW += X^T mask(dY)` with the bias
//! gradient is [`matmul_tn_grad`]. On AMX tiles it is fused into the kernel; on the f32 GEMM it
//! is one standalone pass after (before) it, the same values bit for bit. The AVX-512 BF16 kernel
//! fuses them as the tiles do.

use gemm_common::Parallelism;
use serde::{Deserialize, Serialize};

pub use crate::epilogue::Epilogue;
use crate::epilogue::{bias_act, bias_act_row, mask_and_bias_grad};

/// The arithmetic of the dense GEMMs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// f32 operands and sums (the default).
    #[default]
    F32,
    /// Operands rounded to bfloat16 (nearest even), products summed in f32: mixed precision
    /// as TensorFlow's `mixed_bfloat16` and PyTorch's autocast do for matmuls. Parameters,
    /// gradients, activations and the optimizer stay f32. Runs on AMX tiles where the CPU
    /// has AMX-BF16, else on AVX-512 BF16 dot products (`VDPBF16PS`) where it has those;
    /// elsewhere the same rounding on the f32 GEMM (slower than f32). The three give the same
    /// results up to the order of the f32 sums (and the dot products' flush of denormals).
    Bf16,
}

impl Precision {
    /// The name configs and flags use (`f32`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}

/// A precision name that is neither `f32` nor `bf16` (the name given).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: expected f32 or bf16")]
pub struct UnknownPrecision(pub String);

impl std::str::FromStr for Precision {
    type Err = UnknownPrecision;

    fn from_str(s: &str) -> Result<Self, UnknownPrecision> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            other => Err(UnknownPrecision(other.to_string())),
        }
    }
}

/// How one GEMM runs: its threads and its precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compute {
    /// Threads of the current rayon pool one GEMM may use (1: the calling thread).
    pub threads: usize,
    pub precision: Precision,
}

impl Compute {
    /// One thread, f32.
    pub const SERIAL: Compute = Compute {
        threads: 1,
        precision: Precision::F32,
    };

    /// `threads` threads of the current rayon pool, f32.
    pub fn rayon(threads: usize) -> Compute {
        Compute {
            threads: threads.max(1),
            precision: Precision::F32,
        }
    }

    /// The same threads with `precision`.
    pub fn with_precision(self, precision: Precision) -> Compute {
        Compute { precision, ..self }
    }

    fn gemm_parallelism(self) -> Parallelism {
        if self.threads > 1 {
            Parallelism::Rayon(self.threads)
        } else {
            Parallelism::None
        }
    }
}

/// Which operand layout a product uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// C = A B, A stored m×k, B stored k×n.
    Nn,
    /// C = A^T B, A stored k×m, B stored k×n.
    Tn,
    /// C = A B^T, A stored m×k, B stored n×k.
    Nt,
}

/// Minimum slice length for a row-major matrix with `rows` rows of `cols` used columns and
/// row stride `ld`.
fn need(rows: usize, cols: usize, ld: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * ld + cols
    }
}

#[allow(clippy::too_many_arguments)]
fn matmul(
    layout: Layout,
    c: &mut [f32],
    ldc: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
    par: Compute,
) {
    assert!(ldc >= n && c.len() >= need(m, n, ldc), "gemm: C too small");
    let (a_rows, a_cols, b_rows, b_cols) = match layout {
        Layout::Nn => (m, k, k, n),
        Layout::Tn => (k, m, k, n),
        Layout::Nt => (m, k, n, k),
    };
    assert!(
        lda >= a_cols && a.len() >= need(a_rows, a_cols, lda),
        "gemm: A too small"
    );
    assert!(
        ldb >= b_cols && b.len() >= need(b_rows, b_cols, ldb),
        "gemm: B too small"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                c[r * ldc..r * ldc + n].fill(0.0);
            }
        }
        return;
    }
    // (cs, rs) of the logical m×k lhs and k×n rhs.
    let (lhs_cs, lhs_rs) = match layout {
        Layout::Nn | Layout::Nt => (1, lda),
        Layout::Tn => (lda, 1),
    };
    let (rhs_cs, rhs_rs) = match layout {
        Layout::Nn | Layout::Tn => (1, ldb),
        Layout::Nt => (ldb, 1),
    };
    if par.precision == Precision::Bf16 {
        #[cfg(target_arch = "x86_64")]
        if let Some(gemm) = bf16_gemm() {
            let lhs = crate::amx::Operand {
                data: a,
                rs: lhs_rs,
                cs: lhs_cs,
            };
            let rhs = crate::amx::Operand {
                data: b,
                rs: rhs_rs,
                cs: rhs_cs,
            };
            gemm(
                c,
                ldc,
                lhs,
                rhs,
                (m, k, n),
                accumulate,
                Epilogue::None,
                par.threads,
            );
            return;
        }
        // No bf16 instructions: the same rounding on the f32 GEMM.
        let a16: Vec<f32> = a.iter().map(|&x| round_bf16(x)).collect();
        let b16: Vec<f32> = b.iter().map(|&x| round_bf16(x)).collect();
        let f32_par = par.with_precision(Precision::F32);
        return matmul(
            layout,
            c,
            ldc,
            &a16,
            lda,
            &b16,
            ldb,
            (m, k, n),
            accumulate,
            f32_par,
        );
    }
    let (c, a, b) = (c.as_mut_ptr(), a.as_ptr(), b.as_ptr());
    let (lhs, rhs) = (
        Operand {
            ptr: a,
            cs: lhs_cs as isize,
            rs: lhs_rs as isize,
        },
        Operand {
            ptr: b,
            cs: rhs_cs as isize,
            rs: rhs_rs as isize,
        },
    );
    // `gemm`'s own entry point normalizes the operands before it dispatches by type: its
    // microkernel prefers a column-major destination, so a row-major `C = A B` is computed as
    // `C^T = B^T A^T` (m and n, the operands and their strides swapped). Every stride here is
    // positive, so its other normalization (flipping negative strides) never applies.
    let (m, n, dst_cs, dst_rs, lhs, rhs) = if ldc > 1 {
        (n, m, ldc as isize, 1, rhs.transposed(), lhs.transposed())
    } else {
        (m, n, 1, ldc as isize, lhs, rhs)
    };
    // SAFETY: the asserts above guarantee every element addressed by (m, n, k) and the strides
    // lies inside `c`, `a` and `b` (the swap above addresses the same elements); `c` is
    // exclusively borrowed and cannot alias `a` or `b`.
    unsafe {
        gemm_f32::gemm::f32::get_gemm_fn()(
            m,
            n,
            k,
            c,
            dst_cs,
            dst_rs,
            accumulate,
            lhs.ptr,
            lhs.cs,
            lhs.rs,
            rhs.ptr,
            rhs.cs,
            rhs.rs,
            1.0,
            1.0,
            false,
            false,
            false,
            par.gemm_parallelism(),
        );
    }
}

/// A GEMM operand: its first element and its column and row strides (in elements).
#[derive(Clone, Copy)]
struct Operand {
    ptr: *const f32,
    cs: isize,
    rs: isize,
}

impl Operand {
    /// The same elements read as the transposed matrix.
    fn transposed(self) -> Operand {
        Operand {
            ptr: self.ptr,
            cs: self.rs,
            rs: self.cs,
        }
    }
}

/// Whether [`Precision::Bf16`] runs on AMX tiles here ([`bf16_kernel`] says which kernel runs).
pub fn bf16_tiles() -> bool {
    bf16_kernel() == Bf16Kernel::Tiles
}

/// Which kernel runs [`Precision::Bf16`]'s GEMMs on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Kernel {
    /// AMX tiles (`TDPBF16PS`, `crate::amx`).
    Tiles,
    /// AVX-512 BF16 dot products (`VDPBF16PS`, `crate::dpbf16`): CPUs with AVX512-BF16 and no
    /// AMX (or no permission for its tile state).
    DotProducts,
    /// The operands rounded to bf16, then the f32 GEMM: slower than f32.
    Rounded,
}

impl Bf16Kernel {
    /// Its name in logs and benchmark reports (`amx`, `avx512_bf16`, `rounded_f32`).
    pub fn name(self) -> &'static str {
        match self {
            Bf16Kernel::Tiles => "amx",
            Bf16Kernel::DotProducts => "avx512_bf16",
            Bf16Kernel::Rounded => "rounded_f32",
        }
    }
}

/// The kernel of [`Precision::Bf16`] in this process, chosen once: AMX tiles where the CPU
/// has them; else AVX-512 BF16 dot products where `VDPBF16PS` outruns f32 FMAs on this core
/// (`crate::dpbf16::outruns_fma`, measured once); else the rounded f32 GEMM. The environment
/// variable `SPARTA_BF16_KERNEL` (`amx`, `avx512_bf16`, `rounded_f32`; `auto` or unset: the
/// rule above) asks for one; a kernel this CPU cannot run is refused with a warning and the
/// rule decides.
pub fn bf16_kernel() -> Bf16Kernel {
    static KERNEL: std::sync::OnceLock<Bf16Kernel> = std::sync::OnceLock::new();
    *KERNEL.get_or_init(|| {
        let asked = std::env::var("SPARTA_BF16_KERNEL").ok();
        let kernel = choose_bf16_kernel(asked.as_deref());
        tracing::debug!(
            kernel = kernel.name(),
            asked = asked.as_deref(),
            "bf16 kernel"
        );
        kernel
    })
}

/// [`bf16_kernel`]'s rule, `asked` the variable's value.
fn choose_bf16_kernel(asked: Option<&str>) -> Bf16Kernel {
    let kernels = [
        Bf16Kernel::Tiles,
        Bf16Kernel::DotProducts,
        Bf16Kernel::Rounded,
    ];
    if let Some(name) = asked.filter(|n| !n.is_empty() && *n != "auto") {
        match kernels.into_iter().find(|k| k.name() == name) {
            Some(k) if bf16_runs(k) => return k,
            Some(_) => tracing::warn!(
                "SPARTA_BF16_KERNEL={name}: this CPU (or kernel) cannot run it; choosing by the rule"
            ),
            None => tracing::warn!(
                "SPARTA_BF16_KERNEL={name}: expected amx, avx512_bf16, rounded_f32 or auto"
            ),
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        if bf16_runs(Bf16Kernel::Tiles) {
            return Bf16Kernel::Tiles;
        }
        if bf16_runs(Bf16Kernel::DotProducts) && crate::dpbf16::outruns_fma() {
            return Bf16Kernel::DotProducts;
        }
    }
    Bf16Kernel::Rounded
}

/// Whether this CPU (and OS) can run `kernel`.
fn bf16_runs(kernel: Bf16Kernel) -> bool {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Bf16Kernel::Tiles => crate::amx::available(),
        #[cfg(target_arch = "x86_64")]
        Bf16Kernel::DotProducts => crate::dpbf16::available(),
        #[cfg(not(target_arch = "x86_64"))]
        Bf16Kernel::Tiles | Bf16Kernel::DotProducts => false,
        Bf16Kernel::Rounded => true,
    }
}

/// The bf16 GEMM entry point of [`bf16_kernel`] (both kernels share their signature and their
/// operand types), `None` for the rounded f32 path.
#[cfg(target_arch = "x86_64")]
type Bf16Gemm = fn(
    &mut [f32],
    usize,
    crate::amx::Operand<'_>,
    crate::amx::Operand<'_>,
    (usize, usize, usize),
    bool,
    Epilogue<'_>,
    usize,
);

#[cfg(target_arch = "x86_64")]
fn bf16_gemm() -> Option<Bf16Gemm> {
    match bf16_kernel() {
        Bf16Kernel::Tiles => Some(crate::amx::gemm),
        Bf16Kernel::DotProducts => Some(crate::dpbf16::gemm),
        Bf16Kernel::Rounded => None,
    }
}

/// [`bf16_gemm`] of the dW product with dY's prologue.
#[cfg(target_arch = "x86_64")]
type Bf16GemmGrad = fn(
    &mut [f32],
    usize,
    crate::amx::Operand<'_>,
    crate::amx::GradB<'_>,
    (usize, usize, usize),
    bool,
    usize,
);

#[cfg(target_arch = "x86_64")]
fn bf16_gemm_grad() -> Option<Bf16GemmGrad> {
    match bf16_kernel() {
        Bf16Kernel::Tiles => Some(crate::amx::gemm_grad),
        Bf16Kernel::DotProducts => Some(crate::dpbf16::gemm_grad),
        Bf16Kernel::Rounded => None,
    }
}

/// f32 → bf16 → f32, round to nearest even (NaN stays NaN): what [`Precision::Bf16`] does
/// to each GEMM operand.
pub fn round_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let bits = x.to_bits();
    f32::from_bits(bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000)
}

/// `C (+)= A B` with A m×k (row stride `lda`), B k×n (`ldb`), C m×n (`ldc`).
#[allow(clippy::too_many_arguments)]
pub fn matmul_nn(
    c: &mut [f32],
    ldc: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    mkn: (usize, usize, usize),
    accumulate: bool,
    par: Compute,
) {
    matmul(Layout::Nn, c, ldc, a, lda, b, ldb, mkn, accumulate, par)
}

/// `C = act(A B + bias)` ([`Epilogue`]) with A m×k (row stride `lda`), B k×n (`ldb`), C m×n
/// (`ldc`): a dense layer's forward. On AMX tiles and AVX-512 BF16 the epilogue runs on each
/// finished block of C inside the kernel; otherwise in one pass after the GEMM (over `par`'s
/// threads).
///
/// # Panics
/// As [`matmul_nn`], or when the bias is shorter than n.
#[allow(clippy::too_many_arguments)]
pub fn matmul_nn_fused(
    c: &mut [f32],
    ldc: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    (m, k, n): (usize, usize, usize),
    epilogue: Epilogue<'_>,
    par: Compute,
) {
    if let Some((bias, _)) = epilogue.parts() {
        assert!(bias.len() >= n, "gemm: bias shorter than C's {n} columns");
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(gemm) = bf16_gemm().filter(|_| par.precision == Precision::Bf16 && k > 0) {
        assert!(ldc >= n && c.len() >= need(m, n, ldc), "gemm: C too small");
        assert!(lda >= k && a.len() >= need(m, k, lda), "gemm: A too small");
        assert!(ldb >= n && b.len() >= need(k, n, ldb), "gemm: B too small");
        let lhs = crate::amx::Operand {
            data: a,
            rs: lda,
            cs: 1,
        };
        let rhs = crate::amx::Operand {
            data: b,
            rs: ldb,
            cs: 1,
        };
        gemm(c, ldc, lhs, rhs, (m, k, n), false, epilogue, par.threads);
        return;
    }
    matmul(Layout::Nn, c, ldc, a, lda, b, ldb, (m, k, n), false, par);
    if let Some((bias, relu)) = epilogue.parts() {
        let bias = &bias[..n];
        if ldc == n {
            bias_act(&mut c[..m * n], bias, relu, par.threads);
        } else {
            for r in 0..m {
                bias_act_row(&mut c[r * ldc..r * ldc + n], bias, relu);
            }
        }
    }
}

/// A dense layer's dW: `C (+)= A^T dY` (A stored k×m, row stride `lda`; dY k×n contiguous;
/// C m×n, `ldc`) after dY's prologue: with `relu_out` (the forward's ReLU output, dY's shape)
/// `dY *= (relu_out > 0)` in place, then `db += colsum(dY)`. On AMX tiles and AVX-512 BF16 the
/// prologue runs while dY is packed; otherwise in one pass before the GEMM (over `par`'s threads,
/// by columns). Either way the masked dY stays in `dy` for the dX product.
///
/// # Panics
/// As [`matmul_tn`], or when `relu_out` differs from dY's length or `db` from n.
#[allow(clippy::too_many_arguments)]
pub fn matmul_tn_grad(
    c: &mut [f32],
    ldc: usize,
    a: &[f32],
    lda: usize,
    dy: &mut [f32],
    relu_out: Option<&[f32]>,
    db: &mut [f32],
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
    par: Compute,
) {
    let dy = &mut dy[..k * n];
    let relu_out = relu_out.map(|y| &y[..k * n]);
    assert_eq!(db.len(), n, "gemm: db is not C's {n} columns");
    #[cfg(target_arch = "x86_64")]
    if let Some(gemm_grad) =
        bf16_gemm_grad().filter(|_| par.precision == Precision::Bf16 && k > 0 && m > 0)
    {
        assert!(ldc >= n && c.len() >= need(m, n, ldc), "gemm: C too small");
        assert!(lda >= m && a.len() >= need(k, m, lda), "gemm: A too small");
        let lhs = crate::amx::Operand {
            data: a,
            rs: 1,
            cs: lda,
        };
        let rhs = crate::amx::GradB {
            dy,
            ld: n,
            relu_out,
            db,
        };
        gemm_grad(c, ldc, lhs, rhs, (m, k, n), accumulate, par.threads);
        return;
    }
    mask_and_bias_grad(dy, relu_out, db, par.threads);
    matmul(
        Layout::Tn,
        c,
        ldc,
        a,
        lda,
        dy,
        n,
        (m, k, n),
        accumulate,
        par,
    );
}

/// `C (+)= A^T B` with A stored k×m (row stride `lda`), B k×n (`ldb`), C m×n (`ldc`).
#[allow(clippy::too_many_arguments)]
pub fn matmul_tn(
    c: &mut [f32],
    ldc: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    mkn: (usize, usize, usize),
    accumulate: bool,
    par: Compute,
) {
    matmul(Layout::Tn, c, ldc, a, lda, b, ldb, mkn, accumulate, par)
}

/// `C (+)= A B^T` with A m×k (row stride `lda`), B stored n×k (`ldb`), C m×n (`ldc`).
#[allow(clippy::too_many_arguments)]
pub fn matmul_nt(
    c: &mut [f32],
    ldc: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    mkn: (usize, usize, usize),
    accumulate: bool,
    par: Compute,
) {
    matmul(Layout::Nt, c, ldc, a, lda, b, ldb, mkn, accumulate, par)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    fn transpose(x: &[f32], r: usize, c: usize) -> Vec<f32> {
        let mut t = vec![0.0; r * c];
        for i in 0..r {
            for j in 0..c {
                t[j * r + i] = x[i * c + j];
            }
        }
        t
    }

    #[test]
    fn layouts_match_naive() {
        let (m, k, n) = (7, 5, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let want = naive(&a, &b, m, k, n);
        let mut c = vec![1.0; m * n];
        matmul_nn(&mut c, n, &a, k, &b, n, (m, k, n), false, Compute::SERIAL);
        assert!(c.iter().zip(&want).all(|(x, y)| (x - y).abs() < 1e-5));
        let at = transpose(&a, m, k);
        let mut c2 = vec![0.0; m * n];
        matmul_tn(&mut c2, n, &at, m, &b, n, (m, k, n), false, Compute::SERIAL);
        assert!(c2.iter().zip(&want).all(|(x, y)| (x - y).abs() < 1e-5));
        let bt = transpose(&b, k, n);
        let mut c3 = vec![0.0; m * n];
        matmul_nt(&mut c3, n, &a, k, &bt, k, (m, k, n), false, Compute::SERIAL);
        matmul_nt(&mut c3, n, &a, k, &bt, k, (m, k, n), true, Compute::SERIAL);
        assert!(c3
            .iter()
            .zip(&want)
            .all(|(x, y)| (x - 2.0 * y).abs() < 1e-5));
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// A dense layer's fused GEMMs equal the unfused sequence of today (GEMM, then the scalar
    /// bias + ReLU loop; the scalar mask + bias-gradient loop, then the dW GEMM) bit for bit,
    /// in f32 and bf16 (AMX tiles where the CPU has them, the rounded f32 GEMM elsewhere), on
    /// one thread and split over a pool's threads, for odd shapes.
    #[test]
    fn fused_layer_gemms_match_the_unfused_passes_bit_for_bit() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let val = |len: usize, s: f32| crate::bench::pseudo(len, s.to_bits() as u64);
        for &(m, k, n) in &[(7, 5, 3), (40, 70, 33), (300, 129, 18), (64, 16, 1)] {
            for precision in [Precision::F32, Precision::Bf16] {
                for threads in [1, 2] {
                    let par = Compute::rayon(threads).with_precision(precision);
                    let x = val(m * k, 0.37);
                    let w = val(k * n, 0.11);
                    let bias = val(n, 0.7);
                    for relu in [false, true] {
                        let what =
                            format!("{m}x{k}x{n} {precision:?} threads={threads} relu={relu}");
                        // forward: y = act(x w + b)
                        let mut want = vec![0.0; m * n];
                        pool.install(|| {
                            matmul_nn(&mut want, n, &x, k, &w, n, (m, k, n), false, par)
                        });
                        for row in want.chunks_exact_mut(n) {
                            for (v, &b) in row.iter_mut().zip(&bias) {
                                *v = if relu { (*v + b).max(0.0) } else { *v + b };
                            }
                        }
                        let mut got = vec![f32::NAN; m * n];
                        let epi = Epilogue::bias(&bias, relu);
                        pool.install(|| {
                            matmul_nn_fused(&mut got, n, &x, k, &w, n, (m, k, n), epi, par)
                        });
                        assert!(same_bits(&got, &want), "forward {what}");
                        // backward: dW += x^T mask(dy), db += colsum(mask(dy)); x is m×k
                        // (m rows of the batch), dy m×n.
                        let y = relu.then_some(&want[..]);
                        let dy0 = val(m * n, 0.23);
                        let (mut dy_w, mut db_w, mut gw_w) =
                            (dy0.clone(), val(n, 0.5), val(k * n, 0.9));
                        for r in 0..m {
                            for (j, d) in db_w.iter_mut().enumerate() {
                                let i = r * n + j;
                                if y.is_some_and(|y| y[i] <= 0.0 || y[i].is_nan()) {
                                    dy_w[i] = 0.0;
                                }
                                *d += dy_w[i];
                            }
                        }
                        pool.install(|| {
                            matmul_tn(&mut gw_w, n, &x, k, &dy_w, n, (k, m, n), true, par)
                        });
                        let (mut dy, mut db, mut gw) = (dy0.clone(), val(n, 0.5), val(k * n, 0.9));
                        pool.install(|| {
                            matmul_tn_grad(
                                &mut gw,
                                n,
                                &x,
                                k,
                                &mut dy,
                                y,
                                &mut db,
                                (k, m, n),
                                true,
                                par,
                            )
                        });
                        assert!(same_bits(&dy, &dy_w), "dY {what}");
                        assert!(same_bits(&db, &db_w), "db {what}");
                        assert!(same_bits(&gw, &gw_w), "dW {what}");
                        if relu && m * n > 8 {
                            assert!(got.contains(&0.0) && dy.contains(&0.0), "ReLU clips {what}");
                        }
                    }
                }
            }
        }
    }

    /// `SPARTA_BF16_KERNEL`'s rule: a kernel this CPU runs is taken when asked; one it cannot
    /// run, a name that is none, `auto` and unset all leave the choice to the rule.
    #[test]
    fn an_asked_bf16_kernel_is_taken_where_the_cpu_runs_it() {
        let rule = choose_bf16_kernel(None);
        assert!(
            bf16_runs(rule),
            "the rule picks a kernel that runs: {rule:?}"
        );
        assert_eq!(choose_bf16_kernel(Some("auto")), rule);
        assert_eq!(choose_bf16_kernel(Some("")), rule);
        assert_eq!(choose_bf16_kernel(Some("fp8")), rule);
        assert_eq!(choose_bf16_kernel(Some("rounded_f32")), Bf16Kernel::Rounded);
        for k in [
            Bf16Kernel::Tiles,
            Bf16Kernel::DotProducts,
            Bf16Kernel::Rounded,
        ] {
            let want = if bf16_runs(k) { k } else { rule };
            assert_eq!(choose_bf16_kernel(Some(k.name())), want, "{k:?}");
        }
    }

    #[test]
    fn precision_names_parse_back() {
        for p in [Precision::F32, Precision::Bf16] {
            assert_eq!(p.name().parse::<Precision>(), Ok(p));
        }
        let e = "fp16".parse::<Precision>().unwrap_err();
        assert_eq!(e.to_string(), "\"fp16\": expected f32 or bf16");
    }

    #[test]
    fn rounding_is_nearest_even() {
        assert_eq!(round_bf16(1.0), 1.0);
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert_eq!(round_bf16(-2.5), -2.5);
        assert!(round_bf16(f32::NAN).is_nan());
        assert_eq!(round_bf16(f32::INFINITY), f32::INFINITY);
    }

    /// Every layout in bf16 (AMX where the CPU has it, the rounded f32 GEMM elsewhere) equals
    /// the product of the rounded operands up to the order of the f32 sums.
    #[test]
    fn bf16_products_are_the_rounded_operands_products() {
        let bf16 = Compute::SERIAL.with_precision(Precision::Bf16);
        for &(m, k, n) in &[(7, 5, 3), (40, 70, 33), (3, 129, 18)] {
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
            let ra: Vec<f32> = a.iter().map(|&x| round_bf16(x)).collect();
            let rb: Vec<f32> = b.iter().map(|&x| round_bf16(x)).collect();
            let want = naive(&ra, &rb, m, k, n);
            let f32_want = naive(&a, &b, m, k, n);
            let close = |c: &[f32]| c.iter().zip(&want).all(|(x, y)| (x - y).abs() < 1e-4);
            let mut c = vec![0.0; m * n];
            matmul_nn(&mut c, n, &a, k, &b, n, (m, k, n), false, bf16);
            assert!(close(&c), "nn {m}x{k}x{n}");
            // bf16 really rounds: the f32 product differs.
            assert!(c.iter().zip(&f32_want).any(|(x, y)| (x - y).abs() > 1e-4));
            let at = transpose(&a, m, k);
            let mut c = vec![0.0; m * n];
            matmul_tn(&mut c, n, &at, m, &b, n, (m, k, n), false, bf16);
            assert!(close(&c), "tn {m}x{k}x{n}");
            let bt = transpose(&b, k, n);
            let mut c = vec![1.0; m * n];
            matmul_nt(&mut c, n, &a, k, &bt, k, (m, k, n), true, bf16);
            assert!(
                c.iter().zip(&want).all(|(x, y)| (x - 1.0 - y).abs() < 1e-4),
                "nt {m}x{k}x{n}"
            );
        }
    }
}
