//! bf16 GEMM on Intel AMX tiles (`TDPBF16PS`): `C (+)= A B` with A and B rounded to bfloat16
//! (round to nearest even) and every product accumulated in f32.
//!
//! Used by [`crate::gemm_ops`] when a model asks for `precision = "bf16"` and the CPU has
//! AMX-BF16 (Sapphire Rapids and later); elsewhere the f32 GEMM runs. One tile op multiplies
//! 16×32 by 32×16 (16 K FLOPs), about 16x what AVX-512 FMAs do per cycle, so the packing of the
//! operands into tiles (f32 → bf16, transposed where the product needs it) is most of the
//! remaining cost: every layout the dense layers use (A or B stored plain or transposed) is
//! packed with AVX-512 shuffles, 16×16 blocks of 32-bit pairs at a time.
//!
//! Layouts (AMX's): an A tile is 16 rows × 32 bf16 (K contiguous); a B tile is 16 rows of K
//! pairs × 16 columns, each entry the bf16 pair (B[2p][n], B[2p+1][n]) ("VNNI"). The kernel
//! computes a 32×32 block of C with four accumulator tiles (tmm0-3), two A tiles (tmm4-5) and
//! two B tiles (tmm6-7); K is padded with zeros to a multiple of 32, M and N to 32.
//!
//! Fused elementwise work ([`crate::epilogue`]): a forward GEMM applies its [`Epilogue`]
//! (bias, bias + ReLU) to each 32×32 block of C right after the tiles store it, while it is in
//! L1; a dW GEMM ([`gemm_grad`]) applies the ReLU mask to dY and sums the bias gradient in the
//! same pass that packs dY into B tiles.
//!
//! The packers (A, B, and dY with its prologue) need only AVX-512 BF16, not AMX: `crate::dpbf16`
//! (the bf16 GEMM on `VDPBF16PS` for CPUs without tiles) reads the same packed layouts.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::OnceLock;

use rayon::prelude::*;

use crate::epilogue::{bias_act_row_from, Epilogue};

/// bf16 values per tile row (64 bytes).
pub(crate) const TK: usize = 32;
/// Rows (and f32 columns) of a tile.
pub(crate) const TM: usize = 16;
/// u16 entries of one tile.
pub(crate) const TILE: usize = TM * TK;
/// C rows and columns of one kernel block (2 × 2 tiles).
pub(crate) const BLOCK: usize = 32;

/// Whether this process may run AMX-BF16 tile instructions: the CPU has AMX-TILE and
/// AMX-BF16 and AVX-512 BF16 (the packing), and Linux granted the tile data state
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, once per process; the answer is cached like the
/// standard library's CPU feature detection).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(detect)
}

fn detect() -> bool {
    if !(is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512bf16"))
    {
        return false;
    }
    let leaf7 = __cpuid_count(7, 0);
    let amx_bf16 = leaf7.edx & (1 << 22) != 0;
    let amx_tile = leaf7.edx & (1 << 24) != 0;
    if !(amx_bf16 && amx_tile) {
        return false;
    }
    request_tile_permission()
}

#[cfg(target_os = "linux")]
fn request_tile_permission() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) only asks the kernel to allow (and
    // size signal frames for) the AMX tile state in this process; it touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_permission() -> bool {
    false
}

/// One operand: element (r, c) at `ptr[r * rs + c * cs]`.
#[derive(Clone, Copy)]
pub struct Operand<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
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
    assert!(available(), "amx::gemm needs AMX-BF16");
    // SAFETY: `available()` checked AMX-BF16 and AVX-512F/BW/BF16.
    unsafe { gemm_on(TILES, c, ldc, a, b, dims, accumulate, epilogue, threads) }
}

/// dY, the B operand of a dW GEMM ([`gemm_grad`]), and what its packing does on the way:
/// `dy` is k×n row-major (row stride `ld`); with `relu_out` (the forward's ReLU output, the same
/// layout) every element where `relu_out <= 0` (or NaN) becomes 0 in `dy` itself; then `db[j]
/// += dy[r, j]` for every row r in order (the bias gradient).
pub struct GradB<'a> {
    pub dy: &'a mut [f32],
    pub ld: usize,
    pub relu_out: Option<&'a [f32]>,
    pub db: &'a mut [f32],
}

/// `C (+)= A dY` after dY's prologue ([`GradB`]: the ReLU mask written back into dY, the bias
/// gradient summed), both done while dY is packed into tiles. Otherwise as [`gemm`]
/// (no epilogue). The values equal [`crate::epilogue::mask_and_bias_grad`] followed by [`gemm`]
/// bit for bit.
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
    assert!(available(), "amx::gemm_grad needs AMX-BF16");
    // SAFETY: `available()` checked AMX-BF16 and AVX-512F/BW/BF16.
    unsafe { gemm_grad_on(TILES, c, ldc, a, b, dims, accumulate, threads) }
}

