//! Finite-difference gradient checks of every layer, and proof that the checker catches bugs.

mod common;

use common::{assert_ok, dot64, fd_check, pseudo};
use sparta_nn::gemm_ops::Compute;
use sparta_nn::layers::activation::{relu_backward, relu_forward};
use sparta_nn::layers::attention::{Attention, AttentionCache};
use sparta_nn::layers::cross::Cross;
use sparta_nn::layers::cross_v2::{CrossMatrix, CrossV2, CrossV2Cache, CrossV2Scratch};
use sparta_nn::layers::dot::DotInteraction;
use sparta_nn::layers::fm::{fm_backward, fm_forward};
use sparta_nn::layers::gate::{softmax_rows, softmax_rows_backward};
use sparta_nn::layers::linear::Linear;
use sparta_nn::layers::loss::{bce_forward_backward, bce_with_logits};

const P: Compute = Compute::SERIAL;

fn linear_case(relu: bool) -> (Linear, Vec<f32>, Vec<f32>, Vec<f32>, usize) {
    let (i, o, rows) = (5, 4, 3);
    let l = Linear {
        in_dim: i,
        out_dim: o,
        w: 0,
        b: i * o,
        relu,
    };
    let p = pseudo(i * o + o, 11);
    let x = pseudo(rows * i, 12);
    let c = pseudo(rows * o, 13);
    (l, p, x, c, rows)
}

/// Analytic (dW|db, dx) of sum(c * linear(x)).
fn linear_grads(l: &Linear, p: &[f32], x: &[f32], c: &[f32], rows: usize) -> (Vec<f32>, Vec<f32>) {
    let mut y = vec![0.0; rows * l.out_dim];
    l.forward(p, x, rows, &mut y, P);
    let mut dy = c.to_vec();
    let mut g = vec![0.0; p.len()];
    let mut dx = vec![0.0; rows * l.in_dim];
    l.backward(
        p,
        x,
        &y,
        &mut dy,
        rows,
        &mut g,
        Some((&mut dx, l.in_dim, l.in_dim)),
        P,
    );
    (g, dx)
}

fn linear_loss(l: &Linear, p: &[f32], x: &[f32], c: &[f32], rows: usize) -> f64 {
    let mut y = vec![0.0; rows * l.out_dim];
    l.forward(p, x, rows, &mut y, P);
    dot64(c, &y)
}

#[test]
fn linear_and_fused_relu_gradients() {
    for relu in [false, true] {
        let (l, p, x, c, rows) = linear_case(relu);
        let (g, dx) = linear_grads(&l, &p, &x, &c, rows);
        assert_ok(
            "linear params",
            fd_check(&g, &p, |pp| linear_loss(&l, pp, &x, &c, rows)),
        );
        assert_ok(
            "linear input",
            fd_check(&dx, &x, |xx| linear_loss(&l, &p, xx, &c, rows)),
        );
    }
}

#[test]
fn linear_partial_dx_columns_and_accumulation() {
    let (l, p, x, c, rows) = linear_case(false);
    let (g, dx) = linear_grads(&l, &p, &x, &c, rows);
    // dx restricted to the first 3 columns, written with a wider row stride.
    let mut y = vec![0.0; rows * l.out_dim];
    l.forward(&p, &x, rows, &mut y, P);
    let mut dy = c.clone();
    let mut g2 = g.clone(); // accumulates on top: expect 2x
    let mut dx2 = vec![7.0; rows * 6];
    l.backward(
        &p,
        &x,
        &y,
        &mut dy,
        rows,
        &mut g2,
        Some((&mut dx2, 6, 3)),
        P,
    );
    for (a, b) in g2.iter().zip(&g) {
        assert!((a - 2.0 * b).abs() < 1e-5);
    }
    for r in 0..rows {
        for j in 0..6 {
            let want = if j < 3 { dx[r * 5 + j] } else { 7.0 };
            assert!((dx2[r * 6 + j] - want).abs() < 1e-6);
        }
    }
}

