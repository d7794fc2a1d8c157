//! The envelope every checkpoint file shares: a 16-byte header, the payload, a 24-byte footer.
//!
//! ```text
//! header  magic "SPARTACK" (8) | format version u32 LE | file kind u32 LE
//! payload (kind-specific)
//! footer  payload length u64 LE | xxh3-64 of header + payload u64 LE | end magic "SPCKEND\0" (8)
//! ```
//! A reader knows the blob size, so it streams exactly the payload through the hash and then
//! checks the footer: a truncated, extended or modified file is always reported, never
//! silently read (as tantivy's footer does).

use std::io::{Read, Write};

use xxhash_rust::xxh3::Xxh3;

use crate::error::{CheckpointError, Result};
use crate::storage::BlobWriter;

#[cfg(target_endian = "big")]
compile_error!(
    "checkpoint files are little-endian and written by casting; big-endian targets are unsupported"
);

/// First bytes of every checkpoint file.
pub const MAGIC: [u8; 8] = *b"SPARTACK";
/// Last bytes of every checkpoint file.
pub const END_MAGIC: [u8; 8] = *b"SPCKEND\0";
/// Version of the file format written by this crate. Version 2 added the admission-sketch
/// records of table parts ([`crate::rows`]) and the manifest's cluster section; version 3 the
/// row precision and dim in a table part's prelude, and the weights of a compact table's rows
/// in their stored form.
pub const FORMAT_VERSION: u32 = 3;
/// Oldest file-format version this build still reads.
pub const MIN_FORMAT_VERSION: u32 = 1;
/// Header bytes.
pub const HEADER_LEN: u64 = 16;
/// Footer bytes.
pub const FOOTER_LEN: u64 = 24;

/// What a file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum FileKind {
    /// Rows of one part of one table.
    TableRows = 1,
    /// Dense parameters and dense optimizer state.
    Dense = 2,
    /// The checkpoint manifest (JSON payload).
    Manifest = 3,
}

impl FileKind {
    fn from_u32(v: u32) -> Option<FileKind> {
        match v {
            1 => Some(FileKind::TableRows),
            2 => Some(FileKind::Dense),
            3 => Some(FileKind::Manifest),
            _ => None,
        }
    }
}

fn header(kind: FileKind, version: u32) -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[12..16].copy_from_slice(&(kind as u32).to_le_bytes());
    h
}

/// Writes one file: header on creation, hashed payload, footer on [`FileWriter::finish`].
pub struct FileWriter<'s> {
    inner: Box<dyn BlobWriter + 's>,
    hasher: Xxh3,
    payload: u64,
    name: String,
}

impl<'s> FileWriter<'s> {
    /// Starts a file of `kind` on a blob writer.
    pub fn new(inner: Box<dyn BlobWriter + 's>, name: &str, kind: FileKind) -> Result<Self> {
        Self::with_version(inner, name, kind, FORMAT_VERSION)
    }

    /// Starts a file of `kind` that says it is of format `version` (tests write the files of
    /// earlier versions with it, to check they still read).
    #[doc(hidden)]
    pub fn with_version(
        mut inner: Box<dyn BlobWriter + 's>,
        name: &str,
        kind: FileKind,
        version: u32,
    ) -> Result<Self> {
        let h = header(kind, version);
        inner
            .write_all(&h)
            .map_err(|e| CheckpointError::io(name, e))?;
        let mut hasher = Xxh3::new();
        hasher.update(&h);
        Ok(FileWriter {
            inner,
            hasher,
            payload: 0,
            name: name.to_string(),
        })
    }

    /// Appends payload bytes.
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.hasher.update(bytes);
        self.payload += bytes.len() as u64;
        self.inner
            .write_all(bytes)
            .map_err(|e| CheckpointError::io(&self.name, e))
    }

    /// Writes the footer and publishes the file; returns `(file size, checksum)`.
    pub fn finish(mut self) -> Result<(u64, u64)> {
        let sum = self.hasher.digest();
        let mut f = [0u8; FOOTER_LEN as usize];
        f[..8].copy_from_slice(&self.payload.to_le_bytes());
        f[8..16].copy_from_slice(&sum.to_le_bytes());
        f[16..].copy_from_slice(&END_MAGIC);
        self.inner
            .write_all(&f)
            .map_err(|e| CheckpointError::io(&self.name, e))?;
        self.inner.finish()?;
        Ok((HEADER_LEN + self.payload + FOOTER_LEN, sum))
    }
}

/// Reads one file: checks the header on open, hashes the payload as it is read, checks the
/// footer in [`FileReader::finish`].
pub struct FileReader<'s> {
    inner: Box<dyn Read + Send + 's>,
    hasher: Xxh3,
    remaining: u64,
    payload_len: u64,
    name: String,
    version: u32,
}

