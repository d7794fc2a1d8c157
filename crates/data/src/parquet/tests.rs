//! Parquet input == text input: the same batches, positions that resume, projection, bad rows
//! and bad files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Float64Array, Int8Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema as ArrowSchema};
use proptest::prelude::*;

use super::*;
use crate::features::{DenseInput, DenseTransform, InputPlan, Pooling, Slot, SlotKind};
use crate::input::RangeRead;
use crate::{
    read_all, read_batches, read_batches_at, rich_schema, write_rich, write_synthetic, Batch,
    DataError, LineParser, ReaderConfig, RichConfig, Schema, SynthConfig,
};

fn config(
    schema: Schema,
    plan: Option<InputPlan>,
    batch_size: usize,
    threads: usize,
) -> ReaderConfig {
    ReaderConfig {
        plan: plan.map(Arc::new),
        batch_size,
        threads,
        queue_batches: 2 * threads + 2,
        ..ReaderConfig::new(schema)
    }
}

fn criteo_tsv(dir: &Path, rows: u64) -> PathBuf {
    let mut text = Vec::new();
    write_synthetic(
        &SynthConfig {
            rows,
            seed: 3,
            ..SynthConfig::default()
        },
        &mut text,
    )
    .unwrap();
    let p = dir.join("criteo.tsv");
    std::fs::write(&p, text).unwrap();
    p
}

fn rich_tsv(dir: &Path, rows: u64) -> PathBuf {
    let mut text = Vec::new();
    write_rich(
        &RichConfig {
            rows,
            seed: 7,
            ..RichConfig::default()
        },
        &mut text,
        None,
    )
    .unwrap();
    let p = dir.join("rich.tsv");
    std::fs::write(&p, text).unwrap();
    p
}

/// The explicit plan of `examples/rich.toml`: ids, a weighted bag, a sequence, buckets, dense.
fn rich_plan() -> InputPlan {
    let slot = |name: &str, column, tag, kind| Slot {
        name: name.into(),
        column,
        tag,
        kind,
    };
    InputPlan {
        slots: vec![
            slot("user_id", 1, 0, SlotKind::Id),
            slot("gender", 2, 1, SlotKind::Id),
            slot("item_id", 3, 2, SlotKind::Id),
            slot("item_cat", 4, 3, SlotKind::Id),
            slot(
                "tags",
                5,
                4,
                SlotKind::Bag {
                    pooling: Pooling::Mean,
                    weighted: true,
                    weight_separator: b':',
                },
            ),
            slot("hist_items", 6, 2, SlotKind::Sequence { max_len: 20 }),
            slot(
                "price_bucket",
                7,
                5,
                SlotKind::Buckets {
                    boundaries: vec![5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 70.0],
                },
            ),
        ],
        dense: vec![DenseInput {
            name: "price".into(),
            column: 7,
            transform: DenseTransform::Log1p,
        }],
    }
}

fn to_parquet(
    text: &Path,
    schema: &Schema,
    plan: Option<&InputPlan>,
    group_rows: usize,
) -> PathBuf {
    let out = text.with_extension("parquet");
    let opts = WriteOptions {
        codec: Codec::Zstd,
        row_group_rows: group_rows,
    };
    let done = convert(&[text.to_path_buf()], schema, plan, &out, opts).unwrap();
    assert!(done.rows > 0);
    out
}

fn all(paths: &[PathBuf], cfg: &ReaderConfig) -> (Vec<Batch>, crate::ReadStatsSnapshot) {
    read_all(paths, cfg).unwrap()
}

#[test]
fn criteo_batches_equal_the_text_batches_for_any_threads() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = criteo_tsv(dir.path(), 3000);
    let pq = to_parquet(&tsv, &Schema::criteo(), None, 700);
    let (want, text_stats) = all(&[tsv], &config(Schema::criteo(), None, 256, 2));
    for threads in [1, 3] {
        let (got, stats) = all(
            std::slice::from_ref(&pq),
            &config(Schema::criteo(), None, 256, threads),
        );
        assert_eq!(got, want, "{threads} threads");
        assert_eq!(stats.rows, text_stats.rows);
        assert_eq!(stats.bad_lines, 0);
    }
}

