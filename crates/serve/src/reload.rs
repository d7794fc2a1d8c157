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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use sparta_checkpoint::LocalDir;

use crate::error::ServeError;
use crate::snapshot::Snapshot;
use sparta_export::format::{read_manifest, read_version, ExportKind, ExportVersion};
use sparta_export::list_versions;

/// The previous version and the deltas it lacks to catch up with the live one.
#[derive(Default)]
struct Spare {
    snap: Option<Arc<Snapshot>>,
    pending: Vec<Arc<ExportVersion>>,
}

/// The live snapshot of an export directory, and its reloading.
pub struct ModelHandle {
    dir: PathBuf,
    live: RwLock<Arc<Snapshot>>,
    spare: Mutex<Spare>,
    reloads: AtomicU64,
    reload_errors: AtomicU64,
    in_place: AtomicU64,
}

/// What one [`ModelHandle::poll`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollOutcome {
    /// Nothing new.
    Unchanged,
    /// Deltas applied; now at this version.
    Applied(u64),
    /// A full export (and its deltas) loaded; now at this version.
    Reloaded(u64),
}

impl ModelHandle {
    /// Loads the newest export chain of `dir`.
    pub fn open(dir: &Path) -> Result<ModelHandle, ServeError> {
        let snap = Snapshot::load_latest(dir)?;
        tracing::info!(
            "loaded export version {} (full {}, step {}, {} rows)",
            snap.version(),
            snap.full_version(),
            snap.step(),
            sparta_core::SparseStore::table_rows(snap.tables())
        );
        Ok(Self::with_snapshot(dir, snap))
    }

    /// A handle serving `snap`, polling `dir` for newer versions.
    pub fn with_snapshot(dir: &Path, snap: Snapshot) -> ModelHandle {
        ModelHandle {
            dir: dir.to_path_buf(),
            live: RwLock::new(Arc::new(snap)),
            spare: Mutex::new(Spare::default()),
            reloads: AtomicU64::new(0),
            reload_errors: AtomicU64::new(0),
            in_place: AtomicU64::new(0),
        }
    }

    /// The live snapshot (hold it for the whole request).
    pub fn current(&self) -> Arc<Snapshot> {
        Arc::clone(&self.live.read())
    }

    /// Versions installed since open.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Relaxed)
    }

    /// Failed polls since open.
    pub fn reload_errors(&self) -> u64 {
        self.reload_errors.load(Relaxed)
    }

    /// Deltas applied in place to the spare (the rest were applied to a copy).
    pub fn applied_in_place(&self) -> u64 {
        self.in_place.load(Relaxed)
    }

    /// Looks for versions newer than the live one and installs them: deltas that follow on
    /// are applied one by one (each one swapped in whole), a newer full export or a broken
    /// chain reloads from the newest full export. Errors leave the live snapshot serving.
    pub fn poll(&self) -> Result<PollOutcome, ServeError> {
        let r = self.poll_inner();
        if r.is_err() {
            self.reload_errors.fetch_add(1, Relaxed);
        }
        r
    }

    fn poll_inner(&self) -> Result<PollOutcome, ServeError> {
        let mut spare = self.spare.lock();
        let storage = LocalDir::new(&self.dir)?;
        let mut applied = None;
        for v in list_versions(&self.dir)? {
            let cur = self.live.read().version();
            if v <= cur {
                continue;
            }
            let Ok(m) = read_manifest(&storage, v) else {
                continue; // being written, or abandoned by a failed export
            };
            if m.kind == ExportKind::Delta && m.base == Some(cur) {
                let d = Arc::new(read_version(&storage, v)?);
                self.install_delta(&mut spare, d)?;
                applied = Some(v);
                continue;
            }
            // A newer full export, or a delta on a base we do not have: start over.
            let snap = Snapshot::load_latest(&self.dir)?;
            if snap.version() <= cur {
                break;
            }
            let v = snap.version();
            *self.live.write() = Arc::new(snap);
            *spare = Spare::default();
            self.reloads.fetch_add(1, Relaxed);
            tracing::info!("reloaded export: now at version {v}");
            return Ok(PollOutcome::Reloaded(v));
        }
        Ok(applied.map_or(PollOutcome::Unchanged, PollOutcome::Applied))
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
            None => Arc::new(self.current().apply_delta(&d)?),
        };
        let v = next.version();
        let old = std::mem::replace(&mut *self.live.write(), next);
        spare.snap = Some(old);
        spare.pending = vec![d];
        self.reloads.fetch_add(1, Relaxed);
        if in_place {
            self.in_place.fetch_add(1, Relaxed);
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