/// The rows of C from 32-row block `first` on one thread, given this thread's buffer for A's
/// packing and the packed B: the part of a bf16 GEMM a kernel supplies ([`gemm_on`]).
pub(crate) type BlockRows = fn(
    &mut [u16],
    &mut [f32],
    usize,
    usize,
    Operand<'_>,
    &[u16],
    (usize, usize, usize),
    bool,
    Epilogue<'_>,
);

/// A bf16 kernel on the packers of this module: its name (in panics) and its rows of C.
#[derive(Clone, Copy)]
pub(crate) struct Kernel {
    pub name: &'static str,
    pub block_rows: BlockRows,
}

/// The AMX tiles' kernel.
const TILES: Kernel = Kernel {
    name: "amx",
    block_rows,
};

/// [`gemm`] on `kernel`: checks the bias, packs B once, then the blocks of C.
///
/// # Safety
/// AVX-512F/BW/BF16 are available, and whatever `kernel` runs on.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_on(
    kernel: Kernel,
    c: &mut [f32],
    ldc: usize,
    a: Operand<'_>,
    b: Operand<'_>,
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
    epilogue: Epilogue<'_>,
    threads: usize,
) {
    let who = kernel.name;
    if let Some((bias, _)) = epilogue.parts() {
        assert!(bias.len() >= n, "{who}: bias shorter than C's {n} columns");
    }
    if m == 0 || n == 0 {
        return;
    }
    let kb = k.div_ceil(TK);
    let nb = n.div_ceil(BLOCK) * 2;
    with_scratch(&PACKED_B, nb * kb * TILE, |packed_b| {
        // SAFETY: AVX-512F/BW/BF16 are available (this function's contract); the packer stays
        // inside `b`'s extent (k×n through its strides, the caller's check) and `packed_b`
        // (nb × kb tiles).
        unsafe { pack_b(packed_b, b, k, n, kb) };
        blocks_of_c(
            kernel,
            c,
            ldc,
            a,
            packed_b,
            (m, k, n),
            accumulate,
            epilogue,
            threads,
        );
    });
}

/// [`gemm_grad`] on `kernel`: checks dY, `relu_out` and `db`, packs dY (masking it and summing
/// the bias gradient), then the blocks of C.
///
/// # Safety
/// AVX-512F/BW/BF16 are available, and whatever `kernel` runs on.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_grad_on(
    kernel: Kernel,
    c: &mut [f32],
    ldc: usize,
    a: Operand<'_>,
    b: GradB<'_>,
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
    threads: usize,
) {
    let who = kernel.name;
    let need = if k == 0 || n == 0 {
        0
    } else {
        (k - 1) * b.ld + n
    };
    assert!(
        b.ld >= n && b.dy.len() >= need,
        "{who}: dY smaller than {k}x{n}"
    );
    assert!(
        b.relu_out.is_none_or(|y| y.len() >= need),
        "{who}: relu_out smaller than dY"
    );
    assert!(b.db.len() >= n, "{who}: db shorter than dY's {n} columns");
    if n == 0 {
        return;
    }
    let kb = k.div_ceil(TK);
    let nb = n.div_ceil(BLOCK) * 2;
    with_scratch(&PACKED_B, nb * kb * TILE, |packed_b| {
        // SAFETY: AVX-512F/BW/BF16 are available (this function's contract); the extents of
        // dY, relu_out and db are asserted above; `packed_b` holds nb × kb tiles.
        unsafe { pack_b_grad(packed_b, b, k, n, kb) };
        if m > 0 {
            blocks_of_c(
                kernel,
                c,
                ldc,
                a,
                packed_b,
                (m, k, n),
                accumulate,
                Epilogue::None,
                threads,
            );
        }
    });
}

thread_local! {
    /// Packed operands, kept per thread between GEMMs: a training step runs the same shapes
    /// every time, and fresh buffers cost page faults (the memory is written whole before use).
    static PACKED_B: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
    static PACKED_A: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's buffer `cell`, at least `len` long (a fresh one if it is in use).
fn with_scratch<R>(
    cell: &'static std::thread::LocalKey<RefCell<Vec<u16>>>,
    len: usize,
    f: impl FnOnce(&mut [u16]) -> R,
) -> R {
    cell.with(|c| match c.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < len {
                buf.resize(len, 0);
            }
            f(&mut buf[..len])
        }
        Err(_) => f(&mut vec![0u16; len]),
    })
}

