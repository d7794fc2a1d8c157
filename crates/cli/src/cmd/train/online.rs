//! The online parts of `sparta train`: serving exports as a step hook (`sparta_worker`'s
//! [`ExportHook`]), and SIGINT/SIGTERM turning into a graceful stop (finish the step,
//! checkpoint, export, exit 0).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};

pub use sparta_worker::ExportHook;

/// A flag set by the first SIGINT or SIGTERM (training then stops after its current step,
/// writes its final checkpoint, exports and summary, and exits normally); a second signal
/// exits at once (130).
pub fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal listener")?;
    // Register in this thread so a signal arriving right after this returns is caught.
    let mut signals = rt.block_on(async { Signals::new() })?;
    std::thread::Builder::new()
        .name("sparta-signals".into())
        .spawn(move || {
            rt.block_on(async move {
                signals.recv().await;
                tracing::warn!(
                    "stop requested: finishing the current step, then the final checkpoint and \
                     export (signal again to abort)"
                );
                flag.store(true, Ordering::Relaxed);
                signals.recv().await;
                eprintln!("aborted");
                std::process::exit(130);
            })
        })
        .context("starting the signal listener")?;
    Ok(stop)
}

/// SIGINT and SIGTERM as one stream.
struct Signals {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals {
                int: signal(SignalKind::interrupt()).context("listening for SIGINT")?,
                term: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// Waits for the next signal of either kind.
    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            let (int, term) = (&mut self.int, &mut self.term);
            std::future::poll_fn(|cx| {
                if int.poll_recv(cx).is_ready() || term.poll_recv(cx).is_ready() {
                    std::task::Poll::Ready(())
                } else {
                    std::task::Poll::Pending
                }
            })
            .await
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Writes one probability per line (the format of `sparta predict`).
pub fn write_predictions(path: &Path, probs: &[f32], tasks: usize) -> Result<()> {
    use std::io::Write;
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(f);
    for row in probs.chunks(tasks.max(1)) {
        write_prediction(&mut out, row)?;
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// One scored line: a probability per task, tab-separated, in the model's task order.
pub fn write_prediction(out: &mut impl std::io::Write, row: &[f32]) -> std::io::Result<()> {
    for (t, p) in row.iter().enumerate() {
        if t > 0 {
            out.write_all(b"\t")?;
        }
        write!(out, "{p}")?;
    }
    out.write_all(b"\n")
}
