//! A shard's slice of the dense parameters, the dense optimizer applied to it, and the
//! consistency modes that decide when a worker's push-pull returns.

use parking_lot::Mutex;
use sparta_nn::optim::{self, OptimizerState};
use sparta_nn::DenseOptimizer;
use tokio::sync::watch;

use crate::ckpt::Parking;
use crate::stall::{Missing, StallWatch};
use sparta_proto::metrics::BarrierKind;

/// When a dense push is applied and its pull answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Each push is applied on arrival and answered at once.
    #[default]
    Async,
    /// Per-step barrier: the gradients of the workers of a step are averaged and applied once,
    /// then all of them are answered with the same parameters. A step completes when all active
    /// workers but `backup` have pushed: the gradients of the `backup` slowest are not dropped
    /// but join the next step (one barrier late), so no sample's gradient is lost.
    Sync {
        /// Backup workers: how many of the slowest a step does not wait for.
        backup: usize,
    },
    /// Bounded staleness: a worker at step `s` waits while the slowest active worker is at a
    /// step below `s - k`; pushes are applied on arrival.
    Staleness(u64),
    /// The workers average their dense gradients among themselves (ring all-reduce) and
    /// each applies the optimizer to its own copy; the shard keeps the state a worker writes
    /// (before every checkpoint and at the end) and hands it out at start. Push-pulls are
    /// refused.
    Allreduce,
}

impl Mode {
    /// Name for logs and `Info`.
    pub fn describe(self) -> String {
        match self {
            Mode::Async => "async".into(),
            Mode::Sync { backup: 0 } => "sync".into(),
            Mode::Sync { backup } => format!("sync, {backup} backup worker(s)"),
            Mode::Staleness(k) => format!("staleness {k}"),
            Mode::Allreduce => "allreduce".into(),
        }
    }
}

struct State {
    values: Vec<f32>,
    opt: OptimizerState,
    initialized: bool,
    /// Sync: summed gradients of the step being collected.
    acc: Vec<f32>,
    /// Sync: workers whose gradients are in `acc`.
    arrived: usize,
    /// Sync: which ranks those are.
    pushed: Vec<bool>,
    /// Workers waiting in the checkpoint barrier: they push nothing until it completes.
    parked: Vec<bool>,
    /// Sync: steps completed without each worker (a backup worker's late pushes owed).
    owed: Vec<u64>,
    /// Sync: completed steps (the barrier generation).
    generation: u64,
    /// Latest step reported per worker rank.
    steps: Vec<u64>,
    /// Workers that finished training.
    done: Vec<bool>,
    /// Sync: steps completed before every active worker had pushed (backup workers).
    short_steps: u64,
    /// The ids of the pushes the next change applies (sync: those collected so far).
    ids: Vec<sparta_proto::pb::PushId>,
}

impl State {
    fn active(&self) -> usize {
        self.done.iter().filter(|d| !**d).count()
    }

    /// Sync: whether the step being collected may complete: all active workers but `backup`
    /// of the slowest have pushed (at least one push is always needed), or every active
    /// worker that can push has. Workers parked in the checkpoint barrier push nothing until
    /// every worker is in it, so a step that waited for them would never complete (a late
    /// backup worker's push would wait for workers that wait for it).
    fn quorum(&self, backup: usize) -> bool {
        let free = (0..self.done.len())
            .filter(|&r| !self.done[r] && !self.parked[r])
            .count();
        self.arrived > 0
            && (self.arrived >= self.active().saturating_sub(backup).max(1) || self.arrived >= free)
    }

    /// Sync: active workers that have not pushed for the step being collected and are not
    /// parked in the checkpoint barrier.
    fn missing(&self) -> Vec<usize> {
        (0..self.done.len())
            .filter(|&r| !self.done[r] && !self.pushed[r] && !self.parked[r])
            .collect()
    }
}

