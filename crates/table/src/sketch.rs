//! Count-min sketch (conservative update, 16-bit saturating counters, periodic halving)
//! counting sightings of not-yet-admitted ids.

const DEPTH: usize = 4;
const SEEDS: [u64; DEPTH] = [
    0x9e37_79b9_7f4a_7c15,
    0xc2b2_ae3d_27d4_eb4f,
    0x1656_67b1_9e37_79f9,
    0x27d4_eb2f_1656_67c5,
];

/// Saved counters that do not fit a sketch's size ([`Sketch::set_state`]).
#[derive(Debug, thiserror::Error)]
#[error("sketch of {expected} counters, the saved one has {found}")]
pub struct SketchSizeMismatch {
    /// Counters of the sketch.
    pub expected: usize,
    /// Counters saved.
    pub found: usize,
}

/// One shard's sketch.
pub struct Sketch {
    counters: Box<[u16]>,
    shift: u32,
    width: usize,
    increments: u64,
}

impl Sketch {
    /// Sketch with `DEPTH` rows of `width` (rounded up to a power of two) counters.
    pub fn new(width: usize) -> Self {
        let width = width.max(256).next_power_of_two();
        Sketch {
            counters: vec![0u16; width * DEPTH].into_boxed_slice(),
            shift: 64 - width.trailing_zeros(),
            width,
            increments: 0,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.counters.len() * 2
    }

    #[inline]
    fn cell(&self, d: usize, h: u64) -> usize {
        d * self.width + (h.wrapping_mul(SEEDS[d] | 1) >> self.shift) as usize
    }

    /// The counters (`DEPTH` rows of `width`) and the increments since the last halving.
    pub fn state(&self) -> (&[u16], u64) {
        (&self.counters, self.increments)
    }

    /// Replaces the counters and the increment count (checkpoint restore). Fails when the
    /// saved counters do not fit this sketch's size.
    pub fn set_state(
        &mut self,
        counters: &[u16],
        increments: u64,
    ) -> Result<(), SketchSizeMismatch> {
        self.check_size(counters)?;
        self.counters.copy_from_slice(counters);
        self.increments = increments;
        Ok(())
    }

    /// Folds in the state of a sketch of the same size that counted other keys (another
    /// shard's, restored on one shard): each counter the larger of the two, which never
    /// undercounts a key either sketch saw; the increments the larger too.
    pub fn merge_state(
        &mut self,
        counters: &[u16],
        increments: u64,
    ) -> Result<(), SketchSizeMismatch> {
        self.check_size(counters)?;
        for (c, &o) in self.counters.iter_mut().zip(counters) {
            *c = (*c).max(o);
        }
        self.increments = self.increments.max(increments);
        Ok(())
    }

    /// Saved counters of another size than this sketch's are refused.
    fn check_size(&self, counters: &[u16]) -> Result<(), SketchSizeMismatch> {
        if counters.len() != self.counters.len() {
            return Err(SketchSizeMismatch {
                expected: self.counters.len(),
                found: counters.len(),
            });
        }
        Ok(())
    }

    /// Counts one sighting of the (mixed) hash `h`; returns the new estimate.
    pub fn increment(&mut self, h: u64) -> u32 {
        let est = (0..DEPTH)
            .map(|d| self.counters[self.cell(d, h)])
            .min()
            .unwrap_or(0);
        let new = est.saturating_add(1);
        for d in 0..DEPTH {
            let c = self.cell(d, h);
            if self.counters[c] < new {
                self.counters[c] = new;
            }
        }
        self.increments += 1;
        if self.increments >= self.width as u64 * 8 {
            // Aging: old sightings fade so the sketch keeps tracking recent traffic.
            self.counters.iter_mut().for_each(|c| *c >>= 1);
            self.increments = 0;
        }
        new as u32
    }
}
