//! A shard's side of cluster checkpoints: the checkpoint barrier, writing the shard's part
//! (its table parts with admission sketches, its dense slice with optimizer state) and
//! restoring it.
//!
//! # Protocol
//! Every `K` steps, each active worker calls `Checkpoint` on every shard after its step's
//! pushes returned, with its position (step, rows consumed); the coordinator (rank 0) also
//! sends the order (checkpoint id, full or incremental, chain links). A shard completes the
//! round when every worker that has not left has arrived: at that moment no worker can pull or
//! push (each is blocked in this round on some shard), so the shard's state is exactly the
//! state after those steps. The shard writes its part into the shared checkpoint storage and
//! answers every waiting worker with its part entries and all positions; the coordinator then
//! writes the manifest (the commit point) from all shards' answers. Rounds without the
//! coordinator (rank 0 has left) are skipped.
//!
//! A worker that finishes training calls `Checkpoint { leaving }`: its final position is
//! recorded and later rounds do not wait for it. Once every worker has left, the coordinator
//! asks for the end-of-job checkpoint (`Checkpoint { last }`): nothing trains any more, so the
//! shard writes its part at once.

use std::sync::Arc;

use parking_lot::Mutex;
use sparta_checkpoint::{CheckpointError, Checkpointer, PartEntry, TableEntry, WorkerState};
use tokio::sync::watch;

use crate::error::Refusal;
use crate::stall::{Missing, StallWatch};
use sparta_proto::ckpt::{part_name, worker_state, Order};
use sparta_proto::metrics::BarrierKind;
use sparta_proto::pb;

/// This shard's part of a serving export, written at a checkpoint barrier.
#[derive(Clone, Debug)]
pub struct ExportPart {
    /// The table files written (one per table, this shard's rows).
    pub files: Vec<sparta_export::TableFile>,
    /// The shard's dense slice at the barrier.
    pub dense: Vec<f32>,
}

/// What a shard wrote for one order.
#[derive(Clone, Debug)]
pub struct WrittenPart {
    /// The order it was written for.
    pub order: Order,
    /// Part entries of this shard.
    pub parts: Vec<PartEntry>,
    /// Their table configs.
    pub tables: Vec<TableEntry>,
    /// The export part, when one was ordered (`Err`: why it was not written; the checkpoint
    /// part stands).
    pub export: Option<Result<ExportPart, Refusal>>,
    /// The export order, when one was given.
    pub export_order: Option<pb::ExportOrder>,
}

/// The outcome of one round, shared by every worker that waited in it.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// The part was written.
    Written {
        /// What this shard wrote.
        part: WrittenPart,
        /// Every rank's position at the barrier.
        workers: Vec<WorkerState>,
    },
    /// No checkpoint this round (why); the next one is tried as usual.
    Skipped(String),
    /// Writing the part failed as many times in a row as the job allows: the job must stop
    /// (why, with the last error).
    Failed(String),
}

/// Why a shard's part was not written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PartFailure {
    /// Nothing wrong with the storage (e.g. an incremental part this shard cannot write):
    /// the round is skipped.
    Skip(String),
    /// The storage failed every attempt: the job stops.
    Failed(String),
}

/// Told which workers wait in the checkpoint barrier: they push nothing until it completes,
/// so a dense sync step must not wait for them (see `DenseSlice`).
pub trait Parking: Send + Sync {
    /// Worker `rank` waits in the checkpoint barrier.
    fn park(&self, rank: usize);
    /// The round completed: every parked worker goes back to training.
    fn release_all(&self);
}

struct Round {
    step: u64,
    arrived: Vec<bool>,
    order: Option<(Order, Option<pb::ExportOrder>)>,
}

struct State {
    positions: Vec<WorkerState>,
    left: Vec<bool>,
    round: Option<Round>,
    /// Rounds completed so far, and the last one's step and outcome.
    completed: u64,
    last: Option<(u64, Arc<Outcome>)>,
}

/// Writes this shard's part for an order, and its export part when one is ordered (blocking
/// I/O; run off the async threads).
pub type PartWriter =
    Arc<dyn Fn(Order, Option<pb::ExportOrder>) -> Result<WrittenPart, PartFailure> + Send + Sync>;