/// A row range of several pieces (each handed to the assembler as its own block): the text's
/// batches, with any threads, and the same rest when resumed inside any piece.
#[test]
fn a_range_longer_than_a_piece_reads_as_the_text_and_resumes_inside_it() {
    let dir = tempfile::tempdir().unwrap();
    let rows = 2 * super::decode::PIECE_ROWS as u64 + 3000;
    let tsv = criteo_tsv(dir.path(), rows);
    let pq = to_parquet(&tsv, &Schema::criteo(), None, rows as usize);
    let (want, _) = all(&[tsv], &config(Schema::criteo(), None, 1000, 2));
    for threads in [1, 3] {
        let cfg = config(Schema::criteo(), None, 1000, threads);
        let (got, stats) = all(std::slice::from_ref(&pq), &cfg);
        assert_eq!(stats.rows, rows, "{threads} threads");
        assert!(got == want, "{threads} threads");
    }
    let cfg = config(Schema::criteo(), None, 1000, 2);
    let paths = [pq];
    let full: Vec<_> = read_batches(&paths, &cfg)
        .unwrap()
        .positioned()
        .map(Result::unwrap)
        .collect();
    assert_eq!(full.len(), want.len());
    for i in [0, 15, 16, 17, 33, full.len() - 2] {
        let rest: Vec<Batch> = read_batches_at(&paths, &cfg, full[i].position)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert!(rest == want[i + 1..], "resumed after batch {i}");
    }
}

#[test]
fn rich_batches_equal_the_text_batches() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = rich_tsv(dir.path(), 2500);
    let (schema, plan) = (rich_schema(), rich_plan());
    plan.validate(&schema).unwrap();
    let pq = to_parquet(&tsv, &schema, Some(&plan), 600);
    let cfg = config(schema, Some(plan), 200, 3);
    let (want, _) = all(&[tsv], &cfg);
    let (got, _) = all(&[pq], &cfg);
    assert!(want[0].is_weighted());
    assert_eq!(got, want);
}

#[test]
fn resuming_at_every_batch_position_gives_the_same_rest() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = rich_tsv(dir.path(), 1200);
    let (schema, plan) = (rich_schema(), rich_plan());
    let pq = to_parquet(&tsv, &schema, Some(&plan), 250);
    let mut cfg = config(schema, Some(plan), 96, 2);
    cfg.epochs = 2;
    let paths = [pq.clone(), pq];
    let mut stream = read_batches(&paths, &cfg).unwrap();
    let full: Vec<_> = stream.positioned().map(Result::unwrap).collect();
    assert!(full.len() > 20);
    for (i, b) in full.iter().enumerate() {
        let rest: Vec<Batch> = read_batches_at(&paths, &cfg, b.position)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let want: Vec<Batch> = full[i + 1..].iter().map(|b| b.batch.clone()).collect();
        assert_eq!(rest, want, "resumed after batch {i} at {:?}", b.position);
    }
    // A row offset past the file's rows is a bad start.
    let mut past = full[0].position;
    past.byte_offset = 1_000_000;
    let err = read_batches_at(&paths, &cfg, past)
        .unwrap()
        .find_map(Result::err)
        .expect("an error");
    assert!(matches!(err, DataError::BadStart { .. }), "{err}");
}

/// A ranged source that counts the bytes read from it.
struct Counting {
    inner: std::fs::File,
    read: AtomicU64,
}

impl RangeRead for Counting {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let n = RangeRead::read_at(&self.inner, buf, offset)?;
        self.read.fetch_add(n as u64, Relaxed);
        Ok(n)
    }
}

