//! Parser-thread side: a row range of a Parquet file -> the same rows the text parser makes.
//!
//! Each projected column is read with Parquet's column reader (its pages, dictionary-encoded
//! or not, through [`Chunks`]), by records with their definition and repetition levels.
//! Every value is written as the text its line would hold (see [`crate::parquet`]) and the
//! row is made by [`LineParser::parse_values`]: the value rules (label, dense transforms and
//! limits, ids, bags, sequences, weights, missing values, bad rows) are the text parser's,
//! not a copy of them.

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use parquet::column::page::PageReader;
use parquet::column::reader::ColumnReaderImpl;
use parquet::data_type::{
    BoolType, ByteArrayType, DataType as Physical, DoubleType, FixedLenByteArrayType, FloatType,
    Int32Type, Int64Type,
};
use parquet::errors::{ParquetError, Result as ParquetResult};
use parquet::file::properties::ReaderProperties;
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::schema::types::ColumnDescPtr;

use super::columns::{Int32As, Shape, ValueText};
use super::file::{ParquetFile, Projected};
use super::source::Chunks;
use super::text::{row_text, write_bool, write_float, write_int};
use crate::batch::BatchBuilder;
use crate::error::DataError;
use crate::parse::LineParser;
use crate::stats::ReadStats;

/// Rows decoded at a time (per column) before they are made into rows.
const DECODE_ROWS: usize = 8192;

/// Rows `skip..skip + take` of row group `group` of a Parquet file: a parser's work item.
pub(crate) struct RowRange {
    pub file: Arc<ParquetFile>,
    pub group: usize,
    pub skip: usize,
    pub take: usize,
    /// Row number in the file of the first row of the range.
    pub first_row: u64,
}

/// What decoding a [`RowRange`] gave (besides the rows).
pub(crate) struct Decoded {
    /// Rows decoded (good and bad).
    pub seen: u64,
    pub bad: u64,
    /// Bytes read from the source.
    pub bytes: u64,
    /// The range could not be decoded past the rows given.
    pub fault: Option<DataError>,
}

impl RowRange {
    /// Decodes the range's rows into `out`, pushing for each good row the number of file rows
    /// up to and including it to `ends` (its position). Bad rows are counted and reported
    /// with the file and their 1-based row number.
    pub fn decode(
        &self,
        parser: &LineParser,
        stats: &ReadStats,
        out: &mut BatchBuilder,
        ends: &mut Vec<u64>,
    ) -> Decoded {
        let f = &*self.file;
        let chunks = Chunks::new(Arc::clone(&f.source), f.len);
        let (mut seen, mut bad) = (0, 0);
        let mut row = self.first_row;
        let done = self.rows(&chunks, |text, spans| {
            row += 1;
            seen += 1;
            let value_of = |c: usize| f.column_of[c].map(|k| &text[spans[k].0..spans[k].1]);
            match parser.parse_values(value_of, out) {
                Ok(()) => ends.push(row),
                Err(reason) => {
                    bad += 1;
                    let line = row_text(text, spans, parser.separator());
                    stats.report_bad(&f.path, || row, &reason, &line);
                }
            }
        });
        Decoded {
            seen,
            bad,
            bytes: chunks.bytes_read(),
            fault: done.err(),
        }
    }

