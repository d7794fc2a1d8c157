//! Hot reload without a half-applied moment: the live snapshot is an `Arc<Snapshot>` behind a
//! lock that is held only to clone or replace the `Arc`. A request clones the `Arc` once and
//! scores against that version to the end; a reload builds the next snapshot off to the side
//! and swaps it in with one pointer store.
//!
//! # Cost of a delta: two copies, not one copy per delta
//! Copying every table for every delta (copy-on-write of the whole snapshot) costs O(table)
//! per minute; sharding the maps does not help, since a delta touching 1 % of the rows
//! touches nearly every shard. Instead the handle keeps two snapshots, as left-right /
//! double-buffering does: the live one and the *spare*, the previous version. A delta is
//! applied in place to the spare (after the delta the spare missed last time), which then
//! becomes live; the old live becomes the spare. Applying in place needs the spare to be
//! unreferenced (`Arc::get_mut`): requests finish in milliseconds and deltas come seconds to
//! minutes apart, so that is the normal case; if a request still holds it, the handle falls
//! back to copying the live snapshot. Cost: O(delta) per version and 2x the weights in
//! memory (weights only: 68 bytes per dim-16 row plus the index). A full export (or a broken
//! chain) loads a new snapshot from scratch; the next delta then copies it once.
//!
//! Which versions are installed is decided by the chain rules ([`crate::chain`]): bad versions
//! are skipped once and for all, a gap is reported ([`ModelHandle::status`]) until a full
//! export that verifies appears. A handle may hold no snapshot at all (the export directory is
//! missing or empty): [`ModelHandle::current`] is `None` until the first full export loads.
//!
//! # Pinning and rollback
//! A handle can be pinned to a version ([`ModelHandle::pin`], `sparta serve --pin-version`):
//! it serves that version and its polls change nothing until [`ModelHandle::unpin`].
//! [`ModelHandle::rollback`] loads the published version before the served one (the newest
//! complete version below it, loaded exactly by [`Snapshot::load_version`]) and pins it there,
//! so the poller does not move straight forward again; unpinned, the chain rules continue from
//! it (the deltas after it apply again).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use prometheus_client::metrics::counter::Counter;

pub use crate::chain::PollOutcome;
use crate::chain::{advance, Chain, ChainCounters, ChainState, Served, Stale, StepWentBack};
use crate::error::ServeError;
use crate::snapshot::Snapshot;
use sparta_export::format::ExportVersion;

/// The previous version and the deltas it lacks to catch up with the live one.
#[derive(Default)]
struct Spare {
    snap: Option<Arc<Snapshot>>,
    pending: Vec<Arc<ExportVersion>>,
}

/// Counters of a handle (shared with the server's metrics registry).
#[derive(Clone, Debug, Default)]
pub struct HandleCounters {
    /// Versions installed since open.
    pub reloads: Counter,
    /// Failed polls (the export directory could not be listed).
    pub reload_errors: Counter,
    /// Deltas applied in place to the spare.
    pub in_place: Counter,
    /// Rollbacks to an earlier version.
    pub rollbacks: Counter,
    /// The chain rules' counters.
    pub chain: ChainCounters,
}

/// What the chain rules found at the last poll, for `/v1/model` and `/health`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChainStatus {
    /// Newer versions exist on disk that the served chain cannot reach.
    pub stale: Option<Stale>,
    /// The last time the served step went back (a new trainer lineage accepted).
    pub step_went_back: Option<StepWentBack>,
    /// Versions skipped because they failed verification.
    pub bad_versions: Vec<u64>,
    /// The newest complete version on disk.
    pub newest_on_disk: u64,
}

impl ChainStatus {
    fn of(c: &ChainState) -> ChainStatus {
        ChainStatus {
            stale: c.stale().cloned(),
            step_went_back: c.step_went_back().cloned(),
            bad_versions: c.bad_versions().keys().copied().collect(),
            newest_on_disk: c.newest_on_disk(),
        }
    }
}

/// The poller's state: the spare snapshot and the chain rules' memory.
struct PollState {
    spare: Spare,
    chain: ChainState,
}

/// What a rollback did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rollback {
    /// The version served before.
    pub from: u64,
    /// The version served now (and pinned).
    pub to: u64,
}

/// The live snapshot of an export directory (none until the first full export that verifies
/// appears), and its reloading.
pub struct ModelHandle {
    dir: PathBuf,
    live: RwLock<Option<Arc<Snapshot>>>,
    poll: Mutex<PollState>,
    status: RwLock<ChainStatus>,
    counters: HandleCounters,
    /// The version the handle is pinned to (changed under the `poll` lock).
    pin: RwLock<Option<u64>>,
}

