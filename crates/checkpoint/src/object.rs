//! [`Storage`] on an `object_store` backend (S3 and S3-compatible stores, GCS, Azure, memory).
//!
//! Blocking adapter: each call runs on a small tokio runtime owned by the storage. Writes go
//! through `object_store::buffered::BufWriter` (multipart upload for large blobs), which makes
//! the object visible only when the upload completes: atomic like the local backend.

use std::io::{Read, Write};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::buffered::BufWriter as ObjWriter;
use object_store::path::Path as ObjPath;
use object_store::ObjectStore;
use tokio::io::AsyncWriteExt;
use tokio::runtime::Runtime;

use crate::error::{CheckpointError, Result};
use crate::storage::{check_blob_name, BlobInfo, BlobWriter, Storage};

/// Checkpoint blobs in an object store, under a key prefix.
pub struct ObjectStorage {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    rt: Arc<Runtime>,
    label: String,
}

impl std::fmt::Debug for ObjectStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStorage")
            .field("location", &self.label)
            .finish()
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
    /// Uses `store`, keeping every blob under `prefix` (may be empty).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Result<ObjectStorage> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| CheckpointError::io("tokio runtime", e))?;
        let prefix = prefix.trim_matches('/').to_string();
        Ok(ObjectStorage {
            label: format!("{store}/{prefix}"),
            store,
            prefix,
            rt: Arc::new(rt),
        })
    }

    /// An S3 (or S3-compatible: MinIO, Ceph, ...) bucket configured from the standard
    /// `AWS_*` environment variables (`AWS_ENDPOINT` for S3-compatible services).
    pub fn s3_from_env(bucket: &str, prefix: &str) -> Result<ObjectStorage> {
        let s3 = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .build()
            .map_err(|e| obj_err(bucket, e))?;
        ObjectStorage::new(Arc::new(s3), prefix)
    }

    fn key(&self, name: &str) -> Result<ObjPath> {
        check_blob_name(name)?;
        let full = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        };
        ObjPath::parse(&full).map_err(|_| CheckpointError::InvalidName(name.to_string()))
    }
}

/// Streams a multipart upload; completes it on `finish`, aborts it if dropped.
struct ObjectWriter {
    inner: Option<ObjWriter>,
    rt: Arc<Runtime>,
    name: String,
}

impl Write for ObjectWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let w = self.inner.as_mut().expect("ObjectWriter used after finish");
        self.rt.block_on(w.write_all(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl BlobWriter for ObjectWriter {
    fn finish(mut self: Box<Self>) -> Result<()> {
        let mut w = self.inner.take().expect("ObjectWriter finished twice");
        self.rt
            .block_on(w.shutdown())
            .map_err(|e| CheckpointError::io(&self.name, e))
    }
}

impl Drop for ObjectWriter {
    fn drop(&mut self) {
        if let Some(mut w) = self.inner.take() {
            let _ = self.rt.block_on(w.abort());
        }
    }
}

/// Blocking reader over an object's byte stream.
struct ObjectReader {
    stream: BoxStream<'static, object_store::Result<Bytes>>,
    cur: Bytes,
    rt: Arc<Runtime>,
}

impl Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rt.block_on(self.stream.next()) {
                None => return Ok(0),
                Some(Ok(b)) => self.cur = b,
                Some(Err(e)) => return Err(std::io::Error::other(e)),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        self.cur = self.cur.slice(n..);
        Ok(n)
    }
}

impl Storage for ObjectStorage {
    fn create(&self, name: &str) -> Result<Box<dyn BlobWriter + '_>> {
        let key = self.key(name)?;
        Ok(Box::new(ObjectWriter {
            inner: Some(ObjWriter::new(self.store.clone(), key)),
            rt: self.rt.clone(),
            name: name.to_string(),
        }))
    }

    fn open(&self, name: &str) -> Result<(Box<dyn Read + Send + '_>, u64)> {
        let key = self.key(name)?;
        let got = self
            .rt
            .block_on(self.store.get(&key))
            .map_err(|e| obj_err(name, e))?;
        let size = got.meta.size;
        Ok((
            Box::new(ObjectReader {
                stream: got.into_stream(),
                cur: Bytes::new(),
                rt: self.rt.clone(),
            }),
            size,
        ))
    }

    fn list(&self, prefix: &str) -> Result<Vec<BlobInfo>> {
        let root = if self.prefix.is_empty() {
            None
        } else {
            Some(ObjPath::from(self.prefix.as_str()))
        };
        let metas: Vec<_> = self.rt.block_on(async {
            let mut s = self.store.list(root.as_ref());
            let mut out = Vec::new();
            while let Some(m) = s.next().await {
                out.push(m);
            }
            out
        });
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let mut out = Vec::new();
        for m in metas {
            let m = m.map_err(|e| obj_err(prefix, e))?;
            let full = m.location.to_string();
            if let Some(name) = full.strip_prefix(&strip) {
                if name.starts_with(prefix) {
                    out.push(BlobInfo {
                        name: name.to_string(),
                        size: m.size,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn delete(&self, name: &str) -> Result<()> {
        let key = self.key(name)?;
        match self.rt.block_on(self.store.delete(&key)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(obj_err(name, e)),
        }
    }

    fn location(&self) -> String {
        self.label.clone()
    }
}
