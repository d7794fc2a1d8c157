//! Progressive validation: each batch is scored by the model before it trains on it. A second
//! trainer replays the sequential loop step by step (lookup, predict, dense, push: the same
//! functions in the same order, so the same model state before every batch) and records the
//! model's scores of each batch before training on it; the first trainer's progressive window,
//! holding every row of the run, must report exactly their AUC. Periodic evaluation and the
//! hooks' view of the report are checked on the same runs.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sparta_core::dedup::Deduper;
use sparta_data::{read_batches, write_synthetic, SynthConfig};
use sparta_nn::metrics::{auc, gauc, logloss};
use sparta_worker::step::{self, DenseScratch, Gradients, Lookup};
use sparta_worker::{CoreError, HookContext, JobConfig, RunOptions, StepHook, Trainer};

const ROWS: usize = 3_000;

fn data(dir: &Path, name: &str, seed: u64) -> PathBuf {
    let path = dir.join(name);
    let mut text = Vec::new();
    let synth = SynthConfig {
        rows: ROWS as u64,
        seed,
        ..SynthConfig::default()
    };
    write_synthetic(&synth, &mut text).unwrap();
    std::fs::write(&path, &text).unwrap();
    path
}

fn job(train_section: &str, window: u64) -> sparta_worker::Job {
    JobConfig::from_toml(&format!(
        "[data]\nbatch_size = 100\nreader_threads = 1\n[train]\nthreads = 1\ngauc_by = \"C1\"\n\
         {train_section}\n[metrics]\nwindow = {window}\n"
    ))
    .unwrap()
    .validate()
    .unwrap()
}

/// The scores of every training row by the model before it trained on the row's batch, with
/// the labels and the GAUC groups (first id of slot `C1`): the sequential loop, replayed.
fn scores_before_training(job: sparta_worker::Job, train: &Path) -> (Vec<f32>, Vec<f32>, Vec<u64>) {
    let slot = job.gauc_slot().unwrap();
    let mut t = Trainer::embedded(job.clone()).unwrap();
    let store = Arc::clone(t.store());
    let features = Arc::clone(&job.features);
    let (mut dedup, mut lookup, mut scratch, mut grads) = (
        Deduper::new(),
        Lookup::default(),
        DenseScratch::default(),
        Gradients::default(),
    );
    let (mut labels, mut probs, mut groups, mut out) = (vec![], vec![], vec![], vec![]);
    for batch in read_batches(&[train.to_path_buf()], &job.reader).unwrap() {
        let batch = batch.unwrap();
        let scale = job.raw.train.sparse_loss.scale(batch.rows);
        step::lookup(
            store.as_ref(),
            &mut dedup,
            &features,
            batch,
            &mut lookup,
            true,
        )
        .unwrap();
        step::predict(t.model_mut(), &features, &lookup, &mut out);
        let b = &lookup.batch;
        for (r, &p) in out.iter().enumerate().take(b.rows) {
            labels.push(b.labels[r * b.num_labels]);
            probs.push(p);
            groups.push(b.ids[b.offsets[r * b.num_fields + slot] as usize]);
        }
        step::dense(
            t.model_mut(),
            None,
            &features,
            &mut lookup,
            &mut scratch,
            scale,
            &mut grads,
        )
        .unwrap();
        step::push(store.as_ref(), &features, &grads).unwrap();
    }
    (labels, probs, groups)
}

/// Per hook call: the step, the report's window rows and the report's step.
type Calls = Arc<Mutex<Vec<(u64, Option<usize>, Option<u64>)>>>;

/// Records the report each due step's hook sees.
struct Seen(Calls);

impl StepHook for Seen {
    fn due(&mut self, step: u64) -> bool {
        step.is_multiple_of(7)
    }
    fn after_step(&mut self, ctx: &HookContext<'_>) -> Result<(), CoreError> {
        let p = ctx.progressive;
        let rows = p.map(|p| p.tasks[0].window.rows);
        self.0
            .lock()
            .unwrap()
            .push((ctx.step, rows, p.map(|p| p.step)));
        Ok(())
    }
    fn finish(&mut self, _ctx: &HookContext<'_>) -> Result<(), CoreError> {
        Ok(())
    }
}

