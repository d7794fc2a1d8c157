//! Fused Unique + DynamicPartition: one pass over a batch's ids yields the distinct ids grouped
//! by parameter-server shard, plus the inverse index (occurrence -> distinct id) that is kept and
//! reused to scatter gradients for the push (the seed system's metadata reuse).

use hashbrown::HashMap;

use crate::routing::Routing;

/// The distinct ids of a batch, grouped by shard and, inside a shard, by class (see
/// [`crate::features`]: which physical tables a key has rows in), and the inverse index.
#[derive(Debug, Default, Clone)]
pub struct UniqueIds {
    /// Distinct ids; those of shard `s` are `keys[shard_offsets[s]..shard_offsets[s + 1]]`.
    pub keys: Vec<u64>,
    /// `num_shards + 1` offsets into `keys`.
    pub shard_offsets: Vec<usize>,
    /// Classes per shard (1 when keys are not classed).
    pub classes: usize,
    /// `num_shards * classes + 1` offsets into `keys`: part `s * classes + c` holds the ids of
    /// shard `s` and class `c`.
    pub part_offsets: Vec<usize>,
    /// For every occurrence in the input, the index of its id in `keys`.
    pub inverse: Vec<u32>,
}

impl UniqueIds {
    /// Number of distinct ids.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when the batch had no ids.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The distinct ids routed to `shard`.
    pub fn shard_keys(&self, shard: usize) -> &[u64] {
        &self.keys[self.shard_offsets[shard]..self.shard_offsets[shard + 1]]
    }

    /// The keys with their (shard, class) grouping, as the stores take them.
    pub fn parts(&self) -> KeyParts<'_> {
        KeyParts {
            keys: &self.keys,
            offsets: &self.part_offsets,
            classes: self.classes.max(1),
        }
    }
}

/// Distinct keys grouped by (shard, class): what a pull or push carries.
#[derive(Clone, Copy, Debug)]
pub struct KeyParts<'a> {
    /// The keys.
    pub keys: &'a [u64],
    /// `shards * classes + 1` offsets into `keys`.
    pub offsets: &'a [usize],
    /// Classes per shard.
    pub classes: usize,
}

impl<'a> KeyParts<'a> {
    /// Keys of one class: every key, one part per shard as `shard_offsets` says.
    pub fn single(keys: &'a [u64], shard_offsets: &'a [usize]) -> KeyParts<'a> {
        KeyParts {
            keys,
            offsets: shard_offsets,
            classes: 1,
        }
    }

    /// Number of shards.
    pub fn num_shards(&self) -> usize {
        (self.offsets.len().max(1) - 1) / self.classes
    }

    /// Range of `keys` routed to `shard`.
    pub fn shard_range(&self, shard: usize) -> std::ops::Range<usize> {
        self.offsets[shard * self.classes]..self.offsets[(shard + 1) * self.classes]
    }

    /// Ranges of `keys` of `shard` whose class is in `mask` (bit c = class c), in class order.
    pub fn ranges(
        &self,
        shard: usize,
        mask: u64,
    ) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        (0..self.classes)
            .filter(move |c| mask >> c & 1 == 1)
            .map(move |c| {
                let p = shard * self.classes + c;
                self.offsets[p]..self.offsets[p + 1]
            })
            .filter(|r| !r.is_empty())
    }

    /// Keys of `shard` whose class is in `mask`.
    pub fn count(&self, shard: usize, mask: u64) -> usize {
        self.ranges(shard, mask).map(|r| r.len()).sum()
    }

    /// Keys (all shards) whose class is in `mask`: the rows a table reads or writes.
    pub fn total(&self, mask: u64) -> usize {
        (0..self.num_shards()).map(|s| self.count(s, mask)).sum()
    }
}

/// Reusable scratch space so a steady-state step allocates nothing.
#[derive(Default)]
pub struct Deduper {
    index: HashMap<u64, u32, foldhash::fast::FixedState>,
    first_seen: Vec<u64>,
    part_of_first: Vec<u32>,
    position: Vec<u32>,
}

