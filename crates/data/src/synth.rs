//! Deterministic synthetic click logs in the Criteo layout.
//!
//! A hidden logistic click model: every id of every field has an effect drawn from the
//! model seed (fields differ in strength, some are pure noise), id popularity is a power
//! law, a few field pairs interact for their popular ids, and the integer columns add
//! `beta * ln(1 + x)` effects. The bias is calibrated so about 25% of rows are clicks.
//! Output depends only on the config (row `i` is generated from `hash(seed, i)`).

use std::io::{self, Write};

use sparta_mix::splitmix64 as mix;

/// Generator settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthConfig {
    /// Rows to write.
    pub rows: u64,
    /// Seed of the row sampling.
    pub seed: u64,
    /// Seed of the hidden click model (effects, vocabularies).
    pub model_seed: u64,
    /// Multiplier of every field's vocabulary size.
    pub vocab_scale: f64,
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig {
            rows: 100_000,
            seed: 1,
            model_seed: 42,
            vocab_scale: 1.0,
        }
    }
}

/// Vocabulary size of each categorical field at `vocab_scale = 1`.
const VOCAB: [f64; 26] = [
    1_400.0, 550.0, 200_000.0, 80_000.0, 300.0, 24.0, 12_000.0, 630.0, 3.0, 40_000.0, 5_600.0,
    150_000.0, 3_200.0, 27.0, 14_000.0, 100_000.0, 10.0, 5_600.0, 2_100.0, 4.0, 120_000.0, 18.0,
    15.0, 60_000.0, 100.0, 30_000.0,
];
/// Probability that a categorical value is missing.
const CAT_MISSING: [f64; 26] = [
    0.0, 0.0, 0.03, 0.03, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0,
    0.44, 0.44, 0.03, 0.0, 0.76, 0.44, 0.0, 0.44,
];
/// Standard deviation of the per-id effects of each field (0 = noise field).
const CAT_SIGMA: [f64; 26] = [
    0.4, 0.3, 0.6, 0.5, 0.2, 0.3, 0.4, 0.1, 0.2, 0.5, 0.3, 0.6, 0.1, 0.2, 0.5, 0.4, 0.3, 0.0, 0.2,
    0.1, 0.5, 0.2, 0.0, 0.3, 0.2, 0.0,
];
/// Interacting field pairs and the strength of their interaction.
const PAIRS: [(usize, usize, f64); 4] = [(0, 2, 0.8), (5, 9, 0.7), (13, 16, 0.6), (1, 22, 0.6)];
/// Only ids of rank below this interact (so the interaction is learnable).
const PAIR_TOP: u64 = 64;
/// (median log-count, spread, missing rate) of the integer columns.
const INTS: [(f64, f64, f64); 13] = [
    (0.5, 1.0, 0.45),
    (1.5, 1.5, 0.0),
    (2.0, 1.2, 0.2),
    (1.5, 1.0, 0.2),
    (7.0, 2.0, 0.03),
    (3.0, 1.5, 0.22),
    (1.5, 1.3, 0.04),
    (2.5, 1.0, 0.0),
    (3.5, 1.3, 0.04),
    (0.3, 0.5, 0.45),
    (1.0, 0.8, 0.04),
    (0.2, 0.8, 0.77),
    (2.0, 1.0, 0.2),
];

pub(crate) fn hash3(a: u64, b: u64, c: u64) -> u64 {
    mix(mix(mix(a) ^ b) ^ c)
}

/// Uniform in (0, 1) from a hash.
#[inline]
pub(crate) fn unit(h: u64) -> f64 {
    ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// Standard normal from a hash (Box-Muller).
pub(crate) fn normal(h: u64) -> f64 {
    let (u1, u2) = (unit(h), unit(mix(h)));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// The generators' row stream (also used by the rich profile).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        // Not `splitmix64_next`: the output mixes the advanced state once more through
        // `mix` (which adds the gamma again); kept as is, generated data sets depend on it.
        self.0 = self.0.wrapping_add(sparta_mix::GOLDEN_GAMMA);
        mix(self.0)
    }
    pub(crate) fn unit(&mut self) -> f64 {
        unit(self.next())
    }
    /// Uniform in `0..n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Zipf-like rank in `0..n`: log-uniform, P(rank r) ~ 1/(r+1).
    pub(crate) fn zipf(&mut self, n: u64) -> u64 {
        (((n as f64).powf(self.unit()) as u64).saturating_sub(1)).min(n - 1)
    }
}

