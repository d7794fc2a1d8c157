//! TensorBoard scalars as a step hook (`sparta train --tensorboard DIR`): training rows and
//! throughput, every embedded table's rows, bytes and evictions, and progressive validation
//! when the run keeps it, written into one run directory with [`sparta_board::EventWriter`].

use std::path::Path;
use std::time::Instant;

use sparta_board::{BoardError, EventWriter};
use sparta_core::CoreError;
use sparta_nn::metrics::{EvalSummary, Progressive};
use sparta_table::Table;

use crate::online::{HookContext, StepHook};

/// Steps between two writes unless told otherwise.
pub const DEFAULT_EVERY_STEPS: u64 = 100;

/// Writes scalars every `every_steps` steps and once at the end of training (unless the last
/// step was just written), each at `step` = the training step (counting steps before a
/// resume):
///
/// * `train/rows`: rows trained (counting rows before a resume);
/// * `train/samples_per_sec`: rows since the previous write over the seconds since it (from
///   the second write of a run on: the first has no previous write of this run);
/// * `table/<name>/rows`, `table/<name>/bytes` (all memory held), `table/<name>/evicted`
///   (rows evicted so far, every reason) for every table of this process (embedded training;
///   a cluster worker's tables live on the PS shards, so it writes none);
/// * with progressive validation: `progressive/<task>/{auc,logloss,calibration}` over the
///   window and `progressive_cumulative/<task>/...` since the start; NaN values (a window
///   with one class) are left out.
pub struct BoardHook {
    writer: EventWriter,
    every_steps: u64,
    last_step: Option<u64>,
    /// When the previous write happened and the rows then.
    last: Option<(Instant, u64)>,
}

impl BoardHook {
    /// Creates a new event file in `run_dir` (created when missing); writes every
    /// `every_steps` steps (at least 1).
    pub fn create(run_dir: &Path, every_steps: u64) -> Result<Self, CoreError> {
        if every_steps == 0 {
            return Err(CoreError::Config(
                "TensorBoard: every_steps must be at least 1".into(),
            ));
        }
        let writer = EventWriter::create(run_dir).map_err(training)?;
        tracing::info!(
            "TensorBoard scalars every {every_steps} steps to {}",
            writer.path().display()
        );
        Ok(BoardHook {
            writer,
            every_steps,
            last_step: None,
            last: None,
        })
    }

    /// The event file.
    pub fn path(&self) -> &Path {
        self.writer.path()
    }

    fn write(&mut self, ctx: &HookContext<'_>) -> Result<(), CoreError> {
        let step = i64::try_from(ctx.step).unwrap_or(i64::MAX);
        let now = Instant::now();
        let w = &mut self.writer;
        w.scalar("train/rows", step, ctx.rows as f64)
            .map_err(training)?;
        if let Some((then, rows)) = self.last {
            let secs = now.duration_since(then).as_secs_f64();
            if secs > 0.0 {
                let rate = ctx.rows.saturating_sub(rows) as f64 / secs;
                w.scalar("train/samples_per_sec", step, rate)
                    .map_err(training)?;
            }
        }
        for (name, table) in ctx.tables {
            write_table(w, name, table, step).map_err(training)?;
        }
        if let Some(p) = ctx.progressive {
            write_progressive(w, p, step).map_err(training)?;
        }
        w.flush().map_err(training)?;
        self.last = Some((now, ctx.rows));
        self.last_step = Some(ctx.step);
        Ok(())
    }
}

fn training(e: BoardError) -> CoreError {
    CoreError::Training(e.to_string())
}

/// One table's rows, bytes and evicted rows.
fn write_table(w: &mut EventWriter, name: &str, t: &Table, step: i64) -> Result<(), BoardError> {
    let e = t.evictions();
    let evicted = e.idle_steps + e.idle_seconds + e.min_count + e.memory_limit;
    w.scalar(&format!("table/{name}/rows"), step, t.len() as f64)?;
    w.scalar(&format!("table/{name}/bytes"), step, t.bytes() as f64)?;
    w.scalar(&format!("table/{name}/evicted"), step, evicted as f64)
}