/// Bytes read through a counting source to decode every row of `path` with `plan`.
fn bytes_to_decode(path: &Path, schema: &Schema, plan: &InputPlan) -> (u64, u64) {
    let source = Arc::new(Counting {
        inner: std::fs::File::open(path).unwrap(),
        read: AtomicU64::new(0),
    });
    let len = std::fs::metadata(path).unwrap().len();
    let parser = LineParser::with_plan(schema, plan);
    let file = Arc::new(
        ParquetFile::open(
            path,
            Arc::clone(&source) as Arc<dyn RangeRead>,
            len,
            &parser,
        )
        .unwrap(),
    );
    let stats = crate::ReadStats::default();
    let mut out = parser.builder(0);
    let mut ends = Vec::new();
    for (group, skip, take, first_row) in file.ranges(0, None).unwrap() {
        let range = RowRange {
            file: Arc::clone(&file),
            group,
            skip,
            take,
            first_row,
        };
        let d = range.decode(&parser, &stats, &mut out, &mut ends, |_, _, _, _| true);
        assert!(d.fault.is_none());
    }
    assert_eq!(out.rows() as u64, file.num_rows());
    (source.read.load(Relaxed), len)
}

#[test]
fn projection_reads_fewer_bytes_than_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = criteo_tsv(dir.path(), 4000);
    let schema = Schema::criteo();
    let pq = to_parquet(&tsv, &schema, None, 1000);
    let full = InputPlan::legacy(&schema);
    let mut half = full.clone();
    half.slots.truncate(13);
    half.dense.truncate(6);
    let (all_bytes, len) = bytes_to_decode(&pq, &schema, &full);
    let (half_bytes, _) = bytes_to_decode(&pq, &schema, &half);
    assert!(all_bytes <= len + len / 10, "{all_bytes} of {len}");
    assert!(
        half_bytes < all_bytes * 7 / 10,
        "half plan {half_bytes}, full {all_bytes}"
    );
    assert!(half_bytes < len * 7 / 10, "half plan {half_bytes} of {len}");
}

/// Writes a Parquet file of (label Int8, x Float64, c Utf8) rows.
fn write_small(path: &Path, labels: Vec<i8>, xs: Vec<Option<f64>>, cs: Vec<Option<&str>>) {
    let schema = Arc::new(ArrowSchema::new(vec![
        Field::new("label", DataType::Int8, false),
        Field::new("x", DataType::Float64, true),
        Field::new("c", DataType::Utf8, true),
    ]));
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int8Array::from(labels)),
        Arc::new(Float64Array::from(xs)),
        Arc::new(StringArray::from(cs)),
    ];
    let batch = RecordBatch::try_new(Arc::clone(&schema), cols).unwrap();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None)
            .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn small_schema() -> Schema {
    use crate::{Column, ColumnKind};
    Schema {
        columns: vec![
            Column::new("label", ColumnKind::Label),
            Column::new("x", ColumnKind::Dense),
            Column::new("c", ColumnKind::Sparse),
        ],
        separator: '\t',
        header: false,
    }
}

#[test]
fn bad_rows_are_counted_with_file_and_row() {
    let dir = tempfile::tempdir().unwrap();
    let pq = dir.path().join("bad.parquet");
    write_small(
        &pq,
        vec![1, 2, 0, 0, 1],
        vec![Some(1.0), Some(2.0), Some(f64::NAN), Some(1e300), None],
        vec![Some("a"), None, Some("b"), Some("c"), Some("d")],
    );
    let mut cfg = config(small_schema(), None, 10, 2);
    cfg.max_bad_line_ratio = 1.0;
    let (got, stats) = all(std::slice::from_ref(&pq), &cfg);
    // Row 2 (label 2) and row 4 (1e300) are bad; a NaN float is missing (pandas writes a
    // missing float as NaN), as a null is.
    assert_eq!((stats.rows, stats.lines, stats.bad_lines), (3, 5, 2));
    let text = dir.path().join("same.tsv");
    std::fs::write(&text, "1\t1\ta\n2\t2\t\n0\t\tb\n0\t1e300\tc\n1\t\td\n").unwrap();
    let (want, _) = all(&[text], &cfg);
    assert_eq!(got, want);
    let first = stats.first_bad_lines.join("\n");
    assert!(first.contains("bad.parquet:2: label"), "{first}");
    assert!(first.contains("bad.parquet:4: dense"), "{first}");
}

