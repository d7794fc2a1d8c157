//! Parser-thread side: a row range of a Parquet file -> the same rows the text parser makes.
//!
//! Each projected column is read with Parquet's column reader (its pages, dictionary-encoded
//! or not, through [`Chunks`]), by records with their definition and repetition levels.
//! Every value goes to [`LineParser::parse_cells`] as a [`Cell`] that stands for the text its
//! line would hold (see [`crate::parquet`]): numbers as numbers (`FLOAT` as its text), strings
//! as their bytes, a dictionary entry's with its hash computed once per entry
//! ([`DictHashes`]), a list as its items' text joined. A string or double column of one
//! value per row has its dictionary-encoded pages decoded here ([`dict`]: each row's
//! dictionary entry, a string's hashed once), any other page by the crate. The value rules (label, dense
//! transforms and limits, ids, bags, sequences, weights, missing values, bad rows) are the
//! text parser's, not a copy of them. A step of [`DECODE_ROWS`] rows is read column by column,
//! each column's cells made in one pass, then the rows.

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use parquet::column::page::PageReader;
use parquet::column::reader::ColumnReaderImpl;
use parquet::data_type::{
    BoolType, ByteArray, ByteArrayType, DataType as Physical, DoubleType, FixedLenByteArrayType,
    FloatType, Int32Type, Int64Type,
};
use parquet::errors::{ParquetError, Result as ParquetResult};
use parquet::file::properties::ReaderProperties;
use parquet::file::serialized_reader::SerializedPageReader;
use parquet::schema::types::ColumnDescPtr;

use super::columns::{Int32As, Shape, ValueText};
use super::dict_hash::{DictHashes, DictPages};
use super::file::{ParquetFile, Projected};
use super::source::Chunks;
use super::text::write_float;
use crate::batch::BatchBuilder;
use crate::error::DataError;
use crate::parse::{Cell, LineParser};
use crate::stats::ReadStats;
use dict::{ByteEntries, DictColumn, DoubleEntries};

/// Rows decoded at a time (per column) before they are made into rows: each column's cells of
/// a step are made in one pass (24 bytes each: a step of 40 columns, 480 KiB, stays in a
/// core's L2 cache while its rows are made; 2048 took 3-10 % more CPU, see BENCHMARKS.md).
const DECODE_ROWS: usize = 512;

