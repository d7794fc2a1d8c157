//! Input sources: what one input path holds and how its text is read.
//!
//! Two shapes of source feed the one reading engine ([`crate::feed`]):
//!
//! * **ranged** ([`RangeRead`]): random access by byte offset. Splittable into line-aligned
//!   parts and resumable by seeking. Local plain files today; an object-store object read by
//!   range requests would be one more implementation of the trait.
//! * **streams**: text read front to back through [`std::io::Read`]. Gzip files (decompressed),
//!   pipes and other non-seekable files today; a Kafka partition or a whole-object download
//!   would plug in here. A stream is resumed by reading and discarding up to the offset (gzip)
//!   or not at all (a pipe).
//!
//! Files are read with `pread` into owned buffers, never memory-mapped: a file truncated or
//! rewritten while it is read gives an error naming it ([`DataError::Changed`] or a gzip error),
//! not a `SIGBUS`.
//!
//! A Parquet file (detected by its `PAR1` magic or a `.parquet` extension) is a ranged source
//! read by row groups instead of text: the feeder hands the parsers row ranges, which they
//! decode into the same rows ([`crate::parquet`]).

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flate2::read::MultiGzDecoder;

use crate::error::DataError;
use crate::stats::ReadStats;

/// Read size of streams and of the gzip decoder's input.
pub(crate) const STREAM_BLOCK: usize = 256 << 10;

/// A source of bytes readable at any offset (a local file, later an object-store object).
pub trait RangeRead: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`; 0 only at (or past) the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl RangeRead for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        loop {
            match FileExt::read_at(self, buf, offset) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }
}

/// The error payload of a ranged source that ended before the length it had when opened.
#[derive(Debug)]
pub(crate) struct Shrunk {
    /// Length when opened.
    pub expected: u64,
    /// Where reading found the end.
    pub at: u64,
}

impl std::fmt::Display for Shrunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the file ended at byte {} while it had {} bytes when opened (truncated or \
             rewritten while read)",
            self.at, self.expected
        )
    }
}

impl std::error::Error for Shrunk {}

/// A [`Read`] over `[pos, end)` of a ranged source; an end found before `end` is an error
/// carrying [`Shrunk`].
pub(crate) struct RangeReader {
    source: Arc<dyn RangeRead>,
    pos: u64,
    end: u64,
    /// Length of the source when opened (for the error).
    len: u64,
}

impl RangeReader {
    pub fn new(source: Arc<dyn RangeRead>, pos: u64, end: u64, len: u64) -> Self {
        RangeReader {
            source,
            pos,
            end,
            len,
        }
    }
}

impl Read for RangeReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (self.end - self.pos).min(buf.len() as u64) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.source.read_at(&mut buf[..want], self.pos)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                Shrunk {
                    expected: self.len,
                    at: self.pos,
                },
            ));
        }
        self.pos += n as u64;
        Ok(n)
    }
}

/// What an opened input holds.
pub(crate) enum InputKind {
    /// No bytes.
    Empty,
    /// Plain text, random access; `len` bytes when opened (bytes appended later are not read).
    Plain {
        source: Arc<dyn RangeRead>,
        len: u64,
    },
    /// A gzip file of `len` bytes, decompressed as a stream.
    Gzip {
        source: Arc<dyn RangeRead>,
        len: u64,
    },
    /// A Parquet file of `len` bytes (see [`crate::parquet`]): read by row groups, its
    /// positions count rows.
    Parquet {
        source: Arc<dyn RangeRead>,
        len: u64,
    },
    /// A pipe or another non-seekable file: opened when read (which waits for a writer, like
    /// `cat`), read once as a stream, gzip detected by its first bytes.
    Stream,
}

/// An input path, checked and (unless a stream) opened.
pub(crate) struct Input {
    pub path: PathBuf,
    pub kind: InputKind,
}

/// Magic bytes at both ends of a Parquet file.
pub(crate) const PARQUET_MAGIC: &[u8; 4] = b"PAR1";

/// Whether `path` is a Parquet file: `magic` (its first bytes) is `PAR1`, or its name ends in
/// `.parquet`. The one Parquet detection of the workspace.
pub(crate) fn is_parquet(path: &Path, magic: &[u8]) -> bool {
    magic == PARQUET_MAGIC || path.extension().is_some_and(|e| e == "parquet")
}

/// Whether the file at `path` can be read now: a Parquet file only once its footer is written
/// (it ends in the magic bytes), any other file always. A followed directory reads a file
/// only when this holds (see [`crate::follow`]).
pub(crate) fn footer_written(path: &Path) -> io::Result<bool> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut head = [0u8; 4];
    let n = read_full_at(&file, &mut head, 0)?;
    if !is_parquet(path, &head[..n]) {
        return Ok(true);
    }
    if n == 4 && &head != PARQUET_MAGIC {
        // Named `.parquet` but not Parquet (a writer starts with the magic): read it now, so
        // that it is reported as what it is instead of waited for.
        return Ok(true);
    }
    let mut tail = [0u8; 4];
    Ok(len >= 12 && read_full_at(&file, &mut tail, len - 4)? == 4 && &tail == PARQUET_MAGIC)
}

/// Whether `magic` starts a gzip stream. The one gzip detection of the workspace.
fn is_gzip(magic: &[u8]) -> bool {
    magic.starts_with(&[0x1f, 0x8b])
}

/// Opens inputs for one reader: local paths directly, object URLs (`s3://`, `file://`)
/// through an [`crate::object::ObjectClient`] made on first use (or the one in the config),
/// counting their traffic in the reader's stats.
#[derive(Clone)]
pub(crate) struct Opener {
    #[cfg_attr(not(feature = "object-store"), allow(dead_code))]
    stats: Arc<ReadStats>,
    #[cfg(feature = "object-store")]
    objects: Arc<std::sync::OnceLock<Arc<crate::object::ObjectClient>>>,
}