/// The blocks of C from the packed B (all of it) and A (packed per 32 rows on each thread).
#[allow(clippy::too_many_arguments)]
fn blocks_of_c(
    kernel: Kernel,
    c: &mut [f32],
    ldc: usize,
    a: Operand<'_>,
    packed_b: &[u16],
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
    epilogue: Epilogue<'_>,
    threads: usize,
) {
    let kb = k.div_ceil(TK);
    let run = |first: usize, c_rows: &mut [f32]| {
        with_scratch(&PACKED_A, kb * 2 * TILE, |packed_a| {
            (kernel.block_rows)(
                packed_a,
                c_rows,
                first,
                ldc,
                a,
                packed_b,
                (m, k, n),
                accumulate,
                epilogue,
            )
        })
    };
    let c_len = (m - 1) * ldc + n;
    assert!(c.len() >= c_len, "{}: C smaller than {m}x{n}", kernel.name);
    let c = &mut c[..c_len];
    let blocks = m.div_ceil(BLOCK);
    if threads <= 1 || blocks < 2 {
        run(0, c);
    } else {
        let per = blocks.div_ceil(threads);
        c.par_chunks_mut(per * BLOCK * ldc)
            .enumerate()
            .for_each(|(i, part)| run(i * per, part));
    }
}

/// The rows of C in `c_rows` (block rows from `first`), on this thread.
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
    let nb = n.div_ceil(BLOCK) * 2;
    let epi = epilogue.parts();
    // Blocks go through a compact 32×32 buffer (L1-resident: C's rows lie `ldc` apart and
    // share few L1 sets) when they are partial or have an epilogue; two buffers, so a block
    // is written out one kernel call after its tiles were stored (vector loads right behind
    // tile stores of the same lines stall).
    let mut outs = [[0f32; BLOCK * BLOCK]; 2];
    let mut slot = 0;
    // The block in `outs[.0]` still to write: offset in `c_rows`, rows, first column,
    // columns, whether C's values are still to be added.
    let mut pending: Option<(usize, Pending)> = None;
    let write = |c_rows: &mut [f32], out: &[f32; BLOCK * BLOCK], p: Pending| {
        // SAFETY: AVX-512F is available (`gemm` checked); the block is sliced out of `c_rows`.
        unsafe { write_block(out, c_rows, ldc, p, epi) };
    };
    // SAFETY: AMX-BF16 is available and permitted (`gemm` checked); the tile config is set on
    // this thread before any tile instruction and released after.
    unsafe { configure_tiles() };
    let rows_here = c_rows.len().div_ceil(ldc).min(m - first * BLOCK);
    for blk in 0..rows_here.div_ceil(BLOCK) {
        let r0 = (first + blk) * BLOCK;
        let rows = (m - r0).min(BLOCK);
        // SAFETY: as for `pack_b`: rows r0..r0+rows of `a` (m×k) exist.
        unsafe { pack_a(packed_a, a, r0, rows, k, kb) };
        for j in 0..nb / 2 {
            let c0 = j * BLOCK;
            let cols = (n - c0).min(BLOCK);
            let b_tiles = &packed_b[(2 * j) * kb * TILE..(2 * j + 2) * kb * TILE];
            let base = blk * BLOCK * ldc + c0;
            let whole = rows == BLOCK && cols == BLOCK;
            if whole {
                let last = base + (BLOCK - 1) * ldc + BLOCK;
                assert!(last <= c_rows.len(), "amx: C block out of range");
            }
            // A whole block accumulates by loading C into the tiles.
            let load = (whole && accumulate).then(|| {
                // SAFETY: 32 rows × 32 f32 at `base` (row stride `ldc`) lie in `c_rows`
                // (asserted above).
                unsafe { c_rows.as_ptr().add(base) }
            });
            if whole && epi.is_none() {
                // The tiles store C in place.
                // SAFETY: `packed_a` holds kb × 2 tiles and `b_tiles` 2 × kb tiles (64-byte
                // rows); the 32 rows × 32 f32 at `base` with row stride `ldc` lie inside
                // `c_rows` (asserted); the tiles are configured on this thread.
                unsafe {
                    let dst = c_rows.as_mut_ptr().add(base);
                    kernel(packed_a, b_tiles, kb, load.map(|l| (l, ldc)), dst, ldc);
                }
                continue;
            }
            // SAFETY: as above, storing into `outs[slot]` (32 × 32 f32, row stride 32).
            unsafe {
                let dst = outs[slot].as_mut_ptr();
                kernel(packed_a, b_tiles, kb, load.map(|l| (l, ldc)), dst, BLOCK);
            }
            let this = Pending {
                base,
                rows,
                c0,
                cols,
                add_c: accumulate && !whole,
            };
            if let Some((s, p)) = pending.replace((slot, this)) {
                write(c_rows, &outs[s], p);
            }
            slot ^= 1;
        }
    }
    if let Some((s, p)) = pending.take() {
        write(c_rows, &outs[s], p);
    }
    // SAFETY: releases this thread's tile state (configured above).
    unsafe { asm!("tilerelease") };
}

