//! Table-part files: rows of one part of one table, streamed in compressed chunks.
//!
//! Payload: `name_len u32 | table name | part_len u32 | part name | row_stride u32 | 0 u32`,
//! then records `tag u32 | n u32 | raw_len u32 | stored_len u32 | codec u32 | stored bytes`:
//! tag 1 = removed keys (`n` u64), tag 2 = rows, tag 0 = end (all other fields 0). All removed
//! records come before the first rows record. A rows record's raw bytes are columnar:
//! `n` keys u64 | `n` metas (last_step, version, count: u32 each) | `n * row_stride` f32
//! (weights then optimizer state, per row), all little-endian. Format version 2 adds tag 3 =
//! the admission sketch of table shard `n` (raw: `increments u64 | counters u16...`), after
//! the rows: the counts of ids seen but not admitted yet. Codec bit 0 = zstd,
//! bit 1 = the float column is byte-shuffled (byte plane 0 of all floats, then plane 1, ...),
//! which lets zstd find the redundancy in exponents and signs.

use std::collections::BTreeMap;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

use parking_lot::Mutex;
use sparta_table::RowMeta;

use crate::error::{CheckpointError, Result};
use crate::format::{FileKind, FileReader, FileWriter};
use crate::storage::Storage;

const TAG_END: u32 = 0;
const TAG_REMOVED: u32 = 1;
const TAG_ROWS: u32 = 2;
const TAG_SKETCH: u32 = 3;
const CODEC_ZSTD: u32 = 1;
const CODEC_SHUFFLE: u32 = 2;
/// Most rows (or removed keys) in one record accepted by readers.
pub const MAX_CHUNK_ROWS: usize = 1 << 20;
/// Most bytes of one record's raw form accepted by readers.
const MAX_RAW_BYTES: u64 = 1 << 30;
/// Longest table / part name accepted by readers.
const MAX_NAME: u32 = 256;

/// Compression of table-part records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Compression {
    /// Raw little-endian columns.
    None,
    /// zstd at `level` (1 = fast; negative levels are faster still).
    Zstd {
        /// zstd level.
        level: i32,
    },
}

/// How table parts are written.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WriteOptions {
    /// Rows per record (clamped to `1..=MAX_CHUNK_ROWS`).
    pub chunk_rows: usize,
    /// Record compression.
    pub compression: Compression,
    /// Byte-shuffle the float column before compressing.
    pub shuffle: bool,
    /// Encoding / decoding threads per part file (0 = available parallelism).
    pub threads: usize,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            chunk_rows: 16 * 1024,
            compression: Compression::Zstd { level: 1 },
            shuffle: true,
            threads: 0,
        }
    }
}

impl WriteOptions {
    pub(crate) fn thread_count(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        }
    }
}

/// What writing or reading one part file saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartStats {
    /// Rows stored.
    pub rows: u64,
    /// Removed keys stored.
    pub removed: u64,
    /// File size in bytes.
    pub bytes: u64,
    /// xxh3-64 of header + payload.
    pub checksum: u64,
    /// Size of the rows' raw (uncompressed) columns in bytes.
    pub raw_bytes: u64,
    /// Admission-sketch records (one per table shard; 0 with admission `always`).
    pub sketches: u64,
}

/// Calls its argument with `(table shard, counters, increments)` per admission sketch.
pub(crate) type SketchScan<'a> = &'a dyn Fn(&mut dyn FnMut(usize, &[u16], u64));

fn encode_sketch(
    shard: usize,
    counters: &[u16],
    increments: u64,
    c: Compression,
) -> Result<Vec<u8>> {
    let mut raw = Vec::with_capacity(8 + 2 * counters.len());
    raw.extend_from_slice(&increments.to_le_bytes());
    raw.extend_from_slice(bytemuck::cast_slice(counters));
    let raw_len = raw.len();
    let (stored, codec) = compress(raw, c)?;
    Ok(record(TAG_SKETCH, shard, raw_len, codec, &stored))
}

/// Rows gathered for one record.
#[derive(Default)]
struct RawChunk {
    keys: Vec<u64>,
    metas: Vec<u32>,
    floats: Vec<f32>,
}

