//! The embedding pipeline: the lookup of batch t+1 (dedup, pull, gather) and the push of batch
//! t-1 run on one sparse thread while the dense stage of batch t runs, connected by queues that
//! hand reusable buffers back and forth.
//!
//! Staleness. The sparse thread works in one fixed order, `.. P(t-1) L(t+1) P(t) L(t+2) ..`
//! (P: push, L: lookup), so with `pipeline_staleness = 1` (the default) the rows batch t+1 is
//! trained with hold every earlier update except batch t's, whatever the threads' timing: a run
//! is reproducible, and it differs from the sequential loop only by that one batch of delay.
//! With `pipeline_staleness = 0` the dense stage waits for the previous push to finish and
//! re-pulls the rows the previous batches touched before using them, which gives exactly the
//! sequential semantics; the rest of the lookup stays overlapped.
//!
//! Checkpoints. With `quiesce_every = K`, after every K-th step of the job the pipeline
//! quiesces: the sparse thread does not pull the next batch (a pull creates rows and counts
//! admission sightings), the dense stage waits for every in-flight push, then calls
//! `on_step`, whose checkpoint holds exactly the first steps' updates and nothing of the
//! following batches; then the pipeline refills. `on_step` sees that step with nothing in flight
//! ([`StepCtl::quiescent`]), so a checkpoint it writes there is exact.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::Instant;

use hashbrown::HashSet;
use sparta_core::config::SparseLoss;
use sparta_core::dedup::Deduper;
use sparta_core::dedup::KeyParts;
use sparta_core::features::Features;
use sparta_core::store::{DenseStore, SparseStore};
use sparta_core::CoreError;
use sparta_data::{Batch, DataError};
use sparta_nn::Model;

use crate::step::{self, DenseScratch, Gradients, Lookup};
use crate::summary::StageSeconds;

/// What the dense stage reports per step.
pub struct StepReport {
    /// Mean loss.
    pub loss: f32,
    /// Samples in the step.
    pub samples: usize,
    /// Distinct ids in the step.
    pub keys: usize,
    /// Seconds per stage so far (all threads).
    pub stages: StageSeconds,
}

/// Stage seconds accumulated by the lookup and push threads, readable while they run.
#[derive(Default)]
struct StageClock {
    read_ns: AtomicU64,
    pull_ns: AtomicU64,
    push_ns: AtomicU64,
}

impl StageClock {
    fn add(counter: &AtomicU64, since: Instant) {
        counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn secs(counter: &AtomicU64) -> f64 {
        counter.load(Ordering::Relaxed) as f64 * 1e-9
    }
}

/// What `on_step` may do between two dense steps.
pub struct StepCtl<'a> {
    model: &'a Model,
    lookup: &'a Lookup,
    scratch: &'a DenseScratch,
    grads_back: &'a Receiver<Result<Gradients, CoreError>>,
    in_flight: &'a mut usize,
    free_grads: &'a mut Vec<Gradients>,
    wait: &'a mut f64,
    quiescent: bool,
}

impl StepCtl<'_> {
    /// The dense model after the step.
    pub fn model(&self) -> &Model {
        self.model
    }

    /// The step's batch (as looked up).
    pub fn batch(&self) -> &sparta_data::Batch {
        &self.lookup.batch
    }

    /// The probabilities the step's forward pass scored before training on the batch
    /// (`rows * tasks`; see [`DenseScratch::scored`]).
    pub fn scored(&self) -> &[f32] {
        self.scratch.scored()
    }

    /// Whether this is a quiescent point (`quiesce_every`): every push has landed and the
    /// lookup thread has pulled nothing of the following batches.
    pub fn quiescent(&self) -> bool {
        self.quiescent
    }

    /// Waits until every push sent so far has been applied to the store. The lookup thread
    /// may already have pulled the next batch (its new rows exist with their initial values).
    pub fn drain(&mut self) -> Result<(), CoreError> {
        let t = Instant::now();
        while *self.in_flight > 0 {
            let g = self
                .grads_back
                .recv()
                .map_err(|_| CoreError::Training("the push stage stopped unexpectedly".into()))??;
            *self.in_flight -= 1;
            self.free_grads.push(g);
        }
        *self.wait += t.elapsed().as_secs_f64();
        Ok(())
    }
}

/// Pipeline settings.
#[derive(Clone, Copy, Debug)]
pub struct PipelineConfig {
    /// 0: exact sequential semantics; 1: a batch's rows miss the previous batch's updates.
    pub staleness: u32,
    /// Loss reduction the sparse optimizers see.
    pub sparse_loss: SparseLoss,
    /// Quiesce after every job step that is a multiple of this (0: never), for checkpoints.
    pub quiesce_every: u64,
    /// Steps of the job done before this run (a resumed job's), to number steps.
    pub start_step: u64,
    /// Nice increment of the sparse thread (`[train] pipeline_nice`, see
    /// [`sparta_data::priority`]).
    pub nice: i32,
}