#[test]
fn a_truncated_or_missing_column_file_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = criteo_tsv(dir.path(), 500);
    let pq = to_parquet(&tsv, &Schema::criteo(), None, 100);
    let bytes = std::fs::read(&pq).unwrap();
    let cut = dir.path().join("cut.parquet");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let cfg = config(Schema::criteo(), None, 64, 2);
    let err = read_all(&[cut], &cfg).unwrap_err();
    assert!(matches!(err, DataError::Parquet { .. }), "{err}");
    assert!(err.to_string().contains("cut.parquet"), "{err}");

    // Pages overwritten with garbage: the footer reads, a row group does not decode.
    let mut bad = bytes.clone();
    let mid = bad.len() / 3;
    bad[mid..mid + 2000].fill(0xA5);
    let garbled = dir.path().join("garbled.parquet");
    std::fs::write(&garbled, &bad).unwrap();
    let err = read_all(&[garbled], &cfg).unwrap_err();
    assert!(err.to_string().contains("garbled.parquet"), "{err}");

    // A column the plan reads is missing.
    let small = dir.path().join("small.parquet");
    write_small(&small, vec![1], vec![None], vec![None]);
    let err = read_all(&[small], &cfg).unwrap_err();
    assert!(err.to_string().contains("no column \"I1\""), "{err}");
}

#[test]
fn a_text_file_named_parquet_is_said_not_to_be_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = criteo_tsv(dir.path(), 50);
    let named = dir.path().join("day1.parquet");
    std::fs::copy(&tsv, &named).unwrap();
    let cfg = config(Schema::criteo(), None, 64, 2);
    let err = read_all(&[named], &cfg).unwrap_err().to_string();
    assert!(err.contains("day1.parquet"), "{err}");
    assert!(
        err.contains("not a Parquet file: it lacks the PAR1 magic and looks like text"),
        "{err}"
    );
    assert!(!err.contains("footer"), "{err}");
    // Binary bytes that are not Parquet: said so too, without the text guess.
    let junk = dir.path().join("junk.parquet");
    std::fs::write(&junk, [0u8, 1, 2, 3, 0xff, 0xfe, 7, 8, 9, 10, 11, 12, 13]).unwrap();
    let err = read_all(&[junk], &cfg).unwrap_err().to_string();
    assert!(
        err.contains("junk.parquet: Parquet: not a Parquet file: it lacks the PAR1 magic (its"),
        "{err}"
    );
}

#[test]
fn a_follower_skips_and_counts_a_bad_parquet_file() {
    use crate::{follow, FollowConfig};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("in");
    std::fs::create_dir(&data).unwrap();
    let tsv = criteo_tsv(dir.path(), 300);
    let pq = to_parquet(&tsv, &Schema::criteo(), None, 100);
    let bytes = std::fs::read(&pq).unwrap();
    // a: truncated (no footer); b: pages garbled (the footer reads); c: good.
    std::fs::write(data.join("a.parquet"), &bytes[..bytes.len() - 10]).unwrap();
    let mut garbled = bytes.clone();
    let mid = garbled.len() / 3;
    garbled[mid..mid + 2000].fill(0xA5);
    std::fs::write(data.join("b.parquet"), &garbled).unwrap();
    std::fs::write(data.join("c.parquet"), &bytes).unwrap();
    let stop = dir.path().join("STOP");
    std::fs::File::create(&stop).unwrap().flush().unwrap();
    let mut fc = FollowConfig::new(&data);
    fc.poll = std::time::Duration::from_millis(10);
    fc.stop_file = Some(stop);
    let cfg = config(Schema::criteo(), None, 64, 2);
    let mut f = follow(fc, &cfg).unwrap();
    let batches: Vec<_> = f.by_ref().map(Result::unwrap).collect();
    let rows_of = |name: &str| -> usize {
        batches
            .iter()
            .filter(|b| b.position.file == name)
            .map(|b| b.batch.rows)
            .sum()
    };
    assert_eq!(rows_of("a.parquet"), 0);
    assert!(rows_of("b.parquet") < 300);
    assert_eq!(rows_of("c.parquet"), 300);
    assert_eq!(f.stats().bad_files(), 2);
    let last = &batches.last().unwrap().position;
    assert_eq!((last.file.as_str(), last.offset), ("c.parquet", 300));
}

