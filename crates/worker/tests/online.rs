//! Online learning: training on a followed directory, stopping and resuming at the exact line
//! (bit-identical to an uninterrupted run), eviction in the loop keeping tables bounded while
//! ids churn, and step hooks seeing a consistent model with the pipeline on.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sparta_worker::{
    CoreError, FollowOptions, HookContext, Job, JobConfig, RunOptions, StepHook, Summary, Trainer,
};

fn job(text: &str) -> Job {
    JobConfig::from_toml(text).unwrap().validate().unwrap()
}

/// A Criteo-layout job small enough for debug builds; `extra` goes into `[train]`.
fn criteo_job(extra: &str) -> Job {
    criteo_job_threads(2, extra)
}

fn criteo_job_threads(reader_threads: usize, extra: &str) -> Job {
    job(&format!(
        "[data]\nbatch_size = 100\nreader_threads = {reader_threads}\n[model]\n\
         hidden = [32, 16]\n[train]\nthreads = 1\nseed = 3\n{extra}"
    ))
}

/// Writes `rows` synthetic Criteo rows to `dir/name` the way a shipper does (temporary
/// dotfile, then rename).
fn ship_synthetic(dir: &Path, name: &str, rows: u64, seed: u64) -> PathBuf {
    let tmp = dir.join(format!(".{name}"));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).unwrap());
    sparta_data::write_synthetic(
        &sparta_data::SynthConfig {
            rows,
            seed,
            model_seed: 7,
            vocab_scale: 0.01,
        },
        &mut f,
    )
    .unwrap();
    std::io::Write::flush(&mut f).unwrap();
    drop(f);
    let p = dir.join(name);
    std::fs::rename(tmp, &p).unwrap();
    p
}

fn follow_opts(input: &Path, stop_file: &Path, stop: Arc<AtomicBool>) -> RunOptions {
    RunOptions {
        progress: false,
        follow: Some(FollowOptions {
            poll: Duration::from_millis(10),
            settle: Duration::ZERO,
            stop_file: Some(stop_file.to_path_buf()),
            stop,
            ..FollowOptions::new(input)
        }),
        ..RunOptions::default()
    }
}

/// Dense parameters and every table row (weights and optimizer state) as bits, by key.
type Snapshot = (Vec<u32>, Vec<(String, Vec<(u64, Vec<u32>)>)>);

fn snapshot(t: &Trainer) -> Snapshot {
    let dense = t
        .model()
        .param_values()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    let tables = t
        .tables()
        .iter()
        .map(|(name, table)| {
            let mut rows = Vec::new();
            table.for_each_row(|k, row, _| {
                rows.push((k, row.iter().map(|x| x.to_bits()).collect()))
            });
            rows.sort();
            (name.clone(), rows)
        })
        .collect();
    (dense, tables)
}

/// Sets the stop flag after step `at`, as a SIGTERM would.
struct StopAt {
    at: u64,
    flag: Arc<AtomicBool>,
}

impl StepHook for StopAt {
    fn due(&mut self, step: u64) -> bool {
        step == self.at
    }
    fn after_step(&mut self, _: &HookContext<'_>) -> Result<(), CoreError> {
        self.flag.store(true, Ordering::Relaxed);
        Ok(())
    }
    fn finish(&mut self, _: &HookContext<'_>) -> Result<(), CoreError> {
        Ok(())
    }
}

fn run_until(trainer: &mut Trainer, input: &Path, stop_file: &Path, at: Option<u64>) -> Summary {
    let flag = Arc::new(AtomicBool::new(false));
    if let Some(at) = at {
        let hook = StopAt {
            at,
            flag: Arc::clone(&flag),
        };
        trainer.add_hook(Box::new(hook)).unwrap();
    }
    trainer.run(&follow_opts(input, stop_file, flag)).unwrap()
}