impl PipelineConfig {
    /// Whether the pipeline quiesces after the `n`-th step of this run.
    fn quiesce_after(&self, n: u64) -> bool {
        self.quiesce_every > 0 && (self.start_step + n).is_multiple_of(self.quiesce_every)
    }
}

/// Runs the pipelined training loop; `on_step` sees every finished dense step (in order) and
/// returns whether to go on; through its [`StepCtl`] it may drain the pushes in flight, and at a
/// quiescent point (see the module docs) nothing is in flight and nothing was pulled ahead.
/// Returns the per-stage seconds (read, pull and push on the sparse thread, dense and wait on
/// the calling thread).
pub fn run<I>(
    store: &dyn SparseStore,
    dense_store: Option<&dyn DenseStore>,
    model: &mut Model,
    features: &Features,
    batches: I,
    cfg: PipelineConfig,
    mut on_step: impl FnMut(&StepReport, &mut StepCtl<'_>) -> Result<bool, CoreError>,
) -> Result<StageSeconds, CoreError>
where
    I: Iterator<Item = Result<Batch, DataError>> + Send,
{
    // Buffers circulate: sparse thread -> dense (main) -> back to the sparse thread, for both
    // lookups and gradients. Two of each exist, which bounds the unbounded channels.
    let (ready_tx, ready_rx) = channel::<Result<Lookup, CoreError>>();
    let (lookup_back_tx, lookup_back_rx) = channel::<Lookup>();
    let (grads_tx, grads_rx) = channel::<Gradients>();
    let (grads_back_tx, grads_back_rx) = channel::<Result<Gradients, CoreError>>();
    let (refill_tx, refill_rx) = channel::<()>();
    for _ in 0..2 {
        lookup_back_tx.send(Lookup::default()).ok();
    }
    let mut stages = StageSeconds::default();
    let clock = StageClock::default();
    let clock = &clock;
    std::thread::scope(|s| -> Result<(), CoreError> {
        let sparse_thread = std::thread::Builder::new()
            .name("sparta-sparse".into())
            .spawn_scoped(s, move || {
                sparta_data::priority::lower_this_thread(cfg.nice);
                sparse_stage(
                    store,
                    features,
                    batches,
                    cfg,
                    SparseEnds {
                        ready: ready_tx,
                        free: lookup_back_rx,
                        grads: grads_rx,
                        back: grads_back_tx,
                        refill: refill_rx,
                    },
                    clock,
                )
            })
            .map_err(|e| CoreError::Training(format!("starting the sparse thread: {e}")))?;
        let result = dense_stage(
            store,
            dense_store,
            model,
            features,
            cfg,
            &ready_rx,
            &lookup_back_tx,
            &grads_tx,
            &grads_back_rx,
            &mut stages,
            clock,
            &mut on_step,
            &refill_tx,
        );
        drop(refill_tx);
        // Closing our ends stops the sparse thread.
        drop(ready_rx);
        drop(lookup_back_tx);
        drop(grads_tx);
        let _ = sparse_thread.join();
        stages.read = StageClock::secs(&clock.read_ns);
        stages.pull += StageClock::secs(&clock.pull_ns);
        stages.push = StageClock::secs(&clock.push_ns);
        // Surface a push failure that arrived after the last step.
        for r in grads_back_rx.try_iter() {
            r?;
        }
        result
    })?;
    Ok(stages)
}

/// The sparse thread's channel ends.
struct SparseEnds {
    /// Lookups to the dense stage.
    ready: Sender<Result<Lookup, CoreError>>,
    /// Lookup buffers back from the dense stage.
    free: Receiver<Lookup>,
    /// Gradients to push, in step order.
    grads: Receiver<Gradients>,
    /// Pushed gradient buffers (or the push's error) back to the dense stage.
    back: Sender<Result<Gradients, CoreError>>,
    /// The go-ahead after a quiescent point.
    refill: Receiver<()>,
}

/// The sparse thread: lookups and pushes in one fixed order, so that every run is the same.
/// After a start (or a quiescent point) it looks up two batches; from then on it pushes the
/// oldest step's gradients, then looks up the next batch: `.. P(t-1) L(t+1) P(t) L(t+2) ..`
/// while the dense stage runs step t, then t+1. The rows of batch t+1 thus hold every update
/// but batch t's, whatever the threads' timing.
fn sparse_stage<I>(
    store: &dyn SparseStore,
    features: &Features,
    mut batches: I,
    cfg: PipelineConfig,
    ends: SparseEnds,
    clock: &StageClock,
) where
    I: Iterator<Item = Result<Batch, DataError>>,
{
    let mut deduper = Deduper::new();
    let mut sent = 0u64;
    // Lookups handed out whose gradients are not pushed yet.
    let mut ahead = 0usize;
    let mut paused = false;
    let mut input_done = false;
    loop {
        if ahead < 2 && !paused && !input_done {
            let t = Instant::now();
            let next = batches
                .by_ref()
                .find(|b| !matches!(b, Ok(b) if b.rows == 0));
            StageClock::add(&clock.read_ns, t);
            let batch = match next {
                None => {
                    input_done = true;
                    continue;
                }
                Some(Err(e)) => {
                    // The dense stage stops at this error; until then, push what it sends.
                    let _ = ends.ready.send(Err(e.into()));
                    input_done = true;
                    continue;
                }
                Some(Ok(b)) => b,
            };
            let Ok(mut buf) = ends.free.recv() else {
                return;
            };
            let t1 = Instant::now();
            let r = step::lookup(store, &mut deduper, features, batch, &mut buf, true);
            StageClock::add(&clock.pull_ns, t1);
            if let Err(e) = r {
                let _ = ends.ready.send(Err(e));
                input_done = true;
                continue;
            }
            if ends.ready.send(Ok(buf)).is_err() {
                return;
            }
            sent += 1;
            ahead += 1;
            // Pull nothing more until the checkpoint after this step is written.
            paused = cfg.quiesce_after(sent);
            continue;
        }
        if ahead == 0 {
            if input_done {
                return;
            }
            // Quiescent: every push landed; wait for the checkpoint to be written.
            if ends.refill.recv().is_err() {
                return;
            }
            paused = false;
            continue;
        }
        let Ok(g) = ends.grads.recv() else { return };
        let t = Instant::now();
        let r = step::push(store, features, &g);
        StageClock::add(&clock.push_ns, t);
        ahead -= 1;
        let failed = r.is_err();
        if ends.back.send(r.map(|()| g)).is_err() || failed {
            return;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn dense_stage(
    store: &dyn SparseStore,
    dense_store: Option<&dyn DenseStore>,
    model: &mut Model,
    features: &Features,
    cfg: PipelineConfig,
    ready: &Receiver<Result<Lookup, CoreError>>,
    lookup_back: &std::sync::mpsc::Sender<Lookup>,
    grads_out: &Sender<Gradients>,
    grads_back: &Receiver<Result<Gradients, CoreError>>,
    stages: &mut StageSeconds,
    clock: &StageClock,
    on_step: &mut impl FnMut(&StepReport, &mut StepCtl<'_>) -> Result<bool, CoreError>,
    refill: &std::sync::mpsc::Sender<()>,
) -> Result<(), CoreError> {
    let mut steps = 0u64;
    let mut scratch = DenseScratch::default();
    let mut free_grads: Vec<Gradients> = vec![Gradients::default(), Gradients::default()];
    let mut in_flight = 0usize;
    // Keys pushed by the last two batches: a lookup can be pulled while both pushes are
    // pending (the lookup thread runs up to two batches ahead).
    let mut recent_keys: [KeySet; 2] = Default::default();
    let mut refresh = Refresh::default();
    let mut stepped = false;
    loop {
        let t0 = Instant::now();
        let Ok(msg) = ready.recv() else { break };
        let mut lookup = msg?;
        if cfg.staleness == 0 && stepped {
            // Exact mode: wait for the previous push (unless `on_step` drained it), then
            // re-pull what the previous two pushes touched.
            if in_flight > 0 {
                let g = grads_back.recv().map_err(|_| {
                    CoreError::Training("the push stage stopped unexpectedly".into())
                })??;
                in_flight -= 1;
                free_grads.push(g);
            }
            stages.wait += t0.elapsed().as_secs_f64();
            let t = Instant::now();
            refresh.run(store, features, &mut lookup, &recent_keys)?;
            stages.pull += t.elapsed().as_secs_f64();
        } else {
            stages.wait += t0.elapsed().as_secs_f64();
        }
        // Reclaim gradient buffers whose push finished.
        while free_grads.is_empty() {
            let t = Instant::now();
            let g = grads_back
                .recv()
                .map_err(|_| CoreError::Training("the push stage stopped unexpectedly".into()))??;
            in_flight -= 1;
            free_grads.push(g);
            stages.wait += t.elapsed().as_secs_f64();
        }
        let mut grads = free_grads.pop().unwrap_or_default();
        let t1 = Instant::now();
        let scale = cfg.sparse_loss.scale(lookup.batch.rows);
        let loss = step::dense(
            model,
            dense_store,
            features,
            &mut lookup,
            &mut scratch,
            scale,
            &mut grads,
        )?;
        stages.dense += t1.elapsed().as_secs_f64();
        if cfg.staleness == 0 {
            recent_keys.swap(0, 1);
            recent_keys[0].clear();
            recent_keys[0].extend(grads.unique.keys.iter().copied());
        }
        let report = StepReport {
            loss,
            samples: grads.samples,
            keys: grads.unique.keys.len(),
            stages: StageSeconds {
                read: StageClock::secs(&clock.read_ns),
                pull: stages.pull + StageClock::secs(&clock.pull_ns),
                dense: stages.dense,
                push: StageClock::secs(&clock.push_ns),
                wait: stages.wait,
            },
        };
        let t2 = Instant::now();
        if grads_out.send(grads).is_err() {
            return Err(CoreError::Training(
                "the push stage stopped unexpectedly".into(),
            ));
        }
        in_flight += 1;
        stages.wait += t2.elapsed().as_secs_f64();
        stepped = true;
        steps += 1;
        let quiescent = cfg.quiesce_after(steps);
        if quiescent {
            // The lookup thread is paused: once the pushes land, nothing is in flight.
            let t = Instant::now();
            while in_flight > 0 {
                let g = grads_back.recv().map_err(|_| {
                    CoreError::Training("the push stage stopped unexpectedly".into())
                })??;
                in_flight -= 1;
                free_grads.push(g);
            }
            stages.wait += t.elapsed().as_secs_f64();
        }
        let mut ctl = StepCtl {
            model: &*model,
            lookup: &lookup,
            scratch: &scratch,
            grads_back,
            in_flight: &mut in_flight,
            free_grads: &mut free_grads,
            wait: &mut stages.wait,
            quiescent,
        };
        let go_on = on_step(&report, &mut ctl)?;
        // The lookup buffer goes back once `on_step` has read the batch.
        let _ = lookup_back.send(lookup);
        if !go_on {
            break;
        }
        if quiescent {
            let _ = refill.send(());
        }
    }
    // Drain: every push must land before training reports done.
    while in_flight > 0 {
        let t = Instant::now();
        match grads_back.recv() {
            Ok(r) => {
                r?;
            }
            Err(_) => break,
        }
        in_flight -= 1;
        stages.wait += t.elapsed().as_secs_f64();
    }
    Ok(())
}

type KeySet = HashSet<u64, foldhash::fast::FixedState>;

/// Re-pulls the rows of a lookup that the two previous batches' pushes changed.
#[derive(Default)]
struct Refresh {
    keys: Vec<u64>,
    at: Vec<usize>,
    offsets: Vec<usize>,
    rows: Vec<Vec<f32>>,
}

impl Refresh {
    fn run(
        &mut self,
        store: &dyn SparseStore,
        features: &Features,
        lookup: &mut Lookup,
        touched: &[KeySet; 2],
    ) -> Result<(), CoreError> {
        self.keys.clear();
        self.at.clear();
        let u = &lookup.unique;
        self.offsets.clear();
        self.offsets.push(0);
        for part in 0..u.part_offsets.len().saturating_sub(1) {
            for i in u.part_offsets[part]..u.part_offsets[part + 1] {
                let k = &u.keys[i];
                if touched[0].contains(k) || touched[1].contains(k) {
                    self.keys.push(u.keys[i]);
                    self.at.push(i);
                }
            }
            self.offsets.push(self.keys.len());
        }
        if self.keys.is_empty() {
            return Ok(());
        }
        let parts = KeyParts {
            keys: &self.keys,
            offsets: &self.offsets,
            classes: u.classes.max(1),
        };
        // The first pull already created (or declined) these rows: read them without counting
        // another sighting for admission.
        sparta_core::step::pull_tables(store, features, &parts, &mut self.rows, false)?;
        // Copy back: the refreshed keys keep the (shard, class) order, so each table's rows are
        // numbered in the same order as in the lookup.
        let mut next = vec![0usize; features.physical.len()];
        for &i in &self.at {
            let c = features.class_of(lookup.unique.keys[i]);
            let deep = c / 2;
            let dim = features.physical[deep].config.dim;
            let (src, dst) = (next[deep] * dim, lookup.row_of[i] as usize * dim);
            lookup.rows[deep][dst..dst + dim].copy_from_slice(&self.rows[deep][src..src + dim]);
            next[deep] += 1;
            if let (Some(w), true) = (features.wide_table, c % 2 == 1) {
                lookup.rows[w][lookup.wide_row_of[i] as usize] = self.rows[w][next[w]];
                next[w] += 1;
            }
        }
        step::regather(features, lookup);
        Ok(())
    }
}
