//! Dictionary pages read here give the cells the crate's reader gives: random string and
//! double columns (nulls, empty strings, NaN, several pages and row groups, a dictionary that falls back to plain
//! pages mid-chunk, v1 and v2 pages, codecs, with and without an offset index), any rows of a
//! group; Arrow's dictionary-typed columns (pandas `category`, Polars `Categorical`).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow_array::types::Int32Type as ArrowInt32;
use arrow_array::{ArrayRef, DictionaryArray, Int8Array, RecordBatch};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int32Type};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use parquet::schema::types::SchemaDescriptor;
use proptest::prelude::*;

use super::super::super::file::ParquetFile;
use super::super::super::source::Chunks;
use super::super::{strings_column, Pages, RowRange};
use super::*;
use crate::input::RangeRead;
use crate::parse::LineParser;
use crate::{Column as SchemaColumn, ColumnKind, Schema};

#[test]
fn a_plain_dictionary_page_is_read_as_its_entries() {
    let mut page = Vec::new();
    for e in [&b"ab"[..], b"", b"xyz"] {
        page.extend_from_slice(&(e.len() as u32).to_le_bytes());
        page.extend_from_slice(e);
    }
    let entries = entries_of(&page, 3).unwrap();
    let spans: Vec<(u32, u32)> = entries.iter().map(|e| (e.at, e.len)).collect();
    assert_eq!(spans, [(4, 2), (10, 0), (14, 3)]);
    assert!(entries_of(&page, 4).is_none());
    assert!(entries_of(&page[..16], 3).is_none());
    assert_eq!(entries_of(&page, 0).unwrap().len(), 0);
}

/// Pages handed out in order (no offset index: nothing to peek at).
struct Listed(VecDeque<Page>);

impl Iterator for Listed {
    type Item = ParquetResult<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.pop_front().map(Ok)
    }
}

impl PageReader for Listed {
    fn get_next_page(&mut self) -> ParquetResult<Option<Page>> {
        Ok(self.0.pop_front())
    }

    fn peek_next_page(&mut self) -> ParquetResult<Option<PageMetadata>> {
        Ok(None)
    }

    fn skip_next_page(&mut self) -> ParquetResult<()> {
        self.0.pop_front();
        Ok(())
    }
}

/// An optional string column read from `pages` (a dictionary of `a`, `bc` first).
fn column_of(pages: Vec<Page>) -> DictColumn<ByteEntries> {
    let message = "message m { optional binary s (UTF8); }";
    let schema = SchemaDescriptor::new(Arc::new(parse_message_type(message).unwrap()));
    let dict = Page::DictionaryPage {
        buf: Bytes::from_static(b"\x01\0\0\0a\x02\0\0\0bc"),
        num_values: 2,
        encoding: Encoding::PLAIN,
        is_sorted: false,
    };
    let pages = Listed(std::iter::once(dict).chain(pages).collect());
    DictColumn::new(schema.column(0), Box::new(pages), 1, b'|', strings_column)
}

/// Hand-made pages of 4 rows `bc`, null, `bc`, `bc`: definition levels 1 0 1 1 bit-packed
/// (`0x03` one group, `0b1101`), then `keys`.
fn v2(keys: &[u8]) -> Page {
    Page::DataPageV2 {
        buf: Bytes::from([&[0x03, 0x0D][..], keys].concat()),
        num_values: 4,
        encoding: Encoding::RLE_DICTIONARY,
        num_nulls: 1,
        num_rows: 4,
        def_levels_byte_len: 2,
        rep_levels_byte_len: 0,
        is_compressed: false,
        statistics: None,
    }
}

