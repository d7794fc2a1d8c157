//! Multi-task models (mmoe, esmm), sample and task weights, layer norm and dropout at the
//! model level: finite-difference gradients, weight semantics, predict layout, dropout
//! determinism across threads and resumes.

mod common;

use common::{assert_ok, fd_check, pseudo};
use sparta_nn::layers::loss::{bce_with_logits, sigmoid};
use sparta_nn::{DenseInit, Model, ModelBatch, ModelConfig, ModelKind, ParallelMode, TaskSpec};

const F: usize = 3;
const D: usize = 4;
const ND: usize = 2;
const ROWS: usize = 7;

fn tasks(ws: &[f32]) -> Vec<TaskSpec> {
    ws.iter()
        .enumerate()
        .map(|(i, &w)| TaskSpec {
            name: format!("t{i}"),
            weight: w,
        })
        .collect()
}

fn cfg(kind: ModelKind, task_weights: &[f32]) -> ModelConfig {
    let mut c = ModelConfig::new(kind, F, D, ND);
    c.hidden = vec![5, 4];
    c.tower_hidden = vec![3];
    c.experts = 3;
    c.cross_layers = 2;
    c.seed = 7;
    c.init = DenseInit::HeUniform;
    c.tasks = tasks(task_weights);
    c
}

struct Data {
    emb: Vec<f32>,
    wide: Vec<f32>,
    dense: Vec<f32>,
    labels: Vec<f32>,
    weights: Vec<f32>,
}

fn data(rows: usize, nt: usize, weighted: bool) -> Data {
    Data {
        emb: pseudo(rows * F * D, 1),
        wide: pseudo(rows, 2),
        dense: pseudo(rows * ND, 3),
        labels: pseudo(rows * nt, 4)
            .iter()
            .map(|&v| (v > 0.0) as u8 as f32)
            .collect(),
        weights: if weighted {
            pseudo(rows, 5).iter().map(|v| 1.0 + v).collect()
        } else {
            Vec::new()
        },
    }
}

fn batch<'a>(d: &'a Data, emb: &'a [f32]) -> ModelBatch<'a> {
    ModelBatch {
        rows: d.wide.len(),
        emb,
        wide: &d.wide,
        dense: &d.dense,
        labels: &d.labels,
        weights: &d.weights,
        sequences: &[],
    }
}

/// Finite-difference check of the dense parameters' and the embeddings' gradients.
fn check(c: ModelConfig, d: &Data, name: &str) {
    let mut m = Model::new(c).unwrap();
    let noise = pseudo(m.num_params(), 9);
    for (v, e) in m.param_values_mut().iter_mut().zip(&noise) {
        *v += 0.05 * e;
    }
    let mut d_emb = vec![0.0; d.emb.len()];
    let mut d_wide = vec![0.0; d.wide.len()];
    let loss = m.forward_backward(&batch(d, &d.emb), &mut d_emb, &mut d_wide);
    let l64 = m.loss(&batch(d, &d.emb));
    assert!(
        (loss as f64 - l64).abs() < 1e-5 * (1.0 + l64),
        "{name}: returned loss {loss} vs {l64}"
    );
    let grads = m.gradients().to_vec();
    let p0 = m.param_values().to_vec();
    assert_ok(
        &format!("{name} params"),
        fd_check(&grads, &p0, |pp| {
            m.param_values_mut().copy_from_slice(pp);
            m.loss(&batch(d, &d.emb))
        }),
    );
    m.param_values_mut().copy_from_slice(&p0);
    assert_ok(
        &format!("{name} d_emb"),
        fd_check(&d_emb, &d.emb, |e| m.loss(&batch(d, e))),
    );
    if m.uses_wide() {
        assert_ok(
            &format!("{name} d_wide"),
            fd_check(&d_wide, &d.wide, |w| {
                m.loss(&ModelBatch {
                    wide: w,
                    ..batch(d, &d.emb)
                })
            }),
        );
    } else {
        assert!(d_wide.iter().all(|&v| v == 0.0), "{name}: d_wide is zero");
    }
    // a flipped gradient coordinate fails
    let k = (0..grads.len())
        .max_by(|&a, &b| grads[a].abs().total_cmp(&grads[b].abs()))
        .unwrap();
    let mut bad = grads.clone();
    bad[k] = -bad[k];
    assert!(
        fd_check(&bad, &p0, |pp| {
            m.param_values_mut().copy_from_slice(pp);
            m.loss(&batch(d, &d.emb))
        })
        .is_err(),
        "{name}: the checker catches a wrong gradient"
    );
}

