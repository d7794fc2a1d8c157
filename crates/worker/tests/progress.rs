//! The trainer reports progress only through the handle it is given: a run with progress on
//! calls `start` with the input size, `update` per step with growing counts, then `finish`;
//! with progress off the handle hears nothing.

use std::sync::{Arc, Mutex};

use sparta_data::{write_synthetic, SynthConfig};
use sparta_worker::{JobConfig, Progress, RunOptions, Trainer};

#[derive(Default)]
struct Calls {
    starts: Vec<u64>,
    updates: Vec<(u64, u64)>,
    finishes: usize,
}

struct Recorder(Arc<Mutex<Calls>>);

impl Progress for Recorder {
    fn start(&mut self, total_bytes: u64) {
        self.0.lock().unwrap().starts.push(total_bytes);
    }
    fn update(&mut self, bytes: u64, samples: u64, _loss: f64, _stages: &str) {
        self.0.lock().unwrap().updates.push((bytes, samples));
    }
    fn finish(&mut self) {
        self.0.lock().unwrap().finishes += 1;
    }
}

fn trainer_with(calls: &Arc<Mutex<Calls>>) -> Trainer {
    let job = JobConfig::from_toml(
        "[data]\nbatch_size = 100\nreader_threads = 1\n[train]\nthreads = 1\nepochs = 2\n",
    )
    .unwrap()
    .validate()
    .unwrap();
    let mut t = Trainer::embedded(job).unwrap();
    t.set_progress(Box::new(Recorder(Arc::clone(calls))));
    t
}

#[test]
fn trainer_reports_through_its_progress_handle() {
    let dir = tempfile::tempdir().unwrap();
    let train = dir.path().join("train.tsv");
    let mut text = Vec::new();
    let synth = SynthConfig {
        rows: 1_000,
        ..SynthConfig::default()
    };
    write_synthetic(&synth, &mut text).unwrap();
    std::fs::write(&train, &text).unwrap();

    let calls = Arc::new(Mutex::new(Calls::default()));
    let summary = trainer_with(&calls)
        .run(&RunOptions {
            train: vec![train.clone()],
            progress: true,
            ..RunOptions::default()
        })
        .unwrap();
    let c = calls.lock().unwrap();
    // Two epochs over the file: the size counts twice.
    assert_eq!(c.starts, vec![2 * text.len() as u64]);
    assert_eq!(c.updates.len() as u64, summary.steps);
    assert_eq!(c.updates.last().unwrap().1, summary.train_rows);
    assert!(
        c.updates.windows(2).all(|w| w[0].1 < w[1].1),
        "samples grow"
    );
    assert_eq!(c.finishes, 1);
    drop(c);

    let quiet = Arc::new(Mutex::new(Calls::default()));
    trainer_with(&quiet)
        .run(&RunOptions {
            train: vec![train],
            progress: false,
            ..RunOptions::default()
        })
        .unwrap();
    let q = quiet.lock().unwrap();
    assert!(q.starts.is_empty() && q.updates.is_empty() && q.finishes == 0);
}