#[test]
fn hand_made_v1_and_v2_pages_read_and_a_key_past_the_dictionary_is_an_error() {
    // Keys: bit width 1, a repeated run of 3 ones (header 6).
    let keys = [1, 0x06, 0x01];
    let v1 = Page::DataPage {
        buf: Bytes::from([&[2, 0, 0, 0, 0x03, 0x0D][..], &keys].concat()),
        num_values: 4,
        encoding: Encoding::PLAIN_DICTIONARY,
        def_level_encoding: Encoding::RLE,
        rep_level_encoding: Encoding::RLE,
        statistics: None,
    };
    let mut c = column_of(vec![v1, v2(&keys)]);
    let bc = Owned::Hashed(b"bc".to_vec(), value_hash(b"bc"));
    let want = [bc.clone(), Owned::Text(Vec::new()), bc.clone(), bc];
    assert_eq!(c.read(3).unwrap(), 3);
    let got: Vec<Owned> = c.cells().into_iter().map(owned).collect();
    assert_eq!(got, want[..3]);
    assert_eq!(c.read(10).unwrap(), 5);
    let got: Vec<Owned> = c.cells().into_iter().map(owned).collect();
    assert_eq!(got[..1], want[3..]);
    assert_eq!(got[1..], want);
    // Keys of width 2: three 3s, past the 2 entries.
    let mut c = column_of(vec![v2(&[2, 0x06, 0x03])]);
    let err = c.read(4).unwrap_err().to_string();
    assert!(err.contains("dictionary key 3 of 2 entries"), "{err}");
    // Keys that end early.
    let mut c = column_of(vec![v2(&[1, 0x04, 0x01])]);
    let err = c.read(4).unwrap_err().to_string();
    assert!(err.contains("ends 1 values short"), "{err}");
}

/// A cell, owned.
#[derive(Clone, Debug, PartialEq)]
enum Owned {
    Text(Vec<u8>),
    Hashed(Vec<u8>, u64),
    Other(String),
}

fn owned(c: Cell<'_>) -> Owned {
    match c {
        Cell::Text(t) => Owned::Text(t.to_vec()),
        Cell::Hashed(t, h) => Owned::Hashed(t.to_vec(), h),
        other => Owned::Other(format!("{other:?}")),
    }
}

/// The file at `path` read with a label and sparse columns `names`.
fn open(path: &Path, names: &[&str]) -> Arc<ParquetFile> {
    let columns = names
        .iter()
        .map(|&n| match n {
            "label" => SchemaColumn::new(n, ColumnKind::Label),
            _ => SchemaColumn::new(n, ColumnKind::Sparse),
        })
        .collect();
    let schema = Schema {
        columns,
        separator: '\t',
        header: false,
    };
    let source: Arc<dyn RangeRead> = Arc::new(File::open(path).unwrap());
    let len = std::fs::metadata(path).unwrap().len();
    Arc::new(ParquetFile::open(path, source, len, &LineParser::new(&schema)).unwrap())
}

/// Rows `skip..skip + take` of group `group`, their cells as `by` decodes them.
fn cells_of(
    file: &Arc<ParquetFile>,
    group: usize,
    skip: usize,
    take: usize,
    by: Pages,
) -> Vec<Vec<Owned>> {
    let range = RowRange {
        file: Arc::clone(file),
        group,
        skip,
        take,
        first_row: 0,
    };
    let chunks = Chunks::new(Arc::clone(&file.source), file.len);
    let mut rows = Vec::new();
    range
        .rows_by(&chunks, by, |cells| {
            rows.push((0..cells.len()).map(|k| owned(cells.cell(k))).collect());
            true
        })
        .unwrap();
    rows
}

/// Every row of the file as `by` decodes it, range by range as the feeder cuts them.
fn all_cells(file: &Arc<ParquetFile>, by: Pages) -> Vec<Vec<Owned>> {
    let mut all = Vec::new();
    for (group, skip, take, _) in file.ranges(0, None).unwrap() {
        all.extend(cells_of(file, group, skip, take, by));
    }
    all
}

/// How a test file is written.
#[derive(Clone, Debug)]
struct Layout {
    group_rows: usize,
    page_rows: usize,
    /// Bytes of dictionary after which a chunk's writer falls back to plain pages.
    dict_limit: usize,
    v2: bool,
    codec: u8,
    offset_index: bool,
}