fn shuffle(src: &[u8], dst: &mut Vec<u8>) {
    let n = src.len() / 4;
    let start = dst.len();
    dst.resize(start + src.len(), 0);
    let out = &mut dst[start..];
    for (i, w) in src.chunks_exact(4).enumerate() {
        out[i] = w[0];
        out[n + i] = w[1];
        out[2 * n + i] = w[2];
        out[3 * n + i] = w[3];
    }
}

fn unshuffle(src: &[u8], dst: &mut [u8]) {
    let n = src.len() / 4;
    for (i, w) in dst.chunks_exact_mut(4).enumerate() {
        w[0] = src[i];
        w[1] = src[n + i];
        w[2] = src[2 * n + i];
        w[3] = src[3 * n + i];
    }
}

fn record(tag: u32, n: usize, raw_len: usize, codec: u32, stored: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + stored.len());
    for v in [tag, n as u32, raw_len as u32, stored.len() as u32, codec] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(stored);
    out
}

fn compress(raw: Vec<u8>, c: Compression) -> Result<(Vec<u8>, u32)> {
    match c {
        Compression::None => Ok((raw, 0)),
        Compression::Zstd { level } => zstd::bulk::compress(&raw, level)
            .map(|v| (v, CODEC_ZSTD))
            .map_err(|e| CheckpointError::Usage(format!("zstd compression failed: {e}"))),
    }
}

fn encode_removed(keys: &[u64], c: Compression) -> Result<Vec<u8>> {
    let raw: Vec<u8> = bytemuck::cast_slice(keys).to_vec();
    let raw_len = raw.len();
    let (stored, codec) = compress(raw, c)?;
    Ok(record(TAG_REMOVED, keys.len(), raw_len, codec, &stored))
}

fn encode_rows(chunk: &RawChunk, opts: &WriteOptions) -> Result<Vec<u8>> {
    let floats: &[u8] = bytemuck::cast_slice(&chunk.floats);
    let mut raw = Vec::with_capacity(chunk.keys.len() * 20 + floats.len());
    raw.extend_from_slice(bytemuck::cast_slice(&chunk.keys));
    raw.extend_from_slice(bytemuck::cast_slice(&chunk.metas));
    let mut codec = 0;
    if opts.shuffle && opts.compression != Compression::None {
        shuffle(floats, &mut raw);
        codec |= CODEC_SHUFFLE;
    } else {
        raw.extend_from_slice(floats);
    }
    let raw_len = raw.len();
    let (stored, c) = compress(raw, opts.compression)?;
    Ok(record(
        TAG_ROWS,
        chunk.keys.len(),
        raw_len,
        codec | c,
        &stored,
    ))
}