#[test]
fn relu_gradients() {
    // keep inputs away from the kink
    let x: Vec<f32> = pseudo(20, 21)
        .iter()
        .map(|&v| if v.abs() < 0.05 { v + 0.1 } else { v })
        .collect();
    let c = pseudo(20, 22);
    let mut y = x.clone();
    relu_forward(&mut y);
    let mut dy = c.clone();
    relu_backward(&mut dy, &y);
    assert_ok(
        "relu",
        fd_check(&dy, &x, |xx| {
            let mut y = xx.to_vec();
            relu_forward(&mut y);
            dot64(&c, &y)
        }),
    );
}

#[test]
fn bce_loss_gradient() {
    let z: Vec<f32> = pseudo(8, 31).iter().map(|v| v * 4.0).collect();
    let y: Vec<f32> = pseudo(8, 32)
        .iter()
        .map(|&v| (v > 0.0) as u8 as f32)
        .collect();
    let mut dz = vec![0.0; 8];
    let scale = 1.0 / 8.0;
    let sum = bce_forward_backward(&z, &y, None, scale, &mut dz);
    let direct: f64 = z.iter().zip(&y).map(|(&a, &b)| bce_with_logits(a, b)).sum();
    assert!((sum - direct).abs() < 1e-12);
    // a large logit stays finite
    assert!(
        bce_with_logits(80.0, 0.0).is_finite() && (bce_with_logits(80.0, 0.0) - 80.0).abs() < 1e-9
    );
    assert_ok(
        "bce",
        fd_check(&dz, &z, |zz| {
            zz.iter()
                .zip(&y)
                .map(|(&a, &b)| bce_with_logits(a, b))
                .sum::<f64>()
                * scale as f64
        }),
    );
}

#[test]
fn weighted_bce_loss_gradient() {
    let z: Vec<f32> = pseudo(8, 33).iter().map(|v| v * 4.0).collect();
    let y: Vec<f32> = pseudo(8, 34)
        .iter()
        .map(|&v| (v > 0.0) as u8 as f32)
        .collect();
    let s: Vec<f32> = pseudo(8, 35).iter().map(|v| v + 1.0).collect();
    let scale = 1.0 / 8.0;
    let mut dz = vec![0.0; 8];
    let sum = bce_forward_backward(&z, &y, Some(&s), scale, &mut dz);
    let weighted = |zz: &[f32]| -> f64 {
        zz.iter()
            .zip(&y)
            .zip(&s)
            .map(|((&a, &b), &w)| w as f64 * bce_with_logits(a, b))
            .sum()
    };
    assert!((sum - weighted(&z)).abs() < 1e-12);
    assert_ok(
        "weighted bce",
        fd_check(&dz, &z, |zz| weighted(zz) * scale as f64),
    );
    // all-one weights give the unweighted bits
    let (mut d1, mut d0) = (vec![0.0; 8], vec![0.0; 8]);
    let a = bce_forward_backward(&z, &y, Some(&[1.0; 8]), scale, &mut d1);
    let b = bce_forward_backward(&z, &y, None, scale, &mut d0);
    assert_eq!(a.to_bits(), b.to_bits());
    assert_eq!(d1, d0);
}

#[test]
fn ctcvr_loss_gradient() {
    use sparta_nn::layers::loss::ctcvr_bce;
    for (i, y) in [0.0f32, 1.0].into_iter().enumerate() {
        let zs: Vec<f32> = pseudo(2 * 6, 36 + i as u64)
            .iter()
            .map(|v| v * 5.0)
            .collect();
        let total = |zz: &[f32]| -> f64 { zz.chunks(2).map(|p| ctcvr_bce(p[0], p[1], y).0).sum() };
        let grad: Vec<f32> = zs
            .chunks(2)
            .flat_map(|p| {
                let (_, a, b) = ctcvr_bce(p[0], p[1], y);
                [a as f32, b as f32]
            })
            .collect();
        assert_ok(&format!("ctcvr y={y}"), fd_check(&grad, &zs, total));
    }
}

