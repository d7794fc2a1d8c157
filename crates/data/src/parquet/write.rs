//! Text -> Parquet (`sparta convert`): the rows a text reader with the same schema and plan
//! would keep, with every column of the schema, typed (see [`crate::parquet`] for the types).

use std::fs::File;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{
    Float32Builder, Float64Builder, Int8Builder, ListBuilder, StringBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema as ArrowSchema};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::batch::BatchBuilder;
use crate::error::DataError;
use crate::features::InputPlan;
use crate::input::open_text;
use crate::parse::{parse_label, parse_number, parse_sample_weight, LineParser};
use crate::schema::{ColumnKind, Schema};

/// Rows the line check keeps before it drops them (its rows are not used).
const CHECK_ROWS: usize = 4096;

/// Rows buffered before they are handed to the Parquet writer.
const WRITE_ROWS: usize = 64 << 10;

/// Page compression of a written file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Codec {
    /// zstd level 1: small files, fast to decode (the default).
    #[default]
    Zstd,
    /// Snappy: larger files, the fastest to decode.
    Snappy,
    /// No compression.
    None,
}

/// A compression name that is not zstd, snappy or none (the name given).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("compression {0:?}: expected zstd, snappy or none")]
pub struct UnknownCodec(pub String);

impl std::str::FromStr for Codec {
    type Err = UnknownCodec;

    fn from_str(s: &str) -> Result<Codec, UnknownCodec> {
        match s {
            "zstd" => Ok(Codec::Zstd),
            "snappy" => Ok(Codec::Snappy),
            "none" => Ok(Codec::None),
            other => Err(UnknownCodec(other.to_string())),
        }
    }
}

/// How to write a Parquet file.
#[derive(Clone, Copy, Debug)]
pub struct WriteOptions {
    pub codec: Codec,
    /// Rows per row group (the unit the readers decode in parallel).
    pub row_group_rows: usize,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            codec: Codec::Zstd,
            row_group_rows: 128 << 10,
        }
    }
}

/// What a conversion wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Converted {
    /// Rows written.
    pub rows: u64,
    /// Lines dropped as malformed (the text reader would skip them too).
    pub bad_lines: u64,
    /// The first few bad lines, as `file:line: reason`.
    pub first_bad_lines: Vec<String>,
}

/// The builder of one written column.
enum Builder {
    Label(Int8Builder),
    Weight(Float32Builder),
    Dense(Float64Builder),
    Sparse(StringBuilder),
    Multi(ListBuilder<StringBuilder>, u8),
}

/// Writes the rows of text lines of one schema to a Parquet file.
pub struct ParquetWriter {
    path: PathBuf,
    writer: ArrowWriter<File>,
    schema: Arc<ArrowSchema>,
    /// Schema column index and builder of each written column.
    columns: Vec<(usize, Builder)>,
    parser: LineParser,
    check: BatchBuilder,
    sep: u8,
    buffered: usize,
    rows: u64,
}

impl ParquetWriter {
    /// Creates `path` for rows of `schema`; a line is kept when the text reader with `plan`
    /// (`None`: the legacy plan) would keep it.
    pub fn create(
        path: &Path,
        schema: &Schema,
        plan: Option<&InputPlan>,
        opts: WriteOptions,
    ) -> Result<ParquetWriter, DataError> {
        schema.validate()?;
        if opts.row_group_rows == 0 {
            return Err(DataError::Config(
                "row_group_rows must be at least 1".into(),
            ));
        }
        let mut fields = Vec::new();
        let mut columns = Vec::new();
        for (c, col) in schema.columns.iter().enumerate() {
            let (dt, nullable, b) = match col.kind {
                ColumnKind::Label => (DataType::Int8, false, Builder::Label(Int8Builder::new())),
                ColumnKind::Weight => (
                    DataType::Float32,
                    true,
                    Builder::Weight(Float32Builder::new()),
                ),
                ColumnKind::Dense => (
                    DataType::Float64,
                    true,
                    Builder::Dense(Float64Builder::new()),
                ),
                ColumnKind::Sparse => (DataType::Utf8, true, Builder::Sparse(StringBuilder::new())),
                ColumnKind::MultiSparse { separator } => (
                    DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
                    true,
                    Builder::Multi(ListBuilder::new(StringBuilder::new()), separator as u8),
                ),
                ColumnKind::Ignore => continue,
            };
            fields.push(Field::new(&col.name, dt, nullable));
            columns.push((c, b));
        }
        let arrow = Arc::new(ArrowSchema::new(fields));
        let compression = match opts.codec {
            Codec::Zstd => Compression::ZSTD(ZstdLevel::default()),
            Codec::Snappy => Compression::SNAPPY,
            Codec::None => Compression::UNCOMPRESSED,
        };
        let props = WriterProperties::builder()
            .set_compression(compression)
            .set_max_row_group_size(opts.row_group_rows)
            .build();
        let io_err = |source| DataError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::create(path).map_err(io_err)?;
        let writer = ArrowWriter::try_new(file, Arc::clone(&arrow), Some(props)).map_err(|e| {
            DataError::Parquet {
                path: path.to_path_buf(),
                detail: e.to_string(),
            }
        })?;
        let parser = LineParser::for_plan(schema, plan);
        let check = parser.builder(1);
        Ok(ParquetWriter {
            path: path.to_path_buf(),
            writer,
            schema: arrow,
            columns,
            parser,
            check,
            sep: schema.separator as u8,
            buffered: 0,
            rows: 0,
        })
    }

