//! The sharded embedding table and its batch `pull` / `push` paths.

use std::cell::RefCell;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::arena::Arena;
use crate::codec::RowCodec;
use crate::config::{Admission, TableConfig};
use crate::error::TableError;
use crate::hash::{fast_range, mix64};
use crate::init::init_row;
use crate::optim;
use crate::prefetch::prefetch;
use crate::shard::Shard;
use crate::sketch::Sketch;

/// Smallest count-min sketch width per shard.
const SKETCH_MIN_WIDTH: usize = 1 << 16;
use crate::slab::{block_rows, FREE_STEP, NO_SLOT, W_COUNT, W_STEP, W_VERSION};

/// Index-entry prefetch distance (keys ahead, across shard boundaries) in the batch pipeline.
const PF_INDEX: usize = 16;
/// Row prefetch distance: rows are processed this many keys after their index entry is read.
const PF_ROW: usize = 8;

/// A shard lock on its own cache lines (no false sharing between neighbouring shard locks),
/// plus a lock-free snapshot of the index array used only to compute prefetch addresses for
/// keys of this shard while another shard is being processed.
#[repr(align(128))]
pub(crate) struct PaddedShard(pub(crate) Mutex<Shard>, pub(crate) IndexSnapshot);

/// `(entries pointer, capacity)` of a shard's index, republished after it may have grown.
/// Possibly stale: only ever used for prefetch hints, never dereferenced.
#[derive(Default)]
pub(crate) struct IndexSnapshot {
    ptr: AtomicPtr<u32>,
    cap: AtomicUsize,
}

impl IndexSnapshot {
    pub(crate) fn publish(&self, sh: &Shard) {
        self.ptr.store(sh.index.home_ptr(0).cast_mut(), Relaxed);
        self.cap.store(sh.index.capacity(), Relaxed);
    }

    /// Address of the home entry of `h` (a hint: may point into a replaced array).
    #[inline(always)]
    fn home(&self, h: u64) -> *const u32 {
        let (p, cap) = (self.ptr.load(Relaxed), self.cap.load(Relaxed));
        p.wrapping_add(fast_range(h as u32, cap)).cast_const()
    }
}

/// Monotonic counters of a table.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) admitted: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) evicted: AtomicU64,
    /// Evicted per reason, in the order of `EvictReason::ALL`.
    pub(crate) evicted_by: [AtomicU64; 4],
    pub(crate) removed: AtomicU64,
    pub(crate) dropped_pushes: AtomicU64,
    /// Cold rows brought into RAM, RAM rows moved to the SSD tier.
    pub(crate) promoted: AtomicU64,
    pub(crate) demoted: AtomicU64,
}