/// Why a dense request was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum DenseRefusal {
    /// The request does not fit this slice or job; the message says how.
    Invalid(String),
    /// No worker has offered initial values yet.
    NotInitialized,
}

/// The dense slice `[offset, offset + len)` of a flat vector of `total` values.
pub struct DenseSlice {
    total: usize,
    offset: usize,
    optimizer: DenseOptimizer,
    mode: Mode,
    workers: usize,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    stall: StallWatch,
    /// Called with the slice's values and optimizer state after every change, under the
    /// slice's lock (so in the order of the changes): the primary's replication.
    on_change: std::sync::OnceLock<OnChange>,
}

/// See [`DenseSlice::on_change`]: values, optimizer state, the ids of the pushes applied.
pub type OnChange = Box<dyn Fn(&[f32], &OptimizerState, &[sparta_proto::pb::PushId]) + Send + Sync>;

impl DenseSlice {
    /// An uninitialised slice; `workers` is the number of training workers (for sync and
    /// staleness modes and the done count).
    pub fn new(
        total: usize,
        offset: usize,
        len: usize,
        optimizer: DenseOptimizer,
        mode: Mode,
        workers: usize,
    ) -> Self {
        Self {
            total,
            offset,
            optimizer,
            mode,
            workers,
            state: Mutex::new(State {
                values: vec![0.0; len],
                opt: OptimizerState::new(&optimizer, len),
                initialized: false,
                acc: Vec::new(),
                arrived: 0,
                pushed: vec![false; workers],
                parked: vec![false; workers],
                owed: vec![0; workers],
                generation: 0,
                steps: vec![0; workers],
                done: vec![false; workers],
                short_steps: 0,
                ids: Vec::new(),
            }),
            changed: watch::channel(0).0,
            stall: StallWatch::default(),
            on_change: std::sync::OnceLock::new(),
        }
    }

    /// Calls `f` with the values and optimizer state after every change (init, a gradient
    /// applied, a state set) and the ids of the pushes it applied, under the slice's lock;
    /// only the first call sets it.
    pub fn on_change(&self, f: OnChange) {
        let _ = self.on_change.set(f);
    }

    fn changed_now(&self, st: &mut State) {
        if let Some(f) = self.on_change.get() {
            f(&st.values, &st.opt, &st.ids);
        }
        st.ids.clear();
    }

    /// Logs sync steps that wait long for workers (who), as `stall` says.
    pub fn with_stall(mut self, stall: StallWatch) -> Self {
        self.stall = stall;
        self
    }

    /// Length of the whole dense vector.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Start of this slice.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Values in this slice.
    pub fn len(&self) -> usize {
        self.state.lock().values.len()
    }

