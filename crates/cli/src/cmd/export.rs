//! `sparta export`: a full serving export from the newest valid checkpoint.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use sparta_serve::{export_checkpoint, ExportOptions};

/// Flags of `sparta export`.
#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// Checkpoint directory (the newest valid checkpoint chain in it is exported).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Export directory; the export becomes its next version (a full one).
    #[arg(long)]
    pub out: PathBuf,
    /// Store embedding weights as half floats (half the size; scores move by ~1e-3).
    #[arg(long)]
    pub fp16: bool,
    /// Export only rows pulled at least N times (needs a table config whose eviction uses
    /// min_count, which keeps pull counts).
    #[arg(long, default_value_t = 0)]
    pub min_count: u32,
}

/// Runs `sparta export`.
pub fn run(a: ExportArgs) -> Result<()> {
    let opts = ExportOptions {
        fp16: a.fp16,
        min_count: a.min_count,
        ..ExportOptions::default()
    };
    let (info, from) = export_checkpoint(&a.checkpoint, &a.out, opts).with_context(|| {
        format!(
            "exporting {} into {}",
            a.checkpoint.display(),
            a.out.display()
        )
    })?;
    println!(
        "exported checkpoint {from} as version {} of {}: {} rows, {} bytes",
        info.version,
        a.out.display(),
        info.rows,
        info.bytes
    );
    Ok(())
}