    /// Adds the row of `line` (without its line end; a trailing `\r` is dropped), or says why
    /// the text reader would reject it (nothing is written then).
    pub fn push_line(&mut self, line: &[u8]) -> Result<Result<(), crate::BadLine>, DataError> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Err(bad) = self.parser.parse_line(line, &mut self.check) {
            return Ok(Err(bad));
        }
        if self.check.rows() >= CHECK_ROWS {
            self.check.take();
        }
        let mut values = line.split(|&b| b == self.sep);
        let mut next = 0;
        for (c, b) in &mut self.columns {
            // The parser accepted the line: it has every column; valid UTF-8.
            let mut value = &[][..];
            while next <= *c {
                value = values.next().unwrap_or_default();
                next += 1;
            }
            let text = std::str::from_utf8(value).unwrap_or_default();
            match b {
                Builder::Label(b) => b.append_value(parse_label(value).unwrap_or(0.0) as i8),
                // Empty (weight 1) stays null, which reads back as empty.
                Builder::Weight(b) if value.is_empty() => b.append_null(),
                Builder::Weight(b) => b.append_option(parse_sample_weight(value)),
                Builder::Dense(b) => b.append_option(parse_number(value)),
                Builder::Sparse(b) if text.is_empty() => b.append_null(),
                Builder::Sparse(b) => b.append_value(text),
                Builder::Multi(b, _) if text.is_empty() => b.append_null(),
                Builder::Multi(b, sep) => {
                    for item in text.split(char::from(*sep)) {
                        b.values().append_value(item);
                    }
                    b.append(true);
                }
            }
        }
        self.buffered += 1;
        self.rows += 1;
        if self.buffered >= WRITE_ROWS {
            self.flush()?;
        }
        Ok(Ok(()))
    }

    fn flush(&mut self) -> Result<(), DataError> {
        if self.buffered == 0 {
            return Ok(());
        }
        self.buffered = 0;
        let arrays: Vec<ArrayRef> = self
            .columns
            .iter_mut()
            .map(|(_, b)| -> ArrayRef {
                match b {
                    Builder::Label(b) => Arc::new(b.finish()),
                    Builder::Weight(b) => Arc::new(b.finish()),
                    Builder::Dense(b) => Arc::new(b.finish()),
                    Builder::Sparse(b) => Arc::new(b.finish()),
                    Builder::Multi(b, _) => Arc::new(b.finish()),
                }
            })
            .collect();
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), arrays)
            .map_err(|e| self.err(e.to_string()))?;
        self.writer
            .write(&batch)
            .map_err(|e| self.err(e.to_string()))
    }

    fn err(&self, detail: String) -> DataError {
        DataError::Parquet {
            path: self.path.clone(),
            detail,
        }
    }

    /// Writes the buffered rows and the footer; the rows written.
    pub fn finish(mut self) -> Result<u64, DataError> {
        self.flush()?;
        let path = self.path.clone();
        self.writer.close().map_err(|e| DataError::Parquet {
            path,
            detail: e.to_string(),
        })?;
        Ok(self.rows)
    }
}

/// Bad lines kept in [`Converted::first_bad_lines`].
const REPORTED: usize = 10;

/// Converts text `inputs` (plain or gzip, detected as the readers do; a header line skipped
/// when the schema has one) into the Parquet file `out`.
pub fn convert(
    inputs: &[PathBuf],
    schema: &Schema,
    plan: Option<&InputPlan>,
    out: &Path,
    opts: WriteOptions,
) -> Result<Converted, DataError> {
    let mut w = ParquetWriter::create(out, schema, plan, opts)?;
    let mut done = Converted::default();
    for path in inputs {
        let mut text = open_text(path)?;
        let mut line = Vec::new();
        let mut no = 0u64;
        loop {
            line.clear();
            let n = text
                .read_until(b'\n', &mut line)
                .map_err(|source| DataError::Io {
                    path: path.clone(),
                    source,
                })?;
            if n == 0 {
                break;
            }
            no += 1;
            if no == 1 && schema.header {
                continue;
            }
            let l = line.strip_suffix(b"\n").unwrap_or(&line);
            if l.is_empty() || l == b"\r" {
                continue;
            }
            if let Err(reason) = w.push_line(l)? {
                done.bad_lines += 1;
                let msg = format!("{}:{no}: {reason}", path.display());
                tracing::warn!("skipping bad line {msg}");
                if done.first_bad_lines.len() < REPORTED {
                    done.first_bad_lines.push(msg);
                }
            }
        }
    }
    done.rows = w.finish()?;
    Ok(done)
}