    /// Whether the slice is empty (more shards than dense values).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Training workers expected.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The consistency mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    fn check(&self, total: u64, n: usize) -> Result<(), DenseRefusal> {
        let len = self.state.lock().values.len();
        if total as usize != self.total || n != len {
            return Err(DenseRefusal::Invalid(format!(
                "dense vector mismatch: this PS holds [{}, {}) of {} values, the request has {} of {}; \
                 do the PS and the worker use the same job config (model, hidden layers, embedding dim)?",
                self.offset,
                self.offset + len,
                self.total,
                n,
                total
            )));
        }
        Ok(())
    }

    /// The first offer wins; returns the slice as it is after the offer.
    pub fn init(&self, total: u64, values: &[f32]) -> Result<Vec<f32>, DenseRefusal> {
        self.check(total, values.len())?;
        let mut st = self.state.lock();
        if !st.initialized {
            st.values.copy_from_slice(values);
            st.initialized = true;
            self.changed_now(&mut st);
        }
        Ok(st.values.clone())
    }

    /// The current slice.
    pub fn pull(&self, total: u64) -> Result<Vec<f32>, DenseRefusal> {
        let st = self.state.lock();
        if !st.initialized {
            return Err(DenseRefusal::NotInitialized);
        }
        drop(st);
        self.check(total, self.len())?;
        Ok(self.state.lock().values.clone())
    }

    fn rank_ok(&self, rank: usize) -> Result<(), DenseRefusal> {
        if rank >= self.workers {
            return Err(DenseRefusal::Invalid(format!(
                "worker rank {rank} but this PS was started for {} worker(s) (--workers)",
                self.workers
            )));
        }
        Ok(())
    }

    /// Pushes worker `rank`'s gradients of its step `step` and returns the fresh slice, when
    /// the mode allows.
    pub async fn push_pull(
        &self,
        rank: usize,
        step: u64,
        total: u64,
        grads: &[f32],
    ) -> Result<Vec<f32>, DenseRefusal> {
        self.push_pull_id(rank, step, total, grads, None).await
    }

    /// [`DenseSlice::push_pull`] of the push `id` (handed to the change callback with the
    /// change that applies it).
    pub async fn push_pull_id(
        &self,
        rank: usize,
        step: u64,
        total: u64,
        grads: &[f32],
        id: Option<sparta_proto::pb::PushId>,
    ) -> Result<Vec<f32>, DenseRefusal> {
        self.check(total, grads.len())?;
        self.rank_ok(rank)?;
        if !self.state.lock().initialized {
            return Err(DenseRefusal::NotInitialized);
        }
        match self.mode {
            Mode::Allreduce => Err(DenseRefusal::Invalid(
                "this PS runs dense mode allreduce: the workers reduce dense gradients among \
                 themselves (start the workers with --ring, or the PS with another --mode)"
                    .into(),
            )),
            Mode::Async => {
                let mut st = self.state.lock();
                st.steps[rank] = step;
                st.ids.extend(id);
                self.apply(&mut st, grads);
                Ok(st.values.clone())
            }
            Mode::Staleness(k) => {
                {
                    let mut st = self.state.lock();
                    st.steps[rank] = step;
                }
                self.changed.send_modify(|v| *v += 1);
                loop {
                    let mut rx = self.changed.subscribe();
                    {
                        let st = self.state.lock();
                        let slowest = (0..self.workers)
                            .filter(|&r| !st.done[r])
                            .map(|r| st.steps[r])
                            .min()
                            .unwrap_or(u64::MAX);
                        if slowest.saturating_add(k) >= step {
                            break;
                        }
                    }
                    if rx.changed().await.is_err() {
                        break;
                    }
                }
                let mut st = self.state.lock();
                st.ids.extend(id);
                self.apply(&mut st, grads);
                Ok(st.values.clone())
            }
            Mode::Sync { backup } => {
                let (my_gen, mut rx) = {
                    let mut st = self.state.lock();
                    st.steps[rank] = step;
                    if st.acc.len() != grads.len() {
                        st.acc = vec![0.0; grads.len()];
                    }
                    for (a, g) in st.acc.iter_mut().zip(grads) {
                        *a += g;
                    }
                    st.arrived += 1;
                    st.pushed[rank] = true;
                    st.ids.extend(id);
                    let my_gen = st.generation;
                    if st.quorum(backup) {
                        self.complete_step(&mut st);
                        return Ok(st.values.clone());
                    }
                    if st.owed[rank] > 0 {
                        // A late push for a step that went on without it: the gradient joins
                        // the step being collected, the worker goes on at once. (Waiting for
                        // that step could deadlock: with several shards, the steps completed
                        // without different workers on different shards.)
                        st.owed[rank] -= 1;
                        return Ok(st.values.clone());
                    }
                    (my_gen, self.changed.subscribe())
                };
                // The lowest rank waiting reports a slow step.
                let missing = || {
                    let st = self.state.lock();
                    if st.generation != my_gen || st.pushed.iter().position(|p| *p) != Some(rank) {
                        return None;
                    }
                    Some(Missing {
                        what: format!("dense sync step {step} (worker {rank}'s count)"),
                        ranks: st.missing(),
                    })
                };
                let done = rx.wait_for(|g| *g > my_gen);
                let _ = self.stall.wait(BarrierKind::Sync, done, missing).await;
                Ok(self.state.lock().values.clone())
            }
        }
    }

    fn apply(&self, st: &mut State, grads: &[f32]) {
        let State { values, opt, .. } = st;
        optim::apply(&self.optimizer, opt, values, grads);
        self.changed_now(st);
    }

    /// Sync: averages the collected gradients, applies them once and releases the waiters.
    fn complete_step(&self, st: &mut State) {
        if st.arrived < st.active() {
            st.short_steps += 1;
        }
        for r in 0..st.owed.len() {
            if !st.done[r] && !st.pushed[r] && !st.parked[r] {
                st.owed[r] += 1;
            }
        }
        let n = st.arrived.max(1) as f32;
        let mut acc = std::mem::take(&mut st.acc);
        for a in &mut acc {
            *a /= n;
        }
        self.apply(st, &acc);
        acc.fill(0.0);
        st.acc = acc;
        st.arrived = 0;
        st.pushed.fill(false);
        st.generation += 1;
        let g = st.generation;
        self.changed.send_replace(g);
    }

    /// Worker `rank` finished training: it leaves barriers and staleness bounds. Returns the
    /// number of workers done.
    pub fn worker_done(&self, rank: usize) -> Result<usize, DenseRefusal> {
        self.rank_ok(rank)?;
        let mut st = self.state.lock();
        st.done[rank] = true;
        if let Mode::Sync { backup } = self.mode {
            if st.quorum(backup) {
                self.complete_step(&mut st);
            }
        }
        let done = st.done.iter().filter(|d| **d).count();
        drop(st);
        self.changed.send_modify(|v| *v += 1);
        Ok(done)
    }

    /// The slice's values and optimizer state (for a checkpoint), `None` before the first
    /// `init`. Call it at a quiescent point (no push in flight, as at a checkpoint barrier).
    pub fn snapshot(&self) -> Option<(Vec<f32>, OptimizerState)> {
        let st = self.state.lock();
        st.initialized.then(|| (st.values.clone(), st.opt.clone()))
    }

    /// Dense mode allreduce: the slice's values and optimizer state, as a starting worker
    /// takes them.
    pub fn state(&self, total: u64) -> Result<(Vec<f32>, OptimizerState), DenseRefusal> {
        self.check(total, self.len())?;
        self.snapshot().ok_or(DenseRefusal::NotInitialized)
    }

    /// Dense mode allreduce: replaces the slice's values and optimizer state with a worker's
    /// copy (every worker holds the same).
    pub fn set_state(
        &self,
        total: u64,
        values: &[f32],
        opt: OptimizerState,
    ) -> Result<(), DenseRefusal> {
        self.check(total, values.len())?;
        if !opt.fits(&self.optimizer, values.len()) {
            return Err(DenseRefusal::Invalid(format!(
                "optimizer state of {} + {} slot values for a slice of {} under {:?}",
                opt.slot1.len(),
                opt.slot2.len(),
                values.len(),
                self.optimizer
            )));
        }
        let mut st = self.state.lock();
        st.values.copy_from_slice(values);
        st.opt = opt;
        st.initialized = true;
        self.changed_now(&mut st);
        Ok(())
    }

    /// Loads values and optimizer state saved by [`DenseSlice::snapshot`]; the slice counts as
    /// initialised (workers' initial offers are ignored), and barriers and step counts start
    /// over at `step` for every worker.
    pub fn restore(
        &self,
        values: &[f32],
        opt: OptimizerState,
        step: u64,
    ) -> Result<(), DenseRefusal> {
        let mut st = self.state.lock();
        if values.len() != st.values.len() {
            return Err(DenseRefusal::Invalid(format!(
                "the checkpoint's dense slice has {} values, this shard holds {}: was it written \
                 for another job config or shard count?",
                values.len(),
                st.values.len()
            )));
        }
        st.values.copy_from_slice(values);
        st.opt = opt;
        st.initialized = true;
        st.acc.clear();
        st.arrived = 0;
        st.pushed.fill(false);
        st.owed.fill(0);
        st.steps.iter_mut().for_each(|s| *s = step);
        Ok(())
    }

    /// Sync: the step being collected (its generation) and the ranks that have pushed for it.
    pub fn pending(&self) -> (u64, Vec<usize>) {
        let st = self.state.lock();
        let pushed = (0..st.pushed.len()).filter(|&r| st.pushed[r]).collect();
        (st.generation, pushed)
    }

    /// Sync: steps that completed without waiting for every active worker (backup workers).
    pub fn short_steps(&self) -> u64 {
        self.state.lock().short_steps
    }

    /// Workers done so far.
    pub fn done(&self) -> usize {
        self.state.lock().done.iter().filter(|d| **d).count()
    }

    /// Waits (at most `limit`) until every worker is done; returns the count done.
    pub async fn wait_all_done(&self, limit: std::time::Duration) -> usize {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let mut rx = self.changed.subscribe();
            let done = self.done();
            if done >= self.workers {
                return done;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return self.done();
            }
        }
    }
}