/// The checkpoint barrier of one shard.
pub struct Barrier {
    workers: usize,
    shared: Arc<Shared>,
    stall: StallWatch,
}

/// What the call completing a round shares with the task that finishes it.
struct Shared {
    state: Mutex<State>,
    done_rounds: watch::Sender<u64>,
    parking: Option<Arc<dyn Parking>>,
}

impl Barrier {
    /// A barrier for `workers` workers; `start` is where each stands (a restored checkpoint's
    /// positions, or zeros).
    pub fn new(workers: usize, start: &[WorkerState]) -> Self {
        let positions = (0..workers)
            .map(|r| {
                start
                    .iter()
                    .find(|w| w.rank as usize == r)
                    .cloned()
                    .map(|w| WorkerState { done: false, ..w })
                    .unwrap_or(WorkerState {
                        rank: r as u32,
                        ..WorkerState::default()
                    })
            })
            .collect();
        Barrier {
            workers,
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    positions,
                    left: vec![false; workers],
                    round: None,
                    completed: 0,
                    last: None,
                }),
                done_rounds: watch::channel(0).0,
                parking: None,
            }),
            stall: StallWatch::default(),
        }
    }

    /// Tells `parking` which workers wait in this barrier (the shard's dense slice).
    pub fn with_parking(mut self, parking: Arc<dyn Parking>) -> Self {
        Arc::get_mut(&mut self.shared)
            .expect("set while the barrier is built")
            .parking = Some(parking);
        self
    }

    /// A backup copy follows its primary's barrier: the workers' positions at the last round
    /// (those that had finished training marked so), so a promoted copy's rounds wait for
    /// the same workers.
    pub fn follow(&self, workers: &[WorkerState]) {
        let mut st = self.shared.state.lock();
        for w in workers {
            let r = w.rank as usize;
            if r < self.workers {
                st.positions[r] = w.clone();
                st.left[r] |= w.done;
            }
        }
    }

    /// A backup copy records that worker `w.rank` finished training (its final position).
    pub fn mark_left(&self, w: &WorkerState) {
        self.follow(&[WorkerState {
            done: true,
            ..w.clone()
        }]);
    }

    /// The final positions of the workers that finished training.
    pub fn left(&self) -> Vec<WorkerState> {
        let st = self.shared.state.lock();
        (0..self.workers)
            .filter(|&r| st.left[r])
            .map(|r| st.positions[r].clone())
            .collect()
    }

    /// Logs rounds that wait long for workers (who), as `stall` says.
    pub fn with_stall(mut self, stall: StallWatch) -> Self {
        self.stall = stall;
        self
    }

    /// The pending round's step and the ranks it still waits for (`None`: no round pending).
    pub fn waiting_for(&self) -> Option<(u64, Vec<usize>)> {
        let st = self.shared.state.lock();
        let round = st.round.as_ref()?;
        let missing = (0..self.workers)
            .filter(|&r| !st.left[r] && !round.arrived[r])
            .collect();
        Some((round.step, missing))
    }

    /// Records a worker's arrival (or departure) and, for an arrival, waits for the round's
    /// outcome. `write` writes this shard's part when the round completes.
    pub async fn arrive(
        &self,
        req: &pb::CheckpointRequest,
        write: PartWriter,
    ) -> Result<Arc<Outcome>, Refusal> {
        let pos = req
            .position
            .as_ref()
            .ok_or_else(|| Refusal::Round("checkpoint request without a position".into()))?;
        let rank = pos.rank as usize;
        if rank >= self.workers {
            return Err(Refusal::Round(format!(
                "worker rank {rank} but this PS was started for {} worker(s)",
                self.workers
            )));
        }
        if req.last {
            return self.last(req, write).await;
        }
        let mut rx = self.shared.done_rounds.subscribe();
        let (target, ready) = self.record(req, pos)?;
        if let Some((round, workers)) = ready {
            // Finished by a task of its own: a caller that goes away (a worker giving up a
            // call that looked hung) must not leave the round taken but never published,
            // every other worker waiting on it for good.
            let shared = Arc::clone(&self.shared);
            tokio::spawn(shared.complete(round, workers, write));
        }
        let Some(target) = target else {
            return Ok(Arc::new(Outcome::Skipped("worker left".into())));
        };
        // The lowest rank waiting reports a slow round.
        let missing = || {
            let st = self.shared.state.lock();
            let round = st.round.as_ref()?;
            if st.completed >= target || round.arrived.iter().position(|a| *a) != Some(rank) {
                return None;
            }
            Some(Missing {
                what: format!("checkpoint barrier after step {}", round.step),
                ranks: (0..self.workers)
                    .filter(|&r| !st.left[r] && !round.arrived[r])
                    .collect(),
            })
        };
        let done = rx.wait_for(|&n| n >= target);
        let _ = self
            .stall
            .wait(BarrierKind::Checkpoint, done, missing)
            .await;
        let st = self.shared.state.lock();
        match &st.last {
            Some((step, o)) if *step == pos.step => Ok(Arc::clone(o)),
            _ => Err(Refusal::Round(
                "the checkpoint round ended without an outcome".into(),
            )),
        }
    }

    /// The end-of-job checkpoint: every worker has left, so the part is written at once with
    /// their final positions.
    async fn last(
        &self,
        req: &pb::CheckpointRequest,
        write: PartWriter,
    ) -> Result<Arc<Outcome>, Refusal> {
        let order = req
            .order
            .as_ref()
            .map(|o| (Order::from_proto(o), o.export.clone()))
            .ok_or_else(|| {
                Refusal::Round("an end-of-job checkpoint request without an order".into())
            })?;
        let workers = {
            let st = self.shared.state.lock();
            if let Some(r) = st.left.iter().position(|l| !l) {
                return Err(Refusal::Round(format!(
                    "end-of-job checkpoint asked for while worker {r} is still training"
                )));
            }
            st.positions.clone()
        };
        Ok(Arc::new(write_part(order, workers, write).await))
    }

    /// Records an arrival or departure under the lock: the round number to wait for (none
    /// for a departure) and the round to complete, if this call completed it.
    #[allow(clippy::type_complexity)]
    fn record(
        &self,
        req: &pb::CheckpointRequest,
        pos: &pb::WorkerPosition,
    ) -> Result<(Option<u64>, Option<(Round, Vec<WorkerState>)>), Refusal> {
        let rank = pos.rank as usize;
        let mut st = self.shared.state.lock();
        st.positions[rank] = worker_state(pos);
        if req.leaving {
            st.left[rank] = true;
            st.positions[rank].done = true;
            return Ok((None, self.take_if_complete(&mut st)));
        }
        if st.left[rank] {
            return Err(Refusal::Round(format!(
                "worker {rank} already reported it finished training"
            )));
        }
        let workers = self.workers;
        let round = st.round.get_or_insert_with(|| Round {
            step: pos.step,
            arrived: vec![false; workers],
            order: None,
        });
        if round.step != pos.step {
            return Err(Refusal::Round(format!(
                "worker {rank} asks for a checkpoint after step {}, but the pending round is \
                 after step {} (workers must checkpoint every K steps of their own count)",
                pos.step, round.step
            )));
        }
        round.arrived[rank] = true;
        if let Some(p) = &self.shared.parking {
            // Under the barrier's lock: a round completing now cannot release before this.
            p.park(rank);
        }
        if let Some(o) = &req.order {
            round.order = Some((Order::from_proto(o), o.export.clone()));
        }
        let target = st.completed + 1;
        Ok((Some(target), self.take_if_complete(&mut st)))
    }

    /// Takes the pending round when every worker that has not left has arrived.
    fn take_if_complete(&self, st: &mut State) -> Option<(Round, Vec<WorkerState>)> {
        let round = st.round.as_ref()?;
        let complete = (0..self.workers).all(|r| st.left[r] || round.arrived[r]);
        if !complete {
            return None;
        }
        let round = st.round.take().expect("checked");
        Some((round, st.positions.clone()))
    }
}