/// The handle's chain for one poll: deltas go through the spare, a newly loaded chain is
/// caught up in place before it is published.
struct HandleChain<'a> {
    handle: &'a ModelHandle,
    spare: &'a mut Spare,
    fresh: Option<Snapshot>,
}

impl Chain for HandleChain<'_> {
    fn served(&self) -> Option<Served> {
        match &self.fresh {
            Some(s) => Some(Served::of(s)),
            None => self.handle.live.read().as_deref().map(Served::of),
        }
    }

    fn apply(&mut self, d: ExportVersion) -> Result<(), ServeError> {
        match &mut self.fresh {
            Some(s) => s.apply_in_place(&d),
            None => self.handle.install_delta(self.spare, Arc::new(d)),
        }
    }

    fn replace(&mut self, s: Snapshot) {
        self.fresh = Some(s);
    }
}

impl ModelHandle {
    /// A handle on `dir`, loaded with its newest consistent chain when there is one. A missing
    /// or empty directory (or one with no loadable version) gives a handle with no snapshot
    /// yet: [`ModelHandle::poll`] loads the first full export that verifies.
    pub fn open(dir: &Path) -> Result<ModelHandle, ServeError> {
        sparta_export::local_dir(dir)?;
        let h = Self::empty(dir);
        h.poll()?;
        if h.current().is_none() {
            tracing::warn!(
                "no export to serve yet in {}: waiting for the first full export",
                dir.display()
            );
        }
        Ok(h)
    }

    fn empty(dir: &Path) -> ModelHandle {
        let counters = HandleCounters::default();
        ModelHandle {
            dir: dir.to_path_buf(),
            live: RwLock::new(None),
            poll: Mutex::new(PollState {
                spare: Spare::default(),
                chain: ChainState::new(counters.chain.clone()).requesting_full_in(dir),
            }),
            status: RwLock::new(ChainStatus::default()),
            counters,
            pin: RwLock::new(None),
        }
    }

    /// A handle serving version `v` of `dir` exactly, pinned there
    /// (`sparta serve --pin-version`).
    pub fn open_pinned(dir: &Path, v: u64) -> Result<ModelHandle, ServeError> {
        let h = Self::empty(dir);
        h.pin(v)?;
        Ok(h)
    }

    /// Serves version `v` (loaded exactly when it is not the served one) and stays there:
    /// polls change nothing until [`ModelHandle::unpin`].
    pub fn pin(&self, v: u64) -> Result<u64, ServeError> {
        let mut st = self.poll.lock();
        if self.current().map(|s| s.version()) != Some(v) {
            let snap = Snapshot::load_version(&self.dir, v)?;
            self.install(&mut st, snap);
        }
        *self.pin.write() = Some(v);
        tracing::info!("serving export version {v}, pinned: new versions are not loaded");
        Ok(v)
    }

    /// Serves the published version before the served one (the newest complete version
    /// below it that loads; versions that do not are logged and passed over) and pins it.
    /// Each call goes one version further back. Refused when nothing is loaded or no earlier
    /// version is on disk.
    pub fn rollback(&self) -> Result<Rollback, ServeError> {
        let mut st = self.poll.lock();
        let from = self
            .current()
            .ok_or_else(|| {
                ServeError::NoSuchVersion("no model loaded yet: nothing to roll back".into())
            })?
            .version();
        let earlier = crate::chain::complete_versions(&self.dir)?
            .into_iter()
            .filter(|&v| v < from)
            .rev();
        for v in earlier {
            match Snapshot::load_version(&self.dir, v) {
                Ok(snap) => {
                    self.install(&mut st, snap);
                    *self.pin.write() = Some(v);
                    self.counters.rollbacks.inc();
                    tracing::warn!(
                        "rolled back from export version {from} to {v}: pinned there until \
                         POST /v1/unpin"
                    );
                    return Ok(Rollback { from, to: v });
                }
                Err(e) => tracing::warn!(
                    "rollback: export version {v} cannot be loaded ({e}): trying the one before"
                ),
            }
        }
        Err(ServeError::NoSuchVersion(format!(
            "no export version before {from} can be loaded from {} (retention keeps \
             `keep_full` full exports and the deltas after them)",
            self.dir.display()
        )))
    }

    /// Lets the poller move on again from the served version; returns the pin it had.
    pub fn unpin(&self) -> Option<u64> {
        let _st = self.poll.lock();
        let was = self.pin.write().take();
        if let Some(v) = was {
            tracing::info!("unpinned export version {v}: newer versions load again");
        }
        was
    }

