//! `--tensorboard DIR` of the cluster commands: `sparta launch` gives it to every worker, and
//! each writes its own run, DIR/worker-<rank>, read back here with `sparta_board::read`.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cmd, gen, json, s, Proc};
use sparta_board::read::{scalars, Scalar};

/// The event files of `run`.
fn event_files(run: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(run)
        .unwrap_or_else(|e| panic!("{}: {e}", run.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("events.out.tfevents."))
        })
        .collect()
}

#[test]
fn launch_tensorboard_writes_one_run_per_worker() {
    let dir = tempfile::tempdir().unwrap();
    let train = gen(dir.path(), "train.tsv", 4000, 1);
    let (board, out) = (dir.path().join("board"), dir.path().join("job.json"));
    let mut c = cmd(&["launch", "--ps", "1", "--workers", "2"]);
    c.args(["--model", "wdl", "--batch-size", "256", "--threads", "1"])
        .args(["--reader-threads", "1", "--quiet", "--train", s(&train)])
        .args(["--tensorboard", s(&board), "--tensorboard-every-steps", "2"])
        .args(["--summary-json", s(&out)]);
    let (ok, log) = Proc::start(c).wait(Duration::from_secs(300));
    assert!(ok, "{log}");
    let job = json(&out);
    let mut runs: Vec<String> = std::fs::read_dir(&board)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    runs.sort();
    assert_eq!(runs, ["worker-0", "worker-1"]);
    let mut rows_total = 0.0;
    for run in &runs {
        let files = event_files(&board.join(run));
        assert_eq!(files.len(), 1, "{run}: {files:?}");
        let all = scalars(&files[0]).unwrap();
        let rows: Vec<&Scalar> = all.iter().filter(|x| x.tag == "train/rows").collect();
        assert!(rows.len() >= 2, "{run}: {all:?}");
        // Every 2 steps, then the last step (unless it was just written).
        let steps: Vec<i64> = rows.iter().map(|x| x.step).collect();
        let last = *steps.last().unwrap();
        let want: Vec<i64> = (1..=last).filter(|s| s % 2 == 0 || *s == last).collect();
        assert_eq!(steps, want, "{run}");
        assert!(
            all.iter().any(|x| x.tag == "train/samples_per_sec"),
            "{run}"
        );
        // A worker's tables live on the PS shards: no table series.
        assert!(!all.iter().any(|x| x.tag.starts_with("table/")), "{run}");
        rows_total += f64::from(rows.last().unwrap().value);
    }
    assert_eq!(rows_total, job["train_rows"].as_f64().unwrap(), "{job}");
}
