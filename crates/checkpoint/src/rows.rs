//! Table-part files: rows of one part of one table, streamed in compressed chunks.
//!
//! Payload: `name_len u32 | table name | part_len u32 | part name | row_stride u32 |
//! precision u32 | dim u32` (format version 3; before it the precision word was a reserved 0
//! and there was no dim: every row f32), then records `tag u32 | n u32 | raw_len u32 |
//! stored_len u32 | codec u32 | stored bytes`: tag 1 = removed keys (`n` u64), tag 2 = rows,
//! tag 0 = end (all other fields 0). All removed records come before the first rows record.
//! A rows record's raw bytes are columnar: `n` keys u64 | `n` metas (last_step, version,
//! count: u32 each) | the rows' floats, all little-endian. The precision
//! ([`RowPrecision::code`]: 0 = f32, 1 = f16, 2 = bf16, 3 = int8) says how the floats are
//! stored:
//! - f32: `n * row_stride` f32 (weights then optimizer state, per row);
//! - f16, bf16: `n * dim` 16-bit weights (row by row), then `n * (row_stride - dim)` f32 state;
//! - int8: `n` f32 scales, `n * dim` signed bytes, then the state as above;
//!
//! the weights exactly as the table stores them ([`WeightBytes`]), so a restore gives back
//! the same values. Format version 2 adds tag 3 = the admission sketch of table shard `n`
//! (raw: `increments u64 | counters u16...`), after the rows: the counts of ids seen but not
//! admitted yet. Codec bit 0 = zstd, bit 1 = every float column is byte-shuffled (byte plane 0
//! of all its values, then plane 1, ...; 16-bit weights in 2 planes, int8 ones as they are),
//! which lets zstd find the redundancy in exponents and signs.

use std::collections::BTreeMap;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

use parking_lot::Mutex;
use sparta_table::{RowMeta, RowPrecision, WeightBytes};

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

/// How a part's rows store their floats: the table's precision and dim (its weights per row;
/// the rest of a row's `row_stride` floats are optimizer state, always f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowLayout {
    /// The weights' stored form.
    pub precision: RowPrecision,
    /// Weights per row.
    pub dim: usize,
    /// Floats per decoded row (weights + optimizer state).
    pub stride: usize,
}

impl RowLayout {
    /// Every float of a row as f32 (the files before format version 3).
    pub fn f32(stride: usize) -> RowLayout {
        RowLayout {
            precision: RowPrecision::F32,
            dim: stride,
            stride,
        }
    }

    /// Raw bytes of one row's floats in a rows record.
    fn row_bytes(&self) -> u64 {
        (self.precision.weight_bytes(self.dim) + 4 * (self.stride - self.dim)) as u64
    }

