//! Shared fixtures: a live "trainer" (tables + dense model) that the tests change between
//! exports, and comparisons of a loaded snapshot against it.
#![allow(dead_code)]

use sparta_core::{Job, JobConfig, SparseStore};
use sparta_data::{write_synthetic, Batch, SynthConfig};
use sparta_nn::Model;
use sparta_serve::{RequestParser, Snapshot};
use sparta_table::Table;

/// A small job: criteo layout, dim-4 embeddings, a 16-8 MLP, one thread.
pub fn job_text(kind: &str, extra: &str) -> String {
    format!(
        "[data]\nbatch_size = 64\nreader_threads = 1\n[model]\nkind = \"{kind}\"\nhidden = [16, 8]\n\
         [embedding]\ndim = 4\n[train]\nthreads = 1\nseed = 5\n{extra}"
    )
}

/// Tables and a dense model standing in for a trainer.
pub struct Live {
    pub job: Job,
    pub text: String,
    pub model: Model,
    pub emb: Table,
    pub wide: Option<Table>,
    rng: u64,
}

impl Live {
    pub fn new(kind: &str, extra: &str) -> Live {
        Self::with_counts(kind, extra, false)
    }

    /// Its embedding table stores its weights at `precision` (`[embedding] precision`).
    pub fn at_precision(kind: &str, precision: &str) -> Live {
        let text = job_text(kind, "").replace(
            "[embedding]\ndim = 4\n",
            &format!("[embedding]\ndim = 4\nprecision = \"{precision}\"\n"),
        );
        Self::from_text(text, false)
    }

    /// With `counts`, the tables keep pull counts (eviction by min_count 2).
    pub fn with_counts(kind: &str, extra: &str, counts: bool) -> Live {
        Self::from_text(job_text(kind, extra), counts)
    }

    fn from_text(text: String, counts: bool) -> Live {
        let job = JobConfig::from_toml(&text).unwrap().validate().unwrap();
        // A job without [[tables]]: one physical deep table (`embedding`) and `wide`.
        let f = &job.features;
        let mut emb_cfg = f.physical[0].config.clone();
        let mut wide_cfg = f.wide_table.map(|w| f.physical[w].config.clone());
        if counts {
            let ev = sparta_table::Eviction {
                max_idle_steps: None,
                min_count: Some(2),
                max_idle_seconds: None,
            };
            emb_cfg.eviction = Some(ev.clone());
            if let Some(w) = wide_cfg.as_mut() {
                w.eviction = Some(ev);
            }
        }
        Live {
            model: Model::new(job.model.clone()).unwrap(),
            emb: Table::new(emb_cfg).unwrap(),
            wide: wide_cfg.map(|c| Table::new(c).unwrap()),
            job,
            text,
            rng: 0x1234_5678,
        }
    }

    fn next(&mut self) -> f32 {
        self.rng = self
            .rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.rng >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    /// Pulls (creating) and pushes random gradients to `keys`; nudges the dense weights.
    pub fn touch(&mut self, keys: &[u64]) {
        let dim = self.emb.dim();
        let mut rows = vec![0f32; keys.len() * dim];
        self.emb.pull(keys, &mut rows);
        let g: Vec<f32> = (0..rows.len()).map(|_| self.next()).collect();
        self.emb.push(keys, &g);
        if let Some(w) = self.wide.take() {
            let mut rows = vec![0f32; keys.len()];
            w.pull(keys, &mut rows);
            let g: Vec<f32> = (0..keys.len()).map(|_| self.next()).collect();
            w.push(keys, &g);
            self.wide = Some(w);
        }
        let bump = self.next() * 0.01;
        for p in self.model.param_values_mut().iter_mut().step_by(7) {
            *p += bump;
        }
    }

    pub fn tables(&self) -> Vec<(&str, &Table)> {
        let mut t = vec![("embedding", &self.emb)];
        if let Some(w) = &self.wide {
            t.push(("wide", w));
        }
        t
    }
}

/// `n` synthetic criteo lines.
pub fn lines(n: u64, seed: u64) -> Vec<String> {
    let mut buf = Vec::new();
    write_synthetic(
        &SynthConfig {
            rows: n,
            seed,
            vocab_scale: 0.01,
            ..SynthConfig::default()
        },
        &mut buf,
    )
    .unwrap();
    String::from_utf8(buf)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The batch of `lines` and its distinct ids.
pub fn batch_of(lines: &[String]) -> (Batch, Vec<u64>) {
    let b = RequestParser::new(
        &sparta_data::Schema::criteo(),
        &sparta_data::features::InputPlan::legacy(&sparta_data::Schema::criteo()),
    )
    .lines(lines)
    .unwrap();
    let mut ids = b.ids.clone();
    ids.sort_unstable();
    ids.dedup();
    (b, ids)
}

/// The snapshot holds exactly the live weights (bit for bit) and dense parameters.
pub fn assert_matches(snap: &Snapshot, live: &Live) {
    assert_eq!(snap.dense(), live.model.param_values(), "dense parameters");
    let mut maps = snap.tables().iter();
    for (name, table) in live.tables() {
        let (n, map) = maps.next().expect("table in snapshot");
        assert_eq!(n, name);
        assert_eq!(map.len(), table.len(), "rows of {name}");
        let dim = table.dim();
        table.for_each_row(|key, row, _| {
            let got = map
                .get(key)
                .unwrap_or_else(|| panic!("{name}: key {key:x} missing"));
            assert_eq!(
                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                row[..dim].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{name}: key {key:x}"
            );
        });
    }
    assert_eq!(
        snap.tables().table_rows(),
        live.tables()
            .iter()
            .map(|(_, t)| t.len() as u64)
            .sum::<u64>()
    );
}
