//! The text of each value a row range decodes: the same as Arrow's reader gives for files
//! Arrow writes (every type read, dictionaries, lists, nulls, NaN), for any page layout and
//! any rows of a group; legacy lists and unsigned converted types; a page of nulls; a page
//! that does not decode.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{
    Float64Builder, Int64Builder, LargeListBuilder, ListBuilder, StringBuilder,
    StringDictionaryBuilder,
};
use arrow_array::types::Int32Type as ArrowInt32;
use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, DictionaryArray, Float32Array, Float64Array, Int16Array,
    Int32Array, Int64Array, Int8Array, LargeStringArray, RecordBatch, StringArray, UInt16Array,
    UInt32Array, UInt64Array, UInt8Array,
};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, FixedLenByteArray};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use super::super::arrow_text::text_values;
use super::super::file::ParquetFile;
use super::super::source::Chunks;
use super::*;
use crate::input::RangeRead;
use crate::{Column as SchemaColumn, ColumnKind, Schema};

/// The text of each projected column of each row.
type Texts = Vec<Vec<Vec<u8>>>;

/// A schema with the label `label` and, for every other name, a sparse column (a list
/// column, multi-sparse with `|`, for the names in `lists`).
fn schema_of(names: &[&str], lists: &[&str]) -> Schema {
    let columns = names
        .iter()
        .map(|&n| {
            let kind = match n {
                "label" => ColumnKind::Label,
                n if lists.contains(&n) => ColumnKind::MultiSparse { separator: '|' },
                _ => ColumnKind::Sparse,
            };
            SchemaColumn::new(n, kind)
        })
        .collect();
    Schema {
        columns,
        separator: '\t',
        header: false,
    }
}

fn open(path: &Path, schema: &Schema) -> Arc<ParquetFile> {
    let source: Arc<dyn RangeRead> = Arc::new(File::open(path).unwrap());
    let len = std::fs::metadata(path).unwrap().len();
    Arc::new(ParquetFile::open(path, source, len, &LineParser::new(schema)).unwrap())
}

/// The texts of rows `skip..skip + take` of group `group`, and how the range ended.
fn range_texts(
    file: &Arc<ParquetFile>,
    group: usize,
    skip: usize,
    take: usize,
) -> (Texts, Result<(), DataError>) {
    let range = RowRange {
        file: Arc::clone(file),
        group,
        skip,
        take,
        first_row: 0,
    };
    let chunks = Chunks::new(Arc::clone(&file.source), file.len);
    let mut rows = Vec::new();
    let done = range.rows(&chunks, |cells| {
        rows.push((0..cells.len()).map(|k| text_of(cells.cell(k))).collect());
    });
    (rows, done)
}

/// The text a cell stands for.
fn text_of(cell: Cell<'_>) -> Vec<u8> {
    let mut text = Vec::new();
    cell.write_text(&mut text);
    text
}

/// The values of the file that come as a dictionary entry with its hash, each checked to be
/// the hash of its text.
fn hashed_cells(file: &Arc<ParquetFile>) -> usize {
    let mut hashed = 0;
    for (group, skip, take, _) in file.ranges(0, None).unwrap() {
        let range = RowRange {
            file: Arc::clone(file),
            group,
            skip,
            take,
            first_row: 0,
        };
        let chunks = Chunks::new(Arc::clone(&file.source), file.len);
        let done = range.rows(&chunks, |cells| {
            for k in 0..cells.len() {
                if let Cell::Hashed(t, h) = cells.cell(k) {
                    assert_eq!(h, crate::ids::value_hash(t));
                    hashed += 1;
                }
            }
        });
        done.unwrap();
    }
    hashed
}

/// Every row of the file, range by range as the feeder cuts them.
fn all_texts(file: &Arc<ParquetFile>) -> Texts {
    let mut all = Vec::new();
    for (group, skip, take, _) in file.ranges(0, None).unwrap() {
        let (rows, done) = range_texts(file, group, skip, take);
        done.unwrap();
        all.extend(rows);
    }
    all
}

