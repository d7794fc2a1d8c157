//! Dense optimizers over flat parameter/gradient buffers.

use crate::config::DenseOptimizer;

/// Optimizer state, flat and aligned with the parameters (see [`crate::params::ParamSpec`]).
///
/// * SGD: no slots.
/// * Adagrad: `slot1` = squared-gradient accumulator.
/// * Adam: `slot1` = first moment m, `slot2` = second moment v.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OptimizerState {
    /// Number of steps applied so far (Adam bias correction uses `step` after increment).
    pub step: u64,
    /// First state slot (see type docs); empty when unused.
    pub slot1: Vec<f32>,
    /// Second state slot; empty when unused.
    pub slot2: Vec<f32>,
}

/// Lengths of the two slots `opt` keeps for `n` parameters.
fn slot_lens(opt: &DenseOptimizer, n: usize) -> (usize, usize) {
    match *opt {
        DenseOptimizer::Sgd { .. } => (0, 0),
        DenseOptimizer::Adagrad { .. } => (n, 0),
        DenseOptimizer::Adam { .. } => (n, n),
    }
}

impl OptimizerState {
    /// Fresh state for `n` parameters.
    pub fn new(opt: &DenseOptimizer, n: usize) -> Self {
        let (l1, l2) = slot_lens(opt, n);
        let init = match *opt {
            DenseOptimizer::Adagrad {
                initial_accumulator,
                ..
            } => initial_accumulator,
            DenseOptimizer::Sgd { .. } | DenseOptimizer::Adam { .. } => 0.0,
        };
        OptimizerState {
            step: 0,
            slot1: vec![init; l1],
            slot2: vec![0.0; l2],
        }
    }

    /// Whether this state has the slots `opt` keeps for `n` parameters (a state read from a
    /// checkpoint or another process may not).
    pub fn fits(&self, opt: &DenseOptimizer, n: usize) -> bool {
        (self.slot1.len(), self.slot2.len()) == slot_lens(opt, n)
    }
}

/// One optimizer step: updates `w` from gradient `g` and advances `state`.
pub fn apply(opt: &DenseOptimizer, state: &mut OptimizerState, w: &mut [f32], g: &[f32]) {
    assert_eq!(w.len(), g.len());
    let k = state.begin_step(opt);
    let (s1, s2) = (&mut state.slot1[..], &mut state.slot2[..]);
    apply_chunk(opt, k, w, g, s1, s2);
}

/// The per-step constants of an optimizer step (Adam's bias corrections).
#[derive(Clone, Copy, Debug)]
pub struct StepConsts {
    c1: f32,
    c2: f32,
}

impl OptimizerState {
    /// Advances the step counter and returns the step's constants: call once per step, then
    /// [`apply_chunk`] over every part of the parameters (in any order, on any thread).
    pub fn begin_step(&mut self, opt: &DenseOptimizer) -> StepConsts {
        self.step += 1;
        match *opt {
            DenseOptimizer::Adam { beta1, beta2, .. } => {
                let t = self.step as i32;
                StepConsts {
                    c1: 1.0 / (1.0 - beta1.powi(t)),
                    c2: 1.0 / (1.0 - beta2.powi(t)),
                }
            }
            _ => StepConsts { c1: 1.0, c2: 1.0 },
        }
    }

    /// The optimizer slots of parameters `range` (empty slices where the optimizer keeps none).
    pub fn slots_mut(&mut self, range: std::ops::Range<usize>) -> (&mut [f32], &mut [f32]) {
        let s1 = if self.slot1.is_empty() {
            &mut self.slot1[..]
        } else {
            &mut self.slot1[range.clone()]
        };
        let s2 = if self.slot2.is_empty() {
            &mut self.slot2[..]
        } else {
            &mut self.slot2[range]
        };
        (s1, s2)
    }
}