impl Shared {
    /// Writes the part (on a blocking thread) and publishes the outcome.
    async fn complete(self: Arc<Self>, round: Round, workers: Vec<WorkerState>, write: PartWriter) {
        let outcome = match round.order {
            None => Outcome::Skipped(
                "the coordinator (worker 0) has finished training; no more checkpoints".into(),
            ),
            // All workers are blocked in this round: nothing pulls or pushes while the part is
            // written.
            Some(order) => write_part(order, workers, write).await,
        };
        let mut st = self.state.lock();
        if let Some(p) = &self.parking {
            p.release_all();
        }
        st.completed += 1;
        st.last = Some((round.step, Arc::new(outcome)));
        let n = st.completed;
        drop(st);
        self.done_rounds.send_replace(n);
    }
}

/// Writes this shard's part for `order` on a blocking thread: the round's outcome, with the
/// workers' positions `workers`.
async fn write_part(
    (order, export): (Order, Option<pb::ExportOrder>),
    workers: Vec<WorkerState>,
    write: PartWriter,
) -> Outcome {
    match tokio::task::spawn_blocking(move || write(order, export)).await {
        Ok(Ok(part)) => Outcome::Written { part, workers },
        Ok(Err(PartFailure::Skip(e))) => Outcome::Skipped(e),
        Ok(Err(PartFailure::Failed(e))) => Outcome::Failed(e),
        Err(e) => Outcome::Failed(format!("the checkpoint writer failed: {e}")),
    }
}