/// The texts Arrow's reader and the record-batch text writers give for the file's columns
/// `names` (in file order; lists joined by `|`).
fn arrow_texts(path: &Path, names: &[&str]) -> Texts {
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let mut all = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let columns: Vec<_> = names
            .iter()
            .map(|n| text_values(batch.column_by_name(n).unwrap().as_ref(), b'|').unwrap())
            .collect();
        for r in 0..batch.num_rows() {
            all.push(
                columns
                    .iter()
                    .map(|c| {
                        let mut text = Vec::new();
                        c.write(r, &mut text);
                        text
                    })
                    .collect(),
            );
        }
    }
    all
}

/// A deterministic pseudo-random sequence.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `n` rows of every type read, as Arrow writes them (pandas and Polars write through Arrow):
/// nulls, NaN, extreme values, empty strings, dictionaries, lists with null and empty lists
/// and null items.
fn every_type(n: usize, seed: u64) -> RecordBatch {
    let mut r = Lcg(seed);
    let mut pick = |k: u64| r.below(k);
    let mut cols: Vec<(&str, ArrayRef)> = Vec::new();
    let mut nulls = Vec::with_capacity(n);
    let mut choice = Vec::with_capacity(n);
    for _ in 0..n {
        nulls.push(pick(5) == 0);
        choice.push(pick(1000));
    }
    let opt = |i: usize| !nulls[i];
    macro_rules! ints {
        ($array:ty, $t:ty, $edges:expr) => {{
            let edges: &[$t] = &$edges;
            let a: $array = (0..n)
                .map(|i| {
                    opt(i).then(|| {
                        let c = choice[i] as usize;
                        if c % 3 == 0 {
                            edges[c % edges.len()]
                        } else {
                            (c as i64 - 500) as $t
                        }
                    })
                })
                .collect();
            Arc::new(a) as ArrayRef
        }};
    }
    let labels: Int8Array = (0..n).map(|i| Some((choice[i] % 2) as i8)).collect();
    cols.push(("label", Arc::new(labels)));
    cols.push(("i8", ints!(Int8Array, i8, [i8::MIN, i8::MAX, 0, -1])));
    cols.push(("i16", ints!(Int16Array, i16, [i16::MIN, i16::MAX, 0])));
    cols.push(("i32", ints!(Int32Array, i32, [i32::MIN, i32::MAX, 0])));
    cols.push(("i64", ints!(Int64Array, i64, [i64::MIN, i64::MAX, 0])));
    cols.push(("u8", ints!(UInt8Array, u8, [u8::MAX, 0, 128])));
    cols.push(("u16", ints!(UInt16Array, u16, [u16::MAX, 0, 40000])));
    cols.push(("u32", ints!(UInt32Array, u32, [u32::MAX, 0, 3_000_000_000])));
    cols.push(("u64", ints!(UInt64Array, u64, [u64::MAX, 0, 1 << 63])));
    let f64s = [
        f64::NAN,
        -0.0,
        0.0,
        0.1,
        1e300,
        -2.5,
        9007199254740992.0,
        9007199254740991.0,
        0.30000000000000004,
        f64::INFINITY,
        1e-7,
        3.0,
    ];
    let f: Float64Array = (0..n)
        .map(|i| opt(i).then(|| f64s[choice[i] as usize % f64s.len()]))
        .collect();
    cols.push(("f64", Arc::new(f)));
    let f: Float32Array = (0..n)
        .map(|i| opt(i).then(|| f64s[choice[i] as usize % f64s.len()] as f32))
        .collect();
    cols.push(("f32", Arc::new(f)));
    let b: BooleanArray = (0..n).map(|i| opt(i).then(|| choice[i] % 2 == 0)).collect();
    cols.push(("b", Arc::new(b)));
    let word = |c: u64| match c % 7 {
        0 => String::new(),
        1 => "ünï".to_string(),
        k => format!("w{}", c % (k * 10)),
    };
    let s: StringArray = (0..n).map(|i| opt(i).then(|| word(choice[i]))).collect();
    cols.push(("s", Arc::new(s)));
    let s: LargeStringArray = (0..n)
        .map(|i| opt(i).then(|| word(choice[i] / 3)))
        .collect();
    cols.push(("ls", Arc::new(s)));
    let bin: BinaryArray = (0..n)
        .map(|i| opt(i).then(|| vec![choice[i] as u8, b'\t', 0xff, b'|']))
        .collect();
    cols.push(("bin", Arc::new(bin)));
    let words: Vec<Option<String>> = (0..n)
        .map(|i| opt(i).then(|| word(choice[i] % 20)))
        .collect();
    let d: DictionaryArray<ArrowInt32> = words.iter().map(Option::as_deref).collect();
    cols.push(("dict", Arc::new(d)));
    let mut list = ListBuilder::new(StringBuilder::new());
    let mut large = LargeListBuilder::new(Int64Builder::new());
    let mut dicts = ListBuilder::new(StringDictionaryBuilder::<ArrowInt32>::new());
    let mut floats = ListBuilder::new(Float64Builder::new());
    for (i, &c) in choice.iter().enumerate() {
        let items = (c % 4) as usize;
        for k in 0..items {
            let null_item = (c + k as u64) % 5 == 0;
            list.values()
                .append_option((!null_item).then(|| word(c + k as u64)));
            large
                .values()
                .append_option((!null_item).then_some(c as i64 * k as i64 - 7));
            dicts
                .values()
                .append_option((!null_item).then(|| word((c + k as u64) % 9)));
            floats
                .values()
                .append_option((!null_item).then(|| f64s[(c as usize + k) % f64s.len()]));
        }
        // A null list (null rows) and an empty one (no items) are both missing.
        list.append(opt(i));
        large.append(opt(i));
        dicts.append(opt(i));
        floats.append(opt(i));
    }
    cols.push(("list", Arc::new(list.finish())));
    cols.push(("llist", Arc::new(large.finish())));
    cols.push(("dlist", Arc::new(dicts.finish())));
    cols.push(("flist", Arc::new(floats.finish())));
    RecordBatch::try_from_iter(cols).unwrap()
}

