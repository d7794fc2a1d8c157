//! Adding and removing PS shards while the job trains (`sparta launch --scale-ps-at
//! STEP:N`): at each event's step the launcher starts the new PS processes (joining shards)
//! or lets the removed ones go, and a thread of its own runs the scaling over RPC through
//! [`ScaleOps`] (the CLI's implementation: `sparta_ps::scaler`), so the supervision loop
//! keeps watching the processes meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The RPC side of scaling, given to the launcher (it holds no RPC client itself).
pub trait ScaleOps: Send + Sync {
    /// Shard 0's step clock (every worker's steps, summed) of the cluster at `addrs`.
    fn step(&self, addrs: &[String]) -> Result<u64, String>;
    /// Adds the joining shards at `added` to the cluster at `addrs` and moves slots onto
    /// them; returns the cluster's shards after.
    fn grow(
        &self,
        addrs: &[String],
        added: &[String],
        say: &(dyn Fn(&str) + Sync),
    ) -> Result<Vec<String>, String>;
    /// Removes the shards past the first `keep` (their slots move off first); `leaving` is
    /// told their indexes before they may stop. Returns the cluster's shards after.
    fn shrink(
        &self,
        addrs: &[String],
        keep: usize,
        leaving: &(dyn Fn(&[usize]) + Sync),
        say: &(dyn Fn(&str) + Sync),
    ) -> Result<Vec<String>, String>;
}

/// One `--scale-ps-at STEP:N`: once the workers trained `step` steps each (shard 0's clock
/// at `step` × workers), the cluster gets `shards` PS shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScaleEvent {
    /// Steps of each worker.
    pub step: u64,
    /// Shards after it.
    pub shards: usize,
}

impl std::str::FromStr for ScaleEvent {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: expected STEP:SHARDS (e.g. 200:3)");
        let (step, shards) = s.split_once(':').ok_or_else(bad)?;
        let step = step.trim().parse().map_err(|_| bad())?;
        let shards: usize = shards.trim().parse().map_err(|_| bad())?;
        if shards == 0 {
            return Err(format!("{s:?}: a cluster has at least one shard"));
        }
        Ok(ScaleEvent { step, shards })
    }
}

/// The scaling of a launch: its events, in step order, and the RPC side.
#[derive(Clone)]
pub struct ScalePlan {
    /// The events.
    pub events: Vec<ScaleEvent>,
    /// The RPC side.
    pub ops: Arc<dyn ScaleOps>,
}

impl std::fmt::Debug for ScalePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScalePlan")
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

/// What a scaling thread asks of or tells the launcher.
pub(crate) enum Msg {
    /// Start PS shards `from..to` of a cluster of `to` (joining) and answer their addresses.
    Start { from: usize, to: usize },
    /// A line for the user.
    Say(String),
    /// The event is done: the cluster's shards after it, or why it failed; seconds from its
    /// step to its end.
    Done(Result<Vec<String>, String>, f64),
}

/// One event carried out, for the job summary (`ps_scaling`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Scaled {
    /// The event's step (each worker's).
    pub step: u64,
    /// Shards before.
    pub from: usize,
    /// Shards after.
    pub to: usize,
    /// Seconds from the step to the cluster on its new shards (moves included).
    pub seconds: f64,
}

/// A scaling thread at work on one event.
pub(crate) struct Running {
    pub event: ScaleEvent,
    pub rx: mpsc::Receiver<Msg>,
    pub started: mpsc::Sender<Result<Vec<String>, String>>,
    /// Set when the cluster it works on is stopped (a rollback): it gives up waiting.
    pub cancel: Arc<AtomicBool>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// How often shard 0's clock is read while an event waits for its step.
const STEP_POLL: Duration = Duration::from_millis(250);

/// Starts the thread of `event` on the cluster at `addrs` with `workers` workers; the PS
/// indexes that will leave are put in `leaving` before they may stop.
pub(crate) fn run(
    ops: Arc<dyn ScaleOps>,
    event: ScaleEvent,
    addrs: Vec<String>,
    workers: usize,
    leaving: Arc<Mutex<Vec<usize>>>,
) -> Result<Running, std::io::Error> {
    let (tx, rx) = mpsc::channel();
    let (started, started_rx) = mpsc::channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let cancelled = Arc::clone(&cancel);
    std::thread::Builder::new()
        .name("sparta-scale".into())
        .spawn(move || {
            let say = {
                let tx = Mutex::new(tx.clone());
                move |m: &str| {
                    let _ = tx
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .send(Msg::Say(m.to_string()));
                }
            };
            let target = event.step.saturating_mul(workers as u64);
            let mut reached = None;
            let r = (|| {
                loop {
                    // Errors while waiting (a PS restarting) are tried again; a rollback ends
                    // this thread's cluster, and the launcher drops it.
                    if cancelled.load(Ordering::Relaxed) {
                        return Err("the cluster was stopped".to_string());
                    }
                    if ops.step(&addrs).is_ok_and(|s| s >= target) {
                        break;
                    }
                    std::thread::sleep(STEP_POLL);
                }
                reached = Some(std::time::Instant::now());
                let n = addrs.len();
                if event.shards > n {
                    tx.send(Msg::Start {
                        from: n,
                        to: event.shards,
                    })
                    .map_err(|_| "the launcher went away".to_string())?;
                    let added: Vec<String> = started_rx
                        .recv()
                        .map_err(|_| "the launcher went away".to_string())??;
                    ops.grow(&addrs, &added, &say)
                } else {
                    let note = |gone: &[usize]| {
                        leaving
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .extend_from_slice(gone);
                    };
                    ops.shrink(&addrs, event.shards, &note, &say)
                }
            })();
            let secs = reached.map_or(0.0, |t| t.elapsed().as_secs_f64());
            let _ = tx.send(Msg::Done(r, secs));
        })?;
    Ok(Running {
        event,
        rx,
        started,
        cancel,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_and_bad_ones_are_named() {
        assert_eq!(
            "200:3".parse::<ScaleEvent>(),
            Ok(ScaleEvent {
                step: 200,
                shards: 3
            })
        );
        assert!("200"
            .parse::<ScaleEvent>()
            .unwrap_err()
            .contains("STEP:SHARDS"));
        assert!("x:3".parse::<ScaleEvent>().is_err());
        assert!("5:0"
            .parse::<ScaleEvent>()
            .unwrap_err()
            .contains("at least one"));
    }
}
