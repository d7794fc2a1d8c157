//! Learning a toy problem, determinism, config serde/validation and parameter round trips.

mod common;

use common::pseudo;
use sparta_nn::metrics::auc;
use sparta_nn::{DenseOptimizer, Model, ModelBatch, ModelConfig, ModelKind, NnError};

fn toy(rows: usize, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let (f, d, nd) = (2, 4, 2);
    let emb = pseudo(rows * f * d, seed);
    let dense = pseudo(rows * nd, seed + 1);
    let wide = vec![0.0; rows];
    // separable: sign of a fixed linear function of the inputs
    let labels = (0..rows)
        .map(|r| {
            let s = emb[r * f * d] - emb[r * f * d + 5] + dense[r * nd];
            (s > 0.0) as u8 as f32
        })
        .collect();
    (emb, wide, dense, labels)
}

fn small(kind: ModelKind, seed: u64) -> ModelConfig {
    let mut c = ModelConfig::new(kind, 2, 4, 2);
    c.hidden = vec![16, 8];
    c.cross_layers = 2;
    c.seed = seed;
    c.optimizer = DenseOptimizer::Adam {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };
    c
}

#[test]
fn toy_problem_is_learned_by_every_model() {
    let rows = 256;
    let (emb, wide, dense, labels) = toy(rows, 100);
    let (temb, twide, tdense, tlabels) = toy(rows, 200);
    for kind in [ModelKind::Wdl, ModelKind::Deepfm, ModelKind::Dcn] {
        let mut m = Model::new(small(kind, 1)).unwrap();
        let b = ModelBatch {
            rows,
            emb: &emb,
            wide: &wide,
            dense: &dense,
            labels: &labels,
        };
        let mut d_emb = vec![0.0; emb.len()];
        let mut d_wide = vec![0.0; rows];
        let first = m.forward_backward(&b, &mut d_emb, &mut d_wide);
        m.apply_gradients();
        let mut last = first;
        for _ in 0..300 {
            last = m.forward_backward(&b, &mut d_emb, &mut d_wide);
            m.apply_gradients();
        }
        let tb = ModelBatch {
            rows,
            emb: &temb,
            wide: &twide,
            dense: &tdense,
            labels: &tlabels,
        };
        let mut p = vec![0.0; rows];
        m.predict(&tb, &mut p);
        let a = auc(&tlabels, &p);
        assert!(last < 0.5 * first, "{kind:?}: loss {first} -> {last}");
        assert!(a > 0.95, "{kind:?}: held-out auc {a}");
    }
}

fn train_params(seed: u64, steps: usize) -> Vec<u32> {
    let rows = 64;
    let (emb, wide, dense, labels) = toy(rows, 5);
    let mut m = Model::new(small(ModelKind::Deepfm, seed)).unwrap();
    let b = ModelBatch {
        rows,
        emb: &emb,
        wide: &wide,
        dense: &dense,
        labels: &labels,
    };
    let mut d_emb = vec![0.0; emb.len()];
    let mut d_wide = vec![0.0; rows];
    for _ in 0..steps {
        m.forward_backward(&b, &mut d_emb, &mut d_wide);
        m.apply_gradients();
    }
    m.param_values().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn same_seed_single_thread_is_bit_identical() {
    assert_eq!(train_params(3, 10), train_params(3, 10));
    assert_ne!(train_params(3, 10), train_params(4, 10));
}

#[test]
fn config_serde_defaults_and_validation() {
    let c: ModelConfig =
        serde_json::from_str(r#"{"kind":"dcn","num_fields":26,"emb_dim":16,"num_dense":13}"#)
            .unwrap();
    assert_eq!(c.kind, ModelKind::Dcn);
    assert_eq!(c.hidden, vec![512, 256, 128]);
    assert_eq!(c.cross_layers, 3);
    assert_eq!(c.threads, 1);
    assert_eq!(
        c.optimizer,
        DenseOptimizer::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8
        }
    );
    c.validate().unwrap();
    let o: DenseOptimizer =
        serde_json::from_str(r#"{"type":"adagrad","lr":0.1,"initial_accumulator":0.1,"eps":1e-7}"#)
            .unwrap();
    assert!(matches!(o, DenseOptimizer::Adagrad { .. }));
    assert!(
        serde_json::from_str::<DenseOptimizer>(r#"{"type":"sgd","lr":0.1,"momentum":0.9}"#)
            .is_err()
    );
    assert!(
        serde_json::from_str::<ModelConfig>(r#"{"num_fields":1,"emb_dim":1,"bogus":1}"#).is_err()
    );
    let mut bad = c.clone();
    bad.threads = 0;
    assert!(matches!(Model::new(bad), Err(NnError::Config(_))));
    let mut bad = c.clone();
    bad.optimizer = DenseOptimizer::Sgd { lr: -1.0 };
    assert!(bad.validate().is_err());
    let mut bad = c;
    bad.hidden = vec![8, 0];
    assert!(bad.validate().is_err());
}

#[test]
fn params_round_trip_and_shapes() {
    let mut a = Model::new(small(ModelKind::Dcn, 1)).unwrap();
    let b = Model::new(small(ModelKind::Dcn, 2)).unwrap();
    let total: usize = a
        .params()
        .iter()
        .map(|(_, shape, v)| {
            assert_eq!(shape.iter().product::<usize>(), v.len());
            v.len()
        })
        .sum();
    assert_eq!(total, a.num_params());
    for (name, _, v) in b.params() {
        a.set_params(&name, v).unwrap();
    }
    assert_eq!(a.param_values(), b.param_values());
    assert!(matches!(
        a.set_params("nope", &[1.0]),
        Err(NnError::UnknownParam(_))
    ));
    assert!(matches!(
        a.set_params("head.bias", &[1.0, 2.0]),
        Err(NnError::Length { .. })
    ));
    let st = a.optimizer_state().clone();
    a.set_optimizer_state(st).unwrap();
    // wdl: 429 -> 512 -> 256 -> 128 -> 1 plus the wide bias
    let w = Model::new(ModelConfig::new(ModelKind::Wdl, 26, 16, 13)).unwrap();
    assert_eq!(
        w.num_params(),
        1 + 429 * 512 + 512 + 512 * 256 + 256 + 256 * 128 + 128 + 128 + 1
    );
    assert!((w.flops_per_sample() - 2.288e6).abs() < 1e4);
}