/// Per-thread reusable buffers for grouping a batch by shard (keeps hot paths allocation-free).
#[derive(Default)]
struct Scratch {
    hashes: Vec<u64>,
    order: Vec<u32>,
    starts: Vec<u32>,
    cursor: Vec<u32>,
    slots: Vec<u32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// A sharded embedding table: u64 key → fixed-stride row of weights + optimizer state.
///
/// Concurrency: every shard has one lock, taken once per batch per shard. Each pull or push
/// of one key is therefore atomic; pushes of the same key from different threads serialize
/// (no lost updates), in the order the shard lock is acquired.
pub struct Table {
    pub(crate) cfg: TableConfig,
    pub(crate) dim: usize,
    pub(crate) row_floats: usize,
    pub(crate) meta_words: usize,
    /// How row floats are stored (`meta_words + codec.stored_words()` words per row).
    pub(crate) codec: RowCodec,
    pub(crate) shards: Box<[PaddedShard]>,
    pub(crate) step: AtomicU32,
    pub(crate) version: AtomicU64,
    pub(crate) counters: Counters,
    pub(crate) tombstones: Mutex<crate::delta::TombstoneLog>,
    pub(crate) evict_cursor: Mutex<(usize, u32)>,
    /// Time samples of the clock (`max_idle_seconds`).
    pub(crate) clock: Mutex<crate::clock::ClockLog>,
    pub(crate) arena: Arc<Arena>,
}

impl Table {
    /// Builds an empty table from a validated config.
    pub fn new(cfg: TableConfig) -> Result<Table, TableError> {
        cfg.validate()?;
        let n = cfg.effective_shards();
        let has_count = cfg.eviction.as_ref().is_some_and(|e| e.min_count.is_some());
        let meta_words = if has_count { W_COUNT + 1 } else { W_COUNT };
        let row_floats = cfg.row_floats();
        let codec = RowCodec {
            precision: cfg.precision,
            dim: cfg.dim,
            state: row_floats - cfg.dim,
        };
        let expected = cfg.initial_capacity.div_ceil(n);
        let stride = meta_words + codec.stored_words();
        let arena = Arc::new(Arena::new(block_rows(stride) * stride * 4));
        let shards = (0..n)
            .map(|i| {
                let ram_budget = cfg.ram_rows_of_shard(i, n, stride * 4);
                let sketch = match cfg.admission {
                    Admission::Always => None,
                    // The sketch counts ids that have no row yet: most of a click log's distinct
                    // ids. Size it for traffic, not for the initial row capacity, or it
                    // saturates and admits everything (64K x 4 x 2 bytes = 512 KiB per shard).
                    _ => Some(Sketch::new(expected.max(SKETCH_MIN_WIDTH))),
                };
                let mut shard = Shard::new(
                    stride,
                    meta_words,
                    expected.min(ram_budget),
                    sketch,
                    arena.clone(),
                );
                if let Some(st) = &cfg.storage {
                    let words = codec.stored_words();
                    let cold_rows = expected.saturating_sub(ram_budget);
                    let cold =
                        crate::tier::ColdRows::new(&st.disk_dir, words, has_count, cold_rows)
                            .map_err(|e| TableError::Disk {
                                table: cfg.name.clone(),
                                reason: format!(
                                    "cannot make a file in {}: {e}",
                                    st.disk_dir.display()
                                ),
                            })?;
                    shard.cold = Some(cold);
                    shard.ram_budget = ram_budget;
                }
                let snap = IndexSnapshot::default();
                snap.publish(&shard);
                Ok(PaddedShard(Mutex::new(shard), snap))
            })
            .collect::<Result<Box<[_]>, TableError>>()?;
        tracing::debug!(table = %cfg.name, shards = n, row_floats, "table created");
        Ok(Table {
            dim: cfg.dim,
            row_floats,
            meta_words,
            codec,
            shards,
            step: AtomicU32::new(0),
            version: AtomicU64::new(0),
            counters: Counters::default(),
            tombstones: Mutex::new(crate::delta::TombstoneLog::default()),
            evict_cursor: Mutex::new((0, 0)),
            clock: Mutex::default(),
            arena,
            cfg,
        })
    }

    /// The table's configuration.
    pub fn config(&self) -> &TableConfig {
        &self.cfg
    }

    /// Takes new hyper-parameters (learning rate, ...) of the same optimizer for the pushes
    /// to come, keeping every row and its optimizer state: what a job resumed with another
    /// learning rate than its checkpoint's asks for. Another optimizer kind (whose state per
    /// row differs) or an out-of-range value is refused, naming the table.
    pub fn set_optimizer(&mut self, optimizer: crate::Optimizer) -> Result<(), TableError> {
        if std::mem::discriminant(&optimizer) != std::mem::discriminant(&self.cfg.optimizer) {
            return Err(TableError::InvalidConfig {
                table: self.cfg.name.clone(),
                reason: format!(
                    "its rows hold the state of {:?}, which {:?} cannot continue",
                    self.cfg.optimizer, optimizer
                ),
            });
        }
        let cfg = TableConfig {
            optimizer,
            ..self.cfg.clone()
        };
        cfg.validate()?;
        self.cfg = cfg;
        Ok(())
    }

