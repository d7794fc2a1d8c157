//! An object as a [`RangeRead`], read ahead of the reader.
//!
//! The object is split into blocks of [`Prefetch::block`] bytes. A sequential read (one that
//! starts where the previous one ended, or any read of at least 64 KiB) makes sure its block
//! and the [`Prefetch::ahead`] blocks after it are requested, each a ranged GET of its own on
//! the client's runtime, so up to `ahead + 1` requests are in flight on as many connections
//! while the parsers work: in steady state the next block has arrived before it is needed,
//! and the reader waits on the network only when the store is slower than the parsers. Blocks
//! behind the reader are dropped, so an open object holds at most `ahead + 2` blocks. A small
//! isolated read (a magic-byte probe, a line-start search) is one exact ranged GET, not cached.
//!
//! Every request is retried with backoff (`sparta_blob`'s policy, on `backon`) on transient
//! errors (connection refused or reset, a timeout, a 5xx answer) up to
//! [`super::ObjectOptions::max_attempts`] attempts, each retry counted in [`crate::ReadStats`];
//! not found and access denied fail at once. Every GET carries
//! the ETag seen when the object was opened (`If-Match`), so an object replaced while read is
//! refused instead of mixing two versions.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use object_store::path::Path as ObjPath;
use object_store::{GetOptions, GetRange, ObjectStore};
use parking_lot::{Condvar, Mutex};
use sparta_blob::store::is_transient;

use super::{object_error, ObjectClient, ObjectOptions};
use crate::error::DataError;
use crate::input::RangeRead;
use crate::stats::ReadStats;

/// Reads below this size that do not continue the previous read are fetched exactly.
const SMALL_READ: usize = 64 << 10;

/// Read-ahead of an open object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefetch {
    /// Bytes per ranged request.
    pub block: usize,
    /// Blocks requested ahead of the one being read.
    pub ahead: usize,
}

impl Default for Prefetch {
    /// 8 MiB blocks, 4 ahead: 40 MiB in flight per object being read.
    fn default() -> Self {
        Prefetch {
            block: 8 << 20,
            ahead: 4,
        }
    }
}

enum Slot {
    Loading,
    Ready(Bytes),
    Failed(io::ErrorKind, String),
}

#[derive(Default)]
struct State {
    blocks: BTreeMap<u64, Slot>,
    /// Where the previous read ended.
    next: u64,
}

/// One object opened for ranged reads (see the module docs).
pub struct ObjectRange {
    client: Arc<ObjectClient>,
    store: Arc<dyn ObjectStore>,
    key: ObjPath,
    url: PathBuf,
    len: u64,
    e_tag: Option<String>,
    state: Arc<(Mutex<State>, Condvar)>,
    stats: Mutex<Option<Arc<ReadStats>>>,
}

impl std::fmt::Debug for ObjectRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectRange")
            .field("url", &self.url)
            .field("len", &self.len)
            .finish()
    }
}

impl ObjectRange {
    pub(super) fn new(
        client: Arc<ObjectClient>,
        store: Arc<dyn ObjectStore>,
        key: ObjPath,
        url: PathBuf,
        len: u64,
        e_tag: Option<String>,
    ) -> ObjectRange {
        ObjectRange {
            client,
            store,
            key,
            url,
            len,
            e_tag,
            state: Arc::new((Mutex::new(State::default()), Condvar::new())),
            stats: Mutex::new(None),
        }
    }

    /// Size of the object when opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the object is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The object's URL.
    pub fn url(&self) -> &std::path::Path {
        &self.url
    }

    /// Counts fetched bytes, waits and retries in `stats` from now on.
    pub fn count_in(&self, stats: Arc<ReadStats>) {
        *self.stats.lock() = Some(stats);
    }

    fn stats(&self) -> Option<Arc<ReadStats>> {
        self.stats.lock().clone()
    }

    /// Starts the GET of `range` on the runtime; its answer lands in `blocks[index]`.
    fn spawn_block(&self, index: u64, range: Range<u64>) {
        let (store, key, e_tag) = (
            Arc::clone(&self.store),
            self.key.clone(),
            self.e_tag.clone(),
        );
        let (opts, state, stats) = (
            self.client.options().clone(),
            Arc::clone(&self.state),
            self.stats(),
        );
        let url = self.url.clone();
        self.client.handle().spawn(async move {
            let got = fetch(&opts, stats.as_deref(), store, key, e_tag, range).await;
            let slot = match got {
                Ok(b) => {
                    if let Some(s) = &stats {
                        s.add_source_bytes(b.len() as u64);
                    }
                    Slot::Ready(b)
                }
                Err(e) => {
                    let e = as_io(&url, e);
                    Slot::Failed(e.kind(), e.to_string())
                }
            };
            let (lock, cv) = &*state;
            let mut st = lock.lock();
            if let Some(s) = st.blocks.get_mut(&index) {
                *s = slot;
            }
            cv.notify_all();
        });
    }

