//! Benchmark workload: N distinct field-tagged keys and precomputed Zipf batches.

use hashbrown::HashSet;

use crate::hash::{mix64, RowRng};

/// The i-th distinct key: a field id in the top byte, a scrambled id below.
pub fn key_of(i: u64) -> u64 {
    ((i % 26) << 56) | (mix64(i ^ 0x5EED) >> 8)
}

/// O(1) sampler of ranks in `0..n` with `P(rank) ~ (rank + 1)^-s`: inverse CDF of the
/// bounded continuous power law, floored (s != 1).
pub struct Zipf {
    n: f64,
    s: f64,
    a: f64,
}

impl Zipf {
    /// Sampler over `0..n` with exponent `s` (s != 1).
    pub fn new(n: usize, s: f64) -> Self {
        let one_minus_s = 1.0 - s;
        Zipf {
            n: n as f64,
            s,
            a: (n as f64 + 1.0).powf(one_minus_s) - 1.0,
        }
    }

    /// One rank from a uniform `u` in `[0, 1)`.
    #[inline]
    pub fn sample(&self, u: f64) -> u64 {
        let x = (self.a * u + 1.0).powf(1.0 / (1.0 - self.s)) - 1.0;
        (x as u64).min(self.n as u64 - 1)
    }
}

/// `count` batches of `batch` unique keys each, drawn Zipf(s) over `n` distinct keys
/// (training pushes unique keys per batch, so duplicates within a batch are redrawn).
pub fn zipf_batches(n: usize, s: f64, batch: usize, count: usize, seed: u64) -> Vec<Vec<u64>> {
    let z = Zipf::new(n, s);
    let mut rng = RowRng::new(seed, 0xBA7C);
    let batch = batch.min(n);
    let mut seen = HashSet::with_capacity(batch);
    (0..count)
        .map(|_| {
            seen.clear();
            let mut b = Vec::with_capacity(batch);
            while b.len() < batch {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                let k = key_of(z.sample(u));
                if seen.insert(k) {
                    b.push(k);
                }
            }
            b
        })
        .collect()
}