    /// Embedding dimension (weights per row).
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Floats per stored row: weights followed by optimizer state.
    pub fn row_stride(&self) -> usize {
        self.row_floats
    }

    /// Number of shards.
    pub fn num_shards(&self) -> usize {
        self.shards.len()
    }

    /// Rows held (in RAM and, with an SSD tier, on disk).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().rows()).sum()
    }

    /// Whether the table holds no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Current step of the eviction clock.
    pub fn step(&self) -> u32 {
        self.step.load(Relaxed)
    }

    /// Advances the logical clock by one step (saturating); returns the new step.
    pub fn advance_step(&self) -> u32 {
        let prev = self
            .step
            .fetch_update(Relaxed, Relaxed, |s| {
                Some(s.saturating_add(1).min(FREE_STEP - 1))
            })
            .unwrap_or(0);
        prev.saturating_add(1).min(FREE_STEP - 1)
    }

    /// Sets the clock (e.g. after restoring a checkpoint).
    pub fn set_step(&self, step: u32) {
        self.step.store(step.min(FREE_STEP - 1), Relaxed);
    }

    /// Moves the clock forward to `step` if it is behind (a backup copy following its
    /// primary's clock).
    pub fn raise_step(&self, step: u32) {
        self.step.fetch_max(step.min(FREE_STEP - 1), Relaxed);
    }

    /// Moves the version forward to `version` if it is behind: a backup copy holding rows
    /// stamped by its primary stamps its own later writes after them.
    pub fn raise_version(&self, version: u64) {
        self.version.fetch_max(version, Relaxed);
    }

    /// Number of completed push batches (plus `bump_version` calls).
    pub fn version(&self) -> u64 {
        self.version.load(Relaxed)
    }

    /// Increments the version; returns the new value.
    pub fn bump_version(&self) -> u64 {
        self.version.fetch_add(1, Relaxed) + 1
    }

    /// Version stamp for rows written now: `version() + 1`, saturating at `u32::MAX`
    /// (saturated stamps are always reported by `changed_since`). Read under a shard lock.
    #[inline]
    pub(crate) fn stamp(&self) -> u32 {
        (self.version.load(Relaxed) + 1).min(u32::MAX as u64) as u32
    }

    #[inline(always)]
    pub(crate) fn shard_of(&self, h: u64) -> usize {
        fast_range((h >> 32) as u32, self.shards.len())
    }

    /// Looks up or creates rows for `keys` (admission applies) and copies their weights into
    /// `out` (`keys.len() * dim`). Non-admitted ids read as zeros. Stamps rows with the step.
    pub fn pull(&self, keys: &[u64], out: &mut [f32]) {
        self.pull_inner(keys, out, None)
    }

    /// [`Table::pull`], writing into `slots` (`keys.len()`) where each key's row was found
    /// ([`NO_SLOT`]: none): hints for [`Table::push_at`] of the same keys.
    pub fn pull_keeping(&self, keys: &[u64], out: &mut [f32], slots: &mut [u32]) {
        assert_eq!(
            slots.len(),
            keys.len(),
            "pull_keeping: slots.len() must be keys.len()"
        );
        self.pull_inner(keys, out, Some(slots))
    }

    fn pull_inner(&self, keys: &[u64], out: &mut [f32], mut kept: Option<&mut [u32]>) {
        assert_eq!(
            out.len(),
            keys.len() * self.dim,
            "pull: out.len() must be keys.len() * dim"
        );
        let dim = self.dim;
        let (mut admitted, mut rejected) = (0u64, 0u64);
        let mut scratch = Vec::new();
        self.for_each_group(keys, Tiering::PromoteDemote, |table, sh, i, slot| {
            let dst = &mut out[i * dim..(i + 1) * dim];
            let slot = match slot {
                Some(s) => s,
                None => match table.admit_and_create(sh, keys[i], &mut scratch) {
                    Some(s) => {
                        admitted += 1;
                        s
                    }
                    None => {
                        rejected += 1;
                        dst.fill(0.0);
                        if let Some(k) = kept.as_deref_mut() {
                            k[i] = NO_SLOT;
                        }
                        return;
                    }
                },
            };
            if let Some(k) = kept.as_deref_mut() {
                k[i] = slot;
            }
            let step = table.step.load(Relaxed);
            let has_count = sh.has_count;
            let (meta, stored) = sh.row_parts_mut(slot);
            meta[W_STEP] = step;
            if has_count {
                meta[W_COUNT] = meta[W_COUNT].saturating_add(1);
            }
            table.codec.decode_weights(stored, dst);
        });
        self.counters.admitted.fetch_add(admitted, Relaxed);
        self.counters.rejected.fetch_add(rejected, Relaxed);
    }

