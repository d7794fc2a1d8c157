//! `sparta convert`: text click logs (TSV/CSV, plain or gzip) -> one Parquet file, with the
//! layout and features of a job (`--config`, `--format` as `sparta train` takes them). The
//! rows are those a text reader of that job keeps (malformed lines are dropped and counted),
//! so training on the Parquet file gives the same batches as on the text.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use sparta_data::parquet::{convert, Codec, WriteOptions};

use crate::cmd::train::{job_config, TrainArgs};

/// Flags of `sparta convert`.
#[derive(Args, Debug, Clone)]
pub struct ConvertArgs {
    /// Job config (TOML): its [data.schema]/format and [[features]] say what a row holds.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Input layout: criteo or avazu (overrides the config's).
    #[arg(long)]
    pub format: Option<String>,
    /// Text files to convert (plain or gzip), in order.
    #[arg(long, num_args = 1.., required = true)]
    pub input: Vec<PathBuf>,
    /// The Parquet file to write.
    #[arg(long)]
    pub out: PathBuf,
    /// Page compression: zstd (level 1), snappy or none.
    #[arg(long, default_value = "zstd", value_parser = parse_codec)]
    pub compression: Codec,
    /// Rows per row group (row groups are decoded in parallel).
    #[arg(long, default_value_t = 131_072)]
    pub row_group_rows: usize,
}

fn parse_codec(s: &str) -> Result<Codec, sparta_data::parquet::UnknownCodec> {
    s.parse()
}

/// Converts the inputs and prints what was written.
pub fn run(a: ConvertArgs) -> Result<()> {
    anyhow::ensure!(
        a.row_group_rows > 0,
        "--row-group-rows 0: expected at least 1 row per row group"
    );
    let job = job_config(&TrainArgs {
        config: a.config.clone(),
        format: a.format.clone(),
        ..TrainArgs::default()
    })?
    .validate()?;
    let opts = WriteOptions {
        codec: a.compression,
        row_group_rows: a.row_group_rows,
    };
    let done = convert(
        &a.input,
        &job.schema,
        job.reader.plan.as_deref(),
        &a.out,
        opts,
    )
    .with_context(|| format!("converting into {}", a.out.display()))?;
    let size = std::fs::metadata(&a.out).map(|m| m.len()).unwrap_or(0);
    println!(
        "wrote {}: {} rows, {} bad lines dropped, {} bytes",
        a.out.display(),
        done.rows,
        done.bad_lines,
        size
    );
    Ok(())
}