/// A block of C waiting in a buffer: its offset in the caller's rows, its rows, its first
/// column and columns, and whether C's values are still to be added.
#[derive(Clone, Copy)]
struct Pending {
    base: usize,
    rows: usize,
    c0: usize,
    cols: usize,
    add_c: bool,
}

/// Writes a finished block from `out` (row stride 32) into C: `C (+)= out`, then the
/// epilogue, in one sweep (the same per-element operations as the standalone pass, in
/// AVX-512 registers).
///
/// # Safety
/// AVX-512F present.
#[target_feature(enable = "avx512f")]
unsafe fn write_block(
    out: &[f32; BLOCK * BLOCK],
    c: &mut [f32],
    ldc: usize,
    p: Pending,
    epi: Option<(&[f32], bool)>,
) {
    for r in 0..p.rows {
        let dst = &mut c[p.base + r * ldc..][..p.cols];
        let src = &out[r * BLOCK..r * BLOCK + p.cols];
        match epi {
            Some((bias, relu)) => {
                bias_act_row_from(dst, src, p.add_c, &bias[p.c0..p.c0 + p.cols], relu);
            }
            None if p.add_c => dst.iter_mut().zip(src).for_each(|(d, s)| *d += s),
            None => dst.copy_from_slice(src),
        }
    }
}

#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// Sets tmm0-7 to 16 rows × 64 bytes on this thread.
///
/// # Safety
/// The CPU must have AMX-TILE and the process the tile permission ([`available`]).
unsafe fn configure_tiles() {
    let mut cfg = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [0; 16],
        rows: [0; 16],
    };
    for t in 0..8 {
        cfg.colsb[t] = 64;
        cfg.rows[t] = TM as u8;
    }
    // SAFETY: `cfg` is a valid 64-byte palette-1 configuration (caller: AMX available).
    unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly)) };
}

/// One 32×32 block of C: `out` = (`load` or 0) + Σ over kb of A tiles (2 per kb,
/// [kb][2][16][32]) × B tiles (two columns of kb tiles each: [2][kb][16][32]). `out` is
/// row-major with row stride `ld` f32; `load` (a block and its row stride) holds the starting
/// sums (it may be `out` itself).
///
/// # Safety
/// Tiles configured on this thread by [`configure_tiles`]; `a` ≥ kb·2 tiles, `b` ≥ 2·kb tiles;
/// 32 rows of 32 f32 at `out` with stride `ld` writable, and at `load` readable.
unsafe fn kernel(
    a: &[u16],
    b: &[u16],
    kb: usize,
    load: Option<(*const f32, usize)>,
    out: *mut f32,
    ld: usize,
) {
    debug_assert!(a.len() >= kb * 2 * TILE && b.len() >= 2 * kb * TILE);
    let stride = 64usize;
    let (pa, pb0) = (a.as_ptr(), b.as_ptr());
    let cs = ld * 4;
    // SAFETY: (caller) tiles configured; every tile load reads 16 rows of 64 bytes inside `a`
    // or `b` (bounds above); the C tiles are 16 rows × 64 bytes at stride `cs` inside the
    // caller's 32×32 block (and at the load stride inside `load`'s).
    unsafe {
        let (o0, o1) = (out, out.add(TM));
        let (o2, o3) = (out.add(TM * ld), out.add(TM * ld + TM));
        let pb1 = pb0.add(kb * TILE);
        if let Some((src, lds)) = load {
            asm!(
                "tileloadd tmm0, [{o0} + {s} * 1]",
                "tileloadd tmm1, [{o1} + {s} * 1]",
                "tileloadd tmm2, [{o2} + {s} * 1]",
                "tileloadd tmm3, [{o3} + {s} * 1]",
                o0 = in(reg) src,
                o1 = in(reg) src.add(TM),
                o2 = in(reg) src.add(TM * lds),
                o3 = in(reg) src.add(TM * lds + TM),
                s = in(reg) lds * 4,
                options(nostack, readonly)
            );
        } else {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
        }
        for p in 0..kb {
            let a0 = pa.add(p * 2 * TILE);
            let a1 = a0.add(TILE);
            let b0 = pb0.add(p * TILE);
            let b1 = pb1.add(p * TILE);
            asm!(
                "tileloadd tmm4, [{a0} + {s} * 1]",
                "tileloadd tmm6, [{b0} + {s} * 1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{b1} + {s} * 1]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{a1} + {s} * 1]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a0,
                a1 = in(reg) a1,
                b0 = in(reg) b0,
                b1 = in(reg) b1,
                s = in(reg) stride,
                options(nostack, readonly)
            );
        }
        asm!(
            "tilestored [{o0} + {s} * 1], tmm0",
            "tilestored [{o1} + {s} * 1], tmm1",
            "tilestored [{o2} + {s} * 1], tmm2",
            "tilestored [{o3} + {s} * 1], tmm3",
            o0 = in(reg) o0,
            o1 = in(reg) o1,
            o2 = in(reg) o2,
            o3 = in(reg) o3,
            s = in(reg) cs,
            options(nostack)
        );
    }
}

