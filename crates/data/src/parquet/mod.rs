//! Parquet input (feature `parquet`): one more input kind of the one reading engine.
//!
//! A Parquet file (detected by its `PAR1` magic or a `.parquet` extension) is read through
//! [`crate::RangeRead`] (no mmap; an object-store object reads the same way) with Parquet's own
//! column readers (no Arrow). The feeder reads its footer (and offset index), projects it onto
//! the columns the input plan reads (root fields found by *name*; a missing one is an error
//! naming the file) and hands the parser threads row ranges (a row group, or 512 Ki-row ranges
//! of a bigger one) instead of text chunks. A parser decodes only the projected columns (the
//! pages before its range skipped, unread where the offset index says where they are) and
//! makes the rows with the text parser's own code, so the in-order assembler, batch cutting,
//! the bad-row rule, stats and positions are shared with text.
//!
//! # Values
//!
//! Each value stands for the text its line would hold and goes through
//! [`crate::LineParser::parse_cells`]: the same ids, dense transforms, limits and bad-row
//! rules as text. It is not written out as that text where that can be skipped (a
//! [`crate::parse::Cell`]): integers and doubles are handed on as numbers (a dense value is
//! the number the text parses to; an id hashes the decimal text, written on the stack), a
//! dictionary-encoded string's hash is computed once per dictionary entry, not per row
//! (`decode/dict`, which decodes the dictionary pages of a string or double column of one
//! value per row itself; `dict_hash` on the crate reader's path); `FLOAT`s and lists are
//! written as text. A row range reaches the assembler in pieces of 16 Ki rows.
//!
//! * null, and a float NaN (how pandas writes a missing float): the empty value (missing id,
//!   dense 0, sample weight 1, a bad label). In a text file the text `nan` is not missing but
//!   a bad dense value (the text parser's rule: pandas writes a missing value to CSV as the
//!   empty text, which is missing);
//! * integers (`INT32`, `INT64`): their decimal text, as the logical type says (`INT(8, true)`
//!   and the like narrow, `UINT_8`..`UINT_64` / `INT(n, false)` print unsigned; a categorical
//!   `Int64` 42 has the id of the text `42`);
//! * floats (`FLOAT`, `DOUBLE`): their shortest round-trip decimal text (exactly the value:
//!   `Float64` dense values train as the text they came from); `BOOLEAN`: `1` / `0`;
//! * strings and binary (`BYTE_ARRAY`, `FIXED_LEN_BYTE_ARRAY`): their bytes;
//! * dictionary-encoded columns (pandas `category`, Polars `Categorical`, also as list items):
//!   the value each key points to, as if written out (at the Parquet level they are pages of
//!   the values' type);
//! * lists (`LIST`, 3-level or legacy 2-level, or a bare `repeated` field: bags, sequences,
//!   weighted bags): the items' text joined by the column's separator; a null or empty list is
//!   missing, a null item an empty one. Weighted bags are a `List<Utf8>` of
//!   `value<weight separator>weight` items, as in text.
//!
//! Other types (decimals, dates, times, timestamps, `INT96`, `FLOAT16`, structs, maps, nested
//! lists) are not read: a plan that reads such a column is refused, naming its Parquet type.
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
//! same text writers as a file's. Only this uses Arrow, and only its array crates
//! (`arrow-array`, `arrow-schema`): the Parquet reader and writer are Parquet's own.
//!
//! # Writing
//!
//! [`convert`] (`sparta convert`) writes the rows a text reader would keep, with Parquet's
//! column writers, as types Arrow (pyarrow, pandas, Polars) reads as: every label `Int8`
//! (`INT32`, `INT(8, true)`), the sample weight `Float32` (`FLOAT`, nullable: empty is null),
//! dense `Float64` (`DOUBLE`, nullable; exact, so the batches equal the text's), sparse `Utf8`
//! (`BYTE_ARRAY` `STRING`, nullable), multi-sparse `List<Utf8>` (a 3-level `LIST` of nullable
//! strings named `item`, nullable), ignored columns dropped; row groups of the size asked for;
//! zstd by default.

mod arrow_text;
mod columns;
mod decode;
mod dict_hash;
mod file;
mod hybrid;
mod records;
mod source;
mod text;
mod write;

pub(crate) use decode::RowRange;
pub(crate) use file::ParquetFile;
pub use records::{FrameBatches, RecordRows, Rows};
pub use write::{convert, Codec, Converted, ParquetWriter, UnknownCodec, WriteOptions};

#[cfg(test)]
mod tests;