#[test]
fn layer_norm_gradients_and_value() {
    use sparta_nn::layers::layer_norm::LayerNorm;
    let (rows, n) = (4, 6);
    let ln = LayerNorm {
        dim: n,
        gain: 0,
        bias: n,
    };
    let mut p = pseudo(2 * n, 51);
    for g in &mut p[..n] {
        *g += 1.0;
    }
    let x = pseudo(rows * n, 52);
    let c = pseudo(rows * n, 53);
    let fwd = |pp: &[f32], xx: &[f32]| -> Vec<f32> {
        let mut y = xx.to_vec();
        let (mut xh, mut rs) = (vec![0.0; rows * n], vec![0.0; rows]);
        ln.forward(pp, &mut y, rows, &mut xh, &mut rs);
        y
    };
    // with gain 1 and bias 0 every row comes out with mean 0 and variance ~1
    let mut unit = vec![1.0; n];
    unit.extend(vec![0.0; n]);
    for row in fwd(&unit, &x).chunks(n) {
        let mean = row.iter().sum::<f32>() / n as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
        assert!(
            mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-3,
            "{mean} {var}"
        );
    }
    let mut y = x.clone();
    let (mut xh, mut rs) = (vec![0.0; rows * n], vec![0.0; rows]);
    ln.forward(&p, &mut y, rows, &mut xh, &mut rs);
    let mut d = c.clone();
    let mut g = vec![0.0; p.len()];
    ln.backward(&p, &xh, &rs, &mut d, rows, &mut g);
    assert_ok(
        "layer norm params",
        fd_check(&g, &p, |pp| dot64(&c, &fwd(pp, &x))),
    );
    assert_ok(
        "layer norm input",
        fd_check(&d, &x, |xx| dot64(&c, &fwd(&p, xx))),
    );
}

#[test]
fn dropout_with_a_fixed_mask_gradient() {
    use sparta_nn::layers::dropout::{apply_mask, fill_mask, DropoutKey};
    let (rows, n) = (5, 8);
    let key = DropoutKey {
        seed: 1,
        step: 2,
        layer: 3,
    };
    let mut mask = vec![0.0; rows * n];
    fill_mask(&mut mask, n, 0, 0.4, &key);
    assert!(mask.contains(&0.0) && mask.iter().any(|&m| m > 1.0));
    let x = pseudo(rows * n, 61);
    let c = pseudo(rows * n, 62);
    let mut d = c.clone();
    apply_mask(&mut d, &mask);
    assert_ok(
        "dropout",
        fd_check(&d, &x, |xx| {
            let mut y = xx.to_vec();
            apply_mask(&mut y, &mask);
            dot64(&c, &y)
        }),
    );
}

#[test]
fn fm_gradient_and_value() {
    let (rows, f, d) = (3, 4, 5);
    let emb = pseudo(rows * f * d, 41);
    let c = pseudo(rows, 42);
    let mut out = vec![0.0; rows];
    fm_forward(&emb, rows, f, d, &mut out);
    // value vs the pairwise definition sum_{i<j} <v_i, v_j>
    for r in 0..rows {
        let v = &emb[r * f * d..(r + 1) * f * d];
        let mut want = 0.0f64;
        for i in 0..f {
            for j in i + 1..f {
                want += (0..d)
                    .map(|k| v[i * d + k] as f64 * v[j * d + k] as f64)
                    .sum::<f64>();
            }
        }
        assert!((out[r] as f64 - want).abs() < 1e-5);
    }
    let mut g = vec![0.5; rows * f * d]; // accumulates on top of 0.5
    fm_backward(&emb, &c, rows, f, d, &mut g);
    g.iter_mut().for_each(|v| *v -= 0.5);
    let loss = |e: &[f32]| {
        let mut o = vec![0.0; rows];
        fm_forward(e, rows, f, d, &mut o);
        dot64(&c, &o)
    };
    assert_ok("fm", fd_check(&g, &emb, loss));
    // the checker catches a wrong FM gradient (missing the -v_fd self term)
    let mut wrong = vec![0.0; rows * f * d];
    for r in 0..rows {
        for k in 0..d {
            let s: f32 = (0..f).map(|i| emb[r * f * d + i * d + k]).sum();
            for i in 0..f {
                wrong[r * f * d + i * d + k] = c[r] * s;
            }
        }
    }
    assert!(
        fd_check(&wrong, &emb, loss).is_err(),
        "checker must reject a wrong FM gradient"
    );
}