#[test]
fn stopped_and_resumed_follow_equals_uninterrupted() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    for (i, seed) in [11u64, 12, 13].iter().enumerate() {
        ship_synthetic(&input, &format!("h{i:02}.tsv"), 1000, *seed);
    }
    // The shipper is done: every file present is read, then training ends.
    let stop_file = dir.path().join("STOP");
    std::fs::write(&stop_file, b"").unwrap();

    let mut whole = Trainer::embedded(criteo_job("")).unwrap();
    let s = run_until(&mut whole, &input, &stop_file, None);
    assert_eq!((s.train_rows, s.steps), (3000, 30));
    let end = s.input_position.unwrap();
    assert_eq!(end.file, "h02.tsv");
    assert_eq!(end.rows_consumed, 3000);
    assert_eq!(
        end.byte_offset,
        std::fs::metadata(input.join("h02.tsv")).unwrap().len()
    );

    let ckpt = dir.path().join("ckpt");
    let ck = format!(
        "checkpoint_dir = {:?}\ncheckpoint_every_steps = 5\ncheckpoint_full_every = 2\n",
        ckpt.to_str().unwrap()
    );
    // Stopped (signal) after step 17, in the middle of the second file: final checkpoint there.
    let mut first = Trainer::embedded(criteo_job(&ck)).unwrap();
    let s1 = run_until(&mut first, &input, &stop_file, Some(17));
    assert_eq!((s1.steps, s1.train_rows), (17, 1700));
    let p1 = s1.input_position.unwrap();
    assert_eq!(p1.file, "h01.tsv");
    assert!(p1.byte_offset > 0);
    assert_eq!(p1.rows_consumed, 1700);

    // Resumed, then "killed" after step 23: the checkpoint written at the stop is lost, so
    // the next start resumes from step 20 and trains steps 21..23 again from their input.
    let mut second = Trainer::embedded_resume(
        criteo_job(&ck),
        &ckpt,
        sparta_checkpoint::ResumePolicy::Required,
    )
    .unwrap();
    let s2 = run_until(&mut second, &input, &stop_file, Some(23));
    assert_eq!(
        (s2.steps, s2.train_rows, s2.samples_trained),
        (6, 600, 2300)
    );
    let newest = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .max()
        .unwrap();
    std::fs::remove_dir_all(newest).unwrap();

    let mut third = Trainer::embedded_resume(
        criteo_job(&ck),
        &ckpt,
        sparta_checkpoint::ResumePolicy::Required,
    )
    .unwrap();
    let s3 = run_until(&mut third, &input, &stop_file, None);
    assert_eq!(
        s3.train_rows, 1000,
        "resumed at step 20: rows 2000.. remain"
    );
    assert_eq!(s3.samples_trained, 3000);
    assert_eq!(s3.input_position.unwrap(), end);
    assert!(
        snapshot(&third) == snapshot(&whole),
        "stopped + resumed training must equal the uninterrupted run bit for bit"
    );
}

#[test]
fn a_follow_job_refuses_epochs_and_max_rows() {
    let dir = tempfile::tempdir().unwrap();
    let stop = dir.path().join("STOP");
    for extra in ["epochs = 2", "max_rows = 10"] {
        let mut t = Trainer::embedded(criteo_job(extra)).unwrap();
        let e = t
            .run(&follow_opts(dir.path(), &stop, Arc::default()))
            .unwrap_err();
        assert!(
            e.to_string().contains(extra.split(' ').next().unwrap()),
            "{e}"
        );
    }
}

/// The embedding table after one step.
#[derive(Clone, Copy, Debug)]
struct Sample {
    rows: usize,
    wide_rows: usize,
    /// All bytes held (including the tombstone log of removed keys kept for deltas).
    bytes: usize,
    /// Slab slots ever handed out (live + free): the row memory.
    slab_slots: usize,
    index_capacity: usize,
}

/// Records the tables after every step.
#[derive(Clone, Default)]
struct Record(Arc<Mutex<Vec<Sample>>>);

impl StepHook for Record {
    fn due(&mut self, _: u64) -> bool {
        true
    }
    fn after_step(&mut self, ctx: &HookContext<'_>) -> Result<(), CoreError> {
        let st = ctx.tables[0].1.stats();
        self.0.lock().unwrap().push(Sample {
            rows: st.rows,
            wide_rows: ctx.tables.get(1).map_or(0, |t| t.1.len()),
            bytes: st.bytes,
            slab_slots: st.slab_slots,
            index_capacity: st.index_capacity,
        });
        Ok(())
    }
    fn finish(&mut self, _: &HookContext<'_>) -> Result<(), CoreError> {
        Ok(())
    }
}

const FILES: usize = 30;
const ROWS: usize = 100;
const BATCH: usize = 50;

/// A stream whose ids churn: every row has a new user id, every file 20 new item ids; 5 site
/// ids recur in every batch. Returns the per-step records and the summary.
fn churn(eviction: bool, pipeline: bool) -> (Vec<Sample>, Summary, Trainer) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    for f in 0..FILES {
        let text: String = (0..ROWS)
            .map(|r| {
                format!(
                    "{}\t{}\tu{f}_{r}\ti{f}_{}\ts{}\n",
                    (r % 3 == 0) as u8,
                    r % 7,
                    r % 20,
                    r % 5
                )
            })
            .collect();
        std::fs::write(input.join(format!("{f:04}.tsv")), text).unwrap();
    }
    let stop_file = input.join("STOP");
    std::fs::write(&stop_file, b"").unwrap();
    let eviction = if eviction {
        "eviction = { max_idle_steps = 4 }"
    } else {
        ""
    };
    let job = job(&format!(
        r#"
[data]
format = "custom"
batch_size = {BATCH}
reader_threads = 1
[data.schema]
columns = [
  {{ name = "click", kind = "label" }},
  {{ name = "x", kind = "dense" }},
  {{ name = "user", kind = "sparse" }},
  {{ name = "item", kind = "sparse" }},
  {{ name = "site", kind = "sparse" }},
]
[embedding]
dim = 8
shards = 1
{eviction}
[model]
hidden = [16]
[train]
threads = 1
pipeline = {pipeline}
"#
    ));
    let mut t = Trainer::embedded(job).unwrap();
    let rec = Record::default();
    t.add_hook(Box::new(rec.clone())).unwrap();
    let s = t
        .run(&follow_opts(&input, &stop_file, Arc::default()))
        .unwrap();
    let records = rec.0.lock().unwrap().clone();
    (records, s, t)
}