impl Opener {
    /// An opener counting in `stats`; `client`: the object client to use (else one is made
    /// from `AWS_*` on the first URL).
    pub fn new(stats: Arc<ReadStats>, client: Option<&ObjectClientRef>) -> Opener {
        #[cfg(feature = "object-store")]
        {
            let objects = Arc::new(std::sync::OnceLock::new());
            if let Some(c) = client {
                let _ = objects.set(Arc::clone(&c.0));
            }
            Opener { stats, objects }
        }
        #[cfg(not(feature = "object-store"))]
        {
            let _ = client;
            Opener { stats }
        }
    }

    #[cfg(feature = "object-store")]
    fn client(&self) -> Result<&Arc<crate::object::ObjectClient>, DataError> {
        if let Some(c) = self.objects.get() {
            return Ok(c);
        }
        let c = crate::object::ObjectClient::new(crate::object::ObjectOptions::from_env()?)?;
        Ok(self.objects.get_or_init(|| c))
    }

    /// Opens every input `paths` name, in order: a local path is itself; an object URL names
    /// one object, or for a prefix or a glob several, in name order, opened together (see
    /// [`crate::object::ObjectClient::open_listed`]).
    pub fn open_all(&self, paths: &[PathBuf]) -> Result<Vec<Input>, DataError> {
        let mut inputs = Vec::with_capacity(paths.len());
        for p in paths {
            if !is_url(p) {
                inputs.push(Input::open(p)?);
                continue;
            }
            #[cfg(feature = "object-store")]
            {
                let client = self.client()?;
                let entries = client.expand(p)?;
                for (object, head) in client.open_listed(&entries, MAGIC_BYTES)? {
                    object.count_in(Arc::clone(&self.stats));
                    let (path, len) = (object.url().to_path_buf(), object.len());
                    let source: Arc<dyn RangeRead> = Arc::new(object);
                    let kind = kind_by_magic(&path, &head, source, len);
                    inputs.push(Input { path, kind });
                }
            }
            #[cfg(not(feature = "object-store"))]
            return Err(no_object_store(p));
        }
        Ok(inputs)
    }

