//! A trainer's figures on `/metrics` while it trains: a cluster worker's (`sparta worker
//! --metrics-listen`, in the store's registry next to its RPCs) and an embedded trainer's
//! (`sparta train --metrics-listen`, [`serve_embedded`]). A detached thread copies, once a
//! second, the reader's counts (bad and late files, rows, bytes, source waits; a topic's lag per
//! partition and records) and the trainer's live status (step, samples, loss, progressive
//! metrics, last checkpoint and export) into the registry; it ends when the registry is
//! dropped.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sparta_proto::metrics::Metrics;
use sparta_proto::training_metrics::{ProgressiveStatus, TrainingStatus};
use sparta_proto::ProtoError;
use sparta_worker::{LiveStatus, Trainer};

/// How often the figures are copied.
const EVERY: Duration = Duration::from_secs(1);

/// Starts copying `trainer`'s figures into `metrics` (see the module docs).
pub fn publish(trainer: &mut Trainer, metrics: &Arc<Metrics>) {
    let stats = trainer.input_stats();
    #[cfg(feature = "kafka")]
    let kafka = trainer.kafka_lag();
    let live = trainer.live_status();
    let metrics: Weak<Metrics> = Arc::downgrade(metrics);
    let spawned = std::thread::Builder::new()
        .name("sparta-live-metrics".into())
        .spawn(move || {
            while let Some(metrics) = metrics.upgrade() {
                if let Some(s) = stats.lock().clone() {
                    metrics.set_input_files(s.bad_files(), s.late_files_skipped());
                    metrics.set_input(
                        [s.rows(), s.bytes(), s.source_bytes(), s.source_retries()],
                        s.source_wait_seconds(),
                    );
                }
                #[cfg(feature = "kafka")]
                if let Some((topic, lag)) = kafka.lock().clone() {
                    metrics.set_kafka(&topic, &lag.lag(), lag.rows());
                }
                let status = training_status(&live.lock());
                metrics.set_training(&status);
                drop(metrics);
                std::thread::sleep(EVERY);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("live training metrics off: {e}");
    }
}

/// The trainer's live status as the metrics take it.
pub fn training_status(s: &LiveStatus) -> TrainingStatus {
    let mut progressive = Vec::new();
    for t in s.progressive.iter().flat_map(|p| &p.tasks) {
        for (over, m) in [("window", &t.window), ("cumulative", &t.cumulative)] {
            progressive.push(ProgressiveStatus {
                task: t.task.clone(),
                over,
                auc: m.auc,
                logloss: m.logloss,
                calibration: m.calibration,
                gauc: m.gauc.map(|(g, _)| g),
                rows: m.rows as u64,
            });
        }
    }
    TrainingStatus {
        step: s.step,
        samples: s.samples,
        loss: s.loss,
        progressive,
        last_checkpoint: s.last_checkpoint.as_ref().map(|c| (c.unix_seconds, c.step)),
        last_export_version: s.last_export_version,
    }
}

/// An embedded trainer's metrics server: keep it for as long as it should serve.
pub struct EmbeddedMetrics {
    /// The bound address.
    pub addr: SocketAddr,
    _metrics: Arc<Metrics>,
    _rt: tokio::runtime::Runtime,
}

/// Serves `trainer`'s figures (role `train`) on `addr` (port 0: a free one), `/metrics` and
/// `/health`, from a runtime of one thread.
pub fn serve_embedded(trainer: &mut Trainer, addr: &str) -> Result<EmbeddedMetrics, ProtoError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sparta-metrics")
        .enable_all()
        .build()
        .map_err(|source| ProtoError::Io {
            what: "starting the metrics runtime".into(),
            source,
        })?;
    let metrics = Arc::new(Metrics::new("train"));
    let bound = rt.block_on(sparta_proto::metrics::serve_metrics(
        addr,
        Arc::clone(&metrics),
    ))?;
    publish(trainer, &metrics);
    Ok(EmbeddedMetrics {
        addr: bound,
        _metrics: metrics,
        _rt: rt,
    })
}

#[cfg(test)]
mod tests {
    use sparta_nn::metrics::{EvalSummary, Progressive, TaskProgressive};
    use sparta_worker::LastCheckpoint;

    use super::*;

    #[test]
    fn the_status_carries_every_task_over_both_spans() {
        let m = |auc| EvalSummary {
            auc,
            logloss: 0.4,
            positive_rate: 0.5,
            mean_prediction: 0.5,
            calibration: 1.0,
            rows: 10,
            gauc: None,
        };
        let s = LiveStatus {
            step: 5,
            samples: 50,
            loss: 0.4,
            progressive: Some(Progressive {
                window: 10,
                step: 5,
                tasks: vec![TaskProgressive {
                    task: "ctr".into(),
                    window: m(0.7),
                    cumulative: m(0.6),
                }],
            }),
            last_checkpoint: Some(LastCheckpoint {
                id: "3".into(),
                step: 4,
                unix_seconds: 10.0,
            }),
            last_export_version: None,
        };
        let t = training_status(&s);
        assert_eq!((t.step, t.samples), (5, 50));
        let aucs: Vec<_> = t.progressive.iter().map(|p| (p.over, p.auc)).collect();
        assert_eq!(aucs, [("window", 0.7), ("cumulative", 0.6)]);
        assert_eq!(t.last_checkpoint, Some((10.0, 4)));
    }
}
