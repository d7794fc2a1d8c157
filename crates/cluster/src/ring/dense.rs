//! Dense mode allreduce: a [`DenseStore`] over a ring of the job's workers. Each step the
//! workers average their dense gradients with [`Ring::allreduce`] and each applies the same
//! optimizer step to its own copy of the dense parameters; the PS shards only keep the state
//! for start, checkpoints and evaluation (see `sparta_ps` dense mode `Allreduce`).
//!
//! **Uneven ends.** Workers read disjoint parts of the input, so one may run out of batches
//! steps before another. A ring call needs every rank, so a worker whose input ended keeps
//! joining the calls with zero gradients ([`RingDense::drain`]) until every worker's input has
//! ended. Each call carries one extra value, 1 from a worker that trained a batch and 0 from a
//! draining one, so the gradients are averaged over the workers that trained, as a sync PS
//! averages over the workers that pushed.
//!
//! **Same bits everywhere.** The ring hands every rank the same reduced vector; every rank
//! divides by the same count and applies the same optimizer to the same parameters, so the
//! copies stay bit-identical (checked by the process tests with a checksum).

use parking_lot::Mutex;
use sparta_core::{CoreError, DenseStore};
use sparta_nn::optim::{self, OptimizerState};
use sparta_nn::DenseOptimizer;
use sparta_ring::{Ring, RingError};

/// A worker's side of dense mode allreduce.
pub struct RingDense {
    optimizer: DenseOptimizer,
    inner: Mutex<Inner>,
}

struct Inner {
    ring: Ring,
    /// This worker's copy of the dense parameters after the last step (the model's own are
    /// the same; this one is what checkpoints and the end publish, and what a draining worker
    /// keeps up to date).
    params: Vec<f32>,
    opt: OptimizerState,
    buf: Vec<f32>,
}

/// What a ring call gave: the averaged gradients are in `buf[..len]`.
enum Reduced {
    /// Gradients averaged over this many workers' worth (`count` as the ring left it).
    Trained,
    /// No worker trained a batch in this call: every input has ended.
    AllDone,
}

fn ring_err(e: RingError) -> CoreError {
    CoreError::Transport(format!("dense all-reduce: {e}"))
}

impl RingDense {
    /// A ring-backed dense store starting from `params` and `opt` (the state the PS shards
    /// handed out, the same on every worker).
    pub fn new(
        ring: Ring,
        optimizer: DenseOptimizer,
        params: &[f32],
        opt: OptimizerState,
    ) -> Result<Self, CoreError> {
        if !opt.fits(&optimizer, params.len()) {
            return Err(CoreError::Training(format!(
                "the dense optimizer state holds {} + {} slot values for {} parameters under \
                 {optimizer:?}: was it written by another job config?",
                opt.slot1.len(),
                opt.slot2.len(),
                params.len()
            )));
        }
        Ok(Self {
            optimizer,
            inner: Mutex::new(Inner {
                ring,
                params: params.to_vec(),
                opt,
                buf: Vec::with_capacity(params.len() + 1),
            }),
        })
    }

    /// This worker's dense parameters and optimizer state (identical on every worker).
    pub fn state(&self) -> (Vec<f32>, OptimizerState) {
        let g = self.inner.lock();
        (g.params.clone(), g.opt.clone())
    }

    /// Bytes this worker sent and received on the ring (headers included).
    pub fn bytes(&self) -> (u64, u64) {
        let g = self.inner.lock();
        (g.ring.bytes_sent(), g.ring.bytes_received())
    }

    /// Workers in the ring.
    pub fn workers(&self) -> usize {
        self.inner.lock().ring.size()
    }

    /// Joins ring calls with zero gradients (this worker's input has ended) until no worker
    /// trains any more, applying the others' averaged gradients to this worker's copy.
    /// Returns the calls joined. Every worker leaves at the same call.
    pub fn drain(&self) -> Result<u64, CoreError> {
        let mut g = self.inner.lock();
        let n = g.params.len();
        let mut calls = 0;
        loop {
            let Inner {
                ring,
                params,
                opt,
                buf,
            } = &mut *g;
            buf.clear();
            buf.resize(n + 1, 0.0);
            calls += 1;
            match reduce(ring, buf)? {
                Reduced::AllDone => return Ok(calls),
                Reduced::Trained => optim::apply(&self.optimizer, opt, params, &buf[..n]),
            }
        }
    }
}

/// All-reduces `buf` (gradients, then this worker's count: 1 or 0) and leaves the gradients
/// averaged over the workers that trained in `buf[..len - 1]`.
fn reduce(ring: &mut Ring, buf: &mut [f32]) -> Result<Reduced, CoreError> {
    ring.allreduce(buf).map_err(ring_err)?;
    let (grads, count) = buf.split_at_mut(buf.len() - 1);
    // The ring averaged over all ranks; `count` is the share of them that trained.
    let c = count[0];
    if c <= 0.0 {
        return Ok(Reduced::AllDone);
    }
    if c != 1.0 {
        for x in grads {
            *x /= c;
        }
    }
    Ok(Reduced::Trained)
}