    /// Copies weights of present rows into `out`; absent ids read as zeros. Never creates rows
    /// and leaves step stamps and counters untouched (evaluation / serving).
    pub fn pull_readonly(&self, keys: &[u64], out: &mut [f32]) {
        assert_eq!(
            out.len(),
            keys.len() * self.dim,
            "pull_readonly: out.len() must be keys.len() * dim"
        );
        let dim = self.dim;
        let mut cold = vec![
            0u32;
            if self.cfg.storage.is_some() {
                self.codec.stored_words()
            } else {
                0
            }
        ];
        self.for_each_group(keys, Tiering::Read, |table, sh, i, slot| {
            let dst = &mut out[i * dim..(i + 1) * dim];
            match slot {
                Some(s) => table.codec.decode_weights(sh.stored(s), dst),
                None => match sh.read_cold(keys[i], mix64(keys[i]), &mut cold) {
                    Some(_) => table.codec.decode_weights(&cold, dst),
                    None => dst.fill(0.0),
                },
            }
        });
    }

    /// Applies `grads` (`keys.len() * dim`) with the optimizer, in place. Pushes to absent ids
    /// are dropped (counted). Duplicate keys are applied sequentially in batch order.
    /// Increments `version()` once per call.
    pub fn push(&self, keys: &[u64], grads: &[f32]) {
        self.push_inner(keys, grads, None)
    }

    /// [`Table::push`] with `slots` (`keys.len()`), where [`Table::pull_keeping`] of the same
    /// keys found their rows: each is used when it still holds its key's live row, which
    /// spares reading the index; any other (freed, reused, evicted, [`NO_SLOT`]) falls back
    /// to the index. The same result as `push`, whatever the table did in between.
    pub fn push_at(&self, keys: &[u64], grads: &[f32], slots: &[u32]) {
        assert_eq!(
            slots.len(),
            keys.len(),
            "push_at: slots.len() must be keys.len()"
        );
        self.push_inner(keys, grads, Some(slots))
    }

    fn push_inner(&self, keys: &[u64], grads: &[f32], hints: Option<&[u32]>) {
        assert_eq!(
            grads.len(),
            keys.len() * self.dim,
            "push: grads.len() must be keys.len() * dim"
        );
        let dim = self.dim;
        let mut dropped = 0u64;
        let opt = &self.cfg.optimizer;
        let codec = self.codec;
        // A compact row is updated in f32 and stored again (see `crate::codec`).
        let mut row = vec![0f32; if codec.is_f32() { 0 } else { self.row_floats }];
        self.for_each_group_hinted(keys, Tiering::PromoteDemote, hints, |table, sh, i, slot| {
            match slot {
                Some(s) => {
                    let stamp = table.stamp();
                    let (meta, stored) = sh.row_parts_mut(s);
                    meta[W_VERSION] = stamp;
                    let g = &grads[i * dim..(i + 1) * dim];
                    if codec.is_f32() {
                        optim::apply(opt, bytemuck::cast_slice_mut(stored), g);
                    } else {
                        codec.decode(stored, &mut row);
                        optim::apply(opt, &mut row, g);
                        let step = table.step.load(Relaxed);
                        codec.encode(&row, stored, rounding_seed(keys[i], step));
                    }
                }
                None => dropped += 1,
            }
        });
        self.counters.dropped_pushes.fetch_add(dropped, Relaxed);
        self.version.fetch_add(1, Relaxed);
    }

