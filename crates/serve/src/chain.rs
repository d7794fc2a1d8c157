//! The chain rules: which versions of an export directory may follow the served one, and what
//! the server says when it cannot follow them (never silently stale).
//!
//! One pass ([`advance`]) over the complete versions (those with a manifest) above the served
//! one:
//! 1. deltas on the served version are applied in order;
//! 2. when versions remain above the served one, the newest full export that verifies (and
//!    does not go back in steps within the served lineage) is loaded, and step 1 continues from
//!    it.
//!
//! A version that fails verification (a corrupt file, a manifest that disagrees with its files,
//! a step going back within one trainer lineage) is *bad*: counted, logged once, remembered and
//! skipped by later passes. When versions remain above the served one after the pass (a gap: a
//! delta whose base is not the served version; or bad versions) the chain is *stale*: one warning
//! naming the versions, a counted chain break, and [`Stale`] until a full export that verifies
//! lets the server catch up. A version whose step is below the served step is accepted only
//! from another lineage (the trainer restarted from an older checkpoint): logged, counted and
//! reported as [`StepWentBack`].

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use serde::Serialize;
use sparta_checkpoint::LocalDir;
use sparta_export::format::{
    read_manifest, read_version, version_dir, ExportKind, ExportManifest, ExportVersion,
    MANIFEST_FILE,
};
use sparta_export::list_versions;

use crate::error::ServeError;
use crate::snapshot::Snapshot;

/// The served chain cannot reach newer versions on disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stale {
    /// The version served when the chain broke (0: nothing could be loaded).
    pub since_version: u64,
    /// Why the versions after it cannot be applied.
    pub reason: String,
    /// The newest complete version on disk.
    pub newest_on_disk: u64,
    /// When the break was found (ms since the Unix epoch).
    pub since_unix_ms: u64,
}

/// The served step went back: a version of another trainer lineage was accepted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StepWentBack {
    /// The version accepted.
    pub version: u64,
    /// Step served before it.
    pub from_step: u64,
    /// Its step.
    pub to_step: u64,
    /// Lineage served before it (hex).
    pub from_lineage: String,
    /// Its lineage (hex).
    pub to_lineage: String,
}

/// Counters of the chain rules (shared with the server's metrics registry).
#[derive(Clone, Debug, Default)]
pub struct ChainCounters {
    /// Times the served chain could not reach the newest version on disk.
    pub chain_breaks: Counter,
    /// Versions that failed verification (each counted once).
    pub bad_versions: Counter,
    /// Versions of a new trainer lineage accepted with a step below the served one.
    pub lineage_changes: Counter,
}

/// What the chain rules remember between passes.
#[derive(Debug, Default)]
pub struct ChainState {
    bad: BTreeMap<u64, String>,
    stale: Option<Stale>,
    went_back: Option<StepWentBack>,
    newest_on_disk: u64,
    counters: ChainCounters,
    /// The export directory to ask for a full version in when the chain breaks (a server's;
    /// `sparta predict` only reads).
    request_full_in: Option<std::path::PathBuf>,
}

/// The served version, as the rules see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    /// Version.
    pub version: u64,
    /// Training step.
    pub step: u64,
    /// Trainer lineage (0: unknown, an export of layout 1).
    pub lineage: u64,
}

impl Served {
    /// The served facts of a snapshot.
    pub fn of(s: &Snapshot) -> Served {
        Served {
            version: s.version(),
            step: s.step(),
            lineage: s.lineage(),
        }
    }
}

/// The chain being advanced: the served snapshot of a handle, or one loaded from scratch.
pub(crate) trait Chain {
    /// The served version (`None`: nothing loaded yet).
    fn served(&self) -> Option<Served>;
    /// Applies a delta on the served version (an error leaves the served version as it was).
    fn apply(&mut self, d: ExportVersion) -> Result<(), ServeError>;
    /// Serves a newly loaded chain instead.
    fn replace(&mut self, s: Snapshot);
}

/// What one pass (one [`crate::ModelHandle::poll`]) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollOutcome {
    /// Nothing new.
    Unchanged,
    /// Deltas applied; now at this version.
    Applied(u64),
    /// A full export (and its deltas) loaded; now at this version.
    Reloaded(u64),
}

/// Whether a version may follow the served one, by step and lineage.
enum StepRule {
    Forward,
    NewLineage,
    Bad(String),
}

fn step_rule(served: Served, m: &ExportManifest) -> StepRule {
    if m.step >= served.step {
        StepRule::Forward
    } else if m.lineage != 0 && m.lineage == served.lineage {
        StepRule::Bad(format!(
            "its step {} is below the served step {} in the same trainer lineage {:016x}",
            m.step, served.step, m.lineage
        ))
    } else {
        StepRule::NewLineage
    }
}