/// Writes one table-part file: `removed` keys first, then every row `scan` yields, then the
/// admission sketches `sketches` yields.
///
/// `scan` is called once on this thread with a sink for `(key, full row, meta)`; records are
/// encoded on `opts.threads` threads and written in order by one writer thread.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_part(
    storage: &dyn Storage,
    file: &str,
    table: &str,
    part: &str,
    stride: usize,
    removed: &[u64],
    scan: impl FnOnce(&mut dyn FnMut(u64, &[f32], RowMeta)),
    sketches: SketchScan<'_>,
    opts: &WriteOptions,
) -> Result<PartStats> {
    let mut fw = FileWriter::new(storage.create(file)?, file, FileKind::TableRows)?;
    let mut prelude = Vec::new();
    for name in [table, part] {
        prelude.extend_from_slice(&(name.len() as u32).to_le_bytes());
        prelude.extend_from_slice(name.as_bytes());
    }
    prelude.extend_from_slice(&(stride as u32).to_le_bytes());
    prelude.extend_from_slice(&0u32.to_le_bytes());
    fw.write(&prelude)?;
    let chunk_rows = opts.chunk_rows.clamp(1, MAX_CHUNK_ROWS);
    for keys in removed.chunks(chunk_rows) {
        fw.write(&encode_removed(keys, opts.compression)?)?;
    }
    let threads = opts.thread_count();
    let mut rows = 0u64;
    let fw = std::thread::scope(|s| -> Result<FileWriter<'_>> {
        let (raw_tx, raw_rx) = sync_channel::<(u64, RawChunk)>(threads * 2);
        let raw_rx = Arc::new(Mutex::new(raw_rx));
        let (enc_tx, enc_rx) = sync_channel::<(u64, Result<Vec<u8>>)>(threads * 2);
        for _ in 0..threads {
            let (rx, tx) = (raw_rx.clone(), enc_tx.clone());
            s.spawn(move || loop {
                let msg = rx.lock().recv();
                let Ok((seq, chunk)) = msg else { break };
                if tx.send((seq, encode_rows(&chunk, opts))).is_err() {
                    break;
                }
            });
        }
        drop((raw_rx, enc_tx));
        let writer = s.spawn(move || write_in_order(fw, enc_rx));
        let mut seq = 0u64;
        let mut chunk = RawChunk::default();
        let mut open = true;
        let mut send = |chunk: RawChunk, seq: &mut u64| {
            if open && raw_tx.send((*seq, chunk)).is_err() {
                open = false; // the writer failed; its error is returned below
            }
            *seq += 1;
        };
        scan(&mut |key, row, meta| {
            debug_assert_eq!(row.len(), stride);
            chunk.keys.push(key);
            chunk
                .metas
                .extend_from_slice(&[meta.last_step, meta.version, meta.count]);
            chunk.floats.extend_from_slice(row);
            rows += 1;
            if chunk.keys.len() == chunk_rows {
                send(std::mem::take(&mut chunk), &mut seq);
            }
        });
        if !chunk.keys.is_empty() {
            send(chunk, &mut seq);
        }
        drop(raw_tx);
        writer.join().expect("checkpoint writer thread panicked")
    })?;
    let mut fw = fw;
    let mut n_sketches = 0u64;
    let mut failed = None;
    sketches(&mut |shard, counters, increments| {
        if failed.is_some() {
            return;
        }
        match encode_sketch(shard, counters, increments, opts.compression)
            .and_then(|rec| fw.write(&rec))
        {
            Ok(()) => n_sketches += 1,
            Err(e) => failed = Some(e),
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    fw.write(&record(TAG_END, 0, 0, 0, &[]))?;
    let (bytes, checksum) = fw.finish()?;
    Ok(PartStats {
        rows,
        removed: removed.len() as u64,
        bytes,
        checksum,
        raw_bytes: rows * (20 + 4 * stride as u64),
        sketches: n_sketches,
    })
}

fn write_in_order<'s>(
    mut fw: FileWriter<'s>,
    rx: Receiver<(u64, Result<Vec<u8>>)>,
) -> Result<FileWriter<'s>> {
    let mut pending = BTreeMap::new();
    let mut next = 0u64;
    for (seq, enc) in rx {
        pending.insert(seq, enc?);
        while let Some(bytes) = pending.remove(&next) {
            fw.write(&bytes)?;
            next += 1;
        }
    }
    if !pending.is_empty() {
        return Err(CheckpointError::Usage("encoded records lost".into()));
    }
    Ok(fw)
}

/// One record's header.
struct RecordHead {
    tag: u32,
    n: usize,
    raw_len: usize,
    stored: Vec<u8>,
    codec: u32,
}

fn read_record(fr: &mut FileReader<'_>) -> Result<RecordHead> {
    let tag = fr.u32()?;
    let n = fr.u32()? as usize;
    let raw_len = fr.u32()? as u64;
    let stored_len = fr.u32()? as u64;
    let codec = fr.u32()?;
    let bad = |why: String| CheckpointError::corrupt(fr.name(), why);
    let max_tag = if fr.version() >= 2 {
        TAG_SKETCH
    } else {
        TAG_ROWS
    };
    if tag > max_tag {
        return Err(bad(format!(
            "unknown record tag {tag} (format version {})",
            fr.version()
        )));
    }
    if n > MAX_CHUNK_ROWS || raw_len > MAX_RAW_BYTES {
        return Err(bad(format!(
            "record of {n} rows / {raw_len} bytes is too large"
        )));
    }
    if codec & !(CODEC_ZSTD | CODEC_SHUFFLE) != 0 {
        return Err(bad(format!("unknown codec {codec}")));
    }
    if codec & CODEC_ZSTD == 0 && stored_len != raw_len {
        return Err(bad(format!(
            "uncompressed record stores {stored_len} bytes, raw length {raw_len}"
        )));
    }
    if stored_len > fr.remaining() {
        return Err(bad(format!(
            "truncated: record of {stored_len} bytes, {} left",
            fr.remaining()
        )));
    }
    let stored = fr.read_vec(stored_len as usize)?;
    Ok(RecordHead {
        tag,
        n,
        raw_len: raw_len as usize,
        stored,
        codec,
    })
}