const EVERY_LIST: [&str; 4] = ["list", "llist", "dlist", "flist"];

/// Writes `batch` with Arrow's writer and `props`.
fn write_arrow(path: &Path, batch: &RecordBatch, props: WriterProperties) {
    let mut w =
        ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

#[test]
fn every_type_reads_as_arrows_text_for_any_page_layout_and_rows() {
    let dir = tempfile::tempdir().unwrap();
    // (rows, rows per group, rows per page, page format, dictionaries, offset index)
    let layouts = [
        (300, 128, 1, WriterVersion::PARQUET_1_0, true, true),
        (300, 128, 5, WriterVersion::PARQUET_2_0, true, false),
        (300, 100, 64, WriterVersion::PARQUET_1_0, false, false),
        (300, 300, 7, WriterVersion::PARQUET_2_0, false, true),
        // Ranges longer than a decode step, lists crossing steps and pages.
        (20_000, 20_000, 999, WriterVersion::PARQUET_1_0, true, true),
    ];
    for (k, &(n, group, page, version, dictionary, offset_index)) in layouts.iter().enumerate() {
        let batch = every_type(n, k as u64 + 1);
        let names: Vec<&str> = batch
            .schema_ref()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        let path = dir.path().join(format!("every{k}.parquet"));
        let statistics = match offset_index {
            true => EnabledStatistics::Page,
            false => EnabledStatistics::Chunk,
        };
        let props = WriterProperties::builder()
            .set_max_row_group_size(group)
            .set_data_page_row_count_limit(page)
            .set_write_batch_size(page)
            .set_writer_version(version)
            .set_dictionary_enabled(dictionary)
            .set_statistics_enabled(statistics)
            .set_offset_index_disabled(!offset_index)
            .set_compression(Compression::SNAPPY)
            .build();
        write_arrow(&path, &batch, props);
        let file = open(&path, &schema_of(&names, &EVERY_LIST));
        assert_eq!(
            file.meta.offset_index().is_some(),
            offset_index,
            "layout {k}"
        );
        if let Some(index) = file.meta.offset_index() {
            // The pages asked for: `page` rows each.
            let leaf = file
                .columns
                .iter()
                .find(|c| c.name == "s")
                .unwrap()
                .leaf
                .index;
            let pages = index[0][leaf].page_locations().len();
            assert_eq!(pages, group.min(n).div_ceil(page), "layout {k}");
        }
        let want = arrow_texts(&path, &names);
        assert_eq!(want.len(), n);
        let got = all_texts(&file);
        for (row, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "layout {k}, row {row}");
        }
        assert_eq!(got.len(), n, "layout {k}");
        // Strings of one value per row (`s`, `ls`, `bin`, the Arrow dictionary `dict`) are hashed once per
        // dictionary entry when the pages are dictionary-encoded, never otherwise.
        let hashed = hashed_cells(&file);
        assert_eq!(hashed > 0, dictionary, "layout {k}: {hashed} hashed");
        // Any rows of a group: skips and takes that start and end inside and on pages.
        let mut first = 0;
        for g in 0..file.meta.num_row_groups() {
            let rows = file.meta.row_group(g).num_rows() as usize;
            for skip in [
                0,
                1,
                page - 1,
                page,
                page + 1,
                2 * page + 3,
                rows / 2,
                rows - 1,
            ] {
                for take in [1, page, page + 2, 9000, rows] {
                    let (skip, take) = (skip.min(rows - 1), take.min(rows - skip.min(rows - 1)));
                    let (got, done) = range_texts(&file, g, skip, take);
                    done.unwrap();
                    let at = first + skip;
                    assert!(
                        got == want[at..at + take],
                        "layout {k}, group {g}, rows {skip}..+{take}"
                    );
                }
            }
            first += rows;
        }
    }
}

