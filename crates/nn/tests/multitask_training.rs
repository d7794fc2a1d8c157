//! mmoe and esmm learn a synthetic click/conversion problem; sample weights of 1 and a single
//! default task leave the single-task models bit-identical; config serde and validation of the
//! multi-task fields.

mod common;

use common::pseudo;
use sparta_nn::metrics::auc;
use sparta_nn::{DenseOptimizer, Model, ModelBatch, ModelConfig, ModelKind, NnError, TaskSpec};

const F: usize = 2;
const D: usize = 4;
const ND: usize = 2;

struct Toy {
    emb: Vec<f32>,
    dense: Vec<f32>,
    /// `[rows, 2]`: click, conversion (a conversion only where there is a click).
    labels: Vec<f32>,
}

fn toy(rows: usize, seed: u64) -> Toy {
    let emb = pseudo(rows * F * D, seed);
    let dense = pseudo(rows * ND, seed + 1);
    let mut labels = Vec::with_capacity(rows * 2);
    for r in 0..rows {
        let (e, x) = (
            &emb[r * F * D..(r + 1) * F * D],
            &dense[r * ND..(r + 1) * ND],
        );
        let click = e[0] - e[5] + x[0] > 0.0;
        let convert = click && e[2] + e[7] - x[1] > 0.3;
        labels.extend([click as u8 as f32, convert as u8 as f32]);
    }
    Toy { emb, dense, labels }
}

fn batch(t: &Toy) -> ModelBatch<'_> {
    ModelBatch {
        rows: t.labels.len() / 2,
        emb: &t.emb,
        wide: &[],
        dense: &t.dense,
        labels: &t.labels,
        weights: &[],
        sequences: &[],
    }
}

fn two_tasks(names: [&str; 2]) -> Vec<TaskSpec> {
    names
        .iter()
        .map(|n| TaskSpec {
            name: n.to_string(),
            weight: 1.0,
        })
        .collect()
}

fn small(kind: ModelKind) -> ModelConfig {
    let mut c = ModelConfig::new(kind, F, D, ND);
    c.hidden = vec![16, 8];
    c.tower_hidden = vec![8];
    c.seed = 1;
    c.optimizer = DenseOptimizer::Adam {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };
    c.tasks = if kind == ModelKind::Esmm {
        two_tasks(["ctr", "ctcvr"])
    } else {
        two_tasks(["ctr", "cvr"])
    };
    c
}

#[test]
fn mmoe_and_esmm_learn_both_tasks() {
    let rows = 512;
    let (train, test) = (toy(rows, 100), toy(rows, 200));
    let positives = test.labels.iter().skip(1).step_by(2).sum::<f32>();
    assert!(
        positives > 20.0,
        "the test set has conversions: {positives}"
    );
    let mut cases = vec![small(ModelKind::Mmoe), small(ModelKind::Esmm)];
    for kind in [ModelKind::Mmoe, ModelKind::Esmm] {
        let mut c = small(kind);
        c.layer_norm = true;
        c.dropout = 0.1;
        cases.push(c);
    }
    for c in cases {
        let what = format!(
            "{} (layer_norm {}, dropout {})",
            c.kind.name(),
            c.layer_norm,
            c.dropout
        );
        let esmm = c.kind == ModelKind::Esmm;
        let mut m = Model::new(c.clone()).unwrap();
        let mut d_emb = vec![0.0; train.emb.len()];
        let first = m.forward_backward(&batch(&train), &mut d_emb, &mut []);
        m.apply_gradients();
        for _ in 0..300 {
            m.forward_backward(&batch(&train), &mut d_emb, &mut []);
            m.apply_gradients();
        }
        let last = m.loss(&batch(&train));
        assert!(last < 0.5 * first as f64, "{what}: loss {first} -> {last}");
        let mut p = vec![0.0; rows * 2];
        m.predict(&batch(&test), &mut p);
        for t in 0..2 {
            let y: Vec<f32> = test
                .labels
                .chunks(2)
                .map(|row| c.task_target(t, row))
                .collect();
            let pt: Vec<f32> = p.iter().skip(t).step_by(2).copied().collect();
            let a = auc(&y, &pt);
            assert!(a > 0.9, "{what}: task {t} held-out auc {a}");
        }
        if esmm {
            assert!(
                p.chunks(2).all(|r| r[1] <= r[0]),
                "{what}: pCTCVR <= pCTR on every row"
            );
        }
    }
}

