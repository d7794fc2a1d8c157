//! `sparta gen-data`: synthetic click logs, in the Criteo layout (`--profile criteo`, the
//! default) or with feature columns (`--profile rich`: users, items with categories, a
//! weighted tag bag, a click history and a price; layout in `examples/rich.toml`).

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use sparta_data::{RichConfig, SynthConfig};

/// Which synthetic data set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Profile {
    /// The Criteo layout: label, 13 integers, 26 categorical hashes.
    #[default]
    Criteo,
    /// Feature columns: user_id, gender, item_id, item_cat, tags (weighted), hist_items, price;
    /// then a conversion label (after a click) and hist_cats (the history's categories).
    Rich,
}

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
    /// Multiplies every field's vocabulary size (profile criteo).
    #[arg(long, default_value_t = 1.0)]
    pub vocab_scale: f64,
    /// The data set: criteo or rich.
    #[arg(long, value_enum, default_value_t = Profile::Criteo)]
    pub profile: Profile,
    /// Also write each row's true probabilities, one line per row: the click's, a tab, the
    /// click-and-conversion's (profile rich).
    #[arg(long)]
    pub oracle: Option<PathBuf>,
    /// Output file.
    #[arg(long)]
    pub out: PathBuf,
}

fn create(p: &PathBuf) -> Result<BufWriter<std::fs::File>> {
    let file = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
    Ok(BufWriter::with_capacity(1 << 20, file))
}

/// Writes one synthetic file (and its oracle).
pub fn write(a: &GenDataArgs) -> Result<()> {
    if a.profile == Profile::Criteo && a.oracle.is_some() {
        bail!("--oracle is written by --profile rich only");
    }
    let mut w = create(&a.out)?;
    match a.profile {
        Profile::Criteo => sparta_data::write_synthetic(
            &SynthConfig {
                rows: a.rows,
                seed: a.seed,
                model_seed: a.model_seed,
                vocab_scale: a.vocab_scale,
            },
            &mut w,
        )
        .and_then(|_| w.flush())
        .with_context(|| format!("writing {}", a.out.display()))?,
        Profile::Rich => {
            let mut oracle = a.oracle.as_ref().map(create).transpose()?;
            sparta_data::write_rich(
                &RichConfig {
                    rows: a.rows,
                    seed: a.seed,
                    model_seed: a.model_seed,
                },
                &mut w,
                oracle.as_mut().map(|o| o as &mut dyn Write),
            )
            .and_then(|_| w.flush())
            .with_context(|| {
                format!(
                    "writing {}{}",
                    a.out.display(),
                    a.oracle
                        .as_ref()
                        .map(|o| format!(" and {}", o.display()))
                        .unwrap_or_default()
                )
            })?;
        }
    }
    Ok(())
}

/// `sparta gen-data`.
pub fn run(a: GenDataArgs) -> Result<()> {
    write(&a)?;
    println!("wrote {} rows to {}", a.rows, a.out.display());
    if let Some(o) = &a.oracle {
        println!(
            "wrote {} true probabilities (click, click and conversion) to {}",
            a.rows,
            o.display()
        );
    }
    Ok(())
}
