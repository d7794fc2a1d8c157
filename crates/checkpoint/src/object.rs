//! [`Storage`] on an `object_store` backend: S3 and S3-compatible stores, the local file
//! system (`file://`), memory (tests).
//!
//! Blocking adapter: every operation runs on the storage's own
//! [`sparta_blob::BlockingRuntime`], so the methods may be called from any thread, including
//! threads of the caller's own tokio runtime (`spawn_blocking`, or even a worker thread, which
//! is then blocked for the call), and the storage may be dropped anywhere. S3 clients are
//! built by [`sparta_blob::store`] from the `AWS_*` environment.
//!
//! Writes go through `object_store::buffered::BufWriter`: blobs below 10 MiB are one `put`,
//! larger ones a multipart upload. Either way the object becomes visible only when
//! [`BlobWriter::finish`] completes it (atomic like the local backend); a writer dropped
//! unfinished aborts the upload and leaves nothing visible.

use std::collections::VecDeque;
use std::future::Future;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::buffered::BufWriter as ObjWriter;
use object_store::path::Path as ObjPath;
use object_store::{GetResultPayload, ObjectStore};
use sparta_blob::store::{self, S3Options};
use sparta_blob::{BlobError, BlockingRuntime};
use tokio::io::AsyncWriteExt;

use crate::error::{CheckpointError, Result};
use crate::storage::{check_blob_name, BlobInfo, BlobWriter, Storage};

/// Bytes a writer gathers before handing them to the upload (one runtime round trip each).
const WRITE_CHUNK: usize = 1 << 20;
/// Bytes a streaming reader fetches per runtime round trip (at least one network chunk).
const READ_BATCH: usize = 1 << 20;

/// The storage's runtime: the blob layer's blocking adapter, its errors naming the blob.
struct Rt(BlockingRuntime);

impl Rt {
    fn new() -> Result<Rt> {
        BlockingRuntime::new("sparta-objstore")
            .map(Rt)
            .map_err(|e| blob_err("tokio runtime", e))
    }

    /// Runs `fut` on this runtime and waits for it from the calling (non-runtime) context.
    fn run<T: Send + 'static>(
        &self,
        what: &str,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> Result<T> {
        self.0.block_on(fut).map_err(|e| blob_err(what, e))
    }
}

/// Checkpoint blobs in an object store, under a key prefix.
pub struct ObjectStorage {
    store: Arc<dyn ObjectStore>,
    prefix: Option<ObjPath>,
    rt: Arc<Rt>,
    label: String,
    /// The S3 bucket, for errors (`None` for other stores).
    bucket: Option<String>,
}

impl std::fmt::Debug for ObjectStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStorage")
            .field("location", &self.label)
            .finish()
    }
}

/// A blob-layer error about `name` as a storage error.
fn blob_err(name: &str, e: BlobError) -> CheckpointError {
    match e {
        BlobError::Store { source, .. } => obj_err(name, source),
        BlobError::Runtime(source) => CheckpointError::io(name, source),
        other => CheckpointError::io(name, std::io::Error::other(other)),
    }
}

fn obj_err(name: &str, e: object_store::Error) -> CheckpointError {
    match e {
        object_store::Error::NotFound { .. } => CheckpointError::NotFound(name.to_string()),
        other => CheckpointError::Io {
            name: name.to_string(),
            source: std::io::Error::other(other),
        },
    }
}