#[test]
fn mmoe_gradients_two_and_three_tasks_with_task_and_sample_weights() {
    check(
        cfg(ModelKind::Mmoe, &[1.0, 0.5]),
        &data(ROWS, 2, true),
        "mmoe 2 tasks",
    );
    // seed 7 puts a tower ReLU input within eps of 0 for 3 tasks (a kink the central
    // difference straddles; eps = 1e-4 confirms the gradient there)
    let mut c = cfg(ModelKind::Mmoe, &[0.3, 1.0, 2.0]);
    c.seed = 11;
    check(c, &data(ROWS, 3, true), "mmoe 3 tasks");
    let mut c = cfg(ModelKind::Mmoe, &[1.0, 0.7]);
    c.tower_hidden.clear();
    check(c, &data(ROWS, 2, false), "mmoe without tower layers");
    let mut c = cfg(ModelKind::Mmoe, &[1.0]);
    c.layer_norm = true;
    check(c, &data(ROWS, 1, true), "mmoe 1 task layer norm");
}

#[test]
fn mmoe_layer_norm_gradients() {
    let mut c = cfg(ModelKind::Mmoe, &[1.0, 0.5]);
    c.layer_norm = true;
    let m = Model::new(c.clone()).unwrap();
    let names: Vec<&str> = m.param_specs().iter().map(|s| s.name.as_str()).collect();
    for want in [
        "expert.2.1.ln.gain",
        "gate.1.weight",
        "tower.1.0.ln.bias",
        "tower.1.1.weight",
    ] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    let gain = m
        .param_specs()
        .iter()
        .find(|s| s.name == "expert.0.0.ln.gain");
    let g = gain.unwrap();
    assert!(m.param_values()[g.offset..g.offset + g.len]
        .iter()
        .all(|&v| v == 1.0));
    check(c, &data(ROWS, 2, true), "mmoe layer norm");
}

/// esmm labels covering every (click, conversion) pair, including a conversion without a click.
fn esmm_data(weighted: bool) -> Data {
    let mut d = data(ROWS, 2, weighted);
    d.labels = [(0, 0), (1, 0), (1, 1), (0, 0), (1, 1), (0, 1), (1, 0)]
        .iter()
        .flat_map(|&(a, b)| [a as f32, b as f32])
        .collect();
    d
}

#[test]
fn esmm_gradients() {
    check(cfg(ModelKind::Esmm, &[1.0, 1.0]), &esmm_data(false), "esmm");
    check(
        cfg(ModelKind::Esmm, &[0.4, 1.5]),
        &esmm_data(true),
        "esmm weighted",
    );
    let mut c = cfg(ModelKind::Esmm, &[1.0, 1.0]);
    c.layer_norm = true;
    check(c, &esmm_data(true), "esmm layer norm");
}

#[test]
fn weighted_single_task_gradients() {
    check(
        cfg(ModelKind::Wdl, &[]),
        &data(ROWS, 1, true),
        "wdl weighted",
    );
    check(
        cfg(ModelKind::Wdl, &[0.5]),
        &data(ROWS, 1, true),
        "wdl weighted, task weight",
    );
    check(
        cfg(ModelKind::Dcnv2, &[]),
        &data(ROWS, 1, true),
        "dcnv2 weighted",
    );
}

/// (loss, parameter gradients, d_emb) of one forward_backward.
fn grads_of(c: &ModelConfig, b: &ModelBatch) -> (f32, Vec<f32>, Vec<f32>) {
    let mut m = Model::new(c.clone()).unwrap();
    let mut d_emb = vec![0.0; b.emb.len()];
    let loss = m.forward_backward(b, &mut d_emb, &mut []);
    (loss, m.gradients().to_vec(), d_emb)
}

fn close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

fn scaled(v: &[f32], s: f32) -> Vec<f32> {
    v.iter().map(|x| x * s).collect()
}

