//! Parquet input (feature `parquet`): one more input kind of the one reading engine.
//!
//! A Parquet file (detected by its `PAR1` magic or a `.parquet` extension) is read through
//! [`crate::RangeRead`] (no mmap; an object-store object reads the same way). The feeder reads
//! its footer, projects it onto the columns the input plan reads (found by *name*; a missing
//! one is an error naming the file) and hands the parser threads row ranges (a row group, or
//! 512 Ki-row ranges of a bigger one) instead of text chunks. A parser decodes only the
//! projected columns and makes the rows with the text parser's own code, so the in-order
//! assembler, batch cutting, the bad-row rule, stats and positions are shared with text.
//!
//! # Values
//!
//! Each value is read as the text its line would hold, then goes through
//! [`crate::LineParser::parse_values`]: the same ids, dense transforms, limits and bad-row
//! rules as text.
//!
//! * null, and a float NaN (how pandas writes a missing float): the empty value (missing id,
//!   dense 0, sample weight 1, a bad label);
//! * integers: their decimal text (a categorical `Int64` 42 has the id of the text `42`);
//! * floats: their shortest round-trip decimal text (exactly the value: `Float64` dense values
//!   train as the text they came from); booleans: `1` / `0`;
//! * strings and binary: their bytes;
//! * dictionary-encoded columns (pandas `category`, Polars `Categorical`, also as list items):
//!   the value each key points to, as if written out;
//! * `List<...>` (bags, sequences, weighted bags): the items' text joined by the column's
//!   separator; a null or empty list is missing, a null item an empty one. Weighted bags are a
//!   `List<Utf8>` of `value<weight separator>weight` items, as in text (`Map` columns are not
//!   read).
//!
//! A value the text parser rejects (a label other than 0/1, a non-finite dense value or one
//! beyond [`crate::parse::MAX_ABS_DENSE`], a bad item weight, a sample weight that is not a
//! finite number `>= 0`) makes the row bad: counted, and
//! reported as `file:row` (1-based row number in the file).
//!
//! # Positions
//!
//! The `offset` of a Parquet file in [`crate::ReadPosition::byte_offset`] and
//! [`crate::FollowPosition::offset`] is a *row number*: the rows of the file before the next
//! row. The (row group, row in group) it names follows from the footer's row-group sizes; a
//! reader started there starts at that row group and skips the rows before it. An offset past
//! the file's rows is a bad start ([`crate::DataError::BadStart`]).
//!
//! # Parts and bad files
//!
//! With `part = (index, count)` a file contributes its `index`-th of `count` near-equal runs of
//! row groups. A file that does not start and end with `PAR1` (a text file named `.parquet`) is
//! said not to be Parquet (naming it, and whether it looks like text). A file whose footer does
//! not read, or whose pages do not decode, is a bad file:
//! a reader stops with [`crate::DataError::Parquet`] naming it; a follower delivers the rows
//! before the fault, counts the file and skips it. A followed directory reads a Parquet file
//! once it is settled and its footer is written.
//!
//! # Record batches handed in
//!
//! [`RecordRows`] makes rows of Arrow record batches from outside the reader (the Python
//! package's DataFrames and RecordBatches): columns by the schema's names, values through the
//! same text path as a file's.
//!
//! # Writing
//!
//! [`convert`] (`sparta convert`) writes the rows a text reader would keep: every label `Int8`,
//! the sample weight `Float32` (nullable: empty is null), dense `Float64` (nullable; exact, so
//! the batches equal the text's), sparse `Utf8`
//! (nullable), multi-sparse `List<Utf8>` (nullable), ignored columns dropped; zstd by default.

mod decode;
mod file;
mod records;
mod source;
mod write;

pub(crate) use decode::RowRange;
pub(crate) use file::ParquetFile;
pub use records::{FrameBatches, RecordRows, Rows};
pub use write::{convert, Codec, Converted, ParquetWriter, UnknownCodec, WriteOptions};

#[cfg(test)]
mod tests;