    /// Calls `each(text, spans)` for the range's rows in order: `text` holds the projected
    /// values of the row as text, `spans[k]` the bytes of projected column `k`. `Err` when a
    /// page does not decode (naming the file, the row group and the column), after the rows
    /// before it.
    pub(crate) fn rows(
        &self,
        chunks: &Chunks,
        mut each: impl FnMut(&[u8], &[(usize, usize)]),
    ) -> Result<(), DataError> {
        let f = &*self.file;
        let fault = |p: &Projected, e: String| DataError::Parquet {
            path: f.path.clone(),
            detail: format!("row group {}: column {:?}: {e}", self.group, p.name),
        };
        let short = |p: &Projected, rows: usize| {
            let all = f.meta.row_group(self.group).num_rows();
            fault(p, format!("it ends after {rows} of the group's {all} rows"))
        };
        let chunks = Arc::new(chunks.clone());
        let props = Arc::new(ReaderProperties::builder().build());
        let mut columns = Vec::with_capacity(f.columns.len());
        for p in &f.columns {
            let open = || open_column(f, self.group, p, Arc::clone(&chunks), Arc::clone(&props));
            let mut c = guarded(open).map_err(|e| fault(p, e.to_string()))?;
            let skipped = guarded(|| c.skip(self.skip)).map_err(|e| fault(p, e.to_string()))?;
            if skipped < self.skip {
                return Err(short(p, skipped));
            }
            columns.push(c);
        }
        let mut text = Vec::new();
        let mut spans = vec![(0usize, 0usize); columns.len()];
        let mut left = self.take;
        while left > 0 {
            let n = left.min(DECODE_ROWS);
            for (c, p) in columns.iter_mut().zip(&f.columns) {
                let got = guarded(|| c.read(n)).map_err(|e| fault(p, e.to_string()))?;
                if got < n {
                    return Err(short(p, self.skip + (self.take - left) + got));
                }
            }
            for _ in 0..n {
                text.clear();
                for (span, c) in spans.iter_mut().zip(&mut columns) {
                    let start = text.len();
                    c.write_next(&mut text);
                    *span = (start, text.len());
                }
                each(&text, &spans);
            }
            left -= n;
        }
        Ok(())
    }
}

/// Runs `read`, a call into Parquet's decoders, with a panic of theirs made an error like
/// the ones they return: a corrupt page can make them index past the end of a dictionary.
fn guarded<T>(read: impl FnOnce() -> ParquetResult<T>) -> ParquetResult<T> {
    // Unwind safe: after an error the range ends and its column readers are dropped unused.
    panic::catch_unwind(AssertUnwindSafe(read)).unwrap_or_else(|payload| {
        let why = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(ParquetError::General(format!(
            "a page does not decode ({why})"
        )))
    })
}

/// A projected column of a row range, read a few rows at a time.
trait ColumnText {
    /// Skips `rows` rows; the rows skipped (fewer at the end of the group).
    fn skip(&mut self, rows: usize) -> ParquetResult<usize>;
    /// Reads the next `rows` rows (dropping those read before); the rows read.
    fn read(&mut self, rows: usize) -> ParquetResult<usize>;
    /// Appends the text of the next row read (nothing for a missing value).
    fn write_next(&mut self, out: &mut Vec<u8>);
}

/// A column of physical type `T`: its reader, the levels and values of the rows read, and
/// how a value becomes text.
struct Column<T: Physical> {
    reader: ColumnReaderImpl<T>,
    shape: Shape,
    /// The separator list items are joined with.
    sep: u8,
    text: fn(&T::T, &mut Vec<u8>),
    defs: Vec<i16>,
    reps: Vec<i16>,
    /// The non-null values of the rows read.
    values: Vec<T::T>,
    /// The next level and value to write.
    level: usize,
    value: usize,
}

impl<T: Physical> Column<T> {
    fn boxed(
        descr: ColumnDescPtr,
        pages: Box<dyn PageReader>,
        p: &Projected,
        text: fn(&T::T, &mut Vec<u8>),
    ) -> Box<dyn ColumnText> {
        Box::new(Column::<T> {
            reader: ColumnReaderImpl::<T>::new(descr, pages),
            shape: p.leaf.shape,
            sep: p.sep,
            text,
            defs: Vec::new(),
            reps: Vec::new(),
            values: Vec::new(),
            level: 0,
            value: 0,
        })
    }

    fn write_value(&mut self, out: &mut Vec<u8>) {
        if let Some(v) = self.values.get(self.value) {
            (self.text)(v, out);
            self.value += 1;
        }
    }
}

impl<T: Physical> ColumnText for Column<T> {
    fn skip(&mut self, rows: usize) -> ParquetResult<usize> {
        self.reader.skip_records(rows)
    }

