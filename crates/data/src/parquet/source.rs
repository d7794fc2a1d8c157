//! Parquet's [`ChunkReader`] over the engine's [`RangeRead`]: a Parquet file is read by byte
//! ranges through the same trait as plain text, so any ranged source (a local file, an
//! object-store object) reads Parquet with no more work. Nothing is memory-mapped.

use std::io::{self, BufReader, Read};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bytes::Bytes;
use parquet::errors::ParquetError;
use parquet::file::reader::{ChunkReader, Length};

use crate::input::{read_full_at, RangeRead, RangeReader, Shrunk};

/// Read-ahead of the reader Parquet gets for a page header (headers are small).
const HEADER_READ: usize = 512;

/// `len` bytes of a ranged source, counting the bytes fetched into `read`.
#[derive(Clone)]
pub(crate) struct Chunks {
    pub source: Arc<dyn RangeRead>,
    pub len: u64,
    pub read: Arc<AtomicU64>,
}

impl Chunks {
    pub fn new(source: Arc<dyn RangeRead>, len: u64) -> Self {
        Chunks {
            source,
            len,
            read: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Bytes fetched from the source so far.
    pub fn bytes_read(&self) -> u64 {
        self.read.load(Relaxed)
    }
}

impl Length for Chunks {
    fn len(&self) -> u64 {
        self.len
    }
}

/// A [`Read`] that adds what it reads to a counter.
pub(crate) struct Counted<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Relaxed);
        Ok(n)
    }
}

impl ChunkReader for Chunks {
    type T = BufReader<Counted<RangeReader>>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let range = RangeReader::new(
            Arc::clone(&self.source),
            start.min(self.len),
            self.len,
            self.len,
        );
        Ok(BufReader::with_capacity(
            HEADER_READ,
            Counted {
                inner: range,
                read: Arc::clone(&self.read),
            },
        ))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        if start
            .checked_add(length as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(ParquetError::EOF(format!(
                "bytes {start}..+{length} are past the end of the file ({} bytes)",
                self.len
            )));
        }
        let mut buf = vec![0u8; length];
        let n = read_full_at(&*self.source, &mut buf, start)
            .map_err(|e| ParquetError::External(Box::new(e)))?;
        self.read.fetch_add(n as u64, Relaxed);
        if n < length {
            let shrunk = Shrunk {
                expected: self.len,
                at: start + n as u64,
            };
            return Err(ParquetError::External(Box::new(shrunk)));
        }
        Ok(Bytes::from(buf))
    }
}