/// Mask of the first `w` (≤ 16) lanes.
pub(crate) fn lanes(w: usize) -> __mmask16 {
    if w >= 16 {
        0xFFFF
    } else {
        ((1u32 << w) - 1) as __mmask16
    }
}

/// Loads `w` (≤ 16) f32 at `p` with stride `step` (1: contiguous), zeros elsewhere.
///
/// # Safety
/// Elements `p[i * step]` for i < w must be readable.
#[target_feature(enable = "avx512f")]
unsafe fn load16(p: *const f32, step: usize, w: usize) -> __m512 {
    // SAFETY: (caller) the first `w` elements exist; masked-off lanes are not read.
    unsafe {
        if step == 1 {
            _mm512_maskz_loadu_ps(lanes(w), p)
        } else {
            let idx = _mm512_mullo_epi32(
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm512_set1_epi32(step as i32),
            );
            if step <= i32::MAX as usize / 16 {
                _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), lanes(w), idx, p)
            } else {
                let mut v = [0f32; 16];
                for (i, x) in v.iter_mut().enumerate().take(w) {
                    *x = *p.add(i * step);
                }
                _mm512_loadu_ps(v.as_ptr())
            }
        }
    }
}

/// Rounds 16 + 16 f32 to 32 bf16 (nearest even) and interleaves them:
/// [lo0, hi0, lo1, hi1, ...] (16 pairs, one per 32-bit lane).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
fn pairs(lo: __m512, hi: __m512) -> __m512i {
    // cvtne2ps(a, b): bf16 of b in lanes 0-15, of a in lanes 16-31.
    let both = bf16_bits(_mm512_cvtne2ps_pbh(hi, lo));
    const IDX: [u16; 32] = [
        0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26, 11, 27, 12,
        28, 13, 29, 14, 30, 15, 31,
    ];
    // SAFETY: IDX is 64 readable bytes.
    let idx = unsafe { _mm512_loadu_si512(IDX.as_ptr().cast()) };
    _mm512_permutexvar_epi16(idx, both)
}

/// The raw bits of a bf16 vector.
#[target_feature(enable = "avx512f,avx512bf16")]
fn bf16_bits(v: __m512bh) -> __m512i {
    // SAFETY: both are 512-bit plain-data vectors; this reinterprets the bits.
    unsafe { std::mem::transmute::<__m512bh, __m512i>(v) }
}

/// Transposes 16 vectors of 16 32-bit lanes in place (rows ↔ lanes).
#[target_feature(enable = "avx512f")]
fn transpose16(r: &mut [__m512i; 16]) {
    let mut t = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for i in 0..4 {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    // r[4i + j] now holds, in each 128-bit lane L, rows 4i..4i+4 at column 4L + j.
    for i in 0..2 {
        for j in 0..4 {
            let (x, y) = (r[8 * i + j], r[8 * i + 4 + j]);
            t[8 * i + j] = _mm512_shuffle_i32x4::<0x88>(x, y);
            t[8 * i + 4 + j] = _mm512_shuffle_i32x4::<0xDD>(x, y);
        }
    }
    for j in 0..4 {
        for h in 0..2 {
            let (x, y) = (t[4 * h + j], t[8 + 4 * h + j]);
            r[j + 4 * h] = _mm512_shuffle_i32x4::<0x88>(x, y);
            r[j + 8 + 4 * h] = _mm512_shuffle_i32x4::<0xDD>(x, y);
        }
    }
}

/// Packs rows r0..r0+rows (≤ 32) of A (m×k) into kb × 2 A tiles ([kb][half][16][32] bf16),
/// zero-padded.
///
/// # Safety
/// AVX-512F/BW/BF16 present; rows r0..r0+rows and columns 0..k of `a` inside its slice.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(crate) unsafe fn pack_a(
    out: &mut [u16],
    a: Operand<'_>,
    r0: usize,
    rows: usize,
    k: usize,
    kb: usize,
) {
    let base = a.data.as_ptr();
    // SAFETY: (caller) every element read (row < r0 + rows, column < k) lies in `a.data`;
    // stores stay inside `out` (kb × 2 tiles).
    unsafe {
        if a.cs == 1 || a.rs != 1 {
            // Rows of A (K along `cs`): each tile row is 32 consecutive K of one row.
            for p in 0..kb {
                let k0 = p * TK;
                let w = (k - k0).min(TK);
                for r in 0..BLOCK {
                    let dst = out
                        .as_mut_ptr()
                        .add((p * 2 + r / TM) * TILE + (r % TM) * TK);
                    if r >= rows {
                        _mm512_storeu_si512(dst.cast(), _mm512_setzero_si512());
                        continue;
                    }
                    let src = base.add((r0 + r) * a.rs + k0 * a.cs);
                    let lo = load16(src, a.cs, w.min(16));
                    let hi = if w > 16 {
                        load16(src.add(16 * a.cs), a.cs, w - 16)
                    } else {
                        _mm512_setzero_ps()
                    };
                    let v = bf16_bits(_mm512_cvtne2ps_pbh(hi, lo));
                    _mm512_storeu_si512(dst.cast(), v);
                }
            }
        } else {
            // A stored transposed (column r of A contiguous along K rows): pairs of K rows
            // give 16 (k, k+1) pairs per vector over 16 A rows; transposing 16 such vectors
            // gives 16 tile rows of 16 pairs.
            for p in 0..kb {
                let k0 = p * TK;
                for half in 0..2 {
                    let m0 = half * TM;
                    let w = rows.saturating_sub(m0).min(TM);
                    let mut v = [_mm512_setzero_si512(); 16];
                    if w > 0 {
                        for (q, vq) in v.iter_mut().enumerate() {
                            let kk = k0 + 2 * q;
                            if kk >= k {
                                break;
                            }
                            let lo = load16(base.add(kk * a.cs + (r0 + m0) * a.rs), 1, w);
                            let hi = if kk + 1 < k {
                                load16(base.add((kk + 1) * a.cs + (r0 + m0) * a.rs), 1, w)
                            } else {
                                _mm512_setzero_ps()
                            };
                            *vq = pairs(lo, hi);
                        }
                        transpose16(&mut v);
                    }
                    let dst = out.as_mut_ptr().add((p * 2 + half) * TILE);
                    for (r, vr) in v.iter().enumerate() {
                        _mm512_storeu_si512(dst.add(r * TK).cast(), *vr);
                    }
                }
            }
        }
    }
}