/// Complete versions of `dir` (those with a manifest file), ascending.
pub(crate) fn complete_versions(dir: &Path) -> Result<Vec<u64>, ServeError> {
    Ok(list_versions(dir)?
        .into_iter()
        .filter(|&v| dir.join(version_dir(v)).join(MANIFEST_FILE).exists())
        .collect())
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl ChainState {
    /// Fresh state counting into `counters`.
    pub fn new(counters: ChainCounters) -> ChainState {
        ChainState {
            counters,
            ..ChainState::default()
        }
    }

    /// When the chain breaks, also ask the exporting trainer for a full version by creating
    /// [`sparta_export::FULL_REQUEST_FILE`] in `dir` (its next export is then full).
    pub fn requesting_full_in(mut self, dir: &Path) -> ChainState {
        self.request_full_in = Some(dir.to_path_buf());
        self
    }

    fn request_full(&self) {
        let Some(dir) = &self.request_full_in else {
            return;
        };
        let p = dir.join(sparta_export::FULL_REQUEST_FILE);
        match std::fs::write(&p, b"") {
            Ok(()) => tracing::info!(
                "asked the trainer for a full export ({}): the chain resumes with it",
                p.display()
            ),
            Err(e) => tracing::warn!(
                "could not ask for a full export ({}): {e}; waiting for the next scheduled one",
                p.display()
            ),
        }
    }

    /// The current break, if any.
    pub fn stale(&self) -> Option<&Stale> {
        self.stale.as_ref()
    }

    /// The last time the served step went back (a new lineage accepted).
    pub fn step_went_back(&self) -> Option<&StepWentBack> {
        self.went_back.as_ref()
    }

    /// Versions skipped as bad, with the reason.
    pub fn bad_versions(&self) -> &BTreeMap<u64, String> {
        &self.bad
    }

    /// The newest complete version seen on disk by the last pass.
    pub fn newest_on_disk(&self) -> u64 {
        self.newest_on_disk
    }

    /// The counters.
    pub fn counters(&self) -> &ChainCounters {
        &self.counters
    }

    /// Remembers `v` as bad (counted and logged the first time only).
    fn mark_bad(&mut self, v: u64, reason: String) {
        if let std::collections::btree_map::Entry::Vacant(e) = self.bad.entry(v) {
            tracing::warn!("export version {v} is bad and will be skipped: {reason}");
            self.counters.bad_versions.inc();
            e.insert(reason);
        }
    }

    /// Why `v` was skipped (for a stale reason).
    fn bad_reason(&self, v: u64) -> Option<String> {
        self.bad
            .get(&v)
            .map(|r| format!("version {v} failed verification ({r})"))
    }

    fn note_new_lineage(&mut self, served: Served, m: &ExportManifest) {
        tracing::warn!(
            "served step goes back from {} to {}: new trainer lineage {:016x} (was {:016x}) \
             at export version {}",
            served.step,
            m.step,
            m.lineage,
            served.lineage,
            m.version
        );
        self.counters.lineage_changes.inc();
        self.went_back = Some(StepWentBack {
            version: m.version,
            from_step: served.step,
            to_step: m.step,
            from_lineage: format!("{:016x}", served.lineage),
            to_lineage: format!("{:016x}", m.lineage),
        });
    }

    /// Ends a pass: the chain is stale when complete versions remain above the served one.
    fn settle(&mut self, served: Option<Served>, newest: u64, obstacle: Option<String>) {
        self.newest_on_disk = newest;
        let at = served.map_or(0, |s| s.version);
        if newest <= at {
            if let Some(old) = self.stale.take() {
                tracing::warn!(
                    "export chain caught up at version {at}: no longer stale (stale since \
                     version {})",
                    old.since_version
                );
            }
            return;
        }
        match &mut self.stale {
            Some(s) if s.since_version == at => s.newest_on_disk = newest,
            _ => {
                let reason =
                    obstacle.unwrap_or_else(|| format!("no version on disk follows version {at}"));
                if at == 0 {
                    tracing::warn!(
                        "no export version can be loaded (newest on disk: {newest}): {reason}"
                    );
                } else {
                    tracing::warn!(
                        "serving stale export version {at}: versions up to {newest} exist but \
                         cannot be reached: {reason}; waiting for the next full export that \
                         verifies"
                    );
                }
                self.counters.chain_breaks.inc();
                self.request_full();
                self.stale = Some(Stale {
                    since_version: at,
                    reason,
                    newest_on_disk: newest,
                    since_unix_ms: unix_ms(),
                });
            }
        }
    }
}

/// Whether version `v` left the directory (retention removed it while it was read).
fn vanished(dir: &Path, v: u64) -> bool {
    !dir.join(version_dir(v)).join(MANIFEST_FILE).exists()
}

/// One pass of the chain rules over `dir` (see the module doc). Only I/O errors listing the
/// directory are returned; everything about a version is handled by the rules.
pub(crate) fn advance(
    dir: &Path,
    state: &mut ChainState,
    chain: &mut dyn Chain,
) -> Result<PollOutcome, ServeError> {
    let versions = complete_versions(dir)?;
    let newest = versions.last().copied().unwrap_or(0);
    if versions.is_empty() {
        state.settle(chain.served(), newest, None);
        return Ok(PollOutcome::Unchanged);
    }
    let mut pass = Pass {
        dir,
        storage: LocalDir::new(dir)?,
        versions,
        obstacle: None,
        outcome: PollOutcome::Unchanged,
    };
    loop {
        // 1. Deltas on the served version, in order.
        if chain.served().is_some() {
            pass.apply_deltas(state, chain);
        }
        // 2. Versions remain above the served one: the newest full export that verifies.
        let cur = chain.served();
        let at = cur.map_or(0, |s| s.version);
        if newest <= at {
            break;
        }
        match pass.newest_full(state, cur) {
            Some(s) => {
                let v = s.version();
                chain.replace(s);
                pass.outcome = PollOutcome::Reloaded(v);
                // A full export starts a new chain: the obstacles below it are history.
                pass.obstacle = None;
            }
            None => {
                // Nothing newer can be loaded: name the first bad version above the served one
                // when no other obstacle was seen.
                if pass.obstacle.is_none() {
                    pass.obstacle = state
                        .bad
                        .range(at + 1..)
                        .next()
                        .map(|(&v, r)| format!("version {v} failed verification ({r})"));
                }
                break;
            }
        }
    }
    state.settle(chain.served(), newest, pass.obstacle);
    Ok(pass.outcome)
}

/// One pass of [`advance`] over the complete versions of a directory.
struct Pass<'a> {
    dir: &'a Path,
    storage: LocalDir,
    /// The complete versions, ascending.
    versions: Vec<u64>,
    /// The first reason a version above the served one could not be applied.
    obstacle: Option<String>,
    outcome: PollOutcome,
}