#[test]
fn cross_layer_gradients() {
    let (rows, n) = (3, 6);
    let c = Cross { dim: n, w: 0, b: n };
    let p = pseudo(2 * n, 51);
    let x0 = pseudo(rows * n, 52);
    let xl = pseudo(rows * n, 53);
    let cw = pseudo(rows * n, 54);
    let fwd = |p: &[f32], x0: &[f32], xl: &[f32]| {
        let mut out = vec![0.0; rows * n];
        let mut s = vec![0.0; rows];
        c.forward(p, x0, xl, rows, &mut out, &mut s);
        dot64(&cw, &out)
    };
    let mut out = vec![0.0; rows * n];
    let mut s = vec![0.0; rows];
    c.forward(&p, &x0, &xl, rows, &mut out, &mut s);
    let mut g = cw.clone();
    let mut grads = vec![0.0; 2 * n];
    let mut dx0 = vec![0.0; rows * n];
    c.backward(&p, &x0, &xl, &s, &mut g, rows, &mut grads, (&mut dx0, n, n));
    assert_ok("cross params", fd_check(&grads, &p, |pp| fwd(pp, &x0, &xl)));
    assert_ok("cross x_l", fd_check(&g, &xl, |xx| fwd(&p, &x0, xx)));
    // with x_l independent of x0, dL/dx0 is only the direct term
    assert_ok("cross x0", fd_check(&dx0, &x0, |xx| fwd(&p, xx, &xl)));
    // as a first layer (x_l = x0): total = direct + path
    let fwd0 = |x: &[f32]| fwd(&p, x, x);
    let mut out = vec![0.0; rows * n];
    c.forward(&p, &x0, &x0, rows, &mut out, &mut s);
    let mut g = cw.clone();
    let mut dx0 = vec![0.0; rows * n];
    c.backward(
        &p,
        &x0,
        &x0,
        &s,
        &mut g,
        rows,
        &mut vec![0.0; 2 * n],
        (&mut dx0, n, n),
    );
    let total: Vec<f32> = g.iter().zip(&dx0).map(|(a, b)| a + b).collect();
    assert_ok("cross first layer", fd_check(&total, &x0, fwd0));
}

#[test]
fn checker_catches_wrong_gradients() {
    let (l, p, x, c, rows) = linear_case(true);
    let (g, dx) = linear_grads(&l, &p, &x, &c, rows);
    let loss = |pp: &[f32]| linear_loss(&l, pp, &x, &c, rows);
    // one weight gradient off by 10%
    let mut wrong = g.clone();
    let k = (0..l.in_dim * l.out_dim)
        .max_by(|&a, &b| g[a].abs().total_cmp(&g[b].abs()))
        .unwrap();
    wrong[k] *= 1.1;
    assert!(fd_check(&wrong, &p, loss).is_err());
    // bias gradient without the ReLU mask
    let mut y = vec![0.0; rows * l.out_dim];
    l.forward(&p, &x, rows, &mut y, P);
    let mut no_mask = g.clone();
    for j in 0..l.out_dim {
        no_mask[l.b + j] = (0..rows).map(|r| c[r * l.out_dim + j]).sum();
    }
    if no_mask != g {
        assert!(fd_check(&no_mask, &p, loss).is_err());
    }
    // transposed-style bug in dx: swap two columns
    let mut dx_bad = dx.clone();
    dx_bad.swap(0, 1);
    if (dx[0] - dx[1]).abs() > 1e-2 {
        assert!(fd_check(&dx_bad, &x, |xx| linear_loss(&l, &p, xx, &c, rows)).is_err());
    }
    // and the correct ones pass
    assert!(fd_check(&g, &p, loss).is_ok());
}

/// A DCN-v2 cross layer of width `n` at offset 0 and its parameter count.
fn cross_v2_case(n: usize, rank: usize, experts: usize) -> (CrossV2, usize) {
    if rank == 0 {
        let m = CrossMatrix::Full { w: 0 };
        return (
            CrossV2 {
                dim: n,
                m,
                b: n * n,
            },
            n * n + n,
        );
    }
    let kr = rank * experts;
    let gate = (experts > 1).then_some(2 * n * kr);
    let b = 2 * n * kr + if experts > 1 { n * experts } else { 0 };
    let m = CrossMatrix::LowRank {
        rank,
        experts,
        v: 0,
        u: n * kr,
        gate,
    };
    (CrossV2 { dim: n, m, b }, b + n)
}