    /// Opens one input (see [`Input::open`]).
    pub fn open(&self, path: &Path) -> Result<Input, DataError> {
        if !is_url(path) {
            return Input::open(path);
        }
        #[cfg(feature = "object-store")]
        {
            let object = self.client()?.open(path)?;
            object.count_in(Arc::clone(&self.stats));
            let len = object.len();
            let source: Arc<dyn RangeRead> = Arc::new(object);
            let kind = kind_of(path, source, len).map_err(|e| DataError::Io {
                path: path.to_path_buf(),
                source: e,
            })?;
            Ok(Input {
                path: path.to_path_buf(),
                kind,
            })
        }
        #[cfg(not(feature = "object-store"))]
        Err(no_object_store(path))
    }

    /// The names and sizes of the objects directly under a prefix URL, in name order.
    #[cfg(feature = "object-store")]
    pub fn list_prefix(&self, url: &Path) -> Result<Vec<(String, u64)>, DataError> {
        self.client()?.list_dir(url)
    }
}

/// An object client handed to a reader through its config (tests, or to share one client).
#[derive(Clone, Debug)]
pub struct ObjectClientRef(
    #[cfg(feature = "object-store")] pub Arc<crate::object::ObjectClient>,
    #[cfg(not(feature = "object-store"))] (),
);

/// Whether `path` is a URL (`scheme://...`): an object in a store, not a local path (the
/// blob layer's one rule, [`sparta_blob::is_url`]).
pub fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(sparta_blob::is_url)
}

#[cfg(not(feature = "object-store"))]
fn no_object_store(path: &Path) -> DataError {
    DataError::Config(format!(
        "{}: this build reads no object storage (rebuild with the `object-store` feature \
         of sparta-data)",
        path.display()
    ))
}

/// What a ranged source of `len` bytes holds, by its first bytes (and a `.parquet` name).
fn kind_of(path: &Path, source: Arc<dyn RangeRead>, len: u64) -> io::Result<InputKind> {
    let mut magic = [0u8; MAGIC_BYTES];
    let n = read_full_at(&*source, &mut magic, 0)?;
    Ok(kind_by_magic(path, &magic[..n], source, len))
}

/// Bytes of a source's start that decide its kind.
const MAGIC_BYTES: usize = 4;

/// What a source holds, given its first bytes (`magic`, up to [`MAGIC_BYTES`]).
fn kind_by_magic(path: &Path, magic: &[u8], source: Arc<dyn RangeRead>, len: u64) -> InputKind {
    if len == 0 || magic.is_empty() {
        InputKind::Empty
    } else if is_parquet(path, magic) {
        InputKind::Parquet { source, len }
    } else if is_gzip(magic) {
        InputKind::Gzip { source, len }
    } else {
        InputKind::Plain { source, len }
    }
}