    /// One exact, uncached ranged read.
    fn read_exact_range(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let end = (offset + buf.len() as u64).min(self.len);
        let (store, key, e_tag) = (
            Arc::clone(&self.store),
            self.key.clone(),
            self.e_tag.clone(),
        );
        let (opts, stats) = (self.client.options().clone(), self.stats());
        let t = Instant::now();
        let got = self.client.block_on(async move {
            fetch(&opts, stats.as_deref(), store, key, e_tag, offset..end).await
        })?;
        let bytes = got.map_err(|e| as_io(&self.url, e))?;
        if let Some(s) = self.stats() {
            s.add_source_bytes(bytes.len() as u64);
            s.add_source_wait(t.elapsed());
        }
        let n = bytes.len().min(buf.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        Ok(n)
    }
}

impl RangeRead for ObjectRange {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if offset >= self.len || buf.is_empty() {
            return Ok(0);
        }
        let p = self.client.options().prefetch;
        let block = p.block.max(1) as u64;
        let index = offset / block;
        let blocks = self.len.div_ceil(block);
        let (lock, cv) = &*self.state;
        let mut st = lock.lock();
        let sequential = offset == st.next || buf.len() >= SMALL_READ;
        if !sequential && !st.blocks.contains_key(&index) {
            drop(st);
            return self.read_exact_range(buf, offset);
        }
        // Drop what is behind (keep one block back for a line that starts in it).
        let keep_from = index.saturating_sub(1);
        st.blocks
            .retain(|&i, _| i >= keep_from && i <= index + p.ahead as u64);
        for i in index..(index + 1 + p.ahead as u64).min(blocks) {
            if let std::collections::btree_map::Entry::Vacant(e) = st.blocks.entry(i) {
                e.insert(Slot::Loading);
                let range = i * block..((i + 1) * block).min(self.len);
                drop(st);
                self.spawn_block(i, range);
                st = lock.lock();
            }
        }
        let t = Instant::now();
        let mut waited = false;
        loop {
            match st.blocks.get(&index) {
                Some(Slot::Ready(bytes)) => {
                    let at = (offset - index * block) as usize;
                    let n = (bytes.len() - at.min(bytes.len())).min(buf.len());
                    buf[..n].copy_from_slice(&bytes[at..at + n]);
                    st.next = offset + n as u64;
                    if st.next >= self.len {
                        // Read to the end: nothing of this object is needed again soon.
                        st.blocks.clear();
                    }
                    drop(st);
                    if waited {
                        if let Some(s) = self.stats() {
                            s.add_source_wait(t.elapsed());
                        }
                    }
                    return Ok(n);
                }
                Some(Slot::Failed(kind, msg)) => {
                    let e = io::Error::new(*kind, msg.clone());
                    // A later read retries from scratch.
                    st.blocks.remove(&index);
                    return Err(e);
                }
                Some(Slot::Loading) => {
                    waited = true;
                    cv.wait(&mut st);
                }
                None => {
                    // Evicted by a concurrent read: request it again.
                    st.blocks.insert(index, Slot::Loading);
                    let range = index * block..((index + 1) * block).min(self.len);
                    drop(st);
                    self.spawn_block(index, range);
                    st = lock.lock();
                }
            }
        }
    }
}

/// An error as an `io::Error` that keeps the kind (not found, access denied, changed).
fn as_io(url: &std::path::Path, e: object_store::Error) -> io::Error {
    match object_error(url, e) {
        DataError::NotFound { path } => io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: no such object", path.display()),
        ),
        DataError::Io { source, .. } => source,
        other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
    }
}

/// GET of `range` with the ETag check, retried (see the module docs).
pub(crate) async fn fetch(
    opts: &ObjectOptions,
    stats: Option<&ReadStats>,
    store: Arc<dyn ObjectStore>,
    key: ObjPath,
    e_tag: Option<String>,
    range: Range<u64>,
) -> object_store::Result<Bytes> {
    with_retries(opts, stats, move || {
        let (store, key, range) = (Arc::clone(&store), key.clone(), range.clone());
        let opts = GetOptions {
            if_match: e_tag.clone(),
            range: Some(GetRange::Bounded(range)),
            ..Default::default()
        };
        async move { store.get_opts(&key, opts).await?.bytes().await }
    })
    .await
}

/// Runs `op` with the retries of [`ObjectOptions::backoff`]: until it succeeds, fails with an
/// error that is not transient ([`sparta_blob::store::is_transient`]), or has been tried
/// `max_attempts` times; each retry is logged and counted in `stats`.
pub(crate) async fn with_retries<T, F, Fut>(
    opts: &ObjectOptions,
    stats: Option<&ReadStats>,
    op: F,
) -> object_store::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = object_store::Result<T>>,
{
    let mut attempt = 0;
    opts.backoff()
        .run_async(op, is_transient, |e, backoff| {
            attempt += 1;
            tracing::warn!("object store: attempt {attempt} failed, retrying in {backoff:?}: {e}");
            if let Some(s) = stats {
                s.add_source_retry();
            }
        })
        .await
}