/// Writes one row group of `rows` rows through Parquet's own writer: `columns` in schema
/// order, each as (values, definition levels, repetition levels).
fn write_levels(path: &Path, message: &str, page_rows: usize, columns: Vec<Levels>) {
    let props = WriterProperties::builder()
        .set_data_page_row_count_limit(page_rows)
        .set_write_batch_size(page_rows)
        .set_dictionary_enabled(false)
        .build();
    let schema = Arc::new(parse_message_type(message).unwrap());
    let mut w =
        SerializedFileWriter::new(File::create(path).unwrap(), schema, Arc::new(props)).unwrap();
    let mut group = w.next_row_group().unwrap();
    for column in columns {
        let mut c = group.next_column().unwrap().unwrap();
        let (defs, reps) = (column.defs.as_deref(), column.reps.as_deref());
        match column.values {
            Values::I32(v) => c.typed::<Int32Type>().write_batch(&v, defs, reps).unwrap(),
            Values::I64(v) => c.typed::<Int64Type>().write_batch(&v, defs, reps).unwrap(),
            Values::F64(v) => c.typed::<DoubleType>().write_batch(&v, defs, reps).unwrap(),
            Values::Bytes(v) => {
                let v: Vec<ByteArray> = v.iter().map(|s| ByteArray::from(s.as_str())).collect();
                c.typed::<ByteArrayType>()
                    .write_batch(&v, defs, reps)
                    .unwrap()
            }
            Values::Fixed(v) => {
                let v: Vec<FixedLenByteArray> = v
                    .iter()
                    .map(|s| FixedLenByteArray::from(s.as_bytes().to_vec()))
                    .collect();
                c.typed::<FixedLenByteArrayType>()
                    .write_batch(&v, defs, reps)
                    .unwrap()
            }
        };
        c.close().unwrap();
    }
    group.close().unwrap();
    w.close().unwrap();
}

enum Values {
    I32(Vec<i32>),
    I64(Vec<i64>),
    F64(Vec<f64>),
    Bytes(Vec<String>),
    Fixed(Vec<String>),
}

struct Levels {
    values: Values,
    defs: Option<Vec<i16>>,
    reps: Option<Vec<i16>>,
}