/// Trained parameter bits of a single-task model given weights / tasks.
fn train_bits(kind: ModelKind, weights: &[f32], tasks: Vec<TaskSpec>) -> Vec<u32> {
    let rows = 64;
    let t = toy(rows, 5);
    let labels: Vec<f32> = t.labels.iter().step_by(2).copied().collect();
    let wide = pseudo(rows, 9);
    let mut c = small(kind);
    c.tasks = tasks;
    c.cross_layers = 2;
    let mut m = Model::new(c).unwrap();
    let b = ModelBatch {
        rows,
        emb: &t.emb,
        wide: &wide,
        dense: &t.dense,
        labels: &labels,
        weights,
        sequences: &[],
    };
    let mut d_emb = vec![0.0; t.emb.len()];
    let mut d_wide = vec![0.0; rows];
    for _ in 0..5 {
        m.forward_backward(&b, &mut d_emb, &mut d_wide);
        m.apply_gradients();
    }
    let mut bits: Vec<u32> = m.param_values().iter().map(|v| v.to_bits()).collect();
    bits.extend(d_emb.iter().chain(&d_wide).map(|v| v.to_bits()));
    bits.push((m.loss(&b) as f32).to_bits());
    bits
}

#[test]
fn unit_sample_weights_and_one_default_task_are_bit_identical() {
    let ones = vec![1.0; 64];
    let ctr = || {
        vec![TaskSpec {
            name: "ctr".into(),
            weight: 1.0,
        }]
    };
    for kind in [
        ModelKind::Wdl,
        ModelKind::Deepfm,
        ModelKind::Dcn,
        ModelKind::Dcnv2,
        ModelKind::Dlrm,
    ] {
        let base = train_bits(kind, &[], Vec::new());
        assert_eq!(
            base,
            train_bits(kind, &ones, Vec::new()),
            "{kind:?} weights 1"
        );
        assert_eq!(base, train_bits(kind, &[], ctr()), "{kind:?} tasks [ctr]");
        let halves = vec![0.5; 64];
        assert_ne!(base, train_bits(kind, &halves, Vec::new()), "{kind:?}");
    }
}

#[test]
fn multitask_config_serde_and_validation() {
    let c: ModelConfig = serde_json::from_str(
        r#"{"kind":"mmoe","num_fields":2,"emb_dim":4,"tasks":[{"name":"ctr"},{"name":"cvr","weight":0.5}]}"#,
    )
    .unwrap();
    assert_eq!(c.kind, ModelKind::Mmoe);
    assert_eq!((c.experts, c.tower_hidden.clone()), (4, vec![64]));
    assert_eq!((c.layer_norm, c.dropout), (false, 0.0));
    assert_eq!(c.num_tasks(), 2);
    assert_eq!(c.task_names(), ["ctr", "cvr"]);
    assert_eq!((c.task_weight(0), c.task_weight(1)), (1.0, 0.5));
    c.validate().unwrap();
    // defaults are left out when serializing, set values round-trip
    let json = serde_json::to_string(&ModelConfig::new(ModelKind::Wdl, 2, 4, 0)).unwrap();
    for key in ["experts", "tower_hidden", "layer_norm", "dropout", "tasks"] {
        assert!(!json.contains(key), "{key} in {json}");
    }
    let mut e = small(ModelKind::Esmm);
    (e.layer_norm, e.dropout, e.experts) = (true, 0.25, 2);
    let back: ModelConfig = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
    assert_eq!(back, e);
    assert_eq!(ModelKind::Esmm.name(), "esmm");
    assert_eq!(ModelKind::Mmoe.name(), "mmoe");

    let err = |c: ModelConfig| match Model::new(c) {
        Err(NnError::Config(m)) => m,
        other => panic!("expected a config error, got {other:?}"),
    };
    let mut c = small(ModelKind::Esmm);
    c.tasks.pop();
    assert!(err(c).contains("exactly two tasks"));
    let mut c = small(ModelKind::Wdl);
    assert!(err(c.clone()).contains("tasks"), "wdl takes one task");
    c.tasks.truncate(1);
    Model::new(c).unwrap();
    let mut c = small(ModelKind::Mmoe);
    c.tasks[1].name = "ctr".into();
    assert!(err(c).contains("tasks[1].name"));
    let mut c = small(ModelKind::Mmoe);
    c.tasks[0].name.clear();
    assert!(err(c).contains("tasks[0].name"));
    for w in [-1.0, f32::NAN, f32::INFINITY] {
        let mut c = small(ModelKind::Mmoe);
        c.tasks[1].weight = w;
        assert!(err(c).contains("tasks[1].weight"));
    }
    let mut c = small(ModelKind::Mmoe);
    c.tasks.clear();
    Model::new(c).unwrap(); // one default task
    for bad in [1.0, -0.1, f32::NAN] {
        let mut c = small(ModelKind::Mmoe);
        c.dropout = bad;
        assert!(err(c).contains("dropout"));
    }
    let mut c = small(ModelKind::Mmoe);
    c.experts = 0;
    assert!(err(c).contains("experts"));
    let mut c = small(ModelKind::Mmoe);
    c.tower_hidden = vec![4, 0];
    assert!(err(c).contains("tower_hidden"));
    for kind in [ModelKind::Wdl, ModelKind::Dcnv2] {
        let mut c = small(kind);
        c.tasks.clear();
        c.layer_norm = true;
        assert!(err(c.clone()).contains("layer_norm"));
        c.layer_norm = false;
        c.dropout = 0.1;
        assert!(err(c).contains("dropout"));
    }
}
