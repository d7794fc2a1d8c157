//! `sparta demo`: generate data, train, evaluate — the whole loop on the embedded cluster.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use super::gen_data::{self, GenDataArgs};
use super::train::{self, TrainArgs};

/// Flags of `sparta demo`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// Training rows to generate.
    #[arg(long, visible_alias = "train-rows", default_value_t = 300_000)]
    pub rows: u64,
    /// Test rows to generate.
    #[arg(long, default_value_t = 50_000)]
    pub test_rows: u64,
    /// Model: wdl, deepfm, dcn, dcnv2, dlrm, din, mmoe or esmm.
    #[arg(long, default_value = "wdl")]
    pub model: String,
    /// Where to put the generated files (default: a temporary directory, removed after).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Compute threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write the run summary as JSON here.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
}

/// `sparta demo`.
pub fn run(a: DemoArgs) -> Result<()> {
    let tmp;
    let dir = match &a.dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            d.clone()
        }
        None => {
            tmp = std::env::temp_dir().join(format!("sparta-demo-{}", std::process::id()));
            std::fs::create_dir_all(&tmp)?;
            tmp
        }
    };
    let train_path = dir.join("train.tsv");
    let test_path = dir.join("test.tsv");
    println!(
        "generating {} train + {} test rows of synthetic click logs in {}",
        a.rows,
        a.test_rows,
        dir.display()
    );
    let synth = |rows, seed, out: &PathBuf| GenDataArgs {
        rows,
        seed,
        model_seed: 20261129,
        vocab_scale: 0.05,
        profile: gen_data::Profile::Criteo,
        oracle: None,
        out: out.clone(),
    };
    gen_data::write(&synth(a.rows, 1, &train_path))?;
    gen_data::write(&synth(a.test_rows, 2, &test_path))?;
    let args = TrainArgs {
        model: Some(a.model.clone()),
        train: vec![train_path],
        test: vec![test_path],
        threads: a.threads,
        summary_json: a.summary_json.clone(),
        ..TrainArgs::default()
    };
    let result = train::train_and_report(&args);
    if a.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result.map(|_| ())
}