/// Writes shard `shard`'s part: every table part (with its admission sketch) and the dense
/// slice, as part `ps-<shard>`. A storage failure removes what the attempt wrote and retries
/// as the writer's [`sparta_checkpoint::RetryPolicy`] says; when it gives up the job must stop.
pub fn write_shard_part(
    writer: &Checkpointer,
    order: Order,
    shard: usize,
    tables: &[(&str, &sparta_table::Table)],
    dense: Option<(Vec<f32>, sparta_nn::optim::OptimizerState)>,
) -> Result<(Vec<PartEntry>, Vec<TableEntry>), PartFailure> {
    let part = part_name(shard);
    let attempt = || {
        let p = writer.begin_at(order.id, order.kind, order.base, order.prev)?;
        for (name, t) in tables {
            p.write_table(&part, name, t)?;
        }
        if let Some((values, opt)) = &dense {
            let d = sparta_checkpoint::DenseState {
                params: values,
                optimizer: opt,
            };
            p.write_dense(&part, &d)?;
        }
        Ok(p.into_parts())
    };
    let cleanup = || {
        if let Err(e) = writer.discard_part(order.id, &part) {
            tracing::warn!(
                "PS shard {shard}: removing its partial part of {}: {e}",
                order.id
            );
        }
    };
    let what = format!("PS shard {shard}: writing its part of {}", order.id);
    writer
        .retry()
        .run(&what, attempt, cleanup)
        .map_err(|e| match e {
            CheckpointError::NeedFull { .. } => PartFailure::Skip(format!("PS shard {shard}: {e}")),
            CheckpointError::GaveUp { .. } => PartFailure::Failed(e.to_string()),
            e => PartFailure::Failed(format!("{what}: {e}")),
        })
}

/// Where a shard keeps its checkpoints and whether it starts from one.
#[derive(Clone, Debug)]
pub struct CheckpointConfig {
    /// The shared checkpoint directory (every shard and worker 0 write into it).
    pub dir: std::path::PathBuf,
    /// Resume from a checkpoint in `dir` at start.
    pub resume: Option<Resume>,
    /// Full checkpoints kept by retention (applied by the coordinator).
    pub keep_full: usize,
    /// Consecutive failed attempts to write the shard's part before the job stops.
    pub max_failures: u32,
}

/// Which checkpoint a shard resumes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// The newest whose every file verifies (all shards agree on it); the policy says whether
    /// finding none is an error or an empty start.
    Newest(sparta_checkpoint::ResumePolicy),
    /// Exactly this one (as chosen by `sparta launch`).
    At(u64),
}

#[cfg(test)]
mod tests {
    use super::*;
    use sparta_checkpoint::CheckpointKind;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn req(
        rank: u32,
        step: u64,
        rows: u64,
        order: Option<u64>,
        leaving: bool,
    ) -> pb::CheckpointRequest {
        pb::CheckpointRequest {
            position: Some(pb::WorkerPosition {
                rank,
                step,
                rows_consumed: rows,
                ..Default::default()
            }),
            leaving,
            last: false,
            order: order.map(|id| pb::CheckpointOrder {
                id,
                full: true,
                base: id,
                prev: 0,
                export: None,
            }),
            probe: false,
        }
    }