impl Pass<'_> {
    /// Step 1: applies the deltas that follow on the served version, in order, up to the next
    /// full export; the others become obstacles (a gap) or bad versions.
    fn apply_deltas(&mut self, state: &mut ChainState, chain: &mut dyn Chain) {
        for &v in &self.versions {
            let cur = chain.served().expect("served");
            if v <= cur.version {
                continue;
            }
            if state.bad.contains_key(&v) {
                if self.obstacle.is_none() {
                    self.obstacle = state.bad_reason(v);
                }
                continue;
            }
            let m = match read_manifest(&self.storage, v) {
                Ok(m) => m,
                Err(_) if vanished(self.dir, v) => continue,
                Err(e) => {
                    state.mark_bad(v, e.to_string());
                    self.obstacle
                        .get_or_insert_with(|| state.bad_reason(v).unwrap_or_default());
                    continue;
                }
            };
            match (m.kind, m.base) {
                (ExportKind::Delta, Some(b)) if b == cur.version => {}
                (ExportKind::Delta, base) => {
                    self.obstacle.get_or_insert_with(|| {
                        format!(
                            "delta {v} applies on version {}, not on the served version {} \
                             (a version is missing or unreadable)",
                            base.map_or("?".to_string(), |b| b.to_string()),
                            cur.version
                        )
                    });
                    continue;
                }
                (ExportKind::Full, _) => return,
            }
            let new_lineage = match step_rule(cur, &m) {
                StepRule::Forward => false,
                StepRule::NewLineage => true,
                StepRule::Bad(r) => {
                    state.mark_bad(v, r);
                    self.obstacle
                        .get_or_insert_with(|| state.bad_reason(v).unwrap_or_default());
                    continue;
                }
            };
            let applied = match read_version(&self.storage, v) {
                Ok(d) => chain.apply(d),
                Err(_) if vanished(self.dir, v) => continue,
                Err(e) => Err(e.into()),
            };
            match applied {
                Ok(()) => {
                    if new_lineage {
                        state.note_new_lineage(cur, &m);
                    }
                    self.outcome = match self.outcome {
                        PollOutcome::Reloaded(_) => PollOutcome::Reloaded(v),
                        _ => PollOutcome::Applied(v),
                    };
                }
                Err(e) => {
                    state.mark_bad(v, e.to_string());
                    self.obstacle
                        .get_or_insert_with(|| state.bad_reason(v).unwrap_or_default());
                }
            }
        }
    }

    /// Step 2: the newest full export above the served version `cur` that verifies (and does
    /// not go back in steps within the served lineage), loaded; the ones that fail are bad.
    fn newest_full(&self, state: &mut ChainState, cur: Option<Served>) -> Option<Snapshot> {
        let at = cur.map_or(0, |s| s.version);
        for &f in self.versions.iter().rev().take_while(|&&f| f > at) {
            if state.bad.contains_key(&f) {
                continue;
            }
            let m = match read_manifest(&self.storage, f) {
                Ok(m) => m,
                Err(_) if vanished(self.dir, f) => continue,
                Err(e) => {
                    state.mark_bad(f, e.to_string());
                    continue;
                }
            };
            if m.kind != ExportKind::Full {
                continue;
            }
            let new_lineage = match cur.map(|c| step_rule(c, &m)) {
                None | Some(StepRule::Forward) => false,
                Some(StepRule::NewLineage) => true,
                Some(StepRule::Bad(r)) => {
                    state.mark_bad(f, r);
                    continue;
                }
            };
            let snap = read_version(&self.storage, f)
                .map_err(ServeError::from)
                .and_then(|full| Snapshot::from_full(&full));
            match snap {
                Ok(s) => {
                    if new_lineage {
                        state.note_new_lineage(cur.expect("served"), &m);
                    }
                    return Some(s);
                }
                Err(_) if vanished(self.dir, f) => continue,
                Err(e) => state.mark_bad(f, e.to_string()),
            }
        }
        None
    }
}

