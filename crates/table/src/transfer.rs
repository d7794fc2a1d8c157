//! Rows moving between tables of the same layout as whole internal parts (a slot move: the
//! receiving PS shard takes its staging twin's rows; the source removes the rows of the slots
//! it gave away): one lock per part, stored words copied as they are (no decode, no rounding).

use std::sync::atomic::Ordering::Relaxed;

use crate::error::TableError;
use crate::hash::mix64;
use crate::slab::RowMeta;
use crate::table::Table;

impl Table {
    /// Copies every row of `from` (a twin of this table: same config) into this table,
    /// overwriting rows of the same key, each with the metadata `meta` makes of its own;
    /// part `p` of `from` goes into part `p` here (the same keys land in the same part of
    /// tables of one layout). Returns the rows copied.
    pub fn absorb(
        &self,
        from: &Table,
        meta: impl Fn(RowMeta) -> RowMeta,
    ) -> Result<u64, TableError> {
        if from.shards.len() != self.shards.len()
            || from.codec != self.codec
            || from.row_floats != self.row_floats
        {
            return Err(TableError::InvalidConfig {
                table: self.cfg.name.clone(),
                reason: "its rows cannot take in those of a table of another layout".into(),
            });
        }
        let words = self.codec.stored_words();
        let mut copied = 0u64;
        let mut buf = vec![0u32; words];
        for part in 0..self.shards.len() {
            let src = from.shards[part].0.lock();
            let mut sh = self.shards[part].0.lock();
            let mut put = |sh: &mut crate::shard::Shard, key: u64, stored: &[u32], m: RowMeta| {
                let h = mix64(key);
                let slot = sh.slot_to_overwrite(key, h, meta(m), part)?;
                sh.row_parts_mut(slot).1.copy_from_slice(stored);
                copied += 1;
                Ok::<(), TableError>(())
            };
            for slot in 0..src.slab.high_water() {
                if src.slab.is_live(slot) {
                    buf.copy_from_slice(src.stored(slot));
                    put(&mut sh, src.slab.key(slot), &buf, src.meta(slot))?;
                }
            }
            if let Some(cold) = &src.cold {
                let mut err = Ok(());
                let read = cold.for_each(None, |key, stored, m| {
                    if err.is_ok() {
                        err = put(&mut sh, key, stored, m);
                    }
                });
                err?;
                from.cold_read_or_die(read);
            }
            self.shards[part].1.publish(&sh);
            let moved = sh.demote_over_budget(self.step.load(Relaxed));
            self.counters.demoted.fetch_add(moved, Relaxed);
        }
        Ok(copied)
    }

    /// Removes every row whose key `gone` accepts (recorded as tombstones, as
    /// [`Table::remove`] does), one lock per part. Returns the rows removed.
    pub fn remove_where(&self, gone: impl Fn(u64) -> bool) -> u64 {
        let mut removed = 0u64;
        for part in 0..self.shards.len() {
            let mut keys = Vec::new();
            let stamp = {
                let mut sh = self.shards[part].0.lock();
                for slot in 0..sh.slab.high_water() {
                    if sh.slab.is_live(slot) && gone(sh.slab.key(slot)) {
                        keys.push(sh.slab.key(slot));
                    }
                }
                if let Some(cold) = &sh.cold {
                    let read = cold.for_each(None, |key, _, _| {
                        if gone(key) {
                            keys.push(key);
                        }
                    });
                    self.cold_read_or_die(read);
                }
                keys.retain(|&k| sh.remove(k, mix64(k)));
                self.shards[part].1.publish(&sh);
                self.stamp()
            };
            if keys.is_empty() {
                continue;
            }
            removed += keys.len() as u64;
            self.counters.removed.fetch_add(keys.len() as u64, Relaxed);
            let mut log = self.tombstones.lock();
            for k in keys {
                log.push(k, stamp as u64);
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use crate::codec::RowPrecision;
    use crate::config::{Storage, TableConfig};
    use crate::table::Table;

    fn rows(t: &Table) -> Vec<(u64, Vec<u32>, u32)> {
        let mut v = Vec::new();
        t.for_each_row(|k, r, m| v.push((k, r.iter().map(|x| x.to_bits()).collect(), m.count)));
        v.sort();
        v
    }

    /// A staging twin's rows land bit for bit (RAM and SSD-tier rows alike, compact rows
    /// too), with the metadata asked for; removing them again leaves the table's own.
    #[test]
    fn a_twin_is_absorbed_bit_for_bit_and_removed_again_with_tombstones() {
        let dir = tempfile::tempdir().unwrap();
        for (precision, tier) in [
            (RowPrecision::F32, false),
            (RowPrecision::Bf16, false),
            (RowPrecision::F32, true),
        ] {
            let cfg = TableConfig {
                dim: 4,
                precision,
                storage: tier.then(|| Storage {
                    ram_rows: Some(50),
                    ram_bytes: None,
                    disk_dir: dir.path().to_path_buf(),
                }),
                ..TableConfig::default()
            };
            let own = Table::new(cfg.clone()).unwrap();
            let twin = Table::new(cfg).unwrap();
            let mine: Vec<u64> = (0..300).map(|k| k * 2).collect();
            let moved: Vec<u64> = (0..400).map(|k| k * 2 + 1).collect();
            let mut out = vec![0.0; 400 * 4];
            own.pull(&mine, &mut out[..1200]);
            twin.pull(&moved, &mut out);
            twin.push(&moved, &vec![0.5; 1600]);
            let before = rows(&own);
            let want = rows(&twin);
            let v = own.version() + 1;
            let n = own
                .absorb(&twin, |m| crate::slab::RowMeta {
                    version: v as u32,
                    ..m
                })
                .unwrap();
            assert_eq!(n, 400, "{precision:?} tier {tier}");
            let all = rows(&own);
            assert_eq!(all.len(), 700);
            for r in &want {
                assert!(all.contains(r), "{precision:?} tier {tier}: {r:?}");
            }
            own.for_each_row(|k, _, m| {
                if k % 2 == 1 {
                    assert_eq!(m.version as u64, v);
                }
            });
            let at = own.version();
            assert_eq!(own.remove_where(|k| k % 2 == 1), 400);
            assert_eq!(rows(&own), before, "{precision:?} tier {tier}");
            assert_eq!(own.removed_since(at).0.len(), 400);
            assert_eq!(own.len(), 300);
        }
    }

    #[test]
    fn a_table_of_another_layout_is_refused() {
        let a = Table::new(TableConfig {
            dim: 4,
            ..TableConfig::default()
        })
        .unwrap();
        let b = Table::new(TableConfig {
            dim: 8,
            ..TableConfig::default()
        })
        .unwrap();
        assert!(a.absorb(&b, |m| m).is_err());
    }
}
