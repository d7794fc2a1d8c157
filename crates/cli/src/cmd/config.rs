//! `sparta config show`: the job a config (or a built-in format) means, written out in full,
//! with the `[[tables]]` and `[[features]]` a job without them implies.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use sparta_core::config::Format;
use sparta_core::JobConfig;

/// `sparta config ...`.
#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Print the full job config: every default, and the explicit tables and features.
    Show(ShowArgs),
}

/// Flags of `sparta config show`.
#[derive(Args, Debug)]
pub struct ShowArgs {
    /// Job config to start from (default: the built-in defaults).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Built-in input format: criteo or avazu (overrides the config's `data.format`).
    #[arg(long)]
    pub format: Option<String>,
    /// Model: wdl, deepfm, dcn, dcnv2, dlrm, din, mmoe or esmm (decides which features get first-order weights).
    #[arg(long)]
    pub model: Option<String>,
}

/// Runs `sparta config ...`.
pub fn run(c: ConfigCommand) -> Result<()> {
    match c {
        ConfigCommand::Show(a) => show(a),
    }
}

fn show(a: ShowArgs) -> Result<()> {
    let mut cfg = match &a.config {
        Some(p) => JobConfig::from_file(p)?,
        None => JobConfig::default(),
    };
    if let Some(f) = &a.format {
        cfg.data.format = match f.as_str() {
            "criteo" => Format::Criteo,
            "avazu" => Format::Avazu,
            other => anyhow::bail!("--format {other:?}: expected criteo or avazu"),
        };
    }
    if let Some(m) = &a.model {
        cfg.model.kind =
            serde_json::from_value(serde_json::Value::String(m.clone())).map_err(|_| {
                anyhow::anyhow!(
                    "--model {m:?}: expected wdl, deepfm, dcn, dcnv2, dlrm, din, mmoe or esmm"
                )
            })?;
    }
    cfg.make_features_explicit()?;
    // The printed text must mean the job it came from.
    let text = toml::to_string(&cfg).context("writing the config as TOML")?;
    JobConfig::from_toml(&text)?
        .validate()
        .context("the printed config does not validate (a bug)")?;
    print!("{text}");
    Ok(())
}
