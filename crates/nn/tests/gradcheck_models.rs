//! Finite-difference checks of whole models: dense params, d_emb and d_wide; plus the
//! equivalence of the threaded modes with the single-threaded result.

mod common;

use common::{assert_ok, fd_check, pseudo};
use sparta_nn::{
    CrossStructure, Model, ModelBatch, ModelConfig, ModelKind, ParallelMode, SequenceIn,
    SequencePooling, SequenceSpec,
};

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
    if matches!(
        kind,
        ModelKind::Dcn | ModelKind::Dcnv2 | ModelKind::Dlrm | ModelKind::Din
    ) {
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

/// din over fields of widths [3, 3, 2, 2, 4]: sequence field 1 (max_len 4) against target 0,
/// sequence field 3 (max_len 2) against target 2; field 4 is a plain field.
const DIN_DIMS: [usize; 5] = [3, 3, 2, 2, 4];
const DIN_WIDTH: usize = 14;
const DIN_SEQS: [(usize, usize, usize); 2] = [(1, 0, 4), (3, 2, 2)];
const DIN_LENGTHS: [[u32; ROWS]; 2] = [[1, 2, 4, 3, 4, 1], [1, 2, 2, 1, 2, 1]];

fn din_cfg() -> ModelConfig {
    let mut c = ModelConfig::with_feature_dims(ModelKind::Din, DIN_DIMS.to_vec(), ND);
    c.hidden = vec![5, 4];
    c.attention_hidden = vec![6, 3];
    c.sequences = DIN_SEQS
        .iter()
        .map(|&(field, target, max_len)| SequenceSpec {
            field,
            target,
            max_len,
        })
        .collect();
    c.seed = 7;
    c.init = sparta_nn::DenseInit::HeUniform;
    c
}

/// Sequence blocks (zeros past each length) for [`din_cfg`].
fn din_values() -> Vec<Vec<f32>> {
    DIN_SEQS
        .iter()
        .zip(&DIN_LENGTHS)
        .enumerate()
        .map(|(k, (&(field, _, ml), lengths))| {
            let d = DIN_DIMS[field];
            let mut v: Vec<f32> = pseudo(ROWS * ml * d, 20 + k as u64)
                .iter()
                .map(|x| 1.5 * x)
                .collect();
            for (r, &len) in lengths.iter().enumerate() {
                v[(r * ml + len as usize) * d..(r + 1) * ml * d].fill(0.0);
            }
            v
        })
        .collect()
}

fn din_batch<'a>(d: &'a Data, emb: &'a [f32], seqs: &'a [SequenceIn<'a>]) -> ModelBatch<'a> {
    ModelBatch {
        rows: ROWS,
        emb,
        wide: &d.wide,
        dense: &d.dense,
        labels: &d.labels,
        weights: &[],
        sequences: seqs,
    }
}

fn seq_in<'a>(values: &'a [Vec<f32>]) -> Vec<SequenceIn<'a>> {
    values
        .iter()
        .zip(&DIN_LENGTHS)
        .map(|(v, l)| SequenceIn {
            values: v,
            lengths: l,
        })
        .collect()
}

struct DinRun {
    loss: f32,
    grads: Vec<f32>,
    d_emb: Vec<f32>,
    d_wide: Vec<f32>,
    d_seq: Vec<Vec<f32>>,
    prob: Vec<f32>,
}

fn din_run(m: &mut Model, d: &Data, emb: &[f32], values: &[Vec<f32>]) -> DinRun {
    let seqs = seq_in(values);
    let b = din_batch(d, emb, &seqs);
    let mut d_emb = vec![f32::NAN; emb.len()];
    let mut d_wide = vec![f32::NAN; ROWS];
    let mut d_seq: Vec<Vec<f32>> = values.iter().map(|v| vec![f32::NAN; v.len()]).collect();
    let mut d_seq_refs: Vec<&mut [f32]> = d_seq.iter_mut().map(|v| &mut v[..]).collect();
    let loss = m.forward_backward_seq(&b, &mut d_emb, &mut d_wide, &mut d_seq_refs);
    let grads = m.gradients().to_vec();
    m.zero_gradients();
    let mut prob = vec![0.0; ROWS];
    m.predict(&b, &mut prob);
    DinRun {
        loss,
        grads,
        d_emb,
        d_wide,
        d_seq,
        prob,
    }
}