    /// The version the handle is pinned to.
    pub fn pinned(&self) -> Option<u64> {
        *self.pin.read()
    }

    /// Serves `snap` (loaded from scratch): the spare no longer follows the live version.
    fn install(&self, st: &mut PollState, snap: Snapshot) {
        *self.live.write() = Some(Arc::new(snap));
        st.spare = Spare::default();
        self.counters.reloads.inc();
    }

    /// A handle serving `snap`, polling `dir` for newer versions.
    pub fn with_snapshot(dir: &Path, snap: Snapshot) -> ModelHandle {
        let h = Self::empty(dir);
        *h.live.write() = Some(Arc::new(snap));
        h
    }

    /// The live snapshot (hold it for the whole request); `None` before the first export.
    pub fn current(&self) -> Option<Arc<Snapshot>> {
        self.live.read().clone()
    }

    /// The export directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What the chain rules found at the last poll.
    pub fn status(&self) -> ChainStatus {
        self.status.read().clone()
    }

    /// The handle's counters.
    pub fn counters(&self) -> &HandleCounters {
        &self.counters
    }

    /// Versions installed since open.
    pub fn reloads(&self) -> u64 {
        self.counters.reloads.get()
    }

    /// Failed polls since open.
    pub fn reload_errors(&self) -> u64 {
        self.counters.reload_errors.get()
    }

    /// Deltas applied in place to the spare (the rest were applied to a copy).
    pub fn applied_in_place(&self) -> u64 {
        self.counters.in_place.get()
    }

    /// Looks for versions newer than the live one and installs them by the chain rules
    /// ([`crate::chain`]): deltas that follow on are applied one by one (each one swapped in
    /// whole); when newer versions remain, the newest full export that verifies is loaded with
    /// its deltas. Bad versions are remembered and skipped; a gap is reported in
    /// [`ModelHandle::status`]. Only a failure to list the directory is an error; the live
    /// snapshot keeps serving.
    pub fn poll(&self) -> Result<PollOutcome, ServeError> {
        let mut st = self.poll.lock();
        if self.pinned().is_some() {
            return Ok(PollOutcome::Unchanged);
        }
        let PollState { spare, chain } = &mut *st;
        let mut hc = HandleChain {
            handle: self,
            spare,
            fresh: None,
        };
        let r = advance(&self.dir, chain, &mut hc);
        let fresh = hc.fresh.take();
        if let Some(s) = fresh {
            tracing::info!(
                "loaded export version {} (full {}, step {}, lineage {:016x}, {} rows)",
                s.version(),
                s.full_version(),
                s.step(),
                s.lineage(),
                sparta_core::SparseStore::table_rows(s.tables())
            );
            *self.live.write() = Some(Arc::new(s));
            *spare = Spare::default();
            self.counters.reloads.inc();
        }
        *self.status.write() = ChainStatus::of(chain);
        if r.is_err() {
            self.counters.reload_errors.inc();
        }
        r
    }

    fn install_delta(&self, spare: &mut Spare, d: Arc<ExportVersion>) -> Result<(), ServeError> {
        let mut next = None;
        if let Some(mut s) = spare.snap.take() {
            if let Some(m) = Arc::get_mut(&mut s) {
                let caught_up = spare
                    .pending
                    .iter()
                    .chain(std::iter::once(&d))
                    .try_for_each(|p| m.apply_in_place(p));
                match caught_up {
                    Ok(()) => next = Some(s),
                    Err(e) => tracing::warn!("spare snapshot dropped: {e}"),
                }
            }
        }
        let in_place = next.is_some();
        let next = match next {
            Some(n) => n,
            None => Arc::new(
                self.current()
                    .expect("a delta is applied on a live version")
                    .apply_delta(&d)?,
            ),
        };
        let v = next.version();
        let old = self.live.write().replace(next);
        spare.snap = old;
        spare.pending = vec![d];
        self.counters.reloads.inc();
        if in_place {
            self.counters.in_place.inc();
        }
        tracing::info!(
            "applied delta: now at version {v} ({})",
            if in_place { "in place" } else { "copied" }
        );
        Ok(())
    }

    /// Polls every `every` until the returned task is aborted or the runtime stops.
    pub fn spawn_poller(
        self: &Arc<Self>,
        every: std::time::Duration,
    ) -> tokio::task::JoinHandle<()> {
        let h = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let h2 = Arc::clone(&h);
                match tokio::task::spawn_blocking(move || h2.poll()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!("export poll failed (still serving): {e}"),
                    Err(e) => tracing::warn!("export poll panicked: {e}"),
                }
            }
        })
    }
}