/// click, w (weight), user, conversion: the text of `rows`, and its schema.
fn two_label_text(rows: &[(u8, &str, &str, &str)]) -> (String, Schema) {
    use crate::{Column, ColumnKind};
    let schema = Schema {
        columns: vec![
            Column::new("click", ColumnKind::Label),
            Column::new("w", ColumnKind::Weight),
            Column::new("user", ColumnKind::Sparse),
            Column::new("conversion", ColumnKind::Label),
        ],
        separator: '\t',
        header: false,
    };
    let text: String = rows
        .iter()
        .map(|(c, w, u, v)| format!("{c}\t{w}\t{u}\t{v}\n"))
        .collect();
    (text, schema)
}

#[test]
fn convert_keeps_both_labels_and_the_sample_weight() {
    let dir = tempfile::tempdir().unwrap();
    let rows = [
        (1, "0.5", "a", "1"),
        (0, "", "b", "0"),
        (1, "2e-1", "", "0"),
        (1, "-1", "c", "1"), // bad weight: dropped by the text reader and by convert
        (0, "3", "d", "2"),  // bad second label: dropped too
        (0, "0", "e", "0.0"),
        (1, "0.1", "f", "1"),
    ];
    let (text, schema) = two_label_text(&rows);
    let tsv = dir.path().join("two.tsv");
    std::fs::write(&tsv, text).unwrap();
    let out = dir.path().join("two.parquet");
    let opts = WriteOptions {
        codec: Codec::Snappy,
        row_group_rows: 3,
    };
    let done = convert(std::slice::from_ref(&tsv), &schema, None, &out, opts).unwrap();
    assert_eq!((done.rows, done.bad_lines), (5, 2));
    // the file's types: both labels Int8, the weight Float32 (empty = null)
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        std::fs::File::open(&out).unwrap(),
    )
    .unwrap();
    let arrow = reader.schema().clone();
    let types: Vec<(&str, &DataType)> = arrow
        .fields()
        .iter()
        .map(|f| (f.name().as_str(), f.data_type()))
        .collect();
    assert_eq!(
        types,
        [
            ("click", &DataType::Int8),
            ("w", &DataType::Float32),
            ("user", &DataType::Utf8),
            ("conversion", &DataType::Int8),
        ]
    );
    let batches: Vec<RecordBatch> = reader.build().unwrap().map(Result::unwrap).collect();
    let weights: Vec<Option<f32>> = batches
        .iter()
        .flat_map(|b| {
            use arrow_array::cast::AsArray;
            let a = b
                .column(1)
                .as_primitive::<arrow_array::types::Float32Type>();
            (0..a.len())
                .map(|i| a.is_valid(i).then(|| a.value(i)))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(weights, [Some(0.5), None, Some(0.2), Some(0.0), Some(0.1)]);
    let mut cfg = config(schema, None, 2, 2);
    cfg.max_bad_line_ratio = 1.0;
    let (want, _) = all(&[tsv], &cfg);
    let (got, stats) = all(&[out], &cfg);
    assert_eq!(stats.bad_lines, 0);
    assert_eq!(got, want);
    let b = Batch::concat(&got);
    assert_eq!(b.num_labels, 2);
    assert_eq!(
        b.labels,
        vec![1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    );
    assert_eq!(b.sample_weights, vec![0.5, 1.0, 0.2, 0.0, 0.1]);
}

/// A weight column of another type (Float64, strings) reads like a dense value's text; a
/// bad weight or second label in a Parquet file makes its row bad, named.
#[test]
fn parquet_weights_of_any_numeric_type_and_bad_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (_, schema) = two_label_text(&[]);
    let path = dir.path().join("w.parquet");
    let arrow = Arc::new(ArrowSchema::new(vec![
        Field::new("click", DataType::Int8, false),
        Field::new("w", DataType::Float64, true),
        Field::new("user", DataType::Utf8, true),
        Field::new("conversion", DataType::Utf8, true),
    ]));
    let cols: Vec<ArrayRef> = vec![
        Arc::new(Int8Array::from(vec![1, 0, 1, 1])),
        Arc::new(Float64Array::from(vec![
            Some(0.25),
            None,
            Some(-2.0),
            Some(1.5),
        ])),
        Arc::new(StringArray::from(vec![
            Some("a"),
            Some("b"),
            Some("c"),
            Some("d"),
        ])),
        Arc::new(StringArray::from(vec![
            Some("1"),
            Some("0"),
            Some("1"),
            None,
        ])),
    ];
    let batch = RecordBatch::try_new(Arc::clone(&arrow), cols).unwrap();
    let mut w =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), arrow, None)
            .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let mut cfg = config(schema, None, 10, 1);
    cfg.max_bad_line_ratio = 1.0;
    let (got, stats) = all(std::slice::from_ref(&path), &cfg);
    assert_eq!((stats.rows, stats.bad_lines), (2, 2));
    let first = stats.first_bad_lines.join("\n");
    assert!(
        first.contains("w.parquet:3: sample weight \"w\""),
        "{first}"
    );
    assert!(
        first.contains("w.parquet:4: label \"conversion\""),
        "{first}"
    );
    let b = Batch::concat(&got);
    assert_eq!(b.labels, vec![1.0, 1.0, 0.0, 0.0]);
    assert_eq!(b.sample_weights, vec![0.25, 1.0]);
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9]{1,6}",
        (-1000i64..1000).prop_map(|v| v.to_string()),
    ]
}