fn check_exact(train_section: &str) {
    let dir = tempfile::tempdir().unwrap();
    let train = data(dir.path(), "train.tsv", 1);
    let test = data(dir.path(), "test.tsv", 2);
    let job = job(train_section, 1_000_000);
    let (labels, probs, groups) = scores_before_training(job.clone(), &train);
    assert_eq!(labels.len(), ROWS);

    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut t = Trainer::embedded(job).unwrap();
    t.add_hook(Box::new(Seen(Arc::clone(&seen)))).unwrap();
    let s = t
        .run(&RunOptions {
            train: vec![train],
            test: vec![test],
            eval_every_steps: 10,
            ..RunOptions::default()
        })
        .unwrap();
    let p = s.progressive.expect("a progressive report");
    assert_eq!((p.window, p.step), (1_000_000, s.steps));
    let task = &p.tasks[0];
    assert_eq!(task.window.rows, ROWS);
    assert_eq!(task.cumulative.rows, ROWS);
    // The window holds the whole run: its AUC is the exact AUC of the scores before training.
    assert_eq!(task.window.auc, auc(&labels, &probs));
    assert_eq!(task.window.logloss, logloss(&labels, &probs));
    let (g, used, _) = gauc(&groups, &labels, &probs);
    assert_eq!(task.window.gauc, Some((g, used)));
    assert!(task.window.auc > 0.5, "learnable data: {}", task.window.auc);
    // The streamed cumulative AUC is within the histogram's tolerance of it.
    assert!((task.cumulative.auc - task.window.auc).abs() < 1e-3);

    // Periodic evaluation after steps 10, 20, 30 (30 steps of 100 rows).
    assert_eq!(s.steps, 30);
    let steps: Vec<u64> = s.evaluations.iter().map(|e| e.step).collect();
    assert_eq!(steps, vec![10, 20, 30]);
    assert!(s.evaluations.iter().all(|e| e.rows == ROWS as u64));
    assert_eq!(s.evaluations[1].train_rows, 2_000);
    // The last one scored the final model on the same test set as the final evaluation.
    assert_eq!(s.evaluations[2].first.logloss, s.test_logloss.unwrap());

    // Hooks due after steps 7, 14, 21, 28 saw the report of that step.
    let seen = seen.lock().unwrap().clone();
    let want: Vec<_> = [7u64, 14, 21, 28]
        .iter()
        .map(|&k| (k, Some(k as usize * 100), Some(k)))
        .collect();
    assert_eq!(seen, want);
}

#[test]
fn the_sequential_loops_window_auc_is_the_exact_auc_of_the_scores_before_training() {
    check_exact("pipeline = false");
}

#[test]
fn the_exact_pipelines_window_auc_is_the_exact_auc_of_the_scores_before_training() {
    check_exact("pipeline = true\npipeline_staleness = 0");
}

#[test]
fn a_small_window_reports_the_last_rows_only() {
    let dir = tempfile::tempdir().unwrap();
    let train = data(dir.path(), "train.tsv", 3);
    let job = job("pipeline = false", 250);
    let (labels, probs, _) = scores_before_training(job.clone(), &train);
    let s = Trainer::embedded(job)
        .unwrap()
        .run(&RunOptions {
            train: vec![train],
            ..RunOptions::default()
        })
        .unwrap();
    let task = &s.progressive.unwrap().tasks[0];
    let tail = ROWS - 250;
    assert_eq!(task.window.rows, 250);
    assert_eq!(task.window.auc, auc(&labels[tail..], &probs[tail..]));
    assert_eq!(task.cumulative.rows, ROWS);
    assert!(s.evaluations.is_empty());
}

#[test]
fn periodic_evaluation_without_test_files_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let train = data(dir.path(), "train.tsv", 4);
    let e = Trainer::embedded(job("", 10))
        .unwrap()
        .run(&RunOptions {
            train: vec![train],
            eval_every_steps: 5,
            ..RunOptions::default()
        })
        .unwrap_err();
    assert!(e.to_string().contains("--test"), "{e}");
}