impl ObjectStorage {
    /// Uses `store`, keeping every blob under `prefix` (`/`-separated components of
    /// `[A-Za-z0-9_.-]`; empty: the store's root). Two storages with different prefixes on
    /// one store do not see each other's blobs.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Result<ObjectStorage> {
        let trimmed = prefix.trim_matches('/');
        let prefix = if trimmed.is_empty() {
            None
        } else {
            check_blob_name(trimmed)?;
            Some(
                ObjPath::parse(trimmed)
                    .map_err(|_| CheckpointError::InvalidName(prefix.to_string()))?,
            )
        };
        let label = match &prefix {
            None => store.to_string(),
            Some(p) => format!("{store}/{p}"),
        };
        Ok(ObjectStorage {
            store,
            prefix,
            rt: Arc::new(Rt::new()?),
            label,
            bucket: None,
        })
    }

    /// Replaces the human-readable location returned by [`Storage::location`].
    pub fn with_label(mut self, label: impl Into<String>) -> ObjectStorage {
        self.label = label.into();
        self
    }

    /// An S3 (or S3-compatible: MinIO, Ceph, ...) bucket configured from the standard
    /// `AWS_*` environment variables (`AWS_ENDPOINT` and `AWS_ALLOW_HTTP=true` for a
    /// plain-HTTP S3-compatible service). Sends no request.
    pub fn s3_from_env(bucket: &str, prefix: &str) -> Result<ObjectStorage> {
        let s3 = store::s3(bucket, &S3Options::default()).map_err(|e| blob_err(bucket, e))?;
        let prefix = prefix.trim_matches('/');
        let label = if prefix.is_empty() {
            format!("s3://{bucket}")
        } else {
            format!("s3://{bucket}/{prefix}")
        };
        let mut s = ObjectStorage::new(Arc::new(s3), prefix)?.with_label(label);
        s.bucket = Some(bucket.to_string());
        Ok(s)
    }

    /// `object_store`'s local file system rooted at `root` (created if missing), with empty
    /// directories removed on delete. Atomic writes (staging file + rename), no `fsync`.
    pub fn local_fs(root: &Path) -> Result<ObjectStorage> {
        let shown = root.display().to_string();
        std::fs::create_dir_all(root).map_err(|e| CheckpointError::io(&shown, e))?;
        let fs = store::local_fs_at(root)
            .map_err(|e| blob_err(&shown, e))?
            .with_automatic_cleanup(true);
        Ok(ObjectStorage::new(Arc::new(fs), "")?.with_label(format!("file://{shown}")))
    }

    fn key(&self, name: &str) -> Result<ObjPath> {
        check_blob_name(name)?;
        let full = match &self.prefix {
            None => name.to_string(),
            Some(p) => format!("{p}/{name}"),
        };
        ObjPath::parse(&full).map_err(|_| CheckpointError::InvalidName(name.to_string()))
    }
}

/// Buffers writes and feeds them to a `BufWriter` upload; completes it on `finish`, aborts
/// it if dropped.
struct ObjectWriter {
    inner: Option<ObjWriter>,
    buf: Vec<u8>,
    rt: Arc<Rt>,
    name: String,
}

impl ObjectWriter {
    /// Hands the buffered bytes to the upload.
    fn push(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let mut w = self
            .inner
            .take()
            .ok_or_else(|| std::io::Error::other("object writer failed earlier"))?;
        let data = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(WRITE_CHUNK),
        ));
        let (w, res) = self
            .rt
            .run(&self.name, async move {
                let res = w.put(data).await;
                (w, res)
            })
            .map_err(std::io::Error::other)?;
        self.inner = Some(w);
        res.map_err(std::io::Error::other)
    }
}

impl Write for ObjectWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(buf);
        if self.buf.len() >= WRITE_CHUNK {
            self.push()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl BlobWriter for ObjectWriter {
    fn finish(mut self: Box<Self>) -> Result<()> {
        // On error `drop` aborts the upload.
        self.push()
            .map_err(|e| CheckpointError::io(&self.name, e))?;
        let mut w = self.inner.take().ok_or_else(|| {
            CheckpointError::io(
                &self.name,
                std::io::Error::other("object writer failed earlier"),
            )
        })?;
        self.rt
            .run(&self.name, async move { w.shutdown().await })?
            .map_err(|e| CheckpointError::io(&self.name, e))
    }
}

impl Drop for ObjectWriter {
    fn drop(&mut self) {
        if let Some(mut w) = self.inner.take() {
            let aborted = self.rt.run(&self.name, async move { w.abort().await });
            if !matches!(aborted, Ok(Ok(()))) {
                tracing::warn!(blob = %self.name, "could not abort an unfinished upload");
            }
        }
    }
}

/// Blocking reader over an object's byte stream, fetched in batches.
struct StreamReader {
    stream: Option<BoxStream<'static, object_store::Result<Bytes>>>,
    chunks: VecDeque<Bytes>,
    rt: Arc<Rt>,
    name: String,
}

impl StreamReader {
    /// Fetches the next batch of chunks; `false` at the end of the stream.
    fn fetch(&mut self) -> std::io::Result<bool> {
        let Some(mut stream) = self.stream.take() else {
            return Ok(false);
        };
        let (stream, got, end) = self
            .rt
            .run(&self.name, async move {
                let mut got = Vec::new();
                let mut len = 0;
                while len < READ_BATCH {
                    match stream.next().await {
                        None => return (stream, Ok(got), true),
                        Some(Err(e)) => return (stream, Err(e), true),
                        Some(Ok(b)) => {
                            len += b.len();
                            got.push(b);
                        }
                    }
                }
                (stream, Ok(got), false)
            })
            .map_err(std::io::Error::other)?;
        let got = got.map_err(std::io::Error::other)?;
        let more = !got.is_empty();
        self.chunks.extend(got);
        if !end {
            self.stream = Some(stream);
        }
        Ok(more)
    }
}

impl Read for StreamReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.chunks.front_mut() {
                Some(c) if c.is_empty() => {
                    self.chunks.pop_front();
                }
                Some(c) => {
                    let n = buf.len().min(c.len());
                    buf[..n].copy_from_slice(&c[..n]);
                    *c = c.slice(n..);
                    return Ok(n);
                }
                None => {
                    if !self.fetch()? && self.chunks.is_empty() {
                        return Ok(0);
                    }
                }
            }
        }
    }
}