fn dense() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        (-100_000i64..100_000).prop_map(|v| v.to_string()),
        (-1e6f64..1e6).prop_map(|v| v.to_string()),
        (-1e3f64..1e3).prop_map(|v| format!("{v:e}")),
    ]
}

fn row() -> impl Strategy<Value = String> {
    (
        prop_oneof!["0", "1", "1.0"],
        dense(),
        value(),
        value(),
        proptest::collection::vec("[a-z]{0,3}(:[0-9]\\.[0-9])?", 0..4),
        proptest::collection::vec("[a-z]{0,3}", 0..5),
        dense(),
        value(),
        (
            prop_oneof!["0", "1", "0.0"],
            proptest::collection::vec("[a-z]{0,3}", 0..3),
        ),
    )
        .prop_map(|(l, d, u, g, tags, hist, price, cat, (conv, cats))| {
            format!(
                "{l}\t{u}\t{g}\tx{d}\t{cat}\t{}\t{}\t{price}\t{conv}\t{}",
                tags.join("|"),
                hist.join("|"),
                cats.join("|")
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn converted_rows_read_back_as_the_text_parses(rows in proptest::collection::vec(row(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let tsv = dir.path().join("p.tsv");
        std::fs::write(&tsv, rows.join("\n") + "\n").unwrap();
        let (schema, plan) = (rich_schema(), rich_plan());
        let out = dir.path().join("p.parquet");
        let opts = WriteOptions { codec: Codec::Snappy, row_group_rows: 7 };
        convert(std::slice::from_ref(&tsv), &schema, Some(&plan), &out, opts).unwrap();
        let mut cfg = config(schema, Some(plan), 16, 2);
        cfg.max_bad_line_ratio = 1.0;
        let (want, _) = all(&[tsv], &cfg);
        let (got, _) = all(&[out], &cfg);
        prop_assert_eq!(got, want);
    }
}

/// Every written kind (and an ignored column), as `sparta convert` writes it: Parquet types
/// Arrow, pyarrow and pandas read as `Int8`, `Float32`, `Float64`, `Utf8` and `List<Utf8>`,
/// the values as they were, in row groups of the size asked for.
#[test]
fn convert_writes_the_types_and_row_groups_arrow_reads() {
    use crate::{Column, ColumnKind};
    use arrow_array::builder::{ListBuilder, StringBuilder};
    use parquet::basic::{LogicalType, Repetition, Type as Physical};
    let schema = Schema {
        columns: vec![
            Column::new("click", ColumnKind::Label),
            Column::new("w", ColumnKind::Weight),
            Column::new("x", ColumnKind::Dense),
            Column::new("skip", ColumnKind::Ignore),
            Column::new("user", ColumnKind::Sparse),
            Column::new("tags", ColumnKind::MultiSparse { separator: '|' }),
        ],
        separator: '\t',
        header: false,
    };
    let rows = [
        "1\t0.5\t2.5\tzz\tu1\ta|b",
        "0\t\t\tzz\t\t",
        "1\t2\t-1e10\tzz\tu3\ta||b",
        "0\t0\t0.1\tzz\tü\t|",
        "1\t\t7\tzz\tu5\tsolo",
    ];
    let dir = tempfile::tempdir().unwrap();
    let tsv = dir.path().join("kinds.tsv");
    std::fs::write(&tsv, rows.join("\n") + "\n").unwrap();
    let out = dir.path().join("kinds.parquet");
    let opts = WriteOptions {
        codec: Codec::Zstd,
        row_group_rows: 2,
    };
    let done = convert(std::slice::from_ref(&tsv), &schema, None, &out, opts).unwrap();
    assert_eq!((done.rows, done.bad_lines), (5, 0));

    // The Parquet schema.
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        std::fs::File::open(&out).unwrap(),
    )
    .unwrap();
    let meta = reader.metadata().clone();
    let groups: Vec<i64> = meta.row_groups().iter().map(|g| g.num_rows()).collect();
    assert_eq!(groups, [2, 2, 1]);
    let roots = meta
        .file_metadata()
        .schema_descr()
        .root_schema()
        .get_fields()
        .to_vec();
    let shape: Vec<_> = roots
        .iter()
        .map(|f| {
            let info = f.get_basic_info();
            let physical = f.is_primitive().then(|| f.get_physical_type());
            (
                f.name().to_string(),
                physical,
                info.logical_type_ref().cloned(),
                info.repetition(),
            )
        })
        .collect();
    let int8 = LogicalType::Integer {
        bit_width: 8,
        is_signed: true,
    };
    assert_eq!(
        shape,
        [
            (
                "click".into(),
                Some(Physical::INT32),
                Some(int8),
                Repetition::REQUIRED
            ),
            (
                "w".into(),
                Some(Physical::FLOAT),
                None,
                Repetition::OPTIONAL
            ),
            (
                "x".into(),
                Some(Physical::DOUBLE),
                None,
                Repetition::OPTIONAL
            ),
            (
                "user".into(),
                Some(Physical::BYTE_ARRAY),
                Some(LogicalType::String),
                Repetition::OPTIONAL
            ),
            (
                "tags".into(),
                None,
                Some(LogicalType::List),
                Repetition::OPTIONAL
            ),
        ]
    );
    let list = &roots[4].get_fields()[0];
    assert_eq!(
        (list.name(), list.get_basic_info().repetition()),
        ("list", Repetition::REPEATED)
    );
    let item = &list.get_fields()[0];
    assert_eq!(
        (
            item.name(),
            item.get_physical_type(),
            item.get_basic_info().logical_type_ref(),
            item.get_basic_info().repetition()
        ),
        (
            "item",
            Physical::BYTE_ARRAY,
            Some(&LogicalType::String),
            Repetition::OPTIONAL
        )
    );

    // The Arrow types and values.
    let fields: Vec<(String, DataType, bool)> = reader
        .schema()
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().clone(), f.is_nullable()))
        .collect();
    let utf8_list = DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)));
    assert_eq!(
        fields,
        [
            ("click".into(), DataType::Int8, false),
            ("w".into(), DataType::Float32, true),
            ("x".into(), DataType::Float64, true),
            ("user".into(), DataType::Utf8, true),
            ("tags".into(), utf8_list, true),
        ]
    );
    let batches: Vec<RecordBatch> = reader.build().unwrap().map(Result::unwrap).collect();
    let mut tags = ListBuilder::new(StringBuilder::new());
    for row in [
        Some(&["a", "b"][..]),
        None,
        Some(&["a", "", "b"]),
        Some(&["", ""]),
        Some(&["solo"]),
    ] {
        match row {
            Some(items) => {
                for i in items {
                    tags.values().append_value(i);
                }
                tags.append(true);
            }
            None => tags.append(false),
        }
    }
    let want: Vec<ArrayRef> = vec![
        Arc::new(Int8Array::from(vec![1, 0, 1, 0, 1])),
        Arc::new(arrow_array::Float32Array::from(vec![
            Some(0.5),
            None,
            Some(2.0),
            Some(0.0),
            None,
        ])),
        Arc::new(Float64Array::from(vec![
            Some(2.5),
            None,
            Some(-1e10),
            Some(0.1),
            Some(7.0),
        ])),
        Arc::new(StringArray::from(vec![
            Some("u1"),
            None,
            Some("u3"),
            Some("ü"),
            Some("u5"),
        ])),
        Arc::new(tags.finish()),
    ];
    let mut at = 0;
    for batch in &batches {
        for (k, want) in want.iter().enumerate() {
            let want = want.slice(at, batch.num_rows());
            assert_eq!(batch.column(k).as_ref(), want.as_ref(), "column {k}");
        }
        at += batch.num_rows();
    }
    assert_eq!(at, 5);
}

