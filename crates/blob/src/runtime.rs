//! The blocking adapter: sync code calls `object_store` (async) through a small tokio runtime
//! of its own.
//!
//! Every call is spawned on the runtime and its result handed back over a channel
//! ([`BlockingRuntime::block_on`]), so it may be made from any thread that is not one of this
//! runtime's own, including threads of the caller's tokio runtime (`spawn_blocking`, or even
//! a worker thread, which is then blocked for the call). The runtime is shut down in the
//! background when dropped, which (unlike dropping a `Runtime`) is allowed inside an async
//! context, so the owner may be dropped anywhere.

use std::future::Future;

use crate::error::BlobError;

/// Worker threads of every blocking runtime: requests wait on the network, not the CPU.
const WORKER_THREADS: usize = 2;

/// A small multi-threaded tokio runtime for blocking callers (see the module docs).
#[derive(Debug)]
pub struct BlockingRuntime(Option<tokio::runtime::Runtime>);

impl BlockingRuntime {
    /// Starts a runtime whose threads are named `thread_name` (no request is sent).
    pub fn new(thread_name: &str) -> Result<BlockingRuntime, BlobError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKER_THREADS)
            .thread_name(thread_name)
            .enable_all()
            .build()
            .map_err(BlobError::Runtime)?;
        Ok(BlockingRuntime(Some(rt)))
    }

    /// The runtime's handle, to spawn tasks that are not waited for.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.0
            .as_ref()
            .expect("runtime present until drop")
            .handle()
    }

    /// Runs `fut` on the runtime and waits for its output; [`BlobError::TaskLost`] if the task
    /// panicked or was cancelled.
    pub fn block_on<T: Send + 'static>(
        &self,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, BlobError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle().spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().map_err(|_| BlobError::TaskLost)
    }
}

impl Drop for BlockingRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_futures_from_plain_and_runtime_threads_and_drops_anywhere() {
        let rt = BlockingRuntime::new("blob-test").unwrap();
        assert_eq!(rt.block_on(async { 6 * 7 }).unwrap(), 42);
        let e = rt.block_on(async { panic!("boom") as u32 }).unwrap_err();
        assert!(matches!(e, BlobError::TaskLost), "{e}");
        assert!(e.to_string().contains("panicked or was cancelled"));
        // Called and dropped from inside another runtime.
        let outer = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        outer.block_on(async move {
            assert_eq!(rt.block_on(async { 1 }).unwrap(), 1);
            drop(rt);
        });
    }
}
