//! Parser-thread side: a row range of a Parquet file -> the same rows the text parser makes.
//!
//! Every projected value is written as the text its line would hold (see [`crate::parquet`])
//! and the row is made by [`LineParser::parse_values`]: the value rules (label, dense
//! transforms and limits, ids, bags, sequences, weights, missing values, bad rows) are the text
//! parser's, not a copy of them.

use std::io::Write;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrowPrimitiveType, OffsetSizeTrait, PrimitiveArray};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReaderBuilder, RowSelection, RowSelector};

use super::file::ParquetFile;
use super::source::Chunks;
use crate::batch::BatchBuilder;
use crate::error::DataError;
use crate::parse::LineParser;
use crate::stats::ReadStats;

/// Rows per decoded Arrow batch.
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
        let mut selectors = Vec::with_capacity(2);
        if self.skip > 0 {
            selectors.push(RowSelector::skip(self.skip));
        }
        selectors.push(RowSelector::select(self.take));
        let mut done = Decoded {
            seen: 0,
            bad: 0,
            bytes: 0,
            fault: None,
        };
        let fault = |e: String| DataError::Parquet {
            path: f.path.clone(),
            detail: format!("row group {}: {e}", self.group),
        };
        let reader =
            ParquetRecordBatchReaderBuilder::new_with_metadata(chunks.clone(), f.meta.clone())
                .with_projection(f.mask.clone())
                .with_row_groups(vec![self.group])
                .with_row_selection(RowSelection::from(selectors))
                .with_batch_size(DECODE_ROWS.min(self.take.max(1)))
                .build();
        let reader = match reader {
            Ok(r) => r,
            Err(e) => {
                done.fault = Some(fault(e.to_string()));
                done.bytes = chunks.bytes_read();
                return done;
            }
        };
        let mut row = self.first_row;
        let mut text = Vec::new();
        let mut spans = vec![(0usize, 0usize); f.separators.len()];
        for batch in reader {
            let batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    done.fault = Some(fault(e.to_string()));
                    break;
                }
            };
            let columns: Result<Vec<Box<dyn TextValues + '_>>, UnreadType> = batch
                .columns()
                .iter()
                .zip(&f.separators)
                .map(|(a, &sep)| text_values(a.as_ref(), sep))
                .collect();
            let columns = match columns {
                Ok(c) => c,
                Err(e) => {
                    done.fault = Some(fault(e.to_string()));
                    break;
                }
            };
            for i in 0..batch.num_rows() {
                text.clear();
                for (span, col) in spans.iter_mut().zip(&columns) {
                    let start = text.len();
                    col.write(i, &mut text);
                    *span = (start, text.len());
                }
                row += 1;
                done.seen += 1;
                let value_of = |c: usize| f.column_of[c].map(|k| &text[spans[k].0..spans[k].1]);
                match parser.parse_values(value_of, out) {
                    Ok(()) => ends.push(row),
                    Err(reason) => {
                        done.bad += 1;
                        let line = row_text(&text, &spans, parser.separator());
                        stats.report_bad(&f.path, || row, &reason, &line);
                    }
                }
            }
        }
        done.bytes = chunks.bytes_read();
        done
    }
}

/// The projected values of a row joined by the line separator (for a bad-row report).
pub(crate) fn row_text(text: &[u8], spans: &[(usize, usize)], sep: u8) -> Vec<u8> {
    let mut line = Vec::with_capacity(text.len() + spans.len());
    for (k, &(a, b)) in spans.iter().enumerate() {
        if k > 0 {
            line.push(sep);
        }
        line.extend_from_slice(&text[a..b]);
    }
    line
}

/// The values of one Arrow column as the text a line would hold.
pub(crate) trait TextValues {
    /// Appends the text of value `i` (nothing for a null).
    fn write(&self, i: usize, out: &mut Vec<u8>);
}

/// Integers as decimal text.
struct Integers<'a, T: ArrowPrimitiveType>(&'a PrimitiveArray<T>);

impl<T: ArrowPrimitiveType> TextValues for Integers<'_, T>
where
    T::Native: std::fmt::Display,
{
    fn write(&self, i: usize, out: &mut Vec<u8>) {
        if self.0.is_valid(i) {
            // Writing to a Vec cannot fail.
            let _ = write!(out, "{}", self.0.value(i));
        }
    }
}

/// Floats as their shortest round-trip decimal text (the text of the integer for a whole
/// number below 2^53, which is the same text, written faster).
struct Floats<'a, T: ArrowPrimitiveType>(&'a PrimitiveArray<T>);

impl<T: ArrowPrimitiveType> TextValues for Floats<'_, T>
where
    T::Native: std::fmt::Display + Into<f64>,
{
    fn write(&self, i: usize, out: &mut Vec<u8>) {
        if self.0.is_valid(i) {
            let v = self.0.value(i);
            let x: f64 = v.into();
            if x.is_nan() {
                // NaN is how pandas writes a missing float: missing, as a null is.
                return;
            }
            // Writing to a Vec cannot fail.
            let _ = if x.fract() == 0.0 && x.abs() < (1u64 << 53) as f64 && x != 0.0 {
                write!(out, "{}", x as i64)
            } else {
                write!(out, "{v}")
            };
        }
    }
}

