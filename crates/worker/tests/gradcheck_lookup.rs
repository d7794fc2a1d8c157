//! Finite-difference gradient checks of the lookup's backward pass (`step::scatter`): the row
//! gradients it sums per distinct id through ids, weighted bags (sum, mean, sqrtn pooling), a
//! sequence sharing its table with an id feature, and the wide sum, against the change of the
//! model's loss when one pulled weight moves.

use sparta_core::dedup::Deduper;
use sparta_core::{JobConfig, LocalStore};
use sparta_data::ids::{feature_id, missing_id};
use sparta_data::Batch;
use sparta_nn::{Model, ModelBatch};
use sparta_worker::step::{lookup, regather, scatter, Lookup};

/// Four tables of dims 4, 8, 32 and 64 (three physical tables and the wide one); `item` is
/// shared by an id and a sequence; `tags` is a weighted bag.
fn job(kind: &str, pooling: &str) -> sparta_core::Job {
    let text = format!(
        r#"
[data]
format = "custom"
[data.schema]
columns = [
  {{ name = "label", kind = "label" }},
  {{ name = "price", kind = "dense" }},
  {{ name = "user", kind = "sparse" }},
  {{ name = "item", kind = "sparse" }},
  {{ name = "tags", kind = "multi_sparse", separator = "|" }},
  {{ name = "hist", kind = "multi_sparse", separator = "|" }},
]
[model]
kind = "{kind}"
hidden = [16, 8]
[train]
threads = 1
seed = 7
[embedding]
init = {{ type = "uniform", low = -0.5, high = 0.5 }}
[wide]
init = {{ type = "uniform", low = -0.5, high = 0.5 }}
[[tables]]
name = "user"
dim = 32
[[tables]]
name = "item"
dim = 64
[[tables]]
name = "tag"
dim = 8
[[tables]]
name = "price_bucket"
dim = 4
[[features]]
name = "user"
kind = "id"
table = "user"
[[features]]
name = "item"
kind = "id"
table = "item"
[[features]]
name = "tags"
kind = "bag"
table = "tag"
weighted = true
pooling = "{pooling}"
[[features]]
name = "hist"
kind = "sequence"
table = "item"
max_len = 3
[[features]]
name = "price_bucket"
column = "price"
kind = "numeric"
transform = "buckets"
boundaries = [1.0, 10.0]
table = "price_bucket"
[[features]]
name = "price"
kind = "numeric"
"#
    );
    JobConfig::from_toml(&text).unwrap().validate().unwrap()
}

/// Three rows built by hand (slot order: user, item, tags, hist, price_bucket). Items repeat
/// across the id and the sequence (shared rows), tags repeat inside and across rows.
fn batch(job: &sparta_core::Job) -> Batch {
    let tag = |name: &str| job.features.table(name).unwrap().tag;
    let (u, i, t, p) = (tag("user"), tag("item"), tag("tag"), tag("price_bucket"));
    let id = |tag: u8, v: &str| feature_id(tag, v.as_bytes());
    // (slot ids, weights) per row.
    let rows: Vec<Vec<Vec<(u64, f32)>>> = vec![
        vec![
            vec![(id(u, "u1"), 1.0)],
            vec![(id(i, "i1"), 1.0)],
            vec![(id(t, "a"), 0.5), (id(t, "b"), 2.0), (id(t, "a"), 1.5)],
            vec![(id(i, "i2"), 1.0), (id(i, "i1"), 1.0), (id(i, "i3"), 1.0)],
            vec![((p as u64) << 56 | 2, 1.0)],
        ],
        vec![
            vec![(id(u, "u2"), 1.0)],
            vec![(id(i, "i2"), 1.0)],
            vec![(id(t, "c"), -0.7)],
            vec![(missing_id(i), 1.0)],
            vec![((p as u64) << 56 | 1, 1.0)],
        ],
        vec![
            vec![(id(u, "u1"), 1.0)],
            vec![(id(i, "i3"), 1.0)],
            vec![(id(t, "b"), 1.0), (id(t, "c"), 0.25)],
            vec![(id(i, "i3"), 1.0), (id(i, "i3"), 1.0)],
            vec![((p as u64) << 56 | 3, 1.0)],
        ],
    ];
    let mut b = Batch::empty(5, 1);
    for (r, slots) in rows.iter().enumerate() {
        b.labels.push((r % 2) as f32);
        b.dense.push(0.3 * r as f32 - 0.2);
        for s in slots {
            for &(k, w) in s {
                b.ids.push(k);
                b.weights.push(w);
            }
            b.offsets.push(b.ids.len() as u32);
        }
        b.rows += 1;
    }
    b
}