/// Every task's window and cumulative AUC, log loss and calibration, NaN left out.
fn write_progressive(w: &mut EventWriter, p: &Progressive, step: i64) -> Result<(), BoardError> {
    for t in &p.tasks {
        for (prefix, m) in [
            ("progressive", &t.window),
            ("progressive_cumulative", &t.cumulative),
        ] {
            for (metric, v) in metrics(m) {
                if !v.is_nan() {
                    w.scalar(&format!("{prefix}/{}/{metric}", t.task), step, v)?;
                }
            }
        }
    }
    Ok(())
}

fn metrics(m: &EvalSummary) -> [(&'static str, f64); 3] {
    [
        ("auc", m.auc),
        ("logloss", m.logloss),
        ("calibration", m.calibration),
    ]
}

impl StepHook for BoardHook {
    fn due(&mut self, step: u64) -> bool {
        // Asked again at the same step while the input waits: nothing new to write.
        self.last_step != Some(step) && step.is_multiple_of(self.every_steps)
    }

    fn after_step(&mut self, ctx: &HookContext<'_>) -> Result<(), CoreError> {
        self.write(ctx)
    }

    fn finish(&mut self, ctx: &HookContext<'_>) -> Result<(), CoreError> {
        if self.last_step != Some(ctx.step) {
            self.write(ctx)?;
        }
        self.writer.flush().map_err(training)
    }

    fn needs_tables(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use sparta_board::read::{scalars, Scalar};
    use sparta_core::JobConfig;
    use sparta_data::synth::{write_synthetic, SynthConfig};
    use sparta_nn::metrics::TaskProgressive;

    use super::*;
    use crate::{RunOptions, Trainer};

    fn job() -> sparta_core::Job {
        let mut cfg = JobConfig::default();
        cfg.data.batch_size = 64;
        cfg.data.reader_threads = 1;
        cfg.train.threads = 1;
        cfg.validate().unwrap()
    }

    fn data(dir: &Path, rows: u64) -> std::path::PathBuf {
        let mut text = Vec::new();
        let cfg = SynthConfig {
            rows,
            seed: 1,
            ..SynthConfig::default()
        };
        write_synthetic(&cfg, &mut text).unwrap();
        let p = dir.join("train.tsv");
        std::fs::write(&p, text).unwrap();
        p
    }

    /// The single event file of `dir`.
    fn event_file(dir: &Path) -> std::path::PathBuf {
        let files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        files.into_iter().next().unwrap()
    }

    /// The (step, value) of every scalar of `tag`, in file order.
    fn series(s: &[Scalar], tag: &str) -> Vec<(i64, f32)> {
        s.iter()
            .filter(|x| x.tag == tag)
            .map(|x| (x.step, x.value))
            .collect()
    }

    #[test]
    fn board_hook_is_due_every_k_steps_once_per_step() {
        let dir = tempfile::tempdir().unwrap();
        let mut h = BoardHook::create(dir.path(), 3).unwrap();
        let due: Vec<u64> = (1..=10).filter(|&s| h.due(s)).collect();
        assert_eq!(due, vec![3, 6, 9]);
        assert!(BoardHook::create(dir.path(), 0).is_err());
    }

    #[test]
    fn board_hook_writes_rows_rate_and_tables_at_every_k_steps_and_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let train = data(dir.path(), 1000);
        let run = dir.path().join("run");
        let mut t = Trainer::embedded(job()).unwrap();
        t.add_hook(Box::new(BoardHook::create(&run, 5).unwrap()))
            .unwrap();
        let summary = t
            .run(&RunOptions {
                train: vec![train],
                ..RunOptions::default()
            })
            .unwrap();
        assert_eq!(summary.steps, 16); // 1000 rows in batches of 64
        let s = scalars(&event_file(&run)).unwrap();
        let rows = series(&s, "train/rows");
        let steps: Vec<i64> = rows.iter().map(|r| r.0).collect();
        assert_eq!(steps, vec![5, 10, 15, 16]);
        assert_eq!(rows[0].1, 5.0 * 64.0);
        assert_eq!(rows.last().unwrap().1, 1000.0);
        let rate = series(&s, "train/samples_per_sec");
        assert_eq!(
            rate.iter().map(|r| r.0).collect::<Vec<_>>(),
            vec![10, 15, 16]
        );
        assert!(rate.iter().all(|r| r.1 > 0.0), "{rate:?}");
        for (name, table) in t.tables() {
            let rows = series(&s, &format!("table/{name}/rows"));
            assert_eq!(rows.len(), 4, "{name}");
            assert_eq!(rows.last().unwrap().1, table.len() as f32, "{name}");
            assert!(rows.last().unwrap().1 > 0.0);
            let bytes = series(&s, &format!("table/{name}/bytes"));
            assert_eq!(bytes.last().unwrap().1, table.bytes() as f32, "{name}");
            let evicted = series(&s, &format!("table/{name}/evicted"));
            assert_eq!(evicted.last().unwrap().1, 0.0, "{name}");
        }
        // The trainer's progressive validation reaches the hook: window and cumulative AUC
        // of the one task (a point per write where defined).
        for tag in ["progressive/ctr/auc", "progressive_cumulative/ctr/auc"] {
            let auc = series(&s, tag);
            assert!(!auc.is_empty(), "{tag}");
            assert!(
                auc.iter().all(|v| (0.0..=1.0).contains(&v.1)),
                "{tag}: {auc:?}"
            );
        }
    }

    fn summary(auc: f64, logloss: f64, calibration: f64) -> EvalSummary {
        EvalSummary {
            auc,
            logloss,
            positive_rate: 0.5,
            mean_prediction: 0.5,
            calibration,
            rows: 10,
            gauc: None,
        }
    }

    #[test]
    fn board_hook_writes_progressive_metrics_per_task_leaving_out_nan() {
        let dir = tempfile::tempdir().unwrap();
        let t = Trainer::embedded(job()).unwrap();
        let progressive = Progressive {
            window: 100,
            step: 7,
            tasks: vec![
                TaskProgressive {
                    task: "ctr".into(),
                    window: summary(0.75, 0.5, 1.25),
                    cumulative: summary(0.5, 0.25, 1.0),
                },
                TaskProgressive {
                    task: "cvr".into(),
                    window: summary(f64::NAN, 0.125, f64::NAN),
                    cumulative: summary(0.625, 0.375, 2.0),
                },
            ],
        };
        let mut h = BoardHook::create(dir.path(), 100).unwrap();
        let ctx = HookContext {
            step: 7,
            rows: 448,
            job_toml: t.job_toml(),
            model: t.model(),
            tables: &[],
            progressive: Some(&progressive),
        };
        h.finish(&ctx).unwrap();
        // Finishing again at the same step writes nothing more.
        h.finish(&ctx).unwrap();
        let s = scalars(h.path()).unwrap();
        let got: Vec<(&str, f32)> = s
            .iter()
            .inspect(|x| assert_eq!(x.step, 7))
            .map(|x| (x.tag.as_str(), x.value))
            .collect();
        assert_eq!(
            got,
            vec![
                ("train/rows", 448.0),
                ("progressive/ctr/auc", 0.75),
                ("progressive/ctr/logloss", 0.5),
                ("progressive/ctr/calibration", 1.25),
                ("progressive_cumulative/ctr/auc", 0.5),
                ("progressive_cumulative/ctr/logloss", 0.25),
                ("progressive_cumulative/ctr/calibration", 1.0),
                ("progressive/cvr/logloss", 0.125),
                ("progressive_cumulative/cvr/auc", 0.625),
                ("progressive_cumulative/cvr/logloss", 0.375),
                ("progressive_cumulative/cvr/calibration", 2.0),
            ]
        );
    }
}
