//! Text -> Parquet (`sparta convert`): the rows a text reader with the same schema and plan
//! would keep, with every column of the schema, typed (see [`crate::parquet`] for the types).

use std::fs::File;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use parquet::basic::{Compression, LogicalType, Repetition, Type as Physical, ZstdLevel};
use parquet::column::page::{CompressedPage, PageWriteSpec, PageWriter};
use parquet::column::writer::{get_column_writer, get_typed_column_writer, ColumnWriterImpl};
use parquet::data_type::{ByteArray, ByteArrayType, DataType, DoubleType, FloatType, Int32Type};
use parquet::errors::{ParquetError, Result as ParquetResult};
use parquet::file::properties::{WriterProperties, WriterPropertiesPtr};
use parquet::file::writer::{
    SerializedFileWriter, SerializedPageWriter, SerializedRowGroupWriter, TrackedWrite,
};
use parquet::schema::types::{ColumnDescPtr, Type};

use crate::batch::BatchBuilder;
use crate::error::DataError;
use crate::features::InputPlan;
use crate::input::open_text;
use crate::parse::{parse_label, parse_number, parse_sample_weight, LineParser};
use crate::schema::{ColumnKind, Schema};

/// Rows the line check keeps before it drops them (its rows are not used).
const CHECK_ROWS: usize = 4096;

/// Rows buffered before they are handed to the column writers.
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

/// Writes the rows of text lines of one schema to a Parquet file.
pub struct ParquetWriter {
    path: PathBuf,
    file: SerializedFileWriter<File>,
    props: WriterPropertiesPtr,
    /// Schema column index and the column of each written column.
    columns: Vec<(usize, Written)>,
    parser: LineParser,
    check: BatchBuilder,
    sep: u8,
    group_rows: usize,
    /// Rows handed to the column writers of the row group in progress.
    in_group: usize,
    /// Rows buffered and not handed to the column writers yet.
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
        let err = |e: ParquetError| DataError::Parquet {
            path: path.to_path_buf(),
            detail: e.to_string(),
        };
        let mut fields = Vec::new();
        let mut kinds = Vec::new();
        for (c, col) in schema.columns.iter().enumerate() {
            if col.kind == ColumnKind::Ignore {
                continue;
            }
            fields.push(Arc::new(field(&col.name, &col.kind).map_err(err)?));
            kinds.push((c, &col.kind));
        }
        let root = Type::group_type_builder("schema")
            .with_fields(fields)
            .build()
            .map_err(err)?;
        let compression = match opts.codec {
            Codec::Zstd => Compression::ZSTD(ZstdLevel::default()),
            Codec::Snappy => Compression::SNAPPY,
            Codec::None => Compression::UNCOMPRESSED,
        };
        let props = Arc::new(
            WriterProperties::builder()
                .set_compression(compression)
                .build(),
        );
        let file = File::create(path).map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let file =
            SerializedFileWriter::new(file, Arc::new(root), Arc::clone(&props)).map_err(err)?;
        // One leaf per written column, in order.
        let columns = kinds
            .into_iter()
            .enumerate()
            .map(|(leaf, (c, kind))| {
                let descr = file.schema_descr().column(leaf);
                (c, Written::new(kind, descr, &props))
            })
            .collect();
        let parser = LineParser::for_plan(schema, plan);
        let check = parser.builder(1);
        Ok(ParquetWriter {
            path: path.to_path_buf(),
            file,
            props,
            columns,
            parser,
            check,
            sep: schema.separator as u8,
            group_rows: opts.row_group_rows,
            in_group: 0,
            buffered: 0,
            rows: 0,
        })
    }

    /// Adds the row of `line` (without its line end; a trailing `\r` and a leading UTF-8 byte
    /// order mark are dropped, as the text reader drops them), or says why the text reader
    /// would reject it (nothing is written then).
    pub fn push_line(&mut self, line: &[u8]) -> Result<Result<(), crate::BadLine>, DataError> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
        if let Err(bad) = self.parser.parse_line(line, &mut self.check) {
            return Ok(Err(bad));
        }
        if self.check.rows() >= CHECK_ROWS {
            self.check.take();
        }
        let mut values = line.split(|&b| b == self.sep);
        let mut next = 0;
        for (c, w) in &mut self.columns {
            // The parser accepted the line: it has every column; valid UTF-8.
            let mut value = &[][..];
            while next <= *c {
                value = values.next().unwrap_or_default();
                next += 1;
            }
            w.push(value);
        }
        self.buffered += 1;
        self.rows += 1;
        if self.in_group + self.buffered >= self.group_rows {
            self.close_group()?;
        } else if self.buffered >= WRITE_ROWS {
            self.write_buffered()?;
        }
        Ok(Ok(()))
    }

    /// Hands the buffered rows to the column writers.
    fn write_buffered(&mut self) -> Result<(), DataError> {
        for (_, w) in &mut self.columns {
            w.write().map_err(|e| err(&self.path, e))?;
        }
        self.in_group += self.buffered;
        self.buffered = 0;
        Ok(())
    }

    /// Writes the row group in progress to the file (its column chunks, one after another).
    fn close_group(&mut self) -> Result<(), DataError> {
        self.write_buffered()?;
        let path = &self.path;
        let mut group = self.file.next_row_group().map_err(|e| err(path, e))?;
        for (_, w) in &mut self.columns {
            w.close_into(&mut group, &self.props)
                .map_err(|e| err(path, e))?;
        }
        group.close().map_err(|e| err(path, e))?;
        self.in_group = 0;
        Ok(())
    }

    /// Writes the buffered rows and the footer; the rows written.
    pub fn finish(mut self) -> Result<u64, DataError> {
        if self.in_group + self.buffered > 0 {
            self.close_group()?;
        }
        self.file.close().map_err(|e| err(&self.path, e))?;
        Ok(self.rows)
    }
}

