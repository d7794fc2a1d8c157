//! One training step split into the stages a pipeline overlaps:
//! lookup (dedup + partition, pull, gather; in `sparta-core`) -> dense (forward/backward) ->
//! push (scatter, push). Each stage fills a reusable buffer, so a steady-state step allocates
//! nothing.

use sparta_core::dedup::UniqueIds;
use sparta_core::features::Features;
use sparta_core::pool;
use sparta_core::step::{all_finite, all_within, sequence_inputs, task_labels};
use sparta_core::store::{DenseStore, PushFrom, SparseStore};
use sparta_core::CoreError;
use sparta_nn::{Model, ModelBatch};

pub use sparta_core::step::{lookup, predict, regather, Lookup};

/// Gradients of one step, summed per distinct id: the input of the push stage.
#[derive(Default)]
pub struct Gradients {
    /// Distinct ids and their (shard, class) grouping (moved from the lookup).
    pub unique: UniqueIds,
    /// What the store kept of their pull (moved from the lookup).
    pub kept: Vec<Vec<u32>>,
    /// Row gradients per physical table, laid out as the lookup's pulled rows.
    pub rows: Vec<Vec<f32>>,
    /// Mean loss of the batch.
    pub loss: f32,
    /// Samples in the batch.
    pub samples: usize,
}

/// Scratch space of the dense stage.
#[derive(Default)]
pub struct DenseScratch {
    d_emb: Vec<f32>,
    d_wide: Vec<f32>,
    /// Per attended sequence block: dLoss/d(values).
    d_seq: Vec<Vec<f32>>,
    labels: Vec<f32>,
    /// The last step's probabilities, scored by its forward pass before the update.
    probs: Vec<f32>,
    grads: Vec<f32>,
}

impl DenseScratch {
    /// The probabilities the last step's forward pass scored before training on its rows
    /// (progressive validation): `rows * tasks`, row-major.
    pub fn scored(&self) -> &[f32] {
        &self.probs
    }
}

/// Forward + backward + dense update; scatters the sparse gradients per distinct id into `out`
/// (scaled by `sparse_scale`). Moves the lookup's `unique` and `kept` into `out`.
pub fn dense(
    model: &mut Model,
    dense_store: Option<&dyn DenseStore>,
    features: &Features,
    lookup: &mut Lookup,
    scratch: &mut DenseScratch,
    sparse_scale: f32,
    out: &mut Gradients,
) -> Result<f32, CoreError> {
    check_pulled(features, lookup)?;
    let b = &lookup.batch;
    scratch.d_emb.resize(lookup.emb.len(), 0.0);
    scratch.d_wide.resize(b.rows, 0.0);
    scratch.probs.resize(b.rows * model.num_tasks(), 0.0);
    let sequences = sequence_inputs(features, lookup);
    let attends = model.attends();
    if attends {
        scratch.d_seq.resize_with(sequences.len(), Vec::new);
        for (d, s) in scratch.d_seq.iter_mut().zip(&sequences) {
            d.resize(s.values.len(), 0.0);
        }
    } else {
        scratch.d_seq.clear();
    }
    let mb = ModelBatch {
        rows: b.rows,
        emb: &lookup.emb,
        wide: &lookup.wide_sum,
        dense: &b.dense,
        labels: task_labels(b, &features.task_labels, &mut scratch.labels),
        weights: &b.sample_weights,
        sequences: &sequences,
    };
    let mut d_seq: Vec<&mut [f32]> = scratch.d_seq.iter_mut().map(|v| &mut v[..]).collect();
    let loss = model.forward_backward_scored(
        &mb,
        &mut scratch.d_emb,
        &mut scratch.d_wide,
        &mut d_seq,
        &mut scratch.probs,
    );
    drop(d_seq);
    // Refuse a diverged step before anything is applied: no NaN reaches the dense parameters,
    // the tables or a checkpoint.
    if !loss.is_finite() {
        model.zero_gradients();
        return Err(CoreError::Diverged(format!("the loss is {loss}")));
    }
    let diverged = |model: &mut Model, what: &str| {
        model.zero_gradients();
        CoreError::Diverged(format!("non-finite gradients of {what} (loss {loss})"))
    };
    if !all_finite(model.gradients()) {
        return Err(diverged(model, "the dense layers"));
    }
    // The sparse gradients first: the scatter checks `d_emb` as it reads it (where it reads
    // it once as it is), and nothing it writes reaches a table before the push.
    std::mem::swap(&mut out.unique, &mut lookup.unique);
    std::mem::swap(&mut out.kept, &mut lookup.kept);
    let emb_finite = scatter(
        features,
        lookup,
        &out.unique,
        &scratch.d_emb,
        &scratch.d_wide,
        &scratch.d_seq,
        sparse_scale,
        &mut out.rows,
    );
    if !emb_finite.unwrap_or_else(|| all_finite(&scratch.d_emb))
        || !all_finite(&scratch.d_wide)
        || !scratch.d_seq.iter().all(|d| all_finite(d))
    {
        std::mem::swap(&mut out.unique, &mut lookup.unique);
        std::mem::swap(&mut out.kept, &mut lookup.kept);
        return Err(diverged(model, "the embeddings"));
    }
    match dense_store {
        None => model.apply_gradients(),
        Some(ds) => {
            scratch.grads.clear();
            scratch.grads.extend_from_slice(model.gradients());
            model.zero_gradients();
            ds.push_pull(&scratch.grads, model.param_values_mut())?;
        }
    }
    out.loss = loss;
    out.samples = lookup.batch.rows;
    Ok(loss)
}