impl DenseStore for RingDense {
    fn push_pull(&self, grads: &[f32], params: &mut [f32]) -> Result<(), CoreError> {
        let mut g = self.inner.lock();
        if grads.len() != g.params.len() || params.len() != g.params.len() {
            return Err(CoreError::Training(format!(
                "dense vector of {} gradients and {} parameters, the ring holds {}",
                grads.len(),
                params.len(),
                g.params.len()
            )));
        }
        let Inner {
            ring,
            params: copy,
            opt,
            buf,
        } = &mut *g;
        buf.clear();
        buf.extend_from_slice(grads);
        buf.push(1.0);
        // This worker trained, so the count is at least 1 / size.
        reduce(ring, buf)?;
        let n = grads.len();
        optim::apply(&self.optimizer, opt, copy, &buf[..n]);
        params.copy_from_slice(copy);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sparta_ring::{form_ring, Compression, RingConfig};
    use std::net::TcpListener;
    use std::time::Duration;

    fn rings(n: usize, compression: Compression) -> Vec<Ring> {
        let listeners: Vec<TcpListener> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let peers: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let handles: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, l)| {
                let cfg = RingConfig {
                    rank,
                    peers: peers.clone(),
                    token: "t".into(),
                    compression,
                    form_timeout: Duration::from_secs(20),
                    io_timeout: Duration::from_secs(20),
                    tls: None,
                };
                std::thread::spawn(move || form_ring(&cfg, l).unwrap())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    const ADAM: DenseOptimizer = DenseOptimizer::Adam {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
    };

    /// Worker `r` trains `steps[r]` steps on gradients that depend on its rank and step,
    /// then drains; returns its final state and the drain's call count.
    fn run(rings: Vec<Ring>, steps: &[usize], dim: usize) -> Vec<(Vec<f32>, OptimizerState, u64)> {
        let steps = steps.to_vec();
        let init: Vec<f32> = (0..dim).map(|i| i as f32 * 0.1).collect();
        let handles: Vec<_> = rings
            .into_iter()
            .enumerate()
            .map(|(r, ring)| {
                let (init, mine, steps) = (init.clone(), steps[r], steps.clone());
                let longest = steps.iter().all(|&s| s <= mine);
                std::thread::spawn(move || {
                    let opt = OptimizerState::new(&ADAM, dim);
                    let d = RingDense::new(ring, ADAM, &init, opt).unwrap();
                    let mut params = init.clone();
                    for s in 0..mine {
                        let g: Vec<f32> = (0..dim)
                            .map(|i| ((r + 1) * (i + 1) + s) as f32 * 0.37 - 1.0)
                            .collect();
                        d.push_pull(&g, &mut params).unwrap();
                    }
                    let calls = d.drain().unwrap();
                    let (p, o) = d.state();
                    if longest {
                        // Workers that ended earlier went on updating their copy in the drain.
                        assert_eq!(p, params, "the copy is the model's parameters");
                    }
                    (p, o, calls)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// What a sync PS computes: per step, the mean of the gradients of the workers that
    /// still train, applied once.
    fn reference(steps: &[usize], dim: usize) -> (Vec<f32>, OptimizerState) {
        let mut p: Vec<f32> = (0..dim).map(|i| i as f32 * 0.1).collect();
        let mut opt = OptimizerState::new(&ADAM, dim);
        for s in 0..*steps.iter().max().unwrap() {
            let active: Vec<usize> = (0..steps.len()).filter(|&r| steps[r] > s).collect();
            let mut g = vec![0.0f32; dim];
            for &r in &active {
                for (i, x) in g.iter_mut().enumerate() {
                    *x += ((r + 1) * (i + 1) + s) as f32 * 0.37 - 1.0;
                }
            }
            for x in &mut g {
                *x /= active.len() as f32;
            }
            optim::apply(&ADAM, &mut opt, &mut p, &g);
        }
        (p, opt)
    }

    #[test]
    fn uneven_workers_end_bit_identical_and_match_a_sync_ps() {
        for (n, steps) in [(2, vec![5, 3]), (3, vec![4, 7, 2]), (3, vec![3, 3, 3])] {
            let dim = 37;
            let out = run(rings(n, Compression::None), &steps, dim);
            for (r, o) in out.iter().enumerate() {
                assert_eq!(o.0, out[0].0, "parameters differ between workers");
                assert_eq!(o.1, out[0].1, "optimizer state differs between workers");
                // Every worker made the same ring calls: its steps, then the drain's.
                let longest = *steps.iter().max().unwrap() as u64;
                assert_eq!(
                    steps[r] as u64 + o.2,
                    longest + 1,
                    "worker {r}'s ring calls"
                );
            }
            let (want, opt) = reference(&steps, dim);
            assert_eq!(
                out[0].1.step, opt.step,
                "one optimizer step per step of the longest"
            );
            for (a, b) in out[0].0.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn compressed_rings_stay_bit_identical() {
        for c in [Compression::Fp16, Compression::Bf16] {
            let out = run(rings(3, c), &[6, 4, 5], 50);
            assert_eq!(out[1].0, out[0].0);
            assert_eq!(out[2].0, out[0].0);
        }
    }

    #[test]
    fn a_state_of_the_wrong_shape_is_refused() {
        let ring = rings(1, Compression::None).pop().unwrap();
        let opt = OptimizerState::new(&DenseOptimizer::Sgd { lr: 0.1 }, 3);
        let e = RingDense::new(ring, ADAM, &[0.0; 3], opt).err().unwrap();
        assert!(e.to_string().contains("another job config"), "{e}");
    }
}