/// One sampled row: categorical ranks (`None` = missing) and integers.
struct Row {
    cats: [Option<u64>; 26],
    ints: [Option<i64>; 13],
}

struct Model {
    seed: u64,
    vocab: [u64; 26],
    beta: [f64; 13],
    bias: f64,
}

impl Model {
    fn new(model_seed: u64, vocab_scale: f64) -> Model {
        let mut vocab = [0u64; 26];
        for (v, base) in vocab.iter_mut().zip(VOCAB) {
            *v = ((base * vocab_scale).round() as u64).max(2);
        }
        let mut beta = [0.0; 13];
        for (j, b) in beta.iter_mut().enumerate() {
            *b = 0.15 * normal(hash3(model_seed, 77, j as u64));
        }
        let mut m = Model {
            seed: model_seed,
            vocab,
            beta,
            bias: 0.0,
        };
        m.bias = m.calibrate(0.25);
        m
    }

    fn sample(&self, rng: &mut Rng) -> Row {
        let mut cats = [None; 26];
        for (f, c) in cats.iter_mut().enumerate() {
            if rng.unit() >= CAT_MISSING[f] {
                // log-uniform rank: P(rank r) ~ 1/(r+1), a power law
                let v = self.vocab[f];
                let r = ((v as f64).powf(rng.unit()) as u64).saturating_sub(1);
                *c = Some(r.min(v - 1));
            }
        }
        let mut ints = [None; 13];
        for (j, x) in ints.iter_mut().enumerate() {
            let (mu, sd, miss) = INTS[j];
            if rng.unit() >= miss {
                let z = normal(rng.next());
                let mut v = ((mu + sd * z).exp() - 1.0).max(0.0).floor() as i64;
                if j == 1 && rng.unit() < 0.05 {
                    v = -1;
                }
                *x = Some(v);
            }
        }
        Row { cats, ints }
    }

    fn logit(&self, row: &Row) -> f64 {
        let mut z = self.bias;
        for (f, c) in row.cats.iter().enumerate() {
            let rank = c.unwrap_or(u64::MAX);
            z += CAT_SIGMA[f] * normal(hash3(self.seed, f as u64, rank));
        }
        for (k, &(a, b, s)) in PAIRS.iter().enumerate() {
            if let (Some(ra), Some(rb)) = (row.cats[a], row.cats[b]) {
                if ra < PAIR_TOP && rb < PAIR_TOP {
                    z += s * normal(hash3(self.seed, 1000 + k as u64, ra * PAIR_TOP + rb));
                }
            }
        }
        for (j, x) in row.ints.iter().enumerate() {
            if let Some(v) = x {
                z += self.beta[j] * crate::batch::log_transform(*v as f64) as f64;
            }
        }
        z
    }

    /// Bias giving a mean click probability of `target` on a fixed calibration sample.
    fn calibrate(&self, target: f64) -> f64 {
        let mut rng = Rng(hash3(self.seed, 0xCA1, 0));
        let logits: Vec<f64> = (0..20_000)
            .map(|_| self.logit(&self.sample(&mut rng)))
            .collect();
        let (mut lo, mut hi) = (-10.0, 10.0);
        for _ in 0..50 {
            let b = 0.5 * (lo + hi);
            let mean = logits.iter().map(|z| sigmoid(z + b)).sum::<f64>() / logits.len() as f64;
            if mean < target {
                lo = b;
            } else {
                hi = b;
            }
        }
        0.5 * (lo + hi)
    }

    fn value(&self, field: usize, rank: u64) -> u32 {
        hash3(self.seed ^ 0x5EED, field as u64, rank) as u32
    }
}

