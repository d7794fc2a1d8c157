//! `sparta move-slots`: moves slots (and their rows) from one PS shard to another while the
//! job trains (see `sparta_ps::moves`).

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use super::flags::PsClientFlags;

/// Flags of `sparta move-slots`.
#[derive(Args, Debug)]
pub struct MoveSlotsArgs {
    /// Every PS address in shard order, comma separated (as the workers' --ps).
    #[arg(long, value_delimiter = ',', required = true)]
    pub ps: Vec<String>,
    /// The shard the slots leave.
    #[arg(long)]
    pub from: usize,
    /// The shard that takes them.
    #[arg(long)]
    pub to: usize,
    /// How many of --from's slots move (its highest-numbered ones; a shard of an N-shard
    /// cluster starts with about 16384 / N).
    #[arg(long)]
    pub slots: usize,
    /// Wait until the move switched (at the first checkpoint round after the receiver's
    /// first copy), at most this many seconds; 0: order the move and return.
    #[arg(long, default_value_t = 600)]
    pub wait_secs: u64,
    #[command(flatten)]
    pub client: PsClientFlags,
}

/// Orders the move and (unless `--wait-secs 0`) waits until it switched.
pub fn run(a: MoveSlotsArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let mover = a.client.mover(a.ps.clone())?;
    rt.block_on(async {
        let plan = mover.order(a.from, a.to, a.slots).await?;
        println!(
            "ordered: {} slot(s) (slots {}..={}) from shard {} to shard {}, slot table epoch {}",
            plan.slots.len(),
            plan.slots.first().copied().unwrap_or_default(),
            plan.slots.last().copied().unwrap_or_default(),
            plan.from,
            plan.to,
            plan.epoch
        );
        if a.wait_secs == 0 {
            return anyhow::Ok(());
        }
        let view = mover.wait(&plan, Duration::from_secs(a.wait_secs)).await?;
        let m = view.last_move;
        println!(
            "moved: shard {} routes by slot table epoch {} (slots per shard {:?}; it holds {} \
             rows): {} rows, {} bytes copied, first copy {:.3} s, switched after {:.3} s, the \
             switch held its round {:.3} s",
            plan.to,
            view.epoch,
            view.routing.slots_per_shard(),
            view.rows,
            m.rows,
            m.bytes,
            m.copy_seconds,
            m.total_seconds,
            m.switch_seconds
        );
        anyhow::Ok(())
    })
}