    /// Waits (at most 10 s) until `f` holds.
    async fn until(f: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "timed out");
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// Records parking calls.
    #[derive(Default)]
    struct Parked(parking_lot::Mutex<Vec<String>>);

    impl Parking for Parked {
        fn park(&self, rank: usize) {
            self.0.lock().push(format!("park {rank}"));
        }
        fn release_all(&self) {
            self.0.lock().push("release".into());
        }
    }

    #[tokio::test]
    async fn arrivals_park_their_worker_and_the_round_releases_all_before_answering() {
        let parked = Arc::new(Parked::default());
        let b = Arc::new(Barrier::new(2, &[]).with_parking(parked.clone()));
        let calls = Arc::new(AtomicUsize::new(0));
        let (b1, w1) = (Arc::clone(&b), writer(Arc::clone(&calls)));
        let late = tokio::spawn(async move { b1.arrive(&req(1, 4, 10, None, false), w1).await });
        until(|| b.waiting_for() == Some((4, vec![0]))).await;
        assert_eq!(*parked.0.lock(), vec!["park 1".to_string()]);
        b.arrive(&req(0, 4, 10, Some(1), false), writer(Arc::clone(&calls)))
            .await
            .unwrap();
        late.await.unwrap().unwrap();
        assert_eq!(*parked.0.lock(), vec!["park 1", "park 0", "release"]);
    }

    fn writer(calls: Arc<AtomicUsize>) -> PartWriter {
        Arc::new(move |o: Order, export| {
            calls.fetch_add(1, Ordering::SeqCst);
            assert_eq!(o.kind, CheckpointKind::Full);
            assert!(export.is_none());
            Ok(WrittenPart {
                order: o,
                parts: Vec::new(),
                tables: Vec::new(),
                export: None,
                export_order: None,
            })
        })
    }