pub(crate) fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// Writes `cfg.rows` Criteo-layout lines (`label \t I1..I13 \t C1..C26 \n`) to `out`.
/// The same config always gives byte-identical output.
pub fn write_synthetic(cfg: &SynthConfig, out: &mut dyn Write) -> io::Result<()> {
    let model = Model::new(cfg.model_seed, cfg.vocab_scale);
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    for i in 0..cfg.rows {
        let mut rng = Rng(hash3(cfg.seed, 0x5A11, i));
        let row = model.sample(&mut rng);
        let p = sigmoid(model.logit(&row));
        let label = u8::from(rng.unit() < p);
        buf.push(b'0' + label);
        for x in &row.ints {
            buf.push(b'\t');
            if let Some(v) = x {
                write!(buf, "{v}")?;
            }
        }
        for (f, c) in row.cats.iter().enumerate() {
            buf.push(b'\t');
            if let Some(r) = c {
                write!(buf, "{:08x}", model.value(f, *r))?;
            }
        }
        buf.push(b'\n');
        if buf.len() >= (1 << 20) - 1024 {
            out.write_all(&buf)?;
            buf.clear();
        }
    }
    out.write_all(&buf)?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen(cfg: &SynthConfig) -> Vec<u8> {
        let mut v = Vec::new();
        write_synthetic(cfg, &mut v).unwrap();
        v
    }

    /// Pinned output: generated data sets (and the AUCs measured on them) depend on it.
    #[test]
    fn first_lines_are_pinned() {
        let text = gen(&SynthConfig {
            rows: 2,
            seed: 3,
            ..SynthConfig::default()
        });
        let text = String::from_utf8(text).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "0\t\t1\t14\t3\t9822\t10\t1\t22\t146\t0\t\t1\t\tb24a0fb9\t52606a68\t29e104ff\t\
                 2bc60c06\t1d7f4fbb\tfed4c84d\t81b443ef\t40ca6443\t4612a9b4\ta954350e\t2f07ff13\t\
                 dc2027c0\t4832e3fa\tdd10d232\tbac5285c\tfa987e3a\t3559db89\t7f2b5104\t\t43a34654\t\
                 2b837d1c\tf2af0ccd\t\te53f1232\t1c2ad5d0\t",
                "0\t\t261\t8\t6\t639\t73\t0\t19\t12\t\t0\t\t7\t02711465\t10921096\ta12d4018\t\
                 9efeb8fa\td7068fc3\t0dc569de\tc7ac0428\tbd02d8db\t4612a9b4\t37b0f827\tfe0c705d\t\
                 8a445553\t39bd5aab\t445255dd\te05818d9\t0178bf71\t117654bf\t8bc3a2a6\t\t\t103af47a\t\
                 d0946b9d\t\t9952075a\t88881d77\t493b5651",
            ]
        );
    }

    #[test]
    fn deterministic_and_seeded() {
        let cfg = SynthConfig {
            rows: 2000,
            ..SynthConfig::default()
        };
        let a = gen(&cfg);
        assert_eq!(a, gen(&cfg));
        assert_eq!(a.iter().filter(|&&b| b == b'\n').count(), 2000);
        let b = gen(&SynthConfig {
            seed: 2,
            ..cfg.clone()
        });
        assert_ne!(a, b);
        // a prefix of rows is independent of the total
        let short = gen(&SynthConfig {
            rows: 100,
            ..cfg.clone()
        });
        assert!(a.starts_with(&short));
    }

    #[test]
    fn click_rate_and_signal() {
        let cfg = SynthConfig {
            rows: 20_000,
            seed: 7,
            ..SynthConfig::default()
        };
        let model = Model::new(cfg.model_seed, cfg.vocab_scale);
        let text = gen(&cfg);
        let lines: Vec<&[u8]> = text
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        let pos = lines.iter().filter(|l| l[0] == b'1').count() as f64 / lines.len() as f64;
        assert!((0.21..0.29).contains(&pos), "positive rate {pos}");
        // the label depends on C1: click rates of its two most popular values differ
        let top = |rank: u64| format!("{:08x}", model.value(0, rank));
        let rate = |v: &str| {
            let rows: Vec<_> = lines
                .iter()
                .filter(|l| l.split(|&b| b == b'\t').nth(14) == Some(v.as_bytes()))
                .collect();
            let p = rows.iter().filter(|l| l[0] == b'1').count() as f64;
            (p / rows.len() as f64, rows.len())
        };
        let (r0, n0) = rate(&top(0));
        let (r1, n1) = rate(&top(1));
        assert!(n0 > 500 && n1 > 300, "{n0} {n1}");
        let effect0 = CAT_SIGMA[0] * normal(hash3(cfg.model_seed, 0, 0));
        let effect1 = CAT_SIGMA[0] * normal(hash3(cfg.model_seed, 0, 1));
        assert_eq!(
            r0 > r1,
            effect0 > effect1,
            "rates {r0} {r1}, effects {effect0} {effect1}"
        );
    }
}