fn decode_raw(file: &str, rec: RecordHead) -> Result<Vec<u8>> {
    if rec.codec & CODEC_ZSTD == 0 {
        return Ok(rec.stored);
    }
    let mut raw = vec![0u8; rec.raw_len];
    let got = zstd::bulk::decompress_to_buffer(&rec.stored, &mut raw[..])
        .map_err(|e| CheckpointError::corrupt(file, format!("zstd: {e}")))?;
    if got != rec.raw_len {
        return Err(CheckpointError::corrupt(
            file,
            format!(
                "record decompressed to {got} bytes, expected {}",
                rec.raw_len
            ),
        ));
    }
    Ok(raw)
}

/// Decoded rows of one record: keys, metas, packed full rows.
pub(crate) struct Rows {
    /// Keys.
    pub keys: Vec<u64>,
    /// Row metadata.
    pub metas: Vec<RowMeta>,
    /// `keys.len() * stride` floats.
    pub floats: Vec<f32>,
}

fn decode_rows(file: &str, stride: usize, rec: RecordHead) -> Result<Rows> {
    let n = rec.n;
    let shuffled = rec.codec & CODEC_SHUFFLE != 0;
    let want = n as u64 * (20 + 4 * stride as u64);
    if rec.raw_len as u64 != want {
        return Err(CheckpointError::corrupt(
            file,
            format!(
                "rows record of {n} rows has {} raw bytes, expected {want}",
                rec.raw_len
            ),
        ));
    }
    let raw = decode_raw(file, rec)?;
    let mut keys = vec![0u64; n];
    bytemuck::cast_slice_mut::<u64, u8>(&mut keys).copy_from_slice(&raw[..8 * n]);
    let mut meta_words = vec![0u32; 3 * n];
    bytemuck::cast_slice_mut::<u32, u8>(&mut meta_words).copy_from_slice(&raw[8 * n..20 * n]);
    let metas = meta_words
        .chunks_exact(3)
        .map(|m| RowMeta {
            last_step: m[0],
            version: m[1],
            count: m[2],
        })
        .collect();
    let mut floats = vec![0f32; n * stride];
    let dst = bytemuck::cast_slice_mut::<f32, u8>(&mut floats);
    if shuffled {
        unshuffle(&raw[20 * n..], dst);
    } else {
        dst.copy_from_slice(&raw[20 * n..]);
    }
    Ok(Rows {
        keys,
        metas,
        floats,
    })
}

fn read_name(fr: &mut FileReader<'_>) -> Result<String> {
    let len = fr.u32()?;
    if len > MAX_NAME {
        return Err(CheckpointError::corrupt(
            fr.name(),
            format!("name of {len} bytes"),
        ));
    }
    let bytes = fr.read_vec(len as usize)?;
    String::from_utf8(bytes).map_err(|_| CheckpointError::corrupt(fr.name(), "name is not UTF-8"))
}

/// Callbacks of [`read_part`].
pub(crate) struct PartSinks<R, W, S> {
    /// Each removed-keys record in file order, before any row.
    pub removed: R,
    /// Row records, concurrently on the reader's threads (rows of one file have distinct
    /// keys, so their order does not matter).
    pub rows: W,
    /// Each admission sketch `(table shard, counters, increments)` (format version 2).
    pub sketch: S,
}