    /// Runs the admission policy for an absent key and creates its row if admitted.
    fn admit_and_create(&self, sh: &mut Shard, key: u64, row: &mut Vec<f32>) -> Option<u32> {
        let h = mix64(key);
        let admit = match self.cfg.admission {
            Admission::Always => true,
            Admission::Count { min_count } => sh
                .sketch
                .as_mut()
                .is_some_and(|s| s.increment(h) >= min_count),
            Admission::Probability { p } => {
                let n = sh.sketch.as_mut().map_or(0, |s| s.increment(h));
                let r = mix64(
                    key ^ mix64(self.cfg.seed ^ (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                );
                ((r >> 40) as f32) < p * (1u64 << 24) as f32
            }
        };
        if !admit {
            return None;
        }
        let slot = match sh.create(key, h, self.step.load(Relaxed), self.stamp()) {
            Some(s) => s,
            None => {
                tracing::warn!(table = %self.cfg.name, "shard full; id not admitted");
                return None;
            }
        };
        row.resize(self.row_floats, 0.0);
        init_row(
            &self.cfg.init,
            &self.cfg.optimizer,
            key,
            self.cfg.seed,
            self.dim,
            row,
        );
        let step = self.step.load(Relaxed);
        let (_, stored) = sh.row_parts_mut(slot);
        self.codec.encode(row, stored, rounding_seed(key, step));
        Some(slot)
    }

    /// Groups `keys` by shard, then for each shard with keys takes its lock once and runs a
    /// prefetching pipeline: index entries are prefetched `PF_INDEX` keys ahead, candidate rows
    /// `PF_ROW` keys ahead of `f(table, shard, key_position, resolved_slot)`.
    ///
    /// With an SSD tier, `tier` says what happens to a key whose row is cold: `Read` passes
    /// `None` (the callback may read the record); `PromoteDemote` brings the row into RAM
    /// first and, after each shard's keys, moves the least recently pulled rows out.
    pub(crate) fn for_each_group(
        &self,
        keys: &[u64],
        tier: Tiering,
        f: impl FnMut(&Table, &mut Shard, usize, Option<u32>),
    ) {
        self.for_each_group_hinted(keys, tier, None, f)
    }

    /// [`Table::for_each_group`] with `hints` (`keys.len()`): each key's slot as an earlier
    /// pass found it, read instead of the key's index entry and verified like a candidate
    /// from the index; one that fails (or [`NO_SLOT`]) is looked up in the index.
    pub(crate) fn for_each_group_hinted(
        &self,
        keys: &[u64],
        tier: Tiering,
        hints: Option<&[u32]>,
        mut f: impl FnMut(&Table, &mut Shard, usize, Option<u32>),
    ) {
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut s) => self.grouped(keys, tier, hints, &mut s, &mut f),
            // Re-entrant call from inside a callback: use fresh buffers.
            Err(_) => self.grouped(keys, tier, hints, &mut Scratch::default(), &mut f),
        });
    }

    fn grouped(
        &self,
        keys: &[u64],
        tier: Tiering,
        hints: Option<&[u32]>,
        s: &mut Scratch,
        f: &mut impl FnMut(&Table, &mut Shard, usize, Option<u32>),
    ) {
        let n_shards = self.shards.len();
        s.hashes.clear();
        s.hashes.extend(keys.iter().map(|&k| mix64(k)));
        s.starts.clear();
        s.starts.resize(n_shards + 1, 0);
        for &h in &s.hashes {
            s.starts[self.shard_of(h) + 1] += 1;
        }
        for i in 0..n_shards {
            s.starts[i + 1] += s.starts[i];
        }
        s.cursor.clear();
        s.cursor.extend_from_slice(&s.starts[..n_shards]);
        s.order.resize(keys.len(), 0);
        for (i, &h) in s.hashes.iter().enumerate() {
            let sh = self.shard_of(h);
            s.order[s.cursor[sh] as usize] = i as u32;
            s.cursor[sh] += 1;
        }
        s.slots.resize(keys.len(), NO_SLOT);
        let (mut promoted, mut demoted) = (0u64, 0u64);
        for shard in 0..n_shards {
            let (lo, hi) = (s.starts[shard] as usize, s.starts[shard + 1] as usize);
            if lo == hi {
                continue;
            }
            let mut guard = self.shards[shard].0.lock();
            let sh = &mut *guard;
            let idx = &s.order[lo..hi];
            let slots = &mut s.slots[lo..hi];
            let n = idx.len();
            let len_before = sh.index.len();
            let row_bytes = self.row_bytes();
            let high_water = sh.slab.high_water();
            for j in 0..n + PF_ROW {
                // Stage 1: prefetch the index entry of the key PF_INDEX positions ahead in the
                // shard-sorted order (possibly in a later shard: via its snapshot). With hints,
                // no index entry is read.
                if let (None, Some(&ahead)) = (hints, s.order.get(lo + j + PF_INDEX)) {
                    let h = s.hashes[ahead as usize];
                    prefetch(self.shards[self.shard_of(h)].1.home(h));
                }
                // Stage 2: read the index entry (or the hint), prefetch the candidate row.
                if j < n {
                    let cand = match hints {
                        // A slot beyond the slab (another table's, or a stale one) is no hint.
                        Some(h) => Some(h[idx[j] as usize]).filter(|&c| c < high_water),
                        None => Some(sh.index.candidate(s.hashes[idx[j] as usize])),
                    }
                    .unwrap_or(NO_SLOT);
                    slots[j] = cand;
                    if cand != NO_SLOT {
                        let p = sh.slab.row_ptr(cand);
                        let mut off = 0;
                        while off < row_bytes.min(256) {
                            prefetch(p.wrapping_byte_add(off));
                            off += 64;
                        }
                    }
                }
                // Stage 3: verify and process the key PF_ROW positions behind.
                if j >= PF_ROW {
                    let t = j - PF_ROW;
                    let i = idx[t] as usize;
                    let (key, cand) = (keys[i], slots[t]);
                    let slot =
                        if cand != NO_SLOT && sh.slab.key(cand) == key && sh.slab.is_live(cand) {
                            Some(cand)
                        } else if cand == NO_SLOT && hints.is_none() && sh.index.len() == len_before
                        {
                            None
                        } else {
                            // Tag false positive, rows created since the candidate was read, or
                            // a hint that no longer holds its key's row (or none).
                            sh.lookup(key, s.hashes[i])
                        };
                    let slot = match slot {
                        None if tier == Tiering::PromoteDemote && sh.cold.is_some() => {
                            let p = sh.promote(key, s.hashes[i]);
                            promoted += p.is_some() as u64;
                            p
                        }
                        found => found,
                    };
                    f(self, sh, i, slot);
                }
            }
            if tier == Tiering::PromoteDemote {
                demoted += sh.demote_over_budget(self.step.load(Relaxed));
            }
            if sh.index.len() != len_before {
                self.shards[shard].1.publish(sh);
            }
        }
        if promoted + demoted > 0 {
            self.counters.promoted.fetch_add(promoted, Relaxed);
            self.counters.demoted.fetch_add(demoted, Relaxed);
        }
    }
}

/// What [`Table::for_each_group`] does with a key whose row is in the SSD tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tiering {
    /// Leave it there (the callback sees `None`).
    Read,
    /// Bring it into RAM, then keep the shard within its RAM budget.
    PromoteDemote,
}

/// The random bits of the stochastic rounding of a compact row written at clock `step`:
/// the same pushes at the same steps write the same rows, whatever else the table did in
/// between (a checkpoint moves its version, never its clock).
#[inline]
pub(crate) fn rounding_seed(key: u64, step: u32) -> u64 {
    key.rotate_left(23) ^ step as u64
}