    /// Raw bytes of `n` rows (keys, metas, floats) in a rows record.
    fn raw_bytes(&self, n: u64) -> u64 {
        n * (20 + self.row_bytes())
    }
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

/// Appends `src`, values of `W` bytes, to `dst` by byte plane: byte 0 of every value, then
/// byte 1, ...
fn shuffle<const W: usize>(src: &[u8], dst: &mut Vec<u8>) {
    let n = src.len() / W;
    let start = dst.len();
    dst.resize(start + src.len(), 0);
    let out = &mut dst[start..];
    for (i, w) in src.chunks_exact(W).enumerate() {
        let w: &[u8; W] = w.try_into().expect("W bytes");
        for (b, &byte) in w.iter().enumerate() {
            out[b * n + i] = byte;
        }
    }
}

/// The inverse of [`shuffle`]: `src`'s byte planes back into `W`-byte values in `dst`.
fn unshuffle<const W: usize>(src: &[u8], dst: &mut [u8]) {
    let n = src.len() / W;
    for (i, w) in dst.chunks_exact_mut(W).enumerate() {
        let w: &mut [u8; W] = w.try_into().expect("W bytes");
        for (b, byte) in w.iter_mut().enumerate() {
            *byte = src[b * n + i];
        }
    }
}

/// Appends one float column of `width`-byte values (4, 2 or 1), byte-shuffled when
/// `shuffled`.
fn put_column(src: &[u8], width: usize, shuffled: bool, dst: &mut Vec<u8>) {
    match (shuffled, width) {
        (true, 4) => shuffle::<4>(src, dst),
        (true, 2) => shuffle::<2>(src, dst),
        _ => dst.extend_from_slice(src),
    }
}

/// One float column of `width`-byte values (4, 2 or 1) from `src` into `dst` (as long),
/// unshuffled when `shuffled`.
fn take_column(src: &[u8], width: usize, shuffled: bool, dst: &mut [u8]) {
    match (shuffled, width) {
        (true, 4) => unshuffle::<4>(src, dst),
        (true, 2) => unshuffle::<2>(src, dst),
        _ => dst.copy_from_slice(src),
    }
}

/// The rows' floats of one record in `layout`'s columns (see the module docs).
fn float_columns(floats: &[f32], layout: &RowLayout, shuffled: bool, raw: &mut Vec<u8>) {
    let RowLayout {
        precision,
        dim,
        stride,
    } = *layout;
    if precision == RowPrecision::F32 {
        put_column(bytemuck::cast_slice(floats), 4, shuffled, raw);
        return;
    }
    let n = floats.len() / stride.max(1);
    let mut wb = WeightBytes::new(precision, dim);
    let mut weights = Vec::with_capacity(n * wb.len());
    let mut state = Vec::with_capacity(n * (stride - dim));
    for row in floats.chunks_exact(stride) {
        // The table's decoded values: their stored form comes back whatever the seed.
        wb.encode(&row[..dim], &mut weights, 0);
        state.extend_from_slice(&row[dim..]);
    }
    if precision == RowPrecision::Int8 {
        let (scales, bytes): (Vec<[u8; 4]>, Vec<&[u8]>) = weights
            .chunks_exact(wb.len())
            .map(|w| ([w[0], w[1], w[2], w[3]], &w[4..]))
            .unzip();
        put_column(bytemuck::cast_slice(&scales), 4, shuffled, raw);
        raw.extend(bytes.concat());
    } else {
        put_column(&weights, 2, shuffled, raw);
    }
    put_column(bytemuck::cast_slice(&state), 4, shuffled, raw);
}

/// The rows' floats (`n * stride`, decoded) of one record's float columns `src`.
fn floats_of_columns(src: &[u8], n: usize, layout: &RowLayout, shuffled: bool) -> Vec<f32> {
    let RowLayout {
        precision,
        dim,
        stride,
    } = *layout;
    let mut floats = vec![0f32; n * stride];
    if precision == RowPrecision::F32 {
        take_column(src, 4, shuffled, bytemuck::cast_slice_mut(&mut floats));
        return floats;
    }
    let column = |src: &[u8], width: usize| {
        let mut out = vec![0u8; src.len()];
        take_column(src, width, shuffled, &mut out);
        out
    };
    let wb = WeightBytes::new(precision, dim);
    let (weights, state) = src.split_at(n * wb.len());
    let state = column(state, 4);
    let mut row_bytes = vec![0u8; wb.len()];
    if precision == RowPrecision::Int8 {
        let (scales, bytes) = weights.split_at(4 * n);
        let scales = column(scales, 4);
        for (i, row) in floats.chunks_exact_mut(stride).enumerate() {
            row_bytes[..4].copy_from_slice(&scales[4 * i..4 * i + 4]);
            row_bytes[4..].copy_from_slice(&bytes[dim * i..dim * (i + 1)]);
            wb.decode(&row_bytes, &mut row[..dim]);
        }
    } else {
        let weights = column(weights, 2);
        for (i, row) in floats.chunks_exact_mut(stride).enumerate() {
            wb.decode(&weights[2 * dim * i..2 * dim * (i + 1)], &mut row[..dim]);
        }
    }
    let s = stride - dim;
    for (i, row) in floats.chunks_exact_mut(stride).enumerate() {
        bytemuck::cast_slice_mut::<f32, u8>(&mut row[dim..])
            .copy_from_slice(&state[4 * s * i..4 * s * (i + 1)]);
    }
    floats
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

fn encode_rows(chunk: &RawChunk, layout: &RowLayout, opts: &WriteOptions) -> Result<Vec<u8>> {
    let n = chunk.keys.len() as u64;
    let mut raw = Vec::with_capacity(layout.raw_bytes(n) as usize);
    raw.extend_from_slice(bytemuck::cast_slice(&chunk.keys));
    raw.extend_from_slice(bytemuck::cast_slice(&chunk.metas));
    let shuffled = opts.shuffle && opts.compression != Compression::None;
    let codec = if shuffled { CODEC_SHUFFLE } else { 0 };
    float_columns(&chunk.floats, layout, shuffled, &mut raw);
    debug_assert_eq!(raw.len() as u64, layout.raw_bytes(n));
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

/// Writes one table-part file: `removed` keys first, then every row `scan` yields (decoded
/// rows of `layout.stride` floats; stored at `layout`'s precision), then the admission
/// sketches `sketches` yields.
///
/// `scan` is called once on this thread with a sink for `(key, full row, meta)`; records are
/// encoded on `opts.threads` threads and written in order by one writer thread.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_part(
    storage: &dyn Storage,
    file: &str,
    table: &str,
    part: &str,
    layout: RowLayout,
    removed: &[u64],
    scan: impl FnOnce(&mut dyn FnMut(u64, &[f32], RowMeta)),
    sketches: SketchScan<'_>,
    opts: &WriteOptions,
) -> Result<PartStats> {
    let stride = layout.stride;
    if layout.dim > stride || (layout.precision != RowPrecision::F32 && layout.dim == 0) {
        return Err(CheckpointError::Usage(format!(
            "table `{table}`: dim {} of {:?} rows of stride {stride}",
            layout.dim, layout.precision
        )));
    }
    let mut fw = FileWriter::new(storage.create(file)?, file, FileKind::TableRows)?;
    let mut prelude = Vec::new();
    for name in [table, part] {
        prelude.extend_from_slice(&(name.len() as u32).to_le_bytes());
        prelude.extend_from_slice(name.as_bytes());
    }
    for word in [stride as u32, layout.precision.code(), layout.dim as u32] {
        prelude.extend_from_slice(&word.to_le_bytes());
    }
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
                if tx.send((seq, encode_rows(&chunk, &layout, opts))).is_err() {
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
        raw_bytes: layout.raw_bytes(rows),
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

fn decode_rows(file: &str, layout: &RowLayout, rec: RecordHead) -> Result<Rows> {
    let n = rec.n;
    let shuffled = rec.codec & CODEC_SHUFFLE != 0;
    let want = layout.raw_bytes(n as u64);
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
    let floats = floats_of_columns(&raw[20 * n..], n, layout, shuffled);
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

/// The prelude's row layout: stride, precision and dim (format version 3), or the stride and
/// the reserved word 0 of earlier versions (every float f32).
fn read_layout(fr: &mut FileReader<'_>) -> Result<RowLayout> {
    let stride = fr.u32()? as usize;
    let code = fr.u32()?;
    let bad = |why: String| CheckpointError::corrupt(fr.name(), why);
    if fr.version() < 3 {
        if code != 0 {
            return Err(bad(format!("reserved word {code}, expected 0")));
        }
        return Ok(RowLayout::f32(stride));
    }
    let dim = fr.u32()? as usize;
    let precision = RowPrecision::from_code(code)
        .ok_or_else(|| CheckpointError::corrupt(fr.name(), format!("unknown precision {code}")))?;
    if dim > stride || (precision != RowPrecision::F32 && dim == 0) {
        return Err(CheckpointError::corrupt(
            fr.name(),
            format!("dim {dim} of {precision:?} rows of stride {stride}"),
        ));
    }
    Ok(RowLayout {
        precision,
        dim,
        stride,
    })
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
    let layout = read_layout(&mut fr)?;
    let stride = layout.stride;
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
                if let Err(e) = decode_rows(file, &layout, rec).and_then(on_rows) {
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
                    stats.raw_bytes += layout.raw_bytes(rec.n as u64);
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
    use crate::storage::LocalDir;

    type Row = (u64, Vec<u32>, RowMeta);

    /// `n` rows of a table storing `dim` weights at `precision` and `state` f32 state floats:
    /// the weights as the table decodes them (stored values), the state any floats.
    fn table_rows(precision: RowPrecision, dim: usize, state: usize, n: usize) -> Vec<Row> {
        let mut wb = WeightBytes::new(precision, dim);
        (0..n)
            .map(|i| {
                let w: Vec<f32> = (0..dim)
                    .map(|j| ((i * 31 + j * 7) % 97) as f32 * 0.013 - 0.6)
                    .collect();
                let mut bytes = Vec::new();
                wb.encode(&w, &mut bytes, i as u64);
                let mut row = vec![0f32; dim + state];
                wb.decode(&bytes, &mut row[..dim]);
                for (j, x) in row[dim..].iter_mut().enumerate() {
                    *x = (i * 3 + j) as f32 * 0.37 + 1e-3;
                }
                let meta = RowMeta {
                    last_step: i as u32,
                    version: 2 * i as u32,
                    count: 3,
                };
                (
                    i as u64 * 0x9e37_79b9,
                    row.iter().map(|x| x.to_bits()).collect(),
                    meta,
                )
            })
            .collect()
    }

    fn write(
        storage: &LocalDir,
        layout: RowLayout,
        rows: &[Row],
        opts: &WriteOptions,
    ) -> PartStats {
        write_part(
            storage,
            "p.rows",
            "t",
            "all",
            layout,
            &[5, 6],
            |sink| {
                for (k, bits, m) in rows {
                    let row: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
                    sink(*k, &row, *m);
                }
            },
            &|_| {},
            opts,
        )
        .unwrap()
    }

    fn read(storage: &LocalDir, stride: usize) -> Result<(PartStats, Vec<Row>)> {
        let got = Mutex::new(Vec::new());
        let stats = read_part(
            storage,
            "p.rows",
            ("t", "all", stride),
            2,
            PartSinks {
                removed: |keys: &[u64]| {
                    assert_eq!(keys, &[5, 6]);
                    Ok(())
                },
                rows: |r: Rows| {
                    let mut g = got.lock();
                    for (i, (&k, &m)) in r.keys.iter().zip(&r.metas).enumerate() {
                        let row = &r.floats[i * stride..(i + 1) * stride];
                        g.push((k, row.iter().map(|x| x.to_bits()).collect(), m));
                    }
                    Ok(())
                },
                sketch: |_: usize, _: &[u16], _: u64| Ok(()),
            },
        )?;
        let mut rows = got.into_inner();
        rows.sort_by_key(|r| r.0);
        Ok((stats, rows))
    }

    const PRECISIONS: [RowPrecision; 4] = [
        RowPrecision::F32,
        RowPrecision::F16,
        RowPrecision::Bf16,
        RowPrecision::Int8,
    ];

    #[test]
    fn compact_parts_keep_the_stored_weights_and_read_back_bit_for_bit() {
        let (dim, state, n) = (5, 6, 300);
        let mut raw = Vec::new();
        for precision in PRECISIONS {
            for opts in [
                WriteOptions::default(),
                WriteOptions {
                    chunk_rows: 7,
                    compression: Compression::None,
                    shuffle: false,
                    threads: 2,
                },
            ] {
                let dir = tempfile::tempdir().unwrap();
                let storage = LocalDir::new(dir.path()).unwrap().with_sync(false);
                let rows = table_rows(precision, dim, state, n);
                let layout = RowLayout {
                    precision,
                    dim,
                    stride: dim + state,
                };
                let wrote = write(&storage, layout, &rows, &opts);
                let (stats, back) = read(&storage, dim + state).unwrap();
                assert_eq!(back, rows, "{precision:?}");
                assert_eq!(stats.rows, n as u64);
                let per_row = 20 + precision.weight_bytes(dim) + 4 * state;
                assert_eq!(wrote.raw_bytes, (n * per_row) as u64, "{precision:?}");
                assert_eq!(stats.raw_bytes, wrote.raw_bytes);
                if opts.compression == Compression::None {
                    raw.push((precision, wrote.bytes));
                }
            }
        }
        // Uncompressed: f32 4 bytes a weight, f16/bf16 2, int8 1 + the scale.
        let f32_bytes = raw[0].1;
        assert_eq!(f32_bytes - raw[1].1, (n * 2 * dim) as u64);
        assert_eq!(raw[1].1, raw[2].1);
        assert_eq!(f32_bytes - raw[3].1, (n * (3 * dim - 4)) as u64);
    }

    /// A part as format version 2 wrote it (this build's f32 records after the prelude
    /// `stride | 0`, the header's version 2): its rows read back as they were, a compact
    /// table's decoded values included.
    #[test]
    fn a_version_2_part_still_reads() {
        for precision in PRECISIONS {
            let (dim, state) = (3, 4);
            let stride = dim + state;
            let rows = table_rows(precision, dim, state, 50);
            let dir = tempfile::tempdir().unwrap();
            let storage = LocalDir::new(dir.path()).unwrap().with_sync(false);
            let opts = WriteOptions::default();
            let mut fw = FileWriter::with_version(
                storage.create("p.rows").unwrap(),
                "p.rows",
                FileKind::TableRows,
                2,
            )
            .unwrap();
            let mut prelude = Vec::new();
            for name in ["t", "all"] {
                prelude.extend_from_slice(&(name.len() as u32).to_le_bytes());
                prelude.extend_from_slice(name.as_bytes());
            }
            prelude.extend_from_slice(&(stride as u32).to_le_bytes());
            prelude.extend_from_slice(&0u32.to_le_bytes());
            fw.write(&prelude).unwrap();
            fw.write(&encode_removed(&[5, 6], opts.compression).unwrap())
                .unwrap();
            let mut chunk = RawChunk::default();
            for (k, bits, m) in &rows {
                chunk.keys.push(*k);
                chunk
                    .metas
                    .extend_from_slice(&[m.last_step, m.version, m.count]);
                chunk.floats.extend(bits.iter().map(|&b| f32::from_bits(b)));
            }
            fw.write(&encode_rows(&chunk, &RowLayout::f32(stride), &opts).unwrap())
                .unwrap();
            fw.write(&record(TAG_END, 0, 0, 0, &[])).unwrap();
            fw.finish().unwrap();
            let (stats, back) = read(&storage, stride).unwrap();
            assert_eq!(back, rows, "{precision:?}");
            assert_eq!(stats.raw_bytes, 50 * (20 + 4 * stride as u64));
        }
    }

    /// A prelude naming an unknown precision, or a dim beyond the stride, is a corrupt file.
    #[test]
    fn a_bad_precision_or_dim_is_reported() {
        for (code, dim) in [(4u32, 2u32), (2, 9), (3, 0)] {
            let dir = tempfile::tempdir().unwrap();
            let storage = LocalDir::new(dir.path()).unwrap().with_sync(false);
            let mut fw = FileWriter::new(
                storage.create("p.rows").unwrap(),
                "p.rows",
                FileKind::TableRows,
            )
            .unwrap();
            let mut prelude = Vec::new();
            for name in ["t", "all"] {
                prelude.extend_from_slice(&(name.len() as u32).to_le_bytes());
                prelude.extend_from_slice(name.as_bytes());
            }
            for w in [4u32, code, dim] {
                prelude.extend_from_slice(&w.to_le_bytes());
            }
            fw.write(&prelude).unwrap();
            fw.write(&record(TAG_END, 0, 0, 0, &[])).unwrap();
            fw.finish().unwrap();
            let e = read(&storage, 4).unwrap_err();
            assert!(matches!(e, CheckpointError::Corrupt { .. }), "{e}");
        }
    }

    #[test]
    fn shuffle_round_trips_and_groups_byte_planes() {
        let floats: Vec<f32> = (0..37).map(|i| i as f32 * 0.37 - 3.0).collect();
        let bytes: &[u8] = bytemuck::cast_slice(&floats);
        let mut shuffled = Vec::new();
        shuffle::<4>(bytes, &mut shuffled);
        assert_eq!(shuffled.len(), bytes.len());
        assert_eq!(
            shuffled[37 * 3],
            bytes[3],
            "plane 3 starts with the first float's top byte"
        );
        let mut back = vec![0u8; bytes.len()];
        unshuffle::<4>(&shuffled, &mut back);
        assert_eq!(back, bytes);
    }
}
