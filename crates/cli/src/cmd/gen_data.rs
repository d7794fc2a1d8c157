//! `sparta gen-data`: synthetic click logs in the Criteo layout.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use sparta_data::SynthConfig;

/// Flags of `sparta gen-data`.
#[derive(Args, Debug, Clone)]
pub struct GenDataArgs {
    /// Rows to write.
    #[arg(long, default_value_t = 100_000)]
    pub rows: u64,
    /// Row stream seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seed of the hidden click model (train and test files must share it).
    #[arg(long, default_value_t = 20261129)]
    pub model_seed: u64,
    /// Multiplies every field's vocabulary size.
    #[arg(long, default_value_t = 1.0)]
    pub vocab_scale: f64,
    /// Output file.
    #[arg(long)]
    pub out: PathBuf,
}

/// Writes one synthetic file.
pub fn write(a: &GenDataArgs) -> Result<()> {
    let file =
        std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    sparta_data::write_synthetic(
        &SynthConfig {
            rows: a.rows,
            seed: a.seed,
            model_seed: a.model_seed,
            vocab_scale: a.vocab_scale,
        },
        &mut w,
    )
    .and_then(|_| w.flush())
    .with_context(|| format!("writing {}", a.out.display()))?;
    Ok(())
}

/// `sparta gen-data`.
pub fn run(a: GenDataArgs) -> Result<()> {
    write(&a)?;
    println!("wrote {} rows to {}", a.rows, a.out.display());
    Ok(())
}