fn cross_v2_forward(c: &CrossV2, p: &[f32], x0: &[f32], xl: &[f32], rows: usize) -> Vec<f32> {
    let mut cache = CrossV2Cache::default();
    c.ensure_cache(&mut cache, rows);
    let mut out = vec![0.0; rows * c.dim];
    c.forward(p, x0, xl, rows, &mut out, &mut cache, P);
    out
}

#[test]
fn cross_v2_layer_gradients() {
    let (rows, n) = (4, 6);
    for (rank, experts) in [(0, 1), (2, 1), (2, 3)] {
        let what = format!("cross_v2 rank {rank} experts {experts}");
        let (c, np) = cross_v2_case(n, rank, experts);
        let p = pseudo(np, 61);
        let x0 = pseudo(rows * n, 62);
        let xl = pseudo(rows * n, 63);
        let cw = pseudo(rows * n, 64);
        let loss =
            |p: &[f32], x0: &[f32], xl: &[f32]| dot64(&cw, &cross_v2_forward(&c, p, x0, xl, rows));
        let grads_at = |x0: &[f32], xl: &[f32]| {
            let mut cache = CrossV2Cache::default();
            let mut scratch = CrossV2Scratch::default();
            c.ensure_cache(&mut cache, rows);
            c.ensure_scratch(&mut scratch, rows);
            let mut out = vec![0.0; rows * n];
            c.forward(&p, x0, xl, rows, &mut out, &mut cache, P);
            let mut g = cw.clone();
            let mut grads = vec![0.0; np];
            let mut dx0 = vec![0.0; rows * n];
            c.backward(
                &p,
                x0,
                xl,
                &cache,
                &mut g,
                &mut scratch,
                rows,
                &mut grads,
                &mut dx0,
                P,
            );
            (grads, g, dx0)
        };
        let (grads, dxl, dx0) = grads_at(&x0, &xl);
        assert_ok(
            &format!("{what} params"),
            fd_check(&grads, &p, |pp| loss(pp, &x0, &xl)),
        );
        assert_ok(
            &format!("{what} x_l"),
            fd_check(&dxl, &xl, |xx| loss(&p, &x0, xx)),
        );
        assert_ok(
            &format!("{what} x0"),
            fd_check(&dx0, &x0, |xx| loss(&p, xx, &xl)),
        );
        // as a first layer (x_l = x0): total = direct + path
        let (_, dxl, dx0) = grads_at(&x0, &x0);
        let total: Vec<f32> = dxl.iter().zip(&dx0).map(|(a, b)| a + b).collect();
        assert_ok(
            &format!("{what} first layer"),
            fd_check(&total, &x0, |xx| loss(&p, xx, xx)),
        );
        // the checker rejects a gradient that drops the gate's (or U's) share
        let mut bad = grads.clone();
        let k = (0..np)
            .max_by(|&a, &b| grads[a].abs().total_cmp(&grads[b].abs()))
            .unwrap();
        bad[k] *= 0.5;
        assert!(
            fd_check(&bad, &p, |pp| loss(pp, &x0, &xl)).is_err(),
            "{what}"
        );
    }
}

#[test]
fn cross_v2_low_rank_equals_full_rank_with_w_eq_vu() {
    let (rows, n, r) = (3, 5, 2);
    let (low, np) = cross_v2_case(n, r, 1);
    let p = pseudo(np, 71);
    let (v, u, b) = (&p[..n * r], &p[n * r..2 * n * r], &p[2 * n * r..]);
    let mut w = vec![0.0f32; n * n];
    for i in 0..n {
        for j in 0..n {
            w[i * n + j] = (0..r).map(|k| v[i * r + k] * u[k * n + j]).sum();
        }
    }
    let (full, _) = cross_v2_case(n, 0, 1);
    let pf: Vec<f32> = w.iter().chain(b).copied().collect();
    let x0 = pseudo(rows * n, 72);
    let xl = pseudo(rows * n, 73);
    let a = cross_v2_forward(&low, &p, &x0, &xl, rows);
    let f = cross_v2_forward(&full, &pf, &x0, &xl, rows);
    assert!(
        a.iter().zip(&f).all(|(x, y)| (x - y).abs() < 1e-5),
        "{a:?} vs {f:?}"
    );
    // and by definition: x0 ⊙ (x_l W + b) + x_l
    for row in 0..rows {
        for j in 0..n {
            let h: f32 = (0..n).map(|i| xl[row * n + i] * w[i * n + j]).sum::<f32>() + b[j];
            let want = x0[row * n + j] * h + xl[row * n + j];
            assert!((f[row * n + j] - want).abs() < 1e-5);
        }
    }
}