impl Storage for ObjectStorage {
    fn create(&self, name: &str) -> Result<Box<dyn BlobWriter + '_>> {
        let key = self.key(name)?;
        Ok(Box::new(ObjectWriter {
            inner: Some(ObjWriter::new(self.store.clone(), key)),
            buf: Vec::with_capacity(WRITE_CHUNK),
            rt: self.rt.clone(),
            name: name.to_string(),
        }))
    }

    fn open(&self, name: &str) -> Result<(Box<dyn Read + Send + '_>, u64)> {
        let key = self.key(name)?;
        let store = self.store.clone();
        let got = self
            .rt
            .run(name, async move { store.get(&key).await })?
            .map_err(|e| obj_err(name, e))?;
        let size = got.meta.size;
        let range = got.range.clone();
        match got.payload {
            // The local file system hands back the open file: read it directly.
            GetResultPayload::File(mut file, _) => {
                file.seek(SeekFrom::Start(range.start))
                    .map_err(|e| CheckpointError::io(name, e))?;
                let reader =
                    std::io::BufReader::with_capacity(1 << 20, file).take(range.end - range.start);
                Ok((Box::new(reader), size))
            }
            GetResultPayload::Stream(stream) => Ok((
                Box::new(StreamReader {
                    stream: Some(stream),
                    chunks: VecDeque::new(),
                    rt: self.rt.clone(),
                    name: name.to_string(),
                }),
                size,
            )),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<BlobInfo>> {
        let store = self.store.clone();
        let root = self.prefix.clone();
        let metas = self.rt.run(prefix, async move {
            store.list(root.as_ref()).collect::<Vec<_>>().await
        })?;
        let mut out = Vec::new();
        for m in metas {
            let m = m.map_err(|e| obj_err(prefix, e))?;
            let name = match &self.prefix {
                None => m.location.to_string(),
                Some(p) => match m.location.prefix_match(p) {
                    Some(parts) => parts
                        .map(|part| part.as_ref().to_string())
                        .collect::<Vec<_>>()
                        .join("/"),
                    None => continue,
                },
            };
            if name.starts_with(prefix) {
                out.push(BlobInfo { name, size: m.size });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn delete(&self, name: &str) -> Result<()> {
        let key = self.key(name)?;
        let store = self.store.clone();
        match self.rt.run(name, async move { store.delete(&key).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(obj_err(name, e)),
        }
    }

    fn location(&self) -> String {
        self.label.clone()
    }

    /// Writes and deletes a probe object; an error names the location (and, for S3, a
    /// missing bucket), not the probe.
    fn check_writable(&self) -> Result<()> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("write-probe-{}-{nanos}", std::process::id());
        let res = self
            .put(&name, b"sparta write probe\n")
            .and_then(|()| self.delete(&name));
        res.map_err(|e| {
            let reason = match (&e, &self.bucket) {
                (CheckpointError::NotFound(_), Some(bucket)) => format!(
                    "the bucket `{bucket}` does not exist (or these credentials cannot see \
                     it): create it or fix the URL"
                ),
                (CheckpointError::Io { source, .. }, _) => {
                    format!("cannot write a probe object there: {source}")
                }
                _ => format!("cannot write a probe object there: {e}"),
            };
            CheckpointError::Location {
                location: self.label.clone(),
                reason,
            }
        })
    }
}