fn levels(values: Values, defs: Option<Vec<i16>>, reps: Option<Vec<i16>>) -> Levels {
    Levels { values, defs, reps }
}

#[test]
fn legacy_lists_unsigned_types_and_a_page_of_nulls_read_as_their_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("legacy.parquet");
    let message = "message m {
        required int32 label (INT_8);
        optional int32 u8 (UINT_8);
        optional int32 u16 (UINT_16);
        optional int32 u32 (UINT_32);
        optional int64 u64 (UINT_64);
        optional int32 i16 (INTEGER(16, true));
        optional group two (LIST) { repeated binary element (UTF8); }
        repeated int32 bare;
        optional group three (LIST) { repeated group list { optional double element; } }
        optional fixed_len_byte_array(2) fixed;
        optional binary gaps (UTF8);
    }";
    // 12 rows in pages of 4 rows: `gaps` has a page of nulls between two of values.
    let every = |d: i16| Some(vec![d; 12]);
    let columns = vec![
        levels(
            Values::I32(vec![1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0]),
            None,
            None,
        ),
        levels(
            Values::I32((0..12).map(|i| 240 + i).collect()),
            every(1),
            None,
        ),
        levels(
            Values::I32((0..12).map(|i| 65520 + i).collect()),
            every(1),
            None,
        ),
        levels(
            Values::I32((0..12).map(|i| -6 + i).collect()),
            every(1),
            None,
        ),
        levels(
            Values::I64((0..12).map(|i| -6 + i).collect()),
            every(1),
            None,
        ),
        levels(
            Values::I32((0..12).map(|i| -1000 * i).collect()),
            every(1),
            None,
        ),
        // two: [a, b], null, [], [c] and again...
        {
            let (mut v, mut d, mut r) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..3 {
                v.extend([format!("a{i}"), format!("b{i}")]);
                d.extend([2, 2]);
                r.extend([0, 1]);
                d.extend([0, 1]);
                r.extend([0, 0]);
                v.push(format!("c{i}"));
                d.push(2);
                r.push(0);
            }
            levels(Values::Bytes(v), Some(d), Some(r))
        },
        // bare: [1, 2, 3], [], [4], [] and again...
        {
            let (mut v, mut d, mut r) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..3 {
                v.extend([1, 2, 3, 4]);
                d.extend([1, 1, 1, 0, 1, 0]);
                r.extend([0, 1, 1, 0, 0, 0]);
            }
            levels(Values::I32(v), Some(d), Some(r))
        },
        // three: [1.5, null], null, [], [NaN, 2] and again...
        {
            let (mut v, mut d, mut r) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..3 {
                v.extend([1.5, f64::NAN, 2.0]);
                d.extend([3, 2, 0, 1, 3, 3]);
                r.extend([0, 1, 0, 0, 0, 1]);
            }
            levels(Values::F64(v), Some(d), Some(r))
        },
        levels(
            Values::Fixed((0..12).map(|i| format!("x{}", i % 10)).collect()),
            every(1),
            None,
        ),
        {
            let v: Vec<String> = (0..12)
                .filter(|i| !(4..8).contains(i))
                .map(|i| format!("g{i}"))
                .collect();
            let d = (0..12).map(|i| i16::from(!(4..8).contains(&i))).collect();
            levels(Values::Bytes(v), Some(d), None)
        },
    ];
    write_levels(&path, message, 4, columns);
    let names = [
        "label", "u8", "u16", "u32", "u64", "i16", "two", "bare", "three", "fixed", "gaps",
    ];
    let file = open(&path, &schema_of(&names, &["two", "bare", "three"]));
    let text = |row: usize| -> Vec<String> {
        let i = row as i64;
        let cycle = row % 4;
        let round = row / 4;
        vec![
            (1 - row % 2).to_string(),
            (240 + i).to_string(),
            (65520 + i).to_string(),
            ((i - 6) as i32 as u32).to_string(),
            ((i - 6) as u64).to_string(),
            (-1000 * i).to_string(),
            match cycle {
                0 => format!("a{round}|b{round}"),
                3 => format!("c{round}"),
                _ => String::new(),
            },
            match cycle {
                0 => "1|2|3".to_string(),
                2 => "4".to_string(),
                _ => String::new(),
            },
            match cycle {
                0 => "1.5|".to_string(),
                3 => "|2".to_string(),
                _ => String::new(),
            },
            format!("x{}", row % 10),
            match row {
                4..8 => String::new(),
                _ => format!("g{row}"),
            },
        ]
    };
    let want: Vec<Vec<String>> = (0..12).map(text).collect();
    let as_strings = |t: Texts| -> Vec<Vec<String>> {
        t.into_iter()
            .map(|r| {
                r.into_iter()
                    .map(|v| String::from_utf8(v).unwrap())
                    .collect()
            })
            .collect()
    };
    assert_eq!(as_strings(all_texts(&file)), want);
    // Across the pages: rows 3..9 start and end inside pages, around the page of nulls.
    for (skip, take) in [(3, 6), (4, 4), (5, 7), (11, 1), (0, 12)] {
        let (got, done) = range_texts(&file, 0, skip, take);
        done.unwrap();
        assert_eq!(as_strings(got), want[skip..skip + take], "{skip}..+{take}");
    }
}