impl Input {
    /// Checks `path` and opens it; detects gzip by its magic bytes, Parquet by its magic
    /// bytes or a `.parquet` extension. A FIFO or another
    /// non-regular file is not opened here (that would wait for its writer).
    pub fn open(path: &Path) -> Result<Input, DataError> {
        let io_err = |source| DataError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(DataError::NotFound {
                    path: path.to_path_buf(),
                })
            }
            Err(e) => return Err(io_err(e)),
        };
        if meta.is_dir() {
            return Err(DataError::IsDirectory {
                path: path.to_path_buf(),
            });
        }
        let kind = if !meta.is_file() {
            InputKind::Stream
        } else {
            let file = File::open(path).map_err(io_err)?;
            let len = file.metadata().map_err(io_err)?.len();
            kind_of(path, Arc::new(file), len).map_err(io_err)?
        };
        Ok(Input {
            path: path.to_path_buf(),
            kind,
        })
    }

    /// Whether the input can only be read front to back once (a pipe).
    pub fn is_stream(&self) -> bool {
        matches!(self.kind, InputKind::Stream)
    }

    /// The decompressed text of a gzip or stream input, from its start (`None` for the
    /// other kinds). A stream is opened here.
    pub fn text_stream(&self) -> io::Result<Option<Box<dyn Read + Send>>> {
        Ok(match &self.kind {
            InputKind::Empty | InputKind::Plain { .. } | InputKind::Parquet { .. } => None,
            InputKind::Gzip { source, len } => {
                Some(Box::new(MultiGzDecoder::new(BufReader::with_capacity(
                    STREAM_BLOCK,
                    RangeReader::new(Arc::clone(source), 0, *len, *len),
                ))))
            }
            InputKind::Stream => {
                let mut f = File::open(&self.path)?;
                let mut magic = [0u8; 2];
                let n = read_up_to(&mut f, &mut magic)?;
                let head = io::Cursor::new(magic[..n].to_vec());
                let whole = head.chain(f);
                if is_gzip(&magic[..n]) {
                    Some(Box::new(MultiGzDecoder::new(BufReader::with_capacity(
                        STREAM_BLOCK,
                        whole,
                    ))))
                } else {
                    Some(Box::new(whole))
                }
            }
        })
    }
}

/// Opens an input file (plain or gzip, detected by content; a pipe is read as a stream) as a
/// buffered reader of its text: the same detection as the batch readers. A Parquet file is an
/// error ([`DataError::Parquet`]).
pub fn open_text(path: &Path) -> Result<Box<dyn BufRead + Send>, DataError> {
    let input = Input::open(path)?;
    let inner: Box<dyn Read + Send> = match &input.kind {
        InputKind::Empty => Box::new(io::empty()),
        InputKind::Plain { source, len } => {
            Box::new(RangeReader::new(Arc::clone(source), 0, *len, *len))
        }
        InputKind::Parquet { .. } => {
            return Err(DataError::Parquet {
                path: path.to_path_buf(),
                detail: "a Parquet file has no lines of text (read it with the batch readers)"
                    .into(),
            })
        }
        _ => input
            .text_stream()
            .map_err(|source| DataError::Io {
                path: path.to_path_buf(),
                source,
            })?
            .unwrap_or_else(|| Box::new(io::empty())),
    };
    Ok(Box::new(BufReader::with_capacity(1 << 20, inner)))
}

/// Reads until `buf` is full or the end.
pub(crate) fn read_full_at(src: &dyn RangeRead, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match src.read_at(&mut buf[n..], offset + n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The first line start at or after `pos` (`len` if none).
pub(crate) fn line_start_at(src: &dyn RangeRead, pos: u64, len: u64) -> io::Result<u64> {
    if pos == 0 || pos >= len {
        return Ok(pos.min(len));
    }
    let mut buf = vec![0u8; 64 << 10];
    let mut at = pos - 1;
    while at < len {
        let want = (len - at).min(buf.len() as u64) as usize;
        let n = read_full_at(src, &mut buf[..want], at)?;
        if n == 0 {
            break;
        }
        if let Some(p) = memchr::memchr(b'\n', &buf[..n]) {
            return Ok(at + p as u64 + 1);
        }
        at += n as u64;
    }
    Ok(len)
}

/// Newlines in `[0, end)` of a ranged source (for line numbers in reports; 0 on errors).
pub(crate) fn lines_before(src: &dyn RangeRead, end: u64) -> u64 {
    let mut buf = vec![0u8; 1 << 20];
    let (mut at, mut count) = (0u64, 0u64);
    while at < end {
        let want = (end - at).min(buf.len() as u64) as usize;
        match read_full_at(src, &mut buf[..want], at) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                count += memchr::memchr_iter(b'\n', &buf[..n]).count() as u64;
                at += n as u64;
            }
        }
    }
    count
}