/// Distinct ids of the whole stream: users, items, sites.
const IDS: usize = FILES * ROWS + FILES * 20 + 5;

#[test]
fn eviction_keeps_tables_bounded_while_ids_churn() {
    let steps = FILES * ROWS / BATCH;
    let half = steps / 2;
    let max = |r: &[Sample], f: fn(&Sample) -> usize| r.iter().map(f).max().unwrap();
    let (grow, s, _) = churn(false, false);
    assert_eq!(grow.len(), steps);
    assert_eq!(s.evicted_rows, 0);
    assert_eq!(grow.last().unwrap().rows, IDS);
    assert!(
        max(&grow[half..], |r| r.slab_slots) > max(&grow[..half], |r| r.slab_slots)
            && max(&grow[half..], |r| r.bytes) > max(&grow[..half], |r| r.bytes),
        "without eviction the table grows"
    );

    for pipeline in [false, true] {
        let (bounded, s, t) = churn(true, pipeline);
        assert_eq!(bounded.len(), steps);
        // Rows pulled in the last 4 steps survive; older ones go at the next sweep. A step
        // brings at most 50 users + 20 items (+ 5 sites): the bound allows twice that window.
        let bound = 2 * 5 * (BATCH + 20) + 5;
        let worst = bounded
            .iter()
            .map(|r| r.rows.max(r.wide_rows))
            .max()
            .unwrap();
        assert!(
            worst <= bound,
            "{worst} rows > bound {bound} (pipeline {pipeline})"
        );
        // Freed slots are reused: the slab never holds more slots than the bound on rows.
        let slots = max(&bounded, |r| r.slab_slots);
        assert!(
            slots <= bound,
            "{slots} slab slots > bound {bound} (pipeline {pipeline})"
        );
        let emb = t.tables()[0].1.stats();
        if !pipeline {
            // The sequential loop is deterministic: row memory and index stop growing.
            for (what, f) in [
                (
                    "slab slots",
                    (|r: &Sample| r.slab_slots) as fn(&Sample) -> usize,
                ),
                ("index capacity", |r: &Sample| r.index_capacity),
            ] {
                assert!(
                    max(&bounded[half..], f) <= max(&bounded[..half], f),
                    "{what} kept growing with eviction: {:?}",
                    bounded.iter().map(f).collect::<Vec<_>>()
                );
            }
            // What still grows is the log of removed keys kept for deltas (16 bytes per
            // eviction, capped at MAX_TOMBSTONES entries by the table).
            let growth = bounded[steps - 1].bytes - bounded[half].bytes;
            assert!(
                growth <= 2 * 16 * emb.evicted as usize,
                "bytes grew by {growth} with {} evictions",
                emb.evicted
            );
        }
        // Every row ever created is either live or was evicted: nothing is lost or doubled.
        assert_eq!(emb.admitted as usize, IDS);
        assert_eq!(emb.evicted as usize + emb.rows, IDS);
        let wide = t.tables()[1].1.stats();
        assert_eq!(s.evicted_rows, emb.evicted + wide.evicted);
    }
}

/// Records (step, embedding version) whenever due (every third step).
#[derive(Clone, Default)]
struct Versions(Arc<Mutex<Vec<(u64, u64)>>>);

impl StepHook for Versions {
    fn due(&mut self, step: u64) -> bool {
        step.is_multiple_of(3)
    }
    fn after_step(&mut self, ctx: &HookContext<'_>) -> Result<(), CoreError> {
        let v = ctx.tables[0].1.version();
        self.0.lock().unwrap().push((ctx.step, v));
        Ok(())
    }
    fn finish(&mut self, ctx: &HookContext<'_>) -> Result<(), CoreError> {
        self.0
            .lock()
            .unwrap()
            .push((ctx.step, ctx.tables[0].1.version()));
        Ok(())
    }
}

#[test]
fn hooks_see_every_push_applied_with_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let train = ship_synthetic(dir.path(), "train.tsv", 2000, 5);
    let mut snaps = Vec::new();
    for (pipeline, staleness) in [(false, 1), (true, 1), (true, 0)] {
        // One parser thread: the same batches in the same order in every run.
        let mut t = Trainer::embedded(criteo_job_threads(
            1,
            &format!("pipeline = {pipeline}\npipeline_staleness = {staleness}"),
        ))
        .unwrap();
        let v = Versions::default();
        t.add_hook(Box::new(v.clone())).unwrap();
        let s = t
            .run(&RunOptions {
                train: vec![train.clone()],
                ..RunOptions::default()
            })
            .unwrap();
        assert_eq!(s.steps, 20);
        let seen = v.0.lock().unwrap().clone();
        // Steps 3, 6, ..., 18, then the end: one embedding push per step, all applied.
        assert_eq!(seen.len(), 7);
        for (step, version) in seen {
            assert_eq!(version, step, "pipeline {pipeline} staleness {staleness}");
        }
        snaps.push(snapshot(&t));
    }
    // Draining for hooks keeps the exact pipeline bit-identical to the sequential loop.
    assert!(snaps[2] == snaps[0]);
}