#[test]
fn a_page_that_does_not_decode_ends_the_range_after_the_rows_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.parquet");
    let n = 20_000;
    let labels: Int8Array = (0..n).map(|i| Some((i % 2) as i8)).collect();
    let words: StringArray = (0..n).map(|i| Some(format!("w{i}"))).collect();
    let batch = RecordBatch::try_from_iter([
        ("label", Arc::new(labels) as ArrayRef),
        ("c", Arc::new(words) as ArrayRef),
    ])
    .unwrap();
    let props = WriterProperties::builder()
        .set_data_page_row_count_limit(10_000)
        .set_write_batch_size(1000)
        .set_dictionary_enabled(false)
        .set_compression(Compression::UNCOMPRESSED)
        .build();
    write_arrow(&path, &batch, props);
    let schema = schema_of(&["label", "c"], &[]);
    // The second page of `c` (rows 10000..) overwritten with garbage.
    let file = open(&path, &schema);
    let pages = file.meta.offset_index().unwrap()[0][1]
        .page_locations()
        .clone();
    assert_eq!(pages.len(), 2);
    let mut bytes = std::fs::read(&path).unwrap();
    let (at, len) = (
        pages[1].offset as usize,
        pages[1].compressed_page_size as usize,
    );
    bytes[at..at + len].fill(0xA5);
    std::fs::write(&path, &bytes).unwrap();
    let file = open(&path, &schema);
    let parser = LineParser::new(&schema);
    let stats = ReadStats::default();
    let mut out = parser.builder(0);
    let mut ends = Vec::new();
    let range = RowRange {
        file: Arc::clone(&file),
        group: 0,
        skip: 0,
        take: n,
        first_row: 0,
    };
    let done = range.decode(&parser, &stats, &mut out, &mut ends, |_, _, _, _| true);
    // The decode steps before the bad page's step are delivered.
    let before = 10_000 / DECODE_ROWS * DECODE_ROWS;
    assert!(before > 0);
    assert_eq!((done.seen, done.bad), (before as u64, 0));
    assert_eq!(ends.len(), before);
    assert_eq!(ends.last(), Some(&(before as u64)));
    assert!(done.bytes > 0);
    let fault = done.fault.expect("a fault").to_string();
    assert!(fault.contains("broken.parquet"), "{fault}");
    assert!(fault.contains("row group 0: column \"c\""), "{fault}");
    // A range that starts past the bad page's first step is refused at once.
    let (rows, done) = range_texts(&file, 0, 10_500, 100);
    assert!(rows.is_empty());
    assert!(done.is_err());
    // One before it reads.
    let (rows, done) = range_texts(&file, 0, 9000, 1000);
    done.unwrap();
    assert_eq!(rows.len(), 1000);
    assert_eq!(rows[0][1], b"w9000");
}