/// Packs B (k×n) into nb × kb B tiles ([nb][kb][16 pairs][16 cols][2] bf16), zero-padded.
///
/// # Safety
/// AVX-512F/BW/BF16 present; rows 0..k and columns 0..n of `b` inside its slice.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pack_b(out: &mut [u16], b: Operand<'_>, k: usize, n: usize, kb: usize) {
    let base = b.data.as_ptr();
    let nb = out.len() / (kb * TILE);
    // SAFETY: (caller) reads stay inside k×n of `b`; writes inside `out` (nb × kb tiles).
    unsafe {
        for j in 0..nb {
            let c0 = j * TM;
            let w = n.saturating_sub(c0).min(TM);
            for p in 0..kb {
                let dst = out.as_mut_ptr().add((j * kb + p) * TILE);
                let k0 = p * TK;
                let mut v = [_mm512_setzero_si512(); 16];
                if w > 0 && (b.cs == 1 || b.rs != 1) {
                    // Rows of B contiguous along N: interleave rows 2q and 2q + 1.
                    for (q, vq) in v.iter_mut().enumerate() {
                        let kk = k0 + 2 * q;
                        if kk >= k {
                            break;
                        }
                        let lo = load16(base.add(kk * b.rs + c0 * b.cs), b.cs, w);
                        let hi = if kk + 1 < k {
                            load16(base.add((kk + 1) * b.rs + c0 * b.cs), b.cs, w)
                        } else {
                            _mm512_setzero_ps()
                        };
                        *vq = pairs(lo, hi);
                    }
                } else if w > 0 {
                    // B stored transposed (column c contiguous along K): column c gives the
                    // 16 pairs of tile column c; transposing 16 columns gives the tile rows.
                    let kw = (k - k0).min(TK);
                    for (c, vc) in v.iter_mut().enumerate().take(w) {
                        let src = base.add((c0 + c) * b.cs + k0);
                        let lo = load16(src, 1, kw.min(16));
                        let hi = if kw > 16 {
                            load16(src.add(16), 1, kw - 16)
                        } else {
                            _mm512_setzero_ps()
                        };
                        *vc = bf16_bits(_mm512_cvtne2ps_pbh(hi, lo));
                    }
                    transpose16(&mut v);
                }
                for (q, vq) in v.iter().enumerate() {
                    _mm512_storeu_si512(dst.add(q * TK).cast(), *vq);
                }
            }
        }
    }
}

