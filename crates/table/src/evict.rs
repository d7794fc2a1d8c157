//! Eviction: the incremental scan (rows idle for `max_idle_steps` steps or `max_idle_seconds`
//! seconds, rows pulled fewer than `min_count` times), the clock's time samples behind the
//! wall-clock TTL, the removal of the stalest rows under a memory cap, and the per-reason
//! counts.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::hash::mix64;
use crate::slab::FREE_STEP;
use crate::table::Table;

/// Slots scanned per distinct id of a step: twice the most rows a step can create, so the
/// cursor sweeps a table faster than new rows fill it (the embedded trainer and a PS shard
/// size their windows alike).
pub const EVICT_SCAN_PER_KEY: usize = 2;

/// Smallest scan window per step and table.
pub const EVICT_SCAN_MIN: usize = 1024;

/// Rows sampled to pick the staleness threshold of [`Table::evict_stalest`].
const STALE_SAMPLE: usize = 4096;

/// Result of one incremental `evict` call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EvictStats {
    /// Slots examined.
    pub scanned: usize,
    /// Rows removed.
    pub evicted: usize,
    /// True if the scan cursor wrapped around to the first shard during this call.
    pub wrapped: bool,
}

/// Why a row was evicted (the `reason` label of `sparta_evicted_rows_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictReason {
    /// Not pulled for more than `max_idle_steps` steps.
    IdleSteps,
    /// Not pulled for more than `max_idle_seconds` seconds.
    IdleSeconds,
    /// Pulled fewer than `min_count` times when the scan reached it.
    MinCount,
    /// Among the stalest rows of a shard over its memory cap.
    MemoryLimit,
}

impl EvictReason {
    /// Every reason, in the order of [`Evictions`]' fields.
    pub const ALL: [EvictReason; 4] = [
        EvictReason::IdleSteps,
        EvictReason::IdleSeconds,
        EvictReason::MinCount,
        EvictReason::MemoryLimit,
    ];

    /// The label: `idle_steps`, `idle_seconds`, `min_count` or `memory_limit`.
    pub fn label(self) -> &'static str {
        match self {
            EvictReason::IdleSteps => "idle_steps",
            EvictReason::IdleSeconds => "idle_seconds",
            EvictReason::MinCount => "min_count",
            EvictReason::MemoryLimit => "memory_limit",
        }
    }
}

/// Rows evicted so far, per reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Evictions {
    /// Idle for more than `max_idle_steps` steps.
    pub idle_steps: u64,
    /// Idle for more than `max_idle_seconds` seconds.
    pub idle_seconds: u64,
    /// Pulled fewer than `min_count` times.
    pub min_count: u64,
    /// Removed as the stalest rows of a shard over its memory cap.
    pub memory_limit: u64,
}

impl Evictions {
    /// The count of `reason`.
    pub fn get(&self, reason: EvictReason) -> u64 {
        match reason {
            EvictReason::IdleSteps => self.idle_steps,
            EvictReason::IdleSeconds => self.idle_seconds,
            EvictReason::MinCount => self.min_count,
            EvictReason::MemoryLimit => self.memory_limit,
        }
    }
}

impl Table {
    /// Advances the logical clock by `n` steps (saturating): a PS shard's clock moves by the
    /// steps its workers trained since their previous push. Returns the new step.
    pub fn advance_steps(&self, n: u32) -> u32 {
        let prev = self
            .step
            .fetch_update(Relaxed, Relaxed, |s| {
                Some(s.saturating_add(n).min(FREE_STEP - 1))
            })
            .unwrap_or(0);
        prev.saturating_add(n).min(FREE_STEP - 1)
    }

    /// Scans at most `max_scan` slab slots from a rotating cursor and removes rows idle for
    /// more than `max_idle_steps` steps or `max_idle_seconds` seconds, or pulled fewer than
    /// `min_count` times. Each shard lock is held only for its part of the window, so calls
    /// are short and bounded.
    pub fn evict(&self, max_scan: usize) -> EvictStats {
        self.evict_at(max_scan, Instant::now(), None)
    }

    /// [`Table::evict`], appending the removed keys to `removed` (a PS shard forwards them to
    /// its backups).
    pub fn evict_collect(&self, max_scan: usize, removed: &mut Vec<u64>) -> EvictStats {
        self.evict_at(max_scan, Instant::now(), Some(removed))
    }