/// Good rows after which [`RowRange::decode`] may hand on what it has: a range (up to
/// [`super::file::RANGE_ROWS`]) is not held whole in memory, whose first touch (fresh pages
/// zeroed by the kernel) cost more than decoding it.
pub(crate) const PIECE_ROWS: usize = 16 << 10;

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
    /// with the file and their 1-based row number. Every [`PIECE_ROWS`] good rows,
    /// `piece(out, ends, seen, bad)` may hand on the rows so far (rows seen and bad since the
    /// last piece), so a range is not held whole; `false` stops the range there. The
    /// [`Decoded`] counts are of the rows after the last piece.
    pub fn decode(
        &self,
        parser: &LineParser,
        stats: &ReadStats,
        out: &mut BatchBuilder,
        ends: &mut Vec<u64>,
        mut piece: impl FnMut(&mut BatchBuilder, &mut Vec<u64>, u64, u64) -> bool,
    ) -> Decoded {
        let f = &*self.file;
        let chunks = Chunks::new(Arc::clone(&f.source), f.len);
        let (mut seen, mut bad) = (0, 0);
        let mut row = self.first_row;
        let mut mark = out.rows();
        let done = self.rows_by(&chunks, Pages::Own, |cells| {
            row += 1;
            seen += 1;
            let cell_of = |c: usize| f.column_of[c].map(|k| cells.cell(k));
            match parser.parse_cells(cell_of, out) {
                Ok(()) => ends.push(row),
                Err(reason) => {
                    bad += 1;
                    let line = cells.line(parser.separator());
                    stats.report_bad(&f.path, || row, &reason, &line);
                }
            }
            if out.rows() < mark + PIECE_ROWS {
                return true;
            }
            let go = piece(out, ends, seen, bad);
            (seen, bad, mark) = (0, 0, out.rows());
            go
        });
        Decoded {
            seen,
            bad,
            bytes: chunks.bytes_read(),
            fault: done.err(),
        }
    }

    /// Calls `each(cells)` for the range's rows in order: `cells` holds the values of the
    /// row's projected columns. `Err` when a page does not decode (naming the file, the row
    /// group and the column), after the rows before it.
    #[cfg(test)]
    pub(crate) fn rows(
        &self,
        chunks: &Chunks,
        mut each: impl FnMut(&RowCells<'_>),
    ) -> Result<(), DataError> {
        self.rows_by(chunks, Pages::Own, |cells| {
            each(cells);
            true
        })
    }

    /// [`RowRange::rows`] with flat byte-array and double columns decoded by `by`; `each` returning
    /// `false` ends the range there.
    fn rows_by(
        &self,
        chunks: &Chunks,
        by: Pages,
        mut each: impl FnMut(&RowCells<'_>) -> bool,
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
            let open = || {
                open_column(
                    f,
                    self.group,
                    p,
                    Arc::clone(&chunks),
                    Arc::clone(&props),
                    by,
                )
            };
            let mut c = guarded(open).map_err(|e| fault(p, e.to_string()))?;
            let skipped = guarded(|| c.skip(self.skip)).map_err(|e| fault(p, e.to_string()))?;
            if skipped < self.skip {
                return Err(short(p, skipped));
            }
            columns.push(c);
        }
        let mut left = self.take;
        while left > 0 {
            let n = left.min(DECODE_ROWS);
            for (c, p) in columns.iter_mut().zip(&f.columns) {
                let got = guarded(|| c.read(n)).map_err(|e| fault(p, e.to_string()))?;
                if got < n {
                    return Err(short(p, self.skip + (self.take - left) + got));
                }
            }
            let cells: Vec<Vec<Cell<'_>>> = columns.iter().map(|c| c.cells()).collect();
            for row in 0..n {
                if !each(&RowCells { cells: &cells, row }) {
                    return Ok(());
                }
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

/// The values of a row's projected columns (see [`RowRange::rows`]).
pub(crate) struct RowCells<'r> {
    /// Each projected column's values of the rows read.
    cells: &'r [Vec<Cell<'r>>],
    row: usize,
}

impl<'r> RowCells<'r> {
    /// The value of projected column `k`.
    #[inline]
    pub fn cell(&self, k: usize) -> Cell<'r> {
        self.cells[k][self.row]
    }

    /// The number of projected columns.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// The values' text joined by the line separator `sep` (for a bad-row report).
    pub fn line(&self, sep: u8) -> Vec<u8> {
        let mut line = Vec::new();
        for k in 0..self.cells.len() {
            if k > 0 {
                line.push(sep);
            }
            self.cell(k).write_text(&mut line);
        }
        line
    }
}

/// Where a row's value of a column is.
#[derive(Clone, Copy, Debug)]
enum At {
    Missing,
    /// These bytes of the column's text of the rows read.
    Text(usize, usize),
    /// This value of the rows read.
    Value(usize),
}

/// A projected column of a row range, read a few rows at a time.
trait ColumnCells {
    /// Skips `rows` rows; the rows skipped (fewer at the end of the group).
    fn skip(&mut self, rows: usize) -> ParquetResult<usize>;
    /// Reads the next `rows` rows (dropping those read before); the rows read.
    fn read(&mut self, rows: usize) -> ParquetResult<usize>;
    /// The value of each row read.
    fn cells(&self) -> Vec<Cell<'_>>;
}

/// How a value of physical type `T` is handed on.
enum Value<T: Physical> {
    /// As this cell.
    Cell(for<'a> fn(&'a T::T) -> Cell<'a>),
    /// Written as text (a `FLOAT`: its text does not parse back to the f64 it is).
    Text(fn(&T::T, &mut Vec<u8>)),
}

/// A column of physical type `T`: its reader, the levels and values of the rows read, and
/// how a value is handed on.
struct Column<T: Physical> {
    reader: ColumnReaderImpl<T>,
    shape: Shape,
    /// The separator list items are joined with.
    sep: u8,
    value: Value<T>,
    /// A byte-array column of one value per row: its dictionary entries' hashes, and the
    /// hash of each value read (0: not an entry).
    dict: Option<DictHashes>,
    hashes: Vec<u64>,
    /// Where each row read has its value, and the text written for them (lists, `FLOAT`s).
    places: Vec<At>,
    text: Vec<u8>,
    defs: Vec<i16>,
    reps: Vec<i16>,
    /// The non-null values of the rows read.
    values: Vec<T::T>,
    /// The next level and value to hand on.
    next_level: usize,
    next_value: usize,
}

impl<T: Physical> Column<T> {
    fn new(reader: ColumnReaderImpl<T>, shape: Shape, sep: u8, value: Value<T>) -> Column<T> {
        Column {
            reader,
            shape,
            sep,
            value,
            dict: None,
            hashes: Vec::new(),
            places: Vec::new(),
            text: Vec::new(),
            defs: Vec::new(),
            reps: Vec::new(),
            values: Vec::new(),
            next_level: 0,
            next_value: 0,
        }
    }

    fn boxed(
        descr: ColumnDescPtr,
        pages: Box<dyn PageReader>,
        p: &Projected,
        value: Value<T>,
    ) -> Box<dyn ColumnCells>
    where
        Column<T>: ColumnCells,
    {
        let reader = ColumnReaderImpl::<T>::new(descr, pages);
        Box::new(Column::new(reader, p.leaf.shape, p.sep, value))
    }

    /// The next value of the rows read, `Missing` past them.
    fn take_value(&mut self) -> At {
        let i = self.next_value;
        let Some(v) = self.values.get(i) else {
            return At::Missing;
        };
        self.next_value += 1;
        match self.value {
            Value::Cell(_) => At::Value(i),
            Value::Text(write) => {
                let start = self.text.len();
                write(v, &mut self.text);
                At::Text(start, self.text.len())
            }
        }
    }

    /// Appends the text of the next value of the rows read.
    fn write_value(&mut self) {
        if let Some(v) = self.values.get(self.next_value) {
            match self.value {
                Value::Cell(cell) => cell(v).write_text(&mut self.text),
                Value::Text(write) => write(v, &mut self.text),
            }
            self.next_value += 1;
        }
    }

    /// Where the next row read has its value (a list's items are written to the text).
    fn place_next(&mut self) -> At {
        match self.shape {
            Shape::Value { max_def: 0 } => self.take_value(),
            Shape::Value { max_def } => {
                let def = self.defs.get(self.next_level).copied();
                self.next_level += 1;
                if def == Some(max_def) {
                    self.take_value()
                } else {
                    At::Missing
                }
            }
            Shape::List { item_at, max_def } => {
                let Some(&first) = self.defs.get(self.next_level) else {
                    return At::Missing;
                };
                self.next_level += 1;
                if first < item_at {
                    // A null or empty list: missing.
                    return At::Missing;
                }
                let start = self.text.len();
                let mut def = first;
                loop {
                    // Below `max_def`: a null item, empty.
                    if def == max_def {
                        self.write_value();
                    }
                    // The levels that continue the row's list (repetition level 1).
                    match (
                        self.reps.get(self.next_level),
                        self.defs.get(self.next_level),
                    ) {
                        (Some(&rep), Some(&next)) if rep > 0 => {
                            self.text.push(self.sep);
                            def = next;
                            self.next_level += 1;
                        }
                        _ => break,
                    }
                }
                At::Text(start, self.text.len())
            }
        }
    }
}

impl<T: Physical> ColumnCells for Column<T>
where
    T::T: AsBytes,
{
    fn skip(&mut self, rows: usize) -> ParquetResult<usize> {
        self.reader.skip_records(rows)
    }

    fn read(&mut self, rows: usize) -> ParquetResult<usize> {
        self.defs.clear();
        self.reps.clear();
        self.values.clear();
        self.text.clear();
        self.places.clear();
        (self.next_level, self.next_value) = (0, 0);
        let (read, _, _) = self.reader.read_records(
            rows,
            Some(&mut self.defs),
            Some(&mut self.reps),
            &mut self.values,
        )?;
        if let Some(dict) = &mut self.dict {
            dict.refresh();
            self.hashes.clear();
            self.hashes.extend(
                self.values
                    .iter()
                    .map(|v| v.as_bytes().and_then(|b| dict.hash(b)).unwrap_or(0)),
            );
        }
        for _ in 0..read {
            let at = self.place_next();
            self.places.push(at);
        }
        Ok(read)
    }

    fn cells(&self) -> Vec<Cell<'_>> {
        let value = |i: usize| -> Cell<'_> {
            let Value::Cell(cell) = self.value else {
                unreachable!("a value written as text is placed as text");
            };
            match (cell(&self.values[i]), self.hashes.get(i)) {
                (Cell::Text(t), Some(&h)) if h != 0 => Cell::Hashed(t, h),
                (c, _) => c,
            }
        };
        self.places
            .iter()
            .map(|&at| match at {
                At::Missing => Cell::MISSING,
                At::Text(a, b) => Cell::Text(&self.text[a..b]),
                At::Value(i) => value(i),
            })
            .collect()
    }
}

