//! The job summary: the workers' summaries of the run that finished, merged, with the job's
//! totals over every run (a rollback restarts the workers, whose own counts then cover only
//! the last run) and one entry per run.

use serde_json::{json, Value};

use crate::drive::Run;
use crate::supervise::Restarts;

/// Merges the workers' summaries of the last run (`per_worker`, worker 0 first: it evaluated)
/// into the job summary.
///
/// Job totals: `samples_trained` (the final model's lineage), `train_rows` (samples trained by
/// this job: `samples_trained` less those of the checkpoint the job resumed from),
/// `train_seconds` (the failed runs' wall time plus the last run's training time) and
/// `train_samples_per_sec` over them. `runs` has each run's own figures.
pub fn job_summary(
    per_worker: Vec<Value>,
    runs: &[Run],
    restarts: Restarts,
    rollbacks: u32,
    wall: f64,
) -> Value {
    // Worker 0's summary holds the job's training totals, its own figures under `worker`.
    let num = |v: &Value, k: &str| (v["worker"][k].as_f64().or(v[k].as_f64())).unwrap_or(0.0);
    let sum = |k: &str| per_worker.iter().map(|v| num(v, k)).sum::<f64>();
    let mut job = per_worker.first().cloned().unwrap_or_else(|| json!({}));
    let last_rows = sum("train_rows");
    let last_secs = per_worker
        .iter()
        .map(|v| num(v, "train_seconds"))
        .fold(0.0, f64::max);
    let samples = sum("samples_trained") as u64;
    let base = runs
        .first()
        .and_then(|r| r.resumed_from.as_ref())
        .map_or(0, |r| r.samples);
    let rows = samples.saturating_sub(base);
    let failed_secs: f64 = runs
        .iter()
        .filter(|r| r.ended_by.is_some())
        .map(|r| r.wall_seconds)
        .sum();
    let secs = failed_secs + last_secs;
    job["train_rows"] = rows.into();
    job["samples_trained"] = samples.into();
    job["steps"] = (sum("steps") as u64).into();
    // Files of a followed directory: each worker skips (bad) or misses (late) on its own.
    job["bad_files"] = (sum("bad_files") as u64).into();
    job["late_files_skipped"] = (sum("late_files_skipped") as u64).into();
    job["train_seconds"] = secs.into();
    job["train_samples_per_sec"] = (rows as f64 / secs.max(1e-9)).into();
    job["loop_samples_per_sec"] = sum("loop_samples_per_sec").into();
    job["job_wall_seconds"] = wall.into();
    let bytes: f64 = per_worker
        .iter()
        .map(|v| {
            v["wire"]["bytes_sent"].as_f64().unwrap_or(0.0)
                + v["wire"]["bytes_received"].as_f64().unwrap_or(0.0)
        })
        .sum();
    job["wire"]["bytes_per_sample"] = (bytes / last_rows.max(1.0)).into();
    job["restarts"] = json!({ "ps": restarts.ps, "worker": restarts.worker });
    job["rollbacks"] = rollbacks.into();
    let n = runs.len();
    job["runs"] = runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut v = json!({
                "resumed_from": r.resumed_from.as_ref().map(|c| c.name.clone()),
                "samples_at_start": r.resumed_from.as_ref().map_or(0, |c| c.samples),
                "checkpoint_shards": r.resumed_from.as_ref().map(|c| c.shards),
                "wall_seconds": r.wall_seconds,
                "ended_by": r.ended_by,
            });
            if i + 1 == n {
                v["train_rows"] = (last_rows as u64).into();
                v["train_seconds"] = last_secs.into();
                v["train_samples_per_sec"] = (last_rows / last_secs.max(1e-9)).into();
            }
            v
        })
        .collect();
    job["per_worker"] = Value::Array(per_worker);
    job
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drive::ResumePoint;

    fn worker(rows: u64, samples: u64, secs: f64) -> Value {
        json!({
            "train_rows": rows,
            "samples_trained": samples,
            "steps": rows / 100,
            "train_seconds": secs,
            "test_auc": 0.75,
            "wire": {"bytes_sent": 1000.0, "bytes_received": 1000.0},
        })
    }

    fn resumed(samples: u64) -> Option<ResumePoint> {
        Some(ResumePoint {
            id: 1,
            name: "ckpt-1".into(),
            samples,
            shards: 2,
        })
    }

    #[test]
    fn one_clean_run_reports_its_own_figures() {
        let runs = [Run {
            resumed_from: None,
            wall_seconds: 11.0,
            ended_by: None,
        }];
        let j = job_summary(
            vec![worker(300, 300, 10.0), worker(300, 300, 8.0)],
            &runs,
            Restarts::default(),
            0,
            11.0,
        );
        assert_eq!(j["train_rows"], 600);
        assert_eq!(j["samples_trained"], 600);
        assert_eq!(j["train_seconds"], 10.0);
        assert_eq!(j["train_samples_per_sec"], 60.0);
        assert_eq!(j["test_auc"], 0.75);
        assert_eq!(j["runs"][0]["train_rows"], 600);
        assert_eq!(j["per_worker"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn worker_0s_job_totals_are_not_counted_again() {
        // Worker 0 writes the job's totals, its own figures under `worker`.
        let mut w0 = worker(600, 600, 10.0);
        w0["worker"] = worker(300, 300, 10.0);
        let runs = [Run {
            resumed_from: None,
            wall_seconds: 11.0,
            ended_by: None,
        }];
        let j = job_summary(
            vec![w0, worker(300, 300, 8.0)],
            &runs,
            Restarts::default(),
            0,
            11.0,
        );
        assert_eq!(j["train_rows"], 600);
        assert_eq!(j["samples_trained"], 600);
        assert_eq!(j["steps"], 6);
    }

    #[test]
    fn after_a_rollback_the_totals_cover_the_job_and_the_runs_each_run() {
        // Run 0 failed after 4 s; run 1 resumed from a checkpoint of 200 samples and trained
        // the remaining 400 (the workers' own counts cover run 1 only).
        let runs = [
            Run {
                resumed_from: None,
                wall_seconds: 4.0,
                ended_by: Some("ps1 exited with signal: 9".into()),
            },
            Run {
                resumed_from: resumed(200),
                wall_seconds: 7.0,
                ended_by: None,
            },
        ];
        let j = job_summary(
            vec![worker(200, 300, 6.0), worker(200, 300, 5.0)],
            &runs,
            Restarts {
                ps: 1,
                worker: 0,
                coordinator: 0,
            },
            1,
            11.5,
        );
        assert_eq!(j["samples_trained"], 600);
        assert_eq!(j["train_rows"], 600, "every sample the job trained");
        assert_eq!(j["train_seconds"], 10.0);
        assert_eq!(j["train_samples_per_sec"], 60.0);
        assert_eq!(j["restarts"], json!({"ps": 1, "worker": 0}));
        let r = j["runs"].as_array().unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0]["ended_by"], "ps1 exited with signal: 9");
        assert!(r[0]["train_rows"].is_null());
        assert_eq!(r[1]["resumed_from"], "ckpt-1");
        assert_eq!(r[1]["samples_at_start"], 200);
        assert_eq!(r[1]["train_rows"], 400);
    }

    #[test]
    fn a_job_resumed_from_an_earlier_one_counts_only_what_it_trained() {
        let runs = [Run {
            resumed_from: resumed(500),
            wall_seconds: 2.0,
            ended_by: None,
        }];
        let j = job_summary(
            vec![worker(100, 600, 1.0)],
            &runs,
            Restarts::default(),
            0,
            2.0,
        );
        assert_eq!(j["samples_trained"], 600);
        assert_eq!(j["train_rows"], 100);
    }
}
