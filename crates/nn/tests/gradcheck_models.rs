//! Finite-difference checks of whole models: dense params, d_emb and d_wide; plus the
//! equivalence of the threaded modes with the single-threaded result.

mod common;

use common::{assert_ok, fd_check, pseudo};
use sparta_nn::{CrossStructure, Model, ModelBatch, ModelConfig, ModelKind, ParallelMode};

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
    data_with(ND)
}

fn data_with(nd: usize) -> Data {
    Data {
        emb: pseudo(ROWS * F * D, 1),
        wide: pseudo(ROWS, 2),
        dense: pseudo(ROWS * nd, 3),
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
        weights: &[],
        sequences: &[],
    }
}

fn check_model(kind: ModelKind) {
    check_config(cfg(kind), &format!("{kind:?}"));
}

fn check_config(c: ModelConfig, name: &str) {
    let kind = c.kind;
    let d = data_with(c.num_dense);
    let mut m = Model::new(c).unwrap();
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
    if matches!(kind, ModelKind::Dcn | ModelKind::Dcnv2 | ModelKind::Dlrm) {
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
fn dcnv2_full_rank_parallel_gradients() {
    check_config(cfg(ModelKind::Dcnv2), "dcnv2 full rank parallel");
}

#[test]
fn dcnv2_full_rank_stacked_gradients() {
    let mut c = cfg(ModelKind::Dcnv2);
    c.cross_structure = CrossStructure::Stacked;
    check_config(c, "dcnv2 full rank stacked");
}

#[test]
fn dcnv2_low_rank_gradients() {
    for structure in [CrossStructure::Parallel, CrossStructure::Stacked] {
        let mut c = cfg(ModelKind::Dcnv2);
        c.cross_rank = 3;
        c.cross_structure = structure;
        check_config(c, &format!("dcnv2 low rank {structure:?}"));
    }
}

#[test]
fn dcnv2_two_experts_gradients() {
    for structure in [CrossStructure::Parallel, CrossStructure::Stacked] {
        let mut c = cfg(ModelKind::Dcnv2);
        c.cross_rank = 2;
        c.cross_experts = 2;
        c.cross_structure = structure;
        check_config(c, &format!("dcnv2 2 experts {structure:?}"));
    }
}

#[test]
fn dcnv2_without_mlp_or_cross_gradients() {
    for structure in [CrossStructure::Parallel, CrossStructure::Stacked] {
        let mut c = cfg(ModelKind::Dcnv2);
        c.hidden.clear();
        c.cross_structure = structure;
        check_config(c, &format!("dcnv2 cross only {structure:?}"));
        let mut c = cfg(ModelKind::Dcnv2);
        c.cross_layers = 0;
        c.cross_structure = structure;
        check_config(c, &format!("dcnv2 mlp only {structure:?}"));
    }
}

#[test]
fn dlrm_gradients() {
    let mut c = cfg(ModelKind::Dlrm);
    c.bottom_hidden = vec![5, D];
    // seed 7 puts a bottom ReLU input within eps of 0 (a kink too close to the edge of the
    // central difference for the checker to spot); smaller eps confirms the gradient there.
    c.seed = 11;
    check_config(c, "dlrm");
}

#[test]
fn dlrm_without_dense_features_gradients() {
    let mut c = cfg(ModelKind::Dlrm);
    c.num_dense = 0;
    let m = Model::new(c.clone()).unwrap();
    assert!(
        m.param_specs()
            .iter()
            .all(|s| !s.name.starts_with("bottom.")),
        "no bottom MLP without dense features"
    );
    check_config(c, "dlrm without dense");
}

#[test]
fn threaded_modes_match_single_thread() {
    threaded_modes_match(&[ModelKind::Wdl, ModelKind::Deepfm, ModelKind::Dcn]);
}

#[test]
fn threaded_modes_match_single_thread_new_kinds() {
    threaded_modes_match(&[ModelKind::Dcnv2, ModelKind::Dlrm]);
}

fn threaded_modes_match(kinds: &[ModelKind]) {
    let d = data();
    for &kind in kinds {
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