    /// [`Table::evict`] at the instant `now` (tests inject time), appending the removed keys
    /// to `removed` when given.
    pub fn evict_at(
        &self,
        max_scan: usize,
        now: Instant,
        removed: Option<&mut Vec<u64>>,
    ) -> EvictStats {
        let mut stats = EvictStats::default();
        let Some(ev) = self.cfg.eviction.clone() else {
            return stats;
        };
        let step = self.step.load(Relaxed);
        // Rows last pulled before this step are older than the TTL.
        let ttl_step = ev.max_idle_seconds.and_then(|s| {
            self.clock
                .lock()
                .step_before(step, now, Duration::from_secs_f64(s))
        });
        let mut cursor = self.evict_cursor.lock();
        let mut gone: Vec<(u64, u64)> = Vec::new();
        let mut by = [0u64; 4];
        let n = self.shards.len();
        let mut shards_done = 0;
        while stats.scanned < max_scan && shards_done <= n {
            {
                let mut sh = self.shards[cursor.0].0.lock();
                let stamp = self.stamp() as u64;
                // Positions past the slab are the SSD tier's records (the bound moves as
                // rows move between tiers: a row may be looked at twice or once less in a
                // sweep, and the next sweep catches it).
                let end = sh.positions();
                while cursor.1 < end && stats.scanned < max_scan {
                    let pos = cursor.1;
                    cursor.1 += 1;
                    stats.scanned += 1;
                    let Some((key, m)) = sh.at_position(pos) else {
                        continue;
                    };
                    let reason = if ev
                        .max_idle_steps
                        .is_some_and(|t| step.saturating_sub(m.last_step) > t)
                    {
                        EvictReason::IdleSteps
                    } else if ttl_step.is_some_and(|s| m.last_step < s) {
                        EvictReason::IdleSeconds
                    } else if ev.min_count.is_some_and(|c| m.count < c) {
                        EvictReason::MinCount
                    } else {
                        continue;
                    };
                    sh.remove(key, mix64(key));
                    gone.push((key, stamp));
                    by[reason as usize] += 1;
                }
                if cursor.1 < end {
                    break;
                }
            }
            *cursor = ((cursor.0 + 1) % n, 0);
            shards_done += 1;
            if cursor.0 == 0 {
                stats.wrapped = true;
            }
        }
        drop(cursor);
        stats.evicted = gone.len();
        self.log_evicted(&gone, &by, removed);
        stats
    }

    /// Counts and logs (tombstones) rows removed by eviction; `by` counts them per reason.
    fn log_evicted(&self, gone: &[(u64, u64)], by: &[u64; 4], out: Option<&mut Vec<u64>>) {
        if gone.is_empty() {
            return;
        }
        self.counters.evicted.fetch_add(gone.len() as u64, Relaxed);
        for (c, &n) in self.counters.evicted_by.iter().zip(by) {
            c.fetch_add(n, Relaxed);
        }
        if let Some(out) = out {
            out.extend(gone.iter().map(|&(k, _)| k));
        }
        let mut log = self.tombstones.lock();
        for &(k, s) in gone {
            log.push(k, s);
        }
    }

