//! SIGINT and SIGTERM for the commands, through signal-hook: a graceful stop flag for training
//! ([`stop_on_signals`]) and a future for the servers ([`first_signal`]). Both register their
//! handlers when called, so a signal that arrives right after is caught.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};

use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::{Handle, Signals};

/// A flag set by the first SIGINT or SIGTERM (training then stops after its current step,
/// writes its final checkpoint, exports and summary, and exits normally); a second signal
/// exits at once (130).
pub fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let mut signals = listen()?;
    std::thread::Builder::new()
        .name("sparta-signals".into())
        .spawn(move || {
            let mut each = signals.forever();
            if each.next().is_none() {
                return;
            }
            tracing::warn!(
                "stop requested: finishing the current step, then the final checkpoint and \
                 export (signal again to abort)"
            );
            flag.store(true, Ordering::Relaxed);
            if each.next().is_some() {
                eprintln!("aborted");
                std::process::exit(130);
            }
        })
        .context("starting the signal listener")?;
    Ok(stop)
}

/// A future resolving to the name of the first SIGINT or SIGTERM (`"SIGINT"`, `"SIGTERM"`)
/// received after this returns. Dropping it stops listening.
pub fn first_signal() -> Result<FirstSignal> {
    let mut signals = listen()?;
    let handle = signals.handle();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("sparta-signals".into())
        .spawn(move || {
            // `None`: closed by the future's drop.
            if let Some(sig) = signals.forever().next() {
                let _ = tx.send(name(sig));
            }
        })
        .context("starting the signal listener")?;
    Ok(FirstSignal { rx, handle })
}

/// The future of [`first_signal`].
pub struct FirstSignal {
    rx: tokio::sync::oneshot::Receiver<&'static str>,
    handle: Handle,
}

impl Future for FirstSignal {
    type Output = &'static str;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<&'static str> {
        // The sender goes only when the listener was closed, which takes dropping this future.
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or("signal listener closed"))
    }
}

impl Drop for FirstSignal {
    fn drop(&mut self) {
        self.handle.close();
    }
}

/// SIGINT and SIGTERM, registered now.
fn listen() -> Result<Signals> {
    Signals::new([SIGINT, SIGTERM]).context("installing the SIGINT/SIGTERM handler")
}

fn name(sig: std::ffi::c_int) -> &'static str {
    match sig {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        _ => "signal",
    }
}
