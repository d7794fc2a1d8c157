//! The reading engine: a driver thread (the feeder: a file list, or a directory's lister)
//! hands files to a [`Feeder`], which cuts them into chunks; `threads` parser threads parse
//! them; the assembler thread puts the rows back in input order and cuts positioned batches
//! into a bounded queue of `queue_batches`. [`crate::reader`] and [`crate::follow`] are the
//! two front ends; both run exactly this.
//!
//! # Memory
//!
//! Parsed chunks wait for the assembler in a bounded queue of `2 * threads + 2` chunks (plain
//! chunks are up to 4 MiB of text, stream ones about 1 MiB), then `queue_batches` batches wait
//! for the consumer: a slow parser stalls the feeder, nothing grows without bound.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use crate::assemble::{assemble, parse_blocks, Assembled, Assembler, MAX_BATCH_IDS};
use crate::error::DataError;
use crate::feed::{BadFiles, Feeder};
use crate::parse::LineParser;
use crate::queue::{Pending, Shared, Spare, Work};
use crate::stats::{too_many_bad, ReadStats};

/// How to run the engine.
pub(crate) struct EngineConfig {
    pub parser: Arc<LineParser>,
    pub threads: usize,
    pub queue_batches: usize,
    pub max_bad_line_ratio: f64,
    pub batch_size: usize,
    /// Rows still to hand out (`None`: no limit).
    pub rows_left: Option<u64>,
    /// Rows handed out before the start (positions count from the start of the job).
    pub start_rows: u64,
    /// A batch never spans two files.
    pub flush_at_file_end: bool,
    pub bad_files: BadFiles,
    /// The inputs include a pipe: a thread may stay blocked reading it, so an early stop
    /// leaves the threads to end on their own instead of joining them.
    pub detach_on_stop: bool,
    /// Name of the driver thread.
    pub driver_name: &'static str,
    /// Nice increment of every engine thread ([`crate::priority`]).
    pub nice: i32,
    /// The reader's counters (made before the engine: opening inputs counts in them).
    pub stats: Arc<ReadStats>,
}

/// What [`Running::next`] got.
pub(crate) enum Next {
    Batch(Assembled),
    Err(DataError),
    End,
    /// Nothing within the timeout.
    Wait,
}

/// A running engine, owned by its front end. Dropping it stops and joins its threads.
pub(crate) struct Running {
    rx: Option<Receiver<Result<Assembled, DataError>>>,
    pub shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
    /// Dropped at shutdown to wake a driver sleeping on its receiver.
    wake: Option<Sender<()>>,
    max_bad_line_ratio: f64,
    detach_on_stop: bool,
    done: bool,
}

/// Starts the engine; `drive` runs on its own thread with the feeder and a receiver that is
/// disconnected when the engine shuts down (to wake it from a poll sleep).
pub(crate) fn start(
    cfg: EngineConfig,
    drive: impl FnOnce(Feeder, Receiver<()>) + Send + 'static,
) -> Result<Running, DataError> {
    let shared = Arc::new(Shared {
        stats: Arc::clone(&cfg.stats),
        stop: AtomicBool::new(false),
        failed: AtomicBool::new(false),
    });
    let (out_tx, out_rx) = bounded(cfg.queue_batches);
    let (work_tx, work_rx) = bounded::<Work>(cfg.threads);
    let (ordered_tx, ordered_rx) = bounded::<Pending>(2 * cfg.threads + 2);
    let (spare_tx, spare_rx) = bounded::<Spare>(cfg.threads + 1);
    let (wake_tx, wake_rx) = bounded::<()>(0);
    let (text_tx, text_rx) = bounded::<Vec<u8>>(cfg.threads + 2);
    let mut running = Running {
        rx: Some(out_rx),
        shared: Arc::clone(&shared),
        handles: Vec::with_capacity(cfg.threads + 2),
        wake: Some(wake_tx),
        max_bad_line_ratio: cfg.max_bad_line_ratio,
        // Until every thread runs: a failed start must not join parsers waiting for work.
        detach_on_stop: true,
        done: false,
    };
    for t in 0..cfg.threads {
        let (shared, parser, work_rx, spare_rx, text_tx) = (
            Arc::clone(&shared),
            Arc::clone(&cfg.parser),
            work_rx.clone(),
            spare_rx.clone(),
            text_tx.clone(),
        );
        running
            .handles
            .push(spawn(format!("sparta-parse-{t}"), cfg.nice, move || {
                parse_blocks(&shared, &parser, &work_rx, &spare_rx, &text_tx)
            })?);
    }
    drop(work_rx);
    let asm = Assembler::new(
        cfg.batch_size,
        MAX_BATCH_IDS,
        cfg.rows_left,
        cfg.start_rows,
        cfg.flush_at_file_end,
    );
    let (asm_shared, max) = (Arc::clone(&shared), cfg.max_bad_line_ratio);
    let bad_files = cfg.bad_files;
    running
        .handles
        .push(spawn("sparta-assemble".into(), cfg.nice, move || {
            assemble(
                &asm_shared,
                asm,
                max,
                bad_files,
                &ordered_rx,
                &spare_tx,
                &out_tx,
            )
        })?);
    let feeder = Feeder {
        shared,
        ordered: ordered_tx,
        work: work_tx,
        spare_text: text_rx,
        bad_files: cfg.bad_files,
        #[cfg(feature = "parquet")]
        parser: Arc::clone(&cfg.parser),
    };
    running
        .handles
        .push(spawn(cfg.driver_name.into(), cfg.nice, move || {
            drive(feeder, wake_rx)
        })?);
    running.detach_on_stop = cfg.detach_on_stop;
    Ok(running)
}