/// Writes `label`, a required string column `r`, an optional one `o` (`None`: null) and an
/// optional double column `x` (null where `o` is) with Parquet's own writer,
/// dictionary-encoded.
fn write(path: &Path, r: &[String], o: &[Option<String>], layout: &Layout) {
    let message = "message m {
        required int32 label (INT_8);
        required binary r (UTF8);
        optional binary o (UTF8);
        optional double x;
    }";
    let props = WriterProperties::builder()
        .set_dictionary_enabled(true)
        .set_dictionary_page_size_limit(layout.dict_limit)
        .set_data_page_row_count_limit(layout.page_rows)
        .set_write_batch_size(layout.page_rows)
        .set_writer_version(match layout.v2 {
            true => WriterVersion::PARQUET_2_0,
            false => WriterVersion::PARQUET_1_0,
        })
        .set_compression(match layout.codec {
            0 => Compression::SNAPPY,
            1 => Compression::ZSTD(ZstdLevel::default()),
            _ => Compression::UNCOMPRESSED,
        })
        .set_statistics_enabled(match layout.offset_index {
            true => EnabledStatistics::Page,
            false => EnabledStatistics::Chunk,
        })
        .set_offset_index_disabled(!layout.offset_index)
        .build();
    let schema = Arc::new(parse_message_type(message).unwrap());
    let mut w =
        SerializedFileWriter::new(File::create(path).unwrap(), schema, Arc::new(props)).unwrap();
    let n = r.len();
    let mut start = 0;
    while start < n {
        let end = (start + layout.group_rows).min(n);
        let mut group = w.next_row_group().unwrap();
        let labels: Vec<i32> = (start..end).map(|i| (i % 2) as i32).collect();
        let mut c = group.next_column().unwrap().unwrap();
        c.typed::<Int32Type>()
            .write_batch(&labels, None, None)
            .unwrap();
        c.close().unwrap();
        let values: Vec<ByteArray> = r[start..end]
            .iter()
            .map(|s| ByteArray::from(s.as_str()))
            .collect();
        let mut c = group.next_column().unwrap().unwrap();
        c.typed::<ByteArrayType>()
            .write_batch(&values, None, None)
            .unwrap();
        c.close().unwrap();
        let values: Vec<ByteArray> = o[start..end]
            .iter()
            .flatten()
            .map(|s| ByteArray::from(s.as_str()))
            .collect();
        let defs: Vec<i16> = o[start..end].iter().map(|v| v.is_some() as i16).collect();
        let mut c = group.next_column().unwrap().unwrap();
        c.typed::<ByteArrayType>()
            .write_batch(&values, Some(&defs), None)
            .unwrap();
        c.close().unwrap();
        let numbers: Vec<f64> = o[start..end].iter().flatten().map(|s| number(s)).collect();
        let mut c = group.next_column().unwrap().unwrap();
        c.typed::<DoubleType>()
            .write_batch(&numbers, Some(&defs), None)
            .unwrap();
        c.close().unwrap();
        group.close().unwrap();
        start = end;
    }
    w.close().unwrap();
}

/// The number written for word `w` (NaN, infinities, -0 among them).
fn number(w: &str) -> f64 {
    match w.len() % 9 {
        0 => f64::NAN,
        1 => f64::INFINITY,
        2 => -0.0,
        _ => {
            let h = w
                .bytes()
                .fold(7u64, |h, b| h.wrapping_mul(31) ^ u64::from(b));
            (h % 997) as f64 * 0.37 - 100.0
        }
    }
}

/// The words of a column: `vocab` of them (the first empty), picked with a skew.
fn words(picks: &[(u16, bool)], vocab: u16) -> (Vec<String>, Vec<Option<String>>) {
    let word = |p: u16| match p % vocab {
        0 => String::new(),
        k => format!("w{k}-{}", "x".repeat(k as usize % 13)),
    };
    let r = picks.iter().map(|&(p, _)| word(p / 3)).collect();
    let o = picks
        .iter()
        .map(|&(p, null)| (!null).then(|| word(p)))
        .collect();
    (r, o)
}