/// Rows `idx` of a `width`-wide row-major buffer.
fn pick(v: &[f32], width: usize, idx: &[usize]) -> Vec<f32> {
    idx.iter()
        .flat_map(|&r| v[r * width..(r + 1) * width].to_vec())
        .collect()
}

#[test]
fn sample_weight_zero_drops_a_row_and_two_counts_it_twice() {
    for (kind, tw) in [
        (ModelKind::Wdl, &[][..]),
        (ModelKind::Dcnv2, &[][..]),
        (ModelKind::Mmoe, &[1.0, 0.5][..]),
        (ModelKind::Esmm, &[1.0, 1.0][..]),
    ] {
        let c = cfg(kind, tw);
        let nt = c.num_tasks();
        let d = data(ROWS, nt, false);
        let fd = F * D;
        let sub = |idx: &[usize], weights: Vec<f32>| Data {
            emb: pick(&d.emb, fd, idx),
            wide: pick(&d.wide, 1, idx),
            dense: pick(&d.dense, ND, idx),
            labels: pick(&d.labels, nt, idx),
            weights,
        };
        // weights [1, 0, 1, 0, ...] over all rows == the kept rows alone (the loss is divided by
        // the batch's rows, so scale by the row counts)
        let zero: Vec<f32> = (0..ROWS).map(|r| (r % 2 == 0) as u8 as f32).collect();
        let kept: Vec<usize> = (0..ROWS).filter(|r| r % 2 == 0).collect();
        let a = sub(&(0..ROWS).collect::<Vec<_>>(), zero);
        let b = sub(&kept, Vec::new());
        let (la, ga, ea) = grads_of(&c, &batch(&a, &a.emb));
        let (lb, gb, eb) = grads_of(&c, &batch(&b, &b.emb));
        let (na, nb) = (ROWS as f32, kept.len() as f32);
        assert!((la * na - lb * nb).abs() < 1e-4, "{kind:?}: {la} {lb}");
        close(
            &scaled(&ga, na),
            &scaled(&gb, nb),
            &format!("{kind:?} w=0 grads"),
        );
        for (i, &r) in kept.iter().enumerate() {
            close(
                &scaled(&ea[r * fd..(r + 1) * fd], na),
                &scaled(&eb[i * fd..(i + 1) * fd], nb),
                &format!("{kind:?} w=0 d_emb"),
            );
        }
        for r in (1..ROWS).step_by(2) {
            assert!(ea[r * fd..(r + 1) * fd].iter().all(|&v| v == 0.0));
        }
        // weight 2 on row 0 == row 0 twice
        let mut two = vec![1.0; ROWS];
        two[0] = 2.0;
        let a = sub(&(0..ROWS).collect::<Vec<_>>(), two);
        let mut twice: Vec<usize> = vec![0];
        twice.extend(0..ROWS);
        let b = sub(&twice, Vec::new());
        let (la, ga, _) = grads_of(&c, &batch(&a, &a.emb));
        let (lb, gb, _) = grads_of(&c, &batch(&b, &b.emb));
        let (na, nb) = (ROWS as f32, (ROWS + 1) as f32);
        assert!((la * na - lb * nb).abs() < 1e-4, "{kind:?}: {la} {lb}");
        close(
            &scaled(&ga, na),
            &scaled(&gb, nb),
            &format!("{kind:?} w=2 grads"),
        );
    }
}