/// The bytes of a byte-array value (for [`DictHashes`]); `None` for other types.
trait AsBytes {
    fn as_bytes(&self) -> Option<&[u8]>;
}

impl AsBytes for ByteArray {
    #[inline]
    fn as_bytes(&self) -> Option<&[u8]> {
        Some(self.data())
    }
}

macro_rules! no_bytes {
    ($($t:ty),*) => {$(
        impl AsBytes for $t {
            #[inline]
            fn as_bytes(&self) -> Option<&[u8]> {
                None
            }
        }
    )*};
}

no_bytes!(
    bool,
    i32,
    i64,
    f32,
    f64,
    parquet::data_type::FixedLenByteArray
);

/// Who decodes the pages of a flat byte-array or double column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pages {
    /// [`DictColumn`] its dictionary-encoded pages, the crate's reader from any other page on.
    Own,
    /// The crate's reader all of them (what [`Pages::Own`] is tested against).
    #[cfg(test)]
    Crate,
}

/// The crate's reader of a double column of shape `shape` (list items joined by `sep`).
fn doubles_column(
    descr: ColumnDescPtr,
    pages: Box<dyn PageReader>,
    shape: Shape,
    sep: u8,
) -> Box<dyn ColumnCells> {
    let reader = ColumnReaderImpl::<DoubleType>::new(descr, pages);
    let value = Value::Cell(|v: &f64| Cell::Float(*v));
    Box::new(Column::new(reader, shape, sep, value))
}