#[test]
fn softmax_gate_gradient_and_value() {
    let (rows, k) = (3, 4);
    let s: Vec<f32> = pseudo(rows * k, 81).iter().map(|v| v * 3.0).collect();
    let c = pseudo(rows * k, 82);
    let mut g = s.clone();
    softmax_rows(&mut g, k);
    for row in g.chunks(k) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(row.iter().all(|&v| v > 0.0));
    }
    // large scores stay finite
    let mut big = vec![1000.0, 999.0, -1000.0, 0.0];
    softmax_rows(&mut big, 4);
    assert!(big.iter().all(|v| v.is_finite()) && big[0] > big[1] && big[2] == 0.0);
    let mut ds = c.clone();
    softmax_rows_backward(&g, &mut ds, k);
    assert_ok(
        "softmax gate",
        fd_check(&ds, &s, |ss| {
            let mut y = ss.to_vec();
            softmax_rows(&mut y, k);
            dot64(&c, &y)
        }),
    );
}

#[test]
fn dot_interaction_gradient_and_value() {
    let (rows, n, d) = (3, 4, 5);
    let di = DotInteraction { n, dim: d };
    assert_eq!(di.out_dim(), 6);
    let t = pseudo(rows * n * d, 91);
    // written at column offset 2 of rows 9 wide; the other columns are left alone
    let (ld, off) = (9, 2);
    let mut out = vec![7.0; rows * ld];
    di.forward(&t, rows, (&mut out, ld, off));
    for r in 0..rows {
        let v = &t[r * n * d..(r + 1) * n * d];
        let mut k = 0;
        for i in 0..n {
            for j in i + 1..n {
                let want: f32 = (0..d).map(|c| v[i * d + c] * v[j * d + c]).sum();
                assert!((out[r * ld + off + k] - want).abs() < 1e-5);
                k += 1;
            }
        }
        assert_eq!(&out[r * ld..r * ld + off], &[7.0, 7.0]);
        assert_eq!(out[r * ld + off + 6], 7.0);
    }
    let c = pseudo(rows * ld, 92);
    let mut dt = vec![3.0; rows * n * d]; // overwritten
    di.backward(&t, (&c, ld, off), rows, &mut dt);
    let loss = |tt: &[f32]| {
        let mut o = vec![0.0; rows * ld];
        di.forward(tt, rows, (&mut o, ld, off));
        (0..rows)
            .map(|r| {
                dot64(
                    &c[r * ld + off..r * ld + off + 6],
                    &o[r * ld + off..r * ld + off + 6],
                )
            })
            .sum()
    };
    assert_ok("dot interaction", fd_check(&dt, &t, loss));
    // the checker catches a gradient that also counts the self-dot (2 t_i)
    let mut wrong = dt.clone();
    for (w, &x) in wrong.iter_mut().zip(&t) {
        *w += 2.0 * x;
    }
    assert!(fd_check(&wrong, &t, loss).is_err());
}

/// An attention unit, its parameters and inputs, and the loss weights `c` of `sum(c * pooled)`.
struct AttentionCase {
    unit: Attention,
    p: Vec<f32>,
    h: Vec<f32>,
    lengths: Vec<u32>,
    t: Vec<f32>,
    c: Vec<f32>,
}