#[test]
fn predict_is_rows_by_tasks_and_matches_the_loss() {
    for (kind, tw) in [
        (ModelKind::Mmoe, &[1.0, 0.5, 2.0][..]),
        (ModelKind::Esmm, &[0.7, 1.3][..]),
    ] {
        let c = cfg(kind, tw);
        let nt = c.num_tasks();
        let d = if kind == ModelKind::Esmm {
            esmm_data(true)
        } else {
            data(ROWS, nt, true)
        };
        let mut m = Model::new(c.clone()).unwrap();
        assert_eq!(m.num_tasks(), nt);
        assert_eq!(m.task_names(), c.task_names());
        let mut p = vec![0.0; ROWS * nt];
        m.predict(&batch(&d, &d.emb), &mut p);
        // every row alone gives the same row of outputs
        for r in 0..ROWS {
            let one = Data {
                emb: pick(&d.emb, F * D, &[r]),
                wide: pick(&d.wide, 1, &[r]),
                dense: pick(&d.dense, ND, &[r]),
                labels: Vec::new(),
                weights: Vec::new(),
            };
            let mut q = vec![0.0; nt];
            m.predict(&batch(&one, &one.emb), &mut q);
            close(&q, &p[r * nt..(r + 1) * nt], "one row");
        }
        // the loss from the predicted probabilities, task weights and sample weights
        let mut want = 0.0f64;
        for r in 0..ROWS {
            let row = &d.labels[r * nt..(r + 1) * nt];
            for t in 0..nt {
                let (pr, y) = (p[r * nt + t] as f64, c.task_target(t, row) as f64);
                let bce = -y * pr.ln() - (1.0 - y) * (1.0 - pr).ln();
                want += tw[t] as f64 * d.weights[r] as f64 * bce;
            }
        }
        want /= ROWS as f64;
        let got = m.loss(&batch(&d, &d.emb));
        assert!(
            (got - want).abs() < 1e-4 * want,
            "{kind:?}: {got} vs {want}"
        );
        if kind == ModelKind::Esmm {
            for r in 0..ROWS {
                assert!(p[r * 2 + 1] <= p[r * 2], "pCTCVR <= pCTR");
            }
            // task 1's target is click * conversion
            assert_eq!(c.task_target(1, &[0.0, 1.0]), 0.0);
            assert_eq!(c.task_target(1, &[1.0, 1.0]), 1.0);
        }
    }
    // a single-task model still writes one probability per row
    let c = cfg(ModelKind::Wdl, &[]);
    let d = data(ROWS, 1, false);
    let mut m = Model::new(c).unwrap();
    let mut p = vec![0.0; ROWS];
    m.predict(&batch(&d, &d.emb), &mut p);
    let loss = m.loss(&batch(&d, &d.emb));
    let want: f64 = p
        .iter()
        .zip(&d.labels)
        .map(|(&pr, &y)| {
            let z = (pr / (1.0 - pr)).ln();
            bce_with_logits(z, y)
        })
        .sum::<f64>()
        / ROWS as f64;
    assert!((loss - want).abs() < 1e-4, "{loss} vs {want}");
    assert!((sigmoid(0.0) - 0.5).abs() < 1e-7);
}

#[test]
fn dropout_is_on_in_training_only_and_masks_ignore_threads() {
    for (kind, tw) in [
        (ModelKind::Mmoe, &[1.0, 0.5][..]),
        (ModelKind::Esmm, &[1.0, 1.0][..]),
    ] {
        let rows = 64;
        let d = data(rows, 2, true);
        let mut outs = Vec::new();
        for (threads, mode) in [
            (1, ParallelMode::Shard),
            (2, ParallelMode::Shard),
            (3, ParallelMode::Shard),
            (2, ParallelMode::Gemm),
        ] {
            let mut c = cfg(kind, tw);
            c.dropout = 0.3;
            c.layer_norm = true;
            c.threads = threads;
            c.parallel = mode;
            let mut m = Model::new(c).unwrap();
            let b = batch(&d, &d.emb);
            // predict and loss have no dropout: repeated calls agree, and the training loss
            // (dropout on) differs from the evaluation loss
            let (mut p1, mut p2) = (vec![0.0; rows * 2], vec![0.0; rows * 2]);
            m.predict(&b, &mut p1);
            m.predict(&b, &mut p2);
            assert_eq!(p1, p2);
            let eval = m.loss(&b);
            assert_eq!(eval.to_bits(), m.loss(&b).to_bits());
            let mut d_emb = vec![0.0; d.emb.len()];
            let train = m.forward_backward(&b, &mut d_emb, &mut []);
            assert!(
                (train as f64 - eval).abs() > 1e-4,
                "{kind:?}: dropout is on"
            );
            let g = m.gradients().to_vec();
            // the same step draws the same masks
            m.zero_gradients();
            let again = m.forward_backward(&b, &mut d_emb.clone(), &mut []);
            assert_eq!(train.to_bits(), again.to_bits());
            m.zero_gradients();
            // the next step draws new ones
            m.forward_backward(&b, &mut d_emb.clone(), &mut []);
            m.apply_gradients();
            let next = m.forward_backward(&b, &mut d_emb.clone(), &mut []);
            let next_eval = m.loss(&b);
            assert!(
                ((next as f64 - next_eval) - (train as f64 - eval)).abs() > 1e-6,
                "{kind:?}: step 1 masks differ from step 0"
            );
            outs.push((threads, mode, train, g, d_emb));
        }
        let base = &outs[0];
        for o in &outs[1..] {
            assert!(
                (o.2 - base.2).abs() < 1e-5,
                "{kind:?} {} {:?}: loss {} vs {}",
                o.0,
                o.1,
                o.2,
                base.2
            );
            close(&o.3, &base.3, &format!("{kind:?} {} {:?} grads", o.0, o.1));
            close(&o.4, &base.4, &format!("{kind:?} {} {:?} d_emb", o.0, o.1));
        }
    }
}

