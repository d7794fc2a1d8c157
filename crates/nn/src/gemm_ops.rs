//! Safe, bounds-checked wrappers over `gemm::gemm` for row-major f32 matrices.
//!
//! Transposed operands are expressed through strides, never materialized:
//! `dW = X^T dY` is [`matmul_tn`] and `dX = dY W^T` is [`matmul_nt`].

pub use gemm::Parallelism;

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
    par: Parallelism,
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
        Layout::Nn | Layout::Nt => (1, lda as isize),
        Layout::Tn => (lda as isize, 1),
    };
    let (rhs_cs, rhs_rs) = match layout {
        Layout::Nn | Layout::Tn => (1, ldb as isize),
        Layout::Nt => (ldb as isize, 1),
    };
    // SAFETY: the asserts above guarantee every element addressed by (m, n, k) and the strides
    // lies inside `c`, `a` and `b`; `c` is exclusively borrowed and cannot alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            ldc as isize,
            accumulate,
            a.as_ptr(),
            lhs_cs,
            lhs_rs,
            b.as_ptr(),
            rhs_cs,
            rhs_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
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
    par: Parallelism,
) {
    matmul(Layout::Nn, c, ldc, a, lda, b, ldb, mkn, accumulate, par)
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
    par: Parallelism,
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
    par: Parallelism,
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
        matmul_nn(&mut c, n, &a, k, &b, n, (m, k, n), false, Parallelism::None);
        assert!(c.iter().zip(&want).all(|(x, y)| (x - y).abs() < 1e-5));
        let at = transpose(&a, m, k);
        let mut c2 = vec![0.0; m * n];
        matmul_tn(
            &mut c2,
            n,
            &at,
            m,
            &b,
            n,
            (m, k, n),
            false,
            Parallelism::None,
        );
        assert!(c2.iter().zip(&want).all(|(x, y)| (x - y).abs() < 1e-5));
        let bt = transpose(&b, k, n);
        let mut c3 = vec![0.0; m * n];
        matmul_nt(
            &mut c3,
            n,
            &a,
            k,
            &bt,
            k,
            (m, k, n),
            false,
            Parallelism::None,
        );
        matmul_nt(
            &mut c3,
            n,
            &a,
            k,
            &bt,
            k,
            (m, k, n),
            true,
            Parallelism::None,
        );
        assert!(c3
            .iter()
            .zip(&want)
            .all(|(x, y)| (x - 2.0 * y).abs() < 1e-5));
    }
}