impl Deduper {
    /// A deduper with empty scratch space.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fills `out` with the distinct ids of `ids` grouped by shard and the inverse index.
    /// Within a shard, ids keep their first-seen order (deterministic).
    pub fn run(&mut self, ids: &[u64], routing: &Routing, out: &mut UniqueIds) {
        self.run_classed(ids, routing, &[], 1, out)
    }

    /// Like [`Deduper::run`], with the ids of a shard grouped by class: `class_of_tag[id >> 56]`
    /// (an empty table means one class). Within a part, ids keep their first-seen order.
    pub fn run_classed(
        &mut self,
        ids: &[u64],
        routing: &Routing,
        class_of_tag: &[u8],
        classes: usize,
        out: &mut UniqueIds,
    ) {
        let num_shards = routing.num_shards();
        let classes = if class_of_tag.is_empty() {
            1
        } else {
            classes.max(1)
        };
        let parts = num_shards * classes;
        self.index.clear();
        self.index.reserve(ids.len() / 2);
        self.first_seen.clear();
        self.part_of_first.clear();
        out.inverse.clear();
        out.inverse.reserve(ids.len());
        out.classes = classes;
        out.part_offsets.clear();
        out.part_offsets.resize(parts + 1, 0);
        // Pass 1 (the fused one): unique, inverse in first-seen numbering, part counts.
        for &id in ids {
            let next = self.first_seen.len() as u32;
            let local = *self.index.entry(id).or_insert(next);
            if local == next {
                self.first_seen.push(id);
                let mut p = routing.shard_of(id);
                if classes > 1 {
                    p = p * classes + class_of_tag[(id >> 56) as usize] as usize;
                }
                self.part_of_first.push(p as u32);
                out.part_offsets[p + 1] += 1;
            }
            out.inverse.push(local);
        }
        for p in 0..parts {
            out.part_offsets[p + 1] += out.part_offsets[p];
        }
        out.shard_offsets.clear();
        out.shard_offsets
            .extend((0..=num_shards).map(|s| out.part_offsets[s * classes]));
        // Place distinct ids by part (a counting sort over the distinct ids only).
        out.keys.clear();
        out.keys.resize(self.first_seen.len(), 0);
        self.position.clear();
        self.position.resize(self.first_seen.len(), 0);
        let nonempty = (0..parts)
            .filter(|&p| out.part_offsets[p + 1] > out.part_offsets[p])
            .count();
        if nonempty <= 1 {
            // One part holds every id: first-seen order is already the grouped order.
            out.keys.copy_from_slice(&self.first_seen);
            return;
        }
        let mut cursor: Vec<usize> = out.part_offsets[..parts].to_vec();
        for (local, (&id, &s)) in self.first_seen.iter().zip(&self.part_of_first).enumerate() {
            let at = cursor[s as usize];
            cursor[s as usize] += 1;
            out.keys[at] = id;
            self.position[local] = at as u32;
        }
        for inv in &mut out.inverse {
            *inv = self.position[*inv as usize];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn groups_by_shard_and_inverts() {
        let ids = [5u64, 9, 5, 1 << 60, 9, 77, 5];
        let mut d = Deduper::new();
        let mut u = UniqueIds::default();
        d.run(&ids, &Routing::even(3), &mut u);
        assert_eq!(u.len(), 4);
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(u.keys[u.inverse[i] as usize], id);
        }
        let r = Routing::even(3);
        for s in 0..3 {
            for &k in u.shard_keys(s) {
                assert_eq!(r.shard_of(k), s);
            }
        }
    }

    proptest! {
        #[test]
        fn dedup_matches_model(ids in proptest::collection::vec(0u64..50, 0..300), shards in 1usize..5) {
            let mut d = Deduper::new();
            let mut u = UniqueIds::default();
            d.run(&ids, &Routing::even(shards), &mut u);
            let distinct: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
            prop_assert_eq!(u.len(), distinct.len());
            let got: std::collections::BTreeSet<u64> = u.keys.iter().copied().collect();
            prop_assert_eq!(got, distinct);
            prop_assert_eq!(u.inverse.len(), ids.len());
            for (i, &id) in ids.iter().enumerate() {
                prop_assert_eq!(u.keys[u.inverse[i] as usize], id);
            }
            prop_assert_eq!(*u.shard_offsets.last().unwrap(), u.len());
        }
    }
}