pub use sparta_core::step::MAX_EMBEDDING_MAGNITUDE;

/// Refuses a step whose pulled rows are non-finite or exploded, naming the table and its
/// optimizer (with its learning rate): nothing of the step is applied. The lookup's gather
/// usually checked `emb` already ([`Lookup::emb_in_range`]); else it is checked here.
fn check_pulled(features: &Features, lookup: &Lookup) -> Result<(), CoreError> {
    let ok = |x: &f32| x.abs() <= MAX_EMBEDDING_MAGNITUDE;
    let bad_table = |physical: usize, logical: Option<usize>, value: f32| {
        let p = &features.physical[physical];
        let named = match logical {
            Some(l) if features.tables[l].name != p.config.name => format!(
                "table {:?} (stored in {:?})",
                features.tables[l].name, p.config.name
            ),
            _ => format!("table {:?}", p.config.name),
        };
        CoreError::Diverged(format!(
            "the rows of {named} diverged: a pulled value is {value:e} (non-finite or above \
             {MAX_EMBEDDING_MAGNITUDE:e} in magnitude) under its optimizer {:?}; lower its \
             learning rate",
            p.config.optimizer
        ))
    };
    if !lookup.emb_in_range && !all_within(&lookup.emb, MAX_EMBEDDING_MAGNITUDE) {
        let w = features.emb_width.max(1);
        for row in lookup.emb.chunks(w) {
            for s in &features.slots {
                let Some(v) = row.get(s.offset..s.offset + s.dim) else {
                    continue;
                };
                if let Some(&x) = v.iter().find(|x| !ok(x)) {
                    return Err(bad_table(s.physical, Some(s.table), x));
                }
            }
        }
    }
    if let (Some(w), Some(&x)) = (features.wide_table, lookup.wide_sum.iter().find(|x| !ok(x))) {
        return Err(bad_table(w, None, x));
    }
    Ok(())
}

/// The backward pass of the lookup: sums each occurrence's gradient (of its slot's pooled
/// vector, `d_emb`, and of the wide sum, `d_wide`) into its distinct id's row gradient, through
/// the slot's pooling and the item weights, scaled by `scale`. `d_seq` (empty unless the model
/// attends) holds, per sequence with a target, the gradient of each position's row: those
/// sequences take it instead of their pooled vector's. `rows` is resized to the lookup's pulled
/// rows and zeroed first; the pooling's backward itself is [`sparta_core::pool::scatter`],
/// and so is what it returns: whether `d_emb` is finite, where it checked.
#[allow(clippy::too_many_arguments)]
pub fn scatter(
    features: &Features,
    lookup: &Lookup,
    unique: &UniqueIds,
    d_emb: &[f32],
    d_wide: &[f32],
    d_seq: &[Vec<f32>],
    scale: f32,
    rows: &mut Vec<Vec<f32>>,
) -> Option<bool> {
    rows.resize_with(features.physical.len(), Vec::new);
    for (g, pulled) in rows.iter_mut().zip(&lookup.rows) {
        g.clear();
        g.resize(pulled.len(), 0.0);
    }
    let occ = lookup.occurrences(&unique.inverse);
    pool::scatter(features, &occ, d_emb, d_wide, d_seq, scale, rows)
}

/// Pushes a step's gradients to the tables (one request per shard for all tables), with what
/// the store kept of their pull.
pub fn push(
    store: &dyn SparseStore,
    features: &Features,
    grads: &Gradients,
) -> Result<(), CoreError> {
    let from = PushFrom::per_table(&grads.rows, features);
    store.push_kept(&grads.unique.parts(), &from, &grads.kept)
}
