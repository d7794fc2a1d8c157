//! Finite-difference checks of whole models: dense params, d_emb and d_wide; plus the
//! equivalence of the threaded modes with the single-threaded result.

mod common;

use common::{assert_ok, fd_check, pseudo};
use sparta_nn::{Model, ModelBatch, ModelConfig, ModelKind, ParallelMode};

const F: usize = 3;
const D: usize = 4;
const ND: usize = 2;
const ROWS: usize = 6;

fn cfg(kind: ModelKind) -> ModelConfig {
    let mut c = ModelConfig::new(kind, F, D, ND);
    c.hidden = vec![5, 4];
    c.cross_layers = 2;
    c.seed = 7;
    c.init = sparta_nn::DenseInit::HeUniform;
    c
}

struct Data {
    emb: Vec<f32>,
    wide: Vec<f32>,
    dense: Vec<f32>,
    labels: Vec<f32>,
}

fn data() -> Data {
    Data {
        emb: pseudo(ROWS * F * D, 1),
        wide: pseudo(ROWS, 2),
        dense: pseudo(ROWS * ND, 3),
        labels: pseudo(ROWS, 4)
            .iter()
            .map(|&v| (v > 0.0) as u8 as f32)
            .collect(),
    }
}

fn batch<'a>(d: &'a Data, emb: &'a [f32], wide: &'a [f32]) -> ModelBatch<'a> {
    ModelBatch {
        rows: ROWS,
        emb,
        wide,
        dense: &d.dense,
        labels: &d.labels,
    }
}

fn check_model(kind: ModelKind) {
    let d = data();
    let mut m = Model::new(cfg(kind)).unwrap();
    // perturb the biases away from zero so their gradients matter
    let n = m.num_params();
    let noise = pseudo(n, 9);
    for (v, e) in m.param_values_mut().iter_mut().zip(&noise) {
        *v += 0.05 * e;
    }
    let mut d_emb = vec![0.0; ROWS * F * D];
    let mut d_wide = vec![0.0; ROWS];
    let loss = m.forward_backward(&batch(&d, &d.emb, &d.wide), &mut d_emb, &mut d_wide);
    let l64 = m.loss(&batch(&d, &d.emb, &d.wide));
    assert!(
        (loss as f64 - l64).abs() < 1e-5,
        "returned loss {loss} vs {l64}"
    );
    let grads = m.gradients().to_vec();
    let p0 = m.param_values().to_vec();
    let name = format!("{kind:?}");

    assert_ok(
        &format!("{name} params"),
        fd_check(&grads, &p0, |pp| {
            m.param_values_mut().copy_from_slice(pp);
            m.loss(&batch(&d, &d.emb, &d.wide))
        }),
    );
    m.param_values_mut().copy_from_slice(&p0);
    assert_ok(
        &format!("{name} d_emb"),
        fd_check(&d_emb, &d.emb, |e| m.loss(&batch(&d, e, &d.wide))),
    );
    assert_ok(
        &format!("{name} d_wide"),
        fd_check(&d_wide, &d.wide, |w| m.loss(&batch(&d, &d.emb, w))),
    );
    if kind == ModelKind::Dcn {
        assert!(d_wide.iter().all(|&v| v == 0.0));
        assert!(!m.uses_wide());
    } else {
        assert!(m.uses_wide());
        // d_wide is (p - y) / rows
        let mut p = vec![0.0; ROWS];
        m.predict(&batch(&d, &d.emb, &d.wide), &mut p);
        for i in 0..ROWS {
            assert!((d_wide[i] - (p[i] - d.labels[i]) / ROWS as f32).abs() < 1e-6);
        }
    }
    // the checker rejects a corrupted model gradient
    let mut bad = grads.clone();
    let k = (0..n)
        .max_by(|&a, &b| grads[a].abs().total_cmp(&grads[b].abs()))
        .unwrap();
    bad[k] = -bad[k];
    assert!(fd_check(&bad, &p0, |pp| {
        m.param_values_mut().copy_from_slice(pp);
        m.loss(&batch(&d, &d.emb, &d.wide))
    })
    .is_err());
}

#[test]
fn wdl_gradients() {
    check_model(ModelKind::Wdl);
}

#[test]
fn deepfm_gradients() {
    check_model(ModelKind::Deepfm);
}

#[test]
fn dcn_gradients() {
    check_model(ModelKind::Dcn);
}

#[test]
fn threaded_modes_match_single_thread() {
    let d = data();
    for kind in [ModelKind::Wdl, ModelKind::Deepfm, ModelKind::Dcn] {
        let mut outs = Vec::new();
        for (threads, mode) in [
            (1, ParallelMode::Shard),
            (2, ParallelMode::Shard),
            (2, ParallelMode::Gemm),
            (4, ParallelMode::Shard),
        ] {
            let mut c = cfg(kind);
            c.threads = threads;
            c.parallel = mode;
            let mut m = Model::new(c).unwrap();
            let mut d_emb = vec![0.0; ROWS * F * D];
            let mut d_wide = vec![0.0; ROWS];
            let loss = m.forward_backward(&batch(&d, &d.emb, &d.wide), &mut d_emb, &mut d_wide);
            // accumulate a second identical batch: gradients must double
            let g1 = m.gradients().to_vec();
            m.forward_backward(&batch(&d, &d.emb, &d.wide), &mut d_emb, &mut d_wide);
            let g2 = m.gradients().to_vec();
            for (a, b) in g2.iter().zip(&g1) {
                assert!((a - 2.0 * b).abs() <= 1e-5 * (1.0 + b.abs()));
            }
            let mut p = vec![0.0; ROWS];
            m.predict(&batch(&d, &d.emb, &d.wide), &mut p);
            outs.push((loss, g1, d_emb, d_wide, p));
        }
        let base = &outs[0];
        for o in &outs[1..] {
            assert!((o.0 - base.0).abs() < 1e-6);
            let close = |a: &[f32], b: &[f32]| {
                a.iter()
                    .zip(b)
                    .all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
            };
            assert!(close(&o.1, &base.1), "{kind:?} grads differ");
            assert!(close(&o.2, &base.2), "{kind:?} d_emb differs");
            assert!(close(&o.3, &base.3), "{kind:?} d_wide differs");
            assert!(close(&o.4, &base.4), "{kind:?} predictions differ");
        }
    }
}