    #[tokio::test]
    async fn a_round_completes_when_every_active_worker_arrived_and_writes_once() {
        let b = Arc::new(Barrier::new(2, &[]));
        let calls = Arc::new(AtomicUsize::new(0));
        let (b1, w1) = (Arc::clone(&b), writer(Arc::clone(&calls)));
        let late = tokio::spawn(async move { b1.arrive(&req(1, 4, 1000, None, false), w1).await });
        // Worker 1 is in the round, which waits for worker 0 (recorded under one lock).
        until(|| b.waiting_for() == Some((4, vec![0]))).await;
        assert!(!late.is_finished(), "the round must wait for worker 0");
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        let o0 = b
            .arrive(&req(0, 4, 1024, Some(1), false), writer(Arc::clone(&calls)))
            .await
            .unwrap();
        let o1 = late.await.unwrap().unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        for o in [o0, o1] {
            let Outcome::Written { workers, .. } = &*o else {
                panic!("{o:?}")
            };
            let rows: Vec<u64> = workers.iter().map(|w| w.position.rows_consumed).collect();
            assert_eq!(rows, vec![1024, 1000]);
        }
        // Worker 1 finishes: the next round needs worker 0 only, and records 1's end.
        b.arrive(&req(1, 6, 1500, None, true), writer(Arc::clone(&calls)))
            .await
            .unwrap();
        let o = b
            .arrive(&req(0, 8, 2048, Some(2), false), writer(Arc::clone(&calls)))
            .await
            .unwrap();
        let Outcome::Written { workers, .. } = &*o else {
            panic!("{o:?}")
        };
        assert!(workers[1].done && workers[1].position.rows_consumed == 1500);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // A step that does not match the pending round is refused.
        let b = Barrier::new(2, &[]);
        let b = Arc::new(b);
        let (b1, w1) = (Arc::clone(&b), writer(Arc::clone(&calls)));
        let pending = tokio::spawn(async move { b1.arrive(&req(1, 4, 0, None, false), w1).await });
        until(|| b.waiting_for() == Some((4, vec![0]))).await;
        let e = b
            .arrive(&req(0, 8, 0, Some(3), false), writer(Arc::clone(&calls)))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("pending round"), "{e}");
        pending.abort();
    }

    /// The call that completes a round may go away while the part is written (its worker
    /// gave the call up as hung): the round still completes for the others.
    #[tokio::test]
    async fn a_round_completes_when_the_call_completing_it_goes_away() {
        let b = Arc::new(Barrier::new(2, &[]));
        let calls = Arc::new(AtomicUsize::new(0));
        let slow: PartWriter = {
            let inner = writer(Arc::clone(&calls));
            Arc::new(move |o, e| {
                std::thread::sleep(std::time::Duration::from_millis(300));
                inner(o, e)
            })
        };
        let (b1, w1) = (Arc::clone(&b), slow.clone());
        let late = tokio::spawn(async move { b1.arrive(&req(1, 4, 10, None, false), w1).await });
        until(|| b.waiting_for() == Some((4, vec![0]))).await;
        let (b0, w0) = (Arc::clone(&b), slow);
        let completing =
            tokio::spawn(async move { b0.arrive(&req(0, 4, 10, Some(1), false), w0).await });
        // The round is taken (no round pending) and its part being written: the call goes.
        until(|| b.waiting_for().is_none()).await;
        completing.abort();
        let o = tokio::time::timeout(std::time::Duration::from_secs(10), late)
            .await
            .expect("worker 1 still waits for a round its completer abandoned")
            .unwrap()
            .unwrap();
        assert!(matches!(&*o, Outcome::Written { .. }), "{o:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    /// A backup copy's barrier that followed its primary's (the workers that left) waits,
    /// once promoted, for the same workers, and records the left ones' final positions.
    #[tokio::test]
    async fn a_promoted_copy_waits_for_the_workers_its_primary_waited_for() {
        let calls = Arc::new(AtomicUsize::new(0));
        let primary = Barrier::new(2, &[]);
        primary
            .arrive(&req(1, 6, 1500, None, true), writer(Arc::clone(&calls)))
            .await
            .unwrap();
        let backup = Barrier::new(2, &[]);
        for w in primary.left() {
            backup.mark_left(&w);
        }
        assert_eq!(backup.left().len(), 1);
        let o = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            backup.arrive(&req(0, 8, 2048, Some(2), false), writer(Arc::clone(&calls))),
        )
        .await
        .expect("the promoted copy waits for a worker that left")
        .unwrap();
        let Outcome::Written { workers, .. } = &*o else {
            panic!("{o:?}")
        };
        assert!(workers[1].done && workers[1].position.rows_consumed == 1500);
        // Positions of a round followed: the next round's manifest has them for workers
        // that do not arrive again (here: none left, so both must arrive).
        let other = Barrier::new(2, &[]);
        other.follow(workers);
        assert_eq!(other.left().len(), 1);
    }

    #[tokio::test]
    async fn without_the_coordinator_rounds_are_skipped() {
        let b = Barrier::new(2, &[]);
        let calls = Arc::new(AtomicUsize::new(0));
        b.arrive(&req(0, 3, 700, None, true), writer(Arc::clone(&calls)))
            .await
            .unwrap();
        let o = b
            .arrive(&req(1, 4, 1000, None, false), writer(Arc::clone(&calls)))
            .await
            .unwrap();
        assert!(
            matches!(&*o, Outcome::Skipped(m) if m.contains("coordinator")),
            "{o:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn the_end_of_job_checkpoint_waits_for_no_one_but_needs_every_worker_gone() {
        let b = Barrier::new(2, &[]);
        let calls = Arc::new(AtomicUsize::new(0));
        b.arrive(&req(1, 6, 1500, None, true), writer(Arc::clone(&calls)))
            .await
            .unwrap();
        let last = pb::CheckpointRequest {
            last: true,
            ..req(0, 9, 2300, Some(5), false)
        };
        let e = b
            .arrive(&last, writer(Arc::clone(&calls)))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("worker 0 is still training"), "{e}");
        b.arrive(&req(0, 9, 2300, None, true), writer(Arc::clone(&calls)))
            .await
            .unwrap();
        let o = b.arrive(&last, writer(Arc::clone(&calls))).await.unwrap();
        let Outcome::Written { workers, .. } = &*o else {
            panic!("{o:?}")
        };
        let ends: Vec<(bool, u64)> = workers
            .iter()
            .map(|w| (w.done, w.position.rows_consumed))
            .collect();
        assert_eq!(ends, vec![(true, 2300), (true, 1500)]);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let no_order = pb::CheckpointRequest {
            last: true,
            ..req(0, 9, 2300, None, false)
        };
        assert!(b.arrive(&no_order, writer(calls)).await.is_err());
    }
}