impl<'s> FileReader<'s> {
    /// Opens a stream of `size` bytes expected to be a file of `kind`.
    pub fn new(
        mut inner: Box<dyn Read + Send + 's>,
        size: u64,
        name: &str,
        kind: FileKind,
    ) -> Result<Self> {
        if size < HEADER_LEN + FOOTER_LEN {
            return Err(CheckpointError::corrupt(
                name,
                format!("truncated: {size} bytes, shorter than header + footer"),
            ));
        }
        let mut h = [0u8; HEADER_LEN as usize];
        read_exact(&mut inner, &mut h, name)?;
        if h[..8] != MAGIC {
            return Err(CheckpointError::corrupt(
                name,
                "bad magic (not a checkpoint file)",
            ));
        }
        let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
        if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(CheckpointError::corrupt(
                name,
                format!(
                    "format version {version}, this build reads {MIN_FORMAT_VERSION} to {FORMAT_VERSION}"
                ),
            ));
        }
        let got = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes"));
        if FileKind::from_u32(got) != Some(kind) {
            return Err(CheckpointError::corrupt(
                name,
                format!("file kind {got}, expected {kind:?}"),
            ));
        }
        let mut hasher = Xxh3::new();
        hasher.update(&h);
        let payload_len = size - HEADER_LEN - FOOTER_LEN;
        Ok(FileReader {
            inner,
            hasher,
            remaining: payload_len,
            payload_len,
            name: name.to_string(),
            version,
        })
    }

    /// The file-format version in the header.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The file name (for errors).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Payload bytes not read yet.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Reads exactly `buf.len()` payload bytes.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<()> {
        if buf.len() as u64 > self.remaining {
            return Err(CheckpointError::corrupt(
                &self.name,
                format!(
                    "record of {} bytes runs past the payload end ({} bytes left)",
                    buf.len(),
                    self.remaining
                ),
            ));
        }
        read_exact(&mut self.inner, buf, &self.name)?;
        self.hasher.update(buf);
        self.remaining -= buf.len() as u64;
        Ok(())
    }

    /// Reads `n` payload bytes into a new buffer.
    pub fn read_vec(&mut self, n: usize) -> Result<Vec<u8>> {
        if n as u64 > self.remaining {
            return Err(CheckpointError::corrupt(
                &self.name,
                format!(
                    "record of {n} bytes runs past the payload end ({} bytes left)",
                    self.remaining
                ),
            ));
        }
        let mut v = vec![0u8; n];
        self.read(&mut v)?;
        Ok(v)
    }

    /// Reads a little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Reads a little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Checks that the payload was fully consumed and the footer matches; returns the checksum.
    pub fn finish(mut self) -> Result<u64> {
        if self.remaining != 0 {
            return Err(CheckpointError::corrupt(
                &self.name,
                format!("{} unexpected bytes after the last record", self.remaining),
            ));
        }
        let mut f = [0u8; FOOTER_LEN as usize];
        read_exact(&mut self.inner, &mut f, &self.name)?;
        if f[16..] != END_MAGIC {
            return Err(CheckpointError::corrupt(
                &self.name,
                "bad footer magic (truncated or overwritten file)",
            ));
        }
        let len = u64::from_le_bytes(f[..8].try_into().expect("8 bytes"));
        if len != self.payload_len {
            return Err(CheckpointError::corrupt(
                &self.name,
                format!(
                    "footer says {len} payload bytes, file has {} (truncated or extended)",
                    self.payload_len
                ),
            ));
        }
        let want = u64::from_le_bytes(f[8..16].try_into().expect("8 bytes"));
        let got = self.hasher.digest();
        if want != got {
            return Err(CheckpointError::corrupt(
                &self.name,
                format!("checksum mismatch: footer {want:016x}, content {got:016x}"),
            ));
        }
        let mut extra = [0u8; 1];
        match self.inner.read(&mut extra) {
            Ok(0) => Ok(got),
            Ok(_) => Err(CheckpointError::corrupt(
                &self.name,
                "bytes after the footer",
            )),
            Err(e) => Err(CheckpointError::io(&self.name, e)),
        }
    }
}

fn read_exact(r: &mut (impl Read + ?Sized), buf: &mut [u8], name: &str) -> Result<()> {
    r.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            CheckpointError::corrupt(name, "truncated: unexpected end of file")
        } else {
            CheckpointError::io(name, e)
        }
    })
}

/// Writes a whole small file (`payload` in one piece) to storage; returns `(size, checksum)`.
pub fn write_small(
    storage: &dyn crate::storage::Storage,
    name: &str,
    kind: FileKind,
    payload: &[u8],
) -> Result<(u64, u64)> {
    let mut w = FileWriter::new(storage.create(name)?, name, kind)?;
    w.write(payload)?;
    w.finish()
}

/// Reads and verifies a whole small file; returns its payload and checksum.
pub fn read_small(
    storage: &dyn crate::storage::Storage,
    name: &str,
    kind: FileKind,
    max_payload: u64,
) -> Result<(Vec<u8>, u64)> {
    let (r, size) = storage.open(name)?;
    let mut fr = FileReader::new(r, size, name, kind)?;
    if fr.remaining() > max_payload {
        return Err(CheckpointError::corrupt(
            name,
            format!(
                "payload of {} bytes exceeds the limit {max_payload}",
                fr.remaining()
            ),
        ));
    }
    let payload = fr.read_vec(fr.remaining() as usize)?;
    let sum = fr.finish()?;
    Ok((payload, sum))
}