#[test]
fn din_gradients_over_two_sequences_of_different_dims() {
    let d = data();
    let emb = pseudo(ROWS * DIN_WIDTH, 31);
    let values = din_values();
    let mut m = Model::new(din_cfg()).unwrap();
    assert!(m.attends() && !m.uses_wide());
    let noise = pseudo(m.num_params(), 9);
    for (v, e) in m.param_values_mut().iter_mut().zip(&noise) {
        *v += 0.05 * e;
    }
    let run = din_run(&mut m, &d, &emb, &values);
    let loss_of = |m: &mut Model, emb: &[f32], values: &[Vec<f32>]| {
        let seqs = seq_in(values);
        m.loss(&din_batch(&d, emb, &seqs))
    };
    let l64 = loss_of(&mut m, &emb, &values);
    assert!(
        (run.loss as f64 - l64).abs() < 1e-5,
        "{} vs {l64}",
        run.loss
    );
    assert!(run.d_wide.iter().all(|&v| v == 0.0));
    // an attended field's slot gets no gradient through d_emb; its target's does
    for r in 0..ROWS {
        assert!(run.d_emb[r * DIN_WIDTH + 3..r * DIN_WIDTH + 6]
            .iter()
            .all(|&v| v == 0.0));
        assert!(run.d_emb[r * DIN_WIDTH + 8..r * DIN_WIDTH + 10]
            .iter()
            .all(|&v| v == 0.0));
        assert!(run.d_emb[r * DIN_WIDTH..r * DIN_WIDTH + 3]
            .iter()
            .any(|&v| v != 0.0));
    }
    // masked positions get exactly zero
    for (k, (&(field, _, ml), lengths)) in DIN_SEQS.iter().zip(&DIN_LENGTHS).enumerate() {
        let dim = DIN_DIMS[field];
        for (r, &len) in lengths.iter().enumerate() {
            let masked = &run.d_seq[k][(r * ml + len as usize) * dim..(r + 1) * ml * dim];
            assert!(masked.iter().all(|&v| v == 0.0), "seq {k} row {r}");
        }
    }
    let p0 = m.param_values().to_vec();
    assert_ok(
        "din params",
        fd_check(&run.grads, &p0, |pp| {
            m.param_values_mut().copy_from_slice(pp);
            loss_of(&mut m, &emb, &values)
        }),
    );
    m.param_values_mut().copy_from_slice(&p0);
    // the attention parameters are part of the check, and receive a gradient
    let att = m
        .param_specs()
        .iter()
        .find(|s| s.name == "attention.1.0.weight")
        .unwrap()
        .clone();
    assert_eq!(att.shape, vec![4 * 2, 6]);
    assert!(run.grads[att.offset..att.offset + att.len]
        .iter()
        .any(|&v| v != 0.0));
    assert_ok(
        "din d_emb",
        fd_check(&run.d_emb, &emb, |e| loss_of(&mut m, e, &values)),
    );
    for k in 0..DIN_SEQS.len() {
        assert_ok(
            &format!("din d_seq[{k}]"),
            fd_check(&run.d_seq[k], &values[k], |v| {
                let mut vs = values.clone();
                vs[k].copy_from_slice(v);
                loss_of(&mut m, &emb, &vs)
            }),
        );
    }
    // the checker rejects a target gradient without the attention's part
    let mut bad = run.d_emb.clone();
    let k = (0..ROWS)
        .map(|r| r * DIN_WIDTH)
        .max_by(|&a, &b| bad[a].abs().total_cmp(&bad[b].abs()))
        .unwrap();
    bad[k] = -bad[k];
    assert!(fd_check(&bad, &emb, |e| loss_of(&mut m, e, &values)).is_err());
}

#[test]
fn din_mean_pooling_gradients() {
    let mut c = cfg(ModelKind::Din);
    c.sequence_pooling = SequencePooling::Mean;
    c.sequences = vec![SequenceSpec {
        field: 1,
        target: 0,
        max_len: 5,
    }];
    let m = Model::new(c.clone()).unwrap();
    assert!(!m.attends() && !m.uses_wide());
    assert!(m
        .param_specs()
        .iter()
        .all(|s| !s.name.starts_with("attention.")));
    check_config(c, "din mean pooling");
}

#[test]
#[should_panic(expected = "forward_backward_seq")]
fn din_attention_refuses_forward_backward_without_d_seq() {
    let d = data();
    let emb = pseudo(ROWS * DIN_WIDTH, 31);
    let values = din_values();
    let seqs = seq_in(&values);
    let mut m = Model::new(din_cfg()).unwrap();
    let mut d_emb = vec![0.0; emb.len()];
    m.forward_backward(&din_batch(&d, &emb, &seqs), &mut d_emb, &mut []);
}

#[test]
fn din_threaded_modes_match_single_thread() {
    let d = data();
    let emb = pseudo(ROWS * DIN_WIDTH, 31);
    let values = din_values();
    let mut runs = Vec::new();
    for (threads, mode) in [
        (1, ParallelMode::Shard),
        (2, ParallelMode::Shard),
        (2, ParallelMode::Gemm),
        (4, ParallelMode::Shard),
    ] {
        let mut c = din_cfg();
        c.threads = threads;
        c.parallel = mode;
        let mut m = Model::new(c).unwrap();
        runs.push(din_run(&mut m, &d, &emb, &values));
    }
    let close = |a: &[f32], b: &[f32]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
    };
    let base = &runs[0];
    assert!(base.grads.iter().any(|&v| v != 0.0));
    for (i, o) in runs.iter().enumerate().skip(1) {
        assert!((o.loss - base.loss).abs() < 1e-6, "run {i} loss");
        assert!(close(&o.grads, &base.grads), "run {i} grads differ");
        assert!(close(&o.d_emb, &base.d_emb), "run {i} d_emb differs");
        assert!(close(&o.d_wide, &base.d_wide), "run {i} d_wide differs");
        for k in 0..DIN_SEQS.len() {
            assert!(
                close(&o.d_seq[k], &base.d_seq[k]),
                "run {i} d_seq[{k}] differs"
            );
        }
        assert!(close(&o.prob, &base.prob), "run {i} predictions differ");
    }
}