/// A chain loaded from scratch (no handle): `sparta predict`, [`Snapshot::load_latest`].
#[derive(Default)]
pub(crate) struct Fresh(pub Option<Snapshot>);

impl Chain for Fresh {
    fn served(&self) -> Option<Served> {
        self.0.as_ref().map(Served::of)
    }

    fn apply(&mut self, d: ExportVersion) -> Result<(), ServeError> {
        self.0
            .as_mut()
            .expect("a delta is applied on a served version")
            .apply_in_place(&d)
    }

    fn replace(&mut self, s: Snapshot) {
        self.0 = Some(s);
    }
}

// Loading a snapshot from scratch is one pass of the chain rules over a `Fresh` chain (the
// methods live here so that the snapshot does not depend on the rules).
impl Snapshot {
    /// Loads the newest consistent chain of `dir`: the newest full export that verifies and
    /// every delta after it that follows on (the chain rules of [`crate::chain`]: bad versions
    /// are skipped, a gap ends the chain). Warns when newer versions exist that the chain
    /// cannot reach; [`Snapshot::load_latest_checked`] also returns what was found.
    pub fn load_latest(dir: &Path) -> Result<Snapshot, ServeError> {
        Self::load_latest_checked(dir).map(|(s, _)| s)
    }

    /// Loads version `v` of `dir` exactly: the full export its chain starts at and every
    /// delta on the way, following each manifest's `base` back from `v` (so a delta written
    /// over an older version, after one that was held back, loads the same way).
    pub fn load_version(dir: &Path, v: u64) -> Result<Snapshot, ServeError> {
        sparta_export::local_dir(dir)?;
        if !dir.join(version_dir(v)).join(MANIFEST_FILE).exists() {
            return Err(ServeError::NoSuchVersion(format!(
                "export version {v} is not in {} (no {}/{MANIFEST_FILE})",
                dir.display(),
                version_dir(v)
            )));
        }
        let storage = LocalDir::new(dir)?;
        let mut path = vec![v];
        loop {
            let cur = *path.last().expect("a version");
            let m = read_manifest(&storage, cur)?;
            match (m.kind, m.base) {
                (ExportKind::Full, _) => break,
                (ExportKind::Delta, Some(b)) if b < cur => path.push(b),
                (ExportKind::Delta, b) => {
                    return Err(ServeError::invalid(
                        cur,
                        format!("a delta whose base {b:?} does not come before it"),
                    ))
                }
            }
        }
        let mut versions = path.into_iter().rev();
        let full = read_version(&storage, versions.next().expect("a full version"))?;
        let mut snap = Snapshot::from_full(&full)?;
        for d in versions {
            snap.apply_in_place(&read_version(&storage, d)?)?;
        }
        Ok(snap)
    }

    /// [`Snapshot::load_latest`], with the chain rules' findings: whether the chain is stale
    /// (newer versions on disk it cannot reach) and which versions were bad.
    pub fn load_latest_checked(dir: &Path) -> Result<(Snapshot, ChainState), ServeError> {
        sparta_export::local_dir(dir)?;
        let mut state = ChainState::default();
        let mut chain = Fresh::default();
        advance(dir, &mut state, &mut chain)?;
        match chain.0 {
            Some(s) => Ok((s, state)),
            None => Err(ServeError::NoExport(match state.stale() {
                Some(st) => format!("{}: {}", dir.display(), st.reason),
                None => dir.display().to_string(),
            })),
        }
    }
}