/// A file that starts with a UTF-8 byte order mark converts as the text reader reads it: the
/// mark is not part of the first value.
#[test]
fn convert_drops_a_byte_order_mark_as_the_text_reader_does() {
    let dir = tempfile::tempdir().unwrap();
    let tsv = dir.path().join("bom.tsv");
    std::fs::write(&tsv, "\u{feff}1\t0.5\ta\t1\n0\t\tb\t0\n").unwrap();
    let (_, schema) = two_label_text(&[]);
    let out = dir.path().join("bom.parquet");
    convert(
        std::slice::from_ref(&tsv),
        &schema,
        None,
        &out,
        WriteOptions::default(),
    )
    .unwrap();
    let cfg = config(schema, None, 4, 1);
    let (want, _) = all(&[tsv], &cfg);
    let (got, _) = all(&[out], &cfg);
    assert_eq!(Batch::concat(&want).labels, vec![1.0, 1.0, 0.0, 0.0]);
    assert_eq!(got, want);
}

/// A column the plan reads of a type that is not read (a date): refused, naming the file, the
/// column, its Parquet type and the types that are read.
#[test]
fn a_column_of_a_type_not_read_is_named_with_its_parquet_type() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dates.parquet");
    let batch = RecordBatch::try_from_iter([
        ("label", Arc::new(Int8Array::from(vec![1])) as ArrayRef),
        ("x", Arc::new(Float64Array::from(vec![1.0]))),
        ("c", Arc::new(arrow_array::Date32Array::from(vec![19000]))),
    ])
    .unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        batch.schema(),
        None,
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let err = read_all(&[path], &config(small_schema(), None, 4, 1))
        .unwrap_err()
        .to_string();
    assert!(err.contains("dates.parquet"), "{err}");
    assert!(
        err.contains("column \"c\" is INT32 (DATE); expected BOOLEAN, INT32 or INT64"),
        "{err}"
    );
}