/// The update of one part of the parameters: `w`, `g` and the slots `s1`/`s2` of the same
/// parameters (slots empty where the optimizer keeps none). Elementwise, so any split of the
/// parameters gives the same values as one call over all of them.
pub fn apply_chunk(
    opt: &DenseOptimizer,
    k: StepConsts,
    w: &mut [f32],
    g: &[f32],
    s1: &mut [f32],
    s2: &mut [f32],
) {
    assert_eq!(w.len(), g.len());
    match *opt {
        DenseOptimizer::Sgd { lr } => {
            for (wi, &gi) in w.iter_mut().zip(g) {
                *wi -= lr * gi;
            }
        }
        DenseOptimizer::Adagrad { lr, eps, .. } => {
            assert_eq!(s1.len(), w.len());
            for ((wi, &gi), a) in w.iter_mut().zip(g).zip(s1.iter_mut()) {
                *a += gi * gi;
                *wi -= lr * gi / (a.sqrt() + eps);
            }
        }
        DenseOptimizer::Adam {
            lr,
            beta1,
            beta2,
            eps,
        } => {
            assert_eq!(s1.len(), w.len());
            assert_eq!(s2.len(), w.len());
            let (c1, c2) = (k.c1, k.c2);
            for (((wi, &gi), m), v) in w.iter_mut().zip(g).zip(s1.iter_mut()).zip(s2.iter_mut()) {
                *m = beta1 * *m + (1.0 - beta1) * gi;
                *v = beta2 * *v + (1.0 - beta2) * gi * gi;
                *wi -= lr * (*m * c1) / ((*v * c2).sqrt() + eps);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: [[f32; 3]; 3] = [[0.5, -1.0, 2.0], [0.1, 0.0, -3.0], [-0.7, 0.25, 1.5]];
    const W0: [f32; 3] = [1.0, -2.0, 0.3];

    fn run(opt: DenseOptimizer) -> Vec<f32> {
        let mut st = OptimizerState::new(&opt, 3);
        let mut w = W0.to_vec();
        for g in G {
            apply(&opt, &mut st, &mut w, &g);
        }
        assert_eq!(st.step, 3);
        w
    }

    fn close(a: &[f32], b: &[f64]) {
        for (x, y) in a.iter().zip(b) {
            assert!((*x as f64 - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn sgd_matches_reference() {
        let lr = 0.1;
        let want: Vec<f64> = (0..3)
            .map(|i| W0[i] as f64 - lr * G.iter().map(|g| g[i] as f64).sum::<f64>())
            .collect();
        close(&run(DenseOptimizer::Sgd { lr: lr as f32 }), &want);
    }

    #[test]
    fn adagrad_matches_reference() {
        let (lr, a0, eps) = (0.5f64, 0.1f64, 1e-6f64);
        let mut want = vec![0.0; 3];
        for i in 0..3 {
            let (mut w, mut a) = (W0[i] as f64, a0);
            for g in G {
                let g = g[i] as f64;
                a += g * g;
                w -= lr * g / (a.sqrt() + eps);
            }
            want[i] = w;
        }
        close(
            &run(DenseOptimizer::Adagrad {
                lr: 0.5,
                initial_accumulator: 0.1,
                eps: 1e-6,
            }),
            &want,
        );
    }

    #[test]
    fn adam_matches_reference() {
        let (lr, b1, b2, eps) = (0.01f64, 0.9f64, 0.999f64, 1e-8f64);
        let mut want = vec![0.0; 3];
        for i in 0..3 {
            let (mut w, mut m, mut v) = (W0[i] as f64, 0.0, 0.0);
            for (t, g) in G.iter().enumerate() {
                let g = g[i] as f64;
                m = b1 * m + (1.0 - b1) * g;
                v = b2 * v + (1.0 - b2) * g * g;
                let mh = m / (1.0 - b1.powi(t as i32 + 1));
                let vh = v / (1.0 - b2.powi(t as i32 + 1));
                w -= lr * mh / (vh.sqrt() + eps);
            }
            want[i] = w;
        }
        close(
            &run(DenseOptimizer::Adam {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            }),
            &want,
        );
    }

    #[test]
    fn chunks_in_any_order_equal_one_pass() {
        for opt in [
            DenseOptimizer::Sgd { lr: 0.1 },
            DenseOptimizer::Adagrad {
                lr: 0.5,
                initial_accumulator: 0.1,
                eps: 1e-6,
            },
            DenseOptimizer::Adam {
                lr: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
            },
        ] {
            let n = 37;
            let g: Vec<f32> = (0..n).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3).collect();
            let (mut whole, mut parts) =
                (OptimizerState::new(&opt, n), OptimizerState::new(&opt, n));
            let w0: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
            let (mut w1, mut w2) = (w0.clone(), w0);
            for _ in 0..3 {
                apply(&opt, &mut whole, &mut w1, &g);
                let k = parts.begin_step(&opt);
                for r in [20..37, 0..8, 8..20] {
                    let (s1, s2) = parts.slots_mut(r.clone());
                    apply_chunk(&opt, k, &mut w2[r.clone()], &g[r], s1, s2);
                }
            }
            assert_eq!(whole, parts, "{opt:?}");
            assert_eq!(
                w1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                w2.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
    }
}