/// One attention unit (dim 3, max_len 4, hidden [5, 3]) over rows of length 1, 2 and 4.
fn attention_case() -> AttentionCase {
    let (d, ml) = (3, 4);
    let mut off = 0;
    let mut mlp = Vec::new();
    let mut in_dim = 4 * d;
    for (i, out) in [5, 3, 1].into_iter().enumerate() {
        mlp.push(Linear {
            in_dim,
            out_dim: out,
            w: off,
            b: off + in_dim * out,
            relu: i < 2,
        });
        off += in_dim * out + out;
        in_dim = out;
    }
    let unit = Attention {
        dim: d,
        max_len: ml,
        mlp,
    };
    let lengths = vec![1u32, 2, 4];
    let rows = lengths.len();
    let p: Vec<f32> = pseudo(off, 41).iter().map(|v| 1.5 * v).collect();
    let mut h = pseudo(rows * ml * d, 42);
    for (r, &len) in lengths.iter().enumerate() {
        h[(r * ml + len as usize) * d..(r + 1) * ml * d].fill(0.0);
    }
    let t = pseudo(rows * d, 43);
    let c = pseudo(rows * d, 44);
    AttentionCase {
        unit,
        p,
        h,
        lengths,
        t,
        c,
    }
}

fn attention_loss(u: &Attention, p: &[f32], h: &[f32], len: &[u32], t: &[f32], c: &[f32]) -> f64 {
    let rows = len.len();
    let mut cache = AttentionCache::default();
    let mut pooled = vec![0.0; rows * u.dim];
    u.forward(p, h, len, t, rows, &mut cache, &mut pooled, P);
    dot64(c, &pooled)
}

#[test]
fn attention_gradients_with_short_partial_and_full_rows() {
    let AttentionCase {
        unit: u,
        p,
        h,
        lengths,
        t,
        c,
    } = attention_case();
    let (rows, d, ml) = (lengths.len(), u.dim, u.max_len);
    let mut cache = AttentionCache::default();
    let mut pooled = vec![0.0; rows * d];
    u.forward(&p, &h, &lengths, &t, rows, &mut cache, &mut pooled, P);
    // the weights are a softmax over the valid positions only; a row of length 1 is its h_0
    let w = cache.weights(rows, ml).to_vec();
    for (r, &len) in lengths.iter().enumerate() {
        let wr = &w[r * ml..(r + 1) * ml];
        assert!((wr.iter().sum::<f32>() - 1.0).abs() < 1e-5, "{wr:?}");
        assert!(wr[len as usize..].iter().all(|&v| v == 0.0), "{wr:?}");
        assert!(wr[..len as usize].iter().all(|&v| v > 0.0), "{wr:?}");
    }
    assert_eq!(&pooled[..d], &h[..d]);
    // the scores differ between positions (else the test would not exercise the softmax)
    let full = &w[2 * ml..3 * ml];
    assert!(full.iter().any(|&v| (v - 0.25).abs() > 0.01), "{full:?}");
    let mut g = vec![0.0; p.len()];
    let mut dh = vec![f32::NAN; h.len()];
    let mut dt = vec![f32::NAN; t.len()];
    u.backward(
        &p, &h, &lengths, &t, rows, &mut cache, &c, &mut g, &mut dh, &mut dt, P,
    );
    for (r, &len) in lengths.iter().enumerate() {
        let masked = &dh[(r * ml + len as usize) * d..(r + 1) * ml * d];
        assert!(masked.iter().all(|&v| v == 0.0), "row {r}: {masked:?}");
    }
    assert!(
        dt[..d].iter().all(|&v| v == 0.0),
        "length 1: t only moves weights"
    );
    assert!(dt[d..].iter().any(|&v| v != 0.0));
    assert_ok(
        "attention h",
        fd_check(&dh, &h, |x| attention_loss(&u, &p, x, &lengths, &t, &c)),
    );
    assert_ok(
        "attention t",
        fd_check(&dt, &t, |x| attention_loss(&u, &p, &h, &lengths, x, &c)),
    );
    assert_ok(
        "attention params",
        fd_check(&g, &p, |x| attention_loss(&u, x, &h, &lengths, &t, &c)),
    );
    // the checker rejects a wrong dt (a sign flip of its largest entry)
    let k = (0..dt.len())
        .max_by(|&a, &b| dt[a].abs().total_cmp(&dt[b].abs()))
        .unwrap();
    let mut bad = dt.clone();
    bad[k] = -bad[k];
    assert!(fd_check(&bad, &t, |x| attention_loss(&u, &p, &h, &lengths, x, &c)).is_err());
}