fn layout() -> impl Strategy<Value = Layout> {
    (
        1usize..5000,
        1usize..600,
        prop_oneof![Just(1usize << 20), 16usize..3000],
        any::<bool>(),
        0u8..3,
        any::<bool>(),
    )
        .prop_map(
            |(group_rows, page_rows, dict_limit, v2, codec, offset_index)| Layout {
                group_rows,
                page_rows,
                dict_limit,
                v2,
                codec,
                offset_index,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn dictionary_pages_read_here_give_the_crate_readers_cells(
        picks in prop::collection::vec((any::<u16>(), prop::bool::weighted(0.2)), 1..5000),
        vocab in 1u16..600,
        layout in layout(),
        ranges in prop::collection::vec((any::<prop::sample::Index>(), 1usize..3000), 1..4),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.parquet");
        let (r, o) = words(&picks, vocab);
        write(&path, &r, &o, &layout);
        let file = open(&path, &["label", "r", "o", "x"]);
        let want = all_cells(&file, Pages::Crate);
        prop_assert_eq!(want.len(), picks.len());
        let got = all_cells(&file, Pages::Own);
        prop_assert_eq!(&got, &want);
        // Any rows of a group: skips that end inside and on pages, takes across them.
        let mut first = 0;
        let starts: Vec<usize> = (0..file.meta.num_row_groups())
            .map(|g| {
                let at = first;
                first += file.meta.row_group(g).num_rows() as usize;
                at
            })
            .collect();
        for (at, take) in ranges {
            let g = at.index(starts.len());
            let rows = file.meta.row_group(g).num_rows() as usize;
            let skip = at.index(rows);
            let take = take.min(rows - skip);
            let got = cells_of(&file, g, skip, take, Pages::Own);
            let from = starts[g] + skip;
            prop_assert!(got == want[from..from + take], "group {}, rows {}..+{}", g, skip, take);
        }
    }
}

#[test]
fn a_chunk_that_falls_back_to_plain_pages_reads_the_same_hashed_then_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fallback.parquet");
    let n = 6000;
    // Words seen before, then new ones: the dictionary outgrows its limit mid-chunk.
    let picks: Vec<(u16, bool)> = (0..n as u16).map(|i| (i, i % 7 == 0)).collect();
    let (r, o) = words(&picks, u16::MAX);
    for v2 in [false, true] {
        let layout = Layout {
            group_rows: n,
            page_rows: 500,
            dict_limit: 4000,
            v2,
            codec: 0,
            offset_index: true,
        };
        write(&path, &r, &o, &layout);
        let file = open(&path, &["label", "r", "o", "x"]);
        for column in [2, 3] {
            let chunk = file.meta.row_group(0).column(column);
            let encodings: Vec<Encoding> = chunk.encodings().collect();
            assert!(encodings.contains(&Encoding::PLAIN), "{encodings:?}");
        }
        let want = all_cells(&file, Pages::Crate);
        let got = all_cells(&file, Pages::Own);
        assert_eq!(got, want, "v2 {v2}");
        // Early rows come from the dictionary, hashed; the last ones from plain pages.
        assert!(matches!(got[1][2], Owned::Hashed(..)), "{:?}", got[1][2]);
        assert!(
            matches!(got[n - 2][2], Owned::Text(..)),
            "{:?}",
            got[n - 2][2]
        );
        // A range that starts in the plain pages, and one across the fallback.
        assert_eq!(cells_of(&file, 0, 5000, 1000, Pages::Own), want[5000..]);
        assert_eq!(cells_of(&file, 0, 300, 5000, Pages::Own), want[300..5300]);
    }
}

#[test]
fn arrows_dictionary_typed_columns_read_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("arrow.parquet");
    let n = 10_000;
    let words: Vec<Option<String>> = (0..n)
        .map(|i| (i % 11 != 0).then(|| format!("c{}", i * 7 % 300)))
        .collect();
    let cats: DictionaryArray<ArrowInt32> = words.iter().map(Option::as_deref).collect();
    let labels: Int8Array = (0..n).map(|i| Some((i % 2) as i8)).collect();
    let batch = RecordBatch::try_from_iter([
        ("label", Arc::new(labels) as ArrayRef),
        ("cat", Arc::new(cats) as ArrayRef),
    ])
    .unwrap();
    for version in [WriterVersion::PARQUET_1_0, WriterVersion::PARQUET_2_0] {
        let props = WriterProperties::builder()
            .set_writer_version(version)
            .set_data_page_row_count_limit(777)
            .set_write_batch_size(777)
            .build();
        let mut w = ArrowWriter::try_new(File::create(&path).unwrap(), batch.schema(), Some(props))
            .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let file = open(&path, &["label", "cat"]);
        let got = all_cells(&file, Pages::Own);
        assert_eq!(got, all_cells(&file, Pages::Crate), "{version:?}");
        assert_eq!(got.len(), n);
        for (i, (row, word)) in got.iter().zip(&words).enumerate() {
            let want = match word {
                Some(w) => {
                    Owned::Hashed(w.as_bytes().to_vec(), crate::ids::value_hash(w.as_bytes()))
                }
                None => Owned::Text(Vec::new()),
            };
            assert_eq!(row[1], want, "row {i}");
        }
    }
}