    /// Removes about `rows` of the stalest rows (by `last_step`, the step of the last pull)
    /// and appends their keys to `removed`; works without an eviction policy (a shard over
    /// its memory cap). An approximation: the threshold step is the quantile of up to 4096
    /// sampled rows' `last_step` that removes `rows` (plus 2 % of the table as a margin);
    /// rows below it are removed in one scan, and when ties at the threshold leave too few
    /// removed, a second scan removes rows at it until `rows` are gone. Returns the count.
    pub fn evict_stalest(&self, rows: usize, removed: &mut Vec<u64>) -> usize {
        let live = self.len();
        if rows == 0 || live == 0 {
            return 0;
        }
        let hw: usize = self
            .shards
            .iter()
            .map(|s| s.0.lock().positions() as usize)
            .sum();
        let stride = (hw / STALE_SAMPLE).max(1);
        let mut sample = Vec::with_capacity(STALE_SAMPLE + self.shards.len());
        let mut at = 0usize;
        for s in self.shards.iter() {
            let sh = s.0.lock();
            let hw = sh.positions() as usize;
            while at < hw {
                if let Some((_, m)) = sh.at_position(at as u32) {
                    sample.push(m.last_step);
                }
                at += stride;
            }
            at -= hw;
        }
        if sample.is_empty() {
            return 0;
        }
        sample.sort_unstable();
        let frac = (rows as f64 / live as f64 + 0.02).min(1.0);
        let idx = ((frac * sample.len() as f64) as usize).min(sample.len() - 1);
        let threshold = sample[idx];
        let mut gone: Vec<(u64, u64)> = Vec::new();
        // First pass: strictly below the threshold; second pass: at it, until `rows`.
        for pass in 0..2 {
            if gone.len() >= rows {
                break;
            }
            for s in self.shards.iter() {
                let mut sh = s.0.lock();
                let stamp = self.stamp() as u64;
                // Removing a row never moves another between positions (RAM and cold
                // rows free their own slot or record), so one walk sees each row once.
                for pos in 0..sh.positions() {
                    if pass == 1 && gone.len() >= rows {
                        break;
                    }
                    let Some((key, m)) = sh.at_position(pos) else {
                        continue;
                    };
                    let last = m.last_step;
                    if last < threshold || (pass == 1 && last == threshold) {
                        sh.remove(key, mix64(key));
                        gone.push((key, stamp));
                    }
                }
            }
        }
        let mut by = [0u64; 4];
        by[EvictReason::MemoryLimit as usize] = gone.len() as u64;
        self.log_evicted(&gone, &by, Some(removed));
        gone.len()
    }

    /// Rows evicted so far, per reason.
    pub fn evictions(&self) -> Evictions {
        let c = &self.counters.evicted_by;
        Evictions {
            idle_steps: c[0].load(Relaxed),
            idle_seconds: c[1].load(Relaxed),
            min_count: c[2].load(Relaxed),
            memory_limit: c[3].load(Relaxed),
        }
    }

    /// All bytes the table holds (what [`Table::stats`] reports as `bytes`): row arena, block
    /// tables, index, sketches, tombstone log, shards. One lock per shard, no scan of rows.
    pub fn bytes(&self) -> usize {
        let mut b = 0;
        for s in self.shards.iter() {
            b += s.0.lock().bytes();
        }
        b + self.arena.bytes()
            + std::mem::size_of::<Table>()
            + std::mem::size_of_val(&*self.shards)
            + self.tombstones.lock().bytes()
            + self.cfg.name.len()
    }

    /// [`Table::bytes`] less the slots on the shards' free lists (removed rows whose memory
    /// the next new rows reuse before the table takes more), with the tombstone log counted
    /// at its cap (16 MiB: removals grow it there, and the rows' memory is never given back,
    /// so a cap must leave it room from the start): what the table needs, the measure a
    /// memory cap holds down.
    pub fn used_bytes(&self) -> usize {
        let free: usize = self
            .shards
            .iter()
            .map(|s| {
                let sh = s.0.lock();
                sh.slab.high_water() as usize - sh.slab.live()
            })
            .sum();
        let log = self.tombstones.lock().bytes();
        let reserve = crate::delta::MAX_TOMBSTONES * 16;
        (self.bytes() + reserve.saturating_sub(log)).saturating_sub(free * self.row_bytes())
    }

    /// Bytes of one row slot (key, metadata, weights and optimizer state).
    pub fn row_bytes(&self) -> usize {
        (self.meta_words + self.codec.stored_words()) * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Eviction, TableConfig};

    fn table(ev: Eviction) -> Table {
        Table::new(TableConfig {
            dim: 2,
            shards: 4,
            eviction: Some(ev),
            ..TableConfig::default()
        })
        .unwrap()
    }

    fn pull(t: &Table, keys: &[u64]) {
        let mut out = vec![0.0; keys.len() * t.dim()];
        t.pull(keys, &mut out);
    }

    #[test]
    fn advance_steps_moves_the_clock_by_n_and_saturates() {
        let t = table(Eviction {
            max_idle_steps: Some(3),
            ..Eviction::default()
        });
        assert_eq!(t.advance_steps(5), 5);
        assert_eq!(t.advance_steps(0), 5);
        assert_eq!(t.step(), 5);
        assert_eq!(t.advance_steps(u32::MAX), FREE_STEP - 1);
    }