#[test]
fn resumed_dropout_training_equals_uninterrupted() {
    let mut c = cfg(ModelKind::Mmoe, &[1.0, 0.5]);
    c.dropout = 0.2;
    let d = data(32, 2, false);
    let b = batch(&d, &d.emb);
    let mut d_emb = vec![0.0; d.emb.len()];
    let mut a = Model::new(c.clone()).unwrap();
    a.forward_backward(&b, &mut d_emb, &mut []);
    a.apply_gradients();
    let (values, state) = (a.param_values().to_vec(), a.optimizer_state().clone());
    for _ in 0..2 {
        a.forward_backward(&b, &mut d_emb, &mut []);
        a.apply_gradients();
    }
    let mut r = Model::new(c).unwrap();
    r.param_values_mut().copy_from_slice(&values);
    r.set_optimizer_state(state).unwrap();
    for _ in 0..2 {
        r.forward_backward(&b, &mut d_emb, &mut []);
        r.apply_gradients();
    }
    let bits = |m: &Model| {
        m.param_values()
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&a), bits(&r));
}

#[test]
fn mmoe_and_esmm_flops_count_their_layers() {
    let m4 = Model::new(cfg(ModelKind::Mmoe, &[1.0, 1.0])).unwrap();
    let mut c = cfg(ModelKind::Mmoe, &[1.0, 1.0]);
    c.experts = 6;
    let m6 = Model::new(c).unwrap();
    // 3 more experts: each 6*(14*5 + 5*4) - 2*(14-12)*5 (no gradient to the dense inputs),
    // plus their gate columns and mixture terms
    assert!(m6.flops_per_sample() > m4.flops_per_sample() + 3.0 * 500.0);
    let e = Model::new(cfg(ModelKind::Esmm, &[1.0, 1.0])).unwrap();
    // two towers 14 -> 5 -> 4 -> 1: 4 in out + 2 dx_cols out per layer
    let tower = (4 * 14 * 5 + 2 * 12 * 5 + 6 * 5 * 4 + 6 * 4) as f64;
    assert_eq!(e.flops_per_sample(), 2.0 * tower);
}

#[test]
fn esmm_ignores_a_conversion_without_a_click() {
    let c = cfg(ModelKind::Esmm, &[1.0, 1.0]);
    let d = esmm_data(true);
    let mut flipped = esmm_data(true);
    // every unclicked row gets a conversion: the targets (click, click * conversion) stay
    for r in 0..ROWS {
        if flipped.labels[2 * r] == 0.0 {
            flipped.labels[2 * r + 1] = 1.0 - flipped.labels[2 * r + 1];
        }
    }
    assert_ne!(d.labels, flipped.labels);
    let (la, ga, ea) = grads_of(&c, &batch(&d, &d.emb));
    let (lb, gb, eb) = grads_of(&c, &batch(&flipped, &flipped.emb));
    assert_eq!(la.to_bits(), lb.to_bits());
    assert_eq!(ga, gb);
    assert_eq!(ea, eb);
    // while a clicked row's conversion does count
    let mut clicked = esmm_data(true);
    let r = (0..ROWS).find(|&r| clicked.labels[2 * r] == 1.0).unwrap();
    clicked.labels[2 * r + 1] = 1.0 - clicked.labels[2 * r + 1];
    let (lc, _, _) = grads_of(&c, &batch(&clicked, &clicked.emb));
    assert_ne!(la.to_bits(), lc.to_bits());
}