/// [`pack_b`] of dY (plain rows) with its prologue ([`GradB`]): each 16-column strip of dY is
/// read once, masked by `relu_out > 0` (written back into dY), summed into `db` row by row in
/// order (as the standalone pass sums), and packed.
///
/// # Safety
/// AVX-512F/BW/BF16 present; dY (and `relu_out`) hold k rows of n at stride `ld`; `db` ≥ n.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pack_b_grad(out: &mut [u16], b: GradB<'_>, k: usize, n: usize, kb: usize) {
    let GradB {
        dy,
        ld,
        relu_out,
        db,
    } = b;
    let base = dy.as_mut_ptr();
    let nb = out.len() / (kb * TILE);
    let zero = _mm512_setzero_ps();
    // SAFETY: (caller) reads and writes stay inside k×n of dY (`relu_out`) at stride `ld`, and
    // n of `db`; `dy` is exclusively borrowed through `b` (`base` is its pointer); writes of
    // `out` stay inside its nb × kb tiles.
    unsafe {
        // One dY row's 16 columns from c0 (w of them), masked (and written back), added to `sum`.
        let row = |r: usize, c0: usize, w: usize, sum: &mut __m512| -> __m512 {
            let mask = lanes(w);
            let p = base.add(r * ld + c0);
            let mut g = _mm512_maskz_loadu_ps(mask, p);
            if let Some(y) = relu_out {
                let o = _mm512_maskz_loadu_ps(mask, y.as_ptr().add(r * ld + c0));
                let keep = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(o, zero);
                g = _mm512_maskz_mov_ps(keep, g);
                _mm512_mask_storeu_ps(p, mask, g);
            }
            *sum = _mm512_add_ps(*sum, g);
            g
        };
        // 32 rows of dY at a time, all strips: dY and relu_out are read row after row, as
        // they lie in memory; each strip's sums continue in `db` from one block to the next.
        for p in 0..kb {
            let k0 = p * TK;
            for j in 0..nb {
                let c0 = j * TM;
                let w = n.saturating_sub(c0).min(TM);
                let dst = out.as_mut_ptr().add((j * kb + p) * TILE);
                let mut v = [_mm512_setzero_si512(); 16];
                if w > 0 {
                    let mut sum = _mm512_maskz_loadu_ps(lanes(w), db.as_ptr().add(c0));
                    for (q, vq) in v.iter_mut().enumerate() {
                        let kk = k0 + 2 * q;
                        if kk >= k {
                            break;
                        }
                        let lo = row(kk, c0, w, &mut sum);
                        let hi = if kk + 1 < k {
                            row(kk + 1, c0, w, &mut sum)
                        } else {
                            zero
                        };
                        *vq = pairs(lo, hi);
                    }
                    _mm512_mask_storeu_ps(db.as_mut_ptr().add(c0), lanes(w), sum);
                }
                for (q, vq) in v.iter().enumerate() {
                    _mm512_storeu_si512(dst.add(q * TK).cast(), *vq);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm_ops::round_bf16;

    /// Reference: A and B rounded to bf16, products summed in f64.
    fn reference(a: Operand<'_>, b: Operand<'_>, (m, k, n): (usize, usize, usize)) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f64;
                for p in 0..k {
                    let x = round_bf16(a.data[i * a.rs + p * a.cs]) as f64;
                    let y = round_bf16(b.data[p * b.rs + j * b.cs]) as f64;
                    s += x * y;
                }
                c[i * n + j] = s as f32;
            }
        }
        c
    }

    fn values(len: usize, seed: u64) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let h = sparta_mix::mix64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                (h >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    fn check(m: usize, k: usize, n: usize, a_t: bool, b_t: bool, threads: usize) {
        let av = values(m * k, 1);
        let bv = values(k * n, 2);
        let a = if a_t {
            Operand {
                data: &av,
                rs: 1,
                cs: m,
            }
        } else {
            Operand {
                data: &av,
                rs: k,
                cs: 1,
            }
        };
        let b = if b_t {
            Operand {
                data: &bv,
                rs: 1,
                cs: k,
            }
        } else {
            Operand {
                data: &bv,
                rs: n,
                cs: 1,
            }
        };
        let want = reference(a, b, (m, k, n));
        let ldc = n + 3;
        let mut c = vec![7.0f32; m * ldc];
        gemm(&mut c, ldc, a, b, (m, k, n), false, Epilogue::None, threads);
        let mut c2 = c.clone();
        gemm(&mut c2, ldc, a, b, (m, k, n), true, Epilogue::None, threads);
        for i in 0..m {
            for j in 0..n {
                let (got, w) = (c[i * ldc + j], want[i * n + j]);
                // Only the f32 accumulation order differs from the reference.
                let tol = 1e-5 * (k as f32).sqrt() + 1e-5 * w.abs();
                assert!(
                    (got - w).abs() <= tol,
                    "({i},{j}) of {m}x{k}x{n} a_t={a_t} b_t={b_t}: {got} vs {w}"
                );
                assert!((c2[i * ldc + j] - 2.0 * w).abs() <= 2.0 * tol);
            }
            // The padding columns of C are untouched.
            for j in n..ldc {
                if i + 1 < m {
                    assert_eq!(c[i * ldc + j], 7.0);
                }
            }
        }
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// The fused forward (epilogue on each block of C in the kernel) equals the plain tile GEMM
    /// followed by the standalone pass, bit for bit, for every layout, epilogue and edge.
    fn check_fused_forward(m: usize, k: usize, n: usize, a_t: bool, threads: usize) {
        use crate::epilogue::bias_act;
        let av = values(m * k, 1);
        let bv = values(k * n, 2);
        let bias = values(n, 3);
        let a = if a_t {
            Operand {
                data: &av,
                rs: 1,
                cs: m,
            }
        } else {
            Operand {
                data: &av,
                rs: k,
                cs: 1,
            }
        };
        let b = Operand {
            data: &bv,
            rs: n,
            cs: 1,
        };
        for relu in [false, true] {
            for accumulate in [false, true] {
                let start = values(m * n, 4);
                let mut want = start.clone();
                gemm(
                    &mut want,
                    n,
                    a,
                    b,
                    (m, k, n),
                    accumulate,
                    Epilogue::None,
                    threads,
                );
                bias_act(&mut want, &bias, relu, 1);
                let mut got = start.clone();
                let epi = Epilogue::bias(&bias, relu);
                gemm(&mut got, n, a, b, (m, k, n), accumulate, epi, threads);
                assert!(
                    same_bits(&got, &want),
                    "{m}x{k}x{n} a_t={a_t} relu={relu} accumulate={accumulate}"
                );
                if relu {
                    assert!(got.iter().all(|&v| v >= 0.0));
                    assert!(m * n < 8 || got.contains(&0.0), "the ReLU clips something");
                }
            }
        }
    }

    /// The fused dW (ReLU mask and bias gradient while dY is packed) equals the standalone
    /// pass followed by the plain tile GEMM, bit for bit: C, the masked dY and db.
    fn check_fused_grad(m: usize, k: usize, n: usize, threads: usize) {
        use crate::epilogue::mask_and_bias_grad;
        let xv = values(k * m, 5);
        let a = Operand {
            data: &xv,
            rs: 1,
            cs: m,
        };
        let y = values(k * n, 6);
        for relu in [false, true] {
            let relu_out = relu.then_some(&y[..]);
            let (mut dy_w, mut db_w) = (values(k * n, 7), values(n, 8));
            let mut c_w = values(m * n, 9);
            mask_and_bias_grad(&mut dy_w, relu_out, &mut db_w, 1);
            let b = Operand {
                data: &dy_w,
                rs: n,
                cs: 1,
            };
            gemm(&mut c_w, n, a, b, (m, k, n), true, Epilogue::None, threads);
            let (mut dy, mut db) = (values(k * n, 7), values(n, 8));
            let mut c = values(m * n, 9);
            let gb = GradB {
                dy: &mut dy,
                ld: n,
                relu_out,
                db: &mut db,
            };
            gemm_grad(&mut c, n, a, gb, (m, k, n), true, threads);
            assert!(same_bits(&dy, &dy_w), "dY {m}x{k}x{n} relu={relu}");
            assert!(same_bits(&db, &db_w), "db {m}x{k}x{n} relu={relu}");
            assert!(same_bits(&c, &c_w), "C {m}x{k}x{n} relu={relu}");
            if relu && k * n >= 8 {
                assert!(dy.contains(&0.0), "the mask zeroes something");
            }
        }
    }

    #[test]
    #[ignore = "needs a CPU with AMX-BF16 (Sapphire Rapids or later): .ci/run runs it with \
                --ignored on its machine; gemm_ops' fused tests run everywhere"]
    fn fused_epilogues_match_the_unfused_passes_bit_for_bit() {
        assert!(available(), "this CPU (or kernel) offers no AMX-BF16");
        for &(m, k, n) in &[
            (1, 1, 1),
            (32, 32, 32),
            (33, 65, 17),
            (100, 429, 70),
            (64, 7, 130),
            (5, 300, 3),
            (2048, 128, 1),
        ] {
            for a_t in [false, true] {
                check_fused_forward(m, k, n, a_t, 1);
            }
            check_fused_grad(m, k, n, 1);
            check_fused_grad(n, k, m, 1);
        }
        check_fused_forward(200, 96, 64, false, 2);
        check_fused_grad(96, 200, 64, 3);
    }

    #[test]
    #[ignore = "needs a CPU with AMX-BF16 (Sapphire Rapids or later): .ci/run runs it with \
                --ignored on its machine; gemm_ops' bf16 tests run everywhere"]
    fn every_layout_and_edge_matches_the_bf16_reference() {
        assert!(available(), "this CPU (or kernel) offers no AMX-BF16");
        for &(m, k, n) in &[
            (1, 1, 1),
            (16, 32, 16),
            (33, 65, 17),
            (100, 429, 70),
            (64, 7, 130),
            (5, 300, 3),
        ] {
            for a_t in [false, true] {
                for b_t in [false, true] {
                    check(m, k, n, a_t, b_t, 1);
                }
            }
        }
        check(200, 96, 64, false, false, 2);
        check(200, 96, 64, true, true, 3);
    }
}