    #[test]
    fn idle_steps_eviction_hands_back_the_removed_keys_and_counts_the_reason() {
        let t = table(Eviction {
            max_idle_steps: Some(2),
            ..Eviction::default()
        });
        pull(&t, &[1, 2, 3]);
        t.advance_steps(2);
        pull(&t, &[3]);
        t.advance_steps(1);
        let mut gone = Vec::new();
        let st = t.evict_collect(usize::MAX, &mut gone);
        gone.sort_unstable();
        assert_eq!(gone, vec![1, 2]);
        assert_eq!(st.evicted, 2);
        assert!(t.contains(3));
        assert_eq!(
            t.evictions(),
            Evictions {
                idle_steps: 2,
                ..Evictions::default()
            }
        );
        assert_eq!(t.stats().evicted, 2);
    }

    #[test]
    fn idle_seconds_evicts_rows_not_pulled_since_the_ttl_began() {
        let t = table(Eviction {
            max_idle_seconds: Some(10.0),
            ..Eviction::default()
        });
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        pull(&t, &[1, 2]);
        t.evict_at(usize::MAX, at(0), None); // sample (step 0, t0)
        t.advance_steps(1);
        pull(&t, &[2]); // row 2 last pulled at step 1
        t.evict_at(usize::MAX, at(5), None); // sample (1, t0 + 5)
        t.advance_steps(1);
        // 9 s after the start nothing is 10 s idle yet.
        assert_eq!(t.evict_at(usize::MAX, at(9), None).evicted, 0);
        // At 12 s the clock showed step 0 ten seconds before: row 1 (step 0) is not older
        // than that step, so it stays until a sample at or after its last pull is 10 s old.
        assert_eq!(t.evict_at(usize::MAX, at(12), None).evicted, 0);
        // At 15 s the clock showed step 1 ten seconds before: row 1 (last pulled at step 0)
        // is idle for more than 10 s, row 2 (step 1) is not.
        let mut gone = Vec::new();
        t.evict_at(usize::MAX, at(15), Some(&mut gone));
        assert_eq!(gone, vec![1]);
        assert!(t.contains(2));
        assert_eq!(t.evictions().idle_seconds, 1);
        assert_eq!(t.evictions().idle_steps, 0);
    }

    #[test]
    fn evict_stalest_removes_about_the_asked_rows_oldest_first() {
        let t = Table::new(TableConfig {
            dim: 2,
            shards: 4,
            ..TableConfig::default()
        })
        .unwrap();
        for step in 0..10u64 {
            let keys: Vec<u64> = (step * 1000..step * 1000 + 1000).collect();
            pull(&t, &keys);
            t.advance_steps(1);
        }
        let mut gone = Vec::new();
        let n = t.evict_stalest(3000, &mut gone);
        assert_eq!(n, gone.len());
        assert!((3000..=3300).contains(&n), "{n}");
        // The oldest steps went first: every key of steps 0..=2 is gone, none of 4..
        assert!((0..3000).all(|k| !t.contains(k)));
        assert!((4000..10_000).all(|k| t.contains(k)));
        assert_eq!(t.evictions().memory_limit, n as u64);
        // Ties: every row at one step, half asked: exactly half goes.
        let u = Table::new(TableConfig {
            dim: 2,
            ..TableConfig::default()
        })
        .unwrap();
        pull(&u, &(0..2000).collect::<Vec<_>>());
        assert_eq!(u.evict_stalest(1000, &mut Vec::new()), 1000);
        assert_eq!(u.len(), 1000);
    }

    #[test]
    fn used_bytes_drop_by_the_freed_slots_and_bytes_match_stats() {
        let t = table(Eviction {
            max_idle_steps: Some(1),
            ..Eviction::default()
        });
        pull(&t, &(0..5000).collect::<Vec<_>>());
        assert_eq!(t.bytes(), t.stats().bytes);
        let reserve = crate::delta::MAX_TOMBSTONES * 16;
        // Empty tombstone log: counted at its cap.
        let before = t.used_bytes();
        assert_eq!(before, t.bytes() + reserve);
        let n = t.evict_stalest(2000, &mut Vec::new());
        assert!(n >= 2000);
        // The log grew (within its reserve) and the freed slots are not counted.
        assert_eq!(t.used_bytes(), before - n * t.row_bytes());
    }
}