/// The crate's reader of a byte-array column of shape `shape` (list items joined by `sep`):
/// a value of one per row hashed once per dictionary entry ([`DictHashes`]).
fn strings_column(
    descr: ColumnDescPtr,
    pages: Box<dyn PageReader>,
    shape: Shape,
    sep: u8,
) -> Box<dyn ColumnCells> {
    let value = Value::Cell(|v: &ByteArray| Cell::Text(v.data()));
    if matches!(shape, Shape::Value { .. }) {
        let (pages, hashes) = DictPages::new(pages);
        let reader = ColumnReaderImpl::<ByteArrayType>::new(descr, Box::new(pages));
        let mut column = Column::new(reader, shape, sep, value);
        column.dict = Some(hashes);
        Box::new(column)
    } else {
        let reader = ColumnReaderImpl::<ByteArrayType>::new(descr, pages);
        Box::new(Column::new(reader, shape, sep, value))
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
    by: Pages,
) -> ParquetResult<Box<dyn ColumnCells>> {
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
        ValueText::Bool => Column::<BoolType>::boxed(
            descr,
            pages,
            p,
            Value::Cell(|v| Cell::Text(if *v { b"1" } else { b"0" })),
        ),
        ValueText::Int32(as_) => {
            let cell: fn(&i32) -> Cell<'_> = match as_ {
                Int32As::I8 => |v| Cell::Int(*v as i8 as i64),
                Int32As::I16 => |v| Cell::Int(*v as i16 as i64),
                Int32As::I32 => |v| Cell::Int(*v as i64),
                Int32As::U8 => |v| Cell::Int(*v as u8 as i64),
                Int32As::U16 => |v| Cell::Int(*v as u16 as i64),
                Int32As::U32 => |v| Cell::Int(*v as u32 as i64),
            };
            Column::<Int32Type>::boxed(descr, pages, p, Value::Cell(cell))
        }
        ValueText::Int64 { unsigned: false } => {
            Column::<Int64Type>::boxed(descr, pages, p, Value::Cell(|v| Cell::Int(*v)))
        }
        ValueText::Int64 { unsigned: true } => {
            Column::<Int64Type>::boxed(descr, pages, p, Value::Cell(|v| Cell::UInt(*v as u64)))
        }
        ValueText::Float => {
            Column::<FloatType>::boxed(descr, pages, p, Value::Text(|v, o| write_float(*v, o)))
        }
        ValueText::Double => {
            match (p.leaf.shape, by) {
                (Shape::Value { max_def }, Pages::Own) => Box::new(
                    DictColumn::<DoubleEntries>::new(descr, pages, max_def, p.sep, doubles_column),
                ),
                (shape, _) => doubles_column(descr, pages, shape, p.sep),
            }
        }
        ValueText::Bytes => match (p.leaf.shape, by) {
            (Shape::Value { max_def }, Pages::Own) => Box::new(DictColumn::<ByteEntries>::new(
                descr,
                pages,
                max_def,
                p.sep,
                strings_column,
            )),
            (shape, _) => strings_column(descr, pages, shape, p.sep),
        },
        ValueText::Fixed => Column::<FixedLenByteArrayType>::boxed(
            descr,
            pages,
            p,
            Value::Cell(|v: &parquet::data_type::FixedLenByteArray| Cell::Text(v.data())),
        ),
    })
}

mod dict;
#[cfg(test)]
mod tests;