impl Parking for DenseSlice {
    fn park(&self, rank: usize) {
        let mut st = self.state.lock();
        if let Some(p) = st.parked.get_mut(rank) {
            *p = true;
        }
        // A step that waited only for the parked workers can go on now.
        if let Mode::Sync { backup } = self.mode {
            if st.quorum(backup) {
                self.complete_step(&mut st);
            }
        }
    }

    fn release_all(&self) {
        self.state.lock().parked.fill(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const SGD: DenseOptimizer = DenseOptimizer::Sgd { lr: 1.0 };

    #[tokio::test]
    async fn first_init_wins_and_async_applies_on_arrival() {
        let d = DenseSlice::new(4, 2, 2, SGD, Mode::Async, 2);
        assert_eq!(
            d.push_pull(0, 0, 4, &[1.0, 1.0]).await,
            Err(DenseRefusal::NotInitialized)
        );
        assert_eq!(d.init(4, &[1.0, 2.0]).unwrap(), vec![1.0, 2.0]);
        assert_eq!(d.init(4, &[9.0, 9.0]).unwrap(), vec![1.0, 2.0]);
        assert_eq!(
            d.push_pull(1, 0, 4, &[0.5, 0.5]).await.unwrap(),
            vec![0.5, 1.5]
        );
        assert!(matches!(
            d.push_pull(0, 0, 5, &[0.5, 0.5]).await,
            Err(DenseRefusal::Invalid(_))
        ));
        assert!(matches!(
            d.push_pull(2, 0, 4, &[0.5, 0.5]).await,
            Err(DenseRefusal::Invalid(_))
        ));
    }

    /// Waits (at most 10 s) until `f` holds.
    async fn until(what: &str, f: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    #[tokio::test]
    async fn sync_averages_once_per_step_and_done_workers_leave_the_barrier() {
        let d = Arc::new(DenseSlice::new(1, 0, 1, SGD, Mode::Sync { backup: 0 }, 2));
        d.init(1, &[0.0]).unwrap();
        let d2 = Arc::clone(&d);
        let a = tokio::spawn(async move { d2.push_pull(0, 0, 1, &[1.0]).await.unwrap() });
        // Worker 0's push is in and the step did not complete (both under one lock).
        until("worker 0's push", || d.pending() == (0, vec![0])).await;
        assert!(!a.is_finished(), "the barrier must wait for worker 1");
        let b = d.push_pull(1, 0, 1, &[3.0]).await.unwrap();
        assert_eq!(b, vec![-2.0]);
        assert_eq!(a.await.unwrap(), vec![-2.0]);
        // Worker 1 is done: worker 0 proceeds alone.
        let d2 = Arc::clone(&d);
        let a = tokio::spawn(async move { d2.push_pull(0, 1, 1, &[1.0]).await.unwrap() });
        until("worker 0's second push", || d.pending() == (1, vec![0])).await;
        assert_eq!(d.worker_done(1).unwrap(), 1);
        assert_eq!(a.await.unwrap(), vec![-3.0]);
        assert_eq!(d.push_pull(0, 2, 1, &[1.0]).await.unwrap(), vec![-4.0]);
    }

    #[tokio::test]
    async fn sync_with_a_backup_worker_goes_on_without_the_slowest_and_keeps_its_gradient() {
        let d = Arc::new(DenseSlice::new(1, 0, 1, SGD, Mode::Sync { backup: 1 }, 3));
        d.init(1, &[0.0]).unwrap();
        // Step 0: workers 0 and 1 complete it; worker 2 (slow) has not pushed.
        let d2 = Arc::clone(&d);
        let a = tokio::spawn(async move { d2.push_pull(0, 0, 1, &[1.0]).await.unwrap() });
        until("worker 0's push", || d.pending() == (0, vec![0])).await;
        assert!(!a.is_finished(), "one push of three is not a quorum");
        assert_eq!(d.push_pull(1, 0, 1, &[3.0]).await.unwrap(), vec![-2.0]);
        assert_eq!(a.await.unwrap(), vec![-2.0]);
        assert_eq!(d.short_steps(), 1);
        // The slow worker's step-0 gradient joins the next step; it goes on at once.
        assert_eq!(d.push_pull(2, 0, 1, &[5.0]).await.unwrap(), vec![-2.0]);
        assert_eq!(d.pending(), (1, vec![2]));
        assert_eq!(d.push_pull(0, 1, 1, &[1.0]).await.unwrap(), vec![-5.0]);
        // Every gradient was applied exactly once: 1+3 averaged, then 5+1 averaged.
        assert_eq!(d.pull(1).unwrap(), vec![-5.0]);
        assert_eq!(d.short_steps(), 2);
        // With two workers done the last one proceeds alone: a full step, not a short one.
        d.worker_done(1).unwrap();
        d.worker_done(2).unwrap();
        assert_eq!(d.push_pull(0, 2, 1, &[1.0]).await.unwrap(), vec![-6.0]);
        assert_eq!(d.short_steps(), 2);
    }

    #[tokio::test]
    async fn a_sync_step_does_not_wait_for_workers_parked_in_the_checkpoint_barrier() {
        let d = Arc::new(DenseSlice::new(1, 0, 1, SGD, Mode::Sync { backup: 1 }, 3));
        d.init(1, &[0.0]).unwrap();
        // Worker 0 pushes; workers 1 and 2 are (about to be) in the checkpoint barrier.
        let d2 = Arc::clone(&d);
        let a = tokio::spawn(async move { d2.push_pull(0, 0, 1, &[2.0]).await.unwrap() });
        until("worker 0's push", || d.pending() == (0, vec![0])).await;
        d.park(1);
        assert_eq!(d.pending(), (0, vec![0]), "worker 2 may still push");
        d.park(2);
        assert_eq!(a.await.unwrap(), vec![-2.0]);
        // Arriving while the others are parked: no wait at all.
        assert_eq!(d.push_pull(0, 1, 1, &[2.0]).await.unwrap(), vec![-4.0]);
        d.release_all();
        // Released: a push waits for a quorum again.
        let d2 = Arc::clone(&d);
        let a = tokio::spawn(async move { d2.push_pull(1, 1, 1, &[1.0]).await.unwrap() });
        until("worker 1's push", || d.pending() == (2, vec![1])).await;
        assert!(!a.is_finished());
        assert_eq!(d.push_pull(2, 1, 1, &[3.0]).await.unwrap(), vec![-6.0]);
        a.await.unwrap();
    }

    #[tokio::test]
    async fn a_late_push_is_applied_before_everyone_is_parked() {
        let d = Arc::new(DenseSlice::new(1, 0, 1, SGD, Mode::Sync { backup: 1 }, 3));
        d.init(1, &[0.0]).unwrap();
        let d2 = Arc::clone(&d);
        let a = tokio::spawn(async move { d2.push_pull(1, 0, 1, &[1.0]).await.unwrap() });
        until("worker 1's push", || d.pending() == (0, vec![1])).await;
        d.push_pull(2, 0, 1, &[1.0]).await.unwrap();
        a.await.unwrap();
        d.park(1);
        d.park(2);
        // Worker 0 was late: its push goes on at once (owed) or completes alone.
        d.push_pull(0, 0, 1, &[4.0]).await.unwrap();
        d.park(0);
        // The checkpoint sees every gradient: -1 (1+1 averaged), then -4.
        assert_eq!(d.snapshot().unwrap().0, vec![-5.0]);
    }

    #[tokio::test]
    async fn allreduce_mode_keeps_the_state_workers_write_and_refuses_push_pulls() {
        let adam = DenseOptimizer::Adam {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        };
        let d = DenseSlice::new(5, 3, 2, adam, Mode::Allreduce, 2);
        assert_eq!(d.state(5), Err(DenseRefusal::NotInitialized));
        d.init(5, &[1.0, 2.0]).unwrap();
        let (v, opt) = d.state(5).unwrap();
        assert_eq!((v, opt.step, opt.slot1.len()), (vec![1.0, 2.0], 0, 2));
        assert!(matches!(
            d.push_pull(0, 0, 5, &[1.0, 1.0]).await,
            Err(DenseRefusal::Invalid(m)) if m.contains("allreduce")
        ));
        let written = OptimizerState {
            step: 7,
            slot1: vec![0.5, 0.25],
            slot2: vec![0.125, 1.0],
        };
        d.set_state(5, &[3.0, 4.0], written.clone()).unwrap();
        assert_eq!(d.state(5).unwrap(), (vec![3.0, 4.0], written.clone()));
        assert_eq!(d.snapshot().unwrap().1, written);
        // A state of the wrong shape changes nothing.
        let short = OptimizerState {
            step: 1,
            slot1: vec![0.0],
            slot2: vec![],
        };
        assert!(d.set_state(5, &[0.0, 0.0], short).is_err());
        assert!(d.set_state(4, &[0.0, 0.0], written.clone()).is_err());
        assert_eq!(d.state(5).unwrap().0, vec![3.0, 4.0]);
    }

    #[tokio::test]
    async fn staleness_bounds_how_far_a_worker_runs_ahead() {
        let d = Arc::new(DenseSlice::new(1, 0, 1, SGD, Mode::Staleness(1), 2));
        d.init(1, &[0.0]).unwrap();
        d.push_pull(0, 0, 1, &[1.0]).await.unwrap();
        d.push_pull(0, 1, 1, &[1.0]).await.unwrap();
        let d2 = Arc::clone(&d);
        let ahead = tokio::spawn(async move { d2.push_pull(0, 2, 1, &[1.0]).await.unwrap() });
        // Worker 0's step is recorded before it waits; nothing was applied.
        until("worker 0 at step 2", || d.state.lock().steps[0] == 2).await;
        assert_eq!(d.pull(1).unwrap(), vec![-2.0]);
        assert!(
            !ahead.is_finished(),
            "step 2 must wait while worker 1 is at step 0"
        );
        d.push_pull(1, 1, 1, &[1.0]).await.unwrap();
        assert_eq!(ahead.await.unwrap(), vec![-4.0]);
        assert_eq!(
            d.wait_all_done(std::time::Duration::from_millis(10)).await,
            0
        );
        d.worker_done(0).unwrap();
        d.worker_done(1).unwrap();
        assert_eq!(d.wait_all_done(std::time::Duration::from_secs(1)).await, 2);
    }
}
