//! `sparta checkpoint`: look at checkpoints on disk.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use sparta_checkpoint::{inspect, open_dir, parse_location, Location};

/// Subcommands of `sparta checkpoint`.
#[derive(Subcommand, Debug, Clone)]
pub enum CheckpointCommand {
    /// List every checkpoint in a directory, verify all files (checksums, sizes, chains) and
    /// say which one a restore would use; exits 1 when none can be restored.
    Inspect(InspectArgs),
}

/// Flags of `sparta checkpoint inspect`.
#[derive(Args, Debug, Clone)]
pub struct InspectArgs {
    /// Checkpoint directory.
    pub dir: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs a `sparta checkpoint` subcommand.
pub fn run(c: CheckpointCommand) -> Result<()> {
    match c {
        CheckpointCommand::Inspect(a) => {
            if let Location::Local(p) = parse_location(&a.dir.to_string_lossy())? {
                anyhow::ensure!(p.is_dir(), "{} is not a directory", p.display());
            }
            let storage = open_dir(&a.dir)?;
            let report = inspect(storage.as_ref())
                .with_context(|| format!("inspecting {}", a.dir.display()))?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.to_text());
            }
            // Scripts and readiness checks rely on the exit status: 1 when a restore would
            // find nothing (after the report, so the reason is on screen).
            anyhow::ensure!(
                report.restorable.is_some(),
                "no restorable checkpoint in {} ({} checkpoint(s) listed above, none valid)",
                a.dir.display(),
                report.checkpoints.len()
            );
            Ok(())
        }
    }
}