fn loss(model: &mut Model, l: &Lookup, d_emb: &mut [f32], d_wide: &mut [f32]) -> f64 {
    let b = &l.batch;
    let mb = ModelBatch {
        rows: b.rows,
        emb: &l.emb,
        wide: &l.wide_sum,
        dense: &b.dense,
        labels: &b.labels,
        weights: &[],
        sequences: &[],
    };
    let v = model.forward_backward(&mb, d_emb, d_wide) as f64;
    model.zero_gradients();
    v
}

#[allow(clippy::needless_range_loop)] // perturbs l.rows[t][i] while reading grads[t][i]
fn check(kind: &str, pooling: &str) {
    let job = job(kind, pooling);
    let f = &job.features;
    let wide = usize::from(kind != "dcn");
    assert_eq!(
        f.physical.len(),
        4 + wide,
        "four tables of four dims (+ wide)"
    );
    let store = LocalStore::from_configs(&f.table_configs()).unwrap();
    let mut model = Model::new(job.model.clone()).unwrap();
    let mut l = Lookup::default();
    lookup(&store, &mut Deduper::new(), f, batch(&job), &mut l, true).unwrap();
    assert_eq!(l.sequences.len(), 1);
    assert_eq!(l.sequences[0].lengths, vec![3, 1, 2]);
    let mut d_emb = vec![0.0; l.emb.len()];
    let mut d_wide = vec![0.0; l.batch.rows];
    loss(&mut model, &l, &mut d_emb, &mut d_wide);
    let unique = l.unique.clone();
    let mut grads = Vec::new();
    scatter(f, &l, &unique, &d_emb, &d_wide, &[], 1.0, &mut grads);

    let eps = 1e-2f32;
    let (mut de, mut dw) = (d_emb.clone(), d_wide.clone());
    let mut checked = 0;
    let mut worst = 0.0f64;
    for t in 0..f.physical.len() {
        for i in 0..l.rows[t].len() {
            let orig = l.rows[t][i];
            l.rows[t][i] = orig + eps;
            regather(f, &mut l);
            let up = loss(&mut model, &l, &mut de, &mut dw);
            l.rows[t][i] = orig - eps;
            regather(f, &mut l);
            let down = loss(&mut model, &l, &mut de, &mut dw);
            l.rows[t][i] = orig;
            let numeric = (up - down) / (2.0 * eps as f64);
            let analytic = grads[t][i] as f64;
            let err = (numeric - analytic).abs() / (1e-3 + numeric.abs().max(analytic.abs()));
            worst = worst.max(err);
            assert!(
                err < 2e-2,
                "{kind}/{pooling}: table {} value {i}: numeric {numeric:.6} analytic {analytic:.6}",
                f.physical[t].config.name
            );
            checked += 1;
        }
    }
    regather(f, &mut l);
    // Every row of every deep table was reached by some gradient (a wide row of an id seen only
    // in the history, which is not wide, gets none: the check above covers it).
    for (t, g) in grads.iter().enumerate() {
        if Some(t) == f.wide_table {
            continue;
        }
        let dim = f.physical[t].config.dim;
        for (r, row) in g.chunks(dim).enumerate() {
            assert!(
                row.iter().any(|&x| x != 0.0),
                "{kind}/{pooling}: table {} row {r} got no gradient",
                f.physical[t].config.name
            );
        }
    }
    assert!(checked > 300, "{checked}");
    eprintln!("{kind}/{pooling}: {checked} weights, worst relative error {worst:.2e}");
}

#[test]
fn wdl_through_weighted_sum_bags_sequences_and_wide() {
    check("wdl", "sum");
}

#[test]
fn wdl_through_mean_pooling() {
    check("wdl", "mean");
}

#[test]
fn dcn_through_sqrtn_pooling() {
    check("dcn", "sqrtn");
}