    fn read(&mut self, rows: usize) -> ParquetResult<usize> {
        self.defs.clear();
        self.reps.clear();
        self.values.clear();
        (self.level, self.value) = (0, 0);
        let (read, _, _) = self.reader.read_records(
            rows,
            Some(&mut self.defs),
            Some(&mut self.reps),
            &mut self.values,
        )?;
        Ok(read)
    }

    fn write_next(&mut self, out: &mut Vec<u8>) {
        match self.shape {
            Shape::Value { max_def: 0 } => self.write_value(out),
            Shape::Value { max_def } => {
                let def = self.defs.get(self.level).copied();
                self.level += 1;
                if def == Some(max_def) {
                    self.write_value(out);
                }
            }
            Shape::List { item_at, max_def } => {
                let Some(&first) = self.defs.get(self.level) else {
                    return;
                };
                self.level += 1;
                if first < item_at {
                    // A null or empty list: missing.
                    return;
                }
                let mut def = first;
                loop {
                    // Below `max_def`: a null item, empty.
                    if def == max_def {
                        self.write_value(out);
                    }
                    // The levels that continue the row's list (repetition level 1).
                    match (self.reps.get(self.level), self.defs.get(self.level)) {
                        (Some(&rep), Some(&next)) if rep > 0 => {
                            out.push(self.sep);
                            def = next;
                            self.level += 1;
                        }
                        _ => break,
                    }
                }
            }
        }
    }
}

/// The reader of projected column `p` in row group `group`: its pages (by the offset index
/// when the file has one, so whole pages before the range are skipped unread) and how its
/// values become text.
fn open_column(
    f: &ParquetFile,
    group: usize,
    p: &Projected,
    chunks: Arc<Chunks>,
    props: Arc<ReaderProperties>,
) -> ParquetResult<Box<dyn ColumnText>> {
    let leaf = p.leaf.index;
    let rg = f.meta.row_group(group);
    let meta = rg.columns().get(leaf).ok_or_else(|| {
        ParquetError::General(format!("the row group has no column chunk {leaf}"))
    })?;
    let locations = f
        .meta
        .offset_index()
        .and_then(|groups| groups.get(group)?.get(leaf))
        .map(|index| index.page_locations().clone());
    let rows = usize::try_from(rg.num_rows().max(0)).unwrap_or(usize::MAX);
    let pages: Box<dyn PageReader> = Box::new(SerializedPageReader::new_with_properties(
        chunks, meta, rows, locations, props,
    )?);
    let descr = f.meta.file_metadata().schema_descr().column(leaf);
    Ok(match p.leaf.text {
        ValueText::Bool => Column::<BoolType>::boxed(descr, pages, p, |v, o| write_bool(*v, o)),
        ValueText::Int32(as_) => {
            let text: fn(&i32, &mut Vec<u8>) = match as_ {
                Int32As::I8 => |v, o| write_int(*v as i8, o),
                Int32As::I16 => |v, o| write_int(*v as i16, o),
                Int32As::I32 => |v, o| write_int(*v, o),
                Int32As::U8 => |v, o| write_int(*v as u8, o),
                Int32As::U16 => |v, o| write_int(*v as u16, o),
                Int32As::U32 => |v, o| write_int(*v as u32, o),
            };
            Column::<Int32Type>::boxed(descr, pages, p, text)
        }
        ValueText::Int64 { unsigned: false } => {
            Column::<Int64Type>::boxed(descr, pages, p, |v, o| write_int(*v, o))
        }
        ValueText::Int64 { unsigned: true } => {
            Column::<Int64Type>::boxed(descr, pages, p, |v, o| write_int(*v as u64, o))
        }
        ValueText::Float => Column::<FloatType>::boxed(descr, pages, p, |v, o| write_float(*v, o)),
        ValueText::Double => {
            Column::<DoubleType>::boxed(descr, pages, p, |v, o| write_float(*v, o))
        }
        ValueText::Bytes => {
            Column::<ByteArrayType>::boxed(descr, pages, p, |v, o| o.extend_from_slice(v.data()))
        }
        ValueText::Fixed => Column::<FixedLenByteArrayType>::boxed(descr, pages, p, |v, o| {
            o.extend_from_slice(v.data())
        }),
    })
}

#[cfg(test)]
mod tests;
