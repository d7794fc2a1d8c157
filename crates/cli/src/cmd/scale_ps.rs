//! `sparta scale-ps`: adds PS shards to a training cluster or removes shards added earlier
//! (see `sparta_ps::scaler`).

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use super::flags::PsClientFlags;

/// Flags of `sparta scale-ps`.
#[derive(Args, Debug)]
pub struct ScalePsArgs {
    /// Every PS address of the cluster now, in shard order, comma separated (as the workers'
    /// --ps).
    #[arg(long, value_delimiter = ',', required = true)]
    pub ps: Vec<String>,
    /// Add these PS (started with `sparta ps --shard I --num-shards N' --dense-shards D`,
    /// I counting on from the cluster's shards, N' the count after, D the job's starting
    /// count), in shard order; slots then move onto them until every shard owns an even
    /// share.
    #[arg(long, value_delimiter = ',', conflicts_with = "keep")]
    pub add: Vec<String>,
    /// Keep the first K shards: the slots of the others (shards added while training) move
    /// onto them, then the others leave the cluster (a PS started with --exit-when-retired
    /// then exits).
    #[arg(long, required_unless_present = "add")]
    pub keep: Option<usize>,
    /// The longest each step may take, seconds (the list switching, each move switching: each
    /// at a checkpoint round).
    #[arg(long, default_value_t = 600)]
    pub step_secs: u64,
    #[command(flatten)]
    pub client: PsClientFlags,
}

/// Adds or removes the shards and prints each step; the last line lists the cluster's shards.
pub fn run(a: ScalePsArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let mover = a.client.mover(a.ps.clone())?;
    let mut scaler = sparta_ps::scaler::Scaler::new(mover, Duration::from_secs(a.step_secs));
    let say = |m: &str| println!("{m}");
    let done = rt.block_on(async {
        match a.keep {
            Some(keep) => scaler.shrink(keep, &|_| {}, &say).await,
            None => scaler.grow(&a.add, &say).await,
        }
    })?;
    println!(
        "the cluster's shards: {} (slot table epoch {}; {} move(s) in {:.1} s)",
        done.addrs.join(","),
        done.epoch,
        done.moves.len(),
        done.seconds
    );
    Ok(())
}

/// `sparta launch --scale-ps-at`'s RPC side: each call on a runtime of its own (the launcher
/// calls from its scaling thread).
pub struct RpcScaleOps {
    /// The cluster's token.
    pub token: String,
    /// TLS to the PS, when they serve it.
    pub tls: Option<sparta_proto::ClientTls>,
    /// The longest one step may take.
    pub step_wait: Duration,
}

impl RpcScaleOps {
    fn scaler(&self, addrs: &[String]) -> sparta_ps::scaler::Scaler {
        let mover =
            sparta_ps::mover::Mover::new(addrs.to_vec(), self.token.clone(), self.tls.clone());
        sparta_ps::scaler::Scaler::new(mover, self.step_wait)
    }

    fn block_on<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, sparta_ps::PsError>>,
    ) -> Result<T, String> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("starting the tokio runtime: {e}"))?
            .block_on(f)
            .map_err(|e| e.to_string())
    }
}

impl sparta_launch::scale::ScaleOps for RpcScaleOps {
    fn step(&self, addrs: &[String]) -> Result<u64, String> {
        let s = self.scaler(addrs);
        self.block_on(s.step())
    }

    fn grow(
        &self,
        addrs: &[String],
        added: &[String],
        say: &(dyn Fn(&str) + Sync),
    ) -> Result<Vec<String>, String> {
        let mut s = self.scaler(addrs);
        self.block_on(async { s.grow(added, say).await.map(|d| d.addrs) })
    }

    fn shrink(
        &self,
        addrs: &[String],
        keep: usize,
        leaving: &(dyn Fn(&[usize]) + Sync),
        say: &(dyn Fn(&str) + Sync),
    ) -> Result<Vec<String>, String> {
        let mut s = self.scaler(addrs);
        self.block_on(async { s.shrink(keep, leaving, say).await.map(|d| d.addrs) })
    }
}