/// A Parquet error writing `path`.
fn err(path: &Path, e: ParquetError) -> DataError {
    DataError::Parquet {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}

/// The Parquet field of a written column of kind `kind` (see [`crate::parquet`]): a label
/// `INT32 (INT(8, true))` (Arrow's `Int8`), the sample weight an optional `FLOAT`, a dense
/// value an optional `DOUBLE`, a sparse value an optional `BYTE_ARRAY (STRING)`, a multi-sparse
/// value an optional 3-level `LIST` of optional strings (Arrow's `List<Utf8>`, items named
/// `item` as Arrow's writer names them).
fn field(name: &str, kind: &ColumnKind) -> ParquetResult<Type> {
    let primitive = |name: &str, physical, repetition, logical| {
        Type::primitive_type_builder(name, physical)
            .with_repetition(repetition)
            .with_logical_type(logical)
            .build()
    };
    let string = Some(LogicalType::String);
    match kind {
        ColumnKind::Label => primitive(
            name,
            Physical::INT32,
            Repetition::REQUIRED,
            Some(LogicalType::Integer {
                bit_width: 8,
                is_signed: true,
            }),
        ),
        ColumnKind::Weight => primitive(name, Physical::FLOAT, Repetition::OPTIONAL, None),
        ColumnKind::Dense => primitive(name, Physical::DOUBLE, Repetition::OPTIONAL, None),
        ColumnKind::MultiSparse { .. } => {
            let item = primitive("item", Physical::BYTE_ARRAY, Repetition::OPTIONAL, string)?;
            let list = Type::group_type_builder("list")
                .with_repetition(Repetition::REPEATED)
                .with_fields(vec![Arc::new(item)])
                .build()?;
            Type::group_type_builder(name)
                .with_repetition(Repetition::OPTIONAL)
                .with_logical_type(Some(LogicalType::List))
                .with_fields(vec![Arc::new(list)])
                .build()
        }
        ColumnKind::Sparse | ColumnKind::Ignore => {
            primitive(name, Physical::BYTE_ARRAY, Repetition::OPTIONAL, string)
        }
    }
}

/// A written column: its buffered rows and its writer.
enum Written {
    Label(Column<Int32Type>),
    Weight(Column<FloatType>),
    Dense(Column<DoubleType>),
    /// Sparse and multi-sparse (`list`: the item separator) values: the strings of the
    /// buffered rows end to end in `text`, each ending at its `ends`.
    Strings {
        column: Column<ByteArrayType>,
        list: Option<u8>,
        text: Vec<u8>,
        ends: Vec<usize>,
    },
}

impl Written {
    fn new(kind: &ColumnKind, descr: ColumnDescPtr, props: &WriterPropertiesPtr) -> Written {
        match *kind {
            ColumnKind::Label => Written::Label(Column::new(descr, props)),
            ColumnKind::Weight => Written::Weight(Column::new(descr, props)),
            ColumnKind::Dense => Written::Dense(Column::new(descr, props)),
            ColumnKind::MultiSparse { separator } => Written::Strings {
                column: Column::new(descr, props),
                list: Some(separator as u8),
                text: Vec::new(),
                ends: Vec::new(),
            },
            ColumnKind::Sparse | ColumnKind::Ignore => Written::Strings {
                column: Column::new(descr, props),
                list: None,
                text: Vec::new(),
                ends: Vec::new(),
            },
        }
    }

    /// Buffers the row of the (accepted) text `value`: empty is null, except for a label.
    fn push(&mut self, value: &[u8]) {
        match self {
            Written::Label(c) => c.push(Some(parse_label(value).unwrap_or(0.0) as i8 as i32)),
            // Empty (weight 1) stays null, which reads back as empty.
            Written::Weight(c) if value.is_empty() => c.push(None),
            Written::Weight(c) => c.push(parse_sample_weight(value)),
            Written::Dense(c) => c.push(parse_number(value)),
            Written::Strings {
                column,
                list,
                text,
                ends,
            } => {
                let present = column.descr.max_def_level();
                if value.is_empty() {
                    column.defs.push(0);
                    if list.is_some() {
                        column.reps.push(0);
                    }
                    return;
                }
                let mut item = |bytes: &[u8], rep| {
                    text.extend_from_slice(bytes);
                    ends.push(text.len());
                    column.defs.push(present);
                    if list.is_some() {
                        column.reps.push(rep);
                    }
                };
                match *list {
                    None => item(value, 0),
                    Some(sep) => {
                        for (k, bytes) in value.split(|&b| b == sep).enumerate() {
                            item(bytes, i16::from(k > 0));
                        }
                    }
                }
            }
        }
    }

    /// Hands the buffered rows to the column writer.
    fn write(&mut self) -> ParquetResult<()> {
        match self {
            Written::Label(c) => c.write(),
            Written::Weight(c) => c.write(),
            Written::Dense(c) => c.write(),
            Written::Strings {
                column, text, ends, ..
            } => {
                // The strings as slices of one buffer.
                let all = Bytes::from(std::mem::take(text));
                let mut start = 0;
                for &end in ends.iter() {
                    column.values.push(ByteArray::from(all.slice(start..end)));
                    start = end;
                }
                ends.clear();
                column.write()
            }
        }
    }

    fn close_into(
        &mut self,
        group: &mut SerializedRowGroupWriter<'_, File>,
        props: &WriterPropertiesPtr,
    ) -> ParquetResult<()> {
        match self {
            Written::Label(c) => c.close_into(group, props),
            Written::Weight(c) => c.close_into(group, props),
            Written::Dense(c) => c.close_into(group, props),
            Written::Strings { column, .. } => column.close_into(group, props),
        }
    }
}

/// One column of physical type `T`: the levels and values of the buffered rows, and the
/// writer of its chunk of the row group in progress (encoded into memory: the columns of a
/// group are written to the file one after another when it is closed).
struct Column<T: DataType> {
    descr: ColumnDescPtr,
    writer: ColumnWriterImpl<'static, T>,
    pages: ChunkPages,
    values: Vec<T::T>,
    defs: Vec<i16>,
    reps: Vec<i16>,
}

impl<T: DataType> Column<T> {
    fn new(descr: ColumnDescPtr, props: &WriterPropertiesPtr) -> Column<T> {
        let (writer, pages) = Self::start(&descr, props);
        Column {
            descr,
            writer,
            pages,
            values: Vec::new(),
            defs: Vec::new(),
            reps: Vec::new(),
        }
    }

    /// A writer of a new column chunk and the memory its pages go to.
    fn start(
        descr: &ColumnDescPtr,
        props: &WriterPropertiesPtr,
    ) -> (ColumnWriterImpl<'static, T>, ChunkPages) {
        let pages = Arc::new(Mutex::new(TrackedWrite::new(Vec::new())));
        let sink = Box::new(MemoryPages(Arc::clone(&pages)));
        let writer = get_column_writer(Arc::clone(descr), Arc::clone(props), sink);
        (get_typed_column_writer::<T>(writer), pages)
    }

    /// Buffers a value of a non-repeated column (`None`: null).
    fn push(&mut self, value: Option<T::T>) {
        if self.descr.max_def_level() > 0 {
            self.defs.push(i16::from(value.is_some()));
        }
        self.values.extend(value);
    }

    /// Hands the buffered values to the writer.
    fn write(&mut self) -> ParquetResult<()> {
        let defs = (self.descr.max_def_level() > 0).then_some(&self.defs[..]);
        let reps = (self.descr.max_rep_level() > 0).then_some(&self.reps[..]);
        self.writer.write_batch(&self.values, defs, reps)?;
        self.values.clear();
        self.defs.clear();
        self.reps.clear();
        Ok(())
    }

    /// Closes the column's chunk of the row group in progress into `group` (after the
    /// chunks of the columns before it) and starts the chunk of the next group.
    fn close_into(
        &mut self,
        group: &mut SerializedRowGroupWriter<'_, File>,
        props: &WriterPropertiesPtr,
    ) -> ParquetResult<()> {
        let (writer, pages) = Self::start(&self.descr, props);
        let closed = std::mem::replace(&mut self.writer, writer).close()?;
        let pages = std::mem::replace(&mut self.pages, pages);
        // The writer (and its page sink) is gone: the pages are this column's alone.
        let pages = Arc::try_unwrap(pages)
            .map_err(|_| ParquetError::General("a column's pages are still shared".into()))?
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
            .into_inner()?;
        group.append_column(&Bytes::from(pages), closed)
    }
}

/// The pages of a column chunk written to memory (shared by its column writer's page sink
/// and the [`Column`] that appends them to the file).
type ChunkPages = Arc<Mutex<TrackedWrite<Vec<u8>>>>;

/// Parquet's page writer into a column chunk held in memory.
struct MemoryPages(ChunkPages);

impl PageWriter for MemoryPages {
    fn write_page(&mut self, page: CompressedPage) -> ParquetResult<PageWriteSpec> {
        let mut sink = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        SerializedPageWriter::new(&mut sink).write_page(page)
    }

    fn close(&mut self) -> ParquetResult<()> {
        Ok(())
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