/// Booleans as `1` / `0`.
struct Bools<'a>(&'a arrow_array::BooleanArray);

impl TextValues for Bools<'_> {
    fn write(&self, i: usize, out: &mut Vec<u8>) {
        if self.0.is_valid(i) {
            out.push(if self.0.value(i) { b'1' } else { b'0' });
        }
    }
}

/// Strings and binary values as their bytes.
struct Bytes<'a, A>(&'a A, fn(&'a A, usize) -> &'a [u8]);

impl<A: Array> TextValues for Bytes<'_, A> {
    fn write(&self, i: usize, out: &mut Vec<u8>) {
        if self.0.is_valid(i) {
            out.extend_from_slice((self.1)(self.0, i));
        }
    }
}

/// A dictionary-encoded column (pandas `category`, Polars `Categorical`) as the text of the
/// value each key points to.
struct Dictionary<'a> {
    keys: &'a dyn Array,
    /// The keys as indexes into `values` (0 where a key is null).
    index: Vec<usize>,
    values: Box<dyn TextValues + 'a>,
}

impl TextValues for Dictionary<'_> {
    fn write(&self, i: usize, out: &mut Vec<u8>) {
        if self.keys.is_valid(i) {
            self.values.write(self.index[i], out);
        }
    }
}

/// A list as its items' text joined by the column's separator.
struct Lists<'a, O: OffsetSizeTrait> {
    list: &'a arrow_array::GenericListArray<O>,
    items: Box<dyn TextValues + 'a>,
    sep: u8,
}

impl<O: OffsetSizeTrait> TextValues for Lists<'_, O> {
    fn write(&self, i: usize, out: &mut Vec<u8>) {
        if !self.list.is_valid(i) {
            return;
        }
        let offsets = self.list.value_offsets();
        let (a, b) = (offsets[i].as_usize(), offsets[i + 1].as_usize());
        for k in a..b {
            if k > a {
                out.push(self.sep);
            }
            self.items.write(k, out);
        }
    }
}

/// A column of a type that is not read (see [`crate::parquet`] for the types read).
#[derive(Debug, thiserror::Error)]
#[error("a column of type {0} is not read")]
pub(crate) struct UnreadType(DataType);

/// The text writer of `array` (lists joined by `sep`).
pub(crate) fn text_values(
    array: &dyn Array,
    sep: u8,
) -> Result<Box<dyn TextValues + '_>, UnreadType> {
    Ok(match array.data_type() {
        DataType::List(_) => {
            let list = array.as_list::<i32>();
            Box::new(Lists {
                list,
                items: scalar_values(list.values().as_ref())?,
                sep,
            })
        }
        DataType::LargeList(_) => {
            let list = array.as_list::<i64>();
            Box::new(Lists {
                list,
                items: scalar_values(list.values().as_ref())?,
                sep,
            })
        }
        _ => scalar_values(array)?,
    })
}

fn scalar_values(a: &dyn Array) -> Result<Box<dyn TextValues + '_>, UnreadType> {
    Ok(match a.data_type() {
        DataType::Boolean => Box::new(Bools(a.as_boolean())),
        DataType::Int8 => Box::new(Integers(a.as_primitive::<Int8Type>())),
        DataType::Int16 => Box::new(Integers(a.as_primitive::<Int16Type>())),
        DataType::Int32 => Box::new(Integers(a.as_primitive::<Int32Type>())),
        DataType::Int64 => Box::new(Integers(a.as_primitive::<Int64Type>())),
        DataType::UInt8 => Box::new(Integers(a.as_primitive::<UInt8Type>())),
        DataType::UInt16 => Box::new(Integers(a.as_primitive::<UInt16Type>())),
        DataType::UInt32 => Box::new(Integers(a.as_primitive::<UInt32Type>())),
        DataType::UInt64 => Box::new(Integers(a.as_primitive::<UInt64Type>())),
        DataType::Float32 => Box::new(Floats(a.as_primitive::<Float32Type>())),
        DataType::Float64 => Box::new(Floats(a.as_primitive::<Float64Type>())),
        DataType::Utf8 => Box::new(Bytes(a.as_string::<i32>(), |s, i| s.value(i).as_bytes())),
        DataType::LargeUtf8 => Box::new(Bytes(a.as_string::<i64>(), |s, i| s.value(i).as_bytes())),
        DataType::Utf8View => Box::new(Bytes(a.as_string_view(), |s, i| s.value(i).as_bytes())),
        DataType::Binary => Box::new(Bytes(a.as_binary::<i32>(), |s, i| s.value(i))),
        DataType::LargeBinary => Box::new(Bytes(a.as_binary::<i64>(), |s, i| s.value(i))),
        DataType::BinaryView => Box::new(Bytes(a.as_binary_view(), |s, i| s.value(i))),
        DataType::Dictionary(_, v) if !matches!(**v, DataType::Dictionary(..)) => {
            let d = a.as_any_dictionary();
            Box::new(Dictionary {
                keys: d.keys(),
                index: d.normalized_keys(),
                values: scalar_values(d.values().as_ref())?,
            })
        }
        other => return Err(UnreadType(other.clone())),
    })
}