impl Running {
    /// The next batch (waiting at most `timeout` when given). After `Err` or `End` the
    /// threads are stopped; at the end the final bad-line check is applied.
    pub fn next(&mut self, timeout: Option<Duration>) -> Next {
        let Some(rx) = self.rx.as_ref() else {
            return Next::End;
        };
        let msg = match timeout {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(t) => rx.recv_timeout(t),
        };
        match msg {
            Ok(Ok(b)) => {
                self.shared.stats.add_rows(b.batch.rows as u64);
                Next::Batch(b)
            }
            Ok(Err(e)) => {
                self.shutdown();
                Next::Err(e)
            }
            Err(RecvTimeoutError::Timeout) => Next::Wait,
            Err(RecvTimeoutError::Disconnected) => match self.finish() {
                Some(e) => Next::Err(e),
                None => Next::End,
            },
        }
    }

    /// Stops the threads and joins them (see [`EngineConfig::detach_on_stop`]); the error of
    /// a panicked thread.
    pub fn shutdown(&mut self) -> Option<DataError> {
        let early = !self.done;
        self.done = true;
        self.shared.stop();
        self.rx = None;
        self.wake = None;
        if early && self.detach_on_stop {
            self.handles.clear();
            return None;
        }
        let mut panicked = None;
        for h in self.handles.drain(..) {
            if h.join().is_err() {
                panicked = Some(DataError::Internal("a reader thread panicked".into()));
            }
        }
        panicked
    }

    /// End of input: join the threads and apply the final bad-line check.
    fn finish(&mut self) -> Option<DataError> {
        // Every thread has ended (the queue is disconnected): joining cannot block.
        self.done = true;
        if let Some(e) = self.shutdown() {
            return Some(e);
        }
        let st = &self.shared.stats;
        too_many_bad(st.bad_lines(), st.lines_seen(), self.max_bad_line_ratio, st)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn spawn(
    name: String,
    nice: i32,
    f: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, DataError> {
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            crate::priority::lower_this_thread(nice);
            f()
        })
        .map_err(|e| DataError::Internal(format!("cannot start reader thread: {e}")))
}

/// How often an online front end looks at its stop flag while no batch comes.
const STOP_CHECK: Duration = Duration::from_millis(50);

/// What [`Online::poll`] got.
pub(crate) enum Polled {
    Batch(Assembled),
    /// No batch for the idle tick: the front end hands out an empty batch.
    Idle,
    /// Nothing yet (the caller may note a quiet spell); polled again.
    Waiting,
    /// Stopped on request, at the end of the input, or on an error.
    End(Option<DataError>),
}

/// The loop both online front ends (a followed directory, a Kafka topic) share around a
/// running engine: the stop flag, checked every [`STOP_CHECK`]; idle ticks when no batch
/// came for `idle_tick`; nothing more after the end.
pub(crate) struct Online {
    pub running: Running,
    stop: Arc<AtomicBool>,
    done: bool,
    idle_tick: Option<Duration>,
    /// When the last item (batch or idle tick) was handed out.
    last_item: std::time::Instant,
}

impl Online {
    pub fn new(running: Running, stop: Arc<AtomicBool>, idle_tick: Option<Duration>) -> Online {
        Online {
            running,
            stop,
            done: false,
            idle_tick,
            last_item: std::time::Instant::now(),
        }
    }

    /// The next batch, idle tick, wait, or the end; `what` names the source in the log.
    pub fn poll(&mut self, what: &str) -> Polled {
        if self.done {
            return Polled::End(None);
        }
        if self.stop.load(std::sync::atomic::Ordering::Relaxed) {
            tracing::info!("{what}: stop requested");
            self.done = true;
            self.running.shutdown();
            return Polled::End(None);
        }
        match self.running.next(Some(STOP_CHECK)) {
            Next::Batch(b) => {
                self.last_item = std::time::Instant::now();
                Polled::Batch(b)
            }
            Next::Wait => {
                if self
                    .idle_tick
                    .is_some_and(|t| self.last_item.elapsed() >= t)
                {
                    self.last_item = std::time::Instant::now();
                    Polled::Idle
                } else {
                    Polled::Waiting
                }
            }
            Next::Err(e) => {
                self.done = true;
                Polled::End(Some(e))
            }
            Next::End => {
                self.done = true;
                Polled::End(None)
            }
        }
    }
}