/// Reads and verifies one table-part file, feeding `sinks`. Any error stops the read.
/// Returns the stats once the footer checksum has been verified.
pub(crate) fn read_part<R, W, S>(
    storage: &dyn Storage,
    file: &str,
    expect: (&str, &str, usize),
    threads: usize,
    sinks: PartSinks<R, W, S>,
) -> Result<PartStats>
where
    R: FnMut(&[u64]) -> Result<()>,
    W: Fn(Rows) -> Result<()> + Sync,
    S: FnMut(usize, &[u16], u64) -> Result<()>,
{
    let PartSinks {
        removed: mut on_removed,
        rows: on_rows,
        sketch: mut on_sketch,
    } = sinks;
    let (r, size) = storage.open(file)?;
    let mut fr = FileReader::new(r, size, file, FileKind::TableRows)?;
    let table = read_name(&mut fr)?;
    let part = read_name(&mut fr)?;
    let stride = fr.u32()? as usize;
    let _reserved = fr.u32()?;
    if (table.as_str(), part.as_str(), stride) != expect {
        return Err(CheckpointError::corrupt(
            file,
            format!(
                "holds table `{table}` part `{part}` stride {stride}, manifest says `{}` `{}` {}",
                expect.0, expect.1, expect.2
            ),
        ));
    }
    let mut stats = PartStats::default();
    let failed: Mutex<Option<CheckpointError>> = Mutex::new(None);
    let fail = |e: CheckpointError| {
        let mut f = failed.lock();
        if f.is_none() {
            *f = Some(e);
        }
    };
    let threads = threads.max(1);
    let result = std::thread::scope(|s| -> Result<()> {
        let (tx, rx) = sync_channel::<RecordHead>(threads * 2);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..threads {
            let rx = rx.clone();
            let (on_rows, fail) = (&on_rows, &fail);
            s.spawn(move || loop {
                let msg = rx.lock().recv();
                let Ok(rec) = msg else { break };
                if let Err(e) = decode_rows(file, stride, rec).and_then(on_rows) {
                    fail(e);
                }
            });
        }
        drop(rx);
        let mut seen_rows = false;
        loop {
            if failed.lock().is_some() {
                return Ok(()); // reported below
            }
            let rec = read_record(&mut fr)?;
            match rec.tag {
                TAG_END => {
                    if rec.n != 0 || rec.raw_len != 0 || !rec.stored.is_empty() {
                        return Err(CheckpointError::corrupt(file, "malformed end record"));
                    }
                    return Ok(());
                }
                TAG_REMOVED => {
                    if seen_rows {
                        return Err(CheckpointError::corrupt(file, "removed keys after rows"));
                    }
                    if rec.raw_len != 8 * rec.n {
                        return Err(CheckpointError::corrupt(file, "removed record length"));
                    }
                    let n = rec.n;
                    let raw = decode_raw(file, rec)?;
                    let mut keys = vec![0u64; n];
                    bytemuck::cast_slice_mut::<u64, u8>(&mut keys).copy_from_slice(&raw);
                    stats.removed += n as u64;
                    on_removed(&keys)?;
                }
                TAG_SKETCH => {
                    if rec.raw_len < 8 || !rec.raw_len.is_multiple_of(2) {
                        return Err(CheckpointError::corrupt(file, "sketch record length"));
                    }
                    let shard = rec.n;
                    let raw = decode_raw(file, rec)?;
                    let increments = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
                    let mut counters = vec![0u16; (raw.len() - 8) / 2];
                    bytemuck::cast_slice_mut::<u16, u8>(&mut counters).copy_from_slice(&raw[8..]);
                    stats.sketches += 1;
                    on_sketch(shard, &counters, increments)?;
                }
                _ => {
                    seen_rows = true;
                    stats.rows += rec.n as u64;
                    stats.raw_bytes += rec.n as u64 * (20 + 4 * stride as u64);
                    if tx.send(rec).is_err() {
                        return Ok(());
                    }
                }
            }
        }
    });
    result?;
    if let Some(e) = failed.into_inner() {
        return Err(e);
    }
    stats.checksum = fr.finish()?;
    stats.bytes = size;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffle_round_trips_and_groups_byte_planes() {
        let floats: Vec<f32> = (0..37).map(|i| i as f32 * 0.37 - 3.0).collect();
        let bytes: &[u8] = bytemuck::cast_slice(&floats);
        let mut shuffled = Vec::new();
        shuffle(bytes, &mut shuffled);
        assert_eq!(shuffled.len(), bytes.len());
        assert_eq!(
            shuffled[37 * 3],
            bytes[3],
            "plane 3 starts with the first float's top byte"
        );
        let mut back = vec![0u8; bytes.len()];
        unshuffle(&shuffled, &mut back);
        assert_eq!(back, bytes);
    }
}
